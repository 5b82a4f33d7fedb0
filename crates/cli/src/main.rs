//! `fixpoint`: run load jobs so that running them again changes nothing, and
//! prove it.

mod bench;
mod bench_files;
mod bench_pg;
#[cfg(feature = "spark")]
mod bench_spark;
mod demo;
mod output;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};
use fixpoint_core::engine::{fingerprint, Engine, Filter, Scope};
use fixpoint_core::lint::{lint, Severity, SqlDialect};
use fixpoint_core::{Error, FailPoint, FaultAction, Job, Method, RunDate, RunOptions, TableName};

use output::{exit_code, Output};

/// Make data load jobs safe to re-run, and prove it.
#[derive(Parser)]
#[command(name = "fixpoint", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Args, Clone)]
struct Common {
    /// Output format: text for people, json for machines (on stdout).
    #[arg(long, value_enum, default_value = "text", global = true)]
    output: Format,
}

#[derive(Args, Clone)]
struct DbArgs {
    /// Database URL: duckdb:PATH or postgres://user[:password]@host:port/db.
    #[arg(long, env = "FIXPOINT_DB", default_value = "duckdb:fixpoint.duckdb")]
    db: String,
    /// Seconds to wait while another process holds the database.
    #[arg(long, default_value_t = 60)]
    wait: u64,
}

#[derive(Copy, Clone, PartialEq, Eq, ValueEnum)]
enum DialectArg {
    Duckdb,
    Postgres,
}

#[derive(Copy, Clone, PartialEq, Eq, ValueEnum)]
enum Format {
    Text,
    Json,
}

