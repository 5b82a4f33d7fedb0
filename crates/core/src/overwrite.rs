//! Plans for engines without multi-statement transactions (Spark on plain
//! parquet tables): nothing is deleted row by row; a run replaces whole
//! partitions, each replacement one statement that commits or leaves the
//! old partition as it was.
//!
//! `replace_partition`, under a lease on (job, target, date):
//! 1. the guards and the input fingerprint in one scan of the source;
//!    nothing has been written yet, so a refusal changes nothing;
//! 2. a retry whose run key and partition match the ledger's last entry is
//!    skipped;
//! 3. one `INSERT OVERWRITE` of the day (dynamic partition overwrite: the
//!    new files are written aside and swapped in when the job commits; a
//!    failed job leaves the old partition). The rows pass a second guard
//!    inside that statement (`raise_error` on a row of another date), so
//!    a source that changed since step 1 can never write outside the day;
//! 4. the day is fingerprinted as written and compared with the input;
//! 5. the ledger row is appended.
//!
//! What differs from a transactional engine, and is documented: the commit
//! point is step 3. A failure before it leaves the previous contents; a
//! failure after it (at 4 or 5) leaves the run's complete output without a
//! ledger row, which the next run finds, rewrites to the same fingerprint
//! and records. There is never a half-written day.
//!
//! `merge` is a copy-on-write of the partitions the batch touches: the
//! winners per key among the batch and those partitions' rows are
//! materialized, then written over those partitions in one statement.

use std::time::Instant;

use crate::date::RunDate;
use crate::engine::{fingerprint, fingerprint_select, Column, Engine, Filter, Scope};
use crate::error::{Error, FailPoint, Result};
use crate::fingerprint::{Fingerprint, Method};
use crate::ident::quote_ident;
use crate::ledger;
use crate::run::{describe_source, entry, first_row, skipped, RunInput, RunOptions, RunReport, Trace};
use crate::runkey::run_key;
use crate::spec::Job;
use crate::sql::{Sql, Value};

/// Runs `body` holding the lease of `scope` of `job`, released afterwards
/// whatever happens (a crash leaves it to expire).
pub(crate) fn leased<T>(engine: &mut dyn Engine, job: &Job, scope: &str, opts: &RunOptions, body: impl FnOnce(&mut dyn Engine) -> Result<T>) -> Result<T> {
    let key = format!("fixpoint:{}:{}:{scope}", job.name, job.target);
    if let Err(holder) = engine.acquire_lease(&key, !opts.no_wait)? {
        return Err(Error::Busy { message: format!("another run of job {} holds the lease on {} ({scope}): {holder}", job.name, job.target) });
    }
    let result = body(engine);
    if let Err(e) = engine.release_lease(&key) {
        // The run's outcome stands; the lease expires on its own.
        eprintln!("fixpoint: {}: could not release the lease on {} ({scope}): {e}; it expires on its own", job.name, job.target);
    }
    result
}

fn fingerprinted(cols: &[Column], metadata: &[String]) -> Vec<Column> {
    cols.iter().filter(|c| !metadata.contains(&c.name)).cloned().collect()
}

/// The native fingerprint's signature of `cols` (as `fingerprint_select` makes it).
fn signature_of(cols: &[Column]) -> Vec<String> {
    cols.iter().map(|c| format!("{} {}", c.name, c.ty)).collect()
}

fn one_row(engine: &mut dyn Engine, sql: &Sql, what: &str) -> Result<Vec<Value>> {
    engine.query(sql)?.rows.into_iter().next().ok_or_else(|| Error::Internal(format!("{what} returned no row")))
}

fn as_count(v: &Value) -> Result<u64> {
    v.as_u64().ok_or_else(|| Error::Internal(format!("bad count {v:?}")))
}

