//! Randomized bad input, fed to the real binary (the catalogue in
//! bad_input.rs checks each known case's message; this file throws many more
//! at it and checks only invariants). Generated job files (wrong types, typos,
//! missing keys, wrong shapes, hostile identifiers and SQL, odd files) and
//! arguments (bad dates and ranges, unknown flags, URLs that are no database)
//! go to `run`, `backfill`, `prove`, `status`, `lint` and `runs` against a
//! DuckDB file holding a bronze table and a loaded silver target. After every
//! command:
//!
//! - the exit code is never 101 (a panic) or 70 (an internal error), and the
//!   process was not killed by a signal;
//! - a non-zero exit leaves the database exactly as it was: every table of
//!   every schema (listed from `duckdb_tables()`, read in full as sorted
//!   text, with its DDL), every view and schema, the ledger `fixpoint.runs`
//!   included; and stderr holds an `error:` line;
//! - whatever the exit code, nothing outside the schemas `silver` and
//!   `fixpoint` changes (a source `DROP TABLE bronze.orders` that exits 0 and
//!   drops it is a failure as much as one that exits 2 and drops it);
//! - the files a `--db` may point at by mistake (a text file, the job file
//!   itself, garbage) are unchanged.
//!
//! Documented exceptions, kept narrow: a `backfill` (or a `run` with
//! `lookback`) whose report says that earlier dates committed may have
//! written those dates before failing on a later one (each date is its own
//! transaction); `prove` runs the job for real (README: "each a real
//! rewrite"), so silver and the ledger may change before it fails; `lint`
//! (exit 2 with findings), `prove` (exit 4, "not idempotent") and `diff`
//! (exit 4) report on stdout rather than with an `error:` line; `fixpoint`
//! with no arguments at all prints clap's usage.
//!
//! Two tests: a fixed list (every hostile case below run once each, so they
//! are always covered) and a proptest run over generated recipes
//! (`FIXPOINT_BAD_INPUT_CASES`, default 48; `FIXPOINT_BAD_INPUT_SEED` repeats
//! a run, its seed is printed).

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsString;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use proptest::prelude::*;
use proptest::test_runner::{RngSeed, TestError, TestRunner};

/// The database every case runs against (relative to the binary's folder).
const DB: &str = "duckdb:w.duckdb";
/// A command that takes longer is killed and reported.
const TIMEOUT: Duration = Duration::from_secs(120);
/// The schemas a successful command may change.
const WRITABLE: [&str; 2] = ["silver", "fixpoint"];

const SETUP: &str = "CREATE SCHEMA bronze;
CREATE TABLE bronze.orders (order_id BIGINT, customer_id BIGINT, order_total DECIMAL(12,2), currency VARCHAR, updated_at TIMESTAMP, dt DATE);
INSERT INTO bronze.orders VALUES
  (1, 10, 1.50, 'EUR', TIMESTAMP '2026-10-18 08:00:00', DATE '2026-10-18'),
  (2, 11, 2.50, 'USD', TIMESTAMP '2026-10-18 09:00:00', DATE '2026-10-18'),
  (3, 10, 3.50, 'EUR', TIMESTAMP '2026-10-19 08:00:00', DATE '2026-10-19'),
  (4, 12, 4.50, 'GBP', TIMESTAMP '2026-10-19 09:00:00', DATE '2026-10-19'),
  (5, 11, 5.50, 'EUR', TIMESTAMP '2026-10-20 08:00:00', DATE '2026-10-20'),
  (6, 12, 6.50, 'USD', TIMESTAMP '2026-10-20 09:00:00', DATE '2026-10-20'),
  (7, 10, 7.50, 'EUR', TIMESTAMP '2026-10-20 10:00:00', DATE '2026-10-20'),
  (8, 13, 8.50, 'EUR', TIMESTAMP '2026-10-21 08:00:00', DATE '2026-10-21');
CREATE TABLE bronze.customers (customer_id BIGINT, name VARCHAR);
INSERT INTO bronze.customers VALUES (10, 'Ann'), (11, 'Bo'), (12, 'Cy'), (13, 'Dé ☃');
CREATE TABLE main.keep (x INTEGER);
INSERT INTO main.keep VALUES (1), (2);";

const BASE_SQL: &str = "SELECT order_id, customer_id, order_total, currency, updated_at, dt FROM bronze.orders WHERE dt = :run_date";

// ---------------------------------------------------------------------------
// The material: wrong values, typos, hostile SQL and identifiers, odd
// arguments. Where a list has a valid entry it comes first (proptest shrinks
// indexes towards 0): the base query, the identifier `dt`, the good dates,
// the test's own database, `case.toml`.
// ---------------------------------------------------------------------------

/// Known keys with values of the wrong type, out of range, or hostile (raw TOML).
const WRONG: &[(&str, &[&str])] = &[
    ("name", &["5", "\"\"", "\"x'; DROP TABLE bronze.orders; --\"", "[\"a\"]", "\"ünïcödé\"", "\"a b\"", "true"]),
    (
        "target",
        &[
            "5",
            "\"\"",
            "\"orders\"",
            "\"a.b.c\"",
            "\"silver.orders; DROP TABLE bronze.orders\"",
            "'silver.\"orders\"\"; DROP TABLE bronze.orders; --\"'",
            "\"fixpoint.runs\"",
            "\"FIXPOINT.runs\"",
            "\"fixpoint_sandbox_1a2b3c4d.orders\"",
            "\"silver.ordérs\"",
            "[\"silver.orders\"]",
            "{ schema = \"silver\", table = \"orders\" }",
            "\"silver.\"",
            "\".orders\"",
            "\"silver..orders\"",
            "\" silver.orders\"",
            "\"silver.new_orders\"",
            "\"silver.orders_m\"",
        ],
    ),
    ("strategy", &["3", "\"upsert\"", "\"REPLACE_PARTITION\"", "\"\"", "[\"merge\"]", "\"replace_table\"", "\"merge\"", "\"append\""]),
    (
        "partition",
        &["[1]", "5", "\"\"", "\"day\"", "\"dt; DROP TABLE bronze.orders\"", "'x\"; DROP TABLE bronze.orders; --'", "\"order_id\"", "\"currency\"", "\"updated_at\"", "\"ünï\"", "[\"dt\"]", "\"DT\""],
    ),
    ("key", &["5", "\"order_id\"", "[]", "[1]", "[\"order_id) OR 1=1 --\"]", "[\"nope\"]", "[\"\"]", "[\"order_id\", \"order_id\"]", "[\"dt\"]", "[\"updated_at\"]"]),
    ("version", &["5", "\"\"", "\"nope\"", "\"order_id\"", "\"updated_at; DROP TABLE bronze.orders\"", "[\"updated_at\"]", "\"currency\"", "\"dt\""]),
    ("metadata", &["\"x\"", "[1]", "[\"dt\"]", "['x\"; DROP TABLE bronze.orders; --']", "[\"nope\"]", "[\"order_id\"]", "{}", "[[\"a\"]]"]),
    ("min_rows", &["\"one\"", "-1", "1.5", "9223372036854775807", "100", "true", "0", "[1]", "99999999999999999999"]),
    ("lookback", &["-1", "\"x\"", "367", "1.5", "1", "2", "99999999999999999999", "\"1\""]),
    ("start", &["\"not a date\"", "2026-13-01", "5", "2026-10-21", "1979-05-27T07:32:00Z", "\"2026-10-01\"", "07:32:00", "\"\"", "[2026-10-01]", "2026-02-30"]),
    ("on_schema_change", &["\"sync\"", "5", "\"append_new_columns\"", "\"FAIL\"", "[\"fail\"]"]),
    ("on_tie", &["\"random\"", "1", "\"deterministic\"", "\"\""]),
    (
        "deleted",
        &[
            "\"false; DROP TABLE bronze.orders\"",
            "5",
            "\"op = 'D'\"",
            "\"1=1) OR (1=1\"",
            "\"\"",
            "\"(SELECT count(*) FROM bronze.orders) > 0\"",
            "\"currency = 'EUR'\"",
            "\"1=1; DELETE FROM bronze.orders\"",
        ],
    ),
    ("description", &["5", "[\"x\"]", "\"ok\""]),
    (
        "audit",
        &[
            "\"x\"",
            "[{ kind = \"nope\" }]",
            "[{ kind = \"sql\", sql = \"DELETE FROM bronze.orders\" }]",
            "[{ kind = \"sql\", sql = \"SELECT 1; DROP TABLE bronze.orders\" }]",
            "[{ kind = \"expression\", expression = \"1=1; DROP TABLE bronze.orders\" }]",
            "[{ kind = \"not_null\", columns = ['x\"; DROP TABLE bronze.orders; --'] }]",
            "[{ kind = \"accepted_values\", column = \"currency\", values = [\"EUR'); DROP TABLE bronze.orders; --\"] }]",
            "[{ kind = \"row_count\", min = \"many\" }]",
            "[{ kind = \"row_count_change\", max_drop_pct = -5 }]",
            "[{ kind = \"unique\", columns = [] }]",
            "5",
            "[{ kind = \"sql\", sql = \"SELECT * FROM bronze.orders WHERE dt = :run_date\" }]",
        ],
    ),
];

