//! A tap on the rows of a run's `INSERT … SELECT`: as they stream into the
//! target, a scalar function counts them, counts those outside the run's
//! partition, and sums their native row hashes, passing the partition value
//! through unchanged. The guards and the output fingerprint then cost no scan
//! of their own (on a 5M-row day they were ~40 ms of a ~260 ms run).
//!
//! It sits in the SELECT list, as the partition column's value
//! (`fixpoint_tap(token, hash(c1, …, cn), dt)`, the run date kept with the
//! tap: [`Taps::open_partition`]): a projection is evaluated
//! once per row that reaches the INSERT, unlike a filter, which the optimizer
//! may reorder before the source's own conditions. DuckDB hands a C API
//! scalar function every row of a chunk, NULLs included (only a constant
//! NULL argument folds the call away), so the function reads the validity
//! itself: a NULL partition value passes through as NULL and is not seen,
//! and the caller counts it as outside the partition from the difference
//! between rows inserted and rows seen.
//!
//! What the taps see belongs to the connection: a [`Taps`] shared by the
//! engine and the functions registered on its connection, never a
//! process-wide table.

use std::collections::HashMap;
use std::error::Error as StdError;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use duckdb::core::{DataChunkHandle, LogicalTypeId};
use duckdb::vscalar::{ScalarFunctionSignature, VScalar};
use duckdb::vtab::arrow::WritableVector;

/// The SQL name.
pub const FUNCTION: &str = "fixpoint_tap";
/// The counting condition's SQL name: `fixpoint_tap_if(token, cond,
/// allowed) -> BOOLEAN` is `cond` (FALSE where NULL), counting the rows
/// where it is TRUE, and fails the statement with
/// [`REFUSED`] on a row where `cond` is TRUE and `allowed` is not (the tap
/// marked refused: [`Taps::refused`]). (In a MERGE's `WHEN MATCHED AND …`: the
/// rows updated, and a refusal, for the price of two comparisons; the
/// same in nested `CASE`s cost twice as much.)
pub const IF_FUNCTION: &str = "fixpoint_tap_if";
/// The counting tap's SQL name: `fixpoint_tap_rows(token, hash) -> BOOLEAN`,
/// TRUE for every row it sees (a row whose hash is NULL is not seen, and
/// the result is NULL), counting the rows and summing the hashes.
pub const ROWS_FUNCTION: &str = "fixpoint_tap_rows";
/// The dedup tap's SQL name: `fixpoint_tap_dedup(token, hash, pair, row) ->
/// BOOLEAN`, TRUE for every row: counts the rows and sums their hashes (the
/// input fingerprint of a merge batch), and looks for ties: two rows with
/// the same `pair` (a hash of key, version and tombstone flag) and different
/// `row` hashes (of what tells rows apart). A NULL `row` is not compared,
/// but no argument of it may be NULL where every row must be counted: DuckDB
/// skips the call for a chunk whose argument is a constant NULL.
pub const DEDUP_FUNCTION: &str = "fixpoint_tap_dedup";

/// The refusal's SQL name: `fixpoint_tap_refuse(token) -> BOOLEAN` fails
/// the statement on the first row it is evaluated on, and marks the tap
/// `token` refused ([`Taps::refused`]): in a `CASE` branch, a row the plan
/// does not decide (a NULL key, a key held in a partition the batch does
/// not touch) stops the statement, and the plan knows it was its own
/// refusal, not the database's error, without reading the message.
pub const REFUSE_FUNCTION: &str = "fixpoint_tap_refuse";

/// The message a refusal fails its statement with (for the user, should it
/// ever reach one: the plan reads [`Taps::refused`], not this text).
pub const REFUSED: &str = "fixpoint: the statement met a row its plan leaves to another (rolled back)";

/// How many rows' (key, version) pairs the dedup tap remembers by default
/// (16 bytes a row, at most ~134 MiB with the list's spare room). Past it
/// the tap reports a possible tie and the caller takes the plan that checks
/// ties with a join.
pub const DEDUP_LIMIT: usize = 7 << 20;

