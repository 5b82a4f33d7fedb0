//! Running a job: the plan (describe, guard, lock, change, record, commit),
//! written once against [`Engine`].

use std::time::Instant;

use serde::Serialize;

use crate::job::date::RunDate;
use crate::fingerprint::Fingerprint;
use crate::run::ledger;
use crate::job::spec::Job;

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
    pub audits: Vec<crate::error::AuditResult>,
    /// A file source's files, with their sizes and content hashes (the run
    /// key is made from them).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub input_files: Option<crate::job::files::InputFiles>,
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

/// The report of a run whose day has no files, with `allow_missing = true`.
pub(crate) fn no_files_report(job: &Job, run_date: RunDate, started: Instant) -> RunReport {
    let empty = Fingerprint { kind: crate::job::files::FILES_KIND.into(), rows: 0, checksum: String::new() };
    let mut report = RunReport::new(job, run_date, String::new(), "skipped", &empty, &empty);
    let pattern = job.source.files.as_ref().map(|f| f.expand(run_date).display().to_string()).unwrap_or_default();
    report.skip_reason = Some(format!("no file matches {pattern} and the job has allow_missing = true: the target is left as it is"));
    report.method = "none".into();
    report.elapsed_ms = elapsed_ms(started);
    report
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

/// A run's wall time in whole milliseconds, rounded to the nearest (not
/// truncated: the benchmarks compare it with times measured in fractions of
/// a millisecond, and truncating would shave ~0.5 ms off every run).
pub(crate) fn elapsed_ms(started: Instant) -> u64 {
    (started.elapsed().as_secs_f64() * 1000.0).round() as u64
}
