//! The peer table (DC id → address) and the requests this daemon sends to
//! other DCs. Nothing a peer says is trusted blindly: a reply of the wrong
//! kind is an error, and the chain walk checks that a DC speaks only for its
//! own reservations.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use homing_core::{
    AwaitReply, DcId, ErrorKind, ErrorReply, FencingToken, Key, LinkReply, Reply, Request,
    ReservationId, Segment, ShortcutNotice,
};
use homing_net::{Client, Peer};
use thiserror::Error;

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
    table: Arc<BTreeMap<DcId, SocketAddr>>,
    client: Client,
    timeout: Duration,
    metrics: Arc<Metrics>,
}

impl Peers {
    /// Peers reachable through `client`, each request bounded by `timeout`.
    pub fn new(
        table: BTreeMap<DcId, SocketAddr>,
        client: Client,
        timeout: Duration,
        metrics: Arc<Metrics>,
    ) -> Peers {
        Peers {
            table: Arc::new(table),
            client,
            timeout,
            metrics,
        }
    }

    async fn call(&self, dc: &DcId, request: &Request) -> Result<Reply, PeerError> {
        let unavailable = |reason: String| PeerError::Unavailable {
            dc: dc.clone(),
            reason,
        };
        let addr = *self
            .table
            .get(dc)
            .ok_or_else(|| unavailable("not in the peer table".to_string()))?;
        let peer = Peer {
            addr,
            dc: dc.clone(),
        };
        let started = Instant::now();
        // A request that asks the peer to wait gets that much more time.
        let timeout = self.timeout + Duration::from_millis(u64::from(request.wait_ms()));
        let reply = tokio::time::timeout(timeout, self.client.request(&peer, request))
            .await
            .map_err(|_| unavailable(format!("no answer within {} ms", timeout.as_millis())))?
            .map_err(|e| unavailable(e.to_string()))?;
        if request.wait_ms() == 0 {
            self.metrics.peer(dc.as_str(), started.elapsed());
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
