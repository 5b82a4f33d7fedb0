//! The merge strategy: upsert on the natural key, newest version wins, the
//! source deduplicated first, tombstones remembered, pruned to the
//! partitions the batch touches.
//!
//! The contract (also in docs/strategies.md): for each key, the target holds the
//! winner among every row ever delivered for it, whatever the order and the
//! number of runs. Rows are ranked by version (higher wins); at equal
//! version a tombstone beats an upsert; between different upserts at equal
//! version, `on_tie = "error"` refuses the run and `"deterministic"` picks
//! the row whose values sort first (column by column in source order,
//! ascending, NULLs first; metadata columns are ignored). If the winner is a
//! tombstone the key is absent. Tombstones are kept in
//! `fixpoint."tombstones__<schema>__<table>"` (key and version), so an older
//! upsert replayed after a delete never resurrects the key.

use std::time::Instant;

use crate::job::date::RunDate;
use crate::fingerprint::compute::{fingerprint_select, Scope};
use crate::engine::{Accelerator, Column, Engine};
use crate::error::{Error, FailPoint, Result};
use crate::fingerprint::{Fingerprint, Method};
use crate::job::ident::{quote_ident, TableName};
use crate::run::ledger;
use crate::run::report::{entry, RunReport};
use crate::run::protocol::{in_transaction, RunOptions};
use crate::fingerprint::runkey::run_key;
use crate::job::spec::{Job, MergeSpec, OnTie};
use crate::plans::merge::steps::{flagged_source, scan_stage};
use crate::plans::merge::refusals::{check_source, cross_tie_error, deleted_error, duplicate_keys_error, moved_error, tie_error};
use crate::plans::merge::sql::{batch_tie_cond, count, dedup_sql, keys_match, merge_actions, q, rows_differ, sorts_before, tombstone_table, DELETED};
use crate::job::sql::Sql;

const STAGE: &str = "\"__fixpoint_stage\"";
const BATCH: &str = "\"__fixpoint_batch\"";
/// Above this many touched partitions the prune filter is a subquery.
const MAX_PRUNE_LIST: usize = 1000;

/// Makes sure of the tombstone table when the job marks tombstones (or
/// once did), and drops from the batch the rows a tombstone already beats
/// (an older or equal version of a deleted key). Returns the table and how
/// many rows were dropped.
fn drop_beaten(engine: &mut dyn Engine, job: &Job, spec: &MergeSpec, source_cols: &[Column]) -> Result<(TableName, u64)> {
    let tomb = tombstone_table(&job.target);
    if spec.deleted.is_none() && engine.table_columns(&tomb)?.is_none() {
        return Ok((tomb, 0));
    }
    let version = quote_ident(&spec.version);
    let cols: Vec<String> = spec
        .key
        .iter()
        .chain([&spec.version])
        .map(|k| format!("{} {}", quote_ident(k), source_cols.iter().find(|c| &c.name == k).expect("described").ty))
        .collect();
    engine.execute(&Sql::raw(format!("CREATE TABLE IF NOT EXISTS {} ({})", tomb.quoted(), cols.join(", "))))?;
    let beaten = engine.execute(&Sql::raw(format!(
        "DELETE FROM {BATCH} AS b WHERE EXISTS (SELECT 1 FROM {} AS d WHERE {} AND b.{version} <= d.{version})",
        tomb.quoted(),
        keys_match("d", "b", &spec.key)
    )))?;
    Ok((tomb, beaten))
}

/// `t.<p> IN (…)`: the partitions the batch touches, bound as values so the
/// engine can skip the others (a subquery past [`MAX_PRUNE_LIST`]).
fn touched_partitions(engine: &mut dyn Engine, p: &str, ty: &str) -> Result<Sql> {
    let parts = engine.query(&Sql::raw(format!("SELECT DISTINCT {} FROM {BATCH} WHERE {} IS NOT NULL ORDER BY 1", quote_ident(p), quote_ident(p))))?.rows;
    let mut sql = Sql::new();
    sql.push(&q("t", p));
    if parts.is_empty() {
        sql.push(" IS NULL AND false");
    } else if parts.len() <= MAX_PRUNE_LIST {
        sql.push(" IN (");
        for (i, v) in parts.iter().enumerate() {
            if i > 0 {
                sql.push(", ");
            }
            sql.typed_param(v[0].clone(), ty);
        }
        sql.push(")");
    } else {
        sql.push(&format!(" IN (SELECT {} FROM {BATCH})", quote_ident(p)));
    }
    Ok(sql)
}

/// The touched keys' rows as the target holds them (audits), as a FROM item.
fn touched_rows(job: &Job, spec: &MergeSpec, sql: &mut Sql) {
    sql.push(&format!(
        "(SELECT t.* FROM {} AS t WHERE EXISTS (SELECT 1 FROM {BATCH} AS b WHERE {})) AS a",
        job.target.quoted(),
        keys_match("t", "b", &spec.key)
    ));
}

/// How many rows the touched keys have before the merge, when an audit
/// compares row counts.
fn rows_before(engine: &mut dyn Engine, job: &Job, spec: &MergeSpec) -> Result<Option<u64>> {
    if !job.audits.iter().any(|a| matches!(a.kind, crate::job::audit::AuditKind::RowCountChange { .. })) {
        return Ok(None);
    }
    let mut sql = Sql::new();
    sql.push("SELECT count(*) AS \"n\" FROM ");
    touched_rows(job, spec, &mut sql);
    Ok(Some(count(engine, &sql)?))
}

/// Replaces the remembered tombstones of the batch's deleted keys with the
/// batch's.
fn remember_tombstones(engine: &mut dyn Engine, spec: &MergeSpec, tomb: &TableName) -> Result<()> {
    if spec.deleted.is_none() {
        return Ok(());
    }
    let del = quote_ident(DELETED);
    engine.execute(&Sql::raw(format!(
        "DELETE FROM {} AS d WHERE EXISTS (SELECT 1 FROM {BATCH} AS b WHERE b.{del} AND {})",
        tomb.quoted(),
        keys_match("d", "b", &spec.key)
    )))?;
    let kv = spec.key.iter().chain([&spec.version]).map(|k| quote_ident(k)).collect::<Vec<_>>().join(", ");
    engine.execute(&Sql::raw(format!("INSERT INTO {} ({kv}) SELECT {kv} FROM {BATCH} WHERE {del}", tomb.quoted())))?;
    Ok(())
}

/// What a merge did, for its report.
struct Outcome {
    key: String,
    input: Fingerprint,
    output: Fingerprint,
    inserts: u64,
    updates: u64,
    deletes: u64,
    batch_rows: u64,
    duplicates_collapsed: u64,
    rows_before: Option<u64>,
    method: &'static str,
}

