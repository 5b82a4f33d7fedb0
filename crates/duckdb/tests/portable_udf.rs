//! The portable row hash computed in Rust (`fixpoint_portable_md5`) has the
//! value of the SQL form (the canonical text built with casts and hashed with
//! `md5_number`) on every type, NULLs and edge values included: the text is
//! compared row by row, then the hash, then whole fingerprints.

use fixpoint_core::engine::measure::{fingerprint, portable_field, Scope};

use fixpoint_core::engine::Column;
use fixpoint_core::job::ident::quote_ident;
use fixpoint_core::job::sql::Sql;
use fixpoint_core::{Engine, Method, TableName};
use fixpoint_duckdb::DuckDb;

/// 20,000 rows of every type class, values spread by `hash(i, k)`, one NULL in
/// about ten per column, and edge values in the first rows.
const TABLE: &str = "
CREATE SCHEMA s;
CREATE TABLE s.t AS
SELECT i AS id,
  CASE WHEN hash(i, 0) % 10 = 0 THEN NULL ELSE CAST(CAST(hash(i, 1) % 256 AS INTEGER) - 128 AS TINYINT) END AS ti,
  CASE WHEN hash(i, 2) % 10 = 0 THEN NULL ELSE CAST(CAST(hash(i, 1) % 65536 AS INTEGER) - 32768 AS SMALLINT) END AS si,
  CASE WHEN hash(i, 3) % 10 = 0 THEN NULL ELSE CAST(CAST(hash(i, 1) % 4294967296 AS BIGINT) - 2147483648 AS INTEGER) END AS ii,
  CASE WHEN hash(i, 4) % 10 = 0 THEN NULL WHEN i = 1 THEN -9223372036854775808 ELSE CAST(hash(i, 1) % 9223372036854775807 AS BIGINT) * (CASE WHEN i % 2 = 0 THEN -1 ELSE 1 END) END AS bi,
  CASE WHEN hash(i, 5) % 10 = 0 THEN NULL ELSE CAST(hash(i, 1) % 256 AS UTINYINT) END AS uti,
  CASE WHEN hash(i, 5) % 10 = 1 THEN NULL ELSE CAST(hash(i, 1) % 65536 AS USMALLINT) END AS usi,
  CASE WHEN hash(i, 5) % 10 = 2 THEN NULL ELSE CAST(hash(i, 1) % 4294967296 AS UINTEGER) END AS uii,
  CASE WHEN hash(i, 5) % 10 = 3 THEN NULL ELSE hash(i, 1) END AS ubi,
  CASE WHEN hash(i, 6) % 10 = 0 THEN NULL ELSE CAST(hash(i, 7) AS HUGEINT) * CAST(hash(i, 8) AS HUGEINT) * (CASE WHEN i % 3 = 0 THEN -1 ELSE 1 END) END AS hi,
  CASE WHEN hash(i, 6) % 10 = 1 THEN NULL ELSE CAST(hash(i, 7) AS UHUGEINT) * CAST(hash(i, 8) AS UHUGEINT) END AS uhi,
  CASE WHEN hash(i, 9) % 10 = 0 THEN NULL ELSE CAST((CAST(hash(i, 1) % 19999 AS INTEGER) - 9999) / 10.0 AS DECIMAL(4,1)) END AS d4,
  CASE WHEN hash(i, 9) % 10 = 1 THEN NULL ELSE CAST((CAST(hash(i, 1) % 1999999999 AS BIGINT) - 999999999) / 10000.0 AS DECIMAL(9,4)) END AS d9,
  CASE WHEN hash(i, 9) % 10 = 2 THEN NULL ELSE CAST((CASE WHEN i % 2 = 0 THEN '-' ELSE '' END) || CAST(hash(i, 1) % 1000000000000 AS VARCHAR) || '.' || lpad(CAST(hash(i, 2) % 1000000 AS VARCHAR), 6, '0') AS DECIMAL(18,6)) END AS d18,
  CASE WHEN hash(i, 9) % 10 = 3 THEN NULL ELSE CAST((CASE WHEN i % 2 = 1 THEN '-' ELSE '' END) || CAST(hash(i, 1) AS VARCHAR) || '.' || lpad(CAST(hash(i, 2) % 10000000000 AS VARCHAR), 10, '0') AS DECIMAL(38,10)) END AS d38,
  CASE WHEN hash(i, 10) % 10 = 0 THEN NULL ELSE CAST(CAST(hash(i, 1) % 2000001 AS INTEGER) - 1000000 AS DECIMAL(7,0)) END AS d7s0,
  CASE WHEN hash(i, 11) % 10 = 0 THEN NULL
       WHEN i = 2 THEN CAST('nan' AS DOUBLE) WHEN i = 3 THEN CAST('inf' AS DOUBLE) WHEN i = 4 THEN CAST('-inf' AS DOUBLE)
       WHEN i = 5 THEN CAST('-0.0' AS DOUBLE) WHEN i = 6 THEN 5e-324 WHEN i = 7 THEN 1.7976931348623157e308 WHEN i = 8 THEN 0.1
       WHEN i = 18 THEN -2.5e-310 WHEN i = 19 THEN 2.2250738585072014e-308 WHEN i = 20 THEN 2.2250738585072009e-308 WHEN i = 21 THEN 1.0
       WHEN i = 22 THEN 0.5 WHEN i = 23 THEN 4.0 WHEN i = 24 THEN -8.98846567431158e307 WHEN i = 25 THEN 1.0000000000000002 WHEN i = 26 THEN 0.9999999999999999
       WHEN i = 27 THEN 3e-320 WHEN i BETWEEN 28 AND 500 THEN pow(2.0, CAST(i AS INTEGER) * 4 - 1100) * (1 + (CAST(hash(i, 3) % 3 AS DOUBLE) - 1) * pow(2.0, -53))
       ELSE (CAST(hash(i, 1) % 1000000007 AS DOUBLE) / 7.0 - 70000000.0) * pow(10.0, CAST(hash(i, 2) % 600 AS INTEGER) - 300) END AS dbl,
  CASE WHEN hash(i, 12) % 10 = 0 THEN NULL WHEN i = 9 THEN CAST('nan' AS FLOAT)
       ELSE CAST((CAST(hash(i, 1) % 1000003 AS DOUBLE) / 3.0 - 1000.0) * pow(10.0, CAST(hash(i, 2) % 60 AS INTEGER) - 30) AS FLOAT) END AS flt,
  CASE WHEN hash(i, 13) % 10 = 0 THEN NULL WHEN i = 10 THEN '' WHEN i = 11 THEN '\\N'
       ELSE substr('ab|c\\dé✓xyz0123456789ABCDEFGHIJ||\\\\KLMNOPQRSTUV', CAST(1 + hash(i, 1) % 12 AS INTEGER), CAST(hash(i, 2) % 40 AS INTEGER)) END AS txt,
  CASE WHEN hash(i, 14) % 10 = 0 THEN NULL ELSE encode(substr('ab|c\\dé✓xyz0123456789', CAST(1 + hash(i, 1) % 5 AS INTEGER), CAST(hash(i, 2) % 20 AS INTEGER))) END AS blb,
  CASE WHEN hash(i, 15) % 10 = 0 THEN NULL ELSE hash(i, 1) % 2 = 0 END AS flag,
  CASE WHEN hash(i, 16) % 10 = 0 THEN NULL WHEN i = 12 THEN CAST('infinity' AS DATE) WHEN i = 13 THEN CAST('-infinity' AS DATE)
       WHEN i = 14 THEN DATE '0001-01-01' WHEN i = 15 THEN DATE '9999-12-31'
       ELSE DATE '1970-01-01' + (CAST(hash(i, 1) % 7000000 AS INTEGER) - 3500000) END AS day,
  CASE WHEN hash(i, 17) % 10 = 0 THEN NULL WHEN i = 16 THEN CAST('infinity' AS TIMESTAMP) WHEN i = 17 THEN CAST('-infinity' AS TIMESTAMP) ELSE make_timestamp(CAST(hash(i, 1) % 200000000000000000 AS BIGINT) - 100000000000000000) END AS ts,
  CASE WHEN hash(i, 18) % 10 = 0 THEN NULL ELSE CAST(make_timestamp(CAST(hash(i, 1) % 4000000000000000 AS BIGINT)) AS TIMESTAMP_NS) + to_microseconds(CAST(hash(i, 2) % 1000 AS BIGINT)) END AS tsns,
  CASE WHEN hash(i, 19) % 10 = 0 THEN NULL ELSE CAST(make_timestamp(CAST(hash(i, 1) % 4000000000000000 AS BIGINT)) AS TIMESTAMP_S) END AS tss,
  CASE WHEN hash(i, 20) % 10 = 0 THEN NULL ELSE CAST(make_timestamp(CAST(hash(i, 1) % 4000000000000000 AS BIGINT)) AS TIMESTAMPTZ) END AS tstz,
  CASE WHEN hash(i, 21) % 10 = 0 THEN NULL ELSE to_seconds(CAST(hash(i, 1) % 1000000 AS BIGINT)) END AS ivl,
  CASE WHEN hash(i, 22) % 10 = 0 THEN NULL ELSE [CAST(i AS INTEGER), NULL] END AS lst,
  CASE WHEN hash(i, 23) % 10 = 0 THEN NULL ELSE CAST(make_timestamp(CAST(hash(i, 1) % 86400000000 AS BIGINT)) AS TIME) END AS tm
