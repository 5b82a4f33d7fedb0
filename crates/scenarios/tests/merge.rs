//! merge scenarios, run on every engine, and a randomized model test.

use fixpoint_core::{Error, FailPoint, FaultAction, RunOptions, RunReport};
use fixpoint_core::run::ledger;
use fixpoint_scenarios::*;

const CHANGES: &str = "
CREATE SCHEMA staging;
CREATE TABLE staging.changes (batch DATE, order_id BIGINT, customer_id BIGINT, order_total DECIMAL(12,2), currency VARCHAR, updated_at TIMESTAMP, dt DATE, op VARCHAR)";

const MERGE_JOB: &str = r#"
name = "orders_merge"
target = "silver.orders"
strategy = "merge"
key = ["order_id"]
version = "updated_at"
partition = "dt"
deleted = "op = 'D'"

[source]
sql = "SELECT order_id, customer_id, order_total, currency, updated_at, dt, op FROM staging.changes WHERE batch = :run_date"
"#;

/// The same job without tombstones: every source row is an upsert (on
/// DuckDB, the merge that can be one statement).
fn upsert_job() -> fixpoint_core::Job {
    job(&MERGE_JOB.replace("deleted = \"op = 'D'\"\n", ""))
}

fn add(db: &mut dyn fixpoint_core::Engine, batch: &str, rows: &[&str]) {
    let values: Vec<String> = rows.iter().map(|r| format!("(DATE '{batch}', {r})")).collect();
    exec(db, &format!("INSERT INTO staging.changes VALUES {}", values.join(", ")));
}

fn target(db: &mut dyn fixpoint_core::Engine) -> Vec<Vec<String>> {
    rows(db, "SELECT order_id, order_total, updated_at, dt, op FROM silver.orders")
}

fn counts(r: &RunReport) -> (u64, u64, u64, u64, u64) {
    (r.rows_inserted, r.rows_updated, r.rows_deleted, r.rows_unchanged, r.duplicates_collapsed)
}

fn seed(db: &mut dyn fixpoint_core::Engine) {
    exec(db, CHANGES);
    // Monday: order 1 created; order 2 delivered twice (two versions); order 3 twice identically.
    add(db, "2026-10-19", &[
        "1, 10, 10.00, 'EUR', TIMESTAMP '2026-10-19 08:00:00', DATE '2026-10-19', 'U'",
        "2, 11, 20.00, 'EUR', TIMESTAMP '2026-10-19 08:00:00', DATE '2026-10-19', 'U'",
        "2, 11, 21.00, 'EUR', TIMESTAMP '2026-10-19 09:00:00', DATE '2026-10-19', 'U'",
        "3, 12, 30.00, 'USD', TIMESTAMP '2026-10-19 10:00:00', DATE '2026-10-19', 'U'",
        "3, 12, 30.00, 'USD', TIMESTAMP '2026-10-19 10:00:00', DATE '2026-10-19', 'U'",
    ]);
    // Tuesday: order 1 changes; order 4 arrives.
    add(db, "2026-10-20", &[
        "1, 10, 15.00, 'EUR', TIMESTAMP '2026-10-20 08:00:00', DATE '2026-10-19', 'U'",
        "4, 13, 40.00, 'GBP', TIMESTAMP '2026-10-20 09:00:00', DATE '2026-10-20', 'U'",
    ]);
    // Wednesday: order 2 is deleted.
    add(db, "2026-10-21", &["2, 11, NULL, NULL, TIMESTAMP '2026-10-21 08:00:00', DATE '2026-10-19', 'D'"]);
    // Thursday: order 2 comes back, newer than its delete.
    add(db, "2026-10-22", &["2, 11, 22.00, 'EUR', TIMESTAMP '2026-10-22 08:00:00', DATE '2026-10-19', 'U'"]);
}

fn seed_feed_replays_and_out_of_order(e: &dyn EngineUnderTest) {
    let mut db = e.fresh();
    let db = db.as_mut();
    seed(db);
    let job = job(MERGE_JOB);
    let mon = job.load(d("2026-10-19"), db).unwrap();
    assert_eq!(counts(&mon), (3, 0, 0, 0, 2), "two versions of order 2 and two copies of order 3 collapse");
    let tue = job.load(d("2026-10-20"), db).unwrap();
    assert_eq!(counts(&tue), (1, 1, 0, 0, 0));
    let after_tue = target(db);
    // The output fingerprint is that of the batch's keys as the target holds them.
    {
        use fixpoint_core::engine::measure::{fingerprint, Filter, Scope};
        let t = fixpoint_core::TableName::parse("silver.orders").unwrap();
        let cols = db.table_columns(&t).unwrap().unwrap();
        let scope = Scope::Table { table: &t, filter: Some(Filter::Predicate("order_id IN (1, 4)")) };
        assert_eq!(fingerprint(db, fixpoint_core::Method::Native, &scope, &cols).unwrap(), tue.output());
    }
    assert_eq!(after_tue[0], vec!["1", "\"15.00\"", "2026-10-20 08:00:00", "2026-10-19", "\"U\""]);
    assert_eq!(after_tue[1][1], "\"21.00\"", "the newest of Monday's two versions of order 2");
    // Monday's batch redelivered after Tuesday's: Tuesday's values stay.
    let replay = job.load(d("2026-10-19"), db).unwrap();
    assert_eq!(counts(&replay), (0, 0, 0, 3, 2));
    assert_eq!(target(db), after_tue);
    // Tuesday's batch applied twice: nothing the second time.
    let twice = job.load(d("2026-10-20"), db).unwrap();
    assert_eq!(counts(&twice), (0, 0, 0, 2, 0));
    assert_eq!(twice.run_key, tue.run_key);
    assert_eq!(twice.output(), tue.output());
    assert_eq!(target(db), after_tue);
    // Ledger: one row per run, with the report's counts.
    let entries = ledger::entries(db, Some("orders_merge"), Some(d("2026-10-19")), None).unwrap();
    assert_eq!(entries.len(), 2);
    assert!(entries.iter().all(|e| e.duplicates_collapsed == 2 && e.strategy == "merge"));
}

fn tombstones_delete_and_never_resurrect(e: &dyn EngineUnderTest) {
    let mut db = e.fresh();
    let db = db.as_mut();
    seed(db);
    let job = job(MERGE_JOB);
    for day in ["2026-10-19", "2026-10-20"] {
        job.load(d(day), db).unwrap();
    }
    let wed = job.load(d("2026-10-21"), db).unwrap();
    assert_eq!(counts(&wed), (0, 0, 1, 0, 0));
    assert_eq!(count(db, "SELECT count(*) FROM silver.orders WHERE order_id = 2"), 0);
    // Monday's older upserts replayed after the delete: order 2 stays deleted.
    let replay = job.load(d("2026-10-19"), db).unwrap();
    assert_eq!(replay.rows_inserted, 0);
    assert_eq!(count(db, "SELECT count(*) FROM silver.orders WHERE order_id = 2"), 0);
    // The delete replayed: nothing.
    assert_eq!(counts(&job.load(d("2026-10-21"), db).unwrap()), (0, 0, 0, 1, 0));
    // A newer upsert brings it back; replaying the delete then changes nothing.
    let thu = job.load(d("2026-10-22"), db).unwrap();
    assert_eq!(counts(&thu), (1, 0, 0, 0, 0));
    job.load(d("2026-10-21"), db).unwrap();
    assert_eq!(rows(db, "SELECT order_total FROM silver.orders WHERE order_id = 2"), vec![vec!["\"22.00\""]]);
    // Whatever the order of the four batches, the same table.
    let final_state = target(db);
    let mut other = e.fresh();
    seed(other.as_mut());
    for day in ["2026-10-22", "2026-10-21", "2026-10-20", "2026-10-19", "2026-10-21", "2026-10-19"] {
        job.load(d(day), other.as_mut()).unwrap();
    }
    assert_eq!(target(other.as_mut()), final_state);
}

