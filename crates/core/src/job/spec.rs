//! The job file (TOML): what a job loads, where, and how.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::job::ident::{is_plain_ident, TableName};
use crate::job::sql::SourceTemplate;

/// How a job changes its target.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Strategy {
    /// Replace the run date's partition: delete + insert in one transaction.
    ReplacePartition,
    /// Merge on a natural key; the newest version wins.
    Merge,
    /// Keep every version of each key as a row with a validity interval
    /// (slowly changing dimension, type 2).
    History,
}

impl Strategy {
    /// The name in job files.
    pub fn name(self) -> &'static str {
        match self {
            Strategy::ReplacePartition => "replace_partition",
            Strategy::Merge => "merge",
            Strategy::History => "history",
        }
    }
}

/// What to do with two different source rows of one key and one version.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum OnTie {
    /// Fail the run, naming the key and both rows.
    #[default]
    Error,
    /// Pick the winner by a total order over the row's values.
    Deterministic,
}

/// How `replace_partition` replaces the day where the engine could swap
/// the day's partition in whole (PostgreSQL, a target declaratively
/// partitioned by the job's `partition` column). The job file's `swap`.
///
/// Not part of the job's definition hash: both write the same rows (the
/// same output fingerprint, the same run key); they differ in what a
/// concurrent reader can see, not in what the day holds after the run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Swap {
    /// Build the day as a table of its own, then detach and drop the old
    /// partition and attach the new one (falling back to delete + insert
    /// where the day cannot be swapped in whole). No DELETE, no dead
    /// tuples; but a REPEATABLE READ or SERIALIZABLE reader (pg_dump)
    /// whose snapshot predates the swap and that reads the day after it
    /// sees the day empty.
    #[default]
    Exchange,
    /// Never exchange: delete the day's rows and insert the new ones in
    /// the run's transaction, which a reader at any isolation level sees
    /// as the old day or the new one (MVCC). A day with no partition yet
    /// gets one, created empty, then filled by the insert.
    DeleteInsert,
}

impl Swap {
    /// The value in job files.
    pub fn name(self) -> &'static str {
        match self {
            Swap::Exchange => "exchange",
            Swap::DeleteInsert => "delete_insert",
        }
    }

    /// A job file's value; `None` for anything else.
    pub fn parse(value: &str) -> Option<Swap> {
        match value {
            "exchange" => Some(Swap::Exchange),
            "delete_insert" => Some(Swap::DeleteInsert),
            _ => None,
        }
    }
}

/// The merge strategy's keys.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MergeSpec {
    /// The natural business key.
    pub key: Vec<String>,
    /// The orderable version column; the newest wins.
    pub version: String,
    /// A SQL predicate marking tombstones.
    pub deleted: Option<String>,
    /// Tie handling.
    pub on_tie: OnTie,
}

/// The history strategy's columns (its key, version, tombstones and ties
/// are the job's [`MergeSpec`]).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct HistorySpec {
    /// The columns whose change makes a new version; empty: every source
    /// column but the key, the version and the metadata.
    pub track: Vec<String>,
    /// The target column where a version's interval starts (inclusive).
    pub valid_from: String,
    /// The target column where it ends (exclusive); NULL while open.
    pub valid_to: String,
    /// No version column: each run's rows are a snapshot of the source at
    /// the run date (00:00), their version; the run owns that version.
    pub snapshot: bool,
    /// Snapshot mode with `deletes = "absent"`: a key the snapshot lacks is
    /// closed at the run date.
    pub absent_deletes: bool,
}

/// Where a job's rows come from.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Source {
    /// The query, as written in the job file.
    pub sql: String,
    #[serde(skip)]
    template: SourceTemplate,
    /// Where the SQL text starts in the job file: its line, and the column
    /// offset of its first line (0 when it starts on a line of its own).
    #[serde(skip)]
    pub position: (usize, usize),
    /// A file source: the day's files, which the query reads as `input`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub files: Option<crate::job::files::FileSource>,
}

