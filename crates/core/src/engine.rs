//! The small trait every engine implements. fixpoint's plans are written once
//! against it; an engine overrides a defaulted capability only where it can
//! do better (or says, with a typed error, that it cannot).

use crate::error::{Error, Result};
use crate::fingerprint::{Fingerprint, Method, PORTABLE_KIND};
use crate::ident::{quote_ident, TableName};
use chrono::NaiveDate;

use crate::sql::{RunParams, SourceTemplate, Sql, Value};

/// The message of a refusal raised inside a statement (a `MERGE`'s
/// condition): a batch key held in a partition the batch does not touch.
pub const REFUSED_IN_STATEMENT: &str = "fixpoint: a batch key is held in a partition the batch does not touch";

/// A column: name and the engine's type name.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Column {
    /// The column name.
    pub name: String,
    /// The engine's type, as it would be written in `CREATE TABLE`.
    pub ty: String,
}

/// Rows read back from an engine, with their column names.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Rows {
    /// Column names.
    pub columns: Vec<String>,
    /// Values, row by row.
    pub rows: Vec<Vec<Value>>,
}

/// How a table keeps one day's rows, for swapping the day in whole
/// (partition exchange) instead of deleting and inserting it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DayPartition {
    /// The table is not partitioned by the column: delete + insert.
    NotPartitioned,
    /// Partitioned, but this day cannot be swapped in whole (a partition
    /// spanning several days, a default partition, …): delete + insert, and why.
    Unswappable(String),
    /// The day can be swapped in: the partition holding exactly this day,
    /// or `None` when no partition holds it yet (one is created).
    Swappable {
        /// The day's partition, when it exists.
        existing: Option<TableName>,
    },
}

/// A connection to a database that can run fixpoint's plans.
pub trait Engine {
    /// A short name for messages (`duckdb`, `postgres`).
    fn name(&self) -> &'static str;

    /// The engine and its version, e.g. `duckdb v1.4.1`.
    fn version(&mut self) -> Result<String>;

    /// Runs a statement; returns the rows it changed.
    fn execute(&mut self, sql: &Sql) -> Result<u64>;

    /// Runs a query and reads every row.
    fn query(&mut self, sql: &Sql) -> Result<Rows>;

    /// Starts a transaction.
    fn begin(&mut self) -> Result<()> {
        self.execute(&Sql::raw("BEGIN")).map(|_| ())
    }

    /// Commits the transaction.
    fn commit(&mut self) -> Result<()> {
        self.execute(&Sql::raw("COMMIT")).map(|_| ())
    }

    /// Rolls the transaction back.
    fn rollback(&mut self) -> Result<()> {
        self.execute(&Sql::raw("ROLLBACK")).map(|_| ())
    }

    /// The columns a query returns, without running it to completion.
    fn describe(&mut self, query: &Sql) -> Result<Vec<Column>>;

    /// A table's columns, or `None` when it does not exist. Must not fail
    /// for a missing table (inside a transaction a failed statement aborts it).
    fn table_columns(&mut self, table: &TableName) -> Result<Option<Vec<Column>>>;

    /// What `table` is when it exists but is not a table a run can write
    /// (`"a view"`, `"a materialized view"`, `"a foreign table"`, …), so a
    /// run refuses it before anything is written; `None` when it is a
    /// table or does not exist. Must not fail for a missing name (nor
    /// abort a transaction). The default knows no other kind of relation.
    fn relation_kind(&mut self, table: &TableName) -> Result<Option<String>> {
        let _ = table;
        Ok(None)
    }

    /// Takes a lock on `scope` until the transaction ends, so two runs of one
    /// job and partition serialize (an orchestrator that fires twice). With
    /// `wait = false`, returns `false` at once when another run holds it.
    /// The default does nothing: an engine with one writer (DuckDB) is fenced
    /// already.
    fn lock_scope(&mut self, scope: &str, wait: bool) -> Result<bool> {
        let _ = (scope, wait);
        Ok(true)
    }

