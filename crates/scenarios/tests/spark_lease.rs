//! What only Spark has: concurrent runs without transactions across
//! statements (a run holds a lease, a generation of views in the `fixpoint`
//! database that the metastore creates atomically, renewed while the run
//! lives, from its guards to its ledger row, so two runs of one partition at
//! once end as one run), and tables stored partitioned. A run frozen past
//! its lease is in `crates/cli/tests/cli.rs` (it needs a process to stop). (Feature `spark`; skipped without a server, failing under
//! CI=true.)

#[cfg(feature = "spark")]
mod spark {
    use std::time::Duration;

    use fixpoint_core::{Error, FailPoint, FaultAction, RunOptions, Sql};
    use fixpoint_core::run::ledger;
    use fixpoint_scenarios::*;

    /// The views of a lease's generations (`fixpoint.lease__<hash>__g<n>`),
    /// read with plain SQL, oldest first: (name, properties).
    fn lease_views(db: &mut dyn fixpoint_core::Engine, job: &str, target: &str, scope: &str) -> Vec<(String, Vec<(String, String)>)> {
        let key = format!("fixpoint:{job}:{target}:{scope}");
        let prefix = format!("lease__{}__g", &fixpoint_core::job::digest::hash_hex(&["fixpoint-lease-v2", &key])[..16]);
        let Ok(listed) = db.query(&Sql::raw(format!("SHOW VIEWS IN fixpoint LIKE '{prefix}*'"))) else { return Vec::new() };
        let mut views: Vec<(u64, String)> = listed
            .rows
            .iter()
            .filter_map(|r| r.get(1).and_then(|v| v.as_str()).map(str::to_owned))
            .filter_map(|n| n.strip_prefix(&prefix).and_then(|g| g.parse().ok()).map(|g| (g, n.clone())))
            .collect();
        views.sort();
        views
            .into_iter()
            .map(|(_, name)| {
                let props = db.query(&Sql::raw(format!("SHOW TBLPROPERTIES fixpoint.{name}"))).unwrap_or_else(|e| panic!("{e}"));
                let props = props
                    .rows
                    .iter()
                    .filter_map(|r| Some((r.first()?.as_str()?.to_owned(), r.get(1)?.as_str()?.to_owned())))
                    .filter(|(k, _)| k.starts_with("fixpoint."))
                    .collect();
                (name, props)
            })
            .collect()
    }

