//! `Node`: one DC's request handler. It drives homing-core's steppers
//! (connect, chain walk, local segment, record transitions) against this DC's
//! stores and its peers; every decision is homing-core's, this module only
//! performs the I/O they ask for and maps outcomes to replies.

use std::hash::{BuildHasher, Hasher};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use homing_core::{
    ActorId, ChainWalk, Connect, ConnectError, ConnectNeed, ConnectOutcome, ConnectPoll, DcId,
    DcRecord, ErrorKind, ErrorReply, FencingToken, HostTime, Identity, Key, KeyConfig, LeasePolicy,
    LinkReply, LocalSegment, Need, Poll, Reply, Request, ReservationId, Role, Segment,
    SegmentError, Source, StoreTime, Transition, Walked, Written,
};
use homing_net::Handler;
use homing_store::{DcStore, GlobalStore, SetIfAbsent, StoreError};
use tracing::Instrument;

use crate::metrics::Metrics;
use crate::peers::{PeerError, Peers};

/// Most compare-and-set attempts on one record before answering `Overloaded`.
pub const CAS_ATTEMPTS_MAX: u32 = 16;
/// Most records one `Inspect` reply carries: a record encodes to at most about
/// 1 KiB, so this keeps the reply inside one 64 KiB frame.
pub const INSPECT_RECORDS_MAX: usize = 48;

/// Reads this machine's clock as the DC store's time. Only this driver reads it.
pub fn store_now() -> StoreTime {
    let ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0);
    StoreTime::from_ms(ms)
}

/// One DC: its stores, its peers, its policy.
pub struct Node {
    dc: DcId,
    global: Arc<dyn GlobalStore>,
    records: Arc<dyn DcStore>,
    peers: Peers,
    policy: LeasePolicy,
    hop_limit: usize,
    metrics: Arc<Metrics>,
    /// Global entries never change, so caching them can never be stale.
    global_cache: moka::sync::Cache<Key, ReservationId>,
    random: (std::collections::hash_map::RandomState, AtomicU64),
}

/// How a request failed, before it becomes an error reply.
#[derive(Debug)]
enum Failure {
    Reply(ErrorReply),
    Store(StoreError),
    Peer(PeerError),
}

impl From<StoreError> for Failure {
    fn from(e: StoreError) -> Failure {
        Failure::Store(e)
    }
}

impl From<PeerError> for Failure {
    fn from(e: PeerError) -> Failure {
        Failure::Peer(e)
    }
}

fn fail(kind: ErrorKind, message: impl Into<String>) -> Failure {
    Failure::Reply(ErrorReply::new(kind, message))
}

impl Failure {
    /// The reply for this failure at DC `dc`. A store that cannot be reached
    /// makes the DC unavailable (retryable); other store errors are internal.
    fn into_reply(self, dc: &DcId) -> ErrorReply {
        match self {
            Failure::Reply(reply) => reply,
            Failure::Store(e @ StoreError::Unavailable { .. }) => ErrorReply::new(
                ErrorKind::Unavailable { dc: dc.clone() },
                format!("store: {e}"),
            ),
            Failure::Store(e) => ErrorReply::new(ErrorKind::Internal, format!("store: {e}")),
            Failure::Peer(e) => e.to_reply(),
        }
    }
}

fn segment_failure(e: SegmentError) -> Failure {
    match e {
        SegmentError::Unknown(_) => fail(ErrorKind::UnknownReservation, e.to_string()),
        SegmentError::Abandoned(_) | SegmentError::Broken(_) => {
            fail(ErrorKind::Inconsistent, e.to_string())
        }
    }
}

fn outcome_of(reply: &Reply) -> &'static str {
    match reply {
        Reply::Error(e) => match e.kind {
            ErrorKind::Unauthorized => "unauthorized",
            ErrorKind::BadRequest => "bad_request",
            ErrorKind::UnknownReservation => "unknown_reservation",
            ErrorKind::Unavailable { .. } => "unavailable",
            ErrorKind::Inconsistent => "inconsistent",
            ErrorKind::Overloaded => "overloaded",
            ErrorKind::Internal => "internal",
        },
        Reply::Resolved { entry: None, .. } => "not_found",
        Reply::HeldElsewhere { .. } => "held_elsewhere",
        Reply::TagMismatch { .. } => "tag_mismatch",
        _ => "ok",
    }
}

