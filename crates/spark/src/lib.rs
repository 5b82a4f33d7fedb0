//! The Spark engine (feature `spark`): fixpoint's SQL sent to a Spark
//! cluster over Spark Connect (`--db sc://host:port`), never the data pulled
//! into fixpoint.
//!
//! Status: the connection, statements and queries with bound parameters,
//! Spark's errors (error class, SQLSTATE), table and query descriptions, the
//! native row hash and the portable fingerprint's canonical text. Spark has
//! no transactions across statements, so the strategies' Spark plans
//! (`INSERT OVERWRITE` of a partition, copy-on-write merge, a lease in the
//! ledger) are separate work; until they exist a run on Spark is refused
//! with a clear error instead of being run without its guarantees.
#![cfg_attr(not(feature = "spark"), allow(unused))]
#![deny(missing_docs)]

#[cfg(feature = "spark")]
pub mod client;

#[cfg(feature = "spark")]
mod engine;

#[cfg(feature = "spark")]
pub use engine::Spark;

/// Whether `url` names a Spark Connect server (`sc://…`).
pub fn is_spark_url(url: &str) -> bool {
    url.starts_with("sc://")
}
