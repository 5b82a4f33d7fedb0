#!/usr/bin/env python3
"""Probe the local Spark Connect cluster started by scripts/spark-local.sh.

Run it with the venv's interpreter (it has pyspark[connect]):

    "${FIXPOINT_SPARK_HOME:-$HOME/.cache/fixpoint/spark}/venv/bin/python" scripts/spark-check.py [main|persist]

  main     (default) SELECT 1, partition overwrite (dynamic and static), MERGE,
           error classes, hash/decimal functions. Leaves table s.t behind.
  persist  checks that s.t (as left by `main`) is still there, e.g. after
           `spark-local.sh stop && spark-local.sh start`.

Each probe prints one block; a probe that fails prints the exception's type,
error class, SQLSTATE, gRPC status and message. Exit code is 0 when every
expectation held, 1 otherwise.
"""

import hashlib
import logging
import os
import sys
import time
import warnings

warnings.filterwarnings("ignore", category=FutureWarning)  # pandas>=3 notice, getErrorClass deprecation

from pyspark.sql import SparkSession  # noqa: E402
import pyspark.sql.connect.client.core as _core  # noqa: E402

for _name in ("SQLQueryContextLogger", "pyspark", "pyspark.sql.connect.client.logging"):
    logging.getLogger(_name).setLevel(logging.CRITICAL)

# Record the raw google.rpc.ErrorInfo that arrives in the gRPC status details,
# i.e. what a non-Python client (fixpoint's Rust engine) gets without calling
# FetchErrorDetails.
LAST_ERROR_INFO = {}
_orig_convert = _core.convert_exception


def _recording_convert(info, truncated_message, resp, *args, **kwargs):
    LAST_ERROR_INFO.clear()
    LAST_ERROR_INFO.update(
        reason=info.reason,
        domain=info.domain,
        metadata_keys=sorted(info.metadata.keys()),
        errorClass=info.metadata.get("errorClass"),
        sqlState=info.metadata.get("sqlState"),
        classes=info.metadata.get("classes"),
        status_message=truncated_message.strip().splitlines()[0] if truncated_message.strip() else "",
    )
    return _orig_convert(info, truncated_message, resp, *args, **kwargs)


_core.convert_exception = _recording_convert

URL = os.environ.get("FIXPOINT_TEST_SPARK", "sc://127.0.0.1:15002")
FAILURES = []


def section(title):
    print(f"\n=== {title}", flush=True)


def expect(cond, what):
    print(f"  [{'ok' if cond else 'FAIL'}] {what}", flush=True)
    if not cond:
        FAILURES.append(what)


def describe_error(e):
    info = {"type": f"{type(e).__module__}.{type(e).__name__}"}
    for name, attr in (
        ("getCondition", "getCondition"),
        ("getErrorClass", "getErrorClass"),
        ("sqlState", "getSqlState"),
        ("grpcStatus", "getGrpcStatusCode"),
        ("messageParameters", "getMessageParameters"),
    ):
        f = getattr(e, attr, None)
        if f is not None:
            try:
                info[name] = f()
            except Exception as inner:  # noqa: BLE001
                info[name] = f"<{attr} raised {inner!r}>"
    msg = e.getMessage() if hasattr(e, "getMessage") else str(e)
    info["message"] = msg.strip().splitlines()[0] if msg else ""
    return info


def print_error(e):
    for k, v in describe_error(e).items():
        print(f"  {k}: {v}", flush=True)
    if LAST_ERROR_INFO:
        print(f"  grpc ErrorInfo: {LAST_ERROR_INFO}", flush=True)
        LAST_ERROR_INFO.clear()


def sql(spark, q, show=True):
    t = time.monotonic()
    rows = spark.sql(q).collect()
    dt = time.monotonic() - t
    if show:
        print(f"  > {q}  ({dt:.2f}s)", flush=True)
        for r in rows[:20]:
            print(f"    {tuple(r)}", flush=True)
    return rows


def try_sql(spark, q):
    """Run q; return (rows, None) or (None, exception). Prints either."""
    try:
        return sql(spark, q), None
    except Exception as e:  # noqa: BLE001
        print(f"  > {q}\n  ERROR:", flush=True)
        print_error(e)
        return None, e


