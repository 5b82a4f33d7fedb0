//! `replace_partition` on engines without transactions: the day overwritten
//! in one statement under a lease (the plan is described in
//! [`crate::plans::lease`]).

use std::time::Instant;

use crate::engine::measure::{fingerprint, fingerprint_select, Filter, Scope, FP_ROWS, FP_SUM};
use crate::engine::{query_count, Column, Leases};
use crate::error::{AuditResult, Error, FailPoint, Result};
use crate::fingerprint::runkey::run_key;
use crate::fingerprint::{Fingerprint, Method};
use crate::job::date::RunDate;
use crate::job::ident::quote_ident;
use crate::job::spec::Job;
use crate::job::sql::{RunParam, RunParams, Sql, Value};
use crate::plans::lease::leased;
use crate::plans::steps::{check_day_rows, check_source_columns, fingerprinted, guard_scan, signature_of};
use crate::run::input::{describe_source, RunInput};
use crate::run::ledger;
use crate::run::protocol::{elapsed_ms, RunOptions, Trace};
use crate::run::report::{entry, skipped, RunReport};

pub(crate) fn replace_partition_with(job: &Job, run_date: RunDate, engine: &mut dyn Leases, opts: &RunOptions, run_input: &RunInput, started: Instant) -> Result<RunReport> {
    let partition = job.partition.as_deref().ok_or_else(|| Error::Internal("replace_partition without partition".into()))?;
    let params = run_input.params.clone();
    let source = describe_source(job, engine, &params)?;
    check_source_columns(job, &source, partition)?;
    let mut day = Overwrite { job, run_date, opts, run_input, partition, params, source, trace: Trace::new(), started_at: chrono::Utc::now().naive_utc(), ruled_out: None };
    // A retry over an unchanged day is found before the lease is taken:
    // finding it writes nothing, so it needs none.
    if let Some(report) = day.skip_before_lease(engine, started)? {
        return Ok(RunReport { elapsed_ms: elapsed_ms(started), ..report });
    }
    // The target is looked at under the lease: a run that waited for
    // another sees what that one left (a table it created, say).
    let report = leased(engine, job, &run_date.to_string(), opts, &[], |engine| day.run(engine, started))?;
    Ok(RunReport { elapsed_ms: elapsed_ms(started), ..report })
}

/// One run of `replace_partition` under a lease.
struct Overwrite<'a> {
    job: &'a Job,
    run_date: RunDate,
    opts: &'a RunOptions,
    run_input: &'a RunInput,
    partition: &'a str,
    params: RunParams,
    /// The source query's columns.
    source: Vec<Column>,
    trace: Trace,
    started_at: chrono::NaiveDateTime,
    /// The ledger's last entry for the day (run key, when it finished) as
    /// the check before the lease found it, with another run key or
    /// another day: while it is still the last, no skip is possible.
    ruled_out: Option<(String, chrono::NaiveDateTime)>,
}

/// The target as the run finds it.
struct Shape {
    /// Its columns (with those schema drift adds), `None` before it exists.
    target: Option<Vec<Column>>,
    /// The source's new columns it takes.
    added: Vec<Column>,
    /// The fingerprinted columns of the input and of the output.
    input: Vec<Column>,
    output: Vec<Column>,
    /// The target is an unpartitioned table the engine rewrites by rows
    /// (Delta): the day's rows are replaced with [`Leases::replace_rows`].
    by_rows: bool,
}

