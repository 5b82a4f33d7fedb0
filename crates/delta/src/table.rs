//! One Delta table as fixpoint sees it: its log read and written with
//! delta-rs, its columns in DuckDB's types, its active files.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use deltalake_core::kernel::transaction::{CommitBuilder, CommitProperties, TableReference, TransactionError};
use deltalake_core::kernel::{Action, Add, DataType, Remove, StructField, Transaction};
use deltalake_core::protocol::{DeltaOperation, SaveMode};
use deltalake_core::{DeltaTable, DeltaTableError};
use fixpoint_core::engine::Column;
use fixpoint_core::job::ident::TableName;
use fixpoint_core::{DbFailure, Error, Result};
use futures_util::TryStreamExt;

/// A delta-rs error as fixpoint's.
pub(crate) fn delta_error(context: impl Into<String>, e: DeltaTableError) -> Error {
    Error::Database { engine: "delta", context: context.into(), message: e.to_string(), failure: DbFailure::Other }
}

/// One active data file.
#[derive(Debug, Clone)]
pub(crate) struct DataFile {
    /// Relative to the table's folder, decoded.
    pub path: String,
    pub size: i64,
    pub partition_values: HashMap<String, Option<String>>,
    /// Written by this run, not committed yet.
    pub pending: bool,
}

/// A loaded table: the snapshot a run reads, and what the run changes
/// before its commit.
pub(crate) struct Table {
    pub name: TableName,
    pub dir: PathBuf,
    pub delta: DeltaTable,
    pub columns: Vec<Column>,
    pub partitions: Vec<String>,
    /// The active files as the run will leave them (its pending changes
    /// applied).
    pub files: Vec<DataFile>,
    /// Files of the snapshot this run removes.
    pub removes: Vec<DataFile>,
    /// The table does not exist yet: this run creates it, in the same
    /// commit as its first rows (its schema and partition column).
    pub creation: Option<Creation>,
}

/// A table a run creates with its first commit.
#[derive(Debug, Clone)]
pub(crate) struct Creation {
    pub fields: Vec<StructField>,
    pub partition: Option<String>,
}

impl Table {
    /// The snapshot's version.
    pub fn version(&self) -> i64 {
        self.delta.version().map_or(-1, |v| v as i64)
    }

    /// Whether the run changed anything not committed yet.
    pub fn has_pending(&self) -> bool {
        self.creation.is_some() || !self.removes.is_empty() || self.files.iter().any(|f| f.pending)
    }
}

/// Where a table's log lives: its local folder, or a URL on the store
/// given (S3; `dir` is then the table's folder in the local cache).
pub(crate) struct Place<'a> {
    pub dir: &'a Path,
    pub remote: Option<(url::Url, std::sync::Arc<dyn object_store::ObjectStore>)>,
}

impl Place<'_> {
    fn describe(&self) -> String {
        match &self.remote {
            Some((url, _)) => url.to_string(),
            None => self.dir.display().to_string(),
        }
    }

    /// The table, not loaded.
    fn table(&self) -> std::result::Result<DeltaTable, DeltaTableError> {
        match &self.remote {
            Some((url, store)) => deltalake_core::DeltaTableBuilder::from_url(url.clone())?.with_storage_backend(store.clone(), url.clone()).build(),
            None => {
                let url = url::Url::from_directory_path(self.dir).map_err(|_| DeltaTableError::InvalidTableLocation(self.dir.display().to_string()))?;
                deltalake_core::DeltaTableBuilder::from_url(url)?.build()
            }
        }
    }
}

/// Loads the table at `place` (its newest snapshot), checking that
/// fixpoint can honour every feature it uses.
pub(crate) async fn load(name: &TableName, place: &Place<'_>) -> Result<Table> {
    let context = || format!("opening the Delta table {name} in {}", place.describe());
    let mut delta = place.table().map_err(|e| delta_error(context(), e))?;
    delta.load().await.map_err(|e| delta_error(context(), e))?;
    from_delta(name, place.dir, delta)
}

/// The table as loaded in `delta`.
pub(crate) fn from_delta(name: &TableName, dir: &Path, delta: DeltaTable) -> Result<Table> {
    let snapshot = delta.snapshot().map_err(|e| delta_error(format!("reading the Delta table {name}"), e))?;
    check_features(name, snapshot)?;
    let metadata = serde_json::to_value(snapshot.metadata()).map_err(|e| Error::Internal(format!("reading the metadata of {name}: {e}")))?;
    let partitions: Vec<String> = metadata.get("partitionColumns").and_then(|p| p.as_array()).map(|a| a.iter().filter_map(|v| v.as_str().map(str::to_owned)).collect()).unwrap_or_default();
    let mut columns = Vec::new();
    for field in snapshot.schema().fields() {
        let ty = serde_json::to_value(field.data_type()).map_err(|e| Error::Internal(format!("reading the schema of {name}: {e}")))?;
        columns.push(Column { name: field.name().to_owned(), ty: duckdb_type(name, field.name(), &ty)? });
    }
    let files = snapshot
        .log_data()
        .iter()
        .map(|f| DataFile { path: f.path().into_owned(), size: f.size(), partition_values: f.partition_values_map(), pending: false })
        .collect();
    Ok(Table { name: name.clone(), dir: dir.to_owned(), delta, columns, partitions, files, removes: Vec::new(), creation: None })
}