/// Whether a query reads no relation but `input` (and its own CTEs). A file
/// source whose query also reads tables cannot take its run key from the
/// files alone. A query that cannot be read counts as reading tables.
pub fn reads_only_input(template: &SourceTemplate) -> bool {
    use sqlparser::ast::{Query, Visit, Visitor};
    use std::ops::ControlFlow;
    struct Names {
        relations: Vec<String>,
        ctes: Vec<String>,
    }
    impl Visitor for Names {
        type Break = ();
        fn pre_visit_query(&mut self, q: &Query) -> ControlFlow<()> {
            if let Some(with) = &q.with {
                self.ctes.extend(with.cte_tables.iter().map(|c| c.alias.name.value.to_ascii_lowercase()));
            }
            ControlFlow::Continue(())
        }
        fn pre_visit_relation(&mut self, r: &sqlparser::ast::ObjectName) -> ControlFlow<()> {
            self.relations.push(r.to_string().to_ascii_lowercase().replace('"', ""));
            ControlFlow::Continue(())
        }
    }
    let Ok(statements) = sqlparser::parser::Parser::parse_sql(&sqlparser::dialect::GenericDialect {}, &template.text_for_parsing()) else {
        return false;
    };
    let mut names = Names { relations: Vec::new(), ctes: Vec::new() };
    let _ = statements.visit(&mut names);
    names.relations.iter().all(|r| r == "input" || names.ctes.contains(r))
}

impl Source {
    /// Whether the run key comes from the files alone: a file source whose
    /// query reads nothing else. (Otherwise it comes from the query's rows,
    /// which also cover the tables it joins.)
    pub fn key_from_files(&self) -> bool {
        self.files.is_some() && reads_only_input(&self.template)
    }
}

impl Source {
    /// Whether this is a file source whose query is the files' rows as
    /// they are (`SELECT * FROM input`, written or left out).
    pub fn reads_files_as_they_are(&self) -> bool {
        self.files.is_some() && self.sql.split_whitespace().collect::<Vec<_>>().join(" ").eq_ignore_ascii_case("SELECT * FROM input")
    }

    /// The same source with other SQL text (e.g. tables renamed into a sandbox).
    pub fn with_sql(&self, sql: String) -> crate::error::Result<Source> {
        let template = SourceTemplate::parse("source.sql", &sql)?;
        Ok(Source { sql, template, position: self.position, files: self.files.clone() })
    }

    /// The query with its run parameters located.
    pub fn template(&self) -> &SourceTemplate {
        &self.template
    }
}

