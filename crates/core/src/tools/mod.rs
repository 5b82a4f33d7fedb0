//! The tools built on runs: backfill and status, lookback windows, the
//! proof of idempotency (with its mutations), diff and lint.

pub mod backfill;
pub mod diff;
pub mod lint;
pub mod lookback;
pub mod mutate;
pub mod prove;

use crate::engine::Engine;
use crate::error::Result;
use crate::job::sql::Sql;

/// Keeps `query`'s rows as they are now, as the relation `name` (quoted),
/// for a tool's comparisons after later runs: a temporary table, or where
/// runs are leased the engine's own copy ([`crate::engine::Leases::stage_copy`]:
/// on Spark a table behind a view, as a view would be recomputed from the
/// rows a later run writes). [`drop_snapshot`] drops it.
pub(crate) fn snapshot(engine: &mut dyn Engine, name: &str, query: &Sql) -> Result<()> {
    match engine.leases() {
        Some(leases) => leases.stage_copy(name, query),
        None => engine.create_temp_table_as(name, query).map(|_| ()),
    }
}

/// Drops what [`snapshot`] made (nothing when it is gone).
pub(crate) fn drop_snapshot(engine: &mut dyn Engine, name: &str) -> Result<()> {
    match engine.leases() {
        Some(leases) => leases.unstage(name),
        None => engine.execute(&Sql::raw(format!("DROP TABLE IF EXISTS {name}"))).map(|_| ()),
    }
}
