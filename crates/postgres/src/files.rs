//! File sources on PostgreSQL: the embedded DuckDB reads the day's files
//! (the same reader, the same types as on DuckDB), and the rows are streamed
//! into a temporary staging table with `COPY … (FORMAT binary)`. The job's
//! query then reads that table as `input`, inside the run's transaction, and
//! the usual strategy runs.
//!
//! The files are checked by that reader before a row is copied, as on
//! DuckDB (`file_input`): JSON records must be objects, a compressed CSV
//! file must have a header line, and a file's own column named like a
//! hive-style `key=value` folder of its path must agree with it. (Empty
//! files and symbolic link cycles were refused when the files were
//! matched.) Each refusal names the file, before the staging table exists.
//!
//! Types map faithfully or not at all: integers, floats, decimals (with
//! their precision and scale), text, booleans, dates, timestamps with and
//! without time zone (to the microsecond, PostgreSQL's precision), times,
//! UUIDs and blobs. Any other type (lists, structs, maps, intervals, …) is
//! an error naming the column.

use std::error::Error as StdError;

use bytes::{BufMut, BytesMut};
use duckdb::types::ValueRef;
use fixpoint_core::engine::{Column, Engine, FileInput};
use fixpoint_core::job::files::InputFiles;
use fixpoint_core::job::ident::quote_ident;
use fixpoint_core::job::sql::Sql;
use fixpoint_core::{Error, Result};
use postgres::binary_copy::BinaryCopyInWriter;
use postgres::types::{IsNull, ToSql, Type};
use postgres::Client;

/// The staging table's name (a temporary table: this session only).
pub(crate) const STAGE: &str = "pg_temp.\"__fixpoint_input\"";
/// [`STAGE`]'s own name, as any statement that reads it spells it.
pub(crate) const STAGE_NAME: &str = "\"__fixpoint_input\"";

/// How one column travels: the PostgreSQL type it is copied as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Bool,
    Int2,
    Int4,
    Int8,
    Float4,
    Float8,
    /// Sent in NUMERIC's binary form.
    Numeric,
    Text,
    Bytea,
    Date,
    Timestamp,
    TimestampTz,
    Time,
    /// Read as text, sent as 16 bytes.
    Uuid,
}

/// The PostgreSQL column type, the DuckDB expression to read, and the kind.
/// Values are read as DuckDB hands them over (dates as days, timestamps
/// as UTC ticks, decimals as scaled integers), so no session setting or
/// time zone of the reader takes part.
fn map(column: &Column) -> Option<(String, String, Kind)> {
    let c = quote_ident(&column.name);
    let ty = column.ty.to_ascii_uppercase();
    let plain = |pg: &str, k: Kind| Some((pg.to_owned(), c.clone(), k));
    match ty.as_str() {
        "BOOLEAN" => plain("boolean", Kind::Bool),
        "TINYINT" | "SMALLINT" | "UTINYINT" => plain("smallint", Kind::Int2),
        "INTEGER" | "USMALLINT" => plain("integer", Kind::Int4),
        "BIGINT" | "UINTEGER" => plain("bigint", Kind::Int8),
        "UBIGINT" => plain("numeric(20,0)", Kind::Numeric),
        "HUGEINT" | "UHUGEINT" => plain("numeric(39,0)", Kind::Numeric),
        "FLOAT" => plain("real", Kind::Float4),
        "DOUBLE" => plain("double precision", Kind::Float8),
        "VARCHAR" => plain("text", Kind::Text),
        "BLOB" => plain("bytea", Kind::Bytea),
        "DATE" => plain("date", Kind::Date),
        // Nanoseconds are cut to PostgreSQL's microseconds.
        "TIMESTAMP" | "TIMESTAMP_S" | "TIMESTAMP_MS" | "TIMESTAMP_NS" => plain("timestamp", Kind::Timestamp),
        "TIMESTAMP WITH TIME ZONE" => plain("timestamptz", Kind::TimestampTz),
        "TIME" => plain("time", Kind::Time),
        "UUID" => Some(("uuid".into(), format!("CAST({c} AS VARCHAR)"), Kind::Uuid)),
        _ if ty.starts_with("DECIMAL(") => {
            let inner = ty.trim_start_matches("DECIMAL(").trim_end_matches(')');
            plain(&format!("numeric({inner})"), Kind::Numeric)
        }
        _ => None,
    }
}

