//! Model-based histories, on every engine: random sequences of deliveries
//! (duplicates, redeliveries, out-of-order versions, tombstones), runs,
//! retries of the same date, runs failed on purpose between steps, and
//! overlapping backfills (some failing midway), applied to a
//! `replace_partition` job and a `merge` job reading the same bronze table.
//! After every step each target equals a plain-Rust model of its strategy,
//! and the ledger agrees with the target; at the end, rerunning every date
//! changes nothing.
//!
//! Quick by default (part of `cargo test --workspace`). The long run:
//!
//! ```text
//! FIXPOINT_HISTORIES=10000 cargo test --workspace --test histories -- --nocapture
//! ```
//!
//! prints the figures recorded in RELIABILITY.md.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::time::Instant;

use fixpoint_core::backfill::{backfill, BackfillOptions, DateOutcome};
use fixpoint_core::{ledger, Error, FailPoint, FaultAction, RunOptions, RunReport};
use fixpoint_scenarios::*;
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};

const DAYS: usize = 4;

#[derive(Debug, Clone, PartialEq, Eq)]
struct Row {
    k: i64,
    v: i64,
    amount: Option<i64>,
    del: bool,
}

#[derive(Debug, Clone)]
enum Step {
    /// New rows for a day (random keys and versions: duplicates and
    /// out-of-order versions arise naturally).
    Deliver { day: usize, rows: Vec<Row> },
    /// The day's rows delivered again, exactly.
    Redeliver { day: usize },
    /// Both jobs run for the day (a retry when the day already ran).
    Run { day: usize },
    /// Both jobs run for the day and fail at a step boundary.
    Fail { day: usize, point: usize },
    /// Both jobs backfill a range, optionally failing on one of its dates.
    Backfill { from: usize, to: usize, fail: Option<(usize, usize)> },
}

fn row() -> impl Strategy<Value = Row> {
    (0i64..5, 0i64..4, proptest::option::of(0i64..3), proptest::bool::weighted(0.2)).prop_map(|(k, v, amount, del)| Row { k, v, amount, del })
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        3 => (0..DAYS, proptest::collection::vec(row(), 1..5)).prop_map(|(day, rows)| Step::Deliver { day, rows }),
        1 => (0..DAYS).prop_map(|day| Step::Redeliver { day }),
        3 => (0..DAYS).prop_map(|day| Step::Run { day }),
        2 => (0..DAYS, 0..FailPoint::ALL.len()).prop_map(|(day, point)| Step::Fail { day, point }),
        2 => (0..DAYS, 0..DAYS, proptest::option::weighted(0.4, (0..DAYS, 0..FailPoint::ALL.len())))
            .prop_map(|(a, b, fail)| Step::Backfill { from: a.min(b), to: a.max(b), fail }),
    ]
}

fn day(i: usize) -> String {
    format!("2026-10-{:02}", i + 1)
}

const SETUP: &str = "CREATE SCHEMA h;\nCREATE TABLE h.bronze (dt DATE, k BIGINT, v BIGINT, amount BIGINT, op VARCHAR)";

/// The newest version per key of the day; a tombstone winner removes the key.
const RP_JOB: &str = r#"
name = "h_rp"
target = "h.rp"
strategy = "replace_partition"
partition = "dt"

[source]
sql = """
SELECT k, v, amount, dt FROM (
  SELECT k, v, amount, op, dt,
         row_number() OVER (PARTITION BY k ORDER BY v DESC, op DESC, amount DESC NULLS LAST) AS rn
  FROM h.bronze WHERE dt = :run_date
) AS w
WHERE rn = 1 AND op <> 'D'
"""
"#;

/// Each day's rows are a batch of changes: newest version wins across days.
const MG_JOB: &str = r#"
name = "h_mg"
target = "h.mg"
strategy = "merge"
key = ["k"]
version = "v"
deleted = "op = 'D'"
on_tie = "deterministic"

[source]
sql = "SELECT k, v, amount, op FROM h.bronze WHERE dt = :run_date"
"#;

/// The plain-Rust model of what the two targets should hold.
#[derive(Default)]
struct Model {
    bronze: [Vec<Row>; DAYS],
    /// replace_partition: the partition of each day that ran.
    rp: BTreeMap<usize, Vec<Vec<String>>>,
    /// merge: every row of every batch merged so far.
    merged: Vec<Row>,
    /// (job, day) → how many bronze rows the day had at its last good run.
    last_run: BTreeMap<(String, usize), usize>,
}

