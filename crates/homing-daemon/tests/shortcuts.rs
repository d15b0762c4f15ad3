//! Shortcut notices (issue 54, defect 2): after a move, the new tail's DC
//! tells the DC of the key's first reservation, which records the new tail
//! as the chain's shortcut so cold walks skip the links between. A notice
//! that cannot be delivered (the entry's DC unreachable from the mover) is
//! sent again until the entry's DC answers it; before, it was lost, and
//! walks stayed one link longer per lost notice until the next move (past
//! the hop limit a cold walk failed).
//!
//! An in-process devnet of iad, fra and sin with a relay in front of each
//! DC: the key is reserved at iad (its entry) and moved fra, sin, fra (each
//! notice recorded), then to sin while iad is cut off from its peers; once
//! iad is reachable again, its entry record shows sin's new reservation as
//! the shortcut (waited for as an event, bounded).

use std::time::{Duration, Instant};

use homing_core::{
    AcquireReply, ActorId, DcId, KeyConfig, KeyName, ReleaseReply, Reply, Request, ReservationId,
    Role, RunOutcome,
};
use homing_daemon::{Devnet, DevnetOptions, Settings};

mod support;
use support::{lease_of, now};

/// How long the entry's DC may take to record the shortcut once it is
/// reachable again: well above the notice's retry interval.
const NOTED_WITHIN: Duration = Duration::from_secs(20);

fn dc(name: &str) -> DcId {
    DcId::new(name).unwrap()
}

fn key_name() -> KeyName {
    KeyName::new("room-shortcut").unwrap()
}

/// Acquires the key at `at` for `actor` and releases it at once; the grant.
async fn move_to(net: &Devnet, at: &str, actor: &str) -> ReservationId {
    let host = net.client(Role::Host, Some(&dc(at))).unwrap();
    let peer = net.peer(&dc(at));
    let acquire = Request::Acquire {
        lease: lease_of(actor),
        config: KeyConfig::named(key_name()),
        actor: ActorId::new(actor).unwrap(),
        host_time: now(),
        wait_ms: 0,
    };
    let grant = match host.request(&peer, &acquire).await.unwrap() {
        Reply::Acquire(AcquireReply::Acquired(grant)) => grant,
        other => panic!("acquire at {at}: {other:?}"),
    };
    let release = Request::Release {
        reservation: grant.reservation.clone(),
        token: grant.token,
        lease: lease_of(actor),
        outcome: RunOutcome::Ok,
    };
    let released = host.request(&peer, &release).await.unwrap();
    assert_eq!(released, Reply::Release(ReleaseReply::Released), "at {at}");
    grant.reservation
}

/// The shortcut iad's entry record of the key holds now.
async fn entry_shortcut(net: &Devnet) -> Option<ReservationId> {
    let admin = net.client(Role::Admin, None).unwrap();
    let inspect = Request::Inspect {
        key: homing_core::Key::new(key_name()),
    };
    match admin
        .request(&net.peer(&dc("iad")), &inspect)
        .await
        .unwrap()
    {
        Reply::Inspected { records } => records
            .iter()
            .find(|r| r.id.dc() == &dc("iad"))
            .and_then(|r| r.shortcut.as_ref())
            .map(|s| s.to.clone()),
        other => panic!("inspect at iad: {other:?}"),
    }
}

/// Waits until iad's entry record holds `expected` as its shortcut, at
/// most [`NOTED_WITHIN`] (the notice is sent in the background).
async fn until_shortcut(net: &Devnet, expected: &ReservationId) {
    let deadline = Instant::now() + NOTED_WITHIN;
    loop {
        let shortcut = entry_shortcut(net).await;
        if shortcut.as_ref() == Some(expected) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "iad's entry points at {shortcut:?}, not {expected}, after {NOTED_WITHIN:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shortcut_notice_the_entry_dc_missed_is_delivered_once_it_is_reachable() {
    let net = Devnet::start(DevnetOptions {
        dcs: ["iad", "fra", "sin"].map(dc).to_vec(),
        latency_ms: 1,
        overrides: Settings {
            peer_timeout_ms: Some(500),
            ..Settings::default()
        },
        ..DevnetOptions::default()
    })
    .await
    .unwrap();
    // iad holds the entry; a move whose predecessor is the entry tells
    // nobody (the entry's own link points at the new tail).
    move_to(&net, "iad", "10.0.0.1:1").await;
    move_to(&net, "fra", "10.0.0.2:1").await;
    let at_sin = move_to(&net, "sin", "10.0.0.3:1").await;
    until_shortcut(&net, &at_sin).await;
    let at_fra = move_to(&net, "fra", "10.0.0.2:2").await;
    until_shortcut(&net, &at_fra).await;

    // sin knows the chain from its own reservation on, so its next move
    // needs only fra; the notice to iad finds iad cut off.
    let iad = net.relay(&dc("iad")).expect("a relay in front of iad");
    iad.impairment().partition(true);
    let at_sin = move_to(&net, "sin", "10.0.0.3:2").await;
    iad.impairment().partition(false);
    until_shortcut(&net, &at_sin).await;
    net.shutdown().await;
}
