//! A thin, blocking Spark Connect client: SQL with bound parameters in,
//! Arrow batches out, Spark's error class and SQLSTATE kept.
//!
//! Over `apache-spark-connect-proto` (Apache's generated gRPC types) and
//! tonic, on a single-threaded tokio runtime owned by the client, so callers
//! stay synchronous like the other engines. Every value is sent as a
//! positional parameter (`?` in the SQL text, a literal expression in the
//! plan): nothing a user wrote is spliced into SQL.

use std::time::Duration;

use arrow_array::RecordBatch;
use fixpoint_core::job::sql::Value;
use spark_connect_proto as pb;
use spark_connect_proto::spark_connect_service_client::SparkConnectServiceClient;
use tonic::transport::Channel;

/// A Spark error as the server reported it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SparkError {
    /// Spark's error class (`TABLE_OR_VIEW_NOT_FOUND`), when given.
    pub error_class: Option<String>,
    /// The SQLSTATE (`42P01`), when given.
    pub sql_state: Option<String>,
    /// The message, first line first.
    pub message: String,
}

impl std::fmt::Display for SparkError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)?;
        if let (Some(c), false) = (&self.error_class, self.message.contains('[')) {
            write!(f, " [{c}]")?;
        }
        if let (Some(s), false) = (&self.sql_state, self.message.contains("SQLSTATE")) {
            write!(f, " (SQLSTATE {s})")?;
        }
        Ok(())
    }
}

impl SparkError {
    fn from_status(status: tonic::Status) -> SparkError {
        use tonic_types::StatusExt;
        let details = status.get_error_details();
        let info = details.error_info();
        let meta = |k: &str| info.and_then(|i| i.metadata.get(k).cloned()).filter(|v| !v.is_empty());
        SparkError { error_class: meta("errorClass"), sql_state: meta("sqlState"), message: without_plan(status.message()).to_owned() }
    }

    fn local(message: impl Into<String>) -> SparkError {
        SparkError { error_class: None, sql_state: None, message: message.into() }
    }
}

/// An analysis error's message without the logical plan Spark appends
/// after its SQLSTATE and position (`…SQLSTATE: 42P01; line 1 pos 53;` then
/// the plan, line by line): the plan names Spark's internal column ids and
/// tells the user nothing the first lines do not.
fn without_plan(message: &str) -> &str {
    let message = message.trim();
    match message.find("SQLSTATE: ").and_then(|s| message[s..].find(";\n").map(|e| s + e)) {
        Some(cut) => &message[..cut],
        None => message,
    }
}

#[cfg(test)]
mod plan_tests {
    #[test]
    fn the_plan_is_left_out() {
        let m = "[TABLE_OR_VIEW_NOT_FOUND] The table `b`.`x` cannot be found.\nSearch path: [a].\nSQLSTATE: 42P01; line 1 pos 53;\n'Project ['a]\n+- 'Filter (x)";
        assert_eq!(super::without_plan(m), "[TABLE_OR_VIEW_NOT_FOUND] The table `b`.`x` cannot be found.\nSearch path: [a].\nSQLSTATE: 42P01; line 1 pos 53");
        assert_eq!(super::without_plan("[X] no plan. SQLSTATE: 22012"), "[X] no plan. SQLSTATE: 22012");
        assert_eq!(super::without_plan("plain"), "plain");
    }
}

/// A connection to a Spark Connect server (one Spark session).
pub struct Client {
    runtime: tokio::runtime::Runtime,
    service: SparkConnectServiceClient<Channel>,
    session_id: String,
    /// Writes observed so far: each observation's name is its own.
    observations: u64,
    /// The last statement, when it was a `DESCRIBE TABLE`, with its
    /// answer: the same statement right after it (a plan reads a table's
    /// columns, then its partitioning) is answered from here. Any other
    /// statement of the session clears it.
    last_describe: Option<(String, Vec<RecordBatch>)>,
}

