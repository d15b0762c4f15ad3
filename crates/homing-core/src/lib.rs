//! homing-core: the sans-IO model of homing. Validated types, the DC record
//! state machine, the lease timeline, the chain walk (and the router's walk
//! around it) and the wire messages.
//!
//! Nothing here reads a clock, opens a socket or draws randomness: time and
//! random bits are parameters, so the daemon and the simulator run exactly
//! this code and a simulation is reproducible from its seed.
//!
//! ```
//! use homing_core::{ActorId, DcRecord, FencingToken, Holding, HostTime, Key, KeyName,
//!                   LeaseKey, LeasePolicy, LinkReply, ReservationId, RunOutcome, StoreTime};
//! let policy = LeasePolicy::DEFAULT;
//! let key = Key::new(KeyName::new("room-42")?);
//! let id: ReservationId = "iad.1".parse()?;
//! // iad reserves the key for a host's actor; the host's clock and the store's differ.
//! let lease = LeaseKey::from_bytes([0x2a; 16]).expect("the host's random bits");
//! let host = Holding { actor: ActorId::new("10.1.0.7:9000")?, lease, host_time: HostTime::from_ms(500), session: None };
//! let (record, deadlines) = DcRecord::reserve(id, key, None, FencingToken::FIRST, None, &host,
//!                                             StoreTime::from_ms(90_000), &policy);
//! assert!(deadlines.hard_terminate_at < HostTime::from_ms(500 + policy.ttl_ms()));
//! // The holder releases (token and lease key); fra then links the vacant tail.
//! let released = record.release(FencingToken::FIRST, &lease, RunOutcome::Ok, StoreTime::from_ms(91_000))
//!     .next.unwrap();
//! let link = released.link(&released.key, &"fra.7".parse()?, FencingToken::FIRST, StoreTime::from_ms(92_000), &policy, None);
//! assert_eq!(link.reply, LinkReply::Linked);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

pub mod access;
pub mod actor;
pub mod chain;
pub mod connect;
pub mod dc;
pub mod dc_lease;
pub mod directory;
pub mod due;
pub mod event;
pub mod fencing;
pub mod host_lease;
pub mod host_session;
pub mod key;
pub mod label;
pub mod lease;
pub mod lease_key;
pub mod link;
pub mod mutation;
pub mod owed_cancel;
pub mod reachability;
pub mod record;
pub mod reservation;
pub mod router_walk;
pub mod session;
pub mod succession;
pub mod time;
pub mod wire;

pub use access::{Identity, Role, authorize};
pub use actor::ActorId;
pub use chain::{
    ChainError, ChainNeed, ChainPoll, ChainWalk, Jump, LocalSegment, Segment, SegmentError, Source,
    Walked,
};
pub use connect::{
    AcquireReply, Connect, ConnectError, ConnectNeed, ConnectPoll, Grant, Holder, ShortcutNotice,
    Written,
};
pub use dc::DcId;
pub use dc_lease::{DcLeaseState, DcMarks, DcRenewal, DcStanding, DcTerms};
pub use directory::{Directory, DirectoryDc, DirectoryError};
pub use due::{BadRecord, Due, DueCursor, DueKind, DuePage};
pub use event::{Event, EventKind, EventSeq};
pub use fencing::FencingToken;
pub use host_lease::{HostInstant, HostLease, HostLeasePoll};
pub use host_session::{HostSession, HostSessionPoll};
pub use key::{Key, KeyConfig, KeyName, KeyRef, Namespace, NamespaceScope, Tag};
pub use label::LabelError;
pub use lease::{Deadlines, LeasePolicy};
pub use lease_key::LeaseKey;
pub use link::{Link, Shortcut, Succession, SuccessionCause};
pub use mutation::{Mutation, Mutations};
pub use record::{
    ActivateReply, DcRecord, FailureReason, Holding, LinkReply, PreviousRun, RecordRead,
    RecordState, RecordView, ReleaseCause, ReleaseReply, RenewReply, RunOutcome, ScanCursor,
    TailState, TailView, Transition,
};
pub use reservation::{ReservationId, ReservationRef};
pub use router_walk::{Learned, RouterMemory, RouterPoll, RouterWalk, Unavailable};
pub use session::{
    Expiry, SessionCounts, SessionEnd, SessionGuard, SessionId, SessionKey, SessionNotice,
    SessionRecord, SessionRenewReply, SessionState, SessionTransition,
};
pub use succession::{TakeOverReply, TakeoverPolicy};
pub use time::{HostTime, StoreTime};
pub use wire::{
    AwaitReply, DcReport, ErrorKind, ErrorReply, FrameError, PeerProbe, Probe, Reply, Request,
};
