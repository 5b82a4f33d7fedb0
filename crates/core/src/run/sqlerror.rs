//! Database errors read as the user's: a fragment of the job file that
//! does not bind, a sample row for a refusal.


use crate::engine::Engine;
use crate::error::{Error, Result, SampleRow};
use crate::job::spec::Job;
use crate::job::sql::{Sql, Value};

/// Whether an engine's error message says a statement could not be
/// bound: an unknown column, table or function, a syntax error, a type
/// that does not fit where it is used. Decided before any row is read, so
/// a statement whose other parts (fixpoint's SQL, the already described
/// source) bind, failing so, failed in the user's fragment. DuckDB's
/// parser, binder and catalog errors; PostgreSQL's SQLSTATEs 42601
/// (syntax), 42P01 (table), 42703 (column), 42883 (function), 42702 and
/// 42725 (ambiguous), 42804 (datatype mismatch); Spark's analysis errors.
pub(crate) fn is_binding_error(message: &str) -> bool {
    [
        "Parser Error",
        "Binder Error",
        "Catalog Error",
        "(SQLSTATE 42601)",
        "(SQLSTATE 42P01)",
        "(SQLSTATE 42703)",
        "(SQLSTATE 42883)",
        "(SQLSTATE 42702)",
        "(SQLSTATE 42725)",
        "(SQLSTATE 42804)",
        "[UNRESOLVED_COLUMN",
        "[UNRESOLVED_ROUTINE",
        "[TABLE_OR_VIEW_NOT_FOUND",
        "[PARSE_SYNTAX_ERROR",
        "[DATATYPE_MISMATCH",
    ]
    .iter()
    .any(|m| message.contains(m))
}

/// A statement built from a SQL fragment of the job file (the merge's
/// `deleted` condition, an audit) failed: when the database could not bind
/// it, the job file's error naming `key` (exit 2), with the database's
/// message, `what` the fragment is, and `hint`; any other error as it was.
/// The caller's transaction rolls back: nothing was changed.
pub(crate) fn fragment_error(job: &Job, key: &str, what: &str, hint: String, e: Error) -> Error {
    match e {
        Error::Database { engine, message, .. } if is_binding_error(&message) => {
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
    let rows = engine.query(sql)?;
    let values = rows.rows.into_iter().next().unwrap_or_default();
    Ok(SampleRow(rows.columns.into_iter().zip(values.iter().map(Value::display)).collect()))
}
