//! Identifiers: table names from job files and the one function that quotes
//! every identifier fixpoint writes into SQL.

use std::fmt;

use crate::error::{Error, Result};

/// The schema of fixpoint's own tables (the ledger, tombstones, leases):
/// no job may target it.
pub const LEDGER_SCHEMA: &str = "fixpoint";

/// The prefix of the sandbox schemas `prove` makes for its mutation check:
/// no job may target one.
pub const SANDBOX_PREFIX: &str = "fixpoint_sandbox_";

/// Quotes an identifier for SQL (`"name"`, inner quotes doubled). Every table
/// and column name fixpoint writes into SQL goes through here.
pub fn quote_ident(name: &str) -> String {
    let mut s = String::with_capacity(name.len() + 2);
    s.push('"');
    for c in name.chars() {
        if c == '"' {
            s.push('"');
        }
        s.push(c);
    }
    s.push('"');
    s
}

/// A `schema.table` name.
#[derive(Debug, Clone, PartialEq, Eq, Hash, serde::Serialize)]
pub struct TableName {
    /// The schema.
    pub schema: String,
    /// The table.
    pub table: String,
}

impl TableName {
    /// Parses `schema.table`: two plain identifiers (letters, digits, `_`,
    /// not starting with a digit), separated by one dot.
    pub fn parse(s: &str) -> Result<TableName> {
        let parts: Vec<&str> = s.split('.').collect();
        let ok = parts.len() == 2 && parts.iter().all(|p| is_plain_ident(p));
        if !ok {
            return Err(Error::argument(
                format!("{s:?} is not a table name: expected schema.table, e.g. silver.orders"),
                Some("use two plain identifiers (letters, digits and _) joined by one dot"),
            ));
        }
        Ok(TableName { schema: parts[0].to_owned(), table: parts[1].to_owned() })
    }

    /// The quoted `"schema"."table"`.
    pub fn quoted(&self) -> String {
        format!("{}.{}", quote_ident(&self.schema), quote_ident(&self.table))
    }
}

impl fmt::Display for TableName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.schema, self.table)
    }
}

/// Letters, digits and `_`, not starting with a digit.
pub fn is_plain_ident(s: &str) -> bool {
    let mut chars = s.chars();
    match chars.next() {
        Some(c) if c.is_ascii_alphabetic() || c == '_' => {}
        _ => return false,
    }
    chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quotes_and_escapes() {
        assert_eq!(quote_ident("dt"), "\"dt\"");
        assert_eq!(quote_ident("a\"b"), "\"a\"\"b\"");
    }

    #[test]
    fn table_names() {
        let t = TableName::parse("silver.orders").unwrap();
        assert_eq!(t.quoted(), "\"silver\".\"orders\"");
        for bad in ["orders", "a.b.c", "silver.", "silver.orders; drop", "1x.y", "s.\"t\""] {
            assert!(TableName::parse(bad).unwrap_err().to_string().contains("not a table name"), "{bad}");
        }
    }
}
