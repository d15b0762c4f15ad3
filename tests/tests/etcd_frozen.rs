//! One frozen etcd member must not stall homing (issue 28). A process pause
//! (a GC pause, a stalled disk, a frozen VM) keeps the member's TCP
//! connections open while it swallows every request, unlike a killed member
//! whose connections reset (`cluster.rs` covers that). Three homingd over a
//! 3-member etcd, four loops reserving fresh keys at iad, and each etcd
//! member in turn frozen with SIGSTOP for several seconds, then resumed: the
//! reserves started while it is frozen are acknowledged within
//! [`ACK_P99_MS_MAX`] at p99, nothing acknowledged is lost, no id is handed
//! out twice. The second test keeps every DC's records on the same etcd too,
//! with hosts renewing short leases: no renewal misses its deadline.
//!
//! Each test prints, per member, the first acknowledgement of a reserve
//! started after the freeze and the latency percentiles (the numbers in
//! docs/OPERATIONS.md).

#![cfg(feature = "etcd")]

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use homing_core::{
    AcquireReply, ErrorKind, Grant, LeasePolicy, RenewReply, Reply, Request, ReservationId,
};
use homing_e2e::cluster::{Cluster, acquire, dc, host_now, key, sleep_ms};
use homing_e2e::{ClusterOptions, DcStoreSpec, start_or_skip};
use homing_net::{Client, Peer};
use homing_store::GlobalStore;
use homing_store::etcd_cluster::MEMBERS;

/// Upper bound on one whole scenario, so a hang fails instead of stalling CI.
const SCENARIO_TIMEOUT: Duration = Duration::from_secs(150);
/// Reserve loops at iad (the load).
const LOOPS: usize = 4;
/// Each member stays frozen at least this long (the fault itself).
const FROZEN_MS_MIN: u64 = 3_000;
/// ... and at most this long, when reserves do not get through.
const FROZEN_MS_MAX: u64 = 8_000;
/// Reserves started after the freeze and acknowledged before the member is
/// resumed early (past [`FROZEN_MS_MIN`]).
const ACKS_WHILE_FROZEN: usize = 40;
/// Reserves acknowledged between two freezes (the store is warm again).
const ACKS_BETWEEN_FREEZES: usize = 20;
/// How long the loops may take to reach [`ACKS_BETWEEN_FREEZES`].
const WARM_MS_MAX: u64 = 30_000;
/// The bound this test holds p99 of reserves started while a member is
/// frozen to. Issue 28's target is 2 s, and the printed reports measure it
/// (58–635 ms, 1.64 s at worst on a loaded 2-core machine); the test allows
/// twice that so a busy CI machine does not turn it red, still far below
/// the stall it guards against (reserves hung until the member resumed,
/// 5–8 s, or failed).
const ACK_P99_MS_MAX: u64 = 4_000;
/// One reserve's own time bound: above the store's 10 s request timeout, so
/// a stall is measured rather than cut short.
const RESERVE_TIMEOUT_MS: u64 = 15_000;

/// One finished reserve.
#[derive(Debug, Clone)]
struct Attempt {
    name: String,
    started: Instant,
    finished: Instant,
    /// The reservation, or why the reserve was not acknowledged.
    outcome: Result<ReservationId, String>,
}

/// What the loops share with the test.
#[derive(Default)]
struct Load {
    attempts: Mutex<Vec<Attempt>>,
    /// When each loop started its current reserve.
    current: Mutex<Vec<Instant>>,
    stop: AtomicBool,
}

impl Load {
    fn acknowledged(&self) -> usize {
        let attempts = self.attempts.lock().unwrap();
        attempts.iter().filter(|a| a.outcome.is_ok()).count()
    }

    fn acknowledged_started_after(&self, at: Instant) -> usize {
        let attempts = self.attempts.lock().unwrap();
        let after = attempts.iter().filter(|a| a.started >= at);
        after.filter(|a| a.outcome.is_ok()).count()
    }

    /// Whether every loop has finished the reserves it started before `at`.
    fn all_started_after(&self, at: Instant) -> bool {
        self.current.lock().unwrap().iter().all(|s| *s >= at)
    }
}

