//! Backfill (a loop over dates that resumes and skips what is done) and
//! status (what the ledger, the target and the source say about each date).

use serde::Serialize;

use crate::job::date::RunDate;
use crate::engine::measure::{fingerprint, Filter, Scope};
use crate::engine::{Column, Engine};
use crate::error::{Error, Result};
use crate::job::files::InputFiles;
use crate::fingerprint::{Fingerprint, Method};
use crate::run::ledger::{self, Entry};
use crate::run::input::describe_source;
use crate::run::protocol::RunOptions;
use crate::run::report::RunReport;
use crate::fingerprint::runkey::run_key;
use crate::job::spec::{Job, Strategy};
use crate::job::sql::RunParams;

/// What happened to one date of a backfill.
#[derive(Debug)]
pub enum DateOutcome {
    /// The run committed or was skipped.
    Done(RunReport),
    /// The run failed; nothing of it was committed.
    Failed(RunDate, Error),
    /// Not attempted (an earlier date failed and `keep_going` was off).
    NotRun(RunDate),
}

/// Options of a backfill.
#[derive(Debug, Clone, Default)]
pub struct BackfillOptions {
    /// Options passed to every run.
    pub run: RunOptions,
    /// Go on after a failed date.
    pub keep_going: bool,
    /// Apply `run.fault` only on this date (tests: a failure on one date).
    pub fault_date: Option<RunDate>,
}

/// The dates of `dates` that a run would skip as done — the ledger's latest
/// entry has the run key a run would have now, and the target's partition
/// still holds that entry's recorded output — with the reports of those
/// skips. Decided for all the dates at once ([`look`]: one ledger query and
/// one grouped fingerprint of the target's partitions) instead of a
/// transaction, a ledger lookup and a partition scan per date. Each
/// candidate date's input is still fingerprinted (a SQL source's rows are
/// read; a file source's files are hashed), so a late row or a changed file
/// is never skipped, and a partition changed by hand is never taken for done.
///
/// Only `replace_partition` jobs are decided here; for anything else (and
/// for a date whose input cannot be read now: its run reports why) the map
/// has no entry and the date simply runs, where the run makes the same
/// decision inside its own transaction. Nothing is written.
pub fn done_dates(job: &Job, dates: &[RunDate], engine: &mut dyn Engine) -> Result<std::collections::HashMap<RunDate, RunReport>> {
    let started = std::time::Instant::now();
    let mut out = std::collections::HashMap::new();
    if job.strategy != Strategy::ReplacePartition {
        return Ok(out);
    }
    let mut source_cols = None;
    for (d, last, current) in look(job, dates, engine)? {
        let (Some(last), Some(here)) = (last, current) else { continue };
        if !holds(&here, &last) {
            continue;
        }
        let Ok(now) = input_now(job, d, engine, &mut source_cols) else { continue };
        // A file source keyed on its files: the input is the one recorded.
        let input = now.input.unwrap_or_else(|| Fingerprint { kind: last.fingerprint_kind.clone(), rows: last.input_rows, checksum: last.input_checksum.clone() });
        if !now.key.is_empty() && now.key == last.run_key && input.kind == last.fingerprint_kind {
            out.insert(d, crate::run::report::skipped(job, d, &now.key, &input, &here, started));
        }
    }
    Ok(out)
}