/// Key typos (`from` renamed to `to`; added with a value when `from` is absent).
const TYPOS: &[(&str, &str)] = &[
    ("partition", "partiton"),
    ("strategy", "stratgy"),
    ("target", "targt"),
    ("min_rows", "min_row"),
    ("name", "Name"),
    ("source", "sources"),
    ("key", "keys"),
    ("version", "verison"),
    ("metadata", "meta_data"),
    ("sql", "sq"),
    ("sql", "SQL"),
    ("partition", "\"partition \""),
    ("target", "tar-get"),
    ("name", "\"\""),
    ("strategy", "strategy.x"),
];

/// `[source]` keys with wrong values (raw TOML).
const SRC_WRONG: &[(&str, &[&str])] = &[
    ("sql", &["[\"SELECT 1\"]", "5", "\"\"", "\"   \"", "{ text = \"SELECT 1\" }", "true"]),
    (
        "files",
        &[
            "\"bronze/orders/dt={run_date}/*.parquet\"",
            "\"nope/*.csv\"",
            "\"../../../etc/passwd\"",
            "\"/etc/passwd\"",
            "5",
            "\"\"",
            "\"x/{run_date:%Q}/*.csv\"",
            "\"x/{nope}/*.csv\"",
            "\"*\"",
            "\"case.toml\"",
            "\"w.duckdb\"",
        ],
    ),
    ("format", &["\"xml\"", "5", "\"csv\"", "\"parquet\""]),
    ("allow_missing", &["\"yes\"", "1", "true"]),
    ("require_marker", &["5", "\"\"", "\"../_SUCCESS\"", "\"_SUCCESS\""]),
    ("query", &["\"SELECT 1\""]),
];

/// Sources that are not one query: fixpoint itself must refuse every one
/// (first word not a query, or more than one statement).
const DDL_SQL: &[&str] = &[
    "DROP TABLE bronze.orders",
    "DELETE FROM bronze.orders",
    "DELETE FROM bronze.orders WHERE dt = :run_date",
    "UPDATE bronze.orders SET order_total = 0",
    "INSERT INTO bronze.orders SELECT * FROM bronze.orders",
    "TRUNCATE bronze.orders",
    "ALTER TABLE bronze.orders DROP COLUMN dt",
    "CREATE TABLE bronze.evil AS SELECT 1 AS x",
    "CREATE OR REPLACE TABLE bronze.orders AS SELECT 1 AS x",
    "DROP SCHEMA bronze CASCADE",
    "SELECT 1; DELETE FROM silver.orders",
    "SELECT order_id, customer_id, order_total, currency, updated_at, dt FROM bronze.orders WHERE dt = :run_date; DROP TABLE bronze.orders",
    "FROM bronze.orders; DELETE FROM bronze.orders",
    "(SELECT 1); DROP TABLE bronze.orders",
    "BEGIN; DELETE FROM bronze.orders; COMMIT",
    "  \n  drop table bronze.orders",
    "/* comment */ DELETE FROM bronze.orders",
    "CHECKPOINT",
    "ATTACH 'evil.duckdb' AS evil",
    "DETACH w",
    "COPY bronze.orders TO 'out.csv'",
    "PRAGMA database_list",
    "CALL pragma_version()",
    "SET threads = 1",
    "USE bronze",
    "INSTALL httpfs",
    "EXPORT DATABASE 'exported'",
    "VACUUM",
];

/// Sources that read the tables in ways that may confuse the table renaming
/// of `prove`'s sandbox (which must never touch the real tables).
const PROVE_SQL: &[&str] = &[
    "SELECT * FROM \"bronze\".\"orders\" WHERE dt = :run_date",
    "SELECT * FROM bronze . orders WHERE dt = :run_date",
    "SELECT * FROM BRONZE.ORDERS WHERE dt = :run_date",
    "SELECT * FROM w.bronze.orders WHERE dt = :run_date",
    "WITH bronze AS (SELECT 1 AS x) SELECT * FROM bronze.orders WHERE dt = :run_date",
    "SELECT o.* FROM bronze.orders AS o JOIN bronze.customers AS c USING (customer_id) WHERE o.dt = :run_date",
    "SELECT * FROM bronze.orders WHERE dt = :run_date AND order_id IN (SELECT order_id FROM bronze.orders WHERE currency = 'EUR')",
];

/// Other hostile or broken sources (a query that may run, or fails to).
const OTHER_SQL: &[&str] = &[
    BASE_SQL,
    "SELECT * FROM bronze.orders WHERE dt = :run_date",
    "WITH d AS (DELETE FROM bronze.orders RETURNING *) SELECT * FROM d",
    "SELECT * FROM query('DELETE FROM bronze.orders')",
    "SELECT * FROM query('DROP TABLE bronze.orders')",
    "SELECT * FROM query_table('bronze.orders')",
    "SELECT order_id, customer_id, order_total, currency, updated_at, dt FROM bronze.nope WHERE dt = :run_date",
    "SELECT order_id, nope, dt FROM bronze.orders WHERE dt = :run_date",
    "SELEC order_id FROM bronze.orders",
    "SELECT FROM WHERE",
    "",
    "   ",
    ";",
    "-- only a comment",
    "/* unterminated",
    "SELECT 'unterminated",
    "SELECT \"unterminated",
    "SELECT * FROM bronze.orders WHERE dt = :rundate",
    "SELECT * FROM bronze.orders WHERE dt = ':run_date'",
    "SELECT * FROM bronze.orders WHERE dt = :run_date -- ; DROP TABLE bronze.orders",
    "SELECT * FROM bronze.orders WHERE dt = :run_date /* ; DROP TABLE bronze.orders */",
    "SELECT * FROM bronze.orders WHERE dt = $1",
    "SELECT * FROM bronze.orders WHERE dt = ?",
    "SELECT * FROM bronze.orders WHERE dt = :run_date:run_date",
    "TABLE bronze.orders",
    "VALUES (1, 2)",
    "FROM bronze.orders WHERE dt = :run_date",
    "SELECT * FROM bronze.orders",
    "SELECT * FROM bronze.orders WHERE dt = :run_date UNION ALL SELECT * FROM bronze.orders",
    "SELECT order_id, customer_id, order_total, currency, updated_at, dt FROM silver.orders WHERE dt = :run_date",
    "SELECT * FROM fixpoint.runs",
    "SELECT *, CAST('x' AS INTEGER) AS boom FROM bronze.orders WHERE dt = :run_date",
    "SELECT * FROM read_csv('case.toml')",
    "SELECT *, now() AS loaded_at FROM bronze.orders WHERE dt = :run_date",
    "SELECT *, random() AS r FROM bronze.orders WHERE dt = :run_date",
    "SELECT 1 AS \"x\"\"; DROP TABLE bronze.orders; --\", * FROM bronze.orders WHERE dt = :run_date",
    "SELECT order_id, customer_id, order_total, currency, updated_at, dt FROM bronze.orders WHERE dt = :run_date\u{0}; DROP TABLE bronze.orders",
    "SELECT 'ünïcödé ☃' AS s, * FROM bronze.orders WHERE dt = :run_date",
    "SELECT * FROM bronze.orders WHERE dt = :run_date AND :run_key IS NOT NULL",
    "SELECT * FROM bronze.orders WHERE dt = CAST(:run_date AS VARCHAR) || '; DROP TABLE bronze.orders'",
];

/// Every hostile source, the long and deep ones built once.
fn hostile_sqls() -> &'static [String] {
    static SQLS: OnceLock<Vec<String>> = OnceLock::new();
    SQLS.get_or_init(|| {
        let mut v: Vec<String> = OTHER_SQL.iter().chain(PROVE_SQL).chain(DDL_SQL).map(|s| s.to_string()).collect();
        v.extend(long_sqls());
        v
    })
}

fn long_sqls() -> Vec<String> {
    vec![
        format!("SELECT {}1{} AS x", "(".repeat(3000), ")".repeat(3000)),
        format!("SELECT {} AS x", vec!["1"; 5000].join(" + ")),
        format!("SELECT '{}' AS s, * FROM bronze.orders WHERE dt = :run_date", "x".repeat(200_000)),
        format!("SELECT * FROM bronze.orders WHERE dt = :run_date{}", " ".repeat(100_000)),
    ]
}

