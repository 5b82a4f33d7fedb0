//! Plain mistakes in a job are bad input, on every engine: a view as the
//! target, a partition column that is not a date, a merge's `deleted`
//! condition or an audit naming a column that does not exist, a privilege
//! the user lacks (PostgreSQL), a strategy that is not offered. Each is
//! refused as the user's to fix (exit 2, `ErrorClass::Input`), naming the
//! job file's key and the fix, never as "a retry may work" with
//! fixpoint's generated SQL; and nothing changes: the target and the
//! ledger read back, with plain SQL, exactly as they were.

use std::path::Path;

use fixpoint_core::{Engine, Error, ErrorClass, Job, RunOptions};
use fixpoint_scenarios::*;

/// The key of a job-file error (exit 2), which must carry a hint.
fn spec_key(e: &Error) -> String {
    assert_eq!(e.class(), ErrorClass::Input, "{e}");
    match e {
        Error::Spec { key, hint: Some(h), .. } if !h.is_empty() => key.clone(),
        other => panic!("expected a job-file error with a hint, got {other:?}"),
    }
}

fn ledger_rows(db: &mut dyn Engine) -> i128 {
    count(db, "SELECT count(*) FROM fixpoint.runs")
}

/// The tables of a schema, from the catalog (views included).
fn relations(db: &mut dyn Engine, schema: &str) -> Vec<Vec<String>> {
    rows(db, &format!("SELECT table_name, table_type FROM information_schema.tables WHERE table_schema = '{schema}'"))
}

fn table_exists(db: &mut dyn Engine, table: &str) -> bool {
    count(db, &format!("SELECT count(*) FROM information_schema.tables WHERE table_schema = 'silver' AND table_name = '{table}'")) > 0
}

fn forced() -> RunOptions {
    RunOptions { force: true, ..RunOptions::default() }
}

/// A merge of bronze.orders into `target`, with extra keys.
fn merge_job(target: &str, extra: &str) -> String {
    format!(
        "name = \"orders_merge\"\ntarget = \"{target}\"\nstrategy = \"merge\"\nkey = [\"order_id\"]\nversion = \"updated_at\"\n{extra}\n\n[source]\nsql = \"SELECT order_id, customer_id, order_total, currency, updated_at, dt FROM bronze.orders WHERE dt = :run_date\"\n"
    )
}

fn a_view_as_the_target_is_refused_before_anything_changes(e: &dyn EngineUnderTest) {
    let mut db = e.fresh();
    let db = db.as_mut();
    exec(db, BRONZE);
    job(SILVER_JOB).load(d("2026-10-20"), db).unwrap();
    exec(db, "CREATE VIEW silver.orders_v AS SELECT * FROM silver.orders");
    let before = rows(db, "SELECT * FROM silver.orders");
    let catalog = relations(db, "silver");
    let ledger = ledger_rows(db);

    let day = job(&SILVER_JOB.replace("name = \"silver_orders\"", "name = \"silver_orders_v\"").replace("target = \"silver.orders\"", "target = \"silver.orders_v\""));
    let merged = job(&merge_job("silver.orders_v", ""));
    for (what, j) in [("replace_partition", &day), ("merge", &merged)] {
        for opts in [RunOptions::default(), forced()] {
            let err = j.load_with(d("2026-10-20"), db, &opts).unwrap_err();
            assert_eq!(spec_key(&err), "target", "{what}: {err}");
            let msg = err.to_string();
            assert!(msg.contains(&format!("target: silver.orders_v is a view on {}, not a table", db.name())), "{what}: {msg}");
            assert!(!msg.contains("concurrent") && !msg.contains("running `"), "{what}: no retry, no generated SQL: {msg}");
            assert!(err.hint().unwrap().contains("point `target` at a table"), "{what}: {:?}", err.hint());
            assert_eq!(rows(db, "SELECT * FROM silver.orders"), before, "{what}");
            assert_eq!(relations(db, "silver"), catalog, "{what}: no table created beside the view");
            assert_eq!(ledger_rows(db), ledger, "{what}: no ledger row");
        }
    }
    assert_eq!(count(db, "SELECT count(*) FROM information_schema.tables WHERE table_schema = 'silver' AND table_name = 'orders_v' AND table_type = 'VIEW'"), 1);

    if db.name() == "postgres" {
        exec(db, "CREATE MATERIALIZED VIEW silver.orders_mv AS SELECT * FROM silver.orders");
        let mv = job(&SILVER_JOB.replace("name = \"silver_orders\"", "name = \"silver_orders_mv\"").replace("target = \"silver.orders\"", "target = \"silver.orders_mv\""));
        let err = mv.load(d("2026-10-20"), db).unwrap_err();
        assert_eq!(spec_key(&err), "target", "{err}");
        assert!(err.to_string().contains("silver.orders_mv is a materialized view on postgres, not a table"), "{err}");
        assert_eq!(count(db, "SELECT count(*) FROM silver.orders_mv"), 4);
        assert_eq!(count(db, "SELECT count(*) FROM pg_matviews WHERE schemaname = 'silver' AND matviewname = 'orders_mv'"), 1);
        assert_eq!(ledger_rows(db), ledger);
    }
}