fn reserve_loop(
    host: Client,
    peer: Peer,
    index: usize,
    load: Arc<Load>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let bound = Duration::from_millis(RESERVE_TIMEOUT_MS);
        for n in 0.. {
            if load.stop.load(Ordering::Relaxed) {
                return;
            }
            let name = format!("frozen-{index}-{n}");
            let started = Instant::now();
            load.current.lock().unwrap()[index] = started;
            let reply =
                tokio::time::timeout(bound, host.request(&peer, &acquire(&name, "10.7.7.7:1")))
                    .await;
            let outcome = match reply {
                Ok(Ok(Reply::Acquire(AcquireReply::Acquired(Grant { reservation, .. })))) => {
                    Ok(reservation)
                }
                Ok(other) => Err(format!("{other:?}")),
                Err(_) => Err(format!("no answer in {RESERVE_TIMEOUT_MS} ms")),
            };
            let finished = Instant::now();
            let attempt = Attempt {
                name,
                started,
                finished,
                outcome,
            };
            load.attempts.lock().unwrap().push(attempt);
        }
    })
}

/// How the reserves started while one member was frozen went.
#[derive(Debug)]
struct FreezeReport {
    member: usize,
    frozen_ms: u128,
    started: usize,
    failed: usize,
    /// From the freeze to the first acknowledgement of a reserve started after it.
    first_ack_ms: Option<u128>,
    p50_ms: Option<u128>,
    p99_ms: Option<u128>,
    max_ms: Option<u128>,
}

impl FreezeReport {
    fn new(
        member: usize,
        frozen_at: Instant,
        thawed_at: Instant,
        attempts: &[Attempt],
    ) -> FreezeReport {
        let window: Vec<&Attempt> = attempts
            .iter()
            .filter(|a| a.started >= frozen_at && a.started < thawed_at)
            .collect();
        // A reserve that was not acknowledged counts as slower than any that was.
        let mut latencies: Vec<Option<u128>> = window
            .iter()
            .map(|a| {
                a.outcome
                    .as_ref()
                    .ok()
                    .map(|_| (a.finished - a.started).as_millis())
            })
            .collect();
        latencies.sort_by_key(|l| l.unwrap_or(u128::MAX));
        let quantile = |q: f64| -> Option<u128> {
            let index = ((latencies.len() as f64 * q).ceil() as usize).saturating_sub(1);
            latencies.get(index).copied().flatten()
        };
        let first_ack_ms = window
            .iter()
            .filter(|a| a.outcome.is_ok())
            .map(|a| (a.finished - frozen_at).as_millis())
            .min();
        FreezeReport {
            member,
            frozen_ms: (thawed_at - frozen_at).as_millis(),
            started: window.len(),
            failed: window.iter().filter(|a| a.outcome.is_err()).count(),
            first_ack_ms,
            p50_ms: quantile(0.50),
            p99_ms: quantile(0.99),
            max_ms: latencies.last().copied().flatten(),
        }
    }

    fn ms(value: Option<u128>) -> String {
        value.map_or_else(|| "none".to_string(), |ms| format!("{ms} ms"))
    }

    fn within_bound(&self) -> bool {
        self.started > 0
            && self
                .p99_ms
                .is_some_and(|p99| p99 <= u128::from(ACK_P99_MS_MAX))
    }
}

impl std::fmt::Display for FreezeReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // A latency of "none": a reserve in that share was never acknowledged.
        write!(
            f,
            "member {} frozen {} ms: {} reserves started, {} not acknowledged; first ack {} after the freeze; p50 {}, p99 {}, max {}",
            self.member,
            self.frozen_ms,
            self.started,
            self.failed,
            FreezeReport::ms(self.first_ack_ms),
            FreezeReport::ms(self.p50_ms),
            FreezeReport::ms(self.p99_ms),
            FreezeReport::ms(self.max_ms),
        )
    }
}

/// Waits (bounded) until `done`, polling the shared load.
async fn wait_until(bound_ms: u64, done: impl Fn() -> bool) -> bool {
    let deadline = Instant::now() + Duration::from_millis(bound_ms);
    while !done() {
        if Instant::now() >= deadline {
            return false;
        }
        sleep_ms(10).await;
    }
    true
}

