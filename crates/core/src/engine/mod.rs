//! What an engine is to fixpoint: the small [`Engine`] trait every engine
//! implements, its [`Dialect`], the capabilities only some have, and the
//! rows it returns. fixpoint's plans are written once against these.

pub mod accel;
mod dialect;
pub mod measure;
mod rows;
mod traits;

pub use accel::{Accelerated, DayInsert, MergeRequest, Merged, RunSteps, TappedDay};
pub use dialect::Dialect;
pub use rows::{Column, Row, Rows};
pub use traits::{Accelerator, DayPartition, Engine, FileInput, Leases, Locks, Observed, ObservedWrites, PartitionExchange};

use crate::error::{Error, Result};
use crate::job::sql::Sql;


/// A short, one-line description of a statement for error context.
pub fn statement_context(sql: &str) -> String {
    let one_line: String = sql.split_whitespace().collect::<Vec<_>>().join(" ");
    if one_line.chars().count() > 120 {
        format!("running `{}…`", one_line.chars().take(120).collect::<String>())
    } else {
        format!("running `{one_line}`")
    }
}

/// Runs `sql`, a query returning one row, and reads the count in `column`;
/// `what` names the query in errors.
pub fn query_count(engine: &mut dyn Engine, sql: &Sql, column: &str, what: &str) -> Result<u64> {
    engine.query(sql)?.single(what)?.count(column)
}

/// Takes the lock of `scope` ([`Locks::lock_scope`]); an engine without
/// locks has one writer, fenced already: `true`.
pub fn lock_scope(engine: &mut dyn Engine, scope: &str, wait: bool) -> Result<bool> {
    match engine.locks() {
        Some(locks) => locks.lock_scope(scope, wait),
        None => Ok(true),
    }
}

/// The engine's [`FileInput`], or the error naming the missing capability.
pub fn file_input(engine: &mut dyn Engine) -> Result<&mut dyn FileInput> {
    let name = engine.name();
    engine.file_input().ok_or_else(|| Error::Unsupported { engine: name, capability: "file sources".into() })
}

/// The engine's [`PartitionExchange`], or the error naming the missing
/// capability.
pub fn partition_exchange(engine: &mut dyn Engine) -> Result<&mut dyn PartitionExchange> {
    let name = engine.name();
    engine.partition_exchange().ok_or_else(|| Error::Unsupported { engine: name, capability: "partition exchange".into() })
}
