//! `fixpoint-bench`: fixpoint against the hand-written SQL on the same DuckDB
//! file, alternating, each side in its own process (wall time, in-process
//! time and peak RSS from wait4).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use clap::Args;
use fixpoint_core::{Error, RunDate};
use fixpoint_duckdb::DuckDb;
use serde_json::json;

use crate::Output;

#[derive(Copy, Clone, PartialEq, Eq, clap::ValueEnum)]
pub enum BenchStrategy {
    ReplacePartition,
    Merge,
    Backfill,
    /// PostgreSQL (`--db`): partition exchange, delete + insert and merge
    /// against the hand-written SQL.
    Postgres,
    /// PostgreSQL (`--db`): a 30-day backfill, sequential and `--parallel 2`,
    /// and its re-run with every date done.
    PostgresBackfill,
    /// A run with `lookback = 7` and nothing changed, against the run for
    /// the day alone (30 days × 1M rows, all loaded).
    Lookback,
    /// A backfill from a file source (a folder of Parquet files per day):
    /// its re-run with every date done, against one day's load.
    BackfillFiles,
    /// File sources: the input fingerprint's hashing throughput against
    /// `cat`, and a day of Parquet files loaded into DuckDB and PostgreSQL
    /// (`--db`; `--db none` skips it) against the hand-written load.
    Files,
    /// Spark (`--db sc://host:port`, feature `spark`): a day replaced and a
    /// batch merged (copy-on-write) against the hand-written Spark SQL.
    Spark,
    /// A history (SCD type 2): a batch of changes, one in ten a late older
    /// version, into a 10M-row history table (defaults: `--rows`, 100k
    /// `--changes`), against the hand-written in-order update.
    History,
    /// The same history benchmark on PostgreSQL (`--db`; database
    /// `fixpoint_bench_history`, both tables indexed on the key).
    PostgresHistory,
    /// Fingerprint throughput (native, portable) against
    /// `SELECT count(*), sum(hash(cols))`, and a diff of two tables with one
    /// differing row.
    Fingerprint,
}

#[derive(Args)]
pub struct BenchArgs {
    /// Which strategy to measure.
    #[arg(long, value_enum, default_value = "replace-partition")]
    pub(crate) strategy: BenchStrategy,
    /// merge: changed rows per batch (1 in 10 keys delivered twice).
    #[arg(long, default_value_t = 200_000)]
    changes: u64,
    /// Rows in silver.orders (spread evenly over --days days).
    #[arg(long, default_value_t = 20_000_000)]
    rows: u64,
    /// Days in the table; the benchmark replaces the second one.
    #[arg(long, default_value_t = 4)]
    days: u64,
    /// Alternating rounds (each runs both sides once).
    #[arg(long, default_value_t = 5)]
    pub(crate) rounds: u32,
    /// Where the benchmark database lives (reused when its size matches).
    #[arg(long, default_value = "bench-data")]
    pub(crate) dir: PathBuf,
    /// postgres: the server (a database `fixpoint_bench` is created there).
    #[arg(long, default_value = "postgres://root@127.0.0.1:5432/test")]
    pub(crate) db: String,
    /// Output format of the figures: text, or one JSON object on stdout.
    #[arg(long, value_enum, default_value = "text")]
    pub output: crate::Format,
    /// The fixpoint binary (default: the one built beside fixpoint-bench).
    #[arg(long)]
    pub fixpoint: Option<PathBuf>,
    /// spark: measure the merge only (no replace rounds).
    #[arg(long)]
    pub(crate) merge_only: bool,
}

#[derive(Args)]
pub struct BenchSqlArgs {
    /// The DuckDB file.
    #[arg(long)]
    file: Option<PathBuf>,
    /// Load the benchmark's day of Parquet files under this folder instead.
    #[arg(long)]
    files: Option<PathBuf>,
    /// The day to replace.
    #[arg(long)]
    date: String,
    /// Run the hand-written merge instead.
    #[arg(long)]
    merge: bool,
    /// With --pg: replace the day by a hand-written partition exchange
    /// (the day's table built, the old partition detached and dropped, the
    /// new one attached) instead of delete + insert.
    #[arg(long)]
    exchange: bool,
    /// PostgreSQL instead of the DuckDB file: the database URL.
    #[arg(long)]
    pg: Option<String>,
    /// With --pg: the target table.
    #[arg(long, default_value = "silver.orders")]
    table: String,
    /// Run this SQL script on the DuckDB file instead (the benchmark's own
    /// set-up, run in a child process: see [`exec_in_child`]).
    #[arg(long)]
    exec: Option<String>,
    /// Print this query's one value instead (the benchmark's result
    /// checks, in a child process: see [`digest_in_child`]).
    #[arg(long)]
    query: Option<String>,
    /// The hand-written form of the README's example job instead (dedup by
    /// row_number, a load id and a load time) into silver.orders_readme.
    #[arg(long)]
    readme: bool,
}

/// The README's example job, on the benchmark's tables (its target
/// silver.orders_readme).
const README_JOB: &str = r#"name = "bench_readme"
target = "silver.orders_readme"
strategy = "replace_partition"
partition = "dt"
metadata = ["load_id", "loaded_at"]
min_rows = 1

[source]
sql = """
SELECT order_id, customer_id, order_total, currency, updated_at, dt,
       :run_key AS load_id, now() AS loaded_at
FROM (SELECT *, row_number() OVER (PARTITION BY order_id
                ORDER BY updated_at DESC, order_total DESC, currency, customer_id) AS rn
      FROM bronze.orders WHERE dt = :run_date) AS latest
WHERE rn = 1
"""
"#;

/// The README job's rows without its metadata, for the result checks.
const README_ROWS: &str = "SELECT order_id, customer_id, order_total, currency, updated_at, dt FROM (SELECT *, row_number() OVER (PARTITION BY order_id ORDER BY updated_at DESC, order_total DESC, currency, customer_id) AS rn FROM bronze.orders WHERE dt = DATE '2026-10-20') AS latest WHERE rn = 1";

/// The columns both sides write (the checks hash these).
const ORDER_COLUMNS: &str = "order_id, customer_id, order_total, currency, updated_at, dt";

pub(crate) const HAND_MERGE: &str = "MERGE INTO silver.orders AS t USING (
    SELECT * FROM (SELECT *, row_number() OVER (PARTITION BY order_id ORDER BY updated_at DESC) AS rn FROM staging.changes) AS d WHERE rn = 1
) AS s ON t.order_id = s.order_id
WHEN MATCHED AND s.updated_at > t.updated_at THEN UPDATE SET customer_id = s.customer_id, order_total = s.order_total, currency = s.currency, updated_at = s.updated_at, dt = s.dt
WHEN NOT MATCHED THEN INSERT (order_id, customer_id, order_total, currency, updated_at, dt) VALUES (s.order_id, s.customer_id, s.order_total, s.currency, s.updated_at, s.dt)";

const SOURCE: &str = "SELECT order_id, customer_id, order_total, currency, updated_at, dt FROM bronze.orders WHERE dt = ";

fn db_err(context: &str) -> impl FnOnce(duckdb::Error) -> Error + '_ {
    move |e| fixpoint_duckdb::database_error(context.to_owned(), e)
}

