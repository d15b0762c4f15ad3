//! How one reservation continues as another: a [`Link`] (`from → to`, what
//! the linking DC's record says), a [`Succession`] (the same step as the
//! global store decides it, write-once: DESIGN.md §7.5) and a [`Shortcut`]
//! (a later member of a key's chain, a hint a walker may jump to).
//!
//! `chain`, `record` and `succession` all speak of these, and `chain` and
//! `succession` read records: so the types live here, importing none of
//! them, and those modules import one another in one direction only. The
//! rules stay with them: the walk in `chain`, a record's transitions in
//! `record`, who may succeed a reservation and with which token in
//! `succession`.

use serde::{Deserialize, Serialize};

use crate::fencing::FencingToken;
use crate::reservation::ReservationId;

/// A link `from → to`, immutable once written.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Link {
    /// The released reservation.
    pub from: ReservationId,
    /// The reservation it continues as.
    pub to: ReservationId,
    /// `from`'s token when it was linked (its last holder's); `to`'s is higher.
    pub token: FencingToken,
}

/// A later member of a key's chain and its token when it joined: a hint a
/// walker may jump to (checked when it gets there).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Shortcut {
    /// The member.
    pub to: ReservationId,
    /// Its token when it joined the chain; its record's token is at least this.
    pub token: FencingToken,
}

impl Shortcut {
    /// Whether this member is further along the chain than `known` (tokens
    /// only rise along a chain): what a record, a DC or a resolver keeps.
    pub fn is_past(&self, known: Option<&Shortcut>) -> bool {
        known.is_none_or(|known| self.token > known.token)
    }

    /// The further along of two members of one chain, if any.
    pub fn furthest(a: Option<Shortcut>, b: Option<Shortcut>) -> Option<Shortcut> {
        match (a, b) {
            (Some(a), Some(b)) if b.is_past(Some(&a)) => Some(b),
            (a, b) => a.or(b),
        }
    }
}

/// Who continues `link.from`: written once, never changed. Built by
/// [`Succession::moved`] and [`Succession::taken_over`].
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Succession {
    /// `from` continued as `to`; `token` is at least `from`'s last token and
    /// below `to`'s first.
    pub link: Link,
    /// How it was decided.
    pub cause: SuccessionCause,
}

/// How a succession was decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum SuccessionCause {
    /// `from`'s DC linked it (a move): the mover confirmed the link.
    Moved,
    /// `from`'s DC was expired, and another DC took the key over.
    TakenOver,
}
