//! A partition seen through real edge routers (issue 27): three `homingd`
//! over a 3-member etcd, an `actor-host` process holding `room-e` from iad,
//! and two `edge-router` processes near fra with the default resolver
//! settings, one with `--stale-answers` and one without. iad's homingd is
//! frozen with SIGSTOP (the actor host stays reachable over HTTP: only the
//! routers' and the host's way to iad's daemon is cut). Users' requests go
//! through the routers, one after another:
//!
//! 1. After each router's first request that needs iad waited for its hop
//!    timeout, the stale router answers 200 from the actor (the remembered
//!    answer) and the plain router 503 `unavailable`, both at once (median
//!    and p99 printed; asserted against a bound a loaded machine keeps).
//! 2. After SIGCONT both route normally again (fresh answers: the resolver
//!    logs `dc answers again`, the plain router answers 200) within one
//!    probe timeout plus one capped probe interval (plus slack).
//! 3. iad is frozen again and stays frozen: the host cannot renew, stops
//!    at its hard deadline and says so (`actor-host stopped serving`);
//!    from then on no request through the stale router gets a 200 (the
//!    forward to the stopped actor fails: 502), the plain router still 503.
//!
//! Every wait is on an event (a response, a log line, a process's word)
//! with a deadline. iad is resumed and every process killed on the way out,
//! also when the test fails.

#![cfg(feature = "etcd")]

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use homing_client::resolver::{
    HOP_TIMEOUT_MS_DEFAULT, PROBE_INTERVAL_MAX_MS_DEFAULT, PROBE_JITTER_PERCENT_DEFAULT,
    PROBE_TIMEOUT_MS_DEFAULT, TAIL_TTL_MS_DEFAULT,
};
use homing_core::LeasePolicy;
use homing_e2e::cluster::dc;
use homing_e2e::edge::{ActorHostProcess, EdgeRouterProcess, http_get};
use homing_e2e::frozen::Frozen;
use homing_e2e::{ClusterOptions, start_or_skip};

/// Upper bound on the scenario, so a hang fails instead of stalling CI.
const SCENARIO_TIMEOUT: Duration = Duration::from_secs(90);
/// The key the actor holds, and the path users ask for.
const KEY: &str = "room-e";
const PATH: &str = "/k/room-e/hello";
/// Requests timed through each router after its first timeout.
const SAMPLES: usize = 200;
/// How long to keep timing after a router's first timeout if the samples
/// come slower than that (e.g. each waits for iad again).
const SAMPLE_WINDOW: Duration = Duration::from_secs(2);
/// Bound on the median latency while iad is suspect, in milliseconds. The
/// issue's target is 50 ms (the test prints the real figure, about a
/// millisecond); this bound only has to hold on a loaded CI machine and
/// to fail when every request waits for iad (2 s each).
const MEDIAN_MS_MAX: f64 = 500.0;
/// What a loaded machine may add to the heal bound, in milliseconds.
const HEAL_SLACK_MS: u64 = 2_000;
/// Requests through each router after the actor stopped.
const AFTER_STOP_SAMPLES: usize = 50;
/// Pause between a user's requests, so the routers' machine keeps time
/// for the daemons (a pace, not a wait for anything).
const PACE: Duration = Duration::from_millis(2);
/// Bound on one user request (longer than any hop timeout).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// Lease: 12 s, renewed every 1.2 s, hard deadline 1 s before expiry. A
/// host cut off from iad stops 9.8–11 s after the cut: long enough for
/// phases 1 and 2 to end before it, short enough for the test's wall time.
const LEASE_TTL_MS: u64 = 12_000;
const RENEW_AT_PERMILLE: u16 = 100;

/// One request through a router, as its user saw it.
#[derive(Debug, Clone)]
struct Sample {
    started: Instant,
    took: Duration,
    status: u16,
    body: String,
}

impl Sample {
    fn ended(&self) -> Instant {
        self.started + self.took
    }
}