/// Refuses a table using a feature fixpoint cannot honour, naming it.
fn check_features(name: &TableName, snapshot: &deltalake_core::table::state::DeltaTableState) -> Result<()> {
    let protocol = serde_json::to_value(snapshot.protocol()).unwrap_or_default();
    let version = |k: &str| protocol.get(k).and_then(|v| v.as_i64()).unwrap_or(0);
    let (reader, writer) = (version("minReaderVersion"), version("minWriterVersion"));
    let features = |k: &str| -> Vec<String> { protocol.get(k).and_then(|v| v.as_array()).map(|a| a.iter().filter_map(|v| v.as_str().map(str::to_owned)).collect()).unwrap_or_default() };
    const HONOURED: &[&str] = &["timestampNtz", "appendOnly", "invariants"];
    let refuse = |what: String| {
        Err(Error::Schema {
            message: format!("the Delta table {name} uses {what}, which fixpoint cannot honour when it writes the table"),
            hint: Some(format!("write {name} with the tool that set that feature up, or copy it into a table without it (fixpoint honours protocol reader 1 / writer 2, and the table features timestampNtz, appendOnly and invariants)")),
        })
    };
    let metadata = serde_json::to_value(snapshot.metadata()).unwrap_or_default();
    if let Some(config) = metadata.get("configuration").and_then(|c| c.as_object()) {
        for (k, v) in config {
            let on = v.as_str().map(|s| s.eq_ignore_ascii_case("true")).unwrap_or(false);
            let refused = match k.as_str() {
                "delta.appendOnly" | "delta.enableDeletionVectors" | "delta.enableChangeDataFeed" | "delta.enableRowTracking" => on,
                "delta.columnMapping.mode" => v.as_str() != Some("none"),
                k => k.starts_with("delta.constraints."),
            };
            if refused {
                return refuse(format!("{k} = {v}"));
            }
        }
    }
    for f in features("readerFeatures").into_iter().chain(features("writerFeatures")) {
        if !HONOURED.contains(&f.as_str()) {
            return refuse(format!("the table feature {f}"));
        }
    }
    let by_features = reader == 3 && writer == 7;
    if !by_features && (reader > 1 || writer > 2) {
        return refuse(format!("protocol version reader {reader} / writer {writer} (column mapping, generated columns, check constraints or change data feed)"));
    }
    Ok(())
}

/// A Delta type (its JSON form) as DuckDB's.
fn duckdb_type(table: &TableName, column: &str, ty: &serde_json::Value) -> Result<String> {
    let t = ty.as_str().unwrap_or("");
    Ok(match t {
        "boolean" => "BOOLEAN".into(),
        "byte" => "TINYINT".into(),
        "short" => "SMALLINT".into(),
        "integer" => "INTEGER".into(),
        "long" => "BIGINT".into(),
        "float" => "FLOAT".into(),
        "double" => "DOUBLE".into(),
        "string" => "VARCHAR".into(),
        "binary" => "BLOB".into(),
        "date" => "DATE".into(),
        "timestamp" | "timestamp_ntz" => "TIMESTAMP".into(),
        t if t.starts_with("decimal(") => format!("DECIMAL{}", &t["decimal".len()..]),
        _ => {
            return Err(Error::Schema {
                message: format!("column {column} of the Delta table {table} has the type {ty}, which fixpoint does not read"),
                hint: Some("fixpoint reads Delta tables of primitive columns (numbers, strings, dates, timestamps, booleans, binary)".into()),
            })
        }
    })
}

