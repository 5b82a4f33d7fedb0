//! `fixpoint-bench --strategy postgres`: the same measurements on a
//! PostgreSQL server. One day of a table replaced by fixpoint with partition
//! exchange (a table partitioned by day), by fixpoint with delete + insert (a
//! plain table), by the hand-written BEGIN; DELETE; INSERT … SELECT;
//! COMMIT on both tables, and by a hand-written partition exchange on the
//! partitioned one; then a merge of a batch of changes against the
//! hand-written MERGE. Each side runs in its own process (wall time,
//! in-process time and the client's peak RSS).

use std::path::Path;
use std::process::Command;
use std::time::Instant;

use fixpoint_core::{Engine, Error, RunDate, Sql, Value};
use fixpoint_postgres::Postgres;
use serde_json::json;

use crate::bench::{measure, median, Sample, HAND_MERGE};
use crate::Output;

const DATABASE: &str = "fixpoint_bench";
const COLUMNS: &str = "order_id, customer_id, order_total, currency, updated_at, dt";

/// `url` with its database replaced by `name`.
fn with_database(url: &str, name: &str) -> String {
    let scheme_end = url.find("://").map_or(0, |i| i + 3);
    let base = match url[scheme_end..].find('/') {
        Some(i) => &url[..scheme_end + i],
        None => url,
    };
    format!("{base}/{name}")
}

fn exec(db: &mut Postgres, script: &str) -> Result<(), Error> {
    for stmt in script.split(";\n").map(str::trim).filter(|s| !s.is_empty()) {
        db.execute(&Sql::raw(stmt))?;
    }
    Ok(())
}

/// Runs `script` (statements separated by `;` at a line's end) on `url`.
pub(crate) fn exec_script(url: &str, script: &str) -> Result<(), Error> {
    let mut db = Postgres::connect(url)?;
    exec(&mut db, script)
}

/// The one value of `query` on `url`, as text.
pub(crate) fn value(url: &str, query: &str) -> Result<String, Error> {
    let mut db = Postgres::connect(url)?;
    let rows = db.query(&Sql::raw(query))?;
    Ok(rows.rows.first().and_then(|r| r.first()).map(|v| v.display()).unwrap_or_else(|| "NULL".into()))
}

/// The URL of the database `name` on the server of `admin`, created when
/// missing.
pub(crate) fn database(admin: &str, name: &str) -> Result<String, Error> {
    let url = with_database(admin, name);
    if Postgres::connect(&url).is_err() {
        let mut server = Postgres::connect(admin)?;
        server.execute(&Sql::raw(format!("CREATE DATABASE {name}")))?;
    }
    Ok(url)
}

/// `bronze.orders`: `rows` orders spread evenly over `days` days from 2026-10-19.
fn bronze_orders(rows: u64, days: u64) -> String {
    format!(
        "CREATE TABLE bronze.orders AS SELECT i AS order_id, (i * 7) % 100003 AS customer_id,
  CAST(((i * 7919) % 1000000) / 100.0 AS NUMERIC(12,2)) AS order_total,
  (ARRAY['EUR', 'USD', 'GBP'])[(i % 3) + 1] AS currency,
  CAST(DATE '2026-10-19' + CAST(i / {per_day} AS INTEGER) AS TIMESTAMP) + make_interval(secs => (i * 37) % 86400) AS updated_at,
  DATE '2026-10-19' + CAST(i / {per_day} AS INTEGER) AS dt
  FROM generate_series(CAST(0 AS BIGINT), {last}) AS t(i);",
        per_day = rows / days,
        last = rows - 1
    )
}

