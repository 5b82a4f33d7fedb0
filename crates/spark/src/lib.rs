//! The Spark engine (feature `spark`): fixpoint's SQL sent to a Spark
//! cluster over Spark Connect (`--db sc://host:port`), never the data pulled
//! into fixpoint.
//!
//! The engine: statements and queries with bound parameters, Spark's
//! errors (error class, SQLSTATE), table and query descriptions, the native
//! row hash and the portable fingerprint's canonical text, and what the
//! plans for engines without transactions need (`fixpoint_core`'s
//! `overwrite` module): cached stages, `INSERT OVERWRITE` with dynamic
//! partition overwrite, partition drops, and leases (a view per scope,
//! created atomically by the metastore).
#![cfg_attr(not(feature = "spark"), allow(unused))]
#![deny(missing_docs)]

#[cfg(feature = "spark")]
pub mod client;

#[cfg(feature = "spark")]
mod engine;

#[cfg(feature = "spark")]
mod lease;

#[cfg(feature = "spark")]
pub use engine::Spark;

/// Whether `url` names a Spark Connect server (`sc://…`).
pub fn is_spark_url(url: &str) -> bool {
    url.starts_with("sc://")
}
