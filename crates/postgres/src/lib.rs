//! The PostgreSQL engine.
//!
//! Parameters are sent as text, declared `text`, and cast to their type in
//! the SQL fixpoint writes (`CAST($1 AS DATE)`), so no value is ever spliced
//! into a statement and binding never depends on the client's type mapping.
//! Session settings that change text encodings (DateStyle, TimeZone,
//! IntervalStyle, extra_float_digits) are pinned at connect, because the
//! native fingerprint hashes each row's text form.
#![deny(missing_docs)]

use std::error::Error as StdError;

mod files;
mod merge;

use fixpoint_core::engine::{
    Accelerated, Accelerator, Column, DayInsert, DayPartition, Dialect, Engine, FileInput, Locks, MergeRequest, Merged, PartitionExchange, Rows, RunSteps, TappedDay,
};
use fixpoint_core::job::ident::{quote_ident, TableName};
use fixpoint_core::job::sql::{Sql, Value};
use fixpoint_core::{DbFailure, Error, Result};
use fixpoint_core::engine::measure::{FP_ROWS, FP_SUM};
use postgres::types::{FromSql, ToSql, Type};
use postgres::{Client, NoTls};

/// A PostgreSQL database.
pub struct Postgres {
    client: Option<Client>,
    url: String,
    version: Option<String>,
    /// A database created for a test, dropped (through `admin`) on drop.
    scratch: Option<(String, String)>,
    /// How long a statement waits for a lock (`lock_timeout`) before the run
    /// stops with exit 5 (`--wait`).
    wait: std::time::Duration,
    /// This session's backend process id, to name who holds what we waited for.
    pid: i32,
    /// `BEGIN …` of a run's transaction: REPEATABLE READ (one snapshot for
    /// the guards, the fingerprints and the write), or SERIALIZABLE where
    /// that is the database's default.
    begin: &'static str,
    /// A transaction has begun and run no statement yet: its snapshot is
    /// not taken (see [`Engine::lock_scope`]).
    fresh: bool,
    /// Whether the accelerated plans are offered (the day insert returning
    /// what it wrote, the one-statement merge); tests turn them off to run
    /// the portable plans where they would run.
    accelerated: bool,
    /// A file source's files, staged lazily (see [`Stage`]).
    stage: Option<Stage>,
    /// Inside a transaction this session began (`BEGIN` … `COMMIT` or
    /// `ROLLBACK`).
    in_transaction: bool,
    /// A second session, opened by the first day insert that takes its
    /// guard scan beside the insert ([`Accelerator::insert_day`]), kept
    /// for the next.
    side: Option<Box<Postgres>>,
}

/// A file source's staging table: created with the files' columns when the
/// run starts, its rows copied in by the first statement that reads it
/// (none when a retry is skipped by its files' run key; none when the
/// files go straight into the target, [`Accelerator::insert_day`]). Rows
/// copied inside a transaction that rolls back go with it, and the next
/// statement that reads the table copies them again.
struct Stage {
    pending: files::Pending,
    filled: bool,
    /// Filled inside the open transaction.
    filled_in_transaction: bool,
}

/// The lock wait of [`Postgres::connect`]: the CLI's `--wait` default.
pub const DEFAULT_WAIT: std::time::Duration = std::time::Duration::from_secs(60);

/// With `--no-wait`, the longest wait for a lock another session holds.
const NO_WAIT: std::time::Duration = std::time::Duration::from_secs(1);

/// `lock_timeout` for a wait: PostgreSQL reads 0 as "wait forever", so the
/// shortest wait is 1 ms.
fn lock_timeout_ms(wait: std::time::Duration) -> u64 {
    wait.as_millis().clamp(1, i32::MAX as u128) as u64
}

use fixpoint_core::error::redact_url as redact;

fn pg_err(context: impl Into<String>) -> impl FnOnce(postgres::Error) -> Error {
    let context = context.into();
    move |e| match e.as_db_error() {
        Some(db) => classify(db.code().code(), db.message(), context),
        None => {
            let message = match e.source() {
                Some(s) => format!("{e}: {s}"),
                None => e.to_string(),
            };
            Error::Database { engine: "postgres", context, message, failure: DbFailure::Other }
        }
    }
}

/// The kind of a failure by its SQLSTATE.
pub fn failure_of(code: &str) -> DbFailure {
    match code {
        // Syntax, undefined table, column or function, ambiguous column or
        // function, datatype mismatch.
        "42601" | "42P01" | "42703" | "42883" | "42702" | "42725" | "42804" => DbFailure::Binding,
        c if c.starts_with("42") || c.starts_with("22") => DbFailure::Statement,
        _ => DbFailure::Other,
    }
}

/// Errors by SQLSTATE: what a person needs to read, and whether a retry is right.
pub fn classify(code: &str, message: &str, context: String) -> Error {
    let what = match code {
        "40001" => "serialization failure",
        "40P01" => "deadlock detected",
        "55P03" => "lock not available",
        "57014" => "statement timeout or cancel",
        "42P01" => "undefined table",
        "42703" => "undefined column",
        "42883" => "undefined function",
        "42501" => "permission denied",
        "3D000" => "database does not exist",
        "28000" | "28P01" => "authentication failed",
        c if c.starts_with("08") || c.starts_with("57P") => "connection lost",
        c if c.starts_with("53") => "insufficient resources",
        c if c.starts_with("22") => "bad data",
        c if c.starts_with("23") => "constraint violated",
        _ => "error",
    };
    // Two transactions creating the same schema or table at once (CREATE …
    // IF NOT EXISTS is not atomic): the loser sees a duplicate in the
    // catalog; run again, it will see the object.
    let catalog_race = (code == "23505" && message.contains("\"pg_"))
        || code == "42P07" && context.contains("CREATE")
        || code == "42P06" && context.contains("CREATE");
    let message_text = message;
    let message = format!("{what}: {message} (SQLSTATE {code})");
    match code {
        "40001" | "40P01" => Error::Transient { engine: "postgres", context, message },
        // A refused login or a missing database: the URL is wrong, not the server.
        "28000" | "28P01" | "3D000" => Error::Argument {
            message: format!("postgres: {context}: {message}"),
            hint: Some("check the user, password and database name in --db (or FIXPOINT_DB); the password is never printed".into()),
        },
        // The user in --db lacks a privilege (on the source, the target,
        // the ledger, a schema): no retry will have it; the message names
        // the object, the hint what to grant.
        "42501" => permission_denied(code, message_text),
        _ if catalog_race => Error::Transient { engine: "postgres", context, message: format!("{message}; a concurrent run created it") },
        "55P03" => Error::Busy { message: format!("postgres: {context}: {message}") },
        _ => Error::Database { engine: "postgres", context, message, failure: failure_of(code) },
    }
}

/// A refused privilege (SQLSTATE 42501: `permission denied for table
/// daily`, `must be owner of table daily`, `permission denied for schema
/// silver`), as bad input (exit 2) naming the object and what to grant.
fn permission_denied(code: &str, message: &str) -> Error {
    let object = message
        .strip_prefix("permission denied for ")
        .or_else(|| message.strip_prefix("must be owner of "))
        .map(str::trim)
        .filter(|o| !o.is_empty())
        .unwrap_or("the object it names");
    Error::Argument {
        message: format!("postgres: {} (SQLSTATE {code}): the user in --db lacks a privilege fixpoint needs", message.trim()),
        hint: Some(format!(
            "have the owner of {object} grant it to the user in --db, or connect as a user who has it. A run needs SELECT on the source's tables; \
             SELECT, INSERT, UPDATE and DELETE on the target (ownership for partition exchange, CREATE on its schema to create it); \
             USAGE on those schemas; SELECT and INSERT on fixpoint.runs (CREATE on the database for the first run, which makes it). \
             E.g. GRANT SELECT, INSERT, UPDATE, DELETE ON <schema>.<table> TO <user>"
        )),
    }
}

/// The session's settings. Values are read and written in ISO forms. The
/// memory kept for temporary tables (`temp_buffers`, taken only as they
/// fill; settable only before a session's first temporary table) is raised
/// to 256 MB where it is lower: a run's temporary tables of some 100k rows
/// each no longer spill to files one by one.
const SESSION: &str = "SET DateStyle = 'ISO, YMD'; SET TimeZone = 'UTC'; SET IntervalStyle = 'postgres'; SET extra_float_digits = 1; \
    SELECT set_config('temp_buffers', '256MB', false) WHERE pg_size_bytes(current_setting('temp_buffers')) < pg_size_bytes('256MB')";

