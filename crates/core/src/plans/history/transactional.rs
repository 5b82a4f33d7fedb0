//! The history plan. On an engine with transactions every step is in the
//! run's transaction, so a failure anywhere leaves the table, its log and
//! the ledger as they were. On an engine that replaces a table's rows in
//! one atomic step (Delta), the same steps run under the run's lease, and
//! the table and its log are each changed by one [`Leases::replace_rows`]
//! of the rows the run recomputes, published with the ledger row (Delta:
//! the target's commit records the log's, see the engine).

use std::time::Instant;

use crate::engine::measure::{fingerprint_select, FingerprintSelect, FP_ROWS, FP_SUM};
use crate::engine::{Column, Engine, Leases};
use crate::error::{AuditResult, Error, FailPoint, Result};
use crate::fingerprint::runkey::run_key;
use crate::fingerprint::{Fingerprint, Method};
use crate::job::ident::{quote_ident, TableName};
use crate::job::spec::{HistorySpec, Job, MergeSpec, OnTie};
use crate::job::sql::{RunParams, Sql, Value};
use crate::plans::history::sql::{log_table, Cols, AFTER, ALL, BATCH, CUT, GONE, INS, KEYS, RETIMED, LOG_GONE, NEW, ORIGIN, STAGE, START, SUMMARY, SUMMARY_ROWS, SUMMARY_SUM, TAIL, TO, WIN};
use crate::plans::merge::refusals::{check_source, deleted_error};
use crate::plans::merge::sql::{count, keys_match, q, DELETED};
use crate::plans::merge::steps::{flagged_source, scan_stage};
use crate::run::input::{describe_source, RunInput};
use crate::run::ledger;
use crate::run::protocol::{elapsed_ms, fence, in_transaction, RunOptions, Trace};
use crate::run::report::{entry, skipped, RunReport};
use crate::run::sqlerror::first_row;
use crate::job::date::RunDate;

