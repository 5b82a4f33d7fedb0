//! The `fixpoint` binary on a Delta warehouse (feature `delta`): runs,
//! skips, `runs`/`status`, and kill -9 before, at and after the commit,
//! checked by an independent reader (DuckDB over the files the log names,
//! read by this test, not fixpoint's views).
#![cfg(feature = "delta")]

mod delta {
    use std::path::Path;
    use std::process::{Command, Output};

    const JOB: &str = r#"name = "silver_orders"
target = "silver.orders"
strategy = "replace_partition"
partition = "dt"

[source]
sql = "SELECT order_id, order_total, dt FROM bronze.orders WHERE dt = :run_date"
"#;

    fn fixpoint(dir: &Path, args: &[&str], env: &[(&str, &str)]) -> Output {
        let mut c = Command::new(env!("CARGO_BIN_EXE_fixpoint"));
        c.args(args).current_dir(dir).env_remove("FIXPOINT_DB").env_remove("FIXPOINT_FAIL_AT").env_remove("FIXPOINT_TEST_MODE").env_remove("FIXPOINT_DELTA_FAULT");
        for (k, v) in env {
            c.env(k, v);
        }
        c.output().expect("runs")
    }

    /// The tests' Python (`FIXPOINT_TEST_PYTHON`, else the virtualenv
    /// `.ci/run` makes) when it has `module`; else `None` after saying
    /// `skipped` (under `CI=true` it must have it).
    fn python_with(module: &str) -> Option<String> {
        let py = std::env::var("FIXPOINT_TEST_PYTHON")
            .unwrap_or_else(|_| format!("{}/.cache/fixpoint/pyvenv/bin/python", std::env::var("HOME").unwrap_or_default()));
        let ok = Command::new(&py).args(["-c", &format!("import {module}")]).output().is_ok_and(|o| o.status.success());
        if !ok {
            assert_ne!(std::env::var("CI").as_deref(), Ok("true"), "{py} with {module} is missing under CI=true");
            eprintln!("skipped: no Python with {module} at {py} (set FIXPOINT_TEST_PYTHON, or create the virtualenv as .ci/run does)");
            return None;
        }
        Some(py)
    }

