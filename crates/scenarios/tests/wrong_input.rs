//! Wrong input never changes data, on every engine: a job whose source reads
//! its own target, a target in fixpoint's own schema, a key, version or
//! partition column that `on_schema_change = "append_new_columns"` would
//! add, a merge version without a meaningful order. Each is refused with an
//! error naming the problem and its fix (and the class that decides the exit
//! code), before anything is written: the target and the ledger read back,
//! with plain SQL, exactly as they were.

use std::path::Path;

use fixpoint_core::{Engine, Error, ErrorClass, Job, RunOptions, TableName};
use fixpoint_scenarios::*;

/// A job file's refusal at load.
fn load_err(toml: &str) -> Error {
    match Job::from_toml(toml, Path::new("wrong.toml")) {
        Ok(_) => panic!("the job was accepted:\n{toml}"),
        Err(e) => e,
    }
}

/// The key of a job-file error (exit 2), which must carry a hint.
fn spec_key(e: &Error) -> String {
    assert_eq!(e.class(), ErrorClass::Input, "{e}");
    match e {
        Error::Spec { key, hint: Some(h), .. } if !h.is_empty() => key.clone(),
        other => panic!("expected a job-file error with a hint, got {other:?}"),
    }
}

/// A schema error (exit 2) with its hint, as one text.
fn schema_err(e: Error) -> String {
    assert_eq!(e.class(), ErrorClass::Input, "{e}");
    match &e {
        Error::Schema { hint: Some(h), .. } if !h.is_empty() => {}
        other => panic!("expected a schema error with a hint, got {other:?}"),
    }
    format!("{e}\nhint: {}", e.hint().unwrap_or_default())
}

fn ledger_rows(db: &mut dyn Engine) -> i128 {
    count(db, "SELECT count(*) FROM fixpoint.runs")
}

/// The number of columns of `silver.<table>`, from the catalog.
fn column_count(db: &mut dyn Engine, table: &str) -> i128 {
    count(db, &format!("SELECT count(*) FROM information_schema.columns WHERE table_schema = 'silver' AND table_name = '{table}'"))
}

fn table_exists(db: &mut dyn Engine, table: &str) -> bool {
    count(db, &format!("SELECT count(*) FROM information_schema.tables WHERE table_schema = 'silver' AND table_name = '{table}'")) > 0
}

/// The schema an unqualified table name resolves to on this engine.
fn default_schema(db: &dyn Engine) -> &'static str {
    if db.name() == "postgres" {
        "public"
    } else {
        "main"
    }
}

/// A replace_partition job on `dt`, its SQL as a TOML literal string.
fn rp_job(name: &str, target: &str, sql: &str) -> String {
    format!("name = \"{name}\"\ntarget = \"{target}\"\nstrategy = \"replace_partition\"\npartition = \"dt\"\n\n[source]\nsql = '''\n{sql}\n'''\n")
}

/// The issue's job: the day of silver.orders loaded from silver.orders.
const SELF_READ: &str = "SELECT order_id, customer_id, order_total, currency, updated_at, dt, load_id FROM silver.orders WHERE dt = :run_date";

