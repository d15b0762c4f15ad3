//! homingd's configuration: a TOML file, overridden by `HOMING_*`
//! environment variables, overridden by flags. One struct, [`Settings`],
//! carries every field as an `Option` for all three sources; [`Config`] is
//! the validated result, and each error names the field that broke.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;

use clap::Args;
use homing_core::chain::{HOP_LIMIT_DEFAULT, HOP_LIMIT_MAX};
use homing_core::{DcId, DcTerms, LeasePolicy, TakeoverPolicy};
use homing_net::{ConnectionShares, ServerLimits};
use homing_node::KEYS_PER_NAMESPACE_MAX_DEFAULT;
use serde::Deserialize;
use thiserror::Error;

pub use crate::waiters::WaitLimits;

/// Which backend holds a store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreKind {
    /// Embedded redb files under `data_dir` (the default).
    Redb,
    /// An etcd cluster (cargo feature `etcd`).
    Etcd,
    /// A FoundationDB cluster (cargo feature `fdb`).
    Fdb,
}

/// Every setting, each optional, as read from one source.
#[derive(Debug, Clone, Default, Args, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Settings {
    /// This daemon's DC id: 1–32 characters of [a-z0-9-].
    #[arg(long, env = "HOMING_DC")]
    pub dc: Option<String>,
    /// QUIC address to serve on, e.g. 0.0.0.0:7400.
    #[arg(long, env = "HOMING_LISTEN")]
    pub listen: Option<SocketAddr>,
    /// HTTP address for /metrics, /healthz (the process serves), /readyz (the DC can grant) and the status page (/); unset disables the endpoint.
    #[arg(long, env = "HOMING_METRICS_LISTEN")]
    pub metrics_listen: Option<SocketAddr>,
    /// The address peers and routers reach this homingd at, listed in the DC directory in the global store at start (e.g. 10.0.1.1:7400). Default: the listen address, unless it is a wildcard (0.0.0.0, [::]): then this homingd is not listed, and says so.
    #[arg(long, env = "HOMING_ADVERTISE")]
    pub advertise: Option<SocketAddr>,
    /// How often the DC directory is read from the global store, in milliseconds: DCs and homingd listed there and not in --peer become peers, and routers asking for the directory get this copy. 0: never (the directory is neither read nor written; peers are --peer only).
    #[arg(long, env = "HOMING_DIRECTORY_REFRESH_MS")]
    pub directory_refresh_ms: Option<u64>,
    /// Peer DCs as DC=ADDR, repeatable (env: comma-separated), e.g. fra=10.0.2.1:7400; a DC served by several homingd is listed once per address (fra=10.0.2.1:7400,fra=10.0.2.2:7400), and a request goes to its next address when one does not answer.
    #[arg(long = "peer", env = "HOMING_PEERS", value_delimiter = ',', value_parser = parse_peer)]
    #[serde(default, deserialize_with = "peers_from_table")]
    pub peers: Option<Vec<(String, SocketAddr)>>,
    /// Directory for the redb DC store (and the redb global store, if used).
    #[arg(long, env = "HOMING_DATA_DIR")]
    pub data_dir: Option<PathBuf>,
    /// PEM file of the deployment's CA.
    #[arg(long, env = "HOMING_CA_CERT")]
    pub ca_cert: Option<PathBuf>,
    /// PEM file of this node's certificate (role node, this DC).
    #[arg(long, env = "HOMING_CERT")]
    pub cert: Option<PathBuf>,
    /// PEM file of this node's private key.
    #[arg(long, env = "HOMING_KEY")]
    pub key: Option<PathBuf>,
    /// PEM file of the CA's certificate revocation list (e.g. `homing certs revoke`'s crl.pem): a peer, host, router or admin whose certificate it lists is refused at its next connection. Unset: no revocation.
    #[arg(long, env = "HOMING_CRL")]
    pub crl: Option<PathBuf>,
    /// How often the certificate, key, CA and revocation-list files are checked for changes, in milliseconds; changed files are loaded for new connections (open ones go on), files that do not load are logged and the ones in use kept. 0: never.
    #[arg(long, env = "HOMING_TLS_RELOAD_MS")]
    pub tls_reload_ms: Option<u64>,
    /// DC store backend: redb (default), etcd or fdb.
    #[arg(long, env = "HOMING_DC_STORE")]
    pub dc_store: Option<String>,
    /// Global store backend: etcd, fdb, or redb (one process only: tests and the devnet).
    #[arg(long, env = "HOMING_GLOBAL_STORE")]
    pub global_store: Option<String>,
    /// etcd endpoints, comma-separated host:port.
    #[arg(long, env = "HOMING_ETCD_ENDPOINTS", value_delimiter = ',')]
    pub etcd_endpoints: Option<Vec<String>>,
    /// Key prefix of this deployment in etcd or FoundationDB, e.g. /homing/prod.
    #[arg(long, env = "HOMING_STORE_PREFIX")]
    pub store_prefix: Option<String>,
    /// FoundationDB cluster file (default: the platform's, /etc/foundationdb/fdb.cluster).
    #[arg(long, env = "HOMING_FDB_CLUSTER_FILE")]
    pub fdb_cluster_file: Option<PathBuf>,
    /// How often homingd compacts etcd's history when a store is on etcd, in milliseconds (0: never, e.g. when etcd runs its own --auto-compaction).
    #[arg(long, env = "HOMING_ETCD_COMPACT_INTERVAL_MS")]
    pub etcd_compact_interval_ms: Option<u64>,
    /// etcd revisions kept below the current one when compacting.
    #[arg(long, env = "HOMING_ETCD_COMPACT_RETAIN_REVISIONS")]
    pub etcd_compact_retain_revisions: Option<u64>,
    /// Lease length in milliseconds.
    #[arg(long, env = "HOMING_LEASE_TTL_MS")]
    pub lease_ttl_ms: Option<u64>,
    /// When to renew, in thousandths of the lease (333 = a third of the way in).
    #[arg(long, env = "HOMING_RENEW_AT_PERMILLE")]
    pub renew_at_permille: Option<u16>,
    /// Milliseconds before the host-side lease end at which the host stops gracefully.
    #[arg(long, env = "HOMING_SOFT_MARGIN_MS")]
    pub soft_margin_ms: Option<u64>,
    /// Milliseconds before the host-side lease end at which the host kills the actor.
    #[arg(long, env = "HOMING_HARD_MARGIN_MS")]
    pub hard_margin_ms: Option<u64>,
    /// Milliseconds after expiry before the DC reaps a lease and lets another holder in.
    #[arg(long, env = "HOMING_GRACE_MS")]
    pub grace_ms: Option<u64>,
    /// The DC lease's life without a renewal, in milliseconds: host leases are granted only while it lasts (default: twice lease_ttl_ms).
    #[arg(long, env = "HOMING_DC_LEASE_TTL_MS")]
    pub dc_lease_ttl_ms: Option<u64>,
    /// How often the DC lease is renewed, in milliseconds (default: a tenth of dc_lease_ttl_ms).
    #[arg(long, env = "HOMING_DC_LEASE_RENEW_MS")]
    pub dc_lease_renew_ms: Option<u64>,
    /// Once, after the DC store was lost: raise its allocator to the floor the DC published to the global store instead of refusing to start.
    #[arg(long, env = "HOMING_START_ABOVE_FLOOR", num_args = 0..=1, default_missing_value = "true")]
    pub start_above_floor: Option<bool>,
    /// When this DC takes over the tails of a DC that does not answer: "automatic" (once the global store judges that DC's lease expired — its lease ttl, its longest host lease and grace after its last renewal, so none of its hosts still acts) or "retired-only" (only once an operator ran `homing dc retire` for it, and its lease expired). Default: automatic.
    #[arg(long, env = "HOMING_TAKEOVER")]
    pub takeover: Option<String>,
    /// Most links one resolve or connect follows.
    #[arg(long, env = "HOMING_HOP_LIMIT")]
    pub hop_limit: Option<usize>,
    /// How often the reaper and orphan sweeper scan the DC store, in milliseconds.
    #[arg(long, env = "HOMING_REAPER_INTERVAL_MS")]
    pub reaper_interval_ms: Option<u64>,
    /// A reservation that lost its race is marked abandoned once released this long, in milliseconds.
    #[arg(long, env = "HOMING_ORPHAN_AGE_MS")]
    pub orphan_age_ms: Option<u64>,
    /// How often this homingd reads the DC store's event log for writes made by other homingd of the same DC (several may share one DC store), waking its waiters and watchers for them, in milliseconds: the longest such a wake-up waits.
    #[arg(long, env = "HOMING_LOG_FOLLOW_MS")]
    pub log_follow_ms: Option<u64>,
    /// Timeout for one request to a peer DC, in milliseconds.
    #[arg(long, env = "HOMING_PEER_TIMEOUT_MS")]
    pub peer_timeout_ms: Option<u64>,
    /// How many global entries this DC remembers (immutable, so never stale), and as many successions, chain members and absent keys, in entries each.
    #[arg(long, env = "HOMING_GLOBAL_CACHE_ENTRIES")]
    pub global_cache_entries: Option<u64>,
    /// How long a resolve's "no global entry" answer is reused for the same key, in milliseconds (concurrent misses share one read); 0 reads the global store for every such resolve.
    #[arg(long, env = "HOMING_ABSENT_TTL_MS")]
    pub absent_ttl_ms: Option<u64>,
    /// The most memory redb's page cache takes for each redb store file (the DC store's, the global store's), in MiB: the records live on disk, this much of them stays in memory. redb's own default is 1024.
    #[arg(long, env = "HOMING_REDB_CACHE_MB")]
    pub redb_cache_mb: Option<u64>,
    /// Most acquirers parked on one reservation of this DC (Acquire with wait_ms).
    #[arg(long, env = "HOMING_WAITERS_PER_KEY_MAX")]
    pub waiters_per_key_max: Option<u64>,
    /// Most acquirers parked on this DC's reservations in total.
    #[arg(long, env = "HOMING_WAITERS_MAX")]
    pub waiters_max: Option<u64>,
    /// How long a vacated reservation is held for the first waiter to take it before the next waiter is woken, in milliseconds.
    #[arg(long, env = "HOMING_HANDOFF_MS")]
    pub handoff_ms: Option<u64>,
    /// Most Watch requests parked at this DC at once (each re-reads the event log on every write); more are answered Overloaded at once.
    #[arg(long, env = "HOMING_WATCHES_PARKED_MAX")]
    pub watches_parked_max: Option<u64>,
    /// Most keys this DC creates per namespace (each keeps a global entry forever); past it, a connect that would create a key is answered QuotaExceeded. 0: unlimited.
    #[arg(long, env = "HOMING_KEYS_PER_NAMESPACE_MAX")]
    pub keys_per_namespace_max: Option<u64>,
    /// How many lifecycle events this DC keeps for watchers; older ones are trimmed by the reaper.
    #[arg(long, env = "HOMING_EVENTS_RETAINED")]
    pub events_retained: Option<u64>,
    /// Most QUIC connections at once (default 4096).
    #[arg(long, env = "HOMING_CONNECTIONS_MAX")]
    pub connections_max: Option<usize>,
    /// Connections only peer DCs (node certificates) may take (default 256).
    #[arg(long, env = "HOMING_NODE_CONNECTIONS_RESERVED")]
    pub node_connections_reserved: Option<usize>,
    /// Connections only hosts of this DC may take (default 1024).
    #[arg(long, env = "HOMING_HOST_CONNECTIONS_RESERVED")]
    pub host_connections_reserved: Option<usize>,
    /// Most connections one certificate may hold (default 1024).
    #[arg(long, env = "HOMING_IDENTITY_CONNECTIONS_MAX")]
    pub identity_connections_max: Option<usize>,
    /// Most TLS handshakes in progress; past half, callers must answer a QUIC Retry first (default 512).
    #[arg(long, env = "HOMING_HANDSHAKES_MAX")]
    pub handshakes_max: Option<usize>,
    /// A handshake not finished within this time is abandoned, in milliseconds (default 5000).
    #[arg(long, env = "HOMING_HANDSHAKE_TIMEOUT_MS")]
    pub handshake_timeout_ms: Option<u64>,
    /// Receive buffer asked of the QUIC UDP socket, in bytes; capped by net.core.rmem_max (default 8 MiB, 0 keeps the system's).
    #[arg(long, env = "HOMING_UDP_RECEIVE_BUFFER_BYTES")]
    pub udp_receive_buffer_bytes: Option<usize>,
}

