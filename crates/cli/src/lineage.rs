//! OpenLineage events: a START and then a COMPLETE or FAIL event for every
//! run (`run`, each day of a lookback window, each date of `backfill`),
//! sent to `OPENLINEAGE_URL` (HTTP, `POST {url}/api/v1/lineage`) and/or
//! appended to `--lineage-file` (one JSON event per line).
//!
//! A run's id is a UUID made from the job, the run date, the run key and
//! the attempt (`--attempt`, `FIXPOINT_ATTEMPT`): the same attempt of the
//! same run always has the same id, a retry (the next attempt) another.
//! START is sent once the run has read its input and knows its run key
//! (its `eventTime` is when the run began); a run that fails before that
//! sends START and FAIL together, its id made without a run key.
//!
//! The endpoint never fails a run: events go out on a thread of their own,
//! each request is bounded by the timeout, and at the end the process
//! waits for what is still queued at most that long again, then says on
//! stderr what was not delivered. Its exit code is the run's.

use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use chrono::{SecondsFormat, Utc};
use fixpoint_core::{Engine, Error, Job, RunDate, RunObserver, RunReport};
use serde_json::{json, Map, Value};

use crate::output;

/// Who made the events (OpenLineage's `producer`).
pub const PRODUCER: &str = concat!("https://github.com/fixpoint-data/fixpoint/tree/v", env!("CARGO_PKG_VERSION"));
/// The schema of the events.
const EVENT_SCHEMA: &str = "https://openlineage.io/spec/2-0-2/OpenLineage.json#/$defs/RunEvent";
/// The schema of fixpoint's own run facet (docs/lineage.md).
const FIXPOINT_FACET_SCHEMA: &str = concat!(
    "https://github.com/fixpoint-data/fixpoint/blob/v",
    env!("CARGO_PKG_VERSION"),
    "/docs/lineage.md#the-fixpoint-run-facet"
);
/// How long one request may take, and how long the process waits for the
/// queue at its end, unless `FIXPOINT_LINEAGE_TIMEOUT_MS` says otherwise.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5);

/// A parent run (`OPENLINEAGE_PARENT_ID`, `OPENLINEAGE_ROOT_PARENT_ID`):
/// `{namespace}/{job name}/{run id}`.
#[derive(Debug, Clone, PartialEq)]
pub struct RunRef {
    pub namespace: String,
    pub name: String,
    pub run_id: String,
}

impl RunRef {
    /// Reads `{namespace}/{job name}/{run id}` (the job name may hold `/`).
    pub fn parse(var: &str, text: &str) -> Result<RunRef, Error> {
        let bad = |why: &str| {
            Error::argument(
                format!("{var}={text:?} {why}"),
                Some("give it as {namespace}/{job name}/{run id}, the run id a UUID (what Airflow's lineage_parent_id macro gives), or unset it"),
            )
        };
        let (rest, run_id) = text.rsplit_once('/').ok_or_else(|| bad("is not {namespace}/{job name}/{run id}"))?;
        let (namespace, name) = rest.split_once('/').ok_or_else(|| bad("is not {namespace}/{job name}/{run id}"))?;
        if namespace.is_empty() || name.is_empty() {
            return Err(bad("has an empty namespace or job name"));
        }
        if !is_uuid(run_id) {
            return Err(bad("does not end in a UUID run id"));
        }
        Ok(RunRef { namespace: namespace.to_owned(), name: name.to_owned(), run_id: run_id.to_ascii_lowercase() })
    }
}

/// Whether `s` is a UUID in its 8-4-4-4-12 hex form.
fn is_uuid(s: &str) -> bool {
    let groups: Vec<&str> = s.split('-').collect();
    groups.len() == 5
        && groups.iter().zip([8, 4, 4, 4, 12]).all(|(g, n)| g.len() == n && g.chars().all(|c| c.is_ascii_hexdigit()))
}

