//! The HostAgent's lease timeline. Paused-clock tests drive it through an
//! in-memory DC (a `LeaseTransport` granting with the core `LeasePolicy`), so
//! every deadline is hit to the millisecond without sockets; two unpaused
//! tests run the same agent over real QUIC against a scripted homing-net server.

mod support;

use homing_core::{AcquireReply, Grant, Holder};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use homing_client::{
    Actor, AgentError, AgentState, HostAgent, HostAgentConfig, HostClock, LeaseTransport, Started,
};
use homing_core::{
    ActorId, DcId, ErrorKind, ErrorReply, FencingToken, HostTime, KeyConfig, KeyName, LeasePolicy,
    ReleaseReply, RenewReply, Reply, Request, ReservationId, Role, StoreTime,
};
use homing_net::{DevCa, Peer};
use support::{TestDc, client};
use tokio::time::Instant;

/// How the in-memory DC answers renewals.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Answer,
    Silent,
    Refuse,
    Draining,
    Stale,
    Expired,
}

/// An in-memory DC: grants with `LeasePolicy::DEFAULT` (10 s ttl: renew at
/// 3.33 s, soft at 7 s, hard at 9 s after the host time sent).
struct MemoryDc {
    mode: Mutex<Mode>,
    acquire: Mutex<Option<Reply>>,
    /// How long an acquire takes to answer (a DC holding a waiting acquire).
    acquire_delay: Mutex<Duration>,
    /// How many cancels go unanswered (lost on the way) before one is answered.
    cancels_lost: Mutex<usize>,
    log: Mutex<Vec<(Duration, Request)>>,
    start: Instant,
}

impl MemoryDc {
    fn new(start: Instant) -> Arc<MemoryDc> {
        Arc::new(MemoryDc {
            mode: Mutex::new(Mode::Answer),
            acquire: Mutex::new(None),
            acquire_delay: Mutex::new(Duration::ZERO),
            cancels_lost: Mutex::new(0),
            log: Mutex::new(Vec::new()),
            start,
        })
    }

    fn set(&self, mode: Mode) {
        *self.mode.lock().unwrap() = mode;
    }

    fn renewals(&self) -> Vec<Duration> {
        self.log
            .lock()
            .unwrap()
            .iter()
            .filter(|(_, r)| matches!(r, Request::Renew { .. }))
            .map(|(at, _)| *at)
            .collect()
    }

    fn count(&self, kind: &str) -> usize {
        self.log
            .lock()
            .unwrap()
            .iter()
            .filter(|(_, r)| r.kind() == kind)
            .count()
    }
}

#[async_trait]
impl LeaseTransport for MemoryDc {
    async fn send(&self, request: Request) -> Result<Reply, String> {
        self.log
            .lock()
            .unwrap()
            .push((self.start.elapsed(), request.clone()));
        let policy = LeasePolicy::DEFAULT;
        let mode = *self.mode.lock().unwrap();
        if matches!(request, Request::Acquire { .. }) {
            let delay = *self.acquire_delay.lock().unwrap();
            tokio::time::sleep(delay).await;
        }
        match request {
            Request::Acquire {
                config, host_time, ..
            } => Ok(self
                .acquire
                .lock()
                .unwrap()
                .clone()
                .unwrap_or(Reply::Acquire(AcquireReply::Acquired(Grant {
                    key: config.key(0),
                    reservation: "iad.1".parse().unwrap(),
                    token: FencingToken::new(3),
                    deadlines: policy.grant(host_time, StoreTime::from_ms(0)).deadlines,
                    previous: None,
                })))),
            Request::Renew { host_time, .. } => match mode {
                Mode::Answer => Ok(Reply::Renew(RenewReply::Renewed(
                    policy.grant(host_time, StoreTime::from_ms(0)).deadlines,
                ))),
                Mode::Silent => std::future::pending().await,
                Mode::Refuse => Ok(Reply::Error(ErrorReply::new(ErrorKind::Overloaded, "busy"))),
                Mode::Draining => Ok(Reply::Renew(RenewReply::Draining)),
                Mode::Stale => Ok(Reply::Renew(RenewReply::StaleToken {
                    current: FencingToken::new(4),
                })),
                Mode::Expired => Ok(Reply::Renew(RenewReply::Expired)),
            },
            Request::Release { .. } => Ok(Reply::Release(ReleaseReply::Released)),
            Request::Cancel { .. } => {
                let lost = {
                    let mut lost = self.cancels_lost.lock().unwrap();
                    let now = *lost > 0;
                    *lost = lost.saturating_sub(1);
                    now
                };
                if lost {
                    std::future::pending::<()>().await;
                }
                Ok(Reply::Cancelled(true))
            }
            other => Err(format!("unexpected {}", other.kind())),
        }
    }
}

