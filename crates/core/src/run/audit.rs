//! Audits before publish (write-audit-publish): checks of the result as it
//! will be published, run inside the run's transaction after the target was
//! written and before the commit. A failing blocking audit rolls the run
//! back: readers never see the bad day, the ledger records nothing.


use crate::error::AuditResult;
use crate::job::audit::{Audit, AuditKind, AuditSeverity};
use crate::engine::Engine;
use crate::error::{Error, Result};
use crate::job::ident::quote_ident;
use crate::job::sql::{Sql, Value};

/// The rows an audit looks at, and what it compares row counts with.
pub(crate) struct AuditScope<'a> {
    /// Appends `<rows> AS a` to a statement, binding its parameters.
    pub(crate) from: &'a dyn Fn(&mut Sql),
    /// The rows published before this run (the day's old partition, or the
    /// target before the merge); `None` when unknown.
    pub(crate) previous_rows: Option<u64>,
    /// The run date (for `:run_date` in `sql` audits).
    pub(crate) run_date: chrono::NaiveDate,
}

/// The count of `SELECT count(*) AS "n" FROM …`.
fn count(engine: &mut dyn Engine, sql: &Sql) -> Result<u64> {
    crate::engine::query_count(engine, sql, "n", "an audit's count")
}

fn sample(engine: &mut dyn Engine, sql: &Sql) -> Result<Vec<String>> {
    let rows = engine.query(sql)?;
    Ok(rows
        .rows
        .iter()
        .map(|r| format!("{{{}}}", rows.columns.iter().zip(r).map(|(c, v)| format!("{c}: {}", v.display())).collect::<Vec<_>>().join(", ")))
        .collect())
}

/// Runs every audit of `job` over `scope`; a failing blocking audit is an
/// error (the caller's transaction then rolls back), the rest are the
/// results. An audit the database cannot run (a column or table it names
/// does not exist, a syntax error) is the job file's error, naming the
/// audit's key.
pub(crate) fn audit(job: &crate::job::spec::Job, engine: &mut dyn Engine, scope: &AuditScope<'_>) -> Result<Vec<AuditResult>> {
    let results = run_audits(job, engine, scope)?;
    match blocking_failure(&results) {
        Some(e) => Err(e),
        None => Ok(results),
    }
}

fn run_audits(job: &crate::job::spec::Job, engine: &mut dyn Engine, scope: &AuditScope<'_>) -> Result<Vec<AuditResult>> {
    let mut out = Vec::new();
    for (i, audit) in job.audits.iter().enumerate() {
        let (passed, offending, detail, sample) = evaluate(audit, engine, scope).map_err(|e| unrunnable(job, i, audit, e))?;
        out.push(AuditResult {
            name: audit.name.clone(),
            severity: match audit.severity {
                AuditSeverity::Error => "error".into(),
                AuditSeverity::Warn => "warn".into(),
            },
            passed,
            offending,
            detail,
            sample,
        });
    }
    Ok(out)
}

/// An audit's statement failed: when the database could not bind what
/// the job file wrote (a column, a table, a function, the syntax), the
/// job file's error on the audit's key (`audit[i].sql`, `.expression`,
/// `.columns`, `.column`); any other error as it was.
fn unrunnable(job: &crate::job::spec::Job, index: usize, audit: &Audit, e: Error) -> Error {
    let (field, hint) = match &audit.kind {
        AuditKind::Sql { .. } => (
            "sql",
            format!(
                "the query reads tables by their names ({} as this run wrote it) and may use :run_date: run it by hand and fix the table or column it names",
                job.target
            ),
        ),
        AuditKind::Expression { .. } => ("expression", format!("name columns of the target {} in the expression", job.target)),
        AuditKind::NotNull { .. } | AuditKind::Unique { .. } => ("columns", format!("list columns of the target {}", job.target)),
        AuditKind::AcceptedValues { .. } => ("column", format!("name a column of the target {}", job.target)),
        AuditKind::RowCount { .. } | AuditKind::RowCountChange { .. } => return e,
    };
    crate::run::sqlerror::fragment_error(job, &format!("audit[{index}].{field}"), &format!("audit {:?}", audit.name), hint, e)
}

