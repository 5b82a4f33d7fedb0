//! The bad-input catalogue (docs/reliability.md): every way a job file, its data,
//! the arguments or the database can be wrong. Each case must give a clear
//! error naming the problem (checked by a fragment of the message), the
//! documented exit code, nothing on stdout in text mode, the same error as
//! JSON with `--output json`, and leave the database exactly as it was
//! (read back by the database's own client, not by fixpoint).
//!
//! The catalogue runs on every engine: DuckDB (a file), PostgreSQL (a
//! database of its own) and, with the feature `spark`, Spark. A case that
//! names the catalogue's database runs on each, with the engine's URL; the
//! others (a job file that does not parse, a URL of no known engine) fail
//! before any database is chosen and run once. Where an engine words an
//! error its own way, the case carries that engine's fragment.

use std::path::Path;
use std::process::Command;

const REPLACE: &str = r#"name = "silver_orders"
target = "silver.orders"
strategy = "replace_partition"
partition = "dt"

[source]
sql = "SELECT order_id, order_total, dt FROM bronze.orders WHERE dt = :run_date"
"#;

// Partitioned: on Spark a merge rewrites partitions.
const MERGE: &str = r#"name = "orders_merge"
target = "silver.orders_m"
strategy = "merge"
key = ["order_id"]
version = "updated_at"
partition = "dt"

[source]
sql = "SELECT order_id, order_total, updated_at, dt FROM bronze.orders WHERE dt = :run_date"
"#;

const HISTORY: &str = r#"name = "dim_orders"
target = "silver.dim_orders"
strategy = "history"
key = ["order_id"]
version = "updated_at"
track = ["order_total"]

[source]
sql = "SELECT order_id, order_total, updated_at FROM bronze.orders WHERE dt = :run_date"
"#;

const SETUP: &str = "CREATE SCHEMA bronze;
CREATE TABLE bronze.orders (order_id BIGINT, order_total DECIMAL(12,2), updated_at TIMESTAMP, dt DATE);
INSERT INTO bronze.orders VALUES (1, 1.50, TIMESTAMP '2026-10-19 08:00:00', DATE '2026-10-19'),
  (2, 2.50, TIMESTAMP '2026-10-20 08:00:00', DATE '2026-10-20'), (3, 3.50, TIMESTAMP '2026-10-20 09:00:00', DATE '2026-10-20');
CREATE TABLE bronze.nulls (kind VARCHAR, order_id BIGINT, order_total DECIMAL(12,2), updated_at TIMESTAMP, dt DATE);
INSERT INTO bronze.nulls VALUES ('key', NULL, 1.00, TIMESTAMP '2026-10-20 08:00:00', DATE '2026-10-20'), ('version', 7, 1.00, NULL, DATE '2026-10-20');
CREATE SCHEMA views;
CREATE VIEW views.orders AS SELECT order_id, order_total, dt FROM bronze.orders;";

struct Out {
    code: i32,
    stdout: String,
    stderr: String,
}

fn run(bin: &Path, dir: &Path, args: &[&str], as_nobody: bool) -> Out {
    let mut cmd = if as_nobody {
        let mut c = Command::new("setpriv");
        c.args(["--reuid=65534", "--regid=65534", "--clear-groups"]).arg(bin);
        c
    } else {
        Command::new(bin)
    };
    let o = cmd.args(args).current_dir(dir).env_remove("FIXPOINT_DB").env_remove("FIXPOINT_FAIL_AT").env_remove("FIXPOINT_TEST_MODE").output().expect("runs");
    Out { code: o.status.code().unwrap_or(-1), stdout: String::from_utf8_lossy(&o.stdout).into_owned(), stderr: String::from_utf8_lossy(&o.stderr).into_owned() }
}

/// The engines the catalogue runs on.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Eng {
    DuckDb,
    Postgres,
    #[allow(dead_code)]
    Spark,
}

impl Eng {
    fn label(self) -> &'static str {
        match self {
            Eng::DuckDb => "DuckDB",
            Eng::Postgres => "PostgreSQL",
            Eng::Spark => "Spark",
        }
    }
}

/// Everything a bad input could have changed, in a DuckDB file.
fn duckdb_state(dir: &Path) -> Vec<String> {
    let db = duckdb::Connection::open(dir.join("w.duckdb")).unwrap();
    let mut out = Vec::new();
    for q in [
        "SELECT string_agg(schema_name || '.' || table_name, ',' ORDER BY schema_name, table_name) FROM duckdb_tables()",
        "SELECT string_agg(CAST(s AS VARCHAR), ';' ORDER BY CAST(s AS VARCHAR)) FROM silver.orders AS s",
        "SELECT string_agg(CAST(s AS VARCHAR), ';' ORDER BY CAST(s AS VARCHAR)) FROM silver.orders_m AS s",
        "SELECT string_agg(CAST(s AS VARCHAR), ';' ORDER BY CAST(s AS VARCHAR)) FROM bronze.orders AS s",
        "SELECT CAST(count(*) AS VARCHAR) FROM fixpoint.runs",
        "SELECT string_agg(schema_name || '.' || view_name, ',' ORDER BY schema_name, view_name) FROM duckdb_views() WHERE NOT internal",
    ] {
        out.push(db.query_row(q, [], |r| r.get::<_, Option<String>>(0)).unwrap().unwrap_or_default());
    }
    out
}

