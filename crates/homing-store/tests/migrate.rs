//! Migration round trips between real backends: a realistic population made
//! through the public store API (reserve, renew, drain, release, expire,
//! recreate in another DC with a link confirmed in the global store, lost
//! races abandoned, nested namespaces, a trimmed event log, settings
//! changed by swaps, DC leases renewed, a lost DC retired and taken over,
//! host sessions live and ended with keys held and frozen under one) is
//! copied, and the copy must hold every entry, succession, DC lease
//! entry, setting, session row (with its derived indexes), record and event, carry on allocating above the
//! source, keep global entries and successions write-once (a takeover in
//! the target finds a move made at the source), accept compare-and-set on
//! migrated versions and settings, and find everything present on a second
//! run.

use std::path::Path;
use std::sync::Arc;

use homing_core::{
    ActorId, DcId, DcLeaseState, DcMarks, DcRecord, DcRenewal, DcStanding, DcTerms, Event,
    EventSeq, FailureReason, FencingToken, HostTime, Key, KeyName, LeasePolicy, Namespace,
    NamespaceScope, RecordState, ReservationId, RunOutcome, ScanCursor, SessionId, SessionRecord,
    StoreTime, Succession, TakeOverReply, TakeoverPolicy,
};
use homing_store::SESSION_PAGE_MAX;
use homing_store::migrate::{MigrateOptions, MigrateReport, SAMPLE_MAX, StoreSet, migrate, verify};
use homing_store::{
    Cas, DcStore, EVENTS_LIMIT_MAX, GET_MANY_KEYS_MAX, GlobalStore, GuardedCas, RedbDcStore,
    RedbGlobalStore, RedbOptions, SCAN_LIMIT_MAX, SETTING_BYTES_MAX, SessionCas, SessionGuard,
    SetIfAbsent, Setting, SuccessionPages,
};

const POLICY: LeasePolicy = LeasePolicy::DEFAULT;
/// Keys each DC reserves: more than a scan page, so paging is exercised.
const KEYS_PER_DC: u64 = 150;
const NAMESPACES: [&str; 4] = ["", "games", "games/eu", "a/b"];
/// Host sessions each DC opens: more than a page of them.
const SESSIONS_PER_DC: u64 = SESSION_PAGE_MAX as u64 + 2;
/// Events below this are trimmed in the first DC (retention ran there).
const TRIMMED_BELOW: EventSeq = 25;

fn dcs() -> Vec<DcId> {
    ["iad", "fra"].map(|d| DcId::new(d).unwrap()).to_vec()
}

fn redb_set(dir: &Path) -> StoreSet {
    let global: Arc<dyn GlobalStore> =
        Arc::new(RedbGlobalStore::open(dir.join("global.redb"), RedbOptions::default()).unwrap());
    let dcs = dcs()
        .into_iter()
        .map(|dc| {
            let store: Arc<dyn DcStore> = Arc::new(
                RedbDcStore::open(dir.join(format!("dc-{dc}.redb")), RedbOptions::default())
                    .unwrap(),
            );
            (dc, store)
        })
        .collect();
    StoreSet { global, dcs }
}

async fn cas(store: &dyn DcStore, expected: Option<u64>, record: &DcRecord) {
    assert_eq!(
        store.compare_and_set(expected, record).await.unwrap(),
        Cas::Written
    );
}

async fn update(store: &dyn DcStore, next: Option<DcRecord>) -> DcRecord {
    let next = next.expect("the transition writes");
    cas(store, Some(next.version - 1), &next).await;
    next
}

fn actor(dc: &DcId, i: u64) -> ActorId {
    ActorId::new(format!("{dc}-host-{}:9000", i % 7)).unwrap()
}

/// Reserves a fresh reservation of `key` in `store`.
async fn reserve(
    store: &dyn DcStore,
    dc: &DcId,
    key: &Key,
    token: FencingToken,
    predecessor: Option<ReservationId>,
    now: StoreTime,
) -> DcRecord {
    let id = ReservationId::new(dc.clone(), store.allocate().await.unwrap());
    let (record, _) = DcRecord::reserve(
        id,
        key.clone(),
        None,
        token,
        (predecessor).map(|reservation| homing_core::PreviousRun {
            reservation,
            token: homing_core::FencingToken::FIRST,
            ended: homing_core::ReleaseCause::Expired,
        }),
        &homing_core::Holding {
            actor: actor(dc, token.get()),
            lease: lease(),
            host_time: HostTime::from_ms(now.as_ms()),
            session: None,
        },
        now,
        &POLICY,
    );
    cas(store, None, &record).await;
    record
}

