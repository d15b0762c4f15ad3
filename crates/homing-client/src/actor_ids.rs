//! `ActorIds`: one shared copy of each actor id the Resolver's answers
//! hold. Many keys live on one actor (a host holds thousands of actors'
//! keys, and its id is its address), so an answer keeps its actor's id as
//! an `Arc<str>` shared with every other answer of that actor rather than
//! a copy of its own: per-key memory is the id's pointer, and a router
//! serving 100 000 keys over a few hosts reads a few ids per request, which
//! stay in the CPU's caches, not 100 000.
//!
//! Bounded: at most `max` ids are kept. A full set drops the ids no answer
//! holds any more; while it is still full, a new id is handed out unshared
//! (correct, only not deduplicated). The sweep reads the whole set, so a
//! full set sweeps again only after `max / 4` more new ids: a router whose
//! answers name more live actors than `max` pays a constant amount per new
//! id, not a sweep each.

use std::collections::HashSet;
use std::sync::{Arc, Mutex, PoisonError};

/// Ids kept by default: far more hosts than one router forwards to.
pub(crate) const ACTOR_IDS_MAX: usize = 1 << 16;

/// Actor id text → its one shared copy. See the module docs.
pub(crate) struct ActorIds {
    state: Mutex<State>,
    max: usize,
}

struct State {
    ids: HashSet<Arc<str>>,
    /// New ids since the last sweep (kept or handed out unshared).
    new_since_sweep: usize,
    /// Sweeps of a full set so far (for tests).
    sweeps: u64,
}

impl ActorIds {
    /// A set keeping at most `max` ids.
    pub(crate) fn new(max: usize) -> ActorIds {
        ActorIds {
            state: Mutex::new(State {
                ids: HashSet::new(),
                new_since_sweep: 0,
                sweeps: 0,
            }),
            max,
        }
    }

    /// The shared copy of `id` (made now if none is kept).
    pub(crate) fn get(&self, id: &str) -> Arc<str> {
        // A panic while it was held left a set of ids, still usable.
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(shared) = state.ids.get(id) {
            return shared.clone();
        }
        if state.ids.len() >= self.max && state.new_since_sweep >= (self.max / 4).max(1) {
            // Held by the set alone: no answer refers to it any more.
            state.ids.retain(|shared| Arc::strong_count(shared) > 1);
            state.new_since_sweep = 0;
            state.sweeps += 1;
        }
        state.new_since_sweep += 1;
        let shared: Arc<str> = Arc::from(id);
        if state.ids.len() < self.max {
            state.ids.insert(shared.clone());
        }
        shared
    }

    /// Ids kept and sweeps made (for tests).
    #[cfg(test)]
    fn counts(&self) -> (usize, u64) {
        let state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        (state.ids.len(), state.sweeps)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_actor_id_is_one_shared_copy() {
        let ids = ActorIds::new(8);
        let (a, b) = (ids.get("10.0.0.1:80"), ids.get("10.0.0.1:80"));
        assert!(
            Arc::ptr_eq(&a, &b),
            "the second answer shares the first's id"
        );
        let c = ids.get("10.0.0.2:80");
        assert_eq!((&*a, &*c), ("10.0.0.1:80", "10.0.0.2:80"));
        assert!(!Arc::ptr_eq(&a, &c));
        assert_eq!(ids.counts().0, 2);
    }

    #[test]
    fn a_full_set_drops_ids_no_answer_holds_and_never_grows_past_its_bound() {
        let ids = ActorIds::new(2);
        let held = ids.get("held");
        drop(ids.get("dropped"));
        // Full: "dropped" is held by the set alone and goes; "held" stays.
        let third = ids.get("third");
        assert_eq!(ids.counts(), (2, 1));
        assert!(
            Arc::ptr_eq(&held, &ids.get("held")),
            "a held id stays shared"
        );
        assert!(Arc::ptr_eq(&third, &ids.get("third")));
        // Full of held ids: a new one is handed out, correct but unshared.
        let fourth = ids.get("fourth");
        assert_eq!(&*fourth, "fourth");
        assert_eq!(ids.counts().0, 2, "bounded");
        assert!(!Arc::ptr_eq(&fourth, &ids.get("fourth")));
    }

    #[test]
    fn a_set_full_of_held_ids_sweeps_once_per_quarter_of_its_size_in_new_ids() {
        const MAX: usize = 64;
        let ids = ActorIds::new(MAX);
        let held: Vec<_> = (0..MAX).map(|i| ids.get(&format!("held-{i}"))).collect();
        let unshared: Vec<_> = (0..4 * MAX).map(|i| ids.get(&format!("new-{i}"))).collect();
        let (kept, sweeps) = ids.counts();
        assert_eq!(kept, MAX);
        // One sweep when the set first fills, then one per MAX / 4 new ids.
        assert_eq!(sweeps, 1 + (4 * MAX as u64 - 1) / (MAX as u64 / 4));
        drop((held, unshared));
    }
}
