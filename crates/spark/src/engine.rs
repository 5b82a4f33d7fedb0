//! [`Engine`] over Spark Connect.

use std::time::Duration;

use arrow_array::cast::AsArray;
use arrow_array::types::*;
use arrow_array::{Array, RecordBatch};
use arrow_schema::{DataType, TimeUnit};
use fixpoint_core::engine::{Column, Dialect, Engine, Leases, Observed, ObservedWrites, Rows};
use fixpoint_core::job::ident::{quote_ident, TableName};
use fixpoint_core::job::sql::{Sql, Value};
use fixpoint_core::{DbFailure, Error, Result};

use crate::client::{Client, SparkError};
use crate::lease::{self, Held, Renewer};

/// A Spark session on a Spark Connect server.
pub struct Spark {
    client: Client,
    url: String,
    /// How long the server may take to answer a connection.
    connect_timeout: Duration,
    /// The leases this session holds: scope -> lease (see the `lease` module).
    leases: std::collections::HashMap<String, Held>,
    /// How long a lease lasts unless renewed.
    lease: Duration,
    /// How long to wait for another run's lease (`--wait`).
    wait: Duration,
    /// Renews the leases held, once the first is taken.
    renewer: Option<Renewer>,
    /// The tables behind the relations [`Leases::stage_copy`] made: name -> table.
    copies: std::collections::HashMap<String, TableName>,
    /// Whether writes observe their rows ([`ObservedWrites`]); a test
    /// switch turns it off to run the plans that scan instead.
    observe: bool,
}

/// How long a lease lasts unless its run renews it: a run that dies keeps
/// its lease this long (`FIXPOINT_SPARK_LEASE_SECONDS`, default 600).
fn lease_from_env() -> Result<Duration> {
    match std::env::var("FIXPOINT_SPARK_LEASE_SECONDS") {
        Err(_) => Ok(Duration::from_secs(600)),
        Ok(s) => match s.trim().parse::<u64>() {
            Ok(n) if n >= 1 => Ok(Duration::from_secs(n)),
            _ => Err(Error::argument(
                format!("FIXPOINT_SPARK_LEASE_SECONDS={s:?} is not a whole number of seconds of at least 1"),
                Some("set it to how long a dead run's lease should keep other runs out, e.g. 600, or unset it"),
            )),
        },
    }
}

/// A Spark error as fixpoint's, its kind read from the error class and
/// SQLSTATE the server sends with it.
pub(crate) fn database_error(context: String, e: SparkError) -> Error {
    // Where the server sent no structured class or state, the message
    // carries them: `[CLASS.SUBCLASS] … SQLSTATE: 42703`.
    let class = e.error_class.clone().or_else(|| e.message.strip_prefix('[').and_then(|m| m.split_once(']')).map(|(c, _)| c.to_owned()));
    let state = e.sql_state.clone().or_else(|| e.message.split_once("SQLSTATE: ").map(|(_, s)| s.chars().take(5).collect()));
    let binding = matches!(
        class.as_deref().map(|c| c.split('.').next().unwrap_or(c)),
        Some("UNRESOLVED_COLUMN" | "UNRESOLVED_ROUTINE" | "TABLE_OR_VIEW_NOT_FOUND" | "PARSE_SYNTAX_ERROR" | "DATATYPE_MISMATCH" | "AMBIGUOUS_REFERENCE")
    );
    let statement = state.as_deref().is_some_and(|s| s.starts_with("42") || s.starts_with("22"));
    let failure = if binding {
        DbFailure::Binding
    } else if statement {
        DbFailure::Statement
    } else {
        DbFailure::Other
    };
    Error::Database { engine: "spark", context, message: e.to_string(), failure }
}

fn err(context: &str) -> impl FnOnce(SparkError) -> Error + '_ {
    move |e| database_error(context.to_owned(), e)
}

impl Spark {
    /// Connects to `sc://host:port`.
    pub fn connect(url: &str, timeout: Duration) -> Result<Spark> {
        let client = Client::connect(url, timeout).map_err(|e| database_error(format!("connecting to {url}"), e))?;
        let mut spark = Spark {
            client,
            url: url.to_owned(),
            connect_timeout: timeout,
            leases: Default::default(),
            lease: lease_from_env()?,
            wait: Duration::from_secs(60),
            renewer: None,
            copies: Default::default(),
            observe: true,
        };
        set_up(&mut spark.client).map_err(err("setting up the session"))?;
        Ok(spark)
    }

