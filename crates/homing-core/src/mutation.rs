//! Rules of homing-node and of the router's walk that a test can break on
//! purpose, to show that the simulator's checkers catch a bug in the code
//! homingd and the Resolver run (not in a copy).
//!
//! Without the `mutations` cargo feature a [`Mutations`] set is always empty
//! and [`Mutations::has`] is a constant `false`; with it, a set is still
//! empty unless a test builds one with `Mutations::with`. homingd, the CLI
//! and the Resolver only ever pass [`Mutations::NONE`].

/// One rule broken on purpose.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum Mutation {
    /// A vacated reservation wakes the waiter registered last instead of
    /// the first (breaks first come, first served).
    WaiterQueuePopsBack = 1 << 0,
    /// A record write no longer wakes that record's waiters.
    WriteForgetsWaiters = 1 << 1,
    /// The grant after a wait is computed as if the host had sent its
    /// request [`GRANT_LATE_MS`] later than it did: its deadlines run past
    /// the lease the DC stored.
    GrantRunsLate = 1 << 2,
    /// A link ignores the token the linker read (it links over a tail
    /// re-activated since).
    LinkIgnoresToken = 1 << 3,
    /// A link links whatever it is asked to: no liveness check, no token.
    LinkIgnoresLiveness = 1 << 4,
    /// Expiry releases every active lease at once, ignoring its expiry
    /// and the grace period.
    ReaperIgnoresExpiry = 1 << 5,
    /// No lease ever expires.
    ExpiryNeverComes = 1 << 6,
    /// A release records every run as `Ok`, whatever the holder said.
    ReleaseForgetsOutcome = 1 << 7,
    /// The orphan sweeper abandons every old released record without
    /// proving that it lost its race.
    SweeperSkipsProof = 1 << 8,
    /// A drain that arrived forwarded is forwarded again when the tail
    /// moved on (one operator request may bounce between DCs).
    DrainForwardedTwice = 1 << 9,
    /// The DC lease no longer gates host leases: [`crate::DcLease::covers`]
    /// grants and renews whatever the DC's validity.
    GrantsNotGated = 1 << 10,
    /// A DC that regained its lease never applies the takeovers of its
    /// tails, and grants and renews at once ([`crate::DcLease::reconciliation`]
    /// owes nothing, [`crate::DcLease::covers`] waits for nothing).
    TakeoversNotReconciled = 1 << 11,
    /// A watch checks its cursor against the event log only on a round's
    /// first page: events trimmed under a round are skipped silently.
    WatchChecksFirstPageOnly = 1 << 12,
    /// A resolve's "absent" is reused forever, not for the absent ttl: a
    /// key created since stays "not found" at that DC.
    AbsentNeverStale = 1 << 13,
    /// A create of a key a resolve found absent lately is taken as made
    /// without asking the global store (an "absent" decides a create).
    AbsentDecidesCreate = 1 << 14,
    /// A host's acquire joins any acquire of its key running at the DC,
    /// whoever's lease it runs under (not only its own retry's).
    RetryJoinsAnyAcquire = 1 << 15,
    /// A router reuses a `NotFound` forever, not for its absent ttl
    /// ([`crate::RouterWalk`]): a key created since stays "not found" there.
    RouterAbsentNeverStale = 1 << 16,
    /// A router takes a global read that got no answer as "no entry"
    /// ([`crate::RouterWalk`]): a silent DC makes an existing key "not found".
    RouterSilenceIsAbsent = 1 << 17,
    /// A homingd's log follower reads the log but wakes nobody for
    /// another homingd's writes: no record named is looked at again.
    FollowerWakesNobody = 1 << 18,
}

/// How late [`Mutation::GrantRunsLate`] pretends the host's request was sent, ms.
pub const GRANT_LATE_MS: u64 = 4_000;

/// The set of rules broken in one node: empty in production.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Mutations {
    #[cfg(feature = "mutations")]
    active: u32,
}

impl Mutations {
    /// No rule broken.
    pub const NONE: Mutations = Mutations {
        #[cfg(feature = "mutations")]
        active: 0,
    };

    /// This set with `mutation` broken as well.
    #[cfg(feature = "mutations")]
    pub const fn with(self, mutation: Mutation) -> Mutations {
        Mutations {
            active: self.active | mutation as u32,
        }
    }

    /// Whether `mutation` is broken here.
    #[inline]
    pub fn has(self, mutation: Mutation) -> bool {
        #[cfg(feature = "mutations")]
        {
            self.active & mutation as u32 != 0
        }
        #[cfg(not(feature = "mutations"))]
        {
            let _ = mutation;
            false
        }
    }
}
