//! The [`GlobalStore`](crate::GlobalStore) cases on write-once entries:
//! set_if_absent, get, get_nearest, get_many and scan.

use homing_core::key::{KEY_NAME_BYTES_MAX, NAMESPACE_BYTES_MAX};
use homing_core::{DcId, Key, ReservationId};

use super::{Backend, RACERS, key, rid};
use crate::error::StoreError;
use crate::global::{GET_MANY_KEYS_MAX, SetIfAbsent};

/// global: a second set_if_absent returns the first entry, and get returns it.
pub async fn global_write_once(b: &dyn Backend) {
    let g = b.global_store("global_write_once").await;
    let k = key("", "room");
    assert_eq!(g.get(&k).await.unwrap(), None);
    assert_eq!(
        g.set_if_absent(&k, &rid("iad.1")).await.unwrap(),
        SetIfAbsent::Inserted
    );
    assert_eq!(
        g.set_if_absent(&k, &rid("fra.1")).await.unwrap(),
        SetIfAbsent::Exists(rid("iad.1"))
    );
    // A retry of the winning write sees its own id.
    assert_eq!(
        g.set_if_absent(&k, &rid("iad.1")).await.unwrap(),
        SetIfAbsent::Exists(rid("iad.1"))
    );
    assert_eq!(g.get(&k).await.unwrap(), Some(rid("iad.1")));
}

/// global: a write-once that landed but whose answer was lost is retried by
/// the store, which reads the caller's own id back and answers `Inserted`
/// (it was, once); a later writer sees that entry.
pub async fn global_write_once_whose_answer_was_lost_is_inserted_once(b: &dyn Backend) {
    let Some(lossy) = b
        .global_store_losing_next_answer("global_lost_answer")
        .await
    else {
        println!("  skipped: this backend's writes cannot lose their answer");
        return;
    };
    let g = lossy.store;
    let k = key("", "lost-answer");
    assert_eq!(
        g.set_if_absent(&k, &rid("iad.7")).await.unwrap(),
        SetIfAbsent::Inserted
    );
    assert!((lossy.lost)(), "the answer to the write was not lost");
    assert_eq!(
        g.set_if_absent(&k, &rid("fra.7")).await.unwrap(),
        SetIfAbsent::Exists(rid("iad.7"))
    );
    assert_eq!(g.get(&k).await.unwrap(), Some(rid("iad.7")));
    if let Some(failover) = g.failover() {
        let resolved = failover.total(crate::FailoverEvent::AmbiguousResolved);
        assert_eq!(resolved, 1, "the store counts the outcome it resolved");
    }
}

/// global: the nearest-replica read never names a wrong entry and catches up
/// with acknowledged writes; a key never written reads absent.
pub async fn global_nearest_read_is_never_wrong_and_catches_up(b: &dyn Backend) {
    let g = b.global_store("global_nearest_read").await;
    let keys: Vec<Key> = (0..16).map(|i| key("near", &format!("k{i}"))).collect();
    for (i, k) in keys.iter().enumerate() {
        let id = rid(&format!("iad.{}", i + 1));
        assert_eq!(
            g.set_if_absent(k, &id).await.unwrap(),
            SetIfAbsent::Inserted
        );
    }
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    for (i, k) in keys.iter().enumerate() {
        let id = rid(&format!("iad.{}", i + 1));
        loop {
            match g.get_nearest(k).await.unwrap() {
                Some(found) => {
                    assert_eq!(found, id, "nearest read of {k} named a wrong entry");
                    break;
                }
                None if std::time::Instant::now() < deadline => {
                    tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                }
                None => panic!("nearest read of {k} still absent 10 s after the write"),
            }
        }
    }
    assert_eq!(g.get_nearest(&key("near", "never")).await.unwrap(), None);
}

/// global: concurrent set_if_absent on one key has exactly one winner and every loser sees it.
pub async fn global_concurrent_set_if_absent_has_exactly_one_winner(b: &dyn Backend) {
    let g = b.global_store("global_race").await;
    let k = key("race", "contested");
    let tasks: Vec<_> = (0..RACERS)
        .map(|i| {
            let (g, k) = (g.clone(), k.clone());
            tokio::spawn(async move {
                let id = ReservationId::new(DcId::new(format!("dc{i}")).expect("valid dc"), 1);
                (id.clone(), g.set_if_absent(&k, &id).await.unwrap())
            })
        })
        .collect();
    let mut winners = Vec::new();
    let mut seen = Vec::new();
    for t in tasks {
        let (id, outcome) = t.await.unwrap();
        match outcome {
            SetIfAbsent::Inserted => winners.push(id),
            SetIfAbsent::Exists(existing) => seen.push(existing),
        }
    }
    assert_eq!(winners.len(), 1, "exactly one winner");
    assert!(
        seen.iter().all(|s| s == &winners[0]),
        "every loser sees the winner"
    );
    assert_eq!(g.get(&k).await.unwrap().as_ref(), Some(&winners[0]));
}