    /// Without observed writes: the plans scan the source before a write
    /// and the written rows after it (a test switch, to run every plan).
    pub fn without_observed_writes(mut self) -> Spark {
        self.observe = false;
        self
    }

    /// The server's URL.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// How long a run waits for another run's lease (the CLI's `--wait`;
    /// default 60 s); `--no-wait` does not wait at all.
    pub fn with_wait(mut self, wait: Duration) -> Spark {
        self.wait = wait;
        self
    }

    /// How long a lease lasts unless renewed (default
    /// `FIXPOINT_SPARK_LEASE_SECONDS`, else 600 s): how long a run that died
    /// keeps others out. Renewed every third of it while the run lives.
    pub fn with_lease(mut self, lease: Duration) -> Spark {
        self.lease = lease;
        self
    }

    /// Checks that this session still holds each lease it took: right
    /// before a write (`before`), with a third of the lease ahead, so a run
    /// that lost its lease stops having written nothing; right after one,
    /// so a write that raced a take-over is reported, not recorded.
    fn check_leases(&mut self, before: bool) -> Result<()> {
        let margin = if before { self.lease / 3 } else { Duration::ZERO };
        let held: Vec<(String, Held)> = self.leases.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
        for (scope, h) in held {
            if let Err(why) = lease::check(&mut self.client, &h, margin)? {
                let scope = scope.strip_prefix("fixpoint:").unwrap_or(&scope);
                return Err(Error::Busy {
                    message: if before {
                        format!("this run lost its lease on {scope}: {why}; this run wrote nothing to the target's rows (was its process paused for longer than the lease, {} s?); run it again", self.lease.as_secs())
                    } else {
                        format!("this run lost its lease on {scope} while it wrote: {why}; the day may hold this run's write over the other run's, and no ledger row was written; run the job again for this date to rewrite and record it")
                    },
                });
            }
        }
        Ok(())
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

    /// A view (the metastore's `Type` of the relation), or `None`.
    fn relation_kind(&mut self, table: &TableName) -> Result<Option<String>> {
        let rows = match self.client.query(&format!("DESCRIBE TABLE EXTENDED {}", table.quoted()), &[]) {
            Ok(b) => to_rows(&b)?,
            Err(e) if e.error_class.as_deref() == Some("TABLE_OR_VIEW_NOT_FOUND") => return Ok(None),
            Err(e) => return Err(err("describing a table")(e)),
        };
        let view = rows.rows.iter().any(|r| {
            r.first().and_then(|v| v.as_str()) == Some("Type") && r.get(1).and_then(|v| v.as_str()).is_some_and(|t| t.eq_ignore_ascii_case("VIEW"))
        });
        Ok(view.then(|| "a view".to_owned()))
    }

    /// Spark has no information_schema in its session catalog, and its
    /// column defaults must be constants (no sequences, no uuid()): no
    /// generated keys to find.
    fn column_defaults(&mut self, _table: &TableName) -> Result<Vec<(String, String)>> {
        Ok(Vec::new())
    }

    fn add_column(&mut self, table: &TableName, column: &Column) -> Result<()> {
        if self.table_columns(table)?.is_some_and(|cols| cols.iter().any(|c| c.name == column.name)) {
            return Ok(());
        }
        self.check_leases(true)?;
        let stmt = format!("ALTER TABLE {} ADD COLUMNS ({} {})", table.quoted(), quote_ident(&column.name), column.ty);
        self.client.execute(&stmt, &[]).map_err(err(&stmt))
    }

    fn dialect(&self) -> &dyn Dialect {
        self
    }

    fn leases(&mut self) -> Option<&mut dyn Leases> {
        Some(self)
    }
}

impl Dialect for Spark {
    fn materialized(&self) -> &'static str {
        ""
    }

    /// A parquet table's rows live in files: no row id.
    fn row_id(&self) -> Option<(&'static str, &'static str, bool)> {
        None
    }