/// A validated job.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Job {
    /// The job's name (also its key in the ledger).
    pub name: String,
    /// The table the job writes.
    pub target: TableName,
    /// How the target is changed.
    pub strategy: Strategy,
    /// The target column holding the run's date.
    pub partition: Option<String>,
    /// The source query.
    pub source: Source,
    /// Columns excluded from fingerprints (e.g. `loaded_at`).
    pub metadata: Vec<String>,
    /// A source with fewer rows is refused.
    pub min_rows: Option<u64>,
    /// Merge keys, for `strategy = "merge"` and `"history"`.
    pub merge: Option<MergeSpec>,
    /// The validity columns and tracked columns, for `strategy = "history"`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub history: Option<HistorySpec>,
    /// Audits of the staged result before it is published. Not part of the
    /// definition hash: they decide whether a run publishes, not what it writes.
    #[serde(skip)]
    pub audits: Vec<crate::job::audit::Audit>,
    /// A run for date D also reloads D-1 … D-lookback whose input changed
    /// since their last load (replace_partition). Not part of the definition hash.
    #[serde(skip)]
    pub lookback: u32,
    /// The first logical date the job owns: earlier dates are outside it
    /// (lookback, backfill and status leave them alone).
    #[serde(skip)]
    pub start: Option<crate::job::date::RunDate>,
    /// What a run does when the source's columns differ from the target's.
    /// Not part of the definition hash: it decides whether a run may
    /// proceed, not what an unchanged schema's run writes.
    #[serde(skip)]
    pub on_schema_change: crate::job::spec::OnSchemaChange,
    /// How a replace_partition run replaces a day it could swap in whole
    /// (`swap`). Not part of the definition hash: exchange and delete +
    /// insert write the same rows, so changing it does not make every day
    /// "job changed" (nor change a run key).
    #[serde(skip)]
    pub swap: Swap,
    /// The file the job was read from.
    #[serde(skip)]
    pub path: Option<PathBuf>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawJob {
    name: Option<String>,
    description: Option<String>,
    target: Option<String>,
    strategy: Option<String>,
    partition: Option<String>,
    source: Option<RawSource>,
    metadata: Option<Vec<String>>,
    min_rows: Option<i64>,
    key: Option<Vec<String>>,
    version: Option<String>,
    deleted: Option<String>,
    on_tie: Option<String>,
    track: Option<Vec<String>>,
    deletes: Option<String>,
    valid_from: Option<String>,
    valid_to: Option<String>,
    audit: Option<Vec<crate::job::audit::RawAudit>>,
    lookback: Option<i64>,
    start: Option<toml::Value>,
    on_schema_change: Option<String>,
    swap: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSource {
    sql: Option<toml::Spanned<String>>,
    files: Option<toml::Spanned<String>>,
    format: Option<String>,
    allow_missing: Option<bool>,
    require_marker: Option<String>,
}

impl Job {
    /// Reads and validates a job file.
    pub fn from_file(path: &Path) -> Result<Job> {
        let text = std::fs::read_to_string(path).map_err(|e| Error::Spec {
            file: path.to_owned(),
            key: "(file)".into(),
            message: format!("cannot read the job file: {e}"),
            hint: Some("pass the path of a job's TOML file".into()),
        })?;
        let mut job = Job::from_toml(&text, path)?;
        job.path = Some(path.to_owned());
        Ok(job)
    }

    /// Validates a job file's text; `path` names it in errors.
    pub fn from_toml(text: &str, path: &Path) -> Result<Job> {
        let spec_err = |key: &str, message: String, hint: Option<&str>| Error::Spec {
            file: path.to_owned(),
            key: key.to_owned(),
            message,
            hint: hint.map(str::to_owned),
        };
        let raw: RawJob = toml::from_str(text).map_err(|e| {
            let key = e.span().map(|s| key_at(text, s.start)).unwrap_or_else(|| "(file)".into());
            let line = e.span().map(|s| text[..s.start].matches('\n').count() + 1);
            let message = match line {
                Some(l) => format!("{} (line {l})", e.message().trim()),
                None => e.message().trim().to_owned(),
            };
            spec_err(&key, message, Some("see docs/jobs.md (\"Every key\") for every key and its type"))
        })?;
        let _ = raw.description;

        let name = raw.name.ok_or_else(|| spec_err("name", "missing: expected the job's name, e.g. name = \"silver_orders\"".into(), None))?;
        if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || "_-.".contains(c)) {
            return Err(spec_err("name", format!("{name:?}: expected letters, digits, '_', '-' or '.'"), None));
        }
        let target_text = raw
            .target
            .ok_or_else(|| spec_err("target", "missing: expected the target table as schema.table, e.g. target = \"silver.orders\"".into(), None))?;
        let target = TableName::parse(&target_text).map_err(|e| spec_err("target", e.to_string(), None))?;
        if let Some((message, hint)) = reserved_target(&target, true) {
            return Err(Error::Spec { file: path.to_owned(), key: "target".into(), message, hint: Some(hint) });
        }
        let strategy = match raw.strategy.as_deref() {
            Some("replace_partition") => Strategy::ReplacePartition,
            Some("merge") => Strategy::Merge,
            Some("history") => Strategy::History,
            // Offered by earlier versions' messages, never implemented:
            // refused when the job file is read, not when a run starts.
            Some("replace_table") => {
                return Err(spec_err(
                    "strategy",
                    "\"replace_table\" is not available: fixpoint does not replace whole tables; expected one of \"replace_partition\", \"merge\", \"history\"".into(),
                    Some("use strategy = \"replace_partition\" (with partition = \"<date column>\") to replace one day per run, or strategy = \"merge\" (with key and version) to upsert rows on a key; a merge removes a key only when `deleted` marks it"),
                ))
            }
            Some(other) => {
                return Err(spec_err(
                    "strategy",
                    format!("{other:?}: expected one of \"replace_partition\", \"merge\", \"history\""),
                    Some("replace_partition replaces the run date's partition; merge upserts on a key, the newest version winning; history keeps every version of a key as a row with a validity interval"),
                ))
            }
            None => {
                return Err(spec_err(
                    "strategy",
                    "missing: expected one of \"replace_partition\", \"merge\", \"history\"".into(),
                    Some("replace_partition replaces the run date's partition; merge upserts on a key, the newest version winning; history keeps every version of a key as a row with a validity interval"),
                ))
            }
        };
        let column = |key: &str, v: &str| -> Result<String> {
            if is_plain_ident(v) {
                Ok(v.to_owned())
            } else {
                Err(spec_err(key, format!("{v:?}: expected a column name (letters, digits and _)"), None))
            }
        };
        let partition = raw.partition.as_deref().map(|p| column("partition", p)).transpose()?;
        let raw_source = raw.source.ok_or_else(|| {
            spec_err("source", "missing: expected a [source] section with the query (sql = \"SELECT … WHERE dt = :run_date\") or the day's files (files = \"bronze/orders/dt={run_date}/*.parquet\")".into(), None)
        })?;
        let files_position = raw_source.files.as_ref().map(|f| source_position(text, f.span()));
        let files = match raw_source.files.as_ref().map(|f| f.get_ref()) {
            Some(pattern) => {
                let dir = path.parent().map(Path::to_path_buf).unwrap_or_default();
                Some(
                    crate::job::files::FileSource::parse(pattern, raw_source.format.as_deref(), raw_source.allow_missing.unwrap_or(false), raw_source.require_marker.clone(), dir)
                        .map_err(|(key, message)| spec_err(&key, message, Some("see docs/jobs.md (\"File sources\")")))?,
                )
            }
            None => {
                for (key, present) in [("format", raw_source.format.is_some()), ("allow_missing", raw_source.allow_missing.is_some()), ("require_marker", raw_source.require_marker.is_some())] {
                    if present {
                        return Err(spec_err(&format!("source.{key}"), "only applies to a file source (files = …)".into(), None));
                    }
                }
                None
            }
        };
        let spanned = raw_source.sql;
        let sql_position = spanned.as_ref().map(|s| source_position(text, s.span())).or(files_position);
        let sql = match (spanned, &files) {
            (Some(s), _) => s.into_inner(),
            (None, Some(_)) => "SELECT * FROM input".to_owned(),
            (None, None) => {
                return Err(spec_err(
                    "source.sql",
                    "missing: expected the source query under [source], e.g. sql = \"SELECT … WHERE dt = :run_date\" (or files = \"…\" for a file source)".into(),
                    None,
                ))
            }
        };
        let template = SourceTemplate::parse("source.sql", &sql).map_err(|e| match e {
            Error::Sql { message, hint, .. } => Error::Spec { file: path.to_owned(), key: "source.sql".into(), message, hint },
            other => other,
        })?;
        if let Some((message, hint)) = reads_own_target(&target, strategy, &template, files.is_some()) {
            return Err(Error::Spec { file: path.to_owned(), key: "source.sql".into(), message, hint: Some(hint) });
        }
        let metadata =
            raw.metadata.unwrap_or_default().iter().map(|m| column("metadata", m)).collect::<Result<Vec<_>>>()?;
        let min_rows = match raw.min_rows {
            None => None,
            Some(n) if n >= 0 => Some(n as u64),
            Some(n) => return Err(spec_err("min_rows", format!("{n}: expected a whole number ≥ 0"), None)),
        };

        let snapshot_history = strategy == Strategy::History && raw.version.is_none();
        let merge = match strategy {
            Strategy::ReplacePartition => {
                let Some(p) = &partition else {
                    return Err(spec_err(
                        "partition",
                        "missing: replace_partition needs the target column that holds the run's date, e.g. partition = \"dt\"".into(),
                        None,
                    ));
                };
                if metadata.contains(p) {
                    return Err(spec_err("metadata", format!("{p:?} is the partition column; it cannot be metadata"), None));
                }
                for (k, present) in [("key", raw.key.is_some()), ("version", raw.version.is_some()), ("deleted", raw.deleted.is_some()), ("on_tie", raw.on_tie.is_some())] {
                    if present {
                        return Err(spec_err(k, "only applies to strategy = \"merge\" or \"history\"".into(), None));
                    }
                }
                None
            }
            Strategy::Merge | Strategy::History => {
                let key = raw.key.unwrap_or_default();
                if key.is_empty() {
                    return Err(spec_err("key", "missing: merge needs the natural business key, e.g. key = [\"order_id\"]".into(), None));
                }
                let key = key.iter().map(|k| column("key", k)).collect::<Result<Vec<_>>>()?;
                // A history without a version is a snapshot history: its
                // version is the run date, kept in valid_from.
                let version = match (raw.version, strategy) {
                    (Some(v), _) => v,
                    (None, Strategy::History) => raw.valid_from.clone().unwrap_or_else(|| "valid_from".into()),
                    (None, _) => {
                        return Err(spec_err("version", "missing: merge needs an orderable version column, e.g. version = \"updated_at\"".into(), Some("without a version an older replay would overwrite a newer row")))
                    }
                };
                let version = column("version", &version)?;
                let on_tie = match raw.on_tie.as_deref() {
                    None | Some("error") => OnTie::Error,
                    Some("deterministic") => OnTie::Deterministic,
                    Some(o) => return Err(spec_err("on_tie", format!("{o:?}: expected \"error\" or \"deterministic\""), None)),
                };
                if let Some(pred) = &raw.deleted {
                    crate::job::sql::check_predicate("deleted", pred).map_err(|e| spec_err("deleted", match e { Error::Sql { message, .. } => message, other => other.to_string() }, Some("a SQL condition on source rows, e.g. deleted = \"op = 'D'\"")))?;
                }
                if key.contains(&version) {
                    return Err(spec_err("version", format!("{version:?} is part of the key; the version must be another column"), None));
                }
                Some(MergeSpec { key, version, deleted: raw.deleted, on_tie })
            }
        };
        let history = match strategy {
            Strategy::History => {
                let m = merge.as_ref().expect("history has keys");
                let valid_from = column("valid_from", raw.valid_from.as_deref().unwrap_or("valid_from"))?;
                let valid_to = column("valid_to", raw.valid_to.as_deref().unwrap_or("valid_to"))?;
                if valid_from == valid_to {
                    return Err(spec_err("valid_to", format!("{valid_to:?} is also valid_from: the interval needs two columns"), None));
                }
                if let Some(p) = partition.as_ref().filter(|p| **p == valid_from || **p == valid_to) {
                    return Err(spec_err(
                        "partition",
                        format!("{p:?} is an interval column: a history table is stored partitioned by a column of its source (on Spark), and an interval column would move rows between partitions at every change"),
                        Some("partition by a column of the key, e.g. partition = \"customer_id\""),
                    ));
                }
                let snapshot = snapshot_history;
                let absent_deletes = match raw.deletes.as_deref() {
                    None => false,
                    Some("absent") if snapshot => true,
                    Some("absent") => {
                        return Err(spec_err(
                            "deletes",
                            "\"absent\" only applies to a snapshot history (one without `version`): with a version column, a key missing from a batch is simply unchanged".into(),
                            Some("mark deletions with `deleted = \"<condition>\"`, or remove `version` to load full snapshots"),
                        ))
                    }
                    Some(other) => return Err(spec_err("deletes", format!("{other:?}: expected \"absent\" (a key missing from the day's full snapshot is closed at the run date)"), None)),
                };
                for (k, c) in [("valid_from", &valid_from), ("valid_to", &valid_to)] {
                    if m.key.contains(c) || (!snapshot && &m.version == c) || metadata.contains(c) {
                        return Err(spec_err(
                            k,
                            format!("{c:?} is also the job's key, version or a metadata column; the interval's columns are written by fixpoint"),
                            Some("name the interval's columns apart, e.g. valid_from = \"valid_from\", valid_to = \"valid_to\""),
                        ));
                    }
                }
                let track = raw.track.unwrap_or_default().iter().map(|c| column("track", c)).collect::<Result<Vec<_>>>()?;
                for c in &track {
                    if m.key.contains(c) || &m.version == c || metadata.contains(c) {
                        return Err(spec_err(
                            "track",
                            format!("{c:?} is the job's key, version or a metadata column, which cannot be tracked"),
                            Some("track the columns whose change makes a new version, e.g. track = [\"email\", \"city\"]"),
                        ));
                    }
                }
                Some(HistorySpec { track, valid_from, valid_to, snapshot, absent_deletes })
            }
            _ => {
                for (k, present) in [("track", raw.track.is_some()), ("deletes", raw.deletes.is_some()), ("valid_from", raw.valid_from.is_some()), ("valid_to", raw.valid_to.is_some())] {
                    if present {
                        return Err(spec_err(k, "only applies to strategy = \"history\"".into(), None));
                    }
                }
                None
            }
        };

        let lookback = match raw.lookback {
            None => 0,
            Some(_) if strategy != Strategy::ReplacePartition => {
                return Err(spec_err("lookback", "only applies to strategy = \"replace_partition\"".into(), Some("a merge replays safely: send the late rows in a batch")))
            }
            Some(n) if (0..=366).contains(&n) => n as u32,
            Some(n) => return Err(spec_err("lookback", format!("{n}: expected a number of days from 0 to 366"), None)),
        };
        let start = match raw.start {
            None => None,
            Some(v) => {
                let text = match &v {
                    toml::Value::String(s) => s.clone(),
                    toml::Value::Datetime(d) => d.to_string(),
                    other => other.to_string(),
                };
                Some(crate::job::date::RunDate::parse(&text).map_err(|_| {
                    spec_err("start", format!("{text}: expected a date, e.g. start = 2026-10-01"), None)
                })?)
            }
        };
        let on_schema_change = match raw.on_schema_change.as_deref() {
            None => crate::job::spec::OnSchemaChange::default(),
            Some(v) => crate::job::spec::OnSchemaChange::parse(v).ok_or_else(|| {
                spec_err("on_schema_change", format!("{v:?}: expected \"fail\" or \"append_new_columns\""), None)
            })?,
        };
        let swap = match raw.swap.as_deref() {
            None => Swap::default(),
            Some(_) if strategy != Strategy::ReplacePartition => {
                return Err(spec_err("swap", "only applies to strategy = \"replace_partition\"".into(), Some("a merge changes rows in place; it never swaps a partition")))
            }
            Some(v) => Swap::parse(v).ok_or_else(|| {
                spec_err(
                    "swap",
                    format!("{v:?}: expected \"exchange\" or \"delete_insert\""),
                    Some("\"exchange\" (the default) swaps in the day's partition built aside; \"delete_insert\" deletes and inserts the day in the run's transaction, so a reader holding an older snapshot (REPEATABLE READ, SERIALIZABLE, pg_dump) keeps seeing the old day instead of an empty one"),
                )
            })?,
        };
        // `unique` defaults to the key (a history's key and valid_from).
        let unique_default: Option<Vec<String>> = merge.as_ref().map(|m| m.key.iter().cloned().chain(history.as_ref().map(|h| h.valid_from.clone())).collect());
        let mut audits = Vec::new();
        for (i, a) in raw.audit.unwrap_or_default().into_iter().enumerate() {
            let audit = a.validate(i, unique_default.as_deref()).map_err(|(key, message)| spec_err(&key, message, None))?;
            if audits.iter().any(|x: &crate::job::audit::Audit| x.name == audit.name) {
                return Err(spec_err(&format!("audit[{i}].name"), format!("{:?} is the name of another audit", audit.name), Some("give each audit its own name")));
            }
            audits.push(audit);
        }

        Ok(Job {
            name,
            target,
            strategy,
            partition,
            source: Source { sql, template, position: sql_position.unwrap_or((1, 0)), files },
            metadata,
            min_rows,
            merge,
            history,
            audits,
            lookback,
            start,
            on_schema_change,
            swap,
            path: None,
        })
    }

    /// Refuses, before a run touches anything, a job that writes fixpoint's
    /// own schema or whose source reads its own target (both also refused
    /// when the job file is read; checked again at the start of every run,
    /// for a job changed since). Nothing is read from the database.
    pub fn check_target(&self) -> Result<()> {
        let file = || self.path.clone().unwrap_or_else(|| PathBuf::from(format!("job {}", self.name)));
        // prove's sandbox runs a copy of the job whose target is in the
        // sandbox: at run time only fixpoint's own schema is refused.
        if let Some((message, hint)) = reserved_target(&self.target, false) {
            return Err(Error::Spec { file: file(), key: "target".into(), message, hint: Some(hint) });
        }
        if let Some((message, hint)) = reads_own_target(&self.target, self.strategy, &self.source.template, self.source.files.is_some()) {
            return Err(Error::Spec { file: file(), key: "source.sql".into(), message, hint: Some(hint) });
        }
        Ok(())
    }

    /// An error in the job file found at run time (exit 2): the file (or
    /// `job <name>` for a job not read from one), the key, what is wrong and
    /// how to fix it.
    pub(crate) fn spec_error(&self, key: &str, message: String, hint: String) -> Error {
        Error::Spec {
            file: self.path.clone().unwrap_or_else(|| PathBuf::from(format!("job {}", self.name))),
            key: key.to_owned(),
            message,
            hint: Some(hint),
        }
    }

    /// A hash of the job's definition (everything that decides what it writes).
    pub fn definition_hash(&self) -> String {
        let canonical = serde_json::to_string(self).expect("job serializes");
        crate::job::digest::hash_hex(&["fixpoint-job-v1", &canonical])
    }
}

