//! Object storage (cargo feature `s3`): an S3 bucket (or an S3-compatible
//! server's) opened with the `object_store` crate from the standard
//! `AWS_*` environment variables, listed, and read into local files.
//!
//! An object's ETag is a change token given by the server, not a hash of
//! its content: a rewritten object gets a new one (even with the same
//! bytes), and one object's ETag says nothing about another's. Reads are
//! conditional on the ETag listed (`If-Match`), so what is read is exactly
//! what was listed, or the read fails.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use futures_util::{StreamExt, TryStreamExt};
use object_store::aws::{AmazonS3Builder, AmazonS3ConfigKey};
use object_store::path::Path as Key;
use object_store::{GetOptions, ObjectStore};

use crate::error::{DbFailure, Error, Result};

/// Objects read at once by [`Bucket::download`].
const PARALLEL_READS: usize = 8;

/// The hint for a store that cannot be built or is refused.
const CREDENTIALS_HINT: &str = "set the AWS_* environment variables (AWS_REGION, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY; AWS_ENDPOINT_URL and AWS_ALLOW_HTTP=true for an S3-compatible server)";

/// `s3://bucket/rest` as (bucket, rest), `None` for another URL.
pub fn split_s3_url(url: &str) -> Option<(&str, &str)> {
    let rest = url.strip_prefix("s3://")?;
    Some(rest.split_once('/').unwrap_or((rest, "")))
}

/// The store of `bucket`: credentials, region and endpoint from the
/// standard `AWS_*` environment variables (`AWS_ENDPOINT_URL` and
/// `AWS_ALLOW_HTTP=true` for an S3-compatible server), then `options`
/// (object_store's names: `aws_endpoint_url`, `aws_region`, …).
pub fn s3_store(bucket: &str, options: &[(String, String)], shown: &str) -> Result<object_store::aws::AmazonS3> {
    let mut builder = AmazonS3Builder::from_env().with_bucket_name(bucket);
    for (k, v) in options {
        let key: AmazonS3ConfigKey = k.parse().map_err(|e| Error::argument(format!("S3 option {k:?}: {e}"), None))?;
        builder = builder.with_config(key, v);
    }
    builder.build().map_err(|e| Error::argument(format!("cannot use {shown}: {e}"), Some(CREDENTIALS_HINT)))
}

/// An error of `what` (a listing or a read of `shown`, in `bucket`) as the
/// user's to fix when it is (a missing bucket, refused credentials), else
/// as the store's (`engine` names who was reading).
pub fn s3_error(engine: &'static str, bucket: &str, what: &str, shown: &str, e: &object_store::Error) -> Error {
    let text = e.to_string();
    if text.contains("NoSuchBucket") {
        Error::argument(
            format!("the bucket {bucket} does not exist on this S3 endpoint ({what} {shown})"),
            Some("create it, or fix the bucket's name (and AWS_ENDPOINT_URL for an S3-compatible server)"),
        )
    } else if text.contains("AccessDenied") || text.contains("InvalidAccessKeyId") || text.contains("SignatureDoesNotMatch") || text.contains("403") {
        Error::argument(
            format!("S3 refused {what} {shown}: {text}"),
            Some("check AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY (and AWS_SESSION_TOKEN), AWS_REGION, and the bucket's policy"),
        )
    } else {
        Error::Database { engine, context: format!("{what} {shown}"), message: text, failure: DbFailure::Other }
    }
}

/// The root of fixpoint's local caches: `$FIXPOINT_CACHE_DIR`, else
/// `$XDG_CACHE_HOME/fixpoint`, else `~/.cache/fixpoint`.
pub fn cache_root() -> PathBuf {
    let env = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty()).map(PathBuf::from);
    env("FIXPOINT_CACHE_DIR")
        .or_else(|| env("XDG_CACHE_HOME").map(|p| p.join("fixpoint")))
        .or_else(|| env("HOME").map(|p| p.join(".cache/fixpoint")))
        .unwrap_or_else(|| std::env::temp_dir().join("fixpoint-cache"))
}

/// One listed object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Object {
    /// Its key in the bucket.
    pub key: String,
    /// Bytes.
    pub size: u64,
    /// The server's change token (`None` when the server gives none).
    pub etag: Option<String>,
}

/// A bucket and the runtime its requests run on.
pub struct Bucket {
    name: String,
    store: Arc<dyn ObjectStore>,
    rt: tokio::runtime::Runtime,
}

impl std::fmt::Debug for Bucket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Bucket({})", self.name)
    }
}

