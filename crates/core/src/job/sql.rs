//! SQL is built, not pasted: [`Sql`] carries text plus bound parameters, and
//! [`SourceTemplate`] turns a job's `:run_date`-style names into engine
//! placeholders without ever splicing a value into the text.

use chrono::{NaiveDate, NaiveDateTime};
use sqlparser::dialect::GenericDialect;
use sqlparser::parser::Parser;
use sqlparser::tokenizer::{Token, Tokenizer};

use crate::error::{Error, Result};
use crate::job::ident::quote_ident;

/// A value bound as a parameter or read back from an engine.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// SQL NULL.
    Null,
    /// BOOLEAN.
    Bool(bool),
    /// Any integer up to 64 bits.
    Int(i64),
    /// A 128-bit integer (sums of hashes).
    HugeInt(i128),
    /// A floating point number.
    Float(f64),
    /// Text (also the display form of types fixpoint does not model).
    Text(String),
    /// DATE.
    Date(NaiveDate),
    /// TIMESTAMP without time zone.
    Timestamp(NaiveDateTime),
}

impl Value {
    /// The value as an i128, if it is an integer.
    pub fn as_i128(&self) -> Option<i128> {
        match self {
            Value::Int(i) => Some(*i as i128),
            Value::HugeInt(i) => Some(*i),
            Value::Null => Some(0),
            Value::Text(s) => s.parse().ok(),
            _ => None,
        }
    }

    /// The value as a u64 count.
    pub fn as_u64(&self) -> Option<u64> {
        self.as_i128().and_then(|i| u64::try_from(i).ok())
    }

    /// The value as a count, where a missing or unreadable count is an error
    /// (a bug: the query fixpoint wrote returns one), never a 0 that would
    /// pass a guard. `what` names the count in the error.
    pub fn count(&self, what: &str) -> crate::error::Result<u64> {
        self.as_u64().ok_or_else(|| crate::error::Error::Internal(format!("{what}: expected a count, the database returned {self:?}")))
    }

    /// The value as text, if it is text.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::Text(s) => Some(s),
            _ => None,
        }
    }

    /// A display form for messages and samples (`NULL` for null).
    pub fn display(&self) -> String {
        match self {
            Value::Null => "NULL".into(),
            Value::Bool(b) => b.to_string(),
            Value::Int(i) => i.to_string(),
            Value::HugeInt(i) => i.to_string(),
            Value::Float(f) => f.to_string(),
            Value::Text(s) => format!("{s:?}"),
            Value::Date(d) => d.format("%Y-%m-%d").to_string(),
            Value::Timestamp(t) => t.format("%Y-%m-%d %H:%M:%S%.f").to_string(),
        }
    }
}

/// A SQL text with its parameters, numbered `$1`, `$2`, … in order.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Sql {
    /// The text, with `$n` placeholders.
    pub text: String,
    /// The values for `$1`, `$2`, ….
    pub params: Vec<Value>,
}

impl Sql {
    /// An empty statement.
    pub fn new() -> Sql {
        Sql::default()
    }

    /// A statement without parameters.
    pub fn raw(text: impl Into<String>) -> Sql {
        Sql { text: text.into(), params: Vec::new() }
    }

    /// Appends SQL text written by fixpoint (never user values).
    pub fn push(&mut self, s: &str) -> &mut Sql {
        self.text.push_str(s);
        self
    }

    /// Appends a quoted identifier.
    pub fn ident(&mut self, name: &str) -> &mut Sql {
        self.text.push_str(&quote_ident(name));
        self
    }

    /// Binds a value and appends its placeholder.
    pub fn param(&mut self, v: Value) -> &mut Sql {
        self.params.push(v);
        self.text.push('$');
        self.text.push_str(&self.params.len().to_string());
        self
    }

