//! Model-based histories, on every engine and every plan a user can get:
//! random sequences of deliveries (duplicates, exact copies, redeliveries,
//! late copies of another day's rows, out-of-order versions, tombstones,
//! keys moving between partitions), runs, forced runs, retries of the same
//! date, runs failed on purpose at every fail point, and overlapping
//! backfills (some failing midway, some forced), applied to one
//! `replace_partition` job and two `merge` jobs reading the same bronze
//! table.
//!
//! Each history draws its jobs: the `replace_partition` source with or
//! without `:run_key` (without it, DuckDB takes the tapped path on the first
//! run of a day and on `--force`, the guard scan otherwise; with it, always
//! the guard scan), and two merges, each with or without `partition`
//! (pruned), `on_tie = "error"` or `"deterministic"`, one with `deleted`
//! (tombstones) and one without (on DuckDB, the one-statement plan). The
//! engines under test force each DuckDB merge plan in turn (in the
//! two-statement family the tapped day insert is declined: the plan's
//! fallback, guards scanned after the delete); on PostgreSQL the targets
//! are plain tables, plain tables whose merge targets have a primary key on
//! the merge key (the one-statement merge then updates on the key), or
//! tables `PARTITION BY LIST` / `RANGE (dt)` so
//! `replace_partition` swaps days in whole (partition exchange) or, with
//! `swap = "delete_insert"`, deletes and inserts into them, and merges
//! move rows between partitions. On Spark (feature `spark`) the day is
//! overwritten and the merges rewrite the partitions they touch (or, without
//! `partition`, the whole table); a run failed on purpose after its
//! overwrite leaves its output without a ledger row, and a merge failed
//! between recording its tombstones and its rewrite leaves the tombstones,
//! as docs/engines.md documents; the model predicts both.
//!
//! A plain-Rust model of each job predicts every run before it is compared:
//! committed (with the report's counts), skipped (nothing to do), or
//! refused (a tie under `on_tie = "error"`, a key held in a partition a
//! pruned batch does not touch), or failed on purpose. After every step
//! each target equals its model, row for row; the ledger holds exactly one
//! row per committed run (the run's own key; none for a failed, refused or
//! skipped run); equal inputs got equal run keys; and at the end rerunning
//! every date changes nothing.
//!
//! Quick by default (part of `cargo test --workspace`). The long run:
//!
//! ```text
//! FIXPOINT_HISTORIES=10000 cargo test --workspace --test histories -- --nocapture
//! ```
//!
//! prints the figures recorded in docs/reliability.md. Each test prints its seed;
//! a failure prints the minimal failing history and the command that runs
//! it again (`FIXPOINT_HISTORY_SEED`, `FIXPOINT_HISTORY_THREADS=1`).

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use std::time::Instant;

use fixpoint_core::tools::backfill::{backfill, BackfillOptions, DateOutcome};
use fixpoint_core::{Error, ErrorClass, FailPoint, FaultAction, Job, RunOptions, RunReport};
use fixpoint_core::run::ledger;
use fixpoint_scenarios::*;
use proptest::prelude::*;
use proptest::test_runner::{Config, RngSeed, TestCaseError, TestRunner};

const DAYS: usize = 4;

/// A bronze row: delivered on a day (its batch), for key `k` at version
/// `v`; `pd` is the row's own partition (the merges' `dt`), usually its
/// key's home partition, sometimes another (the key moves).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Row {
    k: i64,
    v: i64,
    amount: Option<i64>,
    del: bool,
    pd: usize,
}

#[derive(Debug, Clone)]
enum Step {
    /// New rows for a day (random keys and versions: duplicates, exact
    /// copies and out-of-order versions arise naturally).
    Deliver { day: usize, rows: Vec<Row> },
    /// The day's rows delivered again, exactly.
    Redeliver { day: usize },
    /// Another day's rows delivered again into this day's batch (a late
    /// replay: older versions arriving after newer ones).
    Echo { from: usize, to: usize },
    /// Every job runs for the day (a retry when the day already ran).
    Run { day: usize },
    /// Every job runs for the day with `--force`.
    Force { day: usize },
    /// Every job runs for the day and fails at a step boundary.
    Fail { day: usize, point: usize },
    /// Every job backfills a range, optionally failing on one of its
    /// dates, optionally with `--force`.
    Backfill { from: usize, to: usize, fail: Option<(usize, usize)>, force: bool },
}

/// One merge job's options.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct MergeConf {
    partition: bool,
    deleted: bool,
    deterministic: bool,
}

/// A history's jobs and (PostgreSQL, partitioned) the targets' layout.
#[derive(Debug, Clone, Copy)]
struct Conf {
    /// The replace_partition source selects `:run_key AS load_id` (metadata).
    rp_key: bool,
    merges: [MergeConf; 2],
    /// Partitioned targets: `PARTITION BY RANGE (dt)` instead of `LIST (dt)`.
    range: bool,
    /// Partitioned targets: the replace_partition job has `swap = "delete_insert"`.
    delete_insert: bool,
}

fn row() -> impl Strategy<Value = Row> {
    (0i64..5, 0i64..4, proptest::option::of(0i64..3), proptest::bool::weighted(0.2), proptest::option::weighted(0.2, 0..DAYS))
        .prop_map(|(k, v, amount, del, moved)| Row { k, v, amount, del, pd: moved.unwrap_or(k as usize % DAYS) })
}

fn conf() -> impl Strategy<Value = Conf> {
    (any::<bool>(), any::<bool>(), any::<bool>(), any::<bool>(), any::<bool>(), any::<bool>(), any::<bool>(), proptest::bool::weighted(0.25)).prop_map(
        |(rp_key, p1, del1, det1, p2, det2, range, delete_insert)| Conf {
            rp_key,
            // One merge with tombstones, one without: every history has a
            // merge that DuckDB may run as one statement.
            merges: [
                MergeConf { partition: p1, deleted: del1, deterministic: det1 },
                MergeConf { partition: p2, deleted: !del1, deterministic: det2 },
            ],
            range,
            delete_insert,
        },
    )
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        3 => (0..DAYS, proptest::collection::vec(row(), 1..5)).prop_map(|(day, rows)| Step::Deliver { day, rows }),
        1 => (0..DAYS).prop_map(|day| Step::Redeliver { day }),
        1 => (0..DAYS, 0..DAYS).prop_map(|(from, to)| Step::Echo { from, to }),
        3 => (0..DAYS).prop_map(|day| Step::Run { day }),
        1 => (0..DAYS).prop_map(|day| Step::Force { day }),
        2 => (0..DAYS, 0..FailPoint::ALL.len()).prop_map(|(day, point)| Step::Fail { day, point }),
        2 => (0..DAYS, 0..DAYS, proptest::option::weighted(0.4, (0..DAYS, 0..FailPoint::ALL.len())), proptest::bool::weighted(0.2))
            .prop_map(|(a, b, fail, force)| Step::Backfill { from: a.min(b), to: a.max(b), fail, force }),
    ]
}

fn day(i: usize) -> String {
    format!("2026-10-{:02}", i + 1)
}

/// How the test creates the targets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Layout {
    /// The runs create plain tables.
    Plain,
    /// PostgreSQL: the targets exist before the first run, partitioned by
    /// `dt` (the merges' with a partition per day; replace_partition's with
    /// none, each run swaps or creates its day's).
    Partitioned,
    /// PostgreSQL: the merges' targets exist before the first run, plain,
    /// with a primary key on the merge key `k`.
    Keyed,
}

