//! The host's side of one lease as a sans-IO stepper: the timeline a grant
//! gives, renewals bounded by the soft deadline, and the stop rules.
//! homing-client's `HostAgent` and the simulator's hosts both drive it, so
//! the simulator checks the rules hosts really run.
//!
//! Clocks: deadlines arrive in the host's clock ([`HostTime`], the reading
//! the host sent), and the stepper turns each into an instant of the host's
//! monotonic clock ([`HostInstant`]): a deadline `d` answering a request
//! sent at host time `t` and instant `i` falls at `i + (d - t)`. So a host
//! clock that jumps cannot stretch a lease, and nothing is compared with
//! another machine's clock.
//!
//! ```text
//! renew_at: Renew ─ fails ─► retry every retry interval ─► … while before soft_terminate_at
//! soft_terminate_at: SoftTerminate (once), no more renewals
//! hard_terminate_at: HardTerminate(HardDeadline) — 1 ms early, so the actor never acts at it
//! Renew answered Draining: no more renewals, stop at the deadlines already held
//! Renew answered StaleToken / Expired: another holder may exist, HardTerminate(Lost) now
//! a renewal answered at or after soft_terminate_at: too late, ignored
//! ```

use crate::lease::Deadlines;
use crate::record::RenewReply;
use crate::time::HostTime;

/// How many times a host sends one acquire when no answer arrives in time
/// (the same lease key every time, then a cancel): HostAgent's default, and
/// the simulated hosts'.
pub const ACQUIRE_ATTEMPTS_DEFAULT: u32 = 3;

/// How long a host waits for the answer to one acquire, renew or release,
/// in milliseconds: HostAgent's default, and the simulated hosts' (and
/// DCs' towards their peers: homingd's `peer_timeout_ms` default).
pub const REQUEST_TIMEOUT_MS_DEFAULT: u64 = 2_000;

/// The host kills its actor this long before the hard deadline's instant:
/// [`HostTime`] counts milliseconds, so no reading of the host clock at which
/// the actor still acts is at or after `hard_terminate_at`.
pub const HARD_KILL_LEAD_US: u64 = 1_000;

/// A reading of the host's monotonic clock, in microseconds from the
/// driver's origin (only differences between readings of one host mean
/// anything).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct HostInstant(u64);

impl HostInstant {
    /// The reading `us` microseconds after the origin.
    pub const fn from_us(us: u64) -> HostInstant {
        HostInstant(us)
    }

    /// Microseconds since the origin.
    pub const fn as_us(self) -> u64 {
        self.0
    }

    /// This instant plus `us` microseconds, saturating.
    pub const fn plus_us(self, us: u64) -> HostInstant {
        HostInstant(self.0.saturating_add(us))
    }

    /// Microseconds from `earlier` to `self`, zero if `earlier` is later.
    pub const fn us_since(self, earlier: HostInstant) -> u64 {
        self.0.saturating_sub(earlier.0)
    }
}

/// The deadlines of a lease as instants of the host's monotonic clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timeline {
    /// Renew from here on.
    pub renew_at: HostInstant,
    /// Without a renewal by here, stop the actor gracefully.
    pub soft_at: HostInstant,
    /// Without a renewal by here, the actor must be dead.
    pub hard_at: HostInstant,
}

impl Timeline {
    /// `deadlines` answered a request sent at host time `sent` and instant
    /// `sent_at`. A DC whose deadlines are out of order is hostile or
    /// broken: the ordering the actor relies on is kept by pulling the
    /// later ones in to the hard deadline.
    pub fn new(deadlines: &Deadlines, sent: HostTime, sent_at: HostInstant) -> Timeline {
        let at = |d: HostTime| sent_at.plus_us(d.ms_since(sent).saturating_mul(1000));
        let hard_at = at(deadlines.hard_terminate_at);
        Timeline {
            renew_at: at(deadlines.renew_at).min(hard_at),
            soft_at: at(deadlines.soft_terminate_at).min(hard_at),
            hard_at,
        }
    }

    /// When the actor is killed: [`HARD_KILL_LEAD_US`] before `hard_at`.
    pub fn kill_at(&self) -> HostInstant {
        HostInstant(self.hard_at.0.saturating_sub(HARD_KILL_LEAD_US))
    }
}

