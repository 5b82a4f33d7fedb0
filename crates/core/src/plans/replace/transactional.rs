//! `replace_partition` on engines with transactions: the day deleted and
//! inserted, or swapped in whole, in one transaction with its guards,
//! fingerprints, audits and ledger row.

use std::time::Instant;

use crate::engine::{partition_exchange, query_count, Column, DayPartition, Engine};
use crate::error::{Error, FailPoint, Result};
use crate::fingerprint::compute::{fingerprint, fingerprint_kind, fingerprint_select, Filter, FingerprintSelect, Scope, FP_ROWS, FP_SUM};
use crate::fingerprint::runkey::run_key;
use crate::fingerprint::{Fingerprint, Method};
use crate::job::date::RunDate;
use crate::job::ident::{quote_ident, TableName};
use crate::job::spec::{Job, Swap};
use crate::job::sql::{RunParam, RunParams, Sql, Value};
use crate::run::ledger;
use crate::run::input::{describe_source, RunInput};
use crate::run::protocol::{elapsed_ms, fence, in_transaction, RunOptions, Trace};
use crate::run::report::{entry, skipped, RunReport};
use crate::run::sqlerror::first_row;
use crate::plans::steps::{check_source_columns, fingerprinted};

pub(super) fn replace_partition_with(job: &Job, run_date: RunDate, engine: &mut dyn Engine, opts: &RunOptions, run_input: &RunInput, started: Instant) -> Result<RunReport> {
    let mut trace = Trace::new();
    let started_at = chrono::Utc::now().naive_utc();
    let partition = job.partition.as_deref().ok_or_else(|| Error::Internal("replace_partition without partition".into()))?;
    let mut params = run_input.params.clone();

    // 1. Describe the source and check it fits the target.
    let source_cols = describe_source(job, engine, &params)?;
    trace.step("describe source");
    check_source_columns(job, &source_cols, partition)?;
    let target_cols = engine.table_columns(&job.target)?;
    // Schema drift: refused (naming the columns), or new columns to add in
    // the run's transaction.
    let added = crate::run::schema::reconcile(engine, job, &source_cols, target_cols.as_deref())?;
    let target_cols = target_cols.map(|mut cols| {
        cols.extend(added.iter().cloned());
        cols
    });
    trace.step("describe");
    let input_cols = fingerprinted(&source_cols, &job.metadata);
    let output_cols = match &target_cols {
        Some(cols) => fingerprinted(cols, &job.metadata),
        None => input_cols.clone(),
    };

    in_transaction(engine, |engine| {
        fence(engine, job, &run_date.to_string(), opts)?;
        ledger::ensure(engine)?;
        trace.step("begin, ledger");

        // 2. Guards and input fingerprint in one scan of the source.
        let job_hash = job.definition_hash();
        let file_key = run_input.file_key(&job_hash, run_date);
        let scope = Scope::Table { table: &job.target, filter: Some(Filter::DateEquals(partition, run_date.date())) };
        let last = if !opts.force && target_cols.is_some() {
            ledger::entries_of_existing(engine, Some(&job.name), Some(run_date), Some(1))?.into_iter().next()
        } else {
            None
        };
        trace.step("ledger lookup");

        // How the day is changed: swapped in whole when the target is
        // partitioned by day (partition exchange), else delete + insert.
        // With `swap = "delete_insert"` never swapped: a reader whose
        // snapshot predates the run (REPEATABLE READ, SERIALIZABLE,
        // pg_dump) would find the swapped-in partition's rows too new for
        // it, an empty day; deleted rows it still sees (MVCC).
        let layout = match &target_cols {
            Some(_) => match engine.partition_exchange() {
                Some(x) => x.day_partition(&job.target, partition, run_date.date())?,
                None => DayPartition::NotPartitioned,
            },
            None => DayPartition::NotPartitioned,
        };
        let exchange = job.swap == Swap::Exchange && matches!(layout, DayPartition::Swappable { .. });
        trace.step("layout");

        // A file source's run key is known from its files: a retry over the
        // same files, with the partition as recorded, reads no row.
        if let Some(key) = &file_key {
            params.run_key = key.clone();
        }
        if let (Some(last), Some(key)) = (&last, &file_key) {
            if let Some(now) = unchanged(engine, &layout, &scope, &output_cols, last, key)? {
                trace.step("target fp");
                let input = Fingerprint { kind: last.fingerprint_kind.clone(), rows: last.input_rows, checksum: last.input_checksum.clone() };
                return Ok(skipped(job, run_date, key, &input, &now, started));
            }
        }

        // 2. Guards before anything is deleted, in one scan of the source.
        //    The input fingerprint is taken in the same scan when it is
        //    needed before writing: to decide a skip, to bind :run_key, or
        //    because the target's columns differ from the source's. Otherwise
        //    the guards only count (cheap), and the fingerprint is taken once,
        //    of the partition as written, in the same transaction.
        let before_writing = (file_key.is_none() && (last.is_some() || job.source.template().uses_any(&[RunParam::RunKey])))
            || output_cols != input_cols
            || engine.dialect().fingerprint_before_writing();
        // Or, when nothing needs them before writing and the engine can tap
        //    the insert (DuckDB), the guards and the output fingerprint are
        //    taken as the rows stream into the delete + insert, and a failed
        //    guard rolls both back: nothing changes either way, with no scan
        //    of its own (see `Engine::tap_partition`).
        let is_date = |cols: &[Column]| cols.iter().any(|c| c.name == partition && c.ty.eq_ignore_ascii_case("DATE"));
        let tapped = if !before_writing
            && !exchange
            && !matches!(opts.fault, Some((FailPoint::MidInsert, _)))
            && is_date(&source_cols)
            && target_cols.as_deref().is_none_or(is_date)
        {
            // (Only a token: nothing is kept until the insert's rows arrive.)
            engine.accelerator().and_then(|a| a.tap_partition(&format!("s.{}", quote_ident(partition)), "s", &input_cols, run_date.date()))
        } else {
            None
        };
        let tap = tapped.is_some();
        let fp = if before_writing {
            fingerprint_select(engine, Method::Native, "s", &input_cols)?
        } else {
            // Only the count: the fingerprint is taken of the day as written.
            let kind = fingerprint_kind(engine, Method::Native)?;
            FingerprintSelect { select: format!("count(*) AS {}, 0 AS {}", quote_ident(FP_ROWS), quote_ident(FP_SUM)), kind, signature: Vec::new() }
        };
        let out_of_partition = |engine: &mut dyn Engine, params: &RunParams, rows: u64| -> Result<Error> {
            let mut sql = Sql::new();
            sql.push("SELECT * FROM ");
            Scope::Source { template: job.source.template(), params }.write_from(&mut sql, "s");
            sql.push(" WHERE s.").ident(partition).push(" IS DISTINCT FROM ");
            sql.typed_param(Value::Date(run_date.date()), "DATE").push(" LIMIT 1");
            Ok(Error::OutOfPartition { rows, column: partition.to_owned(), run_date: run_date.to_string(), sample: first_row(engine, &sql)? })
        };
        let (input_rows, sum) = if tap {
            (0, 0)
        } else {
            let mut sql = Sql::new();
            sql.push("SELECT ").push(&fp.select).push(", count(*) FILTER (WHERE s.").ident(partition);
            sql.push(" IS DISTINCT FROM ");
            sql.typed_param(Value::Date(run_date.date()), "DATE").push(") AS \"outside\" FROM ");
            Scope::Source { template: job.source.template(), params: &params }.write_from(&mut sql, "s");
            let rows = engine.query(&sql)?;
            let row = rows.single("the guard scan")?;
            let input_rows = row.count(FP_ROWS)?;
            let sum = engine.dialect().read_sum(row.value(FP_SUM)?)?;
            let outside = row.count("outside")?;
            if outside > 0 {
                return Err(out_of_partition(engine, &params, outside)?);
            }
            if let Some(min) = job.min_rows {
                if input_rows < min {
                    return Err(Error::TooFewRows { rows: input_rows, min_rows: min, run_date: run_date.to_string() });
                }
            }
            trace.step("guards");
            (input_rows, sum)
        };
        let early_input = before_writing.then(|| fp.of(input_rows, sum));
        if let (Some(input), None) = (&early_input, &file_key) {
            params.run_key = run_key(&job_hash, run_date, input);
        }

        // 3. A retry over the same input, with the target still holding the
        //    recorded output, has nothing to do.
        if let (Some(last), Some(input), None) = (&last, &early_input, &file_key) {
            if last.fingerprint_kind == input.kind {
                if let Some(now) = unchanged(engine, &layout, &scope, &output_cols, last, &params.run_key)? {
                    trace.step("target fp");
                    return Ok(skipped(job, run_date, &params.run_key, input, &now, started));
                }
            }
        }
        opts.step(FailPoint::AfterGuards)?;

        // 4. Create the target from the source's columns when missing, or
        //    add the source's new columns (on_schema_change).
        crate::run::schema::append(engine, &job.target, &added)?;
        let created_target = target_cols.is_none();
        if created_target {
            engine.execute(&Sql::raw(format!("CREATE SCHEMA IF NOT EXISTS {}", quote_ident(&job.target.schema))))?;
            let cols: Vec<String> = source_cols.iter().map(|c| format!("{} {}", quote_ident(&c.name), c.ty)).collect();
            engine.execute(&Sql::raw(format!("CREATE TABLE {} ({})", job.target.quoted(), cols.join(", "))))?;
        }

        let col_list = source_cols.iter().map(|c| quote_ident(&c.name)).collect::<Vec<_>>().join(", ");
        let insert_tapped = |into: &TableName, limit: Option<u64>, tapped: Option<&Sql>| {
            let mut sql = Sql::new();
            sql.push("INSERT INTO ").push(&into.quoted()).push(" (").push(&col_list).push(") SELECT ");
            for (i, c) in source_cols.iter().enumerate() {
                if i > 0 {
                    sql.push(", ");
                }
                match tapped {
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
            Scope::Source { template: job.source.template(), params: &params }.write_from(&mut sql, "s");
            if let Some(n) = limit {
                sql.push(" LIMIT ").typed_param(Value::Int(n as i64), "BIGINT");
            }
            sql
        };
        let insert = |into: &TableName, limit: Option<u64>| insert_tapped(into, limit, None);
        let (rows_deleted, rows_inserted, method, staged_fp) = match &layout {
            // 5a. Partition exchange: build the day as a standalone table
            //     (readers still see the old day, unblocked), then detach the
            //     old partition and attach the new one, in this transaction.
            DayPartition::Swappable { existing } if exchange => {
                let staged = partition_exchange(engine)?.create_day_table(&job.target, partition, run_date.date())?;
                if matches!(opts.fault, Some((FailPoint::MidInsert, _))) {
                    engine.execute(&insert(&staged, Some(input_rows / 2)))?;
                    opts.step(FailPoint::MidInsert)?;
                }
                let rows_inserted = engine.execute(&insert(&staged, None))?;
                trace.step("insert (staged)");
                opts.step(FailPoint::AfterInsert)?;
                let staged_fp = match &early_input {
                    Some(input) if output_cols == input_cols => Some(input.clone()),
                    _ => Some(fingerprint(engine, Method::Native, &Scope::Table { table: &staged, filter: None }, &output_cols)?),
                };
                trace.step("output fp");
                let (rows_deleted, name) = match existing {
                    Some(old) => {
                        let mut sql = Sql::new();
                        sql.push("SELECT count(*) AS \"n\" FROM ").push(&old.quoted());
                        let n = query_count(engine, &sql, "n", "the day's old partition")?;
                        partition_exchange(engine)?.drop_partition(&job.target, old)?;
                        (n, old.table.clone())
                    }
                    None => (0, day_partition_name(&job.target.table, run_date)),
                };
                opts.step(FailPoint::AfterDelete)?;
                partition_exchange(engine)?.attach_day(&job.target, &staged, partition, run_date.date(), &name)?;
                trace.step("swap");
                (rows_deleted, rows_inserted, "partition exchange", staged_fp)
            }
            // 5b. Delete the partition, insert the source's rows.
            _ => {
                // `swap = "delete_insert"` on a target partitioned by day
                // with no partition for this day yet: the insert needs one.
                // Created empty, in this transaction (a reader with an
                // older snapshot saw no rows of the day, and sees none).
                if let DayPartition::Swappable { existing: None } = &layout {
                    let empty = partition_exchange(engine)?.create_day_table(&job.target, partition, run_date.date())?;
                    partition_exchange(engine)?.attach_day(&job.target, &empty, partition, run_date.date(), &day_partition_name(&job.target.table, run_date))?;
                    trace.step("day partition");
                }
                let mut sql = Sql::new();
                sql.push("DELETE FROM ").push(&job.target.quoted()).push(" WHERE ").ident(partition).push(" = ");
                sql.typed_param(Value::Date(run_date.date()), "DATE");
                let rows_deleted = engine.execute(&sql)?;
                trace.step("delete");
                opts.step(FailPoint::AfterDelete)?;
                if matches!(opts.fault, Some((FailPoint::MidInsert, _))) {
                    engine.execute(&insert(&job.target, Some(input_rows / 2)))?;
                    opts.step(FailPoint::MidInsert)?;
                }
                let (rows_inserted, tapped_fp) = match &tapped {
                    None => (engine.execute(&insert(&job.target, None))?, None),
                    Some((expr, token)) => {
                        let inserted = engine.execute(&insert_tapped(&job.target, None, Some(expr)));
                        let seen = engine.accelerator().and_then(|a| a.tap_close(*token));
                        let inserted = inserted?;
                        let (seen, outside, sum) = seen.ok_or_else(|| Error::Internal("the insert's tap was lost".into()))?;
                        if seen > inserted {
                            // The tap must see each inserted row once: its
                            // fingerprint would be wrong.
                            return Err(Error::Internal(format!("the insert's tap saw {seen} rows but {inserted} were inserted; rolled back")));
                        }
                        // A NULL partition is not seen by the tap: outside too.
                        let outside = outside + inserted.saturating_sub(seen);
                        if outside > 0 {
                            return Err(out_of_partition(engine, &params, outside)?);
                        }
                        if let Some(min) = job.min_rows {
                            if inserted < min {
                                return Err(Error::TooFewRows { rows: inserted, min_rows: min, run_date: run_date.to_string() });
                            }
                        }
                        let signature: Vec<String> = output_cols.iter().map(|c| format!("{} {}", c.name, c.ty)).collect();
                        (inserted, Some(Fingerprint::from_sum(&fp.kind, &signature, inserted, sum)))
                    }
                };
                trace.step(if tapped_fp.is_some() { "insert (guards and fingerprint tapped)" } else { "insert" });
                opts.step(FailPoint::AfterInsert)?;
                (rows_deleted, rows_inserted, "delete+insert", tapped_fp)
            }
        };
        let input_rows = if tap { rows_inserted } else { input_rows };

        // 6. Fingerprint what was written, check it, record it.
        // The partition now holds exactly the source rows (the guard proved
        // every one belongs to it, the delete removed every other). When the
        // input was fingerprinted before writing and the target's
        // fingerprinted columns are the source's (same names, types, order),
        // that scan (same transaction, same snapshot) is the output's
        // fingerprint; otherwise scan the partition as written.
        let output = match (&early_input, staged_fp) {
            (_, Some(staged)) => staged,
            (Some(input), None) if output_cols == input_cols => input.clone(),
            _ => fingerprint(engine, Method::Native, &scope, &output_cols)?,
        };
        let input = early_input.unwrap_or_else(|| output.clone());
        let key = file_key.unwrap_or_else(|| run_key(&job_hash, run_date, &input));
        trace.step("output fp");
        if rows_inserted != input_rows || output.rows != input_rows {
            return Err(Error::Internal(format!(
                "the source gave {input_rows} rows but {rows_inserted} were inserted and the partition holds {}; rolled back",
                output.rows
            )));
        }
        // 7. Audit the day as it will be published (inside the transaction:
        //    a blocking failure rolls everything back).
        let audits = if job.audits.is_empty() {
            Vec::new()
        } else {
            let previous = if rows_deleted > 0 {
                Some(rows_deleted)
            } else {
                // A new day: compare with the day before.
                let mut sql = Sql::new();
                sql.push("SELECT count(*) AS \"n\" FROM ").push(&job.target.quoted()).push(" WHERE ").ident(partition).push(" = ");
                sql.typed_param(Value::Date(run_date.date() - chrono::Duration::days(1)), "DATE");
                Some(query_count(engine, &sql, "n", "the day before's rows")?)
            };
            let from = |sql: &mut Sql| {
                sql.push("(SELECT * FROM ");
                scope.write_from(sql, "s");
                sql.push(") AS a");
            };
            let scope = crate::run::audit::AuditScope { from: &from, previous_rows: previous, run_date: run_date.date() };
            let results = crate::run::audit::audit(job, engine, &scope)?;
            trace.step("audits");
            results
        };
        let mut report = RunReport::new(job, run_date, key, "committed", &input, &output);
        report.rows_deleted = rows_deleted;
        report.rows_inserted = rows_inserted;
        report.created_target = created_target;
        report.audits = audits;
        report.input_files = run_input.files.clone();
        report.method = method.into();
        report.method_note = match &layout {
            DayPartition::Unswappable(why) if job.swap == Swap::Exchange => Some(format!("no partition exchange: {why}")),
            DayPartition::Swappable { existing: Some(p) } if !exchange => {
                Some(format!("no partition exchange: the job has swap = \"delete_insert\" (the day's rows were deleted from {p} and the new ones inserted)"))
            }
            DayPartition::Swappable { existing: None } if !exchange => Some(format!(
                "no partition exchange: the job has swap = \"delete_insert\" (the day's partition {} was created empty, then inserted into)",
                TableName { schema: job.target.schema.clone(), table: day_partition_name(&job.target.table, run_date) }
            )),
            _ => None,
        };
        ledger::record(engine, &entry(job, &job_hash, &report, started_at))?;
        opts.step(FailPoint::BeforeCommit)?;
        trace.step("ledger row");
        Ok(report)
    })
    .map(|mut r| {
        trace.step("commit");
        r.elapsed_ms = elapsed_ms(started);
        r
    })
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