/// What a tap saw.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Seen {
    /// Rows that reached the function (all but those with a NULL partition).
    pub rows: u64,
    /// Of those, rows whose partition value was not the run's date.
    pub outside: u64,
    /// Sum of their row hashes.
    pub sum: i128,
}

/// What the dedup tap saw.
#[derive(Debug, Default)]
pub struct Dedup {
    /// Rows that reached the function.
    pub rows: u64,
    /// Sum of their hashes.
    pub sum: i128,
    /// Rows whose (key, version) has another row hash, the smallest row
    /// hash of the pair aside; or 1 when more rows came than the tap
    /// remembers.
    pub ties: u64,
    /// Each compared row's (pair, row hash), in arrival order: appending
    /// is what a row costs; the ties are found once, at close, by sorting
    /// (a map updated per row cost ~200 ns a row, most of the dedup's time).
    seen: Vec<(u64, u64)>,
    /// More rows came than `limit`.
    overflow: bool,
    /// How many rows it remembers.
    limit: usize,
    /// Its ties being counted already (on another thread), started by the
    /// first row of a tap that sits above a blocking window over it
    /// ([`count_ties_after`]): `seen` was handed to the count.
    counting: Option<JoinOnDrop>,
    /// A row came after the count started (the plan was not the one the
    /// trigger assumes): the count is not to be trusted.
    late: bool,
}

/// The taps of one connection: what each open tap has seen, by token.
/// Cloned into the functions registered on the connection (an `Arc`: one
/// state), so a tap's rows are counted where the engine that opened it
/// reads them, and nowhere else.
#[derive(Clone)]
pub struct Taps(Arc<State>);

struct State {
    next: AtomicU64,
    /// How many rows the dedup taps opened from now on remember.
    limit: AtomicUsize,
    /// The run date (days since 1970-01-01, as DuckDB stores a DATE) of
    /// each open partition tap.
    days: Mutex<HashMap<u64, i32>>,
    /// What each counting or partition tap saw (an entry once rows came).
    seen: Mutex<HashMap<u64, Seen>>,
    /// Each open dedup tap.
    dedups: Mutex<HashMap<u64, Dedup>>,
    /// Taps whose first row starts the count of a dedup tap's ties: kept
    /// tap's token -> dedup tap's token.
    after: Mutex<HashMap<u64, u64>>,
    /// The taps that refused a row.
    refused: Mutex<std::collections::HashSet<u64>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Default for Taps {
    fn default() -> Taps {
        Taps::new()
    }
}

impl Taps {
    /// No tap open.
    pub fn new() -> Taps {
        Taps(Arc::new(State {
            next: AtomicU64::new(1),
            limit: AtomicUsize::new(DEDUP_LIMIT),
            days: Mutex::default(),
            seen: Mutex::default(),
            dedups: Mutex::default(),
            after: Mutex::default(),
            refused: Mutex::default(),
        }))
    }

    /// Sets how many rows the dedup taps opened from now on remember (tests).
    pub fn set_dedup_limit(&self, pairs: usize) {
        self.0.limit.store(pairs, Ordering::Relaxed);
    }

    /// A new tap's token (nothing is kept until rows arrive); it goes into
    /// the SQL as a bound parameter.
    pub fn open(&self) -> u64 {
        self.0.next.fetch_add(1, Ordering::Relaxed)
    }

    /// A new partition tap's token for the run date `day` (days since
    /// 1970-01-01, as DuckDB stores a DATE).
    pub fn open_partition(&self, day: i32) -> u64 {
        let token = self.open();
        lock(&self.0.days).insert(token, day);
        token
    }

    /// A new dedup tap's token.
    pub fn open_dedup(&self) -> u64 {
        let token = self.open();
        let limit = self.0.limit.load(Ordering::Relaxed);
        lock(&self.0.dedups).insert(token, Dedup { limit, ..Dedup::default() });
        token
    }

    /// Whether the tap `token` refused a row ([`REFUSE_FUNCTION`], or
    /// [`IF_FUNCTION`] where its row was not allowed); forgets it.
    pub fn refused(&self, token: u64) -> bool {
        lock(&self.0.refused).remove(&token)
    }

