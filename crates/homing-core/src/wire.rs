//! Wire messages: one `Request` and one `Reply` per QUIC stream, each a
//! postcard frame of at most [`FRAME_BYTES_MAX`] bytes. Decoding hostile
//! bytes returns a [`FrameError`], never panics, and every decoded value went
//! through the same validating constructors as a locally built one.

use serde::{Deserialize, Serialize, de::DeserializeOwned};
use thiserror::Error;

use crate::actor::ActorId;
use crate::chain::Segment;
use crate::connect::AcquireReply;
use crate::dc::DcId;
use crate::directory::Directory;
use crate::event::{Event, EventSeq};
use crate::fencing::FencingToken;
use crate::key::{Key, KeyConfig, NamespaceScope};
use crate::lease::Deadlines;
use crate::lease_key::LeaseKey;
use crate::link::{Shortcut, Succession};
use crate::record::{
    DcRecord, LinkReply, ReleaseCause, ReleaseReply, RenewReply, RunOutcome, ScanCursor,
};
use crate::reservation::ReservationId;
use crate::session::{SessionCounts, SessionId, SessionKey, SessionRenewReply};
use crate::time::HostTime;

/// The newest protocol version this build speaks (N).
pub const PROTOCOL_VERSION: u16 = 10;
/// The oldest protocol version this build still speaks: the previous
/// release's newest (release-7, commit 67ed29a; 8 and 9 came since). A process of
/// that release and one of this release talk at it, so a deployment
/// upgrades one process at a time. A peer that speaks none of
/// `PROTOCOL_VERSION_OLDEST..=PROTOCOL_VERSION` is refused at the handshake.
pub const PROTOCOL_VERSION_OLDEST: u16 = 7;
/// The ALPN identifier that carries [`PROTOCOL_VERSION`].
pub const ALPN: &[u8] = b"homing/10";
/// Longest a request may ask to be parked (`wait_ms` of `Acquire`, `Await`
/// and `Watch`), in milliseconds: 5 minutes.
pub const WAIT_MS_MAX: u32 = 300_000;
/// Largest frame either side accepts, in bytes.
pub const FRAME_BYTES_MAX: usize = 64 * 1024;
/// Longest human-readable message in an error reply, in bytes.
pub const ERROR_MESSAGE_BYTES_MAX: usize = 1024;

