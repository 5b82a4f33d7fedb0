//! `fixpoint`: run load jobs so that running them again changes nothing, and
//! prove it.

mod demo;
mod lineage;
mod output;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};
use fixpoint_core::engine::measure::{fingerprint, Filter, Scope};
use fixpoint_core::engine::Engine;
use fixpoint_core::tools::lint::{lint, Severity, SqlDialect};
use fixpoint_core::{Error, FailPoint, FaultAction, Job, Method, RunDate, RunOptions, TableName};

use fixpoint_core::tools::backfill::DateOutcome;
use output::{exit_code, ExitStatus, Output};

/// Make data load jobs safe to re-run, and prove it.
#[derive(Parser)]
#[command(name = "fixpoint", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Args, Clone)]
struct Common {
    /// Output format: text for people, json for machines (on stdout). With
    /// json, every error is a JSON object {"error": …} on stdout, argument
    /// errors (an unknown flag, a missing value) included (exit 2).
    #[arg(long, value_enum, default_value = "text", global = true)]
    output: Format,
}

#[derive(Args, Clone)]
struct DbArgs {
    /// Database URL: duckdb:PATH or postgres://user[:password]@host:port/db.
    /// Default: $FIXPOINT_DB, else duckdb:fixpoint.duckdb in the current
    /// folder (when that file does not exist yet, stderr says it is being
    /// created). A duckdb:PATH in a folder that does not exist is refused
    /// (exit 2): fixpoint creates the file, never its folder.
    #[arg(long, env = "FIXPOINT_DB")]
    db: Option<String>,
    /// Seconds to wait while another process holds the database.
    #[arg(long, default_value_t = 60)]
    wait: u64,
}

/// OpenLineage events of `run` and `backfill` (docs/lineage.md).
#[derive(Args, Clone)]
struct LineageArgs {
    /// Append an OpenLineage event per line to this file: START, then
    /// COMPLETE or FAIL, for every run (also sent to $OPENLINEAGE_URL when set).
    #[arg(long, value_name = "PATH")]
    lineage_file: Option<PathBuf>,
    /// The scheduler's try number (1 for the first try): the same attempt
    /// of a run always has the same lineage run id, a retry another.
    #[arg(long, env = "FIXPOINT_ATTEMPT", default_value_t = 1)]
    attempt: u32,
}

impl LineageArgs {
    /// The lineage of this process, when asked for ($OPENLINEAGE_URL or
    /// --lineage-file); its queue is flushed when the guard is dropped.
    fn start(&self, db_url: &str) -> Result<LineageGuard, Error> {
        match lineage::Config::from_env(self.lineage_file.clone(), self.attempt, db_url)? {
            None => Ok(LineageGuard(None)),
            Some(config) => Ok(LineageGuard(Some(lineage::Lineage::start(config)?))),
        }
    }
}

/// Flushes the lineage events (bounded by their timeout) when dropped.
struct LineageGuard(Option<std::sync::Arc<lineage::Lineage>>);

impl LineageGuard {
    /// The observer to put in the run's options.
    fn observer(&self) -> Option<fixpoint_core::Observer> {
        self.0.as_ref().map(|l| fixpoint_core::Observer(l.clone() as std::sync::Arc<dyn fixpoint_core::RunObserver>))
    }

    /// A run of `job` for each of `dates` that failed before it started
    /// (the database could not be opened, the lint gate refused it): a
    /// START and a FAIL event each.
    fn failed_before(&self, job: &Job, dates: &[RunDate], e: &Error) {
        use fixpoint_core::RunObserver;
        if let Some(l) = &self.0 {
            for &d in dates {
                l.started(job, d);
                l.finished(job, d, Err(e), None);
            }
        }
    }
}

impl Drop for LineageGuard {
    fn drop(&mut self) {
        if let Some(l) = &self.0 {
            l.close();
        }
    }
}

/// The database when neither --db nor FIXPOINT_DB names one.
const DEFAULT_DB: &str = "duckdb:fixpoint.duckdb";
/// Its file, in the current folder.
const DEFAULT_DB_FILE: &str = "fixpoint.duckdb";

impl DbArgs {
    /// The database URL: --db, else $FIXPOINT_DB, else [`DEFAULT_DB`].
    fn url(&self) -> &str {
        self.db.as_deref().unwrap_or(DEFAULT_DB)
    }

    /// Opens the database; the default one, when it does not exist yet,
    /// with a note on stderr that it is created (and where).
    fn open(&self) -> Result<Box<dyn Engine>, Error> {
        if self.db.is_none() && !std::path::Path::new(DEFAULT_DB_FILE).exists() {
            let here = std::env::current_dir().map(|d| d.display().to_string()).unwrap_or_else(|_| ".".into());
            eprintln!("fixpoint: creating DuckDB database {DEFAULT_DB_FILE} in {here} (no --db given)");
        }
        open_engine(self.url(), Duration::from_secs(self.wait))
    }
}

/// The most dates `backfill` and `status` take without --max-dates: ten
/// years. More is most likely a mistyped year.
const MAX_DATES: u64 = 3660;

/// The most runs `prove --runs` compares.
const MAX_PROVE_RUNS: usize = 100;

#[derive(Copy, Clone, PartialEq, Eq, ValueEnum)]
enum DialectArg {
    Duckdb,
    Postgres,
    Spark,
}

#[derive(Copy, Clone, PartialEq, Eq, ValueEnum)]
enum Format {
    Text,
    Json,
}

