//! The embedded DuckDB engine.
//!
//! One connection per run. DuckDB allows one writing process per database
//! file: opening a file another process holds waits, bounded, and then says
//! who holds it.
#![deny(missing_docs)]

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use duckdb::types::{TimeUnit, Value as DValue};
use fixpoint_core::engine::{Accelerator, Column, Dialect, Engine, FileInput, Rows};
use fixpoint_core::job::files::{FileFormat, InputFiles};
use fixpoint_core::job::ident::{quote_ident, TableName};
use fixpoint_core::job::sql::{Sql, Value};
use fixpoint_core::{DbFailure, Error, Result};

mod accel;
pub mod portable;
pub mod tap;

/// The temporary table holding a file source's paths, in order.
const FILES_TABLE: &str = "temp.main.\"__fixpoint_files\"";
/// The session variable the file readers take their list of paths from.
const FILES_VARIABLE: &str = "fixpoint_input_files";
/// The session variable holding one file's path, for a check of that file alone.
const ONE_FILE_VARIABLE: &str = "fixpoint_input_file";
/// The temporary table of the hive-style `key=value` folders in the files' paths.
const HIVE_TABLE: &str = "temp.main.\"__fixpoint_hive\"";
/// The column the checks of the files read each row's file from.
const FILE_COLUMN: &str = "__fixpoint_file";

/// A DuckDB database, embedded in this process.
pub struct DuckDb {
    conn: duckdb::Connection,
    path: Option<PathBuf>,
    version: Option<String>,
    in_transaction: bool,
    /// Whether the portable row hash functions are registered.
    portable_registered: bool,
    /// Whether portable fingerprints use them.
    portable_functions: bool,
    /// Whether the run tap (guards and fingerprint during the insert) is registered.
    tap_registered: bool,
    /// What this connection's taps saw, by token.
    taps: tap::Taps,
    /// Whether an upsert-only merge may be one statement.
    one_statement_merge: bool,
    /// Whether `replace_partition`'s day insert may be tapped (tests turn
    /// it off to run the plan's fallback: guards scanned after the delete).
    tapped_day_insert: bool,
    /// The ties of the one-statement merge's batch, still being counted
    /// ([`Accelerator::confirm`] waits for them).
    pending_ties: Option<Box<dyn FnOnce() -> u64 + Send>>,
    /// The two-statement merge left its batch table, dropped in
    /// [`Accelerator::confirm`] (the one-statement merge makes none).
    batch_made: bool,
    /// What `DESCRIBE` said of each table (columns, and the defaults the
    /// lint of generated keys reads), by quoted name: a run asks for the
    /// target's columns three or four times (~0.7 ms each on a fresh
    /// connection). Forgotten on any statement that is not a read, a DML
    /// statement or a transaction boundary (`forget_tables_if`), and
    /// whenever the raw connection is handed out.
    described: std::cell::RefCell<std::collections::HashMap<String, Described>>,
    /// The thread that warms DuckDB's keyword table ([`warm_keywords`]),
    /// joined before a commit.
    warming: Option<std::thread::JoinHandle<()>>,
}

/// Builds DuckDB's keyword table on another thread, on a connection of its
/// own. DuckDB builds it (a parse of its SQL grammar, ~12 M instructions,
/// ~2 ms) the first time a process names an expression or quotes a name in
/// an error: in a fresh `fixpoint run`, inside the first statement that
/// calls a function or the first lookup of a missing table, on the run's
/// critical path. Here it is built while the run describes its tables on
/// the other core. (A static of DuckDB's, built once: a thread that needs
/// it meanwhile waits for it, as before.)
fn warm_keywords(conn: &duckdb::Connection) -> Option<std::thread::JoinHandle<()>> {
    let other = conn.try_clone().ok()?;
    std::thread::Builder::new()
        .name("fixpoint-warm".into())
        .spawn(move || {
            // Naming `abs(1)` builds the table; nothing is read or run.
            let _ = other.prepare("SELECT abs(1)");
        })
        .ok()
}

impl Drop for DuckDb {
    fn drop(&mut self) {
        // Its connection keeps the database file open until it ends.
        if let Some(w) = self.warming.take() {
            let _ = w.join();
        }
    }
}

/// A table as `DESCRIBE` gave it.
#[derive(Clone)]
struct Described {
    columns: Vec<Column>,
    /// (column, default expression) of the columns that have one.
    defaults: Vec<(String, String)>,
}

fn db_err(context: impl Into<String>) -> impl FnOnce(duckdb::Error) -> Error {
    let context = context.into();
    move |e| database_error(context, e)
}

/// A DuckDB error as fixpoint's, its kind read from the exception type
/// DuckDB names at the start of every message it raises (`Binder Error:
/// …`): the one place that reads DuckDB's wording.
pub fn database_error(context: String, e: duckdb::Error) -> Error {
    let message = e.to_string();
    Error::Database { engine: "duckdb", context, failure: failure_of(&message), message }
}

/// The kind of a DuckDB error message ([`database_error`]).
pub fn failure_of(message: &str) -> DbFailure {
    // (Wrapped, the type follows the wrapper's own `…: `.)
    let kind = message.split_once(" Error:").and_then(|(before, _)| before.rsplit(": ").next()).unwrap_or("").trim();
    match kind {
        "Parser" | "Binder" | "Catalog" => DbFailure::Binding,
        // (An "Invalid Input" error is most often the data's: a file
        // that does not parse, a value out of range.)
        "Conversion" => DbFailure::Statement,
        _ => DbFailure::Other,
    }
}

