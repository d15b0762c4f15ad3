//! The status page: one read-only page for the whole deployment, served by
//! homingd beside `/metrics` (docs/OPERATIONS.md, "The status page").
//!
//! Any DC's page shows every DC: the global store gives each DC's lease
//! and its homingd (the DC directory), the peers give the round trip to
//! each other DC (a probe like `homing dc status` sends) and their reports
//! (live leases, DC store, their own round trips: `Request::DcReport`), and
//! this DC adds what only it knows — its stores' health and latency, its
//! soonest-expiring leases, its connections and the recent events of its
//! store's log. A key search
//! walks the key's chain as `homing chain` does ([`Walked::hops`]).
//!
//! [`Status::snapshot`] gathers all of it at once, every part bounded in
//! time and size; [`page`] renders it. The page's script fetches the
//! deployment part again every second, so it stays live without a reload.

pub mod page;

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

use axum::Router;
use axum::extract::{Query, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use homing_client::{Resolver, ResolverConfig};
use homing_core::{
    DcId, DcLeaseState, DcRecord, DcReport, DueKind, Event, Key, KeyName, Namespace, Reply,
    Request, Walked,
};
use homing_net::{Client, Peer};
use serde::Deserialize;
use tokio::task::JoinSet;

pub use crate::node::report::STORE_READ_MS_MAX;
use crate::node::report::within;
use crate::node::{Node, store_now};

/// Most recent events of this DC's log the page shows.
pub const EVENTS_SHOWN_MAX: usize = 20;
/// Most live leases of this DC the page lists (the soonest to expire).
pub const LEASES_SHOWN_MAX: usize = 20;
/// How long a key search may walk the chain before it gives up.
pub const CHAIN_WALK_MS_MAX: u64 = 3_000;
/// Longest namespace or key text a search accepts, in bytes (the key's own
/// rules, checked after this, are stricter).
pub const SEARCH_TEXT_BYTES_MAX: usize = 1_024;
/// How far ahead the live-lease listing reads the expiry index, in
/// milliseconds: further than any lease runs.
const LEASE_HORIZON_MS: u64 = 365 * 24 * 3_600 * 1_000;

/// What the page reads from: this DC's node, and a client to walk chains.
#[derive(Clone)]
pub struct Status {
    node: Arc<Node>,
    client: Client,
    /// Where this DC's own homingd answers, for chain walks that start here.
    here: SocketAddr,
    /// Snapshots taken so far: each one's number shows on the page, so a
    /// reader (or a test) sees the part was swapped in again.
    taken: Arc<AtomicU64>,
}

/// Whether a DC answers, as seen from this one.
#[derive(Debug, Clone)]
pub enum Reach {
    /// This DC itself: ready to grant, or why not.
    Here(Result<(), String>),
    /// Its homingd answered a probe after this long.
    Answers(Duration),
    /// It did not answer, or answered with an error.
    Unavailable(String),
}

/// One DC as the page shows it.
#[derive(Debug, Clone)]
pub struct DcRow {
    /// The DC.
    pub dc: DcId,
    /// Its lease as the global store judges it (`None`: not read).
    pub lease: Option<DcLeaseState>,
    /// Its homingd: the DC directory's addresses, else the peer table's.
    pub instances: Vec<SocketAddr>,
    /// Whether it answers from here.
    pub reach: Reach,
    /// What it reports of itself (live leases, its DC store, its round
    /// trips), or why no report came; `None` for this DC (the snapshot's
    /// own fields say it).
    pub report: Option<Result<DcReport, String>>,
}

/// This DC's live leases: the soonest to expire, and whether more exist.
#[derive(Debug, Clone)]
pub struct LiveLeases {
    /// At most [`LEASES_SHOWN_MAX`], soonest expiry first.
    pub shown: Vec<DcRecord>,
    /// More exist than shown.
    pub more: bool,
}

/// Everything the deployment part of the page shows, read at one moment.
#[derive(Debug, Clone)]
pub struct Snapshot {
    /// Its number: snapshots taken by this homingd before it, plus one.
    pub seq: u64,
    /// When it was read.
    pub at: SystemTime,
    /// The DC serving the page.
    pub here: DcId,
    /// Every DC the global store or the peer table knows, by name.
    pub dcs: Vec<DcRow>,
    /// A failed read of the DC leases or the directory, in words.
    pub global_read: Result<(), String>,
    /// The global store's health check: its latency, or why it failed.
    pub global_store: Result<Duration, String>,
    /// This DC's store's health check: its latency, or why it failed.
    pub dc_store: Result<Duration, String>,
    /// Live leases at the reaper's last pass (the metrics gauge).
    pub live_leases_counted: u64,
    /// Session rows and keys at the last upkeep pass (`None`: not counted).
    pub sessions_counted: Option<homing_store::SessionCounts>,
    /// This DC's round trip to each other DC (the same probes as `dcs`'
    /// reach), for the round-trip table.
    pub round_trips: Vec<(DcId, Result<Duration, String>)>,
    /// This DC's live leases, read now.
    pub leases: Result<LiveLeases, String>,
    /// This DC's most recent events, oldest first.
    pub events: Result<Vec<Event>, String>,
    /// QUIC connections holding a slot here, by the caller's role.
    pub connections: Vec<(&'static str, usize)>,
    /// Acquirers parked here.
    pub waiters: usize,
}

/// A key search's outcome: the chain, or why there is none.
#[derive(Debug, Clone)]
pub struct Search {
    /// The key as typed (namespace, name).
    pub namespace: String,
    /// The name as typed.
    pub name: String,
    /// The chain's hops ([`Walked::hops`]), or why not, in words.
    pub chain: Result<Vec<String>, SearchError>,
}

/// Why a key search shows no chain.
#[derive(Debug, Clone, thiserror::Error)]
pub enum SearchError {
    /// The text typed is not a key.
    #[error("not a key: {0}")]
    BadKey(String),
    /// The walk failed (not found, a DC unavailable, …).
    #[error("{0}")]
    Walk(String),
}

/// The address to reach a homingd listening on `bound` from this machine.
fn reachable(bound: SocketAddr) -> SocketAddr {
    let ip = match bound.ip() {
        IpAddr::V4(ip) if ip.is_unspecified() => IpAddr::V4(Ipv4Addr::LOCALHOST),
        IpAddr::V6(ip) if ip.is_unspecified() => IpAddr::V6(Ipv6Addr::LOCALHOST),
        ip => ip,
    };
    SocketAddr::new(ip, bound.port())
}

impl Status {
    /// The page of `node`, whose homingd listens on `listen`; chains are
    /// walked through `client` (this DC's node identity).
    pub fn new(node: Arc<Node>, client: Client, listen: SocketAddr) -> Status {
        Status {
            node,
            client,
            here: reachable(listen),
            taken: Arc::default(),
        }
    }

    /// Reads everything the deployment part shows, every read at once and
    /// each bounded: a store that does not answer shows as failed after
    /// [`STORE_READ_MS_MAX`], a peer as unavailable after the peer timeout.
    pub async fn snapshot(&self) -> Snapshot {
        let node = &self.node;
        let (global, (global_store, dc_store), leases, events, probes, mut reports) = tokio::join!(
            self.read_global(),
            self.node.store_health(),
            self.live_leases(),
            self.recent_events(),
            self.node.probe_peers(),
            self.peer_reports(),
        );
        let (states, directory, global_read) = match global {
            Ok((states, directory)) => (Some(states), Some(directory), Ok(())),
            Err(e) => (None, None, Err(e)),
        };
        let peer_addresses = node.peers().addresses();
        let mut names: BTreeSet<DcId> = BTreeSet::from([node.dc().clone()]);
        names.extend(peer_addresses.iter().map(|(dc, _)| dc.clone()));
        names.extend(states.iter().flatten().map(|s| s.dc.clone()));
        names.extend(
            directory
                .iter()
                .flat_map(|d| d.dcs().iter().map(|d| d.dc.clone())),
        );
        let dcs = names
            .into_iter()
            .map(|dc| {
                let lease = states.as_ref().map(|states| {
                    states
                        .iter()
                        .find(|s| s.dc == dc)
                        .cloned()
                        .unwrap_or_else(|| DcLeaseState::unknown(dc.clone()))
                });
                let listed = directory
                    .as_ref()
                    .and_then(|d| d.dcs().iter().find(|d| d.dc == dc))
                    .map(|d| d.addrs.clone());
                let instances = listed.unwrap_or_else(|| match &dc == node.dc() {
                    true => vec![self.here],
                    false => peer_addresses
                        .iter()
                        .filter(|(d, _)| d == &dc)
                        .map(|(_, addr)| *addr)
                        .collect(),
                });
                let reach = match &dc == node.dc() {
                    true => Reach::Here(node.readiness()),
                    false => probes
                        .iter()
                        .find(|(d, _)| d == &dc)
                        .map(|(_, reach)| match reach {
                            Ok(rtt) => Reach::Answers(*rtt),
                            Err(e) => Reach::Unavailable(e.clone()),
                        })
                        .unwrap_or_else(|| {
                            Reach::Unavailable("not in this DC's peer table".to_string())
                        }),
                };
                let report = reports.remove(&dc);
                DcRow {
                    dc,
                    lease,
                    instances,
                    reach,
                    report,
                }
            })
            .collect();
        let connections = node.metrics().connections_open();
        Snapshot {
            seq: self.taken.fetch_add(1, Ordering::Relaxed) + 1,
            at: SystemTime::now(),
            here: node.dc().clone(),
            dcs,
            global_read,
            global_store,
            dc_store,
            live_leases_counted: node.metrics().active_leases(),
            sessions_counted: node.metrics().sessions(),
            round_trips: probes,
            leases,
            events,
            connections,
            waiters: node.waiting(),
        }
    }

    /// What every other DC in the peer table reports of itself, asked of
    /// its first address, all at once, each bounded by the peer timeout
    /// (what a probe waits); a suspect DC is not asked. Sent with this
    /// page's own client, not through the peer table: a slow report makes
    /// no peer suspect.
    async fn peer_reports(&self) -> BTreeMap<DcId, Result<DcReport, String>> {
        let (here, peers) = (self.node.dc(), self.node.peers());
        let wait_ms = u64::try_from(peers.timeout().as_millis()).unwrap_or(u64::MAX);
        let mut first: BTreeMap<DcId, SocketAddr> = BTreeMap::new();
        let mut reports = BTreeMap::new();
        for (dc, addr) in peers.addresses() {
            if &dc == here {
                continue;
            }
            if peers.is_suspect(&dc) {
                let why = "not asked: suspect (its last request went unanswered)";
                reports.insert(dc, Err(why.to_string()));
            } else {
                first.entry(dc).or_insert(addr);
            }
        }
        let mut asks = JoinSet::new();
        for (dc, addr) in first {
            let client = self.client.clone();
            asks.spawn(async move {
                let peer = Peer {
                    addr,
                    dc: dc.clone(),
                };
                let report = match within(
                    wait_ms,
                    "report",
                    client.request(&peer, &Request::DcReport),
                )
                .await
                {
                    Ok(Reply::DcReport(report)) => Ok(report),
                    Ok(Reply::Error(e)) => Err(format!("report: answered with an error: {e}")),
                    Ok(_) => Err("report: answered with something else".to_string()),
                    Err(e) => Err(e),
                };
                (dc, report)
            });
        }
        while let Some(asked) = asks.join_next().await {
            // A task only panics if the runtime is going away.
            if let Ok((dc, report)) = asked {
                reports.insert(dc, report);
            }
        }
        reports
    }

    /// Every DC's lease and the DC directory, from the global store.
    async fn read_global(&self) -> Result<(Vec<DcLeaseState>, homing_core::Directory), String> {
        let global = self.node.global().as_ref();
        let states = within(STORE_READ_MS_MAX, "dc leases", global.dc_leases());
        let directory = within(
            STORE_READ_MS_MAX,
            "dc directory",
            homing_store::directory::read(global),
        );
        let (states, directory) = tokio::join!(states, directory);
        Ok((states?, directory?))
    }

    /// The soonest-expiring live leases of this DC, from its expiry index.
    async fn live_leases(&self) -> Result<LiveLeases, String> {
        let until = store_now().plus_ms(LEASE_HORIZON_MS);
        let page = within(
            STORE_READ_MS_MAX,
            "live leases",
            self.node
                .records()
                .due(DueKind::Lease, until, None, LEASES_SHOWN_MAX),
        )
        .await?;
        Ok(LiveLeases {
            more: page.next.is_some(),
            shown: page.records,
        })
    }

    /// The last [`EVENTS_SHOWN_MAX`] events of this DC's log, oldest first.
    async fn recent_events(&self) -> Result<Vec<Event>, String> {
        let records = self.node.records();
        let head = within(STORE_READ_MS_MAX, "event log", records.events(0, 1))
            .await?
            .head;
        let after = head.saturating_sub(EVENTS_SHOWN_MAX as u64);
        let page = within(
            STORE_READ_MS_MAX,
            "event log",
            records.events(after, EVENTS_SHOWN_MAX),
        )
        .await?;
        Ok(page.events)
    }

    /// Walks the chain of the key typed as `namespace` and `name`, as
    /// `homing chain` does, starting at this DC and bounded by
    /// [`CHAIN_WALK_MS_MAX`].
    pub async fn search(&self, namespace: &str, name: &str) -> Search {
        let chain = match parse_key(namespace, name) {
            Err(e) => Err(e),
            Ok(key) => self.walk(&key).await.map(|walked| walked.hops()),
        };
        Search {
            namespace: namespace.chars().take(SEARCH_TEXT_BYTES_MAX).collect(),
            name: name.chars().take(SEARCH_TEXT_BYTES_MAX).collect(),
            chain,
        }
    }

    async fn walk(&self, key: &Key) -> Result<Walked, SearchError> {
        let mut table = vec![(self.node.dc().clone(), self.here)];
        table.extend(self.node.peers().addresses());
        let mut config = ResolverConfig::new(table);
        // One walk, then dropped: no directory refresh in the background.
        config.directory_refresh_ms = 0;
        let resolver = Resolver::new(self.client.clone(), config);
        within(CHAIN_WALK_MS_MAX, "chain walk", resolver.trace(key))
            .await
            .map_err(SearchError::Walk)
    }
}

/// The query of `/`: a key to search, if any.
#[derive(Debug, Deserialize)]
struct SearchQuery {
    key: Option<String>,
    #[serde(default)]
    namespace: String,
}

/// The status page's routes: `/` (the page, with `?key=…&namespace=…` a
/// key's chain) and [`page::DEPLOYMENT_PATH`] (the part that refreshes).
pub fn routes(status: Status) -> Router {
    Router::new()
        .route("/", get(index))
        .route(page::DEPLOYMENT_PATH, get(deployment))
        .with_state(status)
}

async fn index(State(status): State<Status>, Query(query): Query<SearchQuery>) -> Response {
    let Some(key) = query.key else {
        return fresh(StatusCode::OK, page::full(&status.snapshot().await, None));
    };
    let (snapshot, search) = tokio::join!(status.snapshot(), status.search(&query.namespace, &key));
    let code = match &search.chain {
        Err(SearchError::BadKey(_)) => StatusCode::BAD_REQUEST,
        _ => StatusCode::OK,
    };
    fresh(code, page::full(&snapshot, Some(&search)))
}

async fn deployment(State(status): State<Status>) -> Response {
    fresh(StatusCode::OK, page::deployment(&status.snapshot().await))
}

/// `markup` as HTML that no cache keeps: it is a view of now.
fn fresh(code: StatusCode, markup: maud::Markup) -> Response {
    let headers = [
        (header::CONTENT_TYPE, "text/html; charset=utf-8"),
        (header::CACHE_CONTROL, "no-store"),
    ];
    (code, headers, markup.into_string()).into_response()
}

/// The key typed, or which rule it breaks.
fn parse_key(namespace: &str, name: &str) -> Result<Key, SearchError> {
    if namespace.len() > SEARCH_TEXT_BYTES_MAX || name.len() > SEARCH_TEXT_BYTES_MAX {
        return Err(SearchError::BadKey(format!(
            "longer than {SEARCH_TEXT_BYTES_MAX} bytes"
        )));
    }
    let namespace =
        Namespace::new(namespace).map_err(|e| SearchError::BadKey(format!("namespace: {e}")))?;
    let name = KeyName::new(name).map_err(|e| SearchError::BadKey(format!("key: {e}")))?;
    Ok(Key::in_namespace(namespace, name))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_search_rejects_what_is_not_a_key_and_names_the_rule() {
        assert!(parse_key("", "user-42").is_ok());
        let empty = parse_key("", "").unwrap_err().to_string();
        assert!(empty.starts_with("not a key: key:"), "{empty}");
        let huge = "x".repeat(SEARCH_TEXT_BYTES_MAX + 1);
        let too_long = parse_key("", &huge).unwrap_err().to_string();
        assert!(too_long.contains("longer than"), "{too_long}");
        let bad_namespace = parse_key("a b\u{0}", "k").unwrap_err().to_string();
        assert!(bad_namespace.contains("namespace"), "{bad_namespace}");
    }

    #[test]
    fn a_wildcard_listen_address_is_reached_on_loopback() {
        let bound: SocketAddr = "0.0.0.0:7000".parse().unwrap();
        assert_eq!(reachable(bound), "127.0.0.1:7000".parse().unwrap());
        let bound: SocketAddr = "[::]:7000".parse().unwrap();
        assert_eq!(reachable(bound), "[::1]:7000".parse().unwrap());
    }
}
