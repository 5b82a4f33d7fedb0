//! `fixpoint demo`: the seeds' story on an embedded DuckDB file, with every
//! claim checked as it is printed.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use fixpoint_core::engine::measure::{fingerprint, Filter, Scope};

use fixpoint_core::engine::Engine;
use fixpoint_core::{Error, Fingerprint, Job, Method, RunDate, RunOptions};
use fixpoint_core::run::ledger;
use fixpoint_duckdb::DuckDb;
use serde_json::json;

use crate::output::Output;

const JOB: &str = r#"# A daily load of silver.orders from bronze.orders, safe to re-run.
name = "silver_orders"
target = "silver.orders"
strategy = "replace_partition"
partition = "dt"
# Columns left out of fingerprints: when and by which run a row was loaded.
metadata = ["load_id", "loaded_at"]
# An empty upstream must not wipe a day.
min_rows = 1

[source]
# One row per order (the newest version; ties broken by every column), for
# the run's day only. The day comes from the caller as :run_date.
sql = """
SELECT order_id, customer_id, order_total, currency, updated_at, dt,
       :run_key AS load_id,
       now() AS loaded_at
FROM (
    SELECT *, row_number() OVER (
        PARTITION BY order_id
        ORDER BY updated_at DESC, order_total DESC, currency, customer_id
    ) AS version_rank
    FROM bronze.orders
    WHERE dt = :run_date
) AS latest
WHERE version_rank = 1
"""
"#;

fn check(ok: bool, what: &str) -> Result<(), Error> {
    if ok {
        Ok(())
    } else {
        Err(Error::Internal(format!("demo: {what}")))
    }
}

fn date(s: &str) -> RunDate {
    RunDate::parse(s).expect("demo date")
}

fn partition_fp(engine: &mut DuckDb, job: &Job, d: RunDate) -> Result<Fingerprint, Error> {
    let cols = engine.table_columns(&job.target)?.unwrap_or_default();
    let cols: Vec<_> = cols.into_iter().filter(|c| !job.metadata.contains(&c.name)).collect();
    let scope = Scope::Table { table: &job.target, filter: Some(Filter::DateEquals("dt", d.date())) };
    fingerprint(engine, Method::Native, &scope, &cols)
}

