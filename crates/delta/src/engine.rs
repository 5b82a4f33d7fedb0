//! [`Engine`] over a warehouse of Delta tables, computed in DuckDB.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use fixpoint_core::engine::{Accelerator, Column, Dialect, Engine, FileInput, Leases, Rows};
use fixpoint_core::job::ident::{quote_ident, TableName};
use fixpoint_core::job::sql::{Sql, Value};
use fixpoint_core::{Error, Result};
use fixpoint_duckdb::DuckDb;
use sqlparser::ast::{AlterTableOperation, ObjectName, ObjectType, Statement};

use crate::store::S3;
use crate::table::{self, Committed, DataFile, Place, Table};

/// The ledger's name.
fn ledger_name() -> TableName {
    TableName { schema: fixpoint_core::run::ledger::SCHEMA.into(), table: fixpoint_core::run::ledger::TABLE.into() }
}

/// A failure injected on purpose (tests, and the CLI in test mode).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeltaFault {
    /// The data commit lands, and the run then fails as if its
    /// acknowledgement had been lost (before the ledger row is written).
    LoseCommitAck,
    /// The process aborts (like `kill -9`) right after the data commit
    /// lands, before the ledger row is written.
    AbortAfterCommit,
}

/// A warehouse of Delta tables in a local folder or on S3.
pub struct Delta {
    duck: DuckDb,
    /// The warehouse's folder (on S3: its local cache).
    root: PathBuf,
    /// On S3: the bucket and prefix.
    s3: Option<S3>,
    rt: tokio::runtime::Runtime,
    tables: HashMap<TableName, Table>,
    fault: Option<DeltaFault>,
    /// Remove the warehouse when dropped (tests' scratch warehouses).
    scratch: bool,
    /// The version of each table whose newest commit's ledger row is known
    /// to be written.
    checked: HashMap<TableName, i64>,
    /// A run holds its lease: writes to tables other than its target and
    /// the ledger (a merge's tombstones) wait for the run's commit.
    in_run: bool,
}

impl Drop for Delta {
    fn drop(&mut self) {
        // Files written for a commit that never came are not part of any
        // table; remove them.
        let orphans: Vec<(TableName, String)> = self.tables.iter().flat_map(|(n, t)| t.files.iter().filter(|f| f.pending).map(|f| (n.clone(), f.path.clone()))).collect();
        for (name, rel) in orphans {
            self.remove_written(&name, &rel);
        }
        if self.scratch {
            if let Some(s3) = &self.s3 {
                let _ = self.rt.block_on(s3.delete_all(""));
            }
            let _ = std::fs::remove_dir_all(&self.root);
        }
    }
}

/// The folder of `delta:PATH`.
pub fn parse_url(url: &str) -> Option<PathBuf> {
    url.strip_prefix("delta:").map(PathBuf::from)
}

impl Delta {
    /// Opens the warehouse `delta:PATH` (created when missing; its parent
    /// folder must exist) or `delta:s3://bucket/prefix`.
    pub fn open_url(url: &str) -> Result<Delta> {
        let path = parse_url(url).ok_or_else(|| Error::argument(format!("{url:?} is not a Delta warehouse URL"), Some("use delta:PATH or delta:s3://bucket/prefix")))?;
        match path.to_str() {
            Some(p) if p.starts_with("s3://") => Delta::open_s3(p, &[]),
            Some(p) if p.contains("://") => Err(Error::argument(
                format!("{url:?}: fixpoint writes Delta warehouses in local folders and on S3 (s3://); this scheme is not supported"),
                Some("give delta:/path/to/warehouse or delta:s3://bucket/prefix"),
            )),
            _ => Delta::open(&path),
        }
    }

    /// Opens the warehouse `s3://bucket/prefix` (`options`: S3 settings
    /// over the `AWS_*` environment variables, e.g. `aws_endpoint_url`).
    pub fn open_s3(url: &str, options: &[(String, String)]) -> Result<Delta> {
        let s3 = S3::open(url, options)?;
        let cache = crate::store::cache_dir(&s3);
        std::fs::create_dir_all(&cache).map_err(|e| Error::Io { path: cache.clone(), source: e })?;
        Delta::init(cache, Some(s3))
    }

    /// A warehouse on S3 removed when dropped, with its cache (tests).
    pub fn scratch_s3(url: &str, options: &[(String, String)]) -> Result<Delta> {
        let mut d = Delta::open_s3(url, options)?;
        d.scratch = true;
        Ok(d)
    }

    /// Opens the warehouse in `path`.
    pub fn open(path: &Path) -> Result<Delta> {
        let root = std::path::absolute(path).map_err(|e| Error::Io { path: path.to_owned(), source: e })?;
        if let Some(parent) = root.parent() {
            if !parent.is_dir() {
                return Err(Error::argument(
                    format!("cannot open {} as a Delta warehouse: the folder {} does not exist", root.display(), parent.display()),
                    Some("fixpoint creates the warehouse folder, not its parent: create the parent first (mkdir -p), or fix --db"),
                ));
            }
        }
        if root.exists() && !root.is_dir() {
            return Err(Error::argument(format!("{} is not a folder", root.display()), Some("give --db delta:FOLDER, a folder that holds (or will hold) the warehouse's tables")));
        }
        std::fs::create_dir_all(&root).map_err(|e| Error::Io { path: root.clone(), source: e })?;
        Delta::init(root, None)
    }

    fn init(root: PathBuf, s3: Option<S3>) -> Result<Delta> {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().map_err(|e| Error::Internal(format!("starting the Delta runtime: {e}")))?;
        let mut duck = DuckDb::open_in_memory()?;
        // Delta's `timestamp` is UTC: DuckDB's TIMESTAMP values are written
        // and read as UTC whatever the machine's zone (the setting exists
        // only where DuckDB has its time zone extension; without it every
        // conversion is UTC already).
        let _ = duck.execute(&Sql::raw("SET TimeZone = 'UTC'"));
        // The leased plans guard a row inside their write with Spark's
        // `raise_error`; DuckDB calls it `error`.
        duck.execute(&Sql::raw("CREATE OR REPLACE TEMPORARY MACRO raise_error(message) AS error(message)"))?;
        let mut delta = Delta { duck, root, s3, rt, tables: HashMap::new(), fault: None, scratch: false, checked: HashMap::new(), in_run: false };
        delta.discover()?;
        delta.repair_ledger()?;
        Ok(delta)
    }

    /// A warehouse in `path` removed when dropped (tests).
    pub fn scratch(path: &Path) -> Result<Delta> {
        let mut d = Delta::open(path)?;
        d.scratch = true;
        Ok(d)
    }

    /// Injects `fault` (tests).
    pub fn with_fault(mut self, fault: Option<DeltaFault>) -> Delta {
        self.fault = fault;
        self
    }

    /// The warehouse's folder.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The folder of `table` (on S3: in the local cache).
    pub fn table_dir(&self, table: &TableName) -> PathBuf {
        self.root.join(&table.schema).join(&table.table)
    }

    /// `schema/table`, the table's path in the warehouse.
    fn rel(table: &TableName) -> String {
        format!("{}/{}", table.schema, table.table)
    }

