//! The history strategy (slowly changing dimension, type 2): every version
//! of a key kept as a row with a half-open validity interval
//! `[valid_from, valid_to)`, the same table however often and in whatever
//! order the batches arrive.
//!
//! The contract (also in docs/strategies.md). For each key, the *version
//! log* is every version ever delivered: at one version a tombstone beats
//! an upsert, exact copies are one entry, two different upserts are a tie
//! (`on_tie`). The table is a function of the log alone: walking a key's
//! versions in order, an upsert starts a row unless the entry before it is
//! an upsert with the same tracked values (then it adds no row); a row ends
//! at the next entry that starts a row or is a tombstone (`valid_to`), or
//! stays open (NULL). A row holds the values of the version that started
//! it. The entries the table cannot show — upserts that started no row, and
//! tombstones — are kept beside it in `fixpoint."history__<schema>__<table>"`,
//! so a late older version is still placed exactly.
//!
//! A run recomputes, for each key its batch touches, the rows from the
//! first one the batch can change: the row holding (or ending at) the
//! batch's oldest version for the key. Older rows stay as they are.

mod sql;
mod transactional;

use std::time::Instant;

use crate::engine::Engine;
use crate::error::Result;
use crate::job::date::RunDate;
use crate::job::spec::Job;
use crate::run::protocol::RunOptions;
use crate::run::report::RunReport;

/// Runs `job` for `run_date` with the plan the engine can carry: in the
/// run's transaction, or under a lease where the engine replaces a table's
/// rows in one atomic step at the run's end (Delta: one commit) or
/// rewrites the partitions holding them (Spark).
pub(crate) fn history(job: &Job, run_date: RunDate, engine: &mut dyn Engine, opts: &RunOptions) -> Result<RunReport> {
    let started = Instant::now();
    let report = crate::run::input::with_input(job, run_date, engine, |engine, input| match engine.leases() {
        Some(leases) => crate::plans::lease::leased(leases, job, "all", opts, &[sql::log_table(&job.target)], |leases| transactional::history_with(job, run_date, leases, opts, input, started)),
        None => transactional::history_with(job, run_date, engine, opts, input, started),
    })?;
    Ok(report.unwrap_or_else(|| crate::run::report::no_files_report(job, run_date, started)))
}

pub use sql::log_table;
