//! Table lookups: whether a table exists (without a catalog error that
//! would abort a transaction), its columns (described once, again after any
//! change) and its column defaults.

use fixpoint_core::sql::Sql;
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