/// A request; the roles allowed to send each are in [`authorize`](crate::authorize).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Request {
    /// Where does `key` live? Answered with [`Reply::Resolved`].
    Resolve {
        /// The key.
        key: Key,
    },
    /// What does the owner know about `id`? Answered with [`Reply::Reservation`].
    ResolveReservation {
        /// A reservation owned by the receiving DC.
        id: ReservationId,
    },
    /// Connect: reserve the key for `actor` in the receiving DC, or learn who holds it.
    Acquire {
        /// The key, its namespace and tag.
        config: KeyConfig,
        /// The actor the caller will run.
        actor: ActorId,
        /// The caller's secret for this logical acquire, the same on every
        /// retry of it: a retry of a granted acquire gets that grant again.
        lease: LeaseKey,
        /// The caller's clock when it sent this.
        host_time: HostTime,
        /// When a live actor holds the key, wait up to this long (≤
        /// [`WAIT_MS_MAX`]) for it to release or expire, then acquire; `0`
        /// answers `HeldElsewhere` at once.
        wait_ms: u32,
    },
    /// Renew the lease on `reservation`.
    Renew {
        /// The held reservation.
        reservation: ReservationId,
        /// The holder's token.
        token: FencingToken,
        /// The holder's lease key (the one its acquire sent).
        lease: LeaseKey,
        /// The caller's clock when it sent this.
        host_time: HostTime,
    },
    /// Release the lease on `reservation`.
    Release {
        /// The held reservation.
        reservation: ReservationId,
        /// The holder's token.
        token: FencingToken,
        /// The holder's lease key (the one its acquire sent).
        lease: LeaseKey,
        /// How the run ended; stored on the record for the next holder.
        outcome: RunOutcome,
    },
    /// A host that gave up on the acquire it sent with `lease` (no reply in
    /// time): if that acquire was granted here, or is granted later, the
    /// grant is released at once as cancelled. Answered with [`Reply::Cancelled`].
    Cancel {
        /// The key the acquire asked for (with the name the host chose).
        key: Key,
        /// The abandoned acquire's lease key.
        lease: LeaseKey,
    },
    /// Operator: release the lease on `reservation` held under `token`
    /// without its holder, who may still run until its hard deadline.
    /// Logged, and evented as `Forced`.
    ForceRelease {
        /// The held reservation.
        reservation: ReservationId,
        /// The holder's token (a newer holder is never released by mistake).
        token: FencingToken,
    },
    /// DC to DC: continue the tail `from` of `key` as `to` if it is vacant with `expected_token`.
    Link {
        /// The key whose chain the caller walked.
        key: Key,
        /// The tail, owned by the receiving DC.
        from: ReservationId,
        /// The caller's new reservation.
        to: ReservationId,
        /// The tail token the caller read.
        expected_token: FencingToken,
    },
    /// DC to DC, after a link: `shortcut` is a later member of the chain
    /// of `key` that starts at `entry` (owned by the receiving DC), which
    /// records it for walkers. Answered with [`Reply::Noted`].
    Shortcut {
        /// The key.
        key: Key,
        /// The key's first reservation.
        entry: ReservationId,
        /// The member that just joined the chain.
        shortcut: Shortcut,
    },
    /// Operator: refuse further renewals of the key's live lease.
    Drain {
        /// The key.
        key: Key,
    },
    /// Operator: every record of the key's chain this DC can reach.
    Inspect {
        /// The key.
        key: Key,
    },
    /// DC to DC: park until `reservation` (owned by the receiving DC) has no
    /// live holder, or `wait_ms` passes. Answered with [`Reply::Awaited`].
    Await {
        /// The held tail.
        reservation: ReservationId,
        /// How long to wait, ≤ [`WAIT_MS_MAX`].
        wait_ms: u32,
    },
    /// The receiving DC's lifecycle events after `after`, in `scope`. When
    /// none are there, waits up to `wait_ms` for the next. Answered with
    /// [`Reply::Events`].
    Watch {
        /// Which namespaces.
        scope: NamespaceScope,
        /// The cursor: the `next` of the previous answer, `0` from the start.
        after: EventSeq,
        /// How long to wait for an event, ≤ [`WAIT_MS_MAX`].
        wait_ms: u32,
    },
    /// Operator: one page of the receiving DC's records in `scope`, after
    /// `after`. Answered with [`Reply::Records`].
    Scan {
        /// Which namespaces.
        scope: NamespaceScope,
        /// Where the previous page ended.
        after: Option<ScanCursor>,
    },
    /// Operator: drain one page of the receiving DC's live leases in
    /// `scope`, after `after`. Answered with [`Reply::DrainedPage`].
    DrainScope {
        /// Which namespaces.
        scope: NamespaceScope,
        /// Where the previous page ended.
        after: Option<ScanCursor>,
    },
    /// Who succeeds `id` in the global store (DESIGN.md §7.5): what a
    /// resolver asks any DC when `id`'s own DC does not answer. Answered
    /// with [`Reply::Successor`].
    Successor {
        /// The key whose chain the caller walks.
        key: Key,
        /// A reservation of any DC.
        id: ReservationId,
    },
    /// Since version 8: which homingd serve each DC (the DC directory the
    /// global store keeps, as the receiving DC last read it). Answered with
    /// [`Reply::Directory`].
    Directory,
    /// Since version 9, host to its own DC: open a host session, whose
    /// renewals hold every key acquired under it. Answered with
    /// [`Reply::SessionOpened`].
    OpenSession {
        /// The host's secret for the session: renewals, acquires under it,
        /// its close and its resync present it.
        secret: LeaseKey,
        /// The caller's clock when it sent this.
        host_time: HostTime,
    },
    /// Since version 9: the session's heartbeat, acknowledging the notices
    /// numbered up to `ack`. Answered with [`Reply::SessionRenewed`].
    RenewSession {
        /// The session.
        session: SessionId,
        /// Its secret.
        secret: LeaseKey,
        /// The caller's clock when it sent this.
        host_time: HostTime,
        /// The highest notice number the host has acted on.
        ack: u64,
    },
    /// Since version 9: the host stopped every actor it ran under the
    /// session; its keys are vacant from now plus grace. Answered with
    /// [`Reply::SessionClosed`].
    CloseSession {
        /// The session.
        session: SessionId,
        /// Its secret.
        secret: LeaseKey,
    },
    /// Since version 9: a page of the keys held under the session (a host
    /// resyncing after it lost track). Answered with [`Reply::SessionKeys`].
    SessionKeys {
        /// The session.
        session: SessionId,
        /// Its secret.
        secret: LeaseKey,
        /// Start after this reservation (`None`: from the first).
        after: Option<ReservationId>,
    },
    /// Since version 9: [`Request::Acquire`] under a host session — the key
    /// is held for as long as the session is (no per-key renewals).
    AcquireInSession {
        /// The key, its namespace and tag.
        config: KeyConfig,
        /// The actor the caller will run.
        actor: ActorId,
        /// The caller's secret for this logical acquire (as `Acquire`'s).
        lease: LeaseKey,
        /// The caller's clock when it sent this.
        host_time: HostTime,
        /// As `Acquire`'s.
        wait_ms: u32,
        /// The session to hold the key under.
        session: SessionId,
        /// Its secret.
        secret: LeaseKey,
    },
    /// Since version 10, operator or peer DC: what the receiving homingd
    /// knows of its DC now — live leases, its stores' health, its round
    /// trips to the other DCs. Answered with [`Reply::DcReport`].
    DcReport,
}