#[derive(Clone, Copy, PartialEq)]
enum Special {
    None,
    /// The database file has no permissions (run as `nobody` when root).
    Unreadable,
    /// The database file and its folder are read-only.
    ReadOnly,
    /// Another process holds the file.
    Locked,
    /// Needs the PostgreSQL server.
    Pg,
}

struct Case {
    name: &'static str,
    job: Option<String>,
    args: Vec<String>,
    code: i32,
    needle: String,
    special: Special,
    /// The fragment on an engine that words the error its own way.
    worded: Vec<(Eng, String)>,
    /// Engines the case does not run on.
    not_on: Vec<Eng>,
}

fn case(name: &'static str, job: Option<String>, args: &[&str], code: i32, needle: &str) -> Case {
    Case { name, job, args: args.iter().map(|s| s.to_string()).collect(), code, needle: needle.into(), special: Special::None, worded: Vec::new(), not_on: Vec::new() }
}

impl Case {
    /// On `e` the message holds `needle` instead.
    fn on(mut self, e: Eng, needle: &str) -> Case {
        self.worded.push((e, needle.into()));
        self
    }

    /// Not run on `e` (which refuses the job earlier, with another exit code).
    fn not_on(mut self, e: Eng) -> Case {
        self.not_on.push(e);
        self
    }

    fn needle(&self, e: Eng) -> &str {
        self.worded.iter().find(|(w, _)| *w == e).map_or(&self.needle, |(_, n)| n)
    }
}

const RUN: &[&str] = &["run", "case.toml", "--date", "2026-10-20", "--db", "duckdb:w.duckdb"];
/// A rerun of a loaded day (audits are not part of the run key: without
/// --force the run would find its output in place and skip).
const RUN_FORCED: &[&str] = &["run", "case.toml", "--date", "2026-10-20", "--db", "duckdb:w.duckdb", "--force"];

