//! The rough edges a new user hits (issue "Wrong input never changes
//! data"), as the built binary shows them: the exit code, stdout and
//! stderr, and the database read back with plain SQL (the duckdb crate).

use std::io::{BufRead, BufReader, Read};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

struct Out {
    code: i32,
    stdout: String,
    stderr: String,
}

const DB: &str = "duckdb:w.duckdb";

/// The binary in `dir`, with none of fixpoint's variables from the caller.
fn command(dir: &Path, args: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_fixpoint"));
    c.args(args)
        .current_dir(dir)
        .env_remove("FIXPOINT_DB")
        .env_remove("FIXPOINT_FAIL_AT")
        .env_remove("FIXPOINT_FAIL_MODE")
        .env_remove("FIXPOINT_TEST_MODE")
        .env_remove("FIXPOINT_TRACE");
    c
}

fn output(c: &mut Command) -> Out {
    let o = c.stdin(Stdio::null()).output().expect("runs");
    Out {
        code: o.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&o.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
    }
}

fn fixpoint(dir: &Path, args: &[&str]) -> Out {
    output(&mut command(dir, args))
}

fn json(out: &Out) -> serde_json::Value {
    serde_json::from_str(&out.stdout).unwrap_or_else(|e| panic!("stdout is not JSON ({e}):\n{}\nstderr:\n{}", out.stdout, out.stderr))
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
                                          (3, 3.50, 'c', DATE '2026-10-20'), (4, 9.99, 'it''s', DATE '2026-10-20'),
                                          (5, 5.50, 'd', DATE '2026-10-21');",
    )
    .unwrap();
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

/// One column of strings from a query on w.duckdb (plain SQL).
fn strings(dir: &Path, sql: &str) -> Vec<String> {
    let db = duckdb::Connection::open(dir.join("w.duckdb")).unwrap();
    let mut stmt = db.prepare(sql).unwrap();
    let rows = stmt.query_map([], |r| r.get::<_, String>(0)).unwrap();
    rows.map(|r| r.unwrap()).collect()
}

fn has_table(dir: &Path, schema: &str, table: &str) -> bool {
    !strings(dir, &format!("SELECT table_name FROM duckdb_tables() WHERE schema_name = '{schema}' AND table_name = '{table}'")).is_empty()
}

// 1. status exits 4 when a date needs attention.

#[test]
fn status_exits_4_when_a_date_needs_attention_and_0_when_every_date_is_ok() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    setup(dir);
    let b = fixpoint(dir, &["backfill", "job.toml", "--from", "2026-10-19", "--to", "2026-10-20", "--db", DB]);
    assert_eq!(b.code, 0, "{}", b.stderr);
    let loaded = everything(dir);

    let ok = fixpoint(dir, &["status", "job.toml", "--db", DB]);
    assert_eq!(ok.code, 0, "{}\n{}", ok.stdout, ok.stderr);
    assert!(ok.stdout.contains("silver_orders: 2 dates, 0 need attention"), "{}", ok.stdout);
    assert!(!ok.stderr.contains("error"), "{}", ok.stderr);
    let ok_json = fixpoint(dir, &["status", "job.toml", "--db", DB, "--output", "json"]);
    assert_eq!(ok_json.code, 0, "{}", ok_json.stderr);
    let v = json(&ok_json);
    assert_eq!((v["need_attention"].as_u64(), v["exit_code"].as_u64()), (Some(0), Some(0)), "{v}");

    // A date never loaded: missing.
    let missing = fixpoint(dir, &["status", "job.toml", "--from", "2026-10-19", "--to", "2026-10-21", "--db", DB]);
    assert_eq!(missing.code, 4, "{}\n{}", missing.stdout, missing.stderr);
    assert!(missing.stdout.contains("MISSING"), "{}", missing.stdout);
    assert!(missing.stdout.contains("silver_orders: 3 dates, 1 need attention"), "{}", missing.stdout);
    assert!(missing.stderr.contains("error: 1 of 3 date(s) of job silver_orders need attention"), "{}", missing.stderr);
    assert!(missing.stderr.contains("exit code 4"), "{}", missing.stderr);
    assert_eq!(everything(dir), loaded, "status changes nothing");

    // The target changed by hand: drift.
    {
        let db = duckdb::Connection::open(dir.join("w.duckdb")).unwrap();
        db.execute_batch("UPDATE silver.orders SET order_total = 0 WHERE order_id = 2").unwrap();
    }
    let drifted = everything(dir);
    let drift = fixpoint(dir, &["status", "job.toml", "--db", DB, "--output", "json"]);
    assert_eq!(drift.code, 4, "{}", drift.stderr);
    let v = json(&drift);
    let states: Vec<&str> = v["dates"].as_array().unwrap().iter().map(|d| d["state"].as_str().unwrap()).collect();
    assert_eq!(states, ["ok", "drift"], "{v}");
    assert_eq!((v["need_attention"].as_u64(), v["exit_code"].as_u64()), (Some(1), Some(4)), "{v}");
    assert!(drift.stderr.contains("error: 1 of 2 date(s) of job silver_orders need attention"), "{}", drift.stderr);
    assert_eq!(everything(dir), drifted, "status changes nothing");

    // A late row upstream: the source changed.
    {
        let db = duckdb::Connection::open(dir.join("w.duckdb")).unwrap();
        db.execute_batch("INSERT INTO bronze.orders VALUES (6, 6.50, 'late', DATE '2026-10-19')").unwrap();
    }
    let late = everything(dir);
    let changed = fixpoint(dir, &["status", "job.toml", "--from", "2026-10-19", "--to", "2026-10-19", "--db", DB, "--output", "json"]);
    assert_eq!(changed.code, 4, "{}", changed.stderr);
    let v = json(&changed);
    assert_eq!(v["dates"][0]["state"], "source_changed", "{v}");
    assert_eq!(everything(dir), late, "status changes nothing");
}