impl Request {
    /// The request's kind, for logs and metrics.
    pub fn kind(&self) -> &'static str {
        match self {
            Request::Resolve { .. } => "resolve",
            Request::ResolveReservation { .. } => "resolve_reservation",
            Request::Acquire { .. } => "acquire",
            Request::Renew { .. } => "renew",
            Request::Release { .. } => "release",
            Request::Cancel { .. } => "cancel",
            Request::ForceRelease { .. } => "force_release",
            Request::Link { .. } => "link",
            Request::Shortcut { .. } => "shortcut",
            Request::Drain { .. } => "drain",
            Request::Inspect { .. } => "inspect",
            Request::Await { .. } => "await",
            Request::Watch { .. } => "watch",
            Request::Scan { .. } => "scan",
            Request::DrainScope { .. } => "drain_scope",
            Request::Successor { .. } => "successor",
            Request::Directory => "directory",
            Request::OpenSession { .. } => "open_session",
            Request::RenewSession { .. } => "renew_session",
            Request::CloseSession { .. } => "close_session",
            Request::SessionKeys { .. } => "session_keys",
            Request::AcquireInSession { .. } => "acquire_in_session",
            Request::DcReport => "dc_report",
        }
    }

    /// How long the request asks to be parked, in milliseconds (capped at
    /// [`WAIT_MS_MAX`]): servers and clients add it to their request timeouts.
    pub fn wait_ms(&self) -> u32 {
        match self {
            Request::Acquire { wait_ms, .. }
            | Request::AcquireInSession { wait_ms, .. }
            | Request::Await { wait_ms, .. }
            | Request::Watch { wait_ms, .. } => (*wait_ms).min(WAIT_MS_MAX),
            _ => 0,
        }
    }
}

