//! backfill and status scenarios, run on every engine.

use fixpoint_core::tools::backfill::{backfill, done_dates, status, status_range, BackfillOptions, DateOutcome, DateState};
use fixpoint_core::{Engine, FailPoint, FaultAction, RunDate, RunOptions};
use fixpoint_scenarios::*;

fn range(a: &str, b: &str) -> Vec<RunDate> {
    RunDate::range(d(a), d(b))
}

fn outcomes(o: &[DateOutcome]) -> Vec<String> {
    o.iter()
        .map(|o| match o {
            DateOutcome::Done(r) => r.outcome.clone(),
            DateOutcome::Failed(_, _) => "failed".into(),
            DateOutcome::NotRun(_) => "not_run".into(),
        })
        .collect()
}

fn all_rows(db: &mut dyn Engine) -> Vec<Vec<String>> {
    rows(db, "SELECT * FROM silver.orders")
}

fn interrupted_backfill_resumes_to_the_uninterrupted_state(e: &dyn EngineUnderTest) {
    let job = job(SILVER_JOB);
    let mut clean = e.fresh();
    exec(clean.as_mut(), BRONZE);
    let o = backfill(&job, &range("2026-10-19", "2026-10-21"), clean.as_mut(), &BackfillOptions::default(), |_| {});
    assert_eq!(outcomes(&o), ["committed"; 3]);

    for point in [FailPoint::AfterDelete, FailPoint::BeforeCommit] {
        let mut db = e.fresh();
        exec(db.as_mut(), BRONZE);
        let failing = BackfillOptions {
            run: RunOptions { force: false, fault: Some((point, FaultAction::Error)), no_wait: false, ..RunOptions::default() },
            keep_going: false,
            fault_date: Some(d("2026-10-20")),
        };
        let mut seen = 0;
        let o = backfill(&job, &range("2026-10-19", "2026-10-21"), db.as_mut(), &failing, |_| seen += 1);
        assert_eq!(outcomes(&o), ["committed", "failed", "not_run"], "{point}");
        assert_eq!(seen, 2, "progress is reported for attempted dates");
        assert_eq!(count(db.as_mut(), "SELECT count(*) FROM silver.orders WHERE dt = DATE '2026-10-20'"), 0);
        let o = backfill(&job, &range("2026-10-19", "2026-10-21"), db.as_mut(), &BackfillOptions::default(), |_| {});
        assert_eq!(outcomes(&o), ["skipped", "committed", "committed"], "{point}: the done date is skipped");
        assert_eq!(all_rows(db.as_mut()), all_rows(clean.as_mut()), "{point}");
        // keep_going: the failing date is reported, the others run.
        let mut db = e.fresh();
        exec(db.as_mut(), BRONZE);
        let o = backfill(&job, &range("2026-10-19", "2026-10-21"), db.as_mut(), &BackfillOptions { keep_going: true, ..failing }, |_| {});
        assert_eq!(outcomes(&o), ["committed", "failed", "committed"]);
    }
}

fn overlapping_backfill_leaves_done_days_alone(e: &dyn EngineUnderTest) {
    let job = job(SILVER_JOB);
    let mut db = e.fresh();
    let db = db.as_mut();
    exec(db, BRONZE);
    let yesterday = job.load(d("2026-10-20"), db).unwrap();
    let o = backfill(&job, &range("2026-10-19", "2026-10-21"), db, &BackfillOptions::default(), |_| {});
    assert_eq!(outcomes(&o), ["committed", "skipped", "committed"]);
    assert_eq!(day_fp(db, "silver.orders", "2026-10-20", &["load_id"]), yesterday.output());
    // --force rewrites every date; the fingerprints stay.
    let before = all_rows(db);
    let forced = BackfillOptions { run: RunOptions { force: true, fault: None, no_wait: false, ..RunOptions::default() }, ..Default::default() };
    let o = backfill(&job, &range("2026-10-19", "2026-10-21"), db, &forced, |_| {});
    assert_eq!(outcomes(&o), ["committed"; 3]);
    assert_eq!(all_rows(db), before);
    // A changed source row reruns only its date.
    exec(db, "UPDATE bronze.orders SET order_total = 1 WHERE order_id = 7");
    let o = backfill(&job, &range("2026-10-19", "2026-10-21"), db, &BackfillOptions::default(), |_| {});
    assert_eq!(outcomes(&o), ["skipped", "skipped", "committed"]);
}

