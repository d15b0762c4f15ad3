//! The global store as the simulator keeps it: each key's entry (written
//! once) and when it landed, the successions (DESIGN.md §7.5) by the
//! reservation succeeded, what it keeps of each DC's lease (as
//! homing-store's lease table does), and when a DC cannot reach it
//! (`cut_from_global` faults). It answers reads and decides writes at the
//! instant they land; the latency of each, and what a DC learns from it,
//! are the DC's (`dc/mod.rs`, `dc/lease.rs`).

use std::collections::BTreeMap;

use homing_core::succession::judge_takeover;
use homing_core::{
    DcId, DcLeaseState, DcMarks, DcStanding, DcTerms, Key, ReservationId, Succession,
    TakeOverReply, TakeoverPolicy,
};

use crate::rng::Rng;

/// What the global store keeps about one DC's lease.
#[derive(Debug, Clone, Default)]
pub struct StoreDcLease {
    /// When it received the last renewal, true µs (`None`: never).
    pub received_us: Option<u64>,
    /// The terms of that renewal.
    pub terms: Option<DcTerms>,
    /// The published marks.
    pub marks: DcMarks,
}

impl StoreDcLease {
    /// How the store judges the lease at true time `now_us`.
    pub fn standing(&self, now_us: u64) -> DcStanding {
        match (self.terms, self.received_us) {
            (Some(terms), Some(at)) => DcStanding::judge(&terms, now_us.saturating_sub(at) / 1000),
            _ => DcStanding::Unknown,
        }
    }
}

/// A DC cut off from the global store from `start_us` to `end_us` (true time).
#[derive(Debug, Clone)]
pub struct GlobalCut {
    /// The DC cut off.
    pub dc: DcId,
    /// When the cut begins, µs.
    pub start_us: u64,
    /// When it ends, µs.
    pub end_us: u64,
}

/// The simulated global store.
#[derive(Debug)]
pub struct GlobalStore {
    /// Each key's entry: the reservation that created the key.
    entries: BTreeMap<Key, ReservationId>,
    /// When each entry landed (true µs), for lagging nearest reads.
    landed_us: BTreeMap<Key, u64>,
    /// How far behind a nearest replica may be, µs.
    nearest_lag_us: u64,
    /// The successions, by the reservation succeeded.
    successions: BTreeMap<ReservationId, Succession>,
    /// Each DC's lease as the store keeps it.
    leases: BTreeMap<DcId, StoreDcLease>,
    /// When which DC cannot reach the store.
    cuts: Vec<GlobalCut>,
}