/// Freezes each member in turn under the reserve load and reports on each.
async fn freeze_each_member(cluster: &Cluster, load: &Arc<Load>) -> Vec<FreezeReport> {
    let mut reports = Vec::new();
    for member in 0..MEMBERS {
        let warm = load.acknowledged() + ACKS_BETWEEN_FREEZES;
        assert!(
            wait_until(WARM_MS_MAX, || load.acknowledged() >= warm).await,
            "reserves did not resume before freezing member {member}: {} acknowledged\n{}",
            load.acknowledged(),
            cluster.logs()
        );
        assert!(
            cluster.etcd_cluster().freeze_member(member),
            "member {member} runs"
        );
        let frozen_at = Instant::now();
        wait_until(FROZEN_MS_MAX, || {
            frozen_at.elapsed() >= Duration::from_millis(FROZEN_MS_MIN)
                && load.acknowledged_started_after(frozen_at) >= ACKS_WHILE_FROZEN
        })
        .await;
        assert!(
            cluster.etcd_cluster().thaw_member(member),
            "member {member} resumes"
        );
        let thawed_at = Instant::now();
        // The reserves started while it was frozen finish (each is bounded).
        let finished = wait_until(RESERVE_TIMEOUT_MS + 5_000, || {
            load.all_started_after(thawed_at)
        })
        .await;
        assert!(
            finished,
            "a reserve loop hangs after member {member} resumed"
        );
        let attempts = load.attempts.lock().unwrap().clone();
        let report = FreezeReport::new(member, frozen_at, thawed_at, &attempts);
        eprintln!("{report}");
        reports.push(report);
    }
    reports
}

/// Every acknowledged reserve resolves to its reservation (global entry and
/// the DC's record), and no reservation was handed out twice.
async fn nothing_acknowledged_is_lost(cluster: &Cluster, load: &Load) {
    let attempts = load.attempts.lock().unwrap().clone();
    let acknowledged: Vec<(&str, &ReservationId)> = attempts
        .iter()
        .filter_map(|a| a.outcome.as_ref().ok().map(|r| (a.name.as_str(), r)))
        .collect();
    let distinct: BTreeSet<&ReservationId> = acknowledged.iter().map(|(_, r)| *r).collect();
    assert_eq!(
        distinct.len(),
        acknowledged.len(),
        "a reservation id was handed out twice"
    );
    let global = cluster.global_store().await;
    let router = cluster.client(homing_core::Role::Router, None);
    let iad = dc("iad");
    for (name, reservation) in &acknowledged {
        let entry = global
            .get(&key(name))
            .await
            .expect("the global store answers");
        assert_eq!(entry.as_ref(), Some(*reservation), "global entry of {name}");
        let resolve = Request::Resolve { key: key(name) };
        match cluster.ask(&router, &iad, &resolve).await {
            Ok(Reply::Resolved {
                entry: Some(entry),
                segment: Some(segment),
            }) => {
                assert_eq!(&entry, *reservation, "{name}");
                let tail = segment.tail.expect("iad owns the tail");
                assert_eq!(&tail.id, *reservation, "{name}");
            }
            other => panic!("acknowledged {name} → {reservation} lost: {other:?}"),
        }
    }
    let failed = attempts.len() - acknowledged.len();
    eprintln!(
        "{} reserves acknowledged, {failed} not, none lost",
        acknowledged.len()
    );
}

fn start_load(cluster: &Cluster) -> (Arc<Load>, Vec<tokio::task::JoinHandle<()>>) {
    let iad = dc("iad");
    let load = Arc::new(Load::default());
    *load.current.lock().unwrap() = vec![Instant::now(); LOOPS];
    let host = cluster.host(&iad);
    let loops = (0..LOOPS)
        .map(|i| reserve_loop(host.clone(), cluster.peer(&iad), i, load.clone()))
        .collect();
    (load, loops)
}

async fn stop_load(load: &Load, loops: Vec<tokio::task::JoinHandle<()>>) {
    load.stop.store(true, Ordering::Relaxed);
    for l in loops {
        l.await.expect("no reserve loop panicked");
    }
}

