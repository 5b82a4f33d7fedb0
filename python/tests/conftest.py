"""Fixtures of the Python tests: a DuckDB warehouse made with the Python
``duckdb`` package, a fresh PostgreSQL database per test (psycopg), job
files, and fingerprints computed here, independently of fixpoint's code.

The PostgreSQL tests read ``FIXPOINT_TEST_PG`` (default
``postgres://root@127.0.0.1:5432/test``); without a server they say
``skipped``, except under ``CI=true``, where they fail.
"""

from __future__ import annotations

import os
import textwrap
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, List, Sequence, Tuple

import blake3
import duckdb
import pytest

CI = os.environ.get("CI") == "true"
PG_ADMIN = os.environ.get("FIXPOINT_TEST_PG", "postgres://root@127.0.0.1:5432/test")

DAYS = ["2026-10-19", "2026-10-20", "2026-10-21"]


def unavailable(what: str, why: str) -> None:
    """A service the test needs is missing: a failure under CI, else a visible skip."""
    if CI:
        pytest.fail(f"{what} is required under CI=true: {why}")
    pytest.skip(f"skipped: {what} not available: {why}")


def mix(kind: str, signature: Sequence[str], rows: int, total: int) -> str:
    """fixpoint's checksum from a row count and a sum of row hashes, as
    docs/ledger-and-fingerprints.md describes it: BLAKE3 over the
    length-prefixed parts, the first 32 hex digits."""
    h = blake3.blake3()
    for part in ("fixpoint-fp-v1", kind, ",".join(signature), str(rows), str(total)):
        b = part.encode()
        h.update(len(b).to_bytes(8, "little"))
        h.update(b)
    return h.hexdigest()[:32]


def job_file(folder: Path, name: str, body: str) -> Path:
    p = folder / f"{name}.toml"
    p.write_text(textwrap.dedent(body).lstrip())
    return p


REPLACE_JOB = """
    name = "silver_orders"
    target = "silver.orders"
    strategy = "replace_partition"
    partition = "dt"

    [source]
    sql = "SELECT order_id, order_total, note, dt FROM bronze.orders WHERE dt = :run_date"
"""

MERGE_JOB = """
    name = "orders_merge"
    target = "silver.orders_latest"
    strategy = "merge"
    key = ["order_id"]
    version = "updated_at"

    [source]
    sql = "SELECT order_id, order_total, updated_at FROM bronze.changes WHERE batch = :run_date"
"""


@dataclass
class Duck:
    """A DuckDB warehouse file, read and written with the Python duckdb package."""

    path: Path
    folder: Path

    @property
    def url(self) -> str:
        return f"duckdb:{self.path}"

    def sql(self, query: str, params: Sequence[Any] = ()) -> List[Tuple[Any, ...]]:
        con = duckdb.connect(str(self.path))
        try:
            cur = con.execute(query, list(params))
            return cur.fetchall() if cur.description else []
        finally:
            con.close()

    def fingerprint(self, table: str, where: str = "TRUE", params: Sequence[Any] = (), kind: str = "") -> Tuple[int, str]:
        """(rows, checksum) of the rows of ``table`` where ``where`` holds:
        DuckDB's ``hash()`` of each row, summed, mixed as fixpoint mixes it."""
        cols = self.sql(f"SELECT column_name, column_type FROM (DESCRIBE {table})")
        names = ", ".join(f't."{c}"' for c, _ in cols)
        rows, total = self.sql(f"SELECT count(*), coalesce(sum(hash({names})), 0) FROM {table} AS t WHERE {where}", params)[0]
        return int(rows), mix(kind, [f"{c} {t}" for c, t in cols], int(rows), int(total))


