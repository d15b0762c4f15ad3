//! The permanent-key quota (`keys_per_namespace_max`): a DC creates at most
//! that many keys per namespace (each keeps a global entry forever); one
//! more is refused with `QuotaExceeded` and writes nothing to the global
//! store; keys that exist still acquire, here or moved here from another
//! DC; the count survives a restart (it is read back from the DC store).

mod support;

use std::time::Duration;

use homing_core::{
    AcquireReply, ActorId, DcId, ErrorKind, KeyConfig, KeyName, Namespace, Reply, Request, Role,
    RunOutcome,
};
use homing_daemon::{Devnet, DevnetOptions, Settings};
use homing_net::Client;
use support::{held, lease_of, now};

const QUOTA: u64 = 2;

fn dc(name: &str) -> DcId {
    DcId::new(name).unwrap()
}

fn config(namespace: &str, name: &str) -> KeyConfig {
    KeyConfig {
        namespace: Namespace::new(namespace).unwrap(),
        ..KeyConfig::named(KeyName::new(name).unwrap())
    }
}

fn acquire(actor: &str, namespace: &str, name: &str) -> Request {
    Request::Acquire {
        lease: lease_of(actor),
        config: config(namespace, name),
        actor: ActorId::new(actor).unwrap(),
        host_time: now(),
        wait_ms: 0,
    }
}

fn options(dcs: &[&str], data_dir: Option<std::path::PathBuf>) -> DevnetOptions {
    DevnetOptions {
        dcs: dcs.iter().map(|d| dc(d)).collect(),
        data_dir,
        overrides: Settings {
            keys_per_namespace_max: Some(QUOTA),
            ..Settings::default()
        },
        ..DevnetOptions::default()
    }
}

async fn ask(net: &Devnet, client: &Client, at: &str, request: &Request) -> Reply {
    client.request(&net.peer(&dc(at)), request).await.unwrap()
}

/// Releases the grant `reply` holds for `actor`.
async fn release(net: &Devnet, client: &Client, at: &str, actor: &str, reply: &Reply) {
    let (reservation, token) = held(reply);
    let release = Request::Release {
        lease: lease_of(actor),
        reservation,
        token,
        outcome: RunOutcome::Ok,
    };
    match ask(net, client, at, &release).await {
        Reply::Release(_) => {}
        other => panic!("release: {other:?}"),
    }
}

fn assert_quota_exceeded(reply: &Reply) {
    match reply {
        Reply::Error(e) => assert_eq!(
            e.kind,
            ErrorKind::QuotaExceeded { keys_max: QUOTA },
            "{e:?}"
        ),
        other => panic!("expected QuotaExceeded, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn key_quota_a_create_past_it_is_refused_and_existing_keys_still_acquire() {
    tokio::time::timeout(Duration::from_secs(60), async {
        let net = Devnet::start(options(&["iad", "fra"], None)).await.unwrap();
        let iad = net.client(Role::Host, Some(&dc("iad"))).unwrap();
        let fra = net.client(Role::Host, Some(&dc("fra"))).unwrap();
        let admin = net.client(Role::Admin, None).unwrap();

        // fra creates a key in `games` and lets it go: it exists, vacant.
        let moved = ask(&net, &fra, "fra", &acquire("f", "games", "moved")).await;
        release(&net, &fra, "fra", "f", &moved).await;

        // iad creates up to its quota in `games`; one more is refused.
        let a = ask(&net, &iad, "iad", &acquire("h1", "games", "a")).await;
        held(&a);
        held(&ask(&net, &iad, "iad", &acquire("h2", "games", "b")).await);
        let refused = ask(&net, &iad, "iad", &acquire("h3", "games", "c")).await;
        assert_quota_exceeded(&refused);
        // ... and it wrote no global entry: the key does not exist.
        let resolve = Request::Resolve {
            key: config("games", "c").key(0),
        };
        match ask(&net, &admin, "iad", &resolve).await {
            Reply::Resolved { entry: None, .. } => {}
            other => panic!("a refused create left a trace: {other:?}"),
        }
        // The quota is per namespace: another one is free.
        held(&ask(&net, &iad, "iad", &acquire("h4", "chat", "x")).await);

        // Existing keys still acquire: one held here is found held...
        match ask(&net, &iad, "iad", &acquire("h5", "games", "a")).await {
            Reply::Acquire(AcquireReply::HeldElsewhere(_)) => {}
            other => panic!("expected HeldElsewhere, got {other:?}"),
        }
        // ... released, it is re-activated here...
        release(&net, &iad, "iad", "h1", &a).await;
        held(&ask(&net, &iad, "iad", &acquire("h6", "games", "a")).await);
        // ... and a key fra created moves here (a recreate writes no entry).
        let (reservation, _) =
            held(&ask(&net, &iad, "iad", &acquire("h7", "games", "moved")).await);
        assert_eq!(reservation.dc(), &dc("iad"));
        // Still full for new keys.
        assert_quota_exceeded(&ask(&net, &iad, "iad", &acquire("h8", "games", "d")).await);
        net.shutdown().await;
    })
    .await
    .expect("test finished within 60 s");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn key_quota_the_count_survives_a_restart() {
    tokio::time::timeout(Duration::from_secs(60), async {
        let dir = tempfile::tempdir().unwrap();
        let net = Devnet::start(options(&["iad"], Some(dir.path().to_path_buf())))
            .await
            .unwrap();
        let iad = net.client(Role::Host, Some(&dc("iad"))).unwrap();
        for name in ["a", "b"] {
            held(&ask(&net, &iad, "iad", &acquire(name, "games", name)).await);
        }
        net.shutdown().await;

        let net = Devnet::start(options(&["iad"], Some(dir.path().to_path_buf())))
            .await
            .unwrap();
        let iad = net.client(Role::Host, Some(&dc("iad"))).unwrap();
        assert_quota_exceeded(&ask(&net, &iad, "iad", &acquire("c", "games", "c")).await);
        net.shutdown().await;
    })
    .await
    .expect("test finished within 60 s");
}
