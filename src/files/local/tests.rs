//! The local store: round trips, limits, expiry, recovery at open, owners.

use super::*;
use tokio::io::AsyncReadExt;

use crate::files::Held;

/// A store that charges file bytes alone (the quota's own arithmetic; what a file is
/// charged is tested apart).
fn store(dir: &Path, max: u64, quota: Option<u64>, ttl: Option<Duration>) -> LocalStore {
    LocalStore::open(LocalStoreSettings {
        dir: dir.to_path_buf(),
        max_file_bytes: max,
        bounds: StoreBounds::quota(quota),
        charge: Charge::BYTES,
        ttl,
    })
    .unwrap()
}

async fn read_all(mut r: ByteReader) -> Vec<u8> {
    let mut out = Vec::new();
    r.read_to_end(&mut out).await.unwrap();
    out
}

#[tokio::test]
async fn put_get_list_delete_and_the_metadata_survives_reopening() {
    let dir = tempfile::tempdir().unwrap();
    let s = store(dir.path(), 1 << 20, None, None);
    let meta = s
        .put(FileOwner::default(), "dir/a.csv", &mut &b"x,y\n1,2\n"[..])
        .await
        .unwrap();
    assert_eq!(
        (
            meta.filename.as_str(),
            meta.size_bytes,
            meta.mime_type.as_str()
        ),
        ("a.csv", 8, "text/csv")
    );
    let (_, r) = s.get(&meta.file_id, None, None).await.unwrap();
    assert_eq!(read_all(r).await, b"x,y\n1,2\n");
    drop(s);

    let s = store(dir.path(), 1 << 20, None, None);
    assert_eq!(s.list(None).await.unwrap(), vec![meta.clone()]);
    s.delete(&meta.file_id, None).await.unwrap();
    assert!(matches!(
        s.get(&meta.file_id, None, None).await,
        Err(StoreError::NotFound(_))
    ));
    assert!(matches!(
        s.delete(&meta.file_id, None).await,
        Err(StoreError::NotFound(_))
    ));
    assert!(s.list(None).await.unwrap().is_empty());
    assert!(matches!(
        s.get("../meta", None, None).await,
        Err(StoreError::NotFound(_))
    ));
}

#[tokio::test]
async fn too_large_and_over_quota_keep_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let s = store(dir.path(), 10, Some(15), None);
    let big = [7u8; 11];
    assert!(matches!(
        s.put(FileOwner::default(), "big", &mut &big[..]).await,
        Err(StoreError::TooLarge { max_bytes: 10 })
    ));
    s.put(FileOwner::default(), "a", &mut &[1u8; 10][..])
        .await
        .unwrap();
    assert!(matches!(
        s.put(FileOwner::default(), "b", &mut &[1u8; 6][..]).await,
        Err(StoreError::QuotaExceeded {
            quota_bytes: 15,
            stored_bytes: 10,
            upload: UploadSize::AtLeast(6),
            ..
        })
    ));
    s.put(FileOwner::default(), "c", &mut &[1u8; 5][..])
        .await
        .unwrap();
    assert_eq!(s.list(None).await.unwrap().len(), 2);
    let leftovers = std::fs::read_dir(dir.path().join("tmp")).unwrap().count();
    assert_eq!(leftovers, 0);
    assert_eq!(
        std::fs::read_dir(dir.path().join("objects"))
            .unwrap()
            .count(),
        2
    );
}

#[tokio::test]
async fn expired_files_are_gone_at_once_and_swept_later() {
    let dir = tempfile::tempdir().unwrap();
    let s = store(dir.path(), 100, Some(100), Some(Duration::from_millis(50)));
    let meta = s
        .put(FileOwner::default(), "a.txt", &mut &b"hello"[..])
        .await
        .unwrap();
    assert_eq!(s.list(None).await.unwrap().len(), 1);
    tokio::time::sleep(Duration::from_millis(60)).await;
    assert!(s.list(None).await.unwrap().is_empty());
    assert!(matches!(
        s.meta(&meta.file_id, None).await,
        Err(StoreError::NotFound(_))
    ));
    assert_eq!(s.remove_expired().await.unwrap(), 1);
    assert_eq!(s.state.lock().unwrap().all, crate::files::Held::default());
    assert!(!s.object_path(&meta.file_id).exists());
}

