//! How a request failed at homingd — a reply, a store error, a peer's —
//! and homing-node's classification of it.

use homing_core::{DcId, ErrorKind, ErrorReply};
use homing_store::StoreError;

use crate::peers::PeerError;

/// How a request failed, before it becomes an error reply.
#[derive(Debug)]
pub(super) enum RequestError {
    Reply(ErrorReply),
    Store(StoreError),
    Peer(PeerError),
}

impl From<StoreError> for RequestError {
    fn from(e: StoreError) -> RequestError {
        RequestError::Store(e)
    }
}

impl From<PeerError> for RequestError {
    fn from(e: PeerError) -> RequestError {
        RequestError::Peer(e)
    }
}

impl From<homing_node::Failure> for RequestError {
    fn from(f: homing_node::Failure) -> RequestError {
        RequestError::Reply(f.into_reply())
    }
}

impl RequestError {
    /// homing-node's split of this failure at DC `dc`: a DC or store that
    /// could not be reached (worth retrying), an answer (a refusal, a full
    /// queue, a contradiction), or a peer's lie. A peer relaying an error
    /// is an answer.
    pub(super) fn classify(self, dc: &DcId) -> homing_node::Failure {
        let unreachable = match &self {
            RequestError::Store(e) => {
                return homing_node::Failure::of_store(dc, e.is_unavailable(), e);
            }
            RequestError::Peer(PeerError::Lied { .. }) => {
                return homing_node::Failure::Lied(self.into_reply(dc));
            }
            RequestError::Peer(e) => matches!(e, PeerError::Unavailable { .. }),
            RequestError::Reply(e) => matches!(e.kind, ErrorKind::Unavailable { .. }),
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
            RequestError::Reply(reply) => reply,
            RequestError::Store(e) => {
                homing_node::Failure::of_store(dc, e.is_unavailable(), e).into_reply()
            }
            RequestError::Peer(e) => e.to_reply(),
        }
    }
}
