//! File sources: a day's bronze files (Parquet, CSV, JSON Lines) found by a
//! pattern with the run date in it, checked for completeness, and hashed.
//!
//! The input fingerprint of a file source is a BLAKE3 hash of every matched
//! file's content, combined over the files' paths (relative to the fixed
//! part of the pattern) and sizes, in sorted order. It does not depend on
//! where the bronze folder lives, on the machine, or on the engine: the
//! same files give the same run key anywhere; one changed byte, one added or
//! removed file gives another.
//!
//! Conventions for files still being written: names starting with `_` or `.`
//! (in any folder below the pattern's fixed part) are never loaded (Spark's
//! `_SUCCESS` and `_temporary/`, Hadoop's `.crc`, editors' and uploaders'
//! dot-files). With `require_marker = "_SUCCESS"`, every folder holding a
//! matched file must also hold the marker, which the upstream writes last.
//!
//! A file that cannot be a day's input is refused before anything is read
//! into the engine: an empty (0-byte) file of any format, a CSV file whose
//! first line names no column (no header), a JSON file holding only
//! whitespace (the engines would make up a column for each: `column0`,
//! `json`). A CSV file with its header and no row is a day without rows,
//! which `min_rows` governs. Each file is loaded once, by its real path: two
//! names for one file (a symbolic link beside its target) load it once, and a
//! symbolic link to a folder on its own path (`dt=…/loop -> .`, which a `**`
//! pattern would follow again and again) is refused, naming the link.

use std::collections::{HashMap, HashSet};
use std::path::{Component, Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::job::date::RunDate;
use crate::error::{Error, Result};

/// The fingerprint kind of a file source's input.
pub const FILES_KIND: &str = "files-blake3-v1";

/// The fingerprint kind of a file source's input on object storage: each
/// object's key, size and ETag (a change token, not a content hash).
pub const OBJECTS_KIND: &str = "files-s3-etag-v1";

/// How the files are read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum FileFormat {
    /// Apache Parquet.
    #[default]
    Parquet,
    /// CSV with a header line (delimiter and types detected).
    Csv,
    /// JSON: one object per line (JSON Lines), or a top-level array of
    /// objects (one row per element).
    Json,
}

impl FileFormat {
    /// The name in job files.
    pub fn name(self) -> &'static str {
        match self {
            FileFormat::Parquet => "parquet",
            FileFormat::Csv => "csv",
            FileFormat::Json => "json",
        }
    }

    /// Parses a name given by [`FileFormat::name`].
    pub fn parse(s: &str) -> Option<FileFormat> {
        [FileFormat::Parquet, FileFormat::Csv, FileFormat::Json].into_iter().find(|f| f.name() == s)
    }

    /// The format a file name's extension implies (compressed CSV and JSON too).
    pub fn from_extension(name: &str) -> Option<FileFormat> {
        let lower = name.to_ascii_lowercase();
        let stem = ["gz", "zst"].iter().find_map(|c| lower.strip_suffix(&format!(".{c}"))).unwrap_or(&lower);
        let ext = stem.rsplit('.').next()?;
        match ext {
            "parquet" | "pq" => Some(FileFormat::Parquet),
            "csv" | "tsv" => Some(FileFormat::Csv),
            "json" | "jsonl" | "ndjson" => Some(FileFormat::Json),
            _ => None,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
enum Piece {
    Text(String),
    /// `{run_date}` or `{run_date:FORMAT}`: a chrono strftime format.
    Date(String),
}

/// `[source] files = …`: where a day's files are and how to read them.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FileSource {
    /// The pattern as written in the job file.
    pub pattern: String,
    /// How the files are read.
    pub format: FileFormat,
    /// Whether a day without files is skipped (left as it is) instead of refused.
    #[serde(skip)]
    pub allow_missing: bool,
    /// A file every folder of matched files must hold before any is loaded.
    #[serde(skip)]
    pub require_marker: Option<String>,
    #[serde(skip)]
    pieces: Vec<Piece>,
    /// The folder relative patterns start from (the job file's folder).
    #[serde(skip)]
    pub dir: PathBuf,
    /// For `s3://` patterns: options of the S3 client beside the `AWS_*`
    /// environment variables (object_store's names: `aws_endpoint_url`,
    /// `aws_region`, …), for programs that use fixpoint as a library.
    #[serde(skip)]
    pub s3_options: Vec<(String, String)>,
}

/// One matched file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InputFile {
    /// The path below the pattern's fixed part, with `/` separators.
    pub path: String,
    /// Bytes.
    pub size: u64,
    /// BLAKE3 of the content, hex (empty for an object on object storage).
    pub blake3: String,
    /// An object's ETag (object storage only): the server's change token.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub etag: Option<String>,
}

/// The files of one run, hashed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct InputFiles {
    /// Combined hash over (path, size, content hash) of every file, sorted by path.
    pub checksum: String,
    /// The files, sorted by path.
    pub files: Vec<InputFile>,
    /// The folder the paths are relative to (not part of the fingerprint).
    #[serde(skip)]
    pub base: PathBuf,
    /// How to read them.
    #[serde(skip)]
    pub format: FileFormat,
    /// Where they come from when they are not local files.
    #[serde(skip)]
    pub origin: Origin,
}

/// Where a file source's files are when they are objects on object
/// storage: the bucket, the key prefix the paths are relative to, and,
/// once [`InputFiles::fetch`] has read them, the local folder holding them
/// (removed when the last copy of the files is dropped).
#[derive(Clone, Default)]
pub struct Origin {
    /// `s3://bucket/prefix`, for messages.
    url: Option<String>,
    #[cfg(feature = "s3")]
    remote: Option<Remote>,
}

#[cfg(feature = "s3")]
#[derive(Clone)]
struct Remote {
    bucket: std::sync::Arc<crate::job::objects::Bucket>,
    /// The key prefix the paths are relative to (no slash at its end).
    prefix: String,
    /// The local copies, once read.
    local: Option<std::sync::Arc<tempfile::TempDir>>,
}

impl Origin {
    /// `s3://bucket/prefix` for files on object storage.
    pub fn url(&self) -> Option<&str> {
        self.url.as_deref()
    }
}

impl std::fmt::Debug for Origin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Origin({:?})", self.url)
    }
}

impl PartialEq for Origin {
    fn eq(&self, other: &Origin) -> bool {
        self.url == other.url
    }
}

