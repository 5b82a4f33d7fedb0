//! Running a job: the plan (describe, guard, lock, change, record, commit),
//! written once against [`Engine`].

use std::time::Instant;

use serde::Serialize;

use crate::date::RunDate;
use crate::engine::{fingerprint, fingerprint_kind, fingerprint_select, Column, DayPartition, Engine, Filter, Scope};
use crate::error::{Error, FailPoint, Result, SampleRow};
use crate::fingerprint::{Fingerprint, Method};
use crate::ident::{quote_ident, TableName};
use crate::ledger;
use crate::runkey::run_key;
use crate::spec::{Job, Strategy, Swap};
use crate::sql::{RunParam, RunParams, Sql, Value};

/// What to do at a fail point.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultAction {
    /// Return [`Error::Injected`]; the plan rolls back.
    Error,
    /// Abort the process on the spot, like `kill -9`.
    Abort,
    /// Sleep this many milliseconds there, then go on (to make concurrent
    /// runs overlap in tests).
    Pause(u64),
}

/// Options of one run.
#[derive(Debug, Clone, Default)]
pub struct RunOptions {
    /// Rewrite even when the target already holds this run's output.
    pub force: bool,
    /// Fail on purpose at a step boundary (tests, proofs, the demo).
    pub fault: Option<(FailPoint, FaultAction)>,
    /// When another run holds the job's lock, fail at once (exit 5) instead of waiting.
    pub no_wait: bool,
}

/// Takes the run's lock (inside its transaction): one job, one scope at a time.
pub(crate) fn fence(engine: &mut dyn Engine, job: &Job, scope: &str, opts: &RunOptions) -> Result<()> {
    let key = format!("fixpoint:{}:{}:{scope}", job.name, job.target);
    if engine.lock_scope(&key, !opts.no_wait)? {
        Ok(())
    } else {
        Err(Error::Busy { message: format!("another run of job {} holds the lock on {} ({scope}); --no-wait was given", job.name, job.target) })
    }
}

impl RunOptions {
    pub(crate) fn step(&self, at: FailPoint) -> Result<()> {
        match self.fault {
            Some((p, FaultAction::Error)) if p == at => Err(Error::Injected(at)),
            Some((p, FaultAction::Abort)) if p == at => std::process::abort(),
            Some((p, FaultAction::Pause(ms))) if p == at => {
                eprintln!("fixpoint: pausing {ms} ms at fail point {} (test mode)", at.name());
                std::thread::sleep(std::time::Duration::from_millis(ms));
                Ok(())
            }
            _ => Ok(()),
        }
    }
}

/// What a run did, with the evidence.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RunReport {
    /// Job name.
    pub job: String,
    /// Target table.
    pub target: String,
    /// Strategy name.
    pub strategy: String,
    /// Logical run date.
    pub run_date: String,
    /// Deterministic run key.
    pub run_key: String,
    /// `committed` or `skipped`.
    pub outcome: String,
    /// Why the run was skipped, when it was.
    pub skip_reason: Option<String>,
    /// Rows deleted.
    pub rows_deleted: u64,
    /// Rows inserted.
    pub rows_inserted: u64,
    /// Rows updated.
    pub rows_updated: u64,
    /// Rows left unchanged.
    pub rows_unchanged: u64,
    /// Source duplicates collapsed.
    pub duplicates_collapsed: u64,
    /// Source rows.
    pub input_rows: u64,
    /// Source checksum.
    pub input_checksum: String,
    /// Rows of the run's scope after the run.
    pub output_rows: u64,
    /// Checksum of the run's scope after the run.
    pub output_checksum: String,
    /// How the fingerprints were made.
    pub fingerprint_kind: String,
    /// Whether the run created the target table.
    pub created_target: bool,
    /// How the target was changed: `delete+insert`, `partition exchange`,
    /// `merge`, or `none` (skipped).
    pub method: String,
    /// Why a target partitioned by the day was not swapped in whole, when
    /// it was not: the day cannot be (a partition spanning several days, …),
    /// or the job says `swap = "delete_insert"`.
    pub method_note: Option<String>,
    /// The audits of the staged result (all passed, or failed as warnings).
    pub audits: Vec<crate::audit::AuditResult>,
    /// A file source's files, with their sizes and content hashes (the run
    /// key is made from them).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub input_files: Option<crate::files::InputFiles>,
    /// Wall time in milliseconds.
    pub elapsed_ms: u64,
}

impl RunReport {
    /// A report with every count at zero.
    pub(crate) fn new(job: &Job, run_date: RunDate, run_key: String, outcome: &str, input: &Fingerprint, output: &Fingerprint) -> RunReport {
        RunReport {
            job: job.name.clone(),
            target: job.target.to_string(),
            strategy: job.strategy.name().into(),
            run_date: run_date.to_string(),
            run_key,
            outcome: outcome.into(),
            skip_reason: None,
            rows_deleted: 0,
            rows_inserted: 0,
            rows_updated: 0,
            rows_unchanged: 0,
            duplicates_collapsed: 0,
            input_rows: input.rows,
            input_checksum: input.checksum.clone(),
            output_rows: output.rows,
            output_checksum: output.checksum.clone(),
            fingerprint_kind: input.kind.clone(),
            created_target: false,
            method: String::new(),
            method_note: None,
            audits: Vec::new(),
            input_files: None,
            elapsed_ms: 0,
        }
    }