/// The hand-written SQL: BEGIN; DELETE the day; INSERT … SELECT the day; COMMIT.
pub fn run_sql(args: BenchSqlArgs) -> Result<(), Error> {
    let d = RunDate::parse(&args.date)?;
    if let Some(dir) = &args.files {
        return crate::bench_files::run_sql(dir, args.file.as_deref(), args.pg.as_deref());
    }
    if let Some(url) = &args.pg {
        if let Some(script) = &args.exec {
            let start = Instant::now();
            crate::bench_pg::exec_script(url, script)?;
            println!("{}", json!({"elapsed_ms": start.elapsed().as_secs_f64() * 1000.0}));
            return Ok(());
        }
        return crate::bench_pg::run_sql(url, &args.table, d, args.merge, args.exchange);
    }
    let file = args.file.ok_or_else(|| Error::argument("fixpoint-bench sql needs --file or --pg", None))?;
    let db = DuckDb::open(&file, Duration::from_secs(60))?;
    let conn = db.connection();
    if let Some(script) = &args.exec {
        conn.execute_batch(script).map_err(db_err("the benchmark's set-up"))?;
        println!("{}", json!({"elapsed_ms": 0.0}));
        return Ok(());
    }
    if let Some(query) = &args.query {
        let value: Option<String> = conn.query_row(&format!("SELECT CAST(({query}) AS VARCHAR)"), [], |r| r.get(0)).map_err(db_err("a result check"))?;
        println!("{}", json!({"elapsed_ms": 0.0, "value": value}));
        return Ok(());
    }
    if args.readme {
        let start = Instant::now();
        conn.execute_batch("BEGIN").map_err(db_err("BEGIN"))?;
        conn.execute("DELETE FROM silver.orders_readme WHERE dt = CAST($1 AS DATE)", [d.to_string()]).map_err(db_err("DELETE"))?;
        let n = conn
            .execute(
                "INSERT INTO silver.orders_readme
                 SELECT order_id, customer_id, order_total, currency, updated_at, dt, $2 AS load_id, now() AS loaded_at
                 FROM (SELECT *, row_number() OVER (PARTITION BY order_id
                                 ORDER BY updated_at DESC, order_total DESC, currency, customer_id) AS rn
                       FROM bronze.orders WHERE dt = CAST($1 AS DATE)) AS latest
                 WHERE rn = 1",
                [d.to_string(), "hand-written".to_owned()],
            )
            .map_err(db_err("INSERT"))?;
        conn.execute_batch("COMMIT").map_err(db_err("COMMIT"))?;
        println!("{}", json!({"elapsed_ms": start.elapsed().as_secs_f64() * 1000.0, "rows_inserted": n}));
        return Ok(());
    }
    if args.merge {
        let start = Instant::now();
        let faults = fixpoint_core::run::protocol::minor_faults();
        conn.execute_batch("BEGIN").map_err(db_err("BEGIN"))?;
        let n = conn.execute(HAND_MERGE, []).map_err(db_err("MERGE"))?;
        let merged = start.elapsed();
        let merge_faults = fixpoint_core::run::protocol::minor_faults();
        conn.execute_batch("COMMIT").map_err(db_err("COMMIT"))?;
        if std::env::var_os("FIXPOINT_TRACE").is_some() {
            let now = fixpoint_core::run::protocol::minor_faults();
            eprintln!(
                "fixpoint-bench sql: merge {:>8.1} ms {:>7} faults, commit {:>8.1} ms {:>7} faults",
                merged.as_secs_f64() * 1000.0,
                merge_faults - faults,
                (start.elapsed() - merged).as_secs_f64() * 1000.0,
                now - merge_faults
            );
        }
        println!("{}", json!({"elapsed_ms": start.elapsed().as_secs_f64() * 1000.0, "rows_changed": n}));
        return Ok(());
    }
    let trace = std::env::var_os("FIXPOINT_TRACE").is_some();
    let start = Instant::now();
    let mut last = start;
    let mut step = |what: &str| {
        if trace {
            eprintln!("fixpoint-bench sql: {what:<10} {:>8.1} ms", last.elapsed().as_secs_f64() * 1000.0);
            last = Instant::now();
        }
    };
    conn.execute_batch("BEGIN").map_err(db_err("BEGIN"))?;
    conn.execute("DELETE FROM silver.orders WHERE dt = CAST($1 AS DATE)", [d.to_string()]).map_err(db_err("DELETE"))?;
    step("delete");
    let n = conn
        .execute(&format!("INSERT INTO silver.orders {SOURCE} CAST($1 AS DATE)"), [d.to_string()])
        .map_err(db_err("INSERT"))?;
    step("insert");
    conn.execute_batch("COMMIT").map_err(db_err("COMMIT"))?;
    step("commit");
    println!("{}", json!({"elapsed_ms": start.elapsed().as_secs_f64() * 1000.0, "rows_inserted": n}));
    Ok(())
}

pub(crate) struct Sample {
    pub(crate) wall: f64,
    pub(crate) inner: f64,
    pub(crate) rss_mb: f64,
    /// Minor page faults (first touches of memory), from wait4.
    pub(crate) faults: u64,
}

pub(crate) fn measure(cmd: &mut Command) -> Result<(Sample, serde_json::Value), Error> {
    let start = Instant::now();
    let child = cmd.stdout(Stdio::piped()).stderr(Stdio::inherit()).spawn().map_err(|source| Error::Io { path: "fixpoint".into(), source })?;
    let pid = child.id() as libc::pid_t;
    let mut stdout = child.stdout.expect("piped");
    let mut text = String::new();
    std::io::Read::read_to_string(&mut stdout, &mut text).map_err(|source| Error::Io { path: "fixpoint".into(), source })?;
    let mut status = 0;
    // SAFETY: an all-zero rusage is a valid value, and wait4 writes it for our own child.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    let r = unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
    let wall = start.elapsed().as_secs_f64();
    if r != pid || !libc::WIFEXITED(status) || libc::WEXITSTATUS(status) != 0 {
        return Err(Error::Internal(format!("benchmark child failed (status {status}): {text}")));
    }
    let v: serde_json::Value = serde_json::from_str(&text).map_err(|e| Error::Internal(format!("bad child output {text:?}: {e}")))?;
    let inner = v["elapsed_ms"].as_f64().unwrap_or(f64::NAN) / 1000.0;
    Ok((Sample { wall, inner, rss_mb: usage.ru_maxrss as f64 / 1024.0, faults: usage.ru_minflt as u64 }, v))
}

/// The median of the rounds' own ratios `a[i] / b[i]` (each round runs both
/// sides back to back, so a slow spell of the machine weighs on both):
/// reported beside the ratio of the medians.
pub(crate) fn paired_ratio(a: &[Sample], b: &[Sample]) -> f64 {
    median(a.iter().zip(b).map(|(x, y)| x.inner / y.inner).collect())
}

/// The median of the samples' minor page faults.
pub(crate) fn faults(v: &[Sample]) -> f64 {
    median(v.iter().map(|s| s.faults as f64).collect())
}

pub(crate) fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(|a, b| a.partial_cmp(b).expect("no NaN"));
    let m = v.len() / 2;
    if v.len() % 2 == 1 {
        v[m]
    } else {
        (v[m - 1] + v[m]) / 2.0
    }
}

/// Runs `sql` on the DuckDB `file` in a child process (`fixpoint-bench sql --exec`).
/// The benchmark's own process stays small: Linux starts a child's peak RSS
/// (what `wait4` reports) from its parent's at the fork, so a parent that
/// had built the tables itself would inflate every side's figure alike.
pub(crate) fn exec_in_child(file: &Path, sql: &str) -> Result<(), Error> {
    let exe = std::env::current_exe().map_err(|source| Error::Io { path: "fixpoint".into(), source })?;
    let mut c = Command::new(exe);
    c.args(["sql", "--file", &file.display().to_string(), "--date", "2026-10-20", &format!("--exec={sql}")]);
    measure(&mut c).map(|_| ())
}

