//! A connect reads the global entry from the nearest replica
//! (`GlobalStore::get_nearest`), which may lag: here a global store whose
//! nearest read never catches up answers "absent" for a key that is held.
//! The connect must still end at the holder — its write-once loses, its own
//! record is abandoned at once — and a resolve, which reads with the
//! linearizable `get`, must never see the stale "absent".

use homing_core::{AcquireReply, Holder};
use std::sync::Arc;
use std::time::Duration;

use homing_core::{
    ActorId, DcId, DcRecord, FencingToken, HostTime, Identity, Key, KeyConfig, KeyName,
    LeasePolicy, NamespaceScope, RecordState, Reply, Request, ReservationId, Role,
};
use homing_daemon::node::store_now;
use homing_net::{Client, ClientLimits, DevCa, Handler, Peer};
use homing_store::{DcStore, GlobalStore, MemoryDcStore};

mod support;

fn room() -> Key {
    Key::new(KeyName::new("room").unwrap())
}

#[tokio::test]
async fn stale_global_a_connect_that_reads_a_stale_absent_ends_at_the_holder() {
    let iad = DcId::new("iad").unwrap();
    let holder: ReservationId = "iad.1".parse().unwrap();
    // The key is held: its global entry and its live record exist.
    let global = Arc::new(support::TestGlobal {
        nearest_never_caught_up: true,
        ..support::TestGlobal::default()
    });
    global.set_if_absent(&room(), &holder).await.unwrap();
    let records = Arc::new(MemoryDcStore::new());
    let (held, _) = DcRecord::reserve(
        holder.clone(),
        room(),
        None,
        FencingToken::FIRST,
        None,
        &homing_core::Holding {
            actor: ActorId::new("first").unwrap(),
            lease: homing_core::LeaseKey::from_bytes([1; 16]).unwrap(),
            host_time: HostTime::from_ms(0),
            session: None,
        },
        store_now(),
        &LeasePolicy::DEFAULT,
    );
    records.compare_and_set(None, &held).await.unwrap();
    // Uniques below this were handed out before (iad.1 among them).
    records.raise_allocator(2).await.unwrap();

    let ca = DevCa::generate("stale global test ca").unwrap();
    let (daemon, _dir) = support::start_iad(
        &ca,
        global.clone() as Arc<dyn GlobalStore>,
        records.clone() as Arc<dyn DcStore>,
        false,
    )
    .await;
    let daemon = daemon.unwrap();
    let host_tls = ca
        .tls_identity(&Identity::new(Role::Host, Some(iad.clone())).unwrap())
        .unwrap();
    let host = Client::new(&host_tls, ClientLimits::default()).unwrap();
    let peer = Peer {
        addr: daemon.local_addr(),
        dc: iad.clone(),
    };

    let acquire = Request::Acquire {
        lease: homing_core::LeaseKey::from_bytes([7; 16]).unwrap(),
        config: KeyConfig::named(KeyName::new("room").unwrap()),
        actor: ActorId::new("second").unwrap(),
        host_time: HostTime::from_ms(1),
        wait_ms: 0,
    };
    let reply = tokio::time::timeout(Duration::from_secs(10), host.request(&peer, &acquire))
        .await
        .expect("answered in time")
        .unwrap();
    match &reply {
        Reply::Acquire(AcquireReply::HeldElsewhere(Holder {
            reservation, actor, ..
        })) => {
            assert_eq!(reservation, &holder);
            assert_eq!(actor.as_str(), "first");
        }
        other => panic!("a connect that read a stale absent answered {other:?}"),
    }

    // The connect's own record lost the write-once and is abandoned; the
    // holder's record is untouched; the global entry still names the holder.
    let all = records
        .scan(&NamespaceScope::everything(), "", None, 16)
        .await
        .unwrap();
    assert_eq!(all.len(), 2, "{all:?}");
    for record in &all {
        if record.id == holder {
            assert_eq!(record, &held);
        } else {
            assert_eq!(record.state, RecordState::Abandoned, "{record:?}");
        }
    }
    assert_eq!(global.get(&room()).await.unwrap(), Some(holder.clone()));

    // A resolve reads the entry linearizably: never the stale "absent". (A
    // key this daemon has not cached yet: one owned by another DC.)
    let hall = Key::new(KeyName::new("hall").unwrap());
    let elsewhere: ReservationId = "fra.7".parse().unwrap();
    global.set_if_absent(&hall, &elsewhere).await.unwrap();
    let router = Identity::new(Role::Router, None).unwrap();
    match daemon
        .node()
        .handle(&router, Request::Resolve { key: hall })
        .await
    {
        Reply::Resolved { entry, .. } => assert_eq!(entry, Some(elsewhere)),
        other => panic!("resolve answered {other:?}"),
    }
    daemon.shutdown().await;
}