impl Overwrite<'_> {
    /// The steps in order.
    fn run(&mut self, engine: &mut dyn Leases, started: Instant) -> Result<RunReport> {
        let shape = self.shape(engine)?;
        ledger::ensure(engine)?;
        // Where the engine observes its writes: the day written in one job
        // that reads the source once.
        if let Some(report) = self.run_observed(engine, &shape)? {
            return Ok(report);
        }
        // 1. Guards and the input fingerprint, in one scan of the source,
        //    before anything is written.
        let input = self.guard(engine, &shape)?;
        let job_hash = self.job.definition_hash();
        let key = self.run_input.file_key(&job_hash, self.run_date).unwrap_or_else(|| run_key(&job_hash, self.run_date, &input));
        self.params.run_key = key.clone();
        self.opts.run_key_known(self.job, self.run_date, &key);
        // 2. A retry over the same input, the day still as recorded:
        //    nothing to do.
        let rows_before = match self.rows_before(engine, &shape, &key)? {
            Before::Unchanged(now) => return Ok(skipped(self.job, self.run_date, &key, &input, &now, started)),
            Before::Rows(rows) => rows,
        };
        let audits = self.audit(engine, rows_before)?;
        self.opts.step(FailPoint::AfterGuards)?;
        // 3. The day replaced in one statement.
        self.write(engine, &shape, input.rows)?;
        self.opts.step(FailPoint::AfterInsert)?;
        // 4. The day as written, checked against the input.
        let output = self.output(engine, &shape, &input)?;
        // 5. Recorded.
        let mut report = RunReport::new(self.job, self.run_date, key, "committed", &input, &output);
        report.rows_deleted = rows_before.unwrap_or(0);
        report.rows_inserted = input.rows;
        report.created_target = shape.target.is_none();
        report.audits = audits;
        report.input_files = self.run_input.files.clone();
        report.method = "partition overwrite".into();
        // The data is committed already; a failure here leaves the run's
        // output without its ledger row (the next run rewrites and records).
        self.opts.step(FailPoint::BeforeCommit)?;
        ledger::record(engine, &entry(self.job, &job_hash, &report, self.started_at))?;
        self.trace.step("ledger row");
        Ok(report)
    }

    /// A retry that finds the day as the ledger's last entry for it
    /// recorded, with the same run key: skipped, without the lease. The
    /// guards and the input fingerprint, and the day's fingerprint, come
    /// from one query (both scans in one job). `None`, and the run goes
    /// on under the lease (which checks again), when the run is forced,
    /// the day has no entry (a first run reads nothing more), the job
    /// changed, the target's columns drifted, or the input or the day
    /// differs. Only reads: a run that waits for the lease meanwhile, or
    /// writes after it, finds the day as this check did or rewrites it.
    fn skip_before_lease(&mut self, engine: &mut dyn Leases, started: Instant) -> Result<Option<RunReport>> {
        if self.opts.force {
            return Ok(None);
        }
        // A session that read the target or the ledger before (an earlier
        // run of a backfill, say) must not decide on what it remembers.
        engine.refresh(&self.job.target)?;
        engine.refresh(&ledger::ledger_table())?;
        let job_hash = self.job.definition_hash();
        // Any failure to read the ledger (none yet, one of an older
        // fixpoint) declines: the run under the lease reads it properly.
        let Ok(entries) = ledger::entries_of_existing(engine, Some(&self.job.name), Some(self.run_date), Some(1)) else { return Ok(None) };
        let Some(last) = entries.into_iter().next().filter(|l| l.job_hash == job_hash) else { return Ok(None) };
        let shape = self.shape(engine)?;
        if shape.target.is_none() || !shape.added.is_empty() {
            return Ok(None);
        }
        let fp = fingerprint_select(engine, Method::Native, "s", &shape.input)?;
        let day_fp = fingerprint_select(engine, Method::Native, "fp", &shape.output)?;
        let mut sql = Sql::new();
        sql.push("SELECT g.*, d.").ident(FP_ROWS).push(" AS \"day_rows\", d.").ident(FP_SUM).push(" AS \"day_sum\" FROM (");
        sql.append(&guard_scan(self.job, &self.params, self.partition, self.run_date.date(), &fp.select));
        sql.push(") AS g CROSS JOIN (SELECT ").push(&day_fp.select).push(" FROM ");
        self.scope().write_from(&mut sql, "fp");
        sql.push(") AS d");
        let rows = engine.query(&sql)?;
        let row = rows.single("the guard scan")?;
        let input = fp.read(&row, engine)?;
        check_day_rows(engine, self.job, &self.params, self.partition, self.run_date, input.rows, row.count("outside")?)?;
        let key = self.run_input.file_key(&job_hash, self.run_date).unwrap_or_else(|| run_key(&job_hash, self.run_date, &input));
        let now = day_fp.of(row.count("day_rows")?, engine.dialect().read_sum(row.value("day_sum")?)?);
        self.trace.step("guards, input fp, day fp, before the lease");
        if last.run_key != key || last.fingerprint_kind != now.kind || last.output_rows != now.rows || last.output_checksum != now.checksum {
            self.ruled_out = Some((last.run_key, last.finished_at));
            return Ok(None);
        }
        self.opts.run_key_known(self.job, self.run_date, &key);
        Ok(Some(skipped(self.job, self.run_date, &key, &input, &now, started)))
    }

    /// The day written in one job that reads the source once, the rows
    /// observed as they are written: their count, the input fingerprint
    /// and the output's (over the values cast to the table's types, as
    /// stored). A row outside the day fails the write (the guard inside
    /// it), which leaves every partition as it was; `min_rows` of 1 is
    /// checked after it, since a write of no rows changes no partition.
    ///
    /// `None`, and the steps that scan before and after run instead, when
    /// the engine cannot observe a write, the rows depend on the run key
    /// (`:run_key` in the source, without a file source's key), the target is missing or takes
    /// new columns (its first run creates or alters it only once the
    /// source passed the guards), it is rewritten by rows, `min_rows` above
    /// 1 needs the count before anything is written, or a skip is still
    /// possible: the run is not forced and the ledger holds an entry for
    /// the day, of this job, other than the one the check before the lease
    /// ruled out (a run that waited while another recorded the same input
    /// finds its output).
    fn run_observed(&mut self, engine: &mut dyn Leases, shape: &Shape) -> Result<Option<RunReport>> {
        let (job, partition, run_date) = (self.job, self.partition, self.run_date);
        let Some(target) = shape.target.as_ref().filter(|_| shape.added.is_empty() && !shape.by_rows) else { return Ok(None) };
        if job.min_rows.is_some_and(|m| m > 1) || engine.observed_writes().is_none() {
            return Ok(None);
        }
        let job_hash = job.definition_hash();
        // The rows written must not depend on the run key unless it is
        // known before them (a file source's).
        let file_key = self.run_input.file_key(&job_hash, run_date);
        if file_key.is_none() && job.source.template().uses_any(&[RunParam::RunKey]) {
            return Ok(None);
        }
        let last = if self.opts.force { None } else { ledger::entries_of_existing(engine, Some(&job.name), Some(run_date), Some(1))?.into_iter().next() };
        if last.is_some_and(|l| l.job_hash == job_hash && self.ruled_out.as_ref() != Some(&(l.run_key.clone(), l.finished_at))) {
            return Ok(None);
        }
        let mut count = Sql::new();
        count.push("SELECT count(*) AS \"n\" FROM ");
        self.scope().write_from(&mut count, "fp");
        let rows_before = query_count(engine, &count, "n", "the day's count")?;
        if let Some(key) = &file_key {
            self.params.run_key = key.clone();
        }
        self.trace.step("day's count");
        let audits = self.audit(engine, Some(rows_before))?;
        self.opts.step(FailPoint::AfterGuards)?;
        // The delete and the insert are one statement here.
        self.opts.step(FailPoint::AfterDelete)?;
        self.opts.step(FailPoint::MidInsert)?;
        let select = self.select_in_table_order(target);
        let writes = engine.observed_writes().ok_or_else(|| Error::Internal("observed writes went away".into()))?;
        let observed = match writes.overwrite_observed(&job.target, &select, &shape.input, &shape.output) {
            Ok(o) => o,
            Err(e @ Error::Database { .. }) => {
                // A row outside the day failed it: refused as the guard
                // scan refuses, naming a row.
                let mut outside = Sql::new();
                outside.push("SELECT count(*) AS \"outside\" FROM ");
                Scope::Source { template: job.source.template(), params: &self.params }.write_from(&mut outside, "s");
                outside.push(" WHERE s.").ident(partition).push(" IS DISTINCT FROM ").typed_param(Value::Date(run_date.date()), "DATE");
                let n = query_count(engine, &outside, "outside", "the rows outside the day")?;
                check_day_rows(engine, job, &self.params, partition, run_date, u64::MAX, n)?;
                return Err(e);
            }
            Err(e) => return Err(e),
        };
        if observed.rows == 0 {
            // Nothing was written: refused below `min_rows`, else the day
            // is emptied, as a run over an empty day does.
            check_day_rows(engine, job, &self.params, partition, run_date, 0, 0)?;
            engine.drop_partition_value(&job.target, partition, &Value::Date(run_date.date()), "DATE")?;
        }
        self.trace.step("overwrite, observed");
        self.opts.step(FailPoint::AfterInsert)?;
        let input = fingerprint_select(engine, Method::Native, "s", &shape.input)?.of(observed.rows, observed.input_sum);
        let output = fingerprint_select(engine, Method::Native, "fp", &shape.output)?.of(observed.rows, observed.output_sum);
        let key = file_key.unwrap_or_else(|| run_key(&job_hash, run_date, &input));
        self.params.run_key = key.clone();
        self.opts.run_key_known(job, run_date, &key);
        let mut report = RunReport::new(job, run_date, key, "committed", &input, &output);
        report.rows_deleted = rows_before;
        report.rows_inserted = observed.rows;
        report.audits = audits;
        report.input_files = self.run_input.files.clone();
        report.method = "partition overwrite, observed".into();
        self.opts.step(FailPoint::BeforeCommit)?;
        ledger::record(engine, &entry(job, &job_hash, &report, self.started_at))?;
        self.trace.step("ledger row");
        Ok(Some(report))
    }

    /// The source's rows as the table's columns in its order, by name
    /// (NULL where the source has none), the day's column guarded as in
    /// [`Overwrite::guarded_select`].
    fn select_in_table_order(&self, target: &[Column]) -> Sql {
        let (job, partition) = (self.job, self.partition);
        let mut sql = Sql::new();
        sql.push("SELECT ");
        for (i, c) in target.iter().enumerate() {
            if i > 0 {
                sql.push(", ");
            }
            if !self.source.iter().any(|s| s.name == c.name) {
                sql.push(&format!("CAST(NULL AS {})", c.ty));
            } else if c.name != partition {
                sql.push("s.").ident(&c.name);
            } else {
                sql.push("CASE WHEN s.").ident(partition).push(" IS DISTINCT FROM ").typed_param(Value::Date(self.run_date.date()), "DATE");
                sql.push(" THEN raise_error(").param(Value::Text(format!(
                    "fixpoint: a source row of job {} is not in the run's partition {partition} = {}; nothing was overwritten",
                    job.name, self.run_date
                )));
                sql.push(") ELSE s.").ident(partition).push(" END");
            }
            sql.push(" AS ").ident(&c.name);
        }
        sql.push(" FROM ");
        Scope::Source { template: job.source.template(), params: &self.params }.write_from(&mut sql, "s");
        sql
    }

    /// The day's rows in the target.
    fn scope(&self) -> Scope<'_> {
        Scope::Table { table: &self.job.target, filter: Some(Filter::DateEquals(self.partition, self.run_date.date())) }
    }

    /// The target's columns, schema drift reconciled; refused when it is not
    /// stored partitioned by the day.
    fn shape(&mut self, engine: &mut dyn Leases) -> Result<Shape> {
        let (job, partition) = (self.job, self.partition);
        let target = engine.table_columns(&job.target)?;
        let added = crate::run::schema::reconcile(engine, job, &self.source, target.as_deref())?;
        let stored_by = match target {
            Some(_) => engine.partition_columns(&job.target)?,
            None => vec![partition.to_owned()],
        };
        // An unpartitioned table: the files holding the day's rows are
        // rewritten, where the engine does that in one atomic step.
        let by_rows = stored_by.is_empty() && engine.replaces_rows();
        if stored_by != [partition.to_owned()] && !by_rows {
            return Err(Error::Schema {
                message: format!("{} is not stored partitioned by {partition}: on {} a run replaces the day's partition whole, and this table has none", job.target, engine.name()),
                hint: Some(format!("recreate {} with PARTITIONED BY ({partition}), or drop it and let the first run create it", job.target)),
            });
        }
        let target = target.map(|mut cols| {
            cols.extend(added.iter().cloned());
            cols
        });
        let input = fingerprinted(&self.source, &job.metadata);
        let output = target.as_deref().map_or_else(|| input.clone(), |cols| fingerprinted(cols, &job.metadata));
        self.trace.step("describe");
        Ok(Shape { target, added, input, output, by_rows })
    }

    /// The guard scan: the input fingerprint, no row outside the day, at
    /// least `min_rows`.
    fn guard(&mut self, engine: &mut dyn Leases, shape: &Shape) -> Result<Fingerprint> {
        let fp = fingerprint_select(engine, Method::Native, "s", &shape.input)?;
        let rows = engine.query(&guard_scan(self.job, &self.params, self.partition, self.run_date.date(), &fp.select))?;
        let row = rows.single("the guard scan")?;
        let input = fp.read(&row, engine)?;
        check_day_rows(engine, self.job, &self.params, self.partition, self.run_date, input.rows, row.count("outside")?)?;
        self.trace.step("guards, input fp");
        Ok(input)
    }

    /// The day before the run: unchanged since the ledger's last entry with
    /// this run key (then skipped), or its row count (for the report and
    /// the audits; `None` before the target exists). The day is
    /// fingerprinted only when the last entry has this run key.
    fn rows_before(&mut self, engine: &mut dyn Leases, shape: &Shape, key: &str) -> Result<Before> {
        if shape.target.is_none() {
            return Ok(Before::Rows(None));
        }
        let last = if self.opts.force { None } else { ledger::entries_of_existing(engine, Some(&self.job.name), Some(self.run_date), Some(1))?.into_iter().next() };
        let rows = match last.filter(|l| l.run_key == key) {
            Some(last) => {
                let now = fingerprint(engine, Method::Native, &self.scope(), &shape.output)?;
                if last.fingerprint_kind == now.kind && last.output_rows == now.rows && last.output_checksum == now.checksum {
                    return Ok(Before::Unchanged(now));
                }
                now.rows
            }
            None => {
                let mut sql = Sql::new();
                sql.push("SELECT count(*) AS \"n\" FROM ");
                self.scope().write_from(&mut sql, "fp");
                query_count(engine, &sql, "n", "the day's count")?
            }
        };
        self.trace.step("ledger, target fp");
        Ok(Before::Rows(Some(rows)))
    }

    /// Audits of the day as it will be published: the source's rows, before
    /// anything is written (a blocking failure then changes nothing).
    fn audit(&mut self, engine: &mut dyn Leases, rows_before: Option<u64>) -> Result<Vec<AuditResult>> {
        if self.job.audits.is_empty() {
            return Ok(Vec::new());
        }
        let (job, params) = (self.job, &self.params);
        let from = |sql: &mut Sql| {
            sql.push("(SELECT * FROM ");
            Scope::Source { template: job.source.template(), params }.write_from(sql, "s");
            sql.push(") AS a");
        };
        let scope = crate::run::audit::AuditScope { from: &from, previous_rows: rows_before, run_date: self.run_date.date() };
        crate::run::audit::audit(job, engine, &scope)
    }

    /// The target created when missing (partitioned by the day), the new
    /// columns added, then the day replaced in one statement (an empty
    /// day: its partition dropped).
    fn write(&mut self, engine: &mut dyn Leases, shape: &Shape, input_rows: u64) -> Result<()> {
        let (job, partition) = (self.job, self.partition);
        if shape.target.is_none() {
            engine.execute(&Sql::raw(format!("CREATE SCHEMA IF NOT EXISTS {}", quote_ident(&job.target.schema))))?;
            engine.create_table(&job.target, &self.source, Some(partition))?;
        }
        crate::run::schema::append(engine, &job.target, &shape.added)?;
        // The delete and the insert are one statement here: a fault at
        // either comes before it.
        self.opts.step(FailPoint::AfterDelete)?;
        self.opts.step(FailPoint::MidInsert)?;
        let day = Value::Date(self.run_date.date());
        if shape.by_rows {
            // The day's rows out, the new ones in, one step; rows of other
            // days stay (a NULL day too: `=` is not true for it).
            let mut dropped = Sql::new();
            dropped.push("t.").ident(partition).push(" = ").typed_param(day, "DATE");
            let names: Vec<String> = self.source.iter().map(|c| c.name.clone()).collect();
            engine.replace_rows(&job.target, &names, &dropped, &self.guarded_select())?;
        } else if input_rows == 0 {
            engine.drop_partition_value(&job.target, partition, &day, "DATE")?;
        } else {
            let names: Vec<String> = self.source.iter().map(|c| c.name.clone()).collect();
            engine.overwrite_partitions(&job.target, &names, &self.guarded_select())?;
        }
        self.trace.step("overwrite");
        Ok(())
    }

    /// The source's rows to write, with the second guard: a row of another
    /// date fails the statement (and with it the whole overwrite).
    fn guarded_select(&self) -> Sql {
        let (job, partition) = (self.job, self.partition);
        let mut sql = Sql::new();
        sql.push("SELECT ");
        for (i, c) in self.source.iter().enumerate() {
            if i > 0 {
                sql.push(", ");
            }
            if c.name != partition {
                sql.push("s.").ident(&c.name);
                continue;
            }
            sql.push("CASE WHEN s.").ident(partition).push(" IS DISTINCT FROM ").typed_param(Value::Date(self.run_date.date()), "DATE");
            sql.push(" THEN raise_error(").param(Value::Text(format!(
                "fixpoint: a source row of job {} is not in the run's partition {partition} = {} (the source changed during the run); nothing was overwritten",
                job.name, self.run_date
            )));
            sql.push(") ELSE s.").ident(partition).push(" END");
        }
        sql.push(" FROM ");
        Scope::Source { template: job.source.template(), params: &self.params }.write_from(&mut sql, "s");
        sql
    }

    /// The day as written: its fingerprint (over the target's columns, as
    /// recorded) and, in the same scan, over the source's columns in the
    /// source's order, which must be the input's: a source that changed
    /// between the guard scan and the overwrite is refused (no ledger row).
    fn output(&mut self, engine: &mut dyn Leases, shape: &Shape, input: &Fingerprint) -> Result<Fingerprint> {
        let (job, partition, run_date) = (self.job, self.partition, self.run_date);
        let fp = fingerprint_select(engine, Method::Native, "fp", &shape.output)?;
        let check = !shape.input.is_empty() && shape.input.iter().all(|c| shape.output.iter().any(|o| o.name == c.name));
        let mut sql = Sql::new();
        sql.push("SELECT ").push(&fp.select);
        if check {
            let hash = engine.dialect().native_row_hash("fp", &shape.input).unwrap_or_else(|| "0".into());
            sql.push(&format!(", sum({hash}) AS \"as_input\""));
        }
        sql.push(" FROM ");
        self.scope().write_from(&mut sql, "fp");
        let rows = engine.query(&sql)?;
        let row = rows.single("the output scan")?;
        let output = fp.read(&row, engine)?;
        let as_input = match check {
            true => Some(Fingerprint::from_sum(&input.kind, &signature_of(&shape.input), output.rows, engine.dialect().read_sum(row.value("as_input")?)?)),
            false => None,
        };
        self.trace.step("output fp");
        if output.rows != input.rows || as_input.is_some_and(|f| f != *input) {
            return Err(Error::DataRefused {
                message: format!(
                    "the source of job {} changed while the run read it: it gave {} rows (checksum {}) and the partition {partition} = {run_date} now holds {} rows (checksum {}); the partition holds a complete later read of the source, and no ledger row was written",
                    job.name, input.rows, input.checksum, output.rows, output.checksum
                ),
                hint: Some("run it again once the source is stable (the next run rewrites the day and records it)".into()),
            });
        }
        Ok(output)
    }
}

/// The day before the run.
enum Before {
    /// As the ledger's last entry with this run key recorded it.
    Unchanged(Fingerprint),
    /// Its rows (`None` before the target exists).
    Rows(Option<u64>),
}
