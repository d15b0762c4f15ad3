//! Lease keys end to end (DESIGN.md §7.3), against a real `homingd` process
//! (one DC, redb): a `HostAgent` whose acquire reply is lost on the way back
//! sends the acquire again with the same lease key and gets the grant the
//! DC already made — the same reservation and token — not `HeldElsewhere`
//! naming its own actor; one that never hears back cancels by lease key and
//! the DC releases the grant at once, so the next host takes the key with
//! no wait for expiry; a second host that knows the holder's token (any
//! `HeldElsewhere` tells it) but not its lease key renews and releases
//! nothing. The reply is lost in the host's transport (the DC
//! processed the request and answered), so the test waits on nothing but
//! the answers.

#![cfg(feature = "etcd")]

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use homing_client::{
    Actor, AgentError, HostAgent, HostAgentConfig, LeaseTransport, QuicTransport, SystemClock,
};
use homing_core::{
    AcquireReply, ActorId, Grant, Holder, KeyConfig, KeyName, LeasePolicy, RecordState,
    ReleaseCause, ReleaseReply, RenewReply, Reply, Request, Role, RunOutcome,
};
use homing_e2e::cluster::{acquire, host_now, lease_of};
use homing_e2e::lone_dc::LoneDc;
use homing_net::Peer;
use tokio::sync::Mutex;

/// Loses the reply to the first `lose` acquires it carries (the DC served
/// them), keeping each for the test; everything else passes through.
struct LosesAcquireReplies {
    inner: QuicTransport,
    lose: u32,
    acquires: AtomicU32,
    lost: Mutex<Vec<Reply>>,
    sent: Mutex<Vec<Request>>,
}

#[async_trait]
impl LeaseTransport for LosesAcquireReplies {
    async fn send(&self, request: Request) -> Result<Reply, String> {
        self.sent.lock().await.push(request.clone());
        let acquire = matches!(request, Request::Acquire { .. });
        let reply = self.inner.send(request).await?;
        if acquire && self.acquires.fetch_add(1, Ordering::SeqCst) < self.lose {
            self.lost.lock().await.push(reply);
            return Err("the reply was lost on the way back".to_string());
        }
        Ok(reply)
    }
}

struct Idle;

impl Actor for Idle {
    fn on_soft_terminate(&self) {}
    fn on_hard_terminate(&self) {}
}

fn transport(dc: &LoneDc, lose: u32) -> Arc<LosesAcquireReplies> {
    let peer = Peer {
        addr: dc.addr(),
        dc: dc.dc(),
    };
    Arc::new(LosesAcquireReplies {
        inner: QuicTransport::new(dc.client(Role::Host), peer, &[]),
        lose,
        acquires: AtomicU32::new(0),
        lost: Mutex::new(Vec::new()),
        sent: Mutex::new(Vec::new()),
    })
}

fn config(dc: &LoneDc, name: &str, attempts: u32) -> HostAgentConfig {
    let peer = Peer {
        addr: dc.addr(),
        dc: dc.dc(),
    };
    let mut config = HostAgentConfig::new(
        peer,
        KeyConfig::named(KeyName::new(name).expect("a valid key name")),
        ActorId::new("host-1:9000").expect("a valid actor"),
    );
    config.acquire_attempts = attempts;
    config
}

