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

use crate::engine::measure::fingerprint_select;
use crate::engine::{Accelerated, Accelerator, Column, Engine, MergeRequest, Merged};
use crate::error::{Error, FailPoint, Result};
use crate::fingerprint::runkey::run_key;
use crate::fingerprint::{Fingerprint, Method};
use crate::job::date::RunDate;
use crate::job::ident::quote_ident;
use crate::job::spec::{Job, MergeSpec, OnTie};
use crate::job::sql::{RunParams, Sql};
use crate::plans::merge::refusals::{check_source, deleted_error, tie_error};
use crate::plans::merge::sql::{batch_tie_cond, count, dedup_sql, keys_match, merge_actions, q, DELETED};
use crate::plans::merge::steps::{
    drop_beaten, flagged_source, remember_tombstones, rows_before, scan_stage, touched_partitions, touched_rows, Classification, Classified, Conditions, BATCH,
};
use crate::run::input::{describe_source, RunInput};
use crate::run::ledger;
use crate::run::protocol::{elapsed_ms, fence, in_transaction, RunOptions, Steps, Trace};
use crate::run::report::{entry, RunReport};

const STAGE: &str = "\"__fixpoint_stage\"";

/// What every merge plan knows before it starts.
struct Plan<'a> {
    job: &'a Job,
    spec: &'a MergeSpec,
    run_date: RunDate,
    opts: &'a RunOptions,
    run_input: &'a RunInput,
    params: &'a RunParams,
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

impl Plan<'_> {
    /// What the accelerator is asked, the target prepared.
    fn request<'a>(&'a self, target_cols: &'a [Column]) -> MergeRequest<'a> {
        MergeRequest {
            job: self.job,
            spec: self.spec,
            params: self.params,
            source_cols: self.source_cols,
            target_cols,
            prune: self.prune,
            names: self.names,
            compared: self.compared,
            meta_cols: self.meta_cols,
            input_cols: self.input_cols,
        }
    }

    /// The target's columns the output fingerprint hashes (all but the
    /// metadata).
    fn output_cols(&self, target_cols: &[Column]) -> Vec<Column> {
        target_cols.iter().filter(|c| !self.job.metadata.contains(&c.name)).cloned().collect()
    }
}

pub(super) fn merge_with(job: &Job, run_date: RunDate, engine: &mut dyn Engine, opts: &RunOptions, run_input: &RunInput, started: Instant) -> Result<RunReport> {
    let started_at = chrono::Utc::now().naive_utc();
    let mut trace = Trace::new();
    let spec: &MergeSpec = job.merge.as_ref().ok_or_else(|| Error::Internal("merge without merge keys".into()))?;
    let params = run_input.params.clone();
    let source_cols = describe_source(job, engine, &params)?;
    check_source(job, spec, &source_cols)?;
    let target_cols = engine.table_columns(&job.target)?;
    let added = crate::run::schema::reconcile(engine, job, &source_cols, target_cols.as_deref())?;
    trace.step("describe");
    let has = |cols: &[Column], name: &str| cols.iter().any(|c| c.name == name);
    let prune = job.partition.as_deref().filter(|p| has(&source_cols, p) && target_cols.as_ref().is_none_or(|t| has(t, p)));
    let names: Vec<String> = source_cols.iter().map(|c| c.name.clone()).collect();
    let is_meta = |c: &String| job.metadata.contains(c);
    let compared: Vec<String> = names.iter().filter(|c| !spec.key.contains(c) && **c != spec.version && !is_meta(c)).cloned().collect();
    let meta_cols: Vec<String> = names.iter().filter(|c| is_meta(c)).cloned().collect();
    let input_cols: Vec<Column> = source_cols.iter().filter(|c| !is_meta(&c.name)).cloned().collect();
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
    let report = match accelerated(engine, &plan, &mut trace)? {
        Some(report) => report,
        None => {
            let report = in_transaction(engine, |engine| portable(engine, &plan, &mut trace))?;
            trace.step("commit");
            report
        }
    };
    Ok(RunReport { elapsed_ms: elapsed_ms(started), ..report })
}