impl Model {
    fn rp_day(&self, d: usize) -> Vec<Vec<String>> {
        let mut best: BTreeMap<i64, &Row> = BTreeMap::new();
        // ORDER BY v DESC, op DESC ('U' before 'D'), amount DESC NULLS LAST.
        let rank = |r: &Row| (r.v, !r.del, r.amount);
        for r in &self.bronze[d] {
            if best.get(&r.k).is_none_or(|b| rank(r) > rank(b)) {
                best.insert(r.k, r);
            }
        }
        let mut out: Vec<Vec<String>> = best.values().filter(|r| !r.del).map(|r| vec![r.k.to_string(), r.v.to_string(), amount(r), day(d)]).collect();
        out.sort();
        out
    }

    fn rp_rows(&self) -> Vec<Vec<String>> {
        let mut out: Vec<Vec<String>> = self.rp.values().flatten().cloned().collect();
        out.sort();
        out
    }

    /// The merge's winner per key: highest version, then a tombstone, then
    /// the smallest values (NULLs first).
    fn mg_rows(&self) -> Vec<Vec<String>> {
        let better = |a: &Row, b: &Row| {
            if a.v != b.v {
                return a.v > b.v;
            }
            if a.del != b.del {
                return a.del;
            }
            a.amount < b.amount
        };
        let mut winners: BTreeMap<i64, &Row> = BTreeMap::new();
        for r in &self.merged {
            if winners.get(&r.k).is_none_or(|w| better(r, w)) {
                winners.insert(r.k, r);
            }
        }
        let mut out: Vec<Vec<String>> = winners.values().filter(|r| !r.del).map(|r| vec![r.k.to_string(), r.v.to_string(), amount(r), "\"U\"".into()]).collect();
        out.sort();
        out
    }

    fn ran(&mut self, job: &str, d: usize) {
        self.last_run.insert((job.to_owned(), d), self.bronze[d].len());
        if job == "h_rp" {
            let rows = self.rp_day(d);
            self.rp.insert(d, rows);
        } else {
            self.merged.extend(self.bronze[d].iter().cloned());
        }
    }
}

fn amount(r: &Row) -> String {
    r.amount.map_or("NULL".into(), |a| a.to_string())
}

/// Counts for the figures.
#[derive(Default, Debug)]
struct Stats {
    histories: u64,
    steps: u64,
    committed: u64,
    skipped: u64,
    injected: u64,
    backfills: u64,
    checks: u64,
    ledger_checks: u64,
}

fn insert(db: &mut dyn fixpoint_core::Engine, d: usize, rows: &[Row]) {
    let values: Vec<String> = rows
        .iter()
        .map(|r| format!("(DATE '{}', {}, {}, {}, '{}')", day(d), r.k, r.v, amount(r), if r.del { "D" } else { "U" }))
        .collect();
    exec(db, &format!("INSERT INTO h.bronze VALUES {}", values.join(", ")));
}

fn table_rows(db: &mut dyn fixpoint_core::Engine, table: &str, cols: &str) -> Vec<Vec<String>> {
    let t = fixpoint_core::TableName::parse(table).unwrap();
    if db.table_columns(&t).unwrap().is_none() {
        return Vec::new();
    }
    rows(db, &format!("SELECT {cols} FROM {table}"))
}

/// Applies one job's outcome to the model.
fn outcome(r: fixpoint_core::Result<RunReport>, job: &str, d: usize, model: &mut Model, stats: &mut Stats) -> Result<(), TestCaseError> {
    match r {
        Ok(report) => {
            if report.outcome == "skipped" {
                stats.skipped += 1;
            } else {
                stats.committed += 1;
            }
            model.ran(job, d);
            Ok(())
        }
        Err(Error::Injected(_)) => {
            stats.injected += 1;
            Ok(())
        }
        Err(e) => Err(TestCaseError::fail(format!("{job} {}: {e}", day(d)))),
    }
}

/// The targets equal the model.
fn check(db: &mut dyn fixpoint_core::Engine, model: &Model, stats: &mut Stats, after: &str) -> Result<(), TestCaseError> {
    stats.checks += 1;
    prop_assert_eq!(table_rows(db, "h.rp", "k, v, amount, dt"), model.rp_rows(), "replace_partition after {}", after);
    prop_assert_eq!(table_rows(db, "h.mg", "k, v, amount, op"), model.mg_rows(), "merge after {}", after);
    Ok(())
}