/// Audits the touched keys as they will be published, writes the report
/// and the ledger row, and stops at the last fail point before COMMIT.
fn publish(engine: &mut dyn Engine, plan: &Plan<'_>, o: Outcome, trace: &mut crate::run::protocol::Trace) -> Result<RunReport> {
    let job = plan.job;
    let audits = if job.audits.is_empty() {
        Vec::new()
    } else {
        let touched = |sql: &mut Sql| touched_rows(job, plan.spec, sql);
        let scope = crate::run::audit::AuditScope { from: &touched, previous_rows: o.rows_before, run_date: plan.run_date.date() };
        let results = crate::run::audit::audit(job, engine, &scope)?;
        trace.step("audits");
        results
    };
    let mut report = RunReport::new(job, plan.run_date, o.key, "committed", &o.input, &o.output);
    report.audits = audits;
    report.input_files = plan.run_input.files.clone();
    report.rows_deleted = o.deletes;
    report.rows_inserted = o.inserts;
    report.rows_updated = o.updates;
    report.rows_unchanged = o.batch_rows - o.inserts - o.updates - o.deletes;
    report.duplicates_collapsed = o.duplicates_collapsed;
    report.created_target = plan.created_target;
    report.method = o.method.into();
    ledger::record(engine, &entry(job, &job.definition_hash(), &report, plan.started_at))?;
    plan.opts.step(FailPoint::BeforeCommit)?;
    Ok(report)
}

/// The message of a refusal raised inside the MERGE (`error(…)` in a condition).
const REFUSED_IN_MERGE: &str = crate::engine::REFUSED_IN_STATEMENT;

/// What both merge plans know before they start.
struct Plan<'a> {
    job: &'a Job,
    spec: &'a MergeSpec,
    run_date: RunDate,
    opts: &'a RunOptions,
    run_input: &'a crate::run::input::RunInput,
    params: &'a crate::job::sql::RunParams,
    source_cols: &'a [Column],
    added: &'a [Column],
    created_target: bool,
    prune: Option<&'a str>,
    names: &'a [String],
    compared: &'a [String],
    meta_cols: &'a [String],
    input_cols: &'a [Column],
    started_at: chrono::NaiveDateTime,
}

/// Takes the run's lock, makes sure of the ledger, adds the source's new
/// columns and creates the target when missing; returns its columns.
fn prepare(engine: &mut dyn Engine, job: &Job, opts: &RunOptions, source_cols: &[Column], added: &[Column], created: bool) -> Result<Vec<Column>> {
    // Keys may move across partitions: a merge fences the whole table.
    crate::run::protocol::fence(engine, job, "all", opts)?;
    ledger::ensure(engine)?;
    crate::run::schema::append(engine, &job.target, added)?;
    if created {
        engine.execute(&Sql::raw(format!("CREATE SCHEMA IF NOT EXISTS {}", quote_ident(&job.target.schema))))?;
        let cols: Vec<String> = source_cols.iter().map(|c| format!("{} {}", quote_ident(&c.name), c.ty)).collect();
        engine.execute(&Sql::raw(format!("CREATE TABLE {} ({})", job.target.quoted(), cols.join(", "))))?;
    }
    Ok(engine.table_columns(&job.target)?.unwrap_or_default())
}

