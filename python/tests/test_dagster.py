"""Dagster (from PyPI): partitions materialized, materialized again, then a
ranged run over an overlapping range; the table checked against the source
rows of those dates, the metadata against the runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import REPLACE_JOB, Duck, job_file, unavailable

try:
    import dagster
except ImportError as e:  # pragma: no cover
    dagster = None
    missing = str(e)


def expected(duck: Duck, days: list) -> list:
    marks = ", ".join(f"DATE '{d}'" for d in days)
    return duck.sql(f"SELECT order_id, CAST(order_total AS VARCHAR), note, CAST(dt AS VARCHAR) FROM bronze.orders WHERE dt IN ({marks}) ORDER BY order_id")


def table(duck: Duck) -> list:
    return duck.sql("SELECT order_id, CAST(order_total AS VARCHAR), note, CAST(dt AS VARCHAR) FROM silver.orders ORDER BY order_id")


def test_partitions_rematerialized_and_backfilled(duck: Duck) -> None:
    if dagster is None:
        unavailable("dagster", missing)
    from dagster import DagsterInstance, DailyPartitionsDefinition, materialize
    from dagster._core.storage.tags import ASSET_PARTITION_RANGE_END_TAG, ASSET_PARTITION_RANGE_START_TAG

    from fixpoint.dagster import fixpoint_asset, fixpoint_assets

    job = job_file(duck.folder, "orders", REPLACE_JOB)
    events = duck.folder / "lineage.jsonl"
    asset = fixpoint_asset(job, DailyPartitionsDefinition(start_date="2026-10-01"), db=duck.url, lineage_file=str(events))
    assert "replaces the run date's partition" in asset.descriptions_by_key[asset.key]
    instance = DagsterInstance.ephemeral()

    def materialized(**kwargs: object) -> dict:
        res = materialize([asset], instance=instance, **kwargs)
        assert res.success
        return {m.partition: {k: v.value for k, v in m.metadata.items()} for m in res.asset_materializations_for_node("silver_orders")}

    days = ["2026-10-19", "2026-10-20", "2026-10-21"]
    first = {}
    for day in days:
        first.update(materialized(partition_key=day))
    assert sorted(first) == days
    assert all(m["outcome"] == "committed" and m["skipped"] is False and m["rows_inserted"] == 3 for m in first.values())
    assert table(duck) == expected(duck, days)
    ledger = duck.sql("SELECT CAST(run_date AS VARCHAR), run_key, output_checksum FROM fixpoint.runs ORDER BY run_date")
    assert ledger == [(d, first[d]["run_key"], first[d]["output_checksum"]) for d in days]

    again = {}
    for day in days:
        again.update(materialized(partition_key=day))
    assert all(m["outcome"] == "skipped" and m["skipped"] is True for m in again.values())
    assert all(again[d]["run_key"] == first[d]["run_key"] for d in days)
    assert table(duck) == expected(duck, days)

    ranged = materialized(tags={ASSET_PARTITION_RANGE_START_TAG: "2026-10-20", ASSET_PARTITION_RANGE_END_TAG: "2026-10-22"})
    assert sorted(ranged) == ["2026-10-20", "2026-10-21", "2026-10-22"]
    assert ranged["2026-10-20"]["outcome"] == "skipped" and ranged["2026-10-21"]["outcome"] == "skipped"
    assert ranged["2026-10-22"]["outcome"] == "committed" and ranged["2026-10-22"]["rows_inserted"] == 0
    assert table(duck) == expected(duck, days + ["2026-10-22"])
    assert duck.sql("SELECT count(*) FROM fixpoint.runs") == [(4,)]

    # Each Dagster run is the parent of its runs' lineage events.
    lineage = [json.loads(x) for x in events.read_text().splitlines()]
    assert len(lineage) == 2 * (3 + 3 + 3)
    parents = {(e["run"]["facets"]["parent"]["job"]["name"], e["run"]["facets"]["parent"]["run"]["runId"]) for e in lineage}
    assert {name for name, _ in parents} == {"silver_orders"} and len(parents) == 7, "six single runs and one ranged run"

    both = fixpoint_assets(Path(job).parent, DailyPartitionsDefinition(start_date="2026-10-01"), db=duck.url)
    assert [a.key.path[-1] for a in both] == ["silver_orders"]
