//! A partition between a router and one DC costs the router one timeout,
//! not one per request (issue 27). Three real `homingd` over a real
//! 3-member etcd; a key held in iad; a Resolver near fra. iad's homingd is
//! frozen with SIGSTOP: the first resolve that needs iad waits for its hop
//! timeout, and from then on, until a probe gets an answer, every resolve
//! that needs iad is answered at once — the remembered answer (marked
//! stale) or `Unavailable { suspect: true }` — while keys held elsewhere
//! resolve as before. After SIGCONT iad is routed to again within one probe
//! timeout plus one probe interval (plus slack for a loaded machine).
//!
//! The same holds for homingd's own calls to a peer: fra's connect of a key
//! whose tail is in frozen iad waits one peer timeout, then answers
//! `Unavailable { dc: iad }` at once until fra's probe gets an answer.
//!
//! Prints the latencies (median, p99, max) so a run reports them.

#![cfg(feature = "etcd")]

use std::time::{Duration, Instant};

use homing_client::ResolveError;
use homing_core::{AcquireReply, DcId, ErrorKind, Grant, LeasePolicy, Reply, ReservationId};
use homing_e2e::cluster::{Cluster, acquire, dc, key};
use homing_e2e::frozen::Frozen;
use homing_e2e::{ClusterOptions, start_or_skip};

/// Upper bound on the scenario, so a hang fails instead of stalling CI.
const SCENARIO_TIMEOUT: Duration = Duration::from_secs(120);
/// Resolves timed while iad is suspect, of each kind.
const SAMPLES: usize = 200;
/// Longer than the scenario, so no lease runs out while iad is frozen.
const LEASE_TTL_MS: u64 = 300_000;
/// What a loaded machine may add to the heal bound, in milliseconds.
const HEAL_SLACK_MS: u64 = 2_000;

async fn must_acquire(cluster: &Cluster, at: &DcId, name: &str, actor: &str) -> ReservationId {
    match cluster
        .ask(&cluster.host(at), at, &acquire(name, actor))
        .await
    {
        Ok(Reply::Acquire(AcquireReply::Acquired(Grant { reservation, .. }))) => reservation,
        other => panic!("acquire {name} at {at}: {other:?}\n{}", cluster.logs()),
    }
}