    /// The output fingerprint.
    pub fn output(&self) -> Fingerprint {
        Fingerprint { kind: self.fingerprint_kind.clone(), rows: self.output_rows, checksum: self.output_checksum.clone() }
    }
}

impl Job {
    /// Runs the job for one logical date: the seed's `load_daily_orders(run_date, conn)`
    /// made general. Safe to call any number of times.
    pub fn load(&self, run_date: RunDate, engine: &mut dyn Engine) -> Result<RunReport> {
        self.load_with(run_date, engine, &RunOptions::default())
    }

    /// [`Job::load`] with options.
    pub fn load_with(&self, run_date: RunDate, engine: &mut dyn Engine, opts: &RunOptions) -> Result<RunReport> {
        // Before anything is read or written: a target in fixpoint's own
        // schema, a source that reads the target (also refused at load).
        self.check_target()?;
        if let Some(start) = self.start {
            if run_date < start {
                return Err(Error::Argument {
                    message: format!("{run_date} is before the start of job {} ({start}): the job owns the dates from {start} on", self.name),
                    hint: Some("pass a run date on or after `start`, or move `start` in the job file".into()),
                });
            }
        }
        // A serialization failure or a deadlock rolled the whole run back:
        // run it again, a few times, with backoff.
        let mut attempt = 0;
        loop {
            match self.load_once(run_date, engine, opts) {
                Err(Error::Transient { message, .. }) if attempt < 3 => {
                    attempt += 1;
                    let wait = std::time::Duration::from_millis(100 * 4u64.pow(attempt - 1));
                    eprintln!("fixpoint: {} {run_date}: {message}; rolled back, retrying in {} ms", self.name, wait.as_millis());
                    std::thread::sleep(wait);
                }
                other => return other,
            }
        }
    }

    fn load_once(&self, run_date: RunDate, engine: &mut dyn Engine, opts: &RunOptions) -> Result<RunReport> {
        // Checked on every attempt: a run retried after a catalog race
        // sees what the other session created.
        check_target_relation(self, engine)?;
        match self.strategy {
            Strategy::ReplacePartition => replace_partition(self, run_date, engine, opts),
            Strategy::Merge => crate::merge::merge(self, run_date, engine, opts),
        }
    }
}

/// Refuses, before anything is read or written, a target that exists but
/// is not a table a run can write: a view (its rows cannot be deleted or
/// merged into; on PostgreSQL a run would also try to create the table
/// beside it), a materialized view, a foreign table.
fn check_target_relation(job: &Job, engine: &mut dyn Engine) -> Result<()> {
    let Some(kind) = engine.relation_kind(&job.target)? else { return Ok(()) };
    Err(job.spec_error(
        "target",
        format!(
            "{} is {kind} on {}, not a table: a run deletes, inserts and updates the target's rows, which {kind} does not hold; nothing was changed",
            job.target,
            engine.name()
        ),
        format!(
            "point `target` at a table: load the table {kind} reads from (and keep {kind} on top of it), or drop {kind} and let the first run create {} as a table",
            job.target
        ),
    ))
}

/// A run's wall time in whole milliseconds, rounded to the nearest (not
/// truncated: the benchmarks compare it with times measured in fractions of
/// a millisecond, and truncating would shave ~0.5 ms off every run).
pub(crate) fn elapsed_ms(started: Instant) -> u64 {
    (started.elapsed().as_secs_f64() * 1000.0).round() as u64
}

/// Step timings on stderr when `FIXPOINT_TRACE` is set (for profiling),
/// with the process's minor page faults (first touches of memory) of each
/// step where the system tells them (Linux).
pub(crate) struct Trace {
    on: bool,
    last: Instant,
    faults: u64,
}

/// This process's minor page faults so far (`/proc/self/stat`, field 10;
/// 0 where there is none).
pub fn minor_faults() -> u64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // The command name (field 2) may hold spaces: count after its ')'.
    stat.rsplit_once(')').and_then(|(_, rest)| rest.split_whitespace().nth(7)).and_then(|f| f.parse().ok()).unwrap_or(0)
}

impl Trace {
    pub(crate) fn new() -> Trace {
        let on = std::env::var_os("FIXPOINT_TRACE").is_some();
        Trace { on, last: Instant::now(), faults: if on { minor_faults() } else { 0 } }
    }

    pub(crate) fn step(&mut self, what: &str) {
        if self.on {
            let now = Instant::now();
            let faults = minor_faults();
            eprintln!("fixpoint: {what:<24} {:>8.1} ms {:>7} faults", (now - self.last).as_secs_f64() * 1000.0, faults.saturating_sub(self.faults));
            self.last = now;
            self.faults = faults;
        }
    }
}

/// Runs `body` inside a transaction: commit on success, roll back on error.
pub(crate) fn in_transaction<T>(engine: &mut dyn Engine, body: impl FnOnce(&mut dyn Engine) -> Result<T>) -> Result<T> {
    engine.begin()?;
    match body(engine) {
        Ok(v) => {
            engine.commit()?;
            Ok(v)
        }
        Err(e) => {
            // The original error is what the user needs; a failed rollback
            // (connection gone) leaves nothing committed either way.
            let _ = engine.rollback();
            Err(e)
        }
    }
}

