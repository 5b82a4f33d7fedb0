//! Steps the merge plans share: the transactional plan, the leased one and
//! an engine's accelerated plans (which call them from their own crate).

use crate::engine::{Column, Engine};
use crate::error::Result;
use crate::engine::measure::{fingerprint_select, Scope};
use crate::fingerprint::{Fingerprint, Method};
use crate::job::ident::{quote_ident, TableName};
use crate::job::spec::{Job, MergeSpec};
use crate::job::spec::OnTie;
use crate::job::sql::{RunParams, Sql, Value};
use crate::plans::merge::refusals::{cross_tie_error, duplicate_keys_error, moved_error};
use crate::plans::merge::refusals::refuse_nulls;
use crate::plans::merge::sql::{count, keys_match, q, rows_differ, sorts_before, tombstone_table, DELETED};

/// The deduplicated batch, one row a key (a temporary table).
pub const BATCH: &str = "\"__fixpoint_batch\"";
/// Above this many touched partitions the prune filter is a subquery.
const MAX_PRUNE_LIST: usize = 1000;

/// The source's rows with their tombstone flag (the job's `deleted`
/// condition, else false) as the column [`DELETED`].
pub fn flagged_source(job: &Job, spec: &MergeSpec, params: &RunParams) -> Sql {
    let mut sql = Sql::new();
    sql.push("SELECT s.*, ");
    match &spec.deleted {
        Some(pred) => sql.push(&format!("coalesce(({pred}), false)")),
        None => sql.push("false"),
    };
    sql.push(&format!(" AS {} FROM ", quote_ident(DELETED)));
    Scope::Source { template: job.source.template(), params }.write_from(&mut sql, "s");
    sql
}

/// One scan of the staged source `stage`: NULL keys and versions refused
/// (with a sample row), and the input fingerprint over `input_cols`.
pub fn scan_stage(engine: &mut dyn Engine, spec: &MergeSpec, stage: &str, source_list: &str, input_cols: &[Column]) -> Result<Fingerprint> {
    let null_key = spec.key.iter().map(|k| format!("{} IS NULL", quote_ident(k))).collect::<Vec<_>>().join(" OR ");
    let version = quote_ident(&spec.version);
    let fp = fingerprint_select(engine, Method::Native, "s", input_cols)?;
    let rows = engine.query(&Sql::raw(format!(
        "SELECT {}, count(*) FILTER (WHERE {null_key}) AS \"null_keys\", count(*) FILTER (WHERE {version} IS NULL) AS \"null_versions\" FROM {stage} AS s",
        fp.select
    )))?;
    let row = rows.single("the stage scan")?;
    refuse_nulls(engine, spec, stage, source_list, row.count("null_keys")?, row.count("null_versions")?)?;
    fp.read(&row, engine)
}

/// Makes sure of the tombstone table when the job marks tombstones (or
/// once did), and drops from the batch the rows a tombstone already beats
/// (an older or equal version of a deleted key). Returns the table and how
/// many rows were dropped.
pub fn drop_beaten(engine: &mut dyn Engine, job: &Job, spec: &MergeSpec, source_cols: &[Column]) -> Result<(TableName, u64)> {
    let tomb = tombstone_table(&job.target);
    if spec.deleted.is_none() && engine.table_columns(&tomb)?.is_none() {
        return Ok((tomb, 0));
    }
    let version = quote_ident(&spec.version);
    let cols: Vec<String> = spec
        .key
        .iter()
        .chain([&spec.version])
        .map(|k| format!("{} {}", quote_ident(k), source_cols.iter().find(|c| &c.name == k).expect("described").ty))
        .collect();
    engine.execute(&Sql::raw(format!("CREATE TABLE IF NOT EXISTS {} ({})", tomb.quoted(), cols.join(", "))))?;
    let beaten = engine.execute(&Sql::raw(format!(
        "DELETE FROM {BATCH} AS b WHERE EXISTS (SELECT 1 FROM {} AS d WHERE {} AND b.{version} <= d.{version})",
        tomb.quoted(),
        keys_match("d", "b", &spec.key)
    )))?;
    Ok((tomb, beaten))
}