fn cases() -> Vec<Case> {
    let r = |from: &str, to: &str| Some(REPLACE.replace(from, to));
    let m = |from: &str, to: &str| Some(MERGE.replace(from, to));
    let src = |sql: &str| Some(REPLACE.replace("SELECT order_id, order_total, dt FROM bronze.orders WHERE dt = :run_date", sql));
    let pg = std::env::var("FIXPOINT_TEST_PG").unwrap_or_else(|_| "postgres://root@127.0.0.1:5432/test".into());
    let host = pg.split('@').nth(1).and_then(|h| h.split('/').next()).unwrap_or("127.0.0.1:5432").to_owned();
    let pg_user = format!("postgres://no_such_role:secret@{host}/test");
    let pg_db = format!("postgres://root@{host}/no_such_database");
    let with = |c: Case, s: Special| Case { special: s, ..c };
    let h = |from: &str, to: &str| Some(HISTORY.replace(from, to));
    let hsrc = |sql: &str| h("SELECT order_id, order_total, updated_at FROM bronze.orders WHERE dt = :run_date", sql);
    vec![
        // The job file.
        case("malformed TOML", r("name = \"silver_orders\"", "name = \"silver_orders"), RUN, 2, "case.toml: name: "),
        // The list ends with merge (the line break): nothing unavailable is offered.
        case("unknown strategy", r("\"replace_partition\"", "\"upsert\""), RUN, 2, "strategy: \"upsert\": expected one of \"replace_partition\", \"merge\", \"history\"\n"),
        case("strategy replace_table (not available)", r("\"replace_partition\"", "\"replace_table\""), RUN, 2, "case.toml: strategy: \"replace_table\" is not available"),
        case("unknown key", r("partition = \"dt\"", "partition = \"dt\"\npartiton = \"dt\""), RUN, 2, "unknown field `partiton`"),
        case("missing name", r("name = \"silver_orders\"\n", ""), RUN, 2, "name: missing"),
        case("missing target", r("target = \"silver.orders\"\n", ""), RUN, 2, "target: missing"),
        case("missing source", Some(REPLACE.split("[source]").next().unwrap().to_owned()), RUN, 2, "source: missing"),
        case("missing partition", r("partition = \"dt\"\n", ""), RUN, 2, "partition: missing"),
        case("missing merge key", m("key = [\"order_id\"]\n", ""), RUN, 2, "key: missing"),
        case("missing merge version", m("version = \"updated_at\"\n", ""), RUN, 2, "version: missing"),
        case("wrong value type", r("partition = \"dt\"", "partition = \"dt\"\nmin_rows = \"ten\""), RUN, 2, "min_rows: invalid type"),
        case("negative min_rows", r("partition = \"dt\"", "partition = \"dt\"\nmin_rows = -1"), RUN, 2, "min_rows: -1: expected a whole number"),
        case("unknown on_schema_change", r("partition = \"dt\"", "partition = \"dt\"\non_schema_change = \"sync\""), RUN, 2, "on_schema_change: \"sync\": expected \"fail\" or \"append_new_columns\""),
        case("missing job file", None, &["run", "nope.toml", "--date", "2026-10-20", "--db", "duckdb:w.duckdb"], 2, "nope.toml: (file): cannot read the job file"),
        // Unknown tables and columns.
        case("unknown source table", src("SELECT order_id, order_total, dt FROM bronze.nope WHERE dt = :run_date"), RUN, 2, "source.sql of job silver_orders (duckdb): Catalog Error: Table with name nope does not exist")
            .on(Eng::Postgres, "source.sql of job silver_orders (postgres): undefined table: relation \"bronze.nope\" does not exist")
            .on(Eng::Spark, "source.sql of job silver_orders (spark): [TABLE_OR_VIEW_NOT_FOUND] The table or view `bronze`.`nope` cannot be found"),
        case("unknown source column", src("SELECT order_id, nope, dt FROM bronze.orders WHERE dt = :run_date"), RUN, 2, "Referenced column \"nope\" not found")
            .on(Eng::Postgres, "source.sql of job silver_orders (postgres): undefined column: column \"nope\" does not exist")
            .on(Eng::Spark, "source.sql of job silver_orders (spark): [UNRESOLVED_COLUMN.WITH_SUGGESTION] A column, variable, or function parameter with name `nope` cannot be resolved"),
        case("unknown partition column", r("partition = \"dt\"", "partition = \"day\""), RUN, 2, "has no column \"day\" (the job's partition column)"),
        case("unknown merge key", m("[\"order_id\"]", "[\"nope\"]"), RUN, 2, "has no column \"nope\" (the job's key)"),
        case("unknown merge version", m("version = \"updated_at\"", "version = \"nope\""), RUN, 2, "has no column \"nope\" (the job's version)"),
        // Inputs that used to change data.
        case("a source reading its own target", r("FROM bronze.orders", "FROM silver.orders"), RUN, 2, "source.sql: the source reads the job's own target silver.orders"),
        case("a target in fixpoint's own schema", r("target = \"silver.orders\"", "target = \"fixpoint.runs\""), RUN, 2, "target: fixpoint.runs is in the schema fixpoint, which is reserved"),
        case(
            "a merge key append_new_columns would add",
            Some(MERGE.replace("key = [\"order_id\"]", "key = [\"order_ref\"]\non_schema_change = \"append_new_columns\"").replace("SELECT order_id,", "SELECT order_id AS order_ref, order_id,")),
            RUN,
            2,
            "has no column order_ref (BIGINT), the job's merge key: it cannot be appended",
        )
        .on(Eng::Postgres, "has no column order_ref (bigint), the job's merge key: it cannot be appended")
        .on(Eng::Spark, "has no column order_ref (bigint), the job's merge key: it cannot be appended"),
        case(
            "a merge version of type VARCHAR",
            Some(MERGE.replace("silver.orders_m", "silver.orders_v").replace("order_total, updated_at,", "order_total, CAST(updated_at AS VARCHAR) AS updated_at,")),
            RUN,
            2,
            "the version column updated_at of job orders_merge is VARCHAR",
        )
        .on(Eng::Postgres, "the version column updated_at of job orders_merge is character varying")
        .on(Eng::Spark, "the version column updated_at of job orders_merge is string"),
        case("prove with a --mutate-key column the source lacks", Some(REPLACE.into()), &["prove", "case.toml", "--date", "2026-10-20", "--db", "duckdb:w.duckdb", "--mutate-key", "nope=1"], 2, "--mutate-key nope"),
        // Plain mistakes the database finds: the job file's key, exit 2,
        // not "a retry may work" with fixpoint's SQL.
        case("a view as the target", r("target = \"silver.orders\"", "target = \"views.orders\""), RUN, 2, "case.toml: target: views.orders is a view on duckdb, not a table")
            .on(Eng::Postgres, "case.toml: target: views.orders is a view on postgres, not a table")
            .on(Eng::Spark, "case.toml: target: views.orders is a view on spark, not a table"),
        case(
            "a partition column that is not a date",
            src("SELECT order_id, order_total, 20261020 AS dt FROM bronze.orders WHERE dt = :run_date"),
            RUN,
            2,
            "case.toml: partition: the partition column dt is INTEGER in the source query",
        )
        .on(Eng::Postgres, "case.toml: partition: the partition column dt is integer in the source query")
        .on(Eng::Spark, "case.toml: partition: the partition column dt is int in the source query"),
        case(
            "a merge's deleted condition naming a missing column",
            m("version = \"updated_at\"", "version = \"updated_at\"\ndeleted = \"op = 'D'\""),
            RUN,
            2,
            "case.toml: deleted: the condition `deleted` on the source's rows does not run on duckdb: Binder Error",
        )
        .on(Eng::Postgres, "case.toml: deleted: the condition `deleted` on the source's rows does not run on postgres: undefined column: column \"op\" does not exist")
        .on(Eng::Spark, "case.toml: deleted: the condition `deleted` on the source's rows does not run on spark: [UNRESOLVED_COLUMN.WITH_SUGGESTION] A column, variable, or function parameter with name `op` cannot be resolved"),
        case(
            "an audit naming a missing column",
            Some(format!("{REPLACE}\n[[audit]]\nkind = \"not_null\"\ncolumns = [\"nope\"]\n")),
            RUN_FORCED,
            2,
            "case.toml: audit[0].columns: audit \"not_null(nope)\" does not run on duckdb: Binder Error",
        )
        .on(Eng::Postgres, "case.toml: audit[0].columns: audit \"not_null(nope)\" does not run on postgres: undefined column")
        .on(Eng::Spark, "case.toml: audit[0].columns: audit \"not_null(nope)\" does not run on spark: [UNRESOLVED_COLUMN"),
        case(
            "an audit query naming a missing table",
            Some(format!("{REPLACE}\n[[audit]]\nname = \"lookup\"\nkind = \"sql\"\nsql = \"SELECT * FROM silver.nope WHERE dt = :run_date\"\n")),
            RUN_FORCED,
            2,
            "case.toml: audit[0].sql: audit \"lookup\" does not run on duckdb: Catalog Error",
        )
        .on(Eng::Postgres, "case.toml: audit[0].sql: audit \"lookup\" does not run on postgres: undefined table: relation \"silver.nope\" does not exist")
        .on(Eng::Spark, "case.toml: audit[0].sql: audit \"lookup\" does not run on spark: [TABLE_OR_VIEW_NOT_FOUND] The table or view `silver`.`nope` cannot be found"),
        // The data.
        case("NULL merge key", m("FROM bronze.orders WHERE dt = :run_date", "FROM bronze.nulls WHERE kind = 'key'"), RUN, 3, "a NULL in the key (order_id)"),
        case("NULL merge version", m("FROM bronze.orders WHERE dt = :run_date", "FROM bronze.nulls WHERE kind = 'version'"), RUN, 3, "a NULL version (updated_at)"),
        case("type mismatch with the target", src("SELECT order_id, CAST(order_total AS VARCHAR) AS order_total, dt FROM bronze.orders WHERE dt = :run_date"), RUN, 2, "the type of column(s) order_total (DECIMAL(12,2) in the target, VARCHAR in the source) changed")
            .on(Eng::Postgres, "the type of column(s) order_total (numeric(12,2) in the target, character varying in the source) changed")
            .on(Eng::Spark, "the type of column(s) order_total (decimal(12,2) in the target, string in the source) changed"),
        case("new source column", src("SELECT order_id, order_total, updated_at, dt FROM bronze.orders WHERE dt = :run_date"), RUN, 2, "the source returns new column(s) updated_at TIMESTAMP that the target silver.orders lacks")
            .on(Eng::Postgres, "the source returns new column(s) updated_at timestamp without time zone that the target silver.orders lacks")
            .on(Eng::Spark, "the source returns new column(s) updated_at timestamp that the target silver.orders lacks"),
        case("dropped source column", src("SELECT order_id, dt FROM bronze.orders WHERE dt = :run_date"), RUN, 2, "the source no longer returns column(s) order_total DECIMAL(12,2)")
            .on(Eng::Postgres, "the source no longer returns column(s) order_total numeric(12,2)")
            .on(Eng::Spark, "the source no longer returns column(s) order_total decimal(12,2)"),
        case("rows outside the partition", src("SELECT order_id, order_total, dt FROM bronze.orders WHERE dt <= :run_date"), RUN, 3, "1 source row(s) have dt other than the run date 2026-10-20; nothing was changed"),
        case("too few rows", r("partition = \"dt\"", "partition = \"dt\"\nmin_rows = 100"), RUN, 3, "100"),
        // A history (SCD type 2) job.
        case("history: a key the source lacks", h("key = [\"order_id\"]", "key = [\"nope\"]"), RUN, 2, "the source query of job dim_orders has no column \"nope\" (the job's key)"),
        case("history: a version the source lacks", h("version = \"updated_at\"", "version = \"nope\""), RUN, 2, "the source query of job dim_orders has no column \"nope\" (the job's version)"),
        case("history: a tracked column the source lacks", h("track = [\"order_total\"]", "track = [\"nope\"]"), RUN, 2, "track: the source query has no column \"nope\" to track (it returns order_id, order_total, updated_at); nothing was changed"),
        case("history: a NULL key", hsrc("SELECT order_id, order_total, updated_at FROM bronze.nulls WHERE kind = 'key'"), RUN, 3, "1 source row(s) have a NULL in the key (order_id); one of them: {order_id: NULL").not_on(Eng::Spark),
        case("history: a NULL version", hsrc("SELECT order_id, order_total, updated_at FROM bronze.nulls WHERE kind = 'version'"), RUN, 3, "1 source row(s) have a NULL version (updated_at); one of them: {order_id: 7").not_on(Eng::Spark),
        case("history: a target that is not a history table", h("target = \"silver.dim_orders\"", "target = \"silver.orders_m\""), RUN, 2, "the target silver.orders_m has no column \"valid_from\", so it is not a history table"),
        case("history: the source returns the interval's column", hsrc("SELECT order_id, order_total, updated_at, dt AS valid_from FROM bronze.orders WHERE dt = :run_date"), RUN, 2, "valid_from: the source query returns a column \"valid_from\", which is the interval column fixpoint writes; nothing was changed"),
        case("history: partitioned by an interval column", h("track =", "partition = \"valid_to\"\ntrack ="), RUN, 2, "partition: \"valid_to\" is an interval column"),
        case("history: deletes = \"absent\" with a version", h("track =", "deletes = \"absent\"\ntrack ="), RUN, 2, "deletes: \"absent\" only applies to a snapshot history (one without `version`)"),
        // Dates and other arguments.
        case("no date", Some(REPLACE.into()), &["run", "case.toml", "--db", "duckdb:w.duckdb"], 2, "--date"),
        case("not a date", Some(REPLACE.into()), &["run", "case.toml", "--date", "yesterday", "--db", "duckdb:w.duckdb"], 2, "\"yesterday\" is not a date: expected YYYY-MM-DD"),
        case("impossible date", Some(REPLACE.into()), &["run", "case.toml", "--date", "2026-02-30", "--db", "duckdb:w.duckdb"], 2, "\"2026-02-30\" is not a date"),
        case("date in another format", Some(REPLACE.into()), &["run", "case.toml", "--date", "20.10.2026", "--db", "duckdb:w.duckdb"], 2, "\"20.10.2026\" is not a date"),
        case("date before the job's start", r("partition = \"dt\"", "partition = \"dt\"\nstart = 2026-10-21"), RUN, 2, "--date 2026-10-20 is before the job's start 2026-10-21"),
        case("backfill range reversed", Some(REPLACE.into()), &["backfill", "case.toml", "--from", "2026-10-21", "--to", "2026-10-20", "--db", "duckdb:w.duckdb"], 2, "--from 2026-10-21 is after --to 2026-10-20"),
        case("unknown database URL", Some(REPLACE.into()), &["run", "case.toml", "--date", "2026-10-20", "--db", "mysql://u:secret@h/db"], 2, "\"mysql://u:***@h/db\" is not a database URL"),
        case("Spark Connect URL (a build without the spark feature)", Some(REPLACE.into()), &["run", "case.toml", "--date", "2026-10-20", "--db", "sc://127.0.0.1:15002"], 2, "this fixpoint was built without Spark support"),
        // Injection attempts in every user-supplied string.
        case("injection in --date", Some(REPLACE.into()), &["run", "case.toml", "--date", "2026-10-20'; DROP TABLE bronze.orders; --", "--db", "duckdb:w.duckdb"], 2, "is not a date"),
        case("injection in the job name", r("name = \"silver_orders\"", "name = \"x'; DROP TABLE bronze.orders; --\""), RUN, 2, "name: \"x'; DROP TABLE bronze.orders; --\": expected letters, digits"),
        case("injection in the target", r("target = \"silver.orders\"", "target = \"silver.orders; DROP TABLE bronze.orders\""), RUN, 2, "is not a table name"),
        case("injection in the target (quotes)", r("target = \"silver.orders\"", "target = 'silver.\"orders\"\"; DROP TABLE bronze.orders; --\"'"), RUN, 2, "is not a table name"),
        case("injection in the partition", r("partition = \"dt\"", "partition = \"dt; DROP TABLE bronze.orders\""), RUN, 2, "partition: \"dt; DROP TABLE bronze.orders\": expected a column name"),
        case("injection in a merge key", m("[\"order_id\"]", "[\"order_id) OR 1=1 --\"]"), RUN, 2, "key: \"order_id) OR 1=1 --\": expected a column name"),
        case("injection in metadata", r("partition = \"dt\"", "partition = \"dt\"\nmetadata = ['x\"; DROP TABLE bronze.orders; --']"), RUN, 2, "metadata: \"x\\\"; DROP TABLE bronze.orders; --\": expected a column name"),
        case("injection in a predicate", m("version = \"updated_at\"", "version = \"updated_at\"\ndeleted = \"false; DROP TABLE bronze.orders\""), RUN, 2, "deleted: is not a single condition"),
        // SQL the linter cannot read (DuckDB runs `* RENAME`; fixpoint's
        // parser does not): refused before anything runs, not "not linted".
        // Were the gate open, this job would load and record a run.
        case(
            "SQL the linter cannot read",
            src("SELECT order_id, total AS order_total, dt FROM (SELECT * RENAME (order_total AS total) FROM bronze.orders WHERE dt = :run_date) AS o"),
            RUN,
            2,
            "case.toml: source.sql: cannot be read as DuckDB SQL: sql parser error: ",
        )
        .on(Eng::Postgres, "case.toml: source.sql: cannot be read as PostgreSQL SQL: sql parser error: ")
        .on(Eng::Spark, "case.toml: source.sql: cannot be read as Spark SQL: sql parser error: "),
        case("injection in the source query", src("SELECT order_id, order_total, dt FROM bronze.orders WHERE dt = :run_date; DROP TABLE bronze.orders"), RUN, 2, "source.sql"),
        case("injection in a column name", src("SELECT order_id, order_total, dt, 1 AS \\\"x\\\"\\\"; DROP TABLE bronze.orders; --\\\" FROM bronze.orders WHERE dt = :run_date"), RUN, 2, "the source returns new column(s) x\"; DROP TABLE bronze.orders; -- INTEGER")
            .on(Eng::Postgres, "the source returns new column(s) x\"; DROP TABLE bronze.orders; -- integer")
            .on(Eng::Spark, "the source returns new column(s) x\"; DROP TABLE bronze.orders; -- int that"),
        case("injection in --where", None, &["fingerprint", "silver.orders", "--where", "1=1; DROP TABLE bronze.orders", "--db", "duckdb:w.duckdb"], 2, "--where: is not a single condition"),
        case("injection in a table argument", None, &["fingerprint", "silver.orders; DROP TABLE bronze.orders", "--db", "duckdb:w.duckdb"], 2, "is not a table name"),
        // The database.
        case("not a DuckDB file", Some(REPLACE.into()), &["run", "case.toml", "--date", "2026-10-20", "--db", "duckdb:garbage.duckdb"], 2, "cannot open garbage.duckdb as a DuckDB database: not a DuckDB database file"),
        case("a folder as the database", Some(REPLACE.into()), &["run", "case.toml", "--date", "2026-10-20", "--db", "duckdb:folder"], 2, "cannot open folder as a DuckDB database"),
        with(case("unreadable database file", Some(REPLACE.into()), RUN, 2, "cannot open w.duckdb as a DuckDB database: permission denied"), Special::Unreadable),
        with(case("read-only database file", Some(REPLACE.into()), RUN, 2, "cannot open w.duckdb as a DuckDB database: permission denied"), Special::ReadOnly),
        with(
            case("database locked by another process", Some(REPLACE.into()), &["run", "case.toml", "--date", "2026-10-20", "--db", "duckdb:w.duckdb", "--wait", "1"], 5, "w.duckdb is locked by another process (DuckDB allows one writer per file); waited 1s"),
            Special::Locked,
        ),
        case("PostgreSQL server down", Some(REPLACE.into()), &["run", "case.toml", "--date", "2026-10-20", "--db", "postgres://u:secret@127.0.0.1:1/db"], 1, "postgres: connecting to postgres://u:***@127.0.0.1:1/db"),
        with(case("PostgreSQL refuses the login", Some(REPLACE.into()), &["run", "case.toml", "--date", "2026-10-20", "--db", &pg_user], 2, "role \"no_such_role\" does not exist"), Special::Pg),
        with(case("PostgreSQL database missing", Some(REPLACE.into()), &["run", "case.toml", "--date", "2026-10-20", "--db", &pg_db], 2, "database does not exist"), Special::Pg),
    ]
    .into_iter()
    // Built with the Spark engine, the binary connects to that URL instead.
    .filter(|c| !(cfg!(feature = "spark") && c.name.starts_with("Spark Connect URL")))
    .collect()
}