/// A DuckDB type as Delta's, or the error naming the column.
pub(crate) fn delta_type(table: &TableName, column: &Column) -> Result<DataType> {
    let upper = column.ty.trim().to_ascii_uppercase();
    let simple = match upper.as_str() {
        "BOOLEAN" | "BOOL" => Some(DataType::BOOLEAN),
        "TINYINT" | "INT1" => Some(DataType::BYTE),
        "SMALLINT" | "INT2" => Some(DataType::SHORT),
        "INTEGER" | "INT" | "INT4" => Some(DataType::INTEGER),
        "BIGINT" | "INT8" | "LONG" => Some(DataType::LONG),
        "FLOAT" | "REAL" | "FLOAT4" => Some(DataType::FLOAT),
        "DOUBLE" | "FLOAT8" => Some(DataType::DOUBLE),
        "VARCHAR" | "TEXT" | "STRING" => Some(DataType::STRING),
        "BLOB" | "BYTEA" => Some(DataType::BINARY),
        "DATE" => Some(DataType::DATE),
        "TIMESTAMP" | "DATETIME" | "TIMESTAMP WITH TIME ZONE" | "TIMESTAMPTZ" => Some(DataType::TIMESTAMP),
        _ => None,
    };
    if let Some(t) = simple {
        return Ok(t);
    }
    if let Some(args) = upper.strip_prefix("DECIMAL(").or_else(|| upper.strip_prefix("NUMERIC(")).and_then(|a| a.strip_suffix(')')) {
        let mut parts = args.split(',').map(|p| p.trim().parse::<u8>());
        if let (Some(Ok(p)), Some(Ok(s)), None) = (parts.next(), parts.next(), parts.next()) {
            if let Ok(t) = DataType::decimal(p, s) {
                return Ok(t);
            }
        }
    }
    if upper.starts_with("VARCHAR(") {
        return Ok(DataType::STRING);
    }
    Err(Error::Schema {
        message: format!("column {} of {table} has the type {}, which a Delta table fixpoint writes cannot hold", column.name, column.ty),
        hint: Some(format!("cast {} in the source query to a Delta type: BIGINT, INTEGER, DOUBLE, DECIMAL(p,s), VARCHAR, DATE, TIMESTAMP, BOOLEAN or BLOB", column.name)),
    })
}

/// Creates the table at `place` with `columns`, partitioned by `partition`.
pub(crate) async fn create(name: &TableName, place: &Place<'_>, columns: &[Column], partition: Option<&str>) -> Result<Table> {
    let mut fields = Vec::new();
    for c in columns {
        fields.push(StructField::new(c.name.clone(), delta_type(name, c)?, true));
    }
    let dir = place.dir;
    std::fs::create_dir_all(dir).map_err(|e| Error::Io { path: dir.to_owned(), source: e })?;
    let table = place.table().map_err(|e| delta_error(format!("creating the Delta table {name}"), e))?;
    let mut create = table.create().with_table_name(name.table.clone()).with_columns(fields).with_save_mode(SaveMode::ErrorIfExists);
    if let Some(p) = partition {
        create = create.with_partition_columns([p.to_owned()]);
    }
    let delta = create.await.map_err(|e| delta_error(format!("creating the Delta table {name}"), e))?;
    from_delta(name, dir, delta)
}

/// The table `name` at `place` with `columns`, partitioned by
/// `partition`, as a run creates it: nothing is written until the run's
/// commit, which creates it with its first rows (one commit, version 0).
pub(crate) fn pending(name: &TableName, place: &Place<'_>, columns: &[Column], partition: Option<&str>) -> Result<Table> {
    let mut fields = Vec::new();
    let mut typed = Vec::new();
    for c in columns {
        let ty = delta_type(name, c)?;
        let json = serde_json::to_value(&ty).map_err(|e| Error::Internal(format!("the Delta type of {}: {e}", c.name)))?;
        typed.push(Column { name: c.name.clone(), ty: duckdb_type(name, &c.name, &json)? });
        fields.push(StructField::new(c.name.clone(), ty, true));
    }
    std::fs::create_dir_all(place.dir).map_err(|e| Error::Io { path: place.dir.to_owned(), source: e })?;
    let delta = place.table().map_err(|e| delta_error(format!("creating the Delta table {name}"), e))?;
    Ok(Table {
        name: name.clone(),
        dir: place.dir.to_owned(),
        delta,
        columns: typed,
        partitions: partition.map(str::to_owned).into_iter().collect(),
        files: Vec::new(),
        removes: Vec::new(),
        creation: Some(Creation { fields, partition: partition.map(str::to_owned) }),
    })
}

/// Adds a nullable column to the table (a commit of its own).
pub(crate) async fn add_column(table: Table, column: &Column) -> Result<Table> {
    let field = StructField::new(column.name.clone(), delta_type(&table.name, column)?, true);
    let name = table.name.clone();
    let dir = table.dir.clone();
    let delta = table.delta.add_columns().with_fields([field]).await.map_err(|e| delta_error(format!("adding the column {} to {name}", column.name), e))?;
    from_delta(&name, &dir, delta)
}

