//! Several homingd for one DC (OPERATIONS "Several homingd per DC"): three
//! real homingd processes of iad over one etcd DC store (and the etcd global
//! store), hosts and a request load spread over the three, and one of them
//! killed with SIGKILL under load. Checked:
//!
//! - no request fails beyond one retry: every acquire and release of the load
//!   goes through a `DcTable` listing the three, which sends a request that
//!   got no answer once more to the next instance; none fails;
//! - hosts whose homingd died keep their leases: their HostAgents renew
//!   through the other instances (`HostAgentConfig::alternates`), and no
//!   actor is stopped;
//! - no wake-up is lost: a waiter parked at a surviving instance is woken by
//!   a release made through another one, after the kill (long before it
//!   would re-read the record on its own).

#![cfg(feature = "etcd")]

use std::hash::{BuildHasher, RandomState};
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use homing_client::{Actor, AgentState, HostAgent, HostAgentConfig};
use homing_core::reachability::{DcSlot, ProbeSchedule};
use homing_core::{
    AcquireReply, DcId, KeyConfig, KeyName, LeasePolicy, ReleaseReply, Reply, Request, Role,
    RunOutcome,
};
use homing_e2e::DcStoreSpec;
use homing_e2e::cluster::{ClusterOptions, acquire_anew, dc, start_or_skip};
use homing_net::{Client, ClientLimits, DcTable, Peer};

/// Each homingd reads the shared log every 50 ms for the others' writes.
const LOG_FOLLOW: &str = "--log-follow-ms=50";
/// Load workers, spread over the three instances.
const WORKERS: usize = 6;
/// How long the load runs before and after the kill, in milliseconds: past
/// the hosts' first renewal (at a third of the lease).
const LOAD_BEFORE_KILL_MS: u64 = 2_000;
const LOAD_AFTER_KILL_MS: u64 = 8_000;
/// 20 s leases (renewed at 6.7 s, soft stop 3 s before the end, grace 2 s):
/// a waiter parked on a held key re-reads it on its own only when the lease
/// it saw could have run out, at least 11 s after the release below; the
/// release's wake-up through the store comes in well under that.
fn lease() -> LeasePolicy {
    LeasePolicy::new(20_000, 333, 3_000, 1_000, 2_000).expect("an ordered policy")
}
/// How long after the release the waiter must be woken: far above the
/// store-driven wake-up (`log_follow_ms` plus a store read and an acquire),
/// far below the waiter's own re-read.
const WOKEN_WITHIN: Duration = Duration::from_secs(8);
/// Timeout of one request of the load at one instance.
const REQUEST_TIMEOUT: Duration = Duration::from_millis(2_000);

/// An actor that only counts the stops it is told of.
#[derive(Default)]
struct Counted {
    stops: AtomicU64,
}

impl Actor for Counted {
    fn on_soft_terminate(&self) {
        self.stops.fetch_add(1, Ordering::SeqCst);
    }
    fn on_hard_terminate(&self) {
        self.stops.fetch_add(1, Ordering::SeqCst);
    }
}

/// The instances' addresses as a table of their DC, starting at `first`.
fn table(client: &Client, dc: &DcId, instances: &[SocketAddr], first: usize) -> DcTable {
    let addresses: Vec<_> = (0..instances.len())
        .map(|i| (dc.clone(), instances[(first + i) % instances.len()]))
        .collect();
    let seed = RandomState::new().hash_one(first);
    DcTable::new(
        client.clone(),
        &addresses,
        ProbeSchedule::default(),
        REQUEST_TIMEOUT,
        seed,
        Box::new(|_: &Peer, _| {}),
    )
}

/// What the load saw.
#[derive(Default)]
struct Load {
    ok: AtomicU64,
    failed: AtomicU64,
    first_failure: std::sync::Mutex<Option<String>>,
}

impl Load {
    fn fail(&self, what: String) {
        self.failed.fetch_add(1, Ordering::SeqCst);
        self.first_failure.lock().unwrap().get_or_insert(what);
    }
}

