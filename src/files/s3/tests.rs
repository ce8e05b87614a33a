//! The S3 store's own rules, on `object_store`'s in-memory store (the same code path as
//! S3 minus HTTP); `tests/integration/file_store.rs` runs the shared conformance suite
//! against a real S3-compatible server.

use std::sync::Arc;
use std::time::Duration;

use object_store::memory::InMemory;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt};
use tokio::io::AsyncReadExt;

use super::*;

/// A store that charges file bytes alone (the quota's own arithmetic; what a file is
/// charged is tested apart).
fn store(inner: &Arc<InMemory>, max: u64, quota: Option<u64>, ttl: Option<Duration>) -> S3Store {
    S3Store::with_store(
        inner.clone(),
        "deploy",
        S3StoreSettings {
            max_file_bytes: max,
            bounds: StoreBounds::quota(quota),
            charge: Charge::BYTES,
            ttl,
        },
        0,
    )
}

async fn keys_in(inner: &InMemory) -> Vec<String> {
    let mut keys: Vec<String> = inner
        .list(None)
        .map_ok(|o| o.location.to_string())
        .try_collect()
        .await
        .unwrap();
    keys.sort();
    keys
}

#[tokio::test]
async fn a_file_is_one_object_keyed_by_owner_id_and_name_and_another_replica_sees_it() {
    let inner = Arc::new(InMemory::new());
    let a = store(&inner, 1 << 20, None, None);
    let alice = FileOwner {
        name: Some("alice"),
        quota_bytes: None,
    };
    let meta = a
        .put(alice, "dir/é x.csv", &mut &b"x,y\n"[..])
        .await
        .unwrap();
    assert_eq!(
        keys_in(&inner).await,
        vec![format!("deploy/k.alice/{}/%C3%A9 x.csv", meta.file_id)]
    );
    // A second replica (nothing remembered) finds, lists and reads it.
    let b = store(&inner, 1 << 20, None, None);
    assert_eq!(b.meta(&meta.file_id, Some("alice")).await.unwrap(), meta);
    assert_eq!(b.list(Some("alice")).await.unwrap(), vec![meta.clone()]);
    let (_, mut r) = b.get(&meta.file_id, Some("alice"), None).await.unwrap();
    let mut out = Vec::new();
    r.read_to_end(&mut out).await.unwrap();
    assert_eq!(out, b"x,y\n");
    // Another tenant cannot reach it, not even knowing its id.
    assert!(matches!(
        b.get(&meta.file_id, Some("bob"), None).await,
        Err(StoreError::NotFound(_))
    ));
    // Deleted through one replica, it is gone on the other (which remembered it).
    a.delete(&meta.file_id, Some("alice")).await.unwrap();
    assert!(matches!(
        b.get(&meta.file_id, Some("alice"), None).await,
        Err(StoreError::NotFound(_))
    ));
    assert!(keys_in(&inner).await.is_empty());
}

#[tokio::test]
async fn big_files_stream_through_multipart_and_limits_leave_nothing_behind() {
    let inner = Arc::new(InMemory::new());
    let s = store(&inner, 20 << 20, Some(30 << 20), None);
    let too_big = vec![0u8; (20 << 20) + 1];
    assert!(matches!(
        s.put(FileOwner::default(), "x", &mut &too_big[..]).await,
        Err(StoreError::TooLarge { .. })
    ));
    let big: Vec<u8> = (0..(17u32 << 20)).map(|i| (i % 251) as u8).collect();
    let meta = s
        .put(FileOwner::default(), "big.bin", &mut &big[..])
        .await
        .unwrap();
    assert_eq!(meta.size_bytes, big.len() as u64);
    let (_, mut r) = s.get(&meta.file_id, None, None).await.unwrap();
    let mut out = Vec::new();
    r.read_to_end(&mut out).await.unwrap();
    assert!(out == big);
    let over = vec![0u8; 14 << 20];
    assert!(matches!(
        s.put(FileOwner::default(), "y", &mut &over[..]).await,
        Err(StoreError::QuotaExceeded { .. })
    ));
    assert_eq!(keys_in(&inner).await.len(), 1);
}

