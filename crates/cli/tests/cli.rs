//! The `fixpoint` binary as an orchestrator sees it: exit codes, stdout
//! (data) and stderr (messages).

use std::path::Path;
use std::process::{Command, Stdio};

struct Out {
    code: i32,
    stdout: String,
    stderr: String,
}

fn fixpoint(dir: &Path, args: &[&str]) -> Out {
    let o = Command::new(env!("CARGO_BIN_EXE_fixpoint"))
        .args(args)
        .current_dir(dir)
        .env_remove("FIXPOINT_DB")
        .env_remove("FIXPOINT_FAIL_AT")
        .env_remove("FIXPOINT_TEST_MODE")
        .output()
        .expect("runs");
    Out {
        code: o.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&o.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
    }
}

const JOB: &str = r#"name = "silver_orders"
target = "silver.orders"
strategy = "replace_partition"
partition = "dt"
min_rows = 1

[source]
sql = "SELECT order_id, order_total, dt FROM bronze.orders WHERE dt = :run_date AND note <> 'it''s'"
"#;

fn setup(dir: &Path) {
    std::fs::write(dir.join("job.toml"), JOB).unwrap();
    let db = duckdb::Connection::open(dir.join("w.duckdb")).unwrap();
    db.execute_batch(
        "CREATE SCHEMA bronze;
         CREATE TABLE bronze.orders (order_id BIGINT, order_total DECIMAL(12,2), note VARCHAR, dt DATE);
         INSERT INTO bronze.orders VALUES (1, 1.50, 'a', DATE '2026-10-19'), (2, 2.50, 'b', DATE '2026-10-20'),
                                          (3, 3.50, 'c', DATE '2026-10-20'), (4, 9.99, 'it''s', DATE '2026-10-20');",
    )
    .unwrap();
}

fn normalize(dir: &Path, s: &str) -> String {
    s.replace(&dir.display().to_string(), "[DIR]")
}

#[test]
fn run_prints_the_report_as_json_and_exits_0() {
    let tmp = tempfile::tempdir().unwrap();
    setup(tmp.path());
    let out = fixpoint(tmp.path(), &["run", "job.toml", "--date", "2026-10-20", "--db", "duckdb:w.duckdb", "--output", "json"]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    let v: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(v["run_date"], "2026-10-20");
    assert_eq!(v["rows_deleted"], 0);
    assert_eq!(v["rows_inserted"], 2, "the row with a quote in its note is filtered by the literal");
    assert_eq!(v["output"]["rows"], 2);
    assert_eq!(v["run_key"].as_str().unwrap().len(), 32);
    assert_eq!(v["output"]["checksum"].as_str().unwrap().len(), 32);
    assert_eq!(v["input"]["rows"], 2);
    assert!(v["skip_reason"].is_null() && v["method_note"].is_null(), "present, null when none: {v}");
    assert!(v.get("input_files").is_none() && v.get("window").is_none(), "absent: a SQL source, no lookback: {v}");
    // The fingerprint command agrees with the run's output fingerprint.
    let fp = fixpoint(
        tmp.path(),
        &["fingerprint", "silver.orders", "--where", "dt = DATE '2026-10-20'", "--db", "duckdb:w.duckdb", "--output", "json"],
    );
    assert_eq!(fp.code, 0, "{}", fp.stderr);
    let f: serde_json::Value = serde_json::from_str(&fp.stdout).unwrap();
    assert_eq!(f["rows"], 2);
    assert_eq!(f["checksum"], v["output"]["checksum"]);
    // Again: same run key, skipped; text output says so.
    let again = fixpoint(tmp.path(), &["run", "job.toml", "--date", "2026-10-20", "--db", "duckdb:w.duckdb"]);
    assert_eq!(again.code, 0);
    assert!(again.stdout.contains("skipped"), "{}", again.stdout);
    assert!(again.stdout.contains(v["run_key"].as_str().unwrap()));
    assert!(again.stdout.contains(v["output"]["checksum"].as_str().unwrap()));
}

#[test]
fn fingerprint_env_db_and_exclude() {
    let tmp = tempfile::tempdir().unwrap();
    setup(tmp.path());
    let o = Command::new(env!("CARGO_BIN_EXE_fixpoint"))
        .args(["fingerprint", "bronze.orders", "--exclude", "note", "--output", "json"])
        .current_dir(tmp.path())
        .env("FIXPOINT_DB", "duckdb:w.duckdb")
        .output()
        .unwrap();
    assert!(o.status.success());
    let f: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(f["rows"], 4);
    let portable = fixpoint(tmp.path(), &["fingerprint", "bronze.orders", "--portable", "--db", "duckdb:w.duckdb", "--output", "json"]);
    let p: serde_json::Value = serde_json::from_str(&portable.stdout).unwrap();
    assert_eq!(p["kind"], "portable-v3");
    assert_ne!(p["checksum"], f["checksum"]);
    let bad = fixpoint(tmp.path(), &["fingerprint", "bronze.orders", "--exclude", "nope", "--db", "duckdb:w.duckdb"]);
    assert_eq!(bad.code, 2);
    assert!(bad.stderr.contains("--exclude nope: bronze.orders has no such column"), "{}", bad.stderr);
    let inj = fixpoint(tmp.path(), &["fingerprint", "bronze.orders", "--where", "1=1; DROP TABLE bronze.orders", "--db", "duckdb:w.duckdb"]);
    assert_eq!(inj.code, 2);
    assert!(inj.stderr.contains("--where: is not a single condition"), "{}", inj.stderr);
}

#[test]
fn input_errors_exit_2_with_a_hint() {
    let tmp = tempfile::tempdir().unwrap();
    setup(tmp.path());
    let cases: &[(&[&str], &str)] = &[
        (&["run", "job.toml", "--db", "duckdb:w.duckdb"], "no_date"),
        (&["run", "job.toml", "--date", "2026-10-20'; DROP TABLE silver.orders; --", "--db", "duckdb:w.duckdb"], "injection"),
        (&["run", "missing.toml", "--date", "2026-10-20", "--db", "duckdb:w.duckdb"], "missing_job"),
        (&["run", "job.toml", "--date", "2026-10-20", "--db", "mysql://u:secret@h/db"], "bad_url"),
    ];
    for (args, name) in cases {
        let out = fixpoint(tmp.path(), args);
        assert_eq!(out.code, 2, "{name}: {}", out.stderr);
        assert!(out.stdout.is_empty(), "{name}: nothing on stdout");
        assert!(!out.stderr.contains("secret"), "{name}: passwords are never printed");
        insta::assert_snapshot!(*name, normalize(tmp.path(), &out.stderr));
    }
    // An unreachable server: a runtime failure (exit 1), the password never shown.
    let pg = fixpoint(tmp.path(), &["run", "job.toml", "--date", "2026-10-20", "--db", "postgres://u:secret@127.0.0.1:1/db"]);
    assert_eq!(pg.code, 1, "{}", pg.stderr);
    assert!(pg.stderr.contains("postgres: connecting to postgres://u:***@127.0.0.1:1/db"), "{}", pg.stderr);
    assert!(!pg.stderr.contains("secret"));
    std::fs::write(tmp.path().join("bad.toml"), JOB.replace("min_rows = 1", "min_rows = \"one\"")).unwrap();
    let out = fixpoint(tmp.path(), &["run", "bad.toml", "--date", "2026-10-20", "--db", "duckdb:w.duckdb", "--output", "json"]);
    assert_eq!(out.code, 2);
    insta::assert_snapshot!("bad_job_file", normalize(tmp.path(), &out.stderr));
    let v: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(v["error"]["class"], "input");
    assert_eq!(v["error"]["exit_code"], 2);
}

#[test]
fn refused_data_exits_3_and_changes_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    setup(tmp.path());
    std::fs::write(tmp.path().join("wide.toml"), JOB.replace("WHERE dt = :run_date", "WHERE dt <= :run_date")).unwrap();
    let out = fixpoint(tmp.path(), &["run", "wide.toml", "--date", "2026-10-20", "--db", "duckdb:w.duckdb", "--output", "json"]);
    assert_eq!(out.code, 3, "{}", out.stderr);
    insta::assert_snapshot!("out_of_partition", out.stderr);
    let v: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(v["error"]["offending"], 1);
    assert_eq!(v["error"]["column"], "dt");
    assert_eq!(v["error"]["sample"], serde_json::json!({"order_id": 1, "order_total": "1.50", "dt": "2026-10-19"}));
    let db = duckdb::Connection::open(tmp.path().join("w.duckdb")).unwrap();
    let n: i64 = db.query_row("SELECT count(*) FROM duckdb_tables() WHERE schema_name = 'silver'", [], |r| r.get(0)).unwrap();
    assert_eq!(n, 0, "no target was created");
}

#[test]
fn a_locked_database_waits_then_exits_5() {
    let tmp = tempfile::tempdir().unwrap();
    setup(tmp.path());
    let holder = duckdb::Connection::open(tmp.path().join("w.duckdb")).unwrap();
    // A second process cannot open the file while this one holds it.
    let out = fixpoint(tmp.path(), &["run", "job.toml", "--date", "2026-10-20", "--db", "duckdb:w.duckdb", "--wait", "1"]);
    drop(holder);
    assert_eq!(out.code, 5, "{}", out.stderr);
    assert!(out.stderr.contains("is locked by another process"), "{}", out.stderr);
    assert!(out.stderr.contains("waited 1s"), "{}", out.stderr);
    let ok = fixpoint(tmp.path(), &["run", "job.toml", "--date", "2026-10-20", "--db", "duckdb:w.duckdb"]);
    assert_eq!(ok.code, 0, "{}", ok.stderr);
}

#[test]
fn a_killed_run_leaves_nothing_and_the_retry_converges() {
    let tmp = tempfile::tempdir().unwrap();
    setup(tmp.path());
    let first = fixpoint(tmp.path(), &["run", "job.toml", "--date", "2026-10-20", "--db", "duckdb:w.duckdb", "--output", "json"]);
    assert_eq!(first.code, 0);
    let clean: serde_json::Value = serde_json::from_str(&first.stdout).unwrap();
    for point in ["after_delete", "mid_insert", "before_commit"] {
        let o = Command::new(env!("CARGO_BIN_EXE_fixpoint"))
            .args(["run", "job.toml", "--date", "2026-10-20", "--db", "duckdb:w.duckdb", "--force"])
            .current_dir(tmp.path())
            .env("FIXPOINT_TEST_MODE", "1")
            .env("FIXPOINT_FAIL_AT", point)
            .env("FIXPOINT_FAIL_MODE", "abort")
            .output()
            .unwrap();
        assert!(!o.status.success() && o.status.code().is_none(), "{point}: killed by a signal");
        let fp = fixpoint(tmp.path(), &["fingerprint", "silver.orders", "--where", "dt = DATE '2026-10-20'", "--db", "duckdb:w.duckdb", "--output", "json"]);
        let f: serde_json::Value = serde_json::from_str(&fp.stdout).unwrap();
        assert_eq!((f["rows"].clone(), f["checksum"].clone()), (clean["output"]["rows"].clone(), clean["output"]["checksum"].clone()), "{point}");
    }
    let retry = fixpoint(tmp.path(), &["run", "job.toml", "--date", "2026-10-20", "--db", "duckdb:w.duckdb", "--output", "json"]);
    let r: serde_json::Value = serde_json::from_str(&retry.stdout).unwrap();
    assert_eq!(r["output"]["checksum"], clean["output"]["checksum"]);
    assert_eq!(r["outcome"], "skipped");
}