    fn prop<'a>(props: &'a [(String, String)], key: &str) -> Option<&'a str> {
        props.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str())
    }

    #[test]
    fn two_runs_at_once_end_as_one_run() {
        let Some(spark) = SparkUnderTest::get() else { return };
        let _one_at_a_time = spark.exclusive();
        let mut db = spark.fresh();
        exec(db.as_mut(), BRONZE);
        let job = job(SILVER_JOB);
        // The first run pauses after its guards for 5 s, holding a lease of
        // 2 s that it renews meanwhile; the second starts meanwhile, waits,
        // then finds the day as recorded.
        let first = {
            let job = job.clone();
            let mut session = spark.session().with_lease(Duration::from_secs(2));
            std::thread::spawn(move || {
                let opts = RunOptions { fault: Some((FailPoint::AfterGuards, FaultAction::Pause(5000))), ..Default::default() };
                job.load_with(d("2026-10-20"), &mut session, &opts)
            })
        };
        // Past the first lease's own length: only its renewal keeps it.
        std::thread::sleep(Duration::from_millis(3500));
        let mut third = spark.session();
        let busy = job.load_with(d("2026-10-20"), &mut third, &RunOptions { no_wait: true, ..Default::default() }).unwrap_err();
        assert!(matches!(busy, Error::Busy { .. }), "{busy}");
        assert!(busy.to_string().contains("holds the lease on silver.orders (2026-10-20)"), "{busy}");
        let views = lease_views(db.as_mut(), "silver_orders", "silver.orders", "2026-10-20");
        assert_eq!(views.len(), 1, "{views:?}");
        let until: u64 = prop(&views[0].1, "fixpoint.expires_ms").unwrap().parse().unwrap();
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as u64;
        assert!(until > now, "renewed: its expiry {until} lies ahead of {now}");
        let mut second = spark.session();
        let b = job.load(d("2026-10-20"), &mut second).unwrap();
        let a = first.join().unwrap().unwrap();
        assert_eq!(a.outcome, "committed");
        assert_eq!(b.outcome, "skipped", "the second run waited for the first and found its output");
        assert_eq!(b.run_key, a.run_key);
        assert_eq!(day_fp(db.as_mut(), "silver.orders", "2026-10-20", &["load_id"]), a.output());
        assert_eq!(count(db.as_mut(), "SELECT count(*) FROM silver.orders"), 4);
        assert_eq!(ledger::entries(db.as_mut(), Some("silver_orders"), None, None).unwrap().len(), 1, "one run recorded");
        // Both released it: one generation per take, both released (the
        // older ones are dropped once four have gathered).
        let views = lease_views(db.as_mut(), "silver_orders", "silver.orders", "2026-10-20");
        assert_eq!(views.len(), 2, "two takes, two generations: {views:?}");
        assert!(views[1].0.ends_with("__g1"), "two takes, two generations: {views:?}");
        assert!(views.iter().all(|v| prop(&v.1, "fixpoint.released") == Some("true")), "{views:?}");
    }

    #[test]
    fn expired_leases_are_taken_over_and_unreadable_ones_count_as_held() {
        let Some(spark) = SparkUnderTest::get() else { return };
        let _one_at_a_time = spark.exclusive();
        let mut db = spark.fresh();
        exec(db.as_mut(), BRONZE);
        let job = job(SILVER_JOB);
        let key = "fixpoint:silver_orders:silver.orders:2026-10-20";
        let prefix = format!("fixpoint.lease__{}__g", &fixpoint_core::job::digest::hash_hex(&["fixpoint-lease-v2", key])[..16]);
        let lease = |g: u64, owner: &str, expires: &str| {
            format!("CREATE VIEW {prefix}{g} TBLPROPERTIES ('fixpoint.owner' = '{owner}', 'fixpoint.expires_ms' = '{expires}') AS SELECT 1 AS held")
        };
        // A run that died holding its lease, long expired: taken over by
        // creating the next generation.
        exec(db.as_mut(), "CREATE DATABASE IF NOT EXISTS fixpoint");
        exec(db.as_mut(), &lease(4, "dead-run", "1"));
        let r = job.load_with(d("2026-10-20"), db.as_mut(), &RunOptions { no_wait: true, ..Default::default() }).unwrap();
        assert_eq!(r.outcome, "committed");
        let gens = |db: &mut dyn fixpoint_core::Engine| lease_views(db, "silver_orders", "silver.orders", "2026-10-20").iter().map(|v| v.0.rsplit("__").next().unwrap().to_owned()).collect::<Vec<_>>();
        assert_eq!(gens(db.as_mut()), vec!["g4", "g5"]);
        // Older generations are dropped once four have gathered: the take
        // of g8 drops g4 … g7, and the views never pile up.
        for _ in 0..3 {
            job.load_with(d("2026-10-20"), db.as_mut(), &RunOptions { no_wait: true, force: true, ..Default::default() }).unwrap();
        }
        assert_eq!(gens(db.as_mut()), vec!["g8"], "older generations dropped");
        let views = lease_views(db.as_mut(), "silver_orders", "silver.orders", "2026-10-20");
        assert_eq!(prop(&views[0].1, "fixpoint.released"), Some("true"), "{views:?}");
        // A live lease of another run (the next generation) is not broken.
        exec(db.as_mut(), &lease(9, "live-run", "99999999999999"));
        let err = job.load_with(d("2026-10-20"), db.as_mut(), &RunOptions { no_wait: true, force: true, ..Default::default() }).unwrap_err();
        assert!(matches!(err, Error::Busy { .. }), "{err}");
        assert!(err.to_string().contains("run live-run"), "{err}");
        // Nor one whose expiry cannot be read: held, named, with the fix;
        // waiting (bounded by --wait) ends the same way.
        exec(db.as_mut(), &lease(10, "garbled-run", "soon"));
        let err = job.load_with(d("2026-10-20"), db.as_mut(), &RunOptions { no_wait: true, force: true, ..Default::default() }).unwrap_err();
        assert!(matches!(err, Error::Busy { .. }), "{err}");
        assert!(err.to_string().contains("cannot be read") && err.to_string().contains("counts as held") && err.to_string().contains("DROP VIEW"), "{err}");
        let mut waiting = spark.session().with_wait(Duration::from_secs(2));
        let started = std::time::Instant::now();
        let err = job.load_with(d("2026-10-20"), &mut waiting, &RunOptions { force: true, ..Default::default() }).unwrap_err();
        assert!(matches!(err, Error::Busy { .. }), "{err}");
        assert!(started.elapsed() >= Duration::from_secs(2) && started.elapsed() < Duration::from_secs(30), "waited {:?}", started.elapsed());
        assert_eq!(ledger::entries(db.as_mut(), Some("silver_orders"), None, None).unwrap().len(), 4, "only the first run and the three forced ones recorded");
        exec(db.as_mut(), &format!("DROP VIEW {prefix}10"));
        exec(db.as_mut(), &format!("DROP VIEW {prefix}9"));
    }

    /// The job of the observed-write test: its source's types differ from
    /// the target's (INT into BIGINT, DECIMAL(13,2) into DECIMAL(12,2)), in
    /// another column order, and lacks the target's `note`.
    const TYPED_JOB: &str = r#"