/// Which merge plans the engine under test may take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Plans {
    /// DuckDB: one statement where eligible (no `deleted`, no tombstone
    /// table), else the two statements, else the join plan.
    OneStatement,
    /// DuckDB without the one-statement plan.
    TwoStatements,
    /// The plan with joins of its own (DuckDB without taps, PostgreSQL
    /// with its one-statement merge off).
    Join,
    /// PostgreSQL: one statement where eligible (no `deleted`, no
    /// tombstone table, no audits), else the join plan.
    PgOneStatement,
    /// Spark: no transactions; replace_partition overwrites the day,
    /// merges rewrite the partitions they touch (the whole table without
    /// `partition`). The commit point is the overwrite: a failure after it
    /// leaves the run's output without its ledger row; a merge's
    /// tombstones are recorded just before it.
    Spark,
    /// Delta (feature `delta`): the leased plans of Spark, but a run's
    /// changes are committed with its ledger row (a merge's tombstones in
    /// the commit after the target's), so every failure point comes before
    /// them and leaves nothing.
    Delta,
}

impl Plans {
    /// Whether replace_partition can take its guards on the insert
    /// (DuckDB's taps) or beside it (PostgreSQL's second session) rather
    /// than in a scan before it.
    fn defers_guards(self) -> bool {
        matches!(self, Plans::OneStatement | Plans::TwoStatements | Plans::PgOneStatement)
    }

    /// Whether the plans are the leased ones (Spark, Delta).
    fn leased(self) -> bool {
        matches!(self, Plans::Spark | Plans::Delta)
    }

    /// Whether a merge that failed at `p`, having changes to write, left
    /// its batch's tombstones recorded (they are written before the rewrite).
    fn tombstones_before(self, p: FailPoint) -> bool {
        match self {
            Plans::Spark => matches!(p, FailPoint::AfterDelete | FailPoint::MidInsert),
            _ => false,
        }
    }

    /// Whether a failure at `p` comes after the run's commit point (Spark:
    /// the overwrite is done, the ledger row is not written).
    fn after_commit(self, p: FailPoint) -> bool {
        self == Plans::Spark && matches!(p, FailPoint::AfterInsert | FailPoint::BeforeCommit)
    }

    /// The replace_partition methods a committed run may report (Spark:
    /// the write observed, or the steps that scan before and after it).
    fn rp_methods(self, layout: Layout, conf: &Conf) -> &'static [&'static str] {
        match (self, layout) {
            (Plans::Spark, _) => &["partition overwrite, observed", "partition overwrite"],
            (Plans::Delta, _) => &["partition overwrite"],
            (_, Layout::Partitioned) if !conf.delete_insert => &["partition exchange"],
            _ => &["delete+insert"],
        }
    }

    /// The report's `method` a committed merge may give.
    fn merge_methods(self, m: &MergeConf, layout: Layout) -> &'static [&'static str] {
        match self {
            Plans::PgOneStatement if !m.deleted && layout == Layout::Keyed => &["merge, one statement, updates on the key", "merge"],
            Plans::Join => &["merge"],
            Plans::Spark | Plans::Delta if m.partition => &["copy-on-write of touched partitions"],
            Plans::Spark | Plans::Delta => &["copy-on-write of the table"],
            Plans::TwoStatements => &["merge, checks in the statement", "merge"],
            // Without tombstones or audits the one-statement plan, or,
            // where it declines, the portable one.
            Plans::OneStatement if !m.deleted => &["merge, one statement", "merge"],
            Plans::OneStatement => &["merge, checks in the statement", "merge"],
            Plans::PgOneStatement if !m.deleted => &["merge, one statement", "merge"],
            Plans::PgOneStatement => &["merge"],
        }
    }
}

/// The engine under test, as the histories need to know it.
#[derive(Debug, Clone, Copy)]
struct Ctx {
    plans: Plans,
    layout: Layout,
}

/// The newest version per key of the day; a tombstone winner removes the key.
fn rp_toml(c: &Conf, layout: Layout) -> String {
    let key_col = if c.rp_key { ", :run_key AS load_id" } else { "" };
    let metadata = if c.rp_key { "metadata = [\"load_id\"]\n" } else { "" };
    let swap = if layout == Layout::Partitioned && c.delete_insert { "swap = \"delete_insert\"\n" } else { "" };
    format!(
        r#"
name = "h_rp"
target = "h.rp"
strategy = "replace_partition"
partition = "dt"
{metadata}{swap}
[source]
sql = """
SELECT k, v, amount, dt{key_col} FROM (
  SELECT k, v, amount, op, dt,
         row_number() OVER (PARTITION BY k ORDER BY v DESC, op DESC, amount DESC NULLS LAST) AS rn
  FROM h.bronze WHERE dt = :run_date
) AS w
WHERE rn = 1 AND op <> 'D'
"""
"#
    )
}

/// Each day's rows are a batch of changes, each row in its own partition
/// `dt`: newest version wins across days.
fn merge_toml(i: usize, m: &MergeConf) -> String {
    let partition = if m.partition { "partition = \"dt\"\n" } else { "" };
    let deleted = if m.deleted { "deleted = \"op = 'D'\"\n" } else { "" };
    let on_tie = if m.deterministic { "deterministic" } else { "error" };
    format!(
        r#"
name = "h_m{i}"
target = "h.m{i}"
strategy = "merge"
key = ["k"]
version = "v"
{partition}{deleted}on_tie = "{on_tie}"

[source]
sql = "SELECT b.k, b.v, b.amount, b.pd AS dt, b.op FROM h.bronze AS b WHERE b.dt = :run_date"
"#
    )
}

fn setup(c: &Conf, ctx: &Ctx) -> String {
    let layout = ctx.layout;
    let mut s = String::from("CREATE SCHEMA h;\nCREATE TABLE h.bronze (dt DATE, k BIGINT, v BIGINT, amount BIGINT, op VARCHAR, pd DATE)");
    if ctx.plans.leased() {
        // A merge on Spark rewrites partitions: its targets are stored
        // partitioned by day (a job without `partition` rewrites them all).
        // On Delta a job without `partition` has an unpartitioned target,
        // whose files holding the batch's keys are rewritten.
        let (text, using) = if ctx.plans == Plans::Spark { ("STRING", " USING parquet") } else { ("VARCHAR", "") };
        for (i, m) in c.merges.iter().enumerate() {
            let by = if ctx.plans == Plans::Delta && !m.partition { "" } else { " PARTITIONED BY (dt)" };
            s.push_str(&format!(";\nCREATE TABLE h.m{} (k BIGINT, v BIGINT, amount BIGINT, op {text}, dt DATE){using}{by}", i + 1));
        }
    }
    if layout == Layout::Keyed {
        for i in 1..=c.merges.len() {
            s.push_str(&format!(";\nCREATE TABLE h.m{i} (k BIGINT PRIMARY KEY, v BIGINT, amount BIGINT, dt DATE, op VARCHAR)"));
        }
    }
    if layout == Layout::Partitioned {
        let by = if c.range { "RANGE" } else { "LIST" };
        let bound = |d: usize| if c.range { format!("FROM ('{}') TO ('{}')", day(d), day(d + 1)) } else { format!("IN ('{}')", day(d)) };
        let load_id = if c.rp_key { ", load_id VARCHAR" } else { "" };
        s.push_str(&format!(";\nCREATE TABLE h.rp (k BIGINT, v BIGINT, amount BIGINT, dt DATE{load_id}) PARTITION BY {by} (dt)"));
        for i in 1..=c.merges.len() {
            s.push_str(&format!(";\nCREATE TABLE h.m{i} (k BIGINT, v BIGINT, amount BIGINT, dt DATE, op VARCHAR) PARTITION BY {by} (dt)"));
            for d in 0..DAYS {
                s.push_str(&format!(";\nCREATE TABLE h.m{i}_{d} PARTITION OF h.m{i} FOR VALUES {}", bound(d)));
            }
        }
    }
    s
}