#[test]
fn demo_runs_and_checks_itself() {
    let tmp = tempfile::tempdir().unwrap();
    let out = fixpoint(tmp.path(), &["demo", "--rows", "5000", "--dir", "d"]);
    assert_eq!(out.code, 0, "{}\n{}", out.stdout, out.stderr);
    assert!(out.stdout.contains("Verdict: every rerun left the same row count and checksum; the diff is empty."), "{}", out.stdout);
    assert!(out.stdout.contains("orders of 2026-10-20 whose output changed: 1 (order 12)"), "{}", out.stdout);
    assert!(out.stdout.contains("partition 2026-10-21 now: 0 rows; ledger entries for it: 0"), "{}", out.stdout);
    assert!(tmp.path().join("d/silver_orders.toml").exists());
    let lint = fixpoint(tmp.path(), &["lint", "d/silver_orders.toml"]);
    assert_eq!((lint.code, lint.stdout.trim()), (0, "1 file(s): 0 error(s), 0 warning(s)"), "the demo job lints clean");
    assert!(tmp.path().join("d/demo.duckdb").exists());
}

fn day_fingerprints(dir: &Path) -> Vec<(i64, String)> {
    let mut out = Vec::new();
    for day in ["2026-10-19", "2026-10-20"] {
        let fp = fixpoint(dir, &["fingerprint", "silver.orders", "--where", &format!("dt = DATE '{day}'"), "--db", "duckdb:w.duckdb", "--output", "json"]);
        assert_eq!(fp.code, 0, "{}", fp.stderr);
        let f: serde_json::Value = serde_json::from_str(&fp.stdout).unwrap();
        out.push((f["rows"].as_i64().unwrap(), f["checksum"].as_str().unwrap().to_owned()));
    }
    out
}