/// Hostile identifiers (for target, partition, key, version, metadata, name).
const IDENTS: &[&str] = &[
    "dt",
    "x\"; DROP TABLE bronze.orders; --",
    "x'; DROP TABLE bronze.orders; --",
    "dt; DROP TABLE bronze.orders",
    "dt) OR 1=1 --",
    "\"dt\"",
    "dt\"",
    "`dt`",
    "[dt]",
    "",
    " ",
    "dt ",
    "ünïcödé",
    "日付",
    "dt\u{200b}",
    "d\u{0}t",
    "d\nt",
    "fixpoint.runs",
    "bronze.orders",
    "silver.orders",
    "1dt",
    "_",
    "select",
    "order",
    "dt -- ",
    "$1",
    ":run_date",
    "?",
    "\\",
    "%s",
    "{run_date}",
];

fn idents(free: &str) -> Vec<String> {
    let mut v: Vec<String> = IDENTS.iter().map(|s| s.to_string()).collect();
    v.push("a".repeat(5000));
    if !free.is_empty() {
        v.push(free.to_owned());
    }
    v
}

const IDENT_FIELDS: &[&str] = &["target", "partition", "key", "version", "metadata", "name"];
const FREE_FIELDS: &[&str] = &["name", "target", "partition", "version", "key", "metadata", "strategy", "on_tie", "on_schema_change", "deleted", "start", "source.sql"];

/// Raw text appended to a job file (after its `[source]` table).
const RAW_APPENDS: &[&str] = &[
    "name = \"dup\"\n",
    "[source]\nsql = \"SELECT 1\"\n",
    "[[audit]]\nkind = \"sql\"\nsql = \"DELETE FROM bronze.orders\"\n",
    "[[audit]]\nkind = \"expression\"\nexpression = \"order_total > 0); DROP TABLE bronze.orders; --\"\n",
    "[[audit]]\nkind = \"not_null\"\ncolumns = [\"nope\"]\n",
    "[[audit]]\nkind = \"row_count\"\nmin = 1000\n",
    "[[audit]]\nkind = \"accepted_values\"\ncolumn = \"currency\"\nvalues = [\"XXX\"]\n",
    "[[audit]]\nname = \"a\"\nkind = \"unique\"\ncolumns = [\"currency\"]\n[[audit]]\nname = \"a\"\nkind = \"unique\"\ncolumns = [\"currency\"]\n",
    "x = \"unterminated\n",
    "= 5\n",
    "[\n",
    "[source.extra]\nsql = 1\n",
    "\u{feff}",
    "a = 1\r\nb = 2\r\n",
    "key = 1e400\n",
    "garbage \u{0} here\n",
    "[[source]]\nsql = \"SELECT 1\"\n",
];

const DATES_OK: &[&str] = &["2026-10-20", "2026-10-19", "2026-10-21", "2026-10-18", "2026-10-22"];
/// Valid but extreme: only for single-date commands (a backfill or status over
/// 0001-01-01 … 9999-12-31 would run for hours).
const DATES_EDGE: &[&str] = &["9999-12-31", "0001-01-01", "2024-02-29"];
const DATES_BAD: &[&str] = &[
    "2026-13-01",
    "2026-02-30",
    "",
    "yesterday",
    "2026-10-20'; DROP TABLE bronze.orders; --",
    "20.10.2026",
    "2026-1-1",
    "2026-10-20T00:00:00",
    " 2026-10-20",
    "２０２６-１０-２０",
    "-2026-10-20",
    "2026-10-20\n",
    "0000-00-00",
    "+2026-10-20",
    "2026-10-32",
    "2025-02-29",
];

/// `--db` values that are no usable database (and whether the command must fail).
const BAD_DBS: &[(&str, bool)] = &[
    ("mysql://u:secret@h/db", true),
    ("notaurl", true),
    ("", true),
    ("duckdb:", true),
    ("duckdb:notes.txt", true),
    ("duckdb:case.toml", true),
    ("duckdb:folder", true),
    ("duckdb:garbage.duckdb", true),
    ("postgres://u:secret@127.0.0.1:1/db", true),
    ("sc://127.0.0.1:1", true),
    ("DUCKDB:w.duckdb", true),
    ("file:w.duckdb", true),
    ("duckdb:missing_dir/x.duckdb", false),
    ("duckdb::memory:", false),
    ("duckdb:w.duckdb?mode=ro", false),
];

/// Extra flags, added to any command (unknown ones included on purpose).
const FLAGS: &[&[&str]] = &[
    &["--force"],
    &["--output", "json"],
    &["--output", "xml"],
    &["--frobnicate"],
    &["--dat", "2026-10-20"],
    &["--parallel", "0"],
    &["--parallel", "2"],
    &["--parallel", "-1"],
    &["--parallel", "x"],
    &["--parallel", "99999999999999999999999"],
    &["--keep-going"],
    &["--allow-nondeterministic"],
    &["--no-wait"],
    &["--wait", "0"],
    &["--wait", "-1"],
    &["--runs", "1"],
    &["--runs", "0"],
    &["--runs", "3"],
    &["--no-mutate"],
    &["--mutate-key", "nope"],
    &["--mutate-key", "order_id=1"],
    &["--mutate-key", "x\"; DROP TABLE bronze.orders; --=1"],
    &["--dialect", "postgres"],
    &["--dialect", "oracle"],
    &["--deny-warnings"],
    &["--date"],
    &["--date", "2026-10-20", "--date", "2026-10-21"],
    &["--", "--force"],
    &["-x"],
    &["--crash"],
];

/// Whole command lines that are wrong in themselves.
const RAW_CMDS: &[&[&str]] = &[
    &["run", "case.toml", "case.toml", "--date", "2026-10-20", "--db", DB],
    &[""],
    &["runn", "case.toml"],
    &["run"],
    &["backfill", "case.toml", "--db", DB],
    &["status", "--db", DB],
    &["prove", "case.toml", "--db", DB],
    &["lint"],
    &["fingerprint", "silver.orders; DROP TABLE bronze.orders", "--db", DB],
    &["fingerprint", "silver.orders", "--where", "1=1; DROP TABLE bronze.orders", "--db", DB],
    &["fingerprint", "silver.orders", "--exclude", "x\"; DROP TABLE bronze.orders; --", "--db", DB],
    &["diff", "silver.orders", "silver.orders_m", "--key", "x\"; DROP TABLE bronze.orders; --", "--db", DB],
    &["diff", "silver.orders", "bronze.orders", "--key", "order_id", "--where", "1=1); DROP TABLE bronze.orders; --", "--db", DB],
    &["runs", "--job", "x'; DROP TABLE bronze.orders; --", "--db", DB],
    &["--db", DB],
    &["help", "run"],
    &["run", "--help"],
    &[],
];

// ---------------------------------------------------------------------------
// Job files.
// ---------------------------------------------------------------------------