/// A reply.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Reply {
    /// To `Resolve`: the global entry and, when this DC owns it, the segment
    /// from it. `entry: None` means the key was never reserved.
    Resolved {
        /// The key's global entry.
        entry: Option<ReservationId>,
        /// The chain from `entry` as far as this DC knows it.
        segment: Option<Segment>,
    },
    /// To `ResolveReservation`: links inside this DC, then the tail if here.
    Reservation(Segment),
    /// To `Acquire`: whether the caller holds the key, and if not who does.
    Acquire(AcquireReply),
    /// To `Renew`.
    Renew(RenewReply),
    /// To `Release` and `ForceRelease`.
    Release(ReleaseReply),
    /// To `Cancel`: whether a grant was found and released (false: none
    /// was made here yet; one made later is released as it lands).
    Cancelled(bool),
    /// To `Link`.
    Link(LinkReply),
    /// To `Shortcut`: whether the entry recorded it (false: it knew a later one, or ignored it).
    Noted(bool),
    /// To `Drain`: renewals are now refused (or there was no live lease).
    Drained,
    /// To `Inspect`: the records this DC could reach, in chain order.
    Inspected {
        /// The records.
        records: Vec<DcRecord>,
    },
    /// To `Await`.
    Awaited(AwaitReply),
    /// To `Watch`: events in order; pass `next` as the next `after`. Events
    /// outside the scope are skipped but still move `next`.
    Events {
        /// The events, in log order.
        events: Vec<Event>,
        /// The cursor to resume from.
        next: EventSeq,
    },
    /// To `Scan`: one page of records in `(key, id)` order.
    Records {
        /// The records.
        records: Vec<DcRecord>,
        /// Where to continue; `None` when this was the last page.
        next: Option<ScanCursor>,
    },
    /// To `DrainScope`: how many live leases this page drained.
    DrainedPage {
        /// Leases drained now (already-drained ones are not counted).
        drained: u32,
        /// Where to continue; `None` when this was the last page.
        next: Option<ScanCursor>,
    },
    /// The request could not be served.
    Error(ErrorReply),
    /// To `Successor`: the succession the global store has (write-once, so
    /// a present answer may be cached forever), or `None`; and the furthest
    /// member of the key's chain the answering DC remembers (a hint: a
    /// walker checks it when it jumps there).
    Successor {
        /// The succession.
        succession: Option<Succession>,
        /// The answering DC's hint.
        hint: Option<Shortcut>,
    },
    /// Since version 8, to `Directory`: the DC directory.
    Directory(Directory),
    /// Since version 9, to `OpenSession`: the new session and its first
    /// deadlines, in the host's clock.
    SessionOpened {
        /// The session.
        session: SessionId,
        /// Its deadlines.
        deadlines: Deadlines,
    },
    /// Since version 9, to `RenewSession`.
    SessionRenewed(SessionRenewReply),
    /// Since version 9, to `CloseSession`: whether it was live and is
    /// closed now (`false`: already ended, unknown, or another secret).
    SessionClosed(bool),
    /// Since version 9, to `SessionKeys`: a page of the session's keys, in
    /// reservation order.
    SessionKeys {
        /// The keys.
        keys: Vec<SessionKey>,
        /// Whether more follow (ask again after the last one).
        more: bool,
    },
    /// To `DcReport` (since version 10).
    DcReport(DcReport),
}

/// What a homingd knows of its DC now ([`Reply::DcReport`]): what
/// `homing dc status` shows per DC.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DcReport {
    /// Per-key live leases at the reaper's last pass.
    pub live_leases: u64,
    /// Host sessions and the keys held under them, as the DC store counts
    /// them after the last upkeep pass (`None`: the store does not count).
    pub sessions: Option<SessionCounts>,
    /// The DC's own store: one health read, timed.
    pub dc_store: Probe,
    /// The global store, as this homingd reaches it: one health read, timed.
    pub global_store: Probe,
    /// One request to each other DC in this homingd's peer table, timed.
    pub peers: Vec<PeerProbe>,
}

/// A timed check: how long it took to answer, or why it did not.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Probe {
    /// It answered, in this many microseconds.
    Answered {
        /// Its latency.
        micros: u64,
    },
    /// It failed or did not answer in time.
    Failed(String),
}

/// One homingd's round trip to a peer DC.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PeerProbe {
    /// The peer DC.
    pub dc: DcId,
    /// The round trip of one request to it.
    pub probe: Probe,
}

/// Reply to [`Request::Await`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum AwaitReply {
    /// The reservation has no live holder now: acquire it.
    Vacated {
        /// How the last run ended.
        ended: ReleaseCause,
    },
    /// The reservation continues as `to` (or lost its race): walk again.
    Moved,
    /// Still held when the wait ran out.
    TimedOut,
}

