//! The taps (`fixpoint_tap`, `fixpoint_tap_rows`) on rows with NULLs: a row
//! whose tapped value is NULL is not seen and stays NULL. (DuckDB hands a C
//! API scalar function every row of a chunk, NULLs included; only a
//! constant NULL argument folds the call away.)

use fixpoint_duckdb::{tap, DuckDb};

fn db() -> DuckDb {
    DuckDb::open_in_memory().unwrap()
}

#[test]
fn the_partition_tap_passes_nulls_through_unseen() {
    let db = db();
    let token = db.taps().open_partition(0);
    let (rows, nulls, epoch): (i64, i64, i64) = db
        .connection()
        .query_row(
            &format!(
                "SELECT count(*), count(*) FILTER (WHERE d IS NULL), count(*) FILTER (WHERE d = DATE '1970-01-01') FROM (
                   SELECT {}(CAST(? AS UBIGINT), hash(i), CASE WHEN i % 2 = 0 THEN NULL ELSE DATE '1970-01-01' + CAST(i % 3 AS INTEGER) END) AS d
                   FROM range(10000) AS r(i))",
                tap::FUNCTION
            ),
            [token as i64],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
        )
        .unwrap();
    let seen = db.taps().close(token);
    assert_eq!((rows, nulls), (10000, 5000), "NULL stays NULL");
    assert_eq!(seen.rows, 5000, "a NULL is not seen");
    // Of the odd i, those with i % 3 == 0 are on the day; the others are outside.
    let on_day = (0..10000).filter(|i| i % 2 == 1 && i % 3 == 0).count() as i64;
    assert_eq!(epoch, on_day);
    assert_eq!(seen.outside, 5000 - on_day as u64);
}

#[test]
fn the_counting_tap_sees_only_non_null_hashes() {
    let db = db();
    let token = db.taps().open();
    let (trues, nulls, expected): (i64, i64, String) = db
        .connection()
        .query_row(
            &format!(
                "SELECT count(*) FILTER (WHERE m), count(*) FILTER (WHERE m IS NULL), CAST(sum(h) FILTER (WHERE i % 3 <> 0) AS VARCHAR) FROM (
                   SELECT i, hash(i) AS h, {}(CAST(? AS UBIGINT), CASE WHEN i % 3 <> 0 THEN hash(i) END) AS m FROM range(10000) AS r(i))",
                tap::ROWS_FUNCTION
            ),
            [token as i64],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
        )
        .unwrap();
    let seen = db.taps().close(token);
    let n = (0..10000).filter(|i| i % 3 != 0).count() as i64;
    assert_eq!((trues, nulls), (n, 10000 - n));
    assert_eq!((seen.rows as i64, seen.sum.to_string()), (n, expected));
}

/// `fixpoint_tap_dedup(token, hash, pair, row)` over `sql`'s rows (columns
/// h, pair, row): what it returned and what it saw, closed at once or
/// (`deferred`) with its ties counted on other threads.
fn dedup_closed(db: &DuckDb, from: &str, deferred: bool) -> (i64, tap::Dedup) {
    let token = db.taps().open_dedup();
    let trues: i64 = db
        .connection()
        .query_row(
            &format!("SELECT count(*) FILTER (WHERE m) FROM (SELECT {}(CAST(? AS UBIGINT), CAST(h AS UBIGINT), CAST(pair AS UBIGINT), CAST(row AS UBIGINT)) AS m FROM ({from}))", tap::DEDUP_FUNCTION),
            [token as i64],
            |r| r.get(0),
        )
        .unwrap();
    if deferred {
        let (rows, sum, ties) = db.taps().close_dedup_deferred(token);
        let mut d = tap::Dedup::default();
        (d.rows, d.sum, d.ties) = (rows, sum, ties());
        return (trues, d);
    }
    (trues, db.taps().close_dedup(token))
}

#[test]
fn the_dedup_tap_counts_sums_and_finds_ties() {
    // Closed at once, then with the ties counted on other threads (one
    // test: the limit below is global).
    dedup_tap_counts_sums_and_finds_ties(false);
    dedup_tap_counts_sums_and_finds_ties(true);
    ties_counted_from_the_first_row_above_the_window();
}