FROM range(20000) AS r(i)";

fn engine() -> DuckDb {
    let mut db = DuckDb::open_in_memory().unwrap();
    db.execute(&Sql::raw(TABLE)).unwrap();
    db
}

fn columns(db: &mut DuckDb) -> Vec<Column> {
    db.table_columns(&TableName::parse("s.t").unwrap()).unwrap().unwrap()
}

#[test]
fn the_rust_row_text_is_the_sql_row_text_on_every_type() {
    let mut db = engine();
    let cols = columns(&mut db);
    assert!(cols.len() >= 28, "{cols:?}");
    let mut sql_fields = Vec::new();
    let mut udf_fields = Vec::new();
    for c in &cols {
        let expr = format!("t.{}", quote_ident(&c.name));
        let (text, class) = db.dialect().portable_value(&expr, c);
        sql_fields.push(portable_field(&text, class));
        udf_fields.push(fixpoint_duckdb::portable::field_expr(&expr, &c.ty, class));
    }
    let sql_text = sql_fields.join(" || '|' || ");
    let udf_text = format!("{}(row({}))", fixpoint_duckdb::portable::TEXT_FUNCTION, udf_fields.join(", "));
    let mismatches = db
        .query(&Sql::raw(format!(
            "SELECT t.id, {sql_text}, {udf_text} FROM s.t AS t WHERE ({sql_text}) IS DISTINCT FROM ({udf_text}) ORDER BY t.id LIMIT 5"
        )))
        .unwrap();
    assert!(mismatches.rows.is_empty(), "rows whose texts differ (id, SQL, Rust): {:#?}", mismatches.rows);

    // And the hash: md5_number of the SQL text's low 64 bits.
    let sql_hash = db.dialect().portable_row_hash(&sql_text);
    let udf_hash = format!("{}(row({}))", fixpoint_duckdb::portable::HASH_FUNCTION, udf_fields.join(", "));
    let rows = db
        .query(&Sql::raw(format!(
            "SELECT count(*), count(*) FILTER (WHERE {sql_hash} = {udf_hash}), count(DISTINCT {udf_hash}) FROM s.t AS t"
        )))
        .unwrap();
    let counts: Vec<String> = rows.rows[0].iter().map(|v| v.display()).collect();
    assert_eq!(counts, vec!["20000", "20000", "20000"], "rows, rows with equal hashes, distinct hashes");
}

