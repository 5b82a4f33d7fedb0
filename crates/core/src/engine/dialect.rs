//! The SQL an engine writes its own way: its row hashes (native and
//! portable), its text type, how it returns sums and names a row.

use crate::engine::rows::Column;
use crate::error::{Error, Result};
use crate::job::sql::Value;

/// The SQL an engine writes its own way, for fingerprints and the checks
/// of `prove`.
pub trait Dialect {
    /// An expression hashing one row of `alias` over `columns` to a 64-bit
    /// integer, natively; `None` when the engine has no such hash.
    fn native_row_hash(&self, alias: &str, columns: &[Column]) -> Option<String>;

    /// The version of [`Dialect::native_row_hash`]'s method, part of a
    /// native fingerprint's kind (`native-v<N>/<engine version>`): raised
    /// when the method changes, so a fingerprint recorded before is not
    /// compared with one made after (no false drift, no skip).
    fn native_hash_version(&self) -> u32 {
        1
    }

    /// The canonical text of one (non-NULL) value for portable fingerprints,
    /// and its type class (`int`, `decimal`, `float`, `text`, `date`,
    /// `timestamp`, `timestamptz`, `bool`, `bytes`, `other`), which goes into
    /// the signature. The framing (tag, length, NULL marker) is added here.
    fn portable_value(&self, expr: &str, column: &Column) -> (String, &'static str);

    /// An expression hashing a canonical row text to a 64-bit integer (the
    /// first 64 bits of its MD5, as an unsigned number).
    fn portable_row_hash(&self, text_expr: &str) -> String;

    /// An expression with the same value as [`Dialect::portable_row_hash`]
    /// of the row's canonical text, computed a faster way than building the
    /// text in SQL (DuckDB: a scalar function written in Rust); `None` where
    /// the engine has none.
    fn portable_row_hash_direct(&self, alias: &str, columns: &[Column]) -> Option<String> {
        let _ = (alias, columns);
        None
    }

    /// Whether a value of type `from`, cast to `to`, has the same native
    /// row hash contribution as before the cast (the same physical value),
    /// so a row hashed as read is hashed as written. The same type
    /// always; an engine may know more.
    fn same_native_hash(&self, from: &str, to: &str) -> bool {
        from.eq_ignore_ascii_case(to)
    }

    /// The SQL name of the text type to cast to (`VARCHAR`; Spark: `STRING`).
    fn text_type(&self) -> &'static str {
        "VARCHAR"
    }

    /// Reads a sum from a query result into an i128.
    fn read_sum(&self, v: &Value) -> Result<i128> {
        v.as_i128().ok_or_else(|| Error::Internal(format!("a checksum sum came back as {v:?}")))
    }

    /// A pseudo-column naming one row of a table (DuckDB `rowid`, PostgreSQL
    /// `ctid`), its type, and whether it stays the same when the row is
    /// updated (for the sandboxed mutation check of `prove`); `None` where
    /// a table has none (the check then names a row by its values).
    fn row_id(&self) -> Option<(&'static str, &'static str, bool)> {
        Some(("rowid", "BIGINT", true))
    }

    /// Whether `replace_partition`, when its accelerator cannot take the
    /// guards and fingerprint on the insert, should fingerprint the source
    /// in its guard scan rather than the partition after writing. DuckDB:
    /// no (the guard then only counts, and the partition is hashed once,
    /// warm). PostgreSQL: yes (finding the day's rows again in the target
    /// is another scan).
    fn fingerprint_before_writing(&self) -> bool {
        false
    }

    /// A statement that makes the rest of the run's transaction plan a
    /// join of a batch's keys with a large table as key lookups where an
    /// index allows (PostgreSQL: the planner's cost of a random page as on
    /// SSD or cached storage), or `None` where the engine needs no hint.
    fn plan_key_lookups(&self) -> Option<&'static str> {
        None
    }

    /// The keyword that makes a common table expression be computed once
    /// (`WITH x AS MATERIALIZED (…)`: PostgreSQL, DuckDB), or `""` where
    /// the engine has none (Spark).
    fn materialized(&self) -> &'static str {
        "MATERIALIZED "
    }
}