/// One value to copy, borrowed from DuckDB's row.
struct Field<'a> {
    kind: Kind,
    value: ValueRef<'a>,
}

impl std::fmt::Debug for Field<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}", self.kind)
    }
}

type BoxError = Box<dyn StdError + Sync + Send>;

fn int_of(v: &ValueRef<'_>) -> std::result::Result<i64, BoxError> {
    Ok(match *v {
        ValueRef::TinyInt(i) => i.into(),
        ValueRef::SmallInt(i) => i.into(),
        ValueRef::Int(i) => i.into(),
        ValueRef::BigInt(i) => i,
        ValueRef::UTinyInt(i) => i.into(),
        ValueRef::USmallInt(i) => i.into(),
        ValueRef::UInt(i) => i.into(),
        ref other => return Err(format!("expected an integer, DuckDB gave {other:?}").into()),
    })
}

fn text_of<'a>(v: &ValueRef<'a>) -> std::result::Result<&'a [u8], BoxError> {
    match *v {
        ValueRef::Text(t) => Ok(t),
        ValueRef::Blob(b) => Ok(b),
        ref other => Err(format!("expected text, DuckDB gave {other:?}").into()),
    }
}

/// 2000-01-01 (PostgreSQL's epoch) in microseconds and days since 1970.
const PG_EPOCH_US: i64 = 946_684_800_000_000;
const PG_EPOCH_DAYS: i64 = 10_957;