/// Where the events of this process go, and what names them.
#[derive(Debug, Clone)]
pub struct Config {
    /// `OPENLINEAGE_URL`: the events are POSTed to `{url}/api/v1/lineage`.
    pub url: Option<String>,
    /// `OPENLINEAGE_API_KEY`: sent as a bearer token.
    pub api_key: Option<String>,
    /// `--lineage-file`: one JSON event per line, appended.
    pub file: Option<PathBuf>,
    /// `OPENLINEAGE_NAMESPACE`, default `fixpoint`.
    pub namespace: String,
    /// `OPENLINEAGE_PARENT_ID`.
    pub parent: Option<RunRef>,
    /// `OPENLINEAGE_ROOT_PARENT_ID`.
    pub root: Option<RunRef>,
    /// `--attempt` / `FIXPOINT_ATTEMPT`: the scheduler's try number.
    pub attempt: u32,
    /// Per request, and for the queue at the end.
    pub timeout: Duration,
    /// The database the runs write (datasets are named after it).
    pub db: Store,
}

impl Config {
    /// The configuration from the environment and the command line, or
    /// `None` when neither `OPENLINEAGE_URL` nor `--lineage-file` asks for
    /// events. A malformed setting is refused (exit 2) before the run.
    pub fn from_env(file: Option<PathBuf>, attempt: u32, db_url: &str) -> Result<Option<Config>, Error> {
        let var = |name: &str| std::env::var(name).ok().map(|v| v.trim().to_owned()).filter(|v| !v.is_empty());
        let url = var("OPENLINEAGE_URL");
        if url.is_none() && file.is_none() {
            return Ok(None);
        }
        if let Some(u) = &url {
            if !(u.starts_with("http://") || u.starts_with("https://")) {
                return Err(Error::argument(
                    format!("OPENLINEAGE_URL={:?} is not an http:// or https:// URL", output::redact_url(u)),
                    Some("give the lineage server's base URL, e.g. http://localhost:5000 (events go to {url}/api/v1/lineage), or unset it"),
                ));
            }
        }
        if let Some(f) = &file {
            let folder = f.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
            if !folder.is_dir() {
                return Err(Error::argument(
                    format!("--lineage-file {}: the folder {} does not exist", f.display(), folder.display()),
                    Some("create the folder first: fixpoint creates the file, never its folder"),
                ));
            }
        }
        if attempt == 0 {
            return Err(Error::argument("--attempt 0: attempts count from 1", Some("pass the scheduler's try number: 1 for the first try")));
        }
        let timeout = match var("FIXPOINT_LINEAGE_TIMEOUT_MS") {
            None => DEFAULT_TIMEOUT,
            Some(ms) => Duration::from_millis(ms.parse::<u64>().ok().filter(|&m| m > 0).ok_or_else(|| {
                Error::argument(
                    format!("FIXPOINT_LINEAGE_TIMEOUT_MS={ms:?} is not a positive number of milliseconds"),
                    Some("e.g. FIXPOINT_LINEAGE_TIMEOUT_MS=5000, or unset it for the default (5 s)"),
                )
            })?),
        };
        Ok(Some(Config {
            url,
            api_key: var("OPENLINEAGE_API_KEY"),
            file,
            namespace: var("OPENLINEAGE_NAMESPACE").unwrap_or_else(|| "fixpoint".into()),
            parent: var("OPENLINEAGE_PARENT_ID").map(|p| RunRef::parse("OPENLINEAGE_PARENT_ID", &p)).transpose()?,
            root: var("OPENLINEAGE_ROOT_PARENT_ID").map(|p| RunRef::parse("OPENLINEAGE_ROOT_PARENT_ID", &p)).transpose()?,
            attempt,
            timeout,
            db: Store::of_url(db_url),
        }))
    }
}

/// The database a run writes, as OpenLineage names datasets in it.
#[derive(Debug, Clone, PartialEq)]
pub enum Store {
    /// `duckdb://{absolute path}`, tables `{catalog}.{schema}.{table}`.
    DuckDb { path: String, catalog: String },
    /// `postgres://{host}:{port}`, tables `{database}.{schema}.{table}`.
    Postgres { host: String, port: u16, database: String },
    /// `spark://{host}:{port}` (Spark Connect), tables `{schema}.{table}`.
    Spark { host: String, port: u16 },
    /// A Delta warehouse: its tables are folders (`file` or `s3://bucket`).
    Delta { root: String },
    /// Anything else: `fixpoint`, tables `{schema}.{table}`.
    Other,
}