    /// Where the table's log is read and written.
    fn place<'a>(&self, table: &TableName, dir: &'a Path) -> Result<Place<'a>> {
        let remote = match &self.s3 {
            Some(s3) => Some((s3.url(&Self::rel(table))?, s3.store.clone())),
            None => None,
        };
        Ok(Place { dir, remote })
    }

    /// Whether `table` has a Delta log.
    fn has_log(&self, table: &TableName) -> Result<bool> {
        match &self.s3 {
            Some(s3) => self.rt.block_on(s3.holds(&format!("{}/_delta_log", Self::rel(table)))),
            None => Ok(self.table_dir(table).join("_delta_log").is_dir()),
        }
    }

    /// Removes a data file this process wrote and did not commit (best
    /// effort: a file left over is in no table).
    fn remove_written(&self, table: &TableName, rel: &str) {
        let _ = std::fs::remove_file(self.table_dir(table).join(rel));
        if let Some(s3) = &self.s3 {
            let _ = self.rt.block_on(s3.delete(&format!("{}/{rel}", Self::rel(table))));
        }
    }

    /// On S3: every active file of `name` in the local cache (downloaded
    /// when missing or of another size).
    fn fetch(&mut self, name: &TableName) -> Result<()> {
        let Some(s3) = &self.s3 else { return Ok(()) };
        let t = &self.tables[name];
        for f in t.files.iter().filter(|f| !f.pending) {
            let local = t.dir.join(&f.path);
            if std::fs::metadata(&local).map(|m| m.len() as i64 == f.size).unwrap_or(false) {
                continue;
            }
            self.rt.block_on(s3.download(&format!("{}/{}", Self::rel(name), f.path), &local))?;
        }
        Ok(())
    }

    /// Loads every table of the warehouse and makes it readable.
    fn discover(&mut self) -> Result<()> {
        let mut names = Vec::new();
        if let Some(s3) = &self.s3 {
            for schema in self.rt.block_on(s3.folders(""))? {
                for table in self.rt.block_on(s3.folders(&schema))? {
                    if self.rt.block_on(s3.holds(&format!("{schema}/{table}/_delta_log")))? {
                        names.push(TableName { schema: schema.clone(), table });
                    }
                }
            }
        }
        for schema in if self.s3.is_some() { Vec::new() } else { read_dir(&self.root)? } {
            for table in read_dir(&schema)? {
                if table.join("_delta_log").is_dir() {
                    let (Some(s), Some(t)) = (schema.file_name().and_then(|s| s.to_str()), table.file_name().and_then(|s| s.to_str())) else { continue };
                    names.push(TableName { schema: s.to_owned(), table: t.to_owned() });
                }
            }
        }
        for name in names {
            self.load(&name)?;
        }
        Ok(())
    }

    /// (Re)loads `name`'s newest snapshot and its view.
    fn load(&mut self, name: &TableName) -> Result<()> {
        let dir = self.table_dir(name);
        let place = self.place(name, &dir)?;
        let t = self.rt.block_on(table::load(name, &place))?;
        self.tables.insert(name.clone(), t);
        self.register(name)
    }

    /// Reloads each table another writer committed to since it was loaded.
    fn refresh(&mut self) -> Result<()> {
        let mut stale = Vec::new();
        for (name, t) in &self.tables {
            if !self.has_log(name)? {
                stale.push((name.clone(), false));
                continue;
            }
            let latest = self.rt.block_on(t.delta.get_latest_version()).map_err(|e| table::delta_error(format!("reading the log of {name}"), e))?;
            if latest as i64 != t.version() {
                stale.push((name.clone(), true));
            }
        }
        for (name, exists) in stale {
            if exists {
                self.load(&name)?;
            } else {
                self.tables.remove(&name);
                self.duck.execute(&Sql::raw(format!("DROP VIEW IF EXISTS {}", name.quoted())))?;
            }
        }
        Ok(())
    }

    /// Whether `name` is a table of the warehouse (loaded now, or created
    /// by another process since).
    fn is_table(&mut self, name: &TableName) -> Result<bool> {
        if self.tables.contains_key(name) {
            return Ok(true);
        }
        if self.has_log(name)? {
            self.load(name)?;
            return Ok(true);
        }
        Ok(false)
    }

    /// Makes `name` readable in DuckDB as a view over its files, as the
    /// run will leave them.
    fn register(&mut self, name: &TableName) -> Result<()> {
        self.fetch(name)?;
        let select = self.view_select(name, false)?;
        self.duck.execute(&Sql::raw(format!("CREATE SCHEMA IF NOT EXISTS {}", quote_ident(&name.schema))))?;
        self.duck.execute(&Sql::raw(format!("CREATE OR REPLACE VIEW {} AS {select}", name.quoted())))?;
        Ok(())
    }

    /// Materializes `select` as `"__fixpoint_out"`; returns its columns
    /// renamed to `columns` (in order), as a select list.
    fn stage_output(&mut self, select: &Sql, columns: &[String]) -> Result<String> {
        let mut staged = Sql::new();
        staged.push(&format!("CREATE OR REPLACE TEMPORARY TABLE \"__fixpoint_out\" AS {}", select.text));
        staged.params = select.params.clone();
        self.duck.execute(&staged)?;
        let described = self.duck.describe(&Sql::raw("SELECT * FROM \"__fixpoint_out\""))?;
        Ok(described.iter().zip(columns).map(|(s, t)| format!("{} AS {}", quote_ident(&s.name), quote_ident(t))).collect::<Vec<_>>().join(", "))
    }

    /// The rows of `name` as its snapshot (with this run's pending changes)
    /// holds them; `with_file`: and the path of the file holding each row,
    /// as `"__fixpoint_file"`.
    fn view_select(&mut self, name: &TableName, with_file: bool) -> Result<String> {
        let t = &self.tables[name];
        let select = if t.files.is_empty() {
            let mut cols: Vec<String> = t.columns.iter().map(|c| format!("CAST(NULL AS {}) AS {}", c.ty, quote_ident(&c.name))).collect();
            if with_file {
                cols.push("CAST(NULL AS VARCHAR) AS \"__fixpoint_file\"".into());
            }
            format!("SELECT {} WHERE false", cols.join(", "))
        } else {
            let paths: Vec<String> = t.files.iter().map(|f| literal(&t.dir.join(&f.path).to_string_lossy())).collect();
            let list = format!("[{}]", paths.join(", "));
            let present = self.present_columns(&list)?;
            let t = &self.tables[name];
            let mut cols = Vec::new();
            for c in &t.columns {
                if t.partitions.contains(&c.name) {
                    cols.push(format!("p.{}", quote_ident(&c.name)));
                } else if present.contains(&c.name) {
                    cols.push(format!("CAST(f.{} AS {}) AS {}", quote_ident(&c.name), c.ty, quote_ident(&c.name)));
                } else {
                    cols.push(format!("CAST(NULL AS {}) AS {}", c.ty, quote_ident(&c.name)));
                }
            }
            if with_file {
                cols.push("f.\"__fixpoint_file\"".into());
            }
            if t.partitions.is_empty() {
                let file = if with_file { ", filename = '__fixpoint_file'" } else { "" };
                format!("SELECT {} FROM read_parquet({list}, union_by_name = true{file}) AS f", cols.join(", "))
            } else {
                let mut values = Vec::new();
                for f in &t.files {
                    let mut row = vec![literal(&t.dir.join(&f.path).to_string_lossy())];
                    for p in &t.partitions {
                        let ty = &t.columns.iter().find(|c| &c.name == p).map(|c| c.ty.clone()).unwrap_or_else(|| "VARCHAR".into());
                        match f.partition_values.get(p).cloned().flatten() {
                            Some(v) => row.push(format!("CAST({} AS {ty})", literal(&v))),
                            None => row.push(format!("CAST(NULL AS {ty})")),
                        }
                    }
                    values.push(format!("({})", row.join(", ")));
                }
                let pcols: Vec<String> = t.partitions.iter().map(|p| quote_ident(p)).collect();
                format!(
                    "SELECT {} FROM read_parquet({list}, union_by_name = true, filename = '__fixpoint_file') AS f JOIN (VALUES {}) AS p(\"__fixpoint_path\", {}) ON f.\"__fixpoint_file\" = p.\"__fixpoint_path\"",
                    cols.join(", "),
                    values.join(", "),
                    pcols.join(", ")
                )
            }
        };
        Ok(select)
    }

    /// The columns the files in `list` hold between them.
    fn present_columns(&mut self, list: &str) -> Result<Vec<String>> {
        let rows = self.duck.query(&Sql::raw(format!("DESCRIBE SELECT * FROM read_parquet({list}, union_by_name = true)")))?;
        Ok(rows.rows.iter().filter_map(|r| r.first().and_then(|v| v.as_str()).map(str::to_owned)).collect())
    }

    /// Writes the rows of `relation` (a quoted DuckDB relation with the
    /// table's column names, any subset) as new Parquet files of `name`,
    /// one per partition; returns them (not committed).
    fn write_files(&mut self, name: &TableName, relation: &str) -> Result<Vec<DataFile>> {
        let t = &self.tables[name];
        let (dir, partitions, columns) = (t.dir.clone(), t.partitions.clone(), t.columns.clone());
        let present: Vec<String> = self.duck.describe(&Sql::raw(format!("SELECT * FROM {relation}")))?.into_iter().map(|c| c.name).collect();
        for p in &partitions {
            if !present.contains(p) {
                return Err(Error::Schema { message: format!("rows written to {name} lack its partition column {p}"), hint: Some(format!("give every row of {name} a value of {p}")) });
            }
        }
        let data: Vec<String> = columns
            .iter()
            .filter(|c| !partitions.contains(&c.name) && present.contains(&c.name))
            .map(|c| {
                let target = if c.ty == "TIMESTAMP" { "TIMESTAMPTZ".to_owned() } else { c.ty.clone() };
                format!("CAST({} AS {target}) AS {}", quote_ident(&c.name), quote_ident(&c.name))
            })
            .collect();
        let groups: Vec<Vec<Option<String>>> = if partitions.is_empty() {
            vec![Vec::new()]
        } else {
            // The distinct values first, then their text (a cast per group, not per row).
            let list: Vec<String> = partitions.iter().map(|p| format!("CAST({0} AS VARCHAR) AS {0}", quote_ident(p))).collect();
            let keys: Vec<String> = partitions.iter().map(|p| quote_ident(p)).collect();
            let rows = self.duck.query(&Sql::raw(format!("SELECT {} FROM (SELECT DISTINCT {} FROM {relation})", list.join(", "), keys.join(", "))))?;
            rows.rows.into_iter().map(|r| r.into_iter().map(|v| v.as_str().map(str::to_owned)).collect()).collect()
        };
        let mut out: Vec<DataFile> = Vec::new();
        // One group (a day, or an unpartitioned table): every row is in it,
        // and the rows are written straight from `relation`.
        let only_one = groups.len() == 1;
        for group in groups {
            let mut sql = Sql::new();
            let mut folder = String::new();
            let mut values = HashMap::new();
            if only_one {
                sql.push(&format!("SELECT {} FROM {relation}", data.join(", ")));
            } else {
                sql.push(&format!("CREATE OR REPLACE TEMPORARY TABLE \"__fixpoint_part\" AS SELECT {} FROM {relation}", data.join(", ")));
            }
            for (i, (p, v)) in partitions.iter().zip(&group).enumerate() {
                if only_one {
                    folder.push_str(&format!("{}={}/", safe_segment(p), v.as_deref().map_or_else(|| "__HIVE_DEFAULT_PARTITION__".to_owned(), safe_segment)));
                    values.insert(p.clone(), v.clone());
                    continue;
                }
                sql.push(if i == 0 { " WHERE " } else { " AND " });
                sql.push(&format!("CAST({} AS VARCHAR) IS NOT DISTINCT FROM ", quote_ident(p)));
                sql.param(v.clone().map_or(Value::Null, Value::Text));
                folder.push_str(&format!("{}={}/", safe_segment(p), v.as_deref().map_or_else(|| "__HIVE_DEFAULT_PARTITION__".to_owned(), safe_segment)));
                values.insert(p.clone(), v.clone());
            }
            if !only_one && self.duck.execute(&sql)? == 0 {
                continue;
            }
            let rel = format!("{folder}part-00000-{}-c000.snappy.parquet", uuid::Uuid::new_v4());
            let path = dir.join(&rel);
            if let Some(parent) = path.parent() {
                std::fs::create_dir_all(parent).map_err(|e| Error::Io { path: parent.to_owned(), source: e })?;
            }
            let from = if only_one { format!("({})", sql.text) } else { "\"__fixpoint_part\"".to_owned() };
            let written = self.duck.execute(&Sql::raw(format!("COPY {from} TO {} (FORMAT parquet)", literal(&path.to_string_lossy()))));
            match written {
                // An empty relation (one group holds every row: none here) writes no file.
                Ok(0) if only_one => {
                    let _ = std::fs::remove_file(&path);
                    continue;
                }
                Ok(_) => {}
                Err(e) => {
                    let _ = std::fs::remove_file(&path);
                    return Err(e);
                }
            }
            let size = std::fs::metadata(&path).map_err(|e| Error::Io { path: path.clone(), source: e })?.len() as i64;
            if let Some(s3) = &self.s3 {
                if let Err(e) = self.rt.block_on(s3.upload(&path, &format!("{}/{rel}", Self::rel(name)))) {
                    self.remove_written(name, &rel);
                    for f in &out {
                        self.remove_written(name, &f.path);
                    }
                    return Err(e);
                }
            }
            out.push(DataFile { path: rel, size, partition_values: values, pending: true });
        }
        self.duck.execute(&Sql::raw("DROP TABLE IF EXISTS \"__fixpoint_part\""))?;
        Ok(out)
    }

    /// Replaces the files of `name` whose partition values `matches` with
    /// `new` (pending until the run's commit).
    fn replace_files(&mut self, name: &TableName, matches: impl Fn(&DataFile) -> bool, new: Vec<DataFile>) -> Result<()> {
        let t = self.tables.get_mut(name).expect("loaded");
        let (gone, kept): (Vec<DataFile>, Vec<DataFile>) = std::mem::take(&mut t.files).into_iter().partition(|f| matches(f));
        let mut unwritten = Vec::new();
        for f in gone {
            if f.pending {
                unwritten.push(f.path);
            } else {
                t.removes.push(f);
            }
        }
        t.files = kept;
        t.files.extend(new);
        for rel in unwritten {
            self.remove_written(name, &rel);
        }
        self.register(name)
    }

    /// Appends the rows of `relation` to `name` in a commit of their own.
    fn append(&mut self, name: &TableName, relation: &str, info: HashMap<String, serde_json::Value>) -> Result<u64> {
        let rows = fixpoint_core::engine::query_count(&mut self.duck, &Sql::raw(format!("SELECT count(*) AS \"n\" FROM {relation}")), "n", "the rows to append")?;
        if rows == 0 {
            return Ok(0);
        }
        if self.in_run && *name != ledger_name() {
            // Committed with the run's commit (recorded by the target's).
            let files = self.write_files(name, relation)?;
            self.tables.get_mut(name).expect("loaded").files.extend(files);
            self.register(name)?;
            return Ok(rows);
        }
        if self.tables[name].has_pending() {
            return Err(Error::Internal(format!("an append to {name} while this run's changes to it are not committed")));
        }
        let files = self.write_files(name, relation)?;
        let t = self.tables.get_mut(name).expect("loaded");
        t.files.extend(files);
        let committed = self.rt.block_on(table::commit(&self.tables[name], None, info, 20, true));
        match committed {
            Ok(Committed::Version(_)) => {}
            Ok(Committed::Conflict) | Err(_) => {
                self.discard(name);
                return match committed {
                    Err(e) => Err(e),
                    _ => Err(Error::Busy { message: format!("{name} changed under this append too often to commit it; nothing was appended; run it again") }),
                };
            }
        }
        self.load(name)?;
        Ok(rows)
    }

    /// Drops this run's uncommitted changes to `name` (their files removed).
    fn discard(&mut self, name: &TableName) {
        let Some(t) = self.tables.get_mut(name) else { return };
        let unwritten: Vec<String> = t.files.iter().filter(|f| f.pending).map(|f| f.path.clone()).collect();
        t.files.retain(|f| !f.pending);
        t.removes.clear();
        t.creation = None;
        for rel in unwritten {
            self.remove_written(name, &rel);
        }
    }

    /// Commits the run's changes, then appends the ledger row. The job's
    /// target is committed first, with the run's `txn` and its ledger entry
    /// as commit info; that commit also records what the run changes in
    /// its other tables (a history's log, a merge's tombstones), each then
    /// committed with its own `txn`. Delta commits one table at a time: a
    /// crash between the target's commit and the others' leaves them to be
    /// finished from the target's record by the next process that opens
    /// the warehouse (`repair_ledger`), before anything reads them.
    fn publish(&mut self, entry: serde_json::Map<String, serde_json::Value>) -> Result<()> {
        let text = |k: &str| entry.get(k).and_then(|v| v.as_str()).unwrap_or_default().to_owned();
        let app = format!("fixpoint:{}:{}", text("job"), text("run_date"));
        let mut names: Vec<TableName> = self.tables.iter().filter(|(_, t)| t.has_pending()).map(|(n, _)| n.clone()).collect();
        names.sort_by_key(|n| n.to_string());
        let target = TableName::parse(&text("target")).ok().filter(|t| names.contains(t));
        let Some(target) = target else {
            // Nothing of the target changed: each changed table on its own.
            let mut record = true;
            for name in names {
                record &= self.commit_run(&name, &app, &entry, Vec::new())?;
            }
            if record {
                self.append_ledger(&entry)?;
            }
            return Ok(());
        };
        let mut companions = Vec::new();
        for name in names.iter().filter(|n| **n != target) {
            companions.push(self.companion(name, &app)?);
        }
        let others: Vec<TableName> = names.iter().filter(|n| **n != target).cloned().collect();
        let outcome = self.commit_run(&target, &app, &entry, companions.clone());
        match &outcome {
            Ok(true) => {}
            // Another run's identical commit landed first (it finishes its
            // own), or another writer's commit came first: nothing of this
            // run landed.
            Ok(false) | Err(Error::Busy { .. }) => {
                for name in &others {
                    self.discard(name);
                    self.reload(name)?;
                }
                return outcome.map(|_| ());
            }
            Err(_) => {
                // The target's commit may have landed (its answer lost): the
                // other tables' files are named by it and stay, for the
                // next process to commit.
                for name in &others {
                    if let Some(t) = self.tables.get_mut(name) {
                        t.files.retain(|f| !f.pending);
                        t.removes.clear();
                        t.creation = None;
                    }
                    self.reload(name)?;
                }
                return outcome.map(|_| ());
            }
        }
        for c in &companions {
            self.finish_companion(c, &entry)?;
        }
        self.append_ledger(&entry)
    }

    /// What this run changes in `name` besides the target, as the target's
    /// commit records it: the `txn` it will carry, the files it removes and
    /// adds, and the table's schema when the run creates it.
    fn companion(&mut self, name: &TableName, app: &str) -> Result<serde_json::Value> {
        let t = &self.tables[name];
        let next = match t.creation {
            Some(_) => 1,
            None => self.rt.block_on(table::txn_version(t, app))?.unwrap_or(0) + 1,
        };
        let file = |f: &DataFile| serde_json::json!({ "path": f.path, "size": f.size, "partition_values": f.partition_values });
        Ok(serde_json::json!({
            "table": name.to_string(),
            "schema": name.schema,
            "name": name.table,
            "app_id": app,
            "txn_version": next,
            "read_version": t.version(),
            "create": t.creation.as_ref().map(|c| serde_json::json!({ "fields": c.fields, "partition": c.partition })),
            "removes": t.removes.iter().map(file).collect::<Vec<_>>(),
            "adds": t.files.iter().filter(|f| f.pending).map(file).collect::<Vec<_>>(),
        }))
    }

    /// Commits `companion` (recorded by the target's commit) unless its
    /// `txn` is in its table already. Its files are never removed: the
    /// target's commit names them, and a failure here leaves the commit to
    /// the next process that opens the warehouse.
    fn finish_companion(&mut self, companion: &serde_json::Value, entry: &serde_json::Map<String, serde_json::Value>) -> Result<()> {
        let name = companion_table(companion)?;
        let app = companion["app_id"].as_str().unwrap_or_default().to_owned();
        let version = companion["txn_version"].as_i64().ok_or_else(|| Error::Internal(format!("a commit's record of the changes to {name} has no transaction version")))?;
        // This run's pending state of the table is what the record says.
        if let Some(t) = self.tables.get_mut(&name) {
            t.files.retain(|f| !f.pending);
            t.removes.clear();
            t.creation = None;
        }
        let info = HashMap::from([("fixpoint_companion".to_owned(), serde_json::json!({ "run_key": entry.get("run_key"), "app_id": app, "txn_version": version }))]);
        let result = self.commit_companion(&name, &app, version, companion, info);
        self.reload(&name)?;
        result
    }

    /// Commits the recorded changes `companion` to `name` with `txn(app,
    /// version)`, unless that version is committed already.
    fn commit_companion(&mut self, name: &TableName, app: &str, version: i64, companion: &serde_json::Value, info: HashMap<String, serde_json::Value>) -> Result<()> {
        let files = |k: &str| -> Vec<DataFile> {
            companion[k]
                .as_array()
                .map(|a| {
                    a.iter()
                        .map(|f| DataFile {
                            path: f["path"].as_str().unwrap_or_default().to_owned(),
                            size: f["size"].as_i64().unwrap_or_default(),
                            partition_values: serde_json::from_value(f["partition_values"].clone()).unwrap_or_default(),
                            pending: true,
                        })
                        .collect()
                })
                .unwrap_or_default()
        };
        let dir = self.table_dir(name);
        let place = self.place(name, &dir)?;
        let exists = self.has_log(name)?;
        let mut t = match (&companion["create"], exists) {
            (serde_json::Value::Object(create), false) => {
                let fields: Vec<deltalake_core::kernel::StructField> =
                    serde_json::from_value(create["fields"].clone()).map_err(|e| Error::Internal(format!("a commit's record of the schema of {name}: {e}")))?;
                let partition = create["partition"].as_str().map(str::to_owned);
                let mut t = table::pending(name, &place, &[], None)?;
                t.creation = Some(table::Creation { fields, partition: partition.clone() });
                t.partitions = partition.into_iter().collect();
                t
            }
            (_, true) => self.rt.block_on(table::load(name, &place))?,
            (_, false) => return Err(Error::Internal(format!("the Delta table {name} is gone, and a run's changes to it are still to be committed"))),
        };
        if exists && self.rt.block_on(table::txn_version(&t, app))?.unwrap_or(0) >= version {
            return Ok(());
        }
        let removes = files("removes");
        for r in &removes {
            if !t.files.iter().any(|f| f.path == r.path) {
                return Err(Error::Internal(format!(
                    "a run's changes to {name} cannot be committed: its file {} is no longer part of the table (written by another tool since?)",
                    r.path
                )));
            }
        }
        t.files.retain(|f| !removes.iter().any(|r| r.path == f.path));
        t.removes = removes.into_iter().map(|mut f| { f.pending = false; f }).collect();
        t.files.extend(files("adds"));
        match self.rt.block_on(table::commit(&t, Some((app.to_owned(), version)), info, 0, false))? {
            Committed::Version(_) => Ok(()),
            Committed::Conflict => {
                // Finished by another process meanwhile, or changed under it.
                let t = self.rt.block_on(table::load(name, &place))?;
                if self.rt.block_on(table::txn_version(&t, app))?.unwrap_or(0) >= version {
                    return Ok(());
                }
                Err(Error::Busy { message: format!("another writer committed to the Delta table {name} while a run's changes to it were being committed; run again to finish them") })
            }
        }
    }

    /// Reloads `name` from its log; forgets it when it has none (a table
    /// this run was to create).
    fn reload(&mut self, name: &TableName) -> Result<()> {
        if self.has_log(name)? {
            return self.load(name);
        }
        self.tables.remove(name);
        self.duck.execute(&Sql::raw(format!("DROP VIEW IF EXISTS {}", name.quoted())))?;
        // The folder a run made for it, when nothing is left in it.
        remove_empty_dirs(&self.table_dir(name));
        Ok(())
    }

    /// Commits the run's changes to `name`; `false` when another run's
    /// identical commit landed first (nothing to do, and nothing to record).
    fn commit_run(&mut self, name: &TableName, app: &str, entry: &serde_json::Map<String, serde_json::Value>, companions: Vec<serde_json::Value>) -> Result<bool> {
        let read = self.tables[name].version();
        let next = match self.tables[name].creation {
            Some(_) => 1,
            None => self.rt.block_on(table::txn_version(&self.tables[name], app))?.unwrap_or(0) + 1,
        };
        let run_key = entry.get("run_key").cloned().unwrap_or_default();
        let mut record = serde_json::json!({ "run_key": run_key, "app_id": app, "txn_version": next, "entry": entry });
        if !companions.is_empty() {
            record["companions"] = serde_json::Value::Array(companions);
        }
        let info = HashMap::from([("fixpoint".to_owned(), record)]);
        let committed = self.rt.block_on(table::commit(&self.tables[name], Some((app.to_owned(), next)), info, 0, false));
        match committed {
            Ok(Committed::Version(_)) => {
                if self.fault == Some(DeltaFault::LoseCommitAck) {
                    // The commit landed; this process forgets it as if the
                    // store's answer had been lost.
                    let t = self.tables.get_mut(name).expect("loaded");
                    t.files.retain(|f| !f.pending);
                    t.removes.clear();
                    t.creation = None;
                    return Err(Error::Transient { engine: "delta", context: format!("committing to {name}"), message: "injected: the commit's acknowledgement was lost".into() });
                }
                if self.fault == Some(DeltaFault::AbortAfterCommit) {
                    std::process::abort();
                }
                self.load(name)?;
                Ok(true)
            }
            Ok(Committed::Conflict) => {
                self.discard(name);
                self.reload(name)?;
                if !self.tables.contains_key(name) {
                    return Err(Error::Busy { message: format!("the Delta table {name} could not be created (another writer?); nothing of this run was committed; run it again") });
                }
                let same = |i: &serde_json::Value| {
                    let e = &i["entry"];
                    i["run_key"] == run_key && ["job", "run_date", "output_rows", "output_checksum"].iter().all(|k| e[*k] == entry[*k])
                };
                let infos = self.rt.block_on(table::fixpoint_infos(&self.tables[name].delta, read))?;
                if infos.first().is_some_and(same) {
                    eprintln!("fixpoint: another run committed the same output to {name} first; this run's commit is not needed");
                    return Ok(false);
                }
                Err(Error::Busy {
                    message: format!(
                        "another writer committed to the Delta table {name} while this run worked on it (version {read} then, {} now); nothing of this run was committed; run it again",
                        self.tables[name].version()
                    ),
                })
            }
            Err(e) => {
                // The commit may have landed with its answer lost: the
                // table's transaction version for the run's app id says.
                let t = self.tables.get_mut(name).expect("loaded");
                let written: Vec<String> = t.files.iter().filter(|f| f.pending).map(|f| f.path.clone()).collect();
                t.files.retain(|f| !f.pending);
                t.removes.clear();
                t.creation = None;
                if !self.has_log(name)? {
                    // A table this run was to create, and did not.
                    for rel in written {
                        self.remove_written(name, &rel);
                    }
                    self.reload(name)?;
                    return Err(e);
                }
                self.load(name)?;
                let infos = self.rt.block_on(table::fixpoint_infos(&self.tables[name].delta, read))?;
                let ours = |i: &serde_json::Value| i["run_key"] == run_key && i["app_id"] == app && i["txn_version"] == next && i["entry"]["finished_at"] == entry["finished_at"];
                if infos.iter().any(ours) {
                    return Ok(true);
                }
                for rel in written {
                    self.remove_written(name, &rel);
                }
                Err(e)
            }
        }
    }

    /// Appends `entry` to the ledger.
    fn append_ledger(&mut self, entry: &serde_json::Map<String, serde_json::Value>) -> Result<()> {
        let ledger = ledger_name();
        if !self.is_table(&ledger)? {
            fixpoint_core::run::ledger::ensure(self)?;
        }
        let columns = self.tables[&ledger].columns.clone();
        let mut sql = Sql::new();
        sql.push("CREATE OR REPLACE TEMPORARY TABLE \"__fixpoint_ledger_row\" AS SELECT ");
        for (i, c) in columns.iter().enumerate() {
            if i > 0 {
                sql.push(", ");
            }
            let v = match entry.get(&c.name) {
                None | Some(serde_json::Value::Null) => Value::Null,
                Some(serde_json::Value::String(s)) => Value::Text(s.clone()),
                Some(other) => Value::Text(other.to_string()),
            };
            sql.push("CAST(").param(v).push(&format!(" AS {}) AS {}", c.ty, quote_ident(&c.name)));
        }
        self.duck.execute(&sql)?;
        let info = HashMap::from([("fixpoint_ledger".to_owned(), serde_json::json!({ "run_key": entry.get("run_key") }))]);
        let result = self.append(&ledger, "\"__fixpoint_ledger_row\"", info);
        self.duck.execute(&Sql::raw("DROP TABLE IF EXISTS \"__fixpoint_ledger_row\""))?;
        result.map(|_| ())
    }

    /// A ledger row lost after its data commit (a crash between the two)
    /// is written now: each table's newest commit names its run's entry.
    fn repair_ledger(&mut self) -> Result<()> {
        let ledger = ledger_name();
        let mut names: Vec<TableName> = self.tables.keys().filter(|n| **n != ledger).cloned().collect();
        names.sort_by_key(|n| n.to_string());
        for name in names {
            let version = self.tables[&name].version();
            if self.checked.get(&name) == Some(&version) {
                continue;
            }
            let infos = self.rt.block_on(table::fixpoint_infos(&self.tables[&name].delta, version - 1))?;
            // The run's changes to its other tables, finished first (a
            // crash between its commits).
            for c in infos.first().and_then(|i| i.get("companions")).and_then(|c| c.as_array()).cloned().unwrap_or_default() {
                let companion = companion_table(&c)?;
                let app = c["app_id"].as_str().unwrap_or_default().to_owned();
                let v = c["txn_version"].as_i64().unwrap_or(i64::MAX);
                let run_key = infos.first().and_then(|i| i.get("run_key")).cloned().unwrap_or_default();
                let info = HashMap::from([("fixpoint_companion".to_owned(), serde_json::json!({ "run_key": run_key, "app_id": app, "txn_version": v, "repaired": true }))]);
                let done = self.commit_companion(&companion, &app, v, &c, info);
                self.reload(&companion)?;
                done?;
            }
            self.checked.insert(name.clone(), version);
            let Some(entry) = infos.first().and_then(|i| i.get("entry")).and_then(|e| e.as_object()).cloned() else { continue };
            let s = |k: &str| Value::Text(entry.get(k).and_then(|v| v.as_str()).unwrap_or_default().to_owned());
            if self.is_table(&ledger)? {
                let mut sql = Sql::new();
                sql.push("SELECT count(*) AS \"n\" FROM ").push(&ledger.quoted()).push(" WHERE run_key = ").param(s("run_key"));
                sql.push(" AND job = ").param(s("job")).push(" AND CAST(run_date AS VARCHAR) = ").param(s("run_date"));
                sql.push(" AND CAST(finished_at AS VARCHAR) = CAST(CAST(").param(s("finished_at")).push(" AS TIMESTAMP) AS VARCHAR)");
                if fixpoint_core::engine::query_count(&mut self.duck, &sql, "n", "the ledger's rows of a commit")? > 0 {
                    continue;
                }
            }
            eprintln!("fixpoint: the ledger had no row for the last commit to {name} (run key {}); writing it now", entry.get("run_key").and_then(|v| v.as_str()).unwrap_or("?"));
            self.append_ledger(&entry)?;
        }
        Ok(())
    }

    /// A warehouse table named by `name`, when it names one.
    fn warehouse_name(name: &ObjectName) -> Option<TableName> {
        let parts: Vec<String> = name
            .0
            .iter()
            .filter_map(|p| p.as_ident())
            .map(|i| if i.quote_style.is_some() { i.value.clone() } else { i.value.to_lowercase() })
            .collect();
        // A name is a folder of the warehouse: nothing that leaves it.
        let folder = |p: &String| !p.is_empty() && p != "." && p != ".." && !p.contains(['/', '\\', '\0']);
        match parts.as_slice() {
            [s, t] if !s.eq_ignore_ascii_case("temp") && !s.eq_ignore_ascii_case("main") && folder(s) && folder(t) => Some(TableName { schema: s.clone(), table: t.clone() }),
            _ => None,
        }
    }

    /// Runs a statement that writes a warehouse table as Delta commits;
    /// `None` for every other statement (DuckDB runs it).
    fn intercept(&mut self, sql: &Sql) -> Result<Option<u64>> {
        // `CREATE TABLE … PARTITIONED BY (col)`: a Delta table partitioned
        // by that column (DuckDB's grammar has no such clause).
        let (text, partition) = split_partitioned_by(&sql.text);
        let Ok(mut parsed) = sqlparser::parser::Parser::parse_sql(&sqlparser::dialect::DuckDbDialect {}, text) else { return Ok(None) };
        if parsed.len() != 1 {
            return Ok(None);
        }
        match parsed.remove(0) {
            Statement::CreateTable(ct) if !ct.temporary => {
                let Some(name) = Self::warehouse_name(&ct.name) else { return Ok(None) };
                if self.is_table(&name)? {
                    if ct.if_not_exists && !ct.or_replace {
                        return Ok(Some(0));
                    }
                    return Err(Error::Schema { message: format!("the Delta table {name} exists already"), hint: Some(format!("drop {name} first, or use CREATE TABLE IF NOT EXISTS")) });
                }
                match ct.query {
                    None => {
                        let columns: Vec<Column> = ct.columns.iter().map(|c| Column { name: c.name.value.clone(), ty: c.data_type.to_string() }).collect();
                        if let Some(p) = &partition {
                            if !columns.iter().any(|c| &c.name == p) {
                                return Err(Error::Schema { message: format!("{name} is to be partitioned by {p}, which is not one of its columns"), hint: None });
                            }
                        }
                        self.create_table_now(&name, &columns, partition.as_deref())?;
                        Ok(Some(0))
                    }
                    Some(query) => {
                        let mut staged = Sql::new();
                        staged.push(&format!("CREATE OR REPLACE TEMPORARY TABLE \"__fixpoint_ctas\" AS {query}"));
                        staged.params = sql.params.clone();
                        self.duck.execute(&staged)?;
                        let columns = self.duck.describe(&Sql::raw("SELECT * FROM \"__fixpoint_ctas\""))?;
                        self.create_table_now(&name, &columns, None)?;
                        let n = self.append(&name, "\"__fixpoint_ctas\"", HashMap::new());
                        self.duck.execute(&Sql::raw("DROP TABLE IF EXISTS \"__fixpoint_ctas\""))?;
                        n.map(Some)
                    }
                }
            }
            Statement::Insert(ins) => {
                let sqlparser::ast::TableObject::TableName(object) = &ins.table else { return Ok(None) };
                let Some(name) = Self::warehouse_name(object) else { return Ok(None) };
                if !self.is_table(&name)? {
                    return Ok(None);
                }
                let Some(source) = &ins.source else { return Ok(None) };
                let mut staged = Sql::new();
                staged.push(&format!("CREATE OR REPLACE TEMPORARY TABLE \"__fixpoint_insert\" AS {source}"));
                staged.params = sql.params.clone();
                self.duck.execute(&staged)?;
                let staged_cols = self.duck.describe(&Sql::raw("SELECT * FROM \"__fixpoint_insert\""))?;
                let targets: Vec<String> = if ins.columns.is_empty() {
                    self.tables[&name].columns.iter().map(|c| c.name.clone()).collect()
                } else {
                    ins.columns.iter().map(|c| c.0.last().and_then(|p| p.as_ident()).map(|i| i.value.clone()).unwrap_or_default()).collect()
                };
                if targets.len() != staged_cols.len() {
                    return Err(Error::Sql { what: "INSERT".into(), message: format!("INSERT INTO {name} names {} columns and gives {} values", targets.len(), staged_cols.len()), hint: None });
                }
                let renamed: Vec<String> = staged_cols.iter().zip(&targets).map(|(s, t)| format!("{} AS {}", quote_ident(&s.name), quote_ident(t))).collect();
                let relation = format!("(SELECT {} FROM \"__fixpoint_insert\")", renamed.join(", "));
                let n = self.append(&name, &relation, HashMap::new());
                self.duck.execute(&Sql::raw("DROP TABLE IF EXISTS \"__fixpoint_insert\""))?;
                n.map(Some)
            }
            Statement::Drop { object_type: ObjectType::Table, if_exists, names, .. } => {
                let Some(name) = names.first().and_then(Self::warehouse_name) else { return Ok(None) };
                if !self.is_table(&name)? {
                    if if_exists {
                        return Ok(Some(0));
                    }
                    return Err(Error::Schema { message: format!("the Delta table {name} does not exist"), hint: None });
                }
                self.tables.remove(&name);
                self.duck.execute(&Sql::raw(format!("DROP VIEW IF EXISTS {}", name.quoted())))?;
                if let Some(s3) = &self.s3 {
                    self.rt.block_on(s3.delete_all(&Self::rel(&name)))?;
                }
                let dir = self.table_dir(&name);
                if dir.exists() || self.s3.is_none() {
                    std::fs::remove_dir_all(&dir).map_err(|e| Error::Io { path: dir, source: e })?;
                }
                Ok(Some(0))
            }
            Statement::AlterTable(at) => {
                let Some(name) = Self::warehouse_name(&at.name) else { return Ok(None) };
                if !self.is_table(&name)? {
                    return Ok(None);
                }
                match at.operations.as_slice() {
                    [AlterTableOperation::RenameTable { table_name }] => {
                        let new_name = match table_name {
                            sqlparser::ast::RenameTableNameKind::As(n) | sqlparser::ast::RenameTableNameKind::To(n) => n,
                        };
                        let last = new_name.0.last().and_then(|p| p.as_ident()).map(|i| i.value.clone()).unwrap_or_default();
                        let to = TableName { schema: name.schema.clone(), table: last };
                        if self.is_table(&to)? {
                            return Err(Error::Schema { message: format!("cannot rename {name} to {to}: {to} exists"), hint: None });
                        }
                        self.tables.remove(&name);
                        self.duck.execute(&Sql::raw(format!("DROP VIEW IF EXISTS {}", name.quoted())))?;
                        let (from_dir, to_dir) = (self.table_dir(&name), self.table_dir(&to));
                        if let Some(s3) = &self.s3 {
                            self.rt.block_on(s3.move_all(&Self::rel(&name), &Self::rel(&to)))?;
                            let _ = std::fs::remove_dir_all(&from_dir);
                        } else {
                            std::fs::rename(&from_dir, &to_dir).map_err(|e| Error::Io { path: from_dir, source: e })?;
                        }
                        self.load(&to)?;
                        Ok(Some(0))
                    }
                    [AlterTableOperation::AddColumn { if_not_exists, column_def, .. }] => {
                        let column = Column {
                            name: if column_def.name.quote_style.is_some() { column_def.name.value.clone() } else { column_def.name.value.to_lowercase() },
                            ty: column_def.data_type.to_string(),
                        };
                        if self.tables[&name].columns.iter().any(|c| c.name == column.name) {
                            if *if_not_exists {
                                return Ok(Some(0));
                            }
                            return Err(Error::Schema { message: format!("the Delta table {name} has a column {} already", column.name), hint: Some("use ADD COLUMN IF NOT EXISTS".into()) });
                        }
                        Engine::add_column(self, &name, &column)?;
                        Ok(Some(0))
                    }
                    _ => Err(Error::Unsupported { engine: "delta", capability: format!("this ALTER TABLE on the Delta table {name} (fixpoint renames Delta tables and adds columns)") }),
                }
            }
            Statement::Update(up) => {
                let sqlparser::ast::TableFactor::Table { name: object, alias: None, .. } = &up.table.relation else { return Ok(None) };
                let Some(name) = Self::warehouse_name(object) else { return Ok(None) };
                if !self.is_table(&name)? {
                    return Ok(None);
                }
                if up.from.is_some() || !up.table.joins.is_empty() || up.returning.is_some() || up.limit.is_some() {
                    return Err(Error::Unsupported { engine: "delta", capability: format!("this UPDATE of the Delta table {name} (fixpoint rewrites a table for an UPDATE of its own columns, without FROM, RETURNING or LIMIT)") });
                }
                let cond = up.selection.as_ref().map_or_else(|| "true".to_owned(), |c| format!("coalesce(({c}), false)"));
                let mut set = HashMap::new();
                for a in &up.assignments {
                    let sqlparser::ast::AssignmentTarget::ColumnName(col) = &a.target else {
                        return Err(Error::Unsupported { engine: "delta", capability: "an UPDATE of a tuple of columns".into() });
                    };
                    let col = col.0.last().and_then(|p| p.as_ident()).map(|i| if i.quote_style.is_some() { i.value.clone() } else { i.value.to_lowercase() }).unwrap_or_default();
                    set.insert(col, a.value.to_string());
                }
                let columns = self.tables[&name].columns.clone();
                let list: Vec<String> = columns
                    .iter()
                    .map(|c| match set.get(&c.name) {
                        Some(e) => format!("CAST(CASE WHEN {cond} THEN {e} ELSE {} END AS {}) AS {}", quote_ident(&c.name), c.ty, quote_ident(&c.name)),
                        None => quote_ident(&c.name),
                    })
                    .collect();
                // Counted with the new values computed too: the statement's
                // parameters are numbered over both.
                let values: Vec<String> = set.values().map(|e| format!("({e})")).collect();
                let mut count = Sql::new();
                count.push(&format!("SELECT count(*) AS \"n\" FROM (SELECT {cond} AS \"__fixpoint_hit\", {} FROM {}) AS u WHERE \"__fixpoint_hit\"", values.join(", "), name.quoted()));
                count.params = sql.params.clone();
                let changed = fixpoint_core::engine::query_count(&mut self.duck, &count, "n", "the rows to update")?;
                let mut select = Sql::new();
                select.push(&format!("SELECT {} FROM {}", list.join(", "), name.quoted()));
                select.params = sql.params.clone();
                self.rewrite_table(&name, &select, "UPDATE")?;
                Ok(Some(changed))
            }
            Statement::Delete(del) => {
                let from = match &del.from {
                    sqlparser::ast::FromTable::WithFromKeyword(t) | sqlparser::ast::FromTable::WithoutKeyword(t) => t,
                };
                let [only] = from.as_slice() else { return Ok(None) };
                let sqlparser::ast::TableFactor::Table { name: object, alias: None, .. } = &only.relation else { return Ok(None) };
                let Some(name) = Self::warehouse_name(object) else { return Ok(None) };
                if !self.is_table(&name)? {
                    return Ok(None);
                }
                if del.using.is_some() || del.returning.is_some() || del.limit.is_some() || !only.joins.is_empty() {
                    return Err(Error::Unsupported { engine: "delta", capability: format!("this DELETE from the Delta table {name} (fixpoint rewrites a table for a DELETE with a WHERE on its own columns)") });
                }
                let cond = del.selection.as_ref().map_or_else(|| "true".to_owned(), |c| format!("coalesce(({c}), false)"));
                let mut count = Sql::new();
                count.push(&format!("SELECT count(*) AS \"n\" FROM {} WHERE {cond}", name.quoted()));
                count.params = sql.params.clone();
                let deleted = fixpoint_core::engine::query_count(&mut self.duck, &count, "n", "the rows to delete")?;
                let mut select = Sql::new();
                select.push(&format!("SELECT * FROM {} WHERE NOT {cond}", name.quoted()));
                select.params = sql.params.clone();
                self.rewrite_table(&name, &select, "DELETE")?;
                Ok(Some(deleted))
            }
            Statement::Drop { object_type: ObjectType::Schema, if_exists, names, cascade, .. } => {
                let [schema] = names.as_slice() else { return Ok(None) };
                let Some(ident) = schema.0.last().and_then(|p| p.as_ident()) else { return Ok(None) };
                let schema = if ident.quote_style.is_some() { ident.value.clone() } else { ident.value.to_lowercase() };
                let dir = self.root.join(&schema);
                if schema.is_empty() || schema.contains('/') || schema.starts_with('.') {
                    return Ok(None);
                }
                let exists = match &self.s3 {
                    Some(s3) => self.rt.block_on(s3.holds(&schema))?,
                    None => dir.is_dir(),
                };
                if !exists {
                    return Ok(None);
                }
                let held: Vec<TableName> = self.tables.keys().filter(|t| t.schema == schema).cloned().collect();
                if !held.is_empty() && !cascade {
                    return Err(Error::Schema { message: format!("the schema {schema} holds Delta tables"), hint: Some("drop its tables first, or DROP SCHEMA … CASCADE".into()) });
                }
                for t in held {
                    self.tables.remove(&t);
                }
                self.duck.execute(&Sql::raw(format!("DROP SCHEMA {}{} CASCADE", if if_exists { "IF EXISTS " } else { "" }, quote_ident(&schema))))?;
                if let Some(s3) = &self.s3 {
                    self.rt.block_on(s3.delete_all(&schema))?;
                    let _ = std::fs::remove_dir_all(&dir);
                } else {
                    std::fs::remove_dir_all(&dir).map_err(|e| Error::Io { path: dir, source: e })?;
                }
                Ok(Some(0))
            }
            Statement::Truncate(_) | Statement::Merge(_) => Err(Error::Unsupported {
                engine: "delta",
                capability: "TRUNCATE or MERGE statements on a warehouse table (use DELETE, or a fixpoint job)".into(),
            }),
            _ => Ok(None),
        }
    }

    /// Replaces every row of `name` with those of `select` (which may read
    /// it), in one commit of its own: a plain SQL UPDATE or DELETE.
    fn rewrite_table(&mut self, name: &TableName, select: &Sql, what: &str) -> Result<()> {
        if self.tables[name].has_pending() {
            return Err(Error::Internal(format!("a {what} of {name} while this run's changes to it are not committed")));
        }
        let mut staged = Sql::new();
        staged.push(&format!("CREATE OR REPLACE TEMPORARY TABLE \"__fixpoint_rewrite\" AS {}", select.text));
        staged.params = select.params.clone();
        self.duck.execute(&staged)?;
        let result = (|| {
            let files = self.write_files(name, "\"__fixpoint_rewrite\"")?;
            self.replace_files(name, |_| true, files)?;
            let info = HashMap::from([("fixpoint_sql".to_owned(), serde_json::json!(what))]);
            match self.rt.block_on(table::commit(&self.tables[name], None, info, 0, false))? {
                Committed::Version(_) => Ok(()),
                Committed::Conflict => Err(Error::Busy { message: format!("another writer committed to the Delta table {name} during this {what}; nothing was changed; run it again") }),
            }
        })();
        if result.is_err() {
            self.discard(name);
        }
        self.duck.execute(&Sql::raw("DROP TABLE IF EXISTS \"__fixpoint_rewrite\""))?;
        self.reload(name)?;
        result
    }

    /// Creates `name` now (a commit of its own) and makes it readable.
    fn create_table_now(&mut self, name: &TableName, columns: &[Column], partition: Option<&str>) -> Result<()> {
        let dir = self.table_dir(name);
        let place = self.place(name, &dir)?;
        let t = self.rt.block_on(table::create(name, &place, columns, partition))?;
        self.tables.insert(name.clone(), t);
        self.register(name)
    }

    /// The text of a partition value as the log stores it.
    fn partition_text(&mut self, value: &Value, ty: &str) -> Result<Option<String>> {
        if matches!(value, Value::Null) {
            return Ok(None);
        }
        let mut sql = Sql::new();
        sql.push("SELECT CAST(CAST(").param(value.clone()).push(&format!(" AS {ty}) AS VARCHAR) AS \"v\""));
        let rows = self.duck.query(&sql)?;
        Ok(rows.rows.first().and_then(|r| r.first()).and_then(|v| v.as_str()).map(str::to_owned))
    }
}

