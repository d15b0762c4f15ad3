//! What a DC remembers of the global store, and every rule about trusting
//! it (docs/DESIGN.md §7.4, §7.5). Global entries and successions are
//! write-once, so a copy of one is never stale: a read or a confirm found
//! here costs no I/O. Per key, the furthest chain member the DC has seen is
//! the next walk's hint (members stay members: a hint is never wrong, only
//! behind). And for `absent_ttl_ms`, a key a resolve found absent is
//! answered absent again without a read — only to a resolve: an "absent"
//! never decides a create (only the store's set-if-absent does), and a
//! connect's read always asks the store.
//!
//! A driver hands every [`GlobalOp`] to [`Memory::recall`] first, performs
//! it against the global store only when that has no answer, and hands the
//! store's answer to [`Memory::learn`], which keeps what never changes and
//! completes the answer the stepper gets. homingd keeps one `Memory` per
//! node behind a lock; the simulator keeps one per simulated DC, lost in a
//! crash as homingd's is.
//!
//! Each map is bounded ([`MemoryLimits::entries`]) by two generations: a
//! map that fills becomes the previous one, and an entry read from the
//! previous one moves back into the current one. Dropping an entry only
//! costs a read later.

use std::collections::HashMap;
use std::hash::Hash;

use homing_core::{Key, ReservationId, Shortcut, Source, Succession, TakeOverReply};

use crate::step::effect::{GlobalAnswer, GlobalOp, GlobalRead};
use crate::step::time::NodeTime;
use homing_core::mutation::{Mutation, Mutations};

/// Default of [`MemoryLimits::entries`] (homingd's `global_cache_entries`).
pub const MEMORY_ENTRIES_DEFAULT: u64 = 1_000_000;

/// How much a DC remembers, and for how long an absent key stays absent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryLimits {
    /// Most entries kept of each kind (global entries, successions, chain
    /// members, absent keys).
    pub entries: u64,
    /// How long a resolve's "absent" is reused, ms (0: never).
    pub absent_ttl_ms: u64,
}

/// A DC's memory of the global store (see the module doc).
#[derive(Debug)]
pub struct Memory {
    entries: Generations<Key, ReservationId>,
    successions: Generations<ReservationId, Succession>,
    members: Generations<Key, Shortcut>,
    /// Keys a resolve found absent, and when (node clock).
    absent: Generations<Key, NodeTime>,
    absent_ttl_us: u64,
    mutations: Mutations,
}

impl Memory {
    /// An empty memory within `limits` (rules broken on purpose: `mutations`).
    pub fn new(limits: MemoryLimits, mutations: Mutations) -> Memory {
        let capacity = usize::try_from(limits.entries).unwrap_or(usize::MAX);
        Memory {
            entries: Generations::new(capacity),
            successions: Generations::new(capacity),
            members: Generations::new(capacity),
            absent: Generations::new(capacity),
            absent_ttl_us: limits.absent_ttl_ms.saturating_mul(1000),
            mutations,
        }
    }

    /// The answer to `op` at `now` from memory, if it has one; `None`: the
    /// global store must be asked (and [`Memory::learn`] told its answer).
    pub fn recall(&mut self, op: &GlobalOp, now: NodeTime) -> Option<GlobalAnswer> {
        match op {
            GlobalOp::Entry { key, read } => {
                if let Some(id) = self.entries.get(key) {
                    return Some(GlobalAnswer::Entry(Some(id)));
                }
                let reused = *read == GlobalRead::Resolve && self.absent_lately(key, now);
                reused.then_some(GlobalAnswer::Entry(None))
            }
            GlobalOp::SetIfAbsent { key, .. } => {
                let trusted = self.mutations.has(Mutation::AbsentDecidesCreate)
                    && self.absent_lately(key, now);
                trusted.then_some(GlobalAnswer::SetIfAbsent(None))
            }
            GlobalOp::Successor { id, key } => {
                let succession = self.successions.get(id)?;
                Some(GlobalAnswer::Successor {
                    succession: Some(succession),
                    source: Source::Cache,
                    hint: self.hint(key),
                })
            }
            GlobalOp::Confirm(succession) => self
                .successions
                .get(&succession.link.from)
                .map(GlobalAnswer::Confirmed),
            GlobalOp::DcLease(_) | GlobalOp::SuccessionsOf { .. } | GlobalOp::TakeOver { .. } => {
                None
            }
        }
    }

