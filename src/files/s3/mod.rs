//! `S3Store`: files in an S3-compatible object store (AWS S3, MinIO, SeaweedFS, Ceph RGW,
//! GCS's S3 API), shared by every replica of a cluster. Signing, retries and multipart
//! uploads are the `object_store` crate's.
//!
//! One object per file, its key `<prefix>/<owner>/<file_id>/<filename>` ([`keys`]). A `put`
//! streams the body through a bounded buffer into a multipart upload (never the whole file
//! in memory), counting bytes against the maximum size and the quota ([`usage`]) and
//! aborting the upload the moment either is passed; completing the upload is the commit (S3
//! shows an object only once it is complete). Reads stream the object's body. The TTL comes
//! from the UUIDv7 file id, so an expired file is gone at once on every replica; the
//! sweeper's deletions are idempotent, so every replica may run it. Any failure to reach
//! the store is `Unavailable` (503 with the store's error), never an internal error.

pub mod keys;
pub mod usage;

use std::collections::HashMap;
use std::ops::Range;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::{StreamExt, TryStreamExt};
use object_store::aws::{AmazonS3Builder, AmazonS3ConfigKey};
use object_store::buffered::BufWriter;
use object_store::path::Path;
use object_store::{
    Attribute, Attributes, ClientOptions, GetOptions, ObjectStore, ObjectStoreExt, RetryConfig,
};
use tokio::io::{AsyncRead, AsyncWriteExt};
use tokio_util::io::StreamReader;

use self::keys::Keys;
use self::usage::{Scope, Usage};
use super::{
    ByteReader, Charge, FileMeta, FileOwner, FileStore, Held, Holders, StoreBounds, StoreError,
    UploadSize, canonical_file_id, clean_filename_within, mime_for,
};
use crate::config::S3Config;

/// The upload buffer: a file this small is one PUT, a bigger one a multipart upload in
/// parts of this size (S3's minimum part is 5 MiB).
const PART_BYTES: usize = 8 << 20;
/// What an upload that failed to complete was doing.
const COMPLETING: &str = "completing the upload";
/// File locations remembered by a replica.
const MAX_LOCATED: usize = 100_000;

#[derive(Debug, Clone, Default)]
pub struct S3StoreSettings {
    pub max_file_bytes: u64,
    /// The quotas and file counts.
    pub bounds: StoreBounds,
    /// What an object costs (its per-object record, and its size in whole blocks).
    pub charge: Charge,
    /// `None`: files are kept until deleted.
    pub ttl: Option<Duration>,
}

pub struct S3Store {
    store: Arc<dyn ObjectStore>,
    keys: Keys,
    settings: S3StoreSettings,
    usage: Usage,
    /// Where files seen by this replica live (files never change, only go), so a lookup
    /// by id needs no listing. A stale entry (deleted elsewhere) just reads as not found.
    located: Mutex<HashMap<String, FileMeta>>,
}

fn unavailable(doing: &'static str) -> impl Fn(object_store::Error) -> StoreError {
    move |e| StoreError::Unavailable {
        doing,
        detail: e.to_string(),
    }
}

impl S3Store {
    /// A store on the bucket `config` names. Nothing is contacted yet: a store that is down
    /// at start-up makes `/ready` say so, and requests that need it get 503.
    pub fn open(config: &S3Config, settings: S3StoreSettings) -> Result<Self, StoreError> {
        // Client options first: they replace what `with_allow_http` sets.
        let mut builder = AmazonS3Builder::from_env()
            .with_client_options(
                ClientOptions::new()
                    .with_connect_timeout(Duration::from_millis(config.connect_timeout_ms))
                    .with_timeout(Duration::from_millis(config.request_timeout_ms)),
            )
            .with_bucket_name(&config.bucket)
            .with_virtual_hosted_style_request(!config.path_style)
            .with_allow_http(config.allow_http)
            .with_retry(RetryConfig {
                max_retries: config.max_retries,
                retry_timeout: Duration::from_millis(config.request_timeout_ms),
                ..RetryConfig::default()
            });
        if let Some(endpoint) = &config.endpoint {
            builder = builder.with_endpoint(endpoint);
        }
        if let Some(region) = &config.region {
            builder = builder.with_region(region);
        }
        // s3.endpoint itself is checked with the configuration; one from the environment
        // (AWS_ENDPOINT_URL_S3, AWS_ENDPOINT_URL) would otherwise only fail at the first
        // request.
        let endpoint = [AmazonS3ConfigKey::S3Endpoint, AmazonS3ConfigKey::Endpoint]
            .iter()
            .find_map(|key| builder.get_config_value(key));
        if let Some(endpoint) = endpoint
            && endpoint.starts_with("http://")
            && !config.allow_http
        {
            return Err(StoreError::Unavailable {
                doing: "configuring the S3 client",
                detail: format!(
                    "the endpoint {endpoint:?} (from the environment) is plain HTTP, which \
                     s3.allow_http = false refuses: set s3.allow_http = true \
                     (SNAKECAGE_S3__ALLOW_HTTP=true) or give an https:// endpoint"
                ),
            });
        }
        let store = builder
            .build()
            .map_err(unavailable("configuring the S3 client"))?;
        tracing::info!(
            bucket = %config.bucket,
            prefix = %config.prefix,
            endpoint = config.endpoint.as_deref().unwrap_or("(AWS)"),
            "file store: S3"
        );
        Ok(Self::with_store(
            Arc::new(store),
            &config.prefix,
            settings,
            config.usage_cache_ms,
        ))
    }

