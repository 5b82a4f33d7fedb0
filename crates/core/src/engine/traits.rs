//! The engine traits: [`Engine`], what every engine does, and what only
//! some can do, each an intent-level trait reached through an accessor of
//! [`Engine`] that returns `None` where the engine cannot. Each extends the
//! engine, so a plan holding one runs its statements on the same
//! connection. (One module: the engine names its capabilities, and each
//! capability extends the engine.)

use chrono::NaiveDate;

use crate::engine::accel::{Accelerated, DayInsert, MergeRequest, Merged, RunSteps, TappedDay};
use crate::engine::dialect::Dialect;
use crate::engine::rows::{Column, Rows};
use crate::error::{Error, Result};
use crate::job::files::InputFiles;
use crate::job::ident::{quote_ident, TableName};
use crate::job::sql::{Sql, Value};

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

/// Locks that serialize two runs of one scope (an orchestrator that fires
/// twice): PostgreSQL's advisory locks.
pub trait Locks: Engine {
    /// Takes a lock on `scope` until the transaction ends, so two runs of one
    /// job and partition serialize (an orchestrator that fires twice). With
    /// `wait = false`, returns `false` at once when another run holds it.
    fn lock_scope(&mut self, scope: &str, wait: bool) -> Result<bool>;
}

/// A day swapped in whole (PostgreSQL: detach the old partition, attach
/// the new one) instead of deleted and inserted.
pub trait PartitionExchange: Engine {
    /// Whether `table` is partitioned by `column` so that `day`'s rows can be
    /// swapped in whole. Called inside the run's transaction, after its lock.
    fn day_partition(&mut self, table: &TableName, column: &str, day: NaiveDate) -> Result<DayPartition>;

    /// Creates an empty standalone table shaped like `table`, to hold `day`'s
    /// new rows before they are swapped in; returns its name.
    fn create_day_table(&mut self, table: &TableName, column: &str, day: NaiveDate) -> Result<TableName>;

    /// Detaches `partition` from `table` and drops it (the day's old rows).
    fn drop_partition(&mut self, table: &TableName, partition: &TableName) -> Result<()>;

    /// Attaches `staged` to `table` as the partition of `day` (by `column`),
    /// renamed to `name`.
    fn attach_day(&mut self, table: &TableName, staged: &TableName, column: &str, day: NaiveDate, name: &str) -> Result<()>;
}

/// A file source's files made readable by the source query.
pub trait FileInput: Engine {
    /// Makes a file source's files readable by the source query as `input`
    /// for this connection; returns the relation (a FROM item, with bound
    /// parameters). DuckDB reads the files itself; other engines stage them.
    fn stage_files(&mut self, files: &InputFiles) -> Result<Sql>;

    /// Drops what [`FileInput::stage_files`] staged (nothing, where nothing was).
    fn release_files(&mut self) -> Result<()>;
}

/// What a write observed on the rows it wrote ([`ObservedWrites`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Observed {
    /// The rows written.
    pub rows: u64,
    /// The sum of their native row hashes over the input's columns.
    pub input_sum: i128,
    /// The sum of their native row hashes over the output's columns, each
    /// value as stored in the table.
    pub output_sum: i128,
}

/// Writes whose job computes aggregates over the rows as it writes them
/// (Spark: a `CollectMetrics` under the write), so a plan reads its source
/// once: no scan for the input fingerprint before, none for the output's
/// after.
pub trait ObservedWrites {
    /// Writes the rows of `select` (every column of `table`, in the
    /// table's order, by position) over the partitions they fall in, as
    /// [`Leases::overwrite_partitions`] does, and returns, from the same
    /// job, their count and the sums of the native row hash over `input`
    /// (columns of `select`, as they are) and over `output` (columns of
    /// `select`, each cast to its type there: the values as stored).
    fn overwrite_observed(&mut self, table: &TableName, select: &Sql, input: &[Column], output: &[Column]) -> Result<Observed>;
}

/// The plans of engines without multi-statement transactions (Spark on
/// plain files): the input staged once and checked, then whole partitions
/// replaced in one statement each, under a lease that holds across
/// statements.
pub trait Leases: Engine {
    /// Takes a lease on `scope` that holds across statements until
    /// [`Engine::release_lease`] (for engines without transactions, where
    /// [`Locks::lock_scope`] cannot last). With `wait`, waits while another
    /// run holds it. `Ok(Err(holder))` when another run holds it (`holder`
    /// says which, since when, until when).
    fn acquire_lease(&mut self, scope: &str, wait: bool) -> Result<std::result::Result<(), String>>;

    /// Releases a lease taken by [`Leases::acquire_lease`] (nothing when not held).
    fn release_lease(&mut self, scope: &str) -> Result<()> {
        let _ = scope;
        Ok(())
    }

    /// Forgets what this session remembers of `table`, so that its next
    /// read sees the table as it is now (Spark keeps a table's file
    /// listing per session: rows another session wrote since stay unseen
    /// until then). Nothing where every read sees the latest commit; a
    /// missing table is not an error.
    fn refresh(&mut self, table: &TableName) -> Result<()> {
        let _ = table;
        Ok(())
    }

    /// Materializes `query` once as the relation `name` (already quoted),
    /// visible to this connection only, for the plans of
    /// leased plans (Spark: a cached temporary view).
    fn stage(&mut self, name: &str, query: &Sql) -> Result<()> {
        self.create_temp_table_as(name, query).map(|_| ())
    }

