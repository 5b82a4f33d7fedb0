//! Partition exchange on PostgreSQL: a target declaratively partitioned by
//! day gets each day swapped in whole (DETACH / ATTACH in the run's
//! transaction) instead of a multi-million-row DELETE; parallel backfills.
//! What readers see during a swap, at each isolation level, and
//! `swap = "delete_insert"` for readers that hold an older snapshot.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use fixpoint_core::tools::backfill::{backfill, backfill_parallel, BackfillOptions, DateOutcome};
use fixpoint_core::{Engine, Error, FailPoint, FaultAction, RunOptions, RunReport, Sql};
use fixpoint_core::run::ledger;
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
                    let overlap = RunOptions { force: true, fault: Some((FailPoint::AfterInsert, FaultAction::Pause(100))), no_wait: true, ..RunOptions::default() };
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
    let done = fixpoint_core::tools::backfill::done_dates(&job, &dates, &mut db).unwrap();
    assert_eq!(done.len(), 4);
    assert_eq!(done[&d("2026-10-20")].output_rows, 4);

    // A failed date stops the backfill from starting new dates; nothing of it is committed.
    exec(&mut db, CHANGE_THE_20TH);
    let mut done: Vec<String> = fixpoint_core::tools::backfill::done_dates(&job, &dates, &mut db).unwrap().keys().map(|d| d.to_string()).collect();
    done.sort();
    assert_eq!(done, ["2026-10-18", "2026-10-19", "2026-10-21"], "the changed 20th is not done");
    let opts = BackfillOptions {
        run: RunOptions { force: true, fault: Some((FailPoint::AfterDelete, FaultAction::Error)), no_wait: false, ..RunOptions::default() },
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

/// `toml` with `swap = "<swap>"` after its `partition` line.
fn with_swap(toml: &str, swap: &str) -> String {
    assert!(toml.contains("partition = \"dt\"\n"));
    toml.replacen("partition = \"dt\"\n", &format!("partition = \"dt\"\nswap = \"{swap}\"\n"), 1)
}

/// A day of ~50 rows whose source switches between two contents (50 rows
/// `old …`, 52 rows `new …`) by `bronze.variant`, and a target
/// partitioned by day.
const CHURN: &str = "
CREATE SCHEMA bronze;
CREATE TABLE bronze.churn (id BIGINT, variant INT, payload TEXT, dt DATE);
INSERT INTO bronze.churn SELECT g, 0, 'old ' || g, DATE '2026-10-20' FROM generate_series(1, 50) AS g;
INSERT INTO bronze.churn SELECT g, 1, 'new ' || g, DATE '2026-10-20' FROM generate_series(1, 52) AS g;
CREATE TABLE bronze.variant (v INT);
INSERT INTO bronze.variant VALUES (0);
CREATE SCHEMA silver;
CREATE TABLE silver.churn (id BIGINT, payload TEXT, dt DATE) PARTITION BY LIST (dt);
CREATE TABLE silver.churn_20261020 PARTITION OF silver.churn FOR VALUES IN ('2026-10-20')
";

const CHURN_JOB: &str = r#"
name = "churn"
target = "silver.churn"
strategy = "replace_partition"
partition = "dt"

[source]
sql = "SELECT id, payload, dt FROM bronze.churn WHERE dt = :run_date AND variant = (SELECT v FROM bronze.variant)"
"#;

/// The day's row count and a checksum of its rows, in plain SQL.
const CHURN_SAMPLE: &str = "SELECT count(*), coalesce(sum(hashtext(CAST(t AS TEXT))), 0) FROM silver.churn t WHERE dt = DATE '2026-10-20'";

fn churn_sample(db: &mut dyn Engine) -> fixpoint_core::Result<(i128, i128)> {
    let r = db.query(&Sql::raw(CHURN_SAMPLE))?;
    let value = |i: usize| r.rows[0][i].as_i128().unwrap_or(i128::MIN);
    Ok((value(0), value(1)))
}

#[test]
fn a_read_committed_reader_sees_the_old_day_or_the_new_one_through_fifty_swaps() {
    for swap in ["exchange", "delete_insert"] {
        let Some(pg) = PgUnderTest::get() else { return };
        let mut db = pg.fresh_pg();
        exec(&mut db, CHURN);
        let job = job(&with_swap(CHURN_JOB, swap));
        let day = d("2026-10-20");
        let method = if swap == "exchange" { "partition exchange" } else { "delete+insert" };
        assert_eq!(job.load(day, &mut db).unwrap().method, method);
        let old = churn_sample(&mut db).unwrap();
        exec(&mut db, "UPDATE bronze.variant SET v = 1");
        assert_eq!(job.load(day, &mut db).unwrap().method, method);
        let new = churn_sample(&mut db).unwrap();
        assert_eq!((old.0, new.0), (50, 52), "{swap}");
        assert_ne!(old.1, new.1, "{swap}: the two days differ in content too");

        // A reader on its own connection samples the day as fast as it can,
        // each statement on its own (READ COMMITTED: a snapshot per statement).
        let stop = Arc::new(AtomicBool::new(false));
        let reads = Arc::new(AtomicU64::new(0));
        let reader = {
            let (url, stop, reads) = (db.url().to_owned(), stop.clone(), reads.clone());
            std::thread::spawn(move || {
                let mut conn = Postgres::connect(&url).unwrap();
                conn.execute(&Sql::raw("SET default_transaction_isolation = 'read committed'")).unwrap();
                let (mut seen_old, mut seen_new, mut wrong) = (0u64, 0u64, Vec::new());
                while !stop.load(Ordering::SeqCst) {
                    let n = reads.fetch_add(1, Ordering::SeqCst);
                    match churn_sample(&mut conn) {
                        Ok(s) if s == old => seen_old += 1,
                        Ok(s) if s == new => seen_new += 1,
                        other => {
                            if wrong.len() < 10 {
                                wrong.push(format!("read {n}: {other:?}"));
                            }
                        }
                    }
                }
                (seen_old, seen_new, wrong)
            })
        };
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while reads.load(Ordering::SeqCst) == 0 && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        // 50 runs, each changing the day: old, new, old, …
        let mut during = Vec::new();
        for i in 0..50 {
            exec(&mut db, &format!("UPDATE bronze.variant SET v = {}", i % 2));
            let before = reads.load(Ordering::SeqCst);
            let r = job.load_with(day, &mut db, &force()).unwrap();
            during.push(reads.load(Ordering::SeqCst) - before);
            assert_eq!((r.method.as_str(), r.outcome.as_str()), (method, "committed"), "{swap}: run {i}");
            assert_eq!(churn_sample(&mut db).unwrap(), if i % 2 == 0 { old } else { new }, "{swap}: after run {i}");
        }
        stop.store(true, Ordering::SeqCst);
        let (seen_old, seen_new, wrong) = reader.join().unwrap();
        assert!(wrong.is_empty(), "{swap}: the reader saw a day that is neither the old {old:?} nor the new {new:?}: {wrong:?}");
        assert!(seen_old > 0 && seen_new > 0, "{swap}: the reads spanned the swaps ({seen_old} old, {seen_new} new)");
        assert!(seen_old + seen_new >= 50, "{swap}: {seen_old} + {seen_new} reads in 50 runs");
        eprintln!("{swap}: {} reads ({seen_old} old, {seen_new} new) over 50 runs; reads during each run: {during:?}", seen_old + seen_new);
    }
}

const DAY_20: &str = "SELECT * FROM silver.orders WHERE dt = DATE '2026-10-20'";

/// What a reader whose snapshot is older than a run saw of the 20th.
struct SnapshotRead {
    /// The database, after the run.
    db: Postgres,
    /// The day before the run (4 rows).
    old: Vec<Vec<String>>,
    /// The day as the reader read it, in its transaction.
    seen: Vec<Vec<String>>,
    /// The day as the reader read it in a new transaction, after the run.
    new: Vec<Vec<String>>,
    /// The run's report.
    report: RunReport,
}

/// Loads the 20th, changes its input (4 rows become 5), begins an
/// `isolation` transaction on a connection of its own and takes its
/// snapshot by reading another table (so it holds no lock on the target),
/// then runs the job again and reads the day in that transaction: after
/// the run committed, or (`during`) while the run waits to commit after
/// its swap — a read that, like pg_dump's, waits for the swap's lock.
fn snapshot_read(swap: Option<&str>, isolation: &str, during: bool) -> Option<SnapshotRead> {
    let mut db = with_target(LIST_TARGET)?;
    exec(&mut db, "CREATE TABLE public.elsewhere (x INT);\nINSERT INTO public.elsewhere VALUES (1)");
    let job = job(&swap.map_or_else(|| SILVER_JOB.to_owned(), |s| with_swap(SILVER_JOB, s)));
    job.load(d("2026-10-20"), &mut db).unwrap();
    let old = rows(&mut db, DAY_20);
    assert_eq!(old.len(), 4);
    exec(&mut db, CHANGE_THE_20TH);

    let mut reader = Postgres::connect(db.url()).unwrap();
    exec(&mut reader, &format!("BEGIN ISOLATION LEVEL {isolation}"));
    assert_eq!(count(&mut reader, "SELECT count(*) FROM public.elsewhere"), 1, "the reader's snapshot is taken");
    let (seen, report) = if during {
        let writer = {
            let (url, job) = (db.url().to_owned(), job.clone());
            std::thread::spawn(move || {
                let mut conn = Postgres::connect(&url).unwrap();
                let pause = RunOptions { fault: Some((FailPoint::BeforeCommit, FaultAction::Pause(1000))), ..Default::default() };
                job.load_with(d("2026-10-20"), &mut conn, &pause).unwrap()
            })
        };
        // Wait until the run has written its ledger row: it has swapped
        // (or deleted and inserted) and pauses before its commit.
        let recorded = "SELECT count(*) FROM pg_locks WHERE relation = CAST(CAST('fixpoint.runs' AS regclass) AS oid) \
                        AND mode = 'RowExclusiveLock' AND granted AND pid <> pg_backend_pid()";
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while count(&mut db, recorded) == 0 {
            assert!(std::time::Instant::now() < deadline && !writer.is_finished(), "the run did not reach its commit");
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        let seen = rows(&mut reader, DAY_20);
        (seen, writer.join().unwrap())
    } else {
        let report = job.load(d("2026-10-20"), &mut db).unwrap();
        (rows(&mut reader, DAY_20), report)
    };
    exec(&mut reader, "COMMIT");
    let new = rows(&mut reader, DAY_20);
    assert_eq!(new.len(), 5, "a transaction begun after the run sees the new day");
    assert_eq!(report.outcome, "committed");
    Some(SnapshotRead { db, old, seen, new, report })
}

#[test]
fn a_snapshot_older_than_the_swap_sees_an_empty_day() {
    // PostgreSQL: a REPEATABLE READ or SERIALIZABLE transaction's snapshot
    // is taken at its first statement, before it locks the target. The
    // swapped-in partition's rows are newer than that snapshot and the old
    // partition is gone: the day reads empty (as after a TRUNCATE).
    for isolation in ["REPEATABLE READ", "SERIALIZABLE"] {
        for during in [false, true] {
            let Some(s) = snapshot_read(None, isolation, during) else { return };
            let at = format!("{isolation}, read {}", if during { "waiting on the swap" } else { "after the commit" });
            assert_eq!(s.report.method, "partition exchange", "{at}");
            assert_eq!(s.seen, Vec::<Vec<String>>::new(), "{at}: the reader sees an empty day, neither the old {:?} nor the new {:?}", s.old, s.new);
        }
    }
}

#[test]
fn with_swap_delete_insert_a_snapshot_older_than_the_run_sees_the_old_day() {
    for isolation in ["REPEATABLE READ", "SERIALIZABLE"] {
        for during in [false, true] {
            let Some(s) = snapshot_read(Some("delete_insert"), isolation, during) else { return };
            let at = format!("{isolation}, read {}", if during { "before the commit" } else { "after the commit" });
            assert_eq!((s.report.method.as_str(), s.report.rows_deleted, s.report.rows_inserted), ("delete+insert", 4, 5), "{at}");
            assert_eq!(
                s.report.method_note.as_deref(),
                Some("no partition exchange: the job has swap = \"delete_insert\" (the day's rows were deleted from silver.orders_20261020 and the new ones inserted)"),
                "{at}"
            );
            assert_eq!(s.seen, s.old, "{at}: the old day, whole");
        }
    }

    // The run converges to what partition exchange writes for the same
    // input: the same day, the same run key (`swap` is not part of the
    // job's definition hash: it does not change the rows).
    let Some(mut s) = snapshot_read(Some("delete_insert"), "REPEATABLE READ", false) else { return };
    let Some(mut exchanged) = with_target(LIST_TARGET) else { return };
    exec(&mut exchanged, CHANGE_THE_20TH);
    let ex = job(&with_swap(SILVER_JOB, "exchange"));
    let ex20 = ex.load(d("2026-10-20"), &mut exchanged).unwrap();
    assert_eq!((ex20.method.as_str(), ex20.method_note.as_deref()), ("partition exchange", None));
    assert_eq!((s.report.output(), &s.report.run_key), (ex20.output(), &ex20.run_key));
    assert_eq!(day_fp(&mut s.db, "silver.orders", "2026-10-20", &["load_id"]), ex20.output());
    let di = job(&with_swap(SILVER_JOB, "delete_insert"));
    assert_eq!(di.definition_hash(), ex.definition_hash());
    assert_eq!(di.load(d("2026-10-20"), &mut s.db).unwrap().outcome, "skipped", "a plain retry finds the day as recorded");

    // A day with no partition yet: one is created (empty, named after the
    // day), then filled by the insert; no staging table is left behind.
    let r21 = di.load(d("2026-10-21"), &mut s.db).unwrap();
    assert_eq!((r21.method.as_str(), r21.rows_deleted, r21.rows_inserted), ("delete+insert", 0, 1));
    assert_eq!(
        r21.method_note.as_deref(),
        Some("no partition exchange: the job has swap = \"delete_insert\" (the day's partition silver.orders_20261021 was created empty, then inserted into)")
    );
    assert_eq!(r21.output(), ex.load(d("2026-10-21"), &mut exchanged).unwrap().output());
    assert_eq!(
        partitions(&mut s.db, "silver.orders"),
        vec![
            vec!["\"orders_20261019\"", "\"FOR VALUES IN ('2026-10-19')\""],
            vec!["\"orders_20261020\"", "\"FOR VALUES IN ('2026-10-20')\""],
            vec!["\"orders_20261021\"", "\"FOR VALUES IN ('2026-10-21')\""],
        ]
    );
    assert_eq!(tables_in_silver(&mut s.db), vec![vec!["\"orders\""], vec!["\"orders_20261019\""], vec!["\"orders_20261020\""], vec!["\"orders_20261021\""]]);
    let again = di.load_with(d("2026-10-21"), &mut s.db, &force()).unwrap();
    assert_eq!((again.method.as_str(), again.rows_deleted, again.rows_inserted), ("delete+insert", 1, 1));
    assert_eq!(again.output(), r21.output());
}

/// A job whose guards wait for the insert (no `:run_key`, the target's
/// columns the source's): the day's table is filled while the guard scan
/// reads the same snapshot beside it. The day is the source's (an
/// independent digest), a retry is skipped; a row of another day is
/// refused by the guards, naming it (the day's table refuses it too), and
/// the old partition stays; so does a day with too few rows.
#[test]
fn guards_beside_the_exchange_insert() {
    let Some(mut db) = with_target(
        "CREATE SCHEMA silver;
CREATE TABLE silver.orders (order_id BIGINT, customer_id BIGINT, order_total DECIMAL(12,2), currency VARCHAR, updated_at TIMESTAMP, dt DATE) PARTITION BY LIST (dt);
CREATE TABLE silver.orders_20261020 PARTITION OF silver.orders FOR VALUES IN ('2026-10-20')",
    ) else {
        return;
    };
    let spec = r#"
name = "plain_orders"
target = "silver.orders"
strategy = "replace_partition"
partition = "dt"

[source]
sql = "SELECT order_id, customer_id, order_total, currency, updated_at, dt FROM bronze.orders WHERE dt = :run_date"
"#;
    let r = job(spec).load_with(d("2026-10-20"), &mut db, &force()).unwrap();
    assert_eq!((r.method.as_str(), r.rows_deleted, r.rows_inserted, r.output_rows), ("partition exchange", 0, 6, 6));
    let digest = |db: &mut dyn Engine, from: &str| rows(db, &format!("SELECT count(*), sum(hashtextextended(CAST(ROW(order_id, customer_id, order_total, currency, updated_at, dt) AS TEXT), 0)) FROM {from}"));
    assert_eq!(digest(&mut db, "silver.orders_20261020"), digest(&mut db, "bronze.orders WHERE dt = DATE '2026-10-20'"));
    assert_eq!(r.output(), day_fp(&mut db, "silver.orders", "2026-10-20", &[]), "the output fingerprint is the stored day's");
    assert_eq!((r.input_rows, r.input_checksum.as_str()), (r.output_rows, r.output_checksum.as_str()), "the day holds the source's rows as they are");
    assert_eq!(job(spec).load(d("2026-10-20"), &mut db).unwrap().outcome, "skipped");
    let before = rows(&mut db, "SELECT * FROM silver.orders ORDER BY order_id, updated_at");
    let old = oid(&mut db, "silver.orders_20261020");

    let wide = job(&spec.replace("WHERE dt = :run_date", "WHERE dt >= :run_date"));
    let err = wide.load_with(d("2026-10-20"), &mut db, &force()).unwrap_err();
    assert!(matches!(err, Error::OutOfPartition { rows: 1, .. }), "{err}");
    assert!(err.to_string().contains("order_id: 7"), "the row of another day is named: {err}");
    let few = job(&format!("min_rows = 7\n{spec}"));
    let err = few.load_with(d("2026-10-20"), &mut db, &force()).unwrap_err();
    assert!(matches!(err, Error::TooFewRows { rows: 6, min_rows: 7, .. }), "{err}");
    assert_eq!(rows(&mut db, "SELECT * FROM silver.orders ORDER BY order_id, updated_at"), before, "refused: the day as it was");
    assert_eq!(oid(&mut db, "silver.orders_20261020"), old, "the old partition stays attached");
    assert_eq!(tables_in_silver(&mut db), vec![vec!["\"orders\""], vec!["\"orders_20261020\""]], "no day table left behind");
}
