//! `fixpoint-bench --strategy spark --db sc://host:port` (feature `spark`):
//! on the cluster, one day of `silver.orders` (a parquet table partitioned
//! by day) replaced by fixpoint against the hand-written `INSERT OVERWRITE`,
//! and a batch of changes merged by fixpoint (copy-on-write of the touched
//! partitions) against the hand-written copy-on-write. Alternating, in one
//! process (the work is the cluster's; the client's peak RSS is reported).

use std::path::Path;
use std::time::Instant;

use fixpoint_core::{Engine, Error, Job, RunDate, RunOptions, Sql};
use fixpoint_spark::Spark;
use serde_json::json;

use crate::bench::median;
use crate::Output;

const COLUMNS: &str = "order_id, customer_id, order_total, currency, updated_at, dt";

fn exec(db: &mut Spark, script: &str) -> Result<(), Error> {
    for stmt in script.split(";\n").map(str::trim).filter(|s| !s.is_empty()) {
        db.execute(&Sql::raw(stmt))?;
    }
    Ok(())
}

fn peak_rss_mb() -> f64 {
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: getrusage writes into the struct we own.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) };
    usage.ru_maxrss as f64 / 1024.0
}

/// bronze.orders and silver.orders: `per_day` rows on each of `days` days
/// from 2026-10-19, built once (bench.meta remembers the shape).
fn setup(db: &mut Spark, per_day: u64, days: u64) -> Result<(), Error> {
    let shape = format!("{per_day} {days} v1");
    let have = db.query(&Sql::raw("SELECT shape FROM bench.meta")).ok().and_then(|r| r.rows.first().map(|r| r[0].display()));
    if have.as_deref() == Some(&format!("{shape:?}")) {
        return Ok(());
    }
    eprintln!("bench: building {days} days x {per_day} rows on the cluster (once)");
    let total = per_day * days;
    exec(
        db,
        &format!(
            "DROP DATABASE IF EXISTS bench CASCADE;
DROP DATABASE IF EXISTS bronze CASCADE;
DROP DATABASE IF EXISTS silver CASCADE;
DROP DATABASE IF EXISTS staging CASCADE;
DROP DATABASE IF EXISTS fixpoint CASCADE;
CREATE DATABASE bench;
CREATE DATABASE bronze;
CREATE DATABASE silver;
CREATE DATABASE staging;
CREATE TABLE bronze.orders USING parquet PARTITIONED BY (dt) AS SELECT id AS order_id, (id * 7) % 100003 AS customer_id,
  CAST(((id * 7919) % 1000000) / 100.0 AS DECIMAL(12,2)) AS order_total,
  element_at(array('EUR', 'USD', 'GBP'), CAST(id % 3 AS INT) + 1) AS currency,
  timestamp_seconds(unix_timestamp(TIMESTAMP '2026-10-19 00:00:00') + CAST(id / {per_day} AS BIGINT) * 86400 + (id * 37) % 86400) AS updated_at,
  date_add(DATE '2026-10-19', CAST(id / {per_day} AS INT)) AS dt
  FROM range(0, {total});
CREATE TABLE silver.orders (order_id BIGINT, customer_id BIGINT, order_total DECIMAL(12,2), currency STRING, updated_at TIMESTAMP, dt DATE) USING parquet PARTITIONED BY (dt);
INSERT INTO silver.orders ({COLUMNS}) SELECT {COLUMNS} FROM bronze.orders;
CREATE TABLE bench.meta (shape STRING);
INSERT INTO bench.meta VALUES ('{shape}')"
        ),
    )
}

/// A batch of `changes` rows for round `round` (1 in 10 keys twice), spread
/// over the table's days, each newer than anything before.
fn changes(db: &mut Spark, table: &str, changes: u64, total: u64, per_day: u64, round: u64) -> Result<(), Error> {
    let distinct = changes - changes / 10;
    exec(
        db,
        &format!(
            "DROP TABLE IF EXISTS staging.{table};
CREATE TABLE staging.{table} USING parquet AS SELECT o.order_id, o.customer_id, CAST(o.order_total + 1 + c.rep AS DECIMAL(12,2)) AS order_total, o.currency,
  timestamp_seconds(unix_timestamp(TIMESTAMP '2026-11-01 00:00:00') + {round} * 1000 + c.rep) AS updated_at, o.dt
  FROM (SELECT (id * 7919) % {total} AS k, 0 AS rep FROM range(0, {distinct}) UNION ALL SELECT (id * 7919) % {total}, 1 FROM range(0, {dup})) AS c
  JOIN bronze.orders AS o ON o.order_id = c.k",
            dup = changes / 10,
        ),
    )?;
    let _ = per_day;
    Ok(())
}

