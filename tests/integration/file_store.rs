//! One conformance suite for every `FileStore` backend: the local directory and the S3
//! store on a real S3-compatible server (SeaweedFS). What a client can observe through the
//! trait must not depend on the backend.

use std::sync::Arc;
use std::time::Duration;

use object_store::aws::AmazonS3Builder;
use snakecage::files::local::LocalStoreSettings;
use snakecage::files::s3::S3StoreSettings;
use snakecage::files::{
    Charge, FileOwner, FileStore, LocalStore, S3Store, StoreBounds, StoreError,
};
use tokio::io::AsyncReadExt;

use crate::backing::{ACCESS_KEY, BUCKET, SECRET_KEY, Seaweed};

struct Limits {
    max: u64,
    quota: Option<u64>,
    ttl: Option<Duration>,
}

/// Opens a store of one backend; calling it again opens the same data (a restart).
type Open = Box<dyn Fn(&Limits) -> Arc<dyn FileStore>>;

fn local(dir: std::path::PathBuf) -> Open {
    Box::new(move |l: &Limits| {
        Arc::new(
            LocalStore::open(LocalStoreSettings {
                dir: dir.clone(),
                max_file_bytes: l.max,
                bounds: StoreBounds::quota(l.quota),
                charge: Charge::BYTES,
                ttl: l.ttl,
            })
            .unwrap(),
        ) as Arc<dyn FileStore>
    })
}

fn s3(endpoint: String, prefix: String) -> Open {
    Box::new(move |l: &Limits| {
        let client = AmazonS3Builder::new()
            .with_endpoint(&endpoint)
            .with_bucket_name(BUCKET)
            .with_region("us-east-1")
            .with_access_key_id(ACCESS_KEY)
            .with_secret_access_key(SECRET_KEY)
            .with_allow_http(true)
            .with_virtual_hosted_style_request(false)
            .build()
            .unwrap();
        let settings = S3StoreSettings {
            max_file_bytes: l.max,
            bounds: StoreBounds::quota(l.quota),
            charge: Charge::BYTES,
            ttl: l.ttl,
        };
        Arc::new(S3Store::with_store(Arc::new(client), &prefix, settings, 0)) as Arc<dyn FileStore>
    })
}

async fn bytes_of(store: &dyn FileStore, id: &str, owner: Option<&str>) -> Vec<u8> {
    let (_, mut reader) = store.get(id, owner, None).await.unwrap();
    let mut out = Vec::new();
    reader.read_to_end(&mut out).await.unwrap();
    out
}