/// A file that can never be opened as it is: the user's to fix (exit 2),
/// unlike a lock, which passes.
fn open_problem(msg: &str) -> Option<&'static str> {
    let m = msg.to_ascii_lowercase();
    if m.contains("permission denied") || m.contains("read-only file system") {
        Some("permission denied")
    } else if m.contains("not a valid duckdb database") || m.contains("is a directory") {
        Some("not a DuckDB database file")
    } else if m.contains("database file with version") {
        Some("written by an incompatible DuckDB version")
    } else {
        None
    }
}

/// The settings of every database fixpoint opens: no extension is ever
/// downloaded at run time (`autoinstall_known_extensions = false`). A
/// statement that needs an extension neither bundled nor installed fails at
/// once, naming it, instead of reaching for the network (and, offline,
/// waiting on name lookups first); installed extensions still load.
fn config() -> Result<duckdb::Config> {
    duckdb::Config::default().with("autoinstall_known_extensions", "false").map_err(db_err("configuring DuckDB"))
}

impl DuckDb {
    /// Opens (or creates) a database file, waiting up to `wait` while another
    /// process holds its lock.
    pub fn open(path: &Path, wait: Duration) -> Result<DuckDb> {
        let deadline = Instant::now() + wait;
        let mut announced = false;
        loop {
            match duckdb::Connection::open_with_flags(path, config()?) {
                Ok(conn) => return Ok(DuckDb::new(conn, Some(path.to_owned()))),
                Err(e) => {
                    let msg = e.to_string();
                    if let Some(problem) = open_problem(&msg) {
                        return Err(Error::Argument {
                            message: format!("cannot open {} as a DuckDB database: {problem}: {}", path.display(), msg.trim()),
                            hint: Some(
                                match problem {
                                    "permission denied" => "fixpoint needs to read and write the file and its folder: fix their permissions, or pass another --db",
                                    "not a DuckDB database file" => "pass the path of a DuckDB database file (or of a new file to create) in --db duckdb:PATH",
                                    _ => "open it with the DuckDB version that wrote it and EXPORT DATABASE, then IMPORT DATABASE into a new file",
                                }
                                .into(),
                            ),
                        });
                    }
                    if !msg.to_ascii_lowercase().contains("lock") {
                        return Err(Error::Database {
                            engine: "duckdb",
                            context: format!("opening {}", path.display()),
                            message: msg,
                            failure: DbFailure::Other,
                        });
                    }
                    if Instant::now() >= deadline {
                        return Err(Error::Busy {
                            message: format!(
                                "{} is locked by another process (DuckDB allows one writer per file); waited {}s: {msg}",
                                path.display(),
                                wait.as_secs()
                            ),
                        });
                    }
                    if !announced {
                        eprintln!("fixpoint: {} is locked by another process; waiting up to {}s", path.display(), wait.as_secs());
                        announced = true;
                    }
                    std::thread::sleep(Duration::from_millis(200));
                }
            }
        }
    }

    /// An in-memory database (tests, and the engines that compute in DuckDB).
    pub fn open_in_memory() -> Result<DuckDb> {
        let conn = duckdb::Connection::open_in_memory_with_flags(config()?).map_err(db_err("opening an in-memory database"))?;
        Ok(DuckDb::new(conn, None))
    }

    fn new(conn: duckdb::Connection, path: Option<PathBuf>) -> DuckDb {
        // Without them the portable fingerprint is built in SQL: the same
        // value, slower. Registering fails only on a broken connection,
        // which the first statement reports.
        let portable_registered = portable::register(&conn).is_ok();
        let taps = tap::Taps::new();
        let tap_registered = tap::register(&conn, &taps).is_ok();
        let warming = warm_keywords(&conn);
        DuckDb {
            conn,
            path,
            version: None,
            in_transaction: false,
            portable_registered,
            portable_functions: portable_registered,
            tap_registered,
            taps,
            one_statement_merge: true,
            tapped_day_insert: true,
            pending_ties: None,
            batch_made: false,
            described: Default::default(),
            warming,
        }
    }

    /// The same connection without the Rust portable hash (tests compare
    /// the two ways of computing it).
    pub fn without_portable_functions(mut self) -> DuckDb {
        self.portable_functions = false;
        self
    }

    /// The same connection without its taps: the plans of engines that
    /// have none (tests compare the two).
    pub fn without_taps(mut self) -> DuckDb {
        self.tap_registered = false;
        self
    }

    /// The same connection, its merges never one statement: the
    /// two-statement plan runs where that one would (tests compare them).
    pub fn without_one_statement_merge(mut self) -> DuckDb {
        self.one_statement_merge = false;
        self
    }

    /// The same connection, declining to tap `replace_partition`'s day
    /// insert after the plan deferred its guards to it: the plan's fallback
    /// (the guard scan after the delete, then the plain insert) runs where
    /// the tapped insert would (tests reach it with this).
    pub fn without_tapped_day_insert(mut self) -> DuckDb {
        self.tapped_day_insert = false;
        self
    }

    /// Back to the Rust portable hash (when it registered).
    pub fn with_portable_functions(mut self) -> DuckDb {
        self.portable_functions = self.portable_registered;
        self
    }

    /// The file, if any.
    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    /// This connection's taps: the accelerator's test switch (tests open,
    /// read and close taps on it directly).
    pub fn taps(&self) -> &tap::Taps {
        &self.taps
    }

    /// The underlying connection, for setup code and benchmarks. Handing it
    /// out forgets the described tables: whatever is done through it may
    /// change them.
    pub fn connection(&self) -> &duckdb::Connection {
        self.described.borrow_mut().clear();
        &self.conn
    }