    /// A store on any `object_store` implementation (the tests use the in-memory one).
    pub fn with_store(
        store: Arc<dyn ObjectStore>,
        prefix: &str,
        settings: S3StoreSettings,
        usage_cache_ms: u64,
    ) -> Self {
        Self {
            store,
            keys: Keys::new(prefix),
            usage: Usage::new(Duration::from_millis(usage_cache_ms), settings.charge),
            settings,
            located: Mutex::default(),
        }
    }

    fn meta_of(&self, key: &Path, size: u64) -> Option<FileMeta> {
        let parsed = self.keys.parse(key)?;
        Some(FileMeta {
            mime_type: mime_for(&parsed.filename),
            file_id: parsed.file_id,
            filename: parsed.filename,
            size_bytes: size,
            created_unix_ms: parsed.created_unix_ms,
            owner: parsed.owner,
        })
    }

    /// Every file under `dir`, expired ones included.
    async fn list_under(&self, dir: &Path) -> Result<Vec<FileMeta>, StoreError> {
        let mut listing = self.store.list(Some(dir));
        let mut files = Vec::new();
        while let Some(object) = listing.next().await {
            let object = object.map_err(unavailable("listing files"))?;
            if let Some(meta) = self.meta_of(&object.location, object.size) {
                files.push(meta);
            }
        }
        Ok(files)
    }

    fn live(&self, mut files: Vec<FileMeta>) -> Vec<FileMeta> {
        let now = super::now_unix_ms();
        files.retain(|m| !m.expired(self.settings.ttl, now));
        files.sort_by(|a, b| (a.created_unix_ms, &a.file_id).cmp(&(b.created_unix_ms, &b.file_id)));
        for m in &files {
            self.remember(m);
        }
        files
    }

    /// Notes where a file lives (bounded: past the limit the notes start over).
    fn remember(&self, meta: &FileMeta) {
        let mut located = self.located.lock().expect("located lock");
        if located.len() >= MAX_LOCATED {
            located.clear();
        }
        located.insert(meta.file_id.clone(), meta.clone());
    }

    /// The live file `file_id` of `owner`: from what this replica saw, else by listing the
    /// file's own directory (one small request).
    /// The id is taken in any case (see [`canonical_file_id`]).
    async fn find(&self, file_id: &str, owner: Option<&str>) -> Result<FileMeta, StoreError> {
        let not_found = || StoreError::NotFound(file_id.to_owned());
        let id = canonical_file_id(file_id)
            .filter(|id| keys::created_ms(id).is_some())
            .ok_or_else(not_found)?;
        let known = self.located.lock().expect("located lock").get(&id).cloned();
        let meta = match known {
            Some(meta) => meta,
            None => {
                let dir = self.keys.file_dir(owner, &id);
                let found = self.list_under(&dir).await?.into_iter().next();
                let meta = found.ok_or_else(not_found)?;
                self.remember(&meta);
                meta
            }
        };
        if !meta.visible_to(owner) || meta.expired(self.settings.ttl, super::now_unix_ms()) {
            return Err(not_found());
        }
        Ok(meta)
    }

    fn key_of(&self, meta: &FileMeta) -> Path {
        self.keys
            .object(meta.owner.as_deref(), &meta.file_id, &meta.filename)
    }

    fn forget(&self, file_id: &str) {
        self.located.lock().expect("located lock").remove(file_id);
    }

