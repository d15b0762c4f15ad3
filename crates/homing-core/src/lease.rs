//! The lease timeline. A host sends its own clock reading `t` with every
//! acquire/renew; the DC stores expiry in store time (`received + ttl`) and
//! answers with deadlines in the *host's* clock:
//!
//! ```text
//! host clock:  t ──── renew_at ──── soft_terminate_at ──── hard_terminate_at ── t+ttl
//! store clock:        received ≥ t (in true time) ───────────────────────────── expires_at ── +grace: reapable
//! ```
//!
//! Because the daemon receives the request no earlier than the host sent it,
//! `t + ttl ≤ received + ttl = expires_at` in true time; the hard margin
//! absorbs clock-rate drift over one ttl, and the grace period is extra slack
//! before the DC treats the lease as gone and lets another holder in.

use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::time::{HostTime, StoreTime};

/// Longest lease a policy may grant, in milliseconds (one day).
pub const LEASE_TTL_MS_MAX: u64 = 24 * 60 * 60 * 1000;

/// A DC's lease policy. Build one with [`LeasePolicy::new`], which checks
/// that the deadlines it produces are strictly ordered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeasePolicy {
    ttl_ms: u64,
    renew_at_permille: u16,
    soft_margin_ms: u64,
    hard_margin_ms: u64,
    grace_ms: u64,
}

/// A lease policy whose deadlines would not be ordered; names the field.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum LeasePolicyError {
    /// `lease_ttl_ms` is zero or over [`LEASE_TTL_MS_MAX`].
    #[error("lease_ttl_ms must be 1..={LEASE_TTL_MS_MAX}, got {0}")]
    Ttl(u64),
    /// `renew_at_permille` is zero or not below 1000.
    #[error("renew_at_permille must be 1..=999, got {0}")]
    RenewAt(u16),
    /// `hard_margin_ms` is zero: the host would stop exactly at expiry, with no room for drift.
    #[error("hard_margin_ms must be at least 1")]
    HardMargin,
    /// `soft_margin_ms` is not above `hard_margin_ms`.
    #[error("soft_margin_ms ({soft}) must be greater than hard_margin_ms ({hard})")]
    SoftMargin {
        /// The soft margin given.
        soft: u64,
        /// The hard margin given.
        hard: u64,
    },
    /// The host would be told to renew no earlier than to stop.
    #[error(
        "renewal at {renew_at_ms} ms into the lease must come before soft termination at {soft_ms} ms (lease_ttl_ms - soft_margin_ms)"
    )]
    RenewAfterSoft {
        /// When renewal would be due, ms into the lease.
        renew_at_ms: u64,
        /// When soft termination would be due, ms into the lease.
        soft_ms: u64,
    },
}

/// When the host must act, in its own clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Deadlines {
    /// Renew at this time.
    pub renew_at: HostTime,
    /// Without a successful renewal by now, stop the actor gracefully.
    pub soft_terminate_at: HostTime,
    /// Without a successful renewal by now, kill the actor; never act after it.
    pub hard_terminate_at: HostTime,
}

/// The term one grant (acquire or renew) gives: the host's deadlines and the
/// store-time expiry the DC records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseTerm {
    /// For the host, in its clock.
    pub deadlines: Deadlines,
    /// For the DC record, in store time.
    pub expires_at: StoreTime,
}

impl LeasePolicy {
    /// 10 s leases, renewed a third of the way in, soft stop 3 s and hard stop
    /// 1 s before the host-side end, 2 s grace before the DC reaps.
    pub const DEFAULT: LeasePolicy = LeasePolicy {
        ttl_ms: 10_000,
        renew_at_permille: 333,
        soft_margin_ms: 3_000,
        hard_margin_ms: 1_000,
        grace_ms: 2_000,
    };

