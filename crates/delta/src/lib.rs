//! The Delta Lake engine for fixpoint (cargo feature `delta`).
//!
//! `--db delta:PATH` (or `delta:s3://bucket/prefix`) is a warehouse of
//! Delta tables: `schema.table` is the Delta table in `PATH/schema/table`. The job's SQL, guards, fingerprints
//! and dedup run in an embedded DuckDB, which reads each table through a
//! view over the active files of the snapshot the run loaded; every write is
//! a Delta commit made with delta-rs (the `deltalake-core` crate, without
//! DataFusion: DuckDB writes the Parquet files, delta-rs commits the
//! actions).
//!
//! A run's data changes are one commit, made when the run records itself:
//! it removes the replaced files, adds the new ones, and carries an
//! application transaction (`txn`, app id `fixpoint:<job>:<run date>`,
//! the next version for that app id) and commit info naming the run key and
//! the run's ledger entry (both fingerprints). The commit is conditional on
//! the snapshot the run read: a concurrent writer in between makes it fail,
//! and the run then either finds that writer's identical commit (done) or
//! stops with nothing written (busy). The ledger (`fixpoint.runs`) is a
//! Delta table appended after the data commit; the data table's own log is
//! the record of truth, so a ledger row lost after the data commit is
//! written by the next process that opens the warehouse.

#[cfg(feature = "delta")]
mod engine;
#[cfg(feature = "delta")]
mod store;
#[cfg(feature = "delta")]
mod table;

#[cfg(feature = "delta")]
pub use engine::{Delta, DeltaFault};

/// Whether `url` names a Delta warehouse (`delta:PATH`).
pub fn is_delta_url(url: &str) -> bool {
    url.starts_with("delta:")
}

/// For tests: the local S3-compatible server, or `None` after saying
/// `skipped` (see `fixpoint_core::job::objects::test_s3_endpoint`).
#[cfg(feature = "delta")]
#[doc(hidden)]
pub use fixpoint_core::job::objects::test_s3_endpoint;
