//! The one conformance suite every [`GlobalStore`] and [`DcStore`] backend
//! must pass. A backend provides a [`Backend`] (how to open a store at a
//! named place); [`conformance_tests!`](crate::conformance_tests) turns the
//! suite into one `#[tokio::test]` per case, and [`run_all`] runs every case
//! in sequence (for backends that need one expensive fixture, like an etcd
//! cluster). Enabled under `cfg(test)` and by the `conformance` feature.

use std::collections::HashSet;
use std::sync::Arc;

use async_trait::async_trait;
use homing_core::actor::ACTOR_ID_BYTES_MAX;
use homing_core::dc::DC_ID_BYTES_MAX;
use homing_core::key::{KEY_NAME_BYTES_MAX, NAMESPACE_BYTES_MAX, TAG_BYTES_MAX};
use homing_core::{
    ActorId, DcId, DcRecord, FencingToken, HostTime, Key, KeyName, LeasePolicy, Namespace,
    ReservationId, StoreTime, Tag,
};

use crate::dc::{Cas, DcStore, SCAN_LIMIT_MAX, ScanCursor};
use crate::error::StoreError;
use crate::global::{GET_MANY_KEYS_MAX, GlobalStore, SetIfAbsent};

/// Concurrent tasks in the race cases.
pub const RACERS: usize = 32;

/// How the suite opens stores of one backend.
#[async_trait]
pub trait Backend: Send + Sync {
    /// The global store at `place`; empty the first time a place is opened.
    async fn global_store(&self, place: &str) -> Arc<dyn GlobalStore>;
    /// The DC store at `place`; empty the first time a place is opened. The
    /// suite drops every handle before opening a place again.
    async fn dc_store(&self, place: &str) -> Arc<dyn DcStore>;
    /// Whether reopening a place finds what was written there.
    fn durable(&self) -> bool;
}

fn key(ns: &str, name: &str) -> Key {
    Key::in_namespace(
        Namespace::new(ns).expect("valid namespace"),
        KeyName::new(name).expect("valid name"),
    )
}

fn rid(text: &str) -> ReservationId {
    text.parse().expect("valid reservation id")
}

/// A fresh version-1 record of `id` for `key`.
pub fn record(id: &ReservationId, key: &Key) -> DcRecord {
    DcRecord::reserve(
        id.clone(),
        key.clone(),
        None,
        FencingToken::FIRST,
        None,
        ActorId::new("10.0.0.1:9000").expect("valid actor"),
        HostTime::from_ms(0),
        StoreTime::from_ms(0),
        &LeasePolicy::DEFAULT,
    )
    .0
}

fn next_version(r: &DcRecord) -> DcRecord {
    let mut next = r.clone();
    next.allow_renew = !r.allow_renew;
    next.version = r.version + 1;
    next
}

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

/// dc: create then update by compare-and-set, each read back.
pub async fn dc_cas_creates_then_updates(b: &dyn Backend) {
    let s = b.dc_store("dc_cas_update").await;
    let r1 = record(&rid("iad.1"), &key("", "room"));
    assert_eq!(s.get(&r1.id).await.unwrap(), None);
    assert_eq!(s.compare_and_set(None, &r1).await.unwrap(), Cas::Written);
    assert_eq!(s.get(&r1.id).await.unwrap(), Some(r1.clone()));
    let r2 = next_version(&r1);
    assert_eq!(s.compare_and_set(Some(1), &r2).await.unwrap(), Cas::Written);
    assert_eq!(s.get(&r1.id).await.unwrap(), Some(r2));
}

/// dc: CAS with a stale version fails, reports the current record and changes nothing.
pub async fn dc_cas_with_stale_version_fails_and_changes_nothing(b: &dyn Backend) {
    let s = b.dc_store("dc_cas_stale").await;
    let r1 = record(&rid("iad.1"), &key("", "room"));
    let r2 = next_version(&r1);
    s.compare_and_set(None, &r1).await.unwrap();
    s.compare_and_set(Some(1), &r2).await.unwrap();
    // A writer still holding version 1.
    let stale = next_version(&r1);
    assert_eq!(
        s.compare_and_set(Some(1), &stale).await.unwrap(),
        Cas::Conflict {
            current: Some(r2.clone())
        }
    );
    assert_eq!(s.get(&r1.id).await.unwrap(), Some(r2));
    // Updating a record that does not exist conflicts with "nothing".
    let ghost = next_version(&record(&rid("iad.9"), &key("", "ghost")));
    assert_eq!(
        s.compare_and_set(Some(1), &ghost).await.unwrap(),
        Cas::Conflict { current: None }
    );
    assert_eq!(s.get(&ghost.id).await.unwrap(), None);
}

