//! `diff`: rows only in A, only in B, and changed, between two tables that
//! may live in two databases (DuckDB against PostgreSQL included).
//!
//! Fingerprints first: each side is hashed inside its engine into 256
//! segments of the key's hash space (count and sum of row hashes per
//! segment), which together are the table's fingerprint. Equal segments are
//! done; a differing segment holding more than a few thousand rows is split
//! 256 ways again, and only the rows of small differing segments are read.
//! Identical tables transfer no rows; one changed row out of millions costs a
//! few scans and a few hundred rows.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::engine::{row_hash, Column, Engine};
use crate::error::{Error, Result};
use crate::fingerprint::{Fingerprint, Method};
use crate::ident::{quote_ident, TableName};
use crate::sql::{check_predicate, Sql, Value};

/// What to compare.
#[derive(Debug, Clone, Default)]
pub struct DiffOptions {
    /// Key columns: rows with equal keys are the same row.
    pub key: Vec<String>,
    /// Only rows where this condition holds (on both sides).
    pub predicate: Option<String>,
    /// Columns left out of the comparison.
    pub exclude: Vec<String>,
    /// Read the rows of a differing segment once it holds at most this many
    /// rows (default 2000).
    pub segment_rows: u64,
    /// At most this many rows listed per kind of difference (default 100);
    /// the counts are always complete.
    pub max_listed: usize,
}

/// One changed column of a changed row.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ColumnChange {
    /// The column.
    pub column: String,
    /// Its value in A (canonical text as a literal: `'45.00'`, or `NULL`).
    pub a: String,
    /// Its value in B.
    pub b: String,
}

/// A row present on both sides with different values.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ChangedRow {
    /// The key, `column=value` pairs.
    pub key: Vec<String>,
    /// What changed.
    pub changes: Vec<ColumnChange>,
}

/// The result.
#[derive(Debug, Clone, Serialize)]
pub struct DiffReport {
    /// Table A (and its engine).
    pub a: String,
    /// Table B (and its engine).
    pub b: String,
    /// The key.
    pub key: Vec<String>,
    /// Compared columns.
    pub columns: Vec<String>,
    /// `native` (same engine and column types) or `portable`.
    pub method: Method,
    /// A's fingerprint.
    pub fingerprint_a: Fingerprint,
    /// B's fingerprint.
    pub fingerprint_b: Fingerprint,
    /// Whether there is no difference: no differing row found *and* equal
    /// fingerprints (row count and checksum). Never true when the
    /// fingerprints differ.
    pub identical: bool,
    /// Why the tables are not identical when no differing row explains it
    /// (the fingerprints differ but every row read compares equal).
    pub note: Option<String>,
    /// Rows only in A (count).
    pub only_in_a: u64,
    /// Rows only in B (count).
    pub only_in_b: u64,
    /// Rows in both with different values (count).
    pub changed: u64,
    /// Rows only in A (listed, as `column=value` pairs).
    pub only_in_a_rows: Vec<Vec<String>>,
    /// Rows only in B (listed).
    pub only_in_b_rows: Vec<Vec<String>>,
    /// Changed rows (listed).
    pub changed_rows: Vec<ChangedRow>,
    /// Segment checksum queries run per side.
    pub segment_queries: u64,
    /// Rows read from both sides to find the differences.
    pub rows_transferred: u64,
}

/// The two sides: one engine holding both tables, or two.
pub enum Sides<'a> {
    /// Both tables in one database.
    One(&'a mut dyn Engine),
    /// A's database and B's.
    Two(&'a mut dyn Engine, &'a mut dyn Engine),
}

impl Sides<'_> {
    fn get(&mut self, b: bool) -> &mut dyn Engine {
        match self {
            Sides::One(e) => &mut **e,
            Sides::Two(a, _) if !b => &mut **a,
            Sides::Two(_, e) => &mut **e,
        }
    }
}

const FANOUT_BITS: u32 = 8;
const MAX_BITS: u32 = 48;

struct Side<'t> {
    table: &'t TableName,
    key_hash: String,
    row_hash: String,
    kind: String,
    signature: Vec<String>,
}

