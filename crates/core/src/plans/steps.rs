//! Steps the plans share.

use chrono::NaiveDate;

use crate::engine::measure::Scope;
use crate::engine::{Column, Engine, Rows};
use crate::error::{Error, Result};
use crate::job::date::RunDate;
use crate::job::spec::Job;
use crate::job::sql::{RunParams, Sql, Value};
use crate::run::sqlerror::first_row_of;

/// Whether a column of type `ty` can hold a run's day: a DATE (or a
/// timestamp, equal to the run date at midnight; a NULL literal's type,
/// whose rows the guard refuses as outside the day).
pub(crate) fn is_day_type(ty: &str) -> bool {
    let family = crate::run::schema::type_family(ty);
    matches!(family.trim_matches('"'), "date" | "timestamp" | "timestamptz" | "timestamp_ntz" | "timestamp_ltz" | "null")
}

pub(crate) fn fingerprinted<'c>(columns: &'c [Column], metadata: &[String]) -> Vec<Column> {
    columns.iter().filter(|c| !metadata.contains(&c.name)).cloned().collect()
}

/// The source has the partition column, as a date, and each column once.
pub(crate) fn check_source_columns(job: &Job, source_cols: &[Column], partition: &str) -> Result<()> {
    let Some(p) = source_cols.iter().find(|c| c.name == partition) else {
        return Err(Error::Schema {
            message: format!("the source query of job {} has no column {partition:?} (the job's partition column)", job.name),
            hint: Some(format!("select the run's date as {partition}, e.g. `SELECT …, :run_date AS {partition}`")),
        });
    };
    // Every run compares it with the run date (`= :run_date`, a DATE):
    // another type (an integer day 20261020, a text) never matches, and
    // the engines refuse the comparison mid-run.
    if !is_day_type(&p.ty) {
        return Err(job.spec_error(
            "partition",
            format!(
                "the partition column {partition} is {} in the source query, but replace_partition compares it with the run date (`{partition} = :run_date`, a DATE): it must be a DATE; nothing was changed",
                p.ty
            ),
            format!(
                "return the day as a DATE in the source query (e.g. `CAST(… AS DATE) AS {partition}`, or `:run_date AS {partition}` in a query filtered to the day) into a target whose {partition} is a DATE, or set `partition` to a DATE column of the source"
            ),
        ));
    }
    let mut seen = std::collections::HashSet::new();
    if let Some(dup) = source_cols.iter().find(|c| !seen.insert(c.name.as_str())) {
        return Err(Error::Schema {
            message: format!("the source query returns the column {:?} twice", dup.name),
            hint: Some("give each output column its own name with AS".into()),
        });
    }
    Ok(())
}

/// The native fingerprint's signature of `cols` (as `fingerprint_select` makes it).
pub(crate) fn signature_of(cols: &[Column]) -> Vec<String> {
    cols.iter().map(|c| format!("{} {}", c.name, c.ty)).collect()
}


/// The guard scan of `replace_partition`: one scan of the source
/// selecting `fp_select` (the input fingerprint, or only the count) and
/// counting as `"outside"` the rows whose `partition` is not `day`.
pub(crate) fn guard_scan(job: &Job, params: &RunParams, partition: &str, day: NaiveDate, fp_select: &str) -> Sql {
    let mut sql = Sql::new();
    sql.push("SELECT ").push(fp_select).push(", count(*) FILTER (WHERE s.").ident(partition);
    sql.push(" IS DISTINCT FROM ");
    sql.typed_param(Value::Date(day), "DATE").push(") AS \"outside\" FROM ");
    Scope::Source { template: job.source.template(), params }.write_from(&mut sql, "s");
    sql
}

/// The guards on the counts of `replace_partition`: no row outside the
/// day (refused with a sample row), at least the job's `min_rows`.
pub(crate) fn check_day_rows(engine: &mut dyn Engine, job: &Job, params: &RunParams, partition: &str, run_date: RunDate, rows: u64, outside: u64) -> Result<()> {
    check_day_rows_by(&mut |sql| engine.query(sql), job, params, partition, run_date, rows, outside)
}

/// [`check_day_rows`], its sample row read by `query`.
pub(crate) fn check_day_rows_by(
    query: &mut dyn FnMut(&Sql) -> Result<Rows>,
    job: &Job,
    params: &RunParams,
    partition: &str,
    run_date: RunDate,
    rows: u64,
    outside: u64,
) -> Result<()> {
    if outside > 0 {
        let mut sql = Sql::new();
        sql.push("SELECT * FROM ");
        Scope::Source { template: job.source.template(), params }.write_from(&mut sql, "s");
        sql.push(" WHERE s.").ident(partition).push(" IS DISTINCT FROM ");
        sql.typed_param(Value::Date(run_date.date()), "DATE").push(" LIMIT 1");
        let sample = first_row_of(query(&sql)?)?;
        return Err(Error::OutOfPartition { rows: outside, column: partition.to_owned(), run_date: run_date.to_string(), sample });
    }
    match job.min_rows {
        Some(min) if rows < min => Err(Error::TooFewRows { rows, min_rows: min, run_date: run_date.to_string() }),
        _ => Ok(()),
    }
}