/// A run's input: the run parameters (with the relation a file source's
/// query reads as `input`) and, for a file source, its hashed files.
pub(crate) struct RunInput {
    /// The parameters, run key empty.
    pub params: RunParams,
    /// The files, for a file source.
    pub files: Option<crate::files::InputFiles>,
    /// Whether the files alone decide the run key (the query reads nothing else).
    pub key_from_files: bool,
}

impl RunInput {
    /// The run key, when the files alone decide it: known before any row
    /// is read. `None` for a SQL source, and for a file source whose query
    /// also reads tables (its key comes from the query's rows).
    pub(crate) fn file_key(&self, job_hash: &str, run_date: RunDate) -> Option<String> {
        self.files.as_ref().filter(|_| self.key_from_files).map(|f| run_key(job_hash, run_date, &f.fingerprint()))
    }
}

/// Runs `body` with the run's input ready: for a file source, the day's
/// files matched, checked, hashed and made readable (and released after,
/// whatever happens). `Ok(None)`: no file matched and the job allows it.
/// A database error naming one of the files becomes an error about that file.
pub(crate) fn with_input<T>(
    job: &Job,
    run_date: RunDate,
    engine: &mut dyn Engine,
    body: impl FnOnce(&mut dyn Engine, &RunInput) -> Result<T>,
) -> Result<Option<T>> {
    let mut params = RunParams::new(run_date.date());
    let Some(source) = &job.source.files else {
        return body(engine, &RunInput { params, files: None, key_from_files: false }).map(Some);
    };
    let Some(files) = source.resolve(run_date)? else { return Ok(None) };
    let staged = engine.file_input(&files);
    let result = match staged {
        Ok(relation) => {
            params.input = Some(relation);
            let input = RunInput { params, files: Some(files.clone()), key_from_files: job.source.key_from_files() };
            let r = body(engine, &input);
            // Once the run committed, a failed cleanup (the connection gone:
            // the staged table goes with it) does not make it a failed run.
            if let (Ok(_), Err(e)) = (&r, engine.release_file_input()) {
                eprintln!("fixpoint: {} {run_date}: could not drop the staged files ({e}); the run itself committed", job.name);
            }
            r
        }
        Err(e) => {
            let _ = engine.release_file_input();
            Err(e)
        }
    };
    result.map(Some).map_err(|e| file_error(e, &files, job, run_date))
}

/// A database error that names one of the run's files, as an error about the file.
fn file_error(e: Error, files: &crate::files::InputFiles, job: &Job, run_date: RunDate) -> Error {
    let Error::Database { message, .. } = &e else { return e };
    let message = message.clone();
    let Some(file) = files.named_in(&message) else { return e };
    // The reader's first line says what is wrong (and where, when it knows);
    // the rest is about its own options and the query fixpoint wrote.
    let mut reason: Vec<&str> = message.lines().take(1).collect();
    reason.extend(message.lines().skip(1).filter(|l| l.starts_with("CSV Error on Line") || l.starts_with("Original Line")));
    Error::Files {
        message: format!("cannot read {file} ({} file of job {} for {run_date}): {}; nothing was changed", files.format.name(), job.name, reason.join(" ").trim()),
        hint: Some("replace the file with a complete, valid one (or remove it) and run again; the target keeps its previous contents".into()),
    }
}

/// The report of a run whose day has no files, with `allow_missing = true`.
pub(crate) fn no_files_report(job: &Job, run_date: RunDate, started: Instant) -> RunReport {
    let empty = Fingerprint { kind: crate::files::FILES_KIND.into(), rows: 0, checksum: String::new() };
    let mut report = RunReport::new(job, run_date, String::new(), "skipped", &empty, &empty);
    let pattern = job.source.files.as_ref().map(|f| f.expand(run_date).display().to_string()).unwrap_or_default();
    report.skip_reason = Some(format!("no file matches {pattern} and the job has allow_missing = true: the target is left as it is"));
    report.method = "none".into();
    report.elapsed_ms = elapsed_ms(started);
    report
}

/// Source columns, described with the run key left empty.
pub(crate) fn describe_source(job: &Job, engine: &mut dyn Engine, params: &RunParams) -> Result<Vec<Column>> {
    let sql = job.source.template().render(params);
    engine.describe(&sql).map_err(|e| match e {
        // The query's own fault (an unknown table or column, a syntax or
        // type error): the user's to fix, exit 2.
        Error::Database { engine, message, .. } if is_query_error(&message) => Error::Sql {
            what: format!("source.sql of job {} ({engine})", job.name),
            message: message.trim().to_owned(),
            hint: Some("run the query by hand with the run's parameters bound, and fix the table or column it names".into()),
        },
        Error::Database { engine, message, .. } => Error::Database {
            engine,
            context: format!("the source query of job {} does not run", job.name),
            message,
        },
        other => other,
    })
}

/// Whether an engine's error message is about the query itself (DuckDB's
/// parser, binder and catalog errors; PostgreSQL's and Spark's SQLSTATE
/// class 42).
fn is_query_error(message: &str) -> bool {
    ["Parser Error", "Binder Error", "Catalog Error", "Conversion Error", "(SQLSTATE 42", "SQLSTATE: 42"].iter().any(|m| message.contains(m))
}

