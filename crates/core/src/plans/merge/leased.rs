//! `merge` on engines without transactions: a copy-on-write of the
//! partitions the batch touches, under a lease.

use std::time::Instant;

use crate::engine::{Column, Leases};
use crate::error::{Error, FailPoint, Result};
use crate::fingerprint::compute::fingerprint_select;
use crate::fingerprint::runkey::run_key;
use crate::fingerprint::Method;
use crate::job::date::RunDate;
use crate::job::ident::quote_ident;
use crate::job::spec::Job;
use crate::job::sql::{Sql, Value};
use crate::run::ledger;
use crate::run::input::{describe_source, RunInput};
use crate::run::protocol::{RunOptions, Trace};
use crate::run::report::{entry, RunReport};

use crate::plans::lease::leased;

const STAGE: &str = "\"__fixpoint_stage\"";

const DEDUP: &str = "\"__fixpoint_dedup\"";

const BATCH: &str = "\"__fixpoint_batch\"";

const MERGED: &str = "\"__fixpoint_merged\"";

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
    use crate::plans::merge::steps::{flagged_source, scan_stage};
use crate::plans::merge::sql::{count, keys_match, q, rows_differ, tombstone_table, DELETED};
    use crate::job::spec::OnTie;
    let mut trace = Trace::new();
    let started_at = chrono::Utc::now().naive_utc();
    let spec = job.merge.as_ref().ok_or_else(|| Error::Internal("merge without merge keys".into()))?;
    let params = run_input.params.clone();
    let source_cols = describe_source(job, engine, &params)?;
    let has = |cols: &[Column], name: &str| cols.iter().any(|c| c.name == name);
    crate::plans::merge::refusals::check_source(job, spec, &source_cols)?;
    let names: Vec<String> = source_cols.iter().map(|c| c.name.clone()).collect();
    let is_meta = |c: &String| job.metadata.contains(c);
    let compared: Vec<String> = names.iter().filter(|c| !spec.key.contains(c) && **c != spec.version && !is_meta(c)).cloned().collect();
    let meta_cols: Vec<String> = names.iter().filter(|c| is_meta(c)).cloned().collect();
    let input_cols: Vec<Column> = source_cols.iter().filter(|c| !is_meta(&c.name)).cloned().collect();
    let version = quote_ident(&spec.version);
    let source_list = names.iter().map(|c| quote_ident(c)).collect::<Vec<_>>().join(", ");
    let key_list = spec.key.iter().map(|k| quote_ident(k)).collect::<Vec<_>>().join(", ");
    let del = format!("b.{}", quote_ident(DELETED));

    // The target is looked at under the lease (see replace_partition).
    leased(engine, job, "all", opts, |engine| {
        let existing = engine.table_columns(&job.target)?;
        let added = crate::run::schema::reconcile(engine, job, &source_cols, existing.as_deref())?;
        let prune = job.partition.as_deref().filter(|p| has(&source_cols, p) && existing.as_ref().is_none_or(|t| has(t, p)));
        // How the target is stored: the partitions a rewrite replaces whole.
        let stored_by = match &existing {
            Some(_) => engine.partition_columns(&job.target)?,
            None => prune.map(str::to_owned).into_iter().collect(),
        };
        if stored_by.len() > 1 {
            return Err(Error::Schema {
                message: format!("{} is partitioned by {} columns ({}): a merge on {} rewrites partitions of one column", job.target, stored_by.len(), stored_by.join(", "), engine.name()),
                hint: Some(format!("recreate {} partitioned by one column (the job's `partition`)", job.target)),
            });
        }
        let stored_by = stored_by.into_iter().next();
        if stored_by.is_none() {
            // An unpartitioned table can only be overwritten whole by deleting
            // its files first (Spark's static overwrite): a failure midway would
            // leave it empty. Refused rather than run without that guarantee.
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
        if let Some(p) = prune {
            if stored_by.as_deref() != Some(p) {
                return Err(Error::Schema {
                    message: format!("{} is not stored partitioned by {p}: on {} a merge rewrites the partitions it touches, and this table has none", job.target, engine.name()),
                    hint: Some(format!("recreate {} with PARTITIONED BY ({p}), or remove `partition` from the job to rewrite the whole table", job.target)),
                });
            }
        }
        ledger::ensure(engine)?;
        // Nothing is created until the checks have passed (a refused run
        // leaves no empty table behind): a missing target reads as empty.
        let created_target = existing.is_none();
        let empty = match &existing {
            Some(_) => None,
            None => {
                let cols = source_cols.iter().map(|c| format!("CAST(NULL AS {}) AS {}", c.ty, quote_ident(&c.name))).collect::<Vec<_>>().join(", ");
                Some(format!("(SELECT {cols} WHERE false)"))
            }
        };
        let target_rel = empty.clone().unwrap_or_else(|| job.target.quoted());
        trace.step("describe, ledger");

        // 1. The source, read once, with its tombstone flag.
        let sql = flagged_source(job, spec, &params);
        engine.stage(STAGE, &sql).map_err(|e| crate::plans::merge::refusals::deleted_error(job, spec, &source_cols, e))?;
        trace.step("stage");

        // 2. NULL keys and versions refused; the input fingerprint.
        let input = scan_stage(engine, spec, STAGE, &source_list, &input_cols)?;
        let input_rows = input.rows;
        let job_hash = job.definition_hash();
        let key = run_input.file_key(&job_hash, run_date).unwrap_or_else(|| run_key(&job_hash, run_date, &input));

        // 3. One row per key: newest version, tombstone first at equal
        //    version, then the values' total order.
        engine.stage(DEDUP, &Sql::raw(crate::plans::merge::sql::dedup_sql(spec, &names, &compared, &meta_cols, STAGE)))?;
        let dedup_rows = count(engine, &Sql::raw(format!("SELECT count(*) AS \"n\" FROM {DEDUP}")))?;
        let duplicates_collapsed = input_rows - dedup_rows;
        trace.step("dedup");

        // 4. Ties inside the batch.
        if spec.on_tie == OnTie::Error {
            let tie_cond = crate::plans::merge::sql::batch_tie_cond(spec, &compared);
            let ties = count(engine, &Sql::raw(format!("SELECT count(*) AS \"n\" FROM {DEDUP} AS b WHERE EXISTS (SELECT 1 FROM {STAGE} AS s WHERE {tie_cond})")))?;
            if ties > 0 {
                return Err(crate::plans::merge::refusals::tie_error(engine, spec, &names, STAGE, DEDUP, &tie_cond, ties)?);
            }
        }

        // 5. Tombstones (append-only here: each is kept with its version,
        //    the newest counts). A batch row is beaten by a newer stored
        //    tombstone, or by one at its own version unless it is that
        //    tombstone itself (a retry re-applies it).
        let tomb = tombstone_table(&job.target);
        let has_tombs = engine.table_columns(&tomb)?.is_some();
        if has_tombs {
            engine.stage(BATCH, &Sql::raw(format!(
                "SELECT * FROM {DEDUP} AS b WHERE NOT EXISTS (SELECT 1 FROM {} AS d WHERE {} AND (d.{version} > b.{version} OR (d.{version} = b.{version} AND NOT {del})))",
                tomb.quoted(),
                keys_match("d", "b", &spec.key)
            )))?;
        } else {
            engine.stage(BATCH, &Sql::raw(format!("SELECT * FROM {DEDUP}")))?;
        }
        trace.step("ties, tombstones");

        // 6. The partitions the batch touches, bound as values.
        let mut prune_sql = Sql::new();
        let mut touched: Vec<Value> = Vec::new();
        let mut touches_null = false;
        let part_ty = prune.map(|p| source_cols.iter().find(|c| c.name == p).map(|c| c.ty.clone()).unwrap_or_default());
        if let (Some(p), Some(ty)) = (prune, &part_ty) {
            for r in engine.query(&Sql::raw(format!("SELECT DISTINCT {} FROM {BATCH}", quote_ident(p))))?.rows {
                match &r[0] {
                    Value::Null => touches_null = true,
                    v => touched.push(v.clone()),
                }
            }
            prune_sql.push("(false");
            if !touched.is_empty() {
                prune_sql.push(" OR ").push(&q("t", p)).push(" IN (");
                for (i, v) in touched.iter().enumerate() {
                    if i > 0 {
                        prune_sql.push(", ");
                    }
                    prune_sql.typed_param(v.clone(), ty);
                }
                prune_sql.push(")");
            }
            if touches_null {
                prune_sql.push(" OR ").push(&q("t", p)).push(" IS NULL");
            }
            prune_sql.push(")");
        }
        let in_scope = if prune.is_some() { format!("coalesce({}, false)", prune_sql.text) } else { "true".to_owned() };

        // 7. Classify the batch against the target (unpruned join, so a
        //    key held in a partition the batch does not touch is found).
        let newer = format!("(b.{version} > t.{version}{})", match spec.on_tie {
            OnTie::Deterministic => format!(" OR (b.{version} = t.{version} AND {})", crate::plans::merge::sql::sorts_before("b", "t", &compared)),
            OnTie::Error => String::new(),
        });
        let first_key = q("t", &spec.key[0]);
        let matched = format!("{first_key} IS NOT NULL");
        let is_update = format!("{matched} AND NOT {del} AND {newer}");
        let is_delete = format!("{matched} AND {del} AND b.{version} >= t.{version}");
        let is_insert = format!("{first_key} IS NULL AND NOT {del}");
        let mut sql = Sql::new();
        sql.push(&format!(
            "SELECT count(*) FILTER (WHERE {is_insert}) AS \"inserts\", count(*) FILTER (WHERE {is_update}) AS \"updates\", \
             count(*) FILTER (WHERE {is_delete}) AS \"deletes\", \
             count(*) FILTER (WHERE {matched} AND NOT {del} AND b.{version} = t.{version} AND ({})) AS \"cross_ties\", \
             count(*) FILTER (WHERE {matched} AND NOT ({in_scope})) AS \"moved\" \
             FROM {BATCH} AS b LEFT JOIN {target_rel} AS t ON {}",
            rows_differ("b", "t", &compared),
            keys_match("t", "b", &spec.key)
        ));
        sql.params.extend(prune_sql.params.iter().cloned());
        let rows = engine.query(&sql)?;
        let row = rows.single("the classification")?;
        let (inserts, updates, deletes) = (row.count("inserts")?, row.count("updates")?, row.count("deletes")?);
        let (cross_ties, moved) = (row.count("cross_ties")?, row.count("moved")?);
        trace.step("classify");
        if moved > 0 {
            let p = prune.expect("moved only counted when pruning");
            return Err(crate::plans::merge::refusals::moved_error(engine, job, spec, p, BATCH, &in_scope, &prune_sql.params, moved)?);
        }
        if spec.on_tie == OnTie::Error && cross_ties > 0 {
            let on = Sql::raw(keys_match("t", "b", &spec.key));
            return Err(crate::plans::merge::refusals::cross_tie_error(engine, job, spec, BATCH, &on, &compared, cross_ties)?);
        }
        opts.step(FailPoint::AfterGuards)?;

        let touched_keys = |sql: &mut Sql| {
            sql.push(&format!(
                "(SELECT t.* FROM {target_rel} AS t WHERE EXISTS (SELECT 1 FROM {BATCH} AS b WHERE {})) AS a",
                keys_match("t", "b", &spec.key)
            ));
        };
        // The target, created now when missing (partitioned by the job's
        // column), with the source's new columns.
        if created_target {
            engine.execute(&Sql::raw(format!("CREATE SCHEMA IF NOT EXISTS {}", quote_ident(&job.target.schema))))?;
            engine.create_table(&job.target, &source_cols, prune)?;
        }
        crate::run::schema::append(engine, &job.target, &added)?;
        let target_cols = engine.table_columns(&job.target)?.unwrap_or_default();
        let output_cols: Vec<Column> = target_cols.iter().filter(|c| !is_meta(&c.name)).cloned().collect();
        let mut audits = Vec::new();
        if inserts + updates + deletes > 0 {
            // 8. The batch's tombstones first: a failure after this point
            //    and before the rewrite leaves them recorded with the key
            //    still in the target, which the retry deletes (it re-applies
            //    a tombstone at its own version).
            if spec.deleted.is_some() && count(engine, &Sql::raw(format!("SELECT count(*) AS \"n\" FROM {BATCH} AS b WHERE {del}")))? > 0 {
                if !has_tombs {
                    let cols: Vec<Column> = spec
                        .key
                        .iter()
                        .chain([&spec.version])
                        .map(|k| Column { name: k.clone(), ty: source_cols.iter().find(|c| &c.name == k).expect("described").ty.clone() })
                        .collect();
                    engine.create_table(&tomb, &cols, None)?;
                }
                let kv = spec.key.iter().chain([&spec.version]).map(|k| quote_ident(k)).collect::<Vec<_>>().join(", ");
                engine.execute(&Sql::raw(format!("INSERT INTO {} ({kv}) SELECT {kv} FROM {BATCH} AS b WHERE {del}", tomb.quoted())))?;
            }
            opts.step(FailPoint::AfterDelete)?;

            // 9. The touched partitions as they will be: per key, the
            //    winner among the batch row and the target's row (the
            //    target's at a full tie: no churn); tombstones dropped.
            let tie_break = match spec.on_tie {
                OnTie::Deterministic => compared.iter().map(|c| format!(", {} ASC NULLS FIRST", quote_ident(c))).collect::<String>(),
                OnTie::Error => String::new(),
            };
            let out_names: Vec<String> = target_cols.iter().map(|c| c.name.clone()).collect();
            let out_list = out_names.iter().map(|c| quote_ident(c)).collect::<Vec<_>>().join(", ");
            let from_batch = target_cols
                .iter()
                .map(|c| if names.contains(&c.name) { format!("b.{}", quote_ident(&c.name)) } else { format!("CAST(NULL AS {}) AS {}", c.ty, quote_ident(&c.name)) })
                .collect::<Vec<_>>()
                .join(", ");
            let from_target = out_names.iter().map(|c| q("t", c)).collect::<Vec<_>>().join(", ");
            let mut sql = Sql::new();
            sql.push(&format!(
                "SELECT {out_list} FROM (SELECT *, row_number() OVER (PARTITION BY {key_list} ORDER BY {version} DESC, \"__fixpoint_del\" DESC{tie_break}, \"__fixpoint_src\" ASC) AS \"__fixpoint_rank\" FROM (\
                 SELECT {from_batch}, {del} AS \"__fixpoint_del\", 1 AS \"__fixpoint_src\" FROM {BATCH} AS b \
                 UNION ALL SELECT {from_target}, false, 0 FROM {} AS t WHERE {in_scope}) AS u) AS r \
                 WHERE \"__fixpoint_rank\" = 1 AND NOT \"__fixpoint_del\"",
                job.target.quoted()
            ));
            sql.params.extend(prune_sql.params.iter().cloned());
            // A rewrite of the whole table replaces the partitions its rows
            // fall in: those it leaves empty are dropped after.
            let whole_table_partitions: Vec<Value> = match (prune, &stored_by, created_target) {
                (None, Some(pc), false) => engine.query(&Sql::raw(format!("SELECT DISTINCT {} FROM {}", quote_ident(pc), job.target.quoted())))?.rows.into_iter().map(|mut r| r.remove(0)).collect(),
                _ => Vec::new(),
            };
            engine.stage(MERGED, &sql)?;
            trace.step("merged");
            // The touched keys as they will be published, audited before
            // anything is overwritten.
            if !job.audits.is_empty() {
                let from = |sql: &mut Sql| {
                    sql.push(&format!(
                        "(SELECT t.* FROM {MERGED} AS t WHERE EXISTS (SELECT 1 FROM {BATCH} AS b WHERE {})) AS a",
                        keys_match("t", "b", &spec.key)
                    ));
                };
                let mut before = Sql::new();
                before.push("SELECT count(*) AS \"n\" FROM ");
                touched_keys(&mut before);
                let previous = count(engine, &before)?;
                let scope = crate::run::audit::AuditScope { from: &from, previous_rows: Some(previous), run_date: run_date.date() };
                audits = crate::run::audit::audit(job, engine, &scope)?;
            }
            opts.step(FailPoint::MidInsert)?;

            // 10. Written over the touched partitions in one statement; a
            //     touched partition left without rows is dropped after.
            engine.overwrite_partitions(&job.target, &out_names, &Sql::raw(format!("SELECT {out_list} FROM {MERGED}")))?;
            if let Some(pc) = &stored_by {
                let ty = target_cols.iter().find(|c| &c.name == pc).map(|c| c.ty.clone()).unwrap_or_default();
                let left: Vec<Value> = engine.query(&Sql::raw(format!("SELECT DISTINCT {} FROM {MERGED}", quote_ident(pc))))?.rows.into_iter().map(|mut r| r.remove(0)).collect();
                let replaced = if prune.is_some() { &touched } else { &whole_table_partitions };
                for v in replaced.iter().filter(|v| !matches!(v, Value::Null) && !left.contains(v)) {
                    engine.drop_partition_value(&job.target, pc, v, &ty)?;
                }
            }
            trace.step("overwrite");
        }
        opts.step(FailPoint::AfterInsert)?;

        // 11. The output: the batch's keys as the target now holds them.
        let fp = fingerprint_select(engine, Method::Native, "t", &output_cols)?;
        let mut sql = Sql::new();
        sql.push(&format!("SELECT {} FROM {} AS t JOIN {BATCH} AS b ON {}", fp.select, job.target.quoted(), keys_match("t", "b", &spec.key)));
        let output = fp.read(&engine.query(&sql)?.single("the output scan")?, engine)?;
        trace.step("output fp");

        if inserts + updates + deletes == 0 && !job.audits.is_empty() {
            // Nothing changes: the touched keys as they are.
            let scope = crate::run::audit::AuditScope { from: &touched_keys, previous_rows: None, run_date: run_date.date() };
            audits = crate::run::audit::audit(job, engine, &scope)?;
        }
        let mut report = RunReport::new(job, run_date, key, "committed", &input, &output);
        report.audits = audits;
        report.input_files = run_input.files.clone();
        report.rows_deleted = deletes;
        report.rows_inserted = inserts;
        report.rows_updated = updates;
        report.rows_unchanged = dedup_rows - inserts - updates - deletes;
        report.duplicates_collapsed = duplicates_collapsed;
        report.created_target = created_target;
        report.method = if prune.is_some() { "copy-on-write of touched partitions".into() } else { "copy-on-write of the table".into() };
        opts.step(FailPoint::BeforeCommit)?;
        ledger::record(engine, &entry(job, &job_hash, &report, started_at))?;
        trace.step("ledger row");
        report.elapsed_ms = crate::run::protocol::elapsed_ms(started);
        Ok(report)
    })
}
