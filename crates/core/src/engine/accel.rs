//! What a plan asks an [`Accelerator`](super::Accelerator) and what it
//! answers: the requests of the two plans it can speed up (a day's insert,
//! a merge), their outcomes, and [`Accelerated`], which says whether it did
//! the work or declined it.

use chrono::NaiveDate;

use crate::engine::rows::{Column, Rows};
use crate::error::{FailPoint, Result};
use crate::fingerprint::Fingerprint;
use crate::job::spec::{Job, MergeSpec};
use crate::job::sql::{RunParams, Sql};

/// An accelerator's answer: the work done, or declined with the reason
/// (for the step trace). Declining is never wrong: the plan then does the
/// work the portable way, in a transaction of its own when the
/// accelerator had started writing.
#[derive(Debug)]
pub enum Accelerated<T> {
    /// Done, in the run's transaction; not committed.
    Done(T),
    /// Not done; nothing it wrote may be kept (the caller rolls back when
    /// it had let the accelerator write).
    Declined(&'static str),
}

/// What the plan lends an accelerated step of a run: its fail points (a
/// test's faults) and its step trace.
pub trait RunSteps {
    /// Stops the run here when a test asked for a fault at `at`.
    fn fail_point(&self, at: FailPoint) -> Result<()>;
    /// Notes that a step ended (`FIXPOINT_TRACE`).
    fn step(&mut self, what: &str);
}

/// The day's rows inserted into the target by `replace_partition`, its
/// guards and its fingerprint taken as they stream in (the day's old rows
/// are deleted already, in the same transaction).
pub struct DayInsert<'a> {
    /// The partition column (a DATE) as the source's rows hold it, under
    /// the alias the INSERT reads them as (`s."dt"`).
    pub partition: String,
    /// The partition column's name in the target (`dt`).
    pub column: &'a str,
    /// The target.
    pub target: &'a crate::job::ident::TableName,
    /// Whether the source is a file source's files as they are (the query
    /// `SELECT * FROM input`), each column of the target's type: an engine
    /// that stages files may copy them straight into the target.
    pub files_as_is: bool,
    /// The alias of the source's rows in the INSERT (`s`).
    pub alias: &'a str,
    /// The columns the fingerprint hashes, of `alias`.
    pub hashed: &'a [Column],
    /// The run's day: a row of another day is counted as outside.
    pub day: NaiveDate,
    /// Writes the `INSERT … SELECT`, with the given expression selected as
    /// the partition column.
    pub insert: &'a dyn Fn(&Sql) -> Sql,
    /// The guard scan of the source: its rows (`fp_rows`), the sum of
    /// their native hashes over `hashed` (`fp_sum`) and the rows outside
    /// the day (`outside`), for an engine that takes them beside the
    /// insert rather than on it (on the run's snapshot).
    pub guard_scan: &'a Sql,
    /// The plan's guards on the scan's counts (rows, rows outside the
    /// day): the refusal naming the problem, its sample row read by the
    /// given query function (which must read the source as the run does),
    /// or `Ok` where they hold.
    pub refuse: &'a dyn Fn(&mut dyn FnMut(&Sql) -> Result<Rows>, u64, u64) -> Result<()>,
}

/// What the tapped insert saw.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TappedDay {
    /// Rows inserted.
    pub inserted: u64,
    /// Of those, rows whose partition is not the day (NULL included).
    pub outside: u64,
    /// The sum of the inserted rows' native hashes over the hashed
    /// columns.
    pub sum: i128,
    /// How the rows were written, for the report's `method`:
    /// `delete+insert`, or `delete+copy` where a file source's files went
    /// straight into the target.
    pub method: &'static str,
}

/// A merge, as the plan has prepared it: inside its transaction, after
/// its lock, with the ledger ready, the source's new columns added and
/// the target created.
pub struct MergeRequest<'a> {
    /// The job.
    pub job: &'a Job,
    /// Its merge keys, version, tombstones and ties.
    pub spec: &'a MergeSpec,
    /// The run's parameters, bound into the source query.
    pub params: &'a RunParams,
    /// The source's columns, described.
    pub source_cols: &'a [Column],
    /// The target's columns now.
    pub target_cols: &'a [Column],
    /// The partition column the merge is pruned to, when it is.
    pub prune: Option<&'a str>,
    /// The source's column names, in order.
    pub names: &'a [String],
    /// The columns that tell two rows of one key and version apart.
    pub compared: &'a [String],
    /// The job's metadata columns the source has.
    pub meta_cols: &'a [String],
    /// The source's fingerprinted columns (all but the metadata).
    pub input_cols: &'a [Column],
}

/// What a merge did.
#[derive(Debug, Clone)]
pub struct Merged {
    /// The input fingerprint (the source's rows, metadata aside).
    pub input: Fingerprint,
    /// The batch's keys as the target holds them after the merge.
    pub output: Fingerprint,
    /// Keys inserted.
    pub inserts: u64,
    /// Keys updated.
    pub updates: u64,
    /// Keys deleted (tombstones).
    pub deletes: u64,
    /// Rows of the batch after the dedup (one a key).
    pub batch_rows: u64,
    /// Source rows the dedup dropped.
    pub duplicates_collapsed: u64,
    /// Rows the touched keys had before the merge, when an audit compares
    /// row counts.
    pub rows_before: Option<u64>,
    /// How it was done, for the report.
    pub method: &'static str,
}