/// Sends `GET PATH` through `router`, one request after another, until
/// `done(samples)` holds or `deadline` passes; returns every sample.
async fn drive(
    router: &EdgeRouterProcess,
    deadline: Instant,
    mut done: impl FnMut(&[Sample]) -> bool,
) -> Vec<Sample> {
    let mut samples = Vec::new();
    while !done(&samples) && Instant::now() < deadline {
        let started = Instant::now();
        let answer = http_get(router.addr, PATH, REQUEST_TIMEOUT).await;
        let took = started.elapsed();
        let answer = answer.unwrap_or_else(|e| panic!("{e}\n{}", router.process.output()));
        samples.push(Sample {
            started,
            took,
            status: answer.status,
            body: answer.body,
        });
        tokio::time::sleep(PACE).await;
    }
    samples
}

/// Index of the first request that waited at least most of a hop timeout.
fn first_timeout(samples: &[Sample]) -> Option<usize> {
    let waited = Duration::from_millis(HOP_TIMEOUT_MS_DEFAULT * 3 / 4);
    samples.iter().position(|s| s.took >= waited)
}

/// Whether [`SAMPLES`] requests (or [`SAMPLE_WINDOW`]'s worth) came after
/// the first timeout.
fn sampled_after_timeout(samples: &[Sample]) -> bool {
    let Some(first) = first_timeout(samples) else {
        return false;
    };
    let after = &samples[first + 1..];
    after.len() >= SAMPLES
        || after
            .last()
            .is_some_and(|s| s.ended() >= samples[first].ended() + SAMPLE_WINDOW)
}

/// Median, p99 and max, in milliseconds.
fn summary(samples: &[Sample]) -> (f64, f64, f64) {
    let mut took: Vec<Duration> = samples.iter().map(|s| s.took).collect();
    took.sort();
    let at = |q: f64| {
        let i = ((took.len() as f64 - 1.0) * q).round() as usize;
        took[i].as_secs_f64() * 1_000.0
    };
    (at(0.5), at(0.99), at(1.0))
}

/// How many samples got each status.
fn statuses(samples: &[Sample]) -> BTreeMap<u16, usize> {
    let mut counts = BTreeMap::new();
    for s in samples {
        *counts.entry(s.status).or_insert(0) += 1;
    }
    counts
}

