//! Scenario harness: each scenario is a function over an [`EngineUnderTest`],
//! and [`scenarios!`] instantiates it once per engine, each test on a fresh
//! database.
#![deny(missing_docs)]

use std::path::Path;

use fixpoint_core::engine::measure::{fingerprint, Filter, Scope};

use fixpoint_core::engine::Engine;
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

/// Embedded DuckDB, in memory, without its taps: it runs the plans an
/// engine without them runs (the merge's checks as joins of their own, the
/// guards as a scan), so tests can compare the two on one engine.
pub struct DuckDbWithoutTapsUnderTest;

impl EngineUnderTest for DuckDbWithoutTapsUnderTest {
    fn fresh(&self) -> Box<dyn Engine> {
        Box::new(fixpoint_duckdb::DuckDb::open_in_memory().expect("in-memory duckdb").without_taps())
    }
}

/// Embedded DuckDB, in memory, its merges never one statement: where the
/// one-statement plan would run, the two-statement plan does (tests
/// compare the three DuckDB plans).
pub struct DuckDbTwoStatementsUnderTest;

impl EngineUnderTest for DuckDbTwoStatementsUnderTest {
    fn fresh(&self) -> Box<dyn Engine> {
        Box::new(fixpoint_duckdb::DuckDb::open_in_memory().expect("in-memory duckdb").without_one_statement_merge())
    }
}

/// Embedded DuckDB, in memory, declining to tap `replace_partition`'s day
/// insert: where the tapped insert would run, the plan's fallback does (the
/// guards it deferred scanned after the delete, then the plain insert).
pub struct DuckDbUntappedInsertUnderTest;

impl EngineUnderTest for DuckDbUntappedInsertUnderTest {
    fn fresh(&self) -> Box<dyn Engine> {
        Box::new(fixpoint_duckdb::DuckDb::open_in_memory().expect("in-memory duckdb").without_tapped_day_insert())
    }
}

/// PostgreSQL at `FIXPOINT_TEST_PG` (default `postgres://root@127.0.0.1:5432/test`):
/// each `fresh()` is a new database, dropped when the engine is dropped.
pub struct PgUnderTest {
    admin: String,
    /// Without the accelerated plans: the portable ones run.
    portable: bool,
    /// SQL run in each fresh database before the scenario (tables made
    /// ahead of the run, as a user's DBA would).
    setup: Option<&'static str>,
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
            Ok(()) => Some(PgUnderTest { admin: url, portable: false, setup: None }),
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
        let mut pg = fixpoint_postgres::Postgres::scratch(&self.admin, &name).unwrap_or_else(|e| panic!("{e}"));
        if let Some(setup) = self.setup {
            exec(&mut pg, setup);
        }
        if self.portable {
            pg.without_accelerator()
        } else {
            pg
        }
    }

    /// The same server without its accelerated plan: where the
    /// one-statement merge would run, the plan with every check a join of
    /// its own does.
    pub fn portable(self) -> PgUnderTest {
        PgUnderTest { portable: true, ..self }
    }

    /// The same server, each fresh database first given `setup` (one or
    /// more statements).
    pub fn with_setup(self, setup: &'static str) -> PgUnderTest {
        PgUnderTest { setup: Some(setup), ..self }
    }
}

impl EngineUnderTest for PgUnderTest {
    fn fresh(&self) -> Box<dyn Engine> {
        Box::new(self.fresh_pg())
    }
}

/// The Spark Connect server at `FIXPOINT_TEST_SPARK` (default
/// `sc://127.0.0.1:15002`, as `scripts/spark-local.sh start` runs it). The
/// cluster has one catalog, so "fresh" means emptied: `fresh()` drops every
/// database but `default`, and the scenarios run one at a time (see
/// [`SparkUnderTest::exclusive`]); an engine from an earlier `fresh()` sees
/// the emptied catalog too.
#[cfg(feature = "spark")]
pub struct SparkUnderTest {
    url: String,
    /// Whether the engines' writes observe their rows (see
    /// [`SparkUnderTest::unobserved`]).
    observe: bool,
}

#[cfg(feature = "spark")]
static SPARK_LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());

#[cfg(feature = "spark")]
impl SparkUnderTest {
    /// The server's URL for tests.
    pub fn url() -> String {
        std::env::var("FIXPOINT_TEST_SPARK").unwrap_or_else(|_| "sc://127.0.0.1:15002".into())
    }