const HAND_MERGE: &str = "CACHE TABLE hand_merged AS SELECT order_id, customer_id, order_total, currency, updated_at, dt FROM (
  SELECT *, row_number() OVER (PARTITION BY order_id ORDER BY updated_at DESC, src DESC) AS rn FROM (
    SELECT order_id, customer_id, order_total, currency, updated_at, dt, 1 AS src FROM (
      SELECT *, row_number() OVER (PARTITION BY order_id ORDER BY updated_at DESC) AS d FROM staging.{T}) AS x WHERE d = 1
    UNION ALL
    SELECT order_id, customer_id, order_total, currency, updated_at, dt, 0 FROM silver.orders WHERE dt IN (SELECT DISTINCT dt FROM staging.{T})
  ) AS u) AS r WHERE rn = 1;
INSERT OVERWRITE TABLE silver.orders (order_id, customer_id, order_total, currency, updated_at, dt) SELECT * FROM hand_merged;
UNCACHE TABLE hand_merged;
DROP VIEW hand_merged";

/// The rows of `from`, as a count and a sum of Spark's `hash` (murmur3)
/// over each row: the result checks' digest, by another path than
/// fixpoint's fingerprints (xxhash64).
fn digest(db: &mut Spark, from: &str) -> Result<String, Error> {
    let sql = format!("SELECT concat(CAST(count(*) AS STRING), ':', CAST(coalesce(sum(CAST(hash({COLUMNS}) AS DECIMAL(38, 0))), 0) AS STRING)) FROM {from}");
    let rows = db.query(&Sql::raw(sql))?;
    Ok(rows.rows.first().and_then(|r| r.first()).map(|v| v.display()).unwrap_or_default())
}

/// Checks that `side` left the day holding exactly the source's day.
fn check_day(db: &mut Spark, side: &str) -> Result<(), Error> {
    // The day may have been written by another session (the scanning
    // side's): this session's file listing of the table is stale.
    db.execute(&Sql::raw("REFRESH TABLE silver.orders"))?;
    let got = digest(db, "silver.orders WHERE dt = DATE '2026-10-20'")?;
    let want = digest(db, "bronze.orders WHERE dt = DATE '2026-10-20'")?;
    if got != want {
        return Err(Error::Internal(format!("the benchmark's sides disagree: after {side}, the day digests as {got} and the source's as {want}; no ratio is printed")));
    }
    Ok(())
}

