//! The peer table (DC id → address) and the requests this daemon sends to
//! other DCs. Nothing a peer says is trusted blindly: a reply of the wrong
//! kind is an error, and the chain walk checks that a DC speaks only for its
//! own reservations.
//!
//! A peer that lets a request time out (or cannot be connected to) becomes
//! suspect ([`homing_core::reachability`] decides): until one background
//! probe gets an answer from it, requests that need it (a walk, a link, an
//! await) answer `Unavailable` at once instead of each waiting for the peer
//! timeout, so a partition between DCs does not stall requests at every DC.
//! A DC served by several homingd is listed once per address: a request
//! goes to one that answers, and once more to the next when it does not
//! ([`homing_net::DcTable`]).

use std::hash::{BuildHasher, RandomState};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use homing_core::reachability::{Change, ProbeSchedule};
use homing_core::{
    AwaitReply, DcId, ErrorKind, ErrorReply, FencingToken, Key, LinkReply, Reply, Request,
    ReservationId, Segment, ShortcutNotice,
};
use homing_net::{Client, DcTable, Peer, Unanswered};
use thiserror::Error;
use tracing::{info, warn};

use crate::metrics::Metrics;

/// Why a request to a peer DC did not yield a usable answer.
#[derive(Debug, Clone, Error)]
pub enum PeerError {
    /// The DC is not in the peer table, or could not be reached in time.
    #[error("dc {dc} unavailable: {reason}")]
    Unavailable {
        /// The DC.
        dc: DcId,
        /// Why.
        reason: String,
    },
    /// The DC answered with an error.
    #[error("dc {dc} refused: {reply}")]
    Refused {
        /// The DC.
        dc: DcId,
        /// Its answer.
        reply: ErrorReply,
    },
    /// The DC answered something that is not an answer to the request.
    #[error("dc {dc} answered {reply} to {request}")]
    Lied {
        /// The DC.
        dc: DcId,
        /// The request kind.
        request: &'static str,
        /// The reply kind received.
        reply: String,
    },
}

impl PeerError {
    /// The error reply to pass on to our own caller.
    pub fn to_reply(&self) -> ErrorReply {
        match self {
            PeerError::Unavailable { dc, .. } => {
                ErrorReply::new(ErrorKind::Unavailable { dc: dc.clone() }, self.to_string())
            }
            PeerError::Refused { reply, .. } => reply.clone(),
            PeerError::Lied { .. } => ErrorReply::new(ErrorKind::Inconsistent, self.to_string()),
        }
    }
}

/// The other DCs and a pooled QUIC client to reach them.
#[derive(Clone)]
pub struct Peers {
    shared: Arc<Shared>,
}

struct Shared {
    /// The peer DCs and their addresses, which are suspect, and the probes.
    table: DcTable,
    timeout: Duration,
    metrics: Arc<Metrics>,
}

impl Peers {
    /// Peers at `table`'s addresses (a DC listed once per homingd),
    /// reachable through `client`, each request bounded by `timeout` (also
    /// each probe of a suspect address).
    pub fn new(
        table: &[(DcId, SocketAddr)],
        client: Client,
        timeout: Duration,
        metrics: Arc<Metrics>,
    ) -> Peers {
        // The jitter's seed: random per daemon, so DCs spread their probes.
        let seed = RandomState::new().hash_one(std::process::id());
        let on_change = {
            let metrics = metrics.clone();
            Box::new(move |peer: &Peer, change: &Change| log_change(&metrics, peer, change))
        };
        let table = DcTable::new(
            client,
            table,
            ProbeSchedule::default(),
            timeout,
            seed,
            on_change,
        );
        Peers {
            shared: Arc::new(Shared {
                table,
                timeout,
                metrics,
            }),
        }
    }

    /// Adds `addr` of `dc`, learned from the DC directory, to the peer
    /// table, unless it is there or `dc` is a configured peer (reached only
    /// at the addresses configured); whether it was added.
    pub fn learn(&self, dc: &DcId, addr: SocketAddr) -> bool {
        self.shared.table.learn(dc, addr)
    }

    /// How long a request to a peer may take before it counts as unanswered.
    pub fn timeout(&self) -> Duration {
        self.shared.timeout
    }

    /// Whether `dc` is suspect now (not asked until a probe gets an answer).
    pub fn is_suspect(&self, dc: &DcId) -> bool {
        self.shared.table.is_suspect(dc)
    }

    /// One round trip to `dc` for the status page, as `homing dc status`
    /// probes it: a resolve of the global store's health-probe key (which
    /// nobody reserves), so the peer reads its global store. An error
    /// answer is an error, not an answer. A peer that lets it time out
    /// becomes suspect, like after any other request.
    pub async fn probe(&self, dc: &DcId) -> Result<Duration, PeerError> {
        let request = Request::Resolve {
            key: homing_store::global::health_probe_key(),
        };
        let started = Instant::now();
        self.call(dc, &request).await?;
        Ok(started.elapsed())
    }

