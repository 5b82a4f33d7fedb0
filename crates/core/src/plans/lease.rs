//! Plans for engines without multi-statement transactions (Spark on plain
//! parquet tables): nothing is deleted row by row; a run replaces whole
//! partitions, each replacement one statement that commits or leaves the
//! old partition as it was.
//!
//! `replace_partition`: first, before the lease, a retry whose run key and
//! day match the ledger's last entry for the day is skipped (the guards,
//! the input fingerprint and the day's fingerprint in one query; it only
//! reads, so it needs no lease). Then, under a lease on (job, target,
//! date), where the engine observes its writes ([`crate::engine::ObservedWrites`])
//! and nothing needs the input before the write: one write of the day
//! that reads the source once, guarded inside it, its rows counted and
//! both fingerprints summed on the way; then the ledger row. Otherwise:
//! 1. the guards and the input fingerprint in one scan of the source;
//!    nothing has been written yet, so a refusal changes nothing;
//! 2. a retry whose run key and partition match the ledger's last entry is
//!    skipped;
//! 3. one `INSERT OVERWRITE` of the day (dynamic partition overwrite: the
//!    new files are written aside and swapped in when the job commits; a
//!    failed job leaves the old partition). The rows pass a second guard
//!    inside that statement (`raise_error` on a row of another date), so
//!    a source that changed since step 1 can never write outside the day;
//! 4. the day is fingerprinted as written and compared with the input;
//! 5. the ledger row is appended.
//!
//! What differs from a transactional engine, and is documented: the commit
//! point is step 3. A failure before it leaves the previous contents; a
//! failure after it (at 4 or 5) leaves the run's complete output without a
//! ledger row, which the next run finds, rewrites to the same fingerprint
//! and records. There is never a half-written day.
//!
//! `merge` is a copy-on-write of the partitions the batch touches: the
//! winners per key among the batch and those partitions' rows are
//! materialized, then written over those partitions in one statement.


use crate::engine::Leases;
use crate::error::{Error, Result};
use crate::run::protocol::RunOptions;
use crate::job::ident::TableName;
use crate::job::spec::Job;

/// Runs `body` holding the lease of `scope` of `job`, released afterwards
/// whatever happens (a crash leaves it to expire); the run's tables (`also`
/// beside the target and the ledger) refreshed first.
pub(crate) fn leased<T>(engine: &mut dyn Leases, job: &Job, scope: &str, opts: &RunOptions, also: &[TableName], body: impl FnOnce(&mut dyn Leases) -> Result<T>) -> Result<T> {
    let key = format!("fixpoint:{}:{}:{scope}", job.name, job.target);
    if let Err(holder) = engine.acquire_lease(&key, !opts.no_wait)? {
        return Err(Error::Busy { message: format!("another run of job {} holds the lease on {} ({scope}): {holder}", job.name, job.target) });
    }
    // What this session read of the run's tables before the lease (the
    // check for a skip, an earlier run in the same session) may be stale:
    // another run may have written them since.
    let result = refresh_tables(engine, job, also).and_then(|()| body(engine));
    if let Err(e) = engine.release_lease(&key) {
        // The run's outcome stands; the lease expires on its own.
        eprintln!("fixpoint: {}: could not release the lease on {} ({scope}): {e}; it expires on its own", job.name, job.target);
    }
    result
}


/// The tables a run of `job` reads and writes under its lease, refreshed
/// ([`Leases::refresh`]): the target, the ledger, and `also` (a merge's
/// tombstones, a history's log).
fn refresh_tables(engine: &mut dyn Leases, job: &Job, also: &[TableName]) -> Result<()> {
    engine.refresh(&job.target)?;
    engine.refresh(&crate::run::ledger::ledger_table())?;
    for t in also {
        engine.refresh(t)?;
    }
    Ok(())
}