    /// Forgets the described tables when `text` may create, drop, alter,
    /// rename or re-attach one, or roll such a change back.
    fn forget_tables_if(&mut self, text: &str) {
        if !self.described.get_mut().is_empty() && !keeps_columns(text) {
            self.described.get_mut().clear();
        }
    }

    fn prepare(&self, sql: &Sql) -> Result<duckdb::Statement<'_>> {
        self.conn.prepare(&sql.text).map_err(|e| db_err(context_of(&sql.text))(e))
    }

    /// Checks a file source's files (listed in [`FILES_VARIABLE`]) before
    /// any row of them is used, so that a file of the wrong shape is refused
    /// naming it instead of loading made-up columns or values:
    ///
    /// - JSON: every record must be an object (the reader is told so); a
    ///   file of other values (numbers, lists, an empty array) is refused.
    /// - CSV, compressed: a file without a header line (DuckDB would read a
    ///   column `column0`); uncompressed ones were checked while hashed.
    /// - a file's own column named like a hive-style `key=value` folder of
    ///   its path, which DuckDB would silently replace with the folder's
    ///   value: refused where the two differ (a NULL in the file is filled
    ///   in from the folder).
    ///
    /// Costs one `DESCRIBE` of the files (and, for such a column, one scan
    /// of it), and only for JSON, compressed CSV and hive-style paths.
    fn check_files(&mut self, files: &InputFiles) -> Result<()> {
        let full = files.path_strings();
        let hive: Vec<(usize, String, String)> =
            full.iter().enumerate().flat_map(|(i, p)| hive_pairs(p).into_iter().map(move |(k, v)| (i, k, v))).collect();
        let compressed_csv = files.format == FileFormat::Csv && files.files.iter().any(|f| fixpoint_core::job::files::is_compressed(&f.path));
        if hive.is_empty() && !compressed_csv && files.format != FileFormat::Json {
            return Ok(());
        }
        let own = match self.own_columns(files, FILES_VARIABLE) {
            Ok(c) => c,
            Err(e) => return Err(self.pinpoint(files, e)),
        };
        if compressed_csv && own.iter().any(|c| c.name == "column0") {
            for (i, f) in files.files.iter().enumerate() {
                if !fixpoint_core::job::files::is_compressed(&f.path) {
                    continue;
                }
                let cols = self.own_columns_of_one(files, i)?;
                if cols.len() == 1 && cols[0].name == "column0" {
                    return Err(fixpoint_core::job::files::headerless_csv(&format!("{} (in {})", f.path, files.shown_base())));
                }
            }
        }
        let shared: Vec<Column> = own.into_iter().filter(|c| hive.iter().any(|(_, k, _)| k.eq_ignore_ascii_case(&c.name))).collect();
        if shared.is_empty() {
            return Ok(());
        }
        self.execute(&Sql::raw(format!("CREATE OR REPLACE TEMPORARY TABLE {HIVE_TABLE} (path VARCHAR, key VARCHAR, value VARCHAR)")))?;
        let checked = self.insert_hive_pairs(&full, &hive).and_then(|_| self.check_hive_columns(files, &full, &shared));
        let dropped = self.execute(&Sql::raw(format!("DROP TABLE IF EXISTS {HIVE_TABLE}")));
        checked?;
        dropped.map(|_| ())
    }

    /// The files' own columns (the hive-style folders of their paths left
    /// out), read from the list in the session variable `variable`.
    fn own_columns(&mut self, files: &InputFiles, variable: &str) -> Result<Vec<Column>> {
        let sql = Sql::raw(format!("SELECT * FROM {}", file_reader(files, &format!("getvariable('{variable}')"), ", hive_partitioning = false")));
        self.describe(&sql)
    }

    /// [`DuckDb::own_columns`] of the `i`-th file alone.
    fn own_columns_of_one(&mut self, files: &InputFiles, i: usize) -> Result<Vec<Column>> {
        self.execute(&Sql::raw(format!("SET VARIABLE {ONE_FILE_VARIABLE} = (SELECT list(path) FROM {FILES_TABLE} WHERE n = {i})")))?;
        self.own_columns(files, ONE_FILE_VARIABLE)
    }

    /// The error of describing the files together, made about the file it
    /// comes from when DuckDB does not name one: a JSON file whose records
    /// are not objects.
    fn pinpoint(&mut self, files: &InputFiles, e: Error) -> Error {
        let Error::Database { message, .. } = &e else { return e };
        if files.format != FileFormat::Json || !message.contains("expected records") || files.named_in(message).is_some() {
            return e;
        }
        for (i, f) in files.files.iter().enumerate() {
            // Alone, each file is described again: the first that fails is the one.
            let this_one = files.files.len() == 1
                || match self.own_columns_of_one(files, i) {
                    Ok(_) => false,
                    Err(Error::Database { message, .. }) if message.contains("expected records") => true,
                    Err(other) => return other,
                };
            if this_one {
                return Error::Files {
                    message: format!(
                        "{} (in {}) holds no JSON object to read as a row: its values are not objects (a number, a string, a list, or an empty array or file); each line of JSON Lines, or each element of a top-level array, must be an object such as {{\"order_id\": 1}}; nothing was changed",
                        f.path,
                        files.shown_base()
                    ),
                    hint: Some("replace the file with one holding one JSON object per record (or remove it), and run again; the target keeps its previous contents".into()),
                };
            }
        }
        e
    }

    /// Fills [`HIVE_TABLE`] with the (path, key, value) of every file's
    /// hive-style folders.
    fn insert_hive_pairs(&mut self, full: &[String], hive: &[(usize, String, String)]) -> Result<()> {
        for chunk in hive.chunks(300) {
            let mut sql = Sql::new();
            sql.push(&format!("INSERT INTO {HIVE_TABLE} VALUES "));
            for (j, (i, k, v)) in chunk.iter().enumerate() {
                if j > 0 {
                    sql.push(", ");
                }
                sql.push("(").typed_param(Value::Text(full[*i].clone()), "VARCHAR").push(", ");
                sql.typed_param(Value::Text(k.clone()), "VARCHAR").push(", ");
                sql.typed_param(Value::Text(v.clone()), "VARCHAR").push(")");
            }
            self.execute(&sql)?;
        }
        Ok(())
    }

    /// Refuses the first file (in path order) whose own column `c` (one of
    /// `shared`) holds a value other than its folder's `c=value`. The two
    /// agree when the file's value as text is the folder's (URL-decoded, as
    /// DuckDB reads it), or equals it cast to the column's type.
    fn check_hive_columns(&mut self, files: &InputFiles, full: &[String], shared: &[Column]) -> Result<()> {
        let list = format!("getvariable('{FILES_VARIABLE}')");
        let reader = file_reader(files, &list, &format!(", hive_partitioning = false, filename = '{FILE_COLUMN}'"));
        for c in shared {
            let col = format!("r.{}", quote_ident(&c.name));
            let typed = if plain_type(&c.ty) { format!(" AND TRY_CAST(url_decode(h.value) AS {}) IS DISTINCT FROM {col}", c.ty) } else { String::new() };
            let mut sql = Sql::new();
            sql.push(&format!(
                "SELECT h.path, CAST({col} AS VARCHAR), h.key, h.value FROM {reader} AS r JOIN {HIVE_TABLE} AS h ON h.path = r.{} WHERE lower(h.key) = lower(",
                quote_ident(FILE_COLUMN)
            ));
            sql.typed_param(Value::Text(c.name.clone()), "VARCHAR");
            sql.push(&format!(") AND {col} IS NOT NULL AND CAST({col} AS VARCHAR) IS DISTINCT FROM url_decode(h.value){typed} ORDER BY h.path LIMIT 1"));
            let found = self.query(&sql)?;
            let Some(row) = found.rows.first() else { continue };
            let text = |v: &Value| v.as_str().map(str::to_owned).unwrap_or_else(|| v.display());
            let (path, own, key, value) = (text(&row[0]), text(&row[1]), text(&row[2]), text(&row[3]));
            let rel = full.iter().position(|p| *p == path).map(|i| files.files[i].path.clone()).unwrap_or(path);
            return Err(Error::Files {
                message: format!(
                    "{rel} (in {}) has its own column {:?} holding {own:?}, but its folder {key}={value} says {value:?}: the folder's value would silently replace the file's; nothing was changed",
                    files.shown_base(),
                    c.name
                ),
                hint: Some(format!(
                    "make the two agree: fix the file's {0:?} values or move the file to the folder of its {0}, or write the file without the column and let the folder name give it; the target keeps its previous contents",
                    c.name
                )),
            });
        }
        Ok(())
    }
}