// 2. lint reports every file.

#[test]
fn lint_reports_every_file_and_goes_on_after_one_it_cannot_read() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    std::fs::write(dir.join("good.toml"), JOB).unwrap();
    std::fs::write(dir.join("clock.toml"), JOB.replace("order_total, dt", "order_total, now() AS seen_at, dt")).unwrap();
    std::fs::write(dir.join("broken.toml"), JOB.replace("name = \"silver_orders\"", "name = \"silver_orders")).unwrap();
    std::fs::write(dir.join("sql.toml"), JOB.replace("FROM bronze.orders", "FROM")).unwrap();
    let files = ["good.toml", "missing.toml", "clock.toml", "broken.toml", "sql.toml"];
    let mut args = vec!["lint"];
    args.extend(files);

    let text = fixpoint(dir, &args);
    assert_eq!(text.code, 2, "{}\n{}", text.stdout, text.stderr);
    // The readable files are linted: the clock is found in clock.toml.
    assert!(text.stdout.contains("clock.toml:") && text.stdout.contains("error[clock]"), "{}", text.stdout);
    assert!(text.stdout.contains("5 file(s): 1 error(s), "), "{}", text.stdout);
    assert!(text.stdout.contains(" warning(s); 3 file(s) could not be linted (see stderr)"), "{}", text.stdout);
    // Each file that could not be linted is named, with its error, in order.
    let at = |needle: &str| text.stderr.find(needle).unwrap_or_else(|| panic!("{needle:?} in:\n{}", text.stderr));
    let missing = at("error: missing.toml: (file): cannot read the job file");
    let broken = at("error: broken.toml: ");
    let sql = at("error: sql.toml: ");
    assert!(missing < broken && broken < sql, "in the order given:\n{}", text.stderr);
    assert!(text.stderr[sql..].contains("source.sql"), "{}", text.stderr);
    assert!(!text.stderr.contains("good.toml") && !text.stderr.contains("error: clock.toml"), "{}", text.stderr);

    let mut json_args = args.clone();
    json_args.extend(["--output", "json"]);
    let out = fixpoint(dir, &json_args);
    assert_eq!(out.code, 2, "{}", out.stderr);
    let v = json(&out);
    let listed: Vec<&str> = v["files"].as_array().unwrap().iter().map(|f| f["file"].as_str().unwrap()).collect();
    assert_eq!(listed, files, "every file, in order: {v}");
    assert!(v["files"][0]["findings"].is_array(), "{v}");
    assert_eq!(v["files"][2]["findings"][0]["rule"], "clock", "{v}");
    for i in [1, 3, 4] {
        let e = &v["files"][i]["error"];
        assert_eq!((e["class"].as_str(), e["exit_code"].as_u64()), (Some("input"), Some(2)), "{v}");
        assert!(e["message"].as_str().unwrap().starts_with(files[i]), "the message names the file: {v}");
    }
    assert_eq!((v["errors"].as_u64(), v["failed"].as_u64()), (Some(1), Some(3)), "{v}");

    // Readable files only: the lint errors decide, as before.
    let clean = fixpoint(dir, &["lint", "good.toml"]);
    assert_eq!(clean.code, 0, "{}", clean.stderr);
    assert!(clean.stdout.contains("1 file(s): 0 error(s), ") && !clean.stdout.contains("could not be linted"), "{}", clean.stdout);
    let dirty = fixpoint(dir, &["lint", "good.toml", "clock.toml"]);
    assert_eq!(dirty.code, 2, "{}", dirty.stderr);
    assert!(!dirty.stderr.contains("error:"), "lint errors are data, on stdout: {}", dirty.stderr);
}