@pytest.fixture
def duck(tmp_path: Path) -> Duck:
    d = Duck(path=tmp_path / "dw.duckdb", folder=tmp_path)
    d.sql("CREATE SCHEMA bronze")
    d.sql("CREATE TABLE bronze.orders (order_id INTEGER, order_total DECIMAL(12,2), note VARCHAR, dt DATE)")
    rows = []
    for i, day in enumerate(DAYS):
        for j in range(1, 4):
            oid = 100 * (i + 1) + j
            rows.append((oid, f"{oid}.50", f"order {oid}", day))
    d.sql("INSERT INTO bronze.orders SELECT * FROM (VALUES " + ", ".join("(?, CAST(? AS DECIMAL(12,2)), ?, CAST(? AS DATE))" for _ in rows) + ")", [v for r in rows for v in r])
    d.sql("CREATE TABLE bronze.changes (order_id INTEGER, order_total DECIMAL(12,2), updated_at TIMESTAMP, batch DATE)")
    d.sql(
        """INSERT INTO bronze.changes VALUES
        (1, 10.00, TIMESTAMP '2026-10-19 08:00', DATE '2026-10-19'),
        (2, 20.00, TIMESTAMP '2026-10-19 08:00', DATE '2026-10-19'),
        (1, 11.00, TIMESTAMP '2026-10-20 08:00', DATE '2026-10-20'),
        (3, 30.00, TIMESTAMP '2026-10-20 09:00', DATE '2026-10-20'),
        (2, 21.00, TIMESTAMP '2026-10-21 08:00', DATE '2026-10-21')"""
    )
    return d


@dataclass
class Pg:
    """A fresh PostgreSQL database, read and written with psycopg."""

    url: str

    def sql(self, query: str, params: Sequence[Any] = ()) -> List[Tuple[Any, ...]]:
        import psycopg

        with psycopg.connect(self.url, autocommit=True) as con:
            cur = con.execute(query, list(params))  # type: ignore[arg-type]
            return cur.fetchall() if cur.description else []

    def fingerprint(self, table: str, where: str = "TRUE", params: Sequence[Any] = (), kind: str = "") -> Tuple[int, str]:
        """(rows, checksum): each row's values hashed by type (``hash_record_extended``, mixed once more
        with ``hashint8extended``), summed, mixed as fixpoint mixes it. Text in the C collation;
        a type without a hash of its own by its text."""
        schema, name = table.split(".")
        cols = self.sql(
            "SELECT a.attname::text, format_type(a.atttypid, a.atttypmod) FROM pg_attribute a JOIN pg_class c ON a.attrelid = c.oid "
            "JOIN pg_namespace n ON c.relnamespace = n.oid WHERE n.nspname = %s AND c.relname = %s AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum",
            [schema, name],
        )
        own = ("smallint", "integer", "bigint", "real", "double precision", "boolean", "date", "uuid", "bytea", "jsonb", "numeric", "timestamp", "interval")
        text = ("text", "character varying", "character")

        def field(c: str, t: str) -> str:
            if t.endswith("]"):
                return f'CAST(t."{c}" AS TEXT) COLLATE "C"'
            if any(t == x or t.startswith(x + "(") for x in text):
                return f't."{c}" COLLATE "C"'
            if any(t == x or t.startswith(x) for x in own):
                return f't."{c}"'
            return f'CAST(t."{c}" AS TEXT) COLLATE "C"'

        fields = ", ".join(field(c, t) for c, t in cols)
        rows, total = self.sql(
            f"SELECT count(*), coalesce(sum(hashint8extended(hash_record_extended(ROW({fields}), 0), 0)), 0) FROM {table} AS t WHERE {where}", params
        )[0]
        return int(rows), mix(kind, [f"{c} {t}" for c, t in cols], int(rows), int(total))


@pytest.fixture
def pg() -> Iterator[Pg]:
    try:
        import psycopg
    except ImportError as e:
        unavailable("psycopg", str(e))
    try:
        admin = psycopg.connect(PG_ADMIN, autocommit=True, connect_timeout=5)
    except Exception as e:
        unavailable(f"PostgreSQL at {PG_ADMIN}", str(e))
    name = f"fixpoint_py_{uuid.uuid4().hex[:12]}"
    admin.execute(f'CREATE DATABASE "{name}"')
    base = PG_ADMIN.rsplit("/", 1)[0]
    db = Pg(url=f"{base}/{name}")
    db.sql("CREATE SCHEMA bronze")
    db.sql("CREATE TABLE bronze.orders (order_id integer, order_total numeric(12,2), note text, dt date)")
    for i, day in enumerate(DAYS):
        for j in range(1, 4):
            oid = 100 * (i + 1) + j
            db.sql("INSERT INTO bronze.orders VALUES (%s, %s, %s, %s)", [oid, f"{oid}.50", f"order {oid}", day])
    try:
        yield db
    finally:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.close()
