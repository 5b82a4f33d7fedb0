//! DuckDB's [`Accelerator`]: the plans that ride on the statements the
//! hand-written SQL runs anyway, their guards, counts and fingerprints
//! taken by taps ([`crate::tap`]) as the rows stream through.
//!
//! - [`Accelerator::insert_day`]: `replace_partition`'s insert, its rows
//!   counted, checked against the day and hashed by the partition tap.
//! - [`Accelerator::merge`]: an upsert-only batch in one statement
//!   ([`one_statement`]) when it fits, otherwise two ([`two_statements`]).
//!   Whatever they do not decide (a NULL key or version, a tie, a key held
//!   in a partition the batch does not touch) they decline, and the core's
//!   portable plan, which explains each with the rows involved, runs
//!   instead. A refusal inside a statement is a tap's ([`Taps::refused`]),
//!   never read from an error message.

mod one_statement;
mod two_statements;

use fixpoint_core::engine::{Accelerated, Accelerator, Column, DayInsert, Dialect, MergeRequest, Merged, RunSteps, TappedDay};
use fixpoint_core::job::ident::TableName;
use fixpoint_core::job::sql::{Sql, Value};
use fixpoint_core::{Error, Result};

use crate::tap::{self, Taps};
use crate::{to_duck, DuckDb};

/// The engine has no native row hash (DuckDB always has one).
fn no_hash() -> Error {
    Error::Internal("the engine has no native row hash".into())
}

/// A token bound as a parameter.
fn push_token(sql: &mut Sql, function: &str, token: u64) {
    sql.push(&format!("{function}(")).typed_param(Value::Int(token as i64), "UBIGINT");
}

/// The taps a plan opens on the connection, written into its SQL.
impl DuckDb {
    /// A partition tap: the expression to select as the partition column in
    /// place of `value`, passing it through and counting the rows, those not
    /// on `day`, and the sum of their hashes over `hashed` (of `alias`).
    fn tap_partition(&self, value: &str, alias: &str, hashed: &[Column], day: chrono::NaiveDate) -> Option<(Sql, u64)> {
        let hash = self.native_row_hash(alias, hashed)?;
        let days = (day - chrono::NaiveDate::from_ymd_opt(1970, 1, 1).expect("a date")).num_days();
        let token = self.taps.open_partition(i32::try_from(days).ok()?);
        let mut sql = Sql::new();
        push_token(&mut sql, tap::FUNCTION, token);
        sql.push(&format!(", {hash}, {value})"));
        Some((sql, token))
    }

    /// A counting tap: TRUE where `hash` (UBIGINT) is not NULL, counting
    /// those rows and summing the hashes.
    fn tap_rows(&self, hash: &Sql) -> (Sql, u64) {
        let token = self.taps.open();
        let mut sql = Sql::new();
        push_token(&mut sql, tap::ROWS_FUNCTION, token);
        sql.push(", CAST(").append(hash).push(" AS UBIGINT))");
        (sql, token)
    }

    /// A counting condition: `cond`, counting where TRUE, refusing a row
    /// where `cond` is TRUE and `allowed` is not.
    fn tap_if(&self, cond: &str, allowed: &str) -> (Sql, u64) {
        let token = self.taps.open();
        let mut sql = Sql::new();
        push_token(&mut sql, tap::IF_FUNCTION, token);
        sql.push(&format!(", ({cond}), ({allowed}))"));
        (sql, token)
    }

    /// A dedup tap: counts and sums `hash`, finds ties between rows of one
    /// `pair` whose `row` hashes differ.
    fn tap_dedup(&self, hash: &str, pair: &str, row: &str) -> (Sql, u64) {
        let token = self.taps.open_dedup();
        let mut sql = Sql::new();
        push_token(&mut sql, tap::DEDUP_FUNCTION, token);
        sql.push(&format!(", CAST({hash} AS UBIGINT), CAST({pair} AS UBIGINT), CAST({row} AS UBIGINT))"));
        (sql, token)
    }

    /// A refusal (BOOLEAN): fails the statement on the first row it is
    /// evaluated on; [`Taps::refused`] tells it was this one.
    fn tap_refuse(&self) -> (Sql, u64) {
        let token = self.taps.open();
        let mut sql = Sql::new();
        push_token(&mut sql, tap::REFUSE_FUNCTION, token);
        sql.push(")");
        (sql, token)
    }

