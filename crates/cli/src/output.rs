//! Output: data on stdout (text or JSON), messages on stderr, exit codes.

use std::io::{IsTerminal, Write};
use std::sync::atomic::{AtomicBool, Ordering};

use fixpoint_core::tools::backfill::{DateOutcome, DateState, DateStatus};
use fixpoint_core::tools::diff::Row;
use fixpoint_core::run::ledger::Entry;
use fixpoint_core::tools::lookback::{DayError, WindowReport};
use fixpoint_core::{Error, ErrorClass, Fingerprint, Job, RunDate, RunReport, Strategy, TableName};

use serde_json::{json, Value};

/// Exit codes, documented in the README and docs/json.md.
pub mod code {
    /// The input (job file, arguments, SQL) is wrong.
    pub const INPUT: u8 = 2;
    /// The source data was refused by a guard; nothing changed.
    pub const DATA: u8 = 3;
    /// A proof failed / differences found.
    pub const PROOF: u8 = 4;
    /// Another run holds the lock.
    pub const BUSY: u8 = 5;
    /// A blocking audit failed; nothing was published.
    pub const AUDIT: u8 = 6;
    /// The database or file system failed; a retry may work.
    pub const RUNTIME: u8 = 1;
    /// A bug in fixpoint.
    pub const INTERNAL: u8 = 70;
}

/// How a command ended, as its exit code tells an orchestrator. An error
/// carries its status through its class; a command that reported its own
/// outcome (a failed proof, a backfill with a failed date) returns one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExitStatus {
    /// Everything asked for was done.
    Success,
    /// The database or file system failed; a retry may work.
    Runtime,
    /// The input (job file, arguments, SQL) is wrong.
    Input,
    /// The source data was refused by a guard; nothing changed.
    Data,
    /// A proof failed, or differences were found.
    Proof,
    /// Another run holds the lock.
    Busy,
    /// A blocking audit failed; nothing was published.
    Audit,
    /// A bug in fixpoint.
    Internal,
}

impl ExitStatus {
    /// The process's exit code.
    pub fn code(self) -> u8 {
        match self {
            ExitStatus::Success => 0,
            ExitStatus::Runtime => code::RUNTIME,
            ExitStatus::Input => code::INPUT,
            ExitStatus::Data => code::DATA,
            ExitStatus::Proof => code::PROOF,
            ExitStatus::Busy => code::BUSY,
            ExitStatus::Audit => code::AUDIT,
            ExitStatus::Internal => code::INTERNAL,
        }
    }

    /// The status of an error of class `c`.
    pub fn of_class(c: ErrorClass) -> ExitStatus {
        match c {
            ErrorClass::Input | ErrorClass::Unsupported => ExitStatus::Input,
            ErrorClass::Data => ExitStatus::Data,
            ErrorClass::Busy => ExitStatus::Busy,
            ErrorClass::Audit => ExitStatus::Audit,
            ErrorClass::Runtime | ErrorClass::Injected => ExitStatus::Runtime,
            ErrorClass::Internal => ExitStatus::Internal,
        }
    }

    /// The status of an error.
    pub fn of(e: &Error) -> ExitStatus {
        ExitStatus::of_class(e.class())
    }
}

/// The exit code for an error.
pub fn exit_code(e: &Error) -> u8 {
    ExitStatus::of(e).code()
}

pub fn class_name(c: ErrorClass) -> &'static str {
    match c {
        ErrorClass::Input => "input",
        ErrorClass::Data => "data",
        ErrorClass::Busy => "busy",
        ErrorClass::Audit => "audit",
        ErrorClass::Runtime => "runtime",
        ErrorClass::Injected => "injected",
        ErrorClass::Unsupported => "unsupported",
        ErrorClass::Internal => "internal",
    }
}

pub use fixpoint_core::error::redact_url;

/// Prints one line of data on stdout through [`Output::line`]: never
/// `println!`, which panics when the reader went away (`fixpoint runs | head -1`).
macro_rules! say {
    ($out:expr, $($arg:tt)*) => {
        $out.line(format_args!($($arg)*))
    };
}