/// For each of `dates`: the ledger's latest entry, and (`replace_partition`,
/// when the target exists) the partition's native fingerprint now. One
/// ledger query; one grouped scan of the range's partitions when the
/// partition column is a `DATE` (else one scan per date).
fn look(job: &Job, dates: &[RunDate], engine: &mut dyn Engine) -> Result<Vec<(RunDate, Option<Entry>, Option<Fingerprint>)>> {
    let (Some(&from), Some(&to)) = (dates.iter().min(), dates.iter().max()) else { return Ok(Vec::new()) };
    let mut ledger = ledger::latest_per_date(engine, &job.name, from, to)?;
    let mut current: std::collections::HashMap<RunDate, Fingerprint> = std::collections::HashMap::new();
    let target_cols = match (job.strategy, &job.partition) {
        (Strategy::ReplacePartition, Some(_)) => engine.table_columns(&job.target)?,
        _ => None,
    };
    if let (Some(cols), Some(partition)) = (&target_cols, job.partition.as_deref()) {
        let output_cols = fingerprinted(cols, &job.metadata);
        if cols.iter().any(|c| c.name == partition && c.ty.eq_ignore_ascii_case("date")) {
            let fp = crate::engine::measure::fingerprint_select(engine, Method::Native, "t", &output_cols)?;
            let mut sql = crate::job::sql::Sql::new();
            sql.push("SELECT CAST(t.").ident(partition).push(" AS VARCHAR) AS \"day\", ").push(&fp.select);
            sql.push(" FROM ").push(&job.target.quoted()).push(" AS t WHERE t.").ident(partition).push(" >= ");
            sql.typed_param(crate::job::sql::Value::Date(from.date()), "DATE");
            sql.push(" AND t.").ident(partition).push(" <= ");
            sql.typed_param(crate::job::sql::Value::Date(to.date()), "DATE");
            sql.push(" GROUP BY t.").ident(partition);
            let mut found = std::collections::HashMap::new();
            let grouped = engine.query(&sql)?;
            for row in grouped.each("the days' fingerprints") {
                let day = row.value("day")?;
                let Some(day) = day.as_str().and_then(|d| RunDate::parse(d).ok()) else {
                    return Err(Error::Internal(format!("the days' fingerprints: a day came back as {day:?}")));
                };
                found.insert(day, fp.read(&row, engine)?);
            }
            for &d in dates {
                let fp = found.remove(&d).unwrap_or_else(|| fp.of(0, 0));
                current.insert(d, fp);
            }
        } else {
            for &d in dates {
                let scope = Scope::Table { table: &job.target, filter: Some(Filter::DateEquals(partition, d.date())) };
                current.insert(d, fingerprint(engine, Method::Native, &scope, &output_cols)?);
            }
        }
    }
    Ok(dates.iter().map(|&d| (d, ledger.remove(&d.to_string()), current.remove(&d))).collect())
}

/// What a run for a date would start from now.
struct Now {
    /// Its run key (empty: a file source's day without files).
    key: String,
    /// The input fingerprint, when the source's rows were read for it
    /// (`None` for a file source keyed on its files alone).
    input: Option<Fingerprint>,
    /// A file source's files.
    files: Option<InputFiles>,
    /// Why a file source has no input, when it has none.
    note: Option<String>,
}

/// The run key and input a run for `run_date` would have now. A SQL
/// source is described once (`source_cols` keeps its columns: they do not
/// depend on the values bound); a file source's files are matched and
/// hashed once, and read only when its query also reads tables. A day
/// without files under `allow_missing` has the empty key (which no run
/// has); missing or unreadable files otherwise are an error, as in a run.
fn input_now(job: &Job, run_date: RunDate, engine: &mut dyn Engine, source_cols: &mut Option<Vec<Column>>) -> Result<Now> {
    let job_hash = job.definition_hash();
    let no_files = |source: &crate::job::files::FileSource| Now {
        key: String::new(),
        input: None,
        files: None,
        note: Some(format!("no file matches {} (allow_missing = true: a run leaves the date as it is)", source.expand(run_date).display())),
    };
    if let (Some(source), true) = (&job.source.files, job.source.key_from_files()) {
        return Ok(match source.resolve(run_date)? {
            Some(files) => Now { key: run_key(&job_hash, run_date, &files.fingerprint()), input: None, files: Some(files), note: None },
            None => no_files(source),
        });
    }
    let fixed = job.source.files.is_none();
    let read = crate::run::input::with_input(job, run_date, engine, |engine, input| {
        let params: &RunParams = &input.params;
        let cols = match source_cols {
            Some(c) if fixed => c.clone(),
            _ => describe_source(job, engine, params)?,
        };
        let input_cols = fingerprinted(&cols, &job.metadata);
        let fp = fingerprint(engine, Method::Native, &Scope::Source { template: job.source.template(), params }, &input_cols)?;
        if fixed {
            *source_cols = Some(cols);
        }
        Ok((fp, input.files.clone()))
    })?;
    Ok(match (read, &job.source.files) {
        (Some((fp, files)), _) => Now { key: run_key(&job_hash, run_date, &fp), input: Some(fp), files, note: None },
        (None, Some(source)) => no_files(source),
        (None, None) => return Err(Error::Internal("a SQL source without input".into())),
    })
}

