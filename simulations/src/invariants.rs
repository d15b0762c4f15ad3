//! The invariants the simulator holds every run to (DESIGN.md §3), each
//! with a name; a [`Violation`] of one; and the [`View`] of the world they
//! are judged on. The checkers that judge them (`checker.rs`, and
//! `wakeups.rs` for waiting) read the DCs and the global store through it.

use std::collections::BTreeMap;

use homing_core::{DcId, DcRecord, Key, ReservationId, SessionRecord};
use homing_store::memory::MemoryDc;

use crate::clock::NodeClock;

/// The invariants.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Invariant {
    /// At most one active holder per key at any instant of true time.
    SingleHolder,
    /// No holder acts at or past its hard deadline by its own clock.
    HardDeadline,
    /// The chain from the global entry is acyclic, made of existing records, and ends in one tail.
    ChainShape,
    /// A link, once written, never changes or disappears.
    LinkImmutable,
    /// Tokens strictly increase from one holder of a key to the next.
    TokenAcrossHolders,
    /// Tokens strictly increase along the chain.
    TokenAlongChain,
    /// Every acknowledged (committed) write survives a crash.
    AckedWriteSurvives,
    /// A DC's allocator never hands out a unique twice.
    UniqueNeverReused,
    /// Every resolve answer was true at some instant during the request.
    ResolveWasTrue,
    /// A resolver's chain walk never finds the chain inconsistent.
    ResolveChainConsistent,
    /// Liveness, at the end of a run: a DC that runs reaps every lease past
    /// expiry + grace within two reaper intervals.
    ReaperProgress,
    /// Liveness of waiting: every registration is answered, and a vacant
    /// (or moved) reservation with waiters wakes one (all) in bounded time
    /// (see `wakeups`).
    NoLostWakeup,
    /// A vacated reservation wakes the earliest registered waiter of its DC.
    WaiterFifo,
    /// `Acquired.previous` names the previous token of the key's chain and
    /// how that run truly ended.
    PreviousRunTrue,
    /// One operator drain costs at most one forward: a DC serving a
    /// forwarded drain never forwards it again.
    DrainForwardedOnce,
    /// Liveness of reachability (DESIGN.md §7, issue 27): once a partition
    /// or a DC crash ends and no other fault window is open, no router
    /// still holds the DC suspect since before it ended a few probe cycles
    /// later (two; five when messages may be lost).
    SuspicionClears,
    /// The DC lease (DESIGN.md §7.5): once the global store would judge a
    /// DC's lease expired (its last renewal received `expires_after` ago,
    /// in true time), no host lease that DC granted still acts.
    DcExpiredNoHolder,
    /// Liveness of acquires (DESIGN.md §7.6): a host that runs hears how
    /// its acquire ended — all its tries included — before it gives up,
    /// unless a fault window overlapped the acquire or messages may be lost.
    /// (A host that gave up may find a grant it never saw: only then.)
    AcquireAnswered,
    /// Every compare-and-set homing-node asks for is one the DC store
    /// (homing-store's memory backend, as strict as the durable ones)
    /// accepts: the record's key unchanged, its version one above the
    /// expected one.
    StoreAcceptsWrites,
    /// Every answer to a watcher carries each event after the cursor it
    /// asked from, in order, up to the cursor it returns: a watcher misses
    /// events only when refused `Trimmed`.
    WatchGapFree,
    /// A scan from start to end returns its DC's records in `(key, id)`
    /// order, none twice, every record there when it began included.
    ScanComplete,
    /// An `Inspect` returns only its key's records, in id order, and every
    /// one its DC had when it was asked (up to a page).
    InspectExact,
    /// An operator's drain of a whole DC leaves no lease that was
    /// renewable when it began unchanged at its end.
    DrainScopeComplete,
    /// A key drained under a host session stops acting before the expiry
    /// its DC froze it at, in true time: its host kills it by the deadlines
    /// it held before the renewal answer that listed it.
    FrozenKeyStopped,
}

impl Invariant {
    /// The invariant's name as printed.
    pub fn name(self) -> &'static str {
        match self {
            Invariant::SingleHolder => "single_holder",
            Invariant::HardDeadline => "hard_deadline",
            Invariant::ChainShape => "chain_shape",
            Invariant::LinkImmutable => "link_immutable",
            Invariant::TokenAcrossHolders => "token_across_holders",
            Invariant::TokenAlongChain => "token_along_chain",
            Invariant::AckedWriteSurvives => "acked_write_survives",
            Invariant::UniqueNeverReused => "unique_never_reused",
            Invariant::ResolveWasTrue => "resolve_was_true",
            Invariant::ResolveChainConsistent => "resolve_chain_consistent",
            Invariant::ReaperProgress => "reaper_progress",
            Invariant::NoLostWakeup => "no_lost_wakeup",
            Invariant::WaiterFifo => "waiter_fifo",
            Invariant::PreviousRunTrue => "previous_run_true",
            Invariant::DrainForwardedOnce => "drain_forwarded_once",
            Invariant::SuspicionClears => "suspicion_clears",
            Invariant::DcExpiredNoHolder => "dc_expired_no_holder",
            Invariant::AcquireAnswered => "acquire_answered",
            Invariant::StoreAcceptsWrites => "store_accepts_writes",
            Invariant::WatchGapFree => "watch_gap_free",
            Invariant::ScanComplete => "scan_complete",
            Invariant::InspectExact => "inspect_exact",
            Invariant::DrainScopeComplete => "drain_scope_complete",
            Invariant::FrozenKeyStopped => "frozen_key_stopped",
        }
    }
}

/// A violated invariant.
#[derive(Debug, Clone)]
pub struct Violation {
    /// Which.
    pub invariant: Invariant,
    /// The key concerned, if any.
    pub key: Option<u32>,
    /// What was seen.
    pub detail: String,
}

/// The DCs as the checkers read them: each one's durable records, whether
/// it runs, its store's clock.
pub trait DcsView {
    /// DC `d`'s store: its durable records.
    fn store(&self, d: usize) -> &MemoryDc;
    /// Whether DC `d` runs.
    fn up(&self, d: usize) -> bool;
    /// DC `d`'s store clock.
    fn clock(&self, d: usize) -> NodeClock;
}

/// What the checker may read of the world.
pub struct View<'a> {
    /// The DCs (their durable records).
    pub dcs: &'a dyn DcsView,
    /// The global store.
    pub global: &'a BTreeMap<Key, ReservationId>,
    /// The keys by index.
    pub keys: &'a [Key],
    /// DC index by name.
    pub dc_index: &'a BTreeMap<DcId, u16>,
    /// The global store's successions.
    pub successions: &'a BTreeMap<ReservationId, homing_core::Succession>,
}

impl View<'_> {
    /// The row of the host session `record` (of DC `d`) is held under, if
    /// any and if its DC still keeps it.
    pub fn session_row(&self, d: usize, record: &DcRecord) -> Option<SessionRecord> {
        self.dcs.store(d).session(record.session()?)
    }

    /// The record of `id` at its DC, with that DC's index.
    pub fn record(&self, id: &ReservationId) -> Option<(usize, &DcRecord)> {
        let d = usize::from(*self.dc_index.get(id.dc())?);
        self.dcs.store(d).record(id).map(|r| (d, r))
    }
}