impl ToSql for Field<'_> {
    fn to_sql(&self, _: &Type, out: &mut BytesMut) -> std::result::Result<IsNull, BoxError> {
        if matches!(self.value, ValueRef::Null) {
            return Ok(IsNull::Yes);
        }
        let v = &self.value;
        match self.kind {
            Kind::Bool => match *v {
                ValueRef::Boolean(b) => out.put_u8(b as u8),
                ref other => return Err(format!("expected a boolean, DuckDB gave {other:?}").into()),
            },
            Kind::Int2 => out.put_i16(i16::try_from(int_of(v)?)?),
            Kind::Int4 => out.put_i32(i32::try_from(int_of(v)?)?),
            Kind::Int8 => out.put_i64(int_of(v)?),
            Kind::Float4 => match *v {
                ValueRef::Float(f) => out.put_f32(f),
                ref other => return Err(format!("expected a float, DuckDB gave {other:?}").into()),
            },
            Kind::Float8 => match *v {
                ValueRef::Double(f) => out.put_f64(f),
                ref other => return Err(format!("expected a double, DuckDB gave {other:?}").into()),
            },
            Kind::Numeric => match *v {
                ValueRef::Decimal(d) => {
                    if !numeric_scaled(d.value(), d.scale().into(), out) {
                        numeric_binary(&d.to_string(), out)?
                    }
                }
                // Scale 0 never pads: these always fit.
                ValueRef::HugeInt(i) => _ = numeric_scaled(i, 0, out),
                ValueRef::UBigInt(i) => _ = numeric_scaled(i.into(), 0, out),
                ValueRef::UHugeInt(i) => numeric_binary(&i.to_string(), out)?,
                ref other => return Err(format!("expected a decimal, DuckDB gave {other:?}").into()),
            },
            Kind::Text | Kind::Bytea => out.put_slice(text_of(v)?),
            // DuckDB's ±infinity (the extreme values) are PostgreSQL's.
            Kind::Date => match *v {
                ValueRef::Date32(i32::MAX) => out.put_i32(i32::MAX),
                ValueRef::Date32(days) if days <= -i32::MAX => out.put_i32(i32::MIN),
                ValueRef::Date32(days) => out.put_i32(i32::try_from(i64::from(days) - PG_EPOCH_DAYS).map_err(|_| format!("date {days} days from 1970 is out of PostgreSQL's range"))?),
                ref other => return Err(format!("expected a date, DuckDB gave {other:?}").into()),
            },
            Kind::Timestamp | Kind::TimestampTz => match *v {
                ValueRef::Timestamp(_, i64::MAX) => out.put_i64(i64::MAX),
                ValueRef::Timestamp(_, t) if t <= -i64::MAX => out.put_i64(i64::MIN),
                ValueRef::Timestamp(unit, t) => {
                    let us = match unit {
                        duckdb::types::TimeUnit::Second => t.checked_mul(1_000_000),
                        duckdb::types::TimeUnit::Millisecond => t.checked_mul(1_000),
                        duckdb::types::TimeUnit::Microsecond => Some(t),
                        duckdb::types::TimeUnit::Nanosecond => Some(t.div_euclid(1_000)),
                    };
                    let pg = us.and_then(|u| u.checked_sub(PG_EPOCH_US)).ok_or_else(|| format!("timestamp {t} ({unit:?}) is out of PostgreSQL's range"))?;
                    out.put_i64(pg)
                }
                ref other => return Err(format!("expected a timestamp, DuckDB gave {other:?}").into()),
            },
            Kind::Time => match *v {
                ValueRef::Time64(unit, t) => out.put_i64(unit.to_micros(t)),
                ref other => return Err(format!("expected a time, DuckDB gave {other:?}").into()),
            },
            Kind::Uuid => {
                let hex: String = std::str::from_utf8(text_of(v)?)?.chars().filter(|c| *c != '-').collect();
                if hex.len() != 32 {
                    return Err(format!("bad uuid {hex}").into());
                }
                for i in 0..16 {
                    out.put_u8(u8::from_str_radix(&hex[2 * i..2 * i + 2], 16)?);
                }
            }
        }
        Ok(IsNull::No)
    }

    fn accepts(_: &Type) -> bool {
        true
    }

    postgres::types::to_sql_checked!();
}

/// A decimal's text (`-123.4500`) in NUMERIC's binary form: ndigits,
/// weight, sign, dscale, then base-10000 digits.
pub(crate) fn numeric_binary(text: &str, out: &mut BytesMut) -> std::result::Result<(), BoxError> {
    let (neg, body) = match text.strip_prefix('-') {
        Some(b) => (true, b),
        None => (false, text.strip_prefix('+').unwrap_or(text)),
    };
    let (int, frac) = body.split_once('.').unwrap_or((body, ""));
    if int.is_empty() && frac.is_empty() || !int.chars().chain(frac.chars()).all(|c| c.is_ascii_digit()) {
        return Err(format!("not a decimal: {text:?}").into());
    }
    let dscale = frac.len();
    // Pad the integer part on the left and the fraction on the right to
    // whole groups of four digits.
    let int_pad = (4 - int.len() % 4) % 4;
    let frac_pad = (4 - frac.len() % 4) % 4;
    let digits: String = "0".repeat(int_pad) + int + frac + &"0".repeat(frac_pad);
    let mut groups: Vec<i16> = digits.as_bytes().chunks(4).map(|g| std::str::from_utf8(g).expect("ascii").parse::<i16>().expect("digits")).collect();
    let mut weight = ((int.len() + int_pad) / 4) as i32 - 1;
    while groups.first() == Some(&0) {
        groups.remove(0);
        weight -= 1;
    }
    put_numeric(out, groups, weight, neg, dscale as i16);
    Ok(())
}