/// Whether `fp` is the output `entry` recorded (same kind, rows and checksum).
fn holds(fp: &Fingerprint, entry: &Entry) -> bool {
    (fp.kind.as_str(), fp.rows, fp.checksum.as_str()) == (entry.fingerprint_kind.as_str(), entry.output_rows, entry.output_checksum.as_str())
}

/// Runs `job` for every date of `dates`, in order. Each date is its own
/// transaction, so a backfill killed midway and started again ends in the
/// state of an uninterrupted one: done dates are skipped (same run key, the
/// partition still holds the recorded output), the rest run. Without
/// `--force` the done dates are found first, all at once ([`done_dates`]).
pub fn backfill(
    job: &Job,
    dates: &[RunDate],
    engine: &mut dyn Engine,
    opts: &BackfillOptions,
    mut progress: impl FnMut(&DateOutcome),
) -> Vec<DateOutcome> {
    let mut out = Vec::with_capacity(dates.len());
    let mut stopped = false;
    let mut done = probe(job, dates, engine, opts);
    for &d in dates {
        if stopped {
            out.push(DateOutcome::NotRun(d));
            continue;
        }
        if let Some(report) = done.remove(&d) {
            opts.run.observe_done(job, d, &report, Some(&mut *engine));
            let outcome = DateOutcome::Done(report);
            progress(&outcome);
            out.push(outcome);
            continue;
        }
        let mut run = opts.run.clone();
        if opts.fault_date.is_some_and(|f| f != d) {
            run.fault = None;
        }
        let outcome = match job.load_with(d, engine, &run) {
            Ok(r) => DateOutcome::Done(r),
            Err(e) => {
                stopped = !opts.keep_going;
                DateOutcome::Failed(d, e)
            }
        };
        progress(&outcome);
        out.push(outcome);
    }
    out
}

/// [`backfill`] with `workers` dates in flight at once, each worker on its
/// own connection from `connect` (an engine with many writers: PostgreSQL).
/// Every date is still its own transaction under its own lock, so the end
/// state is that of the sequential backfill. After a failed date (without
/// `keep_going`) no new date starts; dates already running finish. Outcomes
/// come back in date order; `progress` sees them as they finish.
pub fn backfill_parallel(
    job: &Job,
    dates: &[RunDate],
    workers: usize,
    connect: &(dyn Fn() -> Result<Box<dyn Engine>> + Sync),
    opts: &BackfillOptions,
    mut progress: impl FnMut(&DateOutcome),
) -> Vec<DateOutcome> {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    let next = AtomicUsize::new(0);
    let stopped = AtomicBool::new(false);
    let mut out: Vec<Option<DateOutcome>> = (0..dates.len()).map(|_| None).collect();
    // The done dates first, on a connection of their own; the workers take the rest.
    let mut done = match connect() {
        Ok(mut e) => probe(job, dates, e.as_mut(), opts),
        Err(_) => std::collections::HashMap::new(),
    };
    let mut todo = Vec::with_capacity(dates.len());
    for (i, d) in dates.iter().enumerate() {
        match done.remove(d) {
            Some(report) => {
                opts.run.observe_done(job, *d, &report, None);
                let outcome = DateOutcome::Done(report);
                progress(&outcome);
                out[i] = Some(outcome);
            }
            None => todo.push(i),
        }
    }
    let todo = &todo;
    std::thread::scope(|scope| {
        let (tx, rx) = std::sync::mpsc::channel::<(usize, DateOutcome)>();
        for _ in 0..workers.max(1).min(todo.len()) {
            let tx = tx.clone();
            let (next, stopped) = (&next, &stopped);
            scope.spawn(move || {
                let mut engine: Option<Box<dyn Engine>> = None;
                loop {
                    if stopped.load(Ordering::SeqCst) {
                        return;
                    }
                    let Some(&i) = todo.get(next.fetch_add(1, Ordering::SeqCst)) else { return };
                    let d = dates[i];
                    let mut run = opts.run.clone();
                    if opts.fault_date.is_some_and(|f| f != d) {
                        run.fault = None;
                    }
                    if engine.is_none() {
                        match connect() {
                            Ok(e) => engine = Some(e),
                            Err(e) => {
                                stopped.store(!opts.keep_going, Ordering::SeqCst);
                                let _ = tx.send((i, DateOutcome::Failed(d, e)));
                                continue;
                            }
                        }
                    }
                    let conn = engine.as_mut().expect("connected").as_mut();
                    let outcome = match job.load_with(d, conn, &run) {
                        Ok(r) => DateOutcome::Done(r),
                        Err(e) => {
                            if !opts.keep_going {
                                stopped.store(true, Ordering::SeqCst);
                            }
                            // A connection that failed may be unusable: reconnect for the next date.
                            engine = None;
                            DateOutcome::Failed(d, e)
                        }
                    };
                    if tx.send((i, outcome)).is_err() {
                        return;
                    }
                }
            });
        }
        drop(tx);
        for (i, outcome) in rx {
            progress(&outcome);
            out[i] = Some(outcome);
        }
    });
    out.into_iter().zip(dates).map(|(o, &d)| o.unwrap_or(DateOutcome::NotRun(d))).collect()
}