/// Where to connect: `sc://host:port` (the Spark Connect URL; `/;param=…`
/// options are not supported yet).
pub fn endpoint(url: &str) -> Result<String, SparkError> {
    let rest = url.strip_prefix("sc://").ok_or_else(|| SparkError::local(format!("not a Spark Connect URL (sc://host:port): {url}")))?;
    let hostport = rest.split(['/', ';']).next().unwrap_or("");
    if hostport.is_empty() {
        return Err(SparkError::local(format!("no host in {url}")));
    }
    let hostport = if hostport.contains(':') { hostport.to_owned() } else { format!("{hostport}:15002") };
    Ok(format!("http://{hostport}"))
}

impl Client {
    /// Connects, waiting at most `timeout` for the server to answer.
    pub fn connect(url: &str, timeout: Duration) -> Result<Client, SparkError> {
        let endpoint = endpoint(url)?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| SparkError::local(format!("starting the client runtime: {e}")))?;
        let channel = runtime
            .block_on(async {
                tonic::transport::Endpoint::from_shared(endpoint.clone())
                    .map_err(|e| e.to_string())?
                    .connect_timeout(timeout)
                    .connect()
                    .await
                    .map_err(|e| format!("{e}: {}", std::error::Error::source(&e).map(|s| s.to_string()).unwrap_or_default()))
            })
            .map_err(|e| SparkError::local(format!("cannot connect to Spark Connect at {url}: {e}")))?;
        let service = SparkConnectServiceClient::new(channel).max_decoding_message_size(256 << 20);
        Ok(Client { runtime, service, session_id: uuid::Uuid::new_v4().to_string(), observations: 0, last_describe: None })
    }

    /// This session's id (a UUID).
    pub fn session_id(&self) -> &str {
        &self.session_id
    }

    fn user() -> Option<pb::UserContext> {
        Some(pb::UserContext { user_id: "fixpoint".into(), user_name: "fixpoint".into(), extensions: Vec::new() })
    }

    fn sql_relation(query: &str, params: &[Value]) -> pb::Relation {
        let (query, names) = named_markers(query);
        pb::Relation {
            common: None,
            rel_type: Some(pb::relation::RelType::Sql(pb::Sql {
                query,
                named_arguments: names
                    .into_iter()
                    .filter_map(|(name, n)| params.get(n.checked_sub(1)?).map(|v| (name, literal(v))))
                    .collect(),
                ..Default::default()
            })),
        }
    }

    fn run(&mut self, plan: pb::Plan) -> Result<Vec<RecordBatch>, SparkError> {
        self.run_observing(plan).map(|(batches, _)| batches)
    }

    /// [`Client::run`], with the metrics the server observed.
    fn run_observing(&mut self, plan: pb::Plan) -> Result<(Vec<RecordBatch>, Vec<pb::execute_plan_response::ObservedMetrics>), SparkError> {
        self.last_describe = None;
        let request = pb::ExecutePlanRequest {
            session_id: self.session_id.clone(),
            user_context: Self::user(),
            plan: Some(plan),
            client_type: Some("fixpoint".into()),
            ..Default::default()
        };
        let service = &mut self.service;
        self.runtime.block_on(async {
            let mut stream = service.execute_plan(request).await.map_err(SparkError::from_status)?.into_inner();
            let mut batches = Vec::new();
            let mut observed = Vec::new();
            while let Some(response) = stream.message().await.map_err(SparkError::from_status)? {
                observed.extend(response.observed_metrics);
                if let Some(pb::execute_plan_response::ResponseType::ArrowBatch(b)) = response.response_type {
                    let reader = arrow_ipc::reader::StreamReader::try_new(std::io::Cursor::new(b.data.to_vec()), None)
                        .map_err(|e| SparkError::local(format!("reading an Arrow batch: {e}")))?;
                    for batch in reader {
                        batches.push(batch.map_err(|e| SparkError::local(format!("reading an Arrow batch: {e}")))?);
                    }
                }
            }
            Ok((batches, observed))
        })
    }

    /// Writes the rows of `query` into `table` by position over the
    /// partitions they fall in (`insertInto` with overwrite: with dynamic
    /// partition overwrite, partitions without rows are left alone), and
    /// observes `metrics` (`(name, SQL aggregate)`, over the query's
    /// columns) on the rows as the write job reads them: their values by
    /// name, from the same job (a `CollectMetrics` relation under the
    /// write; the server sends what it observed after the command).
    pub fn overwrite_observed(&mut self, table: &str, query: &str, params: &[Value], metrics: &[(String, String)]) -> Result<Vec<(String, Value)>, SparkError> {
        self.observations += 1;
        let name = format!("fixpoint_write_{}", self.observations);
        let observed = pb::Relation {
            common: Some(pb::RelationCommon { plan_id: Some(1), ..Default::default() }),
            rel_type: Some(pb::relation::RelType::CollectMetrics(Box::new(pb::CollectMetrics {
                input: Some(Box::new(Self::sql_relation(query, params))),
                name: name.clone(),
                metrics: metrics
                    .iter()
                    .map(|(alias, expr)| pb::Expression {
                        common: None,
                        expr_type: Some(pb::expression::ExprType::Alias(Box::new(pb::expression::Alias {
                            expr: Some(Box::new(pb::Expression {
                                common: None,
                                expr_type: Some(pb::expression::ExprType::ExpressionString(pb::expression::ExpressionString { expression: named_markers(expr).0 })),
                            })),
                            name: vec![alias.clone()],
                            metadata: None,
                        }))),
                    })
                    .collect(),
            }))),
        };
        let write = pb::WriteOperation {
            input: Some(observed),
            save_type: Some(pb::write_operation::SaveType::Table(pb::write_operation::SaveTable {
                table_name: table.to_owned(),
                save_method: pb::write_operation::save_table::TableSaveMethod::InsertInto as i32,
            })),
            mode: pb::write_operation::SaveMode::Overwrite as i32,
            ..Default::default()
        };
        let plan = pb::Plan { op_type: Some(pb::plan::OpType::Command(pb::Command { command_type: Some(pb::command::CommandType::WriteOperation(write)) })) };
        let started = std::time::Instant::now();
        let result = self.run_observing(plan);
        fixpoint_core::run::protocol::trace_statement(started, &format!("write (observed) into {table}: {query}"));
        let (_, observed) = result?;
        let Some(m) = observed.into_iter().find(|m| m.name == name) else {
            return Err(SparkError::local(format!("the server sent no metrics {name} for the write into {table}")));
        };
        if m.keys.len() != m.values.len() {
            return Err(SparkError::local(format!("the server sent {} names for {} values of metrics {name}", m.keys.len(), m.values.len())));
        }
        m.keys.into_iter().zip(m.values).map(|(k, v)| Ok((k, literal_value(&v)?))).collect()
    }

    /// Runs a query and returns its rows as Arrow batches.
    pub fn query(&mut self, query: &str, params: &[Value]) -> Result<Vec<RecordBatch>, SparkError> {
        let describe = params.is_empty() && query.starts_with("DESCRIBE TABLE ") && !query.starts_with("DESCRIBE TABLE EXTENDED ");
        if let Some((_, batches)) = self.last_describe.as_ref().filter(|(q, _)| describe && q == query) {
            return Ok(batches.clone());
        }
        let started = std::time::Instant::now();
        let result = self.run(pb::Plan { op_type: Some(pb::plan::OpType::Root(Self::sql_relation(query, params))) });
        fixpoint_core::run::protocol::trace_statement(started, query);
        if let (true, Ok(batches)) = (describe, &result) {
            self.last_describe = Some((query.to_owned(), batches.clone()));
        }
        result
    }

    /// Runs a statement (DDL, INSERT, SET…) eagerly.
    pub fn execute(&mut self, statement: &str, params: &[Value]) -> Result<(), SparkError> {
        let started = std::time::Instant::now();
        #[allow(deprecated)]
        let command = pb::SqlCommand { input: Some(Self::sql_relation(statement, params)), ..Default::default() };
        let result = self
            .run(pb::Plan {
                op_type: Some(pb::plan::OpType::Command(pb::Command { command_type: Some(pb::command::CommandType::SqlCommand(command)) })),
            })
            .map(|_| ());
        fixpoint_core::run::protocol::trace_statement(started, statement);
        result
    }

    /// The server's Spark version.
    pub fn version(&mut self) -> Result<String, SparkError> {
        let request = pb::AnalyzePlanRequest {
            session_id: self.session_id.clone(),
            user_context: Self::user(),
            client_type: Some("fixpoint".into()),
            analyze: Some(pb::analyze_plan_request::Analyze::SparkVersion(pb::analyze_plan_request::SparkVersion {})),
            ..Default::default()
        };
        let service = &mut self.service;
        let response = self.runtime.block_on(service.analyze_plan(request)).map_err(SparkError::from_status)?.into_inner();
        match response.result {
            Some(pb::analyze_plan_response::Result::SparkVersion(v)) => Ok(v.version),
            other => Err(SparkError::local(format!("the server did not say its version: {other:?}"))),
        }
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        // Release the server-side session (best effort).
        let request = pb::ReleaseSessionRequest {
            session_id: self.session_id.clone(),
            user_context: Self::user(),
            client_type: Some("fixpoint".into()),
            ..Default::default()
        };
        let service = &mut self.service;
        let _ = self.runtime.block_on(async { tokio::time::timeout(Duration::from_secs(5), service.release_session(request)).await });
    }
}