    /// The global store answered `answer` to `op` at `now`: what never
    /// changes is kept, a resolve's "absent" noted; returns the answer for
    /// the stepper (a successor's with this DC's hint for the key).
    pub fn learn(&mut self, op: &GlobalOp, answer: GlobalAnswer, now: NodeTime) -> GlobalAnswer {
        match (op, answer) {
            (GlobalOp::Entry { key, read }, GlobalAnswer::Entry(entry)) => {
                match &entry {
                    Some(id) => {
                        self.absent.remove(key);
                        self.entries.insert(key.clone(), id.clone());
                    }
                    None if *read == GlobalRead::Resolve => self.absent.insert(key.clone(), now),
                    None => {}
                }
                GlobalAnswer::Entry(entry)
            }
            (GlobalOp::SetIfAbsent { key, id }, GlobalAnswer::SetIfAbsent(winner)) => {
                self.absent.remove(key);
                let entry = winner.clone().unwrap_or_else(|| id.clone());
                self.entries.insert(key.clone(), entry);
                GlobalAnswer::SetIfAbsent(winner)
            }
            (
                GlobalOp::Successor { key, .. },
                GlobalAnswer::Successor {
                    succession, source, ..
                },
            ) => {
                if let Some(known) = &succession {
                    self.keep(known);
                }
                let hint = self.hint(key);
                GlobalAnswer::Successor {
                    succession,
                    source,
                    hint,
                }
            }
            (GlobalOp::Confirm(_), GlobalAnswer::Confirmed(recorded)) => {
                self.keep(&recorded);
                GlobalAnswer::Confirmed(recorded)
            }
            (GlobalOp::SuccessionsOf { .. }, GlobalAnswer::Successions(page)) => {
                page.iter().for_each(|succession| self.keep(succession));
                GlobalAnswer::Successions(page)
            }
            (GlobalOp::TakeOver { succession, .. }, GlobalAnswer::TakenOver(reply)) => {
                match &reply {
                    TakeOverReply::Taken => self.keep(succession),
                    TakeOverReply::Exists(existing) => self.keep(existing),
                    TakeOverReply::Refused(_) => {}
                }
                GlobalAnswer::TakenOver(reply)
            }
            (_, answer) => answer,
        }
    }

    /// The hint for the next walk of `key`: the furthest member remembered.
    pub fn hint(&mut self, key: &Key) -> Option<Shortcut> {
        self.members.get(key)
    }

    /// Remembers `member` of `key`'s chain if it is further along than the
    /// one known (a walk proved it, or this DC granted it).
    pub fn remember(&mut self, key: &Key, member: Shortcut) {
        if member.is_past(self.members.get(key).as_ref()) {
            self.members.insert(key.clone(), member);
        }
    }

    /// Whether a resolve found `key` absent within the absent ttl of `now`.
    fn absent_lately(&mut self, key: &Key, now: NodeTime) -> bool {
        let ttl_us = if self.mutations.has(Mutation::AbsentNeverStale) {
            u64::MAX
        } else {
            self.absent_ttl_us
        };
        self.absent
            .get(key)
            .is_some_and(|at| now.us_since(at) < ttl_us)
    }

    fn keep(&mut self, succession: &Succession) {
        let from = succession.link.from.clone();
        self.successions.insert(from, succession.clone());
    }
}