/// Writes NUMERIC's binary form from base-10000 groups (most significant
/// first, no leading zero group) and the weight of the first, dropping
/// trailing zero groups as PostgreSQL does.
fn put_numeric(out: &mut BytesMut, mut groups: Vec<i16>, weight: i32, neg: bool, dscale: i16) {
    while groups.last() == Some(&0) {
        groups.pop();
    }
    let weight = if groups.is_empty() { 0 } else { weight };
    out.put_i16(groups.len() as i16);
    out.put_i16(weight as i16);
    out.put_u16(if neg && !groups.is_empty() { 0x4000 } else { 0 });
    out.put_i16(dscale);
    for g in groups {
        out.put_i16(g);
    }
}

/// A decimal given as `value × 10^-scale` in NUMERIC's binary form (the
/// same bytes as [`numeric_binary`] of its text).
/// Returns `false`, writing nothing, when aligning the fraction would
/// overflow 128 bits (a value near 10^38): the caller encodes its text.
pub(crate) fn numeric_scaled(value: i128, scale: u32, out: &mut BytesMut) -> bool {
    // Align the fraction to whole groups of four digits.
    let pad = (4 - scale % 4) % 4;
    let Some(mut abs) = value.unsigned_abs().checked_mul(10u128.pow(pad)) else { return false };
    let frac_groups = ((scale + pad) / 4) as i32;
    let mut groups: Vec<i16> = Vec::with_capacity(11);
    while abs > 0 {
        groups.push((abs % 10_000) as i16);
        abs /= 10_000;
    }
    groups.reverse();
    let weight = groups.len() as i32 - frac_groups - 1;
    put_numeric(out, groups, weight, value < 0, scale as i16);
    true
}

/// The day's files, checked and described by an embedded DuckDB, their
/// rows not read yet: [`Pending::copy`] streams them into a table.
pub(crate) struct Pending {
    duck: fixpoint_duckdb::DuckDb,
    /// `SELECT <each column as sent> FROM <the files>`.
    read: Sql,
    /// Each column's name and PostgreSQL type, in the files' order.
    pub(crate) columns: Vec<Column>,
    kinds: Vec<Kind>,
    types: Vec<Type>,
}

fn pg_err(context: &str) -> impl Fn(postgres::Error) -> Error + '_ {
    move |e: postgres::Error| Error::Database { engine: "postgres", context: context.to_owned(), message: e.to_string(), failure: fixpoint_core::DbFailure::Other }
}

impl Pending {
    /// Reads no row: the files are checked (as on DuckDB) and their
    /// columns mapped, or an error names the file or the column.
    pub(crate) fn open(files: &InputFiles) -> Result<Pending> {
        let mut duck = fixpoint_duckdb::DuckDb::open_in_memory()?;
        let relation = duck.stage_files(files)?;
        let mut all = Sql::new();
        all.push("SELECT * FROM ").append(&relation);
        let described = duck.describe(&all)?;
        let (mut columns, mut select, mut kinds, mut types) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for c in &described {
            let Some((pg, expr, kind)) = map(c) else {
                return Err(Error::Schema {
                    message: format!("the files' column {:?} has the type {}, which has no faithful PostgreSQL type in fixpoint", c.name, c.ty),
                    hint: Some("write it upstream as a plain type (integer, decimal, text, boolean, date, timestamp, timestamptz, time, uuid, blob), or load the files into DuckDB".into()),
                });
            };
            columns.push(Column { name: c.name.clone(), ty: pg });
            select.push(expr);
            kinds.push(kind);
            types.push(match kind {
                Kind::Bool => Type::BOOL,
                Kind::Int2 => Type::INT2,
                Kind::Int4 => Type::INT4,
                Kind::Int8 => Type::INT8,
                Kind::Float4 => Type::FLOAT4,
                Kind::Float8 => Type::FLOAT8,
                Kind::Numeric => Type::NUMERIC,
                Kind::Text => Type::TEXT,
                Kind::Bytea => Type::BYTEA,
                Kind::Date => Type::DATE,
                Kind::Timestamp => Type::TIMESTAMP,
                Kind::TimestampTz => Type::TIMESTAMPTZ,
                Kind::Time => Type::TIME,
                Kind::Uuid => Type::UUID,
            });
        }
        let mut read = Sql::new();
        read.push("SELECT ").push(&select.join(", ")).push(" FROM ").append(&relation);
        Ok(Pending { duck, read, columns, kinds, types })
    }

