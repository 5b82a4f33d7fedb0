"""OpenLineage events of real runs, received by an HTTP server on
127.0.0.1 and validated against the OpenLineage JSON schemas (the spec's
copy in ../shared/openlineage, or $OPENLINEAGE_SPEC_DIR)."""

from __future__ import annotations

import datetime as dt
import json
import os
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Dict, Iterator, List

import pytest

import fixpoint
from conftest import CI, REPLACE_JOB, Duck, job_file, unavailable

D20 = dt.date(2026, 10, 20)
REPO = Path(__file__).resolve().parents[2]


def spec_dir() -> Path:
    for c in [os.environ.get("OPENLINEAGE_SPEC_DIR"), REPO.parent / "shared" / "openlineage", "/work/shared/openlineage"]:
        if c and (Path(c) / "OpenLineage.json").is_file():
            return Path(c)
    unavailable("the OpenLineage spec", "set OPENLINEAGE_SPEC_DIR to a folder holding OpenLineage.json and facets/")
    raise AssertionError


def validator() -> Any:
    import jsonschema
    from referencing import Registry, Resource

    root = spec_dir()
    schemas = [json.loads((root / "OpenLineage.json").read_text())]
    schemas += [json.loads(p.read_text()) for p in sorted((root / "facets").glob("*.json"))]
    registry = Registry().with_resources((s["$id"], Resource.from_contents(s)) for s in schemas)
    core = schemas[0]
    by_name = {s["$id"].rsplit("/", 1)[1].removesuffix(".json"): s for s in schemas[1:]}

    def check(event: Dict[str, Any]) -> None:
        jsonschema.Draft202012Validator(core, registry=registry, format_checker=jsonschema.FormatChecker()).validate(event)
        facets: List[Dict[str, Any]] = list(event["run"].get("facets", {}).values()) + list(event["job"].get("facets", {}).values())
        for ds in event.get("inputs", []) + event.get("outputs", []):
            facets += list(ds.get("facets", {}).values()) + list(ds.get("outputFacets", {}).values())
        for f in facets:
            url = f["_schemaURL"]
            name = url.split("#")[0].rsplit("/", 1)[1].removesuffix(".json")
            if name in by_name:
                facet_schema = {"$ref": f"{by_name[name]['$id']}#/$defs/{name}"}
                jsonschema.Draft202012Validator(facet_schema, registry=registry).validate(f)
            else:
                assert "fixpoint" in url, f"a facet with an unknown schema: {url}"

    return check


class Receiver:
    def __init__(self, delay: float = 0.0) -> None:
        self.events: List[Dict[str, Any]] = []
        self.auth: List[str] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                if delay:
                    time.sleep(delay)
                assert self.path == "/api/v1/lineage", self.path
                outer.events.append(json.loads(body))
                outer.auth.append(self.headers.get("Authorization", ""))
                self.send_response(201)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()


@pytest.fixture
def receiver(monkeypatch: pytest.MonkeyPatch) -> Iterator[Receiver]:
    r = Receiver()
    monkeypatch.setenv("OPENLINEAGE_URL", r.url)
    monkeypatch.setenv("OPENLINEAGE_API_KEY", "tok-123")
    monkeypatch.setenv("OPENLINEAGE_NAMESPACE", "etl")
    yield r
    r.close()


def pairs(events: List[Dict[str, Any]]) -> List[tuple]:
    return [(e["eventType"], e["run"]["runId"]) for e in events]