/// Whether a schema name is reserved for fixpoint (compared without regard
/// to case): its own schema (the ledger `fixpoint.runs`, the tombstones,
/// the leases), and with `sandboxes` also the schemas `prove` makes for its
/// mutation checks (`fixpoint_sandbox_<hex>`, dropped after each proof).
fn reserved_schema(schema: &str, sandboxes: bool) -> Option<&'static str> {
    let lower = schema.to_ascii_lowercase();
    if lower == crate::job::ident::LEDGER_SCHEMA {
        Some("fixpoint's own tables (the ledger fixpoint.runs, the merge tombstones): a job writing there would delete other jobs' records")
    } else if sandboxes && lower.starts_with(crate::job::ident::SANDBOX_PREFIX) {
        Some("the schemas `fixpoint prove` makes for its mutation checks and drops after each proof: a job writing there would lose its table")
    } else {
        None
    }
}

/// The refusal (message, hint) of a target in a reserved schema.
fn reserved_target(target: &TableName, sandboxes: bool) -> Option<(String, String)> {
    let what = reserved_schema(&target.schema, sandboxes)?;
    Some((
        format!("{target} is in the schema {}, which is reserved for {what}", target.schema),
        format!("choose a target in a schema of your own, e.g. target = \"silver.{}\"", target.table),
    ))
}