/// The merge in two statements, for engines whose MERGE refuses rows and
/// holds taps ([`Accelerator::merge_refuses_in_statement`]; DuckDB): the batch
/// deduplicated straight from the source (its input fingerprint tapped as
/// the rows stream into the window, ties in the batch flagged by the same
/// window), then one MERGE over the keys whose first clause refuses a key
/// held in a partition the batch does not touch and whose INSERT (and
/// DELETE) conditions count their rows. When every batch key was written,
/// the output fingerprint is the batch's; otherwise one join reads the
/// keys left alone and looks there for ties with the target. The checks
/// the other plan makes with joins of their own ride on the two
/// statements the hand-written SQL runs anyway.
///
/// `Ok(None)` (and a refusal raised inside the MERGE) means "roll back and
/// run the other plan": a NULL key or version, a tie in the batch (to
/// refuse, or to resolve by the total order) or with the target, a key
/// held elsewhere: rare, and the other plan explains each with the rows
/// involved.
fn merge_in_statement(engine: &mut dyn Accelerator, plan: &Plan<'_>, trace: &mut crate::run::protocol::Trace) -> Result<Option<RunReport>> {
    let Plan { job, spec, run_date, opts, run_input, params, source_cols, added, created_target, prune, names, compared, meta_cols, input_cols, started_at: _ } = *plan;
    let is_meta = |c: &String| job.metadata.contains(c);
    let target_cols = prepare(engine, job, opts, source_cols, added, created_target)?;
    trace.step("prepare");
    let output_cols: Vec<Column> = target_cols.iter().filter(|c| !is_meta(&c.name)).cloned().collect();
    let version = quote_ident(&spec.version);
    let del = quote_ident(DELETED);

    // 1. The batch: one row per key, straight from the source. A tap in
    //    the projection the window orders by (last, so it decides nothing,
    //    and is evaluated once per source row) sums the input fingerprint
    //    and looks for ties: two upserts of one key at one version whose
    //    values differ (a tombstone wins at its version, so it ties with
    //    nothing). A tie anywhere, even below the newest version, sends
    //    the run to the other plan: rare, and never wrong. Without a tie,
    //    the rows of a key's newest version are copies, so the window's
    //    order (version, tombstone first, the metadata columns) picks the
    //    row the other plan's total order picks.
    engine.execute(&Sql::raw(format!("DROP TABLE IF EXISTS {BATCH}")))?;
    let (input_hash, kind, signature) = crate::fingerprint::compute::row_hash(engine, Method::Native, "x", input_cols)?;
    let described = |c: &String| source_cols.iter().find(|s| &s.name == c).expect("described").clone();
    // Tombstones get pairs of their own (the flag is hashed with key and
    // version) and row hash 0: they never tie. (No argument may be a
    // constant NULL, which DuckDB folds the whole call into, as it can in
    // one branch of a UNION ALL source.)
    let flag = Column { name: DELETED.into(), ty: "BOOLEAN".into() };
    let pair_cols: Vec<Column> = spec.key.iter().chain([&spec.version]).map(described).chain([flag]).collect();
    let compared_cols: Vec<Column> = compared.iter().map(described).collect();
    let no_hash = || Error::Internal("the engine has no native row hash".into());
    let no_taps = || Error::Internal("the engine has no taps".into());
    let pair_hash = engine.dialect().native_row_hash("x", &pair_cols).ok_or_else(no_hash)?;
    let row_hash = if compared_cols.is_empty() {
        "0".to_owned()
    } else {
        format!("CASE WHEN x.{del} THEN 0 ELSE {} END", engine.dialect().native_row_hash("x", &compared_cols).ok_or_else(no_hash)?)
    };
    let (seen, seen_token) = engine.tap_dedup(&input_hash, &pair_hash, &row_hash).ok_or_else(no_taps)?;
    let key_list = spec.key.iter().map(|k| quote_ident(k)).collect::<Vec<_>>().join(", ");
    let order = std::iter::once(format!("{version} DESC NULLS FIRST"))
        .chain(spec.deleted.as_ref().map(|_| format!("{del} DESC")))
        .chain(meta_cols.iter().map(|c| format!("{} ASC NULLS FIRST", quote_ident(c))))
        .chain(["\"__fixpoint_seen\"".to_owned()])
        .collect::<Vec<_>>()
        .join(", ");
    let all = names.iter().map(|c| quote_ident(c)).chain([del.clone()]).collect::<Vec<_>>().join(", ");
    // The kept upserts as the target's columns will hold them, hashed by a
    // counting tap on the way into the batch: the output fingerprint when
    // the MERGE writes every key (checked below).
    let from_batch = !output_cols.is_empty() && output_cols.iter().all(|c| names.contains(&c.name));
    let cast_name = |i: usize| format!("__fixpoint_o{i}");
    let out_tap = if from_batch {
        let renamed: Vec<Column> = output_cols.iter().enumerate().map(|(i, c)| Column { name: cast_name(i), ty: c.ty.clone() }).collect();
        let hash = engine.dialect().native_row_hash("o", &renamed).ok_or_else(no_hash)?;
        engine.tap_rows(&Sql::raw(format!("CASE WHEN NOT o.{del} THEN {hash} END")))
    } else {
        None
    };
    // What the other plan refuses (a NULL key's rows share a window, a
    // NULL version sorts first: either way a kept row shows it) and the
    // tombstones, counted on the way in too.
    let null_key = spec.key.iter().map(|k| format!("o.{} IS NULL", quote_ident(k))).chain([format!("o.{version} IS NULL")]).collect::<Vec<_>>().join(" OR ");
    let (null_tap, null_token) = engine.tap_rows(&Sql::raw(format!("CASE WHEN {null_key} THEN 0 END"))).ok_or_else(no_taps)?;
    let tomb_tap = match spec.deleted {
        Some(_) => Some(engine.tap_rows(&Sql::raw(format!("CASE WHEN o.{del} THEN 0 END"))).ok_or_else(no_taps)?),
        None => None,
    };
    let mut sql = Sql::new();
    sql.push(&format!("CREATE TEMPORARY TABLE {BATCH} AS SELECT {all}, "));
    sql.append(&null_tap).push(" AS \"__fixpoint_null\"");
    for (tap, name) in out_tap.iter().map(|(t, _)| (t, "out")).chain(tomb_tap.iter().map(|(t, _)| (t, "tomb"))) {
        sql.push(", ").append(tap).push(&format!(" AS \"__fixpoint_{name}\""));
    }
    sql.push(" FROM (SELECT r.*");
    if out_tap.is_some() {
        for (i, c) in output_cols.iter().enumerate() {
            sql.push(&format!(", CAST({} AS {}) AS {}", q("r", &c.name), c.ty, quote_ident(&cast_name(i))));
        }
    }
    sql.push(&format!(" FROM (SELECT *, row_number() OVER (PARTITION BY {key_list} ORDER BY {order}) AS \"__fixpoint_rank\" FROM (SELECT x.*, "));
    sql.append(&seen);
    sql.push(" AS \"__fixpoint_seen\" FROM (SELECT s.*, ");
    match &spec.deleted {
        Some(pred) => sql.push(&format!("coalesce(({pred}), false)")),
        None => sql.push("false"),
    };
    sql.push(&format!(" AS {del} FROM "));
    Scope::Source { template: job.source.template(), params }.write_from(&mut sql, "s");
    sql.push(") AS x) AS x) AS r WHERE \"__fixpoint_rank\" = 1) AS o");
    let made = engine.execute(&sql);
    let seen = engine.tap_close(seen_token);
    let kept_upserts = out_tap.and_then(|(_, token)| engine.tap_close(token));
    let nulls = engine.tap_close(null_token);
    let tombstones = tomb_tap.map(|(_, token)| engine.tap_close(token));
    let batch_rows = made.map_err(|e| deleted_error(job, spec, source_cols, e))?;
    let (input_rows, ties, input_sum) = seen.ok_or_else(|| tap_lost("the source's rows"))?;
    let (nulls, _, _) = nulls.ok_or_else(|| tap_lost("the NULL keys and versions"))?;
    let tombstones = match tombstones {
        Some(t) => t.ok_or_else(|| tap_lost("the tombstones"))?.0,
        None => 0,
    };
    trace.step("dedup, input fp");

    // 2. What the other plan refuses or resolves: NULL keys and versions,
    //    ties.
    if ties > 0 || nulls > 0 {
        return Ok(None);
    }
    let input = Fingerprint::from_sum(&kind, &signature, input_rows, input_sum);
    let job_hash = job.definition_hash();
    let key = run_input.file_key(&job_hash, run_date).unwrap_or_else(|| run_key(&job_hash, run_date, &input));
    let duplicates_collapsed = input_rows.checked_sub(batch_rows).ok_or_else(|| Error::Internal(format!("the batch has {batch_rows} keys but the tap saw {input_rows} rows")))?;
    trace.step("run key");

    // 3. Tombstones: an older (or equal) version of a deleted key is
    //    already beaten; drop it from the batch.
    let (tomb, beaten) = drop_beaten(engine, job, spec, source_cols)?;
    trace.step("tombstones");

    // 4. The partitions the batch touches, bound as values.
    let mut in_scope = Sql::new();
    if let Some(p) = prune {
        let ty = &target_cols.iter().find(|c| c.name == p).expect("checked").ty;
        in_scope.push("coalesce(").append(&touched_partitions(engine, p, ty)?).push(", false)");
    }

    let rows_before = rows_before(engine, job, spec)?;
    opts.step(FailPoint::AfterGuards)?;

    // 5. One MERGE over the keys. A key the target holds in a partition
    //    the batch does not touch (a merge pruned to the batch's partitions
    //    would duplicate it) is refused by the UPDATE's and the DELETE's
    //    conditions, which raise an error for it (a key left alone is
    //    checked below, with the rows left alone): cheaper than a clause
    //    of its own, which makes the MERGE split every matched row. The
    //    INSERT and, when the batch has tombstones, the DELETE conditions
    //    are taps that count their rows; the UPDATE, the bulk of a change
    //    feed, runs untapped: its count is what the statement changed
    //    besides. (A target row that differs at the same version is left
    //    alone by the version guard; it is looked for below, with the rows
    //    left alone.)
    let newer = format!("(b.{version} > t.{version}{})", match spec.on_tie {
        OnTie::Deterministic => format!(" OR (b.{version} = t.{version} AND {})", sorts_before("b", "t", compared)),
        OnTie::Error => String::new(),
    });
    let (set, col_list, values) = merge_actions(spec, names, None);
    // The key's target row is in a partition the batch touches (its own
    // partition in the batch, the common case, decides at once).
    let mut held_here = Sql::new();
    if let Some(p) = prune {
        held_here.push(&format!("({} = {} OR ", q("t", p), q("b", p))).append(&in_scope).push(")");
    }
    let refuse = format!("error('{REFUSED_IN_MERGE}')");
    let mut sql = Sql::new();
    sql.push(&format!("MERGE INTO {} AS t USING {BATCH} AS b ON ({}) ", job.target.quoted(), keys_match("t", "b", &spec.key)));
    let is_delete = format!("b.{del} AND b.{version} >= t.{version}");
    let mut delete_token = None;
    if tombstones > 0 {
        let mut counted = Sql::new();
        counted.push(&format!("CASE WHEN {is_delete} THEN "));
        if prune.is_some() {
            counted.push("CASE WHEN ").append(&held_here).push(&format!(" THEN 0 ELSE {refuse} END"));
        } else {
            counted.push("0");
        }
        counted.push(" END");
        let (tap, token) = engine.tap_rows(&counted).ok_or_else(no_taps)?;
        delete_token = Some(token);
        sql.push("WHEN MATCHED AND ");
        sql.append(&tap);
        sql.push(" THEN DELETE ");
    }
    if !set.is_empty() {
        sql.push(&format!("WHEN MATCHED AND NOT b.{del} AND {newer} "));
        if prune.is_some() {
            sql.push("AND CASE WHEN ").append(&held_here).push(&format!(" THEN true ELSE {refuse} END "));
        }
        sql.push(&format!("THEN UPDATE SET {set} "));
    }
    let (tap, insert_token) = engine.tap_rows(&Sql::raw(format!("CASE WHEN NOT b.{del} THEN 0 END"))).ok_or_else(no_taps)?;
    sql.push("WHEN NOT MATCHED AND ");
    sql.append(&tap);
    sql.push(&format!(" THEN INSERT ({col_list}) VALUES ({values})"));
    let changed = engine.execute(&sql);
    let inserts = engine.tap_close(insert_token);
    let deletes = delete_token.map(|t| engine.tap_close(t));
    let changed = changed?;
    let (inserts, _, _) = inserts.ok_or_else(|| tap_lost("the inserts"))?;
    let deletes = match deletes {
        Some(d) => d.ok_or_else(|| tap_lost("the deletes"))?.0,
        None => 0,
    };
    trace.step("merge");
    opts.step(FailPoint::AfterDelete)?;
    opts.step(FailPoint::MidInsert)?;
    if changed > batch_rows {
        return Err(duplicate_keys_error(engine, job, spec)?);
    }
    let updates = changed.checked_sub(inserts + deletes).ok_or_else(|| {
        Error::Internal(format!("the merge changed {changed} rows but its taps counted {inserts} inserts and {deletes} deletes; rolled back"))
    })?;

    // 6. Remember this batch's tombstones.
    remember_tombstones(engine, spec, &tomb)?;
    opts.step(FailPoint::AfterInsert)?;

    // 7. The output: the batch's keys as the target now holds them. When
    //    every key of the batch was inserted, updated or deleted, that is
    //    the batch's upserts as the target's columns hold them; otherwise
    //    the keys left alone are read, and those that differ from the
    //    batch at the same version refused (`on_tie = "error"`).
    let fp = fingerprint_select(engine, Method::Native, "t", &output_cols)?;
    let left_alone = (batch_rows - beaten).checked_sub(changed).ok_or_else(|| Error::Internal("the merge changed more rows than the batch holds".into()))?;
    let output = if let (0, 0, Some((rows, _, sum))) = (left_alone, beaten, kept_upserts) {
        let fp = fp.of(rows, sum);
        if fp.rows != inserts + updates {
            return Err(Error::Internal(format!("{} upserts in the batch, but the merge wrote {inserts} and updated {updates}; rolled back", fp.rows)));
        }
        fp
    } else {
        let ties = if spec.on_tie == OnTie::Error {
            format!(", count(*) FILTER (WHERE NOT b.{del} AND b.{version} = t.{version} AND ({})) AS \"ties\"", rows_differ("b", "t", compared))
        } else {
            ", 0 AS \"ties\"".to_owned()
        };
        // The batch holds one row per key, so a join is a semi-join. A key
        // left alone in a partition the batch does not touch is refused by
        // the other plan.
        let mut sql = Sql::new();
        sql.push(&format!("SELECT {}{ties}, ", fp.select));
        if prune.is_some() {
            sql.push("count(*) FILTER (WHERE NOT coalesce(").append(&held_here).push(", false))");
        } else {
            sql.push("0");
        }
        sql.push(&format!(" AS \"elsewhere\" FROM {} AS t JOIN {BATCH} AS b ON {}", job.target.quoted(), keys_match("t", "b", &spec.key)));
        let rows = engine.query(&sql)?;
        let row = rows.single("the output scan")?;
        if row.count("ties")? > 0 || row.count("elsewhere")? > 0 {
            return Ok(None);
        }
        fp.read(&row, engine)?
    };
    trace.step("output fp");

    // 8. Audits, the report, the ledger row.
    let outcome = Outcome { key, input, output, inserts, updates, deletes, batch_rows, duplicates_collapsed, rows_before, method: "merge, checks in the statement" };
    let report = publish(engine, plan, outcome, trace)?;
    engine.execute(&Sql::raw(format!("DROP TABLE IF EXISTS {BATCH}")))?;
    trace.step("ledger, cleanup");
    Ok(Some(report))
}