impl Store {
    /// The store of a database URL (never with its user or password).
    pub fn of_url(url: &str) -> Store {
        if let Some(rest) = url.strip_prefix("postgres://").or_else(|| url.strip_prefix("postgresql://")) {
            let (authority, path) = rest.split_once('/').unwrap_or((rest, ""));
            let hostport = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
            // host, host:port, [v6] or [v6]:port
            let (host, port) = match hostport.strip_prefix('[').and_then(|h| h.split_once(']')) {
                Some((v6, rest)) => (format!("[{v6}]"), rest.strip_prefix(':').and_then(|p| p.parse().ok()).unwrap_or(5432)),
                None => match hostport.rsplit_once(':') {
                    Some((h, p)) => (h.to_owned(), p.parse().unwrap_or(5432)),
                    None => (hostport.to_owned(), 5432),
                },
            };
            let database = path.split('?').next().unwrap_or("").to_owned();
            let user = authority.rsplit_once('@').map(|(u, _)| u.split(':').next().unwrap_or("").to_owned()).unwrap_or_default();
            let database = if database.is_empty() { user } else { database };
            return Store::Postgres { host: if host.is_empty() { "localhost".into() } else { host }, port, database };
        }
        if let Some(rest) = url.strip_prefix("sc://") {
            let hostport = rest.split(['/', ';']).next().unwrap_or(rest);
            let (host, port) = hostport.rsplit_once(':').map_or((hostport, 15002), |(h, p)| (h, p.parse().unwrap_or(15002)));
            return Store::Spark { host: host.to_owned(), port };
        }
        if let Some(rest) = url.strip_prefix("delta:") {
            let root = if rest.contains("://") { rest.trim_end_matches('/').to_owned() } else { absolute(Path::new(rest)) };
            return Store::Delta { root };
        }
        if let Some(rest) = url.strip_prefix("duckdb:") {
            if rest.is_empty() || rest == ":memory:" {
                return Store::DuckDb { path: ":memory:".into(), catalog: "memory".into() };
            }
            let path = Path::new(rest);
            let catalog = path.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_else(|| "main".into());
            return Store::DuckDb { path: absolute(path), catalog };
        }
        Store::Other
    }

    /// The namespace of the store's tables.
    fn namespace(&self) -> String {
        match self {
            Store::DuckDb { path, .. } => format!("duckdb://{path}"),
            Store::Postgres { host, port, .. } => format!("postgres://{host}:{port}"),
            Store::Spark { host, port } => format!("spark://{host}:{port}"),
            Store::Delta { root } => file_dataset(root).0,
            Store::Other => "fixpoint".into(),
        }
    }

    /// A table's dataset: (namespace, name). `parts` as written in SQL (one
    /// to three parts); an unqualified table is in the engine's default
    /// schema.
    fn table(&self, parts: &[String]) -> (String, String) {
        let (schema, table) = match parts {
            [t] => (self.default_schema().to_owned(), t.clone()),
            [.., s, t] => (s.clone(), t.clone()),
            [] => (String::new(), String::new()),
        };
        match self {
            Store::DuckDb { catalog, .. } => {
                let catalog = if parts.len() == 3 { parts[0].clone() } else { catalog.clone() };
                (self.namespace(), format!("{catalog}.{schema}.{table}"))
            }
            Store::Postgres { database, .. } => (self.namespace(), format!("{database}.{schema}.{table}")),
            Store::Delta { root } => file_dataset(&format!("{root}/{schema}/{table}")),
            Store::Spark { .. } | Store::Other => (self.namespace(), format!("{schema}.{table}")),
        }
    }

    fn default_schema(&self) -> &'static str {
        match self {
            Store::Postgres { .. } => "public",
            Store::Spark { .. } | Store::Delta { .. } => "default",
            Store::DuckDb { .. } | Store::Other => "main",
        }
    }
}

/// A path made absolute (against the working folder), as text.
fn absolute(p: &Path) -> String {
    let abs = if p.is_absolute() { p.to_path_buf() } else { std::env::current_dir().map(|d| d.join(p)).unwrap_or_else(|_| p.to_path_buf()) };
    abs.to_string_lossy().into_owned()
}