/// A source row as a merge job sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Change {
    k: i64,
    v: i64,
    amount: Option<i64>,
    dt: usize,
    op: &'static str,
    /// A tombstone (only for a job with `deleted`).
    del: bool,
}

impl Change {
    /// The compared columns, in source order (amount, dt, op): ascending,
    /// NULLs first (`None < Some`), dates in day order, 'D' before 'U'.
    fn values(&self) -> (Option<i64>, usize, &'static str) {
        (self.amount, self.dt, self.op)
    }

    /// Ranks before `o` among rows of one key: the newer version, then a
    /// tombstone, then the values' order.
    fn before(&self, o: &Change) -> bool {
        if self.v != o.v {
            return self.v > o.v;
        }
        if self.del != o.del {
            return self.del;
        }
        self.values() < o.values()
    }

    fn show(&self) -> Vec<String> {
        vec![self.k.to_string(), self.v.to_string(), amount(self.amount), day(self.dt), format!("{:?}", self.op)]
    }
}

/// Why the model expects a merge to be refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Refusal {
    /// `on_tie = "error"`: two different upserts of a key at its newest
    /// version in the batch, or the batch's upsert and the target's row at
    /// one version, differing.
    Tie,
    /// `partition`: a key of the batch the target holds in a partition the
    /// batch does not touch.
    Moved,
}

impl Refusal {
    /// What the error says.
    fn says(self) -> &'static str {
        match self {
            Refusal::Tie => "at the same version",
            Refusal::Moved => "a partition the batch does not touch",
        }
    }
}

/// A merge's report, as the model predicts it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct MergeCounts {
    input_rows: u64,
    inserted: u64,
    updated: u64,
    deleted: u64,
    unchanged: u64,
    collapsed: u64,
    output_rows: u64,
}

/// What a committed merge leaves.
#[derive(Debug)]
struct MergePlan {
    target: BTreeMap<i64, Change>,
    tombs: BTreeMap<i64, i64>,
    batch: Vec<Change>,
    counts: MergeCounts,
}

/// One merge job's model: the target, the remembered tombstones (key →
/// version), and every row of every committed batch.
struct MergeModel {
    conf: MergeConf,
    name: String,
    table: String,
    target: BTreeMap<i64, Change>,
    tombs: BTreeMap<i64, i64>,
    seen: Vec<Change>,
    /// Spark: a batch's tombstone at a remembered tombstone's own version
    /// is applied again (the retry of a run that recorded its tombstones
    /// and failed before its rewrite).
    spark: bool,
    /// Spark: tombstones recorded by a run that failed before its rewrite
    /// (they hold for later batches until the date runs again), so the
    /// target may differ from the winners among committed batches.
    pending: bool,
    /// Spark: rows inserted minus deleted by runs that failed after their
    /// rewrite (written, without a ledger row).
    unrecorded: i64,
}

impl MergeModel {
    fn changes(&self, rows: &[Row]) -> Vec<Change> {
        rows.iter()
            .map(|r| Change { k: r.k, v: r.v, amount: r.amount, dt: r.pd, op: if r.del { "D" } else { "U" }, del: self.conf.deleted && r.del })
            .collect()
    }

    /// The merge of `rows` as one batch, step by step as docs/strategies.md
    /// merge runs it: keep one row per key (newest version, tombstone
    /// first, then the values' order); `on_tie = "error"`: refuse a key
    /// with another upsert at its kept upsert's version that differs;
    /// drop kept rows a remembered tombstone beats (version ≤ it); with
    /// `partition`, refuse a kept key the target holds in a partition none
    /// of the kept rows is in; `on_tie = "error"`: refuse a kept upsert at
    /// the target's version that differs from the target's row; then
    /// update (strictly newer, or `"deterministic"` at the same version
    /// and first in the values' order), delete (a tombstone at the
    /// target's version or newer), insert (an upsert of an absent key),
    /// and remember the kept tombstones.
    fn plan(&self, rows: &[Row]) -> Result<MergePlan, Refusal> {
        let batch = self.changes(rows);
        let mut kept: BTreeMap<i64, Change> = BTreeMap::new();
        for c in &batch {
            if kept.get(&c.k).is_none_or(|w| c.before(w)) {
                kept.insert(c.k, c.clone());
            }
        }
        if !self.conf.deterministic {
            for c in &batch {
                let w = &kept[&c.k];
                if !c.del && !w.del && c.v == w.v && c.values() != w.values() {
                    return Err(Refusal::Tie);
                }
            }
        }
        let keys = kept.len() as u64;
        let live: Vec<&Change> = kept.values().filter(|c| self.tombs.get(&c.k).is_none_or(|t| c.v > *t || (self.spark && c.del && c.v == *t))).collect();
        let touched: BTreeSet<usize> = live.iter().map(|c| c.dt).collect();
        let mut target = self.target.clone();
        let mut tombs = self.tombs.clone();
        let (mut inserted, mut updated, mut deleted) = (0u64, 0u64, 0u64);
        let (mut moved, mut cross_tie) = (false, false);
        for c in &live {
            match self.target.get(&c.k) {
                Some(t) => {
                    if self.conf.partition && !touched.contains(&t.dt) {
                        moved = true;
                    }
                    if !c.del && c.v == t.v && c.values() != t.values() {
                        cross_tie = true;
                    }
                    if c.del {
                        if c.v >= t.v {
                            target.remove(&c.k);
                            deleted += 1;
                        }
                    } else if c.v > t.v || (self.conf.deterministic && c.v == t.v && c.values() < t.values()) {
                        target.insert(c.k, (*c).clone());
                        updated += 1;
                    }
                }
                None => {
                    if !c.del {
                        target.insert(c.k, (*c).clone());
                        inserted += 1;
                    }
                }
            }
            if c.del {
                tombs.insert(c.k, c.v);
            }
        }
        if moved {
            return Err(Refusal::Moved);
        }
        if cross_tie && !self.conf.deterministic {
            return Err(Refusal::Tie);
        }
        let output_rows = live.iter().filter(|c| target.contains_key(&c.k)).count() as u64;
        let input_rows = batch.len() as u64;
        let counts = MergeCounts {
            input_rows,
            inserted,
            updated,
            deleted,
            unchanged: keys - inserted - updated - deleted,
            collapsed: input_rows - keys,
            output_rows,
        };
        Ok(MergePlan { target, tombs, batch, counts })
    }

    fn rows(&self) -> Vec<Vec<String>> {
        let mut out: Vec<Vec<String>> = self.target.values().map(Change::show).collect();
        out.sort();
        out
    }