    /// A policy, checked so that `host_time < renew_at < soft_terminate_at <
    /// hard_terminate_at < host_time + ttl` holds for every grant.
    pub fn new(
        ttl_ms: u64,
        renew_at_permille: u16,
        soft_margin_ms: u64,
        hard_margin_ms: u64,
        grace_ms: u64,
    ) -> Result<LeasePolicy, LeasePolicyError> {
        if ttl_ms == 0 || ttl_ms > LEASE_TTL_MS_MAX {
            return Err(LeasePolicyError::Ttl(ttl_ms));
        }
        if renew_at_permille == 0 || renew_at_permille >= 1000 {
            return Err(LeasePolicyError::RenewAt(renew_at_permille));
        }
        if hard_margin_ms == 0 {
            return Err(LeasePolicyError::HardMargin);
        }
        if soft_margin_ms <= hard_margin_ms {
            return Err(LeasePolicyError::SoftMargin {
                soft: soft_margin_ms,
                hard: hard_margin_ms,
            });
        }
        let renew_at_ms = ttl_ms * u64::from(renew_at_permille) / 1000;
        let soft_ms = ttl_ms.saturating_sub(soft_margin_ms);
        if renew_at_ms == 0 || renew_at_ms >= soft_ms {
            return Err(LeasePolicyError::RenewAfterSoft {
                renew_at_ms,
                soft_ms,
            });
        }
        Ok(LeasePolicy {
            ttl_ms,
            renew_at_permille,
            soft_margin_ms,
            hard_margin_ms,
            grace_ms,
        })
    }

    /// Lease length in milliseconds.
    pub fn ttl_ms(&self) -> u64 {
        self.ttl_ms
    }

    /// When renewal is due, in thousandths of the lease.
    pub fn renew_at_permille(&self) -> u16 {
        self.renew_at_permille
    }

    /// How long before the host-side lease end the host stops gracefully, in milliseconds.
    pub fn soft_margin_ms(&self) -> u64 {
        self.soft_margin_ms
    }

    /// How long before the host-side lease end the host kills the actor, in milliseconds.
    pub fn hard_margin_ms(&self) -> u64 {
        self.hard_margin_ms
    }

    /// Slack after expiry before the DC reaps the lease, in milliseconds.
    pub fn grace_ms(&self) -> u64 {
        self.grace_ms
    }

    /// The deadlines for a request the host sent at `host_time`, received by
    /// the DC at `received`.
    pub fn grant(&self, host_time: HostTime, received: StoreTime) -> LeaseTerm {
        let renew_at_ms = self.ttl_ms * u64::from(self.renew_at_permille) / 1000;
        let deadlines = Deadlines {
            renew_at: host_time.plus_ms(renew_at_ms),
            soft_terminate_at: host_time.plus_ms(self.ttl_ms - self.soft_margin_ms),
            hard_terminate_at: host_time.plus_ms(self.ttl_ms - self.hard_margin_ms),
        };
        // Guaranteed by `new`; a crash beats telling a host the wrong order.
        // (Saturation near u64::MAX can only make them equal, never reversed.)
        assert!(deadlines.renew_at <= deadlines.soft_terminate_at);
        assert!(deadlines.soft_terminate_at <= deadlines.hard_terminate_at);
        assert!(deadlines.hard_terminate_at <= host_time.plus_ms(self.ttl_ms));
        LeaseTerm {
            deadlines,
            expires_at: received.plus_ms(self.ttl_ms),
        }
    }

    /// The deadlines, in the clock of a host that sent its request at
    /// `host_time` (received at `received`), of a hold that runs until
    /// store time `expires_at` — a key granted under a session lives as
    /// long as the session as it stood then: never later than
    /// [`LeasePolicy::grant`]'s for a hold of `expires_at − received`.
    pub fn until(
        &self,
        host_time: HostTime,
        received: StoreTime,
        expires_at: StoreTime,
    ) -> Deadlines {
        let remaining_ms = expires_at.ms_since(received).min(self.ttl_ms);
        let renew_at_ms = self.ttl_ms * u64::from(self.renew_at_permille) / 1000;
        let soft_terminate_at = host_time.plus_ms(remaining_ms.saturating_sub(self.soft_margin_ms));
        let deadlines = Deadlines {
            renew_at: host_time.plus_ms(renew_at_ms).min(soft_terminate_at),
            soft_terminate_at,
            hard_terminate_at: host_time.plus_ms(remaining_ms.saturating_sub(self.hard_margin_ms)),
        };
        assert!(deadlines.renew_at <= deadlines.soft_terminate_at);
        assert!(deadlines.soft_terminate_at <= deadlines.hard_terminate_at);
        deadlines
    }