/// Each DC reserves `KEYS_PER_DC` keys over nested namespaces, then each key
/// goes one of seven ways; every tenth key also gets a losing racer.
async fn populate(set: &StoreSet) {
    let dcs = &set.dcs;
    for i in 0..KEYS_PER_DC {
        for (d, (dc, store)) in dcs.iter().enumerate() {
            let store = store.as_ref();
            let key = Key::in_namespace(
                Namespace::new(NAMESPACES[(i % 4) as usize]).unwrap(),
                KeyName::new(format!("{dc}-room-{i}")).unwrap(),
            );
            let now = StoreTime::from_ms(1_000_000 + i * 100);
            let later = StoreTime::from_ms(now.as_ms() + 1_000);
            let r = reserve(store, dc, &key, FencingToken::FIRST, None, now).await;
            assert_eq!(
                set.global.set_if_absent(&key, &r.id).await.unwrap(),
                SetIfAbsent::Inserted
            );
            let host = HostTime::from_ms(later.as_ms());
            match i % 7 {
                0 => {
                    let r =
                        update(store, r.renew(r.token, &lease(), host, later, &POLICY).next).await;
                    update(store, r.renew(r.token, &lease(), host, later, &POLICY).next).await;
                }
                1 => {
                    update(
                        store,
                        r.release(r.token, &lease(), RunOutcome::Ok, later).next,
                    )
                    .await;
                }
                2 => {
                    let reason = FailureReason::new(format!("exit {i}")).unwrap();
                    let failed = RunOutcome::Failed { reason };
                    update(store, r.release(r.token, &lease(), failed, later).next).await;
                }
                3 => {
                    let reaped = StoreTime::from_ms(now.as_ms() + 10_000_000);
                    update(store, r.expire(reaped, &POLICY, None)).await;
                }
                4 => {
                    let drained = update(store, r.drain(None)).await;
                    update(
                        store,
                        drained
                            .release(r.token, &lease(), RunOutcome::Ok, later)
                            .next,
                    )
                    .await;
                }
                5 => {
                    // Released, recreated in the other DC, linked there.
                    let released = update(
                        store,
                        r.release(r.token, &lease(), RunOutcome::Ok, later).next,
                    )
                    .await;
                    let (other_dc, other) = &dcs[(d + 1) % dcs.len()];
                    let next = reserve(
                        other.as_ref(),
                        other_dc,
                        &key,
                        released.token.next(),
                        Some(released.id.clone()),
                        later,
                    )
                    .await;
                    let linked = released.link(
                        &released.key,
                        &next.id,
                        released.token,
                        later,
                        &POLICY,
                        None,
                    );
                    update(store, linked.next).await;
                    // The mover confirms the move in the global store.
                    let moved = Succession::moved(released.id, next.id, released.token);
                    assert_eq!(set.global.set_successor(&moved).await.unwrap(), None);
                }
                _ => {
                    // Re-activated in the same DC.
                    let released = update(
                        store,
                        r.release(r.token, &lease(), RunOutcome::Ok, later).next,
                    )
                    .await;
                    let again = StoreTime::from_ms(later.as_ms() + 1);
                    let activated = released.activate(
                        None,
                        &homing_core::Holding {
                            actor: actor(dc, 99),
                            lease: lease(),
                            host_time: host,
                            session: None,
                        },
                        again,
                        &POLICY,
                        None,
                    );
                    update(store, activated.next).await;
                }
            }
            if i % 10 == 0 {
                // A racer for the same key lost: its record is abandoned.
                let lost = reserve(store, dc, &key, FencingToken::FIRST, None, now).await;
                assert_eq!(
                    set.global.set_if_absent(&key, &lost.id).await.unwrap(),
                    SetIfAbsent::Exists(r.id.clone())
                );
                update(store, lost.abandon()).await;
            }
        }
    }
    // Retention ran in the first DC.
    set.dcs[0].1.trim_events(TRIMMED_BELOW).await.unwrap();
    // Each DC renewed its lease as it served, publishing its marks; sin, a
    // DC lost earlier (no store here), was retired and one of its tails
    // taken over by iad.
    for (dc, store) in dcs {
        let marks = DcMarks {
            allocator_floor: store.allocator_floor().await.unwrap(),
            token_bound: 3 << 20,
            event_head: all_events(store.as_ref()).await.2,
        };
        let renewal = set.global.renew_dc_lease(dc, &LONG_TERMS, &marks);
        assert!(matches!(renewal.await.unwrap(), DcRenewal::Renewed(_)));
    }
    let sin = DcId::new("sin").unwrap();
    let lost = DcMarks {
        allocator_floor: 2_048,
        token_bound: 7 << 20,
        event_head: 90,
    };
    let renewal = set.global.renew_dc_lease(&sin, &SHORT_TERMS, &lost);
    assert!(matches!(renewal.await.unwrap(), DcRenewal::Renewed(_)));
    set.global.retire_dc(&sin).await.unwrap();
    let state = expired(set.global.as_ref(), &sin).await;
    let taker = ReservationId::new(dcs[0].0.clone(), 9_999);
    let takeover = Succession::taken_over("sin.7".parse().unwrap(), taker, state.marks.token_bound);
    let taken = set.global.take_over(&takeover, TakeoverPolicy::RetiredOnly);
    assert_eq!(taken.await.unwrap(), TakeOverReply::Taken);
    // Each setting swapped a few times; the directory is as large as a
    // setting may be, and no text.
    for (n, setting) in Setting::ALL.into_iter().enumerate() {
        let mut held: Option<Vec<u8>> = None;
        for round in 0..3_u8 {
            let value = match setting {
                Setting::Directory => vec![round ^ 0xA5; SETTING_BYTES_MAX - n],
                Setting::DeploymentVersion => vec![b'5' + round],
            };
            let swapped = set.global.swap_setting(setting, held.as_deref(), &value);
            assert_eq!(swapped.await.unwrap(), Ok(()), "{setting}");
            held = Some(value);
        }
    }
    populate_sessions(set).await;
}

