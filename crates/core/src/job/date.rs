//! The run date: the only notion of "today" a job has. It comes from the
//! caller, never from the clock.

use chrono::{NaiveDate, NaiveDateTime, NaiveTime};
use std::fmt;

use crate::error::{Error, Result};

/// A logical run date, parsed strictly as `YYYY-MM-DD`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RunDate(NaiveDate);

impl RunDate {
    /// Parses `YYYY-MM-DD` and nothing else (no time, no spaces, no suffix).
    pub fn parse(s: &str) -> Result<RunDate> {
        let well_formed = s.len() == 10
            && s.bytes().enumerate().all(|(i, b)| if i == 4 || i == 7 { b == b'-' } else { b.is_ascii_digit() });
        let date = if well_formed { NaiveDate::parse_from_str(s, "%Y-%m-%d").ok() } else { None };
        match date {
            Some(d) => Ok(RunDate(d)),
            None => Err(Error::Argument {
                message: format!("{:?} is not a date: expected YYYY-MM-DD, e.g. 2026-10-20", truncate(s, 60)),
                hint: Some("pass the logical run date the scheduler is processing, e.g. --date 2026-10-20".into()),
            }),
        }
    }

    /// Wraps a date.
    pub fn from_naive(d: NaiveDate) -> RunDate {
        RunDate(d)
    }

    /// The date.
    pub fn date(self) -> NaiveDate {
        self.0
    }

    /// Start of the day's half-open window: `run_date 00:00`.
    pub fn start(self) -> NaiveDateTime {
        self.0.and_time(NaiveTime::MIN)
    }

    /// End of the day's half-open window: `run_date + 1 00:00`.
    pub fn end(self) -> NaiveDateTime {
        self.next().start()
    }

    /// The next day.
    pub fn next(self) -> RunDate {
        RunDate(self.0.succ_opt().expect("date in range"))
    }

    /// Every date from `from` to `to`, inclusive.
    pub fn range(from: RunDate, to: RunDate) -> Vec<RunDate> {
        let mut out = Vec::new();
        let mut d = from;
        while d <= to {
            out.push(d);
            d = d.next();
        }
        out
    }
}

impl fmt::Display for RunDate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0.format("%Y-%m-%d"))
    }
}

fn truncate(s: &str, n: usize) -> String {
    if s.chars().count() <= n {
        s.to_owned()
    } else {
        format!("{}…", s.chars().take(n).collect::<String>())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_plain_dates_only() {
        assert_eq!(RunDate::parse("2026-10-20").unwrap().to_string(), "2026-10-20");
        for bad in [
            "2026-10-20'; DROP TABLE silver.orders; --",
            "2026-10-32",
            "2026-02-29",
            "20261020",
            "2026-1-20",
            " 2026-10-20",
            "2026-10-20 00:00",
            "",
            "yesterday",
        ] {
            let err = RunDate::parse(bad).unwrap_err();
            assert!(err.to_string().contains("is not a date"), "{bad}: {err}");
        }
    }

    #[test]
    fn window_is_half_open_day() {
        let d = RunDate::parse("2026-12-31").unwrap();
        assert_eq!(d.start().to_string(), "2026-12-31 00:00:00");
        assert_eq!(d.end().to_string(), "2027-01-01 00:00:00");
        assert_eq!(RunDate::range(d, RunDate::parse("2027-01-02").unwrap()).len(), 3);
    }
}
