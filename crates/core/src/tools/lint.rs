//! `fixpoint lint`: what makes a job non-idempotent, found statically in its
//! SQL with `sqlparser` (the engine's dialect), before it runs.

use std::collections::HashSet;
use std::ops::ControlFlow;

use serde::Serialize;
use sqlparser::ast::{
    Distinct, Expr, Function, FunctionArgumentClause, FunctionArguments, Query, SelectItem, SetExpr, Spanned, Statement,
    TableFactor, TableSampleKind, Visit, Visitor, WindowType,
};
use sqlparser::dialect::{Dialect, DuckDbDialect, PostgreSqlDialect};
use sqlparser::parser::Parser;
use sqlparser::tokenizer::Span;

use crate::job::dialect::SparkSql;
pub use crate::job::dialect::SqlDialect;
use crate::error::{Error, Result};
use crate::job::spec::{Job, Strategy};
use crate::job::sql::RunParam;

/// How bad a finding is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Severity {
    /// Makes reruns differ: `run` refuses the job.
    Error,
    /// A risk worth a look.
    Warning,
}

/// One finding.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Finding {
    /// The rule: `clock`, `random`, `order`, `scope`, `keys`.
    pub rule: &'static str,
    /// Error or warning.
    pub severity: Severity,
    /// Line in the job file.
    pub line: usize,
    /// Column in the job file.
    pub column: usize,
    /// Line within the SQL text.
    pub sql_line: usize,
    /// Column within the SQL text.
    pub sql_column: usize,
    /// What is wrong, in one line.
    pub message: String,
    /// How to fix it.
    pub hint: String,
}

const CLOCK: &[&str] = &[
    "now", "current_date", "current_timestamp", "current_time", "localtime", "localtimestamp", "transaction_timestamp",
    "statement_timestamp", "clock_timestamp", "getdate", "sysdate", "today", "get_current_timestamp", "get_current_time",
    "current_localtimestamp", "unix_timestamp", "timeofday", "utc_timestamp", "sysdatetime",
];
const RANDOM: &[&str] = &[
    "random", "rand", "uuid", "gen_random_uuid", "uuid_generate_v1", "uuid_generate_v4", "uuidv4", "uuidv7", "newid",
    "setseed", "random_uuid", "gen_random_bytes",
];
const ORDERED_WINDOW: &[&str] =
    &["row_number", "rank", "dense_rank", "first_value", "last_value", "nth_value", "lag", "lead", "ntile", "percent_rank", "cume_dist"];
const ORDERED_AGG: &[&str] =
    &["string_agg", "array_agg", "list", "group_concat", "listagg", "json_group_array", "json_agg", "jsonb_agg", "first", "last", "any_value", "arbitrary"];

fn lower_name(f: &Function) -> String {
    f.name.0.last().map(|p| p.to_string().trim_matches('"').to_ascii_lowercase()).unwrap_or_default()
}

fn within(inner: Span, outer: Span) -> bool {
    (inner.start.line, inner.start.column) >= (outer.start.line, outer.start.column)
        && (inner.end.line, inner.end.column) <= (outer.end.line, outer.end.column)
}

struct Linter<'a> {
    job: &'a Job,
    exempt: Vec<Span>,
    filters: Vec<Span>,
    found: Vec<(Span, &'static str, Severity, String, String)>,
}