/// The statistics target of a temporary table's `ANALYZE`: a sample of
/// 3,000 rows (the default target, 100, samples 30,000, and took 0.5 s of
/// a history run over its eight temporary tables), which gives the planner
/// the row count and a rough number of distinct values: what it needs to
/// choose its joins.
const TEMP_STATISTICS: u32 = 10;

impl Postgres {
    /// Connects to `postgres://user[:password]@host:port/db`.
    ///
    /// Every lock wait of the session is bounded by [`DEFAULT_WAIT`]; see
    /// [`Postgres::connect_waiting`].
    pub fn connect(url: &str) -> Result<Postgres> {
        Postgres::connect_waiting(url, DEFAULT_WAIT)
    }

    /// Connects, bounding every lock wait of the session by `wait`
    /// (`lock_timeout`): a target locked by another session, or another run's
    /// lock, stops the run with a [`Error::Busy`] naming the sessions with
    /// open transactions, instead of waiting forever.
    pub fn connect_waiting(url: &str, wait: std::time::Duration) -> Result<Postgres> {
        let mut client = Client::connect(url, NoTls).map_err(pg_err(format!("connecting to {}", redact(url))))?;
        // The number is ours (milliseconds), not a user's text.
        let session = format!("{SESSION}; SET lock_timeout = '{}ms'", lock_timeout_ms(wait));
        client.batch_execute(&session).map_err(pg_err("pinning session settings"))?;
        let row = client
            .query_one("SELECT pg_backend_pid(), current_setting('default_transaction_isolation')", &[])
            .map_err(pg_err("reading the session's process id"))?;
        let (pid, isolation): (i32, String) = (row.get(0), row.get(1));
        let begin = if isolation == "serializable" { "BEGIN ISOLATION LEVEL SERIALIZABLE" } else { "BEGIN ISOLATION LEVEL REPEATABLE READ" };
        Ok(Postgres { client: Some(client), url: url.to_owned(), version: None, scratch: None, wait, pid, begin, fresh: false, accelerated: true, stage: None, in_transaction: false, side: None })
    }

    /// Where the session's transaction begins and ends, for [`Stage`]:
    /// rows copied into the staging table inside a transaction that did
    /// not commit are gone, and copied again when next read.
    fn track_transaction(&mut self, text: &str, ok: bool) {
        let word = text.trim_start().split_whitespace().next().unwrap_or("").to_ascii_uppercase();
        match word.as_str() {
            "BEGIN" if ok => self.in_transaction = true,
            "COMMIT" | "ROLLBACK" | "END" | "ABORT" => {
                let committed = ok && word != "ROLLBACK" && word != "ABORT";
                if let Some(stage) = &mut self.stage {
                    if stage.filled_in_transaction && !committed {
                        stage.filled = false;
                    }
                    stage.filled_in_transaction = false;
                }
                self.in_transaction = false;
            }
            _ => {}
        }
    }

    /// Copies the files' rows into the staging table before the first
    /// statement that reads it.
    fn fill_stage(&mut self, text: &str) -> Result<()> {
        let needed = self.stage.as_ref().is_some_and(|s| !s.filled) && text.contains(files::STAGE_NAME);
        if !needed {
            return Ok(());
        }
        let mut stage = self.stage.take().expect("checked");
        let started = std::time::Instant::now();
        let copied = stage.pending.copy(self.client(), files::STAGE).and_then(|_| {
            self.client().batch_execute(&format!("ANALYZE {}", files::STAGE)).map_err(pg_err("analyzing the staging table"))
        });
        fixpoint_core::run::protocol::trace_statement(started, "COPY the files into the staging table");
        stage.filled = copied.is_ok();
        stage.filled_in_transaction = copied.is_ok() && self.in_transaction;
        self.stage = Some(stage);
        copied
    }

    /// A lock timeout becomes a [`Error::Busy`] that says how long it waited
    /// and which sessions hold open transactions in this database (read
    /// through a second connection: this one's transaction is aborted).
    fn explain_busy(&self, e: Error) -> Error {
        let Error::Busy { message } = e else { return e };
        if !message.contains("lock timeout") {
            return Error::Busy { message };
        }
        let mut message = format!("{message}; waited {:.1} s (--wait)", self.wait.as_secs_f64());
        let holders = Client::connect(&self.url, NoTls).ok().and_then(|mut side| {
            side.query(
                "SELECT a.pid, coalesce(a.usename::text, ''), coalesce(a.application_name, ''), coalesce(a.state, ''), \
                 coalesce(extract(epoch FROM now() - a.xact_start)::bigint, 0), left(regexp_replace(coalesce(a.query, ''), '\\s+', ' ', 'g'), 120) \
                 FROM pg_stat_activity a WHERE a.datname = current_database() AND a.pid <> $1 AND a.pid <> pg_backend_pid() \
                 AND a.xact_start IS NOT NULL AND a.backend_type = 'client backend' ORDER BY a.xact_start LIMIT 3",
                &[&self.pid],
            )
            .ok()
        });
        match holders {
            Some(rows) if !rows.is_empty() => {
                let list: Vec<String> = rows
                    .iter()
                    .map(|r| {
                        let (pid, user, app, state, secs, query): (i32, String, String, String, i64, String) =
                            (r.get(0), r.get(1), r.get(2), r.get(3), r.get(4), r.get(5));
                        let app = if app.is_empty() { String::new() } else { format!(", application {app:?}") };
                        format!("pid {pid} (user {user}{app}, {state}, transaction open {secs} s, last statement: {query})")
                    })
                    .collect();
                message.push_str(&format!("; sessions with an open transaction in this database, oldest first: {}", list.join("; ")));
            }
            _ => message.push_str("; no other session with an open transaction was found (the holder has finished: run again)"),
        }
        Error::Busy { message }
    }

    /// Creates a fresh database `name` through `admin_url` and connects to
    /// it; the database is dropped when the engine is dropped (tests).
    pub fn scratch(admin_url: &str, name: &str) -> Result<Postgres> {
        let mut admin = Client::connect(admin_url, NoTls).map_err(pg_err(format!("connecting to {}", redact(admin_url))))?;
        // One statement per call: DROP/CREATE DATABASE refuse to run in a transaction block.
        for stmt in [format!("DROP DATABASE IF EXISTS {}", quote_ident(name)), format!("CREATE DATABASE {}", quote_ident(name))] {
            admin.batch_execute(&stmt).map_err(pg_err("creating a scratch database"))?;
        }
        let url = match admin_url.rfind('/') {
            Some(i) if i > admin_url.find("://").map_or(0, |s| s + 2) => format!("{}/{name}", &admin_url[..i]),
            _ => format!("{admin_url}/{name}"),
        };
        let mut pg = Postgres::connect(&url)?;
        pg.scratch = Some((admin_url.to_owned(), name.to_owned()));
        Ok(pg)
    }

    /// Copies a file source's rows into `table` (existing, with the files'
    /// columns in order) the way a file source is staged: the embedded
    /// DuckDB reads the files, `COPY … (FORMAT binary)` writes them. For the
    /// hand-written side of benchmarks; runs in the caller's transaction.
    pub fn copy_files_into(&mut self, files: &fixpoint_core::job::files::InputFiles, table: &TableName) -> Result<u64> {
        files::copy_files(self.client(), files, &table.quoted())
    }

    /// Without the accelerated plans: every run takes the portable plans
    /// (tests compare the two, and force each in turn).
    pub fn without_accelerator(mut self) -> Postgres {
        self.accelerated = false;
        self
    }

    /// The URL this engine connected to (it may hold a password: never print it unredacted).
    pub fn url(&self) -> &str {
        &self.url
    }

    fn client(&mut self) -> &mut Client {
        self.client.as_mut().expect("connected")
    }

    fn params(sql: &Sql) -> Vec<Param> {
        sql.params
            .iter()
            .map(|v| match v {
                Value::Null => Param::Text(None),
                Value::Bool(b) => Param::Text(Some(b.to_string())),
                Value::Int(i) => Param::Text(Some(i.to_string())),
                Value::HugeInt(i) => Param::Text(Some(i.to_string())),
                Value::Float(f) => Param::Text(Some(f.to_string())),
                Value::Text(s) => Param::Text(Some(s.clone())),
                Value::Date(d) => Param::Date(*d),
                Value::Timestamp(t) => Param::Timestamp(*t),
            })
            .collect()
    }