def table_rows(spark):
    return sorted(
        (r["id"], r["v"], str(r["dt"]))
        for r in spark.sql("SELECT id, v, dt FROM s.t").collect()
    )


def reset_table(spark):
    sql(spark, "CREATE DATABASE IF NOT EXISTS s")
    sql(spark, "DROP TABLE IF EXISTS s.t")
    sql(spark, "CREATE TABLE s.t (id BIGINT, v STRING, dt DATE) USING parquet PARTITIONED BY (dt)")
    sql(
        spark,
        "INSERT INTO s.t VALUES "
        "(1, 'a', DATE '2026-10-19'), (2, 'b', DATE '2026-10-19'), "
        "(3, 'c', DATE '2026-10-20'), (4, 'd', DATE '2026-10-20')",
    )


BASE = [(1, "a", "2026-10-19"), (2, "b", "2026-10-19"), (3, "c", "2026-10-20"), (4, "d", "2026-10-20")]


def check_select1(spark):
    section("1. SELECT 1")
    rows = sql(spark, "SELECT 1 AS one")
    expect(rows[0]["one"] == 1, "SELECT 1 returns 1")
    sql(spark, "SELECT version() AS v, current_catalog() AS cat")
    rows = sql(spark, "SET spark.sql.catalogImplementation")
    expect(rows[0][1] == "hive", "catalogImplementation is hive")
    sql(spark, "SET spark.sql.ansi.enabled")
    sql(spark, "SET spark.sql.warehouse.dir")
    # A query that needs the executor on the worker (not just the driver).
    rows = sql(spark, "SELECT count(*) AS n, sum(id) AS s FROM range(0, 1000000, 1, 8)")
    expect(rows[0]["n"] == 1000000, "range count via executor")


def check_overwrite(spark):
    section("2. partitioned parquet table + INSERT OVERWRITE")
    reset_table(spark)
    expect(table_rows(spark) == BASE, "initial 4 rows in two dates")
    sql(spark, "SHOW PARTITIONS s.t")

    sql(spark, "SET spark.sql.sources.partitionOverwriteMode=dynamic")
    sql(
        spark,
        "INSERT OVERWRITE TABLE s.t PARTITION (dt) "
        "SELECT id, v, dt FROM VALUES (10, 'x', DATE '2026-10-20') AS src(id, v, dt)",
    )
    got = table_rows(spark)
    print(f"  rows: {got}")
    expect(
        got == [(1, "a", "2026-10-19"), (2, "b", "2026-10-19"), (10, "x", "2026-10-20")],
        "dynamic INSERT OVERWRITE ... PARTITION (dt): only 2026-10-20 replaced, 2026-10-19 survives",
    )

    # Static partition spec, dynamic mode still on.
    _, err = try_sql(
        spark,
        "INSERT OVERWRITE TABLE s.t PARTITION (dt = DATE '2026-10-20') "
        "SELECT id, v FROM VALUES (20, 'y') AS src(id, v)",
    )
    expect(err is None, "static INSERT OVERWRITE ... PARTITION (dt = DATE '...') accepted (dynamic mode)")
    if err is None:
        got = table_rows(spark)
        print(f"  rows: {got}")
        expect(
            got == [(1, "a", "2026-10-19"), (2, "b", "2026-10-19"), (20, "y", "2026-10-20")],
            "static overwrite (dynamic mode) replaced only 2026-10-20",
        )

    # Same static form in the default (static) mode.
    sql(spark, "SET spark.sql.sources.partitionOverwriteMode=static")
    _, err = try_sql(
        spark,
        "INSERT OVERWRITE TABLE s.t PARTITION (dt = DATE '2026-10-20') "
        "SELECT id, v FROM VALUES (21, 'z') AS src(id, v)",
    )
    expect(err is None, "static INSERT OVERWRITE ... PARTITION (dt = DATE '...') accepted (static mode)")
    if err is None:
        got = table_rows(spark)
        print(f"  rows: {got}")
        expect(
            got == [(1, "a", "2026-10-19"), (2, "b", "2026-10-19"), (21, "z", "2026-10-20")],
            "static overwrite (static mode) replaced only 2026-10-20",
        )

    # Static partition spec with a plain string literal instead of DATE '...'.
    _, err = try_sql(
        spark,
        "INSERT OVERWRITE TABLE s.t PARTITION (dt = '2026-10-20') "
        "SELECT id, v FROM VALUES (22, 'w') AS src(id, v)",
    )
    if err is None:
        print(f"  rows: {table_rows(spark)}")

    # Gotcha probe: the dynamic form in *static* mode wipes every partition.
    sql(
        spark,
        "INSERT OVERWRITE TABLE s.t PARTITION (dt) "
        "SELECT id, v, dt FROM VALUES (30, 'q', DATE '2026-10-20') AS src(id, v, dt)",
    )
    got = table_rows(spark)
    print(f"  rows after dynamic-form overwrite in static mode: {got}")
    expect(
        got == [(30, "q", "2026-10-20")],
        "(gotcha) partitionOverwriteMode=static + PARTITION (dt) truncates the whole table",
    )

    # Leave a known state for the later probes and for `persist`.
    reset_table(spark)
    sql(spark, "SET spark.sql.sources.partitionOverwriteMode=dynamic")
    sql(
        spark,
        "INSERT OVERWRITE TABLE s.t PARTITION (dt) "
        "SELECT id, v, dt FROM VALUES (10, 'x', DATE '2026-10-20') AS src(id, v, dt)",
    )
    sql(spark, "SHOW PARTITIONS s.t")
    sql(spark, "DESCRIBE TABLE EXTENDED s.t", show=False)
    for r in spark.sql("DESCRIBE TABLE EXTENDED s.t").collect():
        if r[0] in ("Provider", "Location", "Type", "Partition Provider"):
            print(f"    {r[0]}: {r[1]}")


