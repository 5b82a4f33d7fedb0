//! The small trait every engine implements. fixpoint's plans are written once
//! against it; an engine overrides a defaulted capability only where it can
//! do better (or says, with a typed error, that it cannot).

use crate::error::{Error, Result};
use crate::job::ident::{quote_ident, TableName};

mod capabilities;
mod dialect;
mod rows;

pub use capabilities::{Accelerator, DayPartition, FileInput, Leases, Locks, PartitionExchange};
pub use dialect::Dialect;
pub use rows::{Column, Row, Rows};

use crate::job::sql::{Sql, Value};

/// The message of a refusal raised inside a statement (a `MERGE`'s
/// condition): a batch key held in a partition the batch does not touch.
pub const REFUSED_IN_STATEMENT: &str = "fixpoint: a batch key is held in a partition the batch does not touch";




/// A connection to a database that can run fixpoint's plans.

/// A connection to a database that can run fixpoint's plans: statements,
/// transactions, what tables and queries look like, and the SQL it writes
/// its own way ([`Dialect`]). What only some engines can do is a
/// capability, reached through an accessor that returns `None` where the
/// engine has none; returning `None` is never wrong (the plans then take
/// the portable path).
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

    /// Creates a temporary table `name` (already quoted) holding `query`'s
    /// rows; returns how many.
    fn create_temp_table_as(&mut self, name: &str, query: &Sql) -> Result<u64> {
        let mut sql = Sql::new();
        sql.push(&format!("CREATE TEMPORARY TABLE {name} AS "));
        sql.text.push_str(&query.text);
        sql.params = query.params.clone();
        self.execute(&sql)
    }

    /// Adds a column to a table, unless it has it.
    fn add_column(&mut self, table: &TableName, column: &Column) -> Result<()> {
        let sql = format!("ALTER TABLE {} ADD COLUMN IF NOT EXISTS {} {}", table.quoted(), quote_ident(&column.name), column.ty);
        self.execute(&Sql::raw(sql)).map(|_| ())
    }

    /// The SQL this engine writes its own way: row hashes, text, sums.
    fn dialect(&self) -> &dyn Dialect;

    /// Locks that serialize two runs of one scope ([`Locks`]); `None`:
    /// the engine has one writer (DuckDB), fenced already.
    fn locks(&mut self) -> Option<&mut dyn Locks> {
        None
    }

    /// Swapping a day's partition in whole ([`PartitionExchange`]).
    fn partition_exchange(&mut self) -> Option<&mut dyn PartitionExchange> {
        None
    }

    /// Reading a file source's files ([`FileInput`]).
    fn file_input(&mut self) -> Option<&mut dyn FileInput> {
        None
    }

    /// The leased plans of engines without multi-statement transactions
    /// ([`Leases`]); `None`: the engine has transactions.
    fn leases(&mut self) -> Option<&mut dyn Leases> {
        None
    }

    /// Faster plans for some runs ([`Accelerator`]).
    fn accelerator(&mut self) -> Option<&mut dyn Accelerator> {
        None
    }
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

/// Runs `sql`, a query returning one row, and reads the count in `column`;
/// `what` names the query in errors.
pub fn query_count(engine: &mut dyn Engine, sql: &Sql, column: &str, what: &str) -> Result<u64> {
    engine.query(sql)?.single(what)?.count(column)
}

/// Takes the lock of `scope` ([`Locks::lock_scope`]); an engine without
/// locks has one writer, fenced already: `true`.
pub fn lock_scope(engine: &mut dyn Engine, scope: &str, wait: bool) -> Result<bool> {
    match engine.locks() {
        Some(locks) => locks.lock_scope(scope, wait),
        None => Ok(true),
    }
}

/// The engine's [`FileInput`], or the error naming the missing capability.
pub fn file_input(engine: &mut dyn Engine) -> Result<&mut dyn FileInput> {
    let name = engine.name();
    engine.file_input().ok_or_else(|| Error::Unsupported { engine: name, capability: "file sources".into() })
}

/// The engine's [`PartitionExchange`], or the error naming the missing
/// capability.
pub fn partition_exchange(engine: &mut dyn Engine) -> Result<&mut dyn PartitionExchange> {
    let name = engine.name();
    engine.partition_exchange().ok_or_else(|| Error::Unsupported { engine: name, capability: "partition exchange".into() })
}