/// Each DC opens [`SESSIONS_PER_DC`] host sessions (every third closed);
/// under its first, one key joins and stays held and one joins and
/// freezes (its notice numbered on the row).
async fn populate_sessions(set: &StoreSet) {
    for (dc, store) in &set.dcs {
        let store = store.as_ref();
        let mut first: Option<SessionRecord> = None;
        for i in 0..SESSIONS_PER_DC {
            let id = SessionId::new(dc.clone(), store.allocate().await.unwrap());
            let now = StoreTime::from_ms(2_000_000 + i);
            let (row, _) = SessionRecord::open(id, lease(), HostTime::from_ms(0), now, &POLICY);
            let created = store.compare_and_set_session(None, &row).await.unwrap();
            assert_eq!(created, SessionCas::Written);
            if i % 3 == 2 {
                let closed = row.close(&lease(), now).unwrap();
                let cas = store.compare_and_set_session(Some(1), &closed).await;
                assert_eq!(cas.unwrap(), SessionCas::Written);
            }
            first.get_or_insert(row);
        }
        let mut row = first.expect("a session was opened");
        for name in ["held", "frozen"] {
            let key = Key::new(KeyName::new(format!("{dc}-session-{name}")).unwrap());
            let now = StoreTime::from_ms(2_000_000);
            let id = ReservationId::new(dc.clone(), store.allocate().await.unwrap());
            let (mut record, _) = DcRecord::reserve(
                id,
                key,
                None,
                FencingToken::FIRST,
                None,
                &homing_core::Holding {
                    actor: actor(dc, 1),
                    lease: lease(),
                    host_time: HostTime::from_ms(0),
                    session: None,
                },
                now,
                &POLICY,
            );
            if let RecordState::Active { expiry, .. } = &mut record.state {
                *expiry = homing_core::Expiry::Session(row.id.clone());
            }
            let joins = SessionGuard {
                id: row.id.clone(),
                version: row.version,
                next: None,
            };
            let joined = store.compare_and_set_in_session(None, &record, &joins);
            assert_eq!(joined.await.unwrap(), GuardedCas::Written);
            if name == "frozen" {
                let frozen = record.drain(Some(&row)).unwrap();
                let (next, _) = row.noticed();
                let freeze = SessionGuard {
                    next: Some(next.clone()),
                    ..joins
                };
                let written = store.compare_and_set_in_session(Some(1), &frozen, &freeze);
                assert_eq!(written.await.unwrap(), GuardedCas::Written);
                row = next;
            }
        }
    }
}