impl InputFiles {
    /// The fingerprint kind of these files: [`FILES_KIND`], or
    /// [`OBJECTS_KIND`] for objects.
    pub fn kind(&self) -> &'static str {
        if self.files.iter().any(|f| f.etag.is_some()) {
            OBJECTS_KIND
        } else {
            FILES_KIND
        }
    }

    /// Where the files are, for messages: the folder, or `s3://bucket/prefix`.
    pub fn shown_base(&self) -> String {
        self.origin.url().map_or_else(|| self.base.display().to_string(), str::to_owned)
    }

    /// Makes the files readable by path: objects on object storage are read
    /// (each exactly as listed, or the read fails) into a local folder of
    /// this process, which [`InputFiles::base`] then names, and checked as
    /// local files are. Local files: nothing to do.
    pub fn fetch(&mut self) -> Result<()> {
        #[cfg(feature = "s3")]
        if let Some(remote) = &self.origin.remote {
            if remote.local.is_some() {
                return Ok(());
            }
            let dir = crate::job::objects::run_folder()?;
            let objects: Vec<(crate::job::objects::Object, PathBuf)> = self
                .files
                .iter()
                .map(|f| {
                    let key = if remote.prefix.is_empty() { f.path.clone() } else { format!("{}/{}", remote.prefix, f.path) };
                    // The key's whole path below the folder: its `key=value`
                    // folders (hive style) are columns, as for local files.
                    let local = dir.path().join(&key);
                    (crate::job::objects::Object { key, size: f.size, etag: f.etag.clone() }, local)
                })
                .collect();
            remote.bucket.download(&objects)?;
            let shown = self.shown_base();
            for (file, (_, local)) in self.files.iter().zip(&objects) {
                let peek = peek_file(local)?;
                refuse_empty(self.format, file, peek, &shown)?;
            }
            self.base = dir.path().join(&remote.prefix);
            let mut remote = remote.clone();
            remote.local = Some(std::sync::Arc::new(dir));
            self.origin.remote = Some(remote);
        }
        Ok(())
    }

    /// The files' full paths, in order.
    pub fn paths(&self) -> Vec<PathBuf> {
        self.files.iter().map(|f| self.base.join(&f.path)).collect()
    }

    /// The files' full paths as text (UTF-8 is required of file sources).
    pub fn path_strings(&self) -> Vec<String> {
        self.paths().iter().map(|p| p.to_string_lossy().into_owned()).collect()
    }

    /// The relative path of the file a message names, if any.
    pub fn named_in(&self, message: &str) -> Option<&str> {
        let full = self.path_strings();
        let by_full = self.files.iter().zip(&full).find(|(_, p)| message.contains(p.as_str()));
        // A relative name only as a whole path component, so `11.csv` is not `1.csv`.
        let by_rel = || self.files.iter().find(|f| ["/", "\"", "'"].iter().any(|b| message.contains(&format!("{b}{}", f.path))));
        by_full.map(|(f, _)| f).or_else(by_rel).map(|f| f.path.as_str())
    }
}

/// Whether a file name says its content is compressed (`.gz`, `.zst`).
pub fn is_compressed(name: &str) -> bool {
    let lower = name.to_ascii_lowercase();
    lower.ends_with(".gz") || lower.ends_with(".zst")
}

/// The refusal of a CSV file that has no header line: empty, or a first
/// line that names no column (blank, or only delimiters and quotes).
/// `file` is the file's path as shown to the user.
pub fn headerless_csv(file: &str) -> Error {
    Error::Files {
        message: format!("{file} has no header line (its first line names no column), so it cannot be read as a CSV file with a header; nothing was changed"),
        hint: Some("replace it with the complete file (a day without rows is a CSV file with its header line and no row), or remove it, and run again; the target keeps its previous contents".into()),
    }
}

/// Whether a glob component holds a wildcard.
fn is_wild(s: &str) -> bool {
    s.contains(['*', '?', '['])
}

impl FileSource {
    /// Reads `files = …` and its companions; errors are `(key, message)`.
    pub fn parse(
        pattern: &str,
        format: Option<&str>,
        allow_missing: bool,
        require_marker: Option<String>,
        dir: PathBuf,
    ) -> std::result::Result<FileSource, (String, String)> {
        let err = |m: String| ("source.files".to_owned(), m);
        if pattern.trim().is_empty() {
            return Err(err("is empty: expected a path or glob, e.g. files = \"bronze/orders/dt={run_date}/*.parquet\"".into()));
        }
        if let Some(scheme) = url_scheme(pattern) {
            if scheme != "s3" {
                return Err(err(format!("{pattern:?}: {scheme}:// is not supported; file sources read local paths and s3:// URLs (S3 or an S3-compatible server)")));
            }
            let bucket = pattern["s3://".len()..].split('/').next().unwrap_or_default();
            if bucket.is_empty() || bucket.contains(['{', '*', '?', '[']) {
                return Err(err(format!("{pattern:?} names no bucket: expected s3://bucket/path, e.g. s3://lake/bronze/orders/dt={{run_date}}/*.parquet")));
            }
            if cfg!(not(feature = "s3")) {
                return Err(err(format!(
                    "{pattern:?}: this build of fixpoint reads local files only; files on S3 need the `s3` feature (cargo build --release --features fixpoint-cli/s3)"
                )));
            }
        }
        let mut pieces = Vec::new();
        let mut rest = pattern;
        while let Some(open) = rest.find('{') {
            if open > 0 {
                pieces.push(Piece::Text(rest[..open].to_owned()));
            }
            let close = rest[open..].find('}').map(|c| open + c).ok_or_else(|| err(format!("{pattern:?}: `{{` without a closing `}}`")))?;
            let inner = &rest[open + 1..close];
            let fmt = match inner.split_once(':') {
                None if inner == "run_date" => "%Y-%m-%d".to_owned(),
                Some(("run_date", f)) if !f.is_empty() => f.to_owned(),
                _ => {
                    return Err(err(format!(
                        "{pattern:?}: unknown placeholder {{{inner}}}; expected {{run_date}} or {{run_date:FORMAT}}, e.g. {{run_date:%Y/%m/%d}}"
                    )))
                }
            };
            let bad = chrono::format::StrftimeItems::new(&fmt).any(|i| matches!(i, chrono::format::Item::Error));
            if bad {
                return Err(err(format!("{pattern:?}: {{run_date:{fmt}}} is not a valid date format; use strftime codes such as %Y, %m, %d, %j")));
            }
            pieces.push(Piece::Date(fmt));
            rest = &rest[close + 1..];
        }
        if !rest.is_empty() {
            pieces.push(Piece::Text(rest.to_owned()));
        }
        let format = match format {
            Some(f) => FileFormat::parse(f).ok_or_else(|| ("source.format".to_owned(), format!("{f:?}: expected \"parquet\", \"csv\" or \"json\"")))?,
            None => {
                let last = pattern.rsplit(['/', '\\']).next().unwrap_or(pattern);
                FileFormat::from_extension(last).ok_or_else(|| {
                    (
                        "source.format".to_owned(),
                        format!("missing, and {pattern:?} has no extension that names one: expected format = \"parquet\", \"csv\" or \"json\""),
                    )
                })?
            }
        };
        if let Some(m) = &require_marker {
            if m.is_empty() || m.contains(['/', '\\']) || is_wild(m) {
                return Err(("source.require_marker".to_owned(), format!("{m:?}: expected a file name, e.g. \"_SUCCESS\"")));
            }
        }
        let source = FileSource { pattern: pattern.to_owned(), format, allow_missing, require_marker, pieces, dir, s3_options: Vec::new() };
        // The pattern must be a valid glob whatever the date.
        let sample = source.expand(RunDate::parse("2026-01-31").expect("a date"));
        glob::Pattern::new(&sample.to_string_lossy()).map_err(|e| err(format!("{pattern:?} is not a valid glob: {}", e.msg)))?;
        Ok(source)
    }