#[tokio::test]
async fn half_written_and_orphaned_files_are_cleaned_at_open() {
    let dir = tempfile::tempdir().unwrap();
    let s = store(dir.path(), 100, None, None);
    let meta = s
        .put(FileOwner::default(), "a.txt", &mut &b"hello"[..])
        .await
        .unwrap();
    drop(s);
    let orphan = uuid::Uuid::new_v4().to_string();
    std::fs::write(dir.path().join("objects").join(&orphan), b"partial").unwrap();
    std::fs::write(dir.path().join("tmp").join("x"), b"in progress").unwrap();
    std::fs::write(dir.path().join("meta").join("junk.json"), b"{").unwrap();
    let s = store(dir.path(), 100, None, None);
    assert_eq!(s.list(None).await.unwrap(), vec![meta]);
    assert!(!dir.path().join("objects").join(&orphan).exists());
    assert_eq!(
        std::fs::read_dir(dir.path().join("tmp")).unwrap().count(),
        0
    );
}

#[tokio::test]
async fn a_file_is_visible_only_to_its_owner_and_owners_have_their_own_quota() {
    let dir = tempfile::tempdir().unwrap();
    let s = store(dir.path(), 100, Some(100), None);
    let alice = FileOwner {
        name: Some("alice"),
        quota_bytes: Some(8),
    };
    let meta = s.put(alice, "a.txt", &mut &b"hello"[..]).await.unwrap();
    assert_eq!(meta.owner.as_deref(), Some("alice"));
    let id = &meta.file_id;
    for owner in [Some("bob"), None] {
        assert!(matches!(
            s.meta(id, owner).await,
            Err(StoreError::NotFound(_))
        ));
        assert!(matches!(
            s.get(id, owner, None).await,
            Err(StoreError::NotFound(_))
        ));
        assert!(matches!(
            s.delete(id, owner).await,
            Err(StoreError::NotFound(_))
        ));
        assert!(s.list(owner).await.unwrap().is_empty());
    }
    assert!(matches!(
        s.put(alice, "b.txt", &mut &b"world"[..]).await,
        Err(StoreError::OwnerQuotaExceeded { quota_bytes: 8, .. })
    ));
    let bob = FileOwner {
        name: Some("bob"),
        quota_bytes: Some(8),
    };
    s.put(bob, "b.txt", &mut &b"world"[..]).await.unwrap();
    drop(s);

    // Owners and their usage survive reopening.
    let s = store(dir.path(), 100, Some(100), None);
    assert_eq!(s.list(Some("alice")).await.unwrap(), vec![meta.clone()]);
    assert_eq!(s.list_all().await.unwrap().len(), 2);
    assert!(matches!(
        s.put(alice, "c.txt", &mut &b"world"[..]).await,
        Err(StoreError::OwnerQuotaExceeded { .. })
    ));
    s.delete(id, Some("alice")).await.unwrap();
    s.put(alice, "c.txt", &mut &b"world"[..]).await.unwrap();
}

