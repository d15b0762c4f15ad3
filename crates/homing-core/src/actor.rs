//! `ActorId`: what a host says about the actor it runs under a lease — an
//! opaque, bounded string (typically an address the actor answers on).

use crate::label::{LabelRule, label_type};

/// Longest actor id, in bytes.
pub const ACTOR_ID_BYTES_MAX: usize = 256;

const ACTOR_ID_RULE: LabelRule = LabelRule {
    what: "actor id",
    bytes_min: 1,
    bytes_max: ACTOR_ID_BYTES_MAX,
    alphabet: None,
    segmented: false,
};

label_type!(
    /// The actor a host runs for a reservation: 1–256 bytes, no control characters.
    ActorId,
    ACTOR_ID_RULE
);