// 3. runs --job with a job that has no runs.

#[test]
fn runs_of_a_job_without_runs_names_the_jobs_that_have_some() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    setup(dir);
    let r = fixpoint(dir, &["run", "job.toml", "--date", "2026-10-20", "--db", DB]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    let before = everything(dir);

    let typo = fixpoint(dir, &["runs", "--job", "silver_order", "--db", DB]);
    assert_eq!(typo.code, 2, "{}\n{}", typo.stdout, typo.stderr);
    assert!(typo.stdout.is_empty(), "{}", typo.stdout);
    assert!(typo.stderr.contains("error: no runs of job silver_order in the ledger; jobs with runs: silver_orders"), "{}", typo.stderr);
    assert!(typo.stderr.contains("hint: --job takes the job's name"), "{}", typo.stderr);
    let typo_json = fixpoint(dir, &["runs", "--job", "silver_order", "--db", DB, "--output", "json"]);
    assert_eq!(typo_json.code, 2);
    let v = json(&typo_json);
    assert_eq!((v["error"]["class"].as_str(), v["error"]["exit_code"].as_u64()), (Some("input"), Some(2)), "{v}");
    assert!(v["error"]["message"].as_str().unwrap().contains("jobs with runs: silver_orders"), "{v}");

    let known = fixpoint(dir, &["runs", "--job", "silver_orders", "--db", DB, "--output", "json"]);
    assert_eq!(known.code, 0, "{}", known.stderr);
    assert_eq!(json(&known)["runs"].as_array().unwrap().len(), 1);
    let none_asked = fixpoint(dir, &["runs", "--job", "silver_orders", "--limit", "0", "--db", DB]);
    assert_eq!(none_asked.code, 0, "--limit 0 lists nothing, and that is no error: {}", none_asked.stderr);
    assert_eq!(everything(dir), before, "runs changes nothing");

    // An empty ledger: an empty list without --job; with --job, the typo hint.
    let empty = fixpoint(dir, &["runs", "--db", "duckdb:empty.duckdb", "--output", "json"]);
    assert_eq!(empty.code, 0, "{}", empty.stderr);
    assert_eq!(json(&empty)["runs"], serde_json::json!([]));
    assert!(empty.stderr.contains("has no runs yet"), "{}", empty.stderr);
    let empty_text = fixpoint(dir, &["runs", "--db", "duckdb:empty.duckdb"]);
    assert_eq!(empty_text.code, 0, "{}", empty_text.stderr);
    let nobody = fixpoint(dir, &["runs", "--job", "x", "--db", "duckdb:empty.duckdb"]);
    assert_eq!(nobody.code, 2, "{}", nobody.stderr);
    assert!(nobody.stderr.contains("error: no runs of job x in the ledger; the ledger in duckdb:empty.duckdb has no runs yet"), "{}", nobody.stderr);
}

// 4. fingerprint --where naming a missing column; a --db in a missing folder.

