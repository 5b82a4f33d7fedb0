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

/// For tests: the local S3-compatible server (`scripts/moto-local.sh`,
/// endpoint `FIXPOINT_TEST_S3`, default `http://127.0.0.1:5055`), or `None`
/// after saying `skipped` when it is not running; under `CI=true` it must be.
#[doc(hidden)]
pub fn test_s3_endpoint() -> Option<String> {
    let endpoint = std::env::var("FIXPOINT_TEST_S3").unwrap_or_else(|_| "http://127.0.0.1:5055".into());
    let addr = endpoint.trim_start_matches("http://").trim_end_matches('/').to_owned();
    let up = std::net::ToSocketAddrs::to_socket_addrs(&addr)
        .ok()
        .and_then(|mut a| a.next())
        .is_some_and(|a| std::net::TcpStream::connect_timeout(&a, std::time::Duration::from_secs(2)).is_ok());
    match up {
        true => Some(endpoint),
        false if std::env::var("CI").as_deref() == Ok("true") => panic!("no S3-compatible server at {endpoint} under CI=true (scripts/moto-local.sh start)"),
        false => {
            eprintln!("skipped: no S3-compatible server at {endpoint} (scripts/moto-local.sh start)");
            None
        }
    }
}
