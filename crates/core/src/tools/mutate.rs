//! The mutation check of `prove`: in a sandbox (copies of the tables the
//! source reads and of the target, in a scratch schema with a fresh name that
//! the check creates itself and alone drops; the user's tables are only
//! read), change one input row that feeds the run, run the job again,
//! and check that only the output derived from that row changed: one row for
//! `replace_partition`, one key for `merge`. A job that computes a per-day
//! total into every row, say, changes every row and fails.
//!
//! Before that, the order check: the same input rows stored in the opposite
//! order must give the same output; a job that keeps "the first" of tied
//! rows follows the storage order and fails it.

use serde::Serialize;
use sqlparser::dialect::GenericDialect;
use sqlparser::tokenizer::{Token, Tokenizer};

use crate::job::date::RunDate;
use crate::engine::{Column, Engine};
use crate::engine::measure::{Filter, Scope};
use crate::error::{Error, Result};
use crate::job::ident::{quote_ident, TableName};
use crate::run::ledger;
use crate::run::protocol::RunOptions;
use crate::job::spec::{Job, Strategy};
use crate::job::sql::{LineIndex, Sql, Value};

/// The start of the scratch schema's name: each check creates its own,
/// `fixpoint_sandbox_<8 hex digits>`, a name no schema had before (it is
/// looked up, and `CREATE SCHEMA` fails rather than reuse one), and drops
/// only that one afterwards. A user's schema is never dropped, whatever its
/// name (`fixpoint_sandbox` included).
pub use crate::job::ident::SANDBOX_PREFIX;
const CANDIDATES: u64 = 20;

/// One check's sandbox: everything it creates, so that it drops exactly that.
struct Sandbox {
    /// The scratch schema, created by this check.
    schema: String,
    /// The baseline's temporary table (quoted), named after the schema.
    baseline: String,
    /// The sandbox job's name (its ledger rows are removed afterwards).
    job_name: String,
    /// The tombstone table a merge job's sandbox runs create.
    tombstones: TableName,
    /// The version log a history job's sandbox runs create.
    history_log: TableName,
}

impl Sandbox {
    /// The sandbox copy of `t`.
    fn table(&self, t: &TableName) -> TableName {
        TableName { schema: self.schema.clone(), table: format!("{}__{}", t.schema, t.table) }
    }
}

/// A short name part (8 hex digits) for a name of fixpoint's own, different
/// at every call: a hash of the job, the date, the process, the time, a
/// counter and a per-call random key. Unlikely to collide, but not trusted
/// to: callers check that the name is free before they create it.
pub(crate) fn unique_suffix(job: &str, run_date: RunDate) -> String {
    use std::hash::{BuildHasher, Hash, Hasher};
    static COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    job.hash(&mut h);
    run_date.to_string().hash(&mut h);
    std::process::id().hash(&mut h);
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0).hash(&mut h);
    COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed).hash(&mut h);
    format!("{:08x}", h.finish() & 0xffff_ffff)
}

/// Whether a schema named `name` exists; `None` when the engine cannot say
/// (no `information_schema`): `CREATE SCHEMA` then decides.
fn schema_exists(engine: &mut dyn Engine, name: &str) -> Option<bool> {
    let mut sql = Sql::new();
    sql.push("SELECT count(*) AS \"n\" FROM information_schema.schemata WHERE schema_name = ").typed_param(Value::Text(name.to_owned()), "VARCHAR");
    let n = crate::engine::query_count(engine, &sql, "n", "the sandbox schema's lookup").ok()?;
    Some(n > 0)
}

/// Creates a scratch schema under a name that did not exist, and returns
/// the sandbox. An existing schema is never taken over: a name in use is
/// skipped (looked up first; `CREATE SCHEMA` without `IF NOT EXISTS` fails
/// on one created in between).
fn create_sandbox(engine: &mut dyn Engine, job: &Job, run_date: RunDate) -> Result<Sandbox> {
    for _ in 0..8 {
        let suffix = unique_suffix(&job.name, run_date);
        let schema = format!("{SANDBOX_PREFIX}{suffix}");
        if schema_exists(engine, &schema) == Some(true) {
            continue;
        }
        match engine.execute(&Sql::raw(format!("CREATE SCHEMA {}", quote_ident(&schema)))) {
            Ok(_) => {
                let mut sb = Sandbox {
                    schema,
                    baseline: quote_ident(&format!("__fixpoint_mutation_baseline_{suffix}")),
                    job_name: format!("{}~mutation~{suffix}", job.name),
                    tombstones: job.target.clone(),
                    history_log: job.target.clone(),
                };
                sb.tombstones = crate::plans::merge::sql::tombstone_table(&sb.table(&job.target));
                sb.history_log = crate::plans::history::log_table(&sb.table(&job.target));
                return Ok(sb);
            }
            // Someone else's schema of that name: not ours, try another.
            Err(_) if schema_exists(engine, &schema) == Some(true) => continue,
            Err(e) => return Err(e),
        }
    }
    Err(Error::Internal(format!("found no free name for the mutation check's sandbox schema ({SANDBOX_PREFIX}…) in 8 tries")))
}

