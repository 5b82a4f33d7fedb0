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

use std::cmp::Ordering;
use std::collections::BTreeMap;

use serde::Serialize;

use crate::engine::measure::row_hash;

use crate::engine::{Column, Engine};
use crate::error::{Error, Result};
use crate::fingerprint::{Fingerprint, Method};
use crate::job::ident::{quote_ident, TableName};
use crate::job::sql::{check_predicate, Sql, Value};

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

/// One changed column of a changed row, typed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ValueChange {
    /// The column.
    pub column: String,
    /// Its value in A.
    pub a: Cell,
    /// Its value in B.
    pub b: Cell,
}

/// A row present on both sides with different values, typed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ChangedValues {
    /// The key: column → value.
    pub key: Row,
    /// The columns that changed.
    pub changes: Vec<ValueChange>,
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
    /// Rows only in A (listed, sorted by key), as `column=value` texts with
    /// the canonical text as a SQL literal (`id='3'`, `label=NULL`). The
    /// JSON output and the text output show [`DiffReport::listed_only_in_a`].
    #[serde(skip)]
    pub only_in_a_rows: Vec<Vec<String>>,
    /// Rows only in B (listed), as `column=value` texts.
    #[serde(skip)]
    pub only_in_b_rows: Vec<Vec<String>>,
    /// Changed rows (listed), as texts.
    #[serde(skip)]
    pub changed_rows: Vec<ChangedRow>,
    /// Rows only in A (at most `max_listed`, sorted by key): column → value,
    /// typed. In JSON: `only_in_a_rows`.
    #[serde(rename = "only_in_a_rows")]
    pub listed_only_in_a: Vec<Row>,
    /// Rows only in B, typed. In JSON: `only_in_b_rows`.
    #[serde(rename = "only_in_b_rows")]
    pub listed_only_in_b: Vec<Row>,
    /// Changed rows, typed: the key and each changed column's two values.
    /// In JSON: `changed_rows`.
    #[serde(rename = "changed_rows")]
    pub listed_changed: Vec<ChangedValues>,
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
    sql.push("SELECT seg, count(*) AS \"n\", sum(h) AS \"s\" FROM (SELECT ").push(&segment_of(&side.key_hash, bits)).push(" AS seg, ").push(&side.row_hash).push(" AS h");
    side.from(&mut sql, predicate, within);
    sql.push(") AS s GROUP BY seg");
    let rows = engine.query(&sql)?;
    let mut out = Segments::new();
    for r in rows.each("a diff's segment sums") {
        let seg = r.value("seg")?;
        let seg = seg.as_i128().ok_or_else(|| Error::Internal(format!("a diff's segment sums: bad segment {seg:?}")))? as u64;
        out.insert(seg, (r.count("n")?, engine.dialect().read_sum(r.value("s")?)?));
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
                let (text, class) = engine.dialect().portable_value(&format!("t.{}", quote_ident(&c.name)), c);
                floats.push(class == "float");
                format!("CAST({text} AS {})", engine.dialect().text_type())
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
    // Each compared column's type class (one family on both sides: checked
    // above), to show and sort the values read.
    let key_classes: Vec<&'static str> = ka.iter().map(|c| sides.get(false).dialect().portable_value("t.x", c).1).collect();
    let value_classes: Vec<&'static str> = va.iter().map(|c| sides.get(false).dialect().portable_value("t.x", c).1).collect();

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
        listed_only_in_a: Vec::new(),
        listed_only_in_b: Vec::new(),
        listed_changed: Vec::new(),
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
    let mut found = Found::default();
    for (level, ids) in by_level {
        let rows_a = segment_rows(sides.get(false), &side_a, pred, &ka, &va, level, &ids)?;
        let rows_b = segment_rows(sides.get(true), &side_b, pred, &kb, &vb, level, &ids)?;
        report.rows_transferred += (rows_a.len() + rows_b.len()) as u64;
        compare(&mut report, &mut found, rows_a, rows_b, &key_classes, max_listed);
    }
    found.list(&mut report, &ka, &va, &key_classes, &value_classes);
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
        let class_a = sides.get(false).dialect().portable_value("t.x", ca).1;
        let class_b = sides.get(true).dialect().portable_value("t.x", cb).1;
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

/// The differing rows listed so far (at most the limit of each kind), as
/// the canonical texts read: the key's values, then the columns' values.
#[derive(Default)]
struct Found {
    only_a: Vec<(Values, Values)>,
    only_b: Vec<(Values, Values)>,
    changed: Vec<(Values, Values, Values)>,
}

impl Found {
    /// Sorts the listed rows by key (numbers as numbers, NULLs first) and
    /// writes them into the report, as texts and typed.
    fn list(mut self, report: &mut DiffReport, key: &[Column], cols: &[Column], key_classes: &[&str], classes: &[&str]) {
        self.only_a.sort_by(|x, y| cmp_values(key_classes, &x.0, &y.0));
        self.only_b.sort_by(|x, y| cmp_values(key_classes, &x.0, &y.0));
        self.changed.sort_by(|x, y| cmp_values(key_classes, &x.0, &y.0));
        let sides = [
            (&self.only_a, &mut report.only_in_a_rows, &mut report.listed_only_in_a),
            (&self.only_b, &mut report.only_in_b_rows, &mut report.listed_only_in_b),
        ];
        for (rows, texts, listed) in sides {
            for (k, v) in rows {
                texts.push([pairs(key, k), pairs(cols, v)].concat());
                listed.push(Row([typed_row(key, key_classes, k), typed_row(cols, classes, v)].concat()));
            }
        }
        for (k, x, y) in &self.changed {
            let differ: Vec<usize> = (0..cols.len()).filter(|&i| x.get(i) != y.get(i)).collect();
            report.changed_rows.push(ChangedRow {
                key: pairs(key, k),
                changes: differ.iter().map(|&i| ColumnChange { column: cols[i].name.clone(), a: show(&x[i]), b: show(&y[i]) }).collect(),
            });
            report.listed_changed.push(ChangedValues {
                key: Row(typed_row(key, key_classes, k)),
                changes: differ
                    .iter()
                    .map(|&i| ValueChange {
                        column: cols[i].name.clone(),
                        a: Cell::from_canonical(x[i].as_deref(), classes[i]),
                        b: Cell::from_canonical(y[i].as_deref(), classes[i]),
                    })
                    .collect(),
            });
        }
    }
}

/// Columns' canonical texts as typed values, named.
fn typed_row(names: &[Column], classes: &[&str], values: &[Option<String>]) -> Vec<(String, Cell)> {
    names.iter().zip(classes).zip(values).map(|((c, class), v)| (c.name.clone(), Cell::from_canonical(v.as_deref(), class))).collect()
}

fn compare(report: &mut DiffReport, found: &mut Found, a: Vec<Read>, b: Vec<Read>, key_classes: &[&str], max: usize) {
    let mut left: BTreeMap<Values, Vec<Values>> = BTreeMap::new();
    for (k, v) in a {
        left.entry(k).or_default().push(v);
    }
    let mut right: BTreeMap<Values, Vec<Values>> = BTreeMap::new();
    for (k, v) in b {
        right.entry(k).or_default().push(v);
    }
    let mut keys: Vec<Values> = left.keys().chain(right.keys().filter(|k| !left.contains_key(*k))).cloned().collect();
    keys.sort_by(|x, y| cmp_values(key_classes, x, y));
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
            if found.changed.len() < max {
                found.changed.push((k.clone(), x.clone(), y.clone()));
            }
        }
        for x in &xs[n..] {
            report.only_in_a += 1;
            if found.only_a.len() < max {
                found.only_a.push((k.clone(), x.clone()));
            }
        }
        for y in &ys[n..] {
            report.only_in_b += 1;
            if found.only_b.len() < max {
                found.only_b.push((k.clone(), y.clone()));
            }
        }
    }
}