/// How a commit ended.
pub(crate) enum Committed {
    /// At this version.
    Version(#[allow(dead_code)] i64),
    /// Another writer committed first since the snapshot the run read.
    Conflict,
}

/// Commits the table's pending changes as one commit on the snapshot the
/// run read: `txn` for the app id, `info` as commit info. With
/// `retries = 0` the commit fails when the table moved since.
pub(crate) async fn commit(table: &Table, txn: Option<(String, i64)>, info: HashMap<String, serde_json::Value>, retries: usize, append: bool) -> Result<Committed> {
    let now = chrono::Utc::now().timestamp_millis();
    let mut actions = Vec::new();
    for f in &table.removes {
        actions.push(Action::Remove(Remove {
            path: encode_path(&f.path),
            data_change: true,
            deletion_timestamp: Some(now),
            extended_file_metadata: Some(true),
            partition_values: Some(f.partition_values.clone()),
            size: Some(f.size),
            ..Default::default()
        }));
    }
    for f in table.files.iter().filter(|f| f.pending) {
        actions.push(Action::Add(Add { path: encode_path(&f.path), partition_values: f.partition_values.clone(), size: f.size, modification_time: now, data_change: true, ..Default::default() }));
    }
    let mut props = CommitProperties::default().with_max_retries(retries).with_create_checkpoint(false).with_metadata(info);
    if let Some((app, version)) = txn {
        props = props.with_application_transaction(Transaction::new(app, version));
    }
    if let Some(creation) = &table.creation {
        // The table's first commit: its schema and the run's rows together.
        // Never retried: a table another writer created first is a conflict.
        let mut create = table
            .delta
            .create()
            .with_table_name(table.name.table.clone())
            .with_columns(creation.fields.clone())
            .with_save_mode(SaveMode::ErrorIfExists)
            .with_actions(actions)
            .with_commit_properties(props.with_max_retries(0));
        if let Some(p) = &creation.partition {
            create = create.with_partition_columns([p.clone()]);
        }
        return match create.await {
            Ok(done) => Ok(Committed::Version(done.version().map_or(0, |v| v as i64))),
            Err(DeltaTableError::VersionAlreadyExists(_)) | Err(DeltaTableError::Transaction { source: TransactionError::MaxCommitAttempts(_) | TransactionError::CommitConflict(_) }) => {
                Ok(Committed::Conflict)
            }
            Err(e) => match table.delta.log_store().is_delta_table_location().await {
                // Created by another writer between the run's look and its commit.
                Ok(true) => Ok(Committed::Conflict),
                _ => Err(delta_error(format!("creating the Delta table {}", table.name), e)),
            },
        };
    }
    let snapshot = table.delta.snapshot().map_err(|e| delta_error(format!("reading {}", table.name), e))?;
    let operation = DeltaOperation::Write {
        mode: if append { SaveMode::Append } else { SaveMode::Overwrite },
        partition_by: (!table.partitions.is_empty()).then(|| table.partitions.clone()),
        predicate: None,
    };
    match CommitBuilder::from(props).with_actions(actions).build(Some(snapshot as &dyn TableReference), table.delta.log_store(), operation).await {
        Ok(done) => Ok(Committed::Version(done.version() as i64)),
        Err(DeltaTableError::VersionAlreadyExists(_)) | Err(DeltaTableError::Transaction { source: TransactionError::MaxCommitAttempts(_) | TransactionError::CommitConflict(_) }) => Ok(Committed::Conflict),
        Err(e) => Err(delta_error(format!("committing to the Delta table {}", table.name), e)),
    }
}

/// The commit info (`fixpoint` key) of the table's commits after `after`,
/// newest first.
pub(crate) async fn fixpoint_infos(delta: &DeltaTable, after: i64) -> Result<Vec<serde_json::Value>> {
    let newest = delta.version().map_or(-1, |v| v as i64);
    if newest <= after {
        return Ok(Vec::new());
    }
    let infos: Vec<_> = delta.history(Some((newest - after) as usize)).try_collect().await.map_err(|e| delta_error("reading a Delta table's history", e))?;
    Ok(infos.into_iter().filter_map(|i| i.info.get("fixpoint").cloned()).collect())
}

/// The version of `app` in the table's snapshot.
pub(crate) async fn txn_version(table: &Table, app: &str) -> Result<Option<i64>> {
    let snapshot = table.delta.snapshot().map_err(|e| delta_error(format!("reading {}", table.name), e))?;
    snapshot.transaction_version(table.delta.log_store().as_ref(), app).await.map_err(|e| delta_error(format!("reading the transactions of {}", table.name), e))
}

/// A relative path as the log stores it (percent-encoded).
fn encode_path(path: &str) -> String {
    let mut out = String::with_capacity(path.len());
    for b in path.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'/' | b'=' => out.push(b as char),
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}
