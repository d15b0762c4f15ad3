//! A waiter's business with its DC's registry of parked acquirers, as the
//! step vocabulary says it: what a waiter asks ([`QueueOp`], inside
//! [`crate::Effect::Queue`]) and what the registry answers ([`Queued`]).
//! The registry itself is the DC's (`Waiters`, kept by its endpoint).

use homing_core::{AwaitReply, RecordRead, ReservationId};
use thiserror::Error;

use crate::step::time::NodeTime;

/// Why a waiter could not be registered (answered `Overloaded`).
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum Full {
    /// The reservation's queue is full.
    #[error("{waiting} acquirers already wait for {reservation} (waiters_per_key_max)")]
    Reservation {
        /// The reservation.
        reservation: ReservationId,
        /// How many wait.
        waiting: usize,
    },
    /// The DC's waiters are at their bound.
    #[error("{0} acquirers already wait in this dc (waiters_max)")]
    Dc(usize),
}

/// One registration, unique within a node's [`Waiters`](crate::Waiters).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Ticket(pub(crate) u64);

impl Ticket {
    /// The ticket's number (registration order within the node).
    pub fn get(self) -> u64 {
        self.0
    }
}

/// What a waiter ([`crate::AwaitVacant`]) asks of its DC's registry, as
/// [`crate::Effect::Queue`]; the DC's registry (`Waiters::queue`) answers it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum QueueOp {
    /// Join `reservation`'s queue, behind those already there — unless
    /// nobody waits there and `settled` (the waiter's answer from the
    /// record it read, if it need not wait) answers it at once.
    Join {
        /// The reservation awaited.
        reservation: ReservationId,
        /// The answer the record read allows without waiting, if any.
        settled: Option<AwaitReply>,
    },
    /// The waiter read `record` (of this DC): wake the waiters its state
    /// lets go (maybe this one), then tell the queue's hand-off.
    Notify(Box<RecordRead>),
    /// Tell the queue's hand-off now.
    Handoff(ReservationId),
}

impl QueueOp {
    /// The reservation whose queue this concerns.
    pub fn reservation(&self) -> &ReservationId {
        match self {
            QueueOp::Join { reservation, .. } | QueueOp::Handoff(reservation) => reservation,
            QueueOp::Notify(read) => &read.record.id,
        }
    }
}

/// A queue's hand-off as a waiter sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Handoff {
    /// How often it moved (`Waiters::handoff_version`); `None` when
    /// nobody is queued.
    pub version: Option<u64>,
    /// Until when a woken waiter has the reservation to itself, if one does.
    pub until: Option<NodeTime>,
}

/// The registry's answer to a [`QueueOp`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Queued {
    /// Nobody waited and the record answers the waiter: it did not queue.
    Settled(AwaitReply),
    /// Queued: its registration, and the hand-off then.
    Joined(Ticket, Handoff),
    /// The queue or the DC is full: it did not queue.
    Full(Full),
    /// The hand-off now (after a `Notify`, what it woke).
    Handoff(Handoff),
}