    /// Whether the pattern holds the run date (else every run reads the same files).
    pub fn uses_run_date(&self) -> bool {
        self.pieces.iter().any(|p| matches!(p, Piece::Date(_)))
    }

    /// The pattern with the run date filled in, made absolute from
    /// [`FileSource::dir`] (a URL as it is).
    pub fn expand(&self, run_date: RunDate) -> PathBuf {
        match self.is_remote() {
            true => PathBuf::from(self.expand_text(run_date)),
            false => self.dir.join(self.expand_text(run_date)),
        }
    }

    /// Whether the files are objects on object storage (`s3://…`).
    pub fn is_remote(&self) -> bool {
        url_scheme(&self.pattern).is_some()
    }

    /// The pattern as written, with the run date filled in (not joined to the folder).
    fn expand_text(&self, run_date: RunDate) -> String {
        let mut text = String::new();
        for p in &self.pieces {
            match p {
                Piece::Text(t) => text.push_str(t),
                Piece::Date(f) => text.push_str(&run_date.date().format(f).to_string()),
            }
        }
        text
    }

    /// The files of `run_date`: matched, checked and hashed. `Ok(None)` when
    /// none matched and `allow_missing` is set.
    ///
    /// Objects on object storage are listed, not read: their keys, sizes and
    /// ETags make the fingerprint; [`InputFiles::fetch`] reads them.
    pub fn resolve(&self, run_date: RunDate) -> Result<Option<InputFiles>> {
        if self.is_remote() {
            return self.resolve_objects(run_date);
        }
        let pattern = self.expand(run_date);
        // The fixed part: the job's folder, then every component of the
        // pattern before the first wildcard.
        let mut base = self.dir.clone();
        for c in Path::new(&self.expand_text(run_date)).components() {
            if is_wild(&c.as_os_str().to_string_lossy()) {
                break;
            }
            base.push(c);
        }
        let fixed_is_file = base == pattern;
        if fixed_is_file {
            base.pop();
        }
        let shown = pattern.to_string_lossy().into_owned();
        let refuse = |message: String, hint: &str| Error::Files { message, hint: Some(hint.to_owned()) };
        let options = glob::MatchOptions { case_sensitive: true, require_literal_separator: true, require_literal_leading_dot: true };
        // The job's folder is a path, not a pattern: its `[` or `*` match themselves.
        let text = self.expand_text(run_date);
        let glob_text = if Path::new(&text).is_absolute() || self.dir.as_os_str().is_empty() {
            text.clone()
        } else {
            let dir = self.dir.to_string_lossy();
            format!("{}{}{text}", glob::Pattern::escape(&dir), std::path::MAIN_SEPARATOR)
        };
        let paths = glob::glob_with(&glob_text, options)
            .map_err(|e| refuse(format!("{shown:?} is not a valid glob: {}", e.msg), "fix `files` under [source]"))?;
        // Names the pattern spells out are loaded even if they start with `_` or `.`.
        let literal: Vec<&str> = text.split(['/', '\\']).filter(|c| !is_wild(c)).collect();
        let mut matched = Vec::new();
        let mut ignored = Vec::new();
        let mut real = RealDirs::new(&base);
        for entry in paths {
            let path = match entry {
                Ok(p) => p,
                Err(e) => {
                    // A folder that cannot be read because a symlink cycle
                    // made its path too deep: the cycle is what to fix.
                    real.check(e.path())?;
                    return Err(Error::Io { path: e.path().to_owned(), source: std::io::Error::new(e.error().kind(), e.error().to_string()) });
                }
            };
            if !path.is_file() {
                continue;
            }
            if path.to_str().is_none() {
                return Err(refuse(
                    format!("{} is not a UTF-8 file name; nothing was changed", path.display()),
                    "rename the file (file sources need UTF-8 names, so that a day's fingerprint is the same on every machine)",
                ));
            }
            let rel = relative(&path, &base);
            if rel.contains(GLOB_CHARS) {
                return Err(glob_named(&rel, &base.display().to_string()));
            }
            let hidden = rel.split('/').any(|c| (c.starts_with('_') || c.starts_with('.')) && !literal.contains(&c));
            if hidden {
                ignored.push(rel);
            } else {
                matched.push((rel, path));
            }
        }
        if matched.is_empty() {
            return match self.allow_missing {
                true => Ok(None),
                false => Err(nothing_matched(&shown, run_date, &ignored)),
            };
        }
        matched.sort();
        // Each real file once; a symlink cycle refused.
        let matched = real.files(matched)?;
        if let Some(marker) = &self.require_marker {
            let mut dirs: Vec<PathBuf> = matched.iter().filter_map(|(_, p)| p.parent().map(Path::to_path_buf)).collect();
            dirs.sort();
            dirs.dedup();
            for d in dirs {
                if !d.join(marker).is_file() {
                    return Err(no_marker(&d.display().to_string(), marker));
                }
            }
        }
        // One file per core (each read and hashed in blocks); a lone file
        // is hashed block by block on every core.
        use rayon::prelude::*;
        let lone = matched.len() == 1;
        let hashed: Vec<Result<(InputFile, Peek)>> = matched
            .par_iter()
            .map(|(rel, path)| {
                let size = std::fs::metadata(path).map_err(|e| Error::Io { path: path.clone(), source: e })?.len();
                let (blake3, peek) = hash_file_with(path, lone)?;
                Ok((InputFile { path: rel.clone(), size, blake3, etag: None }, peek))
            })
            .collect();
        // In path order, so that the error named is always the same one.
        let mut files = Vec::with_capacity(hashed.len());
        let shown_base = base.display().to_string();
        for h in hashed {
            let (file, peek) = h?;
            refuse_empty(self.format, &file, peek, &shown_base)?;
            files.push(file);
        }
        Ok(Some(InputFiles { checksum: combine(&files), files, base, format: self.format, origin: Origin::default() }))
    }