async fn conformance(open: Open) {
    let limits = Limits {
        max: 1 << 20,
        quota: Some(1_200_000),
        ttl: None,
    };
    let s = open(&limits);
    let none = FileOwner::default();

    // Past the maximum size: nothing is kept.
    let big = vec![1u8; (1 << 20) + 1];
    assert!(matches!(
        s.put(none, "big", &mut &big[..]).await,
        Err(StoreError::TooLarge { .. })
    ));

    // Round trip, awkward names, metadata.
    let data: Vec<u8> = (0..=255u8).cycle().take(300_000).collect();
    let meta = s
        .put(none, "dir/données #1.csv", &mut &data[..])
        .await
        .unwrap();
    assert_eq!(meta.filename, "données #1.csv");
    assert_eq!(meta.mime_type, "text/csv");
    assert_eq!(meta.size_bytes, 300_000);
    assert!(bytes_of(s.as_ref(), &meta.file_id, None).await == data);
    assert_eq!(s.meta(&meta.file_id, None).await.unwrap(), meta);
    // A range is exactly its bytes, at the start, inside, and at the end.
    for range in [0..1, 1000..70_000, 299_999..300_000, 0..300_000] {
        let (got, mut reader) = s
            .get(&meta.file_id, None, Some(range.clone()))
            .await
            .unwrap();
        assert_eq!(got, meta);
        let mut part = Vec::new();
        reader.read_to_end(&mut part).await.unwrap();
        let want = &data[range.start as usize..range.end as usize];
        assert!(part == want, "{range:?}: {} bytes", part.len());
    }
    let empty = s.put(none, "empty", &mut &b""[..]).await.unwrap();
    assert!(bytes_of(s.as_ref(), &empty.file_id, None).await.is_empty());

    // Past the quota: nothing is kept.
    let over = vec![2u8; 1_000_000];
    assert!(matches!(
        s.put(none, "over", &mut &over[..]).await,
        Err(StoreError::QuotaExceeded { .. })
    ));
    assert_eq!(
        s.list(None).await.unwrap(),
        vec![meta.clone(), empty.clone()]
    );

    // Tenants: invisible to each other, their own quota.
    let alice = FileOwner {
        name: Some("alice"),
        quota_bytes: Some(10),
    };
    let a = s.put(alice, "a.txt", &mut &b"hello"[..]).await.unwrap();
    for owner in [None, Some("bob")] {
        assert!(matches!(
            s.get(&a.file_id, owner, None).await,
            Err(StoreError::NotFound(_))
        ));
        assert!(matches!(
            s.delete(&a.file_id, owner).await,
            Err(StoreError::NotFound(_))
        ));
    }
    assert!(matches!(
        s.put(alice, "b.txt", &mut &b"world!"[..]).await,
        Err(StoreError::OwnerQuotaExceeded { .. })
    ));
    assert_eq!(s.list(Some("alice")).await.unwrap(), vec![a.clone()]);
    assert_eq!(s.list_all().await.unwrap().len(), 3);

    // A restart keeps everything.
    drop(s);
    let s = open(&limits);
    assert_eq!(
        s.list(None).await.unwrap(),
        vec![meta.clone(), empty.clone()]
    );
    assert!(bytes_of(s.as_ref(), &meta.file_id, None).await == data);

    // Ids are UUIDs, taken in any case (here by a store that has not seen the file yet).
    let upper = meta.file_id.to_uppercase();
    assert_eq!(s.meta(&upper, None).await.unwrap(), meta);
    assert!(bytes_of(s.as_ref(), &upper, None).await == data);
    assert!(matches!(
        s.get(&upper, Some("alice"), None).await,
        Err(StoreError::NotFound(_))
    ));

    // A name past 255 bytes (as the store writes it: the S3 store's keys percent-encode
    // what is not ASCII) loses the end of its stem, not its extension.
    for long in [
        format!("{}.csv", "x".repeat(300)),
        format!("{}.csv", "é".repeat(200)),
    ] {
        let cut = s.put(none, &long, &mut &b"a,b\n"[..]).await.unwrap();
        let stem = cut.filename.strip_suffix(".csv").unwrap();
        assert!(
            cut.filename.len() <= 255 && stem.len() >= 40 && long.starts_with(stem),
            "{}",
            cut.filename
        );
        assert_eq!(cut.mime_type, "text/csv", "{}", cut.filename);
        assert_eq!(s.meta(&cut.file_id, None).await.unwrap(), cut);
        assert!(s.list(None).await.unwrap().contains(&cut));
        s.delete(&cut.file_id, None).await.unwrap();
    }

    // Delete (by an id in upper case); bad ids are not found.
    s.delete(&upper, None).await.unwrap();
    assert!(matches!(
        s.get(&meta.file_id, None, None).await,
        Err(StoreError::NotFound(_))
    ));
    assert!(matches!(
        s.delete(&meta.file_id, None).await,
        Err(StoreError::NotFound(_))
    ));
    for bad in ["../../etc/passwd", "x", ""] {
        assert!(matches!(
            s.get(bad, None, None).await,
            Err(StoreError::NotFound(_))
        ));
    }

    // Expiry: gone at once, swept later, space back.
    let short = Limits {
        ttl: Some(Duration::from_millis(300)),
        ..limits
    };
    // Reopened with a short TTL: the first store lets go of the directory (and its lock)
    // first, as a restarted service would.
    drop(s);
    let s = open(&short);
    let t = s.put(none, "t.txt", &mut &b"soon gone"[..]).await.unwrap();
    assert!(s.meta(&t.file_id, None).await.is_ok());
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert!(matches!(
        s.meta(&t.file_id, None).await,
        Err(StoreError::NotFound(_))
    ));
    assert!(s.list_all().await.unwrap().is_empty());
    assert!(s.remove_expired().await.unwrap() >= 1);
    assert_eq!(s.remove_expired().await.unwrap(), 0);
    s.check().await.unwrap();
}

#[tokio::test]
async fn the_local_store_conforms() {
    let dir = tempfile::tempdir().unwrap();
    conformance(local(dir.path().to_path_buf())).await;
}

#[tokio::test]
async fn the_s3_store_conforms() {
    let weed = Seaweed::start().await;
    conformance(s3(weed.endpoint.clone(), "conformance".into())).await;
}