def check_merge(spark):
    section("3. MERGE / UPDATE / DELETE on the parquet table")
    _, err = try_sql(
        spark,
        "MERGE INTO s.t AS tgt USING (SELECT 1L AS id, 'm' AS v, DATE '2026-10-19' AS dt) AS src "
        "ON tgt.id = src.id "
        "WHEN MATCHED THEN UPDATE SET v = src.v "
        "WHEN NOT MATCHED THEN INSERT *",
    )
    expect(err is not None, "MERGE INTO on a parquet table fails")
    try_sql(spark, "UPDATE s.t SET v = 'u' WHERE id = 1")
    try_sql(spark, "DELETE FROM s.t WHERE id = 1")
    try_sql(spark, "TRUNCATE TABLE s.t PARTITION (dt = DATE '2026-10-19')")
    got = table_rows(spark)
    print(f"  rows: {got}")
    # TRUNCATE of a partition is supported; put the rows back for `persist`.
    sql(
        spark,
        "INSERT INTO s.t PARTITION (dt = DATE '2026-10-19') VALUES (1, 'a'), (2, 'b')",
    )
    expect(
        table_rows(spark) == [(1, "a", "2026-10-19"), (2, "b", "2026-10-19"), (10, "x", "2026-10-20")],
        "table back to the expected 3 rows",
    )


def check_errors(spark):
    section("4. error classes")
    cases = [
        ("syntax error", "SELEC 1", "PARSE_SYNTAX_ERROR", "42601"),
        ("missing table", "SELECT * FROM s.no_such_table", "TABLE_OR_VIEW_NOT_FOUND", "42P01"),
        ("missing schema", "SELECT * FROM no_such_schema.t", "TABLE_OR_VIEW_NOT_FOUND", "42P01"),
        ("missing column", "SELECT no_such_col FROM s.t", None, None),
        ("insert into missing table", "INSERT INTO s.no_such_table VALUES (1)", None, None),
        ("create existing table", "CREATE TABLE s.t (id BIGINT) USING parquet", None, None),
        ("divide by zero (ANSI)", "SELECT 1 / 0", None, None),
        ("bad cast (ANSI)", "SELECT CAST('x' AS INT)", None, None),
    ]
    for name, q, want_class, want_state in cases:
        print(f"  -- {name}")
        _, err = try_sql(spark, q)
        if want_class:
            got_class = err.getCondition() if err is not None else None
            got_state = err.getSqlState() if err is not None else None
            expect(
                got_class == want_class and got_state == want_state,
                f"{name}: {want_class} / {want_state}",
            )