    /// [`FileSource::resolve`] for `s3://` patterns: the objects below the
    /// pattern's fixed part listed, matched as the glob says, and checked by
    /// the rules of local files (names starting with `_` or `.`, glob
    /// characters, `require_marker`, empty objects; the content checks wait
    /// for [`InputFiles::fetch`]).
    #[cfg(feature = "s3")]
    fn resolve_objects(&self, run_date: RunDate) -> Result<Option<InputFiles>> {
        use crate::job::objects::{split_s3_url, Bucket};
        let text = self.expand_text(run_date);
        let (bucket_name, key_pattern) = split_s3_url(&text).ok_or_else(|| Error::Internal(format!("{text:?} is not an s3:// URL")))?;
        let parts: Vec<&str> = key_pattern.split('/').collect();
        let mut fixed: Vec<&str> = parts.iter().take_while(|c| !is_wild(c)).copied().collect();
        if fixed.len() == parts.len() {
            fixed.pop();
        }
        let prefix = fixed.join("/");
        let base_url = format!("s3://{bucket_name}/{prefix}");
        let glob = glob::Pattern::new(key_pattern)
            .map_err(|e| Error::Files { message: format!("{text:?} is not a valid glob: {}", e.msg), hint: Some("fix `files` under [source]".into()) })?;
        let options = glob::MatchOptions { case_sensitive: true, require_literal_separator: true, require_literal_leading_dot: true };
        let literal: Vec<&str> = parts.iter().filter(|c| !is_wild(c)).copied().collect();
        let bucket = Bucket::open(bucket_name, &self.s3_options)?;
        let listed = bucket.list(&prefix)?;
        let keys: HashSet<&str> = listed.iter().map(|o| o.key.as_str()).collect();
        let mut matched = Vec::new();
        let mut ignored = Vec::new();
        for o in &listed {
            if o.key.ends_with('/') || !glob.matches_with(&o.key, options) {
                continue;
            }
            let rel = if prefix.is_empty() { o.key.clone() } else { o.key[prefix.len() + 1..].to_owned() };
            if rel.contains(GLOB_CHARS) {
                return Err(glob_named(&rel, &base_url));
            }
            if o.key.split('/').any(|c| c.is_empty() || c == "." || c == "..") {
                return Err(Error::Files {
                    message: format!("s3://{bucket_name}/{} has an empty, `.` or `..` folder in its key, which no local path can mirror; nothing was changed", o.key),
                    hint: Some("rename the object (keys of a day's files are folder/…/file names)".into()),
                });
            }
            if rel.split('/').any(|c| (c.starts_with('_') || c.starts_with('.')) && !literal.contains(&c)) {
                ignored.push(rel);
            } else {
                matched.push((rel, o));
            }
        }
        if matched.is_empty() {
            return match self.allow_missing {
                true => Ok(None),
                false => Err(nothing_matched(&text, run_date, &ignored)),
            };
        }
        if let Some(marker) = &self.require_marker {
            let mut dirs: Vec<&str> = matched.iter().map(|(_, o)| o.key.rsplit_once('/').map_or("", |(d, _)| d)).collect();
            dirs.dedup();
            for d in dirs {
                let want = if d.is_empty() { marker.clone() } else { format!("{d}/{marker}") };
                if !keys.contains(want.as_str()) {
                    return Err(no_marker(&format!("s3://{bucket_name}/{d}"), marker));
                }
            }
        }
        let mut files = Vec::with_capacity(matched.len());
        for (rel, o) in matched {
            let etag = o.etag.clone().ok_or_else(|| Error::Files {
                message: format!("the server gives no ETag for s3://{bucket_name}/{}, so fixpoint cannot tell a changed object from the one it loaded; nothing was changed", o.key),
                hint: Some("use a server that returns ETags (S3 and the S3-compatible servers do), or copy the day's files to a local folder".into()),
            })?;
            let file = InputFile { path: rel, size: o.size, blake3: String::new(), etag: Some(etag) };
            refuse_empty(self.format, &file, Peek { blank_first_line: false, only_whitespace: false }, &base_url)?;
            files.push(file);
        }
        let origin = Origin { url: Some(base_url), remote: Some(Remote { bucket: std::sync::Arc::new(bucket), prefix, local: None }) };
        Ok(Some(InputFiles { checksum: combine(&files), files, base: PathBuf::new(), format: self.format, origin }))
    }

    #[cfg(not(feature = "s3"))]
    fn resolve_objects(&self, _run_date: RunDate) -> Result<Option<InputFiles>> {
        Err(Error::Internal("s3:// file sources need the `s3` feature (refused when the job was read)".into()))
    }
}

/// Characters a file's name may not hold (the readers take them for a pattern).
const GLOB_CHARS: [char; 6] = ['*', '?', '[', ']', '{', '}'];

/// `scheme` of a `scheme://…` pattern.
fn url_scheme(pattern: &str) -> Option<&str> {
    let (scheme, _) = pattern.split_once("://")?;
    let ok = scheme.len() > 1 && scheme.starts_with(|c: char| c.is_ascii_alphabetic()) && scheme.chars().all(|c| c.is_ascii_alphanumeric() || "+-.".contains(c));
    ok.then_some(scheme)
}

/// No loadable file for the day (the refusal when `allow_missing` is not set).
fn nothing_matched(shown: &str, run_date: RunDate, ignored: &[String]) -> Error {
    let message = if ignored.is_empty() {
        format!("no file matches {shown} (the files of {run_date}); nothing was changed")
    } else {
        format!(
            "no loadable file matches {shown} (the files of {run_date}): only {} whose name starts with `_` or `.`, which are never loaded; nothing was changed",
            ignored.join(", ")
        )
    };
    Error::Files {
        message,
        hint: Some("check that the upstream delivered the day; if a day may have no files, set allow_missing = true under [source] (the day is then skipped, its partition left as it is)".into()),
    }
}

