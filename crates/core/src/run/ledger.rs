//! The run ledger: `fixpoint.runs` in the target database, written in the same
//! transaction as the data, so a committed run and its ledger row exist
//! together or not at all.

use chrono::NaiveDateTime;
use serde::Serialize;

use crate::job::date::RunDate;
use crate::engine::Engine;
use crate::error::{Error, Result};
use crate::job::sql::{Sql, Value};

/// The ledger's schema.
pub const SCHEMA: &str = crate::job::ident::LEDGER_SCHEMA;
/// The ledger's table.
pub const TABLE: &str = "runs";

const COLUMNS: &[(&str, &str)] = &[
    ("run_key", "VARCHAR NOT NULL"),
    ("job", "VARCHAR NOT NULL"),
    ("job_hash", "VARCHAR NOT NULL"),
    ("strategy", "VARCHAR NOT NULL"),
    ("target", "VARCHAR NOT NULL"),
    ("run_date", "DATE NOT NULL"),
    ("outcome", "VARCHAR NOT NULL"),
    ("fingerprint_kind", "VARCHAR NOT NULL"),
    ("input_rows", "BIGINT NOT NULL"),
    ("input_checksum", "VARCHAR NOT NULL"),
    ("output_rows", "BIGINT NOT NULL"),
    ("output_checksum", "VARCHAR NOT NULL"),
    ("rows_deleted", "BIGINT NOT NULL"),
    ("rows_inserted", "BIGINT NOT NULL"),
    ("rows_updated", "BIGINT NOT NULL"),
    ("rows_unchanged", "BIGINT NOT NULL"),
    ("duplicates_collapsed", "BIGINT NOT NULL"),
    ("started_at", "TIMESTAMP NOT NULL"),
    ("finished_at", "TIMESTAMP NOT NULL"),
    ("fixpoint_version", "VARCHAR NOT NULL"),
    ("audits", "VARCHAR"),
    ("input_files", "VARCHAR"),
];

/// One ledger row.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Entry {
    /// The run's deterministic key.
    pub run_key: String,
    /// Job name.
    pub job: String,
    /// Hash of the job's definition.
    pub job_hash: String,
    /// Strategy name.
    pub strategy: String,
    /// Target table.
    pub target: String,
    /// Logical run date.
    pub run_date: String,
    /// `committed`. (A skipped run changes nothing and records nothing.)
    pub outcome: String,
    /// How the fingerprints were made.
    pub fingerprint_kind: String,
    /// Source rows.
    pub input_rows: u64,
    /// Source checksum.
    pub input_checksum: String,
    /// Rows in the run's scope of the target after the run.
    pub output_rows: u64,
    /// Checksum of the run's scope of the target after the run.
    pub output_checksum: String,
    /// Rows deleted.
    pub rows_deleted: u64,
    /// Rows inserted.
    pub rows_inserted: u64,
    /// Rows updated.
    pub rows_updated: u64,
    /// Rows left alone (version guard, or a skipped run).
    pub rows_unchanged: u64,
    /// Source duplicates collapsed before writing.
    pub duplicates_collapsed: u64,
    /// When the attempt started (metadata only).
    #[serde(serialize_with = "ser_ts")]
    pub started_at: NaiveDateTime,
    /// When it committed (metadata only).
    #[serde(serialize_with = "ser_ts")]
    pub finished_at: NaiveDateTime,
    /// fixpoint's version.
    pub fixpoint_version: String,
    /// The audits' results (stored as JSON).
    pub audits: Vec<crate::error::AuditResult>,
    /// A file source's files: paths, sizes, content hashes (stored as JSON).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub input_files: Option<crate::job::files::InputFiles>,
}

fn ser_ts<S: serde::Serializer>(t: &NaiveDateTime, s: S) -> std::result::Result<S::Ok, S::Error> {
    s.serialize_str(&t.format("%Y-%m-%dT%H:%M:%S%.6f").to_string())
}

fn table() -> String {
    format!("{}.{}", crate::job::ident::quote_ident(SCHEMA), crate::job::ident::quote_ident(TABLE))
}

/// The ledger's name, and its columns' names.
pub(crate) fn ledger_table() -> crate::job::ident::TableName {
    crate::job::ident::TableName { schema: SCHEMA.into(), table: TABLE.into() }
}

fn column_names() -> Vec<&'static str> {
    COLUMNS.iter().map(|(n, _)| *n).collect()
}

