//! Schema drift between a job's source and its existing target.
//!
//! Before anything is written, the source's columns are compared with the
//! target's:
//!
//! - a **new** source column (not in the target): `on_schema_change = "fail"`
//!   (the default) refuses the run naming it; `"append_new_columns"` adds it
//!   to the target in the run's transaction (old rows read NULL);
//! - a **dropped** column (in the target, no longer returned by the source,
//!   and with no default of its own): `fail` refuses the run naming it;
//!   `append_new_columns` keeps it, and the run's rows get NULL there;
//! - a **changed type** (a column whose type moved to another family, e.g.
//!   BIGINT → VARCHAR): refused under both settings, naming the column and
//!   both types — fixpoint never rewrites a column's type. Within a family
//!   (widths, precisions) the engine's own assignment cast applies, and a
//!   value that does not fit fails the run with the target unchanged.

use crate::job::spec::OnSchemaChange;
use crate::engine::{Column, Engine};
use crate::error::{Error, Result};
use crate::job::ident::TableName;
use crate::job::sql::{Sql, Value};

/// The family a column type belongs to: types within one family convert by
/// assignment without changing what a value means.
pub fn type_family(ty: &str) -> String {
    let t = ty.trim().to_ascii_lowercase();
    if t.ends_with("[]") || t.contains('<') || t.starts_with("struct") || t.starts_with("map") || t.starts_with("union") {
        return t;
    }
    let base = t.split('(').next().unwrap_or("").trim();
    let family = match base {
        "tinyint" | "smallint" | "integer" | "int" | "int1" | "int2" | "int4" | "int8" | "bigint" | "hugeint" | "utinyint" | "usmallint"
        | "uinteger" | "ubigint" | "uhugeint" | "smallserial" | "serial" | "bigserial" => "integer",
        "decimal" | "numeric" => "decimal",
        "real" | "float" | "float4" | "float8" | "double" | "double precision" => "float",
        "varchar" | "text" | "character varying" | "character" | "char" | "bpchar" | "string" | "name" => "text",
        "boolean" | "bool" => "boolean",
        "timestamp" | "timestamp without time zone" | "timestamp_s" | "timestamp_ms" | "timestamp_ns" | "datetime" => "timestamp",
        "timestamptz" | "timestamp with time zone" => "timestamptz",
        "time" | "time without time zone" => "time",
        "timetz" | "time with time zone" => "timetz",
        "blob" | "bytea" | "varbinary" | "binary" => "binary",
        "json" | "jsonb" => "json",
        other => other,
    };
    family.to_owned()
}

/// Whether a source column of type `source` may be written to a target
/// column of type `target` without changing its meaning.
fn compatible(source: &str, target: &str) -> bool {
    let (s, t) = (type_family(source), type_family(target));
    // NULL literals have no type of their own (DuckDB calls them "NULL").
    s == t || s == "null" || (s == "integer" && (t == "decimal" || t == "float"))
}

/// The source's drift against an existing target.
#[derive(Debug, Default, PartialEq)]
pub struct Drift {
    /// Source columns the target lacks.
    pub added: Vec<Column>,
    /// Target columns (without a default) the source no longer returns.
    pub dropped: Vec<Column>,
    /// (target column, source column) pairs whose types changed family.
    pub changed: Vec<(Column, Column)>,
}

fn names(cols: &[Column]) -> String {
    cols.iter().map(|c| format!("{} {}", c.name, c.ty)).collect::<Vec<_>>().join(", ")
}

/// Columns of `table` that have a default (or identity / generated value):
/// a source that does not return them is not a drift.
fn defaulted(engine: &mut dyn Engine, table: &TableName) -> Result<Vec<String>> {
    let mut out: Vec<String> = engine.column_defaults(table)?.into_iter().map(|(name, _)| name).collect();
    if engine.name() == "postgres" {
        let mut sql = Sql::new();
        sql.push("SELECT column_name FROM information_schema.columns WHERE table_schema = ")
            .param(Value::Text(table.schema.clone()))
            .push(" AND table_name = ")
            .param(Value::Text(table.table.clone()))
            .push(" AND (is_identity = 'YES' OR is_generated = 'ALWAYS')");
        out.extend(engine.query(&sql)?.rows.iter().filter_map(|r| r[0].as_str().map(str::to_owned)));
    }
    Ok(out)
}

/// Compares the source's columns with the existing target's.
pub fn drift(engine: &mut dyn Engine, target: &TableName, source: &[Column], existing: &[Column]) -> Result<Drift> {
    let mut d = Drift::default();
    for s in source {
        match existing.iter().find(|t| t.name == s.name) {
            None => d.added.push(s.clone()),
            Some(t) if !compatible(&s.ty, &t.ty) => d.changed.push((t.clone(), s.clone())),
            Some(_) => {}
        }
    }
    let missing: Vec<&Column> = existing.iter().filter(|t| !source.iter().any(|s| s.name == t.name)).collect();
    if !missing.is_empty() {
        let defaults = defaulted(engine, target)?;
        d.dropped = missing.into_iter().filter(|c| !defaults.contains(&c.name)).cloned().collect();
    }
    Ok(d)
}