fn parse_peer(text: &str) -> Result<(String, SocketAddr), String> {
    let (dc, addr) = text
        .split_once('=')
        .ok_or_else(|| format!("peer {text:?} is not DC=ADDR"))?;
    let addr = addr
        .parse()
        .map_err(|e| format!("peer {dc}: address {addr:?}: {e}"))?;
    Ok((dc.to_string(), addr))
}

/// A peer DC's entry in the config file: one address, or a list of them (a
/// DC served by several homingd).
#[derive(Deserialize)]
#[serde(untagged)]
enum PeerAddrs {
    One(SocketAddr),
    Several(Vec<SocketAddr>),
}

fn peers_from_table<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<Option<Vec<(String, SocketAddr)>>, D::Error> {
    let table = Option::<BTreeMap<String, PeerAddrs>>::deserialize(d)?;
    Ok(table.map(|t| {
        t.into_iter()
            .flat_map(|(dc, addrs)| {
                let addrs = match addrs {
                    PeerAddrs::One(addr) => vec![addr],
                    PeerAddrs::Several(addrs) => addrs,
                };
                addrs.into_iter().map(move |addr| (dc.clone(), addr))
            })
            .collect()
    }))
}

macro_rules! overlay {
    ($low:expr, $high:expr, $($field:ident),*) => {
        Settings { $($field: $high.$field.or($low.$field)),* }
    };
}

