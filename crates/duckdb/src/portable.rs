//! The portable row hash computed in Rust, inside DuckDB's scan.
//!
//! The portable fingerprint (see `fixpoint_core::fingerprint`) hashes each
//! row's canonical text with MD5. Built in SQL (casts, `replace`, `||`,
//! `md5_number`) it ran at 2.5M rows/s. Here a scalar function receives the
//! row's typed columns as one `STRUCT` (so a NULL field reaches it instead of
//! making the result NULL), writes the same canonical text DuckDB's SQL
//! would, and hashes a whole vector of rows at once with the multi-lane MD5
//! of `fixpoint_core::fingerprint::md5lanes`. The value is identical to the SQL form
//! (tested against it on every type), so fingerprints stay comparable with
//! PostgreSQL's, which computes the text and `md5()` in SQL.
//!
//! The SQL side passes each column as a type this module encodes (integers,
//! DECIMAL, FLOAT/DOUBLE, VARCHAR, BLOB, BOOLEAN, DATE, TIMESTAMP and
//! TIMESTAMP WITH TIME ZONE, whose micros are the canonical text); any other
//! type arrives already cast to VARCHAR.

use std::error::Error as StdError;
use std::io::Write as _;

use duckdb::core::{DataChunkHandle, Inserter, LogicalTypeHandle, LogicalTypeId};
use duckdb::ffi;
use duckdb::vscalar::{ScalarFunctionSignature, VScalar};
use duckdb::vtab::arrow::WritableVector;
use fixpoint_core::fingerprint::md5lanes::md5_lo64_many;

/// The SQL name of the hash: `fixpoint_portable_md5(row(c1, …, cn))`.
pub const HASH_FUNCTION: &str = "fixpoint_portable_md5";
/// The SQL name of the text (for tests and for explaining a mismatch).
pub const TEXT_FUNCTION: &str = "fixpoint_portable_text";

/// Registers both functions on `conn` (visible to the whole database
/// instance, for the life of the process).
pub fn register(conn: &duckdb::Connection) -> duckdb::Result<()> {
    conn.register_scalar_function::<PortableHash>(HASH_FUNCTION)?;
    conn.register_scalar_function::<PortableText>(TEXT_FUNCTION)
}

/// The argument for one column in `row(...)`: the column itself where this
/// module encodes its type, else its text (as the SQL form casts it).
pub fn field_expr(expr: &str, ty: &str, class: &str) -> String {
    let ty = ty.to_ascii_uppercase();
    match class {
        "timestamp" if ty != "TIMESTAMP" => format!("CAST({expr} AS TIMESTAMP)"),
        "int" | "decimal" | "float" | "date" | "timestamp" | "timestamptz" | "bool" | "bytes" => expr.to_owned(),
        "text" if ty == "VARCHAR" => expr.to_owned(),
        _ => format!("CAST({expr} AS VARCHAR)"),
    }
}

struct PortableHash;

impl VScalar for PortableHash {
    type State = ();

    fn invoke(_: &(), input: &mut DataChunkHandle, output: &mut dyn WritableVector) -> Result<(), Box<dyn StdError>> {
        let rows = input.len();
        SCRATCH.with_borrow_mut(|texts| {
            // SAFETY: DuckDB hands a flattened chunk whose one column is the
            // STRUCT the signature takes; `rows` is its length.
            unsafe { texts.encode(input.get_ptr(), rows)? };
            let slices: Vec<&[u8]> = (0..rows).map(|r| texts.row(r)).collect();
            let mut out = output.flat_vector();
            // SAFETY: the result vector is UBIGINT with room for `rows` values.
            let hashes = unsafe { out.as_mut_slice_with_len::<u64>(rows) };
            md5_lo64_many(&slices, hashes);
            Ok(())
        })
    }

    fn signatures() -> Vec<ScalarFunctionSignature> {
        vec![ScalarFunctionSignature::exact(vec![LogicalTypeHandle::from(LogicalTypeId::Any)], LogicalTypeId::UBigint.into())]
    }
}

struct PortableText;

impl VScalar for PortableText {
    type State = ();

    fn invoke(_: &(), input: &mut DataChunkHandle, output: &mut dyn WritableVector) -> Result<(), Box<dyn StdError>> {
        let rows = input.len();
        let mut texts = RowTexts::default();
        // SAFETY: as in PortableHash.
        unsafe { texts.encode(input.get_ptr(), rows)? };
        let out = output.flat_vector();
        for r in 0..rows {
            out.insert(r, texts.row(r));
        }
        Ok(())
    }

