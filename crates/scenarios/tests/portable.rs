//! The portable fingerprint agrees across engines: the same logical rows in
//! DuckDB and in PostgreSQL give the same checksum, and one changed value
//! changes it on both.

use fixpoint_core::engine::measure::{fingerprint, Scope};
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
    use fixpoint_core::tools::diff::{diff, DiffOptions, Sides};
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
    let (text, class) = pg.dialect().portable_value("x.v", &col);
    assert_eq!(class, "float");
    let literals: Vec<String> = values.iter().enumerate().map(|(i, v)| format!("({i}, CAST('{v}' AS DOUBLE PRECISION))")).collect();
    let rows = pg.query(&fixpoint_core::job::sql::Sql::raw(format!("SELECT x.i, {text} FROM (VALUES {}) AS x(i, v) ORDER BY x.i", literals.join(", ")))).unwrap();
    let got: Vec<String> = rows.rows.iter().map(|r| r[1].display().trim_matches('"').to_owned()).collect();
    let want: Vec<String> = values
        .iter()
        .map(|v| fixpoint_core::fingerprint::float_text(v.parse::<f64>().unwrap()))
        .collect();
    assert_eq!(got, want);
    // A REAL is widened exactly.
    let real = fixpoint_core::engine::Column { name: "v".into(), ty: "real".into() };
    let (text, _) = pg.dialect().portable_value("x.v", &real);
    let rows = pg.query(&fixpoint_core::job::sql::Sql::raw(format!("SELECT {text} FROM (VALUES (CAST('0.1' AS REAL))) AS x(v)"))).unwrap();
    assert_eq!(rows.rows[0][0].display().trim_matches('"'), f64::from(0.1f32).to_bits().to_string());
}

/// How one engine spells the generated rows' types and byte strings.
struct Dialect {
    table: &'static str,
    double: &'static str,
    real: &'static str,
    blob: fn(&str) -> String,
}

const DUCK: Dialect = Dialect {
    table: "CREATE TABLE s.g (id BIGINT, small SMALLINT, amount DECIMAL(12,2), ratio DOUBLE, r REAL, name VARCHAR, day DATE, ts TIMESTAMP, flag BOOLEAN, raw BLOB)",
    double: "DOUBLE",
    real: "REAL",
    blob: duck_blob,
};
const PG: Dialect = Dialect {
    table: "CREATE TABLE s.g (id BIGINT, small SMALLINT, amount NUMERIC(12,2), ratio DOUBLE PRECISION, r REAL, name TEXT, day DATE, ts TIMESTAMP, flag BOOLEAN, raw BYTEA)",
    double: "DOUBLE PRECISION",
    real: "REAL",
    blob: pg_blob,
};

/// splitmix64: the same rows on every run and on both engines.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    fn pick<'a>(&mut self, items: &[&'a str]) -> &'a str {
        items[self.below(items.len() as u64) as usize]
    }
}

