//! The merge in two statements: the batch deduplicated straight from the
//! source (its input fingerprint tapped as the rows stream into the
//! window, ties in the batch found by the same tap), then one MERGE over
//! the keys whose first clauses refuse a key held in a partition the batch
//! does not touch and whose INSERT (and DELETE) conditions count their
//! rows. When every batch key was written, the output fingerprint is the
//! batch's; otherwise one join reads the keys left alone and looks there
//! for ties with the target. The checks the portable plan makes with
//! joins of their own ride on the two statements the hand-written SQL runs
//! anyway.
//!
//! It declines (the run is then made again by the portable plan, which
//! explains each case with the rows involved) on a NULL key or version, a
//! tie in the batch (to refuse, or to resolve by the total order) or with
//! the target, and a key held in a partition the batch does not touch.

use fixpoint_core::engine::measure::{fingerprint_select, row_hash, Scope};
use fixpoint_core::engine::{Accelerated, Column, Dialect, Engine, MergeRequest, Merged, RunSteps};
use fixpoint_core::fingerprint::{Fingerprint, Method};
use fixpoint_core::job::ident::quote_ident;
use fixpoint_core::job::spec::OnTie;
use fixpoint_core::job::sql::Sql;
use fixpoint_core::plans::merge::refusals::{deleted_error, duplicate_keys_error};
use fixpoint_core::plans::merge::sql::{keys_match, merge_actions, q, rows_differ, DELETED};
use fixpoint_core::plans::merge::steps::{drop_beaten, remember_tombstones, rows_before, touched_partitions, Conditions, BATCH};
use fixpoint_core::{Error, FailPoint, Result};

use super::no_hash;
use crate::DuckDb;

/// The batch as the first statement made it.
struct Batch {
    input: Fingerprint,
    /// Keys in the batch.
    rows: u64,
    duplicates_collapsed: u64,
    /// The kept upserts as the target's columns will hold them (rows,
    /// hash sum), when every output column comes from the source.
    kept_upserts: Option<(u64, i128)>,
    /// The batch's tombstones.
    tombstones: u64,
}

/// What the MERGE changed.
struct Written {
    changed: u64,
    inserts: u64,
    updates: u64,
    deletes: u64,
}

/// The plan, step by step.
pub(super) fn merge(db: &mut DuckDb, m: &MergeRequest<'_>, steps: &mut dyn RunSteps) -> Result<Accelerated<Merged>> {
    let output_cols: Vec<Column> = m.target_cols.iter().filter(|c| !m.job.metadata.contains(&c.name)).cloned().collect();
    let batch = match dedup(db, m, &output_cols)? {
        Accelerated::Done(batch) => batch,
        Accelerated::Declined(why) => return Ok(Accelerated::Declined(why)),
    };
    steps.step("dedup, input fp");
    // Tombstones: an older (or equal) version of a deleted key is already
    // beaten; dropped from the batch.
    let (tomb, beaten) = drop_beaten(db, m.job, m.spec, m.source_cols)?;
    steps.step("tombstones");
    let held_here = held_here(db, m)?;
    let rows_before = rows_before(db, m.job, m.spec)?;
    steps.fail_point(FailPoint::AfterGuards)?;
    let written = match write(db, m, &held_here, &batch)? {
        Accelerated::Done(written) => written,
        Accelerated::Declined(why) => return Ok(Accelerated::Declined(why)),
    };
    steps.step("merge");
    steps.fail_point(FailPoint::AfterDelete)?;
    steps.fail_point(FailPoint::MidInsert)?;
    remember_tombstones(db, m.spec, &tomb)?;
    steps.fail_point(FailPoint::AfterInsert)?;
    let output = match output(db, m, &output_cols, &batch, &written, beaten, &held_here)? {
        Accelerated::Done(output) => output,
        Accelerated::Declined(why) => return Ok(Accelerated::Declined(why)),
    };
    steps.step("output fp");
    let Written { inserts, updates, deletes, .. } = written;
    Ok(Accelerated::Done(Merged {
        input: batch.input,
        output,
        inserts,
        updates,
        deletes,
        batch_rows: batch.rows,
        duplicates_collapsed: batch.duplicates_collapsed,
        rows_before,
        method: "merge, checks in the statement",
    }))
}

