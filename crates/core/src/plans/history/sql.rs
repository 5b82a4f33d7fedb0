//! The SQL of the history plan, over the job's columns.

use crate::engine::Column;
use crate::job::ident::{quote_ident, TableName};
use crate::job::spec::{HistorySpec, MergeSpec};
use crate::job::sql::{Sql, Value};
use crate::plans::merge::sql::{keys_match, q, rows_differ, DELETED};
use crate::engine::measure::{FP_ROWS, FP_SUM};
use crate::run::ledger;

/// The staged source, with its tombstone flag.
pub(super) const STAGE: &str = "\"__fixpoint_hstage\"";
/// The batch: one entry per key and version.
pub(super) const BATCH: &str = "\"__fixpoint_hbatch\"";
/// Per touched key: the batch's oldest version and where the rows a run
/// recomputes start.
pub(super) const CUT: &str = "\"__fixpoint_hcut\"";
/// The version log of the touched keys from there on, with the batch.
pub(super) const ALL: &str = "\"__fixpoint_hall\"";
/// The log resolved and walked: the new rows and the new hidden entries.
pub(super) const NEW: &str = "\"__fixpoint_hnew\"";
/// The keys the run touches.
pub(super) const KEYS: &str = "\"__fixpoint_hkeys\"";
/// The touched keys' rows a run can change or must see (read once): the
/// row holding or ending at the batch's oldest version of its key, and
/// every later one (the open row included).
pub(super) const TAIL: &str = "\"__fixpoint_htail\"";
/// In [`TAIL`]: true on its one row that sums up every row of the touched
/// keys (its other columns NULL): [`SUMMARY_ROWS`] of them, whose row
/// hashes sum to [`SUMMARY_SUM`].
pub(super) const SUMMARY: &str = "__fixpoint_summary";
/// In [`TAIL`]'s summary row: how many rows the touched keys have.
pub(super) const SUMMARY_ROWS: &str = "__fixpoint_summary_rows";
/// In [`TAIL`]'s summary row: the sum of their row hashes.
pub(super) const SUMMARY_SUM: &str = "__fixpoint_summary_sum";
/// Under a lease: [`TAIL`] with its [`SUMMARY`] row, which [`TAIL`] then
/// leaves out (a staged relation has no rows to delete).
pub(super) const TAIL_ALL: &str = "\"__fixpoint_htailall\"";
/// [`TAIL`]'s rows (the window: the touched keys' rows from where the run
/// recomputes) matched with the new rows of [`NEW`] by key and start: each
/// row of the window with its columns, each new row with its columns under
/// [`NEW_PREFIX`] and its end, one row per pair or unmatched side, flagged
/// by [`HAS_OLD`], [`HAS_NEW`] and [`SAME`]. What the run writes is read
/// off it: a pair alike is kept (or given its new end), the rest of the
/// window removed, the rest of the new rows inserted.
pub(super) const MATCH: &str = "\"__fixpoint_hmatch\"";
/// In [`MATCH`]: a row of the window is on this row.
pub(super) const HAS_OLD: &str = "__fixpoint_old";
/// In [`MATCH`]: a new row is on this row.
pub(super) const HAS_NEW: &str = "__fixpoint_new";
/// In [`MATCH`]: both, and alike in every column (the new row is the row
/// the table holds, perhaps with another end).
pub(super) const SAME: &str = "__fixpoint_same";
/// In [`MATCH`]: the prefix of a new row's columns.
pub(super) const NEW_PREFIX: &str = "__fixpoint_n_";
/// The log's entries the run removes (key and version).
pub(super) const LOG_GONE: &str = "\"__fixpoint_hloggone\"";
/// Where earlier versions kept [`TAIL`] as the run leaves it (a run now
/// reads it as a subquery of the checks): dropped with the run's other
/// relations.
pub(super) const AFTER: &str = "\"__fixpoint_hafter\"";
/// Where an entry of [`ALL`] came from: 0 the table, 2 its log, 1 the
/// batch, 3 a tombstone a snapshot's absence implies.
pub(super) const ORIGIN: &str = "__fixpoint_origin";
/// In [`CUT`]: the batch's oldest version of the key.
pub(super) const CUT_AT: &str = "__fixpoint_cut";
/// In [`CUT`]: the first version whose rows the run recomputes.
pub(super) const FROM: &str = "__fixpoint_from";
/// In [`NEW`]: the entry starts a row.
pub(super) const START: &str = "__fixpoint_start";
/// In [`NEW`]: the row's end (NULL: open).
pub(super) const TO: &str = "__fixpoint_to";