#[test]
fn a_killed_backfill_resumes_to_the_uninterrupted_state() {
    let clean = tempfile::tempdir().unwrap();
    setup(clean.path());
    let out = fixpoint(clean.path(), &["backfill", "job.toml", "--from", "2026-10-19", "--to", "2026-10-20", "--db", "duckdb:w.duckdb", "--output", "json"]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    let v: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!((v["committed"].as_u64(), v["skipped"].as_u64(), v["failed"].as_u64()), (Some(2), Some(0), Some(0)));
    let expected = day_fingerprints(clean.path());

    let tmp = tempfile::tempdir().unwrap();
    setup(tmp.path());
    let killed = Command::new(env!("CARGO_BIN_EXE_fixpoint"))
        .args(["backfill", "job.toml", "--from", "2026-10-19", "--to", "2026-10-20", "--db", "duckdb:w.duckdb"])
        .current_dir(tmp.path())
        .env("FIXPOINT_TEST_MODE", "1")
        .env("FIXPOINT_FAIL_AT", "mid_insert@2026-10-20")
        .env("FIXPOINT_FAIL_MODE", "abort")
        .output()
        .unwrap();
    assert!(killed.status.code().is_none(), "killed by a signal");
    // A failure (not a kill) on the second date: exit 1, a summary, the first date kept.
    let failed = Command::new(env!("CARGO_BIN_EXE_fixpoint"))
        .args(["backfill", "job.toml", "--from", "2026-10-19", "--to", "2026-10-20", "--db", "duckdb:w.duckdb", "--output", "json"])
        .current_dir(tmp.path())
        .env("FIXPOINT_TEST_MODE", "1")
        .env("FIXPOINT_FAIL_AT", "after_delete@2026-10-20")
        .output()
        .unwrap();
    assert_eq!(failed.status.code(), Some(1));
    let v: serde_json::Value = serde_json::from_slice(&failed.stdout).unwrap();
    assert_eq!(v["dates"][0]["outcome"], "skipped", "the 19th was done before the kill");
    assert_eq!(v["dates"][1]["outcome"], "failed");
    assert_eq!(v["dates"][1]["error"]["message"], "injected failure at after_delete");
    let resumed = fixpoint(tmp.path(), &["backfill", "job.toml", "--from", "2026-10-19", "--to", "2026-10-20", "--db", "duckdb:w.duckdb"]);
    assert_eq!(resumed.code, 0, "{}", resumed.stderr);
    assert!(resumed.stdout.contains("1 committed, 1 skipped (already done), 0 failed"), "{}", resumed.stdout);
    assert_eq!(day_fingerprints(tmp.path()), expected);

    // status and runs read the ledger.
    let st = fixpoint(tmp.path(), &["status", "job.toml", "--db", "duckdb:w.duckdb", "--output", "json"]);
    assert_eq!(st.code, 0, "every date ok: {}", st.stderr);
    let s: serde_json::Value = serde_json::from_str(&st.stdout).unwrap();
    let states: Vec<&str> = s["dates"].as_array().unwrap().iter().map(|d| d["state"].as_str().unwrap()).collect();
    assert_eq!(states, ["ok", "ok"]);
    let runs = fixpoint(tmp.path(), &["runs", "--job", "silver_orders", "--db", "duckdb:w.duckdb", "--output", "json"]);
    let r: serde_json::Value = serde_json::from_str(&runs.stdout).unwrap();
    let dates: Vec<&str> = r["runs"].as_array().unwrap().iter().map(|e| e["run_date"].as_str().unwrap()).collect();
    assert_eq!(dates, ["2026-10-20", "2026-10-19"], "newest first: the resumed run, then the first load (skips record nothing)");
    // --parallel 2 ends in the same state (DuckDB serializes, and says so).
    let par = tempfile::tempdir().unwrap();
    setup(par.path());
    let p = fixpoint(par.path(), &["backfill", "job.toml", "--from", "2026-10-19", "--to", "2026-10-20", "--parallel", "2", "--db", "duckdb:w.duckdb"]);
    assert_eq!(p.code, 0, "{}", p.stderr);
    assert!(p.stderr.contains("one writer per database file; running the dates one at a time"), "{}", p.stderr);
    assert_eq!(day_fingerprints(par.path()), expected);
    let bad = fixpoint(tmp.path(), &["backfill", "job.toml", "--from", "2026-10-21", "--to", "2026-10-20", "--db", "duckdb:w.duckdb"]);
    assert_eq!(bad.code, 2);
    assert!(bad.stderr.contains("--from 2026-10-21 is after --to 2026-10-20"), "{}", bad.stderr);
}

#[test]
fn run_refuses_a_job_with_lint_errors_unless_allowed() {
    let tmp = tempfile::tempdir().unwrap();
    setup(tmp.path());
    std::fs::write(tmp.path().join("clock.toml"), JOB.replace("order_total, dt", "order_total, now() AS seen_at, dt")).unwrap();
    let lint = fixpoint(tmp.path(), &["lint", "clock.toml", "--output", "json"]);
    assert_eq!(lint.code, 2);
    let v: serde_json::Value = serde_json::from_str(&lint.stdout).unwrap();
    assert_eq!(v["errors"], 1);
    assert_eq!(v["files"][0]["findings"][0]["rule"], "clock");
    let refused = fixpoint(tmp.path(), &["run", "clock.toml", "--date", "2026-10-20", "--db", "duckdb:w.duckdb"]);
    assert_eq!(refused.code, 2, "{}", refused.stderr);
    assert!(refused.stderr.contains("1 lint error(s): reruns of this job would not leave the same table"), "{}", refused.stderr);
    assert!(refused.stderr.contains("line 8:38: clock: now() derives a value from the wall clock"), "{}", refused.stderr);
    let allowed = fixpoint(tmp.path(), &["run", "clock.toml", "--date", "2026-10-20", "--db", "duckdb:w.duckdb", "--allow-nondeterministic"]);
    assert_eq!(allowed.code, 0, "{}", allowed.stderr);
    assert!(allowed.stderr.contains("running despite lint errors"), "{}", allowed.stderr);
    // Warnings do not fail unless --deny-warnings.
    std::fs::write(
        tmp.path().join("warn.toml"),
        JOB.replace("FROM bronze.orders WHERE dt = :run_date", "FROM (SELECT *, row_number() OVER (PARTITION BY order_id ORDER BY order_total) AS rn FROM bronze.orders) AS o WHERE dt = :run_date"),
    )
    .unwrap();
    assert_eq!(fixpoint(tmp.path(), &["lint", "warn.toml"]).code, 0);
    assert_eq!(fixpoint(tmp.path(), &["lint", "warn.toml", "--deny-warnings"]).code, 2);
}

#[test]
fn prove_passes_an_idempotent_job_and_catches_the_clock_and_randomness() {
    let tmp = tempfile::tempdir().unwrap();
    setup(tmp.path());
    let ok = fixpoint(tmp.path(), &["prove", "job.toml", "--date", "2026-10-20", "--runs", "3", "--crash", "--db", "duckdb:w.duckdb", "--output", "json"]);
    assert_eq!(ok.code, 0, "{}\n{}", ok.stdout, ok.stderr);
    let v: serde_json::Value = serde_json::from_str(&ok.stdout).unwrap();
    assert_eq!(v["proved"], true);
    assert_eq!(v["runs"].as_array().unwrap().len(), 3);
    assert_eq!(v["crash"].as_array().unwrap().len(), 5);
    assert!(v["crash"].as_array().unwrap().iter().all(|c| c["previous_kept"] == true && c["ledger_clean"] == true && c["converged"] == true));
    let checksums: Vec<&str> = v["runs"].as_array().unwrap().iter().map(|r| r["output"]["checksum"].as_str().unwrap()).collect();
    assert!(checksums.iter().all(|c| *c == checksums[0]));
    assert!(v["verdict"].as_str().unwrap().contains("the diff is empty. Order: the same input stored in the opposite order gave the same output. Mutation: changing one input row of bronze.orders (order_total + 1) changed exactly one output row."), "{}", v["verdict"]);
    assert_eq!(v["order"]["outcome"], "passed");
    let text = fixpoint(tmp.path(), &["prove", "job.toml", "--date", "2026-10-20", "--db", "duckdb:w.duckdb"]);
    assert!(text.stdout.contains("2 runs left the same 2 rows with checksum"), "{}", text.stdout);

    for (name, expr) in [("clock", "now() AS seen_at"), ("random", "random() AS score"), ("uuid", "gen_random_uuid() AS id")] {
        let job = JOB.replace("silver.orders", &format!("silver.{name}")).replace("order_total, dt", &format!("order_total, {expr}, dt"));
        std::fs::write(tmp.path().join(format!("{name}.toml")), job).unwrap();
        let out = fixpoint(tmp.path(), &["prove", &format!("{name}.toml"), "--date", "2026-10-20", "--db", "duckdb:w.duckdb", "--output", "json"]);
        assert_eq!(out.code, 4, "{name}: {}\n{}", out.stdout, out.stderr);
        let v: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
        assert_eq!(v["proved"], false, "{name}");
        assert!(v["verdict"].as_str().unwrap().starts_with("not idempotent: run 2 left 2 rows with checksum"), "{name}: {}", v["verdict"]);
        let diffs = v["runs"][1]["differs_from_first"].as_array().unwrap();
        assert_eq!(diffs.len(), 4, "{name}: both rows differ, in both directions: {diffs:?}");
        assert_eq!(diffs[0]["side"], "after", "{name}: only after this run: {diffs:?}");
        assert!(diffs[0]["row"]["order_id"].is_u64(), "{name}: a row is an object: {diffs:?}");
        assert_eq!(diffs[3]["side"], "before", "{name}: only after run 1: {diffs:?}");
    }
    // A plain append: fixpoint has no append strategy, but a merge keyed on
    // a value generated per run appends every run's rows all the same.
    std::fs::write(
        tmp.path().join("append.toml"),
        "name = \"append\"\ntarget = \"silver.appended\"\nstrategy = \"merge\"\nkey = [\"event_id\"]\nversion = \"dt\"\n\n[source]\nsql = \"SELECT CAST(gen_random_uuid() AS VARCHAR) AS event_id, order_id, order_total, dt FROM bronze.orders WHERE dt = :run_date\"\n",
    )
    .unwrap();
    let out = fixpoint(tmp.path(), &["prove", "append.toml", "--date", "2026-10-20", "--db", "duckdb:w.duckdb", "--output", "json"]);
    assert_eq!(out.code, 4, "{}\n{}", out.stdout, out.stderr);
    let v: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
    assert!(v["verdict"].as_str().unwrap().starts_with("not idempotent: run 2 left 6 rows with checksum"), "{}", v["verdict"]);
    assert!(v["failures"][0].as_str().unwrap().contains("run 1 left 3 rows"), "{}", v["failures"]);
    let bad = fixpoint(tmp.path(), &["prove", "job.toml", "--date", "2026-10-20", "--runs", "1", "--db", "duckdb:w.duckdb"]);
    assert_eq!(bad.code, 2);
    assert!(bad.stderr.contains("a proof needs at least 2 runs"), "{}", bad.stderr);
}

#[test]
fn the_same_job_runs_unchanged_on_postgres() {
    let admin = std::env::var("FIXPOINT_TEST_PG").unwrap_or_else(|_| "postgres://root@127.0.0.1:5432/test".into());
    let name = format!("fixpoint_cli_{}", std::process::id());
    let mut pg = match fixpoint_postgres::Postgres::scratch(&admin, &name) {
        Ok(pg) => pg,
        Err(e) if std::env::var("CI").as_deref() == Ok("true") => panic!("postgres is unreachable under CI=true: {e}"),
        Err(e) => {
            eprintln!("skipped: postgres is unreachable ({e})");
            return;
        }
    };
    use fixpoint_core::Engine;
    for stmt in [
        "CREATE SCHEMA bronze",
        "CREATE TABLE bronze.orders (order_id BIGINT, order_total DECIMAL(12,2), note VARCHAR, dt DATE)",
        "INSERT INTO bronze.orders VALUES (1, 1.50, 'a', DATE '2026-10-19'), (2, 2.50, 'b', DATE '2026-10-20'), (3, 3.50, 'c', DATE '2026-10-20'), (4, 9.99, 'it''s', DATE '2026-10-20')",
    ] {
        pg.execute(&fixpoint_core::Sql::raw(stmt)).unwrap();
    }
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(tmp.path().join("job.toml"), JOB).unwrap();
    let url = format!("{}/{name}", &admin[..admin.rfind('/').unwrap()]);
    let first = fixpoint(tmp.path(), &["run", "job.toml", "--date", "2026-10-20", "--db", &url, "--output", "json"]);
    assert_eq!(first.code, 0, "{}", first.stderr);
    let v: serde_json::Value = serde_json::from_str(&first.stdout).unwrap();
    assert_eq!((v["rows_inserted"].as_u64(), v["output"]["rows"].as_u64()), (Some(2), Some(2)));
    assert!(v["output"]["kind"].as_str().unwrap().starts_with("native-v2/postgres "), "{}", v["output"]);
    let again = fixpoint(tmp.path(), &["run", "job.toml", "--date", "2026-10-20", "--db", &url, "--output", "json"]);
    let a: serde_json::Value = serde_json::from_str(&again.stdout).unwrap();
    assert_eq!(a["outcome"], "skipped");
    assert_eq!(a["output"]["checksum"], v["output"]["checksum"]);
    let proof = fixpoint(tmp.path(), &["prove", "job.toml", "--date", "2026-10-20", "--crash", "--db", &url]);
    assert_eq!(proof.code, 0, "{}\n{}", proof.stdout, proof.stderr);
    assert!(proof.stdout.contains("the diff is empty"), "{}", proof.stdout);
    let fp = fixpoint(tmp.path(), &["fingerprint", "silver.orders", "--portable", "--db", &url, "--output", "json"]);
    assert_eq!(fp.code, 0, "{}", fp.stderr);
    drop(pg);
}

#[test]
fn diff_exits_0_when_identical_and_4_with_the_differences() {
    let tmp = tempfile::tempdir().unwrap();
    setup(tmp.path());
    {
        let db = duckdb::Connection::open(tmp.path().join("w.duckdb")).unwrap();
        db.execute_batch("CREATE SCHEMA s; CREATE TABLE s.b AS SELECT * FROM bronze.orders;").unwrap();
    }
    let same = fixpoint(tmp.path(), &["diff", "bronze.orders", "s.b", "--key", "order_id", "--db", "duckdb:w.duckdb", "--output", "json"]);
    assert_eq!(same.code, 0, "{}\n{}", same.stdout, same.stderr);
    let v: serde_json::Value = serde_json::from_str(&same.stdout).unwrap();
    assert_eq!((v["identical"].as_bool(), v["rows_transferred"].as_u64(), v["method"].as_str()), (Some(true), Some(0), Some("native")));
    {
        let db = duckdb::Connection::open(tmp.path().join("w.duckdb")).unwrap();
        db.execute_batch("UPDATE s.b SET order_total = 9.00 WHERE order_id = 2; DELETE FROM s.b WHERE order_id = 4;").unwrap();
    }
    let differs = fixpoint(tmp.path(), &["diff", "bronze.orders", "s.b", "--key", "order_id", "--db", "duckdb:w.duckdb"]);
    assert_eq!(differs.code, 4, "{}\n{}", differs.stdout, differs.stderr);
    assert!(differs.stdout.contains("  changed    order_id=2: order_total: 2.50 -> 9.00\n"), "{}", differs.stdout);
    assert!(differs.stdout.contains("  only in A  order_id=4, order_total=9.99, note='it''s', dt=2026-10-20\n"), "{}", differs.stdout);
    assert!(differs.stdout.contains("1 only in A, 0 only in B, 1 changed"), "{}", differs.stdout);
    let json = fixpoint(tmp.path(), &["diff", "bronze.orders", "s.b", "--key", "order_id", "--db", "duckdb:w.duckdb", "--output", "json"]);
    let v: serde_json::Value = serde_json::from_str(&json.stdout).unwrap();
    assert_eq!((v["changed"].as_u64(), v["only_in_a"].as_u64(), v["only_in_b"].as_u64()), (Some(1), Some(1), Some(0)));
    assert_eq!(v["changed_rows"][0]["key"], serde_json::json!({"order_id": 2}));
    assert_eq!(v["changed_rows"][0]["changes"][0], serde_json::json!({"column": "order_total", "a": "2.50", "b": "9.00"}));
    assert_eq!(v["only_in_a_rows"][0], serde_json::json!({"order_id": 4, "order_total": "9.99", "note": "it's", "dt": "2026-10-20"}));
    assert!(v["note"].is_null(), "{v}");
    let bad = fixpoint(tmp.path(), &["diff", "bronze.orders", "s.nope", "--key", "order_id", "--db", "duckdb:w.duckdb"]);
    assert_eq!(bad.code, 2);
    assert!(bad.stderr.contains("table s.nope (B) does not exist"), "{}", bad.stderr);
    let no_key = fixpoint(tmp.path(), &["diff", "bronze.orders", "s.b", "--db", "duckdb:w.duckdb"]);
    assert_eq!(no_key.code, 2, "{}", no_key.stderr);
}

#[test]
fn prove_runs_the_mutation_check_unless_told_not_to() {
    let tmp = tempfile::tempdir().unwrap();
    setup(tmp.path());
    let out = fixpoint(tmp.path(), &["prove", "job.toml", "--date", "2026-10-20", "--db", "duckdb:w.duckdb", "--mutate-key", "order_id=3", "--output", "json"]);
    assert_eq!(out.code, 0, "{}\n{}", out.stdout, out.stderr);
    let v: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(v["mutation"]["outcome"], "passed");
    assert_eq!(v["mutation"]["change"], "order_total + 1");
    assert_eq!(v["mutation"]["row"], serde_json::json!({"order_id": 3, "order_total": "3.50", "note": "c", "dt": "2026-10-20"}));
    assert!(v["mutation"].get("output_keys_changed").is_none(), "a replace_partition job has no keys: {v}");
    assert!(v["mutation"]["sample"].as_array().unwrap().iter().all(|s| s["row"].is_object()), "{v}");
    assert!(v["crash"].is_null(), "no --crash: {v}");
    let off = fixpoint(tmp.path(), &["prove", "job.toml", "--date", "2026-10-20", "--db", "duckdb:w.duckdb", "--no-mutate", "--output", "json"]);
    assert_eq!(off.code, 0);
    let v: serde_json::Value = serde_json::from_str(&off.stdout).unwrap();
    assert!(v["mutation"].is_null());
    let bad = fixpoint(tmp.path(), &["prove", "job.toml", "--date", "2026-10-20", "--db", "duckdb:w.duckdb", "--mutate-key", "order_id"]);
    assert_eq!(bad.code, 2);
    assert!(bad.stderr.contains("--mutate-key \"order_id\": expected COLUMN=VALUE"), "{}", bad.stderr);
}

#[test]
fn a_failing_audit_exits_6_and_publishes_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    setup(tmp.path());
    let audited = format!("{JOB}\n[[audit]]\nname = \"small orders\"\nkind = \"expression\"\nexpression = \"order_total < 3\"\n");
    std::fs::write(tmp.path().join("audited.toml"), &audited).unwrap();
    let out = fixpoint(tmp.path(), &["run", "audited.toml", "--date", "2026-10-20", "--db", "duckdb:w.duckdb", "--output", "json"]);
    assert_eq!(out.code, 6, "{}\n{}", out.stdout, out.stderr);
    let v: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(v["error"]["class"], "audit");
    assert_eq!(v["error"]["audit"], "small orders");
    assert_eq!(v["error"]["audits"][0]["offending"], 1, "3.50 fails, 2.50 passes");
    assert_eq!(v["error"]["audits"][0]["sample"][0], serde_json::json!({"order_id": 3, "order_total": "3.50", "dt": "2026-10-20"}));
    assert_eq!(v["error"]["sample"], v["error"]["audits"][0]["sample"][0]);
    assert!(out.stderr.contains("hint: 1 blocking audit(s) failed; the previous contents are in place"), "{}", out.stderr);
    assert!(
        out.stderr.contains("error: audit small orders failed: 1 row(s) where (order_total < 3) does not hold; nothing was published. One offending row: {order_id: 3, order_total: \"3.50\", dt: 2026-10-20}"),
        "{}",
        out.stderr
    );
    // Nothing was published: the target was never created.
    let db = duckdb::Connection::open(tmp.path().join("w.duckdb")).unwrap();
    let n: i64 = db.query_row("SELECT count(*) FROM information_schema.tables WHERE table_name = 'orders' AND table_schema = 'silver'", [], |r| r.get(0)).unwrap();
    assert_eq!(n, 0);
}