/// Takes the run's lock, makes sure of the ledger, adds the source's new
/// columns and creates the target when missing; returns its columns.
fn prepare(engine: &mut dyn Engine, plan: &Plan<'_>) -> Result<Vec<Column>> {
    let job = plan.job;
    // Keys may move across partitions: a merge fences the whole table.
    fence(engine, job, "all", plan.opts)?;
    ledger::ensure(engine)?;
    crate::run::schema::append(engine, &job.target, plan.added)?;
    if plan.created_target {
        engine.execute(&Sql::raw(format!("CREATE SCHEMA IF NOT EXISTS {}", quote_ident(&job.target.schema))))?;
        let cols: Vec<String> = plan.source_cols.iter().map(|c| format!("{} {}", quote_ident(&c.name), c.ty)).collect();
        engine.execute(&Sql::raw(format!("CREATE TABLE {} ({})", job.target.quoted(), cols.join(", "))))?;
    }
    Ok(engine.table_columns(&job.target)?.unwrap_or_default())
}

/// The merge by the engine's accelerator, in a transaction of its own:
/// `None` when there is none or it declined (rolled back; the reason
/// traced), and the portable plan runs.
fn accelerated(engine: &mut dyn Engine, plan: &Plan<'_>, trace: &mut Trace) -> Result<Option<RunReport>> {
    let Some(acc) = engine.accelerator() else { return Ok(None) };
    acc.begin()?;
    match accelerated_run(acc, plan, trace) {
        Ok(Accelerated::Done(report)) => {
            acc.commit()?;
            trace.step("commit");
            Ok(Some(report))
        }
        Ok(Accelerated::Declined(why)) => {
            trace.step(&format!("declined: {why}"));
            acc.rollback()?;
            trace.step("rolled back");
            Ok(None)
        }
        Err(e) => {
            let _ = acc.rollback();
            Err(e)
        }
    }
}

/// Prepares the target, asks the accelerator, publishes what it did and
/// gives it the last word before COMMIT.
fn accelerated_run(acc: &mut dyn Accelerator, plan: &Plan<'_>, trace: &mut Trace) -> Result<Accelerated<RunReport>> {
    let target_cols = prepare(acc, plan)?;
    trace.step("prepare");
    let merged = match acc.merge(&plan.request(&target_cols), &mut Steps { opts: plan.opts, trace })? {
        Accelerated::Done(merged) => merged,
        Accelerated::Declined(why) => return Ok(Accelerated::Declined(why)),
    };
    let report = publish(acc, plan, merged, trace)?;
    let confirmed = acc.confirm()?;
    trace.step("confirmed");
    Ok(match confirmed {
        Accelerated::Done(()) => Accelerated::Done(report),
        Accelerated::Declined(why) => Accelerated::Declined(why),
    })
}

/// Audits the touched keys as they will be published, writes the report
/// and the ledger row, and stops at the last fail point before COMMIT.
fn publish(engine: &mut dyn Engine, plan: &Plan<'_>, m: Merged, trace: &mut Trace) -> Result<RunReport> {
    let job = plan.job;
    let audits = if job.audits.is_empty() {
        Vec::new()
    } else {
        let touched = |sql: &mut Sql| touched_rows(job, plan.spec, sql);
        let scope = crate::run::audit::AuditScope { from: &touched, previous_rows: m.rows_before, run_date: plan.run_date.date() };
        let results = crate::run::audit::audit(job, engine, &scope)?;
        trace.step("audits");
        results
    };
    let job_hash = job.definition_hash();
    let key = plan.run_input.file_key(&job_hash, plan.run_date).unwrap_or_else(|| run_key(&job_hash, plan.run_date, &m.input));
    plan.opts.run_key_known(job, plan.run_date, &key);
    let mut report = RunReport::new(job, plan.run_date, key, "committed", &m.input, &m.output);
    report.audits = audits;
    report.input_files = plan.run_input.files.clone();
    report.rows_deleted = m.deletes;
    report.rows_inserted = m.inserts;
    report.rows_updated = m.updates;
    report.rows_unchanged = m.batch_rows - m.inserts - m.updates - m.deletes;
    report.duplicates_collapsed = m.duplicates_collapsed;
    report.created_target = plan.created_target;
    report.method = m.method.into();
    ledger::record(engine, &entry(job, &job_hash, &report, plan.started_at))?;
    trace.step("ledger");
    plan.opts.step(FailPoint::BeforeCommit)?;
    Ok(report)
}