impl Side<'_> {
    /// `FROM <table> AS t WHERE <predicate>` and, when given, the segment filter.
    fn from(&self, sql: &mut Sql, predicate: Option<&str>, segments: Option<(u32, &[u64])>) {
        sql.push(" FROM ").push(&self.table.quoted()).push(" AS t WHERE ");
        match predicate {
            Some(p) => sql.push("(").push(p).push(")"),
            None => sql.push("TRUE"),
        };
        if let Some((bits, ids)) = segments {
            sql.push(" AND ").push(&segment_of(&self.key_hash, bits)).push(" IN (");
            for (i, id) in ids.iter().enumerate() {
                if i > 0 {
                    sql.push(", ");
                }
                sql.typed_param(Value::Int(*id as i64), "BIGINT");
            }
            sql.push(")");
        }
    }
}

/// The segment of a row: the low `bits` bits of its key hash (the hash may
/// be signed: normalized into [0, 2^bits)).
fn segment_of(hash: &str, bits: u32) -> String {
    let m = 1u64 << bits;
    format!("CAST(((({hash}) % {m}) + {m}) % {m} AS BIGINT)")
}

type Segments = BTreeMap<u64, (u64, i128)>;

fn segment_sums(engine: &mut dyn Engine, side: &Side<'_>, predicate: Option<&str>, bits: u32, within: Option<(u32, &[u64])>) -> Result<Segments> {
    let mut sql = Sql::new();
    sql.push("SELECT seg, count(*), sum(h) FROM (SELECT ").push(&segment_of(&side.key_hash, bits)).push(" AS seg, ").push(&side.row_hash).push(" AS h");
    side.from(&mut sql, predicate, within);
    sql.push(") AS s GROUP BY seg");
    let rows = engine.query(&sql)?;
    let mut out = Segments::new();
    for r in rows.rows {
        let seg = r[0].as_i128().ok_or_else(|| Error::Internal(format!("bad segment {:?}", r[0])))? as u64;
        let n = r[1].as_u64().ok_or_else(|| Error::Internal("bad count".into()))?;
        let sum = engine.read_sum(&r[2])?;
        out.insert(seg, (n, sum));
    }
    Ok(out)
}

/// A row read for comparison: key values and column values, as canonical
/// text (`None` for NULL).
type Read = (Vec<Option<String>>, Vec<Option<String>>);

/// A value as a SQL-like literal: `NULL` or `'text'`.
fn show(v: &Option<String>) -> String {
    match v {
        None => "NULL".into(),
        Some(s) => format!("'{}'", s.replace('\'', "''")),
    }
}

/// Rows of the given segments as (key texts, column texts), canonical text.
fn segment_rows(
    engine: &mut dyn Engine,
    side: &Side<'_>,
    predicate: Option<&str>,
    key: &[Column],
    cols: &[Column],
    bits: u32,
    ids: &[u64],
) -> Result<Vec<Read>> {
    let mut out = Vec::new();
    for chunk in ids.chunks(500) {
        let mut sql = Sql::new();
        let mut floats = Vec::new();
        let exprs: Vec<String> = key
            .iter()
            .chain(cols)
            .map(|c| {
                let (text, class) = engine.portable_value(&format!("t.{}", quote_ident(&c.name)), c);
                floats.push(class == "float");
                format!("CAST({text} AS {})", engine.text_type())
            })
            .collect();
        sql.push("SELECT ").push(&exprs.join(", "));
        side.from(&mut sql, predicate, Some((bits, chunk)));
        for r in engine.query(&sql)?.rows {
            // A float's canonical text (its bits) is compared as it is and
            // shown as the number (one text per double either way).
            let texts: Vec<Option<String>> = r
                .iter()
                .zip(&floats)
                .map(|(v, &float)| match v {
                    Value::Null => None,
                    Value::Text(s) if float => Some(crate::fingerprint::float_display(s)),
                    Value::Text(s) => Some(s.clone()),
                    other => Some(other.display()),
                })
                .collect();
            let (k, c) = texts.split_at(key.len());
            out.push((k.to_vec(), c.to_vec()));
        }
    }
    Ok(out)
}

fn columns_of(engine: &mut dyn Engine, table: &TableName, side: &str) -> Result<Vec<Column>> {
    engine.table_columns(table)?.ok_or_else(|| Error::Argument {
        message: format!("table {table} ({side}) does not exist"),
        hint: Some("check the table name and the database URL".into()),
    })
}