#[derive(Subcommand)]
enum Command {
    /// Run a job for one logical date.
    ///
    /// Ctrl-C rolls the run back (nothing of it is committed), says so on
    /// stderr and exits 130.
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
        lineage: LineageArgs,
        #[command(flatten)]
        common: Common,
    },
    /// Run a job for every date of a range (inclusive), skipping dates already done.
    ///
    /// A range of more than --max-dates dates (default 3660: ten years) is
    /// refused (exit 2): a mistyped year. Ctrl-C stops the backfill: stderr
    /// lists the dates committed so far, the date in progress (rolled back)
    /// and the dates not started; exit 130. Run it again to finish: the
    /// committed dates are skipped.
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
        /// The most dates the range may hold (default 3660: ten years);
        /// raise it to backfill a longer range on purpose.
        #[arg(long, default_value_t = MAX_DATES)]
        max_dates: u64,
        /// Run even when `fixpoint lint` finds errors in the job.
        #[arg(long)]
        allow_nondeterministic: bool,
        /// When another run of the job holds its lock (PostgreSQL), exit 5 at once instead of waiting.
        #[arg(long)]
        no_wait: bool,
        #[command(flatten)]
        lineage: LineageArgs,
        #[command(flatten)]
        db: DbArgs,
        #[command(flatten)]
        common: Common,
    },
    /// Per date: loaded or missing, drift, source changed since; a chart of rows per date.
    ///
    /// Exits 4 when any date needs attention (missing; drift: the target no
    /// longer holds the recorded output; source or job changed since the
    /// run; no input files, unless the job has allow_missing), with an
    /// `error:` line on stderr; 0 when every date is ok. A monitor can run
    /// it. A range of more than --max-dates dates is refused (exit 2).
    Status {
        /// The job file (TOML).
        job: PathBuf,
        /// First date (default: the first date in the ledger).
        #[arg(long)]
        from: Option<String>,
        /// Last date (default: the last date in the ledger).
        #[arg(long)]
        to: Option<String>,
        /// The most dates the range may hold (default 3660: ten years).
        #[arg(long, default_value_t = MAX_DATES)]
        max_dates: u64,
        #[command(flatten)]
        db: DbArgs,
        #[command(flatten)]
        common: Common,
    },
    /// The ledger's history, newest first.
    ///
    /// An empty ledger is an empty list (exit 0); --job naming a job without
    /// runs is refused (exit 2), listing the jobs that have runs.
    Runs {
        /// Only this job (its `name` in the job file). A job with no runs in
        /// the ledger is refused (exit 2) with the names of those that have.
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
        /// How many runs to compare (2 to 100; more is refused, exit 2).
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
    ///
    /// Every file given is reported: one that cannot be read or parsed is
    /// named on stderr with its error, and the others are still linted. Exit
    /// 2 when any file could not be linted or has lint errors (or warnings,
    /// with --deny-warnings).
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
        /// Only rows where this SQL condition holds. A condition that does
        /// not run on the table (a column it lacks, a type error) is refused
        /// (exit 2), naming the table's columns.
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
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        // Under --output json, an argument error is the JSON error object
        // every other error is, on stdout (and clap's message on stderr).
        Err(e) if e.use_stderr() && json_requested() => {
            let _ = e.print();
            Output::new(true).json(&clap_error_json(&e));
            return ExitCode::from(output::code::INPUT);
        }
        Err(e) => e.exit(),
    };
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
    };
    let out = Output::new(format == Format::Json);
    match dispatch(cli.command, &out) {
        Ok(status) => ExitCode::from(status.code()),
        Err(e) => {
            out.error(&e);
            ExitCode::from(exit_code(&e))
        }
    }
}

/// Whether the command line asks for JSON output (`--output json` or
/// `--output=json` before any `--`), read from the raw arguments: for
/// errors in the arguments themselves, before clap has parsed them.
fn json_requested() -> bool {
    let args: Vec<String> = std::env::args_os().skip(1).map(|a| a.to_string_lossy().into_owned()).collect();
    args.iter()
        .take_while(|a| a.as_str() != "--")
        .enumerate()
        .any(|(i, a)| a == "--output=json" || (a == "--output" && args.get(i + 1).map(String::as_str) == Some("json")))
}

/// clap's error as the JSON error object of every other error:
/// `{"error": {"class": "input", "message", "hint", "usage", "exit_code": 2}}`.
fn clap_error_json(e: &clap::Error) -> serde_json::Value {
    // Display gives clap's text without colors.
    let text = e.to_string().replace("\r\n", "\n");
    // The first paragraph is the message (a list of missing arguments
    // included), then come tips and the usage.
    let mut paragraphs = text.split("\n\n").map(str::trim).filter(|p| !p.is_empty());
    let first = paragraphs.next().unwrap_or("");
    let message = first.strip_prefix("error: ").unwrap_or(first).lines().map(str::trim).collect::<Vec<_>>().join(" ");
    let mut tips = Vec::new();
    let mut usage = None;
    for l in paragraphs.flat_map(str::lines).map(str::trim) {
        if let Some(t) = l.strip_prefix("tip: ") {
            tips.push(t.to_owned());
        } else if let Some(u) = l.strip_prefix("Usage: ") {
            usage = Some(u.to_owned());
        }
    }
    let hint = if tips.is_empty() { "see `fixpoint --help` or `fixpoint COMMAND --help`".to_owned() } else { tips.join("; ") };
    serde_json::json!({"error": {"class": "input", "message": message, "hint": hint, "usage": usage, "exit_code": output::code::INPUT}})
}

/// A DuckDB file in a folder that does not exist (or is not a folder): the
/// user's to fix (exit 2), said before DuckDB fails on it with a runtime
/// error. DuckDB creates the file, never its folder.
fn check_duckdb_folder(path: &std::path::Path) -> Result<(), Error> {
    let Some(folder) = path.parent().filter(|f| !f.as_os_str().is_empty()) else { return Ok(()) };
    let what = match std::fs::metadata(folder) {
        Ok(m) if m.is_dir() => return Ok(()),
        Ok(_) => "is not a folder",
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => "does not exist",
        // Anything else (permissions): DuckDB says what.
        Err(_) => return Ok(()),
    };
    Err(Error::argument(
        format!("cannot open {} as a DuckDB database: the folder {} {what}; create it or fix --db", path.display(), folder.display()),
        Some("fixpoint creates the database file, not its folder: create the folder first (mkdir -p), or give --db duckdb:PATH in an existing folder"),
    ))
}

