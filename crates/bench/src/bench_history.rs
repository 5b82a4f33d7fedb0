//! `--strategy history`: a batch of changes into a history table (SCD type
//! 2), fixpoint against the SQL a careful engineer writes for the in-order
//! case (close the changed keys' open rows, insert the new versions), on
//! DuckDB, each side on its own copy of the table, alternating.
//!
//! The table: `--rows` rows, five versions per key (versions 10 … 50, the
//! last open). Each round's batch: `--changes` rows; nine in ten are a new
//! version of the same keys (newer than anything before: the in-order
//! case), one in ten a late version of keys of their own (between the
//! key's versions 20 and 30), which fixpoint puts in its place and the
//! hand-written SQL does not. A third side, the floor, is the hand-written
//! SQL plus the two reads any run that keeps fingerprints makes: the hash
//! sum of the batch (the input fingerprint) and of every row of the keys
//! it touches (the output fingerprint a retry's skip compares). Before any
//! ratio is printed: the tables agree on every in-order key, and
//! fixpoint's late keys hold the late version in its place (checked by
//! plain SQL in a child process).

use std::path::Path;
use std::process::Command;

use fixpoint_core::Error;
use serde_json::json;

use crate::bench::{digest_in_child, exec_in_child, faults, measure, median, paired_ratio, BenchArgs, Sample};
use crate::Output;

/// The hand-written in-order history update, one transaction.
pub(crate) const HAND_HISTORY: &str = "BEGIN;
UPDATE silver.dim_hand AS t SET valid_to = c.v FROM staging.hchanges AS c WHERE t.id = c.id AND t.valid_to IS NULL AND c.v > t.valid_from;
INSERT INTO silver.dim_hand SELECT id, email, city, v, v, NULL FROM staging.hchanges;
COMMIT;";

const COLUMNS: &str = "id, email, city, v, valid_from, valid_to";

/// The floor: the hand-written update of `silver.dim_floor`, with the
/// batch's hash sum and the touched keys' rows' hash sum taken first in
/// its transaction (each kept in a temporary table, so it is computed),
/// by the engine's own row hash (`hash`), as fixpoint's fingerprints are.
fn floor_sql(hash: &str) -> String {
    format!(
        "BEGIN;
CREATE TEMPORARY TABLE fp_in AS SELECT count(*) AS n, sum({batch}) AS s FROM staging.hchanges AS c;
CREATE TEMPORARY TABLE fp_out AS SELECT count(*) AS n, sum({rows}) AS s FROM silver.dim_floor AS t WHERE t.id IN (SELECT id FROM staging.hchanges);
UPDATE silver.dim_floor AS t SET valid_to = c.v FROM staging.hchanges AS c WHERE t.id = c.id AND t.valid_to IS NULL AND c.v > t.valid_from;
INSERT INTO silver.dim_floor SELECT id, email, city, v, v, NULL FROM staging.hchanges;
COMMIT;",
        batch = hash.replace("{}", "c.id, c.email, c.city, c.v"),
        rows = hash.replace("{}", "t.id, t.email, t.city, t.v, t.valid_from, t.valid_to"),
    )
}

/// The database both sides run on: a DuckDB file, or a PostgreSQL database
/// of its own (`fixpoint_bench_history`, the tables indexed on the key as
/// a careful engineer's dimension table is).
enum Bench {
    Duck(std::path::PathBuf),
    Pg(String),
}

impl Bench {
    fn url(&self) -> String {
        match self {
            Bench::Duck(file) => format!("duckdb:{}", file.display()),
            Bench::Pg(url) => url.clone(),
        }
    }

    fn is_pg(&self) -> bool {
        matches!(self, Bench::Pg(_))
    }

    /// Runs the set-up `script` (DuckDB: in a child process).
    fn exec(&self, script: &str) -> Result<(), Error> {
        match self {
            Bench::Duck(file) => exec_in_child(file, script),
            Bench::Pg(url) => crate::bench_pg::exec_script(url, script),
        }
    }

    /// One value of `query`, as text (DuckDB: in a child process).
    fn value(&self, query: &str) -> Result<String, Error> {
        match self {
            Bench::Duck(file) => digest_in_child(file, query),
            Bench::Pg(url) => crate::bench_pg::value(url, query),
        }
    }