/// The value of `query` on the DuckDB `file`, read in a child process
/// (`fixpoint-bench sql --query`), like [`exec_in_child`].
pub(crate) fn digest_in_child(file: &Path, query: &str) -> Result<String, Error> {
    let exe = std::env::current_exe().map_err(|source| Error::Io { path: "fixpoint".into(), source })?;
    let mut c = Command::new(exe);
    c.args(["sql", "--file", &file.display().to_string(), "--date", "2026-10-20", &format!("--query={query}")]);
    let (_, v) = measure(&mut c)?;
    Ok(v["value"].as_str().unwrap_or("NULL").to_owned())
}

/// The rows of `select` (the benchmark's order columns), as a count and a
/// sum of DuckDB's `hash` over each row: the result checks' digest, by
/// another path than fixpoint's fingerprints.
fn digest_sql(select: &str) -> String {
    format!("SELECT count(*) || ':' || coalesce(CAST(sum(hash({ORDER_COLUMNS})) AS VARCHAR), '0') FROM ({select}) AS d")
}

/// Checks that `side` left `table`'s day equal to the rows of `expected`
/// (both digested in a child process), before any ratio is printed.
fn check_day(file: &Path, side: &str, table: &str, expected: &str) -> Result<(), Error> {
    let got = digest_in_child(file, &digest_sql(&format!("SELECT {ORDER_COLUMNS} FROM {table} WHERE dt = DATE '2026-10-20'")))?;
    let want = digest_in_child(file, &digest_sql(expected))?;
    if got != want {
        return Err(Error::Internal(format!("the benchmark's sides disagree: after {side}, {table}'s day digests as {got} and the source's rows as {want}; no ratio is printed")));
    }
    Ok(())
}