#[test]
fn a_where_on_a_missing_column_and_a_db_in_a_missing_folder_exit_2_with_a_hint() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    setup(dir);
    let before = everything(dir);

    let col = fixpoint(dir, &["fingerprint", "bronze.orders", "--where", "nope = 1", "--db", DB]);
    assert_eq!(col.code, 2, "{}\n{}", col.stdout, col.stderr);
    assert!(col.stdout.is_empty(), "{}", col.stdout);
    assert!(col.stderr.contains("error: --where: \"nope = 1\" does not run on bronze.orders"), "{}", col.stderr);
    assert!(col.stderr.contains("nope"), "{}", col.stderr);
    assert!(col.stderr.contains("hint: the condition may use the columns of bronze.orders: order_id, order_total, note, dt"), "{}", col.stderr);
    assert!(!col.stderr.contains("SELECT") && !col.stderr.contains("LINE 1"), "no generated SQL: {}", col.stderr);
    let col_json = fixpoint(dir, &["fingerprint", "bronze.orders", "--where", "nope = 1", "--db", DB, "--output", "json"]);
    assert_eq!(col_json.code, 2);
    let v = json(&col_json);
    assert_eq!((v["error"]["class"].as_str(), v["error"]["exit_code"].as_u64()), (Some("input"), Some(2)), "{v}");
    // A value of the wrong type is the condition's fault too.
    let ty = fixpoint(dir, &["fingerprint", "bronze.orders", "--where", "dt = 'not a date'", "--db", DB]);
    assert_eq!(ty.code, 2, "{}", ty.stderr);
    assert!(ty.stderr.contains("error: --where: "), "{}", ty.stderr);
    // A good condition still works.
    let good = fixpoint(dir, &["fingerprint", "bronze.orders", "--where", "dt = DATE '2026-10-20'", "--db", DB, "--output", "json"]);
    assert_eq!(good.code, 0, "{}", good.stderr);
    assert_eq!(json(&good)["rows"], 3);

    for args in [
        &["fingerprint", "bronze.orders", "--db", "duckdb:no/such/w.duckdb"][..],
        &["run", "job.toml", "--date", "2026-10-20", "--db", "duckdb:no/such/w.duckdb"][..],
        &["status", "job.toml", "--from", "2026-10-20", "--to", "2026-10-20", "--db", "duckdb:no/such/w.duckdb"][..],
    ] {
        let out = fixpoint(dir, args);
        assert_eq!(out.code, 2, "{args:?}: {}", out.stderr);
        assert!(out.stderr.contains("the folder no/such does not exist; create it or fix --db"), "{args:?}: {}", out.stderr);
        assert!(out.stderr.contains("hint: "), "{args:?}: {}", out.stderr);
        assert!(out.stdout.is_empty(), "{args:?}: {}", out.stdout);
        assert!(!dir.join("no").exists(), "{args:?}: no folder created");
    }
    let json_out = fixpoint(dir, &["run", "job.toml", "--date", "2026-10-20", "--db", "duckdb:no/such/w.duckdb", "--output", "json"]);
    assert_eq!(json_out.code, 2);
    assert_eq!(json(&json_out)["error"]["class"], "input");
    std::fs::write(dir.join("plain"), "a file, not a folder").unwrap();
    let file = fixpoint(dir, &["fingerprint", "bronze.orders", "--db", "duckdb:plain/w.duckdb"]);
    assert_eq!(file.code, 2, "{}", file.stderr);
    assert!(file.stderr.contains("the folder plain is not a folder; create it or fix --db"), "{}", file.stderr);
    assert_eq!(everything(dir), before, "nothing changed");
}

// 5. The default database is announced when it is created.

#[test]
fn the_default_database_is_announced_when_it_is_created() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let here = dir.canonicalize().unwrap();
    let note = format!("fixpoint: creating DuckDB database fixpoint.duckdb in {} (no --db given)", here.display());

    let first = fixpoint(dir, &["runs"]);
    assert_eq!(first.code, 0, "{}", first.stderr);
    assert!(first.stderr.contains(&note), "{note:?} in:\n{}", first.stderr);
    assert!(dir.join("fixpoint.duckdb").exists());
    let again = fixpoint(dir, &["runs"]);
    assert_eq!(again.code, 0, "{}", again.stderr);
    assert!(!again.stderr.contains("creating DuckDB database"), "it exists now: {}", again.stderr);

    // Named by FIXPOINT_DB or --db: no note.
    let env = output(command(dir, &["runs"]).env("FIXPOINT_DB", "duckdb:other.duckdb"));
    assert_eq!(env.code, 0, "{}", env.stderr);
    assert!(!env.stderr.contains("creating DuckDB database"), "{}", env.stderr);
    assert!(dir.join("other.duckdb").exists());
    let flag = fixpoint(dir, &["runs", "--db", "duckdb:third.duckdb"]);
    assert_eq!(flag.code, 0, "{}", flag.stderr);
    assert!(!flag.stderr.contains("creating DuckDB database"), "{}", flag.stderr);

    // A run in a fresh folder says it too (then fails: no bronze.orders there).
    let fresh = tempfile::tempdir().unwrap();
    std::fs::write(fresh.path().join("job.toml"), JOB).unwrap();
    let run = fixpoint(fresh.path(), &["run", "job.toml", "--date", "2026-10-20"]);
    let note = format!("fixpoint: creating DuckDB database fixpoint.duckdb in {} (no --db given)", fresh.path().canonicalize().unwrap().display());
    assert!(run.stderr.contains(&note), "{note:?} in:\n{}", run.stderr);
    assert_eq!(run.code, 2, "{}", run.stderr);
}

