//! A script calling `homing` in a loop must not fill a DC's connection
//! table (issue 26): the real `homing` binary, run back to back by several
//! workers against a real `homingd` (one DC, redb), with a connection share
//! small enough that connections left open by finished invocations would be
//! refused within seconds. Every invocation closes its connection before it
//! exits, so the DC frees it at once: no refusal, and the DC's open
//! connections stay near the invocations in flight. The DC's connection
//! metrics are read from its `/metrics` endpoint.
//!
//! `HOMING_E2E_LOOP_SECS` (default 15) and `HOMING_E2E_LOOP_WORKERS`
//! (default 8) set the length and width of the loop; the test prints the
//! rate it reached and the peak of open connections.

#![cfg(feature = "etcd")]

use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use homing_core::{ActorId, KeyConfig, KeyName, LeasePolicy, Reply, Request, Role};
use homing_e2e::cluster::host_now;
use homing_e2e::homing_binary;
use homing_e2e::lone_dc::{LoneDc, metric};

/// Connections one certificate may hold at the DC under test: every
/// invocation presents the same admin certificate, so without a graceful
/// close the loop is refused once this many ran within the idle timeout.
const IDENTITY_SHARE: usize = 64;

fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// What one worker saw.
#[derive(Default)]
struct Tally {
    runs: u64,
    failures: Vec<String>,
}

/// Runs `homing resolve KEY` back to back until `stop`.
fn worker(homing: PathBuf, certs: PathBuf, dcs: String, stop: Arc<AtomicBool>) -> Tally {
    let mut tally = Tally::default();
    while !stop.load(Ordering::Relaxed) {
        let out = Command::new(&homing)
            .args(["resolve", "loop-key", "--certs"])
            .arg(&certs)
            .args(["--dc", &dcs])
            .output()
            .expect("homing runs");
        tally.runs += 1;
        if !out.status.success() {
            tally.failures.push(format!(
                "{}: {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
    }
    tally
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn homing_in_a_loop_is_never_refused_and_holds_no_connections_after_it_exits() {
    let loop_secs = env_or("HOMING_E2E_LOOP_SECS", 15);
    let workers = env_or("HOMING_E2E_LOOP_WORKERS", 8) as usize;
    let share = format!("--identity-connections-max={IDENTITY_SHARE}");
    // A lease that outlives the loop: every resolve finds a live actor.
    let lease = LeasePolicy::new(600_000, 250, 1_000, 500, 500).expect("an ordered policy");
    let dc = LoneDc::start(lease, &[&share]).await;
    let admin = dc.client(Role::Admin);
    let acquire = Request::Acquire {
        lease: homing_core::LeaseKey::from_bytes([7; 16]).unwrap(),
        config: KeyConfig::named(KeyName::new("loop-key").expect("a valid key name")),
        actor: ActorId::new("10.0.0.1:8080").expect("a valid actor id"),
        host_time: host_now(),
        wait_ms: 0,
    };
    let reply = dc.ask(&admin, &acquire).await;
    assert!(
        matches!(
            reply,
            Reply::Acquire(homing_core::AcquireReply::Acquired(_))
        ),
        "{reply:?}"
    );
    admin.close().await;

    let stop = Arc::new(AtomicBool::new(false));
    let dcs = format!("{}={}", dc.dc(), dc.addr());
    let started = Instant::now();
    let handles: Vec<_> = (0..workers)
        .map(|_| {
            let (homing, certs, dcs, stop) =
                (homing_binary(), dc.certs_dir(), dcs.clone(), stop.clone());
            tokio::task::spawn_blocking(move || worker(homing, certs, dcs, stop))
        })
        .collect();
    // Sample the DC's open admin connections while the loop runs.
    let mut peak = 0;
    while started.elapsed() < Duration::from_secs(loop_secs) {
        let text = dc.metrics_text().await;
        let open = metric(&text, "homing_connections{role=\"admin\"}")
            .unwrap_or_else(|| panic!("no admin connection gauge in /metrics:\n{text}"));
        peak = peak.max(open);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    stop.store(true, Ordering::Relaxed);
    let mut runs = 0;
    let mut failures = Vec::new();
    for handle in handles {
        let tally = handle.await.expect("a worker does not panic");
        runs += tally.runs;
        failures.extend(tally.failures);
    }
    let elapsed = started.elapsed().as_secs_f64();
    println!(
        "{runs} invocations in {elapsed:.1} s by {workers} workers ({:.0}/s); peak open admin connections {peak}",
        runs as f64 / elapsed
    );
    assert!(
        failures.is_empty(),
        "{} of {runs} invocations failed, e.g. {:?}\nmetrics:\n{}",
        failures.len(),
        failures.first(),
        dc.metrics_text().await
    );
    assert!(
        runs > IDENTITY_SHARE as u64 * 2,
        "the loop ran {runs} times: too few to tell open connections from closed ones"
    );
    // In flight: one per worker, plus those whose close is on its way.
    assert!(
        peak <= 2 * workers as u64,
        "{peak} admin connections open at once with {workers} invocations in flight"
    );
    // Every invocation has exited: its close reaches the DC within moments.
    let text = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            let text = dc.metrics_text().await;
            if metric(&text, "homing_connections{role=\"admin\"}") == Some(0) {
                return text;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("admin connections still open after every invocation exited"));
    let graceful = metric(&text, "homing_connection_closes_total{kind=\"graceful\"}")
        .expect("closes by kind are exported");
    assert!(
        graceful >= runs,
        "{graceful} graceful closes for {runs} invocations\n{text}"
    );
    assert!(
        !text.contains("homing_connection_refusals_total{"),
        "no refusals: {text}"
    );
    assert!(metric(&text, "homing_handshakes").is_some(), "{text}");
}