    /// Each parameter's type as sent: dates and timestamps as themselves,
    /// the rest as text cast in the SQL. (Text cast to a date is parsed
    /// under the session's DateStyle, so PostgreSQL does not fold the cast:
    /// a filter `dt = CAST($1 AS DATE)` would parse the text once per row
    /// scanned, about 0.3 s over 5M rows.)
    fn param_types(sql: &Sql) -> Vec<Type> {
        sql.params
            .iter()
            .map(|v| match v {
                Value::Date(_) => Type::DATE,
                Value::Timestamp(_) => Type::TIMESTAMP,
                _ => Type::TEXT,
            })
            .collect()
    }

    /// A partitioned table's strategy (`l`, `r`, `h`), key column count,
    /// first key column and its type; `None` when it is not partitioned.
    fn partition_key(&mut self, table: &TableName) -> Result<Option<(String, i128, String, String)>> {
        let mut sql = Sql::new();
        sql.push(
            "SELECT pt.partstrat::text, pt.partnatts::int, coalesce(a.attname::text, ''), \
             coalesce(format_type(a.atttypid, a.atttypmod), '') FROM pg_partitioned_table pt \
             JOIN pg_class c ON c.oid = pt.partrelid JOIN pg_namespace n ON n.oid = c.relnamespace \
             LEFT JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum = pt.partattrs[0] WHERE n.nspname = ",
        )
        .typed_param(Value::Text(table.schema.clone()), "TEXT")
        .push(" AND c.relname = ")
        .typed_param(Value::Text(table.table.clone()), "TEXT");
        let rows = self.query(&sql)?;
        Ok(rows.rows.into_iter().next().map(|r| {
            let text = text_of;
            (text(&r[0]), r[1].as_i128().unwrap_or(0), text(&r[2]), text(&r[3]))
        }))
    }

    fn prepare(&mut self, sql: &Sql) -> Result<postgres::Statement> {
        let types = Self::param_types(sql);
        let text = sql.text.clone();
        // Preparing locks the statement's tables (parse analysis): a lock
        // timeout can happen here already.
        let r = self.client().prepare_typed(&text, &types).map_err(|e| pg_err(context_of(&text))(e));
        r.map_err(|e| self.explain_busy(e))
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        if let Some((admin, name)) = self.scratch.take() {
            drop(self.client.take());
            if let Ok(mut c) = Client::connect(&admin, NoTls) {
                let _ = c.batch_execute(&format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", quote_ident(&name)));
            }
        }
    }
}

use fixpoint_core::engine::statement_context as context_of;

/// A parameter as sent: text, or a date or timestamp in PostgreSQL's
/// binary form (days, microseconds since 2000-01-01).
#[derive(Debug)]
enum Param {
    Text(Option<String>),
    Date(chrono::NaiveDate),
    Timestamp(chrono::NaiveDateTime),
}

impl ToSql for Param {
    fn to_sql(&self, ty: &Type, out: &mut bytes::BytesMut) -> std::result::Result<postgres::types::IsNull, Box<dyn StdError + Sync + Send>> {
        use bytes::BufMut;
        let epoch = chrono::NaiveDate::from_ymd_opt(2000, 1, 1).expect("a date");
        match self {
            Param::Text(t) => t.to_sql(ty, out),
            Param::Date(d) => {
                let days = i32::try_from((*d - epoch).num_days()).map_err(|_| format!("the date {d} is out of range"))?;
                out.put_i32(days);
                Ok(postgres::types::IsNull::No)
            }
            Param::Timestamp(t) => {
                let micros = (*t - epoch.and_hms_opt(0, 0, 0).expect("midnight")).num_microseconds().ok_or_else(|| format!("the timestamp {t} is out of range"))?;
                out.put_i64(micros);
                Ok(postgres::types::IsNull::No)
            }
        }
    }

    fn accepts(ty: &Type) -> bool {
        <Option<String> as ToSql>::accepts(ty) || *ty == Type::DATE || *ty == Type::TIMESTAMP
    }

    postgres::types::to_sql_checked!();
}

/// A value of any type, decoded from PostgreSQL's binary format.
struct Raw(Value);

fn epoch_2000() -> chrono::NaiveDateTime {
    chrono::NaiveDate::from_ymd_opt(2000, 1, 1).expect("date").and_hms_opt(0, 0, 0).expect("time")
}

fn be_i16(b: &[u8], at: usize) -> i16 {
    i16::from_be_bytes([b[at], b[at + 1]])
}

/// NUMERIC's binary form: ndigits, weight, sign, dscale, then base-10000 digits.
fn numeric_text(b: &[u8]) -> String {
    let ndigits = be_i16(b, 0) as usize;
    let weight = be_i16(b, 2) as i32;
    let sign = u16::from_be_bytes([b[4], b[5]]);
    let dscale = be_i16(b, 6) as usize;
    if sign == 0xC000 {
        return "NaN".into();
    }
    let digits: Vec<i32> = (0..ndigits).map(|i| be_i16(b, 8 + 2 * i) as i32).collect();
    let mut int_part = String::new();
    for w in 0..=weight.max(-1) {
        let d = digits.get(w as usize).copied().unwrap_or(0);
        if int_part.is_empty() {
            if d != 0 {
                int_part = d.to_string();
            }
        } else {
            int_part.push_str(&format!("{d:04}"));
        }
    }
    if int_part.is_empty() {
        int_part = "0".into();
    }
    let mut frac = String::new();
    let mut i = weight + 1;
    while frac.len() < dscale {
        let d = if i >= 0 { digits.get(i as usize).copied().unwrap_or(0) } else { 0 };
        frac.push_str(&format!("{d:04}"));
        i += 1;
    }
    frac.truncate(dscale);
    let neg = if sign == 0x4000 { "-" } else { "" };
    if dscale > 0 {
        format!("{neg}{int_part}.{frac}")
    } else {
        format!("{neg}{int_part}")
    }
}

impl<'a> FromSql<'a> for Raw {
    fn from_sql(ty: &Type, b: &'a [u8]) -> std::result::Result<Self, Box<dyn StdError + Sync + Send>> {
        let v = match *ty {
            Type::BOOL => Value::Bool(b[0] != 0),
            Type::INT2 => Value::Int(be_i16(b, 0).into()),
            Type::INT4 => Value::Int(i32::from_be_bytes(b[..4].try_into()?).into()),
            Type::INT8 => Value::Int(i64::from_be_bytes(b[..8].try_into()?)),
            Type::OID => Value::Int(u32::from_be_bytes(b[..4].try_into()?).into()),
            Type::FLOAT4 => Value::Float(f32::from_be_bytes(b[..4].try_into()?).into()),
            Type::FLOAT8 => Value::Float(f64::from_be_bytes(b[..8].try_into()?)),
            Type::NUMERIC => Value::Text(numeric_text(b)),
            Type::DATE => {
                let days = i32::from_be_bytes(b[..4].try_into()?);
                Value::Date(epoch_2000().date() + chrono::Duration::days(days.into()))
            }
            Type::TIMESTAMP => Value::Timestamp(epoch_2000() + chrono::Duration::microseconds(i64::from_be_bytes(b[..8].try_into()?))),
            Type::TIMESTAMPTZ => {
                let t = epoch_2000() + chrono::Duration::microseconds(i64::from_be_bytes(b[..8].try_into()?));
                Value::Text(format!("{}+00", t.format("%Y-%m-%d %H:%M:%S%.f")))
            }
            Type::BYTEA => Value::Text(b.iter().map(|x| format!("{x:02x}")).collect()),
            _ => match std::str::from_utf8(b) {
                Ok(s) if matches!(*ty, Type::TEXT | Type::VARCHAR | Type::BPCHAR | Type::NAME | Type::UNKNOWN) || ty.name() == "sql_identifier" || ty.name() == "character_data" => {
                    Value::Text(s.to_owned())
                }
                _ => Value::Text(format!("<{}>", ty.name())),
            },
        };
        Ok(Raw(v))
    }

    fn from_sql_null(_: &Type) -> std::result::Result<Self, Box<dyn StdError + Sync + Send>> {
        Ok(Raw(Value::Null))
    }