/// Where results go.
pub struct Output {
    json: bool,
    /// Set once stdout cannot be written (its reader closed the pipe):
    /// nothing more is printed, and the command ends with its own exit code.
    closed: AtomicBool,
}

impl Output {
    pub fn new(json: bool) -> Output {
        Output { json, closed: AtomicBool::new(false) }
    }

    /// Writes one line on stdout. A closed stdout (EPIPE: `| head -1`,
    /// `| true`) stops the printing quietly: what was done stays done (a
    /// committed run is still exit 0), and no panic. Another write error
    /// is said once on stderr, then printing stops too.
    pub fn line(&self, args: std::fmt::Arguments<'_>) {
        if self.closed.load(Ordering::Relaxed) {
            return;
        }
        let mut stdout = std::io::stdout().lock();
        if let Err(e) = writeln!(stdout, "{args}") {
            self.closed.store(true, Ordering::Relaxed);
            if e.kind() != std::io::ErrorKind::BrokenPipe {
                let _ = writeln!(std::io::stderr(), "fixpoint: cannot write to stdout: {e}");
            }
        }
    }

    /// Writes one line of text on stdout (see [`Output::line`]).
    pub fn text(&self, line: &str) {
        say!(self, "{line}");
    }

    pub fn is_json(&self) -> bool {
        self.json
    }

    pub fn json(&self, v: &serde_json::Value) {
        say!(self, "{}", serde_json::to_string_pretty(v).expect("json"));
    }

    /// Any serializable value as JSON, in its own key order (a row's
    /// columns in their order).
    fn json_of<T: serde::Serialize>(&self, v: &T) {
        say!(self, "{}", serde_json::to_string_pretty(v).expect("json"));
    }

    /// A run's report (`job`: the job it ran, for the keys that depend on
    /// its source).
    pub fn run_report(&self, r: &RunReport, job: &Job) {
        if self.json {
            self.json(&report_json(r, job));
            return;
        }
        match (r.outcome.as_str(), r.strategy.as_str()) {
            ("skipped", _) => say!(self, "{} {}: skipped, {}", r.job, r.run_date, r.skip_reason.as_deref().unwrap_or("")),
            (_, "merge") => say!(
                self,
                "{} {}: merged into {} — {} inserted, {} updated, {} deleted, {} unchanged, {} source duplicates collapsed{}",
                r.job,
                r.run_date,
                r.target,
                r.rows_inserted,
                r.rows_updated,
                r.rows_deleted,
                r.rows_unchanged,
                r.duplicates_collapsed,
                if r.created_target { " (table created)" } else { "" }
            ),
            (_, "history") => say!(
                self,
                "{} {}: history of {} — {} rows written, {} replaced, {} unchanged, {} source duplicates collapsed; touched keys hold {} rows{}",
                r.job,
                r.run_date,
                r.target,
                r.rows_inserted,
                r.rows_deleted,
                r.rows_unchanged,
                r.duplicates_collapsed,
                r.output_rows,
                if r.created_target { " (table created)" } else { "" }
            ),
            _ => {
                let (how, suffix, verb) = if r.method == "partition exchange" {
                    ("swapped in the day's partition of", " (partition exchange)", "detached")
                } else {
                    ("replaced partition of", "", "deleted")
                };
                say!(
                    self,
                    "{} {}: {how} {}{suffix} — {} rows {verb}, {} inserted{}",
                    r.job,
                    r.run_date,
                    r.target,
                    r.rows_deleted,
                    r.rows_inserted,
                    if r.created_target { " (table created)" } else { "" }
                )
            }
        }
        say!(self, "  run key  {}", r.run_key);
        if let Some(f) = &r.input_files {
            let bytes: u64 = f.files.iter().map(|x| x.size).sum();
            say!(self, "  files    {} file(s), {bytes} bytes, checksum {}", f.files.len(), f.checksum);
        }
        if r.outcome != "skipped" || r.input_files.is_none() {
            say!(self, "  input    {} rows, checksum {}", r.input_rows, r.input_checksum);
        }
        say!(self, "  output   {} rows, checksum {}", r.output_rows, r.output_checksum);
        if let Some(note) = &r.method_note {
            say!(self, "  note     {note}");
        }
        for a in &r.audits {
            let verdict = if a.passed { "passed" } else { "FAILED (warn)" };
            say!(self, "  audit    {}: {verdict}: {}", a.name, a.detail);
        }
    }

