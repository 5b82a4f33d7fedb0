//! backfill and status scenarios, run on every engine.

use fixpoint_core::backfill::{backfill, status, BackfillOptions, DateOutcome, DateState};
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
            run: RunOptions { force: false, fault: Some((point, FaultAction::Error)), no_wait: false },
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
    let forced = BackfillOptions { run: RunOptions { force: true, fault: None, no_wait: false }, ..Default::default() };
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
    // A backfill repairs both and fills the gap.
    let o = backfill(&job, &range("2026-10-19", "2026-10-21"), db, &BackfillOptions::default(), |_| {});
    assert_eq!(outcomes(&o), ["committed"; 3]);
    assert_eq!(states(db, &job), [DateState::Ok; 3]);
    // A changed job definition is reported as such.
    let changed = fixpoint_scenarios::job(&SILVER_JOB.replace("metadata = [\"load_id\"]", "metadata = [\"load_id\"]\nmin_rows = 1"));
    assert_eq!(states(db, &changed), [DateState::JobChanged; 3]);
}

scenarios!(
    interrupted_backfill_resumes_to_the_uninterrupted_state,
    overlapping_backfill_leaves_done_days_alone,
    status_reports_gaps_drift_and_late_rows,
);