    /// Every address in the peer table (a DC once per homingd), in table order.
    pub fn addresses(&self) -> Vec<(DcId, SocketAddr)> {
        self.shared.table.addresses()
    }

    async fn call(&self, dc: &DcId, request: &Request) -> Result<Reply, PeerError> {
        let shared = &self.shared;
        let unavailable = |reason: String| PeerError::Unavailable {
            dc: dc.clone(),
            reason,
        };
        let slot = shared
            .table
            .slot(dc)
            .ok_or_else(|| unavailable("not in the peer table".to_string()))?;
        let started = Instant::now();
        // A request that asks the peer to wait gets that much more time.
        let timeout = shared.timeout + Duration::from_millis(u64::from(request.wait_ms()));
        let reply = shared
            .table
            .ask(slot, request, timeout)
            .await
            .map_err(|e: Unanswered| unavailable(e.to_string()))?;
        if request.wait_ms() == 0 {
            shared.metrics.peer(dc.as_str(), started.elapsed());
        }
        match reply {
            Reply::Error(reply) => Err(PeerError::Refused {
                dc: dc.clone(),
                reply,
            }),
            reply => Ok(reply),
        }
    }

    fn lied(dc: &DcId, request: &Request, reply: &Reply) -> PeerError {
        let reply = format!("{reply:?}");
        PeerError::Lied {
            dc: dc.clone(),
            request: request.kind(),
            reply: reply.chars().take(200).collect(),
        }
    }

    /// What `id`'s owner knows about it (the chain walk validates the segment).
    pub async fn resolve_reservation(&self, id: &ReservationId) -> Result<Segment, PeerError> {
        let request = Request::ResolveReservation { id: id.clone() };
        match self.call(id.dc(), &request).await? {
            Reply::Reservation(segment) => Ok(segment),
            other => Err(Self::lied(id.dc(), &request, &other)),
        }
    }

    /// Asks `from`'s owner to link it to our reservation `to`.
    pub async fn link(
        &self,
        key: &Key,
        from: &ReservationId,
        to: &ReservationId,
        expected_token: FencingToken,
    ) -> Result<LinkReply, PeerError> {
        let request = Request::Link {
            key: key.clone(),
            from: from.clone(),
            to: to.clone(),
            expected_token,
        };
        match self.call(from.dc(), &request).await? {
            // A peer may not claim the tail is linked to itself: that would loop.
            Reply::Link(LinkReply::AlreadyLinked(next)) if &next == from => Err(Self::lied(
                from.dc(),
                &request,
                &Reply::Link(LinkReply::AlreadyLinked(next)),
            )),
            Reply::Link(reply) => Ok(reply),
            other => Err(Self::lied(from.dc(), &request, &other)),
        }
    }

    /// Tells the owner of the key's first reservation about the chain's new member.
    pub async fn shortcut(&self, notice: ShortcutNotice) -> Result<bool, PeerError> {
        let dc = notice.entry.dc().clone();
        let request = Request::Shortcut {
            key: notice.key,
            entry: notice.entry,
            shortcut: notice.shortcut,
        };
        match self.call(&dc, &request).await? {
            Reply::Noted(noted) => Ok(noted),
            other => Err(Self::lied(&dc, &request, &other)),
        }
    }

    /// Registers at `id`'s owner to be told when `id` has no live holder,
    /// waiting at most `wait_ms` there.
    pub async fn await_vacant(
        &self,
        id: &ReservationId,
        wait_ms: u32,
    ) -> Result<AwaitReply, PeerError> {
        let request = Request::Await {
            reservation: id.clone(),
            wait_ms,
        };
        match self.call(id.dc(), &request).await? {
            Reply::Awaited(reply) => Ok(reply),
            other => Err(Self::lied(id.dc(), &request, &other)),
        }
    }

    /// Forwards an operator's drain to the DC that owns the key's tail.
    pub async fn drain(&self, dc: &DcId, key: &Key) -> Result<(), PeerError> {
        let request = Request::Drain { key: key.clone() };
        match self.call(dc, &request).await? {
            Reply::Drained => Ok(()),
            other => Err(Self::lied(dc, &request, &other)),
        }
    }
}

/// Logs an address's change between answering and suspect, once per
/// change, and shows it in the metrics.
fn log_change(metrics: &Metrics, peer: &Peer, change: &Change) {
    let (dc, addr) = (&peer.dc, peer.addr);
    // The DC's gauge moves when all its addresses are suspect, or one answers again.
    if change.dc_changed {
        metrics.peer_suspect(dc.as_str(), change.suspect);
    }
    if change.suspect {
        warn!(
            peer = %dc,
            %addr,
            dc_suspect = change.dc_changed,
            "peer suspect: no answer; not waited for until a probe gets one"
        );
    } else {
        let suspect_ms = change.suspect_for.as_millis() as u64;
        info!(peer = %dc, %addr, suspect_ms, "peer answers again");
    }
}
