//! homingd under its DC lease (DESIGN.md §7.5): host leases are granted and
//! renewed only while the global store keeps the DC's lease alive; a DC
//! store that is behind the marks its DC published (wiped, or restored from
//! an old backup) is refused at start; a retired DC is refused.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use homing_core::{
    ActorId, DcId, ErrorKind, ErrorReply, FencingToken, Identity, KeyConfig, KeyName, RenewReply,
    Reply, Request, ReservationId, Role, Succession, TakeOverReply, TakeoverPolicy,
};
use homing_daemon::dc_lease::Refusal;
use homing_daemon::{Daemon, DaemonError, Settings};
use homing_net::{DevCa, Handler};
use homing_store::{DcStore, GlobalStore, MemoryDcStore};

mod support;
use support::{TestGlobal, held, lease_of, now, start_iad_with};

/// The global store judges iad's lease expired (the global store cut off
/// from it by the test meanwhile), then takes each of `tails` over for fra.
async fn take_over_once_expired(global: &TestGlobal, tails: &[ReservationId]) {
    let deadline = tokio::time::Instant::now() + Duration::from_millis(WAIT_MS_MAX);
    for (i, tail) in tails.iter().enumerate() {
        let taker = ReservationId::new(DcId::new("fra").unwrap(), i as u64 + 1);
        loop {
            let state = global.inner.dc_lease(tail.dc()).await.unwrap();
            let takeover =
                Succession::taken_over(tail.clone(), taker.clone(), state.marks.token_bound);
            match global
                .inner
                .take_over(&takeover, TakeoverPolicy::Automatic)
                .await
                .unwrap()
            {
                TakeOverReply::Taken => break,
                TakeOverReply::Refused(_) => {}
                other => panic!("{other:?}"),
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "iad's lease never expired"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// Longest any wait here may take on a loaded machine.
const WAIT_MS_MAX: u64 = 30_000;

/// 1 s host leases: the DC lease is then 2 s, renewed every 200 ms.
fn short_leases() -> Settings {
    Settings {
        lease_ttl_ms: Some(1_000),
        soft_margin_ms: Some(300),
        hard_margin_ms: Some(100),
        renew_at_permille: Some(200),
        grace_ms: Some(100),
        ..Settings::default()
    }
}

async fn start(
    global: &Arc<TestGlobal>,
    records: &Arc<MemoryDcStore>,
    more: Settings,
) -> (Result<Daemon, DaemonError>, tempfile::TempDir) {
    let ca = DevCa::generate("dc lease test ca").unwrap();
    let global = global.clone() as Arc<dyn GlobalStore>;
    let records = records.clone() as Arc<dyn DcStore>;
    start_iad_with(&ca, global, records, false, more).await
}

fn host() -> Identity {
    Identity::new(Role::Host, Some(DcId::new("iad").unwrap())).unwrap()
}

fn acquire(name: &str) -> Request {
    acquire_under(name, lease_of("10.0.0.1:9000"))
}

/// A new logical acquire of `name` under its own lease key (a host's retry
/// of an acquire would be answered with that acquire's reply).
fn acquire_under(name: &str, lease: homing_core::LeaseKey) -> Request {
    Request::Acquire {
        lease,
        config: KeyConfig::named(KeyName::new(name).unwrap()),
        actor: ActorId::new("10.0.0.1:9000").unwrap(),
        host_time: now(),
        wait_ms: 0,
    }
}

fn renew(reservation: &ReservationId, token: FencingToken) -> Request {
    Request::Renew {
        reservation: reservation.clone(),
        token,
        lease: lease_of("10.0.0.1:9000"),
        host_time: now(),
    }
}

fn unavailable_for_the_dc_lease(reply: &Reply) -> bool {
    matches!(reply, Reply::Error(ErrorReply { kind: ErrorKind::Unavailable { .. }, message })
        if message.contains("dc lease"))
}

/// Sends `request()` until `done` says yes, for at most [`WAIT_MS_MAX`].
async fn until(
    daemon: &Daemon,
    request: impl Fn() -> Request,
    done: impl Fn(&Reply) -> bool,
) -> Reply {
    until_as(daemon, &host(), request, done).await
}

/// [`until`], asked by `caller`.
async fn until_as(
    daemon: &Daemon,
    caller: &Identity,
    request: impl Fn() -> Request,
    done: impl Fn(&Reply) -> bool,
) -> Reply {
    let deadline = tokio::time::Instant::now() + Duration::from_millis(WAIT_MS_MAX);
    loop {
        let reply = daemon.node().handle(caller, request()).await;
        if done(&reply) {
            return reply;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "still {reply:?} after {WAIT_MS_MAX} ms"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn dc_lease_a_dc_cut_off_from_the_global_store_stops_renewing_host_leases() {
    let global = Arc::new(TestGlobal::default());
    let records = Arc::new(MemoryDcStore::new());
    let (daemon, _dir) = start(&global, &records, short_leases()).await;
    let daemon = daemon.unwrap();
    let (id, token) = held(&daemon.node().handle(&host(), acquire("room")).await);
    assert!(matches!(
        daemon.node().handle(&host(), renew(&id, token)).await,
        Reply::Renew(RenewReply::Renewed { .. })
    ));
    // Cut off: renewals at iad need nothing from the global store, yet they
    // must stop once the DC lease can no longer cover a whole host lease.
    global.down.store(true, Ordering::SeqCst);
    let cut = tokio::time::Instant::now();
    until(&daemon, || renew(&id, token), unavailable_for_the_dc_lease).await;
    let refused_after = cut.elapsed();
    // 2 s DC lease less its drift margin, less the 1 s host lease: refusals
    // start within about a second of the last acknowledged renewal.
    println!("renewals refused {refused_after:?} after the global store went away");
    assert!(daemon.node().dc_lease_valid_ms() < 1_000);
    // Once the lease has lapsed no host of iad acts and other DCs may take
    // its tails over: iad no longer answers for them.
    let router = Identity::new(Role::Router, None).unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_millis(WAIT_MS_MAX);
    loop {
        let asked = Request::ResolveReservation { id: id.clone() };
        match daemon.node().handle(&router, asked).await {
            Reply::Error(ErrorReply {
                kind: ErrorKind::Unavailable { .. },
                ..
            }) => break,
            Reply::Reservation(_) => {}
            other => panic!("{other:?}"),
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "a dc cut off from the global store still answers for its tail after {WAIT_MS_MAX} ms"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        daemon.node().dc_lease_valid_ms(),
        0,
        "refused only once lapsed"
    );
    // Healed: the next renewal of the DC lease lets iad grant again (the
    // host's own lease ran out meanwhile), and answer for its tails.
    global.down.store(false, Ordering::SeqCst);
    let reply = until(
        &daemon,
        || acquire_under("room", lease_of("10.0.0.1:9000 after the heal")),
        |r| matches!(r, Reply::Acquire(homing_core::AcquireReply::Acquired(_))),
    )
    .await;
    let (again, renewed) = held(&reply);
    assert!(renewed > token, "a new grant after the heal");
    // It answers for its tail again — once reconciled (a renewal answered
    // late on a loaded machine can let the lease lapse and be regained once
    // more, which owes another reconciliation first: Unavailable meanwhile).
    let asked = || Request::ResolveReservation { id: again.clone() };
    let answer = until_as(&daemon, &router, asked, |r| {
        matches!(r, Reply::Reservation(_))
    })
    .await;
    assert!(matches!(answer, Reply::Reservation(_)), "{answer:?}");
    daemon.shutdown().await;
}

#[tokio::test]
async fn dc_lease_a_wiped_dc_store_is_refused_and_start_above_floor_skips_past_every_used_id() {
    let global = Arc::new(TestGlobal::default());
    let records = Arc::new(MemoryDcStore::new());
    let (daemon, _dir) = start(&global, &records, Settings::default()).await;
    let daemon = daemon.unwrap();
    let (first, _) = held(&daemon.node().handle(&host(), acquire("room")).await);
    daemon.shutdown().await;
    // The same DC id on an empty store: its allocator would start at 1 again.
    let wiped = Arc::new(MemoryDcStore::new());
    let (refused, _dir) = start(&global, &wiped, Settings::default()).await;
    match refused {
        Err(DaemonError::Refused(Refusal::BelowFloor {
            store_floor,
            published,
            ..
        })) => {
            assert!(store_floor < first.unique() && published >= first.unique());
        }
        Err(other) => panic!("refused for the wrong reason: {other}"),
        Ok(_) => panic!("a wiped dc store was served: it would hand out {first} again"),
    }
    let message = match start(&global, &wiped, Settings::default()).await.0 {
        Err(e) => e.to_string(),
        Ok(_) => unreachable!(),
    };
    assert!(
        message.contains("--start-above-floor") && message.contains("new dc id"),
        "{message}"
    );
    let above = Settings {
        start_above_floor: Some(true),
        ..Settings::default()
    };
    let (daemon, _dir) = start(&global, &wiped, above).await;
    let daemon = daemon.unwrap();
    let (next, _) = held(&daemon.node().handle(&host(), acquire("other")).await);
    assert!(
        next.unique() > first.unique(),
        "{next} reuses an id at or below {first}"
    );
    daemon.shutdown().await;
}

#[tokio::test]
async fn dc_lease_a_retired_dc_is_refused_at_start_and_stops_granting_when_running() {
    let global = Arc::new(TestGlobal::default());
    let records = Arc::new(MemoryDcStore::new());
    let (daemon, _dir) = start(&global, &records, short_leases()).await;
    let daemon = daemon.unwrap();
    held(&daemon.node().handle(&host(), acquire("room")).await);
    let iad = DcId::new("iad").unwrap();
    global.inner.retire_dc(&iad).await.unwrap();
    until(&daemon, || acquire("later"), unavailable_for_the_dc_lease).await;
    daemon.shutdown().await;
    match start(&global, &records, Settings::default()).await.0 {
        Err(DaemonError::Refused(Refusal::Retired { dc })) => assert_eq!(dc, iad),
        Err(other) => panic!("refused for the wrong reason: {other}"),
        Ok(_) => panic!("a retired dc was served"),
    }
}

#[tokio::test]
async fn dc_lease_a_dc_started_while_the_global_store_is_down_checks_its_floor_when_it_answers() {
    let global = Arc::new(TestGlobal::default());
    let records = Arc::new(MemoryDcStore::new());
    let (daemon, _dir) = start(&global, &records, short_leases()).await;
    let daemon = daemon.unwrap();
    held(&daemon.node().handle(&host(), acquire("room")).await);
    daemon.shutdown().await;
    // Wiped, and the global store unreachable at start: homingd serves, but
    // grants nothing until the check it could not do passes — and it fails.
    global.down.store(true, Ordering::SeqCst);
    let wiped = Arc::new(MemoryDcStore::new());
    let (daemon, _dir) = start(&global, &wiped, short_leases()).await;
    let daemon = daemon.unwrap();
    global.down.store(false, Ordering::SeqCst);
    let reply = until(
        &daemon,
        || acquire("fresh"),
        |r| !matches!(r, Reply::Acquire(_)),
    )
    .await;
    assert!(unavailable_for_the_dc_lease(&reply), "{reply:?}");
    // It never comes round: the refusal is for good.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let reply = daemon.node().handle(&host(), acquire("fresh")).await;
    assert!(unavailable_for_the_dc_lease(&reply), "{reply:?}");
    daemon.shutdown().await;
}

#[tokio::test]
async fn dc_lease_a_dc_whose_global_store_never_answers_still_shuts_down() {
    let global = Arc::new(TestGlobal::default());
    global.down.store(true, Ordering::SeqCst);
    let records = Arc::new(MemoryDcStore::new());
    let (daemon, _dir) = start(&global, &records, short_leases()).await;
    let daemon = daemon.unwrap();
    // The renewal loop retries the start-up check every 250 ms; shutdown
    // must not wait for the global store to come back.
    tokio::time::timeout(Duration::from_millis(WAIT_MS_MAX), daemon.shutdown())
        .await
        .expect("shutdown finished although the global store never answered");
}

#[tokio::test]
async fn dc_lease_a_store_restored_from_a_backup_within_the_allocator_block_is_refused() {
    let global = Arc::new(TestGlobal::default());
    let records = Arc::new(MemoryDcStore::new());
    let (daemon, _dir) = start(&global, &records, short_leases()).await;
    let daemon = daemon.unwrap();
    let (first, _) = held(&daemon.node().handle(&host(), acquire("room")).await);
    // Renewals publish the store's event head: wait for one that saw the grant.
    let iad = DcId::new("iad").unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_millis(WAIT_MS_MAX);
    while global.inner.dc_lease(&iad).await.unwrap().marks.event_head < 1 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "event head never published"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    daemon.shutdown().await;
    // A "backup" from before the grant but within the allocator block: its
    // allocator is as far as the published floor, its event log is not.
    let backup = Arc::new(MemoryDcStore::new());
    let floor = records.allocator_floor().await.unwrap();
    assert!(floor >= first.unique());
    backup.raise_allocator(floor).await.unwrap();
    match start(&global, &backup, short_leases()).await.0 {
        Err(DaemonError::Refused(Refusal::EventsBehind {
            store_head,
            published,
            ..
        })) => assert!(store_head < published, "{store_head} vs {published}"),
        Err(other) => panic!("refused for the wrong reason: {other}"),
        Ok(_) => panic!("a store restored from an older backup was served"),
    }
    let above = Settings {
        start_above_floor: Some(true),
        ..short_leases()
    };
    let (daemon, _dir) = start(&global, &backup, above).await;
    daemon
        .expect("--start-above-floor serves it as it is")
        .shutdown()
        .await;
}

#[tokio::test]
async fn dc_lease_a_failed_reconciliation_pass_resumes_after_the_page_it_applied() {
    let global = Arc::new(TestGlobal::default());
    let records = Arc::new(MemoryDcStore::new());
    let (daemon, _dir) = start(&global, &records, short_leases()).await;
    let daemon = daemon.unwrap();
    // One more tail than a page of successions holds.
    let count = homing_node::pass::reconcile::PAGE_SUCCESSIONS + 1;
    let mut tails = Vec::new();
    for i in 0..count {
        let name = format!("room{i}");
        tails.push(held(&daemon.node().handle(&host(), acquire(&name)).await));
    }
    let ids: Vec<ReservationId> = tails.iter().map(|(id, _)| id.clone()).collect();
    global.down.store(true, Ordering::SeqCst);
    take_over_once_expired(&global, &ids).await;
    // Healed; the first pass's second page fails, once.
    global.pages_asked.lock().unwrap().clear();
    global.fail_a_next_page.store(true, Ordering::SeqCst);
    global.down.store(false, Ordering::SeqCst);
    let (last, token) = tails.last().unwrap().clone();
    until(
        &daemon,
        || renew(&last, token),
        |r| !unavailable_for_the_dc_lease(r),
    )
    .await;
    for id in &ids {
        let record = records.get(id).await.unwrap().unwrap();
        assert!(
            matches!(record.state, homing_core::RecordState::Linked { .. }),
            "{id}: {:?}",
            record.state
        );
    }
    // The first pass read page one, failed on page two; the next pass
    // started after page one's last succession, not from the first page.
    let asked = global.pages_asked.lock().unwrap().clone();
    let first_page_end = Some(ids[count - 2].clone());
    let expected = [None, first_page_end.clone(), first_page_end];
    assert_eq!(
        asked.get(..3),
        Some(&expected[..]),
        "pages asked after the heal: {asked:?}"
    );
    daemon.shutdown().await;
}

#[tokio::test]
async fn dc_lease_a_dc_back_from_expiry_applies_the_takeovers_of_its_tails_before_it_renews() {
    let global = Arc::new(TestGlobal::default());
    let records = Arc::new(MemoryDcStore::new());
    let (daemon, _dir) = start(&global, &records, short_leases()).await;
    let daemon = daemon.unwrap();
    let (id, token) = held(&daemon.node().handle(&host(), acquire("room")).await);
    // iad is cut off from the global store long enough for the store to
    // judge its lease expired (2 s + 1 s + 0.1 s after the last renewal it
    // received); fra then takes iad's tail over in the store.
    global.down.store(true, Ordering::SeqCst);
    let taker: ReservationId = "fra.1".parse().unwrap();
    take_over_once_expired(&global, std::slice::from_ref(&id)).await;
    // Healed: iad renews its lease, and must apply the takeover before it
    // renews (or grants) anything: the old holder is told its lease is gone.
    global.down.store(false, Ordering::SeqCst);
    let reply = until(
        &daemon,
        || renew(&id, token),
        |r| !unavailable_for_the_dc_lease(r),
    )
    .await;
    assert!(
        !matches!(reply, Reply::Renew(RenewReply::Renewed { .. })),
        "iad renewed a lease fra took over: {reply:?}"
    );
    let record = records.get(&id).await.unwrap().unwrap();
    assert_eq!(
        record.state,
        homing_core::RecordState::Linked { to: taker },
        "the takeover is applied to iad's record"
    );
    daemon.shutdown().await;
}
