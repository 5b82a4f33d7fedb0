//! The history plan. On an engine with transactions every step is in the
//! run's transaction, so a failure anywhere leaves the table, its log and
//! the ledger as they were. On an engine that replaces a table's rows in
//! one atomic step (Delta), the same steps run under the run's lease, and
//! the table and its log are each changed by one [`Leases::replace_rows`]
//! of the rows the run recomputes, published with the ledger row (Delta:
//! the target's commit records the log's, see the engine). On an engine
//! whose writes land one by one (Spark: the partitions holding the rows
//! rewritten), the log and the table are written in an order that keeps
//! every entry of the version log stored at every point (see
//! [`Run::write_leased`]), so a failure between two writes loses nothing
//! and the retry converges.

use std::time::Instant;

use crate::engine::measure::{fingerprint_select, FingerprintSelect, FP_ROWS, FP_SUM};
use crate::engine::{Column, Engine, Leases};
use crate::error::{AuditResult, Error, FailPoint, Result};
use crate::fingerprint::runkey::run_key;
use crate::fingerprint::{Fingerprint, Method};
use crate::job::ident::{quote_ident, TableName};
use crate::job::spec::{HistorySpec, Job, MergeSpec, OnTie};
use crate::job::sql::{RunParams, Sql, Value};
use crate::plans::history::sql::{log_table, Cols, AFTER, ALL, BATCH, CUT, FROM, HAS_NEW, HAS_OLD, KEYS, LOG_GONE, MATCH, NEW, NEW_PREFIX, ORIGIN, SAME, STAGE, START, SUMMARY, SUMMARY_ROWS, SUMMARY_SUM, TAIL, TAIL_ALL, TO};
use crate::plans::merge::refusals::{check_source, deleted_error};
use crate::plans::merge::sql::{count, keys_match, q, DELETED};
use crate::plans::merge::steps::{flagged_source, scan_stage};
use crate::run::input::{describe_source, RunInput};
use crate::run::ledger;
use crate::run::protocol::{elapsed_ms, fence, in_transaction, RunOptions, Trace};
use crate::run::report::{entry, skipped, RunReport};
use crate::run::sqlerror::first_row;
use crate::job::date::RunDate;

/// The engine's leased plans (the run is leased: they exist).
fn leases(engine: &mut dyn Engine) -> Result<&mut dyn Leases> {
    engine.leases().ok_or_else(|| Error::Internal("a leased history run on an engine without leases".into()))
}

/// What a run changed in the table: rows removed, given a new end,
/// inserted, and left as they were among those it recomputed.
struct Written {
    deleted: u64,
    updated: u64,
    inserted: u64,
    kept: u64,
}

/// What step 4 plans to change (see [`Run::plan_writes`]).
struct Planned {
    retimed: u64,
    gone: u64,
    log_gone: u64,
    inserts: u64,
    kept: u64,
}

/// The name of the checks every run makes of the rows it wrote.
const WELL_FORMED: &str = "history_well_formed";

/// What the run knows before it starts writing.
struct Run<'a> {
    job: &'a Job,
    spec: &'a MergeSpec,
    h: &'a HistorySpec,
    cols: Cols<'a>,
    run_date: RunDate,
    opts: &'a RunOptions,
    run_input: &'a RunInput,
    params: RunParams,
    /// The source query's columns.
    described: Vec<Column>,
    /// An entry's columns: the source's, and a snapshot history's version.
    source_cols: Vec<Column>,
    added: Vec<Column>,
    created_target: bool,
    /// The target's columns, once it is prepared.
    target_cols: Vec<Column>,
    version_type: String,
    log: TableName,
    job_hash: String,
    trace: Trace,
    /// Under a lease ([`Leases`]), not in a transaction.
    leased: bool,
    /// The column the table and its log are stored partitioned by, where
    /// the engine rewrites whole partitions (Spark).
    stored_by: Option<String>,
}

pub(super) fn history_with(job: &Job, run_date: RunDate, engine: &mut dyn Engine, opts: &RunOptions, run_input: &RunInput, started: Instant) -> Result<RunReport> {
    let started_at = chrono::Utc::now().naive_utc();
    let spec = job.merge.as_ref().ok_or_else(|| Error::Internal("history without keys".into()))?;
    let h = job.history.as_ref().ok_or_else(|| Error::Internal("history without its columns".into()))?;
    let mut trace = Trace::new();
    let params = run_input.params.clone();
    let described = describe_source(job, engine, &params)?;
    check_history_source(job, h, &described)?;
    let mut source_cols = described.clone();
    if h.snapshot {
        source_cols.push(Column { name: h.valid_from.clone(), ty: "TIMESTAMP".into() });
    }
    check_source(job, spec, &source_cols)?;
    let version_type = source_cols.iter().find(|c| c.name == spec.version).map(|c| c.ty.clone()).expect("checked");
    let target_cols = engine.table_columns(&job.target)?;
    let existing = match &target_cols {
        Some(t) => Some(check_target(job, h, t, &version_type)?),
        None => None,
    };
    let added = crate::run::schema::reconcile(engine, job, &described, existing.as_deref())?;
    let stored_by = match engine.leases() {
        Some(leases) if !leases.replaces_rows() => Some(storage_partition(job, leases, target_cols.is_some(), &source_cols)?),
        _ => None,
    };
    trace.step("describe");
    let names: Vec<String> = source_cols.iter().map(|c| c.name.clone()).collect();
    let is_meta = |c: &String| job.metadata.contains(c);
    let compared: Vec<String> = names.iter().filter(|c| !spec.key.contains(c) && **c != spec.version && !is_meta(c)).cloned().collect();
    let tracked = if h.track.is_empty() { compared.clone() } else { h.track.clone() };
    let meta: Vec<String> = names.iter().filter(|c| is_meta(c)).cloned().collect();
    let mut run = Run {
        job,
        spec,
        h,
        cols: Cols { spec, h, names, compared, tracked, meta, types: source_cols.clone(), materialized: engine.dialect().materialized(), batch: BATCH },
        run_date,
        opts,
        run_input,
        params,
        described,
        source_cols,
        added,
        created_target: target_cols.is_none(),
        target_cols: Vec::new(),
        version_type,
        log: log_table(&job.target),
        job_hash: job.definition_hash(),
        trace,
        leased: engine.leases().is_some(),
        stored_by,
    };
    let report = if run.leased {
        // No transaction rolls the staged relations back: dropped here
        // whatever the outcome (Spark's copies are tables).
        let result = run.run(engine, started_at);
        if result.is_err() {
            if let Err(e) = run.drop_temps(engine) {
                eprintln!("fixpoint: {}: could not drop the run's staged relations: {e}", job.name);
            }
        }
        result?
    } else {
        in_transaction(engine, |engine| run.run(engine, started_at))?
    };
    run.trace.step("commit");
    Ok(RunReport { elapsed_ms: elapsed_ms(started), ..report })
}

