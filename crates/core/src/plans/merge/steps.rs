//! Steps both merge plans take, transactional and leased.

use crate::engine::{Column, Engine};
use crate::error::Result;
use crate::fingerprint::compute::{fingerprint_select, Scope};
use crate::fingerprint::{Fingerprint, Method};
use crate::job::ident::quote_ident;
use crate::job::spec::{Job, MergeSpec};
use crate::job::sql::{RunParams, Sql};
use crate::plans::merge::refusals::refuse_nulls;
use crate::plans::merge::sql::DELETED;

/// The source's rows with their tombstone flag (the job's `deleted`
/// condition, else false) as the column [`DELETED`].
pub(crate) fn flagged_source(job: &Job, spec: &MergeSpec, params: &RunParams) -> Sql {
    let mut sql = Sql::new();
    sql.push("SELECT s.*, ");
    match &spec.deleted {
        Some(pred) => sql.push(&format!("coalesce(({pred}), false)")),
        None => sql.push("false"),
    };
    sql.push(&format!(" AS {} FROM ", quote_ident(DELETED)));
    Scope::Source { template: job.source.template(), params }.write_from(&mut sql, "s");
    sql
}

/// One scan of the staged source `stage`: NULL keys and versions refused
/// (with a sample row), and the input fingerprint over `input_cols`.
pub(crate) fn scan_stage(engine: &mut dyn Engine, spec: &MergeSpec, stage: &str, source_list: &str, input_cols: &[Column]) -> Result<Fingerprint> {
    let null_key = spec.key.iter().map(|k| format!("{} IS NULL", quote_ident(k))).collect::<Vec<_>>().join(" OR ");
    let version = quote_ident(&spec.version);
    let fp = fingerprint_select(engine, Method::Native, "s", input_cols)?;
    let rows = engine.query(&Sql::raw(format!(
        "SELECT {}, count(*) FILTER (WHERE {null_key}) AS \"null_keys\", count(*) FILTER (WHERE {version} IS NULL) AS \"null_versions\" FROM {stage} AS s",
        fp.select
    )))?;
    let row = rows.single("the stage scan")?;
    refuse_nulls(engine, spec, stage, source_list, row.count("null_keys")?, row.count("null_versions")?)?;
    fp.read(&row, engine)
}