/// The DuckDB reader (a table function call) of `files` over the list of
/// paths `list`, with `extra` options (`, name = value`) appended.
fn file_reader(files: &InputFiles, list: &str, extra: &str) -> String {
    match files.format {
        FileFormat::Parquet => format!("read_parquet({list}, union_by_name = true{extra})"),
        // The dialect is pinned: left to sniff, DuckDB takes a file
        // whose last row has an extra field for a file with another
        // header and loads nothing of it, and skips rows starting with
        // `#` as comments, silently.
        FileFormat::Csv => {
            let tsv = files.files.iter().all(|f| f.path.to_ascii_lowercase().trim_end_matches(".gz").trim_end_matches(".zst").ends_with(".tsv"));
            let delim = if tsv { "\t" } else { "," };
            format!("read_csv({list}, header = true, skip = 0, delim = '{delim}', quote = '\"', escape = '\"', comment = '', union_by_name = true{extra})")
        }
        // JSON Lines or a top-level array of objects (one row per
        // element), found per file; every record must be an object (the
        // default would read other values as one made-up column `json`, and
        // a top-level array as one row holding a list).
        FileFormat::Json => format!("read_json({list}, format = 'auto', records = 'true', union_by_name = true{extra})"),
    }
}

/// The hive-style `key=value` folders of a path, as DuckDB reads them
/// (`HivePartitioning::Parse`): every component followed by a separator
/// that holds one `=` after a non-empty key (and no `?`); the first of a
/// key wins.
fn hive_pairs(path: &str) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = Vec::new();
    let (mut start, mut eq, mut candidate) = (0usize, 0usize, true);
    for (c, b) in path.bytes().enumerate() {
        if b == b'?' || b == b'\n' {
            candidate = false;
        }
        if b == b'/' || b == b'\\' {
            if candidate && eq > start {
                let key = &path[start..eq];
                if !out.iter().any(|(k, _)| k == key) {
                    out.push((key.to_owned(), path[eq + 1..c].to_owned()));
                }
            }
            start = c + 1;
            candidate = true;
        } else if b == b'=' {
            if eq > start {
                candidate = false;
            }
            eq = c;
        }
    }
    out
}

/// Whether a DuckDB type name can be written in a cast as it is: a plain
/// type (letters, digits, `_`, spaces), with a `(precision, scale)` at most.
fn plain_type(ty: &str) -> bool {
    let (name, args) = match ty.split_once('(') {
        Some((n, rest)) => (n, rest.strip_suffix(')')),
        None => (ty, Some("")),
    };
    let Some(args) = args else { return false };
    !name.trim().is_empty()
        && name.chars().all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_' || c == ' ')
        && args.chars().all(|c| c.is_ascii_digit() || c == ',' || c == ' ')
}

