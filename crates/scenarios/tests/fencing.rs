//! Double-fired runs on PostgreSQL: the same job and partition at the same
//! moment serialize on an advisory lock; the final state equals one run.

use fixpoint_core::engine::Locks;
use fixpoint_core::{Engine, Error, FailPoint, FaultAction, RunOptions};
use fixpoint_postgres::Postgres;
use fixpoint_scenarios::*;

/// A fresh database with the seed fixture and the 20th loaded once, or
/// `None` when the server is unreachable outside CI.
fn loaded() -> Option<(Postgres, fixpoint_core::Job, fixpoint_core::RunReport)> {
    let mut db = PgUnderTest::get()?.fresh_pg();
    exec(&mut db, BRONZE);
    let job = job(SILVER_JOB);
    let first = job.load(d("2026-10-20"), &mut db).unwrap();
    Some((db, job, first))
}

#[test]
fn double_fired_runs_serialize_and_equal_one_run() {
    let Some((mut db, job, once)) = loaded() else { return };
    let url = db.url().to_owned();
    let threads: Vec<_> = (0..3)
        .map(|_| {
            let url = url.clone();
            let job = job.clone();
            std::thread::spawn(move || {
                let mut conn = Postgres::connect(&url).unwrap();
                for _ in 0..5 {
                    // Pause between the delete and the insert, so the runs overlap.
                    let overlap = RunOptions { force: true, fault: Some((FailPoint::AfterDelete, FaultAction::Pause(50))), no_wait: false, ..RunOptions::default() };
                    job.load_with(d("2026-10-20"), &mut conn, &overlap).unwrap();
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    assert_eq!(count(&mut db, "SELECT count(*) FROM silver.orders WHERE dt = DATE '2026-10-20'"), 4, "no duplicated rows");
    assert_eq!(day_fp(&mut db, "silver.orders", "2026-10-20", &["load_id"]), once.output());
    assert_eq!(count(&mut db, "SELECT count(*) FROM fixpoint.runs"), 16, "every run committed, one after the other");
}

#[test]
fn no_wait_fails_at_once_while_another_run_holds_the_lock() {
    let Some((mut db, job, _)) = loaded() else { return };
    let mut holder = Postgres::connect(db.url()).unwrap();
    holder.begin().unwrap();
    assert!(holder.lock_scope("fixpoint:silver_orders:silver.orders:2026-10-20", true).unwrap());
    let err = job.load_with(d("2026-10-20"), &mut db, &RunOptions { force: true, fault: None, no_wait: true, ..RunOptions::default() }).unwrap_err();
    assert!(matches!(err, Error::Busy { .. }), "{err}");
    assert_eq!(err.to_string(), "another run of job silver_orders holds the lock on silver.orders (2026-10-20); --no-wait was given");
    // Another partition is not blocked.
    job.load_with(d("2026-10-21"), &mut db, &RunOptions { force: true, fault: None, no_wait: true, ..RunOptions::default() }).unwrap();
    holder.rollback().unwrap();
    job.load_with(d("2026-10-20"), &mut db, &RunOptions { force: true, fault: None, no_wait: true, ..RunOptions::default() }).unwrap();
}

#[test]
fn a_connection_killed_mid_run_leaves_the_previous_contents() {
    let Some((mut db, job, before)) = loaded() else { return };
    let before_rows = rows(&mut db, "SELECT * FROM silver.orders");
    exec(&mut db, "UPDATE bronze.orders SET order_total = 6.00 WHERE order_id = 3");
    let url = db.url().to_owned();
    let dbname = url.rsplit('/').next().unwrap().to_owned();
    let runner = {
        let (url, job) = (url.clone(), job.clone());
        std::thread::spawn(move || {
            let mut conn = Postgres::connect(&url).unwrap();
            // Stops after the insert, inside the open transaction.
            let slow = RunOptions { force: true, fault: Some((FailPoint::AfterInsert, FaultAction::Pause(3000))), no_wait: false, ..RunOptions::default() };
            job.load_with(d("2026-10-20"), &mut conn, &slow)
        })
    };
    // Find the run's backend, idle in its transaction, and kill it.
    let mut killed = 0;
    for _ in 0..100 {
        std::thread::sleep(std::time::Duration::from_millis(50));
        killed = count(
            &mut db,
            &format!(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE datname = '{dbname}' AND pid <> pg_backend_pid() AND state = 'idle in transaction'"
            ),
        );
        if killed > 0 {
            break;
        }
    }
    assert_eq!(killed, 1, "the run's connection was found and terminated");
    let err = runner.join().unwrap().unwrap_err();
    assert!(matches!(err, Error::Database { .. }), "{err}");
    assert_eq!(rows(&mut db, "SELECT * FROM silver.orders"), before_rows, "the previous contents survive");
    assert_eq!(count(&mut db, "SELECT count(*) FROM fixpoint.runs"), 1, "no ledger row from the killed run");
    let retry = job.load(d("2026-10-20"), &mut db).unwrap();
    assert_ne!(retry.output(), before.output());
    assert_eq!(count(&mut db, "SELECT count(*) FROM silver.orders WHERE dt = DATE '2026-10-20'"), 4);
    assert_eq!(rows(&mut db, "SELECT order_total FROM silver.orders WHERE order_id = 3"), vec![vec!["\"6.00\""]]);
}

#[test]
fn a_serialization_failure_is_retried_and_converges() {
    let Some((mut db, job, _)) = loaded() else { return };
    let url = db.url().to_owned();
    let dbname = url.rsplit('/').next().unwrap().to_owned();
    // Under REPEATABLE READ, a row changed by another transaction after the
    // run's snapshot makes the run's DELETE fail with SQLSTATE 40001.
    exec(&mut db, &format!("ALTER DATABASE \"{dbname}\" SET default_transaction_isolation = 'repeatable read'"));
    let runner = {
        let (url, job) = (url.clone(), job.clone());
        std::thread::spawn(move || {
            let mut conn = Postgres::connect(&url).unwrap();
            let slow = RunOptions { force: true, fault: Some((FailPoint::AfterGuards, FaultAction::Pause(700))), no_wait: false, ..RunOptions::default() };
            job.load_with(d("2026-10-20"), &mut conn, &slow)
        })
    };
    std::thread::sleep(std::time::Duration::from_millis(300));
    exec(&mut db, "UPDATE silver.orders SET order_total = 0 WHERE order_id = 3");
    let report = runner.join().unwrap().expect("retried after the serialization failure");
    assert_eq!(report.rows_inserted, 4);
    assert_eq!(rows(&mut db, "SELECT order_total FROM silver.orders WHERE order_id = 3"), vec![vec!["\"5.25\""]], "the rerun replaced the concurrent edit");
    assert_eq!(count(&mut db, "SELECT count(*) FROM fixpoint.runs"), 2, "one committed run per load: the failed attempt left nothing");
}

/// Another session holding a lock on the target (a `LOCK TABLE` left open
/// in a console): the run waits at most `--wait`, then stops with exit 5,
/// naming the session; nothing changed. With `--no-wait` it stops at once.
#[test]
fn a_target_locked_by_another_session_is_waited_for_at_most_the_wait() {
    let Some((mut db, job, _)) = loaded() else { return };
    exec(&mut db, "UPDATE bronze.orders SET order_total = 7.00 WHERE order_id = 3");
    let before = rows(&mut db, "SELECT * FROM silver.orders");
    let ledger = count(&mut db, "SELECT count(*) FROM fixpoint.runs");
    let mut holder = Postgres::connect(db.url()).unwrap();
    exec(&mut holder, "SET application_name = 'console of ana'");
    holder.begin().unwrap();
    exec(&mut holder, "LOCK TABLE silver.orders IN ACCESS EXCLUSIVE MODE");
    for (wait, no_wait, at_most) in [(2_000, false, 15_000), (60_000, true, 15_000)] {
        let mut runner = Postgres::connect_waiting(db.url(), std::time::Duration::from_millis(wait)).unwrap();
        let started = std::time::Instant::now();
        let err = job.load_with(d("2026-10-20"), &mut runner, &RunOptions { force: false, fault: None, no_wait, ..RunOptions::default() }).unwrap_err();
        let took = started.elapsed().as_millis();
        assert!(matches!(err, Error::Busy { .. }), "{err}");
        assert!(took < at_most, "waited {took} ms");
        if !no_wait {
            assert!(took >= 1_900, "waited only {took} ms of --wait 2 s");
        }
        let msg = err.to_string();
        assert!(msg.contains("lock timeout") && msg.contains("console of ana") && msg.contains("LOCK TABLE"), "{msg}");
    }
    holder.rollback().unwrap();
    assert_eq!(rows(&mut db, "SELECT * FROM silver.orders"), before, "nothing changed");
    assert_eq!(count(&mut db, "SELECT count(*) FROM fixpoint.runs"), ledger, "no ledger row");
    // Once the lock is gone, the run goes through.
    let report = job.load(d("2026-10-20"), &mut db).unwrap();
    assert_eq!(report.rows_inserted, 4);
}

/// One snapshot per run: a row committed to the source while the run is
/// between its guard scan and its insert is in neither (the ledger's input
/// fingerprint describes exactly the rows written); the next run sees it.
#[test]
fn a_source_row_committed_during_a_run_is_in_neither_its_fingerprint_nor_its_write() {
    let Some((mut db, job, _)) = loaded() else { return };
    let url = db.url().to_owned();
    let runner = {
        let (url, job) = (url.clone(), job.clone());
        std::thread::spawn(move || {
            let mut conn = Postgres::connect(&url).unwrap();
            let slow = RunOptions { force: true, fault: Some((FailPoint::AfterGuards, FaultAction::Pause(1500))), no_wait: false, ..RunOptions::default() };
            job.load_with(d("2026-10-20"), &mut conn, &slow)
        })
    };
    std::thread::sleep(std::time::Duration::from_millis(500));
    exec(&mut db, "INSERT INTO bronze.orders VALUES (8, 16, 1.00, 'EUR', TIMESTAMP '2026-10-20 13:00:00', DATE '2026-10-20')");
    let report = runner.join().unwrap().expect("the run commits");
    let day = "SELECT count(*) FROM silver.orders WHERE dt = DATE '2026-10-20'";
    assert_eq!(count(&mut db, day), 4, "the run wrote its snapshot's rows, not the row committed meanwhile");
    assert_eq!(report.rows_inserted, 4);
    let last = "FROM fixpoint.runs WHERE run_date = DATE '2026-10-20' AND finished_at = (SELECT max(finished_at) FROM fixpoint.runs WHERE run_date = DATE '2026-10-20')";
    assert_eq!(count(&mut db, &format!("SELECT input_rows {last}")), 4, "the ledger's input is what was written");
    assert_eq!(count(&mut db, &format!("SELECT output_rows {last}")), 4);
    assert_eq!(
        count(&mut db, &format!("SELECT count(*) {last} AND input_checksum = output_checksum")),
        1,
        "input and output fingerprints agree (same columns)"
    );
    // The next run sees the new row: the input changed, the day is rewritten.
    let next = job.load(d("2026-10-20"), &mut db).unwrap();
    assert_eq!(next.outcome, "committed");
    assert_eq!(count(&mut db, day), 5);
}

/// fixpoint's sessions keep their temporary tables in memory (`temp_buffers`
/// raised to 256 MB, a higher value given in the URL kept) and analyze each
/// from a small sample, restoring the session's statistics target.
#[test]
fn temporary_tables_analyzed_from_a_sample_and_the_session_settings_kept() {
    let Some(pg) = PgUnderTest::get() else { return };
    let db = pg.fresh_pg();
    let url = db.url().to_owned();
    let mut conn = Postgres::connect(&url).unwrap();
    let setting = |conn: &mut Postgres, name: &str| rows(conn, &format!("SELECT current_setting('{name}')"))[0][0].trim_matches('"').to_owned();
    assert_eq!(setting(&mut conn, "temp_buffers"), "256MB");
    let target = setting(&mut conn, "default_statistics_target");
    let query = fixpoint_core::Sql::raw("SELECT i AS k, i % 7 AS g FROM generate_series(1, 5000) AS s(i)".to_owned());
    assert_eq!(conn.create_temp_table_as("\"t_sample\"", &query).unwrap(), 5000);
    // Analyzed: the row count, and statistics of both columns, the
    // distinct values of `g` found exactly.
    assert_eq!(count(&mut conn, "SELECT CAST(reltuples AS BIGINT) FROM pg_class WHERE relname = 't_sample' AND relpersistence = 't'"), 5000);
    assert_eq!(rows(&mut conn, "SELECT attname, CAST(n_distinct AS TEXT) FROM pg_stats WHERE tablename = 't_sample' ORDER BY attname"), [["\"g\"", "\"7\""], ["\"k\"", "\"-1\""]]);
    assert_eq!(setting(&mut conn, "default_statistics_target"), target, "the session's target is restored");
    // A session whose URL asks for more keeps it.
    let sep = if url.contains('?') { '&' } else { '?' };
    let mut more = Postgres::connect(&format!("{url}{sep}options=-c%20temp_buffers%3D512MB")).unwrap();
    assert_eq!(setting(&mut more, "temp_buffers"), "512MB");
}
