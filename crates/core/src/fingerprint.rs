//! Fingerprints: (row count, order-independent checksum) of a set of rows,
//! computed inside the engine.
//!
//! Each row is hashed to a 64-bit value and the hashes are *summed* (not
//! XORed), so a duplicated row changes the sum. The sum is then mixed with the
//! fingerprint's kind and the column signature (names and types, in order),
//! so the same values in differently typed columns (`1` vs `'1'`) never
//! compare equal, and a fingerprint made one way is never compared with one
//! made another way.
//!
//! Two methods:
//! - **native**: the engine's fastest row hash (DuckDB: `hash(c1, …, cn)`).
//!   Its kind names the engine and its version, because the hash may change
//!   with an upgrade; the ledger, skips and proofs use it.
//! - **portable**: every value is encoded canonically as text with a type tag
//!   and a length prefix (`NULL` has its own tag, so it differs from `''`),
//!   the row's encodings are concatenated in column order and hashed with MD5;
//!   the first 64 bits are summed. Every engine produces the same checksum for
//!   the same logical rows. MD5 because every engine has it natively
//!   (PostgreSQL and Spark hash inside the server, so a cross-engine `diff`
//!   moves no rows); DuckDB computes the same value in a Rust scalar function
//!   (the text written from the typed columns, many rows hashed at once by
//!   [`crate::md5lanes`]), several times faster than the text built in SQL.

use serde::Serialize;

use crate::runkey::hash_hex;

/// How the rows are hashed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Method {
    /// The engine's native row hash.
    Native,
    /// The canonical encoding shared by every engine.
    Portable,
}

/// Version of the portable encoding; part of the portable kind.
pub const PORTABLE_KIND: &str = "portable-v2";

/// A fingerprint of a set of rows.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Fingerprint {
    /// How it was made (engine, hash, encoding version).
    pub kind: String,
    /// Row count.
    pub rows: u64,
    /// Order-independent checksum, 32 hex digits.
    pub checksum: String,
}

impl Fingerprint {
    /// Builds a fingerprint from the engine's count and sum of row hashes.
    /// `signature` lists the hashed columns as `name type` in order.
    pub fn from_sum(kind: &str, signature: &[String], rows: u64, sum: i128) -> Fingerprint {
        let sig = signature.join(",");
        let checksum = hash_hex(&["fixpoint-fp-v1", kind, &sig, &rows.to_string(), &sum.to_string()]);
        Fingerprint { kind: kind.to_owned(), rows, checksum }
    }
}

impl std::fmt::Display for Fingerprint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} rows, checksum {}", self.rows, self.checksum)
    }
}

/// Rows whose portable fingerprint every engine's tests pin to the same
/// value ([`golden::CHECKSUM`]): engines that cannot be built together (the
/// Spark client and DuckDB's bundled build) are compared through it.
#[doc(hidden)]
pub mod golden {
    /// The columns, in order: `id` BIGINT, `small` SMALLINT, `amount`
    /// DECIMAL(12,2), `name` text, `day` DATE, `ts` TIMESTAMP (no time
    /// zone), `flag` BOOLEAN.
    pub const ROWS: &str = "(1, 7, 12.50, 'plain', DATE '2026-10-20', TIMESTAMP '2026-10-20 08:00:00', true),
 (2, -3, -0.05, '', DATE '1999-12-31', TIMESTAMP '2026-10-20 08:00:00.123456', false),
 (3, NULL, NULL, NULL, NULL, NULL, NULL),
 (4, 0, 99999.99, 'ünïcödé ✓ ''quoted'' a|b \\ c', DATE '2026-02-28', TIMESTAMP '1970-01-01 00:00:00', true),
 (5, 1, 0.00, 'NULL', DATE '0001-01-01', TIMESTAMP '2026-10-21 23:59:59.999999', false),
 (6, 2, 1.00, '\\N', DATE '9999-12-31', TIMESTAMP '2026-10-22 12:00:00.5', true),
 (6, 2, 1.00, '\\N', DATE '9999-12-31', TIMESTAMP '2026-10-22 12:00:00.5', true)";
    /// Their portable fingerprint's checksum (7 rows).
    pub const CHECKSUM: &str = "b54d7271c1402e8b2fa088edac1dbf8e";
}