    fn signatures() -> Vec<ScalarFunctionSignature> {
        vec![ScalarFunctionSignature::exact(vec![LogicalTypeHandle::from(LogicalTypeId::Any)], LogicalTypeId::Varchar.into())]
    }
}

thread_local! {
    /// Each DuckDB worker thread's buffer, kept between chunks (a fresh
    /// 160 KB buffer per chunk was a fresh mapping and its page faults).
    static SCRATCH: std::cell::RefCell<RowTexts> = std::cell::RefCell::new(RowTexts::default());
}

/// The canonical texts of a chunk's rows, end to end in one buffer.
#[derive(Default)]
struct RowTexts {
    buf: Vec<u8>,
    ends: Vec<usize>,
}

/// How one column's values are written.
#[derive(Clone, Copy)]
enum Kind {
    Bool,
    I8,
    I16,
    I32,
    I64,
    U8,
    U16,
    U32,
    U64,
    I128,
    U128,
    /// A DECIMAL stored in this many bytes, with this scale.
    Decimal(u8, u8),
    F32,
    F64,
    /// VARCHAR: escaped.
    Text,
    /// BLOB: upper-case hex.
    Bytes,
    Date,
    /// TIMESTAMP, TIMESTAMP WITH TIME ZONE: the micros since 1970.
    Micros,
}

struct ColumnData {
    kind: Kind,
    data: *const u8,
    validity: *const u64,
    /// The last date written and its text.
    memo: std::cell::RefCell<(Option<i32>, Vec<u8>)>,
}

impl ColumnData {
    fn is_null(&self, row: usize) -> bool {
        // SAFETY: a non-null validity mask holds one bit per row of the chunk.
        !self.validity.is_null() && unsafe { *self.validity.add(row / 64) } & (1u64 << (row % 64)) == 0
    }

    /// The value at `row` as a `T` (the column's physical type).
    unsafe fn get<T: Copy>(&self, row: usize) -> T {
        unsafe { std::ptr::read_unaligned(self.data.cast::<T>().add(row)) }
    }
}

/// The bytes of a `duckdb_string_t`: 4 bytes of length, then either the
/// string inlined (≤ 12 bytes) or a 4-byte prefix and a pointer.
unsafe fn string_at<'a>(data: *const u8, row: usize) -> &'a [u8] {
    unsafe {
        let p = data.add(row * 16);
        let len = std::ptr::read_unaligned(p.cast::<u32>()) as usize;
        if len <= 12 {
            std::slice::from_raw_parts(p.add(4), len)
        } else {
            let ptr = std::ptr::read_unaligned(p.add(8).cast::<*const u8>());
            std::slice::from_raw_parts(ptr, len)
        }
    }
}

fn kind_of(ty: ffi::duckdb_logical_type) -> Result<Kind, String> {
    // SAFETY: `ty` is a live logical type handle.
    let id = unsafe { ffi::duckdb_get_type_id(ty) };
    Ok(match id {
        ffi::DUCKDB_TYPE_DUCKDB_TYPE_BOOLEAN => Kind::Bool,
        ffi::DUCKDB_TYPE_DUCKDB_TYPE_TINYINT => Kind::I8,
        ffi::DUCKDB_TYPE_DUCKDB_TYPE_SMALLINT => Kind::I16,
        ffi::DUCKDB_TYPE_DUCKDB_TYPE_INTEGER => Kind::I32,
        ffi::DUCKDB_TYPE_DUCKDB_TYPE_BIGINT => Kind::I64,
        ffi::DUCKDB_TYPE_DUCKDB_TYPE_UTINYINT => Kind::U8,
        ffi::DUCKDB_TYPE_DUCKDB_TYPE_USMALLINT => Kind::U16,
        ffi::DUCKDB_TYPE_DUCKDB_TYPE_UINTEGER => Kind::U32,
        ffi::DUCKDB_TYPE_DUCKDB_TYPE_UBIGINT => Kind::U64,
        ffi::DUCKDB_TYPE_DUCKDB_TYPE_HUGEINT => Kind::I128,
        ffi::DUCKDB_TYPE_DUCKDB_TYPE_UHUGEINT => Kind::U128,
        ffi::DUCKDB_TYPE_DUCKDB_TYPE_FLOAT => Kind::F32,
        ffi::DUCKDB_TYPE_DUCKDB_TYPE_DOUBLE => Kind::F64,
        ffi::DUCKDB_TYPE_DUCKDB_TYPE_VARCHAR => Kind::Text,
        ffi::DUCKDB_TYPE_DUCKDB_TYPE_BLOB => Kind::Bytes,
        ffi::DUCKDB_TYPE_DUCKDB_TYPE_DATE => Kind::Date,
        ffi::DUCKDB_TYPE_DUCKDB_TYPE_TIMESTAMP | ffi::DUCKDB_TYPE_DUCKDB_TYPE_TIMESTAMP_TZ => Kind::Micros,
        ffi::DUCKDB_TYPE_DUCKDB_TYPE_DECIMAL => {
            // SAFETY: `ty` is a DECIMAL type handle.
            let (internal, scale) = unsafe { (ffi::duckdb_decimal_internal_type(ty), ffi::duckdb_decimal_scale(ty)) };
            let bytes = match internal {
                ffi::DUCKDB_TYPE_DUCKDB_TYPE_SMALLINT => 2,
                ffi::DUCKDB_TYPE_DUCKDB_TYPE_INTEGER => 4,
                ffi::DUCKDB_TYPE_DUCKDB_TYPE_BIGINT => 8,
                _ => 16,
            };
            Kind::Decimal(bytes, scale)
        }
        other => return Err(format!("{HASH_FUNCTION}: a field of type id {other} (cast it to VARCHAR in SQL)")),
    })
}

