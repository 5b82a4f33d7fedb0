//! The merge as one statement, for an upsert-only batch ([`fits`]): the
//! hand-written SQL's own `MERGE` over its `row_number()` dedup, and
//! nothing else but the ledger row. Every check rides on it:
//!
//! - the dedup tap in the projection the window orders by (evaluated once
//!   per source row) sums the input fingerprint and looks for ties in the
//!   batch (counted on another thread while the statement and the ledger
//!   row go on, and checked in [`Accelerator::confirm`]);
//! - a tap in the filter that keeps one row a key counts the kept rows and
//!   sums their hashes as the target's columns will hold them (the input
//!   hash itself where the casts keep it), and refuses a NULL key or
//!   version;
//! - the clauses are the hand-written ones (a guarded UPDATE, an INSERT);
//!   the UPDATE's condition is a tap counting its rows, which refuses a key
//!   the target holds in another partition than the batch's. The MERGE's
//!   own count less the updates is the inserts; the kept rows less both,
//!   the rows left alone. With none left alone the output fingerprint is
//!   the kept rows'; otherwise one read of the batch's keys after the
//!   statement takes it, and declines on rows tied with the target
//!   (`on_tie = "error"`; `"deterministic"`: those that should have won,
//!   which the UPDATE's strictly-newer condition left alone) and on keys
//!   the target holds in another partition.
//!
//! [`Accelerator::confirm`]: fixpoint_core::engine::Accelerator::confirm

use fixpoint_core::engine::measure::{fingerprint_select, row_hash, FingerprintSelect, Scope};
use fixpoint_core::engine::{Accelerated, Column, Dialect, Engine, MergeRequest, Merged, RunSteps};
use fixpoint_core::fingerprint::{Fingerprint, Method};
use fixpoint_core::job::ident::quote_ident;
use fixpoint_core::job::spec::OnTie;
use fixpoint_core::job::sql::Sql;
use fixpoint_core::plans::merge::refusals::duplicate_keys_error;
use fixpoint_core::plans::merge::sql::{keys_match, merge_actions, q, rows_differ, sorts_before, tombstone_table};
use fixpoint_core::{Error, FailPoint, Result};

use super::no_hash;
use crate::DuckDb;

/// Whether the merge can be one statement: no tombstones to honour or
/// remember, no audits (both read the batch), and the target's columns,
/// metadata aside, all come from the source (the output fingerprint is
/// then the batch's rows as written).
pub(super) fn fits(db: &mut DuckDb, m: &MergeRequest<'_>) -> Result<bool> {
    if m.spec.deleted.is_some() || !m.job.audits.is_empty() {
        return Ok(false);
    }
    let mut output = m.target_cols.iter().filter(|c| !m.job.metadata.contains(&c.name)).peekable();
    let from_source = output.peek().is_some() && output.all(|c| m.names.contains(&c.name));
    Ok(from_source && db.table_columns(&tombstone_table(&m.job.target))?.is_none())
}

/// What the statement's taps counted.
struct Counted {
    input: Fingerprint,
    batch_rows: u64,
    kept_sum: i128,
    changed: u64,
    updates: u64,
}

