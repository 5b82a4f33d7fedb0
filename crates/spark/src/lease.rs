//! Leases: how runs on Spark, which has no transactions across
//! statements, keep out of each other's way.
//!
//! A lease on a scope (job, target, date) is a generation of views in the
//! `fixpoint` database: `fixpoint.lease__<hash of the scope>__g<n>`. The
//! metastore creates a view atomically (creating one that exists fails), so
//! each generation has exactly one creator, and **taking a lease is one
//! step**: creating the generation after the newest. A run holds the lease
//! while its generation is the newest, its owner token is the view's, and
//! its expiry (a table property) lies ahead.
//!
//! - A free lease (released, its newest generation marked so) is taken by
//!   creating the next generation. The newest generation is never dropped,
//!   so generation numbers only grow and a stale reader can never recreate
//!   one that somebody else holds.
//! - A lease whose expiry has passed (its run died) is taken over the same
//!   way: the next generation. Of two runs breaking it at once, one creates
//!   the view and the other finds it there.
//! - A lease whose expiry cannot be read (missing, garbled) counts as held:
//!   fixpoint never breaks what it cannot read; the message names the view
//!   to drop by hand.
//! - The holder renews the expiry from a thread of its own (its own Spark
//!   session), every third of the lease, while the run lives; a run paused
//!   in-process (a slow statement) keeps its lease.
//! - Right before it writes (every `INSERT OVERWRITE`, every partition
//!   drop), the run checks that it still holds the lease with at least a
//!   third of it ahead. A run that lost it (its process was frozen for
//!   longer than the lease, and another run took over) stops without
//!   writing.
//!
//! What a lease cannot promise: a process frozen between that last check
//! and the moment its statement reaches Spark, for longer than the lease,
//! can still write after another run took over. The check after the write
//! then reports the loss (exit 5) and the next run rewrites the day.

use std::collections::HashMap;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use fixpoint_core::job::ident::{quote_ident, TableName};
use fixpoint_core::job::sql::Value;
use fixpoint_core::{Error, Result};

use crate::client::{Client, SparkError};
use crate::engine::to_rows;

/// How many generations a lease gathers before the run that takes the
/// next one drops the older ones.
const OLD_GENERATIONS_KEPT: usize = 4;

/// The database the views live in (the ledger's).
fn database() -> &'static str {
    fixpoint_core::run::ledger::SCHEMA
}

/// `lease__<hash of the scope>__g`: a generation's view name is this
/// followed by its number.
pub(crate) fn prefix(scope: &str) -> String {
    let h = &fixpoint_core::job::digest::hash_hex(&["fixpoint-lease-v2", scope])[..16];
    format!("lease__{h}__g")
}

/// The view of generation `generation`.
pub(crate) fn view(prefix: &str, generation: u64) -> TableName {
    TableName { schema: database().into(), table: format!("{prefix}{generation}") }
}

pub(crate) fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

/// A string literal for the few values fixpoint makes itself and Spark's
/// grammar takes only as literals (table properties, SHOW patterns): quotes
/// doubled.
pub(crate) fn lit(s: &str) -> String {
    format!("'{}'", s.replace('\\', "").replace('\'', "''"))
}

fn spark_err(context: &str) -> impl FnOnce(SparkError) -> Error + '_ {
    move |e| crate::engine::database_error(context.to_owned(), e)
}

fn not_found(e: &SparkError) -> bool {
    matches!(e.error_class.as_deref(), Some("TABLE_OR_VIEW_NOT_FOUND" | "SCHEMA_NOT_FOUND"))
}

/// A generation's state, as its table properties say.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum State {
    /// The view is not there (dropped since it was listed).
    Gone,
    /// Released by its run.
    Released,
    /// Held by `owner` until `until_ms` (in the past: its run died).
    Held { owner: String, until_ms: u64 },
    /// Its properties cannot be read as a lease: held, for safety.
    Unreadable(String),
}