    fn native_row_hash(&self, alias: &str, columns: &[Column]) -> Option<String> {
        Some(row_hash(columns.iter().map(|c| format!("{alias}.{}", quote_ident(&c.name)))))
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

    fn read_sum(&self, v: &Value) -> Result<i128> {
        match v {
            Value::Null => Ok(0),
            Value::Text(s) => s.parse::<i128>().map_err(|_| Error::Internal(format!("spark: a checksum sum came back as {s:?}"))),
            other => other.as_i128().ok_or_else(|| Error::Internal(format!("spark: a checksum sum came back as {other:?}"))),
        }
    }
}

impl Leases for Spark {
    /// A lease is a generation of views `fixpoint.lease__<hash>__g<n>`,
    /// taken in one atomic step, renewed while the run lives, checked
    /// before every write (see the `lease` module).
    fn acquire_lease(&mut self, scope: &str, wait: bool) -> Result<std::result::Result<(), String>> {
        let wait = wait.then_some(self.wait);
        match lease::acquire(&mut self.client, scope, self.lease, wait)? {
            Ok(held) => {
                let renewer = self.renewer.get_or_insert_with(|| Renewer::start(&self.url, self.connect_timeout, self.lease));
                renewer.hold(&held);
                self.leases.insert(scope.to_owned(), held);
                Ok(Ok(()))
            }
            Err(holder) => Ok(Err(holder)),
        }
    }

    fn release_lease(&mut self, scope: &str) -> Result<()> {
        let Some(held) = self.leases.remove(scope) else { return Ok(()) };
        let stopped = self.renewer.as_ref().is_none_or(|r| r.stop_renewing(&held.prefix, self.connect_timeout + Duration::from_secs(5)));
        if !stopped {
            return Err(Error::Internal(format!("the renewal of lease {} did not stop in time; it is left to expire", held.view())));
        }
        lease::release(&mut self.client, &held)
    }

    /// `REFRESH TABLE`: the session's cached file listing of the table is
    /// dropped, so rows another session wrote since are read.
    fn refresh(&mut self, table: &TableName) -> Result<()> {
        match self.client.execute(&format!("REFRESH TABLE {}", table.quoted()), &[]) {
            Ok(()) => Ok(()),
            Err(e) if matches!(e.error_class.as_deref(), Some("TABLE_OR_VIEW_NOT_FOUND" | "SCHEMA_NOT_FOUND")) => Ok(()),
            Err(e) => Err(err("refreshing a table's listing")(e)),
        }
    }

    /// A cached temporary view, materialized at once (`CACHE TABLE … AS`).
    fn stage(&mut self, name: &str, query: &Sql) -> Result<()> {
        self.unstage(name)?;
        let text = format!("CACHE TABLE {name} AS {}", query.text);
        self.client.execute(&text, &query.params).map_err(err(&text))
    }

    /// A cached temporary view, materialized by the first query that reads
    /// it (`CACHE LAZY TABLE … AS`): one Spark job fewer than [`Spark::stage`].
    fn stage_on_read(&mut self, name: &str, query: &Sql) -> Result<()> {
        self.unstage(name)?;
        let text = format!("CACHE LAZY TABLE {name} AS {}", query.text);
        self.client.execute(&text, &query.params).map_err(err(&text))
    }

    fn unstage(&mut self, name: &str) -> Result<()> {
        // Dropping a cached temporary view uncaches it.
        let stmt = format!("DROP VIEW IF EXISTS {name}");
        self.client.execute(&stmt, &[]).map_err(err(&stmt))?;
        if let Some(table) = self.copies.remove(name) {
            let stmt = format!("DROP TABLE IF EXISTS {}", table.quoted());
            self.client.execute(&stmt, &[]).map_err(err(&stmt))?;
        }
        Ok(())
    }