/// The merge's plan: the dedup tap under a `row_number()` window, a
/// counting tap in the filter above it that starts the count of the ties
/// on its first row, before the statement ends.
fn ties_counted_from_the_first_row_above_the_window() {
    let db = db();
    let conn = db.connection();
    let plan = |dedup: u64, kept: u64, from: &str| -> (i64, i64) {
        conn.query_row(
            &format!(
                "SELECT count(*), sum(rn) FROM (SELECT * FROM (SELECT *, row_number() OVER (PARTITION BY pair ORDER BY seen) AS rn FROM (
                   SELECT *, {}(CAST($1 AS UBIGINT), CAST(h AS UBIGINT), CAST(pair AS UBIGINT), CAST(row AS UBIGINT)) AS seen FROM ({from})) AS x) AS r
                 WHERE {}(CAST($2 AS UBIGINT), CASE WHEN rn = 1 THEN CAST(h AS UBIGINT) END))",
                tap::DEDUP_FUNCTION,
                tap::ROWS_FUNCTION
            ),
            [dedup as i64, kept as i64],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .unwrap()
    };
    // 10,000 rows over 1,000 pairs; pair 7 has a second, different row.
    let copies = "SELECT hash(i) AS h, hash(i % 1000) AS pair, hash(i % 1000, 'v') AS row FROM range(10000) AS r(i)";
    let tied = format!("{copies} UNION ALL SELECT 1, hash(7), 42");
    for (from, tie) in [(copies.to_owned(), false), (tied, true)] {
        let (dedup, kept) = (db.taps().open_dedup(), db.taps().open());
        db.taps().count_ties_after(kept, dedup);
        let (kept_rows, ranks) = plan(dedup, kept, &from);
        assert_eq!((kept_rows, ranks), (1000, 1000), "one row a pair kept");
        assert!(db.taps().counting(dedup), "the count started inside the statement");
        let (rows, _, ties) = db.taps().close_dedup_deferred(dedup);
        let ties = ties();
        assert_eq!(rows, 10000 + u64::from(tie));
        assert_eq!(ties > 0, tie, "{ties} ties");
        assert_eq!(db.taps().close(kept).rows, 1000);
    }
    // A row that reaches the dedup tap after the count started (not the
    // plan the trigger assumes): a possible tie, though there is none.
    let (dedup, kept) = (db.taps().open_dedup(), db.taps().open());
    db.taps().count_ties_after(kept, dedup);
    let dedup_only = |dedup: u64, from: &str| -> i64 {
        conn.query_row(
            &format!("SELECT count(*) FILTER (WHERE m) FROM (SELECT {}(CAST(? AS UBIGINT), CAST(h AS UBIGINT), CAST(pair AS UBIGINT), CAST(row AS UBIGINT)) AS m FROM ({from}))", tap::DEDUP_FUNCTION),
            [dedup as i64],
            |r| r.get(0),
        )
        .unwrap()
    };
    assert_eq!(dedup_only(dedup, copies), 10000);
    let triggered: i64 =
        conn.query_row(&format!("SELECT count(*) FROM range(3) AS r(i) WHERE {}(CAST(? AS UBIGINT), hash(i))", tap::ROWS_FUNCTION), [kept as i64], |r| r.get(0)).unwrap();
    assert_eq!(triggered, 3);
    assert!(db.taps().counting(dedup));
    assert_eq!(dedup_only(dedup, "SELECT hash(1) AS h, hash(5000) AS pair, hash(5000, 'v') AS row"), 1);
    let (rows, _, ties) = db.taps().close_dedup_deferred(dedup);
    assert_eq!((rows, ties()), (10001, 1));
    db.taps().close(kept);
    // A trigger whose tap never sees a row is forgotten at close: the
    // count runs after the statement, as without one.
    let (dedup, never) = (db.taps().open_dedup(), db.taps().open());
    db.taps().count_ties_after(never, dedup);
    assert_eq!(dedup_only(dedup, copies), 10000);
    assert!(!db.taps().counting(dedup));
    let (rows, _, ties) = db.taps().close_dedup_deferred(dedup);
    assert_eq!((rows, ties()), (10000, 0));
}

fn dedup_tap_counts_sums_and_finds_ties(deferred: bool) {
    let db = db();
    let dedup = |db: &DuckDb, from: &str| dedup_closed(db, from, deferred);
    // 10,000 rows over 1,000 pairs, every row of a pair a copy: no tie.
    let copies = "SELECT hash(i) AS h, hash(i % 1000) AS pair, hash(i % 1000, 'v') AS row FROM range(10000) AS r(i)";
    let expected: String = db.connection().query_row("SELECT CAST(sum(hash(i)) AS VARCHAR) FROM range(10000) AS r(i)", [], |r| r.get(0)).unwrap();
    let (trues, seen) = dedup(&db, copies);
    assert_eq!((trues, seen.rows, seen.sum.to_string(), seen.ties), (10000, 10000, expected, 0));
    // Pair 7 gets a second, different row: one tie.
    // (Each row that differs from the pair's first counts: 1 if the odd row
    // came last, 10 if it came first.)
    let (_, seen) = dedup(&db, &format!("{copies} UNION ALL SELECT 1, hash(7), 42"));
    assert_eq!(seen.rows, 10001);
    assert!((1..=10).contains(&seen.ties), "{seen:?}");
    // A NULL row hash is not compared, and the row still counted. (The
    // merge passes none: a chunk whose argument is all NULL may skip the
    // call, as a constant NULL does.)
    let mixed = "SELECT hash(i) AS h, hash(i % 999) AS pair, CASE WHEN i % 2 = 0 THEN NULL ELSE hash(i % 999, 'v') END AS row FROM range(10000) AS r(i)";
    let (trues, seen) = dedup(&db, mixed);
    assert_eq!((trues, seen.rows, seen.ties), (10000, 10000, 0));
    // Past its limit the tap reports a possible tie.
    db.taps().set_dedup_limit(999);
    let (_, seen) = dedup(&db, copies);
    db.taps().set_dedup_limit(tap::DEDUP_LIMIT);
    assert_eq!((seen.rows, seen.ties), (10000, 1));
    let (_, seen) = dedup(&db, copies);
    assert_eq!(seen.ties, 0, "the limit restored");
}