impl Node {
    /// A node for `dc` over the given stores and peers.
    #[allow(clippy::too_many_arguments)] // each argument is one of the DC's parts
    pub fn new(
        dc: DcId,
        global: Arc<dyn GlobalStore>,
        records: Arc<dyn DcStore>,
        peers: Peers,
        policy: LeasePolicy,
        hop_limit: usize,
        global_cache_entries: u64,
        metrics: Arc<Metrics>,
    ) -> Node {
        Node {
            dc,
            global,
            records,
            peers,
            policy,
            hop_limit,
            metrics,
            global_cache: moka::sync::Cache::new(global_cache_entries),
            random: (
                std::collections::hash_map::RandomState::new(),
                AtomicU64::new(0),
            ),
        }
    }

    /// This node's DC.
    pub fn dc(&self) -> &DcId {
        &self.dc
    }

    /// The lease policy.
    pub fn policy(&self) -> &LeasePolicy {
        &self.policy
    }

    /// This node's metrics.
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    /// The DC store.
    pub fn records(&self) -> &Arc<dyn DcStore> {
        &self.records
    }

    /// The global store.
    pub fn global(&self) -> &Arc<dyn GlobalStore> {
        &self.global
    }

    /// The peers.
    pub fn peers(&self) -> &Peers {
        &self.peers
    }

    /// 128 random bits for a key name a connect did not give: the process's
    /// randomly seeded hasher over a counter.
    fn random_bits(&self) -> u128 {
        let mut bits = 0u128;
        for half in 0..2 {
            let mut h = self.random.0.build_hasher();
            h.write_u64(self.random.1.fetch_add(1, Ordering::Relaxed));
            h.write_u8(half);
            bits = (bits << 64) | u128::from(h.finish());
        }
        bits
    }

    async fn timed<T>(&self, op: &'static str, f: impl std::future::Future<Output = T>) -> T {
        let started = Instant::now();
        let out = f.await;
        self.metrics.store(op, started.elapsed());
        out
    }

    /// The key's global entry, from cache when known (entries never change).
    pub async fn global_entry(&self, key: &Key) -> Result<Option<ReservationId>, StoreError> {
        if let Some(id) = self.global_cache.get(key) {
            self.metrics.global_cache(true);
            return Ok(Some(id));
        }
        self.metrics.global_cache(false);
        let entry = self.timed("global_get", self.global.get(key)).await?;
        if let Some(id) = &entry {
            self.global_cache.insert(key.clone(), id.clone());
        }
        Ok(entry)
    }

    /// This DC's answer for its own reservation `id`: links inside the DC, then the tail.
    async fn local_segment(&self, id: &ReservationId) -> Result<Segment, Failure> {
        let mut segment = LocalSegment::new(self.dc.clone(), id.clone(), self.hop_limit);
        while let Some(at) = segment.need().cloned() {
            let record = self.timed("dc_get", self.records.get(&at)).await?;
            segment
                .handle(record.as_ref(), store_now(), &self.policy)
                .map_err(segment_failure)?;
        }
        Ok(segment.finish())
    }

    /// This DC's answer for its own reservation `id`, as an error reply on failure.
    pub async fn walk_segment(&self, id: &ReservationId) -> Result<Segment, ErrorReply> {
        self.local_segment(id)
            .await
            .map_err(|f| f.into_reply(&self.dc))
    }

    /// What `id`'s owner knows: ourselves for our own, else a peer round trip.
    async fn segment(&self, id: &ReservationId) -> Result<(Segment, Source), Failure> {
        if id.dc() == &self.dc {
            Ok((self.local_segment(id).await?, Source::Local))
        } else {
            Ok((self.peers.resolve_reservation(id).await?, Source::Remote))
        }
    }

