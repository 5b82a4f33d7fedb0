//! `fixpoint`: run load jobs so that running them again changes nothing, and
//! prove it.

mod bench;
mod demo;
mod output;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};
use fixpoint_core::engine::{fingerprint, Engine, Filter, Scope};
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
    /// Database URL: duckdb:PATH.
    #[arg(long, env = "FIXPOINT_DB", default_value = "duckdb:fixpoint.duckdb")]
    db: String,
    /// Seconds to wait while another process holds the database.
    #[arg(long, default_value_t = 60)]
    wait: u64,
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
        Command::Run { common, .. } | Command::Fingerprint { common, .. } | Command::Demo { common, .. } => common.output,
        Command::Bench(a) => a.common.output,
        Command::BenchSql(_) => Format::Text,
    };
    let out = Output::new(format == Format::Json);
    match dispatch(cli.command, &out) {
        Ok(()) => ExitCode::SUCCESS,
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
    let shown = output::redact_url(url);
    if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        return Err(Error::Unsupported { engine: "postgres", capability: format!("connections yet ({shown})") });
    }
    Err(Error::argument(
        format!("{shown:?} is not a database URL"),
        Some("use duckdb:PATH, e.g. --db duckdb:warehouse.duckdb"),
    ))
}

fn fault_from_env() -> Result<Option<(FailPoint, FaultAction)>, Error> {
    let Ok(at) = std::env::var("FIXPOINT_FAIL_AT") else { return Ok(None) };
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
    Ok(Some((point, action)))
}

fn dispatch(command: Command, out: &Output) -> Result<(), Error> {
    match command {
        Command::Run { job, date, db, force, .. } => {
            let Some(date) = date else {
                return Err(Error::argument(
                    "--date is required: a run's date comes from the caller, never from the clock",
                    Some("pass the logical date the scheduler is processing, e.g. --date 2026-10-20"),
                ));
            };
            let run_date = RunDate::parse(&date)?;
            let job = Job::from_file(&job)?;
            let mut engine = open_engine(&db.db, Duration::from_secs(db.wait))?;
            let opts = RunOptions { force, fault: fault_from_env()? };
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
        Command::Demo { rows, dir, .. } => demo::run(rows, &dir, out),
        Command::Bench(args) => bench::run(args, out),
        Command::BenchSql(args) => bench::run_sql(args),
    }
}
