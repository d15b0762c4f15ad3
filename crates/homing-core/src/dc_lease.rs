//! The DC lease (DESIGN.md §7.5): a DC grants and renews host leases only
//! while the global store keeps its DC lease alive, and the global store
//! keeps, per DC, the marks that make a DC restarted on an empty or old
//! store detectable.
//!
//! ```text
//! DC clock:     sent ── renewed ─────────────── valid_until = sent + ttl − margin
//! store clock:       received ──── live (ttl) ────┬── lapsed (host ttl max + grace) ──┬── expired
//!                                                 no host of the DC still acts ───────┘
//! ```
//!
//! The store judges expiry by its own clock from the moment it received the
//! renewal; the DC judges its validity by its own monotonic clock from the
//! moment it sent it. The DC received nothing before it sent, so its view
//! ends first (the margin absorbs clock-rate drift); no clock is compared
//! across machines. A host lease is granted only when its whole ttl fits in
//! the DC's validity, so no host of the DC acts once the store judges the DC
//! lease expired.
//!
//! Marks: every reservation unique the DC ever used is at most
//! `allocator_floor`, and every fencing token it ever granted is at most
//! `token_bound`. The DC publishes a mark with a renewal before it writes a
//! record above it; marks never go down. A DC whose store's own allocator
//! bound is below the published floor lost its store (wiped, or restored
//! from an old backup) and must not serve: it would hand out IDs that
//! existing entries and links already name.

use serde::{Deserialize, Serialize};

use crate::dc::DcId;
use crate::fencing::FencingToken;

/// What a DC asks the global store to keep with each renewal: how long its
/// lease lives without one, and how long its hosts may act after that.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct DcTerms {
    /// The DC lease's life after the store received a renewal, ms.
    pub ttl_ms: u64,
    /// The longest host lease the DC grants, ms.
    pub host_lease_ttl_max_ms: u64,
    /// Extra slack before the store calls the lease expired, ms.
    pub grace_ms: u64,
}

impl DcTerms {
    /// How long after receiving a renewal the store calls the lease
    /// expired: its ttl, then the longest host lease, then grace. Saturates.
    pub fn expires_after_ms(&self) -> u64 {
        self.ttl_ms
            .saturating_add(self.host_lease_ttl_max_ms)
            .saturating_add(self.grace_ms)
    }

    /// The DC's own view: how long after *sending* a renewal that was
    /// acknowledged the DC may count on its lease, ms — the ttl less a
    /// twentieth (at least 100 ms) for clock-rate drift.
    pub fn valid_for_ms(&self) -> u64 {
        self.ttl_ms.saturating_sub((self.ttl_ms / 20).max(100))
    }
}

/// The marks a DC publishes: upper bounds on what it ever used, and how far
/// its store had got.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct DcMarks {
    /// Every reservation unique the DC used is at most this.
    pub allocator_floor: u64,
    /// Every fencing token the DC granted is at most this.
    pub token_bound: u64,
    /// The DC store's event-log head at the DC's last renewal but one or so
    /// (published with renewals, not before writes): a store whose head is
    /// below it was restored from a backup older than that.
    pub event_head: u64,
}

impl DcMarks {
    /// Each mark the larger of the two: marks never go down.
    pub fn max(self, other: DcMarks) -> DcMarks {
        DcMarks {
            allocator_floor: self.allocator_floor.max(other.allocator_floor),
            token_bound: self.token_bound.max(other.token_bound),
            event_head: self.event_head.max(other.event_head),
        }
    }

    /// Whether these marks cover a record with `unique` and `token`.
    pub fn cover(&self, unique: u64, token: FencingToken) -> bool {
        unique <= self.allocator_floor && token.get() <= self.token_bound
    }

    /// Whether the marks that bound writes (allocator floor, token bound)
    /// are at least `other`'s; the event head only follows the store.
    pub fn at_least(&self, other: &DcMarks) -> bool {
        self.allocator_floor >= other.allocator_floor && self.token_bound >= other.token_bound
    }
}

/// How the global store judges a DC's lease now, by its own clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum DcStanding {
    /// The DC never renewed a lease here.
    Unknown,
    /// Renewed within its ttl: the DC may grant.
    Live {
        /// Of the ttl, ms.
        remaining_ms: u64,
    },
    /// Past its ttl: the DC grants nothing, and its hosts stop by their deadlines.
    Lapsed {
        /// Until the store calls it expired, ms.
        expires_in_ms: u64,
    },
    /// Past its ttl, the longest host lease and grace: no host of the DC acts.
    Expired,
}

