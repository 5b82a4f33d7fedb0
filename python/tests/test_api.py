"""The Python API against real runs on DuckDB and PostgreSQL: rows read
back with the databases' own Python drivers, fingerprints recomputed in
SQL (conftest.py), the ledger read with plain SQL, and each exception class
from a real failure."""

from __future__ import annotations

import datetime as dt
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import fixpoint
from conftest import MERGE_JOB, REPLACE_JOB, Duck, Pg, job_file

D20 = dt.date(2026, 10, 20)


def ledger(db: Any, job: str) -> list:
    return db.sql(
        "SELECT run_key, CAST(run_date AS VARCHAR), output_rows, output_checksum, input_rows, input_checksum, rows_inserted "
        f"FROM fixpoint.runs WHERE job = '{job}' ORDER BY finished_at"
    )


def roundtrip(db: Any, folder: Path, day_filter: str) -> None:
    """Commit, skip, force, change one input row: reports, rows, ledger and
    fingerprints checked against what the database itself says."""
    job = job_file(folder, "orders", REPLACE_JOB)
    r = fixpoint.run(job, "2026-10-20", db=db.url)
    assert isinstance(r, fixpoint.RunReport)
    assert (r.outcome, r.committed, r.skipped) == ("committed", True, False)
    assert (r.job, r.target, r.strategy, r.run_date) == ("silver_orders", "silver.orders", "replace_partition", D20)
    assert (r.rows_inserted, r.rows_deleted, r.rows_updated) == (3, 0, 0)
    assert r.created_target is True and r.skip_reason is None and r.run_key
    assert [tuple(x) for x in db.sql("SELECT order_id, note FROM silver.orders ORDER BY order_id")] == [
        (201, "order 201"),
        (202, "order 202"),
        (203, "order 203"),
    ]
    assert r.output is not None and r.input is not None
    assert (r.output.rows, r.output.checksum) == db.fingerprint("silver.orders", day_filter, kind=r.output.kind)
    assert ledger(db, "silver_orders") == [(r.run_key, "2026-10-20", 3, r.output.checksum, 3, r.input.checksum, 3)]

    again = fixpoint.run(job, D20, db=db.url)
    assert again.skipped and not again.committed and again.skip_reason
    assert (again.run_key, again.output) == (r.run_key, r.output)
    assert len(ledger(db, "silver_orders")) == 1, "a skipped run records nothing"

    forced = fixpoint.run(job, dt.datetime(2026, 10, 20, 23, 59), db=db.url, force=True)
    assert forced.committed and forced.output == r.output and forced.run_key == r.run_key
    assert (forced.rows_deleted, forced.rows_inserted) == (3, 3)

    db.sql("UPDATE bronze.orders SET note = 'changed' WHERE order_id = 202")
    changed = fixpoint.run(job, D20, db=db.url)
    assert changed.committed and changed.run_key != r.run_key
    assert changed.output is not None and changed.output.rows == 3 and changed.output.checksum != r.output.checksum
    assert (changed.output.rows, changed.output.checksum) == db.fingerprint("silver.orders", day_filter, kind=changed.output.kind)
    assert db.sql("SELECT note FROM silver.orders WHERE order_id = 202") == [("changed",)]
    # The other days were never touched.
    assert db.sql("SELECT count(*) FROM silver.orders") == [(3,)]

    fp = fixpoint.fingerprint("silver.orders", db=db.url, where="dt = DATE '2026-10-20'")
    assert fp == changed.output

    entries = fixpoint.runs(db.url, job="silver_orders")
    assert [e.run_key for e in entries][0] == changed.run_key
    assert entries[0].output == changed.output and entries[0].run_date == D20
    assert isinstance(entries[0].finished_at, dt.datetime)


def test_duckdb_run_skip_force_and_change(duck: Duck) -> None:
    roundtrip(duck, duck.folder, "dt = DATE '2026-10-20'")


def test_postgres_run_skip_force_and_change(pg: Pg, tmp_path: Path) -> None:
    roundtrip(pg, tmp_path, "dt = DATE '2026-10-20'")