/// dc: CAS create fails when the record exists.
pub async fn dc_cas_create_when_exists_fails(b: &dyn Backend) {
    let s = b.dc_store("dc_cas_create_exists").await;
    let r1 = record(&rid("iad.1"), &key("", "room"));
    s.compare_and_set(None, &r1).await.unwrap();
    let mut again = record(&rid("iad.1"), &key("", "room"));
    again.allow_renew = false;
    assert_eq!(
        s.compare_and_set(None, &again).await.unwrap(),
        Cas::Conflict {
            current: Some(r1.clone())
        }
    );
    assert_eq!(s.get(&r1.id).await.unwrap(), Some(r1));
}

/// dc: bad input (a version that does not follow `expected`, a key change) is refused and writes nothing.
pub async fn dc_cas_rejects_caller_bugs(b: &dyn Backend) {
    let s = b.dc_store("dc_cas_bad_input").await;
    let mut r = record(&rid("iad.1"), &key("", "room"));
    r.version = 2;
    assert!(matches!(
        s.compare_and_set(None, &r).await,
        Err(StoreError::InvalidVersion { .. })
    ));
    assert_eq!(s.get(&r.id).await.unwrap(), None);
    r.version = 1;
    s.compare_and_set(None, &r).await.unwrap();
    let mut skip = r.clone();
    skip.version = 3;
    assert!(matches!(
        s.compare_and_set(Some(1), &skip).await,
        Err(StoreError::InvalidVersion { .. })
    ));
    let mut moved = next_version(&r);
    moved.key = key("", "elsewhere");
    assert!(matches!(
        s.compare_and_set(Some(1), &moved).await,
        Err(StoreError::KeyChanged { .. })
    ));
    assert_eq!(s.get(&r.id).await.unwrap(), Some(r));
    assert!(matches!(
        s.scan(&Namespace::default(), "", None, SCAN_LIMIT_MAX + 1)
            .await,
        Err(StoreError::BatchTooLarge { .. })
    ));
}

/// dc: concurrent CAS on one record version has exactly one winner.
pub async fn dc_concurrent_cas_has_exactly_one_winner(b: &dyn Backend) {
    let s = b.dc_store("dc_cas_race").await;
    let r1 = record(&rid("iad.1"), &key("", "room"));
    s.compare_and_set(None, &r1).await.unwrap();
    let tasks: Vec<_> = (0..RACERS)
        .map(|i| {
            let (s, mut next) = (s.clone(), next_version(&r1));
            next.token = FencingToken::new(i as u64 + 2);
            tokio::spawn(async move { s.compare_and_set(Some(1), &next).await.unwrap() })
        })
        .collect();
    let mut written = 0;
    for t in tasks {
        if t.await.unwrap() == Cas::Written {
            written += 1;
        }
    }
    assert_eq!(written, 1);
    assert_eq!(s.get(&r1.id).await.unwrap().map(|r| r.version), Some(2));
}

fn max_length_record() -> DcRecord {
    let dc = DcId::new("d".repeat(DC_ID_BYTES_MAX)).unwrap();
    let id = ReservationId::new(dc.clone(), u64::MAX);
    let k = key(
        &"é".repeat(NAMESPACE_BYTES_MAX / 2),
        &"🔑".repeat(KEY_NAME_BYTES_MAX / 4),
    );
    let mut r = DcRecord::reserve(
        id,
        k,
        Some(Tag::new("t".repeat(TAG_BYTES_MAX)).unwrap()),
        FencingToken::new(u64::MAX - 1),
        Some(ReservationId::new(dc, u64::MAX - 1)),
        ActorId::new("ä".repeat(ACTOR_ID_BYTES_MAX / 2)).unwrap(),
        HostTime::from_ms(u64::MAX / 4),
        StoreTime::from_ms(u64::MAX / 4),
        &LeasePolicy::DEFAULT,
    )
    .0;
    r.version = 1;
    r
}