    /// Whether `table` is partitioned by `column` so that `day`'s rows can be
    /// swapped in whole. Called inside the run's transaction, after its lock.
    fn day_partition(&mut self, table: &TableName, column: &str, day: NaiveDate) -> Result<DayPartition> {
        let _ = (table, column, day);
        Ok(DayPartition::NotPartitioned)
    }

    /// Creates an empty standalone table shaped like `table`, to hold `day`'s
    /// new rows before they are swapped in; returns its name.
    fn create_day_table(&mut self, table: &TableName, column: &str, day: NaiveDate) -> Result<TableName> {
        let _ = (table, column, day);
        Err(Error::Unsupported { engine: self.name(), capability: "partition exchange".into() })
    }

    /// Detaches `partition` from `table` and drops it (the day's old rows).
    fn drop_partition(&mut self, table: &TableName, partition: &TableName) -> Result<()> {
        let _ = (table, partition);
        Err(Error::Unsupported { engine: self.name(), capability: "partition exchange".into() })
    }

    /// Attaches `staged` to `table` as the partition of `day` (by `column`),
    /// renamed to `name`.
    fn attach_day(&mut self, table: &TableName, staged: &TableName, column: &str, day: NaiveDate, name: &str) -> Result<()> {
        let _ = (table, staged, column, day, name);
        Err(Error::Unsupported { engine: self.name(), capability: "partition exchange".into() })
    }

    /// Makes a file source's files readable by the source query as `input`
    /// for this connection; returns the relation (a FROM item, with bound
    /// parameters). DuckDB reads the files itself; other engines stage them.
    fn file_input(&mut self, files: &crate::files::InputFiles) -> Result<Sql> {
        let _ = files;
        Err(Error::Unsupported { engine: self.name(), capability: "file sources".into() })
    }

    /// Drops what [`Engine::file_input`] staged (nothing, where nothing was).
    fn release_file_input(&mut self) -> Result<()> {
        Ok(())
    }

    /// Whether `replace_partition` should fingerprint the source in its guard
    /// scan rather than the partition after writing. DuckDB: no (the guard
    /// then only counts, and the partition is hashed once, warm). PostgreSQL:
    /// yes (finding the day's rows again in the target is another scan).
    fn fingerprint_before_writing(&self) -> bool {
        false
    }

    /// A pseudo-column naming one row of a table (DuckDB `rowid`, PostgreSQL
    /// `ctid`), its type, and whether it stays the same when the row is
    /// updated (for the sandboxed mutation check of `prove`).
    fn row_id(&self) -> (&'static str, &'static str, bool) {
        ("rowid", "BIGINT", true)
    }

    /// Creates a temporary table `name` (already quoted) holding `query`'s
    /// rows; returns how many.
    fn create_temp_table_as(&mut self, name: &str, query: &Sql) -> Result<u64> {
        let mut sql = Sql::new();
        sql.push(&format!("CREATE TEMPORARY TABLE {name} AS "));
        sql.text.push_str(&query.text);
        sql.params = query.params.clone();
        self.execute(&sql)
    }

    /// An expression hashing one row of `alias` over `columns` to a 64-bit
    /// integer, natively; `None` when the engine has no such hash.
    fn native_row_hash(&self, alias: &str, columns: &[Column]) -> Option<String>;

