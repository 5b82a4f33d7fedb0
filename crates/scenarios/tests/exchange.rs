//! Partition exchange on PostgreSQL: a target declaratively partitioned by
//! day gets each day swapped in whole (DETACH / ATTACH in the run's
//! transaction) instead of a multi-million-row DELETE; parallel backfills.

use fixpoint_core::backfill::{backfill, backfill_parallel, BackfillOptions, DateOutcome};
use fixpoint_core::{ledger, Engine, Error, FailPoint, FaultAction, RunOptions};
use fixpoint_postgres::Postgres;
use fixpoint_scenarios::*;

const LIST_TARGET: &str = "
CREATE SCHEMA silver;
CREATE TABLE silver.orders (order_id BIGINT, customer_id BIGINT, order_total NUMERIC(12,2), currency VARCHAR, updated_at TIMESTAMP, dt DATE, load_id TEXT) PARTITION BY LIST (dt);
CREATE INDEX orders_by_id ON silver.orders (order_id);
CREATE TABLE silver.orders_20261019 PARTITION OF silver.orders FOR VALUES IN ('2026-10-19');
CREATE TABLE silver.orders_20261020 PARTITION OF silver.orders FOR VALUES IN ('2026-10-20')
";

const CHANGE_THE_20TH: &str = "UPDATE bronze.orders SET order_total = 6.00 WHERE order_id = 3;\nINSERT INTO bronze.orders VALUES (8, 16, 1.00, 'EUR', TIMESTAMP '2026-10-20 13:00:00', DATE '2026-10-20')";

fn force() -> RunOptions {
    RunOptions { force: true, ..Default::default() }
}

/// A fresh database with the seed fixture and `target` created, or `None`
/// when the server is unreachable outside CI.
fn with_target(target: &str) -> Option<Postgres> {
    let mut db = PgUnderTest::get()?.fresh_pg();
    exec(&mut db, BRONZE);
    exec(&mut db, target);
    Some(db)
}

fn partitions(db: &mut dyn Engine, parent: &str) -> Vec<Vec<String>> {
    rows(
        db,
        &format!(
            "SELECT c.relname::text, pg_get_expr(c.relpartbound, c.oid) FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid \
             WHERE i.inhparent = '{parent}'::regclass"
        ),
    )
}

fn oid(db: &mut dyn Engine, table: &str) -> i128 {
    count(db, &format!("SELECT '{table}'::regclass::oid::bigint"))
}

fn tables_in_silver(db: &mut dyn Engine) -> Vec<Vec<String>> {
    rows(db, "SELECT tablename::text FROM pg_tables WHERE schemaname = 'silver'")
}