    fn accepts(_: &Type) -> bool {
        true
    }
}

impl Engine for Postgres {
    fn name(&self) -> &'static str {
        "postgres"
    }

    fn version(&mut self) -> Result<String> {
        if let Some(v) = &self.version {
            return Ok(v.clone());
        }
        let row = self.client().query_one("SHOW server_version", &[]).map_err(pg_err("reading the server version"))?;
        let v: String = row.get(0);
        let v = format!("postgres {}", v.split_whitespace().next().unwrap_or(&v));
        self.version = Some(v.clone());
        Ok(v)
    }

    fn execute(&mut self, sql: &Sql) -> Result<u64> {
        self.fill_stage(&sql.text)?;
        let started = std::time::Instant::now();
        self.fresh = false;
        if sql.params.is_empty() && !sql.text.contains('$') {
            // Utility statements (BEGIN, CREATE …) cannot be prepared with parameters.
            let text = sql.text.clone();
            let r = self.client().execute(&text, &[]).map_err(|e| pg_err(context_of(&text))(e));
            fixpoint_core::run::protocol::trace_statement(started, &text);
            self.track_transaction(&text, r.is_ok());
            return r.map_err(|e| self.explain_busy(e));
        }
        let stmt = self.prepare(sql)?;
        let params = Self::params(sql);
        let refs: Vec<&(dyn ToSql + Sync)> = params.iter().map(|p| p as &(dyn ToSql + Sync)).collect();
        let r = self.client().execute(&stmt, &refs).map_err(|e| pg_err(context_of(&sql.text))(e));
        fixpoint_core::run::protocol::trace_statement(started, &sql.text);
        r.map_err(|e| self.explain_busy(e))
    }

    fn query(&mut self, sql: &Sql) -> Result<Rows> {
        self.fill_stage(&sql.text)?;
        let started = std::time::Instant::now();
        self.fresh = false;
        let stmt = self.prepare(sql)?;
        let params = Self::params(sql);
        let refs: Vec<&(dyn ToSql + Sync)> = params.iter().map(|p| p as &(dyn ToSql + Sync)).collect();
        let columns: Vec<String> = stmt.columns().iter().map(|c| c.name().to_owned()).collect();
        let rows = self.client().query(&stmt, &refs).map_err(|e| pg_err(context_of(&sql.text))(e));
        let rows = rows.map_err(|e| self.explain_busy(e))?;
        let mut out = Vec::with_capacity(rows.len());
        for r in rows {
            let mut values = Vec::with_capacity(columns.len());
            for i in 0..columns.len() {
                let v: Raw = r.try_get(i).map_err(|e| pg_err(context_of(&sql.text))(e))?;
                values.push(v.0);
            }
            out.push(values);
        }
        fixpoint_core::run::protocol::trace_statement(started, &sql.text);
        Ok(Rows { columns, rows: out })
    }

    fn describe(&mut self, query: &Sql) -> Result<Vec<Column>> {
        let stmt = self.prepare(query)?;
        let mut cols = Vec::new();
        for c in stmt.columns() {
            // With the type modifier, so a column read straight from a table
            // keeps its numeric(12,2) or varchar(20): a target created from
            // the source gets the same types, and fingerprints of source and
            // target compare without a second scan.
            let (oid, typmod) = (c.type_().oid(), c.type_modifier());
            let row = self
                .client()
                .query_one("SELECT format_type(CAST(CAST($1 AS TEXT) AS oid), CAST(CAST($2 AS TEXT) AS INTEGER))", &[&oid.to_string(), &typmod.to_string()])
                .map_err(pg_err("naming a column type"))?;
            cols.push(Column { name: c.name().to_owned(), ty: row.get(0) });
        }
        Ok(cols)
    }

    fn table_columns(&mut self, table: &TableName) -> Result<Option<Vec<Column>>> {
        let mut sql = Sql::new();
        sql.push(
            "SELECT a.attname::text, format_type(a.atttypid, a.atttypmod) FROM pg_attribute a \
             JOIN pg_class c ON a.attrelid = c.oid JOIN pg_namespace n ON c.relnamespace = n.oid \
             WHERE n.nspname = ",
        )
        .param(Value::Text(table.schema.clone()))
        .push(" AND c.relname = ")
        .param(Value::Text(table.table.clone()))
        .push(" AND c.relkind IN ('r', 'p') AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum");
        let rows = self.query(&sql)?;
        if rows.rows.is_empty() {
            return Ok(None);
        }
        rows.rows
            .into_iter()
            .map(|r| match (&r[0], &r[1]) {
                (Value::Text(n), Value::Text(t)) => Ok(Column { name: n.clone(), ty: t.clone() }),
                _ => Err(Error::Internal(format!("pg_attribute returned {r:?}"))),
            })
            .map(|c| c.map(Some))
            .collect::<Result<Option<Vec<_>>>>()
    }

    fn relation_kind(&mut self, table: &TableName) -> Result<Option<String>> {
        // `table_columns` sees tables only: a view of the target's name
        // would look missing, and the run's CREATE TABLE would collide with it.
        let mut sql = Sql::new();
        sql.push("SELECT c.relkind::text FROM pg_class c JOIN pg_namespace n ON c.relnamespace = n.oid WHERE n.nspname = ")
            .param(Value::Text(table.schema.clone()))
            .push(" AND c.relname = ")
            .param(Value::Text(table.table.clone()));
        let rows = self.query(&sql)?;
        let kind = rows.rows.first().map(|r| text_of(&r[0])).unwrap_or_default();
        Ok(match kind.as_str() {
            "" | "r" | "p" => None,
            "v" => Some("a view".into()),
            "m" => Some("a materialized view".into()),
            "f" => Some("a foreign table".into()),
            "S" => Some("a sequence".into()),
            "i" | "I" => Some("an index".into()),
            "c" => Some("a composite type".into()),
            other => Some(format!("a relation of kind {other:?}")),
        })
    }

    /// A run's transaction is REPEATABLE READ: the guards, the input
    /// fingerprint and the write see one snapshot of the source, so a row
    /// committed to the source meanwhile is in none of them (the next run
    /// finds the input changed).
    fn begin(&mut self) -> Result<()> {
        let begin = self.begin;
        self.execute(&Sql::raw(begin))?;
        self.fresh = true;
        Ok(())
    }

    fn create_temp_table_as(&mut self, name: &str, query: &Sql) -> Result<u64> {
        // CREATE TABLE AS cannot take parameters here: create, then insert.
        let cols = self.describe(query)?;
        let defs: Vec<String> = cols.iter().map(|c| format!("{} {}", quote_ident(&c.name), c.ty)).collect();
        self.execute(&Sql::raw(format!("CREATE TEMPORARY TABLE {name} ({})", defs.join(", "))))?;
        let mut sql = Sql::new();
        sql.push(&format!("INSERT INTO {name} "));
        sql.text.push_str(&query.text);
        sql.params = query.params.clone();
        let rows = self.execute(&sql)?;
        // Autovacuum never analyzes temporary tables: without statistics the
        // planner guesses their size and picks nested loops over millions of
        // rows. A small sample does (the session's target is restored
        // whatever the outcome).
        self.execute(&Sql::raw(format!("SET default_statistics_target = {TEMP_STATISTICS}")))?;
        let analyzed = self.execute(&Sql::raw(format!("ANALYZE {name}")));
        // After a failed ANALYZE in a transaction the reset fails too (and
        // the transaction's end undoes the SET): the first error is the one.
        let reset = self.execute(&Sql::raw("RESET default_statistics_target".to_owned()));
        analyzed?;
        reset?;
        Ok(rows)
    }

    fn dialect(&self) -> &dyn Dialect {
        self
    }

    fn locks(&mut self) -> Option<&mut dyn Locks> {
        Some(self)
    }

    fn partition_exchange(&mut self) -> Option<&mut dyn PartitionExchange> {
        Some(self)
    }

    fn file_input(&mut self) -> Option<&mut dyn FileInput> {
        Some(self)
    }

    fn accelerator(&mut self) -> Option<&mut dyn Accelerator> {
        if self.accelerated {
            Some(self)
        } else {
            None
        }
    }
}