    fn refuse(&self, token: u64) {
        lock(&self.0.refused).insert(token);
    }

    /// Whether `token` is an open dedup tap's.
    pub fn is_dedup(&self, token: u64) -> bool {
        lock(&self.0.dedups).contains_key(&token)
    }

    /// Closes a tap and returns what it saw (nothing, when no row reached it).
    pub fn close(&self, token: u64) -> Seen {
        lock(&self.0.days).remove(&token);
        lock(&self.0.seen).remove(&token).unwrap_or_default()
    }

    /// Counts `rows` seen by the tap `token` (`outside` its day) and their
    /// hashes' `sum`.
    fn add(&self, token: u64, rows: u64, outside: u64, sum: i128) {
        let mut seen = lock(&self.0.seen);
        let seen = seen.entry(token).or_default();
        seen.rows += rows;
        seen.outside += outside;
        seen.sum += sum;
    }

    /// The run date of the open partition tap `token`.
    fn day(&self, token: u64) -> Option<i32> {
        lock(&self.0.days).get(&token).copied()
    }

    /// When the tap `token` first sees a row, every row of the dedup tap
    /// `dedup` has been seen (the tap sits above a blocking window whose
    /// input holds the dedup tap): its ties are then counted on another
    /// thread while the statement goes on, instead of after it. Should a
    /// row reach the dedup tap after all, the count reports a possible tie
    /// and the caller takes the plan that checks ties with a join.
    pub fn count_ties_after(&self, token: u64, dedup: u64) {
        lock(&self.0.after).insert(token, dedup);
    }

    /// Whether the dedup tap `dedup`'s ties are being counted already
    /// ([`Taps::count_ties_after`]).
    pub fn counting(&self, dedup: u64) -> bool {
        lock(&self.0.dedups).get(&dedup).is_some_and(|d| d.counting.is_some())
    }

    /// The trigger of [`Taps::count_ties_after`], on a tap's first row (on
    /// its other rows, one uncontended lock and a lookup that finds nothing).
    fn start_counting(&self, token: u64) {
        let Some(dedup) = lock(&self.0.after).remove(&token) else { return };
        let mut dedups = lock(&self.0.dedups);
        let Some(d) = dedups.get_mut(&dedup) else { return };
        if d.overflow || d.counting.is_some() || d.seen.len() < 1 << 12 {
            return;
        }
        let seen = std::mem::take(&mut d.seen);
        if let Ok(handle) = std::thread::Builder::new().name("fixpoint-ties".into()).spawn(move || count_ties(seen)) {
            d.counting = Some(JoinOnDrop(Some(handle)));
        } else {
            // No thread: the tie is reported, the next plan checks with a join.
            d.overflow = true;
        }
    }

    /// Closes a dedup tap and returns what it saw, its ties counted (its
    /// memory freed).
    pub fn close_dedup(&self, token: u64) -> Dedup {
        let (rows, sum, ties) = self.close_dedup_deferred(token);
        Dedup { rows, sum, ties: ties(), ..Dedup::default() }
    }