/// Orders two rows' canonical texts column by column: NULL first, numbers
/// (integers, decimals, floats) and timestamps by value, anything else as
/// text; equal values by their text. A total order.
fn cmp_values(classes: &[&str], a: &[Option<String>], b: &[Option<String>]) -> Ordering {
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        let o = match (x, y) {
            (None, None) => Ordering::Equal,
            (None, Some(_)) => Ordering::Less,
            (Some(_), None) => Ordering::Greater,
            (Some(x), Some(y)) => cmp_text(classes.get(i).copied().unwrap_or("text"), x, y),
        };
        if o != Ordering::Equal {
            return o;
        }
    }
    a.len().cmp(&b.len())
}

/// Two canonical texts of one type class, in the order of their values
/// (exactly, for integers and decimals), then as text.
fn cmp_text(class: &str, a: &str, b: &str) -> Ordering {
    let by_value = match class {
        "int" | "decimal" | "timestamp" | "timestamptz" => match (decimal_parts(a), decimal_parts(b)) {
            (Some(x), Some(y)) => cmp_decimal(x, y),
            (Some(_), None) => Ordering::Less,
            (None, Some(_)) => Ordering::Greater,
            (None, None) => Ordering::Equal,
        },
        "float" => match (a.parse::<f64>(), b.parse::<f64>()) {
            (Ok(x), Ok(y)) => x.total_cmp(&y),
            (Ok(_), Err(_)) => Ordering::Less,
            (Err(_), Ok(_)) => Ordering::Greater,
            (Err(_), Err(_)) => Ordering::Equal,
        },
        _ => Ordering::Equal,
    };
    by_value.then_with(|| a.cmp(b))
}