pub(crate) fn replace_partition_with(
    job: &Job,
    run_date: RunDate,
    engine: &mut dyn Engine,
    opts: &RunOptions,
    run_input: &RunInput,
    started: Instant,
) -> Result<RunReport> {
    let mut trace = Trace::new();
    let started_at = chrono::Utc::now().naive_utc();
    let partition = job.partition.as_deref().ok_or_else(|| Error::Internal("replace_partition without partition".into()))?;
    let mut params = run_input.params.clone();
    let day = Value::Date(run_date.date());

    let source_cols = describe_source(job, engine, &params)?;
    crate::run::check_source_columns(job, &source_cols, partition)?;

    // The target is looked at under the lease: a run that waited for
    // another sees what that one left (a table it created, say).
    leased(engine, job, &run_date.to_string(), opts, |engine| {
        let target_cols = engine.table_columns(&job.target)?;
        let added = crate::schema::reconcile(engine, job, &source_cols, target_cols.as_deref())?;
        if target_cols.is_some() && engine.partition_columns(&job.target)? != [partition.to_owned()] {
            return Err(Error::Schema {
                message: format!(
                    "{} is not stored partitioned by {partition}: on {} a run replaces the day's partition whole, and this table has none",
                    job.target,
                    engine.name()
                ),
                hint: Some(format!("recreate {} with PARTITIONED BY ({partition}), or drop it and let the first run create it", job.target)),
            });
        }
        let target_cols = target_cols.map(|mut cols| {
            cols.extend(added.iter().cloned());
            cols
        });
        let input_cols = fingerprinted(&source_cols, &job.metadata);
        let output_cols = match &target_cols {
            Some(cols) => fingerprinted(cols, &job.metadata),
            None => input_cols.clone(),
        };
        trace.step("describe");
        ledger::ensure(engine)?;
        let job_hash = job.definition_hash();
        let file_key = run_input.file_key(&job_hash, run_date);
        let scope = Scope::Table { table: &job.target, filter: Some(Filter::DateEquals(partition, run_date.date())) };

        // 1. Guards and the input fingerprint, in one scan of the source,
        //    before anything is written.
        let (select, kind, signature) = fingerprint_select(engine, Method::Native, "s", &input_cols)?;
        let mut sql = Sql::new();
        sql.push("SELECT ").push(&select).push(", count(*) FILTER (WHERE s.").ident(partition).push(" IS DISTINCT FROM ");
        sql.typed_param(day.clone(), "DATE").push(") FROM ");
        Scope::Source { template: job.source.template(), params: &params }.write_from(&mut sql, "s");
        let row = one_row(engine, &sql, "the guard scan")?;
        let input_rows = as_count(&row[0])?;
        let input = Fingerprint::from_sum(&kind, &signature, input_rows, engine.read_sum(&row[1])?);
        let outside = as_count(&row[2])?;
        if outside > 0 {
            let mut sql = Sql::new();
            sql.push("SELECT * FROM ");
            Scope::Source { template: job.source.template(), params: &params }.write_from(&mut sql, "s");
            sql.push(" WHERE s.").ident(partition).push(" IS DISTINCT FROM ");
            sql.typed_param(day.clone(), "DATE").push(" LIMIT 1");
            return Err(Error::OutOfPartition { rows: outside, column: partition.to_owned(), run_date: run_date.to_string(), sample: first_row(engine, &sql)? });
        }
        if let Some(min) = job.min_rows {
            if input_rows < min {
                return Err(Error::TooFewRows { rows: input_rows, min_rows: min, run_date: run_date.to_string() });
            }
        }
        let key = file_key.unwrap_or_else(|| run_key(&job_hash, run_date, &input));
        params.run_key = key.clone();
        trace.step("guards, input fp");

        // 2. A retry over the same input, the day still as recorded: nothing to do.
        // (The day is fingerprinted only when the ledger's last entry has
        // this run key; otherwise counted, for the report.)
        let last = match (&target_cols, opts.force) {
            (Some(_), false) => ledger::entries_of_existing(engine, Some(&job.name), Some(run_date), Some(1))?.into_iter().next(),
            _ => None,
        };
        let mut rows_before = None;
        if let Some(last) = last.filter(|l| l.run_key == key) {
            let now = fingerprint(engine, Method::Native, &scope, &output_cols)?;
            if last.fingerprint_kind == now.kind && last.output_rows == now.rows && last.output_checksum == now.checksum {
                return Ok(skipped(job, run_date, &key, &input, &now, started));
            }
            rows_before = Some(now.rows);
        }
        if let (None, Some(_)) = (rows_before, &target_cols) {
            let mut sql = Sql::new();
            sql.push("SELECT count(*) FROM ");
            scope.write_from(&mut sql, "fp");
            rows_before = Some(as_count(&one_row(engine, &sql, "the day's count")?[0])?);
        }
        trace.step("ledger, target fp");

        // Audits look at the day as it will be published: the source's
        // rows, before anything is written (a blocking failure then
        // changes nothing).
        let audits = if job.audits.is_empty() {
            Vec::new()
        } else {
            let from = |sql: &mut Sql| {
                sql.push("(SELECT * FROM ");
                Scope::Source { template: job.source.template(), params: &params }.write_from(sql, "s");
                sql.push(") AS a");
            };
            let audit_scope = crate::audit::AuditScope { from: &from, previous_rows: rows_before, run_date: run_date.date() };
            crate::audit::audit(job, engine, &audit_scope)?
        };
        opts.step(FailPoint::AfterGuards)?;

        // 3. Create the target when missing (partitioned by the day), add
        //    new columns, then replace the day in one statement.
        let created_target = target_cols.is_none();
        if created_target {
            engine.execute(&Sql::raw(format!("CREATE SCHEMA IF NOT EXISTS {}", quote_ident(&job.target.schema))))?;
            engine.create_table(&job.target, &source_cols, Some(partition))?;
        }
        crate::schema::append(engine, &job.target, &added)?;
        // The delete and the insert are one statement here: a fault at
        // either comes before it.
        opts.step(FailPoint::AfterDelete)?;
        opts.step(FailPoint::MidInsert)?;
        if input_rows == 0 {
            engine.drop_partition_value(&job.target, partition, &day, "DATE")?;
        } else {
            let mut sql = Sql::new();
            sql.push("SELECT ");
            for (i, c) in source_cols.iter().enumerate() {
                if i > 0 {
                    sql.push(", ");
                }
                if c.name == partition {
                    // The second guard: a row of another date fails the
                    // statement (and with it the whole overwrite).
                    sql.push("CASE WHEN s.").ident(partition).push(" IS DISTINCT FROM ").typed_param(day.clone(), "DATE");
                    sql.push(" THEN raise_error(").param(Value::Text(format!(
                        "fixpoint: a source row of job {} is not in the run's partition {partition} = {run_date} (the source changed during the run); nothing was overwritten",
                        job.name
                    )));
                    sql.push(") ELSE s.").ident(partition).push(" END");
                } else {
                    sql.push("s.").ident(&c.name);
                }
            }
            sql.push(" FROM ");
            Scope::Source { template: job.source.template(), params: &params }.write_from(&mut sql, "s");
            let names: Vec<String> = source_cols.iter().map(|c| c.name.clone()).collect();
            engine.overwrite_partitions(&job.target, &names, &sql)?;
        }
        trace.step("overwrite");
        opts.step(FailPoint::AfterInsert)?;

        // 4. The day as written: its fingerprint (over the target's
        //    columns, as recorded) and, in the same scan, over the source's
        //    columns in the source's order, which must be the input's.
        let (output, as_input) = {
            let (select, kind, signature) = fingerprint_select(engine, Method::Native, "fp", &output_cols)?;
            let check = input_cols.iter().all(|c| output_cols.iter().any(|o| o.name == c.name));
            let mut sql = Sql::new();
            sql.push("SELECT ").push(&select);
            if check && !input_cols.is_empty() {
                let hash = engine.native_row_hash("fp", &input_cols).unwrap_or_else(|| "0".into());
                sql.push(&format!(", sum({hash})"));
            }
            sql.push(" FROM ");
            scope.write_from(&mut sql, "fp");
            let row = one_row(engine, &sql, "the output scan")?;
            let rows = as_count(&row[0])?;
            let output = Fingerprint::from_sum(&kind, &signature, rows, engine.read_sum(&row[1])?);
            let as_input = match row.get(2) {
                Some(v) => Some(Fingerprint::from_sum(&input.kind, &signature_of(&input_cols), rows, engine.read_sum(v)?)),
                None => None,
            };
            (output, as_input)
        };
        trace.step("output fp");
        if output.rows != input_rows || as_input.is_some_and(|f| f != input) {
            return Err(Error::DataRefused {
                message: format!(
                    "the source of job {} changed while the run read it: it gave {input_rows} rows (checksum {}) and the partition {partition} = {run_date} now holds {} rows (checksum {}); the partition holds a complete later read of the source, and no ledger row was written",
                    job.name, input.checksum, output.rows, output.checksum
                ),
                hint: Some("run it again once the source is stable (the next run rewrites the day and records it)".into()),
            });
        }

        // 5. Record it.
        let mut report = RunReport::new(job, run_date, key, "committed", &input, &output);
        report.rows_deleted = rows_before.unwrap_or(0);
        report.rows_inserted = input_rows;
        report.created_target = created_target;
        report.audits = audits;
        report.input_files = run_input.files.clone();
        report.method = "partition overwrite".into();
        // The data is committed already; a failure here leaves the run's
        // output without its ledger row (the next run rewrites and records).
        opts.step(FailPoint::BeforeCommit)?;
        ledger::record(engine, &entry(job, &job_hash, &report, started_at))?;
        trace.step("ledger row");
        report.elapsed_ms = crate::run::elapsed_ms(started);
        Ok(report)
    })
}