fn a_source_reading_its_own_target_is_refused_before_anything_changes(e: &dyn EngineUnderTest) {
    let mut db = e.fresh();
    let db = db.as_mut();
    exec(db, BRONZE);
    let mut silver = job(SILVER_JOB);
    silver.load(d("2026-10-19"), db).unwrap();
    silver.load(d("2026-10-20"), db).unwrap();
    let before = rows(db, "SELECT * FROM silver.orders");
    assert_eq!(count(db, "SELECT count(*) FROM silver.orders WHERE dt = DATE '2026-10-20'"), 4);
    assert_eq!(ledger_rows(db), 2);

    // At load: the job file is refused, naming the key, the target and the fix.
    let err = load_err(&rp_job("silver_orders", "silver.orders", SELF_READ));
    assert_eq!(spec_key(&err), "source.sql");
    assert_eq!(err.to_string(), "wrong.toml: source.sql: the source reads the job's own target silver.orders: a run deletes the rows it would read");
    assert!(err.hint().unwrap().contains("upstream table"), "{:?}", err.hint());
    // Wherever and however the query names it.
    for sql in [
        "SELECT * FROM SILVER.Orders WHERE dt = :run_date",
        "SELECT * FROM \"silver\".\"orders\" WHERE dt = :run_date",
        "SELECT b.* FROM bronze.orders AS b JOIN silver.orders AS s ON s.order_id = b.order_id WHERE b.dt = :run_date",
        "SELECT * FROM bronze.orders WHERE dt = :run_date AND order_id NOT IN (SELECT order_id FROM silver.orders)",
        "WITH latest AS (SELECT * FROM silver.orders WHERE dt = :run_date) SELECT * FROM latest",
        "SELECT * FROM bronze.orders WHERE dt = :run_date UNION ALL SELECT * FROM silver.orders WHERE dt = :run_date",
    ] {
        let err = load_err(&rp_job("x", "silver.orders", sql));
        assert_eq!(spec_key(&err), "source.sql", "{sql}");
        assert!(err.to_string().contains("the source reads the job's own target silver.orders"), "{sql}: {err}");
    }
    // A merge too, whatever its plan.
    let merge = format!(
        "name = \"m\"\ntarget = \"silver.orders\"\nstrategy = \"merge\"\nkey = [\"order_id\"]\nversion = \"updated_at\"\n\n[source]\nsql = '''\n{}\n'''\n",
        "SELECT * FROM bronze.orders b WHERE dt = :run_date AND NOT EXISTS (SELECT 1 FROM silver.orders s WHERE s.order_id = b.order_id)"
    );
    let err = load_err(&merge);
    assert_eq!(spec_key(&err), "source.sql");
    assert!(err.to_string().contains("the source reads the job's own target silver.orders"), "{err}");

    // At the start of a run, for a job changed after it was loaded: the
    // fast path (no earlier run to compare with: --force) and the guarded
    // one. Nothing is deleted, nothing recorded.
    silver.source = silver.source.with_sql(SELF_READ.into()).unwrap();
    for force in [true, false] {
        let err = silver.load_with(d("2026-10-20"), db, &RunOptions { force, ..RunOptions::default() }).unwrap_err();
        assert_eq!(spec_key(&err), "source.sql", "force {force}: {err}");
        assert_eq!(count(db, "SELECT count(*) FROM silver.orders WHERE dt = DATE '2026-10-20'"), 4, "force {force}: the day is intact");
        assert_eq!(rows(db, "SELECT * FROM silver.orders"), before, "force {force}");
        assert_eq!(ledger_rows(db), 2, "force {force}: no ledger row");
    }

    // The same for a merge.
    let mut merged = job(BRONZE_MERGE_JOB);
    merged.load(d("2026-10-20"), db).unwrap();
    let merged_before = rows(db, "SELECT * FROM silver.orders_m");
    assert_eq!(merged_before.len(), 4);
    merged.source = merged.source.with_sql("SELECT order_id, customer_id, order_total, currency, updated_at, dt FROM silver.orders_m WHERE dt = :run_date".into()).unwrap();
    let err = merged.load_with(d("2026-10-20"), db, &RunOptions { force: true, ..RunOptions::default() }).unwrap_err();
    assert_eq!(spec_key(&err), "source.sql", "{err}");
    assert_eq!(rows(db, "SELECT * FROM silver.orders_m"), merged_before);
    assert_eq!(ledger_rows(db), 3);
}

fn an_unqualified_name_is_the_target_in_the_default_schema(e: &dyn EngineUnderTest) {
    let mut db = e.fresh();
    let db = db.as_mut();
    exec(db, BRONZE);
    let schema = default_schema(db);
    let target = format!("{schema}.orders_self");
    exec(db, &format!("CREATE TABLE {target} AS SELECT * FROM bronze.orders WHERE dt = DATE '2026-10-20'"));
    // The engine reads the unqualified name as the target.
    assert_eq!(count(db, "SELECT count(*) FROM orders_self"), 6);
    let err = load_err(&rp_job("self", &target, "SELECT * FROM orders_self WHERE dt = :run_date"));
    assert_eq!(spec_key(&err), "source.sql");
    assert!(err.to_string().contains(&format!("the source reads the job's own target {target}")), "{err}");
    // Not in another schema: silver.orders_self is another table.
    Job::from_toml(&rp_job("other", "silver.orders_self", "SELECT * FROM orders_self WHERE dt = :run_date"), Path::new("ok.toml")).unwrap();

    // A CTE of the target's name shadows it: the job reads bronze, and runs.
    let shadow = rp_job("shadow", &target, "WITH orders_self AS (SELECT * FROM bronze.orders WHERE dt = :run_date) SELECT * FROM orders_self");
    let j = Job::from_toml(&shadow, Path::new("ok.toml")).unwrap_or_else(|e| panic!("{e}"));
    let r = j.load(d("2026-10-21"), db).unwrap();
    assert_eq!((r.rows_deleted, r.rows_inserted), (0, 1));
    assert_eq!(count(db, "SELECT count(*) FROM orders_self WHERE dt = DATE '2026-10-20'"), 6, "the other day is untouched");
    assert_eq!(count(db, "SELECT count(*) FROM orders_self WHERE dt = DATE '2026-10-21' AND order_id = 7"), 1);
}

