//! `replace_partition`: the run's day replaced whole. Engines with
//! transactions delete and insert (or swap a partition) in one transaction
//! ([`transactional`]); engines without overwrite the day's partition in one
//! statement under a lease ([`leased`]).

mod leased;
mod transactional;

use std::time::Instant;

use crate::engine::Engine;
use crate::error::Result;
use crate::job::date::RunDate;
use crate::job::spec::Job;
use crate::run::input::with_input;
use crate::run::protocol::RunOptions;
use crate::run::report::{no_files_report, RunReport};

/// Runs `job` for `run_date` with the plan the engine can carry.
pub(crate) fn replace_partition(job: &Job, run_date: RunDate, engine: &mut dyn Engine, opts: &RunOptions) -> Result<RunReport> {
    let started = Instant::now();
    let report = with_input(job, run_date, engine, |engine, input| {
        match engine.leases() {
            Some(leases) => leased::replace_partition_with(job, run_date, leases, opts, input, started),
            None => transactional::replace_partition_with(job, run_date, engine, opts, input, started),
        }
    })?;
    Ok(report.unwrap_or_else(|| no_files_report(job, run_date, started)))
}