    /// The merge contract (docs/strategies.md), said another way: for every key, the winner
    /// among every row of every committed batch (newest version, then a
    /// tombstone, then the values' order); absent if a tombstone.
    fn contract_rows(&self) -> Vec<Vec<String>> {
        let mut winners: BTreeMap<i64, &Change> = BTreeMap::new();
        for c in &self.seen {
            if winners.get(&c.k).is_none_or(|w| c.before(w)) {
                winners.insert(c.k, c);
            }
        }
        let mut out: Vec<Vec<String>> = winners.values().filter(|c| !c.del).map(|c| c.show()).collect();
        out.sort();
        out
    }
}

/// replace_partition's model: each committed day's partition, and the run
/// key of its last committed run (the `load_id` of its rows).
#[derive(Default)]
struct RpModel {
    parts: BTreeMap<usize, Vec<Vec<String>>>,
    /// The run key in the rows' `load_id` (unknown after a Spark run that
    /// failed after its overwrite with an input no run reported).
    keys: BTreeMap<usize, Option<String>>,
    /// Each day's rows as its last ledger row records them (on Spark a
    /// run that failed after its overwrite leaves `parts` ahead of it).
    recorded: BTreeMap<usize, Vec<Vec<String>>>,
}

/// The plain-Rust model of what the targets and the ledger should hold.
struct Model {
    bronze: [Vec<Row>; DAYS],
    rp: RpModel,
    merges: Vec<MergeModel>,
    /// (job, day) → how many bronze rows the day had at its last good run.
    last_run: BTreeMap<(String, usize), usize>,
    /// job → the run keys of its committed runs (one ledger row each).
    ledger: BTreeMap<String, Vec<String>>,
    /// (job, day, input) → run key, and back.
    keys: BTreeMap<(String, usize, String), String>,
    inputs: BTreeMap<String, (String, usize, String)>,
}

impl Model {
    fn new(conf: &Conf, ctx: &Ctx) -> Model {
        Model {
            bronze: Default::default(),
            rp: RpModel::default(),
            merges: conf
                .merges
                .iter()
                .enumerate()
                .map(|(i, m)| MergeModel {
                    conf: *m,
                    name: format!("h_m{}", i + 1),
                    table: format!("h.m{}", i + 1),
                    target: BTreeMap::new(),
                    tombs: BTreeMap::new(),
                    seen: Vec::new(),
                    spark: ctx.plans.leased(),
                    pending: false,
                    unrecorded: 0,
                })
                .collect(),
            last_run: BTreeMap::new(),
            ledger: BTreeMap::new(),
            keys: BTreeMap::new(),
            inputs: BTreeMap::new(),
        }
    }

    fn rp_day(&self, d: usize) -> Vec<Vec<String>> {
        let mut best: BTreeMap<i64, &Row> = BTreeMap::new();
        // ORDER BY v DESC, op DESC ('U' before 'D'), amount DESC NULLS LAST.
        let rank = |r: &Row| (r.v, !r.del, r.amount);
        for r in &self.bronze[d] {
            if best.get(&r.k).is_none_or(|b| rank(r) > rank(b)) {
                best.insert(r.k, r);
            }
        }
        let mut out: Vec<Vec<String>> = best.values().filter(|r| !r.del).map(|r| vec![r.k.to_string(), r.v.to_string(), amount(r.amount), day(d)]).collect();
        out.sort();
        out
    }

    fn rp_rows(&self) -> Vec<Vec<String>> {
        let mut out: Vec<Vec<String>> = self.rp.parts.values().flatten().cloned().collect();
        out.sort();
        out
    }

    /// A good run (committed or skipped) of `job` for `d`.
    fn good(&mut self, job: &str, d: usize) {
        self.last_run.insert((job.to_owned(), d), self.bronze[d].len());
    }

    /// Equal inputs, equal run keys; different inputs, different keys.
    fn run_key(&mut self, job: &str, d: usize, input: String, key: &str) -> Result<(), TestCaseError> {
        let id = (job.to_owned(), d, input);
        if let Some(k) = self.keys.get(&id) {
            prop_assert_eq!(k.as_str(), key, "{} {}: the same input as an earlier run, another run key", job, day(d));
            return Ok(());
        }
        if let Some(other) = self.inputs.get(key) {
            prop_assert!(false, "run key {} given to two inputs: {:?} and {:?}", key, other, id);
        }
        self.keys.insert(id.clone(), key.to_owned());
        self.inputs.insert(key.to_owned(), id);
        Ok(())
    }

    /// What a run of job `j` (0: replace_partition, then the merges) for
    /// `d` must do.
    fn predict(&self, j: usize, d: usize, force: bool) -> Predicted {
        if j == 0 {
            let rows = self.rp_day(d);
            match self.rp.parts.get(&d) {
                // The last recorded run had this input and the partition
                // holds its output (nothing else writes it): nothing to do.
                Some(now) if !force && *now == rows && self.rp.recorded.get(&d) == Some(&rows) => Predicted::RpSkip,
                now => Predicted::RpCommit { deleted: now.map_or(0, |n| n.len() as u64), rows },
            }
        } else {
            match self.merges[j - 1].plan(&self.bronze[d]) {
                Ok(plan) => Predicted::MergeCommit(plan),
                Err(why) => Predicted::MergeRefused(why),
            }
        }
    }

    /// The job's input for the run key check: what its source returns.
    fn input(&self, j: usize, d: usize) -> String {
        if j == 0 {
            format!("{:?}", self.rp_day(d))
        } else {
            let mut rows: Vec<(i64, i64, Option<i64>, usize, bool)> = self.bronze[d].iter().map(|r| (r.k, r.v, r.amount, r.pd, r.del)).collect();
            rows.sort();
            format!("{rows:?}")
        }
    }

    fn job_name(&self, j: usize) -> String {
        if j == 0 {
            "h_rp".to_owned()
        } else {
            self.merges[j - 1].name.clone()
        }
    }
}

/// What the model expects of one run.
#[derive(Debug)]
enum Predicted {
    RpSkip,
    RpCommit { rows: Vec<Vec<String>>, deleted: u64 },
    MergeCommit(MergePlan),
    MergeRefused(Refusal),
}

fn amount(a: Option<i64>) -> String {
    a.map_or("NULL".into(), |a| a.to_string())
}

/// Counts for the figures.
#[derive(Default, Debug)]
struct Stats {
    histories: u64,
    steps: u64,
    committed: u64,
    skipped: u64,
    refused: u64,
    injected: u64,
    backfills: u64,
    checks: u64,
    ledger_checks: u64,
    /// Committed replace_partition runs with their guards deferred (DuckDB's
    /// taps, PostgreSQL's scan beside the insert: first run of a day or
    /// `--force`, no `:run_key`, no partition exchange) and the others.
    rp_tapped: u64,
    rp_scanned: u64,
    /// Spark: runs failed on purpose after their overwrite (output
    /// written, no ledger row), and merges failed with their tombstones
    /// recorded before their rewrite.
    after_commit: u64,
    pending_tombstones: u64,
    /// Committed runs by strategy and the report's method.
    methods: BTreeMap<String, u64>,
    /// Merge jobs by options (both of each history).
    merge_jobs: BTreeMap<String, u64>,
}

