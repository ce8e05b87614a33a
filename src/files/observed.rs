//! `Observed`: wraps any [`FileStore`] and records each operation's duration and each
//! failure to reach the store in the metrics, so both backends report the same way.

use std::ops::Range;
use std::sync::Arc;
use std::time::Instant;

use tokio::io::AsyncRead;

use super::{ByteReader, FileMeta, FileOwner, FileStore, StoreError, StoreRecovery};
use crate::metrics::Metrics;
use crate::metrics::cluster::StoreOp;

pub struct Observed<S> {
    inner: S,
    metrics: Arc<Metrics>,
}

impl<S: FileStore> Observed<S> {
    pub fn new(inner: S, metrics: Arc<Metrics>) -> Self {
        Self { inner, metrics }
    }

    fn record<T>(&self, op: StoreOp, started: Instant, result: &Result<T, StoreError>) {
        let failed = matches!(
            result,
            Err(StoreError::Unavailable { .. } | StoreError::Io { .. })
        );
        self.metrics
            .cluster
            .store_operation(op, started.elapsed(), failed);
    }
}

#[async_trait::async_trait]
impl<S: FileStore> FileStore for Observed<S> {
    async fn put(
        &self,
        owner: FileOwner<'_>,
        filename: &str,
        body: &mut (dyn AsyncRead + Send + Unpin),
    ) -> Result<FileMeta, StoreError> {
        let started = Instant::now();
        let result = self.inner.put(owner, filename, body).await;
        self.record(StoreOp::Put, started, &result);
        result
    }

    async fn meta(&self, file_id: &str, owner: Option<&str>) -> Result<FileMeta, StoreError> {
        let started = Instant::now();
        let result = self.inner.meta(file_id, owner).await;
        self.record(StoreOp::Meta, started, &result);
        result
    }

    async fn get(
        &self,
        file_id: &str,
        owner: Option<&str>,
        range: Option<Range<u64>>,
    ) -> Result<(FileMeta, ByteReader), StoreError> {
        let started = Instant::now();
        let result = self.inner.get(file_id, owner, range).await;
        self.record(StoreOp::Get, started, &result);
        result
    }

    async fn list(&self, owner: Option<&str>) -> Result<Vec<FileMeta>, StoreError> {
        let started = Instant::now();
        let result = self.inner.list(owner).await;
        self.record(StoreOp::List, started, &result);
        result
    }

    async fn list_all(&self) -> Result<Vec<FileMeta>, StoreError> {
        let started = Instant::now();
        let result = self.inner.list_all().await;
        self.record(StoreOp::List, started, &result);
        result
    }

    async fn delete(&self, file_id: &str, owner: Option<&str>) -> Result<(), StoreError> {
        let started = Instant::now();
        let result = self.inner.delete(file_id, owner).await;
        self.record(StoreOp::Delete, started, &result);
        result
    }

    async fn remove_expired(&self) -> Result<usize, StoreError> {
        let started = Instant::now();
        let result = self.inner.remove_expired().await;
        self.record(StoreOp::Expire, started, &result);
        result
    }

    async fn check(&self) -> Result<(), StoreError> {
        let started = Instant::now();
        let result = self.inner.check().await;
        self.record(StoreOp::Check, started, &result);
        result
    }

    fn last_recovery(&self) -> Option<StoreRecovery> {
        self.inner.last_recovery()
    }

    fn charging(&self) -> (crate::files::Charge, crate::files::StoreBounds) {
        self.inner.charging()
    }
}