    /// `CREATE TEMPORARY TABLE` of [`STAGE`] with the files' columns
    /// (dropped first when there).
    pub(crate) fn create_stage(&self, client: &mut Client) -> Result<()> {
        let create: Vec<String> = self.columns.iter().map(|c| format!("{} {}", quote_ident(&c.name), c.ty)).collect();
        client.batch_execute(&format!("DROP TABLE IF EXISTS {STAGE}")).map_err(pg_err("dropping the staging table"))?;
        client
            .batch_execute(&format!("CREATE TEMPORARY TABLE {} ({})", STAGE.trim_start_matches("pg_temp."), create.join(", ")))
            .map_err(pg_err("creating the staging table"))?;
        Ok(())
    }

    /// Streams the files' rows with `COPY … (FORMAT binary)` into `table`'s
    /// columns of the files' names; returns the rows copied.
    pub(crate) fn copy(&mut self, client: &mut Client, table: &str) -> Result<u64> {
        let names: Vec<String> = self.columns.iter().map(|c| quote_ident(&c.name)).collect();
        let conn = self.duck.connection();
        let duck_err = |e: duckdb::Error| Error::Database { engine: "duckdb", context: "reading the files".into(), message: e.to_string(), failure: fixpoint_core::DbFailure::Other };
        let mut stmt = conn.prepare(&self.read.text).map_err(duck_err)?;
        let mut rows = stmt.query([]).map_err(duck_err)?;
        let sink = client.copy_in(&format!("COPY {table} ({}) FROM STDIN (FORMAT binary)", names.join(", "))).map_err(pg_err("starting COPY"))?;
        let mut writer = BinaryCopyInWriter::new(sink, &self.types);
        let mut n = 0u64;
        let width = self.kinds.len();
        loop {
            let row = match rows.next() {
                Ok(Some(r)) => r,
                Ok(None) => break,
                Err(e) => return Err(duck_err(e)),
            };
            let mut fields = Vec::with_capacity(width);
            for (i, kind) in self.kinds.iter().enumerate() {
                fields.push(Field { kind: *kind, value: row.get_ref(i).map_err(duck_err)? });
            }
            let refs: Vec<&(dyn ToSql + Sync)> = fields.iter().map(|f| f as &(dyn ToSql + Sync)).collect();
            writer.write(&refs).map_err(pg_err("copying the files' rows into PostgreSQL"))?;
            n += 1;
        }
        writer.finish().map_err(pg_err("finishing COPY"))?;
        Ok(n)
    }
}

