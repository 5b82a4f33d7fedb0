//! `prove`: the seeds' test, said out loud and run. Fingerprint the job's
//! scope, run the job N times and compare; fail it at every step boundary and
//! check the old state survives and the rerun converges.

use serde::Serialize;

use crate::job::date::RunDate;
use crate::tools::diff::Row;
use crate::engine::measure::{fingerprint, Filter, Scope};
use crate::engine::{Column, Engine};
use crate::error::{Error, FailPoint, Result};
use crate::fingerprint::{Fingerprint, Method};
use crate::job::ident::quote_ident;
use crate::run::ledger;
use crate::run::protocol::{FaultAction, RunOptions};
use crate::job::spec::{Job, Strategy};
use crate::job::sql::Sql;

/// What to prove.
#[derive(Debug, Clone)]
pub struct ProveOptions {
    /// How many runs (at least 2).
    pub runs: usize,
    /// Also fail the run at every step boundary.
    pub crash: bool,
    /// Run the mutation check in a sandbox (on by default in the CLI).
    pub mutate: bool,
    /// Pick the input row to change: `column=value` conditions on the
    /// source's first table.
    pub mutate_key: Vec<(String, String)>,
}

/// One run's evidence. In JSON: `run`, `run_key`, `output` (the scope's
/// fingerprint after the run: `rows`, `checksum`, `kind`) and
/// `differs_from_first` (sample rows: `side`, `row`).
#[derive(Debug, Clone)]
pub struct RunEvidence {
    /// 1-based run number.
    pub run: usize,
    /// The run key.
    pub run_key: String,
    /// Rows in the scope after the run.
    pub rows: u64,
    /// Checksum of the scope after the run.
    pub checksum: String,
    /// How the scope's fingerprint was made.
    pub kind: String,
    /// Rows that differ from run 1's result (both directions), as samples:
    /// `only after this run: {column: value, …}` or `only after run 1: {…}`.
    pub differs_from_first: Vec<String>,
}

impl Serialize for RunEvidence {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        let mut st = s.serialize_struct("RunEvidence", 4)?;
        st.serialize_field("run", &self.run)?;
        st.serialize_field("run_key", &self.run_key)?;
        st.serialize_field("output", &Fingerprint { kind: self.kind.clone(), rows: self.rows, checksum: self.checksum.clone() })?;
        st.serialize_field("differs_from_first", &samples(&self.differs_from_first))?;
        st.end()
    }
}

/// One sample row in JSON: `{"side": "before" | "after", "row": {…}}`:
/// a row only in the earlier result (run 1's, or before the change) or only
/// in the later one.
#[derive(Serialize)]
struct SampleJson<'a> {
    side: &'a str,
    row: Row,
}

/// Sample rows written `label: {column: value, …}` as [`SampleJson`].
fn samples(texts: &[String]) -> Vec<SampleJson<'static>> {
    texts
        .iter()
        .map(|t| match Row::parse_labeled(t) {
            Some((label, row)) => SampleJson { side: side(label), row },
            None => SampleJson { side: if t.starts_with("before") || t.starts_with("only after run 1") { "before" } else { "after" }, row: Row::unread(t) },
        })
        .collect()
}

/// The side of a sample's label: `before` (only in the earlier result) or
/// `after`.
fn side(label: &str) -> &'static str {
    match label {
        "before" | "only after run 1" => "before",
        _ => "after",
    }
}

/// One crash point's evidence.
#[derive(Debug, Clone, Serialize)]
pub struct CrashEvidence {
    /// The step boundary.
    pub point: FailPoint,
    /// The scope kept its previous fingerprint.
    pub previous_kept: bool,
    /// The ledger shows no run from the failed attempt.
    pub ledger_clean: bool,
    /// The rerun reached the clean fingerprint.
    pub converged: bool,
}