/// Every session row of `store`, in stored-name order.
async fn all_sessions(store: &dyn DcStore) -> Vec<SessionRecord> {
    let mut out: Vec<SessionRecord> = Vec::new();
    loop {
        let after = out.last().map(|r| r.id.clone());
        let page = store.sessions(after.as_ref(), SESSION_PAGE_MAX).await;
        let page = page.unwrap();
        let last = page.len() < SESSION_PAGE_MAX;
        out.extend(page);
        if last {
            return out;
        }
    }
}

/// What `store` derives from its session rows and records: every
/// session's keys and notices, and the sessions due by far in the future.
async fn session_indexes(store: &dyn DcStore) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    for row in all_sessions(store).await {
        let keys = store.session_keys(&row.id, None, SESSION_PAGE_MAX).await;
        let notices = store.session_notices(&row.id, 0, SESSION_PAGE_MAX).await;
        let ids = |records: Vec<DcRecord>| records.iter().map(|r| r.id.to_string()).collect();
        out.push(ids(keys.unwrap()));
        out.push(ids(notices.unwrap()));
    }
    let mut after = None;
    let mut due = Vec::new();
    loop {
        let until = StoreTime::from_ms(u64::MAX / 2);
        let page = store
            .due_sessions(until, after.as_ref(), SESSION_PAGE_MAX)
            .await;
        let page = page.unwrap();
        after = page.last().map(homing_store::SessionCursor::after);
        let last = page.len() < SESSION_PAGE_MAX;
        due.extend(page.iter().map(|r| r.id.to_string()));
        if last {
            break;
        }
    }
    out.push(due);
    out
}

/// Every setting's value, in [`Setting::ALL`] order.
async fn all_settings(global: &dyn GlobalStore) -> Vec<Option<Vec<u8>>> {
    let mut out = Vec::new();
    for setting in Setting::ALL {
        out.push(global.setting(setting).await.unwrap());
    }
    out
}

async fn all_records(store: &dyn DcStore, scope: &NamespaceScope) -> Vec<DcRecord> {
    let mut out = Vec::new();
    let mut after: Option<ScanCursor> = None;
    loop {
        let page = store
            .scan(scope, "", after.as_ref(), SCAN_LIMIT_MAX)
            .await
            .unwrap();
        after = page.last().map(ScanCursor::after);
        let last = page.len() < SCAN_LIMIT_MAX;
        out.extend(page);
        if last {
            return out;
        }
    }
}

/// Every kept event, with the log's `(oldest, head)`.
async fn all_events(store: &dyn DcStore) -> (Vec<Event>, EventSeq, EventSeq) {
    let mut out: Vec<Event> = Vec::new();
    loop {
        let after = out.last().map_or(0, |e| e.seq);
        let page = store.events(after, EVENTS_LIMIT_MAX).await.unwrap();
        let last = page.events.len() < EVENTS_LIMIT_MAX;
        out.extend(page.events);
        if last {
            return (out, page.oldest, page.head);
        }
    }
}

/// Every DC's lease entry, as a store keeps it: its terms, marks and
/// retirement (standings are each store's own judgement).
async fn dc_leases(global: &dyn GlobalStore) -> Vec<(DcId, Option<DcTerms>, DcMarks, bool)> {
    let leases = global.dc_leases().await.unwrap();
    leases
        .into_iter()
        .map(|s| (s.dc, s.terms, s.marks, s.retired))
        .collect()
}

/// Every DC's successions, in store order.
async fn all_successions(global: &dyn GlobalStore) -> Vec<Succession> {
    let mut pages = SuccessionPages::every();
    let mut out = Vec::new();
    while let Some(page) = pages.next(global).await.unwrap() {
        out.extend(page);
    }
    out
}