const STAGE: &str = "\"__fixpoint_stage\"";
const DEDUP: &str = "\"__fixpoint_dedup\"";
const BATCH: &str = "\"__fixpoint_batch\"";
const MERGED: &str = "\"__fixpoint_merged\"";

/// The merge as a copy-on-write of the partitions the batch touches (the
/// whole table when it is not partitioned), with the semantics of the
/// transactional merge (see the `merge` module): newest version per key,
/// tombstone first at equal version, ties refused or ordered, older
/// upserts never resurrect a deleted key.
pub(crate) fn merge_with(job: &Job, run_date: RunDate, engine: &mut dyn Engine, opts: &RunOptions, run_input: &RunInput, started: Instant) -> Result<RunReport> {
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

fn merge_staged(job: &Job, run_date: RunDate, engine: &mut dyn Engine, opts: &RunOptions, run_input: &RunInput, started: Instant) -> Result<RunReport> {
    use crate::merge::{count, keys_match, q, rows_differ, tombstone_table, DELETED};
    use crate::spec::OnTie;
    let mut trace = Trace::new();
    let started_at = chrono::Utc::now().naive_utc();
    let spec = job.merge.as_ref().ok_or_else(|| Error::Internal("merge without merge keys".into()))?;
    let params = run_input.params.clone();
    let source_cols = describe_source(job, engine, &params)?;
    let has = |cols: &[Column], name: &str| cols.iter().any(|c| c.name == name);
    crate::merge::check_source(job, spec, &source_cols)?;
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
        let added = crate::schema::reconcile(engine, job, &source_cols, existing.as_deref())?;
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
        let mut sql = Sql::new();
        sql.push("SELECT s.*, ");
        match &spec.deleted {
            Some(pred) => sql.push(&format!("coalesce(({pred}), false)")),
            None => sql.push("false"),
        };
        sql.push(&format!(" AS {} FROM ", quote_ident(DELETED)));
        Scope::Source { template: job.source.template(), params: &params }.write_from(&mut sql, "s");
        engine.stage(STAGE, &sql).map_err(|e| crate::merge::deleted_error(job, spec, &source_cols, e))?;
        trace.step("stage");

        // 2. NULL keys and versions refused; the input fingerprint.
        let null_key = spec.key.iter().map(|k| format!("{} IS NULL", quote_ident(k))).collect::<Vec<_>>().join(" OR ");
        let (select, kind, signature) = fingerprint_select(engine, Method::Native, "s", &input_cols)?;
        let row = one_row(
            engine,
            &Sql::raw(format!("SELECT {select}, count(*) FILTER (WHERE {null_key}), count(*) FILTER (WHERE {version} IS NULL) FROM {STAGE} AS s")),
            "the stage scan",
        )?;
        let input_rows = as_count(&row[0])?;
        let input = Fingerprint::from_sum(&kind, &signature, input_rows, engine.read_sum(&row[1])?);
        crate::merge::refuse_nulls(engine, spec, STAGE, &source_list, as_count(&row[2])?, as_count(&row[3])?)?;
        let job_hash = job.definition_hash();
        let key = run_input.file_key(&job_hash, run_date).unwrap_or_else(|| run_key(&job_hash, run_date, &input));

        // 3. One row per key: newest version, tombstone first at equal
        //    version, then the values' total order.
        engine.stage(DEDUP, &Sql::raw(crate::merge::dedup_sql(spec, &names, &compared, &meta_cols, STAGE)))?;
        let dedup_rows = count(engine, &Sql::raw(format!("SELECT count(*) FROM {DEDUP}")))?[0];
        let duplicates_collapsed = input_rows - dedup_rows;
        trace.step("dedup");

        // 4. Ties inside the batch.
        if spec.on_tie == OnTie::Error {
            let tie_cond = crate::merge::batch_tie_cond(spec, &compared);
            let ties = count(engine, &Sql::raw(format!("SELECT count(*) FROM {DEDUP} AS b WHERE EXISTS (SELECT 1 FROM {STAGE} AS s WHERE {tie_cond})")))?[0];
            if ties > 0 {
                return Err(crate::merge::tie_error(engine, spec, &names, STAGE, DEDUP, &tie_cond, ties)?);
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
            OnTie::Deterministic => format!(" OR (b.{version} = t.{version} AND {})", crate::merge::sorts_before("b", "t", &compared)),
            OnTie::Error => String::new(),
        });
        let first_key = q("t", &spec.key[0]);
        let matched = format!("{first_key} IS NOT NULL");
        let is_update = format!("{matched} AND NOT {del} AND {newer}");
        let is_delete = format!("{matched} AND {del} AND b.{version} >= t.{version}");
        let is_insert = format!("{first_key} IS NULL AND NOT {del}");
        let mut sql = Sql::new();
        sql.push(&format!(
            "SELECT count(*) FILTER (WHERE {is_insert}), count(*) FILTER (WHERE {is_update}), count(*) FILTER (WHERE {is_delete}), \
             count(*) FILTER (WHERE {matched} AND NOT {del} AND b.{version} = t.{version} AND ({})), \
             count(*) FILTER (WHERE {matched} AND NOT ({in_scope})) \
             FROM {BATCH} AS b LEFT JOIN {target_rel} AS t ON {}",
            rows_differ("b", "t", &compared),
            keys_match("t", "b", &spec.key)
        ));
        sql.params.extend(prune_sql.params.iter().cloned());
        let row = one_row(engine, &sql, "the classification")?;
        let n = |i: usize| as_count(&row[i]);
        let (inserts, updates, deletes, cross_ties, moved) = (n(0)?, n(1)?, n(2)?, n(3)?, n(4)?);
        trace.step("classify");
        if moved > 0 {
            let p = prune.expect("moved only counted when pruning");
            return Err(crate::merge::moved_error(engine, job, spec, p, BATCH, &in_scope, &prune_sql.params, moved)?);
        }
        if spec.on_tie == OnTie::Error && cross_ties > 0 {
            let on = Sql::raw(keys_match("t", "b", &spec.key));
            return Err(crate::merge::cross_tie_error(engine, job, spec, BATCH, &on, &compared, cross_ties)?);
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
        crate::schema::append(engine, &job.target, &added)?;
        let target_cols = engine.table_columns(&job.target)?.unwrap_or_default();
        let output_cols: Vec<Column> = target_cols.iter().filter(|c| !is_meta(&c.name)).cloned().collect();
        let mut audits = Vec::new();
        if inserts + updates + deletes > 0 {
            // 8. The batch's tombstones first: a failure after this point
            //    and before the rewrite leaves them recorded with the key
            //    still in the target, which the retry deletes (it re-applies
            //    a tombstone at its own version).
            if spec.deleted.is_some() && count(engine, &Sql::raw(format!("SELECT count(*) FROM {BATCH} AS b WHERE {del}")))?[0] > 0 {
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
                before.push("SELECT count(*) FROM ");
                touched_keys(&mut before);
                let previous = count(engine, &before)?[0];
                let scope = crate::audit::AuditScope { from: &from, previous_rows: Some(previous), run_date: run_date.date() };
                audits = crate::audit::audit(job, engine, &scope)?;
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
        let (select, okind, osig) = fingerprint_select(engine, Method::Native, "t", &output_cols)?;
        let mut sql = Sql::new();
        sql.push(&format!("SELECT {select} FROM {} AS t JOIN {BATCH} AS b ON {}", job.target.quoted(), keys_match("t", "b", &spec.key)));
        let row = one_row(engine, &sql, "the output scan")?;
        let output = Fingerprint::from_sum(&okind, &osig, as_count(&row[0])?, engine.read_sum(&row[1])?);
        trace.step("output fp");

        if inserts + updates + deletes == 0 && !job.audits.is_empty() {
            // Nothing changes: the touched keys as they are.
            let scope = crate::audit::AuditScope { from: &touched_keys, previous_rows: None, run_date: run_date.date() };
            audits = crate::audit::audit(job, engine, &scope)?;
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
        report.elapsed_ms = crate::run::elapsed_ms(started);
        Ok(report)
    })
}