/// Why a request failed, in a form the caller can act on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Error)]
#[error("{kind}: {message}")]
pub struct ErrorReply {
    /// What went wrong.
    pub kind: ErrorKind,
    /// Details for humans, at most [`ERROR_MESSAGE_BYTES_MAX`] bytes.
    pub message: String,
}

impl ErrorReply {
    /// An error reply, its message cut to [`ERROR_MESSAGE_BYTES_MAX`] bytes.
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> ErrorReply {
        let mut message = message.into();
        if message.len() > ERROR_MESSAGE_BYTES_MAX {
            let mut cut = ERROR_MESSAGE_BYTES_MAX;
            while !message.is_char_boundary(cut) {
                cut -= 1;
            }
            message.truncate(cut);
        }
        ErrorReply { kind, message }
    }
}

/// The kinds of failure a caller handles differently.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Error)]
pub enum ErrorKind {
    /// The caller's role may not send this request here.
    #[error("unauthorized")]
    Unauthorized,
    /// The request was malformed or names something this DC does not own.
    #[error("bad request")]
    BadRequest,
    /// The reservation does not exist in this DC.
    #[error("unknown reservation")]
    UnknownReservation,
    /// A DC needed for the answer could not be reached.
    #[error("dc {dc} unavailable")]
    Unavailable {
        /// The DC.
        dc: DcId,
    },
    /// A peer's answer contradicted the chain (cycle, hop limit, wrong owner).
    #[error("inconsistent chain")]
    Inconsistent,
    /// The server is at a limit; retry later.
    #[error("overloaded")]
    Overloaded,
    /// A watch cursor points before the oldest event the DC still keeps:
    /// events were trimmed (retention) and the watcher missed some.
    #[error("events before {oldest} were trimmed")]
    Trimmed {
        /// The oldest event still kept.
        oldest: EventSeq,
    },
    /// Anything else (a store error, …).
    #[error("internal error")]
    Internal,
    /// This DC created as many keys in the key's namespace as its
    /// `keys_per_namespace_max` allows (each created key keeps a global
    /// entry forever): no new key is created there. Not retried: it lasts
    /// until an operator raises the quota. Keys that exist still acquire.
    #[error("key quota of {keys_max} per namespace reached")]
    QuotaExceeded {
        /// The DC's quota.
        keys_max: u64,
    },
    /// Since version 9: the host session an acquire named has ended, run
    /// out, or is not this DC's: open a new one (its keys are vacant, or
    /// will be at its expiry plus grace).
    #[error("host session ended")]
    SessionEnded,
}

impl ErrorKind {
    /// Whether this answer to a `ResolveReservation` says the owner has no
    /// usable record of the reservation (unknown, abandoned, broken): a walk
    /// trying a shortcut falls back on it; any other walk fails.
    pub fn disowns(&self) -> bool {
        matches!(
            self,
            ErrorKind::UnknownReservation | ErrorKind::Inconsistent
        )
    }
}

/// Why a frame could not be encoded or decoded.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum FrameError {
    /// The frame exceeds the size limit.
    #[error("frame of {len} bytes exceeds the limit of {max} bytes")]
    TooLarge {
        /// Its length.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// The bytes are not a valid message.
    #[error("malformed frame: {0}")]
    Malformed(String),
    /// A valid message followed by extra bytes.
    #[error("{0} trailing bytes after the message")]
    Trailing(usize),
}

/// The buffer an encoding starts with: most requests and replies fit, so
/// they cost one allocation instead of one per doubling.
const ENCODE_CAPACITY: usize = 128;

/// The length `message` encodes to, or why it would not fit one frame (what
/// [`encode`] would refuse), without encoding it.
pub fn encoded_len<T: Serialize>(message: &T) -> Result<usize, FrameError> {
    let size = postcard::ser_flavors::Size::default();
    let len = postcard::serialize_with_flavor(message, size)
        .map_err(|e| FrameError::Malformed(e.to_string()))?;
    if len > FRAME_BYTES_MAX {
        return Err(FrameError::TooLarge {
            len,
            max: FRAME_BYTES_MAX,
        });
    }
    Ok(len)
}