    /// The canonical text of one (non-NULL) value for portable fingerprints,
    /// and its type class (`int`, `decimal`, `float`, `text`, `date`,
    /// `timestamp`, `timestamptz`, `bool`, `bytes`, `other`), which goes into
    /// the signature. The framing (tag, length, NULL marker) is added here.
    fn portable_value(&self, expr: &str, column: &Column) -> (String, &'static str);

    /// An expression hashing a canonical row text to a 64-bit integer (the
    /// first 64 bits of its MD5, as an unsigned number).
    fn portable_row_hash(&self, text_expr: &str) -> String;

    /// An expression with the same value as [`Engine::portable_row_hash`]
    /// of the row's canonical text, computed a faster way than building the
    /// text in SQL (DuckDB: a scalar function written in Rust); `None` where
    /// the engine has none.
    fn portable_row_hash_direct(&self, alias: &str, columns: &[Column]) -> Option<String> {
        let _ = (alias, columns);
        None
    }

    /// A tap on the next `INSERT … SELECT` of a run's rows: an expression to
    /// select as the partition column in place of `value` (the source's
    /// DATE column, e.g. `s."dt"`), which passes it through and, as the rows
    /// stream into the target, counts them, counts those whose partition is
    /// not `day`, and sums their native row hashes over `hashed` (columns of
    /// `alias`). Returns the expression and a token for
    /// [`Engine::tap_close`]; `None` where the engine has no tap (the guards
    /// and the fingerprint then scan on their own).
    fn tap_partition(&mut self, value: &str, alias: &str, hashed: &[Column], day: NaiveDate) -> Option<(Sql, u64)> {
        let _ = (value, alias, hashed, day);
        None
    }

    /// A counting tap: a BOOLEAN expression, TRUE for each row where `hash`
    /// (a UBIGINT expression, typically a native row hash under a CASE) is
    /// not NULL and NULL where it is, that counts those rows and sums the
    /// hashes as it is evaluated. It goes where the engine evaluates it
    /// exactly once per row: a projection, or a `MERGE … WHEN … AND`
    /// condition. Closed with [`Engine::tap_close`] (the middle figure is
    /// 0); `None` where the engine has no taps.
    fn tap_rows(&mut self, hash: &Sql) -> Option<(Sql, u64)> {
        let _ = hash;
        None
    }

    /// A counting condition: a BOOLEAN expression that is `cond` (FALSE
    /// where NULL), counts the rows where it is TRUE (closed with
    /// [`Engine::tap_close`]: (rows, 0, 0)), and fails the statement with
    /// [`REFUSED_IN_STATEMENT`] on a row where `cond` is TRUE and `allowed`
    /// is not. `None` where the engine has none.
    fn tap_if(&mut self, cond: &str, allowed: &str) -> Option<(Sql, u64)> {
        let _ = (cond, allowed);
        None
    }

    /// A dedup tap: a BOOLEAN expression (TRUE) that counts the rows it
    /// is evaluated on and sums `hash` (UBIGINT) over them, and finds ties:
    /// two rows with the same `pair` (a hash of key and version) whose
    /// `row` hashes (NULL: not compared) differ. No argument may be a NULL
    /// DuckDB can fold: the call would be skipped and its rows not counted. Closed with
    /// [`Engine::tap_close`]: (rows, ties, sum); ties is at least 1 when the
    /// tap could not remember every pair. `None` where the engine has no
    /// taps.
    fn tap_dedup(&mut self, hash: &str, pair: &str, row: &str) -> Option<(Sql, u64)> {
        let _ = (hash, pair, row);
        None
    }

    /// Whether `MERGE` conditions may raise `error('message')` (a refusal
    /// inside the statement, so it needs no join of its own) and hold taps
    /// ([`Engine::tap_rows`], [`Engine::tap_dedup`]).
    fn merge_refuses_in_statement(&self) -> bool {
        false
    }

    /// Whether an upsert-only merge may first try the plan that is one
    /// `MERGE` over the dedup, every check in its clauses (needs
    /// [`Engine::merge_refuses_in_statement`]).
    fn merge_in_one_statement(&self) -> bool {
        false
    }

    /// Whether a value of type `from`, cast to `to`, has the same native
    /// row hash contribution as before the cast (the same physical value),
    /// so a row hashed as read is hashed as written. The same type
    /// always; an engine may know more.
    fn same_native_hash(&self, from: &str, to: &str) -> bool {
        from.eq_ignore_ascii_case(to)
    }

    /// What the tap saw: (rows whose partition was not NULL, of those the
    /// rows outside `day`, the sum of their row hashes).
    fn tap_close(&mut self, token: u64) -> Option<(u64, u64, i128)> {
        let _ = token;
        None
    }

    /// Whether `table` has all of `columns`, where the engine knows it
    /// without a statement (DuckDB: what it described, or its appender's
    /// lookup, ~0.05 ms against ~0.8 for a `DESCRIBE`). `None`: not known
    /// so; the caller asks [`Engine::table_columns`].
    fn table_has_columns(&mut self, table: &TableName, columns: &[&str]) -> Option<bool> {
        let _ = (table, columns);
        None
    }

    /// Appends one row to `table` in the current transaction, the named
    /// columns given `values` typed as those columns, where the engine has
    /// a way faster than an `INSERT` statement (DuckDB's appender: nothing
    /// parsed, bound or planned; ~1.2 ms less in a fresh process, 1 % of a
    /// merge). `None`: it has none, and the caller runs the `INSERT`.
    fn append_row(&mut self, table: &TableName, columns: &[&str], values: &[Value]) -> Option<Result<()>> {
        let _ = (table, columns, values);
        None
    }

    /// Declares that the counting tap `trigger` ([`Engine::tap_rows`]) sees
    /// its first row only once the dedup tap `dedup` has seen its last (it
    /// sits above a blocking window over it): the engine may then count the
    /// dedup tap's ties while the statement goes on. A row that reaches the
    /// dedup tap later makes its count report a tie. A no-op by default.
    fn tap_ties_after(&mut self, trigger: u64, dedup: u64) {
        let _ = (trigger, dedup);
    }

    /// [`Engine::tap_close`] of a dedup tap, its ties still being counted
    /// when it returns: (rows, sum, a function that waits for the ties).
    /// The caller does its last statements before it asks.
    fn tap_close_dedup_deferred(&mut self, token: u64) -> Option<(u64, i128, Box<dyn FnOnce() -> u64 + Send>)> {
        self.tap_close(token).map(|(rows, ties, sum)| (rows, sum, Box::new(move || ties) as Box<dyn FnOnce() -> u64 + Send>))
    }

    /// The columns of `table` that have a DEFAULT, with its expression
    /// (from `information_schema.columns`), for the lint of generated keys.
    fn column_defaults(&mut self, table: &TableName) -> Result<Vec<(String, String)>> {
        let mut sql = Sql::new();
        sql.push("SELECT column_name, CAST(column_default AS VARCHAR) FROM information_schema.columns WHERE table_schema = ")
            .param(Value::Text(table.schema.clone()))
            .push(" AND table_name = ")
            .param(Value::Text(table.table.clone()))
            .push(" AND column_default IS NOT NULL");
        let rows = self.query(&sql)?;
        Ok(rows.rows.into_iter().filter_map(|r| Some((r.first()?.as_str()?.to_owned(), r.get(1)?.as_str()?.to_owned()))).collect())
    }

    /// Whether statements can be grouped in one transaction. Engines
    /// without multi-statement transactions (Spark on plain files) run the
    /// plans of [`crate::overwrite`] instead: stage the input once, check
    /// it, then replace whole partitions in one statement each, under a
    /// lease ([`Engine::acquire_lease`]).
    fn transactional(&self) -> bool {
        true
    }

    /// Takes a lease on `scope` that holds across statements until
    /// [`Engine::release_lease`] (for engines without transactions, where
    /// [`Engine::lock_scope`] cannot last). With `wait`, waits while another
    /// run holds it. `Ok(Err(holder))` when another run holds it (`holder`
    /// says which, since when, until when).
    fn acquire_lease(&mut self, scope: &str, wait: bool) -> Result<std::result::Result<(), String>> {
        let _ = (scope, wait);
        Err(Error::Unsupported { engine: self.name(), capability: "leases".into() })
    }

    /// Releases a lease taken by [`Engine::acquire_lease`] (nothing when not held).
    fn release_lease(&mut self, scope: &str) -> Result<()> {
        let _ = scope;
        Ok(())
    }

    /// Materializes `query` once as the relation `name` (already quoted),
    /// visible to this connection only, for the plans of
    /// [`crate::overwrite`] (Spark: a cached temporary view).
    fn stage(&mut self, name: &str, query: &Sql) -> Result<()> {
        self.create_temp_table_as(name, query).map(|_| ())
    }

    /// Drops what [`Engine::stage`] made (nothing when it is gone).
    fn unstage(&mut self, name: &str) -> Result<()> {
        self.execute(&Sql::raw(format!("DROP TABLE IF EXISTS {name}"))).map(|_| ())
    }

    /// Creates `table` with `columns`, stored partitioned by `partition`
    /// where the engine partitions tables by value (Spark: `PARTITIONED
    /// BY`); other engines make a plain table.
    fn create_table(&mut self, table: &TableName, columns: &[Column], partition: Option<&str>) -> Result<()> {
        let _ = partition;
        let cols: Vec<String> = columns.iter().map(|c| format!("{} {}", quote_ident(&c.name), c.ty)).collect();
        self.execute(&Sql::raw(format!("CREATE TABLE {} ({})", table.quoted(), cols.join(", ")))).map(|_| ())
    }

    /// Adds a column to a table, unless it has it.
    fn add_column(&mut self, table: &TableName, column: &Column) -> Result<()> {
        let sql = format!("ALTER TABLE {} ADD COLUMN IF NOT EXISTS {} {}", table.quoted(), quote_ident(&column.name), column.ty);
        self.execute(&Sql::raw(sql)).map(|_| ())
    }

    /// The columns `table` is stored partitioned by (Spark's `PARTITIONED
    /// BY`), whose partitions can be overwritten whole; none for others.
    fn partition_columns(&mut self, table: &TableName) -> Result<Vec<String>> {
        let _ = table;
        Ok(Vec::new())
    }

    /// Replaces, in one statement, every partition of `table` that rows of
    /// `select` fall in with those rows (`columns` in `select`'s order):
    /// partitions it has no row for are left alone (Spark: `INSERT
    /// OVERWRITE` with dynamic partition overwrite). Unpartitioned: the
    /// whole table.
    fn overwrite_partitions(&mut self, table: &TableName, columns: &[String], select: &Sql) -> Result<()> {
        let _ = (table, columns, select);
        Err(Error::Unsupported { engine: self.name(), capability: "partition overwrite".into() })
    }

    /// Drops the partition `column = value` of `table` with its rows, if it exists.
    fn drop_partition_value(&mut self, table: &TableName, column: &str, value: &Value, ty: &str) -> Result<()> {
        let _ = (table, column, value, ty);
        Err(Error::Unsupported { engine: self.name(), capability: "partition overwrite".into() })
    }

    /// The SQL name of the text type to cast to (`VARCHAR`; Spark: `STRING`).
    fn text_type(&self) -> &'static str {
        "VARCHAR"
    }

