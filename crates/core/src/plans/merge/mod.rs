//! The merge strategy: upsert on the natural key, newest version wins, the
//! source deduplicated first, tombstones remembered, pruned to the
//! partitions the batch touches (the contract is in [`transactional`]).

mod leased;
pub mod refusals;
pub mod sql;
pub mod steps;
mod transactional;

use std::time::Instant;

use crate::engine::Engine;
use crate::error::Result;
use crate::job::date::RunDate;
use crate::job::spec::Job;
use crate::run::protocol::RunOptions;
use crate::run::report::RunReport;

/// Runs `job` for `run_date` with the plan the engine can carry.
pub(crate) fn merge(job: &Job, run_date: RunDate, engine: &mut dyn Engine, opts: &RunOptions) -> Result<RunReport> {
    let started = Instant::now();
    let report = crate::run::input::with_input(job, run_date, engine, |engine, input| {
        match engine.leases() {
            Some(leases) => leased::merge_with(job, run_date, leases, opts, input, started),
            None => transactional::merge_with(job, run_date, engine, opts, input, started),
        }
    })?;
    Ok(report.unwrap_or_else(|| crate::run::report::no_files_report(job, run_date, started)))
}