impl Settings {
    /// Reads a TOML file.
    pub fn from_file(path: &std::path::Path) -> Result<Settings, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|e| ConfigError::File {
            path: path.to_path_buf(),
            reason: e.to_string(),
        })?;
        toml::from_str(&text).map_err(|e| ConfigError::File {
            path: path.to_path_buf(),
            reason: e.to_string(),
        })
    }

    /// `self` with every field that `over` sets replaced by `over`'s value.
    pub fn overlay(self, over: Settings) -> Settings {
        overlay!(
            self,
            over,
            dc,
            listen,
            metrics_listen,
            advertise,
            directory_refresh_ms,
            peers,
            data_dir,
            ca_cert,
            cert,
            key,
            crl,
            tls_reload_ms,
            dc_store,
            global_store,
            etcd_endpoints,
            store_prefix,
            fdb_cluster_file,
            etcd_compact_interval_ms,
            etcd_compact_retain_revisions,
            lease_ttl_ms,
            renew_at_permille,
            soft_margin_ms,
            hard_margin_ms,
            grace_ms,
            dc_lease_ttl_ms,
            dc_lease_renew_ms,
            start_above_floor,
            takeover,
            hop_limit,
            reaper_interval_ms,
            orphan_age_ms,
            log_follow_ms,
            peer_timeout_ms,
            global_cache_entries,
            absent_ttl_ms,
            redb_cache_mb,
            waiters_per_key_max,
            waiters_max,
            handoff_ms,
            watches_parked_max,
            keys_per_namespace_max,
            events_retained,
            connections_max,
            node_connections_reserved,
            host_connections_reserved,
            identity_connections_max,
            handshakes_max,
            handshake_timeout_ms,
            udp_receive_buffer_bytes
        )
    }
}

