//! `merge` on engines without transactions: a copy-on-write of the
//! partitions the batch touches, under a lease.

use std::time::Instant;

use crate::engine::measure::{fingerprint_select, row_hash, FingerprintSelect};
use crate::engine::{Column, Leases};
use crate::error::{AuditResult, Error, FailPoint, Result};
use crate::fingerprint::runkey::run_key;
use crate::fingerprint::{Fingerprint, Method};
use crate::job::date::RunDate;
use crate::job::ident::quote_ident;
use crate::job::spec::{Job, MergeSpec, OnTie};
use crate::job::sql::{RunParams, Sql, Value};
use crate::plans::lease::leased;
use crate::plans::merge::refusals::{check_source, cross_tie_error, deleted_error, duplicate_keys_error, moved_error, tie_error};
use crate::plans::merge::sql::{batch_tie_cond, count, dedup_sql, dedup_tie_sql, keys_match, q, tombstone_table, BATCH_TIE, DELETED};
use crate::plans::merge::steps::{flagged_source, scan_stage, Classification, Classified};
use crate::run::input::{describe_source, RunInput};
use crate::run::ledger;
use crate::run::protocol::{elapsed_ms, RunOptions, Trace};
use crate::run::report::{entry, RunReport};

const STAGE: &str = "\"__fixpoint_stage\"";

const DEDUP: &str = "\"__fixpoint_dedup\"";

const BATCH: &str = "\"__fixpoint_batch\"";

const MERGED: &str = "\"__fixpoint_merged\"";

/// The merged rows' flag: the row's key is one of the batch's.
const TOUCHED: &str = "\"__fixpoint_touched\"";

/// The ranked rows' flag: a tombstone (see [`Cow::ranked_sql`]).
const RANKED_DEL: &str = "\"__fixpoint_del\"";

/// The ranked rows' source: 1 the batch, 0 the target.
const RANKED_SRC: &str = "\"__fixpoint_src\"";

/// How many rows the target holds for the ranked row's key (in the
/// touched partitions).
const RANKED_HELD: &str = "\"__fixpoint_held\"";

/// The ranked row (the target's) ties the batch's at its version.
const RANKED_TIE: &str = "\"__fixpoint_tie\"";

/// What one scan of the merged rows tells (see [`Cow::scan_merged`]).
struct MergedScan {
    /// The partitions that keep rows.
    kept: Vec<Value>,
    /// The batch's keys as they will be held.
    output: Fingerprint,
    /// The batch's rows inserted, updating and deleting.
    classified: Classified,
    /// Batch keys the target holds more than once.
    duplicated: u64,
    /// Batch keys whose target row differs at the same version.
    ties: u64,
    /// The batch's keys.
    keys: u64,
}

/// The merge as a copy-on-write of the partitions the batch touches (the
/// whole table when it is not partitioned), with the semantics of the
/// transactional merge (see the `merge` module): newest version per key,
/// tombstone first at equal version, ties refused or ordered, older
/// upserts never resurrect a deleted key.
pub(crate) fn merge_with(job: &Job, run_date: RunDate, engine: &mut dyn Leases, opts: &RunOptions, run_input: &RunInput, started: Instant) -> Result<RunReport> {
    // Dependents first: each stage reads the one before.
    let staged = [MERGED, BATCH, DEDUP, STAGE];
    let result = merge_staged(job, run_date, engine, opts, run_input, started);
    for name in staged {
        if let Err(e) = engine.unstage(name) {
            eprintln!("fixpoint: {}: could not drop the staged relation {name}: {e}", job.name);
        }
    }
    result
}

fn merge_staged(job: &Job, run_date: RunDate, engine: &mut dyn Leases, opts: &RunOptions, run_input: &RunInput, started: Instant) -> Result<RunReport> {
    let spec = job.merge.as_ref().ok_or_else(|| Error::Internal("merge without merge keys".into()))?;
    let params = run_input.params.clone();
    let source_cols = describe_source(job, engine, &params)?;
    check_source(job, spec, &source_cols)?;
    let names: Vec<String> = source_cols.iter().map(|c| c.name.clone()).collect();
    let is_meta = |c: &String| job.metadata.contains(c);
    let compared: Vec<String> = names.iter().filter(|c| !spec.key.contains(c) && **c != spec.version && !is_meta(c)).cloned().collect();
    let meta_cols: Vec<String> = names.iter().filter(|c| is_meta(c)).cloned().collect();
    let input_cols: Vec<Column> = source_cols.iter().filter(|c| !is_meta(&c.name)).cloned().collect();
    let mut cow = Cow {
        job,
        spec,
        run_date,
        opts,
        run_input,
        params,
        source_cols,
        names,
        compared,
        meta_cols,
        input_cols,
        trace: Trace::new(),
        started_at: chrono::Utc::now().naive_utc(),
        batch: BATCH,
    };
    // The target is looked at under the lease (see replace_partition).
    let report = leased(engine, job, "all", opts, &[tombstone_table(&job.target)], |engine| cow.run(engine))?;
    Ok(RunReport { elapsed_ms: elapsed_ms(started), ..report })
}