/// Opens the engine a URL names.
pub(crate) fn open_engine(url: &str, wait: Duration) -> Result<Box<dyn Engine>, Error> {
    if let Some(target) = fixpoint_duckdb::parse_url(url) {
        return Ok(match target {
            fixpoint_duckdb::DuckTarget::File(p) => {
                check_duckdb_folder(&p)?;
                Box::new(duckdb_switches(fixpoint_duckdb::DuckDb::open(&p, wait)?)?)
            }
            fixpoint_duckdb::DuckTarget::Memory => Box::new(duckdb_switches(fixpoint_duckdb::DuckDb::open_in_memory()?)?),
        });
    }
    if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        return Ok(Box::new(postgres_switches(fixpoint_postgres::Postgres::connect_waiting(url, wait)?)?));
    }
    #[cfg(feature = "spark")]
    if fixpoint_spark::is_spark_url(url) {
        return Ok(Box::new(spark_switches(fixpoint_spark::Spark::connect(url, wait.max(Duration::from_secs(10)))?.with_wait(wait))?));
    }
    #[cfg(feature = "delta")]
    if fixpoint_delta::is_delta_url(url) {
        return Ok(Box::new(fixpoint_delta::Delta::open_url(url)?.with_fault(delta_fault()?)));
    }
    if fixpoint_delta::is_delta_url(url) {
        return Err(Error::argument(
            format!("{url:?}: this fixpoint was built without Delta Lake support (the cargo feature `delta`)"),
            Some("build it with `cargo build --release --features fixpoint-cli/delta`, or run the job on DuckDB (duckdb:PATH) or PostgreSQL (postgres://user@host:port/db)"),
        ));
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

/// `FIXPOINT_DELTA_FAULT=lose_commit_ack|abort_after_commit`: the Delta
/// engine's data commit lands and the run then fails as if its answer had
/// been lost, or the process aborts before the ledger row. Obeyed only
/// with `FIXPOINT_TEST_MODE=1`, like fault injection.
#[cfg(feature = "delta")]
fn delta_fault() -> Result<Option<fixpoint_delta::DeltaFault>, Error> {
    let Ok(spec) = std::env::var("FIXPOINT_DELTA_FAULT") else { return Ok(None) };
    if std::env::var(TEST_MODE).as_deref() != Ok("1") {
        eprintln!("fixpoint: warning: FIXPOINT_DELTA_FAULT={spec:?} is ignored: it needs {TEST_MODE}=1 as well (unset FIXPOINT_DELTA_FAULT to silence this)");
        return Ok(None);
    }
    match spec.as_str() {
        "lose_commit_ack" => Ok(Some(fixpoint_delta::DeltaFault::LoseCommitAck)),
        "abort_after_commit" => Ok(Some(fixpoint_delta::DeltaFault::AbortAfterCommit)),
        other => Err(Error::argument(format!("FIXPOINT_DELTA_FAULT: {other:?} is not a Delta fault"), Some("use lose_commit_ack or abort_after_commit"))),
    }
}

/// The variable that puts the process in test mode: only then is
/// `FIXPOINT_FAIL_AT` obeyed.
const TEST_MODE: &str = "FIXPOINT_TEST_MODE";

/// The test switches that turn off an engine's fast paths, so the kill -9
/// trials reach the plans' fallbacks.
const SWITCHES_HINT: &str = "use untapped_day_insert, two_statement_merge, no_taps or unobserved_writes, separated by commas";

/// `FIXPOINT_TEST_SWITCHES=switch,…`, when the process is in test mode:
/// the switches named (each checked against `known`, the whole list). Like
/// fault injection, obeyed only with `FIXPOINT_TEST_MODE=1`; ignored with a
/// warning otherwise.
fn test_switches() -> Result<Vec<String>, Error> {
    let Ok(spec) = std::env::var("FIXPOINT_TEST_SWITCHES") else { return Ok(Vec::new()) };
    if std::env::var(TEST_MODE).as_deref() != Ok("1") {
        eprintln!(
            "fixpoint: warning: FIXPOINT_TEST_SWITCHES={spec:?} is ignored: test switches need {TEST_MODE}=1 as well (unset FIXPOINT_TEST_SWITCHES to silence this)"
        );
        return Ok(Vec::new());
    }
    let switches: Vec<String> = spec.split(',').map(str::trim).filter(|s| !s.is_empty()).map(str::to_owned).collect();
    for s in &switches {
        if !["untapped_day_insert", "two_statement_merge", "no_taps", "unobserved_writes"].contains(&s.as_str()) {
            return Err(Error::argument(format!("FIXPOINT_TEST_SWITCHES: {s:?} is not a test switch"), Some(SWITCHES_HINT)));
        }
    }
    Ok(switches)
}

/// DuckDB's switches (`untapped_day_insert`: the day insert is not tapped,
/// so the guards are scanned after the delete; `two_statement_merge`: no
/// one-statement merge; `no_taps`: no accelerator at all).
fn duckdb_switches(mut duck: fixpoint_duckdb::DuckDb) -> Result<fixpoint_duckdb::DuckDb, Error> {
    for switch in test_switches()? {
        duck = match switch.as_str() {
            "untapped_day_insert" => duck.without_tapped_day_insert(),
            "two_statement_merge" => duck.without_one_statement_merge(),
            "no_taps" => duck.without_taps(),
            _ => duck,
        };
    }
    Ok(duck)
}

/// PostgreSQL's switch (`no_taps`: no accelerator, the portable plans
/// only; DuckDB's other switches name plans PostgreSQL does not have).
fn postgres_switches(mut pg: fixpoint_postgres::Postgres) -> Result<fixpoint_postgres::Postgres, Error> {
    for switch in test_switches()? {
        if switch == "no_taps" {
            pg = pg.without_accelerator();
        }
    }
    Ok(pg)
}

/// Spark's switch (`unobserved_writes`: a replace scans the source before
/// its write and the written day after it, as where a write cannot be
/// observed).
#[cfg(feature = "spark")]
fn spark_switches(mut spark: fixpoint_spark::Spark) -> Result<fixpoint_spark::Spark, Error> {
    for switch in test_switches()? {
        if switch == "unobserved_writes" {
            spark = spark.without_observed_writes();
        }
    }
    Ok(spark)
}

/// `FIXPOINT_FAIL_AT=point[@date]` and `FIXPOINT_FAIL_MODE=error|abort|pause:MS`:
/// fail on purpose at a step boundary (tests, the demo). Obeyed only with
/// `FIXPOINT_TEST_MODE=1` as well: a stray `FIXPOINT_FAIL_AT` left in a
/// production environment must not fail every run, so without test mode it
/// is ignored, with a warning.
fn fault_from_env() -> Result<(Option<(FailPoint, FaultAction)>, Option<RunDate>), Error> {
    let Ok(spec) = std::env::var("FIXPOINT_FAIL_AT") else { return Ok((None, None)) };
    if std::env::var(TEST_MODE).as_deref() != Ok("1") {
        eprintln!(
            "fixpoint: warning: FIXPOINT_FAIL_AT={spec:?} is ignored: fault injection is for tests and needs {TEST_MODE}=1 as well (unset FIXPOINT_FAIL_AT to silence this)"
        );
        return Ok((None, None));
    }
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
    let mode = std::env::var("FIXPOINT_FAIL_MODE").unwrap_or_default();
    let action = match mode.as_str() {
        "abort" => FaultAction::Abort,
        "" | "error" => FaultAction::Error,
        other => match other.strip_prefix("pause:").and_then(|ms| ms.parse::<u64>().ok()) {
            Some(ms) => FaultAction::Pause(ms),
            None => {
                return Err(Error::argument(
                    format!("FIXPOINT_FAIL_MODE={other:?} is not a fault mode"),
                    Some("use error (the default), abort, or pause:MILLISECONDS"),
                ))
            }
        },
    };
    Ok((Some((point, action)), date))
}

fn parse_job_and_engine(job: &std::path::Path, db: &DbArgs) -> Result<(Job, Box<dyn Engine>), Error> {
    let job = Job::from_file(job)?;
    let engine = db.open()?;
    Ok((job, engine))
}

/// How many dates from `from` to `to` (inclusive) a job with `start` owns,
/// counted without listing them.
fn date_count(from: RunDate, to: RunDate, start: Option<RunDate>) -> u64 {
    let first = start.map_or(from, |s| s.max(from));
    if first > to {
        0
    } else {
        to.date().signed_duration_since(first.date()).num_days().unsigned_abs() + 1
    }
}

/// Refuses a range of more than `max` dates (`--max-dates`): most likely a
/// mistyped year (2062 for 2026), which would run (or look at) every day
/// of decades.
fn check_range(from: RunDate, to: RunDate, count: u64, max: u64, fix: &str) -> Result<(), Error> {
    if count <= max {
        return Ok(());
    }
    Err(Error::argument(
        format!("{from} … {to} is {count} dates, more than --max-dates {max} (ten years by default): is a year mistyped?"),
        Some(&format!("{fix}; to take that many dates on purpose, pass --max-dates {count}")),
    ))
}

/// `run` and `backfill` refuse a job with lint errors unless allowed.
fn lint_gate(job: &Job, db_url: &str, engine: &mut dyn Engine, allow: bool) -> Result<(), Error> {
    let dialect = if db_url.starts_with("postgres") {
        SqlDialect::Postgres
    } else if db_url.starts_with("sc://") {
        SqlDialect::Spark
    } else {
        SqlDialect::DuckDb
    };
    let target = fixpoint_core::tools::lint::lint_target(job, engine)?;
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
        // SQL the linter cannot read is not known to be deterministic: refused
        // like a lint error (fail closed), unless the caller accepts it.
        Err(e) => {
            if allow {
                eprintln!("fixpoint: warning: running a job fixpoint could not lint (--allow-nondeterministic): {e}");
                return Ok(());
            }
            let file = job.path.clone().unwrap_or_default();
            Err(match e {
                Error::Sql { what, message, .. } => Error::Spec {
                    file,
                    key: what,
                    message: format!("{message}; fixpoint lint cannot check it, so the job was not run (nothing was changed)"),
                    hint: Some(
                        "fix the syntax (`fixpoint lint` shows the position); if the engine accepts SQL the linter cannot read, pass --allow-nondeterministic to run it unchecked".into(),
                    ),
                },
                other => other,
            })
        }
    }
}

