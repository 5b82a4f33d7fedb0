//! [`Engine`] over Spark Connect.

use std::time::Duration;

use arrow_array::cast::AsArray;
use arrow_array::types::*;
use arrow_array::{Array, RecordBatch};
use arrow_schema::{DataType, TimeUnit};
use fixpoint_core::engine::{Column, Engine, Rows};
use fixpoint_core::ident::{quote_ident, TableName};
use fixpoint_core::sql::{Sql, Value};
use fixpoint_core::{Error, Result};

use crate::client::{Client, SparkError};

/// A Spark session on a Spark Connect server.
pub struct Spark {
    client: Client,
    url: String,
}

fn err(context: &str) -> impl FnOnce(SparkError) -> Error + '_ {
    move |e| Error::Database { engine: "spark", context: context.to_owned(), message: e.to_string() }
}

impl Spark {
    /// Connects to `sc://host:port`.
    pub fn connect(url: &str, timeout: Duration) -> Result<Spark> {
        let client = Client::connect(url, timeout).map_err(|e| Error::Database {
            engine: "spark",
            context: format!("connecting to {url}"),
            message: e.to_string(),
        })?;
        let mut spark = Spark { client, url: url.to_owned() };
        // fixpoint's SQL quotes identifiers the standard way ("name"), which
        // Spark reads as identifiers only with this setting (and ANSI mode).
        for setting in ["SET spark.sql.ansi.enabled = true", "SET spark.sql.ansi.doubleQuotedIdentifiers = true"] {
            spark.client.execute(setting, &[]).map_err(err("setting up the session"))?;
        }
        Ok(spark)
    }

    /// The server's URL.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The columns of `DESCRIBE …` output, up to its first `#` section.
    fn described(rows: Rows) -> Vec<Column> {
        let mut cols = Vec::new();
        for r in rows.rows {
            let (Some(Value::Text(name)), Some(Value::Text(ty))) = (r.first(), r.get(1)) else { break };
            if name.is_empty() || name.starts_with('#') {
                break;
            }
            cols.push(Column { name: name.clone(), ty: ty.clone() });
        }
        cols
    }
}

impl Engine for Spark {
    fn name(&self) -> &'static str {
        "spark"
    }

    fn version(&mut self) -> Result<String> {
        self.client.version().map(|v| format!("spark v{v}")).map_err(err("reading the server's version"))
    }

    /// Spark reports no count of changed rows: 0.
    fn execute(&mut self, sql: &Sql) -> Result<u64> {
        self.client.execute(&sql.text, &sql.params).map_err(err(&sql.text)).map(|_| 0)
    }

    fn query(&mut self, sql: &Sql) -> Result<Rows> {
        let batches = self.client.query(&sql.text, &sql.params).map_err(err(&sql.text))?;
        to_rows(&batches)
    }

    fn begin(&mut self) -> Result<()> {
        Err(Error::Unsupported {
            engine: "spark",
            capability: "transactions (a run on Spark needs the strategies' Spark plans, not written yet)".into(),
        })
    }

    fn commit(&mut self) -> Result<()> {
        self.begin()
    }

    fn rollback(&mut self) -> Result<()> {
        Ok(())
    }

    fn describe(&mut self, query: &Sql) -> Result<Vec<Column>> {
        let mut sql = Sql::new();
        sql.push("DESCRIBE QUERY ");
        sql.text.push_str(&query.text);
        sql.params = query.params.clone();
        let rows = self.query(&sql)?;
        Ok(Self::described(rows))
    }

    fn table_columns(&mut self, table: &TableName) -> Result<Option<Vec<Column>>> {
        match self.client.query(&format!("DESCRIBE TABLE {}", table.quoted()), &[]) {
            Ok(batches) => Ok(Some(Self::described(to_rows(&batches)?))),
            Err(e) if e.error_class.as_deref() == Some("TABLE_OR_VIEW_NOT_FOUND") => Ok(None),
            Err(e) => Err(err("describing a table")(e)),
        }
    }

    fn native_row_hash(&self, alias: &str, columns: &[Column]) -> Option<String> {
        // Spark's xxhash64 skips NULL arguments, so (NULL, 'a') would hash
        // as ('a', NULL): each value is followed by its NULL flag.
        let args: Vec<String> = columns
            .iter()
            .flat_map(|c| {
                let e = format!("{alias}.{}", quote_ident(&c.name));
                [e.clone(), format!("isnull({e})")]
            })
            .collect();
        // As a DECIMAL, so the sum never overflows (ANSI mode fails on it).
        Some(format!("CAST(xxhash64({}) AS DECIMAL(20, 0))", args.join(", ")))
    }

    fn portable_value(&self, expr: &str, column: &Column) -> (String, &'static str) {
        let ty = column.ty.to_ascii_lowercase();
        let (class, text) = if ["tinyint", "smallint", "int", "bigint"].contains(&ty.as_str()) {
            ("int", format!("CAST({expr} AS STRING)"))
        } else if ty.starts_with("decimal") {
            ("decimal", format!("CAST({expr} AS STRING)"))
        } else if ty == "float" || ty == "double" {
            // Java's %.16e pads the shortest decimal with zeros where C's
            // prints the exact value's digits: not the same text (see the
            // crate's tests); kept apart as its own class until the
            // canonical encoding of floats changes.
            ("float-java", format!("format_string('%.16e', CAST({expr} AS DOUBLE))"))
        } else if ty == "string" || ty.starts_with("varchar") || ty.starts_with("char") {
            ("text", format!("CAST({expr} AS STRING)"))
        } else if ty == "date" {
            ("date", format!("CAST({expr} AS STRING)"))
        } else if ty == "timestamp_ntz" {
            ("timestamp", format!("CAST(unix_micros(CAST({expr} AS TIMESTAMP)) AS STRING)"))
        } else if ty == "timestamp" {
            ("timestamptz", format!("CAST(unix_micros({expr}) AS STRING)"))
        } else if ty == "boolean" {
            ("bool", format!("CASE WHEN {expr} THEN 't' WHEN NOT {expr} THEN 'f' END"))
        } else if ty == "binary" {
            ("bytes", format!("hex({expr})"))
        } else {
            ("other", format!("CAST({expr} AS STRING)"))
        };
        (text, class)
    }

    fn portable_row_hash(&self, text_expr: &str) -> String {
        // The digest's first 8 bytes read little-endian, as an unsigned
        // number (DuckDB's md5_number low 64 bits): the first 16 hex digits
        // with their byte pairs reversed, in base 10. (Spark evaluates the
        // repeated md5 once: subexpression elimination.)
        let pairs: Vec<String> = (0..8).rev().map(|i| format!("substr(md5({text_expr}), {}, 2)", 2 * i + 1)).collect();
        format!("CAST(conv(concat({}), 16, 10) AS DECIMAL(20, 0))", pairs.join(", "))
    }

    fn text_type(&self) -> &'static str {
        "STRING"
    }

    fn read_sum(&self, v: &Value) -> Result<i128> {
        match v {
            Value::Null => Ok(0),
            Value::Text(s) => s.parse::<i128>().map_err(|_| Error::Internal(format!("spark: a checksum sum came back as {s:?}"))),
            other => other.as_i128().ok_or_else(|| Error::Internal(format!("spark: a checksum sum came back as {other:?}"))),
        }
    }
}