    /// A table of its own in the ledger's schema (named after this session,
    /// so concurrent runs never share one), written once, behind a
    /// temporary view `name`: a cached view would be computed again from
    /// the new rows once a table it read is overwritten. A run killed
    /// before it drops them leaves `fixpoint.stage__…` tables, which no run
    /// reads again.
    fn stage_copy(&mut self, name: &str, query: &Sql) -> Result<()> {
        self.unstage(name)?;
        let bare: String = name.chars().filter(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
        let session: String = self.client.session_id().chars().filter(char::is_ascii_hexdigit).take(12).collect();
        let table = TableName { schema: fixpoint_core::run::ledger::SCHEMA.into(), table: format!("stage__{session}__{}", bare.trim_start_matches('_')) };
        let text = format!("CREATE TABLE {} USING parquet AS {}", table.quoted(), query.text);
        self.client.execute(&text, &query.params).map_err(err(&text))?;
        self.copies.insert(name.to_owned(), table.clone());
        let view = format!("CREATE TEMPORARY VIEW {name} AS SELECT * FROM {}", table.quoted());
        self.client.execute(&view, &[]).map_err(err(&view))
    }

    /// The partitions holding a dropped row or taking a new one, written
    /// over in one `INSERT OVERWRITE` with their rows as they will be
    /// (copied first: the statement must not read the table it writes);
    /// those left without rows dropped after. Only a table partitioned by
    /// one column.
    fn replace_rows(&mut self, table: &TableName, columns: &[String], dropped: &Sql, select: &Sql) -> Result<()> {
        const REPLACED: &str = "\"__fixpoint_replaced\"";
        let parts = self.described_partitions(table)?;
        let [p] = parts.as_slice() else {
            return Err(Error::Schema {
                message: format!("{table} is partitioned by {} column(s): on spark rows are replaced partition by partition, in a table partitioned by one column", parts.len()),
                hint: Some(format!("recreate {table} with PARTITIONED BY (<one column>)")),
            });
        };
        let pc = quote_ident(p);
        let cols = columns.iter().map(|c| quote_ident(c)).collect::<Vec<_>>().join(", ");
        let mut touched = Sql::new();
        touched.push(&format!("SELECT DISTINCT t.{pc} FROM {} AS t WHERE ", table.quoted()));
        touched.append(dropped);
        touched.push(&format!(" UNION SELECT s.{pc} FROM ("));
        touched.append(select);
        touched.push(") AS s");
        let values: Vec<Value> = self.query(&touched)?.rows.into_iter().map(|mut r| r.remove(0)).collect();
        if values.is_empty() {
            return Ok(());
        }
        let mut rows = Sql::new();
        rows.push(&format!("SELECT {cols} FROM {} AS t WHERE (false", table.quoted()));
        let known: Vec<&Value> = values.iter().filter(|v| !matches!(v, Value::Null)).collect();
        if !known.is_empty() {
            rows.push(&format!(" OR t.{pc} IN ("));
            for (i, v) in known.iter().enumerate() {
                if i > 0 {
                    rows.push(", ");
                }
                rows.param((*v).clone());
            }
            rows.push(")");
        }
        if known.len() < values.len() {
            rows.push(&format!(" OR t.{pc} IS NULL"));
        }
        rows.push(") AND NOT coalesce((");
        rows.append(dropped);
        rows.push(&format!("), false) UNION ALL SELECT {cols} FROM ("));
        rows.append(select);
        rows.push(") AS s");
        let result = (|| {
            self.stage_copy(REPLACED, &rows)?;
            let left: Vec<Value> = self.query(&Sql::raw(format!("SELECT DISTINCT {pc} FROM {REPLACED}")))?.rows.into_iter().map(|mut r| r.remove(0)).collect();
            if known.len() < values.len() && !left.contains(&Value::Null) {
                // An overwrite leaves a partition it has no rows for alone,
                // and the NULL partition cannot be dropped by value.
                return Err(Error::Schema {
                    message: format!("this run would leave {table}'s partition of NULL {p} without rows, which spark cannot drop by value; nothing was changed"),
                    hint: Some(format!("partition {table} by a column that is never NULL, such as a column of the key")),
                });
            }
            self.overwrite_partitions(table, columns, &Sql::raw(format!("SELECT {cols} FROM {REPLACED}")))?;
            for v in known.iter().filter(|v| !left.contains(**v)) {
                self.drop_partition_value(table, p, v, "")?;
            }
            Ok(())
        })();
        let dropped_copy = self.unstage(REPLACED);
        result.and(dropped_copy)
    }

    fn create_table(&mut self, table: &TableName, columns: &[Column], partition: Option<&str>) -> Result<()> {
        let cols: Vec<String> = columns.iter().map(|c| format!("{} {}", quote_ident(&c.name), c.ty)).collect();
        self.check_leases(true)?;
        let mut stmt = format!("CREATE TABLE {} ({}) USING parquet", table.quoted(), cols.join(", "));
        if let Some(p) = partition {
            stmt.push_str(&format!(" PARTITIONED BY ({})", quote_ident(p)));
        }
        self.client.execute(&stmt, &[]).map_err(err(&stmt))
    }

    fn partition_columns(&mut self, table: &TableName) -> Result<Vec<String>> {
        self.described_partitions(table)
    }

    fn overwrite_partitions(&mut self, table: &TableName, columns: &[String], select: &Sql) -> Result<()> {
        let cols: Vec<String> = columns.iter().map(|c| quote_ident(c)).collect();
        let text = format!("INSERT OVERWRITE TABLE {} ({}) {}", table.quoted(), cols.join(", "), select.text);
        self.check_leases(true)?;
        self.client.execute(&text, &select.params).map_err(err(&text))?;
        self.check_leases(false)
    }

    fn observed_writes(&mut self) -> Option<&mut dyn ObservedWrites> {
        if self.observe {
            Some(self)
        } else {
            None
        }
    }

    fn drop_partition_value(&mut self, table: &TableName, column: &str, value: &Value, _ty: &str) -> Result<()> {
        let text = format!("ALTER TABLE {} DROP IF EXISTS PARTITION ({} = $1)", table.quoted(), quote_ident(column));
        self.check_leases(true)?;
        self.client.execute(&text, std::slice::from_ref(value)).map_err(err(&text))?;
        self.check_leases(false)
    }
}

/// The native row hash of the values `exprs`. Spark's xxhash64 skips NULL
/// arguments, so (NULL, 'a') would hash as ('a', NULL): each value is
/// followed by its NULL flag. As a DECIMAL, so the sum never overflows
/// (ANSI mode fails on it).
fn row_hash(exprs: impl Iterator<Item = String>) -> String {
    let args: Vec<String> = exprs.flat_map(|e| [e.clone(), format!("isnull({e})")]).collect();
    format!("CAST(xxhash64({}) AS DECIMAL(20, 0))", args.join(", "))
}

impl ObservedWrites for Spark {
    /// `insertInto` with overwrite (dynamic partition overwrite, as
    /// [`Leases::overwrite_partitions`]) over a `CollectMetrics` of the
    /// rows, under the same lease checks.
    fn overwrite_observed(&mut self, table: &TableName, select: &Sql, input: &[Column], output: &[Column]) -> Result<Observed> {
        let sum = |cols: &[Column], cast: bool| match cols.is_empty() {
            true => "CAST(0 AS DECIMAL(20, 0))".to_owned(),
            false => format!(
                "sum({})",
                row_hash(cols.iter().map(|c| match cast {
                    true => format!("CAST({} AS {})", quote_ident(&c.name), c.ty),
                    false => quote_ident(&c.name),
                }))
            ),
        };
        // The same columns with the same types hash alike before and after
        // the cast: one sum for both.
        let same = input == output;
        let mut metrics = vec![("rows".to_owned(), "count(*)".to_owned()), ("input_sum".to_owned(), sum(input, false))];
        if !same {
            metrics.push(("output_sum".to_owned(), sum(output, true)));
        }
        let name = format!("{}.{}", backquoted(&table.schema), backquoted(&table.table));
        self.check_leases(true)?;
        let got = self.client.overwrite_observed(&name, &select.text, &select.params, &metrics).map_err(|e| database_error(format!("overwriting {table}'s partitions: {}", select.text), e))?;
        self.check_leases(false)?;
        let value = |k: &str| {
            got.iter().find(|(n, _)| n == k).map(|(_, v)| v).ok_or_else(|| Error::Internal(format!("spark: the write into {table} observed no {k}")))
        };
        let rows = match value("rows")? {
            Value::Int(n) if *n >= 0 => *n as u64,
            other => return Err(Error::Internal(format!("spark: the write into {table} observed {other:?} rows"))),
        };
        let input_sum = self.read_sum(value("input_sum")?)?;
        let output_sum = if same { input_sum } else { self.read_sum(value("output_sum")?)? };
        Ok(Observed { rows, input_sum, output_sum })
    }
}

/// A name part between backquotes (Spark's own identifier quotes), which
/// every parser of table names reads.
fn backquoted(part: &str) -> String {
    format!("`{}`", part.replace('`', "``"))
}

/// The settings every fixpoint session runs with. fixpoint's SQL quotes
/// identifiers the standard way ("name"), which Spark reads as identifiers
/// only with doubleQuotedIdentifiers (and ANSI mode). An INSERT OVERWRITE
/// replaces only the partitions its rows fall in, written aside and
/// swapped in when the job commits (static mode would delete first, and
/// wipe a whole table).
pub(crate) fn set_up(client: &mut Client) -> std::result::Result<(), SparkError> {
    for setting in [
        "SET spark.sql.ansi.enabled = true",
        "SET spark.sql.ansi.doubleQuotedIdentifiers = true",
        "SET spark.sql.sources.partitionOverwriteMode = dynamic",
    ] {
        client.execute(setting, &[])?;
    }
    Ok(())
}

/// Arrow batches as fixpoint rows.
pub(crate) fn to_rows(batches: &[RecordBatch]) -> Result<Rows> {
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
