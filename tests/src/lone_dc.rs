//! A deployment of one DC: a real `homingd` on loopback with redb for both
//! its DC store and the global store (no etcd), a dev PKI, and its metrics
//! endpoint. For tests of one host against its own DC, such as
//! `homing hold`; killed when dropped.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::time::Duration;

use homing_core::{DcId, Identity, LeasePolicy, Reply, Request, Role};
use homing_net::{Client, ClientLimits, Peer, generate_dev_pki};

use crate::cluster::{TEST_REQUEST_TIMEOUT_MS, dc, free_udp_addr};
use crate::homingd::{DcStoreSpec, GlobalStoreSpec, Homingd, HomingdSpec};

/// The DC of a [`LoneDc`].
pub const LONE_DC: &str = "iad";

/// The running DC.
pub struct LoneDc {
    daemon: Homingd,
    metrics: SocketAddr,
    lease: LeasePolicy,
    dir: tempfile::TempDir,
}

impl LoneDc {
    /// Starts the daemon of [`LONE_DC`] granting leases by `lease`, with
    /// `extra_args` appended to its command line. Panics if it does not start.
    pub async fn start(lease: LeasePolicy, extra_args: &[&str]) -> LoneDc {
        let dir = tempfile::tempdir().expect("a temp dir");
        let certs = dir.path().join("certs");
        generate_dev_pki(&certs, &[dc(LONE_DC)]).expect("the dev PKI is written");
        let metrics = free_tcp_addr();
        let mut args = vec![
            format!("--lease-ttl-ms={}", lease.ttl_ms()),
            format!("--renew-at-permille={}", lease.renew_at_permille()),
            format!("--soft-margin-ms={}", lease.soft_margin_ms()),
            format!("--hard-margin-ms={}", lease.hard_margin_ms()),
            format!("--grace-ms={}", lease.grace_ms()),
            format!("--metrics-listen={metrics}"),
        ];
        args.extend(extra_args.iter().map(|a| a.to_string()));
        let spec = HomingdSpec {
            dc: dc(LONE_DC),
            listen: free_udp_addr(),
            data_dir: dir.path().join("data"),
            certs_dir: certs,
            peers: Vec::new(),
            global: GlobalStoreSpec::Redb,
            dc_store: DcStoreSpec::Redb,
            extra_args: args,
            log: dir.path().join("homingd.log"),
            binary: None,
        };
        let daemon = Homingd::start(spec).await.expect("the lone homingd starts");
        LoneDc {
            daemon,
            metrics,
            lease,
            dir,
        }
    }

    /// Its DC id.
    pub fn dc(&self) -> DcId {
        dc(LONE_DC)
    }

    /// Its QUIC address.
    pub fn addr(&self) -> SocketAddr {
        self.daemon.addr()
    }

    /// The lease policy it grants with.
    pub fn lease(&self) -> LeasePolicy {
        self.lease
    }

    /// The certificate directory, as `homing certs` writes it.
    pub fn certs_dir(&self) -> std::path::PathBuf {
        self.dir.path().join("certs")
    }

    /// A scratch directory that lives as long as the DC.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The daemon (to SIGKILL it).
    pub fn daemon(&mut self) -> &mut Homingd {
        &mut self.daemon
    }

    /// A client presenting `role`'s certificate (a host's is bound to this DC).
    pub fn client(&self, role: Role) -> Client {
        let dc = role.needs_dc().then(|| self.dc());
        let identity = Identity::new(role, dc).expect("a valid identity");
        let tls = homing_net::pki::load_identity(&self.certs_dir(), &identity)
            .expect("the dev PKI has this certificate");
        let limits = ClientLimits {
            request_timeout_ms: TEST_REQUEST_TIMEOUT_MS,
            ..ClientLimits::default()
        };
        Client::new(&tls, limits).expect("a client endpoint binds")
    }

    /// Sends `request` through `client`; panics when no answer comes.
    pub async fn ask(&self, client: &Client, request: &Request) -> Reply {
        let peer = Peer {
            addr: self.addr(),
            dc: self.dc(),
        };
        client
            .request(&peer, request)
            .await
            .expect("the lone dc answers")
    }

    /// Acquirers parked in this DC now (its `homing_waiters` gauge).
    pub async fn waiters(&self) -> u64 {
        let metrics = self.metrics;
        tokio::task::spawn_blocking(move || scrape(metrics, "homing_waiters"))
            .await
            .expect("the scrape does not panic")
    }

    /// The daemon's whole `/metrics` page.
    pub async fn metrics_text(&self) -> String {
        let metrics = self.metrics;
        tokio::task::spawn_blocking(move || metrics_page(metrics))
            .await
            .expect("the scrape does not panic")
    }

    /// Everything the daemon logged (for failure messages).
    pub fn log(&self) -> String {
        self.daemon.log()
    }
}

/// The value of the unlabelled metric `name` at `addr`'s `/metrics`.
fn scrape(addr: SocketAddr, name: &str) -> u64 {
    let text = metrics_page(addr);
    metric(&text, name).unwrap_or_else(|| panic!("no {name} in /metrics:\n{text}"))
}

/// The value of the metric line `name` (with its labels, if any) in a
/// `/metrics` page.
pub fn metric(text: &str, name: &str) -> Option<u64> {
    text.lines()
        .find_map(|line| line.strip_prefix(name)?.strip_prefix(' '))
        .and_then(|value| value.trim().parse().ok())
}

/// `addr`'s `/metrics` page.
fn metrics_page(addr: SocketAddr) -> String {
    let timeout = Some(Duration::from_millis(TEST_REQUEST_TIMEOUT_MS));
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_millis(1_000))
        .expect("the metrics endpoint accepts");
    stream.set_read_timeout(timeout).expect("a read timeout");
    stream
        .write_all(b"GET /metrics HTTP/1.0\r\nHost: homingd\r\n\r\n")
        .expect("the request is sent");
    let mut text = String::new();
    stream
        .read_to_string(&mut text)
        .expect("the metrics are read");
    text
}

/// A TCP port on 127.0.0.1 that was free a moment ago.
fn free_tcp_addr() -> SocketAddr {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free loopback port")
}