/// A decimal number's text (`-12`, `3.50`) as (negative, integer digits,
/// fraction digits) without leading or trailing zeros; `None` when the text
/// is not such a number.
fn decimal_parts(t: &str) -> Option<(bool, &str, &str)> {
    let (negative, digits) = match t.strip_prefix('-') {
        Some(d) => (true, d),
        None => (false, t.strip_prefix('+').unwrap_or(t)),
    };
    let (int, frac) = digits.split_once('.').unwrap_or((digits, ""));
    if (int.is_empty() && frac.is_empty()) || !int.bytes().all(|b| b.is_ascii_digit()) || !frac.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let (int, frac) = (int.trim_start_matches('0'), frac.trim_end_matches('0'));
    Some((negative && !(int.is_empty() && frac.is_empty()), int, frac))
}

/// Compares two numbers read by [`decimal_parts`] by value.
fn cmp_decimal(a: (bool, &str, &str), b: (bool, &str, &str)) -> Ordering {
    let magnitude = a.1.len().cmp(&b.1.len()).then_with(|| a.1.cmp(b.1)).then_with(|| a.2.cmp(b.2));
    match (a.0, b.0) {
        (false, false) => magnitude,
        (true, true) => magnitude.reverse(),
        (true, false) => Ordering::Less,
        (false, true) => Ordering::Greater,
    }
}

// Rows in reports.
//
// Every row a report lists (diff's rows, prove's samples, an audit's
// offending rows, an error's example row) is a [`Row`]: column → [`Cell`].
// In JSON a row is an object and each value has one form per type; in text
// each type has one form too.

/// One value of a row shown in a report, typed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Cell {
    /// SQL NULL: `null` in JSON, `NULL` in text.
    Null,
    /// A boolean: `true` or `false`.
    Bool(bool),
    /// An integer, its digits (`-12`): a JSON number (a string beyond 64 bits).
    Int(String),
    /// A decimal, exactly at its scale (`45.00`): a JSON string (a JSON
    /// number could not keep it exact), bare in text.
    Decimal(String),
    /// A float in the shortest form that reads back as the same double
    /// (`0.1`, `1e300`), or `nan`, `inf`, `-inf`: a JSON number (those
    /// three as strings).
    Float(String),
    /// Text: a JSON string; quoted in text (`'it''s'`).
    Text(String),
    /// A date, `YYYY-MM-DD`.
    Date(String),
    /// A timestamp in ISO 8601: `2026-10-20T08:00:00`, with the fraction of
    /// a second when there is one (`.500`, `.123456`); a timestamp with a
    /// time zone is in UTC, with `Z`.
    Timestamp(String),
    /// Bytes as hexadecimal digits: a JSON string; `x'…'` in text.
    Bytes(String),
    /// A value of any other type, as the engine writes it: a JSON string;
    /// quoted in text.
    Other(String),
}