async fn all_entries(global: &dyn GlobalStore) -> Vec<(Key, ReservationId)> {
    let mut out: Vec<(Key, ReservationId)> = Vec::new();
    loop {
        let after = out.last().map(|(k, _)| k.clone());
        let page = global
            .scan(after.as_ref(), GET_MANY_KEYS_MAX)
            .await
            .unwrap();
        let last = page.len() < GET_MANY_KEYS_MAX;
        out.extend(page);
        if last {
            return out;
        }
    }
}

/// Every entry, record (in every scope) and kept event of `a` is in `b`, and nothing else.
async fn assert_same(a: &StoreSet, b: &StoreSet) {
    let entries = all_entries(a.global.as_ref()).await;
    assert_eq!(entries.len() as u64, KEYS_PER_DC * a.dcs.len() as u64);
    assert_eq!(
        entries,
        all_entries(b.global.as_ref()).await,
        "global entries"
    );
    let successions = all_successions(a.global.as_ref()).await;
    assert!(!successions.is_empty());
    assert!(
        successions == all_successions(b.global.as_ref()).await,
        "successions differ"
    );
    let leases = dc_leases(a.global.as_ref()).await;
    assert!(leases.iter().any(|(_, _, _, retired)| *retired));
    assert_eq!(leases, dc_leases(b.global.as_ref()).await, "dc leases");
    let settings = all_settings(a.global.as_ref()).await;
    assert!(settings.iter().all(Option::is_some), "every setting is set");
    assert!(
        settings == all_settings(b.global.as_ref()).await,
        "settings differ"
    );
    let scopes = [
        NamespaceScope::everything(),
        NamespaceScope::exact(Namespace::new("a/b").unwrap()),
        NamespaceScope::subtree(Namespace::new("games").unwrap()),
    ];
    for ((dc, from), (_, to)) in a.dcs.iter().zip(&b.dcs) {
        let sessions = all_sessions(from.as_ref()).await;
        assert_eq!(sessions.len() as u64, SESSIONS_PER_DC, "{dc}");
        assert!(
            sessions == all_sessions(to.as_ref()).await,
            "{dc}: session rows differ"
        );
        let derived = session_indexes(from.as_ref()).await;
        assert!(
            derived.iter().any(|keys| keys.len() == 2),
            "{dc}: no session keys"
        );
        assert_eq!(
            derived,
            session_indexes(to.as_ref()).await,
            "{dc}: session indexes"
        );
        for scope in &scopes {
            let want = all_records(from.as_ref(), scope).await;
            assert!(!want.is_empty());
            assert_eq!(want, all_records(to.as_ref(), scope).await, "{dc} {scope}");
        }
        let (events, oldest, head) = all_events(from.as_ref()).await;
        assert!(
            events.len() > SCAN_LIMIT_MAX,
            "{dc}: {} events",
            events.len()
        );
        assert_eq!(
            (events, oldest, head),
            all_events(to.as_ref()).await,
            "{dc} events"
        );
    }
}