    /// As [`Leases::stage`], but the rows may be materialized by the first
    /// query that reads the relation rather than at once (Spark: `CACHE
    /// LAZY TABLE`), saving a pass over them. That first query must read
    /// every row (an aggregate over all of them, not a `LIMIT`), so that
    /// `query` is still computed exactly once.
    fn stage_on_read(&mut self, name: &str, query: &Sql) -> Result<()> {
        self.stage(name, query)
    }

    /// Materializes `query` once as the relation `name` (already quoted),
    /// as its rows are now: unlike [`Leases::stage`], it keeps them when a
    /// table it read is written later in the run (Spark recomputes a cached
    /// view whose tables were overwritten; here a table of its own is
    /// written). [`Leases::unstage`] drops it.
    fn stage_copy(&mut self, name: &str, query: &Sql) -> Result<()> {
        self.stage(name, query)
    }

    /// Whether the run's writes are published only with its ledger row, all
    /// at once (Delta: one commit), rather than each as it is made (Spark),
    /// so a plan that writes two tables need not order its writes for a
    /// failure between them.
    fn publishes_with_ledger_row(&self) -> bool {
        false
    }

    /// Drops what [`Leases::stage`] made (nothing when it is gone).
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
    fn overwrite_partitions(&mut self, table: &TableName, columns: &[String], select: &Sql) -> Result<()>;

    /// Writes that observe the rows they write, in the same job (Spark), or
    /// `None`: the plans then read the source before the write and the
    /// written rows after it. Never wrong to return `None`.
    fn observed_writes(&mut self) -> Option<&mut dyn ObservedWrites> {
        None
    }

    /// Drops the partition `column = value` of `table` with its rows, if it exists.
    fn drop_partition_value(&mut self, table: &TableName, column: &str, value: &Value, ty: &str) -> Result<()>;

    /// Whether [`Leases::replace_rows`] works here: an unpartitioned table
    /// can be changed in one atomic step that rewrites only the storage
    /// holding the changed rows (Delta: one commit). Spark cannot (its
    /// overwrite of an unpartitioned table deletes the files first, and a
    /// failure midway leaves it empty): the plans refuse unpartitioned
    /// targets there.
    fn replaces_rows(&self) -> bool {
        false
    }

    /// Replaces, in one atomic step, the rows of `table` for which
    /// `dropped` holds (a condition over its columns, alias `t`, bound)
    /// with the rows of `select` (`columns` in its order). Only the storage
    /// holding a dropped row is rewritten (Delta: the files holding one are
    /// removed, and their other rows written again with the new rows, in
    /// one commit). A row for which `dropped` is NULL is kept.
    ///
    /// Where [`Leases::replaces_rows`] is false, only a table partitioned by
    /// one column can be changed this way: the partitions holding a dropped
    /// row or taking a new one are written over with their rows as they will
    /// be (Spark: one `INSERT OVERWRITE`, each partition swapped in whole),
    /// and those left without rows dropped; an unpartitioned table is
    /// refused. `dropped` and `select` must not read relations made by
    /// [`Leases::stage`] from `table` (use [`Leases::stage_copy`]).
    fn replace_rows(&mut self, table: &TableName, columns: &[String], dropped: &Sql, select: &Sql) -> Result<()> {
        let _ = (table, columns, dropped, select);
        Err(Error::Unsupported { engine: self.name(), capability: "replacing rows of an unpartitioned table in one atomic step".into() })
    }
}

/// Faster ways to do a plan's work (DuckDB: taps that count and hash rows
/// as a statement streams them, so guards and fingerprints need no scan of
/// their own, and checks that ride inside the statements the hand-written
/// SQL runs anyway). The plan asks once; the accelerator answers
/// [`Accelerated::Done`] or [`Accelerated::Declined`], and declining is
/// never wrong: the plan then does the work the portable way. The hints
/// below may answer `None` for the same reason.
pub trait Accelerator: Engine {
    /// `replace_partition`'s insert of the day, its guards (rows outside
    /// the day) and its fingerprint counted as the rows stream in. Declined
    /// before running anything where it cannot.
    fn insert_day(&mut self, day: &DayInsert<'_>, steps: &mut dyn RunSteps) -> Result<Accelerated<TappedDay>> {
        let _ = (day, steps);
        Ok(Accelerated::Declined("no tapped insert on this engine"))
    }

    /// A merge, in the run's transaction as the plan prepared it. It may
    /// write before it declines: the plan then rolls the transaction back
    /// and runs the portable plan, which explains what it declined (a
    /// NULL key, a tie, a key held elsewhere) with the rows involved.
    fn merge(&mut self, merge: &MergeRequest<'_>, steps: &mut dyn RunSteps) -> Result<Accelerated<Merged>> {
        let _ = (merge, steps);
        Ok(Accelerated::Declined("no accelerated merge on this engine"))
    }

    /// The last word before COMMIT, after the run's last statement (its
    /// ledger row): a check the accelerator left running (the one-statement
    /// merge counts ties while the ledger row is written) may still decline
    /// the run, which then rolls back as [`Accelerator::merge`]'s decline.
    fn confirm(&mut self) -> Result<Accelerated<()>> {
        Ok(Accelerated::Done(()))
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
}