impl Bucket {
    /// The bucket `name`, as [`s3_store`] opens it.
    pub fn open(name: &str, options: &[(String, String)]) -> Result<Bucket> {
        let store = s3_store(name, options, &format!("s3://{name}"))?;
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| Error::Internal(format!("cannot start the runtime for S3 requests: {e}")))?;
        Ok(Bucket { name: name.to_owned(), store: Arc::new(store), rt })
    }

    /// The bucket's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Every object whose key is below the folder `prefix` (`""`: the whole
    /// bucket), sorted by key.
    pub fn list(&self, prefix: &str) -> Result<Vec<Object>> {
        let key = (!prefix.is_empty()).then(|| Key::from(prefix));
        let shown = format!("s3://{}/{prefix}", self.name);
        let listed: Vec<object_store::ObjectMeta> = self
            .rt
            .block_on(self.store.list(key.as_ref()).try_collect())
            .map_err(|e| s3_error("s3", &self.name, "listing", &shown, &e))?;
        let mut out: Vec<Object> = listed.into_iter().map(|m| Object { key: m.location.to_string(), size: m.size, etag: m.e_tag }).collect();
        out.sort_by(|a, b| a.key.cmp(&b.key));
        Ok(out)
    }

    /// Reads each object into its local file (folders made as needed),
    /// several at once. Each read is conditional on the object's ETag and
    /// checked against its size: an object changed or removed since it was
    /// listed is an error naming it, and nothing is kept of it.
    pub fn download(&self, objects: &[(Object, PathBuf)]) -> Result<()> {
        self.rt.block_on(async {
            futures_util::stream::iter(objects.iter().map(|(o, local)| self.download_one(o, local)))
                .buffer_unordered(PARALLEL_READS)
                .try_collect::<Vec<()>>()
                .await
        })?;
        Ok(())
    }

    async fn download_one(&self, o: &Object, local: &Path) -> Result<()> {
        let shown = format!("s3://{}/{}", self.name, o.key);
        let changed = || Error::Files {
            message: format!("{shown} changed or was removed after it was listed (it no longer has the ETag and size listed): it is still being written; nothing was changed"),
            hint: Some("run again once the upstream has finished the day; have it write under a name starting with `_` or `.` and copy when done, or write a marker last (require_marker)".into()),
        };
        let options = GetOptions { if_match: o.etag.clone(), ..Default::default() };
        let got = match self.store.get_opts(&Key::parse(&o.key).unwrap_or_else(|_| Key::from(o.key.as_str())), options).await {
            Ok(got) => got,
            Err(object_store::Error::Precondition { .. } | object_store::Error::NotFound { .. }) => return Err(changed()),
            Err(e) => return Err(s3_error("s3", &self.name, "reading", &shown, &e)),
        };
        if let Some(parent) = local.parent() {
            std::fs::create_dir_all(parent).map_err(|e| Error::Io { path: parent.to_owned(), source: e })?;
        }
        let io = |e: std::io::Error| Error::Io { path: local.to_owned(), source: e };
        let mut file = std::fs::File::create(local).map_err(io)?;
        let mut stream = got.into_stream();
        let mut written = 0u64;
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.map_err(|e| s3_error("s3", &self.name, "reading", &shown, &e))?;
            std::io::Write::write_all(&mut file, &chunk).map_err(io)?;
            written += chunk.len() as u64;
        }
        file.sync_all().map_err(io)?;
        if written != o.size {
            let _ = std::fs::remove_file(local);
            return Err(changed());
        }
        Ok(())
    }
}

/// A folder of this process below `cache_root()/files` for one run's
/// objects, removed when dropped; folders left by processes that are gone
/// (killed) are removed first.
pub fn run_folder() -> Result<tempfile::TempDir> {
    let root = cache_root().join("files");
    std::fs::create_dir_all(&root).map_err(|e| Error::Io { path: root.clone(), source: e })?;
    sweep(&root);
    tempfile::Builder::new()
        .prefix(&format!("run-{}-", std::process::id()))
        .tempdir_in(&root)
        .map_err(|e| Error::Io { path: root.clone(), source: e })
}

/// Removes the run folders of processes that no longer run (Linux: no
/// `/proc/<pid>`; elsewhere nothing is removed).
fn sweep(root: &Path) {
    if !Path::new("/proc/self").exists() {
        return;
    }
    let Ok(entries) = std::fs::read_dir(root) else { return };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let pid = name.strip_prefix("run-").and_then(|r| r.split('-').next()).and_then(|p| p.parse::<u32>().ok());
        if let Some(pid) = pid {
            if pid != std::process::id() && !Path::new(&format!("/proc/{pid}")).exists() {
                let _ = std::fs::remove_dir_all(entry.path());
            }
        }
    }
}

/// For tests: the local S3-compatible server (`scripts/moto-local.sh`,
/// endpoint `FIXPOINT_TEST_S3`, default `http://127.0.0.1:5055`), or `None`
/// after saying `skipped` when it is not running; under `CI=true` it must be.
#[doc(hidden)]
pub fn test_s3_endpoint() -> Option<String> {
    let endpoint = std::env::var("FIXPOINT_TEST_S3").unwrap_or_else(|_| "http://127.0.0.1:5055".into());
    let addr = endpoint.trim_start_matches("http://").trim_end_matches('/').to_owned();
    let up = std::net::ToSocketAddrs::to_socket_addrs(&addr)
        .ok()
        .and_then(|mut a| a.next())
        .is_some_and(|a| std::net::TcpStream::connect_timeout(&a, std::time::Duration::from_secs(2)).is_ok());
    match up {
        true => Some(endpoint),
        false if std::env::var("CI").as_deref() == Ok("true") => panic!("no S3-compatible server at {endpoint} under CI=true (scripts/moto-local.sh start)"),
        false => {
            eprintln!("skipped: no S3-compatible server at {endpoint} (scripts/moto-local.sh start)");
            None
        }
    }
}
