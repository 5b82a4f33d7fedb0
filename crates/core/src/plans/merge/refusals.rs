//! The merge's refusals: a source without key or version, NULL keys or
//! versions, ties, keys that moved partition; each with a sample.


use crate::plans::merge::sql::{rows_differ, DELETED};
use crate::engine::{Column, Engine};
use crate::error::{Error, Result};
use crate::job::ident::quote_ident;
use crate::job::spec::{Job, MergeSpec};
use crate::job::sql::Sql;
use crate::run::sqlerror::first_row;
use crate::plans::merge::sql::{keys_match, q};

/// The source carries the key and the version, and no column of ours.
pub fn check_source(job: &Job, spec: &MergeSpec, source_cols: &[Column]) -> Result<()> {
    let has = |name: &str| source_cols.iter().any(|c| c.name == name);
    for (what, col) in spec.key.iter().map(|k| ("key", k)).chain([("version", &spec.version)]) {
        if !has(col) {
            return Err(Error::Schema {
                message: format!("the source query of job {} has no column {col:?} (the job's {what})", job.name),
                hint: Some(format!("select {col} in the source, or fix `{what}` in the job file")),
            });
        }
    }
    if has(DELETED) {
        return Err(Error::Schema { message: format!("the source may not return a column named {DELETED}"), hint: None });
    }
    // The version decides which row wins: its type must order versions
    // (numbers, dates, times, timestamps), refused here, before any plan.
    if let Some(v) = source_cols.iter().find(|c| c.name == spec.version) {
        if !crate::run::schema::orders_as_version(&v.ty) {
            return Err(Error::Schema {
                message: format!(
                    "the version column {} of job {} is {}, which has no meaningful order of versions ({}): a merge would keep the wrong row",
                    v.name,
                    job.name,
                    v.ty,
                    match crate::run::schema::type_family(&v.ty).as_str() {
                        "text" => "as text, '10' sorts before '9'",
                        "boolean" => "a boolean has two values",
                        _ => "it compares as bytes or parts, not as a version",
                    }
                ),
                hint: Some(format!(
                    "cast it in the source query to a number or a timestamp, e.g. `CAST({v} AS BIGINT) AS {v}`; a version must be an integer, decimal, float, date, time or timestamp",
                    v = v.name
                )),
            });
        }
    }
    Ok(())
}

/// A statement reading the source with the job's `deleted` condition
/// failed: when the database could not bind it (a column the source does
/// not return, a syntax error; the source itself was described before),
/// the job file's error naming `deleted`, exit 2. Any other error as it was.
pub fn deleted_error(job: &Job, spec: &MergeSpec, source_cols: &[Column], e: Error) -> Error {
    if spec.deleted.is_none() {
        return e;
    }
    let cols = source_cols.iter().map(|c| c.name.as_str()).collect::<Vec<_>>().join(", ");
    crate::run::sqlerror::fragment_error(
        job,
        "deleted",
        "the condition `deleted` on the source's rows",
        format!("`deleted` is a condition on the columns the source query returns ({cols}), e.g. deleted = \"op = 'D'\"; fix the column it names, or return that column from the source"),
        e,
    )
}

/// The refusal of a batch whose rows have a NULL key or version: how many,
/// one of them (from `stage`).
pub fn refuse_nulls(engine: &mut dyn Engine, spec: &MergeSpec, stage: &str, source_list: &str, null_keys: u64, null_versions: u64) -> Result<()> {
    let null_key = spec.key.iter().map(|k| format!("{} IS NULL", quote_ident(k))).collect::<Vec<_>>().join(" OR ");
    let version = quote_ident(&spec.version);
    for (n, what, cond) in [(null_keys, format!("a NULL in the key ({})", spec.key.join(", ")), null_key), (null_versions, format!("a NULL version ({})", spec.version), format!("{version} IS NULL"))] {
        if n > 0 {
            let sample = first_row(engine, &Sql::raw(format!("SELECT {source_list} FROM {stage} WHERE {cond} LIMIT 1")))?;
            return Err(Error::DataRefused {
                message: format!("{n} source row(s) have {what}; one of them: {sample}"),
                hint: Some("rows are matched on the key and ordered by the version: fix the upstream rows or filter them out in the source".into()),
            });
        }
    }
    Ok(())
}