impl GlobalStore {
    /// An empty store for the DCs `dcs`, whose nearest replicas lag up to
    /// `nearest_lag_ms`, unreachable from a DC during its `cuts`.
    pub fn new<'a>(
        dcs: impl IntoIterator<Item = &'a DcId>,
        nearest_lag_ms: f64,
        cuts: Vec<GlobalCut>,
    ) -> GlobalStore {
        GlobalStore {
            entries: BTreeMap::new(),
            landed_us: BTreeMap::new(),
            nearest_lag_us: (nearest_lag_ms * 1000.0) as u64,
            successions: BTreeMap::new(),
            leases: dcs
                .into_iter()
                .map(|dc| (dc.clone(), StoreDcLease::default()))
                .collect(),
            cuts,
        }
    }

    /// Every key's entry.
    pub fn entries(&self) -> &BTreeMap<Key, ReservationId> {
        &self.entries
    }

    /// Every succession, by the reservation succeeded.
    pub fn successions(&self) -> &BTreeMap<ReservationId, Succession> {
        &self.successions
    }

    /// Whether DC `dc` is cut off from the store at true time `now_us`.
    pub fn cut_off(&self, dc: &DcId, now_us: u64) -> bool {
        (self.cuts.iter()).any(|c| &c.dc == dc && c.start_us <= now_us && now_us < c.end_us)
    }

    /// `key`'s entry as a read at `now_us` finds it; a `nearest` read
    /// misses an entry that landed less than a draw from
    /// `0..=nearest_lag` ago (`true`: it missed one).
    pub fn entry(
        &self,
        key: &Key,
        nearest: bool,
        now_us: u64,
        rng: &mut Rng,
    ) -> (Option<ReservationId>, bool) {
        let entry = self.entries.get(key).cloned();
        if !nearest || entry.is_none() {
            return (entry, false);
        }
        let missed = match self.landed_us.get(key) {
            Some(&landed) if self.nearest_lag_us > 0 => {
                now_us < landed + rng.below(self.nearest_lag_us + 1)
            }
            _ => false,
        };
        match missed {
            true => (None, true),
            false => (entry, false),
        }
    }

    /// Writes `id` as `key`'s entry at `now_us` unless it has one: the
    /// entry it had (`None`: `id` landed).
    pub fn set_if_absent(
        &mut self,
        key: &Key,
        id: &ReservationId,
        now_us: u64,
    ) -> Option<ReservationId> {
        let existing = self.entries.get(key).cloned();
        if existing.is_none() {
            self.entries.insert(key.clone(), id.clone());
            self.landed_us.insert(key.clone(), now_us);
        }
        existing
    }

    /// Records `succession` unless one of its reservation is recorded: the
    /// succession recorded now.
    pub fn confirm(&mut self, succession: &Succession) -> Succession {
        self.successions
            .entry(succession.link.from.clone())
            .or_insert_with(|| succession.clone())
            .clone()
    }

    /// A takeover: `succession` recorded if homing-core's judgement allows
    /// it under `policy` at `now_us` (`None`: taken), else why not.
    pub fn take_over(
        &mut self,
        succession: &Succession,
        policy: TakeoverPolicy,
        now_us: u64,
    ) -> Option<TakeOverReply> {
        let from = succession.link.from.clone();
        let state = self.lease_state(from.dc(), now_us);
        let existing = self.successions.get(&from).cloned();
        let reply = judge_takeover(existing, state, policy, succession);
        if reply.is_none() {
            self.successions.insert(from, succession.clone());
        }
        reply
    }

    /// The succession of `id`, if one is recorded.
    pub fn successor(&self, id: &ReservationId) -> Option<Succession> {
        self.successions.get(id).cloned()
    }

    /// A page of DC `dc`'s successions, after `after`.
    pub fn successions_of(
        &self,
        dc: &DcId,
        after: Option<ReservationId>,
        limit: usize,
    ) -> Vec<Succession> {
        let start = after.map_or(0, |a| a.unique().saturating_add(1));
        let range =
            ReservationId::new(dc.clone(), start)..=ReservationId::new(dc.clone(), u64::MAX);
        (self.successions.range(range).take(limit))
            .map(|(_, s)| s.clone())
            .collect()
    }

    /// What the store keeps of DC `dc`'s lease (`None`: not a DC of the
    /// simulation).
    pub fn lease(&self, dc: &DcId) -> Option<&StoreDcLease> {
        self.leases.get(dc)
    }

    /// A renewal of DC `dc`'s lease lands at `now_us`: its receipt, terms
    /// and marks are kept (marks never go down); the marks kept now.
    pub fn renew(&mut self, dc: &DcId, terms: DcTerms, marks: DcMarks, now_us: u64) -> DcMarks {
        // Invariant: the store keeps a lease for every DC of the simulation.
        let kept = self.leases.get_mut(dc).expect("a dc of the simulation");
        kept.received_us = Some(now_us);
        kept.terms = Some(terms);
        kept.marks = kept.marks.max(marks);
        kept.marks
    }

    /// How the store judges DC `dc`'s lease at `now_us`.
    pub fn lease_state(&self, dc: &DcId, now_us: u64) -> DcLeaseState {
        let Some(kept) = self.leases.get(dc) else {
            return DcLeaseState::unknown(dc.clone());
        };
        DcLeaseState {
            dc: dc.clone(),
            standing: kept.standing(now_us),
            terms: kept.terms,
            marks: kept.marks,
            retired: false,
        }
    }
}