    /// The server, or `None` (after saying so) when it is unreachable and
    /// this is not CI. Under `CI=true` an unreachable server fails the test.
    pub fn get() -> Option<SparkUnderTest> {
        static REACHABLE: std::sync::OnceLock<Result<(), String>> = std::sync::OnceLock::new();
        let url = Self::url();
        let r = REACHABLE.get_or_init(|| Self::connect(&url).map(|_| ()).map_err(|e| e.to_string()));
        match r {
            Ok(()) => Some(SparkUnderTest { url, observe: true }),
            Err(e) if std::env::var("CI").as_deref() == Ok("true") => panic!("spark is unreachable under CI=true: {e}"),
            Err(e) => {
                eprintln!("skipped: spark is unreachable ({e}); start it with scripts/spark-local.sh start, or set FIXPOINT_TEST_SPARK");
                None
            }
        }
    }

    /// A new session on the server.
    pub fn connect(url: &str) -> fixpoint_core::Result<fixpoint_spark::Spark> {
        fixpoint_spark::Spark::connect(url, std::time::Duration::from_secs(10))
    }

    /// Holds the cluster for one scenario (they share its catalog).
    pub fn exclusive(&self) -> std::sync::MutexGuard<'static, ()> {
        SPARK_LOCK.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Another session on the same server (concurrent runs).
    pub fn session(&self) -> fixpoint_spark::Spark {
        let spark = Self::connect(&self.url).unwrap_or_else(|e| panic!("{e}"));
        if self.observe {
            spark
        } else {
            spark.without_observed_writes()
        }
    }

    /// The same server, its engines' writes not observed: the plans scan
    /// the source before a write and the written rows after it.
    pub fn unobserved(self) -> SparkUnderTest {
        SparkUnderTest { observe: false, ..self }
    }
}

#[cfg(feature = "spark")]
impl EngineUnderTest for SparkUnderTest {
    fn fresh(&self) -> Box<dyn Engine> {
        let mut spark = self.session();
        // A run killed by an earlier test leaves its cached relations in
        // the server (shared by every session) until its session expires;
        // writing a table they read recomputes them, which fails once their
        // schema is dropped.
        spark.execute(&Sql::raw("CLEAR CACHE")).unwrap_or_else(|e| panic!("{e}"));
        let dbs = spark.query(&Sql::raw("SHOW DATABASES")).unwrap_or_else(|e| panic!("{e}"));
        for r in dbs.rows {
            let name = r[0].display().trim_matches('"').to_owned();
            if name != "default" {
                let stmt = format!("DROP DATABASE IF EXISTS {} CASCADE", fixpoint_core::job::ident::quote_ident(&name));
                spark.execute(&Sql::raw(stmt)).unwrap_or_else(|e| panic!("{e}"));
            }
        }
        Box::new(spark)
    }
}

/// Instantiates scenario functions `fn(&dyn EngineUnderTest)` on Spark
/// (feature `spark`), one at a time.
#[macro_export]
macro_rules! spark_scenarios {
    ($($name:ident),* $(,)?) => {
        #[cfg(feature = "spark")]
        mod spark {
            $(
                #[test]
                fn $name() {
                    if let Some(spark) = $crate::SparkUnderTest::get() {
                        let _one_at_a_time = spark.exclusive();
                        super::$name(&spark);
                    }
                }
            )*
        }
    };
}

/// A scratch Delta warehouse in a folder of its own under the system's
/// temporary folder, removed when the engine is dropped (feature `delta`).
#[cfg(feature = "delta")]
pub struct DeltaUnderTest;

#[cfg(feature = "delta")]
static DELTA_COUNTER: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