/// A file's dataset: `s3://bucket` and the key, or `file` and the path.
fn file_dataset(location: &str) -> (String, String) {
    if let Some(rest) = location.strip_prefix("s3://") {
        let (bucket, key) = rest.split_once('/').unwrap_or((rest, ""));
        return (format!("s3://{bucket}"), key.to_owned());
    }
    ("file".into(), location.to_owned())
}

/// A run's id: a UUID (version 7 layout) whose time is the run date's
/// midnight (UTC) and whose other bits are a hash of the namespace, the
/// job, the run date, the run key and the attempt.
pub fn run_id(namespace: &str, job: &str, run_date: RunDate, run_key: Option<&str>, attempt: u32) -> String {
    let mut h = blake3::Hasher::new();
    for part in ["fixpoint-openlineage-run-v1", namespace, job, &run_date.to_string(), run_key.unwrap_or(""), &attempt.to_string()] {
        h.update(&(part.len() as u64).to_le_bytes());
        h.update(part.as_bytes());
    }
    let hash = h.finalize();
    let mut b = [0u8; 16];
    let millis = run_date.start().and_utc().timestamp_millis().max(0) as u64;
    b[..6].copy_from_slice(&millis.to_be_bytes()[2..]);
    b[6..].copy_from_slice(&hash.as_bytes()[..10]);
    b[6] = 0x70 | (b[6] & 0x0f);
    b[8] = 0x80 | (b[8] & 0x3f);
    let hex: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!("{}-{}-{}-{}-{}", &hex[..8], &hex[8..12], &hex[12..16], &hex[16..20], &hex[20..])
}

/// One run being watched.
struct Watched {
    started_at: String,
    /// The run key, once known, and whether START has gone out.
    key: Option<String>,
    start_sent: bool,
}

/// The events of one process: a [`RunObserver`] for the runs, and the
/// queue of events to send.
pub struct Lineage {
    config: Config,
    runs: Mutex<HashMap<(String, RunDate), Watched>>,
    http: Mutex<Option<mpsc::Sender<(String, String)>>>,
    worker: Mutex<Option<std::thread::JoinHandle<()>>>,
    /// Events the worker has finished with (sent or failed).
    done: Arc<(Mutex<usize>, std::sync::Condvar)>,
    queued: Mutex<usize>,
    file: Option<Mutex<std::fs::File>>,
}

impl Lineage {
    /// Starts the sender (for an HTTP endpoint) and opens the file.
    pub fn start(config: Config) -> Result<Arc<Lineage>, Error> {
        let file = match &config.file {
            None => None,
            Some(path) => Some(Mutex::new(std::fs::OpenOptions::new().create(true).append(true).open(path).map_err(|e| {
                Error::argument(format!("--lineage-file {}: {e}", path.display()), Some("give a file fixpoint may create or append to"))
            })?)),
        };
        let done = Arc::new((Mutex::new(0usize), std::sync::Condvar::new()));
        let (http, worker) = match &config.url {
            None => (None, None),
            Some(url) => {
                let (tx, rx) = mpsc::channel::<(String, String)>();
                let endpoint = format!("{}/api/v1/lineage", url.trim_end_matches('/'));
                let api_key = config.api_key.clone();
                let timeout = config.timeout;
                let done = Arc::clone(&done);
                let worker = std::thread::Builder::new()
                    .name("openlineage".into())
                    .spawn(move || {
                        let agent: ureq::Agent = ureq::Agent::config_builder().timeout_global(Some(timeout)).build().into();
                        for (what, body) in rx {
                            let mut req = agent.post(&endpoint).header("Content-Type", "application/json");
                            if let Some(k) = &api_key {
                                req = req.header("Authorization", format!("Bearer {k}"));
                            }
                            if let Err(e) = req.send(body.as_str()) {
                                eprintln!("fixpoint: lineage: the {what} event was not delivered to {}: {e}; the run is not affected", output::redact_url(&endpoint));
                            }
                            let (n, cv) = &*done;
                            *n.lock().unwrap_or_else(|p| p.into_inner()) += 1;
                            cv.notify_all();
                        }
                    })
                    .map_err(|e| Error::Internal(format!("could not start the lineage sender: {e}")))?;
                (Some(tx), Some(worker))
            }
        };
        Ok(Arc::new(Lineage { config, runs: Mutex::new(HashMap::new()), http: Mutex::new(http), worker: Mutex::new(worker), done, queued: Mutex::new(0), file }))
    }

