//! Retried acquires (DESIGN.md §7.3): a host that hears nothing in time
//! sends the same acquire again, with the same lease key. The DC answers the
//! retry with the outcome of the acquire it repeats, and never runs that
//! acquire twice at once:
//!
//! - still running: the retry joins it and gets its reply, instead of
//!   starting a second connect that races the first for the key;
//! - ended lately ([`ANSWER_MEMORY_MS`]): the retry gets the reply it
//!   ended with. Running it again could grant the key to a host that has
//!   already taken that reply and moved on (released the grant, or was told
//!   `HeldElsewhere` and went idle): a grant nobody runs until it expires.
//! - ended longer ago, or forgotten: it runs as any acquire; the record it
//!   granted, while still held, recognises the lease key and answers with the
//!   same grant (`DcRecord::activate`).
//!
//! A first grant counts from the first request's host time, earlier than
//! the retry's: conservative for the host.
//!
//! Driver: [`AcquiresInFlight::arrive`] for every acquire; `Run` → run it,
//! then [`AcquiresInFlight::finish`] with its reply and answer every joined
//! request with it. A driver whose runner can vanish (a dropped task) calls
//! `finish` with no reply on the way out and lets the joined requests arrive
//! again.

use std::collections::{HashMap, VecDeque};

use homing_core::host_lease::{ACQUIRE_ATTEMPTS_DEFAULT, REQUEST_TIMEOUT_MS_DEFAULT};
use homing_core::{Key, LeaseKey};

use crate::time::NodeTime;

/// Most requests that may join one acquire: HostAgent sends an acquire at
/// most `ACQUIRE_ATTEMPTS_DEFAULT` (3) times; past this, a retry is refused.
pub const JOINS_MAX: usize = 8;

/// How long the reply of an ended acquire is kept for its retries, ms: as
/// long as a host tries one acquire that does not wait (3 × 2 s).
pub const ANSWER_MEMORY_MS: u64 = ACQUIRE_ATTEMPTS_DEFAULT as u64 * REQUEST_TIMEOUT_MS_DEFAULT;

/// Most replies kept at once; past it the oldest is forgotten (its retry,
/// if one still comes, runs again, as without the memory).
pub const ANSWERS_MAX: usize = 16_384;

/// What a driver does with an acquire that arrived.
#[derive(Debug, PartialEq, Eq)]
pub enum Arrival<R> {
    /// None with its key and lease key runs here or ended lately: run it.
    Run,
    /// One runs already: its reply answers this request too.
    Joined,
    /// One ended lately with this reply: answer it again.
    Answered(R),
    /// [`JOINS_MAX`] requests wait on it already: refuse this one.
    Full,
}

type Acquiring = (Key, LeaseKey);

/// The acquires running at a DC, by key and lease key, with the requests
/// (`W`: how the driver answers one) waiting on each; and the replies (`R`)
/// of those that ended lately.
#[derive(Debug)]
pub struct AcquiresInFlight<W, R> {
    running: HashMap<Acquiring, Vec<W>>,
    answered: HashMap<Acquiring, R>,
    order: VecDeque<(NodeTime, Acquiring)>,
}

impl<W, R> Default for AcquiresInFlight<W, R> {
    fn default() -> Self {
        AcquiresInFlight {
            running: HashMap::new(),
            answered: HashMap::new(),
            order: VecDeque::new(),
        }
    }
}

impl<W, R: Clone> AcquiresInFlight<W, R> {
    /// An acquire of `key` under `lease` arrived at `now`, answered through
    /// `waiter` if it joins one already running (dropped otherwise).
    pub fn arrive(&mut self, key: &Key, lease: LeaseKey, waiter: W, now: NodeTime) -> Arrival<R> {
        self.forget_before(now);
        let acquiring = (key.clone(), lease);
        if let Some(reply) = self.answered.get(&acquiring) {
            return Arrival::Answered(reply.clone());
        }
        match self.running.get_mut(&acquiring) {
            None => {
                self.running.insert(acquiring, Vec::new());
                Arrival::Run
            }
            Some(joined) if joined.len() >= JOINS_MAX => Arrival::Full,
            Some(joined) => {
                joined.push(waiter);
                Arrival::Joined
            }
        }
    }

    /// The acquire of `key` under `lease` ended at `now` with `reply` (`None`:
    /// dropped unanswered, nothing kept): the requests that joined it, in
    /// arrival order, to answer with it.
    pub fn finish(
        &mut self,
        key: &Key,
        lease: LeaseKey,
        reply: Option<R>,
        now: NodeTime,
    ) -> Vec<W> {
        let acquiring = (key.clone(), lease);
        let joined = self.running.remove(&acquiring).unwrap_or_default();
        if let Some(reply) = reply {
            self.forget_before(now);
            if self.answered.insert(acquiring.clone(), reply).is_none() {
                self.order.push_back((now, acquiring));
            }
            while self.order.len() > ANSWERS_MAX {
                self.forget_oldest();
            }
        }
        joined
    }

