//! Two hosts, one key, through real homingd instances (an in-process devnet
//! over QUIC): a holder cannot release someone else's lease. The first
//! holder's token is stale once the key has a new holder; a host of another
//! DC may not release here at all, even with the current token; a host of
//! the same DC with the current token but not the holder's lease key is
//! `NotHolder` for renew and release. The current holder keeps its lease
//! through every attempt.

use std::time::Duration;

use homing_core::{
    AcquireReply, ActorId, DcId, ErrorKind, FencingToken, Holder, KeyConfig, KeyName, ReleaseReply,
    RenewReply, Reply, Request, ReservationId, Role, RunOutcome,
};
use homing_daemon::{Devnet, DevnetOptions};
use homing_net::Client;

mod support;
use support::{held, lease_of, now};

fn dc(name: &str) -> DcId {
    DcId::new(name).unwrap()
}

fn acquire(actor: &str) -> Request {
    Request::Acquire {
        lease: lease_of(actor),
        config: KeyConfig::named(KeyName::new("shared").unwrap()),
        actor: ActorId::new(actor).unwrap(),
        host_time: now(),
        wait_ms: 0,
    }
}

fn release(actor: &str, reservation: &ReservationId, token: FencingToken) -> Request {
    Request::Release {
        lease: lease_of(actor),
        reservation: reservation.clone(),
        token,
        outcome: RunOutcome::Ok,
    }
}

async fn ask(net: &Devnet, client: &Client, at: &str, request: &Request) -> Reply {
    client.request(&net.peer(&dc(at)), request).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_cannot_release_someone_elses_lease() {
    tokio::time::timeout(Duration::from_secs(60), async {
        let net = Devnet::start(DevnetOptions {
            dcs: vec![dc("iad"), dc("fra")],
            ..DevnetOptions::default()
        })
        .await
        .unwrap();
        let first = net.client(Role::Host, Some(&dc("iad"))).unwrap();
        let second = net.client(Role::Host, Some(&dc("iad"))).unwrap();
        let elsewhere = net.client(Role::Host, Some(&dc("fra"))).unwrap();

        // The first host holds the key, then lets it go; the second takes it.
        let (id, old) = held(&ask(&net, &first, "iad", &acquire("first")).await);
        let reply = ask(&net, &first, "iad", &release("first", &id, old)).await;
        assert_eq!(reply, Reply::Release(ReleaseReply::Released));
        let (again, current) = held(&ask(&net, &second, "iad", &acquire("second")).await);
        assert_eq!(again, id, "same-dc re-activation");
        assert!(current > old);

        // The first host, late, releases with its old token: refused.
        let reply = ask(&net, &first, "iad", &release("first", &id, old)).await;
        assert_eq!(reply, Reply::Release(ReleaseReply::StaleToken { current }));
        // The first host again, now with the current token (HeldElsewhere
        // tells anyone the token) but its own lease key: not the holder.
        let reply = ask(&net, &first, "iad", &release("first", &id, current)).await;
        assert_eq!(reply, Reply::Release(ReleaseReply::NotHolder));
        let renew_as = |actor: &str| Request::Renew {
            lease: lease_of(actor),
            reservation: id.clone(),
            token: current,
            host_time: now(),
        };
        let reply = ask(&net, &first, "iad", &renew_as("first")).await;
        assert_eq!(reply, Reply::Renew(RenewReply::NotHolder));
        // A host of another DC, even with the current token: refused.
        // (Refused with the connection, or answered Unauthorized.)
        let peer = net.peer(&dc("iad"));
        match elsewhere
            .request(&peer, &release("second", &id, current))
            .await
        {
            Err(homing_net::NetError::Refused { .. }) => {}
            Ok(Reply::Error(e)) => assert_eq!(e.kind, ErrorKind::Unauthorized, "{e}"),
            other => panic!("a host of fra released iad's lease: {other:?}"),
        }

        // The second host still holds it: it renews, and a newcomer is sent to it.
        match ask(&net, &second, "iad", &renew_as("second")).await {
            Reply::Renew(RenewReply::Renewed(_)) => {}
            other => panic!("the holder lost its lease: {other:?}"),
        }
        match ask(&net, &first, "iad", &acquire("third")).await {
            Reply::Acquire(AcquireReply::HeldElsewhere(Holder { actor, token, .. })) => {
                assert_eq!(actor.as_str(), "second");
                assert_eq!(token, current);
            }
            other => panic!("expected HeldElsewhere naming the holder, got {other:?}"),
        }
        net.shutdown().await;
    })
    .await
    .expect("test finished within 60 s");
}