    pub fn fingerprint(&self, table: &TableName, fp: &Fingerprint) {
        if self.json {
            let mut v = fingerprint_value(fp);
            v["table"] = json!(table.to_string());
            self.json(&v);
        } else {
            say!(self, "{table}: {} rows, checksum {} ({})", fp.rows, fp.checksum, fp.kind);
        }
    }

    /// Runs a backfill with a progress bar on stderr (when it is a terminal
    /// and the output is text), prints the summary, returns the exit code.
    /// Runs a backfill through `run` (sequential or parallel), showing progress, and reports it.
    pub fn backfill(&self, job: &Job, dates: &[RunDate], run: impl FnOnce(&mut dyn FnMut(&DateOutcome)) -> Vec<DateOutcome>) -> ExitStatus {
        let bar = if !self.json && std::io::stderr().is_terminal() {
            indicatif::ProgressBar::new(dates.len() as u64)
        } else {
            indicatif::ProgressBar::hidden()
        };
        bar.set_style(indicatif::ProgressStyle::with_template(PROGRESS_TEMPLATE).expect("template"));
        let mut written = 0u64;
        bar.set_message("0");
        let outcomes = run(&mut |o: &DateOutcome| {
            if let DateOutcome::Done(r) = o {
                written += r.rows_inserted + r.rows_updated;
                bar.set_message(compact(written));
            }
            bar.inc(1);
        });
        bar.finish_and_clear();
        let count = |f: fn(&DateOutcome) -> bool| outcomes.iter().filter(|o| f(o)).count();
        let committed = count(|o| matches!(o, DateOutcome::Done(r) if r.outcome == "committed"));
        let skipped = count(|o| matches!(o, DateOutcome::Done(r) if r.outcome == "skipped"));
        let failed = count(|o| matches!(o, DateOutcome::Failed(..)));
        let not_run = count(|o| matches!(o, DateOutcome::NotRun(_)));
        let status = outcomes
            .iter()
            .find_map(|o| match o {
                DateOutcome::Failed(_, e) => Some(ExitStatus::of(e)),
                _ => None,
            })
            .unwrap_or(ExitStatus::Success);
        let code = status.code();
        if self.json {
            let dates: Vec<serde_json::Value> = outcomes
                .iter()
                .map(|o| match o {
                    DateOutcome::Done(r) => json!({"run_date": r.run_date, "outcome": r.outcome, "report": report_json(r, job), "error": null}),
                    DateOutcome::Failed(d, e) => json!({"run_date": d.to_string(), "outcome": "failed", "report": null, "error": error_object(e)}),
                    DateOutcome::NotRun(d) => json!({"run_date": d.to_string(), "outcome": "not_run", "report": null, "error": null}),
                })
                .collect();
            self.json(&json!({"job": job.name, "dates": dates, "committed": committed, "skipped": skipped, "failed": failed, "not_run": not_run, "rows_written": written, "exit_code": code}));
        } else {
            say!(self, "{:<12} {:<10} {:>10} {:>10} {:>10}  run key / error", "date", "outcome", "deleted", "written", "rows");
            for o in &outcomes {
                match o {
                    DateOutcome::Done(r) => say!(
                        self,
                        "{:<12} {:<10} {:>10} {:>10} {:>10}  {}",
                        r.run_date, r.outcome, r.rows_deleted, r.rows_inserted + r.rows_updated, r.output_rows, r.run_key
                    ),
                    DateOutcome::Failed(d, e) => say!(self, "{:<12} {:<10} {:>10} {:>10} {:>10}  {e}", d.to_string(), "failed", "", "", ""),
                    DateOutcome::NotRun(d) => say!(self, "{:<12} {:<10}", d.to_string(), "not run"),
                }
            }
            say!(
                self,
                "backfill {} {} … {}: {committed} committed, {skipped} skipped (already done), {failed} failed, {not_run} not run; {written} rows written",
                job.name,
                dates.first().map(|d| d.to_string()).unwrap_or_default(),
                dates.last().map(|d| d.to_string()).unwrap_or_default()
            );
        }
        for o in &outcomes {
            if let DateOutcome::Failed(d, e) = o {
                eprintln!("error: {d}: {e}");
                if let Some(h) = e.hint() {
                    eprintln!("hint: {h}");
                }
            }
        }
        status
    }