impl RowTexts {
    fn row(&self, r: usize) -> &[u8] {
        let start = if r == 0 { 0 } else { self.ends[r - 1] };
        &self.buf[start..self.ends[r]]
    }

    /// Writes the canonical text of each of the chunk's `rows` rows.
    unsafe fn encode(&mut self, chunk: ffi::duckdb_data_chunk, rows: usize) -> Result<(), String> {
        let columns = unsafe { Self::columns(chunk)? };
        self.buf.clear();
        self.ends.clear();
        self.buf.reserve(rows * (12 * columns.len() + 8));
        for r in 0..rows {
            for (i, c) in columns.iter().enumerate() {
                if i > 0 {
                    self.buf.push(b'|');
                }
                if c.is_null(r) {
                    self.buf.extend_from_slice(b"\\N");
                } else {
                    unsafe { write_value(&mut self.buf, c, r) };
                }
            }
            self.ends.push(self.buf.len());
        }
        Ok(())
    }

    unsafe fn columns(chunk: ffi::duckdb_data_chunk) -> Result<Vec<ColumnData>, String> {
        unsafe {
            let row = ffi::duckdb_data_chunk_get_vector(chunk, 0);
            let mut ty = ffi::duckdb_vector_get_column_type(row);
            let struct_type = ffi::duckdb_get_type_id(ty) == ffi::DUCKDB_TYPE_DUCKDB_TYPE_STRUCT;
            let result = if !struct_type {
                Err(format!("{HASH_FUNCTION} takes one row(...) of the columns"))
            } else {
                let n = ffi::duckdb_struct_type_child_count(ty) as usize;
                let mut columns = Vec::with_capacity(n);
                let mut failed = None;
                for i in 0..n {
                    let mut child_ty = ffi::duckdb_struct_type_child_type(ty, i as u64);
                    let kind = kind_of(child_ty);
                    ffi::duckdb_destroy_logical_type(&mut child_ty);
                    match kind {
                        Ok(kind) => {
                            let v = ffi::duckdb_struct_vector_get_child(row, i as u64);
                            columns.push(ColumnData {
                                kind,
                                data: ffi::duckdb_vector_get_data(v) as *const u8,
                                validity: ffi::duckdb_vector_get_validity(v),
                                memo: Default::default(),
                            });
                        }
                        Err(e) => {
                            failed = Some(e);
                            break;
                        }
                    }
                }
                failed.map_or(Ok(columns), Err)
            };
            ffi::duckdb_destroy_logical_type(&mut ty);
            result
        }
    }
}

