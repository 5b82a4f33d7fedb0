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
//! - **portable**: every value is written as canonical text (see
//!   [`crate::engine::measure::portable_field`]: `NULL` is `\N`, text escapes `\` and
//!   `|`, so NULL differs from `''`; floats as [`write_float`]), the fields
//!   are joined with `|` in column order and hashed with MD5;
//!   the first 64 bits are summed. Every engine produces the same checksum for
//!   the same logical rows. MD5 because every engine has it natively
//!   (PostgreSQL and Spark hash inside the server, so a cross-engine `diff`
//!   moves no rows); DuckDB computes the same value in a Rust scalar function
//!   (the text written from the typed columns, many rows hashed at once by
//!   [`crate::fingerprint::md5lanes`]), several times faster than the text built in SQL.

pub mod md5lanes;
pub mod runkey;

use serde::Serialize;

use crate::job::digest::hash_hex;

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
pub const PORTABLE_KIND: &str = "portable-v3";

/// The canonical text of a float (portable-v3): the IEEE 754 bits of its
/// absolute value as a decimal integer, `-` in front for a negative value;
/// `0` for both zeros, `nan` for every NaN, `inf` and `-inf`. Exact (no
/// rounding, unlike a decimal form: Java's `%.16e` and C's give different
/// digits for the same double) and writable by every engine: PostgreSQL
/// reads the bits (`float8send`), DuckDB and Spark compute them with exact
/// arithmetic ([`float_bits_sql`]). A FLOAT/REAL is widened to a double
/// first, exactly.
pub fn write_float(buf: &mut Vec<u8>, v: f64) {
    use std::io::Write as _;
    if v.is_nan() {
        buf.extend_from_slice(b"nan");
    } else if v.is_infinite() {
        buf.extend_from_slice(if v > 0.0 { b"inf" } else { b"-inf" });
    } else if v == 0.0 {
        buf.push(b'0');
    } else {
        if v < 0.0 {
            buf.push(b'-');
        }
        let _ = write!(buf, "{}", v.abs().to_bits());
    }
}

/// [`write_float`] as a `String`.
pub fn float_text(v: f64) -> String {
    let mut b = Vec::new();
    write_float(&mut b, v);
    String::from_utf8(b).expect("ASCII")
}

/// The value a float's canonical text stands for, written for people
/// (Rust's shortest round-trip form: `0.1`, `1e300`); other texts as they are.
pub fn float_display(text: &str) -> String {
    let (neg, digits) = match text.strip_prefix('-') {
        Some(d) => (true, d),
        None => (false, text),
    };
    match digits.parse::<u64>() {
        Ok(bits) if bits < 0x7ff0_0000_0000_0000 => {
            let v = f64::from_bits(bits);
            format!("{:?}", if neg { -v } else { v })
        }
        _ => text.to_owned(),
    }
}

/// SQL computing the IEEE 754 bits of `a` as a BIGINT, for a finite
/// positive DOUBLE `a`, with exact arithmetic only (for engines without a
/// way to read a double's bits: DuckDB, Spark). The exponent is
/// `floor(log2(a))`, corrected by one either way where the logarithm
/// rounded across a power of two; the significand is `a` scaled by powers
/// of two (exact), in two steps so no factor overflows; subnormals are
/// `a * 2^1074`. No step overflows or underflows for any input, so an
/// engine that evaluates both branches of a CASE never fails on it.
pub fn float_bits_sql(a: &str) -> String {
    let e0 = format!("greatest(-1022, least(1023, floor(log2({a}))))");
    let e = format!("({e0} + CASE WHEN {a} * pow(2.0, -{e0}) >= 2 THEN 1 WHEN {a} * pow(2.0, -{e0}) < 1 THEN -1 ELSE 0 END)");
    let h = format!("floor((52 - {e}) / 2)");
    format!(
        "CASE WHEN {a} < 2.2250738585072014e-308 THEN CAST(least({a}, 2.2250738585072014e-308) * pow(2.0, 537) * pow(2.0, 537) AS BIGINT) \
         ELSE CAST({a} * pow(2.0, {h}) * pow(2.0, 52 - {e} - {h}) AS BIGINT) + CAST({e} + 1022 AS BIGINT) * 4503599627370496 END"
    )
}

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
    /// zone), `flag` BOOLEAN, `ratio` DOUBLE (a subnormal and the largest
    /// double among its values).
    pub const ROWS: &str = "(1, 7, 12.50, 'plain', DATE '2026-10-20', TIMESTAMP '2026-10-20 08:00:00', true, 0.1),
 (2, -3, -0.05, '', DATE '1999-12-31', TIMESTAMP '2026-10-20 08:00:00.123456', false, -2.5e-310),
 (3, NULL, NULL, NULL, NULL, NULL, NULL, NULL),
 (4, 0, 99999.99, 'ünïcödé ✓ ''quoted'' a|b \\ c', DATE '2026-02-28', TIMESTAMP '1970-01-01 00:00:00', true, 1.7976931348623157e308),
 (5, 1, 0.00, 'NULL', DATE '0001-01-01', TIMESTAMP '2026-10-21 23:59:59.999999', false, 0),
 (6, 2, 1.00, '\\N', DATE '9999-12-31', TIMESTAMP '2026-10-22 12:00:00.5', true, -1234.5e-300),
 (6, 2, 1.00, '\\N', DATE '9999-12-31', TIMESTAMP '2026-10-22 12:00:00.5', true, -1234.5e-300)";
    /// Their portable fingerprint's checksum (7 rows).
    pub const CHECKSUM: &str = "69a586629affa00e917ed17896bfa2a9";
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(v: f64) -> String {
        float_text(v)
    }

    #[test]
    fn floats_are_their_bits() {
        assert_eq!(text(1.5), "4609434218613702656");
        assert_eq!(text(-1.5), "-4609434218613702656");
        assert_eq!(text(0.0), "0");
        assert_eq!(text(-0.0), "0");
        assert_eq!(text(f64::NAN), "nan");
        assert_eq!(text(-f64::NAN), "nan");
        assert_eq!(text(f64::INFINITY), "inf");
        assert_eq!(text(f64::NEG_INFINITY), "-inf");
        assert_eq!(text(5e-324), "1");
        assert_eq!(text(f64::MAX), "9218868437227405311");
        // Neighbours differ; a float widened to a double keeps its value.
        assert_ne!(text(0.1), text(0.1 + f64::EPSILON / 16.0));
        assert_eq!(text(f64::from(0.1f32)), (f64::from(0.1f32)).to_bits().to_string());
    }

    #[test]
    fn float_texts_are_shown_as_numbers() {
        for v in [0.1, -2.5e-310, 1e300, -1234.5, f64::MAX, 5e-324] {
            assert_eq!(float_display(&text(v)), format!("{v:?}"));
            assert_eq!(float_display(&text(v)).parse::<f64>().unwrap(), v);
        }
        assert_eq!(float_display("0"), "0.0");
        for t in ["nan", "inf", "-inf", "x"] {
            assert_eq!(float_display(t), t);
        }
    }
}
