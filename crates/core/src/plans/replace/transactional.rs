//! `replace_partition` on engines with transactions: the day deleted and
//! inserted, or swapped in whole, in one transaction with its guards,
//! fingerprints, audits and ledger row.

use std::time::Instant;

use crate::engine::{partition_exchange, query_count, Accelerated, Column, DayInsert, DayPartition, Engine};
use crate::error::{Error, FailPoint, Result};
use crate::engine::measure::{fingerprint, fingerprint_kind, fingerprint_select, Filter, FingerprintSelect, Scope, FP_ROWS, FP_SUM};
use crate::fingerprint::runkey::run_key;
use crate::fingerprint::{Fingerprint, Method};
use crate::job::date::RunDate;
use crate::job::ident::{quote_ident, TableName};
use crate::job::spec::{Job, Swap};
use crate::job::sql::{RunParam, RunParams, Sql, Value};
use crate::run::ledger;
use crate::run::input::{describe_source, RunInput};
use crate::run::protocol::{elapsed_ms, fence, in_transaction, RunOptions, Steps, Trace};
use crate::run::report::{entry, skipped, RunReport};
use crate::plans::steps::{check_day_rows, check_day_rows_by, check_source_columns, fingerprinted, guard_scan};

/// The columns a run works with, read before its transaction.
struct Shape {
    /// The source query's columns.
    source: Vec<Column>,
    /// The target's columns (with those schema drift adds), `None` when it
    /// does not exist yet.
    target: Option<Vec<Column>>,
    /// The source's new columns the run adds to the target.
    added: Vec<Column>,
    /// The fingerprinted columns of the input and of the output.
    input: Vec<Column>,
    output: Vec<Column>,
}

/// What the guards found before anything was written.
struct Guarded {
    /// The fingerprint's select list (count only, when the fingerprint is
    /// taken of the day as written).
    fp: FingerprintSelect,
    /// The guards wait for the insert: the accelerator counts and hashes
    /// the rows as they are inserted (the guards then run on its figures),
    /// or, should it decline, they scan the source after the delete.
    deferred: bool,
    /// The source's rows (0 when deferred: known after the insert).
    rows: u64,
    /// The input fingerprint, when taken before writing.
    input: Option<Fingerprint>,
}

/// What writing the day did.
struct Written {
    rows_deleted: u64,
    rows_inserted: u64,
    method: &'static str,
    /// The output fingerprint, when the write already knows it (the staged
    /// table of an exchange, the tapped insert).
    output: Option<Fingerprint>,
}

/// One run of `replace_partition` in a transaction.
struct Day<'a> {
    job: &'a Job,
    run_date: RunDate,
    opts: &'a RunOptions,
    run_input: &'a RunInput,
    partition: &'a str,
    shape: Shape,
    params: RunParams,
    job_hash: String,
    trace: Trace,
}

pub(super) fn replace_partition_with(job: &Job, run_date: RunDate, engine: &mut dyn Engine, opts: &RunOptions, run_input: &RunInput, started: Instant) -> Result<RunReport> {
    let started_at = chrono::Utc::now().naive_utc();
    let partition = job.partition.as_deref().ok_or_else(|| Error::Internal("replace_partition without partition".into()))?;
    let mut trace = Trace::new();
    let shape = describe(job, engine, &run_input.params, partition, &mut trace)?;
    let mut day = Day { job, run_date, opts, run_input, partition, shape, params: run_input.params.clone(), job_hash: job.definition_hash(), trace };
    let report = in_transaction(engine, |engine| day.run(engine, started, started_at));
    if report.is_ok() {
        day.trace.step("commit");
    }
    report.map(|mut r| {
        r.elapsed_ms = elapsed_ms(started);
        r
    })
}

