//! Lifecycle events and waiting acquires across real `homingd` processes:
//! a watcher that follows a DC through two `kill -9`s (one while it is
//! parked in a long poll, one during a burst of writes) and misses nothing,
//! a new watcher resuming from a persisted cursor, a namespace subtree
//! watch, and acquirers in one DC that wait for a key held in another —
//! until the holder's lease expires, until it releases as failed, and
//! across a SIGKILL and restart of the holder's DC. Each test starts its own
//! cluster and is bounded in time; tests skip only when etcd is missing.

#![cfg(feature = "etcd")]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use homing_client::Watcher;
use homing_core::{AcquireReply, Grant, Holder};
use homing_core::{
    ActorId, DcId, Deadlines, ErrorKind, Event, EventSeq, FailureReason, FencingToken, Key,
    KeyConfig, KeyName, LeasePolicy, Namespace, NamespaceScope, PreviousRun, ReleaseCause,
    ReleaseReply, Reply, Request, ReservationId, Role, RunOutcome,
};
use homing_e2e::cluster::{Cluster, dc, host_now, sleep_ms};
use homing_e2e::event_log::{Ack, Ledger};
use homing_e2e::{ClusterOptions, start_or_skip};
use homing_net::{Client, NetError, Peer};

/// Upper bound on any one scenario, so a hang fails instead of stalling CI.
const SCENARIO_TIMEOUT: Duration = Duration::from_secs(60);
/// How long the watchers' long polls wait at the DC: short, so a poll
/// parked on a connection to a killed process is given up soon (a restarted
/// process cannot tell the client that connection is gone).
const WATCH_WAIT_MS: u32 = 1_500;
/// The watchers' request timeout (on top of their wait): a poll parked on
/// a killed daemon's connection is given up after both.
const WATCH_REQUEST_TIMEOUT_MS: u64 = 1_000;
/// Longest a watcher may take to hand out an event the test expects.
const CATCH_UP: Duration = Duration::from_secs(20);
/// The namespaces the workload writes in: a subtree (`games/eu`), its
/// parent, and siblings whose names share its prefix.
const NAMESPACES: [&str; 6] = [
    "",
    "games",
    "games/eu",
    "games/eu/lobbies",
    "games/euw",
    "gamesx",
];
/// The subtree one watcher follows.
const SUBTREE: &str = "games/eu";

async fn bounded<F: std::future::Future<Output = ()>>(f: F) {
    tokio::time::timeout(SCENARIO_TIMEOUT, f)
        .await
        .expect("scenario finished within its time bound");
}

fn key_in(namespace: &str, name: &str) -> Key {
    Key::in_namespace(
        Namespace::new(namespace).expect("a valid namespace"),
        KeyName::new(name).expect("a valid key name"),
    )
}

fn actor(name: &str) -> ActorId {
    ActorId::new(name).expect("a valid actor id")
}

fn failed(reason: &str) -> RunOutcome {
    RunOutcome::Failed {
        reason: FailureReason::new(reason).expect("a valid failure reason"),
    }
}

/// An `Acquire` of `key` for `actor`, sent now, waiting up to `wait_ms`.
fn acquire(key: &Key, actor: &ActorId, wait_ms: u32) -> Request {
    Request::Acquire {
        lease: homing_e2e::cluster::lease_of(actor.as_str()),
        config: KeyConfig {
            name: Some(key.name.clone()),
            namespace: key.namespace.clone(),
            tag: None,
        },
        actor: actor.clone(),
        host_time: host_now(),
        wait_ms,
    }
}

// ---------------------------------------------------------------------------
// Watch resume after kill -9
// ---------------------------------------------------------------------------

/// What a watcher task handed out so far, and its cursor after them.
#[derive(Debug, Clone, Default)]
struct Seen {
    events: Vec<Event>,
    cursor: EventSeq,
}

type SharedSeen = Arc<Mutex<Seen>>;