    /// `0 … n-1` as a FROM item with column `name`.
    fn range(&self, from: u64, to: u64, name: &str) -> String {
        match self {
            Bench::Duck(_) => format!("range({from}, {to}) AS r_{name}({name})"),
            Bench::Pg(_) => format!("generate_series(CAST({from} AS BIGINT), {to} - 1) AS r_{name}({name})"),
        }
    }

    fn text(&self, expr: &str) -> String {
        match self {
            Bench::Duck(_) => format!("CAST({expr} AS VARCHAR)"),
            Bench::Pg(_) => format!("CAST({expr} AS TEXT)"),
        }
    }

    /// A digest of `rows` (a FROM item with the table's columns), computed
    /// by the engine's own hash, not fixpoint's fingerprints.
    fn digest(&self, from: &str) -> String {
        match self {
            Bench::Duck(_) => format!("SELECT count(*) || ':' || coalesce(CAST(sum(hash({COLUMNS})) AS VARCHAR), '0') FROM {from}"),
            Bench::Pg(_) => format!("SELECT count(*) || ':' || coalesce(sum(hashtextextended(CAST(ROW({COLUMNS}) AS TEXT), 0)), 0) FROM {from}"),
        }
    }

    /// The engine's row hash of the columns `{}`, as fixpoint's native
    /// fingerprint takes it.
    fn row_hash(&self) -> &'static str {
        match self {
            Bench::Duck(_) => "hash({})",
            Bench::Pg(_) => "hashint8extended(hash_record_extended(ROW({}), 0), 0)",
        }
    }

    fn checkpoint(&self) -> &'static str {
        match self {
            Bench::Duck(_) => "CHECKPOINT",
            Bench::Pg(_) => "VACUUM ANALYZE",
        }
    }
}

fn build(bench: &Bench, marker: &Path, rows: u64) -> Result<(), Error> {
    let want = format!("{rows} history");
    if let Bench::Duck(file) = bench {
        if file.exists() && std::fs::read_to_string(marker).ok().as_deref() == Some(want.as_str()) {
            return Ok(());
        }
        for p in [file.to_owned(), file.with_extension("duckdb.wal")] {
            let _ = std::fs::remove_file(p);
        }
    }
    if let Bench::Pg(url) = bench {
        if crate::bench_pg::value(url, "SELECT shape FROM bench.meta").ok().as_deref() == Some(want.as_str()) {
            return Ok(());
        }
    }
    if bench.is_pg() {
        bench.exec("DROP SCHEMA IF EXISTS silver CASCADE;\nDROP SCHEMA IF EXISTS staging CASCADE;\nDROP SCHEMA IF EXISTS bench CASCADE;\nDROP SCHEMA IF EXISTS fixpoint CASCADE")?;
    }
    let keys = rows / 5;
    eprintln!("bench: building {} ({rows} history rows, {keys} keys)…", bench.url());
    let (i, j) = (bench.text("i"), bench.text("j"));
    bench.exec(&format!(
        "CREATE SCHEMA silver;\nCREATE SCHEMA staging;\nCREATE SCHEMA bench;
CREATE TABLE silver.dim AS
SELECT i AS id, 'e' || {i} || '-' || {j} AS email, 'city' || {ij} AS city,
       CAST(10 * j AS BIGINT) AS v, CAST(10 * j AS BIGINT) AS valid_from, CASE WHEN j < 5 THEN CAST(10 * (j + 1) AS BIGINT) END AS valid_to
FROM {ri}, {rj} ORDER BY i, j;
CREATE TABLE bench.meta (shape VARCHAR);
INSERT INTO bench.meta VALUES ('{want}');\n{}",
        bench.checkpoint(),
        ij = bench.text("(i + j) % 50"),
        ri = bench.range(0, keys, "i"),
        rj = bench.range(1, 6, "j"),
    ))?;
    if let Bench::Duck(_) = bench {
        std::fs::write(marker, want).map_err(|source| Error::Io { path: marker.to_owned(), source })?;
    }
    Ok(())
}