async fn bounded<F: std::future::Future<Output = ()>>(f: F) {
    tokio::time::timeout(Duration::from_secs(60), f)
        .await
        .expect("scenario finished within its time bound");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_key_an_acquire_whose_reply_is_lost_is_retried_and_gets_the_same_grant() {
    bounded(async {
        let dc = LoneDc::start(LeasePolicy::DEFAULT, &[]).await;
        let transport = transport(&dc, 1);
        let started = HostAgent::start_with(
            transport.clone(),
            Arc::new(SystemClock),
            config(&dc, "retried", 3),
            Arc::new(Idle),
        )
        .await
        .expect("the retry is answered");
        let AcquireReply::Acquired(agent) = started else {
            panic!("the retry must get the grant, not {started:?}");
        };
        let lost = transport.lost.lock().await.clone();
        let [Reply::Acquire(AcquireReply::Acquired(Grant {
            reservation, token, ..
        }))] = lost.as_slice()
        else {
            panic!("the first acquire was granted and its reply lost: {lost:?}");
        };
        assert_eq!(agent.reservation(), reservation, "the same reservation");
        assert_eq!(agent.token(), *token, "the same token");
        let sent = transport.sent.lock().await.clone();
        let leases: Vec<_> = sent
            .iter()
            .filter_map(|r| match r {
                Request::Acquire { lease, .. } => Some(*lease),
                _ => None,
            })
            .collect();
        assert_eq!(leases.len(), 2, "one retry");
        assert_eq!(leases[0], leases[1], "a retry carries the same lease key");
        // Another host is told the key is held by this one.
        let other = dc
            .ask(&dc.client(Role::Host), &acquire("retried", "host-2:9000"))
            .await;
        assert!(
            matches!(&other, Reply::Acquire(AcquireReply::HeldElsewhere(h)) if h.actor.as_str() == "host-1:9000"),
            "{other:?}"
        );
        agent.stop().await.expect("the holder releases with its lease key");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_key_a_host_that_gives_up_cancels_the_grant_it_never_saw() {
    bounded(async {
        let dc = LoneDc::start(LeasePolicy::DEFAULT, &[]).await;
        let transport = transport(&dc, u32::MAX);
        let started = HostAgent::start_with(
            transport.clone(),
            Arc::new(SystemClock),
            config(&dc, "abandoned", 2),
            Arc::new(Idle),
        )
        .await;
        assert!(
            matches!(started, Err(AgentError::Unavailable { .. })),
            "no answer ever reached the host: {started:?}"
        );
        let sent = transport.sent.lock().await.clone();
        assert!(
            matches!(sent.last(), Some(Request::Cancel { .. })),
            "the host cancels after its last try: {sent:?}"
        );
        // The DC released the grant as cancelled: the next host takes the
        // key at once (the default lease is 10 s) and learns why it was free.
        let next = dc
            .ask(&dc.client(Role::Host), &acquire("abandoned", "host-2:9000"))
            .await;
        let Reply::Acquire(AcquireReply::Acquired(Grant {
            previous: Some(previous),
            ..
        })) = &next
        else {
            panic!("the cancelled grant must be free to take: {next:?}");
        };
        assert_eq!(previous.ended, ReleaseCause::Cancelled);
        // No answer shows the lease key of the live lease.
        let inspected = dc
            .ask(
                &dc.client(Role::Admin),
                &Request::Inspect {
                    key: homing_e2e::cluster::key("abandoned"),
                },
            )
            .await;
        let Reply::Inspected { records } = inspected else {
            panic!("inspect answered {inspected:?}");
        };
        assert!(records.iter().all(|r| match &r.state {
            RecordState::Active { lease, .. } => lease.is_none(),
            _ => true,
        }));
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_key_the_token_alone_renews_and_releases_nothing() {
    bounded(async {
        let dc = LoneDc::start(LeasePolicy::DEFAULT, &[]).await;
        let (holder, other) = (dc.client(Role::Host), dc.client(Role::Host));
        let granted = dc.ask(&holder, &acquire("guarded", "holder:1")).await;
        let Reply::Acquire(AcquireReply::Acquired(Grant { reservation, .. })) = granted else {
            panic!("the holder acquires: {granted:?}");
        };
        // Another host of the same DC learns the token from HeldElsewhere.
        let told = dc.ask(&other, &acquire("guarded", "other:2")).await;
        let Reply::Acquire(AcquireReply::HeldElsewhere(Holder { token, .. })) = told else {
            panic!("the other host is told who holds it: {told:?}");
        };
        let renew = Request::Renew {
            reservation: reservation.clone(),
            token,
            lease: lease_of("other:2"),
            host_time: host_now(),
        };
        assert_eq!(
            dc.ask(&other, &renew).await,
            Reply::Renew(RenewReply::NotHolder)
        );
        let release = Request::Release {
            reservation: reservation.clone(),
            token,
            lease: lease_of("other:2"),
            outcome: RunOutcome::Ok,
        };
        assert_eq!(
            dc.ask(&other, &release).await,
            Reply::Release(ReleaseReply::NotHolder)
        );
        // The holder still holds it, and renews with its own lease key.
        let renew = Request::Renew {
            reservation,
            token,
            lease: lease_of("holder:1"),
            host_time: host_now(),
        };
        assert!(matches!(
            dc.ask(&holder, &renew).await,
            Reply::Renew(RenewReply::Renewed(_))
        ));
    })
    .await;
}