/// PostgreSQL's accelerated plan: the merge of an upsert-only batch in one
/// statement ([`merge`]), and a file source's day copied straight into the
/// target ([`Accelerator::insert_day`]); anything else declines before
/// writing, and the portable plan runs.
impl Accelerator for Postgres {
    /// A file source loaded as it is: its files copied straight into the
    /// target ([`Postgres::copy_day`]). Otherwise the plain `INSERT …
    /// SELECT`, with the guard scan run beside it on a second session that
    /// reads the run's snapshot ([`Postgres::insert_beside_scan`]): an
    /// `INSERT … RETURNING` that hashes its rows and gathers them costs
    /// more than the scan (0.5 to 0.66 s against 0.31 s for a 1M-row day),
    /// and the scan beside the insert costs almost nothing (BENCHMARKS.md).
    /// Declined where the source reads this session's temporary tables (a
    /// staged file source) or the database runs serializable transactions
    /// (the scan is then made in the run's own transaction).
    fn insert_day(&mut self, day: &DayInsert<'_>, steps: &mut dyn RunSteps) -> Result<Accelerated<TappedDay>> {
        if day.hashed.is_empty() {
            return Ok(Accelerated::Declined("no column to hash"));
        }
        if day.files_as_is && self.stage.as_ref().is_some_and(|s| !s.filled) {
            let hash = record_hash(day.hashed, |c| quote_ident(c));
            return self.copy_day(day, &hash, steps).map(Accelerated::Done);
        }
        if self.stage.is_some() || day.guard_scan.text.contains("__fixpoint") {
            return Ok(Accelerated::Declined("the source reads this session's staging table"));
        }
        if self.begin.contains("SERIALIZABLE") {
            return Ok(Accelerated::Declined("serializable transactions: the guard scan in the run's own"));
        }
        self.insert_beside_scan(day, steps)
    }

    fn merge(&mut self, m: &MergeRequest<'_>, steps: &mut dyn RunSteps) -> Result<Accelerated<Merged>> {
        if !merge::fits(self, m)? {
            return Ok(Accelerated::Declined("tombstones or audits: the portable plan"));
        }
        merge::merge(self, m, steps)
    }
}

impl Postgres {
    /// The day's `INSERT … SELECT`, and at the same time, on a second
    /// session that imports the run's snapshot (`pg_export_snapshot`), the
    /// guard scan of the source: both read the source as the run's
    /// transaction sees it, so the scan's rows are the inserted rows (the
    /// counts are compared; a difference rolls the run back), their hashes'
    /// sum the day's fingerprint (the plan defers its guards only where
    /// the target's columns are the source's). The scan runs without
    /// parallel workers: the insert is one process, and the scan, which
    /// reads what the insert reads and writes nothing, ends first on the
    /// other core. Declined, before anything is written, when the second
    /// session cannot be opened or cannot import the snapshot.
    fn insert_beside_scan(&mut self, day: &DayInsert<'_>, steps: &mut dyn RunSteps) -> Result<Accelerated<TappedDay>> {
        let snapshot = self.query(&Sql::raw("SELECT pg_export_snapshot() AS \"s\""))?;
        let snapshot = snapshot.single("the exported snapshot")?.value("s")?.as_str().unwrap_or_default().to_owned();
        // The server's identifier (hex digits and dashes), checked before it
        // goes into the statement that cannot take a parameter.
        if snapshot.is_empty() || !snapshot.chars().all(|c| c.is_ascii_hexdigit() || c == '-') {
            return Err(Error::Internal(format!("an exported snapshot named {snapshot:?}")));
        }
        let mut side = match self.side.take() {
            Some(side) => side,
            None => match Postgres::connect_waiting(&self.url, self.wait) {
                Ok(side) => Box::new(side),
                Err(_) => return Ok(Accelerated::Declined("no second session")),
            },
        };
        let import = format!("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY; SET TRANSACTION SNAPSHOT '{snapshot}'; SET LOCAL max_parallel_workers_per_gather = 0");
        if side.client().batch_execute(&import).is_err() {
            // Dropped (a broken session is not kept).
            return Ok(Accelerated::Declined("the second session could not import the run's snapshot"));
        }
        let insert = (day.insert)(&Sql::raw(day.partition.clone()));
        let (scanned, inserted) = std::thread::scope(|scope| {
            let scan = scope.spawn(|| side.query(day.guard_scan));
            let inserted = self.execute(&insert);
            (scan.join(), inserted)
        });
        let scanned = scanned.map_err(|_| Error::Internal("the guard scan's thread panicked".into()))?;
        let counted = scanned.and_then(|rows| {
            let row = rows.single("the guard scan")?;
            Ok((row.count(FP_ROWS)?, self.read_sum(row.value(FP_SUM)?)?, row.count("outside")?))
        });
        // An insert that failed on a row the guards refuse (a row of a day
        // with no partition, say): the guards' refusal, which names the
        // problem, made on the second session (the run's is aborted).
        let refused = match (&inserted, &counted) {
            (Err(_), Ok((rows, _, outside))) => (day.refuse)(&mut |sql| side.query(sql), *rows, *outside).err(),
            _ => None,
        };
        let ended = side.client().batch_execute("COMMIT");
        if ended.is_ok() && counted.is_ok() {
            self.side = Some(side);
        }
        if let Some(refusal) = refused {
            return Err(refusal);
        }
        let inserted = inserted?;
        let (rows_scanned, sum, outside) = counted?;
        steps.step("insert (guards and fingerprint scanned beside it)");
        if rows_scanned != inserted {
            return Err(Error::Internal(format!("{inserted} rows were inserted but the guard scan of the same snapshot saw {rows_scanned}; rolled back")));
        }
        Ok(Accelerated::Done(TappedDay { inserted, outside, sum, method: "delete+insert" }))
    }

    /// The day's files copied straight into the target (`COPY`, as by hand),
    /// then the day's rows counted and hashed: the day's old rows are
    /// deleted already, so the day holds exactly the rows copied unless
    /// some were of another day (or none), which are counted as outside
    /// (the run is then refused and rolled back).
    fn copy_day(&mut self, day: &DayInsert<'_>, hash: &str, steps: &mut dyn RunSteps) -> Result<TappedDay> {
        let mut stage = self.stage.take().expect("checked by the caller");
        let started = std::time::Instant::now();
        let copied = stage.pending.copy(self.client(), &day.target.quoted());
        fixpoint_core::run::protocol::trace_statement(started, "COPY the files into the target");
        self.stage = Some(stage);
        let copied = copied?;
        steps.step("insert (the files copied into the target)");
        let mut sql = Sql::new();
        sql.push(&format!("SELECT count(*) AS \"n\", coalesce(sum({hash}), 0) AS \"sum\" FROM {} WHERE {} = ", day.target.quoted(), quote_ident(day.column)));
        sql.typed_param(Value::Date(day.day), "DATE");
        let rows = self.query(&sql)?;
        let row = rows.single("the day's rows")?;
        let (in_day, sum) = (row.count("n")?, self.read_sum(row.value("sum")?)?);
        if in_day > copied {
            return Err(Error::Internal(format!("{copied} rows were copied but the day holds {in_day}; rolled back")));
        }
        steps.step("the day's guards and fingerprint");
        Ok(TappedDay { inserted: copied, outside: copied - in_day, sum, method: "delete+copy" })
    }
}

/// [`Dialect::native_row_hash`] of `columns`, each named by `name`.
fn record_hash(columns: &[Column], name: impl Fn(&str) -> String) -> String {
    let fields: Vec<String> = columns.iter().map(|c| record_field(&name(&c.name), &c.ty)).collect();
    format!("hashint8extended(hash_record_extended(ROW({}), 0), 0)", fields.join(", "))
}

/// One field of [`Dialect::native_row_hash`]'s record: the value itself
/// where its type's hash is the value's own (numbers, text in the `C`
/// collation, dates and times, booleans, UUIDs, bytes, `jsonb`), its text
/// otherwise.
fn record_field(expr: &str, ty: &str) -> String {
    let ty = ty.to_ascii_lowercase();
    let own = ["smallint", "integer", "bigint", "real", "double precision", "boolean", "date", "uuid", "bytea", "jsonb", "interval"];
    let own_prefix = ["numeric", "timestamp", "time without time zone", "time(", "interval"];
    let text_like = ["text", "character varying", "character", "bpchar", "varchar", "char("];
    if ty.ends_with(']') {
        format!("CAST({expr} AS TEXT) COLLATE \"C\"")
    } else if text_like.iter().any(|t| ty == *t || ty.starts_with(&format!("{t}("))) || ty.starts_with("char(") {
        format!("{expr} COLLATE \"C\"")
    } else if own.contains(&ty.as_str()) || own_prefix.iter().any(|p| ty.starts_with(p)) {
        expr.to_owned()
    } else {
        format!("CAST({expr} AS TEXT) COLLATE \"C\"")
    }
}

