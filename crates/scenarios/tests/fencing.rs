//! Double-fired runs on PostgreSQL: the same job and partition at the same
//! moment serialize on an advisory lock; the final state equals one run.

use fixpoint_core::{Engine, Error, FailPoint, FaultAction, RunOptions};
use fixpoint_postgres::Postgres;
use fixpoint_scenarios::*;

#[test]
fn double_fired_runs_serialize_and_equal_one_run() {
    let Some(pg) = PgUnderTest::get() else { return };
    let mut db = pg.fresh_pg();
    exec(&mut db, BRONZE);
    let job = job(SILVER_JOB);
    let once = job.load(d("2026-10-20"), &mut db).unwrap();
    let url = db.url().to_owned();
    let threads: Vec<_> = (0..3)
        .map(|_| {
            let url = url.clone();
            let job = job.clone();
            std::thread::spawn(move || {
                let mut conn = Postgres::connect(&url).unwrap();
                for _ in 0..5 {
                    // Pause between the delete and the insert, so the runs overlap.
                    let overlap = RunOptions { force: true, fault: Some((FailPoint::AfterDelete, FaultAction::Pause(50))), no_wait: false };
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
    let Some(pg) = PgUnderTest::get() else { return };
    let mut db = pg.fresh_pg();
    exec(&mut db, BRONZE);
    let job = job(SILVER_JOB);
    job.load(d("2026-10-20"), &mut db).unwrap();
    let mut holder = Postgres::connect(db.url()).unwrap();
    holder.begin().unwrap();
    assert!(holder.lock_scope("fixpoint:silver_orders:silver.orders:2026-10-20", true).unwrap());
    let err = job.load_with(d("2026-10-20"), &mut db, &RunOptions { force: true, fault: None, no_wait: true }).unwrap_err();
    assert!(matches!(err, Error::Busy { .. }), "{err}");
    assert_eq!(err.to_string(), "another run of job silver_orders holds the lock on silver.orders (2026-10-20); --no-wait was given");
    // Another partition is not blocked.
    job.load_with(d("2026-10-21"), &mut db, &RunOptions { force: true, fault: None, no_wait: true }).unwrap();
    holder.rollback().unwrap();
    job.load_with(d("2026-10-20"), &mut db, &RunOptions { force: true, fault: None, no_wait: true }).unwrap();
}
