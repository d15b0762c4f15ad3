//! What a stepper asks of this DC's own store, and what the store answered
//! (DESIGN.md §7.1's effects, the DC store's share). The steppers of this
//! crate that read or write the DC store ask with one [`StoreOp`] and take
//! the answer as one [`Stored`] (or the [`crate::Failure`] of the
//! operation), so each driver performs them in one place: homingd against
//! a real backend, the simulator against its in-memory store with latency
//! and faults. (The acquire's connect still asks in homing-core's
//! `ConnectNeed`, and resolve reads chain segments.)

use homing_core::{
    DcRecord, DueCursor, DueKind, DuePage, Event, EventSeq, NamespaceScope, ReservationId,
    ScanCursor, StoreTime, Written,
};

/// One operation on this DC's store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreOp {
    /// Read our record; answered [`Stored::Record`].
    Read(ReservationId),
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
    /// The record read (`None`: there is none).
    Record(Option<DcRecord>),
    /// Whether the compare-and-set landed.
    Written(Written),
    /// A page of the expiry index.
    Due(DuePage),
    /// Whether the entry was settled (`false`: the record changed since).
    Settled(bool),
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

/// A stepper was answered what it did not ask: a driver bug.
pub(crate) fn unasked(stepper: &str, stored: &Stored) -> ! {
    panic!("{stepper}: an answer it did not ask for: {stored:?}")
}