/// [`done_dates`] for a backfill: none with `--force`; none either when the
/// probe itself fails (every date then runs, and its run reports the error).
fn probe(job: &Job, dates: &[RunDate], engine: &mut dyn Engine, opts: &BackfillOptions) -> std::collections::HashMap<RunDate, RunReport> {
    if opts.run.force {
        return std::collections::HashMap::new();
    }
    done_dates(job, dates, engine).unwrap_or_default()
}

/// The state of one date.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum DateState {
    /// Loaded; the target still holds the recorded output and the source
    /// has not changed.
    Ok,
    /// Never loaded.
    Missing,
    /// The target no longer holds the recorded output (someone changed it).
    Drift,
    /// The source changed since the last run (a late row arrived): rerun.
    SourceChanged,
    /// The job's definition changed since the last run: rerun.
    JobChanged,
    /// A file source has no (complete) files for the date now.
    NoInput,
}

impl DateState {
    /// Whether a date in this state needs a run or a look (what `fixpoint
    /// status` counts, and exits 4 for): every state but `ok`, except `no
    /// input` when the job allows a day without files (`allow_missing`: a
    /// run leaves such a day as it is, by design).
    pub fn needs_attention(self, allow_missing: bool) -> bool {
        match self {
            DateState::Ok => false,
            DateState::NoInput => !allow_missing,
            DateState::Missing | DateState::Drift | DateState::SourceChanged | DateState::JobChanged => true,
        }
    }
}

/// How many of `rows` need attention ([`DateState::needs_attention`], with
/// the job's `allow_missing`).
pub fn needing_attention(job: &Job, rows: &[DateStatus]) -> usize {
    let allow_missing = job.source.files.as_ref().is_some_and(|f| f.allow_missing);
    rows.iter().filter(|r| r.state.needs_attention(allow_missing)).count()
}

/// What fixpoint knows about one date.
#[derive(Debug, Clone, Serialize)]
pub struct DateStatus {
    /// The date.
    pub run_date: String,
    /// The verdict.
    pub state: DateState,
    /// The ledger's last entry for the date.
    pub last_run: Option<Entry>,
    /// The run key a run now would have.
    pub run_key_now: String,
    /// The source's rows now (not read for a file source); the rows of
    /// [`DateStatus::input_now`].
    #[serde(skip)]
    pub input_rows_now: Option<u64>,
    /// The target's rows of the date now (replace_partition), if known; the
    /// rows of [`DateStatus::output_now`].
    #[serde(skip)]
    pub rows_now: Option<u64>,
    /// The source's fingerprint now (`None` for a file source keyed on its
    /// files: no row is read).
    pub input_now: Option<Fingerprint>,
    /// The target's fingerprint of the date now (replace_partition, when the
    /// target exists).
    pub output_now: Option<Fingerprint>,
    /// A file source's files that differ from the last run's.
    pub files_changed: Vec<String>,
    /// Why a file source has no input for the date, when it has none.
    pub note: Option<String>,
}