use fixpoint_core::engine::statement_context as context_of;

/// Whether a statement leaves every table's columns as they are: a query, a
/// DML statement, `DESCRIBE` or a transaction's start or commit (anything
/// else, `ROLLBACK` included, may add, drop or change columns).
fn keeps_columns(text: &str) -> bool {
    let head = text.trim_start_matches(|c: char| c.is_whitespace() || c == '(');
    let word: String = head.chars().take_while(|c| c.is_ascii_alphabetic()).collect::<String>().to_ascii_uppercase();
    ["SELECT", "WITH", "INSERT", "DELETE", "UPDATE", "MERGE", "DESCRIBE", "BEGIN", "COMMIT"].contains(&word.as_str())
}

/// What a `DESCRIBE` (of a table or a query) returned: the columns, and
/// the defaults where it has a `default` column.
fn described(rows: &Rows) -> Result<Described> {
    let at = |name: &str| rows.columns.iter().position(|c| c == name);
    let (Some(name), Some(ty)) = (at("column_name"), at("column_type")) else {
        return Err(Error::Internal(format!("DESCRIBE returned columns {:?}", rows.columns)));
    };
    let default = at("default");
    let mut d = Described { columns: Vec::with_capacity(rows.rows.len()), defaults: Vec::new() };
    for r in &rows.rows {
        let (Value::Text(n), Value::Text(t)) = (&r[name], &r[ty]) else {
            return Err(Error::Internal(format!("DESCRIBE returned {r:?}")));
        };
        d.columns.push(Column { name: n.clone(), ty: t.clone() });
        if let Some(expr) = default.and_then(|i| r[i].as_str()) {
            d.defaults.push((n.clone(), expr.to_owned()));
        }
    }
    Ok(d)
}

fn to_duck(v: &Value) -> DValue {
    match v {
        Value::Null => DValue::Null,
        Value::Bool(b) => DValue::Boolean(*b),
        Value::Int(i) => DValue::BigInt(*i),
        Value::HugeInt(i) => DValue::HugeInt(*i),
        Value::Float(f) => DValue::Double(*f),
        Value::Text(s) => DValue::Text(s.clone()),
        Value::Date(d) => {
            let epoch = chrono::NaiveDate::from_ymd_opt(1970, 1, 1).expect("epoch");
            DValue::Date32((*d - epoch).num_days() as i32)
        }
        Value::Timestamp(t) => DValue::Timestamp(TimeUnit::Microsecond, t.and_utc().timestamp_micros()),
    }
}

fn from_duck(v: DValue) -> Value {
    match v {
        DValue::Null => Value::Null,
        DValue::Boolean(b) => Value::Bool(b),
        DValue::TinyInt(i) => Value::Int(i.into()),
        DValue::SmallInt(i) => Value::Int(i.into()),
        DValue::Int(i) => Value::Int(i.into()),
        DValue::BigInt(i) => Value::Int(i),
        DValue::UTinyInt(i) => Value::Int(i.into()),
        DValue::USmallInt(i) => Value::Int(i.into()),
        DValue::UInt(i) => Value::Int(i.into()),
        DValue::UBigInt(i) => Value::HugeInt(i.into()),
        DValue::HugeInt(i) => Value::HugeInt(i),
        DValue::UHugeInt(i) => match i128::try_from(i) {
            Ok(i) => Value::HugeInt(i),
            Err(_) => Value::Text(i.to_string()),
        },
        DValue::Float(f) => Value::Float(f.into()),
        DValue::Double(f) => Value::Float(f),
        DValue::Decimal(d) => Value::Text(d.to_string()),
        DValue::Timestamp(unit, n) => {
            let micros = match unit {
                TimeUnit::Second => n.saturating_mul(1_000_000),
                TimeUnit::Millisecond => n.saturating_mul(1_000),
                TimeUnit::Microsecond => n,
                TimeUnit::Nanosecond => n / 1_000,
            };
            match chrono::DateTime::from_timestamp_micros(micros) {
                Some(t) => Value::Timestamp(t.naive_utc()),
                None => Value::Text(format!("timestamp {micros}µs")),
            }
        }
        DValue::Text(s) => Value::Text(s),
        DValue::Enum(s) => Value::Text(s),
        DValue::Date32(days) => {
            let epoch = chrono::NaiveDate::from_ymd_opt(1970, 1, 1).expect("epoch");
            match epoch.checked_add_signed(chrono::Duration::days(days.into())) {
                Some(d) => Value::Date(d),
                None => Value::Text(format!("date {days}")),
            }
        }
        DValue::Blob(b) => Value::Text(b.iter().map(|x| format!("{x:02x}")).collect()),
        other => Value::Text(format!("{other:?}")),
    }
}