/// Default of `redb_cache_mb`: redb's own page cache per file.
pub const REDB_CACHE_MB_DEFAULT: u64 = (homing_store::redb::CACHE_BYTES_DEFAULT >> 20) as u64;

/// `redb_cache_mb` in bytes; refused when it does not fit this machine's
/// address space.
pub(crate) fn redb_cache_bytes(mb: u64) -> Result<usize, ConfigError> {
    mb.checked_mul(1 << 20)
        .and_then(|bytes| usize::try_from(bytes).ok())
        .ok_or_else(|| invalid("redb_cache_mb", "larger than this machine can address"))
}

/// Default of `absent_ttl_ms`: how long a resolve's "no global entry"
/// answer is reused (DESIGN.md §7.4: well under a second).
pub use homing_core::chain::NODE_ABSENT_TTL_MS_DEFAULT as ABSENT_TTL_MS_DEFAULT;
/// Default most Watch requests parked at a DC at once.
pub const WATCHES_PARKED_MAX_DEFAULT: u64 = 1_024;

/// Default of `directory_refresh_ms`: how often the DC directory is read.
pub const DIRECTORY_REFRESH_MS_DEFAULT: u64 = 2_000;

/// Default of `tls_reload_ms`: how often the TLS files are checked for changes.
pub use homing_net::reload::TLS_RELOAD_MS_DEFAULT;

