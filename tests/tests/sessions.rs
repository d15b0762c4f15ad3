//! Host sessions end to end: the real `homing session hold` against three
//! real homingd over etcd. Refused until the deployment version reads
//! sessions; once raised, one session holds a thousand keys; a drained key,
//! and a force-released one, reach their host as a notice, which stops and
//! releases it; SIGKILLed, the session's keys stay held until its expiry
//! plus grace, when the DC's reaper ends the session (its keys
//! `Released(Expired)`), and another host takes every one of them (token +
//! 1, the previous run `Expired`). The etcd leader killed under a session's
//! renewals neither shortens nor extends it. Each wait is on an event (a
//! line the process prints, an answer), each bounded.

#![cfg(feature = "etcd")]

use std::process::Command;
use std::time::{Duration, Instant};

use homing_core::wire::{PROTOCOL_VERSION, PROTOCOL_VERSION_OLDEST};
use homing_core::{
    AcquireReply, ActorId, FencingToken, KeyConfig, KeyName, RecordState, ReleaseCause,
    ReleaseReply, Reply, Request, ReservationId, Role, RunOutcome, SessionId,
};
use homing_e2e::DcStoreSpec;
use homing_e2e::cluster::{Cluster, ClusterOptions, dc, host_now, key, lease_of, start_or_skip};
use homing_e2e::edge::{Process, http_get};
use homing_e2e::homing_binary;
use homing_net::Client;

/// Upper bound on the whole scenario, so a hang fails instead of stalling CI.
const SCENARIO_TIMEOUT: Duration = Duration::from_secs(120);
/// Longest wait for any one event.
const EVENT_WAIT: Duration = Duration::from_secs(30);
/// Keys the session holds.
const KEYS: usize = 1_000;

