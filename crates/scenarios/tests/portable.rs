//! The portable fingerprint agrees across engines: the same logical rows in
//! DuckDB and in PostgreSQL give the same checksum, and one changed value
//! changes it on both.

use fixpoint_core::engine::{fingerprint, Scope};
use fixpoint_core::{Engine, Fingerprint, Method, TableName};
use fixpoint_scenarios::*;

const DUCK_TABLE: &str = "CREATE SCHEMA s;
CREATE TABLE s.t (id BIGINT, small SMALLINT, amount DECIMAL(12,2), ratio DOUBLE, name VARCHAR, day DATE, ts TIMESTAMP, flag BOOLEAN, raw BLOB)";
const PG_TABLE: &str = "CREATE SCHEMA s;
CREATE TABLE s.t (id BIGINT, small SMALLINT, amount NUMERIC(12,2), ratio DOUBLE PRECISION, name TEXT, day DATE, ts TIMESTAMP, flag BOOLEAN, raw BYTEA)";

/// Rows written once, valid on both engines (the BLOB/BYTEA literal differs).
fn rows_sql(blob: fn(&str) -> String) -> String {
    format!(
        "INSERT INTO s.t VALUES
 (1, 7, 12.50, 0.1, 'plain', DATE '2026-10-20', TIMESTAMP '2026-10-20 08:00:00', true, {}),
 (2, -3, -0.05, 1.0, '', DATE '1999-12-31', TIMESTAMP '2026-10-20 08:00:00.123456', false, {}),
 (3, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL),
 (4, 0, 99999.99, 1e20, 'ünïcödé ✓ ''quoted'' a,b', DATE '2026-02-28', TIMESTAMP '1970-01-01 00:00:00', true, {}),
 (5, 1, 0.00, -123456.789, 'NULL', DATE '2026-10-21', TIMESTAMP '2026-10-21 23:59:59.999999', false, {}),
 (6, 2, 1.00, 1.5e-7, ' spaced ', DATE '2026-10-22', TIMESTAMP '2026-10-22 12:00:00.5', true, NULL),
 (6, 2, 1.00, 1.5e-7, ' spaced ', DATE '2026-10-22', TIMESTAMP '2026-10-22 12:00:00.5', true, NULL)",
        blob("00ff10"),
        blob(""),
        blob("deadbeef"),
        blob("41"),
    )
}

fn duck_blob(hex: &str) -> String {
    format!("from_hex('{hex}')")
}

fn pg_blob(hex: &str) -> String {
    format!("decode('{hex}', 'hex')")
}

/// The same rows in a fresh DuckDB and a fresh PostgreSQL database, or
/// `None` when the server is unreachable outside CI.
fn both() -> Option<(Box<dyn Engine>, Box<dyn Engine>)> {
    let pg = PgUnderTest::get()?;
    let mut duck = DuckDbUnderTest.fresh();
    let mut pg = pg.fresh();
    exec(duck.as_mut(), DUCK_TABLE);
    exec(duck.as_mut(), &rows_sql(duck_blob));
    exec(pg.as_mut(), PG_TABLE);
    exec(pg.as_mut(), &rows_sql(pg_blob));
    Some((duck, pg))
}

fn portable(db: &mut dyn Engine) -> Fingerprint {
    let t = TableName::parse("s.t").unwrap();
    let cols = db.table_columns(&t).unwrap().unwrap();
    fingerprint(db, Method::Portable, &Scope::Table { table: &t, filter: None }, &cols).unwrap()
}

#[test]
fn the_portable_checksum_agrees_between_duckdb_and_postgres() {
    let Some((mut duck, mut pg)) = both() else { return };
    let (d, p) = (portable(duck.as_mut()), portable(pg.as_mut()));
    assert_eq!(d.rows, 7);
    assert_eq!(d, p, "the same logical rows on both engines");

    // Each single-value change is seen, the same way, on both engines.
    let changes = [
        "UPDATE s.t SET ratio = 0.30000000000000004 WHERE id = 1",
        "UPDATE s.t SET name = 'plain ' WHERE id = 1",
        "UPDATE s.t SET name = NULL WHERE id = 2",
        "UPDATE s.t SET ts = TIMESTAMP '2026-10-20 08:00:00.123457' WHERE id = 2",
        "UPDATE s.t SET amount = 12.51 WHERE id = 1",
        "UPDATE s.t SET flag = false WHERE id = 3",
        "DELETE FROM s.t WHERE id = 3",
    ];
    let mut last = d;
    for change in changes {
        exec(duck.as_mut(), change);
        exec(pg.as_mut(), change);
        let (d, p) = (portable(duck.as_mut()), portable(pg.as_mut()));
        assert_ne!(d, last, "{change} changes the checksum");
        assert_eq!(d, p, "{change}: both engines agree");
        last = d;
    }
}