    /// What a counting or partition tap saw: (rows, outside, sum).
    fn tap_close(&self, token: u64) -> (u64, u64, i128) {
        let s = self.taps.close(token);
        (s.rows, s.outside, s.sum)
    }

    /// Whether one of `tokens` refused a row (each forgotten).
    fn any_refused(taps: &Taps, tokens: &[u64]) -> bool {
        tokens.iter().fold(false, |any, t| taps.refused(*t) || any)
    }
}

impl Accelerator for DuckDb {
    fn insert_day(&mut self, day: &DayInsert<'_>, steps: &mut dyn RunSteps) -> Result<Accelerated<TappedDay>> {
        if !self.tap_registered || day.hashed.is_empty() {
            return Ok(Accelerated::Declined("no tap on this connection"));
        }
        if !self.tapped_day_insert {
            return Ok(Accelerated::Declined("the tapped day insert is switched off"));
        }
        let Some((tap, token)) = self.tap_partition(&day.partition, day.alias, day.hashed, day.day) else {
            return Ok(Accelerated::Declined("the day is out of the tap's range"));
        };
        let inserted = fixpoint_core::Engine::execute(self, &(day.insert)(&tap));
        let (seen, outside, sum) = self.tap_close(token);
        let inserted = inserted?;
        steps.step("insert (guards and fingerprint tapped)");
        if seen > inserted {
            // The tap must see each inserted row once: its fingerprint
            // would be wrong.
            return Err(Error::Internal(format!("the insert's tap saw {seen} rows but {inserted} were inserted; rolled back")));
        }
        // A NULL partition is not seen by the tap: outside too.
        Ok(Accelerated::Done(TappedDay { inserted, outside: outside + (inserted - seen), sum, method: "delete+insert" }))
    }

    fn merge(&mut self, merge: &MergeRequest<'_>, steps: &mut dyn RunSteps) -> Result<Accelerated<Merged>> {
        self.pending_ties = None;
        self.batch_made = false;
        if !self.tap_registered {
            return Ok(Accelerated::Declined("no taps on this connection"));
        }
        if self.one_statement_merge && one_statement::fits(self, merge)? {
            one_statement::merge(self, merge, steps)
        } else {
            two_statements::merge(self, merge, steps)
        }
    }

    fn confirm(&mut self) -> Result<Accelerated<()>> {
        // The one-statement merge's ties, counted while the ledger row was
        // written: a tie rolls it back with the rest.
        if let Some(ties) = self.pending_ties.take() {
            if ties() > 0 {
                return Ok(Accelerated::Declined("a tie in the batch"));
            }
        }
        if std::mem::take(&mut self.batch_made) {
            fixpoint_core::Engine::execute(self, &Sql::raw(format!("DROP TABLE IF EXISTS {}", fixpoint_core::plans::merge::steps::BATCH)))?;
        }
        Ok(Accelerated::Done(()))
    }

    fn table_has_columns(&mut self, table: &TableName, columns: &[&str]) -> Option<bool> {
        if let Some(d) = self.described.get_mut().get(&table.quoted()) {
            return Some(columns.iter().all(|c| d.columns.iter().any(|k| k.name == *c)));
        }
        // The appender's lookup runs no statement: a missing table or
        // column is an error of the C API, which aborts no transaction.
        self.conn.appender_with_columns_to_db(&table.table, &table.schema, columns).ok().map(|_| true)
    }

    fn append_row(&mut self, table: &TableName, columns: &[&str], values: &[Value]) -> Option<Result<()>> {
        let context = format!("appending a row to {}", table.quoted());
        let err = |e: duckdb::Error| crate::database_error(context.clone(), e);
        let appended = (|| {
            let mut app = self.conn.appender_with_columns_to_db(&table.table, &table.schema, columns).map_err(err)?;
            app.append_row(duckdb::appender_params_from_iter(values.iter().map(to_duck))).map_err(err)?;
            // Flushed here, into the transaction: dropped unflushed, an
            // appender's error would have nowhere to go.
            app.flush().map_err(err)
        })();
        Some(appended)
    }
}
