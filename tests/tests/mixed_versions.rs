//! An upgrade of a running deployment, one DC at a time (issue 51): three
//! DCs start on the previous release's `homingd` (built from the git tag
//! `release-7` (commit 67ed29a), which speaks protocol version 7 only; `.ci/run` builds it
//! and sets `HOMING_PREVIOUS_HOMINGD`), over a 3-member etcd. A host keeps
//! moving keys between the DCs (acquire at one DC, release, acquire the
//! same key at the next: every move links a tail in another DC, so old and
//! new homingd talk to each other) and a router resolves them, while:
//!
//! 1. each DC in turn is restarted on this release's homingd (its store
//!    written by the previous release is read by this one);
//! 2. one DC is rolled back to the previous release and upgraded again
//!    (the store this release wrote is read by the previous one);
//! 3. the deployment version is raised (every homingd speaks 8), then
//!    lowered again (nothing was written in its form).
//!
//! A request may fail while its DC restarts; it is retried once, after
//! [`RETRY_PAUSE`]. Counted: requests that failed after their retry (must
//! be 0), and fencing tokens, which must rise with every grant of a key.
//! Without `HOMING_PREVIOUS_HOMINGD` the test says how to build it and
//! passes without running (as the etcd tests do without etcd).

#![cfg(feature = "etcd")]

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use homing_client::{ResolveError, Resolver};
use homing_core::wire::PROTOCOL_VERSION_OLDEST;
use homing_core::{
    AcquireReply, DcId, FencingToken, Key, KeyName, ReleaseReply, Reply, Request, RunOutcome,
};
use homing_e2e::cluster::{Cluster, acquire_anew, dc};
use homing_e2e::{ClusterOptions, homing_binary, start_or_skip};
use homing_net::{Client, Peer};

/// Upper bound on the scenario, so a hang fails instead of stalling CI.
const SCENARIO_TIMEOUT: Duration = Duration::from_secs(150);
/// Pause before a failed request's one retry: longer than a homingd restart.
const RETRY_PAUSE: Duration = Duration::from_secs(3);
/// Keys the host moves around.
const KEYS: usize = 12;
/// Moves made between two steps of the upgrade (and before the first), at least.
const MOVES_PER_STEP: u64 = 30;

/// What the load saw.
#[derive(Debug, Default)]
struct Load {
    /// Requests that succeeded at once.
    ok: u64,
    /// Requests that succeeded on their one retry.
    retried: u64,
    /// Requests that failed after their retry, with why.
    failed: Vec<String>,
    /// Fencing tokens that did not rise with a new grant of a key.
    token_regressions: Vec<String>,
    /// Moves made (acquire and release of a key at a DC).
    moves: u64,
}

/// How the load reaches the DCs: one host client per DC (each DC's
/// address stays the same across its restarts) and a router's resolver.
struct Reach {
    hosts: Vec<(Peer, Client)>,
    resolver: Resolver,
}

impl Reach {
    fn of(cluster: &Cluster) -> Reach {
        let dcs: Vec<DcId> = ["iad", "fra", "sin"].map(dc).to_vec();
        let hosts = dcs
            .iter()
            .map(|d| (cluster.peer(d), cluster.host(d)))
            .collect();
        let resolver = cluster.resolver(&[&dcs[0], &dcs[1], &dcs[2]]);
        Reach { hosts, resolver }
    }
}

/// Sends `request` to the DC of `host`; one retry after [`RETRY_PAUSE`].
async fn ask(host: &(Peer, Client), request: &Request, load: &mut Load) -> Result<Reply, String> {
    let mut last = String::new();
    for attempt in 0..2 {
        if attempt == 1 {
            tokio::time::sleep(RETRY_PAUSE).await;
        }
        match host.1.request(&host.0, request).await {
            Ok(Reply::Error(e)) => last = e.to_string(),
            Ok(reply) => {
                match attempt {
                    0 => load.ok += 1,
                    _ => load.retried += 1,
                }
                return Ok(reply);
            }
            Err(e) => last = e.to_string(),
        }
    }
    Err(last)
}

/// One move: `name` acquired at the DC of `host` (linking its tail in
/// whichever DC held it last), resolved, released.
async fn move_once(
    reach: &Reach,
    host: &(Peer, Client),
    name: &str,
    tokens: &mut BTreeMap<String, FencingToken>,
    load: &mut Load,
) -> Result<(), String> {
    let at = &host.0.dc;
    let acquire = acquire_anew(name, "10.9.0.1:80");
    let Request::Acquire { lease, .. } = &acquire else {
        unreachable!("acquire_anew builds an acquire")
    };
    let lease = *lease;
    let grant = match ask(host, &acquire, load).await? {
        Reply::Acquire(AcquireReply::Acquired(grant)) => grant,
        other => return Err(format!("acquire {name} at {at}: {other:?}")),
    };
    if let Some(before) = tokens.insert(name.to_string(), grant.token)
        && before >= grant.token
    {
        let regression = format!("{name}: {} after {}", grant.token.get(), before.get());
        load.token_regressions.push(regression);
    }
    let key = Key::new(KeyName::new(name).expect("a valid key name"));
    match reach.resolver.resolve(&key).await {
        // The router's cached tail may lag one tail TTL behind a move.
        Ok(_) | Err(ResolveError::Vacant { .. }) => {}
        Err(e) => return Err(format!("resolve {name}: {e}")),
    }
    let release = Request::Release {
        reservation: grant.reservation.clone(),
        token: grant.token,
        lease,
        outcome: RunOutcome::Ok,
    };
    match ask(host, &release, load).await? {
        Reply::Release(ReleaseReply::Released) => Ok(()),
        other => Err(format!("release {name} at {at}: {other:?}")),
    }
}