impl Cell {
    /// A value read for `diff`: its canonical text (`None`: NULL; floats
    /// already written as numbers) and its column's type class.
    pub fn from_canonical(text: Option<&str>, class: &str) -> Cell {
        let Some(t) = text else { return Cell::Null };
        match class {
            "int" => Cell::Int(t.to_owned()),
            "decimal" => Cell::Decimal(t.to_owned()),
            "float" => Cell::Float(t.to_owned()),
            "text" => Cell::Text(t.to_owned()),
            "date" => Cell::Date(t.to_owned()),
            // Microseconds since 1970-01-01 00:00 (UTC for timestamptz).
            "timestamp" | "timestamptz" => match t.parse::<i64>().ok().and_then(chrono::DateTime::<chrono::Utc>::from_timestamp_micros) {
                Some(ts) => Cell::Timestamp(iso_timestamp(ts.naive_utc(), class == "timestamptz")),
                None => Cell::Other(t.to_owned()),
            },
            "bool" => match t {
                "t" | "true" => Cell::Bool(true),
                "f" | "false" => Cell::Bool(false),
                _ => Cell::Other(t.to_owned()),
            },
            "bytes" => Cell::Bytes(t.to_owned()),
            _ => Cell::Other(t.to_owned()),
        }
    }

    /// A value as [`crate::job::sql::Value::display`] writes it, the form of the
    /// samples in errors, audits and `prove`: `NULL`, `true`, a number, a
    /// date, a timestamp (`2026-10-20 08:00:00`), or text quoted with `"`
    /// and escaped (decimals, bytes and other types read back as text).
    pub fn from_display(s: &str) -> Cell {
        if s == "NULL" {
            return Cell::Null;
        }
        if s.len() >= 2 && s.starts_with('"') && s.ends_with('"') {
            if let Some(t) = unescape_debug(&s[1..s.len() - 1]) {
                return Cell::Text(t);
            }
        }
        match s {
            "true" => return Cell::Bool(true),
            "false" => return Cell::Bool(false),
            _ => {}
        }
        if s.parse::<i128>().is_ok() {
            return Cell::Int(s.to_owned());
        }
        if let Ok(f) = s.parse::<f64>() {
            let text = if f.is_nan() {
                "nan".to_owned()
            } else if f.is_infinite() {
                (if f > 0.0 { "inf" } else { "-inf" }).to_owned()
            } else {
                s.to_owned()
            };
            return Cell::Float(text);
        }
        if chrono::NaiveDate::parse_from_str(s, "%Y-%m-%d").is_ok() {
            return Cell::Date(s.to_owned());
        }
        if let Ok(t) = chrono::NaiveDateTime::parse_from_str(s, "%Y-%m-%d %H:%M:%S%.f") {
            return Cell::Timestamp(iso_timestamp(t, false));
        }
        Cell::Other(s.to_owned())
    }
}

/// A timestamp in ISO 8601, with the fraction of a second when not whole,
/// and `Z` when it is in UTC (a timestamp with time zone).
fn iso_timestamp(t: chrono::NaiveDateTime, utc: bool) -> String {
    format!("{}{}", t.format("%Y-%m-%dT%H:%M:%S%.f"), if utc { "Z" } else { "" })
}

/// The text inside a string written with Rust's `{:?}` (without its
/// quotes); `None` when it is not one.
fn unescape_debug(s: &str) -> Option<String> {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        match c {
            '"' => return None,
            '\\' => match chars.next()? {
                'n' => out.push('\n'),
                'r' => out.push('\r'),
                't' => out.push('\t'),
                '0' => out.push('\0'),
                '\\' => out.push('\\'),
                '"' => out.push('"'),
                '\'' => out.push('\''),
                'u' => {
                    if chars.next()? != '{' {
                        return None;
                    }
                    let mut hex = String::new();
                    loop {
                        match chars.next()? {
                            '}' => break,
                            h => hex.push(h),
                        }
                    }
                    out.push(char::from_u32(u32::from_str_radix(&hex, 16).ok()?)?);
                }
                _ => return None,
            },
            c => out.push(c),
        }
    }
    Some(out)
}

impl Serialize for Cell {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        match self {
            Cell::Null => s.serialize_none(),
            Cell::Bool(b) => s.serialize_bool(*b),
            Cell::Int(t) => match (t.parse::<i64>(), t.parse::<u64>()) {
                (Ok(i), _) => s.serialize_i64(i),
                (_, Ok(u)) => s.serialize_u64(u),
                _ => s.serialize_str(t),
            },
            Cell::Float(t) => match t.parse::<f64>() {
                Ok(f) if f.is_finite() => s.serialize_f64(f),
                _ => s.serialize_str(t),
            },
            Cell::Decimal(t) | Cell::Text(t) | Cell::Date(t) | Cell::Timestamp(t) | Cell::Bytes(t) | Cell::Other(t) => s.serialize_str(t),
        }
    }
}