fn status_reports_gaps_drift_and_late_rows(e: &dyn EngineUnderTest) {
    let job = job(SILVER_JOB);
    let mut db = e.fresh();
    let db = db.as_mut();
    exec(db, BRONZE);
    job.load(d("2026-10-19"), db).unwrap();
    job.load(d("2026-10-21"), db).unwrap();
    let states = |db: &mut dyn Engine, job: &fixpoint_core::Job| -> Vec<DateState> {
        range("2026-10-19", "2026-10-21").into_iter().map(|day| status(job, day, db).unwrap().state).collect()
    };
    assert_eq!(states(db, &job), [DateState::Ok, DateState::Missing, DateState::Ok]);
    let s = status(&job, d("2026-10-19"), db).unwrap();
    assert_eq!((s.rows_now, s.input_rows_now), (Some(2), Some(2)));
    assert_eq!(s.last_run.as_ref().unwrap().run_key, s.run_key_now);
    // Someone edits the target: drift.
    exec(db, "UPDATE silver.orders SET order_total = 0 WHERE order_id = 1");
    // A late row arrives for the 21st: the source changed.
    exec(db, "INSERT INTO bronze.orders VALUES (8, 1, 2.00, 'EUR', TIMESTAMP '2026-10-21 23:59:00', DATE '2026-10-21')");
    assert_eq!(states(db, &job), [DateState::Drift, DateState::Missing, DateState::SourceChanged]);
    // The whole range at once (one ledger query, one grouped scan) says what each date says alone.
    let dates = range("2026-10-18", "2026-10-22");
    let together = status_range(&job, &dates, db).unwrap();
    let alone: Vec<_> = dates.iter().map(|day| status(&job, *day, db).unwrap()).collect();
    assert_eq!(format!("{together:?}"), format!("{alone:?}"));
    assert_eq!(
        together.iter().map(|s| (s.state, s.rows_now)).collect::<Vec<_>>(),
        [(DateState::Missing, Some(0)), (DateState::Drift, Some(2)), (DateState::Missing, Some(0)), (DateState::SourceChanged, Some(1)), (DateState::Missing, Some(0))]
    );
    // A backfill repairs both and fills the gap.
    let o = backfill(&job, &range("2026-10-19", "2026-10-21"), db, &BackfillOptions::default(), |_| {});
    assert_eq!(outcomes(&o), ["committed"; 3]);
    assert_eq!(states(db, &job), [DateState::Ok; 3]);
    // A changed job definition is reported as such.
    let changed = fixpoint_scenarios::job(&SILVER_JOB.replace("metadata = [\"load_id\"]", "metadata = [\"load_id\"]\nmin_rows = 1"));
    assert_eq!(states(db, &changed), [DateState::JobChanged; 3]);
}

/// The done dates found at once, before a backfill, are exactly the dates a
/// run would skip, with the same report; every other state runs.
fn done_dates_are_the_dates_a_run_would_skip(e: &dyn EngineUnderTest) {
    let job = job(SILVER_JOB);
    let mut db = e.fresh();
    let db = db.as_mut();
    exec(db, BRONZE);
    exec(db, "INSERT INTO bronze.orders VALUES (9, 1, 1.00, 'EUR', TIMESTAMP '2026-10-22 01:00:00', DATE '2026-10-22'), (10, 1, 2.00, 'EUR', TIMESTAMP '2026-10-23 01:00:00', DATE '2026-10-23')");
    let all = range("2026-10-18", "2026-10-24");
    assert!(done_dates(&job, &all, db).unwrap().is_empty(), "nothing is done before any run (no target yet)");
    let o = backfill(&job, &range("2026-10-18", "2026-10-23"), db, &BackfillOptions::default(), |_| {});
    assert_eq!(outcomes(&o), ["committed"; 6]);
    let done = done_dates(&job, &all, db).unwrap();
    let mut days: Vec<String> = done.keys().map(|d| d.to_string()).collect();
    days.sort();
    assert_eq!(days, ["2026-10-18", "2026-10-19", "2026-10-20", "2026-10-21", "2026-10-22", "2026-10-23"], "every run date, an empty one included; never the 24th");
    assert_eq!(done[&d("2026-10-18")].output_rows, 0);

    // One date each: a changed value (drift), a row deleted by hand, a row
    // added by hand, a late source row; the 18th (empty) and 19th stay done.
    exec(db, "UPDATE silver.orders SET order_total = 0 WHERE order_id = 3");
    exec(db, "DELETE FROM silver.orders WHERE order_id = 7");
    exec(db, "INSERT INTO silver.orders SELECT order_id + 100, customer_id, order_total, currency, updated_at, dt, load_id FROM silver.orders WHERE order_id = 9");
    exec(db, "INSERT INTO bronze.orders VALUES (11, 1, 3.00, 'EUR', TIMESTAMP '2026-10-23 02:00:00', DATE '2026-10-23')");
    let done = done_dates(&job, &all, db).unwrap();
    let mut days: Vec<String> = done.keys().map(|d| d.to_string()).collect();
    days.sort();
    assert_eq!(days, ["2026-10-18", "2026-10-19"]);
    // Each date's run agrees: skipped exactly where the probe said done, with the same report.
    for day in &all {
        let r = job.load(*day, db).unwrap();
        match done.get(day) {
            Some(p) => {
                assert_eq!(r.outcome, "skipped", "{day}");
                assert_eq!(
                    (&p.run_key, p.input_rows, &p.input_checksum, p.output_rows, &p.output_checksum, &p.skip_reason),
                    (&r.run_key, r.input_rows, &r.input_checksum, r.output_rows, &r.output_checksum, &r.skip_reason),
                    "{day}"
                );
            }
            None => assert_eq!(r.outcome, "committed", "{day}"),
        }
    }
    assert_eq!(done_dates(&job, &all, db).unwrap().len(), 7, "all seven dates done after the runs");
    // A changed job definition: nothing is done.
    let changed = fixpoint_scenarios::job(&SILVER_JOB.replace("metadata = [\"load_id\"]", "metadata = [\"load_id\"]\nmin_rows = 0"));
    assert!(done_dates(&changed, &all, db).unwrap().is_empty());
    // A backfill over done dates reports them skipped, without running them.
    let o = backfill(&job, &all, db, &BackfillOptions::default(), |_| {});
    assert_eq!(outcomes(&o), ["skipped"; 7]);
}

scenarios!(
    done_dates_are_the_dates_a_run_would_skip,
    interrupted_backfill_resumes_to_the_uninterrupted_state,
    overlapping_backfill_leaves_done_days_alone,
    status_reports_gaps_drift_and_late_rows,
);