/// A delete of a key the target never held changes no row, but is
/// remembered: an older version of that key arriving later stays out, and
/// a forced rerun of the delete stores it once.
fn a_tombstone_of_an_absent_key_is_remembered(e: &dyn EngineUnderTest) {
    let mut db = e.fresh();
    let db = db.as_mut();
    exec(db, CHANGES);
    add(db, "2026-10-21", &["9, 19, NULL, NULL, TIMESTAMP '2026-10-21 08:00:00', DATE '2026-10-19', 'D'", "5, 15, 50.00, 'EUR', TIMESTAMP '2026-10-21 08:00:00', DATE '2026-10-19', 'U'"]);
    add(db, "2026-10-19", &["9, 19, 90.00, 'EUR', TIMESTAMP '2026-10-19 08:00:00', DATE '2026-10-19', 'U'"]);
    let job = job(MERGE_JOB);
    let wed = job.load(d("2026-10-21"), db).unwrap();
    assert_eq!(counts(&wed), (1, 0, 0, 1, 0), "order 5 inserted; the delete of order 9 changes no row");
    let tombs = "SELECT count(*) FROM fixpoint.\"tombstones__silver__orders\" WHERE order_id = 9";
    assert_eq!(count(db, tombs), 1, "the delete of order 9 is remembered");
    let mon = job.load(d("2026-10-19"), db).unwrap();
    assert_eq!(counts(&mon), (0, 0, 0, 1, 0), "order 9's older version is beaten by its delete");
    assert_eq!(count(db, "SELECT count(*) FROM silver.orders WHERE order_id = 9"), 0);
    // Also when nothing at all is written: a batch of a delete alone.
    add(db, "2026-10-23", &["8, 18, NULL, NULL, TIMESTAMP '2026-10-23 08:00:00', DATE '2026-10-19', 'D'"]);
    add(db, "2026-10-18", &["8, 18, 80.00, 'EUR', TIMESTAMP '2026-10-18 08:00:00', DATE '2026-10-19', 'U'"]);
    let alone = job.load(d("2026-10-23"), db).unwrap();
    assert_eq!(counts(&alone), (0, 0, 0, 1, 0));
    assert_eq!(count(db, &tombs.replace("= 9", "= 8")), 1, "the delete of order 8 is remembered");
    let older = job.load(d("2026-10-18"), db).unwrap();
    assert_eq!(counts(&older), (0, 0, 0, 1, 0), "order 8's older version is beaten by its delete");
    // A forced rerun of the delete stores it once.
    job.load_with(d("2026-10-23"), db, &RunOptions { force: true, ..Default::default() }).unwrap();
    assert_eq!(count(db, &tombs.replace("= 9", "= 8")), 1, "stored once after a forced rerun");
    assert_eq!(rows(db, "SELECT order_id FROM silver.orders"), vec![vec!["5"]]);
}

fn ties_error_or_deterministic(e: &dyn EngineUnderTest) {
    let tie_rows = [
        "5, 14, 50.00, 'EUR', TIMESTAMP '2026-10-19 08:00:00', DATE '2026-10-19', 'U'",
        "5, 14, 55.00, 'EUR', TIMESTAMP '2026-10-19 08:00:00', DATE '2026-10-19', 'U'",
    ];
    // Without tombstones in the job (first: on Spark a fresh database
    // replaces the one before).
    {
        let mut db = e.fresh();
        exec(db.as_mut(), CHANGES);
        add(db.as_mut(), "2026-10-19", &tie_rows);
        let upserts = upsert_job();
        let err = upserts.load(d("2026-10-19"), db.as_mut()).unwrap_err().to_string();
        assert!(err.contains("1 key(s) have two different rows at the same version (updated_at), e.g. order_id = 5"), "{err}");
        let det = job(&MERGE_JOB.replace("deleted = \"op = 'D'\"\n", "on_tie = \"deterministic\"\n"));
        assert_eq!(det.load(d("2026-10-19"), db.as_mut()).unwrap().duplicates_collapsed, 1);
        assert_eq!(target(db.as_mut())[0][1], "\"50.00\"");
        add(db.as_mut(), "2026-10-20", &["5, 14, 45.00, 'EUR', TIMESTAMP '2026-10-19 08:00:00', DATE '2026-10-19', 'U'"]);
        let err = upserts.load(d("2026-10-20"), db.as_mut()).unwrap_err().to_string();
        assert!(err.contains("have a different row in the target at the same version"), "{err}");
        assert_eq!(target(db.as_mut())[0][1], "\"50.00\"", "refused: unchanged");
        assert_eq!(det.load(d("2026-10-20"), db.as_mut()).unwrap().rows_updated, 1, "45.00 sorts before 50.00");
        assert_eq!(target(db.as_mut())[0][1], "\"45.00\"");
        add(db.as_mut(), "2026-10-21", &["5, 14, 47.00, 'EUR', TIMESTAMP '2026-10-19 08:00:00', DATE '2026-10-19', 'U'"]);
        assert_eq!(counts(&det.load(d("2026-10-21"), db.as_mut()).unwrap()), (0, 0, 0, 1, 0), "47.00 sorts after 45.00: left alone");
        assert_eq!(target(db.as_mut())[0][1], "\"45.00\"");
    }
    let mut db = e.fresh();
    exec(db.as_mut(), CHANGES);
    add(db.as_mut(), "2026-10-19", &tie_rows);
    let orders = fixpoint_core::TableName::parse("silver.orders").unwrap();
    let made_ahead = db.table_columns(&orders).unwrap().is_some();
    let err = job(MERGE_JOB).load(d("2026-10-19"), db.as_mut()).unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, Error::DataRefused { .. }), "{msg}");
    assert!(msg.contains("1 key(s) have two different rows at the same version (updated_at), e.g. order_id = 5"), "{msg}");
    assert!(msg.contains("order_total: \"50.00\"") && msg.contains("order_total: \"55.00\""), "both rows are named: {msg}");
    // Nothing created (where the target was made ahead: nothing written).
    if made_ahead {
        assert_eq!(count(db.as_mut(), "SELECT count(*) FROM silver.orders"), 0, "nothing written");
    } else {
        assert!(db.table_columns(&orders).unwrap().is_none(), "nothing created");
    }
    // Deterministic: the row whose values sort first wins, whatever the arrival order.
    let det = job(&MERGE_JOB.replace("deleted = ", "on_tie = \"deterministic\"\ndeleted = "));
    let r = det.load(d("2026-10-19"), db.as_mut()).unwrap();
    assert_eq!(r.duplicates_collapsed, 1);
    let first_state = target(db.as_mut());
    assert_eq!(first_state[0][1], "\"50.00\"");
    // Across batches: the same key and version, different row, arriving later.
    add(db.as_mut(), "2026-10-20", &["5, 14, 45.00, 'EUR', TIMESTAMP '2026-10-19 08:00:00', DATE '2026-10-19', 'U'"]);
    let err = job(MERGE_JOB).load(d("2026-10-20"), db.as_mut()).unwrap_err();
    assert!(err.to_string().contains("have a different row in the target at the same version"), "{err}");
    let r = det.load(d("2026-10-20"), db.as_mut()).unwrap();
    assert_eq!(r.rows_updated, 1, "45.00 sorts before 50.00");
    assert_eq!(target(db.as_mut())[0][1], "\"45.00\"");
    // Exact duplicates are never a tie.
    add(db.as_mut(), "2026-10-21", &["6, 1, 1.00, 'EUR', TIMESTAMP '2026-10-21 08:00:00', DATE '2026-10-21', 'U'"; 3]);
    assert_eq!(counts(&job(MERGE_JOB).load(d("2026-10-21"), db.as_mut()).unwrap()), (1, 0, 0, 0, 2));
    // An upsert and a tombstone of one key at one version are no tie: the tombstone wins.
    add(db.as_mut(), "2026-10-22", &[
        "6, 1, 2.00, 'EUR', TIMESTAMP '2026-10-22 08:00:00', DATE '2026-10-21', 'U'",
        "6, 1, 3.00, 'EUR', TIMESTAMP '2026-10-22 08:00:00', DATE '2026-10-21', 'D'",
        "6, 1, 4.00, 'EUR', TIMESTAMP '2026-10-22 08:00:00', DATE '2026-10-21', 'U'",
    ]);
    assert_eq!(counts(&job(MERGE_JOB).load(d("2026-10-22"), db.as_mut()).unwrap()), (0, 0, 1, 0, 2));
    assert_eq!(count(db.as_mut(), "SELECT count(*) FROM silver.orders WHERE order_id = 6"), 0);
    // Replayed, it changes nothing; an older upsert does not bring the key back.
    assert_eq!(counts(&job(MERGE_JOB).load(d("2026-10-22"), db.as_mut()).unwrap()), (0, 0, 0, 1, 2));
    assert_eq!(counts(&job(MERGE_JOB).load(d("2026-10-21"), db.as_mut()).unwrap()), (0, 0, 0, 1, 2));
    assert_eq!(count(db.as_mut(), "SELECT count(*) FROM silver.orders WHERE order_id = 6"), 0);
    // With tombstones stored, a tie is still refused: in a new key, and in
    // a key whose stored tombstone beats the tied rows (the batch is
    // checked before the tombstones are applied).
    let before = target(db.as_mut());
    for (day, key, at) in [("2026-10-23", 7, "2026-10-23 08:00:00"), ("2026-10-24", 6, "2026-10-21 09:00:00")] {
        let tied = [1, 2].map(|total| format!("{key}, 1, {total}.00, 'EUR', TIMESTAMP '{at}', DATE '2026-10-21', 'U'"));
        add(db.as_mut(), day, &[tied[0].as_str(), tied[1].as_str(), "8, 1, 1.00, 'EUR', TIMESTAMP '2026-10-23 08:00:00', DATE '2026-10-21', 'U'"]);
        let err = job(MERGE_JOB).load(d(day), db.as_mut()).unwrap_err().to_string();
        assert!(err.contains(&format!("1 key(s) have two different rows at the same version (updated_at), e.g. order_id = {key}")), "{err}");
        assert_eq!(target(db.as_mut()), before, "refused: unchanged");
    }
    // The two tied rows in the other order: the same winner.
    let mut rev = e.fresh();
    exec(rev.as_mut(), CHANGES);
    add(rev.as_mut(), "2026-10-19", &[tie_rows[1], tie_rows[0]]);
    det.load(d("2026-10-19"), rev.as_mut()).unwrap();
    assert_eq!(target(rev.as_mut()), first_state);
}