/// Every generation of a lease with what its properties say, oldest
/// first: one `SHOW TABLE EXTENDED`, which lists the views with their
/// properties (a listing and a read of each in one statement).
pub(crate) fn listing(client: &mut Client, prefix: &str) -> Result<Vec<(u64, State)>> {
    let sql = format!("SHOW TABLE EXTENDED IN {} LIKE {}", quote_ident(database()), lit(&format!("{prefix}*")));
    let rows = match client.query(&sql, &[]) {
        Ok(b) => to_rows(&b)?,
        Err(e) if not_found(&e) => return Ok(Vec::new()),
        Err(e) => return Err(spark_err("listing a lease's views")(e)),
    };
    let col = |n: &str| rows.columns.iter().position(|c| c == n);
    let (Some(name), Some(information)) = (col("tableName"), col("information")) else {
        return Err(Error::Internal(format!("spark: SHOW TABLE EXTENDED answered with the columns {:?}", rows.columns)));
    };
    let temporary = col("isTemporary");
    let mut out: Vec<(u64, State)> = rows
        .rows
        .iter()
        .filter(|r| temporary.is_none_or(|t| r.get(t) != Some(&Value::Bool(true))))
        .filter_map(|r| {
            let generation = r.get(name).and_then(|v| v.as_str()).and_then(|n| n.strip_prefix(prefix)).and_then(|g| g.parse().ok())?;
            let info = r.get(information).and_then(|v| v.as_str()).unwrap_or_default();
            let props = listed_properties(info);
            Some((generation, state_of(|k| props.get(k).cloned())))
        })
        .collect();
    out.sort_unstable_by_key(|(g, _)| *g);
    Ok(out)
}

/// The `Table Properties: [k=v, …]` line of a `SHOW TABLE EXTENDED`
/// entry. The values fixpoint writes there (a UUID, a number, `true`)
/// hold neither `, ` nor `=`; a line that does not parse gives what it
/// can, and a lease missing its owner or expiry counts as held.
fn listed_properties(information: &str) -> HashMap<String, String> {
    let Some(line) = information.lines().find_map(|l| l.strip_prefix("Table Properties: ")) else { return HashMap::new() };
    let inner = line.trim().trim_start_matches('[').trim_end_matches(']');
    inner.split(", ").filter_map(|kv| kv.split_once('=')).map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned())).collect()
}

/// What generation `view` says (one `SHOW TBLPROPERTIES`).
pub(crate) fn state(client: &mut Client, view: &TableName) -> Result<State> {
    let rows = match client.query(&format!("SHOW TBLPROPERTIES {}", view.quoted()), &[]) {
        Ok(b) => to_rows(&b)?,
        Err(e) if not_found(&e) => return Ok(State::Gone),
        Err(e) => return Err(spark_err("reading a lease")(e)),
    };
    Ok(state_of(|k| rows.rows.iter().find(|r| r.first().and_then(|v| v.as_str()) == Some(k)).and_then(|r| r.get(1)).and_then(|v| v.as_str().map(str::to_owned))))
}

/// A generation's state from its properties.
fn state_of(prop: impl Fn(&str) -> Option<String>) -> State {
    if prop("fixpoint.released").as_deref() == Some("true") {
        return State::Released;
    }
    let owner = prop("fixpoint.owner").filter(|o| !o.is_empty());
    let until = prop("fixpoint.expires_ms");
    match (owner, until.as_deref().map(str::parse::<u64>)) {
        (Some(owner), Some(Ok(until_ms))) => State::Held { owner, until_ms },
        (owner, _) => State::Unreadable(format!(
            "owner {}, expiry {}",
            owner.as_deref().unwrap_or("missing"),
            until.map_or_else(|| "missing".to_owned(), |u| format!("{u:?}, not a number of milliseconds"))
        )),
    }
}

/// Creates generation `generation`, held by `owner` for `lease`.
/// `Ok(false)` when it exists already (another run created it first).
fn create(client: &mut Client, prefix: &str, generation: u64, owner: &str, lease: Duration) -> Result<bool> {
    let view = view(prefix, generation);
    let expires = now_ms() + lease.as_millis() as u64;
    let sql = format!(
        "CREATE VIEW {} TBLPROPERTIES ('fixpoint.owner' = {}, 'fixpoint.expires_ms' = {}) AS SELECT 1 AS held",
        view.quoted(),
        lit(owner),
        lit(&expires.to_string())
    );
    for _ in 0..2 {
        match client.execute(&sql, &[]) {
            Ok(()) => return Ok(true),
            Err(e) if e.error_class.as_deref().is_some_and(|c| c.contains("ALREADY_EXISTS")) => return Ok(false),
            Err(e) if e.error_class.as_deref() == Some("SCHEMA_NOT_FOUND") => {
                // The first run on this cluster: the lease's database.
                client
                    .execute(&format!("CREATE DATABASE IF NOT EXISTS {}", quote_ident(database())), &[])
                    .map_err(spark_err("creating the fixpoint database"))?;
            }
            Err(e) => return Err(spark_err("taking a lease")(e)),
        }
    }
    Err(Error::Internal("spark: the fixpoint database vanished while a lease was taken".into()))
}