/// Creates the temporary table `name` from `select`; returns its rows.
fn count_created(engine: &mut dyn Engine, name: &str, select: &str) -> Result<u64> {
    engine.create_temp_table_as(name, &Sql::raw(select.to_owned()))?;
    count(engine, &Sql::raw(format!("SELECT count(*) AS \"n\" FROM {name}")))
}

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
        cols: Cols { spec, h, names, compared, tracked, meta, types: source_cols.clone() },
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
    };
    let report = if run.leased { run.run(engine, started_at)? } else { in_transaction(engine, |engine| run.run(engine, started_at))? };
    run.trace.step("commit");
    Ok(RunReport { elapsed_ms: elapsed_ms(started), ..report })
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
        let keys = if self.h.snapshot { self.cols.snapshot_keys(&target, &log, &self.day(), self.h.absent_deletes) } else { Sql::raw(self.cols.batch_keys()) };
        engine.create_temp_table_as(KEYS, &keys)?;
        let fp = self.output_select(engine)?;
        let columns: Vec<String> = self.target_cols.iter().map(|c| c.name.clone()).collect();
        let tail = if self.h.snapshot { self.cols.snapshot_tail(&target, &self.day(), &columns, &fp.select) } else { self.cols.tail(&target, &columns, &fp.select) };
        engine.create_temp_table_as(TAIL, &tail)?;
        let before = self.summary(engine)?;
        self.trace.step("tail");
        if let Some(last) = last.filter(|l| l.run_key == key && l.fingerprint_kind == input.kind) {
            let now = fp.of(before.0, before.1);
            if now.rows == last.output_rows && now.checksum == last.output_checksum {
                self.cleanup(engine)?;
                return Ok(skipped(self.job, self.run_date, &key, &input, &now, started));
            }
        }
        let cut = if self.h.snapshot { self.cols.snapshot_cut(TAIL, &self.day()) } else { Sql::raw(self.cols.cut(TAIL)) };
        engine.create_temp_table_as(CUT, &cut)?;
        self.trace.step("cut");
        self.resolve(engine)?;
        self.opts.step(FailPoint::AfterGuards)?;
        let Written { deleted, updated, inserted, kept } = if self.leased { self.write_leased(engine)? } else { self.write(engine)? };
        let checks = self.well_formed(engine)?;
        // The touched keys' rows as written: those the run did not read,
        // as they were, and the tail as the run leaves it.
        let (tail_rows, tail_sum) = Self::sums(engine, &fp, &format!("{TAIL} AS t"))?;
        let (after_rows, after_sum) = Self::sums(engine, &fp, &format!("{AFTER} AS t"))?;
        let rows = u64::try_from(i128::from(before.0) - tail_rows + after_rows)
            .map_err(|_| Error::Internal(format!("the touched keys of {} would hold fewer than no rows after the run; rolled back, nothing changed", self.job.target)))?;
        let output = fp.of(rows, before.1 - tail_sum + after_sum);
        self.trace.step("output fp");

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
                leases(engine)?.create_table(&job.target, &columns, None)?;
            } else {
                let interval: Vec<String> = interval.iter().map(|c| format!("{} {}", quote_ident(&c.name), c.ty)).collect();
                engine.execute(&Sql::raw(format!("CREATE TABLE {} ({}, {})", job.target.quoted(), cols.join(", "), interval.join(", "))))?;
            }
        }
        match engine.table_columns(&self.log)? {
            None if self.leased => {
                let columns: Vec<Column> = self.source_cols.iter().cloned().chain([Column { name: DELETED.into(), ty: "BOOLEAN".into() }]).collect();
                leases(engine)?.create_table(&self.log, &columns, None)?;
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
        engine.create_temp_table_as(STAGE, &sql).map_err(|e| deleted_error(self.job, self.spec, &self.described, e))?;
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
        engine.create_temp_table_as(BATCH, &Sql::raw(self.cols.first_per_version(STAGE, &[])))?;
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

    /// 3. The touched keys' entries from where the run recomputes, with
    ///    the batch's, resolved (a tie with a recorded version refused with
    ///    `on_tie = "error"`) and walked into rows and hidden entries.
    fn resolve(&mut self, engine: &mut dyn Engine) -> Result<()> {
        engine.create_temp_table_as(WIN, &Sql::raw(self.cols.window_rows(TAIL)))?;
        self.trace.step("window");
        let all = if self.h.snapshot {
            // The next committed snapshot after this one: a key of this
            // batch it lacks was absent from it.
            let next = match self.h.absent_deletes {
                true => ledger::next_committed_date(engine, &self.job.name, self.run_date)?.map(|d| Value::Timestamp(d.date().and_time(chrono::NaiveTime::MIN))),
                false => None,
            };
            self.cols.snapshot_all(TAIL, WIN, &self.log.quoted(), &self.day(), self.h.absent_deletes, next.as_ref())
        } else {
            Sql::raw(self.cols.all(WIN, &self.log.quoted()))
        };
        engine.create_temp_table_as(ALL, &all)?;
        self.trace.step("entries");
        // A snapshot history's run owns its version: nothing recorded there is kept to tie with.
        if self.spec.on_tie == OnTie::Error && !self.h.snapshot {
            let tie = format!("{} AND a.\"{ORIGIN}\" <> 1 AND b.\"{ORIGIN}\" = 1", self.cols.tie("a", "b"));
            if let Some(e) = self.tie_error(engine, ALL, ALL, &tie, "between the batch and the history")? {
                return Err(e);
            }
        }
        self.trace.step("ties");
        let resolved = format!("({}) AS r", self.cols.first_per_version(ALL, &[]));
        engine.create_temp_table_as(NEW, &Sql::raw(self.cols.walk(&resolved, &self.version_type)))?;
        self.trace.step("resolve");
        Ok(())
    }

    /// A row (or entry) `a` and a new one `n` alike in key and values; with
    /// `with_start`, `a` also starting at `n`'s version.
    fn same(&self, a: &str, n: &str, with_start: bool) -> String {
        let mut conds = vec![keys_match(a, n, &self.spec.key)];
        if with_start {
            conds.push(format!("{} = {}", q(a, &self.h.valid_from), q(n, &self.spec.version)));
        }
        conds.extend(self.cols.names.iter().filter(|c| !self.spec.key.contains(c)).map(|c| format!("{} IS NOT DISTINCT FROM {}", q(a, c), q(n, c))));
        conds.join(" AND ")
    }

    /// `alias`'s key columns and `col`, as a select list.
    fn key_and(&self, alias: &str, col: &str) -> String {
        self.spec.key.iter().map(|k| q(alias, k)).chain([q(alias, col)]).collect::<Vec<_>>().join(", ")
    }

    /// `a` and `b` alike in key and `col`.
    fn on(&self, a: &str, b: &str, col: &str) -> String {
        format!("{} AND {} = {}", keys_match(a, b, &self.spec.key), q(a, col), q(b, col))
    }

    /// The plan of step 4, as temporary tables: the window's rows that
    /// only end elsewhere now, by key and start (unique in a well-formed
    /// table), with their new end ([`RETIMED`]); those no new row repeats,
    /// to remove ([`GONE`]); the log's entries no new entry keeps
    /// ([`LOG_GONE`]); the new rows the table does not hold yet ([`INS`]).
    fn plan_writes(&mut self, engine: &mut dyn Engine) -> Result<Planned> {
        let (vf, vt) = (&self.h.valid_from, &self.h.valid_to);
        let retimed = count_created(
            engine,
            RETIMED,
            &format!(
                "SELECT {}, n.\"{TO}\" FROM {WIN} AS t JOIN {NEW} AS n ON n.\"{START}\" AND {} AND {} IS DISTINCT FROM n.\"{TO}\"",
                self.key_and("t", vf),
                self.same("t", "n", true),
                q("t", vt)
            ),
        )?;
        let row_kept = format!("EXISTS (SELECT 1 FROM {NEW} AS n WHERE n.\"{START}\" AND {})", self.same("t", "n", true));
        let gone = count_created(engine, GONE, &format!("SELECT {} FROM {WIN} AS t WHERE NOT {row_kept}", self.key_and("t", vf)))?;
        let del = quote_ident(DELETED);
        let version = &self.spec.version;
        let entry_kept = format!("EXISTS (SELECT 1 FROM {NEW} AS n WHERE NOT n.\"{START}\" AND n.{del} = l.{del} AND {})", self.same("l", "n", false));
        let log_gone = count_created(
            engine,
            LOG_GONE,
            &format!("SELECT {} FROM {} AND NOT {entry_kept}", self.key_and("l", version), self.cols.window_from(&self.log.quoted(), "l", version)),
        )?;
        let in_rows = format!("EXISTS (SELECT 1 FROM {WIN} AS t WHERE {})", self.same("t", "n", true));
        let inserts = count_created(engine, INS, &format!("SELECT n.* FROM {NEW} AS n WHERE n.\"{START}\" AND NOT {in_rows}"))?;
        self.trace.step("plan");
        Ok(Planned { retimed, gone, log_gone, inserts })
    }

    /// The new hidden entries the log does not hold yet (it keeps those it
    /// holds: what is left of its window after [`LOG_GONE`]), with the
    /// log's columns.
    fn new_entries(&self) -> String {
        let del = quote_ident(DELETED);
        let values = self.cols.names.iter().map(|c| q("n", c)).collect::<Vec<_>>().join(", ");
        let in_log = format!("EXISTS (SELECT 1 FROM {} AS l WHERE l.{del} = n.{del} AND {})", self.log.quoted(), self.same("l", "n", false));
        format!("SELECT {values}, n.{del} FROM {NEW} AS n WHERE NOT n.\"{START}\" AND NOT {in_log}")
    }

    /// How many entries of the window are new starts of rows.
    fn kept(&self, engine: &mut dyn Engine, p: &Planned) -> Result<u64> {
        let starts = count(engine, &Sql::raw(format!("SELECT count(*) AS \"n\" FROM {NEW} WHERE \"{START}\"")))?;
        Ok(starts.saturating_sub(p.inserts + p.retimed))
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
        let deleted = if p.gone > 0 { engine.execute(&Sql::raw(format!("DELETE FROM {target} AS t USING {GONE} AS g WHERE {}", self.on("t", "g", vf))))? } else { 0 };
        if deleted != p.gone {
            return Err(self.not_one_row("removal from the table", deleted, p.gone));
        }
        let updated = if p.retimed > 0 {
            engine.execute(&Sql::raw(format!("UPDATE {target} AS t SET {} = r.\"{TO}\" FROM {RETIMED} AS r WHERE {}", quote_ident(vt), self.on("t", "r", vf))))?
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
        let values = self.cols.names.iter().map(|c| q("n", c)).collect::<Vec<_>>().join(", ");
        // A snapshot history's version is valid_from itself.
        let insert = if self.h.snapshot {
            format!("INSERT INTO {target} ({names}, {}) SELECT {values}, n.\"{TO}\"", quote_ident(vt))
        } else {
            format!("INSERT INTO {target} ({names}, {}, {}) SELECT {values}, n.{}, n.\"{TO}\"", quote_ident(vf), quote_ident(vt), quote_ident(version))
        };
        let inserted = if p.inserts > 0 { engine.execute(&Sql::raw(format!("{insert} FROM {INS} AS n")))? } else { 0 };
        if inserted != p.inserts {
            return Err(Error::Internal(format!("the history's insert into {} wrote {inserted} rows where {} were planned; rolled back, nothing changed", self.job.target, p.inserts)));
        }
        self.opts.step(FailPoint::MidInsert)?;
        engine.execute(&Sql::raw(format!("INSERT INTO {log} ({names}, {}) {}", quote_ident(DELETED), self.new_entries())))?;
        self.trace.step("insert");
        self.opts.step(FailPoint::AfterInsert)?;
        self.after(engine)?;
        Ok(Written { deleted, updated, inserted, kept: self.kept(engine, &p)? })
    }

    /// 4, under a lease. The same plan as [`Run::write`]; the table's rows
    /// the run removes or gives a new end, and the log's entries it
    /// removes, are counted in the table first (each must be one row), then
    /// the table and the log each replace those rows with the new ones in
    /// one step ([`Leases::replace_rows`]), published with the ledger row.
    fn write_leased(&mut self, engine: &mut dyn Engine) -> Result<Written> {
        let (target, log) = (self.job.target.quoted(), self.log.quoted());
        let (vf, vt) = (&self.h.valid_from, &self.h.valid_to);
        let p = self.plan_writes(engine)?;
        let dropped = format!("(EXISTS (SELECT 1 FROM {GONE} AS g WHERE {}) OR EXISTS (SELECT 1 FROM {RETIMED} AS r WHERE {}))", self.on("t", "g", vf), self.on("t", "r", vf));
        let held = count(engine, &Sql::raw(format!("SELECT count(*) AS \"n\" FROM {target} AS t WHERE {dropped}")))?;
        if held != p.gone + p.retimed {
            return Err(self.not_one_row("removal from the table", held, p.gone + p.retimed));
        }
        let log_dropped = format!("EXISTS (SELECT 1 FROM {LOG_GONE} AS g WHERE {})", self.on("t", "g", &self.spec.version));
        let log_held = count(engine, &Sql::raw(format!("SELECT count(*) AS \"n\" FROM {log} AS t WHERE {log_dropped}")))?;
        if log_held != p.log_gone {
            return Err(self.not_one_row("removal from the log", log_held, p.log_gone));
        }
        if p.gone + p.retimed + p.inserts > 0 {
            let columns: Vec<String> = self.target_cols.iter().map(|c| c.name.clone()).collect();
            let retimed_rows = self
                .target_cols
                .iter()
                .map(|c| match &c.name == vt {
                    true => format!("CAST(r.\"{TO}\" AS {}) AS {}", c.ty, quote_ident(vt)),
                    false => q("t", &c.name),
                })
                .collect::<Vec<_>>()
                .join(", ");
            let select = format!(
                "SELECT {retimed_rows} FROM {WIN} AS t JOIN {RETIMED} AS r ON {} UNION ALL SELECT {} FROM {INS} AS n",
                self.on("t", "r", vf),
                self.inserted_columns()
            );
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
        self.after(engine)?;
        Ok(Written { deleted: p.gone, updated: p.retimed, inserted: p.inserts, kept: self.kept(engine, &p)? })
    }

    /// The select list of an inserted row (alias `n`, from [`INS`]) with
    /// the target's columns, cast to their types.
    fn inserted_columns(&self) -> String {
        let (vf, vt) = (&self.h.valid_from, &self.h.valid_to);
        self.target_cols
            .iter()
            .map(|c| {
                let value = if &c.name == vt {
                    format!("n.\"{TO}\"")
                } else if self.cols.names.contains(&c.name) {
                    q("n", &c.name)
                } else if &c.name == vf {
                    q("n", &self.spec.version)
                } else {
                    "NULL".to_owned()
                };
                format!("CAST({value} AS {}) AS {}", c.ty, quote_ident(&c.name))
            })
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// 5. The touched keys' rows as written, checked: a violation refuses
    ///    the run (nothing is published).
    fn well_formed(&mut self, engine: &mut dyn Engine) -> Result<AuditResult> {
        let rows = engine.query(&Sql::raw(self.cols.well_formed(AFTER, &self.log.quoted())))?;
        let row = rows.single("the history checks")?;
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
            return Ok(result);
        }
        Err(Error::AuditFailed { audit: WELL_FORMED.into(), detail, sample: String::new(), failed: 1, results: vec![result] })
    }

    /// The output fingerprint's select list: the target's columns but
    /// metadata.
    fn output_select(&self, engine: &mut dyn Engine) -> Result<FingerprintSelect> {
        let cols: Vec<Column> = self.target_cols.iter().filter(|c| !self.job.metadata.contains(&c.name)).cloned().collect();
        fingerprint_select(engine, Method::Native, "t", &cols)
    }

    /// [`TAIL`]'s summary row (the touched keys' row count and hash sum),
    /// read and removed.
    fn summary(&mut self, engine: &mut dyn Engine) -> Result<(u64, i128)> {
        let rows = engine.query(&Sql::raw(format!("SELECT \"{SUMMARY_ROWS}\" AS \"n\", \"{SUMMARY_SUM}\" AS \"s\" FROM {TAIL} WHERE \"{SUMMARY}\"")))?;
        let row = rows.single("the touched keys' fingerprint")?;
        let parts = (row.count("n")?, engine.dialect().read_sum(row.value("s")?)?);
        let removed = engine.execute(&Sql::raw(format!("DELETE FROM {TAIL} WHERE \"{SUMMARY}\"")))?;
        if removed != 1 {
            return Err(Error::Internal(format!("the touched keys' fingerprint of {} came in {removed} rows", self.job.target)));
        }
        Ok(parts)
    }

    /// The row count and the sum of row hashes of `fp` over `from`
    /// (`<table> AS t …`).
    fn sums(engine: &mut dyn Engine, fp: &FingerprintSelect, from: &str) -> Result<(i128, i128)> {
        let row = engine.query(&Sql::raw(format!("SELECT {} FROM {from}", fp.select)))?;
        let row = row.single("the output scan")?;
        Ok((i128::from(row.count(FP_ROWS)?), engine.dialect().read_sum(row.value(FP_SUM)?)?))
    }

    /// [`AFTER`]: [`TAIL`] as the table holds it now, built from what the
    /// run read and wrote (the removal, the new ends and the insert were
    /// checked row for row), so the checks and the output fingerprint need not read the
    /// table again. The inserted rows are cast to the target's types, as
    /// the insert did.
    fn after(&mut self, engine: &mut dyn Engine) -> Result<()> {
        let (vf, vt) = (&self.h.valid_from, &self.h.valid_to);
        // The rows left, each with its end as the run left it.
        let kept = self
            .target_cols
            .iter()
            .map(|c| match &c.name == vt {
                true => format!("CASE WHEN r.{} IS NULL THEN t.{end} ELSE CAST(r.\"{TO}\" AS {}) END AS {end}", quote_ident(vf), c.ty, end = quote_ident(vt)),
                false => q("t", &c.name),
            })
            .collect::<Vec<_>>()
            .join(", ");
        let inserted = self.inserted_columns();
        let on = |a: &str| format!("{} AND {a}.{} = t.{}", keys_match(a, "t", &self.spec.key), quote_ident(vf), quote_ident(vf));
        engine.create_temp_table_as(
            AFTER,
            &Sql::raw(format!(
                "SELECT {kept} FROM {TAIL} AS t LEFT JOIN {RETIMED} AS r ON {} WHERE NOT EXISTS (SELECT 1 FROM {GONE} AS g WHERE {}) \
                 UNION ALL SELECT {inserted} FROM {INS} AS n",
                on("r"),
                on("g")
            )),
        )?;
        self.trace.step("after");
        Ok(())
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
        for t in [AFTER, INS, LOG_GONE, GONE, RETIMED, NEW, ALL, WIN, CUT, TAIL, KEYS, BATCH, STAGE] {
            engine.execute(&Sql::raw(format!("DROP TABLE IF EXISTS {t}")))?;
        }
        Ok(())
    }

    fn cleanup(&mut self, engine: &mut dyn Engine) -> Result<()> {
        self.drop_temps(engine)?;
        self.trace.step("cleanup");
        Ok(())
    }
}
