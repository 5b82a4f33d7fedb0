//! Delta Lake warehouses (feature `delta`): what fixpoint writes is read
//! back by an independent reader (the Python `deltalake` package), a lost
//! commit acknowledgement and a concurrent writer never give two commits of
//! one run, and tables using features fixpoint cannot honour are refused.
#![cfg(feature = "delta")]

use std::path::{Path, PathBuf};

use fixpoint_core::run::ledger;
use fixpoint_core::{Engine, Error, FailPoint, FaultAction, RunOptions};
use fixpoint_delta::{Delta, DeltaFault};
use fixpoint_scenarios::*;

/// A warehouse folder of its own, removed at the end of the test.
struct Folder(PathBuf);

impl Folder {
    fn new(name: &str) -> Folder {
        let dir = std::env::temp_dir().join(format!("fixpoint-delta-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        Folder(dir)
    }

    fn open(&self) -> Delta {
        Delta::open(&self.0).unwrap_or_else(|e| panic!("{e}"))
    }
}

impl Drop for Folder {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The Python interpreter with `deltalake` (the tests' virtualenv:
/// `FIXPOINT_TEST_PYTHON`, else `~/.cache/fixpoint/pyvenv/bin/python`), or
/// `None` (after saying so) outside CI; under `CI=true` it must be there.
fn python() -> Option<PathBuf> {
    let py = std::env::var_os("FIXPOINT_TEST_PYTHON").map(PathBuf::from).unwrap_or_else(|| {
        PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache/fixpoint/pyvenv/bin/python")
    });
    let ok = std::process::Command::new(&py).args(["-c", "import deltalake, pyarrow"]).output().is_ok_and(|o| o.status.success());
    match ok {
        true => Some(py),
        false if std::env::var("CI").as_deref() == Ok("true") => panic!("{} with the deltalake package is missing under CI=true", py.display()),
        false => {
            eprintln!("skipped: no Python with deltalake at {} (set FIXPOINT_TEST_PYTHON, or create the virtualenv as .ci/run does)", py.display());
            None
        }
    }
}

/// What the Python `deltalake` package reads in `table`: its rows (sorted
/// JSON), each commit's operation and fixpoint run key (newest first), the
/// transaction version of each app id asked for, the names of its active
/// files and its partition columns.
fn read_with_python(py: &Path, table: &Path, columns: &[&str], apps: &[&str]) -> serde_json::Value {
    read_url_with_python(py, &table.to_string_lossy(), &serde_json::json!({}), columns, apps)
}

/// [`read_with_python`] for a table URL (`s3://…`) with the Python
/// package's storage options.
fn read_url_with_python(py: &Path, table: &str, storage: &serde_json::Value, columns: &[&str], apps: &[&str]) -> serde_json::Value {
    let script = r#"
import json, sys
from deltalake import DeltaTable
path, columns, apps, storage = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3]), json.loads(sys.argv[4])
dt = DeltaTable(path, storage_options=storage or None)
t = dt.to_pyarrow_table(columns=columns)
rows = sorted([[str(v) for v in r.values()] for r in t.to_pylist()])
commits = []
for h in dt.history():
    fp = h.get("fixpoint")
    if isinstance(fp, str):
        fp = json.loads(fp)
    commits.append({"operation": h.get("operation"), "run_key": (fp or {}).get("run_key")})
files = sorted(u.rsplit("/", 1)[-1] for u in dt.file_uris())
partitioned_by = list(dt.metadata().partition_columns)
print(json.dumps({"rows": rows, "commits": commits, "txn": {a: dt.transaction_version(a) for a in apps}, "version": dt.version(), "files": files, "partitioned_by": partitioned_by}), flush=True)
# Skip the interpreter's teardown: the native libraries' thread pools
# sometimes abort there ("terminate called without an active exception").
import os
os._exit(0)
"#;
    let out = std::process::Command::new(py)
        .args(["-c", script, table, &serde_json::to_string(columns).unwrap(), &serde_json::to_string(apps).unwrap(), &storage.to_string()])
        .output()
        .unwrap();
    assert!(out.status.success(), "python: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

fn force() -> RunOptions {
    RunOptions { force: true, ..Default::default() }
}

#[test]
fn an_independent_reader_sees_the_rows_one_commit_per_run_and_the_transaction_versions() {
    let Some(py) = python() else { return };
    let folder = Folder::new("oracle");
    let mut db = folder.open();
    exec(&mut db, BRONZE);
    let job = job(SILVER_JOB);
    let first = job.load(d("2026-10-20"), &mut db).unwrap();
    assert_eq!((first.outcome.as_str(), first.rows_inserted), ("committed", 4));
    let retry = job.load(d("2026-10-20"), &mut db).unwrap();
    assert_eq!(retry.outcome, "skipped");
    let forced = job.load_with(d("2026-10-20"), &mut db, &force()).unwrap();
    assert_eq!(forced.outcome, "committed");
    let other_day = job.load(d("2026-10-19"), &mut db).unwrap();
    assert_eq!(other_day.rows_inserted, 2);
    // A process that opens the warehouse afresh sees the same.
    drop(db);
    let mut db = folder.open();
    let again = job.load(d("2026-10-20"), &mut db).unwrap();
    assert_eq!(again.outcome, "skipped", "the ledger written to the warehouse is read by the next process");

    let read = read_with_python(
        &py,
        &folder.0.join("silver/orders"),
        &["order_id", "order_total", "updated_at", "dt"],
        &["fixpoint:silver_orders:2026-10-20", "fixpoint:silver_orders:2026-10-19", "fixpoint:silver_orders:2026-10-21"],
    );
    let rows: Vec<Vec<String>> = serde_json::from_value(read["rows"].clone()).unwrap();
    assert_eq!(
        rows,
        vec![
            vec!["1", "12.50", "2026-10-19 08:00:00+00:00", "2026-10-19"],
            vec!["2", "99.00", "2026-10-19 09:30:00+00:00", "2026-10-19"],
            vec!["3", "5.25", "2026-10-20 07:00:00+00:00", "2026-10-20"],
            vec!["4", "45.00", "2026-10-20 11:00:00+00:00", "2026-10-20"],
            vec!["5", "7.00", "2026-10-20 12:00:00+00:00", "2026-10-20"],
            vec!["6", "18.40", "2026-10-21 02:14:00+00:00", "2026-10-20"],
        ]
    );
    // History, newest first: one commit per committed run (the 19th, the
    // forced rerun, the first run, which also created the table); no
    // commit for the two skipped runs, none of its own for the creation.
    let commits = read["commits"].as_array().unwrap();
    let keys: Vec<Option<&str>> = commits.iter().map(|c| c["run_key"].as_str()).collect();
    assert_eq!(keys, vec![Some(other_day.run_key.as_str()), Some(first.run_key.as_str()), Some(first.run_key.as_str())], "{commits:?}");
    let operations: Vec<&str> = commits.iter().map(|c| c["operation"].as_str().unwrap_or_default()).collect();
    assert_eq!(operations, vec!["WRITE", "WRITE", "CREATE TABLE"], "{commits:?}");
    assert_eq!(read["txn"]["fixpoint:silver_orders:2026-10-20"], 2, "two committed runs of the 20th");
    assert_eq!(read["txn"]["fixpoint:silver_orders:2026-10-19"], 1);
    assert!(read["txn"]["fixpoint:silver_orders:2026-10-21"].is_null());
    // The ledger agrees: one row per committed run.
    let entries = ledger::entries(&mut db, Some("silver_orders"), None, None).unwrap();
    assert_eq!(entries.len(), 3);
    // And DuckDB reading the Parquet files itself, without fixpoint's
    // views, counts the same rows.
    let ledger_rows = read_with_python(&py, &folder.0.join("fixpoint/runs"), &["run_key"], &[]);
    assert_eq!(ledger_rows["rows"].as_array().unwrap().len(), 3);
}

#[test]
fn a_lost_commit_acknowledgement_is_a_no_op_when_retried() {
    let Some(py) = python() else { return };
    let folder = Folder::new("lost-ack");
    let mut db = folder.open();
    exec(&mut db, BRONZE);
    let job = job(SILVER_JOB);
    job.load(d("2026-10-19"), &mut db).unwrap();
    drop(db);
    // The run's commit lands and its answer is lost: the run's own retry
    // (a transient error is retried) finds the commit and does nothing.
    let mut lossy = folder.open().with_fault(Some(DeltaFault::LoseCommitAck));
    let retried = job.load(d("2026-10-20"), &mut lossy).unwrap();
    assert_eq!(retried.outcome, "skipped", "the retry found its commit");
    drop(lossy);
    // The retry: the commit is in the table's log; the ledger row it lacks
    // is written from the commit's info, and the run is skipped.
    let mut db = folder.open();
    let entries = ledger::entries(&mut db, Some("silver_orders"), Some(d("2026-10-20")), None).unwrap();
    assert_eq!(entries.len(), 1, "the lost ledger row is written from the commit");
    let retry = job.load(d("2026-10-20"), &mut db).unwrap();
    assert_eq!(retry.outcome, "skipped");
    assert_eq!(retry.run_key, entries[0].run_key);
    let read = read_with_python(&py, &folder.0.join("silver/orders"), &["order_id"], &["fixpoint:silver_orders:2026-10-20"]);
    let runs: Vec<&str> = read["commits"].as_array().unwrap().iter().map(|c| c["run_key"].as_str().unwrap_or("none")).collect();
    assert_eq!(runs.len(), 2, "one commit for the 19th (which created the table), one for the 20th: the retry committed nothing: {read}");
    assert!(!runs.contains(&"none"), "every commit is a run's: {read}");
    assert_eq!(read["txn"]["fixpoint:silver_orders:2026-10-20"], 1);
    assert_eq!(read["rows"].as_array().unwrap().len(), 6);
}

/// Waits until a run has written its files to `table` (more Parquet files
/// than `before`): it has read its snapshot and is on its way to commit.
fn wait_for_files(table: &Path, before: usize) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while parquet_files(table) <= before {
        assert!(std::time::Instant::now() < deadline, "the paused run never wrote its files");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// Runs `job` for `day` on its own warehouse connection, pausing at
/// `BeforeCommit` (after its snapshot is read and its files written) for
/// `pause_ms`.
fn paused_run(folder: &Path, toml: &'static str, day: &'static str, pause_ms: u64) -> std::thread::JoinHandle<fixpoint_core::Result<fixpoint_core::RunReport>> {
    let folder = folder.to_owned();
    paused_run_on(move || Delta::open(&folder).unwrap(), toml, day, pause_ms)
}

/// [`paused_run`] on the warehouse `open` opens.
fn paused_run_on(open: impl FnOnce() -> Delta + Send + 'static, toml: &'static str, day: &'static str, pause_ms: u64) -> std::thread::JoinHandle<fixpoint_core::Result<fixpoint_core::RunReport>> {
    std::thread::spawn(move || {
        let mut db = open();
        let opts = RunOptions { fault: Some((FailPoint::BeforeCommit, FaultAction::Pause(pause_ms))), force: true, ..Default::default() };
        job(toml).load_with(d(day), &mut db, &opts)
    })
}

#[test]
fn of_two_concurrent_writers_of_one_day_one_commits_and_the_other_finds_it() {
    let folder = Folder::new("concurrent");
    let mut db = folder.open();
    exec(&mut db, BRONZE);
    job(SILVER_JOB).load(d("2026-10-19"), &mut db).unwrap();
    drop(db);
    // Same input: the second to commit finds the first's identical commit.
    let table = folder.0.join("silver/orders");
    let before = parquet_files(&table);
    let slow = paused_run(&folder.0, SILVER_JOB, "2026-10-20", 6000);
    wait_for_files(&table, before);
    let fast = paused_run(&folder.0, SILVER_JOB, "2026-10-20", 0).join().unwrap().unwrap();
    assert_eq!(fast.outcome, "committed");
    let slow = slow.join().unwrap();
    let slow = slow.unwrap_or_else(|e| panic!("the slower identical run should find the first's commit: {e}"));
    assert_eq!(slow.run_key, fast.run_key);
    let mut db = folder.open();
    let entries = ledger::entries(&mut db, Some("silver_orders"), Some(d("2026-10-20")), None).unwrap();
    assert_eq!(entries.len(), 1, "one commit, one ledger row");
    assert_eq!(count(&mut db, "SELECT count(*) FROM silver.orders WHERE dt = DATE '2026-10-20'"), 4);

    // Different input: the second to commit stops with nothing written.
    change_order_3(&mut db);
    drop(db);
    let before = parquet_files(&table);
    let slow = paused_run(&folder.0, SILVER_JOB, "2026-10-20", 6000);
    wait_for_files(&table, before);
    {
        let mut db = folder.open();
        exec(&mut db, "INSERT INTO bronze.orders VALUES (8, 16, 1.00, 'EUR', TIMESTAMP '2026-10-20 13:00:00', DATE '2026-10-20')");
        let fast = job(SILVER_JOB).load(d("2026-10-20"), &mut db).unwrap();
        assert_eq!((fast.outcome.as_str(), fast.rows_inserted), ("committed", 5));
    }
    let err = slow.join().unwrap().unwrap_err();
    assert!(matches!(err, Error::Busy { .. }), "{err}");
    assert!(err.to_string().contains("nothing of this run was committed"), "{err}");
    let mut db = folder.open();
    assert_eq!(count(&mut db, "SELECT count(*) FROM silver.orders WHERE dt = DATE '2026-10-20'"), 5, "the winner's day");
    assert_eq!(ledger::entries(&mut db, Some("silver_orders"), Some(d("2026-10-20")), None).unwrap().len(), 2);
    // No file of the loser is left in the table's folder: every Parquet
    // file there was added by a commit.
    assert_eq!(orphans(&folder.0.join("silver/orders")), Vec::<String>::new());
}

/// The Parquet files in a table's folder that no commit of its log added.
fn orphans(table: &Path) -> Vec<String> {
    let mut added = std::collections::BTreeSet::new();
    for log in std::fs::read_dir(table.join("_delta_log")).unwrap().flatten() {
        if log.path().extension().is_some_and(|x| x == "json") {
            for line in std::fs::read_to_string(log.path()).unwrap().lines() {
                let a: serde_json::Value = serde_json::from_str(line).unwrap();
                if let Some(p) = a["add"]["path"].as_str() {
                    added.insert(p.to_owned());
                }
            }
        }
    }
    let mut out = Vec::new();
    let mut stack = vec![table.to_owned()];
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(&dir).unwrap().flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|x| x == "parquet") {
                let rel = p.strip_prefix(table).unwrap().to_string_lossy().into_owned();
                if !added.contains(&rel) {
                    out.push(rel);
                }
            }
        }
    }
    out
}

fn parquet_files(dir: &Path) -> usize {
    let mut n = 0;
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        if p.is_dir() && !p.ends_with("_delta_log") {
            n += parquet_files(&p);
        } else if p.extension().is_some_and(|x| x == "parquet") {
            n += 1;
        }
    }
    n
}

#[test]
fn a_table_with_features_fixpoint_cannot_honour_is_refused_by_name() {
    let folder = Folder::new("features");
    for (feature, protocol, config) in [
        ("deletionVectors", r#"{"minReaderVersion":3,"minWriterVersion":7,"readerFeatures":["deletionVectors"],"writerFeatures":["deletionVectors"]}"#, "{}"),
        ("columnMapping", r#"{"minReaderVersion":2,"minWriterVersion":5}"#, r#"{"delta.columnMapping.mode":"name","delta.columnMapping.maxColumnId":"2"}"#),
        ("delta.appendOnly", r#"{"minReaderVersion":1,"minWriterVersion":2}"#, r#"{"delta.appendOnly":"true"}"#),
    ] {
        let dir = folder.0.join("silver/orders");
        let _ = std::fs::remove_dir_all(&folder.0);
        std::fs::create_dir_all(dir.join("_delta_log")).unwrap();
        let schema = if feature == "columnMapping" {
            r#"{"type":"struct","fields":[{"name":"order_id","type":"long","nullable":true,"metadata":{"delta.columnMapping.id":1,"delta.columnMapping.physicalName":"col-a1"}},{"name":"dt","type":"date","nullable":true,"metadata":{"delta.columnMapping.id":2,"delta.columnMapping.physicalName":"col-a2"}}]}"#
        } else {
            r#"{"type":"struct","fields":[{"name":"order_id","type":"long","nullable":true,"metadata":{}},{"name":"dt","type":"date","nullable":true,"metadata":{}}]}"#
        };
        let log = format!(
            "{{\"protocol\":{protocol}}}\n{{\"metaData\":{{\"id\":\"5f1c\",\"format\":{{\"provider\":\"parquet\",\"options\":{{}}}},\"schemaString\":{},\"partitionColumns\":[\"dt\"],\"configuration\":{config},\"createdTime\":1}}}}\n",
            serde_json::to_string(schema).unwrap()
        );
        std::fs::write(dir.join("_delta_log/00000000000000000000.json"), log).unwrap();
        let err = match Delta::open(&folder.0) {
            Err(e) => e,
            Ok(_) => panic!("{feature}: opened"),
        };
        let text = err.to_string();
        assert!(text.contains("silver.orders") && text.contains("cannot honour"), "{feature}: {text}");
        assert!(text.contains(feature) || (feature == "columnMapping" && text.contains("columnMapping")), "{feature}: {text}");
        assert!(err.hint().is_some(), "{feature}");
    }
}

#[test]
fn the_rows_of_a_delta_table_fingerprint_as_on_duckdb_and_diff_finds_nothing() {
    use fixpoint_core::engine::measure::{fingerprint, Scope};
    use fixpoint_core::tools::diff::{diff, DiffOptions, Sides};
    use fixpoint_core::{Method, TableName};
    let folder = Folder::new("portable");
    let mut delta = folder.open();
    let mut duck = DuckDbUnderTest.fresh();
    let fixture = "CREATE SCHEMA s;
CREATE TABLE s.t (id BIGINT, small SMALLINT, amount DECIMAL(12,2), ratio DOUBLE, name VARCHAR, day DATE, ts TIMESTAMP, flag BOOLEAN, raw BLOB);
INSERT INTO s.t VALUES
 (1, 7, 12.50, 0.1, 'plain', DATE '2026-10-20', TIMESTAMP '2026-10-20 08:00:00', true, from_hex('00ff10')),
 (2, -3, -0.05, 1.0, '', DATE '1999-12-31', TIMESTAMP '2026-10-20 08:00:00.123456', false, from_hex('')),
 (3, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL),
 (4, 0, 99999.99, 1e20, 'ünïcödé ✓ ''quoted'' a,b', DATE '2026-02-28', TIMESTAMP '1970-01-01 00:00:00', true, from_hex('deadbeef'))";
    exec(&mut delta, fixture);
    exec(duck.as_mut(), fixture);
    let t = TableName::parse("s.t").unwrap();
    let portable = |db: &mut dyn Engine| {
        let cols = db.table_columns(&t).unwrap().unwrap();
        fingerprint(db, Method::Portable, &Scope::Table { table: &t, filter: None }, &cols).unwrap()
    };
    assert_eq!(portable(&mut delta), portable(duck.as_mut()));
    assert_eq!(portable(&mut delta).rows, 4);
    let key = DiffOptions { key: vec!["id".into()], ..Default::default() };
    assert!(diff(&mut Sides::Two(&mut delta, duck.as_mut()), &t, &t, &key).unwrap().identical);
    // A change on one side is seen, and the same change on the other
    // makes them equal again (UPDATE and DELETE are commits on Delta).
    let mut last = portable(&mut delta);
    for change in ["UPDATE s.t SET name = 'plain ' WHERE id = 1", "UPDATE s.t SET ts = TIMESTAMP '2026-10-20 08:00:00.123457', amount = 1.25 WHERE id = 2", "DELETE FROM s.t WHERE id = 3"] {
        exec(&mut delta, change);
        let d = diff(&mut Sides::Two(&mut delta, duck.as_mut()), &t, &t, &key).unwrap();
        assert!(!d.identical, "{change}");
        assert_eq!(d.changed + d.only_in_a + d.only_in_b, 1, "{change}: {d:?}");
        exec(duck.as_mut(), change);
        let now = portable(&mut delta);
        assert_ne!(now, last, "{change}");
        assert_eq!(now, portable(duck.as_mut()), "{change}");
        last = now;
    }
    drop(delta);
    // Read again by a new process: the same.
    let mut delta = folder.open();
    assert_eq!(portable(&mut delta), portable(duck.as_mut()));
}

#[test]
fn a_failed_run_leaves_no_file_and_no_commit() {
    let folder = Folder::new("failed");
    let mut db = folder.open();
    exec(&mut db, BRONZE);
    let job = job(SILVER_JOB);
    job.load(d("2026-10-20"), &mut db).unwrap();
    let files = parquet_files(&folder.0.join("silver/orders"));
    let version = std::fs::read_dir(folder.0.join("silver/orders/_delta_log")).unwrap().count();
    change_order_3(&mut db);
    for point in FailPoint::ALL {
        let opts = RunOptions { fault: Some((point, FaultAction::Error)), ..Default::default() };
        let err = job.load_with(d("2026-10-20"), &mut db, &opts).unwrap_err();
        assert!(matches!(err, Error::Injected(_)), "{point}: {err}");
        assert_eq!(parquet_files(&folder.0.join("silver/orders")), files, "{point}: no file left behind");
        assert_eq!(orphans(&folder.0.join("silver/orders")), Vec::<String>::new(), "{point}");
        assert_eq!(std::fs::read_dir(folder.0.join("silver/orders/_delta_log")).unwrap().count(), version, "{point}: no commit");
        assert_eq!(count(&mut db, "SELECT count(*) FROM silver.orders WHERE order_id = 3 AND order_total = 5.25"), 1, "{point}: the old day");
    }
    let ok = job.load(d("2026-10-20"), &mut db).unwrap();
    assert_eq!(ok.outcome, "committed");
    assert_eq!(count(&mut db, "SELECT count(*) FROM silver.orders WHERE order_id = 3 AND order_total = 6.00"), 1);
}

fn names(read: &serde_json::Value) -> Vec<String> {
    serde_json::from_value(read["files"].clone()).unwrap()
}

/// An unpartitioned table: a run rewrites only the files holding rows it
/// replaces (the day's rows; a merge's touched keys), in one commit; the
/// other files stay in the table as they were.
#[test]
fn an_unpartitioned_table_rewrites_only_the_files_holding_the_rows_it_replaces() {
    let Some(py) = python() else { return };
    let folder = Folder::new("unpartitioned");
    let mut db = folder.open();
    exec(&mut db, BRONZE);
    exec(&mut db, "CREATE SCHEMA silver;\nCREATE TABLE silver.orders (order_id BIGINT, customer_id BIGINT, order_total DECIMAL(12,2), currency VARCHAR, updated_at TIMESTAMP, dt DATE, load_id VARCHAR)");
    let job = job(SILVER_JOB);
    for day in ["2026-10-19", "2026-10-20", "2026-10-21"] {
        job.load(d(day), &mut db).unwrap();
    }
    let table = folder.0.join("silver/orders");
    let before = read_with_python(&py, &table, &["order_id", "dt"], &[]);
    assert_eq!(before["partitioned_by"], serde_json::json!([]));
    assert_eq!(names(&before).len(), 3, "one file per run: {before}");
    let forced = job.load_with(d("2026-10-20"), &mut db, &force()).unwrap();
    assert_eq!((forced.rows_deleted, forced.rows_inserted), (4, 4));
    let after = read_with_python(&py, &table, &["order_id", "dt"], &["fixpoint:silver_orders:2026-10-20"]);
    assert_eq!(after["rows"], before["rows"], "the same rows");
    assert_eq!(after["version"].as_i64().unwrap(), before["version"].as_i64().unwrap() + 1, "one commit");
    assert_eq!(after["txn"]["fixpoint:silver_orders:2026-10-20"], 2);
    let (old, new) = (names(&before), names(&after));
    let kept: Vec<&String> = new.iter().filter(|f| old.contains(f)).collect();
    assert_eq!((new.len(), kept.len()), (3, 2), "the 19th's and the 21st's files stay, the 20th's is rewritten: {old:?} -> {new:?}");

    // A merge: a batch of new keys adds a file and rewrites none; a batch
    // touching one of them rewrites that file only.
    exec(&mut db, "CREATE SCHEMA staging;\nCREATE TABLE staging.changes (batch DATE, k BIGINT, v BIGINT, amount BIGINT);\nINSERT INTO staging.changes VALUES (DATE '2026-10-19', 1, 1, 10), (DATE '2026-10-19', 2, 1, 20), (DATE '2026-10-20', 3, 1, 30), (DATE '2026-10-21', 3, 2, 31)");
    let merge = fixpoint_scenarios::job("name = \"m\"\ntarget = \"silver.m\"\nstrategy = \"merge\"\nkey = [\"k\"]\nversion = \"v\"\n[source]\nsql = \"SELECT k, v, amount FROM staging.changes WHERE batch = :run_date\"\n");
    let m = folder.0.join("silver/m");
    merge.load(d("2026-10-19"), &mut db).unwrap();
    let one = names(&read_with_python(&py, &m, &["k"], &[]));
    merge.load(d("2026-10-20"), &mut db).unwrap();
    let two = names(&read_with_python(&py, &m, &["k"], &[]));
    assert!(two.len() == 2 && one.iter().all(|f| two.contains(f)), "a new key adds a file: {one:?} -> {two:?}");
    merge.load(d("2026-10-21"), &mut db).unwrap();
    let read = read_with_python(&py, &m, &["k", "v", "amount"], &[]);
    let three = names(&read);
    assert!(three.len() == 2 && one.iter().all(|f| three.contains(f)) && three.iter().filter(|f| two.contains(f)).count() == 1, "only the file holding key 3 is rewritten: {two:?} -> {three:?}");
    assert_eq!(read["rows"], serde_json::json!([["1", "1", "10"], ["2", "1", "20"], ["3", "2", "31"]]));
}

/// The same promises on S3 (the local S3-compatible server): an independent
/// reader sees one commit per real run and the transaction versions, a
/// lost acknowledgement is a no-op when retried, and of two concurrent
/// writers one commits (conditional writes) and the other finds it or
/// stops.
mod s3 {
    use super::*;

    fn server() -> Option<(DeltaS3UnderTest, PathBuf)> {
        let s3 = DeltaS3UnderTest::get()?;
        let py = python()?;
        Some((s3, py))
    }

    fn storage(s3: &DeltaS3UnderTest) -> serde_json::Value {
        serde_json::json!({"AWS_ENDPOINT_URL": s3.endpoint, "AWS_ALLOW_HTTP": "true", "AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test", "AWS_REGION": "us-east-1"})
    }

    /// A warehouse URL removed (objects and cache) at the end of the test.
    struct Warehouse(String, Vec<(String, String)>);

    impl Warehouse {
        fn open(&self) -> Delta {
            Delta::open_s3(&self.0, &self.1).unwrap_or_else(|e| panic!("{e}"))
        }
    }

    impl Drop for Warehouse {
        fn drop(&mut self) {
            drop(Delta::scratch_s3(&self.0, &self.1));
        }
    }

    #[test]
    fn an_independent_reader_sees_one_commit_per_run_on_s3() {
        let Some((s3, py)) = server() else { return };
        let wh = Warehouse(s3.fresh_url(), s3.options());
        let mut db = wh.open();
        exec(&mut db, BRONZE);
        let job = job(SILVER_JOB);
        let first = job.load(d("2026-10-20"), &mut db).unwrap();
        assert_eq!((first.outcome.as_str(), first.rows_inserted), ("committed", 4));
        assert_eq!(job.load(d("2026-10-20"), &mut db).unwrap().outcome, "skipped");
        let forced = job.load_with(d("2026-10-20"), &mut db, &force()).unwrap();
        assert_eq!(forced.outcome, "committed");
        job.load(d("2026-10-19"), &mut db).unwrap();
        drop(db);
        // Another process, with an empty cache, reads the same warehouse.
        let _ = std::fs::remove_dir_all(wh.open().root());
        let mut db = wh.open();
        assert_eq!(job.load(d("2026-10-20"), &mut db).unwrap().outcome, "skipped");
        assert_eq!(count(&mut db, "SELECT count(*) FROM silver.orders"), 6);
        let read = read_url_with_python(&py, &format!("{}/silver/orders", wh.0), &storage(&s3), &["order_id", "order_total", "dt"], &["fixpoint:silver_orders:2026-10-20", "fixpoint:silver_orders:2026-10-19"]);
        let rows: Vec<Vec<String>> = serde_json::from_value(read["rows"].clone()).unwrap();
        assert_eq!(
            rows,
            vec![
                vec!["1", "12.50", "2026-10-19"],
                vec!["2", "99.00", "2026-10-19"],
                vec!["3", "5.25", "2026-10-20"],
                vec!["4", "45.00", "2026-10-20"],
                vec!["5", "7.00", "2026-10-20"],
                vec!["6", "18.40", "2026-10-20"],
            ]
        );
        let commits = read["commits"].as_array().unwrap();
        assert_eq!(commits.len(), 3, "one commit per committed run, the first creating the table: {commits:?}");
        assert!(commits.iter().all(|c| c["run_key"].is_string()), "{commits:?}");
        assert_eq!(read["txn"]["fixpoint:silver_orders:2026-10-20"], 2);
        assert_eq!(read["txn"]["fixpoint:silver_orders:2026-10-19"], 1);
        assert_eq!(ledger::entries(&mut db, Some("silver_orders"), None, None).unwrap().len(), 3);
    }

    #[test]
    fn a_lost_commit_acknowledgement_is_a_no_op_on_s3() {
        let Some((s3, py)) = server() else { return };
        let wh = Warehouse(s3.fresh_url(), s3.options());
        let mut db = wh.open();
        exec(&mut db, BRONZE);
        let job = job(SILVER_JOB);
        job.load(d("2026-10-19"), &mut db).unwrap();
        drop(db);
        let mut lossy = wh.open().with_fault(Some(DeltaFault::LoseCommitAck));
        assert_eq!(job.load(d("2026-10-20"), &mut lossy).unwrap().outcome, "skipped", "the retry found its commit");
        drop(lossy);
        let mut db = wh.open();
        assert_eq!(ledger::entries(&mut db, Some("silver_orders"), Some(d("2026-10-20")), None).unwrap().len(), 1);
        assert_eq!(job.load(d("2026-10-20"), &mut db).unwrap().outcome, "skipped");
        let read = read_url_with_python(&py, &format!("{}/silver/orders", wh.0), &storage(&s3), &["order_id"], &["fixpoint:silver_orders:2026-10-20"]);
        assert_eq!(read["commits"].as_array().unwrap().len(), 2, "{read}");
        assert!(read["commits"].as_array().unwrap().iter().all(|c| c["run_key"].is_string()), "{read}");
        assert_eq!(read["txn"]["fixpoint:silver_orders:2026-10-20"], 1);
        assert_eq!(read["rows"].as_array().unwrap().len(), 6);
    }

    #[test]
    fn of_two_concurrent_writers_on_s3_one_commits() {
        let Some((s3, py)) = server() else { return };
        let wh = Warehouse(s3.fresh_url(), s3.options());
        let mut db = wh.open();
        exec(&mut db, BRONZE);
        job(SILVER_JOB).load(d("2026-10-19"), &mut db).unwrap();
        let cache = db.table_dir(&fixpoint_core::TableName::parse("silver.orders").unwrap());
        drop(db);
        let opener = |url: String, options: Vec<(String, String)>| move || Delta::open_s3(&url, &options).unwrap();
        // Same input: the second to commit finds the first's identical commit.
        let before = parquet_files(&cache);
        let slow = paused_run_on(opener(wh.0.clone(), wh.1.clone()), SILVER_JOB, "2026-10-20", 6000);
        wait_for_files(&cache, before);
        let fast = paused_run_on(opener(wh.0.clone(), wh.1.clone()), SILVER_JOB, "2026-10-20", 0).join().unwrap().unwrap();
        assert_eq!(fast.outcome, "committed");
        let slow = slow.join().unwrap().unwrap_or_else(|e| panic!("the slower identical run should find the first's commit: {e}"));
        assert_eq!(slow.run_key, fast.run_key);
        // Different input: the second to commit stops with nothing written.
        let mut db = wh.open();
        change_order_3(&mut db);
        drop(db);
        let before = parquet_files(&cache);
        let slow = paused_run_on(opener(wh.0.clone(), wh.1.clone()), SILVER_JOB, "2026-10-20", 6000);
        wait_for_files(&cache, before);
        {
            let mut db = wh.open();
            exec(&mut db, "INSERT INTO bronze.orders VALUES (8, 16, 1.00, 'EUR', TIMESTAMP '2026-10-20 13:00:00', DATE '2026-10-20')");
            let fast = job(SILVER_JOB).load(d("2026-10-20"), &mut db).unwrap();
            assert_eq!((fast.outcome.as_str(), fast.rows_inserted), ("committed", 5));
        }
        let err = slow.join().unwrap().unwrap_err();
        assert!(matches!(err, Error::Busy { .. }), "{err}");
        let mut db = wh.open();
        assert_eq!(count(&mut db, "SELECT count(*) FROM silver.orders WHERE dt = DATE '2026-10-20'"), 5, "the winner's day");
        assert_eq!(ledger::entries(&mut db, Some("silver_orders"), Some(d("2026-10-20")), None).unwrap().len(), 2, "one row per commit");
        let read = read_url_with_python(&py, &format!("{}/silver/orders", wh.0), &storage(&s3), &["order_id"], &["fixpoint:silver_orders:2026-10-20"]);
        assert_eq!(read["txn"]["fixpoint:silver_orders:2026-10-20"], 2, "two commits of the 20th: {read}");
        assert_eq!(read["rows"].as_array().unwrap().len(), 7);
    }
}

/// A failed first run leaves no table: the target is created by the run's
/// commit, with its first rows.
#[test]
fn a_failed_first_run_leaves_no_table() {
    let folder = Folder::new("failed-first");
    let mut db = folder.open();
    exec(&mut db, BRONZE);
    let job = job(SILVER_JOB);
    for point in FailPoint::ALL {
        let opts = RunOptions { fault: Some((point, FaultAction::Error)), ..Default::default() };
        let err = job.load_with(d("2026-10-20"), &mut db, &opts).unwrap_err();
        assert!(matches!(err, Error::Injected(_)), "{point}: {err}");
        assert!(!folder.0.join("silver/orders/_delta_log").exists(), "{point}: no table");
        assert!(db.table_columns(&fixpoint_core::TableName::parse("silver.orders").unwrap()).unwrap().is_none(), "{point}");
    }
    let ok = job.load(d("2026-10-20"), &mut db).unwrap();
    assert_eq!((ok.outcome.as_str(), ok.created_target), ("committed", true));
    let log: Vec<_> = std::fs::read_dir(folder.0.join("silver/orders/_delta_log")).unwrap().flatten().filter(|e| e.path().extension().is_some_and(|x| x == "json")).collect();
    assert_eq!(log.len(), 1, "one commit: the table and its first rows");
}

const CUSTOMERS: &str = "CREATE SCHEMA bronze;
CREATE TABLE bronze.customers (batch DATE, k BIGINT, v BIGINT, city VARCHAR, op VARCHAR);
INSERT INTO bronze.customers VALUES (DATE '2026-10-01', 1, 1, 'Paris', 'U'), (DATE '2026-10-01', 2, 1, 'Rome', 'U'),
 (DATE '2026-10-02', 1, 2, 'Lyon', 'U'), (DATE '2026-10-02', 2, 2, 'Rome', 'U'),
 (DATE '2026-10-03', 2, 3, NULL, 'D'),
 (DATE '2026-10-04', 1, 0, 'Nice', 'U')";

const DIM_JOB: &str = r#"
name = "dim"
target = "silver.dim"
strategy = "history"
key = ["k"]
version = "v"
deleted = "op = 'D'"
track = ["city"]

[source]
sql = "SELECT k, v, city, op FROM bronze.customers WHERE batch = :run_date"
"#;

const DIM_DAYS: [&str; 4] = ["2026-10-01", "2026-10-02", "2026-10-03", "2026-10-04"];

/// The history after the four days, as the Python package prints it: (k,
/// city, valid_from, valid_to). The Tuesday re-send of 2 changed nothing
/// tracked, and 2's tombstone ends its row: both are kept in the log.
fn dim_expected() -> Vec<Vec<String>> {
    let r = |k: &str, city: &str, from: &str, to: &str| vec![k.to_owned(), city.to_owned(), from.to_owned(), to.to_owned()];
    vec![r("1", "Lyon", "2", "None"), r("1", "Nice", "0", "1"), r("1", "Paris", "1", "2"), r("2", "Rome", "1", "3")]
}

fn dim_log_expected() -> Vec<Vec<String>> {
    vec![vec!["2".into(), "2".into(), "Rome".into(), "False".into()], vec!["2".into(), "3".into(), "None".into(), "True".into()]]
}

/// What the Python package reads of the history and its log: the rows,
/// the target's commits (one per committed run, the first creating the
/// table), each day's transaction version in the target and in the log.
fn check_dim(py: &Path, root: &Path, runs: &[String]) {
    let apps: Vec<String> = DIM_DAYS.iter().map(|d| format!("fixpoint:dim:{d}")).collect();
    let apps: Vec<&str> = apps.iter().map(String::as_str).collect();
    let target = read_with_python(py, &root.join("silver/dim"), &["k", "city", "valid_from", "valid_to"], &apps);
    let rows: Vec<Vec<String>> = serde_json::from_value(target["rows"].clone()).unwrap();
    assert_eq!(rows, dim_expected(), "{target}");
    let keys: Vec<&str> = target["commits"].as_array().unwrap().iter().map(|c| c["run_key"].as_str().unwrap_or("none")).collect();
    let mut newest_first: Vec<&str> = runs.iter().map(String::as_str).collect();
    newest_first.reverse();
    assert_eq!(keys, newest_first, "one commit per committed run: {target}");
    assert_eq!(target["commits"].as_array().unwrap().last().unwrap()["operation"], "CREATE TABLE", "{target}");
    for a in &apps {
        assert_eq!(target["txn"][a], 1, "{a}: {target}");
    }
    let log = read_with_python(py, &root.join("fixpoint/history__silver__dim"), &["k", "v", "city", "__fixpoint_deleted"], &apps);
    let rows: Vec<Vec<String>> = serde_json::from_value(log["rows"].clone()).unwrap();
    assert_eq!(rows, dim_log_expected(), "{log}");
    // The log changed on the first three days (created; the re-send; the tombstone).
    let txn: Vec<serde_json::Value> = apps.iter().map(|a| log["txn"][a].clone()).collect();
    assert_eq!(txn, vec![serde_json::json!(1), serde_json::json!(1), serde_json::json!(1), serde_json::Value::Null], "{log}");
}

/// A history on Delta: one commit of the table per committed run (the
/// first creates it), its log committed right after with the same app id,
/// read back by the Python package; a replay commits nothing.
#[test]
fn a_history_is_one_commit_per_run_read_back_by_an_independent_reader() {
    let Some(py) = python() else { return };
    let folder = Folder::new("history");
    let mut db = folder.open();
    exec(&mut db, CUSTOMERS);
    let job = job(DIM_JOB);
    let mut runs = Vec::new();
    for day in DIM_DAYS {
        let r = job.load(d(day), &mut db).unwrap();
        assert_eq!(r.outcome, "committed", "{day}");
        runs.push(r.run_key);
    }
    // A replay is skipped (its keys' rows as it left them) or changes
    // nothing (a later day changed them): no commit either way.
    let mut recorded = 4;
    for day in DIM_DAYS {
        let r = job.load(d(day), &mut db).unwrap();
        assert!(r.outcome == "skipped" || (r.rows_inserted, r.rows_deleted, r.rows_updated) == (0, 0, 0), "{day}: {r:?}");
        recorded += usize::from(r.outcome == "committed");
    }
    assert_eq!(job.load(d(DIM_DAYS[3]), &mut db).unwrap().outcome, "skipped", "the last day's rows are as it left them");
    drop(db);
    check_dim(&py, &folder.0, &runs);
    let mut db = folder.open();
    assert_eq!(ledger::entries(&mut db, Some("dim"), None, None).unwrap().len(), recorded);
}

/// Every commit's acknowledgement lost, on the first run (which creates
/// the table and its log) and after: the table's commit lands, the log's
/// does not; the run's retry opens the table, finds the commit's record of
/// the log's changes, commits them, writes the ledger row and is skipped.
/// The result is the clean run's, with one commit per run.
#[test]
fn a_history_with_lost_acknowledgements_ends_as_a_clean_one() {
    let Some(py) = python() else { return };
    let folder = Folder::new("history-lost-ack");
    let mut db = folder.open();
    exec(&mut db, CUSTOMERS);
    drop(db);
    let job = job(DIM_JOB);
    let mut lossy = folder.open().with_fault(Some(DeltaFault::LoseCommitAck));
    let mut runs = Vec::new();
    for day in DIM_DAYS {
        let r = job.load(d(day), &mut lossy).unwrap();
        assert_eq!(r.outcome, "skipped", "{day}: the retry finds the commit");
        runs.push(r.run_key);
    }
    drop(lossy);
    check_dim(&py, &folder.0, &runs);
    let mut db = folder.open();
    assert_eq!(ledger::entries(&mut db, Some("dim"), None, None).unwrap().len(), 4);
}