/// The table a commit's record of a run's other changes names.
fn companion_table(record: &serde_json::Value) -> Result<TableName> {
    match (record["schema"].as_str(), record["name"].as_str()) {
        (Some(schema), Some(table)) => Ok(TableName { schema: schema.to_owned(), table: table.to_owned() }),
        _ => Err(Error::Internal(format!("a Delta commit's record of a run's changes names no table: {record}"))),
    }
}

/// A `CREATE TABLE` statement without its trailing `PARTITIONED BY (col)`,
/// and the column; other statements as they are.
fn split_partitioned_by(text: &str) -> (&str, Option<String>) {
    let trimmed = text.trim_end();
    let upper = trimmed.to_ascii_uppercase();
    if !upper.trim_start().starts_with("CREATE TABLE") || !trimmed.ends_with(')') {
        return (text, None);
    }
    let Some(at) = upper.rfind(" PARTITIONED BY (") else { return (text, None) };
    let inner = trimmed[at + " PARTITIONED BY (".len()..trimmed.len() - 1].trim();
    let column = inner.trim_matches('"');
    if column.is_empty() || !column.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
        return (text, None);
    }
    (&trimmed[..at], Some(column.to_owned()))
}

/// Removes `dir` and the folders below it that hold no file.
fn remove_empty_dirs(dir: &Path) {
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            if e.path().is_dir() {
                remove_empty_dirs(&e.path());
            }
        }
    }
    let _ = std::fs::remove_dir(dir);
}