/// The proof. In JSON (see docs/json.md): `before` is null when the target
/// did not exist yet, `crash` null without `--crash`, `order` and
/// `mutation` null when those checks did not run; sample rows are objects.
#[derive(Debug, Clone)]
pub struct Proof {
    /// Job name.
    pub job: String,
    /// Run date.
    pub run_date: String,
    /// The job's strategy.
    pub strategy: String,
    /// What the scope is.
    pub scope: String,
    /// The scope before the first run.
    pub before: Fingerprint,
    /// Every run.
    pub runs: Vec<RunEvidence>,
    /// Every crash point (with `crash`).
    pub crash: Vec<CrashEvidence>,
    /// The order check (with `mutate`).
    pub order: Option<crate::tools::mutate::OrderEvidence>,
    /// The mutation check (with `mutate`).
    pub mutation: Option<crate::tools::mutate::MutationEvidence>,
    /// Whether everything held.
    pub proved: bool,
    /// What failed, one sentence each.
    pub failures: Vec<String>,
    /// The verdict in one sentence.
    pub verdict: String,
}

/// The `kind` of [`Proof::before`] when the target did not exist yet.
pub const NO_TABLE: &str = "none";

impl Serialize for Proof {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        let mut st = s.serialize_struct("Proof", 12)?;
        st.serialize_field("job", &self.job)?;
        st.serialize_field("run_date", &self.run_date)?;
        st.serialize_field("strategy", &self.strategy)?;
        st.serialize_field("scope", &self.scope)?;
        st.serialize_field("before", &(self.before.kind != NO_TABLE).then_some(&self.before))?;
        st.serialize_field("runs", &self.runs)?;
        st.serialize_field("crash", &(!self.crash.is_empty()).then_some(&self.crash))?;
        st.serialize_field("order", &self.order.as_ref().map(order_json))?;
        st.serialize_field("mutation", &self.mutation.as_ref().map(|m| mutation_json(m, self.strategy == "merge")))?;
        st.serialize_field("proved", &self.proved)?;
        st.serialize_field("failures", &self.failures)?;
        st.serialize_field("verdict", &self.verdict)?;
        st.end()
    }
}

/// [`crate::tools::mutate::OrderEvidence`] in JSON, its samples as rows.
#[derive(Serialize)]
struct OrderJson<'a> {
    outcome: &'a str,
    output_rows_removed: u64,
    output_rows_added: u64,
    sample: Vec<SampleJson<'static>>,
    message: &'a str,
}

fn order_json(o: &crate::tools::mutate::OrderEvidence) -> OrderJson<'_> {
    OrderJson {
        outcome: &o.outcome,
        output_rows_removed: o.output_rows_removed,
        output_rows_added: o.output_rows_added,
        sample: samples(&o.sample),
        message: &o.message,
    }
}

/// `t`, or `None` when it is empty (a value the check did not get to).
fn non_empty(t: &str) -> Option<&str> {
    (!t.is_empty()).then_some(t)
}

/// [`crate::tools::mutate::MutationEvidence`] in JSON: the input row and the
/// samples as rows; what the check did not get to (no row picked) null;
/// `output_keys_changed` only for a merge job.
#[derive(Serialize)]
struct MutationJson<'a> {
    outcome: &'a str,
    table: Option<&'a str>,
    column: Option<&'a str>,
    row: Option<Row>,
    change: Option<&'a str>,
    candidates_tried: usize,
    output_rows_removed: u64,
    output_rows_added: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    output_keys_changed: Option<Option<u64>>,
    sample: Vec<SampleJson<'static>>,
    message: &'a str,
}

fn mutation_json(m: &crate::tools::mutate::MutationEvidence, merge: bool) -> MutationJson<'_> {
    MutationJson {
        outcome: &m.outcome,
        table: non_empty(&m.table),
        column: non_empty(&m.column),
        row: (!m.row.is_empty()).then(|| Row::parse_assignments(&m.row).unwrap_or_else(|| Row::unread(&m.row.join(", ")))),
        change: non_empty(&m.change),
        candidates_tried: m.candidates_tried,
        output_rows_removed: m.output_rows_removed,
        output_rows_added: m.output_rows_added,
        output_keys_changed: merge.then_some(m.output_keys_changed),
        sample: samples(&m.sample),
        message: &m.message,
    }
}

fn scope_of<'a>(job: &'a Job, run_date: RunDate) -> (Scope<'a>, String) {
    match (job.strategy, job.partition.as_deref()) {
        (Strategy::ReplacePartition, Some(p)) => (
            Scope::Table { table: &job.target, filter: Some(Filter::DateEquals(p, run_date.date())) },
            format!("{} where {p} = {run_date}", job.target),
        ),
        _ => (Scope::Table { table: &job.target, filter: None }, format!("all of {}", job.target)),
    }
}