/// The target works as a store of the same deployment. Writes to it.
async fn assert_target_carries_on(source: &StoreSet, target: &StoreSet) {
    // A setting changes by compare-and-set on its migrated value.
    let version = Setting::DeploymentVersion;
    let migrated = source.global.setting(version).await.unwrap();
    assert_eq!(
        target
            .global
            .swap_setting(version, None, b"9")
            .await
            .unwrap(),
        Err(migrated.clone()),
        "a migrated setting is set"
    );
    let swapped = target
        .global
        .swap_setting(version, migrated.as_deref(), b"9");
    assert_eq!(swapped.await.unwrap(), Ok(()));
    // Write-once entries stay write-once: the original wins.
    let (key, original) = all_entries(source.global.as_ref()).await.remove(7);
    let intruder: ReservationId = "sin.1".parse().unwrap();
    assert_eq!(
        target.global.set_if_absent(&key, &intruder).await.unwrap(),
        SetIfAbsent::Exists(original)
    );
    // So do successions: a later move of a moved reservation finds the first.
    let moved = all_successions(source.global.as_ref()).await.remove(0);
    let later = Succession::moved(moved.link.from.clone(), intruder, moved.link.token);
    assert_eq!(
        target.global.set_successor(&later).await.unwrap(),
        Some(moved)
    );
    for ((dc, from), (_, to)) in source.dcs.iter().zip(&target.dcs) {
        let records = all_records(from.as_ref(), &NamespaceScope::everything()).await;
        let used = records.iter().map(|r| r.id.unique()).max().unwrap();
        let floor = from.allocator_floor().await.unwrap();
        assert!(floor >= used);
        let fresh = to.allocate().await.unwrap();
        assert!(
            fresh > floor,
            "{dc}: target allocated {fresh}, source floor {floor}"
        );
        // A compare-and-set on a migrated record, at its migrated version.
        let active = records
            .iter()
            .find(|r| matches!(r.state, RecordState::Active { .. }) && r.allow_renew)
            .expect("an active record");
        let (_, _, head) = all_events(to.as_ref()).await;
        let at = StoreTime::from_ms(1_000_000);
        let released = active
            .release(active.token, &lease(), RunOutcome::Ok, at)
            .next
            .unwrap();
        assert_eq!(
            to.compare_and_set(Some(active.version), &released)
                .await
                .unwrap(),
            Cas::Written
        );
        let (events, _, new_head) = all_events(to.as_ref()).await;
        assert_eq!(
            new_head,
            head + 1,
            "{dc}: the log continues after the migrated head"
        );
        assert_eq!(events.last().unwrap().reservation, active.id);
        // A stale version is refused as before.
        assert!(matches!(
            to.compare_and_set(Some(active.version), &released)
                .await
                .unwrap(),
            Cas::Conflict { .. }
        ));
    }
}

async fn run(source: &StoreSet, target: &StoreSet) -> MigrateReport {
    let options = MigrateOptions {
        dry_run: false,
        sample: 32,
    };
    let report = migrate(source, target, &options, &mut |_| {})
        .await
        .unwrap();
    println!("{report}");
    report
}