/// 1. The source described and checked against the target; schema drift
///    refused (naming the columns) or the new columns to add.
fn describe(job: &Job, engine: &mut dyn Engine, params: &RunParams, partition: &str, trace: &mut Trace) -> Result<Shape> {
    let source = describe_source(job, engine, params)?;
    trace.step("describe source");
    check_source_columns(job, &source, partition)?;
    let target = engine.table_columns(&job.target)?;
    let added = crate::run::schema::reconcile(engine, job, &source, target.as_deref())?;
    let target = target.map(|mut cols| {
        cols.extend(added.iter().cloned());
        cols
    });
    trace.step("describe");
    let input = fingerprinted(&source, &job.metadata);
    let output = match &target {
        Some(cols) => fingerprinted(cols, &job.metadata),
        None => input.clone(),
    };
    Ok(Shape { source, target, added, input, output })
}

impl Day<'_> {
    /// The run in its transaction: the steps in order.
    fn run(&mut self, engine: &mut dyn Engine, started: Instant, started_at: chrono::NaiveDateTime) -> Result<RunReport> {
        fence(engine, self.job, &self.run_date.to_string(), self.opts)?;
        ledger::ensure(engine)?;
        self.trace.step("begin, ledger");
        let last = self.last_entry(engine)?;
        let layout = self.layout(engine)?;
        let exchange = self.job.swap == Swap::Exchange && matches!(layout, DayPartition::Swappable { .. });

        // 2. A file source's run key is known from its files: a retry over
        //    the same files, with the partition as recorded, reads no row.
        let file_key = self.run_input.file_key(&self.job_hash, self.run_date);
        if let Some(key) = &file_key {
            self.opts.run_key_known(self.job, self.run_date, key);
            self.params.run_key = key.clone();
            if let Some(last) = &last {
                if let Some(now) = unchanged(engine, &layout, &self.scope(), &self.shape.output, last, key)? {
                    self.trace.step("target fp");
                    let input = Fingerprint { kind: last.fingerprint_kind.clone(), rows: last.input_rows, checksum: last.input_checksum.clone() };
                    return Ok(skipped(self.job, self.run_date, key, &input, &now, started));
                }
            }
        }

        // 3. The guards, before anything is deleted.
        let mut guarded = self.guard(engine, last.is_some() && file_key.is_none(), file_key.is_none())?;

        // 4. A retry over the same input, with the target still holding the
        //    recorded output, has nothing to do.
        if let (Some(input), None) = (&guarded.input, &file_key) {
            self.params.run_key = run_key(&self.job_hash, self.run_date, input);
            self.opts.run_key_known(self.job, self.run_date, &self.params.run_key);
            if let Some(last) = last.as_ref().filter(|l| l.fingerprint_kind == input.kind) {
                if let Some(now) = unchanged(engine, &layout, &self.scope(), &self.shape.output, last, &self.params.run_key)? {
                    self.trace.step("target fp");
                    return Ok(skipped(self.job, self.run_date, &self.params.run_key, input, &now, started));
                }
            }
        }
        self.opts.step(FailPoint::AfterGuards)?;

        // 5. The target created or given the source's new columns; the day written.
        let created_target = self.prepare_target(engine)?;
        let written = match &layout {
            DayPartition::Swappable { existing } if exchange => self.swap_in(engine, existing.as_ref(), &mut guarded)?,
            _ => self.delete_insert(engine, &layout, &mut guarded)?,
        };

        // 6. The output fingerprint, checked against the input.
        let (input, output) = self.fingerprints(engine, &guarded, &written)?;
        let key = file_key.unwrap_or_else(|| run_key(&self.job_hash, self.run_date, &input));
        self.opts.run_key_known(self.job, self.run_date, &key);

        // 7. Audits of the day as it will be published, 8. the ledger row.
        let audits = self.audit(engine, written.rows_deleted)?;
        let mut report = RunReport::new(self.job, self.run_date, key, "committed", &input, &output);
        report.rows_deleted = written.rows_deleted;
        report.rows_inserted = written.rows_inserted;
        report.created_target = created_target;
        report.audits = audits;
        report.input_files = self.run_input.files.clone();
        report.method = written.method.into();
        report.method_note = self.method_note(&layout, exchange);
        ledger::record(engine, &entry(self.job, &self.job_hash, &report, started_at))?;
        self.opts.step(FailPoint::BeforeCommit)?;
        self.trace.step("ledger row");
        Ok(report)
    }

    /// The day's rows in the target.
    fn scope(&self) -> Scope<'_> {
        Scope::Table { table: &self.job.target, filter: Some(Filter::DateEquals(self.partition, self.run_date.date())) }
    }

    /// The ledger's last entry for this job and date (none with `--force`,
    /// or before the target exists).
    fn last_entry(&mut self, engine: &mut dyn Engine) -> Result<Option<ledger::Entry>> {
        let last = if !self.opts.force && self.shape.target.is_some() {
            ledger::entries_of_existing(engine, Some(&self.job.name), Some(self.run_date), Some(1))?.into_iter().next()
        } else {
            None
        };
        self.trace.step("ledger lookup");
        Ok(last)
    }

    /// How the target keeps the day. It is swapped in whole when the
    /// target is partitioned by day (partition exchange), else deleted and
    /// inserted. With `swap = "delete_insert"` never swapped: a reader
    /// whose snapshot predates the run (REPEATABLE READ, SERIALIZABLE,
    /// pg_dump) would find the swapped-in partition's rows too new for it,
    /// an empty day; deleted rows it still sees (MVCC).
    fn layout(&mut self, engine: &mut dyn Engine) -> Result<DayPartition> {
        let layout = match (&self.shape.target, engine.partition_exchange()) {
            (Some(_), Some(x)) => x.day_partition(&self.job.target, self.partition, self.run_date.date())?,
            _ => DayPartition::NotPartitioned,
        };
        self.trace.step("layout");
        Ok(layout)
    }

    /// The guards before anything is deleted, in one scan of the source
    /// (rows outside the day, too few rows). The input fingerprint is taken
    /// in the same scan when it is needed before writing: to decide a skip
    /// (`for_skip`), to bind `:run_key` (`for_key`), or because the target's
    /// columns differ from the source's. Otherwise the scan only counts, and
    /// the fingerprint is taken once, of the day as written. Or, when
    /// nothing needs them before writing and the engine's accelerator can
    /// tap the insert, the guards and the output fingerprint are taken as
    /// the rows stream into the delete + insert, and a failed guard rolls
    /// both back: no scan of its own.
    fn guard(&mut self, engine: &mut dyn Engine, for_skip: bool, for_key: bool) -> Result<Guarded> {
        let (job, partition, shape) = (self.job, self.partition, &self.shape);
        let needed_before = for_skip || (for_key && job.source.template().uses_any(&[RunParam::RunKey])) || shape.output != shape.input;
        let is_date = |cols: &[Column]| cols.iter().any(|c| c.name == partition && c.ty.eq_ignore_ascii_case("DATE"));
        let tappable = !matches!(self.opts.fault, Some((FailPoint::MidInsert, _)))
            && is_date(&shape.source)
            && shape.target.as_deref().is_none_or(is_date)
            && engine.accelerator().is_some();
        // Where the insert cannot be tapped, an engine may still rather
        // hash the source in the guard scan than the day after writing.
        let before_writing = needed_before || (!tappable && engine.dialect().fingerprint_before_writing());
        let deferred = !needed_before && tappable;
        let fp = if before_writing {
            fingerprint_select(engine, Method::Native, "s", &shape.input)?
        } else {
            // Only the count: the fingerprint is taken of the day as written.
            let kind = fingerprint_kind(engine, Method::Native)?;
            FingerprintSelect { select: format!("count(*) AS {}, 0 AS {}", quote_ident(FP_ROWS), quote_ident(FP_SUM)), kind, signature: Vec::new() }
        };
        if deferred {
            return Ok(Guarded { fp, deferred, rows: 0, input: None });
        }
        self.scan(engine, fp, before_writing)
    }

    /// The guard scan: one scan of the source counting its rows and those
    /// outside the day (and summing the input fingerprint when `fp` does,
    /// kept when `keep_input`), refused as [`Day::check_rows`] says.
    fn scan(&mut self, engine: &mut dyn Engine, fp: FingerprintSelect, keep_input: bool) -> Result<Guarded> {
        let sql = guard_scan(self.job, &self.params, self.partition, self.run_date.date(), &fp.select);
        let rows = engine.query(&sql)?;
        let row = rows.single("the guard scan")?;
        let (input_rows, sum, outside) = (row.count(FP_ROWS)?, engine.dialect().read_sum(row.value(FP_SUM)?)?, row.count("outside")?);
        self.check_rows(engine, input_rows, outside)?;
        self.trace.step("guards");
        let input = keep_input.then(|| fp.of(input_rows, sum));
        Ok(Guarded { fp, deferred: false, rows: input_rows, input })
    }

    /// The guards on the counts: no row outside the day, at least `min_rows`.
    fn check_rows(&self, engine: &mut dyn Engine, rows: u64, outside: u64) -> Result<()> {
        check_day_rows(engine, self.job, &self.params, self.partition, self.run_date, rows, outside)
    }

    /// Creates the target from the source's columns when missing, or adds
    /// the source's new columns (`on_schema_change`); whether it created it.
    fn prepare_target(&self, engine: &mut dyn Engine) -> Result<bool> {
        crate::run::schema::append(engine, &self.job.target, &self.shape.added)?;
        if self.shape.target.is_some() {
            return Ok(false);
        }
        engine.execute(&Sql::raw(format!("CREATE SCHEMA IF NOT EXISTS {}", quote_ident(&self.job.target.schema))))?;
        let cols: Vec<String> = self.shape.source.iter().map(|c| format!("{} {}", quote_ident(&c.name), c.ty)).collect();
        engine.execute(&Sql::raw(format!("CREATE TABLE {} ({})", self.job.target.quoted(), cols.join(", "))))?;
        Ok(true)
    }

    /// `INSERT INTO into … SELECT` of the source's rows (the first `limit`).
    fn insert(&self, into: &TableName, limit: Option<u64>) -> Sql {
        insert_sql(self.job, &self.shape, &self.params, self.partition, into, limit, None)
    }

    /// A test's fault in the middle of the insert: half the rows written.
    fn half_insert_fault(&self, engine: &mut dyn Engine, into: &TableName, rows: u64) -> Result<()> {
        if matches!(self.opts.fault, Some((FailPoint::MidInsert, _))) {
            engine.execute(&self.insert(into, Some(rows / 2)))?;
            self.opts.step(FailPoint::MidInsert)?;
        }
        Ok(())
    }

    /// 5a. Partition exchange: the day built as a standalone table (readers
    ///     still see the old day, unblocked), then the old partition
    ///     detached and the new one attached, in this transaction. Where the
    ///     guards wait for the insert, they ride on it as in 5b (the day's
    ///     table refuses a row of another day: its CHECK).
    fn swap_in(&mut self, engine: &mut dyn Engine, existing: Option<&TableName>, guarded: &mut Guarded) -> Result<Written> {
        let (job, partition, day) = (self.job, self.partition, self.run_date.date());
        let staged = partition_exchange(engine)?.create_day_table(&job.target, partition, day)?;
        self.half_insert_fault(engine, &staged, guarded.rows)?;
        let (rows_inserted, tapped) = if guarded.deferred {
            let (inserted, output, _) = self.insert_deferred(engine, guarded, &staged, false)?;
            (inserted, output)
        } else {
            let inserted = engine.execute(&self.insert(&staged, None))?;
            self.trace.step("insert (staged)");
            (inserted, None)
        };
        self.opts.step(FailPoint::AfterInsert)?;
        let output = match (tapped, &guarded.input) {
            (Some(output), _) => output,
            (None, Some(input)) if self.shape.output == self.shape.input => input.clone(),
            _ => fingerprint(engine, Method::Native, &Scope::Table { table: &staged, filter: None }, &self.shape.output)?,
        };
        self.trace.step("output fp");
        let (rows_deleted, name) = match existing {
            Some(old) => {
                let mut sql = Sql::new();
                sql.push("SELECT count(*) AS \"n\" FROM ").push(&old.quoted());
                let n = query_count(engine, &sql, "n", "the day's old partition")?;
                partition_exchange(engine)?.drop_partition(&job.target, old)?;
                (n, old.table.clone())
            }
            None => (0, day_partition_name(&job.target.table, self.run_date)),
        };
        self.opts.step(FailPoint::AfterDelete)?;
        partition_exchange(engine)?.attach_day(&job.target, &staged, partition, day, &name)?;
        self.trace.step("swap");
        Ok(Written { rows_deleted, rows_inserted, method: "partition exchange", output: Some(output) })
    }

    /// 5b. The day's rows deleted, the source's inserted (tapped, when the
    ///     guards ride on the insert: they are checked on its figures).
    fn delete_insert(&mut self, engine: &mut dyn Engine, layout: &DayPartition, guarded: &mut Guarded) -> Result<Written> {
        let (job, partition, day) = (self.job, self.partition, self.run_date.date());
        // `swap = "delete_insert"` on a target partitioned by day with no
        // partition for this day yet: the insert needs one. Created empty,
        // in this transaction (a reader with an older snapshot saw no rows
        // of the day, and sees none).
        if let DayPartition::Swappable { existing: None } = layout {
            let empty = partition_exchange(engine)?.create_day_table(&job.target, partition, day)?;
            partition_exchange(engine)?.attach_day(&job.target, &empty, partition, day, &day_partition_name(&job.target.table, self.run_date))?;
            self.trace.step("day partition");
        }
        let mut sql = Sql::new();
        sql.push("DELETE FROM ").push(&job.target.quoted()).push(" WHERE ").ident(partition).push(" = ");
        sql.typed_param(Value::Date(day), "DATE");
        let rows_deleted = engine.execute(&sql)?;
        self.trace.step("delete");
        self.opts.step(FailPoint::AfterDelete)?;
        self.half_insert_fault(engine, &job.target, guarded.rows)?;
        let (rows_inserted, output, method) = if guarded.deferred {
            self.insert_deferred(engine, guarded, &job.target, true)?
        } else {
            let inserted = engine.execute(&self.insert(&job.target, None))?;
            self.trace.step("insert");
            (inserted, None, "delete+insert")
        };
        self.opts.step(FailPoint::AfterInsert)?;
        Ok(Written { rows_deleted, rows_inserted, method, output })
    }

    /// The insert into `into` (the target, or an exchange's day table) of
    /// guards that waited for it: the accelerator's, its rows checked on its
    /// figures and the output fingerprint its sum; or, should it decline,
    /// the guard scan and then the plain insert. `copies`: the engine may
    /// copy a file source's files straight in (not into a day table, whose
    /// CHECK would refuse a row of another day before the guards name it).
    fn insert_deferred(&mut self, engine: &mut dyn Engine, guarded: &mut Guarded, into: &TableName, copies: bool) -> Result<(u64, Option<Fingerprint>, &'static str)> {
        let (job, shape, params, partition) = (self.job, &self.shape, &self.params, self.partition);
        let scan_fp = fingerprint_select(engine, Method::Native, "s", &shape.input)?;
        let scan = guard_scan(job, params, partition, self.run_date.date(), &scan_fp.select);
        let run_date = self.run_date;
        let refuse = |query: &mut dyn FnMut(&Sql) -> Result<crate::engine::Rows>, rows: u64, outside: u64| {
            check_day_rows_by(query, job, params, partition, run_date, rows, outside)
        };
        let tapped = match engine.accelerator() {
            Some(acc) => {
                let insert = |tap: &Sql| insert_sql(job, shape, params, partition, into, None, Some(tap));
                let day = DayInsert {
                    partition: format!("s.{}", quote_ident(partition)),
                    column: partition,
                    target: into,
                    files_as_is: copies && job.source.reads_files_as_they_are() && shape.target.as_deref().is_none_or(|t| same_types(&shape.source, t)),
                    alias: "s",
                    hashed: &shape.input,
                    day: self.run_date.date(),
                    insert: &insert,
                    guard_scan: &scan,
                    refuse: &refuse,
                };
                acc.insert_day(&day, &mut Steps { opts: self.opts, trace: &mut self.trace })?
            }
            None => Accelerated::Declined("no accelerator"),
        };
        match tapped {
            Accelerated::Done(t) => {
                self.check_rows(engine, t.inserted, t.outside)?;
                let signature: Vec<String> = self.shape.output.iter().map(|c| format!("{} {}", c.name, c.ty)).collect();
                Ok((t.inserted, Some(Fingerprint::from_sum(&guarded.fp.kind, &signature, t.inserted, t.sum)), t.method))
            }
            Accelerated::Declined(why) => {
                self.trace.step(&format!("insert not tapped ({why})"));
                // The guard scan after all (the day's old rows are deleted,
                // the new ones not yet written), with the input fingerprint
                // where the engine would rather take it there.
                *guarded = if engine.dialect().fingerprint_before_writing() {
                    let fp = fingerprint_select(engine, Method::Native, "s", &shape.input)?;
                    self.scan(engine, fp, true)?
                } else {
                    self.scan(engine, guarded.fp.clone(), false)?
                };
                let inserted = engine.execute(&self.insert(into, None))?;
                self.trace.step("insert");
                Ok((inserted, None, "delete+insert"))
            }
        }
    }

    /// The input and output fingerprints. The day now holds exactly the
    /// source's rows (the guard proved every one belongs to it, the delete
    /// removed every other). When the input was fingerprinted before
    /// writing and the target's fingerprinted columns are the source's
    /// (same names, types, order), that scan (same transaction, same
    /// snapshot) is the output's fingerprint; otherwise the day is scanned
    /// as written. The counts must agree, or the run rolls back.
    fn fingerprints(&mut self, engine: &mut dyn Engine, guarded: &Guarded, written: &Written) -> Result<(Fingerprint, Fingerprint)> {
        let input_rows = if guarded.deferred { written.rows_inserted } else { guarded.rows };
        let output = match (&guarded.input, &written.output) {
            (_, Some(known)) => known.clone(),
            (Some(input), None) if self.shape.output == self.shape.input => input.clone(),
            _ => fingerprint(engine, Method::Native, &self.scope(), &self.shape.output)?,
        };
        let input = guarded.input.clone().unwrap_or_else(|| output.clone());
        self.trace.step("output fp");
        if written.rows_inserted != input_rows || output.rows != input_rows {
            return Err(Error::Internal(format!(
                "the source gave {input_rows} rows but {} were inserted and the partition holds {}; rolled back",
                written.rows_inserted, output.rows
            )));
        }
        Ok((input, output))
    }

    /// The audits of the day as it will be published (inside the
    /// transaction: a blocking failure rolls everything back).
    fn audit(&mut self, engine: &mut dyn Engine, rows_deleted: u64) -> Result<Vec<crate::error::AuditResult>> {
        if self.job.audits.is_empty() {
            return Ok(Vec::new());
        }
        let previous = if rows_deleted > 0 {
            rows_deleted
        } else {
            // A new day: compare with the day before.
            let mut sql = Sql::new();
            sql.push("SELECT count(*) AS \"n\" FROM ").push(&self.job.target.quoted()).push(" WHERE ").ident(self.partition).push(" = ");
            sql.typed_param(Value::Date(self.run_date.date() - chrono::Duration::days(1)), "DATE");
            query_count(engine, &sql, "n", "the day before's rows")?
        };
        let day = self.scope();
        let from = |sql: &mut Sql| {
            sql.push("(SELECT * FROM ");
            day.write_from(sql, "s");
            sql.push(") AS a");
        };
        let scope = crate::run::audit::AuditScope { from: &from, previous_rows: Some(previous), run_date: self.run_date.date() };
        let results = crate::run::audit::audit(self.job, engine, &scope)?;
        self.trace.step("audits");
        Ok(results)
    }

    /// Why the day was not swapped in, where it could have been.
    fn method_note(&self, layout: &DayPartition, exchange: bool) -> Option<String> {
        match layout {
            DayPartition::Unswappable(why) if self.job.swap == Swap::Exchange => Some(format!("no partition exchange: {why}")),
            DayPartition::Swappable { existing: Some(p) } if !exchange => {
                Some(format!("no partition exchange: the job has swap = \"delete_insert\" (the day's rows were deleted from {p} and the new ones inserted)"))
            }
            DayPartition::Swappable { existing: None } if !exchange => Some(format!(
                "no partition exchange: the job has swap = \"delete_insert\" (the day's partition {} was created empty, then inserted into)",
                TableName { schema: self.job.target.schema.clone(), table: day_partition_name(&self.job.target.table, self.run_date) }
            )),
            _ => None,
        }
    }
}