impl Engine for DuckDb {
    fn name(&self) -> &'static str {
        "duckdb"
    }

    fn version(&mut self) -> Result<String> {
        if let Some(v) = &self.version {
            return Ok(v.clone());
        }
        let v: String = self
            .conn
            .query_row("SELECT library_version FROM pragma_version()", [], |r| r.get(0))
            .map_err(db_err("reading the DuckDB version"))?;
        let v = format!("duckdb {v}");
        self.version = Some(v.clone());
        Ok(v)
    }

    fn execute(&mut self, sql: &Sql) -> Result<u64> {
        let started = std::time::Instant::now();
        self.forget_tables_if(&sql.text);
        let mut stmt = self.prepare(sql)?;
        let n = stmt
            .execute(duckdb::params_from_iter(sql.params.iter().map(to_duck)))
            .map_err(|e| db_err(context_of(&sql.text))(e))?;
        fixpoint_core::run::protocol::trace_statement(started, &sql.text);
        Ok(n as u64)
    }

    fn query(&mut self, sql: &Sql) -> Result<Rows> {
        let started = std::time::Instant::now();
        self.forget_tables_if(&sql.text);
        let mut stmt = self.prepare(sql)?;
        let mut rows = stmt
            .query(duckdb::params_from_iter(sql.params.iter().map(to_duck)))
            .map_err(|e| db_err(context_of(&sql.text))(e))?;
        let columns = rows.as_ref().map(|s| s.column_names()).unwrap_or_default();
        let n = columns.len();
        let mut out = Vec::new();
        while let Some(row) = rows.next().map_err(|e| db_err(context_of(&sql.text))(e))? {
            let mut values = Vec::with_capacity(n);
            for i in 0..n {
                let v: DValue = row.get(i).map_err(|e| db_err(context_of(&sql.text))(e))?;
                values.push(from_duck(v));
            }
            out.push(values);
        }
        fixpoint_core::run::protocol::trace_statement(started, &sql.text);
        Ok(Rows { columns, rows: out })
    }

    fn describe(&mut self, query: &Sql) -> Result<Vec<Column>> {
        // `DESCRIBE` of the query binds it, parameters included, and gives
        // its exact column types in one statement (~1 ms less than the
        // probe table below). Outside a transaction only, and only when its
        // column names are distinct: otherwise (or when the query fails)
        // the probe decides, with its own error.
        if !self.in_transaction {
            let mut sql = Sql::new();
            sql.push("DESCRIBE ");
            sql.text.push_str(&query.text);
            sql.params = query.params.clone();
            if let Ok(cols) = self.query(&sql).and_then(|rows| described(&rows)).map(|d| d.columns) {
                let distinct: std::collections::HashSet<&str> = cols.iter().map(|c| c.name.as_str()).collect();
                if !cols.is_empty() && distinct.len() == cols.len() {
                    return Ok(cols);
                }
            }
        }
        // A zero-row temporary table gives DuckDB's exact column types.
        let probe = "__fixpoint_describe";
        let mut sql = Sql::new();
        sql.push(&format!("CREATE OR REPLACE TEMPORARY TABLE {} AS SELECT * FROM (", quote_ident(probe)));
        sql.text.push_str(&query.text);
        sql.params = query.params.clone();
        sql.push("\n) AS s LIMIT 0");
        // Straight to the connection: the probe changes no described table.
        self.prepare(&sql)?
            .execute(duckdb::params_from_iter(sql.params.iter().map(to_duck)))
            .map_err(|e| db_err(context_of(&sql.text))(e))?;
        let cols = self.describe_now(&format!("temp.main.{}", quote_ident(probe))).map(|d| d.columns);
        // Straight to the connection: dropping the probe cannot drop a
        // described table, so it keeps them (see `forget_tables_if`).
        self.conn
            .execute_batch(&format!("DROP TABLE IF EXISTS temp.main.{}", quote_ident(probe)))
            .map_err(db_err("dropping the describe probe"))?;
        cols
    }

    fn column_defaults(&mut self, table: &TableName) -> Result<Vec<(String, String)>> {
        // From `DESCRIBE` (its `default` column), which the run reads
        // anyway: `information_schema.columns` costs 20-30 ms on a fresh
        // connection.
        if self.table_columns(table)?.is_none() {
            return Ok(Vec::new());
        }
        Ok(self.described_table(&table.quoted())?.defaults)
    }

    fn table_columns(&mut self, table: &TableName) -> Result<Option<Vec<Column>>> {
        // Described, and nothing since can have dropped it.
        if let Some(d) = self.described.get_mut().get(&table.quoted()) {
            return Ok(Some(d.columns.clone()));
        }
        if self.base_table_exists(table)? {
            return self.columns_of(&table.quoted()).map(Some);
        }
        // Not a table of this database. fixpoint's own tables are never
        // anything else; another name may be a view, which DESCRIBE
        // answers, outside a transaction (inside one, the catalog error of a
        // missing name would abort it).
        if self.in_transaction || table.schema == fixpoint_core::run::ledger::SCHEMA {
            return Ok(None);
        }
        match self.columns_of(&table.quoted()) {
            Ok(cols) => Ok(Some(cols)),
            Err(Error::Database { message, .. }) if message.contains("Catalog Error") && message.contains("does not exist") => Ok(None),
            Err(e) => Err(e),
        }
    }

    fn relation_kind(&mut self, table: &TableName) -> Result<Option<String>> {
        // The appender's lookup (~0.1 ms, no catalog error to abort a
        // transaction): a table, nothing, or another entry of the tables'
        // catalog, which in DuckDB is a view ("v is not an table").
        // Anything else it says is left to the run's own statements.
        match self.conn.appender_to_db(&table.table, &table.schema) {
            Err(e) if e.to_string().contains("is not a") => Ok(Some("a view".into())),
            _ => Ok(None),
        }
    }

    fn begin(&mut self) -> Result<()> {
        self.execute(&Sql::raw("BEGIN TRANSACTION"))?;
        self.in_transaction = true;
        Ok(())
    }

    fn commit(&mut self) -> Result<()> {
        // Its connection's transaction ended long ago; joined so that no
        // other transaction can be open when the commit checkpoints.
        if let Some(w) = self.warming.take() {
            let _ = w.join();
        }
        let r = self.execute(&Sql::raw("COMMIT"));
        self.in_transaction = false;
        r.map(|_| ())
    }

    fn rollback(&mut self) -> Result<()> {
        self.pending_ties = None;
        let r = self.execute(&Sql::raw("ROLLBACK"));
        self.in_transaction = false;
        r.map(|_| ())
    }

    fn dialect(&self) -> &dyn Dialect {
        self
    }

    fn file_input(&mut self) -> Option<&mut dyn FileInput> {
        Some(self)
    }

    fn accelerator(&mut self) -> Option<&mut dyn Accelerator> {
        // Without its taps (`without_taps`), the portable plans run, as on
        // an engine that has none.
        if self.tap_registered {
            Some(self)
        } else {
            None
        }
    }
}