    /// The environment of a `fixpoint` process using the local S3 server:
    /// its endpoint, credentials (the secret given) and region, and `cache`
    /// as fixpoint's cache folder.
    fn s3_env<'a>(endpoint: &'a str, secret: &'a str, cache: &'a Path) -> Vec<(&'a str, &'a str)> {
        vec![
            ("AWS_ENDPOINT_URL", endpoint),
            ("AWS_ALLOW_HTTP", "true"),
            ("AWS_ACCESS_KEY_ID", "test"),
            ("AWS_SECRET_ACCESS_KEY", secret),
            ("AWS_REGION", "us-east-1"),
            ("FIXPOINT_CACHE_DIR", cache.to_str().unwrap()),
        ]
    }

    /// `label-<pid>-<nanoseconds>`: a prefix in the tests' bucket no other
    /// test uses.
    fn unique(label: &str) -> String {
        format!("{label}-{}-{}", std::process::id(), std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos())
    }

    fn json(o: &Output) -> serde_json::Value {
        serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{e}: {}\n{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr)))
    }

    /// The bronze table, written through the engine's library.
    fn setup(dir: &Path, total: &str) {
        std::fs::write(dir.join("job.toml"), JOB).unwrap();
        let mut w = fixpoint_delta::Delta::open(&dir.join("wh")).unwrap();
        use fixpoint_core::Engine;
        for stmt in [
            "DROP TABLE IF EXISTS bronze.orders".to_owned(),
            "CREATE TABLE bronze.orders (order_id BIGINT, order_total DECIMAL(12,2), dt DATE)".to_owned(),
            format!("INSERT INTO bronze.orders VALUES (1, 1.50, DATE '2026-10-19'), (2, {total}, DATE '2026-10-20'), (3, 3.50, DATE '2026-10-20')"),
        ] {
            w.execute(&fixpoint_core::job::sql::Sql::raw(stmt)).unwrap();
        }
    }

    /// The day's rows as the table's log makes them, read independently:
    /// the active files from the `_delta_log` JSON (adds minus removes),
    /// read by DuckDB.
    fn day_rows(table: &Path, day: &str) -> Vec<(i64, String)> {
        let mut active: Vec<(String, String)> = Vec::new();
        let mut logs: Vec<_> = std::fs::read_dir(table.join("_delta_log")).unwrap().flatten().map(|e| e.path()).filter(|p| p.extension().is_some_and(|x| x == "json")).collect();
        logs.sort();
        for log in logs {
            for line in std::fs::read_to_string(&log).unwrap().lines() {
                let a: serde_json::Value = serde_json::from_str(line).unwrap();
                if let Some(add) = a.get("add") {
                    active.push((add["path"].as_str().unwrap().to_owned(), add["partitionValues"]["dt"].as_str().unwrap_or("").to_owned()));
                }
                if let Some(rm) = a.get("remove") {
                    active.retain(|(p, _)| p != rm["path"].as_str().unwrap());
                }
            }
        }
        let files: Vec<String> = active.iter().filter(|(_, dt)| dt == day).map(|(p, _)| format!("'{}'", table.join(p.replace("%3A", ":")).display())).collect();
        if files.is_empty() {
            return Vec::new();
        }
        let db = duckdb::Connection::open_in_memory().unwrap();
        let mut st = db.prepare(&format!("SELECT order_id, CAST(order_total AS VARCHAR) FROM read_parquet([{}]) ORDER BY 1", files.join(", "))).unwrap();
        let rows = st.query_map([], |r| Ok((r.get::<_, i64>(0)?, r.get::<_, String>(1)?))).unwrap();
        rows.map(|r| r.unwrap()).collect()
    }

    fn ledger_rows(dir: &Path) -> Vec<serde_json::Value> {
        ledger_rows_of(dir, "delta:wh", &[])
    }

    fn ledger_rows_of(dir: &Path, db: &str, env: &[(&str, &str)]) -> Vec<serde_json::Value> {
        let o = fixpoint(dir, &["runs", "--db", db, "--output", "json"], env);
        assert_eq!(o.status.code(), Some(0), "{}", String::from_utf8_lossy(&o.stderr));
        json(&o)["runs"].as_array().cloned().unwrap()
    }

    #[test]
    fn delta_runs_skip_and_report_through_the_cli() {
        let tmp = tempfile::tempdir().unwrap();
        setup(tmp.path(), "2.50");
        let first = fixpoint(tmp.path(), &["run", "job.toml", "--date", "2026-10-20", "--db", "delta:wh", "--output", "json"], &[]);
        assert_eq!(first.status.code(), Some(0), "{}", String::from_utf8_lossy(&first.stderr));
        let r = json(&first);
        assert_eq!((r["outcome"].as_str(), r["rows_inserted"].as_u64()), (Some("committed"), Some(2)));
        let again = json(&fixpoint(tmp.path(), &["run", "job.toml", "--date", "2026-10-20", "--db", "delta:wh", "--output", "json"], &[]));
        assert_eq!(again["outcome"], "skipped");
        assert_eq!(day_rows(&tmp.path().join("wh/silver/orders"), "2026-10-20"), vec![(2, "2.50".into()), (3, "3.50".into())]);
        assert_eq!(ledger_rows(tmp.path()).len(), 1);
        let status = fixpoint(tmp.path(), &["status", "job.toml", "--from", "2026-10-20", "--to", "2026-10-20", "--db", "delta:wh", "--output", "json"], &[]);
        assert_eq!(status.status.code(), Some(0), "{}", String::from_utf8_lossy(&status.stdout));
        // A scheme other than a folder or s3:// is refused with exit 2 and the fix.
        let gs = fixpoint(tmp.path(), &["run", "job.toml", "--date", "2026-10-20", "--db", "delta:gs://bucket/wh"], &[]);
        assert_eq!(gs.status.code(), Some(2));
        assert!(String::from_utf8_lossy(&gs.stderr).contains("delta:s3://bucket/prefix"), "{}", String::from_utf8_lossy(&gs.stderr));
    }

    /// kill -9 before the commit (files written), right after it (before
    /// the ledger row), and at random moments: the day is the old one or
    /// the new one, the ledger (once a process has opened the warehouse)
    /// has the run's row exactly when the new day is visible, and the rerun
    /// converges.
    #[test]
    fn delta_kill_9_before_at_and_after_the_commit() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        setup(dir, "2.50");
        let ok = fixpoint(dir, &["run", "job.toml", "--date", "2026-10-20", "--db", "delta:wh"], &[]);
        assert!(ok.status.success(), "{}", String::from_utf8_lossy(&ok.stderr));
        let table = dir.join("wh/silver/orders");
        let killed = kill_9_trials(dir, "delta:wh", &[], true, 14, 900, &|total| setup(dir, total), &|| day_rows(&table, "2026-10-20"));
        assert!(killed >= 2, "at least the two aborts were kills: {killed}");
    }

    /// The same trials with a merge into the day's partition (the rewrite
    /// of the partitions the batch touches, its checks read off the ranked
    /// rows): the version grows with order 2's total, so each trial's batch
    /// updates order 2 and leaves order 3 as it is.
    #[test]
    fn delta_merge_kill_9_before_at_and_after_the_commit() {
        const MERGE_JOB: &str = r#"name = "silver_orders"
target = "silver.orders"
strategy = "merge"
key = ["order_id"]
version = "v"
partition = "dt"

[source]
sql = "SELECT order_id, order_total, dt, CAST(order_total * 100 AS BIGINT) AS v FROM bronze.orders WHERE dt = :run_date"
"#;
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        let bronze = |total: &str| {
            setup(dir, total);
            std::fs::write(dir.join("job.toml"), MERGE_JOB).unwrap();
        };
        bronze("2.50");
        let ok = fixpoint(dir, &["run", "job.toml", "--date", "2026-10-20", "--db", "delta:wh"], &[]);
        assert!(ok.status.success(), "{}", String::from_utf8_lossy(&ok.stderr));
        let table = dir.join("wh/silver/orders");
        assert_eq!(day_rows(&table, "2026-10-20"), vec![(2, "2.50".into()), (3, "3.50".into())]);
        let killed = kill_9_trials(dir, "delta:wh", &[], false, 14, 900, &bronze, &|| day_rows(&table, "2026-10-20"));
        assert!(killed >= 2, "at least the two aborts were kills: {killed}");
    }

    /// `trials` runs of the job on `db`, each over a new total of order 2
    /// (`bronze` writes it): the first aborted before its commit, the second
    /// right after it, the others killed (SIGKILL) after a pseudo-random
    /// wait of up to `max_ms`. After each: the day (`day` reads it
    /// independently) is the old one or the new one; the ledger, read by a
    /// new process (which writes a row lost after its commit), has as its
    /// newest row for the day the visible day; the rerun converges to the
    /// new day, skipping when it was already there (`skips`; a merge applies
    /// the batch again and changes nothing). Returns how many runs died by
    /// a signal.
    fn kill_9_trials(dir: &Path, db: &str, env: &[(&str, &str)], skips: bool, trials: u32, max_ms: u64, bronze: &dyn Fn(&str), day: &dyn Fn() -> Vec<(i64, String)>) -> u32 {
        let mut old = day();
        let mut seed: u64 = 0x9e3779b97f4a7c15;
        let mut killed = 0;
        for trial in 0..trials {
            let total = format!("{}.{:02}", 10 + trial, trial);
            bronze(&total);
            let new = vec![(2, total.clone()), (3, "3.50".to_owned())];
            let mut cmd = Command::new(env!("CARGO_BIN_EXE_fixpoint"));
            cmd.args(["run", "job.toml", "--date", "2026-10-20", "--db", db]).current_dir(dir).env("FIXPOINT_TEST_MODE", "1");
            cmd.env_remove("FIXPOINT_FAIL_AT").env_remove("FIXPOINT_DELTA_FAULT").env_remove("FIXPOINT_DB");
            for (k, v) in env {
                cmd.env(k, v);
            }
            cmd.stdout(std::process::Stdio::null()).stderr(std::process::Stdio::null());
            match trial {
                0 => {
                    cmd.env("FIXPOINT_FAIL_AT", "before_commit").env("FIXPOINT_FAIL_MODE", "abort");
                }
                1 => {
                    cmd.env("FIXPOINT_DELTA_FAULT", "abort_after_commit");
                }
                _ => {}
            }
            let mut child = cmd.spawn().unwrap();
            if trial >= 2 {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                std::thread::sleep(std::time::Duration::from_millis(seed % max_ms));
                let _ = child.kill();
            }
            let status = child.wait().unwrap();
            if status.code().is_none() {
                killed += 1;
            }
            let seen = day();
            assert!(seen == old || seen == new, "trial {trial}: the day is neither the old nor the new one: {seen:?}");
            if trial == 0 {
                assert_eq!(seen, old, "killed before its commit");
            }
            if trial == 1 {
                assert_eq!(seen, new, "killed after its commit");
            }
            let ledger = ledger_rows_of(dir, db, env);
            let newest = ledger.iter().filter(|e| e["run_date"] == "2026-10-20").max_by_key(|e| e["finished_at"].as_str().unwrap_or("").to_owned()).cloned().unwrap();
            let rows_now = fixpoint(dir, &["fingerprint", "silver.orders", "--where", "dt = DATE '2026-10-20'", "--db", db, "--output", "json"], env);
            assert_eq!(newest["output"]["checksum"], json(&rows_now)["checksum"], "trial {trial}: the ledger's newest row is the visible day");
            let rerun = fixpoint(dir, &["run", "job.toml", "--date", "2026-10-20", "--db", db, "--output", "json"], env);
            assert_eq!(rerun.status.code(), Some(0), "trial {trial}: {}", String::from_utf8_lossy(&rerun.stderr));
            let r = json(&rerun);
            if skips {
                assert_eq!(r["outcome"], if seen == new { "skipped" } else { "committed" }, "trial {trial}: {r}");
            } else {
                // A merge's retry is applied again: over the new day it
                // changes nothing.
                assert_eq!(r["outcome"], "committed", "trial {trial}: {r}");
                let changed = ["rows_inserted", "rows_updated", "rows_deleted"].iter().map(|k| r[k].as_u64().unwrap()).sum::<u64>();
                assert_eq!(changed == 0, seen == new, "trial {trial}: {r}");
            }
            assert_eq!(day(), new, "trial {trial}");
            old = new;
        }
        eprintln!("{db}: {killed} of {trials} runs died by a signal");
        killed
    }

    /// `delta:s3://…` through the binary: credentials and endpoint from the
    /// `AWS_*` environment, a run, a skipped rerun, `runs` and `status`;
    /// the secret never printed.
    #[test]
    fn delta_on_s3_through_the_cli() {
        let Some(endpoint) = fixpoint_delta::test_s3_endpoint() else { return };
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        let cache = dir.join("cache");
        let secret = "s3cr3t-never-printed";
        let url = format!("s3://fixpoint-test/{}", unique("cli"));
        let env = s3_env(&endpoint, secret, &cache);
        let options: Vec<(String, String)> = env[..5].iter().map(|(k, v)| (k.to_ascii_lowercase(), (*v).to_owned())).collect();
        std::fs::write(dir.join("job.toml"), JOB).unwrap();
        {
            use fixpoint_core::Engine;
            let mut w = fixpoint_delta::Delta::open_s3(&url, &options).unwrap();
            for stmt in [
                "CREATE TABLE bronze.orders (order_id BIGINT, order_total DECIMAL(12,2), dt DATE)",
                "INSERT INTO bronze.orders VALUES (1, 1.50, DATE '2026-10-19'), (2, 2.50, DATE '2026-10-20'), (3, 3.50, DATE '2026-10-20')",
            ] {
                w.execute(&fixpoint_core::job::sql::Sql::raw(stmt)).unwrap();
            }
        }
        let db = format!("delta:{url}");
        let first = fixpoint(dir, &["run", "job.toml", "--date", "2026-10-20", "--db", &db, "--output", "json"], &env);
        let all = |o: &Output| format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
        assert_eq!(first.status.code(), Some(0), "{}", all(&first));
        assert!(!all(&first).contains(secret));
        assert_eq!((json(&first)["outcome"].as_str(), json(&first)["rows_inserted"].as_u64()), (Some("committed"), Some(2)));
        // Another machine: an empty cache, the same warehouse.
        std::fs::remove_dir_all(&cache).unwrap();
        let again = fixpoint(dir, &["run", "job.toml", "--date", "2026-10-20", "--db", &db, "--output", "json"], &env);
        assert_eq!(json(&again)["outcome"], "skipped", "{}", all(&again));
        let runs = fixpoint(dir, &["runs", "--db", &db, "--output", "json"], &env);
        assert_eq!(runs.status.code(), Some(0), "{}", all(&runs));
        assert_eq!(json(&runs)["runs"].as_array().unwrap().len(), 1);
        let status = fixpoint(dir, &["status", "job.toml", "--from", "2026-10-20", "--to", "2026-10-20", "--db", &db, "--output", "json"], &env);
        assert_eq!(status.status.code(), Some(0), "{}", all(&status));
        // A bucket that does not exist: an error naming it, nothing of the secret.
        let refused = fixpoint(dir, &["run", "job.toml", "--date", "2026-10-20", "--db", "delta:s3://no-such-bucket-fixpoint/wh"], &env);
        assert_eq!(refused.status.code(), Some(2), "bad input: {}", all(&refused));
        assert!(all(&refused).contains("the bucket no-such-bucket-fixpoint does not exist"), "{}", all(&refused));
        assert!(!all(&refused).contains(secret));
        drop(fixpoint_delta::Delta::scratch_s3(&url, &options));
    }

    /// A file source on S3 through the binary, into a DuckDB target: the
    /// objects uploaded and their ETags read back by boto3 (Python, the
    /// tests' virtualenv), a run, a skipped rerun, a changed object
    /// reloaded, `status`, a missing day (exit 3) and a missing bucket
    /// (exit 2); the secret never printed.
    #[test]
    fn files_on_s3_through_the_cli() {
        let Some(endpoint) = fixpoint_delta::test_s3_endpoint() else { return };
        let Some(py) = python_with("boto3") else { return };
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        let secret = "s3cr3t-never-printed";
        let prefix = unique("cli-files");
        let cache = dir.join("cache");
        let env = s3_env(&endpoint, secret, &cache);
        // boto3: uploads `local` as `key` (when given), prints the object's ETag.
        let boto3 = |local: Option<&Path>, key: &str| -> String {
            let script = "import sys, boto3\n\
                s3 = boto3.client('s3', endpoint_url=sys.argv[1], aws_access_key_id='test', aws_secret_access_key='x', region_name='us-east-1')\n\
                if sys.argv[3]: s3.upload_file(sys.argv[3], 'fixpoint-test', sys.argv[2])\n\
                print(s3.head_object(Bucket='fixpoint-test', Key=sys.argv[2])['ETag'])\n";
            let local = local.map(|p| p.to_string_lossy().into_owned()).unwrap_or_default();
            let o = Command::new(&py).args(["-c", script, &endpoint, key, &local]).output().unwrap();
            assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
            String::from_utf8(o.stdout).unwrap().trim().to_owned()
        };
        let part = |total: &str| -> std::path::PathBuf {
            let path = dir.join(format!("part-{total}.parquet"));
            let duck = duckdb::Connection::open_in_memory().unwrap();
            duck.execute_batch(&format!(
                "COPY (SELECT * FROM (VALUES (1, {total}::DECIMAL(12,2)), (2, 4.00::DECIMAL(12,2))) AS t(order_id, order_total)) TO '{}' (FORMAT parquet)",
                path.display()
            ))
            .unwrap();
            path
        };
        let key = format!("{prefix}/bronze/dt=2026-10-20/part-0.parquet");
        let etag = boto3(Some(&part("2.50")), &key);
        std::fs::write(
            dir.join("job.toml"),
            format!(
                "name = \"orders_from_s3\"\ntarget = \"silver.orders\"\nstrategy = \"replace_partition\"\npartition = \"dt\"\n\n[source]\nfiles = \"s3://fixpoint-test/{prefix}/bronze/dt={{run_date}}/*.parquet\"\n"
            ),
        )
        .unwrap();
        let all = |o: &Output| format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
        let run = |date: &str| fixpoint(dir, &["run", "job.toml", "--date", date, "--db", "duckdb:wh.duckdb", "--output", "json"], &env);
        let first = run("2026-10-20");
        assert_eq!(first.status.code(), Some(0), "{}", all(&first));
        assert!(!all(&first).contains(secret));
        let report = json(&first);
        assert_eq!((report["outcome"].as_str(), report["output"]["rows"].as_u64()), (Some("committed"), Some(2)), "{report}");
        let files = &report["input_files"]["files"];
        assert_eq!((files[0]["path"].as_str(), files[0]["etag"].as_str()), (Some("part-0.parquet"), Some(etag.as_str())), "{report}");
        let again = run("2026-10-20");
        assert_eq!(json(&again)["outcome"], "skipped", "{}", all(&again));
        // The object rewritten with another total: reloaded, and the table holds it.
        let new_etag = boto3(Some(&part("2.75")), &key);
        assert_ne!(new_etag, etag);
        let status = fixpoint(dir, &["status", "job.toml", "--from", "2026-10-20", "--to", "2026-10-20", "--db", "duckdb:wh.duckdb", "--output", "json"], &env);
        assert!(all(&status).contains("changed part-0.parquet"), "{}", all(&status));
        let reloaded = run("2026-10-20");
        assert_eq!(json(&reloaded)["outcome"], "committed", "{}", all(&reloaded));
        let duck = duckdb::Connection::open(dir.join("wh.duckdb")).unwrap();
        let total: String = duck.query_row("SELECT CAST(sum(order_total) AS VARCHAR) FROM silver.orders WHERE dt = DATE '2026-10-20'", [], |r| r.get(0)).unwrap();
        assert_eq!(total, "6.75");
        drop(duck);
        // A day without objects: refused data, exit 3.
        let missing = run("2026-10-21");
        assert_eq!(missing.status.code(), Some(3), "{}", all(&missing));
        assert!(all(&missing).contains("no file matches s3://fixpoint-test/"), "{}", all(&missing));
        // A bucket that does not exist: bad input, exit 2, naming it.
        std::fs::write(dir.join("other.toml"), std::fs::read_to_string(dir.join("job.toml")).unwrap().replace("s3://fixpoint-test/", "s3://no-such-bucket-fixpoint/")).unwrap();
        let refused = fixpoint(dir, &["run", "other.toml", "--date", "2026-10-20", "--db", "duckdb:wh.duckdb"], &env);
        assert_eq!(refused.status.code(), Some(2), "{}", all(&refused));
        assert!(all(&refused).contains("the bucket no-such-bucket-fixpoint does not exist"), "{}", all(&refused));
        assert!(!all(&refused).contains(secret));
    }

    /// kill -9 of runs whose input is a file source on S3 (the local
    /// S3-compatible server) into a Delta warehouse in a local folder:
    /// before the commit, right after it, and at random moments (while the
    /// objects are listed, downloaded or read). The day is the old one or
    /// the new one, the rerun converges, and the run folders the killed
    /// processes left in the cache are removed by the next run.
    #[test]
    fn delta_kill_9_with_files_on_s3() {
        let Some(endpoint) = fixpoint_delta::test_s3_endpoint() else { return };
        let Some(py) = python_with("boto3") else { return };
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        let prefix = unique("kill-files");
        let cache = dir.join("cache");
        let env = s3_env(&endpoint, "test", &cache);
        std::fs::write(
            dir.join("job.toml"),
            format!(
                "name = \"silver_orders\"\ntarget = \"silver.orders\"\nstrategy = \"replace_partition\"\npartition = \"dt\"\n\n[source]\nfiles = \"s3://fixpoint-test/{prefix}/bronze/dt={{run_date}}/*.parquet\"\n"
            ),
        )
        .unwrap();
        // The day's object, with order 2's total as given, uploaded by boto3.
        let bronze = |total: &str| {
            let path = dir.join("part.parquet");
            let duck = duckdb::Connection::open_in_memory().unwrap();
            duck.execute_batch(&format!(
                "COPY (SELECT * FROM (VALUES (2, {total}::DECIMAL(12,2)), (3, 3.50::DECIMAL(12,2))) AS t(order_id, order_total)) TO '{}' (FORMAT parquet)",
                path.display()
            ))
            .unwrap();
            let script = "import sys, boto3\n\
                s3 = boto3.client('s3', endpoint_url=sys.argv[1], aws_access_key_id='test', aws_secret_access_key='x', region_name='us-east-1')\n\
                s3.upload_file(sys.argv[3], 'fixpoint-test', sys.argv[2])\n";
            let key = format!("{prefix}/bronze/dt=2026-10-20/part-0.parquet");
            let o = Command::new(&py).args(["-c", script, &endpoint, &key, &path.to_string_lossy()]).output().unwrap();
            assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        };
        bronze("2.50");
        let first = fixpoint(dir, &["run", "job.toml", "--date", "2026-10-20", "--db", "delta:wh"], &env);
        assert!(first.status.success(), "{}", String::from_utf8_lossy(&first.stderr));
        let table = dir.join("wh/silver/orders");
        assert_eq!(day_rows(&table, "2026-10-20"), vec![(2, "2.50".to_owned()), (3, "3.50".to_owned())]);
        let killed = kill_9_trials(dir, "delta:wh", &env, true, 10, 700, &bronze, &|| day_rows(&table, "2026-10-20"));
        assert!(killed >= 2, "at least the two aborts were kills: {killed}");
        let left: Vec<String> = std::fs::read_dir(cache.join("files")).map(|d| d.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect()).unwrap_or_default();
        assert_eq!(left, Vec::<String>::new(), "no run folder is left once a run has swept them");
    }

    /// kill -9 of runs on a warehouse on S3 (the local S3-compatible
    /// server): before the commit, right after it, and at random moments.
    /// The day, read by the Python `deltalake` package from the bucket (the
    /// files the table's log names, so an uncommitted file is never read),
    /// is the old one or the new one, and the rerun converges to the new one.
    #[test]
    fn delta_kill_9_on_s3() {
        let Some(endpoint) = fixpoint_delta::test_s3_endpoint() else { return };
        let Some(py) = python_with("deltalake") else { return };
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        let url = format!("s3://fixpoint-test/{}", unique("kill"));
        let cache = dir.join("cache");
        let env = s3_env(&endpoint, "test", &cache);
        let options: Vec<(String, String)> = env[..5].iter().map(|(k, v)| (k.to_ascii_lowercase(), (*v).to_owned())).collect();
        let storage = serde_json::Value::Object(options.iter().map(|(k, v)| (k.clone(), serde_json::Value::String(v.clone()))).collect()).to_string();
        std::fs::write(dir.join("job.toml"), JOB).unwrap();
        let bronze = |total: &str| {
            use fixpoint_core::Engine;
            let mut w = fixpoint_delta::Delta::open_s3(&url, &options).unwrap();
            for stmt in [
                "DROP TABLE IF EXISTS bronze.orders".to_owned(),
                "CREATE TABLE bronze.orders (order_id BIGINT, order_total DECIMAL(12,2), dt DATE)".to_owned(),
                format!("INSERT INTO bronze.orders VALUES (1, 1.50, DATE '2026-10-19'), (2, {total}, DATE '2026-10-20'), (3, 3.50, DATE '2026-10-20')"),
            ] {
                w.execute(&fixpoint_core::job::sql::Sql::raw(stmt)).unwrap();
            }
        };
        // The day as the Python reader finds it in the bucket.
        let day = || -> Vec<(i64, String)> {
            let script = "import json, sys\nfrom deltalake import DeltaTable\n\
                t = DeltaTable(sys.argv[1], storage_options=json.loads(sys.argv[2])).to_pyarrow_table()\n\
                print(json.dumps(sorted([r['order_id'], str(r['order_total'])] for r in t.to_pylist() if str(r['dt']) == '2026-10-20')), flush=True)\n\
                import os\nos._exit(0)\n";
            let o = Command::new(&py).args(["-c", script, &format!("{url}/silver/orders"), &storage]).output().unwrap();
            assert!(o.status.success(), "python: {}", String::from_utf8_lossy(&o.stderr));
            serde_json::from_slice(&o.stdout).unwrap()
        };
        let db = format!("delta:{url}");
        bronze("2.50");
        let first = fixpoint(dir, &["run", "job.toml", "--date", "2026-10-20", "--db", &db], &env);
        assert!(first.status.success(), "{}", String::from_utf8_lossy(&first.stderr));
        assert_eq!(day(), vec![(2, "2.50".to_owned()), (3, "3.50".to_owned())]);
        let killed = kill_9_trials(dir, &db, &env, true, 8, 1500, &bronze, &day);
        assert!(killed >= 2, "at least the two aborts were kills: {killed}");
        drop(fixpoint_delta::Delta::scratch_s3(&url, &options));
    }

    const HISTORY_JOB: &str = r#"name = "dim"