name = "typed"
target = "silver.typed"
strategy = "replace_partition"
partition = "dt"
on_schema_change = "append_new_columns"

[source]
sql = "SELECT order_id, CAST(customer_id AS INT) AS customer_id, CAST(order_total AS DECIMAL(13,2)) AS order_total, currency, dt FROM bronze.orders WHERE dt = :run_date"
"#;

    /// The day of silver.typed and the source's day, by plain SQL, sorted.
    fn typed_day(db: &mut dyn fixpoint_core::Engine) -> (Vec<Vec<String>>, Vec<Vec<String>>) {
        (
            rows(db, "SELECT order_id, customer_id, CAST(order_total AS STRING), note, currency FROM silver.typed WHERE dt = DATE '2026-10-20'"),
            rows(db, "SELECT order_id, customer_id, CAST(order_total AS STRING), CAST(NULL AS STRING), currency FROM bronze.orders WHERE dt = DATE '2026-10-20'"),
        )
    }

    /// Into an existing target, the day is written in one job that reads
    /// the source once and observes the rows as it writes them: the
    /// fingerprints it records are those a scan finds (the retry is
    /// skipped, by scans), rows of another day are refused naming one, an
    /// empty day is refused with `min_rows = 1` and drops the partition
    /// without it. A retry over a recorded day is skipped before the
    /// lease: while another run holds it, too.
    #[test]
    fn observed_writes_and_the_skip_before_the_lease() {
        let Some(spark) = SparkUnderTest::get() else { return };
        let _one_at_a_time = spark.exclusive();
        let mut db = spark.fresh();
        exec(db.as_mut(), BRONZE);
        exec(db.as_mut(), "CREATE SCHEMA silver;\nCREATE TABLE silver.typed (order_id BIGINT, customer_id BIGINT, order_total DECIMAL(12,2), note STRING, currency STRING, dt DATE) USING parquet PARTITIONED BY (dt)");
        exec(db.as_mut(), "INSERT INTO silver.typed VALUES (1, 10, 12.50, 'old', 'EUR', DATE '2026-10-19'), (99, 1, 1.00, 'old', 'EUR', DATE '2026-10-20')");
        let typed = job(TYPED_JOB);
        let first = typed.load(d("2026-10-20"), db.as_mut()).unwrap();
        assert_eq!((first.outcome.as_str(), first.method.as_str()), ("committed", "partition overwrite, observed"));
        assert_eq!((first.rows_inserted, first.rows_deleted, first.input_rows, first.output_rows), (6, 1, 6, 6));
        let (day, want) = typed_day(db.as_mut());
        assert_eq!(day, want, "the day holds the source's rows, note NULL");
        assert_eq!(rows(db.as_mut(), "SELECT order_id, note FROM silver.typed WHERE dt = DATE '2026-10-19'"), vec![vec!["1".to_owned(), "\"old\"".to_owned()]], "the other day is left alone");
        // What the write observed is what a scan of the day finds.
        assert_eq!(day_fp(db.as_mut(), "silver.typed", "2026-10-20", &[]), first.output());
        // The retry compares scans (the source's, the day's) with what was
        // observed and recorded: skipped.
        let again = typed.load(d("2026-10-20"), db.as_mut()).unwrap();
        assert_eq!((again.outcome.as_str(), again.run_key.as_str()), ("skipped", first.run_key.as_str()));
        let forced = typed.load_with(d("2026-10-20"), db.as_mut(), &RunOptions { force: true, ..Default::default() }).unwrap();
        assert_eq!((forced.method.as_str(), forced.rows_deleted, forced.run_key.as_str()), ("partition overwrite, observed", 6, first.run_key.as_str()));
        assert_eq!(forced.output(), first.output());

        // Skipped before the lease: a live lease of another run does not
        // keep a retry of a recorded day waiting; a forced run is busy.
        let key = "fixpoint:typed:silver.typed:2026-10-20";
        let prefix = format!("fixpoint.lease__{}__g", &fixpoint_core::job::digest::hash_hex(&["fixpoint-lease-v2", key])[..16]);
        let generations = lease_views(db.as_mut(), "typed", "silver.typed", "2026-10-20");
        let next: u64 = generations.last().map_or(0, |(n, _)| n.rsplit("__g").next().unwrap().parse::<u64>().unwrap() + 1);
        exec(db.as_mut(), &format!("CREATE VIEW {prefix}{next} TBLPROPERTIES ('fixpoint.owner' = 'live-run', 'fixpoint.expires_ms' = '99999999999999') AS SELECT 1 AS held"));
        let no_wait = RunOptions { no_wait: true, ..Default::default() };
        let skipped = typed.load_with(d("2026-10-20"), db.as_mut(), &no_wait).unwrap();
        assert_eq!(skipped.outcome, "skipped");
        let busy = typed.load_with(d("2026-10-20"), db.as_mut(), &RunOptions { force: true, no_wait: true, ..Default::default() }).unwrap_err();
        assert!(matches!(busy, Error::Busy { .. }), "{busy}");
        exec(db.as_mut(), &format!("DROP VIEW {prefix}{next}"));

        // A row of another day fails the write: refused by name, the day
        // as it was.
        let wide = job(&TYPED_JOB.replace("name = \"typed\"", "name = \"wide\"").replace("WHERE dt = :run_date", "WHERE dt >= :run_date"));
        let err = wide.load(d("2026-10-20"), db.as_mut()).unwrap_err();
        assert!(matches!(err, Error::OutOfPartition { rows: 1, .. }), "{err}");
        assert!(err.to_string().contains("2026-10-21"), "names the row: {err}");
        assert_eq!(day_fp(db.as_mut(), "silver.typed", "2026-10-20", &[]), first.output(), "nothing was written");

        // An empty day: refused with min_rows = 1, the day as it was;
        // without, the partition dropped.
        let empty = TYPED_JOB.replace("name = \"typed\"", "name = \"empty\"").replace("WHERE dt = :run_date", "WHERE dt = :run_date AND order_id < 0");
        let err = job(&empty.replace("on_schema_change", "min_rows = 1\non_schema_change")).load(d("2026-10-20"), db.as_mut()).unwrap_err();
        assert!(matches!(err, Error::TooFewRows { rows: 0, .. }), "{err}");
        assert_eq!(day_fp(db.as_mut(), "silver.typed", "2026-10-20", &[]), first.output(), "nothing was written");
        let emptied = job(&empty).load(d("2026-10-20"), db.as_mut()).unwrap();
        assert_eq!((emptied.method.as_str(), emptied.rows_inserted, emptied.rows_deleted, emptied.output_rows), ("partition overwrite, observed", 0, 6, 0));
        assert_eq!(rows(db.as_mut(), "SHOW PARTITIONS silver.typed"), vec![vec!["\"dt=2026-10-19\"".to_owned()]]);
        assert_eq!(count(db.as_mut(), "SELECT count(*) FROM silver.typed"), 1);
    }

    #[test]
    fn a_target_not_partitioned_by_the_day_is_refused() {
        let Some(spark) = SparkUnderTest::get() else { return };
        let _one_at_a_time = spark.exclusive();
        let mut db = spark.fresh();
        exec(db.as_mut(), BRONZE);
        exec(db.as_mut(), "CREATE SCHEMA silver;\nCREATE TABLE silver.orders (order_id BIGINT, customer_id BIGINT, order_total DECIMAL(12,2), currency STRING, updated_at TIMESTAMP, dt DATE, load_id STRING) USING parquet");
        let err = job(SILVER_JOB).load(d("2026-10-20"), db.as_mut()).unwrap_err();
        assert!(matches!(err, Error::Schema { .. }), "{err}");
        assert!(err.to_string().contains("silver.orders is not stored partitioned by dt"), "{err}");
        assert!(err.hint().unwrap().contains("PARTITIONED BY (dt)"), "{err}");
        assert_eq!(count(db.as_mut(), "SELECT count(*) FROM silver.orders"), 0);
        // A table the first run creates is partitioned by the job's column.
        exec(db.as_mut(), "DROP TABLE silver.orders");
        job(SILVER_JOB).load(d("2026-10-20"), db.as_mut()).unwrap();
        let parts = rows(db.as_mut(), "SHOW PARTITIONS silver.orders");
        assert_eq!(parts, vec![vec!["\"dt=2026-10-20\"".to_owned()]]);
    }
}