impl Stats {
    fn add(&mut self, o: &Stats) {
        self.histories += o.histories;
        self.steps += o.steps;
        self.committed += o.committed;
        self.skipped += o.skipped;
        self.refused += o.refused;
        self.injected += o.injected;
        self.backfills += o.backfills;
        self.checks += o.checks;
        self.ledger_checks += o.ledger_checks;
        self.rp_tapped += o.rp_tapped;
        self.rp_scanned += o.rp_scanned;
        self.after_commit += o.after_commit;
        self.pending_tombstones += o.pending_tombstones;
        for (k, n) in &o.methods {
            *self.methods.entry(k.clone()).or_default() += n;
        }
        for (k, n) in &o.merge_jobs {
            *self.merge_jobs.entry(k.clone()).or_default() += n;
        }
    }
}

fn insert(db: &mut dyn fixpoint_core::Engine, d: usize, rows: &[Row]) {
    let values: Vec<String> = rows
        .iter()
        .map(|r| format!("(DATE '{}', {}, {}, {}, '{}', DATE '{}')", day(d), r.k, r.v, amount(r.amount), if r.del { "D" } else { "U" }, day(r.pd)))
        .collect();
    exec(db, &format!("INSERT INTO h.bronze VALUES {}", values.join(", ")));
}

fn table_rows(db: &mut dyn fixpoint_core::Engine, table: &str, cols: &str) -> Vec<Vec<String>> {
    let t = fixpoint_core::TableName::parse(table).unwrap();
    if db.table_columns(&t).unwrap().is_none() {
        return Vec::new();
    }
    rows(db, &format!("SELECT {cols} FROM {table}"))
}

/// Compares one run's result with the model's prediction, and applies it
/// to the model. `fault`: the point the run was told to fail at.
#[allow(clippy::too_many_arguments)]
fn settle(
    model: &mut Model,
    stats: &mut Stats,
    ctx: &Ctx,
    conf: &Conf,
    j: usize,
    d: usize,
    force: bool,
    fault: Option<FailPoint>,
    r: fixpoint_core::Result<RunReport>,
) -> Result<(), TestCaseError> {
    let name = model.job_name(j);
    let what = format!("{name} {}{}{}", day(d), if force { " --force" } else { "" }, fault.map_or(String::new(), |p| format!(" failing at {p}")));
    let input = model.input(j, d);
    match (model.predict(j, d, force), r) {
        (Predicted::RpSkip, Ok(rep)) => {
            prop_assert_eq!(rep.outcome.as_str(), "skipped", "{}: the model expects a skip (same input as its last run, the partition as recorded)", what);
            let held = model.rp.parts.get(&d).map_or(0, |p| p.len() as u64);
            prop_assert_eq!((rep.rows_unchanged, rep.method.as_str()), (held, "none"), "report of {}", what);
            stats.skipped += 1;
            model.run_key(&name, d, input, &rep.run_key)?;
            model.good(&name, d);
        }
        (Predicted::RpCommit { rows, deleted }, Ok(rep)) => {
            prop_assert_eq!(rep.outcome.as_str(), "committed", "{}: the model expects a commit (the input changed, or --force)", what);
            prop_assert!(fault.is_none(), "{}: committed past the fault point", what);
            let n = rows.len() as u64;
            let methods = ctx.plans.rp_methods(ctx.layout, conf);
            prop_assert_eq!(
                (rep.rows_inserted, rep.rows_deleted, rep.input_rows, rep.output_rows),
                (n, deleted, n, n),
                "report of {} (inserted, deleted, input rows, output rows)",
                what
            );
            prop_assert!(methods.contains(&rep.method.as_str()), "report of {}: method {:?}, expected one of {:?}", what, rep.method, methods);
            stats.committed += 1;
            *stats.methods.entry(format!("replace_partition: {}", rep.method)).or_default() += 1;
            let swapped = ctx.layout == Layout::Partitioned && !conf.delete_insert;
            if ctx.plans.defers_guards() && !swapped && !conf.rp_key && (force || !model.rp.parts.contains_key(&d)) {
                stats.rp_tapped += 1;
            } else {
                stats.rp_scanned += 1;
            }
            model.run_key(&name, d, input, &rep.run_key)?;
            model.rp.parts.insert(d, rows.clone());
            model.rp.recorded.insert(d, rows);
            model.rp.keys.insert(d, Some(rep.run_key.clone()));
            model.ledger.entry(name.clone()).or_default().push(rep.run_key);
            model.good(&name, d);
        }
        (Predicted::RpCommit { rows, .. }, Err(Error::Injected(p))) if fault == Some(p) => {
            stats.injected += 1;
            if ctx.plans.after_commit(p) {
                // Spark: the day is overwritten, the ledger row not written.
                stats.after_commit += 1;
                let key = model.keys.get(&(name.clone(), d, input)).cloned();
                model.rp.parts.insert(d, rows);
                model.rp.keys.insert(d, key);
            }
        }
        (Predicted::MergeCommit(plan), Err(Error::Injected(p))) if fault == Some(p) => {
            stats.injected += 1;
            let c = &plan.counts;
            let writes = c.inserted + c.updated + c.deleted > 0;
            let mm = &mut model.merges[j - 1];
            if ctx.plans.after_commit(p) {
                // Spark: the partitions are rewritten, the ledger row not written.
                stats.after_commit += 1;
                mm.unrecorded += c.inserted as i64 - c.deleted as i64;
                mm.target = plan.target;
                mm.tombs = plan.tombs;
                mm.seen.extend(plan.batch);
            } else if writes && ctx.plans.tombstones_before(p) {
                // Spark, Delta: the batch's tombstones are recorded before the rewrite.
                if mm.tombs != plan.tombs {
                    stats.pending_tombstones += 1;
                    mm.pending = true;
                }
                mm.tombs = plan.tombs;
            }
        }
        (Predicted::MergeCommit(plan), Ok(rep)) => {
            prop_assert_eq!(rep.outcome.as_str(), "committed", "{}: a merge always commits", what);
            let c = &plan.counts;
            // On Spark a merge that changes nothing writes nothing: it
            // never reaches the points of its rewrite.
            let passes = |p: FailPoint| ctx.plans.leased() && c.inserted + c.updated + c.deleted == 0 && matches!(p, FailPoint::AfterDelete | FailPoint::MidInsert);
            prop_assert!(fault.is_none_or(passes), "{}: committed past the fault point", what);
            prop_assert_eq!(
                (rep.input_rows, rep.rows_inserted, rep.rows_updated, rep.rows_deleted, rep.rows_unchanged, rep.duplicates_collapsed, rep.output_rows),
                (c.input_rows, c.inserted, c.updated, c.deleted, c.unchanged, c.collapsed, c.output_rows),
                "report of {} (input rows, inserted, updated, deleted, unchanged, duplicates collapsed, output rows)",
                what
            );
            let m = model.merges[j - 1].conf;
            prop_assert!(ctx.plans.merge_methods(&m, ctx.layout).contains(&rep.method.as_str()), "{}: method {:?} on {:?} with {:?}", what, rep.method, ctx.plans, m);
            stats.committed += 1;
            *stats.methods.entry(format!("merge ({}): {}", merge_label(&m), rep.method)).or_default() += 1;
            model.run_key(&name, d, input, &rep.run_key)?;
            let mm = &mut model.merges[j - 1];
            mm.target = plan.target;
            mm.tombs = plan.tombs;
            mm.seen.extend(plan.batch);
            model.ledger.entry(name.clone()).or_default().push(rep.run_key);
            model.good(&name, d);
        }
        (Predicted::MergeRefused(why), Err(e)) => match e {
            // A plan may reach the fault point before it finds what the
            // plan that explains it refuses: either way nothing changes.
            Error::Injected(p) if fault == Some(p) => stats.injected += 1,
            e => {
                let message = e.to_string();
                prop_assert_eq!(e.class(), ErrorClass::Data, "{}: the model expects a refusal ({:?}), got: {}", what, why, message);
                prop_assert!(message.contains(why.says()), "{}: the model expects a refusal ({:?}), got: {}", what, why, message);
                stats.refused += 1;
            }
        },
        (p, r) => {
            let got = match &r {
                Ok(rep) => format!("{} ({})", rep.outcome, rep.method),
                Err(e) => format!("error: {e}"),
            };
            prop_assert!(false, "{}: the model expects {:?}; the run gave {}", what, p, got);
        }
    }
    Ok(())
}