#[derive(Subcommand)]
enum Command {
    /// Run a job for one logical date.
    Run {
        /// The job file (TOML).
        job: PathBuf,
        /// The logical run date, YYYY-MM-DD. Required: there is no clock default.
        #[arg(long)]
        date: Option<String>,
        #[command(flatten)]
        db: DbArgs,
        /// Rewrite even when the target already holds this run's output.
        #[arg(long)]
        force: bool,
        /// Run even when `fixpoint lint` finds errors in the job.
        #[arg(long)]
        allow_nondeterministic: bool,
        /// When another run of the job holds its lock (PostgreSQL), exit 5 at once instead of waiting.
        #[arg(long)]
        no_wait: bool,
        #[command(flatten)]
        common: Common,
    },
    /// Run a job for every date of a range (inclusive), skipping dates already done.
    Backfill {
        /// The job file (TOML).
        job: PathBuf,
        /// First date, YYYY-MM-DD.
        #[arg(long)]
        from: String,
        /// Last date, YYYY-MM-DD (inclusive).
        #[arg(long)]
        to: String,
        /// Up to N dates at once where the engine allows concurrent writers
        /// (DuckDB has one writer per file: dates run one at a time).
        #[arg(long, default_value_t = 1)]
        parallel: usize,
        /// Rewrite every date, even those already done.
        #[arg(long)]
        force: bool,
        /// Go on after a failed date (the exit code still says it failed).
        #[arg(long)]
        keep_going: bool,
        /// Run even when `fixpoint lint` finds errors in the job.
        #[arg(long)]
        allow_nondeterministic: bool,
        /// When another run of the job holds its lock (PostgreSQL), exit 5 at once instead of waiting.
        #[arg(long)]
        no_wait: bool,
        #[command(flatten)]
        db: DbArgs,
        #[command(flatten)]
        common: Common,
    },
    /// Per date: loaded or missing, drift, source changed since; a chart of rows per date.
    Status {
        /// The job file (TOML).
        job: PathBuf,
        /// First date (default: the first date in the ledger).
        #[arg(long)]
        from: Option<String>,
        /// Last date (default: the last date in the ledger).
        #[arg(long)]
        to: Option<String>,
        #[command(flatten)]
        db: DbArgs,
        #[command(flatten)]
        common: Common,
    },
    /// The ledger's history, newest first.
    Runs {
        /// Only this job.
        #[arg(long)]
        job: Option<String>,
        /// At most N runs.
        #[arg(long, default_value_t = 20)]
        limit: u64,
        #[command(flatten)]
        db: DbArgs,
        #[command(flatten)]
        common: Common,
    },
    /// Prove a job idempotent for one date: run it N times and compare fingerprints; with --crash, fail it at every step.
    Prove {
        /// The job file (TOML).
        job: PathBuf,
        /// The logical run date, YYYY-MM-DD.
        #[arg(long)]
        date: String,
        /// How many runs to compare (at least 2).
        #[arg(long, default_value_t = 2)]
        runs: usize,
        /// Also fail the run at every step boundary and check the old state survives and the rerun converges.
        #[arg(long)]
        crash: bool,
        /// Skip the mutation check (change one input row in a sandbox; only its output may change).
        #[arg(long)]
        no_mutate: bool,
        /// The input row the mutation check changes: COLUMN=VALUE conditions on the source's first table.
        #[arg(long, value_delimiter = ',')]
        mutate_key: Vec<String>,
        #[command(flatten)]
        db: DbArgs,
        #[command(flatten)]
        common: Common,
    },
    /// Find what makes a job non-idempotent (clock, randomness, order, scope, keys) before it runs.
    Lint {
        /// Job files (TOML).
        #[arg(required = true)]
        jobs: Vec<PathBuf>,
        /// SQL dialect to read the jobs with.
        #[arg(long, value_enum, default_value = "duckdb")]
        dialect: DialectArg,
        /// Fail on warnings too.
        #[arg(long)]
        deny_warnings: bool,
        /// Also check the target table in this database (generated merge keys).
        #[arg(long)]
        db: Option<String>,
        #[command(flatten)]
        common: Common,
    },
    /// Print the row count and order-independent checksum of a table.
    Fingerprint {
        /// The table, schema.table.
        table: String,
        /// Only rows where this SQL condition holds.
        #[arg(long = "where")]
        predicate: Option<String>,
        /// Columns to leave out (metadata such as loaded_at), comma-separated.
        #[arg(long, value_delimiter = ',')]
        exclude: Vec<String>,
        /// Use the canonical encoding every engine shares (slower).
        #[arg(long)]
        portable: bool,
        #[command(flatten)]
        db: DbArgs,
        #[command(flatten)]
        common: Common,
    },
    /// Compare two tables (in one database or two): rows only in A, only in
    /// B, and changed. Exit 0 when identical, 4 when they differ.
    Diff {
        /// Table A, schema.table (in --db).
        table_a: String,
        /// Table B, schema.table (in --db-b, or --db).
        table_b: String,
        /// The key columns, comma-separated.
        #[arg(long, value_delimiter = ',', required = true)]
        key: Vec<String>,
        /// Only rows where this SQL condition holds (on both sides).
        #[arg(long = "where")]
        predicate: Option<String>,
        /// Columns to leave out, comma-separated.
        #[arg(long, value_delimiter = ',')]
        exclude: Vec<String>,
        /// At most this many rows listed per kind of difference.
        #[arg(long, default_value_t = 100)]
        limit: usize,
        /// Table B's database, when it is not --db.
        #[arg(long)]
        db_b: Option<String>,
        #[command(flatten)]
        db: DbArgs,
        #[command(flatten)]
        common: Common,
    },
    /// Build a small DuckDB database and job, and show a job surviving reruns
    /// and a crash.
    Demo {
        /// Rows of bronze.orders to generate.
        #[arg(long, default_value_t = 100_000)]
        rows: u64,
        /// Where to leave the database and the job file.
        #[arg(long, default_value = "fixpoint-demo")]
        dir: PathBuf,
        #[command(flatten)]
        common: Common,
    },
    /// Measure fixpoint against hand-written SQL (see BENCHMARKS.md).
    Bench(bench::BenchArgs),
    /// The hand-written SQL side of the benchmark (internal).
    #[command(hide = true)]
    BenchSql(bench::BenchSqlArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let format = match &cli.command {
        Command::Run { common, .. }
        | Command::Fingerprint { common, .. }
        | Command::Demo { common, .. }
        | Command::Backfill { common, .. }
        | Command::Status { common, .. }
        | Command::Runs { common, .. }
        | Command::Lint { common, .. }
        | Command::Prove { common, .. }
        | Command::Diff { common, .. } => common.output,
        Command::Bench(a) => a.common.output,
        Command::BenchSql(_) => Format::Text,
    };
    let out = Output::new(format == Format::Json);
    match dispatch(cli.command, &out) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) if matches!(&e, Error::Internal(m) if m.starts_with(output::REPORTED)) => {
            ExitCode::from(e.to_string().rsplit(' ').next().and_then(|c| c.parse().ok()).unwrap_or(1))
        }
        Err(e) => {
            out.error(&e);
            ExitCode::from(exit_code(&e))
        }
    }
}

