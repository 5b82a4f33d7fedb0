//! The tables a source query reads, found with `sqlparser`: every relation
//! named in it (joins, subqueries, set operations, CTE bodies), less the
//! references to the query's own CTEs (scoped as the engines scope them:
//! a CTE is visible to the CTEs after it and to the query's body, and to
//! itself only under `WITH RECURSIVE`), less table functions
//! (`read_parquet('…')`).

use std::ops::ControlFlow;

use sqlparser::ast::{ObjectName, Query, TableFactor, Visit, Visitor};
use sqlparser::dialect::{Dialect, DuckDbDialect, GenericDialect, PostgreSqlDialect};
use sqlparser::parser::Parser;

use crate::job::ident::TableName;

/// The schemas an unqualified table name resolves to by default: DuckDB's
/// `main`, PostgreSQL's `public`, Spark's `default`.
pub const DEFAULT_SCHEMAS: [&str; 3] = ["main", "public", "default"];

/// One frame of CTE scope: the CTEs of one query.
struct Frame {
    /// The CTEs' names, lower case, in order.
    names: Vec<String>,
    /// Their bodies, to know when the visit enters one.
    bodies: Vec<*const Query>,
    /// `WITH RECURSIVE`: every CTE is visible in every body.
    recursive: bool,
    /// How many of `names` are visible now (all but while inside a body).
    visible: usize,
}

struct Refs {
    frames: Vec<Frame>,
    /// Table-function names, which are not relations read.
    functions: Vec<*const ObjectName>,
    /// Every relation read, its parts lower case.
    found: Vec<Vec<String>>,
}

impl Visitor for Refs {
    type Break = ();

    fn pre_visit_query(&mut self, q: &Query) -> ControlFlow<()> {
        let ptr = q as *const Query;
        if let Some(frame) = self.frames.last_mut() {
            if let Some(i) = frame.bodies.iter().position(|b| *b == ptr) {
                frame.visible = if frame.recursive { frame.names.len() } else { i };
            }
        }
        let (names, bodies, recursive) = match &q.with {
            Some(with) => (
                with.cte_tables.iter().map(|c| c.alias.name.value.to_ascii_lowercase()).collect::<Vec<_>>(),
                with.cte_tables.iter().map(|c| &*c.query as *const Query).collect::<Vec<_>>(),
                with.recursive,
            ),
            None => (Vec::new(), Vec::new(), false),
        };
        let visible = names.len();
        self.frames.push(Frame { names, bodies, recursive, visible });
        ControlFlow::Continue(())
    }

    fn post_visit_query(&mut self, q: &Query) -> ControlFlow<()> {
        self.frames.pop();
        let ptr = q as *const Query;
        if let Some(frame) = self.frames.last_mut() {
            if frame.bodies.contains(&ptr) {
                frame.visible = frame.names.len();
            }
        }
        ControlFlow::Continue(())
    }

    fn pre_visit_table_factor(&mut self, t: &TableFactor) -> ControlFlow<()> {
        if let TableFactor::Table { name, args: Some(_), .. } = t {
            self.functions.push(name as *const ObjectName);
        }
        ControlFlow::Continue(())
    }

    fn pre_visit_relation(&mut self, r: &ObjectName) -> ControlFlow<()> {
        if self.functions.contains(&(r as *const ObjectName)) {
            return ControlFlow::Continue(());
        }
        let mut parts = Vec::with_capacity(r.0.len());
        for p in &r.0 {
            match p.as_ident() {
                Some(ident) => parts.push(ident.value.to_ascii_lowercase()),
                // A name computed by a function: not a table we can name.
                None => return ControlFlow::Continue(()),
            }
        }
        if let [only] = parts.as_slice() {
            let is_cte = self.frames.iter().any(|f| f.names[..f.visible].contains(only));
            if is_cte {
                return ControlFlow::Continue(());
            }
        }
        if !parts.is_empty() {
            self.found.push(parts);
        }
        ControlFlow::Continue(())
    }
}

/// The relations a query reads (each name's parts, lower case, as written:
/// `orders`, `silver.orders`, `db.silver.orders`), or `None` when no
/// dialect fixpoint knows (DuckDB, PostgreSQL, Spark, generic SQL) can parse it.
/// `text` is the query with its run parameters made placeholders
/// ([`crate::job::sql::SourceTemplate::text_for_parsing`]).
pub fn relations(text: &str) -> Option<Vec<Vec<String>>> {
    let dialects: [&dyn Dialect; 4] = [&DuckDbDialect {}, &PostgreSqlDialect {}, &crate::job::dialect::SparkSql, &GenericDialect {}];
    let statements = dialects.iter().find_map(|d| Parser::parse_sql(*d, text).ok())?;
    let mut refs = Refs { frames: Vec::new(), functions: Vec::new(), found: Vec::new() };
    let _ = statements.visit(&mut refs);
    Some(refs.found)
}