impl std::fmt::Display for Cell {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Cell::Null => f.write_str("NULL"),
            Cell::Bool(b) => write!(f, "{b}"),
            Cell::Int(t) | Cell::Decimal(t) | Cell::Float(t) | Cell::Date(t) | Cell::Timestamp(t) => f.write_str(t),
            Cell::Bytes(t) => write!(f, "x'{t}'"),
            Cell::Text(t) | Cell::Other(t) => write!(f, "'{}'", t.replace('\'', "''")),
        }
    }
}

/// A row shown in a report: its columns in order, each with its value. A
/// JSON object (column → value); `column=value, …` in text.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Row(pub Vec<(String, Cell)>);

impl Row {
    /// A row of `(column, value)` pairs whose values [`Cell::from_display`] reads
    /// ([`crate::error::SampleRow`]).
    pub fn from_pairs(pairs: &[(String, String)]) -> Row {
        Row(pairs.iter().map(|(k, v)| (k.clone(), Cell::from_display(v))).collect())
    }

    /// A row written `{a: 1, b: "x"}` (the display of a sample row: an
    /// audit's offending row, [`crate::error::SampleRow`]); `None` when the
    /// text is not one.
    pub fn parse_display(s: &str) -> Option<Row> {
        let inner = s.strip_prefix('{')?.strip_suffix('}')?;
        let mut row = Vec::new();
        let mut rest = inner;
        while !rest.is_empty() {
            let (name, after) = rest.split_once(": ")?;
            let (value, after) = split_value(after);
            row.push((name.to_owned(), Cell::from_display(value)));
            rest = match after.strip_prefix(", ") {
                Some(r) => r,
                None if after.is_empty() => after,
                None => return None,
            };
        }
        Some(Row(row))
    }

    /// A row written as `column=value` items (prove's mutated input row);
    /// `None` when an item is not one.
    pub fn parse_assignments(items: &[String]) -> Option<Row> {
        items.iter().map(|i| i.split_once('=').map(|(k, v)| (k.to_owned(), Cell::from_display(v)))).collect::<Option<Vec<_>>>().map(Row)
    }

    /// A sample written `label: {a: 1, …}` (prove's samples): the label and
    /// the row; `None` when the text is not one.
    pub fn parse_labeled(s: &str) -> Option<(&str, Row)> {
        let at = s.find(": {")?;
        Some((&s[..at], Row::parse_display(&s[at + 2..])?))
    }

    /// A row whose text could not be read into columns: one column `row`
    /// holding the text, so that every row is still an object.
    pub fn unread(text: &str) -> Row {
        Row(vec![("row".to_owned(), Cell::Text(text.to_owned()))])
    }

    /// The value of a column, if the row has it.
    pub fn get(&self, column: &str) -> Option<&Cell> {
        self.0.iter().find(|(c, _)| c == column).map(|(_, v)| v)
    }
}

/// Splits a value written by [`crate::job::sql::Value::display`] off the start of
/// `s`: a quoted text up to its closing quote, anything else up to `, ` or
/// the end. Returns the value and the rest.
fn split_value(s: &str) -> (&str, &str) {
    if s.starts_with('"') {
        let bytes = s.as_bytes();
        let mut i = 1;
        while i < bytes.len() {
            match bytes[i] {
                b'\\' => i += 2,
                b'"' => return (&s[..=i], &s[i + 1..]),
                _ => i += 1,
            }
        }
        (s, "")
    } else {
        match s.find(", ") {
            Some(i) => (&s[..i], &s[i..]),
            None => (s, ""),
        }
    }
}

impl Serialize for Row {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut m = s.serialize_map(Some(self.0.len()))?;
        for (k, v) in &self.0 {
            m.serialize_entry(k, v)?;
        }
        m.end()
    }
}