/// Median, p99 and max, in milliseconds.
fn summary(mut samples: Vec<Duration>) -> (f64, f64, f64) {
    samples.sort();
    let at = |q: f64| {
        let i = ((samples.len() as f64 - 1.0) * q).round() as usize;
        samples[i].as_secs_f64() * 1_000.0
    };
    (at(0.5), at(0.99), at(1.0))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_dc_costs_a_router_one_timeout_then_answers_come_at_once_until_it_heals() {
    let lease = LeasePolicy::new(LEASE_TTL_MS, 333, 3_000, 1_000, 2_000).expect("a policy");
    let options = ClusterOptions::default().with_lease(lease);
    let Some(mut cluster) = start_or_skip("partition", options).await else {
        return;
    };
    let scenario = async {
        let (iad, fra, sin) = (dc("iad"), dc("fra"), dc("sin"));
        let held = must_acquire(&cluster, &iad, "room-p", "10.0.1.7:9000").await;
        let elsewhere = must_acquire(&cluster, &fra, "lobby-p", "10.0.2.9:9000").await;
        let (room, lobby) = (key("room-p"), key("lobby-p"));

        // A router near fra; defaults but for the DC table.
        let config = cluster.resolver_config(&[&fra, &iad, &sin]);
        let hop_timeout = Duration::from_millis(config.hop_timeout_ms);
        let heal_bound = Duration::from_millis(
            config.probe_timeout_ms
                + config.probe_interval_max_ms * (100 + u64::from(config.probe_jitter_percent))
                    / 100
                + HEAL_SLACK_MS,
        );
        let resolver = cluster.resolver_with(config);
        let first = resolver.resolve_or_stale(&room).await.expect("resolves");
        assert!(!first.stale && first.reservation == held, "{first:?}");

        // Freeze iad's homingd; the router's answer is dropped, as when
        // forwarding to the actor failed.
        let pid = cluster.daemon(&iad).pid().expect("iad's homingd runs");
        let frozen = Frozen::freeze(pid);
        resolver.report_unreachable(&first).await;

        // The first resolve needing iad waits for its timeout: "before".
        let started = Instant::now();
        let stale = resolver
            .resolve_or_stale(&room)
            .await
            .expect("stale answer");
        let first_wait = started.elapsed();
        assert!(stale.stale && stale.reservation == held, "{stale:?}");
        assert!(first_wait >= hop_timeout, "{first_wait:?}");
        assert!(resolver.is_suspect(&iad), "iad is suspect after a timeout");

        // From now on, nothing waits for iad: the remembered answer at once…
        let mut stale_times = Vec::with_capacity(SAMPLES);
        for _ in 0..SAMPLES {
            let started = Instant::now();
            let answer = resolver.resolve_or_stale(&room).await;
            let took = started.elapsed();
            assert!(
                took < hop_timeout / 2,
                "a stale answer waited for iad: {took:?}"
            );
            let answer = answer.expect("stale answer");
            assert!(answer.stale && answer.reservation == held, "{answer:?}");
            stale_times.push(took);
        }
        // …or, for a router without stale answers, Unavailable at once.
        let mut refused_times = Vec::with_capacity(SAMPLES);
        for _ in 0..SAMPLES {
            let started = Instant::now();
            let answer = resolver.resolve(&room).await;
            let took = started.elapsed();
            assert!(took < hop_timeout / 2, "a refusal waited for iad: {took:?}");
            match answer {
                Err(ResolveError::Unavailable { dc, suspect, .. }) => {
                    assert!(suspect && dc == iad, "{dc} suspect={suspect}");
                }
                other => panic!("expected Unavailable from iad: {other:?}"),
            }
            refused_times.push(took);
        }
        // A key that does not need iad resolves as before.
        let hall = resolver.resolve_or_stale(&lobby).await.expect("resolves");
        assert!(!hall.stale && hall.reservation == elsewhere, "{hall:?}");

        let stats = resolver.stats();
        assert_eq!((stats.suspicions, stats.dcs_suspect), (1, 1), "{stats:?}");
        assert!(stats.skipped_suspect >= 2 * SAMPLES as u64, "{stats:?}");

        // Let a probe fail, so the heal below is found by a probe.
        let deadline = Instant::now() + SCENARIO_TIMEOUT / 2;
        while resolver.stats().probes_failed == 0 {
            assert!(Instant::now() < deadline, "no probe failed");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }

        // Thaw: iad is routed to again within the bound.
        frozen.thaw();
        let thawed = Instant::now();
        let healed_after = loop {
            let answer = resolver.resolve_or_stale(&room).await.expect("an answer");
            if !answer.stale {
                assert_eq!(answer.reservation, held);
                break thawed.elapsed();
            }
            assert!(
                thawed.elapsed() < heal_bound,
                "still stale after {heal_bound:?}"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        };
        let stats = resolver.stats();
        assert_eq!((stats.recoveries, stats.dcs_suspect), (1, 0), "{stats:?}");

        let (stale_p50, stale_p99, stale_max) = summary(stale_times);
        let (refused_p50, refused_p99, refused_max) = summary(refused_times);
        println!(
            "partition: first resolve needing frozen iad waited {:.0} ms (hop timeout {} ms)",
            first_wait.as_secs_f64() * 1_000.0,
            hop_timeout.as_millis()
        );
        println!(
            "partition: then {SAMPLES} stale answers: median {stale_p50:.3} ms, p99 {stale_p99:.3} ms, max {stale_max:.3} ms"
        );
        println!(
            "partition: then {SAMPLES} Unavailable: median {refused_p50:.3} ms, p99 {refused_p99:.3} ms, max {refused_max:.3} ms"
        );
        println!(
            "partition: after SIGCONT, fresh answers after {} ms (bound {} ms); probes {} ({} failed)",
            healed_after.as_millis(),
            heal_bound.as_millis(),
            stats.probes,
            stats.probes_failed
        );
        assert!(stale_p50 <= 50.0, "stale median {stale_p50} ms");
        assert!(refused_p50 <= 50.0, "refused median {refused_p50} ms");
    };
    tokio::time::timeout(SCENARIO_TIMEOUT, scenario)
        .await
        .expect("the scenario finished within its time bound");
}

/// Peer timeout of every homingd in these clusters (homingd's default).
const PEER_TIMEOUT_MS: u64 = 2_000;

/// Whether `reply` is `Unavailable { dc }`.
fn unavailable_from(reply: &Reply, dc: &DcId) -> bool {
    matches!(reply, Reply::Error(e) if e.kind == ErrorKind::Unavailable { dc: dc.clone() })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_peer_costs_homingd_one_timeout_then_connects_needing_it_fail_at_once() {
    let lease = LeasePolicy::new(LEASE_TTL_MS, 333, 3_000, 1_000, 2_000).expect("a policy");
    let options = ClusterOptions::default()
        .with_lease(lease)
        .with_arg(&format!("--peer-timeout-ms={PEER_TIMEOUT_MS}"));
    let Some(mut cluster) = start_or_skip("partition_peers", options).await else {
        return;
    };
    let scenario = async {
        let (iad, fra) = (dc("iad"), dc("fra"));
        must_acquire(&cluster, &iad, "room-q", "10.0.1.7:9000").await;
        let host = cluster.host(&fra);
        let contender = acquire("room-q", "10.0.2.9:9000");
        // Healthy: fra asks iad and learns the key is held there.
        let reply = cluster.ask(&host, &fra, &contender).await.expect("a reply");
        assert!(
            matches!(reply, Reply::Acquire(AcquireReply::HeldElsewhere(_))),
            "{reply:?}"
        );

        let pid = cluster.daemon(&iad).pid().expect("iad's homingd runs");
        let frozen = Frozen::freeze(pid);
        let peer_timeout = Duration::from_millis(PEER_TIMEOUT_MS);
        let started = Instant::now();
        let reply = cluster.ask(&host, &fra, &contender).await.expect("a reply");
        let first_wait = started.elapsed();
        assert!(unavailable_from(&reply, &iad), "{reply:?}");
        assert!(first_wait >= peer_timeout, "{first_wait:?}");

        let mut times = Vec::with_capacity(SAMPLES / 4);
        for _ in 0..SAMPLES / 4 {
            let started = Instant::now();
            let reply = cluster.ask(&host, &fra, &contender).await.expect("a reply");
            let took = started.elapsed();
            assert!(
                took < peer_timeout / 2,
                "fra waited for iad again: {took:?}"
            );
            assert!(unavailable_from(&reply, &iad), "{reply:?}");
            times.push(took);
        }

        frozen.thaw();
        let thawed = Instant::now();
        // One probe timeout, one capped probe interval (+ jitter), slack.
        let heal_bound = Duration::from_millis(PEER_TIMEOUT_MS + 2_400 + HEAL_SLACK_MS);
        let healed_after = loop {
            let reply = cluster.ask(&host, &fra, &contender).await.expect("a reply");
            if matches!(reply, Reply::Acquire(AcquireReply::HeldElsewhere(_))) {
                break thawed.elapsed();
            }
            assert!(unavailable_from(&reply, &iad), "{reply:?}");
            assert!(
                thawed.elapsed() < heal_bound,
                "still unavailable after {heal_bound:?}"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        };
        let (p50, p99, max) = summary(times);
        println!(
            "partition (peers): fra's first connect needing frozen iad waited {:.0} ms (peer timeout {PEER_TIMEOUT_MS} ms)",
            first_wait.as_secs_f64() * 1_000.0
        );
        println!(
            "partition (peers): then {} Unavailable: median {p50:.3} ms, p99 {p99:.3} ms, max {max:.3} ms",
            SAMPLES / 4
        );
        println!(
            "partition (peers): after SIGCONT, fra connects through iad again after {} ms (bound {} ms)",
            healed_after.as_millis(),
            heal_bound.as_millis()
        );
    };
    tokio::time::timeout(SCENARIO_TIMEOUT, scenario)
        .await
        .expect("the scenario finished within its time bound");
}