#[cfg(feature = "delta")]
impl DeltaUnderTest {
    /// A fresh warehouse, as the Delta engine.
    pub fn fresh_delta(&self) -> fixpoint_delta::Delta {
        let n = DELTA_COUNTER.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let dir = std::env::temp_dir().join(format!("fixpoint-delta-test-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        fixpoint_delta::Delta::scratch(&dir).unwrap_or_else(|e| panic!("{e}"))
    }
}

#[cfg(feature = "delta")]
impl EngineUnderTest for DeltaUnderTest {
    fn fresh(&self) -> Box<dyn Engine> {
        Box::new(self.fresh_delta())
    }
}

/// A scratch Delta warehouse on the local S3-compatible server
/// (`scripts/moto-local.sh start`; its endpoint in `FIXPOINT_TEST_S3`,
/// default `http://127.0.0.1:5055`, bucket `fixpoint-test`), removed when
/// the engine is dropped (feature `delta`).
#[cfg(feature = "delta")]
pub struct DeltaS3UnderTest {
    /// The server's endpoint (`http://host:port`).
    pub endpoint: String,
}

#[cfg(feature = "delta")]
impl DeltaS3UnderTest {
    /// The bucket the tests write to.
    pub const BUCKET: &'static str = "fixpoint-test";

    /// The server, or `None` (after saying so) when it is not running;
    /// under `CI=true` it must be.
    pub fn get() -> Option<DeltaS3UnderTest> {
        fixpoint_delta::test_s3_endpoint().map(|endpoint| DeltaS3UnderTest { endpoint })
    }

    /// The settings the engine and the Python reader use for the server.
    pub fn options(&self) -> Vec<(String, String)> {
        s3_test_options(&self.endpoint)
    }

    /// A fresh warehouse URL (`s3://fixpoint-test/…`).
    pub fn fresh_url(&self) -> String {
        let n = DELTA_COUNTER.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0);
        format!("s3://{}/wh-{}-{nanos}-{n}", Self::BUCKET, std::process::id())
    }

    /// A fresh warehouse, as the Delta engine.
    pub fn fresh_delta(&self) -> fixpoint_delta::Delta {
        fixpoint_delta::Delta::scratch_s3(&self.fresh_url(), &self.options()).unwrap_or_else(|e| panic!("{e}"))
    }
}

#[cfg(feature = "delta")]
impl EngineUnderTest for DeltaS3UnderTest {
    fn fresh(&self) -> Box<dyn Engine> {
        Box::new(self.fresh_delta())
    }
}

/// Instantiates scenario functions `fn(&dyn EngineUnderTest)` on a Delta
/// warehouse in a local folder, and on S3 (feature `delta`).
#[macro_export]
macro_rules! delta_scenarios {
    ($($name:ident),* $(,)?) => {
        #[cfg(feature = "delta")]
        mod delta {
            $(
                #[test]
                fn $name() {
                    super::$name(&$crate::DeltaUnderTest);
                }
            )*
            mod s3 {
                $(
                    #[test]
                    fn $name() {
                        if let Some(s3) = $crate::DeltaS3UnderTest::get() {
                            super::super::$name(&s3);
                        }
                    }
                )*
            }
        }
    };
}

/// Instantiates scenario functions `fn(&dyn EngineUnderTest)` on the
/// engines of the leased plans: Spark and Delta (each behind its feature).
#[macro_export]
macro_rules! leased_scenarios {
    ($($name:ident),* $(,)?) => {
        $crate::spark_scenarios!($($name),*);
        $crate::delta_scenarios!($($name),*);
    };
}

/// Instantiates scenario functions `fn(&dyn EngineUnderTest)` again on one
/// more engine under test (a plan forced by a test switch), in a module of
/// their own.
#[macro_export]
macro_rules! scenarios_on {
    ($module:ident, $engine:expr; $($name:ident),* $(,)?) => {
        mod $module {
            $(
                #[test]
                fn $name() {
                    super::$name(&$engine);
                }
            )*
        }
    };
}

/// Instantiates scenario functions `fn(&dyn EngineUnderTest)` again on
/// PostgreSQL without its accelerated plans, in the module
/// `postgres_portable`.
#[macro_export]
macro_rules! postgres_portable_scenarios {
    ($($name:ident),* $(,)?) => {
        mod postgres_portable {
            $(
                #[test]
                fn $name() {
                    if let Some(pg) = $crate::PgUnderTest::get() {
                        super::$name(&pg.portable());
                    }
                }
            )*
        }
    };
}

/// [`scenarios!`] and [`postgres_portable_scenarios!`] of the same list:
/// every engine, and PostgreSQL again without its accelerated plans.
#[macro_export]
macro_rules! scenarios_and_postgres_portable {
    ($($name:ident),* $(,)?) => {
        $crate::scenarios!($($name),*);
        $crate::postgres_portable_scenarios!($($name),*);
    };
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

/// Replaces the rows of `table` with those of `select` (which may read
/// `table`), the way every engine can: a fixture's UPDATE or DELETE,
/// written once for engines without them (Spark on parquet).
pub fn rewrite(engine: &mut dyn Engine, table: &str, select: &str) {
    let t = TableName::parse(table).unwrap();
    let new = TableName { schema: t.schema.clone(), table: format!("{}__rewritten", t.table) };
    exec(
        engine,
        &format!(
            "CREATE TABLE {new} AS {select};\nDROP TABLE {old};\nALTER TABLE {new} RENAME TO {name}",
            new = new.quoted(),
            old = t.quoted(),
            name = fixpoint_core::job::ident::quote_ident(&t.table)
        ),
    );
}

/// The bronze orders with order 3's total set to 6.00 (the scenarios' one
/// changed input row).
pub fn change_order_3(engine: &mut dyn Engine) {
    rewrite(
        engine,
        "bronze.orders",
        "SELECT order_id, customer_id, CAST(CASE WHEN order_id = 3 THEN 6.00 ELSE order_total END AS DECIMAL(12,2)) AS order_total, currency, updated_at, dt FROM bronze.orders",
    );
}

/// Whether a failure at `point` comes before the run's commit point on
/// `engine`. On a transactional engine every point does (the transaction
/// rolls back); without transactions (Spark) the commit point is the one
/// statement that overwrites the partitions: after it, the run's output is
/// in place, complete, with no ledger row (the next run rewrites and records it).
pub fn before_commit_point(engine: &mut dyn Engine, point: fixpoint_core::FailPoint) -> bool {
    use fixpoint_core::FailPoint::*;
    // Delta commits a run's changes with its ledger row: every point comes first.
    engine.leases().is_none() || engine.name() == "delta" || matches!(point, AfterGuards | AfterDelete | MidInsert)
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

/// The client settings for the local S3-compatible server at `endpoint`.
pub fn s3_test_options(endpoint: &str) -> Vec<(String, String)> {
    [("aws_endpoint_url", endpoint), ("aws_allow_http", "true"), ("aws_access_key_id", "test"), ("aws_secret_access_key", "test"), ("aws_region", "us-east-1")]
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

/// A folder's copy on the local S3-compatible server (feature `s3`):
/// `s3://fixpoint-test/<prefix>/…`, a prefix of its own per test, kept
/// equal to the folder by [`S3Mirror::sync`] (new and changed files
/// uploaded, removed ones deleted).
#[cfg(feature = "s3")]
pub struct S3Mirror {
    /// The server's endpoint.
    pub endpoint: String,
    /// The mirror's prefix in the bucket.
    pub prefix: String,
    store: object_store::aws::AmazonS3,
    rt: tokio::runtime::Runtime,
    synced: std::sync::Mutex<std::collections::BTreeMap<String, Vec<u8>>>,
}

#[cfg(feature = "s3")]
impl S3Mirror {
    /// The bucket the tests write to.
    pub const BUCKET: &'static str = "fixpoint-test";

    /// A fresh, empty mirror, or `None` (after saying `skipped`) when the
    /// server is not running; under `CI=true` it must be.
    pub fn get() -> Option<S3Mirror> {
        static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let endpoint = fixpoint_core::job::objects::test_s3_endpoint()?;
        let store = fixpoint_core::job::objects::s3_store(Self::BUCKET, &s3_test_options(&endpoint), "the tests' bucket").unwrap_or_else(|e| panic!("{e}"));
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let n = N.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0);
        let prefix = format!("lake-{}-{nanos}-{n}", std::process::id());
        Some(S3Mirror { endpoint, prefix, store, rt, synced: Default::default() })
    }

    /// The client settings for the server.
    pub fn options(&self) -> Vec<(String, String)> {
        s3_test_options(&self.endpoint)
    }

    /// `s3://fixpoint-test/<prefix>/<rel>`.
    pub fn url(&self, rel: &str) -> String {
        format!("s3://{}/{}/{rel}", Self::BUCKET, self.prefix)
    }

    fn key(&self, rel: &str) -> object_store::path::Path {
        object_store::path::Path::from(format!("{}/{rel}", self.prefix))
    }

    /// Uploads `bytes` as `rel`.
    pub fn put(&self, rel: &str, bytes: Vec<u8>) {
        use object_store::ObjectStoreExt;
        self.rt.block_on(self.store.put(&self.key(rel), bytes.into())).unwrap_or_else(|e| panic!("uploading {rel}: {e}"));
    }

    /// The ETag the server gives `rel` now (a HEAD request).
    pub fn etag(&self, rel: &str) -> String {
        use object_store::ObjectStoreExt;
        let meta = self.rt.block_on(self.store.head(&self.key(rel))).unwrap_or_else(|e| panic!("{rel}: {e}"));
        meta.e_tag.expect("the server gives ETags")
    }

    /// Makes the mirror equal to `dir` (files only; symbolic links followed).
    pub fn sync(&self, dir: &Path) {
        use object_store::ObjectStoreExt;
        fn walk(dir: &Path, rel: &str, out: &mut std::collections::BTreeMap<String, Vec<u8>>) {
            for entry in std::fs::read_dir(dir).unwrap().flatten() {
                let name = entry.file_name().to_string_lossy().into_owned();
                let rel = if rel.is_empty() { name } else { format!("{rel}/{name}") };
                let path = entry.path();
                if path.is_dir() {
                    walk(&path, &rel, out);
                } else if path.is_file() {
                    out.insert(rel, std::fs::read(&path).unwrap());
                }
            }
        }
        let mut now = std::collections::BTreeMap::new();
        walk(dir, "", &mut now);
        let mut synced = self.synced.lock().unwrap();
        for (rel, bytes) in &now {
            if synced.get(rel) != Some(bytes) {
                self.put(rel, bytes.clone());
            }
        }
        for rel in synced.keys().filter(|r| !now.contains_key(*r)) {
            self.rt.block_on(self.store.delete(&self.key(rel))).unwrap_or_else(|e| panic!("deleting {rel}: {e}"));
        }
        *synced = now;
    }
}
