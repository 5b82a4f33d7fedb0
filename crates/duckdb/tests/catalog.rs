//! Inside a transaction a table is described without asking the catalog
//! first only when this connection saw it outside one and nothing since
//! could have dropped it: a dropped or rolled-back table is reported
//! missing, never an error that aborts the transaction.

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
