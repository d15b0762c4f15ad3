//! How a step of a request failed, as its driver saw it: the one split every
//! retry decision rests on. A DC or store that could not be reached is worth
//! trying again within a wait; an answer (a refusal, a full queue, a
//! contradiction) is passed on to the caller as it is.

use std::fmt::Display;

use homing_core::{DcId, ErrorKind, ErrorReply};

/// A failed step of a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Failure {
    /// A DC or a store did not answer (a timeout, a lost connection, a
    /// store that cannot be reached); the reply says which DC.
    Unreachable(ErrorReply),
    /// Something answered, and the answer is an error.
    Refused(ErrorReply),
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

    /// The error reply for the caller.
    pub fn into_reply(self) -> ErrorReply {
        match self {
            Failure::Unreachable(reply) | Failure::Refused(reply) => reply,
        }
    }
}