fn pg_reachable() -> bool {
    let url = std::env::var("FIXPOINT_TEST_PG").unwrap_or_else(|_| "postgres://root@127.0.0.1:5432/test".into());
    match fixpoint_postgres::Postgres::connect(&url) {
        Ok(_) => true,
        Err(e) if std::env::var("CI").as_deref() == Ok("true") => panic!("postgres is unreachable under CI=true: {e}"),
        Err(e) => {
            eprintln!("skipped the PostgreSQL cases: the server is unreachable ({e})");
            false
        }
    }
}

#[cfg(unix)]
fn chmod(path: &Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// The catalogue's database URL on every engine but DuckDB, in the args.
const DUCKDB_URL: &str = "duckdb:w.duckdb";

/// A folder with a copy of the binary anyone may run (the cases that need
/// `nobody`), the job files and the odd files the cases name.
fn workdir() -> (tempfile::TempDir, std::path::PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().to_owned();
    let bin = dir.join("fixpoint");
    std::fs::copy(env!("CARGO_BIN_EXE_fixpoint"), &bin).unwrap();
    chmod(&bin, 0o755);
    chmod(&dir, 0o777);
    std::fs::write(dir.join("garbage.duckdb"), "this is not a database\n".repeat(400)).unwrap();
    std::fs::create_dir(dir.join("folder")).unwrap();
    std::fs::write(dir.join("job.toml"), REPLACE).unwrap();
    std::fs::write(dir.join("merge.toml"), MERGE).unwrap();
    (tmp, bin)
}

/// Loads both targets through the binary (a day of the replace job, two
/// of the merge), then goes through every case that applies to `e` at
/// `url`, comparing `state()` before and after each.
fn catalogue(e: Eng, url: &str, dir: &Path, bin: &Path, state: &mut dyn FnMut() -> Vec<String>) {
    for (job, date) in [("job.toml", "2026-10-20"), ("merge.toml", "2026-10-20"), ("merge.toml", "2026-10-19")] {
        let o = run(bin, dir, &["run", job, "--date", date, "--db", url], false);
        assert_eq!(o.code, 0, "{}", o.stderr);
    }
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    let pg = e == Eng::DuckDb && pg_reachable();
    let before = state();
    assert!(before[1].contains("2.5"), "the target is loaded: {before:?}");
    let mut checked = 0;
    let mut failures: Vec<String> = Vec::new();
    let print = std::env::var_os("FIXPOINT_PRINT_CATALOGUE").is_some();
    if print {
        eprintln!("\n{} ({url}):\n\n| case | exit | message (first error line) |\n|---|---|---|", e.label());
    }
    for c in cases() {
        if c.special == Special::Pg && !pg || c.not_on.contains(&e) {
            continue;
        }
        // A case that never reaches a database runs in DuckDB's pass only.
        let names_db = c.args.iter().any(|a| a == DUCKDB_URL);
        if e != Eng::DuckDb && (!names_db || c.special != Special::None) {
            continue;
        }
        let _ = std::fs::remove_file(dir.join("case.toml"));
        if let Some(job) = &c.job {
            std::fs::write(dir.join("case.toml"), job).unwrap();
        }
        let db_file = dir.join("w.duckdb");
        let mut holder = None;
        match c.special {
            Special::Unreadable => chmod(&db_file, 0o000),
            Special::ReadOnly => {
                chmod(&db_file, 0o444);
                chmod(dir, 0o555);
            }
            Special::Locked => holder = Some(duckdb::Connection::open(&db_file).unwrap()),
            _ => {}
        }
        let nobody = root && matches!(c.special, Special::Unreadable | Special::ReadOnly);
        let args: Vec<&str> = c.args.iter().map(|a| if a == DUCKDB_URL { url } else { a.as_str() }).collect();
        let text = run(bin, dir, &args, nobody);
        let mut json_args = args.clone();
        json_args.extend(["--output", "json"]);
        let json = run(bin, dir, &json_args, nobody);
        drop(holder);
        chmod(dir, 0o777);
        if db_file.exists() {
            chmod(&db_file, 0o644);
        }
        let name = format!("{} ({})", c.name, e.label());
        let needle = c.needle(e);
        // Every case is checked; the failures are told together at the end.
        let verdict = (|| -> Result<(), String> {
            let check = |ok: bool, what: String| if ok { Ok(()) } else { Err(what) };
            check(text.code == c.code, format!("{name}: exit code {} (expected {}); stderr:\n{}", text.code, c.code, text.stderr))?;
            check(text.stderr.contains(needle), format!("{name}: the message names the problem ({needle:?}):\n{}", text.stderr))?;
            check(text.stdout.is_empty(), format!("{name}: nothing on stdout in text mode: {}", text.stdout))?;
            check(!text.stderr.contains("secret") && !json.stdout.contains("secret"), format!("{name}: passwords are never printed"))?;
            check(json.code == c.code, format!("{name}: --output json: {}", json.stderr))?;
            if !json.stdout.is_empty() {
                let v: serde_json::Value = serde_json::from_str(&json.stdout).map_err(|e| format!("{name}: {e}: {}", json.stdout))?;
                check(v["error"]["exit_code"] == c.code, format!("{name}: {v}"))?;
            } else {
                // Only clap's own argument errors come before the output mode is known.
                check(c.code == 2, format!("{name}: JSON error expected on stdout"))?;
                check(json.stderr.contains(needle), name.clone())?;
            }
            let after = state();
            check(after == before, format!("{name}: the database is unchanged: before {before:?}, after {after:?}"))
        })();
        if let Err(why) = verdict {
            failures.push(why);
            continue;
        }
        checked += 1;
        if print {
            let first = text.stderr.lines().find(|l| l.starts_with("error")).or(text.stderr.lines().next()).unwrap_or("").replace('|', "\\|");
            let first = first.replace(&dir.display().to_string(), "[DIR]");
            eprintln!("| {} | {} | `` {} `` |", c.name, c.code, first);
        }
    }
    eprintln!("bad-input catalogue on {}: {checked} cases checked, {} failed", e.label(), failures.len());
    assert!(failures.is_empty(), "{} case(s) failed:\n\n{}", failures.len(), failures.join("\n\n"));
    let least = if e == Eng::DuckDb { 73 } else { 60 };
    assert!(checked >= least, "{checked}");
}

#[test]
fn every_bad_input_is_named_refused_and_changes_nothing() {
    let (tmp, bin) = workdir();
    let dir = tmp.path();
    {
        let db = duckdb::Connection::open(dir.join("w.duckdb")).unwrap();
        db.execute_batch(SETUP).unwrap();
    }
    catalogue(Eng::DuckDb, DUCKDB_URL, dir, &bin, &mut || duckdb_state(dir));
}

/// The same cases on PostgreSQL, in a database of their own; the state
/// read back with the `postgres` client.
#[test]
fn every_bad_input_is_named_refused_and_changes_nothing_on_postgres() {
    if !pg_reachable() {
        return;
    }
    let admin_url = std::env::var("FIXPOINT_TEST_PG").unwrap_or_else(|_| "postgres://root@127.0.0.1:5432/test".into());
    let name = format!("fixpoint_bad_input_{}", std::process::id());
    let mut admin = postgres::Client::connect(&admin_url, postgres::NoTls).unwrap();
    admin.batch_execute(&format!("DROP DATABASE IF EXISTS {name}")).unwrap();
    admin.batch_execute(&format!("CREATE DATABASE {name}")).unwrap();
    let (base, _) = admin_url.rsplit_once('/').expect("a URL with a database");
    let url = format!("{base}/{name}");
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let mut db = postgres::Client::connect(&url, postgres::NoTls).unwrap();
        db.batch_execute(SETUP).unwrap();
        let (tmp, bin) = workdir();
        let dir = tmp.path();
        catalogue(Eng::Postgres, &url, dir, &bin, &mut || postgres_state(&mut db));
    }));
    let _ = admin.batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"));
    if let Err(e) = result {
        std::panic::resume_unwind(e);
    }
}

