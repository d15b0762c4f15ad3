//! How a step of a request failed, as its driver saw it: the one split every
//! retry decision rests on. A DC or store that could not be reached is worth
//! trying again within a wait; an answer (a refusal, a full queue, a
//! contradiction) is passed on to the caller as it is.

use homing_core::{ErrorKind, ErrorReply};

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