// 6. Absurd ranges.

#[test]
fn absurd_ranges_and_run_counts_are_refused_unless_raised() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    setup(dir);
    let before = everything(dir);
    let span = |from: (i32, u32, u32), to: (i32, u32, u32)| -> i64 {
        let day = |(y, m, d): (i32, u32, u32)| chrono::NaiveDate::from_ymd_opt(y, m, d).unwrap();
        day(to).signed_duration_since(day(from)).num_days() + 1
    };

    // A mistyped year: 2062 for 2026.
    let n = span((2026, 10, 19), (2062, 10, 19));
    let started = Instant::now();
    let typo = fixpoint(dir, &["backfill", "job.toml", "--from", "2026-10-19", "--to", "2062-10-19", "--db", DB]);
    assert_eq!(typo.code, 2, "{}\n{}", typo.stdout, typo.stderr);
    assert!(
        typo.stderr.contains(&format!("error: 2026-10-19 … 2062-10-19 is {n} dates, more than --max-dates 3660 (ten years by default): is a year mistyped?")),
        "{}",
        typo.stderr
    );
    assert!(typo.stderr.contains(&format!("hint: check --from and --to; to take that many dates on purpose, pass --max-dates {n}")), "{}", typo.stderr);
    assert!(typo.stdout.is_empty(), "{}", typo.stdout);
    let typo_json = fixpoint(dir, &["backfill", "job.toml", "--from", "2026-10-19", "--to", "2062-10-19", "--db", DB, "--output", "json"]);
    assert_eq!(typo_json.code, 2);
    assert_eq!(json(&typo_json)["error"]["class"], "input");
    assert_eq!(everything(dir), before, "nothing ran");

    // status over millions of dates: refused at once, not built.
    let huge = fixpoint(dir, &["status", "job.toml", "--from", "2026-10-19", "--to", "9999-12-31", "--db", DB]);
    assert_eq!(huge.code, 2, "{}", huge.stderr);
    assert!(huge.stderr.contains("more than --max-dates 3660"), "{}", huge.stderr);
    assert!(started.elapsed() < Duration::from_secs(60), "refused before any work: {:?}", started.elapsed());
    assert_eq!(everything(dir), before);

    // --max-dates sets the cap, both ways.
    let small = fixpoint(dir, &["backfill", "job.toml", "--from", "2026-10-19", "--to", "2026-10-20", "--max-dates", "1", "--db", DB]);
    assert_eq!(small.code, 2, "{}", small.stderr);
    assert!(small.stderr.contains("2026-10-19 … 2026-10-20 is 2 dates, more than --max-dates 1"), "{}", small.stderr);
    assert!(small.stderr.contains("pass --max-dates 2"), "{}", small.stderr);
    assert_eq!(everything(dir), before);
    let status_small = fixpoint(dir, &["status", "job.toml", "--from", "2026-10-19", "--to", "2026-10-20", "--max-dates", "1", "--db", DB]);
    assert_eq!(status_small.code, 2, "{}", status_small.stderr);
    assert!(status_small.stderr.contains("is 2 dates, more than --max-dates 1"), "{}", status_small.stderr);
    let raised = fixpoint(dir, &["backfill", "job.toml", "--from", "2026-10-19", "--to", "2026-10-20", "--max-dates", "2", "--db", DB]);
    assert_eq!(raised.code, 0, "{}", raised.stderr);
    assert!(raised.stdout.contains("2 committed"), "{}", raised.stdout);
    let status_raised = fixpoint(dir, &["status", "job.toml", "--from", "2026-10-19", "--to", "2026-10-20", "--max-dates", "2", "--db", DB]);
    assert_eq!(status_raised.code, 0, "{}", status_raised.stderr);
    let loaded = everything(dir);

    // prove --runs: at most 100.
    let runs = fixpoint(dir, &["prove", "job.toml", "--date", "2026-10-20", "--runs", "101", "--db", DB]);
    assert_eq!(runs.code, 2, "{}", runs.stderr);
    assert!(runs.stderr.contains("error: --runs 101: at most 100 runs"), "{}", runs.stderr);
    assert!(runs.stderr.contains("hint: "), "{}", runs.stderr);
    assert_eq!(everything(dir), loaded, "no proof ran");
}