/// Compares table `a` with table `b`.
pub fn diff(sides: &mut Sides<'_>, a: &TableName, b: &TableName, opts: &DiffOptions) -> Result<DiffReport> {
    if opts.key.is_empty() {
        return Err(Error::argument("diff needs a key: --key COLUMN[,COLUMN…]", Some("name the columns that identify a row")));
    }
    if let Some(p) = &opts.predicate {
        check_predicate("--where", p)?;
    }
    let segment_rows_max = if opts.segment_rows == 0 { 2000 } else { opts.segment_rows };
    let max_listed = if opts.max_listed == 0 { 100 } else { opts.max_listed };
    let cols_a = columns_of(sides.get(false), a, "A")?;
    let cols_b = columns_of(sides.get(true), b, "B")?;
    for k in opts.key.iter().chain(&opts.exclude) {
        for (cols, t) in [(&cols_a, a), (&cols_b, b)] {
            if !cols.iter().any(|c| &c.name == k) {
                return Err(Error::argument(
                    format!("{t} has no column {k:?}"),
                    Some(&format!("its columns are {}", cols.iter().map(|c| c.name.as_str()).collect::<Vec<_>>().join(", "))),
                ));
            }
        }
    }
    let keep = |c: &Column| !opts.exclude.contains(&c.name);
    let names = |cols: &[Column]| cols.iter().filter(|c| keep(c)).map(|c| c.name.clone()).collect::<Vec<_>>();
    let (mut na, mut nb) = (names(&cols_a), names(&cols_b));
    na.sort();
    nb.sort();
    if na != nb {
        let only_a: Vec<_> = na.iter().filter(|n| !nb.contains(n)).cloned().collect();
        let only_b: Vec<_> = nb.iter().filter(|n| !na.contains(n)).cloned().collect();
        return Err(Error::argument(
            format!("the tables have different columns: only in {a}: [{}]; only in {b}: [{}]", only_a.join(", "), only_b.join(", ")),
            Some("leave the extra columns out with --exclude"),
        ));
    }
    // Compare in A's column order; B's columns by name.
    let value_cols = |cols: &[Column]| -> Vec<Column> {
        na_order(&cols_a, &opts.key, &opts.exclude).iter().map(|n| cols.iter().find(|c| &c.name == n).expect("checked").clone()).collect()
    };
    let key_cols = |cols: &[Column]| -> Vec<Column> { opts.key.iter().map(|k| cols.iter().find(|c| &c.name == k).expect("checked").clone()).collect() };
    let (va, vb) = (value_cols(&cols_a), value_cols(&cols_b));
    let (ka, kb) = (key_cols(&cols_a), key_cols(&cols_b));
    let all_a: Vec<Column> = ka.iter().chain(&va).cloned().collect();
    let all_b: Vec<Column> = kb.iter().chain(&vb).cloned().collect();
    check_type_families(sides, a, b, &all_a, &all_b)?;

    // Native hashes when both sides are one engine of one version and the
    // column types match; the portable encoding otherwise.
    let (ea, eb) = (sides.get(false).version()?, sides.get(true).version()?);
    let method = if ea == eb && all_a == all_b { Method::Native } else { Method::Portable };
    let side_a = make_side(sides.get(false), method, a, &ka, &all_a)?;
    let side_b = make_side(sides.get(true), method, b, &kb, &all_b)?;
    let pred = opts.predicate.as_deref();

    let mut queries = 0u64;
    let mut bits = FANOUT_BITS;
    let seg_a = segment_sums(sides.get(false), &side_a, pred, bits, None)?;
    let seg_b = segment_sums(sides.get(true), &side_b, pred, bits, None)?;
    queries += 1;
    let total = |s: &Segments| s.values().fold((0u64, 0i128), |(n, h), (c, x)| (n + c, h.wrapping_add(*x)));
    let (ta, tb) = (total(&seg_a), total(&seg_b));
    let fingerprint_a = Fingerprint::from_sum(&side_a.kind, &side_a.signature, ta.0, ta.1);
    let fingerprint_b = Fingerprint::from_sum(&side_b.kind, &side_b.signature, tb.0, tb.1);

    let mut report = DiffReport {
        a: format!("{a} ({ea})"),
        b: format!("{b} ({eb})"),
        key: opts.key.clone(),
        columns: va.iter().map(|c| c.name.clone()).collect(),
        method,
        identical: false,
        note: None,
        fingerprint_a,
        fingerprint_b,
        only_in_a: 0,
        only_in_b: 0,
        changed: 0,
        only_in_a_rows: Vec::new(),
        only_in_b_rows: Vec::new(),
        changed_rows: Vec::new(),
        segment_queries: 0,
        rows_transferred: 0,
    };

    let mut differing = differing_segments(&seg_a, &seg_b);
    let mut to_read: Vec<(u32, u64)> = Vec::new();
    loop {
        let (small, big): (Vec<_>, Vec<_>) = differing.iter().partition(|(_, n)| *n <= segment_rows_max || bits >= MAX_BITS);
        to_read.extend(small.iter().map(|(id, _)| (bits, *id)));
        if big.is_empty() {
            break;
        }
        let parents: Vec<u64> = big.iter().map(|(id, _)| *id).collect();
        let child_bits = bits + FANOUT_BITS;
        let mut next = Vec::new();
        for chunk in parents.chunks(500) {
            let ca = segment_sums(sides.get(false), &side_a, pred, child_bits, Some((bits, chunk)))?;
            let cb = segment_sums(sides.get(true), &side_b, pred, child_bits, Some((bits, chunk)))?;
            queries += 1;
            next.extend(differing_segments(&ca, &cb));
        }
        differing = next;
        bits = child_bits;
    }
    report.segment_queries = queries;

    // Read the rows of the small differing segments and match them by key.
    let mut by_level: BTreeMap<u32, Vec<u64>> = BTreeMap::new();
    for (b, id) in to_read {
        by_level.entry(b).or_default().push(id);
    }
    for (level, ids) in by_level {
        let rows_a = segment_rows(sides.get(false), &side_a, pred, &ka, &va, level, &ids)?;
        let rows_b = segment_rows(sides.get(true), &side_b, pred, &kb, &vb, level, &ids)?;
        report.rows_transferred += (rows_a.len() + rows_b.len()) as u64;
        compare(&mut report, rows_a, rows_b, &ka, &va, max_listed);
    }
    let rows_differ = report.only_in_a + report.only_in_b + report.changed > 0;
    let (identical, note) = verdict(&report.fingerprint_a, &report.fingerprint_b, rows_differ);
    report.identical = identical;
    report.note = note;
    Ok(report)
}

