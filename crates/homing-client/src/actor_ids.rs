//! `ActorIds`: one shared copy of each actor id the Resolver's answers
//! hold. Many keys live on one actor (a host holds thousands of actors'
//! keys, and its id is its address), so an answer keeps its actor's id as
//! an `Arc<str>` shared with every other answer of that actor rather than
//! a copy of its own: per-key memory is the id's pointer, and a router
//! serving 100 000 keys over a few hosts reads a few ids per request, which
//! stay in the CPU's caches, not 100 000.
//!
//! Bounded: at most `max` ids are kept. A full set first drops the ids no
//! answer holds any more; if it is still full, a new id is handed out
//! unshared (correct, only not deduplicated) until some go.

use std::collections::HashSet;
use std::sync::{Arc, Mutex, PoisonError};

/// Ids kept by default: far more hosts than one router forwards to.
pub(crate) const ACTOR_IDS_MAX: usize = 1 << 14;

/// Actor id text → its one shared copy. See the module docs.
pub(crate) struct ActorIds {
    ids: Mutex<HashSet<Arc<str>>>,
    max: usize,
}

impl ActorIds {
    /// A set keeping at most `max` ids.
    pub(crate) fn new(max: usize) -> ActorIds {
        ActorIds {
            ids: Mutex::new(HashSet::new()),
            max,
        }
    }

    /// The shared copy of `id` (made now if none is kept).
    pub(crate) fn get(&self, id: &str) -> Arc<str> {
        // A panic while it was held left a set of ids, still usable.
        let mut ids = self.ids.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(shared) = ids.get(id) {
            return shared.clone();
        }
        if ids.len() >= self.max {
            // Held by the set alone: no answer refers to it any more.
            ids.retain(|shared| Arc::strong_count(shared) > 1);
        }
        let shared: Arc<str> = Arc::from(id);
        if ids.len() < self.max {
            ids.insert(shared.clone());
        }
        shared
    }

    /// Ids kept (for tests).
    #[cfg(test)]
    fn len(&self) -> usize {
        self.ids
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
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
        assert_eq!(ids.len(), 2);
    }

    #[test]
    fn a_full_set_drops_ids_no_answer_holds_and_never_grows_past_its_bound() {
        let ids = ActorIds::new(2);
        let held = ids.get("held");
        drop(ids.get("dropped"));
        // Full: "dropped" is held by the set alone and goes; "held" stays.
        let third = ids.get("third");
        assert_eq!(ids.len(), 2);
        assert!(
            Arc::ptr_eq(&held, &ids.get("held")),
            "a held id stays shared"
        );
        assert!(Arc::ptr_eq(&third, &ids.get("third")));
        // Full of held ids: a new one is handed out, correct but unshared.
        let fourth = ids.get("fourth");
        assert_eq!(&*fourth, "fourth");
        assert_eq!(ids.len(), 2, "bounded");
        assert!(!Arc::ptr_eq(&fourth, &ids.get("fourth")));
    }
}