/// Whether an engine's error message says a statement could not be
/// bound: an unknown column, table or function, a syntax error, a type
/// that does not fit where it is used. Decided before any row is read, so
/// a statement whose other parts (fixpoint's SQL, the already described
/// source) bind, failing so, failed in the user's fragment. DuckDB's
/// parser, binder and catalog errors; PostgreSQL's SQLSTATEs 42601
/// (syntax), 42P01 (table), 42703 (column), 42883 (function), 42702 and
/// 42725 (ambiguous), 42804 (datatype mismatch); Spark's analysis errors.
pub(crate) fn is_binding_error(message: &str) -> bool {
    [
        "Parser Error",
        "Binder Error",
        "Catalog Error",
        "(SQLSTATE 42601)",
        "(SQLSTATE 42P01)",
        "(SQLSTATE 42703)",
        "(SQLSTATE 42883)",
        "(SQLSTATE 42702)",
        "(SQLSTATE 42725)",
        "(SQLSTATE 42804)",
        "[UNRESOLVED_COLUMN",
        "[UNRESOLVED_ROUTINE",
        "[TABLE_OR_VIEW_NOT_FOUND",
        "[PARSE_SYNTAX_ERROR",
        "[DATATYPE_MISMATCH",
    ]
    .iter()
    .any(|m| message.contains(m))
}

/// A statement built from a SQL fragment of the job file (the merge's
/// `deleted` condition, an audit) failed: when the database could not bind
/// it, the job file's error naming `key` (exit 2), with the database's
/// message, `what` the fragment is, and `hint`; any other error as it was.
/// The caller's transaction rolls back: nothing was changed.
pub(crate) fn fragment_error(job: &Job, key: &str, what: &str, hint: String, e: Error) -> Error {
    match e {
        Error::Database { engine, message, .. } if is_binding_error(&message) => {
            // DuckDB quotes the statement around the error (`LINE 1: …`):
            // fixpoint's SQL, not the user's; the rest names what is wrong.
            let own = message.find("\nLINE ").map_or(message.as_str(), |i| &message[..i]);
            let own = own.lines().map(str::trim).filter(|l| !l.is_empty()).collect::<Vec<_>>().join(" ");
            job.spec_error(key, format!("{what} does not run on {engine}: {own}; nothing was changed"), hint)
        }
        other => other,
    }
}

/// Whether a column of type `ty` can hold a run's day: a DATE (or a
/// timestamp, equal to the run date at midnight; a NULL literal's type,
/// whose rows the guard refuses as outside the day).
fn is_day_type(ty: &str) -> bool {
    let family = crate::schema::type_family(ty);
    matches!(family.trim_matches('"'), "date" | "timestamp" | "timestamptz" | "timestamp_ntz" | "timestamp_ltz" | "null")
}

fn fingerprinted<'c>(columns: &'c [Column], metadata: &[String]) -> Vec<Column> {
    columns.iter().filter(|c| !metadata.contains(&c.name)).cloned().collect()
}

fn replace_partition(job: &Job, run_date: RunDate, engine: &mut dyn Engine, opts: &RunOptions) -> Result<RunReport> {
    let started = Instant::now();
    let report = with_input(job, run_date, engine, |engine, input| {
        if engine.transactional() {
            replace_partition_with(job, run_date, engine, opts, input, started)
        } else {
            crate::overwrite::replace_partition_with(job, run_date, engine, opts, input, started)
        }
    })?;
    Ok(report.unwrap_or_else(|| no_files_report(job, run_date, started)))
}

/// The source has the partition column, as a date, and each column once.
pub(crate) fn check_source_columns(job: &Job, source_cols: &[Column], partition: &str) -> Result<()> {
    let Some(p) = source_cols.iter().find(|c| c.name == partition) else {
        return Err(Error::Schema {
            message: format!("the source query of job {} has no column {partition:?} (the job's partition column)", job.name),
            hint: Some(format!("select the run's date as {partition}, e.g. `SELECT …, :run_date AS {partition}`")),
        });
    };
    // Every run compares it with the run date (`= :run_date`, a DATE):
    // another type (an integer day 20261020, a text) never matches, and
    // the engines refuse the comparison mid-run.
    if !is_day_type(&p.ty) {
        return Err(job.spec_error(
            "partition",
            format!(
                "the partition column {partition} is {} in the source query, but replace_partition compares it with the run date (`{partition} = :run_date`, a DATE): it must be a DATE; nothing was changed",
                p.ty
            ),
            format!(
                "return the day as a DATE in the source query (e.g. `CAST(… AS DATE) AS {partition}`, or `:run_date AS {partition}` in a query filtered to the day) into a target whose {partition} is a DATE, or set `partition` to a DATE column of the source"
            ),
        ));
    }
    let mut seen = std::collections::HashSet::new();
    if let Some(dup) = source_cols.iter().find(|c| !seen.insert(c.name.as_str())) {
        return Err(Error::Schema {
            message: format!("the source query returns the column {:?} twice", dup.name),
            hint: Some("give each output column its own name with AS".into()),
        });
    }
    Ok(())
}