/// Opens the engine a URL names.
pub(crate) fn open_engine(url: &str, wait: Duration) -> Result<Box<dyn Engine>, Error> {
    if let Some(target) = fixpoint_duckdb::parse_url(url) {
        return Ok(match target {
            fixpoint_duckdb::DuckTarget::File(p) => Box::new(fixpoint_duckdb::DuckDb::open(&p, wait)?),
            fixpoint_duckdb::DuckTarget::Memory => Box::new(fixpoint_duckdb::DuckDb::open_in_memory()?),
        });
    }
    if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        return Ok(Box::new(fixpoint_postgres::Postgres::connect(url)?));
    }
    #[cfg(feature = "spark")]
    if fixpoint_spark::is_spark_url(url) {
        return Ok(Box::new(fixpoint_spark::Spark::connect(url, wait.max(Duration::from_secs(10)))?));
    }
    if url.starts_with("sc://") {
        return Err(Error::argument(
            format!("{:?}: this fixpoint was built without Spark support (the cargo feature `spark`)", output::redact_url(url)),
            Some("build it with `cargo build --release --features fixpoint-cli/spark` (needs protoc: apt-get install protobuf-compiler), or run the job on DuckDB (duckdb:PATH) or PostgreSQL (postgres://user@host:port/db)"),
        ));
    }
    Err(Error::argument(
        format!("{:?} is not a database URL", output::redact_url(url)),
        Some("use duckdb:PATH or postgres://user@host:port/db"),
    ))
}

/// `FIXPOINT_FAIL_AT=point[@date]` and `FIXPOINT_FAIL_MODE=abort|error`:
/// fail on purpose at a step boundary (tests, the demo).
fn fault_from_env() -> Result<(Option<(FailPoint, FaultAction)>, Option<RunDate>), Error> {
    let Ok(spec) = std::env::var("FIXPOINT_FAIL_AT") else { return Ok((None, None)) };
    let (at, date) = match spec.split_once('@') {
        Some((a, d)) => (a.to_owned(), Some(RunDate::parse(d)?)),
        None => (spec.clone(), None),
    };
    let point = FailPoint::parse(&at).ok_or_else(|| {
        Error::argument(
            format!("FIXPOINT_FAIL_AT={at:?} is not a fail point"),
            Some("use one of after_guards, after_delete, mid_insert, after_insert, before_commit"),
        )
    })?;
    let action = match std::env::var("FIXPOINT_FAIL_MODE").as_deref() {
        Ok("abort") => FaultAction::Abort,
        _ => FaultAction::Error,
    };
    Ok((Some((point, action)), date))
}

fn parse_job_and_engine(job: &std::path::Path, db: &DbArgs) -> Result<(Job, Box<dyn Engine>), Error> {
    let job = Job::from_file(job)?;
    let engine = open_engine(&db.db, Duration::from_secs(db.wait))?;
    Ok((job, engine))
}