/// A map of at most `capacity` entries: two generations, the older dropped
/// whole when the newer fills; a hit in the older moves back to the newer.
#[derive(Debug)]
struct Generations<K, V> {
    current: HashMap<K, V>,
    previous: HashMap<K, V>,
    /// Entries per generation.
    half: usize,
}

impl<K: Hash + Eq + Clone, V: Clone> Generations<K, V> {
    fn new(capacity: usize) -> Self {
        Generations {
            current: HashMap::new(),
            previous: HashMap::new(),
            half: (capacity / 2).max(1),
        }
    }

    fn get(&mut self, key: &K) -> Option<V> {
        if let Some(value) = self.current.get(key) {
            return Some(value.clone());
        }
        let value = self.previous.remove(key)?;
        self.insert(key.clone(), value.clone());
        Some(value)
    }

    fn insert(&mut self, key: K, value: V) {
        if self.current.len() >= self.half && !self.current.contains_key(&key) {
            self.previous = std::mem::take(&mut self.current);
        }
        self.current.insert(key, value);
    }

    fn remove(&mut self, key: &K) {
        self.current.remove(key);
        self.previous.remove(key);
    }
}

#[cfg(test)]
mod tests {
    use homing_core::{FencingToken, Link, SuccessionCause};

    use super::*;
    use crate::fixture::{NOW, id, key};

    const LIMITS: MemoryLimits = MemoryLimits {
        entries: 8,
        absent_ttl_ms: 500,
    };

    fn memory() -> Memory {
        Memory::new(LIMITS, Mutations::NONE)
    }

    fn entry(read: GlobalRead) -> GlobalOp {
        GlobalOp::Entry { key: key(), read }
    }

    fn succession(from: &str, to: &str) -> Succession {
        Succession {
            link: Link {
                from: id(from),
                to: id(to),
                token: FencingToken::FIRST,
            },
            cause: SuccessionCause::Moved,
        }
    }

    #[test]
    fn an_entry_read_once_is_answered_from_memory_for_every_read() {
        let mut memory = memory();
        assert_eq!(memory.recall(&entry(GlobalRead::Latest), NOW.node), None);
        let read = GlobalAnswer::Entry(Some(id("iad.1")));
        memory.learn(&entry(GlobalRead::Latest), read.clone(), NOW.node);
        for how in [GlobalRead::Latest, GlobalRead::Nearest, GlobalRead::Resolve] {
            assert_eq!(memory.recall(&entry(how), NOW.node), Some(read.clone()));
        }
    }

    #[test]
    fn a_resolves_absent_is_reused_by_resolves_only_and_only_within_its_ttl() {
        let mut memory = memory();
        let absent = GlobalAnswer::Entry(None);
        memory.learn(&entry(GlobalRead::Resolve), absent.clone(), NOW.node);
        let within = NOW.node.plus_ms(499);
        assert_eq!(
            memory.recall(&entry(GlobalRead::Resolve), within),
            Some(absent)
        );
        assert_eq!(memory.recall(&entry(GlobalRead::Latest), within), None);
        assert_eq!(memory.recall(&entry(GlobalRead::Nearest), within), None);
        let create = GlobalOp::SetIfAbsent {
            key: key(),
            id: id("iad.2"),
        };
        assert_eq!(
            memory.recall(&create, within),
            None,
            "an absent never decides a create"
        );
        let past = NOW.node.plus_ms(500);
        assert_eq!(memory.recall(&entry(GlobalRead::Resolve), past), None);
    }