fn null_keys_and_versions_are_refused(e: &dyn EngineUnderTest) {
    for job in [job(MERGE_JOB), upsert_job()] {
        let mut db = e.fresh();
        let db = db.as_mut();
        seed(db);
        job.load(d("2026-10-19"), db).unwrap();
        let before = target(db);
        add(db, "2026-10-23", &["NULL, 1, 1.00, 'EUR', TIMESTAMP '2026-10-23 08:00:00', DATE '2026-10-23', 'U'", "7, 1, 1.00, 'EUR', TIMESTAMP '2026-10-23 08:00:00', DATE '2026-10-23', 'U'"]);
        let err = job.load(d("2026-10-23"), db).unwrap_err().to_string();
        assert!(err.starts_with("1 source row(s) have a NULL in the key (order_id); one of them: {order_id: NULL"), "{err}");
        add(db, "2026-10-24", &["8, 1, 1.00, 'EUR', NULL, DATE '2026-10-24', 'U'"]);
        let err = job.load(d("2026-10-24"), db).unwrap_err().to_string();
        assert!(err.starts_with("1 source row(s) have a NULL version (updated_at); one of them: {order_id: 8"), "{err}");
        assert!(err.ends_with("nothing was changed"), "{err}");
        // A NULL version of a key the target holds.
        add(db, "2026-10-25", &["1, 10, 1.00, 'EUR', NULL, DATE '2026-10-19', 'U'"]);
        let err = job.load(d("2026-10-25"), db).unwrap_err().to_string();
        assert!(err.starts_with("1 source row(s) have a NULL version (updated_at); one of them: {order_id: 1"), "{err}");
        assert_eq!(target(db), before);
        assert_eq!(ledger::entries(db, Some("orders_merge"), None, None).unwrap().len(), 1);
    }
}

fn pruning_refuses_keys_in_untouched_partitions(e: &dyn EngineUnderTest) {
    // Upserts alone: a key moved to an untouched partition is refused, in
    // a batch with other keys too; one moved within the touched
    // partitions is moved.
    {
        let mut db = e.fresh();
        let db = db.as_mut();
        seed(db);
        let job = upsert_job();
        job.load(d("2026-10-19"), db).unwrap();
        job.load(d("2026-10-20"), db).unwrap();
        let before = target(db);
        add(db, "2026-10-25", &[
            "4, 13, 41.00, 'GBP', TIMESTAMP '2026-10-25 09:00:00', DATE '2026-10-25', 'U'",
            "7, 13, 70.00, 'GBP', TIMESTAMP '2026-10-25 09:00:00', DATE '2026-10-25', 'U'",
        ]);
        let err = job.load(d("2026-10-25"), db).unwrap_err().to_string();
        assert!(err.contains("held by the target in a partition the batch does not touch"), "{err}");
        assert!(err.contains("order_id: 4") && err.contains("target_dt: 2026-10-20") && err.contains("batch_dt: 2026-10-25"), "{err}");
        assert_eq!(target(db), before);
        add(db, "2026-10-26", &["4, 13, 39.00, 'GBP', TIMESTAMP '2026-10-01 09:00:00', DATE '2026-10-26', 'U'"]);
        let err = job.load(d("2026-10-26"), db).unwrap_err().to_string();
        assert!(err.contains("held by the target in a partition the batch does not touch") && err.contains("order_id: 4"), "{err}");
        assert_eq!(target(db), before);
        // Order 1 (in 2026-10-19) moves to 2026-10-20; the batch touches
        // both (orders 3 and 4 stay where they are).
        add(db, "2026-10-27", &[
            "1, 10, 16.00, 'EUR', TIMESTAMP '2026-10-27 08:00:00', DATE '2026-10-20', 'U'",
            "3, 12, 31.00, 'USD', TIMESTAMP '2026-10-27 08:00:00', DATE '2026-10-19', 'U'",
            "4, 13, 42.00, 'GBP', TIMESTAMP '2026-10-27 09:00:00', DATE '2026-10-20', 'U'",
            "1, 10, 16.00, 'EUR', TIMESTAMP '2026-10-27 08:00:00', DATE '2026-10-19', 'U'",
        ]);
        let err = job.load(d("2026-10-27"), db).unwrap_err().to_string();
        assert!(err.contains("1 key(s) have two different rows at the same version"), "two partitions at one version is a tie: {err}");
        assert_eq!(target(db), before);
        // The batch delivered again without the second copy of order 1.
        add(db, "2026-10-28", &[
            "1, 10, 16.00, 'EUR', TIMESTAMP '2026-10-27 08:00:00', DATE '2026-10-20', 'U'",
            "3, 12, 31.00, 'USD', TIMESTAMP '2026-10-27 08:00:00', DATE '2026-10-19', 'U'",
            "4, 13, 42.00, 'GBP', TIMESTAMP '2026-10-27 09:00:00', DATE '2026-10-20', 'U'",
        ]);
        let r = job.load(d("2026-10-28"), db).unwrap();
        assert_eq!(counts(&r), (0, 3, 0, 0, 0));
        assert_eq!(
            rows(db, "SELECT order_id, dt FROM silver.orders ORDER BY order_id"),
            vec![vec!["1", "2026-10-20"], vec!["2", "2026-10-19"], vec!["3", "2026-10-19"], vec!["4", "2026-10-20"]]
        );
        assert_eq!(counts(&job.load(d("2026-10-28"), db).unwrap()), (0, 0, 0, 3, 0), "replayed: nothing changes");
    }
    let mut db = e.fresh();
    let db = db.as_mut();
    seed(db);
    let job = job(MERGE_JOB);
    job.load(d("2026-10-19"), db).unwrap();
    job.load(d("2026-10-20"), db).unwrap();
    let before = target(db);
    // Order 4 lives in 2026-10-20; a batch that moves it to 2026-10-25 only touches 2026-10-25.
    add(db, "2026-10-25", &["4, 13, 41.00, 'GBP', TIMESTAMP '2026-10-25 09:00:00', DATE '2026-10-25', 'U'"]);
    let err = job.load(d("2026-10-25"), db).unwrap_err().to_string();
    assert!(err.contains("held by the target in a partition the batch does not touch"), "{err}");
    assert!(err.contains("order_id: 4") && err.contains("target_dt: 2026-10-20") && err.contains("batch_dt: 2026-10-25"), "{err}");
    assert_eq!(target(db), before);
    // The same key at an older version (left alone) or as a tombstone: refused all the same.
    add(db, "2026-10-26", &["4, 13, 39.00, 'GBP', TIMESTAMP '2026-10-01 09:00:00', DATE '2026-10-26', 'U'"]);
    add(db, "2026-10-27", &["4, 13, NULL, NULL, TIMESTAMP '2026-10-27 09:00:00', DATE '2026-10-27', 'D'"]);
    for day in ["2026-10-26", "2026-10-27"] {
        let err = job.load(d(day), db).unwrap_err().to_string();
        assert!(err.contains("held by the target in a partition the batch does not touch") && err.contains("order_id: 4"), "{day}: {err}");
        assert_eq!(target(db), before);
    }
    // Without `partition` the merge runs over the whole table and moves the row.
    let unpruned = job_unpruned();
    let r = unpruned.load(d("2026-10-25"), db).unwrap();
    assert_eq!(counts(&r), (0, 1, 0, 0, 0));
    assert_eq!(rows(db, "SELECT dt FROM silver.orders WHERE order_id = 4"), vec![vec!["2026-10-25"]]);
    assert_eq!(count(db, "SELECT count(*) FROM silver.orders"), 4);
}

fn job_unpruned() -> fixpoint_core::Job {
    job(&MERGE_JOB.replace("partition = \"dt\"\n", ""))
}