#[test]
fn run_with_lookback_reports_each_day_and_fails_with_the_failed_days_code() {
    let tmp = tempfile::tempdir().unwrap();
    setup(tmp.path());
    std::fs::write(tmp.path().join("late.toml"), format!("lookback = 1\n{JOB}")).unwrap();
    let first = fixpoint(tmp.path(), &["run", "late.toml", "--date", "2026-10-20", "--db", "duckdb:w.duckdb"]);
    assert_eq!(first.code, 0, "{}", first.stderr);
    assert!(first.stdout.starts_with("silver_orders 2026-10-20 with lookback 1: 2 day(s) written, 0 skipped, 0 failed\n"), "{}", first.stdout);
    assert!(first.stdout.contains("2026-10-19   loaded              1  never loaded"), "{}", first.stdout);
    {
        let db = duckdb::Connection::open(tmp.path().join("w.duckdb")).unwrap();
        db.execute_batch("INSERT INTO bronze.orders VALUES (9, 0.50, 'late', DATE '2026-10-19')").unwrap();
    }
    let failed = Command::new(env!("CARGO_BIN_EXE_fixpoint"))
        .args(["run", "late.toml", "--date", "2026-10-20", "--db", "duckdb:w.duckdb", "--output", "json"])
        .current_dir(tmp.path())
        .env("FIXPOINT_TEST_MODE", "1")
        .env("FIXPOINT_FAIL_AT", "after_delete@2026-10-19")
        .output()
        .unwrap();
    assert_eq!(failed.status.code(), Some(1), "an injected failure is a runtime failure");
    let v: serde_json::Value = serde_json::from_slice(&failed.stdout).unwrap();
    let days = &v["window"]["days"];
    assert_eq!((days[0]["action"].as_str(), days[1]["action"].as_str()), (Some("failed"), Some("skipped")));
    assert_eq!((days[0]["error"]["class"].as_str(), days[0]["error"]["exit_code"].as_u64()), (Some("injected"), Some(1)), "{v}");
    assert!(days[0]["report"].is_null() && days[1]["error"].is_null(), "{v}");
    assert_eq!(v["outcome"], "skipped", "the top is the run date's own report: {v}");
    let retry = fixpoint(tmp.path(), &["run", "late.toml", "--date", "2026-10-20", "--db", "duckdb:w.duckdb", "--output", "json"]);
    assert_eq!(retry.code, 0);
    let v: serde_json::Value = serde_json::from_str(&retry.stdout).unwrap();
    assert_eq!(v["window"]["days"][0]["action"], "reloaded");
    assert_eq!(v["window"]["days"][0]["report"]["output"]["rows"], 2, "the late row is in");
    assert_eq!(v["window"]["lookback"], 1);
    assert_eq!(v["run_date"], "2026-10-20");
    let early = fixpoint(tmp.path(), &["run", "late.toml", "--date", "2026-10-20", "--db", "duckdb:w.duckdb"]);
    assert_eq!(early.code, 0);
    std::fs::write(tmp.path().join("started.toml"), format!("start = 2026-10-20\n{JOB}")).unwrap();
    let before = fixpoint(tmp.path(), &["run", "started.toml", "--date", "2026-10-19", "--db", "duckdb:w.duckdb"]);
    assert_eq!(before.code, 2);
    assert!(before.stderr.contains("--date 2026-10-19 is before the job's start 2026-10-20"), "{}", before.stderr);
}

#[test]
fn a_file_source_runs_reruns_reports_and_refuses_a_missing_day() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    std::fs::create_dir_all(dir.join("bronze/dt=2026-10-20")).unwrap();
    std::fs::write(dir.join("bronze/dt=2026-10-20/a.csv"), "order_id,order_total\n1,1.50\n2,2.50\n").unwrap();
    std::fs::write(dir.join("bronze/dt=2026-10-20/b.csv"), "order_id,order_total\n3,3.50\n").unwrap();
    std::fs::write(
        dir.join("job.toml"),
        "name = \"csv_orders\"\ntarget = \"silver.orders\"\nstrategy = \"replace_partition\"\npartition = \"dt\"\n\n[source]\nfiles = \"bronze/dt={run_date}/*.csv\"\n",
    )
    .unwrap();
    let run = |date: &str| fixpoint(dir, &["run", "job.toml", "--date", date, "--db", "duckdb:w.duckdb", "--output", "json"]);
    let first = run("2026-10-20");
    assert_eq!(first.code, 0, "{}", first.stderr);
    let v: serde_json::Value = serde_json::from_str(&first.stdout).unwrap();
    assert_eq!(v["output"]["rows"], 3);
    assert_eq!(v["input_files"]["files"][0]["path"], "a.csv");
    assert_eq!(v["input_files"]["files"][1]["size"], 28);
    assert_eq!(v["input_files"]["files"][0]["blake3"].as_str().unwrap().len(), 64);
    let again = run("2026-10-20");
    let w: serde_json::Value = serde_json::from_str(&again.stdout).unwrap();
    assert_eq!((w["outcome"].as_str(), w["run_key"].as_str()), (Some("skipped"), v["run_key"].as_str()));

    // A late row in b.csv: status names the file without reading rows.
    std::fs::write(dir.join("bronze/dt=2026-10-20/b.csv"), "order_id,order_total\n3,3.50\n4,4.50\n").unwrap();
    let st = fixpoint(dir, &["status", "job.toml", "--from", "2026-10-20", "--to", "2026-10-20", "--db", "duckdb:w.duckdb", "--output", "json"]);
    assert_eq!(st.code, 4, "a changed source needs attention: {}", st.stderr);
    let s: serde_json::Value = serde_json::from_str(&st.stdout).unwrap();
    assert_eq!(s["dates"][0]["state"], "source_changed");
    assert_eq!(s["dates"][0]["files_changed"][0], "changed b.csv");
    let text = fixpoint(dir, &["status", "job.toml", "--from", "2026-10-20", "--to", "2026-10-21", "--db", "duckdb:w.duckdb"]);
    assert!(text.stdout.contains("source changed") && text.stdout.contains("files: changed b.csv"), "{}", text.stdout);
    assert!(text.stdout.contains("NO INPUT") && text.stdout.contains("no file matches"), "{}", text.stdout);

    // A missing day: exit 3 (refused data), the pattern named, a hint, nothing written.
    let missing = fixpoint(dir, &["run", "job.toml", "--date", "2026-10-21", "--db", "duckdb:w.duckdb"]);
    assert_eq!(missing.code, 3, "{}", missing.stderr);
    assert!(missing.stderr.contains("no file matches") && missing.stderr.contains("bronze/dt=2026-10-21/*.csv"), "{}", missing.stderr);
    assert!(missing.stderr.contains("hint: ") && missing.stderr.contains("allow_missing = true"), "{}", missing.stderr);
    assert!(missing.stdout.is_empty());

    // The proof: reruns, and the mutation check changes one row of the files.
    let prove = fixpoint(dir, &["prove", "job.toml", "--date", "2026-10-20", "--db", "duckdb:w.duckdb", "--output", "json"]);
    assert_eq!(prove.code, 0, "{}{}", prove.stdout, prove.stderr);
    let p: serde_json::Value = serde_json::from_str(&prove.stdout).unwrap();
    assert_eq!(p["proved"], true);
    assert_eq!(p["mutation"]["outcome"], "passed", "{}", prove.stdout);
    assert_eq!(p["mutation"]["table"], "input (the day's files)");
}

/// The keys under which the JSON output holds a fingerprint.
const FINGERPRINT_KEYS: &[&str] = &["input", "output", "before", "fingerprint_a", "fingerprint_b", "input_now", "output_now"];

/// Keys the JSON output no longer has: a fingerprint's parts are always in
/// a fingerprint object.
const FLAT_FINGERPRINT_KEYS: &[&str] = &["input_rows", "input_checksum", "output_rows", "output_checksum", "fingerprint_kind", "rows_now", "input_rows_now"];

/// Walks `v`: every fingerprint object (with its path), every row (with its
/// path), and every key on the way.
fn walk<'a>(v: &'a serde_json::Value, path: &str, fps: &mut Vec<(String, &'a serde_json::Value)>, rows: &mut Vec<(String, &'a serde_json::Value)>, keys: &mut Vec<String>) {
    match v {
        serde_json::Value::Object(o) => {
            for (k, x) in o {
                let p = format!("{path}.{k}");
                keys.push(k.clone());
                if FINGERPRINT_KEYS.contains(&k.as_str()) && !x.is_null() {
                    fps.push((p.clone(), x));
                }
                match (k.as_str(), x) {
                    // diff's listed rows; an audit's offending rows.
                    ("only_in_a_rows" | "only_in_b_rows", serde_json::Value::Array(a)) => rows.extend(a.iter().enumerate().map(|(i, r)| (format!("{p}[{i}]"), r))),
                    // prove's samples ({"side", "row"}) and audits' samples (rows).
                    ("sample" | "differs_from_first", serde_json::Value::Array(a)) => {
                        for (i, r) in a.iter().enumerate() {
                            rows.push((format!("{p}[{i}]"), r.get("row").filter(|_| r.get("side").is_some()).unwrap_or(r)));
                        }
                    }
                    // An error's example row; prove's mutated input row.
                    ("sample" | "row", x) if !x.is_null() => rows.push((p.clone(), x)),
                    _ => {}
                }
                if let (Some(changed), "changed_rows") = (x.as_array(), k.as_str()) {
                    rows.extend(changed.iter().enumerate().map(|(i, c)| (format!("{p}[{i}].key"), &c["key"])));
                }
                walk(x, &p, fps, rows, keys);
            }
        }
        serde_json::Value::Array(a) => {
            for (i, x) in a.iter().enumerate() {
                walk(x, &format!("{path}[{i}]"), fps, rows, keys);
            }
        }
        _ => {}
    }
}