/// Creates the ledger if it is missing (inside the caller's transaction).
pub fn ensure(engine: &mut dyn Engine) -> Result<()> {
    let t = ledger_table();
    if engine.accelerator().and_then(|a| a.table_has_columns(&t, &column_names())) == Some(true) {
        return Ok(());
    }
    if let Some(cols) = engine.table_columns(&t)? {
        // A ledger written by an older fixpoint: add the columns it lacks
        // (one run at a time, like the creation below).
        let missing: Vec<&(&str, &str)> = COLUMNS.iter().filter(|(n, _)| !cols.iter().any(|c| c.name == *n)).collect();
        if !missing.is_empty() {
            crate::engine::lock_scope(engine, "fixpoint:ledger:create", true)?;
            for (name, ty) in missing {
                // Added columns are nullable: old rows have no value.
                let ty = ty.trim_end_matches(" NOT NULL").to_owned();
                engine.add_column(&t, &crate::engine::Column { name: (*name).to_owned(), ty })?;
            }
        }
        return Ok(());
    }
    // Concurrent first runs (a parallel backfill into a new database) would
    // race on CREATE … IF NOT EXISTS, which is not atomic on PostgreSQL:
    // the first creates the ledger, the others wait for it.
    crate::engine::lock_scope(engine, "fixpoint:ledger:create", true)?;
    engine.execute(&Sql::raw(format!("CREATE SCHEMA IF NOT EXISTS {}", crate::job::ident::quote_ident(SCHEMA))))?;
    let cols: Vec<String> = COLUMNS.iter().map(|(n, t)| format!("{} {t}", crate::job::ident::quote_ident(n))).collect();
    engine.execute(&Sql::raw(format!("CREATE TABLE IF NOT EXISTS {} ({})", table(), cols.join(", "))))?;
    Ok(())
}

/// Whether the ledger table exists.
pub fn exists(engine: &mut dyn Engine) -> Result<bool> {
    Ok(engine.table_columns(&ledger_table())?.is_some())
}

/// Appends one entry.
pub fn record(engine: &mut dyn Engine, e: &Entry) -> Result<()> {
    let text = |s: &str| Value::Text(s.to_owned());
    let int = |n: u64| Value::Int(n as i64);
    let values = vec![
        (text(&e.run_key), "VARCHAR"),
        (text(&e.job), "VARCHAR"),
        (text(&e.job_hash), "VARCHAR"),
        (text(&e.strategy), "VARCHAR"),
        (text(&e.target), "VARCHAR"),
        (Value::Date(RunDate::parse(&e.run_date)?.date()), "DATE"),
        (text(&e.outcome), "VARCHAR"),
        (text(&e.fingerprint_kind), "VARCHAR"),
        (int(e.input_rows), "BIGINT"),
        (text(&e.input_checksum), "VARCHAR"),
        (int(e.output_rows), "BIGINT"),
        (text(&e.output_checksum), "VARCHAR"),
        (int(e.rows_deleted), "BIGINT"),
        (int(e.rows_inserted), "BIGINT"),
        (int(e.rows_updated), "BIGINT"),
        (int(e.rows_unchanged), "BIGINT"),
        (int(e.duplicates_collapsed), "BIGINT"),
        (Value::Timestamp(e.started_at), "TIMESTAMP"),
        (Value::Timestamp(e.finished_at), "TIMESTAMP"),
        (text(&e.fixpoint_version), "VARCHAR"),
        (if e.audits.is_empty() { Value::Null } else { text(&serde_json::to_string(&e.audits).expect("audits serialize")) }, "VARCHAR"),
        (match &e.input_files {
            None => Value::Null,
            Some(f) => text(&serde_json::to_string(f).expect("files serialize")),
        }, "VARCHAR"),
    ];
    let (values, types): (Vec<Value>, Vec<&str>) = values.into_iter().unzip();
    if let Some(appended) = engine.accelerator().and_then(|a| a.append_row(&ledger_table(), &column_names(), &values)) {
        return appended;
    }
    let mut sql = Sql::new();
    sql.push("INSERT INTO ").push(&table()).push(" (");
    sql.push(&COLUMNS.iter().map(|(n, _)| crate::job::ident::quote_ident(n)).collect::<Vec<_>>().join(", "));
    sql.push(") VALUES (");
    for (i, (v, ty)) in values.into_iter().zip(types).enumerate() {
        if i > 0 {
            sql.push(", ");
        }
        sql.typed_param(v, ty);
    }
    sql.push(")");
    engine.execute(&sql)?;
    Ok(())
}

/// Ledger entries, newest first, optionally for one job and one date.
pub fn entries(engine: &mut dyn Engine, job: Option<&str>, run_date: Option<RunDate>, limit: Option<u64>) -> Result<Vec<Entry>> {
    if !exists(engine)? {
        return Ok(Vec::new());
    }
    ensure(engine)?;
    entries_of_existing(engine, job, run_date, limit)
}

/// The names of the jobs that have runs in the ledger, sorted (none when
/// there is no ledger). Nothing is written.
pub fn jobs(engine: &mut dyn Engine) -> Result<Vec<String>> {
    if !exists(engine)? {
        return Ok(Vec::new());
    }
    let rows = engine.query(&Sql::raw(format!("SELECT DISTINCT \"job\" FROM {} ORDER BY \"job\"", table())))?;
    rows.rows
        .iter()
        .map(|r| r.first().and_then(|v| v.as_str()).map(str::to_owned).ok_or_else(|| Error::Internal(format!("ledger column job holds {r:?}"))))
        .collect()
}