/// The input table the mutation check changes a row of (as
/// [`sandbox_checks`] picks it: the day's files, else the first existing
/// table the source reads other than the target) and its columns; `None`
/// when there is none (the check is then inconclusive).
fn mutated_table(job: &Job, run_date: RunDate, engine: &mut dyn Engine) -> Result<Option<(String, Vec<Column>)>> {
    if let Some(source) = &job.source.files {
        let Some(mut files) = source.resolve(run_date)? else { return Ok(None) };
        files.fetch()?;
        let relation = crate::engine::file_input(engine).and_then(|f| f.stage_files(&files));
        let described = relation.and_then(|relation| {
            let mut sql = Sql::new();
            sql.push("SELECT * FROM ").append(&relation);
            engine.describe(&sql)
        });
        let released = crate::run::input::release_files(engine);
        let cols = described?;
        released?;
        return Ok(Some(("input (the day's files)".to_owned(), cols)));
    }
    let mut first = None;
    for (t, _, _) in table_refs(&job.source.sql)? {
        if let Some(cols) = engine.table_columns(&t)? {
            if t != job.target {
                return Ok(Some((t.to_string(), cols)));
            }
            if first.is_none() {
                first = Some((t.to_string(), cols));
            }
        }
    }
    Ok(first)
}

/// Checks `--mutate-key` before anything is run: every column it names must
/// be a column of the input table the mutation check changes a row of. Only
/// reads (the catalog; for a file source, the files' columns).
pub fn validate_mutate_key(job: &Job, run_date: RunDate, engine: &mut dyn Engine, mutate_key: &[(String, String)]) -> Result<()> {
    let Some((k, v)) = mutate_key.first() else { return Ok(()) };
    let Some((table, cols)) = mutated_table(job, run_date, engine)? else {
        if job.source.files.is_some() {
            // No file for the day (allow_missing): the check is inconclusive anyway.
            return Ok(());
        }
        return Err(Error::argument(
            format!("--mutate-key {k}={v}: the source of job {} reads no table, so there is no input row to pick", job.name),
            Some("drop --mutate-key"),
        ));
    };
    for (k, v) in mutate_key {
        if !cols.iter().any(|c| &c.name == k) {
            return Err(Error::argument(
                format!("--mutate-key {k}={v}: {table} has no column {k:?}"),
                Some(&format!("its columns are {}", cols.iter().map(|c| c.name.as_str()).collect::<Vec<_>>().join(", "))),
            ));
        }
    }
    Ok(())
}

/// What the mutation check found.
#[derive(Debug, Clone, Serialize)]
pub struct MutationEvidence {
    /// `passed`, `failed`, or `inconclusive` (no change to one input row
    /// changed the output).
    pub outcome: String,
    /// The source table whose row was changed.
    pub table: String,
    /// The changed column.
    pub column: String,
    /// The input row before the change, `column=value` pairs.
    pub row: Vec<String>,
    /// The change, e.g. `order_total + 1`.
    pub change: String,
    /// Input rows tried before one changed the output.
    pub candidates_tried: usize,
    /// Output rows that went away.
    pub output_rows_removed: u64,
    /// Output rows that appeared.
    pub output_rows_added: u64,
    /// For merge: distinct keys among the changed output rows.
    pub output_keys_changed: Option<u64>,
    /// Up to 5 changed output rows each way.
    pub sample: Vec<String>,
    /// One sentence.
    pub message: String,
}

/// What the order check found.
#[derive(Debug, Clone, Serialize)]
pub struct OrderEvidence {
    /// `passed`, `failed`, or `skipped`.
    pub outcome: String,
    /// Output rows that went away when the input was stored in the opposite order.
    pub output_rows_removed: u64,
    /// Output rows that appeared.
    pub output_rows_added: u64,
    /// Up to 5 changed output rows each way.
    pub sample: Vec<String>,
    /// One sentence.
    pub message: String,
}

/// What the sandbox checks found.
#[derive(Debug, Clone, Serialize)]
pub struct SandboxEvidence {
    /// The order check (`None` when the source reads no table).
    pub order: Option<OrderEvidence>,
    /// The mutation check.
    pub mutation: MutationEvidence,
}