    /// Walks `key`'s chain to its tail; `None` if the key was never reserved.
    pub async fn walk(&self, key: &Key) -> Result<Option<Walked>, ErrorReply> {
        let mut walk = ChainWalk::from_key(key.clone(), self.hop_limit);
        loop {
            let step = match walk.poll().clone() {
                Poll::Need(Need::GlobalEntry(key)) => match self.global_entry(&key).await {
                    Ok(entry) => walk.handle_global(entry, Source::Local),
                    Err(e) => return Err(Failure::from(e).into_reply(&self.dc)),
                },
                Poll::Need(Need::Reservation(id)) => match self.segment(&id).await {
                    Ok((segment, source)) => walk.handle_segment(id.dc(), segment, source),
                    Err(e) => return Err(e.into_reply(&self.dc)),
                },
                Poll::NotFound => return Ok(None),
                Poll::Done(walked) => return Ok(Some(walked)),
                Poll::Failed(e) => {
                    return Err(ErrorReply::new(ErrorKind::Inconsistent, e.to_string()));
                }
            };
            if let Err(e) = step {
                return Err(ErrorReply::new(ErrorKind::Inconsistent, e.to_string()));
            }
        }
    }

    /// Applies `transition` to our record `id` with compare-and-set, re-reading
    /// and retrying on conflict, at most [`CAS_ATTEMPTS_MAX`] times.
    pub async fn update<R>(
        &self,
        id: &ReservationId,
        transition: impl Fn(&DcRecord, StoreTime) -> Transition<R>,
    ) -> Result<R, ErrorReply> {
        self.update_inner(id, transition)
            .await
            .map_err(|f| f.into_reply(&self.dc))
    }

    async fn update_inner<R>(
        &self,
        id: &ReservationId,
        transition: impl Fn(&DcRecord, StoreTime) -> Transition<R>,
    ) -> Result<R, Failure> {
        if id.dc() != &self.dc {
            return Err(fail(
                ErrorKind::BadRequest,
                format!(
                    "reservation {id} is owned by dc {}, not {}",
                    id.dc(),
                    self.dc
                ),
            ));
        }
        for _ in 0..CAS_ATTEMPTS_MAX {
            let Some(record) = self.timed("dc_get", self.records.get(id)).await? else {
                return Err(fail(
                    ErrorKind::UnknownReservation,
                    format!("no reservation {id} in dc {}", self.dc),
                ));
            };
            let out = transition(&record, store_now());
            let Some(next) = out.next else {
                return Ok(out.reply);
            };
            let cas = self
                .timed(
                    "dc_cas",
                    self.records.compare_and_set(Some(record.version), &next),
                )
                .await?;
            if cas.landed(&next) {
                return Ok(out.reply);
            }
        }
        Err(fail(
            ErrorKind::Overloaded,
            format!("reservation {id} contended for {CAS_ATTEMPTS_MAX} attempts"),
        ))
    }

    async fn acquire(
        &self,
        config: KeyConfig,
        actor: ActorId,
        host_time: HostTime,
    ) -> Result<Reply, Failure> {
        let key = config.key(self.random_bits());
        tracing::Span::current().record("key", tracing::field::display(&key));
        let mut connect = Connect::new(
            self.dc.clone(),
            key,
            config.tag,
            actor,
            host_time,
            self.policy,
            self.hop_limit,
        );
        loop {
            match connect.poll() {
                ConnectPoll::Need(need) => self.perform(&mut connect, need).await?,
                ConnectPoll::Done(outcome) => return Ok(acquire_reply(outcome)),
                ConnectPoll::Failed(e) => {
                    let kind = match e {
                        ConnectError::Contended(_) => ErrorKind::Overloaded,
                        _ => ErrorKind::Inconsistent,
                    };
                    return Err(fail(kind, e.to_string()));
                }
            }
        }
    }