/// Encodes a message into one frame.
pub fn encode<T: Serialize>(message: &T) -> Result<Vec<u8>, FrameError> {
    let bytes = postcard::to_extend(message, Vec::with_capacity(ENCODE_CAPACITY))
        .map_err(|e| FrameError::Malformed(e.to_string()))?;
    if bytes.len() > FRAME_BYTES_MAX {
        return Err(FrameError::TooLarge {
            len: bytes.len(),
            max: FRAME_BYTES_MAX,
        });
    }
    Ok(bytes)
}

/// Decodes one frame holding exactly one message.
pub fn decode<T: DeserializeOwned>(frame: &[u8]) -> Result<T, FrameError> {
    if frame.len() > FRAME_BYTES_MAX {
        return Err(FrameError::TooLarge {
            len: frame.len(),
            max: FRAME_BYTES_MAX,
        });
    }
    crate::label::take_refused();
    let (message, rest) = postcard::take_from_bytes(frame).map_err(|e| {
        // Name the broken rule when a field refused its value.
        match crate::label::take_refused() {
            Some(refused) => FrameError::Malformed(refused.to_string()),
            None => FrameError::Malformed(e.to_string()),
        }
    })?;
    if !rest.is_empty() {
        return Err(FrameError::Trailing(rest.len()));
    }
    Ok(message)
}

/// A message whose variants each arrived in some protocol version.
pub trait Versioned {
    /// The first protocol version that carries this message.
    fn since(&self) -> u16;
}

/// A request is sent only on a connection of its version or newer.
impl Versioned for Request {
    fn since(&self) -> u16 {
        match self {
            Request::OpenSession { .. }
            | Request::RenewSession { .. }
            | Request::CloseSession { .. }
            | Request::SessionKeys { .. }
            | Request::AcquireInSession { .. } => 9,
            Request::DcReport => 10,
            Request::Directory => 8,
            _ => 7,
        }
    }
}

/// A reply to a request of version `v` is of version `v` at most.
impl Versioned for Reply {
    fn since(&self) -> u16 {
        match self {
            Reply::SessionOpened { .. }
            | Reply::SessionRenewed(_)
            | Reply::SessionClosed(_)
            | Reply::SessionKeys { .. } => 9,
            Reply::Error(ErrorReply {
                kind: ErrorKind::SessionEnded,
                ..
            }) => 9,
            Reply::Directory(_) => 8,
            Reply::DcReport(_) => 10,
            // A key held under a session is a record form versions 7 and 8
            // cannot read.
            Reply::Inspected { records } | Reply::Records { records, .. }
                if records.iter().any(|r| r.session().is_some()) =>
            {
                9
            }
            _ => 7,
        }
    }
}

/// The ALPN identifier of protocol `version`: `homing/<version>`.
pub fn alpn(version: u16) -> Vec<u8> {
    format!("homing/{version}").into_bytes()
}

/// The ALPN identifiers of `versions`, newest first: what a TLS
/// configuration offers, so a handshake settles on the newest both sides
/// speak (a server picks the first of its own list the client offers).
pub fn alpn_offer(versions: std::ops::RangeInclusive<u16>) -> Vec<Vec<u8>> {
    versions.rev().map(alpn).collect()
}

/// The protocol version an ALPN identifier names, if it is a homing one.
pub fn version_of_alpn(protocol: &[u8]) -> Option<u16> {
    std::str::from_utf8(protocol.strip_prefix(b"homing/")?)
        .ok()?
        .parse()
        .ok()
}

/// A message is not part of the protocol version a connection speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
#[error("needs protocol version {needs}; the connection speaks {speaks}")]
pub struct NotInVersion {
    /// The version the message arrived in.
    pub needs: u16,
    /// The connection's version.
    pub speaks: u16,
}

/// Whether `message` may travel on a connection of protocol `version`.
pub fn check_version<T: Versioned>(message: &T, version: u16) -> Result<(), NotInVersion> {
    let needs = message.since();
    if needs > version {
        return Err(NotInVersion {
            needs,
            speaks: version,
        });
    }
    Ok(())
}