/// A grant that arrived at or after its soft deadline: too late to start an
/// actor on. The driver releases it and reports the acquire as failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LateGrant {
    /// The grant's timeline.
    pub timeline: Timeline,
}

/// Why the actor must stop now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HardCause {
    /// The hard deadline came without a renewal.
    HardDeadline,
    /// The DC answered a renewal `StaleToken` or `Expired`: another holder may exist.
    Lost,
}

impl HardCause {
    /// Why, in words, for logs.
    pub fn as_str(self) -> &'static str {
        match self {
            HardCause::HardDeadline => "hard deadline passed without a renewal",
            HardCause::Lost => "the dc says another holder may exist",
        }
    }
}

/// What the driver must do next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HostLeasePoll {
    /// Send a `Renew` now, stamped with the host clock; it must be answered
    /// by `by` (an answer later than that is too late): give up on it then
    /// and hand [`HostLease::handle_renew`] `None`.
    Renew {
        /// The soft deadline.
        by: HostInstant,
    },
    /// Tell the actor to stop gracefully. Returned once.
    SoftTerminate,
    /// Kill the actor now; the lease is over. Returned from then on.
    HardTerminate(HardCause),
    /// Nothing to do before `until`, unless an answer arrives first.
    Wait {
        /// The next deadline.
        until: HostInstant,
    },
}

/// What an answer to a renewal did, for the driver's logs and counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Renewal {
    /// New deadlines.
    Moved(Timeline),
    /// The key is drained: no more renewals, stop by the deadlines held.
    Draining,
    /// Another holder may exist: the next poll hard-terminates.
    Lost,
    /// No answer, or a refusal: retried after the retry interval if that is
    /// still before the soft deadline.
    Failed {
        /// When the retry is due (`None`: no retry, the soft deadline comes first).
        retry_at: Option<HostInstant>,
    },
    /// Answered at or after the soft deadline, or after the lease was over: ignored.
    TooLate,
}

/// The host's side of one lease. See the module docs.
#[derive(Debug, Clone)]
pub struct HostLease {
    timeline: Timeline,
    retry_interval_us: u64,
    next_renew: Option<HostInstant>,
    renewing: bool,
    soft_done: bool,
    over: Option<HardCause>,
}

impl HostLease {
    /// The lease a grant gave: `deadlines` answered an acquire sent at host
    /// time `sent` and instant `sent_at`; `now` is when the answer arrived.
    /// Refuses a grant that is already at or past its soft deadline.
    pub fn start(
        deadlines: &Deadlines,
        sent: HostTime,
        sent_at: HostInstant,
        now: HostInstant,
        retry_interval_ms: u64,
    ) -> Result<HostLease, LateGrant> {
        let timeline = Timeline::new(deadlines, sent, sent_at);
        if now >= timeline.soft_at {
            return Err(LateGrant { timeline });
        }
        Ok(HostLease {
            timeline,
            retry_interval_us: retry_interval_ms.saturating_mul(1000),
            next_renew: Some(timeline.renew_at),
            renewing: false,
            soft_done: false,
            over: None,
        })
    }

    /// The current deadlines.
    pub fn timeline(&self) -> Timeline {
        self.timeline
    }

    /// Whether the actor has been told to stop gracefully.
    pub fn soft_terminated(&self) -> bool {
        self.soft_done
    }

    /// What to do at `now`. Call it again after every action it returns and
    /// after every answer.
    pub fn poll(&mut self, now: HostInstant) -> HostLeasePoll {
        if let Some(cause) = self.over {
            return HostLeasePoll::HardTerminate(cause);
        }
        if now >= self.timeline.kill_at() {
            self.over = Some(HardCause::HardDeadline);
            return HostLeasePoll::HardTerminate(HardCause::HardDeadline);
        }
        if now >= self.timeline.soft_at && !self.soft_done {
            self.soft_done = true;
            self.next_renew = None;
            return HostLeasePoll::SoftTerminate;
        }
        if let Some(at) = self.next_renew.filter(|at| now >= *at && !self.renewing) {
            debug_assert!(at < self.timeline.soft_at);
            self.renewing = true;
            return HostLeasePoll::Renew {
                by: self.timeline.soft_at,
            };
        }
        let mut until = self.timeline.kill_at();
        if !self.soft_done {
            until = until.min(self.timeline.soft_at);
        }
        if let Some(at) = self.next_renew.filter(|_| !self.renewing) {
            until = until.min(at);
        }
        HostLeasePoll::Wait { until }
    }