    /// Performs one need of a connect.
    async fn perform(&self, connect: &mut Connect, need: ConnectNeed) -> Result<(), Failure> {
        match need {
            ConnectNeed::GlobalEntry(key) => {
                let entry = self.global_entry(&key).await?;
                connect.handle_global(entry, Source::Local);
            }
            ConnectNeed::Reservation(id) => {
                let (segment, source) = self.segment(&id).await?;
                connect.handle_segment(id.dc(), segment, source);
            }
            ConnectNeed::LocalRecord(id) => {
                let record = self.timed("dc_get", self.records.get(&id)).await?;
                connect.handle_local_record(record, store_now());
            }
            ConnectNeed::Allocate => {
                let unique = self.timed("dc_allocate", self.records.allocate()).await?;
                connect.handle_allocated(unique, store_now());
            }
            ConnectNeed::Write { expected, record } => {
                let cas = self
                    .timed("dc_cas", self.records.compare_and_set(expected, &record))
                    .await?;
                let written = if cas.landed(&record) {
                    Written::Yes
                } else {
                    Written::Conflict
                };
                connect.handle_written(written);
            }
            ConnectNeed::SetIfAbsent { key, id } => {
                let existing = match self
                    .timed("global_set_if_absent", self.global.set_if_absent(&key, &id))
                    .await?
                {
                    SetIfAbsent::Inserted => None,
                    SetIfAbsent::Exists(existing) => Some(existing),
                };
                self.global_cache
                    .insert(key, existing.clone().unwrap_or(id));
                connect.handle_set_if_absent(existing);
            }
            ConnectNeed::Link {
                from,
                to,
                expected_token,
            } => {
                let reply = self.peers.link(&from, &to, expected_token).await?;
                connect.handle_link(reply);
            }
        }
        Ok(())
    }

    async fn link(
        &self,
        caller: &Identity,
        from: ReservationId,
        to: ReservationId,
        expected: FencingToken,
    ) -> Result<Reply, Failure> {
        // A node may only continue a chain with its own reservations.
        if caller.dc() != Some(to.dc()) {
            return Err(fail(
                ErrorKind::Unauthorized,
                format!("{caller} may not link to {to}, a reservation of another dc"),
            ));
        }
        let policy = self.policy;
        let reply = self
            .update_inner(&from, |record, now| {
                record.link(&to, expected, now, &policy)
            })
            .await?;
        if reply == LinkReply::Linked {
            tracing::info!(from = %from, to = %to, "linked");
        }
        Ok(Reply::Link(reply))
    }

    async fn drain(&self, caller: &Identity, key: Key) -> Result<Reply, Failure> {
        let Some(walked) = self.walk(&key).await.map_err(Failure::Reply)? else {
            return Err(fail(
                ErrorKind::UnknownReservation,
                format!("key {key} was never reserved"),
            ));
        };
        let tail = walked.tail.id;
        if tail.dc() == &self.dc {
            self.update_inner(&tail, |record, _| Transition {
                next: record.drain(),
                reply: (),
            })
            .await?;
            tracing::info!(reservation = %tail, "drained");
            return Ok(Reply::Drained);
        }
        if caller.role() == Role::Node {
            // Forwarded once already: the chain moved on; let the operator retry.
            return Err(fail(
                ErrorKind::Unavailable {
                    dc: tail.dc().clone(),
                },
                format!("tail {tail} moved away during the drain"),
            ));
        }
        self.peers.drain(tail.dc(), &key).await?;
        Ok(Reply::Drained)
    }

    async fn inspect(&self, key: Key) -> Result<Reply, Failure> {
        let mut records = Vec::new();
        let mut after = None;
        loop {
            let page = self
                .timed(
                    "dc_scan",
                    self.records.scan(
                        &key.namespace,
                        key.name.as_str(),
                        after.as_ref(),
                        homing_store::SCAN_LIMIT_MAX,
                    ),
                )
                .await?;
            let done = page.len() < homing_store::SCAN_LIMIT_MAX;
            after = page.last().map(homing_store::ScanCursor::after);
            records.extend(page.into_iter().filter(|r| r.key == key));
            if done || records.len() >= INSPECT_RECORDS_MAX {
                break;
            }
        }
        records.truncate(INSPECT_RECORDS_MAX);
        Ok(Reply::Inspected { records })
    }

