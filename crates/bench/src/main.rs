//! `fixpoint-bench`: fixpoint against the hand-written SQL for the same
//! work on the same engine, both sides checked to give the same result,
//! rounds alternating (BENCHMARKS.md has the commands and the figures).
//!
//! The fixpoint side runs the `fixpoint` binary built beside this one
//! (`cargo build --release -p fixpoint-cli -p fixpoint-bench`), or the one
//! `--fixpoint` names; the hand-written side runs in a child of this binary
//! (`fixpoint-bench sql …`), so both sides pay for a process of their own.

mod bench;
mod bench_files;
mod bench_history;
mod bench_pg;
#[cfg(feature = "spark")]
mod bench_spark;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};

#[derive(Parser)]
#[command(name = "fixpoint-bench", version, about = "Measure fixpoint against hand-written SQL (see BENCHMARKS.md)")]
#[command(args_conflicts_with_subcommands = true)]
struct Cli {
    #[command(subcommand)]
    sql: Option<Sub>,
    #[command(flatten)]
    bench: bench::BenchArgs,
}

#[derive(Subcommand)]
enum Sub {
    /// The hand-written SQL side (run by the benchmark in a child process).
    #[command(hide = true)]
    Sql(bench::BenchSqlArgs),
}

/// Output format of the figures.
#[derive(Copy, Clone, PartialEq, Eq, ValueEnum)]
pub enum Format {
    Text,
    Json,
}

/// Where the figures go: a JSON object on stdout, or text lines (stderr
/// carries the progress either way).
pub struct Output {
    json: bool,
}

impl Output {
    pub fn is_json(&self) -> bool {
        self.json
    }

    pub fn json(&self, v: &serde_json::Value) {
        println!("{}", serde_json::to_string_pretty(v).expect("json"));
    }
}

/// The `fixpoint` binary the fixpoint side runs.
pub fn fixpoint_exe(given: Option<&PathBuf>) -> Result<PathBuf, fixpoint_core::Error> {
    if let Some(p) = given {
        return Ok(p.clone());
    }
    let me = std::env::current_exe().map_err(|source| fixpoint_core::Error::Io { path: "fixpoint-bench".into(), source })?;
    let beside = me.with_file_name(format!("fixpoint{}", std::env::consts::EXE_SUFFIX));
    if beside.is_file() {
        Ok(beside)
    } else {
        Err(fixpoint_core::Error::argument(
            format!("no fixpoint binary beside {}", me.display()),
            Some("build both: cargo build --release -p fixpoint-cli -p fixpoint-bench, or pass --fixpoint PATH"),
        ))
    }
}

/// The fixpoint binary, chosen once.
static FIXPOINT: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();

/// A command running the fixpoint binary.
pub fn fixpoint_command() -> std::process::Command {
    std::process::Command::new(FIXPOINT.get().expect("chosen before any run"))
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.sql {
        Some(Sub::Sql(args)) => bench::run_sql(args),
        None => fixpoint_exe(cli.bench.fixpoint.as_ref()).and_then(|exe| {
            FIXPOINT.set(exe).expect("set once");
            let out = Output { json: cli.bench.output == Format::Json };
            bench::run(cli.bench, &out)
        }),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            if let Some(h) = e.hint() {
                eprintln!("hint: {h}");
            }
            ExitCode::from(if e.class() == fixpoint_core::ErrorClass::Input { 2 } else { 1 })
        }
    }
}