/// Runs `watcher` in a task that records every event it hands out.
fn follow(mut watcher: Watcher) -> (SharedSeen, tokio::task::JoinHandle<()>) {
    let seen = SharedSeen::default();
    let record = seen.clone();
    let task = tokio::spawn(async move {
        loop {
            match watcher.next().await {
                Ok(event) => {
                    let mut seen = record.lock().unwrap();
                    seen.events.push(event);
                    seen.cursor = watcher.cursor();
                }
                Err(e) => panic!("the watch of {} ended: {e}", watcher.dc()),
            }
        }
    });
    (seen, task)
}

/// Waits until the watcher handed out an event `done` accepts; returns the
/// events up to and including it.
async fn until_seen(seen: &SharedSeen, what: &str, done: impl Fn(&Event) -> bool) -> Vec<Event> {
    let started = Instant::now();
    loop {
        {
            let seen = seen.lock().unwrap();
            if let Some(at) = seen.events.iter().position(&done) {
                return seen.events[..=at].to_vec();
            }
        }
        assert!(
            started.elapsed() < CATCH_UP,
            "the watcher did not hand out {what} within {CATCH_UP:?}; it saw {:#?}",
            seen.lock().unwrap().events
        );
        sleep_ms(20).await;
    }
}

/// Waits until `seen` handed out the event of the last change `ledger`
/// has acknowledged in `at`; returns the events up to it.
async fn synced(ledger: &Ledger, seen: &SharedSeen, at: &DcId) -> Vec<Event> {
    let last: Ack = ledger.last_of(at).expect("a change in this dc").clone();
    until_seen(seen, &format!("{last:?}"), |e| last.matches(e)).await
}

/// A sequential workload on a cluster: every reply it gets goes into its ledger.
struct Driver {
    /// A host client per DC.
    hosts: std::collections::BTreeMap<DcId, Client>,
    ledger: Ledger,
}

/// Attempts of one driver request before the test fails (a DC's peers need
/// up to a peer timeout to drop their connection to a killed process).
const DRIVER_ATTEMPTS: usize = 10;

impl Driver {
    fn new(cluster: &Cluster) -> Driver {
        let mut driver = Driver {
            hosts: Default::default(),
            ledger: Ledger::new(),
        };
        for at in ["iad", "fra"] {
            driver.reconnect(cluster, &dc(at));
        }
        driver
    }

    /// A fresh host client for `at` (its old connection died with the process).
    fn reconnect(&mut self, cluster: &Cluster, at: &DcId) {
        self.hosts.insert(at.clone(), cluster.host(at));
    }

    /// Acquires `key` at `at` for `actor`; retries what got no answer.
    async fn acquire(
        &mut self,
        cluster: &Cluster,
        at: &DcId,
        key: &Key,
        actor: &ActorId,
    ) -> (ReservationId, FencingToken) {
        for _ in 0..DRIVER_ATTEMPTS {
            let reply = cluster
                .ask(&self.hosts[at], at, &acquire(key, actor, 0))
                .await;
            match reply {
                Ok(reply @ Reply::Acquire(AcquireReply::Acquired(_))) => {
                    self.ledger.acquired(key, actor, &reply);
                    let Reply::Acquire(AcquireReply::Acquired(Grant {
                        reservation, token, ..
                    })) = reply
                    else {
                        unreachable!("matched above")
                    };
                    return (reservation, token);
                }
                Ok(Reply::Error(e)) if matches!(e.kind, ErrorKind::Unavailable { .. }) => {}
                Err(_) => {}
                Ok(other) => panic!("acquire {key} at {at}: {other:?}"),
            }
            // No answer, or a peer DC was unreachable: it may have written.
            self.ledger.in_flight(key);
            sleep_ms(300).await;
        }
        panic!(
            "acquire {key} at {at} failed {DRIVER_ATTEMPTS} times\n{}",
            cluster.logs()
        );
    }