/// The sub-folders of `dir`.
fn read_dir(dir: &Path) -> Result<Vec<PathBuf>> {
    let entries = std::fs::read_dir(dir).map_err(|e| Error::Io { path: dir.to_owned(), source: e })?;
    let mut out: Vec<PathBuf> = entries.filter_map(|e| e.ok()).map(|e| e.path()).filter(|p| p.is_dir()).collect();
    out.sort();
    Ok(out)
}

/// A SQL string literal (paths and values read from a table's log, in
/// statements that take no parameters).
fn literal(s: &str) -> String {
    format!("'{}'", s.replace('\'', "''"))
}

/// A folder name for a partition column or value: itself when plain,
/// else a hash (Delta readers take partition values from the log, never
/// from paths).
fn safe_segment(s: &str) -> String {
    if !s.is_empty() && s.len() <= 64 && s.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.')) && !s.starts_with('.') {
        return s.to_owned();
    }
    let mut h: u64 = 0xcbf29ce484222325;
    for b in s.bytes() {
        h = (h ^ b as u64).wrapping_mul(0x100000001b3);
    }
    format!("_x{h:016x}")
}

impl Engine for Delta {
    fn name(&self) -> &'static str {
        "delta"
    }

    fn version(&mut self) -> Result<String> {
        // The fingerprints are DuckDB's, over the tables' Parquet files.
        Ok(format!("delta on {}", self.duck.version()?))
    }

    fn execute(&mut self, sql: &Sql) -> Result<u64> {
        if let Some(n) = self.intercept(sql)? {
            return Ok(n);
        }
        self.duck.execute(sql)
    }

    fn query(&mut self, sql: &Sql) -> Result<Rows> {
        self.duck.query(sql)
    }

    fn describe(&mut self, query: &Sql) -> Result<Vec<Column>> {
        self.duck.describe(query)
    }

    fn table_columns(&mut self, table: &TableName) -> Result<Option<Vec<Column>>> {
        if self.is_table(table)? {
            return Ok(Some(self.tables[table].columns.clone()));
        }
        if table.schema == fixpoint_core::run::ledger::SCHEMA {
            return Ok(None);
        }
        self.duck.table_columns(table)
    }

    fn relation_kind(&mut self, table: &TableName) -> Result<Option<String>> {
        if self.is_table(table)? {
            return Ok(None);
        }
        self.duck.relation_kind(table)
    }

    fn add_column(&mut self, table: &TableName, column: &Column) -> Result<()> {
        if !self.is_table(table)? {
            return self.duck.add_column(table, column);
        }
        if self.tables[table].columns.iter().any(|c| c.name == column.name) {
            return Ok(());
        }
        if let Some(t) = self.tables.get_mut(table).filter(|t| t.creation.is_some()) {
            // Created by this run: the column is part of its first commit.
            let ty = table::delta_type(table, column)?;
            t.creation.as_mut().expect("checked").fields.push(deltalake_core::kernel::StructField::new(column.name.clone(), ty, true));
            t.columns.push(column.clone());
            return self.register(table);
        }
        if self.tables[table].has_pending() {
            return Err(Error::Internal(format!("a column added to {table} while this run's changes to it are not committed")));
        }
        let t = self.tables.remove(table).expect("loaded");
        let t = self.rt.block_on(table::add_column(t, column));
        match t {
            Ok(t) => {
                self.tables.insert(table.clone(), t);
                self.register(table)
            }
            Err(e) => {
                self.load(table)?;
                Err(e)
            }
        }
    }

    fn dialect(&self) -> &dyn Dialect {
        self
    }

    fn file_input(&mut self) -> Option<&mut dyn FileInput> {
        self.duck.file_input()
    }

    fn leases(&mut self) -> Option<&mut dyn Leases> {
        Some(self)
    }

    fn accelerator(&mut self) -> Option<&mut dyn Accelerator> {
        Some(self)
    }
}

