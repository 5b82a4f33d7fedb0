//! The SQL dialects a job's SQL is read in.

use sqlparser::dialect::{Dialect, SparkSqlDialect};

/// The SQL dialect to read a job with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SqlDialect {
    /// DuckDB.
    DuckDb,
    /// PostgreSQL.
    Postgres,
    /// Spark SQL, as fixpoint's sessions read it (see [`SparkSql`]).
    Spark,
}

impl SqlDialect {
    /// The dialect's name for messages.
    pub fn label(self) -> &'static str {
        match self {
            SqlDialect::DuckDb => "DuckDB",
            SqlDialect::Postgres => "PostgreSQL",
            SqlDialect::Spark => "Spark",
        }
    }
}

/// Spark SQL as fixpoint's Spark sessions read it: `sqlparser`'s Spark
/// dialect, with double quotes delimiting identifiers as backticks do
/// (the sessions set `spark.sql.ansi.doubleQuotedIdentifiers`).
#[derive(Debug)]
pub(crate) struct SparkSql;

impl Dialect for SparkSql {
    fn is_delimited_identifier_start(&self, ch: char) -> bool {
        ch == '`' || ch == '"'
    }
    fn supports_string_literal_column_alias(&self, explicit: bool) -> bool {
        SparkSqlDialect.supports_string_literal_column_alias(explicit)
    }
    fn supports_string_literal_table_alias(&self, explicit: bool) -> bool {
        SparkSqlDialect.supports_string_literal_table_alias(explicit)
    }
    fn supports_comparison_in_between_low_bound(&self) -> bool {
        SparkSqlDialect.supports_comparison_in_between_low_bound()
    }
    fn identifier_quote_style(&self, identifier: &str) -> Option<char> {
        SparkSqlDialect.identifier_quote_style(identifier)
    }
    fn is_identifier_start(&self, ch: char) -> bool {
        SparkSqlDialect.is_identifier_start(ch)
    }
    fn is_identifier_part(&self, ch: char) -> bool {
        SparkSqlDialect.is_identifier_part(ch)
    }
    fn supports_filter_during_aggregation(&self) -> bool {
        SparkSqlDialect.supports_filter_during_aggregation()
    }
    fn supports_group_by_expr(&self) -> bool {
        SparkSqlDialect.supports_group_by_expr()
    }
    fn supports_group_by_with_modifier(&self) -> bool {
        SparkSqlDialect.supports_group_by_with_modifier()
    }
    fn supports_lambda_functions(&self) -> bool {
        SparkSqlDialect.supports_lambda_functions()
    }
    fn supports_select_wildcard_except(&self) -> bool {
        SparkSqlDialect.supports_select_wildcard_except()
    }
    fn supports_struct_literal(&self) -> bool {
        SparkSqlDialect.supports_struct_literal()
    }
    fn supports_nested_comments(&self) -> bool {
        SparkSqlDialect.supports_nested_comments()
    }
    fn supports_create_table_using(&self) -> bool {
        SparkSqlDialect.supports_create_table_using()
    }
    fn supports_long_type_as_bigint(&self) -> bool {
        SparkSqlDialect.supports_long_type_as_bigint()
    }
    fn supports_values_as_table_factor(&self) -> bool {
        SparkSqlDialect.supports_values_as_table_factor()
    }
    fn require_interval_qualifier(&self) -> bool {
        SparkSqlDialect.require_interval_qualifier()
    }
    fn supports_bang_not_operator(&self) -> bool {
        SparkSqlDialect.supports_bang_not_operator()
    }
    fn supports_select_item_multi_column_alias(&self) -> bool {
        SparkSqlDialect.supports_select_item_multi_column_alias()
    }
    fn supports_cte_without_as(&self) -> bool {
        SparkSqlDialect.supports_cte_without_as()
    }
    fn supports_map_literal_with_angle_brackets(&self) -> bool {
        SparkSqlDialect.supports_map_literal_with_angle_brackets()
    }
    fn supports_pipe_operator(&self) -> bool {
        SparkSqlDialect.supports_pipe_operator()
    }
    fn parse_infix(&self, parser: &mut sqlparser::parser::Parser, expr: &sqlparser::ast::Expr, precedence: u8) -> Option<std::result::Result<sqlparser::ast::Expr, sqlparser::parser::ParserError>> {
        SparkSqlDialect.parse_infix(parser, expr, precedence)
    }
}