/// The benchmark database, built once (a row in bench.meta remembers its shape).
fn setup(admin: &str, rows: u64, days: u64) -> Result<String, Error> {
    let url = with_database(admin, DATABASE);
    let shape = format!("{rows} {days} v1");
    if let Ok(mut db) = Postgres::connect(&url) {
        let mut sql = Sql::new();
        sql.push("SELECT count(*) FROM bench.meta WHERE shape = ").typed_param(Value::Text(shape.clone()), "TEXT");
        if db.query(&sql).ok().and_then(|r| r.rows.first().and_then(|r| r[0].as_u64())) == Some(1) {
            return Ok(url);
        }
    }
    eprintln!("bench: building database {DATABASE} ({rows} rows over {days} days)…");
    let mut server = Postgres::connect(admin)?;
    server.execute(&Sql::raw(format!("DROP DATABASE IF EXISTS {DATABASE} WITH (FORCE)")))?;
    server.execute(&Sql::raw(format!("CREATE DATABASE {DATABASE}")))?;
    let mut db = Postgres::connect(&url)?;
    let mut partitions = String::new();
    for d in 0..days {
        let day = chrono::NaiveDate::from_ymd_opt(2026, 10, 19).expect("date") + chrono::Duration::days(d as i64);
        partitions.push_str(&format!(
            "CREATE TABLE silver.orders_part_{} PARTITION OF silver.orders_part FOR VALUES IN ('{}');\n",
            day.format("%Y%m%d"),
            day.format("%Y-%m-%d")
        ));
    }
    exec(
        &mut db,
        &format!(
            "CREATE SCHEMA bronze;
CREATE SCHEMA silver;
CREATE SCHEMA staging;
CREATE SCHEMA bench;
{bronze}
CREATE TABLE silver.orders AS SELECT * FROM bronze.orders;
CREATE TABLE silver.orders_part (LIKE bronze.orders) PARTITION BY LIST (dt);
{partitions}INSERT INTO silver.orders_part SELECT * FROM bronze.orders;
CREATE TABLE silver.orders_m AS SELECT * FROM bronze.orders;
ALTER TABLE silver.orders_m ADD PRIMARY KEY (order_id);
CREATE TABLE bench.meta (shape TEXT);
INSERT INTO bench.meta VALUES ('{shape}')",
            bronze = bronze_orders(rows, days)
        ),
    )?;
    db.execute(&Sql::raw("VACUUM ANALYZE"))?;
    Ok(url)
}

/// A batch of changes, newer than everything in silver.orders_m: `changes`
/// rows over keys of the last days, 1 in 10 keys twice (the second older).
fn new_batch(url: &str, changes: u64) -> Result<(), Error> {
    let mut db = Postgres::connect(url)?;
    let distinct = changes * 9 / 10;
    exec(
        &mut db,
        &format!(
            "DROP TABLE IF EXISTS staging.changes;
CREATE TABLE staging.changes AS
WITH picked AS (
  SELECT * FROM silver.orders_m WHERE dt >= (SELECT max(dt) - 2 FROM silver.orders_m) AND order_id % 10 = 3
  ORDER BY order_id LIMIT {distinct})
SELECT order_id, customer_id, order_total + 1 AS order_total, currency, updated_at + INTERVAL '1 hour' AS updated_at, dt FROM picked
UNION ALL
SELECT order_id, customer_id, order_total + 2, currency, updated_at + INTERVAL '30 minutes', dt FROM picked WHERE order_id % 100 = 3;
ANALYZE staging.changes"
        ),
    )
}

/// The hand-written SQL on PostgreSQL (the `fixpoint-bench sql --pg` child).
pub fn run_sql(url: &str, table: &str, d: RunDate, merge: bool, exchange: bool) -> Result<(), Error> {
    let table = fixpoint_core::TableName::parse(table)?;
    let mut db = Postgres::connect(url)?;
    let start = Instant::now();
    db.execute(&Sql::raw("BEGIN"))?;
    let n = if merge {
        db.execute(&Sql::raw(HAND_MERGE.replace("silver.orders", &table.quoted())))?
    } else if exchange {
        // The day's table (its CHECK lets ATTACH skip the validation scan),
        // filled, then swapped with the day's partition, which keeps its name.
        let day = d.date();
        let part = fixpoint_core::TableName { schema: table.schema.clone(), table: format!("{}_{}", table.table, day.format("%Y%m%d")) };
        let new = fixpoint_core::TableName { schema: table.schema.clone(), table: format!("{}_{}_hand", table.table, day.format("%Y%m%d")) };
        let lit = day.format("%Y-%m-%d");
        db.execute(&Sql::raw(format!("CREATE TABLE {} (LIKE {}, CONSTRAINT hand_day CHECK (dt IS NOT NULL AND dt = DATE '{lit}'))", new.quoted(), table.quoted())))?;
        let mut ins = Sql::new();
        ins.push("INSERT INTO ").push(&new.quoted()).push(&format!(" SELECT {COLUMNS} FROM bronze.orders WHERE dt = "));
        ins.typed_param(Value::Date(day), "DATE");
        let n = db.execute(&ins)?;
        db.execute(&Sql::raw(format!("ALTER TABLE {} DETACH PARTITION {}", table.quoted(), part.quoted())))?;
        db.execute(&Sql::raw(format!("DROP TABLE {}", part.quoted())))?;
        db.execute(&Sql::raw(format!("ALTER TABLE {} ATTACH PARTITION {} FOR VALUES IN ('{lit}')", table.quoted(), new.quoted())))?;
        db.execute(&Sql::raw(format!("ALTER TABLE {} RENAME TO {}", new.quoted(), fixpoint_core::job::ident::quote_ident(&part.table))))?;
        n
    } else {
        let mut del = Sql::new();
        del.push("DELETE FROM ").push(&table.quoted()).push(" WHERE dt = ").typed_param(Value::Date(d.date()), "DATE");
        db.execute(&del)?;
        let mut ins = Sql::new();
        ins.push("INSERT INTO ").push(&table.quoted()).push(&format!(" SELECT {COLUMNS} FROM bronze.orders WHERE dt = "));
        ins.typed_param(Value::Date(d.date()), "DATE");
        db.execute(&ins)?
    };
    db.execute(&Sql::raw("COMMIT"))?;
    println!("{}", json!({"elapsed_ms": start.elapsed().as_secs_f64() * 1000.0, "rows": n}));
    Ok(())
}

