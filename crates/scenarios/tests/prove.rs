//! `prove`'s mutation check and `diff`, run on every engine (Delta included).

use fixpoint_core::tools::diff::{diff, DiffOptions, Sides};
use fixpoint_core::tools::prove::{prove, ProveOptions};
use fixpoint_core::{Engine, ErrorClass, TableName};
use fixpoint_core::run::ledger;
use fixpoint_scenarios::*;

fn opts(mutate_key: &[(&str, &str)]) -> ProveOptions {
    ProveOptions { runs: 2, crash: false, mutate: true, mutate_key: mutate_key.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect() }
}

/// Schemas named like a proof's sandbox (`fixpoint_sandbox_<hex>`), by plain SQL.
const SANDBOX_SCHEMAS: &str = "SELECT count(*) FROM information_schema.schemata WHERE substr(schema_name, 1, 17) = 'fixpoint_sandbox_'";

fn sandbox_is_gone(db: &mut dyn fixpoint_core::Engine, job: &str) {
    assert_eq!(count(db, SANDBOX_SCHEMAS), 0, "the sandbox schema is dropped");
    let entries = ledger::entries(db, None, None, None).unwrap();
    assert!(entries.iter().all(|e| e.job == job), "no sandbox run left in the ledger: {:?}", entries.iter().map(|e| &e.job).collect::<Vec<_>>());
}

fn mutation_changes_one_output_row(e: &dyn EngineUnderTest) {
    let mut db = e.fresh();
    let db = db.as_mut();
    exec(db, BRONZE);
    let bronze = rows(db, "SELECT * FROM bronze.orders");
    let job = job(SILVER_JOB);
    let proof = prove(&job, d("2026-10-20"), db, &opts(&[])).unwrap();
    assert!(proof.proved, "{:?}", proof.failures);
    let m = proof.mutation.as_ref().unwrap();
    assert_eq!(m.outcome, "passed", "{m:?}");
    assert_eq!((m.table.as_str(), m.column.as_str(), m.change.as_str()), ("bronze.orders", "order_total", "order_total + 1"));
    assert_eq!((m.output_rows_removed, m.output_rows_added), (1, 1));
    assert!(m.row.iter().any(|c| c == "dt=2026-10-20"), "a row of the run's day: {:?}", m.row);
    assert_eq!(m.sample.len(), 2, "{:?}", m.sample);
    assert!(proof.verdict.ends_with("Mutation: changing one input row of bronze.orders (order_total + 1) changed exactly one output row."), "{}", proof.verdict);
    assert_eq!(rows(db, "SELECT * FROM bronze.orders"), bronze, "the user's source is untouched");
    sandbox_is_gone(db, "silver_orders");

    // --mutate-key picks the row; an older version of order 4 does not
    // feed the output, so the check says it could not conclude.
    let picked = prove(&job, d("2026-10-20"), db, &opts(&[("order_id", "3")])).unwrap();
    let m = picked.mutation.unwrap();
    assert_eq!(m.outcome, "passed");
    assert!(m.row.contains(&"order_id=3".to_string()), "{:?}", m.row);
    assert!(m.sample.iter().all(|s| s.contains("order_id: 3")), "{:?}", m.sample);
    let older = prove(&job, d("2026-10-20"), db, &opts(&[("order_id", "4"), ("order_total", "42.00")])).unwrap();
    let m = older.mutation.unwrap();
    assert_eq!(m.outcome, "inconclusive", "{m:?}");
    assert!(older.proved, "inconclusive is not a failure");
    sandbox_is_gone(db, "silver_orders");
}