fn replace_partition_with(job: &Job, run_date: RunDate, engine: &mut dyn Engine, opts: &RunOptions, run_input: &RunInput, started: Instant) -> Result<RunReport> {
    let mut trace = Trace::new();
    let started_at = chrono::Utc::now().naive_utc();
    let partition = job.partition.as_deref().ok_or_else(|| Error::Internal("replace_partition without partition".into()))?;
    let mut params = run_input.params.clone();

    // 1. Describe the source and check it fits the target.
    let source_cols = describe_source(job, engine, &params)?;
    trace.step("describe source");
    check_source_columns(job, &source_cols, partition)?;
    let target_cols = engine.table_columns(&job.target)?;
    // Schema drift: refused (naming the columns), or new columns to add in
    // the run's transaction.
    let added = crate::schema::reconcile(engine, job, &source_cols, target_cols.as_deref())?;
    let target_cols = target_cols.map(|mut cols| {
        cols.extend(added.iter().cloned());
        cols
    });
    trace.step("describe");
    let input_cols = fingerprinted(&source_cols, &job.metadata);
    let output_cols = match &target_cols {
        Some(cols) => fingerprinted(cols, &job.metadata),
        None => input_cols.clone(),
    };

    in_transaction(engine, |engine| {
        fence(engine, job, &run_date.to_string(), opts)?;
        ledger::ensure(engine)?;
        trace.step("begin, ledger");

        // 2. Guards and input fingerprint in one scan of the source.
        let job_hash = job.definition_hash();
        let file_key = run_input.file_key(&job_hash, run_date);
        let scope = Scope::Table { table: &job.target, filter: Some(Filter::DateEquals(partition, run_date.date())) };
        let last = if !opts.force && target_cols.is_some() {
            ledger::entries_of_existing(engine, Some(&job.name), Some(run_date), Some(1))?.into_iter().next()
        } else {
            None
        };
        trace.step("ledger lookup");

        // How the day is changed: swapped in whole when the target is
        // partitioned by day (partition exchange), else delete + insert.
        // With `swap = "delete_insert"` never swapped: a reader whose
        // snapshot predates the run (REPEATABLE READ, SERIALIZABLE,
        // pg_dump) would find the swapped-in partition's rows too new for
        // it, an empty day; deleted rows it still sees (MVCC).
        let layout = match &target_cols {
            Some(_) => engine.day_partition(&job.target, partition, run_date.date())?,
            None => DayPartition::NotPartitioned,
        };
        let exchange = job.swap == Swap::Exchange && matches!(layout, DayPartition::Swappable { .. });
        trace.step("layout");

        // A file source's run key is known from its files: a retry over the
        // same files, with the partition as recorded, reads no row.
        if let Some(key) = &file_key {
            params.run_key = key.clone();
        }
        if let (Some(last), Some(key)) = (&last, &file_key) {
            if let Some(now) = unchanged(engine, &layout, &scope, &output_cols, last, key)? {
                trace.step("target fp");
                let input = Fingerprint { kind: last.fingerprint_kind.clone(), rows: last.input_rows, checksum: last.input_checksum.clone() };
                return Ok(skipped(job, run_date, key, &input, &now, started));
            }
        }

        // 2. Guards before anything is deleted, in one scan of the source.
        //    The input fingerprint is taken in the same scan when it is
        //    needed before writing: to decide a skip, to bind :run_key, or
        //    because the target's columns differ from the source's. Otherwise
        //    the guards only count (cheap), and the fingerprint is taken once,
        //    of the partition as written, in the same transaction.
        let before_writing = (file_key.is_none() && (last.is_some() || job.source.template().uses_any(&[RunParam::RunKey])))
            || output_cols != input_cols
            || engine.fingerprint_before_writing();
        // Or, when nothing needs them before writing and the engine can tap
        //    the insert (DuckDB), the guards and the output fingerprint are
        //    taken as the rows stream into the delete + insert, and a failed
        //    guard rolls both back: nothing changes either way, with no scan
        //    of its own (see `Engine::tap_partition`).
        let is_date = |cols: &[Column]| cols.iter().any(|c| c.name == partition && c.ty.eq_ignore_ascii_case("DATE"));
        let tapped = if !before_writing
            && !exchange
            && !matches!(opts.fault, Some((FailPoint::MidInsert, _)))
            && is_date(&source_cols)
            && target_cols.as_deref().is_none_or(is_date)
        {
            // (Only a token: nothing is kept until the insert's rows arrive.)
            engine.tap_partition(&format!("s.{}", quote_ident(partition)), "s", &input_cols, run_date.date())
        } else {
            None
        };
        let tap = tapped.is_some();
        let (select, kind, signature) = if before_writing {
            fingerprint_select(engine, Method::Native, "s", &input_cols)?
        } else {
            ("count(*), 0".to_owned(), fingerprint_kind(engine, Method::Native)?, Vec::new())
        };
        let out_of_partition = |engine: &mut dyn Engine, params: &RunParams, rows: u64| -> Result<Error> {
            let mut sql = Sql::new();
            sql.push("SELECT * FROM ");
            Scope::Source { template: job.source.template(), params }.write_from(&mut sql, "s");
            sql.push(" WHERE s.").ident(partition).push(" IS DISTINCT FROM ");
            sql.typed_param(Value::Date(run_date.date()), "DATE").push(" LIMIT 1");
            Ok(Error::OutOfPartition { rows, column: partition.to_owned(), run_date: run_date.to_string(), sample: first_row(engine, &sql)? })
        };
        let (input_rows, sum) = if tap {
            (0, 0)
        } else {
            let mut sql = Sql::new();
            sql.push("SELECT ").push(&select).push(", count(*) FILTER (WHERE s.").ident(partition);
            sql.push(" IS DISTINCT FROM ");
            sql.typed_param(Value::Date(run_date.date()), "DATE").push(") FROM ");
            Scope::Source { template: job.source.template(), params: &params }.write_from(&mut sql, "s");
            let row = engine.query(&sql)?.rows.into_iter().next().ok_or_else(|| Error::Internal("guard scan returned no row".into()))?;
            let input_rows = row[0].as_u64().ok_or_else(|| Error::Internal("bad count".into()))?;
            let sum = engine.read_sum(&row[1])?;
            let outside = row[2].as_u64().ok_or_else(|| Error::Internal("bad count".into()))?;
            if outside > 0 {
                return Err(out_of_partition(engine, &params, outside)?);
            }
            if let Some(min) = job.min_rows {
                if input_rows < min {
                    return Err(Error::TooFewRows { rows: input_rows, min_rows: min, run_date: run_date.to_string() });
                }
            }
            trace.step("guards");
            (input_rows, sum)
        };
        let early_input = before_writing.then(|| Fingerprint::from_sum(&kind, &signature, input_rows, sum));
        if let (Some(input), None) = (&early_input, &file_key) {
            params.run_key = run_key(&job_hash, run_date, input);
        }

        // 3. A retry over the same input, with the target still holding the
        //    recorded output, has nothing to do.
        if let (Some(last), Some(input), None) = (&last, &early_input, &file_key) {
            if last.fingerprint_kind == input.kind {
                if let Some(now) = unchanged(engine, &layout, &scope, &output_cols, last, &params.run_key)? {
                    trace.step("target fp");
                    return Ok(skipped(job, run_date, &params.run_key, input, &now, started));
                }
            }
        }
        opts.step(FailPoint::AfterGuards)?;

        // 4. Create the target from the source's columns when missing, or
        //    add the source's new columns (on_schema_change).
        crate::schema::append(engine, &job.target, &added)?;
        let created_target = target_cols.is_none();
        if created_target {
            engine.execute(&Sql::raw(format!("CREATE SCHEMA IF NOT EXISTS {}", quote_ident(&job.target.schema))))?;
            let cols: Vec<String> = source_cols.iter().map(|c| format!("{} {}", quote_ident(&c.name), c.ty)).collect();
            engine.execute(&Sql::raw(format!("CREATE TABLE {} ({})", job.target.quoted(), cols.join(", "))))?;
        }

        let col_list = source_cols.iter().map(|c| quote_ident(&c.name)).collect::<Vec<_>>().join(", ");
        let insert_tapped = |into: &TableName, limit: Option<u64>, tapped: Option<&Sql>| {
            let mut sql = Sql::new();
            sql.push("INSERT INTO ").push(&into.quoted()).push(" (").push(&col_list).push(") SELECT ");
            for (i, c) in source_cols.iter().enumerate() {
                if i > 0 {
                    sql.push(", ");
                }
                match tapped {
                    Some(t) if c.name == partition => {
                        sql.text.push_str(&t.text);
                        sql.params.extend(t.params.iter().cloned());
                    }
                    _ => {
                        sql.push(&format!("s.{}", quote_ident(&c.name)));
                    }
                }
            }
            sql.push(" FROM ");
            Scope::Source { template: job.source.template(), params: &params }.write_from(&mut sql, "s");
            if let Some(n) = limit {
                sql.push(" LIMIT ").typed_param(Value::Int(n as i64), "BIGINT");
            }
            sql
        };
        let insert = |into: &TableName, limit: Option<u64>| insert_tapped(into, limit, None);
        let (rows_deleted, rows_inserted, method, staged_fp) = match &layout {
            // 5a. Partition exchange: build the day as a standalone table
            //     (readers still see the old day, unblocked), then detach the
            //     old partition and attach the new one, in this transaction.
            DayPartition::Swappable { existing } if exchange => {
                let staged = engine.create_day_table(&job.target, partition, run_date.date())?;
                if matches!(opts.fault, Some((FailPoint::MidInsert, _))) {
                    engine.execute(&insert(&staged, Some(input_rows / 2)))?;
                    opts.step(FailPoint::MidInsert)?;
                }
                let rows_inserted = engine.execute(&insert(&staged, None))?;
                trace.step("insert (staged)");
                opts.step(FailPoint::AfterInsert)?;
                let staged_fp = match &early_input {
                    Some(input) if output_cols == input_cols => Some(input.clone()),
                    _ => Some(fingerprint(engine, Method::Native, &Scope::Table { table: &staged, filter: None }, &output_cols)?),
                };
                trace.step("output fp");
                let (rows_deleted, name) = match existing {
                    Some(old) => {
                        let mut sql = Sql::new();
                        sql.push("SELECT count(*) FROM ").push(&old.quoted());
                        let n = engine.query(&sql)?.rows[0][0].as_u64().ok_or_else(|| Error::Internal("bad count".into()))?;
                        engine.drop_partition(&job.target, old)?;
                        (n, old.table.clone())
                    }
                    None => (0, day_partition_name(&job.target.table, run_date)),
                };
                opts.step(FailPoint::AfterDelete)?;
                engine.attach_day(&job.target, &staged, partition, run_date.date(), &name)?;
                trace.step("swap");
                (rows_deleted, rows_inserted, "partition exchange", staged_fp)
            }
            // 5b. Delete the partition, insert the source's rows.
            _ => {
                // `swap = "delete_insert"` on a target partitioned by day
                // with no partition for this day yet: the insert needs one.
                // Created empty, in this transaction (a reader with an
                // older snapshot saw no rows of the day, and sees none).
                if let DayPartition::Swappable { existing: None } = &layout {
                    let empty = engine.create_day_table(&job.target, partition, run_date.date())?;
                    engine.attach_day(&job.target, &empty, partition, run_date.date(), &day_partition_name(&job.target.table, run_date))?;
                    trace.step("day partition");
                }
                let mut sql = Sql::new();
                sql.push("DELETE FROM ").push(&job.target.quoted()).push(" WHERE ").ident(partition).push(" = ");
                sql.typed_param(Value::Date(run_date.date()), "DATE");
                let rows_deleted = engine.execute(&sql)?;
                trace.step("delete");
                opts.step(FailPoint::AfterDelete)?;
                if matches!(opts.fault, Some((FailPoint::MidInsert, _))) {
                    engine.execute(&insert(&job.target, Some(input_rows / 2)))?;
                    opts.step(FailPoint::MidInsert)?;
                }
                let (rows_inserted, tapped_fp) = match &tapped {
                    None => (engine.execute(&insert(&job.target, None))?, None),
                    Some((expr, token)) => {
                        let inserted = engine.execute(&insert_tapped(&job.target, None, Some(expr)));
                        let seen = engine.tap_close(*token);
                        let inserted = inserted?;
                        let (seen, outside, sum) = seen.ok_or_else(|| Error::Internal("the insert's tap was lost".into()))?;
                        if seen > inserted {
                            // The tap must see each inserted row once: its
                            // fingerprint would be wrong.
                            return Err(Error::Internal(format!("the insert's tap saw {seen} rows but {inserted} were inserted; rolled back")));
                        }
                        // A NULL partition is not seen by the tap: outside too.
                        let outside = outside + inserted.saturating_sub(seen);
                        if outside > 0 {
                            return Err(out_of_partition(engine, &params, outside)?);
                        }
                        if let Some(min) = job.min_rows {
                            if inserted < min {
                                return Err(Error::TooFewRows { rows: inserted, min_rows: min, run_date: run_date.to_string() });
                            }
                        }
                        let signature: Vec<String> = output_cols.iter().map(|c| format!("{} {}", c.name, c.ty)).collect();
                        (inserted, Some(Fingerprint::from_sum(&kind, &signature, inserted, sum)))
                    }
                };
                trace.step(if tapped_fp.is_some() { "insert (guards and fingerprint tapped)" } else { "insert" });
                opts.step(FailPoint::AfterInsert)?;
                (rows_deleted, rows_inserted, "delete+insert", tapped_fp)
            }
        };
        let input_rows = if tap { rows_inserted } else { input_rows };

        // 6. Fingerprint what was written, check it, record it.
        // The partition now holds exactly the source rows (the guard proved
        // every one belongs to it, the delete removed every other). When the
        // input was fingerprinted before writing and the target's
        // fingerprinted columns are the source's (same names, types, order),
        // that scan (same transaction, same snapshot) is the output's
        // fingerprint; otherwise scan the partition as written.
        let output = match (&early_input, staged_fp) {
            (_, Some(staged)) => staged,
            (Some(input), None) if output_cols == input_cols => input.clone(),
            _ => fingerprint(engine, Method::Native, &scope, &output_cols)?,
        };
        let input = early_input.unwrap_or_else(|| output.clone());
        let key = file_key.unwrap_or_else(|| run_key(&job_hash, run_date, &input));
        trace.step("output fp");
        if rows_inserted != input_rows || output.rows != input_rows {
            return Err(Error::Internal(format!(
                "the source gave {input_rows} rows but {rows_inserted} were inserted and the partition holds {}; rolled back",
                output.rows
            )));
        }
        // 7. Audit the day as it will be published (inside the transaction:
        //    a blocking failure rolls everything back).
        let audits = if job.audits.is_empty() {
            Vec::new()
        } else {
            let previous = if rows_deleted > 0 {
                Some(rows_deleted)
            } else {
                // A new day: compare with the day before.
                let mut sql = Sql::new();
                sql.push("SELECT count(*) FROM ").push(&job.target.quoted()).push(" WHERE ").ident(partition).push(" = ");
                sql.typed_param(Value::Date(run_date.date() - chrono::Duration::days(1)), "DATE");
                engine.query(&sql)?.rows.first().and_then(|r| r[0].as_u64())
            };
            let from = |sql: &mut Sql| {
                sql.push("(SELECT * FROM ");
                scope.write_from(sql, "s");
                sql.push(") AS a");
            };
            let scope = crate::audit::AuditScope { from: &from, previous_rows: previous, run_date: run_date.date() };
            let results = crate::audit::audit(job, engine, &scope)?;
            trace.step("audits");
            results
        };
        let mut report = RunReport::new(job, run_date, key, "committed", &input, &output);
        report.rows_deleted = rows_deleted;
        report.rows_inserted = rows_inserted;
        report.created_target = created_target;
        report.audits = audits;
        report.input_files = run_input.files.clone();
        report.method = method.into();
        report.method_note = match &layout {
            DayPartition::Unswappable(why) if job.swap == Swap::Exchange => Some(format!("no partition exchange: {why}")),
            DayPartition::Swappable { existing: Some(p) } if !exchange => {
                Some(format!("no partition exchange: the job has swap = \"delete_insert\" (the day's rows were deleted from {p} and the new ones inserted)"))
            }
            DayPartition::Swappable { existing: None } if !exchange => Some(format!(
                "no partition exchange: the job has swap = \"delete_insert\" (the day's partition {} was created empty, then inserted into)",
                TableName { schema: job.target.schema.clone(), table: day_partition_name(&job.target.table, run_date) }
            )),
            _ => None,
        };
        ledger::record(engine, &entry(job, &job_hash, &report, started_at))?;
        opts.step(FailPoint::BeforeCommit)?;
        trace.step("ledger row");
        Ok(report)
    })
    .map(|mut r| {
        trace.step("commit");
        r.elapsed_ms = elapsed_ms(started);
        r
    })
}

