//! PostgreSQL's [`Accelerator::merge`]: an upsert-only batch in one
//! statement, the hand-written SQL's own dedup window and writes with every
//! check riding on them.
//!
//! PostgreSQL 15's `MERGE` returns no rows, so the statement is a chain of
//! common table expressions whose writes say what they wrote
//! (`RETURNING`):
//!
//! - `s`: the source, read once, each row's input hash beside it;
//! - `r`: the dedup window (newest version first, then the compared
//!   columns, then the metadata), and a second window over the same sort
//!   whose `dense_rank` tells a tie in the batch (another row of the key at
//!   its newest version that differs in the compared columns);
//! - `c`: the kept rows joined with the target on the key (index lookups
//!   where the key has an index): what each row does (update, insert,
//!   left alone), ties with the target, keys held in another partition, the
//!   target's row id, and the hash of the rows left alone;
//! - `u`, `i`: the `UPDATE` (by row id: no second lookup) and the `INSERT`,
//!   each returning the hash of the row as the table now holds it (the
//!   target's types) — or, where the target's columns are the source's
//!   with the same types, the input hash carried through, computed once;
//! - the final `SELECT`: the counts and sums of all of them in one row.
//!
//! Everything that must refuse the run (a NULL key or version, a tie, a
//! key the target holds twice or in another partition) is counted, not
//! written (a NULL key's row is held back from the INSERT); the
//! accelerator then declines, the transaction is rolled back, and the
//! portable plan explains the refusal with the rows involved.
//!
//! Where an index makes the key unique in the target (a primary key, say),
//! the writes need no row ids: `u` is the `UPDATE` itself, joined with the
//! kept rows on the key (the lookups the hand-written `MERGE` makes), and
//! only the kept rows it did not update are looked up again (`c`, found
//! by sorting the kept rows with the updated keys: `w`), to be inserted,
//! or left alone and checked. The
//! target's rows are then read once per updated key instead of twice (a
//! lookup, then a fetch by row id), and nothing wide is materialized
//! between them. A batch of replays (nothing newer) pays two lookups per
//! key and writes nothing.
//!
//! [`Accelerator::merge`]: fixpoint_core::engine::Accelerator::merge

use fixpoint_core::engine::measure::{fingerprint_select, row_hash};
use fixpoint_core::engine::{Accelerated, Column, Dialect, Engine, MergeRequest, Merged, RunSteps};
use fixpoint_core::fingerprint::{Fingerprint, Method};
use fixpoint_core::job::ident::quote_ident;
use fixpoint_core::job::spec::OnTie;
use fixpoint_core::job::sql::Sql;
use fixpoint_core::plans::merge::sql::{keys_match, merge_actions, q, rows_differ, tombstone_table};
use fixpoint_core::plans::merge::steps::Conditions;
use fixpoint_core::{Error, FailPoint, Result, TableName, Value};

use crate::Postgres;

/// Whether the merge can be one statement: no tombstones to honour or
/// remember and no audits (both read a batch table this plan never makes).
pub(crate) fn fits(pg: &mut Postgres, m: &MergeRequest<'_>) -> Result<bool> {
    if m.spec.deleted.is_some() || !m.job.audits.is_empty() {
        return Ok(false);
    }
    Ok(pg.table_columns(&tombstone_table(&m.job.target))?.is_none())
}

/// Column names the statement adds; no user column starts with
/// `__fixpoint_` (the spec refuses such names).
const H: &str = "\"__fixpoint_h\"";
const RANK: &str = "\"__fixpoint_rank\"";
const DRANK: &str = "\"__fixpoint_drank\"";
const TOP: &str = "\"__fixpoint_top\"";
const TID: &str = "\"__fixpoint_tid\"";
const TOID: &str = "\"__fixpoint_toid\"";
const MATCHED: &str = "\"__fixpoint_matched\"";
const UPD: &str = "\"__fixpoint_upd\"";
const NULLS: &str = "\"__fixpoint_nulls\"";
const TH: &str = "\"__fixpoint_th\"";
const TAG: &str = "\"__fixpoint_tag\"";
const ANY: &str = "\"__fixpoint_any\"";