    /// Closes a dedup tap: its rows and hash sum at once, its ties counted
    /// on other threads, waited for by the function returned (the caller
    /// does the run's last statements meanwhile).
    pub fn close_dedup_deferred(&self, token: u64) -> (u64, i128, Box<dyn FnOnce() -> u64 + Send>) {
        let mut d = lock(&self.0.dedups).remove(&token).unwrap_or_default();
        let seen = std::mem::take(&mut d.seen);
        lock(&self.0.after).retain(|_, d| *d != token);
        if d.overflow || d.late {
            return (d.rows, d.sum, Box::new(|| 1));
        }
        if let Some(mut counting) = d.counting.take() {
            return (d.rows, d.sum, Box::new(move || counting.join()));
        }
        if seen.len() < 1 << 12 {
            let ties = count_ties(seen);
            return (d.rows, d.sum, Box::new(move || ties));
        }
        let spawned = std::thread::Builder::new().name("fixpoint-ties".into()).spawn(move || count_ties(seen));
        match spawned {
            // The thread is joined when the function is called or, uncalled
            // (the run left early), when it is dropped: none outlives the
            // run. A counting thread that died (it cannot, short of a panic)
            // counts as a tie: the caller then takes the plan that checks
            // with a join.
            Ok(handle) => {
                let mut counting = JoinOnDrop(Some(handle));
                (d.rows, d.sum, Box::new(move || counting.join()))
            }
            Err(_) => (d.rows, d.sum, Box::new(|| 1)),
        }
    }
}

/// A counting thread, joined at the latest when dropped.
#[derive(Debug)]
struct JoinOnDrop(Option<std::thread::JoinHandle<u64>>);

impl JoinOnDrop {
    fn join(&mut self) -> u64 {
        self.0.take().map_or(1, |h| h.join().unwrap_or(1))
    }
}

impl Drop for JoinOnDrop {
    fn drop(&mut self) {
        self.join();
    }
}

/// Rows whose pair has another row hash, the smallest row hash of each
/// pair aside. The pairs are hashes, so their top bits spread them evenly:
/// one pass scatters them into buckets of 32–64 rows by those bits, and
/// each bucket's pairs are counted in a small open-addressing table that
/// stays in cache (a sort of the whole list cost ~8 ms of a 198k-row
/// batch, most of the tap's time; a sort of each bucket ~3.5 ms, ~130
/// instructions a row; the table ~25).
fn count_ties(seen: Vec<(u64, u64)>) -> u64 {
    let n = seen.len();
    if n < 2 {
        return 0;
    }
    let bits = (usize::BITS - (n / 64).leading_zeros()).clamp(1, 16);
    let bucket = |pair: u64| (pair >> (64 - bits)) as usize;
    let mut starts = vec![0usize; (1 << bits) + 1];
    for &(pair, _) in &seen {
        starts[bucket(pair) + 1] += 1;
    }
    for i in 1..starts.len() {
        starts[i] += starts[i - 1];
    }
    let mut next = starts.clone();
    let mut scattered = vec![(0u64, 0u64); n];
    for &(pair, row) in &seen {
        let b = bucket(pair);
        scattered[next[b]] = (pair, row);
        next[b] += 1;
    }
    drop(seen);
    // Each bucket sorted by pair alone; the two halves of the buckets on
    // two threads (DuckDB's are idle once the statement is done).
    let count = |buckets: &[usize], rows: &mut [(u64, u64)]| -> u64 {
        let base = buckets[0];
        let widest = buckets.windows(2).map(|w| w[1] - w[0]).max().unwrap_or(0);
        let mut table = BucketTable::new(widest);
        let mut ties = 0;
        for w in buckets.windows(2) {
            ties += table.ties(&rows[w[0] - base..w[1] - base]);
        }
        ties
    };
    if n < 1 << 16 {
        return count(&starts, &mut scattered);
    }
    let mid = starts.len() / 2;
    let (low, high) = scattered.split_at_mut(starts[mid]);
    let (low_starts, high_starts) = (&starts[..=mid], &starts[mid..]);
    std::thread::scope(|s| {
        let other = s.spawn(|| count(high_starts, high));
        count(low_starts, low) + other.join().unwrap_or_else(|e| std::panic::resume_unwind(e))
    })
}

/// Per pair of one bucket: the smallest row hash, how many rows carry it,
/// how many rows in all. A slot belongs to the bucket being counted when
/// its generation is the table's (no clearing between buckets).
struct BucketTable {
    slots: Vec<Slot>,
    used: Vec<u32>,
    generation: u32,
}

#[derive(Clone, Copy, Default)]
struct Slot {
    generation: u32,
    pair: u64,
    least: u64,
    at_least: u64,
    rows: u64,
}

impl BucketTable {
    /// A table for buckets of at most `widest` rows (at most half full).
    fn new(widest: usize) -> BucketTable {
        let size = (widest * 2).next_power_of_two().max(2);
        BucketTable { slots: vec![Slot::default(); size], used: Vec::with_capacity(widest), generation: 0 }
    }