/// The plan, step by step.
pub(super) fn merge(db: &mut DuckDb, m: &MergeRequest<'_>, steps: &mut dyn RunSteps) -> Result<Accelerated<Merged>> {
    let output_cols: Vec<Column> = m.target_cols.iter().filter(|c| !m.job.metadata.contains(&c.name)).cloned().collect();
    let fp = fingerprint_select(db, Method::Native, "t", &output_cols)?;
    steps.fail_point(FailPoint::AfterGuards)?;
    let counted = match statement(db, m, &output_cols, steps)? {
        Accelerated::Done(counted) => counted,
        Accelerated::Declined(why) => return Ok(Accelerated::Declined(why)),
    };
    steps.fail_point(FailPoint::AfterDelete)?;
    steps.fail_point(FailPoint::MidInsert)?;
    let Counted { input, batch_rows, kept_sum, changed, updates } = counted;
    if changed > batch_rows {
        return Err(duplicate_keys_error(db, m.job, m.spec)?);
    }
    if updates > changed {
        return Err(Error::Internal(format!("the merge changed {changed} rows of a {batch_rows}-key batch but its tap counted {updates} updates; rolled back")));
    }
    let duplicates_collapsed =
        input.rows.checked_sub(batch_rows).ok_or_else(|| Error::Internal(format!("the batch has {batch_rows} keys but the tap saw {} rows", input.rows)))?;
    steps.fail_point(FailPoint::AfterInsert)?;
    let output = if changed == batch_rows {
        fp.of(batch_rows, kept_sum)
    } else {
        match left_alone(db, m, &fp, batch_rows)? {
            Accelerated::Done(output) => output,
            Accelerated::Declined(why) => return Ok(Accelerated::Declined(why)),
        }
    };
    steps.step("output fp");
    // The ties are known after the ledger row ([`Accelerator::confirm`]):
    // this plan runs no audits ([`fits`]), which would read a kept row
    // picked among tied ones by arrival order.
    let method = "merge, one statement";
    Ok(Accelerated::Done(Merged { input, output, inserts: changed - updates, updates, deletes: 0, batch_rows, duplicates_collapsed, rows_before: None, method }))
}

/// The pruned partition's condition: the key's target row is in the
/// batch row's partition.
fn held(m: &MergeRequest<'_>) -> String {
    match m.prune {
        Some(p) => format!("{} = {}", q("t", p), q("b", p)),
        None => "true".to_owned(),
    }
}

