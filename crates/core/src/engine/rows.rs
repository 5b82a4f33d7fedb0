//! Rows read back from an engine, and a typed accessor that reaches a
//! result's values by column name: a count fixpoint asked for and did not
//! get is an error, never a 0 that would pass a guard.

use crate::error::{Error, Result};
use crate::job::sql::Value;

/// A column: name and the engine's type name.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Column {
    /// The column name.
    pub name: String,
    /// The engine's type, as it would be written in `CREATE TABLE`.
    pub ty: String,
}

/// Rows read back from an engine, with their column names.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Rows {
    /// Column names.
    pub columns: Vec<String>,
    /// Values, row by row.
    pub rows: Vec<Vec<Value>>,
}

/// One row of a result, its values reached by column name.
#[derive(Debug, Clone, Copy)]
pub struct Row<'a> {
    columns: &'a [String],
    values: &'a [Value],
    what: &'a str,
}

impl Rows {
    /// The one row of a query that returns exactly one (an aggregate);
    /// `what` names the query in errors.
    pub fn single<'a>(&'a self, what: &'a str) -> Result<Row<'a>> {
        match self.rows.as_slice() {
            [values] => Ok(Row { columns: &self.columns, values, what }),
            rows => Err(Error::Internal(format!("{what}: expected one row, the database returned {}", rows.len()))),
        }
    }

    /// Each row, reached by column name; `what` names the query in errors.
    pub fn each<'a>(&'a self, what: &'a str) -> impl Iterator<Item = Row<'a>> + 'a {
        self.rows.iter().map(move |values| Row { columns: &self.columns, values, what })
    }
}

impl<'a> Row<'a> {
    /// The value of `column` (matched without regard to case: PostgreSQL
    /// folds unquoted names); a result without it is an error.
    pub fn value(&self, column: &str) -> Result<&'a Value> {
        let i = self.columns.iter().position(|c| c.eq_ignore_ascii_case(column)).ok_or_else(|| {
            Error::Internal(format!("{}: the result has no column {column:?} (it has {})", self.what, self.columns.join(", ")))
        })?;
        self.values
            .get(i)
            .ok_or_else(|| Error::Internal(format!("{}: the row has {} value(s), no value for column {column:?}", self.what, self.values.len())))
    }

    /// The count in `column`: missing, NULL, negative or not a number is
    /// an error.
    pub fn count(&self, column: &str) -> Result<u64> {
        let v = self.value(column)?;
        // (A NULL is no count: `as_u64` reads it as a sum of no rows, 0.)
        Some(v).filter(|v| !matches!(v, Value::Null)).and_then(Value::as_u64).ok_or_else(|| Error::Internal(format!("{}: expected a count in {column:?}, the database returned {v:?}", self.what)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rows() -> Rows {
        Rows { columns: vec!["n_rows".into(), "checksum".into(), "Outside".into()], rows: vec![vec![Value::Int(3), Value::Null, Value::Int(0)]] }
    }

    #[test]
    fn counts_are_read_by_name() {
        let r = rows();
        let row = r.single("guard scan").unwrap();
        assert_eq!(row.count("n_rows").unwrap(), 3);
        assert_eq!(row.count("outside").unwrap(), 0);
        assert_eq!(row.value("checksum").unwrap(), &Value::Null);
    }

    #[test]
    fn a_missing_or_null_count_is_an_error() {
        let r = rows();
        let row = r.single("guard scan").unwrap();
        let e = row.count("ties").unwrap_err().to_string();
        assert!(e.contains("guard scan") && e.contains("\"ties\"") && e.contains("n_rows, checksum, Outside"), "{e}");
        let e = row.count("checksum").unwrap_err().to_string();
        assert!(e.contains("expected a count in \"checksum\""), "{e}");
        let neg = Rows { columns: vec!["n".into()], rows: vec![vec![Value::Int(-1)]] };
        assert!(neg.single("x").unwrap().count("n").is_err());
    }

    #[test]
    fn single_wants_exactly_one_row() {
        let none = Rows { columns: vec!["n".into()], rows: vec![] };
        assert!(none.single("x").unwrap_err().to_string().contains("expected one row, the database returned 0"));
        let two = Rows { columns: vec!["n".into()], rows: vec![vec![Value::Int(1)], vec![Value::Int(2)]] };
        assert!(two.single("x").is_err());
        assert_eq!(two.each("x").map(|r| r.count("n").unwrap()).collect::<Vec<_>>(), [1, 2]);
    }
}