/// One audit over `scope`: whether it passed, the offending rows (or the
/// rows counted), what it found, and up to 5 offending rows when it failed.
fn evaluate(audit: &Audit, engine: &mut dyn Engine, scope: &AuditScope<'_>) -> Result<(bool, u64, String, Vec<String>)> {
    // `where_bad` selects the offending rows of the scope.
    let offending_rows = |where_bad: &str| {
        let mut sql = Sql::new();
        sql.push("SELECT a.* FROM ");
        (scope.from)(&mut sql);
        sql.push(" WHERE ").push(where_bad);
        sql
    };
    let wrap = |inner: &Sql, head: &str, tail: &str| {
        let mut sql = Sql::new();
        sql.push(head);
        sql.text.push_str(&inner.text);
        sql.params.extend(inner.params.iter().cloned());
        sql.push(tail);
        sql
    };
    let scope_count = |engine: &mut dyn Engine| -> Result<u64> {
        let mut sql = Sql::new();
        sql.push("SELECT count(*) AS \"n\" FROM ");
        (scope.from)(&mut sql);
        count(engine, &sql)
    };
    let (passed, offending, detail, rows_sql): (bool, u64, String, Option<Sql>) = match &audit.kind {
        AuditKind::NotNull { columns } => {
            let cond = columns.iter().map(|c| format!("a.{} IS NULL", quote_ident(c))).collect::<Vec<_>>().join(" OR ");
            let q = offending_rows(&cond);
            let n = count(engine, &wrap(&q, "SELECT count(*) AS \"n\" FROM (", ") AS o"))?;
            (n == 0, n, format!("{n} row(s) with NULL in {}", columns.join(", ")), Some(q))
        }
        AuditKind::Unique { columns } => {
            let list = columns.iter().map(|c| format!("a.{}", quote_ident(c))).collect::<Vec<_>>().join(", ");
            let mut q = Sql::new();
            q.push(&format!("SELECT {list}, count(*) AS copies FROM "));
            (scope.from)(&mut q);
            q.push(&format!(" GROUP BY {list} HAVING count(*) > 1"));
            let n = count(engine, &wrap(&q, "SELECT count(*) AS \"n\" FROM (", ") AS o"))?;
            (n == 0, n, format!("{n} value(s) of ({}) on more than one row", columns.join(", ")), Some(q))
        }
        AuditKind::AcceptedValues { column, values } => {
            let mut cond = Sql::new();
            cond.push(&format!("a.{col} IS NOT NULL AND CAST(a.{col} AS VARCHAR) NOT IN (", col = quote_ident(column)));
            let mut q = Sql::new();
            q.push("SELECT a.* FROM ");
            (scope.from)(&mut q);
            q.push(" WHERE ").push(&cond.text);
            for (i, v) in values.iter().enumerate() {
                if i > 0 {
                    q.push(", ");
                }
                q.typed_param(Value::Text(v.clone()), "VARCHAR");
            }
            q.push(")");
            let n = count(engine, &wrap(&q, "SELECT count(*) AS \"n\" FROM (", ") AS o"))?;
            (n == 0, n, format!("{n} row(s) with {column} outside [{}]", values.join(", ")), Some(q))
        }
        AuditKind::RowCount { min, max } => {
            let n = scope_count(engine)?;
            let low = min.is_some_and(|m| n < m);
            let high = max.is_some_and(|m| n > m);
            let bounds = match (min, max) {
                (Some(a), Some(b)) => format!("between {a} and {b}"),
                (Some(a), None) => format!("at least {a}"),
                (None, Some(b)) => format!("at most {b}"),
                (None, None) => "any".into(),
            };
            (!(low || high), n, format!("{n} row(s); expected {bounds}"), None)
        }
        AuditKind::RowCountChange { max_drop_pct, max_growth_pct } => {
            let n = scope_count(engine)?;
            match scope.previous_rows.filter(|p| *p > 0) {
                None => (true, n, format!("{n} row(s); nothing published before to compare with"), None),
                Some(prev) => {
                    let change = (n as f64 - prev as f64) / prev as f64 * 100.0;
                    let bad = max_drop_pct.is_some_and(|m| -change > m) || max_growth_pct.is_some_and(|m| change > m);
                    (!bad, n, format!("{n} row(s) against {prev} before: {change:+.1}%"), None)
                }
            }
        }
        AuditKind::Expression { expression } => {
            let q = offending_rows(&format!("NOT coalesce(({expression}), false)"));
            let n = count(engine, &wrap(&q, "SELECT count(*) AS \"n\" FROM (", ") AS o"))?;
            (n == 0, n, format!("{n} row(s) where ({expression}) does not hold"), Some(q))
        }
        AuditKind::Sql { sql } => {
            let template = crate::job::sql::SourceTemplate::parse("audit sql", sql)?;
            let q = template.render(&crate::job::sql::RunParams::new(scope.run_date));
            let n = count(engine, &wrap(&q, "SELECT count(*) AS \"n\" FROM (", "\n) AS o"))?;
            (n == 0, n, format!("the query returned {n} offending row(s)"), Some(q))
        }
    };
    let sample = match &rows_sql {
        Some(q) if !passed => sample(engine, &wrap(q, "SELECT * FROM (", "\n) AS o LIMIT 5"))?,
        _ => Vec::new(),
    };
    Ok((passed, offending, detail, sample))
}

/// The first blocking failure as an error (the run then rolls back).
fn blocking_failure(results: &[AuditResult]) -> Option<Error> {
    let failed: Vec<&AuditResult> = results.iter().filter(|r| !r.passed && r.severity == "error").collect();
    let first = failed.first()?;
    Some(Error::AuditFailed {
        audit: first.name.clone(),
        detail: first.detail.clone(),
        sample: first.sample.first().cloned().unwrap_or_default(),
        failed: failed.len(),
        results: results.to_vec(),
    })
}