impl Linter<'_> {
    fn add(&mut self, span: Span, rule: &'static str, severity: Severity, message: String, hint: &str) {
        self.found.push((span, rule, severity, message, hint.to_owned()));
    }

    fn function(&mut self, expr: &Expr, f: &Function) {
        let name = lower_name(f);
        let span = expr.span();
        if CLOCK.contains(&name.as_str()) {
            if self.exempt.iter().any(|e| within(span, *e)) {
                return;
            }
            let in_filter = self.filters.iter().any(|e| within(span, *e));
            let (message, hint) = if in_filter {
                (format!("{name}() in a filter: the rows a run reads depend on when it runs, so a retry tomorrow reads another day"), "filter on :run_date, :run_start or :run_end instead")
            } else {
                (format!("{name}() derives a value from the wall clock: every rerun writes a different value"), "use :run_date / :run_start, or list the column under `metadata` if it only records when a row was loaded")
            };
            self.add(span, "clock", Severity::Error, message, hint);
        } else if RANDOM.contains(&name.as_str()) {
            self.add(span, "random", Severity::Error, format!("{name}() is random: every rerun writes different values"), "derive ids and choices from the input (a hash of the natural key, the run date), never from a random source");
        } else if let Some(WindowType::WindowSpec(w)) = &f.over {
            if ORDERED_WINDOW.contains(&name.as_str()) {
                if w.order_by.is_empty() {
                    self.add(span, "order", Severity::Error, format!("{name}() OVER (…) without ORDER BY: which row comes first is up to the engine"), "order the window by columns that identify each row");
                } else if name == "row_number" && w.order_by.len() == 1 {
                    let only = w.order_by[0].expr.to_string().to_ascii_lowercase();
                    let part: Vec<String> = w.partition_by.iter().map(|e| e.to_string().to_ascii_lowercase()).collect();
                    let key_dedup = self.job.merge.as_ref().is_some_and(|m| {
                        m.key.iter().all(|k| part.contains(&k.to_ascii_lowercase())) && only == m.version.to_ascii_lowercase()
                    });
                    let message = if key_dedup {
                        format!("row_number() orders the key's versions by {only} alone: two rows with one version tie, and the engine picks either")
                    } else {
                        format!("row_number() is ordered by {only} alone: rows that tie on it are numbered in any order")
                    };
                    self.add(span, "order", Severity::Warning, message, "add a tie-break after it, e.g. ORDER BY updated_at DESC, <the other columns>");
                }
            }
        } else if ORDERED_AGG.contains(&name.as_str()) {
            let ordered_args = match &f.args {
                FunctionArguments::List(l) => l.clauses.iter().any(|c| matches!(c, FunctionArgumentClause::OrderBy(o) if !o.is_empty())),
                _ => false,
            };
            if !ordered_args && f.within_group.is_empty() && f.over.is_none() {
                self.add(span, "order", Severity::Error, format!("{name}() without ORDER BY: the order of its result is up to the engine"), "add ORDER BY inside the call, e.g. string_agg(x, ',' ORDER BY x)");
            }
        }
    }
}

impl Visitor for Linter<'_> {
    type Break = ();

    fn pre_visit_query(&mut self, q: &Query) -> ControlFlow<()> {
        if q.limit_clause.is_some() && q.order_by.is_none() {
            self.add(q.span(), "order", Severity::Error, "LIMIT/OFFSET without ORDER BY: which rows are kept is up to the engine".into(), "add an ORDER BY that identifies each row");
        }
        if let SetExpr::Select(s) = q.body.as_ref() {
            if matches!(s.distinct, Some(Distinct::On(_))) && q.order_by.is_none() {
                self.add(s.span(), "order", Severity::Error, "DISTINCT ON without ORDER BY: which row of each group is kept is up to the engine".into(), "add ORDER BY the DISTINCT ON columns, then a tie-break");
            }
            for e in s.selection.iter().chain(s.having.iter()) {
                self.filters.push(e.span());
            }
        }
        ControlFlow::Continue(())
    }

    fn pre_visit_table_factor(&mut self, t: &TableFactor) -> ControlFlow<()> {
        if let TableFactor::Table { sample: Some(kind), .. } = t {
            let sample = match kind {
                TableSampleKind::BeforeTableAlias(s) | TableSampleKind::AfterTableAlias(s) => s,
            };
            if sample.seed.is_none() {
                self.add(t.span(), "random", Severity::Error, "TABLESAMPLE without a seed: every run reads other rows".into(), "add REPEATABLE (seed), or do not sample in a load job");
            }
        }
        ControlFlow::Continue(())
    }

    fn pre_visit_expr(&mut self, e: &Expr) -> ControlFlow<()> {
        if let Expr::Function(f) = e {
            self.function(e, f);
        }
        ControlFlow::Continue(())
    }
}

/// The top-level SELECTs (through set operations and parentheses).
fn top_selects(body: &SetExpr) -> Vec<&sqlparser::ast::Select> {
    match body {
        SetExpr::Select(s) => vec![s.as_ref()],
        SetExpr::SetOperation { left, right, .. } => {
            let mut v = top_selects(left);
            v.extend(top_selects(right));
            v
        }
        SetExpr::Query(q) => top_selects(&q.body),
        _ => Vec::new(),
    }
}