/// A TOML string (basic string, every control character escaped), so that a
/// hostile value reaches fixpoint's validation instead of the TOML parser.
fn toml_str(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            c if (c as u32) < 0x20 || c as u32 == 0x7f => out.push_str(&format!("\\u{:04X}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// Letters, digits and `_`, not starting with a digit (fixpoint's rule).
fn is_plain(s: &str) -> bool {
    let mut chars = s.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_') && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

fn valid_table(t: &str) -> bool {
    let parts: Vec<&str> = t.split('.').collect();
    parts.len() == 2 && parts.iter().all(|p| is_plain(p))
}

/// An identifier as a target. A valid name is kept out of bronze (and every
/// schema but silver, fixpoint and prove's sandbox): a job may legitimately
/// write any table it names, and bronze must stay as it is.
fn as_target(ident: &str) -> String {
    let t = if ident.contains('.') { ident.to_owned() } else { format!("silver.{ident}") };
    let parts: Vec<&str> = t.split('.').collect();
    let allowed = ["silver", "fixpoint", "fixpoint_sandbox_1a2b3c4d"];
    if parts.len() == 2 && parts.iter().all(|p| is_plain(p)) && !allowed.iter().any(|a| parts[0].eq_ignore_ascii_case(a)) {
        format!("silver.{}", parts[1])
    } else {
        t
    }
}

#[derive(Clone, Debug)]
enum Src {
    /// A `[source]` table with these keys (raw TOML values).
    Table(Vec<(String, String)>),
    /// `source = <raw value>` at the top level.
    Inline(String),
    Absent,
}

/// A job file as keys and raw TOML values, so that one key can be broken.
#[derive(Clone, Debug)]
struct Doc {
    top: Vec<(String, String)>,
    source: Src,
    tail: String,
}

fn kv(k: &str, v: &str) -> (String, String) {
    (k.to_owned(), v.to_owned())
}

impl Doc {
    fn base(merge: bool) -> Doc {
        let top = if merge {
            vec![kv("name", "\"orders_merge\""), kv("target", "\"silver.orders_m\""), kv("strategy", "\"merge\""), kv("key", "[\"order_id\"]"), kv("version", "\"updated_at\"")]
        } else {
            vec![kv("name", "\"silver_orders\""), kv("target", "\"silver.orders\""), kv("strategy", "\"replace_partition\""), kv("partition", "\"dt\""), kv("min_rows", "1")]
        };
        Doc { top, source: Src::Table(vec![("sql".to_owned(), toml_str(BASE_SQL))]), tail: String::new() }
    }

    fn set(&mut self, key: &str, value: String) {
        let pos = self.top.iter().position(|(k, _)| k == key);
        match pos {
            Some(i) => self.top[i].1 = value,
            None => self.top.push((key.to_owned(), value)),
        }
    }

    fn set_source(&mut self, key: &str, value: String) {
        if !matches!(self.source, Src::Table(_)) {
            self.source = Src::Table(Vec::new());
        }
        if let Src::Table(kvs) = &mut self.source {
            let pos = kvs.iter().position(|(k, _)| k == key);
            match pos {
                Some(i) => kvs[i].1 = value,
                None => kvs.push((key.to_owned(), value)),
            }
        }
    }

    fn rename(&mut self, from: &str, to: &str) {
        let pos = self.top.iter().position(|(k, _)| k == from);
        if let Some(i) = pos {
            self.top[i].0 = to.to_owned();
            return;
        }
        if from == "source" {
            let kvs = match &self.source {
                Src::Table(kvs) => kvs.clone(),
                _ => Vec::new(),
            };
            self.source = Src::Absent;
            let mut section = format!("\n[{to}]\n");
            for (k, v) in kvs {
                section.push_str(&format!("{k} = {v}\n"));
            }
            self.tail = section + &self.tail;
            return;
        }
        if let Src::Table(kvs) = &mut self.source {
            let pos = kvs.iter().position(|(k, _)| k == from);
            if let Some(i) = pos {
                kvs[i].0 = to.to_owned();
                return;
            }
        }
        self.top.push((to.to_owned(), "\"dt\"".to_owned()));
    }

    fn render(&self) -> String {
        let mut s = String::new();
        for (k, v) in &self.top {
            s.push_str(&format!("{k} = {v}\n"));
        }
        if let Src::Inline(v) = &self.source {
            s.push_str(&format!("source = {v}\n"));
        }
        if let Src::Table(kvs) = &self.source {
            s.push_str("\n[source]\n");
            for (k, v) in kvs {
                s.push_str(&format!("{k} = {v}\n"));
            }
        }
        s.push_str(&self.tail);
        s
    }
}

/// Wrong shapes of the `[source]` section.
fn apply_shape(doc: &mut Doc, n: usize) {
    let sql = toml_str(BASE_SQL);
    match n % 10 {
        0 => doc.source = Src::Inline(sql),
        1 => doc.source = Src::Inline("5".to_owned()),
        2 => {
            doc.source = Src::Absent;
            doc.tail.push_str(&format!("\n[[source]]\nsql = {sql}\n"));
        }
        3 => doc.source = Src::Absent,
        4 => doc.source = Src::Table(Vec::new()),
        5 => doc.set_source("sql", format!("[{sql}]")),
        6 => doc.set_source("files", toml_str("bronze/orders/dt={run_date}/*.parquet")),
        7 => doc.source = Src::Table(vec![("files".to_owned(), toml_str("nowhere/dt={run_date}/*.csv"))]),
        8 => doc.set_source("sql", format!("'''\n{}\n; DROP TABLE bronze.orders\n'''", BASE_SQL)),
        _ => doc.source = Src::Inline(format!("{{ sql = {sql} }}")),
    }
}

/// Sets `field` to a hostile identifier; returns whether fixpoint must
/// refuse the job for it (the identifier cannot be a name).
fn set_ident(doc: &mut Doc, field: &str, ident: &str) -> bool {
    match field {
        "target" => {
            let t = as_target(ident);
            let bad = !valid_table(&t);
            doc.set("target", toml_str(&t));
            bad
        }
        "key" | "metadata" => {
            doc.set(field, format!("[{}]", toml_str(ident)));
            !is_plain(ident)
        }
        "name" => {
            doc.set("name", toml_str(ident));
            ident.is_empty() || !ident.chars().all(|c| c.is_ascii_alphanumeric() || "_-.".contains(c))
        }
        _ => {
            doc.set(field, toml_str(ident));
            !is_plain(ident)
        }
    }
}

fn set_free(doc: &mut Doc, field: &str, free: &str) {
    match field {
        "target" => doc.set("target", toml_str(&as_target(free))),
        "key" | "metadata" => doc.set(field, format!("[{}]", toml_str(free))),
        "source.sql" => doc.set_source("sql", toml_str(free)),
        _ => doc.set(field, toml_str(free)),
    }
}

/// One change to a job file.
fn mutate(doc: &mut Doc, kind: u8, a: usize, b: usize, free: &str) {
    match kind % 9 {
        0 => {
            let (key, values) = WRONG[a % WRONG.len()];
            doc.set(key, values[b % values.len()].to_owned());
        }
        1 => {
            if !doc.top.is_empty() {
                let i = a % doc.top.len();
                doc.top.remove(i);
            }
        }
        2 => {
            let (from, to) = TYPOS[a % TYPOS.len()];
            doc.rename(from, to);
        }
        3 => {
            let (key, values) = SRC_WRONG[a % SRC_WRONG.len()];
            doc.set_source(key, values[b % values.len()].to_owned());
        }
        4 => {
            let sqls = hostile_sqls();
            doc.set_source("sql", toml_str(&sqls[b % sqls.len()]));
        }
        5 => apply_shape(doc, a),
        6 => {
            let ids = idents(free);
            let field = IDENT_FIELDS[a % IDENT_FIELDS.len()];
            set_ident(doc, field, &ids[b % ids.len()]);
        }
        7 => doc.tail.push_str(RAW_APPENDS[a % RAW_APPENDS.len()]),
        _ => set_free(doc, FREE_FIELDS[a % FREE_FIELDS.len()], free),
    }
}

/// What `case.toml` is.
#[derive(Clone, Debug)]
enum JobFile {
    Text(String),
    Bytes(Vec<u8>),
    Missing,
    Directory,
}

fn utf16le(s: &str) -> Vec<u8> {
    let mut v = vec![0xFF, 0xFE];
    v.extend(s.encode_utf16().flat_map(|u| u.to_le_bytes()));
    v
}

fn garbage_bytes() -> Vec<u8> {
    let mut v: Vec<u8> = (0..=255u8).rev().collect();
    v.extend_from_slice(b"\xff\xfe\x00name = \"x\"\n\x00");
    v
}

fn write_job(work: &Path, job: &JobFile) {
    let p = work.join("case.toml");
    let _ = std::fs::remove_file(&p);
    let _ = std::fs::remove_dir_all(&p);
    match job {
        JobFile::Text(t) => std::fs::write(&p, t).expect("write case.toml"),
        JobFile::Bytes(b) => std::fs::write(&p, b).expect("write case.toml"),
        JobFile::Missing => {}
        JobFile::Directory => std::fs::create_dir(&p).expect("make case.toml a folder"),
    }
}

fn clip(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_owned();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}… ({} bytes in all)", &s[..end], s.len())
}

fn describe_job(job: &JobFile) -> String {
    match job {
        JobFile::Text(t) if t.is_empty() => "(an empty file)".to_owned(),
        JobFile::Text(t) => clip(t, 3000),
        JobFile::Bytes(b) => format!("({} bytes, not UTF-8; first ones: {:?})", b.len(), &b[..b.len().min(48)]),
        JobFile::Missing => "(no such file)".to_owned(),
        JobFile::Directory => "(a folder)".to_owned(),
    }
}

// ---------------------------------------------------------------------------
// Running the binary and reading the database.
// ---------------------------------------------------------------------------

struct Outcome {
    code: Option<i32>,
    stdout: String,
    stderr: String,
    timed_out: bool,
    elapsed: Duration,
}

fn invoke(work: &Path, out_dir: &Path, args: &[OsString]) -> Outcome {
    let out_path = out_dir.join("stdout");
    let err_path = out_dir.join("stderr");
    let stdout = File::create(&out_path).expect("create the stdout file");
    let stderr = File::create(&err_path).expect("create the stderr file");
    let started = Instant::now();
    let mut child = Command::new(env!("CARGO_BIN_EXE_fixpoint"))
        .args(args)
        .current_dir(work)
        .env_remove("FIXPOINT_DB")
        .env_remove("FIXPOINT_FAIL_AT")
        .env_remove("FIXPOINT_FAIL_MODE")
        .env_remove("FIXPOINT_TEST_MODE")
        .env_remove("FIXPOINT_TRACE")
        .stdin(Stdio::null())
        .stdout(Stdio::from(stdout))
        .stderr(Stdio::from(stderr))
        .spawn()
        .expect("start the fixpoint binary");
    let mut timed_out = false;
    let status = loop {
        match child.try_wait().expect("wait for fixpoint") {
            Some(status) => break status,
            None if started.elapsed() > TIMEOUT => {
                timed_out = true;
                let _ = child.kill();
                break child.wait().expect("wait for fixpoint");
            }
            None => std::thread::sleep(Duration::from_millis(5)),
        }
    };
    let elapsed = started.elapsed();
    let read = |p: &Path| String::from_utf8_lossy(&std::fs::read(p).unwrap_or_default()).into_owned();
    Outcome { code: status.code(), stdout: read(&out_path), stderr: read(&err_path), timed_out, elapsed }
}

fn os(args: &[&str]) -> Vec<OsString> {
    args.iter().map(|s| OsString::from(*s)).collect()
}

fn show_args(args: &[OsString]) -> String {
    args.iter().map(|a| clip(&format!("{a:?}"), 200)).collect::<Vec<_>>().join(" ")
}

/// (schema, kind, name) → DDL and rows.
type State = BTreeMap<(String, String, String), String>;

fn quote(ident: &str) -> String {
    format!("\"{}\"", ident.replace('"', "\"\""))
}

/// Every schema, view and table of the database file, each table with its
/// DDL and all its rows as sorted text.
fn snapshot(db: &Path) -> Result<State, String> {
    let err = |what: &str, e: duckdb::Error| format!("{what}: {e}");
    let conn = duckdb::Connection::open(db).map_err(|e| err("opening the database", e))?;
    let mut objects: Vec<(&str, String, String, String)> = Vec::new();
    for (kind, query) in [
        ("table", "SELECT schema_name, table_name, coalesce(sql, '') FROM duckdb_tables() WHERE NOT internal AND NOT temporary AND database_name = current_database()"),
        ("view", "SELECT schema_name, view_name, coalesce(sql, '') FROM duckdb_views() WHERE NOT internal AND NOT temporary AND database_name = current_database()"),
        ("schema", "SELECT schema_name, '', '' FROM duckdb_schemas() WHERE NOT internal AND database_name = current_database()"),
    ] {
        let mut stmt = conn.prepare(query).map_err(|e| err(query, e))?;
        let rows = stmt
            .query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?, r.get::<_, String>(2)?)))
            .map_err(|e| err(query, e))?;
        for row in rows {
            let (schema, name, sql) = row.map_err(|e| err(query, e))?;
            objects.push((kind, schema, name, sql));
        }
    }
    let mut state = State::new();
    for (kind, schema, name, sql) in objects {
        let content = if kind == "table" {
            let query = format!("SELECT CAST(fixpoint_snapshot_row AS VARCHAR) FROM {}.{} AS fixpoint_snapshot_row", quote(&schema), quote(&name));
            let mut stmt = conn.prepare(&query).map_err(|e| err(query.as_str(), e))?;
            let mapped = stmt.query_map([], |r| r.get::<_, Option<String>>(0)).map_err(|e| err(query.as_str(), e))?;
            let mut rows = Vec::new();
            for row in mapped {
                rows.push(row.map_err(|e| err(query.as_str(), e))?.unwrap_or_else(|| "NULL".to_owned()));
            }
            rows.sort();
            format!("{sql}\n{}", rows.join("\n"))
        } else {
            sql
        };
        state.insert((schema, kind.to_owned(), name), content);
    }
    Ok(state)
}