    /// Waits, at most the timeout, for the events still queued, then says
    /// on stderr how many were not delivered.
    pub fn close(&self) {
        let tx = self.http.lock().unwrap_or_else(|p| p.into_inner()).take();
        drop(tx);
        let queued = *self.queued.lock().unwrap_or_else(|p| p.into_inner());
        let deadline = Instant::now() + self.config.timeout;
        let (n, cv) = &*self.done;
        let mut sent = n.lock().unwrap_or_else(|p| p.into_inner());
        while *sent < queued {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            sent = cv.wait_timeout(sent, left).unwrap_or_else(|p| p.into_inner()).0;
        }
        if *sent < queued {
            eprintln!(
                "fixpoint: lineage: {} event(s) still undelivered after {} ms; given up (the run is not affected)",
                queued - *sent,
                self.config.timeout.as_millis()
            );
        } else if let Some(w) = self.worker.lock().unwrap_or_else(|p| p.into_inner()).take() {
            let _ = w.join();
        }
    }

    fn emit(&self, what: &str, event: Value) {
        let line = event.to_string();
        if let Some(f) = &self.file {
            let mut f = f.lock().unwrap_or_else(|p| p.into_inner());
            if let Err(e) = writeln!(f, "{line}").and_then(|_| f.flush()) {
                eprintln!("fixpoint: lineage: could not append the {what} event to {}: {e}", self.config.file.as_deref().unwrap_or(Path::new("")).display());
            }
        }
        if let Some(tx) = self.http.lock().unwrap_or_else(|p| p.into_inner()).as_ref() {
            if tx.send((what.to_owned(), line)).is_ok() {
                *self.queued.lock().unwrap_or_else(|p| p.into_inner()) += 1;
            }
        }
    }

    /// The parts every event of a run shares.
    fn event(&self, kind: &str, time: &str, job: &Job, run_date: RunDate, key: Option<&str>, run_facets: Map<String, Value>) -> Map<String, Value> {
        let c = &self.config;
        let mut run_facets = run_facets;
        run_facets.insert(
            "nominalTime".into(),
            json!({
                "_producer": PRODUCER,
                "_schemaURL": "https://openlineage.io/spec/facets/1-0-1/NominalTimeRunFacet.json#/$defs/NominalTimeRunFacet",
                "nominalStartTime": format!("{}T00:00:00Z", run_date),
                "nominalEndTime": format!("{}T00:00:00Z", run_date.next()),
            }),
        );
        if let Some(p) = &c.parent {
            let mut facet = json!({
                "_producer": PRODUCER,
                "_schemaURL": "https://openlineage.io/spec/facets/1-2-0/ParentRunFacet.json#/$defs/ParentRunFacet",
                "run": {"runId": p.run_id},
                "job": {"namespace": p.namespace, "name": p.name},
            });
            if let Some(r) = &c.root {
                facet["root"] = json!({"run": {"runId": r.run_id}, "job": {"namespace": r.namespace, "name": r.name}});
            }
            run_facets.insert("parent".into(), facet);
        }
        let mut job_facets = Map::new();
        job_facets.insert(
            "jobType".into(),
            json!({
                "_producer": PRODUCER,
                "_schemaURL": "https://openlineage.io/spec/facets/2-0-4/JobTypeJobFacet.json#/$defs/JobTypeJobFacet",
                "processingType": "BATCH", "integration": "FIXPOINT", "jobType": "JOB",
            }),
        );
        if job.source.files.is_none() || !job.source.sql.trim().is_empty() {
            let dialect = match c.db {
                Store::DuckDb { .. } => "duckdb",
                Store::Postgres { .. } => "postgres",
                Store::Spark { .. } | Store::Delta { .. } => "spark",
                Store::Other => "ansi",
            };
            job_facets.insert(
                "sql".into(),
                json!({
                    "_producer": PRODUCER,
                    "_schemaURL": "https://openlineage.io/spec/facets/1-1-0/SQLJobFacet.json#/$defs/SQLJobFacet",
                    "query": job.source.sql, "dialect": dialect,
                }),
            );
        }
        let mut e = Map::new();
        e.insert("eventType".into(), json!(kind));
        e.insert("eventTime".into(), json!(time));
        e.insert("producer".into(), json!(PRODUCER));
        e.insert("schemaURL".into(), json!(EVENT_SCHEMA));
        e.insert("run".into(), json!({"runId": run_id(&c.namespace, &job.name, run_date, key, c.attempt), "facets": run_facets}));
        e.insert("job".into(), json!({"namespace": c.namespace, "name": job.name, "facets": job_facets}));
        e
    }

