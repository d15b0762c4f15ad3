//! What a stepper asks of this DC's own store and of the global store, and
//! what they answered (DESIGN.md §7.1's effects, the two stores' share).
//! The steppers of this crate that read or write the DC store ask with one
//! [`StoreOp`] and take the answer as one [`Stored`]; those that use the
//! global store ask with one [`GlobalOp`] and take one [`GlobalAnswer`]
//! (or, for either, the [`crate::Failure`] of the operation). So each
//! driver performs them in one place: homingd against real backends, the
//! simulator against its in-memory stores with latency and faults. (Not
//! store operations: a reservation's segment — an acquire's or a drain's
//! walk, upkeep's proof by a predecessor, a resolve's own — and a link to
//! a peer are `Effect::Segment` / `Effect::Link`.)

use homing_core::{
    DcLeaseState, DcRecord, DueCursor, DueKind, DuePage, Event, EventSeq, Key, NamespaceScope,
    RecordRead, ReservationId, ScanCursor, SessionGuard, SessionId, SessionRecord, Shortcut,
    Source, StoreTime, Succession, TakeOverReply, TakeoverPolicy, Written,
};

/// One operation on this DC's store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreOp {
    /// Read our record, with its session's row when it is held under one;
    /// answered [`Stored::Record`].
    Read(ReservationId),
    /// A new unique from this DC's allocator (the number of a reservation
    /// to create); answered [`Stored::Allocated`].
    Allocate,
    /// Compare-and-set of our record over stored version `expected`;
    /// answered [`Stored::Written`]. A landed write also reaches the DC's
    /// waiters ([`crate::Waiters::written`]).
    Write {
        /// The version read (`None`: a create).
        expected: Option<u64>,
        /// The record to write (boxed: a record is several times larger
        /// than the other operations).
        record: Box<DcRecord>,
        /// Whether the write appends a lifecycle event (watchers learn of it).
        event: bool,
        /// The session row the write depends on (a record joining or
        /// freezing in a session), checked and written in the same
        /// transaction; a moved row answers [`Written::Conflict`].
        guard: Option<Box<SessionGuard>>,
    },
    /// Compare-and-set of each of several of our records over its stored
    /// version, each on its own (any may land or conflict, or fail,
    /// without the others), unguarded; answered [`Stored::WrittenEach`],
    /// in order. A driver sends them at once, so the store's group commit
    /// takes them in as few transactions as its limits allow (upkeep's
    /// reaps of a page of due leases). Each landed write also reaches the
    /// DC's waiters, as a [`StoreOp::Write`] does.
    WriteEach(Vec<RecordWrite>),
    /// Read host session `id`'s row; answered [`Stored::Session`].
    Session(SessionId),
    /// Compare-and-set of a host session's row over stored version
    /// `expected` (`None`: a new session); answered [`Stored::Written`].
    WriteSession {
        /// The version read (`None`: a create).
        expected: Option<u64>,
        /// The row to write.
        row: Box<SessionRecord>,
    },
    /// The frozen keys of session `id` whose notices are numbered above
    /// `after`, in notice order, at most `limit`; answered [`Stored::Page`].
    SessionNotices {
        /// The session.
        id: SessionId,
        /// The host's acknowledgement.
        after: u64,
        /// The page size.
        limit: usize,
    },
    /// The keys held under session `id` after `after`, at most `limit`;
    /// answered [`Stored::Page`].
    SessionKeys {
        /// The session.
        id: SessionId,
        /// Start after this reservation (`None`: from the first).
        after: Option<ReservationId>,
        /// The page size.
        limit: usize,
    },
    /// A page of the expiry index: records of `kind` due by `until`;
    /// answered [`Stored::Due`].
    Due {
        /// Which section of the index.
        kind: DueKind,
        /// Entries at or before this store time.
        until: StoreTime,
        /// Start after this entry (`None`: from the first).
        after: Option<DueCursor>,
        /// At most this many entries.
        limit: usize,
    },
    /// Drop a proven member's `Released` entry from the expiry index if the
    /// record still has `version`; answered [`Stored::Settled`].
    Settle {
        /// The member.
        id: ReservationId,
        /// Its version when proven.
        version: u64,
    },
    /// The event log after `after`, at most `limit` events (0: its bounds
    /// only); answered [`Stored::Events`].
    Events {
        /// The cursor.
        after: EventSeq,
        /// The page size.
        limit: usize,
    },
    /// Host session rows due by `until` (a live one at its expiry, an
    /// ended one at its end), oldest first, strictly after `after` (due
    /// time, session), at most `limit`; answered [`Stored::Sessions`].
    DueSessions {
        /// The latest due time read.
        until: StoreTime,
        /// Where the page starts (`None`: at the oldest).
        after: Option<(StoreTime, SessionId)>,
        /// The page size.
        limit: usize,
    },
    /// Delete host session `id`'s row if it is still at `version` (every
    /// key of it reaped); answered [`Stored::Deleted`].
    DeleteSession {
        /// The session.
        id: SessionId,
        /// Its version when its keys were found reaped.
        version: u64,
    },
    /// Trim the event log below `before`; answered [`Stored::Trimmed`].
    TrimEvents {
        /// The first event kept.
        before: EventSeq,
    },
    /// A page of records in `(key, id)` order: in `scope`, names starting
    /// with `name`, after `after`, at most `limit`; answered [`Stored::Page`].
    Scan {
        /// The namespaces.
        scope: NamespaceScope,
        /// The name prefix (empty: every name).
        name: String,
        /// Where the page starts (`None`: at the first record).
        after: Option<ScanCursor>,
        /// The page size.
        limit: usize,
    },
}

