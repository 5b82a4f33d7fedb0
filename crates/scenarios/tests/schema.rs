//! Schema drift, run on every engine: a new source column, a dropped one and
//! a changed type, under `on_schema_change = "fail"` (the default) and
//! `"append_new_columns"`. Every refusal names the columns and leaves the
//! target exactly as it was.

use fixpoint_core::{Error, FailPoint, FaultAction, RunOptions};
use fixpoint_scenarios::*;

fn drift_job(strategy: &str, cols: &str, extra: &str) -> fixpoint_core::Job {
    let keys = if strategy == "merge" { "key = [\"order_id\"]\nversion = \"updated_at\"\non_tie = \"deterministic\"" } else { "" };
    job(&format!(
        "name = \"drift\"\ntarget = \"silver.d\"\nstrategy = \"{strategy}\"\npartition = \"dt\"\n{keys}\n{extra}\n\n[source]\nsql = \"SELECT {cols} FROM bronze.orders WHERE dt = :run_date\"\n"
    ))
}

const BASE: &str = "order_id, customer_id, order_total, currency, updated_at, dt";

/// The seed loaded for the 19th and the 20th with the base columns.
fn loaded(e: &dyn EngineUnderTest, strategy: &str) -> Box<dyn fixpoint_core::Engine> {
    let mut db = e.fresh();
    exec(db.as_mut(), BRONZE);
    let j = drift_job(strategy, BASE, "");
    j.load(d("2026-10-19"), db.as_mut()).unwrap();
    j.load(d("2026-10-20"), db.as_mut()).unwrap();
    db
}

fn schema_error(err: Error) -> String {
    match &err {
        Error::Schema { .. } => {}
        other => panic!("expected a schema error, got {other:?}"),
    }
    assert_eq!(err.class(), fixpoint_core::ErrorClass::Input, "a schema change is the user's to resolve (exit 2)");
    format!("{err}\n{}", err.hint().unwrap_or_default())
}

fn everything(db: &mut dyn fixpoint_core::Engine) -> Vec<Vec<String>> {
    rows(db, "SELECT * FROM silver.d")
}

fn a_new_column_is_refused_by_default_and_appended_when_asked(e: &dyn EngineUnderTest) {
    for strategy in ["replace_partition", "merge"] {
        let mut db = loaded(e, strategy);
        let db = db.as_mut();
        let before = everything(db);
        let wider = format!("{BASE}, customer_id * 2 AS score");
        let err = drift_job(strategy, &wider, "").load(d("2026-10-20"), db).unwrap_err();
        let msg = schema_error(err);
        assert!(msg.contains("schema change in job drift: the source returns new column(s) score "), "{strategy}: {msg}");
        assert!(msg.contains("on_schema_change = \"append_new_columns\""), "{strategy}: the fix is named: {msg}");
        assert_eq!(everything(db), before, "{strategy}: target unchanged");

        // Asked to append: the column is added and the rows the run writes
        // fill it (replace_partition: the whole day; merge: the keys whose
        // version is newer, here order 3); older rows read NULL; a rerun
        // changes nothing.
        exec(db, "INSERT INTO bronze.orders VALUES (3, 12, 6.00, 'EUR', TIMESTAMP '2026-10-20 14:00:00', DATE '2026-10-20')");
        let j = drift_job(strategy, &wider, "on_schema_change = \"append_new_columns\"");
        let r = j.load(d("2026-10-20"), db).unwrap();
        let cols: Vec<String> = db.table_columns(&j.target).unwrap().unwrap().into_iter().map(|c| c.name).collect();
        assert_eq!(cols.last().map(String::as_str), Some("score"), "{strategy}");
        let day = count(db, "SELECT count(*) FROM silver.d WHERE dt = DATE '2026-10-20'");
        let filled = count(db, "SELECT count(*) FROM silver.d WHERE dt = DATE '2026-10-20' AND score = customer_id * 2");
        assert_eq!(count(db, "SELECT count(*) FROM silver.d WHERE order_id = 3 AND score = 24 AND order_total = 6.00"), 1, "{strategy}");
        match strategy {
            "replace_partition" => assert_eq!(filled, day),
            _ => assert_eq!((filled, count(db, "SELECT count(*) FROM silver.d WHERE dt = DATE '2026-10-20' AND score IS NULL")), (1, day - 1)),
        }
        assert_eq!(count(db, "SELECT count(*) FROM silver.d WHERE dt = DATE '2026-10-19' AND score IS NULL"), 2, "{strategy}: old rows read NULL");
        let again = j.load(d("2026-10-20"), db).unwrap();
        assert_eq!(again.output(), r.output(), "{strategy}: a rerun is a fixpoint");
        let once = everything(db);
        j.load(d("2026-10-20"), db).unwrap();
        assert_eq!(everything(db), once, "{strategy}");
    }
}

