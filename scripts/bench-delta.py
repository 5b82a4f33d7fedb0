#!/usr/bin/env python3
"""fixpoint on a Delta warehouse against the same work done by hand with the
Python `deltalake` package (BENCHMARKS.md, "Delta Lake").

    replace: a day of --day-rows rows replaced in a table of --days days
             (fixpoint: a replace_partition job, --force;
              by hand: write_deltalake(mode="overwrite", predicate="dt = '…'"));
             right after each of fixpoint's runs, the same run without
             --force: skipped (same input, the day as recorded), timed
             against the hand-written overwrite
    merge:   --changes changes (newest version per key wins, deduplicated
             first) into a table of --rows rows, touching the last two days
             (fixpoint: a merge job; by hand: ROW_NUMBER dedup in DuckDB,
              then DeltaTable.merge with a version guard)

Both sides start from identical copies of the tables (copied before each
round, not timed), run alternately, and must leave the same rows (a hash of
every row, read back by deltalake) before a ratio is printed. Median of
--rounds rounds; peak memory is each side's maximum resident set size.

Run with the tests' virtualenv (deltalake, pyarrow, duckdb):
    ~/.cache/fixpoint/pyvenv/bin/python scripts/bench-delta.py --fixpoint target/release/fixpoint
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import duckdb
import pyarrow as pa
from deltalake import DeltaTable, write_deltalake

REPLACE_JOB = """name = "bench_replace"
target = "silver.events"
strategy = "replace_partition"
partition = "dt"

[source]
sql = "SELECT id, customer, amount, note, updated_at, dt FROM bronze.events_day WHERE dt = :run_date"
"""

MERGE_JOB = """name = "bench_merge"
target = "silver.accounts"
strategy = "merge"
key = ["id"]
version = "v"
partition = "dt"
on_tie = "deterministic"

