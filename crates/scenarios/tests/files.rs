//! File sources, run on every engine: a day's bronze files (Parquet, CSV,
//! JSON Lines) loaded directly, the run key made from the files' hashes,
//! incomplete days refused with the target unchanged.

use std::path::PathBuf;

use fixpoint_core::tools::backfill::{status, DateState};
use fixpoint_core::{Error, ErrorClass, Job};
use fixpoint_core::run::ledger;
use fixpoint_scenarios::*;

/// A folder for one test's bronze files and job file; in the scenarios'
/// S3 variants (`s3_files::…`), also mirrored to the local S3-compatible
/// server, with the job reading the mirror (`s3://…`).
struct Lake {
    dir: tempfile::TempDir,
    #[cfg(feature = "s3")]
    s3: Option<S3Mirror>,
}

#[cfg(feature = "s3")]
thread_local! {
    /// Whether this test's lakes live on S3 (set by the `s3_files` tests).
    static ON_S3: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

impl Lake {
    fn new() -> Lake {
        Lake {
            dir: tempfile::tempdir().unwrap(),
            #[cfg(feature = "s3")]
            s3: ON_S3.with(|on| on.get()).then(|| S3Mirror::get().expect("the S3 server, checked by the test")),
        }
    }

    fn path(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }

    /// Brings the S3 mirror up to date (nothing for a local lake).
    fn sync(&self) {
        #[cfg(feature = "s3")]
        if let Some(s3) = &self.s3 {
            s3.sync(self.dir.path());
        }
    }

    /// Writes files with DuckDB: `{lake}` in `script` is the lake's folder
    /// (fixture SQL written by the tests, never user input).
    fn write(&self, files: &[&str], script: &str) {
        for f in files {
            std::fs::create_dir_all(self.path(f).parent().unwrap()).unwrap();
        }
        let duck = fixpoint_duckdb::DuckDb::open_in_memory().unwrap();
        let script = script.replace("{lake}", &self.dir.path().display().to_string());
        duck.connection().execute_batch(&script).unwrap_or_else(|e| panic!("fixture: {e}\n{script}"));
        self.sync();
    }

    fn text(&self, rel: &str, content: &str) {
        self.put(rel, content.as_bytes());
    }

    /// Writes `rel` (its folders made).
    fn put(&self, rel: &str, content: &[u8]) {
        std::fs::create_dir_all(self.path(rel).parent().unwrap()).unwrap();
        std::fs::write(self.path(rel), content).unwrap();
        self.sync();
    }

    /// Writes `rel` again with the same bytes (on S3: uploaded again, a
    /// new object with the same content).
    fn rewrite(&self, rel: &str) {
        let bytes = std::fs::read(self.path(rel)).unwrap();
        std::fs::write(self.path(rel), &bytes).unwrap();
        #[cfg(feature = "s3")]
        if let Some(s3) = &self.s3 {
            s3.put(rel, bytes);
        }
    }

    /// Removes `rel`.
    fn remove(&self, rel: &str) {
        std::fs::remove_file(self.path(rel)).unwrap();
        self.sync();
    }

    /// A job file in the lake, read as `fixpoint run` would (on S3: the
    /// pattern below the mirror's URL).
    fn job(&self, toml: &str) -> Job {
        #[cfg(feature = "s3")]
        let toml = &match &self.s3 {
            Some(s3) => toml.replace("files = \"", &format!("files = \"{}", s3.url(""))),
            None => toml.to_owned(),
        };
        let path = self.path("job.toml");
        std::fs::write(&path, toml).unwrap();
        #[allow(unused_mut)]
        let mut job = Job::from_file(&path).unwrap_or_else(|e| panic!("{e}"));
        #[cfg(feature = "s3")]
        if let Some(s3) = &self.s3 {
            job.source.files.as_mut().expect("a file source").s3_options = s3.options();
        }
        job
    }
}

const PART_0: &str = "
COPY (SELECT * FROM (VALUES
  (3, 12, 5.25::DECIMAL(12,2), 'EUR', TIMESTAMP '2026-10-20 07:00:00'),
  (4, 10, 45.00::DECIMAL(12,2), 'GBP', TIMESTAMP '2026-10-20 11:00:00')
) AS t(order_id, customer_id, order_total, currency, updated_at)) TO '{lake}/bronze/orders/dt=2026-10-20/part-0.parquet' (FORMAT parquet);
";
const PART_1: &str = "
COPY (SELECT * FROM (VALUES
  (5, 13, 7.00::DECIMAL(12,2), 'EUR', TIMESTAMP '2026-10-20 12:00:00'),
  (6, 14, 18.40::DECIMAL(12,2), 'EUR', TIMESTAMP '2026-10-21 02:14:00')
) AS t(order_id, customer_id, order_total, currency, updated_at)) TO '{lake}/bronze/orders/dt=2026-10-20/part-1.parquet' (FORMAT parquet);
";

fn orders_20() -> String {
    format!("{PART_0}{PART_1}")
}

const PARTS_20: &[&str] = &["bronze/orders/dt=2026-10-20/part-0.parquet", "bronze/orders/dt=2026-10-20/part-1.parquet"];

/// The day's folder, loaded as it is: the files' columns plus `dt` from the
/// folder name (hive-style).
const PARQUET_JOB: &str = r#"
name = "silver_orders_files"
target = "silver.orders"
strategy = "replace_partition"
partition = "dt"

[source]
files = "bronze/orders/dt={run_date}/*.parquet"
"#;

fn all_rows(db: &mut dyn fixpoint_core::Engine) -> Vec<Vec<String>> {
    rows(db, "SELECT order_id, customer_id, CAST(order_total AS VARCHAR), currency, CAST(updated_at AS VARCHAR), CAST(dt AS VARCHAR) FROM silver.orders")
}

fn a_day_of_parquet_files_loads_and_reloads(e: &dyn EngineUnderTest) {
    let lake = Lake::new();
    lake.write(PARTS_20, &orders_20());
    let job = lake.job(PARQUET_JOB);
    let mut db = e.fresh();
    let db = db.as_mut();

    let first = job.load(d("2026-10-20"), db).unwrap();
    assert_eq!((first.outcome.as_str(), first.rows_inserted, first.output_rows), ("committed", 4, 4));
    let files = first.input_files.clone().expect("the report lists the files");
    let names: Vec<&str> = files.files.iter().map(|f| f.path.as_str()).collect();
    assert_eq!(names, ["part-0.parquet", "part-1.parquet"]);
    assert_eq!(files.files[0].size, std::fs::metadata(lake.path(PARTS_20[0])).unwrap().len());
    assert_eq!(
        rows(db, "SELECT order_id, CAST(dt AS VARCHAR) FROM silver.orders"),
        [["3", "\"2026-10-20\""], ["4", "\"2026-10-20\""], ["5", "\"2026-10-20\""], ["6", "\"2026-10-20\""]]
    );
    let fp = day_fp(db, "silver.orders", "2026-10-20", &[]);

    // Re-run: the same files give the same run key, and nothing is read or written.
    for _ in 0..3 {
        let again = job.load(d("2026-10-20"), db).unwrap();
        assert_eq!(again.outcome, "skipped", "{:?}", again.skip_reason);
        assert_eq!(again.run_key, first.run_key);
        assert_eq!(day_fp(db, "silver.orders", "2026-10-20", &[]), fp);
    }
    let entries = ledger::entries(db, Some("silver_orders_files"), None, None).unwrap();
    assert_eq!(entries.len(), 1);
    let recorded = entries[0].input_files.as_ref().unwrap();
    assert_eq!((&recorded.checksum, &recorded.files), (&files.checksum, &files.files), "the ledger records the files and their hashes");

    // One value changed in one file: another run key, and only that row changes.
    let before = all_rows(db);
    lake.write(&[], &PART_1.replace("7.00::DECIMAL", "7.01::DECIMAL"));
    let st = status(&job, d("2026-10-20"), db).unwrap();
    assert_eq!(st.state, DateState::SourceChanged);
    assert_eq!(st.files_changed, ["changed part-1.parquet"]);
    assert_eq!(st.input_rows_now, None, "status reads no row of a file source");
    let changed = job.load(d("2026-10-20"), db).unwrap();
    assert_eq!(changed.outcome, "committed");
    assert_ne!(changed.run_key, first.run_key);
    let after = all_rows(db);
    let gone: Vec<_> = before.iter().filter(|r| !after.contains(r)).collect();
    let new: Vec<_> = after.iter().filter(|r| !before.contains(r)).collect();
    assert_eq!(gone.len(), 1, "{gone:?}");
    assert_eq!(new.len(), 1, "{new:?}");
    assert_eq!((new[0][0].as_str(), new[0][2].as_str()), ("5", "\"7.01\""));
    assert_eq!(status(&job, d("2026-10-20"), db).unwrap().state, DateState::Ok);

    // A file added: another run key too.
    lake.write(&["bronze/orders/dt=2026-10-20/part-2.parquet"], "COPY (SELECT 8 AS order_id, 16 AS customer_id, 1.00::DECIMAL(12,2) AS order_total, 'EUR' AS currency, TIMESTAMP '2026-10-20 13:00:00' AS updated_at) TO '{lake}/bronze/orders/dt=2026-10-20/part-2.parquet' (FORMAT parquet)");
    let added = job.load(d("2026-10-20"), db).unwrap();
    assert_eq!((added.outcome.as_str(), added.output_rows), ("committed", 5));
}

fn incomplete_days_are_refused_and_change_nothing(e: &dyn EngineUnderTest) {
    let lake = Lake::new();
    lake.write(PARTS_20, &orders_20());
    let mut db = e.fresh();
    let db = db.as_mut();
    let job = lake.job(PARQUET_JOB);
    job.load(d("2026-10-20"), db).unwrap();
    let fp = day_fp(db, "silver.orders", "2026-10-20", &[]);
    let unchanged = |db: &mut dyn fixpoint_core::Engine| {
        assert_eq!(day_fp(db, "silver.orders", "2026-10-20", &[]), fp);
        assert_eq!(ledger::entries(db, None, None, None).unwrap().len(), 1);
    };

    // A missing day.
    let err = job.load(d("2026-10-21"), db).unwrap_err();
    assert_eq!(err.class(), ErrorClass::Data);
    assert!(err.to_string().contains("no file matches") && err.to_string().contains("dt=2026-10-21/*.parquet"), "{err}");
    assert!(err.hint().unwrap().contains("allow_missing = true"));
    unchanged(db);
    // … allowed: skipped, nothing written.
    let lenient = lake.job(&PARQUET_JOB.replace("*.parquet\"", "*.parquet\"\nallow_missing = true"));
    let r = lenient.load(d("2026-10-21"), db).unwrap();
    assert_eq!(r.outcome, "skipped");
    assert!(r.skip_reason.unwrap().contains("allow_missing = true"));
    assert_eq!(count(db, "SELECT count(*) FROM silver.orders WHERE dt = DATE '2026-10-21'"), 0);
    unchanged(db);

    // A truncated file: the error names it; nothing changes.
    let part1 = lake.path(PARTS_20[1]);
    let good = std::fs::read(&part1).unwrap();
    lake.put(PARTS_20[1], &good[..good.len() / 2]);
    let err = job.load(d("2026-10-20"), db).unwrap_err();
    assert_eq!(err.class(), ErrorClass::Data, "{err}");
    assert!(err.to_string().starts_with("cannot read part-1.parquet (parquet file of job silver_orders_files for 2026-10-20)"), "{err}");
    unchanged(db);
    lake.put(PARTS_20[1], &good);

    // A half-written day: the marker is required and not there yet.
    let marked = lake.job(&PARQUET_JOB.replace("*.parquet\"", "*.parquet\"\nrequire_marker = \"_SUCCESS\""));
    lake.put("bronze/orders/dt=2026-10-20/part-2.parquet", &good[..100]);
    let err = marked.load(d("2026-10-20"), db).unwrap_err();
    assert!(err.to_string().contains("has no _SUCCESS marker"), "{err}");
    unchanged(db);
    // The upstream finishes the file and writes the marker: the day loads.
    lake.put("bronze/orders/dt=2026-10-20/part-2.parquet", &good);
    lake.put("bronze/orders/dt=2026-10-20/_SUCCESS", b"");
    let r = marked.load(d("2026-10-20"), db).unwrap();
    assert_eq!((r.outcome.as_str(), r.output_rows), ("committed", 6), "part-2 is a copy of part-1: 2 more rows");

    // A file still being written under a name starting with `.` or `_` is never read.
    lake.put("bronze/orders/dt=2026-10-20/.part-3.parquet.inprogress", b"PAR1");
    lake.put("bronze/orders/dt=2026-10-20/_part-4.parquet", b"PAR1");
    let again = marked.load(d("2026-10-20"), db).unwrap();
    assert_eq!(again.outcome, "skipped");
}

fn csv_and_json_lines_load_and_name_bad_lines(e: &dyn EngineUnderTest) {
    let lake = Lake::new();
    lake.text("in/2026/10/20/a.csv", "order_id,currency,order_total\n1,EUR,12.50\n2,USD,99.00\n");
    lake.text("in/2026/10/20/b.csv", "order_id,currency,order_total\n#3,GBP,5.25\n");
    let csv = lake.job(
        r#"
name = "csv_orders"
target = "silver.csv_orders"
strategy = "replace_partition"
partition = "dt"

[source]
files = "in/{run_date:%Y/%m/%d}/*.csv"
sql = "SELECT order_id, currency, order_total, :run_date AS dt FROM input"
"#,
    );
    let mut db = e.fresh();
    let db = db.as_mut();
    let r = csv.load(d("2026-10-20"), db).unwrap();
    assert_eq!((r.outcome.as_str(), r.output_rows), ("committed", 3));
    // A value starting with `#` is data, not a comment.
    assert_eq!(
        rows(db, "SELECT CAST(order_id AS VARCHAR), currency FROM silver.csv_orders"),
        [["\"#3\"", "\"GBP\""], ["\"1\"", "\"EUR\""], ["\"2\"", "\"USD\""]]
    );
    let fp = day_fp(db, "silver.csv_orders", "2026-10-20", &[]);
    assert_eq!(csv.load(d("2026-10-20"), db).unwrap().outcome, "skipped");

    // A row with one field too many: refused, naming the file.
    lake.text("in/2026/10/20/b.csv", "order_id,currency,order_total\n#3,GBP,5.25\n4,EUR,1.00,oops\n");
    let err = csv.load(d("2026-10-20"), db).unwrap_err();
    assert_eq!(err.class(), ErrorClass::Data, "{err}");
    assert!(err.to_string().starts_with("cannot read b.csv (csv file of job csv_orders for 2026-10-20): Invalid Input Error: "), "{err}");
    assert!(!err.to_string().contains("strict_mode"), "the reader's own options are not the user's: {err}");
    assert_eq!(day_fp(db, "silver.csv_orders", "2026-10-20", &[]), fp);

    lake.text("cdc/2026-10-20.jsonl", "{\"order_id\": 1, \"status\": \"new\"}\n{\"order_id\": 2, \"status\": \"paid\"}\n");
    let json = lake.job(
        r#"
name = "json_orders"
target = "silver.json_orders"
strategy = "replace_partition"
partition = "dt"

[source]
files = "cdc/{run_date}.jsonl"
sql = "SELECT order_id, status, :run_date AS dt FROM input"
"#,
    );
    let r = json.load(d("2026-10-20"), db).unwrap();
    assert_eq!((r.outcome.as_str(), r.output_rows), ("committed", 2));
    assert_eq!(rows(db, "SELECT order_id, status FROM silver.json_orders"), [["1", "\"new\""], ["2", "\"paid\""]]);
    lake.text("cdc/2026-10-20.jsonl", "{\"order_id\": 1, \"status\": \"new\"}\n{\"order_id\": 2, \"status\": \"paid\"\n");
    let err = json.load(d("2026-10-20"), db).unwrap_err();
    assert!(err.to_string().starts_with("cannot read 2026-10-20.jsonl (json file of job json_orders for 2026-10-20)"), "{err}");
    assert_eq!(count(db, "SELECT count(*) FROM silver.json_orders"), 2);
}

/// Change files from a CDC feed, merged: newest version wins across days,
/// and a replayed day changes nothing.
fn cdc_files_merge(e: &dyn EngineUnderTest) {
    let lake = Lake::new();
    lake.text(
        "cdc/2026-10-20/changes.jsonl",
        "{\"order_id\": 1, \"total\": 10.0, \"op\": \"U\", \"updated_at\": \"2026-10-20 08:00:00\"}\n{\"order_id\": 2, \"total\": 20.0, \"op\": \"U\", \"updated_at\": \"2026-10-20 09:00:00\"}\n",
    );
    lake.text(
        "cdc/2026-10-21/changes.jsonl",
        "{\"order_id\": 1, \"total\": 11.0, \"op\": \"U\", \"updated_at\": \"2026-10-21 08:00:00\"}\n{\"order_id\": 2, \"total\": 20.0, \"op\": \"D\", \"updated_at\": \"2026-10-21 09:00:00\"}\n{\"order_id\": 3, \"total\": 30.0, \"op\": \"U\", \"updated_at\": \"2026-10-21 10:00:00\"}\n",
    );
    let job = lake.job(
        r#"
name = "orders_cdc"
target = "silver.orders_cdc"
strategy = "merge"
key = ["order_id"]
version = "updated_at"
deleted = "op = 'D'"

[source]
files = "cdc/{run_date}/*.jsonl"
sql = "SELECT order_id, CAST(total AS DECIMAL(12,2)) AS total, op, CAST(updated_at AS TIMESTAMP) AS updated_at FROM input"
"#,
    );
    let mut db = e.fresh();
    let db = db.as_mut();
    job.load(d("2026-10-21"), db).unwrap();
    job.load(d("2026-10-20"), db).unwrap(); // an older day replayed after a newer one
    let want = [["1", "\"11.00\""], ["3", "\"30.00\""]];
    assert_eq!(rows(db, "SELECT order_id, CAST(total AS VARCHAR) FROM silver.orders_cdc"), want);
    let runs = ledger::entries(db, Some("orders_cdc"), None, None).unwrap().len();
    for day in ["2026-10-20", "2026-10-21"] {
        let r = job.load(d(day), db).unwrap();
        assert_eq!((r.rows_inserted, r.rows_updated, r.rows_deleted), (0, 0, 0), "{day}");
    }
    assert_eq!(rows(db, "SELECT order_id, CAST(total AS VARCHAR) FROM silver.orders_cdc"), want);
    assert!(ledger::entries(db, Some("orders_cdc"), None, None).unwrap().len() >= runs);
}

/// Types travel faithfully (PostgreSQL: through COPY binary).
fn types_map_faithfully(e: &dyn EngineUnderTest) {
    let lake = Lake::new();
    lake.write(
        &["typed/dt=2026-10-20/t.parquet"],
        "COPY (SELECT * FROM (VALUES
           (1, 7::SMALLINT, 12.5::DECIMAL(12,2), 123456789012345678.1234567890::DECIMAL(38,10), 0.1::DOUBLE, 1.5::FLOAT, 'ünï ''q''', DATE '1999-12-31',
            TIMESTAMP '2026-10-20 08:00:00.123456', TIMESTAMPTZ '2026-10-20 08:00:00.5+02', true, from_hex('00ff'), TIME '23:59:59.25', '7e1f0c9a-3f4e-4c55-9d4b-0b1a2c3d4e5f'::UUID, 3000000000::UBIGINT),
           (2, NULL, -0.05, -1.0, NULL, NULL, '', NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL)
         ) AS t(id, small, amount, big, ratio, f, name, day, ts, tstz, flag, raw, tm, u, ub)) TO '{lake}/typed/dt=2026-10-20/t.parquet' (FORMAT parquet)",
    );
    let job = lake.job(
        r#"
name = "typed"
target = "silver.typed"
strategy = "replace_partition"
partition = "dt"

[source]
files = "typed/dt={run_date}/*.parquet"
"#,
    );
    let mut db = e.fresh();
    let db = db.as_mut();
    job.load(d("2026-10-20"), db).unwrap();
    let got = rows(
        db,
        "SELECT id, small, CAST(amount AS VARCHAR), CAST(big AS VARCHAR), ratio, CAST(name AS VARCHAR), CAST(day AS VARCHAR), CAST(ts AS VARCHAR),
                tstz, flag, CAST(tm AS VARCHAR), CAST(u AS VARCHAR), CAST(ub AS VARCHAR) FROM silver.typed",
    );
    assert_eq!(got[0][..4], ["1", "7", "\"12.50\"", "\"123456789012345678.1234567890\""]);
    assert_eq!(got[0][4], "0.1");
    assert_eq!(got[0][5], "\"ünï 'q'\"");
    assert_eq!(got[0][6..8], ["\"1999-12-31\"", "\"2026-10-20 08:00:00.123456\""]);
    // The instant, whatever each engine's display: 08:00:00.5+02 is 06:00:00.5 UTC.
    assert!(got[0][8].contains("2026-10-20 06:00:00.5"), "{}", got[0][8]);
    assert_eq!(got[0][9..], ["true", "\"23:59:59.25\"", "\"7e1f0c9a-3f4e-4c55-9d4b-0b1a2c3d4e5f\"", "\"3000000000\""]);
    assert_eq!(got[1][..4], ["2", "NULL", "\"-0.05\"", "\"-1.0000000000\""]);
    assert_eq!(job.load(d("2026-10-20"), db).unwrap().outcome, "skipped");
}