/// DuckDB's SQL (the engine computes in DuckDB), but a table's rows have
/// no row id: they live in the table's files.
impl Dialect for Delta {
    fn native_row_hash(&self, alias: &str, columns: &[Column]) -> Option<String> {
        self.duck.native_row_hash(alias, columns)
    }

    fn portable_value(&self, expr: &str, column: &Column) -> (String, &'static str) {
        self.duck.portable_value(expr, column)
    }

    fn portable_row_hash(&self, text_expr: &str) -> String {
        self.duck.portable_row_hash(text_expr)
    }

    fn portable_row_hash_direct(&self, alias: &str, columns: &[Column]) -> Option<String> {
        self.duck.portable_row_hash_direct(alias, columns)
    }

    fn same_native_hash(&self, from: &str, to: &str) -> bool {
        self.duck.same_native_hash(from, to)
    }

    fn text_type(&self) -> &'static str {
        Dialect::text_type(&self.duck)
    }

    fn read_sum(&self, v: &Value) -> Result<i128> {
        self.duck.read_sum(v)
    }

    fn row_id(&self) -> Option<(&'static str, &'static str, bool)> {
        None
    }

    fn fingerprint_before_writing(&self) -> bool {
        self.duck.fingerprint_before_writing()
    }

    fn plan_key_lookups(&self) -> Option<&'static str> {
        self.duck.plan_key_lookups()
    }
}