/// 1. The batch: one row per key, straight from the source. A tap in the
///    projection the window orders by (last, so it decides nothing, and is
///    evaluated once per source row) sums the input fingerprint and looks
///    for ties: two upserts of one key at one version whose values differ
///    (a tombstone wins at its version, so it ties with nothing). A tie
///    anywhere, even below the newest version, declines: rare, and never
///    wrong. Without a tie, the rows of a key's newest version are copies,
///    so the window's order (version, tombstone first, the metadata
///    columns) picks the row the portable plan's total order picks.
fn dedup(db: &mut DuckDb, m: &MergeRequest<'_>, output_cols: &[Column]) -> Result<Accelerated<Batch>> {
    let (spec, names) = (m.spec, m.names);
    db.execute(&Sql::raw(format!("DROP TABLE IF EXISTS {BATCH}")))?;
    let (input_hash, kind, signature) = row_hash(db, Method::Native, "x", m.input_cols)?;
    let described = |c: &String| m.source_cols.iter().find(|s| &s.name == c).expect("described").clone();
    // Tombstones get pairs of their own (the flag is hashed with key and
    // version) and row hash 0: they never tie. (No argument may be a
    // constant NULL, which DuckDB folds the whole call into, as it can in
    // one branch of a UNION ALL source.)
    let del = quote_ident(DELETED);
    let flag = Column { name: DELETED.into(), ty: "BOOLEAN".into() };
    let pair_cols: Vec<Column> = spec.key.iter().chain([&spec.version]).map(described).chain([flag]).collect();
    let compared_cols: Vec<Column> = m.compared.iter().map(described).collect();
    let pair_hash = db.native_row_hash("x", &pair_cols).ok_or_else(no_hash)?;
    let row_hash = if compared_cols.is_empty() {
        "0".to_owned()
    } else {
        format!("CASE WHEN x.{del} THEN 0 ELSE {} END", db.native_row_hash("x", &compared_cols).ok_or_else(no_hash)?)
    };
    let (seen, seen_token) = db.tap_dedup(&input_hash, &pair_hash, &row_hash);
    // The kept upserts as the target's columns will hold them, hashed by a
    // counting tap on the way into the batch: the output fingerprint when
    // the MERGE writes every key (checked after it).
    let from_batch = !output_cols.is_empty() && output_cols.iter().all(|c| names.contains(&c.name));
    let out_tap = if from_batch {
        let renamed: Vec<Column> = output_cols.iter().enumerate().map(|(i, c)| Column { name: cast_name(i), ty: c.ty.clone() }).collect();
        let hash = db.native_row_hash("o", &renamed).ok_or_else(no_hash)?;
        Some(db.tap_rows(&Sql::raw(format!("CASE WHEN NOT o.{del} THEN {hash} END"))))
    } else {
        None
    };
    // What the portable plan refuses (a NULL key's rows share a window, a
    // NULL version sorts first: either way a kept row shows it) and the
    // tombstones, counted on the way in too.
    let null_key = spec.key.iter().chain([&spec.version]).map(|k| format!("o.{} IS NULL", quote_ident(k))).collect::<Vec<_>>().join(" OR ");
    let (null_tap, null_token) = db.tap_rows(&Sql::raw(format!("CASE WHEN {null_key} THEN 0 END")));
    let tomb_tap = spec.deleted.as_ref().map(|_| db.tap_rows(&Sql::raw(format!("CASE WHEN o.{del} THEN 0 END"))));
    let sql = dedup_sql(m, output_cols, &seen, &null_tap, out_tap.as_ref().map(|(t, _)| t), tomb_tap.as_ref().map(|(t, _)| t));
    let made = db.execute(&sql);
    db.batch_made = true;
    let seen = db.taps.close_dedup(seen_token);
    let kept_upserts = out_tap.map(|(_, token)| db.tap_close(token));
    let (nulls, _, _) = db.tap_close(null_token);
    let tombstones = tomb_tap.map_or(0, |(_, token)| db.tap_close(token).0);
    let rows = made.map_err(|e| deleted_error(m.job, spec, m.source_cols, e))?;
    if seen.ties > 0 || nulls > 0 {
        return Ok(Accelerated::Declined("a NULL key or version, or a tie, in the batch"));
    }
    let duplicates_collapsed =
        seen.rows.checked_sub(rows).ok_or_else(|| Error::Internal(format!("the batch has {rows} keys but the tap saw {} rows", seen.rows)))?;
    let input = Fingerprint::from_sum(&kind, &signature, seen.rows, seen.sum);
    let kept_upserts = kept_upserts.map(|(rows, _, sum)| (rows, sum));
    Ok(Accelerated::Done(Batch { input, rows, duplicates_collapsed, kept_upserts, tombstones }))
}

/// The name of the `i`-th output column cast to the target's type.
fn cast_name(i: usize) -> String {
    format!("__fixpoint_o{i}")
}