    /// The status table; `attention`: how many dates need attention
    /// (`fixpoint status` then exits 4).
    pub fn status(&self, job: &Job, rows: &[DateStatus], attention: usize) {
        if self.json {
            let code = if attention > 0 { code::PROOF } else { 0 };
            let dates: Vec<Value> = rows.iter().map(|r| status_json(r, job)).collect();
            self.json(&json!({"job": job.name, "dates": dates, "need_attention": attention, "exit_code": code}));
            return;
        }
        let job = job.name.as_str();
        let max = rows.iter().filter_map(|r| r.rows_now.or(r.last_run.as_ref().map(|l| l.output_rows))).max().unwrap_or(0).max(1);
        say!(self, "{:<12} {:<15} {:>10} {:<20} {:<34} rows", "date", "state", "rows", "last run (UTC)", "run key");
        for r in rows {
            let state = match r.state {
                DateState::Ok => "ok",
                DateState::Missing => "MISSING",
                DateState::Drift => "DRIFT",
                DateState::SourceChanged => "source changed",
                DateState::JobChanged => "job changed",
                DateState::NoInput => "NO INPUT",
            };
            let n = r.rows_now.or(r.last_run.as_ref().map(|l| l.output_rows));
            let bar_len = n.map(|n| ((n as f64 / max as f64) * 30.0).round() as usize).unwrap_or(0);
            say!(
                self,
                "{:<12} {:<15} {:>10} {:<20} {:<34} {}",
                r.run_date,
                state,
                n.map(|n| n.to_string()).unwrap_or_else(|| "-".into()),
                r.last_run.as_ref().map(|l| l.finished_at.format("%Y-%m-%d %H:%M:%S").to_string()).unwrap_or_else(|| "-".into()),
                r.last_run.as_ref().map(|l| l.run_key.as_str()).unwrap_or("-"),
                "█".repeat(bar_len)
            );
            if !r.files_changed.is_empty() {
                say!(self, "{:<12} files: {}", "", r.files_changed.join(", "));
            }
            if let Some(n) = &r.note {
                say!(self, "{:<12} {n}", "");
            }
        }
        say!(self, "{job}: {} dates, {attention} need attention", rows.len());
    }

    /// The lint report of every file: its findings, or (on stderr, and in
    /// the JSON under `error`) why it could not be linted.
    pub fn lint(&self, all: &[(String, Result<Vec<fixpoint_core::tools::lint::Finding>, Error>)], errors: usize, warnings: usize) {
        let failed = all.iter().filter(|(_, r)| r.is_err()).count();
        for (file, r) in all {
            if let Err(e) = r {
                eprintln!("error: {}", naming(file, e));
                if let Some(h) = e.hint() {
                    eprintln!("hint: {h}");
                }
            }
        }
        if self.json {
            let files: Vec<serde_json::Value> = all
                .iter()
                .map(|(f, r)| match r {
                    Ok(fs) => json!({"file": f, "findings": fs, "error": null}),
                    Err(e) => {
                        let mut err = error_object(e);
                        err["message"] = json!(naming(f, e));
                        json!({"file": f, "findings": null, "error": err})
                    }
                })
                .collect();
            self.json(&json!({"files": files, "errors": errors, "warnings": warnings, "failed": failed}));
            return;
        }
        for (file, r) in all {
            let Ok(findings) = r else { continue };
            for f in findings {
                let sev = match f.severity {
                    fixpoint_core::tools::lint::Severity::Error => "error",
                    fixpoint_core::tools::lint::Severity::Warning => "warning",
                };
                if f.line == 0 {
                    say!(self, "{file}: {sev}[{}]: {}", f.rule, f.message);
                    say!(self, "  (the target table) hint: {}", f.hint);
                } else {
                    say!(self, "{file}:{}:{}: {sev}[{}]: {}", f.line, f.column, f.rule, f.message);
                    say!(self, "  (source.sql line {}, column {}) hint: {}", f.sql_line, f.sql_column, f.hint);
                }
            }
        }
        if failed > 0 {
            say!(self, "{} file(s): {errors} error(s), {warnings} warning(s); {failed} file(s) could not be linted (see stderr)", all.len());
        } else {
            say!(self, "{} file(s): {errors} error(s), {warnings} warning(s)", all.len());
        }
    }