/// Reads `files` with an embedded DuckDB and copies their rows with
/// `COPY … (FORMAT binary)` into `into`, an existing table with columns of
/// the files' names and types.
pub(crate) fn copy_files(client: &mut Client, files: &InputFiles, into: &str) -> Result<u64> {
    Pending::open(files)?.copy(client, into)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn enc(t: &str) -> Vec<i16> {
        let mut b = BytesMut::new();
        numeric_binary(t, &mut b).unwrap();
        b.chunks(2).map(|c| i16::from_be_bytes([c[0], c[1]])).collect()
    }

    fn field(kind: Kind, value: ValueRef<'_>) -> std::result::Result<Vec<u8>, String> {
        let mut b = BytesMut::new();
        Field { kind, value }.to_sql(&Type::INT8, &mut b).map_err(|e| e.to_string())?;
        Ok(b.to_vec())
    }

    #[test]
    fn dates_and_timestamps_keep_infinity_and_refuse_overflow() {
        use duckdb::types::TimeUnit;
        assert_eq!(field(Kind::Date, ValueRef::Date32(i32::MAX)).unwrap(), i32::MAX.to_be_bytes());
        assert_eq!(field(Kind::Date, ValueRef::Date32(-i32::MAX)).unwrap(), i32::MIN.to_be_bytes());
        assert_eq!(field(Kind::Date, ValueRef::Date32(10_958)).unwrap(), 1i32.to_be_bytes(), "2000-01-02");
        assert_eq!(field(Kind::Timestamp, ValueRef::Timestamp(TimeUnit::Microsecond, i64::MAX)).unwrap(), i64::MAX.to_be_bytes());
        assert_eq!(field(Kind::Timestamp, ValueRef::Timestamp(TimeUnit::Microsecond, -i64::MAX)).unwrap(), i64::MIN.to_be_bytes());
        assert_eq!(field(Kind::Timestamp, ValueRef::Timestamp(TimeUnit::Second, 946_684_801)).unwrap(), 1_000_000i64.to_be_bytes());
        assert_eq!(field(Kind::Timestamp, ValueRef::Timestamp(TimeUnit::Nanosecond, 946_684_800_000_001_999)).unwrap(), 1i64.to_be_bytes());
        assert!(field(Kind::Timestamp, ValueRef::Timestamp(TimeUnit::Second, i64::MAX / 10)).unwrap_err().contains("out of PostgreSQL's range"));
    }

    #[test]
    fn numerics_encode_in_base_10000() {
        // ndigits, weight, sign, dscale, digits…
        assert_eq!(enc("0"), [0, 0, 0, 0]);
        assert_eq!(enc("12.50"), [2, 0, 0, 2, 12, 5000]);
        assert_eq!(enc("-12345.6"), [3, 1, 0x4000, 1, 1, 2345, 6000]);
        assert_eq!(enc("0.0001"), [1, -1, 0, 4, 1]);
        assert_eq!(enc("100000000"), [1, 2, 0, 0, 1]);
        assert_eq!(enc("-0.00"), [0, 0, 0, 2]);
        assert!(numeric_binary("1e5", &mut BytesMut::new()).is_err());
        // From the scaled integer: the same bytes as from the text.
        for (v, scale, text) in [
            (0i128, 0u32, "0"),
            (1250, 2, "12.50"),
            (-123456, 1, "-12345.6"),
            (1, 4, "0.0001"),
            (1234, 8, "0.00001234"),
            (100000000, 0, "100000000"),
            (0, 2, "0.00"),
            (1234567890123456781234567890, 10, "123456789012345678.1234567890"),
            (-5, 2, "-0.05"),
        ] {
            let (mut a, mut b) = (BytesMut::new(), BytesMut::new());
            assert!(numeric_scaled(v, scale, &mut a), "{text}");
            numeric_binary(text, &mut b).unwrap();
            assert_eq!(a, b, "{text}");
        }
        // DECIMAL(38,1) near its maximum: aligning the fraction overflows 128
        // bits, so the text encoder takes it (and says so by writing nothing).
        let big = 10i128.pow(37) * 9 + 5;
        let mut a = BytesMut::new();
        assert!(!numeric_scaled(big, 1, &mut a));
        assert!(a.is_empty());
        let d = duckdb::types::Decimal::new(38, 1, big).unwrap();
        let mut via_field = BytesMut::new();
        Field { kind: Kind::Numeric, value: ValueRef::Decimal(d) }.to_sql(&Type::NUMERIC, &mut via_field).unwrap();
        let mut via_text = BytesMut::new();
        numeric_binary(&d.to_string(), &mut via_text).unwrap();
        assert_eq!(via_field, via_text);
        assert_eq!(d.to_string(), format!("9{}.5", "0".repeat(36)));
    }
}