fn is_writable(schema: &str) -> bool {
    WRITABLE.iter().any(|w| schema.eq_ignore_ascii_case(w))
}

/// The objects that differ, among those whose schema `checked` accepts.
fn changed_objects(before: &State, after: &State, checked: impl Fn(&str) -> bool) -> Vec<String> {
    let keys: BTreeSet<&(String, String, String)> = before.keys().chain(after.keys()).collect();
    keys.into_iter()
        .filter(|k| checked(k.0.as_str()) && before.get(*k) != after.get(*k))
        .map(|k| format!("{} {}.{}", k.1, k.0, k.2))
        .collect()
}

fn state_diff(before: &State, after: &State) -> String {
    let mut out = Vec::new();
    let keys: BTreeSet<&(String, String, String)> = before.keys().chain(after.keys()).collect();
    for key in keys {
        let name = format!("{} {}.{}", key.1, key.0, key.2);
        match (before.get(key), after.get(key)) {
            (Some(b), Some(a)) if a == b => {}
            (Some(_), None) => out.push(format!("- {name} (gone)")),
            (None, Some(_)) => out.push(format!("+ {name} (new)")),
            (Some(b), Some(a)) => {
                out.push(format!("~ {name}"));
                let bl: Vec<&str> = b.lines().collect();
                let al: Vec<&str> = a.lines().collect();
                let mut shown = 0;
                for l in bl.iter().filter(|l| !al.contains(*l)) {
                    if shown < 20 {
                        out.push(format!("    - {}", clip(l, 300)));
                    }
                    shown += 1;
                }
                for l in al.iter().filter(|l| !bl.contains(*l)) {
                    if shown < 40 {
                        out.push(format!("    + {}", clip(l, 300)));
                    }
                    shown += 1;
                }
                if shown == 0 {
                    out.push("    (the same rows, in other numbers)".to_owned());
                }
            }
            (None, None) => {}
        }
    }
    if out.is_empty() {
        "(no change)".to_owned()
    } else {
        out.join("\n")
    }
}

/// The largest count a report gives for `json_field` (in any JSON document on
/// stdout) or before `text_marker` (in a text line, e.g. "…: 2 committed,").
fn reported_count(stdout: &str, json_field: &str, text_marker: &str) -> u64 {
    let mut n: u64 = 0;
    for doc in serde_json::Deserializer::from_str(stdout).into_iter::<serde_json::Value>() {
        match doc {
            Ok(v) => n = n.max(v[json_field].as_u64().unwrap_or(0)),
            Err(_) => break,
        }
    }
    for line in stdout.lines() {
        if let Some(i) = line.find(text_marker) {
            if let Some(count) = line[..i].rsplit(' ').next().and_then(|w| w.parse::<u64>().ok()) {
                n = n.max(count);
            }
        }
    }
    n
}

fn has_error_line(stderr: &str) -> bool {
    stderr.lines().any(|l| l.starts_with("error:") || l.starts_with("error["))
}

/// A failure the command reports on stdout by design (no `error:` line).
fn reported_on_stdout(args: &[OsString], out: &Outcome) -> bool {
    if args.is_empty() {
        // clap prints the usage for a bare `fixpoint`.
        return out.stderr.contains("Usage:");
    }
    let cmd = args[0].to_str().unwrap_or("");
    match (cmd, out.code) {
        ("lint", Some(2)) => reported_count(&out.stdout, "errors", " error(s)") > 0 || reported_count(&out.stdout, "warnings", " warning(s)") > 0,
        ("prove", Some(4)) => out.stdout.contains("not idempotent"),
        ("diff", Some(4)) => !out.stdout.trim().is_empty(),
        _ => false,
    }
}

/// A failed command that may have committed part of its work by design.
fn partial_writes_allowed(args: &[OsString], stdout: &str) -> bool {
    match args.first().and_then(|a| a.to_str()).unwrap_or("") {
        // Each run of a proof is a real rewrite (README).
        "prove" => true,
        // Each date is its own transaction: the dates before the failed one stay.
        "backfill" => reported_count(stdout, "committed", " committed,") > 0,
        // `lookback`: each day of the window is its own transaction.
        "run" => reported_count(stdout, "written", " day(s) written") > 0,
        _ => false,
    }
}