/// A lease this session holds.
#[derive(Debug, Clone)]
pub(crate) struct Held {
    pub prefix: String,
    pub generation: u64,
    pub owner: String,
}

impl Held {
    pub fn view(&self) -> TableName {
        view(&self.prefix, self.generation)
    }
}

/// Takes the lease on `scope`: `Ok(Ok(held))`, or `Ok(Err(holder))` when
/// another run holds it past `wait` (`holder` says which run, until when,
/// and which view).
pub(crate) fn acquire(client: &mut Client, scope: &str, lease: Duration, wait: Option<Duration>) -> Result<std::result::Result<Held, String>> {
    let prefix = prefix(scope);
    let owner = format!("{}", uuid::Uuid::new_v4());
    let deadline = wait.map(|w| Instant::now() + w);
    let mut said_waiting = false;
    loop {
        let listed = listing(client, &prefix)?;
        let next = match listed.last() {
            None => 0,
            Some((g, newest)) => {
                let g = *g;
                let held_by = match newest.clone() {
                    // The listing reads each view with its properties, so a
                    // listed generation is never gone; were it, the next
                    // one is free to create (creating is the atomic step).
                    State::Released | State::Gone => None,
                    State::Held { owner, until_ms } if until_ms <= now_ms() => {
                        eprintln!("fixpoint: taking over the expired lease on {scope} (run {owner} held it and stopped renewing it)");
                        None
                    }
                    State::Held { owner, until_ms } => Some(format!(
                        "run {owner}, for up to {} s more unless it renews it (lease {})",
                        until_ms.saturating_sub(now_ms()).div_ceil(1000),
                        view(&prefix, g)
                    )),
                    State::Unreadable(what) => Some(format!(
                        "lease {} cannot be read ({what}), so it counts as held; if no run holds it, drop it: DROP VIEW {}",
                        view(&prefix, g),
                        view(&prefix, g)
                    )),
                };
                if let Some(desc) = held_by {
                    if deadline.is_none_or(|d| Instant::now() >= d) {
                        return Ok(Err(desc));
                    }
                    if !said_waiting {
                        eprintln!("fixpoint: waiting for another run holding the lease on {scope}: {desc}");
                        said_waiting = true;
                    }
                    std::thread::sleep(Duration::from_millis(500));
                    continue;
                }
                g + 1
            }
        };
        if create(client, &prefix, next, &owner, lease)? {
            if said_waiting {
                eprintln!("fixpoint: got the lease on {scope}");
            }
            // Older generations are history: dropped (the newest is ours)
            // once a few have gathered, so that most runs spend no
            // statement on it.
            if listed.len() >= OLD_GENERATIONS_KEPT {
                for (g, _) in listed {
                    if let Err(e) = client.execute(&format!("DROP VIEW IF EXISTS {}", view(&prefix, g).quoted()), &[]) {
                        eprintln!("fixpoint: could not drop an old lease view {}: {e}", view(&prefix, g));
                    }
                }
            }
            return Ok(Ok(Held { prefix, generation: next, owner }));
        }
        // Another run created that generation first: look again.
    }
}

/// Whether `held` is still this run's, with at least `margin` ahead:
/// `Err(why)` when not.
pub(crate) fn check(client: &mut Client, held: &Held, margin: Duration) -> Result<std::result::Result<(), String>> {
    let listed = listing(client, &held.prefix)?;
    if let Some((newer, _)) = listed.iter().find(|(g, _)| *g > held.generation) {
        return Ok(Err(format!("another run took it over after it expired (lease {})", view(&held.prefix, *newer))));
    }
    let ours = listed.into_iter().find(|(g, _)| *g == held.generation).map_or(State::Gone, |(_, s)| s);
    Ok(match ours {
        State::Held { owner, until_ms } if owner == held.owner => {
            let left = until_ms.saturating_sub(now_ms());
            if left < margin.as_millis() as u64 {
                Err(format!("its renewal fell behind: it expires in {} ms (lease {})", left, held.view()))
            } else {
                Ok(())
            }
        }
        State::Gone => Err(format!("its view {} was dropped", held.view())),
        other => Err(format!("its view {} now says {other:?}", held.view())),
    })
}