/// Waits until iad's `/metrics` counts `rows` host sessions holding `keys`
/// keys (set after each reaper pass), within [`EVENT_WAIT`].
async fn session_gauges(cluster: &Cluster, rows: usize, keys: usize) {
    let want = [
        format!("homing_session_rows {rows}"),
        format!("homing_session_keys {keys}"),
    ];
    let since = Instant::now();
    loop {
        let page = http_get(cluster.http_addr(&dc("iad")), "/metrics", EVENT_WAIT).await;
        let seen = |line: &String| {
            page.as_ref()
                .is_ok_and(|p| p.body.lines().any(|l| l == line))
        };
        if want.iter().all(seen) {
            return;
        }
        assert!(
            since.elapsed() < EVENT_WAIT,
            "iad's metrics never said {want:?}: {page:?}"
        );
        // The gauges move once per reaper pass (every 100 ms here).
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The value of counter `name` on iad's `/metrics` now (0 for a labelled
/// series never counted yet: it has no line).
async fn counter(cluster: &Cluster, name: &str) -> u64 {
    let page = http_get(cluster.http_addr(&dc("iad")), "/metrics", EVENT_WAIT).await;
    let page = page.unwrap_or_else(|e| panic!("iad's metrics: {e:?}"));
    let line = page
        .body
        .lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '));
    match line {
        Some(value) => value
            .parse()
            .unwrap_or_else(|_| panic!("{name} {value} is no count")),
        None if name.contains('{') => 0,
        None => panic!("no {name} in {}", page.body),
    }
}

/// Who holds `<prefix>0` to `<prefix><count - 1>` at iad, as `other`'s
/// acquires find them: each must be held elsewhere (`when` says when, in a
/// failure). Reservation and token, in key order.
async fn holders(
    cluster: &Cluster,
    other: &Client,
    prefix: &str,
    count: usize,
    when: &str,
) -> Vec<(ReservationId, FencingToken)> {
    let mut found = Vec::with_capacity(count);
    for n in 0..count {
        let name = format!("{prefix}{n}");
        match cluster
            .ask(other, &dc("iad"), &acquire(&name, "other", 0))
            .await
        {
            Ok(Reply::Acquire(AcquireReply::HeldElsewhere(holder))) => {
                found.push((holder.reservation, holder.token));
            }
            reply => panic!("{name} {when}: {reply:?}"),
        }
    }
    found
}

/// Key `name`, held under the session with `token`, reached its host as a
/// notice: `hold` says it stopped it (after `since`), and `other` takes the
/// key once it is released (waiting if need be), the session's run before
/// it `Released(Ok)`.
async fn taken_after_its_host_stopped(
    cluster: &Cluster,
    other: &Client,
    hold: &Process,
    since: Instant,
    name: &str,
    token: FencingToken,
) {
    hold.wait_for(&format!("stopped {name} "), since, EVENT_WAIT)
        .await
        .unwrap();
    let wait_ms = EVENT_WAIT.as_millis() as u32;
    let reply = cluster
        .ask(other, &dc("iad"), &acquire(name, "other", wait_ms))
        .await;
    let Ok(Reply::Acquire(AcquireReply::Acquired(grant))) = reply else {
        panic!("{name} after its host stopped it: {reply:?}")
    };
    let previous = grant.previous.expect("the session's run came before");
    assert_eq!(previous.ended, ReleaseCause::Released(RunOutcome::Ok));
    assert_eq!(previous.token, token);
}

/// A scenario that did not end within [`SCENARIO_TIMEOUT`] fails with the
/// daemons' logs.
fn stalled(cluster: &Cluster) -> ! {
    panic!(
        "the scenario did not end within {SCENARIO_TIMEOUT:?}; daemon logs:\n{}",
        cluster.logs()
    )
}

/// Raises the deployment version to this build's, so the DCs serve sessions.
fn raise_deployment(certs: &std::path::Path, stores: &str) {
    for _ in PROTOCOL_VERSION_OLDEST..PROTOCOL_VERSION {
        let raised = Command::new(homing_binary())
            .args(["dc", "version", "--raise", "--stores", stores, "--certs"])
            .arg(certs)
            .output()
            .expect("homing runs");
        assert!(raised.status.success(), "{raised:?}");
    }
}

/// `homing session hold ARGS` against iad with the cluster's certificates.
fn session_hold(certs: &std::path::Path, iad: std::net::SocketAddr, args: &[&str]) -> Command {
    let mut command = Command::new(homing_binary());
    command
        .args(["session", "hold"])
        .arg("--certs")
        .arg(certs)
        .arg("--dc")
        .arg(format!("iad={iad}"))
        .args(args);
    command
}

fn acquire(name: &str, actor: &str, wait_ms: u32) -> Request {
    Request::Acquire {
        lease: lease_of(actor),
        config: KeyConfig::named(KeyName::new(name).expect("a valid key name")),
        actor: ActorId::new(actor).expect("a valid actor id"),
        host_time: host_now(),
        wait_ms,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_session_holds_its_keys_until_its_expiry_then_another_host_takes_every_one() {
    let options = ClusterOptions::short_lease().with_http();
    let Some(cluster) = start_or_skip("sessions", options).await else {
        return;
    };
    let iad = dc("iad");
    let certs = cluster.dir().join("certs");
    let stores = cluster.store_spec();
    let policy = cluster.options().lease;
    let scenario = async {
        cluster.wait_listed(EVENT_WAIT).await;

        // Before the deployment reads sessions: refused, saying what to do.
        let refused = session_hold(&certs, cluster.addr(&iad), &["early"])
            .output()
            .expect("homing runs");
        let said = String::from_utf8_lossy(&refused.stderr);
        assert_eq!(refused.status.code(), Some(77), "{said}");
        assert!(said.contains("homing dc version --raise"), "{said}");

        raise_deployment(&certs, &stores);

        let count = KEYS.to_string();
        let args = ["--count", &count, "--prefix", "room-", "--quiet"];
        let hold = Process::spawn(
            "homing session hold",
            session_hold(&certs, cluster.addr(&iad), &args),
        )
        .expect("homing session hold starts");
        let since = Instant::now();
        let holding = hold
            .wait_for("keys under session", since, EVENT_WAIT)
            .await
            .unwrap();
        assert!(
            holding.text.starts_with(&format!("holding {KEYS} keys")),
            "{}",
            hold.output()
        );
        let session: SessionId = holding
            .text
            .rsplit(' ')
            .next()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| panic!("no session id in {:?}", holding.text));
        // The operator sees them: one session, a thousand keys.
        session_gauges(&cluster, 1, KEYS).await;

        // Another host finds every key held by the session's host.
        let other = cluster.host(&iad);
        let first_holders =
            holders(&cluster, &other, "room-", KEYS, "while the session lives").await;

        // A drained key reaches its host as a notice on a renewal.
        let admin = cluster.client(Role::Admin, None);
        let drained = Request::Drain { key: key("room-7") };
        let reply = cluster.ask(&admin, &iad, &drained).await;
        assert!(matches!(reply, Ok(Reply::Drained)), "{reply:?}");
        // Its host stopped it and released it, while the session lives on:
        // another host takes it (waiting for the release if need be).
        let token = first_holders[7].1;
        taken_after_its_host_stopped(&cluster, &other, &hold, since, "room-7", token).await;

        // An operator's force release reaches the host the same way: the
        // key is frozen, listed on a renewal, stopped and released.
        let (reservation, token) = first_holders[9].clone();
        let forced = Request::ForceRelease { reservation, token };
        let reply = cluster.ask(&admin, &iad, &forced).await;
        assert!(
            matches!(reply, Ok(Reply::Release(ReleaseReply::Released))),
            "{reply:?}"
        );
        let token = first_holders[9].1;
        taken_after_its_host_stopped(&cluster, &other, &hold, since, "room-9", token).await;
        // Each notice was listed on a renewal (again only if an answer was lost).
        let listed = counter(&cluster, "homing_session_notices_listed_total").await;
        assert!(listed >= 2, "{listed} notices listed");

        // SIGKILL: nothing closes the session.
        let killed_at = Instant::now();
        drop(hold);
        let reply = cluster
            .ask(&other, &iad, &acquire("room-0", "other", 0))
            .await;
        assert!(
            matches!(reply, Ok(Reply::Acquire(AcquireReply::HeldElsewhere(_)))),
            "right after the kill, the session's key is still held: {reply:?}"
        );

        // The DC's reaper ends the session: its keys become Released
        // (Expired) without anyone asking for them.
        let inspect = Request::Inspect {
            key: key("room-500"),
        };
        let reaped = loop {
            let reply = cluster.ask(&admin, &iad, &inspect).await;
            let Ok(Reply::Inspected { records }) = reply else {
                panic!("inspecting room-500: {reply:?}")
            };
            if matches!(
                records.first().map(|r| &r.state),
                Some(RecordState::Released {
                    cause: ReleaseCause::Expired,
                    ..
                })
            ) {
                break killed_at.elapsed();
            }
            assert!(
                killed_at.elapsed() < EVENT_WAIT,
                "room-500 not reaped: {records:?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        };

        // Every key, once the session's expiry plus grace has passed.
        let wait_ms = 2 * (policy.ttl_ms() + policy.grace_ms()) as u32;
        let mut taken = 0;
        let mut first_taken = None;
        for (n, (reservation, token)) in first_holders.iter().enumerate() {
            if n == 7 || n == 9 {
                continue;
            }
            let name = format!("room-{n}");
            let reply = cluster
                .ask(&other, &iad, &acquire(&name, "other", wait_ms))
                .await;
            let Ok(Reply::Acquire(AcquireReply::Acquired(grant))) = reply else {
                panic!("{name} after the session's host was killed: {reply:?}")
            };
            let previous = grant.previous.expect("the session's run came before");
            assert_eq!(
                (&previous.reservation, previous.token),
                (reservation, *token),
                "{name}"
            );
            assert_eq!(previous.ended, ReleaseCause::Expired, "{name}");
            assert_eq!(grant.token, token.next(), "{name}");
            taken += 1;
            first_taken.get_or_insert_with(|| killed_at.elapsed());
        }
        assert_eq!(taken, KEYS - 2);
        // Every key reaped and the row deleted: no session left.
        session_gauges(&cluster, 0, 0).await;
        assert_eq!(counter(&cluster, "homing_sessions_ended_total").await, 1);
        let bound = Duration::from_millis(policy.ttl_ms() + policy.grace_ms());
        eprintln!(
            "session {session}: reaped by {reaped:?} after the kill, the first key taken {:?} after the kill, all {} by {:?} (ttl + grace {bound:?})",
            first_taken.unwrap_or_default(),
            KEYS - 2,
            killed_at.elapsed(),
        );
    };
    if tokio::time::timeout(SCENARIO_TIMEOUT, scenario)
        .await
        .is_err()
    {
        stalled(&cluster);
    }
}

/// Renewals that landed at iad, as its `/metrics` counts them.
async fn renewals(cluster: &Cluster) -> u64 {
    let ok = r#"homing_requests_total{kind="renew_session",outcome="ok"}"#;
    counter(cluster, ok).await
}

/// The etcd leader is SIGKILLed while a host session holding keys renews
/// through it (the DC store on etcd): etcd's own leases have their ttl
/// reset on a leader change, homing's sessions must neither lose a renewal
/// into a lapse (the host keeps every key: no key stopped, the keys still
/// held under their first tokens) nor come out extended (SIGKILLed after,
/// its keys are free within its ttl plus grace of its last renewal).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_etcd_leader_killed_during_renewals_neither_shortens_nor_extends_a_session() {
    let options = ClusterOptions::short_lease()
        .with_http()
        .with_dc_store(DcStoreSpec::Etcd);
    let Some(mut cluster) = start_or_skip("sessions_leader", options).await else {
        return;
    };
    let iad = dc("iad");
    let certs = cluster.dir().join("certs");
    let stores = cluster.store_spec();
    let policy = cluster.options().lease;
    let scenario = async {
        cluster.wait_listed(EVENT_WAIT).await;
        raise_deployment(&certs, &stores);
        let args = ["--count", "20", "--prefix", "lead-", "--quiet"];
        let hold = Process::spawn(
            "homing session hold",
            session_hold(&certs, cluster.addr(&iad), &args),
        )
        .expect("homing session hold starts");
        let since = Instant::now();
        hold.wait_for("keys under session", since, EVENT_WAIT)
            .await
            .unwrap();
        let other = cluster.host(&iad);
        let first = holders(&cluster, &other, "lead-", 20, "while the session lives").await;

        // Renewals under way (two landed), then the leader dies.
        while renewals(&cluster).await < 2 {
            assert!(
                since.elapsed() < EVENT_WAIT,
                "no renewal:\n{}",
                hold.output()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let leader = cluster.etcd().leader().await.expect("an etcd leader");
        let before = renewals(&cluster).await;
        cluster.etcd().kill_member(leader);
        let killed_at = Instant::now();
        eprintln!("killed etcd member {leader} (the leader) after {before} renewals");
        // Renewals go on through the new leader: four more (a ttl's worth
        // at a third of it each, past the election).
        while renewals(&cluster).await < before + 4 {
            assert!(
                killed_at.elapsed() < EVENT_WAIT,
                "renewals stopped after the etcd leader was killed:\n{}",
                hold.output()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let renewed_for = killed_at.elapsed();
        // Not shortened: the host lost nothing, every key is still held
        // under the token it was first granted.
        let printed = hold.output();
        assert!(
            !printed.contains("lost") && !printed.contains("stopped"),
            "{printed}"
        );
        let now = holders(&cluster, &other, "lead-", 20, "after the leader's death").await;
        assert_eq!(now, first);

        // Not extended: SIGKILLed now, its keys are free within the ttl
        // plus grace of its last renewal (plus a reaper pass and a wake-up).
        let renewals_at_kill = renewals(&cluster).await;
        let host_killed_at = Instant::now();
        drop(hold);
        let wait_ms = 4 * (policy.ttl_ms() + policy.grace_ms()) as u32;
        let reply = cluster
            .ask(&other, &iad, &acquire("lead-0", "other", wait_ms))
            .await;
        let freed_after = host_killed_at.elapsed();
        let Ok(Reply::Acquire(AcquireReply::Acquired(grant))) = reply else {
            panic!("lead-0 after its host was killed: {reply:?}")
        };
        assert_eq!(grant.token, first[0].1.next());
        let bound = Duration::from_millis(policy.ttl_ms() + policy.grace_ms() + 1_000);
        eprintln!(
            "renewals resumed {renewed_for:?} after the etcd leader's kill ({} landed by the host's kill); the key free {freed_after:?} after the host's kill (bound {bound:?})",
            renewals_at_kill - before
        );
        assert!(freed_after <= bound, "{freed_after:?} > {bound:?}");
    };
    if tokio::time::timeout(SCENARIO_TIMEOUT, scenario)
        .await
        .is_err()
    {
        stalled(&cluster);
    }
}