/// The portable plan, in the run's transaction: every check a join or a
/// scan of its own, each refusal explained with the rows involved.
fn portable(engine: &mut dyn Engine, plan: &Plan<'_>, trace: &mut Trace) -> Result<RunReport> {
    let target_cols = prepare(engine, plan)?;
    let output_cols = plan.output_cols(&target_cols);
    let input = stage(engine, plan, trace)?;
    let batch_rows = dedup(engine, plan, trace)?;
    if let Some(hint) = engine.dialect().plan_key_lookups() {
        engine.query(&Sql::raw(hint.to_owned()))?;
    }
    let (tomb, _) = drop_beaten(engine, plan.job, plan.spec, plan.source_cols)?;
    trace.step("tombstones");
    let scope = Pruned::of(engine, plan, &target_cols)?;
    let (class, by_construction) = classify(engine, plan, &scope, &output_cols)?;
    trace.step("classify");
    plan.opts.step(FailPoint::AfterGuards)?;
    let rows_before = rows_before(engine, plan.job, plan.spec)?;
    write(engine, plan, &scope, &class)?;
    trace.step("merge");
    remember_tombstones(engine, plan.spec, &tomb)?;
    plan.opts.step(FailPoint::AfterInsert)?;
    let output = output(engine, plan, &scope, &output_cols, by_construction)?;
    trace.step("output fp");
    let Classified { inserts, updates, deletes, .. } = class;
    let duplicates_collapsed = input.rows - batch_rows;
    let merged = Merged { input, output, inserts, updates, deletes, batch_rows, duplicates_collapsed, rows_before, method: "merge" };
    let report = publish(engine, plan, merged, trace)?;
    engine.execute(&Sql::raw(format!("DROP TABLE IF EXISTS {STAGE}")))?;
    engine.execute(&Sql::raw(format!("DROP TABLE IF EXISTS {BATCH}")))?;
    trace.step("cleanup");
    Ok(report)
}

/// 1. The source staged once, with its tombstone flag; NULL keys and
///    versions refused, the input fingerprint taken in the same scan.
fn stage(engine: &mut dyn Engine, plan: &Plan<'_>, trace: &mut Trace) -> Result<Fingerprint> {
    let (job, spec) = (plan.job, plan.spec);
    engine.execute(&Sql::raw(format!("DROP TABLE IF EXISTS {STAGE}")))?;
    engine.execute(&Sql::raw(format!("DROP TABLE IF EXISTS {BATCH}")))?;
    let sql = flagged_source(job, spec, plan.params);
    engine.create_temp_table_as(STAGE, &sql).map_err(|e| deleted_error(job, spec, plan.source_cols, e))?;
    trace.step("stage");
    let source_list = plan.names.iter().map(|c| quote_ident(c)).collect::<Vec<_>>().join(", ");
    let input = scan_stage(engine, spec, STAGE, &source_list, plan.input_cols)?;
    trace.step("null check, input fp");
    Ok(input)
}

/// 2. One row per key (newest version, tombstone first at equal version,
///    then the values' total order); with `on_tie = "error"`, a tie in
///    the batch (another row of a key at its newest version that differs
///    from the kept one) refused. Returns the batch's rows.
fn dedup(engine: &mut dyn Engine, plan: &Plan<'_>, trace: &mut Trace) -> Result<u64> {
    let spec = plan.spec;
    engine.create_temp_table_as(BATCH, &Sql::raw(dedup_sql(spec, plan.names, plan.compared, plan.meta_cols, STAGE)))?;
    let batch_rows = count(engine, &Sql::raw(format!("SELECT count(*) AS \"n\" FROM {BATCH}")))?;
    trace.step("dedup");
    if spec.on_tie == OnTie::Error {
        let tie_cond = batch_tie_cond(spec, plan.compared);
        let keys = spec.key.iter().map(|k| q("b", k)).chain(["true".to_owned()]).collect::<Vec<_>>().join(", ");
        let ties = count(engine, &Sql::raw(format!("SELECT count(DISTINCT ({keys})) AS \"n\" FROM {STAGE} AS s JOIN {BATCH} AS b ON {tie_cond}")))?;
        if ties > 0 {
            return Err(tie_error(engine, spec, plan.names, STAGE, BATCH, &tie_cond, ties)?);
        }
        trace.step("batch ties");
    }
    Ok(batch_rows)
}

/// 3. Pruning: the partitions the batch touches, bound as values so the
///    engine can skip the others.
struct Pruned {
    /// `t.<p> IN (…)`, empty unpruned.
    touched: Sql,
    /// The target row is in a touched partition (`true` unpruned).
    in_scope: String,
    /// The MERGE's join: the keys, and the touched partitions.
    on: Sql,
}

impl Pruned {
    fn of(engine: &mut dyn Engine, plan: &Plan<'_>, target_cols: &[Column]) -> Result<Pruned> {
        let mut touched = Sql::new();
        if let Some(p) = plan.prune {
            let ty = &target_cols.iter().find(|c| c.name == p).expect("checked").ty;
            touched = touched_partitions(engine, p, ty)?;
        }
        let in_scope = if plan.prune.is_some() { format!("coalesce({}, false)", touched.text) } else { "true".to_owned() };
        let mut on = Sql::raw(keys_match("t", "b", &plan.spec.key));
        if plan.prune.is_some() {
            on.push(" AND ").append(&touched);
        }
        Ok(Pruned { touched, in_scope, on })
    }
}

