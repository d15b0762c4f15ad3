//! A 3-DC homing deployment of real processes on loopback: `homingd` for
//! iad, fra and sin (redb DC stores in temp dirs), the global store on a real
//! 3-member etcd cluster, a dev PKI, and a [`Relay`] on every DC-to-DC path
//! (`from → to`) so a test can add latency or partition one DC.
//!
//! Routers and hosts reach a DC directly ([`Cluster::addr`]) or through a
//! relay of their own ([`Cluster::relay_to`]) when the test needs to cut
//! exactly that path.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use homing_client::{Resolver, ResolverConfig};
use homing_core::{
    ActorId, DcId, HostTime, Identity, Key, KeyConfig, KeyName, LeasePolicy, Reply, Request, Role,
};
use homing_net::{Client, ClientLimits, DevCa, NetError, Peer, Relay, generate_dev_pki};
use homing_store::etcd::EtcdGlobalStore;

use crate::homingd::{DcStoreSpec, GlobalStoreSpec, Homingd, HomingdSpec};
use homing_store::etcd_cluster::{self, LocalEtcdCluster};

/// The DCs of the cluster, in the order they are started.
pub const DCS: [&str; 3] = ["iad", "fra", "sin"];
/// A DC the PKI has a node certificate for but the cluster does not start:
/// what [`Cluster::add_dc`] adds to the running deployment.
pub const SPARE_DC: &str = "syd";
/// Timeout of one request a test sends, in milliseconds: generous, so only a
/// real hang fails a test.
pub const TEST_REQUEST_TIMEOUT_MS: u64 = 5_000;

/// `name` as a DC id (panics on an invalid name: test input).
pub fn dc(name: &str) -> DcId {
    DcId::new(name).expect("a valid dc id")
}

/// `name` as a key in the default namespace (panics on an invalid name: test input).
pub fn key(name: &str) -> Key {
    Key::new(KeyName::new(name).expect("a valid key name"))
}

/// This machine's wall clock as a host clock.
pub fn host_now() -> HostTime {
    let ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    HostTime::from_ms(ms)
}

/// The lease key the host of `actor` uses in these tests: one per actor,
/// as each HostAgent draws its own.
pub fn lease_of(actor: &str) -> homing_core::LeaseKey {
    let mut bytes = [0x5A; 16];
    for (i, b) in actor.bytes().enumerate() {
        bytes[i % 16] ^= b.rotate_left((i / 16) as u32);
    }
    homing_core::LeaseKey::from_bytes(bytes).expect("not all zeros")
}

/// An `Acquire` of `name` for `actor`, sent now, under the actor's lease
/// key: sent again while it runs, it is a retry of it (and joins it); a new
/// logical acquire takes [`acquire_anew`].
pub fn acquire(name: &str, actor: &str) -> Request {
    acquire_under(name, actor, lease_of(actor))
}

/// A new logical acquire of `name` for `actor`: a lease key never used
/// before in this process, as HostAgent draws one per acquire.
pub fn acquire_anew(name: &str, actor: &str) -> Request {
    static DRAWN: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    let n = DRAWN.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let mut bytes = lease_of(actor).into();
    let bytes: &mut [u8; 16] = &mut bytes;
    for (b, n) in bytes[8..].iter_mut().zip(n.to_le_bytes()) {
        *b ^= n;
    }
    let lease = homing_core::LeaseKey::from_bytes(*bytes).expect("not all zeros");
    acquire_under(name, actor, lease)
}

fn acquire_under(name: &str, actor: &str, lease: homing_core::LeaseKey) -> Request {
    Request::Acquire {
        lease,
        config: KeyConfig::named(KeyName::new(name).expect("a valid key name")),
        actor: ActorId::new(actor).expect("a valid actor id"),
        host_time: host_now(),
        wait_ms: 0,
    }
}

/// A UDP port on 127.0.0.1 that is free and that no other socket will be
/// given before a daemon binds it ([`homing_net::loopback_listen_addr`]).
pub fn free_udp_addr() -> SocketAddr {
    homing_net::loopback_listen_addr().expect("a free loopback port")
}

