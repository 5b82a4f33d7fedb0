//! Late-arriving data: a run for date D with `lookback = N` also looks at
//! D-N … D-1 and reloads exactly the days whose input changed since their
//! last load (the ledger's input fingerprint, through the run key), loads the
//! days never loaded, and skips the rest. The window depends only on the run
//! date and the ledger, never on the clock: a retry the next morning does
//! what the first attempt would have done. Each day is its own transaction.

use serde::Serialize;

use crate::job::date::RunDate;
use crate::engine::Engine;
use crate::error::{Error, ErrorClass};
use crate::run::ledger;
use crate::run::protocol::RunOptions;
use crate::run::report::RunReport;
use crate::job::spec::Job;

/// What happened to one day of the window.
#[derive(Debug, Clone, Serialize)]
pub struct WindowDay {
    /// The day.
    pub run_date: String,
    /// `loaded`, `reloaded`, `skipped`, `failed` or `outside` (before the job's start).
    pub action: String,
    /// Why, in one sentence.
    pub reason: String,
    /// The run's report, when it ran (a day of the window skipped on its
    /// input fingerprint alone has none).
    pub report: Option<RunReport>,
    /// Why the day failed, when it did (its message is `reason`).
    #[serde(skip)]
    pub error: Option<DayError>,
}

/// A failed day's error: its class and hint (the message is the day's
/// `reason`), what the CLI's error object shows.
#[derive(Debug, Clone)]
pub struct DayError {
    /// The error's class (the CLI maps it to an exit code).
    pub class: ErrorClass,
    /// A known fix, when there is one.
    pub hint: Option<String>,
}

impl DayError {
    fn of(e: &Error) -> DayError {
        DayError { class: e.class(), hint: e.hint() }
    }
}

/// A run with its lookback window.
#[derive(Debug, Clone, Serialize)]
pub struct WindowReport {
    /// Job name.
    pub job: String,
    /// The run date D.
    pub run_date: String,
    /// N.
    pub lookback: u32,
    /// D-N … D, oldest first.
    pub days: Vec<WindowDay>,
    /// Days loaded or reloaded.
    pub written: usize,
    /// Days skipped as unchanged.
    pub skipped: usize,
    /// Days that failed (nothing of them committed).
    pub failed: usize,
}

/// Runs `job` for `run_date` and its lookback window. Returns the report
/// and the first failure (the other days still ran: each is atomic, and a
/// retry with the same date finishes the job). `fault_date` limits
/// `opts.fault` to one day (tests).
pub fn run_window(job: &Job, run_date: RunDate, engine: &mut dyn Engine, opts: &RunOptions, fault_date: Option<RunDate>) -> (WindowReport, Option<Error>) {
    let first = RunDate::from_naive(run_date.date() - chrono::Duration::days(job.lookback.into()));
    let mut days = Vec::new();
    let mut first_error = None;
    let job_hash = job.definition_hash();
    // The window's ledger entries in one query.
    // (Should it fail, each day looks itself up and reports its own error.)
    let mut latest = ledger::latest_per_date(engine, &job.name, first, run_date).ok();
    for day in RunDate::range(first, run_date) {
        if job.start.is_some_and(|s| day < s) {
            days.push(WindowDay {
                run_date: day.to_string(),
                action: "outside".into(),
                reason: format!("before the job's start {}", job.start.expect("checked")),
                report: None,
                error: None,
            });
            continue;
        }
        let looked_up = match latest.as_mut() {
            Some(m) => Ok(m.remove(&day.to_string())),
            None => ledger::entries(engine, Some(&job.name), Some(day), Some(1)).map(|mut e| e.pop()),
        };
        let last = match looked_up {
            Ok(l) => l,
            Err(e) => {
                days.push(WindowDay { run_date: day.to_string(), action: "failed".into(), reason: e.to_string(), report: None, error: Some(DayError::of(&e)) });
                first_error.get_or_insert(e);
                continue;
            }
        };
        // A day of the window before D whose input is unchanged is skipped
        // on the input fingerprint alone (one scan of its source); D itself
        // runs as a plain run would (which also checks its partition).
        if day != run_date && !opts.force {
            if let Some(l) = &last {
                match crate::tools::backfill::run_key_now(job, day, engine) {
                    Ok((key, _)) if key == l.run_key && l.job_hash == job_hash => {
                        days.push(WindowDay {
                            run_date: day.to_string(),
                            action: "skipped".into(),
                            reason: "its input is unchanged since its last load (same input fingerprint)".into(),
                            report: None,
                            error: None,
                        });
                        continue;
                    }
                    Ok(_) => {}
                    Err(e) => {
                        days.push(WindowDay { run_date: day.to_string(), action: "failed".into(), reason: e.to_string(), report: None, error: Some(DayError::of(&e)) });
                        first_error.get_or_insert(e);
                        continue;
                    }
                }
            }
        }
        let mut run = opts.clone();
        if fault_date.is_some_and(|f| f != day) {
            run.fault = None;
        }
        let (action, reason, report, error) = match job.load_with(day, engine, &run) {
            Ok(r) if r.outcome == "skipped" && r.run_key.is_empty() => ("skipped", r.skip_reason.clone().unwrap_or_default(), Some(r), None),
            Ok(r) if r.outcome == "skipped" => ("skipped", "unchanged since its last load (same input, the partition as recorded)".to_owned(), Some(r), None),
            Ok(r) => {
                let (action, reason) = match &last {
                    None => ("loaded", "never loaded".to_owned()),
                    Some(_) if opts.force => ("reloaded", "--force".to_owned()),
                    Some(l) if l.job_hash != job_hash => ("reloaded", "the job's definition changed since its last load".to_owned()),
                    Some(l) if l.run_key != r.run_key => (
                        "reloaded",
                        format!("its input changed since its last load ({} → {} source rows, another checksum)", l.input_rows, r.input_rows),
                    ),
                    Some(_) => ("reloaded", "the partition no longer held the recorded output (drift)".to_owned()),
                };
                (action, reason, Some(r), None)
            }
            Err(e) => {
                let reason = e.to_string();
                let error = DayError::of(&e);
                first_error.get_or_insert(e);
                ("failed", reason, None, Some(error))
            }
        };
        days.push(WindowDay { run_date: day.to_string(), action: action.into(), reason, report, error });
    }
    let count = |a: &[&str]| days.iter().filter(|d| a.contains(&d.action.as_str())).count();
    let report = WindowReport {
        job: job.name.clone(),
        run_date: run_date.to_string(),
        lookback: job.lookback,
        written: count(&["loaded", "reloaded"]),
        skipped: count(&["skipped"]),
        failed: count(&["failed"]),
        days,
    };
    (report, first_error)
}