def test_backfill_status_prove_and_diff(duck: Duck) -> None:
    job = job_file(duck.folder, "orders", REPLACE_JOB)
    bf = fixpoint.backfill(job, "2026-10-19", dt.date(2026, 10, 21), db=duck.url)
    assert isinstance(bf, fixpoint.BackfillReport)
    assert (bf.committed, bf.skipped, bf.failed, bf.exit_code, bf.rows_written) == (3, 0, 0, 0, 9)
    assert [(d.run_date.isoformat(), d.outcome) for d in bf.dates] == [("2026-10-19", "committed"), ("2026-10-20", "committed"), ("2026-10-21", "committed")]
    for d in bf.dates:
        assert d.report is not None and d.report.output is not None
        day = d.run_date.isoformat()
        assert (d.report.output.rows, d.report.output.checksum) == duck.fingerprint("silver.orders", f"dt = DATE '{day}'", kind=d.report.output.kind)
    again = fixpoint.backfill(job, "2026-10-18", "2026-10-21", db=duck.url)
    assert (again.committed, again.skipped) == (1, 3)
    assert duck.sql("SELECT count(*) FROM silver.orders") == [(9,)]

    st = fixpoint.status(job, db=duck.url)
    assert st.ok and st.need_attention == 0 and [d.state for d in st.dates] == ["ok"] * 4
    duck.sql("DELETE FROM silver.orders WHERE order_id = 101")
    drift = fixpoint.status(job, db=duck.url, start="2026-10-19", end="2026-10-21")
    assert not drift.ok and [d.state for d in drift.dates] == ["drift", "ok", "ok"] and drift.exit_code == 4

    proof = fixpoint.prove(job, D20, db=duck.url, runs=3)
    assert isinstance(proof, fixpoint.ProofReport) and proof.proved and len(proof.runs) == 3
    assert len({r.output for r in proof.runs}) == 1

    duck.sql("CREATE TABLE silver.copy AS SELECT * FROM silver.orders")
    same = fixpoint.diff("silver.orders", "silver.copy", "order_id", db=duck.url)
    assert same.identical and same.only_in_a == same.only_in_b == same.changed == 0
    duck.sql("UPDATE silver.copy SET note = 'x' WHERE order_id = 201")
    other = fixpoint.diff("silver.orders", "silver.copy", ["order_id"], db=duck.url)
    assert not other.identical and other.changed == 1
    assert other.changed_rows[0]["key"] == {"order_id": 201}


def test_merge_reports_updates(duck: Duck) -> None:
    job = job_file(duck.folder, "merge", MERGE_JOB)
    first = fixpoint.run(job, "2026-10-19", db=duck.url)
    second = fixpoint.run(job, "2026-10-20", db=duck.url)
    assert (first.rows_inserted, second.rows_inserted, second.rows_updated) == (2, 1, 1)
    late = fixpoint.run(job, "2026-10-19", db=duck.url, force=True)
    assert late.rows_updated == 0, "an older batch replayed changes nothing"
    assert duck.sql("SELECT order_id, CAST(order_total AS VARCHAR) FROM silver.orders_latest ORDER BY 1") == [(1, "11.00"), (2, "20.00"), (3, "30.00")]


def test_lint_findings_are_a_result(duck: Duck) -> None:
    clean = job_file(duck.folder, "clean", REPLACE_JOB)
    clock = job_file(duck.folder, "clock", REPLACE_JOB.replace("note, dt FROM", "note, now() AS loaded, dt FROM"))
    report = fixpoint.lint(clean, clock)
    assert isinstance(report, fixpoint.LintReport) and not report.ok and report.errors >= 1
    assert report.files[0].findings == [] and any(f.rule == "clock" for f in report.files[1].findings or [])
    assert fixpoint.lint(clean).ok


# Each exception class from a real failure.


def test_bad_input(duck: Duck, tmp_path: Path) -> None:
    job = job_file(duck.folder, "orders", REPLACE_JOB)
    with pytest.raises(fixpoint.BadInput) as missing:
        fixpoint.run(tmp_path / "nope.toml", D20, db=duck.url)
    assert "nope.toml" in missing.value.message and missing.value.exit_code == 2 and missing.value.error["class"] == "input"
    with pytest.raises(fixpoint.BadInput) as bad_date:
        fixpoint.run(job, "2026-13-45", db=duck.url)
    assert "2026-13-45" in str(bad_date.value) and bad_date.value.hint
    with pytest.raises(fixpoint.BadInput):
        fixpoint.run(job, 20261020, db=duck.url)  # type: ignore[arg-type]
    with pytest.raises(ValueError):  # BadInput is a ValueError too
        fixpoint.backfill(job, "2026-10-21", "2026-10-19", db=duck.url)
    with pytest.raises(fixpoint.BadInput):
        fixpoint.run(job, D20, db="mysql://nowhere/db")
    assert duck.sql("SELECT count(*) FROM information_schema.tables WHERE table_schema = 'silver'") == [(0,)]


