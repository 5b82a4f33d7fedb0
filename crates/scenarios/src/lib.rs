//! Scenario harness: each scenario is a function over an [`EngineUnderTest`],
//! and [`scenarios!`] instantiates it once per engine, each test on a fresh
//! database.
#![deny(missing_docs)]

use std::path::Path;

use fixpoint_core::engine::{fingerprint, Engine, Filter, Scope};
use fixpoint_core::{Fingerprint, Job, Method, RunDate, Sql, TableName};

/// An engine the scenarios run on.
pub trait EngineUnderTest {
    /// A fresh, empty database.
    fn fresh(&self) -> Box<dyn Engine>;
}

/// Embedded DuckDB, in memory.
pub struct DuckDbUnderTest;

impl EngineUnderTest for DuckDbUnderTest {
    fn fresh(&self) -> Box<dyn Engine> {
        Box::new(fixpoint_duckdb::DuckDb::open_in_memory().expect("in-memory duckdb"))
    }
}

/// PostgreSQL at `FIXPOINT_TEST_PG` (default `postgres://root@127.0.0.1:5432/test`):
/// each `fresh()` is a new database, dropped when the engine is dropped.
pub struct PgUnderTest {
    admin: String,
}

static PG_COUNTER: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

impl PgUnderTest {
    /// The server's URL for tests.
    pub fn url() -> String {
        std::env::var("FIXPOINT_TEST_PG").unwrap_or_else(|_| "postgres://root@127.0.0.1:5432/test".into())
    }

    /// The server, or `None` (after saying so) when it is unreachable and
    /// this is not CI. Under `CI=true` an unreachable server fails the test.
    pub fn get() -> Option<PgUnderTest> {
        static REACHABLE: std::sync::OnceLock<Result<(), String>> = std::sync::OnceLock::new();
        let url = Self::url();
        let r = REACHABLE.get_or_init(|| fixpoint_postgres::Postgres::connect(&url).map(|_| ()).map_err(|e| e.to_string()));
        match r {
            Ok(()) => Some(PgUnderTest { admin: url }),
            Err(e) if std::env::var("CI").as_deref() == Ok("true") => panic!("postgres is unreachable under CI=true: {e}"),
            Err(e) => {
                eprintln!("skipped: postgres is unreachable ({e}); set FIXPOINT_TEST_PG or start the server");
                None
            }
        }
    }
}

impl PgUnderTest {
    /// A fresh database, as the PostgreSQL engine (its `url()` opens more connections).
    pub fn fresh_pg(&self) -> fixpoint_postgres::Postgres {
        let n = PG_COUNTER.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let name = format!("fixpoint_test_{}_{n}", std::process::id());
        fixpoint_postgres::Postgres::scratch(&self.admin, &name).unwrap_or_else(|e| panic!("{e}"))
    }
}

impl EngineUnderTest for PgUnderTest {
    fn fresh(&self) -> Box<dyn Engine> {
        Box::new(self.fresh_pg())
    }
}

/// Instantiates scenario functions `fn(&dyn EngineUnderTest)` for every engine.
#[macro_export]
macro_rules! scenarios {
    ($($name:ident),* $(,)?) => {
        mod duckdb {
            $(
                #[test]
                fn $name() {
                    super::$name(&$crate::DuckDbUnderTest);
                }
            )*
        }
        mod postgres {
            $(
                #[test]
                fn $name() {
                    if let Some(pg) = $crate::PgUnderTest::get() {
                        super::$name(&pg);
                    }
                }
            )*
        }
    };
}

/// Runs `;`-separated setup statements (fixture SQL written by the tests).
pub fn exec(engine: &mut dyn Engine, script: &str) {
    for stmt in script.split(";\n").map(str::trim).filter(|s| !s.is_empty()) {
        engine.execute(&Sql::raw(stmt)).unwrap_or_else(|e| panic!("setup failed: {e}\n{stmt}"));
    }
}

/// A job from TOML text.
pub fn job(toml: &str) -> Job {
    Job::from_toml(toml, Path::new("scenario.toml")).unwrap_or_else(|e| panic!("{e}"))
}

