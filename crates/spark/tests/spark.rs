//! The Spark engine against a real Spark Connect server (`scripts/spark-local.sh
//! start`; URL from FIXPOINT_TEST_SPARK, default sc://127.0.0.1:15002). Without a
//! server the tests say `skipped`, except under CI=true, where they fail.
#![cfg(feature = "spark")]

use std::time::Duration;

use fixpoint_core::engine::measure::{fingerprint, Scope};
use fixpoint_core::job::sql::{Sql, Value};
use fixpoint_core::{Engine, Error, Method, TableName};
use fixpoint_spark::Spark;

fn spark() -> Option<Spark> {
    let url = std::env::var("FIXPOINT_TEST_SPARK").unwrap_or_else(|_| "sc://127.0.0.1:15002".into());
    match Spark::connect(&url, Duration::from_secs(5)).and_then(|mut s| s.version().map(|_| s)) {
        Ok(s) => Some(s),
        Err(e) if std::env::var("CI").as_deref() == Ok("true") => panic!("no Spark Connect server at {url} under CI=true: {e}"),
        Err(e) => {
            eprintln!("skipped: no Spark Connect server at {url} ({e}); start one with scripts/spark-local.sh start");
            None
        }
    }
}

fn exec(db: &mut Spark, sql: &str) {
    db.execute(&Sql::raw(sql)).unwrap_or_else(|e| panic!("{sql}: {e}"));
}

#[test]
fn queries_bind_parameters_and_errors_keep_their_class() {
    let Some(mut db) = spark() else { return };
    assert!(db.version().unwrap().starts_with("spark v4."), "{}", db.version().unwrap());
    // Values travel as parameters, never as SQL text: a quote is just a character.
    let mut sql = Sql::new();
    sql.push("SELECT ").param(Value::Text("it's".into())).push(" AS t, ").param(Value::Int(41)).push(" + 1 AS n, ");
    sql.param(Value::Date(chrono::NaiveDate::from_ymd_opt(2026, 10, 20).unwrap())).push(" AS d");
    let rows = db.query(&sql).unwrap();
    assert_eq!(rows.columns, vec!["t", "n", "d"]);
    assert_eq!(rows.rows, vec![vec![Value::Text("it's".into()), Value::Int(42), Value::Date(chrono::NaiveDate::from_ymd_opt(2026, 10, 20).unwrap())]]);
    // Literals as the standard reads them: a doubled quote is a quote, a backslash a backslash.
    let lit = db.query(&Sql::raw("SELECT 'it''s', '\\N', length('\\')")).unwrap();
    assert_eq!(lit.rows, vec![vec![Value::Text("it's".into()), Value::Text("\\N".into()), Value::Int(1)]]);

    let missing = db.query(&Sql::raw("SELECT * FROM fixpoint_no_such_schema.t")).unwrap_err().to_string();
    assert!(missing.contains("TABLE_OR_VIEW_NOT_FOUND") && missing.contains("42P01"), "{missing}");
    let syntax = db.query(&Sql::raw("SELEC 1")).unwrap_err().to_string();
    assert!(syntax.contains("PARSE_SYNTAX_ERROR") && syntax.contains("42601"), "{syntax}");
    // No transactions: a run is refused, clearly, rather than run without them.
    assert!(matches!(db.begin(), Err(Error::Unsupported { engine: "spark", .. })));
}

#[test]
fn tables_and_queries_are_described() {
    let Some(mut db) = spark() else { return };
    exec(&mut db, "CREATE DATABASE IF NOT EXISTS fixpoint_t1");
    exec(&mut db, "DROP TABLE IF EXISTS fixpoint_t1.orders");
    exec(&mut db, "CREATE TABLE fixpoint_t1.orders (order_id BIGINT, total DECIMAL(12,2), currency STRING, dt DATE) USING parquet PARTITIONED BY (dt)");
    let t = TableName::parse("fixpoint_t1.orders").unwrap();
    let cols: Vec<(String, String)> = db.table_columns(&t).unwrap().unwrap().into_iter().map(|c| (c.name, c.ty)).collect();
    assert_eq!(
        cols,
        vec![("order_id".into(), "bigint".into()), ("total".into(), "decimal(12,2)".into()), ("currency".into(), "string".into()), ("dt".into(), "date".into())],
        "the partition column once, not again under '# Partition Information'"
    );
    assert!(db.table_columns(&TableName::parse("fixpoint_t1.nope").unwrap()).unwrap().is_none());
    let mut q = Sql::new();
    q.push("SELECT order_id, total * 2 AS twice FROM fixpoint_t1.orders WHERE dt = ").param(Value::Date(chrono::NaiveDate::from_ymd_opt(2026, 10, 20).unwrap()));
    let described: Vec<String> = db.describe(&q).unwrap().into_iter().map(|c| format!("{} {}", c.name, c.ty)).collect();
    assert_eq!(described, vec!["order_id bigint", "twice decimal(14,2)"], "Spark's own result type");
    exec(&mut db, "DROP TABLE fixpoint_t1.orders");
}