/// The ledger agrees with the targets.
fn check_ledger(db: &mut dyn fixpoint_core::Engine, model: &Model, stats: &mut Stats, after: &str) -> Result<(), TestCaseError> {
    stats.ledger_checks += 1;
    // replace_partition: each day's latest ledger entry describes the
    // partition as it is; a day that never ran has no entry.
    for d in 0..DAYS {
        let latest = ledger::entries(db, Some("h_rp"), Some(fixpoint_core::RunDate::parse(&day(d)).unwrap()), Some(1)).unwrap();
        match (latest.first(), model.rp.contains_key(&d)) {
            (Some(e), true) => {
                let fp = day_fp(db, "h.rp", &day(d), &[]);
                prop_assert_eq!((e.output_rows, e.output_checksum.clone()), (fp.rows, fp.checksum.clone()), "ledger of {} after {}", day(d), after);
            }
            (None, false) => {}
            (e, ran) => prop_assert!(false, "ledger of {} after {}: entry {:?}, ran {}", day(d), after, e.map(|e| &e.run_key), ran),
        }
    }
    // merge: the ledger's inserts minus deletes are the target's rows.
    let entries = ledger::entries(db, Some("h_mg"), None, None).unwrap();
    let net: i64 = entries.iter().map(|e| e.rows_inserted as i64 - e.rows_deleted as i64).sum();
    prop_assert_eq!(net, model.mg_rows().len() as i64, "merge ledger after {}", after);
    Ok(())
}

fn history(db: &mut dyn fixpoint_core::Engine, steps: &[Step], stats: &mut Stats) -> Result<(), TestCaseError> {
    exec(db, "DROP SCHEMA IF EXISTS h CASCADE;\nDROP SCHEMA IF EXISTS fixpoint CASCADE");
    exec(db, SETUP);
    let jobs = [job(RP_JOB), job(MG_JOB)];
    let mut model = Model::default();
    stats.histories += 1;
    for (i, s) in steps.iter().enumerate() {
        stats.steps += 1;
        match s {
            Step::Deliver { day: d, rows } => {
                insert(db, *d, rows);
                model.bronze[*d].extend(rows.iter().cloned());
            }
            Step::Redeliver { day: d } => {
                let again = model.bronze[*d].clone();
                if !again.is_empty() {
                    insert(db, *d, &again);
                    model.bronze[*d].extend(again);
                }
            }
            Step::Run { day: d } => {
                for j in &jobs {
                    outcome(j.load(d_(*d), db), &j.name, *d, &mut model, stats)?;
                }
            }
            Step::Fail { day: d, point } => {
                let opts = RunOptions { fault: Some((FailPoint::ALL[*point], FaultAction::Error)), ..RunOptions::default() };
                for j in &jobs {
                    // Either the run fails at the point (nothing changes), or
                    // it had nothing to do and was skipped before reaching it.
                    let r = j.load_with(d_(*d), db, &opts);
                    if let Ok(rep) = &r {
                        prop_assert_eq!(&rep.outcome, "skipped", "a run that reached no fault point must have been a skip");
                    }
                    outcome(r, &j.name, *d, &mut model, stats)?;
                }
            }
            Step::Backfill { from, to, fail } => {
                stats.backfills += 1;
                let dates: Vec<_> = (*from..=*to).map(d_).collect();
                let opts = match fail {
                    Some((f, p)) => BackfillOptions {
                        run: RunOptions { fault: Some((FailPoint::ALL[*p], FaultAction::Error)), ..RunOptions::default() },
                        keep_going: false,
                        fault_date: Some(d_(*from + f % (to - from + 1))),
                    },
                    None => BackfillOptions::default(),
                };
                for j in &jobs {
                    let mut stopped = false;
                    for (o, n) in backfill(j, &dates, db, &opts, |_| {}).into_iter().zip(*from..=*to) {
                        match o {
                            DateOutcome::Done(r) => {
                                prop_assert!(!stopped, "no date runs after a failed one");
                                outcome(Ok(r), &j.name, n, &mut model, stats)?;
                            }
                            DateOutcome::Failed(_, e) => {
                                stopped = true;
                                outcome(Err(e), &j.name, n, &mut model, stats)?;
                            }
                            DateOutcome::NotRun(_) => prop_assert!(stopped, "a date is only left out after a failure"),
                        }
                    }
                }
            }
        }
        check(db, &model, stats, &format!("step {i}: {s:?}"))?;
        // The ledger after every step of the quick run; after the last step
        // (below) in long runs.
        if !long() {
            check_ledger(db, &model, stats, &format!("step {i}: {s:?}"))?;
        }
    }
    check_ledger(db, &model, stats, "the last step")?;
    // Every (job, date) whose input has not changed since its last good
    // run, run once more: nothing changes.
    let before = (table_rows(db, "h.rp", "*"), table_rows(db, "h.mg", "*"));
    let again: Vec<(String, usize)> =
        model.last_run.iter().filter(|((_, d), n)| model.bronze[*d].len() == **n).map(|(k, _)| k.clone()).collect();
    for (name, d) in again {
        let j = jobs.iter().find(|j| j.name == name).expect("a job");
        outcome(j.load(d_(d), db), &j.name, d, &mut model, stats)?;
    }
    prop_assert_eq!((table_rows(db, "h.rp", "*"), table_rows(db, "h.mg", "*")), before, "rerunning every date changed the targets");
    check(db, &model, stats, "the final reruns")?;
    check_ledger(db, &model, stats, "the final reruns")
}