/// Late files: with `lookback`, a run reloads exactly the days whose files
/// changed, found from the files' hashes without reading a row.
fn lookback_reloads_the_days_whose_files_changed(e: &dyn EngineUnderTest) {
    let lake = Lake::new();
    for day in ["2026-10-18", "2026-10-19", "2026-10-20"] {
        lake.text(&format!("daily/{day}/orders.csv"), &format!("order_id,total\n1,{}.00\n2,5.00\n", &day[8..]));
    }
    let job = lake.job(
        r#"
name = "daily_csv"
target = "silver.daily"
strategy = "replace_partition"
partition = "dt"
lookback = 2

[source]
files = "daily/{run_date}/*.csv"
sql = "SELECT order_id, total, :run_date AS dt FROM input"
"#,
    );
    let mut db = e.fresh();
    let db = db.as_mut();
    let opts = fixpoint_core::RunOptions::default();
    let (w, err) = fixpoint_core::tools::lookback::run_window(&job, d("2026-10-20"), db, &opts, None);
    assert!(err.is_none(), "{err:?}");
    assert_eq!(w.written, 3);
    // A late row lands in the 19th's file.
    lake.text("daily/2026-10-19/orders.csv", "order_id,total\n1,19.00\n2,5.00\n3,7.00\n");
    let (w, err) = fixpoint_core::tools::lookback::run_window(&job, d("2026-10-20"), db, &opts, None);
    assert!(err.is_none(), "{err:?}");
    let actions: Vec<(&str, &str)> = w.days.iter().map(|x| (x.run_date.as_str(), x.action.as_str())).collect();
    assert_eq!(actions, [("2026-10-18", "skipped"), ("2026-10-19", "reloaded"), ("2026-10-20", "skipped")]);
    assert_eq!(count(db, "SELECT count(*) FROM silver.daily WHERE dt = DATE '2026-10-19'"), 3);
    assert_eq!(count(db, "SELECT count(*) FROM silver.daily"), 7);
    // A backfill over the window finds every day done from the files' hashes;
    // a replaced file reruns its day only.
    let days = fixpoint_core::RunDate::range(d("2026-10-18"), d("2026-10-20"));
    let done = fixpoint_core::tools::backfill::done_dates(&job, &days, db).unwrap();
    assert_eq!(done.len(), 3);
    assert_eq!(done[&d("2026-10-19")].output_rows, 3);
    lake.text("daily/2026-10-18/orders.csv", "order_id,total\n1,18.50\n2,5.00\n");
    let outcomes: Vec<String> = fixpoint_core::tools::backfill::backfill(&job, &days, db, &Default::default(), |_| {})
        .into_iter()
        .map(|o| match o {
            fixpoint_core::tools::backfill::DateOutcome::Done(r) => r.outcome,
            other => format!("{other:?}"),
        })
        .collect();
    assert_eq!(outcomes, ["committed", "skipped", "skipped"]);
    assert_eq!(count(db, "SELECT count(*) FROM silver.daily WHERE total = 18.50"), 1);
}