[source]
sql = "SELECT id, v, amount, note, dt FROM bronze.changes WHERE batch = :run_date"
"""


def day(i):
    return f"2026-10-{1 + i:02d}"


def timed(cmd, env=None, out=None):
    """Runs cmd in a child; returns (seconds, peak RSS in MiB of that child).
    Its standard output goes to the file `out`, or nowhere."""
    start = time.perf_counter()
    pid = os.fork()
    if pid == 0:
        try:
            # The run's report is not the benchmark's output.
            sink = os.open(out or os.devnull, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.dup2(sink, 1)
            if env is not None:
                os.execvpe(cmd[0], cmd, env)
            os.execvp(cmd[0], cmd)
        finally:
            os._exit(127)
    _, status, usage = os.wait4(pid, 0)
    secs = time.perf_counter() - start
    if os.waitstatus_to_exitcode(status) != 0:
        sys.exit(f"failed: {' '.join(cmd)}")
    return secs, usage.ru_maxrss / 1024


def table_hash(path, columns):
    """Row count and an order-independent hash of every row, read by deltalake."""
    t = DeltaTable(path).to_pyarrow_table(columns=columns)
    con = duckdb.connect()
    con.register("t", t)
    cols = ", ".join(columns)
    return con.execute(f"SELECT count(*), sum(hash({cols})) FROM t").fetchone()


def make_replace(base, days, day_rows):
    con = duckdb.connect()
    wh = os.path.join(base, "wh")
    gen = lambda n, d, salt: con.execute(
        f"""SELECT i AS id, i % 1000 AS customer, CAST((i * 37 + {salt}) % 100000 AS DECIMAL(12,2)) / 100 AS amount,
                   'note ' || (i % 97) AS note, TIMESTAMP '2026-10-01 00:00:00' + to_microseconds(i) AS updated_at,
                   DATE '{d}' AS dt FROM range({n}) AS r(i)"""
    ).to_arrow_table()
    for i in range(days - 1):
        write_deltalake(os.path.join(wh, "silver/events"), gen(day_rows, day(i), 0), partition_by=["dt"], mode="append")
    write_deltalake(os.path.join(wh, "bronze/events_day"), gen(day_rows, day(days - 1), 7), mode="append")
    # The day to replace holds older rows in the target.
    write_deltalake(os.path.join(wh, "silver/events"), gen(day_rows, day(days - 1), 3), partition_by=["dt"], mode="append")
    with open(os.path.join(base, "replace.toml"), "w") as f:
        f.write(REPLACE_JOB)
    return wh


def make_merge(base, rows, days, changes):
    con = duckdb.connect()
    wh = os.path.join(base, "wh")
    per_day = rows // days
    for i in range(days):
        t = con.execute(
            f"""SELECT {i * per_day} + i AS id, 1 AS v, CAST(i % 100000 AS DECIMAL(12,2)) AS amount,
                       'n' || (i % 89) AS note, DATE '{day(i)}' AS dt FROM range({per_day}) AS r(i)"""
        ).to_arrow_table()
        write_deltalake(os.path.join(wh, "silver/accounts"), t, partition_by=["dt"], mode="append")
    # Changes to keys of the last two days: updates (newer versions, some
    # duplicated), a few stale versions, and new keys.
    lo = (days - 2) * per_day
    t = con.execute(
        f"""SELECT CASE WHEN i % 10 = 0 THEN {rows} + i ELSE {lo} + (i * 7919) % {2 * per_day} END AS id,
                   2 + i % 3 AS v, CAST(i % 5000 AS DECIMAL(12,2)) AS amount, 'c' || (i % 7) AS note,
                   CASE WHEN i % 10 = 0 THEN DATE '{day(days - 1)}'
                        ELSE DATE '{day(days - 2)}' + CAST((({lo} + (i * 7919) % {2 * per_day}) - {lo}) // {per_day} AS INTEGER) END AS dt,
                   DATE '2026-11-01' AS batch
            FROM range({changes}) AS r(i)"""
    ).to_arrow_table()
    write_deltalake(os.path.join(wh, "bronze/changes"), t, mode="append")
    with open(os.path.join(base, "merge.toml"), "w") as f:
        f.write(MERGE_JOB)
    return wh


HAND_REPLACE = r"""
import sys
from deltalake import DeltaTable, write_deltalake
wh, d = sys.argv[1], sys.argv[2]
src = DeltaTable(wh + "/bronze/events_day").to_pyarrow_table()
write_deltalake(wh + "/silver/events", src, mode="overwrite", predicate=f"dt = '{d}'", partition_by=["dt"])
"""

HAND_MERGE = r"""
import sys, duckdb
from deltalake import DeltaTable
wh = sys.argv[1]
changes = DeltaTable(wh + "/bronze/changes").to_pyarrow_table()
con = duckdb.connect()
con.register("c", changes)
batch = con.execute('''SELECT id, v, amount, note, dt FROM (
    SELECT *, row_number() OVER (PARTITION BY id ORDER BY v DESC, amount ASC NULLS FIRST, note ASC NULLS FIRST, dt ASC NULLS FIRST) AS rn FROM c
    WHERE batch = DATE '2026-11-01') WHERE rn = 1''').to_arrow_table()
dt = DeltaTable(wh + "/silver/accounts")
(dt.merge(batch, predicate="t.id = s.id", source_alias="s", target_alias="t")
   .when_matched_update_all(predicate="s.v > t.v")
   .when_not_matched_insert_all()
   .execute())
"""


def bench(name, base, wh, fixpoint_cmd, hand_cmd, check_path, columns, rounds, retry_cmd=None):
    """The two sides, alternately; with `retry_cmd`, right after each of
    fixpoint's runs the same run again without --force, which must be skipped
    and leave the table as it was (timed apart: "retry")."""
    pristine = wh + ".pristine"
    shutil.copytree(wh, pristine)
    sides = {"fixpoint": [], "hand": []}
    retries = []
    report = os.path.join(base, "retry.json")
    result = {}
    for r in range(rounds):
        order = ["fixpoint", "hand"] if r % 2 == 0 else ["hand", "fixpoint"]
        for side in order:
            shutil.rmtree(wh)
            shutil.copytree(pristine, wh)
            secs, rss = timed(fixpoint_cmd if side == "fixpoint" else hand_cmd)
            sides[side].append((secs, rss))
            result[side] = table_hash(check_path, columns)
            if side == "fixpoint" and retry_cmd is not None:
                secs, rss = timed(retry_cmd, out=report)
                with open(report) as f:
                    outcome = json.load(f).get("outcome")
                if outcome != "skipped":
                    sys.exit(f"{name}: the retry without --force was {outcome!r}, not skipped")
                if table_hash(check_path, columns) != result[side]:
                    sys.exit(f"{name}: the skipped retry changed the table")
                retries.append((secs, rss))
        if result["fixpoint"] != result["hand"]:
            sys.exit(f"{name}: the two sides left different tables: fixpoint {result['fixpoint']}, by hand {result['hand']}")
        print(f"{name} round {r + 1}: fixpoint {sides['fixpoint'][-1][0]:.2f} s, by hand {sides['hand'][-1][0]:.2f} s", file=sys.stderr)
    shutil.rmtree(pristine)
    med = {s: statistics.median(t for t, _ in v) for s, v in sides.items()}
    rss = {s: max(m for _, m in v) for s, v in sides.items()}
    spread = {s: (min(t for t, _ in v), max(t for t, _ in v)) for s, v in sides.items()}
    retry = {}
    if retries:
        r = statistics.median(t for t, _ in retries)
        retry = {
            "retry_skipped_s": round(r, 3),
            "retry_ratio": round(r / med["hand"], 2),
            "retry_range_s": [round(min(t for t, _ in retries), 3), round(max(t for t, _ in retries), 3)],
            "retry_peak_mib": round(max(m for _, m in retries)),
        }
    return {
        "work": name,
        "rows": result["fixpoint"][0],
        "fixpoint_s": round(med["fixpoint"], 3),
        "hand_s": round(med["hand"], 3),
        "ratio": round(med["fixpoint"] / med["hand"], 2),
        "fixpoint_range_s": [round(x, 3) for x in spread["fixpoint"]],
        "hand_range_s": [round(x, 3) for x in spread["hand"]],
        "fixpoint_peak_mib": round(rss["fixpoint"]),
        "hand_peak_mib": round(rss["hand"]),
    } | retry


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--fixpoint", required=True, help="the fixpoint binary (built with --features fixpoint-cli/delta)")
    ap.add_argument("--work", choices=["replace", "merge", "both"], default="both")
    ap.add_argument("--days", type=int, default=4)
    ap.add_argument("--day-rows", type=int, default=5_000_000)
    ap.add_argument("--rows", type=int, default=20_000_000)
    ap.add_argument("--merge-days", type=int, default=20)
    ap.add_argument("--changes", type=int, default=200_000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--dir", default=None, help="scratch folder (default: a temporary one)")
    a = ap.parse_args()
    fixpoint = os.path.abspath(a.fixpoint)
    out = []
    with tempfile.TemporaryDirectory(dir=a.dir) as tmp:
        if a.work in ("replace", "both"):
            base = os.path.join(tmp, "replace")
            wh = make_replace(base, a.days, a.day_rows)
            d = day(a.days - 1)
            fx = [fixpoint, "run", os.path.join(base, "replace.toml"), "--date", d, "--db", "delta:" + wh, "--force", "--output", "json"]
            hand = [sys.executable, "-c", HAND_REPLACE, wh, d]
            retry = [x for x in fx if x != "--force"]
            out.append(bench(f"replace a {a.day_rows}-row day", base, wh, fx, hand, os.path.join(wh, "silver/events"), ["id", "customer", "amount", "note", "updated_at", "dt"], a.rounds, retry))
        if a.work in ("merge", "both"):
            base = os.path.join(tmp, "merge")
            wh = make_merge(base, a.rows, a.merge_days, a.changes)
            fx = [fixpoint, "run", os.path.join(base, "merge.toml"), "--date", "2026-11-01", "--db", "delta:" + wh, "--output", "json"]
            hand = [sys.executable, "-c", HAND_MERGE, wh]
            out.append(bench(f"merge {a.changes} changes into {a.rows} rows", base, wh, fx, hand, os.path.join(wh, "silver/accounts"), ["id", "v", "amount", "note", "dt"], a.rounds))
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