    /// A run with a lookback window. In JSON: the run date's own report at
    /// the top (what a run without lookback prints), or `{"error": …}` when
    /// that day failed, and the window under `window`. `failure`: the first
    /// failed day's error.
    pub fn window(&self, w: &WindowReport, job: &Job, failure: Option<&Error>) {
        if self.json {
            let days: Vec<Value> = w
                .days
                .iter()
                .map(|d| {
                    json!({
                        "run_date": d.run_date,
                        "action": d.action,
                        "reason": d.reason,
                        "report": d.report.as_ref().map(|r| report_json(r, job)),
                        "error": d.error.as_ref().map(|x| day_error_object(x, &d.reason))
                    })
                })
                .collect();
            let window = json!({"lookback": w.lookback, "days": days, "written": w.written, "skipped": w.skipped, "failed": w.failed});
            let first_failed = w.days.iter().position(|d| d.action == "failed");
            let mut top = match w.days.iter().rposition(|d| d.run_date == w.run_date) {
                Some(i) => {
                    let day = &w.days[i];
                    match (&day.report, &day.error, failure) {
                        (Some(r), _, _) => report_json(r, job),
                        // The run date itself failed: its error, as a run
                        // without lookback prints it (in full when it was
                        // the window's first failure).
                        (None, _, Some(e)) if first_failed == Some(i) => json!({ "error": error_object(e) }),
                        (None, Some(x), _) => json!({ "error": day_error_object(x, &day.reason) }),
                        (None, None, _) => {
                            let error = json!({"class": "internal", "message": day.reason, "hint": null, "exit_code": code::INTERNAL});
                            json!({ "error": error })
                        }
                    }
                }
                None => json!({}),
            };
            top["window"] = window;
            self.json(&top);
            return;
        }
        say!(self, "{} {} with lookback {}: {} day(s) written, {} skipped, {} failed", w.job, w.run_date, w.lookback, w.written, w.skipped, w.failed);
        say!(self, "{:<12} {:<10} {:>10}  why", "date", "action", "rows");
        for d in &w.days {
            let rows = d.report.as_ref().map(|r| r.output_rows.to_string()).unwrap_or_default();
            say!(self, "{:<12} {:<10} {:>10}  {}", d.run_date, d.action, rows, d.reason);
        }
    }

    pub fn diff(&self, d: &fixpoint_core::tools::diff::DiffReport) {
        if self.json {
            self.json_of(d);
            return;
        }
        say!(self, "diff {} vs {} on key ({})", d.a, d.b, d.key.join(", "));
        say!(self, "  A  {}", d.fingerprint_a);
        say!(self, "  B  {}", d.fingerprint_b);
        if d.identical {
            say!(self, "identical: {} rows, no row transferred", d.fingerprint_a.rows);
            return;
        }
        for r in &d.listed_only_in_a {
            say!(self, "  only in A  {r}");
        }
        for r in &d.listed_only_in_b {
            say!(self, "  only in B  {r}");
        }
        for r in &d.listed_changed {
            let changes: Vec<String> = r.changes.iter().map(|c| format!("{}: {} -> {}", c.column, c.a, c.b)).collect();
            say!(self, "  changed    {}: {}", r.key, changes.join("; "));
        }
        say!(
            self,
            "{} only in A, {} only in B, {} changed ({} segment queries per side, {} rows read)",
            d.only_in_a, d.only_in_b, d.changed, d.segment_queries, d.rows_transferred
        );
        if let Some(note) = &d.note {
            say!(self, "not identical: {note}");
        }
    }