/// On an engine that rewrites whole partitions (Spark), the one column the
/// table and its log are stored partitioned by: the existing table's, else
/// the job's `partition` (the table is created so). A run rewrites the
/// partitions holding the keys its batch touches, so a column of the key
/// keeps that to the batch's keys' partitions.
fn storage_partition(job: &Job, leases: &mut dyn Leases, exists: bool, source_cols: &[Column]) -> Result<String> {
    let engine = leases.name();
    let first_key = job.merge.as_ref().and_then(|m| m.key.first()).cloned().unwrap_or_default();
    let p = if exists {
        match leases.partition_columns(&job.target)?.as_slice() {
            [p] => {
                if let Some(wanted) = job.partition.as_ref().filter(|w| *w != p) {
                    return Err(Error::Schema {
                        message: format!("{} is stored partitioned by {p}, but the job's `partition` is {wanted}; nothing was changed", job.target),
                        hint: Some(format!("set partition = \"{p}\" in the job, or recreate {} partitioned by {wanted}", job.target)),
                    });
                }
                p.clone()
            }
            [] => {
                return Err(Error::Schema {
                    message: format!(
                        "{} is not partitioned: on {engine} a history's rows are rewritten partition by partition, and only a partitioned table is rewritten without first deleting its files; nothing was changed",
                        job.target
                    ),
                    hint: Some(format!("recreate {} with PARTITIONED BY ({first_key}) (a column of the key keeps each key's rows in one partition), or point `target` at a new table and set partition = \"{first_key}\"", job.target)),
                })
            }
            many => {
                return Err(Error::Schema {
                    message: format!("{} is partitioned by {} columns ({}): on {engine} a history rewrites partitions of one column; nothing was changed", job.target, many.len(), many.join(", ")),
                    hint: Some(format!("recreate {} partitioned by one column of the key, e.g. {first_key}", job.target)),
                })
            }
        }
    } else {
        job.partition.clone().ok_or_else(|| {
            job.spec_error(
                "partition",
                format!("missing: on {engine} a history table is stored partitioned by a column, and a run rewrites the partitions that hold the keys its batch touches"),
                format!("set partition = \"{first_key}\" (a column of the key keeps each key's rows in one partition; for many keys, select a bucket such as pmod(hash({first_key}), 64) AS bucket, add it to `key` and partition by it)"),
            )
        })?
    };
    if !source_cols.iter().any(|c| c.name == p) {
        return Err(Error::Schema {
            message: format!("{} is partitioned by {p}, which the source query does not return; its log (the versions the table cannot show) must be partitioned by it too; nothing was changed", job.target),
            hint: Some(format!("select {p} in the source query")),
        });
    }
    let log = log_table(&job.target);
    if leases.table_columns(&log)?.is_some() {
        let parts = leases.partition_columns(&log)?;
        if parts != [p.clone()] {
            return Err(Error::Schema {
                message: format!("the history's log {log} is partitioned by ({}), not by {p} as {} is; nothing was changed", parts.join(", "), job.target),
                hint: Some(format!("rewrite the log partitioned by {p} (CREATE TABLE … PARTITIONED BY ({p}) AS SELECT * FROM {log}, then swap the names); it holds versions the table cannot show, so do not drop it")),
            });
        }
    }
    Ok(p)
}

/// The tracked columns are the source's; the interval's columns are not.
fn check_history_source(job: &Job, h: &HistorySpec, source_cols: &[Column]) -> Result<()> {
    let has = |name: &str| source_cols.iter().any(|c| c.name == name);
    let list = || source_cols.iter().map(|c| c.name.as_str()).collect::<Vec<_>>().join(", ");
    if let Some(missing) = h.track.iter().find(|c| !has(c)) {
        return Err(job.spec_error(
            "track",
            format!("the source query has no column {missing:?} to track (it returns {}); nothing was changed", list()),
            "track columns the source returns, or select the column in the source query".into(),
        ));
    }
    for (k, c) in [("valid_from", &h.valid_from), ("valid_to", &h.valid_to)] {
        if has(c) {
            return Err(job.spec_error(
                k,
                format!("the source query returns a column {c:?}, which is the interval column fixpoint writes; nothing was changed"),
                format!("rename that column in the source query, or set `{k}` to another name for the interval column"),
            ));
        }
    }
    Ok(())
}

/// An existing target must be a history table: the interval's two columns,
/// of the version's type. Returns its other columns (the source's).
fn check_target(job: &Job, h: &HistorySpec, target: &[Column], version_type: &str) -> Result<Vec<Column>> {
    let family = crate::run::schema::type_family;
    for c in [&h.valid_from, &h.valid_to] {
        match target.iter().find(|t| &t.name == c) {
            None => {
                return Err(Error::Schema {
                    message: format!(
                        "the target {} has no column {c:?}, so it is not a history table (a history keeps each version as a row from {} to {}); nothing was changed",
                        job.target, h.valid_from, h.valid_to
                    ),
                    hint: Some(format!(
                        "point `target` at a new table (the first run creates it), or add the columns {} and {} of the version's type ({version_type}) — a table loaded another way needs its intervals filled first",
                        h.valid_from, h.valid_to
                    )),
                })
            }
            Some(t) if family(&t.ty) != family(version_type) => {
                return Err(Error::Schema {
                    message: format!("the target's {c} is {}, but the version column {} is {version_type}: an interval must have the version's type; nothing was changed", t.ty, job.merge.as_ref().map(|m| m.version.as_str()).unwrap_or("?")),
                    hint: Some(format!("cast the version in the source query to {}, or migrate the target's {c}", t.ty)),
                })
            }
            Some(_) => {}
        }
    }
    Ok(target.iter().filter(|t| t.name != h.valid_from && t.name != h.valid_to).cloned().collect())
}

