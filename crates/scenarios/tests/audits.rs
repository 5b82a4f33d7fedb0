//! Audits before publish, run on every engine: each kind passing and
//! failing; a blocking failure publishes nothing; warnings are recorded.

use fixpoint_core::{Error, ErrorClass, RunOptions};
use fixpoint_core::run::ledger;
use fixpoint_scenarios::*;

fn with_audits(audits: &str) -> fixpoint_core::Job {
    job(&format!("{SILVER_JOB}\n{audits}"))
}

const PASSING: &str = r#"
[[audit]]
kind = "not_null"
columns = ["order_id", "order_total"]

[[audit]]
kind = "unique"
columns = ["order_id"]

[[audit]]
kind = "accepted_values"
column = "currency"
values = ["EUR", "USD", "GBP"]

[[audit]]
kind = "row_count"
min = 1
max = 100

[[audit]]
kind = "row_count_change"
max_drop_pct = 50
max_growth_pct = 300

[[audit]]
name = "positive totals"
kind = "expression"
expression = "order_total > 0"

[[audit]]
name = "no order before its day"
kind = "sql"
sql = "SELECT * FROM silver.orders WHERE dt = :run_date AND CAST(updated_at AS DATE) < dt"
"#;

fn every_kind_passes_on_a_good_day(e: &dyn EngineUnderTest) {
    let mut db = e.fresh();
    let db = db.as_mut();
    exec(db, BRONZE);
    let job = with_audits(PASSING);
    job.load(d("2026-10-19"), db).unwrap();
    let r = job.load(d("2026-10-20"), db).unwrap();
    let names: Vec<(&str, bool, u64)> = r.audits.iter().map(|a| (a.name.as_str(), a.passed, a.offending)).collect();
    assert_eq!(
        names,
        vec![
            ("not_null(order_id, order_total)", true, 0),
            ("unique(order_id)", true, 0),
            ("accepted_values(currency)", true, 0),
            ("row_count", true, 4),
            ("row_count_change", true, 4),
            ("positive totals", true, 0),
            ("no order before its day", true, 0),
        ]
    );
    assert_eq!(r.audits[4].detail, "4 row(s) against 2 before: +100.0%", "a new day is compared with the day before");
    let entry = ledger::entries(db, Some("silver_orders"), Some(d("2026-10-20")), Some(1)).unwrap().remove(0);
    assert_eq!(entry.audits, r.audits, "the ledger records the audits with the run");
    // A forced rerun audits the same staged result the same way.
    let again = job.load_with(d("2026-10-20"), db, &RunOptions { force: true, ..Default::default() }).unwrap();
    assert_eq!(again.output(), r.output());
    assert_eq!(again.audits[4].detail, "4 row(s) against 4 before: +0.0%");
}

fn a_failing_audit_publishes_nothing(e: &dyn EngineUnderTest) {
    let cases: [(&str, &str, &str, &str); 7] = [
        ("UPDATE bronze.orders SET customer_id = NULL WHERE order_id = 3", "kind = \"not_null\"\ncolumns = [\"customer_id\"]", "not_null(customer_id)", "1 row(s) with NULL in customer_id"),
        ("UPDATE bronze.orders SET order_id = 3 WHERE order_id = 6", "kind = \"unique\"\ncolumns = [\"currency\"]", "unique(currency)", "1 value(s) of (currency) on more than one row"),
        ("UPDATE bronze.orders SET currency = 'XXX' WHERE order_id = 5", "kind = \"accepted_values\"\ncolumn = \"currency\"\nvalues = [\"EUR\", \"USD\", \"GBP\"]", "accepted_values(currency)", "1 row(s) with currency outside [EUR, USD, GBP]"),
        ("INSERT INTO bronze.orders VALUES (9, 1, 1.00, 'EUR', TIMESTAMP '2026-10-20 20:00:00', DATE '2026-10-20')", "kind = \"row_count\"\nmax = 4", "row_count", "5 row(s); expected at most 4"),
        ("DELETE FROM bronze.orders WHERE order_id IN (3, 4, 5)", "kind = \"row_count_change\"\nmax_drop_pct = 50", "row_count_change", "1 row(s) against 4 before: -75.0%"),
        ("UPDATE bronze.orders SET order_total = -1 WHERE order_id = 6", "name = \"positive totals\"\nkind = \"expression\"\nexpression = \"order_total > 0\"", "positive totals", "1 row(s) where (order_total > 0) does not hold"),
        ("UPDATE bronze.orders SET order_total = 0.01 WHERE order_id = 6", "name = \"no tiny orders\"\nkind = \"sql\"\nsql = \"SELECT order_id FROM silver.orders WHERE dt = :run_date AND order_total < 1\"", "no tiny orders", "the query returned 1 offending row(s)"),
    ];
    for (change, audit, name, detail) in cases {
        let mut db = e.fresh();
        let db = db.as_mut();
        exec(db, BRONZE);
        let plain = job(SILVER_JOB);
        let before = plain.load(d("2026-10-20"), db).unwrap();
        let before_rows = rows(db, "SELECT * FROM silver.orders");
        exec(db, change);
        let audited = with_audits(&format!("[[audit]]\n{audit}\n"));
        let err = audited.load(d("2026-10-20"), db).unwrap_err();
        assert_eq!(err.class(), ErrorClass::Audit, "{name}: {err}");
        let Error::AuditFailed { audit: failed, detail: found, results, .. } = &err else { panic!("{err}") };
        assert_eq!((failed.as_str(), found.as_str()), (name, detail), "{err}");
        assert_eq!(results.len(), 1);
        assert!(err.to_string().starts_with(&format!("audit {name} failed: {detail}; nothing was published")), "{err}");
        assert_eq!(rows(db, "SELECT * FROM silver.orders"), before_rows, "{name}: the previous day stays");
        assert_eq!(day_fp(db, "silver.orders", "2026-10-20", &["load_id"]), before.output(), "{name}");
        assert_eq!(ledger::entries(db, None, None, None).unwrap().len(), 1, "{name}: no committed run");
        // As a warning it does not block, and is recorded.
        let warned = with_audits(&format!("[[audit]]\n{audit}\nseverity = \"warn\"\n"));
        let r = warned.load(d("2026-10-20"), db).unwrap();
        assert_eq!(r.outcome, "committed", "{name}");
        assert_eq!((r.audits[0].passed, r.audits[0].severity.as_str(), r.audits[0].detail.as_str()), (false, "warn", detail));
        let entry = ledger::entries(db, Some("silver_orders"), Some(d("2026-10-20")), Some(1)).unwrap().remove(0);
        assert!(!entry.audits[0].passed, "{name}: the warning is in the ledger");
    }
}