def test_unreachable_database_is_an_engine_error(duck: Duck) -> None:
    job = job_file(duck.folder, "orders", REPLACE_JOB)
    with pytest.raises(fixpoint.EngineError) as e:
        fixpoint.run(job, D20, db="postgres://root@127.0.0.1:9/test")
    assert e.value.exit_code == 1 and "127.0.0.1" in e.value.message


def test_refused_rows_outside_the_day(duck: Duck) -> None:
    job = job_file(duck.folder, "wide", REPLACE_JOB.replace("WHERE dt = :run_date", "WHERE dt >= :run_date"))
    with pytest.raises(fixpoint.Refused) as e:
        fixpoint.run(job, D20, db=duck.url)
    assert e.value.exit_code == 3 and e.value.error["offending"] == 3 and e.value.error["column"] == "dt"
    assert duck.sql("SELECT count(*) FROM information_schema.tables WHERE table_schema = 'silver'") == [(0,)]


def test_audit_failed(duck: Duck) -> None:
    job = job_file(
        duck.folder,
        "audited",
        REPLACE_JOB
        + """
    [[audit]]
    name = "totals_small"
    kind = "expression"
    expression = "order_total < 100"
""",
    )
    with pytest.raises(fixpoint.AuditFailed) as e:
        fixpoint.run(job, D20, db=duck.url)
    assert e.value.exit_code == 6 and e.value.error["audit"] == "totals_small"


def test_not_idempotent(duck: Duck) -> None:
    job = job_file(duck.folder, "random", REPLACE_JOB.replace("note, dt FROM", "note || random() AS note, dt FROM"))
    with pytest.raises(fixpoint.NotIdempotent) as e:
        fixpoint.prove(job, D20, db=duck.url, mutate=False)
    assert e.value.exit_code == 4
    assert isinstance(e.value.report, fixpoint.ProofReport) and not e.value.report.proved and e.value.report.failures


def test_busy_and_interrupted(pg: Pg, tmp_path: Path) -> None:
    job = job_file(tmp_path, "orders", REPLACE_JOB)
    slow_env = {"FIXPOINT_TEST_MODE": "1", "FIXPOINT_FAIL_AT": "after_guards", "FIXPOINT_FAIL_MODE": "pause:4000"}
    holder = subprocess.Popen(
        [fixpoint.find_binary(), "run", str(job), "--date", "2026-10-20"],
        env={**os.environ, **slow_env, "FIXPOINT_DB": pg.url},
        stderr=subprocess.PIPE,
    )
    try:
        # Wait until the first run holds the day's lock (it pauses after its guards).
        assert holder.stderr is not None
        for line in iter(holder.stderr.readline, b""):
            if b"pausing" in line:
                break
        with pytest.raises(fixpoint.Busy) as e:
            fixpoint.run(job, D20, db=pg.url, no_wait=True)
        assert e.value.exit_code == 5
    finally:
        holder.wait(timeout=60)
    assert holder.returncode == 0
    started = time.monotonic()
    with pytest.raises(fixpoint.Interrupted) as i:
        fixpoint.run(job, D20, db=pg.url, force=True, env=slow_env, timeout=1.0)
    assert time.monotonic() - started < 30
    assert i.value.exit_code == 130
    # The interrupted run was rolled back: the day is as the first run left it.
    assert pg.sql("SELECT count(*) FROM fixpoint.runs") == [(1,)]
    assert pg.sql("SELECT count(*) FROM silver.orders") == [(3,)]


def test_binary_not_found(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("FIXPOINT_BIN", str(tmp_path / "missing"))
    with pytest.raises(fixpoint.BinaryNotFound):
        fixpoint.run("job.toml", D20)


def test_password_stays_out_of_the_command_line(duck: Duck) -> None:
    job = job_file(duck.folder, "orders", REPLACE_JOB)
    seen = []
    with pytest.raises(fixpoint.EngineError) as e:
        fixpoint.run(job, D20, db="postgres://root:s3cret@127.0.0.1:9/test", on_start=lambda p: seen.append(p.args))
    assert seen and not any("s3cret" in a for a in seen[0])
    assert "s3cret" not in str(e.value) and "s3cret" not in e.value.stderr
