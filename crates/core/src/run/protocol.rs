//! The run protocol: options (fail points for tests), the fence of a run's
//! scope, its transaction, and step timings.

use std::sync::Arc;
use std::time::Instant;

use crate::engine::{Engine, RunSteps};
use crate::error::{Error, FailPoint, Result};
use crate::job::date::RunDate;
use crate::job::spec::Job;
pub(crate) use crate::run::report::elapsed_ms;
use crate::run::report::RunReport;

/// What to do at a fail point.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultAction {
    /// Return [`Error::Injected`]; the plan rolls back.
    Error,
    /// Abort the process on the spot, like `kill -9`.
    Abort,
    /// Sleep this many milliseconds there, then go on (to make concurrent
    /// runs overlap in tests).
    Pause(u64),
}

/// Options of one run.
#[derive(Debug, Clone, Default)]
pub struct RunOptions {
    /// Rewrite even when the target already holds this run's output.
    pub force: bool,
    /// Fail on purpose at a step boundary (tests, proofs, the demo).
    pub fault: Option<(FailPoint, FaultAction)>,
    /// When another run holds the job's lock, fail at once (exit 5) instead of waiting.
    pub no_wait: bool,
    /// Told when the run starts, when its run key is known and when it
    /// ends (lineage events). Not passed on to the runs of `prove`.
    pub observer: Option<Observer>,
}

/// What a run tells whoever watches it (the CLI's lineage events). Each
/// call is made on the thread running the date; a backfill with
/// `--parallel` calls from several threads at once.
pub trait RunObserver: Send + Sync {
    /// The run of `job` for `run_date` begins (nothing read yet).
    fn started(&self, job: &Job, run_date: RunDate);
    /// The run has read its input and knows its run key; nothing of it is
    /// committed yet. May be called again when a run rolled back by a
    /// serialization failure is retried.
    fn run_key_known(&self, job: &Job, run_date: RunDate, run_key: &str);
    /// The run ended: committed or skipped (`Ok`), or failed and rolled
    /// back (`Err`). `engine` is the run's connection, outside any
    /// transaction, to read what the run left (the target's columns); none
    /// when the run failed before it had one.
    fn finished(&self, job: &Job, run_date: RunDate, result: std::result::Result<&RunReport, &Error>, engine: Option<&mut dyn Engine>);
}

/// A shared [`RunObserver`].
#[derive(Clone)]
pub struct Observer(pub Arc<dyn RunObserver>);

impl std::fmt::Debug for Observer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Observer(..)")
    }
}

/// Takes the run's lock (inside its transaction): one job, one scope at a time.
pub(crate) fn fence(engine: &mut dyn Engine, job: &Job, scope: &str, opts: &RunOptions) -> Result<()> {
    let key = format!("fixpoint:{}:{}:{scope}", job.name, job.target);
    if crate::engine::lock_scope(engine, &key, !opts.no_wait)? {
        Ok(())
    } else {
        Err(Error::Busy { message: format!("another run of job {} holds the lock on {} ({scope}); --no-wait was given", job.name, job.target) })
    }
}

impl RunOptions {
    /// Tells the observer, if any, that the run's key is known.
    pub(crate) fn run_key_known(&self, job: &Job, run_date: RunDate, run_key: &str) {
        if let Some(o) = &self.observer {
            o.0.run_key_known(job, run_date, run_key);
        }
    }

    /// Tells the observer, if any, of a run that was found done without
    /// running it (a backfill's date whose target already holds its
    /// output): it started and ended, skipped, with `report`.
    pub(crate) fn observe_done(&self, job: &Job, run_date: RunDate, report: &RunReport, engine: Option<&mut dyn Engine>) {
        if let Some(o) = &self.observer {
            o.0.started(job, run_date);
            o.0.finished(job, run_date, Ok(report), engine);
        }
    }

    pub(crate) fn step(&self, at: FailPoint) -> Result<()> {
        match self.fault {
            Some((p, FaultAction::Error)) if p == at => Err(Error::Injected(at)),
            Some((p, FaultAction::Abort)) if p == at => std::process::abort(),
            Some((p, FaultAction::Pause(ms))) if p == at => {
                eprintln!("fixpoint: pausing {ms} ms at fail point {} (test mode)", at.name());
                std::thread::sleep(std::time::Duration::from_millis(ms));
                Ok(())
            }
            _ => Ok(()),
        }
    }
}

/// A run's fail points and step trace, lent to an accelerated step.
pub(crate) struct Steps<'a> {
    pub(crate) opts: &'a RunOptions,
    pub(crate) trace: &'a mut Trace,
}

impl RunSteps for Steps<'_> {
    fn fail_point(&self, at: FailPoint) -> Result<()> {
        self.opts.step(at)
    }

    fn step(&mut self, what: &str) {
        self.trace.step(what);
    }
}


/// Step timings on stderr when `FIXPOINT_TRACE` is set (for profiling),
/// with the process's minor page faults (first touches of memory) of each
/// step where the system tells them (Linux).
pub(crate) struct Trace {
    on: bool,
    last: Instant,
    faults: u64,
}

/// With `FIXPOINT_TRACE=sql`, each statement an engine runs is timed on
/// stderr (for profiling a plan): the engines call this with the
/// statement's start and text after it ends.
pub fn trace_statement(started: Instant, text: &str) {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    if *ON.get_or_init(|| std::env::var("FIXPOINT_TRACE").is_ok_and(|v| v == "sql")) {
        let flat: String = text.split_whitespace().collect::<Vec<_>>().join(" ");
        let shown: String = flat.chars().take(240).collect();
        eprintln!("fixpoint: sql {:>8.1} ms  {shown}", started.elapsed().as_secs_f64() * 1000.0);
    }
}

/// This process's minor page faults so far (`/proc/self/stat`, field 10;
/// 0 where there is none).
pub fn minor_faults() -> u64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // The command name (field 2) may hold spaces: count after its ')'.
    stat.rsplit_once(')').and_then(|(_, rest)| rest.split_whitespace().nth(7)).and_then(|f| f.parse().ok()).unwrap_or(0)
}

impl Trace {
    pub(crate) fn new() -> Trace {
        let on = std::env::var_os("FIXPOINT_TRACE").is_some();
        Trace { on, last: Instant::now(), faults: if on { minor_faults() } else { 0 } }
    }

    pub(crate) fn step(&mut self, what: &str) {
        if self.on {
            let now = Instant::now();
            let faults = minor_faults();
            eprintln!("fixpoint: {what:<24} {:>8.1} ms {:>7} faults", (now - self.last).as_secs_f64() * 1000.0, faults.saturating_sub(self.faults));
            self.last = now;
            self.faults = faults;
        }
    }
}

/// Runs `body` inside a transaction: commit on success, roll back on error.
pub(crate) fn in_transaction<T>(engine: &mut dyn Engine, body: impl FnOnce(&mut dyn Engine) -> Result<T>) -> Result<T> {
    engine.begin()?;
    match body(engine) {
        Ok(v) => {
            engine.commit()?;
            Ok(v)
        }
        Err(e) => {
            // The original error is what the user needs; a failed rollback
            // (connection gone) leaves nothing committed either way.
            let _ = engine.rollback();
            Err(e)
        }
    }
}