/// A file source whose query also reads a table: the files alone cannot
/// decide the run key, so a changed dimension row reloads the day.
fn a_join_with_a_table_keys_on_the_rows(e: &dyn EngineUnderTest) {
    let lake = Lake::new();
    lake.text("f/2026-10-20/o.csv", "order_id,customer_id\n1,10\n2,11\n");
    let job = lake.job(
        r#"
name = "joined"
target = "silver.joined"
strategy = "replace_partition"
partition = "dt"

[source]
files = "f/{run_date}/*.csv"
sql = """
WITH o AS (SELECT * FROM input)
SELECT o.order_id, c.country, :run_date AS dt FROM o JOIN dim.customers AS c ON c.customer_id = o.customer_id
"""
"#,
    );
    assert!(!job.source.key_from_files());
    let mut db = e.fresh();
    let db = db.as_mut();
    exec(db, "CREATE SCHEMA dim;\nCREATE TABLE dim.customers (customer_id BIGINT, country VARCHAR);\nINSERT INTO dim.customers VALUES (10, 'FR'), (11, 'DE')");
    assert_eq!(job.load(d("2026-10-20"), db).unwrap().outcome, "committed");
    assert_eq!(job.load(d("2026-10-20"), db).unwrap().outcome, "skipped");
    exec(db, "UPDATE dim.customers SET country = 'IT' WHERE customer_id = 11");
    assert_eq!(status(&job, d("2026-10-20"), db).unwrap().state, DateState::SourceChanged);
    let r = job.load(d("2026-10-20"), db).unwrap();
    assert_eq!(r.outcome, "committed", "the dimension changed: the day is reloaded");
    assert_eq!(rows(db, "SELECT order_id, country FROM silver.joined"), [["1", "\"FR\""], ["2", "\"IT\""]]);
    assert!(lake.job(PARQUET_JOB).source.key_from_files());
}

