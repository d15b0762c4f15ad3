//! Absent keys are cheap (DESIGN.md §7.4): a resolve's "no global entry"
//! is reused for `absent_ttl_ms`, concurrent resolves of one absent key
//! share one global read, and the cached absence never decides a create —
//! a connect right after it still reserves the key, and the next resolve
//! sees it.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use homing_core::{
    ActorId, HostTime, Identity, Key, KeyConfig, KeyName, Reply, Request, ReservationId, Role,
};
use homing_net::Handler;
use homing_store::{GlobalStore, MemoryDcStore};

mod support;

fn key(name: &str) -> Key {
    Key::new(KeyName::new(name).unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn absent_keys_share_one_read_and_never_decide_a_create() {
    // Slow reads: the concurrent resolves overlap with the first one.
    let global = Arc::new(support::TestGlobal {
        get_delay: Duration::from_millis(20),
        ..support::TestGlobal::default()
    });
    let ca = homing_net::DevCa::generate("absent test ca").unwrap();
    let (daemon, _dir) =
        support::start_iad(&ca, global.clone(), Arc::new(MemoryDcStore::new()), false).await;
    let daemon = daemon.unwrap();
    let node = daemon.node().clone();
    let router = Identity::new(Role::Router, None).unwrap();
    let resolve = |name: &str| {
        let (node, router) = (node.clone(), router.clone());
        let request = Request::Resolve { key: key(name) };
        async move { node.handle(&router, request).await }
    };
    let absent = Reply::Resolved {
        entry: None,
        segment: None,
    };

    // 64 concurrent resolves of one absent key: one global read.
    let storm: Vec<_> = (0..64).map(|_| tokio::spawn(resolve("nobody"))).collect();
    for answer in storm {
        assert_eq!(answer.await.unwrap(), absent);
    }
    assert_eq!(global.gets.load(Ordering::SeqCst), 1, "misses coalesce");
    // Asked again at once: the absence is reused.
    for _ in 0..100 {
        assert_eq!(resolve("nobody").await, absent);
    }
    assert!(
        global.gets.load(Ordering::SeqCst) <= 2,
        "{} reads for 164 resolves within the absent TTL",
        global.gets.load(Ordering::SeqCst)
    );

    // A connect right after a cached absence still reserves the key (only
    // set_if_absent decides a create), and resolves see it at once.
    let acquire = Request::Acquire {
        lease: homing_core::LeaseKey::from_bytes([7; 16]).unwrap(),
        config: KeyConfig::named(KeyName::new("nobody").unwrap()),
        actor: ActorId::new("10.0.0.1:1").unwrap(),
        host_time: HostTime::from_ms(1),
        wait_ms: 0,
    };
    let host = Identity::new(Role::Host, Some(node.dc().clone())).unwrap();
    let (reservation, _) = support::held(&node.handle(&host, acquire).await);
    match resolve("nobody").await {
        Reply::Resolved { entry, .. } => assert_eq!(entry, Some(reservation)),
        other => panic!("{other:?}"),
    }

    // A key reserved by another DC (written straight to the global store)
    // shows once the absence has aged out: the cache bounds staleness.
    let elsewhere: ReservationId = "fra.7".parse().unwrap();
    assert_eq!(resolve("later").await, absent);
    global
        .inner
        .set_if_absent(&key("later"), &elsewhere)
        .await
        .unwrap();
    let seen = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            if let Reply::Resolved {
                entry: Some(id), ..
            } = resolve("later").await
            {
                return id;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .expect("the absence ages out");
    assert_eq!(seen, elsewhere);
    daemon.shutdown().await;
}