    /// Releases `reservation` (of `key`), held by `actor`, at its DC with `outcome`.
    async fn release(
        &mut self,
        cluster: &Cluster,
        key: &Key,
        (reservation, token): &(ReservationId, FencingToken),
        actor: &str,
        outcome: RunOutcome,
    ) {
        let (at, token) = (reservation.dc().clone(), *token);
        let request = Request::Release {
            lease: homing_e2e::cluster::lease_of(actor),
            reservation: reservation.clone(),
            token,
            outcome: outcome.clone(),
        };
        for _ in 0..DRIVER_ATTEMPTS {
            match cluster.ask(&self.hosts[&at], &at, &request).await {
                Ok(Reply::Release(ReleaseReply::Released)) => {
                    self.ledger.released(key, reservation, token, outcome);
                    return;
                }
                Err(_) => {
                    self.ledger.in_flight(key);
                    sleep_ms(300).await;
                }
                other => panic!("release {reservation}: {other:?}"),
            }
        }
        panic!("release {reservation} failed {DRIVER_ATTEMPTS} times");
    }

    /// One round in every namespace: acquire in iad, release (`Ok` or
    /// `Failed`), re-activate in iad, release, recreate in fra (a link in
    /// iad), release there and recreate in iad again (a link in fra); plus
    /// a key only fra ever holds.
    async fn round(&mut self, cluster: &Cluster, round: usize) {
        let (iad, fra) = (dc("iad"), dc("fra"));
        for (i, ns) in NAMESPACES.iter().enumerate() {
            let key = key_in(ns, &format!("room-{round}-{i}"));
            let outcome = |step: usize| {
                if (i + step).is_multiple_of(2) {
                    RunOutcome::Ok
                } else {
                    failed(&format!("round {round} step {step}: exit code 137"))
                }
            };
            let first = self
                .acquire(cluster, &iad, &key, &actor("10.0.1.1:1"))
                .await;
            self.release(cluster, &key, &first, "10.0.1.1:1", outcome(0))
                .await;
            let again = self
                .acquire(cluster, &iad, &key, &actor("10.0.1.2:1"))
                .await;
            assert_eq!(again, (first.0, first.1.next()), "re-activated in place");
            self.release(cluster, &key, &again, "10.0.1.2:1", outcome(1))
                .await;
            let moved = self
                .acquire(cluster, &fra, &key, &actor("10.0.2.1:1"))
                .await;
            assert_eq!(moved.0.dc(), &fra, "recreated in fra");
            self.release(cluster, &key, &moved, "10.0.2.1:1", outcome(2))
                .await;
            let back = self
                .acquire(cluster, &iad, &key, &actor("10.0.1.3:1"))
                .await;
            assert_eq!(back.0.dc(), &iad, "recreated in iad");
            let elsewhere = key_in(ns, &format!("fra-only-{round}-{i}"));
            self.acquire(cluster, &fra, &elsewhere, &actor("10.0.2.2:1"))
                .await;
        }
    }
}

/// Writers racing the kill: acquire and release in iad until a request gets
/// no answer. Returns what they were told.
fn burst_writer(
    host: Client,
    peer: Peer,
    w: usize,
    acks: Arc<AtomicUsize>,
) -> tokio::task::JoinHandle<Ledger> {
    tokio::spawn(async move {
        let mut ledger = Ledger::new();
        let bound = Duration::from_secs(2);
        let holder = actor("10.0.9.9:1");
        for n in 0.. {
            let key = key_in(NAMESPACES[n % NAMESPACES.len()], &format!("burst-{w}-{n}"));
            let reply =
                tokio::time::timeout(bound, host.request(&peer, &acquire(&key, &holder, 0))).await;
            let Ok(Ok(reply @ Reply::Acquire(AcquireReply::Acquired(_)))) = reply else {
                ledger.in_flight(&key);
                return ledger;
            };
            ledger.acquired(&key, &holder, &reply);
            acks.fetch_add(1, Ordering::Relaxed);
            let Reply::Acquire(AcquireReply::Acquired(Grant {
                reservation, token, ..
            })) = reply
            else {
                unreachable!("matched above")
            };
            let outcome = if n.is_multiple_of(2) {
                RunOutcome::Ok
            } else {
                failed(&format!("burst {w}-{n}"))
            };
            let release = Request::Release {
                lease: homing_e2e::cluster::lease_of("10.0.9.9:1"),
                reservation: reservation.clone(),
                token,
                outcome: outcome.clone(),
            };
            match tokio::time::timeout(bound, host.request(&peer, &release)).await {
                Ok(Ok(Reply::Release(ReleaseReply::Released))) => {
                    ledger.released(&key, &reservation, token, outcome);
                    acks.fetch_add(1, Ordering::Relaxed);
                }
                _ => {
                    ledger.in_flight(&key);
                    return ledger;
                }
            }
        }
        unreachable!("the loop only ends by returning")
    })
}