fn merge_label(m: &MergeConf) -> String {
    format!(
        "{}, {}, on_tie = {}",
        if m.partition { "partition" } else { "no partition" },
        if m.deleted { "deleted" } else { "no deleted" },
        if m.deterministic { "deterministic" } else { "error" }
    )
}

/// Every job runs for `d` with `opts`.
#[allow(clippy::too_many_arguments)]
fn run_all(
    db: &mut dyn fixpoint_core::Engine,
    jobs: &[Job],
    model: &mut Model,
    stats: &mut Stats,
    ctx: &Ctx,
    conf: &Conf,
    d: usize,
    opts: &RunOptions,
) -> Result<(), TestCaseError> {
    let fault = opts.fault.map(|(p, _)| p);
    for (j, job) in jobs.iter().enumerate() {
        let r = job.load_with(d_(d), db, opts);
        settle(model, stats, ctx, conf, j, d, opts.force, fault, r)?;
    }
    Ok(())
}

/// The targets equal the model.
fn check(db: &mut dyn fixpoint_core::Engine, conf: &Conf, model: &Model, stats: &mut Stats, after: &str) -> Result<(), TestCaseError> {
    stats.checks += 1;
    prop_assert_eq!(table_rows(db, "h.rp", "k, v, amount, dt"), model.rp_rows(), "replace_partition after {}", after);
    if conf.rp_key {
        // Each day's rows carry the key of the day's last committed run.
        // (A day whose key no run reported is left out.)
        let unknown: BTreeSet<String> = model.rp.keys.iter().filter(|(_, k)| k.is_none()).map(|(d, _)| day(*d)).collect();
        let expected: Vec<Vec<String>> = model
            .rp
            .parts
            .iter()
            .filter(|(d, rows)| !rows.is_empty() && model.rp.keys[d].is_some())
            .map(|(d, _)| vec![day(*d), format!("{:?}", model.rp.keys[d].as_ref().expect("known"))])
            .collect();
        let got: Vec<Vec<String>> = table_rows(db, "h.rp", "DISTINCT dt, load_id").into_iter().filter(|r| !unknown.contains(&r[0])).collect();
        prop_assert_eq!(got, expected, "replace_partition's load_id after {}", after);
    }
    for m in &model.merges {
        let expected = m.rows();
        prop_assert_eq!(table_rows(db, &m.table, "k, v, amount, dt, op"), expected.clone(), "merge {} ({}) after {}", m.name, merge_label(&m.conf), after);
        prop_assert!(
            m.pending || expected == m.contract_rows(),
            "the model of {} disagrees with the contract's winner-among-committed-rows after {} (a bug of the test's model): {:?} vs {:?}",
            m.name,
            after,
            expected,
            m.contract_rows()
        );
    }
    Ok(())
}

/// The ledger agrees with the model and the targets. The run keys (one
/// ledger row per committed run) always; with `full`, each day's latest
/// replace_partition entry against the partition's fingerprint too.
fn check_ledger(db: &mut dyn fixpoint_core::Engine, conf: &Conf, model: &Model, stats: &mut Stats, after: &str, full: bool) -> Result<(), TestCaseError> {
    stats.ledger_checks += 1;
    let all = ledger::entries(db, None, None, None).unwrap();
    let mut got: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for e in &all {
        got.entry(e.job.clone()).or_default().push(e.run_key.clone());
    }
    for keys in got.values_mut() {
        keys.sort();
    }
    let mut expected = model.ledger.clone();
    for keys in expected.values_mut() {
        keys.sort();
    }
    prop_assert_eq!(got, expected, "ledger rows (one per committed run, none for a failed, refused or skipped one) after {}", after);
    // merge: the ledger's inserts minus deletes are the target's rows.
    for m in &model.merges {
        let net: i64 = all.iter().filter(|e| e.job == m.name).map(|e| e.rows_inserted as i64 - e.rows_deleted as i64).sum();
        prop_assert_eq!(net + m.unrecorded, m.target.len() as i64, "ledger of {} after {}", m.name, after);
    }
    if !full {
        return Ok(());
    }
    // replace_partition: each day's latest ledger entry describes the
    // partition as it is; a day that never ran has no entry.
    let exclude: &[&str] = if conf.rp_key { &["load_id"] } else { &[] };
    for d in 0..DAYS {
        let latest = all.iter().find(|e| e.job == "h_rp" && e.run_date == day(d));
        match (latest, model.rp.recorded.contains_key(&d)) {
            // On Spark a run that failed after its overwrite left other rows than recorded.
            (Some(_), true) if model.rp.parts.get(&d) != model.rp.recorded.get(&d) => {}
            (Some(e), true) => {
                let fp = day_fp(db, "h.rp", &day(d), exclude);
                prop_assert_eq!((e.output_rows, e.output_checksum.clone()), (fp.rows, fp.checksum.clone()), "ledger of {} after {}", day(d), after);
            }
            (None, false) => {}
            (e, ran) => prop_assert!(false, "ledger of {} after {}: entry {:?}, ran {}", day(d), after, e.map(|e| &e.run_key), ran),
        }
    }
    Ok(())
}

fn targets(db: &mut dyn fixpoint_core::Engine, model: &Model) -> Vec<Vec<Vec<String>>> {
    let mut out = vec![table_rows(db, "h.rp", "*")];
    for m in &model.merges {
        out.push(table_rows(db, &m.table, "*"));
    }
    out
}

