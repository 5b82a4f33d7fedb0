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
    /// The leases this session holds: scope -> (view, owner token).
    leases: std::collections::HashMap<String, (TableName, String)>,
}

/// How long a lease lasts when its run dies without releasing it
/// (`FIXPOINT_SPARK_LEASE_SECONDS`, default one hour).
fn lease_seconds() -> u64 {
    std::env::var("FIXPOINT_SPARK_LEASE_SECONDS").ok().and_then(|s| s.parse().ok()).unwrap_or(3600)
}

fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

/// A string literal for the few values fixpoint makes itself and Spark's
/// grammar takes only as literals (table properties): quotes doubled.
fn lit(s: &str) -> String {
    format!("'{}'", s.replace('\\', "").replace('\'', "''"))
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
        let mut spark = Spark { client, url: url.to_owned(), leases: Default::default() };
        // fixpoint's SQL quotes identifiers the standard way ("name"), which
        // Spark reads as identifiers only with this setting (and ANSI mode).
        // An INSERT OVERWRITE replaces only the partitions its rows fall
        // in, written aside and swapped in when the job commits (static
        // mode would delete first, and wipe a whole table).
        for setting in [
            "SET spark.sql.ansi.enabled = true",
            "SET spark.sql.ansi.doubleQuotedIdentifiers = true",
            "SET spark.sql.sources.partitionOverwriteMode = dynamic",
        ] {
            spark.client.execute(setting, &[]).map_err(err("setting up the session"))?;
        }
        Ok(spark)
    }

    /// The server's URL.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The lease's view: `fixpoint.lease__<hash of the scope>`.
    fn lease_view(scope: &str) -> TableName {
        let h = &fixpoint_core::runkey::hash_hex(&["fixpoint-lease-v1", scope])[..16];
        TableName { schema: fixpoint_core::ledger::SCHEMA.into(), table: format!("lease__{h}") }
    }

    /// A lease's owner token and expiry (ms since the epoch), if it exists.
    fn lease_holder(&mut self, view: &TableName) -> Result<Option<(String, u64)>> {
        match self.client.query(&format!("SHOW TBLPROPERTIES {}", view.quoted()), &[]) {
            Ok(batches) => {
                let rows = to_rows(&batches)?;
                let prop = |k: &str| {
                    rows.rows.iter().find(|r| r.first() == Some(&Value::Text(k.into()))).and_then(|r| r.get(1)).and_then(|v| v.as_str().map(str::to_owned))
                };
                Ok(Some((prop("fixpoint.owner").unwrap_or_default(), prop("fixpoint.expires_ms").and_then(|v| v.parse().ok()).unwrap_or(0))))
            }
            Err(e) if e.error_class.as_deref() == Some("TABLE_OR_VIEW_NOT_FOUND") => Ok(None),
            Err(e) => Err(err("reading a lease")(e)),
        }
    }

    /// The partition columns of a table (`DESCRIBE TABLE`'s partition section).
    fn described_partitions(&mut self, table: &TableName) -> Result<Vec<String>> {
        let rows = match self.client.query(&format!("DESCRIBE TABLE {}", table.quoted()), &[]) {
            Ok(b) => to_rows(&b)?,
            Err(e) if e.error_class.as_deref() == Some("TABLE_OR_VIEW_NOT_FOUND") => return Ok(Vec::new()),
            Err(e) => return Err(err("describing a table")(e)),
        };
        let mut out = Vec::new();
        let mut in_section = false;
        for r in rows.rows {
            let name = r.first().and_then(|v| v.as_str()).unwrap_or("").to_owned();
            if name == "# Partition Information" {
                in_section = true;
            } else if in_section {
                if name.is_empty() || (name.starts_with('#') && name != "# col_name") {
                    break;
                }
                if !name.starts_with('#') {
                    out.push(name);
                }
            }
        }
        Ok(out)
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
            capability: "transactions (runs on Spark replace whole partitions, one statement each, under a lease; this command needs a transaction)".into(),
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
            // The bits of the absolute value (fixpoint_core::fingerprint::write_float),
            // computed with exact arithmetic: Java's %.16e pads the shortest
            // decimal with zeros where C's prints the exact value's digits.
            let x = format!("CAST({expr} AS DOUBLE)");
            let inf = "CAST('Infinity' AS DOUBLE)";
            let a = format!("(CASE WHEN isnan({x}) OR abs({x}) = {inf} OR {x} = 0 THEN 1.0D ELSE abs({x}) END)");
            ("float", format!(
                "CASE WHEN {x} IS NULL THEN NULL WHEN isnan({x}) THEN 'nan' WHEN {x} = {inf} THEN 'inf' WHEN {x} = -{inf} THEN '-inf' WHEN {x} = 0 THEN '0' \
                 ELSE concat(CASE WHEN {x} < 0 THEN '-' ELSE '' END, CAST({} AS STRING)) END",
                fixpoint_core::fingerprint::float_bits_sql(&a)
            ))
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

    fn transactional(&self) -> bool {
        false
    }

    /// Spark has no information_schema in its session catalog, and its
    /// column defaults must be constants (no sequences, no uuid()): no
    /// generated keys to find.
    fn column_defaults(&mut self, _table: &TableName) -> Result<Vec<(String, String)>> {
        Ok(Vec::new())
    }

    /// A lease is a view `fixpoint.lease__<hash>`: creating a view that
    /// exists fails in the metastore, atomically, so exactly one run
    /// creates it. Its properties hold the owner's token and an expiry,
    /// after which a dead run's lease is broken.
    fn acquire_lease(&mut self, scope: &str, wait: bool) -> Result<std::result::Result<(), String>> {
        let view = Self::lease_view(scope);
        let owner = uuid::Uuid::new_v4().to_string();
        let mut waited = false;
        loop {
            let expires = now_ms() + lease_seconds() * 1000;
            let create = format!(
                "CREATE VIEW {} TBLPROPERTIES ('fixpoint.owner' = {}, 'fixpoint.expires_ms' = {}) AS SELECT 1 AS held",
                view.quoted(),
                lit(&owner),
                lit(&expires.to_string())
            );
            match self.client.execute(&create, &[]) {
                Ok(()) => {
                    if waited {
                        eprintln!("fixpoint: got the lease on {scope}");
                    }
                    self.leases.insert(scope.to_owned(), (view, owner));
                    return Ok(Ok(()));
                }
                Err(e) if e.error_class.as_deref().is_some_and(|c| c.contains("ALREADY_EXISTS")) => {}
                Err(e) if e.error_class.as_deref() == Some("SCHEMA_NOT_FOUND") => {
                    // The first run on this cluster: the lease's database.
                    self.client
                        .execute(&format!("CREATE DATABASE IF NOT EXISTS {}", quote_ident(fixpoint_core::ledger::SCHEMA)), &[])
                        .map_err(err("creating the fixpoint database"))?;
                    continue;
                }
                Err(e) => return Err(err("taking a lease")(e)),
            }
            let Some((holder, until)) = self.lease_holder(&view)? else { continue };
            let now = now_ms();
            if until <= now {
                // Its run died without releasing it: break it, unless it
                // was renewed meanwhile.
                if self.lease_holder(&view)?.is_some_and(|(h, _)| h == holder) {
                    eprintln!("fixpoint: breaking the expired lease on {scope} (held by run {holder})");
                    self.client.execute(&format!("DROP VIEW IF EXISTS {}", view.quoted()), &[]).map_err(err("breaking an expired lease"))?;
                }
                continue;
            }
            let desc = format!("run {holder}, for up to {} s more (lease {})", (until - now) / 1000, view);
            if !wait {
                return Ok(Err(desc));
            }
            if !waited {
                eprintln!("fixpoint: waiting for another run holding the lease on {scope}: {desc}");
                waited = true;
            }
            std::thread::sleep(Duration::from_millis(500));
        }
    }

    fn release_lease(&mut self, scope: &str) -> Result<()> {
        let Some((view, owner)) = self.leases.remove(scope) else { return Ok(()) };
        match self.lease_holder(&view)? {
            Some((holder, _)) if holder == owner => {
                self.client.execute(&format!("DROP VIEW IF EXISTS {}", view.quoted()), &[]).map_err(err("releasing a lease"))
            }
            // Broken by another run after it expired: not ours any more.
            _ => Ok(()),
        }
    }

    /// A cached temporary view, materialized at once (`CACHE TABLE … AS`).
    fn stage(&mut self, name: &str, query: &Sql) -> Result<()> {
        self.unstage(name)?;
        let text = format!("CACHE TABLE {name} AS {}", query.text);
        self.client.execute(&text, &query.params).map_err(err(&text))
    }

    fn unstage(&mut self, name: &str) -> Result<()> {
        // Dropping a cached temporary view uncaches it.
        let stmt = format!("DROP VIEW IF EXISTS {name}");
        self.client.execute(&stmt, &[]).map_err(err(&stmt))
    }

    fn create_table(&mut self, table: &TableName, columns: &[Column], partition: Option<&str>) -> Result<()> {
        let cols: Vec<String> = columns.iter().map(|c| format!("{} {}", quote_ident(&c.name), c.ty)).collect();
        let mut stmt = format!("CREATE TABLE {} ({}) USING parquet", table.quoted(), cols.join(", "));
        if let Some(p) = partition {
            stmt.push_str(&format!(" PARTITIONED BY ({})", quote_ident(p)));
        }
        self.client.execute(&stmt, &[]).map_err(err(&stmt))
    }

    fn add_column(&mut self, table: &TableName, column: &Column) -> Result<()> {
        if self.table_columns(table)?.is_some_and(|cols| cols.iter().any(|c| c.name == column.name)) {
            return Ok(());
        }
        let stmt = format!("ALTER TABLE {} ADD COLUMNS ({} {})", table.quoted(), quote_ident(&column.name), column.ty);
        self.client.execute(&stmt, &[]).map_err(err(&stmt))
    }

    fn partition_columns(&mut self, table: &TableName) -> Result<Vec<String>> {
        self.described_partitions(table)
    }

    fn overwrite_partitions(&mut self, table: &TableName, columns: &[String], select: &Sql) -> Result<()> {
        let cols: Vec<String> = columns.iter().map(|c| quote_ident(c)).collect();
        let text = format!("INSERT OVERWRITE TABLE {} ({}) {}", table.quoted(), cols.join(", "), select.text);
        self.client.execute(&text, &select.params).map_err(err(&text))
    }

    fn drop_partition_value(&mut self, table: &TableName, column: &str, value: &Value, _ty: &str) -> Result<()> {
        let text = format!("ALTER TABLE {} DROP IF EXISTS PARTITION ({} = $1)", table.quoted(), quote_ident(column));
        self.client.execute(&text, std::slice::from_ref(value)).map_err(err(&text))
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