fn a_partition_column_that_is_not_a_date_is_refused_before_anything_changes(e: &dyn EngineUnderTest) {
    let mut db = e.fresh();
    let db = db.as_mut();
    exec(db, BRONZE);
    job(SILVER_JOB).load(d("2026-10-20"), db).unwrap();
    exec(db, "CREATE TABLE silver.daily_int (order_id BIGINT, dt INTEGER);\nINSERT INTO silver.daily_int VALUES (1, 20261020)");
    let (before, before_int) = (rows(db, "SELECT * FROM silver.orders"), rows(db, "SELECT * FROM silver.daily_int"));
    let ledger = ledger_rows(db);
    let day_job = |target: &str, dt: &str| {
        job(&format!(
            "name = \"daily\"\ntarget = \"{target}\"\nstrategy = \"replace_partition\"\npartition = \"dt\"\n\n[source]\nsql = \"SELECT order_id, {dt} AS dt FROM bronze.orders WHERE dt = :run_date\"\n"
        ))
    };
    let cases = [
        // A new target: refused before it is created.
        ("silver.daily_new", "CAST(20261020 AS INTEGER)", "int"),
        ("silver.daily_new", "CAST(dt AS VARCHAR)", if db.name() == "postgres" { "character varying" } else { "VARCHAR" }),
        // A target keyed by an integer day: before, its DELETE failed mid-run.
        ("silver.daily_int", "CAST(20261020 AS INTEGER)", "int"),
    ];
    for (target, dt, ty) in cases {
        for opts in [RunOptions::default(), forced()] {
            let err = day_job(target, dt).load_with(d("2026-10-20"), db, &opts).unwrap_err();
            assert_eq!(spec_key(&err), "partition", "{target} {dt}: {err}");
            let msg = err.to_string();
            assert!(msg.starts_with("job daily: partition: the partition column dt is "), "{msg}");
            assert!(msg.to_lowercase().contains(&format!("dt is {}", ty.to_lowercase())), "{target} {dt}: the type is named: {msg}");
            assert!(msg.contains("it must be a DATE"), "{msg}");
            assert!(err.hint().unwrap().contains("as a DATE"), "{:?}", err.hint());
            assert!(!table_exists(db, "daily_new"), "{target} {dt}: no table created");
            assert_eq!(rows(db, "SELECT * FROM silver.daily_int"), before_int, "{target} {dt}");
            assert_eq!(rows(db, "SELECT * FROM silver.orders"), before, "{target} {dt}");
            assert_eq!(ledger_rows(db), ledger, "{target} {dt}");
        }
    }
    // A DATE partition column still runs.
    let r = day_job("silver.daily_date", "dt").load(d("2026-10-20"), db).unwrap();
    assert_eq!(r.rows_inserted, 6);
}