    async fn serve(&self, caller: &Identity, request: Request) -> Result<Reply, Failure> {
        match request {
            Request::Resolve { key } => {
                let entry = self.global_entry(&key).await?;
                let segment = match &entry {
                    Some(id) if id.dc() == &self.dc => Some(self.local_segment(id).await?),
                    _ => None,
                };
                Ok(Reply::Resolved { entry, segment })
            }
            Request::ResolveReservation { id } => {
                if id.dc() != &self.dc {
                    return Err(fail(
                        ErrorKind::BadRequest,
                        format!("reservation {id} is owned by dc {}, ask it", id.dc()),
                    ));
                }
                Ok(Reply::Reservation(self.local_segment(&id).await?))
            }
            Request::Acquire {
                config,
                actor,
                host_time,
            } => self.acquire(config, actor, host_time).await,
            Request::Renew {
                reservation,
                token,
                host_time,
            } => {
                let policy = self.policy;
                let reply = self
                    .update_inner(&reservation, |r, now| {
                        r.renew(token, host_time, now, &policy)
                    })
                    .await?;
                Ok(Reply::Renew(reply))
            }
            Request::Release { reservation, token } => {
                let reply = self
                    .update_inner(&reservation, |r, now| r.release(token, now))
                    .await?;
                Ok(Reply::Release(reply))
            }
            Request::Link {
                from,
                to,
                expected_token,
            } => self.link(caller, from, to, expected_token).await,
            Request::Drain { key } => self.drain(caller, key).await,
            Request::Inspect { key } => self.inspect(key).await,
        }
    }
}

fn acquire_reply(outcome: ConnectOutcome) -> Reply {
    match outcome {
        ConnectOutcome::Acquired {
            key,
            reservation,
            token,
            deadlines,
        } => {
            tracing::info!(reservation = %reservation, token = token.get(), "acquired");
            Reply::Acquired {
                key,
                reservation,
                token,
                deadlines,
            }
        }
        ConnectOutcome::HeldElsewhere {
            key,
            reservation,
            actor,
            token,
        } => Reply::HeldElsewhere {
            key,
            reservation,
            actor,
            token,
        },
        ConnectOutcome::TagMismatch { existing } => Reply::TagMismatch { existing },
    }
}

fn request_span(dc: &DcId, caller: &Identity, request: &Request) -> tracing::Span {
    let (key, reservation) = match request {
        Request::Resolve { key } | Request::Drain { key } | Request::Inspect { key } => {
            (Some(key.to_string()), None)
        }
        Request::ResolveReservation { id } => (None, Some(id.to_string())),
        Request::Acquire { config, .. } => (config.name.as_ref().map(|n| n.to_string()), None),
        Request::Renew { reservation, .. } | Request::Release { reservation, .. } => {
            (None, Some(reservation.to_string()))
        }
        Request::Link { from, .. } => (None, Some(from.to_string())),
    };
    tracing::info_span!(
        "request",
        kind = request.kind(),
        dc = %dc,
        caller = %caller,
        key = key.as_deref().unwrap_or(""),
        reservation = reservation.as_deref().unwrap_or(""),
    )
}

#[async_trait]
impl Handler for Node {
    async fn handle(&self, caller: &Identity, request: Request) -> Reply {
        let kind = request.kind();
        let started = Instant::now();
        let span = request_span(&self.dc, caller, &request);
        let reply = async {
            let reply = match self.serve(caller, request).await {
                Ok(reply) => reply,
                Err(failure) => Reply::Error(failure.into_reply(&self.dc)),
            };
            if let Reply::Error(e) = &reply {
                tracing::warn!(error = %e, "request failed");
            } else {
                tracing::debug!("request served");
            }
            reply
        }
        .instrument(span)
        .await;
        self.metrics
            .request(kind, outcome_of(&reply), started.elapsed());
        reply
    }
}