    /// Reads a sum from a query result into an i128.
    fn read_sum(&self, v: &Value) -> Result<i128> {
        v.as_i128().ok_or_else(|| Error::Internal(format!("{}: a checksum sum came back as {v:?}", self.name())))
    }
}

/// The fingerprint kind of `method` on `engine`.
pub fn fingerprint_kind(engine: &mut dyn Engine, method: Method) -> Result<String> {
    Ok(match method {
        Method::Native => format!("native-v1/{}", engine.version()?),
        Method::Portable => PORTABLE_KIND.to_owned(),
    })
}

/// An expression hashing one row of `alias` over `columns` to a 64-bit
/// value, with the fingerprint kind and the column signature.
pub fn row_hash(engine: &mut dyn Engine, method: Method, alias: &str, columns: &[Column]) -> Result<(String, String, Vec<String>)> {
    let kind = fingerprint_kind(engine, method)?;
    let (hash, signature) = match method {
        Method::Native => {
            let hash = engine.native_row_hash(alias, columns).ok_or_else(|| Error::Unsupported {
                engine: engine.name(),
                capability: "a native row hash (use --portable)".into(),
            })?;
            (hash, columns.iter().map(|c| format!("{} {}", c.name, c.ty)).collect())
        }
        Method::Portable => {
            let mut parts = Vec::new();
            let mut signature = Vec::new();
            for c in columns {
                let (text, class) = engine.portable_value(&format!("{alias}.{}", quote_ident(&c.name)), c);
                parts.push(portable_field(&text, class));
                signature.push(format!("{} {class}", c.name));
            }
            let hash = match engine.portable_row_hash_direct(alias, columns) {
                Some(direct) if !columns.is_empty() => direct,
                _ => {
                    let row = if parts.is_empty() { "''".to_owned() } else { parts.join(" || '|' || ") };
                    engine.portable_row_hash(&row)
                }
            };
            (hash, signature)
        }
    };
    Ok((hash, kind, signature))
}

