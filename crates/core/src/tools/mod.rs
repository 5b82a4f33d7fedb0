//! The tools built on runs: backfill and status, lookback windows, the
//! proof of idempotency (with its mutations), diff and lint.

pub mod backfill;
pub mod diff;
pub mod lint;
pub mod lookback;
pub mod mutate;
pub mod prove;