/// A folder of matched files without its `require_marker`.
fn no_marker(folder: &str, marker: &str) -> Error {
    Error::Files {
        message: format!("{folder} has no {marker} marker: its files may still be being written; nothing was changed"),
        hint: Some("run again once the upstream has finished the day (it writes the marker last); or drop require_marker from the job".into()),
    }
}

/// A matched file whose name holds a glob character.
fn glob_named(rel: &str, base: &str) -> Error {
    Error::Files {
        message: format!("{rel} (in {base}) has a name with a glob character (*, ?, [, ], {{ or }}), which the readers would take for a pattern; nothing was changed"),
        hint: Some("rename the file without those characters".into()),
    }
}

/// Refuses a file that cannot be a day's input although it reads: empty
/// (0 bytes), or, uncompressed, a CSV file without a header line or a
/// JSON file without a value. (Compressed ones are checked by the
/// reader, which decompresses them.) `base`: where the file is, for messages.
fn refuse_empty(format: FileFormat, file: &InputFile, peek: Peek, base: &str) -> Result<()> {
    let shown = format!("{} (in {base})", file.path);
    if file.size == 0 {
        let (has, hint) = match format {
            FileFormat::Parquet => (
                "no Parquet footer (its schema)",
                "replace it with the complete file (a day without rows is a Parquet file with its schema and no row), or remove it, and run again; the target keeps its previous contents",
            ),
            FileFormat::Csv => (
                "no header line",
                "replace it with the complete file (a day without rows is a CSV file with its header line and no row), or remove it, and run again; the target keeps its previous contents",
            ),
            FileFormat::Json => (
                "no JSON object",
                "replace it with the complete file, or remove it, and run again (a JSON file cannot say which columns a day without rows has: deliver no file for such a day and set allow_missing = true under [source], which leaves the day as it is); the target keeps its previous contents",
            ),
        };
        return Err(Error::Files {
            message: format!("{shown} is empty (0 bytes): it has {has}, so it cannot be read as a {} file; nothing was changed", format.name()),
            hint: Some(hint.into()),
        });
    }
    if is_compressed(&file.path) {
        return Ok(());
    }
    match format {
        FileFormat::Csv if peek.blank_first_line => Err(headerless_csv(&shown)),
        FileFormat::Json if peek.only_whitespace => Err(Error::Files {
            message: format!("{shown} holds no JSON value (only whitespace), so it has no row and no column to read; nothing was changed"),
            hint: Some("replace it with the complete file, or remove it, and run again; the target keeps its previous contents".into()),
        }),
        _ => Ok(()),
    }
}

/// The real paths of the folders below a pattern's fixed part, found once
/// each: a file reached through a symbolic link to a folder already on its
/// way (a cycle) is refused, and a file reached by two names is kept once.
struct RealDirs {
    base: PathBuf,
    /// The real path of the fixed part and of the folders above it.
    real_base: Option<Vec<PathBuf>>,
    /// Folder (as matched) → real path.
    real: HashMap<PathBuf, PathBuf>,
}

impl RealDirs {
    fn new(base: &Path) -> RealDirs {
        RealDirs { base: base.to_owned(), real_base: None, real: HashMap::new() }
    }

    fn canonical(path: &Path) -> Result<PathBuf> {
        std::fs::canonicalize(path).map_err(|e| Error::Io { path: path.to_owned(), source: e })
    }

    /// Refuses `dir` (a folder below the fixed part) when one of the
    /// folders on its way there is one it already passed through, or one
    /// above the fixed part: a symbolic link that leads back up.
    fn check(&mut self, dir: &Path) -> Result<()> {
        if dir.strip_prefix(&self.base).is_err() {
            return Ok(());
        }
        let above = match &self.real_base {
            Some(a) => a.clone(),
            None => {
                let a: Vec<PathBuf> = Self::canonical(&self.base)?.ancestors().map(Path::to_path_buf).collect();
                self.real_base = Some(a.clone());
                a
            }
        };
        let mut on_the_way = above;
        let mut at = self.base.clone();
        for c in relative(dir, &self.base).split('/').filter(|c| !c.is_empty()) {
            at.push(c);
            let real = match self.real.get(&at) {
                Some(r) => r.clone(),
                None => {
                    let r = Self::canonical(&at)?;
                    self.real.insert(at.clone(), r.clone());
                    r
                }
            };
            if on_the_way.contains(&real) {
                return Err(Error::Files {
                    message: format!(
                        "{} leads back to {}, a folder on its own path (a symbolic link cycle): a pattern with `**` would read the same files through it again and again; nothing was changed",
                        at.display(),
                        real.display()
                    ),
                    hint: Some("remove the link from the landing folder (or point it at a folder outside its own path), and run again; the target keeps its previous contents".into()),
                });
            }
            on_the_way.push(real);
        }
        Ok(())
    }

    /// The matched files (sorted by path) with every folder on their way
    /// checked for a cycle, each real file once: the first of its names.
    fn files(&mut self, matched: Vec<(String, PathBuf)>) -> Result<Vec<(String, PathBuf)>> {
        let mut seen = HashSet::new();
        let mut kept = Vec::with_capacity(matched.len());
        for (rel, path) in matched {
            if let Some(dir) = path.parent() {
                self.check(dir)?;
            }
            if seen.insert(Self::canonical(&path)?) {
                kept.push((rel, path));
            }
        }
        Ok(kept)
    }
}

/// What hashing saw of a file's text, for the checks of [`FileSource::resolve`].
#[derive(Debug, Clone, Copy)]
struct Peek {
    /// The first line names nothing: only blanks, delimiters and quotes
    /// (a CSV file without a header).
    blank_first_line: bool,
    /// Nothing but whitespace (a JSON file without a value).
    only_whitespace: bool,
}

impl Peek {
    /// What nothing read yet says.
    fn new() -> Peek {
        Peek { blank_first_line: true, only_whitespace: true }
    }

    /// Takes in a block of the file (`first`: its first block).
    fn see(&mut self, block: &[u8], first: bool) {
        let block = if first { without_bom(block) } else { block };
        if first {
            let first_line = block.split(|b| *b == b'\n').next().unwrap_or_default();
            self.blank_first_line = first_line.iter().all(|&b| matches!(b, b' ' | b'\t' | b'\r' | b',' | b'"'));
        }
        if self.only_whitespace {
            self.only_whitespace = block.iter().all(|b| b.is_ascii_whitespace());
        }
    }
}

