//! Output: data on stdout (text or JSON), messages on stderr, exit codes.

use std::io::IsTerminal;

use fixpoint_core::backfill::{DateOutcome, DateState, DateStatus};
use fixpoint_core::ledger::Entry;
use fixpoint_core::{Error, ErrorClass, Fingerprint, Job, RunDate, RunReport, TableName};

/// Marks an error already reported on stdout; the number after it is the exit code.
pub const REPORTED: &str = "already reported; exit code";
use serde_json::json;

/// Exit codes, documented in the README.
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

/// The exit code for an error.
pub fn exit_code(e: &Error) -> u8 {
    match e.class() {
        ErrorClass::Input | ErrorClass::Unsupported => code::INPUT,
        ErrorClass::Data => code::DATA,
        ErrorClass::Busy => code::BUSY,
        ErrorClass::Audit => code::AUDIT,
        ErrorClass::Runtime | ErrorClass::Injected => code::RUNTIME,
        ErrorClass::Internal => code::INTERNAL,
    }
}

fn class_name(c: ErrorClass) -> &'static str {
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

/// Where results go.
pub struct Output {
    json: bool,
}

impl Output {
    pub fn new(json: bool) -> Output {
        Output { json }
    }

    pub fn is_json(&self) -> bool {
        self.json
    }

    pub fn json(&self, v: &serde_json::Value) {
        println!("{}", serde_json::to_string_pretty(v).expect("json"));
    }