    /// The tables the source reads (the files, for a file source).
    fn inputs(&self, job: &Job, report: Option<&RunReport>) -> Vec<Value> {
        let mut out = Vec::new();
        let mut seen = std::collections::BTreeSet::new();
        if let Some(rels) = fixpoint_core::job::sqlrefs::relations(&job.source.template().text_for_parsing()) {
            for parts in rels {
                if job.source.files.is_some() && parts.len() == 1 && parts[0] == "input" {
                    continue;
                }
                let (namespace, name) = self.config.db.table(&parts);
                if seen.insert((namespace.clone(), name.clone())) {
                    out.push(json!({"namespace": namespace, "name": name}));
                }
            }
        }
        if let Some(files) = report.and_then(|r| r.input_files.as_ref()) {
            for f in &files.files {
                let location = match files.origin.url() {
                    Some(url) => format!("{}/{}", url.trim_end_matches('/'), f.path),
                    None => absolute(&files.base.join(&f.path)),
                };
                let (namespace, name) = file_dataset(&location);
                if seen.insert((namespace.clone(), name.clone())) {
                    out.push(json!({"namespace": namespace, "name": name}));
                }
            }
        }
        out
    }

    /// The target, with its columns and (for a run that wrote) the rows written.
    fn output(&self, job: &Job, report: Option<&RunReport>, engine: Option<&mut dyn Engine>) -> Value {
        let parts = vec![job.target.schema.clone(), job.target.table.clone()];
        let (namespace, name) = self.config.db.table(&parts);
        let mut facets = Map::new();
        if let Some(engine) = engine {
            if let Ok(Some(cols)) = engine.table_columns(&job.target) {
                let fields: Vec<Value> =
                    cols.iter().enumerate().map(|(i, c)| json!({"name": c.name, "type": c.ty, "ordinal_position": i + 1})).collect();
                facets.insert(
                    "schema".into(),
                    json!({
                        "_producer": PRODUCER,
                        "_schemaURL": "https://openlineage.io/spec/facets/1-2-0/SchemaDatasetFacet.json#/$defs/SchemaDatasetFacet",
                        "fields": fields,
                    }),
                );
            }
        }
        let mut out = json!({"namespace": namespace, "name": name, "facets": facets});
        if let Some(r) = report {
            out["outputFacets"] = json!({"outputStatistics": {
                "_producer": PRODUCER,
                "_schemaURL": "https://openlineage.io/spec/facets/1-0-2/OutputStatisticsOutputDatasetFacet.json#/$defs/OutputStatisticsOutputDatasetFacet",
                "rowCount": r.rows_inserted + r.rows_updated,
            }});
        }
        out
    }

    /// fixpoint's own run facet.
    fn fixpoint_facet(&self, job: &Job, run_date: RunDate, key: Option<&str>, report: Option<&RunReport>, error: Option<&Error>) -> Value {
        let mut f = json!({
            "_producer": PRODUCER,
            "_schemaURL": FIXPOINT_FACET_SCHEMA,
            "runDate": run_date.to_string(),
            "runKey": key,
            "attempt": self.config.attempt,
            "strategy": job.strategy.name(),
            "target": job.target.to_string(),
        });
        if let Some(r) = report {
            let fp = |rows: u64, checksum: &str| json!({"rows": rows, "checksum": checksum, "kind": r.fingerprint_kind});
            f["outcome"] = json!(r.outcome);
            f["skipped"] = json!(r.outcome == "skipped");
            f["skipReason"] = json!(r.skip_reason);
            f["method"] = json!(r.method);
            f["input"] = fp(r.input_rows, &r.input_checksum);
            f["output"] = fp(r.output_rows, &r.output_checksum);
            f["rowsInserted"] = json!(r.rows_inserted);
            f["rowsUpdated"] = json!(r.rows_updated);
            f["rowsDeleted"] = json!(r.rows_deleted);
            f["rowsUnchanged"] = json!(r.rows_unchanged);
            f["duplicatesCollapsed"] = json!(r.duplicates_collapsed);
        }
        if let Some(e) = error {
            f["outcome"] = json!("failed");
            f["skipped"] = json!(false);
            f["error"] = json!({"class": output::class_name(e.class()), "exitCode": output::exit_code(e), "hint": e.hint()});
        }
        f
    }

