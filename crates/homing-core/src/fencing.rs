//! `FencingToken`: strictly increases each time a key gets a new holder
//! (a new reservation or a re-activation) and stays constant on renew, so a
//! resource can refuse writes from a holder whose lease ran out.

use serde::{Deserialize, Serialize};

/// A key's fencing token. The first holder of a key gets [`FencingToken::FIRST`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct FencingToken(u64);

impl FencingToken {
    /// The token of a key's first reservation.
    pub const FIRST: FencingToken = FencingToken(1);

    /// A token from its number (as stored or as sent by a peer).
    pub const fn new(value: u64) -> FencingToken {
        FencingToken(value)
    }

    /// The number, for the actor's own fenced writes.
    pub const fn get(self) -> u64 {
        self.0
    }

    /// The token of the next holder.
    ///
    /// # Panics
    /// At `u64::MAX`: 2^64 holders of one key cannot happen, and wrapping
    /// would break fencing, so a crash beats continuing.
    pub fn next(self) -> FencingToken {
        FencingToken(self.0.checked_add(1).expect("fencing token overflow"))
    }
}

impl std::fmt::Display for FencingToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)
    }
}
