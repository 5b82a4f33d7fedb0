//! Late-arriving data, run on every engine: a run with `lookback` reloads
//! exactly the days whose input changed, anchored to the run date.

use fixpoint_core::tools::lookback::{run_window, WindowReport};
use fixpoint_core::{Error, FailPoint, FaultAction, RunOptions};
use fixpoint_core::run::ledger;
use fixpoint_scenarios::*;

fn actions(w: &WindowReport) -> Vec<(String, String)> {
    w.days.iter().map(|d| (d.run_date.clone(), d.action.clone())).collect()
}

fn pairs(v: &[(&str, &str)]) -> Vec<(String, String)> {
    v.iter().map(|(a, b)| (a.to_string(), b.to_string())).collect()
}

const LATE_ROW_ON_THE_19TH: &str = "INSERT INTO bronze.orders VALUES (10, 20, 3.00, 'EUR', TIMESTAMP '2026-10-19 23:59:00', DATE '2026-10-19')";

fn a_late_row_reloads_only_its_day(e: &dyn EngineUnderTest) {
    let mut db = e.fresh();
    let db = db.as_mut();
    exec(db, BRONZE);
    let job = job(&format!("lookback = 2\n{SILVER_JOB}"));
    let (first, err) = run_window(&job, d("2026-10-21"), db, &RunOptions::default(), None);
    assert!(err.is_none(), "{err:?}");
    assert_eq!(actions(&first), pairs(&[("2026-10-19", "loaded"), ("2026-10-20", "loaded"), ("2026-10-21", "loaded")]));
    assert_eq!(first.days[0].reason, "never loaded");
    let (fp20, fp21) = (day_fp(db, "silver.orders", "2026-10-20", &["load_id"]), day_fp(db, "silver.orders", "2026-10-21", &["load_id"]));

    exec(db, LATE_ROW_ON_THE_19TH);
    let (second, err) = run_window(&job, d("2026-10-21"), db, &RunOptions::default(), None);
    assert!(err.is_none(), "{err:?}");
    assert_eq!(actions(&second), pairs(&[("2026-10-19", "reloaded"), ("2026-10-20", "skipped"), ("2026-10-21", "skipped")]));
    assert_eq!(second.days[0].reason, "its input changed since its last load (2 → 3 source rows, another checksum)");
    assert_eq!((second.written, second.skipped, second.failed), (1, 2, 0));
    assert_eq!(count(db, "SELECT count(*) FROM silver.orders WHERE dt = DATE '2026-10-19'"), 3, "the late row is in");
    assert_eq!(day_fp(db, "silver.orders", "2026-10-20", &["load_id"]), fp20);
    assert_eq!(day_fp(db, "silver.orders", "2026-10-21", &["load_id"]), fp21);

    // Again, and "the next morning": the window hangs on --date and the ledger only.
    for _ in 0..2 {
        let (again, err) = run_window(&job, d("2026-10-21"), db, &RunOptions::default(), None);
        assert!(err.is_none());
        assert_eq!(actions(&again), pairs(&[("2026-10-19", "skipped"), ("2026-10-20", "skipped"), ("2026-10-21", "skipped")]));
    }
    assert_eq!(ledger::entries(db, Some("silver_orders"), None, None).unwrap().len(), 4, "3 loads and 1 reload");
}

fn days_before_the_start_are_outside_the_job(e: &dyn EngineUnderTest) {
    let mut db = e.fresh();
    let db = db.as_mut();
    exec(db, BRONZE);
    let job = job(&format!("lookback = 3\nstart = 2026-10-20\n{SILVER_JOB}"));
    let (w, err) = run_window(&job, d("2026-10-21"), db, &RunOptions::default(), None);
    assert!(err.is_none());
    assert_eq!(
        actions(&w),
        pairs(&[("2026-10-18", "outside"), ("2026-10-19", "outside"), ("2026-10-20", "loaded"), ("2026-10-21", "loaded")])
    );
    assert_eq!(w.days[0].reason, "before the job's start 2026-10-20");
    assert_eq!(count(db, "SELECT count(*) FROM silver.orders WHERE dt < DATE '2026-10-20'"), 0);
    let quoted = job_text_start("\"2026-10-20\"");
    assert_eq!(quoted.start, job.start, "a quoted date is accepted too");
}

fn job_text_start(start: &str) -> fixpoint_core::Job {
    job(&format!("start = {start}\n{SILVER_JOB}"))
}

fn a_failure_in_one_day_leaves_the_others_and_a_retry_finishes(e: &dyn EngineUnderTest) {
    let mut db = e.fresh();
    let db = db.as_mut();
    exec(db, BRONZE);
    let job = job(&format!("lookback = 2\n{SILVER_JOB}"));
    let (_, err) = run_window(&job, d("2026-10-21"), db, &RunOptions::default(), None);
    assert!(err.is_none());
    let before20 = rows(db, "SELECT * FROM silver.orders WHERE dt = DATE '2026-10-20'");
    exec(db, LATE_ROW_ON_THE_19TH);
    exec(db, "INSERT INTO bronze.orders VALUES (11, 21, 4.00, 'EUR', TIMESTAMP '2026-10-20 23:00:00', DATE '2026-10-20')");
    let fault = RunOptions { fault: Some((FailPoint::AfterDelete, FaultAction::Error)), ..Default::default() };
    let (w, err) = run_window(&job, d("2026-10-21"), db, &fault, Some(d("2026-10-20")));
    assert!(matches!(err, Some(Error::Injected(FailPoint::AfterDelete))), "{err:?}");
    assert_eq!(actions(&w), pairs(&[("2026-10-19", "reloaded"), ("2026-10-20", "failed"), ("2026-10-21", "skipped")]));
    assert_eq!(count(db, "SELECT count(*) FROM silver.orders WHERE dt = DATE '2026-10-19'"), 3);
    assert_eq!(rows(db, "SELECT * FROM silver.orders WHERE dt = DATE '2026-10-20'"), before20, "the failed day keeps its previous contents");
    let (retry, err) = run_window(&job, d("2026-10-21"), db, &RunOptions::default(), None);
    assert!(err.is_none());
    assert_eq!(actions(&retry), pairs(&[("2026-10-19", "skipped"), ("2026-10-20", "reloaded"), ("2026-10-21", "skipped")]));
    assert_eq!(count(db, "SELECT count(*) FROM silver.orders WHERE dt = DATE '2026-10-20'"), 5, "orders 3, 4, 5, 6 and the late 11");
}

fn lookback_keys_are_checked(_e: &dyn EngineUnderTest) {
    let parse = |text: String| fixpoint_core::Job::from_toml(&text, std::path::Path::new("j.toml")).unwrap_err().to_string();
    assert_eq!(parse(format!("lookback = -1\n{SILVER_JOB}")), "j.toml: lookback: -1: expected a number of days from 0 to 366");
    assert_eq!(parse(format!("start = \"yesterday\"\n{SILVER_JOB}")), "j.toml: start: yesterday: expected a date, e.g. start = 2026-10-01");
    let merge = BRONZE_MERGE_JOB.replace("name = \"orders_merge\"", "name = \"orders_merge\"\nlookback = 2");
    assert_eq!(parse(merge), "j.toml: lookback: only applies to strategy = \"replace_partition\"");
}

scenarios!(
    a_late_row_reloads_only_its_day,
    days_before_the_start_are_outside_the_job,
    a_failure_in_one_day_leaves_the_others_and_a_retry_finishes,
    lookback_keys_are_checked
);