def check_functions(spark):
    section("5. hash / md5 / conv / DECIMAL(38,0) sums")
    rows = sql(
        spark,
        "SELECT xxhash64('abc') AS xx, md5('abc') AS md5, "
        "conv(substr(md5('abc'), 1, 16), 16, 10) AS conv16, "
        "CAST(conv(substr(md5('abc'), 1, 16), 16, 10) AS DECIMAL(38,0)) AS conv_dec, "
        "typeof(xxhash64('abc')) AS t_xx, typeof(conv('1', 16, 10)) AS t_conv",
    )
    r = rows[0]
    md5_py = hashlib.md5(b"abc").hexdigest()
    expect(r["md5"] == md5_py, f"md5('abc') = {md5_py}")
    expect(r["conv16"] == str(int(md5_py[:16], 16)), f"conv(substr(md5,1,16),16,10) = {int(md5_py[:16], 16)}")
    expect(int(r["conv_dec"]) == int(md5_py[:16], 16), "CAST(conv(...) AS DECIMAL(38,0)) exact")
    print(f"  xxhash64('abc') = {r['xx']} ({r['t_xx']}); conv returns {r['t_conv']}")

    n = 1000
    rows = sql(
        spark,
        f"SELECT "
        f"SUM(CAST(xxhash64(CAST(id AS STRING)) AS DECIMAL(38,0))) AS sum_xx, "
        f"SUM(CAST(conv(substr(md5(CAST(id AS STRING)), 1, 16), 16, 10) AS DECIMAL(38,0))) AS sum_md5, "
        f"typeof(SUM(CAST(xxhash64(CAST(id AS STRING)) AS DECIMAL(38,0)))) AS t_sum "
        f"FROM range({n})",
    )
    r = rows[0]
    want = sum(int(hashlib.md5(str(i).encode()).hexdigest()[:16], 16) for i in range(n))
    expect(int(r["sum_md5"]) == want, f"SUM(DECIMAL(38,0)) of md5 prefixes over range({n}) = {want}")
    print(f"  sum_xx = {r['sum_xx']}  type {r['t_sum']}")

    # Order-independent table fingerprint of the kind a verifier would use.
    sql(
        spark,
        "SELECT count(*) AS n, "
        "SUM(CAST(xxhash64(id, v, dt) AS DECIMAL(38,0))) AS fp_xx, "
        "SUM(CAST(conv(substr(md5(concat_ws('|', id, v, dt)), 1, 16), 16, 10) AS DECIMAL(38,0))) AS fp_md5 "
        "FROM s.t",
    )
    # Empty input: SUM is NULL, not 0.
    sql(spark, "SELECT SUM(CAST(xxhash64(id) AS DECIMAL(38,0))) AS s FROM s.t WHERE false")


def check_persist(spark):
    section("6. table survives restart")
    sql(spark, "SHOW TABLES IN s")
    got = table_rows(spark)
    print(f"  rows: {got}")
    expect(
        got == [(1, "a", "2026-10-19"), (2, "b", "2026-10-19"), (10, "x", "2026-10-20")],
        "s.t and its rows survive stop + start",
    )
    sql(spark, "SHOW PARTITIONS s.t")


def main():
    mode = sys.argv[1] if len(sys.argv) > 1 else "main"
    t = time.monotonic()
    spark = SparkSession.builder.remote(URL).getOrCreate()
    print(f"connected to {URL} in {time.monotonic() - t:.2f}s (client pyspark {spark.version})")
    steps = {
        "main": [check_select1, check_overwrite, check_merge, check_errors, check_functions],
        "persist": [check_persist],
    }[mode]
    for step in steps:
        try:
            step(spark)
        except Exception as e:  # noqa: BLE001
            print(f"  UNEXPECTED ERROR in {step.__name__}:")
            print_error(e)
            FAILURES.append(f"{step.__name__}: {e!r}"[:300])
    spark.stop()
    print(f"\n{len(FAILURES)} expectation(s) failed" + "".join(f"\n  - {f}" for f in FAILURES))
    print(f"total {time.monotonic() - t:.1f}s")
    return 1 if FAILURES else 0


if __name__ == "__main__":
    sys.exit(main())
