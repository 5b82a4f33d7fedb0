//! Steps the plans share.

use crate::engine::Column;
use crate::error::{Error, Result};
use crate::job::spec::Job;

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

