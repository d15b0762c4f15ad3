//! homingd as a real process on loopback: requests over QUIC with mutual
//! TLS, and SIGTERM during a burst of reserves losing nothing acknowledged.
//! Every process is killed when its guard drops, also when a test fails.

use homing_core::{AcquireReply, Grant};
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use homing_core::{
    ActorId, DcId, ErrorKind, FencingToken, HostTime, Identity, Key, KeyConfig, KeyName, Reply,
    Request, Role,
};
use homing_net::{Client, ClientLimits, DevCa, Peer, generate_dev_pki};

const START_TIMEOUT: Duration = Duration::from_secs(20);

/// A running homingd; killed on drop.
struct Homingd {
    child: Child,
    addr: SocketAddr,
}

impl Drop for Homingd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> SocketAddr {
    homing_net::loopback_listen_addr().unwrap()
}

/// homingd of DC iad on `addr`, its data under `dir`/data.
fn homingd(dir: &Path, addr: SocketAddr) -> Command {
    let certs = dir.join("certs");
    let mut command = Command::new(env!("CARGO_BIN_EXE_homingd"));
    command
        .args(["--dc", "iad", "--listen", &addr.to_string()])
        .arg("--data-dir")
        .arg(dir.join("data"))
        .arg("--ca-cert")
        .arg(certs.join("ca.pem"))
        .arg("--cert")
        .arg(certs.join("node-iad.pem"))
        .arg("--key")
        .arg(certs.join("node-iad.key"))
        .env("HOMING_LOG", "warn");
    command
}

fn start(dir: &Path, addr: SocketAddr) -> Homingd {
    let mut child = homingd(dir, addr)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("homingd starts");
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let line = rx
        .recv_timeout(START_TIMEOUT)
        .expect("homingd prints its listening line");
    assert!(line.contains("listening on"), "{line}");
    Homingd { child, addr }
}

fn setup() -> (tempfile::TempDir, DevCa) {
    let dir = tempfile::tempdir().unwrap();
    generate_dev_pki(&dir.path().join("certs"), &[DcId::new("iad").unwrap()]).unwrap();
    let ca_cert = std::fs::read_to_string(dir.path().join("certs/ca.pem")).unwrap();
    let ca_key = std::fs::read_to_string(dir.path().join("certs/ca.key")).unwrap();
    let ca = DevCa::from_pem(&ca_cert, &ca_key).unwrap();
    (dir, ca)
}

fn client(ca: &DevCa, role: Role) -> Client {
    let dc = role.needs_dc().then(|| DcId::new("iad").unwrap());
    let tls = ca.tls_identity(&Identity::new(role, dc).unwrap()).unwrap();
    Client::new(&tls, ClientLimits::default()).unwrap()
}

fn now() -> HostTime {
    HostTime::from_ms(
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_millis() as u64,
    )
}

fn key(name: &str) -> Key {
    Key::new(KeyName::new(name).unwrap())
}

fn acquire(name: &str) -> Request {
    acquire_under(name, 7)
}

/// An acquire under lease key `[lease; 16]`: a new logical acquire needs a
/// new one (the same key again is a retry, answered with the first reply).
fn acquire_under(name: &str, lease: u8) -> Request {
    Request::Acquire {
        lease: homing_core::LeaseKey::from_bytes([lease; 16]).unwrap(),
        config: KeyConfig::named(KeyName::new(name).unwrap()),
        actor: ActorId::new(format!("actor-{name}")).unwrap(),
        host_time: now(),
        wait_ms: 0,
    }
}