/// Identical only when no row differs *and* the fingerprints are equal:
/// fail closed. Fingerprints that differ while every row read compares
/// equal (the values hash apart but read alike) are a difference, said in
/// the note, never "identical".
fn verdict(a: &Fingerprint, b: &Fingerprint, rows_differ: bool) -> (bool, Option<String>) {
    let same = a.rows == b.rows && a.checksum == b.checksum && a.kind == b.kind;
    match (rows_differ, same) {
        (false, true) => (true, None),
        (true, _) => (false, None),
        (false, false) => (
            false,
            Some(format!(
                "the fingerprints differ (A: {} rows, checksum {}; B: {} rows, checksum {}) though no row read differs in its compared text: the values hash apart (their types or exact bits differ)",
                a.rows, a.checksum, b.rows, b.checksum
            )),
        ),
    }
}

/// Refuses to compare columns whose types are of different families (the
/// engine's type class: int, decimal, float, text, date, timestamp, …): a
/// DECIMAL and a VARCHAR holding `1.50` read alike as text but are not the
/// same data. Lists every such column with both types.
fn check_type_families(sides: &mut Sides<'_>, a: &TableName, b: &TableName, all_a: &[Column], all_b: &[Column]) -> Result<()> {
    let mut mismatched = Vec::new();
    let mut names = Vec::new();
    for (ca, cb) in all_a.iter().zip(all_b) {
        let class_a = sides.get(false).portable_value("t.x", ca).1;
        let class_b = sides.get(true).portable_value("t.x", cb).1;
        if class_a != class_b {
            mismatched.push(format!("{} is {} ({class_a}) in {a} but {} ({class_b}) in {b}", ca.name, ca.ty, cb.ty));
            names.push(ca.name.as_str());
        }
    }
    if mismatched.is_empty() {
        return Ok(());
    }
    Err(Error::Schema {
        message: format!("cannot diff columns of different type families: {}", mismatched.join("; ")),
        hint: Some(format!(
            "diff a view that casts one side to the other's type, or leave the column(s) out with --exclude {}",
            names.join(",")
        )),
    })
}

fn make_side<'t>(engine: &mut dyn Engine, method: Method, table: &'t TableName, key: &[Column], all: &[Column]) -> Result<Side<'t>> {
    let (key_hash, _, _) = row_hash(engine, method, "t", key)?;
    let (row_hash, kind, signature) = row_hash(engine, method, "t", all)?;
    Ok(Side { table, key_hash, row_hash, kind, signature })
}

/// Column names in A's order, without the key and the excluded ones.
fn na_order(cols_a: &[Column], key: &[String], exclude: &[String]) -> Vec<String> {
    cols_a.iter().filter(|c| !key.contains(&c.name) && !exclude.contains(&c.name)).map(|c| c.name.clone()).collect()
}