impl Dialect for Postgres {
    /// Each value hashed by its type's own hash function (`hash_record_extended`:
    /// no text is built, and no session setting such as the time zone or
    /// the date style enters), the record's hash then mixed once more
    /// (`hashint8extended`): the record hash is a linear sum of its
    /// fields' hashes, and summed over rows it would not tell two rows'
    /// values swapped between them. Values compare as their type compares
    /// them (`numeric` 1.5 and 1.50 alike; `real` -0 and 0 alike); text in
    /// the `C` collation, so a case-insensitive collation does not make
    /// 'A' and 'a' alike. A type without a hash of its own, or whose hash
    /// depends on the database (an enum's OID), is hashed by its text.
    fn native_row_hash(&self, alias: &str, columns: &[Column]) -> Option<String> {
        Some(record_hash(columns, |c| format!("{alias}.{}", quote_ident(c))))
    }

    fn native_hash_version(&self) -> u32 {
        2
    }

    fn portable_value(&self, expr: &str, column: &Column) -> (String, &'static str) {
        let ty = column.ty.to_ascii_lowercase();
        let (class, text) = if ["smallint", "integer", "bigint"].contains(&ty.as_str()) {
            ("int", format!("CAST({expr} AS TEXT)"))
        } else if ty.starts_with("numeric") {
            ("decimal", format!("CAST({expr} AS TEXT)"))
        } else if ty == "real" || ty == "double precision" {
            // The bits of the absolute value (fixpoint_core::fingerprint::write_float),
            // read as the binary send format writes them (big-endian IEEE 754).
            let x = format!("CAST({expr} AS DOUBLE PRECISION)");
            ("float", format!(
                "CASE WHEN {x} IS NULL THEN NULL WHEN {x} = 'NaN' THEN 'nan' WHEN {x} = 'Infinity' THEN 'inf' WHEN {x} = '-Infinity' THEN '-inf' WHEN {x} = 0 THEN '0' \
                 ELSE (CASE WHEN {x} < 0 THEN '-' ELSE '' END) || CAST(CAST(CAST(('x' || encode(float8send(abs({x})), 'hex')) AS bit(64)) AS BIGINT) AS TEXT) END"
            ))
        } else if ty.starts_with("character varying") || ty == "text" || ty.starts_with("character") {
            ("text", format!("CAST({expr} AS TEXT)"))
        } else if ty == "date" {
            // The text form (ISO: DateStyle is pinned per session) is
            // `YYYY-MM-DD` for years 1 to 9999 and twice as fast as to_char;
            // to_char elsewhere (BC, years past 9999, infinity), as before.
            ("date", format!("CASE WHEN {expr} BETWEEN DATE '0001-01-01' AND DATE '9999-12-31' THEN CAST({expr} AS TEXT) ELSE to_char({expr}, 'YYYY-MM-DD') END"))
        } else if ty.starts_with("timestamp without time zone") {
            // Microseconds since 1970 in integers: days times 86400000000,
            // plus the time of day (its seconds as a double times 10^6 are
            // within 2e-5 of the integer, so rounding gives it exactly); no
            // NUMERIC as extract(epoch) returns. Infinite and out-of-range
            // values fail, as extract's cast to BIGINT did.
            (
                "timestamp",
                format!(
                    "CAST((CAST({expr} AS DATE) - DATE '1970-01-01') * CAST(86400000000 AS BIGINT) \
                     + CAST(round(date_part('epoch', CAST({expr} AS TIME)) * 1000000) AS BIGINT) AS TEXT)"
                ),
            )
        } else if ty.starts_with("timestamp with time zone") {
            ("timestamptz", format!("CAST(CAST(extract(epoch FROM {expr}) * 1000000 AS BIGINT) AS TEXT)"))
        } else if ty == "boolean" {
            ("bool", format!("CASE WHEN {expr} THEN 't' WHEN NOT {expr} THEN 'f' END"))
        } else if ty == "bytea" {
            // Hex digits only: upper() in the C collation (the same letters,
            // without the locale's case mapping) is the cheap one.
            ("bytes", format!("upper(encode({expr}, 'hex') COLLATE \"C\")"))
        } else {
            ("other", format!("CAST({expr} AS TEXT)"))
        };
        (text, class)
    }

    fn portable_row_hash(&self, text_expr: &str) -> String {
        // The digest's first 8 bytes read little-endian (as DuckDB's
        // md5_number does), as an unsigned number. PostgreSQL has no
        // byte-order reversal, so the bytes are read one by one, which
        // names the digest eight times: it is computed once, in a subquery
        // that OFFSET 0 keeps from being merged into this one (merged, each
        // reference would build the row's text and hash it again).
        // The top byte's high bit is flipped, which makes the BIGINT the
        // unsigned value minus 2^63; adding 2^63 back as NUMERIC gives the
        // unsigned value without a CASE.
        let mut bytes = vec!["(CAST(get_byte(m.d, 7) # 128 AS BIGINT) << 56)".to_owned()];
        bytes.extend((1..7).rev().map(|i| format!("(CAST(get_byte(m.d, {i}) AS BIGINT) << {})", 8 * i)));
        bytes.push("get_byte(m.d, 0)".to_owned());
        format!(
            "(SELECT CAST({} AS NUMERIC) + 9223372036854775808 FROM (SELECT decode(md5({text_expr}), 'hex') AS d OFFSET 0) AS m)",
            bytes.join(" | ")
        )
    }

    fn portable_row_hash_direct(&self, alias: &str, columns: &[Column]) -> Option<String> {
        // The same text as the fields joined with `||`, built in one call
        // per 90 fields (concat_ws takes at most 100 arguments; every field
        // is coalesced, so none is skipped as NULL), without copying the
        // growing text at each `||`.
        let fields: Vec<String> = columns
            .iter()
            .map(|c| {
                let (text, class) = self.portable_value(&format!("{alias}.{}", quote_ident(&c.name)), c);
                fixpoint_core::engine::measure::portable_field(&text, class)
            })
            .collect();
        let chunks: Vec<String> = fields.chunks(90).map(|f| format!("concat_ws('|', {})", f.join(", "))).collect();
        let text = match chunks.len() {
            0 => return None,
            1 => chunks[0].clone(),
            _ => format!("concat_ws('|', {})", chunks.join(", ")),
        };
        Some(self.portable_row_hash(&text))
    }

    fn row_id(&self) -> Option<(&'static str, &'static str, bool)> {
        Some(("ctid", "tid", false))
    }

    fn fingerprint_before_writing(&self) -> bool {
        true
    }

    /// `random_page_cost` 1.1 (the value PostgreSQL's documentation gives
    /// for SSDs) for the rest of the transaction, unless it is set lower:
    /// with the default 4 the planner joins a 100k-key batch with a
    /// 10M-row table by hashing a full scan where index lookups take a
    /// third of the time. Without an index on the key it still scans.
    fn plan_key_lookups(&self) -> Option<&'static str> {
        Some("SELECT set_config('random_page_cost', CAST(least(CAST(current_setting('random_page_cost') AS FLOAT8), 1.1) AS TEXT), true)")
    }
}