/// What [`Peek`] needs of a file, reading no more than that: its first
/// block, then blocks until one holds more than whitespace.
#[cfg_attr(not(feature = "s3"), allow(dead_code))]
fn peek_file(path: &Path) -> Result<Peek> {
    let io = |e: std::io::Error| Error::Io { path: path.to_owned(), source: e };
    let mut file = std::fs::File::open(path).map_err(io)?;
    let mut buf = vec![0u8; 64 << 10];
    let mut peek = Peek::new();
    let mut first = true;
    loop {
        let filled = fill(&mut file, &mut buf).map_err(io)?;
        if filled == 0 {
            return Ok(peek);
        }
        peek.see(&buf[..filled], first);
        first = false;
        if !peek.only_whitespace || filled < buf.len() {
            return Ok(peek);
        }
    }
}

/// Reads into `buf` until it is full or the file ends; the bytes read.
fn fill(file: &mut std::fs::File, buf: &mut [u8]) -> std::io::Result<usize> {
    use std::io::Read;
    let mut filled = 0;
    while filled < buf.len() {
        let n = file.read(&mut buf[filled..])?;
        if n == 0 {
            break;
        }
        filled += n;
    }
    Ok(filled)
}

/// `bytes` without a leading UTF-8 byte order mark.
fn without_bom(bytes: &[u8]) -> &[u8] {
    bytes.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(bytes)
}

/// BLAKE3 of a file's content, read in blocks of up to 16 MiB, each hashed
/// on every core. (Not memory-mapped: a file rewritten by its upstream while being
/// hashed must be an error, not a SIGBUS.) A file whose size changes while
/// it is read is refused: it is still being written.
pub fn hash_file(path: &Path) -> Result<String> {
    hash_file_with(path, true).map(|(h, _)| h)
}

/// [`hash_file`], and what it saw of the file's text; `inner_parallel`:
/// hash each block on every core (for a lone file; many files are hashed
/// one per core instead).
fn hash_file_with(path: &Path, inner_parallel: bool) -> Result<(String, Peek)> {
    let io = |e: std::io::Error| Error::Io { path: path.to_owned(), source: e };
    let mut file = std::fs::File::open(path).map_err(io)?;
    let before = file.metadata().map_err(io)?.len();
    let mut h = blake3::Hasher::new();
    let mut buf = vec![0u8; (before.clamp(64 << 10, 16 << 20)) as usize];
    let mut read = 0u64;
    let mut peek = Peek::new();
    loop {
        let filled = fill(&mut file, &mut buf).map_err(io)?;
        if filled == 0 {
            break;
        }
        peek.see(&buf[..filled], read == 0);
        read += filled as u64;
        if inner_parallel && filled >= 1 << 20 {
            h.update_rayon(&buf[..filled]);
        } else {
            h.update(&buf[..filled]);
        }
    }
    let after = std::fs::metadata(path).map_err(io)?.len();
    if read != before || after != before {
        return Err(Error::Files {
            message: format!("{} changed size while it was read ({before} → {after} bytes): it is still being written; nothing was changed", path.display()),
            hint: Some("run again once the upstream has finished the day; have it write under a name starting with `_` or `.` and rename when done, or write a marker last (require_marker)".into()),
        });
    }
    Ok((h.finalize().to_hex().to_string(), peek))
}

/// The combined hash of hashed files (already sorted by path).
pub fn combine(files: &[InputFile]) -> String {
    let mut h = blake3::Hasher::new();
    h.update(b"fixpoint-files-v1");
    for f in files {
        h.update(&(f.path.len() as u64).to_le_bytes());
        h.update(f.path.as_bytes());
        h.update(&f.size.to_le_bytes());
        h.update(f.blake3.as_bytes());
        // Objects: their ETags (local files hash as they always have).
        if let Some(etag) = &f.etag {
            h.update(b"\0etag");
            h.update(&(etag.len() as u64).to_le_bytes());
            h.update(etag.as_bytes());
        }
    }
    h.finalize().to_hex()[..32].to_owned()
}