impl DcStanding {
    /// The standing `since_ms` after the store received the last renewal under `terms`.
    pub fn judge(terms: &DcTerms, since_ms: u64) -> DcStanding {
        if since_ms < terms.ttl_ms {
            DcStanding::Live {
                remaining_ms: terms.ttl_ms - since_ms,
            }
        } else if since_ms < terms.expires_after_ms() {
            DcStanding::Lapsed {
                expires_in_ms: terms.expires_after_ms() - since_ms,
            }
        } else {
            DcStanding::Expired
        }
    }
}

/// What the global store knows about one DC.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DcLeaseState {
    /// The DC.
    pub dc: DcId,
    /// Its lease, judged now.
    pub standing: DcStanding,
    /// The terms of its last renewal (`None`: never renewed).
    pub terms: Option<DcTerms>,
    /// Its published marks (zero: none yet).
    pub marks: DcMarks,
    /// Retired by an operator: its lease is refused from then on.
    pub retired: bool,
}

impl DcLeaseState {
    /// The standing in words, as `homing dc status` and the status page
    /// show it: "live, 18.2 s left", "lapsed, expires in 3.0 s", "expired",
    /// "never held", each inside "retired (…)" once retired.
    pub fn words(&self) -> String {
        let standing = match self.standing {
            DcStanding::Unknown => "never held".to_string(),
            DcStanding::Live { remaining_ms } => {
                format!("live, {:.1} s left", remaining_ms as f64 / 1000.0)
            }
            DcStanding::Lapsed { expires_in_ms } => {
                format!("lapsed, expires in {:.1} s", expires_in_ms as f64 / 1000.0)
            }
            DcStanding::Expired => "expired".to_string(),
        };
        match self.retired {
            true => format!("retired ({standing})"),
            false => standing,
        }
    }

    /// A DC the store has never heard of.
    pub fn unknown(dc: DcId) -> DcLeaseState {
        DcLeaseState {
            dc,
            standing: DcStanding::Unknown,
            terms: None,
            marks: DcMarks::default(),
            retired: false,
        }
    }
}

/// What a renewal did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum DcRenewal {
    /// Renewed; the marks the store keeps now (at least the ones sent).
    Renewed(DcMarks),
    /// The DC was retired: no lease, ever again.
    Retired,
}

#[cfg(test)]
mod tests {
    use super::*;

    const TERMS: DcTerms = DcTerms {
        ttl_ms: 20_000,
        host_lease_ttl_max_ms: 10_000,
        grace_ms: 2_000,
    };

    #[test]
    fn standing_moves_from_live_to_lapsed_to_expired() {
        assert_eq!(
            DcStanding::judge(&TERMS, 0),
            DcStanding::Live {
                remaining_ms: 20_000
            }
        );
        assert_eq!(
            DcStanding::judge(&TERMS, 20_000),
            DcStanding::Lapsed {
                expires_in_ms: 12_000
            }
        );
        assert_eq!(
            DcStanding::judge(&TERMS, 31_999),
            DcStanding::Lapsed { expires_in_ms: 1 }
        );
        assert_eq!(DcStanding::judge(&TERMS, 32_000), DcStanding::Expired);
    }

    #[test]
    fn the_dc_counts_on_less_than_the_store_keeps() {
        assert_eq!(TERMS.valid_for_ms(), 19_000);
        let short = DcTerms {
            ttl_ms: 1_000,
            ..TERMS
        };
        assert_eq!(short.valid_for_ms(), 900);
        assert!(TERMS.valid_for_ms() < TERMS.ttl_ms);
    }

    #[test]
    fn marks_never_go_down_and_cover_what_is_below_them() {
        let a = DcMarks {
            allocator_floor: 10,
            token_bound: 5,
            event_head: 7,
        };
        let b = DcMarks {
            allocator_floor: 3,
            token_bound: 9,
            event_head: 2,
        };
        let m = a.max(b);
        assert_eq!(
            m,
            DcMarks {
                allocator_floor: 10,
                token_bound: 9,
                event_head: 7
            }
        );
        assert!(m.at_least(&a) && m.at_least(&b) && !a.at_least(&m));
        assert!(m.cover(10, FencingToken::new(9)));
        assert!(!m.cover(11, FencingToken::new(1)));
        assert!(!m.cover(1, FencingToken::new(10)));
    }
}