    fn send_start(&self, job: &Job, run_date: RunDate, started_at: &str, key: Option<&str>) {
        let mut facets = Map::new();
        facets.insert("fixpoint".into(), self.fixpoint_facet(job, run_date, key, None, None));
        let mut e = self.event("START", started_at, job, run_date, key, facets);
        e.insert("inputs".into(), Value::Array(self.inputs(job, None)));
        e.insert("outputs".into(), json!([self.output(job, None, None)]));
        self.emit("START", Value::Object(e));
    }
}

impl RunObserver for Lineage {
    fn started(&self, job: &Job, run_date: RunDate) {
        let now = Utc::now().to_rfc3339_opts(SecondsFormat::Millis, true);
        self.runs.lock().unwrap_or_else(|p| p.into_inner()).insert((job.name.clone(), run_date), Watched { started_at: now, key: None, start_sent: false });
    }

    fn run_key_known(&self, job: &Job, run_date: RunDate, run_key: &str) {
        let start = {
            let mut runs = self.runs.lock().unwrap_or_else(|p| p.into_inner());
            match runs.get_mut(&(job.name.clone(), run_date)) {
                Some(w) if !w.start_sent => {
                    w.start_sent = true;
                    w.key = Some(run_key.to_owned());
                    Some(w.started_at.clone())
                }
                _ => None,
            }
        };
        if let Some(at) = start {
            self.send_start(job, run_date, &at, Some(run_key));
        }
    }