#[tokio::test]
async fn owners_have_their_quota_and_expired_files_go_everywhere_at_once() {
    let inner = Arc::new(InMemory::new());
    let s = store(&inner, 100, Some(100), Some(Duration::from_millis(80)));
    let alice = FileOwner {
        name: Some("alice"),
        quota_bytes: Some(8),
    };
    let meta = s.put(alice, "a.txt", &mut &b"hello"[..]).await.unwrap();
    assert!(matches!(
        s.put(alice, "b.txt", &mut &b"world"[..]).await,
        Err(StoreError::OwnerQuotaExceeded { quota_bytes: 8, .. })
    ));
    // Quota usage is read from the store: a fresh replica counts alice's bytes too.
    let other = store(&inner, 100, Some(100), Some(Duration::from_millis(80)));
    assert!(matches!(
        other.put(alice, "b.txt", &mut &b"world"[..]).await,
        Err(StoreError::OwnerQuotaExceeded { .. })
    ));
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(other.list(Some("alice")).await.unwrap().is_empty());
    assert!(matches!(
        s.meta(&meta.file_id, Some("alice")).await,
        Err(StoreError::NotFound(_))
    ));
    // Two replicas sweeping at once: both succeed, the object is gone.
    let (x, y) = tokio::join!(s.remove_expired(), other.remove_expired());
    assert!(x.unwrap() + y.unwrap() >= 1);
    assert!(keys_in(&inner).await.is_empty());
    // Space came back.
    s.put(alice, "c.txt", &mut &b"world"[..]).await.unwrap();
}

#[tokio::test]
async fn foreign_keys_and_bad_ids_are_not_files() {
    let inner = Arc::new(InMemory::new());
    inner
        .put(&Path::from("deploy/_/not-a-uuid/x"), b"x".to_vec().into())
        .await
        .unwrap();
    inner
        .put(&Path::from("elsewhere/thing"), b"x".to_vec().into())
        .await
        .unwrap();
    let s = store(&inner, 100, None, None);
    assert!(s.list(None).await.unwrap().is_empty());
    assert!(s.list_all().await.unwrap().is_empty());
    for id in ["../x", "not-a-uuid", &uuid::Uuid::new_v4().to_string()] {
        assert!(matches!(
            s.get(id, None, None).await,
            Err(StoreError::NotFound(_))
        ));
    }
    s.check().await.unwrap();
}

/// An object store whose every PUT fails (as a full or read-only bucket answers), the rest
/// in memory.
#[derive(Debug)]
struct RefusesPuts(Arc<InMemory>);

impl std::fmt::Display for RefusesPuts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "RefusesPuts")
    }
}

#[async_trait::async_trait]
impl ObjectStore for RefusesPuts {
    async fn put_opts(
        &self,
        _: &Path,
        _: object_store::PutPayload,
        _: object_store::PutOptions,
    ) -> object_store::Result<object_store::PutResult> {
        Err(object_store::Error::Generic {
            store: "RefusesPuts",
            source: "the bucket is read-only".into(),
        })
    }
    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: object_store::PutMultipartOptions,
    ) -> object_store::Result<Box<dyn object_store::MultipartUpload>> {
        self.0.put_multipart_opts(location, opts).await
    }
    async fn get_opts(
        &self,
        location: &Path,
        options: object_store::GetOptions,
    ) -> object_store::Result<object_store::GetResult> {
        self.0.get_opts(location, options).await
    }
    fn delete_stream(
        &self,
        locations: futures_util::stream::BoxStream<'static, object_store::Result<Path>>,
    ) -> futures_util::stream::BoxStream<'static, object_store::Result<Path>> {
        self.0.delete_stream(locations)
    }
    fn list(
        &self,
        prefix: Option<&Path>,
    ) -> futures_util::stream::BoxStream<'static, object_store::Result<object_store::ObjectMeta>>
    {
        self.0.list(prefix)
    }
    async fn list_with_delimiter(
        &self,
        prefix: Option<&Path>,
    ) -> object_store::Result<object_store::ListResult> {
        self.0.list_with_delimiter(prefix).await
    }
    async fn copy_opts(
        &self,
        from: &Path,
        to: &Path,
        options: object_store::CopyOptions,
    ) -> object_store::Result<()> {
        self.0.copy_opts(from, to, options).await
    }
}

