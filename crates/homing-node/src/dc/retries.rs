//! Retried acquires (DESIGN.md §7.3): a host that hears nothing in time
//! sends the same acquire again, with the same lease key. If the first is
//! still running at this DC, the retry joins it and is answered with its
//! outcome, instead of starting a second connect that races the first for
//! the key (and whose loss would be answered `HeldElsewhere` naming the
//! host itself, or cost the first one more round trips).
//!
//! A retry that arrives after the first finished runs as any acquire: the
//! record it granted recognises the lease key and answers with the same
//! grant (`DcRecord::activate`). The first's grant counts from the first
//! request's host time, earlier than the retry's: conservative for the host.
//!
//! Driver: [`AcquiresInFlight::arrive`] for every acquire; `Run` → run it,
//! then [`AcquiresInFlight::finish`] and answer every joined request with
//! the same reply. A driver whose runner can vanish (a dropped task) calls
//! `finish` on the way out and lets the joined requests arrive again.

use std::collections::HashMap;

use homing_core::{Key, LeaseKey};

/// Most requests that may join one acquire: HostAgent sends an acquire at
/// most `ACQUIRE_ATTEMPTS_DEFAULT` (3) times; past this, a retry is refused.
pub const JOINS_MAX: usize = 8;

/// What a driver does with an acquire that arrived.
#[derive(Debug, PartialEq, Eq)]
pub enum Arrival {
    /// None with its key and lease key runs here: run it.
    Run,
    /// One runs already: its outcome answers this request too.
    Joined,
    /// [`JOINS_MAX`] requests wait on it already: refuse this one.
    Full,
}

/// The acquires running at a DC, by key and lease key, with the requests
/// (`W`: how the driver answers one) waiting on each.
#[derive(Debug)]
pub struct AcquiresInFlight<W> {
    running: HashMap<(Key, LeaseKey), Vec<W>>,
}

impl<W> Default for AcquiresInFlight<W> {
    fn default() -> Self {
        AcquiresInFlight {
            running: HashMap::new(),
        }
    }
}

impl<W> AcquiresInFlight<W> {
    /// An acquire of `key` under `lease` arrived, answered through
    /// `waiter` if it joins one already running (dropped otherwise).
    pub fn arrive(&mut self, key: &Key, lease: LeaseKey, waiter: W) -> Arrival {
        match self.running.get_mut(&(key.clone(), lease)) {
            None => {
                self.running.insert((key.clone(), lease), Vec::new());
                Arrival::Run
            }
            Some(joined) if joined.len() >= JOINS_MAX => Arrival::Full,
            Some(joined) => {
                joined.push(waiter);
                Arrival::Joined
            }
        }
    }

    /// A lease key some acquire of `key` runs under, if any runs (for a
    /// mutant that joins acquires of other holders).
    pub(crate) fn any_lease(&self, key: &Key) -> Option<LeaseKey> {
        let mut running = self.running.keys();
        running.find(|(k, _)| k == key).map(|(_, lease)| *lease)
    }

    /// The acquire of `key` under `lease` ended: the requests that joined
    /// it, in arrival order, to answer with its reply.
    pub fn finish(&mut self, key: &Key, lease: LeaseKey) -> Vec<W> {
        self.running
            .remove(&(key.clone(), lease))
            .unwrap_or_default()
    }

    /// How many acquires run.
    pub fn len(&self) -> usize {
        self.running.len()
    }

    /// Whether none runs.
    pub fn is_empty(&self) -> bool {
        self.running.is_empty()
    }

    /// Forgets every running acquire (the node crashed or stopped): the
    /// requests that joined them are dropped unanswered.
    pub fn clear(&mut self) {
        self.running.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lease(n: u8) -> LeaseKey {
        LeaseKey::from_bytes([n; 16]).unwrap()
    }

    fn key(name: &str) -> Key {
        Key::new(homing_core::KeyName::new(name).unwrap())
    }

    #[test]
    fn a_retry_joins_the_acquire_with_its_key_and_lease_key_and_no_other() {
        let mut in_flight = AcquiresInFlight::default();
        assert_eq!(in_flight.arrive(&key("k"), lease(1), "first"), Arrival::Run);
        assert_eq!(
            in_flight.arrive(&key("k"), lease(1), "retry 1"),
            Arrival::Joined
        );
        assert_eq!(
            in_flight.arrive(&key("k"), lease(2), "other host"),
            Arrival::Run
        );
        assert_eq!(
            in_flight.arrive(&key("j"), lease(1), "other key"),
            Arrival::Run
        );
        assert_eq!(
            in_flight.arrive(&key("k"), lease(1), "retry 2"),
            Arrival::Joined
        );
        assert_eq!(
            in_flight.finish(&key("k"), lease(1)),
            ["retry 1", "retry 2"]
        );
        assert_eq!(in_flight.len(), 2);
        // Finished: the next retry runs (and meets the grant's record).
        assert_eq!(in_flight.arrive(&key("k"), lease(1), "late"), Arrival::Run);
        assert!(in_flight.finish(&key("k"), lease(1)).is_empty());
    }

    #[test]
    fn joins_are_bounded() {
        let mut in_flight = AcquiresInFlight::default();
        assert_eq!(in_flight.arrive(&key("k"), lease(1), 0), Arrival::Run);
        for n in 1..=JOINS_MAX {
            assert_eq!(in_flight.arrive(&key("k"), lease(1), n), Arrival::Joined);
        }
        assert_eq!(in_flight.arrive(&key("k"), lease(1), 99), Arrival::Full);
        assert_eq!(in_flight.finish(&key("k"), lease(1)).len(), JOINS_MAX);
    }
}