/// A second run copies nothing and finds every item present.
async fn assert_rerun_finds_everything_present(
    source: &StoreSet,
    target: &StoreSet,
    first: &MigrateReport,
) {
    let again = run(source, target).await;
    assert!(again.ok(), "{again}");
    assert_eq!(again.global.copied, 0);
    assert_eq!(again.global.present, first.global.copied);
    let settings = Setting::ALL.len() as u64;
    assert_eq!(
        (again.settings.copied, again.settings.present),
        (0, settings)
    );
    assert_eq!(first.settings.copied, settings);
    let successions = (again.successions.copied, again.successions.present);
    assert_eq!(successions, (0, first.successions.copied));
    assert!(first.successions.copied > 0);
    let leases = (again.dc_leases.copied, again.dc_leases.present);
    assert_eq!(leases, (0, first.dc_leases.copied));
    assert_eq!(first.dc_leases.copied, 3, "iad, fra and sin");
    for (a, b) in first.dcs.iter().zip(&again.dcs) {
        assert_eq!((b.records.copied, b.records.present), (0, a.records.copied));
        let sessions = (b.sessions.copied, b.sessions.present);
        assert_eq!(sessions, (0, a.sessions.copied));
        assert_eq!(a.sessions.copied, SESSIONS_PER_DC);
        assert_eq!((b.events.copied, b.events.present), (0, a.events.copied));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn redb_to_redb_round_trip_copies_everything_and_the_copy_carries_on() {
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let source = redb_set(a.path());
    populate(&source).await;

    let dry = migrate(
        &source,
        &redb_set(b.path()),
        &MigrateOptions {
            dry_run: true,
            sample: 0,
        },
        &mut |_| {},
    )
    .await
    .unwrap();
    assert!(dry.ok() && dry.verification.is_none(), "{dry}");
    assert!(
        all_entries(redb_set(b.path()).global.as_ref())
            .await
            .is_empty(),
        "a dry run writes nothing"
    );

    let target = redb_set(b.path());
    let report = run(&source, &target).await;
    assert!(report.ok(), "{report}");
    assert_eq!(report.global.copied, dry.global.copied);
    assert_eq!(report.dcs[0].records.copied, dry.dcs[0].records.copied);
    assert_eq!(report.dcs[0].events.copied, dry.dcs[0].events.copied);
    assert_same(&source, &target).await;
    // Imports are durable: the files hold it all after reopening.
    drop(target);
    let target = redb_set(b.path());
    assert_same(&source, &target).await;
    assert!(
        verify(&source, &target, SAMPLE_MAX, &mut |_| {})
            .await
            .unwrap()
            .ok()
    );
    assert_rerun_finds_everything_present(&source, &target, &report).await;
    assert_target_carries_on(&source, &target).await;
    // ... after which the target no longer matches, and verification says so.
    assert!(
        !verify(&source, &target, SAMPLE_MAX, &mut |_| {})
            .await
            .unwrap()
            .ok()
    );
}

/// Lease terms of a DC that serves on.
const LONG_TERMS: DcTerms = DcTerms {
    ttl_ms: 60_000,
    host_lease_ttl_max_ms: 30_000,
    grace_ms: 2_000,
};

/// Lease terms that expire a DC 300 ms after its last renewal.
const SHORT_TERMS: DcTerms = DcTerms {
    ttl_ms: 200,
    host_lease_ttl_max_ms: 100,
    grace_ms: 0,
};

/// Waits until `global` calls `dc`'s lease expired (a few seconds at most).
async fn expired(global: &dyn GlobalStore, dc: &DcId) -> DcLeaseState {
    for _ in 0..200 {
        let state = global.dc_lease(dc).await.unwrap();
        if state.standing == DcStanding::Expired {
            return state;
        }
        tokio::time::sleep(std::time::Duration::from_millis(25)).await;
    }
    panic!("{dc}'s lease never expired");
}

/// In `set`, `key` reserved at iad, then moved to fra as a mover does it:
/// released at iad, reserved at fra, iad's reservation linked to fra's,
/// and the move confirmed in the global store. The move's succession.
async fn move_to_fra(set: &StoreSet, key: &Key) -> Succession {
    let [(iad, at_iad), (fra, at_fra)] = &set.dcs[..] else {
        panic!("the sets here are iad and fra");
    };
    let now = StoreTime::from_ms(1_000_000);
    let r = reserve(at_iad.as_ref(), iad, key, FencingToken::FIRST, None, now).await;
    set.global.set_if_absent(key, &r.id).await.unwrap();
    let released = update(
        at_iad.as_ref(),
        r.release(r.token, &lease(), RunOutcome::Ok, now).next,
    )
    .await;
    let next = reserve(
        at_fra.as_ref(),
        fra,
        key,
        released.token.next(),
        Some(released.id.clone()),
        now,
    )
    .await;
    let linked = released.link(key, &next.id, released.token, now, &POLICY, None);
    update(at_iad.as_ref(), linked.next).await;
    let moved = Succession::moved(released.id.clone(), next.id.clone(), released.token);
    assert_eq!(set.global.set_successor(&moved).await.unwrap(), None);
    moved
}

/// migrate: a reservation of iad that a move linked to fra keeps its
/// succession in the target. When iad is then lost there (it renewed once
/// after the migration, then went silent until its lease expired), a
/// takeover of that reservation finds the move and is refused, instead of
/// forking the key's chain into two holders (fra's and the taker's).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn migrate_a_moved_reservation_of_a_lost_dc_cannot_be_taken_over_in_the_target() {
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (source, target) = (redb_set(a.path()), redb_set(b.path()));
    let iad = DcId::new("iad").unwrap();
    let kept = DcMarks {
        allocator_floor: 1_024,
        token_bound: 1 << 20,
        event_head: 0,
    };
    source
        .global
        .renew_dc_lease(&iad, &SHORT_TERMS, &kept)
        .await
        .unwrap();
    let key = Key::new(KeyName::new("moved-room").unwrap());
    let moved = move_to_fra(&source, &key).await;

    let report = run(&source, &target).await;
    assert!(report.ok(), "{report}");
    // iad's homingd starts on the target, renews once, and is lost.
    let restarted = DcMarks::default();
    let renewal = target.global.renew_dc_lease(&iad, &SHORT_TERMS, &restarted);
    assert!(matches!(renewal.await.unwrap(), DcRenewal::Renewed(_)));
    let state = expired(target.global.as_ref(), &iad).await;
    let taker: ReservationId = "sin.1".parse().unwrap();
    let takeover = Succession::taken_over(moved.link.from.clone(), taker, state.marks.token_bound);
    assert_eq!(
        target
            .global
            .take_over(&takeover, TakeoverPolicy::Automatic)
            .await
            .unwrap(),
        TakeOverReply::Exists(moved.clone()),
        "the takeover forked a moved key"
    );
    assert_eq!(
        target.global.successor(&moved.link.from).await.unwrap(),
        Some(moved)
    );
}

/// migrate: every DC's lease entry reaches the target — its marks, its
/// terms, its retirement. A migrated DC's first renewal publishes only what
/// it wants now (a restarted homingd: its store's allocator, a token bound
/// of its headroom), so without the copied token bound a takeover in the
/// target would start below tokens the DC granted before the migration; a
/// DC retired in the source stays refused for good.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn migrate_copies_every_dc_lease_marks_and_retirement() {
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (source, target) = (redb_set(a.path()), redb_set(b.path()));
    let (iad, sin) = (DcId::new("iad").unwrap(), DcId::new("sin").unwrap());
    let granted = DcMarks {
        allocator_floor: 4_096,
        token_bound: 5 << 20,
        event_head: 0,
    };
    for dc in [&iad, &sin] {
        let renewal = source.global.renew_dc_lease(dc, &SHORT_TERMS, &granted);
        assert!(matches!(renewal.await.unwrap(), DcRenewal::Renewed(_)));
    }
    source.global.retire_dc(&sin).await.unwrap();
    let report = run(&source, &target).await;
    assert!(report.ok(), "{report}");
    let restarted = DcMarks {
        token_bound: 1 << 20,
        ..DcMarks::default()
    };
    let renewal = target.global.renew_dc_lease(&iad, &SHORT_TERMS, &restarted);
    assert_eq!(renewal.await.unwrap(), DcRenewal::Renewed(granted));
    let renewal = target.global.renew_dc_lease(&sin, &SHORT_TERMS, &restarted);
    assert_eq!(renewal.await.unwrap(), DcRenewal::Retired);
    let sin_state = target.global.dc_lease(&sin).await.unwrap();
    assert_eq!(
        (sin_state.marks, sin_state.terms, sin_state.retired),
        (granted, Some(SHORT_TERMS), true)
    );
}