/// Everything a bad input could have changed, read with `postgres`.
fn postgres_state(db: &mut postgres::Client) -> Vec<String> {
    let mut out = Vec::new();
    for q in [
        "SELECT string_agg(table_schema || '.' || table_name || ':' || table_type, ',' ORDER BY table_schema, table_name) FROM information_schema.tables WHERE table_schema NOT IN ('pg_catalog', 'information_schema')",
        "SELECT string_agg(CAST(s AS text), ';' ORDER BY CAST(s AS text)) FROM silver.orders AS s",
        "SELECT string_agg(CAST(s AS text), ';' ORDER BY CAST(s AS text)) FROM silver.orders_m AS s",
        "SELECT string_agg(CAST(s AS text), ';' ORDER BY CAST(s AS text)) FROM bronze.orders AS s",
        "SELECT CAST(count(*) AS text) FROM fixpoint.runs",
        "SELECT string_agg(nspname, ',' ORDER BY nspname) FROM pg_namespace",
    ] {
        out.push(db.query_one(q, &[]).unwrap().get::<_, Option<String>>(0).unwrap_or_default());
    }
    out
}

/// The same cases on Spark (one catalog: one test at a time across the
/// suite's Spark tests, which run in other processes after this one).
#[cfg(feature = "spark")]
mod spark {
    use super::*;
    use fixpoint_core::{Engine, Sql};