#[tokio::test]
async fn homingd_serves_the_protocol_over_quic() {
    let (dir, ca) = setup();
    let daemon = start(dir.path(), free_port());
    let peer = Peer {
        addr: daemon.addr,
        dc: DcId::new("iad").unwrap(),
    };
    let host = client(&ca, Role::Host);
    let router = client(&ca, Role::Router);

    let Reply::Acquire(AcquireReply::Acquired(Grant {
        reservation,
        token,
        deadlines,
        ..
    })) = host.request(&peer, &acquire("room")).await.unwrap()
    else {
        panic!("acquire")
    };
    assert_eq!(reservation.dc().as_str(), "iad");
    assert_eq!(token, FencingToken::FIRST);
    assert!(deadlines.renew_at < deadlines.hard_terminate_at);

    // The router reads the global entry and the tail in one reply: iad owns both.
    match router
        .request(&peer, &Request::Resolve { key: key("room") })
        .await
        .unwrap()
    {
        Reply::Resolved {
            entry,
            segment: Some(segment),
        } => {
            assert_eq!(entry.as_ref(), Some(&reservation));
            assert_eq!(segment.tail.map(|t| t.id), Some(reservation.clone()));
        }
        other => panic!("{other:?}"),
    }
    match router
        .request(
            &peer,
            &Request::Resolve {
                key: key("never-reserved"),
            },
        )
        .await
        .unwrap()
    {
        Reply::Resolved {
            entry: None,
            segment: None,
        } => {}
        other => panic!("{other:?}"),
    }

    let renew = Request::Renew {
        lease: homing_core::LeaseKey::from_bytes([7; 16]).unwrap(),
        reservation: reservation.clone(),
        token,
        host_time: now(),
    };
    assert!(matches!(
        host.request(&peer, &renew).await.unwrap(),
        Reply::Renew(homing_core::RenewReply::Renewed(_))
    ));
    let stale = Request::Renew {
        lease: homing_core::LeaseKey::from_bytes([7; 16]).unwrap(),
        reservation: reservation.clone(),
        token: FencingToken::new(9),
        host_time: now(),
    };
    assert!(matches!(
        host.request(&peer, &stale).await.unwrap(),
        Reply::Renew(homing_core::RenewReply::StaleToken { current }) if current == token
    ));

    // Roles: a router may not acquire; a host may not link.
    match router.request(&peer, &acquire("other")).await.unwrap() {
        Reply::Error(e) => assert_eq!(e.kind, ErrorKind::Unauthorized),
        other => panic!("{other:?}"),
    }
    let link = Request::Link {
        key: homing_core::Key::new(homing_core::KeyName::new("other").unwrap()),
        from: reservation.clone(),
        to: "fra.1".parse().unwrap(),
        expected_token: token,
    };
    match host.request(&peer, &link).await.unwrap() {
        Reply::Error(e) => assert_eq!(e.kind, ErrorKind::Unauthorized),
        other => panic!("{other:?}"),
    }
    // A reservation another DC owns is refused by name.
    let foreign = Request::ResolveReservation {
        id: "fra.1".parse().unwrap(),
    };
    match router.request(&peer, &foreign).await.unwrap() {
        Reply::Error(e) => assert!(
            e.kind == ErrorKind::BadRequest && e.message.contains("owned by dc fra"),
            "{e}"
        ),
        other => panic!("{other:?}"),
    }

    let release = Request::Release {
        lease: homing_core::LeaseKey::from_bytes([7; 16]).unwrap(),
        reservation: reservation.clone(),
        token,
        outcome: homing_core::RunOutcome::Ok,
    };
    assert!(matches!(
        host.request(&peer, &release).await.unwrap(),
        Reply::Release(homing_core::ReleaseReply::Released)
    ));
    // Connect again in the same DC: re-activation with token + 1.
    match host
        .request(&peer, &acquire_under("room", 8))
        .await
        .unwrap()
    {
        Reply::Acquire(AcquireReply::Acquired(Grant {
            reservation: again,
            token: next,
            ..
        })) => {
            assert_eq!(again, reservation);
            assert_eq!(next, token.next());
        }
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn sigterm_during_a_burst_of_reserves_loses_no_acknowledged_reservation() {
    let (dir, ca) = setup();
    let addr = free_port();
    let daemon = start(dir.path(), addr);
    let peer = Peer {
        addr,
        dc: DcId::new("iad").unwrap(),
    };
    let host = client(&ca, Role::Host);

    let acknowledged = Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for worker in 0..16 {
        let (host, peer, acknowledged) = (host.clone(), peer.clone(), acknowledged.clone());
        tasks.push(tokio::spawn(async move {
            for n in 0.. {
                let name = format!("burst-{worker}-{n}");
                match tokio::time::timeout(
                    Duration::from_secs(5),
                    host.request(&peer, &acquire(&name)),
                )
                .await
                {
                    Ok(Ok(Reply::Acquire(AcquireReply::Acquired(Grant {
                        reservation, ..
                    })))) => acknowledged.lock().unwrap().push((name, reservation)),
                    _ => break, // the daemon is going away
                }
            }
        }));
    }
    let started = Instant::now();
    while acknowledged.lock().unwrap().len() < 200 && started.elapsed() < Duration::from_secs(30) {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let pid = daemon.child.id().to_string();
    assert!(
        Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .unwrap()
            .success()
    );
    for task in tasks {
        let _ = task.await;
    }
    let mut daemon = daemon;
    let status = daemon.child.wait().unwrap();
    assert!(
        status.success(),
        "homingd exits cleanly on SIGTERM: {status}"
    );
    let acknowledged = acknowledged.lock().unwrap().clone();
    assert!(
        acknowledged.len() >= 200,
        "burst too small: {}",
        acknowledged.len()
    );
    drop(daemon);

    let restarted = start(dir.path(), free_port());
    let peer = Peer {
        addr: restarted.addr,
        dc: DcId::new("iad").unwrap(),
    };
    let router = client(&ca, Role::Router);
    for (name, reservation) in &acknowledged {
        match router
            .request(&peer, &Request::Resolve { key: key(name) })
            .await
            .unwrap()
        {
            Reply::Resolved {
                entry: Some(entry),
                segment: Some(_),
            } => assert_eq!(&entry, reservation, "{name}"),
            other => panic!("acknowledged {name} → {reservation} lost after SIGTERM: {other:?}"),
        }
    }
    eprintln!(
        "{} acknowledged reservations all present after SIGTERM and restart",
        acknowledged.len()
    );
}

/// A second homingd on the data dir of a running one is refused before it
/// serves, with an error naming the file in that dir, and the first keeps
/// serving: two processes never write one redb file (redb locks it).
#[tokio::test]
async fn a_second_homingd_on_the_same_data_dir_is_refused_and_the_first_keeps_serving() {
    let (dir, ca) = setup();
    let first = start(dir.path(), free_port());
    let peer = Peer {
        addr: first.addr,
        dc: DcId::new("iad").unwrap(),
    };
    let host = client(&ca, Role::Host);
    assert!(matches!(
        host.request(&peer, &acquire("before")).await.unwrap(),
        Reply::Acquire(AcquireReply::Acquired(_))
    ));
    let second = homingd(dir.path(), free_port())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the second homingd runs");
    let guard = Homingd {
        child: second,
        addr: peer.addr,
    };
    // Bounded: a second homingd that serves never exits on its own, and the
    // guard kills it when the test fails.
    let pid = guard.child.id();
    let (tx, rx) = std::sync::mpsc::channel();
    let waiter = std::thread::spawn(move || {
        let mut guard = guard;
        let status = guard.child.wait();
        let mut stderr = String::new();
        if let Some(mut pipe) = guard.child.stderr.take() {
            let _ = std::io::Read::read_to_string(&mut pipe, &mut stderr);
        }
        let _ = tx.send((status.map(|s| s.success()), stderr));
    });
    let (succeeded, stderr) = match rx.recv_timeout(START_TIMEOUT) {
        Ok((status, stderr)) => (status.unwrap(), stderr),
        Err(_) => {
            let _ = Command::new("kill").arg(pid.to_string()).status();
            panic!("the second homingd on the same data dir did not exit: it serves");
        }
    };
    waiter.join().unwrap();
    assert!(
        !succeeded,
        "the second homingd exits with an error: {stderr}"
    );
    let data_dir = dir.path().join("data");
    assert!(
        stderr.contains("already open") && stderr.contains(&*data_dir.to_string_lossy()),
        "the error names the data dir ({}): {stderr}",
        data_dir.display()
    );
    // The first one still serves, reads and writes.
    assert!(matches!(
        host.request(&peer, &acquire("after")).await.unwrap(),
        Reply::Acquire(AcquireReply::Acquired(_))
    ));
    let router = client(&ca, Role::Router);
    assert!(matches!(
        router
            .request(&peer, &Request::Resolve { key: key("before") })
            .await
            .unwrap(),
        Reply::Resolved {
            entry: Some(_),
            segment: Some(_)
        }
    ));
    drop(first);
}

#[tokio::test]
async fn a_revoked_host_certificate_is_refused_at_its_next_connection_without_a_restart() {
    let (dir, ca) = setup();
    let certs = dir.path().join("certs");
    // Revocation is on from the start, with nothing revoked yet.
    let (crl, listed) = homing_net::pki::revoke_dev_certs(&certs, &[], 1_000).unwrap();
    assert_eq!(listed, 0);
    let addr = free_port();
    let mut child = homingd(dir.path(), addr)
        .arg("--crl")
        .arg(&crl)
        .args(["--tls-reload-ms", "50"])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("homingd starts");
    let stdout = child.stdout.take().unwrap();
    let line = BufReader::new(stdout).lines().next().unwrap().unwrap();
    assert!(line.contains("listening on"), "{line}");
    let _daemon = Homingd { child, addr };
    let peer = Peer {
        addr,
        dc: DcId::new("iad").unwrap(),
    };
    // The host's certificate as the dev PKI wrote it: the one revoked below.
    let host_tls = homing_net::pki::load_identity(
        &certs,
        &Identity::new(Role::Host, Some(peer.dc.clone())).unwrap(),
    )
    .unwrap();
    let host = || Client::new(&host_tls, ClientLimits::default()).unwrap();
    let open = host();
    assert!(matches!(
        open.request(&peer, &acquire("before")).await.unwrap(),
        Reply::Acquire(AcquireReply::Acquired(_))
    ));

    homing_net::pki::revoke_dev_certs(&certs, &["host-iad".to_string()], 1_001).unwrap();
    // homingd looks at its files every 50 ms: a new connection of the host
    // is refused once it reloaded (bounded wait, one fresh client per try).
    let deadline = Instant::now() + START_TIMEOUT;
    loop {
        let attempt = host().request(&peer, &acquire_under("after", 8)).await;
        if attempt.is_err() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the revoked host still connects: {attempt:?}"
        );
    }
    // Its open connection goes on; another certificate connects anew.
    assert!(matches!(
        open.request(&peer, &acquire_under("open", 9))
            .await
            .unwrap(),
        Reply::Acquire(AcquireReply::Acquired(_))
    ));
    let router = client(&ca, Role::Router);
    assert!(matches!(
        router
            .request(&peer, &Request::Resolve { key: key("before") })
            .await
            .unwrap(),
        Reply::Resolved { entry: Some(_), .. }
    ));
}