def test_committed_skipped_refused_failed(duck: Duck, receiver: Receiver) -> None:
    check = validator()
    job = job_file(duck.folder, "orders", REPLACE_JOB)
    committed = fixpoint.run(job, D20, db=duck.url)
    skipped = fixpoint.run(job, D20, db=duck.url)
    retry = fixpoint.run(job, D20, db=duck.url, attempt=2)
    assert committed.committed and skipped.skipped and retry.skipped
    wide = job_file(duck.folder, "wide", REPLACE_JOB.replace("WHERE dt = :run_date", "WHERE dt >= :run_date"))
    with pytest.raises(fixpoint.Refused):
        fixpoint.run(wide, D20, db=duck.url)
    with pytest.raises(fixpoint.EngineError):
        fixpoint.run(job, D20, db=duck.url, force=True, env={"FIXPOINT_TEST_MODE": "1", "FIXPOINT_FAIL_AT": "before_commit"})

    ev = receiver.events
    for e in ev:
        check(e)
    assert [e["eventType"] for e in ev] == ["START", "COMPLETE"] * 3 + ["START", "FAIL"] * 2
    assert set(receiver.auth) == {"Bearer tok-123"}
    ids = [e["run"]["runId"] for e in ev]
    # START and its end share the id; a replay of the same attempt has the
    # same id; the next attempt another.
    assert ids[0] == ids[1] == ids[2] == ids[3]
    assert ids[4] == ids[5] and ids[4] != ids[0]
    start, complete = ev[0], ev[1]
    assert start["job"] == {"namespace": "etl", "name": "silver_orders", "facets": start["job"]["facets"]}
    assert start["job"]["facets"]["sql"]["query"].startswith("SELECT order_id")
    assert start["run"]["facets"]["nominalTime"]["nominalStartTime"] == "2026-10-20T00:00:00Z"
    assert start["inputs"] == [{"namespace": f"duckdb://{duck.path}", "name": "dw.bronze.orders"}]
    out = complete["outputs"][0]
    assert (out["namespace"], out["name"]) == (f"duckdb://{duck.path}", "dw.silver.orders")
    assert [f["name"] for f in out["facets"]["schema"]["fields"]] == ["order_id", "order_total", "note", "dt"]
    assert out["outputFacets"]["outputStatistics"]["rowCount"] == 3
    fx = complete["run"]["facets"]["fixpoint"]
    assert fx["runKey"] == committed.run_key and fx["outcome"] == "committed" and fx["skipped"] is False
    assert fx["output"] == {"rows": 3, "checksum": committed.output.checksum, "kind": committed.output.kind}
    skip = ev[3]["run"]["facets"]["fixpoint"]
    assert skip["skipped"] is True and skip["outcome"] == "skipped" and skip["skipReason"]
    assert ev[5]["run"]["facets"]["fixpoint"]["attempt"] == 2
    refused = ev[7]
    assert refused["run"]["facets"]["fixpoint"]["error"]["class"] == "data"
    assert "dt other than the run date" in refused["run"]["facets"]["errorMessage"]["message"]
    failed = ev[9]
    assert failed["run"]["facets"]["fixpoint"]["error"]["exitCode"] == 1
    assert failed["run"]["facets"]["fixpoint"]["runKey"] == committed.run_key, "the run key was known before the failure"


def test_parent_and_lineage_file(duck: Duck, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    check = validator()
    monkeypatch.delenv("OPENLINEAGE_URL", raising=False)
    parent = "airflow/etl_dag.load_orders/01890f5e-8f7c-7c3a-9b1e-2f3a4b5c6d7e"
    root = "airflow/etl_dag/01890f5e-0000-7000-8000-000000000001"
    job = job_file(duck.folder, "orders", REPLACE_JOB)
    events = tmp_path / "lineage.jsonl"
    fixpoint.backfill(
        job, "2026-10-19", "2026-10-20", db=duck.url, lineage_file=events, env={"OPENLINEAGE_PARENT_ID": parent, "OPENLINEAGE_ROOT_PARENT_ID": root}
    )
    lines = [json.loads(x) for x in events.read_text().splitlines()]
    assert [e["eventType"] for e in lines] == ["START", "COMPLETE", "START", "COMPLETE"]
    for e in lines:
        check(e)
        p = e["run"]["facets"]["parent"]
        assert p["run"]["runId"] == "01890f5e-8f7c-7c3a-9b1e-2f3a4b5c6d7e" and p["job"] == {"namespace": "airflow", "name": "etl_dag.load_orders"}
        assert p["root"]["job"]["name"] == "etl_dag"
    assert lines[0]["run"]["runId"] != lines[2]["run"]["runId"]
    with pytest.raises(fixpoint.BadInput) as e:
        fixpoint.run(job, D20, db=duck.url, lineage_file=events, env={"OPENLINEAGE_PARENT_ID": "not-a-parent"})
    assert "OPENLINEAGE_PARENT_ID" in e.value.message


def test_a_down_or_slow_endpoint_never_fails_the_run(duck: Duck, monkeypatch: pytest.MonkeyPatch) -> None:
    job = job_file(duck.folder, "orders", REPLACE_JOB)
    monkeypatch.setenv("OPENLINEAGE_URL", "http://127.0.0.1:9")
    down = fixpoint.run(job, D20, db=duck.url)
    assert down.committed
    slow = Receiver(delay=30)
    try:
        monkeypatch.setenv("OPENLINEAGE_URL", slow.url)
        monkeypatch.setenv("FIXPOINT_LINEAGE_TIMEOUT_MS", "1000")
        started = time.monotonic()
        again = fixpoint.run(job, D20, db=duck.url, force=True)
        took = time.monotonic() - started
    finally:
        slow.server.server_close()
    assert again.committed
    assert took < 10, f"a slow endpoint delayed the run by {took:.1f} s"