/// Runs the command; `Ok` with the status of an outcome it reported itself
/// (on stdout), `Err` with an error not yet reported.
fn dispatch(command: Command, out: &Output) -> Result<ExitStatus, Error> {
    match command {
        Command::Run { job, date, db, force, allow_nondeterministic, no_wait, lineage, .. } => {
            interrupt::watch(out.is_json());
            let Some(date) = date else {
                return Err(Error::argument(
                    "--date is required: a run's date comes from the caller, never from the clock",
                    Some("pass the logical date the scheduler is processing, e.g. --date 2026-10-20"),
                ));
            };
            let run_date = RunDate::parse(&date)?;
            let job = Job::from_file(&job)?;
            let (fault, fault_date) = fault_from_env()?;
            let lineage = lineage.start(db.url())?;
            interrupt::run(&job.name, run_date, job.lookback);
            let opened = (|| -> Result<Box<dyn Engine>, Error> {
                let mut engine = db.open()?;
                interrupt::engine_opened(engine.leases().is_none());
                lint_gate(&job, db.url(), engine.as_mut(), allow_nondeterministic)?;
                Ok(engine)
            })();
            let mut engine = opened.inspect_err(|e| lineage.failed_before(&job, &[run_date], e))?;
            if job.start.is_some_and(|s| run_date < s) {
                return Err(Error::argument(
                    format!("--date {run_date} is before the job's start {}", job.start.expect("checked")),
                    Some("the job owns the dates from its start on; change start in the job file to load earlier days"),
                ));
            }
            if job.lookback > 0 {
                let opts = RunOptions { force, fault, no_wait, observer: lineage.observer() };
                let (report, failure) = fixpoint_core::tools::lookback::run_window(&job, run_date, engine.as_mut(), &opts, fault_date);
                interrupt::over();
                out.window(&report, &job, failure.as_ref());
                return match failure {
                    None => Ok(ExitStatus::Success),
                    Some(e) => {
                        eprintln!("error: {e}");
                        if let Some(h) = e.hint() {
                            eprintln!("hint: {h}");
                        }
                        Ok(ExitStatus::of(&e))
                    }
                };
            }
            let fault = if fault_date.is_some_and(|d| d != run_date) { None } else { fault };
            let opts = RunOptions { force, fault, no_wait, observer: lineage.observer() };
            let report = job.load_with(run_date, engine.as_mut(), &opts)?;
            interrupt::over();
            out.run_report(&report, &job);
            Ok(ExitStatus::Success)
        }
        Command::Fingerprint { table, predicate, exclude, portable, db, .. } => {
            let table = TableName::parse(&table)?;
            if let Some(p) = &predicate {
                fixpoint_core::job::sql::check_predicate("--where", p)?;
            }
            let mut engine = db.open()?;
            let columns = engine.table_columns(&table)?.ok_or_else(|| Error::Schema {
                message: format!("table {table} does not exist in {}", output::redact_url(db.url())),
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
            let names = columns.iter().map(|c| c.name.as_str()).collect::<Vec<_>>().join(", ");
            let columns: Vec<_> = columns.into_iter().filter(|c| !exclude.contains(&c.name)).collect();
            let method = if portable { Method::Portable } else { Method::Native };
            let filter = predicate.as_deref().map(Filter::Predicate);
            let fp = fingerprint(engine.as_mut(), method, &Scope::Table { table: &table, filter }, &columns).map_err(|e| match (e, predicate.as_deref()) {
                // The condition does not run on the table (a column it
                // lacks, a type error): the user's to fix, shown without
                // the SQL fixpoint wrapped around it.
                (Error::Database { engine: name, message, failure, .. }, Some(p)) if failure.is_statement() => Error::Sql {
                    what: "--where".into(),
                    message: format!("{p:?} does not run on {table} ({name}): {}", message.lines().next().unwrap_or("").trim()),
                    hint: Some(format!("the condition may use the columns of {table}: {names}")),
                },
                (e, _) => e,
            })?;
            out.fingerprint(&table, &fp);
            Ok(ExitStatus::Success)
        }
        Command::Backfill { job, from, to, parallel, force, keep_going, allow_nondeterministic, no_wait, max_dates, db, lineage, .. } => {
            interrupt::watch(out.is_json());
            let (from, to) = (RunDate::parse(&from)?, RunDate::parse(&to)?);
            if from > to {
                return Err(Error::argument(format!("--from {from} is after --to {to}"), Some("give the range in date order")));
            }
            if parallel == 0 {
                return Err(Error::argument("--parallel 0: expected at least 1", None));
            }
            let job = Job::from_file(&job)?;
            let count = date_count(from, to, job.start);
            check_range(from, to, count, max_dates, "check --from and --to")?;
            let first = job.start.map_or(from, |s| s.max(from));
            let dates = if count == 0 { Vec::new() } else { RunDate::range(first, to) };
            let lineage = lineage.start(db.url())?;
            interrupt::backfill(&job.name, &dates, false);
            let opened = (|| -> Result<Box<dyn Engine>, Error> {
                let mut engine = db.open()?;
                interrupt::engine_opened(engine.leases().is_none());
                lint_gate(&job, db.url(), engine.as_mut(), allow_nondeterministic)?;
                Ok(engine)
            })();
            let mut engine = opened.inspect_err(|e| lineage.failed_before(&job, &dates, e))?;
            let transactional = engine.leases().is_none();
            if parallel > 1 && engine.name() == "duckdb" {
                eprintln!("fixpoint: duckdb allows one writer per database file; running the dates one at a time");
            }
            let (fault, fault_date) = fault_from_env()?;
            let opts = fixpoint_core::tools::backfill::BackfillOptions { run: RunOptions { force, fault, no_wait, observer: lineage.observer() }, keep_going, fault_date };
            if let Some(start) = job.start {
                let left_out = date_count(from, to, None) - count;
                if left_out > 0 {
                    eprintln!("fixpoint: {left_out} date(s) before the job's start {start} left out");
                }
            }
            let wait = Duration::from_secs(db.wait);
            let status = if parallel > 1 && engine.name() != "duckdb" {
                drop(engine);
                interrupt::backfill(&job.name, &dates, true);
                interrupt::engine_opened(transactional);
                let url = db.url();
                let connect = || open_engine(url, wait);
                out.backfill(&job, &dates, |progress| {
                    let outcomes = fixpoint_core::tools::backfill::backfill_parallel(&job, &dates, parallel, &connect, &opts, |o: &DateOutcome| {
                        interrupt::finished(o);
                        progress(o);
                    });
                    interrupt::over();
                    outcomes
                })
            } else {
                out.backfill(&job, &dates, |progress| {
                    let outcomes = fixpoint_core::tools::backfill::backfill(&job, &dates, engine.as_mut(), &opts, |o: &DateOutcome| {
                        interrupt::finished(o);
                        progress(o);
                    });
                    interrupt::over();
                    outcomes
                })
            };
            Ok(status)
        }
        Command::Status { job, from, to, max_dates, db, .. } => {
            let job = Job::from_file(&job)?;
            let from = from.as_deref().map(RunDate::parse).transpose()?;
            let to = to.as_deref().map(RunDate::parse).transpose()?;
            let reversed = |from: RunDate, to: RunDate| Error::argument(format!("--from {from} is after --to {to}"), Some("give the range in date order"));
            // A range given in full is checked before the database is opened.
            if let (Some(f), Some(t)) = (from, to) {
                if f > t {
                    return Err(reversed(f, t));
                }
                check_range(f, t, date_count(f, t, job.start), max_dates, "check --from and --to")?;
            }
            let mut engine = db.open()?;
            let (from, to, fix) = match (from, to) {
                (Some(f), Some(t)) => (f, t, "check --from and --to"),
                (from, to) => {
                    let mut loaded: Vec<RunDate> = fixpoint_core::run::ledger::entries(engine.as_mut(), Some(&job.name), None, None)?
                        .iter()
                        .filter_map(|e| RunDate::parse(&e.run_date).ok())
                        .collect();
                    loaded.sort();
                    let f = match from {
                        Some(f) => f,
                        None => *loaded.first().ok_or_else(|| Error::argument(format!("job {} has no runs in the ledger yet", job.name), Some("give --from and --to")))?,
                    };
                    let t = match to {
                        Some(t) => t,
                        None => *loaded.last().unwrap_or(&f),
                    };
                    (f, t, "the range defaults to the ledger's first and last dates of the job: give --from and --to to look at fewer")
                }
            };
            if from > to {
                return Err(reversed(from, to));
            }
            let count = date_count(from, to, job.start);
            check_range(from, to, count, max_dates, fix)?;
            let dates = if count == 0 { Vec::new() } else { RunDate::range(job.start.map_or(from, |s| s.max(from)), to) };
            let rows = fixpoint_core::tools::backfill::status_range(&job, &dates, engine.as_mut())?;
            let attention = fixpoint_core::tools::backfill::needing_attention(&job, &rows);
            out.status(&job, &rows, attention);
            if attention > 0 {
                eprintln!(
                    "error: {attention} of {} date(s) of job {} need attention (missing, drift, source or job changed, no input): exit code {}",
                    rows.len(),
                    job.name,
                    output::code::PROOF
                );
                return Ok(ExitStatus::Proof);
            }
            Ok(ExitStatus::Success)
        }
        Command::Runs { job, limit, db, .. } => {
            let mut engine = db.open()?;
            let entries = fixpoint_core::run::ledger::entries(engine.as_mut(), job.as_deref(), None, Some(limit))?;
            if entries.is_empty() && limit > 0 {
                let known = fixpoint_core::run::ledger::jobs(engine.as_mut())?;
                match &job {
                    // A job without runs: most likely a typo in its name.
                    Some(name) => {
                        let listed = if known.is_empty() {
                            format!("the ledger in {} has no runs yet", output::redact_url(db.url()))
                        } else {
                            format!("jobs with runs: {}", known.join(", "))
                        };
                        return Err(Error::argument(
                            format!("no runs of job {name} in the ledger; {listed}"),
                            Some("--job takes the job's name (`name` in its job file, not the file's name); check it, and --db"),
                        ));
                    }
                    None => eprintln!("fixpoint: the ledger in {} has no runs yet", output::redact_url(db.url())),
                }
            }
            out.runs(&entries);
            Ok(ExitStatus::Success)
        }
        Command::Prove { job, date, runs, crash, no_mutate, mutate_key, db, .. } => {
            let run_date = RunDate::parse(&date)?;
            if runs > MAX_PROVE_RUNS {
                return Err(Error::argument(
                    format!("--runs {runs}: at most {MAX_PROVE_RUNS} runs"),
                    Some("each run rewrites the date; 2 or 3 runs show whether reruns leave the same table, more only repeat it"),
                ));
            }
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
            let opts = fixpoint_core::tools::prove::ProveOptions { runs, crash, mutate: !no_mutate, mutate_key };
            let proof = fixpoint_core::tools::prove::prove(&job, run_date, engine.as_mut(), &opts)?;
            out.proof(&proof);
            if proof.proved {
                Ok(ExitStatus::Success)
            } else {
                Ok(ExitStatus::Proof)
            }
        }
        Command::Lint { jobs, dialect, deny_warnings, db, .. } => {
            let dialect = match dialect {
                DialectArg::Duckdb => SqlDialect::DuckDb,
                DialectArg::Postgres => SqlDialect::Postgres,
                DialectArg::Spark => SqlDialect::Spark,
            };
            let mut engine = db.as_deref().map(|url| open_engine(url, Duration::from_secs(60))).transpose()?;
            // Every file is linted; one that cannot be read, parsed or
            // linted is reported with its error, and the rest go on.
            let mut all: Vec<(String, Result<Vec<fixpoint_core::tools::lint::Finding>, Error>)> = Vec::new();
            for path in &jobs {
                let linted = Job::from_file(path).and_then(|job| {
                    let mut findings = lint(&job, dialect)?;
                    if let Some(engine) = engine.as_mut() {
                        findings.extend(fixpoint_core::tools::lint::lint_target(&job, engine.as_mut())?);
                    }
                    Ok(findings)
                });
                all.push((path.display().to_string(), linted));
            }
            let (mut errors, mut warnings) = (0, 0);
            for f in all.iter().filter_map(|(_, r)| r.as_ref().ok()).flatten() {
                match f.severity {
                    Severity::Error => errors += 1,
                    Severity::Warning => warnings += 1,
                }
            }
            out.lint(&all, errors, warnings);
            if let Some(e) = all.iter().find_map(|(_, r)| r.as_ref().err()) {
                return Ok(ExitStatus::of(e));
            }
            if errors > 0 || (deny_warnings && warnings > 0) {
                return Ok(ExitStatus::Input);
            }
            Ok(ExitStatus::Success)
        }
        Command::Diff { table_a, table_b, key, predicate, exclude, limit, db_b, db, .. } => {
            let (ta, tb) = (TableName::parse(&table_a)?, TableName::parse(&table_b)?);
            let wait = Duration::from_secs(db.wait);
            let mut a = db.open()?;
            let mut b = match db_b.as_deref() {
                Some(url) if url != db.url() => Some(open_engine(url, wait)?),
                _ => None,
            };
            let mut sides = match b.as_mut() {
                Some(b) => fixpoint_core::tools::diff::Sides::Two(a.as_mut(), b.as_mut()),
                None => fixpoint_core::tools::diff::Sides::One(a.as_mut()),
            };
            let opts = fixpoint_core::tools::diff::DiffOptions { key, predicate, exclude, segment_rows: 0, max_listed: limit };
            let report = fixpoint_core::tools::diff::diff(&mut sides, &ta, &tb, &opts)?;
            out.diff(&report);
            if report.identical {
                Ok(ExitStatus::Success)
            } else {
                Ok(ExitStatus::Proof)
            }
        }
        Command::Demo { rows, dir, .. } => demo::run(rows, &dir, out).map(|()| ExitStatus::Success),
    }
}

/// Ctrl-C during `run` and `backfill`: say on stderr what was committed and
/// what was not, then exit 130 (128 + SIGINT, as shells report it).
///
/// The SIGINT handler only writes a byte to a pipe (async-signal-safe); a
/// thread waiting on the pipe reads what the command was doing, prints it,
/// and ends the process with `_exit`: like a kill, which every engine
/// survives (a transaction not committed is rolled back: DuckDB never
/// replays it, PostgreSQL drops it with the connection), and without
/// running destructors under the main thread's feet while it is inside the
/// engine. Each date of a backfill is its own transaction, so the dates
/// reported before the interrupt are exactly the committed ones.
mod interrupt {
    use std::io::{IsTerminal, Write};
    use std::sync::{Mutex, MutexGuard, Once};

    use fixpoint_core::tools::backfill::DateOutcome;
    use fixpoint_core::RunDate;

    /// The exit code after Ctrl-C.
    pub const EXIT_CODE: u8 = 130;

    /// What became of a date of a backfill.
    #[derive(Clone, Copy, PartialEq, Eq)]
    enum Outcome {
        Committed,
        Skipped,
        Failed,
    }

    /// What the command is doing, as far as an interrupt is concerned.
    enum Activity {
        /// Nothing written yet (arguments, the job file).
        Starting,
        /// A run of one date (or of a lookback window ending at it).
        Run { job: String, date: RunDate, lookback: u32, transactional: bool },
        /// A backfill: its dates in order, and what became of each so far.
        Backfill { job: String, dates: Vec<RunDate>, outcomes: Vec<(RunDate, Outcome)>, parallel: bool, transactional: bool },
        /// The work is over; only its report is being printed.
        Over,
    }

    struct State {
        json: bool,
        activity: Activity,
    }

    static STATE: Mutex<State> = Mutex::new(State { json: false, activity: Activity::Starting });

    fn state() -> MutexGuard<'static, State> {
        STATE.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Takes over Ctrl-C (once); `json`: also print what happened as a JSON
    /// error on stdout.
    pub fn watch(json: bool) {
        state().json = json;
        static INSTALL: Once = Once::new();
        INSTALL.call_once(install);
    }

    /// A run of `job` for `date` starts.
    pub fn run(job: &str, date: RunDate, lookback: u32) {
        state().activity = Activity::Run { job: job.to_owned(), date, lookback, transactional: true };
    }

    /// A backfill of `job` over `dates` starts (`parallel`: several dates at once).
    pub fn backfill(job: &str, dates: &[RunDate], parallel: bool) {
        state().activity = Activity::Backfill { job: job.to_owned(), dates: dates.to_vec(), outcomes: Vec::new(), parallel, transactional: true };
    }

    /// The engine is open: whether it has transactions (Spark has not).
    pub fn engine_opened(has_transactions: bool) {
        match &mut state().activity {
            Activity::Run { transactional, .. } | Activity::Backfill { transactional, .. } => *transactional = has_transactions,
            Activity::Starting | Activity::Over => {}
        }
    }

    /// A date of the backfill is done (committed, skipped or failed).
    pub fn finished(o: &DateOutcome) {
        let (date, outcome) = match o {
            DateOutcome::Done(r) => (RunDate::parse(&r.run_date).ok(), if r.outcome == "committed" { Outcome::Committed } else { Outcome::Skipped }),
            DateOutcome::Failed(d, _) => (Some(*d), Outcome::Failed),
            DateOutcome::NotRun(_) => (None, Outcome::Skipped),
        };
        let mut s = state();
        if let (Some(date), Activity::Backfill { outcomes, .. }) = (date, &mut s.activity) {
            outcomes.push((date, outcome));
        }
    }

    /// The work is done: what is left is printing its report.
    pub fn over() {
        state().activity = Activity::Over;
    }

    #[cfg(unix)]
    static WRITE_END: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(-1);

    #[cfg(unix)]
    extern "C" fn on_sigint(_: libc::c_int) {
        let fd = WRITE_END.load(std::sync::atomic::Ordering::Relaxed);
        if fd >= 0 {
            let byte = [1u8];
            // SAFETY: write(2) is async-signal-safe; the buffer outlives the call.
            unsafe { libc::write(fd, byte.as_ptr().cast(), 1) };
        }
    }

    #[cfg(unix)]
    fn install() {
        let mut fds: [libc::c_int; 2] = [-1, -1];
        // SAFETY: pipe(2) fills the array of two descriptors it is given.
        if unsafe { libc::pipe(fds.as_mut_ptr()) } != 0 {
            return;
        }
        let [read_end, write_end] = fds;
        for fd in fds {
            // SAFETY: fcntl on a descriptor this process just opened.
            unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) };
        }
        WRITE_END.store(write_end, std::sync::atomic::Ordering::Relaxed);
        let watcher = std::thread::Builder::new().name("fixpoint-interrupt".into()).spawn(move || {
            let mut byte = [0u8];
            loop {
                // SAFETY: read(2) into a one-byte buffer that outlives the call.
                let n = unsafe { libc::read(read_end, byte.as_mut_ptr().cast(), 1) };
                if n == 1 {
                    break;
                }
                if n < 0 && std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
                    continue;
                }
                return;
            }
            report_and_exit();
        });
        if watcher.is_err() {
            return;
        }
        let handler: extern "C" fn(libc::c_int) = on_sigint;
        // SAFETY: the handler only calls write(2), which is async-signal-safe.
        let previous = unsafe { libc::signal(libc::SIGINT, handler as libc::sighandler_t) };
        if previous == libc::SIG_IGN {
            // Started with Ctrl-C ignored (a background job of a script): keep it so.
            // SAFETY: restores the disposition the process started with.
            unsafe { libc::signal(libc::SIGINT, libc::SIG_IGN) };
        }
    }

    #[cfg(not(unix))]
    fn install() {}

    /// Prints what was committed and what was not, and ends the process.
    #[cfg(unix)]
    fn report_and_exit() -> ! {
        let (lines, json) = {
            let s = state();
            let (lines, json) = describe(&s.activity);
            (lines, if s.json { json } else { None })
        };
        let terminal = std::io::stderr().is_terminal();
        {
            let mut err = std::io::stderr().lock();
            if terminal {
                // Over the progress bar's line, if one is drawn.
                let _ = write!(err, "\r\x1b[2K");
            }
            for l in &lines {
                let _ = writeln!(err, "{l}");
            }
            let _ = err.flush();
        }
        if let Some(v) = json {
            let mut out = std::io::stdout().lock();
            let _ = writeln!(out, "{}", serde_json::to_string_pretty(&v).unwrap_or_default());
            let _ = out.flush();
        }
        // SAFETY: _exit(2) ends the process at once, as a kill would; see the module's comment.
        unsafe { libc::_exit(i32::from(EXIT_CODE)) }
    }

    /// "1 date", "3 dates".
    fn n_dates(n: usize) -> String {
        if n == 1 {
            "1 date".to_owned()
        } else {
            format!("{n} dates")
        }
    }

    /// Dates as runs of consecutive days: `2026-10-01 … 2026-10-05, 2026-10-09`.
    fn spans(dates: &[RunDate]) -> String {
        let mut parts = Vec::new();
        let mut i = 0;
        while i < dates.len() {
            let mut j = i;
            while j + 1 < dates.len() && dates[j].next() == dates[j + 1] {
                j += 1;
            }
            parts.push(if i == j { dates[i].to_string() } else { format!("{} … {}", dates[i], dates[j]) });
            i = j + 1;
        }
        parts.join(", ")
    }

    fn strings(dates: &[RunDate]) -> Vec<String> {
        dates.iter().map(|d| d.to_string()).collect()
    }

    /// The lines for stderr, and the JSON error for stdout (none once the
    /// report may have started printing).
    fn describe(activity: &Activity) -> (Vec<String>, Option<serde_json::Value>) {
        let json_error = |message: &str, hint: &str, extra: serde_json::Value| -> serde_json::Value {
            let mut error = serde_json::json!({"class": "interrupted", "message": message, "hint": hint, "exit_code": EXIT_CODE});
            if let (Some(e), serde_json::Value::Object(more)) = (error.as_object_mut(), extra) {
                e.extend(more);
            }
            serde_json::json!({ "error": error })
        };
        match activity {
            Activity::Starting => {
                let message = "interrupted (Ctrl-C) before anything was written: nothing was committed";
                let hint = "run the command again";
                (vec![format!("error: {message}"), format!("hint: {hint}")], Some(json_error(message, hint, serde_json::json!({}))))
            }
            Activity::Over => (
                vec![
                    "error: interrupted (Ctrl-C) after the work was done: what it committed stays committed".to_owned(),
                    "hint: `fixpoint status` and `fixpoint runs` show what is in place".to_owned(),
                ],
                None,
            ),
            Activity::Run { job, date, lookback, transactional } => {
                let (message, hint) = if *lookback > 0 {
                    (
                        format!("interrupted (Ctrl-C) during the run of {job} for {date} with lookback {lookback}: each day of the window is its own transaction; the days committed before the interrupt stay committed, the day in progress was rolled back"),
                        "`fixpoint status` over the window shows each day; run the same command again to finish it".to_owned(),
                    )
                } else if *transactional {
                    (
                        format!("interrupted (Ctrl-C): the run of {job} for {date} was rolled back: nothing was committed, the target and the ledger are as they were"),
                        "run it again".to_owned(),
                    )
                } else {
                    (
                        format!("interrupted (Ctrl-C) during the run of {job} for {date}: nothing was recorded in the ledger, but on an engine without transactions (Spark) the day's overwrite may still complete"),
                        "run it again: the rerun rewrites the day to the same output and records it".to_owned(),
                    )
                };
                let extra = serde_json::json!({"job": job, "run_date": date.to_string(), "committed": false});
                (vec![format!("error: {message}"), format!("hint: {hint}")], Some(json_error(&message, &hint, extra)))
            }
            Activity::Backfill { job, dates, outcomes, parallel, transactional } => {
                let with = |o: Outcome| -> Vec<RunDate> {
                    let mut v: Vec<RunDate> = outcomes.iter().filter(|(_, x)| *x == o).map(|(d, _)| *d).collect();
                    v.sort();
                    v
                };
                let (committed, skipped, failed) = (with(Outcome::Committed), with(Outcome::Skipped), with(Outcome::Failed));
                let open: Vec<RunDate> = dates.iter().filter(|d| !outcomes.iter().any(|(x, _)| x == *d)).copied().collect();
                let (in_progress, not_started): (Vec<RunDate>, Vec<RunDate>) =
                    if *parallel { (Vec::new(), open.clone()) } else { (open.iter().take(1).copied().collect(), open.iter().skip(1).copied().collect()) };
                let message = format!("interrupted (Ctrl-C): the backfill of {job} stopped; each date is its own transaction");
                let mut lines = vec![format!("error: {message}")];
                lines.push(if committed.is_empty() { "  committed: none".to_owned() } else { format!("  committed: {} ({})", spans(&committed), n_dates(committed.len())) });
                if !skipped.is_empty() {
                    lines.push(format!("  skipped (already done): {} ({})", spans(&skipped), n_dates(skipped.len())));
                }
                if !failed.is_empty() {
                    lines.push(format!("  failed (nothing of them committed): {} ({})", spans(&failed), n_dates(failed.len())));
                }
                if *parallel {
                    if !open.is_empty() {
                        lines.push(format!("  not committed: {} ({}): in progress and rolled back, or not started", spans(&open), n_dates(open.len())));
                    }
                } else {
                    if let Some(d) = in_progress.first() {
                        if *transactional {
                            lines.push(format!("  rolled back: {d} (in progress when interrupted: nothing of it was committed)"));
                        } else {
                            lines.push(format!("  interrupted: {d} (in progress: nothing recorded in the ledger, but without transactions (Spark) its overwrite may still complete)"));
                        }
                    }
                    if !not_started.is_empty() {
                        lines.push(format!("  not started: {} ({})", spans(&not_started), n_dates(not_started.len())));
                    }
                }
                let hint = "run the same backfill again to finish it: the committed dates are skipped";
                lines.push(format!("hint: {hint}"));
                let mut extra = serde_json::json!({
                    "job": job,
                    "committed": strings(&committed),
                    "skipped": strings(&skipped),
                    "failed": strings(&failed),
                });
                if *parallel {
                    extra["not_committed"] = serde_json::json!(strings(&open));
                } else {
                    extra["rolled_back"] = serde_json::json!(strings(&in_progress));
                    extra["not_started"] = serde_json::json!(strings(&not_started));
                }
                (lines, Some(json_error(&message, hint, extra)))
            }
        }
    }
}