/// Segments whose (count, sum) differ, with the larger side's row count.
fn differing_segments(a: &Segments, b: &Segments) -> Vec<(u64, u64)> {
    let mut out = Vec::new();
    for id in a.keys().chain(b.keys().filter(|k| !a.contains_key(k))) {
        let (x, y) = (a.get(id).copied().unwrap_or((0, 0)), b.get(id).copied().unwrap_or((0, 0)));
        if x != y {
            out.push((*id, x.0.max(y.0)));
        }
    }
    out.sort();
    out
}

fn pairs(cols: &[Column], values: &[Option<String>]) -> Vec<String> {
    cols.iter().zip(values).map(|(c, v)| format!("{}={}", c.name, show(v))).collect()
}

type Values = Vec<Option<String>>;

fn compare(report: &mut DiffReport, a: Vec<Read>, b: Vec<Read>, key: &[Column], cols: &[Column], max: usize) {
    let mut left: BTreeMap<Values, Vec<Values>> = BTreeMap::new();
    for (k, v) in a {
        left.entry(k).or_default().push(v);
    }
    let mut right: BTreeMap<Values, Vec<Values>> = BTreeMap::new();
    for (k, v) in b {
        right.entry(k).or_default().push(v);
    }
    let keys: std::collections::BTreeSet<Values> = left.keys().chain(right.keys()).cloned().collect();
    for k in keys {
        let mut xs = left.remove(&k).unwrap_or_default();
        let mut ys = right.remove(&k).unwrap_or_default();
        // Rows equal on both sides are no difference (as a multiset).
        xs.sort();
        ys.sort();
        let mut i = 0;
        while i < xs.len() {
            if let Some(j) = ys.iter().position(|y| *y == xs[i]) {
                ys.remove(j);
                xs.remove(i);
            } else {
                i += 1;
            }
        }
        // Pair what is left: a changed row per pair, the rest only on one side.
        let n = xs.len().min(ys.len());
        for (x, y) in xs.iter().zip(&ys).take(n) {
            report.changed += 1;
            if report.changed_rows.len() < max {
                let changes = cols
                    .iter()
                    .zip(x.iter().zip(y))
                    .filter(|(_, (p, q))| p != q)
                    .map(|(c, (p, q))| ColumnChange { column: c.name.clone(), a: show(p), b: show(q) })
                    .collect();
                report.changed_rows.push(ChangedRow { key: pairs(key, &k), changes });
            }
        }
        for x in &xs[n..] {
            report.only_in_a += 1;
            if report.only_in_a_rows.len() < max {
                report.only_in_a_rows.push([pairs(key, &k), pairs(cols, x)].concat());
            }
        }
        for y in &ys[n..] {
            report.only_in_b += 1;
            if report.only_in_b_rows.len() < max {
                report.only_in_b_rows.push([pairs(key, &k), pairs(cols, y)].concat());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::verdict;
    use crate::fingerprint::Fingerprint;

    fn fp(rows: u64, checksum: &str) -> Fingerprint {
        Fingerprint { kind: "portable-v3".into(), rows, checksum: checksum.into() }
    }

    #[test]
    fn identical_only_with_equal_fingerprints_and_no_differing_row() {
        assert_eq!(verdict(&fp(3, "aa"), &fp(3, "aa"), false), (true, None));
        assert_eq!(verdict(&fp(3, "aa"), &fp(3, "aa"), true).0, false, "a differing row is a difference");
        assert_eq!(verdict(&fp(3, "aa"), &fp(3, "bb"), true), (false, None));
        // Fail closed: the checksums differ but the rows read compare equal.
        let (identical, note) = verdict(&fp(3, "aa"), &fp(3, "bb"), false);
        assert!(!identical, "two different checksums are never \"identical\"");
        let note = note.expect("the difference is explained");
        assert!(note.starts_with("the fingerprints differ (A: 3 rows, checksum aa; B: 3 rows, checksum bb)"), "{note}");
        let (identical, note) = verdict(&fp(3, "aa"), &fp(4, "aa"), false);
        assert!(!identical && note.is_some(), "different row counts are never identical");
        let other_kind = Fingerprint { kind: "native-v1/duckdb v1".into(), ..fp(3, "aa") };
        assert!(!verdict(&fp(3, "aa"), &other_kind, false).0, "fingerprints of different kinds are not equal");
    }
}