// 7. Ctrl-C during run and backfill.

/// A job whose 2026-10-20 never finishes (a recursive query counting to 50
/// million, one row at a time); its other dates are quick.
const SLOW: &str = r#"name = "slow_orders"
target = "silver.slow"
strategy = "replace_partition"
partition = "dt"

[source]
sql = """
WITH RECURSIVE spin(i) AS (
    SELECT 0
    UNION ALL
    SELECT i + 1 FROM spin WHERE i < CASE WHEN :run_date = DATE '2026-10-20' THEN 50000000 ELSE 0 END
)
SELECT order_id, order_total, dt FROM bronze.orders
WHERE dt = :run_date AND (SELECT max(i) FROM spin) >= 0
"""
"#;

/// Runs the binary with `FIXPOINT_TRACE=1` (each step of a run on stderr),
/// sends it SIGINT once `ready` holds for the stderr lines so far (or,
/// with `ready_after`, that long after the start) and then `settle` holds
/// (or two seconds passed), and waits for it to end.
#[cfg(unix)]
fn interrupted(
    dir: &Path,
    args: &[&str],
    ready: impl Fn(&[String]) -> bool,
    ready_after: Option<Duration>,
    settle: impl Fn(&[String]) -> bool,
) -> Out {
    use std::os::unix::process::CommandExt;
    use std::sync::mpsc::RecvTimeoutError;
    let mut c = command(dir, args);
    c.env("FIXPOINT_TRACE", "1").stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
    // SAFETY: signal(2) is async-signal-safe. Ctrl-C reaches the child with
    // its default disposition, whatever the test runner's is.
    unsafe {
        c.pre_exec(|| {
            libc::signal(libc::SIGINT, libc::SIG_DFL);
            Ok(())
        });
    }
    let mut child = c.spawn().expect("spawns");
    let stderr = child.stderr.take().unwrap();
    let mut stdout = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel::<String>();
    let errs = std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let outs = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stdout.read_to_string(&mut s);
        s
    });
    let mut lines: Vec<String> = Vec::new();
    let started = Instant::now();
    let deadline = started + Duration::from_secs(180);
    let mut ready_at: Option<Instant> = None;
    loop {
        match rx.recv_timeout(Duration::from_millis(50)) {
            Ok(l) => lines.push(l),
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => {
                let status = child.wait().unwrap();
                panic!("fixpoint ended ({status}) before it was interrupted; stderr:\n{}", lines.join("\n"));
            }
        }
        if ready_at.is_none() && (ready(lines.as_slice()) || ready_after.is_some_and(|d| started.elapsed() > d)) {
            ready_at = Some(Instant::now());
        }
        if let Some(at) = ready_at {
            if settle(lines.as_slice()) || at.elapsed() > Duration::from_secs(2) {
                break;
            }
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("not ready within 180 s; stderr:\n{}", lines.join("\n"));
        }
    }
    std::thread::sleep(Duration::from_millis(300));
    // SAFETY: kill(2) on our own child's process id.
    let sent = unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGINT) };
    assert_eq!(sent, 0, "SIGINT sent");
    let stop = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if Instant::now() > stop {
            let _ = child.kill();
            let _ = child.wait();
            panic!("still running 60 s after Ctrl-C; stderr:\n{}", lines.join("\n"));
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let _ = errs.join();
    while let Ok(l) = rx.try_recv() {
        lines.push(l);
    }
    Out { code: status.code().unwrap_or(-1), stdout: outs.join().unwrap(), stderr: lines.join("\n") }
}

