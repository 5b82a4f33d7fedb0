//! `fixpoint-bench --strategy files`: file sources. The input fingerprint's
//! hashing throughput against `cat FILES > /dev/null` (the page-cache limit),
//! and one day of Parquet files loaded by fixpoint against the hand-written
//! load on the same engine: on DuckDB `BEGIN; DELETE; INSERT … SELECT FROM
//! read_parquet(…); COMMIT`, on PostgreSQL `BEGIN; DELETE; COPY … (FORMAT
//! binary) FROM the same reader; COMMIT`. Each load runs in its own process,
//! alternating (wall time, in-process time, peak RSS).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use fixpoint_core::job::files::{FileFormat, FileSource, InputFile, InputFiles};
use fixpoint_core::{Engine, Error, RunDate, Sql, TableName};
use fixpoint_duckdb::DuckDb;
use serde_json::json;

use crate::bench::{measure, median, Sample};
use crate::Output;

const DAY: &str = "2026-10-20";
const FILES: u64 = 4;
const PATTERN: &str = "bronze/orders/dt={run_date}/*.parquet";

fn db_err(context: &str) -> impl FnOnce(duckdb::Error) -> Error + '_ {
    move |e| fixpoint_duckdb::database_error(context.to_owned(), e)
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> Error + '_ {
    move |source| Error::Io { path: path.to_owned(), source }
}

