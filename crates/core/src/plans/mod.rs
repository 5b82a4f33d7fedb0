//! The plans: how a run changes the target, one folder per strategy. This
//! module picks the plan; the steps the plans share are in [`steps`], the
//! lease of engines without transactions in [`lease`].

pub mod history;
pub(crate) mod lease;
pub mod merge;
pub(crate) mod replace;
pub(crate) mod steps;

use crate::engine::Engine;
use crate::error::{Error, Result};
use crate::job::date::RunDate;
use crate::job::spec::{Job, Strategy};
use crate::run::protocol::RunOptions;
use crate::run::report::RunReport;

impl Job {
    /// Runs the job for one logical date: the seed's `load_daily_orders(run_date, conn)`
    /// made general. Safe to call any number of times.
    pub fn load(&self, run_date: RunDate, engine: &mut dyn Engine) -> Result<RunReport> {
        self.load_with(run_date, engine, &RunOptions::default())
    }

    /// [`Job::load`] with options.
    pub fn load_with(&self, run_date: RunDate, engine: &mut dyn Engine, opts: &RunOptions) -> Result<RunReport> {
        let Some(observer) = &opts.observer else {
            return self.load_retrying(run_date, engine, opts);
        };
        observer.0.started(self, run_date);
        let result = self.load_retrying(run_date, engine, opts);
        observer.0.finished(self, run_date, result.as_ref(), Some(engine));
        result
    }

    /// [`Job::load_with`] without the observer's calls around it.
    fn load_retrying(&self, run_date: RunDate, engine: &mut dyn Engine, opts: &RunOptions) -> Result<RunReport> {
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
            Strategy::ReplacePartition => replace::replace_partition(self, run_date, engine, opts),
            Strategy::Merge => merge::merge(self, run_date, engine, opts),
            Strategy::History => history::history(self, run_date, engine, opts),
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