/// One generated value, engine-neutral: rendered as a literal by [`literal`].
#[derive(Clone)]
enum Gen {
    Null,
    Int(&'static str, i64),
    Decimal(i64),
    Double(f64),
    Real(f32),
    Text(String),
    Date(i64),
    Timestamp(i64),
    Bool(bool),
    Bytes(Vec<u8>),
}

fn date_text(days_since_1970: i64) -> String {
    let d = chrono::NaiveDate::from_ymd_opt(1970, 1, 1).unwrap() + chrono::Duration::days(days_since_1970);
    d.format("%Y-%m-%d").to_string()
}

fn literal(v: &Gen, dialect: &Dialect) -> String {
    match v {
        Gen::Null => "NULL".into(),
        Gen::Int(ty, i) => format!("CAST('{i}' AS {ty})"),
        Gen::Decimal(cents) => {
            let sign = if *cents < 0 { "-" } else { "" };
            format!("CAST('{sign}{}.{:02}' AS DECIMAL(12,2))", cents.unsigned_abs() / 100, cents.unsigned_abs() % 100)
        }
        // Rust's shortest round-trip text (`NaN`, `inf` and `-inf` too),
        // which both engines read back to the same value.
        Gen::Double(x) => format!("CAST('{x:?}' AS {})", dialect.double),
        Gen::Real(x) => format!("CAST('{x:?}' AS {})", dialect.real),
        Gen::Text(s) => format!("'{}'", s.replace('\'', "''")),
        Gen::Date(d) => format!("DATE '{}'", date_text(*d)),
        Gen::Timestamp(us) => {
            let (day, in_day) = (us.div_euclid(86_400_000_000), us.rem_euclid(86_400_000_000));
            let (secs, micros) = (in_day / 1_000_000, in_day % 1_000_000);
            format!("TIMESTAMP '{} {:02}:{:02}:{:02}.{micros:06}'", date_text(day), secs / 3600, secs / 60 % 60, secs % 60)
        }
        Gen::Bool(b) => b.to_string(),
        Gen::Bytes(b) => (dialect.blob)(&b.iter().map(|x| format!("{x:02x}")).collect::<String>()),
    }
}

/// `n` random rows and the edge values (NULL in every column, NaN, ±∞,
/// -0, subnormals, the extreme doubles and floats, text with `|`, `\`,
/// quotes, newlines, unicode and 30 KB, the first and last dates and
/// microseconds, empty and long byte strings), some rows twice.
fn generated_rows(n: usize) -> Vec<Vec<Gen>> {
    const DAYS_MIN: i64 = -719_162; // 0001-01-01
    const DAYS_MAX: i64 = 2_932_896; // 9999-12-31
    const US_MIN: i64 = DAYS_MIN * 86_400_000_000;
    const US_MAX: i64 = (DAYS_MAX + 1) * 86_400_000_000 - 1;
    let doubles = [
        f64::NAN,
        f64::INFINITY,
        f64::NEG_INFINITY,
        0.0,
        -0.0,
        f64::from_bits(1),
        -f64::from_bits(1),
        f64::from_bits(0x000F_FFFF_FFFF_FFFF),
        f64::MIN_POSITIVE,
        f64::MAX,
        f64::MIN,
        1e-300,
        0.1,
        0.300_000_000_000_000_04,
        1.000_000_000_000_000_2,
        -1234.5e-300,
    ];
    let reals = [f32::NAN, f32::INFINITY, f32::NEG_INFINITY, 0.0, -0.0, f32::from_bits(1), f32::MIN_POSITIVE, f32::MAX, f32::MIN, 0.1];
    let texts = [
        "", "NULL", "\\N", "\\", "|", "a|b\\c", "||\\\\", "it's", " spaced ", "tab\there", "new\nline", "ünïcödé ✓ 'quoted' 日本語 😀 a,b",
    ];
    let blobs: [Vec<u8>; 5] = [vec![], vec![0], vec![0xff], vec![0xde, 0xad, 0xbe, 0xef], vec![0; 2000]];
    let long_text = "long|text\\".repeat(3000);
    let mut rng = Rng(20261020);
    let mut rows = Vec::new();
    // The edges, one row each, then NULL everywhere but the id.
    for i in 0..doubles.len().max(reals.len()).max(texts.len()) {
        rows.push(vec![
            Gen::Int("BIGINT", i as i64),
            Gen::Int("SMALLINT", [i16::MIN, i16::MAX, 0, -1][i % 4] as i64),
            Gen::Decimal([-999_999_999_999, 999_999_999_999, 0, -5, 1][i % 5]),
            Gen::Double(doubles[i % doubles.len()]),
            Gen::Real(reals[i % reals.len()]),
            Gen::Text(texts[i % texts.len()].to_owned()),
            Gen::Date([DAYS_MIN, DAYS_MAX, 0, -1, 11_016][i % 5]),
            Gen::Timestamp([US_MIN, US_MAX, 0, -1, 1, 951_782_400_000_000][i % 6]),
            Gen::Bool(i % 2 == 0),
            Gen::Bytes(blobs[i % 5].clone()),
        ]);
    }
    rows.push(vec![Gen::Null; 10]);
    let mut nulls = vec![Gen::Null; 10];
    nulls[0] = Gen::Int("BIGINT", i64::MIN);
    rows.push(nulls);
    let mut long = rows[1].clone();
    long[0] = Gen::Int("BIGINT", i64::MAX);
    long[5] = Gen::Text(long_text);
    rows.push(long);
    let ascii: Vec<char> = (' '..='~').collect();
    let unicode = ['ü', 'ß', '✓', '日', '😀', '|', '\\', '\''];
    while rows.len() < n {
        let id = rows.len() as i64;
        let mut row = Vec::new();
        for col in 0..10 {
            if col > 0 && rng.below(10) == 0 {
                row.push(Gen::Null);
                continue;
            }
            let edge = rng.below(8) == 0;
            row.push(match col {
                0 => Gen::Int("BIGINT", id),
                1 => Gen::Int("SMALLINT", rng.next() as i16 as i64),
                2 => Gen::Decimal((rng.next() % 1_999_999_999_999) as i64 - 999_999_999_999),
                3 if edge => Gen::Double(doubles[rng.below(doubles.len() as u64) as usize]),
                3 if rng.below(2) == 0 => Gen::Double((rng.next() as i64 as f64) / 1e6),
                3 => Gen::Double(f64::from_bits(rng.next())),
                4 if edge => Gen::Real(reals[rng.below(reals.len() as u64) as usize]),
                4 => Gen::Real(f32::from_bits(rng.next() as u32)),
                5 if edge => Gen::Text(rng.pick(&texts).to_owned()),
                5 => {
                    let len = rng.below(40);
                    Gen::Text(
                        (0..len)
                            .map(|_| if rng.below(6) == 0 { unicode[rng.below(unicode.len() as u64) as usize] } else { ascii[rng.below(ascii.len() as u64) as usize] })
                            .collect(),
                    )
                }
                6 if edge => Gen::Date([DAYS_MIN, DAYS_MAX, 0, -1][rng.below(4) as usize]),
                6 => Gen::Date(DAYS_MIN + rng.below((DAYS_MAX - DAYS_MIN + 1) as u64) as i64),
                7 if edge => Gen::Timestamp([US_MIN, US_MAX, 0, -1][rng.below(4) as usize]),
                7 => Gen::Timestamp(US_MIN + rng.below((US_MAX - US_MIN + 1) as u64) as i64),
                8 => Gen::Bool(rng.below(2) == 0),
                _ => Gen::Bytes((0..rng.below(24)).map(|_| rng.next() as u8).collect()),
            });
        }
        // Now and then the same row again (a duplicate changes the sum).
        if rng.below(50) == 0 {
            rows.push(row.clone());
        }
        rows.push(row);
    }
    rows
}

fn load_generated(db: &mut dyn Engine, dialect: &Dialect, rows: &[Vec<Gen>]) {
    exec(db, &format!("CREATE SCHEMA s;\n{}", dialect.table));
    for batch in rows.chunks(200) {
        let values: Vec<String> =
            batch.iter().map(|r| format!("({})", r.iter().map(|v| literal(v, dialect)).collect::<Vec<_>>().join(", "))).collect();
        // Run as it is: values hold newlines and semicolons, which `exec` would split on.
        db.execute(&fixpoint_core::job::sql::Sql::raw(format!("INSERT INTO s.g VALUES {}", values.join(",\n"))))
            .unwrap_or_else(|e| panic!("loading the generated rows: {e}"));
    }
}

/// PostgreSQL's portable fingerprint (built in SQL) equals DuckDB's (its
/// own implementation, in Rust) over thousands of generated rows, edge
/// values in every column included; on a difference, the columns that
/// disagree are named.
#[test]
fn postgres_and_duckdb_agree_on_generated_rows() {
    let Some(pg) = PgUnderTest::get() else { return };
    let rows = generated_rows(2500);
    let mut duck = DuckDbUnderTest.fresh();
    let mut pg = pg.fresh();
    load_generated(duck.as_mut(), &DUCK, &rows);
    load_generated(pg.as_mut(), &PG, &rows);
    let t = TableName::parse("s.g").unwrap();
    let scope = Scope::Table { table: &t, filter: None };
    let (dcols, pcols) = (duck.table_columns(&t).unwrap().unwrap(), pg.table_columns(&t).unwrap().unwrap());
    let d = fingerprint(duck.as_mut(), Method::Portable, &scope, &dcols).unwrap();
    let p = fingerprint(pg.as_mut(), Method::Portable, &scope, &pcols).unwrap();
    assert_eq!(d.rows, rows.len() as u64);
    if d != p {
        let differing: Vec<String> = dcols
            .iter()
            .zip(&pcols)
            .filter(|(dc, pc)| {
                let a = fingerprint(duck.as_mut(), Method::Portable, &scope, std::slice::from_ref(*dc)).unwrap();
                let b = fingerprint(pg.as_mut(), Method::Portable, &scope, std::slice::from_ref(*pc)).unwrap();
                a != b
            })
            .map(|(dc, pc)| format!("{} ({} / {})", dc.name, dc.ty, pc.ty))
            .collect();
        panic!("DuckDB {d} but PostgreSQL {p}; the columns that differ alone: {differing:?}");
    }
}

/// PostgreSQL's native fingerprint hashes every type a table can hold
/// (those without a hash of their own by their text), and a change to any
/// one value changes it: text under a case-insensitive collation, a value
/// of an enum, a domain, an array, `json`, an interval, a time zone's
/// instant.
#[test]
fn postgres_native_fingerprint_sees_every_value_of_every_type() {
    let Some(pg) = PgUnderTest::get() else { return };
    let mut pg = pg.fresh();
    let db = pg.as_mut();
    exec(
        db,
        "CREATE SCHEMA n;
CREATE COLLATION n.ci (provider = icu, locale = 'und-u-ks-level2', deterministic = false);
CREATE TYPE n.mood AS ENUM ('sad', 'ok', 'happy');
CREATE DOMAIN n.pos AS INTEGER CHECK (VALUE > 0);
CREATE TABLE n.t (id INTEGER, name TEXT COLLATE n.ci, code CHARACTER(3), tag VARCHAR(8), amount NUMERIC(12,2), ratio REAL, at TIMESTAMP WITH TIME ZONE, \
 clock TIME WITH TIME ZONE, span INTERVAL YEAR TO MONTH, mood n.mood, p n.pos, arr INTEGER[], doc JSON, docb JSONB, uid UUID, raw BYTEA, flag BOOLEAN);
INSERT INTO n.t VALUES
 (1, 'Alice', 'abc', 'x', 1.50, 0.5, '2026-10-20 10:00:00+00', '10:00:00+00', '1 year', 'ok', 1, '{1,2}', '{\"a\": 1}', '{\"a\": 1}', 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11', '\\x01', true),
 (2, 'Bob', 'def', 'y', 2.25, -0.5, '2026-10-21 10:00:00+00', '11:00:00+00', '2 years', 'sad', 2, '{3}', '{\"b\": 2}', '{\"b\": 2}', 'b0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11', '\\x02', false)",
    );
    let t = TableName::parse("n.t").unwrap();
    let cols = db.table_columns(&t).unwrap().unwrap();
    let fp = |db: &mut dyn Engine| fingerprint(db, Method::Native, &Scope::Table { table: &t, filter: None }, &cols).unwrap();
    let before = fp(db);
    assert_eq!(before.rows, 2);
    assert!(before.kind.starts_with("native-v2/postgres "), "{}", before.kind);
    let changes = [
        ("name", "'alice'"),
        ("code", "'abd'"),
        ("tag", "'X'"),
        ("amount", "1.51"),
        ("ratio", "0.25"),
        ("at", "'2026-10-20 10:00:01+00'"),
        ("clock", "'10:00:00+01'"),
        ("span", "'13 months'"),
        ("mood", "'happy'"),
        ("p", "3"),
        ("arr", "'{2,1}'"),
        ("doc", "'{\"a\": 2}'"),
        ("docb", "'{\"a\": 2}'"),
        ("uid", "'c0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11'"),
        ("raw", "'\\x03'"),
        ("flag", "false"),
    ];
    for (col, value) in changes {
        exec(db, &format!("CREATE TABLE n.saved AS SELECT * FROM n.t WHERE id = 1;\nUPDATE n.t SET {col} = {value} WHERE id = 1"));
        let changed = fp(db);
        assert_eq!(changed.rows, 2);
        assert_ne!(changed.checksum, before.checksum, "a new {col} ({value}) changes the fingerprint");
        exec(db, "DELETE FROM n.t WHERE id = 1;\nINSERT INTO n.t SELECT * FROM n.saved;\nDROP TABLE n.saved");
        assert_eq!(fp(db), before, "{col} put back");
    }
    // The same values in the other row: swapped between rows.
    exec(db, "UPDATE n.t SET amount = CASE id WHEN 1 THEN 2.25 ELSE 1.50 END");
    assert_ne!(fp(db).checksum, before.checksum, "amounts swapped between rows");
}
