//! `replace_partition` on engines without transactions: the day overwritten
//! in one statement under a lease (the plan is described in
//! [`crate::plans::lease`]).

use std::time::Instant;

use crate::engine::{query_count, Leases};
use crate::error::{Error, FailPoint, Result};
use crate::fingerprint::compute::{fingerprint, fingerprint_select, Filter, Scope};
use crate::fingerprint::runkey::run_key;
use crate::fingerprint::{Fingerprint, Method};
use crate::job::date::RunDate;
use crate::job::ident::quote_ident;
use crate::job::spec::Job;
use crate::job::sql::{Sql, Value};
use crate::run::ledger;
use crate::run::input::{describe_source, RunInput};
use crate::run::protocol::{RunOptions, Trace};
use crate::run::report::{entry, skipped, RunReport};
use crate::run::sqlerror::first_row;
use crate::plans::steps::{fingerprinted, signature_of};
use crate::plans::lease::leased;

pub(crate) fn replace_partition_with(
    job: &Job,
    run_date: RunDate,
    engine: &mut dyn Leases,
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
    crate::plans::steps::check_source_columns(job, &source_cols, partition)?;

    // The target is looked at under the lease: a run that waited for
    // another sees what that one left (a table it created, say).
    leased(engine, job, &run_date.to_string(), opts, |engine| {
        let target_cols = engine.table_columns(&job.target)?;
        let added = crate::run::schema::reconcile(engine, job, &source_cols, target_cols.as_deref())?;
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
        let fp = fingerprint_select(engine, Method::Native, "s", &input_cols)?;
        let mut sql = Sql::new();
        sql.push("SELECT ").push(&fp.select).push(", count(*) FILTER (WHERE s.").ident(partition).push(" IS DISTINCT FROM ");
        sql.typed_param(day.clone(), "DATE").push(") AS \"outside\" FROM ");
        Scope::Source { template: job.source.template(), params: &params }.write_from(&mut sql, "s");
        let rows = engine.query(&sql)?;
        let row = rows.single("the guard scan")?;
        let input = fp.read(&row, engine)?;
        let input_rows = input.rows;
        let outside = row.count("outside")?;
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
            sql.push("SELECT count(*) AS \"n\" FROM ");
            scope.write_from(&mut sql, "fp");
            rows_before = Some(query_count(engine, &sql, "n", "the day's count")?);
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
            let audit_scope = crate::run::audit::AuditScope { from: &from, previous_rows: rows_before, run_date: run_date.date() };
            crate::run::audit::audit(job, engine, &audit_scope)?
        };
        opts.step(FailPoint::AfterGuards)?;

        // 3. Create the target when missing (partitioned by the day), add
        //    new columns, then replace the day in one statement.
        let created_target = target_cols.is_none();
        if created_target {
            engine.execute(&Sql::raw(format!("CREATE SCHEMA IF NOT EXISTS {}", quote_ident(&job.target.schema))))?;
            engine.create_table(&job.target, &source_cols, Some(partition))?;
        }
        crate::run::schema::append(engine, &job.target, &added)?;
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
            let fp = fingerprint_select(engine, Method::Native, "fp", &output_cols)?;
            let check = input_cols.iter().all(|c| output_cols.iter().any(|o| o.name == c.name)) && !input_cols.is_empty();
            let mut sql = Sql::new();
            sql.push("SELECT ").push(&fp.select);
            if check {
                let hash = engine.dialect().native_row_hash("fp", &input_cols).unwrap_or_else(|| "0".into());
                sql.push(&format!(", sum({hash}) AS \"as_input\""));
            }
            sql.push(" FROM ");
            scope.write_from(&mut sql, "fp");
            let rows = engine.query(&sql)?;
            let row = rows.single("the output scan")?;
            let output = fp.read(&row, engine)?;
            let as_input = match check {
                true => Some(Fingerprint::from_sum(&input.kind, &signature_of(&input_cols), output.rows, engine.dialect().read_sum(row.value("as_input")?)?)),
                false => None,
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
        report.elapsed_ms = crate::run::protocol::elapsed_ms(started);
        Ok(report)
    })
}