/// The target's column names, in order.
fn column_names(db: &mut dyn fixpoint_core::Engine, table: &str) -> Option<Vec<String>> {
    let t = fixpoint_core::TableName::parse(table).unwrap();
    db.table_columns(&t).unwrap().map(|cols| cols.into_iter().map(|c| c.name).collect())
}

/// An empty (0-byte) file, or a CSV file whose first line names no column,
/// is refused up front, naming the file, even where new columns would be
/// appended: before, the reader made up a column `column0` for it, and a
/// day whose only file was empty was emptied. A header with no row is a
/// day without rows, which `min_rows` governs.
fn empty_and_headerless_files_are_refused_before_anything_changes(e: &dyn EngineUnderTest) {
    let lake = Lake::new();
    lake.text("e/dt=2026-10-20/a.csv", "order_ref,currency\nA1,EUR\nA2,USD\n");
    const JOB: &str = r#"
name = "empty_csv"
target = "silver.empty_csv"
strategy = "replace_partition"
partition = "dt"
on_schema_change = "append_new_columns"

[source]
files = "e/dt={run_date}/*.csv"
"#;
    let job = lake.job(JOB);
    let mut db = e.fresh();
    let db = db.as_mut();
    let r = job.load(d("2026-10-20"), db).unwrap();
    assert_eq!((r.outcome.as_str(), r.output_rows), ("committed", 2));
    let loaded = [["\"A1\"", "\"EUR\"", "\"2026-10-20\""], ["\"A2\"", "\"USD\"", "\"2026-10-20\""]];
    let read = "SELECT order_ref, currency, CAST(dt AS VARCHAR) FROM silver.empty_csv";
    let unchanged = |db: &mut dyn fixpoint_core::Engine| {
        assert_eq!(rows(db, read), loaded);
        assert_eq!(column_names(db, "silver.empty_csv").unwrap(), ["order_ref", "currency", "dt"], "no made-up column");
        assert_eq!(ledger::entries(db, None, None, None).unwrap().len(), 1);
    };

    // A 0-byte file beside the day's file, then a first line that names
    // nothing, then the day's only file emptied.
    for (file, content, says) in [
        ("b.csv", "", "is empty (0 bytes)"),
        ("b.csv", "\nA3,GBP\n", "has no header line"),
        ("b.csv", " , \r\nA3,GBP\n", "has no header line"),
        ("a.csv", "", "is empty (0 bytes)"),
    ] {
        lake.text(&format!("e/dt=2026-10-20/{file}"), content);
        let err = job.load(d("2026-10-20"), db).unwrap_err();
        assert!(matches!(err, Error::Files { .. }), "{file} {content:?}: {err}");
        assert_eq!(err.class(), ErrorClass::Data);
        assert!(err.to_string().starts_with(&format!("{file} (in ")) && err.to_string().contains(says), "{err}");
        assert!(err.to_string().contains("nothing was changed"), "{err}");
        assert!(err.hint().unwrap().contains("header line and no row"), "{err}");
        unchanged(db);
        if file == "b.csv" {
            lake.remove("e/dt=2026-10-20/b.csv");
        }
    }

    // Compressed: the reader finds the missing header (DuckDB would read `column0`).
    lake.write(
        &["e/dt=2026-10-20/gz/a.csv.gz"],
        "COPY (SELECT 'A4' AS order_ref, 'EUR' AS currency) TO '{lake}/e/dt=2026-10-20/gz/a.csv.gz' (HEADER true, COMPRESSION gzip);
         COPY (SELECT 1 AS x WHERE false) TO '{lake}/e/dt=2026-10-20/gz/b.csv.gz' (HEADER false, COMPRESSION gzip);",
    );
    let gz = lake.job(&JOB.replace("*.csv\"", "gz/*.csv.gz\""));
    let err = gz.load(d("2026-10-20"), db).unwrap_err();
    assert!(matches!(err, Error::Files { .. }), "{err}");
    assert!(err.to_string().starts_with("b.csv.gz (in ") && err.to_string().contains("has no header line"), "{err}");
    lake.text("e/dt=2026-10-20/a.csv", "order_ref,currency\nA1,EUR\nA2,USD\n");
    unchanged(db);

    // A header and no row: a day without rows (its columns read as text,
    // like the target's). With min_rows, refused…
    lake.text("e/dt=2026-10-20/a.csv", "order_ref,currency\n");
    let guarded = lake.job(&JOB.replace("partition = \"dt\"", "partition = \"dt\"\nmin_rows = 1"));
    let err = guarded.load(d("2026-10-20"), db).unwrap_err();
    assert!(matches!(err, Error::TooFewRows { rows: 0, min_rows: 1, .. }), "{err}");
    unchanged(db);
    // … without, it empties the day, and adds no column.
    let r = job.load(d("2026-10-20"), db).unwrap();
    assert_eq!((r.outcome.as_str(), r.output_rows), ("committed", 0));
    assert_eq!(count(db, "SELECT count(*) FROM silver.empty_csv"), 0);
    assert_eq!(column_names(db, "silver.empty_csv").unwrap(), ["order_ref", "currency", "dt"]);
}