target = "silver.dim"
strategy = "history"
key = ["k"]
version = "v"
deleted = "op = 'D'"
track = ["a"]
on_tie = "deterministic"

[source]
sql = "SELECT k, v, a, op FROM bronze.changes WHERE batch = :run_date"
"#;

    /// The batches of the history trials: new keys, a change, a tombstone,
    /// an unchanged re-send (kept in the log), a reopening, a late older
    /// version.
    const BATCHES: &str = "INSERT INTO bronze.changes VALUES \
        (DATE '2026-10-01', 1, 1, 'x', 'U'), (DATE '2026-10-01', 2, 1, 'y', 'U'), \
        (DATE '2026-10-02', 1, 2, 'z', 'U'), (DATE '2026-10-02', 2, 2, NULL, 'D'), \
        (DATE '2026-10-03', 1, 3, 'z', 'U'), (DATE '2026-10-03', 3, 1, 'w', 'U'), \
        (DATE '2026-10-04', 2, 3, 'y', 'U'), (DATE '2026-10-04', 1, 0, 'q', 'U'), \
        (DATE '2026-10-05', 1, 4, 'x', 'U'), (DATE '2026-10-05', 3, 2, NULL, 'D')";

    /// A Delta table's rows (`select`, over `t`) as its log makes them,
    /// read independently: the active files from the `_delta_log` JSON
    /// (adds minus removes), read by DuckDB; empty when it has no log.
    fn table_rows(table: &Path, select: &str) -> Vec<Vec<String>> {
        if !table.join("_delta_log").is_dir() {
            return Vec::new();
        }
        let mut active: Vec<String> = Vec::new();
        let mut logs: Vec<_> = std::fs::read_dir(table.join("_delta_log")).unwrap().flatten().map(|e| e.path()).filter(|p| p.extension().is_some_and(|x| x == "json")).collect();
        logs.sort();
        for log in logs {
            for line in std::fs::read_to_string(&log).unwrap().lines() {
                let a: serde_json::Value = serde_json::from_str(line).unwrap();
                if let Some(add) = a.get("add") {
                    active.push(add["path"].as_str().unwrap().to_owned());
                }
                if let Some(rm) = a.get("remove") {
                    active.retain(|p| p != rm["path"].as_str().unwrap());
                }
            }
        }
        if active.is_empty() {
            return Vec::new();
        }
        let files: Vec<String> = active.iter().map(|p| format!("'{}'", table.join(p).display())).collect();
        let db = duckdb::Connection::open_in_memory().unwrap();
        rows_of(&db, &format!("{select} FROM read_parquet([{}], union_by_name = true) AS t ORDER BY ALL", files.join(", ")))
    }

    /// How many commits in `table`'s `_delta_log` carry fixpoint's commit
    /// info for the app id `app`.
    fn commits_of(table: &Path, app: &str) -> usize {
        let mut n = 0;
        let Ok(log) = std::fs::read_dir(table.join("_delta_log")) else { return 0 };
        for e in log.flatten() {
            if e.path().extension().is_none_or(|x| x != "json") {
                continue;
            }
            for line in std::fs::read_to_string(e.path()).unwrap().lines() {
                let a: serde_json::Value = serde_json::from_str(line).unwrap();
                let mut info = a["commitInfo"]["fixpoint"].clone();
                if let Some(text) = info.as_str() {
                    info = serde_json::from_str(text).unwrap();
                }
                if info["app_id"] == app {
                    n += 1;
                }
            }
        }
        n
    }

    /// The rows of `sql`, every value as text.
    fn rows_of(db: &duckdb::Connection, sql: &str) -> Vec<Vec<String>> {
        let mut st = db.prepare(sql).unwrap();
        let mut rows = st.query([]).unwrap();
        let mut out = Vec::new();
        while let Some(r) = rows.next().unwrap() {
            let n = r.as_ref().column_count();
            out.push((0..n).map(|i| r.get::<_, Option<String>>(i).unwrap().unwrap_or_else(|| "NULL".into())).collect());
        }
        out
    }

    const TABLE_SELECT: &str = "SELECT CAST(k AS VARCHAR), CAST(v AS VARCHAR), a, CAST(valid_from AS VARCHAR), CAST(valid_to AS VARCHAR)";
    const LOG_SELECT: &str = "SELECT CAST(k AS VARCHAR), CAST(v AS VARCHAR), a, CAST(__fixpoint_deleted AS VARCHAR)";

    /// kill -9 of history runs on a Delta warehouse: before the commits,
    /// between the table's commit and its log's (the run's two tables are
    /// two Delta commits), and at random moments. The table and its log,
    /// read from the files their `_delta_log`s name, are each the old or
    /// the new state of a clean run on DuckDB (the reference, run by the
    /// same binary on a DuckDB file); once a process has opened the
    /// warehouse, the log is the one that goes with the table; the rerun
    /// converges.
    #[test]
    fn delta_history_kill_9_before_between_and_after_its_commits() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        std::fs::write(dir.join("hjob.toml"), HISTORY_JOB).unwrap();
        {
            use fixpoint_core::Engine;
            let mut w = fixpoint_delta::Delta::open(&dir.join("wh")).unwrap();
            for stmt in ["CREATE TABLE bronze.changes (batch DATE, k BIGINT, v BIGINT, a VARCHAR, op VARCHAR)", BATCHES] {
                w.execute(&fixpoint_core::job::sql::Sql::raw(stmt.to_owned())).unwrap();
            }
        }
        let days = ["2026-10-01", "2026-10-02", "2026-10-03", "2026-10-04", "2026-10-05"];
        // The reference: each day's state after clean runs on DuckDB.
        let reference = duckdb::Connection::open(dir.join("ref.duckdb")).unwrap();
        reference.execute_batch(&format!("CREATE SCHEMA bronze; CREATE TABLE bronze.changes (batch DATE, k BIGINT, v BIGINT, a VARCHAR, op VARCHAR); {BATCHES};")).unwrap();
        drop(reference);
        let mut states = vec![(Vec::new(), Vec::new())];
        for day in days {
            let o = fixpoint(dir, &["run", "hjob.toml", "--date", day, "--db", "duckdb:ref.duckdb"], &[]);
            assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
            let reference = duckdb::Connection::open(dir.join("ref.duckdb")).unwrap();
            let t = rows_of(&reference, &format!("{TABLE_SELECT} FROM silver.dim AS t ORDER BY ALL"));
            let l = rows_of(&reference, &format!("{LOG_SELECT} FROM fixpoint.history__silver__dim AS t ORDER BY ALL"));
            states.push((t, l));
        }
        let (table, log) = (dir.join("wh/silver/dim"), dir.join("wh/fixpoint/history__silver__dim"));
        let read = || (table_rows(&table, TABLE_SELECT), table_rows(&log, LOG_SELECT));
        let mut seed: u64 = 0x2545f4914f6cdd1d;
        let mut killed = 0;
        // Each day in order, then each again forced (a new commit of the same rows).
        let trials: Vec<(usize, bool)> = (0..days.len()).map(|i| (i, false)).chain((0..days.len()).map(|i| (i, true))).collect();
        for (trial, &(i, forced)) in trials.iter().enumerate() {
            let (old, new) = if forced { (&states[5], &states[5]) } else { (&states[i], &states[i + 1]) };
            let mut cmd = Command::new(env!("CARGO_BIN_EXE_fixpoint"));
            cmd.args(["run", "hjob.toml", "--date", days[i], "--db", "delta:wh"]).current_dir(dir).env("FIXPOINT_TEST_MODE", "1");
            if forced {
                cmd.arg("--force");
            }
            cmd.env_remove("FIXPOINT_FAIL_AT").env_remove("FIXPOINT_DELTA_FAULT").env_remove("FIXPOINT_DB");
            cmd.stdout(std::process::Stdio::null()).stderr(std::process::Stdio::null());
            match trial {
                0 | 5 => {
                    cmd.env("FIXPOINT_FAIL_AT", "before_commit").env("FIXPOINT_FAIL_MODE", "abort");
                }
                // Between the table's commit and its log's.
                1 | 2 | 6 => {
                    cmd.env("FIXPOINT_DELTA_FAULT", "abort_after_commit");
                }
                _ => {}
            }
            let mut child = cmd.spawn().unwrap();
            if !matches!(trial, 0 | 1 | 2 | 5 | 6) {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                std::thread::sleep(std::time::Duration::from_millis(seed % 900));
                let _ = child.kill();
            }
            let status = child.wait().unwrap();
            if status.code().is_none() {
                killed += 1;
            }
            let (t, l) = read();
            assert!(t == old.0 || t == new.0, "trial {trial} ({}): the table is neither the old nor the new one: {t:?}", days[i]);
            assert!(l == old.1 || l == new.1, "trial {trial} ({}): the log is neither the old nor the new one: {l:?}", days[i]);
            if matches!(trial, 0 | 5) {
                assert_eq!((&t, &l), (&old.0, &old.1), "trial {trial}: killed before its commits");
            }
            if matches!(trial, 1 | 2) {
                assert_eq!(t, new.0, "trial {trial}: killed after the table's commit");
                if old.1 != new.1 {
                    assert_eq!(l, old.1, "trial {trial}: killed before the log's commit");
                }
            }
            // A process that opens the warehouse finishes the log's commit.
            let ledger = ledger_rows(dir);
            let (t2, l2) = read();
            assert_eq!(t2, t, "trial {trial}: opening the warehouse changed the table");
            let state = if t == new.0 { new } else { old };
            assert_eq!(l2, state.1, "trial {trial} ({}): the log goes with the table once the warehouse is opened", days[i]);
            let app = format!("fixpoint:dim:{}", days[i]);
            let recorded = ledger.iter().filter(|e| e["run_date"] == days[i]).count();
            // A forced rerun of an earlier day may change nothing (later days
            // changed its keys' rows): a ledger row without a commit.
            if forced {
                assert!(recorded >= commits_of(&table, &app), "trial {trial} ({}): a ledger row for every commit of the table", days[i]);
            } else {
                assert_eq!(recorded, commits_of(&table, &app), "trial {trial} ({}): one ledger row per commit of the table", days[i]);
            }
            let rerun = fixpoint(dir, &["run", "hjob.toml", "--date", days[i], "--db", "delta:wh", "--output", "json"], &[]);
            assert_eq!(rerun.status.code(), Some(0), "trial {trial}: {}", String::from_utf8_lossy(&rerun.stderr));
            assert_eq!(read(), *new, "trial {trial} ({}): the rerun converges", days[i]);
            if !forced {
                let expected = if t == new.0 { "skipped" } else { "committed" };
                assert_eq!(json(&rerun)["outcome"], expected, "trial {trial} ({})", days[i]);
            }
        }
        eprintln!("history: {killed} of {} runs died by a signal", trials.len());
        assert!(killed >= 5, "at least the five aborts were kills: {killed}");
    }
}