#[tokio::test]
async fn a_directory_removed_under_the_store_is_recreated_its_files_forgotten_and_its_quota_freed()
{
    let parent = tempfile::tempdir().unwrap();
    let dir = parent.path().join("fichiers");
    let s = store(&dir, 1 << 20, Some(10), None);
    let owner = FileOwner::default();
    s.put(owner, "vieux-é.txt", &mut &b"12345678"[..])
        .await
        .unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    // The quota counted the lost file: this put fits only once it is forgotten.
    let meta = s
        .put(owner, "neuf-é.txt", &mut &b"abcdef"[..])
        .await
        .unwrap();
    assert_eq!(s.list(None).await.unwrap(), vec![meta.clone()]);
    let recovery = s.last_recovery().unwrap();
    assert_eq!(recovery.lost_files, 1);
    // A second instance cannot take the recreated directory.
    assert!(matches!(
        LocalStore::open(LocalStoreSettings {
            dir: dir.clone(),
            max_file_bytes: 1,
            bounds: crate::files::StoreBounds::default(),
            charge: crate::files::Charge::default(),
            ttl: None,
        }),
        Err(StoreError::InUse { .. })
    ));
    // A directory that cannot be recreated: the store is unavailable (every operation
    // says so, never an internal error), until it can be.
    std::fs::remove_dir_all(&dir).unwrap();
    std::fs::write(&dir, "not a directory").unwrap();
    let unavailable = |r: Result<(), StoreError>| match r {
        Err(StoreError::Unavailable { detail, .. }) => {
            assert!(detail.contains("Not a directory"), "{detail}")
        }
        other => panic!("{other:?}"),
    };
    unavailable(s.check().await);
    unavailable(s.list(None).await.map(drop));
    unavailable(s.put(owner, "x", &mut &b"x"[..]).await.map(drop));
    unavailable(s.get(&meta.file_id, None, None).await.map(drop));
    unavailable(s.meta(&meta.file_id, None).await.map(drop));
    unavailable(s.delete(&meta.file_id, None).await);
    std::fs::remove_file(&dir).unwrap();
    s.check().await.unwrap();
    assert_eq!(s.list(None).await.unwrap(), Vec::<FileMeta>::new());
    assert_eq!(s.last_recovery().unwrap().lost_files, 1);
}

fn charged_store(dir: &Path, bounds: StoreBounds) -> LocalStore {
    LocalStore::open(LocalStoreSettings {
        dir: dir.to_path_buf(),
        max_file_bytes: 1 << 20,
        bounds,
        charge: Charge::default(),
        ttl: None,
    })
    .unwrap()
}

/// Tiny files are charged their blocks and their metadata's: 40 KiB holds five one-byte
/// files, not forty thousand; the refusal says what a file counts.
#[tokio::test]
async fn tiny_files_are_charged_what_they_take() {
    let dir = tempfile::tempdir().unwrap();
    let s = charged_store(dir.path(), StoreBounds::quota(Some(40 << 10)));
    for i in 0..5 {
        s.put(FileOwner::default(), &format!("{i}"), &mut &b"x"[..])
            .await
            .unwrap();
    }
    let refused = s
        .put(FileOwner::default(), "6", &mut &b"x"[..])
        .await
        .unwrap_err();
    assert!(
        matches!(
            refused,
            StoreError::QuotaExceeded {
                quota_bytes: 40960,
                stored_bytes: 40960,
                upload: UploadSize::AtLeast(0),
                holders: None,
                ..
            }
        ),
        "{refused:?}"
    );
    // An empty file is charged its metadata alone, and so does not fit either.
    assert!(matches!(
        s.put(FileOwner::default(), "vide", &mut &b""[..]).await,
        Err(StoreError::QuotaExceeded { .. })
    ));
    assert_eq!(
        s.state.lock().unwrap().all,
        Held {
            files: 5,
            charged: 40960
        }
    );
    assert_eq!(
        std::fs::read_dir(dir.path().join("objects"))
            .unwrap()
            .count(),
        5
    );
}

/// File counts: the store's, then a key's; deleting one makes room for one.
#[tokio::test]
async fn the_store_and_each_key_hold_at_most_their_count_of_files() {
    let dir = tempfile::tempdir().unwrap();
    let s = charged_store(
        dir.path(),
        StoreBounds {
            max_files: Some(3),
            max_files_per_key: Some(2),
            ..StoreBounds::default()
        },
    );
    let key = |name| FileOwner {
        name: Some(name),
        quota_bytes: None,
    };
    let first = s.put(key("ana"), "a", &mut &b"1"[..]).await.unwrap();
    s.put(key("ana"), "b", &mut &b"2"[..]).await.unwrap();
    let refused = s.put(key("ana"), "c", &mut &b"3"[..]).await.unwrap_err();
    assert!(
        matches!(&refused, StoreError::TooManyFiles { owner: Some(o), max_files: 2 } if o == "ana"),
        "{refused:?}"
    );
    s.put(key("bo"), "d", &mut &b"4"[..]).await.unwrap();
    let refused = s.put(key("cy"), "e", &mut &b"5"[..]).await.unwrap_err();
    assert!(
        matches!(
            refused,
            StoreError::TooManyFiles {
                owner: None,
                max_files: 3
            }
        ),
        "{refused:?}"
    );
    s.delete(&first.file_id, Some("ana")).await.unwrap();
    s.put(key("cy"), "e", &mut &b"5"[..]).await.unwrap();
}