/// The plan: the statement, its counts checked, the output fingerprint.
pub(crate) fn merge(pg: &mut Postgres, m: &MergeRequest<'_>, steps: &mut dyn RunSteps) -> Result<Accelerated<Merged>> {
    let output_cols: Vec<Column> = m.target_cols.iter().filter(|c| !m.job.metadata.contains(&c.name)).cloned().collect();
    let fp = fingerprint_select(pg, Method::Native, "t", &output_cols)?;
    let (input_hash, kind, signature) = row_hash(pg, Method::Native, "x", m.input_cols)?;
    if let Some(hint) = pg.plan_key_lookups() {
        pg.query(&Sql::raw(hint.to_owned()))?;
    }
    steps.fail_point(FailPoint::AfterGuards)?;
    let unique = key_is_unique(pg, &m.job.target, &m.spec.key)?;
    let sql = statement(pg, m, &output_cols, &input_hash, unique)?;
    let rows = pg.query(&sql)?;
    steps.step("merge statement");
    let row = rows.single("the merge statement")?;
    let n = |c: &str| row.count(c);
    let sum = |c: &str| -> Result<i128> { pg.read_sum(row.value(c)?) };
    if n("null_keys")? > 0 || n("ties")? > 0 || n("cross_ties")? > 0 || n("elsewhere")? > 0 {
        return Ok(Accelerated::Declined("a NULL key or version, a tie, or a key held in another partition"));
    }
    let batch_rows = n("batch_rows")?;
    if n("joined")? != batch_rows {
        return Ok(Accelerated::Declined("a key the target holds more than once"));
    }
    let (updates, inserts) = (n("updates")?, n("inserts")?);
    if updates != n("planned_updates")? || inserts != n("planned_inserts")? {
        return Err(Error::Internal(format!(
            "the merge updated {updates} and inserted {inserts} rows, but {} updates and {} inserts were planned; rolled back",
            n("planned_updates")?,
            n("planned_inserts")?
        )));
    }
    steps.fail_point(FailPoint::AfterDelete)?;
    steps.fail_point(FailPoint::MidInsert)?;
    let input_rows = n("input_rows")?;
    let input = Fingerprint::from_sum(&kind, &signature, input_rows, sum("input_sum")?);
    let duplicates_collapsed =
        input_rows.checked_sub(batch_rows).ok_or_else(|| Error::Internal(format!("the batch has {batch_rows} keys but the source {input_rows} rows")))?;
    steps.fail_point(FailPoint::AfterInsert)?;
    let left_alone = n("left_alone")?;
    if updates + inserts + left_alone != batch_rows {
        return Err(Error::Internal(format!(
            "a {batch_rows}-key batch updated {updates}, inserted {inserts} and left {left_alone} alone; rolled back"
        )));
    }
    let output = fp.of(batch_rows, sum("written_sum")? + sum("left_sum")?);
    steps.step("output fp");
    let method = if unique { "merge, one statement, updates on the key" } else { "merge, one statement" };
    Ok(Accelerated::Done(Merged { input, output, inserts, updates, deletes: 0, batch_rows, duplicates_collapsed, rows_before: None, method }))
}

/// Whether an index makes `key` unique in `table`: a valid, immediately
/// checked, unique index on columns that are all key columns, with no
/// predicate and no expression. Two rows of one key can then not exist, and
/// the statement updates on the key itself.
pub(crate) fn key_is_unique(pg: &mut Postgres, table: &TableName, key: &[String]) -> Result<bool> {
    let mut sql = Sql::new();
    sql.push(
        "SELECT CAST(i.indexrelid AS BIGINT), a.attname::text FROM pg_index i \
         JOIN pg_class c ON c.oid = i.indrelid JOIN pg_namespace n ON n.oid = c.relnamespace \
         JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY (i.indkey) \
         WHERE n.nspname = ",
    )
    .param(Value::Text(table.schema.clone()))
    .push(" AND c.relname = ")
    .param(Value::Text(table.table.clone()))
    .push(" AND i.indisunique AND i.indisvalid AND i.indimmediate AND i.indpred IS NULL AND i.indexprs IS NULL AND NOT (0 = ANY (i.indkey)) ORDER BY 1");
    let rows = pg.query(&sql)?;
    let mut indexes: std::collections::BTreeMap<String, bool> = std::collections::BTreeMap::new();
    for r in &rows.rows {
        let (id, col) = (r[0].display(), crate::text_of(&r[1]));
        let all = indexes.entry(id).or_insert(true);
        *all &= key.iter().any(|k| *k == col);
    }
    Ok(indexes.values().any(|all| *all))
}

