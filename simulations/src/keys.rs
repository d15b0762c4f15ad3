//! The run's keys, numbered: a key's number is how messages, traces and
//! the checker name it ([`NO_KEY`]: none), and each reservation's key
//! number is remembered once a record of it is written, so that a record
//! names its key in the trace without a lookup by name.

use std::collections::BTreeMap;

use homing_core::{Key, KeyName, ReservationId};

use crate::trace::NO_KEY;

/// The run's keys and their numbers.
#[derive(Debug)]
pub struct Keys {
    /// The keys, by number.
    all: Vec<Key>,
    /// Each key's number.
    numbers: BTreeMap<Key, u32>,
    /// The key number of each reservation a record was written for.
    of_reservations: BTreeMap<ReservationId, u32>,
}

impl Keys {
    /// Keys `k0` to `k<count - 1>`.
    pub fn new(count: u32) -> Keys {
        let all: Vec<Key> = (0..count)
            .map(|i| {
                // Invariant: "k<n>" satisfies the key-name rule.
                Key::new(KeyName::new(format!("k{i}")).expect("valid key name"))
            })
            .collect();
        let numbers = (all.iter().enumerate())
            .map(|(i, k)| (k.clone(), i as u32))
            .collect();
        Keys {
            all,
            numbers,
            of_reservations: BTreeMap::new(),
        }
    }

    /// The keys, by number.
    pub fn all(&self) -> &[Key] {
        &self.all
    }

    /// `key`'s number ([`NO_KEY`]: not a key of the run).
    pub fn number(&self, key: &Key) -> u32 {
        self.numbers.get(key).copied().unwrap_or(NO_KEY)
    }

    /// The number of `key`, whose reservation `id` a record is written
    /// for; remembered for [`Keys::of_reservation`].
    pub fn of_record(&mut self, id: &ReservationId, key: &Key) -> u32 {
        if let Some(&k) = self.of_reservations.get(id) {
            return k;
        }
        let k = self.number(key);
        self.of_reservations.insert(id.clone(), k);
        k
    }

    /// The key number of reservation `id`, if a record of it was written.
    pub fn of_reservation(&self, id: &ReservationId) -> Option<u32> {
        self.of_reservations.get(id).copied()
    }
}