/// The host clock: an arbitrary epoch far from the DC's, advancing with tokio time.
struct TokioClock {
    start: Instant,
}

impl HostClock for TokioClock {
    fn now(&self) -> HostTime {
        HostTime::from_ms(5_000_000 + self.start.elapsed().as_millis() as u64)
    }
}

/// Records when each callback ran, relative to the test's start.
struct Recorder {
    start: Instant,
    calls: Mutex<Vec<(&'static str, Duration)>>,
}

impl Actor for Recorder {
    fn on_soft_terminate(&self) {
        self.calls
            .lock()
            .unwrap()
            .push(("soft", self.start.elapsed()));
    }
    fn on_hard_terminate(&self) {
        self.calls
            .lock()
            .unwrap()
            .push(("hard", self.start.elapsed()));
    }
}

impl Recorder {
    fn calls(&self) -> Vec<(&'static str, u128)> {
        self.calls
            .lock()
            .unwrap()
            .iter()
            .map(|(what, at)| (*what, at.as_millis()))
            .collect()
    }
}

fn config() -> HostAgentConfig {
    let peer = Peer {
        addr: "127.0.0.1:9".parse().unwrap(),
        dc: DcId::new("iad").unwrap(),
    };
    HostAgentConfig::new(
        peer,
        KeyConfig::named(KeyName::new("room").unwrap()),
        ActorId::new("10.1.0.7:9000").unwrap(),
    )
}

struct Harness {
    dc: Arc<MemoryDc>,
    actor: Arc<Recorder>,
}

async fn start() -> (HostAgent, Harness) {
    let (started, harness) = start_raw().await;
    match started {
        AcquireReply::Acquired(agent) => (agent, harness),
        other => panic!("{other:?}"),
    }
}

async fn start_raw() -> (Started, Harness) {
    let now = Instant::now();
    let dc = MemoryDc::new(now);
    start_on(dc, config()).await.unwrap()
}

async fn start_on(
    dc: Arc<MemoryDc>,
    config: HostAgentConfig,
) -> Result<(Started, Harness), AgentError> {
    let now = dc.start;
    let actor = Arc::new(Recorder {
        start: now,
        calls: Mutex::new(Vec::new()),
    });
    let started = HostAgent::start_with(
        dc.clone(),
        Arc::new(TokioClock { start: now }),
        config,
        actor.clone(),
    )
    .await?;
    Ok((started, Harness { dc, actor }))
}

async fn sleep_ms(ms: u64) {
    tokio::time::sleep(Duration::from_millis(ms)).await;
}

#[tokio::test(start_paused = true)]
async fn lease_renewals_that_succeed_keep_the_actor_running_over_several_ttls() {
    let (agent, h) = start().await;
    sleep_ms(50_000).await;
    assert_eq!(agent.state(), AgentState::Holding);
    assert!(h.actor.calls().is_empty(), "{:?}", h.actor.calls());
    // Every 3.33 s, at the deadline the last renewal gave, to the millisecond.
    let renewals: Vec<u128> = h.dc.renewals().iter().map(|d| d.as_millis()).collect();
    assert_eq!(renewals.len(), 15, "{renewals:?}");
    for (n, at) in renewals.iter().enumerate() {
        assert_eq!(*at, 3_330 * (n as u128 + 1), "{renewals:?}");
    }
    assert_eq!(agent.token(), FencingToken::new(3));
}

#[tokio::test(start_paused = true)]
async fn lease_a_silent_dc_soft_then_hard_terminates_at_the_deadlines() {
    let (agent, h) = start().await;
    h.dc.set(Mode::Silent);
    let mut state = agent.watch_state();
    sleep_ms(20_000).await;
    assert_eq!(h.actor.calls(), vec![("soft", 7_000), ("hard", 8_999)]);
    assert_eq!(agent.state(), AgentState::HardTerminated);
    assert_eq!(*state.borrow_and_update(), AgentState::HardTerminated);
    // Retries were bounded by the soft deadline; none after it.
    let renewals = h.dc.renewals();
    assert_eq!(renewals.first().map(|d| d.as_millis()), Some(3_330));
    assert!(renewals.len() >= 2, "{renewals:?}");
    assert!(
        renewals.iter().all(|d| d.as_millis() < 7_000),
        "{renewals:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn lease_failed_renewals_are_retried_and_a_late_success_moves_the_deadlines() {
    let (agent, h) = start().await;
    h.dc.set(Mode::Refuse);
    sleep_ms(5_000).await;
    h.dc.set(Mode::Answer);
    sleep_ms(30_000).await;
    assert!(h.actor.calls().is_empty(), "{:?}", h.actor.calls());
    assert_eq!(agent.state(), AgentState::Holding);
    let refused: Vec<u128> =
        h.dc.renewals()
            .iter()
            .map(|d| d.as_millis())
            .take_while(|ms| *ms < 5_000)
            .collect();
    // 3330, then every 250 ms (the default retry interval).
    assert_eq!(refused.first(), Some(&3_330));
    assert!(
        refused.windows(2).all(|w| w[1] - w[0] == 250),
        "{refused:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn lease_draining_stops_renewals_and_terminates_at_the_last_deadlines() {
    let (agent, h) = start().await;
    // The renewal at 3.33 s succeeds: deadlines move to 6.66 / 10.33 / 12.33 s.
    sleep_ms(4_000).await;
    h.dc.set(Mode::Draining);
    sleep_ms(20_000).await;
    assert_eq!(h.actor.calls(), vec![("soft", 10_330), ("hard", 12_329)]);
    let renewals: Vec<u128> = h.dc.renewals().iter().map(|d| d.as_millis()).collect();
    assert_eq!(renewals, vec![3_330, 6_660], "no renewal after Draining");
    assert_eq!(agent.state(), AgentState::HardTerminated);
}

#[tokio::test(start_paused = true)]
async fn lease_a_stale_token_or_expired_answer_hard_terminates_at_once() {
    for mode in [Mode::Stale, Mode::Expired] {
        let (agent, h) = start().await;
        h.dc.set(mode);
        sleep_ms(20_000).await;
        assert_eq!(h.actor.calls(), vec![("hard", 3_330)], "{mode:?}");
        assert_eq!(h.dc.renewals().len(), 1, "{mode:?}");
        assert_eq!(agent.state(), AgentState::HardTerminated);
    }
}

#[tokio::test(start_paused = true)]
async fn lease_stop_releases_with_the_token_and_calls_no_callback() {
    let (agent, h) = start().await;
    sleep_ms(5_000).await;
    let state = agent.watch_state();
    agent.stop().await.unwrap();
    assert_eq!(*state.borrow(), AgentState::Released);
    let log = h.dc.log.lock().unwrap().clone();
    match log.last() {
        Some((
            _,
            Request::Release {
                reservation, token, ..
            },
        )) => {
            assert_eq!(
                (reservation.to_string().as_str(), *token),
                ("iad.1", FencingToken::new(3))
            );
        }
        other => panic!("{other:?}"),
    }
    sleep_ms(30_000).await;
    assert_eq!(h.dc.count("renew"), 1, "no renewal after stop");
    assert!(h.actor.calls().is_empty());
}

#[tokio::test(start_paused = true)]
async fn lease_a_waiting_acquire_gets_its_wait_on_top_of_the_request_timeout() {
    // The DC holds the acquire for 5 s (a busy key being awaited); the
    // request timeout is 2 s.
    let slow = || {
        let dc = MemoryDc::new(Instant::now());
        *dc.acquire_delay.lock().unwrap() = Duration::from_secs(5);
        dc
    };
    let impatient = start_on(slow(), config()).await;
    assert!(
        matches!(impatient, Err(AgentError::Unavailable { .. })),
        "without wait_ms the 2 s timeout applies"
    );
    let mut waiting = config();
    waiting.wait_ms = 10_000;
    let dc = slow();
    let (started, h) = start_on(dc, waiting).await.unwrap();
    assert!(matches!(started, AcquireReply::Acquired(_)));
    match h.dc.log.lock().unwrap().first() {
        Some((_, Request::Acquire { wait_ms, .. })) => assert_eq!(*wait_ms, 10_000),
        other => panic!("{other:?}"),
    }
}

#[tokio::test(start_paused = true)]
async fn lease_a_cancel_lost_like_its_acquire_is_sent_again_until_answered() {
    // Every try of the acquire goes unanswered, and so do the first two
    // cancels: the third, sent in the background, is answered.
    let dc = MemoryDc::new(Instant::now());
    *dc.acquire_delay.lock().unwrap() = Duration::from_secs(3_600);
    *dc.cancels_lost.lock().unwrap() = 2;
    let started = Instant::now();
    let gave_up = start_on(dc.clone(), config()).await;
    assert!(matches!(gave_up, Err(AgentError::Unavailable { .. })));
    // Three 2 s acquire tries and the first cancel's 2 s: the caller is
    // told then, not after the cancel's resends.
    assert_eq!(started.elapsed(), Duration::from_secs(8));
    assert_eq!(dc.count("cancel"), 1);
    // Resent 250 ms after the first timed out, and again 500 ms after the
    // second timed out (2 s later): answered, and never sent again.
    sleep_ms(260).await;
    assert_eq!(dc.count("cancel"), 2);
    sleep_ms(2_000 + 500).await;
    assert_eq!(dc.count("cancel"), 3);
    sleep_ms(60_000).await;
    assert_eq!(dc.count("cancel"), 3);
}

#[tokio::test(start_paused = true)]
async fn lease_stop_with_a_failure_sends_the_reason_and_the_next_holder_sees_it() {
    let reason = homing_core::FailureReason::new("lost the game state").unwrap();
    let previous = homing_core::PreviousRun {
        reservation: "iad.1".parse().unwrap(),
        token: FencingToken::new(2),
        ended: homing_core::ReleaseCause::Released(homing_core::RunOutcome::Failed {
            reason: reason.clone(),
        }),
    };
    let dc = MemoryDc::new(Instant::now());
    *dc.acquire.lock().unwrap() = Some(Reply::Acquire(AcquireReply::Acquired(Grant {
        key: homing_core::Key::new(KeyName::new("room").unwrap()),
        reservation: "iad.1".parse().unwrap(),
        token: FencingToken::new(3),
        deadlines: LeasePolicy::DEFAULT
            .grant(HostTime::from_ms(5_000_000), StoreTime::from_ms(0))
            .deadlines,
        previous: Some(previous.clone()),
    })));
    let (started, h) = start_on(dc, config()).await.unwrap();
    let AcquireReply::Acquired(agent) = started else {
        panic!("not holding");
    };
    assert_eq!(agent.previous(), Some(&previous));
    let failed = homing_core::RunOutcome::Failed { reason };
    agent.stop_with(failed.clone()).await.unwrap();
    match h.dc.log.lock().unwrap().last() {
        Some((_, Request::Release { outcome, .. })) => assert_eq!(outcome, &failed),
        other => panic!("{other:?}"),
    }
}

/// A grant that arrives at or after its soft deadline (here: deadlines from
/// a DC that answered long after the host sent) is never held: the agent
/// releases it and the start fails as `Unavailable`, so nothing runs on it.
#[tokio::test(start_paused = true)]
async fn lease_a_grant_arriving_after_its_soft_deadline_is_released_not_held() {
    let dc = MemoryDc::new(Instant::now());
    *dc.acquire.lock().unwrap() = Some(Reply::Acquire(AcquireReply::Acquired(Grant {
        key: homing_core::Key::new(KeyName::new("room").unwrap()),
        reservation: "iad.1".parse().unwrap(),
        token: FencingToken::new(1),
        // Granted for a request sent 8 s before the one this host sent.
        deadlines: LeasePolicy::DEFAULT
            .grant(HostTime::from_ms(4_992_000), StoreTime::from_ms(0))
            .deadlines,
        previous: None,
    })));
    let Err(error) = start_on(dc.clone(), config()).await else {
        panic!("a late grant must not be held");
    };
    assert!(
        matches!(&error, AgentError::Unavailable { reason, .. } if reason.contains("soft deadline")),
        "{error}"
    );
    assert_eq!(dc.count("release"), 1, "the late grant is given back");
}

#[tokio::test(start_paused = true)]
async fn lease_stop_does_not_wait_for_a_hanging_renewal() {
    let (agent, h) = start().await;
    h.dc.set(Mode::Silent);
    sleep_ms(3_400).await; // a renewal is in flight and will never be answered
    let before = Instant::now();
    agent.stop().await.unwrap();
    assert!(
        before.elapsed() < Duration::from_millis(10),
        "{:?}",
        before.elapsed()
    );
    assert_eq!(h.dc.count("release"), 1);
}

#[tokio::test(start_paused = true)]
async fn lease_a_dropped_agent_stops_renewing_but_still_terminates_the_actor() {
    let (agent, h) = start().await;
    drop(agent);
    sleep_ms(20_000).await;
    assert_eq!(h.dc.count("renew"), 0);
    assert_eq!(h.actor.calls(), vec![("soft", 7_000), ("hard", 8_999)]);
}

#[tokio::test(start_paused = true)]
async fn lease_connect_returns_the_live_actor_elsewhere_or_a_tag_mismatch() {
    let now = Instant::now();
    let dc = MemoryDc::new(now);
    let actor = Arc::new(Recorder {
        start: now,
        calls: Mutex::new(Vec::new()),
    });
    let clock = Arc::new(TokioClock { start: now });
    let fra7: ReservationId = "fra.7".parse().unwrap();
    *dc.acquire.lock().unwrap() = Some(Reply::Acquire(AcquireReply::HeldElsewhere(Holder {
        key: homing_core::Key::new(KeyName::new("room").unwrap()),
        reservation: fra7.clone(),
        actor: ActorId::new("10.2.0.1:9000").unwrap(),
        token: FencingToken::new(9),
    })));
    match HostAgent::start_with(dc.clone(), clock.clone(), config(), actor.clone())
        .await
        .unwrap()
    {
        AcquireReply::HeldElsewhere(Holder {
            reservation, token, ..
        }) => assert_eq!((reservation, token), (fra7, FencingToken::new(9))),
        other => panic!("{other:?}"),
    }
    *dc.acquire.lock().unwrap() =
        Some(Reply::Acquire(AcquireReply::TagMismatch { existing: None }));
    assert!(matches!(
        HostAgent::start_with(dc.clone(), clock.clone(), config(), actor.clone())
            .await
            .unwrap(),
        AcquireReply::TagMismatch { existing: None }
    ));
    *dc.acquire.lock().unwrap() =
        Some(Reply::Error(ErrorReply::new(ErrorKind::Unauthorized, "no")));
    assert!(matches!(
        HostAgent::start_with(dc, clock, config(), actor).await,
        Err(AgentError::Refused { .. })
    ));
}

// ---- real QUIC, real time ----

/// 600 ms leases: renew at 199 ms, soft stop at 400 ms, hard at 500 ms.
fn short_policy() -> LeasePolicy {
    LeasePolicy::new(600, 333, 200, 100, 100).unwrap()
}

async fn quic_agent(ca: &DevCa, dc: &TestDc, actor: Arc<Recorder>) -> HostAgent {
    *dc.script.policy.lock().unwrap() = Some(short_policy());
    let config = HostAgentConfig {
        request_timeout_ms: 150,
        retry_interval_ms: 50,
        ..HostAgentConfig::new(
            dc.peer(),
            KeyConfig::named(KeyName::new("room").unwrap()),
            ActorId::new("a").unwrap(),
        )
    };
    match HostAgent::start(client(ca, Role::Host, Some("iad")), config, actor)
        .await
        .unwrap()
    {
        AcquireReply::Acquired(agent) => agent,
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn quic_a_host_acquires_renews_and_releases_over_quic() {
    let ca = DevCa::generate("test ca").unwrap();
    let iad = TestDc::start(&ca, "iad").await;
    let actor = Arc::new(Recorder {
        start: Instant::now(),
        calls: Mutex::new(Vec::new()),
    });
    let agent = quic_agent(&ca, &iad, actor.clone()).await;
    assert_eq!(agent.reservation().to_string(), "iad.1");
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    assert_eq!(agent.state(), AgentState::Holding);
    assert!(actor.calls().is_empty(), "{:?}", actor.calls());
    assert!(
        iad.script.count("renew") >= 4,
        "renewals: {}",
        iad.script.count("renew")
    );
    agent.stop().await.unwrap();
    assert_eq!(iad.script.count("release"), 1);
}

#[tokio::test]
async fn quic_a_daemon_that_stops_answering_gets_the_actor_soft_then_hard_terminated() {
    let ca = DevCa::generate("test ca").unwrap();
    let iad = TestDc::start(&ca, "iad").await;
    let actor = Arc::new(Recorder {
        start: Instant::now(),
        calls: Mutex::new(Vec::new()),
    });
    let agent = quic_agent(&ca, &iad, actor.clone()).await;
    iad.script.silent.store(true, Ordering::SeqCst);
    let mut state = agent.watch_state();
    tokio::time::timeout(
        Duration::from_secs(5),
        state.wait_for(|s| *s == AgentState::HardTerminated),
    )
    .await
    .expect("hard termination within the lease")
    .unwrap();
    let calls = actor.calls();
    assert_eq!(
        calls.iter().map(|(what, _)| *what).collect::<Vec<_>>(),
        vec!["soft", "hard"]
    );
    // Hard at 500 ms after the acquire was sent (the recorder started a little earlier).
    assert!(calls[1].1 < 1_000, "{calls:?}");
}

/// A DC served by two homingd: the agent's homingd stops answering after
/// the grant; its renewal times out there, the next attempt goes to the
/// other homingd, and the actor runs on untouched through several lease
/// lengths (without the move to the next homingd it is soft- then
/// hard-terminated within one).
#[tokio::test]
async fn quic_a_host_renews_through_the_dcs_other_homingd_when_its_own_goes_silent() {
    let (first, second, agent, actor) = held_through_two_homingd(150).await;
    first.script.silent.store(true, Ordering::SeqCst);
    // Three renewals answered by the second homingd: past a whole lease.
    renewals_reach(&second, 3).await;
    assert_eq!(agent.state(), AgentState::Holding);
    assert!(actor.calls().is_empty(), "{:?}", actor.calls());
    agent.stop().await.unwrap();
    assert_eq!(second.script.count("release"), 1);
}

/// A stop while a renewal is under way at the DC's other homingd: the
/// renewal task exits and drops it unanswered, which moves the transport
/// on to the next homingd — the silent first one. The release must still
/// reach a homingd that answers (found by CI on a loaded machine: the
/// release went once, to the silent homingd, and `stop` failed).
#[tokio::test]
async fn quic_a_hosts_release_reaches_an_answering_homingd_after_a_renewal_in_flight_is_dropped() {
    // A request timeout long enough that the renewal held below is still
    // in flight when the stop drops it.
    let (first, second, agent, _actor) = held_through_two_homingd(400).await;
    first.script.silent.store(true, Ordering::SeqCst);
    // Renewals move to the second homingd.
    renewals_reach(&second, 1).await;
    // The next renewal is held at the second homingd until after the stop.
    second.script.delay_ms.store(300, Ordering::SeqCst);
    renewals_reach(&second, 2).await;
    second.script.delay_ms.store(0, Ordering::SeqCst);
    agent.stop().await.unwrap();
    assert_eq!(second.script.count("release"), 1);
}

/// Waits until `dc` has received `n` renewals.
async fn renewals_reach(dc: &TestDc, n: u32) {
    tokio::time::timeout(Duration::from_secs(20), async {
        while dc.script.count("renew") < n {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .expect("renewals reach the homingd");
}

/// A host of iad holding "room" through the first of iad's two scripted
/// homingd, the second its alternate: 3 s leases (renew at ~1 s, soft stop
/// 2 s after the send), requests given up after `request_timeout_ms`.
async fn held_through_two_homingd(
    request_timeout_ms: u64,
) -> (TestDc, TestDc, HostAgent, Arc<Recorder>) {
    let ca = DevCa::generate("test ca").unwrap();
    let first = TestDc::start(&ca, "iad").await;
    let second = TestDc::start(&ca, "iad").await;
    let policy = LeasePolicy::new(3_000, 333, 1_000, 500, 100).unwrap();
    for dc in [&first, &second] {
        *dc.script.policy.lock().unwrap() = Some(policy);
    }
    let actor = Arc::new(Recorder {
        start: Instant::now(),
        calls: Mutex::new(Vec::new()),
    });
    let config = HostAgentConfig {
        request_timeout_ms,
        retry_interval_ms: 50,
        alternates: vec![second.peer().addr],
        ..HostAgentConfig::new(
            first.peer(),
            KeyConfig::named(KeyName::new("room").unwrap()),
            ActorId::new("a").unwrap(),
        )
    };
    let started = HostAgent::start(client(&ca, Role::Host, Some("iad")), config, actor.clone());
    let AcquireReply::Acquired(agent) = started.await.unwrap() else {
        panic!("expected a grant");
    };
    (first, second, agent, actor)
}