#[test]
fn every_command_speaks_one_json_vocabulary() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    setup(dir);
    std::fs::write(dir.join("late.toml"), format!("lookback = 1\n{JOB}").replace("silver.orders", "silver.late").replace("silver_orders", "silver_late")).unwrap();
    std::fs::write(dir.join("wide.toml"), JOB.replace("WHERE dt = :run_date", "WHERE dt <= :run_date")).unwrap();
    fn with(args: &[&str]) -> Vec<String> {
        args.iter().chain(&["--db", "duckdb:w.duckdb", "--output", "json"]).map(|a| a.to_string()).collect()
    }
    let mut outputs: Vec<(String, i32, serde_json::Value)> = Vec::new();
    let mut call = |args: Vec<String>, codes: &[i32]| -> serde_json::Value {
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        let o = fixpoint(dir, &refs);
        let name = args[..2].join(" ");
        assert!(codes.contains(&o.code), "{name}: exit {}\n{}\n{}", o.code, o.stdout, o.stderr);
        let v: serde_json::Value = serde_json::from_str(&o.stdout).unwrap_or_else(|e| panic!("{name}: stdout is not JSON ({e}):\n{}", o.stdout));
        outputs.push((name, o.code, v.clone()));
        v
    };
    let plain = call(with(&["run", "job.toml", "--date", "2026-10-20"]), &[0]);
    let window = call(with(&["run", "late.toml", "--date", "2026-10-20"]), &[0]);
    call(with(&["backfill", "job.toml", "--from", "2026-10-19", "--to", "2026-10-20"]), &[0]);
    call(with(&["status", "job.toml"]), &[0, 4]);
    call(with(&["runs"]), &[0]);
    call(with(&["prove", "job.toml", "--date", "2026-10-20", "--crash", "--mutate-key", "order_id=3"]), &[0]);
    {
        let db = duckdb::Connection::open(dir.join("w.duckdb")).unwrap();
        db.execute_batch("CREATE SCHEMA s; CREATE TABLE s.b AS SELECT * FROM bronze.orders; UPDATE s.b SET order_total = 9.00 WHERE order_id = 2; DELETE FROM s.b WHERE order_id = 4; INSERT INTO s.b VALUES (10, 0.10, 'new', DATE '2026-10-21');").unwrap();
    }
    call(with(&["diff", "bronze.orders", "s.b", "--key", "order_id"]), &[4]);
    call(with(&["fingerprint", "silver.orders", "--where", "dt = DATE '2026-10-20'"]), &[0]);
    call(with(&["run", "wide.toml", "--date", "2026-10-20"]), &[3]);

    // One shape for run, with and without lookback: the run date's report,
    // plus `window` with lookback.
    let keys = |v: &serde_json::Value| v.as_object().unwrap().keys().filter(|k| *k != "window").cloned().collect::<Vec<_>>();
    assert_eq!(keys(&plain), keys(&window), "{plain}\n{window}");
    assert!(window["window"]["days"].is_array() && plain.get("window").is_none());

    let fingerprint_keys = ["checksum", "kind", "rows"];
    for (name, _, v) in &outputs {
        let (mut fps, mut rows, mut keys) = (Vec::new(), Vec::new(), Vec::new());
        walk(v, "", &mut fps, &mut rows, &mut keys);
        if name == "fingerprint silver.orders" {
            let top = v.as_object().unwrap();
            assert_eq!(top.keys().filter(|k| *k != "table").collect::<Vec<_>>(), fingerprint_keys, "{name}: {v}");
        } else if !name.starts_with("run wide") {
            assert!(!fps.is_empty(), "{name}: a fingerprint somewhere: {v}");
        }
        for (path, fp) in &fps {
            let o = fp.as_object().unwrap_or_else(|| panic!("{name}: {path} is not an object: {fp}"));
            assert_eq!(o.keys().collect::<Vec<_>>(), fingerprint_keys, "{name}: {path}: {fp}");
            assert!(fp["rows"].is_u64() && fp["checksum"].is_string() && fp["kind"].is_string(), "{name}: {path}: {fp}");
        }
        for (path, row) in &rows {
            assert!(row.is_object(), "{name}: {path}: a row is an object: {row}");
        }
        for k in &keys {
            assert!(!FLAT_FINGERPRINT_KEYS.contains(&k.as_str()), "{name}: {k}: {v}");
        }
        let rowful = ["prove job.toml", "diff bronze.orders", "run wide.toml"];
        if rowful.contains(&name.as_str()) {
            assert!(!rows.is_empty(), "{name}: rows listed: {v}");
        }
    }
    // Rows hold typed values: numbers as numbers, timestamps and dates as ISO text.
    let diff = &outputs.iter().find(|(n, _, _)| n == "diff bronze.orders").unwrap().2;
    let listed: Vec<i64> = diff["only_in_a_rows"].as_array().unwrap().iter().map(|r| r["order_id"].as_i64().unwrap()).collect();
    assert_eq!(listed, [4]);
    assert_eq!(diff["only_in_b_rows"][0], serde_json::json!({"order_id": 10, "order_total": "0.10", "note": "new", "dt": "2026-10-21"}));
    let error = &outputs.iter().find(|(n, _, _)| n == "run wide.toml").unwrap().2;
    assert_eq!(error["error"]["sample"]["order_id"], 1, "{error}");
}

/// Every table of w.duckdb with all its rows, read with plain SQL: what a
/// refused command must leave as it was.
fn everything(dir: &Path) -> Vec<(String, Option<String>)> {
    let db = duckdb::Connection::open(dir.join("w.duckdb")).unwrap();
    let list: Option<String> = db
        .query_row("SELECT string_agg(schema_name || '.' || table_name, ',' ORDER BY schema_name, table_name) FROM duckdb_tables()", [], |r| r.get(0))
        .unwrap();
    let mut out = Vec::new();
    for t in list.unwrap_or_default().split(',').filter(|t| !t.is_empty()) {
        let rows: Option<String> = db
            .query_row(&format!("SELECT string_agg(CAST(s AS VARCHAR), ';' ORDER BY CAST(s AS VARCHAR)) FROM {t} AS s"), [], |r| r.get(0))
            .unwrap();
        out.push((t.to_owned(), rows));
    }
    out
}

/// Committed ledger rows in w.duckdb (plain SQL; 0 without a ledger).
fn committed_runs(dir: &Path) -> i64 {
    let db = duckdb::Connection::open(dir.join("w.duckdb")).unwrap();
    let has: i64 = db.query_row("SELECT count(*) FROM duckdb_tables() WHERE schema_name = 'fixpoint' AND table_name = 'runs'", [], |r| r.get(0)).unwrap();
    if has == 0 {
        return 0;
    }
    db.query_row("SELECT count(*) FROM fixpoint.runs WHERE outcome = 'committed'", [], |r| r.get(0)).unwrap()
}

#[test]
fn prove_refuses_a_bad_mutate_key_before_running_anything() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    setup(dir);
    let bad = ["prove", "job.toml", "--date", "2026-10-20", "--db", "duckdb:w.duckdb", "--mutate-key", "nope=1"];
    let before = everything(dir);
    let out = fixpoint(dir, &bad);
    assert_eq!(out.code, 2, "{}\n{}", out.stdout, out.stderr);
    assert!(out.stderr.contains("error: --mutate-key nope=1: bronze.orders has no column \"nope\""), "{}", out.stderr);
    assert!(out.stderr.contains("hint: its columns are order_id, order_total, note, dt"), "{}", out.stderr);
    assert!(out.stdout.is_empty(), "{}", out.stdout);
    assert_eq!(everything(dir), before, "no run: no target, no ledger, no sandbox");

    // After a real run, a refused proof leaves the target and the ledger as they are.
    let run = fixpoint(dir, &["run", "job.toml", "--date", "2026-10-20", "--db", "duckdb:w.duckdb"]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    let loaded = everything(dir);
    assert!(loaded.iter().any(|(t, rows)| t == "fixpoint.runs" && rows.is_some()), "{loaded:?}");
    assert!(loaded.iter().any(|(t, rows)| t == "silver.orders" && rows.is_some()), "{loaded:?}");
    let json = fixpoint(dir, &["prove", "job.toml", "--date", "2026-10-20", "--db", "duckdb:w.duckdb", "--mutate-key", "order_id=3,nope=1", "--output", "json"]);
    assert_eq!(json.code, 2, "{}\n{}", json.stdout, json.stderr);
    let v: serde_json::Value = serde_json::from_str(&json.stdout).unwrap();
    assert_eq!((v["error"]["class"].as_str(), v["error"]["exit_code"].as_u64()), (Some("input"), Some(2)), "{v}");
    assert_eq!(everything(dir), loaded, "the target and the ledger are unchanged");
    let text = fixpoint(dir, &bad);
    assert_eq!(text.code, 2);
    assert_eq!(everything(dir), loaded);
    assert_eq!(committed_runs(dir), 1);
}

/// Runs the binary with stdout a pipe whose reading end is closed before
/// anything is written (`fixpoint runs | head -0`).
fn closed_stdout(dir: &Path, args: &[&str]) -> Out {
    let mut child = Command::new(env!("CARGO_BIN_EXE_fixpoint"))
        .args(args)
        .current_dir(dir)
        .env_remove("FIXPOINT_DB")
        .env_remove("FIXPOINT_FAIL_AT")
        .env_remove("FIXPOINT_TEST_MODE")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("runs");
    // The reader goes away at once: the child's first write gets EPIPE.
    drop(child.stdout.take());
    let o = child.wait_with_output().expect("waits");
    Out { code: o.status.code().unwrap_or(-1), stdout: String::new(), stderr: String::from_utf8_lossy(&o.stderr).into_owned() }
}

#[test]
fn a_closed_stdout_ends_quietly_with_the_commands_exit_code() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    setup(dir);
    let quiet = |o: &Out, what: &str| {
        assert!(
            !o.stderr.contains("panicked") && !o.stderr.contains("Broken pipe") && !o.stderr.contains("cannot write to stdout"),
            "{what}: no panic, no message about the closed pipe:\n{}",
            o.stderr
        );
    };
    // A committed run whose report cannot be printed: exit 0, and committed.
    let run = closed_stdout(dir, &["run", "job.toml", "--date", "2026-10-20", "--db", "duckdb:w.duckdb"]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    quiet(&run, "run");
    assert_eq!(committed_runs(dir), 1, "the run committed");
    {
        let db = duckdb::Connection::open(dir.join("w.duckdb")).unwrap();
        let n: i64 = db.query_row("SELECT count(*) FROM silver.orders WHERE dt = DATE '2026-10-20'", [], |r| r.get(0)).unwrap();
        assert_eq!(n, 2);
        db.execute_batch("CREATE SCHEMA s; CREATE TABLE s.b AS SELECT * FROM bronze.orders; UPDATE s.b SET order_total = 9.00 WHERE order_id = 2;").unwrap();
    }
    let forced = closed_stdout(dir, &["run", "job.toml", "--date", "2026-10-20", "--db", "duckdb:w.duckdb", "--force", "--output", "json"]);
    assert_eq!(forced.code, 0, "{}", forced.stderr);
    quiet(&forced, "run --output json");
    assert_eq!(committed_runs(dir), 2, "the forced run committed");
    // Other commands: their own exit code, quietly.
    let cases: &[(&[&str], i32)] = &[
        (&["runs", "--db", "duckdb:w.duckdb"], 0),
        (&["runs", "--db", "duckdb:w.duckdb", "--output", "json"], 0),
        (&["status", "job.toml", "--db", "duckdb:w.duckdb"], 0),
        (&["fingerprint", "bronze.orders", "--db", "duckdb:w.duckdb"], 0),
        (&["lint", "job.toml"], 0),
        (&["backfill", "job.toml", "--from", "2026-10-19", "--to", "2026-10-20", "--db", "duckdb:w.duckdb"], 0),
        (&["prove", "job.toml", "--date", "2026-10-20", "--no-mutate", "--db", "duckdb:w.duckdb"], 0),
        (&["diff", "bronze.orders", "s.b", "--key", "order_id", "--db", "duckdb:w.duckdb"], 4),
        (&["diff", "bronze.orders", "s.b", "--key", "order_id", "--db", "duckdb:w.duckdb", "--output", "json"], 4),
        (&["run", "missing.toml", "--date", "2026-10-20", "--db", "duckdb:w.duckdb", "--output", "json"], 2),
    ];
    for (args, code) in cases {
        let o = closed_stdout(dir, args);
        assert_eq!(o.code, *code, "{args:?}: {}", o.stderr);
        quiet(&o, &args.join(" "));
    }
    assert_eq!(committed_runs(dir), 5, "the backfill committed 2026-10-19 and prove its two runs");
}