fn a_target_in_fixpoints_own_schema_is_refused(e: &dyn EngineUnderTest) {
    let mut db = e.fresh();
    let db = db.as_mut();
    exec(db, BRONZE);
    let mut silver = job(SILVER_JOB);
    silver.load(d("2026-10-19"), db).unwrap();
    silver.load(d("2026-10-20"), db).unwrap();
    let ledger = rows(db, "SELECT job, run_date, run_key FROM fixpoint.runs");
    assert_eq!(ledger.len(), 2);

    for target in ["fixpoint.runs", "FIXPOINT.runs", "Fixpoint.tombstones__silver__orders_m"] {
        let toml = format!(
            "name = \"wiper\"\ntarget = \"{target}\"\nstrategy = \"replace_partition\"\npartition = \"run_date\"\n\n[source]\nsql = \"SELECT order_id, dt AS run_date FROM bronze.orders WHERE dt = :run_date\"\n"
        );
        let err = load_err(&toml);
        assert_eq!(spec_key(&err), "target", "{target}");
        let schema = target.split('.').next().unwrap();
        assert!(err.to_string().starts_with(&format!("wrong.toml: target: {target} is in the schema {schema}, which is reserved for")), "{err}");
    }
    // A job changed after it was loaded is refused at the start of the run.
    silver.target = TableName::parse("fixpoint.runs").unwrap();
    let err = silver.load(d("2026-10-20"), db).unwrap_err();
    assert_eq!(spec_key(&err), "target", "{err}");
    assert_eq!(rows(db, "SELECT job, run_date, run_key FROM fixpoint.runs"), ledger, "the ledger is intact");
    assert_eq!(count(db, "SELECT count(*) FROM silver.orders"), 6);
}

fn append_new_columns_never_adds_a_key_version_or_partition_column(e: &dyn EngineUnderTest) {
    let mut db = e.fresh();
    let db = db.as_mut();
    exec(db, BRONZE);
    // A merge target without currency, dt or seq; a day target without load_dt.
    let merge = |extra: &str, cols: &str| {
        format!(
            "name = \"keyed\"\ntarget = \"silver.k\"\nstrategy = \"merge\"\non_tie = \"deterministic\"\n{extra}\n\n[source]\nsql = \"SELECT order_id, customer_id, updated_at{cols} FROM bronze.orders WHERE dt = :run_date\"\n"
        )
    };
    let base = job(&merge("key = [\"order_id\"]\nversion = \"updated_at\"", ""));
    base.load(d("2026-10-19"), db).unwrap();
    base.load(d("2026-10-20"), db).unwrap();
    let day = "name = \"daily\"\ntarget = \"silver.r\"\nstrategy = \"replace_partition\"\npartition = \"dt\"\n";
    let base_day = job(&format!("{day}\n[source]\nsql = \"SELECT order_id, customer_id, dt FROM bronze.orders WHERE dt = :run_date\"\n"));
    base_day.load(d("2026-10-20"), db).unwrap();
    let (k_before, r_before) = (rows(db, "SELECT * FROM silver.k"), rows(db, "SELECT * FROM silver.r"));
    assert_eq!((k_before.len(), r_before.len()), (6, 6));
    let (k_cols, r_cols) = (column_count(db, "k"), column_count(db, "r"));
    assert_eq!((k_cols, r_cols), (3, 3));
    let ledger = ledger_rows(db);

    let cases = [
        // The issue's case: a second key column the target lacks. Appended,
        // it would read NULL for every row, no batch row would match, and
        // the batch would be inserted again beside them.
        (merge("key = [\"order_id\", \"currency\"]\nversion = \"updated_at\"", ", currency"), "currency", "merge key"),
        (merge("key = [\"order_id\"]\nversion = \"seq\"", ", CAST(order_id AS BIGINT) AS seq"), "seq", "version"),
        (merge("key = [\"order_id\"]\nversion = \"updated_at\"\npartition = \"dt\"", ", dt"), "dt", "partition column"),
        // A day job on a column the target lacks: the old day would never be
        // deleted, and the run would add it again.
        (format!("{}\n[source]\nsql = \"SELECT order_id, customer_id, dt, dt AS load_dt FROM bronze.orders WHERE dt = :run_date\"\n", day.replace("partition = \"dt\"", "partition = \"load_dt\"")), "load_dt", "partition column"),
    ];
    for (toml, column, role) in &cases {
        for setting in ["append_new_columns", "fail"] {
            let text = toml.replacen("\n\n[source]", &format!("\non_schema_change = \"{setting}\"\n\n[source]"), 1);
            let j = job(&text);
            let msg = schema_err(j.load(d("2026-10-20"), db).unwrap_err());
            assert!(msg.contains(&format!("has no column {column} (")), "{column} {setting}: {msg}");
            assert!(msg.contains(&format!("the job's {role}: it cannot be appended")), "{column} {setting}: {msg}");
            assert!(msg.contains("ALTER TABLE"), "{column} {setting}: the fix is named: {msg}");
            assert_eq!(rows(db, "SELECT * FROM silver.k"), k_before, "{column} {setting}");
            assert_eq!(rows(db, "SELECT * FROM silver.r"), r_before, "{column} {setting}");
            assert_eq!((column_count(db, "k"), column_count(db, "r")), (k_cols, r_cols), "{column} {setting}: no column added");
            assert_eq!(ledger_rows(db), ledger, "{column} {setting}");
        }
    }
    // A column the job only carries is still appended.
    let wider = job(&merge("key = [\"order_id\"]\nversion = \"updated_at\"\non_schema_change = \"append_new_columns\"", ", currency"));
    wider.load(d("2026-10-20"), db).unwrap();
    assert_eq!(column_count(db, "k"), 4);
    assert_eq!(count(db, "SELECT count(*) FROM silver.k"), 6, "no key inserted twice");
}