/// A configuration that failed validation; the message names the field.
#[derive(Debug, Error)]
pub enum ConfigError {
    /// A required field is unset.
    #[error("{0} is required (flag --{flag}, env HOMING_{env}, or `{0}` in the config file)", flag = .0.replace('_', "-"), env = .0.to_uppercase())]
    Missing(&'static str),
    /// A field's value is invalid.
    #[error("{field}: {reason}")]
    Invalid {
        /// The field.
        field: &'static str,
        /// Why.
        reason: String,
    },
    /// The config file could not be read or parsed.
    #[error("config file {path}: {reason}")]
    File {
        /// The file.
        path: PathBuf,
        /// Why.
        reason: String,
    },
}

fn invalid(field: &'static str, reason: impl ToString) -> ConfigError {
    ConfigError::Invalid {
        field,
        reason: reason.to_string(),
    }
}

/// A validated configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// This DC.
    pub dc: DcId,
    /// QUIC listen address.
    pub listen: SocketAddr,
    /// HTTP metrics address, if enabled.
    pub metrics_listen: Option<SocketAddr>,
    /// The address listed in the DC directory, if given (else the bound
    /// listen address unless it is a wildcard).
    pub advertise: Option<SocketAddr>,
    /// How often the DC directory is read, ms (0: never read nor written).
    pub directory_refresh_ms: u64,
    /// Peer DCs and their homingd addresses (a DC with several homingd is
    /// listed once per address, in the order given).
    pub peers: Vec<(DcId, SocketAddr)>,
    /// Data directory (redb stores).
    pub data_dir: PathBuf,
    /// CA certificate file.
    pub ca_cert: PathBuf,
    /// Own certificate file.
    pub cert: PathBuf,
    /// Own key file.
    pub key: PathBuf,
    /// The CA's certificate revocation list, if revocation is used.
    pub crl: Option<PathBuf>,
    /// How often the TLS files are checked for changes, ms (0: never).
    pub tls_reload_ms: u64,
    /// DC store backend.
    pub dc_store: StoreKind,
    /// Global store backend.
    pub global_store: StoreKind,
    /// etcd endpoints (when a store is etcd).
    pub etcd_endpoints: Vec<String>,
    /// Key prefix in etcd or FoundationDB.
    pub store_prefix: String,
    /// FoundationDB cluster file, if not the platform default.
    pub fdb_cluster_file: Option<PathBuf>,
    /// Time between compactions of etcd's history, ms (0: homingd does not
    /// compact).
    pub etcd_compact_interval_ms: u64,
    /// etcd revisions kept below the current one when compacting.
    pub etcd_compact_retain_revisions: u64,
    /// Lease policy.
    pub policy: LeasePolicy,
    /// The DC lease's life without a renewal, ms.
    pub dc_lease_ttl_ms: u64,
    /// Time between DC lease renewals, ms.
    pub dc_lease_renew_ms: u64,
    /// Raise a DC store below the published floor instead of refusing it.
    pub start_above_floor: bool,
    /// When this DC takes over a silent DC's tails.
    pub takeover: TakeoverPolicy,
    /// Hop limit.
    pub hop_limit: usize,
    /// Reaper interval, ms.
    pub reaper_interval_ms: u64,
    /// Orphan age, ms.
    pub orphan_age_ms: u64,
    /// Event-log follow interval, ms.
    pub log_follow_ms: u64,
    /// Peer request timeout, ms.
    pub peer_timeout_ms: u64,
    /// Global entry cache capacity, entries.
    pub global_cache_entries: u64,
    /// How long a resolve's absent answer is reused, ms (0: never).
    pub absent_ttl_ms: u64,
    /// redb's page cache per store file, bytes.
    pub redb_cache_bytes: usize,
    /// Bounds and hand-off of parked acquirers.
    pub waiting: WaitLimits,
    /// Lifecycle events kept for watchers.
    pub events_retained: u64,
    /// Most Watch requests parked at once.
    pub watches_parked_max: usize,
    /// Most keys this DC creates per namespace (0: unlimited).
    pub keys_per_namespace_max: u64,
    /// What the QUIC server allows: connection shares, handshakes, buffers.
    pub server_limits: ServerLimits,
}

/// Default time between compactions of etcd's history, ms (homing-store's
/// `etcd::compaction::COMPACT_INTERVAL_MS_DEFAULT`, which exists only with
/// the `etcd` feature).
pub const ETCD_COMPACT_INTERVAL_MS_DEFAULT: u64 = 60_000;
/// Default etcd revisions kept below the current one.
pub const ETCD_COMPACT_RETAIN_REVISIONS_DEFAULT: u64 = 10_000;