fn assert_within_bound(reports: &[FreezeReport]) {
    for report in reports {
        assert!(
            report.within_bound(),
            "reserves stalled while member {} was frozen (p99 bound {ACK_P99_MS_MAX} ms): {report}",
            report.member
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_a_frozen_member_does_not_stall_reserves() {
    let Some(cluster) = start_or_skip("etcd_frozen_member", ClusterOptions::default()).await else {
        return;
    };
    tokio::time::timeout(SCENARIO_TIMEOUT, async {
        let (load, loops) = start_load(&cluster);
        let reports = freeze_each_member(&cluster, &load).await;
        stop_load(&load, loops).await;
        nothing_acknowledged_is_lost(&cluster, &load).await;
        assert_within_bound(&reports);
    })
    .await
    .expect("scenario finished within its time bound");
}

/// Hosts holding short leases at iad, renewing each when told to.
const HOLDERS: usize = 4;

/// Pause before a holder asks again after an `Unavailable` answer, in ms.
const RENEW_RETRY_MS: u64 = 100;

/// A lease short enough that a stalled store costs it: renew 2 s in, stop
/// gracefully 4.5 s in (the default policy leaves 3.7 s between the two;
/// this 2.5 s).
fn holder_lease() -> LeasePolicy {
    LeasePolicy::new(6_000, 333, 1_500, 500, 1_000).expect("an ordered policy")
}

/// What went wrong for one holder: a renewal refused, or none by the soft deadline.
type Lapses = Arc<Mutex<Vec<String>>>;

/// Acquires `name` and renews it at each `renew_at` until `stop`; a renewal
/// that is refused, or not acknowledged before the soft deadline, is a lapse.
fn holder(
    host: Client,
    peer: Peer,
    name: String,
    stop: Arc<AtomicBool>,
    lapses: Lapses,
) -> tokio::task::JoinHandle<usize> {
    tokio::spawn(async move {
        let reply = host.request(&peer, &acquire(&name, "10.7.7.8:1")).await;
        let Ok(Reply::Acquire(AcquireReply::Acquired(Grant {
            reservation,
            token,
            deadlines,
            ..
        }))) = reply
        else {
            panic!("holder {name} acquires: {reply:?}");
        };
        let mut deadlines = deadlines;
        let mut renewed = 0;
        while !stop.load(Ordering::Relaxed) {
            let wait = deadlines
                .renew_at
                .as_ms()
                .saturating_sub(host_now().as_ms());
            sleep_ms(wait).await;
            let mut last_error = None;
            loop {
                let left = deadlines
                    .soft_terminate_at
                    .as_ms()
                    .saturating_sub(host_now().as_ms());
                if left == 0 {
                    lapses.lock().unwrap().push(format!(
                        "{name}: no renewal by the soft deadline (last: {last_error:?})"
                    ));
                    return renewed;
                }
                let renew = Request::Renew {
                    lease: homing_e2e::cluster::lease_of("10.7.7.8:1"),
                    reservation: reservation.clone(),
                    token,
                    host_time: host_now(),
                };
                match tokio::time::timeout(Duration::from_millis(left), host.request(&peer, &renew))
                    .await
                {
                    Ok(Ok(Reply::Renew(RenewReply::Renewed(next)))) => {
                        deadlines = next;
                        renewed += 1;
                        break;
                    }
                    // Like HostAgent: a DC that could not reach its store is asked again.
                    Ok(Ok(Reply::Error(e))) if matches!(e.kind, ErrorKind::Unavailable { .. }) => {
                        last_error = Some(e.message);
                        sleep_ms(RENEW_RETRY_MS).await;
                    }
                    Ok(Ok(other)) => {
                        lapses
                            .lock()
                            .unwrap()
                            .push(format!("{name}: renewal refused: {other:?}"));
                        return renewed;
                    }
                    // A transport error or a timeout: try again while the deadline allows.
                    Ok(Err(e)) => last_error = Some(e.to_string()),
                    Err(_) => last_error = Some("timed out".to_string()),
                }
            }
        }
        renewed
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_a_frozen_member_of_the_dc_store_does_not_cost_a_lease() {
    let options = ClusterOptions::default()
        .with_lease(holder_lease())
        .with_dc_store(DcStoreSpec::Etcd);
    let Some(cluster) = start_or_skip("etcd_frozen_dc_store", options).await else {
        return;
    };
    tokio::time::timeout(SCENARIO_TIMEOUT, async {
        let iad = dc("iad");
        let stop = Arc::new(AtomicBool::new(false));
        let lapses: Lapses = Arc::default();
        let holders: Vec<_> = (0..HOLDERS)
            .map(|h| {
                holder(
                    cluster.host(&iad),
                    cluster.peer(&iad),
                    format!("held-{h}"),
                    stop.clone(),
                    lapses.clone(),
                )
            })
            .collect();
        let (load, loops) = start_load(&cluster);
        let reports = freeze_each_member(&cluster, &load).await;
        stop_load(&load, loops).await;
        stop.store(true, Ordering::Relaxed);
        let mut renewals = 0;
        for h in holders {
            renewals += h.await.expect("no holder panicked");
        }
        let lapses = lapses.lock().unwrap().clone();
        eprintln!("{renewals} renewals by {HOLDERS} holders; lapses: {lapses:?}");
        nothing_acknowledged_is_lost(&cluster, &load).await;
        assert!(
            lapses.is_empty(),
            "a frozen store member cost a lease: {lapses:?}\nreports: {reports:?}"
        );
        assert_within_bound(&reports);
    })
    .await
    .expect("scenario finished within its time bound");
}