/// One write of a [`StoreOp::WriteEach`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordWrite {
    /// The version read.
    pub expected: u64,
    /// The record to write.
    pub record: DcRecord,
    /// Whether the write appends a lifecycle event.
    pub event: bool,
}

impl StoreOp {
    /// A page of every record in `scope`.
    pub fn scan_scope(scope: NamespaceScope, after: Option<ScanCursor>, limit: usize) -> StoreOp {
        let name = String::new();
        StoreOp::Scan {
            scope,
            name,
            after,
            limit,
        }
    }
}

/// What the DC store answered a [`StoreOp`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Stored {
    /// The record read, with its session's row (`None`: there is none).
    Record(Option<RecordRead>),
    /// A host session's row (`None`: there is none).
    Session(Option<SessionRecord>),
    /// A unique never handed out before.
    Allocated(u64),
    /// Whether the compare-and-set landed.
    Written(Written),
    /// For each write of a [`StoreOp::WriteEach`], in order: whether it
    /// landed, or why it failed.
    WrittenEach(Vec<Result<Written, crate::Failure>>),
    /// A page of the expiry index.
    Due(DuePage),
    /// Whether the entry was settled (`false`: the record changed since).
    Settled(bool),
    /// Host session rows, as [`StoreOp::DueSessions`] asked.
    Sessions(Vec<SessionRecord>),
    /// Whether the session row was deleted (`false`: it changed since).
    Deleted(bool),
    /// A page of the event log.
    Events {
        /// The events after the cursor, in order.
        events: Vec<Event>,
        /// The oldest event kept.
        oldest: EventSeq,
        /// The last event appended.
        head: EventSeq,
    },
    /// The log was trimmed.
    Trimmed,
    /// A page of records.
    Page(Vec<DcRecord>),
}

/// How current a global read must be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GlobalRead {
    /// Linearizable: an "absent" answer is the truth (resolves, upkeep's proofs).
    Latest,
    /// The nearest replica's view: "absent" may lag a write acknowledged
    /// moments ago (etcd: a serializable read).
    Nearest,
    /// As a resolve reads (DESIGN.md §7.4): linearizable, but a driver may
    /// share one store read among concurrent resolves of the key and
    /// reuse an "absent" for a short while (homingd's `absent_ttl_ms`).
    Resolve,
}

/// One operation on the global store. Everything it holds is write-once
/// (entries, successions), so a driver may answer a read from a cache of
/// what it read or wrote before.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GlobalOp {
    /// Read `key`'s entry as `read` says; answered [`GlobalAnswer::Entry`].
    Entry {
        /// The key.
        key: Key,
        /// How current the read must be.
        read: GlobalRead,
    },
    /// Make `id` `key`'s entry unless it has one; answered
    /// [`GlobalAnswer::SetIfAbsent`].
    SetIfAbsent {
        /// The key.
        key: Key,
        /// The reservation to make its entry.
        id: ReservationId,
    },
    /// Read `id`'s succession (DESIGN.md §7.5), and the furthest member of
    /// `key`'s chain this node remembers (the walk goes on from whichever
    /// is further); answered [`GlobalAnswer::Successor`].
    Successor {
        /// The reservation whose DC did not answer.
        id: ReservationId,
        /// Its key.
        key: Key,
    },
    /// Make this succession its reservation's unless one is; answered
    /// [`GlobalAnswer::Confirmed`] with the one the store has.
    Confirm(Succession),
    /// Read a DC's lease state; answered [`GlobalAnswer::DcLease`].
    DcLease(homing_core::DcId),
    /// A page of DC `dc`'s successions in reservation order, after `after`,
    /// at most `limit`; answered [`GlobalAnswer::Successions`] (fewer than
    /// `limit`: the last page).
    SuccessionsOf {
        /// The DC whose reservations were succeeded.
        dc: homing_core::DcId,
        /// Start after this reservation (`None`: from the first).
        after: Option<ReservationId>,
        /// The page size.
        limit: usize,
    },
    /// Take over a silent DC's tail under `policy`; answered
    /// [`GlobalAnswer::TakenOver`].
    TakeOver {
        /// The succession to record.
        succession: Succession,
        /// Whether the DC's lease must have expired.
        policy: TakeoverPolicy,
    },
}

/// What the global store answered a [`GlobalOp`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GlobalAnswer {
    /// The key's entry (`None`: never reserved, as of the read).
    Entry(Option<ReservationId>),
    /// `None`: the entry was set; `Some(winner)`: the key had one.
    SetIfAbsent(Option<ReservationId>),
    /// The succession (`None`: none), where it came from, and the node's hint.
    Successor {
        /// The succession read.
        succession: Option<Succession>,
        /// The store, or the node's cache of it.
        source: Source,
        /// The furthest member of the key's chain the node remembers.
        hint: Option<Shortcut>,
    },
    /// The succession the store has for the reservation.
    Confirmed(Succession),
    /// The DC's lease state.
    DcLease(DcLeaseState),
    /// The takeover's outcome.
    TakenOver(TakeOverReply),
    /// A page of a DC's successions.
    Successions(Vec<Succession>),
}

/// A stepper was answered what it did not ask: a driver bug.
pub(crate) fn unasked(stepper: &str, answer: &impl std::fmt::Debug) -> ! {
    panic!("{stepper}: an answer it did not ask for: {answer:?}")
}