impl Dialect for DuckDb {
    fn native_row_hash(&self, alias: &str, columns: &[Column]) -> Option<String> {
        let cols: Vec<String> = columns.iter().map(|c| format!("{alias}.{}", quote_ident(&c.name))).collect();
        Some(format!("hash({})", cols.join(", ")))
    }

    fn portable_value(&self, expr: &str, column: &Column) -> (String, &'static str) {
        let ty = column.ty.to_ascii_uppercase();
        let (class, text) = if ["TINYINT", "SMALLINT", "INTEGER", "BIGINT", "HUGEINT", "UTINYINT", "USMALLINT", "UINTEGER", "UBIGINT", "UHUGEINT"].contains(&ty.as_str()) {
            ("int", format!("CAST({expr} AS VARCHAR)"))
        } else if ty.starts_with("DECIMAL") {
            ("decimal", format!("CAST({expr} AS VARCHAR)"))
        } else if ty == "FLOAT" || ty == "DOUBLE" {
            // The bits of the absolute value (fixpoint_core::fingerprint::write_float).
            let x = format!("CAST({expr} AS DOUBLE)");
            let a = format!("(CASE WHEN isfinite({x}) AND {x} <> 0 THEN abs({x}) ELSE 1.0 END)");
            ("float", format!(
                "CASE WHEN {x} IS NULL THEN NULL WHEN isnan({x}) THEN 'nan' WHEN isinf({x}) THEN (CASE WHEN {x} > 0 THEN 'inf' ELSE '-inf' END) WHEN {x} = 0 THEN '0' \
                 ELSE (CASE WHEN {x} < 0 THEN '-' ELSE '' END) || CAST({} AS VARCHAR) END",
                fixpoint_core::fingerprint::float_bits_sql(&a)
            ))
        } else if ty == "VARCHAR" || ty.starts_with("VARCHAR(") {
            ("text", expr.to_owned())
        } else if ty == "DATE" {
            ("date", format!("CAST({expr} AS VARCHAR)"))
        } else if ty == "TIMESTAMP" || ty == "TIMESTAMP_S" || ty == "TIMESTAMP_MS" || ty == "TIMESTAMP_NS" {
            ("timestamp", format!("CAST(epoch_us(CAST({expr} AS TIMESTAMP)) AS VARCHAR)"))
        } else if ty == "TIMESTAMP WITH TIME ZONE" {
            ("timestamptz", format!("CAST(epoch_us({expr}) AS VARCHAR)"))
        } else if ty == "BOOLEAN" {
            ("bool", format!("CASE WHEN {expr} THEN 't' WHEN NOT {expr} THEN 'f' END"))
        } else if ty == "BLOB" {
            ("bytes", format!("hex({expr})"))
        } else {
            ("other", format!("CAST({expr} AS VARCHAR)"))
        };
        (text, class)
    }

    fn portable_row_hash(&self, text_expr: &str) -> String {
        // The digest's first 8 bytes read little-endian (md5_number's low
        // 64 bits); PostgreSQL computes the same from md5()'s hex.
        format!("CAST(md5_number({text_expr}) & 18446744073709551615 AS UBIGINT)")
    }

    fn portable_row_hash_direct(&self, alias: &str, columns: &[Column]) -> Option<String> {
        if !self.portable_functions {
            return None;
        }
        let fields: Vec<String> = columns
            .iter()
            .map(|c| {
                let expr = format!("{alias}.{}", quote_ident(&c.name));
                portable::field_expr(&expr, &c.ty, self.portable_value(&expr, c).1)
            })
            .collect();
        Some(format!("{}(row({}))", portable::HASH_FUNCTION, fields.join(", ")))
    }

    /// Also two DECIMALs of one scale stored in one integer width
    /// (precision 1–4, 5–9, 10–18, 19–38): DuckDB hashes the stored
    /// integer, which the cast leaves as it is (or refuses).
    fn same_native_hash(&self, from: &str, to: &str) -> bool {
        if from.eq_ignore_ascii_case(to) {
            return true;
        }
        match (decimal_of(from), decimal_of(to)) {
            (Some((p1, s1)), Some((p2, s2))) => s1 == s2 && decimal_width(p1) == decimal_width(p2),
            _ => false,
        }
    }
}

impl FileInput for DuckDb {
    fn stage_files(&mut self, files: &InputFiles) -> Result<Sql> {
        // DuckDB binds a table function's arguments when it plans the query,
        // so the paths cannot be statement parameters. They are bound as
        // parameters into a temporary table, gathered into a session
        // variable, and the reader takes the variable: no path is ever
        // spliced into SQL text.
        self.execute(&Sql::raw(format!("CREATE OR REPLACE TEMPORARY TABLE {FILES_TABLE} (n INTEGER, path VARCHAR)")))?;
        for chunk in files.path_strings().chunks(500).enumerate() {
            let (c, paths) = chunk;
            let mut sql = Sql::new();
            sql.push(&format!("INSERT INTO {FILES_TABLE} VALUES "));
            for (i, p) in paths.iter().enumerate() {
                if i > 0 {
                    sql.push(", ");
                }
                sql.push("(").typed_param(Value::Int((c * 500 + i) as i64), "INTEGER").push(", ");
                sql.typed_param(Value::Text(p.clone()), "VARCHAR").push(")");
            }
            self.execute(&sql)?;
        }
        self.execute(&Sql::raw(format!("SET VARIABLE {FILES_VARIABLE} = (SELECT list(path ORDER BY n) FROM {FILES_TABLE})")))?;
        self.check_files(files)?;
        Ok(Sql::raw(file_reader(files, &format!("getvariable('{FILES_VARIABLE}')"), "")))
    }

