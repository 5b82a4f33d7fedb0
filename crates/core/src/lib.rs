//! fixpoint's core: job specs, run dates, plans, run keys, fingerprints and
//! the ledger, written against a small [`engine::Engine`] trait. No database
//! drivers live here.
#![deny(missing_docs)]

pub mod audit;
pub mod backfill;
pub mod date;
pub mod diff;
pub mod engine;
pub mod error;
pub mod files;
pub mod fingerprint;
pub mod ident;
pub mod ledger;
pub mod lint;
pub mod lookback;
pub mod md5lanes;
mod merge;
pub mod mutate;
mod overwrite;
pub mod prove;
pub mod run;
pub mod runkey;
pub mod schema;
pub mod spec;
pub mod sql;
pub mod sqlrefs;

pub use date::RunDate;
pub use engine::{Column, Engine, Rows};
pub use error::{Error, ErrorClass, FailPoint, Result};
pub use fingerprint::{Fingerprint, Method};
pub use ident::TableName;
pub use run::{FaultAction, RunOptions, RunReport};
pub use spec::{Job, Strategy};
pub use sql::{Sql, Value};