/// The window's order: newest version first, then the metadata columns.
fn window_order(m: &MergeRequest<'_>) -> String {
    std::iter::once(format!("{} DESC NULLS FIRST", quote_ident(&m.spec.version)))
        .chain(m.meta_cols.iter().map(|c| format!("{} ASC NULLS FIRST", quote_ident(c))))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The MERGE over the tapped dedup, run; what its taps counted, or
/// declined when one of them refused a row.
fn statement(db: &mut DuckDb, m: &MergeRequest<'_>, output_cols: &[Column], steps: &mut dyn RunSteps) -> Result<Accelerated<Counted>> {
    let spec = m.spec;
    let version = quote_ident(&spec.version);
    // The batch: the dedup window over the source, the input fingerprint
    // and the in-batch ties tapped in the projection it orders by.
    let (input_hash, kind, signature) = row_hash(db, Method::Native, "x", m.input_cols)?;
    let described = |c: &String| m.source_cols.iter().find(|s| &s.name == c).expect("described").clone();
    let pair_cols: Vec<Column> = spec.key.iter().chain([&spec.version]).map(described).collect();
    let pair_hash = db.native_row_hash("x", &pair_cols).ok_or_else(no_hash)?;
    // Rows of one key and version differ where their input hashes do (it
    // covers every column but the metadata): one hash a row serves both.
    let (seen, seen_token) = db.tap_dedup(&input_hash, &pair_hash, &input_hash);
    // The kept rows, one a key: a tap in the filter over them counts them
    // and sums their hashes as written (every kept row is written unless
    // left alone), and refuses a NULL key or version. Its argument is NULL
    // for the other ranks, so the filter keeps exactly the kept rows
    // whatever the order in which the engine evaluates it and the rank's
    // own.
    let (refuse, refuse_token) = db.tap_refuse();
    let null_key = spec.key.iter().chain([&spec.version]).map(|k| format!("{} IS NULL", q("k", k))).collect::<Vec<_>>().join(" OR ");
    let mut kept = Sql::new();
    kept.push(&format!("CASE WHEN k.\"__fixpoint_rank\" = 1 THEN CASE WHEN {null_key} THEN CAST(")).append(&refuse);
    kept.push(" AS UBIGINT) ELSE k.\"__fixpoint_h\" END END");
    let (kept_tap, kept_token) = db.tap_rows(&kept);
    // Its first row comes once the window has every source row: the ties
    // are counted from then on, on another thread, while the join runs
    // (~3.5 ms a 198k-row batch, waited for after the statement before).
    db.taps.count_ties_after(kept_token, seen_token);
    // Strictly newer, whatever `on_tie`: a batch row at the target's
    // version is left alone here, and the read after the statement
    // declines when it should have won (`"deterministic"`: naming the
    // compared columns here made the scan read them for every row it
    // keeps, ~45 % of the statement on the benchmark's table). A counting
    // condition (two comparisons: nested CASEs cost twice as much, ~4.5 ms
    // of a 120 ms MERGE here) that refuses a key the target holds in
    // another partition than the batch's.
    let (update_tap, update_token) = db.tap_if(&format!("(b.{version} > t.{version})"), &held(m));
    let sql = statement_sql(db, m, output_cols, &input_hash, &seen, &kept_tap, &update_tap)?;
    let changed = db.execute(&sql);
    steps.step("merge statement");
    // The ties in the batch are counted on other threads during the join
    // and while the ledger row is written ([`Accelerator::confirm`]).
    let (input_rows, input_sum, ties) = db.taps.close_dedup_deferred(seen_token);
    let (batch_rows, _, kept_sum) = db.tap_close(kept_token);
    let (updates, _, _) = db.tap_close(update_token);
    if DuckDb::any_refused(&db.taps, &[refuse_token, update_token]) {
        return Ok(Accelerated::Declined("a NULL key or version, or a key held in another partition"));
    }
    let changed = changed?;
    db.pending_ties = Some(ties);
    steps.step("taps closed");
    let input = Fingerprint::from_sum(&kind, &signature, input_rows, input_sum);
    Ok(Accelerated::Done(Counted { input, batch_rows, kept_sum, changed, updates }))
}

/// The statement: `MERGE INTO target USING (the kept rows of the dedup
/// window over the source, tapped) ON the key`, a guarded UPDATE and an
/// INSERT.
fn statement_sql(db: &DuckDb, m: &MergeRequest<'_>, output_cols: &[Column], input_hash: &str, seen: &Sql, kept_tap: &Sql, update_tap: &Sql) -> Result<Sql> {
    let spec = m.spec;
    let key_list = spec.key.iter().map(|k| quote_ident(k)).collect::<Vec<_>>().join(", ");
    let order = format!("{}, \"__fixpoint_seen\"", window_order(m));
    // The hash of each row as written. When the target's columns are the
    // source's, in order, and each cast to the target's type keeps the
    // value the engine hashes (the same type; on DuckDB also a DECIMAL of
    // another precision in the same storage), it is the row's input hash,
    // computed anyway for the input fingerprint and carried through the
    // window. Otherwise the batch's values are cast to the target's types
    // and hashed again, once a kept row, under the MERGE (named in its
    // conditions, it costs ~3 times as much).
    let hashed_as_read = output_cols.len() == m.input_cols.len()
        && output_cols.iter().zip(m.input_cols).all(|(o, i)| o.name == i.name && db.same_native_hash(&i.ty, &o.ty));
    let cast_name = |i: usize| format!("__fixpoint_o{i}");
    let renamed: Vec<Column> = output_cols.iter().enumerate().map(|(i, c)| Column { name: cast_name(i), ty: c.ty.clone() }).collect();
    let kept_hash = db.native_row_hash("c", &renamed).ok_or_else(no_hash)?;
    let mut sql = Sql::new();
    sql.push(&format!("MERGE INTO {} AS t USING (SELECT * FROM (", m.job.target.quoted()));
    if hashed_as_read {
        sql.push("SELECT * FROM ");
    } else {
        sql.push(&format!("SELECT c.*, {kept_hash} AS \"__fixpoint_h\" FROM (SELECT r.*"));
        for (i, c) in output_cols.iter().enumerate() {
            sql.push(&format!(", CAST({} AS {}) AS {}", q("r", &c.name), c.ty, quote_ident(&cast_name(i))));
        }
        sql.push(" FROM ");
    }
    sql.push(&format!("(SELECT *, row_number() OVER (PARTITION BY {key_list} ORDER BY {order}) AS \"__fixpoint_rank\" FROM (SELECT x.*, "));
    sql.append(seen).push(" AS \"__fixpoint_seen\"");
    if hashed_as_read {
        // The same expression as the tap's: computed once.
        sql.push(&format!(", {input_hash} AS \"__fixpoint_h\""));
    }
    sql.push(" FROM ");
    Scope::Source { template: m.job.source.template(), params: m.params }.write_from(&mut sql, "x");
    sql.push(") AS x) AS r WHERE \"__fixpoint_rank\" = 1");
    if !hashed_as_read {
        sql.push(") AS c");
    }
    sql.push(") AS k WHERE ").append(kept_tap);
    sql.push(&format!(") AS b ON ({}) ", keys_match("t", "b", &spec.key)));
    // The clauses are the hand-written SQL's: a guarded UPDATE, an INSERT.
    // (They read of the target's columns only the version and the
    // partition: any other column they name is read for every row the scan
    // keeps, ~30 % of the statement here; a clause of its own for the rows
    // left alone, or a condition on the INSERT, cost ~5 ms each even with
    // no row to take. The rows left alone are read after, when there are
    // any.) Pruned, the UPDATE's condition refuses a row whose partition
    // differs from the batch's, so it leaves the partition as it is (one
    // column fewer to rewrite: ~1.5 ms of the MERGE here, and its share of
    // the commit).
    let (set, col_list, values) = merge_actions(spec, m.names, m.prune);
    if !set.is_empty() {
        sql.push("WHEN MATCHED AND ").append(update_tap).push(&format!(" THEN UPDATE SET {set} "));
    }
    sql.push(&format!("WHEN NOT MATCHED THEN INSERT ({col_list}) VALUES ({values})"));
    Ok(sql)
}

/// Keys left alone: the batch's keys as the target now holds them, read
/// through the same dedup (untapped); declined when, at the same version,
/// a batch row differs from the target's (`on_tie = "error"`: the plans
/// that name them refuse them) or the total order puts it first
/// (`"deterministic"`: the portable plan writes it), or when a key is held
/// in another partition than the batch's (the portable plan allows a move
/// within the touched partitions, or refuses it).
fn left_alone(db: &mut DuckDb, m: &MergeRequest<'_>, fp: &FingerprintSelect, batch_rows: u64) -> Result<Accelerated<Fingerprint>> {
    let (spec, version) = (m.spec, quote_ident(&m.spec.version));
    let to_resolve = match spec.on_tie {
        OnTie::Error => rows_differ("b", "t", m.compared),
        OnTie::Deterministic => sorts_before("b", "t", m.compared),
    };
    let ties = format!("count(*) FILTER (WHERE b.{version} = t.{version} AND ({to_resolve})) AS \"ties\"");
    let elsewhere = format!("count(*) FILTER (WHERE NOT coalesce({}, false)) AS \"elsewhere\"", held(m));
    let key_list = spec.key.iter().map(|k| quote_ident(k)).collect::<Vec<_>>().join(", ");
    let mut sql = Sql::new();
    sql.push(&format!(
        "SELECT {}, {ties}, {elsewhere} FROM {} AS t JOIN (SELECT * FROM (SELECT *, row_number() OVER (PARTITION BY {key_list} ORDER BY {}) AS \"__fixpoint_rank\" FROM ",
        fp.select,
        m.job.target.quoted(),
        window_order(m)
    ));
    Scope::Source { template: m.job.source.template(), params: m.params }.write_from(&mut sql, "x");
    sql.push(&format!(") AS r WHERE \"__fixpoint_rank\" = 1) AS b ON {}", keys_match("t", "b", &spec.key)));
    let rows = db.query(&sql)?;
    let row = rows.single("the output scan")?;
    if row.count("ties")? > 0 || row.count("elsewhere")? > 0 {
        return Ok(Accelerated::Declined("a tie with the target, or a key held elsewhere, among the keys left alone"));
    }
    let fp = fp.read(&row, db)?;
    if fp.rows != batch_rows {
        return Err(Error::Internal(format!("the batch has {batch_rows} keys, but the target holds {} rows of them after the merge; rolled back", fp.rows)));
    }
    Ok(Accelerated::Done(fp))
}