fn contains_any(expr: &Expr, names: &[&str]) -> bool {
    let mut hit = false;
    let _ = sqlparser::ast::visit_expressions(expr, |e| {
        if let Expr::Function(f) = e {
            if names.contains(&lower_name(f).as_str()) {
                hit = true;
            }
        }
        ControlFlow::<()>::Continue(())
    });
    hit
}

/// DuckDB's `USING SAMPLE …` clauses, which the parser does not read: each
/// is reported (position, whether it has a seed) and blanked out of the text
/// so the rest parses. Found with the tokenizer, never a regular expression.
fn using_samples(text: &str) -> (String, Vec<(Span, bool)>) {
    use sqlparser::tokenizer::{Token, Tokenizer};
    let dialect = DuckDbDialect {};
    let Ok(tokens) = Tokenizer::new(&dialect, text).tokenize_with_location() else { return (text.to_owned(), Vec::new()) };
    let sig: Vec<usize> = (0..tokens.len()).filter(|&i| !matches!(tokens[i].token, Token::Whitespace(_))).collect();
    let word = |i: usize, w: &str| matches!(&tokens[i].token, Token::Word(x) if x.quote_style.is_none() && x.value.eq_ignore_ascii_case(w));
    let index = crate::job::sql::LineIndex::new(text);
    let mut out = text.to_owned();
    let mut found = Vec::new();
    let mut n = 0;
    while n + 1 < sig.len() {
        if !(word(sig[n], "USING") && word(sig[n + 1], "SAMPLE")) {
            n += 1;
            continue;
        }
        let start = tokens[sig[n]].span.start;
        let (mut depth, mut seeded, mut m) = (0i32, false, n + 2);
        while m < sig.len() {
            let t = &tokens[sig[m]].token;
            let stop = depth == 0
                && (matches!(t, Token::RParen | Token::SemiColon | Token::EOF)
                    || ["WHERE", "GROUP", "ORDER", "LIMIT", "HAVING", "QUALIFY", "WINDOW", "UNION", "EXCEPT", "INTERSECT", "JOIN", "LEFT", "RIGHT", "INNER", "FULL", "CROSS"]
                        .iter()
                        .any(|w| word(sig[m], w)));
            if stop {
                break;
            }
            match t {
                Token::LParen => depth += 1,
                Token::RParen => depth -= 1,
                Token::Comma if depth == 1 => seeded = true,
                _ if word(sig[m], "REPEATABLE") => seeded = true,
                _ => {}
            }
            m += 1;
        }
        let end = if m < sig.len() { tokens[sig[m]].span.start } else { tokens[tokens.len() - 1].span.end };
        let (a, b) = (index.byte(start.line, start.column), index.byte(end.line, end.column).max(index.byte(start.line, start.column)));
        let blank: String = out[a..b].chars().map(|c| if c == '\n' { '\n' } else { ' ' }).collect();
        out.replace_range(a..b, &blank);
        found.push((Span::new(start, end), seeded));
        n = m;
    }
    (out, found)
}

