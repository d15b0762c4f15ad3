//! DC leases for the stores that judge them in this process (memory, redb):
//! what each DC published, and when this process received its last renewal,
//! by this process's monotonic clock (DESIGN.md §7.5).
//!
//! [`Sightings`] serves a store whose own clock may jump ahead (FDB's
//! versions, across a recovery): how long this process has known a renewal,
//! a bound that never runs ahead of the store.
//!
//! A store that restarts has no renewal times: it counts every DC it knows
//! as renewed at the moment it opened, so no DC's lease is called expired
//! before a whole `expires_after` has passed in this process — the store
//! never shortens a lease by restarting.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
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
    /// The entry after a renewal under `terms` with `marks`; `None` for a
    /// retired DC. The ttl is the renewal's, but the longest host lease and
    /// the grace are the largest any renewal of the DC named: a DC restarted
    /// with shorter host leases may still have hosts acting under the longer
    /// ones, so the store never calls its lease expired sooner than those
    /// allow.
    pub fn renewed(&self, terms: DcTerms, marks: DcMarks) -> Option<DcEntry> {
        let terms = match self.terms {
            Some(kept) => DcTerms {
                ttl_ms: terms.ttl_ms,
                host_lease_ttl_max_ms: terms.host_lease_ttl_max_ms.max(kept.host_lease_ttl_max_ms),
                grace_ms: terms.grace_ms.max(kept.grace_ms),
            },
            None => terms,
        };
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

/// When this process first saw each DC's last renewal (identified by `S`,
/// e.g. a versionstamp), by its clock: the renewal was received no later,
/// so the time since is never more than the store's.
pub struct Sightings<S> {
    clock: LeaseClock,
    sightings_max: usize,
    seen: Mutex<BTreeMap<DcId, (S, u64)>>,
}

impl<S: Copy + Eq> Sightings<S> {
    /// No renewal seen yet; remembers at most `sightings_max` DCs (past
    /// it, one is forgotten and its renewal counted as seen anew: a later
    /// expiry, never an earlier one).
    pub fn new(clock: LeaseClock, sightings_max: usize) -> Self {
        assert!(sightings_max > 0, "sightings_max must be at least 1");
        Sightings {
            clock,
            sightings_max,
            seen: Mutex::default(),
        }
    }

    /// Ms since this process first saw `dc`'s renewal `renewal` (0: now).
    pub fn since_ms(&self, dc: &DcId, renewal: S) -> u64 {
        let now = (self.clock)();
        // Every change is one insert or removal: a poisoned map is consistent.
        let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        match seen.get(dc) {
            Some((known, at)) if *known == renewal => now.saturating_sub(*at),
            _ => {
                if seen.len() >= self.sightings_max && !seen.contains_key(dc) {
                    seen.pop_first();
                }
                seen.insert(dc.clone(), (renewal, now));
                0
            }
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

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU64, Ordering};

    use super::*;

    #[test]
    fn a_renewal_is_as_old_as_this_process_has_known_it() {
        let now = Arc::new(AtomicU64::new(100));
        let clock = now.clone();
        let sightings = Sightings::new(Arc::new(move || clock.load(Ordering::SeqCst)), 1);
        let (iad, fra) = (DcId::new("iad").unwrap(), DcId::new("fra").unwrap());
        assert_eq!(sightings.since_ms(&iad, 1u8), 0);
        now.store(40_100, Ordering::SeqCst);
        assert_eq!(sightings.since_ms(&iad, 1), 40_000);
        // A new renewal: known from now on.
        assert_eq!(sightings.since_ms(&iad, 2), 0);
        now.store(41_100, Ordering::SeqCst);
        assert_eq!(sightings.since_ms(&iad, 2), 1_000);
        // Full: another DC pushes iad out, which then counts as seen anew.
        assert_eq!(sightings.since_ms(&fra, 1), 0);
        now.store(50_000, Ordering::SeqCst);
        assert_eq!(sightings.since_ms(&iad, 2), 0);
    }

    #[test]
    fn a_renewal_with_shorter_host_leases_keeps_the_longest_horizon() {
        let long = DcTerms {
            ttl_ms: 120_000,
            host_lease_ttl_max_ms: 60_000,
            grace_ms: 2_000,
        };
        let short = DcTerms {
            ttl_ms: 20_000,
            host_lease_ttl_max_ms: 10_000,
            grace_ms: 1_000,
        };
        let entry = DcEntry::default()
            .renewed(long, DcMarks::default())
            .unwrap();
        let after = entry.renewed(short, DcMarks::default()).unwrap();
        let kept = after.terms.unwrap();
        assert_eq!(
            (kept.ttl_ms, kept.host_lease_ttl_max_ms, kept.grace_ms),
            (20_000, 60_000, 2_000)
        );
    }
}