impl Leases for Delta {
    /// No lease: the run's commit is conditional on the snapshot it read
    /// (Delta's optimistic concurrency), so of two runs of one scope the
    /// second to commit finds the first's commit and stops.
    /// The run starts from the newest snapshot of every table.
    fn acquire_lease(&mut self, _scope: &str, _wait: bool) -> Result<std::result::Result<(), String>> {
        self.in_run = false;
        self.refresh()?;
        // A commit whose answer was lost (this process's earlier attempt, or
        // another's) has its ledger row written before the run looks.
        self.repair_ledger()?;
        self.in_run = true;
        Ok(Ok(()))
    }

    /// A run that ends without its commit (a failure, a refusal) leaves
    /// nothing: its files are removed and the tables read as before.
    fn release_lease(&mut self, _scope: &str) -> Result<()> {
        self.in_run = false;
        let pending: Vec<TableName> = self.tables.iter().filter(|(_, t)| t.has_pending()).map(|(n, _)| n.clone()).collect();
        for name in pending {
            self.discard(&name);
            self.reload(&name)?;
        }
        Ok(())
    }

    /// The table is created by the run's commit, with its first rows (a
    /// run that fails before leaves no table).
    fn create_table(&mut self, table: &TableName, columns: &[Column], partition: Option<&str>) -> Result<()> {
        if self.is_table(table)? {
            return Err(Error::Schema { message: format!("the Delta table {table} exists already"), hint: None });
        }
        let dir = self.table_dir(table);
        let place = self.place(table, &dir)?;
        let t = table::pending(table, &place, columns, partition)?;
        self.tables.insert(table.clone(), t);
        self.register(table)
    }