/// Decodes one frame that arrived on a connection of protocol `version`: a
/// message of a later version is malformed there (a peer speaking `version`
/// cannot have meant it).
pub fn decode_for<T: DeserializeOwned + Versioned>(
    version: u16,
    frame: &[u8],
) -> Result<T, FrameError> {
    let message: T = decode(frame)?;
    check_version(&message, version).map_err(|e| FrameError::Malformed(e.to_string()))?;
    Ok(message)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::key::KeyName;
    use proptest::prelude::*;

    #[test]
    fn frames_round_trip() {
        let request = Request::Acquire {
            config: KeyConfig::named(KeyName::new("room").unwrap()),
            actor: ActorId::new("10.0.0.1:8080").unwrap(),
            lease: LeaseKey::from_bytes([1; 16]).unwrap(),
            host_time: HostTime::from_ms(5),
            wait_ms: 0,
        };
        assert_eq!(
            decode::<Request>(&encode(&request).unwrap()).unwrap(),
            request
        );
        let reply = Reply::Error(ErrorReply::new(
            ErrorKind::Unauthorized,
            "router may not link",
        ));
        assert_eq!(decode::<Reply>(&encode(&reply).unwrap()).unwrap(), reply);
    }

    #[test]
    fn encoded_len_is_what_encode_writes_and_refuses_what_encode_refuses() {
        let fits = Reply::Error(ErrorReply::new(ErrorKind::Internal, "x".repeat(300)));
        assert_eq!(encoded_len(&fits), Ok(encode(&fits).unwrap().len()));
        let big = "x".repeat(FRAME_BYTES_MAX);
        let refused = encoded_len(&big);
        assert!(
            matches!(refused, Err(FrameError::TooLarge { .. })),
            "{refused:?}"
        );
        assert_eq!(refused, encode(&big).map(|b| b.len()));
    }

    #[test]
    fn oversized_and_trailing_frames_are_rejected() {
        let frame = vec![0u8; FRAME_BYTES_MAX + 1];
        assert!(matches!(
            decode::<Request>(&frame),
            Err(FrameError::TooLarge { .. })
        ));
        let mut frame = encode(&Request::Drain {
            key: Key::new(KeyName::new("k").unwrap()),
        })
        .unwrap();
        frame.push(0);
        assert_eq!(decode::<Request>(&frame), Err(FrameError::Trailing(1)));
    }

    #[test]
    fn a_frame_with_an_invalid_field_is_refused_naming_the_rule() {
        // A Resolve whose key name is empty: well-formed postcard, invalid key.
        let frame = [0u8, 0, 0];
        assert_eq!(
            decode::<Request>(&frame),
            Err(FrameError::Malformed(
                "key name must not be empty".to_string()
            ))
        );
        // A reservation id whose DC has an upper-case letter.
        let frame = encode(&Request::ResolveReservation {
            id: "iad.1".parse().unwrap(),
        })
        .unwrap();
        let mut bad = frame.clone();
        let at = bad.iter().position(|b| *b == b'a').unwrap();
        bad[at] = b'A';
        let err = decode::<Request>(&bad).unwrap_err().to_string();
        assert!(err.contains("dc id may only contain"), "{err}");
        // Plain garbage still gets postcard's own message.
        assert!(matches!(
            decode::<Request>(&[0xff]),
            Err(FrameError::Malformed(_))
        ));
    }

    #[test]
    fn error_messages_are_bounded() {
        let reply = ErrorReply::new(ErrorKind::Internal, "é".repeat(ERROR_MESSAGE_BYTES_MAX));
        assert!(reply.message.len() <= ERROR_MESSAGE_BYTES_MAX);
    }

    proptest! {
        #[test]
        fn random_bytes_never_panic_any_decoder(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            let _ = decode::<Request>(&bytes);
            let _ = decode::<Reply>(&bytes);
            let _ = decode::<DcRecord>(&bytes);
            let _ = decode::<Segment>(&bytes);
        }

        #[test]
        fn decoded_requests_re_encode_identically(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
            if let Ok(request) = decode::<Request>(&bytes) {
                let again = encode(&request).unwrap();
                prop_assert_eq!(decode::<Request>(&again).unwrap(), request);
            }
        }
    }
}
