//! A warehouse on S3 (or an S3-compatible server): its objects read and
//! written with the `object_store` crate, its Delta logs through delta-rs
//! on the same store (commits are conditional writes: `If-None-Match: *`).
//! DuckDB reads and writes data files in a local cache that mirrors the
//! warehouse's layout; data files never change once written, so a cached
//! file of the right size is the object.

use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use deltalake_core::logstore::{default_logstore, logstore_factories, LogStore, LogStoreFactory, ObjectStoreRef, StorageConfig};
use deltalake_core::DeltaResult;
use fixpoint_core::{DbFailure, Error, Result};
use futures_util::TryStreamExt;
use fixpoint_core::job::objects::{cache_root, s3_store};
use object_store::path::Path as Key;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};

/// A warehouse's bucket and prefix.
pub(crate) struct S3 {
    /// The bucket's root.
    pub store: Arc<dyn ObjectStore>,
    pub bucket: String,
    /// The warehouse's prefix in the bucket, without slashes at its ends
    /// (empty: the bucket's root).
    pub prefix: String,
}

fn s3_error(context: impl Into<String>, e: impl std::fmt::Display) -> Error {
    Error::Database { engine: "delta", context: context.into(), message: e.to_string(), failure: DbFailure::Other }
}

impl S3 {
    /// The warehouse `s3://bucket/prefix`, its credentials, region and
    /// endpoint from the standard `AWS_*` environment variables
    /// (`AWS_ENDPOINT_URL` and `AWS_ALLOW_HTTP=true` for an S3-compatible
    /// server), then from `options` (`aws_endpoint_url`, …).
    pub fn open(url: &str, options: &[(String, String)]) -> Result<S3> {
        let rest = url.strip_prefix("s3://").ok_or_else(|| Error::argument(format!("{url:?} is not an s3:// URL"), Some("give delta:s3://bucket/prefix")))?;
        let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
        let prefix = prefix.trim_matches('/').to_owned();
        if bucket.is_empty() || prefix.split('/').any(|s| s == "." || s == "..") || prefix.contains("//") {
            return Err(Error::argument(format!("{url:?} does not name a bucket and a prefix"), Some("give delta:s3://bucket/prefix (the prefix may be empty; no . or .. segments)")));
        }
        let store = s3_store(bucket, options, url)?;
        register_log_stores();
        Ok(S3 { store: Arc::new(store), bucket: bucket.to_owned(), prefix })
    }

    /// The key of `rel` (a path relative to the warehouse).
    pub fn key(&self, rel: &str) -> Key {
        if self.prefix.is_empty() {
            Key::from(rel)
        } else {
            Key::from(format!("{}/{rel}", self.prefix))
        }
    }

    /// The URL of the folder `rel` (relative to the warehouse).
    pub fn url(&self, rel: &str) -> Result<url::Url> {
        let path = if self.prefix.is_empty() { rel.to_owned() } else { format!("{}/{rel}", self.prefix) };
        url::Url::parse(&format!("s3://{}/{path}/", self.bucket)).map_err(|e| Error::argument(format!("s3://{}/{path}: {e}", self.bucket), None))
    }

    /// `s3://bucket/prefix`, for messages.
    pub fn display(&self) -> String {
        format!("s3://{}/{}", self.bucket, self.prefix)
    }

    /// The names of the folders right below `rel` ("" for the warehouse:
    /// the first request, whose refusal names the bucket and the fix).
    pub async fn folders(&self, rel: &str) -> Result<Vec<String>> {
        let key = if rel.is_empty() { (!self.prefix.is_empty()).then(|| Key::from(self.prefix.as_str())) } else { Some(self.key(rel)) };
        let listed = self
            .store
            .list_with_delimiter(key.as_ref())
            .await
            .map_err(|e| fixpoint_core::job::objects::s3_error("delta", &self.bucket, "listing", &format!("{}/{rel}", self.display()), &e))?;
        Ok(listed.common_prefixes.iter().filter_map(|p| p.filename().map(str::to_owned)).collect())
    }

    /// Whether any object's key starts with `rel/`.
    pub async fn holds(&self, rel: &str) -> Result<bool> {
        let listed = self.store.list_with_delimiter(Some(&self.key(rel))).await.map_err(|e| s3_error(format!("listing {}/{rel}", self.display()), e))?;
        Ok(!listed.objects.is_empty() || !listed.common_prefixes.is_empty())
    }