/// dc: a record with every field at its maximum length round-trips.
pub async fn dc_max_length_record_round_trips(b: &dyn Backend) {
    let s = b.dc_store("dc_large").await;
    let r = max_length_record();
    assert_eq!(s.compare_and_set(None, &r).await.unwrap(), Cas::Written);
    assert_eq!(s.get(&r.id).await.unwrap(), Some(r.clone()));
    let page = s
        .scan(&r.key.namespace, r.key.name.as_str(), None, 10)
        .await
        .unwrap();
    assert_eq!(page, vec![r]);
}

/// dc: scan returns `(key, id)` order, filters by namespace and name prefix, and pages.
pub async fn dc_scan_orders_filters_and_pages(b: &dyn Backend) {
    let s = b.dc_store("dc_scan").await;
    let keys = [
        key("", "x1"),
        key("", "x2"),
        key("", "y"),
        key("a", "x1"),
        key("a", "x/ключ"),
        key("a", "y"),
        key("a/b", "x1"),
        key("ab", "x1"),
    ];
    let mut all = Vec::new();
    for (i, k) in keys.iter().enumerate() {
        for id in [
            format!("iad.{}", 10 + i),
            format!("iad.{}", 9 - i),
            format!("fra.{}", i + 1),
        ] {
            let r = record(&rid(&id), k);
            s.compare_and_set(None, &r).await.unwrap();
            all.push(r);
        }
    }
    all.sort_by(|a, b| (&a.key, &a.id).cmp(&(&b.key, &b.id)));
    let a = Namespace::new("a").unwrap();
    let want: Vec<_> = all
        .iter()
        .filter(|r| r.key.namespace == a && r.key.name.as_str().starts_with('x'))
        .cloned()
        .collect();
    assert_eq!(s.scan(&a, "x", None, SCAN_LIMIT_MAX).await.unwrap(), want);
    let default_x: Vec<_> = all
        .iter()
        .filter(|r| r.key.namespace.as_str().is_empty() && r.key.name.as_str().starts_with('x'))
        .cloned()
        .collect();
    assert_eq!(
        s.scan(&Namespace::default(), "x", None, SCAN_LIMIT_MAX)
            .await
            .unwrap(),
        default_x
    );
    assert!(
        s.scan(&Namespace::new("zz").unwrap(), "", None, 10)
            .await
            .unwrap()
            .is_empty()
    );
    // Paging through everything with a small page reproduces the full order.
    let mut paged = Vec::new();
    let mut cursor: Option<ScanCursor> = None;
    loop {
        let page = s
            .scan(&Namespace::default(), "", cursor.as_ref(), 4)
            .await
            .unwrap();
        assert!(page.len() <= 4);
        let Some(last) = page.last() else { break };
        cursor = Some(ScanCursor::after(last));
        paged.extend(page);
    }
    assert_eq!(paged, all);
    assert!(s.scan(&a, "x", None, 0).await.unwrap().is_empty());
}

