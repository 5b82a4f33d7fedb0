//! fixpoint's core, written against a small [`engine::Engine`] trait; no
//! database drivers live here. The modules, each using only those above it:
//!
//! - [`error`]: errors and their classes;
//! - [`job`]: what the user declared (job file, dates, SQL, files, audits);
//! - [`engine`]: the traits an engine implements;
//! - [`fingerprint`]: fingerprints and run keys;
//! - [`run`]: the run protocol (options, input, transaction, report, ledger);
//! - [`plans`]: how each strategy changes the target;
//! - [`tools`]: what is built on runs (backfill, lookback, prove, diff, lint).
#![deny(missing_docs)]

pub mod engine;
pub mod error;
pub mod fingerprint;
pub mod job;
pub mod plans;
pub mod run;
pub mod tools;

pub use engine::{Column, Engine, Rows};
pub use error::{DbFailure, Error, ErrorClass, FailPoint, Result};
pub use fingerprint::{Fingerprint, Method};
pub use job::date::RunDate;
pub use job::ident::TableName;
pub use job::spec::{Job, Strategy};
pub use job::sql::{Sql, Value};
pub use run::protocol::{FaultAction, Observer, RunObserver, RunOptions};
pub use run::report::RunReport;