/// The partition's fingerprint now, when the ledger's last entry has run key
/// `key` and the partition still holds its recorded output; `None` otherwise.
fn unchanged(
    engine: &mut dyn Engine,
    layout: &DayPartition,
    scope: &Scope<'_>,
    output_cols: &[Column],
    last: &ledger::Entry,
    key: &str,
) -> Result<Option<Fingerprint>> {
    if last.run_key != key {
        return Ok(None);
    }
    // With partition exchange, read the day's partition itself, not the
    // parent: a lock on the parent held from here would make two runs of
    // different days deadlock at their swaps.
    let now = match layout {
        DayPartition::Swappable { existing: Some(p) } => fingerprint(engine, Method::Native, &Scope::Table { table: p, filter: None }, output_cols)?,
        DayPartition::Swappable { existing: None } => {
            fingerprint_select(engine, Method::Native, "fp", output_cols)?.of(0, 0)
        }
        _ => fingerprint(engine, Method::Native, scope, output_cols)?,
    };
    let same = now.kind == last.fingerprint_kind && now.rows == last.output_rows && now.checksum == last.output_checksum;
    Ok(same.then_some(now))
}

/// The name of a new day partition: `<table>_<yyyymmdd>`, the table part
/// shortened to keep within PostgreSQL's 63-byte identifiers.
fn day_partition_name(table: &str, day: RunDate) -> String {
    let suffix = day.date().format("_%Y%m%d").to_string();
    let mut head = table.to_owned();
    while head.len() + suffix.len() > 63 {
        head.pop();
    }
    head + &suffix
}