/// The sides' tables back to the built state (on PostgreSQL with an
/// index on the key each).
fn reset(bench: &Bench) -> Result<(), Error> {
    let index = if bench.is_pg() { "CREATE INDEX ON silver.dim_fixpoint (id);\nCREATE INDEX ON silver.dim_hand (id);\nCREATE INDEX ON silver.dim_floor (id);\n" } else { "" };
    bench.exec(&format!(
        "DROP TABLE IF EXISTS silver.dim_fixpoint;\nDROP TABLE IF EXISTS silver.dim_hand;\nDROP TABLE IF EXISTS silver.dim_floor;
CREATE TABLE silver.dim_fixpoint AS SELECT * FROM silver.dim;
CREATE TABLE silver.dim_hand AS SELECT * FROM silver.dim;
CREATE TABLE silver.dim_floor AS SELECT * FROM silver.dim;
{index}DROP SCHEMA IF EXISTS fixpoint CASCADE;\n{}",
        bench.checkpoint()
    ))
}

/// Round `r`'s batch: in-order keys 0 … 9n/10 at version 100 + 10r, late
/// keys of the round's own range at version 21 + r.
fn batch(bench: &Bench, rows: u64, changes: u64, r: u64) -> Result<(), Error> {
    let keys = rows / 5;
    let in_order = changes * 9 / 10;
    let late = changes - in_order;
    let late_from = keys - late * (r + 1);
    let i = bench.text("i");
    bench.exec(&format!(
        "DROP TABLE IF EXISTS staging.hchanges;
CREATE TABLE staging.hchanges AS
SELECT i AS id, 'e' || {i} || '-r{r}' AS email, 'moved' || {moved} AS city, CAST(100 + 10 * {r} AS BIGINT) AS v FROM {ord}
UNION ALL
SELECT i, 'late' || {i}, 'late{r}', CAST(21 + {r} AS BIGINT) FROM {lat};\n{}",
        if bench.is_pg() { "ANALYZE staging.hchanges" } else { "CHECKPOINT" },
        moved = bench.text(&format!("(i + {r}) % 7")),
        ord = bench.range(0, in_order, "i"),
        lat = bench.range(late_from, late_from + late, "i"),
    ))
}

/// The in-order keys agree between the sides; fixpoint's late keys hold
/// the late version between their versions 20 and 30.
fn verify(bench: &Bench, rows: u64, changes: u64, rounds_done: u64) -> Result<(), Error> {
    let in_order = changes * 9 / 10;
    let digest = |table: &str| bench.value(&bench.digest(&format!("{table} AS d WHERE id < {in_order}")));
    let (a, b, f) = (digest("silver.dim_fixpoint")?, digest("silver.dim_hand")?, digest("silver.dim_floor")?);
    if a != b || f != b {
        return Err(Error::Internal(format!("the benchmark's sides disagree on the in-order keys: fixpoint {a}, hand-written {b}, floor {f}; no ratio is printed")));
    }
    let keys = rows / 5;
    let late = changes - in_order;
    let first_late = keys - late * rounds_done;
    let placed = bench.value(&format!(
        "SELECT count(*) FROM silver.dim_fixpoint AS t WHERE id >= {first_late} AND (
           (valid_from = 20 AND valid_to BETWEEN 21 AND 29) OR (valid_from BETWEEN 21 AND 29 AND valid_to = 30 AND email LIKE 'late%'))"
    ))?;
    let want = 2 * late * rounds_done;
    if placed != want.to_string() {
        return Err(Error::Internal(format!("fixpoint's late versions: {placed} rows in place, {want} expected; no ratio is printed")));
    }
    Ok(())
}