/// Builds (once; a marker file remembers the shape) a DuckDB file with a
/// `table` of `rows` orders spread over `days` days from `first_day`, then
/// runs `after`.
fn build_orders(file: &Path, rows: u64, days: u64, schemas: &str, table: &str, first_day: &str, after: &str) -> Result<(), Error> {
    let marker = file.with_extension("rows");
    let want = format!("{rows} {days} {table}");
    if file.exists() && std::fs::read_to_string(&marker).ok().as_deref() == Some(want.as_str()) {
        return Ok(());
    }
    for p in [file.to_owned(), file.with_extension("duckdb.wal")] {
        let _ = std::fs::remove_file(p);
    }
    eprintln!("bench: building {} ({rows} rows over {days} days)…", file.display());
    exec_in_child(
        file,
        &format!(
            "{schemas}
             CREATE TABLE {table} AS
             SELECT i AS order_id, (i * 7) % 100003 AS customer_id,
                    CAST(((i * 7919) % 1000000) / 100.0 AS DECIMAL(12,2)) AS order_total,
                    ['EUR', 'USD', 'GBP'][(i % 3) + 1] AS currency,
                    CAST(DATE '{first_day}' + CAST(i // {per_day} AS INTEGER) AS TIMESTAMP) + to_seconds((i * 37) % 86400) AS updated_at,
                    DATE '{first_day}' + CAST(i // {per_day} AS INTEGER) AS dt
             FROM range(0, {rows}) AS t(i);
             {after}
             CHECKPOINT;",
            per_day = rows / days
        ),
    )?;
    std::fs::write(&marker, want).map_err(|source| Error::Io { path: marker.clone(), source })?;
    Ok(())
}

fn setup(file: &Path, rows: u64, days: u64) -> Result<(), Error> {
    build_orders(file, rows, days, "CREATE SCHEMA bronze; CREATE SCHEMA silver;", "bronze.orders", "2026-10-19", "CREATE TABLE silver.orders AS SELECT * FROM bronze.orders;")
}

impl BenchArgs {
    /// `--rows`, or `default` when left at the global default.
    pub(crate) fn rows_or(&self, default: u64) -> u64 {
        if self.rows == 20_000_000 {
            default
        } else {
            self.rows
        }
    }

    /// `--changes`, or `default` when left at the global default.
    pub(crate) fn changes_or(&self, default: u64) -> u64 {
        if self.changes == 200_000 {
            default
        } else {
            self.changes
        }
    }
}

pub fn run(args: BenchArgs, out: &Output) -> Result<(), Error> {
    std::fs::create_dir_all(&args.dir).map_err(|source| Error::Io { path: args.dir.clone(), source })?;
    if args.strategy == BenchStrategy::History || args.strategy == BenchStrategy::PostgresHistory {
        return crate::bench_history::run(args, out);
    }
    if args.strategy == BenchStrategy::Merge {
        return run_merge(args, out);
    }
    if args.strategy == BenchStrategy::Backfill {
        return run_backfill(args, out);
    }
    if args.strategy == BenchStrategy::PostgresBackfill {
        let (rows, days) = if args.rows == 20_000_000 && args.days == 4 { (30_000_000, 30) } else { (args.rows, args.days) };
        return crate::bench_pg::run_backfill(&args.db, rows, days, args.rounds, &args.dir, out);
    }
    if args.strategy == BenchStrategy::Lookback {
        return run_lookback(args, out);
    }
    if args.strategy == BenchStrategy::Fingerprint {
        return run_fingerprint(args, out);
    }
    if args.strategy == BenchStrategy::BackfillFiles {
        return run_backfill_files(args, out);
    }
    if args.strategy == BenchStrategy::Files {
        let rows = if args.rows == 20_000_000 { 5_000_000 } else { args.rows };
        let pg = (args.db != "none").then_some(args.db.as_str());
        return crate::bench_files::run(rows, args.rounds, &args.dir, pg, out);
    }
    if args.strategy == BenchStrategy::Spark {
        #[cfg(feature = "spark")]
        {
            let (rows, days) = if args.rows == 20_000_000 && args.days == 4 { (2_000_000, 2) } else { (args.rows, args.days) };
            let changes = if args.changes == 200_000 { 100_000 } else { args.changes };
            return crate::bench_spark::run(&args.db, rows, days, changes, args.rounds, args.merge_only, &args.dir, out);
        }
        #[cfg(not(feature = "spark"))]
        return Err(Error::argument("--strategy spark needs a fixpoint built with the cargo feature `spark`", Some("cargo build --release --features fixpoint-cli/spark")));
    }
    if args.strategy == BenchStrategy::Postgres {
        return crate::bench_pg::run(&args.db, args.rows, args.days, args.changes, args.rounds, &args.dir, out);
    }
    let file = args.dir.join("bench.duckdb");
    setup(&file, args.rows, args.days)?;
    let job = args.dir.join("bench_orders.toml");
    std::fs::write(
        &job,
        format!(
            "name = \"bench_orders\"\ntarget = \"silver.orders\"\nstrategy = \"replace_partition\"\npartition = \"dt\"\nmin_rows = 1\n\n[source]\nsql = \"{SOURCE}:run_date\"\n"
        ),
    )
    .map_err(|source| Error::Io { path: job.clone(), source })?;
    let date = "2026-10-20";
    let exe = std::env::current_exe().map_err(|source| Error::Io { path: "fixpoint".into(), source })?;
    let url = format!("duckdb:{}", file.display());
    let fixpoint = |extra: &[&str]| {
        let mut c = crate::fixpoint_command();
        c.args(["run", &job.display().to_string(), "--date", date, "--db", &url, "--output", "json"]).args(extra);
        c
    };
    let hand = || {
        let mut c = Command::new(&exe);
        c.args(["sql", "--file", &file.display().to_string(), "--date", date]);
        c
    };
    // Warm-up: one of each (creates the ledger, warms the page cache).
    measure(&mut fixpoint(&["--force"]))?;
    measure(&mut hand())?;
    let (mut fx, mut hw, mut skip) = (Vec::new(), Vec::new(), Vec::new());
    let mut rows = 0;
    let source_day = format!("{SOURCE}DATE '{date}'");
    for round in 0..args.rounds {
        eprintln!("bench: round {}/{}", round + 1, args.rounds);
        let order = if round % 2 == 0 { [true, false] } else { [false, true] };
        for fixpoint_side in order {
            if fixpoint_side {
                let (s, v) = measure(&mut fixpoint(&["--force"]))?;
                rows = v["rows_inserted"].as_u64().unwrap_or(0);
                fx.push(s);
                check_day(&file, "fixpoint run --force", "silver.orders", &source_day)?;
            } else {
                hw.push(measure(&mut hand())?.0);
                check_day(&file, "the hand-written SQL", "silver.orders", &source_day)?;
            }
        }
        let (s, v) = measure(&mut fixpoint(&[]))?;
        if v["outcome"] != "skipped" {
            return Err(Error::Internal(format!("the retry was not skipped: {v}")));
        }
        skip.push(s);
    }
    let readme = readme_shape(&file, &exe, date, args.rounds)?;
    let med = |v: &[Sample], f: fn(&Sample) -> f64| median(v.iter().map(f).collect());
    let (fx_in, hw_in, sk_in) = (med(&fx, |s| s.inner), med(&hw, |s| s.inner), med(&skip, |s| s.inner));
    let (fx_wall, hw_wall, sk_wall) = (med(&fx, |s| s.wall), med(&hw, |s| s.wall), med(&skip, |s| s.wall));
    let rss = |v: &[Sample]| v.iter().map(|s| s.rss_mb).fold(0.0, f64::max);
    let result = json!({
        "rows_in_table": args.rows, "rows_replaced": rows, "rounds": args.rounds,
        "fixpoint_run_s": fx_in, "hand_written_s": hw_in, "ratio": fx_in / hw_in, "paired_ratio": paired_ratio(&fx, &hw),
        "fixpoint_process_s": fx_wall, "hand_written_process_s": hw_wall, "process_ratio": fx_wall / hw_wall,
        "skip_run_s": sk_in, "skip_process_s": sk_wall,
        "fixpoint_peak_rss_mb": rss(&fx), "hand_written_peak_rss_mb": rss(&hw), "skip_peak_rss_mb": rss(&skip),
        "fixpoint_page_faults": faults(&fx), "hand_written_page_faults": faults(&hw),
        "readme_job": {
            "fixpoint_run_s": med(&readme.0, |s| s.inner), "hand_written_s": med(&readme.1, |s| s.inner),
            "ratio": med(&readme.0, |s| s.inner) / med(&readme.1, |s| s.inner), "paired_ratio": paired_ratio(&readme.0, &readme.1),
            "fixpoint_peak_rss_mb": rss(&readme.0), "hand_written_peak_rss_mb": rss(&readme.1),
        },
        "results_checked": true,
    });
    if out.is_json() {
        out.json(&result);
    } else {
        println!("replace one {rows}-row day of a {}-row table, median of {} alternating rounds (each side's day checked against the source)", args.rows, args.rounds);
        println!("| side | load (s) | process (s) | peak RSS (MiB) |");
        println!("|---|---|---|---|");
        println!("| hand-written BEGIN; DELETE; INSERT … SELECT; COMMIT | {hw_in:.3} | {hw_wall:.3} | {:.0} |", rss(&hw));
        println!("| fixpoint run --force (guards, fingerprints, ledger) | {fx_in:.3} | {fx_wall:.3} | {:.0} |", rss(&fx));
        println!("| fixpoint run, retry skipped (same input, same output) | {sk_in:.3} | {sk_wall:.3} | {:.0} |", rss(&skip));
        println!("ratio fixpoint / hand-written: {:.3} (load), {:.3} (whole process)", fx_in / hw_in, fx_wall / hw_wall);
        println!("median of the rounds' own load ratios: {:.3}", paired_ratio(&fx, &hw));
        println!("page faults per process (median): {:.0} fixpoint, {:.0} hand-written", faults(&fx), faults(&hw));
        let (rf, rh) = (med(&readme.0, |s| s.inner), med(&readme.1, |s| s.inner));
        println!("the README's example job (row_number dedup, :run_key, now(), min_rows; no --force; one source row changed before each side):");
        println!("| side | load (s) | peak RSS (MiB) |");
        println!("|---|---|---|");
        println!("| hand-written BEGIN; DELETE; INSERT … dedup SELECT; COMMIT | {rh:.3} | {:.0} |", rss(&readme.1));
        println!("| fixpoint run (the README's job) | {rf:.3} | {:.0} |", rss(&readme.0));
        println!("ratio fixpoint / hand-written: {:.3}; median of the rounds' own ratios: {:.3}", rf / rh, paired_ratio(&readme.0, &readme.1));
    }
    Ok(())
}

/// The README's example job against its hand-written form, alternating:
/// before each side one source row of the day changes (so fixpoint's run is
/// a real one, not a skip, without --force); after each, the day must hold
/// exactly the deduplicated source. (fixpoint's samples, the hand's.)
fn readme_shape(file: &Path, exe: &Path, date: &str, rounds: u32) -> Result<(Vec<Sample>, Vec<Sample>), Error> {
    let dir = file.parent().unwrap_or(Path::new("."));
    let job = dir.join("bench_readme.toml");
    std::fs::write(&job, README_JOB).map_err(|source| Error::Io { path: job.clone(), source })?;
    let url = format!("duckdb:{}", file.display());
    let fixpoint = || {
        let mut c = crate::fixpoint_command();
        c.args(["run", &job.display().to_string(), "--date", date, "--db", &url, "--output", "json"]);
        c
    };
    let hand = || {
        let mut c = Command::new(exe);
        c.args(["sql", "--file", &file.display().to_string(), "--date", date, "--readme"]);
        c
    };
    let mut tick = 0u32;
    let mut change = || {
        tick += 1;
        exec_in_child(
            file,
            &format!("UPDATE bronze.orders SET order_total = order_total + 0.01 WHERE dt = DATE '{date}' AND order_id = (SELECT min(order_id) + {} FROM bronze.orders WHERE dt = DATE '{date}'); CHECKPOINT;", tick % 1000),
        )
    };
    // Warm-up: fixpoint creates the target; the hand-written side then has it.
    change()?;
    measure(&mut fixpoint())?;
    measure(&mut hand())?;
    let (mut fx, mut hw) = (Vec::new(), Vec::new());
    for round in 0..rounds {
        eprintln!("bench: README job round {}/{rounds}", round + 1);
        let order = if round % 2 == 0 { [true, false] } else { [false, true] };
        for fixpoint_side in order {
            change()?;
            if fixpoint_side {
                let (s, v) = measure(&mut fixpoint())?;
                if v["outcome"] != "committed" {
                    return Err(Error::Internal(format!("the README job's run did not commit: {v}")));
                }
                fx.push(s);
                check_day(file, "the README job's run", "silver.orders_readme", README_ROWS)?;
            } else {
                hw.push(measure(&mut hand())?.0);
                check_day(file, "the README job's hand-written form", "silver.orders_readme", README_ROWS)?;
            }
        }
    }
    Ok((fx, hw))
}

/// A new batch of changes, newer than everything in the target: `changes`
/// rows over the keys of the table's last tenth, 1 in 10 keys twice (the
/// second copy an older version).
fn new_batch(file: &Path, changes: u64) -> Result<(), Error> {
    let distinct = changes * 9 / 10;
    exec_in_child(
        file,
        &format!(
            "CREATE OR REPLACE TABLE staging.changes AS
             WITH picked AS (
                 SELECT * FROM silver.orders
                 WHERE dt >= (SELECT max(dt) - 9 FROM silver.orders) AND order_id % 10 = 3
                 ORDER BY order_id LIMIT {distinct})
             SELECT order_id, customer_id, order_total + 1 AS order_total, currency, updated_at + INTERVAL 1 HOUR AS updated_at, dt FROM picked
             UNION ALL
             SELECT order_id, customer_id, order_total + 2, currency, updated_at + INTERVAL 30 MINUTE, dt FROM picked WHERE order_id % 100 = 3
             ORDER BY order_id;
             CHECKPOINT;"
        ),
    )
}

/// Before the timed rounds: one batch merged by each side into its own
/// copy of the database (fixpoint pruned, fixpoint unpruned, the
/// hand-written MERGE), the three tables then digested whole (count and
/// sum of DuckDB's `hash`, in a child process): they must be equal.
fn verify_merge(file: &Path, exe: &Path, pruned: &Path, unpruned: &Path, changes: u64) -> Result<(), Error> {
    new_batch(file, changes)?;
    let copy = |name: &str| -> Result<PathBuf, Error> {
        let to = file.with_file_name(format!("verify-{name}.duckdb"));
        let _ = std::fs::remove_file(to.with_extension("duckdb.wal"));
        std::fs::copy(file, &to).map_err(|source| Error::Io { path: to.clone(), source })?;
        Ok(to)
    };
    let mut digests = Vec::new();
    for (name, job) in [("pruned", Some(pruned)), ("unpruned", Some(unpruned)), ("hand", None)] {
        let db = copy(name)?;
        let mut c = if job.is_some() { crate::fixpoint_command() } else { Command::new(exe) };
        match job {
            Some(job) => c.args(["run", &job.display().to_string(), "--date", "2026-10-20", "--db", &format!("duckdb:{}", db.display()), "--output", "json"]),
            None => c.args(["sql", "--file", &db.display().to_string(), "--date", "2026-10-20", "--merge"]),
        };
        measure(&mut c)?;
        digests.push((name, digest_in_child(&db, &digest_sql("SELECT * FROM silver.orders"))?));
        for p in [db.clone(), db.with_extension("duckdb.wal")] {
            let _ = std::fs::remove_file(p);
        }
    }
    if digests.iter().any(|(_, d)| *d != digests[0].1) {
        return Err(Error::Internal(format!("the benchmark's sides disagree on one batch merged into one table: {digests:?}; no ratio is printed")));
    }
    eprintln!("bench: one batch merged by each side gives the same table ({})", digests[0].1);
    Ok(())
}

fn setup_merge(file: &Path, rows: u64, days: u64) -> Result<(), Error> {
    build_orders(file, rows, days, "CREATE SCHEMA staging; CREATE SCHEMA silver;", "silver.orders", "2026-07-01", "")
}

fn run_merge(args: BenchArgs, out: &Output) -> Result<(), Error> {
    let file = args.dir.join("merge.duckdb");
    let days = if args.days == 4 { 100 } else { args.days };
    setup_merge(&file, args.rows, days)?;
    let write_job = |name: &str, partition: bool| -> Result<PathBuf, Error> {
        let path = args.dir.join(format!("{name}.toml"));
        let text = format!(
            "name = \"{name}\"\ntarget = \"silver.orders\"\nstrategy = \"merge\"\nkey = [\"order_id\"]\nversion = \"updated_at\"\n{}\n[source]\nsql = \"SELECT order_id, customer_id, order_total, currency, updated_at, dt FROM staging.changes\"\n",
            if partition { "partition = \"dt\"\n" } else { "" }
        );
        std::fs::write(&path, text).map_err(|source| Error::Io { path: path.clone(), source })?;
        Ok(path)
    };
    let pruned = write_job("bench_merge", true)?;
    let unpruned = write_job("bench_merge_unpruned", false)?;
    let exe = std::env::current_exe().map_err(|source| Error::Io { path: "fixpoint".into(), source })?;
    let url = format!("duckdb:{}", file.display());
    let fixpoint = |job: &Path| {
        let mut c = crate::fixpoint_command();
        c.args(["run", &job.display().to_string(), "--date", "2026-10-20", "--db", &url, "--output", "json"]);
        c
    };
    let hand = || {
        let mut c = Command::new(&exe);
        c.args(["sql", "--file", &file.display().to_string(), "--date", "2026-10-20", "--merge"]);
        c
    };
    new_batch(&file, args.changes)?;
    measure(&mut fixpoint(&pruned))?;
    verify_merge(&file, &exe, &pruned, &unpruned, args.changes)?;
    let (mut fx, mut hw, mut un, mut fx_replay, mut hw_replay) = (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut last = serde_json::Value::Null;
    // Every batch has the same keys (newer versions each time): each side
    // must change as many rows as the others.
    let changed = |v: &serde_json::Value| v["rows_updated"].as_u64().unwrap_or(0) + v["rows_inserted"].as_u64().unwrap_or(0);
    let mut counts = std::collections::BTreeSet::new();
    for round in 0..args.rounds {
        eprintln!("bench: round {}/{}", round + 1, args.rounds);
        let sides: [u8; 3] = if round % 2 == 0 { [0, 1, 2] } else { [1, 0, 2] };
        for side in sides {
            new_batch(&file, args.changes)?;
            match side {
                0 => {
                    let (s, v) = measure(&mut fixpoint(&pruned))?;
                    counts.insert(("fixpoint", changed(&v)));
                    last = v;
                    fx.push(s);
                    let (s, v) = measure(&mut fixpoint(&pruned))?;
                    if changed(&v) != 0 {
                        return Err(Error::Internal(format!("the replayed batch changed rows: {v}")));
                    }
                    fx_replay.push(s);
                }
                1 => {
                    let (s, v) = measure(&mut hand())?;
                    counts.insert(("hand-written", v["rows_changed"].as_u64().unwrap_or(u64::MAX)));
                    hw.push(s);
                    let (s, v) = measure(&mut hand())?;
                    if v["rows_changed"].as_u64() != Some(0) {
                        return Err(Error::Internal(format!("the hand-written replay changed rows: {v}")));
                    }
                    hw_replay.push(s);
                }
                _ => {
                    let (s, v) = measure(&mut fixpoint(&unpruned))?;
                    counts.insert(("fixpoint", changed(&v)));
                    un.push(s);
                }
            }
        }
    }
    if counts.iter().map(|(_, n)| n).collect::<std::collections::BTreeSet<_>>().len() != 1 {
        return Err(Error::Internal(format!("the benchmark's sides changed different numbers of rows: {counts:?}; no ratio is printed")));
    }
    let med = |v: &[Sample]| median(v.iter().map(|s| s.inner).collect());
    let rss = |v: &[Sample]| v.iter().map(|s| s.rss_mb).fold(0.0, f64::max);
    let result = json!({
        "rows_in_table": args.rows, "partitions": days, "batch_rows": args.changes, "rounds": args.rounds,
        "last_report": last,
        "hand_written_s": med(&hw), "fixpoint_s": med(&fx), "fixpoint_unpruned_s": med(&un),
        "ratio": med(&fx) / med(&hw), "ratio_unpruned": med(&un) / med(&hw),
        "paired_ratio": paired_ratio(&fx, &hw), "paired_ratio_unpruned": paired_ratio(&un, &hw),
        "hand_written_replay_s": med(&hw_replay), "fixpoint_replay_s": med(&fx_replay),
        "hand_written_peak_rss_mb": rss(&hw), "fixpoint_peak_rss_mb": rss(&fx), "fixpoint_unpruned_peak_rss_mb": rss(&un),
        "hand_written_page_faults": faults(&hw), "fixpoint_page_faults": faults(&fx), "fixpoint_unpruned_page_faults": faults(&un),
        "results_checked": true,
    });
    if out.is_json() {
        out.json(&result);
    } else {
        println!("merge {} changed rows (1 in 10 keys twice) into a {}-row table of {days} partitions, median of {} alternating rounds", args.changes, args.rows, args.rounds);
        println!("| side | merge (s) | replayed batch (s) | peak RSS (MiB) |");
        println!("|---|---|---|---|");
        println!("| hand-written ROW_NUMBER dedup + guarded MERGE | {:.3} | {:.3} | {:.0} |", med(&hw), med(&hw_replay), rss(&hw));
        println!("| fixpoint run, pruned to touched partitions | {:.3} | {:.3} | {:.0} |", med(&fx), med(&fx_replay), rss(&fx));
        println!("| fixpoint run, unpruned | {:.3} | | {:.0} |", med(&un), rss(&un));
        println!("ratio fixpoint / hand-written: {:.3} (pruned), {:.3} (unpruned)", med(&fx) / med(&hw), med(&un) / med(&hw));
        println!("median of the rounds' own ratios: {:.3} (pruned), {:.3} (unpruned)", paired_ratio(&fx, &hw), paired_ratio(&un, &hw));
        println!("page faults per process (median): {:.0} hand-written, {:.0} pruned, {:.0} unpruned", faults(&hw), faults(&fx), faults(&un));
        println!("fixpoint's last report: {last}");
    }
    Ok(())
}

/// A backfill of every day into an empty target, sequential and with
/// `--parallel 2`; then the same backfill again (every date skipped), against
/// one day's forced load.
fn run_backfill(args: BenchArgs, out: &Output) -> Result<(), Error> {
    let (rows, days) = if args.rows == 20_000_000 && args.days == 4 { (30_000_000, 30) } else { (args.rows, args.days) };
    let file = args.dir.join("backfill.duckdb");
    setup(&file, rows, days)?;
    let job = args.dir.join("bench_backfill.toml");
    std::fs::write(
        &job,
        format!("name = \"bench_backfill\"\ntarget = \"silver.orders\"\nstrategy = \"replace_partition\"\npartition = \"dt\"\nmin_rows = 1\n\n[source]\nsql = \"{SOURCE}:run_date\"\n"),
    )
    .map_err(|source| Error::Io { path: job.clone(), source })?;
    let url = format!("duckdb:{}", file.display());
    let first = RunDate::parse("2026-10-19")?;
    let last = RunDate::range(first, RunDate::from_naive(first.date() + chrono::Duration::days(days as i64 - 1)));
    let to = last.last().expect("days > 0").to_string();
    let empty = || exec_in_child(&file, "DROP TABLE IF EXISTS silver.orders; DROP SCHEMA IF EXISTS fixpoint CASCADE; CHECKPOINT;");
    let timed = |extra: &[&str]| -> Result<Sample, Error> {
        let start = Instant::now();
        let mut c = crate::fixpoint_command();
        c.args(["backfill", &job.display().to_string(), "--from", "2026-10-19", "--to", &to, "--db", &url, "--output", "json"]).args(extra);
        let (mut s, _) = measure(&mut c)?;
        s.inner = start.elapsed().as_secs_f64();
        Ok(s)
    };
    let mut seq = Vec::new();
    let mut par = Vec::new();
    let mut rerun = Vec::new();
    for round in 0..args.rounds {
        eprintln!("bench: round {}/{}", round + 1, args.rounds);
        empty()?;
        seq.push(timed(&[])?);
        rerun.push(timed(&[])?);
        empty()?;
        par.push(timed(&["--parallel", "2"])?);
    }
    let mut one = Vec::new();
    for _ in 0..args.rounds {
        let mut c = crate::fixpoint_command();
        c.args(["run", &job.display().to_string(), "--date", "2026-10-20", "--db", &url, "--force", "--output", "json"]);
        let start = Instant::now();
        let (mut s, _) = measure(&mut c)?;
        s.inner = start.elapsed().as_secs_f64();
        one.push(s);
    }
    // The floor of a re-run that proves every date done: read every day's
    // source once (its input fingerprint) and every day's partition once (one
    // grouped scan), hand-written, on a freshly opened connection.
    let mut floor = Vec::new();
    for _ in 0..args.rounds {
        let db = DuckDb::open(&file, Duration::from_secs(60))?;
        let conn = db.connection();
        let cols = "order_id, customer_id, order_total, currency, updated_at, dt";
        let start = Instant::now();
        let mut n = 0u64;
        for day in RunDate::range(first, RunDate::parse(&to)?) {
            let sql = format!("SELECT count(*), CAST(sum(hash({cols})) AS VARCHAR) FROM ({SOURCE}CAST(? AS DATE)) AS s");
            let (c, _): (u64, Option<String>) = conn
                .query_row(&sql, [day.to_string()], |r| Ok((r.get(0)?, r.get(1)?)))
                .map_err(db_err("the floor's source scan"))?;
            n += c;
        }
        let mut stmt = conn
            .prepare(&format!("SELECT dt, count(*), CAST(sum(hash({cols})) AS VARCHAR) FROM silver.orders GROUP BY dt"))
            .map_err(db_err("the floor's partition scan"))?;
        let groups = stmt.query_map([], |r| r.get::<_, u64>(1)).map_err(db_err("the floor's partition scan"))?.count();
        floor.push(start.elapsed().as_secs_f64());
        if n != rows || groups != days as usize {
            return Err(Error::Internal(format!("the floor read {n} source rows and {groups} days")));
        }
    }
    let med = |v: &[Sample]| median(v.iter().map(|s| s.inner).collect());
    let rss = |v: &[Sample]| v.iter().map(|s| s.rss_mb).fold(0.0, f64::max);
    let floor = median(floor);
    let result = json!({
        "rows": rows, "days": days, "rounds": args.rounds,
        "sequential_s": med(&seq), "parallel_2_s": med(&par), "rerun_all_skipped_s": med(&rerun), "one_day_forced_s": med(&one),
        "rerun_over_one_day": med(&rerun) / med(&one), "floor_s": floor, "rerun_over_floor": med(&rerun) / floor,
        "sequential_peak_rss_mb": rss(&seq), "parallel_peak_rss_mb": rss(&par), "rerun_peak_rss_mb": rss(&rerun),
    });
    if out.is_json() {
        out.json(&result);
    } else {
        println!("backfill {days} days × {} rows into an empty target, median of {} rounds (whole process)", rows / days, args.rounds);
        println!("| run | time (s) | peak RSS (MiB) |");
        println!("|---|---|---|");
        println!("| backfill, sequential | {:.2} | {:.0} |", med(&seq), rss(&seq));
        println!("| backfill --parallel 2 (DuckDB: one writer per file, so serialized) | {:.2} | {:.0} |", med(&par), rss(&par));
        println!("| the same backfill again (every date skipped) | {:.2} | {:.0} |", med(&rerun), rss(&rerun));
        println!("| one day's load, forced | {:.2} | {:.0} |", med(&one), rss(&one));
        println!("| the floor: every day's source and partition read once, hand-written, in process | {floor:.2} | |");
        println!("re-run of a completed backfill / one day's load: {:.2}; / the floor: {:.2}", med(&rerun) / med(&one), med(&rerun) / floor);
    }
    Ok(())
}

/// Fingerprints and diff, in process (the engine does the work; the client
/// holds one row per segment at most).
fn run_fingerprint(args: BenchArgs, out: &Output) -> Result<(), Error> {
    use fixpoint_core::tools::diff::{diff, DiffOptions, Sides};
    use fixpoint_core::engine::measure::{fingerprint, Scope};
    use fixpoint_core::engine::Engine;
    use fixpoint_core::{Method, TableName};
    let file = args.dir.join("bench.duckdb");
    setup(&file, args.rows, args.days)?;
    let mut db = DuckDb::open(&file, Duration::from_secs(60))?;
    db.connection()
        .execute_batch(
            "DROP TABLE IF EXISTS silver.orders_copy;
             CREATE TABLE silver.orders_copy AS SELECT * FROM bronze.orders;
             UPDATE silver.orders_copy SET order_total = order_total + 1 WHERE order_id = 12345678 % (SELECT count(*) FROM bronze.orders);
             CHECKPOINT;",
        )
        .map_err(db_err("preparing the diff copy"))?;
    let a = TableName::parse("bronze.orders")?;
    let b = TableName::parse("silver.orders_copy")?;
    let cols = db.table_columns(&a)?.ok_or_else(|| Error::Internal("bench table missing".into()))?;
    let list = cols.iter().map(|c| format!("\"{}\"", c.name)).collect::<Vec<_>>().join(", ");
    let hand_sql = format!("SELECT count(*), sum(hash({list})) FROM bronze.orders");
    let time = |f: &mut dyn FnMut() -> Result<(), Error>| -> Result<f64, Error> {
        let mut v = Vec::new();
        for _ in 0..args.rounds {
            let start = Instant::now();
            f()?;
            v.push(start.elapsed().as_secs_f64());
        }
        Ok(median(v))
    };
    let conn = db.connection();
    let hand = time(&mut || conn.query_row(&hand_sql, [], |_| Ok(())).map_err(db_err("hand-written hash sum")))?;
    let scope = Scope::Table { table: &a, filter: None };
    let native = time(&mut || fingerprint(&mut db, Method::Native, &scope, &cols).map(|_| ()))?;
    let portable = time(&mut || fingerprint(&mut db, Method::Portable, &scope, &cols).map(|_| ()))?;
    let opts = DiffOptions { key: vec!["order_id".into()], ..Default::default() };
    let mut report = None;
    let diff_s = time(&mut || {
        report = Some(diff(&mut Sides::One(&mut db), &a, &b, &opts)?);
        Ok(())
    })?;
    let report = report.expect("rounds > 0");
    // SAFETY: getrusage writes the struct for this process.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) };
    let rows = args.rows as f64;
    let result = json!({
        "rows": args.rows, "rounds": args.rounds,
        "hand_written_hash_sum_s": hand, "native_fingerprint_s": native, "portable_fingerprint_s": portable,
        "native_ratio": native / hand, "native_rows_per_s": rows / native, "portable_rows_per_s": rows / portable,
        "hand_rows_per_s": rows / hand,
        "diff_one_changed_row_s": diff_s, "diff_changed": report.changed, "diff_segment_queries": report.segment_queries,
        "diff_rows_transferred": report.rows_transferred, "peak_rss_mb": usage.ru_maxrss as f64 / 1024.0,
    });
    if out.is_json() {
        out.json(&result);
    } else {
        println!("fingerprints of a {}-row table, median of {} rounds, in process", args.rows, args.rounds);
        println!("| what | time (s) | rows/s |");
        println!("|---|---|---|");
        println!("| hand-written SELECT count(*), sum(hash(cols)) | {hand:.3} | {:.1}M |", rows / hand / 1e6);
        println!("| fixpoint native fingerprint | {native:.3} | {:.1}M |", rows / native / 1e6);
        println!("| fixpoint portable fingerprint | {portable:.3} | {:.1}M |", rows / portable / 1e6);
        println!("| diff of two {}-row tables, one changed row | {diff_s:.3} | |", args.rows);
        println!(
            "native / hand-written: {:.2}; diff found {} changed row with {} segment queries per side and {} rows read; peak RSS {:.0} MiB",
            native / hand,
            report.changed,
            report.segment_queries,
            report.rows_transferred,
            usage.ru_maxrss as f64 / 1024.0
        );
    }
    Ok(())
}

/// `lookback = 7` with nothing changed vs the day alone, each a whole process.
/// Writes (once) `count` days from `first` of `bronze.orders` in `file` as
/// `dir/dt=YYYY-MM-DD/part-0.parquet`.
fn day_files(file: &Path, dir: &Path, first: chrono::NaiveDate, count: i64) -> Result<(), Error> {
    for i in 0..count {
        let day = first + chrono::Duration::days(i);
        let folder = dir.join(format!("dt={}", day.format("%Y-%m-%d")));
        let part = folder.join("part-0.parquet");
        if !part.exists() {
            std::fs::create_dir_all(&folder).map_err(|source| Error::Io { path: folder.clone(), source })?;
            // Benchmark fixture: the path is ours.
            exec_in_child(
                file,
                &format!(
                    "COPY (SELECT order_id, customer_id, order_total, currency, updated_at FROM bronze.orders WHERE dt = DATE '{}') TO '{}' (FORMAT parquet)",
                    day.format("%Y-%m-%d"),
                    part.display()
                ),
            )?;
        }
    }
    Ok(())
}

/// A backfill of 30 days from a folder of Parquet files per day: its re-run
/// with every date done (each date: its files hashed, the partition's
/// fingerprint checked), against one day's load.
fn run_backfill_files(args: BenchArgs, out: &Output) -> Result<(), Error> {
    let (rows, days) = if args.rows == 20_000_000 && args.days == 4 { (30_000_000, 30) } else { (args.rows, args.days) };
    let file = args.dir.join("backfill.duckdb");
    setup(&file, rows, days)?;
    let first = RunDate::parse("2026-10-19")?;
    day_files(&file, &args.dir.join("backfill_files"), first.date(), days as i64)?;
    let job = args.dir.join("bench_backfill_files.toml");
    std::fs::write(
        &job,
        "name = \"bench_backfill_files\"\ntarget = \"silver.orders_bf\"\nstrategy = \"replace_partition\"\npartition = \"dt\"\n\n[source]\nfiles = \"backfill_files/dt={run_date}/*.parquet\"\n",
    )
    .map_err(|source| Error::Io { path: job.clone(), source })?;
    let url = format!("duckdb:{}", file.display());
    let to = RunDate::from_naive(first.date() + chrono::Duration::days(days as i64 - 1)).to_string();
    let timed = |args: &[&str]| -> Result<Sample, Error> {
        let start = Instant::now();
        let mut c = crate::fixpoint_command();
        c.args(args).args(["--db", &url, "--output", "json"]);
        let (mut s, _) = measure(&mut c)?;
        s.inner = start.elapsed().as_secs_f64();
        Ok(s)
    };
    let job_s = job.display().to_string();
    let backfill = ["backfill", job_s.as_str(), "--from", "2026-10-19", "--to", to.as_str()];
    let full = timed(&backfill)?;
    let (mut rerun, mut one) = (Vec::new(), Vec::new());
    for round in 0..args.rounds {
        eprintln!("bench: round {}/{}", round + 1, args.rounds);
        rerun.push(timed(&backfill)?);
        one.push(timed(&["run", job_s.as_str(), "--date", "2026-10-20", "--force"])?);
    }
    let med = |v: &[Sample]| median(v.iter().map(|s| s.inner).collect());
    let rss = |v: &[Sample]| v.iter().map(|s| s.rss_mb).fold(0.0, f64::max);
    let result = json!({
        "rows": rows, "days": days, "rounds": args.rounds, "first_backfill_s": full.inner,
        "rerun_all_skipped_s": med(&rerun), "one_day_forced_s": med(&one), "rerun_over_one_day": med(&rerun) / med(&one),
        "rerun_peak_rss_mb": rss(&rerun), "one_day_peak_rss_mb": rss(&one),
    });
    if out.is_json() {
        out.json(&result);
    } else {
        println!("backfill {days} days × {} rows from Parquet files, median of {} rounds (whole process)", rows / days, args.rounds);
        println!("| run | time (s) | peak RSS (MiB) |");
        println!("|---|---|---|");
        println!("| the first backfill (once) | {:.3} | {:.0} |", full.inner, full.rss_mb);
        println!("| its re-run, every date done (skipped) | {:.3} | {:.0} |", med(&rerun), rss(&rerun));
        println!("| one day's load (--force) | {:.3} | {:.0} |", med(&one), rss(&one));
        println!("re-run / one day's load: {:.2}", med(&rerun) / med(&one));
    }
    Ok(())
}

fn run_lookback(args: BenchArgs, out: &Output) -> Result<(), Error> {
    let (rows, days) = if args.rows == 20_000_000 && args.days == 4 { (30_000_000, 30) } else { (args.rows, args.days) };
    let file = args.dir.join("backfill.duckdb");
    setup(&file, rows, days)?;
    let body = format!("target = \"silver.orders\"\nstrategy = \"replace_partition\"\npartition = \"dt\"\n\n[source]\nsql = \"{SOURCE}:run_date\"\n");
    let plain = args.dir.join("bench_lookback_plain.toml");
    let window = args.dir.join("bench_lookback_7.toml");
    for (path, extra) in [(&plain, ""), (&window, "lookback = 7\n")] {
        std::fs::write(path, format!("{extra}name = \"bench_lookback\"\n{body}")).map_err(|source| Error::Io { path: path.clone(), source })?;
    }
    let url = format!("duckdb:{}", file.display());
    let last = RunDate::from_naive(RunDate::parse("2026-10-19")?.date() + chrono::Duration::days(days as i64 - 1)).to_string();
    let cmd = |job: &Path, extra: &[&str]| {
        let mut c = crate::fixpoint_command();
        c.args(["run", &job.display().to_string(), "--date", &last, "--db", &url, "--output", "json"]).args(extra);
        c
    };
    // Load the window once (the 8 last days), so every later run finds them done.
    measure(&mut cmd(&window, &[]))?;
    let timed = |c: &mut Command| -> Result<Sample, Error> {
        let start = Instant::now();
        let (mut s, _) = measure(c)?;
        s.inner = start.elapsed().as_secs_f64();
        Ok(s)
    };
    let (mut alone, mut win, mut forced) = (Vec::new(), Vec::new(), Vec::new());
    for round in 0..args.rounds {
        eprintln!("bench: round {}/{}", round + 1, args.rounds);
        alone.push(timed(&mut cmd(&plain, &[]))?);
        win.push(timed(&mut cmd(&window, &[]))?);
        forced.push(timed(&mut cmd(&plain, &["--force"]))?);
    }
    // The same with a file source: the window's 8 days as Parquet files
    // (written once from bronze.orders), so the probe hashes files instead
    // of scanning the source.
    let first_window_day = RunDate::parse(&last)?.date() - chrono::Duration::days(7);
    day_files(&file, &args.dir.join("lookback_files"), first_window_day, 8)?;
    let fbody = "target = \"silver.orders_files\"\nstrategy = \"replace_partition\"\npartition = \"dt\"\n\n[source]\nfiles = \"lookback_files/dt={run_date}/*.parquet\"\n";
    let fplain = args.dir.join("bench_lookback_files_plain.toml");
    let fwindow = args.dir.join("bench_lookback_files_7.toml");
    for (path, extra) in [(&fplain, ""), (&fwindow, "lookback = 7\n")] {
        std::fs::write(path, format!("{extra}name = \"bench_lookback_files\"\n{fbody}")).map_err(|source| Error::Io { path: path.clone(), source })?;
    }
    measure(&mut cmd(&fwindow, &[]))?;
    let (mut falone, mut fwin, mut fforced) = (Vec::new(), Vec::new(), Vec::new());
    for round in 0..args.rounds {
        eprintln!("bench: files round {}/{}", round + 1, args.rounds);
        falone.push(timed(&mut cmd(&fplain, &[]))?);
        fwin.push(timed(&mut cmd(&fwindow, &[]))?);
        fforced.push(timed(&mut cmd(&fplain, &["--force"]))?);
    }
    let med = |v: &[Sample]| median(v.iter().map(|s| s.inner).collect());
    let rss = |v: &[Sample]| v.iter().map(|s| s.rss_mb).fold(0.0, f64::max);
    let result = json!({
        "rows": rows, "days": days, "rounds": args.rounds,
        "day_alone_unchanged_s": med(&alone), "lookback_7_unchanged_s": med(&win), "day_reload_s": med(&forced),
        "ratio_vs_day_alone": med(&win) / med(&alone), "ratio_vs_reload": med(&win) / med(&forced),
        "peak_rss_mb": {"alone": rss(&alone), "lookback_7": rss(&win), "reload": rss(&forced)},
        "files": {
            "day_alone_unchanged_s": med(&falone), "lookback_7_unchanged_s": med(&fwin), "day_reload_s": med(&fforced),
            "ratio_vs_day_alone": med(&fwin) / med(&falone), "ratio_vs_reload": med(&fwin) / med(&fforced),
            "peak_rss_mb": {"alone": rss(&falone), "lookback_7": rss(&fwin), "reload": rss(&fforced)},
        },
    });
    if out.is_json() {
        out.json(&result);
    } else {
        println!("run for {last} on {days} days × {} rows, nothing changed, median of {} rounds (whole process)", rows / days, args.rounds);
        println!("| run | time (s) | peak RSS (MiB) |");
        println!("|---|---|---|");
        println!("| the day alone (skipped: unchanged) | {:.3} | {:.0} |", med(&alone), rss(&alone));
        println!("| the day with lookback = 7 (8 days probed, all skipped) | {:.3} | {:.0} |", med(&win), rss(&win));
        println!("| the day reloaded (--force) | {:.3} | {:.0} |", med(&forced), rss(&forced));
        println!("lookback 7 / the day alone: {:.2}; / the day reloaded: {:.2}", med(&win) / med(&alone), med(&win) / med(&forced));
        println!();
        println!("the same job reading a folder of Parquet files per day (file source):");
        println!("| run | time (s) | peak RSS (MiB) |");
        println!("|---|---|---|");
        println!("| the day alone (skipped: same files) | {:.3} | {:.0} |", med(&falone), rss(&falone));
        println!("| the day with lookback = 7 (8 days' files hashed, all skipped) | {:.3} | {:.0} |", med(&fwin), rss(&fwin));
        println!("| the day reloaded (--force) | {:.3} | {:.0} |", med(&fforced), rss(&fforced));
        println!("lookback 7 / the day alone: {:.2}; / the day reloaded: {:.2}", med(&fwin) / med(&falone), med(&fwin) / med(&fforced));
    }
    Ok(())
}