/// The refusal of `ties` keys with two different rows at one version in
/// the batch: one key, both rows (`s` from `stage`, `b` from `batch`, joined on `tie_cond`).
pub fn tie_error(engine: &mut dyn Engine, spec: &MergeSpec, names: &[String], stage: &str, batch: &str, tie_cond: &str, ties: u64) -> Result<Error> {
    let by_key = spec.key.iter().map(|k| q("b", k)).collect::<Vec<_>>().join(", ");
    let kept = first_row(engine, &Sql::raw(format!("SELECT {} FROM {stage} AS s JOIN {batch} AS b ON {tie_cond} ORDER BY {by_key} LIMIT 1", names.iter().map(|c| q("b", c)).collect::<Vec<_>>().join(", "))))?;
    let other = first_row(engine, &Sql::raw(format!("SELECT {} FROM {stage} AS s JOIN {batch} AS b ON {tie_cond} ORDER BY {by_key} LIMIT 1", names.iter().map(|c| q("s", c)).collect::<Vec<_>>().join(", "))))?;
    let key_desc = spec.key.iter().map(|k| format!("{k} = {}", kept.0.iter().find(|(c, _)| c == k).map(|(_, v)| v.as_str()).unwrap_or("?"))).collect::<Vec<_>>().join(", ");
    Ok(Error::DataRefused {
        message: format!("{ties} key(s) have two different rows at the same version ({}), e.g. {key_desc}: {kept} vs {other}", spec.version),
        hint: Some("bump the version upstream, or set on_tie = \"deterministic\" to pick the row whose values sort first".into()),
    })
}

/// The refusal of `moved` batch keys that the target holds in a partition
/// (`p`) the batch does not touch (`in_scope` false, with `params`).
pub fn moved_error(engine: &mut dyn Engine, job: &Job, spec: &MergeSpec, p: &str, batch: &str, in_scope: &str, params: &[crate::job::sql::Value], moved: u64) -> Result<Error> {
    let mut sql = Sql::new();
    sql.push(&format!(
        "SELECT {}, t.{} AS target_{p}, b.{} AS batch_{p} FROM {batch} AS b JOIN {} AS t ON {} WHERE NOT {in_scope} ORDER BY 1 LIMIT 1",
        spec.key.iter().map(|k| q("t", k)).collect::<Vec<_>>().join(", "),
        quote_ident(p),
        quote_ident(p),
        job.target.quoted(),
        keys_match("t", "b", &spec.key)
    ));
    sql.params.extend(params.iter().cloned());
    let m = first_row(engine, &sql)?;
    Ok(Error::DataRefused {
        message: format!(
            "{moved} key(s) of the batch are held by the target in a partition the batch does not touch, so a merge pruned to the batch's partitions would duplicate them, e.g. {m}"
        ),
        hint: Some(format!("keep each key in one {p}, or remove `partition` from the job to merge over the whole table")),
    })
}

/// The refusal of `ties` batch keys whose target row differs at the same
/// version (`b` from `batch` joined to the target `t` on `on`).
pub fn cross_tie_error(engine: &mut dyn Engine, job: &Job, spec: &MergeSpec, batch: &str, on: &Sql, compared: &[String], ties: u64) -> Result<Error> {
    let version = quote_ident(&spec.version);
    let mut sql = Sql::new();
    sql.push(&format!("SELECT {} FROM {batch} AS b JOIN {} AS t ON ", spec.key.iter().map(|k| q("t", k)).chain([format!("t.{version}")]).collect::<Vec<_>>().join(", "), job.target.quoted()));
    sql.text.push_str(&on.text);
    sql.params.extend(on.params.iter().cloned());
    sql.push(&format!(" WHERE NOT b.{} AND b.{version} = t.{version} AND ({}) LIMIT 1", quote_ident(DELETED), rows_differ("b", "t", compared)));
    let s = first_row(engine, &sql)?;
    Ok(Error::DataRefused {
        message: format!("{ties} key(s) of the batch have a different row in the target at the same version, e.g. {s}"),
        hint: Some("bump the version upstream, or set on_tie = \"deterministic\" to pick the row whose values sort first".into()),
    })
}

/// The refusal of a target that holds more than one row for a key of the
/// batch: the job's `key` is not the table's key (a merge would update
/// every such row). Found when a plan's counts show more rows changed or
/// joined than the batch has keys; one duplicated key is read as the
/// example. Nothing is changed (the run rolls back).
pub fn duplicate_keys_error(engine: &mut dyn Engine, job: &Job, spec: &MergeSpec) -> Result<Error> {
    let keys = spec.key.iter().map(|k| quote_ident(k)).collect::<Vec<_>>().join(", ");
    let sample = first_row(
        engine,
        &Sql::raw(format!("SELECT {keys}, count(*) AS \"rows\" FROM {} GROUP BY {keys} HAVING count(*) > 1 LIMIT 1", job.target.quoted())),
    )?;
    if sample.0.is_empty() {
        return Ok(Error::Internal(format!("the merge of job {} changed more rows than its batch has keys, and the target holds no duplicated key; rolled back", job.name)));
    }
    Ok(Error::Spec {
        file: job.path.clone().unwrap_or_else(|| format!("job {}", job.name).into()),
        key: "key".into(),
        message: format!(
            "the target {} holds more than one row for a key of the batch, e.g. {sample}: key = [{}] is not the table's key; nothing was changed",
            job.target,
            spec.key.iter().map(|k| format!("{k:?}")).collect::<Vec<_>>().join(", ")
        ),
        hint: Some(format!(
            "set key to the columns that identify one row of {} (find duplicates with SELECT {keys}, count(*) FROM {} GROUP BY {keys} HAVING count(*) > 1)",
            job.target,
            job.target.quoted()
        )),
    })
}
