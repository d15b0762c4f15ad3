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
use homing_core::event::derive;
use homing_core::key::{KEY_NAME_BYTES_MAX, NAMESPACE_BYTES_MAX, TAG_BYTES_MAX};
use homing_core::{
    ActorId, DcId, DcLeaseState, DcMarks, DcRecord, DcRenewal, DcStanding, DcTerms, DueCursor,
    DueKind, Event, EventKind, EventSeq, FencingToken, HostTime, Key, KeyName, LeaseKey,
    LeasePolicy, Namespace, NamespaceScope, RecordState, ReleaseCause, ReservationId, RunOutcome,
    Shortcut, StoreTime, Succession, SuccessionCause, Tag, TakeOverReply, TakeoverPolicy,
};

use crate::dc::{Cas, DcStore, EVENTS_LIMIT_MAX, EventPage, Import, SCAN_LIMIT_MAX, ScanCursor};
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
    /// A global store at `place` whose next `set_if_absent` is applied but
    /// whose answer is lost on the way back (its transport drops it), so the
    /// store itself must resolve the ambiguous outcome; `None` (the case is
    /// skipped) where a write's answer cannot be lost: a local call (memory,
    /// redb) or a client that resolves it out of our sight (FoundationDB).
    async fn global_store_losing_next_answer(&self, _place: &str) -> Option<AnswerLost> {
        None
    }
}