    /// Appends another statement's text and parameters, renumbering its
    /// `$n` placeholders after this one's. `other` must be SQL written by
    /// fixpoint (a `$` followed by digits is always a placeholder in it).
    pub fn append(&mut self, other: &Sql) -> &mut Sql {
        let offset = self.params.len();
        let mut chars = other.text.char_indices().peekable();
        while let Some((_, c)) = chars.next() {
            self.text.push(c);
            if c == '$' {
                let mut digits = String::new();
                while let Some((_, d)) = chars.peek().filter(|(_, d)| d.is_ascii_digit()) {
                    digits.push(*d);
                    chars.next();
                }
                if let Ok(n) = digits.parse::<usize>() {
                    self.text.push_str(&(n + offset).to_string());
                }
            }
        }
        self.params.extend(other.params.iter().cloned());
        self
    }

    /// Binds a value and appends `CAST($n AS ty)`, so the engine knows its type.
    pub fn typed_param(&mut self, v: Value, ty: &str) -> &mut Sql {
        self.push("CAST(");
        self.param(v);
        self.push(" AS ");
        self.push(ty);
        self.push(")")
    }
}

/// A parameter a job's SQL may use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunParam {
    /// `:run_date`, DATE.
    RunDate,
    /// `:run_start`, TIMESTAMP: the run date at 00:00.
    RunStart,
    /// `:run_end`, TIMESTAMP: the next day at 00:00 (exclusive).
    RunEnd,
    /// `:run_key`, VARCHAR: the run's deterministic key.
    RunKey,
}

impl RunParam {
    const ALL: [RunParam; 4] = [RunParam::RunDate, RunParam::RunStart, RunParam::RunEnd, RunParam::RunKey];

    /// The name after the colon.
    pub fn name(self) -> &'static str {
        match self {
            RunParam::RunDate => "run_date",
            RunParam::RunStart => "run_start",
            RunParam::RunEnd => "run_end",
            RunParam::RunKey => "run_key",
        }
    }

    fn sql_type(self) -> &'static str {
        match self {
            RunParam::RunDate => "DATE",
            RunParam::RunStart | RunParam::RunEnd => "TIMESTAMP",
            RunParam::RunKey => "VARCHAR",
        }
    }
}

/// The values of the run parameters for one run.
#[derive(Debug, Clone, PartialEq)]
pub struct RunParams {
    /// The logical run date.
    pub run_date: NaiveDate,
    /// The run key (empty while the input fingerprint is being computed).
    pub run_key: String,
    /// For a file source: the relation (engine SQL, with its own `$n`
    /// parameters) that the query reads as `input`.
    pub input: Option<Sql>,
}

impl RunParams {
    /// The parameters of a run for `run_date`, before its key is known.
    pub fn new(run_date: NaiveDate) -> RunParams {
        RunParams { run_date, run_key: String::new(), input: None }
    }

