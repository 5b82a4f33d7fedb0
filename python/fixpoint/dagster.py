"""Dagster: one asset per fixpoint job, materialized per date partition.

::

    from dagster import DailyPartitionsDefinition, Definitions
    from fixpoint.dagster import fixpoint_asset, fixpoint_assets

    orders = fixpoint_asset("jobs/orders.toml", DailyPartitionsDefinition(start_date="2026-10-01"), db="duckdb:dw.duckdb")
    defs = Definitions(assets=[orders, *fixpoint_assets("jobs/", db="duckdb:dw.duckdb")])

Materializing a partition runs ``fixpoint run --date <partition key>``; a
run of a range of partitions (a backfill with a single-run policy) runs
``fixpoint backfill`` over it. The run report becomes the materialization's
metadata: run key, outcome (``committed`` or ``skipped``), rows, input and
output fingerprints. A partition already loaded from the same input is
skipped by fixpoint, and its materialization says so.
"""

# No `from __future__ import annotations` here: Dagster reads the asset
# function's `context` annotation as a type.
import glob
import os
from typing import Any, Dict, List, Mapping, Optional, Sequence

from dagster import (
    AssetExecutionContext,
    AssetsDefinition,
    BackfillPolicy,
    DailyPartitionsDefinition,
    MaterializeResult,
    MetadataValue,
    PartitionsDefinition,
    asset,
)

from . import backfill as _backfill
from . import run as _run
from ._job import read_job
from ._lineage import parent_env
from .errors import BadInput
from .reports import RunReport


def _metadata(report: RunReport) -> Dict[str, Any]:
    md: Dict[str, Any] = {
        "outcome": MetadataValue.text(report.outcome),
        "skipped": MetadataValue.bool(report.skipped),
        "run_key": MetadataValue.text(report.run_key or ""),
        "run_date": MetadataValue.text(report.run_date.isoformat()),
        "method": MetadataValue.text(report.method),
        "rows_inserted": MetadataValue.int(report.rows_inserted),
        "rows_updated": MetadataValue.int(report.rows_updated),
        "rows_deleted": MetadataValue.int(report.rows_deleted),
    }
    if report.skip_reason:
        md["skip_reason"] = MetadataValue.text(report.skip_reason)
    for side, fp in (("input", report.input), ("output", report.output)):
        if fp is not None:
            md[f"{side}_rows"] = MetadataValue.int(fp.rows)
            md[f"{side}_checksum"] = MetadataValue.text(fp.checksum)
            md["fingerprint_kind"] = MetadataValue.text(fp.kind)
    if report.output is not None:
        md["dagster/row_count"] = MetadataValue.int(report.output.rows)
    return md


def fixpoint_asset(
    job_file: "os.PathLike[str] | str",
    partitions_def: Optional[PartitionsDefinition] = None,
    *,
    db: Optional[str] = None,
    name: Optional[str] = None,
    key_prefix: Optional[Sequence[str]] = None,
    group_name: Optional[str] = None,
    force: bool = False,
    lineage_file: Optional[str] = None,
    env: Optional[Mapping[str, str]] = None,
    timeout: Optional[float] = None,
) -> AssetsDefinition:
    """The asset of one job. ``partitions_def`` defaults to daily partitions
    from the job's ``start``; a job without ``start`` needs one. The asset is
    named after the job (``name`` in its file) unless ``name`` is given; its
    description states the strategy's guarantees."""
    info = read_job(job_file)
    if partitions_def is None:
        if info.start is None:
            raise BadInput(
                f"job {info.name} has no `start`, so fixpoint_asset cannot make its daily partitions",
                hint="pass partitions_def=DailyPartitionsDefinition(start_date=…), or set start in the job file",
                error_class="input",
            )
        partitions_def = DailyPartitionsDefinition(start_date=info.start.isoformat())
    job_path = info.path
    namespace = os.environ.get("OPENLINEAGE_NAMESPACE", "dagster")

    @asset(
        name=name or info.name,
        key_prefix=list(key_prefix) if key_prefix else None,
        group_name=group_name,
        partitions_def=partitions_def,
        backfill_policy=BackfillPolicy.single_run(),
        description=f"fixpoint job `{info.name}` ({info.strategy}) writing `{info.target}`. {info.guarantees()}",
        kinds={"fixpoint"},
        metadata={"fixpoint/job_file": MetadataValue.path(job_path), "fixpoint/target": MetadataValue.text(info.target)},
    )
    def _fixpoint_job(context: AssetExecutionContext) -> MaterializeResult:
        keys: List[str] = list(context.partition_keys)
        attempt = int(getattr(context, "retry_number", 0)) + 1
        asset_name = context.asset_key.to_user_string()
        child_env = dict(env or {})
        child_env.update(parent_env(namespace, asset_name, context.run.run_id))
        if len(keys) == 1:
            report = _run(job_path, keys[0], db=db, force=force, attempt=attempt, lineage_file=lineage_file, env=child_env, timeout=timeout)
            context.log.info(f"fixpoint {report.job} {report.run_date}: {report.outcome} ({report.skip_reason or report.method})")
            return MaterializeResult(metadata=_metadata(report))
        result = _backfill(job_path, keys[0], keys[-1], db=db, force=force, attempt=attempt, lineage_file=lineage_file, env=child_env, timeout=timeout)
        by_date = {d.run_date.isoformat(): d for d in result.dates}
        for pk in keys:
            d = by_date.get(pk)
            if d is not None and d.report is not None:
                context.add_asset_metadata(_metadata(d.report), partition_key=pk)
        context.log.info(f"fixpoint backfill {result.job} {keys[0]}..{keys[-1]}: {result.committed} committed, {result.skipped} skipped")
        return MaterializeResult(
            metadata={
                "committed": MetadataValue.int(result.committed),
                "skipped_dates": MetadataValue.int(result.skipped),
                "rows_written": MetadataValue.int(result.rows_written),
            }
        )

    return _fixpoint_job


def fixpoint_assets(
    folder: "os.PathLike[str] | str",
    partitions_def: Optional[PartitionsDefinition] = None,
    **kwargs: Any,
) -> List[AssetsDefinition]:
    """One asset per job file (``*.toml``) in ``folder``, in name order."""
    files = sorted(glob.glob(os.path.join(os.fspath(folder), "*.toml")))
    if not files:
        raise BadInput(f"no job files (*.toml) in {os.fspath(folder)}", hint="point fixpoint_assets at the folder of your job files", error_class="input")
    return [fixpoint_asset(f, partitions_def, **kwargs) for f in files]