/// `t.<p> IN (…)`: the partitions the batch touches, bound as values so the
/// engine can skip the others (a subquery past [`MAX_PRUNE_LIST`]).
pub fn touched_partitions(engine: &mut dyn Engine, p: &str, ty: &str) -> Result<Sql> {
    let parts = engine.query(&Sql::raw(format!("SELECT DISTINCT {} FROM {BATCH} WHERE {} IS NOT NULL ORDER BY 1", quote_ident(p), quote_ident(p))))?.rows;
    let mut sql = Sql::new();
    sql.push(&q("t", p));
    if parts.is_empty() {
        sql.push(" IS NULL AND false");
    } else if parts.len() <= MAX_PRUNE_LIST {
        sql.push(" IN (");
        for (i, v) in parts.iter().enumerate() {
            if i > 0 {
                sql.push(", ");
            }
            sql.typed_param(v[0].clone(), ty);
        }
        sql.push(")");
    } else {
        sql.push(&format!(" IN (SELECT {} FROM {BATCH})", quote_ident(p)));
    }
    Ok(sql)
}

/// The touched keys' rows as the target holds them (audits), as a FROM item.
pub fn touched_rows(job: &Job, spec: &MergeSpec, sql: &mut Sql) {
    sql.push(&format!(
        "(SELECT t.* FROM {} AS t WHERE EXISTS (SELECT 1 FROM {BATCH} AS b WHERE {})) AS a",
        job.target.quoted(),
        keys_match("t", "b", &spec.key)
    ));
}

/// How many rows the touched keys have before the merge, when an audit
/// compares row counts.
pub fn rows_before(engine: &mut dyn Engine, job: &Job, spec: &MergeSpec) -> Result<Option<u64>> {
    if !job.audits.iter().any(|a| matches!(a.kind, crate::job::audit::AuditKind::RowCountChange { .. })) {
        return Ok(None);
    }
    let mut sql = Sql::new();
    sql.push("SELECT count(*) AS \"n\" FROM ");
    touched_rows(job, spec, &mut sql);
    Ok(Some(count(engine, &sql)?))
}

/// Replaces the remembered tombstones of the batch's deleted keys with the
/// batch's.
pub fn remember_tombstones(engine: &mut dyn Engine, spec: &MergeSpec, tomb: &TableName) -> Result<()> {
    if spec.deleted.is_none() {
        return Ok(());
    }
    let del = quote_ident(DELETED);
    engine.execute(&Sql::raw(format!(
        "DELETE FROM {} AS d WHERE EXISTS (SELECT 1 FROM {BATCH} AS b WHERE b.{del} AND {})",
        tomb.quoted(),
        keys_match("d", "b", &spec.key)
    )))?;
    let kv = spec.key.iter().chain([&spec.version]).map(|k| quote_ident(k)).collect::<Vec<_>>().join(", ");
    engine.execute(&Sql::raw(format!("INSERT INTO {} ({kv}) SELECT {kv} FROM {BATCH} WHERE {del}", tomb.quoted())))?;
    Ok(())
}


/// How a batch row `b` stands against the target's row `t` of its key
/// (`t`'s first key column NULL: none), as SQL conditions.
pub struct Conditions {
    /// The target holds the key.
    pub matched: String,
    /// `b` beats `t`: strictly newer, or at the same version first in the
    /// total order with `on_tie = "deterministic"`.
    pub newer: String,
    /// `b` is inserted.
    pub is_insert: String,
    /// `b` updates `t`.
    pub is_update: String,
    /// `b` is a tombstone that deletes `t`.
    pub is_delete: String,
}

impl Conditions {
    /// The conditions of `spec`'s merge, ties broken over `compared`.
    pub fn of(spec: &MergeSpec, compared: &[String]) -> Conditions {
        let version = quote_ident(&spec.version);
        let del = format!("b.{}", quote_ident(DELETED));
        let newer = format!("(b.{version} > t.{version}{})", match spec.on_tie {
            OnTie::Deterministic => format!(" OR (b.{version} = t.{version} AND {})", sorts_before("b", "t", compared)),
            OnTie::Error => String::new(),
        });
        let first_key = q("t", &spec.key[0]);
        let matched = format!("{first_key} IS NOT NULL");
        Conditions {
            is_update: format!("{matched} AND NOT {del} AND {newer}"),
            is_delete: format!("{matched} AND {del} AND b.{version} >= t.{version}"),
            is_insert: format!("{first_key} IS NULL AND NOT {del}"),
            matched,
            newer,
        }
    }
}