/// A symbolic link under a `**` pattern back to the day's own folder
/// (`dt=…/loop -> .`) is refused, naming the link: before, the day's one
/// file was loaded once per level the system let the link be followed (41
/// times). A second name for a file loads it once.
fn a_symlink_cycle_is_refused_and_each_file_loads_once(e: &dyn EngineUnderTest) {
    let lake = Lake::new();
    let ten: String = std::iter::once("order_id,qty\n".to_owned()).chain((1..=10).map(|i| format!("{i},{}\n", i * 10))).collect();
    lake.text("s/dt=2026-10-20/a.csv", &ten);
    let job = lake.job(
        r#"
name = "linked"
target = "silver.linked"
strategy = "replace_partition"
partition = "dt"

[source]
files = "s/dt={run_date}/**/*.csv"
"#,
    );
    let mut db = e.fresh();
    let db = db.as_mut();
    let first = job.load(d("2026-10-20"), db).unwrap();
    assert_eq!((first.outcome.as_str(), first.output_rows), ("committed", 10));
    let read = "SELECT order_id, qty, CAST(dt AS VARCHAR) FROM silver.linked";
    let before = rows(db, read);
    assert_eq!(before.len(), 10);

    std::os::unix::fs::symlink(".", lake.path("s/dt=2026-10-20/loop")).unwrap();
    let err = job.load(d("2026-10-20"), db).unwrap_err();
    assert!(matches!(err, Error::Files { .. }), "{err}");
    assert_eq!(err.class(), ErrorClass::Data);
    let m = err.to_string();
    assert!(m.contains("s/dt=2026-10-20/loop leads back to ") && m.contains("symbolic link cycle") && m.contains("nothing was changed"), "{m}");
    assert!(err.hint().unwrap().contains("remove the link"), "{err}");
    assert_eq!(rows(db, read), before);
    assert_eq!(count(db, "SELECT count(*) FROM silver.linked"), 10);
    assert_eq!(ledger::entries(db, None, None, None).unwrap().len(), 1);

    // A second name for the same file: read once, so the day's input is
    // the same as before (the same run key: skipped).
    std::fs::remove_file(lake.path("s/dt=2026-10-20/loop")).unwrap();
    std::os::unix::fs::symlink("a.csv", lake.path("s/dt=2026-10-20/b.csv")).unwrap();
    let again = job.load(d("2026-10-20"), db).unwrap();
    assert_eq!(again.outcome, "skipped", "{:?}", again.skip_reason);
    assert_eq!(again.run_key, first.run_key);
    let forced = job.load_with(d("2026-10-20"), db, &fixpoint_core::RunOptions { force: true, ..Default::default() }).unwrap();
    assert_eq!((forced.outcome.as_str(), forced.output_rows), ("committed", 10));
    assert_eq!(forced.input_files.unwrap().files.iter().map(|f| f.path.as_str()).collect::<Vec<_>>(), ["a.csv"]);
    assert_eq!(rows(db, read), before);
}

/// A `.json` file holding one top-level array of objects is read as one row
/// per element (DuckDB's reader finds the layout per file, on both
/// engines), beside JSON Lines; a file whose values are not objects (a list
/// of numbers, an empty array) is refused naming it, instead of loading a
/// made-up column `json`.
fn a_json_array_is_one_row_per_element_and_other_values_are_refused(e: &dyn EngineUnderTest) {
    let lake = Lake::new();
    lake.text("j/2026-10-20/a.json", "[{\"order_id\": 1, \"status\": \"new\"},\n {\"order_id\": 2, \"status\": \"paid\"}]\n");
    lake.text("j/2026-10-20/b.jsonl", "{\"order_id\": 3, \"status\": \"new\"}\n");
    let job = lake.job(
        r#"
name = "json_shapes"
target = "silver.json_shapes"
strategy = "replace_partition"
partition = "dt"

[source]
files = "j/{run_date}/*"
format = "json"
sql = "SELECT order_id, status, :run_date AS dt FROM input"
"#,
    );
    let mut db = e.fresh();
    let db = db.as_mut();
    let r = job.load(d("2026-10-20"), db).unwrap();
    assert_eq!((r.outcome.as_str(), r.output_rows), ("committed", 3));
    let read = "SELECT order_id, status, CAST(dt AS VARCHAR) FROM silver.json_shapes";
    let loaded = [["1", "\"new\"", "\"2026-10-20\""], ["2", "\"paid\"", "\"2026-10-20\""], ["3", "\"new\"", "\"2026-10-20\""]];
    assert_eq!(rows(db, read), loaded);

    for content in ["[1, 2]\n", "[]\n", "1\n2\n"] {
        lake.text("j/2026-10-20/c.json", content);
        let err = job.load(d("2026-10-20"), db).unwrap_err();
        assert!(matches!(err, Error::Files { .. }), "{content:?}: {err}");
        assert_eq!(err.class(), ErrorClass::Data);
        assert!(err.to_string().starts_with("c.json (in ") && err.to_string().contains("holds no JSON object"), "{content:?}: {err}");
        assert_eq!(rows(db, read), loaded);
        assert_eq!(ledger::entries(db, None, None, None).unwrap().len(), 1);
    }
}