fn scope_rows_sql(job: &Job, run_date: RunDate, cols: &[Column]) -> Sql {
    let (scope, _) = scope_of(job, run_date);
    let mut sql = Sql::new();
    sql.push("SELECT ").push(&cols.iter().map(|c| format!("s.{}", quote_ident(&c.name))).collect::<Vec<_>>().join(", ")).push(" FROM ");
    scope.write_from(&mut sql, "s");
    sql
}

fn scope_fp(job: &Job, run_date: RunDate, engine: &mut dyn Engine, cols: &[Column]) -> Result<Fingerprint> {
    let (scope, _) = scope_of(job, run_date);
    fingerprint(engine, Method::Native, &scope, cols)
}

fn compared_cols(job: &Job, engine: &mut dyn Engine) -> Result<Vec<Column>> {
    Ok(engine.table_columns(&job.target)?.unwrap_or_default().into_iter().filter(|c| !job.metadata.contains(&c.name)).collect())
}

/// Rows of the scope now that are not in the snapshot, and the other way
/// round (at most 5 of each), as display strings.
fn differences(job: &Job, run_date: RunDate, engine: &mut dyn Engine, cols: &[Column], snapshot: &str) -> Result<Vec<String>> {
    let mut out = Vec::new();
    for (label, first_is_now) in [("only after this run", true), ("only after run 1", false)] {
        let now = scope_rows_sql(job, run_date, cols);
        let mut sql = Sql::new();
        if first_is_now {
            sql.push("SELECT * FROM (");
            sql.text.push_str(&now.text);
            sql.params.extend(now.params);
            sql.push(&format!(" EXCEPT ALL SELECT * FROM {snapshot}) AS d LIMIT 5"));
        } else {
            sql.push(&format!("SELECT * FROM (SELECT * FROM {snapshot} EXCEPT ALL "));
            sql.text.push_str(&now.text);
            sql.params.extend(now.params);
            sql.push(") AS d LIMIT 5");
        }
        let rows = engine.query(&sql)?;
        for r in rows.rows {
            let row: Vec<String> = rows.columns.iter().zip(&r).map(|(c, v)| format!("{c}: {}", v.display())).collect();
            out.push(format!("{label}: {{{}}}", row.join(", ")));
        }
    }
    Ok(out)
}