    /// The answer to the renewal [`HostLeasePoll::Renew`] asked for, sent at
    /// host time `sent` and instant `sent_at`, arriving at `now`; `None`
    /// when there was no answer in time or the DC refused the request.
    pub fn handle_renew(
        &mut self,
        reply: Option<RenewReply>,
        sent: HostTime,
        sent_at: HostInstant,
        now: HostInstant,
    ) -> Renewal {
        self.renewing = false;
        if self.over.is_some() || now >= self.timeline.soft_at {
            return Renewal::TooLate;
        }
        match reply {
            Some(RenewReply::Renewed(deadlines)) => {
                self.timeline = Timeline::new(&deadlines, sent, sent_at);
                self.next_renew = Some(self.timeline.renew_at);
                Renewal::Moved(self.timeline)
            }
            Some(RenewReply::Draining) => {
                self.next_renew = None;
                Renewal::Draining
            }
            Some(RenewReply::StaleToken { .. } | RenewReply::Expired | RenewReply::NotHolder) => {
                self.over = Some(HardCause::Lost);
                Renewal::Lost
            }
            None => {
                let retry = now.plus_us(self.retry_interval_us);
                let retry_at = (retry < self.timeline.soft_at).then_some(retry);
                self.next_renew = retry_at;
                Renewal::Failed { retry_at }
            }
        }
    }