    /// When a lease expiring at `expires_at` may be reaped: expiry plus grace.
    pub fn reapable_at(&self, expires_at: StoreTime) -> StoreTime {
        expires_at.plus_ms(self.grace_ms)
    }
}

impl Default for LeasePolicy {
    fn default() -> Self {
        LeasePolicy::DEFAULT
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn default_policy_is_valid() {
        let d = LeasePolicy::DEFAULT;
        assert_eq!(
            LeasePolicy::new(
                d.ttl_ms,
                d.renew_at_permille,
                d.soft_margin_ms,
                d.hard_margin_ms,
                d.grace_ms
            ),
            Ok(d)
        );
    }

    #[test]
    fn grant_puts_deadlines_in_host_clock_and_expiry_in_store_clock() {
        // The host's clock is an hour behind the store's: irrelevant.
        let grant =
            LeasePolicy::DEFAULT.grant(HostTime::from_ms(1_000), StoreTime::from_ms(3_601_000));
        assert_eq!(grant.deadlines.renew_at, HostTime::from_ms(1_000 + 3_330));
        assert_eq!(
            grant.deadlines.soft_terminate_at,
            HostTime::from_ms(1_000 + 7_000)
        );
        assert_eq!(
            grant.deadlines.hard_terminate_at,
            HostTime::from_ms(1_000 + 9_000)
        );
        assert_eq!(grant.expires_at, StoreTime::from_ms(3_611_000));
        assert_eq!(
            LeasePolicy::DEFAULT.reapable_at(grant.expires_at),
            StoreTime::from_ms(3_613_000)
        );
    }

    #[test]
    fn policy_rejects_misordered_margins_naming_the_field() {
        assert_eq!(
            LeasePolicy::new(0, 333, 3, 1, 0),
            Err(LeasePolicyError::Ttl(0))
        );
        assert_eq!(
            LeasePolicy::new(10_000, 1000, 3, 1, 0),
            Err(LeasePolicyError::RenewAt(1000))
        );
        assert_eq!(
            LeasePolicy::new(10_000, 333, 3, 0, 0),
            Err(LeasePolicyError::HardMargin)
        );
        assert!(matches!(
            LeasePolicy::new(10_000, 333, 1, 1, 0),
            Err(LeasePolicyError::SoftMargin { .. })
        ));
        let err = LeasePolicy::new(10_000, 900, 3_000, 1_000, 0).unwrap_err();
        assert!(err.to_string().contains("soft termination"), "{err}");
    }

    proptest! {
        #[test]
        fn every_valid_policy_orders_its_deadlines(
            ttl in 1..=LEASE_TTL_MS_MAX, permille in 1u16..1000, soft in 0u64..100_000,
            hard in 0u64..100_000, grace in 0u64..100_000, host in any::<u64>(), store in any::<u64>(),
        ) {
            if let Ok(policy) = LeasePolicy::new(ttl, permille, soft, hard, grace) {
                let host = HostTime::from_ms(host / 2);
                let grant = policy.grant(host, StoreTime::from_ms(store / 2));
                let d = grant.deadlines;
                prop_assert!(host < d.renew_at);
                prop_assert!(d.renew_at < d.soft_terminate_at);
                prop_assert!(d.soft_terminate_at < d.hard_terminate_at);
                prop_assert!(d.hard_terminate_at < host.plus_ms(ttl));
                prop_assert!(policy.reapable_at(grant.expires_at) >= grant.expires_at);
            }
        }
    }
}
