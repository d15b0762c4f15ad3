//! A host that gave up on an acquire (no answer in time) tells its DC
//! `Cancel`; when the acquire is still running there — waiting for the
//! key's holder — the DC notes the lease key, and the grant made once the
//! key is freed is released before the answer: no phantom holder.

use std::sync::Arc;
use std::time::Duration;

use homing_core::{
    AcquireReply, ActorId, HostTime, Identity, KeyConfig, KeyName, LeaseKey, RecordState,
    ReleaseReply, Reply, Request, Role, RunOutcome,
};
use homing_net::Handler;
use homing_store::MemoryDcStore;

mod support;
use support::TestGlobal;

/// Longest any step here may take on a loaded machine.
const STEP: Duration = Duration::from_secs(30);

fn lease(n: u8) -> LeaseKey {
    LeaseKey::from_bytes([n; 16]).unwrap()
}

fn acquire(lease_n: u8, wait_ms: u32) -> Request {
    Request::Acquire {
        lease: lease(lease_n),
        config: KeyConfig::named(KeyName::new("k").unwrap()),
        actor: ActorId::new(format!("10.0.0.{lease_n}:1")).unwrap(),
        host_time: HostTime::from_ms(1),
        wait_ms,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_noted_while_the_acquire_waits_releases_its_grant_as_it_lands() {
    let ca = homing_net::DevCa::generate("cancel test ca").unwrap();
    let global = Arc::new(TestGlobal::default());
    let records = Arc::new(MemoryDcStore::new());
    let (daemon, _dir) = support::start_iad(&ca, global, records, false).await;
    let daemon = daemon.unwrap();
    let node = daemon.node().clone();
    let host = Identity::new(Role::Host, Some(node.dc().clone())).unwrap();

    let (held, token) = support::held(&node.handle(&host, acquire(1, 0)).await);
    let waiting = {
        let (node, host) = (node.clone(), host.clone());
        tokio::spawn(async move { node.handle(&host, acquire(2, 20_000)).await })
    };
    tokio::time::timeout(STEP, async {
        while node.waiting() == 0 {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    })
    .await
    .expect("the second acquire waits for the holder");

    // Its host gives up: nothing was granted under its lease key yet.
    let key = homing_core::Key::new(KeyName::new("k").unwrap());
    let cancel = Request::Cancel {
        key: key.clone(),
        lease: lease(2),
    };
    assert_eq!(node.handle(&host, cancel).await, Reply::Cancelled(false));

    // The holder releases: the waiting acquire is granted, and releases it.
    let release = Request::Release {
        reservation: held.clone(),
        token,
        lease: lease(1),
        outcome: RunOutcome::Ok,
    };
    assert_eq!(
        node.handle(&host, release).await,
        Reply::Release(ReleaseReply::Released)
    );
    let answer = tokio::time::timeout(STEP, waiting).await.unwrap().unwrap();
    let Reply::Acquire(AcquireReply::Acquired(grant)) = &answer else {
        panic!("the waiting acquire is granted: {answer:?}");
    };
    let inspected = node.handle(&host, Request::Inspect { key }).await;
    let Reply::Inspected { records } = inspected else {
        panic!("inspect answered {inspected:?}");
    };
    let record = records
        .iter()
        .find(|r| r.id == grant.reservation)
        .expect("the grant's record");
    assert!(
        !matches!(record.state, RecordState::Active { .. }),
        "a grant its host gave up on is released before the answer: {:?}",
        record.state
    );
}