/// A file with its own column named like a hive-style folder of its path
/// (`dt=2026-10-20/` holding a file whose `dt` is 2026-10-19): refused,
/// naming the file, the column and both values, instead of the folder's
/// value silently replacing the file's. Agreeing values load (a NULL in the
/// file is given the folder's value).
fn a_files_own_column_must_agree_with_its_hive_folder(e: &dyn EngineUnderTest) {
    let lake = Lake::new();
    lake.write(
        &["h/dt=2026-10-20/part-0.parquet"],
        "COPY (SELECT * FROM (VALUES (1, DATE '2026-10-20'), (2, NULL)) AS t(order_id, dt)) TO '{lake}/h/dt=2026-10-20/part-0.parquet' (FORMAT parquet)",
    );
    const JOB: &str = r#"
name = "hive_own"
target = "silver.hive_own"
strategy = "replace_partition"
partition = "dt"

[source]
files = "h/dt={run_date}/*.parquet"
"#;
    let job = lake.job(JOB);
    let mut db = e.fresh();
    let db = db.as_mut();
    let r = job.load(d("2026-10-20"), db).unwrap();
    assert_eq!((r.outcome.as_str(), r.output_rows), ("committed", 2));
    let read = "SELECT order_id, CAST(dt AS VARCHAR) FROM silver.hive_own";
    let loaded = [["1", "\"2026-10-20\""], ["2", "\"2026-10-20\""]];
    assert_eq!(rows(db, read), loaded);

    // Another day's rows in the day's folder.
    lake.write(&[], "COPY (SELECT 3 AS order_id, DATE '2026-10-19' AS dt) TO '{lake}/h/dt=2026-10-20/part-1.parquet' (FORMAT parquet)");
    let err = job.load(d("2026-10-20"), db).unwrap_err();
    assert!(matches!(err, Error::Files { .. }), "{err}");
    assert_eq!(err.class(), ErrorClass::Data);
    let m = err.to_string();
    assert!(m.starts_with("part-1.parquet (in ") && m.contains("own column \"dt\" holding \"2026-10-19\"") && m.contains("dt=2026-10-20"), "{m}");
    assert!(m.contains("nothing was changed"), "{m}");
    assert_eq!(rows(db, read), loaded);
    assert_eq!(ledger::entries(db, None, None, None).unwrap().len(), 1);
    lake.remove("h/dt=2026-10-20/part-1.parquet");

    // The same in CSV, whose reader types the column itself.
    lake.text("hc/dt=2026-10-20/a.csv", "order_id,dt\n1,2026-10-20\n");
    let csv = lake.job(&JOB.replace("h/dt={run_date}/*.parquet", "hc/dt={run_date}/*.csv").replace("hive_own", "hive_csv"));
    assert_eq!(csv.load(d("2026-10-20"), db).unwrap().output_rows, 1);
    lake.text("hc/dt=2026-10-20/b.csv", "order_id,dt\n2,2026-10-20\n3,2026-10-21\n");
    let err = csv.load(d("2026-10-20"), db).unwrap_err();
    assert!(matches!(err, Error::Files { .. }), "{err}");
    assert!(err.to_string().starts_with("b.csv (in ") && err.to_string().contains("holding \"2026-10-21\""), "{err}");
    assert_eq!(rows(db, "SELECT order_id, CAST(dt AS VARCHAR) FROM silver.hive_csv"), [["1", "\"2026-10-20\""]]);
    assert_eq!(rows(db, read), loaded);
}

/// One change to a day's files, or a run of the day.
#[derive(Debug, Clone)]
enum FileOp {
    /// File `n` written with these (id, amount) rows.
    Put(usize, Vec<(i64, i64)>),
    /// File `n` written again with the same bytes.
    Rewrite(usize),
    Remove(usize),
    /// The `_SUCCESS` marker written or removed.
    Marker(bool),
    Run,
    Force,
}

fn file_op() -> impl proptest::strategy::Strategy<Value = FileOp> {
    use proptest::prelude::*;
    let rows = proptest::collection::vec((1i64..6, 0i64..100), 1..4);
    prop_oneof![
        3 => (0usize..3, rows).prop_map(|(n, r)| FileOp::Put(n, r)),
        1 => (0usize..3).prop_map(FileOp::Rewrite),
        1 => (0usize..3).prop_map(FileOp::Remove),
        1 => proptest::bool::weighted(0.8).prop_map(FileOp::Marker),
        4 => Just(FileOp::Run),
        1 => Just(FileOp::Force),
    ]
}

/// Cases of [`random_file_changes_match_the_model`]: 12, or `FIXPOINT_FILE_CASES`.
fn file_cases() -> u32 {
    std::env::var("FIXPOINT_FILE_CASES").ok().and_then(|n| n.parse().ok()).unwrap_or(12)
}

/// Random changes to a day's CSV files (new content, the same bytes
/// written again, files removed, the marker written and removed) between
/// runs and forced runs: each run is refused (no marker, no file), skipped
/// (the files as the last committed run read them) or committed, as a
/// model of the files says; the day holds exactly the rows of the files
/// the last committed run read; one ledger row per commit; a refused run
/// changes nothing. Locally and (`s3_files::`) on S3, where a file written
/// again is a new object with the same ETag.
fn random_file_changes_match_the_model(e: &dyn EngineUnderTest) {
    random_file_changes(e, Some("SELECT CAST(id AS BIGINT) AS id, CAST(amount AS BIGINT) AS amount, :run_date AS dt FROM input"));
}

/// The same with no `sql`: the files loaded as they are (their `dt` from
/// the folder), which PostgreSQL copies straight into the target (each
/// committed run's `method` says `delete+copy` there).
fn random_file_changes_as_they_are_match_the_model(e: &dyn EngineUnderTest) {
    random_file_changes(e, None);
}

