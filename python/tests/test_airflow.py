"""Airflow (from PyPI, SQLite metadata database, no scheduler): a DAG with
FixpointOperator run for three logical dates with `airflow dags test`, then
again; the table checked against the source rows of those dates, the XCom
reports against the runs. Run by scripts/python-tests.sh with AIRFLOW_HOME
set and the metadata database migrated."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from conftest import REPLACE_JOB, Duck, job_file, unavailable

DAG = """
import json, os
import pendulum
try:
    from airflow.sdk import DAG, task
except ImportError:
    from airflow import DAG
    from airflow.decorators import task
from fixpoint.airflow import FixpointOperator

with DAG("fixpoint_orders", schedule="@daily", start_date=pendulum.datetime(2026, 10, 1, tz="UTC"), catchup=False):
    load = FixpointOperator(task_id="load", job={job!r}, db={db!r}, lineage_file={events!r})

    @task
    def record(ti=None):
        report = ti.xcom_pull(task_ids="load")
        with open({out!r}, "a") as f:
            f.write(json.dumps(report) + "\\n")

    load >> record()
"""


def test_operator_three_dates_twice(duck: Duck, tmp_path: Path) -> None:
    home = os.environ.get("AIRFLOW_HOME")
    dags = os.environ.get("AIRFLOW__CORE__DAGS_FOLDER")
    if not home or not dags:
        unavailable("an Airflow home", "run through scripts/python-tests.sh, which sets AIRFLOW_HOME and migrates its database")
    try:
        import airflow  # noqa: F401
    except ImportError as e:
        unavailable("apache-airflow", str(e))
    job = job_file(duck.folder, "orders", REPLACE_JOB)
    out = tmp_path / "reports.jsonl"
    events = tmp_path / "lineage.jsonl"
    Path(dags, "fixpoint_orders.py").write_text(textwrap.dedent(DAG).format(job=str(job), db=duck.url, out=str(out), events=str(events)))
    airflow_cli = str(Path(sys.executable).parent / "airflow")
    days = ["2026-10-19", "2026-10-20", "2026-10-21"]
    for _ in range(2):
        for day in days:
            r = subprocess.run([airflow_cli, "dags", "test", "fixpoint_orders", day], capture_output=True, text=True, timeout=600)
            assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    reports = [json.loads(x) for x in out.read_text().splitlines()]
    assert [r["run_date"] for r in reports] == days * 2, "the operator's default date is the data interval's start"
    assert [r["outcome"] for r in reports] == ["committed"] * 3 + ["skipped"] * 3
    assert [r["run_key"] for r in reports[:3]] == [r["run_key"] for r in reports[3:]]
    marks = ", ".join(f"DATE '{d}'" for d in days)
    q = "SELECT order_id, CAST(order_total AS VARCHAR), note, CAST(dt AS VARCHAR) FROM {} ORDER BY order_id"
    assert duck.sql(q.format("silver.orders")) == duck.sql(q.format(f"bronze.orders WHERE dt IN ({marks})"))
    assert duck.sql("SELECT count(*) FROM fixpoint.runs") == [(3,)]
    # The task instance is the parent of each run's lineage events.
    lineage = [json.loads(x) for x in events.read_text().splitlines()]
    assert [e["eventType"] for e in lineage] == ["START", "COMPLETE"] * 6
    parents = [e["run"]["facets"]["parent"] for e in lineage]
    assert {p["job"]["name"] for p in parents} == {"fixpoint_orders.load"}
    assert {p["root"]["job"]["name"] for p in parents} == {"fixpoint_orders"}
    first_pass = [p["run"]["runId"] for p in parents[:6:2]]
    assert len(set(first_pass)) == 3, "each date's task instance is its own parent run"


def test_skip_when_done_and_on_kill(duck: Duck) -> None:
    try:
        from fixpoint.airflow import AirflowSkipException, FixpointOperator
    except ImportError as e:
        unavailable("apache-airflow", str(e))
    import threading
    import time
    from types import SimpleNamespace

    import fixpoint

    job = job_file(duck.folder, "orders", REPLACE_JOB)
    ti = SimpleNamespace(dag_id="d", task_id="t", run_id="manual__1", try_number=1, map_index=-1)
    done = FixpointOperator(task_id="t", job=str(job), db=duck.url, date="2026-10-20")
    assert done.execute({"ti": ti})["outcome"] == "committed"
    assert done.execute({"ti": ti})["outcome"] == "skipped", "a skipped run succeeds by default"
    skipper = FixpointOperator(task_id="t2", job=str(job), db=duck.url, date="2026-10-20", skip_when_done=True)
    with pytest.raises(AirflowSkipException):
        skipper.execute({"ti": ti})

    # on_kill interrupts the run, which rolls back: the day stays as it was.
    before = duck.sql("SELECT count(*), sum(order_id) FROM silver.orders")
    slow = FixpointOperator(
        task_id="t3",
        job=str(job),
        db=duck.url,
        date="2026-10-20",
        force=True,
        env={"FIXPOINT_TEST_MODE": "1", "FIXPOINT_FAIL_AT": "after_delete", "FIXPOINT_FAIL_MODE": "pause:20000"},
    )
    failure: list = []
    t = threading.Thread(target=lambda: failure.append(pytest.raises(fixpoint.Interrupted, slow.execute, {"ti": ti})))
    started = time.monotonic()
    t.start()
    while slow._proc is None and time.monotonic() - started < 30:
        time.sleep(0.05)
    time.sleep(1.0)
    slow.on_kill()
    t.join(timeout=60)
    assert failure and time.monotonic() - started < 15, "on_kill ended the run well before its pause"
    assert duck.sql("SELECT count(*), sum(order_id) FROM silver.orders") == before
    assert duck.sql("SELECT count(*) FROM fixpoint.runs") == [(1,)]