/// Tables named `schema.table` in a query, with the byte span of each name.
/// Unquoted parts are folded to lower case; three-part names are skipped.
pub fn table_refs(sql: &str) -> Result<Vec<(TableName, usize, usize)>> {
    let tokens = Tokenizer::new(&GenericDialect {}, sql)
        .tokenize_with_location()
        .map_err(|e| Error::Sql { what: "source.sql".into(), message: e.message, hint: None })?;
    let lines = LineIndex::new(sql);
    let sig: Vec<usize> = (0..tokens.len()).filter(|&i| !matches!(tokens[i].token, Token::Whitespace(_) | Token::EOF)).collect();
    let word = |i: usize| match &tokens[i].token {
        Token::Word(w) => Some(if w.quote_style.is_some() { w.value.clone() } else { w.value.to_lowercase() }),
        _ => None,
    };
    let mut out = Vec::new();
    for n in 0..sig.len().saturating_sub(2) {
        let (a, dot, b) = (sig[n], sig[n + 1], sig[n + 2]);
        if tokens[dot].token != Token::Period {
            continue;
        }
        let before = n > 0 && tokens[sig[n - 1]].token == Token::Period;
        let after = sig.get(n + 3).is_some_and(|&i| tokens[i].token == Token::Period);
        if let (Some(schema), Some(table), false, false) = (word(a), word(b), before, after) {
            let start = lines.byte(tokens[a].span.start.line, tokens[a].span.start.column);
            let end = lines.byte(tokens[b].span.end.line, tokens[b].span.end.column);
            out.push((TableName { schema, table }, start, end));
        }
    }
    Ok(out)
}

/// The count of `SELECT count(*) AS "n" FROM …`.
fn count(engine: &mut dyn Engine, sql: &Sql) -> Result<u64> {
    crate::engine::query_count(engine, sql, "n", "the mutation check's count")
}

fn text(v: &Value) -> String {
    match v {
        Value::Null => "NULL".into(),
        Value::Text(s) => s.clone(),
        other => other.display(),
    }
}

/// Runs the mutation check for `job` on `run_date`, in a sandbox schema it
/// creates under a fresh name. The sandbox (that schema, the baseline, the
/// sandbox target's tombstones, the sandbox job's ledger rows) is removed
/// afterwards, whatever happens; nothing else is dropped.
pub fn sandbox_checks(job: &Job, run_date: RunDate, engine: &mut dyn Engine, mutate_key: &[(String, String)]) -> Result<SandboxEvidence> {
    let sb = create_sandbox(engine, job, run_date)?;
    let result = check(job, run_date, engine, mutate_key, &sb);
    let cleaned = cleanup(engine, &sb);
    let (order, mutation) = result?;
    cleaned?;
    Ok(SandboxEvidence { order, mutation })
}

/// Whether the engine's tables cannot lose or change rows in place
/// (Spark's parquet tables: no UPDATE or DELETE), so the sandbox's tables
/// are written again instead.
fn rewrites_tables(engine: &mut dyn Engine) -> bool {
    engine.leases().is_some_and(|l| !l.replaces_rows())
}

/// `UPDATE table SET column = value WHERE cond` on a sandbox copy; where
/// a table cannot change rows in place (Spark's parquet tables) the copy
/// is written again with the change and swapped in (it is the sandbox's
/// own: nothing else reads or writes it).
fn set_where(engine: &mut dyn Engine, table: &TableName, columns: &[Column], column: &str, value: &Sql, cond: &Sql) -> Result<()> {
    let mut sql = Sql::new();
    if !rewrites_tables(engine) {
        sql.push(&format!("UPDATE {} SET {} = ", table.quoted(), quote_ident(column))).append(value).push(" WHERE ").append(cond);
        return engine.execute(&sql).map(|_| ());
    }
    let new = TableName { schema: table.schema.clone(), table: format!("{}__mutated", table.table) };
    sql.push(&format!("CREATE TABLE {} AS SELECT ", new.quoted()));
    for (i, c) in columns.iter().enumerate() {
        sql.push(if i > 0 { ", " } else { "" });
        if c.name == column {
            sql.push("CASE WHEN ").append(cond).push(" THEN ").append(value).push(&format!(" ELSE {0} END AS {0}", quote_ident(column)));
        } else {
            sql.push(&quote_ident(&c.name));
        }
    }
    sql.push(&format!(" FROM {}", table.quoted()));
    engine.execute(&sql)?;
    engine.execute(&Sql::raw(format!("DROP TABLE {}", table.quoted())))?;
    engine.execute(&Sql::raw(format!("ALTER TABLE {} RENAME TO {}", new.quoted(), quote_ident(&table.table)))).map(|_| ())
}

