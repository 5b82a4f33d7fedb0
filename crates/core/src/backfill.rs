//! Backfill (a loop over dates that resumes and skips what is done) and
//! status (what the ledger, the target and the source say about each date).

use serde::Serialize;

use crate::date::RunDate;
use crate::engine::{fingerprint, Column, Engine, Filter, Scope};
use crate::error::{Error, Result};
use crate::files::InputFiles;
use crate::fingerprint::{Fingerprint, Method};
use crate::ledger::{self, Entry};
use crate::run::{describe_source, RunOptions, RunReport};
use crate::runkey::run_key;
use crate::spec::{Job, Strategy};
use crate::sql::RunParams;

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
/// skips. Decided for all the dates at once: one ledger query and one
/// grouped fingerprint of the target's partitions, instead of a transaction,
/// a ledger lookup and a partition scan per date. Each date's input is still
/// fingerprinted (a SQL source's rows are read; a file source's files are
/// hashed), so a late row or a changed file is never skipped, and a
/// partition changed by hand is never taken for done.
///
/// Only `replace_partition` jobs over a `DATE` partition column are decided
/// here; for anything else (and for a date whose input cannot be read: its
/// run reports why) the map has no entry and the date simply runs, where
/// the run makes the same decision inside its own transaction. Nothing is
/// written.
pub fn done_dates(job: &Job, dates: &[RunDate], engine: &mut dyn Engine) -> Result<std::collections::HashMap<RunDate, RunReport>> {
    let started = std::time::Instant::now();
    let mut out = std::collections::HashMap::new();
    let (Strategy::ReplacePartition, Some(partition), Some(&from), Some(&to)) =
        (job.strategy, job.partition.as_deref(), dates.iter().min(), dates.iter().max())
    else {
        return Ok(out);
    };
    let Some(target_cols) = engine.table_columns(&job.target)? else { return Ok(out) };
    if !target_cols.iter().any(|c| c.name == partition && c.ty.eq_ignore_ascii_case("date")) {
        return Ok(out);
    }
    let ledger = ledger::latest_per_date(engine, &job.name, from, to)?;
    if ledger.is_empty() {
        return Ok(out);
    }

    // The target's partitions of the range, fingerprinted in one grouped scan.
    let output_cols = fingerprinted(&target_cols, &job.metadata);
    let (hash, kind, signature) = crate::engine::row_hash(engine, Method::Native, "t", &output_cols)?;
    let sum = if output_cols.is_empty() { "0".to_owned() } else { format!("sum({hash})") };
    let mut sql = crate::sql::Sql::new();
    sql.push("SELECT CAST(t.").ident(partition).push(" AS VARCHAR), count(*), ").push(&sum);
    sql.push(" FROM ").push(&job.target.quoted()).push(" AS t WHERE t.").ident(partition).push(" >= ");
    sql.typed_param(crate::sql::Value::Date(from.date()), "DATE");
    sql.push(" AND t.").ident(partition).push(" <= ");
    sql.typed_param(crate::sql::Value::Date(to.date()), "DATE");
    sql.push(" GROUP BY t.").ident(partition);
    let mut now = std::collections::HashMap::new();
    for row in engine.query(&sql)?.rows {
        let (Some(day), Some(rows)) = (row[0].as_str(), row[1].as_u64()) else {
            return Err(Error::Internal(format!("a grouped fingerprint returned {row:?}")));
        };
        now.insert(day.to_owned(), Fingerprint::from_sum(&kind, &signature, rows, engine.read_sum(&row[2])?));
    }

    let job_hash = job.definition_hash();
    // A SQL source's columns do not depend on the values bound: describe it once.
    let mut source_cols: Option<Vec<Column>> = None;
    for &d in dates {
        let Some(last) = ledger.get(&d.to_string()) else { continue };
        let here = now.remove(&d.to_string()).unwrap_or_else(|| Fingerprint::from_sum(&kind, &signature, 0, 0));
        if (here.kind.as_str(), here.rows, here.checksum.as_str()) != (last.fingerprint_kind.as_str(), last.output_rows, last.output_checksum.as_str()) {
            continue;
        }
        let (key, input) = match (&job.source.files, job.source.key_from_files()) {
            (Some(source), true) => match source.resolve(d) {
                Ok(Some(files)) => {
                    let recorded = Fingerprint { kind: last.fingerprint_kind.clone(), rows: last.input_rows, checksum: last.input_checksum.clone() };
                    (run_key(&job_hash, d, &files.fingerprint()), recorded)
                }
                // No files (allowed or not) or unreadable ones: the run says so.
                _ => continue,
            },
            (Some(_), false) => match input_now(job, d, engine, None) {
                Ok(Some(k)) => k,
                _ => continue,
            },
            (None, _) => {
                if source_cols.is_none() {
                    let params = RunParams::new(d.date());
                    match describe_source(job, engine, &params) {
                        Ok(cols) => source_cols = Some(cols),
                        Err(_) => return Ok(out),
                    }
                }
                match input_now(job, d, engine, source_cols.as_deref()) {
                    Ok(Some(k)) => k,
                    _ => continue,
                }
            }
        };
        if key == last.run_key && input.kind == last.fingerprint_kind {
            out.insert(d, crate::run::skipped(job, d, &key, &input, &here, started));
        }
    }
    Ok(out)
}