fn merge_failure_keeps_previous_contents(e: &dyn EngineUnderTest) {
    // Upserts alone.
    for point in FailPoint::ALL {
        let mut db = e.fresh();
        let db = db.as_mut();
        seed(db);
        let job = upsert_job();
        job.load(d("2026-10-19"), db).unwrap();
        let before = target(db);
        let opts = RunOptions { force: false, fault: Some((point, FaultAction::Error)), no_wait: false, ..RunOptions::default() };
        let err = job.load_with(d("2026-10-20"), db, &opts).unwrap_err();
        assert!(matches!(err, Error::Injected(p) if p == point), "{point}: {err}");
        if before_commit_point(db, point) {
            assert_eq!(target(db), before, "{point}");
        }
        assert_eq!(ledger::entries(db, Some("orders_merge"), None, None).unwrap().len(), 1, "{point}");
        let retry = job.load(d("2026-10-20"), db).unwrap();
        let expected = if before_commit_point(db, point) { (1, 1, 0, 0, 0) } else { (0, 0, 0, 2, 0) };
        assert_eq!(counts(&retry), expected, "{point}");
        assert_eq!(count(db, "SELECT count(*) FROM silver.orders"), 4, "{point}");
    }
    for point in FailPoint::ALL {
        let mut db = e.fresh();
        let db = db.as_mut();
        seed(db);
        let job = job(MERGE_JOB);
        job.load(d("2026-10-19"), db).unwrap();
        let before = target(db);
        let opts = RunOptions { force: false, fault: Some((point, FaultAction::Error)), no_wait: false, ..RunOptions::default() };
        let err = job.load_with(d("2026-10-21"), db, &opts).unwrap_err();
        assert!(matches!(err, Error::Injected(p) if p == point), "{point}: {err}");
        if before_commit_point(db, point) {
            assert_eq!(target(db), before, "{point}");
        }
        assert_eq!(ledger::entries(db, Some("orders_merge"), None, None).unwrap().len(), 1, "{point}");
        let retry = job.load(d("2026-10-21"), db).unwrap();
        assert_eq!(retry.rows_deleted, if before_commit_point(db, point) { 1 } else { 0 }, "{point}");
        assert_eq!(count(db, "SELECT count(*) FROM silver.orders WHERE order_id = 2"), 0, "{point}");
        // The tombstone was kept only by the committed retry: a replay of Monday does not resurrect.
        job.load(d("2026-10-19"), db).unwrap();
        assert_eq!(count(db, "SELECT count(*) FROM silver.orders WHERE order_id = 2"), 0, "{point}");
    }
}

fn merge_without_tombstones_or_partition(e: &dyn EngineUnderTest) {
    let mut db = e.fresh();
    let db = db.as_mut();
    seed(db);
    let plain = job(&MERGE_JOB.replace("deleted = \"op = 'D'\"\n", "").replace("partition = \"dt\"\n", ""));
    assert!(plain.merge.as_ref().unwrap().deleted.is_none());
    assert_eq!(counts(&plain.load(d("2026-10-19"), db).unwrap()), (3, 0, 0, 0, 2));
    assert_eq!(counts(&plain.load(d("2026-10-20"), db).unwrap()), (1, 1, 0, 0, 0));
    // Without `deleted` a 'D' row is an ordinary upsert.
    assert_eq!(counts(&plain.load(d("2026-10-21"), db).unwrap()), (0, 1, 0, 0, 0));
    assert_eq!(rows(db, "SELECT op FROM silver.orders WHERE order_id = 2"), vec![vec!["\"D\""]]);
    let t = fixpoint_core::TableName::parse("fixpoint.tombstones__silver__orders").unwrap();
    assert!(db.table_columns(&t).unwrap().is_none(), "no tombstone table without `deleted`");
}

/// A target whose types differ from the source's: the rows are written
/// cast to the target's types, and the output fingerprint is that of the
/// rows as the target holds them — whether the cast keeps the hashed value
/// (a DECIMAL of another precision in the same storage: on DuckDB the
/// input hash is reused) or changes it (a DECIMAL of another scale; an
/// INTEGER written to a BIGINT).
fn written_types_differ_from_the_source(e: &dyn EngineUnderTest) {
    let mut db = e.fresh();
    let db = db.as_mut();
    seed(db);
    exec(db, "CREATE SCHEMA silver");
    let t = fixpoint_core::TableName::parse("silver.orders").unwrap();
    // Partitioned by day where the merge rewrites the partitions it
    // touches (Spark, Delta); a plain table elsewhere.
    let (text, stored) = match db.name() {
        "spark" => ("STRING", " USING parquet PARTITIONED BY (dt)"),
        "delta" => ("VARCHAR", " PARTITIONED BY (dt)"),
        _ => ("VARCHAR", ""),
    };
    exec(db, &format!("CREATE TABLE silver.orders (order_id BIGINT, customer_id BIGINT, order_total DECIMAL(10,2), currency {text}, updated_at TIMESTAMP, dt DATE, op {text}){stored}"));
    let check = |db: &mut dyn fixpoint_core::Engine, r: &RunReport, keys: &str| {
        use fixpoint_core::engine::measure::{fingerprint, Filter, Scope};
        let cols = db.table_columns(&t).unwrap().unwrap();
        let filter = format!("order_id IN ({keys})");
        let scope = Scope::Table { table: &t, filter: Some(Filter::Predicate(&filter)) };
        assert_eq!(fingerprint(db, fixpoint_core::Method::Native, &scope, &cols).unwrap(), r.output(), "{keys}");
    };
    let decimal = upsert_job();
    let r = decimal.load(d("2026-10-19"), db).unwrap();
    assert_eq!(counts(&r), (3, 0, 0, 0, 2));
    check(db, &r, "1, 2, 3");
    let narrow = job(&MERGE_JOB.replace("deleted = \"op = 'D'\"\n", "").replace("SELECT order_id, customer_id, order_total,", "SELECT order_id, CAST(customer_id AS INTEGER) AS customer_id, CAST(order_total AS DECIMAL(12,3)) AS order_total,"));
    let r = narrow.load(d("2026-10-20"), db).unwrap();
    assert_eq!(counts(&r), (1, 1, 0, 0, 0));
    check(db, &r, "1, 4");
    assert_eq!(rows(db, "SELECT customer_id, order_total FROM silver.orders WHERE order_id = 4"), vec![vec!["13", "\"40.00\""]]);
    // The same batches again change nothing, and say so with the same fingerprint.
    let again = narrow.load(d("2026-10-20"), db).unwrap();
    assert_eq!((counts(&again), again.output_checksum.clone()), ((0, 0, 0, 2, 0), r.output_checksum.clone()));
}

/// Without `partition` the target is created unpartitioned. Every engine
/// that changes such a table in one atomic step merges into it (a
/// transaction; Delta rewrites only the files holding a touched key, in one
/// commit). Spark overwrites an unpartitioned table by deleting its files
/// first: refused there, naming the fix, and nothing is created.
fn an_unpartitioned_target(e: &dyn EngineUnderTest) {
    let mut db = e.fresh();
    let db = db.as_mut();
    seed(db);
    let plain = job(&MERGE_JOB.replace("partition = \"dt\"\n", ""));
    if !db.leases().is_none_or(|l| l.replaces_rows()) {
        let err = plain.load(d("2026-10-19"), db).unwrap_err();
        assert!(err.to_string().contains("silver.orders would be created unpartitioned (the job has no `partition`)"), "{err}");
        assert!(err.hint().unwrap().contains("set `partition` in the job"), "{err}");
        assert!(db.table_columns(&fixpoint_core::TableName::parse("silver.orders").unwrap()).unwrap().is_none(), "nothing created");
        return;
    }
    let all = "SELECT order_id, order_total FROM silver.orders";
    let mon = plain.load(d("2026-10-19"), db).unwrap();
    assert_eq!(counts(&mon), (3, 0, 0, 0, 2));
    assert_eq!(counts(&plain.load(d("2026-10-20"), db).unwrap()), (1, 1, 0, 0, 0));
    assert_eq!(counts(&plain.load(d("2026-10-21"), db).unwrap()), (0, 0, 1, 0, 0));
    let after_wed = vec![vec!["1", "\"15.00\""], vec!["3", "\"30.00\""], vec!["4", "\"40.00\""]];
    assert_eq!(rows(db, all), after_wed);
    // Monday again: order 2 stays deleted, nothing changes.
    let replay = plain.load(d("2026-10-19"), db).unwrap();
    assert_eq!((replay.rows_inserted, replay.rows_updated, replay.rows_deleted), (0, 0, 0));
    assert_eq!(rows(db, all), after_wed);
    // Thursday brings order 2 back; the batch again changes nothing.
    let thu = plain.load(d("2026-10-22"), db).unwrap();
    assert_eq!(counts(&thu), (1, 0, 0, 0, 0));
    let again = plain.load_with(d("2026-10-22"), db, &RunOptions { force: true, ..Default::default() }).unwrap();
    assert_eq!((counts(&again), again.output()), ((0, 0, 0, 1, 0), thu.output()));
    assert_eq!(rows(db, all), vec![vec!["1", "\"15.00\""], vec!["2", "\"22.00\""], vec!["3", "\"30.00\""], vec!["4", "\"40.00\""]]);
}