    fn partition_columns(&mut self, table: &TableName) -> Result<Vec<String>> {
        if !self.is_table(table)? {
            return Ok(Vec::new());
        }
        Ok(self.tables[table].partitions.clone())
    }

    fn overwrite_partitions(&mut self, table: &TableName, columns: &[String], select: &Sql) -> Result<()> {
        if !self.is_table(table)? {
            return Err(Error::Internal(format!("overwriting partitions of {table}, which is not a Delta table of the warehouse")));
        }
        let result = (|| {
            let renamed = self.stage_output(select, columns)?;
            let relation = format!("(SELECT {renamed} FROM \"__fixpoint_out\")");
            let files = self.write_files(table, &relation)?;
            let partitions = self.tables[table].partitions.clone();
            let touched: Vec<HashMap<String, Option<String>>> = files.iter().map(|f| f.partition_values.clone()).collect();
            // Every partition the rows fall in is replaced; unpartitioned,
            // the whole table.
            self.replace_files(table, |f| partitions.is_empty() || touched.iter().any(|t| partitions.iter().all(|p| t.get(p) == f.partition_values.get(p))), files)
        })();
        self.duck.execute(&Sql::raw("DROP TABLE IF EXISTS \"__fixpoint_out\""))?;
        result
    }

    /// One commit: the files holding a dropped row removed, their other
    /// rows and the new ones added (the other files are not touched).
    fn replaces_rows(&self) -> bool {
        true
    }