/// The newest entry of `job` for each date from `from` to `to` (one query),
/// by date.
pub fn latest_per_date(engine: &mut dyn Engine, job: &str, from: RunDate, to: RunDate) -> Result<std::collections::HashMap<String, Entry>> {
    let mut out = std::collections::HashMap::new();
    if !exists(engine)? {
        return Ok(out);
    }
    ensure(engine)?;
    // Newest first: the first entry seen for a date is its latest.
    for e in entries_where(engine, Some(job), Some((from, to)), None)? {
        out.entry(e.run_date.clone()).or_insert(e);
    }
    Ok(out)
}

/// The first date after `after` with a committed run of `job` (the ledger
/// known to exist).
pub fn next_committed_date(engine: &mut dyn Engine, job: &str, after: RunDate) -> Result<Option<RunDate>> {
    let mut sql = Sql::new();
    sql.push(&format!("SELECT CAST(min(\"run_date\") AS VARCHAR) AS \"d\" FROM {} WHERE \"job\" = ", table()));
    sql.typed_param(Value::Text(job.to_owned()), "VARCHAR").push(" AND \"outcome\" = 'committed' AND \"run_date\" > ");
    sql.typed_param(Value::Date(after.date()), "DATE");
    let rows = engine.query(&sql)?;
    let row = rows.single("the next committed date")?;
    match row.value("d")? {
        Value::Null => Ok(None),
        v => v.as_str().map(RunDate::parse).transpose()?.map(Some).ok_or_else(|| Error::Internal(format!("the next committed date came back as {v:?}"))),
    }
}

/// [`entries`] when the ledger is known to exist (after [`ensure`]).
pub fn entries_of_existing(engine: &mut dyn Engine, job: Option<&str>, run_date: Option<RunDate>, limit: Option<u64>) -> Result<Vec<Entry>> {
    entries_where(engine, job, run_date.map(|d| (d, d)), limit)
}

fn entries_where(engine: &mut dyn Engine, job: Option<&str>, dates: Option<(RunDate, RunDate)>, limit: Option<u64>) -> Result<Vec<Entry>> {
    let mut sql = Sql::new();
    sql.push("SELECT ");
    sql.push(
        &COLUMNS
            .iter()
            .map(|(n, _)| match *n {
                "run_date" => "CAST(\"run_date\" AS VARCHAR)".to_owned(),
                "started_at" | "finished_at" => crate::job::ident::quote_ident(n),
                _ => crate::job::ident::quote_ident(n),
            })
            .collect::<Vec<_>>()
            .join(", "),
    );
    sql.push(" FROM ").push(&table()).push(" WHERE 1 = 1");
    if let Some(j) = job {
        sql.push(" AND \"job\" = ").typed_param(Value::Text(j.to_owned()), "VARCHAR");
    }
    match dates {
        Some((a, b)) if a == b => {
            sql.push(" AND \"run_date\" = ").typed_param(Value::Date(a.date()), "DATE");
        }
        Some((a, b)) => {
            sql.push(" AND \"run_date\" BETWEEN ").typed_param(Value::Date(a.date()), "DATE");
            sql.push(" AND ").typed_param(Value::Date(b.date()), "DATE");
        }
        None => {}
    }
    sql.push(" ORDER BY \"finished_at\" DESC, \"started_at\" DESC, \"run_key\" DESC");
    if let Some(n) = limit {
        sql.push(" LIMIT ").typed_param(Value::Int(n.min(i32::MAX as u64) as i64), "INTEGER");
    }
    let rows = engine.query(&sql)?;
    rows.rows.iter().map(|r| entry_from_row(r)).collect()
}

fn entry_from_row(r: &[Value]) -> Result<Entry> {
    let bad = |i: usize| Error::Internal(format!("ledger column {} holds {:?}", COLUMNS[i].0, r[i]));
    let s = |i: usize| -> Result<String> { r[i].as_str().map(str::to_owned).ok_or_else(|| bad(i)) };
    let n = |i: usize| -> Result<u64> { r[i].as_u64().ok_or_else(|| bad(i)) };
    let ts = |i: usize| -> Result<NaiveDateTime> {
        match &r[i] {
            Value::Timestamp(t) => Ok(*t),
            _ => Err(bad(i)),
        }
    };
    Ok(Entry {
        run_key: s(0)?,
        job: s(1)?,
        job_hash: s(2)?,
        strategy: s(3)?,
        target: s(4)?,
        run_date: s(5)?,
        outcome: s(6)?,
        fingerprint_kind: s(7)?,
        input_rows: n(8)?,
        input_checksum: s(9)?,
        output_rows: n(10)?,
        output_checksum: s(11)?,
        rows_deleted: n(12)?,
        rows_inserted: n(13)?,
        rows_updated: n(14)?,
        rows_unchanged: n(15)?,
        duplicates_collapsed: n(16)?,
        started_at: ts(17)?,
        finished_at: ts(18)?,
        fixpoint_version: s(19)?,
        audits: match &r[20] {
            Value::Text(j) => serde_json::from_str(j).map_err(|e| Error::Internal(format!("ledger column audits: {e}")))?,
            _ => Vec::new(),
        },
        input_files: match &r[21] {
            Value::Text(j) => Some(serde_json::from_str(j).map_err(|e| Error::Internal(format!("ledger column input_files: {e}")))?),
            _ => None,
        },
    })
}
