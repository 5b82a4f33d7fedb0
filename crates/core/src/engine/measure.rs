//! Fingerprints computed by an engine: the row hash of each method and the
//! sum over a scope's rows.

use chrono::NaiveDate;

use crate::engine::{Column, Engine, Row};
use crate::error::{Error, Result};
use crate::fingerprint::{Fingerprint, Method, PORTABLE_KIND};
use crate::job::ident::{quote_ident, TableName};
use crate::job::sql::{RunParams, Sql, SourceTemplate, Value};

/// The fingerprint kind of `method` on `engine`.
pub fn fingerprint_kind(engine: &mut dyn Engine, method: Method) -> Result<String> {
    Ok(match method {
        Method::Native => format!("native-v{}/{}", engine.dialect().native_hash_version(), engine.version()?),
        Method::Portable => PORTABLE_KIND.to_owned(),
    })
}

/// An expression hashing one row of `alias` over `columns` to a 64-bit
/// value, with the fingerprint kind and the column signature.
pub fn row_hash(engine: &mut dyn Engine, method: Method, alias: &str, columns: &[Column]) -> Result<(String, String, Vec<String>)> {
    let kind = fingerprint_kind(engine, method)?;
    let (hash, signature) = match method {
        Method::Native => {
            let hash = engine.dialect().native_row_hash(alias, columns).ok_or_else(|| Error::Unsupported {
                engine: engine.name(),
                capability: "a native row hash (use --portable)".into(),
            })?;
            (hash, columns.iter().map(|c| format!("{} {}", c.name, c.ty)).collect())
        }
        Method::Portable => {
            let mut parts = Vec::new();
            let mut signature = Vec::new();
            for c in columns {
                let (text, class) = engine.dialect().portable_value(&format!("{alias}.{}", quote_ident(&c.name)), c);
                parts.push(portable_field(&text, class));
                signature.push(format!("{} {class}", c.name));
            }
            let hash = match engine.dialect().portable_row_hash_direct(alias, columns) {
                Some(direct) if !columns.is_empty() => direct,
                _ => {
                    let row = if parts.is_empty() { "''".to_owned() } else { parts.join(" || '|' || ") };
                    engine.dialect().portable_row_hash(&row)
                }
            };
            (hash, signature)
        }
    };
    Ok((hash, kind, signature))
}

/// One value's canonical text as a field of the portable encoding: fields
/// are joined with `|`; NULL is `\N`; in text, `\` and `|` are escaped with
/// a backslash (no other class's canonical text holds either), so no two
/// rows encode alike and NULL differs from '' and from the text `\N`.
pub fn portable_field(text: &str, class: &str) -> String {
    if class == "text" || class == "other" {
        format!("coalesce(replace(replace({text}, '\\', '\\\\'), '|', '\\|'), '\\N')")
    } else {
        format!("coalesce({text}, '\\N')")
    }
}

/// The column a fingerprint's select list names its row count.
pub const FP_ROWS: &str = "fp_rows";
/// The column a fingerprint's select list names its sum of row hashes.
pub const FP_SUM: &str = "fp_sum";

/// A fingerprint's select list over the rows of an alias, and what it
/// takes to read the fingerprint back from the query's row.
#[derive(Debug, Clone)]
pub struct FingerprintSelect {
    /// `count(*) AS "fp_rows", sum(<row hash>) AS "fp_sum"`.
    pub select: String,
    /// The fingerprint's kind.
    pub kind: String,
    /// The fingerprinted columns with their types.
    pub signature: Vec<String>,
}

impl FingerprintSelect {
    /// The fingerprint in `row` (which holds the select list's columns).
    pub fn read(&self, row: &Row<'_>, engine: &dyn Engine) -> Result<Fingerprint> {
        Ok(self.of(row.count(FP_ROWS)?, engine.dialect().read_sum(row.value(FP_SUM)?)?))
    }

    /// The fingerprint of `rows` rows whose hashes sum to `sum`.
    pub fn of(&self, rows: u64, sum: i128) -> Fingerprint {
        Fingerprint::from_sum(&self.kind, &self.signature, rows, sum)
    }
}

/// The select list of a fingerprint over rows of `alias`, with its kind
/// and signature.
pub fn fingerprint_select(engine: &mut dyn Engine, method: Method, alias: &str, columns: &[Column]) -> Result<FingerprintSelect> {
    let (hash, kind, signature) = row_hash(engine, method, alias, columns)?;
    let sum = if columns.is_empty() { "0".to_owned() } else { format!("sum({hash})") };
    let select = format!("count(*) AS {}, {sum} AS {}", quote_ident(FP_ROWS), quote_ident(FP_SUM));
    Ok(FingerprintSelect { select, kind, signature })
}

/// Rows to fingerprint or scan: a table or the job's source query.
pub enum Scope<'a> {
    /// A table, optionally filtered.
    Table {
        /// The table.
        table: &'a TableName,
        /// Only rows where this holds.
        filter: Option<Filter<'a>>,
    },
    /// The job's source query for one run.
    Source {
        /// The query.
        template: &'a SourceTemplate,
        /// The run's parameter values.
        params: &'a RunParams,
    },
}

/// A row filter.
pub enum Filter<'a> {
    /// `column = <date>`, with the date bound as a parameter.
    DateEquals(&'a str, NaiveDate),
    /// A user's condition, already checked by [`crate::job::sql::check_predicate`].
    Predicate(&'a str),
}

impl Scope<'_> {
    /// Appends `<from> AS alias [WHERE …]` to `sql`, binding parameters in order.
    pub fn write_from(&self, sql: &mut Sql, alias: &str) {
        match self {
            Scope::Table { table, filter } => {
                sql.push(&table.quoted()).push(" AS ").push(alias);
                match filter {
                    None => {}
                    Some(Filter::DateEquals(col, d)) => {
                        sql.push(" WHERE ").push(alias).push(".").ident(col).push(" = ");
                        sql.typed_param(Value::Date(*d), "DATE");
                    }
                    Some(Filter::Predicate(p)) => {
                        sql.push(" WHERE (").push(p).push(")");
                    }
                }
            }
            Scope::Source { template, params } => {
                sql.push("(");
                template.render_into(sql, params);
                sql.push("\n) AS ").push(alias);
            }
        }
    }
}

/// Fingerprints the rows of `scope` over `columns`.
pub fn fingerprint(engine: &mut dyn Engine, method: Method, scope: &Scope<'_>, columns: &[Column]) -> Result<Fingerprint> {
    let alias = "fp";
    let fp = fingerprint_select(engine, method, alias, columns)?;
    let mut sql = Sql::new();
    sql.push("SELECT ").push(&fp.select).push(" FROM ");
    scope.write_from(&mut sql, alias);
    let rows = engine.query(&sql)?;
    fp.read(&rows.single("a fingerprint query")?, engine)
}