    /// The scopes an upload by `owner` is counted in: those that have a bound.
    fn scopes(&self, owner: FileOwner<'_>) -> Vec<Scope> {
        let bounds = &self.settings.bounds;
        let mut scopes = Vec::new();
        if bounds.quota_bytes.is_some() || bounds.max_files.is_some() {
            scopes.push(Scope::All);
        }
        if let Some(name) = owner.name
            && (bounds.max_files_per_key.is_some()
                || bounds.owner_quota(Some(name), owner.quota_bytes).is_some())
        {
            scopes.push(Scope::Owner(Some(name.to_owned())));
        }
        scopes
    }

    /// What `scope` holds now, from a listing at most `usage_cache_ms` old (a listing of
    /// the whole store also notes every owner's charge).
    async fn listed_held(&self, scope: &Scope) -> Result<Held, StoreError> {
        if let Some(held) = self.usage.cached(scope) {
            return Ok(held);
        }
        let dir = match scope {
            Scope::All => self.keys.root().clone(),
            Scope::Owner(owner) => self.keys.owner_dir(owner.as_deref()),
        };
        let now = super::now_unix_ms();
        let mut held = Held::default();
        let mut holders: HashMap<Option<String>, u64> = HashMap::new();
        for meta in self.list_under(&dir).await? {
            if meta.expired(self.settings.ttl, now) {
                continue;
            }
            let charged = self.settings.charge.of(meta.size_bytes);
            held.files += 1;
            held.charged = held.charged.saturating_add(charged);
            *holders.entry(meta.owner).or_default() += charged;
        }
        if *scope == Scope::All {
            self.usage.listed_holders(holders);
        }
        self.usage.listed(scope.clone(), held);
        Ok(held)
    }

    /// Why one more file of `owner`, `written` bytes so far, does not fit beside what the
    /// listings (`listed`) and the uploads in flight here (this one included) hold.
    fn refusal(
        &self,
        owner: FileOwner<'_>,
        listed: &[(Scope, Held)],
        written: u64,
    ) -> Option<StoreError> {
        let this = Held {
            files: 1,
            charged: self.settings.charge.of(written),
        };
        let held_in = |wanted: &Scope| {
            listed.iter().find(|(scope, _)| scope == wanted).map_or(
                Held::default(),
                |(scope, listed)| {
                    // Held besides this upload: listed, and what other uploads in flight
                    // here add.
                    let total = self.usage.total(scope, *listed);
                    Held {
                        files: total.files.saturating_sub(this.files),
                        charged: total.charged.saturating_sub(this.charged),
                    }
                },
            )
        };
        let all = held_in(&Scope::All);
        let mine = held_in(&Scope::Owner(owner.name.map(str::to_owned)));
        self.settings.bounds.refusal(
            self.settings.charge,
            owner,
            (all, mine),
            UploadSize::AtLeast(written),
            || {
                let name = owner.name?;
                let charges = self.usage.holders();
                Some(Holders::of_full_store(
                    name,
                    charges.iter().map(|(o, c)| (o.as_deref(), *c)).collect(),
                ))
            },
        )
    }

    /// Streams `body` into `writer`, stopping at the size limit or a quota, and completes
    /// the upload (`COMPLETING` names its failure: the caller aborts the writer otherwise).
    async fn receive(
        &self,
        writer: &mut BufWriter,
        owner: FileOwner<'_>,
        listed: &[(Scope, Held)],
        body: &mut (dyn AsyncRead + Send + Unpin),
    ) -> Result<u64, StoreError> {
        let mut upload = self
            .usage
            .upload(listed.iter().map(|(scope, _)| scope.clone()).collect());
        // A file that cannot fit whatever its size (too many files, or not even an empty
        // file's charge): refused before its first byte.
        if let Some(refused) = self.refusal(owner, listed, 0) {
            return Err(refused);
        }
        let written = super::copy_upload(
            body,
            writer,
            self.settings.max_file_bytes,
            |written, chunk| {
                upload.add(chunk);
                self.refusal(owner, listed, written).map_or(Ok(()), Err)
            },
            |e| StoreError::Unavailable {
                doing: "uploading",
                detail: e.to_string(),
            },
        )
        .await?;
        // Completing the upload is the commit, done before `upload` stops counting it.
        writer
            .shutdown()
            .await
            .map_err(|e| StoreError::Unavailable {
                doing: COMPLETING,
                detail: e.to_string(),
            })?;
        Ok(written)
    }
}

