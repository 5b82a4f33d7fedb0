//! The job: what the user declared (the job file, its run dates, its
//! source's SQL and files, its audits) and the names it may use. Nothing
//! here talks to a database.

pub mod audit;
pub mod date;
pub mod dialect;
pub mod digest;
pub mod files;
pub mod ident;
#[cfg(feature = "s3")]
pub mod objects;
pub mod spec;
pub mod sql;
pub mod sqlrefs;