fn store_kind(field: &'static str, value: Option<String>) -> Result<StoreKind, ConfigError> {
    let built_without = |feature: &str| {
        invalid(
            field,
            format!("this homingd was built without the `{feature}` cargo feature"),
        )
    };
    match value.as_deref().unwrap_or("redb") {
        "redb" => Ok(StoreKind::Redb),
        "etcd" if cfg!(feature = "etcd") => Ok(StoreKind::Etcd),
        "fdb" if cfg!(feature = "fdb") => Ok(StoreKind::Fdb),
        "etcd" => Err(built_without("etcd")),
        "fdb" => Err(built_without("fdb")),
        other => Err(invalid(
            field,
            format!("unknown backend {other:?} (expected redb, etcd or fdb)"),
        )),
    }
}

/// The terms of a DC lease of `ttl_ms` over host leases of `policy`.
fn dc_terms(ttl_ms: u64, policy: &LeasePolicy) -> DcTerms {
    DcTerms {
        ttl_ms,
        host_lease_ttl_max_ms: policy.ttl_ms(),
        grace_ms: policy.grace_ms(),
    }
}

impl Config {
    /// Where its TLS identity lives: loaded at start, and again when the
    /// files change.
    pub fn tls_files(&self) -> homing_net::TlsFiles {
        homing_net::TlsFiles {
            ca: self.ca_cert.clone(),
            cert: self.cert.clone(),
            key: self.key.clone(),
            crl: self.crl.clone(),
        }
    }

    /// The terms this DC renews its DC lease under.
    pub fn dc_terms(&self) -> DcTerms {
        dc_terms(self.dc_lease_ttl_ms, &self.policy)
    }