#[test]
fn fault_injection_needs_test_mode() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    setup(dir);
    let with_env = |args: &[&str], vars: &[(&str, &str)]| -> Out {
        let mut c = Command::new(env!("CARGO_BIN_EXE_fixpoint"));
        c.args(args)
            .current_dir(dir)
            .env_remove("FIXPOINT_DB")
            .env_remove("FIXPOINT_FAIL_AT")
            .env_remove("FIXPOINT_FAIL_MODE")
            .env_remove("FIXPOINT_TEST_MODE")
            .env_remove("FIXPOINT_TEST_SWITCHES")
            .env_remove("FIXPOINT_TRACE");
        for (k, v) in vars {
            c.env(k, v);
        }
        let o = c.output().expect("runs");
        Out { code: o.status.code().unwrap_or(-1), stdout: String::from_utf8_lossy(&o.stdout).into_owned(), stderr: String::from_utf8_lossy(&o.stderr).into_owned() }
    };
    let run = ["run", "job.toml", "--date", "2026-10-20", "--db", "duckdb:w.duckdb"];
    let forced = ["run", "job.toml", "--date", "2026-10-20", "--db", "duckdb:w.duckdb", "--force"];
    // A stray FIXPOINT_FAIL_AT alone does not fail a run: ignored, with a warning.
    let stray = with_env(&run, &[("FIXPOINT_FAIL_AT", "after_delete")]);
    assert_eq!(stray.code, 0, "{}", stray.stderr);
    assert!(stray.stderr.contains("warning: FIXPOINT_FAIL_AT=\"after_delete\" is ignored"), "{}", stray.stderr);
    assert!(stray.stderr.contains("FIXPOINT_TEST_MODE=1"), "{}", stray.stderr);
    assert!(stray.stdout.contains("replaced partition of silver.orders"), "{}", stray.stdout);
    assert_eq!(committed_runs(dir), 1);
    let abort = with_env(&forced, &[("FIXPOINT_FAIL_AT", "mid_insert"), ("FIXPOINT_FAIL_MODE", "abort")]);
    assert_eq!(abort.code, 0, "not killed: {}", abort.stderr);
    assert_eq!(committed_runs(dir), 2);
    let backfill = with_env(&["backfill", "job.toml", "--from", "2026-10-19", "--to", "2026-10-20", "--db", "duckdb:w.duckdb"], &[("FIXPOINT_FAIL_AT", "after_guards")]);
    assert_eq!(backfill.code, 0, "{}", backfill.stderr);
    assert!(backfill.stderr.contains("is ignored"), "{}", backfill.stderr);
    assert_eq!(committed_runs(dir), 3, "2026-10-19 committed, 2026-10-20 skipped");
    let not_one = with_env(&forced, &[("FIXPOINT_FAIL_AT", "after_delete"), ("FIXPOINT_TEST_MODE", "yes")]);
    assert_eq!(not_one.code, 0, "only FIXPOINT_TEST_MODE=1 is test mode: {}", not_one.stderr);
    assert_eq!(committed_runs(dir), 4);
    // In test mode the failure is injected: exit 1, nothing committed.
    let injected = with_env(&forced, &[("FIXPOINT_FAIL_AT", "after_delete"), ("FIXPOINT_TEST_MODE", "1")]);
    assert_eq!(injected.code, 1, "{}", injected.stderr);
    assert!(injected.stderr.contains("injected failure at after_delete"), "{}", injected.stderr);
    assert!(!injected.stderr.contains("is ignored"), "{}", injected.stderr);
    assert_eq!(committed_runs(dir), 4);

    // Test switches likewise: ignored (with a warning) outside test mode,
    // obeyed in it (the trace shows the fallback taken), a wrong one refused.
    let traced = |vars: &[(&str, &str)]| -> Out {
        let mut v = vars.to_vec();
        v.push(("FIXPOINT_TRACE", "1"));
        with_env(&forced, &v)
    };
    let stray = traced(&[("FIXPOINT_TEST_SWITCHES", "untapped_day_insert")]);
    assert_eq!(stray.code, 0, "{}", stray.stderr);
    assert!(stray.stderr.contains("warning: FIXPOINT_TEST_SWITCHES=\"untapped_day_insert\" is ignored"), "{}", stray.stderr);
    assert!(!stray.stderr.contains("insert not tapped"), "{}", stray.stderr);
    assert_eq!(committed_runs(dir), 5);
    let switched = traced(&[("FIXPOINT_TEST_SWITCHES", "untapped_day_insert"), ("FIXPOINT_TEST_MODE", "1")]);
    assert_eq!(switched.code, 0, "{}", switched.stderr);
    assert!(switched.stderr.contains("insert not tapped (the tapped day insert is switched off)"), "{}", switched.stderr);
    assert_eq!(committed_runs(dir), 6);
    let wrong = with_env(&forced, &[("FIXPOINT_TEST_SWITCHES", "faster"), ("FIXPOINT_TEST_MODE", "1")]);
    assert_eq!(wrong.code, 2, "{}", wrong.stderr);
    assert!(wrong.stderr.contains("\"faster\" is not a test switch"), "{}", wrong.stderr);
    assert_eq!(committed_runs(dir), 6);
}

#[test]
fn run_and_backfill_refuse_sql_the_linter_cannot_read_unless_allowed() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    setup(dir);
    // DuckDB runs `* RENAME (…)`; sqlparser's DuckDB dialect cannot read it,
    // so fixpoint cannot lint it: refused, unless accepted anyway.
    std::fs::write(dir.join("rename.toml"), JOB.replace("SELECT order_id, order_total, dt FROM", "SELECT * RENAME (order_total AS total) FROM")).unwrap();
    let before = everything(dir);
    for args in [
        &["run", "rename.toml", "--date", "2026-10-20", "--db", "duckdb:w.duckdb"][..],
        &["backfill", "rename.toml", "--from", "2026-10-19", "--to", "2026-10-20", "--db", "duckdb:w.duckdb"][..],
    ] {
        let out = fixpoint(dir, args);
        assert_eq!(out.code, 2, "{args:?}: {}", out.stderr);
        assert!(out.stderr.contains("error: rename.toml: source.sql: cannot be read as DuckDB SQL: sql parser error: "), "{args:?}: {}", out.stderr);
        assert!(out.stderr.contains("RENAME") && out.stderr.contains("Line: 1, Column: "), "the parser's message and position: {}", out.stderr);
        assert!(out.stderr.contains("so the job was not run (nothing was changed)"), "{}", out.stderr);
        assert!(out.stderr.contains("hint: ") && out.stderr.contains("--allow-nondeterministic"), "the flag that accepts it: {}", out.stderr);
        assert!(!out.stderr.contains("not linted"), "{}", out.stderr);
        assert!(out.stdout.is_empty(), "{}", out.stdout);
        assert_eq!(everything(dir), before, "{args:?}: nothing changed");
    }
    let json = fixpoint(dir, &["run", "rename.toml", "--date", "2026-10-20", "--db", "duckdb:w.duckdb", "--output", "json"]);
    assert_eq!(json.code, 2);
    let v: serde_json::Value = serde_json::from_str(&json.stdout).unwrap();
    assert_eq!((v["error"]["class"].as_str(), v["error"]["exit_code"].as_u64()), (Some("input"), Some(2)), "{v}");
    assert_eq!(everything(dir), before);
    // Accepted anyway: a warning, then the run.
    let allowed = fixpoint(dir, &["run", "rename.toml", "--date", "2026-10-20", "--db", "duckdb:w.duckdb", "--allow-nondeterministic", "--output", "json"]);
    assert_eq!(allowed.code, 0, "{}", allowed.stderr);
    assert!(
        allowed.stderr.contains("warning: running a job fixpoint could not lint (--allow-nondeterministic): source.sql: cannot be read as DuckDB SQL"),
        "{}",
        allowed.stderr
    );
    let r: serde_json::Value = serde_json::from_str(&allowed.stdout).unwrap();
    assert_eq!((r["outcome"].as_str(), r["rows_inserted"].as_u64()), (Some("committed"), Some(2)), "{r}");
    {
        let db = duckdb::Connection::open(dir.join("w.duckdb")).unwrap();
        let n: i64 = db.query_row("SELECT count(total) FROM silver.orders WHERE dt = DATE '2026-10-20'", [], |r| r.get(0)).unwrap();
        assert_eq!(n, 2, "the renamed column was loaded");
    }
    assert_eq!(committed_runs(dir), 1);
    // A plain syntax error: refused the same way; accepted, the engine refuses it.
    std::fs::write(dir.join("broken.toml"), JOB.replace("FROM bronze.orders", "FROM")).unwrap();
    let loaded = everything(dir);
    let broken = fixpoint(dir, &["run", "broken.toml", "--date", "2026-10-20", "--db", "duckdb:w.duckdb"]);
    assert_eq!(broken.code, 2, "{}", broken.stderr);
    assert!(broken.stderr.contains("error: broken.toml: source.sql: cannot be read as DuckDB SQL"), "{}", broken.stderr);
    let tried = fixpoint(dir, &["run", "broken.toml", "--date", "2026-10-20", "--db", "duckdb:w.duckdb", "--allow-nondeterministic"]);
    assert_ne!(tried.code, 0, "{}", tried.stderr);
    assert!(tried.stderr.contains("warning: running a job fixpoint could not lint"), "{}", tried.stderr);
    assert!(!tried.stderr.contains("so the job was not run"), "past the gate, the engine decides: {}", tried.stderr);
    assert_eq!(everything(dir), loaded);
}