/// `run` and `backfill` refuse a job with lint errors unless allowed.
fn lint_gate(job: &Job, db_url: &str, engine: &mut dyn Engine, allow: bool) -> Result<(), Error> {
    let dialect = if db_url.starts_with("postgres") { SqlDialect::Postgres } else { SqlDialect::DuckDb };
    let target = fixpoint_core::lint::lint_target(job, engine)?;
    match lint(job, dialect).map(|mut f| {
        f.extend(target);
        f
    }) {
        Ok(findings) => {
            let errors: Vec<_> = findings.iter().filter(|f| f.severity == Severity::Error).collect();
            if errors.is_empty() {
                return Ok(());
            }
            let list = errors.iter().map(|f| format!("  line {}:{}: {}: {}", f.line, f.column, f.rule, f.message)).collect::<Vec<_>>().join("\n");
            if allow {
                eprintln!("fixpoint: running despite lint errors (--allow-nondeterministic):\n{list}");
                return Ok(());
            }
            Err(Error::Spec {
                file: job.path.clone().unwrap_or_default(),
                key: "source.sql".into(),
                message: format!("{} lint error(s): reruns of this job would not leave the same table\n{list}", errors.len()),
                hint: Some("fix them (see `fixpoint lint`), or pass --allow-nondeterministic".into()),
            })
        }
        Err(e) => {
            eprintln!("fixpoint: not linted: {e}");
            Ok(())
        }
    }
}