fn history(db: &mut dyn fixpoint_core::Engine, ctx: &Ctx, conf: &Conf, steps: &[Step], stats: &mut Stats) -> Result<(), TestCaseError> {
    exec(db, "DROP SCHEMA IF EXISTS h CASCADE;\nDROP SCHEMA IF EXISTS fixpoint CASCADE");
    exec(db, &setup(conf, ctx));
    let mut jobs = vec![job(&rp_toml(conf, ctx.layout))];
    jobs.extend(conf.merges.iter().enumerate().map(|(i, m)| job(&merge_toml(i + 1, m))));
    let mut model = Model::new(conf, ctx);
    stats.histories += 1;
    for m in &conf.merges {
        *stats.merge_jobs.entry(merge_label(m)).or_default() += 1;
    }
    for (i, s) in steps.iter().enumerate() {
        stats.steps += 1;
        match s {
            Step::Deliver { day: d, rows } => {
                insert(db, *d, rows);
                model.bronze[*d].extend(rows.iter().cloned());
            }
            Step::Redeliver { day: d } => {
                let again = model.bronze[*d].clone();
                if !again.is_empty() {
                    insert(db, *d, &again);
                    model.bronze[*d].extend(again);
                }
            }
            Step::Echo { from, to } => {
                let again = model.bronze[*from].clone();
                if !again.is_empty() {
                    insert(db, *to, &again);
                    model.bronze[*to].extend(again);
                }
            }
            Step::Run { day: d } => run_all(db, &jobs, &mut model, stats, ctx, conf, *d, &RunOptions::default())?,
            Step::Force { day: d } => run_all(db, &jobs, &mut model, stats, ctx, conf, *d, &RunOptions { force: true, ..RunOptions::default() })?,
            Step::Fail { day: d, point } => {
                // Each run fails at the point (nothing changes), or has
                // nothing to do and is skipped before reaching it, or (a
                // merge) is refused before it: the model says which.
                let opts = RunOptions { fault: Some((FailPoint::ALL[*point], FaultAction::Error)), ..RunOptions::default() };
                run_all(db, &jobs, &mut model, stats, ctx, conf, *d, &opts)?;
            }
            Step::Backfill { from, to, fail, force } => {
                stats.backfills += 1;
                let dates: Vec<_> = (*from..=*to).map(d_).collect();
                let fault_day = fail.map(|(f, _)| *from + f % (to - from + 1));
                let point = fail.map(|(_, p)| FailPoint::ALL[p]);
                let opts = BackfillOptions {
                    run: RunOptions { force: *force, fault: point.map(|p| (p, FaultAction::Error)), ..RunOptions::default() },
                    keep_going: false,
                    fault_date: fault_day.map(d_),
                };
                for (j, job) in jobs.iter().enumerate() {
                    let mut stopped = false;
                    for (o, n) in backfill(job, &dates, db, &opts, |_| {}).into_iter().zip(*from..=*to) {
                        let fault = if fault_day == Some(n) { point } else { None };
                        match o {
                            DateOutcome::Done(r) => {
                                prop_assert!(!stopped, "no date runs after a failed one");
                                settle(&mut model, stats, ctx, conf, j, n, *force, fault, Ok(r))?;
                            }
                            DateOutcome::Failed(_, e) => {
                                prop_assert!(!stopped, "no date runs after a failed one");
                                stopped = true;
                                settle(&mut model, stats, ctx, conf, j, n, *force, fault, Err(e))?;
                            }
                            DateOutcome::NotRun(_) => prop_assert!(stopped, "a date is only left out after a failure"),
                        }
                    }
                }
            }
        }
        let after = format!("step {i}: {s:?}");
        check(db, conf, &model, stats, &after)?;
        // The ledger's rows after every step; its fingerprints after every
        // step of the quick run (and of a reproduction), after the last
        // step (below) in long runs.
        check_ledger(db, conf, &model, stats, &after, every_step())?;
    }
    check_ledger(db, conf, &model, stats, "the last step", true)?;
    // Every (job, date) whose input has not changed since its last good
    // run, run once more: nothing changes.
    let before = targets(db, &model);
    let again: Vec<(String, usize)> =
        model.last_run.iter().filter(|((_, d), n)| model.bronze[*d].len() == **n).map(|(k, _)| k.clone()).collect();
    for (name, d) in again {
        let j = jobs.iter().position(|j| j.name == name).expect("a job");
        let r = jobs[j].load(d_(d), db);
        settle(&mut model, stats, ctx, conf, j, d, false, None, r)?;
    }
    prop_assert_eq!(targets(db, &model), before, "rerunning every date changed the targets");
    check(db, conf, &model, stats, "the final reruns")?;
    check_ledger(db, conf, &model, stats, "the final reruns", true)
}

fn long() -> bool {
    std::env::var_os("FIXPOINT_HISTORIES").is_some()
}

/// Whether the ledger's fingerprints are checked after every step: in the
/// quick run, and when reproducing a seed.
fn every_step() -> bool {
    !long() || std::env::var_os("FIXPOINT_HISTORY_SEED").is_some()
}

fn d_(i: usize) -> fixpoint_core::RunDate {
    d(&day(i))
}

/// How many histories: `FIXPOINT_HISTORIES`, or `quick` in the normal suite.
fn cases(quick: u32) -> u32 {
    std::env::var("FIXPOINT_HISTORIES").ok().and_then(|v| v.parse().ok()).unwrap_or(quick)
}

/// Worker threads for the histories: `FIXPOINT_HISTORY_THREADS`, else one
/// in the quick run and one per core in a long run. Each thread has its own
/// database and its own share of the histories.
fn threads() -> u32 {
    let default = if long() { std::thread::available_parallelism().map_or(1, |n| n.get() as u32) } else { 1 };
    std::env::var("FIXPOINT_HISTORY_THREADS").ok().and_then(|v| v.parse().ok()).unwrap_or(default).max(1)
}

/// The first worker's seed: `FIXPOINT_HISTORY_SEED`, else a fresh one
/// (worker `w` takes the seed plus `w`).
fn base_seed() -> u64 {
    std::env::var("FIXPOINT_HISTORY_SEED").ok().and_then(|v| v.parse().ok()).unwrap_or_else(|| {
        use std::hash::{BuildHasher, Hasher};
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u128(std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |t| t.as_nanos()));
        h.finish()
    })
}

fn run_histories(e: &(dyn EngineUnderTest + Sync), engine: &str, test: &str, ctx: Ctx, quick: u32) {
    let cases = cases(quick);
    // Spark's one catalog holds one history at a time.
    let workers = if ctx.plans == Plans::Spark { 1 } else { threads().min(cases.max(1)) };
    let seed = base_seed();
    eprintln!("histories {engine}: seed {seed}, {cases} histories on {workers} thread(s)");
    let started = Instant::now();
    let done = std::sync::atomic::AtomicU64::new(0);
    let results: Vec<(Stats, Result<(), String>)> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..workers)
            .map(|w| {
                // The first workers take one history more when the count does not divide.
                let share = cases / workers + u32::from(w < cases % workers);
                let seed = seed.wrapping_add(u64::from(w));
                let done = &done;
                let ctx: Ctx = ctx;
                scope.spawn(move || {
                    let db = RefCell::new(e.fresh());
                    if engine.starts_with("duckdb") {
                        // Tiny statements: one thread per database spares the scheduler's hand-offs.
                        exec(db.borrow_mut().as_mut(), "SET threads = 1");
                    }
                    let stats = RefCell::new(Stats::default());
                    // A failure is shrunk to a minimal history for at most 10 minutes.
                    let config =
                        Config { cases: share, failure_persistence: None, rng_seed: RngSeed::Fixed(seed), max_shrink_time: 600_000, ..Config::default() };
                    let mut runner = TestRunner::new(config);
                    let result = runner.run(&(conf(), proptest::collection::vec(step(), 1..11)), |(conf, steps)| {
                        let r = history(db.borrow_mut().as_mut(), &ctx, &conf, &steps, &mut stats.borrow_mut());
                        let n = done.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
                        if long() && n % 500 == 0 {
                            eprintln!("histories {engine}: {n} so far, {:.0} s", started.elapsed().as_secs_f64());
                        }
                        r
                    });
                    let result = result.map_err(|e| {
                        format!(
                            "{e}\nseed {seed} (worker {w} of {workers}, {share} histories); run it again with:\n  \
                             FIXPOINT_HISTORY_SEED={seed} FIXPOINT_HISTORY_THREADS=1 FIXPOINT_HISTORIES={share} \
                             cargo test -p fixpoint-scenarios --test histories {test} -- --nocapture"
                        )
                    });
                    (stats.into_inner(), result)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().expect("a history worker panicked")).collect()
    });
    let mut s = Stats::default();
    for (w, _) in &results {
        s.add(w);
    }
    eprintln!(
        "histories {engine}: {} histories run ({} asked for, {workers} thread(s), seed {seed}), {} steps, {} runs committed, {} skipped, {} refused as the model predicted, {} failed on purpose, {} backfills, {} state checks, {} ledger checks, {:.1} s",
        s.histories,
        cases,
        s.steps,
        s.committed,
        s.skipped,
        s.refused,
        s.injected,
        s.backfills,
        s.checks,
        s.ledger_checks,
        started.elapsed().as_secs_f64()
    );
    if ctx.plans == Plans::TwoStatements {
        eprintln!(
            "histories {engine}: replace_partition committed where the tapped insert declined (guards scanned after the delete) {}, with the guard scan {}",
            s.rp_tapped, s.rp_scanned
        );
    } else if ctx.plans == Plans::PgOneStatement {
        eprintln!("histories {engine}: replace_partition committed with the guard scan beside the insert {}, with the guard scan first {}", s.rp_tapped, s.rp_scanned);
    } else {
        eprintln!("histories {engine}: replace_partition committed on the tapped path {}, with the guard scan {}", s.rp_tapped, s.rp_scanned);
    }
    if ctx.plans.leased() {
        eprintln!(
            "histories {engine}: {} runs failed on purpose after their overwrite (output written, no ledger row), {} merges failed with their tombstones recorded",
            s.after_commit, s.pending_tombstones
        );
    }
    for (method, n) in &s.methods {
        eprintln!("histories {engine}:   {n:>6} committed: {method}");
    }
    // Both replace_partition plans of Spark are reached (the observed
    // write, and the steps that scan before and after it).
    if ctx.plans == Plans::Spark && s.histories >= 10 {
        for m in ["replace_partition: partition overwrite, observed", "replace_partition: partition overwrite"] {
            assert!(s.methods.get(m).is_some_and(|n| *n > 0), "histories {engine}: no run committed with {m:?} in {} histories", s.histories);
        }
    }
    for (m, n) in &s.merge_jobs {
        eprintln!("histories {engine}:   {n:>6} merge jobs: {m}");
    }
    for (_, r) in results {
        if let Err(e) = r {
            panic!("{engine}: {e}");
        }
    }
}