    pub fn proof(&self, p: &fixpoint_core::tools::prove::Proof) {
        if self.json {
            self.json_of(p);
            return;
        }
        say!(self, "prove {} {} (scope: {})", p.job, p.run_date, p.scope);
        say!(self, "  before    {} rows, checksum {}", p.before.rows, p.before.checksum);
        for r in &p.runs {
            say!(self, "  run {}     {} rows, checksum {}  (run key {})", r.run, r.rows, r.checksum, r.run_key);
            for d in &r.differs_from_first {
                say!(self, "            {d}");
            }
        }
        for c in &p.crash {
            let ok = |b: bool| if b { "yes" } else { "NO" };
            say!(
                self,
                "  crash at {:<14} previous contents kept: {}, ledger clean: {}, rerun converged: {}",
                c.point.name(),
                ok(c.previous_kept),
                ok(c.ledger_clean),
                ok(c.converged)
            );
        }
        if let Some(o) = &p.order {
            say!(self, "  order     {}: {}", o.outcome, o.message);
            for s in &o.sample {
                say!(self, "            {s}");
            }
        }
        if let Some(m) = &p.mutation {
            say!(self, "  mutation  {}: {}", m.outcome, m.message);
            if !m.row.is_empty() {
                say!(self, "            input row of {}: {{{}}}, changed {}", m.table, m.row.join(", "), m.change);
            }
            for s in &m.sample {
                say!(self, "            {s}");
            }
        }
        for f in &p.failures {
            say!(self, "  FAILED: {f}");
        }
        say!(self, "{}", p.verdict);
    }

    pub fn runs(&self, entries: &[Entry]) {
        if self.json {
            self.json(&json!({"runs": entries.iter().map(entry_json).collect::<Vec<_>>()}));
            return;
        }
        say!(self, "{:<20} {:<16} {:<12} {:<10} {:>10} {:>10}  run key", "finished (UTC)", "job", "date", "outcome", "written", "rows");
        for e in entries {
            say!(
                self,
                "{:<20} {:<16} {:<12} {:<10} {:>10} {:>10}  {}",
                e.finished_at.format("%Y-%m-%d %H:%M:%S").to_string(),
                e.job,
                e.run_date,
                e.outcome,
                e.rows_inserted + e.rows_updated,
                e.output_rows,
                e.run_key
            );
        }
    }

    pub fn error(&self, e: &Error) {
        let hint = e.hint();
        eprintln!("error: {e}");
        if let Some(h) = &hint {
            eprintln!("hint: {h}");
        }
        if self.json {
            self.json(&json!({"error": error_object(e)}));
        }
    }
}

/// The object under `"error"` in JSON output: class, message, hint (null
/// when none), exit code; a refused row adds `offending` (how many rows),
/// `column` and `sample` (one of them, as an object), a failed audit adds
/// `audit` (its name), `sample` (one offending row, or null) and `audits`
/// (every audit's result).
pub fn error_object(e: &Error) -> Value {
    let mut v = json!({"class": class_name(e.class()), "message": e.to_string(), "hint": e.hint(), "exit_code": exit_code(e)});
    match e {
        Error::OutOfPartition { rows, column, sample, .. } => {
            v["offending"] = json!(rows);
            v["column"] = json!(column);
            v["sample"] = row_value(&Row::from_pairs(&sample.0));
        }
        Error::AuditFailed { audit, sample, results, .. } => {
            v["audit"] = json!(audit);
            v["sample"] = if sample.is_empty() { Value::Null } else { display_row(sample) };
            v["audits"] = audits_json(results);
        }
        _ => {}
    }
    v
}