/// One copy-on-write merge.
struct Cow<'a> {
    job: &'a Job,
    spec: &'a MergeSpec,
    run_date: RunDate,
    opts: &'a RunOptions,
    run_input: &'a RunInput,
    params: RunParams,
    source_cols: Vec<Column>,
    names: Vec<String>,
    compared: Vec<String>,
    meta_cols: Vec<String>,
    input_cols: Vec<Column>,
    trace: Trace,
    started_at: chrono::NaiveDateTime,
    /// The batch, one row a key: [`DEDUP`] itself when no stored tombstone
    /// can beat a row of it, else [`BATCH`] (a copy without the beaten).
    batch: &'static str,
}

/// The partitions the batch touches.
struct Touched {
    /// Their values (a NULL partition aside).
    values: Vec<Value>,
    /// `(false OR t.<p> IN (…) OR t.<p> IS NULL)`, bound; empty unpruned.
    sql: Sql,
    /// A target row is in one of them (`true` unpruned).
    in_scope: String,
}

/// What the target is, under the lease.
struct Target {
    /// Its columns, `None` when it does not exist yet.
    existing: Option<Vec<Column>>,
    /// The source's new columns it takes.
    added: Vec<Column>,
    /// The partition column the merge is pruned to.
    prune: Option<String>,
    /// The one column it is stored partitioned by; `None`: an unpartitioned
    /// table the engine rewrites by rows (Delta), whose files holding a
    /// touched key are rewritten.
    stored_by: Option<String>,
    /// The target as a FROM item (empty, with the source's columns, before
    /// it exists: nothing is created until the checks have passed, so a
    /// refused run leaves no empty table behind).
    relation: String,
}