/// A bound value as a Spark literal expression.
fn literal(v: &Value) -> pb::Expression {
    use pb::expression::literal::LiteralType as L;
    let epoch = chrono::NaiveDate::from_ymd_opt(1970, 1, 1).expect("a date");
    let lit = match v {
        Value::Null => L::Null(pb::DataType { kind: Some(pb::data_type::Kind::Null(pb::data_type::Null::default())) }),
        Value::Bool(b) => L::Boolean(*b),
        Value::Int(i) => L::Long(*i),
        Value::HugeInt(i) => L::Decimal(pb::expression::literal::Decimal { value: i.to_string(), precision: Some(38), scale: Some(0) }),
        Value::Float(f) => L::Double(*f),
        Value::Text(s) => L::String(s.clone()),
        Value::Date(d) => L::Date((*d - epoch).num_days() as i32),
        Value::Timestamp(t) => L::TimestampNtz(t.and_utc().timestamp_micros()),
    };
    pb::Expression {
        common: None,
        expr_type: Some(pb::expression::ExprType::Literal(pb::expression::Literal { data_type: None, literal_type: Some(lit) })),
    }
}

/// A literal the server sent (an observed metric) as a value: the
/// numbers, text and NULL that aggregates return.
fn literal_value(l: &pb::expression::Literal) -> Result<Value, SparkError> {
    use pb::expression::literal::LiteralType as L;
    Ok(match &l.literal_type {
        None | Some(L::Null(_)) => Value::Null,
        Some(L::Boolean(b)) => Value::Bool(*b),
        Some(L::Byte(i)) | Some(L::Short(i)) | Some(L::Integer(i)) => Value::Int((*i).into()),
        Some(L::Long(i)) => Value::Int(*i),
        Some(L::Double(f)) => Value::Float(*f),
        Some(L::String(s)) => Value::Text(s.clone()),
        Some(L::Decimal(d)) => match d.scale.unwrap_or(0) {
            0 => Value::HugeInt(d.value.parse().map_err(|_| SparkError::local(format!("an observed decimal {:?} is not a whole number", d.value)))?),
            _ => Value::Text(d.value.clone()),
        },
        Some(other) => return Err(SparkError::local(format!("an observed metric of an unexpected type: {other:?}"))),
    })
}