#[test]
fn fingerprints_are_computed_by_the_cluster() {
    let Some(mut db) = spark() else { return };
    exec(&mut db, "CREATE DATABASE IF NOT EXISTS fixpoint_t2");
    exec(&mut db, "DROP TABLE IF EXISTS fixpoint_t2.t");
    exec(&mut db, "CREATE TABLE fixpoint_t2.t (id BIGINT, name STRING, flag BOOLEAN) USING parquet");
    exec(&mut db, "INSERT INTO fixpoint_t2.t VALUES (1, 'a', true), (2, NULL, false), (3, '', NULL)");
    let t = TableName::parse("fixpoint_t2.t").unwrap();
    let cols = db.table_columns(&t).unwrap().unwrap();
    let fp = |db: &mut Spark, m| fingerprint(db, m, &Scope::Table { table: &t, filter: None }, &cols).unwrap();
    let (native, portable) = (fp(&mut db, Method::Native), fp(&mut db, Method::Portable));
    assert_eq!((native.rows, portable.rows), (3, 3));
    // NULL and '' differ; a duplicated row changes both.
    exec(&mut db, "INSERT INTO fixpoint_t2.t VALUES (2, '', false)");
    exec(&mut db, "INSERT INTO fixpoint_t2.t VALUES (1, 'a', true)");
    let (n2, p2) = (fp(&mut db, Method::Native), fp(&mut db, Method::Portable));
    assert_eq!(n2.rows, 5);
    assert_ne!(n2, native);
    assert_ne!(p2, portable);
    exec(&mut db, "DROP TABLE fixpoint_t2.t");
}

/// The rows DuckDB's and PostgreSQL's tests pin to `golden::CHECKSUM` give
/// the same portable checksum computed by the cluster; one changed value
/// changes it. (Spark's client and DuckDB's bundled build are not built
/// together, so the engines meet through the pinned value.)
#[test]
fn the_cluster_gives_the_golden_checksum() {
    use fixpoint_core::fingerprint::golden;
    let Some(mut db) = spark() else { return };
    exec(&mut db, "CREATE DATABASE IF NOT EXISTS fixpoint_t3");
    exec(&mut db, "DROP TABLE IF EXISTS fixpoint_t3.t");
    exec(&mut db, "CREATE TABLE fixpoint_t3.t (id BIGINT, small SMALLINT, amount DECIMAL(12,2), name STRING, day DATE, ts TIMESTAMP_NTZ, flag BOOLEAN, ratio DOUBLE) USING parquet");
    exec(&mut db, &format!("INSERT INTO fixpoint_t3.t VALUES {}", golden::ROWS));
    let t = TableName::parse("fixpoint_t3.t").unwrap();
    let cols = db.table_columns(&t).unwrap().unwrap();
    let fp = fingerprint(&mut db, Method::Portable, &Scope::Table { table: &t, filter: None }, &cols).unwrap();
    assert_eq!((fp.rows, fp.checksum.as_str()), (7, golden::CHECKSUM));
    // (A table cannot be overwritten from itself on Spark: one more row instead.)
    exec(&mut db, "INSERT INTO fixpoint_t3.t VALUES (1, 7, 12.50, 'plain', DATE '2026-10-20', TIMESTAMP_NTZ '2026-10-20 08:00:00', true, 0.1)");
    let changed = fingerprint(&mut db, Method::Portable, &Scope::Table { table: &t, filter: None }, &cols).unwrap();
    assert_ne!(changed.checksum, golden::CHECKSUM);
    exec(&mut db, "DROP TABLE fixpoint_t3.t");
}

/// The cluster writes every double, edge values included, as the canonical
/// text fixpoint's Rust code writes (DuckDB's and PostgreSQL's tests hold
/// their engines to the same function), with exact arithmetic only.
#[test]
fn the_cluster_writes_each_float_as_its_bits() {
    let Some(mut db) = spark() else { return };
    let mut values: Vec<String> = [
        "NaN", "Infinity", "-Infinity", "0", "-0", "4.9e-324", "-2.5e-310", "3e-320", "2.2250738585072009e-308", "2.2250738585072014e-308",
        "1.7976931348623157e308", "-8.98846567431158e307", "0.1", "0.30000000000000004", "1", "0.5", "1e300", "-1234.5", "1.0000000000000002",
        "0.9999999999999999",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    // Powers of two and their neighbours over the whole range, where a
    // rounded logarithm would land on the wrong side.
    for e in (-1074..1024).step_by(7) {
        let p = 2f64.powi(e);
        values.push(format!("{p:e}"));
        values.push(format!("{:e}", f64::from_bits(p.to_bits() + 1)));
        if p.to_bits() > 1 {
            values.push(format!("{:e}", f64::from_bits(p.to_bits() - 1)));
        }
    }
    let col = fixpoint_core::engine::Column { name: "v".into(), ty: "double".into() };
    let (text, class) = db.dialect().portable_value("x.v", &col);
    assert_eq!(class, "float");
    let literals: Vec<String> = values.iter().enumerate().map(|(i, v)| format!("({i}, CAST('{v}' AS DOUBLE))")).collect();
    let rows = db.query(&Sql::raw(format!("SELECT x.i, {text} FROM VALUES {} AS x(i, v) ORDER BY x.i", literals.join(", ")))).unwrap();
    let got: Vec<String> = rows.rows.iter().map(|r| r[1].display().trim_matches('"').to_owned()).collect();
    let want: Vec<String> = values
        .iter()
        .map(|v| fixpoint_core::fingerprint::float_text(v.parse::<f64>().unwrap()))
        .collect();
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert_eq!(g, w, "{}", values[i]);
    }
    assert_eq!(got.len(), want.len());
}
