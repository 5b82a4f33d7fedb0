//! What only Spark has: concurrent runs without transactions across
//! statements (a run holds a lease, a view in the `fixpoint` database that
//! the metastore creates atomically, from its guards to its ledger row, so
//! two runs of one partition at once end as one run), and tables stored
//! partitioned. (Feature `spark`; skipped without a server, failing under
//! CI=true.)

#[cfg(feature = "spark")]
mod spark {
    use std::time::Duration;

    use fixpoint_core::{ledger, Error, FailPoint, FaultAction, RunOptions, Sql};
    use fixpoint_scenarios::*;

    fn lease_view(job: &str, target: &str, scope: &str) -> String {
        let key = format!("fixpoint:{job}:{target}:{scope}");
        format!("fixpoint.lease__{}", &fixpoint_core::runkey::hash_hex(&["fixpoint-lease-v1", &key])[..16])
    }

    #[test]
    fn two_runs_at_once_end_as_one_run() {
        let Some(spark) = SparkUnderTest::get() else { return };
        let _one_at_a_time = spark.exclusive();
        let mut db = spark.fresh();
        exec(db.as_mut(), BRONZE);
        let job = job(SILVER_JOB);
        // The first run pauses after its guards, holding the lease; the
        // second starts meanwhile, waits, then finds the day as recorded.
        let first = {
            let job = job.clone();
            let mut session = spark.session();
            std::thread::spawn(move || {
                let opts = RunOptions { fault: Some((FailPoint::AfterGuards, FaultAction::Pause(4000))), ..Default::default() };
                job.load_with(d("2026-10-20"), &mut session, &opts)
            })
        };
        std::thread::sleep(Duration::from_millis(1500));
        // While it holds the lease, --no-wait is refused at once, naming it.
        let mut third = spark.session();
        let busy = job.load_with(d("2026-10-20"), &mut third, &RunOptions { no_wait: true, ..Default::default() }).unwrap_err();
        assert!(matches!(busy, Error::Busy { .. }), "{busy}");
        assert!(busy.to_string().contains("holds the lease on silver.orders (2026-10-20)"), "{busy}");
        let mut second = spark.session();
        let b = job.load(d("2026-10-20"), &mut second).unwrap();
        let a = first.join().unwrap().unwrap();
        assert_eq!(a.outcome, "committed");
        assert_eq!(b.outcome, "skipped", "the second run waited for the first and found its output");
        assert_eq!(b.run_key, a.run_key);
        assert_eq!(day_fp(db.as_mut(), "silver.orders", "2026-10-20", &["load_id"]), a.output());
        assert_eq!(count(db.as_mut(), "SELECT count(*) FROM silver.orders"), 4);
        assert_eq!(ledger::entries(db.as_mut(), Some("silver_orders"), None, None).unwrap().len(), 1, "one run recorded");
        // Both released their lease.
        let view = lease_view("silver_orders", "silver.orders", "2026-10-20");
        assert!(db.query(&Sql::raw(format!("SELECT * FROM {view}"))).is_err(), "the lease view is gone");
    }

    #[test]
    fn an_expired_lease_of_a_dead_run_is_broken() {
        let Some(spark) = SparkUnderTest::get() else { return };
        let _one_at_a_time = spark.exclusive();
        let mut db = spark.fresh();
        exec(db.as_mut(), BRONZE);
        let job = job(SILVER_JOB);
        // A run that died holding its lease, long expired.
        let view = lease_view("silver_orders", "silver.orders", "2026-10-20");
        exec(db.as_mut(), "CREATE DATABASE IF NOT EXISTS fixpoint");
        exec(db.as_mut(), &format!("CREATE VIEW {view} TBLPROPERTIES ('fixpoint.owner' = 'dead-run', 'fixpoint.expires_ms' = '1') AS SELECT 1 AS held"));
        let r = job.load_with(d("2026-10-20"), db.as_mut(), &RunOptions { no_wait: true, ..Default::default() }).unwrap();
        assert_eq!(r.outcome, "committed");
        // A live lease of another run is not broken.
        exec(db.as_mut(), &format!("CREATE VIEW {view} TBLPROPERTIES ('fixpoint.owner' = 'live-run', 'fixpoint.expires_ms' = '99999999999999') AS SELECT 1 AS held"));
        let err = job.load_with(d("2026-10-20"), db.as_mut(), &RunOptions { no_wait: true, force: true, ..Default::default() }).unwrap_err();
        assert!(err.to_string().contains("run live-run"), "{err}");
        exec(db.as_mut(), &format!("DROP VIEW {view}"));
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