    fn finished(&self, job: &Job, run_date: RunDate, result: Result<&RunReport, &Error>, engine: Option<&mut dyn Engine>) {
        let watched = self.runs.lock().unwrap_or_else(|p| p.into_inner()).remove(&(job.name.clone(), run_date));
        let started_at = watched.as_ref().map(|w| w.started_at.clone()).unwrap_or_else(|| Utc::now().to_rfc3339_opts(SecondsFormat::Millis, true));
        let report = result.ok();
        // The run key: the report's (a skip's too), else the one the run
        // had found before it failed, else none.
        let key = report.map(|r| r.run_key.clone()).filter(|k| !k.is_empty()).or_else(|| watched.as_ref().and_then(|w| w.key.clone()));
        if !watched.as_ref().is_some_and(|w| w.start_sent) {
            self.send_start(job, run_date, &started_at, key.as_deref());
        }
        let now = Utc::now().to_rfc3339_opts(SecondsFormat::Millis, true);
        let mut facets = Map::new();
        facets.insert("fixpoint".into(), self.fixpoint_facet(job, run_date, key.as_deref(), report, result.err()));
        if let Err(e) = result {
            facets.insert(
                "errorMessage".into(),
                json!({
                    "_producer": PRODUCER,
                    "_schemaURL": "https://openlineage.io/spec/facets/1-0-1/ErrorMessageRunFacet.json#/$defs/ErrorMessageRunFacet",
                    "message": e.to_string(),
                    "programmingLanguage": "Rust",
                }),
            );
        }
        let kind = if result.is_ok() { "COMPLETE" } else { "FAIL" };
        let mut e = self.event(kind, &now, job, run_date, key.as_deref(), facets);
        e.insert("inputs".into(), Value::Array(self.inputs(job, report)));
        let engine = if result.is_ok() { engine } else { None };
        e.insert("outputs".into(), json!([self.output(job, report, engine)]));
        self.emit(kind, Value::Object(e));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_ids_are_uuids_that_name_the_attempt() {
        let d = RunDate::parse("2026-10-20").unwrap();
        let a = run_id("fixpoint", "orders", d, Some("k1"), 1);
        assert!(is_uuid(&a), "{a}");
        assert_eq!(&a[14..15], "7", "version 7: {a}");
        assert!(matches!(&a[19..20], "8" | "9" | "a" | "b"), "variant: {a}");
        assert_eq!(a, run_id("fixpoint", "orders", d, Some("k1"), 1));
        assert_ne!(a, run_id("fixpoint", "orders", d, Some("k1"), 2));
        assert_ne!(a, run_id("fixpoint", "orders", d, Some("k2"), 1));
        assert_ne!(a, run_id("fixpoint", "orders", d, None, 1));
        assert_ne!(a, run_id("fixpoint", "orders", d.next(), Some("k1"), 1));
        assert_ne!(a, run_id("fixpoint", "other", d, Some("k1"), 1));
        // The time part is the run date's midnight: 2026-10-20T00:00Z.
        let millis = u64::from_str_radix(&a[..8], 16).unwrap() << 16 | u64::from_str_radix(&a[9..13], 16).unwrap();
        assert_eq!(millis, 1_792_454_400_000);
    }

    #[test]
    fn parents_read_as_airflow_writes_them() {
        let p = RunRef::parse("OPENLINEAGE_PARENT_ID", "airflow/etl.load_orders/01890f5e-8f7c-7c3a-9b1e-2f3a4b5c6d7e").unwrap();
        assert_eq!(p, RunRef { namespace: "airflow".into(), name: "etl.load_orders".into(), run_id: "01890f5e-8f7c-7c3a-9b1e-2f3a4b5c6d7e".into() });
        let nested = RunRef::parse("P", "ns/a/b/01890f5e-8f7c-7c3a-9b1e-2f3a4b5c6d7e").unwrap();
        assert_eq!(nested.name, "a/b");
        for bad in ["", "ns", "ns/job", "ns/job/not-a-uuid", "/job/01890f5e-8f7c-7c3a-9b1e-2f3a4b5c6d7e"] {
            let e = RunRef::parse("OPENLINEAGE_PARENT_ID", bad).unwrap_err();
            assert!(e.to_string().contains("OPENLINEAGE_PARENT_ID"), "{e}");
        }
    }

    #[test]
    fn stores_are_named_without_credentials() {
        assert_eq!(
            Store::of_url("postgres://alice:s3cret@db.example.com:6543/warehouse?sslmode=require"),
            Store::Postgres { host: "db.example.com".into(), port: 6543, database: "warehouse".into() }
        );
        assert_eq!(Store::of_url("postgres://root@127.0.0.1/test"), Store::Postgres { host: "127.0.0.1".into(), port: 5432, database: "test".into() });
        assert_eq!(Store::of_url("postgres://u:p@[::1]:6000/db"), Store::Postgres { host: "[::1]".into(), port: 6000, database: "db".into() });
        assert_eq!(Store::of_url("postgres://u@[::1]/db"), Store::Postgres { host: "[::1]".into(), port: 5432, database: "db".into() });
        let pg = Store::of_url("postgres://root@127.0.0.1:5432/test");
        assert_eq!(pg.table(&["silver".into(), "orders".into()]), ("postgres://127.0.0.1:5432".into(), "test.silver.orders".into()));
        assert_eq!(pg.table(&["orders".into()]).1, "test.public.orders");
        let duck = Store::of_url("duckdb:/data/wh.duckdb");
        assert_eq!(duck.table(&["silver".into(), "orders".into()]), ("duckdb:///data/wh.duckdb".into(), "wh.silver.orders".into()));
        assert_eq!(Store::of_url("sc://localhost:15002").table(&["s".into(), "t".into()]), ("spark://localhost:15002".into(), "s.t".into()));
        assert_eq!(Store::of_url("delta:s3://lake/wh").table(&["s".into(), "t".into()]), ("s3://lake".into(), "wh/s/t".into()));
        assert_eq!(file_dataset("/in/day.parquet"), ("file".into(), "/in/day.parquet".into()));
    }
}