#[cfg(feature = "etcd")]
mod etcd {
    use super::*;
    use homing_store::etcd::{EtcdDcStore, EtcdGlobalStore};
    use homing_store::etcd_cluster::{ClusterError, LocalEtcdCluster};

    /// homingd's etcd layout under `prefix`.
    async fn etcd_set(endpoints: &[String], prefix: &str) -> StoreSet {
        let global: Arc<dyn GlobalStore> = Arc::new(
            EtcdGlobalStore::connect(endpoints, &format!("{prefix}/global/"))
                .await
                .unwrap(),
        );
        let mut stores = Vec::new();
        for dc in dcs() {
            let store: Arc<dyn DcStore> = Arc::new(
                EtcdDcStore::connect(endpoints, &format!("{prefix}/dc/{dc}/"))
                    .await
                    .unwrap(),
            );
            stores.push((dc, store));
        }
        StoreSet {
            global,
            dcs: stores,
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn redb_to_etcd_to_redb_round_trip_keeps_everything() {
        let cluster = match LocalEtcdCluster::start().await {
            Ok(cluster) => cluster,
            Err(ClusterError::NoBinary) => {
                println!("SKIP etcd migration: no `etcd` binary on PATH");
                return;
            }
            Err(e) => panic!("{e}"),
        };
        let (a, c) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let source = redb_set(a.path());
        populate(&source).await;

        let etcd = etcd_set(cluster.endpoints(), "/homing/migrated").await;
        let there = run(&source, &etcd).await;
        assert!(there.ok(), "{there}");
        assert_same(&source, &etcd).await;
        assert_rerun_finds_everything_present(&source, &etcd, &there).await;

        let back = redb_set(c.path());
        let report = run(&etcd, &back).await;
        assert!(report.ok(), "{report}");
        assert_same(&etcd, &back).await;
        assert_same(&source, &back).await;
        assert_target_carries_on(&source, &back).await;
        // etcd, too, carries on above the source (it was raised, not just copied).
        assert_target_carries_on(&source, &etcd).await;
        drop(cluster);
    }
}

/// The lease key of every holder here.
fn lease() -> homing_core::LeaseKey {
    homing_core::LeaseKey::from_bytes([1; 16]).expect("not all zeros")
}