fn a_dropped_column_is_refused_by_default_and_left_null_when_asked(e: &dyn EngineUnderTest) {
    for strategy in ["replace_partition", "merge"] {
        let mut db = loaded(e, strategy);
        let db = db.as_mut();
        let before = everything(db);
        let narrower = "order_id, customer_id, order_total, updated_at, dt";
        let msg = schema_error(drift_job(strategy, narrower, "").load(d("2026-10-20"), db).unwrap_err());
        assert!(msg.contains("the source no longer returns column(s) currency "), "{strategy}: {msg}");
        assert_eq!(everything(db), before, "{strategy}: target unchanged");

        // A new order arrives for the day.
        exec(db, "INSERT INTO bronze.orders VALUES (9, 16, 1.00, 'EUR', TIMESTAMP '2026-10-20 13:00:00', DATE '2026-10-20')");
        let j = drift_job(strategy, narrower, "on_schema_change = \"append_new_columns\"");
        j.load(d("2026-10-20"), db).unwrap();
        assert_eq!(count(db, "SELECT count(*) FROM silver.d WHERE order_id = 9 AND currency IS NULL"), 1, "{strategy}: a written row gets NULL");
        let kept = count(db, "SELECT count(*) FROM silver.d WHERE dt = DATE '2026-10-20' AND currency IS NOT NULL");
        match strategy {
            // The day is rewritten: every row of it.
            "replace_partition" => assert_eq!(kept, 0),
            // Rows the merge did not change (same version) keep their value.
            _ => assert_eq!(kept, count(db, "SELECT count(*) FROM silver.d WHERE dt = DATE '2026-10-20'") - 1),
        }
        assert_eq!(count(db, "SELECT count(*) FROM silver.d WHERE dt = DATE '2026-10-19' AND currency IS NOT NULL"), 2, "{strategy}: other days keep theirs");
    }
}

fn a_changed_type_is_refused_under_both_settings(e: &dyn EngineUnderTest) {
    for strategy in ["replace_partition", "merge"] {
        let mut db = loaded(e, strategy);
        let db = db.as_mut();
        let before = everything(db);
        let retyped = "order_id, CAST(customer_id AS VARCHAR) AS customer_id, order_total, currency, updated_at, dt";
        for extra in ["", "on_schema_change = \"fail\"", "on_schema_change = \"append_new_columns\""] {
            let msg = schema_error(drift_job(strategy, retyped, extra).load(d("2026-10-20"), db).unwrap_err());
            assert!(msg.contains("the type of column(s) customer_id ("), "{strategy} {extra}: {msg}");
            assert!(msg.contains("in the target, ") && msg.contains("in the source)"), "{strategy} {extra}: both types are named: {msg}");
            assert!(msg.contains("never rewrites a column's type"), "{msg}");
            assert_eq!(everything(db), before, "{strategy} {extra}: target unchanged");
        }
        // A widening within the family is no drift (INTEGER into BIGINT).
        let narrow_int = "order_id, CAST(customer_id AS INTEGER) AS customer_id, order_total, currency, updated_at, dt";
        drift_job(strategy, narrow_int, "").load(d("2026-10-20"), db).unwrap();
    }
}

fn a_failed_run_does_not_keep_its_new_column(e: &dyn EngineUnderTest) {
    let mut db = loaded(e, "replace_partition");
    let db = db.as_mut();
    let before = everything(db);
    let j = drift_job("replace_partition", &format!("{BASE}, 1 AS score"), "on_schema_change = \"append_new_columns\"");
    let opts = RunOptions { fault: Some((FailPoint::BeforeCommit, FaultAction::Error)), ..RunOptions::default() };
    let err = j.load_with(d("2026-10-20"), db, &opts).unwrap_err();
    assert!(matches!(err, Error::Injected(FailPoint::BeforeCommit)), "{err}");
    let cols: Vec<String> = db.table_columns(&j.target).unwrap().unwrap().into_iter().map(|c| c.name).collect();
    assert!(!cols.contains(&"score".to_owned()), "the column is added in the run's transaction: {cols:?}");
    assert_eq!(everything(db), before);
    j.load(d("2026-10-20"), db).unwrap();
    assert_eq!(count(db, "SELECT count(*) FROM silver.d WHERE score = 1"), count(db, "SELECT count(*) FROM silver.d WHERE dt = DATE '2026-10-20'"));
}

fn a_column_with_a_default_is_not_a_drop(e: &dyn EngineUnderTest) {
    let mut db = e.fresh();
    let db = db.as_mut();
    exec(db, BRONZE);
    exec(db, "CREATE SCHEMA silver;\nCREATE TABLE silver.d (order_id BIGINT, customer_id BIGINT, order_total DECIMAL(12,2), currency VARCHAR, updated_at TIMESTAMP, dt DATE, region VARCHAR DEFAULT 'eu')");
    drift_job("replace_partition", BASE, "").load(d("2026-10-20"), db).unwrap();
    assert_eq!(count(db, "SELECT count(*) FROM silver.d WHERE region = 'eu'"), count(db, "SELECT count(*) FROM silver.d"));
}

fn the_setting_is_checked(_e: &dyn EngineUnderTest) {
    let err = fixpoint_core::Job::from_toml(
        "name = \"x\"\ntarget = \"s.t\"\nstrategy = \"replace_partition\"\npartition = \"dt\"\non_schema_change = \"sync_all_columns\"\n[source]\nsql = \"SELECT 1\"\n",
        std::path::Path::new("x.toml"),
    )
    .unwrap_err();
    assert_eq!(err.to_string(), "x.toml: on_schema_change: \"sync_all_columns\": expected \"fail\" or \"append_new_columns\"");
}

scenarios!(
    a_new_column_is_refused_by_default_and_appended_when_asked,
    a_dropped_column_is_refused_by_default_and_left_null_when_asked,
    a_changed_type_is_refused_under_both_settings,
    a_failed_run_does_not_keep_its_new_column,
    a_column_with_a_default_is_not_a_drop,
    the_setting_is_checked,
);