/// A distinct etcd prefix per cluster, so runs never see each other's keys.
fn unique_prefix() -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    format!(
        "/e2e/{}-{}-{}",
        std::process::id(),
        nanos,
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// How every DC's `homingd` runs: its lease policy and further flags.
#[derive(Debug, Clone, Default)]
pub struct ClusterOptions {
    /// The lease policy every DC grants with (passed as flags, so a test can
    /// compute deadlines and expiry from it).
    pub lease: LeasePolicy,
    /// Appended to every daemon's command line, after the lease flags.
    pub homingd_args: Vec<String>,
    /// Where every DC keeps its records (redb unless a test asks for etcd).
    pub dc_store: DcStoreSpec,
    /// The `homingd` every DC starts with (`None`: this build's).
    pub homingd_binary: Option<std::path::PathBuf>,
    /// Every DC serves its metrics listener (and its status page) on a
    /// loopback port of its own ([`Cluster::http_addr`]).
    pub http: bool,
}

impl ClusterOptions {
    /// A 2 s lease with tight margins and a fast reaper (scenario d's policy).
    pub fn short_lease() -> ClusterOptions {
        let lease = LeasePolicy::new(2_000, 300, 800, 400, 500).expect("an ordered policy");
        let args = ["--reaper-interval-ms=100", "--peer-timeout-ms=1000"];
        ClusterOptions {
            lease,
            homingd_args: args.iter().map(|a| a.to_string()).collect(),
            dc_store: DcStoreSpec::Redb,
            homingd_binary: None,
            http: false,
        }
    }

    /// These options with `lease` as every DC's lease policy.
    pub fn with_lease(mut self, lease: LeasePolicy) -> ClusterOptions {
        self.lease = lease;
        self
    }

    /// These options with every DC's records in `dc_store`.
    pub fn with_dc_store(mut self, dc_store: DcStoreSpec) -> ClusterOptions {
        self.dc_store = dc_store;
        self
    }

    /// These options with every DC serving `/metrics` and the status page.
    pub fn with_http(mut self) -> ClusterOptions {
        self.http = true;
        self
    }

    /// These options with `arg` appended to every daemon's command line.
    pub fn with_arg(mut self, arg: &str) -> ClusterOptions {
        self.homingd_args.push(arg.to_string());
        self
    }

    /// The daemon flags these options stand for.
    fn args(&self) -> Vec<String> {
        let lease = &self.lease;
        let mut args = vec![
            format!("--lease-ttl-ms={}", lease.ttl_ms()),
            format!("--renew-at-permille={}", lease.renew_at_permille()),
            format!("--soft-margin-ms={}", lease.soft_margin_ms()),
            format!("--hard-margin-ms={}", lease.hard_margin_ms()),
            format!("--grace-ms={}", lease.grace_ms()),
        ];
        args.extend(self.homingd_args.iter().cloned());
        args
    }
}

/// Why a cluster could not be started.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    /// etcd is missing or did not start.
    #[error(transparent)]
    Etcd(#[from] etcd_cluster::ClusterError),
    /// Anything else (PKI, a daemon, a relay).
    #[error("{0}")]
    Start(String),
}

/// The running deployment. Drop order: daemons, relays, then etcd.
pub struct Cluster {
    options: ClusterOptions,
    daemons: BTreeMap<DcId, Homingd>,
    /// Each DC's metrics listener, with [`ClusterOptions::http`].
    http: BTreeMap<DcId, SocketAddr>,
    /// `(from, to)` → the relay `from` uses to reach `to`.
    paths: BTreeMap<(DcId, DcId), Relay>,
    etcd: LocalEtcdCluster,
    ca: DevCa,
    prefix: String,
    dir: tempfile::TempDir,
}

impl Cluster {
    /// Starts etcd, the PKI, the six inter-DC relays and the three daemons.
    /// `Err(ClusterError::Etcd(etcd_cluster::ClusterError::NoBinary))` means: skip the test.
    pub async fn start(options: ClusterOptions) -> Result<Cluster, ClusterError> {
        let etcd = LocalEtcdCluster::start().await?;
        let dir = tempfile::tempdir().map_err(|e| ClusterError::Start(e.to_string()))?;
        let certs = dir.path().join("certs");
        let dcs: Vec<DcId> = DCS.iter().map(|d| dc(d)).collect();
        let with_spare: Vec<DcId> = dcs.iter().cloned().chain([dc(SPARE_DC)]).collect();
        generate_dev_pki(&certs, &with_spare).map_err(|e| ClusterError::Start(e.to_string()))?;
        let ca = load_ca(&certs)?;
        let listen: BTreeMap<DcId, SocketAddr> =
            dcs.iter().map(|d| (d.clone(), free_udp_addr())).collect();
        let mut paths = BTreeMap::new();
        for (seed, (from, to)) in pairs(&dcs).into_iter().enumerate() {
            let relay = Relay::start(local_any(), listen[&to], seed as u64 + 1)
                .await
                .map_err(|e| ClusterError::Start(format!("relay {from}→{to}: {e}")))?;
            paths.insert((from, to), relay);
        }
        let prefix = unique_prefix();
        let mut daemons = BTreeMap::new();
        let mut http = BTreeMap::new();
        for d in &dcs {
            let mut extra_args = options.args();
            if options.http {
                let addr = free_tcp_addr();
                extra_args.push(format!("--metrics-listen={addr}"));
                http.insert(d.clone(), addr);
            }
            let peers = dcs
                .iter()
                .filter(|p| *p != d)
                .map(|p| (p.clone(), paths[&(d.clone(), p.clone())].addr()))
                .collect();
            let spec = HomingdSpec {
                dc: d.clone(),
                listen: listen[d],
                data_dir: dir.path().join(d.as_str()),
                certs_dir: certs.clone(),
                peers,
                global: GlobalStoreSpec::Etcd {
                    endpoints: etcd.endpoints().to_vec(),
                    prefix: prefix.clone(),
                },
                dc_store: options.dc_store,
                extra_args,
                log: dir.path().join(format!("{d}.log")),
                binary: options.homingd_binary.clone(),
            };
            let daemon = Homingd::start(spec).await.map_err(ClusterError::Start)?;
            daemons.insert(d.clone(), daemon);
        }
        Ok(Cluster {
            options,
            daemons,
            http,
            paths,
            etcd,
            ca,
            prefix,
            dir,
        })
    }

    /// The address of `dc`'s metrics listener and status page (the cluster
    /// was started [`ClusterOptions::with_http`]).
    pub fn http_addr(&self, dc: &DcId) -> SocketAddr {
        *self
            .http
            .get(dc)
            .unwrap_or_else(|| panic!("{dc} serves no http: start the cluster with_http()"))
    }

    /// The deployment's stores as `homing` commands name them:
    /// `etcd:HOST:PORT,…?prefix=P`.
    pub fn store_spec(&self) -> String {
        let endpoints: Vec<&str> = self
            .etcd
            .endpoints()
            .iter()
            .map(|e| e.trim_start_matches("http://"))
            .collect();
        format!("etcd:{}?prefix={}", endpoints.join(","), self.prefix)
    }

    /// The options every daemon runs with.
    pub fn options(&self) -> &ClusterOptions {
        &self.options
    }

    /// The daemon of `dc`.
    pub fn daemon(&mut self, dc: &DcId) -> &mut Homingd {
        self.daemons.get_mut(dc).expect("a dc of this cluster")
    }

    /// `dc`'s QUIC address (direct, no relay).
    pub fn addr(&self, dc: &DcId) -> SocketAddr {
        self.daemons[dc].addr()
    }

    /// `dc` as a peer reached directly.
    pub fn peer(&self, dc: &DcId) -> Peer {
        Peer {
            addr: self.addr(dc),
            dc: dc.clone(),
        }
    }

    /// The relay `from` uses to reach `to`.
    pub fn path(&self, from: &DcId, to: &DcId) -> &Relay {
        &self.paths[&(from.clone(), to.clone())]
    }

    /// Cuts (or heals) every inter-DC path into and out of `dc`. Clients
    /// reaching `dc` directly are unaffected.
    pub fn partition_dc(&self, dc: &DcId, blocked: bool) {
        for ((from, to), relay) in &self.paths {
            if from == dc || to == dc {
                relay.impairment().partition(blocked);
            }
        }
    }

    /// Adds `ms` of one-way delay on every inter-DC path.
    pub fn set_inter_dc_delay_ms(&self, ms: u64) {
        for relay in self.paths.values() {
            relay.impairment().set_one_way_delay_ms(ms);
        }
    }

    /// A new relay to `dc`, for a client whose own path a test cuts.
    pub async fn relay_to(&self, dc: &DcId) -> Relay {
        Relay::start(local_any(), self.addr(dc), 0x5eed)
            .await
            .expect("a loopback relay starts")
    }

    /// A fresh client (own UDP endpoint and pool) presenting `role`'s
    /// certificate, bound to `dc` for hosts and nodes.
    pub fn client(&self, role: Role, dc: Option<&DcId>) -> Client {
        self.client_with_timeout(role, dc, TEST_REQUEST_TIMEOUT_MS)
    }

    /// Like [`Cluster::client`], giving up on a request after
    /// `request_timeout_ms` (plus what the request asks to wait): a client
    /// whose connection died with a killed daemon notices no sooner.
    pub fn client_with_timeout(
        &self,
        role: Role,
        dc: Option<&DcId>,
        request_timeout_ms: u64,
    ) -> Client {
        let identity = Identity::new(role, dc.cloned()).expect("a valid identity");
        let tls = self.ca.tls_identity(&identity).expect("the dev CA issues");
        let limits = ClientLimits {
            request_timeout_ms,
            ..ClientLimits::default()
        };
        Client::new(&tls, limits).expect("a client endpoint binds")
    }

    /// A client with a host certificate of `dc`.
    pub fn host(&self, dc: &DcId) -> Client {
        self.client(Role::Host, Some(dc))
    }

    /// A router's resolver whose DC table lists `order` nearest first, each
    /// reached directly.
    pub fn resolver(&self, order: &[&DcId]) -> Resolver {
        Resolver::new(self.client(Role::Router, None), self.resolver_config(order))
    }

    /// The default resolver config for a DC table of `order`, nearest first,
    /// to adjust before [`Cluster::resolver_with`].
    pub fn resolver_config(&self, order: &[&DcId]) -> ResolverConfig {
        let dcs = order.iter().map(|d| ((*d).clone(), self.addr(d))).collect();
        ResolverConfig::new(dcs)
    }

    /// A router's resolver with `config`.
    pub fn resolver_with(&self, config: ResolverConfig) -> Resolver {
        Resolver::new(self.client(Role::Router, None), config)
    }

    /// Sends `request` to `dc` directly through `client`.
    pub async fn ask(
        &self,
        client: &Client,
        dc: &DcId,
        request: &Request,
    ) -> Result<Reply, NetError> {
        client.request(&self.peer(dc), request).await
    }

    /// Waits (bounded by `within`) until every DC's homingd has listed
    /// itself in the DC directory, as each does at its start. Panics when
    /// they have not.
    pub async fn wait_listed(&self, within: Duration) {
        let global = self.global_store().await;
        let deadline = tokio::time::Instant::now() + within;
        loop {
            let listed = homing_store::directory::read(&global)
                .await
                .expect("the directory reads")
                .dcs()
                .len();
            if listed >= self.daemons.len() {
                return;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "{listed} of {} homingd listed themselves within {within:?}",
                self.daemons.len()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The global store the daemons share, opened by the test itself.
    pub async fn global_store(&self) -> EtcdGlobalStore {
        EtcdGlobalStore::connect(self.etcd.endpoints(), &format!("{}/global/", self.prefix))
            .await
            .expect("etcd reachable")
    }

    /// Starts one more daemon for `dc` in a deployment of its own (its own
    /// etcd prefix, data dir and port), whose peer table is `peers` (e.g. a
    /// test double). Returns it with that deployment's global store, so the
    /// test can plant global entries. `dc` must be one of [`DCS`] (it needs
    /// a node certificate).
    pub async fn start_lone_daemon(
        &self,
        dc: &DcId,
        peers: Vec<(DcId, SocketAddr)>,
        extra_args: Vec<String>,
    ) -> (Homingd, EtcdGlobalStore) {
        let prefix = unique_prefix();
        let name = format!("lone-{}", prefix.replace('/', "_"));
        let spec = HomingdSpec {
            dc: dc.clone(),
            listen: free_udp_addr(),
            data_dir: self.dir.path().join(&name),
            certs_dir: self.dir.path().join("certs"),
            peers,
            global: GlobalStoreSpec::Etcd {
                endpoints: self.etcd.endpoints().to_vec(),
                prefix: prefix.clone(),
            },
            dc_store: DcStoreSpec::Redb,
            extra_args,
            log: self.dir.path().join(format!("{name}.log")),
            binary: None,
        };
        let daemon = Homingd::start(spec).await.expect("the lone daemon starts");
        let global = EtcdGlobalStore::connect(self.etcd.endpoints(), &format!("{prefix}/global/"))
            .await
            .expect("etcd reachable");
        (daemon, global)
    }

    /// Starts one more homingd of `dc`, named `name`, sharing the stores of
    /// the one the cluster started (so the cluster's DC store must be etcd:
    /// OPERATIONS "Several homingd per DC"), on an address of its own, with
    /// `extra_args` after the cluster's flags. Peers of other DCs do not
    /// know it.
    pub async fn start_instance(&self, dc: &DcId, name: &str, extra_args: &[&str]) -> Homingd {
        let mut spec = self.daemons[dc].spec().clone();
        assert_eq!(
            spec.dc_store,
            DcStoreSpec::Etcd,
            "instances share an etcd dc store"
        );
        spec.listen = free_udp_addr();
        // Another instance binds no metrics listener of its own (the DC's
        // port is taken by the first).
        spec.extra_args
            .retain(|a| !a.starts_with("--metrics-listen="));
        spec.data_dir = self.dir.path().join(name);
        spec.log = self.dir.path().join(format!("{name}.log"));
        spec.extra_args
            .extend(extra_args.iter().map(|a| a.to_string()));
        Homingd::start(spec).await.expect("the instance starts")
    }

    /// Adds DC `dc` ([`SPARE_DC`]) to the running deployment: its homingd
    /// on the cluster's stores and flags, with no peer configured (it
    /// learns them from the DC directory, as the running DCs learn it), and
    /// no relay (every DC reaches it, and it every DC, directly).
    pub async fn add_dc(&mut self, dc: &DcId) -> Result<(), String> {
        let first = self.daemons.values().next().expect("a running dc");
        let mut spec = first.spec().clone();
        spec.dc = dc.clone();
        spec.listen = free_udp_addr();
        spec.peers = Vec::new();
        if self.options.http {
            let addr = free_tcp_addr();
            spec.extra_args
                .retain(|a| !a.starts_with("--metrics-listen="));
            spec.extra_args.push(format!("--metrics-listen={addr}"));
            self.http.insert(dc.clone(), addr);
        }
        spec.data_dir = self.dir.path().join(dc.as_str());
        spec.log = self.dir.path().join(format!("{dc}.log"));
        let daemon = Homingd::start(spec).await?;
        self.daemons.insert(dc.clone(), daemon);
        Ok(())
    }

    /// The etcd cluster (to kill a member).
    pub fn etcd(&mut self) -> &mut LocalEtcdCluster {
        &mut self.etcd
    }

    /// The etcd cluster, shared (to freeze and resume a member).
    pub fn etcd_cluster(&self) -> &LocalEtcdCluster {
        &self.etcd
    }

    /// The dev CA that issued every certificate (to issue more).
    pub fn ca(&self) -> &DevCa {
        &self.ca
    }

    /// The cluster's scratch directory (certs, data, logs).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Every daemon's log, for a failure message.
    pub fn logs(&self) -> String {
        self.daemons
            .iter()
            .map(|(dc, d)| format!("--- {dc} ---\n{}", d.log()))
            .collect()
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        // Daemons first: they hold etcd connections and relay paths.
        self.daemons.clear();
        self.paths.clear();
    }
}

fn local_any() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 0))
}

fn pairs(dcs: &[DcId]) -> Vec<(DcId, DcId)> {
    let mut out = Vec::new();
    for from in dcs {
        for to in dcs {
            if from != to {
                out.push((from.clone(), to.clone()));
            }
        }
    }
    out
}

fn load_ca(certs: &Path) -> Result<DevCa, ClusterError> {
    let read = |name: &str| -> Result<String, ClusterError> {
        let path: PathBuf = certs.join(name);
        std::fs::read_to_string(&path)
            .map_err(|e| ClusterError::Start(format!("{}: {e}", path.display())))
    };
    DevCa::from_pem(&read("ca.pem")?, &read("ca.key")?)
        .map_err(|e| ClusterError::Start(e.to_string()))
}

/// A free TCP port on loopback (for a metrics listener).
fn free_tcp_addr() -> SocketAddr {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free loopback port")
}

/// Starts a cluster, or prints why the test is skipped and returns `None`
/// (only when the etcd binary is missing; any other failure panics).
pub async fn start_or_skip(test: &str, options: ClusterOptions) -> Option<Cluster> {
    match Cluster::start(options).await {
        Ok(cluster) => Some(cluster),
        Err(ClusterError::Etcd(etcd_cluster::ClusterError::NoBinary)) => {
            eprintln!("SKIPPED {test}: no etcd binary on PATH (apt-get install etcd-server)");
            None
        }
        Err(e) => panic!("{test}: cluster did not start: {e}"),
    }
}

/// Waits `ms` milliseconds.
pub async fn sleep_ms(ms: u64) {
    tokio::time::sleep(Duration::from_millis(ms)).await;
}
