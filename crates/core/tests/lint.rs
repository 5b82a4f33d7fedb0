//! The lint corpus: one job file per finding under tests/lint/, each with
//! its exact findings (rule, severity, line and column in the job file), in
//! every dialect.

use std::path::Path;

use fixpoint_core::tools::lint::{lint, Severity, SqlDialect};
use fixpoint_core::Job;

fn findings(file: &str, dialect: SqlDialect) -> Vec<(String, Severity, usize, usize)> {
    let job = Job::from_file(&Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/lint").join(file)).unwrap();
    lint(&job, dialect).unwrap().into_iter().map(|f| (f.rule.to_owned(), f.severity, f.line, f.column)).collect()
}

#[test]
fn corpus() {
    use Severity::{Error as E, Warning as W};
    let cases: &[(&str, &[(&str, Severity, usize, usize)])] = &[
        ("clean_dedup.toml", &[]),
        ("clock_in_metadata.toml", &[]),
        ("clock_in_value.toml", &[("clock", E, 7, 25)]),
        ("clock_in_filter.toml", &[("clock", E, 10, 21)]),
        ("random_uuid.toml", &[("random", E, 8, 8)]),
        ("random_filter.toml", &[("random", E, 9, 26)]),
        ("tablesample.toml", &[("random", E, 8, 26)]),
        ("row_number_unordered.toml", &[("order", E, 9, 13)]),
        ("dedup_version_only.toml", &[("order", W, 10, 13)]),
        ("string_agg_unordered.toml", &[("order", E, 8, 18)]),
        ("limit_unordered.toml", &[("order", E, 8, 1)]),
        ("distinct_on_unordered.toml", &[("order", E, 8, 1)]),
        ("no_scope.toml", &[("scope", E, 7, 8)]),
        ("files_clean.toml", &[]),
        ("files_no_date.toml", &[("scope", E, 7, 10)]),
        ("generated_key.toml", &[("keys", E, 9, 8)]),
        // DuckDB syntax: read with the DuckDB dialect only.
        ("using_sample.toml", &[("random", E, 8, 40)]),
        ("using_sample_seeded.toml", &[]),
        // Spark syntax (backticks; double quotes are identifiers in
        // fixpoint's Spark sessions): read with the Spark dialect only.
        ("spark_quoted.toml", &[("random", E, 8, 39)]),
    ];
    let files: Vec<String> = std::fs::read_dir(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/lint"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|f| f != "parse_error.toml")
        .collect();
    assert_eq!(files.len(), cases.len(), "every corpus file has its expectation");
    for (file, expected) in cases {
        let expected: Vec<(String, Severity, usize, usize)> = expected.iter().map(|(r, s, l, c)| (r.to_string(), *s, *l, *c)).collect();
        let dialects: &[SqlDialect] = if file.starts_with("using_sample") {
            &[SqlDialect::DuckDb]
        } else if file.starts_with("spark_") {
            &[SqlDialect::Spark]
        } else {
            &[SqlDialect::DuckDb, SqlDialect::Postgres, SqlDialect::Spark]
        };
        for &dialect in dialects {
            assert_eq!(findings(file, dialect), expected, "{file} ({dialect:?})");
        }
    }
}

#[test]
fn messages_name_the_problem_and_the_fix() {
    let job = Job::from_file(&Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/lint/dedup_version_only.toml")).unwrap();
    let f = &lint(&job, SqlDialect::DuckDb).unwrap()[0];
    assert_eq!(f.message, "row_number() orders the key's versions by updated_at alone: two rows with one version tie, and the engine picks either");
    assert!(f.hint.contains("tie-break"));
    assert_eq!((f.sql_line, f.sql_column), (2, 13));
    let job = Job::from_file(&Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/lint/clock_in_filter.toml")).unwrap();
    assert!(lint(&job, SqlDialect::DuckDb).unwrap()[0].message.contains("in a filter"));
}

#[test]
fn unparsable_sql_is_an_error_with_its_position() {
    let job = Job::from_file(&Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/lint/parse_error.toml")).unwrap();
    let e = lint(&job, SqlDialect::DuckDb).unwrap_err().to_string();
    assert_eq!(e, "source.sql: cannot be read as DuckDB SQL: sql parser error: Expected: table name, found: WHERE at Line: 1, Column: 23");
    let e = lint(&job, SqlDialect::Postgres).unwrap_err().to_string();
    assert!(e.starts_with("source.sql: cannot be read as PostgreSQL SQL:") && e.contains("Line: 1, Column: 23"), "{e}");
    let e = lint(&job, SqlDialect::Spark).unwrap_err().to_string();
    assert!(e.starts_with("source.sql: cannot be read as Spark SQL:") && e.contains("Line: 1, Column: 23"), "{e}");
}