#[test]
fn fingerprints_are_the_same_with_and_without_the_rust_hash() {
    let mut fast = engine();
    let cols = columns(&mut fast);
    let t = TableName::parse("s.t").unwrap();
    let scope = Scope::Table { table: &t, filter: None };
    let a = fingerprint(&mut fast, Method::Portable, &scope, &cols).unwrap();
    let mut slow = fast.without_portable_functions();
    let b = fingerprint(&mut slow, Method::Portable, &scope, &cols).unwrap();
    assert_eq!(a.rows, 20000);
    assert_eq!(a, b);
    // A single changed value changes it, the same way on both paths.
    slow.execute(&Sql::raw("UPDATE s.t SET txt = txt || '|' WHERE id = 12345")).unwrap();
    let c = fingerprint(&mut slow, Method::Portable, &scope, &cols).unwrap();
    assert_ne!(c, b);
    let mut fast = slow.with_portable_functions();
    assert_eq!(fingerprint(&mut fast, Method::Portable, &scope, &cols).unwrap(), c);
}

#[test]
fn the_golden_rows_have_the_golden_checksum() {
    use fixpoint_core::fingerprint::golden;
    let mut db = DuckDb::open_in_memory().unwrap();
    db.execute(&Sql::raw(format!(
        "CREATE SCHEMA g; CREATE TABLE g.t (id BIGINT, small SMALLINT, amount DECIMAL(12,2), name VARCHAR, day DATE, ts TIMESTAMP, flag BOOLEAN, ratio DOUBLE); INSERT INTO g.t VALUES {}",
        golden::ROWS
    )))
    .unwrap();
    let t = TableName::parse("g.t").unwrap();
    let cols = db.table_columns(&t).unwrap().unwrap();
    let fast = fingerprint(&mut db, Method::Portable, &Scope::Table { table: &t, filter: None }, &cols).unwrap();
    let mut slow = db.without_portable_functions();
    let sql = fingerprint(&mut slow, Method::Portable, &Scope::Table { table: &t, filter: None }, &cols).unwrap();
    assert_eq!(fast, sql);
    assert_eq!((fast.rows, fast.checksum.as_str()), (7, golden::CHECKSUM), "the same value Spark's and PostgreSQL's tests pin");
}
