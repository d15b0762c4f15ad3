//! How a step of a request failed, as its driver saw it: the split every
//! retry decision rests on. A DC or store that could not be reached is worth
//! trying again within a wait; an answer (a refusal, a full queue, an owner
//! disowning a reservation) and a lie (an answer to another question) are
//! passed on to the caller as they are.

use std::fmt::Display;

use homing_core::{DcId, ErrorKind, ErrorReply};

/// A failed step of a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Failure {
    /// A DC or a store did not answer (a timeout, a lost connection, a
    /// store that cannot be reached); the reply says which DC.
    Unreachable(ErrorReply),
    /// Something answered, and the answer is an error: a refusal, or an
    /// owner saying it has no usable record of a reservation
    /// ([`Failure::disowns`]).
    Refused(ErrorReply),
    /// A DC answered something that is not an answer to what it was asked
    /// (a peer that lies): a contradiction, passed on as `Inconsistent`,
    /// never retried and never taken as the owner's word.
    Lied(ErrorReply),
}

impl Failure {
    /// A failure described by an error reply: unreachable if its kind is
    /// `Unavailable`, refused otherwise.
    pub fn from_reply(reply: ErrorReply) -> Failure {
        match reply.kind {
            ErrorKind::Unavailable { .. } => Failure::Unreachable(reply),
            _ => Failure::Refused(reply),
        }
    }

    /// DC `dc`'s store failed with `error`, as every driver reports it: a
    /// store that cannot be reached (`unreachable`) makes the DC
    /// unavailable, worth trying again; any other store error is internal.
    pub fn of_store(dc: &DcId, unreachable: bool, error: impl Display) -> Failure {
        let message = format!("store: {error}");
        if unreachable {
            let kind = ErrorKind::Unavailable { dc: dc.clone() };
            Failure::Unreachable(ErrorReply::new(kind, message))
        } else {
            Failure::Refused(ErrorReply::new(ErrorKind::Internal, message))
        }
    }

    /// Whether trying again may help.
    pub fn is_unreachable(&self) -> bool {
        matches!(self, Failure::Unreachable(_))
    }

    /// Whether this answer to "what do you know of this reservation?"
    /// says its owner has no usable record of it (unknown, abandoned,
    /// broken): a walk trying a shortcut falls back on it, any other walk
    /// fails. Only an answer says so: never silence, never a lie.
    pub fn disowns(&self) -> bool {
        matches!(self, Failure::Refused(reply) if reply.kind.disowns())
    }

    /// The error reply for the caller.
    pub fn into_reply(self) -> ErrorReply {
        match self {
            Failure::Unreachable(reply) | Failure::Refused(reply) | Failure::Lied(reply) => reply,
        }
    }
}
