//! Database errors read as the user's: a fragment of the job file that
//! does not bind, a sample row for a refusal.


use crate::engine::Engine;
use crate::error::{DbFailure, Error, Result, SampleRow};
use crate::job::spec::Job;
use crate::job::sql::{Sql, Value};

/// A statement built from a SQL fragment of the job file (the merge's
/// `deleted` condition, an audit) failed: when the database could not bind
/// it, the job file's error naming `key` (exit 2), with the database's
/// message, `what` the fragment is, and `hint`; any other error as it was.
/// The caller's transaction rolls back: nothing was changed.
pub(crate) fn fragment_error(job: &Job, key: &str, what: &str, hint: String, e: Error) -> Error {
    match e {
        Error::Database { engine, message, failure: DbFailure::Binding, .. } => {
            // DuckDB quotes the statement around the error (`LINE 1: …`):
            // fixpoint's SQL, not the user's; the rest names what is wrong.
            let own = message.find("\nLINE ").map_or(message.as_str(), |i| &message[..i]);
            let own = own.lines().map(str::trim).filter(|l| !l.is_empty()).collect::<Vec<_>>().join(" ");
            job.spec_error(key, format!("{what} does not run on {engine}: {own}; nothing was changed"), hint)
        }
        other => other,
    }
}

/// The first row of a query, for error samples.
pub fn first_row(engine: &mut dyn Engine, sql: &Sql) -> Result<SampleRow> {
    first_row_of(engine.query(sql)?)
}

/// The first of `rows`, for error samples.
pub fn first_row_of(rows: crate::engine::Rows) -> Result<SampleRow> {
    let values = rows.rows.into_iter().next().unwrap_or_default();
    Ok(SampleRow(rows.columns.into_iter().zip(values.iter().map(Value::display)).collect()))
}