fn a_deleted_condition_naming_a_missing_column_is_refused(e: &dyn EngineUnderTest) {
    let mut db = e.fresh();
    let db = db.as_mut();
    exec(db, BRONZE);
    let good = job(&merge_job("silver.orders_m", ""));
    good.load(d("2026-10-19"), db).unwrap();
    good.load(d("2026-10-20"), db).unwrap();
    let before = rows(db, "SELECT * FROM silver.orders_m");
    let fixpoint_tables = relations(db, "fixpoint");
    let ledger = ledger_rows(db);

    // Into the loaded target, and into a new one (created in the run's
    // transaction, rolled back with it).
    for target in ["silver.orders_m", "silver.orders_m2"] {
        let bad = job(&merge_job(target, "deleted = \"op = 'D'\""));
        for date in ["2026-10-20", "2026-10-21"] {
            let err = bad.load(d(date), db).unwrap_err();
            assert_eq!(spec_key(&err), "deleted", "{target} {date}: {err}");
            let msg = err.to_string();
            assert!(msg.starts_with("job orders_merge: deleted: the condition `deleted` on the source's rows does not run on "), "{msg}");
            assert!(msg.contains("\"op\""), "{target} {date}: the database's message names the column: {msg}");
            assert!(msg.ends_with("nothing was changed"), "{msg}");
            assert!(!msg.contains("MERGE") && !msg.contains("CREATE"), "no generated SQL: {msg}");
            assert!(err.hint().unwrap().contains("(order_id, customer_id, order_total, currency, updated_at, dt)"), "the source's columns: {:?}", err.hint());
            assert_eq!(rows(db, "SELECT * FROM silver.orders_m"), before, "{target} {date}");
            assert!(!table_exists(db, "orders_m2"), "{target} {date}: no table created");
            assert_eq!(relations(db, "fixpoint"), fixpoint_tables, "{target} {date}: no tombstone table");
            assert_eq!(ledger_rows(db), ledger, "{target} {date}");
        }
    }
    // The same condition on a column the source returns runs.
    let fixed = job(&merge_job("silver.orders_m", "deleted = \"currency = 'XXX'\""));
    fixed.load(d("2026-10-21"), db).unwrap();
    assert_eq!(count(db, "SELECT count(*) FROM silver.orders_m"), 7);
}