    /// How many acquires run.
    pub fn running(&self) -> usize {
        self.running.len()
    }

    /// How many replies are kept.
    pub fn answered(&self) -> usize {
        self.answered.len()
    }

    /// Forgets everything (the node crashed or stopped): the requests that
    /// joined running acquires are dropped unanswered.
    pub fn clear(&mut self) {
        *self = AcquiresInFlight::default();
    }

    fn forget_before(&mut self, now: NodeTime) {
        while let Some((at, _)) = self.order.front() {
            if now.us_since(*at) / 1000 < ANSWER_MEMORY_MS {
                break;
            }
            self.forget_oldest();
        }
    }

    fn forget_oldest(&mut self) {
        if let Some((_, acquiring)) = self.order.pop_front() {
            self.answered.remove(&acquiring);
        }
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

    const T0: NodeTime = NodeTime::from_us(0);

    #[test]
    fn a_retry_joins_the_acquire_with_its_key_and_lease_key_and_no_other() {
        let mut in_flight = AcquiresInFlight::default();
        let arrive = |f: &mut AcquiresInFlight<_, _>, k, l, w| f.arrive(&key(k), lease(l), w, T0);
        assert_eq!(arrive(&mut in_flight, "k", 1, "first"), Arrival::Run);
        assert_eq!(arrive(&mut in_flight, "k", 1, "retry 1"), Arrival::Joined);
        assert_eq!(arrive(&mut in_flight, "k", 2, "other host"), Arrival::Run);
        assert_eq!(arrive(&mut in_flight, "j", 1, "other key"), Arrival::Run);
        assert_eq!(arrive(&mut in_flight, "k", 1, "retry 2"), Arrival::Joined);
        let joined = in_flight.finish(&key("k"), lease(1), Some("granted"), T0);
        assert_eq!(joined, ["retry 1", "retry 2"]);
        assert_eq!(in_flight.running(), 2);
    }

    #[test]
    fn a_retry_after_its_acquire_ended_gets_its_reply_for_a_while() {
        let mut in_flight = AcquiresInFlight::default();
        assert_eq!(in_flight.arrive(&key("k"), lease(1), (), T0), Arrival::Run);
        in_flight.finish(&key("k"), lease(1), Some("held elsewhere"), T0);
        let late = T0.plus_ms(ANSWER_MEMORY_MS - 1);
        let again = in_flight.arrive(&key("k"), lease(1), (), late);
        assert_eq!(again, Arrival::Answered("held elsewhere"));
        assert_eq!(in_flight.running(), 0, "nothing runs again");
        // Past the memory it runs again.
        let later = T0.plus_ms(ANSWER_MEMORY_MS);
        assert_eq!(
            in_flight.arrive(&key("k"), lease(1), (), later),
            Arrival::Run
        );
        assert_eq!(in_flight.answered(), 0);
    }

    #[test]
    fn an_acquire_dropped_unanswered_leaves_no_reply_and_its_retry_runs() {
        let mut in_flight = AcquiresInFlight::<&str, &str>::default();
        assert_eq!(
            in_flight.arrive(&key("k"), lease(1), "first", T0),
            Arrival::Run
        );
        assert_eq!(
            in_flight.arrive(&key("k"), lease(1), "retry", T0),
            Arrival::Joined
        );
        assert_eq!(in_flight.finish(&key("k"), lease(1), None, T0), ["retry"]);
        assert_eq!(
            in_flight.arrive(&key("k"), lease(1), "retry", T0),
            Arrival::Run
        );
    }

    #[test]
    fn joins_and_kept_replies_are_bounded() {
        let mut in_flight = AcquiresInFlight::default();
        assert_eq!(in_flight.arrive(&key("k"), lease(1), 0, T0), Arrival::Run);
        for n in 1..=JOINS_MAX {
            assert_eq!(
                in_flight.arrive(&key("k"), lease(1), n, T0),
                Arrival::Joined
            );
        }
        assert_eq!(in_flight.arrive(&key("k"), lease(1), 99, T0), Arrival::Full);
        assert_eq!(
            in_flight.finish(&key("k"), lease(1), Some(()), T0).len(),
            JOINS_MAX
        );
        for n in 0..=ANSWERS_MAX {
            let k = key(&format!("k{n}"));
            assert_eq!(in_flight.arrive(&k, lease(1), 0, T0), Arrival::Run);
            in_flight.finish(&k, lease(1), Some(()), T0);
        }
        assert_eq!(in_flight.answered(), ANSWERS_MAX);
        assert_eq!(
            in_flight.arrive(&key("k0"), lease(1), 0, T0),
            Arrival::Run,
            "the oldest reply is forgotten"
        );
    }
}
