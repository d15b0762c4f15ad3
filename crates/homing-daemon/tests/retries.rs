//! A host's retried acquire (same key, same lease key: no answer came in
//! time) joins the acquire still running at its DC and gets its reply,
//! instead of racing it for the key; if the acquire it joined is dropped
//! unanswered (its request timed out), the retry runs itself.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use homing_core::{
    ActorId, HostTime, Identity, KeyConfig, KeyName, LeaseKey, Reply, Request, Role,
};
use homing_daemon::Daemon;
use homing_net::Handler;
use homing_store::MemoryDcStore;
use tokio::sync::Semaphore;
use tokio::task::JoinHandle;

mod support;
use support::TestGlobal;

/// Longest any step here may take on a loaded machine.
const STEP: Duration = Duration::from_secs(30);

fn acquire(name: &str, lease: u8) -> Request {
    Request::Acquire {
        lease: LeaseKey::from_bytes([lease; 16]).unwrap(),
        config: KeyConfig::named(KeyName::new(name).unwrap()),
        actor: ActorId::new("10.0.0.1:1").unwrap(),
        host_time: HostTime::from_ms(1),
        wait_ms: 0,
    }
}

/// iad on a global store whose `set_if_absent` waits for the test's permits.
async fn gated() -> (Daemon, Arc<TestGlobal>, Arc<Semaphore>, tempfile::TempDir) {
    let gate = Arc::new(Semaphore::new(0));
    let global = Arc::new(TestGlobal {
        set_gate: Some(gate.clone()),
        ..TestGlobal::default()
    });
    let ca = homing_net::DevCa::generate("retries test ca").unwrap();
    let (daemon, dir) =
        support::start_iad(&ca, global.clone(), Arc::new(MemoryDcStore::new()), false).await;
    (daemon.unwrap(), global, gate, dir)
}

/// Waits until `daemon` counted `n` joined retries.
async fn joined(daemon: &Daemon, n: u64) {
    tokio::time::timeout(STEP, async {
        while daemon.node().metrics().acquire_retries() < n {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    })
    .await
    .expect("the retry joined the acquire running");
}

/// A host's acquire of key `k` with lease key `lease` waits in the global
/// write; hearing nothing, the host sends it again, and the retry joins it.
/// Both requests' tasks.
async fn retried_while_running(
    daemon: &Daemon,
    global: &TestGlobal,
    lease: u8,
) -> (JoinHandle<Reply>, JoinHandle<Reply>) {
    let node = daemon.node().clone();
    let host = Identity::new(Role::Host, Some(node.dc().clone())).unwrap();
    let ask = |request: Request| {
        let (node, host) = (node.clone(), host.clone());
        tokio::spawn(async move { node.handle(&host, request).await })
    };
    let first = ask(acquire("k", lease));
    tokio::time::timeout(STEP, global.set_started.notified())
        .await
        .unwrap();
    let retry = ask(acquire("k", lease));
    joined(daemon, 1).await;
    (first, retry)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retried_acquire_joins_the_one_running_and_gets_its_reply() {
    let (daemon, global, gate, _dir) = gated().await;
    let (first, retry) = retried_while_running(&daemon, &global, 1).await;
    gate.add_permits(16);
    let (first, retry) = (first.await.unwrap(), retry.await.unwrap());
    assert!(matches!(first, Reply::Acquire(_)), "{first:?}");
    support::held(&first);
    assert_eq!(retry, first, "the retry gets the same grant");
    assert_eq!(
        global.sets.load(Ordering::SeqCst),
        1,
        "one connect ran: the retry raced nobody"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_whose_acquire_was_dropped_unanswered_runs_itself() {
    let (daemon, global, gate, _dir) = gated().await;
    let (first, retry) = retried_while_running(&daemon, &global, 2).await;
    // The first try's request times out at the server: its task is dropped.
    first.abort();
    assert!(first.await.unwrap_err().is_cancelled());
    tokio::time::timeout(STEP, global.set_started.notified())
        .await
        .expect("the retry runs its own connect");
    gate.add_permits(16);
    let retry = tokio::time::timeout(STEP, retry).await.unwrap().unwrap();
    support::held(&retry);
    assert_eq!(global.sets.load(Ordering::SeqCst), 2);
}
