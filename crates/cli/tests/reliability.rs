//! Reliability of the `fixpoint` process as a scheduler drives it, on both
//! engines:
//!
//! - `run` and `backfill` killed with SIGKILL at random moments, trial after
//!   trial, while a reader samples the partitions (PostgreSQL: a concurrent
//!   reader; DuckDB allows one process per file, so there the reader samples
//!   right after each kill, the first moment another process can look):
//!   every sample is the day's old contents or its new contents, never an
//!   empty, half-written or duplicated day; after each kill a rerun reaches
//!   the clean fingerprint.
//! - double-fired runs: the same date started several times at once, and
//!   neighbouring dates at once: the final state equals one run per date.
//!
//! Trials: `FIXPOINT_CRASH_TRIALS` (default 8 per engine and command);
//! kill delays: `FIXPOINT_SEED` (default from the process id, printed);
//! `--nocapture` prints the figures recorded in RELIABILITY.md.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use fixpoint_core::engine::{fingerprint, Column, Engine, Filter, Scope};
use fixpoint_core::{Fingerprint, Method, RunDate, Sql, TableName};

const ROWS_PER_DAY: i64 = 50_000;
const DAYS: [&str; 3] = ["2026-10-01", "2026-10-02", "2026-10-03"];

const JOB: &str = r#"name = "crash"
target = "silver.c"
strategy = "replace_partition"
partition = "dt"
min_rows = 1

[source]
sql = "SELECT id, amount, note, dt FROM bronze.c WHERE dt = :run_date"
"#;

/// Where the trials run: a DuckDB file or a PostgreSQL scratch database.
enum Target {
    Duck(PathBuf),
    Pg { url: String, _db: fixpoint_postgres::Postgres },
}

impl Target {
    fn url(&self) -> String {
        match self {
            Target::Duck(p) => format!("duckdb:{}", p.display()),
            Target::Pg { url, .. } => url.clone(),
        }
    }

    fn open(&self) -> Box<dyn Engine> {
        match self {
            Target::Duck(p) => Box::new(fixpoint_duckdb::DuckDb::open(p, Duration::from_secs(30)).unwrap()),
            Target::Pg { url, .. } => Box::new(fixpoint_postgres::Postgres::connect(url).unwrap()),
        }
    }

    fn duck(dir: &Path) -> Target {
        let t = Target::Duck(dir.join("w.duckdb"));
        let mut db = t.open();
        for s in [
            "CREATE SCHEMA bronze".to_owned(),
            format!(
                "CREATE TABLE bronze.c AS SELECT i AS id, CAST(i AS DECIMAL(18,2)) AS amount, 'note ' || i AS note, CAST(DATE '2026-10-01' + CAST(i % 3 AS INTEGER) AS DATE) AS dt FROM range({}) AS r(i)",
                ROWS_PER_DAY * 3
            ),
        ] {
            db.execute(&Sql::raw(s)).unwrap();
        }
        t
    }

    /// `None` (after saying so) when the server is unreachable outside CI.
    fn pg(tag: &str) -> Option<Target> {
        let admin = std::env::var("FIXPOINT_TEST_PG").unwrap_or_else(|_| "postgres://root@127.0.0.1:5432/test".into());
        let name = format!("fixpoint_rel_{tag}_{}", std::process::id());
        let mut pg = match fixpoint_postgres::Postgres::scratch(&admin, &name) {
            Ok(pg) => pg,
            Err(e) if std::env::var("CI").as_deref() == Ok("true") => panic!("postgres is unreachable under CI=true: {e}"),
            Err(e) => {
                eprintln!("skipped: postgres is unreachable ({e})");
                return None;
            }
        };
        for s in [
            "CREATE SCHEMA bronze".to_owned(),
            format!(
                "CREATE TABLE bronze.c AS SELECT i AS id, CAST(i AS DECIMAL(18,2)) AS amount, 'note ' || i AS note, CAST(DATE '2026-10-01' + CAST(i % 3 AS INTEGER) AS DATE) AS dt FROM generate_series(0, {}) AS r(i)",
                ROWS_PER_DAY * 3 - 1
            ),
        ] {
            pg.execute(&Sql::raw(s)).unwrap();
        }
        let url = pg.url().to_owned();
        Some(Target::Pg { url, _db: pg })
    }
}