/// A key without its own quota holds at most its share; then the store is full for the
/// others, and its refusal says how the caller compares, never whose the most is.
#[tokio::test]
async fn a_key_without_its_own_quota_holds_its_share_and_a_full_store_ranks_the_caller() {
    let dir = tempfile::tempdir().unwrap();
    let s = charged_store(
        dir.path(),
        StoreBounds {
            quota_bytes: Some(64 << 10),
            key_share_bytes: Some(40 << 10),
            ..StoreBounds::default()
        },
    );
    let key = |name| FileOwner {
        name: Some(name),
        quota_bytes: None,
    };
    let block = vec![7u8; 4096];
    for i in 0..5 {
        s.put(key("gross"), &format!("{i}"), &mut &block[..])
            .await
            .unwrap();
    }
    // 5 × 8 KiB = 40 KiB: its share is full.
    let refused = s.put(key("gross"), "5", &mut &block[..]).await.unwrap_err();
    assert!(
        matches!(
            refused,
            StoreError::OwnerQuotaExceeded {
                quota_bytes: 40960,
                stored_bytes: 40960,
                own: false,
                ..
            }
        ),
        "{refused:?}"
    );
    // Another key stores; its own quota is its own, whatever the share.
    let klein = FileOwner {
        name: Some("klein"),
        quota_bytes: Some(1 << 20),
    };
    for i in 0..3 {
        s.put(klein, &format!("{i}"), &mut &block[..])
            .await
            .unwrap();
    }
    let refused = s.put(klein, "3", &mut &block[..]).await.unwrap_err();
    let StoreError::QuotaExceeded {
        holders: Some(holders),
        stored_bytes: 65536,
        ..
    } = refused
    else {
        panic!("{refused:?}");
    };
    assert_eq!(
        holders,
        Holders {
            caller: 24 << 10,
            caller_rank: Some(2),
            largest: 40 << 10,
            keys: 2
        }
    );
}

/// A store written before files were charged: its index holds sizes only, and is counted
/// in charges when it opens; every file is still there.
#[tokio::test]
async fn an_old_store_is_counted_in_charges_when_it_opens_and_keeps_its_files() {
    let dir = tempfile::tempdir().unwrap();
    for sub in ["objects", "meta", "tmp"] {
        std::fs::create_dir_all(dir.path().join(sub)).unwrap();
    }
    let mut ids = Vec::new();
    for (i, owner) in [Some("alt"), Some("alt"), None].into_iter().enumerate() {
        let id = uuid::Uuid::now_v7().to_string();
        std::fs::write(dir.path().join("objects").join(&id), vec![b'x'; i * 3000]).unwrap();
        // The metadata as the store wrote it before: no field was added since.
        let mut meta = serde_json::json!({
            "file_id": id, "filename": format!("ältere-{i}.txt"), "size_bytes": i * 3000,
            "mime_type": "text/plain", "created_unix_ms": now_unix_ms(),
        });
        if let Some(owner) = owner {
            meta["owner"] = owner.into();
        }
        std::fs::write(
            dir.path().join("meta").join(format!("{id}.json")),
            serde_json::to_vec(&meta).unwrap(),
        )
        .unwrap();
        ids.push(id);
    }
    let s = charged_store(dir.path(), StoreBounds::quota(Some(1 << 20)));
    {
        let state = s.state.lock().unwrap();
        // 0 → 4 KiB, 3000 → 8 KiB, 6000 → 12 KiB.
        assert_eq!(
            state.all,
            Held {
                files: 3,
                charged: 24 << 10
            }
        );
        assert_eq!(
            state.held_by(Some("alt")),
            Held {
                files: 2,
                charged: 12 << 10
            }
        );
    }
    assert_eq!(s.list(Some("alt")).await.unwrap().len(), 2);
    let (meta, r) = s.get(&ids[2], None, None).await.unwrap();
    assert_eq!(meta.filename, "ältere-2.txt");
    assert_eq!(read_all(r).await.len(), 6000);
}