/// The error object of a failed day of a lookback window (its message is
/// the day's reason).
fn day_error_object(d: &DayError, message: &str) -> Value {
    json!({"class": class_name(d.class), "message": message, "hint": d.hint, "exit_code": ExitStatus::of_class(d.class).code()})
}

/// A row as a JSON object.
fn row_value(row: &Row) -> Value {
    serde_json::to_value(row).expect("a row serializes")
}

/// A sample row written `{column: value, …}` as a JSON object (a row whose
/// text cannot be read into columns: `{"row": "<text>"}`).
fn display_row(text: &str) -> Value {
    row_value(&Row::parse_display(text).unwrap_or_else(|| Row::unread(text)))
}

/// Audits' results in JSON: their sample rows as objects.
fn audits_json(results: &[fixpoint_core::error::AuditResult]) -> Value {
    let mut v = json!({ "audits": results });
    rows_in_audits(&mut v);
    v["audits"].take()
}

/// Turns the sample rows of the audits under `v["audits"]` into objects.
fn rows_in_audits(v: &mut Value) {
    let Some(audits) = v.get_mut("audits").and_then(Value::as_array_mut) else { return };
    for a in audits {
        if let Some(sample) = a.get_mut("sample") {
            let rows: Vec<Value> = sample.as_array().map(|s| s.iter().map(|x| display_row(x.as_str().unwrap_or_default())).collect()).unwrap_or_default();
            *sample = Value::Array(rows);
        }
    }
}

/// A fingerprint in JSON, the one shape of every fingerprint in the output:
/// `{"rows", "checksum", "kind"}`.
fn fingerprint_value(fp: &Fingerprint) -> Value {
    json!({"rows": fp.rows, "checksum": fp.checksum, "kind": fp.kind})
}

/// Moves the flat fingerprint fields of a report or a ledger entry
/// (`input_rows`, `input_checksum`, `output_rows`, `output_checksum`,
/// `fingerprint_kind`) into the fingerprint objects `input` and `output`.
fn nest_fingerprints(v: &mut Value) {
    let Some(o) = v.as_object_mut() else { return };
    let kind = o.remove("fingerprint_kind").unwrap_or(Value::Null);
    for side in ["input", "output"] {
        let rows = o.remove(format!("{side}_rows").as_str()).unwrap_or(Value::Null);
        let checksum = o.remove(format!("{side}_checksum").as_str()).unwrap_or(Value::Null);
        o.insert(side.to_owned(), json!({"rows": rows, "checksum": checksum, "kind": kind.clone()}));
    }
}

/// A run's report in JSON (`fixpoint run`, each date of `backfill`, each
/// day of a lookback window): the report's keys with its fingerprints as
/// `input` and `output` and the audits' sample rows as objects. A day of a
/// file source without files (allow_missing) has `run_key`, `input` and
/// `output` null: nothing was read. `method_note` only for
/// replace_partition; `input_files` only for a file source (null when no
/// file matched).
pub fn report_json(r: &RunReport, job: &Job) -> Value {
    let mut v = serde_json::to_value(r).expect("a report serializes");
    nest_fingerprints(&mut v);
    rows_in_audits(&mut v);
    if let Some(o) = v.as_object_mut() {
        if r.run_key.is_empty() {
            for key in ["run_key", "input", "output"] {
                o.insert(key.to_owned(), Value::Null);
            }
        }
        if r.strategy != Strategy::ReplacePartition.name() {
            o.remove("method_note");
        }
        if job.source.files.is_some() && !o.contains_key("input_files") {
            o.insert("input_files".to_owned(), Value::Null);
        }
    }
    v
}

/// A ledger entry in JSON (`runs`, `status`'s `last_run`): its keys with
/// its fingerprints as `input` and `output` and the audits' sample rows as
/// objects.
pub fn entry_json(e: &Entry) -> Value {
    let mut v = serde_json::to_value(e).expect("an entry serializes");
    nest_fingerprints(&mut v);
    rows_in_audits(&mut v);
    v
}