unsafe fn write_value(buf: &mut Vec<u8>, c: &ColumnData, r: usize) {
    let mut ints = itoa::Buffer::new();
    unsafe {
        match c.kind {
            Kind::Bool => buf.push(if c.get::<u8>(r) != 0 { b't' } else { b'f' }),
            Kind::I8 => write_i64(buf, c.get::<i8>(r).into()),
            Kind::I16 => write_i64(buf, c.get::<i16>(r).into()),
            Kind::I32 => write_i64(buf, c.get::<i32>(r).into()),
            Kind::I64 => write_i64(buf, c.get::<i64>(r).into()),
            Kind::U8 => write_u64(buf, c.get::<u8>(r).into()),
            Kind::U16 => write_u64(buf, c.get::<u16>(r).into()),
            Kind::U32 => write_u64(buf, c.get::<u32>(r).into()),
            Kind::U64 => write_u64(buf, c.get::<u64>(r).into()),
            Kind::I128 => buf.extend_from_slice(ints.format(c.get::<i128>(r)).as_bytes()),
            Kind::U128 => buf.extend_from_slice(ints.format(c.get::<u128>(r)).as_bytes()),
            Kind::Micros => {
                // `epoch_us` of an infinite timestamp is NULL in the SQL form.
                let us = c.get::<i64>(r);
                if us == i64::MAX || us == -i64::MAX {
                    buf.extend_from_slice(b"\\N");
                } else {
                    write_i64(buf, us);
                }
            }
            Kind::Decimal(bytes, scale) => {
                let v: i128 = match bytes {
                    2 => c.get::<i16>(r).into(),
                    4 => c.get::<i32>(r).into(),
                    8 => c.get::<i64>(r).into(),
                    _ => c.get::<i128>(r),
                };
                write_decimal(buf, v, scale);
            }
            Kind::F32 => write_double(buf, f64::from(c.get::<f32>(r))),
            Kind::F64 => write_double(buf, c.get::<f64>(r)),
            Kind::Text => {
                let text = string_at(c.data, r);
                if text.iter().any(|&b| b == b'\\' || b == b'|') {
                    for &b in text {
                        if b == b'\\' || b == b'|' {
                            buf.push(b'\\');
                        }
                        buf.push(b);
                    }
                } else {
                    buf.extend_from_slice(text);
                }
            }
            Kind::Bytes => {
                const HEX: &[u8; 16] = b"0123456789ABCDEF";
                for &b in string_at(c.data, r) {
                    buf.push(HEX[usize::from(b >> 4)]);
                    buf.push(HEX[usize::from(b & 15)]);
                }
            }
            Kind::Date => {
                // Runs of one date are common (a partition column): the
                // previous row's text is reused.
                let days = c.get::<i32>(r);
                let mut memo = c.memo.borrow_mut();
                if memo.0 != Some(days) {
                    memo.1.clear();
                    write_date(&mut memo.1, days);
                    memo.0 = Some(days);
                }
                buf.extend_from_slice(&memo.1);
            }
        }
    }
}

/// The decimal digits of `v`, written straight into `buf` (no
/// intermediate buffer, no call to copy a few bytes).
#[inline]
pub(crate) fn write_u64(buf: &mut Vec<u8>, mut v: u64) {
    const PAIRS: &[u8; 200] = b"0001020304050607080910111213141516171819202122232425262728293031323334353637383940414243444546474849\
        5051525354555657585960616263646566676869707172737475767778798081828384858687888990919293949596979899";
    let n = v.checked_ilog10().unwrap_or(0) as usize + 1;
    buf.reserve(n);
    let len = buf.len();
    // SAFETY: `n` bytes are reserved past `len`; each is written below
    // before the length is moved over them.
    unsafe {
        let mut p = buf.as_mut_ptr().add(len + n);
        // Four digits per division of the 64-bit value (a shorter chain of
        // dependent multiplications than two at a time), then pairs.
        while v >= 10_000 {
            let four = (v % 10_000) as u32;
            v /= 10_000;
            let (hi, lo) = ((four / 100) as usize * 2, (four % 100) as usize * 2);
            p = p.sub(4);
            *p = PAIRS[hi];
            *p.add(1) = PAIRS[hi + 1];
            *p.add(2) = PAIRS[lo];
            *p.add(3) = PAIRS[lo + 1];
        }
        if v >= 100 {
            let pair = (v % 100) as usize * 2;
            v /= 100;
            p = p.sub(2);
            *p = PAIRS[pair];
            *p.add(1) = PAIRS[pair + 1];
        }
        if v >= 10 {
            p = p.sub(2);
            *p = PAIRS[v as usize * 2];
            *p.add(1) = PAIRS[v as usize * 2 + 1];
        } else {
            p = p.sub(1);
            *p = b'0' + v as u8;
        }
        debug_assert_eq!(p, buf.as_mut_ptr().add(len));
        buf.set_len(len + n);
    }
}

/// A signed integer: `-` and the digits of its magnitude.
#[inline]
pub(crate) fn write_i64(buf: &mut Vec<u8>, v: i64) {
    if v < 0 {
        buf.push(b'-');
    }
    write_u64(buf, v.unsigned_abs());
}