fn judge(args: &[OsString], out: &Outcome, before: &State, after: &State, must_fail: bool) -> Vec<String> {
    let mut problems = Vec::new();
    if out.timed_out {
        problems.push(format!("did not finish within {} s (killed)", TIMEOUT.as_secs()));
    }
    match out.code {
        None => problems.push("ended by a signal (a crash), not with an exit code".to_owned()),
        Some(101) => problems.push("exit code 101: fixpoint panicked".to_owned()),
        Some(70) => problems.push("exit code 70: an internal error".to_owned()),
        _ => {}
    }
    let ok = out.code == Some(0);
    if must_fail && ok {
        problems.push("exit code 0, but this input must be refused".to_owned());
    }
    if !ok && !has_error_line(&out.stderr) && !reported_on_stdout(args, out) {
        problems.push("a non-zero exit without an `error:` line on stderr".to_owned());
    }
    let relaxed = ok || partial_writes_allowed(args, &out.stdout);
    let changed = changed_objects(before, after, |schema| !(relaxed && is_writable(schema)));
    if !changed.is_empty() {
        let what = if relaxed { "objects outside the schemas silver and fixpoint changed" } else { "the database changed although the command failed" };
        problems.push(format!("{what}: {}", changed.join(", ")));
    }
    problems
}

// ---------------------------------------------------------------------------
// The environment: one database per test, checked after every command.
// ---------------------------------------------------------------------------

struct Env {
    _tmp: tempfile::TempDir,
    /// The binary's working folder: w.duckdb, case.toml, the fixture files.
    work: PathBuf,
    /// Where stdout and stderr are captured (outside `work`).
    out_dir: PathBuf,
    /// The database as after the last command.
    state: RefCell<State>,
    /// Files no command may change.
    fixtures: Vec<(PathBuf, Vec<u8>)>,
    /// "command → exit code" counts, printed at the end.
    stats: RefCell<BTreeMap<String, u32>>,
}

fn setup() -> Env {
    let tmp = tempfile::tempdir().expect("a temporary folder");
    let work = tmp.path().join("work");
    let out_dir = tmp.path().join("out");
    std::fs::create_dir(&work).unwrap();
    std::fs::create_dir(&out_dir).unwrap();
    {
        let db = duckdb::Connection::open(work.join("w.duckdb")).expect("create the database");
        db.execute_batch(SETUP).expect("fill bronze");
    }
    std::fs::write(work.join("notes.txt"), "These are notes, not a database.\n".repeat(3)).unwrap();
    std::fs::write(work.join("garbage.duckdb"), "this is not a database\n".repeat(400)).unwrap();
    std::fs::create_dir(work.join("folder")).unwrap();
    // Existing data to protect: silver loaded once by each kind of job.
    for (file, text, date) in [("good.toml", Doc::base(false).render(), "2026-10-20"), ("good_merge.toml", Doc::base(true).render(), "2026-10-19")] {
        std::fs::write(work.join(file), &text).unwrap();
        let out = invoke(&work, &out_dir, &os(&["run", file, "--date", date, "--db", DB]));
        assert_eq!(out.code, Some(0), "setup: fixpoint run {file} --date {date}:\n{}\n{}", out.stdout, out.stderr);
    }
    let state = snapshot(&work.join("w.duckdb")).expect("read the database after setup");
    let loaded = |table: &str, needle: &str| {
        state.get(&("silver".to_owned(), "table".to_owned(), table.to_owned())).is_some_and(|rows| rows.contains(needle))
    };
    assert!(loaded("orders", "5.50") && loaded("orders_m", "3.50"), "setup: silver is loaded: {state:#?}");
    assert!(state.keys().any(|k| k.0 == "fixpoint" && k.2 == "runs"), "setup: the ledger exists: {state:#?}");
    let fixtures: Vec<(PathBuf, Vec<u8>)> = ["notes.txt", "garbage.duckdb"].iter().map(|f| (work.join(f), std::fs::read(work.join(f)).unwrap())).collect();
    Env { _tmp: tmp, work, out_dir, state: RefCell::new(state), fixtures, stats: RefCell::new(BTreeMap::new()) }
}

/// Runs one command (the job file already written) and checks every
/// invariant; returns a readable report of what broke.
fn check(env: &Env, label: &str, job: &JobFile, args: &[OsString], must_fail: bool) -> Result<(), String> {
    let case_path = env.work.join("case.toml");
    let job_before = if case_path.is_file() { std::fs::read(&case_path).ok() } else { None };
    let out = invoke(&env.work, &env.out_dir, args);
    let before = env.state.borrow().clone();
    let (after, unreadable) = match snapshot(&env.work.join("w.duckdb")) {
        Ok(s) => (s, None),
        Err(e) => (before.clone(), Some(e)),
    };
    let mut problems = judge(args, &out, &before, &after, must_fail);
    if let Some(e) = unreadable {
        problems.push(format!("the database cannot be read after the command: {e}"));
    }
    for (path, bytes) in &env.fixtures {
        if std::fs::read(path).ok().as_deref() != Some(bytes.as_slice()) {
            problems.push(format!("{} changed", path.display()));
        }
    }
    if let Some(b) = job_before {
        if std::fs::read(&case_path).ok() != Some(b) {
            problems.push("the job file case.toml changed".to_owned());
        }
    }
    let cmd = args.first().map(|a| a.to_string_lossy().into_owned()).unwrap_or_else(|| "(no arguments)".to_owned());
    let code = out.code.map_or_else(|| "signal".to_owned(), |c| c.to_string());
    *env.stats.borrow_mut().entry(format!("{} → exit {code}", clip(&cmd, 20))).or_insert(0) += 1;
    let diff = state_diff(&before, &after);
    *env.state.borrow_mut() = after;
    if problems.is_empty() {
        return Ok(());
    }
    Err(format!(
        "=== {label}\nproblems:\n  - {}\ncommand: fixpoint {}\nexit code: {code} after {:.2} s\njob file case.toml:\n{}\nstderr:\n{}\nstdout:\n{}\ndatabase, before → after:\n{}",
        problems.join("\n  - "),
        show_args(args),
        out.elapsed.as_secs_f64(),
        indent(&describe_job(job)),
        indent(&clip(&out.stderr, 4000)),
        indent(&clip(&out.stdout, 2000)),
        indent(&diff),
    ))
}

fn indent(s: &str) -> String {
    if s.trim().is_empty() {
        "    (empty)".to_owned()
    } else {
        s.lines().map(|l| format!("    | {l}")).collect::<Vec<_>>().join("\n")
    }
}

fn print_stats(env: &Env, what: &str, started: Instant) {
    let stats = env.stats.borrow();
    let total: u32 = stats.values().sum();
    let lines: Vec<String> = stats.iter().map(|(k, n)| format!("  {n:>5}  {k}")).collect();
    eprintln!("{what}: {total} commands in {:.1} s\n{}", started.elapsed().as_secs_f64(), lines.join("\n"));
}

// ---------------------------------------------------------------------------
// The fixed list.
// ---------------------------------------------------------------------------

struct Fixed {
    name: String,
    job: JobFile,
    args: Vec<OsString>,
    must_fail: bool,
}

fn fixed(name: String, job: JobFile, args: Vec<OsString>, must_fail: bool) -> Fixed {
    Fixed { name, job, args, must_fail }
}