#[cfg(unix)]
fn count(lines: &[String], prefix: &str) -> usize {
    lines.iter().filter(|l| l.starts_with(prefix)).count()
}

#[cfg(unix)]
#[test]
fn ctrl_c_during_a_backfill_lists_the_committed_rolled_back_and_not_started_dates() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    setup(dir);
    std::fs::write(dir.join("slow.toml"), SLOW).unwrap();
    let out = interrupted(
        dir,
        &["backfill", "slow.toml", "--from", "2026-10-19", "--to", "2026-10-21", "--allow-nondeterministic", "--db", DB],
        // 2026-10-19 committed …
        |lines| count(lines, "fixpoint: commit") >= 1,
        None,
        // … and 2026-10-20 started.
        |lines| count(lines, "fixpoint: describe source") >= 2,
    );
    assert_eq!(out.code, 130, "stdout:\n{}\nstderr:\n{}", out.stdout, out.stderr);
    for needle in [
        "error: interrupted (Ctrl-C): the backfill of slow_orders stopped; each date is its own transaction",
        "  committed: 2026-10-19 (1 date)",
        "  rolled back: 2026-10-20 (in progress when interrupted: nothing of it was committed)",
        "  not started: 2026-10-21 (1 date)",
        "hint: run the same backfill again to finish it: the committed dates are skipped",
    ] {
        assert!(out.stderr.contains(needle), "{needle:?} in:\n{}", out.stderr);
    }
    assert!(out.stdout.is_empty(), "no summary after an interrupt: {}", out.stdout);
    // Read back: 2026-10-19 and its ledger row, nothing of the others.
    assert_eq!(strings(dir, "SELECT DISTINCT CAST(dt AS VARCHAR) FROM silver.slow ORDER BY 1"), ["2026-10-19"]);
    assert_eq!(strings(dir, "SELECT CAST(run_date AS VARCHAR) FROM fixpoint.runs ORDER BY 1"), ["2026-10-19"]);
}

#[cfg(unix)]
#[test]
fn ctrl_c_during_a_run_rolls_it_back_and_exits_130() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    setup(dir);
    std::fs::write(dir.join("slow.toml"), SLOW).unwrap();
    let quick = fixpoint(dir, &["run", "slow.toml", "--date", "2026-10-19", "--allow-nondeterministic", "--db", DB]);
    assert_eq!(quick.code, 0, "{}", quick.stderr);
    let before = everything(dir);
    assert!(has_table(dir, "silver", "slow") && has_table(dir, "fixpoint", "runs"), "{before:?}");

    let out = interrupted(
        dir,
        &["run", "slow.toml", "--date", "2026-10-20", "--allow-nondeterministic", "--db", DB, "--output", "json"],
        // The run started (the interrupt is taken over before the database
        // is opened: any moment after that is a run not committed).
        |lines| count(lines, "fixpoint: describe source") >= 1,
        Some(Duration::from_secs(15)),
        |_| true,
    );
    assert_eq!(out.code, 130, "stdout:\n{}\nstderr:\n{}", out.stdout, out.stderr);
    assert!(
        out.stderr.contains("error: interrupted (Ctrl-C): the run of slow_orders for 2026-10-20 was rolled back: nothing was committed, the target and the ledger are as they were"),
        "{}",
        out.stderr
    );
    assert!(out.stderr.contains("hint: run it again"), "{}", out.stderr);
    let v = json(&out);
    assert_eq!(v["error"]["class"], "interrupted", "{v}");
    assert_eq!(v["error"]["exit_code"], 130, "{v}");
    assert_eq!((v["error"]["run_date"].as_str(), v["error"]["committed"].as_bool()), (Some("2026-10-20"), Some(false)), "{v}");
    assert_eq!(everything(dir), before, "the target and the ledger are as they were");
}

// 8. The backfill's progress line fits 80 columns.

/// `s` without terminal escape sequences.
fn strip_escapes(s: &str) -> String {
    let mut out = String::new();
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c != '\x1b' {
            out.push(c);
            continue;
        }
        match chars.next() {
            // CSI: parameters, then one final byte in @..~.
            Some('[') => {
                for c in chars.by_ref() {
                    if ('@'..='~').contains(&c) {
                        break;
                    }
                }
            }
            // OSC: up to BEL or ESC \.
            Some(']') => {
                while let Some(c) = chars.next() {
                    if c == '\x07' {
                        break;
                    }
                    if c == '\x1b' {
                        chars.next();
                        break;
                    }
                }
            }
            _ => {}
        }
    }
    out
}