fn merge_backfills_batch_by_batch(e: &dyn EngineUnderTest) {
    use fixpoint_core::tools::backfill::{backfill, BackfillOptions, DateOutcome};
    let mut db = e.fresh();
    let db = db.as_mut();
    seed(db);
    let job = job(MERGE_JOB);
    let dates = fixpoint_core::RunDate::range(d("2026-10-19"), d("2026-10-22"));
    let first = backfill(&job, &dates, db, &BackfillOptions::default(), |_| {});
    assert!(first.iter().all(|o| matches!(o, DateOutcome::Done(_))));
    let state = target(db);
    // The whole range again: every batch is a replay, nothing changes.
    let again = backfill(&job, &dates, db, &BackfillOptions::default(), |_| {});
    for o in &again {
        let DateOutcome::Done(r) = o else { panic!("{o:?}") };
        assert_eq!((r.rows_inserted, r.rows_updated, r.rows_deleted), (0, 0, 0), "{}", r.run_date);
    }
    assert_eq!(target(db), state);
}

fn generated_target_key_is_found(e: &dyn EngineUnderTest) {
    use fixpoint_core::tools::lint::{lint_target, Severity};
    let mut db = e.fresh();
    let db = db.as_mut();
    exec(db, "CREATE SCHEMA silver;\nCREATE SEQUENCE silver.order_ids;\nCREATE TABLE silver.orders (order_id BIGINT DEFAULT nextval('silver.order_ids'), customer_id BIGINT, order_total DECIMAL(12,2), currency VARCHAR, updated_at TIMESTAMP, dt DATE, op VARCHAR)");
    let f = lint_target(&job(MERGE_JOB), db).unwrap();
    assert_eq!(f.len(), 1, "{f:?}");
    assert_eq!((f[0].rule, f[0].severity), ("keys", Severity::Error));
    assert!(f[0].message.starts_with("the merge key order_id of silver.orders is generated by the database (DEFAULT nextval("), "{}", f[0].message);
    // A natural key with no default is fine.
    exec(db, "DROP TABLE silver.orders;\nCREATE TABLE silver.orders (order_id BIGINT, customer_id BIGINT DEFAULT nextval('silver.order_ids'), order_total DECIMAL(12,2), currency VARCHAR, updated_at TIMESTAMP, dt DATE, op VARCHAR)");
    assert_eq!(lint_target(&job(MERGE_JOB), db).unwrap(), vec![]);
}

#[test]
fn duckdb_plans_agree() {
    both_duckdb_plans_agree(&DuckDbUnderTest);
}

/// Calls `$callback!(<prefix> <the merge scenarios>, <extra>)`: the
/// scenarios every engine runs, again where an engine's fast plans are
/// off, written once.
macro_rules! with_join_plan_scenarios {
    ($callback:ident ! ($($prefix:tt)*) $(, $extra:ident)*) => {
        $callback!($($prefix)*
            written_types_differ_from_the_source,
            merge_backfills_batch_by_batch,
            merge_without_tombstones_or_partition,
            seed_feed_replays_and_out_of_order,
            tombstones_delete_and_never_resurrect,
            a_tombstone_of_an_absent_key_is_remembered,
            ties_error_or_deterministic,
            null_keys_and_versions_are_refused,
            pruning_refuses_keys_in_untouched_partitions,
            merge_failure_keeps_previous_contents,
            a_new_column_and_a_key_held_twice,
            $($extra),*
        );
    };
}

// The merge scenarios on every engine (the first three only on its default plans).
with_join_plan_scenarios!(scenarios!(generated_target_key_is_found, wrong_input_changes_nothing, an_unpartitioned_target,));

// Every merge scenario again on DuckDB without its taps: the plan the
// other transactional engines run, on the engine whose default plans fold
// the checks into their statements.
with_join_plan_scenarios!(scenarios_on!(duckdb_without_taps, fixpoint_scenarios::DuckDbWithoutTapsUnderTest;), both_duckdb_plans_agree);

/// The two DuckDB plans (checks folded into the statements; checks as
/// joins of their own) give the same reports — counts, input and output
/// fingerprints, run keys — and the same table, batch after batch; the
/// folded plan is the one taken when nothing needs explaining.
fn both_duckdb_plans_agree(_: &dyn EngineUnderTest) {
    let mut fast = DuckDbUnderTest.fresh();
    let mut slow = fixpoint_scenarios::DuckDbWithoutTapsUnderTest.fresh();
    for db in [&mut fast, &mut slow] {
        seed(db.as_mut());
        add(db.as_mut(), "2026-10-23", &[
            "1, 11, 12.00, 'EUR', TIMESTAMP '2026-10-23 08:00:00', DATE '2026-10-19', 'U'",
            "9, 19, 90.00, 'USD', TIMESTAMP '2026-10-23 08:00:00', DATE '2026-10-23', 'U'",
            "9, 19, 90.00, 'USD', TIMESTAMP '2026-10-23 08:00:00', DATE '2026-10-23', 'U'",
            "3, 13, 0.00, 'EUR', TIMESTAMP '2026-10-23 09:00:00', DATE '2026-10-20', 'D'",
        ]);
    }
    let job = job(MERGE_JOB);
    let unpruned = job_unpruned();
    let days = ["2026-10-19", "2026-10-20", "2026-10-21", "2026-10-19", "2026-10-23", "2026-10-23", "2026-10-20"];
    let mut methods = Vec::new();
    for (i, day) in days.iter().enumerate() {
        let j = if i % 2 == 0 { &job } else { &unpruned };
        let a = j.load(d(day), fast.as_mut()).unwrap();
        let b = j.load(d(day), slow.as_mut()).unwrap();
        let summary = |r: &RunReport| (counts(r), r.run_key.clone(), r.input_rows, r.input_checksum.clone(), r.output_rows, r.output_checksum.clone());
        assert_eq!(summary(&a), summary(&b), "{day}");
        assert_eq!(b.method, "merge", "{day}");
        methods.push(a.method.clone());
        assert_eq!(target(fast.as_mut()), target(slow.as_mut()), "{day}");
    }
    assert!(methods.iter().all(|m| m == "merge, checks in the statement"), "{methods:?}");
    // A source whose tombstones come from a branch of their own: there the
    // tombstone flag is a constant the engine may fold into the taps' arguments.
    let branches = "SELECT order_id, customer_id, order_total, currency, updated_at, dt, 'D' AS op FROM staging.changes WHERE batch = :run_date AND op = 'D' \
                    UNION ALL SELECT order_id, customer_id, order_total, currency, updated_at, dt, 'U' AS op FROM staging.changes WHERE batch = :run_date AND op <> 'D'";
    let union = fixpoint_scenarios::job(&MERGE_JOB.replace("SELECT order_id, customer_id, order_total, currency, updated_at, dt, op FROM staging.changes WHERE batch = :run_date", branches));
    for db in [&mut fast, &mut slow] {
        add(db.as_mut(), "2026-10-24", &[
            "4, 13, NULL, NULL, TIMESTAMP '2026-10-24 08:00:00', DATE '2026-10-20', 'D'",
            "5, 15, 50.00, 'EUR', TIMESTAMP '2026-10-24 08:00:00', DATE '2026-10-20', 'U'",
            "5, 15, 50.00, 'EUR', TIMESTAMP '2026-10-24 08:00:00', DATE '2026-10-20', 'U'",
        ]);
    }
    let a = union.load(d("2026-10-24"), fast.as_mut()).unwrap();
    let b = union.load(d("2026-10-24"), slow.as_mut()).unwrap();
    let summary = |r: &RunReport| (counts(r), r.run_key.clone(), r.input_rows, r.input_checksum.clone(), r.output_rows, r.output_checksum.clone());
    assert_eq!(summary(&a), summary(&b));
    assert_eq!((counts(&a), a.input_rows, a.method.as_str()), ((1, 0, 1, 0, 1), 3, "merge, checks in the statement"));
    assert_eq!(target(fast.as_mut()), target(slow.as_mut()));
}

// Every merge scenario again on PostgreSQL with the one-statement merge
// off: the portable plan runs where it would.
with_join_plan_scenarios!(postgres_portable_scenarios!());