/// Proves a job idempotent for one date: runs it `runs` times (each a real
/// rewrite), compares the scope's fingerprint after each, and with `crash`
/// fails it at every step boundary. Every option is checked before the
/// first run: a refused proof has changed nothing (no run, no ledger row).
pub fn prove(job: &Job, run_date: RunDate, engine: &mut dyn Engine, opts: &ProveOptions) -> Result<Proof> {
    if opts.runs < 2 {
        return Err(Error::argument(format!("--runs {}: a proof needs at least 2 runs", opts.runs), Some("the default is 2")));
    }
    if !opts.mutate && !opts.mutate_key.is_empty() {
        return Err(Error::argument("--mutate-key with --no-mutate: the mutation check is off", Some("drop one of them")));
    }
    if opts.mutate {
        crate::tools::mutate::validate_mutate_key(job, run_date, engine, &opts.mutate_key)?;
    }
    // The first run's rows, for showing what a later run changed: a
    // temporary table under a name of this proof's own (never one that
    // might be the user's).
    let snapshot = quote_ident(&format!("__fixpoint_prove_first_{}", crate::tools::mutate::unique_suffix(&job.name, run_date)));
    let (_, scope_text) = scope_of(job, run_date);
    let cols = compared_cols(job, engine)?;
    let before = if cols.is_empty() {
        Fingerprint { kind: NO_TABLE.into(), rows: 0, checksum: "(no table yet)".into() }
    } else {
        scope_fp(job, run_date, engine, &cols)?
    };
    let force = RunOptions { force: true, fault: None, no_wait: false, ..RunOptions::default() };
    // The runs, with the snapshot dropped whatever their outcome: on Spark
    // it is a table of its own, which outlives the session.
    let checked = (|| -> Result<_> {
        let mut runs = Vec::new();
        let mut failures = Vec::new();
        let mut first: Option<Fingerprint> = None;
        for i in 1..=opts.runs {
            let report = job.load_with(run_date, engine, &force)?;
            let cols = compared_cols(job, engine)?;
            let fp = scope_fp(job, run_date, engine, &cols)?;
            let mut differs = Vec::new();
            match &first {
                None => {
                    let rows = scope_rows_sql(job, run_date, &cols);
                    crate::tools::snapshot(engine, &snapshot, &rows)?;
                    first = Some(fp.clone());
                }
                Some(f) if *f != fp => {
                    differs = differences(job, run_date, engine, &cols, &snapshot)?;
                    failures.push(format!(
                        "run {i} left {} rows with checksum {}, run 1 left {} rows with checksum {}: not idempotent",
                        fp.rows, fp.checksum, f.rows, f.checksum
                    ));
                }
                Some(_) => {}
            }
            runs.push(RunEvidence { run: i, run_key: report.run_key, rows: fp.rows, checksum: fp.checksum, kind: fp.kind, differs_from_first: differs });
        }
        let clean = first.expect("runs >= 2");

        let mut crash = Vec::new();
        if opts.crash {
            let cols = compared_cols(job, engine)?;
            for point in FailPoint::ALL {
                let previous = scope_fp(job, run_date, engine, &cols)?;
                let ledger_before = ledger::entries(engine, Some(&job.name), Some(run_date), None)?.len();
                let faulty = RunOptions { force: true, fault: Some((point, FaultAction::Error)), no_wait: false, ..RunOptions::default() };
                let failed_as_injected = matches!(job.load_with(run_date, engine, &faulty), Err(Error::Injected(p)) if p == point);
                let previous_kept = failed_as_injected && scope_fp(job, run_date, engine, &cols)? == previous;
                let ledger_clean = ledger::entries(engine, Some(&job.name), Some(run_date), None)?.len() == ledger_before;
                job.load_with(run_date, engine, &force)?;
                let converged = scope_fp(job, run_date, engine, &cols)? == clean;
                if !(previous_kept && ledger_clean && converged) {
                    failures.push(format!(
                        "a failure at {point} {}",
                        if !previous_kept {
                            "did not leave the previous contents in place"
                        } else if !ledger_clean {
                            "left a ledger row"
                        } else {
                            "was not repaired by the rerun"
                        }
                    ));
                }
                crash.push(CrashEvidence { point, previous_kept, ledger_clean, converged });
            }
        }
        Ok((runs, failures, clean, crash))
    })();
    let dropped = crate::tools::drop_snapshot(engine, &snapshot);
    let (runs, mut failures, clean, crash) = checked?;
    dropped?;
    let (order, mutation) = if opts.mutate {
        let s = crate::tools::mutate::sandbox_checks(job, run_date, engine, &opts.mutate_key)?;
        (s.order, Some(s.mutation))
    } else {
        (None, None)
    };
    if let Some(o) = order.as_ref().filter(|o| o.outcome == "failed") {
        failures.push(format!("the order check failed: {}", o.message));
    }
    if let Some(m) = mutation.as_ref().filter(|m| m.outcome == "failed") {
        failures.push(format!("the mutation check failed: {}", m.message));
    }
    let proved = failures.is_empty();
    let verdict = if proved {
        format!(
            "{} runs{} left the same {} rows with checksum {}: the diff is empty.{}",
            opts.runs,
            if opts.crash { format!(" and {} injected failures", crash.len()) } else { String::new() },
            clean.rows,
            clean.checksum,
            {
                let order = match &order {
                    Some(o) if o.outcome == "passed" => format!(" Order: {}.", o.message),
                    Some(o) => format!(" Order check {}: {}.", o.outcome, o.message),
                    None => String::new(),
                };
                let mutation = match &mutation {
                    Some(m) if m.outcome == "passed" => format!(" Mutation: {}.", m.message),
                    Some(m) => format!(" Mutation check inconclusive: {}.", m.message),
                    None => String::new(),
                };
                order + &mutation
            }
        )
    } else {
        format!("not idempotent: {}", failures[0])
    };
    Ok(Proof {
        job: job.name.clone(),
        run_date: run_date.to_string(),
        strategy: job.strategy.name().into(),
        scope: scope_text,
        before,
        runs,
        crash,
        order,
        mutation,
        proved,
        failures,
        verdict,
    })
}