#[test]
fn the_backfill_progress_line_fits_80_columns() {
    // The bar is drawn on a terminal only: run the backfill under `script`
    // (util-linux), in a pseudo-terminal 200 columns wide.
    if !Command::new("script").arg("--version").output().is_ok_and(|o| o.status.success()) {
        eprintln!("skipped: no `script` (util-linux) to give the backfill a terminal");
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    setup(dir);
    // Days without rows load as empty days.
    std::fs::write(dir.join("job.toml"), JOB.replace("min_rows = 1\n", "")).unwrap();
    let shell = "stty cols 200 rows 50 2>/dev/null; exec \"$FIXPOINT_BIN\" backfill job.toml --from 2026-09-01 --to 2026-10-21 --db duckdb:w.duckdb";
    let o = output(
        Command::new("script")
            .args(["-qec", shell, "/dev/null"])
            .current_dir(dir)
            .env("FIXPOINT_BIN", env!("CARGO_BIN_EXE_fixpoint"))
            .env_remove("FIXPOINT_DB")
            .env_remove("FIXPOINT_FAIL_AT")
            .env_remove("FIXPOINT_TEST_MODE")
            .env_remove("FIXPOINT_TRACE"),
    );
    let plain = strip_escapes(&o.stdout);
    let bars: Vec<&str> = plain.split(['\r', '\n']).filter(|l| l.contains(" dates, ") && l.contains(" rows, ")).collect();
    if o.code != 0 || bars.is_empty() {
        eprintln!("skipped: no progress line captured (script exit {}):\n{plain}\n{}", o.code, o.stderr);
        return;
    }
    for bar in &bars {
        let width = bar.trim_end().chars().count();
        assert!(width <= 80, "{width} columns: {bar:?}");
    }
    assert!(bars.iter().any(|b| b.contains("/51 dates, ")), "{bars:?}");
}

// 9. Argument errors under --output json.

#[test]
fn argument_errors_under_output_json_are_the_json_error_object() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    setup(dir);
    let before = everything(dir);
    let cases: &[(&[&str], &str)] = &[
        (&["run", "job.toml", "--date", "2026-10-20", "--frobnicate", "--db", DB, "--output", "json"], "unexpected argument '--frobnicate'"),
        (&["run", "job.toml", "--db", DB, "--output", "json", "--date"], "--date"),
        (&["runs", "--limit", "x", "--db", DB, "--output=json"], "--limit"),
        (&["backfill", "job.toml", "--output", "json", "--db", DB], "--from"),
    ];
    for (args, needle) in cases {
        let out = fixpoint(dir, args);
        assert_eq!(out.code, 2, "{args:?}: {}", out.stderr);
        let v = json(&out);
        assert_eq!((v["error"]["class"].as_str(), v["error"]["exit_code"].as_u64()), (Some("input"), Some(2)), "{args:?}: {v}");
        let message = v["error"]["message"].as_str().unwrap();
        assert!(message.contains(needle) && !message.starts_with("error:"), "{args:?}: {v}");
        assert!(v["error"]["hint"].is_string(), "{args:?}: {v}");
        assert!(out.stderr.contains("error: "), "clap's message stays on stderr: {args:?}: {}", out.stderr);
    }
    // Without --output json: clap's text on stderr, nothing on stdout.
    let text = fixpoint(dir, &["run", "job.toml", "--date", "2026-10-20", "--frobnicate", "--db", DB]);
    assert_eq!(text.code, 2);
    assert!(text.stdout.is_empty(), "{}", text.stdout);
    assert!(text.stderr.contains("error: unexpected argument '--frobnicate'"), "{}", text.stderr);
    // --help is no error, JSON or not.
    let help = fixpoint(dir, &["run", "--help", "--output", "json"]);
    assert_eq!(help.code, 0, "{}", help.stderr);
    assert!(help.stdout.contains("Usage:"), "{}", help.stdout);
    assert_eq!(everything(dir), before, "nothing changed");
}