    /// The rows of `bucket` whose pair has another row hash, the smallest
    /// row hash of each pair aside.
    fn ties(&mut self, bucket: &[(u64, u64)]) -> u64 {
        self.generation += 1;
        self.used.clear();
        let mask = self.slots.len() - 1;
        for &(pair, row) in bucket {
            // The low bits: the top ones chose the bucket.
            let mut i = pair as usize & mask;
            loop {
                let slot = &mut self.slots[i];
                if slot.generation != self.generation {
                    *slot = Slot { generation: self.generation, pair, least: row, at_least: 1, rows: 1 };
                    self.used.push(i as u32);
                    break;
                }
                if slot.pair == pair {
                    slot.rows += 1;
                    if row < slot.least {
                        (slot.least, slot.at_least) = (row, 1);
                    } else if row == slot.least {
                        slot.at_least += 1;
                    }
                    break;
                }
                i = (i + 1) & mask;
            }
        }
        self.used.iter().map(|&i| self.slots[i as usize]).map(|s| s.rows - s.at_least).sum()
    }
}

/// The sum of `hashes` as an i128, in two u64 lanes (low and high halves;
/// a chunk holds at most 2^32 rows, so neither overflows): vectorizable,
/// unlike a running i128 sum.
fn sum_hashes(hashes: &[u64]) -> i128 {
    // (Wrapping adds, which never wrap here: the dev profile's overflow
    // checks would keep the loop from being vectorized.)
    let (mut lo, mut hi) = (0u64, 0u64);
    for &h in hashes {
        lo = lo.wrapping_add(h & 0xffff_ffff);
        hi = hi.wrapping_add(h >> 32);
    }
    (i128::from(hi) << 32) + i128::from(lo)
}

/// Whether a flattened constant argument holds one value: DuckDB fills
/// each slot of a flattened constant with it, so the ends tell.
fn one_value<T: PartialEq + Copy>(v: &[T]) -> Option<T> {
    match (v.first(), v.last()) {
        (Some(&a), Some(&b)) if a == b => Some(a),
        _ => None,
    }
}

/// Registers the functions on `conn`, counting into `taps`.
pub fn register(conn: &duckdb::Connection, taps: &Taps) -> duckdb::Result<()> {
    conn.register_scalar_function_with_state::<Tap>(FUNCTION, taps)?;
    conn.register_scalar_function_with_state::<TapRows>(ROWS_FUNCTION, taps)?;
    conn.register_scalar_function_with_state::<TapIf>(IF_FUNCTION, taps)?;
    conn.register_scalar_function_with_state::<TapRefuse>(REFUSE_FUNCTION, taps)?;
    conn.register_scalar_function_with_state::<TapDedup>(DEDUP_FUNCTION, taps)
}

struct TapRefuse;

impl VScalar for TapRefuse {
    type State = Taps;

    fn invoke(taps: &Taps, input: &mut DataChunkHandle, _output: &mut dyn WritableVector) -> Result<(), Box<dyn StdError>> {
        let rows = input.len();
        if rows == 0 {
            return Ok(());
        }
        // SAFETY: the signature is (UBIGINT); DuckDB hands a flattened
        // vector of `rows` values.
        let v0 = input.flat_vector(0);
        let tokens = unsafe { v0.as_slice_with_len::<u64>(rows) };
        let token = one_value(tokens).ok_or_else(|| format!("{REFUSE_FUNCTION}: one token per call site"))?;
        taps.refuse(token);
        Err(REFUSED.into())
    }

    fn signatures() -> Vec<ScalarFunctionSignature> {
        vec![ScalarFunctionSignature::exact(vec![LogicalTypeId::UBigint.into()], LogicalTypeId::Boolean.into())]
    }

    fn volatile() -> bool {
        true
    }
}

/// The validity mask of column `idx` of `input`: one bit per row, 0 for
/// NULL; a null pointer when every row is valid.
fn validity(input: &DataChunkHandle, idx: u64) -> *const u64 {
    // SAFETY: `idx` is a column of the chunk the signature declares.
    unsafe { duckdb::ffi::duckdb_vector_get_validity(duckdb::ffi::duckdb_data_chunk_get_vector(input.get_ptr(), idx)) }
}

fn is_null(mask: *const u64, row: usize) -> bool {
    // SAFETY: a non-null mask holds one bit per row of the chunk.
    !mask.is_null() && unsafe { *mask.add(row / 64) } & (1u64 << (row % 64)) == 0
}

struct TapRows;

impl VScalar for TapRows {
    type State = Taps;