/// `CREATE TEMPORARY TABLE` of the batch: the window over the flagged
/// source, the dedup tap in the projection it orders by, the other taps in
/// the projection of the kept rows.
fn dedup_sql(m: &MergeRequest<'_>, output_cols: &[Column], seen: &Sql, null_tap: &Sql, out_tap: Option<&Sql>, tomb_tap: Option<&Sql>) -> Sql {
    let (spec, version, del) = (m.spec, quote_ident(&m.spec.version), quote_ident(DELETED));
    let key_list = spec.key.iter().map(|k| quote_ident(k)).collect::<Vec<_>>().join(", ");
    let order = std::iter::once(format!("{version} DESC NULLS FIRST"))
        .chain(spec.deleted.as_ref().map(|_| format!("{del} DESC")))
        .chain(m.meta_cols.iter().map(|c| format!("{} ASC NULLS FIRST", quote_ident(c))))
        .chain(["\"__fixpoint_seen\"".to_owned()])
        .collect::<Vec<_>>()
        .join(", ");
    let all = m.names.iter().map(|c| quote_ident(c)).chain([del.clone()]).collect::<Vec<_>>().join(", ");
    let mut sql = Sql::new();
    sql.push(&format!("CREATE TEMPORARY TABLE {BATCH} AS SELECT {all}, "));
    sql.append(null_tap).push(" AS \"__fixpoint_null\"");
    for (tap, name) in out_tap.iter().map(|t| (t, "out")).chain(tomb_tap.iter().map(|t| (t, "tomb"))) {
        sql.push(", ").append(tap).push(&format!(" AS \"__fixpoint_{name}\""));
    }
    sql.push(" FROM (SELECT r.*");
    if out_tap.is_some() {
        for (i, c) in output_cols.iter().enumerate() {
            sql.push(&format!(", CAST({} AS {}) AS {}", q("r", &c.name), c.ty, quote_ident(&cast_name(i))));
        }
    }
    sql.push(&format!(" FROM (SELECT *, row_number() OVER (PARTITION BY {key_list} ORDER BY {order}) AS \"__fixpoint_rank\" FROM (SELECT x.*, "));
    sql.append(seen);
    sql.push(" AS \"__fixpoint_seen\" FROM (SELECT s.*, ");
    match &spec.deleted {
        Some(pred) => sql.push(&format!("coalesce(({pred}), false)")),
        None => sql.push("false"),
    };
    sql.push(&format!(" AS {del} FROM "));
    Scope::Source { template: m.job.source.template(), params: m.params }.write_from(&mut sql, "s");
    sql.push(") AS x) AS x) AS r WHERE \"__fixpoint_rank\" = 1) AS o");
    sql
}

/// 2. Whether a key's target row `t` is in a partition the batch touches
///    (its own partition in the batch, the common case, decides at once;
///    then the touched partitions, bound as values). `None` unpruned.
fn held_here(db: &mut DuckDb, m: &MergeRequest<'_>) -> Result<Option<Sql>> {
    let Some(p) = m.prune else { return Ok(None) };
    let ty = &m.target_cols.iter().find(|c| c.name == p).expect("checked").ty;
    let mut held = Sql::new();
    held.push(&format!("({} = {} OR coalesce(", q("t", p), q("b", p))).append(&touched_partitions(db, p, ty)?).push(", false))");
    Ok(Some(held))
}