/// Arrow batches as fixpoint rows.
fn to_rows(batches: &[RecordBatch]) -> Result<Rows> {
    let mut rows = Rows { columns: Vec::new(), rows: Vec::new() };
    for b in batches {
        if rows.columns.is_empty() {
            rows.columns = b.schema().fields().iter().map(|f| f.name().clone()).collect();
        }
        for r in 0..b.num_rows() {
            let mut row = Vec::with_capacity(b.num_columns());
            for c in b.columns() {
                row.push(value(c.as_ref(), r)?);
            }
            rows.rows.push(row);
        }
    }
    Ok(rows)
}

fn value(a: &dyn Array, r: usize) -> Result<Value> {
    if a.is_null(r) {
        return Ok(Value::Null);
    }
    let epoch = chrono::NaiveDate::from_ymd_opt(1970, 1, 1).expect("a date");
    Ok(match a.data_type() {
        DataType::Boolean => Value::Bool(a.as_boolean().value(r)),
        DataType::Int8 => Value::Int(a.as_primitive::<Int8Type>().value(r).into()),
        DataType::Int16 => Value::Int(a.as_primitive::<Int16Type>().value(r).into()),
        DataType::Int32 => Value::Int(a.as_primitive::<Int32Type>().value(r).into()),
        DataType::Int64 => Value::Int(a.as_primitive::<Int64Type>().value(r)),
        DataType::Float32 => Value::Float(a.as_primitive::<Float32Type>().value(r).into()),
        DataType::Float64 => Value::Float(a.as_primitive::<Float64Type>().value(r)),
        DataType::Utf8 => Value::Text(a.as_string::<i32>().value(r).to_owned()),
        DataType::LargeUtf8 => Value::Text(a.as_string::<i64>().value(r).to_owned()),
        DataType::Date32 => Value::Date(epoch + chrono::Duration::days(a.as_primitive::<Date32Type>().value(r).into())),
        DataType::Timestamp(TimeUnit::Microsecond, _) => {
            let us = a.as_primitive::<TimestampMicrosecondType>().value(r);
            Value::Timestamp(
                chrono::DateTime::from_timestamp_micros(us).ok_or_else(|| Error::Internal(format!("spark: timestamp {us} out of range")))?.naive_utc(),
            )
        }
        DataType::Decimal128(_, scale) => {
            let v = a.as_primitive::<Decimal128Type>().value(r);
            if *scale == 0 {
                Value::HugeInt(v)
            } else {
                Value::Text(a.as_primitive::<Decimal128Type>().value_as_string(r))
            }
        }
        other => {
            let shown = arrow_cast_display(a, r).unwrap_or_else(|| format!("<{other}>"));
            Value::Text(shown)
        }
    })
}

/// Any other value as text, when Arrow can show it.
fn arrow_cast_display(a: &dyn Array, r: usize) -> Option<String> {
    match a.data_type() {
        DataType::Binary => Some(a.as_binary::<i32>().value(r).iter().map(|b| format!("{b:02X}")).collect()),
        _ => None,
    }
}
