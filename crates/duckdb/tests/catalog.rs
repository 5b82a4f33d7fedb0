//! Table lookups: whether a table exists (without a catalog error that
//! would abort a transaction), its columns (described once, again after any
//! change) and its column defaults.

use fixpoint_core::engine::Accelerator;
use fixpoint_core::job::sql::Sql;
use fixpoint_core::{Engine, TableName};
use fixpoint_duckdb::DuckDb;

#[test]
fn a_table_seen_then_dropped_is_missing_inside_a_transaction() {
    let mut db = DuckDb::open_in_memory().unwrap();
    let t = TableName::parse("s.t").unwrap();
    db.execute(&Sql::raw("CREATE SCHEMA s; CREATE TABLE s.t (id BIGINT)")).unwrap();
    assert_eq!(db.table_columns(&t).unwrap().unwrap().len(), 1, "seen outside a transaction");
    db.execute(&Sql::raw("DROP TABLE s.t")).unwrap();
    db.begin().unwrap();
    assert!(db.table_columns(&t).unwrap().is_none());
    // The transaction is still usable.
    db.execute(&Sql::raw("CREATE TABLE s.t (id BIGINT, v VARCHAR)")).unwrap();
    assert_eq!(db.table_columns(&t).unwrap().unwrap().len(), 2);
    db.rollback().unwrap();
    // Rolled back: gone again, inside the next transaction too.
    db.begin().unwrap();
    assert!(db.table_columns(&t).unwrap().is_none());
    db.commit().unwrap();

    // Seen, then still there inside a transaction: described at once.
    db.execute(&Sql::raw("CREATE TABLE s.t (id BIGINT)")).unwrap();
    assert!(db.table_columns(&t).unwrap().is_some());
    db.begin().unwrap();
    assert_eq!(db.table_columns(&t).unwrap().unwrap()[0].name, "id");
    db.commit().unwrap();
}

/// The columns a run reads again and again are described once, and
/// described again after anything that may have changed them: a statement
/// that is not a read or DML (through the engine), a rollback, or any use
/// of the raw connection.
#[test]
fn described_columns_follow_every_change() {
    let mut db = DuckDb::open_in_memory().unwrap();
    let t = TableName::parse("s.t").unwrap();
    let names = |db: &mut DuckDb| db.table_columns(&t).unwrap().unwrap().into_iter().map(|c| c.name).collect::<Vec<_>>();
    db.execute(&Sql::raw("CREATE SCHEMA s")).unwrap();
    db.execute(&Sql::raw("CREATE TABLE s.t (id BIGINT)")).unwrap();
    assert_eq!(names(&mut db), ["id"]);
    db.execute(&Sql::raw("INSERT INTO s.t VALUES (1)")).unwrap();
    db.execute(&Sql::raw("ALTER TABLE s.t ADD COLUMN a VARCHAR")).unwrap();
    assert_eq!(names(&mut db), ["id", "a"], "altered through the engine");
    db.connection().execute_batch("ALTER TABLE s.t ADD COLUMN b VARCHAR").unwrap();
    assert_eq!(names(&mut db), ["id", "a", "b"], "altered through the raw connection");
    db.begin().unwrap();
    db.execute(&Sql::raw("ALTER TABLE s.t ADD COLUMN c VARCHAR")).unwrap();
    assert_eq!(names(&mut db), ["id", "a", "b", "c"], "inside the transaction");
    db.rollback().unwrap();
    assert_eq!(names(&mut db), ["id", "a", "b"], "rolled back");
    db.execute(&Sql::raw("DROP TABLE s.t")).unwrap();
    assert!(db.table_columns(&t).unwrap().is_none(), "dropped");
}

/// Missing tables are reported missing without a catalog error, so a
/// transaction goes on; a view is a table's stand-in only outside one (as
/// `duckdb_tables()` lists no views).
#[test]
fn missing_tables_and_views() {
    let mut db = DuckDb::open_in_memory().unwrap();
    db.execute(&Sql::raw("CREATE SCHEMA s")).unwrap();
    db.execute(&Sql::raw("CREATE VIEW s.v AS SELECT 1 AS one")).unwrap();
    let (v, missing, ledger_like) =
        (TableName::parse("s.v").unwrap(), TableName::parse("s.nope").unwrap(), TableName::parse("fixpoint.nope").unwrap());
    assert!(db.table_columns(&missing).unwrap().is_none());
    assert!(db.table_columns(&ledger_like).unwrap().is_none());
    assert_eq!(db.table_columns(&v).unwrap().unwrap()[0].name, "one");
    db.execute(&Sql::raw("CREATE TABLE s.t (id BIGINT)")).unwrap();
    db.begin().unwrap();
    assert!(db.table_columns(&missing).unwrap().is_none());
    assert!(db.table_columns(&ledger_like).unwrap().is_none());
    db.execute(&Sql::raw("INSERT INTO s.t VALUES (1)")).unwrap();
    db.commit().unwrap();
    let rows = db.query(&Sql::raw("SELECT count(*) FROM s.t")).unwrap();
    assert_eq!(rows.rows[0][0].as_u64(), Some(1), "the transaction went on and committed");
}