fn merge_audits_check_the_touched_keys(e: &dyn EngineUnderTest) {
    let mut db = e.fresh();
    let db = db.as_mut();
    exec(db, BRONZE);
    let merge = |audits: &str| job(&format!("{BRONZE_MERGE_JOB}\n{audits}"));
    let ok = merge("[[audit]]\nkind = \"unique\"\n\n[[audit]]\nkind = \"row_count\"\nmin = 1\n");
    let r19 = ok.load(d("2026-10-19"), db).unwrap();
    assert_eq!(r19.audits.iter().map(|a| (a.name.as_str(), a.passed)).collect::<Vec<_>>(), vec![("unique(order_id)", true), ("row_count", true)]);
    let before = rows(db, "SELECT * FROM silver.orders_m");
    let bad = merge("[[audit]]\nkind = \"accepted_values\"\ncolumn = \"currency\"\nvalues = [\"EUR\", \"USD\"]\n");
    let err = bad.load(d("2026-10-20"), db).unwrap_err();
    assert!(err.to_string().starts_with("audit accepted_values(currency) failed: 1 row(s) with currency outside [EUR, USD]; nothing was published"), "{err}");
    assert_eq!(rows(db, "SELECT * FROM silver.orders_m"), before, "the merge was rolled back");
}

fn bad_audits_are_refused_with_the_key(_e: &dyn EngineUnderTest) {
    for (audit, expected) in [
        ("kind = \"nope\"", "audit[0].kind: \"nope\": expected one of not_null, unique, accepted_values, row_count, row_count_change, expression, sql"),
        ("kind = \"not_null\"", "audit[0].columns: missing: name the columns, e.g. columns = [\"order_id\"]"),
        ("kind = \"row_count\"", "audit[0].min: row_count needs min, max or both"),
        ("kind = \"expression\"\nexpression = \"a > 1; DROP TABLE x\"", "audit[0].expression: "),
        ("kind = \"row_count\"\nmin = 1\nseverity = \"fatal\"", "audit[0].severity: \"fatal\": expected \"error\" or \"warn\""),
    ] {
        let err = fixpoint_core::Job::from_toml(&format!("{SILVER_JOB}\n[[audit]]\n{audit}\n"), std::path::Path::new("j.toml")).unwrap_err();
        assert!(err.to_string().starts_with(&format!("j.toml: {expected}")), "{err}");
    }
}

scenarios!(every_kind_passes_on_a_good_day, a_failing_audit_publishes_nothing, merge_audits_check_the_touched_keys, bad_audits_are_refused_with_the_key);

mod ledger_migration {
    use super::*;

    fn an_older_ledger_gains_the_audits_column(e: &dyn EngineUnderTest) {
        let mut db = e.fresh();
        let db = db.as_mut();
        exec(db, BRONZE);
        let plain = job(SILVER_JOB);
        plain.load(d("2026-10-19"), db).unwrap();
        // As session 1's fixpoint left it: no audits column.
        exec(db, "ALTER TABLE fixpoint.runs DROP COLUMN audits");
        assert_eq!(ledger::entries(db, None, None, None).unwrap().len(), 1, "reading migrates it");
        let audited = with_audits("[[audit]]\nkind = \"row_count\"\nmin = 1\n");
        let r = audited.load(d("2026-10-20"), db).unwrap();
        let entries = ledger::entries(db, Some("silver_orders"), Some(d("2026-10-20")), None).unwrap();
        assert_eq!(entries[0].audits, r.audits);
        assert!(ledger::entries(db, None, Some(d("2026-10-19")), None).unwrap()[0].audits.is_empty());
    }

    scenarios!(an_older_ledger_gains_the_audits_column);
}
