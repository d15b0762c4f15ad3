//! The lease key (DESIGN.md §7.3): 128 random bits a host picks for one
//! logical acquire and presents with every retry of it, every renewal and
//! its release. The DC stores it on the record it grants, so
//!
//! - a retried acquire whose reply was lost is recognised as the same
//!   holder and answered like a renewal (the same reservation and token),
//!   never as `HeldElsewhere` naming the caller itself;
//! - the fencing token, which `HeldElsewhere` tells anyone, no longer
//!   suffices to renew or release someone else's lease;
//! - a host that gave up on an acquire can cancel a grant it never saw.
//!
//! It is a capability: it is never logged (`Debug` hides it), never part of
//! a reply, an event or an inspect answer, and compared in constant time.
//! homing-core draws no entropy: the host makes the bits
//! ([`LeaseKey::from_bytes`]).

use serde::{Deserialize, Serialize};

/// A host's secret for one logical acquire. Never all zeros.
#[derive(Clone, Copy, Eq, Serialize, Deserialize)]
#[serde(try_from = "[u8; 16]", into = "[u8; 16]")]
pub struct LeaseKey([u8; 16]);

/// Bytes that cannot be a lease key (all zeros: what an uninitialised
/// buffer or a forgotten field would hold).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("a lease key cannot be all zeros")]
pub struct ZeroLeaseKey;

impl LeaseKey {
    /// The key made of `bytes` (from a cryptographic random source), or
    /// `None` if they are all zeros.
    pub fn from_bytes(bytes: [u8; 16]) -> Option<LeaseKey> {
        LeaseKey::try_from(bytes).ok()
    }

    /// Whether `presented` is this key, in time independent of where they differ.
    pub fn admits(&self, presented: &LeaseKey) -> bool {
        let differ = self
            .0
            .iter()
            .zip(presented.0.iter())
            .fold(0u8, |acc, (a, b)| acc | (a ^ b));
        differ == 0
    }
}

impl PartialEq for LeaseKey {
    fn eq(&self, other: &LeaseKey) -> bool {
        self.admits(other)
    }
}

impl std::hash::Hash for LeaseKey {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.0.hash(state);
    }
}

impl TryFrom<[u8; 16]> for LeaseKey {
    type Error = ZeroLeaseKey;
    fn try_from(bytes: [u8; 16]) -> Result<LeaseKey, ZeroLeaseKey> {
        if bytes == [0; 16] {
            Err(ZeroLeaseKey)
        } else {
            Ok(LeaseKey(bytes))
        }
    }
}

impl From<LeaseKey> for [u8; 16] {
    fn from(key: LeaseKey) -> [u8; 16] {
        key.0
    }
}

impl std::fmt::Debug for LeaseKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("LeaseKey(…)")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn all_zeros_is_refused_in_code_and_on_the_wire() {
        assert_eq!(LeaseKey::from_bytes([0; 16]), None);
        let bytes = postcard::to_allocvec(&[0u8; 16]).unwrap();
        assert!(postcard::from_bytes::<LeaseKey>(&bytes).is_err());
        let key = LeaseKey::from_bytes([7; 16]).unwrap();
        let bytes = postcard::to_allocvec(&key).unwrap();
        assert_eq!(postcard::from_bytes::<LeaseKey>(&bytes).unwrap(), key);
    }

    #[test]
    fn admits_only_itself_and_never_prints() {
        let mut bytes = [9u8; 16];
        let key = LeaseKey::from_bytes(bytes).unwrap();
        bytes[15] = 8;
        let other = LeaseKey::from_bytes(bytes).unwrap();
        assert!(key.admits(&key));
        assert!(!key.admits(&other));
        assert!(!format!("{key:?}").contains('9'));
    }
}