fn fixed_cases() -> Vec<Fixed> {
    let mut v = Vec::new();
    let run = os(&["run", "case.toml", "--date", "2026-10-20", "--db", DB]);
    let prove = os(&["prove", "case.toml", "--date", "2026-10-20", "--db", DB]);
    let backfill = os(&["backfill", "case.toml", "--from", "2026-10-19", "--to", "2026-10-21", "--db", DB]);
    let status = os(&["status", "case.toml", "--from", "2026-10-18", "--to", "2026-10-22", "--db", DB]);
    let lint = os(&["lint", "case.toml", "--db", DB]);
    let text = |doc: &Doc| JobFile::Text(doc.render());

    // Wrong types and values for every known key.
    for &(key, values) in WRONG {
        for &value in values {
            let mut doc = Doc::base(matches!(key, "key" | "version" | "deleted" | "on_tie"));
            doc.set(key, value.to_owned());
            v.push(fixed(format!("{key} = {value}"), text(&doc), run.clone(), false));
        }
    }
    // Misspelled keys (deny_unknown_fields: every one refused).
    for &(from, to) in TYPOS {
        let mut doc = Doc::base(false);
        doc.rename(from, to);
        v.push(fixed(format!("typo {from} → {to}"), text(&doc), run.clone(), true));
    }
    // Wrong [source] keys and shapes.
    for &(key, values) in SRC_WRONG {
        for &value in values {
            let mut doc = Doc::base(false);
            doc.set_source(key, value.to_owned());
            v.push(fixed(format!("source.{key} = {value}"), text(&doc), run.clone(), false));
        }
    }
    for n in 0..10 {
        let mut doc = Doc::base(false);
        apply_shape(&mut doc, n);
        v.push(fixed(format!("source shape {n}"), text(&doc), run.clone(), false));
    }
    // DDL and DML as the source: refused by every command that reads the job.
    for &sql in DDL_SQL {
        for (what, merge, args) in [("run", false, &run), ("run (merge job)", true, &run), ("prove", false, &prove), ("backfill", false, &backfill), ("lint", false, &lint)] {
            let mut doc = Doc::base(merge);
            doc.set_source("sql", toml_str(sql));
            v.push(fixed(format!("{what}: source {sql:?}"), text(&doc), args.clone(), true));
        }
    }
    // Other hostile or broken sources.
    let others: Vec<String> = OTHER_SQL.iter().map(|s| s.to_string()).chain(long_sqls()).collect();
    for sql in &others {
        let mut doc = Doc::base(false);
        doc.set_source("sql", toml_str(sql));
        v.push(fixed(format!("run: source {}", clip(&format!("{sql:?}"), 120)), text(&doc), run.clone(), false));
    }
    for &sql in PROVE_SQL {
        let mut doc = Doc::base(false);
        doc.set_source("sql", toml_str(sql));
        v.push(fixed(format!("run: source {sql:?}"), text(&doc), run.clone(), false));
        v.push(fixed(format!("prove: source {sql:?}"), text(&doc), prove.clone(), false));
    }
    // Hostile identifiers (metadata and name too in the generated cases).
    for ident in idents("") {
        for field in ["target", "partition", "key", "version"] {
            let mut doc = Doc::base(matches!(field, "key" | "version"));
            let must_fail = set_ident(&mut doc, field, &ident);
            v.push(fixed(format!("{field} = {}", clip(&format!("{ident:?}"), 60)), text(&doc), run.clone(), must_fail));
        }
    }
    // Odd job files, for every command that reads one.
    let base = Doc::base(false).render();
    let files = vec![
        ("no job file", JobFile::Missing, true),
        ("an empty job file", JobFile::Text(String::new()), true),
        ("binary garbage", JobFile::Bytes(garbage_bytes()), true),
        ("control characters", JobFile::Text("\u{1}\u{7f}\u{1b}[31m = 1\n".to_owned()), true),
        ("a folder", JobFile::Directory, true),
        ("only comments", JobFile::Text("# nothing here\n\n# nor here\n".to_owned()), true),
        ("UTF-16", JobFile::Bytes(utf16le(&base)), true),
        ("NUL in a TOML string", JobFile::Bytes(b"name = \"x\0\"\n".to_vec()), true),
        ("only [source]", JobFile::Text(format!("[source]\nsql = {}\n", toml_str(BASE_SQL))), true),
        ("a byte-order mark", JobFile::Text(format!("\u{feff}{base}")), false),
        ("CRLF line ends", JobFile::Text(base.replace('\n', "\r\n")), false),
    ];
    for (what, job, must_fail) in files {
        for (cmd, args) in [("run", &run), ("backfill", &backfill), ("prove", &prove), ("status", &status), ("lint", &lint)] {
            v.push(fixed(format!("{cmd}: {what}"), job.clone(), args.clone(), must_fail));
        }
    }
    // Arguments, with the valid job.
    let good = JobFile::Text(base.clone());
    for &d in DATES_BAD {
        v.push(fixed(format!("run --date {d:?}"), good.clone(), os(&["run", "case.toml", "--date", d, "--db", DB]), true));
        v.push(fixed(format!("prove --date {d:?}"), good.clone(), os(&["prove", "case.toml", "--date", d, "--db", DB]), true));
        v.push(fixed(format!("backfill --from {d:?}"), good.clone(), os(&["backfill", "case.toml", "--from", d, "--to", "2026-10-20", "--db", DB]), true));
        v.push(fixed(format!("status --to {d:?}"), good.clone(), os(&["status", "case.toml", "--from", "2026-10-18", "--to", d, "--db", DB]), true));
    }
    for &d in DATES_EDGE {
        v.push(fixed(format!("run --date {d}"), good.clone(), os(&["run", "case.toml", "--date", d, "--db", DB]), false));
    }
    let special: Vec<(&str, Vec<&str>, bool)> = vec![
        ("run without --date", vec!["run", "case.toml", "--db", DB], true),
        ("backfill --from after --to", vec!["backfill", "case.toml", "--from", "2026-10-21", "--to", "2026-10-19", "--db", DB], true),
        ("status --from after --to", vec!["status", "case.toml", "--from", "2026-10-21", "--to", "2026-10-19", "--db", DB], true),
        ("backfill --parallel 0", vec!["backfill", "case.toml", "--from", "2026-10-19", "--to", "2026-10-20", "--parallel", "0", "--db", DB], true),
        ("backfill --parallel -1", vec!["backfill", "case.toml", "--from", "2026-10-19", "--to", "2026-10-20", "--parallel", "-1", "--db", DB], true),
        ("backfill --parallel x", vec!["backfill", "case.toml", "--from", "2026-10-19", "--to", "2026-10-20", "--parallel", "x", "--db", DB], true),
        ("backfill --parallel 2", vec!["backfill", "case.toml", "--from", "2026-10-19", "--to", "2026-10-20", "--parallel", "2", "--db", DB], false),
        ("an unknown flag", vec!["run", "case.toml", "--date", "2026-10-20", "--frobnicate", "--db", DB], true),
        ("a misspelled flag", vec!["run", "case.toml", "--dat", "2026-10-20", "--db", DB], true),
        ("--date twice", vec!["run", "case.toml", "--date", "2026-10-20", "--date", "2026-10-21", "--db", DB], true),
        ("--output xml", vec!["run", "case.toml", "--date", "2026-10-20", "--output", "xml", "--db", DB], true),
        ("--wait -1", vec!["run", "case.toml", "--date", "2026-10-20", "--wait", "-1", "--db", DB], true),
        ("prove --runs 1", vec!["prove", "case.toml", "--date", "2026-10-20", "--runs", "1", "--db", DB], true),
        ("prove --runs 0", vec!["prove", "case.toml", "--date", "2026-10-20", "--runs", "0", "--db", DB], true),
        ("prove --mutate-key without =", vec!["prove", "case.toml", "--date", "2026-10-20", "--mutate-key", "nope", "--db", DB], true),
        ("prove --mutate-key hostile", vec!["prove", "case.toml", "--date", "2026-10-20", "--mutate-key", "x\"; DROP TABLE bronze.orders; --=1", "--db", DB], false),
        ("prove --mutate-key with --no-mutate", vec!["prove", "case.toml", "--date", "2026-10-20", "--mutate-key", "order_id=1", "--no-mutate", "--db", DB], true),
        ("lint --dialect oracle", vec!["lint", "case.toml", "--dialect", "oracle"], true),
        ("lint of no file", vec!["lint"], true),
        ("an unknown command", vec!["runn", "case.toml"], true),
        ("status --db notes.txt", vec!["status", "case.toml", "--from", "2026-10-18", "--to", "2026-10-20", "--db", "duckdb:notes.txt"], true),
        ("lint --db notes.txt", vec!["lint", "case.toml", "--db", "duckdb:notes.txt"], true),
        ("prove --db garbage.duckdb", vec!["prove", "case.toml", "--date", "2026-10-20", "--db", "duckdb:garbage.duckdb"], true),
        ("backfill --db folder", vec!["backfill", "case.toml", "--from", "2026-10-19", "--to", "2026-10-20", "--db", "duckdb:folder"], true),
    ];
    for (what, args, must_fail) in special {
        v.push(fixed(what.to_owned(), good.clone(), os(&args), must_fail));
    }
    for &(url, must_fail) in BAD_DBS {
        v.push(fixed(format!("run --db {url:?}"), good.clone(), os(&["run", "case.toml", "--date", "2026-10-20", "--db", url]), must_fail));
    }
    #[cfg(unix)]
    {
        use std::os::unix::ffi::OsStringExt;
        let not_utf8 = || OsString::from_vec(vec![b'2', 0xff, 0xfe, b'-']);
        let mut args = os(&["run", "case.toml", "--date"]);
        args.push(not_utf8());
        args.extend(os(&["--db", DB]));
        v.push(fixed("a --date that is not UTF-8".to_owned(), good.clone(), args, true));
        let mut args = os(&["run"]);
        args.push(not_utf8());
        args.extend(os(&["--date", "2026-10-20", "--db", DB]));
        v.push(fixed("a job path that is not UTF-8".to_owned(), good.clone(), args, true));
    }
    for &raw in RAW_CMDS {
        v.push(fixed(format!("fixpoint {}", raw.join(" ")), good.clone(), os(raw), false));
    }
    v
}

