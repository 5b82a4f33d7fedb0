//! The SQL pieces of the merge plans: key and tie conditions, the dedup.


use crate::engine::{query_count, statement_context, Engine};
use crate::error::Result;
use crate::job::ident::{quote_ident, TableName};
use crate::job::spec::MergeSpec;
use crate::job::sql::Sql;
use crate::run::ledger;

/// The batch's tombstone flag.
pub const DELETED: &str = "__fixpoint_deleted";

/// `alias."col"`.
pub fn q(alias: &str, col: &str) -> String {
    format!("{alias}.{}", quote_ident(col))
}

/// `a`'s key columns equal `b`'s.
pub fn keys_match(a: &str, b: &str, keys: &[String]) -> String {
    keys.iter().map(|k| format!("{} = {}", q(a, k), q(b, k))).collect::<Vec<_>>().join(" AND ")
}

/// `a` sorts strictly before `b` over `cols` (ascending, NULLs first).
pub fn sorts_before(a: &str, b: &str, cols: &[String]) -> String {
    if cols.is_empty() {
        return "false".into();
    }
    let mut s = String::from("CASE");
    for c in cols {
        let (x, y) = (q(a, c), q(b, c));
        s.push_str(&format!(" WHEN {x} IS DISTINCT FROM {y} THEN ({x} IS NULL OR ({y} IS NOT NULL AND {x} < {y}))"));
    }
    s.push_str(" ELSE false END");
    s
}

/// `a` and `b` differ in one of `cols` (NULLs compared as values).
pub fn rows_differ(a: &str, b: &str, cols: &[String]) -> String {
    if cols.is_empty() {
        return "false".into();
    }
    cols.iter().map(|c| format!("{} IS DISTINCT FROM {}", q(a, c), q(b, c))).collect::<Vec<_>>().join(" OR ")
}

/// A tie in the batch: a source row `s` of the kept row `b`'s key at its
/// version, both upserts, that differs from it in `compared`. A tombstone
/// at the newest version wins over any upsert there (the dedup orders it
/// first), so only two upserts can tie.
pub fn batch_tie_cond(spec: &MergeSpec, compared: &[String]) -> String {
    let (version, del) = (quote_ident(&spec.version), quote_ident(DELETED));
    format!(
        "{} AND s.{version} = b.{version} AND NOT s.{del} AND NOT b.{del} AND ({})",
        keys_match("s", "b", &spec.key),
        rows_differ("s", "b", compared)
    )
}

/// Where the tombstones of `target` are remembered.
pub fn tombstone_table(target: &TableName) -> TableName {
    TableName { schema: ledger::SCHEMA.into(), table: format!("tombstones__{}__{}", target.schema, target.table) }
}

/// The count of a query `SELECT count(…) AS "n" FROM …`.
pub fn count(engine: &mut dyn Engine, sql: &Sql) -> Result<u64> {
    query_count(engine, sql, "n", &statement_context(&sql.text))
}

/// One row per key of `stage`: the newest version, a tombstone first at
/// equal version, then the values' total order (`compared`, then the
/// metadata columns, ascending, NULLs first).
pub fn dedup_sql(spec: &MergeSpec, names: &[String], compared: &[String], meta_cols: &[String], stage: &str) -> String {
    let version = quote_ident(&spec.version);
    let key_list = spec.key.iter().map(|k| quote_ident(k)).collect::<Vec<_>>().join(", ");
    let order = std::iter::once(format!("{version} DESC"))
        .chain([format!("{} DESC", quote_ident(DELETED))])
        .chain(compared.iter().chain(meta_cols.iter()).map(|c| format!("{} ASC NULLS FIRST", quote_ident(c))))
        .collect::<Vec<_>>()
        .join(", ");
    let all = names.iter().map(|c| quote_ident(c)).chain([quote_ident(DELETED)]).collect::<Vec<_>>().join(", ");
    format!("SELECT {all} FROM (SELECT *, row_number() OVER (PARTITION BY {key_list} ORDER BY {order}) AS \"__fixpoint_rank\" FROM {stage}) AS r WHERE \"__fixpoint_rank\" = 1")
}

/// The batch's flag on the row [`dedup_tie_sql`] keeps: its key has a
/// tie at that row's version.
pub const BATCH_TIE: &str = "__fixpoint_batch_tie";

/// [`dedup_sql`] with the tie check of [`batch_tie_cond`] read off the same
/// window, as a flag [`BATCH_TIE`] on each kept row: the rows of a key are
/// sorted by version, tombstone, then `compared`, so equal values are next
/// to each other and a key has a tie at its kept (upsert) row's version
/// exactly when two neighbouring upserts at that version differ. One sort
/// of the batch, and no join of the batch with itself.
pub fn dedup_tie_sql(spec: &MergeSpec, names: &[String], compared: &[String], meta_cols: &[String], stage: &str) -> String {
    let (version, del) = (quote_ident(&spec.version), quote_ident(DELETED));
    let key_list = spec.key.iter().map(|k| quote_ident(k)).collect::<Vec<_>>().join(", ");
    let order = std::iter::once(format!("{version} DESC"))
        .chain([format!("{del} DESC")])
        .chain(compared.iter().chain(meta_cols.iter()).map(|c| format!("{} ASC NULLS FIRST", quote_ident(c))))
        .collect::<Vec<_>>()
        .join(", ");
    let window = format!("OVER (PARTITION BY {key_list} ORDER BY {order})");
    let differ = if compared.is_empty() {
        "false".to_owned()
    } else {
        compared.iter().map(|c| format!("lead({c}) {window} IS DISTINCT FROM {c}", c = quote_ident(c))).collect::<Vec<_>>().join(" OR ")
    };
    let pair = format!("NOT {del} AND lead({version}) {window} = {version} AND NOT lead({del}) {window} AND ({differ})");
    let all = names.iter().map(|c| quote_ident(c)).chain([del.clone()]).collect::<Vec<_>>().join(", ");
    let tie = quote_ident(BATCH_TIE);
    format!(
        "SELECT {all}, coalesce(NOT {del} AND \"__fixpoint_pair_version\" = {version}, false) AS {tie} FROM (\
         SELECT *, max(CASE WHEN \"__fixpoint_pair\" THEN {version} END) OVER (PARTITION BY {key_list}) AS \"__fixpoint_pair_version\" FROM (\
         SELECT *, row_number() {window} AS \"__fixpoint_rank\", coalesce({pair}, false) AS \"__fixpoint_pair\" FROM {stage}) AS i) AS r \
         WHERE \"__fixpoint_rank\" = 1"
    )
}

/// The MERGE's actions from batch `b`: the UPDATE's SET list (every column
/// but the key, and but `kept`, a column the UPDATE's condition only lets
/// through when the target holds the batch's value), the INSERT's column
/// list and its values.
pub fn merge_actions(spec: &MergeSpec, names: &[String], kept: Option<&str>) -> (String, String, String) {
    let set = names
        .iter()
        .filter(|c| !spec.key.contains(c) && Some(c.as_str()) != kept)
        .map(|c| format!("{} = b.{}", quote_ident(c), quote_ident(c)))
        .collect::<Vec<_>>()
        .join(", ");
    let col_list = names.iter().map(|c| quote_ident(c)).collect::<Vec<_>>().join(", ");
    let values = names.iter().map(|c| q("b", c)).collect::<Vec<_>>().join(", ");
    (set, col_list, values)
}