/// A date.
pub fn d(s: &str) -> RunDate {
    RunDate::parse(s).unwrap()
}

/// The native fingerprint of one day of a table, leaving out `exclude`.
pub fn day_fp(engine: &mut dyn Engine, table: &str, day: &str, exclude: &[&str]) -> Fingerprint {
    let t = TableName::parse(table).unwrap();
    let cols = engine.table_columns(&t).unwrap().expect("table exists");
    let cols: Vec<_> = cols.into_iter().filter(|c| !exclude.contains(&c.name.as_str())).collect();
    let date = d(day).date();
    fingerprint(engine, Method::Native, &Scope::Table { table: &t, filter: Some(Filter::DateEquals("dt", date)) }, &cols).unwrap()
}

/// Every row of a query, as display strings, sorted.
pub fn rows(engine: &mut dyn Engine, sql: &str) -> Vec<Vec<String>> {
    let mut out: Vec<Vec<String>> =
        engine.query(&Sql::raw(sql)).unwrap().rows.iter().map(|r| r.iter().map(|v| v.display()).collect()).collect();
    out.sort();
    out
}

/// One integer from a query.
pub fn count(engine: &mut dyn Engine, sql: &str) -> i128 {
    engine.query(&Sql::raw(sql)).unwrap().rows[0][0].as_i128().unwrap()
}

/// The seeds' fixture: bronze.orders over 2026-10-19 … 2026-10-21, with a
/// duplicated order (two versions), an exact duplicate and a late event.
pub const BRONZE: &str = "
CREATE SCHEMA bronze;
CREATE TABLE bronze.orders (order_id BIGINT, customer_id BIGINT, order_total DECIMAL(12,2), currency VARCHAR, updated_at TIMESTAMP, dt DATE);
INSERT INTO bronze.orders VALUES
 (1, 10, 12.50, 'EUR', TIMESTAMP '2026-10-19 08:00:00', DATE '2026-10-19'),
 (2, 11, 99.00, 'USD', TIMESTAMP '2026-10-19 09:30:00', DATE '2026-10-19'),
 (3, 12, 5.25, 'EUR', TIMESTAMP '2026-10-20 07:00:00', DATE '2026-10-20'),
 (4, 10, 42.00, 'GBP', TIMESTAMP '2026-10-20 10:00:00', DATE '2026-10-20'),
 (4, 10, 45.00, 'GBP', TIMESTAMP '2026-10-20 11:00:00', DATE '2026-10-20'),
 (5, 13, 7.00, 'EUR', TIMESTAMP '2026-10-20 12:00:00', DATE '2026-10-20'),
 (5, 13, 7.00, 'EUR', TIMESTAMP '2026-10-20 12:00:00', DATE '2026-10-20'),
 (6, 14, 18.40, 'EUR', TIMESTAMP '2026-10-21 02:14:00', DATE '2026-10-20'),
 (7, 15, 3.10, 'USD', TIMESTAMP '2026-10-21 09:00:00', DATE '2026-10-21')
";

/// The seeds' job: the newest version per order, for the run's day.
pub const SILVER_JOB: &str = r#"
name = "silver_orders"
target = "silver.orders"
strategy = "replace_partition"
partition = "dt"
metadata = ["load_id"]

[source]
sql = """
SELECT order_id, customer_id, order_total, currency, updated_at, dt, :run_key AS load_id
FROM (
  SELECT *, row_number() OVER (PARTITION BY order_id ORDER BY updated_at DESC, order_total DESC, currency, customer_id) AS rn
  FROM bronze.orders
  WHERE dt = :run_date AND currency <> 'it''s not :run_date'
) AS latest
WHERE rn = 1
"""
"#;

/// A merge of the seed's orders, batch by day: the newest version per order.
pub const BRONZE_MERGE_JOB: &str = r#"
name = "orders_merge"
target = "silver.orders_m"
strategy = "merge"
key = ["order_id"]
version = "updated_at"

[source]
sql = "SELECT order_id, customer_id, order_total, currency, updated_at, dt FROM bronze.orders WHERE dt = :run_date"
"#;