/// The partition's fingerprint now, when the ledger's last entry has run key
/// `key` and the partition still holds its recorded output; `None` otherwise.
fn unchanged(
    engine: &mut dyn Engine,
    layout: &DayPartition,
    scope: &Scope<'_>,
    output_cols: &[Column],
    last: &ledger::Entry,
    key: &str,
) -> Result<Option<Fingerprint>> {
    if last.run_key != key {
        return Ok(None);
    }
    // With partition exchange, read the day's partition itself, not the
    // parent: a lock on the parent held from here would make two runs of
    // different days deadlock at their swaps.
    let now = match layout {
        DayPartition::Swappable { existing: Some(p) } => fingerprint(engine, Method::Native, &Scope::Table { table: p, filter: None }, output_cols)?,
        DayPartition::Swappable { existing: None } => {
            let (_, kind, signature) = fingerprint_select(engine, Method::Native, "fp", output_cols)?;
            Fingerprint::from_sum(&kind, &signature, 0, 0)
        }
        _ => fingerprint(engine, Method::Native, scope, output_cols)?,
    };
    let same = now.kind == last.fingerprint_kind && now.rows == last.output_rows && now.checksum == last.output_checksum;
    Ok(same.then_some(now))
}

/// The report of a retry that found its output in place. Nothing changed,
/// so nothing is recorded.
pub(crate) fn skipped(job: &Job, run_date: RunDate, key: &str, input: &Fingerprint, now: &Fingerprint, started: Instant) -> RunReport {
    let mut report = RunReport::new(job, run_date, key.to_owned(), "skipped", input, now);
    report.skip_reason = Some("the partition already holds this run's output (same run key, same output fingerprint); use --force to rewrite it".into());
    report.rows_unchanged = now.rows;
    report.method = "none".into();
    report.elapsed_ms = elapsed_ms(started);
    report
}