impl Run<'_> {
    fn run(&mut self, engine: &mut dyn Engine, started_at: chrono::NaiveDateTime) -> Result<RunReport> {
        let started = Instant::now();
        fence(engine, self.job, "all", self.opts)?;
        ledger::ensure(engine)?;
        let last = self.last_entry(engine)?;
        self.prepare(engine)?;
        self.target_cols = engine.table_columns(&self.job.target)?.ok_or_else(|| Error::Internal(format!("{} vanished after it was prepared", self.job.target)))?;
        self.trace.step("prepare");
        let input = self.stage(engine)?;
        let key = self.run_input.file_key(&self.job_hash, self.run_date).unwrap_or_else(|| run_key(&self.job_hash, self.run_date, &input));
        self.opts.run_key_known(self.job, self.run_date, &key);
        let batch_rows = self.dedup(engine)?;
        if let Some(hint) = engine.dialect().plan_key_lookups() {
            engine.query(&Sql::raw(hint.to_owned()))?;
        }
        // The touched keys; in one read of their rows, those the run can
        // change and the fingerprint of them all as the table holds them;
        // where each key's recomputed rows start.
        let (target, log) = (self.job.target.quoted(), self.log.quoted());
        // The touched keys as a relation of their own: what a snapshot's
        // run reads its rows by, and what the audits read (a run with a
        // version column reads its rows by the batch).
        if self.h.snapshot {
            self.make(engine, KEYS, &self.cols.snapshot_keys(&target, &log, &self.day(), self.h.absent_deletes))?;
        } else if !self.job.audits.is_empty() {
            self.make(engine, KEYS, &Sql::raw(self.cols.batch_keys()))?;
        }
        let fp = self.output_select(engine)?;
        let columns: Vec<String> = self.target_cols.iter().map(|c| c.name.clone()).collect();
        let tail = if self.h.snapshot { self.cols.snapshot_tail(&target, &self.day(), &columns, &fp.select) } else { self.cols.tail(&target, &columns, &fp.select) };
        let before = if self.leased {
            self.make(engine, TAIL_ALL, &tail)?;
            let before = self.summary(engine, TAIL_ALL)?;
            self.make(engine, TAIL, &Sql::raw(format!("SELECT * FROM {TAIL_ALL} WHERE NOT \"{SUMMARY}\"")))?;
            before
        } else {
            engine.create_temp_table_as(TAIL, &tail)?;
            self.summary(engine, TAIL)?
        };
        self.trace.step("tail");
        if let Some(last) = last.filter(|l| l.run_key == key && l.fingerprint_kind == input.kind) {
            let now = fp.of(before.0, before.1);
            if now.rows == last.output_rows && now.checksum == last.output_checksum {
                self.cleanup(engine)?;
                return Ok(skipped(self.job, self.run_date, &key, &input, &now, started));
            }
        }
        let cut = if self.h.snapshot { self.cols.snapshot_cut(TAIL, &self.day()) } else { Sql::raw(self.cols.cut(TAIL)) };
        self.make(engine, CUT, &cut)?;
        self.trace.step("cut");
        self.resolve(engine)?;
        self.opts.step(FailPoint::AfterGuards)?;
        let Written { deleted, updated, inserted, kept } = if self.leased { self.write_leased(engine)? } else { self.write(engine)? };
        // The touched keys' rows as written: those the run did not read,
        // as they were, and the tail as the run leaves it.
        let (checks, (tail_rows, tail_sum), (after_rows, after_sum)) = self.well_formed(engine, &fp)?;
        let rows = u64::try_from(i128::from(before.0) - tail_rows + after_rows)
            .map_err(|_| Error::Internal(format!("the touched keys of {} would hold fewer than no rows after the run; rolled back, nothing changed", self.job.target)))?;
        let output = fp.of(rows, before.1 - tail_sum + after_sum);

        let mut audits = vec![checks];
        audits.extend(self.audit(engine)?);
        let mut report = RunReport::new(self.job, self.run_date, key, "committed", &input, &output);
        report.audits = audits;
        report.input_files = self.run_input.files.clone();
        report.rows_deleted = deleted;
        report.rows_inserted = inserted;
        report.rows_updated = updated;
        report.rows_unchanged = kept;
        report.duplicates_collapsed = input.rows - batch_rows;
        report.created_target = self.created_target;
        report.method = "history".into();
        if self.leased {
            // The ledger row publishes the run's changes: the last point
            // where a failure leaves everything as it was.
            self.opts.step(FailPoint::BeforeCommit)?;
        }
        ledger::record(engine, &entry(self.job, &self.job_hash, &report, started_at))?;
        self.trace.step("ledger");
        if !self.leased {
            self.opts.step(FailPoint::BeforeCommit)?;
        }
        self.cleanup(engine)?;
        Ok(report)
    }

    /// The ledger's last entry for this job and date (none with `--force`,
    /// or before the target exists).
    fn last_entry(&mut self, engine: &mut dyn Engine) -> Result<Option<ledger::Entry>> {
        if self.opts.force || self.created_target {
            return Ok(None);
        }
        let last = ledger::entries_of_existing(engine, Some(&self.job.name), Some(self.run_date), Some(1))?.into_iter().next();
        self.trace.step("ledger lookup");
        Ok(last)
    }

    /// The target and its log, created or given the source's new columns.
    /// A target this run creates starts with an empty log. Under a lease
    /// the engine creates them with the run's first write.
    fn prepare(&mut self, engine: &mut dyn Engine) -> Result<()> {
        let (job, h) = (self.job, self.h);
        crate::run::schema::append(engine, &job.target, &self.added)?;
        let cols: Vec<String> = self.source_cols.iter().map(|c| format!("{} {}", quote_ident(&c.name), c.ty)).collect();
        if self.created_target {
            engine.execute(&Sql::raw(format!("CREATE SCHEMA IF NOT EXISTS {}", quote_ident(&job.target.schema))))?;
            // A snapshot history's version column is valid_from itself.
            let interval: Vec<Column> =
                [&h.valid_from, &h.valid_to].into_iter().filter(|c| !h.snapshot || *c != &h.valid_from).map(|c| Column { name: c.clone(), ty: self.version_type.clone() }).collect();
            if self.leased {
                let columns: Vec<Column> = self.source_cols.iter().chain(&interval).cloned().collect();
                leases(engine)?.create_table(&job.target, &columns, self.stored_by.as_deref())?;
            } else {
                let interval: Vec<String> = interval.iter().map(|c| format!("{} {}", quote_ident(&c.name), c.ty)).collect();
                engine.execute(&Sql::raw(format!("CREATE TABLE {} ({}, {})", job.target.quoted(), cols.join(", "), interval.join(", "))))?;
            }
        }
        match engine.table_columns(&self.log)? {
            None if self.leased => {
                let columns: Vec<Column> = self.source_cols.iter().cloned().chain([Column { name: DELETED.into(), ty: "BOOLEAN".into() }]).collect();
                leases(engine)?.create_table(&self.log, &columns, self.stored_by.as_deref())?;
            }
            None => {
                engine.execute(&Sql::raw(format!("CREATE TABLE {} ({}, {} BOOLEAN)", self.log.quoted(), cols.join(", "), quote_ident(DELETED))))?;
            }
            Some(log_cols) => {
                let missing: Vec<Column> = self.source_cols.iter().filter(|c| !log_cols.iter().any(|l| l.name == c.name)).cloned().collect();
                crate::run::schema::append(engine, &self.log, &missing)?;
                if self.created_target && self.leased {
                    let names: Vec<String> = self.source_cols.iter().map(|c| c.name.clone()).chain([DELETED.to_owned()]).collect();
                    let none = format!("SELECT {} FROM {} WHERE false", names.iter().map(|c| quote_ident(c)).collect::<Vec<_>>().join(", "), self.log.quoted());
                    leases(engine)?.replace_rows(&self.log, &names, &Sql::raw("true"), &Sql::raw(none))?;
                } else if self.created_target {
                    engine.execute(&Sql::raw(format!("DELETE FROM {}", self.log.quoted())))?;
                }
            }
        }
        Ok(())
    }

    /// 1. The source staged once with its tombstone flag; NULL keys and
    ///    versions refused, the input fingerprint taken in the same scan.
    fn stage(&mut self, engine: &mut dyn Engine) -> Result<Fingerprint> {
        self.drop_temps(engine)?;
        let sql = if self.h.snapshot { self.snapshot_source() } else { flagged_source(self.job, self.spec, &self.params) };
        self.make(engine, STAGE, &sql).map_err(|e| deleted_error(self.job, self.spec, &self.described, e))?;
        self.trace.step("stage");
        let input_cols: Vec<Column> = self.described.iter().filter(|c| !self.job.metadata.contains(&c.name)).cloned().collect();
        let input = scan_stage(engine, self.spec, STAGE, &self.cols.names_list(), &input_cols)?;
        self.trace.step("null check, input fp");
        Ok(input)
    }

    /// 2. One entry per key and version; with `on_tie = "error"` two
    ///    different upserts of a key at one version refused. Returns the
    ///    batch's entries.
    fn dedup(&mut self, engine: &mut dyn Engine) -> Result<u64> {
        // A source with one row per key and version (the usual day) is the
        // batch as it is: nothing to pick, no tie possible.
        let (groups, dups) = self.duplicates(engine, STAGE)?;
        if dups == 0 {
            self.cols.batch = STAGE;
            self.trace.step("dedup");
            return Ok(groups);
        }
        self.cols.batch = BATCH;
        self.make(engine, BATCH, &Sql::raw(self.cols.first_per_version(STAGE, &[])))?;
        let rows = count(engine, &Sql::raw(format!("SELECT count(*) AS \"n\" FROM {BATCH}")))?;
        if self.spec.on_tie == OnTie::Error {
            let tie = self.cols.tie("a", "b");
            if let Some(e) = self.tie_error(engine, STAGE, BATCH, &tie, "in the batch")? {
                return Err(e);
            }
        }
        self.trace.step("dedup");
        Ok(rows)
    }

    /// How many keys and versions `from` holds entries of, and of those how
    /// many more than one.
    fn duplicates(&self, engine: &mut dyn Engine, from: &str) -> Result<(u64, u64)> {
        let rows = engine.query(&Sql::raw(self.cols.duplicates(from)))?;
        let row = rows.single("the entries per key and version")?;
        Ok((row.count("groups")?, row.count("dups")?))
    }

    /// 3. The touched keys' entries from where the run recomputes, with
    ///    the batch's, resolved (a tie with a recorded version refused with
    ///    `on_tie = "error"`) and walked into rows and hidden entries.
    fn resolve(&mut self, engine: &mut dyn Engine) -> Result<()> {
        // The window (the touched keys' rows from where the run recomputes)
        // is TAIL itself: every row of TAIL holds or ends at the key's cut
        // or starts after it, and the cut's first version is the earliest
        // start among them.
        let all = if self.h.snapshot {
            // The next committed snapshot after this one: a key of this
            // batch it lacks was absent from it.
            let next = match self.h.absent_deletes {
                true => ledger::next_committed_date(engine, &self.job.name, self.run_date)?.map(|d| Value::Timestamp(d.date().and_time(chrono::NaiveTime::MIN))),
                false => None,
            };
            self.cols.snapshot_all(TAIL, TAIL, &self.log.quoted(), &self.day(), self.h.absent_deletes, next.as_ref())
        } else {
            Sql::raw(self.cols.all(TAIL, &self.log.quoted()))
        };
        self.make(engine, ALL, &all)?;
        self.trace.step("entries");
        // Where every key and version has one entry, there is nothing to
        // pick and no tie.
        let (_, dups) = self.duplicates(engine, ALL)?;
        // A snapshot history's run owns its version: nothing recorded there is kept to tie with.
        if dups > 0 && self.spec.on_tie == OnTie::Error && !self.h.snapshot {
            let tie = format!("{} AND a.\"{ORIGIN}\" <> 1 AND b.\"{ORIGIN}\" = 1", self.cols.tie("a", "b"));
            if let Some(e) = self.tie_error(engine, ALL, ALL, &tie, "between the batch and the history")? {
                return Err(e);
            }
        }
        self.trace.step("ties");
        let resolved = match dups {
            0 => format!("(SELECT {}, {} FROM {ALL}) AS r", self.cols.names_list(), quote_ident(DELETED)),
            _ => format!("({}) AS r", self.cols.first_per_version(ALL, &[])),
        };
        self.make(engine, NEW, &Sql::raw(self.cols.walk(&resolved, &self.version_type)))?;
        self.trace.step("resolve");
        Ok(())
    }

    /// A row (or entry) `a` and a new one `n` alike in key and values.
    fn same(&self, a: &str, n: &str) -> String {
        format!("{} AND {}", keys_match(a, n, &self.spec.key), self.alike(a, n))
    }

    /// `a` and `n` alike in every column but the key (`true` when there is
    /// none).
    fn alike(&self, a: &str, n: &str) -> String {
        self.cols
            .names
            .iter()
            .filter(|c| !self.spec.key.contains(c))
            .map(|c| format!("{} IS NOT DISTINCT FROM {}", q(a, c), q(n, c)))
            .chain(["true".to_owned()])
            .collect::<Vec<_>>()
            .join(" AND ")
    }

    /// `alias`'s key columns and `col`, as a select list.
    fn key_and(&self, alias: &str, col: &str) -> String {
        self.spec.key.iter().map(|k| q(alias, k)).chain([q(alias, col)]).collect::<Vec<_>>().join(", ")
    }

    /// `a` and `b` alike in key and `col`.
    fn on(&self, a: &str, b: &str, col: &str) -> String {
        format!("{} AND {} = {}", keys_match(a, b, &self.spec.key), q(a, col), q(b, col))
    }

    /// The plan of step 4: [`MATCH`], the window's rows matched with the
    /// new rows by key and start (unique in a well-formed table), and the
    /// log's entries no new entry keeps ([`LOG_GONE`]). A pair alike in
    /// every column is a row kept, or given its new end (retimed); the
    /// window's other rows are removed (gone), the other new rows inserted.
    fn plan_writes(&mut self, engine: &mut dyn Engine) -> Result<Planned> {
        let (vf, vt) = (&self.h.valid_from, &self.h.valid_to);
        let first_key = &self.spec.key[0];
        let old_cols = self.target_cols.iter().map(|c| q("t", &c.name)).collect::<Vec<_>>().join(", ");
        let new_cols = self.cols.names.iter().map(|c| format!("{} AS {}", q("n", c), quote_ident(&format!("{NEW_PREFIX}{c}")))).collect::<Vec<_>>().join(", ");
        let alike = self.alike("t", "n");
        // Joined on equalities only (a FULL JOIN needs them on PostgreSQL);
        // the other columns decide SAME.
        self.make(
            engine,
            MATCH,
            &Sql::raw(format!(
                "SELECT {old_cols}, {new_cols}, n.\"{TO}\", t.{k} IS NOT NULL AS \"{HAS_OLD}\", n.{k} IS NOT NULL AS \"{HAS_NEW}\", \
                 CASE WHEN t.{k} IS NOT NULL AND n.{k} IS NOT NULL AND {alike} THEN true ELSE false END AS \"{SAME}\" \
                 FROM {TAIL} AS t FULL JOIN (SELECT * FROM {NEW} WHERE \"{START}\") AS n ON {} AND {} = {}",
                keys_match("t", "n", &self.spec.key),
                q("t", vf),
                q("n", &self.spec.version),
                k = quote_ident(first_key),
            )),
        )?;
        let vt = quote_ident(vt);
        let counts = engine.query(&Sql::raw(format!(
            "SELECT count(*) FILTER (WHERE \"{SAME}\" AND {vt} IS DISTINCT FROM \"{TO}\") AS \"retimed\", \
             count(*) FILTER (WHERE \"{SAME}\" AND {vt} IS NOT DISTINCT FROM \"{TO}\") AS \"kept\", \
             count(*) FILTER (WHERE \"{HAS_OLD}\" AND NOT \"{SAME}\") AS \"gone\", \
             count(*) FILTER (WHERE \"{HAS_NEW}\" AND NOT \"{SAME}\") AS \"inserts\" FROM {MATCH}"
        )))?;
        let row = counts.single("the history's plan")?;
        let (retimed, kept, gone, inserts) = (row.count("retimed")?, row.count("kept")?, row.count("gone")?, row.count("inserts")?);
        let del = quote_ident(DELETED);
        let version = &self.spec.version;
        let entry_kept = format!("EXISTS (SELECT 1 FROM {NEW} AS n WHERE NOT n.\"{START}\" AND n.{del} = l.{del} AND {})", self.same("l", "n"));
        let log_gone = self.made(
            engine,
            LOG_GONE,
            &format!("SELECT {} FROM {} AND NOT {entry_kept}", self.key_and("l", version), self.cols.window_from(&self.log.quoted(), "l", version)),
        )?;
        self.trace.step("plan");
        Ok(Planned { retimed, gone, log_gone, inserts, kept })
    }

    /// In [`MATCH`] (alias `m`): a row of the window the run removes.
    fn gone(m: &str) -> String {
        format!("{m}.\"{HAS_OLD}\" AND NOT {m}.\"{SAME}\"")
    }

    /// In [`MATCH`] (alias `m`): a row of the window given a new end.
    fn retimed(&self, m: &str) -> String {
        format!("{m}.\"{SAME}\" AND {} IS DISTINCT FROM {m}.\"{TO}\"", q(m, &self.h.valid_to))
    }

    /// In [`MATCH`] (alias `m`): a new row the run inserts.
    fn inserted(m: &str) -> String {
        format!("{m}.\"{HAS_NEW}\" AND NOT {m}.\"{SAME}\"")
    }

    /// The new hidden entries the log does not hold yet (it keeps those it
    /// holds: what is left of its window after [`LOG_GONE`]), with the
    /// log's columns.
    fn new_entries(&self) -> String {
        let del = quote_ident(DELETED);
        let values = self.cols.names.iter().map(|c| q("n", c)).collect::<Vec<_>>().join(", ");
        let in_log = format!("EXISTS (SELECT 1 FROM {} AS l WHERE l.{del} = n.{del} AND {})", self.log.quoted(), self.same("l", "n"));
        format!("SELECT {values}, n.{del} FROM {NEW} AS n WHERE NOT n.\"{START}\" AND NOT {in_log}")
    }

    /// 4. The table and its log made to hold the new rows and hidden
    ///    entries of the touched keys from where the run recomputes: rows
    ///    that stay the same are left alone, rows that only end elsewhere
    ///    get their new end, the others are removed and the new ones
    ///    inserted. Every change is counted against the plan.
    fn write(&mut self, engine: &mut dyn Engine) -> Result<Written> {
        let (target, log) = (self.job.target.quoted(), self.log.quoted());
        let (vf, vt) = (&self.h.valid_from, &self.h.valid_to);
        let p = self.plan_writes(engine)?;
        let deleted = if p.gone > 0 { engine.execute(&Sql::raw(format!("DELETE FROM {target} AS t USING {MATCH} AS g WHERE {} AND {}", Self::gone("g"), self.on("t", "g", vf))))? } else { 0 };
        if deleted != p.gone {
            return Err(self.not_one_row("removal from the table", deleted, p.gone));
        }
        let updated = if p.retimed > 0 {
            engine.execute(&Sql::raw(format!("UPDATE {target} AS t SET {} = r.\"{TO}\" FROM {MATCH} AS r WHERE {} AND {}", quote_ident(vt), self.retimed("r"), self.on("t", "r", vf))))?
        } else {
            0
        };
        if updated != p.retimed {
            return Err(self.not_one_row("new ends in the table", updated, p.retimed));
        }
        self.opts.step(FailPoint::AfterDelete)?;
        let version = &self.spec.version;
        let log_deleted = if p.log_gone > 0 { engine.execute(&Sql::raw(format!("DELETE FROM {log} AS l USING {LOG_GONE} AS g WHERE {}", self.on("l", "g", version))))? } else { 0 };
        if log_deleted != p.log_gone {
            return Err(self.not_one_row("removal from the log", log_deleted, p.log_gone));
        }
        self.trace.step("delete");
        let names = self.cols.names_list();
        let new = |c: &str| q("n", &format!("{NEW_PREFIX}{c}"));
        let values = self.cols.names.iter().map(|c| new(c)).collect::<Vec<_>>().join(", ");
        // A snapshot history's version is valid_from itself.
        let insert = if self.h.snapshot {
            format!("INSERT INTO {target} ({names}, {}) SELECT {values}, n.\"{TO}\"", quote_ident(vt))
        } else {
            format!("INSERT INTO {target} ({names}, {}, {}) SELECT {values}, {}, n.\"{TO}\"", quote_ident(vf), quote_ident(vt), new(version))
        };
        let inserted = if p.inserts > 0 { engine.execute(&Sql::raw(format!("{insert} FROM {MATCH} AS n WHERE {}", Self::inserted("n"))))? } else { 0 };
        if inserted != p.inserts {
            return Err(Error::Internal(format!("the history's insert into {} wrote {inserted} rows where {} were planned; rolled back, nothing changed", self.job.target, p.inserts)));
        }
        self.opts.step(FailPoint::MidInsert)?;
        engine.execute(&Sql::raw(format!("INSERT INTO {log} ({names}, {}) {}", quote_ident(DELETED), self.new_entries())))?;
        self.trace.step("insert");
        self.opts.step(FailPoint::AfterInsert)?;
        Ok(Written { deleted, updated, inserted, kept: p.kept })
    }

    /// 4, under a lease. The same plan as [`Run::write`]; the table's rows
    /// the run removes or gives a new end, and the log's entries it
    /// removes, are counted in the table first (each must be one row), then
    /// the table and the log each replace those rows with the new ones
    /// ([`Leases::replace_rows`]).
    ///
    /// Where the writes are published with the ledger row (Delta), one
    /// replacement each. Where each lands as it is made (Spark), three, so
    /// that every entry of the version log is stored (as a row or in the
    /// log) after each: the log first takes the new hidden entries and
    /// loses those a new entry replaces at their version; then the table is
    /// written; then the log loses the entries that now start rows. A
    /// failure between them leaves entries stored twice (a row and its log
    /// entry), which the next run of the key removes, never one lost.
    fn write_leased(&mut self, engine: &mut dyn Engine) -> Result<Written> {
        if !leases(engine)?.publishes_with_ledger_row() {
            return self.write_in_steps(engine);
        }
        let log = self.log.quoted();
        let vt = &self.h.valid_to;
        let p = self.plan_writes(engine)?;
        let (dropped, held) = self.dropped_rows(engine)?;
        if held != p.gone + p.retimed {
            return Err(self.not_one_row("removal from the table", held, p.gone + p.retimed));
        }
        let log_dropped = format!("EXISTS (SELECT 1 FROM {LOG_GONE} AS g WHERE {})", self.on("t", "g", &self.spec.version));
        let log_held = count(engine, &Sql::raw(format!("SELECT count(*) AS \"n\" FROM {log} AS t WHERE {log_dropped}")))?;
        if log_held != p.log_gone {
            return Err(self.not_one_row("removal from the log", log_held, p.log_gone));
        }
        if p.gone + p.retimed + p.inserts > 0 {
            let (columns, select) = self.written_rows(vt);
            leases(engine)?.replace_rows(&self.job.target, &columns, &Sql::raw(dropped), &Sql::raw(select))?;
        }
        self.opts.step(FailPoint::AfterDelete)?;
        self.trace.step("table");
        self.opts.step(FailPoint::MidInsert)?;
        let entries = self.new_entries();
        let new_entries = count(engine, &Sql::raw(format!("SELECT count(*) AS \"n\" FROM ({entries}) AS e")))?;
        if p.log_gone + new_entries > 0 {
            let columns: Vec<String> = self.cols.names.iter().cloned().chain([DELETED.to_owned()]).collect();
            leases(engine)?.replace_rows(&self.log, &columns, &Sql::raw(log_dropped), &Sql::raw(entries))?;
        }
        self.trace.step("log");
        self.opts.step(FailPoint::AfterInsert)?;
        Ok(Written { deleted: p.gone, updated: p.retimed, inserted: p.inserts, kept: p.kept })
    }

    /// [`Run::write_leased`] where each write lands as it is made.
    fn write_in_steps(&mut self, engine: &mut dyn Engine) -> Result<Written> {
        let vt = &self.h.valid_to;
        let p = self.plan_writes(engine)?;
        let (dropped, held) = self.dropped_rows(engine)?;
        if held != p.gone + p.retimed {
            return Err(self.not_one_row("removal from the table", held, p.gone + p.retimed));
        }
        let log = self.log.quoted();
        let log_dropped = format!("EXISTS (SELECT 1 FROM {LOG_GONE} AS g WHERE {})", self.on("t", "g", &self.spec.version));
        let log_held = count(engine, &Sql::raw(format!("SELECT count(*) AS \"n\" FROM {log} AS t WHERE {log_dropped}")))?;
        if log_held != p.log_gone {
            return Err(self.not_one_row("removal from the log", log_held, p.log_gone));
        }
        let log_columns: Vec<String> = self.cols.names.iter().cloned().chain([DELETED.to_owned()]).collect();
        let del = quote_ident(DELETED);
        // A log entry (alias `t`) in the window, and one the new entries
        // hold as they are (hidden or starting a row).
        let in_window = format!(
            "EXISTS (SELECT 1 FROM {CUT} AS c WHERE {} AND t.{} >= c.\"{FROM}\")",
            keys_match("t", "c", &self.spec.key),
            quote_ident(&self.spec.version)
        );
        let held_new = |start: &str| format!("EXISTS (SELECT 1 FROM {NEW} AS n WHERE {start}n.{del} = t.{del} AND {})", self.same("t", "n"));
        // 1. The log: the new hidden entries in, the entries a new one
        //    replaces at their version out.
        let entries = self.new_entries();
        let new_entries = count(engine, &Sql::raw(format!("SELECT count(*) AS \"n\" FROM ({entries}) AS e")))?;
        let replaced = format!("{in_window} AND NOT {}", held_new(""));
        let now_rows = format!("{in_window} AND {}", held_new(&format!("n.\"{START}\" AND ")));
        let replaced_n = count(engine, &Sql::raw(format!("SELECT count(*) AS \"n\" FROM {log} AS t WHERE {replaced}")))?;
        if new_entries + replaced_n > 0 {
            leases(engine)?.replace_rows(&self.log, &log_columns, &Sql::raw(replaced), &Sql::raw(entries))?;
        }
        self.opts.step(FailPoint::AfterDelete)?;
        // 2. The table.
        if p.gone + p.retimed + p.inserts > 0 {
            let (columns, select) = self.written_rows(vt);
            leases(engine)?.replace_rows(&self.job.target, &columns, &Sql::raw(dropped), &Sql::raw(select))?;
        }
        self.trace.step("table");
        self.opts.step(FailPoint::MidInsert)?;
        // 3. The log: the entries that now start rows out.
        if count(engine, &Sql::raw(format!("SELECT count(*) AS \"n\" FROM {log} AS t WHERE {now_rows}")))? > 0 {
            let none = format!("SELECT {} FROM {NEW} WHERE false", log_columns.iter().map(|c| quote_ident(c)).collect::<Vec<_>>().join(", "));
            leases(engine)?.replace_rows(&self.log, &log_columns, &Sql::raw(now_rows), &Sql::raw(none))?;
        }
        self.trace.step("log");
        self.opts.step(FailPoint::AfterInsert)?;
        Ok(Written { deleted: p.gone, updated: p.retimed, inserted: p.inserts, kept: p.kept })
    }

    /// The condition (alias `t`) on the table's rows the run removes or
    /// gives a new end, and how many the table holds.
    fn dropped_rows(&self, engine: &mut dyn Engine) -> Result<(String, u64)> {
        let vf = &self.h.valid_from;
        let dropped = format!("EXISTS (SELECT 1 FROM {MATCH} AS g WHERE ({} OR {}) AND {})", Self::gone("g"), self.retimed("g"), self.on("t", "g", vf));
        let held = count(engine, &Sql::raw(format!("SELECT count(*) AS \"n\" FROM {} AS t WHERE {dropped}", self.job.target.quoted())))?;
        Ok((dropped, held))
    }

    /// The table's columns, and the rows that replace those
    /// [`Run::dropped_rows`] names: the rows given a new end, and the new ones.
    fn written_rows(&self, vt: &str) -> (Vec<String>, String) {
        let columns: Vec<String> = self.target_cols.iter().map(|c| c.name.clone()).collect();
        let retimed_rows = self
            .target_cols
            .iter()
            .map(|c| match c.name == vt {
                true => format!("CAST(t.\"{TO}\" AS {}) AS {}", c.ty, quote_ident(vt)),
                false => q("t", &c.name),
            })
            .collect::<Vec<_>>()
            .join(", ");
        let select = format!("SELECT {retimed_rows} FROM {MATCH} AS t WHERE {} UNION ALL SELECT {} FROM {MATCH} AS n WHERE {}", self.retimed("t"), self.inserted_columns(), Self::inserted("n"));
        (columns, select)
    }

    /// The select list of an inserted row (alias `n`, from [`MATCH`]) with
    /// the target's columns, cast to their types.
    fn inserted_columns(&self) -> String {
        let (vf, vt) = (&self.h.valid_from, &self.h.valid_to);
        self.target_cols
            .iter()
            .map(|c| {
                let value = if &c.name == vt {
                    format!("n.\"{TO}\"")
                } else if self.cols.names.contains(&c.name) {
                    q("n", &format!("{NEW_PREFIX}{}", c.name))
                } else if &c.name == vf {
                    q("n", &format!("{NEW_PREFIX}{}", self.spec.version))
                } else {
                    "NULL".to_owned()
                };
                format!("CAST({value} AS {}) AS {}", c.ty, quote_ident(&c.name))
            })
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// 5. The touched keys' rows as written, checked: a violation refuses
    ///    the run (nothing is published). In the same query, the row count
    ///    and hash sum of [`TAIL`] as the run read it and as it leaves it.
    #[allow(clippy::type_complexity)]
    fn well_formed(&mut self, engine: &mut dyn Engine, fp: &FingerprintSelect) -> Result<(AuditResult, (i128, i128), (i128, i128))> {
        let rows = engine.query(&Sql::raw(self.cols.well_formed(&self.after_select(), &self.log.quoted(), TAIL, &fp.select)))?;
        let row = rows.single("the history checks")?;
        let tail = (i128::from(row.count("tail_rows")?), engine.dialect().read_sum(row.value("tail_sum")?)?);
        let after = (i128::from(row.count(FP_ROWS)?), engine.dialect().read_sum(row.value(FP_SUM)?)?);
        let found = [
            ("empty", "an interval that ends where it starts or before"),
            ("moved", "a row whose version is not its valid_from"),
            ("overlaps", "overlapping intervals (or an open row before another)"),
            ("unexplained_ends", "an interval closed or followed by a gap without a tombstone"),
            ("tombstoned", "a row holding a deleted version"),
        ];
        let mut problems = Vec::new();
        let mut offending = 0;
        for (column, what) in found {
            let n = row.count(column)?;
            if n > 0 {
                offending += n;
                problems.push(format!("{n} row(s) with {what}"));
            }
        }
        self.trace.step("well-formed");
        let detail = if problems.is_empty() {
            "every touched key's intervals are half-open, in order, without overlaps, with gaps only after a tombstone".to_owned()
        } else {
            format!("the history of the touched keys would not be well-formed: {}", problems.join("; "))
        };
        let result = AuditResult { name: WELL_FORMED.into(), severity: "error".into(), passed: problems.is_empty(), offending, detail: detail.clone(), sample: Vec::new() };
        if result.passed {
            return Ok((result, tail, after));
        }
        Err(Error::AuditFailed { audit: WELL_FORMED.into(), detail, sample: String::new(), failed: 1, results: vec![result] })
    }

    /// The output fingerprint's select list: the target's columns but
    /// metadata.
    fn output_select(&self, engine: &mut dyn Engine) -> Result<FingerprintSelect> {
        let cols: Vec<Column> = self.target_cols.iter().filter(|c| !self.job.metadata.contains(&c.name)).cloned().collect();
        fingerprint_select(engine, Method::Native, "t", &cols)
    }

    /// The summary row of `tail` ([`TAIL`], or [`TAIL_ALL`] under a lease):
    /// the touched keys' row count and hash sum; removed from [`TAIL`].
    fn summary(&mut self, engine: &mut dyn Engine, tail: &str) -> Result<(u64, i128)> {
        let rows = engine.query(&Sql::raw(format!("SELECT \"{SUMMARY_ROWS}\" AS \"n\", \"{SUMMARY_SUM}\" AS \"s\" FROM {tail} WHERE \"{SUMMARY}\"")))?;
        let row = rows.single("the touched keys' fingerprint")?;
        let parts = (row.count("n")?, engine.dialect().read_sum(row.value("s")?)?);
        if tail != TAIL {
            return Ok(parts);
        }
        let removed = engine.execute(&Sql::raw(format!("DELETE FROM {TAIL} WHERE \"{SUMMARY}\"")))?;
        if removed != 1 {
            return Err(Error::Internal(format!("the touched keys' fingerprint of {} came in {removed} rows", self.job.target)));
        }
        Ok(parts)
    }

    /// [`TAIL`] as the table holds it now, as a select built from what the
    /// run read and wrote (the removal, the new ends and the insert were
    /// checked row for row), so the checks and the output fingerprint need
    /// not read the table again. The inserted rows are cast to the target's
    /// types, as the insert did.
    fn after_select(&self) -> String {
        let vt = &self.h.valid_to;
        // The rows kept, each with its end as the run left it.
        let kept = self
            .target_cols
            .iter()
            .map(|c| match &c.name == vt {
                true => format!("CASE WHEN {} THEN CAST(t.\"{TO}\" AS {}) ELSE t.{end} END AS {end}", self.retimed("t"), c.ty, end = quote_ident(vt)),
                false => q("t", &c.name),
            })
            .collect::<Vec<_>>()
            .join(", ");
        let inserted = self.inserted_columns();
        format!("SELECT {kept} FROM {MATCH} AS t WHERE t.\"{SAME}\" UNION ALL SELECT {inserted} FROM {MATCH} AS n WHERE {}", Self::inserted("n"))
    }

    /// The job's audits over the touched keys' rows as they will be published.
    fn audit(&mut self, engine: &mut dyn Engine) -> Result<Vec<AuditResult>> {
        if self.job.audits.is_empty() {
            return Ok(Vec::new());
        }
        // Every row of the touched keys, read back in the run's transaction.
        let touched = format!("(SELECT t.* FROM {}) AS a", self.cols.touched_from(&self.job.target.quoted()));
        let from = |sql: &mut Sql| {
            sql.push(&touched);
        };
        let scope = crate::run::audit::AuditScope { from: &from, previous_rows: None, run_date: self.run_date.date() };
        let results = crate::run::audit::audit(self.job, engine, &scope)?;
        self.trace.step("audits");
        Ok(results)
    }

    /// The refusal of two different upserts of a key at one version
    /// (`a` from `left` and `b` from `right`, joined on `tie`), with one
    /// pair; `None` when there is none.
    fn tie_error(&self, engine: &mut dyn Engine, left: &str, right: &str, tie: &str, whence: &str) -> Result<Option<Error>> {
        let pairs = count(engine, &Sql::raw(format!("SELECT count(*) AS \"n\" FROM {left} AS a JOIN {right} AS b ON {tie}")))?;
        if pairs == 0 {
            return Ok(None);
        }
        let order = self.cols.names.iter().map(|c| q("a", c)).chain(self.cols.names.iter().map(|c| q("b", c))).collect::<Vec<_>>().join(", ");
        let pick = |alias: &str| format!("SELECT {} FROM {left} AS a JOIN {right} AS b ON {tie} ORDER BY {order} LIMIT 1", self.cols.names.iter().map(|c| q(alias, c)).collect::<Vec<_>>().join(", "));
        let one = first_row(engine, &Sql::raw(pick("a")))?;
        let other = first_row(engine, &Sql::raw(pick("b")))?;
        Ok(Some(Error::DataRefused {
            message: format!(
                "{pairs} pair(s) of different rows for one key at the same version ({}) {whence}, e.g. {one} vs {other}; nothing was changed",
                self.spec.version
            ),
            hint: Some("bump the version upstream, or set on_tie = \"deterministic\" to keep the row whose values sort first".into()),
        }))
    }

    /// A snapshot history's run date, its rows' version.
    fn day(&self) -> Value {
        Value::Timestamp(self.run_date.date().and_time(chrono::NaiveTime::MIN))
    }

    /// A snapshot history's source: its rows, each with the run date as
    /// its version (`valid_from`) and its tombstone flag.
    fn snapshot_source(&self) -> Sql {
        let mut sql = Sql::new();
        sql.push("SELECT s.*, ");
        sql.typed_param(self.day(), "TIMESTAMP");
        sql.push(&format!(" AS {}, ", quote_ident(&self.h.valid_from)));
        match &self.spec.deleted {
            Some(pred) => sql.push(&format!("coalesce(({pred}), false)")),
            None => sql.push("false"),
        };
        sql.push(&format!(" AS {} FROM ", quote_ident(DELETED)));
        crate::engine::measure::Scope::Source { template: self.job.source.template(), params: &self.params }.write_from(&mut sql, "s");
        sql
    }

    /// A removal or new end by key and start that did not change one row
    /// per entry (`what`: "removal from the table", …): the table (or its
    /// log) holds a key twice at one version, which a run never writes.
    /// Nothing is changed.
    fn not_one_row(&self, what: &str, changed: u64, expected: u64) -> Error {
        Error::Internal(format!(
            "the history's {what} of {} changed {changed} rows where {expected} were planned: it holds a key twice at one version (edited by hand?); rolled back, nothing changed",
            self.job.target
        ))
    }

    fn drop_temps(&mut self, engine: &mut dyn Engine) -> Result<()> {
        for t in [AFTER, MATCH, LOG_GONE, NEW, ALL, CUT, TAIL, TAIL_ALL, KEYS, BATCH, STAGE] {
            match self.leased {
                true => leases(engine)?.unstage(t)?,
                false => {
                    engine.execute(&Sql::raw(format!("DROP TABLE IF EXISTS {t}")))?;
                }
            }
        }
        Ok(())
    }

    /// Makes the relation `name` from `sql`: a temporary table in the run's
    /// transaction; under a lease a staged relation ([`Leases::stage`]), or
    /// where the run reads it after its first write and it derives from the
    /// table or its log, a copy of its rows as they are now
    /// ([`Leases::stage_copy`]), which the run's writes do not change.
    fn make(&self, engine: &mut dyn Engine, name: &str, sql: &Sql) -> Result<()> {
        let read_after_writes = [TAIL, CUT, NEW, MATCH].contains(&name) || (name == KEYS && self.h.snapshot);
        match (self.leased, read_after_writes) {
            (true, true) => leases(engine)?.stage_copy(name, sql),
            (true, false) => leases(engine)?.stage(name, sql),
            (false, _) => engine.create_temp_table_as(name, sql).map(|_| ()),
        }
    }

    /// [`Run::make`] of `select`; returns its rows.
    fn made(&self, engine: &mut dyn Engine, name: &str, select: &str) -> Result<u64> {
        self.make(engine, name, &Sql::raw(select.to_owned()))?;
        count(engine, &Sql::raw(format!("SELECT count(*) AS \"n\" FROM {name}")))
    }

    fn cleanup(&mut self, engine: &mut dyn Engine) -> Result<()> {
        self.drop_temps(engine)?;
        self.trace.step("cleanup");
        Ok(())
    }
}