/// Acquires a fresh key and releases it, again and again until `until`.
async fn worker(n: usize, table: DcTable, until: Instant, load: Arc<Load>) {
    let iad = DcSlot(0);
    let mut round = 0;
    while Instant::now() < until {
        let name = format!("load-{n}-{round}");
        round += 1;
        let acquire = acquire_anew(&name, &format!("actor-{n}"));
        let Request::Acquire { lease, .. } = &acquire else {
            unreachable!("acquire_anew builds an acquire")
        };
        let lease = *lease;
        let (reservation, token) = match table.ask(iad, &acquire, REQUEST_TIMEOUT).await {
            Ok(Reply::Acquire(AcquireReply::Acquired(grant))) => (grant.reservation, grant.token),
            other => {
                load.fail(format!("acquire {name}: {other:?}"));
                continue;
            }
        };
        load.ok.fetch_add(1, Ordering::SeqCst);
        let release = Request::Release {
            lease,
            reservation,
            token,
            outcome: RunOutcome::Ok,
        };
        match table.ask(iad, &release, REQUEST_TIMEOUT).await {
            Ok(Reply::Release(ReleaseReply::Released)) => {
                load.ok.fetch_add(1, Ordering::SeqCst);
            }
            other => load.fail(format!("release {name}: {other:?}")),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn instances_one_of_three_killed_under_load_fails_no_request_beyond_one_retry() {
    let options = ClusterOptions::default()
        .with_lease(lease())
        .with_dc_store(DcStoreSpec::Etcd)
        .with_arg(LOG_FOLLOW);
    let Some(mut cluster) = start_or_skip("instances", options).await else {
        return;
    };
    let iad = dc("iad");
    let second = cluster.start_instance(&iad, "iad-2", &[]).await;
    let third = cluster.start_instance(&iad, "iad-3", &[]).await;
    let host = Client::new(
        &cluster
            .ca()
            .tls_identity(&homing_core::Identity::new(Role::Host, Some(iad.clone())).unwrap())
            .unwrap(),
        ClientLimits::default(),
    )
    .unwrap();
    let first_addr = cluster.addr(&iad);
    let (second_addr, third_addr) = (second.addr(), third.addr());

    // Hosts whose homingd is the one to be killed, the others behind it.
    let mut agents = Vec::new();
    let actor = Arc::new(Counted::default());
    for n in 0..4 {
        let config = HostAgentConfig {
            alternates: vec![second_addr, third_addr],
            ..HostAgentConfig::new(
                Peer {
                    addr: first_addr,
                    dc: iad.clone(),
                },
                KeyConfig::named(KeyName::new(format!("held-{n}")).unwrap()),
                homing_core::ActorId::new(format!("host-{n}")).unwrap(),
            )
        };
        match HostAgent::start(host.clone(), config, actor.clone())
            .await
            .unwrap()
        {
            AcquireReply::Acquired(agent) => agents.push(agent),
            other => panic!("host {n}: {other:?}"),
        }
    }

    // A waiter parked at the third instance for the key host 0 holds.
    let waiter = {
        let host = host.clone();
        let at = Peer {
            addr: third_addr,
            dc: iad.clone(),
        };
        let mut request = acquire_anew("held-0", "waiter");
        if let Request::Acquire { wait_ms, .. } = &mut request {
            *wait_ms = 60_000;
        }
        tokio::spawn(async move { host.request(&at, &request).await })
    };

    // The load, each worker starting at another instance.
    let load = Arc::new(Load::default());
    let until = Instant::now() + Duration::from_millis(LOAD_BEFORE_KILL_MS + LOAD_AFTER_KILL_MS);
    let instances = [first_addr, second_addr, third_addr];
    let workers: Vec<_> = (0..WORKERS)
        .map(|n| {
            let table = table(&host, &iad, &instances, n % 3);
            tokio::spawn(worker(n, table, until, load.clone()))
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(LOAD_BEFORE_KILL_MS)).await;
    let before_kill = load.ok.load(Ordering::SeqCst);
    cluster.daemon(&iad).kill();
    for worker in workers {
        worker.await.unwrap();
    }
    let after_kill = load.ok.load(Ordering::SeqCst) - before_kill;

    // Every host still holds its lease, renewed through the others.
    for agent in &agents {
        assert_eq!(agent.state(), AgentState::Holding);
    }
    assert_eq!(
        actor.stops.load(Ordering::SeqCst),
        0,
        "no actor was stopped"
    );

    // Host 0 releases (through a surviving instance): the waiter parked at
    // the third wakes and takes the key.
    let mut agents = agents.into_iter();
    agents.next().unwrap().stop().await.unwrap();
    let woken = tokio::time::timeout(WOKEN_WITHIN, waiter)
        .await
        .expect("the waiter parked at the third instance is woken by a release through the second")
        .unwrap();
    assert!(
        matches!(woken, Ok(Reply::Acquire(AcquireReply::Acquired(_)))),
        "the waiter takes the released key: {woken:?}"
    );
    for agent in agents {
        agent.stop().await.unwrap();
    }

    let failed = load.failed.load(Ordering::SeqCst);
    assert_eq!(
        failed,
        0,
        "requests failed after one retry: {:?}",
        load.first_failure.lock().unwrap()
    );
    assert!(
        before_kill > 0 && after_kill > 0,
        "the load ran before and after the kill: {before_kill}, {after_kill}"
    );
    eprintln!(
        "instances: {before_kill} requests answered before the kill, {after_kill} after, 0 failed"
    );
}