/// Checks the drift against the job's setting: the columns to add to the
/// target (in the run's transaction, by [`append`]), or the error naming
/// what changed.
pub fn reconcile(engine: &mut dyn Engine, job: &crate::job::spec::Job, source: &[Column], existing: Option<&[Column]>) -> Result<Vec<Column>> {
    let Some(existing) = existing else { return Ok(Vec::new()) };
    let d = drift(engine, &job.target, source, existing)?;
    if !d.changed.is_empty() {
        let list = d.changed.iter().map(|(t, s)| format!("{} ({} in the target, {} in the source)", t.name, t.ty, s.ty)).collect::<Vec<_>>().join(", ");
        return Err(Error::Schema {
            message: format!("schema change in job {}: the type of column(s) {list} changed", job.name),
            hint: Some(format!(
                "cast the column back in the source query (CAST(… AS {})), or migrate {} yourself; fixpoint never rewrites a column's type",
                d.changed[0].0.ty, job.target
            )),
        });
    }
    // A column the job matches, orders or partitions on cannot be added
    // (under either setting): the target's rows would read NULL there.
    if let Some((c, role, why)) = d.added.iter().find_map(|c| role_of(job, &c.name).map(|(role, why)| (c, role, why))) {
        return Err(Error::Schema {
            message: format!(
                "schema change in job {}: the target {} has no column {} ({}), the job's {role}: it cannot be appended, {why}",
                job.name, job.target, c.name, c.ty
            ),
            hint: Some(format!(
                "add the column to {} and fill it for the existing rows yourself (ALTER TABLE … ADD COLUMN, then UPDATE), or load into a new target; on_schema_change only appends columns a job does not match, order or partition on",
                job.target
            )),
        });
    }
    match job.on_schema_change {
        OnSchemaChange::Fail => {
            let mut parts = Vec::new();
            if !d.added.is_empty() {
                parts.push(format!("the source returns new column(s) {} that the target {} lacks", names(&d.added), job.target));
            }
            if !d.dropped.is_empty() {
                parts.push(format!("the source no longer returns column(s) {} of the target {}", names(&d.dropped), job.target));
            }
            if parts.is_empty() {
                return Ok(Vec::new());
            }
            Err(Error::Schema {
                message: format!("schema change in job {}: {}", job.name, parts.join("; and ")),
                hint: Some(
                    "set on_schema_change = \"append_new_columns\" in the job file to add new columns (old rows read NULL) and keep dropped ones (new rows get NULL), or change the source query or the target to match"
                        .into(),
                ),
            })
        }
        OnSchemaChange::AppendNewColumns => Ok(d.added),
    }
}

/// The part a column plays in a job that no appended column may play
/// (a merge key, the version, the partition column), and what appending it
/// would do: the existing rows would read NULL there.
fn role_of(job: &crate::job::spec::Job, column: &str) -> Option<(&'static str, &'static str)> {
    if let Some(m) = &job.merge {
        if m.key.iter().any(|k| k == column) {
            return Some(("merge key", "since the existing rows would read NULL in it: no batch row would match them and every key would be inserted a second time"));
        }
        if m.version == column {
            return Some(("version", "since the existing rows would read NULL versions, which a merge cannot order"));
        }
    }
    if job.partition.as_deref() == Some(column) {
        return Some(match job.strategy {
            crate::job::spec::Strategy::Merge => ("partition column", "since the existing rows would read NULL in it, outside every partition a merge is pruned to"),
            _ => ("partition column", "since the existing rows would read NULL in it: no run would ever replace them, and a rerun would add the day beside them"),
        });
    }
    None
}

/// Whether a column type orders its values as versions should: numbers,
/// dates, times and timestamps. Text compares as text ('10' before '9'),
/// and booleans, bytes, JSON, UUIDs, intervals, lists, structs and maps
/// have no meaningful order of versions. A NULL literal's type passes (its
/// rows are refused as NULL versions).
pub fn orders_as_version(ty: &str) -> bool {
    let family = type_family(ty);
    let family = family.trim_matches('"');
    matches!(
        family,
        "integer" | "decimal" | "float" | "date" | "timestamp" | "timestamptz" | "time" | "timetz" | "timestamp_ntz" | "timestamp_ltz" | "null"
    )
}

/// Adds `columns` to the target (inside the run's transaction; a run that
/// raced another one to the same column finds it there).
pub fn append(engine: &mut dyn Engine, target: &TableName, columns: &[Column]) -> Result<()> {
    for c in columns {
        engine.add_column(target, c)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn families() {
        assert_eq!(type_family("DECIMAL(12,2)"), "decimal");
        assert_eq!(type_family("numeric"), "decimal");
        assert_eq!(type_family("character varying(20)"), "text");
        assert_eq!(type_family("timestamp without time zone"), "timestamp");
        assert_eq!(type_family("INTEGER[]"), "integer[]");
        assert!(compatible("INTEGER", "BIGINT"));
        assert!(compatible("BIGINT", "DECIMAL(18,2)"));
        assert!(!compatible("VARCHAR", "BIGINT"));
        assert!(!compatible("DATE", "TIMESTAMP"));
        assert!(!compatible("DECIMAL(12,2)", "INTEGER"));
    }

    #[test]
    fn version_types() {
        for ty in [
            "BIGINT", "INTEGER", "HUGEINT", "UBIGINT", "DECIMAL(18,3)", "numeric(12,2)", "DOUBLE", "double precision", "real", "DATE",
            "TIMESTAMP", "TIMESTAMP WITH TIME ZONE", "timestamp without time zone", "timestamp(3) without time zone", "TIMESTAMP_NS",
            "timestamptz", "TIME", "int", "timestamp_ntz", "\"NULL\"",
        ] {
            assert!(orders_as_version(ty), "{ty}");
        }
        for ty in [
            "VARCHAR", "text", "character varying(20)", "BOOLEAN", "BLOB", "bytea", "UUID", "JSON", "jsonb", "INTERVAL", "INTEGER[]",
            "STRUCT(a INTEGER)", "MAP(VARCHAR, INTEGER)", "ENUM('a', 'b')", "string",
        ] {
            assert!(!orders_as_version(ty), "{ty}");
        }
    }
}