/// Whether each of `source`'s columns is in `target` with the same type.
fn same_types(source: &[Column], target: &[Column]) -> bool {
    source.iter().all(|s| target.iter().any(|t| t.name == s.name && t.ty == s.ty))
}

/// `INSERT INTO into … SELECT` of the source's rows (the first `limit`),
/// the partition column taken from `tap` when the insert is tapped.
fn insert_sql(job: &Job, shape: &Shape, params: &RunParams, partition: &str, into: &TableName, limit: Option<u64>, tap: Option<&Sql>) -> Sql {
    let col_list = shape.source.iter().map(|c| quote_ident(&c.name)).collect::<Vec<_>>().join(", ");
    let mut sql = Sql::new();
    sql.push("INSERT INTO ").push(&into.quoted()).push(" (").push(&col_list).push(") SELECT ");
    for (i, c) in shape.source.iter().enumerate() {
        if i > 0 {
            sql.push(", ");
        }
        match tap {
            Some(t) if c.name == partition => {
                sql.text.push_str(&t.text);
                sql.params.extend(t.params.iter().cloned());
            }
            _ => {
                sql.push(&format!("s.{}", quote_ident(&c.name)));
            }
        }
    }
    sql.push(" FROM ");
    Scope::Source { template: job.source.template(), params: params }.write_from(&mut sql, "s");
    if let Some(n) = limit {
        sql.push(" LIMIT ").typed_param(Value::Int(n as i64), "BIGINT");
    }
    sql
}