/// A watcher on `at` in `scope` from `cursor`, through a fresh router client.
fn watcher(cluster: &Cluster, at: &DcId, scope: NamespaceScope, cursor: EventSeq) -> Watcher {
    let router = cluster.client_with_timeout(Role::Router, None, WATCH_REQUEST_TIMEOUT_MS);
    Watcher::new(router, cluster.peer(at), scope, cursor).with_wait_ms(WATCH_WAIT_MS)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_resumes_across_two_sigkills_of_its_dc_with_every_acknowledged_change_exactly_once() {
    // Leases outlive the test, so no expiry adds events the workload did not ask for.
    let lease = LeasePolicy::new(60_000, 333, 3_000, 1_000, 2_000).expect("an ordered policy");
    let options = ClusterOptions::default()
        .with_lease(lease)
        .with_arg("--peer-timeout-ms=1000");
    let Some(mut cluster) = start_or_skip("watch_resume", options).await else {
        return;
    };
    let started = Instant::now();
    bounded(async {
        let (iad, fra) = (dc("iad"), dc("fra"));
        let everything = NamespaceScope::everything();
        let (seen, task) = follow(watcher(&cluster, &iad, everything.clone(), 0));

        // Round 0, then a kill while the watcher is parked in a long poll
        // with nothing to hand out, and round 1 on the restarted daemon.
        let mut driver = Driver::new(&cluster);
        driver.round(&cluster, 0).await;
        synced(&driver.ledger, &seen, &iad).await;
        sleep_ms(300).await;
        cluster.daemon(&iad).kill();
        cluster.daemon(&iad).restart().await.expect("iad restarts");
        driver.reconnect(&cluster, &iad);
        driver.round(&cluster, 1).await;
        synced(&driver.ledger, &seen, &iad).await;

        // A burst of writers in iad, killed mid-stream: requests in flight,
        // the watcher's poll outstanding.
        let acks = Arc::new(AtomicUsize::new(0));
        let writers: Vec<_> = (0..3)
            .map(|w| burst_writer(cluster.host(&iad), cluster.peer(&iad), w, acks.clone()))
            .collect();
        let burst = Instant::now();
        while acks.load(Ordering::Relaxed) < 40 && burst.elapsed() < Duration::from_secs(20) {
            sleep_ms(5).await;
        }
        cluster.daemon(&iad).kill();
        let persisted = seen.lock().unwrap().clone();
        for writer in writers {
            driver
                .ledger
                .extend(writer.await.expect("no writer panicked"));
        }
        assert!(acks.load(Ordering::Relaxed) >= 40, "burst too small");
        cluster.daemon(&iad).restart().await.expect("iad restarts");

        // Round 2 on the restarted daemon, then a sentinel that ends the log.
        driver.reconnect(&cluster, &iad);
        driver.round(&cluster, 2).await;
        let sentinel = key_in("", "sentinel");
        driver
            .acquire(&cluster, &iad, &sentinel, &actor("10.0.1.9:1"))
            .await;
        let ledger = driver.ledger;
        let is_sentinel = |e: &Event| e.key == sentinel;

        // The same watcher: every acknowledged change exactly once, consecutive seqs.
        let log = until_seen(&seen, "the sentinel", is_sentinel).await;
        task.abort();
        if let Err(broken) = ledger.check(&iad, &log) {
            panic!(
                "iad's log breaks the rules:\n{broken}\nlog: {log:#?}\nin flight: {:?}",
                ledger.keys_in_flight()
            );
        }
        let in_flight = ledger.keys_in_flight().len();
        assert!(
            in_flight >= 1,
            "the kill caught no write in flight (the burst never raced it)"
        );

        // A new watcher from the cursor persisted at the second kill continues
        // with exactly the events the first one handed out after it.
        assert!(
            persisted.events.iter().any(|e| e.key.name.as_str().starts_with("burst-")),
            "the second kill came before the watcher followed the burst"
        );
        let (resumed, task) = follow(watcher(&cluster, &iad, everything.clone(), persisted.cursor));
        let tail = until_seen(&resumed, "the sentinel", is_sentinel).await;
        task.abort();
        assert_eq!(
            tail,
            log[persisted.events.len()..],
            "resumed from cursor {}",
            persisted.cursor
        );

        // A subtree watch from 0: exactly the log's events under games/eu.
        let scope = NamespaceScope::subtree(Namespace::new(SUBTREE).unwrap());
        let expected: Vec<Event> = log
            .iter()
            .filter(|e| scope.contains(&e.key.namespace))
            .cloned()
            .collect();
        let namespaces: std::collections::BTreeSet<&str> =
            expected.iter().map(|e| e.key.namespace.as_str()).collect();
        assert_eq!(
            namespaces,
            ["games/eu", "games/eu/lobbies"].into_iter().collect(),
            "the subtree holds its root and its child, not games, games/euw or gamesx"
        );
        let last = expected.last().expect("events in the subtree").clone();
        let (subtree, task) = follow(watcher(&cluster, &iad, scope, 0));
        let got = until_seen(&subtree, "the subtree's last event", |e| e == &last).await;
        task.abort();
        assert_eq!(got, expected, "the {SUBTREE} subtree");

        // fra's log holds fra's records only (its side of every recreate), complete.
        let (fra_seen, task) = follow(watcher(&cluster, &fra, everything.clone(), 0));
        let fra_log = synced(&ledger, &fra_seen, &fra).await;
        task.abort();
        if let Err(broken) = ledger.check(&fra, &fra_log) {
            panic!("fra's log breaks the rules:\n{broken}");
        }

        // A cursor beyond the head is another log's: refused, not waited on.
        let head = log.last().unwrap().seq;
        let beyond = Request::Watch {
            scope: everything,
            after: head + 1_000,
            wait_ms: 0,
        };
        let router = cluster.client(Role::Router, None);
        match cluster.ask(&router, &iad, &beyond).await {
            Ok(Reply::Error(e)) if e.kind == ErrorKind::BadRequest => {}
            other => panic!("a cursor beyond the head: {other:?}"),
        }
        eprintln!(
            "watch_resume: {} events in iad's log ({} acknowledged changes, {in_flight} keys in flight), {} in fra's; resumed from {}",
            log.len(),
            ledger.acks().len(),
            fra_log.len(),
            persisted.cursor
        );
    })
    .await;
    eprintln!("watch_resume took {:?}", started.elapsed());
}

// ---------------------------------------------------------------------------
// Waiting for a busy key across processes
// ---------------------------------------------------------------------------

/// A reply and the host clock (ms) when it arrived.
type Timed = (Result<Reply, NetError>, u64);

/// Sends `request` to `at` from a host of `at` in a task.
fn send_later(cluster: &Cluster, at: &DcId, request: Request) -> tokio::task::JoinHandle<Timed> {
    let (host, peer) = (cluster.host(at), cluster.peer(at));
    tokio::spawn(async move {
        let reply = host.request(&peer, &request).await;
        (reply, host_now().as_ms())
    })
}

/// Acquires `key` at `at` with no wait and expects to hold it: the
/// reservation, its token and the holder's deadlines.
async fn hold(cluster: &Cluster, at: &DcId, key: &Key) -> (ReservationId, FencingToken, Deadlines) {
    let request = acquire(key, &actor("10.0.1.1:1"), 0);
    match cluster.ask(&cluster.host(at), at, &request).await {
        Ok(Reply::Acquire(AcquireReply::Acquired(Grant {
            reservation,
            token,
            deadlines,
            ..
        }))) => (reservation, token, deadlines),
        other => panic!("acquire {key} at {at}: {other:?}"),
    }
}

/// Expects `Acquired` in `at`, with the next token, following `previous`.
fn expect_acquired(reply: &Result<Reply, NetError>, at: &DcId, previous: &PreviousRun) {
    match reply {
        Ok(Reply::Acquire(AcquireReply::Acquired(Grant {
            reservation,
            token,
            previous: got,
            ..
        }))) => {
            assert_eq!(reservation.dc(), at, "acquired in the waiter's dc");
            assert_eq!(*token, previous.token.next(), "the next token");
            assert_eq!(got.as_ref(), Some(previous), "how the previous run ended");
        }
        other => panic!("the waiter: {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_an_acquirer_in_another_dc_gets_the_key_only_after_the_holders_expiry_plus_grace() {
    let Some(cluster) = start_or_skip("wait_expiry", ClusterOptions::short_lease()).await else {
        return;
    };
    bounded(async {
        let (iad, fra) = (dc("iad"), dc("fra"));
        let policy = cluster.options().lease;
        let key = key_in("games/eu", "expiring");
        // The holder's clock when it sent its acquire: the DC received it no
        // earlier, so its lease expires no earlier than sent + ttl.
        let sent_ms = host_now().as_ms();
        let (held, token, deadlines) = hold(&cluster, &iad, &key).await;
        let waiter = actor("10.0.2.1:1");
        match cluster
            .ask(&cluster.host(&fra), &fra, &acquire(&key, &waiter, 0))
            .await
        {
            Ok(Reply::Acquire(AcquireReply::HeldElsewhere(Holder { reservation, .. }))) => {
                assert_eq!(reservation, held)
            }
            other => panic!("without a wait: {other:?}"),
        }

        // The holder never renews; fra's host waits well past ttl + grace.
        let wait_ms = 8_000;
        let asked_ms = host_now().as_ms();
        let (reply, got_ms) = send_later(&cluster, &fra, acquire(&key, &waiter, wait_ms))
            .await
            .unwrap();
        let previous = PreviousRun {
            reservation: held,
            token,
            ended: ReleaseCause::Expired,
        };
        expect_acquired(&reply, &fra, &previous);
        let free_ms = sent_ms + policy.ttl_ms() + policy.grace_ms();
        assert!(
            got_ms >= free_ms,
            "acquired {} ms before the holder's expiry + grace",
            free_ms - got_ms
        );
        assert!(
            got_ms >= deadlines.hard_terminate_at.as_ms() + policy.grace_ms(),
            "acquired before the holder's hard deadline + grace"
        );
        // Woken by the expiry, not by the end of the wait (noise margin 3 s).
        assert!(
            got_ms < free_ms + 3_000 && got_ms < asked_ms + u64::from(wait_ms),
            "acquired {} ms after expiry + grace (asked {} ms before it)",
            got_ms - free_ms,
            free_ms.saturating_sub(asked_ms)
        );
        eprintln!(
            "wait_expiry: acquired {} ms after expiry + grace",
            got_ms - free_ms
        );
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_a_failed_release_hands_the_key_to_the_waiter_in_another_dc_at_once_with_the_reason() {
    let Some(cluster) = start_or_skip("wait_failed_release", ClusterOptions::default()).await
    else {
        return;
    };
    bounded(async {
        let (iad, fra) = (dc("iad"), dc("fra"));
        let policy = cluster.options().lease;
        let key = key_in("", "failing");
        let sent_ms = host_now().as_ms();
        let (held, token, _) = hold(&cluster, &iad, &key).await;
        let waiting = send_later(&cluster, &fra, acquire(&key, &actor("10.0.2.1:1"), 20_000));
        sleep_ms(500).await;
        assert!(
            !waiting.is_finished(),
            "the waiter waits while the key is held"
        );

        let outcome = failed("exit code 137: out of memory");
        let release = Request::Release {
            lease: homing_e2e::cluster::lease_of("10.0.1.1:1"),
            reservation: held.clone(),
            token,
            outcome: outcome.clone(),
        };
        let released_ms = host_now().as_ms();
        assert_eq!(
            cluster
                .ask(&cluster.host(&iad), &iad, &release)
                .await
                .unwrap(),
            Reply::Release(ReleaseReply::Released)
        );
        let (reply, got_ms) = waiting.await.unwrap();
        let previous = PreviousRun {
            reservation: held,
            token,
            ended: ReleaseCause::Released(outcome),
        };
        expect_acquired(&reply, &fra, &previous);
        let after_ms = got_ms - released_ms;
        assert!(
            after_ms < 2_000 && got_ms < sent_ms + policy.ttl_ms(),
            "the waiter acquired {after_ms} ms after the release (lease ttl {} ms)",
            policy.ttl_ms()
        );
        eprintln!("wait_failed_release: acquired {after_ms} ms after the release");
    })
    .await;
}

// The waiting DC's `Await` is parked on its QUIC connection to the killed
// process; the restarted iad (same identity, same address) answers the
// waiting DC's next keep-alive with a stateless reset it recognises, so the
// request fails at once and the waiter registers again (homing-net derives
// the reset and connection-ID keys from the node's identity).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_a_waiter_registers_again_after_the_holders_dc_is_sigkilled_and_restarted() {
    let options = ClusterOptions::default().with_arg("--peer-timeout-ms=1000");
    let Some(mut cluster) = start_or_skip("wait_kill", options).await else {
        return;
    };
    bounded(async {
        let (iad, fra) = (dc("iad"), dc("fra"));
        let key = key_in("games", "restarting");
        let (held, token, _) = hold(&cluster, &iad, &key).await;
        let wait_ms = 15_000;
        let asked_ms = host_now().as_ms();
        let waiting = send_later(&cluster, &fra, acquire(&key, &actor("10.0.2.1:1"), wait_ms));
        sleep_ms(500).await;
        assert!(
            !waiting.is_finished(),
            "the waiter waits while the key is held"
        );

        // iad dies with fra's registration; the holder's lease (10 s) outlives the outage.
        cluster.daemon(&iad).kill();
        sleep_ms(300).await;
        cluster.daemon(&iad).restart().await.expect("iad restarts");
        sleep_ms(1_500).await;
        assert!(
            !waiting.is_finished(),
            "the key is still held after the restart"
        );

        let release = Request::Release {
            lease: homing_e2e::cluster::lease_of("10.0.1.1:1"),
            reservation: held.clone(),
            token,
            outcome: RunOutcome::Ok,
        };
        let released_ms = host_now().as_ms();
        assert_eq!(
            cluster
                .ask(&cluster.host(&iad), &iad, &release)
                .await
                .unwrap(),
            Reply::Release(ReleaseReply::Released)
        );
        let (reply, got_ms) = waiting.await.unwrap();
        let previous = PreviousRun {
            reservation: held,
            token,
            ended: ReleaseCause::Released(RunOutcome::Ok),
        };
        expect_acquired(&reply, &fra, &previous);
        assert!(
            got_ms < asked_ms + u64::from(wait_ms),
            "acquired {} ms after asking with a wait of {wait_ms} ms ({} ms after the release): \
             the wait ran out before the waiter registered again at the restarted iad\n{}",
            got_ms - asked_ms,
            got_ms - released_ms,
            cluster.logs()
        );
        // Woken by the release at the restarted iad: fra registered there again.
        assert!(
            got_ms - released_ms < 3_000,
            "the waiter acquired {} ms after the release: its registration was not renewed",
            got_ms - released_ms
        );
        eprintln!(
            "wait_kill: acquired {} ms after the release",
            got_ms - released_ms
        );
    })
    .await;
}