/// The refusal (message, hint) of a source whose SQL reads the job's own
/// target: a run would change the rows it reads (a replace_partition's
/// delete runs before, or while, its insert reads the source; a merge
/// reads its source again after its MERGE, and adds new columns before
/// reading it). `None` when it does not read it, and when the SQL cannot be
/// parsed (the lint gate refuses that).
fn reads_own_target(target: &TableName, strategy: Strategy, template: &SourceTemplate, file_source: bool) -> Option<(String, String)> {
    if !crate::job::sqlrefs::reads_table(&template.text_for_parsing(), target, file_source)? {
        return None;
    }
    let why = match strategy {
        Strategy::ReplacePartition => "a run deletes the rows it would read",
        Strategy::Merge | Strategy::History => "a run rewrites the rows it reads, and reads them again after writing",
    };
    Some((
        format!("the source reads the job's own target {target}: {why}"),
        format!(
            "read from the upstream table that {target} is loaded from instead (e.g. bronze.{}); to derive a table from {target}, write it to another target",
            target.table
        ),
    ))
}

/// Where a TOML string value's text starts: (line, column offset of its
/// first line). A multi-line string whose opening quotes end the line starts
/// on the next line.
fn source_position(text: &str, span: std::ops::Range<usize>) -> (usize, usize) {
    let start = span.start;
    let line = text[..start].matches('\n').count() + 1;
    let col = start - text[..start].rfind('\n').map(|i| i + 1).unwrap_or(0);
    let value = &text[span];
    let triple = value.starts_with("\"\"\"") || value.starts_with("'''");
    if triple && value[3..].starts_with('\n') {
        (line + 1, 0)
    } else if triple {
        (line, col + 3)
    } else {
        (line, col + 1)
    }
}