/// The statement (see the module's documentation); `unique`: an index
/// makes the key unique in the target.
fn statement(pg: &Postgres, m: &MergeRequest<'_>, output_cols: &[Column], input_hash: &str, unique: bool) -> Result<Sql> {
    let spec = m.spec;
    let version = quote_ident(&spec.version);
    let target = m.job.target.quoted();
    let key_list = spec.key.iter().map(|k| quote_ident(k)).collect::<Vec<_>>().join(", ");
    let asc = |c: &String| format!("{} ASC NULLS FIRST", quote_ident(c));
    let by_values: Vec<String> = std::iter::once(format!("{version} DESC NULLS FIRST")).chain(m.compared.iter().map(asc)).collect();
    let full: Vec<String> = by_values.iter().cloned().chain(m.meta_cols.iter().map(asc)).collect();
    // The hash of a row as written: the input hash where every target
    // column (metadata aside) is the source's, in order, of the same type
    // (the row's text is then the same); otherwise the row as stored,
    // hashed by RETURNING.
    let hashed_as_read = output_cols.len() == m.input_cols.len() && output_cols.iter().zip(m.input_cols).all(|(o, i)| o.name == i.name && o.ty == i.ty);
    let no_hash = || Error::Internal("the engine has no native row hash".into());
    let written_hash = if hashed_as_read { format!("b.{H}") } else { pg.native_row_hash("t", output_cols).ok_or_else(no_hash)? };
    let target_hash = pg.native_row_hash("t", output_cols).ok_or_else(no_hash)?;
    // Newer than the target's row; NULL (a NULL version in the target)
    // counts as not: the row is left alone, as the portable plan leaves it.
    let newer = format!("coalesce({}, false)", Conditions::of(spec, m.compared).newer);
    let matched = format!("{} IS NOT NULL", q("t", &spec.key[0]));
    let null_key = spec.key.iter().chain([&spec.version]).map(|k| format!("{} IS NULL", q("x", k))).collect::<Vec<_>>().join(" OR ");
    let held = match m.prune {
        Some(p) => format!("coalesce({} = {}, false)", q("t", p), q("b", p)),
        None => "true".to_owned(),
    };
    let cross_tie = match spec.on_tie {
        OnTie::Error => format!("b.{version} = t.{version} AND ({})", rows_differ("b", "t", m.compared)),
        OnTie::Deterministic => "false".to_owned(),
    };
    let batch_tie = match spec.on_tie {
        OnTie::Error => format!("{version} = {TOP} AND {DRANK} > 1"),
        OnTie::Deterministic => "false".to_owned(),
    };
    let (set, col_list, values) = merge_actions(spec, m.names, None);
    let on = keys_match("t", "b", &spec.key);
    let mut sql = Sql::new();
    // r: the source once, with its input hash, whether its key or version
    // is NULL, the dedup window, and the rank of the compared values at
    // each version (the same sort, one column fewer).
    sql.push(&format!("WITH \"r\" AS MATERIALIZED (SELECT x.*, {input_hash} AS {H}, ({null_key}) AS {NULLS}, "));
    sql.push(&format!(
        "row_number() OVER (PARTITION BY {key_list} ORDER BY {full}) AS {RANK}, \
         dense_rank() OVER (PARTITION BY {key_list} ORDER BY {values_order}) AS {DRANK}, \
         first_value({version}) OVER (PARTITION BY {key_list} ORDER BY {values_order}) AS {TOP} FROM ",
        full = full.join(", "),
        values_order = by_values.join(", ")
    ));
    fixpoint_core::engine::measure::Scope::Source { template: m.job.source.template(), params: m.params }.write_from(&mut sql, "x");
    sql.push("), ");
    // What the kept rows `b` that reach it (joined with the target `t`)
    // say: whether the key is held, newer, a tie with the target or held
    // in another partition, and the hash of the target's row left alone.
    let classified = format!(
        "({matched}) AS {MATCHED}, ({matched} AND {newer}) AS {UPD}, \
         ({matched} AND ({cross_tie})) AS \"__fixpoint_cross\", ({matched} AND NOT {held}) AS \"__fixpoint_elsewhere\", \
         CASE WHEN {matched} AND NOT ({newer}) THEN {target_hash} END AS {TH}"
    );
    if set.is_empty() {
        return Err(Error::Internal("a merge with no column to update".into()));
    }
    if unique {
        // u: the UPDATE on the key, of the kept rows that are newer and
        // held in their own partition; e: the kept rows it did not update,
        // looked up again and classified.
        //
        // The kept rows `u` did not update are found without a join of the
        // two (a join of two common table expressions is planned on
        // estimates alone, and an unanalyzed source estimated at one row
        // made it a nested loop, quadratic in the batch): `w` sorts the
        // kept rows together with the updated keys (the rest of their
        // columns NULL) by key and keeps the keys with no update.
        let returned = spec.key.iter().map(|k| format!("{} AS {}", q("b", k), quote_ident(k))).collect::<Vec<_>>().join(", ");
        let r_cols: Vec<String> = m.names.iter().cloned().chain([H, NULLS, RANK, DRANK, TOP].map(|c| c.trim_matches('"').to_owned())).collect();
        let padded = r_cols.iter().map(|c| if spec.key.contains(c) { q("u", c) } else { "NULL".to_owned() }).collect::<Vec<_>>().join(", ");
        sql.push(&format!(
            "\"u\" AS (UPDATE {target} AS t SET {set} FROM \"r\" AS b WHERE {on} AND b.{RANK} = 1 AND {newer} AND {held} \
             RETURNING {returned}, {written_hash} AS {H}), \
             \"w\" AS (SELECT y.* FROM (SELECT z.*, bool_or(z.{TAG}) OVER (PARTITION BY {key_list}) AS {ANY} FROM \
             (SELECT b.*, false AS {TAG} FROM \"r\" AS b WHERE b.{RANK} = 1 UNION ALL SELECT {padded}, true FROM \"u\") AS z) AS y \
             WHERE NOT y.{ANY}), \
             \"c\" AS MATERIALIZED (SELECT b.*, {classified} FROM \"w\" AS b LEFT JOIN {target} AS t ON {on}), "
        ));
    } else {
        // c: the kept rows against the target, with the target's row id;
        // u: the UPDATE by row id (no second lookup).
        sql.push(&format!(
            "\"c\" AS MATERIALIZED (SELECT b.*, t.ctid AS {TID}, t.tableoid AS {TOID}, {classified} \
             FROM \"r\" AS b LEFT JOIN {target} AS t ON {on} WHERE b.{RANK} = 1), \
             \"u\" AS (UPDATE {target} AS t SET {set} FROM \"c\" AS b WHERE t.tableoid = b.{TOID} AND t.ctid = b.{TID} AND b.{UPD} RETURNING {written_hash} AS {H}), "
        ));
    }
    sql.push(&format!(
        "\"i\" AS (INSERT INTO {target} AS t ({col_list}) SELECT {values} FROM \"c\" AS b WHERE NOT b.{MATCHED} AND NOT b.{NULLS} RETURNING {ret} AS \"h\") ",
        // (RETURNING sees only the row inserted, in the target's types.)
        ret = target_hash
    ));
    // One row of counts and sums (a WITH that writes must be the
    // statement's top level: no subquery around it). Where `u` updated on
    // the key, `c` holds only the rows it did not update: a key is joined
    // once in `u` or in `c`, and a row of `c` that is newer and held in its
    // partition is one the update missed (planned, not done).
    let (joined, planned_updates) = if unique {
        ("e.\"looked_up\" + f.\"updates\"", "f.\"updates\" + e.\"missed\"")
    } else {
        ("e.\"looked_up\"", "e.\"missed\"")
    };
    let missed = if unique { format!("{UPD} AND NOT \"__fixpoint_elsewhere\"") } else { UPD.to_owned() };
    sql.push(&format!(
        "SELECT a.*, e.*, f.*, g.*, {joined} AS \"joined\", {planned_updates} AS \"planned_updates\", \
         coalesce(f.\"updated_sum\", 0) + coalesce(g.\"inserted_sum\", 0) AS \"written_sum\" FROM \
         (SELECT count(*) AS \"input_rows\", sum({H}) AS \"input_sum\", count(*) FILTER (WHERE {NULLS}) AS \"null_keys\", \
          count(*) FILTER (WHERE {RANK} = 1) AS \"batch_rows\", count(*) FILTER (WHERE {batch_tie}) AS \"ties\" FROM \"r\") AS a, \
         (SELECT count(*) AS \"looked_up\", count(*) FILTER (WHERE {missed}) AS \"missed\", \
          count(*) FILTER (WHERE NOT {MATCHED} AND NOT {NULLS}) AS \"planned_inserts\", \
          count(*) FILTER (WHERE {MATCHED} AND NOT {UPD}) AS \"left_alone\", sum({TH}) AS \"left_sum\", \
          count(*) FILTER (WHERE \"__fixpoint_cross\") AS \"cross_ties\", count(*) FILTER (WHERE \"__fixpoint_elsewhere\") AS \"elsewhere\" FROM \"c\") AS e, \
         (SELECT count(*) AS \"updates\", sum({H}) AS \"updated_sum\" FROM \"u\") AS f, \
         (SELECT count(*) AS \"inserts\", sum(\"h\") AS \"inserted_sum\" FROM \"i\") AS g"
    ));
    Ok(sql)
}