/// `silver.orders` as the merge scenarios' first run would make it, with a
/// primary key on the merge key.
const KEYED_ORDERS: &str = "CREATE SCHEMA silver;\nCREATE TABLE silver.orders (order_id BIGINT PRIMARY KEY, customer_id BIGINT, order_total DECIMAL(12,2), currency VARCHAR, updated_at TIMESTAMP, dt DATE, op VARCHAR)";

/// The merge scenarios again on PostgreSQL with the target made first,
/// keyed by a primary key on `order_id`: where the one-statement plan
/// runs, its updates join on the key.
macro_rules! postgres_keyed_scenarios {
    ($($name:ident),* $(,)?) => {
        mod postgres_keyed {
            $(
                #[test]
                fn $name() {
                    if let Some(pg) = fixpoint_scenarios::PgUnderTest::get() {
                        super::$name(&pg.with_setup(super::KEYED_ORDERS));
                    }
                }
            )*
        }
    };
}
postgres_keyed_scenarios!(
    merge_backfills_batch_by_batch,
    merge_without_tombstones_or_partition,
    seed_feed_replays_and_out_of_order,
    ties_error_or_deterministic,
    null_keys_and_versions_are_refused,
    pruning_refuses_keys_in_untouched_partitions,
    merge_failure_keeps_previous_contents,
);

// The scenarios whose jobs can take the one-statement plan, again on
// DuckDB with that plan off: the two-statement plan runs them.
scenarios_on!(duckdb_two_statements, fixpoint_scenarios::DuckDbTwoStatementsUnderTest;
    written_types_differ_from_the_source,
    merge_without_tombstones_or_partition,
    ties_error_or_deterministic,
    null_keys_and_versions_are_refused,
    pruning_refuses_keys_in_untouched_partitions,
    merge_failure_keeps_previous_contents,
);

/// The three DuckDB plans (one statement; two statements; the checks as
/// joins of their own) give the same reports and the same table for a job
/// without tombstones, batch after batch, pruned and not; the
/// one-statement plan is taken unless a key moves between partitions,
/// which it declines: the portable plan then runs.
#[test]
fn duckdb_plans_agree_on_upserts() {
    let mut engines = [DuckDbUnderTest.fresh(), fixpoint_scenarios::DuckDbTwoStatementsUnderTest.fresh(), fixpoint_scenarios::DuckDbWithoutTapsUnderTest.fresh()];
    plans_agree_on_upserts(&mut engines, |one| vec![one, "merge, checks in the statement", "merge"]);
}

/// The three PostgreSQL plans (one statement; one statement updating on
/// the key, where a primary key makes it unique; the checks as joins of
/// their own) give the same reports and the same table, as the DuckDB
/// plans do above; the one-statement plans decline the batch that moves a
/// key between partitions.
#[test]
fn postgres_plans_agree_on_upserts() {
    let Some(pg) = PgUnderTest::get() else { return };
    let mut keyed = pg.fresh();
    // The target as fixpoint would create it, with a primary key.
    exec(keyed.as_mut(), KEYED_ORDERS);
    let mut engines = [pg.fresh(), keyed, pg.portable().fresh()];
    plans_agree_on_upserts(&mut engines, |one| match one {
        "merge, one statement" => vec![one, "merge, one statement, updates on the key", "merge"],
        _ => vec![one, one, "merge"],
    });
}

