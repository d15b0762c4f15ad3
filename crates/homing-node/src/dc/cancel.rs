//! Cancel (DESIGN.md §7.3): a host that gave up on an acquire — no reply
//! in time — tells its DC `Cancel { key, lease }`, so the grant it never
//! saw does not stay a phantom holder until ttl + grace.
//!
//! A grant is always made at the host's own DC (a re-activated local tail,
//! or a new local reservation) and keeps the lease key while it is active,
//! so the DC looks among its own records of the key — no walk, no peer —
//! for the active one with that lease key (`serve::cancel_target`) and releases it
//! ([`crate::Change::Cancel`]). The acquire may still be
//! running when the cancel arrives (parked, or waiting for a peer): the DC
//! remembers the lease key ([`Cancellations`]), and an acquire that is
//! granted afterwards cancels its own grant before it answers. Both orders
//! are covered: the acquire's write lands before the cancel's walk reads the
//! tail (the cancel finds it), or after the cancel was noted (the acquire
//! sees the note) — one DC node serves both, in one memory.

use std::collections::{HashSet, VecDeque};

use homing_core::LeaseKey;
use homing_core::wire::WAIT_MS_MAX;

use crate::step::time::NodeTime;

/// How long a cancelled lease key is remembered, ms: longer than any
/// acquire runs (its longest wait plus a minute for its walks and writes).
pub const CANCEL_MEMORY_MS: u64 = WAIT_MS_MAX as u64 + 60_000;
/// Most cancelled lease keys remembered at once; past it the oldest is
/// forgotten (its grant, if one still lands, ends by expiry as before).
pub const CANCELLATIONS_MAX: usize = 65_536;

/// The lease keys of acquires their hosts cancelled recently, bounded in
/// count and time.
#[derive(Debug, Default)]
pub struct Cancellations {
    order: VecDeque<(NodeTime, LeaseKey)>,
    keys: HashSet<LeaseKey>,
}

impl Cancellations {
    /// Performs [`crate::Effect::Cancellation`] at `now`: notes the cancel
    /// of the acquire made under `lease` (`note`), or says whether it was
    /// noted; whether it is.
    pub fn answer(&mut self, lease: LeaseKey, note: bool, now: NodeTime) -> bool {
        if note {
            self.note(lease, now);
            return true;
        }
        self.cancelled(&lease, now)
    }

    /// Remembers that the acquire with `lease` was cancelled at `now`.
    pub fn note(&mut self, lease: LeaseKey, now: NodeTime) {
        self.forget_before(now);
        if self.keys.insert(lease) {
            self.order.push_back((now, lease));
        }
        while self.order.len() > CANCELLATIONS_MAX {
            if let Some((_, oldest)) = self.order.pop_front() {
                self.keys.remove(&oldest);
            }
        }
    }

    /// Whether the acquire with `lease` was cancelled (within the memory).
    pub fn cancelled(&mut self, lease: &LeaseKey, now: NodeTime) -> bool {
        self.forget_before(now);
        self.keys.contains(lease)
    }

    /// How many are remembered.
    pub fn len(&self) -> usize {
        self.order.len()
    }

    /// Whether none is remembered.
    pub fn is_empty(&self) -> bool {
        self.order.is_empty()
    }

    fn forget_before(&mut self, now: NodeTime) {
        while let Some((at, lease)) = self.order.front() {
            if now.us_since(*at) / 1000 < CANCEL_MEMORY_MS {
                break;
            }
            self.keys.remove(lease);
            self.order.pop_front();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lease(n: u32) -> LeaseKey {
        let mut bytes = [0xC3; 16];
        bytes[..4].copy_from_slice(&n.to_le_bytes());
        LeaseKey::from_bytes(bytes).unwrap()
    }

    #[test]
    fn cancellations_are_remembered_longer_than_an_acquire_runs_and_bounded() {
        let mut c = Cancellations::default();
        let t0 = NodeTime::from_us(0);
        c.note(lease(1), t0);
        let just_before = t0.plus_ms(CANCEL_MEMORY_MS - 1);
        assert!(c.cancelled(&lease(1), just_before));
        assert!(!c.cancelled(&lease(2), just_before));
        assert!(!c.cancelled(&lease(1), t0.plus_ms(CANCEL_MEMORY_MS)));
        assert!(c.is_empty());
        for n in 0..=CANCELLATIONS_MAX as u32 {
            c.note(lease(n), t0);
        }
        assert_eq!(c.len(), CANCELLATIONS_MAX);
        assert!(!c.cancelled(&lease(0), t0), "the oldest is forgotten");
        assert!(c.cancelled(&lease(CANCELLATIONS_MAX as u32), t0));
    }
}