fn an_audit_naming_a_missing_column_or_table_is_refused(e: &dyn EngineUnderTest) {
    let mut db = e.fresh();
    let db = db.as_mut();
    exec(db, BRONZE);
    job(SILVER_JOB).load(d("2026-10-19"), db).unwrap();
    job(SILVER_JOB).load(d("2026-10-20"), db).unwrap();
    let merged = job(BRONZE_MERGE_JOB);
    merged.load(d("2026-10-20"), db).unwrap();
    let (before, before_m) = (rows(db, "SELECT * FROM silver.orders"), rows(db, "SELECT * FROM silver.orders_m"));
    let ledger = ledger_rows(db);

    let cases = [
        ("kind = \"not_null\"\ncolumns = [\"order_id\", \"nope\"]", "audit[0].columns", "not_null(order_id, nope)"),
        ("name = \"positive\"\nkind = \"expression\"\nexpression = \"nope > 0\"", "audit[0].expression", "positive"),
        ("name = \"no refunds\"\nkind = \"sql\"\nsql = \"SELECT * FROM silver.orders WHERE dt = :run_date AND refund > 0\"", "audit[0].sql", "no refunds"),
        ("name = \"lookup\"\nkind = \"sql\"\nsql = \"SELECT * FROM silver.nope WHERE dt = :run_date\"", "audit[0].sql", "lookup"),
        ("kind = \"row_count\"\nmin = 1\n\n[[audit]]\nkind = \"accepted_values\"\ncolumn = \"nope\"\nvalues = [\"EUR\"]", "audit[1].column", "accepted_values(nope)"),
    ];
    for (audit, key, name) in cases {
        // A day job, rewritten (forced: audits are not part of the run key).
        let day = job(&format!("{SILVER_JOB}\n[[audit]]\n{audit}\n"));
        let err = day.load_with(d("2026-10-20"), db, &forced()).unwrap_err();
        assert_eq!(spec_key(&err), key, "{name}: {err}");
        let msg = err.to_string();
        assert!(msg.starts_with(&format!("job silver_orders: {key}: audit {name:?} does not run on ")), "{msg}");
        assert!(msg.contains("nope") || msg.contains("refund"), "the database's message names what is missing: {msg}");
        assert!(!msg.contains("running `"), "no generated SQL: {msg}");
        assert_eq!(rows(db, "SELECT * FROM silver.orders"), before, "{name}: the day is as it was");
        assert_eq!(ledger_rows(db), ledger, "{name}");

        // A merge: the touched keys are audited before the commit.
        let m = job(&format!("{BRONZE_MERGE_JOB}\n[[audit]]\n{audit}\n"));
        let err = m.load(d("2026-10-20"), db).unwrap_err();
        assert_eq!(spec_key(&err), key, "merge {name}: {err}");
        assert!(err.to_string().starts_with(&format!("job orders_merge: {key}: audit {name:?} does not run on ")), "{err}");
        assert_eq!(rows(db, "SELECT * FROM silver.orders_m"), before_m, "merge {name}");
        assert_eq!(ledger_rows(db), ledger, "merge {name}");
    }
}

scenarios!(
    a_view_as_the_target_is_refused_before_anything_changes,
    a_partition_column_that_is_not_a_date_is_refused_before_anything_changes,
    a_deleted_condition_naming_a_missing_column_is_refused,
    an_audit_naming_a_missing_column_or_table_is_refused,
);

// DuckDB's other merge plans: two statements, and the checks as joins of
// their own (the plan PostgreSQL runs).
scenarios_on!(duckdb_two_statements, fixpoint_scenarios::DuckDbTwoStatementsUnderTest;
    a_deleted_condition_naming_a_missing_column_is_refused,
    an_audit_naming_a_missing_column_or_table_is_refused,
);
scenarios_on!(duckdb_without_taps, fixpoint_scenarios::DuckDbWithoutTapsUnderTest;
    a_view_as_the_target_is_refused_before_anything_changes,
    a_deleted_condition_naming_a_missing_column_is_refused,
    an_audit_naming_a_missing_column_or_table_is_refused,
);