fn long() -> bool {
    std::env::var_os("FIXPOINT_HISTORIES").is_some()
}

fn d_(i: usize) -> fixpoint_core::RunDate {
    d(&day(i))
}

/// How many histories: `FIXPOINT_HISTORIES`, or `quick` in the normal suite.
fn cases(quick: u32) -> u32 {
    std::env::var("FIXPOINT_HISTORIES").ok().and_then(|v| v.parse().ok()).unwrap_or(quick)
}

/// Worker threads for the histories: `FIXPOINT_HISTORY_THREADS`, else one
/// in the quick run and one per core in a long run. Each thread has its own
/// database and its own share of the histories.
fn threads() -> u32 {
    let default = if long() { std::thread::available_parallelism().map_or(1, |n| n.get() as u32) } else { 1 };
    std::env::var("FIXPOINT_HISTORY_THREADS").ok().and_then(|v| v.parse().ok()).unwrap_or(default).max(1)
}

fn run_histories(e: &(dyn EngineUnderTest + Sync), engine: &str, quick: u32) {
    let cases = cases(quick);
    let workers = threads().min(cases.max(1));
    let started = Instant::now();
    let done = std::sync::atomic::AtomicU64::new(0);
    let results: Vec<(Stats, Result<(), String>)> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..workers)
            .map(|w| {
                // The first workers take one history more when the count does not divide.
                let share = cases / workers + u32::from(w < cases % workers);
                let done = &done;
                scope.spawn(move || {
                    let db = RefCell::new(e.fresh());
                    if engine == "duckdb" {
                        // Tiny statements: one thread per database spares the scheduler's hand-offs.
                        exec(db.borrow_mut().as_mut(), "SET threads = 1");
                    }
                    let stats = RefCell::new(Stats::default());
                    let mut runner = TestRunner::new(Config { cases: share, failure_persistence: None, ..Config::default() });
                    let result = runner.run(&proptest::collection::vec(step(), 1..11), |steps| {
                        let r = history(db.borrow_mut().as_mut(), &steps, &mut stats.borrow_mut());
                        let n = done.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
                        if long() && n % 500 == 0 {
                            eprintln!("histories {engine}: {n} so far, {:.0} s", started.elapsed().as_secs_f64());
                        }
                        r
                    });
                    (stats.into_inner(), result.map_err(|e| e.to_string()))
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().expect("a history worker panicked")).collect()
    });
    let mut s = Stats::default();
    for (w, _) in &results {
        s.histories += w.histories;
        s.steps += w.steps;
        s.committed += w.committed;
        s.skipped += w.skipped;
        s.injected += w.injected;
        s.backfills += w.backfills;
        s.checks += w.checks;
        s.ledger_checks += w.ledger_checks;
    }
    eprintln!(
        "histories {engine}: {} histories run ({} asked for, {workers} thread(s)), {} steps, {} runs committed, {} skipped, {} failed on purpose, {} backfills, {} state checks, {} ledger checks, {:.1} s",
        s.histories,
        cases,
        s.steps,
        s.committed,
        s.skipped,
        s.injected,
        s.backfills,
        s.checks,
        s.ledger_checks,
        started.elapsed().as_secs_f64()
    );
    for (_, r) in results {
        if let Err(e) = r {
            panic!("{engine}: {e}");
        }
    }
}

#[test]
fn duckdb_histories_match_the_model() {
    run_histories(&DuckDbUnderTest, "duckdb", 64);
}

#[test]
fn postgres_histories_match_the_model() {
    if let Some(pg) = PgUnderTest::get() {
        run_histories(&pg, "postgres", 24);
    }
}