#[test]
fn diff_refuses_a_decimal_against_a_varchar_and_never_says_identical() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    setup(dir);
    {
        let db = duckdb::Connection::open(dir.join("w.duckdb")).unwrap();
        db.execute_batch("CREATE SCHEMA s; CREATE TABLE s.t AS SELECT order_id, CAST(order_total AS VARCHAR) AS order_total, note, dt FROM bronze.orders;").unwrap();
    }
    let args = ["diff", "bronze.orders", "s.t", "--key", "order_id", "--db", "duckdb:w.duckdb"];
    let out = fixpoint(dir, &args);
    assert_eq!(out.code, 2, "{}\n{}", out.stdout, out.stderr);
    assert!(
        out.stderr.contains("error: cannot diff columns of different type families: order_total is DECIMAL(12,2) (decimal) in bronze.orders but VARCHAR (text) in s.t"),
        "{}",
        out.stderr
    );
    assert!(out.stderr.contains("hint: ") && out.stderr.contains("--exclude order_total"), "{}", out.stderr);
    assert!(out.stdout.is_empty() && !out.stderr.contains("identical"), "{}", out.stdout);
    let mut json_args = args.to_vec();
    json_args.extend(["--output", "json"]);
    let json = fixpoint(dir, &json_args);
    assert_eq!(json.code, 2);
    let v: serde_json::Value = serde_json::from_str(&json.stdout).unwrap();
    assert_eq!(v["error"]["class"], "input", "{v}");
    assert!(v["identical"].is_null(), "no verdict: {v}");
    // Without the column, the rest compares.
    let mut rest = args.to_vec();
    rest.extend(["--exclude", "order_total"]);
    let same = fixpoint(dir, &rest);
    assert_eq!(same.code, 0, "{}\n{}", same.stdout, same.stderr);
    assert!(same.stdout.contains("identical: 4 rows"), "{}", same.stdout);
}

/// The binary against a Spark Connect server (feature `spark`): a day
/// replaced then skipped, a merge, a refused day, as exit codes and JSON.
#[cfg(feature = "spark")]
mod spark {
    use super::fixpoint;
    use fixpoint_core::{Engine, Sql};

    /// The cluster has one catalog: one test at a time.
    static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

    /// The test server's URL and a session on it, or `None` (said) when it
    /// is unreachable outside CI.
    fn spark() -> Option<(String, fixpoint_spark::Spark)> {
        let url = std::env::var("FIXPOINT_TEST_SPARK").unwrap_or_else(|_| "sc://127.0.0.1:15002".into());
        match fixpoint_spark::Spark::connect(&url, std::time::Duration::from_secs(10)) {
            Ok(db) => Some((url, db)),
            Err(e) if std::env::var("CI").as_deref() == Ok("true") => panic!("spark is unreachable under CI=true: {e}"),
            Err(e) => {
                eprintln!("skipped: spark is unreachable ({e})");
                None
            }
        }
    }

    /// The catalog emptied of the test's databases, then `bronze.orders`
    /// with `columns` holding `values`.
    fn bronze(db: &mut fixpoint_spark::Spark, columns: &str, values: &str) {
        for stmt in [
            // Cached relations of runs killed earlier (see the scenarios' `fresh`).
            "CLEAR CACHE".to_owned(),
            "DROP DATABASE IF EXISTS bronze CASCADE".to_owned(),
            "DROP DATABASE IF EXISTS silver CASCADE".to_owned(),
            "DROP DATABASE IF EXISTS fixpoint CASCADE".to_owned(),
            "CREATE DATABASE bronze".to_owned(),
            format!("CREATE TABLE bronze.orders ({columns})"),
            format!("INSERT INTO bronze.orders VALUES {values}"),
        ] {
            db.execute(&Sql::raw(stmt)).unwrap_or_else(|e| panic!("{e}"));
        }
    }

    fn rows(db: &mut fixpoint_spark::Spark, sql: &str) -> Vec<Vec<String>> {
        let rows = db.query(&Sql::raw(sql)).unwrap_or_else(|e| panic!("{sql}: {e}"));
        rows.rows.iter().map(|r| r.iter().map(|v| v.display()).collect()).collect()
    }

    /// A run whose whole process is frozen (SIGSTOP: its lease renewal too)
    /// for longer than its lease, while another run takes the day over and
    /// commits, wakes up to find the lease lost and stops without writing:
    /// the day and the ledger are the other run's.
    #[test]
    fn a_run_frozen_past_its_lease_writes_nothing() {
        use std::io::BufRead;
        let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
        let Some((url, mut db)) = spark() else { return };
        bronze(
            &mut db,
            "order_id BIGINT, order_total DECIMAL(12,2), dt DATE",
            "(1, 1.50, DATE '2026-10-20'), (2, 2.50, DATE '2026-10-20')",
        );
        let dir = tempfile::tempdir().unwrap();
        let job = "name = \"day\"\ntarget = \"silver.orders\"\nstrategy = \"replace_partition\"\npartition = \"dt\"\n\n[source]\nsql = \"SELECT order_id, order_total, dt FROM bronze.orders WHERE dt = :run_date\"\n";
        std::fs::write(dir.path().join("day.toml"), job).unwrap();
        let run = |extra: &[(&str, &str)], args: &[&str]| {
            let mut c = std::process::Command::new(env!("CARGO_BIN_EXE_fixpoint"));
            c.args(["run", "day.toml", "--date", "2026-10-20", "--db", &url])
                .args(args)
                .current_dir(dir.path())
                .env_remove("FIXPOINT_DB")
                .env_remove("FIXPOINT_FAIL_AT")
                .env_remove("FIXPOINT_FAIL_MODE")
                .env("FIXPOINT_SPARK_LEASE_SECONDS", "3")
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped());
            for (k, v) in extra {
                c.env(k, v);
            }
            c
        };
        // The first load creates the table; then the day's source changes.
        let first = run(&[], &[]).output().unwrap();
        assert_eq!(first.status.code(), Some(0), "{}", String::from_utf8_lossy(&first.stderr));
        db.execute(&Sql::raw("INSERT INTO bronze.orders VALUES (3, 3.50, DATE '2026-10-20')")).unwrap();

        // Run A reads the changed source, takes the lease and pauses after
        // its guards; it is frozen there, renewal thread included.
        let mut a = run(&[("FIXPOINT_TEST_MODE", "1"), ("FIXPOINT_FAIL_AT", "after_guards"), ("FIXPOINT_FAIL_MODE", "pause:1500")], &[]).spawn().unwrap();
        let pid = a.id().to_string();
        let (tx, rx) = std::sync::mpsc::channel::<String>();
        let stderr = a.stderr.take().unwrap();
        let reader = std::thread::spawn(move || {
            let mut all = String::new();
            for line in std::io::BufReader::new(stderr).lines().map_while(Result::ok) {
                let _ = tx.send(line.clone());
                all.push_str(&line);
                all.push('\n');
            }
            all
        });
        loop {
            let line = rx.recv_timeout(std::time::Duration::from_secs(120)).expect("run A reaches its pause");
            if line.contains("pausing 1500 ms at fail point after_guards") {
                break;
            }
        }
        assert!(std::process::Command::new("kill").args(["-STOP", &pid]).status().unwrap().success());
        std::thread::sleep(std::time::Duration::from_millis(4500));
        // Meanwhile the source changes again and run B takes the expired
        // lease over and commits.
        db.execute(&Sql::raw("INSERT INTO bronze.orders VALUES (4, 4.50, DATE '2026-10-20')")).unwrap();
        let b = run(&[], &["--no-wait", "--output", "json"]).output().unwrap();
        let b_err = String::from_utf8_lossy(&b.stderr).into_owned();
        assert_eq!(b.status.code(), Some(0), "{b_err}");
        assert!(b_err.contains("taking over the expired lease"), "{b_err}");
        let b: serde_json::Value = serde_json::from_slice(&b.stdout).unwrap();
        assert_eq!((b["outcome"].as_str(), b["rows_inserted"].as_u64()), (Some("committed"), Some(4)), "{b}");

        // A wakes up, finds the lease lost, writes nothing: exit 5 (busy).
        assert!(std::process::Command::new("kill").args(["-CONT", &pid]).status().unwrap().success());
        let status = a.wait().unwrap();
        let a_err = reader.join().unwrap();
        assert_eq!(status.code(), Some(5), "{a_err}");
        assert!(a_err.contains("lost its lease") && a_err.contains("wrote nothing"), "{a_err}");

        // Independent of fixpoint's fingerprints: the day is exactly the
        // source as B read it, and the ledger holds the first load and B.
        assert_eq!(
            rows(&mut db, "SELECT order_id, CAST(order_total AS STRING) FROM silver.orders WHERE dt = DATE '2026-10-20' ORDER BY order_id"),
            rows(&mut db, "SELECT order_id, CAST(order_total AS STRING) FROM bronze.orders WHERE dt = DATE '2026-10-20' ORDER BY order_id"),
        );
        assert_eq!(rows(&mut db, "SELECT count(*) FROM silver.orders"), vec![vec!["4".to_owned()]]);
        assert_eq!(
            rows(&mut db, "SELECT input_rows, output_rows FROM fixpoint.runs WHERE job = 'day' ORDER BY input_rows"),
            vec![vec!["2".to_owned(), "2".to_owned()], vec!["4".to_owned(), "4".to_owned()]],
            "the first load and B; nothing of A"
        );
    }

    #[test]
    fn runs_on_spark_with_exit_codes_and_json() {
        let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
        let Some((url, mut db)) = spark() else { return };
        bronze(
            &mut db,
            "order_id BIGINT, order_total DECIMAL(12,2), updated_at TIMESTAMP, dt DATE",
            "(1, 1.50, TIMESTAMP '2026-10-20 08:00:00', DATE '2026-10-20'), (2, 2.50, TIMESTAMP '2026-10-20 09:00:00', DATE '2026-10-20'), (2, 2.75, TIMESTAMP '2026-10-20 10:00:00', DATE '2026-10-20'), (3, 3.50, TIMESTAMP '2026-10-21 08:00:00', DATE '2026-10-21')",
        );
        let dir = tempfile::tempdir().unwrap();
        let replace = "name = \"day\"\ntarget = \"silver.orders\"\nstrategy = \"replace_partition\"\npartition = \"dt\"\n\n[source]\nsql = \"SELECT order_id, order_total, updated_at, dt FROM bronze.orders WHERE dt = :run_date\"\n";
        std::fs::write(dir.path().join("day.toml"), replace).unwrap();
        std::fs::write(dir.path().join("wide.toml"), replace.replace("WHERE dt = :run_date", "WHERE dt >= :run_date")).unwrap();
        let merge = "name = \"latest\"\ntarget = \"silver.latest\"\nstrategy = \"merge\"\nkey = [\"order_id\"]\nversion = \"updated_at\"\npartition = \"dt\"\n\n[source]\nsql = \"SELECT order_id, order_total, updated_at, dt FROM bronze.orders WHERE dt = :run_date\"\n";
        std::fs::write(dir.path().join("latest.toml"), merge).unwrap();
        let run = |job: &str| fixpoint(dir.path(), &["run", job, "--date", "2026-10-20", "--db", &url, "--output", "json"]);

        let first = run("day.toml");
        assert_eq!(first.code, 0, "{}", first.stderr);
        let r: serde_json::Value = serde_json::from_str(&first.stdout).unwrap();
        assert_eq!((r["outcome"].as_str(), r["rows_inserted"].as_u64(), r["method"].as_str()), (Some("committed"), Some(3), Some("partition overwrite")));
        let again = run("day.toml");
        assert_eq!(again.code, 0, "{}", again.stderr);
        let a: serde_json::Value = serde_json::from_str(&again.stdout).unwrap();
        assert_eq!(a["outcome"], "skipped");
        assert_eq!(a["output"]["checksum"], r["output"]["checksum"]);
        let fp = fixpoint(dir.path(), &["fingerprint", "silver.orders", "--where", "dt = DATE '2026-10-20'", "--db", &url, "--output", "json"]);
        let f: serde_json::Value = serde_json::from_str(&fp.stdout).unwrap();
        assert_eq!((f["rows"].as_u64(), &f["checksum"]), (Some(3), &r["output"]["checksum"]), "the ledger's fingerprint is the table's");

        let wide = run("wide.toml");
        assert_eq!(wide.code, 3, "rows outside the day: a data error. {}", wide.stderr);
        assert!(wide.stderr.contains("1 source row(s) have dt other than the run date 2026-10-20; nothing was changed"), "{}", wide.stderr);

        let m = run("latest.toml");
        assert_eq!(m.code, 0, "{}", m.stderr);
        let m: serde_json::Value = serde_json::from_str(&m.stdout).unwrap();
        assert_eq!((m["rows_inserted"].as_u64(), m["duplicates_collapsed"].as_u64()), (Some(2), Some(1)));
        let rows = db.query(&Sql::raw("SELECT order_id, CAST(order_total AS STRING) FROM silver.latest ORDER BY order_id")).unwrap();
        let rows: Vec<Vec<String>> = rows.rows.iter().map(|r| r.iter().map(|v| v.display()).collect()).collect();
        assert_eq!(rows, vec![vec!["1".to_owned(), "\"1.50\"".to_owned()], vec!["2".to_owned(), "\"2.75\"".to_owned()]]);
    }
}