/// A privilege the user in --db lacks, on the target or on the source, is
/// the user's to fix (exit 2, naming the table and the grant), not "a
/// retry may work". Run as a role without it (`SET ROLE`: needs a
/// superuser; skipped otherwise). The role is left in the cluster, without
/// privileges (they go with the scratch database).
#[test]
fn permission_denied_on_postgres_is_bad_input() {
    let Some(pg) = PgUnderTest::get() else { return };
    let mut engine = pg.fresh_pg();
    let db: &mut dyn Engine = &mut engine;
    if count(db, "SELECT count(*) FROM pg_roles WHERE rolname = current_user AND rolsuper") == 0 {
        eprintln!("skipped: the test user is not a superuser (SET ROLE)");
        return;
    }
    exec(db, BRONZE);
    let daily = job(
        "name = \"daily\"\ntarget = \"silver.daily\"\nstrategy = \"replace_partition\"\npartition = \"dt\"\n\n[source]\nsql = \"SELECT order_id, customer_id, order_total, currency, updated_at, dt FROM bronze.orders WHERE dt = :run_date\"\n",
    );
    daily.load(d("2026-10-20"), db).unwrap();
    let before = rows(db, "SELECT * FROM silver.daily");
    assert_eq!(before.len(), 6);
    let ledger = ledger_rows(db);

    const ROLE: &str = "fixpoint_test_limited";
    // Another test process may have made it: an error here is "exists".
    let _ = db.execute(&fixpoint_core::Sql::raw(format!("CREATE ROLE {ROLE} NOLOGIN")));
    assert_eq!(count(db, &format!("SELECT count(*) FROM pg_roles WHERE rolname = '{ROLE}'")), 1);
    exec(
        db,
        &format!(
            "GRANT USAGE ON SCHEMA bronze, silver, fixpoint TO {ROLE};\nGRANT SELECT ON bronze.orders TO {ROLE};\nGRANT SELECT, INSERT ON fixpoint.runs TO {ROLE};\nGRANT SELECT ON silver.daily TO {ROLE}"
        ),
    );
    // The target: readable, not writable. Then the source: not readable.
    let grants = [
        ("table daily", String::new()),
        ("table orders", format!("GRANT INSERT, UPDATE, DELETE ON silver.daily TO {ROLE};\nREVOKE SELECT ON bronze.orders FROM {ROLE}")),
    ];
    for (object, grant) in grants {
        if !grant.is_empty() {
            exec(db, &grant);
        }
        exec(db, &format!("SET ROLE {ROLE}"));
        let err = daily.load_with(d("2026-10-20"), db, &forced());
        exec(db, "RESET ROLE");
        let err = err.unwrap_err();
        assert_eq!(err.class(), ErrorClass::Input, "{object}: {err}");
        assert!(matches!(err, Error::Argument { hint: Some(_), .. }), "{object}: {err:?}");
        let msg = err.to_string();
        // PostgreSQL 15 on says "table", earlier versions "relation".
        let name = object.trim_start_matches("table ");
        assert!(msg.starts_with("postgres: permission denied for ") && msg.contains(name), "{object}: {msg}");
        assert!(msg.contains("(SQLSTATE 42501): the user in --db lacks a privilege fixpoint needs"), "{msg}");
        assert!(!msg.contains("running `"), "no generated SQL: {msg}");
        let hint = err.hint().unwrap();
        assert!(hint.starts_with("have the owner of ") && hint.contains(name) && hint.contains("GRANT"), "{hint}");
        assert_eq!(rows(db, "SELECT * FROM silver.daily"), before, "{object}");
        assert_eq!(ledger_rows(db), ledger, "{object}");
    }
}

/// `replace_table` was offered by the job file's error message but refused
/// at run time: now it is refused when the job file is read, and no
/// message offers it.
#[test]
fn replace_table_is_not_offered() {
    let text = |strategy: &str| {
        format!("name = \"snap\"\ntarget = \"silver.snap\"\nstrategy = \"{strategy}\"\n\n[source]\nsql = \"SELECT * FROM bronze.orders\"\n")
    };
    let err = Job::from_toml(&text("replace_table"), Path::new("snap.toml")).unwrap_err();
    assert_eq!(spec_key(&err), "strategy");
    assert!(err.to_string().starts_with("snap.toml: strategy: \"replace_table\" is not available"), "{err}");
    let hint = err.hint().unwrap();
    assert!(hint.contains("replace_partition") && hint.contains("merge"), "{hint}");
    for strategy in ["upsert", "snapshot"] {
        let err = Job::from_toml(&text(strategy), Path::new("snap.toml")).unwrap_err();
        assert_eq!(spec_key(&err), "strategy");
        assert_eq!(err.to_string(), format!("snap.toml: strategy: \"{strategy}\": expected one of \"replace_partition\", \"merge\", \"history\""));
    }
    let missing = Job::from_toml(&text("x").replace("strategy = \"x\"\n", ""), Path::new("snap.toml")).unwrap_err();
    assert_eq!(missing.to_string(), "snap.toml: strategy: missing: expected one of \"replace_partition\", \"merge\", \"history\"");
}