fn random_file_changes(e: &dyn EngineUnderTest, sql: Option<&str>) {
    use proptest::test_runner::{Config, TestCaseError, TestRunner};
    let ops = proptest::collection::vec(file_op(), 1..14);
    let mut runner = TestRunner::new(Config { cases: file_cases(), failure_persistence: None, ..Config::default() });
    let result = runner.run(&ops, |ops| {
        let lake = Lake::new();
        let mut spec = String::from(
            r#"
name = "events"
target = "silver.events"
strategy = "replace_partition"
partition = "dt"

[source]
files = "ev/dt={run_date}/*.csv"
require_marker = "_SUCCESS"
"#,
        );
        if let Some(sql) = sql {
            spec.push_str(&format!("sql = \"{sql}\"\n"));
        }
        let job = lake.job(&spec);
        let mut db = e.fresh();
        let db = db.as_mut();
        // PostgreSQL's accelerator copies files loaded as they are straight into the target.
        let copied = sql.is_none() && db.name() == "postgres" && db.accelerator().is_some();
        let file = |n: usize| format!("ev/dt=2026-10-20/f{n}.csv");
        let mut files: std::collections::BTreeMap<usize, Vec<(i64, i64)>> = Default::default();
        let mut marker = false;
        let mut loaded: Option<std::collections::BTreeMap<usize, Vec<(i64, i64)>>> = None;
        let mut commits = 0;
        for (i, op) in ops.iter().enumerate() {
            match op {
                FileOp::Put(n, rows) => {
                    let body: String = rows.iter().map(|(id, a)| format!("{id},{a}\n")).collect();
                    lake.text(&file(*n), &format!("id,amount\n{body}"));
                    files.insert(*n, rows.clone());
                }
                FileOp::Rewrite(n) if files.contains_key(n) => lake.rewrite(&file(*n)),
                FileOp::Remove(n) if files.contains_key(n) => {
                    lake.remove(&file(*n));
                    files.remove(n);
                }
                FileOp::Marker(on) if *on != marker => {
                    if *on {
                        lake.put("ev/dt=2026-10-20/_SUCCESS", b"");
                    } else {
                        lake.remove("ev/dt=2026-10-20/_SUCCESS");
                    }
                    marker = *on;
                }
                FileOp::Run | FileOp::Force => {
                    let force = matches!(op, FileOp::Force);
                    let ledger_rows = |db: &mut dyn fixpoint_core::Engine| ledger::entries(db, Some("events"), None, None).map(|e| e.len()).unwrap_or(0);
                    let before = ledger_rows(db);
                    let result = job.load_with(d("2026-10-20"), db, &fixpoint_core::RunOptions { force, ..Default::default() });
                    let expected = if !marker || files.is_empty() {
                        "refused"
                    } else if !force && loaded.as_ref() == Some(&files) {
                        "skipped"
                    } else {
                        "committed"
                    };
                    let got = match &result {
                        Ok(r) => r.outcome.clone(),
                        Err(e) if e.class() == ErrorClass::Data => "refused".to_owned(),
                        Err(e) => return Err(TestCaseError::fail(format!("step {i} {op:?}: {e}"))),
                    };
                    proptest::prop_assert_eq!(&got, expected, "step {} {:?} of {:?}: {:?}", i, op, &ops, result.as_ref().err().map(|e| e.to_string()));
                    if got == "committed" {
                        let m = result.as_ref().map(|r| r.method.as_str()).unwrap_or_default();
                        proptest::prop_assert_eq!(m == "delete+copy", copied, "step {} method {} of {:?}", i, m, &ops);
                        commits += 1;
                        loaded = Some(files.clone());
                    } else if got == "refused" {
                        proptest::prop_assert_eq!(ledger_rows(db), before, "a refused run wrote a ledger row");
                    }
                    if let Some(l) = &loaded {
                        let mut want: Vec<Vec<String>> = l.values().flatten().map(|(id, a)| vec![id.to_string(), a.to_string()]).collect();
                        want.sort();
                        proptest::prop_assert_eq!(rows(db, "SELECT id, amount FROM silver.events WHERE dt = DATE '2026-10-20'"), want, "step {} {:?} of {:?}", i, op, &ops);
                        proptest::prop_assert_eq!(ledger::entries(db, Some("events"), None, None).unwrap().len(), commits, "step {} of {:?}", i, &ops);
                    }
                }
                _ => {}
            }
        }
        Ok(())
    });
    if let Err(e) = result {
        panic!("{e}");
    }
}

/// Files not split by day, loaded as they are: a row of another day in
/// them refuses the run (on PostgreSQL after the files went straight into
/// the target: the transaction takes them back), and neither day changes.
fn a_row_of_another_day_in_the_files_changes_nothing(e: &dyn EngineUnderTest) {
    let lake = Lake::new();
    let write = |lake: &Lake, last_day: &str, last_total: &str| {
        lake.write(
            &["flat/orders.parquet"],
            &format!(
                "COPY (SELECT * FROM (VALUES (1, 5.25::DECIMAL(12,2), DATE '2026-10-20'), (2, 7.00::DECIMAL(12,2), DATE '2026-10-20'), \
                 (3, {last_total}::DECIMAL(12,2), DATE '{last_day}')) AS t(order_id, order_total, dt)) TO '{{lake}}/flat/orders.parquet' (FORMAT parquet)"
            ),
        )
    };
    write(&lake, "2026-10-20", "9.50");
    let job = lake.job("name = \"flat\"\ntarget = \"silver.flat\"\nstrategy = \"replace_partition\"\npartition = \"dt\"\n[source]\nfiles = \"flat/orders.parquet\"\n");
    let mut db = e.fresh();
    let db = db.as_mut();
    assert_eq!(job.load(d("2026-10-20"), db).unwrap().output_rows, 3);
    exec(db, "INSERT INTO silver.flat VALUES (9, 1.00, DATE '2026-10-21')");
    let all = |db: &mut dyn fixpoint_core::Engine| rows(db, "SELECT order_id, CAST(order_total AS VARCHAR), CAST(dt AS VARCHAR) FROM silver.flat ORDER BY order_id");
    let before = all(db);
    write(&lake, "2026-10-21", "9.50");
    let err = job.load(d("2026-10-20"), db).unwrap_err();
    assert!(matches!(err, Error::OutOfPartition { rows: 1, .. }), "{err}");
    assert!(err.to_string().contains("order_id: 3"), "the sample shows the row: {err}");
    assert_eq!(all(db), before, "neither day changed");
    assert_eq!(ledger::entries(db, Some("flat"), None, None).unwrap().len(), 1);
    // Fixed upstream: the day loads, the other day keeps its row.
    write(&lake, "2026-10-20", "9.75");
    let r = job.load(d("2026-10-20"), db).unwrap();
    assert_eq!((r.outcome.as_str(), r.output_rows), ("committed", 3), "{:?}", r.skip_reason);
    let mut want = before.clone();
    want[2][1] = "\"9.75\"".into();
    assert_eq!(all(db), want);
}

/// A merge from files whose batch holds a tie is refused, naming the key,
/// after the first plan saw the rows and gave up (PostgreSQL's one
/// statement counts the tie, rolls back, and the plan that explains it
/// reads the files' rows again).
fn a_tie_in_merged_files_is_refused_by_name(e: &dyn EngineUnderTest) {
    let lake = Lake::new();
    let write = |lake: &Lake, second: &str| {
        lake.write(
            &["m/2026-10-20/c.parquet"],
            &format!(
                "COPY (SELECT * FROM (VALUES (1, 5.25::DECIMAL(12,2), TIMESTAMP '2026-10-20 08:00:00'), (1, {second}::DECIMAL(12,2), TIMESTAMP '2026-10-20 08:00:00'), \
                 (2, 7.00::DECIMAL(12,2), TIMESTAMP '2026-10-20 09:00:00')) AS t(order_id, order_total, updated_at)) TO '{{lake}}/m/2026-10-20/c.parquet' (FORMAT parquet)"
            ),
        )
    };
    write(&lake, "6.00");
    let job = lake.job("name = \"m\"\ntarget = \"silver.m\"\nstrategy = \"merge\"\nkey = [\"order_id\"]\nversion = \"updated_at\"\n[source]\nfiles = \"m/{run_date}/*.parquet\"\n");
    let mut db = e.fresh();
    let db = db.as_mut();
    exec(db, "CREATE SCHEMA silver;\nCREATE TABLE silver.m (order_id INTEGER, order_total DECIMAL(12,2), updated_at TIMESTAMP)");
    let err = job.load(d("2026-10-20"), db).unwrap_err().to_string();
    assert!(err.contains("1 key(s) have two different rows at the same version (updated_at), e.g. order_id = 1"), "{err}");
    assert_eq!(count(db, "SELECT count(*) FROM silver.m"), 0);
    write(&lake, "5.25");
    let r = job.load(d("2026-10-20"), db).unwrap();
    assert_eq!((r.rows_inserted, r.duplicates_collapsed), (2, 1));
    assert_eq!(rows(db, "SELECT order_id, CAST(order_total AS VARCHAR) FROM silver.m ORDER BY order_id"), [["1", "\"5.25\""], ["2", "\"7.00\""]]);
}

