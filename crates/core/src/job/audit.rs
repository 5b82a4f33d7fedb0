//! Audits as the job file declares them (their evaluation is
//! [`crate::run::audit`]).

use serde::{Deserialize, Serialize};

use crate::job::sql::check_predicate;
pub use crate::error::AuditResult;

/// How much an audit matters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum AuditSeverity {
    /// Blocks the publish.
    Error,
    /// Reported and recorded, not blocking.
    Warn,
}

/// What an audit checks.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum AuditKind {
    /// No NULL in these columns.
    NotNull {
        /// The columns.
        columns: Vec<String>,
    },
    /// No two rows share these columns.
    Unique {
        /// The columns (default: the merge key).
        columns: Vec<String>,
    },
    /// The column holds only these values (compared as text; NULL passes).
    AcceptedValues {
        /// The column.
        column: String,
        /// The values.
        values: Vec<String>,
    },
    /// The row count is within bounds.
    RowCount {
        /// At least.
        min: Option<u64>,
        /// At most.
        max: Option<u64>,
    },
    /// The row count changed by at most these percentages against the
    /// previously published rows (or, for a new day, the previous day's).
    RowCountChange {
        /// Largest allowed drop, in percent.
        max_drop_pct: Option<f64>,
        /// Largest allowed growth, in percent.
        max_growth_pct: Option<f64>,
    },
    /// A boolean SQL expression every row must satisfy.
    Expression {
        /// The expression.
        expression: String,
    },
    /// A query returning the offending rows (zero rows pass). It may use
    /// `:run_date`, and sees the target as this run has written it.
    Sql {
        /// The query.
        sql: String,
    },
}

/// One audit of a job.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Audit {
    /// Its name (default: the kind and its columns).
    pub name: String,
    /// What it checks.
    #[serde(flatten)]
    pub kind: AuditKind,
    /// Blocking or not.
    pub severity: AuditSeverity,
}

/// An `[[audit]]` table as written in the job file.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawAudit {
    name: Option<String>,
    kind: Option<String>,
    severity: Option<String>,
    columns: Option<Vec<String>>,
    column: Option<String>,
    values: Option<Vec<toml::Value>>,
    min: Option<i64>,
    max: Option<i64>,
    max_drop_pct: Option<f64>,
    max_growth_pct: Option<f64>,
    expression: Option<String>,
    sql: Option<String>,
}

impl RawAudit {
    /// Validates one audit; `merge_key` is the default of `unique`. Errors
    /// are (key, message).
    pub(crate) fn validate(self, index: usize, merge_key: Option<&[String]>) -> std::result::Result<Audit, (String, String)> {
        let at = |k: &str| format!("audit[{index}].{k}");
        let kind_name = self.kind.clone().ok_or_else(|| {
            (at("kind"), "missing: expected one of not_null, unique, accepted_values, row_count, row_count_change, expression, sql".into())
        })?;
        let need_columns = |c: Option<Vec<String>>| match c {
            Some(c) if !c.is_empty() => Ok(c),
            _ => Err((at("columns"), "missing: name the columns, e.g. columns = [\"order_id\"]".to_owned())),
        };
        let kind = match kind_name.as_str() {
            "not_null" => AuditKind::NotNull { columns: need_columns(self.columns)? },
            "unique" => AuditKind::Unique {
                columns: match (self.columns, merge_key) {
                    (Some(c), _) if !c.is_empty() => c,
                    (_, Some(k)) => k.to_vec(),
                    _ => return Err((at("columns"), "missing: name the columns (only a merge job defaults to its key)".into())),
                },
            },
            "accepted_values" => AuditKind::AcceptedValues {
                column: self.column.ok_or_else(|| (at("column"), "missing: the column to check".to_owned()))?,
                values: match self.values {
                    Some(v) if !v.is_empty() => v
                        .into_iter()
                        .map(|v| match v {
                            toml::Value::String(s) => s,
                            other => other.to_string(),
                        })
                        .collect(),
                    _ => return Err((at("values"), "missing: the accepted values, e.g. values = [\"EUR\", \"USD\"]".into())),
                },
            },
            "row_count" => {
                let bound = |v: Option<i64>, k: &str| match v {
                    Some(n) if n < 0 => Err((at(k), format!("{n}: expected a count ≥ 0"))),
                    other => Ok(other.map(|n| n as u64)),
                };
                let (min, max) = (bound(self.min, "min")?, bound(self.max, "max")?);
                if min.is_none() && max.is_none() {
                    return Err((at("min"), "row_count needs min, max or both".into()));
                }
                AuditKind::RowCount { min, max }
            }
            "row_count_change" => {
                if self.max_drop_pct.is_none() && self.max_growth_pct.is_none() {
                    return Err((at("max_drop_pct"), "row_count_change needs max_drop_pct, max_growth_pct or both".into()));
                }
                for (k, v) in [("max_drop_pct", self.max_drop_pct), ("max_growth_pct", self.max_growth_pct)] {
                    if v.is_some_and(|v| !(v >= 0.0)) {
                        return Err((at(k), format!("{}: expected a percentage ≥ 0", v.unwrap_or_default())));
                    }
                }
                AuditKind::RowCountChange { max_drop_pct: self.max_drop_pct, max_growth_pct: self.max_growth_pct }
            }
            "expression" => {
                let expression = self.expression.ok_or_else(|| (at("expression"), "missing: a boolean SQL expression".to_owned()))?;
                check_predicate("expression", &expression).map_err(|e| (at("expression"), e.to_string()))?;
                AuditKind::Expression { expression }
            }
            "sql" => {
                let sql = self.sql.ok_or_else(|| (at("sql"), "missing: a query returning the offending rows".to_owned()))?;
                crate::job::sql::SourceTemplate::parse("audit sql", &sql).map_err(|e| (at("sql"), e.to_string()))?;
                AuditKind::Sql { sql }
            }
            other => {
                return Err((
                    at("kind"),
                    format!("{other:?}: expected one of not_null, unique, accepted_values, row_count, row_count_change, expression, sql"),
                ))
            }
        };
        let severity = match self.severity.as_deref() {
            None | Some("error") => AuditSeverity::Error,
            Some("warn") => AuditSeverity::Warn,
            Some(other) => return Err((at("severity"), format!("{other:?}: expected \"error\" or \"warn\""))),
        };
        let name = self.name.unwrap_or_else(|| match &kind {
            AuditKind::NotNull { columns } | AuditKind::Unique { columns } => format!("{kind_name}({})", columns.join(", ")),
            AuditKind::AcceptedValues { column, .. } => format!("{kind_name}({column})"),
            _ => kind_name.clone(),
        });
        Ok(Audit { name, kind, severity })
    }
}