/// One value's canonical text as a field of the portable encoding: fields
/// are joined with `|`; NULL is `\N`; in text, `\` and `|` are escaped with
/// a backslash (no other class's canonical text holds either), so no two
/// rows encode alike and NULL differs from '' and from the text `\N`.
pub fn portable_field(text: &str, class: &str) -> String {
    if class == "text" || class == "other" {
        format!("coalesce(replace(replace({text}, '\\', '\\\\'), '|', '\\|'), '\\N')")
    } else {
        format!("coalesce({text}, '\\N')")
    }
}

/// The pieces of a fingerprint query over rows of `alias`: the select list
/// `count(*), sum(<row hash>)` and the signature.
pub fn fingerprint_select(
    engine: &mut dyn Engine,
    method: Method,
    alias: &str,
    columns: &[Column],
) -> Result<(String, String, Vec<String>)> {
    let (hash, kind, signature) = row_hash(engine, method, alias, columns)?;
    let select = if columns.is_empty() { "count(*), 0".to_owned() } else { format!("count(*), sum({hash})") };
    Ok((select, kind, signature))
}

/// Rows to fingerprint or scan: a table or the job's source query.
pub enum Scope<'a> {
    /// A table, optionally filtered.
    Table {
        /// The table.
        table: &'a TableName,
        /// Only rows where this holds.
        filter: Option<Filter<'a>>,
    },
    /// The job's source query for one run.
    Source {
        /// The query.
        template: &'a SourceTemplate,
        /// The run's parameter values.
        params: &'a RunParams,
    },
}