/// The message of a refusal raised inside the one-statement MERGE for a
/// batch the plan that explains it must take (a NULL key or version, a
/// tie with the target).
const EXPLAIN_IN_MERGE: &str = "fixpoint: the batch needs the plan that names its rows";

/// Whether the merge can be one statement ([`merge_one_statement`]): no
/// tombstones to honour or remember, no audits (both read the batch), and
/// the target's columns, metadata aside, all come from the source (the
/// output fingerprint is then the batch's rows as written).
fn fits_one_statement(engine: &mut dyn Accelerator, plan: &Plan<'_>, target_cols: Option<&[Column]>) -> Result<bool> {
    let Plan { job, spec, names, .. } = *plan;
    if spec.deleted.is_some() || !job.audits.is_empty() || !engine.merge_in_one_statement() {
        return Ok(false);
    }
    let output_from_source = target_cols.is_none_or(|t| t.iter().filter(|c| !job.metadata.contains(&c.name)).all(|c| names.contains(&c.name)));
    Ok(output_from_source && engine.table_columns(&tombstone_table(&job.target))?.is_none())
}

/// The merge as one statement, for an upsert-only batch on an engine whose
/// MERGE refuses rows and holds taps (DuckDB), when [`fits_one_statement`]:
/// the hand-written SQL's own `MERGE` over its `row_number()` dedup, and
/// nothing else but the ledger row. Every check rides on it:
///
/// - the dedup tap in the projection the window orders by (evaluated once
///   per source row) sums the input fingerprint and looks for ties in the
///   batch;
/// - a tap in the filter that keeps one row a key counts the kept rows
///   and sums their hashes as the target's columns will hold them (the
///   input hash itself where the casts keep it), and refuses a NULL key
///   or version;
/// - the clauses are the hand-written ones (a guarded UPDATE, an INSERT);
///   the UPDATE's condition is a tap counting its rows. The MERGE's own
///   count less the updates is the inserts; the kept rows less both, the
///   rows left alone. With none left alone the output fingerprint is the
///   kept rows'; otherwise one read of the batch's keys after the
///   statement takes it, finds rows tied with the target (`on_tie =
///   "error"`; `"deterministic"`: those that should have won, which the
///   UPDATE's strictly-newer condition left alone) and keys the target
///   holds in another partition;
/// - what this plan does not decide raises an error inside the statement
///   or sends the run to the next plan: a NULL key or version, a key the
///   target holds in another partition than the batch's (pruned merges;
///   moved within the touched partitions, it is the two-statement plan's
///   to allow, otherwise to refuse).
///
/// `Ok(None)`, and a refusal raised inside the MERGE, mean "roll back and
/// run another plan".
fn merge_one_statement(engine: &mut dyn Accelerator, plan: &Plan<'_>, trace: &mut crate::run::protocol::Trace) -> Result<Option<RunReport>> {
    let Plan { job, spec, run_date, opts, run_input, params, source_cols, added, created_target, prune, names, compared, meta_cols, input_cols, started_at: _ } = *plan;
    let is_meta = |c: &String| job.metadata.contains(c);
    let target_cols = prepare(engine, job, opts, source_cols, added, created_target)?;
    trace.step("prepare");
    let output_cols: Vec<Column> = target_cols.iter().filter(|c| !is_meta(&c.name)).cloned().collect();
    if output_cols.is_empty() || !output_cols.iter().all(|c| names.contains(&c.name)) {
        return Ok(None);
    }
    let version = quote_ident(&spec.version);
    let no_hash = || Error::Internal("the engine has no native row hash".into());
    let no_taps = || Error::Internal("the engine has no taps".into());

    // The batch: the dedup window over the source, the input fingerprint
    // and the in-batch ties tapped in the projection it orders by.
    let (input_hash, kind, signature) = crate::fingerprint::compute::row_hash(engine, Method::Native, "x", input_cols)?;
    let described = |c: &String| source_cols.iter().find(|s| &s.name == c).expect("described").clone();
    let pair_cols: Vec<Column> = spec.key.iter().chain([&spec.version]).map(described).collect();
    let pair_hash = engine.dialect().native_row_hash("x", &pair_cols).ok_or_else(no_hash)?;
    // Rows of one key and version differ where their input hashes do (it
    // covers every column but the metadata): one hash a row serves both.
    let (seen, seen_token) = engine.tap_dedup(&input_hash, &pair_hash, &input_hash).ok_or_else(no_taps)?;
    let key_list = spec.key.iter().map(|k| quote_ident(k)).collect::<Vec<_>>().join(", ");
    let order = std::iter::once(format!("{version} DESC NULLS FIRST"))
        .chain(meta_cols.iter().map(|c| format!("{} ASC NULLS FIRST", quote_ident(c))))
        .chain(["\"__fixpoint_seen\"".to_owned()])
        .collect::<Vec<_>>()
        .join(", ");
    // The hash of each row as written. When the target's columns are the
    // source's, in order, and each cast to the target's type keeps the
    // value the engine hashes (the same type; on DuckDB also a DECIMAL of
    // another precision in the same storage), it is the row's input hash,
    // computed anyway for the input fingerprint and carried through the
    // window. Otherwise the batch's values are cast to the target's types
    // and hashed again, once a kept row, under the MERGE (named in its
    // conditions, it costs ~3 times as much).
    let hashed_as_read = output_cols.len() == input_cols.len()
        && output_cols.iter().zip(input_cols).all(|(o, i)| o.name == i.name && engine.dialect().same_native_hash(&i.ty, &o.ty));
    let cast_name = |i: usize| format!("__fixpoint_o{i}");
    let renamed: Vec<Column> = output_cols.iter().enumerate().map(|(i, c)| Column { name: cast_name(i), ty: c.ty.clone() }).collect();
    let kept_hash = engine.dialect().native_row_hash("c", &renamed).ok_or_else(no_hash)?;
    let fp = fingerprint_select(engine, Method::Native, "t", &output_cols)?;

    let refuse = |message: &str| format!("error('{message}')");
    let held = match prune {
        Some(p) => format!("{} = {}", q("t", p), q("b", p)),
        None => "true".to_owned(),
    };
    // Strictly newer, whatever `on_tie`: a batch row at the target's
    // version is left alone here, and the read after the statement sends
    // the run to the next plan when it should have won (`"deterministic"`:
    // naming the compared columns here made the scan read them for every
    // row it keeps, ~45 % of the statement on the benchmark's table).
    let newer = format!("(b.{version} > t.{version})");

    let mut sql = Sql::new();
    sql.push(&format!("MERGE INTO {} AS t USING (SELECT * FROM (", job.target.quoted()));
    if !hashed_as_read {
        sql.push(&format!("SELECT c.*, {kept_hash} AS \"__fixpoint_h\" FROM (SELECT r.*"));
        for (i, c) in output_cols.iter().enumerate() {
            sql.push(&format!(", CAST({} AS {}) AS {}", q("r", &c.name), c.ty, quote_ident(&cast_name(i))));
        }
        sql.push(" FROM ");
    } else {
        sql.push("SELECT * FROM ");
    }
    sql.push(&format!("(SELECT *, row_number() OVER (PARTITION BY {key_list} ORDER BY {order}) AS \"__fixpoint_rank\" FROM (SELECT x.*, "));
    sql.append(&seen);
    sql.push(" AS \"__fixpoint_seen\"");
    if hashed_as_read {
        // The same expression as the tap's: computed once.
        sql.push(&format!(", {input_hash} AS \"__fixpoint_h\""));
    }
    sql.push(" FROM ");
    Scope::Source { template: job.source.template(), params }.write_from(&mut sql, "x");
    sql.push(") AS x) AS r WHERE \"__fixpoint_rank\" = 1");
    if !hashed_as_read {
        sql.push(") AS c");
    }
    // The kept rows, one a key: a tap in the filter over them counts them
    // and sums their hashes as written (every kept row is written unless
    // left alone), and refuses a NULL key or version (the plan that names
    // the rows explains it). Its argument is NULL for the other ranks, so
    // the filter keeps exactly the kept rows whatever the order in which
    // the engine evaluates it and the rank's own.
    let null_key = spec.key.iter().chain([&spec.version]).map(|k| format!("{} IS NULL", q("k", k))).collect::<Vec<_>>().join(" OR ");
    let (kept_tap, kept_token) = engine
        .tap_rows(&Sql::raw(format!(
            "CASE WHEN k.\"__fixpoint_rank\" = 1 THEN CASE WHEN {null_key} THEN {} ELSE k.\"__fixpoint_h\" END END",
            refuse(EXPLAIN_IN_MERGE)
        )))
        .ok_or_else(no_taps)?;
    // Its first row comes once the window has every source row: the ties
    // are counted from then on, on another thread, while the join runs
    // (~3.5 ms a 198k-row batch, waited for after the statement before).
    engine.tap_ties_after(kept_token, seen_token);
    sql.push(") AS k WHERE ").append(&kept_tap);
    sql.push(&format!(") AS b ON ({}) ", keys_match("t", "b", &spec.key)));
    // The clauses are the hand-written SQL's: a guarded UPDATE, an
    // INSERT. (They read of the target's columns only the version and the
    // partition: any other column they name is read for every row the
    // scan keeps, ~30 % of the statement here; a clause of its own for the
    // rows left alone, or a condition on the INSERT, cost ~5 ms each
    // even with no row to take. The rows left alone are read after, when
    // there are any.) The UPDATE's condition counts its rows and refuses
    // a key the target holds in another partition than the batch's.
    // Pruned, the UPDATE's condition refuses a row whose partition differs
    // from the batch's, so it leaves the partition as it is (one column
    // fewer to rewrite: ~1.5 ms of the MERGE here, and its share of the
    // commit).
    let (set, col_list, values) = merge_actions(spec, names, prune);
    let mut update_token = None;
    if !set.is_empty() {
        // A counting condition where the engine has one (two comparisons:
        // nested CASEs cost twice as much, ~4.5 ms of a 120 ms MERGE here).
        let (tap, token) = match engine.tap_if(&newer, &held) {
            Some(tap) => tap,
            None => engine
                .tap_rows(&Sql::raw(format!("CASE WHEN {newer} THEN CASE WHEN {held} THEN 0 ELSE {} END END", refuse(REFUSED_IN_MERGE))))
                .ok_or_else(no_taps)?,
        };
        update_token = Some(token);
        sql.push("WHEN MATCHED AND ").append(&tap).push(&format!(" THEN UPDATE SET {set} "));
    }
    sql.push(&format!("WHEN NOT MATCHED THEN INSERT ({col_list}) VALUES ({values})"));

    opts.step(FailPoint::AfterGuards)?;
    let changed = engine.execute(&sql);
    trace.step("merge statement");
    // The ties in the batch are counted on other threads during the join
    // and while the ledger row is written; a tie then rolls it back with
    // the rest.
    let seen = engine.tap_close_dedup_deferred(seen_token);
    let kept = engine.tap_close(kept_token);
    let updates = update_token.map(|t| engine.tap_close(t));
    let changed = changed?;
    let (input_rows, input_sum, ties) = seen.ok_or_else(|| tap_lost("the source's rows"))?;
    let (batch_rows, _, kept_sum) = kept.ok_or_else(|| tap_lost("the kept rows"))?;
    let updates = match updates {
        Some(u) => u.ok_or_else(|| tap_lost("the updates"))?.0,
        None => 0,
    };
    trace.step("taps closed");
    opts.step(FailPoint::AfterDelete)?;
    opts.step(FailPoint::MidInsert)?;
    if changed > batch_rows {
        return Err(duplicate_keys_error(engine, job, spec)?);
    }
    if updates > changed {
        return Err(Error::Internal(format!("the merge changed {changed} rows of a {batch_rows}-key batch but its tap counted {updates} updates; rolled back")));
    }
    let (inserts, alone) = (changed - updates, batch_rows - changed);
    let duplicates_collapsed = input_rows.checked_sub(batch_rows).ok_or_else(|| Error::Internal(format!("the batch has {batch_rows} keys but the tap saw {input_rows} rows")))?;
    let input = Fingerprint::from_sum(&kind, &signature, input_rows, input_sum);
    let job_hash = job.definition_hash();
    let key = run_input.file_key(&job_hash, run_date).unwrap_or_else(|| run_key(&job_hash, run_date, &input));
    opts.step(FailPoint::AfterInsert)?;
    let output = if alone == 0 {
        fp.of(batch_rows, kept_sum)
    } else {
        // Keys left alone: the batch's keys as the target now holds them,
        // read through the same dedup (untapped); at the same version, the
        // batch rows that differ from the target's (`on_tie = "error"`: the
        // plans that name them refuse them) or that the total order puts
        // first (`"deterministic"`: the next plan writes them), and the
        // keys the target holds in another partition than the batch's (the
        // plan with two statements allows a move within the touched
        // partitions, or refuses it).
        let to_resolve = match spec.on_tie {
            OnTie::Error => rows_differ("b", "t", compared),
            OnTie::Deterministic => sorts_before("b", "t", compared),
        };
        let ties = format!("count(*) FILTER (WHERE b.{version} = t.{version} AND ({to_resolve})) AS \"ties\"");
        let elsewhere = format!("count(*) FILTER (WHERE NOT coalesce({held}, false)) AS \"elsewhere\"");
        let order = std::iter::once(format!("{version} DESC NULLS FIRST")).chain(meta_cols.iter().map(|c| format!("{} ASC NULLS FIRST", quote_ident(c)))).collect::<Vec<_>>().join(", ");
        let mut sql = Sql::new();
        sql.push(&format!(
            "SELECT {}, {ties}, {elsewhere} FROM {} AS t JOIN (SELECT * FROM (SELECT *, row_number() OVER (PARTITION BY {key_list} ORDER BY {order}) AS \"__fixpoint_rank\" FROM ",
            fp.select,
            job.target.quoted()
        ));
        Scope::Source { template: job.source.template(), params }.write_from(&mut sql, "x");
        sql.push(&format!(") AS r WHERE \"__fixpoint_rank\" = 1) AS b ON {}", keys_match("t", "b", &spec.key)));
        let rows = engine.query(&sql)?;
        let row = rows.single("the output scan")?;
        if row.count("ties")? > 0 || row.count("elsewhere")? > 0 {
            return Ok(None);
        }
        let fp = fp.read(&row, engine)?;
        if fp.rows != batch_rows {
            return Err(Error::Internal(format!("the batch has {batch_rows} keys, but the target holds {} rows of them after the merge; rolled back", fp.rows)));
        }
        fp
    };
    trace.step("output fp");

    let outcome = Outcome { key, input, output, inserts, updates, deletes: 0, batch_rows, duplicates_collapsed, rows_before: None, method: "merge, one statement" };
    // The ties are known after the ledger row: this plan runs no audits
    // (`fits_one_statement`), which would read a kept row picked among
    // tied ones by arrival order.
    let report = publish(engine, plan, outcome, trace)?;
    trace.step("ledger");
    if ties() > 0 {
        return Ok(None);
    }
    trace.step("ties counted");
    Ok(Some(report))
}