fn cols() -> Vec<Column> {
    [("id", "BIGINT"), ("amount", "DECIMAL(18,2)"), ("note", "VARCHAR"), ("dt", "DATE")].iter().map(|(n, t)| Column { name: (*n).into(), ty: (*t).into() }).collect()
}

/// (rows, checksum) of one day of a table, the same way for source and target.
fn day_fp(db: &mut dyn Engine, table: &str, day: &str) -> Fingerprint {
    let t = TableName::parse(table).unwrap();
    if db.table_columns(&t).unwrap().is_none() {
        return Fingerprint { kind: String::new(), rows: 0, checksum: String::new() };
    }
    let date = RunDate::parse(day).unwrap().date();
    // The target's own column types (the source's, as it was created).
    let cols: Vec<Column> = db.table_columns(&t).unwrap().unwrap().into_iter().filter(|c| cols().iter().any(|x| x.name == c.name)).collect();
    fingerprint(db, Method::Native, &Scope::Table { table: &t, filter: Some(Filter::DateEquals("dt", date)) }, &cols).unwrap()
}

fn fixpoint(dir: &Path, args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_fixpoint")).args(args).current_dir(dir).env_remove("FIXPOINT_DB").env_remove("FIXPOINT_FAIL_AT").output().unwrap()
}

/// A small deterministic generator for kill delays (seed printed).
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

fn trials() -> usize {
    std::env::var("FIXPOINT_CRASH_TRIALS").ok().and_then(|v| v.parse().ok()).unwrap_or(8)
}

#[derive(Default, Debug)]
struct Tally {
    trials: usize,
    finished_before_kill: usize,
    old_state_after_kill: usize,
    new_state_after_kill: usize,
    mixed_backfill_after_kill: usize,
    reader_samples: usize,
}