/// DuckDB: merges in one statement where eligible.
#[test]
fn duckdb_histories_match_the_model() {
    run_histories(&DuckDbUnderTest, "duckdb", "duckdb_histories_match_the_model", Ctx { plans: Plans::OneStatement, layout: Layout::Plain }, 50);
}

/// DuckDB, its merges never one statement and its tapped day insert
/// declined: the two-statement merge where one statement would run, and
/// `replace_partition`'s fallback where the tapped insert would (its guards,
/// deferred to the insert, scanned after the delete, then the plain insert).
struct DuckDbTwoStatementsUntapped;

impl EngineUnderTest for DuckDbTwoStatementsUntapped {
    fn fresh(&self) -> Box<dyn fixpoint_core::engine::Engine> {
        Box::new(fixpoint_duckdb::DuckDb::open_in_memory().expect("in-memory duckdb").without_one_statement_merge().without_tapped_day_insert())
    }
}

/// DuckDB: merges in two statements where one would run; the day insert
/// never tapped.
#[test]
fn duckdb_two_statement_histories_match_the_model() {
    run_histories(
        &DuckDbTwoStatementsUntapped,
        "duckdb (two statements)",
        "duckdb_two_statement_histories_match_the_model",
        Ctx { plans: Plans::TwoStatements, layout: Layout::Plain },
        50,
    );
}

/// DuckDB without taps: the merge's join plan, replace_partition's guard scan.
#[test]
fn duckdb_join_plan_histories_match_the_model() {
    run_histories(
        &DuckDbWithoutTapsUnderTest,
        "duckdb (without taps)",
        "duckdb_join_plan_histories_match_the_model",
        Ctx { plans: Plans::Join, layout: Layout::Plain },
        50,
    );
}

/// PostgreSQL, plain targets: merges in one statement where eligible.
#[test]
fn postgres_histories_match_the_model() {
    if let Some(pg) = PgUnderTest::get() {
        run_histories(&pg, "postgres", "postgres_histories_match_the_model", Ctx { plans: Plans::PgOneStatement, layout: Layout::Plain }, 50);
    }
}

/// PostgreSQL, the merges' targets keyed by a primary key: their
/// one-statement merges update on the key.
#[test]
fn postgres_keyed_histories_match_the_model() {
    if let Some(pg) = PgUnderTest::get() {
        run_histories(&pg, "postgres (keyed targets)", "postgres_keyed_histories_match_the_model", Ctx { plans: Plans::PgOneStatement, layout: Layout::Keyed }, 50);
    }
}

/// PostgreSQL, plain targets, its one-statement merge off: every merge
/// takes the join plan.
#[test]
fn postgres_join_plan_histories_match_the_model() {
    if let Some(pg) = PgUnderTest::get() {
        run_histories(
            &pg.portable(),
            "postgres (join plan)",
            "postgres_join_plan_histories_match_the_model",
            Ctx { plans: Plans::Join, layout: Layout::Plain },
            50,
        );
    }
}

/// PostgreSQL, targets partitioned by day: partition exchange (or
/// `swap = "delete_insert"`), merges moving rows between partitions.
#[test]
fn postgres_partitioned_histories_match_the_model() {
    if let Some(pg) = PgUnderTest::get() {
        run_histories(
            &pg,
            "postgres (partitioned targets)",
            "postgres_partitioned_histories_match_the_model",
            Ctx { plans: Plans::PgOneStatement, layout: Layout::Partitioned },
            50,
        );
    }
}

/// Delta: replace_partition replaces the day's files; merges rewrite the
/// partitions they touch, or the whole (partitioned) table; each run one
/// commit with its ledger row.
#[cfg(feature = "delta")]
mod delta {
    use super::*;

    #[test]
    fn delta_histories_match_the_model() {
        run_histories(&DeltaUnderTest, "delta", "delta::delta_histories_match_the_model", Ctx { plans: Plans::Delta, layout: Layout::Plain }, 50);
    }

    /// The same on S3 (the local S3-compatible server).
    #[test]
    fn delta_s3_histories_match_the_model() {
        if let Some(s3) = DeltaS3UnderTest::get() {
            run_histories(&s3, "delta-s3", "delta::delta_s3_histories_match_the_model", Ctx { plans: Plans::Delta, layout: Layout::Plain }, 10);
        }
    }
}

/// Spark: replace_partition overwrites the day; merges rewrite the
/// partitions they touch, or the whole (partitioned) table.
#[cfg(feature = "spark")]
mod spark {
    use super::*;

    #[test]
    fn spark_histories_match_the_model() {
        if let Some(spark) = SparkUnderTest::get() {
            let _one_at_a_time = spark.exclusive();
            run_histories(&spark, "spark", "spark::spark_histories_match_the_model", Ctx { plans: Plans::Spark, layout: Layout::Plain }, spark_quick());
        }
    }

    /// Histories in the default suite. A Spark history takes about a
    /// minute on a 2-core machine (each run is 10–20 Spark jobs), so the
    /// default suite runs 20 (CI's budget); `FIXPOINT_HISTORIES` sets the
    /// count of a long run, as on the other engines.
    fn spark_quick() -> u32 {
        20
    }
}