/// A small file is one PUT, made when the upload completes: refused, the upload is
/// `Unavailable` saying so (the writer, shut down by then, is not aborted: that panicked),
/// and nothing is stored or counted.
#[tokio::test]
async fn an_upload_refused_as_it_completes_is_unavailable_and_leaves_nothing() {
    let inner = Arc::new(InMemory::new());
    let refusing = Arc::new(RefusesPuts(inner.clone()));
    let settings = S3StoreSettings {
        max_file_bytes: 1 << 20,
        bounds: StoreBounds::quota(Some(1 << 20)),
        charge: Charge::default(),
        ttl: None,
    };
    let s = S3Store::with_store(refusing, "deploy", settings, 0);
    let err = s
        .put(FileOwner::default(), "klein.txt", &mut &b"hallo"[..])
        .await
        .unwrap_err();
    assert!(
        matches!(&err, StoreError::Unavailable { doing, detail }
            if *doing == "completing the upload" && detail.contains("the bucket is read-only")),
        "{err:?}"
    );
    assert!(keys_in(&inner).await.is_empty());
    assert!(s.list(None).await.unwrap().is_empty());
}

/// Objects are charged as the local store charges files, counted by every replica from
/// the listing: tiny files fill a quota by their blocks, and a key's file count holds.
#[tokio::test]
async fn objects_are_charged_their_blocks_and_counted_by_every_replica() {
    let inner = Arc::new(InMemory::new());
    let open = || {
        S3Store::with_store(
            inner.clone(),
            "deploy",
            S3StoreSettings {
                max_file_bytes: 1 << 20,
                bounds: StoreBounds {
                    quota_bytes: Some(40 << 10),
                    max_files_per_key: Some(3),
                    key_share_bytes: Some(24 << 10),
                    ..StoreBounds::default()
                },
                charge: Charge::default(),
                ttl: None,
            },
            0,
        )
    };
    let a = open();
    let key = |name| FileOwner {
        name: Some(name),
        quota_bytes: None,
    };
    for i in 0..3 {
        a.put(key("ana"), &format!("{i}.txt"), &mut &b"x"[..])
            .await
            .unwrap();
    }
    // Three one-byte files are 24 KiB: ana's share, and its count.
    let b = open();
    let refused = b
        .put(key("ana"), "3.txt", &mut &b"x"[..])
        .await
        .unwrap_err();
    assert!(
        matches!(&refused, StoreError::TooManyFiles { owner: Some(o), max_files: 3 } if o == "ana"),
        "{refused:?}"
    );
    b.put(key("bo"), "1.txt", &mut &b"x"[..]).await.unwrap();
    // 32 KiB held; 9000 bytes more would be 16 KiB: over the store's 40 KiB.
    let refused = b
        .put(key("bo"), "2.txt", &mut &[1u8; 9000][..])
        .await
        .unwrap_err();
    let StoreError::QuotaExceeded {
        stored_bytes,
        holders: Some(holders),
        ..
    } = refused
    else {
        panic!("{refused:?}");
    };
    assert_eq!(stored_bytes, 32 << 10);
    assert_eq!(
        holders,
        Holders {
            caller: 8 << 10,
            caller_rank: Some(2),
            largest: 24 << 10,
            keys: 2
        }
    );
    assert_eq!(keys_in(&inner).await.len(), 4);
}