// Every engine, and PostgreSQL again without its accelerated plans (the
// guard scan, then INSERT … SELECT; files through the staging table).
fixpoint_scenarios::scenarios_and_postgres_portable!(
    random_file_changes_match_the_model,
    random_file_changes_as_they_are_match_the_model,
    empty_and_headerless_files_are_refused_before_anything_changes,
    a_symlink_cycle_is_refused_and_each_file_loads_once,
    a_json_array_is_one_row_per_element_and_other_values_are_refused,
    a_files_own_column_must_agree_with_its_hive_folder,
    a_join_with_a_table_keys_on_the_rows,
    lookback_reloads_the_days_whose_files_changed,
    a_day_of_parquet_files_loads_and_reloads,
    incomplete_days_are_refused_and_change_nothing,
    csv_and_json_lines_load_and_name_bad_lines,
    cdc_files_merge,
    types_map_faithfully,
    a_row_of_another_day_in_the_files_changes_nothing,
    a_tie_in_merged_files_is_refused_by_name,
);


/// A type PostgreSQL has no faithful equivalent for is refused, naming the column.
#[test]
fn postgres_refuses_an_unmappable_column_by_name() {
    let Some(pg) = PgUnderTest::get() else { return };
    let lake = Lake::new();
    lake.write(&["l/dt=2026-10-20/t.parquet"], "COPY (SELECT 1 AS id, [1, 2] AS tags) TO '{lake}/l/dt=2026-10-20/t.parquet' (FORMAT parquet)");
    let job = lake.job("name = \"l\"\ntarget = \"s.l\"\nstrategy = \"replace_partition\"\npartition = \"dt\"\n[source]\nfiles = \"l/dt={run_date}/*.parquet\"\n");
    let mut db = pg.fresh();
    let err = job.load(d("2026-10-20"), db.as_mut()).unwrap_err();
    assert!(matches!(err, Error::Schema { .. }), "{err}");
    assert!(err.to_string().contains("column \"tags\" has the type INTEGER[]"), "{err}");
    assert!(db.table_columns(&fixpoint_core::TableName::parse("s.l").unwrap()).unwrap().is_none());
}

/// The scenarios again with the day's files on the local S3-compatible
/// server (`s3://fixpoint-test/…`, scripts/moto-local.sh), on every engine
/// with file sources (feature `s3`). Symbolic links have no S3 equivalent.
#[cfg(feature = "s3")]
mod s3_files {
    use super::*;

    /// Runs `scenario` with its lakes on S3, or says `skipped` without the server.
    fn on_s3(scenario: impl FnOnce()) {
        if fixpoint_core::job::objects::test_s3_endpoint().is_none() {
            return;
        }
        ON_S3.with(|on| on.set(true));
        scenario();
    }

    /// The scenarios on one engine, in a module of its own.
    macro_rules! on_s3 {
        ($module:ident, $engine:expr; $($name:ident),* $(,)?) => {
            mod $module {
                $(
                    #[test]
                    fn $name() {
                        if let Some(engine) = $engine {
                            super::on_s3(|| super::super::$name(&engine));
                        }
                    }
                )*
            }
        };
    }

    /// `$then!` over the scenarios that run on S3 on every engine, and `$extra`.
    macro_rules! file_scenarios {
        ($then:ident, $module:ident, $engine:expr; $($extra:ident),*) => {
            $then!($module, $engine;
                empty_and_headerless_files_are_refused_before_anything_changes,
                a_json_array_is_one_row_per_element_and_other_values_are_refused,
                a_files_own_column_must_agree_with_its_hive_folder,
                a_join_with_a_table_keys_on_the_rows,
                lookback_reloads_the_days_whose_files_changed,
                a_day_of_parquet_files_loads_and_reloads,
                incomplete_days_are_refused_and_change_nothing,
                csv_and_json_lines_load_and_name_bad_lines,
                cdc_files_merge,
                random_file_changes_match_the_model,
                random_file_changes_as_they_are_match_the_model
                $(, $extra)*
            );
        };
    }

    file_scenarios!(on_s3, duckdb, Some(fixpoint_scenarios::DuckDbUnderTest); types_map_faithfully);
    file_scenarios!(on_s3, postgres, fixpoint_scenarios::PgUnderTest::get(); types_map_faithfully);
    // Delta: not the types scenario (a Delta table holds no TIME).
    #[cfg(feature = "delta")]
    file_scenarios!(on_s3, delta, Some(fixpoint_scenarios::DeltaUnderTest););

    /// The run key is made of the objects' keys, sizes and ETags as the
    /// server gives them (each ETag read back here with a HEAD request);
    /// an object rewritten between the listing and the read is refused,
    /// naming it, and nothing is loaded.
    #[test]
    fn objects_are_keyed_by_etag_and_read_exactly_as_listed() {
        let Some(_) = fixpoint_core::job::objects::test_s3_endpoint() else { return };
        ON_S3.with(|on| on.set(true));
        let lake = Lake::new();
        lake.write(PARTS_20, &orders_20());
        let job = lake.job(PARQUET_JOB);
        let source = job.source.files.as_ref().unwrap();
        let mirror = lake.s3.as_ref().unwrap();

        let files = source.resolve(d("2026-10-20")).unwrap().unwrap();
        assert_eq!(files.kind(), "files-s3-etag-v1");
        assert_eq!(files.shown_base(), mirror.url("bronze/orders/dt=2026-10-20"));
        for (f, rel) in files.files.iter().zip(PARTS_20) {
            assert_eq!(f.etag.as_deref(), Some(mirror.etag(rel).as_str()), "{rel}");
            assert_eq!(f.size, std::fs::metadata(lake.path(rel)).unwrap().len());
        }
        // Listed again, unchanged: the same fingerprint; one object
        // rewritten with other bytes: another.
        assert_eq!(source.resolve(d("2026-10-20")).unwrap().unwrap().checksum, files.checksum);

        // Rewritten after the listing, before the read: refused, by name.
        let mut listed = files.clone();
        lake.write(&[], &PART_1.replace("7.00::DECIMAL", "7.01::DECIMAL"));
        let err = listed.fetch().unwrap_err();
        assert_eq!(err.class(), ErrorClass::Data, "{err}");
        assert!(err.to_string().contains(&mirror.url(PARTS_20[1])) && err.to_string().contains("changed or was removed after it was listed"), "{err}");
        let now = source.resolve(d("2026-10-20")).unwrap().unwrap();
        assert_ne!(now.checksum, files.checksum);

        // Read as listed now: the local copies are the objects' bytes, in
        // a folder removed with the last copy of the files.
        let mut now = now;
        now.fetch().unwrap();
        for (f, rel) in now.files.iter().zip(PARTS_20) {
            assert_eq!(std::fs::read(now.base.join(&f.path)).unwrap(), std::fs::read(lake.path(rel)).unwrap());
        }
        let folder = now.base.clone();
        assert!(folder.is_dir());
        drop(now);
        assert!(!folder.exists(), "the run's copies are removed");

        // A missing bucket names the bucket and the fix.
        let pattern = source.pattern.replace("s3://fixpoint-test/", "s3://fixpoint-no-such-bucket/");
        let mut other = fixpoint_core::job::files::FileSource::parse(&pattern, None, false, None, PathBuf::new()).unwrap();
        other.s3_options = mirror.options();
        let err = other.resolve(d("2026-10-20")).unwrap_err();
        assert_eq!(err.class(), ErrorClass::Input, "{err}");
        assert!(err.to_string().contains("fixpoint-no-such-bucket does not exist"), "{err}");
    }
}