/// Where the entries of `target`'s version log that the table cannot show
/// are kept: upserts that started no row (same tracked values as the entry
/// before them), and tombstones.
pub fn log_table(target: &TableName) -> TableName {
    TableName { schema: ledger::SCHEMA.into(), table: format!("history__{}__{}", target.schema, target.table) }
}

/// The job's columns and the parts they play.
pub(super) struct Cols<'a> {
    pub spec: &'a MergeSpec,
    pub h: &'a HistorySpec,
    /// The source's columns, in order.
    pub names: Vec<String>,
    /// Columns that tell two entries of one key and version apart (all but
    /// the key, the version and the metadata).
    pub compared: Vec<String>,
    /// Columns whose change makes a new row.
    pub tracked: Vec<String>,
    /// Metadata columns (last in the total order, never compared).
    pub meta: Vec<String>,
    /// An entry's columns with their types (the source's, and in a
    /// snapshot history its version, `valid_from`).
    pub types: Vec<Column>,
    /// The engine's keyword for a CTE computed once ([`crate::engine::Dialect::materialized`]).
    pub materialized: &'static str,
    /// The batch's relation: [`BATCH`], or [`STAGE`] itself when the
    /// source has one row per key and version (nothing to pick).
    pub batch: &'static str,
}

impl Cols<'_> {
    fn list(&self, alias: Option<&str>) -> String {
        self.names.iter().map(|c| alias.map_or_else(|| quote_ident(c), |a| q(a, c))).collect::<Vec<_>>().join(", ")
    }

    /// `"a", "b"` of the source's columns.
    pub fn names_list(&self) -> String {
        self.list(None)
    }

    fn key_list(&self, alias: Option<&str>) -> String {
        self.spec.key.iter().map(|c| alias.map_or_else(|| quote_ident(c), |a| q(a, c))).collect::<Vec<_>>().join(", ")
    }

    fn version(&self) -> String {
        quote_ident(&self.spec.version)
    }

    /// One entry per key and version of `from` (which has the source's
    /// columns, [`DELETED`] and `extra`): a tombstone first, then the
    /// values' total order (compared, then metadata, ascending, NULLs
    /// first), so the same entries give the same pick in any order.
    pub fn first_per_version(&self, from: &str, extra: &[&str]) -> String {
        let order = std::iter::once(format!("{} DESC", quote_ident(DELETED)))
            .chain(self.compared.iter().chain(&self.meta).map(|c| format!("{} ASC NULLS FIRST", quote_ident(c))))
            .collect::<Vec<_>>()
            .join(", ");
        let cols = self.names.iter().map(String::as_str).chain([DELETED]).chain(extra.iter().copied()).map(quote_ident).collect::<Vec<_>>().join(", ");
        format!(
            "SELECT {cols} FROM (SELECT *, row_number() OVER (PARTITION BY {}, {} ORDER BY {order}) AS \"__fixpoint_rank\" FROM {from}) AS r WHERE \"__fixpoint_rank\" = 1",
            self.key_list(None),
            self.version()
        )
    }

    /// How many keys and versions `from` holds entries of (`groups`), and
    /// of those how many more than one (`dups`).
    pub fn duplicates(&self, from: &str) -> String {
        format!(
            "SELECT count(*) AS \"groups\", count(*) FILTER (WHERE \"__fixpoint_c\" > 1) AS \"dups\" FROM (SELECT count(*) AS \"__fixpoint_c\" FROM {from} GROUP BY {}, {}) AS g",
            self.key_list(None),
            self.version()
        )
    }

    /// Two upserts `a` and `b` of one key at one version that differ.
    pub fn tie(&self, a: &str, b: &str) -> String {
        let (v, del) = (self.version(), quote_ident(DELETED));
        format!("{} AND {a}.{v} = {b}.{v} AND NOT {a}.{del} AND NOT {b}.{del} AND ({})", keys_match(a, b, &self.spec.key), rows_differ(a, b, &self.compared))
    }

    /// [`CUT`]: per key of the batch, its oldest version, and the first
    /// version the run recomputes: the start of the earliest row that
    /// holds or ends at that version (a row ending there may extend, when
    /// the entry there changes), else the version itself.
    pub fn cut(&self, rows: &str) -> String {
        let batch = self.batch;
        let (v, vf, vt) = (self.version(), quote_ident(&self.h.valid_from), quote_ident(&self.h.valid_to));
        let keys = self.key_list(Some("c"));
        format!(
            "SELECT {keys}, c.\"{CUT_AT}\", CASE WHEN min(t.{vf}) < c.\"{CUT_AT}\" THEN min(t.{vf}) ELSE c.\"{CUT_AT}\" END AS \"{FROM}\" \
             FROM (SELECT {}, min({v}) AS \"{CUT_AT}\" FROM {batch} GROUP BY {}) AS c \
             LEFT JOIN {rows} AS t ON {} AND (t.{vt} IS NULL OR t.{vt} >= c.\"{CUT_AT}\") \
             GROUP BY {keys}, c.\"{CUT_AT}\"",
            self.key_list(None),
            self.key_list(None),
            keys_match("t", "c", &self.spec.key)
        )
    }

    /// `FROM <table> AS alias JOIN CUT AS c …`: `table`'s entries of the
    /// touched keys at or after where the run recomputes (by `column`).
    pub fn window_from(&self, table: &str, alias: &str, column: &str) -> String {
        format!("{table} AS {alias} JOIN {CUT} AS c ON {} WHERE {alias}.{} >= c.\"{FROM}\"", keys_match(alias, "c", &self.spec.key), quote_ident(column))
    }

    /// [`KEYS`] of a run with a version column: the batch's.
    pub fn batch_keys(&self) -> String {
        let batch = self.batch;
        format!("SELECT DISTINCT {} FROM {batch}", self.key_list(None))
    }

    /// `FROM <target> AS t JOIN KEYS AS k ON …`: every row of the touched
    /// keys (what the output fingerprint covers).
    pub fn touched_from(&self, target: &str) -> String {
        format!("{target} AS t JOIN {KEYS} AS k ON {}", keys_match("t", "k", &self.spec.key))
    }

    /// [`TAIL`]: per key of the batch, the rows holding or ending at the
    /// batch's oldest version or after it, and one more row (the
    /// [`SUMMARY`]) with the count and hash sum of every row of the
    /// touched keys — read in one pass (a join on the key). Older rows end
    /// before anything the run recomputes and are left as they are.
    /// `columns` are the target's columns; `fp` is the output fingerprint's
    /// select list over alias `t`.
    pub fn tail(&self, target: &str, columns: &[String], fp: &str) -> Sql {
        let batch = self.batch;
        let (v, vf, vt) = (self.version(), quote_ident(&self.h.valid_from), quote_ident(&self.h.valid_to));
        let touched = format!(
            "SELECT t.*, c.\"{CUT_AT}\" FROM {target} AS t JOIN (SELECT {}, min({v}) AS \"{CUT_AT}\" FROM {batch} GROUP BY {}) AS c ON {}",
            self.key_list(None),
            self.key_list(None),
            keys_match("t", "c", &self.spec.key)
        );
        let (head, tail) = with_summary(&touched, columns, fp, self.materialized);
        let mut sql = Sql::new();
        sql.push(&head).push(&format!("t.{vt} IS NULL OR t.{vt} >= t.\"{CUT_AT}\" OR t.{vf} >= t.\"{CUT_AT}\"")).push(&tail);
        sql
    }

    /// A snapshot history's [`TAIL`]: the touched keys' rows holding or
    /// ending at the run's version `day` or after it, and the [`SUMMARY`].
    pub fn snapshot_tail(&self, target: &str, day: &Value, columns: &[String], fp: &str) -> Sql {
        let (vf, vt) = (quote_ident(&self.h.valid_from), quote_ident(&self.h.valid_to));
        let (head, tail) = with_summary(&format!("SELECT t.* FROM {}", self.touched_from(target)), columns, fp, self.materialized);
        let mut sql = Sql::new();
        sql.push(&head).push(&format!("t.{vt} IS NULL OR t.{vt} >= "));
        sql.typed_param(day.clone(), "TIMESTAMP");
        sql.push(&format!(" OR t.{vf} >= "));
        sql.typed_param(day.clone(), "TIMESTAMP");
        sql.push(&tail);
        sql
    }

    /// [`ALL`]: the touched keys' entries from where the run recomputes
    /// (the rows' starting versions in `win`, the log's hidden entries) and
    /// the batch's, each with its origin.
    pub fn all(&self, win: &str, log: &str) -> String {
        let batch = self.batch;
        let del = quote_ident(DELETED);
        format!(
            "SELECT {}, false AS {del}, 0 AS \"{ORIGIN}\" FROM {win} AS t \
             UNION ALL SELECT {}, l.{del}, 2 AS \"{ORIGIN}\" FROM {} \
             UNION ALL SELECT {}, b.{del}, 1 AS \"{ORIGIN}\" FROM {batch} AS b",
            self.list(Some("t")),
            self.list(Some("l")),
            self.window_from(log, "l", &self.spec.version),
            self.list(Some("b")),
        )
    }

    /// [`NEW`] from the resolved entries `resolved` (one per key and
    /// version): each entry with whether it starts a row, and a row's end.
    /// The first entry of a key here starts a row when it is an upsert:
    /// the entry before it, outside the window, is a tombstone, or none, or
    /// ends a row that the window's first row does not continue (the
    /// window starts at a row's start or after a tombstone).
    pub fn walk(&self, resolved: &str, version_type: &str) -> String {
        let (v, del) = (self.version(), quote_ident(DELETED));
        let w = format!("OVER (PARTITION BY {} ORDER BY {v})", self.key_list(None));
        let changed = if self.tracked.is_empty() {
            "false".to_owned()
        } else {
            self.tracked.iter().map(|c| format!("lag({0}) {w} IS DISTINCT FROM {0}", quote_ident(c))).collect::<Vec<_>>().join(" OR ")
        };
        let names = self.names_list();
        format!(
            "WITH f AS {m}(SELECT {names}, {del}, CASE WHEN {del} THEN false WHEN row_number() {w} = 1 THEN true WHEN lag({del}) {w} THEN true WHEN {changed} THEN true ELSE false END AS \"{START}\" FROM {resolved}), \
             g AS (SELECT {names}, {del}, \"{START}\", CASE WHEN \"{START}\" THEN lead({v}) {w} END AS \"{TO}\" FROM f WHERE {del} OR \"{START}\") \
             SELECT {names}, {del}, \"{START}\", \"{TO}\" FROM g \
             UNION ALL SELECT {names}, {del}, \"{START}\", CAST(NULL AS {version_type}) AS \"{TO}\" FROM f WHERE NOT {del} AND NOT \"{START}\"",
            m = self.materialized
        )
    }

    /// A snapshot history's [`KEYS`]: every key of the run's version `day`
    /// (the batch's, and those the table or its log hold at that version:
    /// the run replaces them), with a full snapshot (`absent`) also the keys
    /// whose row spans the day.
    pub fn snapshot_keys(&self, target: &str, log: &str, day: &Value, absent: bool) -> Sql {
        let batch = self.batch;
        let (vf, vt) = (quote_ident(&self.h.valid_from), quote_ident(&self.h.valid_to));
        let keys = self.key_list(None);
        let mut sql = Sql::new();
        sql.push(&format!("SELECT DISTINCT {keys} FROM (SELECT {keys} FROM {batch} UNION ALL SELECT {keys} FROM {target} WHERE {vf} = "));
        sql.typed_param(day.clone(), "TIMESTAMP");
        sql.push(&format!(" UNION ALL SELECT {keys} FROM {log} WHERE {vf} = "));
        sql.typed_param(day.clone(), "TIMESTAMP");
        if absent {
            sql.push(&format!(" UNION ALL SELECT {keys} FROM {target} WHERE {vf} < "));
            sql.typed_param(day.clone(), "TIMESTAMP");
            sql.push(&format!(" AND ({vt} IS NULL OR {vt} >= "));
            sql.typed_param(day.clone(), "TIMESTAMP");
            sql.push(")");
        }
        sql.push(") AS u");
        sql
    }

    /// A snapshot history's [`CUT`]: every touched key cut at the day.
    pub fn snapshot_cut(&self, rows: &str, day: &Value) -> Sql {
        let (vf, vt) = (quote_ident(&self.h.valid_from), quote_ident(&self.h.valid_to));
        let mut sql = Sql::new();
        sql.push(&format!("SELECT {}, c.\"{CUT_AT}\", CASE WHEN min(t.{vf}) < c.\"{CUT_AT}\" THEN min(t.{vf}) ELSE c.\"{CUT_AT}\" END AS \"{FROM}\" FROM (SELECT {}, ", self.key_list(Some("c")), self.key_list(Some("k"))));
        sql.typed_param(day.clone(), "TIMESTAMP");
        sql.push(&format!(
            " AS \"{CUT_AT}\" FROM {KEYS} AS k) AS c LEFT JOIN {rows} AS t ON {} AND (t.{vt} IS NULL OR t.{vt} >= c.\"{CUT_AT}\") GROUP BY {}, c.\"{CUT_AT}\"",
            keys_match("t", "c", &self.spec.key),
            self.key_list(Some("c"))
        ));
        sql
    }

    /// A tombstone of `alias`'s key at `at` (a parameter), as an entry:
    /// the key, the version, NULL elsewhere.
    fn tombstone(&self, sql: &mut Sql, alias: &str, at: &Value) {
        for (i, c) in self.types.iter().enumerate() {
            if i > 0 {
                sql.push(", ");
            }
            if self.spec.key.contains(&c.name) {
                sql.push(&q(alias, &c.name));
            } else if c.name == self.spec.version {
                sql.typed_param(at.clone(), "TIMESTAMP");
            } else {
                sql.push(&format!("CAST(NULL AS {})", c.ty));
            }
        }
        sql.push(&format!(", true AS {}, 3 AS \"{ORIGIN}\"", quote_ident(DELETED)));
    }

    /// A snapshot history's [`ALL`]: the touched keys' entries from where
    /// the run recomputes, but those of the run's version `day` (replaced),
    /// the batch's, and with a full snapshot (`absent`) tombstones: at the
    /// day for a touched key the batch lacks whose row spans the day, and
    /// at the next committed date `next` for a key of the batch that has no
    /// entry there (it was absent from that snapshot).
    pub fn snapshot_all(&self, target: &str, win: &str, log: &str, day: &Value, absent: bool, next: Option<&Value>) -> Sql {
        let batch = self.batch;
        let (vf, vt, del) = (quote_ident(&self.h.valid_from), quote_ident(&self.h.valid_to), quote_ident(DELETED));
        let mut sql = Sql::new();
        sql.push(&format!("SELECT {}, false AS {del}, 0 AS \"{ORIGIN}\" FROM {win} AS t WHERE t.{vf} <> ", self.list(Some("t"))));
        sql.typed_param(day.clone(), "TIMESTAMP");
        sql.push(&format!(" UNION ALL SELECT {}, l.{del}, 2 AS \"{ORIGIN}\" FROM {} AND l.{vf} <> ", self.list(Some("l")), self.window_from(log, "l", &self.h.valid_from)));
        sql.typed_param(day.clone(), "TIMESTAMP");
        sql.push(&format!(" UNION ALL SELECT {}, b.{del}, 1 AS \"{ORIGIN}\" FROM {batch} AS b", self.list(Some("b"))));
        if absent {
            sql.push(" UNION ALL SELECT ");
            self.tombstone(&mut sql, "c", day);
            sql.push(&format!(
                " FROM {CUT} AS c WHERE NOT EXISTS (SELECT 1 FROM {batch} AS b WHERE {}) AND EXISTS (SELECT 1 FROM {target} AS t WHERE {} AND t.{vf} < ",
                keys_match("b", "c", &self.spec.key),
                keys_match("t", "c", &self.spec.key)
            ));
            sql.typed_param(day.clone(), "TIMESTAMP");
            sql.push(&format!(" AND (t.{vt} IS NULL OR t.{vt} >= "));
            sql.typed_param(day.clone(), "TIMESTAMP");
            sql.push("))");
            if let Some(next) = next {
                sql.push(" UNION ALL SELECT ");
                self.tombstone(&mut sql, "k", next);
                sql.push(&format!(
                    " FROM (SELECT DISTINCT {} FROM {batch}) AS k WHERE NOT EXISTS (SELECT 1 FROM {target} AS t WHERE {} AND t.{vf} = ",
                    self.key_list(None),
                    keys_match("t", "k", &self.spec.key)
                ));
                sql.typed_param(next.clone(), "TIMESTAMP");
                sql.push(&format!(") AND NOT EXISTS (SELECT 1 FROM {log} AS l WHERE {} AND l.{vf} = ", keys_match("l", "k", &self.spec.key)));
                sql.typed_param(next.clone(), "TIMESTAMP");
                sql.push(")");
            }
        }
        sql
    }

    /// The checks of the touched keys' rows as written from where the run
    /// recomputes (`after`: a select of [`TAIL`] as the run leaves it),
    /// with the fingerprint select list `fp` over them (`fp_rows`,
    /// `fp_sum`) and over `tail` as the run read it (`tail_rows`,
    /// `tail_sum`): one query. Checked per key: half-open non-empty
    /// intervals, each starting at its version, no overlap (at most one
    /// open row, the last), a gap or a closed last row only where a
    /// tombstone ends it, no tombstone inside a row. Joins, not correlated
    /// subqueries: the log's tombstones are looked up by key. The older
    /// rows are as the run found them and end where they ended: the
    /// window's first entry is the row that started there (an upsert,
    /// which starts a row again) or, when the batch's oldest version starts
    /// the window, that version, whose row or tombstone ends the row before
    /// it as the table had it.
    pub fn well_formed(&self, after: &str, log: &str, tail: &str, fp: &str) -> String {
        let (vf, vt) = (quote_ident(&self.h.valid_from), quote_ident(&self.h.valid_to));
        let (v, del) = (self.version(), quote_ident(DELETED));
        let tombs = format!("(SELECT {}, {v} AS \"__fixpoint_tv\" FROM {log} WHERE {del})", self.key_list(None));
        format!(
            "WITH a AS {m}({after}), \
             h AS (SELECT t.{v} AS v, t.{vf} AS vf, t.{vt} AS vt, lead(t.{vf}) OVER (PARTITION BY {} ORDER BY t.{vf}) AS nf, \
             d.\"__fixpoint_tv\" IS NOT NULL AS te \
             FROM a AS t LEFT JOIN {tombs} AS d ON {} AND d.\"__fixpoint_tv\" = t.{vt}), \
             w AS (SELECT count(*) FILTER (WHERE vt IS NOT NULL AND vt <= vf) AS \"empty\", \
             count(*) FILTER (WHERE v IS DISTINCT FROM vf) AS \"moved\", \
             count(*) FILTER (WHERE nf IS NOT NULL AND (vt IS NULL OR vt > nf)) AS \"overlaps\", \
             count(*) FILTER (WHERE vt IS NOT NULL AND (nf IS NULL OR vt < nf) AND NOT te) AS \"unexplained_ends\", \
             (SELECT count(*) FROM a AS t JOIN {tombs} AS d ON {} AND d.\"__fixpoint_tv\" >= t.{vf} AND (t.{vt} IS NULL OR d.\"__fixpoint_tv\" < t.{vt})) AS \"tombstoned\" \
             FROM h) \
             SELECT w.*, fa.*, ft.* FROM w CROSS JOIN (SELECT {fp} FROM a AS t) AS fa \
             CROSS JOIN (SELECT x.\"{FP_ROWS}\" AS \"tail_rows\", x.\"{FP_SUM}\" AS \"tail_sum\" FROM (SELECT {fp} FROM {tail} AS t) AS x) AS ft",
            self.key_list(Some("t")),
            keys_match("d", "t", &self.spec.key),
            keys_match("d", "t", &self.spec.key),
            m = self.materialized,
        )
    }
}

/// `touched`'s rows (alias `t`) where a filter holds, with the target's
/// `columns`, and one summary row of all of them by the fingerprint's
/// select list `fp`: one read of the touched rows (a materialized CTE).
/// Returns the SQL before the filter and after it.
fn with_summary(touched: &str, columns: &[String], fp: &str, materialized: &str) -> (String, String) {
    let cols = columns.iter().map(|c| q("t", c)).collect::<Vec<_>>().join(", ");
    let nulls = columns.iter().map(|c| format!("NULL AS {}", quote_ident(c))).collect::<Vec<_>>().join(", ");
    (
        format!("WITH t AS {materialized}({touched}) SELECT {cols}, false AS \"{SUMMARY}\", NULL AS \"{SUMMARY_ROWS}\", NULL AS \"{SUMMARY_SUM}\" FROM t WHERE ("),
        format!(") UNION ALL SELECT {nulls}, true, s.\"{FP_ROWS}\", s.\"{FP_SUM}\" FROM (SELECT {fp} FROM t) AS s"),
    )
}