pub fn run(args: BenchArgs, out: &Output) -> Result<(), Error> {
    let (rows, changes) = (args.rows_or(10_000_000), args.changes_or(100_000));
    let marker = args.dir.join("history.rows");
    let bench = if args.strategy == crate::bench::BenchStrategy::PostgresHistory {
        Bench::Pg(crate::bench_pg::database(&args.db, "fixpoint_bench_history")?)
    } else {
        Bench::Duck(args.dir.join("history.duckdb"))
    };
    build(&bench, &marker, rows)?;
    reset(&bench)?;
    let job = args.dir.join("bench_history.toml");
    std::fs::write(
        &job,
        "name = \"bench_history\"\ntarget = \"silver.dim_fixpoint\"\nstrategy = \"history\"\nkey = [\"id\"]\nversion = \"v\"\n\n[source]\nsql = \"SELECT id, email, city, v FROM staging.hchanges\"\n",
    )
    .map_err(|source| Error::Io { path: job.clone(), source })?;
    let exe = std::env::current_exe().map_err(|source| Error::Io { path: "fixpoint".into(), source })?;
    let url = bench.url();
    let fixpoint = || {
        let mut c = crate::fixpoint_command();
        c.args(["run", &job.display().to_string(), "--date", "2026-10-20", "--db", &url, "--output", "json"]);
        c
    };
    let floor = floor_sql(bench.row_hash());
    let hand = |script: &str| {
        let mut c = Command::new(&exe);
        match &bench {
            Bench::Duck(file) => c.args(["sql", "--file", &file.display().to_string()]),
            Bench::Pg(url) => c.args(["sql", "--pg", url.as_str()]),
        };
        c.args(["--date", "2026-10-20", &format!("--exec={script}")]);
        c
    };
    let (mut fx, mut hw, mut fl): (Vec<Sample>, Vec<Sample>, Vec<Sample>) = (Vec::new(), Vec::new(), Vec::new());
    let mut last = serde_json::Value::Null;
    for round in 0..args.rounds as u64 {
        eprintln!("bench: round {}/{}", round + 1, args.rounds);
        batch(&bench, rows, changes, round)?;
        let order: [u8; 3] = [[0, 1, 2], [1, 2, 0], [2, 0, 1]][round as usize % 3];
        for side in order {
            if side == 0 {
                let start = std::time::Instant::now();
                let (mut s, v) = measure(&mut fixpoint())?;
                s.inner = start.elapsed().as_secs_f64();
                if v["outcome"].as_str() != Some("committed") {
                    return Err(Error::Internal(format!("fixpoint did not commit: {v}")));
                }
                last = v;
                fx.push(s);
            } else {
                let start = std::time::Instant::now();
                let (mut s, _) = measure(&mut hand(if side == 1 { HAND_HISTORY } else { &floor }))?;
                s.inner = start.elapsed().as_secs_f64();
                if side == 1 { hw.push(s) } else { fl.push(s) }
            }
        }
        if bench.is_pg() {
            bench.exec("VACUUM ANALYZE silver.dim_fixpoint;\nVACUUM ANALYZE silver.dim_hand;\nVACUUM ANALYZE silver.dim_floor")?;
        }
        verify(&bench, rows, changes, round + 1)?;
    }
    let med = |v: &[Sample]| median(v.iter().map(|s| s.inner).collect());
    let rss = |v: &[Sample]| v.iter().map(|s| s.rss_mb).fold(0.0, f64::max);
    let result = json!({
        "engine": if bench.is_pg() { "postgres" } else { "duckdb" }, "rows_in_table": rows, "batch_rows": changes, "late_rows": changes - changes * 9 / 10, "rounds": args.rounds,
        "hand_written_s": med(&hw), "fixpoint_s": med(&fx), "ratio": med(&fx) / med(&hw), "paired_ratio": paired_ratio(&fx, &hw),
        "floor_s": med(&fl), "floor_ratio": med(&fl) / med(&hw), "fixpoint_over_floor": med(&fx) / med(&fl), "floor_peak_rss_mb": rss(&fl),
        "hand_written_peak_rss_mb": rss(&hw), "fixpoint_peak_rss_mb": rss(&fx),
        "hand_written_page_faults": faults(&hw), "fixpoint_page_faults": faults(&fx),
        "last_report": last, "results_checked": true,
    });
    if out.is_json() {
        out.json(&result);
    } else {
        println!("history on {}: {changes} changes", if bench.is_pg() { "PostgreSQL" } else { "DuckDB" });
        println!("{changes} changes (1 in 10 a late older version) into a {rows}-row history table, median of {} alternating rounds (wall time of each process)", args.rounds);
        println!("| side | run (s) | peak RSS (MiB) |");
        println!("|---|---|---|");
        println!("| hand-written: close the open rows, insert the new versions (in-order only) | {:.3} | {:.0} |", med(&hw), rss(&hw));
        println!("| the floor: the hand-written SQL and the two fingerprint reads | {:.3} | {:.0} |", med(&fl), rss(&fl));
        println!("| fixpoint run (late versions placed) | {:.3} | {:.0} |", med(&fx), rss(&fx));
        println!("ratio fixpoint / hand-written: {:.3}; median of the rounds' own ratios: {:.3}", med(&fx) / med(&hw), paired_ratio(&fx, &hw));
        println!("ratio floor / hand-written: {:.3}; fixpoint / floor: {:.3}", med(&fl) / med(&hw), med(&fx) / med(&fl));
        println!("fixpoint's last report: {last}");
    }
    Ok(())
}