fn relative(path: &Path, base: &Path) -> String {
    let rel = path.strip_prefix(base).unwrap_or(path);
    rel.components()
        .filter_map(|c| match c {
            Component::Normal(s) => Some(s.to_string_lossy().into_owned()),
            _ => None,
        })
        .collect::<Vec<_>>()
        .join("/")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn src(pattern: &str, dir: &Path) -> FileSource {
        FileSource::parse(pattern, None, false, None, dir.to_owned()).unwrap()
    }

    fn d(s: &str) -> RunDate {
        RunDate::parse(s).unwrap()
    }

    #[test]
    fn patterns_fill_in_the_run_date() {
        let s = src("bronze/dt={run_date}/*.parquet", Path::new("/jobs"));
        assert_eq!(s.expand(d("2026-10-20")), PathBuf::from("/jobs/bronze/dt=2026-10-20/*.parquet"));
        let s = src("/data/{run_date:%Y/%m/%d}/part-*.csv.gz", Path::new("/jobs"));
        assert_eq!(s.expand(d("2026-01-05")), PathBuf::from("/data/2026/01/05/part-*.csv.gz"));
        assert_eq!(s.format, FileFormat::Csv);
        assert_eq!(src("x/*.jsonl", Path::new(".")).format, FileFormat::Json);
    }

    #[test]
    fn urls_are_s3_or_refused_naming_what_is_supported() {
        let refused = |p: &str| FileSource::parse(p, None, false, None, PathBuf::from("/jobs")).unwrap_err();
        let (key, message) = refused("gs://lake/b/{run_date}/*.parquet");
        assert_eq!(key, "source.files");
        assert!(message.contains("gs:// is not supported") && message.contains("s3:// URLs"), "{message}");
        assert!(refused("s3:///b/{run_date}/*.parquet").1.contains("names no bucket"));
        assert!(refused("s3://{run_date}/x.parquet").1.contains("names no bucket"));
        if cfg!(feature = "s3") {
            let s = src("s3://lake/bronze/dt={run_date}/*.parquet", Path::new("/jobs"));
            assert!(s.is_remote());
            assert_eq!(s.expand(d("2026-10-20")), PathBuf::from("s3://lake/bronze/dt=2026-10-20/*.parquet"), "a URL is not joined to the job's folder");
        } else {
            let (_, message) = refused("s3://lake/bronze/dt={run_date}/*.parquet");
            assert!(message.contains("the `s3` feature") && message.contains("--features fixpoint-cli/s3"), "{message}");
        }
        // A local path holding `://` further on is a path.
        assert!(!src("b/x:/{run_date}/*.parquet", Path::new("/jobs")).is_remote());
    }

    #[test]
    fn objects_hash_their_etags_and_local_files_hash_as_before() {
        let file = |etag: Option<&str>| InputFile { path: "a.parquet".into(), size: 3, blake3: String::new(), etag: etag.map(str::to_owned) };
        // Pinned: the combined hash of local files does not change with objects' support.
        let local = InputFile { path: "a.parquet".into(), size: 3, blake3: "ab".into(), etag: None };
        let mut h = blake3::Hasher::new();
        h.update(b"fixpoint-files-v1");
        h.update(&9u64.to_le_bytes());
        h.update(b"a.parquet");
        h.update(&3u64.to_le_bytes());
        h.update(b"ab");
        assert_eq!(combine(&[local]), h.finalize().to_hex()[..32].to_owned());
        assert_ne!(combine(&[file(Some("\"1\""))]), combine(&[file(Some("\"2\""))]));
        assert_ne!(combine(&[file(Some("\"1\""))]), combine(&[file(None)]));
        let files = |etag| InputFiles { checksum: String::new(), files: vec![file(etag)], base: PathBuf::new(), format: FileFormat::Parquet, origin: Origin::default() };
        assert_eq!((files(Some("\"1\"")).kind(), files(None).kind()), (OBJECTS_KIND, FILES_KIND));
    }

    #[test]
    fn bad_patterns_are_refused_with_the_key() {
        let cases = [
            ("b/{date}/*.parquet", None, "source.files", "unknown placeholder {date}"),
            ("b/{run_date/*.parquet", None, "source.files", "without a closing"),
            ("b/{run_date:%Q}/*.parquet", None, "source.files", "not a valid date format"),
            ("b/{run_date}/*", None, "source.format", "no extension that names one"),
            ("b/{run_date}/*.parquet", Some("avro"), "source.format", "\"avro\": expected"),
            ("b/[{run_date}/*.parquet", None, "source.files", "not a valid glob"),
        ];
        for (p, f, key, msg) in cases {
            let (k, m) = FileSource::parse(p, f, false, None, PathBuf::from(".")).unwrap_err();
            assert_eq!(k, key, "{p}");
            assert!(m.contains(msg), "{p}: {m}");
        }
        let (k, _) = FileSource::parse("a/*.csv", None, false, Some("a/_SUCCESS".into()), PathBuf::from(".")).unwrap_err();
        assert_eq!(k, "source.require_marker");
    }

    #[test]
    fn resolves_hashes_and_refuses_incomplete_days() {
        let dir = tempfile::tempdir().unwrap();
        let day = dir.path().join("dt=2026-10-20");
        std::fs::create_dir_all(day.join("_temporary")).unwrap();
        std::fs::write(day.join("b.csv"), "id\n2\n").unwrap();
        std::fs::write(day.join("a.csv"), "id\n1\n").unwrap();
        std::fs::write(day.join(".a.csv.crc"), "x").unwrap();
        std::fs::write(day.join("_temporary").join("c.csv"), "id\n3\n").unwrap();
        let s = src("dt={run_date}/**/*.csv", dir.path());
        let got = s.resolve(d("2026-10-20")).unwrap().unwrap();
        let names: Vec<&str> = got.files.iter().map(|f| f.path.as_str()).collect();
        assert_eq!(names, ["a.csv", "b.csv"]);
        assert_eq!(got.files[0].size, 5);
        assert_eq!(got.files[0].blake3, blake3::hash(b"id\n1\n").to_hex().to_string());
        let fp = got.fingerprint();
        assert_eq!((fp.kind.as_str(), fp.rows), (FILES_KIND, 2));

        // The same files elsewhere: the same fingerprint.
        let other = tempfile::tempdir().unwrap();
        let day2 = other.path().join("x").join("dt=2026-10-20");
        std::fs::create_dir_all(&day2).unwrap();
        std::fs::copy(day.join("a.csv"), day2.join("a.csv")).unwrap();
        std::fs::copy(day.join("b.csv"), day2.join("b.csv")).unwrap();
        let moved = src("x/dt={run_date}/*.csv", other.path()).resolve(d("2026-10-20")).unwrap().unwrap();
        assert_eq!(moved.checksum, got.checksum);

        // One changed byte, an added file, a renamed file: another fingerprint.
        std::fs::write(day2.join("b.csv"), "id\n3\n").unwrap();
        let changed = src("x/dt={run_date}/*.csv", other.path()).resolve(d("2026-10-20")).unwrap().unwrap();
        assert_ne!(changed.checksum, got.checksum);
        std::fs::copy(day.join("b.csv"), day2.join("b.csv")).unwrap();
        std::fs::write(day2.join("c.csv"), "id\n").unwrap();
        let added = src("x/dt={run_date}/*.csv", other.path()).resolve(d("2026-10-20")).unwrap().unwrap();
        assert_ne!(added.checksum, got.checksum);
        std::fs::remove_file(day2.join("c.csv")).unwrap();
        std::fs::rename(day2.join("b.csv"), day2.join("b2.csv")).unwrap();
        let renamed = src("x/dt={run_date}/*.csv", other.path()).resolve(d("2026-10-20")).unwrap().unwrap();
        assert_ne!(renamed.checksum, got.checksum);

        // A missing day.
        let e = s.resolve(d("2026-10-21")).unwrap_err();
        assert!(e.to_string().contains("no file matches"), "{e}");
        assert!(e.to_string().contains("dt=2026-10-21"), "{e}");
        assert!(e.hint().unwrap().contains("allow_missing = true"));
        let lenient = FileSource { allow_missing: true, ..s.clone() };
        assert!(lenient.resolve(d("2026-10-21")).unwrap().is_none());

        // Only hidden files: said so.
        let day3 = dir.path().join("dt=2026-10-22");
        std::fs::create_dir_all(&day3).unwrap();
        std::fs::write(day3.join("_a.csv"), "id\n").unwrap();
        let e = s.resolve(d("2026-10-22")).unwrap_err().to_string();
        assert!(e.contains("only _a.csv whose name starts with `_` or `.`"), "{e}");

        // A marker required and absent, then present.
        let marked = FileSource { require_marker: Some("_SUCCESS".into()), ..s.clone() };
        let e = marked.resolve(d("2026-10-20")).unwrap_err().to_string();
        assert!(e.contains("has no _SUCCESS marker"), "{e}");
        std::fs::write(day.join("_SUCCESS"), "").unwrap();
        assert_eq!(marked.resolve(d("2026-10-20")).unwrap().unwrap().checksum, got.checksum);
    }

    #[test]
    fn names_spelled_out_load_and_glob_characters_are_refused() {
        // The job's folder holds glob characters: they match themselves.
        let dir = tempfile::tempdir().unwrap();
        let jobs = dir.path().join("proj[2]");
        std::fs::create_dir_all(jobs.join("exports")).unwrap();
        std::fs::write(jobs.join("exports/_orders_2026-10-20.csv"), "id\n1\n").unwrap();
        // A fixed name starting with `_` is the user's choice: loaded.
        let got = src("exports/_orders_{run_date}.csv", &jobs).resolve(d("2026-10-20")).unwrap().unwrap();
        assert_eq!(got.files[0].path, "_orders_2026-10-20.csv");
        // A file whose name a reader would take for a pattern: refused.
        std::fs::write(jobs.join("exports/part[1].csv"), "id\n1\n").unwrap();
        let e = src("exports/*.csv", &jobs).resolve(d("2026-10-20")).unwrap_err().to_string();
        assert!(e.contains("part[1].csv") && e.contains("glob character"), "{e}");
    }

    #[test]
    fn empty_headerless_and_blank_files_are_refused_naming_them() {
        let dir = tempfile::tempdir().unwrap();
        let day = dir.path().join("d");
        std::fs::create_dir_all(&day).unwrap();
        std::fs::write(day.join("a.csv"), "id\n1\n").unwrap();
        std::fs::write(day.join("b.csv"), "").unwrap();
        let s = src("d/*.csv", dir.path());
        let e = s.resolve(d("2026-10-20")).unwrap_err();
        assert!(matches!(e, Error::Files { .. }), "{e}");
        assert!(e.to_string().starts_with("b.csv (in ") && e.to_string().contains("is empty (0 bytes)"), "{e}");
        assert!(e.hint().unwrap().contains("header line and no row"), "{e}");
        // A first line that names no column (a byte order mark, blanks, delimiters).
        std::fs::write(day.join("b.csv"), "\u{feff} ,\"\"\r\n1,2\n").unwrap();
        let e = s.resolve(d("2026-10-20")).unwrap_err();
        assert!(matches!(e, Error::Files { .. }), "{e}");
        assert!(e.to_string().starts_with("b.csv (in ") && e.to_string().contains("has no header line"), "{e}");
        // A header and no row: a day without rows (min_rows decides), read.
        std::fs::write(day.join("b.csv"), "id\n").unwrap();
        assert_eq!(s.resolve(d("2026-10-20")).unwrap().unwrap().files.len(), 2);
        // JSON: nothing but whitespace; 0 bytes of Parquet.
        std::fs::write(day.join("c.jsonl"), " \n\n").unwrap();
        let e = src("d/*.jsonl", dir.path()).resolve(d("2026-10-20")).unwrap_err().to_string();
        assert!(e.starts_with("c.jsonl (in ") && e.contains("holds no JSON value"), "{e}");
        std::fs::write(day.join("p.parquet"), "").unwrap();
        let e = src("d/*.parquet", dir.path()).resolve(d("2026-10-20")).unwrap_err().to_string();
        assert!(e.starts_with("p.parquet (in ") && e.contains("is empty (0 bytes)"), "{e}");
        // Compressed content is the reader's to check; 0 bytes is refused here.
        std::fs::write(day.join("z.csv.gz"), "").unwrap();
        let e = src("d/*.csv.gz", dir.path()).resolve(d("2026-10-20")).unwrap_err().to_string();
        assert!(e.starts_with("z.csv.gz (in ") && e.contains("is empty (0 bytes)"), "{e}");
        assert!(is_compressed("z.CSV.GZ") && is_compressed("a.jsonl.zst") && !is_compressed("a.csv"));
    }

    #[cfg(unix)]
    #[test]
    fn a_symlink_cycle_is_refused_and_a_file_with_two_names_loads_once() {
        let dir = tempfile::tempdir().unwrap();
        let day = dir.path().join("dt=2026-10-20");
        std::fs::create_dir_all(day.join("sub")).unwrap();
        std::fs::write(day.join("a.csv"), "id\n1\n").unwrap();
        std::fs::write(day.join("sub/c.csv"), "id\n3\n").unwrap();
        // A second name for a.csv, and a link to a folder off its own path.
        std::os::unix::fs::symlink("a.csv", day.join("b.csv")).unwrap();
        std::os::unix::fs::symlink("sub", day.join("side")).unwrap();
        let s = src("dt={run_date}/**/*.csv", dir.path());
        let got = s.resolve(d("2026-10-20")).unwrap().unwrap();
        let names: Vec<&str> = got.files.iter().map(|f| f.path.as_str()).collect();
        assert_eq!(names, ["a.csv", "side/c.csv"], "each real file once, under its first name");
        // A link back to the day's own folder: refused, naming it.
        std::os::unix::fs::symlink(".", day.join("loop")).unwrap();
        let e = s.resolve(d("2026-10-20")).unwrap_err();
        assert!(matches!(e, Error::Files { .. }), "{e}");
        let m = e.to_string();
        assert!(m.starts_with(&format!("{} leads back to ", day.join("loop").display())) && m.contains("symbolic link cycle"), "{m}");
        // Two links that lead to each other's folders.
        std::fs::remove_file(day.join("loop")).unwrap();
        std::fs::create_dir_all(day.join("x")).unwrap();
        std::os::unix::fs::symlink("../sub", day.join("x/to_sub")).unwrap();
        std::os::unix::fs::symlink("../x", day.join("sub/to_x")).unwrap();
        let m = s.resolve(d("2026-10-20")).unwrap_err().to_string();
        assert!(m.contains("symbolic link cycle"), "{m}");
    }

    #[test]
    fn a_single_file_pattern_is_relative_to_its_folder() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("orders_2026-10-20.json"), "{}\n").unwrap();
        let got = src("orders_{run_date}.json", dir.path()).resolve(d("2026-10-20")).unwrap().unwrap();
        assert_eq!(got.files[0].path, "orders_2026-10-20.json");
        assert_eq!(got.paths()[0], dir.path().join("orders_2026-10-20.json"));
    }
}