#[async_trait::async_trait]
impl FileStore for S3Store {
    async fn put(
        &self,
        owner: FileOwner<'_>,
        filename: &str,
        body: &mut (dyn AsyncRead + Send + Unpin),
    ) -> Result<FileMeta, StoreError> {
        let mut listed = Vec::new();
        for scope in self.scopes(owner) {
            let held = self.listed_held(&scope).await?;
            listed.push((scope, held));
        }
        let filename = clean_filename_within(filename, Keys::name_bytes);
        let id = keys::new_file_id();
        let key = self.keys.object(owner.name, &id, &filename);
        let mime_type = mime_for(&filename);
        let mut attributes = Attributes::new();
        attributes.insert(Attribute::ContentType, mime_type.clone().into());
        let mut writer = BufWriter::with_capacity(self.store.clone(), key, PART_BYTES)
            .with_attributes(attributes);
        let size = match self.receive(&mut writer, owner, &listed, body).await {
            Ok(size) => size,
            Err(e) => {
                // A writer that failed to complete is shut down already (`abort` would
                // panic); S3 discards an upload never completed.
                let completing =
                    matches!(e, StoreError::Unavailable { doing, .. } if doing == COMPLETING);
                if !completing && let Err(abort) = writer.abort().await {
                    tracing::warn!(error = %abort, "aborting an S3 upload failed");
                }
                return Err(e);
            }
        };
        let owner_scope = Scope::Owner(owner.name.map(str::to_owned));
        self.usage.adjust(&[Scope::All, owner_scope], size, true);
        let meta = FileMeta {
            created_unix_ms: keys::created_ms(&id).unwrap_or_else(super::now_unix_ms),
            file_id: id.clone(),
            filename,
            size_bytes: size,
            mime_type,
            owner: owner.name.map(str::to_owned),
        };
        self.remember(&meta);
        Ok(meta)
    }

    async fn meta(&self, file_id: &str, owner: Option<&str>) -> Result<FileMeta, StoreError> {
        self.find(file_id, owner).await
    }

    async fn get(
        &self,
        file_id: &str,
        owner: Option<&str>,
        range: Option<Range<u64>>,
    ) -> Result<(FileMeta, ByteReader), StoreError> {
        let meta = self.find(file_id, owner).await?;
        // A range is a ranged GET: the store sends only its bytes.
        let options = GetOptions::new().with_range(range);
        match self.store.get_opts(&self.key_of(&meta), options).await {
            Ok(object) => {
                let stream = object.into_stream().map_err(std::io::Error::from);
                Ok((meta, Box::new(StreamReader::new(stream))))
            }
            Err(object_store::Error::NotFound { .. }) => {
                self.forget(&meta.file_id);
                Err(StoreError::NotFound(file_id.to_owned()))
            }
            Err(e) => Err(unavailable("reading a file")(e)),
        }
    }

    async fn list(&self, owner: Option<&str>) -> Result<Vec<FileMeta>, StoreError> {
        let files = self.list_under(&self.keys.owner_dir(owner)).await?;
        Ok(self.live(files))
    }

    async fn list_all(&self) -> Result<Vec<FileMeta>, StoreError> {
        let files = self.list_under(self.keys.root()).await?;
        Ok(self.live(files))
    }

    async fn delete(&self, file_id: &str, owner: Option<&str>) -> Result<(), StoreError> {
        let meta = self.find(file_id, owner).await?;
        // S3 deletes are idempotent: a file deleted meanwhile elsewhere is not an error.
        self.store
            .delete(&self.key_of(&meta))
            .await
            .map_err(unavailable("deleting a file"))?;
        self.forget(&meta.file_id);
        let owner_scope = Scope::Owner(meta.owner.clone());
        self.usage
            .adjust(&[Scope::All, owner_scope], meta.size_bytes, false);
        Ok(())
    }

    async fn remove_expired(&self) -> Result<usize, StoreError> {
        let Some(ttl) = self.settings.ttl else {
            return Ok(0);
        };
        let now = super::now_unix_ms();
        let expired: Vec<FileMeta> = self
            .list_under(self.keys.root())
            .await?
            .into_iter()
            .filter(|m| m.expired(Some(ttl), now))
            .collect();
        for meta in &expired {
            self.store
                .delete(&self.key_of(meta))
                .await
                .map_err(unavailable("deleting expired files"))?;
            self.forget(&meta.file_id);
        }
        Ok(expired.len())
    }

    fn charging(&self) -> (Charge, StoreBounds) {
        (self.settings.charge, self.settings.bounds)
    }

    /// Lists an empty prefix: one small request that fails when the store is down, the
    /// credentials are refused or the bucket does not exist (a HEAD of a missing key
    /// would answer 404 for a missing bucket too, and look healthy).
    async fn check(&self) -> Result<(), StoreError> {
        self.store
            .list_with_delimiter(Some(&self.keys.probe()))
            .await
            .map(drop)
            .map_err(unavailable("checking the store"))
    }
}

#[cfg(test)]
mod tests;