/// One date of `status` in JSON. `output_now` only for replace_partition
/// (null when the target does not exist); `files_changed` and `note` only
/// for a file source; `run_key_now` null when a run would have no key (a
/// file source's day without files).
fn status_json(r: &DateStatus, job: &Job) -> Value {
    let mut v = serde_json::to_value(r).expect("a status serializes");
    if let Some(o) = v.as_object_mut() {
        o.insert("last_run".to_owned(), r.last_run.as_ref().map(entry_json).unwrap_or(Value::Null));
        o.insert("input_now".to_owned(), r.input_now.as_ref().map(fingerprint_value).unwrap_or(Value::Null));
        o.insert("output_now".to_owned(), r.output_now.as_ref().map(fingerprint_value).unwrap_or(Value::Null));
        if r.run_key_now.is_empty() {
            o.insert("run_key_now".to_owned(), Value::Null);
        }
        if job.strategy != Strategy::ReplacePartition {
            o.remove("output_now");
        }
        if job.source.files.is_none() {
            o.remove("files_changed");
            o.remove("note");
        }
    }
    v
}

/// `e`'s message, starting with `file` unless it already names it.
fn naming(file: &str, e: &Error) -> String {
    let message = e.to_string();
    if message.contains(file) {
        message
    } else {
        format!("{file}: {message}")
    }
}

/// The backfill's progress line (on a terminal): at most 79 columns with
/// up to 7-digit date counts, a 6-character row count ([`compact`]) and
/// indicatif's short durations (`{elapsed}`, `{eta}`: `59s`, `12m`, `3h`).
pub const PROGRESS_TEMPLATE: &str = "{bar:20} {pos}/{len} dates, {msg} rows, {elapsed} elapsed, ETA {eta}";

/// A count in at most 6 characters: `999`, `12.3k`, `999.9k`, `1.0M`, `18.4E`.
pub fn compact(n: u64) -> String {
    if n < 1000 {
        return n.to_string();
    }
    const UNITS: [&str; 6] = ["k", "M", "G", "T", "P", "E"];
    let mut value = n as f64 / 1000.0;
    let mut unit = 0;
    while value >= 999.95 && unit < UNITS.len() - 1 {
        value /= 1000.0;
        unit += 1;
    }
    format!("{value:.1}{}", UNITS[unit])
}

#[cfg(test)]
mod tests {
    use super::{compact, PROGRESS_TEMPLATE};

    #[test]
    fn counts_are_compact() {
        assert_eq!(compact(0), "0");
        assert_eq!(compact(999), "999");
        assert_eq!(compact(1000), "1.0k");
        assert_eq!(compact(12_345), "12.3k");
        assert_eq!(compact(999_949), "999.9k");
        assert_eq!(compact(999_999), "1.0M");
        assert_eq!(compact(2_500_000_000), "2.5G");
        assert_eq!(compact(u64::MAX), "18.4E");
        for n in [0, 999, 1000, 999_949, 999_950, 999_999, 999_999_999, u64::MAX / 3, u64::MAX] {
            assert!(compact(n).chars().count() <= 6, "{n}: {}", compact(n));
        }
    }

    #[test]
    fn the_progress_line_fits_80_columns_at_its_widest() {
        // The widest values each placeholder takes: a 20-cell bar, 7-digit
        // date counts (--max-dates raised to a million), the widest compact
        // count, and indicatif's short durations (`{:#}` of HumanDuration:
        // a number and one letter; 100 years is 4 characters).
        let widest = PROGRESS_TEMPLATE
            .replace("{bar:20}", &"█".repeat(20))
            .replace("{pos}", "9999999")
            .replace("{len}", "9999999")
            .replace("{msg}", "999.9k")
            .replace("{elapsed}", "100y")
            .replace("{eta}", "100y");
        assert!(!widest.contains('{'), "every placeholder replaced: {widest}");
        assert!(widest.chars().count() <= 80, "{} columns: {widest}", widest.chars().count());
    }
}