/// 3. One MERGE over the keys. A key the target holds in a partition the
///    batch does not touch (a merge pruned to the batch's partitions would
///    duplicate it) is refused by the UPDATE's and the DELETE's conditions
///    (a key left alone is checked with the rows left alone): cheaper than
///    a clause of its own, which makes the MERGE split every matched row.
///    The INSERT and, when the batch has tombstones, the DELETE conditions
///    are taps that count their rows; the UPDATE, the bulk of a change
///    feed, runs untapped: its count is what the statement changed
///    besides. (A target row that differs at the same version is left
///    alone by the version guard; it is looked for with the rows left
///    alone.)
fn write(db: &mut DuckDb, m: &MergeRequest<'_>, held_here: &Option<Sql>, batch: &Batch) -> Result<Accelerated<Written>> {
    let (spec, version, del) = (m.spec, quote_ident(&m.spec.version), quote_ident(DELETED));
    let newer = Conditions::of(spec, m.compared).newer;
    let (set, col_list, values) = merge_actions(spec, m.names, None);
    let (refuse, refuse_token) = db.tap_refuse();
    let mut sql = Sql::new();
    sql.push(&format!("MERGE INTO {} AS t USING {BATCH} AS b ON ({}) ", m.job.target.quoted(), keys_match("t", "b", &spec.key)));
    let mut delete_token = None;
    if batch.tombstones > 0 {
        let mut counted = Sql::new();
        counted.push(&format!("CASE WHEN b.{del} AND b.{version} >= t.{version} THEN "));
        match held_here {
            Some(held) => counted.push("CASE WHEN ").append(held).push(" THEN 0 ELSE CAST(").append(&refuse).push(" AS UBIGINT) END"),
            None => counted.push("0"),
        };
        counted.push(" END");
        let (tap, token) = db.tap_rows(&counted);
        delete_token = Some(token);
        sql.push("WHEN MATCHED AND ").append(&tap).push(" THEN DELETE ");
    }
    if !set.is_empty() {
        sql.push(&format!("WHEN MATCHED AND NOT b.{del} AND {newer} "));
        if let Some(held) = held_here {
            sql.push("AND CASE WHEN ").append(held).push(" THEN true ELSE ").append(&refuse).push(" END ");
        }
        sql.push(&format!("THEN UPDATE SET {set} "));
    }
    let (tap, insert_token) = db.tap_rows(&Sql::raw(format!("CASE WHEN NOT b.{del} THEN 0 END")));
    sql.push("WHEN NOT MATCHED AND ").append(&tap).push(&format!(" THEN INSERT ({col_list}) VALUES ({values})"));
    let changed = db.execute(&sql);
    let (inserts, _, _) = db.tap_close(insert_token);
    let deletes = delete_token.map_or(0, |t| db.tap_close(t).0);
    if DuckDb::any_refused(&db.taps, &[refuse_token]) {
        return Ok(Accelerated::Declined("a key held in a partition the batch does not touch"));
    }
    let changed = changed?;
    if changed > batch.rows {
        return Err(duplicate_keys_error(db, m.job, spec)?);
    }
    let updates = changed.checked_sub(inserts + deletes).ok_or_else(|| {
        Error::Internal(format!("the merge changed {changed} rows but its taps counted {inserts} inserts and {deletes} deletes; rolled back"))
    })?;
    Ok(Accelerated::Done(Written { changed, inserts, updates, deletes }))
}

/// 4. The output: the batch's keys as the target now holds them. When
///    every key of the batch was inserted, updated or deleted, that is the
///    batch's upserts as the target's columns hold them; otherwise the
///    keys left alone are read, and it declines when one differs from the
///    batch at the same version (`on_tie = "error"`) or is held in a
///    partition the batch does not touch.
fn output(db: &mut DuckDb, m: &MergeRequest<'_>, output_cols: &[Column], batch: &Batch, w: &Written, beaten: u64, held_here: &Option<Sql>) -> Result<Accelerated<Fingerprint>> {
    let (spec, version, del) = (m.spec, quote_ident(&m.spec.version), quote_ident(DELETED));
    let fp = fingerprint_select(db, Method::Native, "t", output_cols)?;
    let left_alone = (batch.rows - beaten).checked_sub(w.changed).ok_or_else(|| Error::Internal("the merge changed more rows than the batch holds".into()))?;
    if let (0, 0, Some((rows, sum))) = (left_alone, beaten, batch.kept_upserts) {
        let fp = fp.of(rows, sum);
        if fp.rows != w.inserts + w.updates {
            return Err(Error::Internal(format!("{} upserts in the batch, but the merge wrote {} and updated {}; rolled back", fp.rows, w.inserts, w.updates)));
        }
        return Ok(Accelerated::Done(fp));
    }
    let ties = if spec.on_tie == OnTie::Error {
        format!(", count(*) FILTER (WHERE NOT b.{del} AND b.{version} = t.{version} AND ({})) AS \"ties\"", rows_differ("b", "t", m.compared))
    } else {
        ", 0 AS \"ties\"".to_owned()
    };
    // The batch holds one row per key, so a join is a semi-join.
    let mut sql = Sql::new();
    sql.push(&format!("SELECT {}{ties}, ", fp.select));
    match held_here {
        Some(held) => sql.push("count(*) FILTER (WHERE NOT coalesce(").append(held).push(", false))"),
        None => sql.push("0"),
    };
    sql.push(&format!(" AS \"elsewhere\" FROM {} AS t JOIN {BATCH} AS b ON {}", m.job.target.quoted(), keys_match("t", "b", &spec.key)));
    let rows = db.query(&sql)?;
    let row = rows.single("the output scan")?;
    if row.count("ties")? > 0 || row.count("elsewhere")? > 0 {
        return Ok(Accelerated::Declined("a tie with the target, or a key held elsewhere, among the keys left alone"));
    }
    Ok(Accelerated::Done(fp.read(&row, db)?))
}