impl Locks for Postgres {
    /// The run's lock, held to the end of its transaction. A REPEATABLE
    /// READ transaction takes its snapshot at its first statement, so a run
    /// that waited inside its transaction for another run would then read
    /// the state from before that run committed. When the lock is the
    /// transaction's first statement and another run holds it, the run
    /// leaves the transaction, waits for the lock as a session lock
    /// (bounded by `--wait`), and begins again holding it: its snapshot is
    /// taken after the other run committed.
    fn lock_scope(&mut self, scope: &str, wait: bool) -> Result<bool> {
        let fresh = std::mem::replace(&mut self.fresh, false);
        let lock_sql = |function: &str| {
            let mut sql = Sql::new();
            sql.push(&format!("SELECT {function}(hashtextextended(")).typed_param(Value::Text(scope.to_owned()), "TEXT").push(", 0))::text");
            sql
        };
        let took = |rows: Rows| matches!(rows.rows.first().map(|r| &r[0]), Some(Value::Text(t)) if t == "true" || t.is_empty());
        if !wait {
            let held = took(self.query(&lock_sql("pg_try_advisory_xact_lock"))?);
            if held {
                // --no-wait: a lock another session holds on what the run
                // writes is not waited for either, beyond the brief wait for
                // readers' statements that a partition swap needs (this
                // transaction only).
                let ms = lock_timeout_ms(self.wait.min(NO_WAIT));
                self.execute(&Sql::raw(format!("SET LOCAL lock_timeout = '{ms}ms'")))?;
            }
            return Ok(held);
        }
        if !fresh {
            // Not the transaction's first statement (the ledger's creation
            // lock): its snapshot is taken already; wait in place.
            self.query(&lock_sql("pg_advisory_xact_lock"))?;
            return Ok(true);
        }
        if took(self.query(&lock_sql("pg_try_advisory_xact_lock"))?) {
            return Ok(true);
        }
        self.execute(&Sql::raw("ROLLBACK"))?;
        self.query(&lock_sql("pg_advisory_lock"))?;
        let unlock = lock_sql("pg_advisory_unlock");
        let held = self.begin().and_then(|()| self.query(&lock_sql("pg_try_advisory_xact_lock")).map(took));
        let released = match &held {
            Ok(_) => self.query(&unlock).map(|_| ()),
            Err(_) => Ok(()),
        };
        if held.is_err() || released.is_err() {
            // Leave no session lock behind: it would outlive the run.
            let _ = self.execute(&Sql::raw("ROLLBACK"));
            let _ = self.query(&unlock);
            return Err(match (held, released) {
                (Err(e), _) | (_, Err(e)) => e,
                _ => Error::Internal("unreachable: an error without an error".into()),
            });
        }
        match held {
            Ok(true) => Ok(true),
            _ => Err(Error::Internal(format!("the run's lock {scope:?} was not granted to the session holding it"))),
        }
    }
}

impl PartitionExchange for Postgres {
    fn day_partition(&mut self, table: &TableName, column: &str, day: chrono::NaiveDate) -> Result<DayPartition> {
        let Some((strategy, natts, key, ty)) = self.partition_key(table)? else {
            return Ok(DayPartition::NotPartitioned);
        };
        if natts != 1 || key != column {
            return Ok(DayPartition::Unswappable(format!("{table} is partitioned by another key than {column}")));
        }
        if strategy != "l" && strategy != "r" {
            return Ok(DayPartition::Unswappable(format!("{table} is hash-partitioned")));
        }
        if ty != "date" {
            return Ok(DayPartition::Unswappable(format!("the partition column {column} is {ty}, not date")));
        }
        let mut sql = Sql::new();
        sql.push("SELECT count(*) FROM pg_attribute WHERE attgenerated <> '' AND attrelid = CAST(")
            .typed_param(Value::Text(table.quoted()), "TEXT")
            .push(" AS regclass)");
        if self.query(&sql)?.rows[0][0].as_i128() != Some(0) {
            return Ok(DayPartition::Unswappable(format!("{table} has generated columns")));
        }
        let mut sql = Sql::new();
        sql.push(
            "SELECT n.nspname::text, c.relname::text, c.relkind::text, pg_get_expr(c.relpartbound, c.oid) \
             FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid JOIN pg_namespace n ON n.oid = c.relnamespace \
             WHERE i.inhparent = CAST(",
        )
        .typed_param(Value::Text(table.quoted()), "TEXT")
        .push(" AS regclass) ORDER BY 2");
        // A concurrent run of another day may have detached and dropped its
        // partition since the run's snapshot (REPEATABLE READ) was taken:
        // pg_get_expr reads the bound from the current catalog, NULL for a
        // relation dropped meanwhile. Such a partition is another day's (this
        // day's partition changes only under this job's lock, taken before
        // the snapshot), so it is left out.
        let rows: Vec<_> = self.query(&sql)?.rows.into_iter().filter(|r| !matches!(r[3], Value::Null)).collect();
        let mut has_default = false;
        for r in rows {
            let text = text_of;
            let (schema, name, kind, bound) = (text(&r[0]), text(&r[1]), text(&r[2]), text(&r[3]));
            let part = TableName { schema, table: name };
            match Bound::parse(&bound) {
                Some(Bound::Default) => has_default = true,
                Some(b) if b.is_exactly(day) => {
                    if kind == "p" {
                        return Ok(DayPartition::Unswappable(format!("the day's partition {part} is itself partitioned")));
                    }
                    return Ok(DayPartition::Swappable { existing: Some(part) });
                }
                Some(b) if b.contains(day) => {
                    return Ok(DayPartition::Unswappable(format!("the day falls in partition {part} ({bound}), which holds more than one day")));
                }
                Some(_) => {}
                None => return Ok(DayPartition::Unswappable(format!("cannot read the bound of partition {part}: {bound}"))),
            }
        }
        if has_default {
            return Ok(DayPartition::Unswappable(format!(
                "{table} has no partition for {day} but has a default partition (attaching one would scan it); create the day's partition to use partition exchange"
            )));
        }
        Ok(DayPartition::Swappable { existing: None })
    }

    fn create_day_table(&mut self, table: &TableName, column: &str, day: chrono::NaiveDate) -> Result<TableName> {
        let suffix = day.format("_%Y%m%d_fixpoint").to_string();
        let mut head = table.table.clone();
        while head.len() + suffix.len() > 63 {
            head.pop();
        }
        let staged = TableName { schema: table.schema.clone(), table: head + &suffix };
        // The table is defined from the catalog (columns with their types,
        // collations and NOT NULL; the parent's CHECK constraints), not with
        // `LIKE parent`: LIKE would hold a lock on the parent until commit,
        // and two runs of different days would deadlock at their swaps.
        let mut sql = Sql::new();
        sql.push(
            "SELECT quote_ident(a.attname) || ' ' || format_type(a.atttypid, a.atttypmod) \
             || CASE WHEN a.attcollation <> 0 AND a.attcollation <> t.typcollation THEN ' COLLATE ' || CAST(CAST(a.attcollation AS regcollation) AS TEXT) ELSE '' END \
             || CASE WHEN a.attnotnull THEN ' NOT NULL' ELSE '' END \
             FROM pg_attribute a JOIN pg_type t ON t.oid = a.atttypid \
             WHERE a.attrelid = CAST(",
        )
        .typed_param(Value::Text(table.quoted()), "TEXT")
        .push(" AS regclass) AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum");
        let mut defs: Vec<String> = self.query(&sql)?.rows.into_iter().map(|r| text_of(&r[0])).collect();
        let mut sql = Sql::new();
        sql.push("SELECT 'CONSTRAINT ' || quote_ident(conname) || ' ' || pg_get_constraintdef(oid) FROM pg_constraint WHERE contype = 'c' AND conrelid = CAST(")
            .typed_param(Value::Text(table.quoted()), "TEXT")
            .push(" AS regclass) ORDER BY conname");
        defs.extend(self.query(&sql)?.rows.into_iter().map(|r| text_of(&r[0])));
        // DDL takes no parameters: the date is written from a typed date
        // (digits and dashes only), never from user text. This CHECK makes
        // ATTACH skip its validation scan; the table is empty now, so adding
        // it costs nothing, and each inserted row is checked against it.
        defs.push(format!("CONSTRAINT fixpoint_day CHECK ({col} IS NOT NULL AND {col} = DATE '{}')", day.format("%Y-%m-%d"), col = quote_ident(column)));
        self.execute(&Sql::raw(format!("CREATE TABLE {} ({})", staged.quoted(), defs.join(", "))))?;
        Ok(staged)
    }

    fn drop_partition(&mut self, table: &TableName, partition: &TableName) -> Result<()> {
        self.execute(&Sql::raw(format!("ALTER TABLE {} DETACH PARTITION {}", table.quoted(), partition.quoted())))?;
        self.execute(&Sql::raw(format!("DROP TABLE {}", partition.quoted())))?;
        Ok(())
    }