#[test]
fn the_day_is_swapped_in_and_five_runs_equal_one() {
    let Some(mut db) = with_target(LIST_TARGET) else { return };
    let job = job(SILVER_JOB);
    let r19 = job.load(d("2026-10-19"), &mut db).unwrap();
    let rows19 = rows(&mut db, "SELECT * FROM silver.orders WHERE dt = DATE '2026-10-19'");
    let first = job.load(d("2026-10-20"), &mut db).unwrap();
    assert_eq!((r19.method.as_str(), first.method.as_str()), ("partition exchange", "partition exchange"));
    assert_eq!((first.rows_deleted, first.rows_inserted, first.output_rows), (0, 4, 4));
    assert_eq!(first.method_note, None);
    let once = day_fp(&mut db, "silver.orders", "2026-10-20", &["load_id"]);
    assert_eq!(once, first.output());

    // The same day on a plain table (delete + insert) gives the same fingerprint.
    let mut plain = PgUnderTest::get().unwrap().fresh_pg();
    exec(&mut plain, BRONZE);
    exec(&mut plain, "CREATE SCHEMA silver;\nCREATE TABLE silver.orders (order_id BIGINT, customer_id BIGINT, order_total NUMERIC(12,2), currency VARCHAR, updated_at TIMESTAMP, dt DATE, load_id TEXT)");
    let plain_run = job.load(d("2026-10-20"), &mut plain).unwrap();
    assert_eq!(plain_run.method, "delete+insert");
    assert_eq!(plain_run.output(), first.output());
    assert_eq!(plain_run.run_key, first.run_key);

    for i in 0..4 {
        let before = oid(&mut db, "silver.orders_20261020");
        let r = job.load_with(d("2026-10-20"), &mut db, &force()).unwrap();
        assert_eq!((r.method.as_str(), r.rows_deleted, r.rows_inserted), ("partition exchange", 4, 4), "run {}", i + 2);
        assert_ne!(oid(&mut db, "silver.orders_20261020"), before, "a new table was swapped in, under the old name");
        assert_eq!(day_fp(&mut db, "silver.orders", "2026-10-20", &["load_id"]), once, "after run {}", i + 2);
    }
    assert_eq!(job.load(d("2026-10-20"), &mut db).unwrap().outcome, "skipped", "a plain retry reads the partition and skips");

    // A day with no partition gets one, named after the day.
    let r21 = job.load(d("2026-10-21"), &mut db).unwrap();
    assert_eq!((r21.method.as_str(), r21.rows_inserted), ("partition exchange", 1));
    assert_eq!(
        partitions(&mut db, "silver.orders"),
        vec![
            vec!["\"orders_20261019\"", "\"FOR VALUES IN ('2026-10-19')\""],
            vec!["\"orders_20261020\"", "\"FOR VALUES IN ('2026-10-20')\""],
            vec!["\"orders_20261021\"", "\"FOR VALUES IN ('2026-10-21')\""],
        ]
    );
    // No staging table or detached partition is left behind, and every
    // partition has the parent's index.
    assert_eq!(tables_in_silver(&mut db), vec![vec!["\"orders\""], vec!["\"orders_20261019\""], vec!["\"orders_20261020\""], vec!["\"orders_20261021\""]]);
    assert_eq!(
        count(&mut db, "SELECT count(*) FROM pg_index x JOIN pg_inherits i ON i.inhrelid = x.indexrelid WHERE i.inhparent = 'silver.orders_by_id'::regclass"),
        3
    );
    assert_eq!(rows(&mut db, "SELECT * FROM silver.orders WHERE dt = DATE '2026-10-19'"), rows19, "the 19th was not touched");
    assert_eq!(count(&mut db, "SELECT count(*) FROM silver.orders"), 7);
    assert_eq!(ledger::entries(&mut db, Some("silver_orders"), None, None).unwrap().len(), 7, "2 + 5 + 0 (skip) + … committed runs: 19th, 5 × 20th, 21st");
}