#[test]
fn diff_between_duckdb_and_postgres_reports_exactly_the_changed_row() {
    use fixpoint_core::diff::{diff, DiffOptions, Sides};
    let Some((mut duck, mut pg)) = both() else { return };
    let t = TableName::parse("s.t").unwrap();
    let key = DiffOptions { key: vec!["id".into()], ..Default::default() };
    let same = diff(&mut Sides::Two(duck.as_mut(), pg.as_mut()), &t, &t, &key).unwrap();
    assert!(same.identical, "{same:?}");
    assert_eq!(same.method, fixpoint_core::Method::Portable);
    assert_eq!(same.rows_transferred, 0);

    exec(pg.as_mut(), "UPDATE s.t SET ratio = 0.25, name = 'plain!' WHERE id = 1");
    exec(pg.as_mut(), "DELETE FROM s.t WHERE id = 3");
    let d = diff(&mut Sides::Two(duck.as_mut(), pg.as_mut()), &t, &t, &key).unwrap();
    assert_eq!((d.only_in_a, d.only_in_b, d.changed), (1, 0, 1), "{d:?}");
    assert_eq!(d.changed_rows[0].key, vec!["id='1'"]);
    let changes: Vec<String> = d.changed_rows[0].changes.iter().map(|c| format!("{}: {} -> {}", c.column, c.a, c.b)).collect();
    assert_eq!(changes, vec!["ratio: '0.1' -> '0.25'", "name: 'plain' -> 'plain!'"]);
    assert_eq!(d.only_in_a_rows[0][0], "id='3'");
    assert!(d.only_in_a_rows[0][1..].iter().all(|c| c.ends_with("=NULL")), "{:?}", d.only_in_a_rows);
}

#[test]
fn postgres_gives_the_golden_checksum() {
    use fixpoint_core::fingerprint::golden;
    let Some(pg) = PgUnderTest::get() else { return };
    let mut pg = pg.fresh();
    exec(pg.as_mut(), &format!(
        "CREATE SCHEMA g;\nCREATE TABLE g.t (id BIGINT, small SMALLINT, amount NUMERIC(12,2), name TEXT, day DATE, ts TIMESTAMP, flag BOOLEAN, ratio DOUBLE PRECISION);\nINSERT INTO g.t VALUES {}",
        golden::ROWS
    ));
    let t = TableName::parse("g.t").unwrap();
    let cols = pg.table_columns(&t).unwrap().unwrap();
    let fp = fingerprint(pg.as_mut(), Method::Portable, &Scope::Table { table: &t, filter: None }, &cols).unwrap();
    assert_eq!((fp.rows, fp.checksum.as_str()), (7, golden::CHECKSUM), "the value DuckDB's and Spark's tests pin");
}

/// PostgreSQL writes every double, edge values included, as the canonical
/// text fixpoint's Rust code writes (which DuckDB's SQL and Spark's are
/// tested against too).
#[test]
fn postgres_writes_each_float_as_its_bits() {
    let Some(pg) = PgUnderTest::get() else { return };
    let mut pg = pg.fresh();
    let values = [
        "NaN", "Infinity", "-Infinity", "0", "-0", "4.9e-324", "-2.5e-310", "2.2250738585072009e-308", "2.2250738585072014e-308",
        "1.7976931348623157e308", "-8.98846567431158e307", "0.1", "0.30000000000000004", "1", "0.5", "1e300", "-1234.5", "1.0000000000000002",
    ];
    let col = fixpoint_core::engine::Column { name: "v".into(), ty: "double precision".into() };
    let (text, class) = pg.portable_value("x.v", &col);
    assert_eq!(class, "float");
    let literals: Vec<String> = values.iter().enumerate().map(|(i, v)| format!("({i}, CAST('{v}' AS DOUBLE PRECISION))")).collect();
    let rows = pg.query(&fixpoint_core::sql::Sql::raw(format!("SELECT x.i, {text} FROM (VALUES {}) AS x(i, v) ORDER BY x.i", literals.join(", ")))).unwrap();
    let got: Vec<String> = rows.rows.iter().map(|r| r[1].display().trim_matches('"').to_owned()).collect();
    let want: Vec<String> = values
        .iter()
        .map(|v| fixpoint_core::fingerprint::float_text(v.parse::<f64>().unwrap()))
        .collect();
    assert_eq!(got, want);
    // A REAL is widened exactly.
    let real = fixpoint_core::engine::Column { name: "v".into(), ty: "real".into() };
    let (text, _) = pg.portable_value("x.v", &real);
    let rows = pg.query(&fixpoint_core::sql::Sql::raw(format!("SELECT {text} FROM (VALUES (CAST('0.1' AS REAL))) AS x(v)"))).unwrap();
    assert_eq!(rows.rows[0][0].display().trim_matches('"'), f64::from(0.1f32).to_bits().to_string());
}