/// Moves keys around the DCs until `stop`; what it saw.
async fn run_load(reach: Reach, stop: Arc<AtomicBool>, moves: Arc<AtomicU64>) -> Load {
    let mut load = Load::default();
    let mut tokens = BTreeMap::new();
    let mut i = 0usize;
    while !stop.load(Ordering::Relaxed) {
        let name = format!("mixed-{}", i % KEYS);
        let host = &reach.hosts[(i / KEYS) % reach.hosts.len()];
        i += 1;
        match move_once(&reach, host, &name, &mut tokens, &mut load).await {
            Ok(()) => {
                load.moves += 1;
                moves.fetch_add(1, Ordering::Relaxed);
            }
            Err(e) => load.failed.push(e),
        }
    }
    load
}

/// Waits until the load made [`MOVES_PER_STEP`] more moves than `from`.
async fn moves_past(moves: &AtomicU64, from: u64) {
    while moves.load(Ordering::Relaxed) < from + MOVES_PER_STEP {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// `homing dc version --json ARGS` on the cluster's stores: the version it printed.
fn deployment_version(cluster: &Cluster, args: &[&str]) -> u64 {
    let output = Command::new(homing_binary())
        .args(["dc", "version", "--json", "--stores"])
        .arg(cluster.store_spec())
        .arg("--certs")
        .arg(cluster.dir().join("certs"))
        .args(args)
        .output()
        .expect("homing runs");
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "homing dc version {args:?}: {text}"
    );
    let json: serde_json::Value = serde_json::from_str(text.trim()).expect("json");
    json["version"].as_u64().expect("a version")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deployment_upgrades_one_dc_at_a_time_under_load_and_rolls_back_before_raising() {
    let Some(previous) = std::env::var_os("HOMING_PREVIOUS_HOMINGD").map(PathBuf::from) else {
        eprintln!(
            "mixed_versions: skipped: set HOMING_PREVIOUS_HOMINGD to the previous release's homingd \
             (git worktree add /tmp/prev 67ed29a && cd /tmp/prev && cargo build -p homing-daemon \
             --features etcd --bin homingd), as .ci/run does"
        );
        return;
    };
    let options = ClusterOptions {
        homingd_binary: Some(previous.clone()),
        ..ClusterOptions::default()
    };
    let Some(mut cluster) = start_or_skip("mixed_versions", options).await else {
        return;
    };
    let stop = Arc::new(AtomicBool::new(false));
    let moves = Arc::new(AtomicU64::new(0));
    let load = tokio::spawn(run_load(Reach::of(&cluster), stop.clone(), moves.clone()));
    let scenario = async {
        moves_past(&moves, 0).await;
        // 1. Upgrade each DC in turn; 2. roll one back and forward again.
        let steps = [
            ("iad", None),
            ("fra", None),
            ("sin", None),
            ("sin", Some(previous.clone())),
            ("sin", None),
        ];
        for (name, binary) in steps {
            let started = Instant::now();
            let which = if binary.is_some() { "previous" } else { "this" };
            cluster
                .daemon(&dc(name))
                .restart_as(binary)
                .await
                .unwrap_or_else(|e| panic!("{name} restarts on {which} release: {e}"));
            eprintln!(
                "{name} restarted on {which} release in {:?}",
                started.elapsed()
            );
            moves_past(&moves, moves.load(Ordering::Relaxed)).await;
        }
        // 3. Every homingd speaks this release's versions now: raise by
        // one (the previous release's + 1), then roll back.
        cluster.wait_listed(Duration::from_secs(20)).await;
        assert_eq!(
            deployment_version(&cluster, &["--raise"]),
            u64::from(PROTOCOL_VERSION_OLDEST + 1)
        );
        moves_past(&moves, moves.load(Ordering::Relaxed)).await;
        assert_eq!(
            deployment_version(&cluster, &["--lower"]),
            u64::from(PROTOCOL_VERSION_OLDEST)
        );
    };
    let ended = tokio::time::timeout(SCENARIO_TIMEOUT, scenario).await;
    stop.store(true, Ordering::Relaxed);
    let load = load.await.expect("the load ran");
    eprintln!(
        "load: {} moves, {} requests answered at once, {} on their retry, {} failed after it",
        load.moves,
        load.ok,
        load.retried,
        load.failed.len()
    );
    assert!(
        ended.is_ok(),
        "the scenario did not end in time; logs:\n{}",
        cluster.logs()
    );
    assert!(
        load.failed.is_empty(),
        "failed after one retry: {:#?}",
        load.failed
    );
    assert!(
        load.token_regressions.is_empty(),
        "tokens went down: {:?}",
        load.token_regressions
    );
}