    /// Validates `settings`, filling defaults.
    pub fn from_settings(s: Settings) -> Result<Config, ConfigError> {
        let server_limits = server_limits(&s)?;
        let dc =
            DcId::new(s.dc.ok_or(ConfigError::Missing("dc"))?).map_err(|e| invalid("dc", e))?;
        let mut peers: Vec<(DcId, SocketAddr)> = Vec::new();
        for (name, addr) in s.peers.unwrap_or_default() {
            let peer = DcId::new(name).map_err(|e| invalid("peers", e))?;
            if peer == dc {
                return Err(invalid("peers", format!("{peer} is this daemon's own dc")));
            }
            if peers.contains(&(peer.clone(), addr)) {
                return Err(invalid(
                    "peers",
                    format!("{peer} at {addr} is listed twice"),
                ));
            }
            peers.push((peer, addr));
        }
        let d = LeasePolicy::DEFAULT;
        let policy = LeasePolicy::new(
            s.lease_ttl_ms.unwrap_or(d.ttl_ms()),
            s.renew_at_permille.unwrap_or(d.renew_at_permille()),
            s.soft_margin_ms.unwrap_or(d.soft_margin_ms()),
            s.hard_margin_ms.unwrap_or(d.hard_margin_ms()),
            s.grace_ms.unwrap_or(d.grace_ms()),
        )
        .map_err(|e| invalid("lease policy", e))?;
        let positive = |field: &'static str, value: Option<u64>, default: u64| match value
            .unwrap_or(default)
        {
            0 => Err(invalid(field, "must be greater than 0")),
            v => Ok(v),
        };
        let dc_lease_ttl_ms = positive(
            "dc_lease_ttl_ms",
            s.dc_lease_ttl_ms,
            policy.ttl_ms().saturating_mul(2),
        )?;
        let dc_lease_renew_ms = positive(
            "dc_lease_renew_ms",
            s.dc_lease_renew_ms,
            (dc_lease_ttl_ms / 10).max(1),
        )?;
        let terms = dc_terms(dc_lease_ttl_ms, &policy);
        // A renewal may fail once and the next still leave room for a whole host lease.
        let needed = policy
            .ttl_ms()
            .saturating_add(dc_lease_renew_ms.saturating_mul(2));
        if terms.valid_for_ms() < needed {
            return Err(invalid(
                "dc_lease_ttl_ms",
                format!(
                    "{dc_lease_ttl_ms} ms leaves the DC {} ms of validity per renewal (a twentieth, at least 100 ms, is kept for clock drift); host leases need lease_ttl_ms + 2 × dc_lease_renew_ms = {needed} ms",
                    terms.valid_for_ms()
                ),
            ));
        }
        let hop_limit = s.hop_limit.unwrap_or(HOP_LIMIT_DEFAULT);
        if hop_limit == 0 || hop_limit > HOP_LIMIT_MAX {
            return Err(invalid("hop_limit", format!("must be 1..={HOP_LIMIT_MAX}")));
        }
        let dc_store = store_kind("dc_store", s.dc_store)?;
        let global_store = store_kind("global_store", s.global_store)?;
        let uses_etcd = dc_store == StoreKind::Etcd || global_store == StoreKind::Etcd;
        let etcd_endpoints = s.etcd_endpoints.unwrap_or_default();
        if uses_etcd && etcd_endpoints.is_empty() {
            return Err(ConfigError::Missing("etcd_endpoints"));
        }
        Ok(Config {
            listen: s.listen.ok_or(ConfigError::Missing("listen"))?,
            metrics_listen: s.metrics_listen,
            advertise: match s.advertise {
                Some(addr) if addr.ip().is_unspecified() || addr.port() == 0 => {
                    return Err(invalid(
                        "advertise",
                        format!("{addr} cannot be reached: give a routable address and port"),
                    ));
                }
                advertise => advertise,
            },
            directory_refresh_ms: s
                .directory_refresh_ms
                .unwrap_or(DIRECTORY_REFRESH_MS_DEFAULT),
            peers,
            data_dir: s.data_dir.ok_or(ConfigError::Missing("data_dir"))?,
            ca_cert: s.ca_cert.ok_or(ConfigError::Missing("ca_cert"))?,
            cert: s.cert.ok_or(ConfigError::Missing("cert"))?,
            key: s.key.ok_or(ConfigError::Missing("key"))?,
            crl: s.crl,
            tls_reload_ms: s.tls_reload_ms.unwrap_or(TLS_RELOAD_MS_DEFAULT),
            dc_store,
            global_store,
            etcd_endpoints,
            fdb_cluster_file: s.fdb_cluster_file,
            etcd_compact_interval_ms: s
                .etcd_compact_interval_ms
                .unwrap_or(ETCD_COMPACT_INTERVAL_MS_DEFAULT),
            etcd_compact_retain_revisions: positive(
                "etcd_compact_retain_revisions",
                s.etcd_compact_retain_revisions,
                ETCD_COMPACT_RETAIN_REVISIONS_DEFAULT,
            )?,
            // Store prefixes are built as `<store_prefix>/global/` and `<store_prefix>/dc/<dc>/`.
            store_prefix: crate::stores::normalize_prefix(
                s.store_prefix
                    .as_deref()
                    .unwrap_or(crate::stores::STORE_PREFIX_DEFAULT),
            ),
            policy,
            dc_lease_ttl_ms,
            dc_lease_renew_ms,
            start_above_floor: s.start_above_floor.unwrap_or(false),
            takeover: match s.takeover.as_deref() {
                None => TakeoverPolicy::Automatic,
                Some(policy) => policy.parse().map_err(|e: String| invalid("takeover", e))?,
            },
            hop_limit,
            reaper_interval_ms: positive("reaper_interval_ms", s.reaper_interval_ms, 1_000)?,
            orphan_age_ms: positive("orphan_age_ms", s.orphan_age_ms, 60_000)?,
            log_follow_ms: positive("log_follow_ms", s.log_follow_ms, 100)?,
            peer_timeout_ms: positive("peer_timeout_ms", s.peer_timeout_ms, 2_000)?,
            global_cache_entries: positive(
                "global_cache_entries",
                s.global_cache_entries,
                homing_node::MEMORY_ENTRIES_DEFAULT,
            )?,
            absent_ttl_ms: s.absent_ttl_ms.unwrap_or(ABSENT_TTL_MS_DEFAULT),
            redb_cache_bytes: redb_cache_bytes(positive(
                "redb_cache_mb",
                s.redb_cache_mb,
                REDB_CACHE_MB_DEFAULT,
            )?)?,
            waiting: WaitLimits {
                per_key: positive("waiters_per_key_max", s.waiters_per_key_max, 64)? as usize,
                total: positive("waiters_max", s.waiters_max, 10_000)? as usize,
                handoff_ms: positive("handoff_ms", s.handoff_ms, 2_000)?,
            },
            events_retained: positive("events_retained", s.events_retained, 1_000_000)?,
            watches_parked_max: positive(
                "watches_parked_max",
                s.watches_parked_max,
                WATCHES_PARKED_MAX_DEFAULT,
            )? as usize,
            keys_per_namespace_max: s
                .keys_per_namespace_max
                .unwrap_or(KEYS_PER_NAMESPACE_MAX_DEFAULT),
            server_limits,
            dc,
        })
    }
}