/// `CAST(DECIMAL(w, s) AS VARCHAR)`: the digits with exactly `scale` after
/// the point, a leading `0` before it, `-` for negatives.
pub(crate) fn write_decimal(buf: &mut Vec<u8>, v: i128, scale: u8) {
    if v < 0 {
        buf.push(b'-');
    }
    let abs = v.unsigned_abs();
    if scale == 0 {
        match u64::try_from(abs) {
            Ok(v) => write_u64(buf, v),
            Err(_) => buf.extend_from_slice(itoa::Buffer::new().format(abs).as_bytes()),
        }
        return;
    }
    let pow = 10u128.pow(u32::from(scale));
    let mut ints = itoa::Buffer::new();
    let (int, frac) = (abs / pow, abs % pow);
    // Most decimals fit 64 bits, whose formatting is several times faster.
    match u64::try_from(int) {
        Ok(v) => write_u64(buf, v),
        Err(_) => buf.extend_from_slice(ints.format(int).as_bytes()),
    }
    buf.push(b'.');
    // The fraction, zero-padded to `scale` digits.
    let width = usize::from(scale);
    match u64::try_from(frac) {
        Ok(v) => {
            let digits = v.checked_ilog10().unwrap_or(0) as usize + 1;
            for _ in digits..width {
                buf.push(b'0');
            }
            write_u64(buf, v);
        }
        Err(_) => {
            let frac = ints.format(frac).as_bytes();
            buf.extend(std::iter::repeat_n(b'0', width - frac.len()));
            buf.extend_from_slice(frac);
        }
    }
}

/// A float's canonical text (see `fixpoint_core::fingerprint::write_float`).
pub(crate) fn write_double(buf: &mut Vec<u8>, v: f64) {
    fixpoint_core::fingerprint::write_float(buf, v);
}

/// `CAST(DATE AS VARCHAR)`: `YYYY-MM-DD`, the year at least 4 digits;
/// years before 1 as `YYYY-MM-DD (BC)`; DuckDB's infinite dates by name.
pub(crate) fn write_date(buf: &mut Vec<u8>, days: i32) {
    if days == i32::MAX {
        buf.extend_from_slice(b"infinity");
        return;
    }
    if days == -i32::MAX {
        buf.extend_from_slice(b"-infinity");
        return;
    }
    // Days since 1970-01-01 to a civil date (H. Hinnant's algorithm).
    let z = i64::from(days) + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    let (year, bc) = if y <= 0 { (1 - y, true) } else { (y, false) };
    if year < 10_000 {
        let y = year as usize;
        buf.extend_from_slice(&[
            b'0' + (y / 1000) as u8,
            b'0' + (y / 100 % 10) as u8,
            b'0' + (y / 10 % 10) as u8,
            b'0' + (y % 10) as u8,
            b'-',
            b'0' + (m / 10) as u8,
            b'0' + (m % 10) as u8,
            b'-',
            b'0' + (d / 10) as u8,
            b'0' + (d % 10) as u8,
        ]);
    } else {
        let _ = write!(buf, "{year}-{m:02}-{d:02}");
    }
    if bc {
        buf.extend_from_slice(b" (BC)");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(f: impl FnOnce(&mut Vec<u8>)) -> String {
        let mut b = Vec::new();
        f(&mut b);
        String::from_utf8(b).unwrap()
    }

    #[test]
    fn decimals_doubles_and_dates_as_duckdb_writes_them() {
        assert_eq!(text(|b| write_decimal(b, 123456, 2)), "1234.56");
        assert_eq!(text(|b| write_decimal(b, -50, 2)), "-0.50");
        assert_eq!(text(|b| write_decimal(b, 7, 3)), "0.007");
        assert_eq!(text(|b| write_decimal(b, -12, 0)), "-12");
        assert_eq!(text(|b| write_double(b, 1234.5)), 1234.5f64.to_bits().to_string());
        assert_eq!(text(|b| write_double(b, -1e-300)), format!("-{}", 1e-300f64.to_bits()));
        assert_eq!(text(|b| write_double(b, -0.0)), "0");
        assert_eq!(text(|b| write_date(b, 0)), "1970-01-01");
        assert_eq!(text(|b| write_date(b, 20_746)), "2026-10-20");
        assert_eq!(text(|b| write_date(b, -719_162)), "0001-01-01");
        assert_eq!(text(|b| write_date(b, -719_163)), "0001-12-31 (BC)");
        assert_eq!(text(|b| write_date(b, 2_932_897)), "10000-01-01");
        for v in [0u64, 9, 10, 99, 100, 101, 999, 1000, 123_456_789, u64::MAX] {
            assert_eq!(text(|b| write_u64(b, v)), v.to_string());
        }
        for v in [i64::MIN, -1, 0, 1, i64::MAX] {
            assert_eq!(text(|b| write_i64(b, v)), v.to_string());
        }
        assert_eq!(text(|b| write_decimal(b, i128::MAX / 7, 10)), {
            let v = i128::MAX / 7;
            format!("{}.{:010}", v / 10_000_000_000, v % 10_000_000_000)
        });
    }
}