#[test]
fn range_partitions_are_swapped_and_wider_partitions_fall_back() {
    let Some(mut db) = with_target(
        "CREATE SCHEMA silver;
CREATE TABLE silver.orders (order_id BIGINT, customer_id BIGINT, order_total NUMERIC(12,2), currency VARCHAR, updated_at TIMESTAMP, dt DATE, load_id TEXT) PARTITION BY RANGE (dt);
CREATE TABLE silver.orders_20261020 PARTITION OF silver.orders FOR VALUES FROM ('2026-10-20') TO ('2026-10-21')",
    ) else {
        return;
    };
    let job = job(SILVER_JOB);
    let r20 = job.load(d("2026-10-20"), &mut db).unwrap();
    let r21 = job.load(d("2026-10-21"), &mut db).unwrap();
    assert_eq!((r20.method.as_str(), r21.method.as_str()), ("partition exchange", "partition exchange"));
    assert_eq!(
        partitions(&mut db, "silver.orders"),
        vec![
            vec!["\"orders_20261020\"", "\"FOR VALUES FROM ('2026-10-20') TO ('2026-10-21')\""],
            vec!["\"orders_20261021\"", "\"FOR VALUES FROM ('2026-10-21') TO ('2026-10-22')\""],
        ]
    );
    assert_eq!(count(&mut db, "SELECT count(*) FROM silver.orders"), 5);

    // A monthly partition holds more than the day: delete + insert, and the report says why.
    let Some(mut monthly) = with_target(
        "CREATE SCHEMA silver;
CREATE TABLE silver.orders (order_id BIGINT, customer_id BIGINT, order_total NUMERIC(12,2), currency VARCHAR, updated_at TIMESTAMP, dt DATE, load_id TEXT) PARTITION BY RANGE (dt);
CREATE TABLE silver.orders_202610 PARTITION OF silver.orders FOR VALUES FROM ('2026-10-01') TO ('2026-11-01')",
    ) else {
        return;
    };
    job.load(d("2026-10-19"), &mut monthly).unwrap();
    let r = job.load(d("2026-10-20"), &mut monthly).unwrap();
    assert_eq!(r.method, "delete+insert");
    assert_eq!(
        r.method_note.as_deref(),
        Some("no partition exchange: the day falls in partition silver.orders_202610 (FOR VALUES FROM ('2026-10-01') TO ('2026-11-01')), which holds more than one day")
    );
    assert_eq!(r.output(), r20.output());
    let again = job.load_with(d("2026-10-20"), &mut monthly, &force()).unwrap();
    assert_eq!((again.rows_deleted, again.rows_inserted), (4, 4));
    assert_eq!(count(&mut monthly, "SELECT count(*) FROM silver.orders"), 6);

    // A default partition and no partition for the day: delete + insert into the default.
    let Some(mut with_default) = with_target(
        "CREATE SCHEMA silver;
CREATE TABLE silver.orders (order_id BIGINT, customer_id BIGINT, order_total NUMERIC(12,2), currency VARCHAR, updated_at TIMESTAMP, dt DATE, load_id TEXT) PARTITION BY LIST (dt);
CREATE TABLE silver.orders_rest PARTITION OF silver.orders DEFAULT",
    ) else {
        return;
    };
    let r = job.load(d("2026-10-20"), &mut with_default).unwrap();
    assert_eq!(r.method, "delete+insert");
    assert!(r.method_note.as_deref().unwrap().contains("has a default partition"), "{:?}", r.method_note);
    assert_eq!(r.output(), r20.output());
    assert_eq!(count(&mut with_default, "SELECT count(*) FROM silver.orders_rest"), 4);
}

#[test]
fn a_failure_at_any_step_leaves_the_old_partition_in_place() {
    for point in FailPoint::ALL {
        let Some(mut db) = with_target(LIST_TARGET) else { return };
        let job = job(SILVER_JOB);
        let before = job.load(d("2026-10-20"), &mut db).unwrap();
        let before_rows = rows(&mut db, "SELECT * FROM silver.orders");
        let before_oid = oid(&mut db, "silver.orders_20261020");
        exec(&mut db, CHANGE_THE_20TH);
        let opts = RunOptions { fault: Some((point, FaultAction::Error)), ..Default::default() };
        let err = job.load_with(d("2026-10-20"), &mut db, &opts).unwrap_err();
        assert!(matches!(err, Error::Injected(p) if p == point), "{point}: {err}");
        assert_eq!(rows(&mut db, "SELECT * FROM silver.orders"), before_rows, "{point}");
        assert_eq!(oid(&mut db, "silver.orders_20261020"), before_oid, "{point}: the same partition is attached");
        assert_eq!(tables_in_silver(&mut db), vec![vec!["\"orders\""], vec!["\"orders_20261019\""], vec!["\"orders_20261020\""]], "{point}: no staging table left");
        assert_eq!(day_fp(&mut db, "silver.orders", "2026-10-20", &["load_id"]), before.output(), "{point}");
        assert_eq!(ledger::entries(&mut db, Some("silver_orders"), None, None).unwrap().len(), 1, "{point}");
        let retry = job.load(d("2026-10-20"), &mut db).unwrap();
        assert_eq!((retry.method.as_str(), retry.rows_deleted, retry.rows_inserted), ("partition exchange", 4, 5), "{point}");
        let mut clean = PgUnderTest::get().unwrap().fresh_pg();
        exec(&mut clean, BRONZE);
        exec(&mut clean, LIST_TARGET);
        exec(&mut clean, CHANGE_THE_20TH);
        assert_eq!(job.load(d("2026-10-20"), &mut clean).unwrap().output(), retry.output(), "{point}");
    }
}