/// `to` made empty with `from`'s columns, and where a table is rewritten
/// partition by partition (Spark) with its partitioning: the plans there
/// refuse an unpartitioned target.
fn create_empty_like(engine: &mut dyn Engine, from: &TableName, to: &TableName) -> Result<()> {
    if !rewrites_tables(engine) {
        return engine.execute(&Sql::raw(format!("CREATE TABLE {} AS SELECT * FROM {} WHERE 1 = 0", to.quoted(), from.quoted()))).map(|_| ());
    }
    if let Some(leases) = engine.leases() {
        let parts = leases.partition_columns(from)?;
        if let [p] = parts.as_slice() {
            let columns = leases.table_columns(from)?.ok_or_else(|| Error::Internal(format!("{from} vanished while the sandbox was made")))?;
            return leases.create_table(to, &columns, Some(p));
        }
    }
    engine.execute(&Sql::raw(format!("CREATE TABLE {} AS SELECT * FROM {} WHERE 1 = 0", to.quoted(), from.quoted()))).map(|_| ())
}

/// Drops what this check created (each step tried; the first error returned).
fn cleanup(engine: &mut dyn Engine, sb: &Sandbox) -> Result<()> {
    let baseline = crate::tools::drop_snapshot(engine, &sb.baseline);
    let mut tombstones = Ok(());
    for side in [&sb.tombstones, &sb.history_log] {
        let dropped = match engine.table_columns(side) {
            Ok(Some(_)) => engine.execute(&Sql::raw(format!("DROP TABLE {}", side.quoted()))).map(|_| ()),
            Ok(None) => Ok(()),
            Err(e) => Err(e),
        };
        tombstones = tombstones.and(dropped);
    }
    let schema = engine.execute(&Sql::raw(format!("DROP SCHEMA IF EXISTS {} CASCADE", quote_ident(&sb.schema)))).map(|_| ());
    let ledger_table = TableName { schema: ledger::SCHEMA.into(), table: ledger::TABLE.into() };
    // Spark's ledger is a plain parquet table: removing rows would rewrite
    // it, racing the rows concurrent runs append. The sandbox's rows stay
    // there, under `<job>~mutation~<hex>`, a name no job can have.
    let keeps_rows = rewrites_tables(engine);
    let ledger_rows = match engine.table_columns(&ledger_table) {
        Ok(Some(_)) if keeps_rows => Ok(()),
        Ok(Some(_)) => {
            let mut sql = Sql::new();
            sql.push("DELETE FROM ").push(&ledger_table.quoted()).push(" WHERE job = ").typed_param(Value::Text(sb.job_name.clone()), "VARCHAR");
            engine.execute(&sql).map(|_| ())
        }
        Ok(None) => Ok(()),
        Err(e) => Err(e),
    };
    baseline.and(tombstones).and(schema).and(ledger_rows)
}

/// Copies each table into the sandbox in row-hash order, ascending or
/// descending: the same rows, stored in opposite orders.
fn copy_sources(engine: &mut dyn Engine, sb: &Sandbox, tables: &[TableName], descending: bool) -> Result<()> {
    for t in tables {
        let copy = sb.table(t);
        let cols = engine.table_columns(t)?.unwrap_or_default();
        let order = match engine.dialect().native_row_hash("t", &cols) {
            Some(h) => format!(" ORDER BY {h}{}", if descending { " DESC" } else { "" }),
            None => String::new(),
        };
        engine.execute(&Sql::raw(format!("DROP TABLE IF EXISTS {}", copy.quoted())))?;
        engine.execute(&Sql::raw(format!("CREATE TABLE {} AS SELECT * FROM {} AS t{order}", copy.quoted(), t.quoted())))?;
    }
    Ok(())
}

fn inconclusive(message: String) -> MutationEvidence {
    MutationEvidence {
        outcome: "inconclusive".into(),
        table: String::new(),
        column: String::new(),
        row: Vec::new(),
        change: String::new(),
        candidates_tried: 0,
        output_rows_removed: 0,
        output_rows_added: 0,
        output_keys_changed: None,
        sample: Vec::new(),
        message,
    }
}