/// What the classification counted.
pub struct Classified {
    /// Batch rows to insert.
    pub inserts: u64,
    /// Batch rows that update their key.
    pub updates: u64,
    /// Tombstones that delete their key.
    pub deletes: u64,
}

/// Every batch row classified against the target in one join over the
/// keys (not pruned, so a key the target holds in a partition the batch
/// does not touch is seen, and refused: a merge pruned to the batch's
/// partitions would insert it twice; `in_scope` says a target row is in a
/// touched partition, its parameters `params`). A key the target holds
/// twice, a moved key and a tie with the target (`on_tie = "error"`) are
/// refused with the rows involved. `extra` adds to the select list (read
/// back by the caller from the row it is given).
pub struct Classification<'a> {
    /// The job.
    pub job: &'a Job,
    /// Its merge.
    pub spec: &'a MergeSpec,
    /// The columns that tell two rows of a key and version apart.
    pub compared: &'a [String],
    /// The partition column the merge is pruned to.
    pub prune: Option<&'a str>,
    /// The batch (one row a key).
    pub batch: &'a str,
    /// The target as a FROM item (an empty relation before it exists).
    pub target: &'a str,
    /// A target row `t` is in a touched partition.
    pub in_scope: &'a str,
    /// The parameters `in_scope` binds.
    pub params: &'a [Value],
}

impl Classification<'_> {
    /// Runs it; `read` takes what `extra` selected from its row.
    pub fn run(&self, engine: &mut dyn Engine, extra: &str, read: impl FnOnce(&mut dyn Engine, &crate::engine::Row<'_>) -> Result<()>) -> Result<Classified> {
        let (job, spec, batch) = (self.job, self.spec, self.batch);
        let version = quote_ident(&spec.version);
        let del = format!("b.{}", quote_ident(DELETED));
        let c = Conditions::of(spec, self.compared);
        let mut sql = Sql::new();
        sql.push(&format!(
            "SELECT count(*) FILTER (WHERE {}) AS \"inserts\", count(*) FILTER (WHERE {}) AS \"updates\", \
             count(*) FILTER (WHERE {}) AS \"deletes\", \
             count(*) FILTER (WHERE {} AND NOT {del} AND b.{version} = t.{version} AND ({})) AS \"cross_ties\", \
             count(*) FILTER (WHERE {} AND NOT ({})) AS \"moved\", count(*) AS \"joined\", \
             (SELECT count(*) FROM {batch}) AS \"batch_rows\"{extra} \
             FROM {batch} AS b LEFT JOIN {} AS t ON {}",
            c.is_insert,
            c.is_update,
            c.is_delete,
            c.matched,
            rows_differ("b", "t", self.compared),
            c.matched,
            self.in_scope,
            self.target,
            keys_match("t", "b", &spec.key)
        ));
        sql.params.extend(self.params.iter().cloned());
        let rows = engine.query(&sql)?;
        let row = rows.single("the classification")?;
        if row.count("joined")? > row.count("batch_rows")? {
            // One batch key joined more than one target row.
            return Err(duplicate_keys_error(engine, job, spec)?);
        }
        let moved = row.count("moved")?;
        if moved > 0 {
            let p = self.prune.expect("moved only counted when pruning");
            return Err(moved_error(engine, job, spec, p, batch, self.in_scope, self.params, moved)?);
        }
        let cross_ties = row.count("cross_ties")?;
        if spec.on_tie == OnTie::Error && cross_ties > 0 {
            let on = Sql::raw(keys_match("t", "b", &spec.key));
            return Err(cross_tie_error(engine, job, spec, batch, &on, self.compared, cross_ties)?);
        }
        let classified = Classified { inserts: row.count("inserts")?, updates: row.count("updates")?, deletes: row.count("deletes")? };
        read(engine, &row)?;
        Ok(classified)
    }
}