#[test]
fn readers_see_the_old_day_while_the_new_one_is_built_and_never_an_empty_day() {
    let Some(mut db) = with_target(LIST_TARGET) else { return };
    let job = job(SILVER_JOB);
    job.load(d("2026-10-20"), &mut db).unwrap();
    exec(&mut db, CHANGE_THE_20TH);
    let url = db.url().to_owned();
    let day = "SELECT count(*) FROM silver.orders WHERE dt = DATE '2026-10-20'";

    // While the new day is being built, readers are not blocked and see the old day.
    let writer = {
        let (url, job) = (url.clone(), job.clone());
        std::thread::spawn(move || {
            let mut conn = Postgres::connect(&url).unwrap();
            let pause = RunOptions { fault: Some((FailPoint::AfterInsert, FaultAction::Pause(1500))), ..Default::default() };
            job.load_with(d("2026-10-20"), &mut conn, &pause).unwrap()
        })
    };
    std::thread::sleep(std::time::Duration::from_millis(700));
    assert_eq!(count(&mut db, day), 4, "the old day, read while the new one is staged");
    assert!(!writer.is_finished(), "the read did not wait for the run");
    assert_eq!(writer.join().unwrap().rows_inserted, 5);
    assert_eq!(count(&mut db, day), 5);

    // A reader arriving after the swap, before the commit, waits and sees the new day.
    exec(&mut db, "INSERT INTO bronze.orders VALUES (9, 17, 2.00, 'EUR', TIMESTAMP '2026-10-20 14:00:00', DATE '2026-10-20')");
    let writer = {
        let (url, job) = (url.clone(), job.clone());
        std::thread::spawn(move || {
            let mut conn = Postgres::connect(&url).unwrap();
            let pause = RunOptions { fault: Some((FailPoint::BeforeCommit, FaultAction::Pause(1000))), ..Default::default() };
            job.load_with(d("2026-10-20"), &mut conn, &pause).unwrap()
        })
    };
    std::thread::sleep(std::time::Duration::from_millis(500));
    assert_eq!(count(&mut db, day), 6, "not 0, not 5: the committed new day");
    assert!(writer.join().unwrap().outcome == "committed");
}

#[test]
fn different_days_run_at_once_and_swap_one_after_the_other() {
    let Some(mut db) = with_target(LIST_TARGET) else { return };
    let job = job(SILVER_JOB);
    let url = db.url().to_owned();
    let threads: Vec<_> = ["2026-10-19", "2026-10-20", "2026-10-21"]
        .into_iter()
        .map(|day| {
            let (url, job) = (url.clone(), job.clone());
            std::thread::spawn(move || {
                let mut conn = Postgres::connect(&url).unwrap();
                let mut last = None;
                for _ in 0..3 {
                    let overlap = RunOptions { force: true, fault: Some((FailPoint::AfterInsert, FaultAction::Pause(100))), no_wait: true };
                    last = Some(job.load_with(d(day), &mut conn, &overlap).unwrap());
                }
                last.unwrap()
            })
        })
        .collect();
    let reports: Vec<_> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    assert!(reports.iter().all(|r| r.method == "partition exchange" && r.method_note.is_none()), "{reports:?}");
    assert_eq!(reports.iter().map(|r| r.output_rows).collect::<Vec<_>>(), vec![2, 4, 1]);
    for r in &reports {
        assert_eq!(day_fp(&mut db, "silver.orders", &r.run_date, &["load_id"]), r.output(), "{}", r.run_date);
    }
    assert_eq!(count(&mut db, "SELECT count(*) FROM silver.orders"), 7);
    assert_eq!(count(&mut db, "SELECT count(*) FROM fixpoint.runs"), 9);
}