/// Marks `held` released (the view stays: generation numbers only grow).
/// One statement, without reading the lease first: marking a generation
/// that another run has since taken over (a newer one exists) changes
/// nothing, since only the newest counts; one dropped since is left as it is.
pub(crate) fn release(client: &mut Client, held: &Held) -> Result<()> {
    match client.execute(&format!("ALTER VIEW {} SET TBLPROPERTIES ('fixpoint.released' = 'true', 'fixpoint.expires_ms' = '0')", held.view().quoted()), &[]) {
        Ok(()) => Ok(()),
        Err(e) if not_found(&e) => Ok(()),
        Err(e) => Err(spark_err("releasing a lease")(e)),
    }
}

enum Message {
    Hold(Held),
    /// Stop renewing; answered once no renewal of it is in flight.
    Drop(String, mpsc::Sender<()>),
}

/// Renews the leases a session holds, from a thread with a Spark session
/// of its own, every third of the lease.
/// Dropping it closes the channel, which ends the thread at once (it is
/// not joined: a renewal in flight may take a while).
pub(crate) struct Renewer {
    tx: mpsc::Sender<Message>,
}

impl Renewer {
    pub fn start(url: &str, connect_timeout: Duration, lease: Duration) -> Renewer {
        let (tx, rx) = mpsc::channel::<Message>();
        let url = url.to_owned();
        let every = (lease / 3).max(Duration::from_millis(200));
        std::thread::Builder::new()
            .name("fixpoint-lease-renewer".into())
            .spawn(move || {
                let mut client: Option<Client> = None;
                let mut held: HashMap<String, Held> = HashMap::new();
                let mut due = Instant::now() + every;
                loop {
                    match rx.recv_timeout(due.saturating_duration_since(Instant::now())) {
                        Ok(Message::Hold(h)) => {
                            held.insert(h.prefix.clone(), h);
                            continue;
                        }
                        Ok(Message::Drop(prefix, done)) => {
                            held.remove(&prefix);
                            let _ = done.send(());
                            continue;
                        }
                        Err(mpsc::RecvTimeoutError::Disconnected) => return,
                        Err(mpsc::RecvTimeoutError::Timeout) => {}
                    }
                    due = Instant::now() + every;
                    if held.is_empty() {
                        continue;
                    }
                    if client.is_none() {
                        match Client::connect(&url, connect_timeout).and_then(|mut c| crate::engine::set_up(&mut c).map(|()| c)) {
                            Ok(c) => client = Some(c),
                            Err(e) => {
                                eprintln!("fixpoint: could not connect to renew the run's lease (trying again in a few seconds): {e}");
                                due = Instant::now() + Duration::from_secs(5).min(every);
                                continue;
                            }
                        }
                    }
                    let c = client.as_mut().expect("connected above");
                    let mut lost = Vec::new();
                    for h in held.values() {
                        match renew(c, h, lease) {
                            Ok(true) => {}
                            Ok(false) => lost.push(h.prefix.clone()),
                            Err(e) => {
                                // An idle session's connection may have been
                                // closed: a new one tries again in a second,
                                // not a third of the lease later.
                                eprintln!("fixpoint: could not renew the lease {} (trying again on a new connection): {e}", h.view());
                                client = None;
                                due = Instant::now() + Duration::from_secs(1).min(every);
                                break;
                            }
                        }
                    }
                    for p in lost {
                        held.remove(&p);
                    }
                }
            })
            .expect("a thread");
        Renewer { tx }
    }

    pub fn hold(&self, held: &Held) {
        let _ = self.tx.send(Message::Hold(held.clone()));
    }

    /// Stops renewing the lease of `prefix`; `false` when the renewer did
    /// not confirm within `wait` (a renewal stuck in flight), so the lease
    /// must be left to expire rather than marked released: a renewal that
    /// lands after the release would write the old properties back.
    pub fn stop_renewing(&self, prefix: &str, wait: Duration) -> bool {
        let (done, confirmed) = mpsc::channel();
        if self.tx.send(Message::Drop(prefix.to_owned(), done)).is_err() {
            return true;
        }
        confirmed.recv_timeout(wait).is_ok()
    }
}

/// Pushes `held`'s expiry one lease ahead, if it is still this run's:
/// `Ok(false)` when it is not (released, taken over).
fn renew(client: &mut Client, held: &Held, lease: Duration) -> std::result::Result<bool, Error> {
    match state(client, &held.view())? {
        State::Held { owner, .. } if owner == held.owner => {}
        _ => return Ok(false),
    }
    let expires = now_ms() + lease.as_millis() as u64;
    client
        .execute(&format!("ALTER VIEW {} SET TBLPROPERTIES ('fixpoint.expires_ms' = {})", held.view().quoted(), lit(&expires.to_string())), &[])
        .map_err(spark_err("renewing a lease"))?;
    Ok(true)
}