/// The name of a new day partition: `<table>_<yyyymmdd>`, the table part
/// shortened to keep within PostgreSQL's 63-byte identifiers.
fn day_partition_name(table: &str, day: RunDate) -> String {
    let suffix = day.date().format("_%Y%m%d").to_string();
    let mut head = table.to_owned();
    while head.len() + suffix.len() > 63 {
        head.pop();
    }
    head + &suffix
}

pub(crate) fn entry(job: &Job, job_hash: &str, r: &RunReport, started_at: chrono::NaiveDateTime) -> ledger::Entry {
    ledger::Entry {
        run_key: r.run_key.clone(),
        job: job.name.clone(),
        job_hash: job_hash.to_owned(),
        strategy: r.strategy.clone(),
        target: r.target.clone(),
        run_date: r.run_date.clone(),
        outcome: r.outcome.clone(),
        fingerprint_kind: r.fingerprint_kind.clone(),
        input_rows: r.input_rows,
        input_checksum: r.input_checksum.clone(),
        output_rows: r.output_rows,
        output_checksum: r.output_checksum.clone(),
        rows_deleted: r.rows_deleted,
        rows_inserted: r.rows_inserted,
        rows_updated: r.rows_updated,
        rows_unchanged: r.rows_unchanged,
        duplicates_collapsed: r.duplicates_collapsed,
        started_at,
        finished_at: chrono::Utc::now().naive_utc(),
        fixpoint_version: env!("CARGO_PKG_VERSION").to_owned(),
        audits: r.audits.clone(),
        input_files: r.input_files.clone(),
    }
}

/// The first row of a query, for error samples.
pub fn first_row(engine: &mut dyn Engine, sql: &Sql) -> Result<SampleRow> {
    let rows = engine.query(sql)?;
    let values = rows.rows.into_iter().next().unwrap_or_default();
    Ok(SampleRow(rows.columns.into_iter().zip(values.iter().map(Value::display)).collect()))
}