/// dc: a page shorter than `limit` is the last one (callers stop there), also
/// when the page holds many bytes.
pub async fn dc_scan_page_is_full_unless_last(b: &dyn Backend) {
    let s = b.dc_store("dc_scan_full").await;
    let total = SCAN_LIMIT_MAX + 1;
    let tasks: Vec<_> = (0..RACERS)
        .map(|t| {
            let s = s.clone();
            tokio::spawn(async move {
                for i in (t..total).step_by(RACERS) {
                    // Long names: a page is tens of KiB, more than one small batch.
                    let name = format!("{i:04}{}", "n".repeat(KEY_NAME_BYTES_MAX - 4));
                    let r = record(&rid(&format!("iad.{}", i + 1)), &key("full", &name));
                    assert_eq!(s.compare_and_set(None, &r).await.unwrap(), Cas::Written);
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    let ns = Namespace::new("full").unwrap();
    let first = s.scan(&ns, "", None, SCAN_LIMIT_MAX).await.unwrap();
    assert_eq!(
        first.len(),
        SCAN_LIMIT_MAX,
        "a full page while more records match"
    );
    let cursor = first.last().map(ScanCursor::after);
    let rest = s
        .scan(&ns, "", cursor.as_ref(), SCAN_LIMIT_MAX)
        .await
        .unwrap();
    assert_eq!(rest.len(), 1);
}

/// dc: concurrent allocations are all distinct and positive.
pub async fn dc_concurrent_allocations_are_unique(b: &dyn Backend) {
    const PER_TASK: usize = 100;
    let s = b.dc_store("dc_alloc").await;
    let tasks: Vec<_> = (0..RACERS)
        .map(|_| {
            let s = s.clone();
            tokio::spawn(async move {
                let mut ids = Vec::with_capacity(PER_TASK);
                for _ in 0..PER_TASK {
                    ids.push(s.allocate().await.unwrap());
                }
                ids
            })
        })
        .collect();
    let mut seen = HashSet::new();
    for t in tasks {
        for id in t.await.unwrap() {
            assert!(id >= 1);
            assert!(seen.insert(id), "unique {id} handed out twice");
        }
    }
    assert_eq!(seen.len(), RACERS * PER_TASK);
}

/// dc: after reopen, records are there and the allocator continues above every id handed out.
pub async fn dc_reopen_keeps_records_and_allocator_continues_above(b: &dyn Backend) {
    if !b.durable() {
        return;
    }
    let place = "dc_reopen";
    let r = record(&rid("iad.1"), &key("", "room"));
    let mut max = 0;
    for round in 0..3 {
        let s = b.dc_store(place).await;
        if round == 0 {
            s.compare_and_set(None, &r).await.unwrap();
        }
        for _ in 0..5 {
            let id = s.allocate().await.unwrap();
            assert!(id > max, "round {round}: {id} not above {max}");
            max = id;
        }
        assert_eq!(s.get(&r.id).await.unwrap(), Some(r.clone()));
        drop(s);
    }
    let g = b.global_store(place).await;
    g.set_if_absent(&r.key, &r.id).await.unwrap();
    drop(g);
    let g = b.global_store(place).await;
    assert_eq!(g.get(&r.key).await.unwrap(), Some(r.id.clone()));
}

/// Runs every case in sequence, printing each name.
pub async fn run_all(b: &dyn Backend) {
    macro_rules! run {
        ($($case:ident),* $(,)?) => {$(
            println!("conformance: {}", stringify!($case));
            $case(b).await;
        )*};
    }
    run!(
        global_write_once,
        global_concurrent_set_if_absent_has_exactly_one_winner,
        global_get_many_keeps_order_and_bounds_the_batch,
        global_unicode_and_long_keys_do_not_collide,
        dc_cas_creates_then_updates,
        dc_cas_with_stale_version_fails_and_changes_nothing,
        dc_cas_create_when_exists_fails,
        dc_cas_rejects_caller_bugs,
        dc_concurrent_cas_has_exactly_one_winner,
        dc_max_length_record_round_trips,
        dc_scan_orders_filters_and_pages,
        dc_scan_page_is_full_unless_last,
        dc_concurrent_allocations_are_unique,
        dc_reopen_keeps_records_and_allocator_continues_above,
    );
}

/// One `#[tokio::test]` per conformance case, each opening its stores through
/// the [`Backend`] that `$backend` evaluates to (evaluated once per test).
#[macro_export]
macro_rules! conformance_tests {
    ($backend:expr) => {
        $crate::conformance_tests!(@cases $backend;
            global_write_once,
            global_concurrent_set_if_absent_has_exactly_one_winner,
            global_get_many_keeps_order_and_bounds_the_batch,
            global_unicode_and_long_keys_do_not_collide,
            dc_cas_creates_then_updates,
            dc_cas_with_stale_version_fails_and_changes_nothing,
            dc_cas_create_when_exists_fails,
            dc_cas_rejects_caller_bugs,
            dc_concurrent_cas_has_exactly_one_winner,
            dc_max_length_record_round_trips,
            dc_scan_orders_filters_and_pages,
            dc_scan_page_is_full_unless_last,
            dc_concurrent_allocations_are_unique,
            dc_reopen_keeps_records_and_allocator_continues_above,
        );
    };
    (@cases $backend:expr; $($case:ident),* $(,)?) => {$(
        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn $case() {
            let backend = $backend;
            $crate::conformance::$case(&backend).await;
        }
    )*};
}

/// The in-memory backend: every place is a fresh store; not durable.
pub struct MemoryBackend;

#[async_trait]
impl Backend for MemoryBackend {
    async fn global_store(&self, _place: &str) -> Arc<dyn GlobalStore> {
        Arc::new(crate::MemoryGlobalStore::new())
    }
    async fn dc_store(&self, _place: &str) -> Arc<dyn DcStore> {
        Arc::new(crate::MemoryDcStore::new())
    }
    fn durable(&self) -> bool {
        false
    }
}

#[cfg(test)]
mod memory_backend {
    crate::conformance_tests!(crate::conformance::MemoryBackend);
}