/// global: get_many answers in key order and refuses oversized batches.
pub async fn global_get_many_keeps_order_and_bounds_the_batch(b: &dyn Backend) {
    let g = b.global_store("global_get_many").await;
    let keys: Vec<Key> = (0..10).map(|i| key("m", &format!("k{i}"))).collect();
    for (i, k) in keys.iter().enumerate().filter(|(i, _)| i % 3 == 0) {
        g.set_if_absent(k, &ReservationId::new(DcId::new("iad").unwrap(), i as u64))
            .await
            .unwrap();
    }
    let got = g.get_many(&keys).await.unwrap();
    for (i, entry) in got.iter().enumerate() {
        let want = (i % 3 == 0).then(|| ReservationId::new(DcId::new("iad").unwrap(), i as u64));
        assert_eq!(entry, &want, "entry {i}");
    }
    assert!(g.get_many(&[]).await.unwrap().is_empty());
    let too_many: Vec<Key> = (0..=GET_MANY_KEYS_MAX)
        .map(|i| key("m", &format!("x{i}")))
        .collect();
    assert!(matches!(
        g.get_many(&too_many).await,
        Err(StoreError::BatchTooLarge { .. })
    ));
}

/// global: namespaces and names with separators, unicode and maximum length never collide.
pub async fn global_unicode_and_long_keys_do_not_collide(b: &dyn Backend) {
    let g = b.global_store("global_unicode").await;
    let long_ns = "é".repeat(NAMESPACE_BYTES_MAX / 2);
    let long_name = "🔑".repeat(KEY_NAME_BYTES_MAX / 4);
    let keys = [
        key("a/b", "c"),
        key("a", "b/c"),
        key("", "a/b/c"),
        key("ключ", "名前 with spaces"),
        key(&long_ns, &long_name),
    ];
    for (i, k) in keys.iter().enumerate() {
        let id = ReservationId::new(DcId::new("iad").unwrap(), i as u64 + 1);
        assert_eq!(
            g.set_if_absent(k, &id).await.unwrap(),
            SetIfAbsent::Inserted,
            "{k}"
        );
    }
    for (i, k) in keys.iter().enumerate() {
        let id = ReservationId::new(DcId::new("iad").unwrap(), i as u64 + 1);
        assert_eq!(g.get(k).await.unwrap(), Some(id), "{k}");
    }
}

/// global: scan pages through every entry in key order.
pub async fn global_scan_pages_in_key_order(b: &dyn Backend) {
    let g = b.global_store("global_scan").await;
    assert!(g.scan(None, 10).await.unwrap().is_empty());
    let keys = [
        key("b", "x"),
        key("", "b"),
        key("a/b", "c"),
        key("a", "b/c"),
        key("", "a"),
        key("ключ", "名前"),
        key("a", "b"),
        key("ab", "a"),
        key("", "ab"),
    ];
    let mut want = Vec::new();
    for (i, k) in keys.iter().enumerate() {
        let id = ReservationId::new(DcId::new("iad").unwrap(), i as u64 + 1);
        g.set_if_absent(k, &id).await.unwrap();
        want.push((k.clone(), id));
    }
    want.sort();
    assert_eq!(g.scan(None, GET_MANY_KEYS_MAX).await.unwrap(), want);
    for limit in [1, 2, 4] {
        let mut paged = Vec::new();
        let mut after: Option<Key> = None;
        loop {
            let page = g.scan(after.as_ref(), limit).await.unwrap();
            assert!(page.len() <= limit);
            let last_page = page.len() < limit;
            after = page.last().map(|(k, _)| k.clone());
            paged.extend(page);
            if last_page {
                break;
            }
        }
        assert_eq!(paged, want, "pages of {limit}");
    }
    // A cursor that is no entry starts at the next one.
    assert_eq!(
        g.scan(Some(&key("", "aa")), 1).await.unwrap(),
        want[1..2].to_vec()
    );
    let last = &want[want.len() - 1].0;
    assert!(g.scan(Some(last), 10).await.unwrap().is_empty());
    assert!(g.scan(None, 0).await.unwrap().is_empty());
    assert!(matches!(
        g.scan(None, GET_MANY_KEYS_MAX + 1).await,
        Err(StoreError::BatchTooLarge { .. })
    ));
}