/// A history job through the binary: the report (text and JSON), a tie
/// refused with exit 3 and nothing changed, a snapshot history's rerun
/// skipped.
#[test]
fn a_history_job_reports_and_refuses_like_the_others() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    std::fs::write(
        dir.join("dim.toml"),
        "name = \"dim_customer\"\ntarget = \"silver.dim_customer\"\nstrategy = \"history\"\nkey = [\"id\"]\nversion = \"v\"\ntrack = [\"city\"]\n\n[source]\nsql = \"SELECT id, city, v FROM bronze.c WHERE d = :run_date\"\n",
    )
    .unwrap();
    {
        let db = duckdb::Connection::open(dir.join("w.duckdb")).unwrap();
        db.execute_batch(
            "CREATE SCHEMA bronze; CREATE TABLE bronze.c (d DATE, id BIGINT, city VARCHAR, v BIGINT);
             INSERT INTO bronze.c VALUES (DATE '2026-10-19', 1, 'Paris', 1), (DATE '2026-10-19', 2, 'Rome', 1),
               (DATE '2026-10-20', 1, 'Lyon', 3), (DATE '2026-10-21', 1, 'Nice', 2),
               (DATE '2026-10-22', 2, 'Oslo', 5), (DATE '2026-10-22', 2, 'Bern', 5);",
        )
        .unwrap();
    }
    let run = |date: &str, json: bool| {
        let mut a = vec!["run", "dim.toml", "--date", date, "--db", "duckdb:w.duckdb"];
        if json {
            a.extend(["--output", "json"]);
        }
        fixpoint(dir, &a)
    };
    let first = run("2026-10-19", false);
    assert_eq!(first.code, 0, "{}", first.stderr);
    assert!(first.stdout.contains("dim_customer 2026-10-19: history of silver.dim_customer — 2 rows written"), "{}", first.stdout);
    assert!(first.stdout.contains("history_well_formed: passed"), "{}", first.stdout);
    for date in ["2026-10-20", "2026-10-21"] {
        assert_eq!(run(date, false).code, 0);
    }
    let json = run("2026-10-21", true);
    assert_eq!(json.code, 0, "{}", json.stderr);
    let v: serde_json::Value = serde_json::from_str(&json.stdout).unwrap();
    assert_eq!((v["strategy"].as_str(), v["outcome"].as_str()), (Some("history"), Some("skipped")), "{v}");
    let rows = |dir: &Path| -> Vec<(i64, String, i64, Option<i64>)> {
        let db = duckdb::Connection::open(dir.join("w.duckdb")).unwrap();
        let mut st = db.prepare("SELECT id, city, valid_from, valid_to FROM silver.dim_customer ORDER BY id, valid_from").unwrap();
        st.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?))).unwrap().map(|r| r.unwrap()).collect()
    };
    let want = vec![(1, "Paris".to_string(), 1, Some(2)), (1, "Nice".into(), 2, Some(3)), (1, "Lyon".into(), 3, None), (2, "Rome".into(), 1, None)];
    assert_eq!(rows(dir), want, "the late version 2 placed between 1 and 3");
    let tie = run("2026-10-22", false);
    assert_eq!(tie.code, 3, "{}", tie.stderr);
    assert!(tie.stderr.contains("at the same version (v) in the batch") && tie.stderr.contains("on_tie = \"deterministic\""), "{}", tie.stderr);
    assert_eq!(rows(dir), want, "nothing changed");
}

fn fixpoint_env(dir: &Path, args: &[&str], env: &[(&str, &str)]) -> Out {
    let mut c = Command::new(env!("CARGO_BIN_EXE_fixpoint"));
    c.args(args).current_dir(dir).env_remove("FIXPOINT_DB").env_remove("FIXPOINT_FAIL_AT").env_remove("FIXPOINT_TEST_MODE");
    for k in ["OPENLINEAGE_URL", "OPENLINEAGE_PARENT_ID", "OPENLINEAGE_ROOT_PARENT_ID", "OPENLINEAGE_NAMESPACE", "FIXPOINT_ATTEMPT"] {
        c.env_remove(k);
    }
    for (k, v) in env {
        c.env(k, v);
    }
    let o = c.output().expect("runs");
    Out { code: o.status.code().unwrap_or(-1), stdout: String::from_utf8_lossy(&o.stdout).into_owned(), stderr: String::from_utf8_lossy(&o.stderr).into_owned() }
}

#[test]
fn lineage_events_name_each_run_and_a_dead_endpoint_never_fails_it() {
    let tmp = tempfile::tempdir().unwrap();
    setup(tmp.path());
    let run = |extra: &[&str], env: &[(&str, &str)]| {
        let mut args = vec!["run", "job.toml", "--date", "2026-10-20", "--db", "duckdb:w.duckdb", "--output", "json", "--lineage-file", "events.jsonl"];
        args.extend_from_slice(extra);
        let out = fixpoint_env(tmp.path(), &args, env);
        assert_eq!(out.code, 0, "{}", out.stderr);
        serde_json::from_str::<serde_json::Value>(&out.stdout).unwrap()
    };
    let first = run(&[], &[]);
    let again = run(&[], &[]);
    let retry = run(&["--attempt", "2"], &[]);
    // An endpoint nothing listens on: the run succeeds, stderr says what was lost.
    let dead = fixpoint_env(
        tmp.path(),
        &["run", "job.toml", "--date", "2026-10-20", "--db", "duckdb:w.duckdb", "--force"],
        &[("OPENLINEAGE_URL", "http://127.0.0.1:9"), ("FIXPOINT_LINEAGE_TIMEOUT_MS", "2000")],
    );
    assert_eq!(dead.code, 0, "{}", dead.stderr);
    assert!(dead.stderr.contains("lineage") && dead.stderr.contains("not delivered"), "{}", dead.stderr);
    let events: Vec<serde_json::Value> =
        std::fs::read_to_string(tmp.path().join("events.jsonl")).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let kinds: Vec<&str> = events.iter().map(|e| e["eventType"].as_str().unwrap()).collect();
    assert_eq!(kinds, ["START", "COMPLETE", "START", "COMPLETE", "START", "COMPLETE"]);
    let ids: Vec<&str> = events.iter().map(|e| e["run"]["runId"].as_str().unwrap()).collect();
    assert!(ids[0] == ids[1] && ids[1] == ids[2] && ids[2] == ids[3], "one attempt, one id: {ids:?}");
    assert!(ids[4] == ids[5] && ids[4] != ids[0], "the next attempt, another id: {ids:?}");
    let fx = &events[1]["run"]["facets"]["fixpoint"];
    assert_eq!(fx["runKey"], first["run_key"]);
    assert_eq!(fx["output"]["checksum"], first["output"]["checksum"]);
    assert_eq!(events[3]["run"]["facets"]["fixpoint"]["skipped"], true);
    assert_eq!(again["outcome"], "skipped");
    assert_eq!(retry["outcome"], "skipped");
    assert_eq!(events[0]["job"]["name"], "silver_orders");
    assert_eq!(events[0]["job"]["namespace"], "fixpoint");
    let out = &events[1]["outputs"][0];
    assert!(out["namespace"].as_str().unwrap().starts_with("duckdb:///"), "{out}");
    assert_eq!(out["name"], "w.silver.orders");
    assert_eq!(events[0]["inputs"][0]["name"], "w.bronze.orders");
    // A malformed setting is refused before the run.
    let bad = fixpoint_env(tmp.path(), &["run", "job.toml", "--date", "2026-10-20", "--db", "duckdb:w.duckdb", "--lineage-file", "missing/e.jsonl"], &[]);
    assert_eq!(bad.code, 2, "{}", bad.stderr);
    assert!(bad.stderr.contains("missing"), "{}", bad.stderr);
}

#[test]
fn lineage_names_a_file_sources_files_as_its_inputs() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    std::fs::create_dir_all(dir.join("bronze/dt=2026-10-20")).unwrap();
    std::fs::write(dir.join("bronze/dt=2026-10-20/a.csv"), "order_id,order_total\n1,1.50\n").unwrap();
    std::fs::write(dir.join("bronze/dt=2026-10-20/b.csv"), "order_id,order_total\n2,2.50\n").unwrap();
    std::fs::write(
        dir.join("job.toml"),
        "name = \"csv_orders\"\ntarget = \"silver.orders\"\nstrategy = \"replace_partition\"\npartition = \"dt\"\n\n[source]\nfiles = \"bronze/dt={run_date}/*.csv\"\n",
    )
    .unwrap();
    let out = fixpoint_env(dir, &["run", "job.toml", "--date", "2026-10-20", "--db", "duckdb:w.duckdb", "--lineage-file", "events.jsonl"], &[]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    let events: Vec<serde_json::Value> =
        std::fs::read_to_string(dir.join("events.jsonl")).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let complete = events.iter().find(|e| e["eventType"] == "COMPLETE").expect("a COMPLETE event");
    let real = dir.canonicalize().unwrap();
    let names: Vec<(String, String)> = complete["inputs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| (i["namespace"].as_str().unwrap().to_owned(), std::fs::canonicalize(i["name"].as_str().unwrap()).unwrap().display().to_string()))
        .collect();
    let file = |f: &str| ("file".to_owned(), real.join("bronze/dt=2026-10-20").join(f).display().to_string());
    assert_eq!(names, [file("a.csv"), file("b.csv")], "the day's files, not the `input` relation: {complete}");
    assert_eq!(complete["outputs"][0]["outputFacets"]["outputStatistics"]["rowCount"], 2);
}
