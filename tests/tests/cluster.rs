//! Multi-process scenarios on a 3-DC cluster of real `homingd` processes
//! (iad, fra, sin) over a real 3-member etcd: the devnet story, a SIGKILL
//! during a storm, a partitioned DC in a recreation race, a host cut off from
//! its DC, and an etcd member killed mid-run. Each test starts its own
//! cluster and kills every process when it ends, also on panic. Tests skip
//! (printing why) only when the etcd binary is missing.

#![cfg(feature = "etcd")]

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use homing_client::{Actor, AgentState, HostAgent, HostAgentConfig, ResolveError};
use homing_core::{AcquireReply, Grant, Holder};
use homing_core::{
    ActorId, DcId, ErrorKind, FencingToken, KeyConfig, KeyName, ReleaseReply, RenewReply, Reply,
    Request, ReservationId,
};
use homing_e2e::cluster::{Cluster, acquire, dc, host_now, key, sleep_ms};
use homing_e2e::{ClusterOptions, start_or_skip};
use homing_net::{Client, Peer};
use homing_store::GlobalStore;

/// Upper bound on any one scenario, so a hang fails instead of stalling CI.
const SCENARIO_TIMEOUT: Duration = Duration::from_secs(90);

fn dcs() -> (DcId, DcId, DcId) {
    (dc("iad"), dc("fra"), dc("sin"))
}

async fn bounded<F: std::future::Future<Output = ()>>(f: F) {
    tokio::time::timeout(SCENARIO_TIMEOUT, f)
        .await
        .expect("scenario finished within its time bound");
}