#[test]
fn listed_hostile_inputs_change_nothing() {
    let started = Instant::now();
    let env = setup();
    let cases = fixed_cases();
    let mut failures = Vec::new();
    for c in &cases {
        write_job(&env.work, &c.job);
        if let Err(report) = check(&env, &c.name, &c.job, &c.args, c.must_fail) {
            failures.push(report);
        }
    }
    print_stats(&env, &format!("listed hostile inputs ({} cases)", cases.len()), started);
    assert!(
        failures.is_empty(),
        "{} of {} listed hostile inputs broke an invariant:\n\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n\n")
    );
}

// ---------------------------------------------------------------------------
// The generated cases.
// ---------------------------------------------------------------------------

/// One generated command: indexes into the pools above, and a free string.
#[derive(Clone, Debug)]
struct CmdRecipe {
    kind: u8,
    job: u8,
    date: u16,
    date2: u16,
    db: u8,
    flags: Vec<u8>,
    free: String,
}

/// One generated case: a job file (a valid base job, changed 0-2 times, or an
/// odd file) and 1-3 commands.
#[derive(Clone, Debug)]
struct Recipe {
    file: u8,
    merge: bool,
    mutations: Vec<(u8, u16, u16)>,
    free: String,
    garbage: Vec<u8>,
    commands: Vec<CmdRecipe>,
}

fn free_text() -> impl Strategy<Value = String> {
    proptest::string::string_regex("[ -~]{0,16}|\\PC{0,16}").expect("a valid regex")
}

fn cmd_recipe() -> impl Strategy<Value = CmdRecipe> {
    (any::<u8>(), any::<u8>(), any::<u16>(), any::<u16>(), any::<u8>(), prop::collection::vec(any::<u8>(), 0..3), free_text())
        .prop_map(|(kind, job, date, date2, db, flags, free)| CmdRecipe { kind, job, date, date2, db, flags, free })
}

fn recipe() -> impl Strategy<Value = Recipe> {
    (
        any::<u8>(),
        any::<bool>(),
        prop::collection::vec((any::<u8>(), any::<u16>(), any::<u16>()), 0..3),
        free_text(),
        prop::collection::vec(any::<u8>(), 0..256),
        prop::collection::vec(cmd_recipe(), 1..4),
    )
        .prop_map(|(file, merge, mutations, free, garbage, commands)| Recipe { file, merge, mutations, free, garbage, commands })
}

fn pick<T: Clone>(pool: &[T], n: usize) -> T {
    pool[n % pool.len()].clone()
}

/// Dates for an option; `None` leaves the option out. `edge` adds valid
/// dates far from the data (only for commands of one date).
fn date_pool(edge: bool, free: &str) -> Vec<Option<String>> {
    let mut v = Vec::new();
    for _ in 0..3 {
        v.extend(DATES_OK.iter().map(|d| Some(d.to_string())));
    }
    if edge {
        v.extend(DATES_EDGE.iter().map(|d| Some(d.to_string())));
    }
    v.extend(DATES_BAD.iter().map(|d| Some(d.to_string())));
    v.push(Some(free.to_owned()));
    v.push(None);
    v
}

fn db_pool(free: &str) -> Vec<Option<String>> {
    let mut v = vec![Some(DB.to_owned()); 12];
    v.push(Some("duckdb:./w.duckdb".to_owned()));
    v.push(None);
    v.extend(BAD_DBS.iter().map(|(url, _)| Some(url.to_string())));
    // Free text never names a path outside the test's folder.
    let free = free.replace('/', "_");
    v.push(Some(free.clone()));
    v.push(Some(format!("duckdb:{free}")));
    v
}

fn job_pool(free: &str) -> Vec<String> {
    let mut v = vec!["case.toml".to_owned(); 10];
    v.extend(["nope.toml", "", ".", "/dev/null", "case.toml/", "w.duckdb", "notes.txt", "folder"].iter().map(|s| s.to_string()));
    v.push(free.replace('/', "_"));
    v
}

fn build_args(c: &CmdRecipe) -> Vec<OsString> {
    let job = pick(&job_pool(&c.free), c.job as usize);
    let db = pick(&db_pool(&c.free), c.db as usize);
    let one_date = pick(&date_pool(true, &c.free), c.date as usize);
    // Ranges only from the small pool (and bad values), never left to the
    // ledger's first and last dates, which may be 0001-01-01 and 9999-12-31.
    let range: Vec<String> = date_pool(false, &c.free).into_iter().flatten().collect();
    let (from, to) = (pick(&range, c.date as usize), pick(&range, c.date2 as usize));
    let mut a: Vec<String> = Vec::new();
    let mut with_db = true;
    match c.kind % 14 {
        0..=3 => {
            a.extend(["run".to_owned(), job]);
            if let Some(d) = one_date {
                a.extend(["--date".to_owned(), d]);
            }
        }
        4 | 5 => a.extend(["backfill".to_owned(), job, "--from".to_owned(), from, "--to".to_owned(), to]),
        6 | 7 => {
            a.extend(["prove".to_owned(), job]);
            if let Some(d) = one_date {
                a.extend(["--date".to_owned(), d]);
            }
        }
        8 | 9 => a.extend(["status".to_owned(), job, "--from".to_owned(), from, "--to".to_owned(), to]),
        10 => {
            a.extend(["lint".to_owned(), job]);
            with_db = false;
        }
        11 => a.extend(["lint".to_owned(), job]),
        12 => {
            let name = pick(&["silver_orders".to_owned(), "orders_merge".to_owned(), c.free.clone()], c.date2 as usize);
            let limit = pick(&["20", "0", "-1", "x", "18446744073709551616"], c.date as usize);
            a.extend(["runs".to_owned(), "--job".to_owned(), name, "--limit".to_owned(), limit.to_owned()]);
        }
        _ => {
            a.extend(pick(RAW_CMDS, c.job as usize).iter().map(|s| s.to_string()));
            with_db = false;
        }
    }
    if with_db {
        if let Some(d) = db {
            a.extend(["--db".to_owned(), d]);
        }
    }
    for &f in &c.flags {
        a.extend(pick(FLAGS, f as usize).iter().map(|s| s.to_string()));
    }
    a.into_iter().map(OsString::from).collect()
}

fn build(r: &Recipe) -> (JobFile, Vec<Vec<OsString>>) {
    let mut doc = Doc::base(r.merge);
    for &(kind, a, b) in &r.mutations {
        mutate(&mut doc, kind, a as usize, b as usize, &r.free);
    }
    let text = doc.render();
    let job = match r.file % 32 {
        0..=23 => JobFile::Text(text),
        24 => JobFile::Missing,
        25 => JobFile::Text(String::new()),
        26 => JobFile::Bytes(r.garbage.clone()),
        27 => JobFile::Directory,
        28 => JobFile::Text(format!("\u{feff}{text}")),
        29 => JobFile::Bytes(utf16le(&text)),
        30 => JobFile::Text("# only a comment\n\n# and another\n".to_owned()),
        _ => JobFile::Text(text.replace('\n', "\r\n")),
    };
    (job, r.commands.iter().map(build_args).collect())
}

#[test]
fn random_bad_inputs_change_nothing() {
    let started = Instant::now();
    let env = setup();
    let cases: u32 = std::env::var("FIXPOINT_BAD_INPUT_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(48);
    let seed: u64 = std::env::var("FIXPOINT_BAD_INPUT_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(1));
    eprintln!("random bad input: {cases} cases, seed {seed} (FIXPOINT_BAD_INPUT_SEED={seed} repeats them)");
    let config = ProptestConfig {
        cases,
        max_shrink_iters: 64,
        max_shrink_time: 120_000,
        failure_persistence: None,
        rng_seed: RngSeed::Fixed(seed),
        ..ProptestConfig::default()
    };
    let mut runner = TestRunner::new(config);
    let result = runner.run(&recipe(), |r| {
        let (job, commands) = build(&r);
        write_job(&env.work, &job);
        for args in &commands {
            check(&env, "generated case", &job, args, false).map_err(|report| TestCaseError::fail(report))?;
        }
        Ok(())
    });
    print_stats(&env, &format!("random bad input ({cases} cases, seed {seed})"), started);
    match result {
        Ok(()) => {}
        Err(TestError::Fail(reason, case)) => {
            panic!("a generated bad input broke an invariant (the smallest case found; seed {seed}):\n\n{reason}\n\nrecipe: {case:?}")
        }
        Err(TestError::Abort(reason)) => panic!("proptest gave up: {reason} (seed {seed})"),
    }
}