pub(super) fn merge_with(job: &Job, run_date: RunDate, engine: &mut dyn Engine, opts: &RunOptions, input: &crate::run::input::RunInput, started: Instant) -> Result<RunReport> {
    let run_input = input;
    let started_at = chrono::Utc::now().naive_utc();
    let mut trace = crate::run::protocol::Trace::new();
    let spec: &MergeSpec = job.merge.as_ref().ok_or_else(|| Error::Internal("merge without merge keys".into()))?;
    let params = run_input.params.clone();
    let source_cols = crate::run::input::describe_source(job, engine, &params)?;
    let has = |cols: &[Column], name: &str| cols.iter().any(|c| c.name == name);
    check_source(job, spec, &source_cols)?;
    let target_cols = engine.table_columns(&job.target)?;
    let added = crate::run::schema::reconcile(engine, job, &source_cols, target_cols.as_deref())?;
    trace.step("describe");
    let prune = job.partition.as_deref().filter(|p| has(&source_cols, p) && target_cols.as_ref().is_none_or(|t| has(t, p)));
    let names: Vec<String> = source_cols.iter().map(|c| c.name.clone()).collect();
    let is_meta = |c: &String| job.metadata.contains(c);
    let compared: Vec<String> =
        names.iter().filter(|c| !spec.key.contains(c) && **c != spec.version && !is_meta(c)).cloned().collect();
    let meta_cols: Vec<String> = names.iter().filter(|c| is_meta(c)).cloned().collect();
    let input_cols: Vec<Column> = source_cols.iter().filter(|c| !is_meta(&c.name)).cloned().collect();
    let version = quote_ident(&spec.version);
    let source_list = names.iter().map(|c| quote_ident(c)).collect::<Vec<_>>().join(", ");

    let plan = Plan {
        job,
        spec,
        run_date,
        opts,
        run_input,
        params: &params,
        source_cols: &source_cols,
        added: &added,
        created_target: target_cols.is_none(),
        prune,
        names: &names,
        compared: &compared,
        meta_cols: &meta_cols,
        input_cols: &input_cols,
        started_at,
    };
    if let Some(acc) = engine.accelerator().filter(|a| a.merge_refuses_in_statement()) {
        // The plans that ride on the hand-written SQL's statements, the
        // cheapest first; each attempt that finds something it does not
        // decide rolls back and leaves it to the next.
        type Attempt = fn(&mut dyn Accelerator, &Plan<'_>, &mut crate::run::protocol::Trace) -> Result<Option<RunReport>>;
        let mut attempts: Vec<(Attempt, &str)> = Vec::new();
        if fits_one_statement(acc, &plan, target_cols.as_deref())? {
            attempts.push((merge_one_statement, "rolled back, two statements"));
        }
        attempts.push((merge_in_statement, "rolled back, explain"));
        for (attempt, next) in attempts {
            acc.begin()?;
            match attempt(acc, &plan, &mut trace) {
                Ok(Some(mut report)) => {
                    acc.commit()?;
                    trace.step("commit");
                    report.elapsed_ms = crate::run::protocol::elapsed_ms(started);
                    return Ok(report);
                }
                // A refusal, a tie to resolve or a NULL to report: rolled
                // back, and the run made again by the next plan (the last,
                // below, explains it).
                Ok(None) => acc.rollback()?,
                Err(Error::Database { message, .. }) if message.contains(REFUSED_IN_MERGE) => acc.rollback()?,
                Err(Error::Database { message, .. }) if message.contains(EXPLAIN_IN_MERGE) => {
                    acc.rollback()?;
                    trace.step("rolled back, explain");
                    break;
                }
                Err(e) => {
                    let _ = acc.rollback();
                    return Err(e);
                }
            }
            trace.step(next);
        }
    }

    in_transaction(engine, |engine| {
        let created_target = target_cols.is_none();
        let target_cols = prepare(engine, job, opts, &source_cols, &added, created_target)?;
        let output_cols: Vec<Column> = target_cols.iter().filter(|c| !is_meta(&c.name)).cloned().collect();

        // 1. Stage the source once, with its tombstone flag.
        engine.execute(&Sql::raw(format!("DROP TABLE IF EXISTS {STAGE}")))?;
        engine.execute(&Sql::raw(format!("DROP TABLE IF EXISTS {BATCH}")))?;
        let sql = flagged_source(job, spec, &params);
        engine.create_temp_table_as(STAGE, &sql).map_err(|e| deleted_error(job, spec, &source_cols, e))?;

        trace.step("stage");
        // 2. NULL keys and versions are refused; the input fingerprint is
        //    taken in the same scan.
        let input = scan_stage(engine, spec, STAGE, &source_list, &input_cols)?;
        let input_rows = input.rows;
        let job_hash = job.definition_hash();
        let key = run_input.file_key(&job_hash, run_date).unwrap_or_else(|| run_key(&job_hash, run_date, &input));

        trace.step("null check, input fp");
        // 3. One row per key: newest version, tombstone first at equal
        //    version, then the values' total order.
        engine.create_temp_table_as(BATCH, &Sql::raw(dedup_sql(spec, &names, &compared, &meta_cols, STAGE)))?;
        let batch_rows = count(engine, &Sql::raw(format!("SELECT count(*) AS \"n\" FROM {BATCH}")))?;
        let duplicates_collapsed = input_rows - batch_rows;
        trace.step("dedup");

        // 4. Ties inside the batch: another row of a key at its newest
        //    version that differs from the kept one.
        let tie_cond = batch_tie_cond(spec, &compared);
        if spec.on_tie == OnTie::Error {
            let ties = count(engine, &Sql::raw(format!("SELECT count(DISTINCT ({key_list_b})) AS \"n\" FROM {STAGE} AS s JOIN {BATCH} AS b ON {tie_cond}",
                key_list_b = spec.key.iter().map(|k| q("b", k)).chain(["true".to_owned()]).collect::<Vec<_>>().join(", "))))?;
            if ties > 0 {
                return Err(tie_error(engine, spec, &names, STAGE, BATCH, &tie_cond, ties)?);
            }
            trace.step("batch ties");
        }

        // 5. Tombstones: an older (or equal) version of a deleted key is
        //    already beaten; drop it from the batch.
        let (tomb, _) = drop_beaten(engine, job, spec, &source_cols)?;
        trace.step("tombstones");

        // 6. Pruning: the partitions the batch touches, bound as values so
        //    the engine can skip the others.
        let mut prune_sql = Sql::new();
        if let Some(p) = prune {
            let ty = &target_cols.iter().find(|c| c.name == p).expect("checked").ty;
            prune_sql = touched_partitions(engine, p, ty)?;
        }
        let in_scope = if prune.is_some() { format!("coalesce({}, false)", prune_sql.text) } else { "true".to_owned() };
        let on = {
            let mut on = Sql::raw(keys_match("t", "b", &spec.key));
            if prune.is_some() {
                on.push(" AND ");
                on.text.push_str(&prune_sql.text);
                on.params.extend(prune_sql.params.iter().cloned());
            }
            on
        };

        // 7. Classify every batch row against the target in one join over
        //    the keys (not pruned, so a key the target holds in a partition
        //    the batch does not touch is seen, and refused: a merge pruned to
        //    the batch's partitions would insert it twice). The same join
        //    counts cross-batch ties and, when the target's columns are the
        //    source's, fingerprints the batch's keys as they will be written.
        let newer = format!("(b.{version} > t.{version}{})", match spec.on_tie {
            OnTie::Deterministic => format!(" OR (b.{version} = t.{version} AND {})", sorts_before("b", "t", &compared)),
            OnTie::Error => String::new(),
        });
        let del = format!("b.{}", quote_ident(DELETED));
        let first_key = q("t", &spec.key[0]);
        let matched = format!("{first_key} IS NOT NULL");
        let is_update = format!("{matched} AND NOT {del} AND {newer}");
        let is_delete = format!("{matched} AND {del} AND b.{version} >= t.{version}");
        let is_insert = format!("{first_key} IS NULL AND NOT {del}");
        let by_construction = output_cols == input_cols;
        let out_fp = if by_construction {
            let hb = engine.dialect().native_row_hash("b", &output_cols).unwrap_or_else(|| "0".into());
            let ht = engine.dialect().native_row_hash("t", &output_cols).unwrap_or_else(|| "0".into());
            format!(
                ", count(*) FILTER (WHERE {is_insert} OR {is_update} OR ({matched} AND NOT ({is_delete}))) AS \"out_rows\", \
                 sum(CASE WHEN {is_insert} OR {is_update} THEN {hb} WHEN {matched} AND NOT ({is_delete}) THEN {ht} END) AS \"out_sum\""
            )
        } else {
            String::new()
        };
        let mut sql = Sql::new();
        sql.push(&format!(
            "SELECT count(*) FILTER (WHERE {is_insert}) AS \"inserts\", count(*) FILTER (WHERE {is_update}) AS \"updates\", \
             count(*) FILTER (WHERE {is_delete}) AS \"deletes\", \
             count(*) FILTER (WHERE {matched} AND NOT {del} AND b.{version} = t.{version} AND ({})) AS \"cross_ties\", \
             count(*) FILTER (WHERE {matched} AND NOT ({in_scope})) AS \"moved\", count(*) AS \"joined\"{out_fp} \
             FROM {BATCH} AS b LEFT JOIN {} AS t ON {}",
            rows_differ("b", "t", &compared),
            job.target.quoted(),
            keys_match("t", "b", &spec.key)
        ));
        sql.params.extend(prune_sql.params.iter().cloned());
        let classified = engine.query(&sql)?;
        let row = classified.single("the classification")?;
        let (inserts, updates, deletes) = (row.count("inserts")?, row.count("updates")?, row.count("deletes")?);
        let (cross_ties, moved) = (row.count("cross_ties")?, row.count("moved")?);
        trace.step("classify");
        if row.count("joined")? > batch_rows {
            // One batch key joined more than one target row.
            return Err(duplicate_keys_error(engine, job, spec)?);
        }
        if moved > 0 {
            let p = prune.expect("moved only counted when pruning");
            return Err(moved_error(engine, job, spec, p, BATCH, &in_scope, &prune_sql.params, moved)?);
        }
        if spec.on_tie == OnTie::Error && cross_ties > 0 {
            return Err(cross_tie_error(engine, job, spec, BATCH, &on, &compared, cross_ties)?);
        }
        opts.step(FailPoint::AfterGuards)?;

        let rows_before = rows_before(engine, job, spec)?;

        // 8. One MERGE, pruned.
        let (set, col_list, values) = merge_actions(spec, &names, None);
        let mut sql = Sql::new();
        sql.push(&format!("MERGE INTO {} AS t USING {BATCH} AS b ON (", job.target.quoted()));
        sql.text.push_str(&on.text);
        sql.params.extend(on.params.iter().cloned());
        sql.push(&format!(") WHEN MATCHED AND {del} AND b.{version} >= t.{version} THEN DELETE "));
        if !set.is_empty() {
            sql.push(&format!("WHEN MATCHED AND NOT {del} AND {newer} THEN UPDATE SET {set} "));
        }
        sql.push(&format!("WHEN NOT MATCHED AND NOT {del} THEN INSERT ({col_list}) VALUES ({values})"));
        let changed = if inserts + updates + deletes > 0 { engine.execute(&sql)? } else { 0 };
        trace.step("merge");
        opts.step(FailPoint::AfterDelete)?;
        opts.step(FailPoint::MidInsert)?;
        if changed != inserts + updates + deletes {
            return Err(Error::Internal(format!(
                "the merge changed {changed} rows but {inserts} inserts, {updates} updates and {deletes} deletes were planned; rolled back"
            )));
        }

        // 9. Remember this batch's tombstones.
        remember_tombstones(engine, spec, &tomb)?;
        opts.step(FailPoint::AfterInsert)?;

        // 10. The output: the batch's keys as the target now holds them.
        let output = if by_construction {
            let fp = fingerprint_select(engine, Method::Native, "t", &output_cols)?;
            fp.of(row.count("out_rows")?, engine.dialect().read_sum(row.value("out_sum")?)?)
        } else {
            let fp = fingerprint_select(engine, Method::Native, "t", &output_cols)?;
            let mut sql = Sql::new();
            // The batch holds one row per key, so a join is a semi-join.
            sql.push(&format!("SELECT {} FROM {} AS t JOIN {BATCH} AS b ON ", fp.select, job.target.quoted()));
            sql.text.push_str(&on.text);
            sql.params.extend(on.params.iter().cloned());
            fp.read(&engine.query(&sql)?.single("the output scan")?, engine)?
        };

        trace.step("output fp");
        // 11. Audits, the report, the ledger row.
        let outcome = Outcome { key, input, output, inserts, updates, deletes, batch_rows, duplicates_collapsed, rows_before, method: "merge" };
        let report = publish(engine, &plan, outcome, &mut trace)?;
        engine.execute(&Sql::raw(format!("DROP TABLE IF EXISTS {STAGE}")))?;
        engine.execute(&Sql::raw(format!("DROP TABLE IF EXISTS {BATCH}")))?;
        trace.step("ledger, cleanup");
        Ok(report)
    })
    .map(|mut r| {
        trace.step("commit");
        r.elapsed_ms = crate::run::protocol::elapsed_ms(started);
        r
    })
}

/// A tap the plan registered returned no counts: a bug, never a 0.
fn tap_lost(what: &str) -> Error {
    Error::Internal(format!("the tap counting {what} returned nothing; rolled back"))
}