    #[test]
    fn an_absent_seen_by_a_connect_is_not_noted_and_a_create_ends_the_absence() {
        let mut memory = memory();
        memory.learn(
            &entry(GlobalRead::Latest),
            GlobalAnswer::Entry(None),
            NOW.node,
        );
        assert_eq!(memory.recall(&entry(GlobalRead::Resolve), NOW.node), None);

        memory.learn(
            &entry(GlobalRead::Resolve),
            GlobalAnswer::Entry(None),
            NOW.node,
        );
        let create = GlobalOp::SetIfAbsent {
            key: key(),
            id: id("iad.2"),
        };
        memory.learn(&create, GlobalAnswer::SetIfAbsent(None), NOW.node);
        let created = Some(GlobalAnswer::Entry(Some(id("iad.2"))));
        assert_eq!(
            memory.recall(&entry(GlobalRead::Resolve), NOW.node),
            created
        );
    }

    #[test]
    fn a_lost_create_remembers_the_winner() {
        let mut memory = memory();
        let create = GlobalOp::SetIfAbsent {
            key: key(),
            id: id("iad.2"),
        };
        let lost = GlobalAnswer::SetIfAbsent(Some(id("fra.1")));
        assert_eq!(memory.learn(&create, lost.clone(), NOW.node), lost);
        let winner = Some(GlobalAnswer::Entry(Some(id("fra.1"))));
        assert_eq!(memory.recall(&entry(GlobalRead::Latest), NOW.node), winner);
    }

    #[test]
    fn a_succession_read_confirmed_or_taken_over_is_answered_from_memory() {
        let (known, other) = (succession("iad.1", "fra.2"), succession("iad.1", "sin.3"));
        let confirm = GlobalOp::Confirm(other.clone());
        let successor = GlobalOp::Successor {
            id: id("iad.1"),
            key: key(),
        };
        for (op, answer) in [
            (confirm.clone(), GlobalAnswer::Confirmed(known.clone())),
            (
                GlobalOp::TakeOver {
                    succession: known.clone(),
                    policy: homing_core::TakeoverPolicy::Automatic,
                },
                GlobalAnswer::TakenOver(TakeOverReply::Taken),
            ),
            (
                successor.clone(),
                GlobalAnswer::Successor {
                    succession: Some(known.clone()),
                    source: Source::Local,
                    hint: None,
                },
            ),
        ] {
            let mut memory = memory();
            memory.learn(&op, answer, NOW.node);
            let confirmed = Some(GlobalAnswer::Confirmed(known.clone()));
            assert_eq!(memory.recall(&confirm, NOW.node), confirmed, "after {op:?}");
            let Some(GlobalAnswer::Successor {
                succession, source, ..
            }) = memory.recall(&successor, NOW.node)
            else {
                panic!("a known succession is recalled");
            };
            assert_eq!((succession, source), (Some(known.clone()), Source::Cache));
        }
    }

    #[test]
    fn a_successor_answer_carries_the_furthest_member_remembered() {
        let mut memory = memory();
        let near = Shortcut {
            to: id("fra.2"),
            token: FencingToken::FIRST.next(),
        };
        let far = Shortcut {
            to: id("sin.3"),
            token: FencingToken::FIRST.next().next(),
        };
        memory.remember(&key(), far.clone());
        memory.remember(&key(), near);
        let successor = GlobalOp::Successor {
            id: id("iad.1"),
            key: key(),
        };
        let read = GlobalAnswer::Successor {
            succession: None,
            source: Source::Local,
            hint: None,
        };
        let GlobalAnswer::Successor { hint, .. } = memory.learn(&successor, read, NOW.node) else {
            panic!("a successor answer");
        };
        assert_eq!(hint, Some(far));
    }

    #[test]
    fn a_full_generation_is_dropped_only_when_the_next_fills() {
        let mut map = Generations::new(4);
        for n in 0..2 {
            map.insert(n, n);
        }
        map.insert(2, 2); // 0 and 1 move to the previous generation
        assert_eq!(map.get(&0), Some(0)); // and 0 back to the current one
        map.insert(3, 3); // the current one is full: 1 goes, 2 and 0 age
        assert_eq!((map.get(&1), map.get(&3)), (None, Some(3)));
        assert!(map.current.len() + map.previous.len() <= 4);
    }
}