impl std::fmt::Display for Row {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (i, (k, v)) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{k}={v}")?;
        }
        Ok(())
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

    #[test]
    fn keys_sort_as_numbers_with_nulls_first() {
        use super::cmp_values;
        let key = |v: &[Option<&str>]| v.iter().map(|x| x.map(str::to_owned)).collect::<Vec<_>>();
        let mut keys = vec![key(&[Some("10")]), key(&[Some("9")]), key(&[None]), key(&[Some("-2")]), key(&[Some("100")])];
        keys.sort_by(|a, b| cmp_values(&["int"], a, b));
        assert_eq!(keys, vec![key(&[None]), key(&[Some("-2")]), key(&[Some("9")]), key(&[Some("10")]), key(&[Some("100")])]);
        let mut decimals = vec![key(&[Some("10.5")]), key(&[Some("9.75")]), key(&[Some("-0.5")]), key(&[Some("9.8")]), key(&[Some("-10.00")])];
        decimals.sort_by(|a, b| cmp_values(&["decimal"], a, b));
        assert_eq!(decimals, vec![key(&[Some("-10.00")]), key(&[Some("-0.5")]), key(&[Some("9.75")]), key(&[Some("9.8")]), key(&[Some("10.5")])]);
        let mut texts = vec![key(&[Some("b")]), key(&[Some("10")]), key(&[Some("9")])];
        texts.sort_by(|a, b| cmp_values(&["text"], a, b));
        assert_eq!(texts, vec![key(&[Some("10")]), key(&[Some("9")]), key(&[Some("b")])], "text sorts as text");
    }

    #[test]
    fn values_read_for_diff_are_typed() {
        use super::Cell;
        assert_eq!(Cell::from_canonical(Some("1792656000000000"), "timestamp"), Cell::Timestamp("2026-10-22T08:00:00".into()));
        assert_eq!(Cell::from_canonical(Some("1792656000500000"), "timestamptz"), Cell::Timestamp("2026-10-22T08:00:00.500Z".into()));
        assert_eq!(Cell::from_canonical(Some("t"), "bool"), Cell::Bool(true));
        assert_eq!(Cell::from_canonical(None, "int"), Cell::Null);
        let json = |c: Cell| serde_json::to_value(c).unwrap();
        assert_eq!(json(Cell::Int("12".into())), serde_json::json!(12));
        assert_eq!(json(Cell::Decimal("45.00".into())), serde_json::json!("45.00"));
        assert_eq!(json(Cell::Float("0.1".into())), serde_json::json!(0.1));
        assert_eq!(json(Cell::Float("nan".into())), serde_json::json!("nan"));
        assert_eq!(json(Cell::Null), serde_json::Value::Null);
        assert_eq!(Cell::Text("it's".into()).to_string(), "'it''s'");
        assert_eq!(Cell::Decimal("45.00".into()).to_string(), "45.00");
    }

    #[test]
    fn sample_rows_read_back_into_columns() {
        use super::{Cell, Row};
        let row = Row::parse_display("{order_id: 1, order_total: \"1.50\", note: \"a, \\\"b\\\": c\", dt: 2026-10-19, at: 2026-10-19 08:00:00.5, gone: NULL, ok: true}").unwrap();
        assert_eq!(
            row.0,
            vec![
                ("order_id".to_owned(), Cell::Int("1".into())),
                ("order_total".to_owned(), Cell::Text("1.50".into())),
                ("note".to_owned(), Cell::Text("a, \"b\": c".into())),
                ("dt".to_owned(), Cell::Date("2026-10-19".into())),
                ("at".to_owned(), Cell::Timestamp("2026-10-19T08:00:00.500".into())),
                ("gone".to_owned(), Cell::Null),
                ("ok".to_owned(), Cell::Bool(true)),
            ]
        );
        assert_eq!(Row::parse_display("{}"), Some(Row(Vec::new())));
        assert_eq!(Row::parse_display("not a row"), None);
        let (label, row) = Row::parse_labeled("only after this run: {id: 3, name: \"x\"}").unwrap();
        assert_eq!((label, row.get("id")), ("only after this run", Some(&Cell::Int("3".into()))));
        let row = Row::parse_assignments(&["order_id=3".to_owned(), "note=\"a=b\"".to_owned()]).unwrap();
        assert_eq!(row.get("note"), Some(&Cell::Text("a=b".into())));
        assert_eq!(Cell::from_display("\"tab\\there \\u{1b}\""), Cell::Text("tab\there \u{1b}".into()));
        assert_eq!(serde_json::to_value(&row).unwrap(), serde_json::json!({"order_id": 3, "note": "a=b"}));
    }
}