/// Runs the same upsert batches on each engine of `engines` (the first
/// with every plan on) and compares their reports and tables; `methods`
/// gives the methods expected of them from the first's.
fn plans_agree_on_upserts(engines: &mut [Box<dyn fixpoint_core::Engine>], methods: fn(&'static str) -> Vec<&'static str>) {
    for db in engines.iter_mut() {
        seed(db.as_mut());
        add(db.as_mut(), "2026-10-23", &[
            "1, 11, 12.00, 'EUR', TIMESTAMP '2026-10-23 08:00:00', DATE '2026-10-19', 'U'",
            "9, 19, 90.00, 'USD', TIMESTAMP '2026-10-23 08:00:00', DATE '2026-10-23', 'U'",
            "9, 19, 90.00, 'USD', TIMESTAMP '2026-10-23 08:00:00', DATE '2026-10-23', 'U'",
            "3, 13, 0.00, 'EUR', TIMESTAMP '2026-10-23 09:00:00', DATE '2026-10-20', 'U'",
        ]);
    }
    let pruned = upsert_job();
    let unpruned = job(&MERGE_JOB.replace("deleted = \"op = 'D'\"\n", "").replace("partition = \"dt\"\n", ""));
    // (batch, pruned, the method with every plan on): order 3 moves from
    // 2026-10-19 to 2026-10-20 in the pruned run of 2026-10-23.
    let one = "merge, one statement";
    let runs = [
        ("2026-10-19", true, one, (3, 0, 0, 0, 2)),
        ("2026-10-20", false, one, (1, 1, 0, 0, 0)),
        ("2026-10-21", true, one, (0, 1, 0, 0, 0)),
        ("2026-10-19", false, one, (0, 0, 0, 3, 2)),
        ("2026-10-23", true, "merge", (1, 2, 0, 0, 1)),
        ("2026-10-23", false, one, (0, 0, 0, 3, 1)),
        ("2026-10-22", true, one, (0, 1, 0, 0, 0)),
        ("2026-10-20", true, one, (0, 0, 0, 2, 0)),
    ];
    for (day, prune, method, expected) in runs {
        let j = if prune { &pruned } else { &unpruned };
        let reports: Vec<RunReport> = engines.iter_mut().map(|db| j.load(d(day), db.as_mut()).unwrap()).collect();
        let summary = |r: &RunReport| (counts(r), r.run_key.clone(), r.input_rows, r.input_checksum.clone(), r.output_rows, r.output_checksum.clone());
        assert_eq!(counts(&reports[0]), expected, "{day}");
        for other in &reports[1..] {
            assert_eq!(summary(&reports[0]), summary(other), "{day}");
        }
        let got: Vec<&str> = reports.iter().map(|r| r.method.as_str()).collect();
        assert_eq!(got, methods(method), "{day}");
        let t = target(engines[0].as_mut());
        for other in engines[1..].iter_mut() {
            assert_eq!(t, target(other.as_mut()), "{day}");
        }
        // The output fingerprint is that of the batch's keys as the target holds them.
        let keys = rows(engines[0].as_mut(), &format!("SELECT DISTINCT order_id FROM staging.changes WHERE batch = DATE '{day}'"));
        let keys: Vec<String> = keys.into_iter().map(|r| r[0].clone()).collect();
        let table = fixpoint_core::TableName::parse("silver.orders").unwrap();
        let db = engines[0].as_mut();
        let cols = db.table_columns(&table).unwrap().unwrap();
        let filter = format!("order_id IN ({})", keys.join(", "));
        let scope = fixpoint_core::engine::measure::Scope::Table { table: &table, filter: Some(fixpoint_core::engine::measure::Filter::Predicate(&filter)) };
        assert_eq!(fixpoint_core::engine::measure::fingerprint(db, fixpoint_core::Method::Native, &scope, &cols).unwrap(), reports[0].output(), "{day}");
    }
    assert_eq!(count(engines[0].as_mut(), "SELECT count(*) FROM silver.orders"), 5);
}


/// Wrong input changes nothing, on every engine Spark included (the
/// DuckDB and PostgreSQL variants of each are in wrong_input.rs): a source
/// reading its own target, a target in fixpoint's schema, a version without
/// a meaningful order, a key `append_new_columns` would add. Each is refused
/// as bad input before anything is written.
fn wrong_input_changes_nothing(e: &dyn EngineUnderTest) {
    let mut db = e.fresh();
    let db = db.as_mut();
    seed(db);
    let merge = job(MERGE_JOB);
    merge.load(d("2026-10-19"), db).unwrap();
    let before = target(db);
    let runs = count(db, "SELECT count(*) FROM fixpoint.runs");
    let input = |e: &Error| assert_eq!(e.class(), fixpoint_core::ErrorClass::Input, "{e}");

    let mut own = merge.clone();
    own.source = own.source.with_sql("SELECT order_id, customer_id, order_total, currency, updated_at, dt, op FROM silver.orders".into()).unwrap();
    let err = own.load(d("2026-10-20"), db).unwrap_err();
    input(&err);
    assert!(err.to_string().contains("the source reads the job's own target silver.orders"), "{err}");

    let mut reserved = merge.clone();
    reserved.target = fixpoint_core::TableName::parse("fixpoint.runs").unwrap();
    let err = reserved.load(d("2026-10-20"), db).unwrap_err();
    input(&err);
    assert!(err.to_string().contains("is reserved for"), "{err}");

    let text_version = job(&MERGE_JOB.replace(
        "SELECT order_id, customer_id, order_total, currency, updated_at,",
        "SELECT order_id, customer_id, order_total, currency, CAST(updated_at AS VARCHAR) AS updated_at,",
    ));
    let err = text_version.load(d("2026-10-20"), db).unwrap_err();
    input(&err);
    assert!(err.to_string().contains("updated_at"), "{err}");

    let appended_key = job(
        &MERGE_JOB
            .replace("key = [\"order_id\"]", "key = [\"order_ref\"]\non_schema_change = \"append_new_columns\"")
            .replace("SELECT order_id,", "SELECT order_id AS order_ref, order_id,"),
    );
    let err = appended_key.load(d("2026-10-20"), db).unwrap_err();
    input(&err);
    assert!(err.to_string().contains("order_ref") && err.to_string().contains("cannot be appended"), "{err}");

    assert_eq!(target(db), before, "the target is as it was");
    assert_eq!(count(db, "SELECT count(*) FROM fixpoint.runs"), runs, "no ledger row");
}

/// A column the source adds (`append_new_columns`) is appended, NULL in
/// the rows the batch leaves and the batch's value in those it writes, with
/// the output fingerprint of the rows as stored; a target that holds a
/// batch key twice in a touched partition is refused naming the key, with
/// nothing changed and no ledger row. (On the rewrite of partitions both
/// are read off the ranked rows.)
fn a_new_column_and_a_key_held_twice(e: &dyn EngineUnderTest) {
    use fixpoint_core::engine::measure::{fingerprint, Filter, Scope};
    let mut db = e.fresh();
    let db = db.as_mut();
    seed(db);
    let merge = job(MERGE_JOB);
    merge.load(d("2026-10-19"), db).unwrap();
    let wider = job(&MERGE_JOB
        .replace("partition = \"dt\"\n", "partition = \"dt\"\non_schema_change = \"append_new_columns\"\n")
        .replace(", op FROM staging.changes", ", op, CAST(customer_id + 100 AS BIGINT) AS tier FROM staging.changes"));
    let r = wider.load(d("2026-10-20"), db).unwrap();
    assert_eq!(counts(&r), (1, 1, 0, 0, 0));
    assert_eq!(
        rows(db, "SELECT order_id, order_total, tier, dt FROM silver.orders ORDER BY order_id"),
        vec![
            vec!["1", "\"15.00\"", "110", "2026-10-19"],
            vec!["2", "\"21.00\"", "NULL", "2026-10-19"],
            vec!["3", "\"30.00\"", "NULL", "2026-10-19"],
            vec!["4", "\"40.00\"", "113", "2026-10-20"],
        ]
    );
    let t = fixpoint_core::TableName::parse("silver.orders").unwrap();
    let cols = db.table_columns(&t).unwrap().unwrap();
    let scope = Scope::Table { table: &t, filter: Some(Filter::Predicate("order_id IN (1, 4)")) };
    assert_eq!(fingerprint(db, fixpoint_core::Method::Native, &scope, &cols).unwrap(), r.output(), "the output fingerprint is the stored rows'");

    // Order 3 held twice in its partition: the key is not the table's.
    exec(db, "INSERT INTO silver.orders (order_id, customer_id, order_total, currency, updated_at, dt, op, tier) VALUES (3, 12, 99.00, 'USD', TIMESTAMP '2026-10-18 10:00:00', DATE '2026-10-19', 'U', 112)");
    let before = target(db);
    let runs = count(db, "SELECT count(*) FROM fixpoint.runs");
    add(db, "2026-10-23", &["3, 12, 33.00, 'USD', TIMESTAMP '2026-10-23 10:00:00', DATE '2026-10-19', 'U'"]);
    let err = wider.load(d("2026-10-23"), db).unwrap_err();
    let msg = err.to_string();
    assert!(msg.contains("holds more than one row for a key of the batch") && msg.contains("order_id: 3"), "{msg}");
    assert_eq!(target(db), before, "nothing changed");
    assert_eq!(count(db, "SELECT count(*) FROM fixpoint.runs"), runs, "no ledger row");
}

leased_scenarios!(
    a_new_column_and_a_key_held_twice,
    written_types_differ_from_the_source,
    merge_backfills_batch_by_batch,
    wrong_input_changes_nothing,
    an_unpartitioned_target,
    seed_feed_replays_and_out_of_order,
    tombstones_delete_and_never_resurrect,
    a_tombstone_of_an_absent_key_is_remembered,
    ties_error_or_deterministic,
    null_keys_and_versions_are_refused,
    pruning_refuses_keys_in_untouched_partitions,
    merge_failure_keeps_previous_contents,
);

/// The randomized model test: random batches (duplicates, redeliveries,
/// out-of-order versions, tombstones, exact copies), applied in random
/// orders with repeats; the target must equal a plain-Rust model of "the
/// winner per key".
mod model {
    use super::*;
    use proptest::prelude::*;

    #[derive(Debug, Clone, PartialEq, Eq)]
    struct Row {
        k: i64,
        v: i64,
        amount: Option<i64>,
        cur: Option<&'static str>,
        del: bool,
    }

    impl Row {
        fn sql(&self) -> String {
            format!(
                "{}, {}, {}, {}, {}, {}",
                self.k,
                self.v,
                self.amount.map_or("NULL".into(), |a| a.to_string()),
                self.cur.map_or("NULL".into(), |c| format!("'{c}'")),
                if self.del { "'D'" } else { "'U'" },
                self.k % 3
            )
        }
    }

    fn row() -> impl Strategy<Value = Row> {
        (0i64..6, 0i64..5, proptest::option::of(0i64..3), proptest::option::of(prop_oneof![Just("EUR"), Just("USD")]), proptest::bool::weighted(0.2))
            .prop_map(|(k, v, amount, cur, del)| Row { k, v, amount, cur, del })
    }

    /// The winner among rows: highest version, then tombstone, then the
    /// values in ascending order, NULLs first (amount, cur, op, p).
    fn better(a: &Row, b: &Row) -> bool {
        if a.v != b.v {
            return a.v > b.v;
        }
        if a.del != b.del {
            return a.del;
        }
        let op = |r: &Row| if r.del { "D" } else { "U" };
        (a.amount, a.cur, op(a)) < (b.amount, b.cur, op(b))
    }

    /// The same without tombstones: a 'D' row is an upsert like any other.
    fn better_upsert(a: &Row, b: &Row) -> bool {
        if a.v != b.v {
            return a.v > b.v;
        }
        let op = |r: &Row| if r.del { "D" } else { "U" };
        (a.amount, a.cur, op(a)) < (b.amount, b.cur, op(b))
    }

    fn model(seen: &[Row], upserts: bool) -> Vec<Vec<String>> {
        let mut winners: std::collections::BTreeMap<i64, Row> = Default::default();
        for r in seen {
            let wins = |w: &Row| if upserts { better_upsert(r, w) } else { better(r, w) };
            match winners.get(&r.k) {
                Some(w) if !wins(w) => {}
                _ => {
                    winners.insert(r.k, r.clone());
                }
            }
        }
        let mut out: Vec<Vec<String>> = winners
            .values()
            .filter(|r| upserts || !r.del)
            .map(|r| {
                vec![
                    r.k.to_string(),
                    r.v.to_string(),
                    r.amount.map_or("NULL".into(), |a| a.to_string()),
                    r.cur.map_or("NULL".into(), |c| format!("{c:?}")),
                    (r.k % 3).to_string(),
                ]
            })
            .collect();
        out.sort();
        out
    }

    const JOB: &str = r#"
name = "model"
target = "m.t"
strategy = "merge"
key = ["k"]
version = "v"
partition = "p"
deleted = "op = 'D'"
on_tie = "deterministic"

[source]
sql = "SELECT k, v, amount, cur, op, p FROM m.changes WHERE batch = :run_date"
"#;

    /// Batch `i`'s day.
    fn day(i: usize) -> String {
        format!("2026-10-{:02}", i + 1)
    }

    /// `m.changes`, each batch's rows under its day.
    fn seed_batches(db: &mut dyn fixpoint_core::Engine, batches: &[Vec<Row>]) {
        for (i, b) in batches.iter().enumerate() {
            if !b.is_empty() {
                let values: Vec<String> = b.iter().map(|r| format!("(DATE '{}', {})", day(i), r.sql())).collect();
                exec(db, &format!("INSERT INTO m.changes VALUES {}", values.join(", ")));
            }
        }
    }

    fn check(batches: Vec<Vec<Row>>, order: Vec<usize>, engine: &dyn EngineUnderTest) -> Result<(), TestCaseError> {
        check_job(batches, order, engine, false)
    }

    fn check_job(batches: Vec<Vec<Row>>, order: Vec<usize>, engine: &dyn EngineUnderTest, upserts: bool) -> Result<(), TestCaseError> {
        check_created(batches, order, engine, upserts, None)
    }

    /// Upserts only, on a target made by `create` first (else by the run).
    fn check_upserts(batches: Vec<Vec<Row>>, order: Vec<usize>, engine: &dyn EngineUnderTest, create: Option<&str>) -> Result<(), TestCaseError> {
        check_created(batches, order, engine, true, create)
    }

    fn check_created(batches: Vec<Vec<Row>>, order: Vec<usize>, engine: &dyn EngineUnderTest, upserts: bool, create: Option<&str>) -> Result<(), TestCaseError> {
        let mut db = engine.fresh();
        let db = db.as_mut();
        exec(db, "CREATE SCHEMA m;\nCREATE TABLE m.changes (batch DATE, k BIGINT, v BIGINT, amount BIGINT, cur VARCHAR, op VARCHAR, p BIGINT)");
        if let Some(create) = create {
            exec(db, create);
        }
        seed_batches(db, &batches);
        let job = if upserts { job(&JOB.replace("deleted = \"op = 'D'\"\n", "")) } else { job(JOB) };
        let mut seen = Vec::new();
        for &i in &order {
            let i = i % batches.len();
            let report = job.load(d(&day(i)), db).map_err(|e| TestCaseError::fail(e.to_string()))?;
            if create.is_some() && report.outcome == "committed" {
                // The plan under test ran (it declines nothing here).
                prop_assert_eq!(report.method.as_str(), "merge, one statement, updates on the key");
            }
            seen.extend(batches[i].iter().cloned());
            let got = rows(db, "SELECT k, v, amount, cur, p FROM m.t");
            prop_assert_eq!(got, model(&seen, upserts), "after batches {:?}", &order);
        }
        Ok(())
    }

    /// The winner the model holds for key `k` among `seen` (`upserts`: a
    /// 'D' row is an upsert like any other).
    fn held(seen: &[Row], k: i64, upserts: bool) -> Option<&Row> {
        seen.iter().filter(|r| r.k == k).fold(None, |w: Option<&Row>, r| match w {
            Some(w) if !(if upserts { better_upsert(r, w) } else { better(r, w) }) => Some(w),
            _ => Some(r),
        })
    }

    /// With `on_tie = "error"`: whether `batch` is refused, given the rows
    /// applied before (`seen`). A key ties when the batch holds two upserts
    /// at its newest version with other values (a tombstone there wins: no
    /// tie), or when its upsert there differs from the row the target holds
    /// at the same version.
    fn refused(seen: &[Row], batch: &[Row], upserts: bool) -> bool {
        let values = |r: &Row| (r.amount, r.cur, upserts && r.del);
        let del = |r: &Row| !upserts && r.del;
        batch.iter().any(|b| {
            let rows: Vec<&Row> = batch.iter().filter(|r| r.k == b.k).collect();
            let top = rows.iter().map(|r| r.v).max().expect("b is one");
            let at_top: Vec<&Row> = rows.into_iter().filter(|r| r.v == top).collect();
            if at_top.iter().any(|r| del(r)) {
                return false;
            }
            at_top.iter().any(|r| values(r) != values(at_top[0])) || held(seen, b.k, upserts).is_some_and(|t| !del(t) && t.v == top && values(t) != values(at_top[0]))
        })
    }

    /// Batches applied in `order` with `on_tie = "error"`: each is refused
    /// exactly when the model says it ties (then nothing changes), else the
    /// target is the model's.
    fn check_ties(batches: Vec<Vec<Row>>, order: Vec<usize>, engine: &dyn EngineUnderTest, upserts: bool) -> Result<(), TestCaseError> {
        let mut db = engine.fresh();
        let db = db.as_mut();
        exec(db, "CREATE SCHEMA m;\nCREATE TABLE m.changes (batch DATE, k BIGINT, v BIGINT, amount BIGINT, cur VARCHAR, op VARCHAR, p BIGINT)");
        seed_batches(db, &batches);
        let mut spec = JOB.replace("on_tie = \"deterministic\"\n", "");
        if upserts {
            spec = spec.replace("deleted = \"op = 'D'\"\n", "");
        }
        let job = job(&spec);
        let mut seen: Vec<Row> = Vec::new();
        for &i in &order {
            let i = i % batches.len();
            let refuse = refused(&seen, &batches[i], upserts);
            match job.load(d(&day(i)), db) {
                Ok(_) => {
                    prop_assert!(!refuse, "batch {} committed, but the model refuses it, after batches {:?}", i, &order);
                    seen.extend(batches[i].iter().cloned());
                }
                Err(e) => {
                    prop_assert!(refuse, "batch {} refused ({}), but the model takes it, after batches {:?}", i, e, &order);
                    prop_assert!(matches!(e, Error::DataRefused { .. }) && e.to_string().contains("at the same version"), "{}", e);
                }
            }
            if db.table_columns(&fixpoint_core::TableName::parse("m.t").expect("a name")).expect("described").is_none() {
                prop_assert!(seen.is_empty(), "rows committed, but no table, after batches {:?}", &order);
                continue;
            }
            let got = rows(db, "SELECT k, v, amount, cur, p FROM m.t");
            prop_assert_eq!(got, model(&seen, upserts), "after batches {:?}", &order);
        }
        Ok(())
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]
        #[test]
        fn duckdb_ties_match_the_model(
            batches in proptest::collection::vec(proptest::collection::vec(row(), 0..8), 1..5),
            order in proptest::collection::vec(0usize..5, 1..8),
        ) {
            check_ties(batches.clone(), order.clone(), &DuckDbUnderTest, false)?;
            check_ties(batches, order, &DuckDbUnderTest, true)?;
        }
    }

    proptest! {
        // Upserts only: the one-statement plan's tie checks (it declines
        // on a tie; the portable plan then refuses). A fresh database per
        // case: fewer cases.
        #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]
        #[test]
        fn postgres_ties_match_the_model(
            batches in proptest::collection::vec(proptest::collection::vec(row(), 0..8), 1..5),
            order in proptest::collection::vec(0usize..5, 1..8),
        ) {
            if let Some(pg) = PgUnderTest::get() {
                check_ties(batches, order, &pg, true)?;
            }
        }
    }

    // The copy-on-write plan (its batch ties read off the dedup's window).
    #[cfg(feature = "delta")]
    proptest! {
        #![proptest_config(ProptestConfig { cases: 32, ..ProptestConfig::default() })]
        #[test]
        fn delta_ties_match_the_model(
            batches in proptest::collection::vec(proptest::collection::vec(row(), 0..8), 1..5),
            order in proptest::collection::vec(0usize..5, 1..8),
        ) {
            check_ties(batches, order, &fixpoint_scenarios::DeltaUnderTest, false)?;
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]
        #[test]
        fn duckdb_merge_matches_the_model(
            batches in proptest::collection::vec(proptest::collection::vec(row(), 0..8), 1..5),
            order in proptest::collection::vec(0usize..5, 1..8),
        ) {
            check(batches, order, &DuckDbUnderTest)?;
        }
    }

    proptest! {
        // Without tombstones, the one-statement plan where it decides.
        #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]
        #[test]
        fn duckdb_upsert_merge_matches_the_model(
            batches in proptest::collection::vec(proptest::collection::vec(row(), 0..8), 1..5),
            order in proptest::collection::vec(0usize..5, 1..8),
        ) {
            check_job(batches, order, &DuckDbUnderTest, true)?;
        }
    }

    proptest! {
        // Without tombstones, the one-statement plan where it decides:
        // on a target the run creates, and on one with a primary key on
        // the merge key (the updates then join on it). Each case is a fresh
        // database on the server: fewer cases.
        #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]
        #[test]
        fn postgres_upsert_merge_matches_the_model(
            batches in proptest::collection::vec(proptest::collection::vec(row(), 0..8), 1..5),
            order in proptest::collection::vec(0usize..5, 1..8),
            keyed in proptest::bool::ANY,
        ) {
            if let Some(pg) = PgUnderTest::get() {
                let create = keyed.then_some("CREATE TABLE m.t (k BIGINT PRIMARY KEY, v BIGINT, amount BIGINT, cur VARCHAR, op VARCHAR, p BIGINT)");
                check_upserts(batches, order, &pg, create)?;
            }
        }
    }

    proptest! {
        // Each case is a fresh database on the server: fewer cases.
        #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]
        #[test]
        fn postgres_merge_matches_the_model(
            batches in proptest::collection::vec(proptest::collection::vec(row(), 0..8), 1..5),
            order in proptest::collection::vec(0usize..5, 1..8),
        ) {
            if let Some(pg) = PgUnderTest::get() {
                check(batches, order, &pg)?;
            }
        }
    }
}