/// Batches of versions 9 then 10 of key 1, as text and as a boolean.
const VERSIONS: &str = "
CREATE SCHEMA staging;
CREATE TABLE staging.v (batch DATE, k BIGINT, ver VARCHAR, flag BOOLEAN, amount BIGINT);
INSERT INTO staging.v VALUES (DATE '2026-10-19', 1, '9', false, 100), (DATE '2026-10-20', 1, '10', true, 200);
CREATE SCHEMA silver;
CREATE TABLE silver.v (k BIGINT, ver VARCHAR, amount BIGINT);
INSERT INTO silver.v VALUES (1, '9', 100)";

fn version_job(target: &str, version: &str, select: &str, extra: &str) -> Job {
    job(&format!(
        "name = \"versioned\"\ntarget = \"silver.{target}\"\nstrategy = \"merge\"\nkey = [\"k\"]\nversion = \"{version}\"\n{extra}\n\n[source]\nsql = \"SELECT k, {select}, amount FROM staging.v WHERE batch = :run_date\"\n"
    ))
}

fn a_version_without_a_meaningful_order_is_refused(e: &dyn EngineUnderTest) {
    let mut db = e.fresh();
    let db = db.as_mut();
    exec(db, VERSIONS);
    let before = rows(db, "SELECT * FROM silver.v");
    // Without tombstones (DuckDB: the one-statement plan) and with them.
    for extra in ["", "deleted = \"amount < 0\""] {
        // Into a target holding version '9': as text, '10' would lose.
        let msg = schema_err(version_job("v", "ver", "ver", extra).load(d("2026-10-20"), db).unwrap_err());
        assert!(msg.contains("the version column ver of job versioned is "), "{extra}: {msg}");
        assert!(msg.contains("'10' sorts before '9'"), "{extra}: {msg}");
        assert!(msg.contains("CAST(ver AS BIGINT) AS ver"), "{extra}: the fix is named: {msg}");
        assert_eq!(rows(db, "SELECT * FROM silver.v"), before, "{extra}");
        assert_eq!(count(db, "SELECT amount FROM silver.v WHERE k = 1"), 100, "{extra}");
        // Into a new target: refused before it is created.
        let msg = schema_err(version_job("v_new", "ver", "ver", extra).load(d("2026-10-19"), db).unwrap_err());
        assert!(msg.contains("the version column ver"), "{msg}");
        assert!(!table_exists(db, "v_new"), "{extra}: no table created");
        // A boolean has no order of versions either.
        let msg = schema_err(version_job("v_flag", "flag", "flag", extra).load(d("2026-10-19"), db).unwrap_err());
        assert!(msg.contains("the version column flag of job versioned is "), "{msg}");
        assert!(!table_exists(db, "v_flag"), "{extra}: no table created");
    }
    assert_eq!(count(db, "SELECT count(*) FROM information_schema.tables WHERE table_schema = 'fixpoint'"), 0, "no run got as far as the ledger");

    // The hint's fix: cast in the source; 10 then beats 9, replayed or not.
    let numeric = version_job("v_num", "ver", "CAST(ver AS BIGINT) AS ver", "");
    numeric.load(d("2026-10-19"), db).unwrap();
    numeric.load(d("2026-10-20"), db).unwrap();
    assert_eq!(rows(db, "SELECT k, ver, amount FROM silver.v_num"), vec![vec!["1".to_owned(), "10".to_owned(), "200".to_owned()]]);
    numeric.load(d("2026-10-19"), db).unwrap();
    assert_eq!(rows(db, "SELECT k, ver, amount FROM silver.v_num"), vec![vec!["1".to_owned(), "10".to_owned(), "200".to_owned()]]);
}

