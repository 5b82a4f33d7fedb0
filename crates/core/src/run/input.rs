//! A run's input: the run parameters, a file source's files made readable,
//! the source query described.


use crate::engine::{Column, Engine};
use crate::error::{Error, Result};
use crate::fingerprint::runkey::run_key;
use crate::job::date::RunDate;
use crate::job::spec::Job;
use crate::job::sql::RunParams;

/// A run's input: the run parameters (with the relation a file source's
/// query reads as `input`) and, for a file source, its hashed files.
pub(crate) struct RunInput {
    /// The parameters, run key empty.
    pub params: RunParams,
    /// The files, for a file source.
    pub files: Option<crate::job::files::InputFiles>,
    /// Whether the files alone decide the run key (the query reads nothing else).
    pub key_from_files: bool,
}

impl RunInput {
    /// The run key, when the files alone decide it: known before any row
    /// is read. `None` for a SQL source, and for a file source whose query
    /// also reads tables (its key comes from the query's rows).
    pub(crate) fn file_key(&self, job_hash: &str, run_date: RunDate) -> Option<String> {
        self.files.as_ref().filter(|_| self.key_from_files).map(|f| run_key(job_hash, run_date, &f.fingerprint()))
    }
}

/// Runs `body` with the run's input ready: for a file source, the day's
/// files matched, checked, hashed and made readable (and released after,
/// whatever happens). `Ok(None)`: no file matched and the job allows it.
/// A database error naming one of the files becomes an error about that file.
pub(crate) fn with_input<T>(
    job: &Job,
    run_date: RunDate,
    engine: &mut dyn Engine,
    body: impl FnOnce(&mut dyn Engine, &RunInput) -> Result<T>,
) -> Result<Option<T>> {
    let mut params = RunParams::new(run_date.date());
    let Some(source) = &job.source.files else {
        return body(engine, &RunInput { params, files: None, key_from_files: false }).map(Some);
    };
    let Some(mut files) = source.resolve(run_date)? else { return Ok(None) };
    files.fetch()?;
    let staged = crate::engine::file_input(engine).and_then(|f| f.stage_files(&files));
    let result = match staged {
        Ok(relation) => {
            params.input = Some(relation);
            let input = RunInput { params, files: Some(files.clone()), key_from_files: job.source.key_from_files() };
            let r = body(engine, &input);
            // Once the run committed, a failed cleanup (the connection gone:
            // the staged table goes with it) does not make it a failed run.
            if let (Ok(_), Err(e)) = (&r, release_files(engine)) {
                eprintln!("fixpoint: {} {run_date}: could not drop the staged files ({e}); the run itself committed", job.name);
            }
            r
        }
        Err(e) => {
            let _ = release_files(engine);
            Err(e)
        }
    };
    result.map(Some).map_err(|e| file_error(e, &files, job, run_date))
}

/// A database error that names one of the run's files, as an error about the file.
fn file_error(e: Error, files: &crate::job::files::InputFiles, job: &Job, run_date: RunDate) -> Error {
    let Error::Database { message, .. } = &e else { return e };
    let message = message.clone();
    let Some(file) = files.named_in(&message) else { return e };
    // The reader's first line says what is wrong (and where, when it knows);
    // the rest is about its own options and the query fixpoint wrote.
    let mut reason: Vec<&str> = message.lines().take(1).collect();
    reason.extend(message.lines().skip(1).filter(|l| l.starts_with("CSV Error on Line") || l.starts_with("Original Line")));
    Error::Files {
        message: format!("cannot read {file} ({} file of job {} for {run_date}): {}; nothing was changed", files.format.name(), job.name, reason.join(" ").trim()),
        hint: Some("replace the file with a complete, valid one (or remove it) and run again; the target keeps its previous contents".into()),
    }
}

/// Source columns, described with the run key left empty.
pub(crate) fn describe_source(job: &Job, engine: &mut dyn Engine, params: &RunParams) -> Result<Vec<Column>> {
    let sql = job.source.template().render(params);
    engine.describe(&sql).map_err(|e| match e {
        // The query's own fault (an unknown table or column, a syntax or
        // type error): the user's to fix, exit 2.
        Error::Database { engine, message, failure, .. } if failure.is_statement() => Error::Sql {
            what: format!("source.sql of job {} ({engine})", job.name),
            message: message.trim().to_owned(),
            hint: Some("run the query by hand with the run's parameters bound, and fix the table or column it names".into()),
        },
        Error::Database { engine, message, failure, .. } => Error::Database {
            engine,
            context: format!("the source query of job {} does not run", job.name),
            message,
            failure,
        },
        other => other,
    })
}

/// Drops what a file source staged (nothing on an engine without file input).
pub(crate) fn release_files(engine: &mut dyn Engine) -> Result<()> {
    engine.file_input().map_or(Ok(()), |f| f.release_files())
}