/// fixpoint's SQL as Spark reads it: `$n` placeholders become named
/// parameter markers `:p_n` (Spark has no `$n`; named markers, unlike `?`,
/// may repeat and come in any order), and a backslash inside a '…' literal
/// is doubled, because Spark's parser reads it as an escape where the
/// standard (and DuckDB, PostgreSQL) read a character. Quoted identifiers
/// and comments are left alone. Returns the SQL and each marker's name with
/// its parameter number.
pub fn named_markers(sql: &str) -> (String, Vec<(String, usize)>) {
    let mut out = String::with_capacity(sql.len() + 8);
    let mut names: Vec<(String, usize)> = Vec::new();
    let b = sql.as_bytes();
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        let skip_to = |from: usize, end: &[u8]| -> usize {
            let mut j = from;
            while j < b.len() {
                if b[j..].starts_with(end) {
                    return j + end.len();
                }
                j += 1;
            }
            b.len()
        };
        let next = match c {
            b'\'' | b'"' | b'`' => {
                // A quoted run; a doubled quote stays inside it.
                let mut j = i + 1;
                while j < b.len() {
                    if b[j] == c {
                        if j + 1 < b.len() && b[j + 1] == c {
                            j += 2;
                            continue;
                        }
                        break;
                    }
                    j += 1;
                }
                let end = (j + 1).min(b.len());
                if c == b'\'' {
                    out.push_str(&sql[i..end].replace('\\', "\\\\"));
                    i = end;
                    continue;
                }
                end
            }
            b'-' if b.get(i + 1) == Some(&b'-') => skip_to(i, b"\n"),
            b'/' if b.get(i + 1) == Some(&b'*') => skip_to(i + 2, b"*/"),
            b'$' if b.get(i + 1).is_some_and(u8::is_ascii_digit) => {
                let mut j = i + 1;
                while j < b.len() && b[j].is_ascii_digit() {
                    j += 1;
                }
                let n: usize = sql[i + 1..j].parse().unwrap_or(0);
                let name = format!("p_{n}");
                out.push(':');
                out.push_str(&name);
                if !names.iter().any(|(m, _)| *m == name) {
                    names.push((name, n));
                }
                i = j;
                continue;
            }
            c if c.is_ascii_alphabetic() || c == b'_' => {
                let mut j = i + 1;
                while j < b.len() && (b[j].is_ascii_alphanumeric() || b[j] == b'_') {
                    j += 1;
                }
                let word = &sql[i..j];
                let sized = sql[j..].trim_start().starts_with('(');
                if word.eq_ignore_ascii_case("VARCHAR") && !sized {
                    // The standard's text type without a length (what
                    // fixpoint's own SQL casts to): Spark's is STRING.
                    out.push_str("STRING");
                    i = j;
                    continue;
                }
                j
            }
            _ => i + 1,
        };
        out.push_str(&sql[i..next]);
        i = next;
    }
    (out, names)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placeholders_become_named_markers_outside_quotes_and_comments() {
        let (sql, names) = named_markers("SELECT $1, '$2 it''s', \"$3\", `$4`, $2 -- $5\n/* $6 */ + $10, $1, '\\N', '\\'");
        assert_eq!(sql, "SELECT :p_1, '$2 it''s', \"$3\", `$4`, :p_2 -- $5\n/* $6 */ + :p_10, :p_1, '\\\\N', '\\\\'");
        assert_eq!(names, vec![("p_1".to_owned(), 1), ("p_2".to_owned(), 2), ("p_10".to_owned(), 10)]);
        let (sql, _) = named_markers("SELECT CAST($1 AS VARCHAR), CAST(x AS varchar(3)), 'VARCHAR', \"varchar\", my_varchar, varchar_x FROM t");
        assert_eq!(sql, "SELECT CAST(:p_1 AS STRING), CAST(x AS varchar(3)), 'VARCHAR', \"varchar\", my_varchar, varchar_x FROM t");
        assert_eq!(endpoint("sc://127.0.0.1:15002/;user_id=x").unwrap(), "http://127.0.0.1:15002");
        assert_eq!(endpoint("sc://spark").unwrap(), "http://spark:15002");
        assert!(endpoint("http://x").is_err());
    }
}