#[allow(clippy::too_many_arguments)]
pub fn run(url: &str, rows: u64, days: u64, n_changes: u64, rounds: u32, merge_only: bool, dir: &Path, out: &Output) -> Result<(), Error> {
    let mut db = Spark::connect(url, std::time::Duration::from_secs(30))?;
    let per_day = rows / days;
    setup(&mut db, per_day, days)?;
    std::fs::create_dir_all(dir).map_err(|source| Error::Io { path: dir.to_owned(), source })?;
    let date = RunDate::parse("2026-10-20")?;
    let replace = Job::from_toml(
        "name = \"bench_orders\"\ntarget = \"silver.orders\"\nstrategy = \"replace_partition\"\npartition = \"dt\"\nmin_rows = 1\n\n[source]\nsql = \"SELECT order_id, customer_id, order_total, currency, updated_at, dt FROM bronze.orders WHERE dt = :run_date\"\n",
        &dir.join("bench_spark_orders.toml"),
    )?;
    let force = RunOptions { force: true, ..Default::default() };
    // fixpoint again, its writes not observed (the plan that scans the
    // source before the write and the day after it), in a session of its own.
    let mut scanning = Spark::connect(url, std::time::Duration::from_secs(30))?.without_observed_writes();
    // Warm-up: the first statements of a session pay for its setup.
    replace.load_with(date, &mut db, &force)?;
    replace.load_with(date, &mut scanning, &force)?;
    let (mut hand, mut ours, mut skip, mut scanned) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut inserted = 0;
    for round in 0..if merge_only { 0 } else { rounds } {
        let order = if round % 2 == 0 { [0, 1, 2] } else { [2, 1, 0] };
        for side in order {
            let t = Instant::now();
            if side == 1 {
                let r = replace.load_with(date, &mut db, &force)?;
                ours.push(t.elapsed().as_secs_f64());
                inserted = r.rows_inserted;
                if r.method != "partition overwrite, observed" {
                    return Err(Error::Internal(format!("fixpoint's run was not observed: {}", r.method)));
                }
                check_day(&mut db, "fixpoint's run")?;
            } else if side == 2 {
                let r = replace.load_with(date, &mut scanning, &force)?;
                scanned.push(t.elapsed().as_secs_f64());
                if r.method != "partition overwrite" {
                    return Err(Error::Internal(format!("fixpoint's scanning run reported {}", r.method)));
                }
                check_day(&mut db, "fixpoint's scanning run")?;
            } else {
                exec(&mut db, &format!("INSERT OVERWRITE TABLE silver.orders ({COLUMNS}) SELECT {COLUMNS} FROM bronze.orders WHERE dt = DATE '2026-10-20'"))?;
                hand.push(t.elapsed().as_secs_f64());
                check_day(&mut db, "the hand-written INSERT OVERWRITE")?;
            }
        }
        let t = Instant::now();
        let s = replace.load(date, &mut db)?;
        skip.push(t.elapsed().as_secs_f64());
        if s.outcome != "skipped" {
            return Err(Error::Internal(format!("the retry was not skipped: {}", s.outcome)));
        }
        eprintln!(
            "bench: replace round {round}: hand {:.2} s, fixpoint {:.2} s ({inserted} rows), scanning {:.2} s, skip {:.2} s",
            hand[hand.len() - 1],
            ours[ours.len() - 1],
            scanned[scanned.len() - 1],
            skip[skip.len() - 1]
        );
    }
    drop(scanning);
    let (hand_m, ours_m, skip_m, scanned_m) = (median(hand.clone()), median(ours.clone()), median(skip.clone()), median(scanned.clone()));

    // Merge: each side applies its own batch per round (newer each time),
    // on the table as built (an earlier bench run left newer versions).
    exec(&mut db, &format!("INSERT OVERWRITE TABLE silver.orders ({COLUMNS}) SELECT {COLUMNS} FROM bronze.orders"))?;
    let job = Job::from_toml(
        "name = \"bench_merge\"\ntarget = \"silver.orders\"\nstrategy = \"merge\"\nkey = [\"order_id\"]\nversion = \"updated_at\"\npartition = \"dt\"\n\n[source]\nsql = \"SELECT order_id, customer_id, order_total, currency, updated_at, dt FROM staging.ours\"\n",
        &dir.join("bench_spark_merge.toml"),
    )?;
    // One batch merged by each side into its own copy of the table: the two
    // tables must then be equal.
    {
        changes(&mut db, "ours", n_changes, rows, per_day, 2 * rounds as u64)?;
        exec(&mut db, "DROP TABLE IF EXISTS silver.orders_check;\nCREATE TABLE silver.orders_check USING parquet PARTITIONED BY (dt) AS SELECT * FROM silver.orders")?;
        job.load(date, &mut db)?;
        exec(&mut db, &HAND_MERGE.replace("{T}", "ours").replace("silver.orders ", "silver.orders_check "))?;
        let (fx, hw) = (digest(&mut db, "silver.orders")?, digest(&mut db, "silver.orders_check")?);
        exec(&mut db, "DROP TABLE silver.orders_check")?;
        if fx != hw {
            return Err(Error::Internal(format!("the benchmark's sides disagree on one batch merged into one table: fixpoint {fx}, hand-written {hw}; no ratio is printed")));
        }
        eprintln!("bench: one batch merged by each side gives the same table ({fx})");
    }
    let (mut hand_merge, mut ours_merge) = (Vec::new(), Vec::new());
    let mut changed = 0;
    for round in 0..rounds as u64 {
        let order = if round % 2 == 0 { [false, true] } else { [true, false] };
        for fixpoint_side in order {
            if fixpoint_side {
                changes(&mut db, "ours", n_changes, rows, per_day, 2 * (rounds as u64 + 1 + round) + 1)?;
                let t = Instant::now();
                let r = job.load(date, &mut db)?;
                ours_merge.push(t.elapsed().as_secs_f64());
                changed = r.rows_updated + r.rows_inserted;
            } else {
                changes(&mut db, "hand", n_changes, rows, per_day, 2 * (rounds as u64 + 1 + round))?;
                let t = Instant::now();
                exec(&mut db, &HAND_MERGE.replace("{T}", "hand"))?;
                hand_merge.push(t.elapsed().as_secs_f64());
            }
        }
        eprintln!("bench: merge round {round}: hand {:.2} s, fixpoint {:.2} s ({changed} changed)", hand_merge[hand_merge.len() - 1], ours_merge[ours_merge.len() - 1]);
    }
    let (hm, om) = (median(hand_merge.clone()), median(ours_merge.clone()));
    let rss = peak_rss_mb();
    let report = json!({
        "engine": db.version()?,
        "rows": rows, "days": days, "rounds": rounds, "changes": n_changes,
        "replace_partition": {"hand_written_s": hand_m, "fixpoint_s": ours_m, "ratio": ours_m / hand_m, "scanning_s": scanned_m, "scanning_ratio": scanned_m / hand_m, "skip_s": skip_m, "skip_ratio": skip_m / hand_m},
        "merge": {"hand_written_s": hm, "fixpoint_s": om, "ratio": om / hm, "rows_changed": changed},
        "results_checked": true,
        "client_peak_rss_mb": rss,
    });
    if out.is_json() {
        out.json(&report);
    } else {
        println!("spark, {days} days x {per_day} rows, median of {rounds} alternating rounds (each side's result checked against the source, and one merged batch against the other side's):");
        println!(
            "  replace_partition (one {per_day}-row day): hand-written INSERT OVERWRITE {hand_m:.2} s, fixpoint {ours_m:.2} s = {:.2}x (writes not observed: {scanned_m:.2} s = {:.2}x); a skipped retry {skip_m:.2} s = {:.2}x",
            ours_m / hand_m,
            scanned_m / hand_m,
            skip_m / hand_m
        );
        println!("  merge ({n_changes} changes, 1 in 10 keys twice): hand-written copy-on-write {hm:.2} s, fixpoint {om:.2} s = {:.2}x", om / hm);
        println!("  client peak RSS {rss:.0} MiB");
    }
    Ok(())
}
