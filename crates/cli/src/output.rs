//! Output: data on stdout (text or JSON), messages on stderr, exit codes.

use fixpoint_core::{Error, ErrorClass, Fingerprint, RunReport, TableName};
use serde_json::json;

/// Exit codes, documented in the README.
pub mod code {
    /// The input (job file, arguments, SQL) is wrong.
    pub const INPUT: u8 = 2;
    /// The source data was refused by a guard; nothing changed.
    pub const DATA: u8 = 3;
    /// A proof failed / differences found.
    #[allow(dead_code)]
    pub const PROOF: u8 = 4;
    /// Another run holds the lock.
    pub const BUSY: u8 = 5;
    /// The database or file system failed; a retry may work.
    pub const RUNTIME: u8 = 1;
    /// A bug in fixpoint.
    pub const INTERNAL: u8 = 70;
}

/// The exit code for an error.
pub fn exit_code(e: &Error) -> u8 {
    match e.class() {
        ErrorClass::Input | ErrorClass::Unsupported => code::INPUT,
        ErrorClass::Data => code::DATA,
        ErrorClass::Busy => code::BUSY,
        ErrorClass::Runtime | ErrorClass::Injected => code::RUNTIME,
        ErrorClass::Internal => code::INTERNAL,
    }
}

fn class_name(c: ErrorClass) -> &'static str {
    match c {
        ErrorClass::Input => "input",
        ErrorClass::Data => "data",
        ErrorClass::Busy => "busy",
        ErrorClass::Runtime => "runtime",
        ErrorClass::Injected => "injected",
        ErrorClass::Unsupported => "unsupported",
        ErrorClass::Internal => "internal",
    }
}

/// Hides the password of a URL (`postgres://u:secret@h/db` → `postgres://u:***@h/db`).
pub fn redact_url(url: &str) -> String {
    let Some(scheme_end) = url.find("://") else { return url.to_owned() };
    let rest = &url[scheme_end + 3..];
    let Some(at) = rest.rfind('@') else { return url.to_owned() };
    let userinfo = &rest[..at];
    match userinfo.find(':') {
        Some(colon) => format!("{}://{}:***{}", &url[..scheme_end], &userinfo[..colon], &rest[at..]),
        None => url.to_owned(),
    }
}

/// Where results go.
pub struct Output {
    json: bool,
}

impl Output {
    pub fn new(json: bool) -> Output {
        Output { json }
    }

    pub fn is_json(&self) -> bool {
        self.json
    }

    pub fn json(&self, v: &serde_json::Value) {
        println!("{}", serde_json::to_string_pretty(v).expect("json"));
    }

    pub fn run_report(&self, r: &RunReport) {
        if self.json {
            self.json(&serde_json::to_value(r).expect("report serializes"));
            return;
        }
        match (r.outcome.as_str(), r.strategy.as_str()) {
            ("skipped", _) => println!("{} {}: skipped, {}", r.job, r.run_date, r.skip_reason.as_deref().unwrap_or("")),
            (_, "merge") => println!(
                "{} {}: merged into {} — {} inserted, {} updated, {} deleted, {} unchanged, {} source duplicates collapsed{}",
                r.job,
                r.run_date,
                r.target,
                r.rows_inserted,
                r.rows_updated,
                r.rows_deleted,
                r.rows_unchanged,
                r.duplicates_collapsed,
                if r.created_target { " (table created)" } else { "" }
            ),
            _ => println!(
                "{} {}: replaced partition of {} — {} rows deleted, {} inserted{}",
                r.job,
                r.run_date,
                r.target,
                r.rows_deleted,
                r.rows_inserted,
                if r.created_target { " (table created)" } else { "" }
            ),
        }
        println!("  run key  {}", r.run_key);
        println!("  input    {} rows, checksum {}", r.input_rows, r.input_checksum);
        println!("  output   {} rows, checksum {}", r.output_rows, r.output_checksum);
    }

    pub fn fingerprint(&self, table: &TableName, fp: &Fingerprint) {
        if self.json {
            self.json(&json!({"table": table.to_string(), "rows": fp.rows, "checksum": fp.checksum, "kind": fp.kind}));
        } else {
            println!("{table}: {} rows, checksum {} ({})", fp.rows, fp.checksum, fp.kind);
        }
    }

    pub fn error(&self, e: &Error) {
        let hint = e.hint();
        eprintln!("error: {e}");
        if let Some(h) = &hint {
            eprintln!("hint: {h}");
        }
        if self.json {
            let mut v = json!({"error": {"class": class_name(e.class()), "message": e.to_string(), "hint": hint, "exit_code": exit_code(e)}});
            if let Error::OutOfPartition { rows, column, sample, .. } = e {
                v["error"]["rows"] = json!(rows);
                v["error"]["column"] = json!(column);
                v["error"]["sample"] = json!(sample.0.iter().cloned().collect::<std::collections::BTreeMap<_, _>>());
            }
            self.json(&v);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::redact_url;

    #[test]
    fn passwords_are_hidden() {
        assert_eq!(redact_url("postgres://u:s3cret@localhost:5432/db"), "postgres://u:***@localhost:5432/db");
        assert_eq!(redact_url("postgres://u@localhost/db"), "postgres://u@localhost/db");
        assert_eq!(redact_url("duckdb:x.duckdb"), "duckdb:x.duckdb");
        assert_eq!(redact_url("postgres://u:p@ss@h/db"), "postgres://u:***@h/db");
    }
}
