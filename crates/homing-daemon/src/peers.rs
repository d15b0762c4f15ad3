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

use std::collections::BTreeMap;
use std::hash::{BuildHasher, RandomState};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

use homing_core::reachability::{
    AddrSlot, Change, DcSlot, ProbeSchedule, ProbeStep, Reachability, Route,
};
use homing_core::{
    AwaitReply, DcId, ErrorKind, ErrorReply, FencingToken, Key, LinkReply, Reply, Request,
    ReservationId, Segment, ShortcutNotice,
};
use homing_net::{Client, Peer};
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
    /// The peer table; a peer's place in it is its `DcSlot` and (one
    /// address per DC) its `AddrSlot`.
    table: Vec<Peer>,
    client: Client,
    timeout: Duration,
    metrics: Arc<Metrics>,
    /// Which peers are suspect; locked briefly, never across an await.
    reach: Mutex<Reachability>,
}

impl Peers {
    /// Peers reachable through `client`, each request bounded by `timeout`
    /// (also each probe of a suspect peer).
    pub fn new(
        table: BTreeMap<DcId, SocketAddr>,
        client: Client,
        timeout: Duration,
        metrics: Arc<Metrics>,
    ) -> Peers {
        let table: Vec<Peer> = table
            .into_iter()
            .map(|(dc, addr)| Peer { addr, dc })
            .collect();
        let slots: Vec<DcSlot> = (0..table.len()).map(DcSlot).collect();
        // The jitter's seed: random per daemon, so DCs spread their probes.
        let seed = RandomState::new().hash_one(std::process::id());
        let reach = Reachability::new(ProbeSchedule::default(), &slots, seed);
        Peers {
            shared: Arc::new(Shared {
                table,
                client,
                timeout,
                metrics,
                reach: Mutex::new(reach),
            }),
        }
    }

    /// Whether `dc` is suspect now (not asked until a probe gets an answer).
    pub fn is_suspect(&self, dc: &DcId) -> bool {
        let shared = &self.shared;
        shared
            .slot(dc)
            .is_some_and(|slot| shared.reach().dc_suspect(DcSlot(slot)))
    }

    async fn call(&self, dc: &DcId, request: &Request) -> Result<Reply, PeerError> {
        let shared = &self.shared;
        let unavailable = |reason: String| PeerError::Unavailable {
            dc: dc.clone(),
            reason,
        };
        let slot = shared
            .slot(dc)
            .ok_or_else(|| unavailable("not in the peer table".to_string()))?;
        let route = shared.reach().route(DcSlot(slot));
        let addr = match route {
            Route::Ask(addr) => addr,
            Route::Suspect { since } => {
                return Err(unavailable(format!(
                    "suspect (no answer for {} ms); not asked until a probe gets one",
                    since.elapsed().as_millis()
                )));
            }
        };
        let started = Instant::now();
        // A request that asks the peer to wait gets that much more time.
        let timeout = shared.timeout + Duration::from_millis(u64::from(request.wait_ms()));
        let reply = Shared::send(&self.shared, addr, request, timeout)
            .await
            .map_err(unavailable)?;
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

impl Shared {
    fn slot(&self, dc: &DcId) -> Option<usize> {
        self.table.iter().position(|p| &p.dc == dc)
    }

    fn reach(&self) -> MutexGuard<'_, Reachability> {
        // Each method updates the state in one step: a panic elsewhere while
        // it was locked left it consistent.
        self.reach
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Sends `request` to `addr` within `timeout` and tells the
    /// reachability what came of it (any reply is an answer; a timeout or
    /// a failed connection a failure). Errors are the reason, as text.
    async fn send(
        shared: &Arc<Shared>,
        addr: AddrSlot,
        request: &Request,
        timeout: Duration,
    ) -> Result<Reply, String> {
        let peer = &shared.table[addr.0];
        let (outcome, reached) =
            match tokio::time::timeout(timeout, shared.client.request(peer, request)).await {
                Err(_) => (
                    Err(format!("no answer within {} ms", timeout.as_millis())),
                    Some(false),
                ),
                Ok(Err(e)) => (Err(e.to_string()), e.reached_peer()),
                Ok(Ok(reply)) => (Ok(reply), Some(true)),
            };
        let now = Instant::now();
        let change = match reached {
            Some(true) => shared.reach().handle_answer(addr, now),
            Some(false) => shared.reach().handle_failure(addr, now),
            None => None,
        };
        if let Some(change) = change {
            Shared::changed(shared, change);
        }
        outcome
    }

    /// Logs a transition once and starts the probe loop of a new suspicion.
    fn changed(shared: &Arc<Shared>, change: Change) {
        let peer = &shared.table[change.addr.0];
        let (dc, addr) = (&peer.dc, peer.addr);
        shared.metrics.peer_suspect(dc.as_str(), change.suspect);
        if change.suspect {
            warn!(
                peer = %dc,
                %addr,
                "peer suspect: no answer; not waited for until a probe gets one"
            );
            let probes = probe_loop(Arc::downgrade(shared), change.addr, change.epoch);
            tokio::spawn(probes);
        } else {
            let suspect_ms = change.suspect_for.as_millis() as u64;
            info!(peer = %dc, %addr, suspect_ms, "peer answers again");
        }
    }
}

/// Probes a suspect peer until it answers (or the daemon's peers are gone),
/// when [`Reachability::poll_probe`] says, with a request that changes
/// nothing: reservation 0 of that DC (any reply is an answer).
async fn probe_loop(shared: Weak<Shared>, addr: AddrSlot, epoch: u64) {
    loop {
        let Some(live) = shared.upgrade() else {
            return;
        };
        let step = live.reach().poll_probe(addr, epoch, Instant::now());
        match step {
            ProbeStep::Stop => return,
            ProbeStep::WaitUntil(at) => {
                drop(live);
                tokio::time::sleep_until(tokio::time::Instant::from_std(at)).await;
            }
            ProbeStep::Send => {
                let probe = Request::ResolveReservation {
                    id: ReservationId::new(live.table[addr.0].dc.clone(), 0),
                };
                let answered = Shared::send(&live, addr, &probe, live.timeout)
                    .await
                    .is_ok();
                let now = Instant::now();
                let change = live.reach().handle_probe(addr, epoch, answered, now);
                if let Some(change) = change {
                    Shared::changed(&live, change);
                }
            }
        }
    }
}
