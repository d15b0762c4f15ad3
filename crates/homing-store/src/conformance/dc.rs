//! The [`DcStore`](crate::DcStore) cases: compare-and-set, scans and scopes,
//! the expiry index, the event log, the allocator, import and the migration
//! mark.

use std::collections::HashSet;

use homing_core::actor::ACTOR_ID_BYTES_MAX;
use homing_core::dc::DC_ID_BYTES_MAX;
use homing_core::event::derive;
use homing_core::key::{KEY_NAME_BYTES_MAX, NAMESPACE_BYTES_MAX, TAG_BYTES_MAX};
use homing_core::{
    ActorId, DcId, DcRecord, DueCursor, DueKind, Event, EventKind, EventSeq, FencingToken,
    HostTime, Key, LeasePolicy, Namespace, NamespaceScope, RecordState, ReleaseCause,
    ReservationId, RunOutcome, Shortcut, StoreTime, Tag,
};

use super::{Backend, RACERS, key, lease, record, rid};
use crate::dc::{Cas, DcStore, EVENTS_LIMIT_MAX, EventPage, Import, SCAN_LIMIT_MAX, ScanCursor};
use crate::error::StoreError;

fn next_version(r: &DcRecord) -> DcRecord {
    let mut next = r.clone();
    next.allow_renew = !r.allow_renew;
    next.version = r.version + 1;
    next
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
            session: None,
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
        expiry: homing_core::Expiry::At(StoreTime::from_ms(ms)),
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
    let drained = renewed.drain(None).expect("a renewable record drains");
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
                session: None,
            },
            StoreTime::from_ms(3),
            &POLICY,
            None,
        )
        .next
        .expect("a released record re-activates");
    let expired = again
        .expire(StoreTime::from_ms(100_000), &POLICY, None)
        .expect("a lease long past its grace expires");
    let linked = expired
        .link(
            &expired.key,
            &rid("fra.2"),
            again.token,
            StoreTime::from_ms(100_001),
            &POLICY,
            None,
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
