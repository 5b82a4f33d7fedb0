//! Errors for people: each names the problem, where it is, and (when a fix is
//! known) a `hint`. The class decides the process exit code in the CLI.

use std::fmt;
use std::path::PathBuf;

/// What kind of failure this is; the CLI maps each class to one exit code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorClass {
    /// The job file, an argument or a SQL text is wrong: fix the input.
    Input,
    /// The source data was refused by a guard (rows outside the partition,
    /// too few rows, NULL keys): nothing was changed.
    Data,
    /// Another run holds the lock on the same target.
    Busy,
    /// The database or the file system failed at run time; a retry may work.
    Runtime,
    /// A fault injected on purpose (tests, `prove --crash`, the demo).
    Injected,
    /// The engine lacks a capability the job needs.
    Unsupported,
    /// A blocking audit failed: nothing was published.
    Audit,
    /// A bug in fixpoint.
    Internal,
}

/// Where a failure was injected on purpose, at a step boundary of a plan.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FailPoint {
    /// After the source was described and the guards passed.
    AfterGuards,
    /// After the partition's old rows were deleted.
    AfterDelete,
    /// After part of the new rows were inserted.
    MidInsert,
    /// After all new rows were inserted, before the ledger row.
    AfterInsert,
    /// After the ledger row was written, before COMMIT.
    BeforeCommit,
}

impl FailPoint {
    /// Every fail point, in plan order.
    pub const ALL: [FailPoint; 5] = [
        FailPoint::AfterGuards,
        FailPoint::AfterDelete,
        FailPoint::MidInsert,
        FailPoint::AfterInsert,
        FailPoint::BeforeCommit,
    ];

    /// The name used on the command line and in JSON.
    pub fn name(self) -> &'static str {
        match self {
            FailPoint::AfterGuards => "after_guards",
            FailPoint::AfterDelete => "after_delete",
            FailPoint::MidInsert => "mid_insert",
            FailPoint::AfterInsert => "after_insert",
            FailPoint::BeforeCommit => "before_commit",
        }
    }

    /// Parses a name given by [`FailPoint::name`].
    pub fn parse(s: &str) -> Option<FailPoint> {
        FailPoint::ALL.into_iter().find(|p| p.name() == s)
    }
}

impl fmt::Display for FailPoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A sample row shown in an error: column names and display values.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct SampleRow(pub Vec<(String, String)>);

impl fmt::Display for SampleRow {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("{")?;
        for (i, (k, v)) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{k}: {v}")?;
        }
        f.write_str("}")
    }
}

/// What kind of failure a database reported, as its engine reads its own
/// error: DuckDB's exception type, PostgreSQL's SQLSTATE, Spark's error
/// class. The core decides with it whether a failed statement is the
/// user's to fix (a source query, a `deleted` condition, an audit that
/// does not run) without reading any engine's message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DbFailure {
    /// The statement does not bind: a syntax error, an unknown table,
    /// column or function, an ambiguous name, a type that does not fit
    /// where it is written. Decided before any row is read.
    Binding,
    /// Another fault of the statement itself: a value it writes that does
    /// not convert (a literal of the wrong shape, a division by zero), a
    /// privilege the user lacks (PostgreSQL's and Spark's SQLSTATE classes
    /// 42 beyond the binding errors, and 22; DuckDB's conversion errors).
    Statement,
    /// Anything else: the database, the connection, the data.
    Other,
}

impl DbFailure {
    /// A fault of the statement (binding or otherwise).
    pub fn is_statement(self) -> bool {
        matches!(self, DbFailure::Binding | DbFailure::Statement)
    }
}

/// Every error fixpoint's libraries return.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The job file is wrong.
    #[error("{file}: {key}: {message}")]
    Spec {
        /// The job file.
        file: PathBuf,
        /// The key (or `line N`) that is wrong.
        key: String,
        /// What is wrong and what was expected.
        message: String,
        /// How to fix it, when known.
        hint: Option<String>,
    },
    /// An argument is wrong.
    #[error("{message}")]
    Argument {
        /// What is wrong and what was expected.
        message: String,
        /// How to fix it, when known.
        hint: Option<String>,
    },
    /// A SQL text given by the user cannot be used.
    #[error("{what}: {message}")]
    Sql {
        /// Which SQL (e.g. `source.sql`, `--where`).
        what: String,
        /// What is wrong, with line and column when known.
        message: String,
        /// How to fix it, when known.
        hint: Option<String>,
    },
    /// Source rows carry a partition value other than the run date.
    #[error("{rows} source row(s) have {column} other than the run date {run_date}; nothing was changed. One of them: {sample}")]
    OutOfPartition {
        /// How many rows.
        rows: u64,
        /// The partition column.
        column: String,
        /// The run date.
        run_date: String,
        /// One offending row.
        sample: SampleRow,
    },
    /// A blocking audit failed on the staged result; nothing was published.
    #[error("audit {audit} failed: {detail}; nothing was published{}", if sample.is_empty() { String::new() } else { format!(". One offending row: {sample}") })]
    AuditFailed {
        /// The first failing blocking audit.
        audit: String,
        /// What it found.
        detail: String,
        /// One offending row, when the audit has rows.
        sample: String,
        /// How many blocking audits failed.
        failed: usize,
        /// Every audit's result.
        results: Vec<crate::error::AuditResult>,
    },
    /// The source has fewer rows than the job's `min_rows`.
    #[error("the source has {rows} row(s) for {run_date}, fewer than min_rows = {min_rows}; nothing was changed")]
    TooFewRows {
        /// Rows the source returned.
        rows: u64,
        /// The job's minimum.
        min_rows: u64,
        /// The run date.
        run_date: String,
    },
    /// Source data refused for another reason (NULL keys, ties, …).
    #[error("{message}; nothing was changed")]
    DataRefused {
        /// What is wrong, with counts and an example.
        message: String,
        /// How to fix it, when known.
        hint: Option<String>,
    },
    /// A file source's files for the run are missing, incomplete or unreadable.
    #[error("{message}")]
    Files {
        /// What is wrong, naming the file (and line or row group, when known).
        message: String,
        /// How to fix it.
        hint: Option<String>,
    },
    /// The source and the target do not fit together.
    #[error("{message}")]
    Schema {
        /// What does not fit.
        message: String,
        /// How to fix it, when known.
        hint: Option<String>,
    },
    /// Another process holds the database or the run's lock.
    #[error("{message}")]
    Busy {
        /// Who holds what, and for how long we waited.
        message: String,
    },
    /// The database failed.
    #[error("{engine}: {context}: {message}")]
    Database {
        /// Engine name.
        engine: &'static str,
        /// What fixpoint was doing.
        context: String,
        /// The database's message.
        message: String,
        /// What kind of failure, as the engine reads its own error (a
        /// SQLSTATE, an exception type, an error class): never decided
        /// from the message by the core.
        failure: DbFailure,
    },
    /// The database refused the transaction for a reason a retry can fix
    /// (serialization failure, deadlock); the run was rolled back.
    #[error("{engine}: {context}: {message}")]
    Transient {
        /// Engine name.
        engine: &'static str,
        /// What fixpoint was doing.
        context: String,
        /// The database's message.
        message: String,
    },
    /// A file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// A failure injected on purpose.
    #[error("injected failure at {0}")]
    Injected(FailPoint),
    /// The engine cannot do what the job asks.
    #[error("{engine} does not support {capability}")]
    Unsupported {
        /// Engine name.
        engine: &'static str,
        /// What is missing.
        capability: String,
    },
    /// A bug.
    #[error("internal error: {0}")]
    Internal(String),
}