/// Acquires `name` for `actor` at `at` and expects to hold it.
async fn must_acquire(
    cluster: &Cluster,
    host: &Client,
    at: &DcId,
    name: &str,
    actor: &str,
) -> (ReservationId, FencingToken) {
    match cluster.ask(host, at, &acquire(name, actor)).await {
        Ok(Reply::Acquire(AcquireReply::Acquired(Grant {
            reservation, token, ..
        }))) => (reservation, token),
        other => panic!("acquire {name} at {at}: {other:?}\n{}", cluster.logs()),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn devnet_story_reserve_in_iad_resolve_from_sin_recreate_in_fra_and_follow_the_link() {
    let Some(cluster) = start_or_skip("devnet_story", ClusterOptions::default()).await else {
        return;
    };
    bounded(async {
        let (iad, fra, sin) = dcs();
        let room = key("room-1");
        let (first, token) = must_acquire(
            &cluster,
            &cluster.host(&iad),
            &iad,
            "room-1",
            "10.0.1.7:9000",
        )
        .await;
        assert_eq!(first.dc(), &iad);

        // A router near sin: the global read goes to sin, the tail hop to iad.
        // (A long tail TTL: the cached answer must outlive the steps below on a slow CI.)
        let mut config = cluster.resolver_config(&[&sin, &iad, &fra]);
        config.tail_ttl_ms = 30_000;
        let resolver = cluster.resolver_with(config);
        let at = resolver.resolve(&room).await.expect("resolves");
        assert_eq!(at.reservation, first);
        assert_eq!(at.actor.as_str(), "10.0.1.7:9000");
        assert_eq!((at.hops, at.from_cache), (0, false));
        assert_eq!(at.remote_round_trips, 2, "sin's global read + iad's tail");

        // Release in iad: the chain ends in a vacant tail (a fresh router sees it;
        // ours still serves its cached answer until the tail TTL).
        let release = Request::Release {
            lease: homing_e2e::cluster::lease_of("10.0.1.7:9000"),
            reservation: first.clone(),
            token,
            outcome: homing_core::RunOutcome::Ok,
        };
        assert_eq!(
            cluster
                .ask(&cluster.host(&iad), &iad, &release)
                .await
                .unwrap(),
            Reply::Release(ReleaseReply::Released)
        );
        assert!(matches!(
            cluster.resolver(&[&sin, &iad, &fra]).resolve(&room).await,
            Err(ResolveError::Vacant { reservation, .. }) if reservation == first
        ));

        // Recreate in fra: a new reservation with the next token, linked from iad's tail.
        let (second, second_token) = must_acquire(
            &cluster,
            &cluster.host(&fra),
            &fra,
            "room-1",
            "10.0.2.9:9000",
        )
        .await;
        assert_eq!(second.dc(), &fra);
        assert!(second_token > token, "tokens increase along the chain");

        // The router's cached answer is stale; routing to it fails, the router
        // reports it and resolves again: iad answers with the link, fra with the tail.
        let stale = resolver.resolve(&room).await.unwrap();
        assert!(stale.from_cache && stale.reservation == first, "{stale:?}");
        resolver.report_unreachable(&stale).await;
        let at = resolver
            .resolve(&room)
            .await
            .expect("resolves through the link");
        assert_eq!(at.reservation, second);
        assert_eq!(at.actor.as_str(), "10.0.2.9:9000");
        assert_eq!(at.token, second_token);
        assert_eq!(at.hops, 1);
        assert_eq!(
            at.remote_round_trips, 2,
            "iad's link + fra's tail; entry cached"
        );

        // The next resolve is one cache lookup: no round trip.
        let again = resolver.resolve(&room).await.unwrap();
        assert_eq!(again.reservation, second);
        assert!(again.from_cache);
        assert_eq!(again.remote_round_trips, 0);

        // After routing fails, only the tail's DC is asked: entry and link are cached forever.
        resolver.report_unreachable(&again).await;
        let fresh = resolver.resolve(&room).await.unwrap();
        assert_eq!(fresh.reservation, second);
        assert_eq!(
            fresh.remote_round_trips, 1,
            "the learned link is not asked again"
        );
    })
    .await;
}

/// Acknowledged writes from the storm: (key name, reservation, token).
type Acknowledged = Arc<Mutex<Vec<(String, ReservationId, FencingToken)>>>;

fn storm_worker(
    host: Client,
    peer: Peer,
    worker: usize,
    acknowledged: Acknowledged,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let bounded = Duration::from_secs(2);
        for n in 0.. {
            let name = format!("storm-{worker}-{n}");
            let reply =
                tokio::time::timeout(bounded, host.request(&peer, &acquire(&name, "10.9.9.9:1")))
                    .await;
            let Ok(Ok(Reply::Acquire(AcquireReply::Acquired(Grant {
                reservation, token, ..
            })))) = reply
            else {
                return; // the daemon died under us
            };
            acknowledged
                .lock()
                .unwrap()
                .push((name, reservation.clone(), token));
            // Renew what we hold: renewals are CAS writes racing the crash too.
            let renew = Request::Renew {
                lease: homing_e2e::cluster::lease_of("10.9.9.9:1"),
                reservation,
                token,
                host_time: host_now(),
            };
            match tokio::time::timeout(bounded, host.request(&peer, &renew)).await {
                Ok(Ok(Reply::Renew(RenewReply::Renewed(_)))) => {}
                Ok(Ok(other)) => panic!("renew of a fresh lease: {other:?}"),
                _ => return,
            }
        }
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_sigkill_during_a_storm_loses_no_acknowledged_reservation_and_never_reuses_an_id() {
    let Some(mut cluster) = start_or_skip("crash_sigkill", ClusterOptions::default()).await else {
        return;
    };
    bounded(async {
        let (iad, _, sin) = dcs();
        let acknowledged: Acknowledged = Arc::default();
        let host = cluster.host(&iad);
        let workers: Vec<_> = (0..8)
            .map(|w| storm_worker(host.clone(), cluster.peer(&iad), w, acknowledged.clone()))
            .collect();
        let started = Instant::now();
        while acknowledged.lock().unwrap().len() < 150
            && started.elapsed() < Duration::from_secs(30)
        {
            sleep_ms(10).await;
        }
        cluster.daemon(&iad).kill();
        for worker in workers {
            worker.await.expect("no worker panicked");
        }
        let acknowledged = acknowledged.lock().unwrap().clone();
        assert!(
            acknowledged.len() >= 150,
            "storm too small: {}",
            acknowledged.len()
        );
        cluster.daemon(&iad).restart().await.expect("iad restarts");

        // Every acknowledged reservation is there, with the acknowledged token,
        // read back through a fresh router (its own connection to the new process).
        let router = cluster.client(homing_core::Role::Router, None);
        for (name, reservation, token) in &acknowledged {
            match cluster
                .ask(&router, &iad, &Request::Resolve { key: key(name) })
                .await
                .unwrap()
            {
                Reply::Resolved {
                    entry: Some(entry),
                    segment: Some(segment),
                } => {
                    assert_eq!(&entry, reservation, "{name}");
                    let tail = segment.tail.expect("iad owns the tail");
                    assert_eq!((&tail.id, tail.token), (reservation, *token), "{name}");
                }
                other => panic!("acknowledged {name} → {reservation} lost: {other:?}"),
            }
        }
        // The global entries are in etcd, readable by another DC's router too.
        let global = cluster.global_store().await;
        let (name, reservation, _) = &acknowledged[acknowledged.len() / 2];
        assert_eq!(
            global.get(&key(name)).await.unwrap().as_ref(),
            Some(reservation)
        );
        let resolver = cluster.resolver(&[&sin, &iad]);
        assert_eq!(
            &resolver.resolve(&key(name)).await.unwrap().reservation,
            reservation
        );

        // The allocator resumes above every acknowledged unique: IDs are never reused.
        let highest = acknowledged
            .iter()
            .map(|(_, r, _)| r.unique())
            .max()
            .unwrap();
        let host = cluster.host(&iad);
        for n in 0..20 {
            let (fresh, _) =
                must_acquire(&cluster, &host, &iad, &format!("after-{n}"), "10.9.9.9:2").await;
            assert!(
                fresh.unique() > highest,
                "{fresh} reuses an id at or below {highest}"
            );
        }
        eprintln!(
            "{} acknowledged reservations survived SIGKILL; highest unique {highest}",
            acknowledged.len()
        );
    })
    .await;
}

/// What one racer's acquire gave.
#[derive(Debug)]
enum Raced {
    Acquired(ReservationId),
    HeldElsewhere(ReservationId),
    Unavailable,
}

async fn race_acquire(host: Client, peer: Peer, name: String, actor: &'static str) -> Raced {
    let reply = tokio::time::timeout(
        Duration::from_secs(10),
        host.request(&peer, &acquire(&name, actor)),
    )
    .await;
    match reply {
        Ok(Ok(Reply::Acquire(AcquireReply::Acquired(Grant { reservation, .. })))) => {
            Raced::Acquired(reservation)
        }
        Ok(Ok(Reply::Acquire(AcquireReply::HeldElsewhere(Holder { reservation, .. })))) => {
            Raced::HeldElsewhere(reservation)
        }
        Ok(Ok(Reply::Error(e))) if matches!(e.kind, ErrorKind::Unavailable { .. }) => {
            Raced::Unavailable
        }
        // No answer at all also means the acquire was not acknowledged.
        Err(_) | Ok(Err(_)) => Raced::Unavailable,
        Ok(Ok(other)) => panic!("{name}: unexpected reply {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partition_a_dc_during_a_recreation_race_yields_at_most_one_holder_and_heals_to_the_winner()
{
    // "warm" must stay held for every round (each waits for fra to reach
    // iad again, which takes a probe after the cut): a lease longer than the test.
    let lease = homing_core::LeasePolicy::new(120_000, 333, 3_000, 1_000, 2_000).unwrap();
    let options = ClusterOptions::default().with_lease(lease);
    let Some(cluster) = start_or_skip("partition_race", options).await else {
        return;
    };
    bounded(async {
        let (iad, fra, sin) = dcs();
        cluster.set_inter_dc_delay_ms(15);
        // Warm the pooled connections fra → iad and sin → iad, so each round
        // races on live connections rather than on handshakes.
        must_acquire(&cluster, &cluster.host(&iad), &iad, "warm", "10.0.1.9:9").await;
        // Each probe is a new host (its own lease key): a probe never finds
        // its own grant, whoever holds "warm" by then.
        let probes = std::sync::atomic::AtomicU32::new(0);
        let fra_reaches_iad = || async {
            let n = probes.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let probe = acquire("warm", &format!("10.0.2.9:{}", 1000 + n));
            matches!(
                cluster.ask(&cluster.host(&fra), &fra, &probe).await,
                Ok(Reply::Acquire(AcquireReply::HeldElsewhere(_)))
            )
        };
        let probe = acquire("warm", "10.0.3.9:9");
        assert!(matches!(
            cluster.ask(&cluster.host(&sin), &sin, &probe).await,
            Ok(Reply::Acquire(AcquireReply::HeldElsewhere(_)))
        ));
        // Cut fra off at different moments of the race: before it starts, while
        // fra reads iad's tail, while the links are in flight, after.
        for (round, cut_after_ms) in [0u64, 15, 30, 45, 60, 80, 120, 300].into_iter().enumerate() {
            let healed = Instant::now();
            while !fra_reaches_iad().await {
                assert!(
                    healed.elapsed() < Duration::from_secs(15),
                    "fra never reached iad again"
                );
                sleep_ms(100).await;
            }
            let name = format!("race-{round}");
            // A holds the key, then releases it.
            let host_a = cluster.host(&iad);
            let (held, token) = must_acquire(&cluster, &host_a, &iad, &name, "10.0.1.1:1").await;
            let release = Request::Release {
                lease: homing_e2e::cluster::lease_of("10.0.1.1:1"),
                reservation: held.clone(),
                token,
                outcome: homing_core::RunOutcome::Ok,
            };
            assert_eq!(
                cluster.ask(&host_a, &iad, &release).await.unwrap(),
                Reply::Release(ReleaseReply::Released)
            );
            // B (fra) and C (sin) race to recreate; fra is partitioned mid-race.
            let b = tokio::spawn(race_acquire(
                cluster.host(&fra),
                cluster.peer(&fra),
                name.clone(),
                "10.0.2.2:2",
            ));
            let c = tokio::spawn(race_acquire(
                cluster.host(&sin),
                cluster.peer(&sin),
                name.clone(),
                "10.0.3.3:3",
            ));
            sleep_ms(cut_after_ms).await;
            cluster.partition_dc(&fra, true);
            let (b, c) = (b.await.unwrap(), c.await.unwrap());
            cluster.partition_dc(&fra, false);
            eprintln!("round {round} (cut fra after {cut_after_ms} ms): fra {b:?}, sin {c:?}");

            let winner = match (&b, &c) {
                (Raced::Acquired(_), Raced::Acquired(_)) => {
                    panic!("two holders of {name}: fra {b:?}, sin {c:?}")
                }
                (Raced::Acquired(w), loser) | (loser, Raced::Acquired(w)) => {
                    match loser {
                        Raced::HeldElsewhere(r) => assert_eq!(r, w, "the loser names the winner"),
                        Raced::Unavailable => {}
                        Raced::Acquired(_) => unreachable!(),
                    }
                    Some(w.clone())
                }
                _ => None,
            };
            // Healed: every router resolves the winner.
            let resolver = cluster.resolver(&[&iad, &fra, &sin]);
            let mut resolved = resolver.resolve(&key(&name)).await;
            let started = Instant::now();
            while matches!(resolved, Err(ResolveError::Unavailable { .. }))
                && started.elapsed() < Duration::from_secs(10)
            {
                sleep_ms(100).await;
                resolved = resolver.resolve(&key(&name)).await;
            }
            match (&winner, &resolved) {
                (Some(w), Ok(at)) => assert_eq!(&at.reservation, w, "{name}"),
                (Some(w), other) => panic!("{name}: winner {w} but resolve gave {other:?}"),
                // Nobody was acknowledged: an unacknowledged record may still
                // be active until its lease runs out; it is never iad's old one.
                (None, Ok(at)) => assert_ne!(at.reservation, held),
                (None, Err(_)) => {}
            }
        }
    })
    .await;
}

/// Records when the agent told the actor to stop.
#[derive(Default)]
struct StopClock {
    soft: Mutex<Option<Instant>>,
    hard: Mutex<Option<Instant>>,
}

impl Actor for StopClock {
    fn on_soft_terminate(&self) {
        self.soft.lock().unwrap().get_or_insert_with(Instant::now);
    }
    fn on_hard_terminate(&self) {
        self.hard.lock().unwrap().get_or_insert_with(Instant::now);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_a_host_cut_off_from_its_dc_stops_by_its_deadlines_before_another_dc_acquires() {
    let Some(cluster) = start_or_skip("lease_partition", ClusterOptions::short_lease()).await
    else {
        return;
    };
    bounded(async {
        let (iad, fra, _) = dcs();
        let host_path = cluster.relay_to(&iad).await;
        let actor = Arc::new(StopClock::default());
        let config = HostAgentConfig::new(
            Peer {
                addr: host_path.addr(),
                dc: iad.clone(),
            },
            KeyConfig::named(KeyName::new("leased").unwrap()),
            ActorId::new("10.0.1.5:7000").unwrap(),
        );
        let started = HostAgent::start(cluster.host(&iad), config, actor.clone())
            .await
            .expect("the agent connects");
        let AcquireReply::Acquired(agent) = started else {
            panic!("{started:?}")
        };
        let held = agent.reservation().clone();
        // Renewals keep it alive over several leases (ttl 2 s).
        sleep_ms(3_000).await;
        assert_eq!(agent.state(), AgentState::Holding);
        let fra_host = cluster.host(&fra);
        match cluster
            .ask(&fra_host, &fra, &acquire("leased", "10.0.2.5:7000"))
            .await
        {
            Ok(Reply::Acquire(AcquireReply::HeldElsewhere(Holder { reservation, .. }))) => {
                assert_eq!(reservation, held)
            }
            other => panic!("a live lease is held elsewhere: {other:?}"),
        }

        // Cut the host off from its DC; fra keeps trying to take the key.
        host_path.impairment().partition(true);
        let cut_at = Instant::now();
        let taken_at = loop {
            let sent_at = Instant::now();
            match cluster
                .ask(&fra_host, &fra, &acquire("leased", "10.0.2.5:7000"))
                .await
            {
                Ok(Reply::Acquire(AcquireReply::Acquired(Grant { reservation, .. }))) => {
                    assert_eq!(reservation.dc(), &fra);
                    break sent_at;
                }
                Ok(Reply::Acquire(AcquireReply::HeldElsewhere(_))) => {}
                other => panic!("fra's acquire: {other:?}"),
            }
            assert!(
                cut_at.elapsed() < Duration::from_secs(15),
                "fra never acquired"
            );
            sleep_ms(50).await;
        };
        let soft = actor
            .soft
            .lock()
            .unwrap()
            .expect("soft terminate was called");
        let hard = actor
            .hard
            .lock()
            .unwrap()
            .expect("hard terminate was called");
        assert_eq!(agent.state(), AgentState::HardTerminated);
        assert!(soft <= hard, "soft before hard");
        // The last renewal was sent before the cut, so the hard deadline
        // (ttl − hard margin = 1.6 s after it) fell at most 1.6 s after the cut.
        assert!(
            hard.duration_since(cut_at) <= Duration::from_millis(1_600 + 300),
            "hard terminate {:?} after the cut",
            hard.duration_since(cut_at)
        );
        assert!(
            hard < taken_at,
            "fra acquired {:?} before the old holder's hard termination",
            hard.duration_since(taken_at)
        );
        eprintln!(
            "cut → soft {:?}, hard {:?}, fra's winning acquire sent {:?}",
            soft.duration_since(cut_at),
            hard.duration_since(cut_at),
            taken_at.duration_since(cut_at)
        );

        // Healed, the old holder's token is fenced off: it cannot renew.
        host_path.impairment().partition(false);
        let renew = Request::Renew {
            lease: homing_e2e::cluster::lease_of("not-the-agent"), /* the agent keeps its own */
            reservation: held,
            token: agent.token(),
            host_time: host_now(),
        };
        match cluster.ask(&cluster.host(&iad), &iad, &renew).await {
            Ok(Reply::Renew(RenewReply::Renewed(_))) => panic!("a lapsed holder renewed"),
            Ok(Reply::Renew(_)) => {}
            other => panic!("renew of a lapsed lease: {other:?}"),
        }
    })
    .await;
}

/// Reserves each worker must see succeed in a row after the kill: its
/// homingd's etcd client has failed over.
const QUORUM_STREAK_MIN: usize = 30;

/// One worker's reserves in order: `true` acknowledged, `false` failed.
type Outcomes = Arc<Mutex<Vec<bool>>>;

/// How many of a worker's latest outcomes succeeded in a row.
fn streak(outcomes: &Outcomes) -> usize {
    let outcomes = outcomes.lock().unwrap();
    outcomes.iter().rev().take_while(|ok| **ok).count()
}

// Waits on counts, never on the clock: a loaded machine only makes it slower
// (bounded by SCENARIO_TIMEOUT), not red.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_a_killed_member_does_not_stop_reserves_on_the_remaining_quorum() {
    let Some(mut cluster) = start_or_skip("etcd_member_killed", ClusterOptions::default()).await
    else {
        return;
    };
    bounded(async {
        let all = [dc("iad"), dc("fra"), dc("sin")];
        let acknowledged: Acknowledged = Arc::default();
        let outcomes: Vec<Outcomes> = all.iter().map(|_| Outcomes::default()).collect();
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let mut workers = Vec::new();
        for (w, at) in all.iter().enumerate() {
            let (host, peer) = (cluster.host(at), cluster.peer(at));
            let (acknowledged, outcomes, stop) =
                (acknowledged.clone(), outcomes[w].clone(), stop.clone());
            workers.push(tokio::spawn(async move {
                let mut n = 0;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let name = format!("quorum-{w}-{n}");
                    n += 1;
                    // A request stuck on the dead member is given up and
                    // counted as a failure; the worker goes on.
                    let reply = tokio::time::timeout(
                        Duration::from_secs(5),
                        host.request(&peer, &acquire(&name, "10.8.8.8:1")),
                    )
                    .await;
                    let ok = match reply {
                        Ok(Ok(Reply::Acquire(AcquireReply::Acquired(Grant {
                            reservation,
                            token,
                            ..
                        })))) => {
                            acknowledged
                                .lock()
                                .unwrap()
                                .push((name, reservation, token));
                            true
                        }
                        other => {
                            eprintln!("worker {w}: failed reserve: {other:?}");
                            false
                        }
                    };
                    outcomes.lock().unwrap().push(ok);
                }
            }));
        }
        let count = || acknowledged.lock().unwrap().len();
        while count() < 60 {
            sleep_ms(10).await;
        }
        let before = count();
        let at_kill: Vec<usize> = outcomes.iter().map(|o| o.lock().unwrap().len()).collect();
        cluster.etcd().kill_member(0);
        assert_eq!(cluster.etcd().running_members(), 2);
        // Reserves go on, and every worker's failures (requests in flight to
        // the dead member while its client fails over) end: each finishes
        // with a run of successes.
        while count() < before + 150 || outcomes.iter().any(|o| streak(o) < QUORUM_STREAK_MIN) {
            sleep_ms(10).await;
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        for worker in workers {
            worker.await.unwrap();
        }
        for (w, (o, from)) in outcomes.iter().zip(at_kill).enumerate() {
            let o = o.lock().unwrap();
            let failed = o[from..].iter().filter(|ok| !**ok).count();
            eprintln!(
                "worker {w}: {} reserves after the kill, {failed} failed",
                o.len() - from
            );
        }
        eprintln!(
            "{before} reserves before the kill, {} after",
            count() - before
        );
        // Every acknowledged reserve is readable from the two-member quorum.
        // (A fresh etcd client may first try the dead member: retry until
        // the scenario's bound.)
        let global = cluster.global_store().await;
        let acknowledged = acknowledged.lock().unwrap().clone();
        for (name, reservation, _) in &acknowledged {
            let read = loop {
                match global.get(&key(name)).await {
                    Ok(read) => break read,
                    Err(e) => {
                        eprintln!("reading {name}: {e}; again");
                        sleep_ms(100).await;
                    }
                }
            };
            assert_eq!(read.as_ref(), Some(reservation), "{name}");
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_a_restarted_dc_is_reachable_again_from_its_peers_within_seconds() {
    let Some(mut cluster) =
        start_or_skip("crash_restart_reachable", ClusterOptions::default()).await
    else {
        return;
    };
    bounded(async {
        let (iad, _, sin) = dcs();
        must_acquire(&cluster, &cluster.host(&iad), &iad, "anchor", "10.0.1.1:1").await;
        // sin pools a connection to iad by following the key there.
        let sin_host = cluster.host(&sin);
        let probe = acquire("anchor", "10.0.3.3:3");
        assert!(matches!(
            cluster.ask(&sin_host, &sin, &probe).await,
            Ok(Reply::Acquire(AcquireReply::HeldElsewhere(_)))
        ));
        cluster.daemon(&iad).restart().await.expect("iad restarts");
        let restarted = Instant::now();
        loop {
            let reply = cluster.ask(&sin_host, &sin, &probe).await;
            if matches!(reply, Ok(Reply::Acquire(AcquireReply::HeldElsewhere(_)))) {
                break;
            }
            assert!(
                restarted.elapsed() < Duration::from_secs(5),
                "sin still cannot reach the restarted iad after {:?}: {reply:?}",
                restarted.elapsed()
            );
            sleep_ms(200).await;
        }
    })
    .await;
}

/// Keys move freely (DESIGN.md §7.2): a key moved 100 times across the three
/// DCs — six times the hop limit — still resolves, cold, in at most two
/// remote round trips: the entry's DC answers with the shortcut its peers
/// told it after each link, the tail's DC with the tail.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn moves_a_key_moved_100_times_resolves_cold_in_at_most_two_round_trips() {
    const MOVES: usize = 100;
    let Some(cluster) = start_or_skip("moves_100", ClusterOptions::default()).await else {
        return;
    };
    bounded(async {
        let (iad, fra, sin) = dcs();
        let order = [&iad, &fra, &sin];
        let name = "nomad-1";
        let mut tail = None;
        for n in 0..=MOVES {
            let at = order[n % order.len()];
            let host = cluster.host(at);
            let (reservation, token) =
                must_acquire(&cluster, &host, at, name, "10.0.9.9:9000").await;
            if n == MOVES {
                tail = Some((reservation, token));
                break;
            }
            let release = Request::Release {
                lease: homing_e2e::cluster::lease_of("10.0.9.9:9000"),
                reservation,
                token,
                outcome: homing_core::RunOutcome::Ok,
            };
            assert_eq!(
                cluster.ask(&host, at, &release).await.unwrap(),
                Reply::Release(ReleaseReply::Released)
            );
        }
        let (tail, token) = tail.unwrap();
        assert_eq!(token, FencingToken::new(MOVES as u64 + 1));

        // The last move's shortcut notice travels in the background: wait
        // for iad (the entry's DC) to have recorded it.
        let admin = cluster.client(homing_core::Role::Admin, None);
        let inspect = Request::Inspect { key: key(name) };
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let Ok(Reply::Inspected { records }) = cluster.ask(&admin, &iad, &inspect).await else {
                panic!("inspect at iad");
            };
            let entry = records
                .iter()
                .find(|r| r.id.unique() == 1 || r.predecessor.is_none());
            if entry.and_then(|r| r.shortcut.as_ref()).map(|s| &s.to) == Some(&tail) {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "iad never recorded the shortcut to {tail}"
            );
            sleep_ms(50).await;
        }

        // Cold: a fresh router near iad reads the entry (with iad's segment
        // and its shortcut) and asks the tail's DC.
        let at = cluster
            .resolver(&[&iad, &fra, &sin])
            .resolve(&key(name))
            .await
            .expect("a key moved 100 times resolves");
        assert_eq!(at.reservation, tail);
        assert!(
            at.remote_round_trips <= 2,
            "{} round trips for a cold resolve",
            at.remote_round_trips
        );
        // A connect walks the same way: a host of the entry's DC finds the live
        // holder at once.
        match cluster
            .ask(&cluster.host(&iad), &iad, &acquire(name, "10.0.1.1:1"))
            .await
        {
            Ok(Reply::Acquire(AcquireReply::HeldElsewhere(Holder { reservation, .. }))) => {
                assert_eq!(reservation, tail)
            }
            other => panic!("{other:?}"),
        }
    })
    .await;
}