    /// Uploads the local file `local` as `rel`.
    pub async fn upload(&self, local: &Path, rel: &str) -> Result<()> {
        let bytes = std::fs::read(local).map_err(|e| Error::Io { path: local.to_owned(), source: e })?;
        self.store.put(&self.key(rel), PutPayload::from(bytes)).await.map_err(|e| s3_error(format!("uploading {}/{rel}", self.display()), e))?;
        Ok(())
    }

    /// Downloads `rel` to `local` (written whole, then renamed in place).
    pub async fn download(&self, rel: &str, local: &Path) -> Result<()> {
        let got = self.store.get(&self.key(rel)).await.map_err(|e| s3_error(format!("reading {}/{rel}", self.display()), e))?;
        let bytes = got.bytes().await.map_err(|e| s3_error(format!("reading {}/{rel}", self.display()), e))?;
        if let Some(parent) = local.parent() {
            std::fs::create_dir_all(parent).map_err(|e| Error::Io { path: parent.to_owned(), source: e })?;
        }
        let tmp = local.with_extension(format!("download-{}", uuid::Uuid::new_v4()));
        std::fs::write(&tmp, &bytes).map_err(|e| Error::Io { path: tmp.clone(), source: e })?;
        std::fs::rename(&tmp, local).map_err(|e| Error::Io { path: local.to_owned(), source: e })
    }

    /// Deletes `rel` (nothing when it is gone).
    pub async fn delete(&self, rel: &str) -> Result<()> {
        match self.store.delete(&self.key(rel)).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(s3_error(format!("deleting {}/{rel}", self.display()), e)),
        }
    }

    /// Every object under `rel/`, relative to it.
    async fn objects(&self, rel: &str) -> Result<Vec<String>> {
        let base = self.key(rel);
        let listed: Vec<_> = self.store.list(Some(&base)).try_collect().await.map_err(|e| s3_error(format!("listing {}/{rel}", self.display()), e))?;
        let skip = base.as_ref().len() + 1;
        Ok(listed.into_iter().filter_map(|m| m.location.as_ref().get(skip..).map(str::to_owned)).collect())
    }

    /// Deletes every object under `rel/`.
    pub async fn delete_all(&self, rel: &str) -> Result<()> {
        for o in self.objects(rel).await? {
            self.delete(&format!("{rel}/{o}")).await?;
        }
        Ok(())
    }

    /// Copies every object under `from/` to `to/`, then deletes the
    /// originals (not atomic: object storage has no rename).
    pub async fn move_all(&self, from: &str, to: &str) -> Result<()> {
        let objects = self.objects(from).await?;
        for o in &objects {
            self.store
                .copy(&self.key(&format!("{from}/{o}")), &self.key(&format!("{to}/{o}")))
                .await
                .map_err(|e| s3_error(format!("copying {}/{from}/{o}", self.display()), e))?;
        }
        self.delete_all(from).await
    }
}

/// Delta-rs's log store for `s3://` tables on a store fixpoint built: the
/// default one, whose commits are `PutMode::Create` (a conditional write
/// that fails when the version exists).
struct ConditionalPutLogStores;

impl LogStoreFactory for ConditionalPutLogStores {
    fn with_options(&self, prefixed_store: ObjectStoreRef, root_store: ObjectStoreRef, location: &url::Url, options: &StorageConfig) -> DeltaResult<Arc<dyn LogStore>> {
        Ok(default_logstore(prefixed_store, root_store, location, options))
    }
}

fn register_log_stores() {
    static ONCE: OnceLock<()> = OnceLock::new();
    ONCE.get_or_init(|| {
        if let Ok(url) = url::Url::parse("s3://") {
            logstore_factories().insert(url, Arc::new(ConditionalPutLogStores));
        }
    });
}

/// The local cache folder of the warehouse `s3://bucket/prefix`:
/// `$FIXPOINT_CACHE_DIR`, else `$XDG_CACHE_HOME/fixpoint`, else
/// `~/.cache/fixpoint`, then `delta/<bucket>/<prefix>`.
pub(crate) fn cache_dir(s3: &S3) -> PathBuf {
    let mut dir = cache_root().join("delta").join(&s3.bucket);
    for seg in s3.prefix.split('/').filter(|s| !s.is_empty()) {
        dir = dir.join(seg);
    }
    dir
}