    /// Nobody will release the lease (the owner is gone): renew no more and
    /// let the deadlines held run out.
    pub fn stop_renewing(&mut self) {
        self.next_renew = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fencing::FencingToken;

    const MS: u64 = 1000;

    /// A grant sent at host time 1,000 ms and instant 0: renew at 3.3 s, soft
    /// at 7 s, hard at 9 s after sending.
    fn deadlines(from_ms: u64) -> Deadlines {
        Deadlines {
            renew_at: HostTime::from_ms(from_ms + 3_300),
            soft_terminate_at: HostTime::from_ms(from_ms + 7_000),
            hard_terminate_at: HostTime::from_ms(from_ms + 9_000),
        }
    }

    fn at(ms: u64) -> HostInstant {
        HostInstant::from_us(ms * MS)
    }

    fn lease() -> HostLease {
        HostLease::start(
            &deadlines(1_000),
            HostTime::from_ms(1_000),
            at(0),
            at(5),
            500,
        )
        .expect("in time")
    }

    #[test]
    fn deadlines_become_instants_of_the_monotonic_clock() {
        let timeline = Timeline::new(&deadlines(1_000), HostTime::from_ms(1_000), at(50));
        assert_eq!(timeline.renew_at, at(3_350));
        assert_eq!(timeline.soft_at, at(7_050));
        assert_eq!(timeline.hard_at, at(9_050));
        assert_eq!(timeline.kill_at(), at(9_049));
    }

    #[test]
    fn out_of_order_deadlines_are_pulled_in_to_the_hard_deadline() {
        let hostile = Deadlines {
            renew_at: HostTime::from_ms(20_000),
            soft_terminate_at: HostTime::from_ms(30_000),
            hard_terminate_at: HostTime::from_ms(5_000),
        };
        let timeline = Timeline::new(&hostile, HostTime::from_ms(1_000), at(0));
        assert_eq!(timeline.renew_at, at(4_000));
        assert_eq!(timeline.soft_at, at(4_000));
        assert_eq!(timeline.hard_at, at(4_000));
    }

    #[test]
    fn a_grant_at_or_after_its_soft_deadline_is_not_started() {
        let late = HostLease::start(
            &deadlines(1_000),
            HostTime::from_ms(1_000),
            at(0),
            at(7_000),
            500,
        );
        assert!(late.is_err());
    }

    #[test]
    fn renews_at_renew_at_and_moves_on_an_answer() {
        let mut lease = lease();
        assert_eq!(lease.poll(at(10)), HostLeasePoll::Wait { until: at(3_300) });
        assert_eq!(
            lease.poll(at(3_300)),
            HostLeasePoll::Renew { by: at(7_000) }
        );
        // In flight: only the soft and hard deadlines wake the driver.
        assert_eq!(
            lease.poll(at(3_301)),
            HostLeasePoll::Wait { until: at(7_000) }
        );
        let renewed = Some(RenewReply::Renewed(deadlines(4_300)));
        let out = lease.handle_renew(renewed, HostTime::from_ms(4_300), at(3_300), at(3_320));
        assert!(matches!(out, Renewal::Moved(t) if t.soft_at == at(10_300)));
        assert_eq!(
            lease.poll(at(3_320)),
            HostLeasePoll::Wait { until: at(6_600) }
        );
    }

    #[test]
    fn a_failed_renewal_is_retried_only_before_the_soft_deadline() {
        let mut lease = lease();
        assert!(matches!(lease.poll(at(3_300)), HostLeasePoll::Renew { .. }));
        let out = lease.handle_renew(None, HostTime::from_ms(4_300), at(3_300), at(5_300));
        assert_eq!(
            out,
            Renewal::Failed {
                retry_at: Some(at(5_800))
            }
        );
        assert!(matches!(lease.poll(at(5_800)), HostLeasePoll::Renew { .. }));
        let out = lease.handle_renew(None, HostTime::from_ms(6_800), at(5_800), at(6_600));
        assert_eq!(out, Renewal::Failed { retry_at: None });
        assert_eq!(
            lease.poll(at(6_600)),
            HostLeasePoll::Wait { until: at(7_000) }
        );
        assert_eq!(lease.poll(at(7_000)), HostLeasePoll::SoftTerminate);
        assert_eq!(
            lease.poll(at(7_000)),
            HostLeasePoll::Wait { until: at(8_999) }
        );
        assert_eq!(
            lease.poll(at(8_999)),
            HostLeasePoll::HardTerminate(HardCause::HardDeadline)
        );
        assert_eq!(
            lease.poll(at(20_000)),
            HostLeasePoll::HardTerminate(HardCause::HardDeadline)
        );
    }

    #[test]
    fn a_renewal_answered_after_the_soft_deadline_is_too_late() {
        let mut lease = lease();
        assert!(matches!(lease.poll(at(3_300)), HostLeasePoll::Renew { .. }));
        let renewed = Some(RenewReply::Renewed(deadlines(4_300)));
        let out = lease.handle_renew(renewed, HostTime::from_ms(4_300), at(3_300), at(7_000));
        assert_eq!(out, Renewal::TooLate);
        assert_eq!(lease.poll(at(7_000)), HostLeasePoll::SoftTerminate);
    }

    #[test]
    fn draining_stops_renewals_but_keeps_the_deadlines() {
        let mut lease = lease();
        assert!(matches!(lease.poll(at(3_300)), HostLeasePoll::Renew { .. }));
        let out = lease.handle_renew(
            Some(RenewReply::Draining),
            HostTime::from_ms(4_300),
            at(3_300),
            at(3_310),
        );
        assert_eq!(out, Renewal::Draining);
        assert_eq!(
            lease.poll(at(3_310)),
            HostLeasePoll::Wait { until: at(7_000) }
        );
        assert_eq!(lease.poll(at(7_000)), HostLeasePoll::SoftTerminate);
    }

    #[test]
    fn a_stale_token_or_expired_answer_stops_the_actor_at_once() {
        for reply in [
            RenewReply::StaleToken {
                current: FencingToken::FIRST,
            },
            RenewReply::Expired,
        ] {
            let mut lease = lease();
            assert!(matches!(lease.poll(at(3_300)), HostLeasePoll::Renew { .. }));
            let out =
                lease.handle_renew(Some(reply), HostTime::from_ms(4_300), at(3_300), at(3_310));
            assert_eq!(out, Renewal::Lost);
            assert_eq!(
                lease.poll(at(3_310)),
                HostLeasePoll::HardTerminate(HardCause::Lost)
            );
        }
    }

    #[test]
    fn an_owner_gone_stops_renewals() {
        let mut lease = lease();
        lease.stop_renewing();
        assert_eq!(
            lease.poll(at(3_300)),
            HostLeasePoll::Wait { until: at(7_000) }
        );
    }
}