    #[test]
    fn every_bad_input_is_named_refused_and_changes_nothing_on_spark() {
        let url = std::env::var("FIXPOINT_TEST_SPARK").unwrap_or_else(|_| "sc://127.0.0.1:15002".into());
        let mut db = match fixpoint_spark::Spark::connect(&url, std::time::Duration::from_secs(10)) {
            Ok(db) => db,
            Err(e) if std::env::var("CI").as_deref() == Ok("true") => panic!("spark is unreachable under CI=true: {e}"),
            Err(e) => {
                eprintln!("skipped: spark is unreachable ({e})");
                return;
            }
        };
        // Cached relations of runs killed earlier (see the scenarios' `fresh`).
        db.execute(&Sql::raw("CLEAR CACHE")).unwrap();
        for d in ["bronze", "silver", "views", "fixpoint"] {
            db.execute(&Sql::raw(format!("DROP DATABASE IF EXISTS {d} CASCADE"))).unwrap();
        }
        for stmt in SETUP.split(";\n").map(str::trim).filter(|s| !s.is_empty()) {
            db.execute(&Sql::raw(stmt)).unwrap_or_else(|e| panic!("{e}\n{stmt}"));
        }
        let (tmp, bin) = workdir();
        let dir = tmp.path();
        catalogue(Eng::Spark, &url, dir, &bin, &mut || spark_state(&mut db));
    }

    /// Everything a bad input could have changed, read with plain Spark
    /// SQL (the leases' views, which every run takes and leaves released,
    /// left out).
    fn spark_state(db: &mut fixpoint_spark::Spark) -> Vec<String> {
        let mut all = |sql: &str| -> String {
            match db.query(&Sql::raw(sql)) {
                Ok(r) => {
                    let mut rows: Vec<String> = r.rows.iter().map(|r| r.iter().map(|v| v.display()).collect::<Vec<_>>().join("|")).collect();
                    rows.sort();
                    rows.join(";")
                }
                Err(e) => format!("error: {e}"),
            }
        };
        let mut tables = Vec::new();
        for d in ["bronze", "silver", "views", "fixpoint"] {
            tables.extend(all(&format!("SHOW TABLES IN {d}")).split(';').filter(|t| !t.contains("lease__")).map(str::to_owned));
        }
        vec![
            tables.join(","),
            all("SELECT * FROM silver.orders"),
            all("SELECT * FROM silver.orders_m"),
            all("SELECT * FROM bronze.orders"),
            all("SELECT count(*) FROM fixpoint.runs"),
            all("SHOW DATABASES"),
        ]
    }
}