impl Error {
    /// The class of this error (decides the exit code).
    pub fn class(&self) -> ErrorClass {
        match self {
            Error::Spec { .. } | Error::Argument { .. } | Error::Sql { .. } | Error::Schema { .. } => {
                ErrorClass::Input
            }
            Error::OutOfPartition { .. } | Error::TooFewRows { .. } | Error::DataRefused { .. } | Error::Files { .. } => {
                ErrorClass::Data
            }
            Error::Busy { .. } => ErrorClass::Busy,
            Error::AuditFailed { .. } => ErrorClass::Audit,
            Error::Database { .. } | Error::Transient { .. } | Error::Io { .. } => ErrorClass::Runtime,
            Error::Injected(_) => ErrorClass::Injected,
            Error::Unsupported { .. } => ErrorClass::Unsupported,
            Error::Internal(_) => ErrorClass::Internal,
        }
    }

    /// A known fix, printed as `hint:` under the error.
    pub fn hint(&self) -> Option<String> {
        match self {
            Error::Spec { hint, .. }
            | Error::Argument { hint, .. }
            | Error::Sql { hint, .. }
            | Error::DataRefused { hint, .. }
            | Error::Files { hint, .. }
            | Error::Schema { hint, .. } => hint.clone(),
            Error::OutOfPartition { column, .. } => Some(format!(
                "filter the source to the run's day (e.g. `WHERE {column} = :run_date`); a row written outside the run's partition would never be replaced by a rerun"
            )),
            Error::AuditFailed { failed, .. } => Some(format!(
                "{failed} blocking audit(s) failed; the previous contents are in place. Fix the upstream data, or make the audit severity = \"warn\" if it should not block"
            )),
            Error::TooFewRows { .. } => Some(
                "an empty or short upstream must not wipe a day: check the upstream delivery, or lower min_rows in the job file".into(),
            ),
            Error::Busy { .. } => Some("wait for the other run to finish, or raise --wait".into()),
            Error::Transient { .. } => Some("nothing was committed; fixpoint retried the run and gave up; run it again".into()),
            _ => None,
        }
    }

    /// Shorthand for an argument error.
    pub fn argument(message: impl Into<String>, hint: Option<&str>) -> Error {
        Error::Argument { message: message.into(), hint: hint.map(str::to_owned) }
    }
}

/// Result with fixpoint's error.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Hides the password of a URL (`postgres://u:secret@h/db` → `postgres://u:***@h/db`),
/// so no output, log or error ever shows it.
pub fn redact_url(url: &str) -> String {
    let Some(scheme_end) = url.find("://") else { return url.to_owned() };
    let rest = &url[scheme_end + 3..];
    let Some(at) = rest.rfind('@') else { return url.to_owned() };
    match rest[..at].find(':') {
        Some(colon) => format!("{}://{}:***{}", &url[..scheme_end], &rest[..colon], &rest[at..]),
        None => url.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::redact_url;

    #[test]
    fn passwords_are_hidden() {
        assert_eq!(redact_url("postgres://u:s3cret@localhost:5432/db"), "postgres://u:***@localhost:5432/db");
        assert_eq!(redact_url("postgres://u@localhost/db"), "postgres://u@localhost/db");
        assert_eq!(redact_url("duckdb:x.duckdb"), "duckdb:x.duckdb");
        assert_eq!(redact_url("postgres://u:p@ss@h/db"), "postgres://u:***@h/db");
    }
}

/// What one audit found.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct AuditResult {
    /// The audit's name.
    pub name: String,
    /// `error` or `warn`.
    pub severity: String,
    /// Whether it passed.
    pub passed: bool,
    /// Offending rows (for the row count audits: the rows counted).
    pub offending: u64,
    /// What was found, in one sentence.
    pub detail: String,
    /// Up to 5 offending rows.
    pub sample: Vec<String>,
}