/// The rows of `from` (a table or a parenthesized query, alias `d`), as a
/// count and a sum of PostgreSQL's `hashtextextended` over each row's text:
/// the result checks' digest, by another path than fixpoint's fingerprints.
fn digest(url: &str, from: &str) -> Result<String, Error> {
    let mut db = Postgres::connect(url)?;
    let sql = format!("SELECT count(*) || ':' || coalesce(sum(hashtextextended(CAST(ROW({COLUMNS}) AS TEXT), 0)), 0) FROM {from}");
    let rows = db.query(&Sql::raw(sql))?;
    Ok(rows.rows.first().and_then(|r| r.first()).map(|v| v.display()).unwrap_or_default())
}

/// Checks that `side` left `table`'s day holding exactly the source's day.
fn check_day(url: &str, side: &str, table: &str, date: &str) -> Result<(), Error> {
    let got = digest(url, &format!("{table} AS d WHERE dt = DATE '{date}'"))?;
    let want = digest(url, &format!("bronze.orders AS d WHERE dt = DATE '{date}'"))?;
    if got != want {
        return Err(Error::Internal(format!("the benchmark's sides disagree: after {side}, {table}'s day digests as {got} and the source's as {want}; no ratio is printed")));
    }
    Ok(())
}

pub fn run(admin: &str, rows: u64, days: u64, changes: u64, rounds: u32, dir: &Path, out: &Output) -> Result<(), Error> {
    let (rows, days, changes) =
        if rows == 20_000_000 && days == 4 { (5_000_000, 5, if changes == 200_000 { 100_000 } else { changes }) } else { (rows, days, changes) };
    let url = setup(admin, rows, days)?;
    let write_job = |name: &str, body: &str| -> Result<String, Error> {
        let path = dir.join(format!("{name}.toml"));
        std::fs::write(&path, format!("name = \"{name}\"\n{body}")).map_err(|source| Error::Io { path: path.clone(), source })?;
        Ok(path.display().to_string())
    };
    let source = format!("[source]\nsql = \"SELECT {COLUMNS} FROM bronze.orders WHERE dt = :run_date\"\n");
    let plain = write_job("bench_pg_plain", &format!("target = \"silver.orders\"\nstrategy = \"replace_partition\"\npartition = \"dt\"\n{source}"))?;
    let part = write_job("bench_pg_part", &format!("target = \"silver.orders_part\"\nstrategy = \"replace_partition\"\npartition = \"dt\"\n{source}"))?;
    let merge = write_job(
        "bench_pg_merge",
        &format!("target = \"silver.orders_m\"\nstrategy = \"merge\"\nkey = [\"order_id\"]\nversion = \"updated_at\"\npartition = \"dt\"\n[source]\nsql = \"SELECT {COLUMNS} FROM staging.changes\"\n"),
    )?;
    let date = "2026-10-20";
    let exe = std::env::current_exe().map_err(|source| Error::Io { path: "fixpoint".into(), source })?;
    let fixpoint = |job: &str| {
        let mut c = crate::fixpoint_command();
        c.args(["run", job, "--date", date, "--db", &url, "--force", "--output", "json"]);
        c
    };
    // A retry over the same input: no --force, so it may skip.
    let retry = |job: &str| {
        let mut c = crate::fixpoint_command();
        c.args(["run", job, "--date", date, "--db", &url, "--output", "json"]);
        c
    };
    let hand = |table: &str, merge: bool| {
        let mut c = Command::new(&exe);
        c.args(["sql", "--pg", &url, "--table", table, "--date", date, "--file", "-"]);
        if merge {
            c.arg("--merge");
        }
        c
    };
    let hand_exchange = || {
        let mut c = hand("silver.orders_part", false);
        c.arg("--exchange");
        c
    };
    let vacuum = || -> Result<(), Error> {
        let mut db = Postgres::connect(&url)?;
        db.execute(&Sql::raw("VACUUM ANALYZE silver.orders"))?;
        db.execute(&Sql::raw("VACUUM ANALYZE silver.orders_part"))?;
        Ok(())
    };
    // Warm-up: one of each (creates the ledger, warms the caches).
    measure(&mut fixpoint(&plain))?;
    measure(&mut fixpoint(&part))?;
    measure(&mut hand("silver.orders", false))?;
    let mut sides: [Vec<Sample>; 5] = Default::default();
    let mut skips: [Vec<Sample>; 2] = Default::default();
    let mut replaced = 0;
    for round in 0..rounds {
        eprintln!("bench: replace round {}/{rounds}", round + 1);
        let order: [usize; 5] = if round % 2 == 0 { [0, 1, 2, 3, 4] } else { [4, 3, 2, 1, 0] };
        for side in order {
            // Each load leaves the table's pages laid out one of two ways
            // (the day's rows at the end, or in the space the one before
            // freed), and a load from one is slower than from the other:
            // an untimed load between two measured ones starts each from
            // the same layout.
            let table = if side < 2 { "silver.orders" } else { "silver.orders_part" };
            vacuum()?;
            measure(&mut hand(table, false))?;
            vacuum()?;
            let (s, v) = match side {
                0 => measure(&mut hand("silver.orders", false))?,
                1 => measure(&mut fixpoint(&plain))?,
                2 => measure(&mut fixpoint(&part))?,
                3 => measure(&mut hand("silver.orders_part", false))?,
                _ => measure(&mut hand_exchange())?,
            };
            if side == 2 {
                replaced = v["rows_inserted"].as_u64().unwrap_or(0);
                if v["method"] != "partition exchange" {
                    return Err(Error::Internal(format!("the partitioned target was not swapped: {v}")));
                }
            }
            let (name, table) = [
                ("the hand-written SQL (plain table)", "silver.orders"),
                ("fixpoint's delete+insert", "silver.orders"),
                ("fixpoint's partition exchange", "silver.orders_part"),
                ("the hand-written SQL (partitioned table)", "silver.orders_part"),
                ("the hand-written partition exchange", "silver.orders_part"),
            ][side];
            check_day(&url, name, table, date)?;
            sides[side].push(s);
            // The retry right after fixpoint's run: skipped by its run key
            // and the day's output fingerprint.
            if side == 1 || side == 2 {
                let (s, v) = measure(&mut retry(if side == 1 { &plain } else { &part }))?;
                if v["outcome"] != "skipped" {
                    return Err(Error::Internal(format!("the retry was not skipped: {v}")));
                }
                check_day(&url, "fixpoint's skipped retry", table, date)?;
                skips[side - 1].push(s);
            }
        }
    }
    let (mut fm, mut hm) = (Vec::new(), Vec::new());
    let mut last = serde_json::Value::Null;
    new_batch(&url, changes)?;
    measure(&mut fixpoint(&merge))?;
    // One batch merged by each side into its own copy of the table: the
    // two tables must then be equal.
    {
        new_batch(&url, changes)?;
        let mut db = Postgres::connect(&url)?;
        exec(&mut db, "DROP TABLE IF EXISTS silver.orders_check;\nCREATE TABLE silver.orders_check AS SELECT * FROM silver.orders_m;\nALTER TABLE silver.orders_check ADD PRIMARY KEY (order_id);\nANALYZE silver.orders_check")?;
        measure(&mut fixpoint(&merge))?;
        measure(&mut hand("silver.orders_check", true))?;
        let (fx, hw) = (digest(&url, "silver.orders_m AS d")?, digest(&url, "silver.orders_check AS d")?);
        db.execute(&Sql::raw("DROP TABLE silver.orders_check"))?;
        if fx != hw {
            return Err(Error::Internal(format!("the benchmark's sides disagree on one batch merged into one table: fixpoint {fx}, hand-written {hw}; no ratio is printed")));
        }
        eprintln!("bench: one batch merged by each side gives the same table ({fx})");
    }
    // Every batch has the same keys (newer versions each time): each side
    // must change as many rows.
    let mut counts = std::collections::BTreeSet::new();
    for round in 0..rounds {
        eprintln!("bench: merge round {}/{rounds}", round + 1);
        let order = if round % 2 == 0 { [true, false] } else { [false, true] };
        for fx in order {
            new_batch(&url, changes)?;
            if fx {
                let (s, v) = measure(&mut fixpoint(&merge))?;
                counts.insert(v["rows_updated"].as_u64().unwrap_or(0) + v["rows_inserted"].as_u64().unwrap_or(0));
                last = v;
                fm.push(s);
            } else {
                let (s, v) = measure(&mut hand("silver.orders_m", true))?;
                counts.insert(v["rows"].as_u64().unwrap_or(u64::MAX));
                hm.push(s);
            }
        }
    }
    if counts.len() != 1 {
        return Err(Error::Internal(format!("the merge's sides changed different numbers of rows: {counts:?}; no ratio is printed")));
    }
    let med = |v: &[Sample]| median(v.iter().map(|s| s.inner).collect());
    let wall = |v: &[Sample]| median(v.iter().map(|s| s.wall).collect());
    let rss = |v: &[Sample]| v.iter().map(|s| s.rss_mb).fold(0.0, f64::max);
    let [hw, fx_plain, fx_part, hw_part, hw_swap] = &sides;
    let version = Postgres::connect(&url)?.version()?;
    let result = json!({
        "server": version, "rows_in_table": rows, "rows_replaced": replaced, "rounds": rounds, "merge_batch_rows": changes,
        "hand_written_delete_insert_s": med(hw), "fixpoint_delete_insert_s": med(fx_plain),
        "fixpoint_partition_exchange_s": med(fx_part), "hand_written_delete_insert_partitioned_s": med(hw_part),
        "ratio_delete_insert": med(fx_plain) / med(hw), "ratio_exchange": med(fx_part) / med(hw_part),
        "ratio_exchange_over_plain_hand_written": med(fx_part) / med(hw), "results_checked": true,
        "hand_written_exchange_s": med(hw_swap), "ratio_exchange_over_hand_exchange": med(fx_part) / med(hw_swap),
        "retry_skipped_plain_s": med(&skips[0]), "retry_skipped_partitioned_s": med(&skips[1]),
        "ratio_retry_plain": med(&skips[0]) / med(hw), "ratio_retry_partitioned": med(&skips[1]) / med(hw_part),
        "process_s": {"hand": wall(hw), "fixpoint_delete_insert": wall(fx_plain), "fixpoint_exchange": wall(fx_part), "hand_partitioned": wall(hw_part), "hand_exchange": wall(hw_swap)},
        "peak_rss_mb": {"hand": rss(hw), "fixpoint_delete_insert": rss(fx_plain), "fixpoint_exchange": rss(fx_part), "hand_partitioned": rss(hw_part), "hand_exchange": rss(hw_swap)},
        "hand_written_merge_s": med(&hm), "fixpoint_merge_s": med(&fm), "ratio_merge": med(&fm) / med(&hm),
        "merge_peak_rss_mb": {"hand": rss(&hm), "fixpoint": rss(&fm)},
        "last_merge_report": last,
    });
    if out.is_json() {
        out.json(&result);
    } else {
        println!("{version}: replace one {replaced}-row day of a {rows}-row table, median of {rounds} alternating rounds (before each side, not timed: VACUUM ANALYZE, a hand-written load, VACUUM ANALYZE)");
        println!("| side | load (s) | process (s) | client peak RSS (MiB) |");
        println!("|---|---|---|---|");
        println!("| hand-written BEGIN; DELETE; INSERT … SELECT; COMMIT (plain table) | {:.3} | {:.3} | {:.0} |", med(hw), wall(hw), rss(hw));
        println!("| fixpoint run --force, delete+insert (plain table) | {:.3} | {:.3} | {:.0} |", med(fx_plain), wall(fx_plain), rss(fx_plain));
        println!("| fixpoint run --force, partition exchange (LIST-partitioned table) | {:.3} | {:.3} | {:.0} |", med(fx_part), wall(fx_part), rss(fx_part));
        println!("| hand-written DELETE + INSERT on the partitioned table | {:.3} | {:.3} | {:.0} |", med(hw_part), wall(hw_part), rss(hw_part));
        println!("| hand-written partition exchange (build the day's table, detach, drop, attach) | {:.3} | {:.3} | {:.0} |", med(hw_swap), wall(hw_swap), rss(hw_swap));
        println!("| fixpoint retry, skipped (plain table) | {:.3} | {:.3} | {:.0} |", med(&skips[0]), wall(&skips[0]), rss(&skips[0]));
        println!("| fixpoint retry, skipped (partitioned table) | {:.3} | {:.3} | {:.0} |", med(&skips[1]), wall(&skips[1]), rss(&skips[1]));
        println!(
            "retry skipped / hand-written rewrite of the day: {:.3} (plain), {:.3} (partitioned)",
            med(&skips[0]) / med(hw),
            med(&skips[1]) / med(hw_part)
        );
        println!(
            "ratio fixpoint / hand-written on the same table: {:.3} (delete+insert, plain), {:.3} (partition exchange against the hand-written exchange), {:.3} (against the hand-written delete+insert, partitioned); exchange / plain hand-written: {:.3}",
            med(fx_plain) / med(hw),
            med(fx_part) / med(hw_swap),
            med(fx_part) / med(hw_part),
            med(fx_part) / med(hw)
        );
        println!("merge {changes} changed rows (1 in 10 keys twice) into the {rows}-row table (primary key on order_id):");
        println!("| side | merge (s) | client peak RSS (MiB) |");
        println!("|---|---|---|");
        println!("| hand-written ROW_NUMBER dedup + guarded MERGE | {:.3} | {:.0} |", med(&hm), rss(&hm));
        println!("| fixpoint run (merge) | {:.3} | {:.0} |", med(&fm), rss(&fm));
        println!("ratio fixpoint / hand-written: {:.3}", med(&fm) / med(&hm));
    }
    Ok(())
}