fn dispatch(command: Command, out: &Output) -> Result<(), Error> {
    match command {
        Command::Run { job, date, db, force, allow_nondeterministic, no_wait, .. } => {
            let Some(date) = date else {
                return Err(Error::argument(
                    "--date is required: a run's date comes from the caller, never from the clock",
                    Some("pass the logical date the scheduler is processing, e.g. --date 2026-10-20"),
                ));
            };
            let run_date = RunDate::parse(&date)?;
            let job = Job::from_file(&job)?;
            let mut engine = open_engine(&db.db, Duration::from_secs(db.wait))?;
            lint_gate(&job, &db.db, engine.as_mut(), allow_nondeterministic)?;
            let (fault, fault_date) = fault_from_env()?;
            if job.start.is_some_and(|s| run_date < s) {
                return Err(Error::argument(
                    format!("--date {run_date} is before the job's start {}", job.start.expect("checked")),
                    Some("the job owns the dates from its start on; change start in the job file to load earlier days"),
                ));
            }
            if job.lookback > 0 {
                let opts = RunOptions { force, fault, no_wait };
                let (report, failure) = fixpoint_core::lookback::run_window(&job, run_date, engine.as_mut(), &opts, fault_date);
                out.window(&report);
                return match failure {
                    None => Ok(()),
                    Some(e) => {
                        eprintln!("error: {e}");
                        if let Some(h) = e.hint() {
                            eprintln!("hint: {h}");
                        }
                        Err(Error::Internal(format!("{} {}", output::REPORTED, exit_code(&e))))
                    }
                };
            }
            let fault = if fault_date.is_some_and(|d| d != run_date) { None } else { fault };
            let opts = RunOptions { force, fault, no_wait };
            let report = job.load_with(run_date, engine.as_mut(), &opts)?;
            out.run_report(&report);
            Ok(())
        }
        Command::Fingerprint { table, predicate, exclude, portable, db, .. } => {
            let table = TableName::parse(&table)?;
            if let Some(p) = &predicate {
                fixpoint_core::sql::check_predicate("--where", p)?;
            }
            let mut engine = open_engine(&db.db, Duration::from_secs(db.wait))?;
            let columns = engine.table_columns(&table)?.ok_or_else(|| Error::Schema {
                message: format!("table {table} does not exist in {}", output::redact_url(&db.db)),
                hint: Some("check the table name and --db".into()),
            })?;
            for e in &exclude {
                if !columns.iter().any(|c| &c.name == e) {
                    return Err(Error::argument(
                        format!("--exclude {e}: {table} has no such column"),
                        Some(&format!("its columns are {}", columns.iter().map(|c| c.name.as_str()).collect::<Vec<_>>().join(", "))),
                    ));
                }
            }
            let columns: Vec<_> = columns.into_iter().filter(|c| !exclude.contains(&c.name)).collect();
            let method = if portable { Method::Portable } else { Method::Native };
            let filter = predicate.as_deref().map(Filter::Predicate);
            let fp = fingerprint(engine.as_mut(), method, &Scope::Table { table: &table, filter }, &columns)?;
            out.fingerprint(&table, &fp);
            Ok(())
        }
        Command::Backfill { job, from, to, parallel, force, keep_going, allow_nondeterministic, no_wait, db, .. } => {
            let (from, to) = (RunDate::parse(&from)?, RunDate::parse(&to)?);
            if from > to {
                return Err(Error::argument(format!("--from {from} is after --to {to}"), Some("give the range in date order")));
            }
            if parallel == 0 {
                return Err(Error::argument("--parallel 0: expected at least 1", None));
            }
            let (job, mut engine) = parse_job_and_engine(&job, &db)?;
            lint_gate(&job, &db.db, engine.as_mut(), allow_nondeterministic)?;
            if parallel > 1 && engine.name() == "duckdb" {
                eprintln!("fixpoint: duckdb allows one writer per database file; running the dates one at a time");
            }
            let (fault, fault_date) = fault_from_env()?;
            let opts = fixpoint_core::backfill::BackfillOptions { run: RunOptions { force, fault, no_wait }, keep_going, fault_date };
            let mut dates = RunDate::range(from, to);
            if let Some(start) = job.start {
                let before = dates.len();
                dates.retain(|d| *d >= start);
                if dates.len() < before {
                    eprintln!("fixpoint: {} date(s) before the job's start {start} left out", before - dates.len());
                }
            }
            let wait = Duration::from_secs(db.wait);
            let code = if parallel > 1 && engine.name() != "duckdb" {
                drop(engine);
                let connect = || open_engine(&db.db, wait);
                out.backfill(&job, &dates, |progress| {
                    fixpoint_core::backfill::backfill_parallel(&job, &dates, parallel, &connect, &opts, progress)
                })
            } else {
                out.backfill(&job, &dates, |progress| fixpoint_core::backfill::backfill(&job, &dates, engine.as_mut(), &opts, progress))
            };
            match code {
                0 => Ok(()),
                code => Err(Error::Internal(format!("{} {code}", output::REPORTED))),
            }
        }
        Command::Status { job, from, to, db, .. } => {
            let (job, mut engine) = parse_job_and_engine(&job, &db)?;
            let mut loaded: Vec<RunDate> = fixpoint_core::ledger::entries(engine.as_mut(), Some(&job.name), None, None)?
                .iter()
                .filter_map(|e| RunDate::parse(&e.run_date).ok())
                .collect();
            loaded.sort();
            let from = match from {
                Some(f) => RunDate::parse(&f)?,
                None => *loaded.first().ok_or_else(|| Error::argument(format!("job {} has no runs in the ledger yet", job.name), Some("give --from and --to")))?,
            };
            let to = match to {
                Some(t) => RunDate::parse(&t)?,
                None => *loaded.last().unwrap_or(&from),
            };
            if from > to {
                return Err(Error::argument(format!("--from {from} is after --to {to}"), Some("give the range in date order")));
            }
            let dates: Vec<RunDate> = RunDate::range(from, to).into_iter().filter(|d| job.start.map_or(true, |s| *d >= s)).collect();
            let rows = fixpoint_core::backfill::status_range(&job, &dates, engine.as_mut())?;
            out.status(&job.name, &rows);
            Ok(())
        }
        Command::Runs { job, limit, db, .. } => {
            let mut engine = open_engine(&db.db, Duration::from_secs(db.wait))?;
            let entries = fixpoint_core::ledger::entries(engine.as_mut(), job.as_deref(), None, Some(limit))?;
            out.runs(&entries);
            Ok(())
        }
        Command::Prove { job, date, runs, crash, no_mutate, mutate_key, db, .. } => {
            let run_date = RunDate::parse(&date)?;
            let mutate_key = mutate_key
                .iter()
                .map(|kv| {
                    kv.split_once('=').map(|(k, v)| (k.trim().to_owned(), v.to_owned())).ok_or_else(|| {
                        Error::argument(format!("--mutate-key {kv:?}: expected COLUMN=VALUE"), Some("e.g. --mutate-key order_id=4"))
                    })
                })
                .collect::<Result<Vec<_>, Error>>()?;
            if no_mutate && !mutate_key.is_empty() {
                return Err(Error::argument("--mutate-key with --no-mutate: the mutation check is off", Some("drop one of them")));
            }
            let (job, mut engine) = parse_job_and_engine(&job, &db)?;
            let opts = fixpoint_core::prove::ProveOptions { runs, crash, mutate: !no_mutate, mutate_key };
            let proof = fixpoint_core::prove::prove(&job, run_date, engine.as_mut(), &opts)?;
            out.proof(&proof);
            if proof.proved {
                Ok(())
            } else {
                Err(Error::Internal(format!("{} {}", output::REPORTED, output::code::PROOF)))
            }
        }
        Command::Lint { jobs, dialect, deny_warnings, db, .. } => {
            let dialect = match dialect {
                DialectArg::Duckdb => SqlDialect::DuckDb,
                DialectArg::Postgres => SqlDialect::Postgres,
            };
            let mut engine = db.as_deref().map(|url| open_engine(url, Duration::from_secs(60))).transpose()?;
            let mut all = Vec::new();
            for path in &jobs {
                let job = Job::from_file(path)?;
                let mut findings = lint(&job, dialect)?;
                if let Some(engine) = engine.as_mut() {
                    findings.extend(fixpoint_core::lint::lint_target(&job, engine.as_mut())?);
                }
                all.push((path.display().to_string(), findings));
            }
            let errors = all.iter().flat_map(|(_, f)| f).filter(|f| f.severity == Severity::Error).count();
            let warnings = all.iter().flat_map(|(_, f)| f).filter(|f| f.severity == Severity::Warning).count();
            out.lint(&all, errors, warnings);
            if errors > 0 || (deny_warnings && warnings > 0) {
                return Err(Error::Internal(format!("{} {}", output::REPORTED, output::code::INPUT)));
            }
            Ok(())
        }
        Command::Diff { table_a, table_b, key, predicate, exclude, limit, db_b, db, .. } => {
            let (ta, tb) = (TableName::parse(&table_a)?, TableName::parse(&table_b)?);
            let wait = Duration::from_secs(db.wait);
            let mut a = open_engine(&db.db, wait)?;
            let mut b = match db_b.as_deref() {
                Some(url) if url != db.db => Some(open_engine(url, wait)?),
                _ => None,
            };
            let mut sides = match b.as_mut() {
                Some(b) => fixpoint_core::diff::Sides::Two(a.as_mut(), b.as_mut()),
                None => fixpoint_core::diff::Sides::One(a.as_mut()),
            };
            let opts = fixpoint_core::diff::DiffOptions { key, predicate, exclude, segment_rows: 0, max_listed: limit };
            let report = fixpoint_core::diff::diff(&mut sides, &ta, &tb, &opts)?;
            out.diff(&report);
            if report.identical {
                Ok(())
            } else {
                Err(Error::Internal(format!("{} {}", output::REPORTED, output::code::PROOF)))
            }
        }
        Command::Demo { rows, dir, .. } => demo::run(rows, &dir, out),
        Command::Bench(args) => bench::run(args, out),
        Command::BenchSql(args) => bench::run_sql(args),
    }
}