    fn value(&self, p: RunParam) -> Value {
        let start = self.run_date.and_time(chrono::NaiveTime::MIN);
        match p {
            RunParam::RunDate => Value::Date(self.run_date),
            RunParam::RunStart => Value::Timestamp(start),
            RunParam::RunEnd => Value::Timestamp(start + chrono::Duration::days(1)),
            RunParam::RunKey => Value::Text(self.run_key.clone()),
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
enum Segment {
    Text(String),
    Param(RunParam),
}

/// A user's query with `:run_date`, `:run_start`, `:run_end` and `:run_key`
/// located by the SQL tokenizer (so text inside string literals, quoted
/// identifiers and comments is never touched).
#[derive(Debug, Clone, PartialEq)]
pub struct SourceTemplate {
    segments: Vec<Segment>,
}

impl SourceTemplate {
    /// Reads a query; `what` names it in errors (e.g. `source.sql`).
    pub fn parse(what: &str, sql: &str) -> Result<SourceTemplate> {
        let err = |message: String, hint: Option<&str>| Error::Sql {
            what: what.to_owned(),
            message,
            hint: hint.map(str::to_owned),
        };
        let dialect = GenericDialect {};
        let tokens = Tokenizer::new(&dialect, sql)
            .tokenize_with_location()
            .map_err(|e| err(format!("{} at line {}, column {}", e.message, e.location.line, e.location.column), None))?;
        let offsets = LineIndex::new(sql);

        let significant: Vec<usize> =
            (0..tokens.len()).filter(|&i| !matches!(tokens[i].token, Token::Whitespace(_) | Token::EOF)).collect();
        if significant.is_empty() {
            return Err(err("is empty".into(), Some("write the query that produces the run's rows")));
        }
        // One statement: a `;` may only end the text.
        let mut end_byte = sql.len();
        for (n, &i) in significant.iter().enumerate() {
            if tokens[i].token == Token::SemiColon {
                let loc = tokens[i].span.start;
                if significant[n + 1..].iter().any(|&j| tokens[j].token != Token::SemiColon) {
                    return Err(err(
                        format!("holds more than one statement (`;` at line {}, column {})", loc.line, loc.column),
                        Some("give one query; fixpoint writes the target itself"),
                    ));
                }
                end_byte = end_byte.min(offsets.byte(loc.line, loc.column));
            }
        }
        let first = &tokens[significant[0]].token;
        let is_query = match first {
            Token::LParen => true,
            Token::Word(w) => {
                matches!(w.value.to_ascii_uppercase().as_str(), "SELECT" | "WITH" | "VALUES" | "FROM" | "TABLE")
            }
            _ => false,
        };
        if !is_query {
            return Err(err(
                format!("must be a query (SELECT, WITH, VALUES or FROM), not `{first}`"),
                Some("fixpoint deletes and inserts itself; the source only says which rows the run's scope holds"),
            ));
        }

        let mut segments = Vec::new();
        let mut copied = 0usize;
        let mut bracket_depth = 0i32;
        for (n, &i) in significant.iter().enumerate() {
            let tok = &tokens[i];
            match &tok.token {
                Token::LBracket => bracket_depth += 1,
                Token::RBracket => bracket_depth -= 1,
                Token::Placeholder(p) => {
                    return Err(err(
                        format!(
                            "uses the positional parameter `{p}` at line {}, column {}",
                            tok.span.start.line, tok.span.start.column
                        ),
                        Some("use the named parameters :run_date, :run_start, :run_end or :run_key"),
                    ))
                }
                Token::Colon if bracket_depth == 0 => {
                    let Some(&next) = significant.get(n + 1) else { continue };
                    let Token::Word(w) = &tokens[next].token else { continue };
                    let adjacent = next == i + 1 && w.quote_style.is_none();
                    if !adjacent {
                        continue;
                    }
                    let Some(param) = RunParam::ALL.into_iter().find(|p| p.name() == w.value) else {
                        return Err(err(
                            format!(
                                "uses the unknown parameter `:{}` at line {}, column {}",
                                w.value, tok.span.start.line, tok.span.start.column
                            ),
                            Some("the parameters are :run_date (DATE), :run_start and :run_end (TIMESTAMP, the day's half-open window) and :run_key (VARCHAR)"),
                        ));
                    };
                    let start = offsets.byte(tok.span.start.line, tok.span.start.column);
                    let end = offsets.byte(tokens[next].span.start.line, tokens[next].span.start.column) + w.value.len();
                    if start > copied {
                        segments.push(Segment::Text(sql[copied..start].to_owned()));
                    }
                    segments.push(Segment::Param(param));
                    copied = end;
                }
                _ => {}
            }
        }
        if end_byte > copied {
            segments.push(Segment::Text(sql[copied..end_byte].trim_end().to_owned()));
        }
        Ok(SourceTemplate { segments })
    }

    /// Whether the query uses any of `params`.
    pub fn uses_any(&self, params: &[RunParam]) -> bool {
        self.segments.iter().any(|s| matches!(s, Segment::Param(p) if params.contains(p)))
    }

    /// Appends the query to `out`, binding each parameter it uses once
    /// (typed with a CAST), numbered after the parameters already in `out`.
    pub fn render_into(&self, out: &mut Sql, values: &RunParams) {
        if let Some(input) = &values.input {
            out.push("WITH \"input\" AS (SELECT * FROM ");
            out.append(input);
            out.push(") SELECT * FROM (\n");
        }
        let mut numbers: Vec<(RunParam, usize)> = Vec::new();
        for seg in &self.segments {
            match seg {
                Segment::Text(t) => {
                    out.push(t);
                }
                Segment::Param(p) => {
                    let n = match numbers.iter().find(|(q, _)| q == p) {
                        Some((_, n)) => *n,
                        None => {
                            out.params.push(values.value(*p));
                            numbers.push((*p, out.params.len()));
                            out.params.len()
                        }
                    };
                    out.push(&format!("CAST(${n} AS {})", p.sql_type()));
                }
            }
        }
        if values.input.is_some() {
            out.push("\n) AS \"fixpoint_source\"");
        }
    }

    /// The query with each `:name` replaced by a same-width `$n`, so a
    /// parser reads it and every position stays where the user wrote it.
    pub fn text_for_parsing(&self) -> String {
        let mut out = String::new();
        for seg in &self.segments {
            match seg {
                Segment::Text(t) => out.push_str(t),
                Segment::Param(p) => {
                    let n = RunParam::ALL.iter().position(|q| q == p).expect("known") + 1;
                    let ph = format!("${n}");
                    out.push_str(&ph);
                    out.push_str(&" ".repeat(p.name().len() + 1 - ph.len()));
                }
            }
        }
        out
    }

    /// The query alone.
    pub fn render(&self, values: &RunParams) -> Sql {
        let mut sql = Sql::new();
        self.render_into(&mut sql, values);
        sql
    }
}

/// Checks that `text` is one boolean expression (for `--where`), so it can be
/// placed after `WHERE` without ending the statement or opening another.
pub fn check_predicate(what: &str, text: &str) -> Result<()> {
    let dialect = GenericDialect {};
    let err = |message: String| Error::Sql {
        what: what.to_owned(),
        message,
        hint: Some("give one SQL condition, e.g. \"dt = DATE '2026-10-20'\"".into()),
    };
    let mut parser = Parser::new(&dialect).try_with_sql(text).map_err(|e| err(e.to_string()))?;
    parser.parse_expr().map_err(|e| err(e.to_string()))?;
    let rest = parser.peek_token();
    if rest.token != Token::EOF {
        return Err(err(format!(
            "is not a single condition: unexpected `{}` at line {}, column {}",
            rest.token, rest.span.start.line, rest.span.start.column
        )));
    }
    Ok(())
}

/// Maps the tokenizer's (line, column) to byte offsets.
pub(crate) struct LineIndex<'a> {
    text: &'a str,
    starts: Vec<usize>,
}

impl<'a> LineIndex<'a> {
    pub(crate) fn new(text: &'a str) -> Self {
        let mut starts = vec![0];
        starts.extend(text.match_indices('\n').map(|(i, _)| i + 1));
        LineIndex { text, starts }
    }

    pub(crate) fn byte(&self, line: u64, column: u64) -> usize {
        let start = self.starts[(line as usize).saturating_sub(1).min(self.starts.len() - 1)];
        let skip = (column as usize).saturating_sub(1);
        self.text[start..].char_indices().nth(skip).map(|(i, _)| start + i).unwrap_or(self.text.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params() -> RunParams {
        RunParams { run_key: "k".into(), ..RunParams::new(NaiveDate::from_ymd_opt(2026, 10, 20).unwrap()) }
    }

    #[test]
    fn rewrites_named_parameters_only_outside_literals() {
        let t = SourceTemplate::parse(
            "source.sql",
            "SELECT ':run_date' AS s, \"a:run_key\", x::date -- :run_end\nFROM t WHERE dt = :run_date AND ts >= :run_start AND ts < :run_end AND d = :run_date;",
        )
        .unwrap();
        let sql = t.render(&params());
        assert_eq!(
            sql.text,
            "SELECT ':run_date' AS s, \"a:run_key\", x::date -- :run_end\nFROM t WHERE dt = CAST($1 AS DATE) AND ts >= CAST($2 AS TIMESTAMP) AND ts < CAST($3 AS TIMESTAMP) AND d = CAST($1 AS DATE)"
        );
        assert_eq!(sql.params.len(), 3);
        assert_eq!(sql.params[0], Value::Date(NaiveDate::from_ymd_opt(2026, 10, 20).unwrap()));
        assert_eq!(sql.params[2].display(), "2026-10-21 00:00:00");
    }

    #[test]
    fn numbering_continues_after_existing_parameters() {
        let t = SourceTemplate::parse("source.sql", "SELECT :run_key AS load_id").unwrap();
        let mut sql = Sql::new();
        sql.push("SELECT * FROM (").param(Value::Int(1)).push(") x, (");
        t.render_into(&mut sql, &params());
        sql.push(")");
        assert_eq!(sql.text, "SELECT * FROM ($1) x, (SELECT CAST($2 AS VARCHAR) AS load_id)");
    }

    #[test]
    fn a_file_input_is_named_input_and_numbered_first() {
        let t = SourceTemplate::parse("source.sql", "SELECT id, :run_date AS dt FROM input").unwrap();
        let mut rel = Sql::new();
        rel.push("read_csv([").param(Value::Text("a.csv".into())).push(", ").param(Value::Text("b.csv".into())).push("])");
        let mut sql = Sql::new();
        sql.param(Value::Int(7)).push(" ");
        t.render_into(&mut sql, &RunParams { input: Some(rel), ..params() });
        assert_eq!(
            sql.text,
            "$1 WITH \"input\" AS (SELECT * FROM read_csv([$2, $3])) SELECT * FROM (\nSELECT id, CAST($4 AS DATE) AS dt FROM input\n) AS \"fixpoint_source\""
        );
        assert_eq!(sql.params.len(), 4);
        assert_eq!(sql.params[2], Value::Text("b.csv".into()));
    }

    #[test]
    fn keeps_quotes_in_string_literals() {
        let t = SourceTemplate::parse("source.sql", "SELECT 'it''s :run_date' AS s, :run_date AS d").unwrap();
        assert_eq!(t.render(&params()).text, "SELECT 'it''s :run_date' AS s, CAST($1 AS DATE) AS d");
    }

    #[test]
    fn refuses_what_cannot_be_a_source() {
        let cases = [
            ("SELECT 1; DROP TABLE silver.orders", "more than one statement"),
            ("SELECT :run_day", "unknown parameter `:run_day`"),
            ("SELECT $1", "positional parameter `$1`"),
            ("SELECT ?", "positional parameter `?`"),
            ("DELETE FROM x", "must be a query"),
            ("  ", "is empty"),
            ("SELECT 'unterminated", "line 1"),
        ];
        for (sql, expected) in cases {
            let e = SourceTemplate::parse("source.sql", sql).unwrap_err().to_string();
            assert!(e.contains(expected), "{sql}: {e}");
            assert!(e.starts_with("source.sql: "), "{e}");
        }
        // DuckDB list slices are not parameters.
        assert!(SourceTemplate::parse("source.sql", "SELECT l[1:n] FROM t").is_ok());
    }

    #[test]
    fn predicates_are_single_expressions() {
        assert!(check_predicate("--where", "dt = DATE '2026-10-20' AND x IS NOT NULL").is_ok());
        let e = check_predicate("--where", "1=1; DROP TABLE t").unwrap_err().to_string();
        assert!(e.contains("not a single condition"), "{e}");
        assert!(check_predicate("--where", "").is_err());
    }
}