/// The day's folder of `FILES` Parquet files with `rows` rows in all, and
/// a DuckDB file whose silver.orders holds that day and three others.
fn setup(dir: &Path, rows: u64) -> Result<(), Error> {
    let marker = dir.join("files.rows");
    let want = format!("{rows} v1");
    if std::fs::read_to_string(&marker).ok().as_deref() == Some(want.as_str()) {
        return Ok(());
    }
    eprintln!("bench: writing {FILES} Parquet files ({rows} rows) and the target…");
    let day_dir = dir.join(format!("bronze/orders/dt={DAY}"));
    let _ = std::fs::remove_dir_all(dir.join("bronze"));
    std::fs::create_dir_all(&day_dir).map_err(io(&day_dir))?;
    let file = dir.join("files.duckdb");
    for p in [file.clone(), file.with_extension("duckdb.wal")] {
        let _ = std::fs::remove_file(p);
    }
    let db = DuckDb::open(&file, Duration::from_secs(10))?;
    let per_file = rows / FILES;
    let mut script = String::new();
    for f in 0..FILES {
        // Benchmark fixture: the path is ours, not a user's.
        script.push_str(&format!(
            "COPY (SELECT i AS order_id, (i * 7) % 100003 AS customer_id,
                    CAST(((i * 7919) % 1000000) / 100.0 AS DECIMAL(12,2)) AS order_total,
                    ['EUR', 'USD', 'GBP'][(i % 3) + 1] AS currency,
                    TIMESTAMP '{DAY}' + to_seconds((i * 37) % 86400) AS updated_at
             FROM range({lo}, {hi}) AS t(i)) TO '{path}' (FORMAT parquet);\n",
            lo = f * per_file,
            hi = (f + 1) * per_file,
            path = day_dir.join(format!("part-{f}.parquet")).display()
        ));
    }
    script.push_str(&format!(
        "CREATE SCHEMA silver;
         CREATE TABLE silver.orders AS
         SELECT i AS order_id, (i * 7) % 100003 AS customer_id,
                CAST(((i * 7919) % 1000000) / 100.0 AS DECIMAL(12,2)) AS order_total,
                ['EUR', 'USD', 'GBP'][(i % 3) + 1] AS currency,
                CAST(DATE '2026-10-19' + CAST(i // {rows} AS INTEGER) AS TIMESTAMP) + to_seconds((i * 37) % 86400) AS updated_at,
                DATE '2026-10-19' + CAST(i // {rows} AS INTEGER) AS dt
         FROM range(0, {all}) AS t(i);
         CHECKPOINT;",
        all = rows * 4
    ));
    db.connection().execute_batch(&script).map_err(db_err("writing the benchmark files"))?;
    std::fs::write(&marker, want).map_err(io(&marker))?;
    Ok(())
}

/// The day's files, listed without hashing (the hand-written side does not hash).
fn listed(dir: &Path) -> Result<InputFiles, Error> {
    let base = dir.join(format!("bronze/orders/dt={DAY}"));
    let mut files = Vec::new();
    for f in 0..FILES {
        let name = format!("part-{f}.parquet");
        let size = std::fs::metadata(base.join(&name)).map_err(io(&base))?.len();
        files.push(InputFile { path: name, size, blake3: String::new(), etag: None });
    }
    Ok(InputFiles { checksum: String::new(), files, base, format: FileFormat::Parquet, origin: Default::default() })
}

/// The hand-written load of the day's files (`fixpoint-bench sql --files DIR`).
pub fn run_sql(files_dir: &Path, file: Option<&Path>, pg: Option<&str>) -> Result<(), Error> {
    let d = RunDate::parse(DAY)?;
    let files = listed(files_dir)?;
    let start = Instant::now();
    let n = if let Some(url) = pg {
        let mut db = fixpoint_postgres::Postgres::connect(url)?;
        db.execute(&Sql::raw("BEGIN"))?;
        let mut del = Sql::new();
        del.push("DELETE FROM silver.orders WHERE dt = ").typed_param(fixpoint_core::Value::Date(d.date()), "DATE");
        db.execute(&del)?;
        let n = db.copy_files_into(&files, &TableName::parse("silver.orders")?)?;
        db.execute(&Sql::raw("COMMIT"))?;
        n
    } else {
        let file = file.ok_or_else(|| Error::argument("--files needs --file or --pg", None))?;
        let db = DuckDb::open(file, Duration::from_secs(60))?;
        let conn = db.connection();
        let glob = files.base.join("*.parquet");
        conn.execute_batch("BEGIN").map_err(db_err("BEGIN"))?;
        conn.execute("DELETE FROM silver.orders WHERE dt = CAST($1 AS DATE)", [DAY]).map_err(db_err("DELETE"))?;
        // Hand-written, as a user would: the path in the SQL text.
        let n = conn
            .execute(&format!("INSERT INTO silver.orders SELECT * FROM read_parquet('{}', hive_partitioning = true)", glob.display()), [])
            .map_err(db_err("INSERT"))?;
        conn.execute_batch("COMMIT").map_err(db_err("COMMIT"))?;
        n as u64
    };
    println!("{}", json!({"elapsed_ms": start.elapsed().as_secs_f64() * 1000.0, "rows_inserted": n}));
    Ok(())
}

/// A PostgreSQL database `fixpoint_bench_files` with silver.orders holding
/// the day and one other (built once).
fn setup_pg(admin: &str, duck: &Path, rows: u64) -> Result<String, Error> {
    use fixpoint_postgres::Postgres;
    let name = "fixpoint_bench_files";
    let scheme_end = admin.find("://").map_or(0, |i| i + 3);
    let base = match admin[scheme_end..].find('/') {
        Some(i) => &admin[..scheme_end + i],
        None => admin,
    };
    let url = format!("{base}/{name}");
    let shape = format!("{rows} v1");
    if let Ok(mut db) = Postgres::connect(&url) {
        let mut sql = Sql::new();
        sql.push("SELECT count(*) FROM bench.meta WHERE shape = ").typed_param(fixpoint_core::Value::Text(shape.clone()), "TEXT");
        if db.query(&sql).ok().and_then(|r| r.rows.first().and_then(|r| r[0].as_u64())) == Some(1) {
            return Ok(url);
        }
    }
    eprintln!("bench: building PostgreSQL database {name}…");
    let mut server = Postgres::connect(admin)?;
    server.execute(&Sql::raw(format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)")))?;
    server.execute(&Sql::raw(format!("CREATE DATABASE {name}")))?;
    let mut db = Postgres::connect(&url)?;
    for stmt in [
        "CREATE SCHEMA silver",
        "CREATE SCHEMA bench",
        "CREATE TABLE bench.meta (shape TEXT)",
        "CREATE TABLE silver.orders (order_id BIGINT, customer_id BIGINT, order_total NUMERIC(12,2), currency TEXT, updated_at TIMESTAMP, dt DATE)",
    ] {
        db.execute(&Sql::raw(stmt))?;
    }
    // The day itself and the day before, through the same COPY path.
    let files = listed(&duck.parent().expect("dir").to_path_buf())?;
    let t = TableName::parse("silver.orders")?;
    db.copy_files_into(&files, &t)?;
    db.execute(&Sql::raw("INSERT INTO silver.orders SELECT order_id, customer_id, order_total, currency, updated_at - INTERVAL '1 day', dt - 1 FROM silver.orders"))?;
    db.execute(&Sql::raw("CREATE INDEX ON silver.orders (dt)"))?;
    db.execute(&Sql::raw("VACUUM ANALYZE silver.orders"))?;
    let mut sql = Sql::new();
    sql.push("INSERT INTO bench.meta VALUES (").typed_param(fixpoint_core::Value::Text(shape), "TEXT").push(")");
    db.execute(&sql)?;
    Ok(url)
}

/// A digest of the day's rows: count and sums of the numbers and of the
/// text lengths, the same SQL on DuckDB and PostgreSQL (another path than
/// fixpoint's fingerprints).
const DIGEST: &str = "SELECT CAST(count(*) AS VARCHAR) || ':' || CAST(sum(order_id) AS VARCHAR) || ':' || CAST(sum(customer_id) AS VARCHAR) \
    || ':' || CAST(sum(order_total) AS VARCHAR) || ':' || CAST(sum(length(currency)) AS VARCHAR) AS d FROM ";

/// The digest of the day's files, read by an in-memory DuckDB.
fn files_digest(dir: &Path) -> Result<String, Error> {
    let files = listed(dir)?;
    let duck = DuckDb::open_in_memory()?;
    let glob = files.base.join("*.parquet");
    let sql = format!("{DIGEST}read_parquet('{}')", glob.display());
    duck.connection().query_row(&sql, [], |r| r.get::<_, String>(0)).map_err(db_err("the files' digest"))
}

/// The digest of the day in `silver.orders` on `url` (a DuckDB file or PostgreSQL).
fn day_digest(url: &str) -> Result<String, Error> {
    let table = format!("silver.orders WHERE dt = DATE '{DAY}'");
    match url.strip_prefix("duckdb:") {
        Some(file) => {
            let duck = DuckDb::open(Path::new(file), Duration::from_secs(60))?;
            duck.connection().query_row(&format!("{DIGEST}{table}"), [], |r| r.get::<_, String>(0)).map_err(db_err("the day's digest"))
        }
        None => crate::bench_pg::value(url, &format!("{DIGEST}{table}")).map(|v| v.trim_matches('"').to_owned()),
    }
}

fn summary(v: &[Sample]) -> (f64, f64, f64) {
    (median(v.iter().map(|s| s.inner).collect()), median(v.iter().map(|s| s.wall).collect()), v.iter().map(|s| s.rss_mb).fold(0.0, f64::max))
}

/// Alternating rounds of fixpoint and the hand-written load; medians.
/// `before` runs ahead of every measured command (PostgreSQL: VACUUM, so
/// neither side pays for the dead rows of the one before).
fn alternate(
    rounds: u32,
    fixpoint: &dyn Fn() -> Command,
    hand: &dyn Fn() -> Command,
    before: &dyn Fn() -> Result<(), Error>,
    check: &dyn Fn(&str) -> Result<(), Error>,
) -> Result<(Vec<Sample>, Vec<Sample>, u64), Error> {
    let run = |c: &dyn Fn() -> Command| -> Result<(Sample, serde_json::Value), Error> {
        before()?;
        let r = measure(&mut c())?;
        check(if r.1.get("outcome").is_some() { "fixpoint" } else { "the hand-written load" })?;
        Ok(r)
    };
    run(fixpoint)?;
    run(hand)?;
    let (mut fx, mut hw) = (Vec::new(), Vec::new());
    let mut rows = 0;
    for round in 0..rounds {
        eprintln!("bench: round {}/{rounds}", round + 1);
        if round % 2 == 0 {
            let (s, v) = run(fixpoint)?;
            rows = v["rows_inserted"].as_u64().unwrap_or(0);
            fx.push(s);
            hw.push(run(hand)?.0);
        } else {
            hw.push(run(hand)?.0);
            fx.push(run(fixpoint)?.0);
        }
    }
    Ok((fx, hw, rows))
}

pub fn run(rows: u64, rounds: u32, dir: &Path, pg_admin: Option<&str>, out: &Output) -> Result<(), Error> {
    let dir = std::path::absolute(dir).map_err(io(dir))?;
    setup(&dir, rows)?;
    // 1. Hashing throughput against cat (both from the page cache: warmed first).
    let source = FileSource::parse(PATTERN, None, false, None, dir.clone()).map_err(|(k, m)| Error::Internal(format!("{k}: {m}")))?;
    let day = RunDate::parse(DAY)?;
    let listed_files = listed(&dir)?;
    let paths: Vec<PathBuf> = listed_files.paths();
    let bytes: u64 = listed_files.files.iter().map(|f| f.size).sum();
    let cat = || -> Result<f64, Error> {
        let start = Instant::now();
        let status = Command::new("cat").args(&paths).stdout(std::process::Stdio::null()).status().map_err(io(Path::new("cat")))?;
        if !status.success() {
            return Err(Error::Internal("cat failed".into()));
        }
        Ok(start.elapsed().as_secs_f64())
    };
    cat()?;
    let mut hash_s = Vec::new();
    let mut cat_s = Vec::new();
    let mut checksum = String::new();
    for _ in 0..rounds.max(3) {
        let start = Instant::now();
        checksum = source.resolve(day)?.expect("files").checksum;
        hash_s.push(start.elapsed().as_secs_f64());
        cat_s.push(cat()?);
    }
    let (hash_s, cat_s) = (median(hash_s), median(cat_s));
    let gb = bytes as f64 / 1e9;

    // 2. The day into DuckDB.
    let exe = std::env::current_exe().map_err(io(Path::new("fixpoint")))?;
    let duck = dir.join("files.duckdb");
    let job = dir.join("bench_files.toml");
    std::fs::write(
        &job,
        format!("name = \"bench_files\"\ntarget = \"silver.orders\"\nstrategy = \"replace_partition\"\npartition = \"dt\"\nmin_rows = 1\n\n[source]\nfiles = \"{PATTERN}\"\n"),
    )
    .map_err(io(&job))?;
    let run_on = |url: String| {
        let job = job.clone();
        move || {
            let mut c = crate::fixpoint_command();
            c.args(["run", &job.display().to_string(), "--date", DAY, "--db", &url, "--output", "json", "--force"]);
            c
        }
    };
    let hand_on = |pg: Option<String>| {
        let (exe, dir, duck) = (exe.clone(), dir.clone(), duck.clone());
        move || {
            let mut c = Command::new(&exe);
            c.args(["sql", "--date", DAY, "--files", &dir.display().to_string()]);
            match &pg {
                Some(url) => c.args(["--pg", url]),
                None => c.args(["--file", &duck.display().to_string()]),
            };
            c
        }
    };
    // Both sides must leave the day holding exactly the files' rows.
    let want = files_digest(&dir)?;
    let check_on = |url: String| {
        let want = want.clone();
        move |side: &str| -> Result<(), Error> {
            let got = day_digest(&url)?;
            if got != want {
                return Err(Error::Internal(format!("the benchmark's sides disagree: after {side}, the day digests as {got} and the files as {want}; no ratio is printed")));
            }
            Ok(())
        }
    };
    let duck_url = format!("duckdb:{}", duck.display());
    let (fx, hw, loaded) = alternate(rounds, &run_on(duck_url.clone()), &hand_on(None), &|| Ok(()), &check_on(duck_url))?;
    let (dfx, dhw) = (summary(&fx), summary(&hw));

    // 3. The day into PostgreSQL.
    let pg = match pg_admin {
        Some(admin) => {
            let url = setup_pg(admin, &duck, rows)?;
            // Each load leaves the table's pages laid out one of two ways
            // (the day's rows at the end, or in the space the one before
            // freed), and a load is up to 40 % slower from one of them than
            // from the other: an untimed load between two measured ones
            // starts each from the same layout.
            let vacuum_url = url.clone();
            let settle = hand_on(Some(url.clone()));
            let before = move || -> Result<(), Error> {
                let vacuum = || fixpoint_postgres::Postgres::connect(&vacuum_url)?.execute(&Sql::raw("VACUUM silver.orders")).map(|_| ());
                vacuum()?;
                measure(&mut settle())?;
                vacuum()
            };
            let (fx, hw, _) = alternate(rounds, &run_on(url.clone()), &hand_on(Some(url.clone())), &before, &check_on(url))?;
            Some((summary(&fx), summary(&hw)))
        }
        None => None,
    };
    let result = json!({
        "rows": rows, "files": FILES, "bytes": bytes, "rounds": rounds, "checksum": checksum,
        "hash_s": hash_s, "cat_s": cat_s, "hash_gb_per_s": gb / hash_s, "cat_gb_per_s": gb / cat_s,
        "duckdb": {"rows_loaded": loaded, "fixpoint_s": dfx.0, "hand_written_s": dhw.0, "ratio": dfx.0 / dhw.0,
                   "fixpoint_process_s": dfx.1, "hand_written_process_s": dhw.1, "process_ratio": dfx.1 / dhw.1,
                   "fixpoint_peak_rss_mb": dfx.2, "hand_written_peak_rss_mb": dhw.2},
        "postgres": pg.map(|(f, h)| json!({"fixpoint_s": f.0, "hand_written_s": h.0, "ratio": f.0 / h.0,
                   "fixpoint_process_s": f.1, "hand_written_process_s": h.1, "process_ratio": f.1 / h.1,
                   "fixpoint_peak_rss_mb": f.2, "hand_written_peak_rss_mb": h.2})),
    });
    if out.is_json() {
        out.json(&result);
        return Ok(());
    }
    println!("a {rows}-row day in {FILES} Parquet files ({:.1} MB), median of {rounds} rounds", bytes as f64 / 1e6);
    println!("| what | time (s) | throughput |");
    println!("|---|---|---|");
    println!("| cat FILES > /dev/null | {cat_s:.3} | {:.2} GB/s |", gb / cat_s);
    println!("| fixpoint input fingerprint (BLAKE3 of every file) | {hash_s:.3} | {:.2} GB/s |", gb / hash_s);
    println!();
    println!("| load of the day | fixpoint (s) | hand-written (s) | ratio | process ratio | peak RSS fixpoint / hand (MiB) |");
    println!("|---|---|---|---|---|---|");
    println!("| DuckDB: INSERT … SELECT FROM read_parquet | {:.3} | {:.3} | {:.3} | {:.3} | {:.0} / {:.0} |", dfx.0, dhw.0, dfx.0 / dhw.0, dfx.1 / dhw.1, dfx.2, dhw.2);
    if let Some((f, h)) = pg {
        println!("| PostgreSQL: COPY (binary) from the same reader | {:.3} | {:.3} | {:.3} | {:.3} | {:.0} / {:.0} |", f.0, h.0, f.0 / h.0, f.1 / h.1, f.2, h.2);
    }
    Ok(())
}