fn fingerprinted(cols: &[Column], metadata: &[String]) -> Vec<Column> {
    cols.iter().filter(|c| !metadata.contains(&c.name)).cloned().collect()
}

/// The run key a run for `run_date` would have now, and the source's rows
/// (`None` for a file source, whose key comes from its files' hashes alone,
/// without reading a row). Nothing is written. A file source's day without
/// files (with `allow_missing`) has the empty key, which no run has.
pub fn run_key_now(job: &Job, run_date: RunDate, engine: &mut dyn Engine) -> Result<(String, Option<u64>)> {
    let now = input_now(job, run_date, engine, &mut None)?;
    Ok((now.key, now.input.map(|fp| fp.rows)))
}

/// How a file source's files now differ from those of the last run:
/// `changed x`, `added y`, `removed z`, in path order.
pub fn files_changed(before: &InputFiles, now: &InputFiles) -> Vec<String> {
    let mut out = Vec::new();
    for f in &now.files {
        match before.files.iter().find(|b| b.path == f.path) {
            None => out.push(format!("added {}", f.path)),
            Some(b) if (b.size, &b.blake3, &b.etag) != (f.size, &f.blake3, &f.etag) => out.push(format!("changed {}", f.path)),
            Some(_) => {}
        }
    }
    for b in &before.files {
        if !now.files.iter().any(|f| f.path == b.path) {
            out.push(format!("removed {}", b.path));
        }
    }
    out.sort_by(|a, b| a.split_once(' ').map(|x| x.1).cmp(&b.split_once(' ').map(|x| x.1)));
    out
}

/// Looks at one date without changing anything: the source's fingerprint and
/// run key now (for a file source, from the files' hashes, reading no row),
/// the ledger's last entry, and the target's fingerprint now.
pub fn status(job: &Job, run_date: RunDate, engine: &mut dyn Engine) -> Result<DateStatus> {
    let mut all = status_range(job, &[run_date], engine)?;
    all.pop().ok_or_else(|| Error::Internal("status of one date returned none".into()))
}

/// [`status`] of every date of `dates`, in their order, with one ledger
/// query and one grouped scan of the target's partitions (not one per date).
pub fn status_range(job: &Job, dates: &[RunDate], engine: &mut dyn Engine) -> Result<Vec<DateStatus>> {
    let job_hash = job.definition_hash();
    let mut source_cols = None;
    let mut out = Vec::with_capacity(dates.len());
    for (run_date, last, current) in look(job, dates, engine)? {
        // Missing or unreadable files are this date's state, not the command's failure.
        let now = match input_now(job, run_date, engine, &mut source_cols) {
            Err(e @ Error::Files { .. }) => Now { key: String::new(), input: None, files: None, note: Some(e.to_string()) },
            other => other?,
        };
        let key = now.key;
        let files_changed = match (&now.files, last.as_ref().and_then(|l| l.input_files.as_ref())) {
            (Some(now), Some(before)) => files_changed(before, now),
            _ => Vec::new(),
        };
        let state = match &last {
            None if job.source.files.is_some() && key.is_empty() => DateState::NoInput,
            None => DateState::Missing,
            Some(l) if current.as_ref().is_some_and(|c| c.kind == l.fingerprint_kind && !holds(c, l)) => DateState::Drift,
            Some(l) if l.job_hash != job_hash => DateState::JobChanged,
            Some(_) if key.is_empty() => DateState::NoInput,
            Some(l) if l.run_key != key => DateState::SourceChanged,
            Some(_) => DateState::Ok,
        };
        out.push(DateStatus {
            run_date: run_date.to_string(),
            state,
            last_run: last,
            run_key_now: key,
            input_rows_now: now.input.as_ref().map(|fp| fp.rows),
            rows_now: current.as_ref().map(|c| c.rows),
            input_now: now.input,
            output_now: current,
            files_changed,
            note: now.note,
        });
    }
    Ok(out)
}