    fn invoke(taps: &Taps, input: &mut DataChunkHandle, output: &mut dyn WritableVector) -> Result<(), Box<dyn StdError>> {
        let rows = input.len();
        if rows == 0 {
            return Ok(());
        }
        // SAFETY: the signature is (UBIGINT, UBIGINT); DuckDB hands flattened
        // vectors of `rows` values. A NULL hash is not seen and gives NULL
        // (checked here: a chunk may reach the function with NULL rows).
        let (v0, v1) = (input.flat_vector(0), input.flat_vector(1));
        let (tokens, hashes) = unsafe { (v0.as_slice_with_len::<u64>(rows), v1.as_slice_with_len::<u64>(rows)) };
        let token = one_value(tokens).ok_or_else(|| format!("{ROWS_FUNCTION}: one token per call site"))?;
        taps.start_counting(token);
        let mut out = output.flat_vector();
        // SAFETY: the result is a BOOLEAN vector with room for `rows` values.
        unsafe { out.as_mut_slice_with_len::<bool>(rows) }.fill(true);
        let mask = validity(input, 1);
        if mask.is_null() {
            taps.add(token, rows as u64, 0, sum_hashes(hashes));
            return Ok(());
        }
        let (mut seen, mut sum) = (0u64, 0i128);
        for (r, &h) in hashes.iter().enumerate() {
            if is_null(mask, r) {
                out.set_null(r);
            } else {
                seen += 1;
                sum += i128::from(h);
            }
        }
        taps.add(token, seen, 0, sum);
        Ok(())
    }

    fn signatures() -> Vec<ScalarFunctionSignature> {
        vec![ScalarFunctionSignature::exact(vec![LogicalTypeId::UBigint.into(), LogicalTypeId::UBigint.into()], LogicalTypeId::Boolean.into())]
    }

    fn volatile() -> bool {
        true
    }
}

struct TapIf;

impl VScalar for TapIf {
    type State = Taps;

    fn invoke(taps: &Taps, input: &mut DataChunkHandle, output: &mut dyn WritableVector) -> Result<(), Box<dyn StdError>> {
        let rows = input.len();
        if rows == 0 {
            return Ok(());
        }
        // SAFETY: the signature is (UBIGINT, BOOLEAN, BOOLEAN); DuckDB hands
        // flattened vectors of `rows` values (a NULL's slot is read, then
        // set aside by its validity bit).
        let (v0, v1, v2) = (input.flat_vector(0), input.flat_vector(1), input.flat_vector(2));
        let (tokens, conds, allowed) =
            unsafe { (v0.as_slice_with_len::<u64>(rows), v1.as_slice_with_len::<u8>(rows), v2.as_slice_with_len::<u8>(rows)) };
        let token = one_value(tokens).ok_or_else(|| format!("{IF_FUNCTION}: one token per call site"))?;
        let mut out = output.flat_vector();
        // SAFETY: the result is a BOOLEAN vector with room for `rows` values.
        let out = unsafe { out.as_mut_slice_with_len::<u8>(rows) };
        // (A constant NULL argument never reaches here: DuckDB's default
        // NULL handling answers NULL for the whole chunk without calling
        // the function, so such a row is neither counted nor refused. The
        // merge's read of the keys it left alone finds it, and falls back.)
        let (cond_mask, allowed_mask) = (validity(input, 1), validity(input, 2));
        let (mut taken, mut refused) = (0u64, false);
        for r in 0..rows {
            let c = conds[r] != 0 && !is_null(cond_mask, r);
            let a = allowed[r] != 0 && !is_null(allowed_mask, r);
            out[r] = u8::from(c);
            taken += u64::from(c);
            refused |= c && !a;
        }
        if refused {
            taps.refuse(token);
            return Err(REFUSED.into());
        }
        taps.add(token, taken, 0, 0);
        Ok(())
    }