fn mutation_catches_a_per_day_total_in_every_row(e: &dyn EngineUnderTest) {
    let mut db = e.fresh();
    let db = db.as_mut();
    exec(db, BRONZE);
    let job = job(r#"
name = "orders_with_day_total"
target = "silver.orders_total"
strategy = "replace_partition"
partition = "dt"

[source]
sql = """
SELECT order_id, order_total, sum(order_total) OVER () AS day_total, dt
FROM bronze.orders WHERE dt = :run_date AND currency = 'EUR'
"""
"#);
    let proof = prove(&job, d("2026-10-20"), db, &opts(&[])).unwrap();
    assert!(!proof.proved, "every row changes when one input row does");
    let m = proof.mutation.as_ref().unwrap();
    assert_eq!(m.outcome, "failed");
    assert_eq!(m.column, "order_total", "a measure before an identifier: {m:?}");
    assert_eq!((m.output_rows_removed, m.output_rows_added), (4, 4), "orders 3, 5, 5, 6 (EUR) all carry the total");
    assert_eq!(proof.failures.len(), 1);
    assert!(
        proof.failures[0].starts_with("the mutation check failed: changing one input row of bronze.orders (order_total + 1) changed 4 output rows (4 before, 4 after)"),
        "{}",
        proof.failures[0]
    );
    sandbox_is_gone(db, "orders_with_day_total");
}

fn merge_mutation_changes_one_key(e: &dyn EngineUnderTest) {
    let mut db = e.fresh();
    let db = db.as_mut();
    exec(db, BRONZE);
    let job = job(BRONZE_MERGE_JOB);
    let proof = prove(&job, d("2026-10-20"), db, &opts(&[])).unwrap();
    assert!(proof.proved, "{:?}", proof.failures);
    let m = proof.mutation.unwrap();
    assert_eq!((m.outcome.as_str(), m.output_keys_changed), ("passed", Some(1)), "{m:?}");
    assert_eq!((m.output_rows_removed, m.output_rows_added), (1, 1));
}

fn order_check_catches_a_row_number_over_ties(e: &dyn EngineUnderTest) {
    let mut db = e.fresh();
    let db = db.as_mut();
    exec(db, BRONZE);
    // Order 9: two versions with the same updated_at — a tie for a dedup on updated_at alone.
    exec(db, "INSERT INTO bronze.orders VALUES (9, 19, 1.00, 'EUR', TIMESTAMP '2026-10-20 15:00:00', DATE '2026-10-20'), (9, 19, 2.00, 'EUR', TIMESTAMP '2026-10-20 15:00:00', DATE '2026-10-20')");
    let tied = job(&SILVER_JOB.replace("ORDER BY updated_at DESC, order_total DESC, currency, customer_id", "ORDER BY updated_at DESC").replace("silver.orders", "silver.tied"));
    let proof = prove(&tied, d("2026-10-20"), db, &opts(&[])).unwrap();
    let order = proof.order.as_ref().unwrap();
    assert_eq!(order.outcome, "failed", "{order:?}");
    assert_eq!((order.output_rows_removed, order.output_rows_added), (1, 1), "order 9 flips between its two tied versions");
    assert!(!proof.proved);
    assert!(proof.failures[0].starts_with("the order check failed: the same input stored in the opposite order changed 1 output rows"), "{:?}", proof.failures);
    // The seed job breaks the tie with more columns: it passes.
    let fine = prove(&job(SILVER_JOB), d("2026-10-20"), db, &opts(&[])).unwrap();
    assert_eq!(fine.order.as_ref().unwrap().outcome, "passed");
    assert!(fine.proved, "{:?}", fine.failures);
    sandbox_is_gone(db, "silver_orders");
}

/// 10^digits rows: id, a value, a label and a day, written once for every engine.
fn numbers(db: &mut dyn fixpoint_core::Engine, table: &str, digits: u32) {
    let tens = "(VALUES (0), (1), (2), (3), (4), (5), (6), (7), (8), (9))";
    let from: Vec<String> = (0..digits).map(|i| format!("{tens} AS d{i}(v)")).collect();
    let id: Vec<String> = (0..digits).map(|i| format!("d{i}.v * {}", 10i64.pow(i))).collect();
    let id = format!("({})", id.join(" + "));
    exec(
        db,
        &format!(
            "CREATE TABLE {table} AS SELECT CAST({id} AS BIGINT) AS id, CAST({id} * 7 % 1000 AS DECIMAL(12,2)) AS amount, \
             CAST('n' || CAST({id} % 97 AS VARCHAR) AS VARCHAR) AS label, DATE '2026-10-01' + CAST({id} % 30 AS INTEGER) AS dt FROM {}",
            from.join(" CROSS JOIN ")
        ),
    );
}

fn diff_finds_exactly_the_differences(e: &dyn EngineUnderTest) {
    let mut db = e.fresh();
    let db = db.as_mut();
    exec(db, "CREATE SCHEMA s");
    numbers(db, "s.a", 5);
    exec(db, "CREATE TABLE s.b AS SELECT * FROM s.a");
    let (a, b) = (TableName::parse("s.a").unwrap(), TableName::parse("s.b").unwrap());
    let key = DiffOptions { key: vec!["id".into()], ..Default::default() };

    let same = diff(&mut Sides::One(&mut *db), &a, &b, &key).unwrap();
    assert!(same.identical);
    assert_eq!((same.fingerprint_a.rows, same.rows_transferred, same.segment_queries), (100_000, 0, 1), "equal fingerprints: no row read");
    assert_eq!(same.fingerprint_a, same.fingerprint_b);

    exec(db, "UPDATE s.b SET amount = 1.25, label = 'changed' WHERE id = 4242");
    let one = diff(&mut Sides::One(&mut *db), &a, &b, &key).unwrap();
    assert!(!one.identical);
    assert_eq!((one.only_in_a, one.only_in_b, one.changed), (0, 0, 1));
    assert_eq!(one.changed_rows.len(), 1);
    assert_eq!(one.changed_rows[0].key, vec!["id='4242'"]);
    let changes: Vec<(String, String, String)> = one.changed_rows[0].changes.iter().map(|c| (c.column.clone(), c.a.clone(), c.b.clone())).collect();
    assert_eq!(changes, vec![("amount".into(), "'694.00'".into(), "'1.25'".into()), ("label".into(), "'n71'".into(), "'changed'".into())]);
    assert!(one.rows_transferred < 1000, "only one of 256 segments is read: {}", one.rows_transferred);
    assert_eq!(one.segment_queries, 1);

    exec(db, "DELETE FROM s.b WHERE id = 17;\nINSERT INTO s.b VALUES (100000, 5.00, NULL, DATE '2026-10-02')");
    let three = diff(&mut Sides::One(&mut *db), &a, &b, &DiffOptions { key: vec!["id".into()], segment_rows: 50, ..Default::default() }).unwrap();
    assert_eq!((three.only_in_a, three.only_in_b, three.changed), (1, 1, 1));
    assert_eq!(three.only_in_a_rows, vec![vec!["id='17'", "amount='119.00'", "label='n17'", "dt='2026-10-18'"]]);
    assert_eq!(three.only_in_b_rows, vec![vec!["id='100000'", "amount='5.00'", "label=NULL", "dt='2026-10-02'"]]);
    assert_eq!(three.segment_queries, 2, "segments of ~390 rows narrowed 256 ways once");
    assert!(three.rows_transferred < 100, "{}", three.rows_transferred);

    // --where and --exclude.
    let scoped = diff(
        &mut Sides::One(&mut *db),
        &a,
        &b,
        &DiffOptions { key: vec!["id".into()], predicate: Some("dt = DATE '2026-10-13'".into()), exclude: vec!["label".into()], ..Default::default() },
    )
    .unwrap();
    assert_eq!((scoped.only_in_a, scoped.only_in_b, scoped.changed), (0, 0, 1), "id 4242 is on the 13th");
    assert_eq!(scoped.columns, vec!["amount", "dt"]);
    let err = diff(&mut Sides::One(&mut *db), &a, &b, &DiffOptions { key: vec!["nope".into()], ..Default::default() }).unwrap_err();
    assert_eq!(err.to_string(), "s.a has no column \"nope\"");
}

/// A user's schema named `fixpoint_sandbox` (the name older proofs dropped
/// and made again), holding a table of their own and one named exactly as a
/// sandbox copy of bronze.orders used to be: a proof with the mutation check
/// leaves both as they were. Each proof makes a schema of its own, under a
/// name that did not exist, and drops only that one.
fn prove_keeps_a_users_fixpoint_sandbox_schema(e: &dyn EngineUnderTest) {
    let mut db = e.fresh();
    let db = db.as_mut();
    exec(db, BRONZE);
    exec(
        db,
        "CREATE SCHEMA fixpoint_sandbox;
CREATE TABLE fixpoint_sandbox.keep (x INTEGER, note VARCHAR);
INSERT INTO fixpoint_sandbox.keep VALUES (1, 'mine'), (2, 'also mine');
CREATE TABLE fixpoint_sandbox.bronze__orders AS SELECT * FROM bronze.orders WHERE order_id = 1",
    );
    let keep = rows(db, "SELECT x, note FROM fixpoint_sandbox.keep");
    let copy = rows(db, "SELECT * FROM fixpoint_sandbox.bronze__orders");
    assert_eq!((keep.len(), copy.len()), (2, 1));
    for _ in 0..2 {
        let proof = prove(&job(SILVER_JOB), d("2026-10-20"), db, &opts(&[])).unwrap();
        assert!(proof.proved, "{:?}", proof.failures);
        assert_eq!(proof.mutation.as_ref().unwrap().outcome, "passed", "the check ran in a sandbox of its own: {:?}", proof.mutation);
        assert_eq!(count(db, "SELECT count(*) FROM information_schema.schemata WHERE schema_name = 'fixpoint_sandbox'"), 1, "the user's schema is still there");
        assert_eq!(rows(db, "SELECT x, note FROM fixpoint_sandbox.keep"), keep, "the user's table survives prove");
        assert_eq!(rows(db, "SELECT * FROM fixpoint_sandbox.bronze__orders"), copy, "a user's table under a sandbox copy's old name survives too");
        sandbox_is_gone(db, "silver_orders");
    }
}

/// `prove --mutate-key` naming a column the mutated table lacks is refused
/// before the first run: no target, no ledger row, no sandbox; and after a
/// real run, the target and the ledger read back (plain SQL) unchanged.
fn a_refused_mutate_key_changes_nothing(e: &dyn EngineUnderTest) {
    let mut db = e.fresh();
    let db = db.as_mut();
    exec(db, BRONZE);
    let job = job(SILVER_JOB);
    let tables = "SELECT count(*) FROM information_schema.tables WHERE table_schema IN ('silver', 'fixpoint')";
    assert_eq!(count(db, tables), 0);
    let err = prove(&job, d("2026-10-20"), db, &opts(&[("nope", "1")])).unwrap_err();
    assert_eq!(err.class(), ErrorClass::Input, "exit 2: {err}");
    assert_eq!(err.to_string(), "--mutate-key nope=1: bronze.orders has no column \"nope\"");
    assert!(err.hint().unwrap_or_default().contains("order_total"), "the hint lists the columns: {:?}", err.hint());
    assert_eq!(count(db, tables), 0, "no run created the target or the ledger");
    assert_eq!(count(db, SANDBOX_SCHEMAS), 0, "no sandbox was made");

    job.load(d("2026-10-20"), db).unwrap();
    let target = "SELECT order_id, customer_id, order_total, currency, updated_at, dt, load_id FROM silver.orders";
    let runs = "SELECT run_key, job, CAST(run_date AS VARCHAR), outcome, output_rows, output_checksum FROM fixpoint.runs";
    let (target_before, runs_before) = (rows(db, target), rows(db, runs));
    assert_eq!(runs_before.len(), 1);
    for (key, more) in [
        (opts(&[("order_id", "3"), ("nope", "1")]), "--mutate-key nope=1: bronze.orders has no column \"nope\""),
        (ProveOptions { runs: 1, ..opts(&[]) }, "--runs 1: a proof needs at least 2 runs"),
        (ProveOptions { mutate: false, ..opts(&[("order_id", "3")]) }, "--mutate-key with --no-mutate: the mutation check is off"),
    ] {
        let err = prove(&job, d("2026-10-20"), db, &key).unwrap_err();
        assert_eq!((err.class(), err.to_string().as_str()), (ErrorClass::Input, more));
        assert_eq!(rows(db, target), target_before, "{more}: the target is unchanged");
        assert_eq!(rows(db, runs), runs_before, "{more}: the ledger is unchanged");
        assert_eq!(count(db, SANDBOX_SCHEMAS), 0, "{more}: no sandbox was made");
    }
}

/// The type of `column` in `table`, as the engine names it.
fn column_type(db: &mut dyn Engine, table: &TableName, column: &str) -> String {
    db.table_columns(table).unwrap().unwrap().into_iter().find(|c| c.name == column).unwrap().ty
}

/// A DECIMAL column against a VARCHAR one holding the same text: refused
/// (exit 2), naming the column and both types, never "identical"; left out
/// with `exclude`, the rest compares. Types of one family still compare.
fn diff_refuses_columns_of_different_type_families(e: &dyn EngineUnderTest) {
    let mut db = e.fresh();
    let db = db.as_mut();
    exec(
        db,
        "CREATE SCHEMA s;
CREATE TABLE s.decimals (id BIGINT, amount DECIMAL(12,2), label VARCHAR);
CREATE TABLE s.texts (id BIGINT, amount VARCHAR, label VARCHAR);
CREATE TABLE s.narrow (id INTEGER, amount DECIMAL(12,2), label VARCHAR);
INSERT INTO s.decimals VALUES (1, 1.50, 'a'), (2, 2.50, 'b');
INSERT INTO s.texts VALUES (1, '1.50', 'a'), (2, '2.50', 'b');
INSERT INTO s.narrow VALUES (1, 1.50, 'a'), (2, 2.50, 'b')",
    );
    let (dec, txt, narrow) = (TableName::parse("s.decimals").unwrap(), TableName::parse("s.texts").unwrap(), TableName::parse("s.narrow").unwrap());
    let key = DiffOptions { key: vec!["id".into()], ..Default::default() };
    let err = diff(&mut Sides::One(&mut *db), &dec, &txt, &key).unwrap_err();
    assert_eq!(err.class(), ErrorClass::Input, "exit 2: {err}");
    let (ta, tb) = (column_type(db, &dec, "amount"), column_type(db, &txt, "amount"));
    assert_eq!(
        err.to_string(),
        format!("cannot diff columns of different type families: amount is {ta} (decimal) in s.decimals but {tb} (text) in s.texts")
    );
    assert!(err.hint().unwrap_or_default().contains("--exclude amount"), "{:?}", err.hint());
    let rest = diff(&mut Sides::One(&mut *db), &dec, &txt, &DiffOptions { key: vec!["id".into()], exclude: vec!["amount".into()], ..Default::default() }).unwrap();
    assert!(rest.identical, "{rest:?}");
    assert_eq!(rest.fingerprint_a, rest.fingerprint_b);
    // INTEGER against BIGINT: one family, compared (portable), identical.
    let same_family = diff(&mut Sides::One(&mut *db), &dec, &narrow, &key).unwrap();
    assert!(same_family.identical, "{same_family:?}");
    assert_eq!(same_family.fingerprint_a, same_family.fingerprint_b);
    // A real difference is never "identical", and its fingerprints differ.
    exec(db, "UPDATE s.narrow SET label = 'z' WHERE id = 2");
    let differs = diff(&mut Sides::One(&mut *db), &dec, &narrow, &key).unwrap();
    assert!(!differs.identical);
    assert_ne!(differs.fingerprint_a, differs.fingerprint_b);
    assert_eq!((differs.only_in_a, differs.only_in_b, differs.changed, differs.note.as_deref()), (0, 0, 1, None));
}

/// `$on!` over every scenario of this file (each engine's macro).
macro_rules! prove_scenarios {
    ($on:ident) => {
        $on!(
    order_check_catches_a_row_number_over_ties,
    mutation_changes_one_output_row,
    mutation_catches_a_per_day_total_in_every_row,
    merge_mutation_changes_one_key,
    diff_finds_exactly_the_differences,
    prove_keeps_a_users_fixpoint_sandbox_schema,
    a_refused_mutate_key_changes_nothing,
    diff_refuses_columns_of_different_type_families
        );
    };
}

prove_scenarios!(scenarios);
prove_scenarios!(delta_scenarios);