    fn release_files(&mut self) -> Result<()> {
        self.execute(&Sql::raw(format!("RESET VARIABLE {FILES_VARIABLE}")))?;
        self.execute(&Sql::raw(format!("RESET VARIABLE {ONE_FILE_VARIABLE}")))?;
        self.execute(&Sql::raw(format!("DROP TABLE IF EXISTS {HIVE_TABLE}")))?;
        self.execute(&Sql::raw(format!("DROP TABLE IF EXISTS {FILES_TABLE}")))?;
        Ok(())
    }
}

impl DuckDb {
    /// Whether `table` is a table of this database (not a view, not a
    /// temporary table). Asked of the appender's lookup, which returns
    /// nothing for a missing name: no catalog error, so it aborts no
    /// transaction, and no search for similar names (a `DESCRIBE` of a
    /// missing table costs ~9 ms on a fresh connection, `duckdb_tables()`
    /// ~11 ms; this ~0.1 ms).
    fn base_table_exists(&self, table: &TableName) -> Result<bool> {
        match self.conn.appender_to_db(&table.table, &table.schema) {
            Ok(_) => Ok(true),
            // Missing, or another kind of entry ("v is not an table").
            Err(e) if e.to_string().contains("could not be found") || e.to_string().contains("is not a") => Ok(false),
            Err(e) => Err(db_err(format!("looking up {table}"))(e)),
        }
    }

    /// The columns of a table, by its quoted qualified name, from what this
    /// connection last described of it when nothing since can have changed
    /// them. (`DESCRIBE` is fast; `duckdb_columns()` scans every catalog
    /// and costs ~30 ms on a fresh connection.)
    fn columns_of(&mut self, quoted: &str) -> Result<Vec<Column>> {
        Ok(self.described_table(quoted)?.columns)
    }

    fn described_table(&mut self, quoted: &str) -> Result<Described> {
        if let Some(d) = self.described.get_mut().get(quoted) {
            return Ok(d.clone());
        }
        let d = self.describe_now(quoted)?;
        self.described.get_mut().insert(quoted.to_owned(), d.clone());
        Ok(d)
    }

    /// `DESCRIBE`, uncached.
    fn describe_now(&mut self, quoted: &str) -> Result<Described> {
        let rows = self.query(&Sql::raw(format!("DESCRIBE {quoted}")))?;
        described(&rows)
    }
}

/// Parses a `duckdb:PATH` URL (also `duckdb://PATH`, and `duckdb::memory:`).
pub fn parse_url(url: &str) -> Option<DuckTarget> {
    let rest = url.strip_prefix("duckdb:")?;
    let rest = rest.strip_prefix("//").unwrap_or(rest);
    if rest == ":memory:" {
        return Some(DuckTarget::Memory);
    }
    if rest.is_empty() {
        return None;
    }
    Some(DuckTarget::File(PathBuf::from(rest)))
}

/// Where a DuckDB URL points.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DuckTarget {
    /// A database file.
    File(PathBuf),
    /// An in-memory database.
    Memory,
}

/// (precision, scale) of a `DECIMAL(p,s)` type as DuckDB writes it.
fn decimal_of(ty: &str) -> Option<(u32, u32)> {
    let t = ty.trim().to_ascii_uppercase();
    let inner = t.strip_prefix("DECIMAL(")?.strip_suffix(')')?;
    let (p, s) = inner.split_once(',')?;
    Some((p.trim().parse().ok()?, s.trim().parse().ok()?))
}

/// The integer width DuckDB stores a DECIMAL of precision `p` in.
fn decimal_width(p: u32) -> u32 {
    match p {
        0..=4 => 16,
        5..=9 => 32,
        10..=18 => 64,
        _ => 128,
    }
}

#[cfg(test)]
mod file_source_tests {
    use super::{hive_pairs, plain_type};

    #[test]
    fn hive_pairs_are_read_as_duckdb_reads_them() {
        let pairs = |p: &str| hive_pairs(p).into_iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>();
        assert_eq!(pairs("/lake/bronze/dt=2026-10-20/part-0.parquet"), ["dt=2026-10-20"]);
        assert_eq!(pairs("/l/year=2026/month=10/x=1.csv"), ["year=2026", "month=10"], "the file name is not a folder");
        assert_eq!(pairs("/l/a=b=c/k=/=v/d/f.csv"), ["k="], "two `=`, or an empty key: not a pair");
        assert_eq!(pairs("/l/dt=1/x/dt=2/f.csv"), ["dt=1"], "the first of a key wins");
        assert!(pairs("/l/plain/f.csv").is_empty());
    }

    #[test]
    fn only_plain_types_are_written_in_a_cast() {
        for t in ["DATE", "VARCHAR", "DECIMAL(12,2)", "TIMESTAMP WITH TIME ZONE", "TIMESTAMP_NS", "INTEGER"] {
            assert!(plain_type(t), "{t}");
        }
        for t in ["STRUCT(a BIGINT)", "INTEGER[]", "MAP(VARCHAR, INTEGER)", "DECIMAL(12,2", "\"x\"", ""] {
            assert!(!plain_type(t), "{t}");
        }
    }
}