    fn signatures() -> Vec<ScalarFunctionSignature> {
        vec![ScalarFunctionSignature::exact(
            vec![LogicalTypeId::UBigint.into(), LogicalTypeId::Boolean.into(), LogicalTypeId::Boolean.into()],
            LogicalTypeId::Boolean.into(),
        )]
    }

    fn volatile() -> bool {
        true
    }
}

struct TapDedup;

impl VScalar for TapDedup {
    type State = Taps;

    fn invoke(taps: &Taps, input: &mut DataChunkHandle, output: &mut dyn WritableVector) -> Result<(), Box<dyn StdError>> {
        let rows = input.len();
        if rows == 0 {
            return Ok(());
        }
        // SAFETY: the signature is (UBIGINT, UBIGINT, UBIGINT, UBIGINT);
        // DuckDB hands flattened vectors of `rows` values. The token, the
        // hash and the pair are never NULL (hashes); a NULL row hash is
        // read from the validity and not compared.
        let (v0, v1, v2, v3) = (input.flat_vector(0), input.flat_vector(1), input.flat_vector(2), input.flat_vector(3));
        let (tokens, hashes, pairs, row_hashes) = unsafe {
            (
                v0.as_slice_with_len::<u64>(rows),
                v1.as_slice_with_len::<u64>(rows),
                v2.as_slice_with_len::<u64>(rows),
                v3.as_slice_with_len::<u64>(rows),
            )
        };
        let token = one_value(tokens).ok_or_else(|| format!("{DEDUP_FUNCTION}: one token per call site"))?;
        let mut out = output.flat_vector();
        // SAFETY: the result is a BOOLEAN vector with room for `rows` values.
        unsafe { out.as_mut_slice_with_len::<bool>(rows) }.fill(true);
        let sum = sum_hashes(hashes);
        let mask = validity(input, 3);
        let mut dedups = lock(&taps.0.dedups);
        let d = dedups.entry(token).or_insert_with(|| Dedup { limit: taps.0.limit.load(Ordering::Relaxed), ..Dedup::default() });
        d.rows += rows as u64;
        d.sum += sum;
        if d.counting.is_some() {
            d.late = true;
        }
        if d.overflow || d.late {
            return Ok(());
        }
        if d.seen.len() + rows > d.limit {
            d.overflow = true;
            d.seen = Vec::new();
            return Ok(());
        }
        if mask.is_null() {
            d.seen.extend(pairs.iter().copied().zip(row_hashes.iter().copied()));
        } else {
            d.seen.extend(pairs.iter().zip(row_hashes).enumerate().filter(|(r, _)| !is_null(mask, *r)).map(|(_, (&kv, &h))| (kv, h)));
        }
        Ok(())
    }

    fn signatures() -> Vec<ScalarFunctionSignature> {
        vec![ScalarFunctionSignature::exact((0..4).map(|_| LogicalTypeId::UBigint.into()).collect(), LogicalTypeId::Boolean.into())]
    }

    fn volatile() -> bool {
        true
    }
}

struct Tap;

impl VScalar for Tap {
    type State = Taps;

    fn invoke(taps: &Taps, input: &mut DataChunkHandle, output: &mut dyn WritableVector) -> Result<(), Box<dyn StdError>> {
        let rows = input.len();
        if rows == 0 {
            return Ok(());
        }
        // SAFETY: the signature is (UBIGINT, UBIGINT, DATE); DuckDB hands
        // flattened vectors of `rows` values. The token and the hash are
        // never NULL; a NULL partition value is passed through as NULL and
        // not seen (its slot holds no date).
        let (v0, v1, v2) = (input.flat_vector(0), input.flat_vector(1), input.flat_vector(2));
        let (tokens, hashes, days) =
            unsafe { (v0.as_slice_with_len::<u64>(rows), v1.as_slice_with_len::<u64>(rows), v2.as_slice_with_len::<i32>(rows)) };
        let mut out = output.flat_vector();
        // SAFETY: the result is a DATE vector with room for `rows` values.
        unsafe { out.as_mut_slice_with_len::<i32>(rows) }.copy_from_slice(days);
        let token = one_value(tokens).ok_or_else(|| format!("{FUNCTION}: one token per statement"))?;
        let day = taps.day(token).ok_or_else(|| format!("{FUNCTION}: no partition tap {token} is open"))?;
        let (seen, outside, sum);
        let mask = validity(input, 2);
        if mask.is_null() {
            // Every row valid: the common case, two vectorizable passes.
            seen = rows as u64;
            outside = days.iter().fold(0u64, |n, &d| n.wrapping_add(u64::from(d != day)));
            sum = sum_hashes(hashes);
        } else {
            let (mut s, mut o, mut h) = (0u64, 0u64, 0i128);
            for (r, (&d, &x)) in days.iter().zip(hashes).enumerate() {
                if is_null(mask, r) {
                    out.set_null(r);
                } else {
                    s += 1;
                    o += u64::from(d != day);
                    h += i128::from(x);
                }
            }
            (seen, outside, sum) = (s, o, h);
        }
        taps.add(token, seen, outside, sum);
        Ok(())
    }

