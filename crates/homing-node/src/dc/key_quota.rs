//! The permanent-key quota: how many keys one DC may create per namespace.
//!
//! A key's first reservation writes a global entry that is kept forever
//! (DESIGN.md §1: entries are never changed or deleted), so a host — or a
//! buggy one — that connects to fresh names grows the global store without
//! bound. Each DC therefore counts the keys it created in each namespace
//! (its records that are the first reservation of their key, not abandoned:
//! the store's `keys_created`) and refuses a create past
//! `keys_per_namespace_max` with [`ErrorKind::QuotaExceeded`]. Keys that
//! exist are never refused: re-activating, recreating a key another DC
//! created, or finding it held costs no new entry.
//!
//! The DC's [`crate::Endpoint`] keeps it. When an acquire asks
//! `Effect::Admit` (before the allocation of a key's first reservation),
//! the endpoint calls [`KeyQuota::admit`]. `Count`: the effect goes back to
//! the driver, which counts the namespace's keys in the DC store (at most
//! [`KeyQuota::count_bound`]) and hands the number to the endpoint
//! ([`KeyQuota::counted`], admit again). `Granted`: the create holds a
//! slot; once its global write answers, the acquire notes
//! `NodeEvent::QuotaSettled` and the endpoint [`KeyQuota::settle`]s it —
//! kept when this DC's entry is the key's (inserted, or a retried write of
//! our own), given back when another DC won the race or the acquire ended
//! without it (a driver that drops an acquire before it ends gives its slot
//! back itself). `Refused`: the host is answered with the error.
//!
//! The count is exact within one homingd: a slot is taken before the create
//! starts, so concurrent creates cannot overshoot. It is kept in memory from
//! one count per namespace per process start; a namespace's first creates
//! after a start wait for the count (one scan page per 128 records, bounded
//! by the quota), which homingd runs in a task of its own per namespace so
//! a create that gives up does not cancel it.

use std::collections::HashMap;

use homing_core::{ErrorKind, ErrorReply, Namespace};

/// Default of `keys_per_namespace_max`: keys one DC may create in one
/// namespace.
pub const KEYS_PER_NAMESPACE_MAX_DEFAULT: u64 = 10_000_000;

/// What [`KeyQuota::admit`] decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Admit {
    /// The create may go ahead; it holds a slot until [`KeyQuota::settle`].
    Granted,
    /// The namespace is not counted yet: count, [`KeyQuota::counted`], admit again.
    Count,
    /// The namespace is full: answer this.
    Refused(ErrorReply),
}

/// The keys each namespace holds, as far as this DC created them.
#[derive(Debug, Clone)]
pub struct KeyQuota {
    /// 0: unlimited.
    keys_max: u64,
    /// Keys created (plus creates holding a slot), per namespace counted so far.
    created: HashMap<Namespace, u64>,
}

impl KeyQuota {
    /// A quota of `keys_per_namespace_max` keys per namespace (0: unlimited).
    pub fn new(keys_per_namespace_max: u64) -> KeyQuota {
        KeyQuota {
            keys_max: keys_per_namespace_max,
            created: HashMap::new(),
        }
    }

    /// Whether creates are counted at all.
    pub fn limited(&self) -> bool {
        self.keys_max > 0
    }

    /// How far a count of a namespace need go: past the quota, the exact
    /// number changes nothing.
    pub fn count_bound(&self) -> u64 {
        self.keys_max
    }

    /// May this DC create one more key in `namespace`?
    pub fn admit(&mut self, namespace: &Namespace) -> Admit {
        if !self.limited() {
            return Admit::Granted;
        }
        let Some(created) = self.created.get_mut(namespace) else {
            return Admit::Count;
        };
        if *created >= self.keys_max {
            let message = format!(
                "this dc created {} keys in namespace {:?} (keys_per_namespace_max): no new key is created there; existing keys still acquire",
                self.keys_max,
                namespace.as_str()
            );
            return Admit::Refused(ErrorReply::new(
                ErrorKind::QuotaExceeded {
                    keys_max: self.keys_max,
                },
                message,
            ));
        }
        *created += 1;
        Admit::Granted
    }

    /// `namespace` holds `created` keys of this DC, as a count of the DC
    /// store found. A namespace counted meanwhile keeps its number (it also
    /// counts the slots granted since).
    pub fn counted(&mut self, namespace: &Namespace, created: u64) {
        if self.limited() {
            self.created.entry(namespace.clone()).or_insert(created);
        }
    }

    /// A create granted by [`KeyQuota::admit`] ended: `kept` if this DC's
    /// entry is the key's, else its slot is given back.
    pub fn settle(&mut self, namespace: &Namespace, kept: bool) {
        if kept || !self.limited() {
            return;
        }
        if let Some(created) = self.created.get_mut(namespace) {
            // Invariant: every settle follows a grant that added one.
            assert!(*created > 0, "a slot was given back twice in {namespace:?}");
            *created -= 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ns(name: &str) -> Namespace {
        Namespace::new(name).expect("valid namespace")
    }

    #[test]
    fn quota_first_create_in_a_namespace_counts_it_first() {
        let mut quota = KeyQuota::new(2);
        assert_eq!(quota.admit(&ns("games")), Admit::Count);
        quota.counted(&ns("games"), 1);
        assert_eq!(quota.admit(&ns("games")), Admit::Granted);
        quota.settle(&ns("games"), true);
        match quota.admit(&ns("games")) {
            Admit::Refused(e) => assert_eq!(e.kind, ErrorKind::QuotaExceeded { keys_max: 2 }),
            other => panic!("{other:?}"),
        }
        // Another namespace has its own count.
        assert_eq!(quota.admit(&ns("chat")), Admit::Count);
    }

    #[test]
    fn quota_slots_are_taken_before_the_create_so_concurrent_creates_cannot_overshoot() {
        let mut quota = KeyQuota::new(3);
        quota.counted(&ns(""), 0);
        let granted = (0..10)
            .filter(|_| quota.admit(&ns("")) == Admit::Granted)
            .count();
        assert_eq!(granted, 3);
    }

    #[test]
    fn quota_a_create_that_lost_its_race_gives_its_slot_back() {
        let mut quota = KeyQuota::new(1);
        quota.counted(&ns(""), 0);
        assert_eq!(quota.admit(&ns("")), Admit::Granted);
        quota.settle(&ns(""), false);
        assert_eq!(quota.admit(&ns("")), Admit::Granted);
        assert!(matches!(quota.admit(&ns("")), Admit::Refused(_)));
    }

    #[test]
    fn quota_a_late_count_does_not_overwrite_one_that_granted_slots() {
        let mut quota = KeyQuota::new(2);
        quota.counted(&ns(""), 1);
        assert_eq!(quota.admit(&ns("")), Admit::Granted);
        // A second count that started before the grant saw 1.
        quota.counted(&ns(""), 1);
        assert!(matches!(quota.admit(&ns("")), Admit::Refused(_)));
    }

    #[test]
    fn quota_zero_is_unlimited_and_counts_nothing() {
        let mut quota = KeyQuota::new(0);
        for _ in 0..100 {
            assert_eq!(quota.admit(&ns("")), Admit::Granted);
        }
        quota.settle(&ns(""), false);
    }
}