/// The dotted key at byte `pos` of a TOML text (best effort, for messages).
fn key_at(text: &str, pos: usize) -> String {
    let before = &text[..pos.min(text.len())];
    let line_start = before.rfind('\n').map(|i| i + 1).unwrap_or(0);
    let line_end = text[line_start..].find('\n').map(|i| line_start + i).unwrap_or(text.len());
    let line = &text[line_start..line_end];
    let section = before[..line_start]
        .lines()
        .rev()
        .map(str::trim)
        .find(|l| l.starts_with('[') && l.ends_with(']'))
        .map(|l| l.trim_matches(|c| c == '[' || c == ']').trim().to_owned());
    let key = line.split('=').next().unwrap_or("").trim().trim_matches('"').to_owned();
    match (section, key.is_empty() || key.starts_with('[')) {
        (_, true) => format!("line {}", before.matches('\n').count() + 1),
        (Some(s), false) => format!("{s}.{key}"),
        (None, false) => key,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"
name = "silver_orders"
target = "silver.orders"
strategy = "replace_partition"
partition = "dt"
metadata = ["loaded_at"]
min_rows = 1

[source]
sql = "SELECT *, now() AS loaded_at FROM bronze.orders WHERE dt = :run_date"
"#;

    fn parse(text: &str) -> Result<Job> {
        Job::from_toml(text, Path::new("jobs/x.toml"))
    }

    #[test]
    fn reads_a_good_job() {
        let job = parse(GOOD).unwrap();
        assert_eq!(job.target.to_string(), "silver.orders");
        assert_eq!(job.partition.as_deref(), Some("dt"));
        assert_eq!(job.min_rows, Some(1));
        assert_eq!(job.definition_hash(), parse(GOOD).unwrap().definition_hash());
        let changed = parse(&GOOD.replace("min_rows = 1", "min_rows = 2")).unwrap();
        assert_ne!(job.definition_hash(), changed.definition_hash());
    }

    #[test]
    fn swap_is_read_checked_and_left_out_of_the_hash() {
        let with = |value: &str| GOOD.replacen("min_rows = 1", &format!("min_rows = 1\nswap = {value}"), 1);
        assert_eq!(parse(GOOD).unwrap().swap, Swap::Exchange);
        assert_eq!(parse(&with("\"exchange\"")).unwrap().swap, Swap::Exchange);
        let di = parse(&with("\"delete_insert\"")).unwrap();
        assert_eq!(di.swap, Swap::DeleteInsert);
        assert_eq!(di.definition_hash(), parse(GOOD).unwrap().definition_hash(), "the same rows are written either way");
        let e = parse(&with("\"truncate\"")).unwrap_err();
        assert!(matches!(&e, Error::Spec { key, hint: Some(_), .. } if key == "swap"), "{e:?}");
        assert_eq!(e.to_string(), "jobs/x.toml: swap: \"truncate\": expected \"exchange\" or \"delete_insert\"");
        assert!(parse(&with("true")).unwrap_err().to_string().starts_with("jobs/x.toml: swap: invalid type"));
        let merge = "name = \"m\"\ntarget = \"main.orders\"\nstrategy = \"merge\"\nkey = [\"id\"]\nversion = \"v\"\nswap = \"delete_insert\"\n[source]\nsql = \"SELECT * FROM bronze.orders\"\n";
        assert!(parse(merge).unwrap_err().to_string().starts_with("jobs/x.toml: swap: only applies to strategy = \"replace_partition\""));
    }

    #[test]
    fn bad_jobs_name_file_key_and_expectation() {
        let cases: &[(&str, &str, &str)] = &[
            ("min_rows = 1", "min_rows = \"ten\"", "jobs/x.toml: min_rows: invalid type: string \"ten\", expected i64 (line 7)"),
            ("min_rows = 1", "min_rows = -1", "jobs/x.toml: min_rows: -1: expected a whole number"),
            ("strategy = \"replace_partition\"", "strategy = \"upsert\"", "jobs/x.toml: strategy: \"upsert\": expected one of \"replace_partition\", \"merge\", \"history\""),
            ("strategy = \"replace_partition\"", "strategy = \"replace_table\"", "jobs/x.toml: strategy: \"replace_table\" is not available"),
            ("target = \"silver.orders\"", "target = \"orders\"", "jobs/x.toml: target: \"orders\" is not a table name"),
            ("partition = \"dt\"\n", "", "jobs/x.toml: partition: missing"),
            ("min_rows = 1", "min_rowz = 1", "jobs/x.toml: min_rowz: unknown field `min_rowz`"),
            ("sql = ", "sq = ", "jobs/x.toml: source.sq: unknown field `sq`"),
            ("WHERE dt = :run_date", "WHERE dt = :rundate", "jobs/x.toml: source.sql: uses the unknown parameter `:rundate`"),
            ("name = \"silver_orders\"\n", "", "jobs/x.toml: name: missing"),
        ];
        for (from, to, expected) in cases {
            let text = GOOD.replacen(from, to, 1);
            let e = parse(&text).unwrap_err().to_string();
            assert!(e.starts_with(expected), "{to}:\n got {e}\nwant {expected}");
        }
    }

    #[test]
    fn fixpoint_schemas_are_not_targets() {
        for target in ["fixpoint.runs", "FIXPOINT.runs", "Fixpoint.tombstones__silver__orders", "fixpoint_sandbox_1a2b3c4d.silver__orders"] {
            let e = parse(&GOOD.replace("silver.orders", target)).unwrap_err();
            assert!(matches!(&e, Error::Spec { key, hint: Some(_), .. } if key == "target"), "{target}: {e:?}");
            assert!(e.to_string().contains("is reserved for"), "{e}");
        }
        parse(&GOOD.replace("silver.orders", "fixpoint_x.orders")).unwrap();
        parse(&GOOD.replace("silver.orders", "fixpoint_sandbox.orders")).unwrap();
    }

    #[test]
    fn a_source_reading_the_target_is_refused() {
        let own = GOOD.replace("FROM bronze.orders", "FROM silver.orders");
        let e = parse(&own).unwrap_err();
        assert!(matches!(&e, Error::Spec { key, hint: Some(_), .. } if key == "source.sql"), "{e:?}");
        assert_eq!(e.to_string(), "jobs/x.toml: source.sql: the source reads the job's own target silver.orders: a run deletes the rows it would read");
        let merge = "name = \"m\"\ntarget = \"main.orders\"\nstrategy = \"merge\"\nkey = [\"id\"]\nversion = \"v\"\n[source]\nsql = \"SELECT * FROM Orders WHERE dt = :run_date\"\n";
        assert!(parse(merge).unwrap_err().to_string().contains("the source reads the job's own target main.orders"));
        // Loaded, then changed: refused at the start of the run.
        let mut job = parse(GOOD).unwrap();
        job.check_target().unwrap();
        job.source = job.source.with_sql("SELECT * FROM silver.orders WHERE dt = :run_date".into()).unwrap();
        assert!(job.check_target().unwrap_err().to_string().starts_with("job silver_orders: source.sql: the source reads the job's own target"));
    }
}

/// What a run does when the source's columns differ from the target's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OnSchemaChange {
    /// Refuse the run, naming the columns (the default).
    #[default]
    Fail,
    /// Add new source columns to the target; keep dropped ones (NULL in new rows).
    AppendNewColumns,
}

impl OnSchemaChange {
    /// Parses the job file's value.
    pub fn parse(s: &str) -> Option<OnSchemaChange> {
        match s {
            "fail" => Some(OnSchemaChange::Fail),
            "append_new_columns" => Some(OnSchemaChange::AppendNewColumns),
            _ => None,
        }
    }
}