fn n(v: u64) -> String {
    let s = v.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

pub fn run(rows: u64, dir: &Path, out: &Output) -> Result<(), Error> {
    if rows < 100 {
        return Err(Error::argument(format!("--rows {rows}: the demo needs at least 100 rows"), Some("try --rows 100000")));
    }
    let io = |path: &Path| {
        let path = path.to_owned();
        move |source| Error::Io { path, source }
    };
    std::fs::create_dir_all(dir).map_err(io(dir))?;
    let db_path = dir.join("demo.duckdb");
    for p in [db_path.clone(), dir.join("demo.duckdb.wal")] {
        if p.exists() {
            std::fs::remove_file(&p).map_err(io(&p))?;
        }
    }
    let job_path = dir.join("silver_orders.toml");
    std::fs::write(&job_path, JOB).map_err(io(&job_path))?;
    let job = Job::from_file(&job_path)?;
    let url = format!("duckdb:{}", db_path.display());
    let mut say = Vec::<String>::new();
    let mut log = |line: String| {
        if !out.is_json() {
            out.text(&line);
        }
        say.push(line);
    };

    // Bronze: five days of orders, one order delivered twice (a newer
    // version), one delivered twice identically, one event arriving late.
    let mut engine = DuckDb::open(&db_path, Duration::from_secs(10))?;
    let setup = format!(
        "CREATE SCHEMA bronze;
         CREATE TABLE bronze.orders AS
         SELECT i AS order_id,
                (i * 7) % 997 AS customer_id,
                CAST(((i * 7919) % 100000) / 100.0 AS DECIMAL(12,2)) AS order_total,
                ['EUR', 'USD', 'GBP'][(i % 3) + 1] AS currency,
                CAST(DATE '2026-10-18' + CAST(i % 5 AS INTEGER) AS TIMESTAMP) + to_seconds((i * 37) % 86400) AS updated_at,
                DATE '2026-10-18' + CAST(i % 5 AS INTEGER) AS dt
         FROM range(1, {rows} + 1) AS t(i);
         INSERT INTO bronze.orders
         SELECT order_id, customer_id, order_total + 5, currency, updated_at + INTERVAL 1 HOUR, dt
         FROM bronze.orders WHERE order_id = 2;
         INSERT INTO bronze.orders SELECT * FROM bronze.orders WHERE order_id = 7;
         INSERT INTO bronze.orders VALUES ({late}, 42, 19.99, 'EUR', TIMESTAMP '2026-10-21 02:14:00', DATE '2026-10-20');",
        late = rows + 1
    );
    engine.connection().execute_batch(&setup).map_err(|e| fixpoint_duckdb::database_error("building the demo's bronze.orders".into(), e))?;
    log(format!("fixpoint demo: {} rows of bronze.orders over 2026-10-18 … 2026-10-22 in {}", n(rows + 3), db_path.display()));
    log("  (order 2 arrives twice with a newer version, order 7 twice identically, order".to_owned());
    log(format!("   {} on 2026-10-20 arrives late, at 2026-10-21 02:14)", rows + 1));
    log(format!("job file: {}", job_path.display()));
    log(String::new());

    let (d19, d20, d21) = (date("2026-10-19"), date("2026-10-20"), date("2026-10-21"));
    let show = |fp: &Fingerprint| format!("{} rows, checksum {}", n(fp.rows), fp.checksum);

    log("1. Load 2026-10-19 and 2026-10-20 (a backfill is a loop over dates)".into());
    let r19 = job.load(d19, &mut engine)?;
    let r20 = job.load(d20, &mut engine)?;
    log(format!("   2026-10-19  {}  run key {}", show(&r19.output()), r19.run_key));
    log(format!("   2026-10-20  {}  run key {}", show(&r20.output()), r20.run_key));
    check(r20.input_rows == (rows + 3) / 5 + 1, "order 2 and order 7 collapse to one row each")?;

    log("2. The scheduler retries 2026-10-20".into());
    let again = job.load(d20, &mut engine)?;
    log(format!("   run again:       {} ({})", show(&again.output()), again.outcome));
    check(again.outcome == "skipped" && again.output() == r20.output(), "a retry over the same input is a no-op")?;
    let forced = job.load_with(d20, &mut engine, &RunOptions { force: true, ..Default::default() })?;
    log(format!(
        "   forced rewrite:  {} ({} deleted, {} inserted)",
        show(&forced.output()),
        n(forced.rows_deleted),
        n(forced.rows_inserted)
    ));
    check(forced.output() == r20.output() && forced.run_key == r20.run_key, "a forced rewrite gives the same fingerprint")?;
    log("   same row count, same checksum, same run key.".into());

    log("3. 02:14: the first attempt for 2026-10-21 dies after writing half the day".into());
    drop(engine);
    let exe = std::env::current_exe().map_err(io(Path::new("fixpoint")))?;
    let status = Command::new(exe)
        .args(["run", &job_path.display().to_string(), "--date", "2026-10-21", "--db", &url])
        .env("FIXPOINT_TEST_MODE", "1")
        .env("FIXPOINT_FAIL_AT", "mid_insert")
        .env("FIXPOINT_FAIL_MODE", "abort")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .map_err(io(Path::new("fixpoint")))?;
    check(!status.success(), "the first attempt was killed")?;
    let mut engine = DuckDb::open(&db_path, Duration::from_secs(10))?;
    let after_crash = partition_fp(&mut engine, &job, d21)?;
    let ledger_rows = ledger::entries(&mut engine, Some(&job.name), Some(d21), None)?.len();
    log(format!("   attempt 1: process killed ({status}) after inserting about half the day"));
    log(format!("   partition 2026-10-21 now: {} rows; ledger entries for it: {ledger_rows}", n(after_crash.rows)));
    check(after_crash.rows == 0 && ledger_rows == 0, "nothing of the dead attempt is visible")?;
    let retry = job.load(d21, &mut engine)?;
    let again = job.load_with(d21, &mut engine, &RunOptions { force: true, ..Default::default() })?;
    log(format!("   retry:           {}", show(&retry.output())));
    log(format!("   run again:       {}", show(&again.output())));
    check(retry.output() == again.output(), "the retry converges")?;
    log(format!(
        "   (a job that appended on retry would now hold about {} rows for 2026-10-21, {} of them twice)",
        n(retry.output_rows + retry.output_rows / 2),
        n(retry.output_rows / 2)
    ));

    log("4. One input row changes: order 12 of 2026-10-20 gets a new total".into());
    let conn = engine.connection();
    let exec = |sql: &str| {
        conn.execute_batch(sql).map_err(|e| fixpoint_duckdb::database_error("demo".into(), e))
    };
    exec("CREATE TEMP TABLE before_change AS SELECT * EXCLUDE (load_id, loaded_at) FROM silver.orders WHERE dt = DATE '2026-10-20';
          UPDATE bronze.orders SET order_total = order_total + 1, updated_at = updated_at + INTERVAL 1 SECOND WHERE order_id = 12;")?;
    let changed = job.load(d20, &mut engine)?;
    let diff: (i64, Option<i64>) = engine
        .connection()
        .query_row(
            "WITH after_change AS (SELECT * EXCLUDE (load_id, loaded_at) FROM silver.orders WHERE dt = DATE '2026-10-20'),
                  d AS ((SELECT * FROM before_change EXCEPT ALL SELECT * FROM after_change)
                        UNION ALL (SELECT * FROM after_change EXCEPT ALL SELECT * FROM before_change))
             SELECT count(DISTINCT order_id), min(order_id) FROM d",
            [],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .map_err(|e| fixpoint_duckdb::database_error("demo diff".into(), e))?;
    log(format!("   run key {} → {}", r20.run_key, changed.run_key));
    log(format!("   orders of 2026-10-20 whose output changed: {} (order {})", diff.0, diff.1.unwrap_or(0)));
    check(changed.run_key != r20.run_key && diff == (1, Some(12)), "only the changed row's output changes")?;

    log("5. Other days untouched".into());
    let fp19 = partition_fp(&mut engine, &job, d19)?;
    log(format!("   2026-10-19  {}", show(&fp19)));
    check(fp19 == r19.output(), "2026-10-19 is untouched")?;
    log(String::new());
    log("Verdict: every rerun left the same row count and checksum; the diff is empty.".into());
    log("Explore:".into());
    log(format!("  fixpoint run {} --date 2026-10-22 --db {url}", job_path.display()));
    log(format!(
        "  fixpoint fingerprint silver.orders --where \"dt = DATE '2026-10-20'\" --exclude load_id,loaded_at --db {url}"
    ));
    if out.is_json() {
        out.json(&json!({"verdict": "the diff is empty", "database": db_path.display().to_string(), "job": job_path.display().to_string(), "steps": say}));
    }
    Ok(())
}