/// The run key and input fingerprint a run for `run_date` would have now,
/// from the source's rows; `columns`: the source's columns when known.
/// `None`: a file source's day without files.
fn input_now(job: &Job, run_date: RunDate, engine: &mut dyn Engine, columns: Option<&[Column]>) -> Result<Option<(String, Fingerprint)>> {
    crate::run::with_input(job, run_date, engine, |engine, input| {
        let params: &RunParams = &input.params;
        let source_cols = match columns {
            Some(c) => c.to_vec(),
            None => describe_source(job, engine, params)?,
        };
        let input_cols = fingerprinted(&source_cols, &job.metadata);
        let fp = fingerprint(engine, Method::Native, &Scope::Source { template: job.source.template(), params }, &input_cols)?;
        Ok((run_key(&job.definition_hash(), run_date, &fp), fp))
    })
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
    /// The source's rows now (not read for a file source).
    pub input_rows_now: Option<u64>,
    /// The target's rows of the date now (replace_partition), if known.
    pub rows_now: Option<u64>,
    /// A file source's files that differ from the last run's.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub files_changed: Vec<String>,
    /// Why a file source has no input for the date, when it has none.
    #[serde(skip_serializing_if = "Option::is_none")]
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
    if let (Some(source), true) = (&job.source.files, job.source.key_from_files()) {
        return Ok(match source.resolve(run_date)? {
            Some(files) => (run_key(&job.definition_hash(), run_date, &files.fingerprint()), None),
            None => (String::new(), None),
        });
    }
    Ok(input_now(job, run_date, engine, None)?.map_or((String::new(), None), |(key, fp)| (key, Some(fp.rows))))
}

/// How a file source's files now differ from those of the last run:
/// `changed x`, `added y`, `removed z`, in path order.
pub fn files_changed(before: &InputFiles, now: &InputFiles) -> Vec<String> {
    let mut out = Vec::new();
    for f in &now.files {
        match before.files.iter().find(|b| b.path == f.path) {
            None => out.push(format!("added {}", f.path)),
            Some(b) if (b.size, &b.blake3) != (f.size, &f.blake3) => out.push(format!("changed {}", f.path)),
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
    let job_hash = job.definition_hash();
    let mut note = None;
    let mut files_now = None;
    let (key, input_rows_now) = match &job.source.files {
        Some(source) => match source.resolve(run_date) {
            Ok(Some(files)) if job.source.key_from_files() => {
                let key = run_key(&job_hash, run_date, &files.fingerprint());
                files_now = Some(files);
                (key, None)
            }
            Ok(Some(files)) => {
                files_now = Some(files);
                run_key_now(job, run_date, engine)?
            }
            Ok(None) => {
                note = Some(format!("no file matches {} (allow_missing = true: a run leaves the date as it is)", source.expand(run_date).display()));
                (String::new(), None)
            }
            Err(e @ Error::Files { .. }) => {
                note = Some(e.to_string());
                (String::new(), None)
            }
            Err(e) => return Err(e),
        },
        None => run_key_now(job, run_date, engine)?,
    };
    let last = ledger::entries(engine, Some(&job.name), Some(run_date), Some(1))?.into_iter().next();
    let current: Option<Fingerprint> = match (job.strategy, &job.partition, engine.table_columns(&job.target)?) {
        (Strategy::ReplacePartition, Some(p), Some(cols)) => {
            let scope = Scope::Table { table: &job.target, filter: Some(Filter::DateEquals(p, run_date.date())) };
            Some(fingerprint(engine, Method::Native, &scope, &fingerprinted(&cols, &job.metadata))?)
        }
        _ => None,
    };
    let files_changed = match (&files_now, last.as_ref().and_then(|l| l.input_files.as_ref())) {
        (Some(now), Some(before)) => files_changed(before, now),
        _ => Vec::new(),
    };
    let state = match &last {
        None if job.source.files.is_some() && key.is_empty() => DateState::NoInput,
        None => DateState::Missing,
        Some(l) if current.as_ref().is_some_and(|c| c.kind == l.fingerprint_kind && (c.rows, c.checksum.as_str()) != (l.output_rows, l.output_checksum.as_str())) => {
            DateState::Drift
        }
        Some(l) if l.job_hash != job_hash => DateState::JobChanged,
        Some(_) if key.is_empty() => DateState::NoInput,
        Some(l) if l.run_key != key => DateState::SourceChanged,
        Some(_) => DateState::Ok,
    };
    Ok(DateStatus {
        run_date: run_date.to_string(),
        state,
        last_run: last,
        run_key_now: key,
        input_rows_now,
        rows_now: current.map(|c| c.rows),
        files_changed,
        note,
    })
}