/// Lints a job's source SQL. A text the parser cannot read is an error
/// with its position.
pub fn lint(job: &Job, dialect: SqlDialect) -> Result<Vec<Finding>> {
    let (text, samples) = match dialect {
        SqlDialect::DuckDb => using_samples(&job.source.template().text_for_parsing()),
        SqlDialect::Postgres | SqlDialect::Spark => (job.source.template().text_for_parsing(), Vec::new()),
    };
    let d: Box<dyn Dialect> = match dialect {
        SqlDialect::DuckDb => Box::new(DuckDbDialect {}),
        SqlDialect::Postgres => Box::new(PostgreSqlDialect {}),
        SqlDialect::Spark => Box::new(SparkSql),
    };
    let statements = Parser::parse_sql(d.as_ref(), &text).map_err(|e| Error::Sql {
        what: "source.sql".into(),
        message: format!("cannot be read as {} SQL: {e}", dialect.label()),
        hint: Some("fix the syntax, or pass --allow-nondeterministic to run it unchecked".into()),
    })?;
    let Some(Statement::Query(query)) = statements.first() else {
        return Err(Error::Sql { what: "source.sql".into(), message: "is not a query".into(), hint: None });
    };
    let metadata: HashSet<String> = job.metadata.iter().map(|m| m.to_ascii_lowercase()).collect();
    let mut linter = Linter { job, exempt: Vec::new(), filters: Vec::new(), found: Vec::new() };
    let selects = top_selects(&query.body);
    for s in &selects {
        for item in &s.projection {
            if let SelectItem::ExprWithAlias { expr, alias } = item {
                let name = alias.value.to_ascii_lowercase();
                if metadata.contains(&name) {
                    linter.exempt.push(expr.span());
                }
                if let Some(m) = &job.merge {
                    if m.key.iter().any(|k| k.eq_ignore_ascii_case(&name)) && contains_any(expr, &[RANDOM, &["row_number", "nextval", "rank", "dense_rank"]].concat()) {
                        linter.add(expr.span(), "keys", Severity::Error, format!("the merge key {name} is generated ({expr}): every rerun makes new keys and inserts the rows again"), "merge on the natural business key from the source system");
                    }
                }
            }
        }
    }
    let _ = statements.visit(&mut linter);
    for (span, seeded) in samples {
        if !seeded {
            linter.add(span, "random", Severity::Error, "USING SAMPLE without a seed: every run reads other rows".into(), "add a seed, e.g. USING SAMPLE 10% (bernoulli, 42), or do not sample in a load job");
        }
    }
    if let Some(files) = &job.source.files {
        if !files.uses_run_date() {
            linter.add(Span::empty(), "scope", Severity::Error, format!("the files pattern {:?} has no {{run_date}}, so every run reads the same files", files.pattern), "put the run's date in the pattern, e.g. files = \"bronze/orders/dt={run_date}/*.parquet\"");
        }
    } else if job.strategy == Strategy::ReplacePartition && !job.source.template().uses_any(&[RunParam::RunDate, RunParam::RunStart, RunParam::RunEnd]) {
        linter.add(Span::empty(), "scope", Severity::Error, "the source never uses :run_date, :run_start or :run_end, so every run reads every day".into(), "filter the source to the run's day, e.g. WHERE dt = :run_date");
    }
    let (file_line, first_col) = job.source.position;
    let mut out: Vec<Finding> = linter
        .found
        .into_iter()
        .map(|(span, rule, severity, message, hint)| {
            let (l, c) = (span.start.line.max(1) as usize, span.start.column.max(1) as usize);
            Finding {
                rule,
                severity,
                line: file_line + l - 1,
                column: if l == 1 { first_col + c } else { c },
                sql_line: l,
                sql_column: c,
                message,
                hint,
            }
        })
        .collect();
    out.sort_by(|a, b| (a.sql_line, a.sql_column, a.rule).cmp(&(b.sql_line, b.sql_column, b.rule)));
    out.dedup();
    Ok(out)
}

/// Checks the target table for generated merge keys (a sequence, identity,
/// serial or uuid default): a surrogate key makes every rerun insert new
/// rows. Needs the database; findings have no SQL position (line 0).
pub fn lint_target(job: &Job, engine: &mut dyn crate::engine::Engine) -> Result<Vec<Finding>> {
    let Some(m) = &job.merge else { return Ok(Vec::new()) };
    if engine.table_columns(&job.target)?.is_none() {
        return Ok(Vec::new());
    }
    let mut out = Vec::new();
    for (name, default) in engine.column_defaults(&job.target)? {
        let (name, default) = (name.as_str(), default.as_str());
        let d = default.to_ascii_lowercase();
        let generated = ["nextval", "uuid", "random", "identity", "gen_random"].iter().any(|g| d.contains(g));
        if generated && m.key.iter().any(|k| k.eq_ignore_ascii_case(name)) {
            out.push(Finding {
                rule: "keys",
                severity: Severity::Error,
                line: 0,
                column: 0,
                sql_line: 0,
                sql_column: 0,
                message: format!("the merge key {name} of {} is generated by the database (DEFAULT {default}): every rerun makes new keys and inserts the rows again", job.target),
                hint: "merge on the natural business key from the source system".into(),
            });
        }
    }
    Ok(out)
}