/// A backfill of `days` days into an empty table, sequential and with
/// `--parallel 2`, then the same backfill again (every date skipped).
pub fn run_backfill(admin: &str, rows: u64, days: u64, rounds: u32, dir: &Path, out: &Output) -> Result<(), Error> {
    let url = with_database(admin, "fixpoint_bench_backfill");
    let shape = format!("{rows} {days} v1");
    let ready = Postgres::connect(&url).ok().and_then(|mut db| {
        let mut sql = Sql::new();
        sql.push("SELECT count(*) FROM bench.meta WHERE shape = ").typed_param(Value::Text(shape.clone()), "TEXT");
        db.query(&sql).ok().and_then(|r| r.rows.first().and_then(|r| r[0].as_u64()))
    }) == Some(1);
    if !ready {
        eprintln!("bench: building database fixpoint_bench_backfill ({rows} rows over {days} days)…");
        let mut server = Postgres::connect(admin)?;
        server.execute(&Sql::raw("DROP DATABASE IF EXISTS fixpoint_bench_backfill WITH (FORCE)"))?;
        server.execute(&Sql::raw("CREATE DATABASE fixpoint_bench_backfill"))?;
        let mut db = Postgres::connect(&url)?;
        exec(
            &mut db,
            &format!(
                "CREATE SCHEMA bronze;
CREATE SCHEMA bench;
{bronze}
CREATE INDEX orders_by_day ON bronze.orders (dt);
CREATE TABLE bench.meta (shape TEXT);
INSERT INTO bench.meta VALUES ('{shape}')",
                bronze = bronze_orders(rows, days)
            ),
        )?;
        db.execute(&Sql::raw("VACUUM ANALYZE"))?;
    }
    let job = dir.join("bench_pg_backfill.toml");
    std::fs::write(
        &job,
        format!("name = \"bench_pg_backfill\"\ntarget = \"silver.orders\"\nstrategy = \"replace_partition\"\npartition = \"dt\"\n\n[source]\nsql = \"SELECT {COLUMNS} FROM bronze.orders WHERE dt = :run_date\"\n"),
    )
    .map_err(|source| Error::Io { path: job.clone(), source })?;
    let to = (chrono::NaiveDate::from_ymd_opt(2026, 10, 19).expect("date") + chrono::Duration::days(days as i64 - 1)).format("%Y-%m-%d").to_string();
    let empty = || -> Result<(), Error> {
        let mut db = Postgres::connect(&url)?;
        db.execute(&Sql::raw("DROP SCHEMA IF EXISTS silver CASCADE"))?;
        db.execute(&Sql::raw("DROP SCHEMA IF EXISTS fixpoint CASCADE"))?;
        db.execute(&Sql::raw("CREATE SCHEMA silver"))?;
        db.execute(&Sql::raw(&format!("CREATE TABLE silver.orders AS SELECT {COLUMNS} FROM bronze.orders WHERE false")))?;
        Ok(())
    };
    let timed = |extra: &[&str]| -> Result<Sample, Error> {
        let mut c = crate::fixpoint_command();
        c.args(["backfill", &job.display().to_string(), "--from", "2026-10-19", "--to", &to, "--db", &url, "--output", "json"]).args(extra);
        let start = Instant::now();
        let (mut s, _) = measure(&mut c)?;
        s.inner = start.elapsed().as_secs_f64();
        Ok(s)
    };
    let (mut seq, mut par, mut rerun) = (Vec::new(), Vec::new(), Vec::new());
    for round in 0..rounds {
        eprintln!("bench: round {}/{rounds}", round + 1);
        empty()?;
        seq.push(timed(&[])?);
        rerun.push(timed(&[])?);
        empty()?;
        par.push(timed(&["--parallel", "2"])?);
    }
    // One day's forced load, and the floor of a re-run that proves every date
    // done: every day's source read once and every partition once (one grouped
    // scan), hand-written with fixpoint's native row hash, on one connection.
    let mut one = Vec::new();
    let mut floor = Vec::new();
    for _ in 0..rounds {
        let mut c = crate::fixpoint_command();
        c.args(["run", &job.display().to_string(), "--date", "2026-10-20", "--force", "--db", &url, "--output", "json"]);
        let start = Instant::now();
        let (mut s, _) = measure(&mut c)?;
        s.inner = start.elapsed().as_secs_f64();
        one.push(s);
        let mut db = Postgres::connect(&url)?;
        let start = Instant::now();
        let mut n = 0;
        for day in 0..days as i64 {
            let d = chrono::NaiveDate::from_ymd_opt(2026, 10, 19).expect("date") + chrono::Duration::days(day);
            let mut sql = Sql::new();
            sql.push(&format!("SELECT count(*), sum(hashtextextended(CAST(ROW({COLUMNS}) AS TEXT), 0)) FROM bronze.orders WHERE dt = "));
            sql.typed_param(Value::Date(d), "DATE");
            n += db.query(&sql)?.rows[0][0].as_u64().unwrap_or(0);
        }
        let groups = db
            .query(&Sql::raw(format!("SELECT dt, count(*), sum(hashtextextended(CAST(ROW({COLUMNS}) AS TEXT), 0)) FROM silver.orders GROUP BY dt")))?
            .rows
            .len();
        floor.push(start.elapsed().as_secs_f64());
        if n != rows || groups != days as usize {
            return Err(Error::Internal(format!("the floor read {n} source rows and {groups} days")));
        }
    }
    let med = |v: &[Sample]| median(v.iter().map(|s| s.inner).collect());
    let floor = median(floor);
    let result = json!({"rows": rows, "days": days, "rounds": rounds, "sequential_s": med(&seq), "parallel_2_s": med(&par), "rerun_all_skipped_s": med(&rerun),
        "one_day_forced_s": med(&one), "floor_s": floor, "rerun_over_one_day": med(&rerun) / med(&one), "rerun_over_floor": med(&rerun) / floor});
    if out.is_json() {
        out.json(&result);
    } else {
        println!("postgres: backfill {days} days × {} rows into an empty table (index on bronze.orders(dt)), median of {rounds} rounds (whole process)", rows / days);
        println!("| run | time (s) |");
        println!("|---|---|");
        println!("| backfill, sequential | {:.1} |", med(&seq));
        println!("| backfill --parallel 2 | {:.1} |", med(&par));
        println!("| the same backfill again (every date skipped) | {:.1} |", med(&rerun));
        println!("| one day's load, forced | {:.1} |", med(&one));
        println!("| the floor: every day's source and partition read once, hand-written | {floor:.1} |");
        println!("re-run of a completed backfill / one day's load: {:.2}; / the floor: {:.2}", med(&rerun) / med(&one), med(&rerun) / floor);
    }
    Ok(())
}