#[test]
fn the_counting_condition_counts_true_rows_and_refuses_what_is_not_allowed() {
    let db = db();
    let token = db.taps().open();
    // TRUE for i % 3 = 0, NULL for i % 3 = 1 (taken as FALSE), FALSE else;
    // `allowed` NULL or FALSE only where the condition is not TRUE.
    let (trues, falses): (i64, i64) = db
        .connection()
        .query_row(
            &format!(
                "SELECT count(*) FILTER (WHERE m), count(*) FILTER (WHERE NOT m) FROM (
                   SELECT {}(CAST(? AS UBIGINT), CASE i % 3 WHEN 0 THEN true WHEN 1 THEN NULL ELSE false END,
                             CASE WHEN i % 3 = 0 THEN true WHEN i % 2 = 0 THEN NULL ELSE false END) AS m
                   FROM range(10000) AS r(i))",
                tap::IF_FUNCTION
            ),
            [token as i64],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .unwrap();
    let n = (0..10000).filter(|i| i % 3 == 0).count() as i64;
    assert_eq!((trues, falses), (n, 10000 - n), "NULL is FALSE");
    assert_eq!(db.taps().close(token).rows as i64, n);
    // One row where the condition holds and `allowed` does not, FALSE or
    // NULL: the statement fails with the refusal.
    for allowed in ["i <> 7776", "CASE WHEN i = 7776 THEN NULL ELSE true END"] {
        let token = db.taps().open();
        let err = db
            .connection()
            .query_row(
                &format!("SELECT count(*) FILTER (WHERE m) FROM (SELECT {}(CAST(? AS UBIGINT), i % 2 = 0, {allowed}) AS m FROM range(10000) AS r(i))", tap::IF_FUNCTION),
                [token as i64],
                |r| r.get::<_, i64>(0),
            )
            .unwrap_err();
        assert!(err.to_string().contains(tap::REFUSED), "{allowed}: {err}");
        assert!(db.taps().refused(token), "{allowed}: the tap says it refused");
        assert!(!db.taps().refused(token), "and forgets it once asked");
        db.taps().close(token);
    }
    // The same condition where `allowed` is NULL only where it does not
    // hold: nothing refused.
    let token = db.taps().open();
    let taken: i64 = db
        .connection()
        .query_row(
            &format!(
                "SELECT count(*) FILTER (WHERE m) FROM (SELECT {}(CAST(? AS UBIGINT), i % 2 = 0, CASE WHEN i = 7777 THEN NULL ELSE true END) AS m FROM range(10000) AS r(i))",
                tap::IF_FUNCTION
            ),
            [token as i64],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!((taken, db.taps().close(token).rows), (5000, 5000));
    assert!(!db.taps().refused(token), "nothing refused");
}

/// The refusal fails its statement on the first row that reaches it, and
/// marks its own token refused (no other); a statement where no row
/// reaches it (a `CASE` branch never taken) runs, nothing marked.
#[test]
fn the_refusal_fails_its_statement_and_says_so() {
    let db = DuckDb::open_in_memory().unwrap();
    let query = |token: u64, cond: &str| {
        db.connection().query_row(
            &format!("SELECT count(*) FILTER (WHERE CASE WHEN {cond} THEN {}(CAST(? AS UBIGINT)) ELSE true END) FROM range(10000) AS r(i)", tap::REFUSE_FUNCTION),
            [token as i64],
            |r| r.get::<_, i64>(0),
        )
    };
    let (refusing, other) = (db.taps().open(), db.taps().open());
    let err = query(refusing, "i = 9000").unwrap_err();
    assert!(err.to_string().contains(tap::REFUSED), "{err}");
    assert!(db.taps().refused(refusing));
    assert!(!db.taps().refused(other), "only the tap that refused");
    let quiet = db.taps().open();
    assert_eq!(query(quiet, "i < 0").unwrap(), 10000, "no row reaches it: every row counted");
    assert!(!db.taps().refused(quiet));
}