/// Whether a relation named `parts` (lower case) is `target`, the way the
/// engines resolve names: compared without regard to case; an unqualified
/// name is the target when the target is in a default schema
/// ([`DEFAULT_SCHEMAS`]); a name with a catalog is compared on its schema
/// and table. `input` (a file source's rows), unqualified, is never a table.
pub fn names_table(parts: &[String], target: &TableName, file_source: bool) -> bool {
    let schema = target.schema.to_ascii_lowercase();
    let table = target.table.to_ascii_lowercase();
    match parts {
        [only] if file_source && only == "input" => false,
        [only] => *only == table && DEFAULT_SCHEMAS.contains(&schema.as_str()),
        [.., s, t] => *s == schema && *t == table,
        [] => false,
    }
}

/// Whether the query `text` reads `target`: `None` when it cannot be
/// parsed (the lint gate answers for that).
pub fn reads_table(text: &str, target: &TableName, file_source: bool) -> Option<bool> {
    Some(relations(text)?.iter().any(|parts| names_table(parts, target, file_source)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: &str) -> TableName {
        TableName::parse(s).unwrap()
    }

    fn reads(sql: &str, target: &str) -> Option<bool> {
        reads_table(sql, &t(target), false)
    }

    #[test]
    fn finds_the_target_wherever_it_is_read() {
        for sql in [
            "SELECT * FROM silver.orders WHERE dt = $1",
            "SELECT * FROM SILVER.Orders",
            "SELECT * FROM \"silver\".\"orders\"",
            "SELECT * FROM mydb.silver.orders",
            "SELECT * FROM bronze.orders b JOIN silver.orders s ON s.order_id = b.order_id",
            "SELECT * FROM bronze.orders WHERE order_id IN (SELECT order_id FROM silver.orders)",
            "SELECT * FROM bronze.orders WHERE EXISTS (SELECT 1 FROM silver.orders s WHERE s.order_id = 1)",
            "SELECT * FROM bronze.orders UNION ALL SELECT * FROM silver.orders",
            "SELECT * FROM (SELECT * FROM (SELECT * FROM silver.orders) AS a) AS b",
            "WITH x AS (SELECT * FROM silver.orders) SELECT * FROM x",
            "SELECT (SELECT max(dt) FROM silver.orders) AS m FROM bronze.orders",
        ] {
            assert_eq!(reads(sql, "silver.orders"), Some(true), "{sql}");
        }
    }

    #[test]
    fn unqualified_names_resolve_to_the_default_schema() {
        assert_eq!(reads("SELECT * FROM orders", "main.orders"), Some(true));
        assert_eq!(reads("SELECT * FROM orders", "public.orders"), Some(true));
        assert_eq!(reads("SELECT * FROM ORDERS", "Main.Orders"), Some(true));
        assert_eq!(reads("SELECT * FROM orders", "silver.orders"), Some(false));
        assert_eq!(reads("SELECT * FROM main.orders", "public.orders"), Some(false));
    }

    #[test]
    fn ctes_shadow_tables_in_their_scope_only() {
        // The CTE named like the target, read unqualified: not the target.
        assert_eq!(reads("WITH orders AS (SELECT * FROM bronze.orders) SELECT * FROM orders", "main.orders"), Some(false));
        // A non-recursive CTE's body reads the table of its own name.
        assert_eq!(reads("WITH orders AS (SELECT * FROM orders) SELECT * FROM orders", "main.orders"), Some(true));
        // A later CTE sees an earlier one.
        assert_eq!(reads("WITH orders AS (SELECT * FROM bronze.orders), b AS (SELECT * FROM orders) SELECT * FROM b", "main.orders"), Some(false));
        // An earlier CTE does not see a later one.
        assert_eq!(reads("WITH a AS (SELECT * FROM orders), orders AS (SELECT 1 AS x) SELECT * FROM a, orders", "main.orders"), Some(true));
        // A CTE of a subquery does not shadow outside it.
        assert_eq!(reads("SELECT * FROM orders, (WITH orders AS (SELECT 1 AS x) SELECT * FROM orders) AS s", "main.orders"), Some(true));
        // A qualified name is never a CTE.
        assert_eq!(reads("WITH orders AS (SELECT 1 AS x) SELECT * FROM main.orders", "main.orders"), Some(true));
    }

    #[test]
    fn other_tables_functions_and_unreadable_sql() {
        assert_eq!(reads("SELECT * FROM bronze.orders WHERE dt = $1", "silver.orders"), Some(false));
        assert_eq!(reads("SELECT * FROM silver.orders_archive", "silver.orders"), Some(false));
        assert_eq!(reads("SELECT * FROM read_parquet('orders.parquet')", "main.read_parquet"), Some(false));
        assert_eq!(reads("SELEC * FROM silver.orders", "silver.orders"), None);
        assert_eq!(reads_table("SELECT * FROM input", &t("main.input"), true), Some(false));
        assert_eq!(reads_table("SELECT * FROM input", &t("main.input"), false), Some(true));
    }
}