/// The lint of generated keys reads column defaults from `DESCRIBE`.
#[test]
fn column_defaults_come_from_describe() {
    let mut db = DuckDb::open_in_memory().unwrap();
    db.execute(&Sql::raw("CREATE SCHEMA s")).unwrap();
    db.execute(&Sql::raw("CREATE SEQUENCE s.ids")).unwrap();
    db.execute(&Sql::raw("CREATE TABLE s.t (id BIGINT DEFAULT nextval('s.ids'), note VARCHAR DEFAULT 'x', v INTEGER)")).unwrap();
    let defaults = db.column_defaults(&TableName::parse("s.t").unwrap()).unwrap();
    assert_eq!(defaults.len(), 2, "{defaults:?}");
    assert_eq!(defaults[0].0, "id");
    assert!(defaults[0].1.contains("nextval"), "{defaults:?}");
    assert_eq!(defaults[1].0, "note");
    assert!(db.column_defaults(&TableName::parse("s.nope").unwrap()).unwrap().is_empty());
}

/// The types whose casts keep DuckDB's row hash (the merge then reuses a
/// row's input hash as its output hash): what the rule says, and DuckDB's
/// own `hash` agreeing with it on sample values, both ways.
#[test]
fn casts_that_keep_the_native_hash() {
    let mut db = DuckDb::open_in_memory().unwrap();
    let cases = [
        ("DECIMAL(13,2)", "DECIMAL(12,2)", true),
        ("decimal(10,2)", "DECIMAL(18, 2)", true),
        ("DECIMAL(9,2)", "DECIMAL(5,2)", true),
        ("DECIMAL(9,2)", "DECIMAL(10,2)", false),
        ("DECIMAL(18,2)", "DECIMAL(19,2)", false),
        ("DECIMAL(12,3)", "DECIMAL(12,2)", false),
        ("VARCHAR", "varchar", true),
        ("INTEGER", "BIGINT", false),
        ("DOUBLE", "DECIMAL(12,2)", false),
    ];
    for (from, to, same) in cases {
        assert_eq!(db.dialect().same_native_hash(from, to), same, "{from} -> {to}");
        if same {
            // Values both types hold, NULL included.
            let sql = format!(
                "SELECT count(*) FILTER (WHERE hash(CAST(v AS {from})) <> hash(CAST(CAST(v AS {from}) AS {to}))) FROM (VALUES (0.0), (12.34), (-99.99), (NULL)) AS t(v)"
            );
            let differ = if from.eq_ignore_ascii_case("VARCHAR") { Some(0) } else { db.query(&Sql::raw(sql)).unwrap().rows[0][0].as_u64() };
            assert_eq!(differ, Some(0), "{from} -> {to}");
        }
    }
    // Where the rule says no for another scale, the hashes do differ (the
    // stored integer is scaled); for another storage width it is only
    // caution (DuckDB happens to hash small 128-bit values alike).
    let rows = db.query(&Sql::raw("SELECT CAST(hash(CAST(12.34 AS DECIMAL(12,3))) = hash(CAST(12.34 AS DECIMAL(12,2))) AS INTEGER)")).unwrap();
    assert_eq!(rows.rows[0][0].as_u64(), Some(0));
}

/// Whether a table has some columns, asked of the appender's lookup inside
/// a transaction: a missing table or column answers "not known" and leaves
/// the transaction usable (a view answers the same, outside a transaction:
/// inside one its lookup is a catalog error, as for `table_columns`); a
/// row appended by the appender is part of the transaction (gone after a
/// rollback, kept after a commit).
#[test]
fn columns_known_and_rows_appended_inside_a_transaction() {
    use fixpoint_core::job::sql::Value;
    let mut db = DuckDb::open_in_memory().unwrap();
    let t = TableName::parse("s.t").unwrap();
    db.execute(&Sql::raw("CREATE SCHEMA s; CREATE TABLE s.t (id BIGINT, v VARCHAR, d DATE); CREATE VIEW s.w AS SELECT 1 AS id")).unwrap();
    assert_eq!(db.table_has_columns(&TableName::parse("s.w").unwrap(), &["id"]), None);
    db.begin().unwrap();
    assert_eq!(db.table_has_columns(&t, &["id", "v"]), Some(true));
    assert_eq!(db.table_has_columns(&t, &["id", "missing"]), None);
    assert_eq!(db.table_has_columns(&TableName::parse("s.nope").unwrap(), &["id"]), None);
    let day = chrono::NaiveDate::from_ymd_opt(2026, 10, 20).unwrap();
    db.append_row(&t, &["id", "v", "d"], &[Value::Int(7), Value::Text("it's".into()), Value::Date(day)]).unwrap().unwrap();
    let read = |db: &mut DuckDb| db.query(&Sql::raw("SELECT count(*), max(v), CAST(max(d) AS VARCHAR) FROM s.t")).unwrap().rows[0].clone();
    let r = read(&mut db);
    assert_eq!((r[0].as_u64(), r[1].clone(), r[2].clone()), (Some(1), Value::Text("it's".into()), Value::Text("2026-10-20".into())), "the transaction is still usable and sees the row");
    db.rollback().unwrap();
    assert_eq!(read(&mut db)[0].as_u64(), Some(0), "rolled back with the transaction");
    db.begin().unwrap();
    db.append_row(&t, &["v", "id"], &[Value::Text("x".into()), Value::Null]).unwrap().unwrap();
    db.commit().unwrap();
    let r = read(&mut db);
    assert_eq!((r[0].as_u64(), r[1].clone(), r[2].clone()), (Some(1), Value::Text("x".into()), Value::Null));
    // Once described, a missing column is known to be missing.
    assert!(db.table_columns(&t).unwrap().is_some());
    assert_eq!(db.table_has_columns(&t, &["id", "missing"]), Some(false));
}