/// Kill trials on one target: `command` is "run" (one day) or "backfill"
/// (the three days).
fn kill_trials(dir: &Path, target: &Target, command: &str, engine: &str) {
    std::fs::write(dir.join("job.toml"), JOB).unwrap();
    let url = target.url();
    let days: Vec<&str> = if command == "run" { vec![DAYS[1]] } else { DAYS.to_vec() };
    let args: Vec<String> = match command {
        "run" => ["run", "job.toml", "--date", DAYS[1], "--db", &url].iter().map(|s| s.to_string()).collect(),
        _ => ["backfill", "job.toml", "--from", DAYS[0], "--to", DAYS[2], "--db", &url].iter().map(|s| s.to_string()).collect(),
    };
    // The first, unkilled load: its duration scales the kill delays.
    let t0 = Instant::now();
    let first = fixpoint(dir, &args.iter().map(String::as_str).collect::<Vec<_>>());
    assert!(first.status.success(), "{}", String::from_utf8_lossy(&first.stderr));
    let mut full = t0.elapsed();
    let mut current: Vec<Fingerprint> = {
        let mut db = target.open();
        days.iter().map(|d| day_fp(db.as_mut(), "silver.c", d)).collect()
    };
    let seed = std::env::var("FIXPOINT_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(|| 0x9E37_79B9_7F4A_7C15 ^ std::process::id() as u64);
    let mut rng = Rng(seed | 1);
    let mut tally = Tally::default();
    for trial in 0..trials() {
        tally.trials += 1;
        // New input for every day: the run must replace each day whole.
        let next: Vec<Fingerprint> = {
            let mut db = target.open();
            db.execute(&Sql::raw("UPDATE bronze.c SET amount = amount + 1")).unwrap();
            days.iter().map(|d| day_fp(db.as_mut(), "bronze.c", d)).collect()
        };
        // A concurrent reader (PostgreSQL): every sample is old or new.
        let stop = Arc::new(AtomicBool::new(false));
        let bad = Arc::new(Mutex::new(Vec::<String>::new()));
        let samples = Arc::new(Mutex::new(0usize));
        let reader = match target {
            Target::Pg { url, .. } => {
                let (url, stop, bad, samples, old, new) = (url.clone(), stop.clone(), bad.clone(), samples.clone(), current.clone(), next.clone());
                let days: Vec<String> = days.iter().map(|s| s.to_string()).collect();
                Some(std::thread::spawn(move || {
                    let mut db = fixpoint_postgres::Postgres::connect(&url).unwrap();
                    while !stop.load(Ordering::Relaxed) {
                        for (i, d) in days.iter().enumerate() {
                            let fp = day_fp(&mut db, "silver.c", d);
                            *samples.lock().unwrap() += 1;
                            if fp != old[i] && fp != new[i] {
                                bad.lock().unwrap().push(format!("{d}: {} rows, {}", fp.rows, fp.checksum));
                            }
                        }
                    }
                }))
            }
            Target::Duck(_) => None,
        };
        // Uniform over the run's life and a little after it: the longest
        // unkilled run so far (the first, or a rerun) scales it.
        let delay = Duration::from_micros(rng.below((full.as_micros() as u64) * 2));
        let mut child = Command::new(env!("CARGO_BIN_EXE_fixpoint"))
            .args(&args)
            .current_dir(dir)
            .env_remove("FIXPOINT_DB")
            .env_remove("FIXPOINT_FAIL_AT")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(delay);
        let finished = child.try_wait().unwrap().is_some();
        let _ = child.kill(); // SIGKILL
        let status = child.wait().unwrap();
        if finished {
            assert!(status.success(), "trial {trial}: the unkilled run failed");
            tally.finished_before_kill += 1;
        }
        stop.store(true, Ordering::Relaxed);
        if let Some(r) = reader {
            r.join().unwrap();
        }
        tally.reader_samples += *samples.lock().unwrap();
        let bad = bad.lock().unwrap().clone();
        assert!(bad.is_empty(), "{engine} {command} trial {trial} (seed {seed}, kill after {delay:?}): the reader saw {bad:?}");
        // Right after the kill: each day is old or new; a backfill's days
        // are new up to some date and old after it.
        let after: Vec<Fingerprint> = {
            let mut db = target.open();
            days.iter().map(|d| day_fp(db.as_mut(), "silver.c", d)).collect()
        };
        let mut seen_old = false;
        for (i, fp) in after.iter().enumerate() {
            let is_new = *fp == next[i];
            assert!(is_new || *fp == current[i], "{engine} {command} trial {trial} (seed {seed}, kill after {delay:?}): {} is neither old nor new: {} rows", days[i], fp.rows);
            assert!(!(is_new && seen_old), "{engine} backfill trial {trial}: {} is new after an old day", days[i]);
            seen_old |= !is_new;
        }
        if !finished {
            match (after.iter().zip(&next).all(|(a, n)| a == n), after.iter().zip(&current).all(|(a, c)| a == c)) {
                (true, _) => tally.new_state_after_kill += 1,
                (_, true) => tally.old_state_after_kill += 1,
                _ => tally.mixed_backfill_after_kill += 1,
            }
        }
        // The rerun converges to the clean state of the new input.
        let t1 = Instant::now();
        let rerun = fixpoint(dir, &args.iter().map(String::as_str).collect::<Vec<_>>());
        full = full.max(t1.elapsed());
        assert!(rerun.status.success(), "{}", String::from_utf8_lossy(&rerun.stderr));
        let converged: Vec<Fingerprint> = {
            let mut db = target.open();
            days.iter().map(|d| day_fp(db.as_mut(), "silver.c", d)).collect()
        };
        for i in 0..days.len() {
            assert_eq!((converged[i].rows, &converged[i].checksum), (next[i].rows, &next[i].checksum), "{engine} {command} trial {trial}: rerun of {}", days[i]);
        }
        current = converged;
    }
    eprintln!("kill -9 {engine} {command}: {tally:?} (seed {seed}, unkilled run {:.2} s)", full.as_secs_f64());
    assert_eq!(tally.trials, trials());
}

#[test]
fn duckdb_run_killed_at_random_moments() {
    let tmp = tempfile::tempdir().unwrap();
    let t = Target::duck(tmp.path());
    kill_trials(tmp.path(), &t, "run", "duckdb");
}

#[test]
fn duckdb_backfill_killed_at_random_moments() {
    let tmp = tempfile::tempdir().unwrap();
    let t = Target::duck(tmp.path());
    kill_trials(tmp.path(), &t, "backfill", "duckdb");
}

#[test]
fn postgres_run_killed_at_random_moments() {
    let tmp = tempfile::tempdir().unwrap();
    if let Some(t) = Target::pg("run") {
        kill_trials(tmp.path(), &t, "run", "postgres");
    }
}

#[test]
fn postgres_backfill_killed_at_random_moments() {
    let tmp = tempfile::tempdir().unwrap();
    if let Some(t) = Target::pg("backfill") {
        kill_trials(tmp.path(), &t, "backfill", "postgres");
    }
}

/// The same date fired three times at once, then two neighbouring dates at
/// once: every process succeeds (the later ones wait: DuckDB for the file,
/// PostgreSQL for the job's lock) and the state equals one run per date.
fn double_fired(dir: &Path, target: &Target, engine: &str) {
    std::fs::write(dir.join("job.toml"), JOB).unwrap();
    let url = target.url();
    let spawn = |date: &str| {
        Command::new(env!("CARGO_BIN_EXE_fixpoint"))
            .args(["run", "job.toml", "--date", date, "--db", &url, "--output", "json"])
            .current_dir(dir)
            .env_remove("FIXPOINT_DB")
            .env_remove("FIXPOINT_FAIL_AT")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let outcomes = |children: Vec<std::process::Child>| -> Vec<String> {
        let mut v: Vec<String> = children
            .into_iter()
            .map(|c| {
                let o = c.wait_with_output().unwrap();
                assert!(o.status.success(), "{engine}: a double-fired run failed: {}", String::from_utf8_lossy(&o.stderr));
                let r: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
                r["outcome"].as_str().unwrap().to_owned()
            })
            .collect();
        v.sort();
        v
    };
    let same = outcomes((0..3).map(|_| spawn(DAYS[1])).collect());
    assert_eq!(same, ["committed", "skipped", "skipped"], "{engine}: one run writes, the others find it done");
    let neighbours = outcomes(vec![spawn(DAYS[0]), spawn(DAYS[2]), spawn(DAYS[0]), spawn(DAYS[2])]);
    assert_eq!(neighbours, ["committed", "committed", "skipped", "skipped"], "{engine}");
    let mut db = target.open();
    for d in DAYS {
        let fp = day_fp(db.as_mut(), "silver.c", d);
        let src = day_fp(db.as_mut(), "bronze.c", d);
        assert_eq!((fp.rows, fp.checksum), (src.rows, src.checksum), "{engine} {d}: one run's contents");
    }
    let ledger = db.query(&Sql::raw("SELECT run_date, count(*) FROM fixpoint.runs GROUP BY run_date ORDER BY run_date")).unwrap();
    let per_day: Vec<String> = ledger.rows.iter().map(|r| format!("{} {}", r[0].display(), r[1].display())).collect();
    assert_eq!(per_day.len(), 3, "{engine}: {per_day:?}");
    assert!(per_day.iter().all(|r| r.ends_with(" 1")), "{engine}: one ledger row per date: {per_day:?}");
}

#[test]
fn duckdb_double_fired_runs_equal_one_run() {
    let tmp = tempfile::tempdir().unwrap();
    let t = Target::duck(tmp.path());
    double_fired(tmp.path(), &t, "duckdb");
}

#[test]
fn postgres_double_fired_runs_equal_one_run() {
    let tmp = tempfile::tempdir().unwrap();
    if let Some(t) = Target::pg("double") {
        double_fired(tmp.path(), &t, "postgres");
    }
}
