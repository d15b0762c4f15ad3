//! What a stepper notes for its node between its steps ([`NodeEvent`]):
//! what to remember, log or count. A leaf of the step vocabulary: the
//! events of every stepper are named here, so the vocabulary imports no
//! stepper.

use homing_core::{
    BadRecord, EventSeq, FencingToken, Key, LinkReply, Namespace, ReservationId, SessionId,
    Shortcut, ShortcutNotice, Succession,
};

use crate::step::failure::Failure;

/// Something a stepper noted for its node: what to remember, log or count.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NodeEvent {
    /// A walk (a drain's, or an acquire's connect) proved `member` of
    /// `key`'s chain: the node's hint for the key's next walk (kept if
    /// further than the one it has).
    Learned {
        /// The key.
        key: Key,
        /// The member proved.
        member: Shortcut,
    },
    /// An operator's drain stopped this lease's renewals.
    Drained(ReservationId),
    /// What a reconciliation did with one takeover of this DC's tails.
    Reconciled(ReconcileEvent),
    /// What an upkeep pass did.
    Upkeep(UpkeepEvent),
    /// What happened inside an acquire.
    Acquire(AcquireEvent),
    /// An acquire linked the key's chain and another DC holds the key's
    /// entry: tell it (best effort, not awaited) of the new member.
    Shortcut(ShortcutNotice),
    /// A waiter expired the lapsed holder of this reservation (the reaper
    /// had not yet).
    HolderExpired(ReservationId),
    /// A peer's link of this DC's tail `from` was answered `reply`
    /// (`superseded`: the tail had been taken over first).
    Link {
        /// The tail asked to link onward.
        from: ReservationId,
        /// The successor asked for.
        to: ReservationId,
        /// The answer.
        reply: LinkReply,
        /// Whether the tail continues as a takeover's winner instead.
        superseded: bool,
    },
    /// A host's cancel looked among the key's records for the grant made
    /// under its lease: the one it releases, or none.
    CancelFound(Option<ReservationId>),
    /// A key create the quota admitted in `namespace` ended: `kept` when
    /// this DC's entry is the key's (the set-if-absent inserted it, or found
    /// its own), else its slot is given back (another DC won the race, or
    /// the create never wrote the entry).
    QuotaSettled {
        /// The namespace.
        namespace: Namespace,
        /// Whether the slot stays taken.
        kept: bool,
    },
    /// A host closed this session here: its keys are vacant from now plus
    /// grace, sooner than their waiters parked for (they must look again).
    SessionClosed(SessionId),
    /// An operator force-released this reservation, fenced by `token`: its
    /// holder may run until its hard deadline.
    ForceReleased {
        /// The reservation.
        reservation: ReservationId,
        /// Its token.
        token: FencingToken,
    },
}

/// What happened inside an acquire, for logs and counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AcquireEvent {
    /// A connect failed (its chain or store contradicted it, or it lost too many races).
    ConnectFailed,
    /// A connect could not reach a DC; it is tried again after a pause.
    ConnectRetried,
    /// The key is held: the acquire waits at the holder's DC.
    Awaiting,
    /// The holder's DC answered `TimedOut` before the wait's end (it shut down).
    WaitCutShort,
    /// The wait ran out: one last look.
    WaitTimedOut,
    /// The holder's DC refused the wait (a full queue).
    WaitRefused,
    /// The registration was lost and there is no time to register again.
    WaitLostWithoutTimeToRegisterAgain,
    /// The registration was lost: connect and register again after a pause.
    WaitReregister,
    /// This acquire's own deadline passed while it waited.
    WaitDeadlinePassed,
    /// The DC shut down while this acquire waited: it answered at once.
    ClosedWhileWaiting,
    /// The last look's connect failed.
    LastLookFailed,
    /// A connect after waiting could not reach a DC, with no time left.
    WaitEndedByConnectErrorUnavailable,
    /// A connect after waiting failed with an answer.
    WaitEndedByConnectError,
    /// The host gave up on this acquire before its grant was made: the
    /// grant is released before the answer.
    GrantCancelled,
    /// The acquire linked the key's chain and this DC holds the key's
    /// entry: the new member is noted in the entry's record before the
    /// answer (another DC's entry is told by the driver:
    /// [`NodeEvent::Shortcut`]).
    ShortcutNoted,
    /// Noting the new member in this DC's entry failed (best effort: walks
    /// stay a few links longer until the next move).
    ShortcutNotNoted,
}

/// What a reconciliation did, for the driver's logs and counters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReconcileEvent {
    /// A takeover was applied: its record now links to the winner.
    Superseded(Succession),
    /// A takeover names a reservation this DC's store has no record of
    /// (skipped: nothing here acts for it).
    Unknown(ReservationId),
}

/// What happened in a pass, for logs and counters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UpkeepEvent {
    /// A lapsed lease was released as expired.
    Reaped(ReservationId),
    /// A proven orphan was abandoned.
    Abandoned(ReservationId),
    /// A record was proven a member of its chain (and settled, if `true`).
    Confirmed(ReservationId, bool),
    /// An index entry whose record could not be read back: skipped.
    BadRecord(BadRecord),
    /// A reap or an abandon failed (tried again next pass).
    ChangeFailed(ReservationId, Failure),
    /// Reading the index failed: the pass stopped early.
    ScanFailed(Failure),
    /// Settling a proven member failed (it is proven again next pass).
    SettleFailed(ReservationId, Failure),
    /// A due host session's keys were all reaped and its row deleted.
    SessionEnded(SessionId),
    /// Reading a due session's keys or deleting its row failed (tried
    /// again next pass).
    SessionFailed(SessionId, Failure),
    /// Events before this one were trimmed.
    Trimmed(EventSeq),
    /// Reading or trimming the event log failed.
    TrimFailed(Failure),
    /// The pass ended: leases counted, and the log's last event if read.
    PassDone {
        /// Leases not due for the reaper when it read the index (`None`:
        /// it did not finish reading).
        active: Option<u64>,
        /// The event log's last sequence number.
        event_head: Option<EventSeq>,
    },
}