impl Cow<'_> {
    /// The steps in order.
    fn run(&mut self, engine: &mut dyn Leases) -> Result<RunReport> {
        let target = self.target(engine)?;
        crate::run::ledger::ensure(engine)?;
        self.trace.step("describe, ledger");
        let input = self.stage(engine)?;
        self.dedup(engine)?;
        let has_tombs = self.drop_beaten(engine)?;
        let (touched, ties) = self.touched(engine, target.prune.as_deref())?;
        self.refuse_batch_ties(engine, ties)?;
        match target.stored_by.clone() {
            Some(stored_by) => self.run_partitions(engine, &target, &stored_by, &touched, input, has_tombs),
            None => self.run_rows(engine, &target, &touched, input, has_tombs),
        }
    }

    /// 5–9, rewriting whole partitions (Spark, partitioned Delta tables).
    /// The touched partitions are materialized as they will be first: the
    /// window that ranks each key's rows there also classifies the batch's
    /// rows (each meets its key's target rows in it) and finds the keys the
    /// target holds twice and the ties with the target, so one scan of the
    /// merged rows gives the counts, the refusals, the partitions that keep
    /// rows and the output fingerprint. Only the keys the target holds in
    /// untouched partitions need a look of their own, before.
    fn run_partitions(&mut self, engine: &mut dyn Leases, target: &Target, stored_by: &str, touched: &Touched, input: Fingerprint, has_tombs: bool) -> Result<RunReport> {
        let (job, spec) = (self.job, self.spec);
        self.refuse_moved(engine, target, touched)?;
        // The columns the table will have (nothing is created or altered
        // until the checks have passed).
        let planned: Vec<Column> = match &target.existing {
            Some(cols) => cols.iter().chain(target.added.iter()).cloned().collect(),
            None => self.source_cols.clone(),
        };
        let is_output = |c: &&Column| !job.metadata.contains(&c.name);
        let planned_out: Vec<Column> = planned.iter().filter(is_output).cloned().collect();
        engine.stage(MERGED, &self.ranked_sql(&planned, target, touched))?;
        self.trace.step("merged");
        let mut scan = self.scan_merged(engine, stored_by, &planned_out)?;
        self.trace.step("classified, kept partitions, output fp");
        if scan.duplicated > 0 {
            return Err(duplicate_keys_error(engine, job, spec)?);
        }
        if spec.on_tie == OnTie::Error && scan.ties > 0 {
            let on = Sql::raw(keys_match("t", "b", &spec.key));
            return Err(cross_tie_error(engine, job, spec, self.batch, &on, &self.compared, scan.ties)?);
        }
        let dedup_rows = if self.batch == DEDUP { scan.keys } else { count(engine, &Sql::raw(format!("SELECT count(*) AS \"n\" FROM {DEDUP}")))? };
        let classified = scan.classified;
        self.opts.step(FailPoint::AfterGuards)?;
        let target_cols = self.prepare_target(engine, target)?;
        let output_cols: Vec<Column> = target_cols.iter().filter(is_output).cloned().collect();
        if !target.added.is_empty() || target_cols != planned {
            // Columns added (Spark drops the cached rows of a table it
            // alters, and would compute them again from the table being
            // written), or typed otherwise than planned: the merged rows
            // again, with the table's columns.
            engine.unstage(MERGED)?;
            engine.stage(MERGED, &self.ranked_sql(&target_cols, target, touched))?;
            scan = self.scan_merged(engine, stored_by, &output_cols)?;
            self.trace.step("merged again, with the table's columns");
        }
        let changes = classified.inserts + classified.updates + classified.deletes;
        // Tombstones first: a failure after this point and before the
        // rewrite leaves them recorded with the key still in the target,
        // which the retry deletes (it re-applies a tombstone at its own
        // version). The merged rows do not read them (see drop_beaten).
        self.record_tombstones(engine, has_tombs)?;
        let audits = if changes > 0 {
            self.opts.step(FailPoint::AfterDelete)?;
            let audits = self.audit_merged(engine, &target.relation, &target_cols, &format!("NOT {RANKED_DEL}"))?;
            self.opts.step(FailPoint::MidInsert)?;
            self.overwrite(engine, target, stored_by, &target_cols, touched, &scan.kept)?;
            audits
        } else {
            self.audit_unchanged(engine)?
        };
        self.opts.step(FailPoint::AfterInsert)?;
        // Nothing changed or not, the batch's keys hold the merged rows
        // read: the output fingerprint.
        self.record(engine, target, input, scan.output, dedup_rows, classified, audits)
    }

    /// 5–9, rewriting the rows of the touched keys (an unpartitioned Delta
    /// table): each batch row classified against the target in one join,
    /// then the rewrite.
    fn run_rows(&mut self, engine: &mut dyn Leases, target: &Target, touched: &Touched, input: Fingerprint, has_tombs: bool) -> Result<RunReport> {
        let classified = Classification {
            job: self.job,
            spec: self.spec,
            compared: &self.compared,
            prune: target.prune.as_deref(),
            batch: self.batch,
            target: &target.relation,
            in_scope: &touched.in_scope,
            params: &touched.sql.params,
        }
        .run(engine, "", |_, _| Ok(()))?;
        self.trace.step("classify");
        let dedup_rows = count(engine, &Sql::raw(format!("SELECT count(*) AS \"n\" FROM {DEDUP}")))?;
        self.opts.step(FailPoint::AfterGuards)?;
        let target_cols = self.prepare_target(engine, target)?;
        let changes = classified.inserts + classified.updates + classified.deletes;
        let output_cols: Vec<Column> = target_cols.iter().filter(|c| !self.job.metadata.contains(&c.name)).cloned().collect();
        // Tombstones first (see run_partitions); with nothing to rewrite, a
        // tombstone of a key the target does not hold is still remembered:
        // an older version of that key arriving later must stay deleted.
        self.record_tombstones(engine, has_tombs)?;
        let audits = if changes > 0 {
            self.opts.step(FailPoint::AfterDelete)?;
            self.rewrite_rows(engine, target, &target_cols, touched)?
        } else {
            self.audit_unchanged(engine)?
        };
        self.opts.step(FailPoint::AfterInsert)?;
        let output = self.output(engine, &output_cols)?;
        self.record(engine, target, input, output, dedup_rows, classified, audits)
    }

    /// A batch key the target holds in a partition the batch does not
    /// touch is refused: the rewrite of the touched partitions would hold
    /// it a second time. The target's other partitions are read for the
    /// batch's keys only (Spark: a semi-join with the batch broadcast).
    fn refuse_moved(&mut self, engine: &mut dyn Leases, target: &Target, touched: &Touched) -> Result<()> {
        let (Some(p), Some(_)) = (target.prune.as_deref(), &target.existing) else { return Ok(()) };
        let mut sql = Sql::new();
        sql.push(&format!(
            "SELECT count(*) AS \"n\" FROM {} AS t WHERE NOT {} AND EXISTS (SELECT 1 FROM {} AS b WHERE {})",
            target.relation,
            touched.in_scope,
            self.batch,
            keys_match("t", "b", &self.spec.key)
        ));
        sql.params.extend(touched.sql.params.iter().cloned());
        let moved = count(engine, &sql)?;
        self.trace.step("keys in untouched partitions");
        if moved > 0 {
            return Err(moved_error(engine, self.job, self.spec, p, self.batch, &touched.in_scope, &touched.sql.params, moved)?);
        }
        Ok(())
    }

    /// The target's columns and storage; refused when a rewrite of whole
    /// partitions cannot keep it safe.
    fn target(&self, engine: &mut dyn Leases) -> Result<Target> {
        let (job, source_cols) = (self.job, &self.source_cols);
        let existing = engine.table_columns(&job.target)?;
        let added = crate::run::schema::reconcile(engine, job, source_cols, existing.as_deref())?;
        let has = |cols: &[Column], name: &str| cols.iter().any(|c| c.name == name);
        let prune = job.partition.clone().filter(|p| has(source_cols, p) && existing.as_ref().is_none_or(|t| has(t, p)));
        // How the target is stored: the partitions a rewrite replaces whole.
        let stored_by = match &existing {
            Some(_) => engine.partition_columns(&job.target)?,
            None => prune.clone().into_iter().collect(),
        };
        if stored_by.len() > 1 {
            return Err(Error::Schema {
                message: format!("{} is partitioned by {} columns ({}): a merge on {} rewrites partitions of one column", job.target, stored_by.len(), stored_by.join(", "), engine.name()),
                hint: Some(format!("recreate {} partitioned by one column (the job's `partition`)", job.target)),
            });
        }
        let stored_by = stored_by.into_iter().next();
        if stored_by.is_none() && !engine.replaces_rows() {
            // An unpartitioned table can only be overwritten whole by
            // deleting its files first (Spark's static overwrite): a failure
            // midway would leave it empty. Refused rather than run without
            // that guarantee.
            return Err(Error::Schema {
                message: format!(
                    "{} {}: on {} a merge rewrites whole partitions, and only a partitioned table is rewritten without first deleting its files",
                    job.target,
                    if existing.is_some() { "is not partitioned" } else { "would be created unpartitioned (the job has no `partition`)" },
                    engine.name()
                ),
                hint: Some(format!("set `partition` in the job (a column the source carries, e.g. dt), or recreate {} with PARTITIONED BY (…)", job.target)),
            });
        }
        // Pruned by a column the table is not partitioned by: fine where the
        // engine rewrites by rows (the pruning then only narrows the rows a
        // batch key is matched against).
        if let Some(p) = prune.as_deref().filter(|p| stored_by.as_deref().map_or(!engine.replaces_rows(), |s| s != *p)) {
            return Err(Error::Schema {
                message: format!("{} is not stored partitioned by {p}: on {} a merge rewrites the partitions it touches, and this table has none", job.target, engine.name()),
                hint: Some(format!("recreate {} with PARTITIONED BY ({p}), or remove `partition` from the job to rewrite the whole table", job.target)),
            });
        }
        let relation = match &existing {
            Some(_) => job.target.quoted(),
            None => {
                let cols = source_cols.iter().map(|c| format!("CAST(NULL AS {}) AS {}", c.ty, quote_ident(&c.name))).collect::<Vec<_>>().join(", ");
                format!("(SELECT {cols} WHERE false)")
            }
        };
        Ok(Target { existing, added, prune, stored_by, relation })
    }

    /// 1. The source, read once, with its tombstone flag; NULL keys and
    ///    versions refused; the input fingerprint.
    fn stage(&mut self, engine: &mut dyn Leases) -> Result<Fingerprint> {
        let (job, spec) = (self.job, self.spec);
        let sql = flagged_source(job, spec, &self.params);
        // Materialized by the scan below, which reads every row.
        engine.stage_on_read(STAGE, &sql).map_err(|e| deleted_error(job, spec, &self.source_cols, e))?;
        let source_list = self.names.iter().map(|c| quote_ident(c)).collect::<Vec<_>>().join(", ");
        let input = scan_stage(engine, spec, STAGE, &source_list, &self.input_cols)?;
        self.trace.step("stage, input fp");
        Ok(input)
    }

    /// 2. One row per key (newest version, tombstone first at equal
    ///    version, then the values' total order), with `on_tie = "error"`
    ///    flagged where its key ties at that version (refused by
    ///    [`Cow::refuse_batch_ties`]). Materialized by its first reader,
    ///    which reads every row: the copy of [`Cow::drop_beaten`], the scan
    ///    of [`Cow::touched`], the tie count, or the ranking of the merged
    ///    rows.
    fn dedup(&mut self, engine: &mut dyn Leases) -> Result<()> {
        let sql = if self.checks_batch_ties() {
            dedup_tie_sql(self.spec, &self.names, &self.compared, &self.meta_cols, STAGE)
        } else {
            dedup_sql(self.spec, &self.names, &self.compared, &self.meta_cols, STAGE)
        };
        engine.stage_on_read(DEDUP, &Sql::raw(sql))?;
        Ok(())
    }

    /// Two rows of a key at its newest version with other values are
    /// refused (`on_tie = "error"`; exact copies collapse).
    fn checks_batch_ties(&self) -> bool {
        self.spec.on_tie == OnTie::Error && !self.compared.is_empty()
    }

    /// The batch's ties refused: `counted` when [`Cow::touched`] counted
    /// the flags on its scan of the dedup, else counted here.
    fn refuse_batch_ties(&mut self, engine: &mut dyn Leases, counted: Option<u64>) -> Result<()> {
        if !self.checks_batch_ties() {
            return Ok(());
        }
        let ties = match counted {
            Some(n) => n,
            None => count(engine, &Sql::raw(format!("SELECT count(*) AS \"n\" FROM {DEDUP} WHERE {}", quote_ident(BATCH_TIE))))?,
        };
        self.trace.step("dedup, ties");
        if ties > 0 {
            let tie_cond = batch_tie_cond(self.spec, &self.compared);
            return Err(tie_error(engine, self.spec, &self.names, STAGE, DEDUP, &tie_cond, ties)?);
        }
        Ok(())
    }

    /// 3. Tombstones (append-only here: each is kept with its version, the
    ///    newest counts). A batch row is beaten by a newer stored
    ///    tombstone, or by one at its own version unless it is that
    ///    tombstone itself (a retry re-applies it). Whether the tombstone
    ///    table exists.
    ///
    ///    The batch without the beaten rows is a copy of its own: the run
    ///    writes the tombstone table later, and a relation read from it
    ///    would then be computed again (Spark), with the merged rows that
    ///    read it, from the target as it is being written.
    fn drop_beaten(&mut self, engine: &mut dyn Leases) -> Result<bool> {
        let spec = self.spec;
        let tomb = tombstone_table(&self.job.target);
        let has_tombs = engine.table_columns(&tomb)?.is_some();
        if has_tombs {
            let (version, del) = (quote_ident(&spec.version), format!("b.{}", quote_ident(DELETED)));
            let cols = self.names.iter().map(String::as_str).chain([DELETED]).map(|c| q("b", c)).collect::<Vec<_>>().join(", ");
            engine.stage_copy(BATCH, &Sql::raw(format!(
                "SELECT {cols} FROM {DEDUP} AS b WHERE NOT EXISTS (SELECT 1 FROM {} AS d WHERE {} AND (d.{version} > b.{version} OR (d.{version} = b.{version} AND NOT {del})))",
                tomb.quoted(),
                keys_match("d", "b", &spec.key)
            )))?;
            self.batch = BATCH;
        } else {
            // Nothing can beat a row: the dedup is the batch (no copy).
            self.batch = DEDUP;
        }
        self.trace.step("tombstones");
        Ok(has_tombs)
    }

    /// 4. The partitions the batch touches, bound as values; read off the
    ///    dedup itself (no stored tombstone), also its keys' ties, counted.
    fn touched(&mut self, engine: &mut dyn Leases, prune: Option<&str>) -> Result<(Touched, Option<u64>)> {
        let batch = self.batch;
        let Some(p) = prune else { return Ok((Touched { values: Vec::new(), sql: Sql::new(), in_scope: "true".into() }, None)) };
        let ty = self.source_cols.iter().find(|c| c.name == p).map(|c| c.ty.clone()).unwrap_or_default();
        let (mut values, mut touches_null) = (Vec::new(), false);
        let pc = quote_ident(p);
        let mut ties = (batch == DEDUP && self.checks_batch_ties()).then_some(0u64);
        let sql = match ties {
            Some(_) => format!("SELECT {pc}, count(CASE WHEN {} THEN 1 END) AS \"n\" FROM {batch} GROUP BY {pc}", quote_ident(BATCH_TIE)),
            None => format!("SELECT DISTINCT {pc} FROM {batch}"),
        };
        for r in engine.query(&Sql::raw(sql))?.rows {
            match &r[0] {
                Value::Null => touches_null = true,
                v => values.push(v.clone()),
            }
            if let Some(n) = ties.as_mut() {
                *n += r[1].as_u64().ok_or_else(|| Error::Internal(format!("a count of ties came back as {:?}", r[1])))?;
            }
        }
        let mut sql = Sql::new();
        sql.push("(false");
        if !values.is_empty() {
            sql.push(" OR ").push(&q("t", p)).push(" IN (");
            for (i, v) in values.iter().enumerate() {
                if i > 0 {
                    sql.push(", ");
                }
                sql.typed_param(v.clone(), &ty);
            }
            sql.push(")");
        }
        if touches_null {
            sql.push(" OR ").push(&q("t", p)).push(" IS NULL");
        }
        sql.push(")");
        let in_scope = format!("coalesce({}, false)", sql.text);
        Ok((Touched { values, sql, in_scope }, ties))
    }

    /// The target, created now when missing (partitioned by the job's
    /// column), with the source's new columns; its columns.
    fn prepare_target(&mut self, engine: &mut dyn Leases, target: &Target) -> Result<Vec<Column>> {
        let job = self.job;
        if target.existing.is_none() {
            engine.execute(&Sql::raw(format!("CREATE SCHEMA IF NOT EXISTS {}", quote_ident(&job.target.schema))))?;
            engine.create_table(&job.target, &self.source_cols, target.prune.as_deref())?;
        }
        crate::run::schema::append(engine, &job.target, &target.added)?;
        Ok(engine.table_columns(&job.target)?.unwrap_or_default())
    }

    /// The touched partitions written over with the merged rows in one
    /// statement; a touched partition left without rows (`kept` lists
    /// those that keep some) is dropped after.
    fn overwrite(&mut self, engine: &mut dyn Leases, target: &Target, stored_by: &str, target_cols: &[Column], touched: &Touched, kept: &[Value]) -> Result<()> {
        // A rewrite of the whole table replaces the partitions its rows
        // fall in: those it leaves empty are dropped after.
        let pc = quote_ident(stored_by);
        let whole_table_partitions: Vec<Value> = match (&target.prune, &target.existing) {
            (None, Some(_)) => engine.query(&Sql::raw(format!("SELECT DISTINCT {pc} FROM {}", self.job.target.quoted())))?.rows.into_iter().map(|mut r| r.remove(0)).collect(),
            _ => Vec::new(),
        };
        let out_names: Vec<String> = target_cols.iter().map(|c| c.name.clone()).collect();
        let out_list = out_names.iter().map(|c| quote_ident(c)).collect::<Vec<_>>().join(", ");
        engine.overwrite_partitions(&self.job.target, &out_names, &Sql::raw(format!("SELECT {out_list} FROM {MERGED} WHERE NOT {RANKED_DEL}")))?;
        let ty = target_cols.iter().find(|c| c.name == stored_by).map(|c| c.ty.clone()).unwrap_or_default();
        let replaced = if target.prune.is_some() { &touched.values } else { &whole_table_partitions };
        for v in replaced.iter().filter(|v| !matches!(v, Value::Null) && !kept.contains(v)) {
            engine.drop_partition_value(&self.job.target, stored_by, v, &ty)?;
        }
        self.trace.step("overwrite");
        Ok(())
    }

    /// One scan of the merged rows of [`Cow::ranked_sql`], before anything
    /// is written (once the table is written, Spark computes a cached
    /// relation over it again when it is next read): the classification's
    /// counts, the keys the target holds twice, the ties with the target,
    /// the partitions that keep rows, and the output fingerprint. That is
    /// taken over the rows of the batch's keys (those the partitions will
    /// hold once written, since a batch key the target holds outside them
    /// is refused before) with their values cast to the table's types, as
    /// stored.
    fn scan_merged(&mut self, engine: &mut dyn Leases, stored_by: &str, output_cols: &[Column]) -> Result<MergedScan> {
        let (hash, kind, signature) = row_hash(engine, Method::Native, "m", output_cols)?;
        let fp = FingerprintSelect { select: String::new(), kind, signature };
        let out = format!("m.{TOUCHED} AND NOT m.{RANKED_DEL}");
        let sum = if output_cols.is_empty() { "0".to_owned() } else { format!("sum(CASE WHEN {out} THEN {hash} END)") };
        let cast = output_cols.iter().map(|c| format!("CAST({} AS {}) AS {}", quote_ident(&c.name), c.ty, quote_ident(&c.name))).collect::<Vec<_>>().join(", ");
        let sep = if cast.is_empty() { "" } else { ", " };
        let part = quote_ident(stored_by);
        let won = format!("m.{RANKED_SRC} = 1");
        let rows = engine.query(&Sql::raw(format!(
            "SELECT m.\"__fixpoint_part\" AS \"p\", count(CASE WHEN {out} THEN 1 END) AS \"n\", {sum} AS \"s\", \
             count(CASE WHEN NOT m.{RANKED_DEL} THEN 1 END) AS \"kept\", \
             count(CASE WHEN {won} AND NOT m.{RANKED_DEL} AND m.{RANKED_HELD} = 0 THEN 1 END) AS \"inserts\", \
             count(CASE WHEN {won} AND NOT m.{RANKED_DEL} AND m.{RANKED_HELD} > 0 THEN 1 END) AS \"updates\", \
             count(CASE WHEN {won} AND m.{RANKED_DEL} AND m.{RANKED_HELD} > 0 THEN 1 END) AS \"deletes\", \
             count(CASE WHEN m.{TOUCHED} AND m.{RANKED_HELD} > 1 THEN 1 END) AS \"duplicated\", \
             count(CASE WHEN m.{RANKED_TIE} THEN 1 END) AS \"ties\", \
             count(CASE WHEN m.{TOUCHED} THEN 1 END) AS \"keys\" \
             FROM (SELECT {part} AS \"__fixpoint_part\"{sep}{cast}, {TOUCHED}, {RANKED_DEL}, {RANKED_SRC}, {RANKED_HELD}, {RANKED_TIE} FROM {MERGED}) AS m \
             GROUP BY m.\"__fixpoint_part\""
        )))?;
        let mut scan = MergedScan { kept: Vec::new(), output: fp.of(0, 0), classified: Classified { inserts: 0, updates: 0, deletes: 0 }, duplicated: 0, ties: 0, keys: 0 };
        let (mut n, mut total) = (0u64, 0i128);
        let c = |v: &Value| v.as_u64().ok_or_else(|| Error::Internal(format!("a count of merged rows came back as {v:?}")));
        for r in &rows.rows {
            if c(&r[3])? > 0 {
                scan.kept.push(r[0].clone());
            }
            n += c(&r[1])?;
            total = total.checked_add(engine.dialect().read_sum(&r[2])?).ok_or_else(|| Error::Internal("the output fingerprint's sum overflowed".into()))?;
            scan.classified.inserts += c(&r[4])?;
            scan.classified.updates += c(&r[5])?;
            scan.classified.deletes += c(&r[6])?;
            scan.duplicated += c(&r[7])?;
            scan.ties += c(&r[8])?;
            scan.keys += c(&r[9])?;
        }
        scan.output = fp.of(n, total);
        Ok(scan)
    }

    /// The rewrite of an unpartitioned table (engines that replace rows in
    /// one step): the rows of the touched keys (in the touched partitions
    /// when pruned) replaced with their merged rows; the storage holding no
    /// touched key is left alone.
    fn rewrite_rows(&mut self, engine: &mut dyn Leases, target: &Target, target_cols: &[Column], touched: &Touched) -> Result<Vec<AuditResult>> {
        let batch = self.batch;
        let in_scope = format!("({}) AND EXISTS (SELECT 1 FROM {batch} AS b WHERE {})", touched.in_scope, keys_match("t", "b", &self.spec.key));
        let keys = Touched { values: touched.values.clone(), sql: touched.sql.clone(), in_scope };
        engine.stage(MERGED, &self.merged_sql(target_cols, target, &keys))?;
        self.trace.step("merged");
        let audits = self.audit_merged(engine, &target.relation, target_cols, "true")?;
        self.opts.step(FailPoint::MidInsert)?;
        let out_names: Vec<String> = target_cols.iter().map(|c| c.name.clone()).collect();
        let out_list = out_names.iter().map(|c| quote_ident(c)).collect::<Vec<_>>().join(", ");
        let mut dropped = Sql::new();
        dropped.push(&keys.in_scope);
        dropped.params.extend(keys.sql.params.iter().cloned());
        engine.replace_rows(&self.job.target, &out_names, &dropped, &Sql::raw(format!("SELECT {out_list} FROM {MERGED}")))?;
        self.trace.step("overwrite");
        Ok(audits)
    }

    /// The batch's tombstones, first: a failure after this point and before
    /// the rewrite leaves them recorded with the key still in the target,
    /// which the retry deletes (it re-applies a tombstone at its own
    /// version).
    fn record_tombstones(&mut self, engine: &mut dyn Leases, has_tombs: bool) -> Result<()> {
        let batch = self.batch;
        let spec = self.spec;
        if spec.deleted.is_none() {
            return Ok(());
        }
        let tomb = tombstone_table(&self.job.target);
        let del = format!("b.{}", quote_ident(DELETED));
        // A tombstone stored already (a forced rerun re-applies its own) is
        // not stored twice.
        let new = if has_tombs {
            format!("{del} AND NOT EXISTS (SELECT 1 FROM {} AS d WHERE {} AND d.{v} = b.{v})", tomb.quoted(), keys_match("d", "b", &spec.key), v = quote_ident(&spec.version))
        } else {
            del
        };
        if count(engine, &Sql::raw(format!("SELECT count(*) AS \"n\" FROM {batch} AS b WHERE {new}")))? == 0 {
            return Ok(());
        }
        if !has_tombs {
            let ty = |k: &String| self.source_cols.iter().find(|c| &c.name == k).expect("described").ty.clone();
            let cols: Vec<Column> = spec.key.iter().chain([&spec.version]).map(|k| Column { name: k.clone(), ty: ty(k) }).collect();
            engine.create_table(&tomb, &cols, None)?;
        }
        let kv = spec.key.iter().chain([&spec.version]).map(|k| quote_ident(k)).collect::<Vec<_>>().join(", ");
        engine.execute(&Sql::raw(format!("INSERT INTO {} ({kv}) SELECT {kv} FROM {batch} AS b WHERE {new}", tomb.quoted())))?;
        Ok(())
    }

    /// The touched partitions as they will be, with the table's columns
    /// `cols` (one the target does not have yet reads NULL): per key, the
    /// winner among the batch row and the target's rows, ranked by the
    /// merge's order (the target's at a full tie: no churn), a winning
    /// tombstone kept and flagged ([`RANKED_DEL`]) for the counts. Each
    /// row also says, from the same window (one sort of the rows), whether
    /// its key is the batch's ([`TOUCHED`]), whether the batch's row won
    /// ([`RANKED_SRC`]), how many rows the target holds for the key there
    /// ([`RANKED_HELD`]), and whether the target's row ties the batch's at
    /// the same version with other values ([`RANKED_TIE`], with `on_tie =
    /// "error"`: the target's row ranks first, the batch's right after).
    fn ranked_sql(&self, cols: &[Column], target: &Target, touched: &Touched) -> Sql {
        let (spec, batch) = (self.spec, self.batch);
        let (version, del) = (quote_ident(&spec.version), format!("b.{}", quote_ident(DELETED)));
        let key_list = spec.key.iter().map(|k| quote_ident(k)).collect::<Vec<_>>().join(", ");
        let tie_break = match spec.on_tie {
            OnTie::Deterministic => self.compared.iter().map(|c| format!(", {} ASC NULLS FIRST", quote_ident(c))).collect::<String>(),
            OnTie::Error => String::new(),
        };
        let out_list = cols.iter().map(|c| quote_ident(&c.name)).collect::<Vec<_>>().join(", ");
        let null = |c: &Column| format!("CAST(NULL AS {}) AS {}", c.ty, quote_ident(&c.name));
        let from_batch = cols.iter().map(|c| if self.names.contains(&c.name) { format!("b.{}", quote_ident(&c.name)) } else { null(c) }).collect::<Vec<_>>().join(", ");
        let held = |name: &str| target.existing.as_ref().is_none_or(|e| e.iter().any(|c| c.name == name));
        let from_target = cols.iter().map(|c| if held(&c.name) { q("t", &c.name) } else { null(c) }).collect::<Vec<_>>().join(", ");
        let order = format!("PARTITION BY {key_list} ORDER BY {version} DESC, {RANKED_DEL} DESC{tie_break}, {RANKED_SRC} ASC");
        let all = format!("OVER ({order} ROWS BETWEEN UNBOUNDED PRECEDING AND UNBOUNDED FOLLOWING)");
        let next = |e: &str| format!("lead({e}) OVER ({order})");
        let tie = match spec.on_tie {
            OnTie::Error if !self.compared.is_empty() => format!(
                "{RANKED_SRC} = 0 AND NOT {RANKED_DEL} AND {} = 1 AND {} = {version} AND NOT {} AND ({})",
                next(RANKED_SRC),
                next(&version),
                next(RANKED_DEL),
                self.compared.iter().map(|c| format!("{} IS DISTINCT FROM {}", next(&quote_ident(c)), quote_ident(c))).collect::<Vec<_>>().join(" OR ")
            ),
            _ => "false".into(),
        };
        let mut sql = Sql::new();
        sql.push(&format!(
            "SELECT {out_list}, {TOUCHED}, {RANKED_DEL}, {RANKED_SRC}, {RANKED_HELD}, {RANKED_TIE} FROM (\
             SELECT *, row_number() OVER ({order}) AS \"__fixpoint_rank\", max({RANKED_SRC}) {all} = 1 AS {TOUCHED}, \
             sum(1 - {RANKED_SRC}) {all} AS {RANKED_HELD}, {tie} AS {RANKED_TIE} FROM (\
             SELECT {from_batch}, {del} AS {RANKED_DEL}, 1 AS {RANKED_SRC} FROM {batch} AS b \
             UNION ALL SELECT {from_target}, false, 0 FROM {} AS t WHERE {}) AS u) AS r \
             WHERE \"__fixpoint_rank\" = 1",
            target.relation,
            touched.in_scope
        ));
        sql.params.extend(touched.sql.params.iter().cloned());
        sql
    }

    /// The touched partitions as they will be, with the table's columns:
    /// the winners of [`Cow::ranked_sql`], tombstones dropped.
    fn merged_sql(&self, target_cols: &[Column], target: &Target, touched: &Touched) -> Sql {
        let out_list = target_cols.iter().map(|c| quote_ident(&c.name)).collect::<Vec<_>>().join(", ");
        let ranked = self.ranked_sql(target_cols, target, touched);
        let mut sql = Sql::new();
        sql.push(&format!("SELECT {out_list} FROM ({}) AS \"__fixpoint_ranked\" WHERE NOT {RANKED_DEL}", ranked.text));
        sql.params = ranked.params;
        sql
    }

    /// The touched keys' rows in `relation`, as a FROM item.
    fn touched_keys(&self, relation: &str, sql: &mut Sql) {
        let batch = self.batch;
        sql.push(&format!("(SELECT t.* FROM {relation} AS t WHERE EXISTS (SELECT 1 FROM {batch} AS b WHERE {})) AS a", keys_match("t", "b", &self.spec.key)));
    }

    /// The touched keys as they will be published, audited before anything
    /// is overwritten (against their rows before).
    /// `filter` keeps the merged rows the table will hold.
    fn audit_merged(&mut self, engine: &mut dyn Leases, target_rel: &str, target_cols: &[Column], filter: &str) -> Result<Vec<AuditResult>> {
        if self.job.audits.is_empty() {
            return Ok(Vec::new());
        }
        let mut before = Sql::new();
        before.push("SELECT count(*) AS \"n\" FROM ");
        self.touched_keys(target_rel, &mut before);
        let previous = count(engine, &before)?;
        // The table's columns only (not the merged rows' flags).
        let merged = format!("(SELECT {} FROM {MERGED} WHERE {filter})", target_cols.iter().map(|c| quote_ident(&c.name)).collect::<Vec<_>>().join(", "));
        let from = |sql: &mut Sql| self.touched_keys(&merged, sql);
        let scope = crate::run::audit::AuditScope { from: &from, previous_rows: Some(previous), run_date: self.run_date.date() };
        crate::run::audit::audit(self.job, engine, &scope)
    }

    /// Nothing changes: the touched keys audited as they are.
    fn audit_unchanged(&mut self, engine: &mut dyn Leases) -> Result<Vec<AuditResult>> {
        if self.job.audits.is_empty() {
            return Ok(Vec::new());
        }
        let target = self.job.target.quoted();
        let from = |sql: &mut Sql| self.touched_keys(&target, sql);
        let scope = crate::run::audit::AuditScope { from: &from, previous_rows: None, run_date: self.run_date.date() };
        crate::run::audit::audit(self.job, engine, &scope)
    }

    /// 8. The output: the batch's keys as the target now holds them.
    fn output(&mut self, engine: &mut dyn Leases, output_cols: &[Column]) -> Result<Fingerprint> {
        let batch = self.batch;
        let fp = fingerprint_select(engine, Method::Native, "t", output_cols)?;
        let mut sql = Sql::new();
        sql.push(&format!("SELECT {} FROM {} AS t JOIN {batch} AS b ON {}", fp.select, self.job.target.quoted(), keys_match("t", "b", &self.spec.key)));
        let output = fp.read(&engine.query(&sql)?.single("the output scan")?, engine)?;
        self.trace.step("output fp");
        Ok(output)
    }

    /// 9. The report, and its ledger row.
    #[allow(clippy::too_many_arguments)]
    fn record(&mut self, engine: &mut dyn Leases, target: &Target, input: Fingerprint, output: Fingerprint, dedup_rows: u64, c: Classified, audits: Vec<AuditResult>) -> Result<RunReport> {
        let job = self.job;
        let job_hash = job.definition_hash();
        let key = self.run_input.file_key(&job_hash, self.run_date).unwrap_or_else(|| run_key(&job_hash, self.run_date, &input));
        self.opts.run_key_known(self.job, self.run_date, &key);
        let mut report = RunReport::new(job, self.run_date, key, "committed", &input, &output);
        report.audits = audits;
        report.input_files = self.run_input.files.clone();
        report.rows_deleted = c.deletes;
        report.rows_inserted = c.inserts;
        report.rows_updated = c.updates;
        report.rows_unchanged = dedup_rows - c.inserts - c.updates - c.deletes;
        report.duplicates_collapsed = input.rows - dedup_rows;
        report.created_target = target.existing.is_none();
        report.method = if target.prune.is_some() { "copy-on-write of touched partitions".into() } else { "copy-on-write of the table".into() };
        self.opts.step(FailPoint::BeforeCommit)?;
        ledger::record(engine, &entry(job, &job_hash, &report, self.started_at))?;
        self.trace.step("ledger row");
        Ok(report)
    }
}