    pub fn run_report(&self, r: &RunReport) {
        if self.json {
            self.json(&serde_json::to_value(r).expect("report serializes"));
            return;
        }
        match (r.outcome.as_str(), r.strategy.as_str()) {
            ("skipped", _) => println!("{} {}: skipped, {}", r.job, r.run_date, r.skip_reason.as_deref().unwrap_or("")),
            (_, "merge") => println!(
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
            _ => {
                let (how, suffix, verb) = if r.method == "partition exchange" {
                    ("swapped in the day's partition of", " (partition exchange)", "detached")
                } else {
                    ("replaced partition of", "", "deleted")
                };
                println!(
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
        println!("  run key  {}", r.run_key);
        if let Some(f) = &r.input_files {
            let bytes: u64 = f.files.iter().map(|x| x.size).sum();
            println!("  files    {} file(s), {bytes} bytes, checksum {}", f.files.len(), f.checksum);
        }
        if r.outcome != "skipped" || r.input_files.is_none() {
            println!("  input    {} rows, checksum {}", r.input_rows, r.input_checksum);
        }
        println!("  output   {} rows, checksum {}", r.output_rows, r.output_checksum);
        if let Some(note) = &r.method_note {
            println!("  note     {note}");
        }
        for a in &r.audits {
            let verdict = if a.passed { "passed" } else { "FAILED (warn)" };
            println!("  audit    {}: {verdict}: {}", a.name, a.detail);
        }
    }

    pub fn fingerprint(&self, table: &TableName, fp: &Fingerprint) {
        if self.json {
            self.json(&json!({"table": table.to_string(), "rows": fp.rows, "checksum": fp.checksum, "kind": fp.kind}));
        } else {
            println!("{table}: {} rows, checksum {} ({})", fp.rows, fp.checksum, fp.kind);
        }
    }

    /// Runs a backfill with a progress bar on stderr (when it is a terminal
    /// and the output is text), prints the summary, returns the exit code.
    /// Runs a backfill through `run` (sequential or parallel), showing progress, and reports it.
    pub fn backfill(&self, job: &Job, dates: &[RunDate], run: impl FnOnce(&mut dyn FnMut(&DateOutcome)) -> Vec<DateOutcome>) -> u8 {
        let bar = if !self.json && std::io::stderr().is_terminal() {
            indicatif::ProgressBar::new(dates.len() as u64)
        } else {
            indicatif::ProgressBar::hidden()
        };
        bar.set_style(
            indicatif::ProgressStyle::with_template("{bar:30} {pos}/{len} dates, {msg} rows written, {elapsed} elapsed, ETA {eta}")
                .expect("template"),
        );
        let mut written = 0u64;
        bar.set_message("0");
        let outcomes = run(&mut |o: &DateOutcome| {
            if let DateOutcome::Done(r) = o {
                written += r.rows_inserted + r.rows_updated;
                bar.set_message(written.to_string());
            }
            bar.inc(1);
        });
        bar.finish_and_clear();
        let count = |f: fn(&DateOutcome) -> bool| outcomes.iter().filter(|o| f(o)).count();
        let committed = count(|o| matches!(o, DateOutcome::Done(r) if r.outcome == "committed"));
        let skipped = count(|o| matches!(o, DateOutcome::Done(r) if r.outcome == "skipped"));
        let failed = count(|o| matches!(o, DateOutcome::Failed(..)));
        let not_run = count(|o| matches!(o, DateOutcome::NotRun(_)));
        let code = outcomes
            .iter()
            .find_map(|o| match o {
                DateOutcome::Failed(_, e) => Some(exit_code(e)),
                _ => None,
            })
            .unwrap_or(0);
        if self.json {
            let dates: Vec<serde_json::Value> = outcomes
                .iter()
                .map(|o| match o {
                    DateOutcome::Done(r) => json!({"run_date": r.run_date, "outcome": r.outcome, "report": r}),
                    DateOutcome::Failed(d, e) => json!({"run_date": d.to_string(), "outcome": "failed",
                        "error": {"class": class_name(e.class()), "message": e.to_string(), "hint": e.hint(), "exit_code": exit_code(e)}}),
                    DateOutcome::NotRun(d) => json!({"run_date": d.to_string(), "outcome": "not_run"}),
                })
                .collect();
            self.json(&json!({"job": job.name, "dates": dates, "committed": committed, "skipped": skipped, "failed": failed, "not_run": not_run, "rows_written": written, "exit_code": code}));
        } else {
            println!("{:<12} {:<10} {:>10} {:>10} {:>10}  run key / error", "date", "outcome", "deleted", "written", "rows");
            for o in &outcomes {
                match o {
                    DateOutcome::Done(r) => println!(
                        "{:<12} {:<10} {:>10} {:>10} {:>10}  {}",
                        r.run_date, r.outcome, r.rows_deleted, r.rows_inserted + r.rows_updated, r.output_rows, r.run_key
                    ),
                    DateOutcome::Failed(d, e) => println!("{:<12} {:<10} {:>10} {:>10} {:>10}  {e}", d.to_string(), "failed", "", "", ""),
                    DateOutcome::NotRun(d) => println!("{:<12} {:<10}", d.to_string(), "not run"),
                }
            }
            println!(
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
        code
    }

    pub fn status(&self, job: &str, rows: &[DateStatus]) {
        if self.json {
            self.json(&json!({"job": job, "dates": rows}));
            return;
        }
        let max = rows.iter().filter_map(|r| r.rows_now.or(r.last_run.as_ref().map(|l| l.output_rows))).max().unwrap_or(0).max(1);
        println!("{:<12} {:<15} {:>10} {:<20} {:<34} rows", "date", "state", "rows", "last run (UTC)", "run key");
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
            println!(
                "{:<12} {:<15} {:>10} {:<20} {:<34} {}",
                r.run_date,
                state,
                n.map(|n| n.to_string()).unwrap_or_else(|| "-".into()),
                r.last_run.as_ref().map(|l| l.finished_at.format("%Y-%m-%d %H:%M:%S").to_string()).unwrap_or_else(|| "-".into()),
                r.last_run.as_ref().map(|l| l.run_key.as_str()).unwrap_or("-"),
                "█".repeat(bar_len)
            );
            if !r.files_changed.is_empty() {
                println!("{:<12} files: {}", "", r.files_changed.join(", "));
            }
            if let Some(n) = &r.note {
                println!("{:<12} {n}", "");
            }
        }
        let bad = rows.iter().filter(|r| r.state != DateState::Ok).count();
        println!("{job}: {} dates, {} need attention", rows.len(), bad);
    }

    pub fn lint(&self, all: &[(String, Vec<fixpoint_core::lint::Finding>)], errors: usize, warnings: usize) {
        if self.json {
            let files: Vec<serde_json::Value> = all.iter().map(|(f, fs)| json!({"file": f, "findings": fs})).collect();
            self.json(&json!({"files": files, "errors": errors, "warnings": warnings}));
            return;
        }
        for (file, findings) in all {
            for f in findings {
                let sev = match f.severity {
                    fixpoint_core::lint::Severity::Error => "error",
                    fixpoint_core::lint::Severity::Warning => "warning",
                };
                if f.line == 0 {
                    println!("{file}: {sev}[{}]: {}", f.rule, f.message);
                    println!("  (the target table) hint: {}", f.hint);
                } else {
                    println!("{file}:{}:{}: {sev}[{}]: {}", f.line, f.column, f.rule, f.message);
                    println!("  (source.sql line {}, column {}) hint: {}", f.sql_line, f.sql_column, f.hint);
                }
            }
        }
        println!("{} file(s): {errors} error(s), {warnings} warning(s)", all.len());
    }

    pub fn window(&self, w: &fixpoint_core::lookback::WindowReport) {
        if self.json {
            self.json(&serde_json::to_value(w).expect("window serializes"));
            return;
        }
        println!("{} {} with lookback {}: {} day(s) written, {} skipped, {} failed", w.job, w.run_date, w.lookback, w.written, w.skipped, w.failed);
        println!("{:<12} {:<10} {:>10}  why", "date", "action", "rows");
        for d in &w.days {
            let rows = d.report.as_ref().map(|r| r.output_rows.to_string()).unwrap_or_default();
            println!("{:<12} {:<10} {:>10}  {}", d.run_date, d.action, rows, d.reason);
        }
    }

    pub fn diff(&self, d: &fixpoint_core::diff::DiffReport) {
        if self.json {
            self.json(&serde_json::to_value(d).expect("diff serializes"));
            return;
        }
        println!("diff {} vs {} on key ({})", d.a, d.b, d.key.join(", "));
        println!("  A  {}", d.fingerprint_a);
        println!("  B  {}", d.fingerprint_b);
        if d.identical {
            println!("identical: {} rows, no row transferred", d.fingerprint_a.rows);
            return;
        }
        for r in &d.only_in_a_rows {
            println!("  only in A  {}", r.join(", "));
        }
        for r in &d.only_in_b_rows {
            println!("  only in B  {}", r.join(", "));
        }
        for r in &d.changed_rows {
            let changes: Vec<String> = r.changes.iter().map(|c| format!("{}: {} -> {}", c.column, c.a, c.b)).collect();
            println!("  changed    {}: {}", r.key.join(", "), changes.join("; "));
        }
        println!(
            "{} only in A, {} only in B, {} changed ({} segment queries per side, {} rows read)",
            d.only_in_a, d.only_in_b, d.changed, d.segment_queries, d.rows_transferred
        );
    }

    pub fn proof(&self, p: &fixpoint_core::prove::Proof) {
        if self.json {
            self.json(&serde_json::to_value(p).expect("proof serializes"));
            return;
        }
        println!("prove {} {} (scope: {})", p.job, p.run_date, p.scope);
        println!("  before    {} rows, checksum {}", p.before.rows, p.before.checksum);
        for r in &p.runs {
            println!("  run {}     {} rows, checksum {}  (run key {})", r.run, r.rows, r.checksum, r.run_key);
            for d in &r.differs_from_first {
                println!("            {d}");
            }
        }
        for c in &p.crash {
            let ok = |b: bool| if b { "yes" } else { "NO" };
            println!(
                "  crash at {:<14} previous contents kept: {}, ledger clean: {}, rerun converged: {}",
                c.point.name(),
                ok(c.previous_kept),
                ok(c.ledger_clean),
                ok(c.converged)
            );
        }
        if let Some(o) = &p.order {
            println!("  order     {}: {}", o.outcome, o.message);
            for s in &o.sample {
                println!("            {s}");
            }
        }
        if let Some(m) = &p.mutation {
            println!("  mutation  {}: {}", m.outcome, m.message);
            if !m.row.is_empty() {
                println!("            input row of {}: {{{}}}, changed {}", m.table, m.row.join(", "), m.change);
            }
            for s in &m.sample {
                println!("            {s}");
            }
        }
        for f in &p.failures {
            println!("  FAILED: {f}");
        }
        println!("{}", p.verdict);
    }

    pub fn runs(&self, entries: &[Entry]) {
        if self.json {
            self.json(&json!({"runs": entries}));
            return;
        }
        println!("{:<20} {:<16} {:<12} {:<10} {:>10} {:>10}  run key", "finished (UTC)", "job", "date", "outcome", "written", "rows");
        for e in entries {
            println!(
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
            let mut v = json!({"error": {"class": class_name(e.class()), "message": e.to_string(), "hint": hint, "exit_code": exit_code(e)}});
            if let Error::OutOfPartition { rows, column, sample, .. } = e {
                v["error"]["rows"] = json!(rows);
                v["error"]["column"] = json!(column);
                v["error"]["sample"] = json!(sample.0.iter().cloned().collect::<std::collections::BTreeMap<_, _>>());
            }
            if let Error::AuditFailed { audit, results, .. } = e {
                v["error"]["audit"] = json!(audit);
                v["error"]["audits"] = json!(results);
            }
            self.json(&v);
        }
    }
}