/// A merge whose key is not the target's key (the target holds two rows of
/// one key) is refused naming the key and an example, on every plan; before,
/// the one-statement plan stopped with an internal error and the join plan
/// updated both rows.
fn a_key_that_is_not_the_targets_key_is_refused(e: &dyn EngineUnderTest) {
    let mut db = e.fresh();
    let db = db.as_mut();
    exec(
        db,
        "CREATE SCHEMA staging;
CREATE TABLE staging.c (k BIGINT, ver BIGINT, amount BIGINT, batch DATE);
INSERT INTO staging.c VALUES (1, 5, 500, DATE '2026-10-20'), (3, 5, 300, DATE '2026-10-20');
CREATE SCHEMA silver;
CREATE TABLE silver.c (k BIGINT, ver BIGINT, amount BIGINT);
INSERT INTO silver.c VALUES (1, 1, 10), (1, 2, 20), (2, 1, 30)",
    );
    let before = rows(db, "SELECT * FROM silver.c ORDER BY k, ver");
    for extra in ["", "deleted = \"amount < 0\""] {
        let merge = job(&format!(
            "name = \"dup\"\ntarget = \"silver.c\"\nstrategy = \"merge\"\nkey = [\"k\"]\nversion = \"ver\"\n{extra}\n\n[source]\nsql = \"SELECT k, ver, amount FROM staging.c WHERE batch = :run_date\"\n"
        ));
        let err = merge.load(d("2026-10-20"), db).unwrap_err();
        assert_eq!(spec_key(&err), "key", "{extra}: {err}");
        let msg = err.to_string();
        assert!(msg.contains("holds more than one row for a key of the batch") && msg.contains("k: 1"), "{extra}: {msg}");
        assert_eq!(rows(db, "SELECT * FROM silver.c ORDER BY k, ver"), before, "{extra}: nothing changed");
    }
    assert_eq!(count(db, "SELECT count(*) FROM information_schema.tables WHERE table_schema = 'fixpoint' AND table_name = 'runs'"), 0, "no ledger row");
}

scenarios!(
    a_source_reading_its_own_target_is_refused_before_anything_changes,
    an_unqualified_name_is_the_target_in_the_default_schema,
    a_target_in_fixpoints_own_schema_is_refused,
    append_new_columns_never_adds_a_key_version_or_partition_column,
    a_version_without_a_meaningful_order_is_refused,
    a_key_that_is_not_the_targets_key_is_refused,
);

// The merge refusals on DuckDB's other merge plans: two statements, and
// the checks as joins of their own (the plan PostgreSQL runs).
scenarios_on!(duckdb_two_statements, fixpoint_scenarios::DuckDbTwoStatementsUnderTest;
    a_source_reading_its_own_target_is_refused_before_anything_changes,
    append_new_columns_never_adds_a_key_version_or_partition_column,
    a_version_without_a_meaningful_order_is_refused,
    a_key_that_is_not_the_targets_key_is_refused,
);
scenarios_on!(duckdb_without_taps, fixpoint_scenarios::DuckDbWithoutTapsUnderTest;
    a_source_reading_its_own_target_is_refused_before_anything_changes,
    append_new_columns_never_adds_a_key_version_or_partition_column,
    a_version_without_a_meaningful_order_is_refused,
    a_key_that_is_not_the_targets_key_is_refused,
);