    fn attach_day(&mut self, table: &TableName, staged: &TableName, column: &str, day: chrono::NaiveDate, name: &str) -> Result<()> {
        let _ = column;
        let strategy = self.partition_key(table)?.map(|k| k.0).unwrap_or_default();
        let bound = if strategy == "r" {
            format!("FROM ('{}') TO ('{}')", day.format("%Y-%m-%d"), (day + chrono::Duration::days(1)).format("%Y-%m-%d"))
        } else {
            format!("IN ('{}')", day.format("%Y-%m-%d"))
        };
        self.execute(&Sql::raw(format!("ALTER TABLE {} ATTACH PARTITION {} FOR VALUES {bound}", table.quoted(), staged.quoted())))?;
        if staged.table != name {
            self.execute(&Sql::raw(format!("ALTER TABLE {} RENAME TO {}", staged.quoted(), quote_ident(name))))?;
        }
        Ok(())
    }
}

impl FileInput for Postgres {
    /// The files checked and the staging table created, empty: its rows are
    /// copied by the first statement that reads it ([`Stage`]).
    fn stage_files(&mut self, files: &fixpoint_core::job::files::InputFiles) -> Result<Sql> {
        self.stage = None;
        let pending = files::Pending::open(files)?;
        pending.create_stage(self.client())?;
        self.stage = Some(Stage { pending, filled: false, filled_in_transaction: false });
        Ok(Sql::raw(files::STAGE))
    }

    fn release_files(&mut self) -> Result<()> {
        self.stage = None;
        self.execute(&Sql::raw(format!("DROP TABLE IF EXISTS {}", files::STAGE))).map(|_| ())
    }
}

/// A text value, or "" for anything else (catalog reads).
fn text_of(v: &Value) -> String {
    match v {
        Value::Text(s) => s.clone(),
        _ => String::new(),
    }
}

/// A partition's bound on a date column, as `pg_get_expr(relpartbound)` writes it.
#[derive(Debug, PartialEq, Eq)]
enum Bound {
    Default,
    /// `FOR VALUES IN (…)`; `None` for NULL.
    List(Vec<Option<chrono::NaiveDate>>),
    /// `FOR VALUES FROM (a) TO (b)`; `None` for MINVALUE / MAXVALUE.
    Range(Option<chrono::NaiveDate>, Option<chrono::NaiveDate>),
}

impl Bound {
    fn parse(text: &str) -> Option<Bound> {
        fn value(v: &str) -> Option<Option<chrono::NaiveDate>> {
            let v = v.trim();
            if v.eq_ignore_ascii_case("NULL") || v.eq_ignore_ascii_case("MINVALUE") || v.eq_ignore_ascii_case("MAXVALUE") {
                return Some(None);
            }
            let v = v.strip_prefix('\'')?.strip_suffix('\'')?;
            chrono::NaiveDate::parse_from_str(v, "%Y-%m-%d").ok().map(Some)
        }
        let text = text.trim();
        if text == "DEFAULT" {
            return Some(Bound::Default);
        }
        if let Some(list) = text.strip_prefix("FOR VALUES IN (").and_then(|t| t.strip_suffix(')')) {
            return list.split(',').map(value).collect::<Option<Vec<_>>>().map(Bound::List);
        }
        let range = text.strip_prefix("FOR VALUES FROM (")?.strip_suffix(')')?;
        let (from, to) = range.split_once(") TO (")?;
        Some(Bound::Range(value(from)?, value(to)?))
    }

    fn is_exactly(&self, day: chrono::NaiveDate) -> bool {
        match self {
            Bound::List(v) => v.as_slice() == [Some(day)],
            Bound::Range(Some(a), Some(b)) => *a == day && *b == day + chrono::Duration::days(1),
            _ => false,
        }
    }

    fn contains(&self, day: chrono::NaiveDate) -> bool {
        match self {
            Bound::Default => false,
            Bound::List(v) => v.contains(&Some(day)),
            Bound::Range(a, b) => a.map_or(true, |a| a <= day) && b.map_or(true, |b| day < b),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{classify, record_field, Bound};

    /// Each type is hashed by its own hash or by its text, and text in the
    /// `C` collation.
    #[test]
    fn record_fields_by_type() {
        let own = ["integer", "bigint", "numeric(12,2)", "numeric", "double precision", "date", "timestamp without time zone", "timestamp(3) with time zone", "boolean", "uuid", "bytea", "jsonb", "interval"];
        for ty in own {
            assert_eq!(record_field("x", ty), "x", "{ty}");
        }
        for ty in ["text", "character varying(20)", "character varying", "character(3)"] {
            assert_eq!(record_field("x", ty), "x COLLATE \"C\"", "{ty}");
        }
        for ty in ["json", "integer[]", "numeric[]", "mood", "s.pos", "time with time zone", "xml", "point"] {
            assert_eq!(record_field("x", ty), "CAST(x AS TEXT) COLLATE \"C\"", "{ty}");
        }
    }

    #[test]
    fn partition_bounds() {
        let d = |s: &str| chrono::NaiveDate::parse_from_str(s, "%Y-%m-%d").unwrap();
        let day = d("2026-10-20");
        let b = Bound::parse("FOR VALUES IN ('2026-10-20')").unwrap();
        assert!(b.is_exactly(day) && b.contains(day));
        let b = Bound::parse("FOR VALUES IN ('2026-10-19', '2026-10-20')").unwrap();
        assert!(!b.is_exactly(day) && b.contains(day));
        assert_eq!(Bound::parse("FOR VALUES IN (NULL)"), Some(Bound::List(vec![None])));
        let b = Bound::parse("FOR VALUES FROM ('2026-10-20') TO ('2026-10-21')").unwrap();
        assert!(b.is_exactly(day) && !b.contains(d("2026-10-21")));
        let b = Bound::parse("FOR VALUES FROM ('2026-10-01') TO ('2026-11-01')").unwrap();
        assert!(!b.is_exactly(day) && b.contains(day) && !b.contains(d("2026-11-01")));
        let b = Bound::parse("FOR VALUES FROM (MINVALUE) TO ('2020-01-01')").unwrap();
        assert!(b.contains(d("1999-01-01")) && !b.contains(day));
        assert_eq!(Bound::parse("DEFAULT"), Some(Bound::Default));
        assert_eq!(Bound::parse("FOR VALUES WITH (modulus 4, remainder 0)"), None);
    }
    use fixpoint_core::{Error, ErrorClass};

    #[test]
    fn sqlstates_are_classified() {
        let e = classify("40001", "could not serialize access", "running `x`".into());
        assert!(matches!(e, Error::Transient { .. }));
        assert_eq!(e.to_string(), "postgres: running `x`: serialization failure: could not serialize access (SQLSTATE 40001)");
        assert!(matches!(classify("40P01", "deadlock", String::new()), Error::Transient { .. }));
        assert_eq!(classify("55P03", "lock timeout", "c".into()).class(), ErrorClass::Busy);
        let e = classify("42P01", "relation \"bronze.x\" does not exist", "c".into());
        assert_eq!(e.to_string(), "postgres: c: undefined table: relation \"bronze.x\" does not exist (SQLSTATE 42P01)");
        // A refused privilege is bad input, naming the object and the grant.
        let denied = classify("42501", "permission denied for table t", "running `DELETE FROM \"s\".\"t\"`".into());
        assert_eq!(denied.class(), ErrorClass::Input);
        assert_eq!(denied.to_string(), "postgres: permission denied for table t (SQLSTATE 42501): the user in --db lacks a privilege fixpoint needs");
        assert!(denied.hint().is_some_and(|h| h.starts_with("have the owner of table t grant it")), "{:?}", denied.hint());
        let owner = classify("42501", "must be owner of table t", "c".into());
        assert!(owner.hint().is_some_and(|h| h.starts_with("have the owner of table t grant it")), "{:?}", owner.hint());
        assert!(classify("57P01", "terminating connection", "c".into()).to_string().contains("connection lost"));
        // A concurrent CREATE … IF NOT EXISTS lost the race: retried.
        let race = classify("23505", "duplicate key value violates unique constraint \"pg_namespace_nspname_index\"", "running `CREATE SCHEMA IF NOT EXISTS \"fixpoint\"`".into());
        assert!(matches!(race, Error::Transient { .. }), "{race}");
        assert!(matches!(classify("23505", "duplicate key value violates unique constraint \"orders_pkey\"", "c".into()), Error::Database { .. }));
    }
}