/// 4. The classification (shared with the leased plan): every batch row
///    against the target, refusals with the rows involved; the same join
///    fingerprints the batch's keys as they will be written when the
///    target's columns are the source's.
fn classify(engine: &mut dyn Engine, plan: &Plan<'_>, scope: &Pruned, output_cols: &[Column]) -> Result<(Classified, Option<(u64, i128)>)> {
    let c = Conditions::of(plan.spec, plan.compared);
    let by_construction = output_cols == plan.input_cols;
    let extra = if by_construction {
        let hb = engine.dialect().native_row_hash("b", output_cols).unwrap_or_else(|| "0".into());
        let ht = engine.dialect().native_row_hash("t", output_cols).unwrap_or_else(|| "0".into());
        let (ins, upd, del, matched) = (&c.is_insert, &c.is_update, &c.is_delete, &c.matched);
        format!(
            ", count(*) FILTER (WHERE {ins} OR {upd} OR ({matched} AND NOT ({del}))) AS \"out_rows\", \
             sum(CASE WHEN {ins} OR {upd} THEN {hb} WHEN {matched} AND NOT ({del}) THEN {ht} END) AS \"out_sum\""
        )
    } else {
        String::new()
    };
    let target = plan.job.target.quoted();
    let classification = Classification {
        job: plan.job,
        spec: plan.spec,
        compared: plan.compared,
        prune: plan.prune,
        batch: BATCH,
        target: &target,
        in_scope: &scope.in_scope,
        params: &scope.touched.params,
    };
    let mut output = None;
    let classified = classification.run(engine, &extra, |engine, row| {
        if by_construction {
            output = Some((row.count("out_rows")?, engine.dialect().read_sum(row.value("out_sum")?)?));
        }
        Ok(())
    })?;
    Ok((classified, output))
}

/// 5. One MERGE, pruned; it must change what the classification planned.
fn write(engine: &mut dyn Engine, plan: &Plan<'_>, scope: &Pruned, class: &Classified) -> Result<()> {
    let (spec, version) = (plan.spec, quote_ident(&plan.spec.version));
    let del = format!("b.{}", quote_ident(DELETED));
    let (set, col_list, values) = merge_actions(spec, plan.names, None);
    let mut sql = Sql::new();
    sql.push(&format!("MERGE INTO {} AS t USING {BATCH} AS b ON (", plan.job.target.quoted())).append(&scope.on);
    sql.push(&format!(") WHEN MATCHED AND {del} AND b.{version} >= t.{version} THEN DELETE "));
    if !set.is_empty() {
        sql.push(&format!("WHEN MATCHED AND NOT {del} AND {} THEN UPDATE SET {set} ", Conditions::of(spec, plan.compared).newer));
    }
    sql.push(&format!("WHEN NOT MATCHED AND NOT {del} THEN INSERT ({col_list}) VALUES ({values})"));
    let planned = class.inserts + class.updates + class.deletes;
    let changed = if planned > 0 { engine.execute(&sql)? } else { 0 };
    plan.opts.step(FailPoint::AfterDelete)?;
    plan.opts.step(FailPoint::MidInsert)?;
    if changed != planned {
        return Err(Error::Internal(format!(
            "the merge changed {changed} rows but {} inserts, {} updates and {} deletes were planned; rolled back",
            class.inserts, class.updates, class.deletes
        )));
    }
    Ok(())
}

/// 6. The output: the batch's keys as the target now holds them (taken by
///    the classification when the target's columns are the source's).
fn output(engine: &mut dyn Engine, plan: &Plan<'_>, scope: &Pruned, output_cols: &[Column], by_construction: Option<(u64, i128)>) -> Result<Fingerprint> {
    let fp = fingerprint_select(engine, Method::Native, "t", output_cols)?;
    if let Some((rows, sum)) = by_construction {
        return Ok(fp.of(rows, sum));
    }
    // The batch holds one row per key, so a join is a semi-join.
    let mut sql = Sql::new();
    sql.push(&format!("SELECT {} FROM {} AS t JOIN {BATCH} AS b ON ", fp.select, plan.job.target.quoted())).append(&scope.on);
    fp.read(&engine.query(&sql)?.single("the output scan")?, engine)
}
