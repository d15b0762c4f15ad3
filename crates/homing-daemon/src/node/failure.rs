//! How a request failed at homingd — a reply, a store error, a peer's —
//! and homing-node's classification of it.

use homing_core::{DcId, ErrorKind, ErrorReply};
use homing_store::StoreError;

use crate::peers::PeerError;

/// How a request failed, before it becomes an error reply.
#[derive(Debug)]
pub(super) enum Failure {
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

impl From<homing_node::Failure> for Failure {
    fn from(f: homing_node::Failure) -> Failure {
        Failure::Reply(f.into_reply())
    }
}

impl Failure {
    /// homing-node's split of this failure at DC `dc`: a DC or store that
    /// could not be reached (worth retrying), an answer (a refusal, a full
    /// queue, a contradiction), or a peer's lie. A peer relaying an error
    /// is an answer.
    pub(super) fn classify(self, dc: &DcId) -> homing_node::Failure {
        let unreachable = match &self {
            Failure::Store(e) => return homing_node::Failure::of_store(dc, e.is_unavailable(), e),
            Failure::Peer(PeerError::Lied { .. }) => {
                return homing_node::Failure::Lied(self.into_reply(dc));
            }
            Failure::Peer(e) => matches!(e, PeerError::Unavailable { .. }),
            Failure::Reply(e) => matches!(e.kind, ErrorKind::Unavailable { .. }),
        };
        let reply = self.into_reply(dc);
        if unreachable {
            homing_node::Failure::Unreachable(reply)
        } else {
            homing_node::Failure::Refused(reply)
        }
    }

    /// The reply for this failure at DC `dc`. A store that cannot be reached
    /// makes the DC unavailable (retryable); other store errors are internal.
    pub(super) fn into_reply(self, dc: &DcId) -> ErrorReply {
        match self {
            Failure::Reply(reply) => reply,
            Failure::Store(e) => {
                homing_node::Failure::of_store(dc, e.is_unavailable(), e).into_reply()
            }
            Failure::Peer(e) => e.to_reply(),
        }
    }
}