    fn signatures() -> Vec<ScalarFunctionSignature> {
        vec![ScalarFunctionSignature::exact(
            vec![LogicalTypeId::UBigint.into(), LogicalTypeId::UBigint.into(), LogicalTypeId::Date.into()],
            LogicalTypeId::Date.into(),
        )]
    }

    fn volatile() -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::{count_ties, one_value, sum_hashes, Taps};

    /// A partition tap keeps its run date, any DATE DuckDB holds, until it
    /// is closed; its token is a positive BIGINT, not a dedup tap's; two
    /// connections' taps are apart.
    #[test]
    fn partition_taps_keep_the_run_date() {
        let (taps, other) = (Taps::new(), Taps::new());
        for day in [-719_162, -1, 0, 1, 20_746, 2_932_896, i32::MIN, i32::MAX] {
            let token = taps.open_partition(day);
            assert_eq!(taps.day(token), Some(day));
            assert!(!taps.is_dedup(token) && i64::try_from(token).is_ok(), "{token}");
            assert_eq!(other.day(token), None, "another connection's taps know nothing of it");
            taps.close(token);
            assert_eq!(taps.day(token), None, "closed");
        }
        assert_ne!(taps.open_partition(5), taps.open_partition(5), "each tap its own token");
        let dedup = taps.open_dedup();
        assert!(taps.is_dedup(dedup) && !other.is_dedup(dedup));
    }

    #[test]
    fn hashes_sum_in_two_lanes_as_in_one() {
        let hashes: Vec<u64> = (0..2048u64).map(|i| u64::MAX - i * 0x9e37_79b9).collect();
        let plain: i128 = hashes.iter().map(|&h| i128::from(h)).sum();
        assert_eq!(sum_hashes(&hashes), plain);
        assert_eq!(sum_hashes(&[]), 0);
        assert_eq!(one_value(&[7u64, 7, 7]), Some(7));
        assert_eq!(one_value(&[7u64, 7, 8]), None);
        assert_eq!(one_value::<u64>(&[]), None);
    }

    /// The bucketed count equals the plain one: sort everything, and per
    /// pair count the rows whose hash is not the smallest.
    #[test]
    fn bucketed_ties_equal_a_full_sort() {
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let mut rand = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for n in [0usize, 1, 2, 3, 63, 64, 65, 1000, 70_000, 300_000] {
            let mut seen: Vec<(u64, u64)> = Vec::with_capacity(n);
            while seen.len() < n {
                // Repeated pairs (copies and ties), pairs in one bucket.
                let pair = match rand() % 4 {
                    0 if !seen.is_empty() => seen[(rand() as usize) % seen.len()].0,
                    1 => rand() & 0xff,
                    _ => rand(),
                };
                seen.push((pair, rand() % 3));
            }
            let mut plain = seen.clone();
            plain.sort_unstable();
            let expected: u64 = plain.chunk_by(|a, b| a.0 == b.0).map(|run| run.iter().filter(|r| r.1 != run[0].1).count() as u64).sum();
            assert_eq!(count_ties(seen), expected, "{n} rows");
            if n >= 1000 {
                assert!(expected > 0, "the test data has ties");
            }
        }
    }
}