fn check(
    job: &Job,
    run_date: RunDate,
    engine: &mut dyn Engine,
    mutate_key: &[(String, String)],
    sb: &Sandbox,
) -> Result<(Option<OrderEvidence>, MutationEvidence)> {
    // 1. The tables the source reads (those that exist), copied into the
    //    sandbox. A file source's rows are loaded into a sandbox table that
    //    the query reads as `input`.
    let mut tables: Vec<TableName> = Vec::new();
    let mut renames: Vec<(usize, usize, String)> = Vec::new();
    let files_table = TableName { schema: sb.schema.clone(), table: "input".into() };
    if let Some(source) = &job.source.files {
        let Some(mut files) = source.resolve(run_date)? else {
            return Ok((None, inconclusive(format!("no file matches {} (allow_missing = true), so there is no input row to change", source.expand(run_date).display()))));
        };
        files.fetch()?;
        let relation = crate::engine::file_input(engine).and_then(|f| f.stage_files(&files));
        let loaded = relation.and_then(|relation| {
            let mut sql = Sql::new();
            sql.push(&format!("CREATE TABLE {} AS SELECT * FROM ", files_table.quoted())).append(&relation);
            engine.execute(&sql)
        });
        let released = crate::run::input::release_files(engine);
        loaded?;
        released?;
        tables.push(files_table.clone());
    }
    for (t, start, end) in table_refs(&job.source.sql)? {
        if tables.contains(&t) || engine.table_columns(&t)?.is_some() {
            renames.push((start, end, sb.table(&t).quoted()));
            if !tables.contains(&t) {
                tables.push(t);
            }
        }
    }
    let Some(main) = tables.iter().find(|t| **t != job.target).or(tables.first()).cloned() else {
        return Ok((None, inconclusive("the source reads no table, so there is no input row to change".into())));
    };
    copy_sources(engine, sb, &tables, false)?;
    // The target starts empty (its columns and types only): each sandbox
    // run starts from the same state, so a merge's output is the batch's own.
    let target = sb.table(&job.target);
    let reset_target = !tables.contains(&job.target) && engine.table_columns(&job.target)?.is_some();
    if reset_target {
        create_empty_like(engine, &job.target, &target)?;
    }
    let mut sql = job.source.sql.clone();
    renames.sort_by_key(|r| std::cmp::Reverse(r.0));
    for (start, end, name) in renames {
        sql.replace_range(start..end, &name);
    }
    if job.source.files.is_some() {
        sql = format!("WITH \"input\" AS (SELECT * FROM {}) SELECT * FROM (\n{sql}\n) AS \"fixpoint_source\"", sb.table(&files_table).quoted());
    }
    let mut sandbox = job.clone();
    sandbox.name = sb.job_name.clone();
    sandbox.target = target.clone();
    sandbox.source = job.source.with_sql(sql)?;
    sandbox.source.files = None;
    let force = RunOptions { force: true, ..Default::default() };

    // Where a table cannot lose rows in place (Spark's parquet tables),
    // the sandbox's tables are emptied by making them again.
    let remade = rewrites_tables(engine);
    let empty = |engine: &mut dyn Engine, t: &TableName, like: Option<&TableName>| -> Result<()> {
        match (remade, like) {
            (true, like) => {
                engine.execute(&Sql::raw(format!("DROP TABLE IF EXISTS {}", t.quoted())))?;
                like.map_or(Ok(()), |like| create_empty_like(engine, like, t))
            }
            (false, _) => engine.execute(&Sql::raw(format!("DELETE FROM {}", t.quoted()))).map(|_| ()),
        }
    };
    let run = |engine: &mut dyn Engine| -> Result<()> {
        if reset_target && job.strategy == Strategy::Merge {
            empty(engine, &target, Some(&job.target))?;
        }
        // A history is a function of every batch it has seen: each sandbox
        // run starts from an empty table and log, so runs differ only by
        // their input. (A log dropped is made again by the run, stored as
        // the table is.)
        if job.strategy == Strategy::History {
            if engine.table_columns(&target)?.is_some() {
                empty(engine, &target, Some(&job.target))?;
            }
            if engine.table_columns(&sb.history_log)?.is_some() {
                empty(engine, &sb.history_log, None)?;
            }
        }
        sandbox.load_with(run_date, engine, &force).map(|_| ())
    };

    // 2. The baseline: one run in the sandbox.
    run(engine)?;
    let cols: Vec<Column> =
        engine.table_columns(&target)?.unwrap_or_default().into_iter().filter(|c| !job.metadata.contains(&c.name)).collect();
    let scope_rows = |sql: &mut Sql| {
        sql.push("SELECT ").push(&cols.iter().map(|c| format!("s.{}", quote_ident(&c.name))).collect::<Vec<_>>().join(", ")).push(" FROM ");
        let filter = match (job.strategy, job.partition.as_deref()) {
            (Strategy::ReplacePartition, Some(p)) => Some(Filter::DateEquals(p, run_date.date())),
            _ => None,
        };
        Scope::Table { table: &target, filter }.write_from(sql, "s");
    };
    let mut baseline = Sql::new();
    scope_rows(&mut baseline);
    let baseline_table = sb.baseline.as_str();
    crate::tools::snapshot(engine, baseline_table, &baseline)?;
    let diff = |removed: bool, what: &str| {
        let mut sql = Sql::new();
        sql.push(&format!("SELECT {what} FROM ("));
        if removed {
            sql.push(&format!("SELECT * FROM {baseline_table} EXCEPT ALL "));
            scope_rows(&mut sql);
        } else {
            scope_rows(&mut sql);
            sql.push(&format!(" EXCEPT ALL SELECT * FROM {baseline_table}"));
        }
        sql.push(") AS d");
        sql
    };
    let compare = |engine: &mut dyn Engine| -> Result<(u64, u64, Vec<String>)> {
        let removed = count(engine, &diff(true, "count(*) AS \"n\""))?;
        let added = count(engine, &diff(false, "count(*) AS \"n\""))?;
        let mut sample = Vec::new();
        if removed + added > 0 {
            for (removed, label) in [(true, "before"), (false, "after")] {
                let mut sql = diff(removed, "*");
                sql.push(" LIMIT 5");
                let rows = engine.query(&sql)?;
                for r in rows.rows {
                    let pairs: Vec<String> = rows.columns.iter().zip(&r).map(|(c, v)| format!("{c}: {}", v.display())).collect();
                    sample.push(format!("{label}: {{{}}}", pairs.join(", ")));
                }
            }
        }
        Ok((removed, added, sample))
    };

    // 3. The order check: the same input rows stored in the opposite order
    //    must give the same output (a ROW_NUMBER over ties, a LIMIT or a
    //    first_value without a full ORDER BY follow the storage order).
    let order = if tables.contains(&job.target) {
        OrderEvidence { outcome: "skipped".into(), output_rows_removed: 0, output_rows_added: 0, sample: Vec::new(), message: "the source reads the target".into() }
    } else {
        copy_sources(engine, sb, &tables, true)?;
        run(engine)?;
        let (removed, added, sample) = compare(engine)?;
        copy_sources(engine, sb, &tables, false)?;
        run(engine)?;
        let passed = removed + added == 0;
        let message = if passed {
            "the same input stored in the opposite order gave the same output".to_owned()
        } else {
            format!(
                "the same input stored in the opposite order changed {} output rows ({removed} before, {added} after): the result depends on row order (ties in a ROW_NUMBER/RANK ORDER BY, LIMIT or first_value without a total order?)",
                removed.max(added)
            )
        };
        OrderEvidence { outcome: if passed { "passed" } else { "failed" }.into(), output_rows_removed: removed, output_rows_added: added, sample, message }
    };

    // 3. The column to change: not the partition, key, version or metadata;
    //    a measure if there is one (decimal, float: + 1), else an integer
    //    that does not look like an identifier, else text (|| '~'), else a
    //    boolean, else any integer.
    let main_copy = sb.table(&main);
    let main_name = if main == files_table { "input (the day's files)".to_owned() } else { main.to_string() };
    let main_cols = engine.table_columns(&main_copy)?.unwrap_or_default();
    let mut fixed: Vec<&str> = job.metadata.iter().map(String::as_str).collect();
    fixed.extend(job.partition.as_deref());
    if let Some(m) = &job.merge {
        fixed.extend(m.key.iter().map(String::as_str));
        fixed.push(&m.version);
    }
    let id_like = |c: &Column| {
        let n = c.name.to_ascii_lowercase();
        n == "id" || n.ends_with("_id")
    };
    let classes: Vec<(Column, &'static str)> = main_cols.iter().map(|c| (c.clone(), engine.dialect().portable_value("x", c).1)).collect();
    let pick = |want: &[&str], ids: Option<bool>| {
        classes.iter().find(|(c, class)| !fixed.contains(&c.name.as_str()) && want.contains(class) && ids.map_or(true, |i| id_like(c) == i)).map(|(c, _)| c.clone())
    };
    let plus = |c: Column| {
        let (sql, text) = (format!("{} + 1", quote_ident(&c.name)), format!("{} + 1", c.name));
        (c, sql, text)
    };
    let Some((column, change, change_text)) = pick(&["decimal", "float"], None)
        .map(plus)
        .or_else(|| pick(&["int"], Some(false)).map(plus))
        .or_else(|| pick(&["text"], None).map(|c| (c.clone(), format!("{} || '~'", quote_ident(&c.name)), format!("{} || '~'", c.name))))
        .or_else(|| pick(&["bool"], None).map(|c| (c.clone(), format!("NOT {}", quote_ident(&c.name)), format!("NOT {}", c.name))))
        .or_else(|| pick(&["int"], None).map(plus))
    else {
        return Ok((Some(order), inconclusive(format!("{main} has no number, text or boolean column outside the key, version, partition and metadata to change"))));
    };

    // 4. Candidate rows, in a deterministic order (by row hash).
    // A row is named by the engine's row id, or (where it has none: a
    // Delta table's rows live in files) by the text of its values.
    let row_id = engine.dialect().row_id();
    let Some(row_hash) = engine.dialect().native_row_hash("t", &main_cols) else {
        return Ok((Some(order), inconclusive(format!("{} cannot order the rows of {main}", engine.name()))));
    };
    let id_expr = match row_id {
        Some((rid, _, _)) => format!("CAST(t.{rid} AS VARCHAR)"),
        None => format!("CAST({row_hash} AS VARCHAR)"),
    };
    let mut cand = Sql::new();
    cand.push(&format!("SELECT {id_expr}, CAST(t.{} AS VARCHAR) FROM {} AS t WHERE t.{} IS NOT NULL", quote_ident(&column.name), main_copy.quoted(), quote_ident(&column.name)));
    if let (Strategy::ReplacePartition, Some(p)) = (job.strategy, job.partition.as_deref()) {
        if main_cols.iter().any(|c| c.name == p) {
            cand.push(" AND t.").ident(p).push(" = ").typed_param(Value::Date(run_date.date()), "DATE");
        }
    }
    for (k, v) in mutate_key {
        if !main_cols.iter().any(|c| &c.name == k) {
            return Err(Error::argument(
                format!("--mutate-key {k}={v}: {main} has no column {k:?}"),
                Some(&format!("its columns are {}", main_cols.iter().map(|c| c.name.as_str()).collect::<Vec<_>>().join(", "))),
            ));
        }
        cand.push(" AND CAST(t.").ident(k).push(" AS VARCHAR) = ").typed_param(Value::Text(v.clone()), "VARCHAR");
    }
    cand.push(&format!(" ORDER BY {row_hash}, {id_expr} LIMIT {CANDIDATES}"));
    let candidates = engine.query(&cand)?.rows;
    if candidates.is_empty() {
        return Ok((
            Some(order),
            inconclusive(if mutate_key.is_empty() {
                format!("{main} has no row for {run_date} with a value in {} to change", column.name)
            } else {
                format!("no row of {main} matches --mutate-key")
            }),
        ));
    }

    let key_cols: Option<Vec<String>> = job.merge.as_ref().map(|m| m.key.clone());
    for (tried, c) in candidates.iter().enumerate() {
        let (id, original) = (text(&c[0]), c[1].clone());
        let mut row_sql = Sql::new();
        row_sql.push(&format!("SELECT * FROM {} AS t WHERE {id_expr} = ", main_copy.quoted())).typed_param(Value::Text(id.clone()), "VARCHAR");
        let row_rows = engine.query(&row_sql)?;
        let row: Vec<String> = row_rows
            .columns
            .iter()
            .zip(row_rows.rows.first().cloned().unwrap_or_default())
            .map(|(n, v)| format!("{n}={}", v.display()))
            .collect();
        let table = main_copy.quoted();
        let col = quote_ident(&column.name);
        let (removed, added, sample) = match row_id {
            Some((rid, rid_type, rid_stable)) => {
                let mut update = Sql::new();
                update.push(&format!("UPDATE {table} SET {col} = {change} WHERE {rid} = "));
                update.typed_param(Value::Text(id.clone()), rid_type);
                let new_id = if rid_stable {
                    engine.execute(&update)?;
                    id.clone()
                } else {
                    update.push(&format!(" RETURNING CAST({rid} AS VARCHAR)"));
                    engine.query(&update)?.rows.first().map(|r| text(&r[0])).ok_or_else(|| Error::Internal("the mutated row vanished".into()))?
                };
                run(engine)?;
                let (removed, added, sample) = compare(engine)?;
                if removed + added == 0 {
                    // This row does not feed the output: put it back, try the next.
                    let mut revert = Sql::new();
                    revert.push(&format!("UPDATE {table} SET {col} = "));
                    revert.typed_param(original, &column.ty).push(&format!(" WHERE {rid} = ")).typed_param(Value::Text(new_id), rid_type);
                    engine.execute(&revert)?;
                    continue;
                }
                (removed, added, sample)
            }
            None => {
                // The row's values as text, each column matched by them (an
                // identical row is the same row).
                let mut values = Sql::new();
                values.push("SELECT ");
                for (i, c) in main_cols.iter().enumerate() {
                    values.push(if i > 0 { ", " } else { "" }).push(&format!("CAST(t.{} AS VARCHAR)", quote_ident(&c.name)));
                }
                values.push(&format!(" FROM {table} AS t WHERE {id_expr} = ")).typed_param(Value::Text(id.clone()), "VARCHAR");
                let texts: Vec<Value> = engine.query(&values)?.rows.into_iter().next().ok_or_else(|| Error::Internal("the picked row vanished".into()))?;
                let matching = |sql: &mut Sql, texts: &[Value]| {
                    for (i, (c, v)) in main_cols.iter().zip(texts).enumerate() {
                        sql.push(if i > 0 { " AND " } else { "" }).push(&format!("CAST({} AS VARCHAR) IS NOT DISTINCT FROM ", quote_ident(&c.name)));
                        sql.typed_param(v.clone(), "VARCHAR");
                    }
                };
                let mut cond = Sql::new();
                matching(&mut cond, &texts);
                set_where(engine, &main_copy, &main_cols, &column.name, &Sql::raw(change.clone()), &cond)?;
                run(engine)?;
                let (removed, added, sample) = compare(engine)?;
                if removed + added == 0 {
                    // Put it back: the rows as changed, matched by their new value.
                    let at = main_cols.iter().position(|c| c.name == column.name).expect("a column of the table");
                    let mut changed = Sql::new();
                    changed.push(&format!("SELECT CAST({change} AS VARCHAR) FROM (SELECT CAST(")).typed_param(texts[at].clone(), "VARCHAR").push(&format!(" AS {}) AS {col}) AS x", column.ty));
                    let mut now = texts.clone();
                    now[at] = engine.query(&changed)?.rows.into_iter().next().and_then(|r| r.into_iter().next()).unwrap_or(Value::Null);
                    let mut value = Sql::new();
                    value.push("CAST(").typed_param(texts[at].clone(), "VARCHAR").push(&format!(" AS {})", column.ty));
                    let mut cond = Sql::new();
                    matching(&mut cond, &now);
                    set_where(engine, &main_copy, &main_cols, &column.name, &value, &cond)?;
                    continue;
                }
                (removed, added, sample)
            }
        };
        let keys_changed = match &key_cols {
            Some(keys) => {
                let list = keys.iter().map(|k| quote_ident(k)).collect::<Vec<_>>().join(", ");
                let mut sql = Sql::new();
                sql.push(&format!("SELECT count(*) AS \"n\" FROM (SELECT DISTINCT {list} FROM ("));
                let (a, b) = (diff(true, "*"), diff(false, "*"));
                sql.text.push_str(&a.text);
                sql.params.extend(a.params);
                let offset = sql.params.len();
                sql.push(" UNION ALL ");
                sql.text.push_str(&renumber(&b.text, offset));
                sql.params.extend(b.params);
                sql.push(") AS u) AS k");
                Some(count(engine, &sql)?)
            }
            None => None,
        };
        let (passed, message) = match keys_changed {
            Some(k) => (
                k == 1,
                if k == 1 {
                    format!("changing one input row of {main} ({change_text}) changed the output of exactly one key")
                } else {
                    format!("changing one input row of {main} ({change_text}) changed the output of {k} keys; expected only that row's key")
                },
            ),
            None => (
                removed <= 1 && added <= 1,
                if removed <= 1 && added <= 1 {
                    format!("changing one input row of {main} ({change_text}) changed exactly one output row")
                } else {
                    format!(
                        "changing one input row of {main} ({change_text}) changed {} output rows ({removed} before, {added} after); expected only the row derived from it",
                        removed.max(added)
                    )
                },
            ),
        };
        return Ok((Some(order), MutationEvidence {
            outcome: if passed { "passed" } else { "failed" }.into(),
            table: main_name.clone(),
            column: column.name.clone(),
            row,
            change: change_text.clone(),
            candidates_tried: tried + 1,
            output_rows_removed: removed,
            output_rows_added: added,
            output_keys_changed: keys_changed,
            sample,
            message,
        }));
    }
    let mut ev = inconclusive(format!(
        "changing {} of any of the first {} candidate rows of {main} left the output unchanged",
        column.name,
        candidates.len()
    ));
    ev.table = main_name;
    ev.column = column.name.clone();
    ev.candidates_tried = candidates.len();
    Ok((Some(order), ev))
}

/// Shifts `$n` placeholders by `offset` (to append one statement's text to another's).
fn renumber(text: &str, offset: usize) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '$' && chars.peek().is_some_and(|d| d.is_ascii_digit()) {
            let mut n = String::new();
            while let Some(d) = chars.peek().filter(|d| d.is_ascii_digit()) {
                n.push(*d);
                chars.next();
            }
            out.push_str(&format!("${}", n.parse::<usize>().expect("digits") + offset));
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_schema_qualified_tables_with_their_spans() {
        let sql = "SELECT o.x, b.\"Orders\".y FROM bronze.Orders AS o JOIN \"Bronze\".\"Orders\" AS q ON o.c = q.c -- other.t\nJOIN a.b.c ON true WHERE o.dt = :run_date";
        let refs = table_refs(sql).unwrap();
        let names: Vec<(String, &str)> = refs.iter().map(|(t, s, e)| (t.to_string(), &sql[*s..*e])).collect();
        assert_eq!(
            names,
            vec![
                ("o.x".to_string(), "o.x"),
                ("bronze.orders".to_string(), "bronze.Orders"),
                ("Bronze.Orders".to_string(), "\"Bronze\".\"Orders\""),
                ("o.c".to_string(), "o.c"),
                ("q.c".to_string(), "q.c"),
                ("o.dt".to_string(), "o.dt"),
            ],
            "three-part names and comments are skipped; the caller keeps only names of existing tables"
        );
    }

    #[test]
    fn renumbers_placeholders() {
        assert_eq!(renumber("a = $1 AND b = $12 AND c = '$'", 3), "a = $4 AND b = $15 AND c = '$'");
    }
}