fn ms(d: Duration) -> u128 {
    d.as_millis()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partitioned_dc_seen_through_real_edge_routers() {
    let lease = LeasePolicy::new(LEASE_TTL_MS, RENEW_AT_PERMILLE, 3_000, 1_000, 2_000)
        .expect("an ordered policy");
    let options = ClusterOptions::default().with_lease(lease);
    let Some(mut cluster) = start_or_skip("edge_partition", options).await else {
        return;
    };
    let (iad, fra, sin) = (dc("iad"), dc("fra"), dc("sin"));
    let pid = cluster.daemon(&iad).pid().expect("iad's homingd runs");
    let scenario = async {
        let actor = ActorHostProcess::start(&cluster, &iad, KEY)
            .await
            .expect("actor-host serves");
        let order = [&fra, &iad, &sin];
        let stale = EdgeRouterProcess::start(&cluster, &order, &["--stale-answers"])
            .await
            .expect("the stale router starts");
        let plain = EdgeRouterProcess::start(&cluster, &order, &[])
            .await
            .expect("the plain router starts");
        let routed = |s: &Sample| s.status == 200 && s.body.contains(&actor.actor);
        let refused = |s: &Sample| {
            s.status == 503 && s.body.contains("unavailable") && s.body.contains("iad")
        };
        let logs = || {
            format!(
                "--- stale router ---\n{}--- plain router ---\n{}--- actor-host ---\n{}",
                stale.process.output(),
                plain.process.output(),
                actor.process.output()
            )
        };

        // Both routers reach the actor (and remember the answer).
        for router in [&stale, &plain] {
            let deadline = Instant::now() + REQUEST_TIMEOUT;
            let warm = drive(router, deadline, |s| s.last().is_some_and(routed)).await;
            assert!(warm.last().is_some_and(routed), "{warm:?}\n{}", logs());
        }

        // 1. Freeze iad: each router waits one hop timeout, then answers at once.
        let frozen = Frozen::freeze(pid);
        let frozen_at = Instant::now();
        let deadline = frozen_at
            + Duration::from_millis(TAIL_TTL_MS_DEFAULT + HOP_TIMEOUT_MS_DEFAULT)
            + SAMPLE_WINDOW
            + Duration::from_secs(5);
        let (stale_run, plain_run) = tokio::join!(
            drive(&stale, deadline, sampled_after_timeout),
            drive(&plain, deadline, sampled_after_timeout),
        );
        assert!(
            actor
                .process
                .line_since("stopped serving", frozen_at)
                .is_none(),
            "the actor stopped early\n{}",
            logs()
        );
        let mut measured = Vec::new();
        for (name, run, answered) in [
            ("stale", &stale_run, &routed as &dyn Fn(&Sample) -> bool),
            ("plain", &plain_run, &refused as &dyn Fn(&Sample) -> bool),
        ] {
            let first = first_timeout(run).unwrap_or_else(|| {
                panic!("{name}: no request waited for iad: {run:?}\n{}", logs())
            });
            let before = &run[..first];
            assert!(before.iter().all(routed), "{name}: {before:?}");
            let waited = run[first].took;
            assert!(answered(&run[first]), "{name}: {:?}", run[first]);
            let after = &run[first + 1..];
            assert!(!after.is_empty(), "{name}: nothing after the first timeout");
            if let Some(wrong) = after.iter().find(|s| !answered(s)) {
                panic!("{name}: {wrong:?}\n{}", logs());
            }
            let (p50, p99, max) = summary(after);
            println!(
                "edge partition: {name} router: {} cached answers, then the first request needing frozen iad \
                 waited {} ms; the next {} took median {p50:.2} ms, p99 {p99:.2} ms, max {max:.2} ms ({})",
                before.len(),
                ms(waited),
                after.len(),
                if name == "stale" {
                    "200 from the actor"
                } else {
                    "503 unavailable"
                },
            );
            measured.push((name, waited, p50, p99));
        }
        for (name, waited, p50, p99) in measured {
            assert!(
                waited >= Duration::from_millis(HOP_TIMEOUT_MS_DEFAULT),
                "{name}: {waited:?}"
            );
            assert!(
                p50 <= MEDIAN_MS_MAX,
                "{name}: median {p50:.1} ms while iad is suspect"
            );
            assert!(
                p99 < HOP_TIMEOUT_MS_DEFAULT as f64,
                "{name}: p99 {p99:.1} ms: requests waited for suspect iad"
            );
        }
        for router in [&stale, &plain] {
            assert_eq!(router.process.count("dc suspect"), 1, "{}", logs());
        }

        // 2. Resume iad: both routers route normally again within the bound.
        frozen.thaw();
        let thawed = Instant::now();
        let heal_bound = Duration::from_millis(
            PROBE_TIMEOUT_MS_DEFAULT
                + PROBE_INTERVAL_MAX_MS_DEFAULT * (100 + u64::from(PROBE_JITTER_PERCENT_DEFAULT))
                    / 100
                + HEAL_SLACK_MS,
        );
        let healed = |router: &EdgeRouterProcess, samples: &[Sample]| {
            router
                .process
                .line_since("dc answers again", thawed)
                .is_some_and(|line| samples.iter().any(|s| s.started >= line.at && routed(s)))
        };
        let deadline = thawed + heal_bound;
        let (stale_run, plain_run) = tokio::join!(
            drive(&stale, deadline, |s| healed(&stale, s)),
            drive(&plain, deadline, |s| healed(&plain, s)),
        );
        for (name, router, run) in [("stale", &stale, &stale_run), ("plain", &plain, &plain_run)] {
            assert!(
                healed(router, run),
                "{name}: not routing normally {heal_bound:?} after SIGCONT: {:?}\n{}",
                statuses(run),
                logs()
            );
            let line = router
                .process
                .line_since("dc answers again", thawed)
                .expect("healed");
            let first_fresh = run
                .iter()
                .find(|s| s.started >= line.at && routed(s))
                .expect("healed");
            println!(
                "edge partition: {name} router: after SIGCONT, iad answers again after {} ms \
                 (its log), routed normally after {} ms (bound {} ms)",
                ms(line.at - thawed),
                ms(first_fresh.ended() - thawed),
                ms(heal_bound)
            );
            // Meanwhile: what it answered while iad was suspect, or 200.
            if let Some(wrong) = run.iter().find(|s| !routed(s) && !refused(s)) {
                panic!("{name} while healing: {wrong:?}");
            }
            if name == "stale" {
                assert!(run.iter().all(routed), "stale while healing: {run:?}");
            }
        }
        actor
            .process
            .wait_for("lease renewed", thawed, Duration::from_secs(5))
            .await
            .expect("the host renews once iad answers");

        // 3. Freeze iad for good: the actor stops by its hard deadline, and
        //    no request through the stale router gets a 200 afterwards.
        let frozen = Frozen::freeze(pid);
        let frozen_at = Instant::now();
        let stopped_after = |samples: &[Sample]| {
            actor
                .process
                .line_since("stopped serving", frozen_at)
                .is_some_and(|line| {
                    samples.iter().filter(|s| s.started >= line.at).count() >= AFTER_STOP_SAMPLES
                })
        };
        let deadline = frozen_at + Duration::from_millis(LEASE_TTL_MS) + Duration::from_secs(10);
        let (stale_run, plain_run) = tokio::join!(
            drive(&stale, deadline, stopped_after),
            drive(&plain, deadline, stopped_after),
        );
        let stop = actor
            .process
            .line_since("stopped serving", frozen_at)
            .unwrap_or_else(|| panic!("the actor did not stop while iad was frozen\n{}", logs()));
        let stop_at = stop.at;
        let (served, after_stop): (Vec<Sample>, Vec<Sample>) =
            stale_run.iter().cloned().partition(|s| s.started < stop_at);
        let timeout = first_timeout(&served)
            .unwrap_or_else(|| panic!("stale: no timeout before the stop: {served:?}"));
        let stale_served = served[timeout..].iter().filter(|s| routed(s)).count();
        let last_200 = served.iter().rev().find(|s| routed(s)).map(Sample::ended);
        let plain_after_stop: Vec<Sample> = plain_run
            .iter()
            .filter(|s| s.started >= stop_at)
            .cloned()
            .collect();
        println!(
            "edge partition: iad frozen again; the actor stopped {} ms later (its lease's hard deadline); \
             the stale router served {stale_served} answers from it after its timeout, the last {} ms \
             before the stop; after the stop: stale router {:?}, plain router {:?}",
            ms(stop_at - frozen_at),
            last_200.map_or(0, |t| ms(stop_at.saturating_duration_since(t))),
            statuses(&after_stop),
            statuses(&plain_after_stop),
        );
        assert!(
            stale_served > 0,
            "stale: no answer from the actor after the timeout"
        );
        assert!(
            after_stop.len() >= AFTER_STOP_SAMPLES,
            "{}",
            after_stop.len()
        );
        if let Some(wrong) = after_stop.iter().find(|s| s.status == 200) {
            panic!("a stale 200 after the actor stopped: {wrong:?}\n{}", logs());
        }
        if let Some(wrong) = plain_after_stop.iter().find(|s| !refused(s)) {
            panic!("plain after the stop: {wrong:?}");
        }
        for router in [&stale, &plain] {
            assert_eq!(router.process.count("dc suspect"), 2, "{}", logs());
            assert_eq!(router.process.count("dc answers again"), 1, "{}", logs());
        }
        frozen.thaw();
    };
    // A failure or a timeout drops the scenario: its `Frozen` resumes iad
    // and its processes are killed before the cluster goes.
    tokio::time::timeout(SCENARIO_TIMEOUT, scenario)
        .await
        .expect("the scenario finished within its time bound");
}
