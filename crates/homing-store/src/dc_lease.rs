//! DC leases for the stores that judge them in this process (memory, redb):
//! what each DC published, and when this process received its last renewal,
//! by this process's monotonic clock (DESIGN.md §7.5).
//!
//! A store that restarts has no renewal times: it counts every DC it knows
//! as renewed at the moment it opened, so no DC's lease is called expired
//! before a whole `expires_after` has passed in this process — the store
//! never shortens a lease by restarting.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use homing_core::{DcId, DcLeaseState, DcMarks, DcRenewal, DcStanding, DcTerms};
use serde::{Deserialize, Serialize};

/// The store's clock for DC leases: monotonic milliseconds.
pub type LeaseClock = Arc<dyn Fn() -> u64 + Send + Sync>;

/// The process's monotonic clock, in ms since the first call.
pub fn process_clock() -> LeaseClock {
    let start = Instant::now();
    Arc::new(move || start.elapsed().as_millis() as u64)
}

/// What a durable store keeps about one DC (renewal times are not kept).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct DcEntry {
    /// The terms of the last renewal.
    pub terms: Option<DcTerms>,
    /// The published marks.
    pub marks: DcMarks,
    /// Retired by an operator.
    pub retired: bool,
}

impl DcEntry {
    /// The entry after a renewal under `terms` with `marks`; `None` for a retired DC.
    pub fn renewed(&self, terms: DcTerms, marks: DcMarks) -> Option<DcEntry> {
        (!self.retired).then_some(DcEntry {
            terms: Some(terms),
            marks: self.marks.max(marks),
            retired: false,
        })
    }

    /// The entry after its DC is retired.
    pub fn retire(&self) -> DcEntry {
        DcEntry {
            retired: true,
            ..*self
        }
    }

    /// The state a reader sees, `since_ms` after the last renewal was received
    /// (`None`: never renewed).
    pub fn state(&self, dc: &DcId, since_ms: Option<u64>) -> DcLeaseState {
        let standing = match (self.terms, since_ms) {
            (Some(terms), Some(since)) => DcStanding::judge(&terms, since),
            _ => DcStanding::Unknown,
        };
        DcLeaseState {
            dc: dc.clone(),
            standing,
            terms: self.terms,
            marks: self.marks,
            retired: self.retired,
        }
    }
}

/// The DC leases one process judges: entries and their renewal times.
pub struct DcLeaseTable {
    clock: LeaseClock,
    dcs: BTreeMap<DcId, (DcEntry, Option<u64>)>,
}

impl DcLeaseTable {
    /// A table over `entries` as a store kept them, each counted as renewed now.
    pub fn new(clock: LeaseClock, entries: impl IntoIterator<Item = (DcId, DcEntry)>) -> Self {
        let now = clock();
        let dcs = entries
            .into_iter()
            .map(|(dc, entry)| {
                let renewed = entry.terms.map(|_| now);
                (dc, (entry, renewed))
            })
            .collect();
        DcLeaseTable { clock, dcs }
    }

    /// The entry of `dc` (default: never heard of).
    pub fn entry(&self, dc: &DcId) -> DcEntry {
        self.dcs.get(dc).map(|(e, _)| *e).unwrap_or_default()
    }

    /// Whether `dc` has an entry.
    pub fn known(&self, dc: &DcId) -> bool {
        self.dcs.contains_key(dc)
    }

    /// Records `entry` for `dc`; `renewed`: it was a renewal received now.
    pub fn put(&mut self, dc: &DcId, entry: DcEntry, renewed: bool) {
        let now = (self.clock)();
        let slot = self.dcs.entry(dc.clone()).or_default();
        slot.0 = entry;
        if renewed {
            slot.1 = Some(now);
        }
    }

    /// The renewal's answer for an entry that [`DcEntry::renewed`] made.
    pub fn renewal(entry: Option<DcEntry>) -> DcRenewal {
        match entry {
            Some(e) => DcRenewal::Renewed(e.marks),
            None => DcRenewal::Retired,
        }
    }

    /// What a reader sees of `dc` now.
    pub fn state(&self, dc: &DcId) -> DcLeaseState {
        let now = (self.clock)();
        match self.dcs.get(dc) {
            Some((entry, renewed)) => entry.state(dc, renewed.map(|at| now.saturating_sub(at))),
            None => DcLeaseState::unknown(dc.clone()),
        }
    }

    /// Every DC known, in id order.
    pub fn states(&self) -> Vec<DcLeaseState> {
        self.dcs.keys().map(|dc| self.state(dc)).collect()
    }
}