/// A global store whose next write's answer is lost, from
/// [`Backend::global_store_losing_next_answer`].
pub struct AnswerLost {
    /// The store.
    pub store: Arc<dyn GlobalStore>,
    /// Whether an answer was in fact lost (keeps whatever loses it alive).
    pub lost: Box<dyn Fn() -> bool + Send + Sync>,
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

/// The lease key of the holder of every record these cases make.
pub fn lease() -> LeaseKey {
    LeaseKey::from_bytes([1; 16]).expect("not all zeros")
}

/// A fresh version-1 record of `id` for `key`, held under [`lease`].
pub fn record(id: &ReservationId, key: &Key) -> DcRecord {
    DcRecord::reserve(
        id.clone(),
        key.clone(),
        None,
        FencingToken::FIRST,
        None,
        &homing_core::Holding {
            actor: ActorId::new("10.0.0.1:9000").expect("valid actor"),
            lease: lease(),
            host_time: HostTime::from_ms(0),
        },
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
        s.scan(&NamespaceScope::everything(), "", None, SCAN_LIMIT_MAX + 1)
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

/// dc: racers writing the same record over one version (two re-activations
/// of one released record compute identical records): exactly one lands;
/// the others' conflicts name an equal record and still are not theirs.
pub async fn dc_identical_concurrent_writes_land_once(b: &dyn Backend) {
    let s = b.dc_store("dc_identical_race").await;
    let r1 = record(&rid("iad.1"), &key("", "room"));
    s.compare_and_set(None, &r1).await.unwrap();
    let next = next_version(&r1);
    let tasks: Vec<_> = (0..RACERS)
        .map(|_| {
            let (s, next) = (s.clone(), next.clone());
            tokio::spawn(async move { s.compare_and_set(Some(1), &next).await.unwrap() })
        })
        .collect();
    let mut landed = 0;
    for t in tasks {
        if t.await.unwrap().landed() {
            landed += 1;
        }
    }
    assert_eq!(
        landed, 1,
        "an identical concurrent write counted as one's own"
    );
    assert_eq!(s.get(&r1.id).await.unwrap(), Some(next));
}

/// A version-1 record with every field at its maximum length (the largest
/// record a store holds).
pub fn max_length_record() -> DcRecord {
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
        (Some(ReservationId::new(dc, u64::MAX - 1))).map(|reservation| homing_core::PreviousRun {
            reservation,
            token: homing_core::FencingToken::FIRST,
            ended: homing_core::ReleaseCause::Expired,
        }),
        &homing_core::Holding {
            actor: ActorId::new("ä".repeat(ACTOR_ID_BYTES_MAX / 2)).unwrap(),
            lease: lease(),
            host_time: HostTime::from_ms(u64::MAX / 4),
        },
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
        .scan(
            &NamespaceScope::exact(r.key.namespace.clone()),
            r.key.name.as_str(),
            None,
            10,
        )
        .await
        .unwrap();
    assert_eq!(page, vec![r]);
}

/// dc: scan returns `(key, id)` order, filters by exact namespace and name
/// prefix, and pages; the exact default namespace is only itself.
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
    let a = NamespaceScope::exact(Namespace::new("a").unwrap());
    let want: Vec<_> = all
        .iter()
        .filter(|r| a.contains(&r.key.namespace) && r.key.name.as_str().starts_with('x'))
        .cloned()
        .collect();
    assert_eq!(s.scan(&a, "x", None, SCAN_LIMIT_MAX).await.unwrap(), want);
    let default_x: Vec<_> = all
        .iter()
        .filter(|r| r.key.namespace.as_str().is_empty() && r.key.name.as_str().starts_with('x'))
        .cloned()
        .collect();
    let default_only = NamespaceScope::exact(Namespace::default());
    assert_eq!(
        s.scan(&default_only, "x", None, SCAN_LIMIT_MAX)
            .await
            .unwrap(),
        default_x
    );
    let default_all: Vec<_> = all
        .iter()
        .filter(|r| r.key.namespace.as_str().is_empty())
        .cloned()
        .collect();
    assert_eq!(
        s.scan(&default_only, "", None, SCAN_LIMIT_MAX)
            .await
            .unwrap(),
        default_all
    );
    let zz = NamespaceScope::exact(Namespace::new("zz").unwrap());
    assert!(s.scan(&zz, "", None, 10).await.unwrap().is_empty());
    // Paging through everything with a small page reproduces the full order.
    let mut paged = Vec::new();
    let mut cursor: Option<ScanCursor> = None;
    loop {
        let page = s
            .scan(&NamespaceScope::everything(), "", cursor.as_ref(), 4)
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
    let ns = NamespaceScope::exact(Namespace::new("full").unwrap());
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

/// `r` as its next version in `state`.
fn in_state(r: &DcRecord, state: RecordState) -> DcRecord {
    let mut next = r.clone();
    next.state = state;
    next.version = r.version + 1;
    next
}

fn leased_until(ms: u64) -> RecordState {
    RecordState::Active {
        actor: ActorId::new("10.0.0.1:9000").expect("valid actor"),
        expires_at: StoreTime::from_ms(ms),
        lease: Some(lease()),
        previous: None,
    }
}

fn released_at(ms: u64) -> RecordState {
    RecordState::Released {
        at: StoreTime::from_ms(ms),
        cause: ReleaseCause::Expired,
    }
}

/// Every record of `kind` due by `until`, paging `limit` entries at a time;
/// and the pending count of the last page.
async fn all_due(s: &dyn DcStore, kind: DueKind, until: u64, limit: usize) -> (Vec<String>, u64) {
    let until = StoreTime::from_ms(until);
    let mut ids = Vec::new();
    let mut after: Option<DueCursor> = None;
    loop {
        let page = s.due(kind, until, after.as_ref(), limit).await.unwrap();
        assert!(page.bad.is_empty(), "bad records: {:?}", page.bad);
        assert!(page.records.len() <= limit);
        ids.extend(page.records.iter().map(|r| r.id.to_string()));
        match page.next {
            Some(next) => {
                assert_eq!(page.pending, 0, "pending is counted on the last page only");
                after = Some(next);
            }
            None => return (ids, page.pending),
        }
    }
}

/// dc: the expiry index lists exactly the records due by a time, oldest
/// first, page by page; follows every compare-and-set and import; counts
/// what is not due yet; forgets a settled record until its next write.
pub async fn dc_due_lists_exactly_what_is_due_and_follows_writes(b: &dyn Backend) {
    let place = "dc_due";
    let s = b.dc_store(place).await;
    let mut records = Vec::new();
    // iad.1..iad.5 leased until 500, 400, .., 100 (id order is not time order).
    for (i, until) in [500, 400, 300, 200, 100].into_iter().enumerate() {
        let fresh = record(&rid(&format!("iad.{}", i + 1)), &key("", &format!("k{i}")));
        s.compare_and_set(None, &fresh).await.unwrap();
        let leased = in_state(&fresh, leased_until(until));
        assert_eq!(
            s.compare_and_set(Some(1), &leased).await.unwrap(),
            Cas::Written
        );
        records.push(leased);
    }
    for limit in [1, 2, SCAN_LIMIT_MAX] {
        let (ids, pending) = all_due(&*s, DueKind::Lease, 300, limit).await;
        assert_eq!(ids, ["iad.5", "iad.4", "iad.3"], "limit {limit}");
        assert_eq!(pending, 2, "limit {limit}");
    }
    assert_eq!(all_due(&*s, DueKind::Lease, 99, 8).await, (vec![], 5));
    assert_eq!(
        all_due(&*s, DueKind::Released, u64::MAX, 8).await,
        (vec![], 0)
    );
    // A renewal moves a lease's entry, a release moves it to the sweeper's.
    let renewed = in_state(&records[4], leased_until(1_000));
    s.compare_and_set(Some(2), &renewed).await.unwrap();
    let released = in_state(&records[3], released_at(250));
    s.compare_and_set(Some(2), &released).await.unwrap();
    let early = in_state(&records[2], released_at(150));
    s.compare_and_set(Some(2), &early).await.unwrap();
    assert_eq!(all_due(&*s, DueKind::Lease, 300, 8).await, (vec![], 3));
    let (ids, _) = all_due(&*s, DueKind::Released, 300, 1).await;
    assert_eq!(ids, ["iad.3", "iad.4"]);
    // Linked and abandoned records are never due.
    let linked = in_state(&early, RecordState::Linked { to: rid("fra.1") });
    s.compare_and_set(Some(3), &linked).await.unwrap();
    let abandoned = in_state(&records[0], RecordState::Abandoned);
    s.compare_and_set(Some(2), &abandoned).await.unwrap();
    assert_eq!(
        all_due(&*s, DueKind::Released, u64::MAX, 8).await.0,
        ["iad.4"]
    );
    assert_eq!(
        all_due(&*s, DueKind::Lease, u64::MAX, 8).await.0,
        ["iad.2", "iad.5"]
    );
    // Settling needs the current version, and holds until the next write.
    assert!(!s.settle(&released.id, 2).await.unwrap());
    assert!(
        !s.settle(&rid("iad.2"), 2).await.unwrap(),
        "a lease is not settled"
    );
    assert!(!s.settle(&rid("iad.99"), 1).await.unwrap());
    assert!(s.settle(&released.id, 3).await.unwrap());
    assert!(!s.settle(&released.id, 3).await.unwrap());
    assert_eq!(
        all_due(&*s, DueKind::Released, u64::MAX, 8).await.0,
        Vec::<String>::new()
    );
    let again = in_state(&released, leased_until(50));
    s.compare_and_set(Some(3), &again).await.unwrap();
    assert_eq!(
        all_due(&*s, DueKind::Lease, 300, 8).await,
        (vec!["iad.4".to_string()], 2)
    );
    // An imported record is indexed like a written one.
    let imported = in_state(&record(&rid("iad.9"), &key("", "imp")), leased_until(10));
    assert_eq!(s.import(&imported).await.unwrap(), Import::Written);
    let (ids, _) = all_due(&*s, DueKind::Lease, 300, 8).await;
    assert_eq!(ids, ["iad.9", "iad.4"]);
    assert!(matches!(
        s.due(
            DueKind::Lease,
            StoreTime::from_ms(0),
            None,
            SCAN_LIMIT_MAX + 1
        )
        .await,
        Err(StoreError::BatchTooLarge { .. })
    ));
    if b.durable() {
        drop(s);
        let s = b.dc_store(place).await;
        let (ids, pending) = all_due(&*s, DueKind::Lease, 300, 8).await;
        assert_eq!((ids, pending), (vec!["iad.9".into(), "iad.4".into()], 2));
    }
}

/// Every event of `s` with `seq > after`, paging with full pages.
async fn all_events(s: &dyn DcStore, after: EventSeq) -> Vec<Event> {
    let mut out: Vec<Event> = Vec::new();
    let mut cursor = after;
    loop {
        let page = s.events(cursor, EVENTS_LIMIT_MAX).await.unwrap();
        let full = page.events.len() == EVENTS_LIMIT_MAX;
        if let Some(last) = page.events.last() {
            cursor = last.seq;
        }
        out.extend(page.events);
        if !full {
            return out;
        }
    }
}

/// Writes `next` over `before` by compare-and-set and returns the event the
/// store must have appended for it (seq still 0).
async fn write(s: &dyn DcStore, before: Option<&DcRecord>, next: &DcRecord) -> Option<Event> {
    let expected = before.map(|r| r.version);
    assert_eq!(
        s.compare_and_set(expected, next).await.unwrap(),
        Cas::Written,
        "{} v{}",
        next.id,
        next.version
    );
    derive(before, next)
}

fn numbered(events: Vec<Option<Event>>) -> Vec<Event> {
    events
        .into_iter()
        .flatten()
        .zip(1..)
        .map(|(mut e, seq)| {
            e.seq = seq;
            e
        })
        .collect()
}

/// The reserve → renew → drain → release → re-activate → expire → link
/// history of one record, each step the record after it.
fn lifecycle(id: &ReservationId, key: &Key) -> Vec<DcRecord> {
    const POLICY: LeasePolicy = LeasePolicy::DEFAULT;
    let reserved = record(id, key);
    let renewed = reserved
        .renew(
            FencingToken::FIRST,
            &lease(),
            HostTime::from_ms(1),
            StoreTime::from_ms(1),
            &POLICY,
        )
        .next
        .expect("a live lease renews");
    let drained = renewed.drain().expect("a renewable record drains");
    let released = drained
        .release(
            FencingToken::FIRST,
            &lease(),
            RunOutcome::Ok,
            StoreTime::from_ms(2),
        )
        .next
        .expect("an active record releases");
    let again = released
        .activate(
            None,
            &homing_core::Holding {
                actor: ActorId::new("10.0.0.2:9000").unwrap(),
                lease: homing_core::LeaseKey::from_bytes([2; 16]).unwrap(),
                host_time: HostTime::from_ms(3),
            },
            StoreTime::from_ms(3),
            &POLICY,
        )
        .next
        .expect("a released record re-activates");
    let expired = again
        .expire(StoreTime::from_ms(100_000), &POLICY)
        .expect("a lease long past its grace expires");
    let linked = expired
        .link(
            &expired.key,
            &rid("fra.2"),
            again.token,
            StoreTime::from_ms(100_001),
            &POLICY,
        )
        .next
        .expect("a vacant record links");
    let shortcut = Shortcut {
        to: rid("sin.3"),
        token: again.token.next().next(),
    };
    let noted = linked
        .note_shortcut(&linked.key, &shortcut)
        .expect("a linked first reservation records a shortcut");
    vec![
        reserved, renewed, drained, released, again, expired, linked, noted,
    ]
}

/// events: each change of holder appends exactly one event in the same
/// write, numbered 1, 2, …; renewals and refused writes append none.
pub async fn dc_events_record_every_change_of_holder_and_nothing_else(b: &dyn Backend) {
    let s = b.dc_store("dc_events").await;
    let empty = s.events(0, 10).await.unwrap();
    assert_eq!(
        empty,
        EventPage {
            events: vec![],
            oldest: 1,
            head: 0
        }
    );
    let steps = lifecycle(&rid("iad.1"), &key("ev", "room"));
    let mut derived = Vec::new();
    let mut before = None;
    for step in &steps {
        derived.push(write(s.as_ref(), before, step).await);
        before = Some(step);
    }
    // A stale writer (still at the re-activated version) is refused: no event.
    let stale = steps[4]
        .release(
            steps[4].token,
            &homing_core::LeaseKey::from_bytes([2; 16]).unwrap(),
            RunOutcome::Ok,
            StoreTime::from_ms(4),
        )
        .next
        .unwrap();
    assert!(matches!(
        s.compare_and_set(Some(steps[4].version), &stale)
            .await
            .unwrap(),
        Cas::Conflict { .. }
    ));
    let want = numbered(derived);
    let kinds: Vec<&str> = want.iter().map(|e| e.kind.name()).collect();
    assert_eq!(
        kinds,
        [
            "reserved", "drained", "released", "reserved", "expired", "linked"
        ]
    );
    assert!(matches!(want[5].kind, EventKind::Linked { ref to } if to == &rid("fra.2")));
    assert_eq!(want[3].token, FencingToken::new(2));
    let page = s.events(0, EVENTS_LIMIT_MAX).await.unwrap();
    assert_eq!(page.events, want);
    assert_eq!((page.oldest, page.head), (1, 6));
    // Paging.
    assert_eq!(s.events(0, 2).await.unwrap().events, want[0..2]);
    assert_eq!(s.events(2, 2).await.unwrap().events, want[2..4]);
    assert_eq!(s.events(4, 10).await.unwrap().events, want[4..]);
    let past = s.events(6, 10).await.unwrap();
    assert!(past.events.is_empty());
    assert_eq!((past.oldest, past.head), (1, 6));
    let none = s.events(0, 0).await.unwrap();
    assert!(none.events.is_empty());
    assert_eq!(none.head, 6);
    assert!(matches!(
        s.events(0, EVENTS_LIMIT_MAX + 1).await,
        Err(StoreError::BatchTooLarge { .. })
    ));
    // Trimming moves `oldest`, never the head.
    s.trim_events(3).await.unwrap();
    let trimmed = s.events(0, 10).await.unwrap();
    assert_eq!(trimmed.events, want[2..]);
    assert_eq!((trimmed.oldest, trimmed.head), (3, 6));
    s.trim_events(1).await.unwrap();
    assert_eq!(s.events(0, 10).await.unwrap(), trimmed);
    s.trim_events(7).await.unwrap();
    let gone = s.events(0, 10).await.unwrap();
    assert!(gone.events.is_empty());
    assert_eq!((gone.oldest, gone.head), (7, 6));
    // The next event continues after the head.
    let other = record(&rid("iad.2"), &key("ev", "other"));
    let mut next = write(s.as_ref(), None, &other).await.unwrap();
    next.seq = 7;
    let after = s.events(0, 10).await.unwrap();
    assert_eq!(after.events, vec![next]);
    assert_eq!((after.oldest, after.head), (7, 7));
}

/// Concurrent writers on the event race.
pub const EVENT_WRITERS: usize = 16;

/// events: concurrent writers on different records each get their event
/// exactly once, and the seqs are 1..n without gap or duplicate.
pub async fn dc_concurrent_writes_get_contiguous_event_seqs(b: &dyn Backend) {
    let s = b.dc_store("dc_events_race").await;
    let tasks: Vec<_> = (0..EVENT_WRITERS)
        .map(|i| {
            let s = s.clone();
            tokio::spawn(async move {
                let steps = lifecycle(&rid(&format!("iad.{}", i + 1)), &key("race", "k"));
                let mut derived = Vec::new();
                let mut before = None;
                for step in &steps {
                    derived.extend(write(s.as_ref(), before, step).await);
                    before = Some(step);
                }
                derived
            })
        })
        .collect();
    let mut want = Vec::new();
    for t in tasks {
        want.extend(t.await.unwrap());
    }
    let got = all_events(s.as_ref(), 0).await;
    let seqs: Vec<EventSeq> = got.iter().map(|e| e.seq).collect();
    let contiguous: Vec<EventSeq> = (1..=want.len() as u64).collect();
    assert_eq!(seqs, contiguous, "seqs 1..n, no gap, no duplicate");
    let mut unnumbered: Vec<Event> = got
        .into_iter()
        .map(|mut e| {
            e.seq = 0;
            e
        })
        .collect();
    let order = |e: &Event| (e.reservation.clone(), e.token, e.kind.name());
    unnumbered.sort_by_key(order);
    want.sort_by_key(order);
    assert_eq!(unnumbered, want, "every write's event exactly once");
    // Each record's own events are in its write order.
    let page = s.events(0, EVENTS_LIMIT_MAX).await.unwrap();
    for i in 0..EVENT_WRITERS {
        let id = rid(&format!("iad.{}", i + 1));
        let kinds: Vec<&str> = page
            .events
            .iter()
            .filter(|e| e.reservation == id)
            .map(|e| e.kind.name())
            .collect();
        assert_eq!(
            kinds,
            [
                "reserved", "drained", "released", "reserved", "expired", "linked"
            ]
        );
    }
}

/// events: the log and its head survive reopen, also when trimmed empty.
pub async fn dc_events_survive_reopen(b: &dyn Backend) {
    if !b.durable() {
        return;
    }
    let place = "dc_events_reopen";
    let steps = lifecycle(&rid("iad.1"), &key("", "room"));
    let s = b.dc_store(place).await;
    let first = write(s.as_ref(), None, &steps[0]).await;
    let second = write(s.as_ref(), Some(&steps[0]), &steps[1]).await;
    let third = write(s.as_ref(), Some(&steps[1]), &steps[2]).await;
    let before = s.events(0, 10).await.unwrap();
    assert_eq!(before.events, numbered(vec![first, second, third]));
    drop(s);
    let s = b.dc_store(place).await;
    assert_eq!(s.events(0, 10).await.unwrap(), before);
    s.trim_events(before.head + 1).await.unwrap();
    drop(s);
    let s = b.dc_store(place).await;
    let empty = s.events(0, 10).await.unwrap();
    assert!(empty.events.is_empty());
    assert_eq!(empty.head, before.head, "the head outlives its events");
    let mut next = write(s.as_ref(), Some(&steps[2]), &steps[3]).await.unwrap();
    next.seq = before.head + 1;
    assert_eq!(s.events(0, 10).await.unwrap().events, vec![next]);
}

/// migration mark: unset on a fresh store; set, it reads back (also after
/// a reopen, on a durable backend) and leaves records alone; cleared, it
/// reads back unset; setting or clearing twice is harmless.
pub async fn dc_migration_mark_is_kept_until_cleared(b: &dyn Backend) {
    let place = "dc_migration_mark";
    let s = b.dc_store(place).await;
    assert!(!s.migrating().await.unwrap(), "a fresh store is not marked");
    let r = record(&rid("iad.1"), &key("", "room"));
    assert_eq!(s.compare_and_set(None, &r).await.unwrap(), Cas::Written);
    s.set_migrating(true).await.unwrap();
    s.set_migrating(true).await.unwrap();
    assert!(s.migrating().await.unwrap());
    let s = if b.durable() {
        drop(s);
        let s = b.dc_store(place).await;
        assert!(s.migrating().await.unwrap(), "the mark survives a reopen");
        s
    } else {
        s
    };
    assert_eq!(s.get(&r.id).await.unwrap(), Some(r));
    s.set_migrating(false).await.unwrap();
    assert!(!s.migrating().await.unwrap());
    s.set_migrating(false).await.unwrap();
    assert!(!s.migrating().await.unwrap());
}

/// keys created: a namespace counts this DC's first reservations there —
/// not a recreate (it has a predecessor), not an abandoned race loser, not a
/// namespace under it — across scan pages, up to the bound asked for.
pub async fn dc_keys_created_counts_first_reservations_per_namespace(b: &dyn Backend) {
    let s = b.dc_store("dc_keys_created").await;
    let ns = |name: &str| Namespace::new(name).expect("valid namespace");
    let mut unique = 0;
    let mut create = |ns: &str, name: &str| {
        unique += 1;
        record(&rid(&format!("iad.{unique}")), &key(ns, name))
    };
    for name in ["a", "b", "c"] {
        let r = create("games", name);
        assert_eq!(s.compare_and_set(None, &r).await.unwrap(), Cas::Written);
    }
    let mut recreated = create("games", "moved-here");
    recreated.predecessor = Some(rid("fra.1"));
    recreated.token = FencingToken::FIRST.next();
    assert_eq!(
        s.compare_and_set(None, &recreated).await.unwrap(),
        Cas::Written
    );
    let lost = create("games", "lost-race");
    assert_eq!(s.compare_and_set(None, &lost).await.unwrap(), Cas::Written);
    let abandoned = lost.abandon().expect("a fresh record can be abandoned");
    assert_eq!(
        s.compare_and_set(Some(lost.version), &abandoned)
            .await
            .unwrap(),
        Cas::Written
    );
    let child = create("games/eu", "d");
    assert_eq!(s.compare_and_set(None, &child).await.unwrap(), Cas::Written);
    let pages = SCAN_LIMIT_MAX + 2;
    for i in 0..pages {
        let r = create("many", &format!("k{i:04}"));
        assert_eq!(s.compare_and_set(None, &r).await.unwrap(), Cas::Written);
    }
    assert_eq!(s.keys_created(&ns("games"), 1_000).await.unwrap(), 3);
    assert_eq!(s.keys_created(&ns("games"), 2).await.unwrap(), 2);
    assert_eq!(s.keys_created(&ns("games/eu"), 1_000).await.unwrap(), 1);
    assert_eq!(s.keys_created(&ns(""), 1_000).await.unwrap(), 0);
    assert_eq!(s.keys_created(&ns("chat"), 1_000).await.unwrap(), 0);
    let many = ns("many");
    assert_eq!(s.keys_created(&many, 1_000).await.unwrap(), pages as u64);
    assert_eq!(
        s.keys_created(&many, pages as u64 - 1).await.unwrap(),
        pages as u64 - 1
    );
    assert_eq!(s.keys_created(&many, 0).await.unwrap(), 0);
}

/// scan: an exact scope is one namespace, a subtree is it and every
/// namespace under it (not `g/eu-west`, not `g/eu!`), in `(key, id)` order,
/// paged across the boundary between the two; a subtree takes no name prefix.
pub async fn dc_scan_scopes_cover_exactly_their_namespaces(b: &dyn Backend) {
    let s = b.dc_store("dc_scan_scopes").await;
    let namespaces = ["g", "g/eu", "g/eu/x", "g/eu-west", "g/eu!", "h", ""];
    let mut all = Vec::new();
    let mut unique = 0;
    for ns in namespaces {
        for name in ["b", "a"] {
            for dc in ["iad", "fra"] {
                unique += 1;
                let r = record(&rid(&format!("{dc}.{unique}")), &key(ns, name));
                s.compare_and_set(None, &r).await.unwrap();
                all.push(r);
            }
        }
    }
    all.sort_by(|a, b| (&a.key, &a.id).cmp(&(&b.key, &b.id)));
    let scope = |ns: &str, children: bool| {
        let ns = Namespace::new(ns).unwrap();
        if children {
            NamespaceScope::subtree(ns)
        } else {
            NamespaceScope::exact(ns)
        }
    };
    let in_scope = |sc: &NamespaceScope| -> Vec<DcRecord> {
        all.iter()
            .filter(|r| sc.contains(&r.key.namespace))
            .cloned()
            .collect()
    };
    let cases = [
        (scope("g/eu", false), &["g/eu"][..]),
        (scope("g/eu", true), &["g/eu", "g/eu/x"][..]),
        (scope("g", false), &["g"][..]),
        (
            scope("g", true),
            &["g", "g/eu", "g/eu!", "g/eu-west", "g/eu/x"][..],
        ),
        (scope("", false), &[""][..]),
        (scope("g/eu/x", true), &["g/eu/x"][..]),
        (scope("g/e", true), &[][..]),
        (NamespaceScope::everything(), &namespaces[..]),
    ];
    for (sc, namespaces) in &cases {
        let want = in_scope(sc);
        let mut seen: Vec<&str> = want.iter().map(|r| r.key.namespace.as_str()).collect();
        seen.dedup();
        let mut expected: Vec<&str> = namespaces.to_vec();
        expected.sort();
        seen.sort();
        assert_eq!(seen, expected, "{sc}: the test's own model");
        let got = s.scan(sc, "", None, SCAN_LIMIT_MAX).await.unwrap();
        assert_eq!(got, want, "{sc}");
        for limit in [1, 2, 3, 5] {
            let mut paged = Vec::new();
            let mut cursor: Option<ScanCursor> = None;
            loop {
                let page = s.scan(sc, "", cursor.as_ref(), limit).await.unwrap();
                assert!(page.len() <= limit);
                let last_page = page.len() < limit;
                cursor = page.last().map(ScanCursor::after);
                paged.extend(page);
                if last_page {
                    break;
                }
            }
            assert_eq!(paged, want, "{sc} in pages of {limit}");
        }
    }
    let exact_a: Vec<_> = in_scope(&scope("g/eu", false))
        .into_iter()
        .filter(|r| r.key.name.as_str() == "a")
        .collect();
    assert_eq!(
        s.scan(&scope("g/eu", false), "a", None, 10).await.unwrap(),
        exact_a
    );
    for sc in [scope("g/eu", true), NamespaceScope::everything()] {
        assert!(
            matches!(
                s.scan(&sc, "a", None, 10).await,
                Err(StoreError::InvalidScan { .. })
            ),
            "{sc} with a name prefix"
        );
    }
}

/// import: an absent or older record is written as given (version
/// included, no event); an equal one is present; anything else conflicts.
/// Events import at their own seq and lift the head.
pub async fn dc_import_copies_records_and_events_without_overwriting(b: &dyn Backend) {
    let s = b.dc_store("dc_import").await;
    let mut r5 = record(&rid("iad.7"), &key("imp", "a"));
    r5.version = 5;
    assert_eq!(s.import(&r5).await.unwrap(), Import::Written);
    assert_eq!(s.get(&r5.id).await.unwrap(), Some(r5.clone()));
    let imp = NamespaceScope::exact(Namespace::new("imp").unwrap());
    assert_eq!(s.scan(&imp, "", None, 10).await.unwrap(), vec![r5.clone()]);
    assert_eq!(
        s.events(0, 10).await.unwrap().head,
        0,
        "an import appends no event"
    );
    assert_eq!(s.import(&r5).await.unwrap(), Import::Present);
    let r6 = next_version(&r5);
    assert_eq!(s.import(&r6).await.unwrap(), Import::Written);
    assert_eq!(s.get(&r5.id).await.unwrap(), Some(r6.clone()));
    let conflict = Import::Conflict {
        current: r6.clone(),
    };
    assert_eq!(s.import(&r5).await.unwrap(), conflict, "older than stored");
    let mut other6 = r6.clone();
    other6.token = FencingToken::new(9);
    assert_eq!(
        s.import(&other6).await.unwrap(),
        conflict,
        "same version, other contents"
    );
    let mut moved = next_version(&r6);
    moved.key = key("imp", "elsewhere");
    assert_eq!(s.import(&moved).await.unwrap(), conflict, "another key");
    assert_eq!(s.get(&r5.id).await.unwrap(), Some(r6.clone()));
    assert_eq!(s.scan(&imp, "", None, 10).await.unwrap(), vec![r6.clone()]);
    // Compare-and-set carries on from the imported version.
    let r7 = next_version(&r6);
    assert_eq!(s.compare_and_set(Some(6), &r7).await.unwrap(), Cas::Written);
    assert_eq!(s.get(&r7.id).await.unwrap(), Some(r7));

    let mut event = derive(None, &record(&rid("iad.8"), &key("imp", "b"))).unwrap();
    event.seq = 10;
    assert_eq!(s.import_event(&event).await.unwrap(), Import::Written);
    let page = s.events(0, 10).await.unwrap();
    assert_eq!(page.events, vec![event.clone()]);
    assert!(page.head >= 10);
    assert_eq!(s.import_event(&event).await.unwrap(), Import::Present);
    let mut other = event.clone();
    other.token = FencingToken::new(3);
    assert_eq!(
        s.import_event(&other).await.unwrap(),
        Import::Conflict {
            current: event.clone()
        }
    );
    let mut lower = event.clone();
    lower.seq = 4;
    assert_eq!(s.import_event(&lower).await.unwrap(), Import::Written);
    let page = s.events(0, 10).await.unwrap();
    assert_eq!(page.events, vec![lower, event]);
    assert_eq!((page.oldest, page.head), (4, 10));
    // A written change continues after the imported head.
    let fresh = record(&rid("iad.9"), &key("imp", "c"));
    write(s.as_ref(), None, &fresh).await;
    let page = s.events(10, 10).await.unwrap();
    assert_eq!(page.events.len(), 1);
    assert_eq!((page.events[0].seq, page.head), (11, 11));
}

/// allocator: the floor bounds every unique handed out; after a raise every
/// allocation is above it, also after reopen.
pub async fn dc_allocator_floor_bounds_uniques_and_raise_skips_past(b: &dyn Backend) {
    let place = "dc_alloc_floor";
    let s = b.dc_store(place).await;
    let mut max = 0;
    for _ in 0..5 {
        max = max.max(s.allocate().await.unwrap());
    }
    assert!(s.allocator_floor().await.unwrap() >= max);
    s.raise_allocator(5_000).await.unwrap();
    assert!(s.allocator_floor().await.unwrap() >= 5_000);
    let first = s.allocate().await.unwrap();
    assert!(first > 5_000, "{first} not above the raised floor");
    // A lower floor changes nothing.
    s.raise_allocator(10).await.unwrap();
    let second = s.allocate().await.unwrap();
    assert!(second > 5_000 && second != first);
    assert!(s.allocator_floor().await.unwrap() >= second);
    if !b.durable() {
        return;
    }
    drop(s);
    let s = b.dc_store(place).await;
    let after = s.allocate().await.unwrap();
    assert!(after > second, "reopen: {after} not above {second}");
    // A raise is durable before anything is allocated above it.
    s.raise_allocator(1_000_000).await.unwrap();
    drop(s);
    let s = b.dc_store(place).await;
    assert!(s.allocator_floor().await.unwrap() >= 1_000_000);
    let raised = s.allocate().await.unwrap();
    assert!(raised > 1_000_000, "reopen after a raise: {raised}");
}

fn dc(name: &str) -> DcId {
    DcId::new(name).expect("valid dc id")
}

fn marks(allocator_floor: u64, token_bound: u64) -> DcMarks {
    DcMarks {
        allocator_floor,
        token_bound,
        // Follows the allocator here, so the cases check it round-trips too.
        event_head: allocator_floor / 2,
    }
}

/// Terms whose lease lapses after 1 s and expires 1 s later (etcd rounds
/// its leases up to whole seconds and may raise a short one to its minimum).
const SHORT_TERMS: DcTerms = DcTerms {
    ttl_ms: 1_000,
    host_lease_ttl_max_ms: 1_000,
    grace_ms: 0,
};

/// Terms that outlive any test.
const LONG_TERMS: DcTerms = DcTerms {
    ttl_ms: 600_000,
    host_lease_ttl_max_ms: 10_000,
    grace_ms: 2_000,
};

/// Polls `dc`'s standing until `wanted` says yes, for at most 30 s.
async fn standing_becomes(
    g: &dyn GlobalStore,
    dc: &DcId,
    what: &str,
    wanted: impl Fn(&DcStanding) -> bool,
) -> DcLeaseState {
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let state = g.dc_lease(dc).await.unwrap();
        if wanted(&state.standing) {
            return state;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{dc} not {what} after 30 s: {state:?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

/// dc lease: unknown until renewed; a renewal is live and publishes its
/// marks, which never go down; every DC is listed in id order.
pub async fn global_dc_lease_renews_and_keeps_the_highest_marks(b: &dyn Backend) {
    let place = "global_dc_lease_marks";
    let g = b.global_store(place).await;
    let (iad, fra) = (dc("iad"), dc("fra"));
    let unknown = g.dc_lease(&iad).await.unwrap();
    assert_eq!(unknown, DcLeaseState::unknown(iad.clone()));
    let renewed = g.renew_dc_lease(&iad, &LONG_TERMS, &marks(1024, 7)).await;
    assert_eq!(renewed.unwrap(), DcRenewal::Renewed(marks(1024, 7)));
    let state = g.dc_lease(&iad).await.unwrap();
    assert!(
        matches!(state.standing, DcStanding::Live { remaining_ms } if remaining_ms <= LONG_TERMS.ttl_ms && remaining_ms > LONG_TERMS.ttl_ms / 2),
        "{state:?}"
    );
    assert_eq!(
        (state.terms, state.marks, state.retired),
        (Some(LONG_TERMS), marks(1024, 7), false)
    );
    // Lower marks change nothing; each mark keeps its own maximum.
    let renewed = g.renew_dc_lease(&iad, &LONG_TERMS, &marks(10, 9)).await;
    assert_eq!(renewed.unwrap(), DcRenewal::Renewed(marks(1024, 9)));
    g.renew_dc_lease(&fra, &LONG_TERMS, &marks(1, 1))
        .await
        .unwrap();
    let all = g.dc_leases().await.unwrap();
    let names: Vec<&str> = all.iter().map(|s| s.dc.as_str()).collect();
    assert_eq!(names, ["fra", "iad"]);
    assert_eq!(all[1].marks, marks(1024, 9));
    if !b.durable() {
        return;
    }
    drop(g);
    let g = b.global_store(place).await;
    let state = g.dc_lease(&iad).await.unwrap();
    assert_eq!(state.marks, marks(1024, 9), "marks lost on reopen");
    assert!(
        !matches!(state.standing, DcStanding::Expired),
        "a reopened store must not call a lease expired early: {state:?}"
    );
}

/// dc lease: without renewals it lapses after its ttl and expires after
/// the longest host lease and grace more, by the store's clock; a renewal
/// makes it live again.
pub async fn global_dc_lease_lapses_then_expires_without_renewals(b: &dyn Backend) {
    let g = b.global_store("global_dc_lease_expiry").await;
    let iad = dc("iad");
    g.renew_dc_lease(&iad, &SHORT_TERMS, &marks(1, 1))
        .await
        .unwrap();
    let state = g.dc_lease(&iad).await.unwrap();
    assert!(
        matches!(
            state.standing,
            DcStanding::Live { .. } | DcStanding::Lapsed { .. }
        ),
        "{state:?}"
    );
    standing_becomes(g.as_ref(), &iad, "lapsed or expired", |s| {
        matches!(s, DcStanding::Lapsed { .. } | DcStanding::Expired)
    })
    .await;
    let expired =
        standing_becomes(g.as_ref(), &iad, "expired", |s| *s == DcStanding::Expired).await;
    assert_eq!(expired.marks, marks(1, 1), "expiry keeps the marks");
    g.renew_dc_lease(&iad, &LONG_TERMS, &marks(1, 1))
        .await
        .unwrap();
    let state = g.dc_lease(&iad).await.unwrap();
    assert!(
        matches!(state.standing, DcStanding::Live { .. }),
        "{state:?}"
    );
}

/// dc lease: a retired DC's renewals are refused from then on, also after
/// reopen; retiring keeps its marks and is idempotent.
pub async fn global_dc_retired_is_refused_for_good(b: &dyn Backend) {
    let place = "global_dc_retire";
    let g = b.global_store(place).await;
    let iad = dc("iad");
    g.renew_dc_lease(&iad, &LONG_TERMS, &marks(2048, 3))
        .await
        .unwrap();
    let retired = g.retire_dc(&iad).await.unwrap();
    assert!(retired.retired);
    assert_eq!(retired.marks, marks(2048, 3));
    assert_eq!(g.retire_dc(&iad).await.unwrap().marks, marks(2048, 3));
    let renewal = g.renew_dc_lease(&iad, &LONG_TERMS, &marks(4096, 3)).await;
    assert_eq!(renewal.unwrap(), DcRenewal::Retired);
    assert_eq!(g.dc_lease(&iad).await.unwrap().marks, marks(2048, 3));
    // A DC never heard of can be retired too (its id is then never served).
    assert!(g.retire_dc(&dc("never")).await.unwrap().retired);
    if !b.durable() {
        return;
    }
    drop(g);
    let g = b.global_store(place).await;
    let renewal = g.renew_dc_lease(&iad, &LONG_TERMS, &marks(4096, 3)).await;
    assert_eq!(
        renewal.unwrap(),
        DcRenewal::Retired,
        "retirement lost on reopen"
    );
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

/// A move of `from` to `to`.
fn moved(from: &ReservationId, to: &ReservationId) -> Succession {
    Succession::moved(from.clone(), to.clone(), FencingToken::new(5))
}

/// A takeover of `from` by `to`.
fn taken(from: &ReservationId, to: &ReservationId) -> Succession {
    Succession::taken_over(from.clone(), to.clone(), 41)
}

/// Asserts that a takeover was refused with `dc`'s state, standing as `wanted` says.
fn assert_refused(
    reply: TakeOverReply,
    dc: &DcId,
    what: &str,
    wanted: impl Fn(&DcLeaseState) -> bool,
) -> DcLeaseState {
    match reply {
        TakeOverReply::Refused(state) if &state.dc == dc && wanted(&state) => state,
        other => panic!("takeover of a reservation of {dc} ({what}): {other:?}"),
    }
}

/// Renews every DC of `dcs` under [`SHORT_TERMS`] and waits until the
/// store calls each one expired.
async fn expire(g: &dyn GlobalStore, dcs: &[DcId]) {
    for dc in dcs {
        g.renew_dc_lease(dc, &SHORT_TERMS, &marks(1, 41))
            .await
            .unwrap();
    }
    for dc in dcs {
        standing_becomes(g, dc, "expired", |s| *s == DcStanding::Expired).await;
    }
}

/// successions: a set_successor that landed but whose answer was lost is
/// retried by the store, which reads the caller's own succession back and
/// answers that it wrote it (it did, once); a later mover finds it.
pub async fn global_set_successor_whose_answer_was_lost_is_written_once(b: &dyn Backend) {
    let Some(lossy) = b
        .global_store_losing_next_answer("global_successor_lost_answer")
        .await
    else {
        println!("  skipped: this backend's writes cannot lose their answer");
        return;
    };
    let g = lossy.store;
    let first = moved(&rid("iad.7"), &rid("fra.7"));
    assert_eq!(g.set_successor(&first).await.unwrap(), None);
    assert!((lossy.lost)(), "the answer to the write was not lost");
    let later = moved(&rid("iad.7"), &rid("sea.7"));
    assert_eq!(g.set_successor(&later).await.unwrap(), Some(first.clone()));
    assert_eq!(g.successor(&rid("iad.7")).await.unwrap(), Some(first));
    if let Some(failover) = g.failover() {
        let resolved = failover.total(crate::FailoverEvent::AmbiguousResolved);
        assert_eq!(resolved, 1, "the store counts the outcome it resolved");
    }
}

/// successions: the first set_successor of a reservation wins for good: a
/// retry answers it, a different one and a takeover find it, successor
/// reads it (also after reopen); a move written as a takeover, a takeover
/// written as a move and a reservation succeeding itself are refused and
/// write nothing.
pub async fn global_successor_is_write_once_and_checks_its_cause(b: &dyn Backend) {
    let place = "global_successor_write_once";
    let g = b.global_store(place).await;
    let (from, to) = (rid("iad.1"), rid("fra.1"));
    let first = moved(&from, &to);
    assert_eq!(g.successor(&from).await.unwrap(), None);
    assert_eq!(g.set_successor(&first).await.unwrap(), None);
    assert_eq!(
        g.set_successor(&first).await.unwrap(),
        Some(first.clone()),
        "a retry answers the succession it wrote"
    );
    let second = moved(&from, &rid("sea.1"));
    assert_eq!(g.set_successor(&second).await.unwrap(), Some(first.clone()));
    assert_eq!(g.successor(&from).await.unwrap(), Some(first.clone()));
    // Whatever the DC's lease: the succession exists.
    let takeover = g
        .take_over(&taken(&from, &rid("ord.1")), TakeoverPolicy::Automatic)
        .await
        .unwrap();
    assert_eq!(takeover, TakeOverReply::Exists(first.clone()));
    // Neighbours in byte order are other reservations.
    for other in ["iad.0", "iad.2", "iad.256", "iad-2.1", "ia.1"] {
        assert_eq!(g.successor(&rid(other)).await.unwrap(), None, "{other}");
    }
    let blank = rid("iad.2");
    let bad = [
        g.take_over(&moved(&blank, &to), TakeoverPolicy::Automatic)
            .await
            .map(|_| ()),
        g.set_successor(&taken(&blank, &to)).await.map(|_| ()),
        g.set_successor(&moved(&blank, &blank)).await.map(|_| ()),
        g.take_over(&taken(&blank, &blank), TakeoverPolicy::Automatic)
            .await
            .map(|_| ()),
    ];
    for (i, outcome) in bad.into_iter().enumerate() {
        assert!(
            matches!(outcome, Err(StoreError::InvalidArgument(_))),
            "bad call {i}: {outcome:?}"
        );
    }
    assert_eq!(
        g.successor(&blank).await.unwrap(),
        None,
        "a refused call wrote"
    );
    if !b.durable() {
        return;
    }
    drop(g);
    let g = b.global_store(place).await;
    assert_eq!(
        g.successor(&from).await.unwrap(),
        Some(first),
        "succession lost on reopen"
    );
}

/// successions: a takeover is refused while the store does not call the
/// DC's lease expired — never renewed (even retired), live, lapsed — with
/// the DC's state; once expired it is taken, and a second taker finds it.
/// `RetiredOnly` refuses an expired DC that is not retired and takes a
/// retired one.
pub async fn global_take_over_waits_for_the_dc_lease_to_expire(b: &dyn Backend) {
    let g = b.global_store("global_take_over_expiry").await;
    let automatic = TakeoverPolicy::Automatic;
    let retired_only = TakeoverPolicy::RetiredOnly;
    let (iad, ord, sea, lax, never) = (dc("iad"), dc("ord"), dc("sea"), dc("lax"), dc("never"));
    let unknown = |s: &DcLeaseState| s.standing == DcStanding::Unknown;
    let reply = g
        .take_over(&taken(&rid("iad.1"), &rid("fra.1")), automatic)
        .await
        .unwrap();
    assert_refused(reply, &iad, "unknown", unknown);
    g.retire_dc(&never).await.unwrap();
    for policy in [automatic, retired_only] {
        let reply = g
            .take_over(&taken(&rid("never.1"), &rid("fra.1")), policy)
            .await
            .unwrap();
        let state = assert_refused(reply, &never, "unknown, retired", unknown);
        assert!(state.retired);
    }
    // Lapsed for a minute after its ttl of 1 s.
    let lapsing = DcTerms {
        ttl_ms: 1_000,
        host_lease_ttl_max_ms: 60_000,
        grace_ms: 0,
    };
    g.renew_dc_lease(&lax, &lapsing, &marks(1, 41))
        .await
        .unwrap();
    for dc in [&iad, &ord, &sea] {
        g.renew_dc_lease(dc, &SHORT_TERMS, &marks(1, 41))
            .await
            .unwrap();
    }
    g.retire_dc(&sea).await.unwrap();
    let den = dc("den");
    g.renew_dc_lease(&den, &LONG_TERMS, &marks(1, 41))
        .await
        .unwrap();
    let reply = g
        .take_over(&taken(&rid("den.1"), &rid("fra.1")), automatic)
        .await
        .unwrap();
    let state = assert_refused(reply, &den, "live", |s| {
        matches!(s.standing, DcStanding::Live { .. })
    });
    assert_eq!((state.terms, state.marks), (Some(LONG_TERMS), marks(1, 41)));
    standing_becomes(g.as_ref(), &lax, "lapsed", |s| {
        matches!(s, DcStanding::Lapsed { .. })
    })
    .await;
    let reply = g
        .take_over(&taken(&rid("lax.1"), &rid("fra.1")), automatic)
        .await
        .unwrap();
    let state = assert_refused(reply, &lax, "lapsed", |s| {
        matches!(s.standing, DcStanding::Lapsed { .. })
    });
    assert_eq!(state.terms, Some(lapsing));
    assert_eq!(g.successor(&rid("lax.1")).await.unwrap(), None);

    for dc in [&iad, &ord, &sea] {
        standing_becomes(g.as_ref(), dc, "expired", |s| *s == DcStanding::Expired).await;
    }
    // A taker that read a lower token bound than the store keeps (the DC
    // published a higher one since) is refused: its token would not be
    // above every token the DC granted.
    let stale = Succession::taken_over(rid("iad.1"), rid("fra.1"), 40);
    let reply = g.take_over(&stale, automatic).await.unwrap();
    assert_refused(reply, &iad, "expired, bound 41 above the taker's", |s| {
        s.standing == DcStanding::Expired && s.marks.token_bound == 41
    });
    let first = taken(&rid("iad.1"), &rid("fra.1"));
    assert_eq!(
        g.take_over(&first, automatic).await.unwrap(),
        TakeOverReply::Taken
    );
    assert_eq!(
        g.successor(&rid("iad.1")).await.unwrap(),
        Some(first.clone())
    );
    let second = taken(&rid("iad.1"), &rid("sea.9"));
    assert_eq!(
        g.take_over(&second, automatic).await.unwrap(),
        TakeOverReply::Exists(first.clone())
    );
    assert_eq!(
        g.set_successor(&moved(&rid("iad.1"), &rid("lhr.1")))
            .await
            .unwrap(),
        Some(first)
    );

    let reply = g
        .take_over(&taken(&rid("ord.1"), &rid("fra.2")), retired_only)
        .await
        .unwrap();
    assert_refused(reply, &ord, "expired, not retired", |s| {
        s.standing == DcStanding::Expired && !s.retired
    });
    assert_eq!(g.successor(&rid("ord.1")).await.unwrap(), None);
    let retired = taken(&rid("sea.1"), &rid("fra.3"));
    assert_eq!(
        g.take_over(&retired, retired_only).await.unwrap(),
        TakeOverReply::Taken
    );
    assert_eq!(g.successor(&rid("sea.1")).await.unwrap(), Some(retired));
}

/// successions: takeovers racing the expired DC's renewal are either
/// refused or listed by `successions_of` read after the renewal's answer
/// (what a returning DC reconciles before it grants): the store judges the
/// lease and writes the takeover in one transaction, so no renewal lands
/// between. After the renewal, a takeover of another reservation of the
/// DC is refused again, and the earlier takeover is still listed.
pub async fn global_takeovers_racing_a_renewal_are_refused_or_reconciled(b: &dyn Backend) {
    const RACING_DCS: usize = 8;
    const TAKERS_PER_DC: u64 = 4;
    let g = b.global_store("global_takeover_vs_renewal").await;
    let dcs: Vec<DcId> = (0..RACING_DCS).map(|i| dc(&format!("dc{i}"))).collect();
    expire(g.as_ref(), &dcs).await;
    let before = taken(&ReservationId::new(dcs[0].clone(), 100), &rid("fra.100"));
    assert_eq!(
        g.take_over(&before, TakeoverPolicy::Automatic)
            .await
            .unwrap(),
        TakeOverReply::Taken
    );
    // Per DC, the renewal starts among its takers. It renews under the
    // same terms and marks, so a store whose entry does not change (redb)
    // has nothing to write: the renewal is as quick as it gets.
    let mut takers = Vec::new();
    let mut renewers = Vec::new();
    for (i, d) in dcs.iter().enumerate() {
        for unique in 1..=TAKERS_PER_DC {
            let from = ReservationId::new(d.clone(), unique);
            let to = ReservationId::new(dc("fra"), i as u64 * 100 + unique);
            let (taker, s) = (g.clone(), taken(&from, &to));
            takers.push(tokio::spawn(async move {
                let reply = taker.take_over(&s, TakeoverPolicy::Automatic).await;
                (s, reply.unwrap(), tokio::time::Instant::now())
            }));
            if unique == TAKERS_PER_DC / 2 {
                let (g, d) = (g.clone(), d.clone());
                renewers.push(tokio::spawn(async move {
                    let sent = tokio::time::Instant::now();
                    let renewal = g.renew_dc_lease(&d, &SHORT_TERMS, &marks(1, 41)).await;
                    assert!(matches!(renewal.unwrap(), DcRenewal::Renewed(_)));
                    let seen = g.successions_of(&d, None, GET_MANY_KEYS_MAX).await;
                    (d, (seen.unwrap(), sent))
                }));
            }
        }
    }
    let mut reconciled = std::collections::HashMap::new();
    for renewer in renewers {
        let (d, seen) = renewer.await.unwrap();
        reconciled.insert(d, seen);
    }
    // The short lease renewed in the race expires again after this much:
    // a takeover answered later may legitimately be taken unseen.
    let expires_again = std::time::Duration::from_millis(SHORT_TERMS.expires_after_ms());
    let (mut won, mut refused) = (0, 0);
    for taker in takers {
        let (s, reply, answered) = taker.await.unwrap();
        match reply {
            TakeOverReply::Taken => {
                won += 1;
                let (seen, sent) = &reconciled[s.link.from.dc()];
                assert!(
                    seen.contains(&s) || answered >= *sent + expires_again,
                    "{} was taken over after its DC renewed, unseen by its reconcile: {seen:?}",
                    s.link.from
                );
            }
            TakeOverReply::Refused(state) => {
                refused += 1;
                assert!(
                    matches!(
                        state.standing,
                        DcStanding::Live { .. } | DcStanding::Lapsed { .. }
                    ),
                    "{state:?}"
                );
            }
            TakeOverReply::Exists(other) => panic!("nothing else succeeded it: {other:?}"),
        }
    }
    println!("  takeovers racing renewals: {won} taken, {refused} refused");
    assert!(reconciled[&dcs[0]].0.contains(&before));
    g.renew_dc_lease(&dcs[0], &LONG_TERMS, &marks(1, 41))
        .await
        .unwrap();
    let after = taken(&ReservationId::new(dcs[0].clone(), 200), &rid("fra.200"));
    let reply = g
        .take_over(&after, TakeoverPolicy::Automatic)
        .await
        .unwrap();
    assert_refused(reply, &dcs[0], "renewed", |s| {
        matches!(s.standing, DcStanding::Live { .. })
    });
    let listed = g.successions_of(&dcs[0], None, GET_MANY_KEYS_MAX);
    assert!(listed.await.unwrap().contains(&before));
}

/// successions: concurrent takeovers and moves of one reservation of an
/// expired DC have exactly one winner, and every other caller finds it.
pub async fn global_concurrent_successions_have_exactly_one_winner(b: &dyn Backend) {
    let g = b.global_store("global_succession_race").await;
    let iad = dc("iad");
    expire(g.as_ref(), std::slice::from_ref(&iad)).await;
    let from = rid("iad.7");
    let tasks: Vec<_> = (0..RACERS)
        .map(|i| {
            let g = g.clone();
            let to = ReservationId::new(dc(&format!("dc{i}")), 1);
            let s = if i % 2 == 0 {
                taken(&from, &to)
            } else {
                moved(&from, &to)
            };
            tokio::spawn(async move {
                let existing = match s.cause {
                    SuccessionCause::TakenOver => {
                        match g.take_over(&s, TakeoverPolicy::Automatic).await.unwrap() {
                            TakeOverReply::Taken => None,
                            TakeOverReply::Exists(existing) => Some(existing),
                            TakeOverReply::Refused(state) => panic!("refused: {state:?}"),
                        }
                    }
                    SuccessionCause::Moved => g.set_successor(&s).await.unwrap(),
                };
                (s, existing)
            })
        })
        .collect();
    let mut winners = Vec::new();
    let mut seen = Vec::new();
    for t in tasks {
        match t.await.unwrap() {
            (s, None) => winners.push(s),
            (_, Some(existing)) => seen.push(existing),
        }
    }
    assert_eq!(winners.len(), 1, "winners: {winners:?}");
    assert!(seen.iter().all(|s| s == &winners[0]), "{seen:?}");
    assert_eq!(
        g.successor(&from).await.unwrap().as_ref(),
        Some(&winners[0])
    );
}

/// successions: `successions_of` lists one DC's successions in unique
/// order (not text order, and no other DC's, however its id starts),
/// paged by `after` cursors (a cursor needs not be a succession); a limit
/// above [`GET_MANY_KEYS_MAX`] and a cursor of another DC are refused.
pub async fn global_successions_of_pages_in_unique_order(b: &dyn Backend) {
    let g = b.global_store("global_successions_of").await;
    let iad = dc("iad");
    let uniques = [256, 0, 10, 9, 1, u64::MAX, 70_000, 2];
    let others = ["iad-2.1", "iad2.4", "ia.3", "fra.5", "iad-2.0"];
    let mut want = Vec::new();
    for (n, unique) in uniques.iter().enumerate() {
        let s = moved(
            &ReservationId::new(iad.clone(), *unique),
            &rid(&format!("lhr.{n}")),
        );
        assert_eq!(g.set_successor(&s).await.unwrap(), None);
        want.push(s);
        let other = rid(others[n % others.len()]);
        g.set_successor(&moved(&other, &rid("lhr.99")))
            .await
            .unwrap();
    }
    want.sort_by_key(|s| s.link.from.unique());
    assert_eq!(
        g.successions_of(&iad, None, GET_MANY_KEYS_MAX)
            .await
            .unwrap(),
        want
    );
    for limit in [1, 2, 3] {
        let mut paged = Vec::new();
        let mut after: Option<ReservationId> = None;
        loop {
            let page = g.successions_of(&iad, after.as_ref(), limit).await.unwrap();
            assert!(page.len() <= limit);
            let last_page = page.len() < limit;
            after = page.last().map(|s| s.link.from.clone());
            paged.extend(page);
            if last_page {
                break;
            }
        }
        assert_eq!(paged, want, "pages of {limit}");
    }
    let page = g
        .successions_of(&iad, Some(&rid("iad.3")), 2)
        .await
        .unwrap();
    assert_eq!(page, want[3..5].to_vec(), "a cursor that is no succession");
    let last = ReservationId::new(iad.clone(), u64::MAX);
    assert!(
        g.successions_of(&iad, Some(&last), 10)
            .await
            .unwrap()
            .is_empty()
    );
    assert!(g.successions_of(&iad, None, 0).await.unwrap().is_empty());
    assert!(
        g.successions_of(&dc("none"), None, 10)
            .await
            .unwrap()
            .is_empty()
    );
    let ia = g.successions_of(&dc("ia"), None, 10).await.unwrap();
    assert_eq!(ia, vec![moved(&rid("ia.3"), &rid("lhr.99"))]);
    assert!(matches!(
        g.successions_of(&iad, None, GET_MANY_KEYS_MAX + 1).await,
        Err(StoreError::BatchTooLarge { .. })
    ));
    assert!(matches!(
        g.successions_of(&iad, Some(&rid("iad-2.1")), 10).await,
        Err(StoreError::InvalidArgument(_))
    ));
}

/// The conformance cases, listed once: `conformance_cases!((m) { args })`
/// calls `m!` with `args`, then every case's name. [`run_all`] and [`conformance_tests!`]
/// both take their list from here, so a case added here runs everywhere.
#[macro_export]
#[doc(hidden)]
macro_rules! conformance_cases {
    (($($callback:tt)+) { $($args:tt)* }) => {
        $($callback)+! { $($args)*
        global_write_once,
        global_write_once_whose_answer_was_lost_is_inserted_once,
        global_nearest_read_is_never_wrong_and_catches_up,
        global_concurrent_set_if_absent_has_exactly_one_winner,
        global_get_many_keeps_order_and_bounds_the_batch,
        global_unicode_and_long_keys_do_not_collide,
        dc_cas_creates_then_updates,
        dc_cas_with_stale_version_fails_and_changes_nothing,
        dc_cas_create_when_exists_fails,
        dc_cas_rejects_caller_bugs,
        dc_concurrent_cas_has_exactly_one_winner,
        dc_identical_concurrent_writes_land_once,
        dc_max_length_record_round_trips,
        dc_scan_orders_filters_and_pages,
        dc_scan_page_is_full_unless_last,
        dc_concurrent_allocations_are_unique,
        dc_reopen_keeps_records_and_allocator_continues_above,
        global_scan_pages_in_key_order,
        dc_events_record_every_change_of_holder_and_nothing_else,
        dc_concurrent_writes_get_contiguous_event_seqs,
        dc_events_survive_reopen,
        dc_migration_mark_is_kept_until_cleared,
        dc_keys_created_counts_first_reservations_per_namespace,
        dc_scan_scopes_cover_exactly_their_namespaces,
        dc_import_copies_records_and_events_without_overwriting,
        dc_allocator_floor_bounds_uniques_and_raise_skips_past,
        dc_due_lists_exactly_what_is_due_and_follows_writes,
        global_dc_lease_renews_and_keeps_the_highest_marks,
        global_dc_lease_lapses_then_expires_without_renewals,
        global_dc_retired_is_refused_for_good,
        global_successor_is_write_once_and_checks_its_cause,
        global_set_successor_whose_answer_was_lost_is_written_once,
        global_take_over_waits_for_the_dc_lease_to_expire,
        global_takeovers_racing_a_renewal_are_refused_or_reconciled,
        global_concurrent_successions_have_exactly_one_winner,
        global_successions_of_pages_in_unique_order,
        }
    };
}

/// Runs every case in sequence, printing each name.
pub async fn run_all(b: &dyn Backend) {
    macro_rules! run {
        ($($case:ident),* $(,)?) => {$(
            println!("conformance: {}", stringify!($case));
            $case(b).await;
        )*};
    }
    conformance_cases!((run) {});
}

/// One `#[tokio::test]` per conformance case, each opening its stores through
/// the [`Backend`] that `$backend` evaluates to (evaluated once per test).
#[macro_export]
macro_rules! conformance_tests {
    ($backend:expr) => {
        $crate::conformance_cases!(($crate::conformance_tests) { @cases $backend; });
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