#[test]
fn a_parallel_backfill_ends_as_the_sequential_one() {
    let Some(mut db) = with_target(LIST_TARGET) else { return };
    let job = job(SILVER_JOB);
    let dates = vec![d("2026-10-18"), d("2026-10-19"), d("2026-10-20"), d("2026-10-21")];
    let url = db.url().to_owned();
    let connect = || -> fixpoint_core::Result<Box<dyn Engine>> { Ok(Box::new(Postgres::connect(&url)?)) };
    let mut seen = 0;
    let out = backfill_parallel(&job, &dates, 3, &connect, &BackfillOptions::default(), |_| seen += 1);
    assert_eq!(seen, 4);
    let dates_back: Vec<String> = out
        .iter()
        .map(|o| match o {
            DateOutcome::Done(r) => format!("{} {} {}", r.run_date, r.outcome, r.output_rows),
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(dates_back, ["2026-10-18 committed 0", "2026-10-19 committed 2", "2026-10-20 committed 4", "2026-10-21 committed 1"]);

    let mut seq = PgUnderTest::get().unwrap().fresh_pg();
    exec(&mut seq, BRONZE);
    exec(&mut seq, LIST_TARGET);
    let seq_out = backfill(&job, &dates, &mut seq, &BackfillOptions::default(), |_| {});
    for (p, s) in out.iter().zip(&seq_out) {
        let (DateOutcome::Done(p), DateOutcome::Done(s)) = (p, s) else { panic!() };
        assert_eq!((p.output(), &p.run_key), (s.output(), &s.run_key), "{}", p.run_date);
    }
    assert_eq!(rows(&mut db, "SELECT order_id, dt FROM silver.orders"), rows(&mut seq, "SELECT order_id, dt FROM silver.orders"));

    // Again: everything is done, every date is skipped.
    let again = backfill_parallel(&job, &dates, 3, &connect, &BackfillOptions::default(), |_| {});
    assert!(again.iter().all(|o| matches!(o, DateOutcome::Done(r) if r.outcome == "skipped")), "{again:?}");
    // Found done through the parent, in one grouped scan of its partitions.
    let done = fixpoint_core::backfill::done_dates(&job, &dates, &mut db).unwrap();
    assert_eq!(done.len(), 4);
    assert_eq!(done[&d("2026-10-20")].output_rows, 4);

    // A failed date stops the backfill from starting new dates; nothing of it is committed.
    exec(&mut db, CHANGE_THE_20TH);
    let mut done: Vec<String> = fixpoint_core::backfill::done_dates(&job, &dates, &mut db).unwrap().keys().map(|d| d.to_string()).collect();
    done.sort();
    assert_eq!(done, ["2026-10-18", "2026-10-19", "2026-10-21"], "the changed 20th is not done");
    let opts = BackfillOptions {
        run: RunOptions { force: true, fault: Some((FailPoint::AfterDelete, FaultAction::Error)), no_wait: false },
        keep_going: false,
        fault_date: Some(d("2026-10-20")),
    };
    let out = backfill_parallel(&job, &dates, 1, &connect, &opts, |_| {});
    let states: Vec<&str> = out
        .iter()
        .map(|o| match o {
            DateOutcome::Done(_) => "done",
            DateOutcome::Failed(..) => "failed",
            DateOutcome::NotRun(_) => "not run",
        })
        .collect();
    assert_eq!(states, ["done", "done", "failed", "not run"]);
    assert_eq!(count(&mut db, "SELECT count(*) FROM silver.orders WHERE dt = DATE '2026-10-20'"), 4, "the old day");
}