/// The QUIC server's limits from the connection settings, homing-net's
/// defaults for the rest; the error names the limit that does not fit.
fn server_limits(s: &Settings) -> Result<ServerLimits, ConfigError> {
    let d = ServerLimits::default();
    let limits = ServerLimits {
        shares: ConnectionShares {
            connections_max: s.connections_max.unwrap_or(d.shares.connections_max),
            node_connections_reserved: s
                .node_connections_reserved
                .unwrap_or(d.shares.node_connections_reserved),
            host_connections_reserved: s
                .host_connections_reserved
                .unwrap_or(d.shares.host_connections_reserved),
            identity_connections_max: s
                .identity_connections_max
                .unwrap_or(d.shares.identity_connections_max),
        },
        handshakes_max: s.handshakes_max.unwrap_or(d.handshakes_max),
        handshake_timeout_ms: s.handshake_timeout_ms.unwrap_or(d.handshake_timeout_ms),
        udp_receive_buffer_bytes: s
            .udp_receive_buffer_bytes
            .unwrap_or(d.udp_receive_buffer_bytes),
        ..d
    };
    limits
        .validate()
        .map_err(|e| invalid("connection limits", e))?;
    Ok(limits)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn minimal() -> Settings {
        toml::from_str(
            r#"
            dc = "iad"
            listen = "127.0.0.1:7400"
            data_dir = "/tmp/x"
            ca_cert = "ca.pem"
            cert = "node-iad.pem"
            key = "node-iad.key"
            [peers]
            fra = "127.0.0.1:7401"
            sin = ["127.0.0.1:7402", "127.0.0.1:7403"]
            "#,
        )
        .unwrap()
    }

    #[test]
    fn a_minimal_file_validates_with_defaults() {
        let config = Config::from_settings(minimal()).unwrap();
        assert_eq!(config.dc.as_str(), "iad");
        let sin = DcId::new("sin").unwrap();
        let peers: Vec<_> = config
            .peers
            .iter()
            .map(|(dc, a)| (dc.as_str(), a.port()))
            .collect();
        assert_eq!(
            peers,
            [("fra", 7401), ("sin", 7402), ("sin", 7403)],
            "a dc listed with several homingd keeps each address, in order"
        );
        assert!(config.peers.iter().any(|(dc, _)| *dc == sin));
        assert_eq!(config.dc_store, StoreKind::Redb);
        assert_eq!(config.policy, LeasePolicy::DEFAULT);
    }

    #[test]
    fn flags_override_env_override_file() {
        let over = Settings {
            dc: Some("fra".into()),
            peers: Some(vec![("iad".into(), "127.0.0.1:1".parse().unwrap())]),
            ..Settings::default()
        };
        let config = Config::from_settings(minimal().overlay(over)).unwrap();
        assert_eq!(config.dc.as_str(), "fra");
        assert_eq!(
            config.listen,
            "127.0.0.1:7400".parse().unwrap(),
            "unset fields keep the file's value"
        );
    }

    #[test]
    fn errors_name_the_field() {
        let mut s = minimal();
        s.dc = Some("IAD".into());
        assert!(
            Config::from_settings(s)
                .unwrap_err()
                .to_string()
                .starts_with("dc:")
        );
        let mut s = minimal();
        s.listen = None;
        let err = Config::from_settings(s).unwrap_err().to_string();
        assert!(
            err.contains("listen is required") && err.contains("HOMING_LISTEN"),
            "{err}"
        );
        let mut s = minimal();
        s.soft_margin_ms = Some(500);
        assert!(
            Config::from_settings(s)
                .unwrap_err()
                .to_string()
                .contains("soft_margin_ms")
        );
        let mut s = minimal();
        s.peers = Some(vec![("iad".into(), "127.0.0.1:1".parse().unwrap())]);
        assert!(
            Config::from_settings(s)
                .unwrap_err()
                .to_string()
                .contains("own dc")
        );
        let mut s = minimal();
        s.connections_max = Some(1_000);
        let err = Config::from_settings(s).unwrap_err().to_string();
        assert!(err.contains("node_connections_reserved"), "{err}");
        let bad: Result<Settings, _> = toml::from_str("dc = \"iad\"\nlisten_addr = \"x\"");
        assert!(bad.unwrap_err().to_string().contains("listen_addr"));
    }
}