/// A row filter.
pub enum Filter<'a> {
    /// `column = <date>`, with the date bound as a parameter.
    DateEquals(&'a str, NaiveDate),
    /// A user's condition, already checked by [`crate::sql::check_predicate`].
    Predicate(&'a str),
}

impl Scope<'_> {
    /// Appends `<from> AS alias [WHERE …]` to `sql`, binding parameters in order.
    pub fn write_from(&self, sql: &mut Sql, alias: &str) {
        match self {
            Scope::Table { table, filter } => {
                sql.push(&table.quoted()).push(" AS ").push(alias);
                match filter {
                    None => {}
                    Some(Filter::DateEquals(col, d)) => {
                        sql.push(" WHERE ").push(alias).push(".").ident(col).push(" = ");
                        sql.typed_param(Value::Date(*d), "DATE");
                    }
                    Some(Filter::Predicate(p)) => {
                        sql.push(" WHERE (").push(p).push(")");
                    }
                }
            }
            Scope::Source { template, params } => {
                sql.push("(");
                template.render_into(sql, params);
                sql.push("\n) AS ").push(alias);
            }
        }
    }
}

/// Fingerprints the rows of `scope` over `columns`.
pub fn fingerprint(engine: &mut dyn Engine, method: Method, scope: &Scope<'_>, columns: &[Column]) -> Result<Fingerprint> {
    let alias = "fp";
    let (select, kind, signature) = fingerprint_select(engine, method, alias, columns)?;
    let mut sql = Sql::new();
    sql.push("SELECT ").push(&select).push(" FROM ");
    scope.write_from(&mut sql, alias);
    let rows = engine.query(&sql)?;
    let row = rows.rows.first().ok_or_else(|| Error::Internal("a fingerprint query returned no row".into()))?;
    let count = row[0].as_u64().ok_or_else(|| Error::Internal(format!("bad count {:?}", row[0])))?;
    let sum = engine.read_sum(&row[1])?;
    Ok(Fingerprint::from_sum(&kind, &signature, count, sum))
}

/// A short, one-line description of a statement for error context.
pub fn statement_context(sql: &str) -> String {
    let one_line: String = sql.split_whitespace().collect::<Vec<_>>().join(" ");
    if one_line.chars().count() > 120 {
        format!("running `{}…`", one_line.chars().take(120).collect::<String>())
    } else {
        format!("running `{one_line}`")
    }
}