    /// The run's changes are committed with its ledger row (see `publish`).
    fn publishes_with_ledger_row(&self) -> bool {
        true
    }

    fn replace_rows(&mut self, table: &TableName, columns: &[String], dropped: &Sql, select: &Sql) -> Result<()> {
        if !self.is_table(table)? {
            return Err(Error::Internal(format!("replacing rows of {table}, which is not a Delta table of the warehouse")));
        }
        let result = (|| {
            let renamed = self.stage_output(select, columns)?;
            let rows = self.view_select(table, true)?;
            // The files holding a dropped row.
            let mut hit = Sql::new();
            hit.push(&format!("CREATE OR REPLACE TEMPORARY TABLE \"__fixpoint_hit\" AS SELECT DISTINCT t.\"__fixpoint_file\" AS \"f\" FROM ({rows}) AS t WHERE ({})", dropped.text));
            hit.params = dropped.params.clone();
            self.duck.execute(&hit)?;
            let hit_files: std::collections::HashSet<String> =
                self.duck.query(&Sql::raw("SELECT \"f\" FROM \"__fixpoint_hit\""))?.rows.into_iter().filter_map(|r| r.first().and_then(|v| v.as_str()).map(str::to_owned)).collect();
            // Their other rows, written again with the new ones.
            let cols: Vec<String> = self.tables[table].columns.iter().map(|c| format!("t.{}", quote_ident(&c.name))).collect();
            let mut kept = Sql::new();
            kept.push(&format!(
                "CREATE OR REPLACE TEMPORARY TABLE \"__fixpoint_kept\" AS SELECT {} FROM ({rows}) AS t WHERE t.\"__fixpoint_file\" IN (SELECT \"f\" FROM \"__fixpoint_hit\") AND ({}) IS NOT TRUE",
                cols.join(", "),
                dropped.text
            ));
            kept.params = dropped.params.clone();
            self.duck.execute(&kept)?;
            let relation = format!("(SELECT * FROM \"__fixpoint_kept\" UNION ALL BY NAME SELECT {renamed} FROM \"__fixpoint_out\")");
            let files = self.write_files(table, &relation)?;
            let dir = self.tables[table].dir.clone();
            self.replace_files(table, |f| hit_files.contains(dir.join(&f.path).to_string_lossy().as_ref()), files)
        })();
        for t in ["__fixpoint_out", "__fixpoint_hit", "__fixpoint_kept"] {
            self.duck.execute(&Sql::raw(format!("DROP TABLE IF EXISTS \"{t}\"")))?;
        }
        result
    }

    fn drop_partition_value(&mut self, table: &TableName, column: &str, value: &Value, ty: &str) -> Result<()> {
        if !self.is_table(table)? {
            return Ok(());
        }
        let text = self.partition_text(value, ty)?;
        let column = column.to_owned();
        self.replace_files(table, |f| f.partition_values.get(&column).cloned().flatten() == text, Vec::new())
    }
}

impl Accelerator for Delta {
    /// The ledger row is the run's last write: the run's changes are
    /// committed then, with the entry as their commit info, and the row
    /// appended after.
    fn append_row(&mut self, table: &TableName, columns: &[&str], values: &[Value]) -> Option<Result<()>> {
        if *table != ledger_name() {
            return None;
        }
        let mut entry = serde_json::Map::new();
        for (c, v) in columns.iter().zip(values) {
            let json = match v {
                Value::Null => serde_json::Value::Null,
                Value::Bool(b) => serde_json::Value::Bool(*b),
                Value::Int(i) => serde_json::json!(i),
                Value::HugeInt(i) => serde_json::Value::String(i.to_string()),
                Value::Float(f) => serde_json::json!(f),
                Value::Text(s) => serde_json::Value::String(s.clone()),
                Value::Date(d) => serde_json::Value::String(d.format("%Y-%m-%d").to_string()),
                Value::Timestamp(t) => serde_json::Value::String(t.format("%Y-%m-%d %H:%M:%S%.6f").to_string()),
            };
            entry.insert((*c).to_owned(), json);
        }
        Some(self.publish(entry))
    }
}
