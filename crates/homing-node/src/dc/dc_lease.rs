//! The DC's side of its DC lease (DESIGN.md §7.5, `homing_core::dc_lease`):
//! when to renew, how long the last acknowledged renewal lets the DC count
//! on its lease, which host leases it may grant, and which marks it must
//! publish before it writes a record.
//!
//! Validity runs from the node's clock reading when the renewal was *sent*
//! (the store received it no earlier), for [`DcTerms::valid_for_ms`]. A host
//! lease is granted or renewed only when its whole ttl fits before the end of
//! that validity, measured from the request's arrival (the host sent it no
//! later), so every host of the DC stops before the store could call the DC
//! lease expired — whatever the DC's renewals do afterwards.
//!
//! Marks: a record is written only when the published marks cover its
//! reservation unique and token ([`DcMarks::cover`]); otherwise the driver
//! asks for higher marks ([`DcLease::want`]), which makes the next renewal
//! due at once, and writes once it is acknowledged.

use homing_core::{DcId, DcMarks, DcRenewal, DcTerms, ErrorKind, ErrorReply, FencingToken};

use crate::Failure;
use crate::step::time::NodeTime;
use homing_core::mutation::{Mutation, Mutations};

/// How far above a token the DC publishes its token bound, so renewals
/// rarely need to publish again: 2^20 new holders per key between two
/// renewals would be needed to reach it.
pub const TOKEN_HEADROOM: u64 = 1 << 20;

/// How soon a failed renewal is tried again, ms (capped by the renewal period).
pub const RENEW_RETRY_MS: u64 = 250;

/// How long a write waits for a renewal that publishes the marks its record
/// needs before it fails as unavailable, ms.
pub const MARKS_WAIT_MS: u64 = 5_000;

/// What a DC may do at start, from what the global store keeps about it
/// (its published marks, whether it was retired) and its own store's
/// allocator bound ([`start_check`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StartCheck {
    /// Serve: the store is at or above every mark it must be.
    Serve,
    /// The operator asked to start above the floor: raise the store's
    /// allocator to `to`, then check again.
    RaiseAllocator {
        /// The published allocator floor.
        to: u64,
    },
    /// Retired by an operator: never serve under this id.
    Retired,
    /// The store is behind what the DC already handed out (wiped, or
    /// restored from an old backup): refuse.
    BelowFloor {
        /// The store's allocator bound.
        store_floor: u64,
        /// The floor the DC published.
        published: u64,
    },
    /// The store's event log is behind the head the DC published: restored
    /// from a backup older than the DC's last renewals. Refuse.
    EventsBehind {
        /// The store's event-log head.
        store_head: u64,
        /// The head the DC published.
        published: u64,
    },
}

/// The start-up decision for a DC whose global store keeps `kept` and
/// `retired` about it, over a DC store whose allocator bound is
/// `store_floor` and event-log head `store_head`; `start_above_floor`: the
/// operator's one-off permission to serve a store that is behind (homingd's
/// `--start-above-floor`: its allocator is raised past the floor).
pub fn start_check(
    kept: &DcMarks,
    retired: bool,
    store_floor: u64,
    store_head: u64,
    start_above_floor: bool,
) -> StartCheck {
    if retired {
        StartCheck::Retired
    } else if store_floor < kept.allocator_floor {
        match start_above_floor {
            true => StartCheck::RaiseAllocator {
                to: kept.allocator_floor,
            },
            false => StartCheck::BelowFloor {
                store_floor,
                published: kept.allocator_floor,
            },
        }
    } else if store_head < kept.event_head && !start_above_floor {
        StartCheck::EventsBehind {
            store_head,
            published: kept.event_head,
        }
    } else {
        StartCheck::Serve
    }
}

/// What the driver must do for the DC lease now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DcLeasePoll {
    /// Send a renewal with these terms and marks, sent at `now`; answer with
    /// [`DcLease::handle_renewed`] or [`DcLease::handle_failed`] naming `now`.
    Renew {
        /// The DC's terms.
        terms: DcTerms,
        /// The marks to publish.
        marks: DcMarks,
    },
    /// Nothing until `until` (or until [`DcLease::want`] is called).
    Wait {
        /// The next renewal's time.
        until: NodeTime,
    },
    /// A renewal is on its way: wait for its answer.
    InFlight,
    /// The DC must never hold its lease again (retired, or its store is
    /// behind its published marks).
    Stopped,
}

/// How a renewal changed what the DC may do, for logs and metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DcLeaseChange {
    /// Nothing a log would mention.
    Same,
    /// The DC may grant again (its first renewal, or after its validity ran out).
    Regained,
    /// The DC's validity ran out before this failure: it grants nothing.
    Lost,
    /// The store refused the renewal for good.
    Retired,
}

/// Lends a DC's lease for one look, kept as its driver keeps it (the
/// simulator: in place; homingd: behind a lock, taken only when lent).
pub trait LeaseLender {
    /// `f` over the lease.
    fn lend<T>(self, f: impl FnOnce(&DcLease) -> T) -> T;
}

impl LeaseLender for &DcLease {
    fn lend<T>(self, f: impl FnOnce(&DcLease) -> T) -> T {
        f(self)
    }
}

/// The DC lease as its DC sees it.
#[derive(Debug, Clone)]
pub struct DcLease {
    terms: DcTerms,
    renew_every_ms: u64,
    valid_until: Option<NodeTime>,
    published: DcMarks,
    wanted: DcMarks,
    in_flight: bool,
    next_renewal: NodeTime,
    /// After a failed renewal: none before this, even when marks are wanted
    /// (a store that fails at once is not asked in a busy loop).
    retry_at: Option<NodeTime>,
    retired: bool,
    /// Bumped each time the lease is regained: the store may have judged
    /// it expired before, and taken over some of this DC's tails.
    regained: u64,
    /// The last `regained` whose takeovers were applied to this DC's records.
    reconciled: u64,
    mutations: Mutations,
}

impl DcLease {
    /// A DC lease under `terms`, renewed every `renew_every_ms`, not yet
    /// checked against what the store keeps ([`DcLease::checked`]); the
    /// first renewal is due at once.
    pub fn new(terms: DcTerms, renew_every_ms: u64) -> DcLease {
        let wanted = DcMarks {
            token_bound: TOKEN_HEADROOM,
            ..DcMarks::default()
        };
        DcLease {
            terms,
            renew_every_ms: renew_every_ms.max(1),
            valid_until: None,
            published: DcMarks::default(),
            wanted,
            in_flight: false,
            next_renewal: NodeTime::default(),
            retry_at: None,
            retired: false,
            regained: 0,
            reconciled: 0,
            mutations: Mutations::NONE,
        }
    }

    /// This lease with `mutations` broken (tests only; homingd passes none).
    pub fn with_mutations(self, mutations: Mutations) -> DcLease {
        DcLease { mutations, ..self }
    }

    /// The terms sent with each renewal.
    pub fn terms(&self) -> &DcTerms {
        &self.terms
    }

    /// What to do now.
    pub fn poll(&mut self, now: NodeTime) -> DcLeasePoll {
        if self.retired {
            return DcLeasePoll::Stopped;
        }
        if self.in_flight {
            return DcLeasePoll::InFlight;
        }
        if let Some(at) = self.retry_at.filter(|at| now < *at) {
            return DcLeasePoll::Wait { until: at };
        }
        let marks_wanted = !self.published.at_least(&self.wanted);
        if now < self.next_renewal && !marks_wanted {
            return DcLeasePoll::Wait {
                until: self.next_renewal,
            };
        }
        self.in_flight = true;
        DcLeasePoll::Renew {
            terms: self.terms,
            marks: self.wanted,
        }
    }

    /// The store answered the renewal sent at `sent`.
    pub fn handle_renewed(
        &mut self,
        sent: NodeTime,
        renewal: DcRenewal,
        now: NodeTime,
    ) -> DcLeaseChange {
        self.in_flight = false;
        self.retry_at = None;
        match renewal {
            DcRenewal::Retired => {
                self.retired = true;
                self.valid_until = None;
                DcLeaseChange::Retired
            }
            DcRenewal::Renewed(kept) => {
                let was_valid = self.valid_at(now);
                self.published = self.published.max(kept);
                self.wanted = self.wanted.max(kept);
                let until = sent.plus_ms(self.terms.valid_for_ms());
                self.valid_until = Some(self.valid_until.map_or(until, |v| v.max(until)));
                self.next_renewal = sent.plus_ms(self.renew_every_ms);
                if was_valid || !self.valid_at(now) {
                    DcLeaseChange::Same
                } else {
                    self.regained += 1;
                    DcLeaseChange::Regained
                }
            }
        }
    }

    /// The renewal failed (store unreachable, deadline): try again soon.
    pub fn handle_failed(&mut self, now: NodeTime) -> DcLeaseChange {
        self.in_flight = false;
        self.next_renewal = now.plus_ms(RENEW_RETRY_MS.min(self.renew_every_ms));
        self.retry_at = Some(self.next_renewal);
        match self.valid_until {
            Some(until) if until <= now => {
                // Said once: later failures find it gone already.
                self.valid_until = None;
                DcLeaseChange::Lost
            }
            _ => DcLeaseChange::Same,
        }
    }

    /// Whether the DC counts on its lease at `now`.
    pub fn valid_at(&self, now: NodeTime) -> bool {
        self.valid_until.is_some_and(|until| now < until)
    }

    /// How much longer the DC counts on its lease, ms (0: not at all).
    pub fn valid_for_ms(&self, now: NodeTime) -> u64 {
        self.valid_until
            .map_or(0, |until| until.us_since(now) / 1000)
    }

    /// Whether a host lease of `ttl_ms` asked for at `arrived` may be
    /// granted or renewed: its whole term ends before the DC's validity
    /// does, and the takeovers the global store recorded before the lease
    /// was last regained have been applied ([`DcLease::reconciliation`]).
    pub fn covers(&self, arrived: NodeTime, ttl_ms: u64) -> bool {
        if self.mutations.has(Mutation::GrantsNotGated) {
            return true;
        }
        let reconciled = self.reconciled == self.regained
            || self.mutations.has(Mutation::TakeoversNotReconciled);
        reconciled
            && self
                .valid_until
                .is_some_and(|until| arrived.plus_ms(ttl_ms) <= until)
    }

    /// [`DcLease::covers`] as DC `dc`'s answer at `now` to a host lease of
    /// `ttl_ms` asked for at `arrived`: granted, or why not (`Unavailable`:
    /// the host asks again, or another homingd of the DC).
    pub fn grant(
        &self,
        dc: &DcId,
        arrived: NodeTime,
        now: NodeTime,
        ttl_ms: u64,
    ) -> Result<(), Failure> {
        if self.covers(arrived, ttl_ms) {
            return Ok(());
        }
        let valid_ms = self.valid_for_ms(now);
        let why = if self.retired {
            "this dc may never hold its dc lease again (retired, or its dc store is behind the marks it published: see homingd's log)".to_string()
        } else if self.reconciliation().is_some() && valid_ms > ttl_ms {
            "this dc regained its dc lease and has not yet applied the takeovers of its tails that other dcs made meanwhile (see homingd's log)".to_string()
        } else {
            format!(
                "this dc counts on its dc lease for {valid_ms} ms more, a host lease needs {ttl_ms} ms: the global store has not acknowledged a renewal in time"
            )
        };
        Err(Failure::Unreachable(ErrorReply::new(
            ErrorKind::Unavailable { dc: dc.clone() },
            format!("no host lease granted or renewed: {why}"),
        )))
    }

    /// Whether the DC may answer for its own tails at `now` (resolves,
    /// walks of other DCs): its lease is valid — past it, no host it
    /// granted acts, and other DCs may soon take its tails over — and its
    /// records are reconciled with the takeovers made meanwhile. Otherwise
    /// a tail's answer could name a holder that stopped, or a tail another
    /// DC continues: the DC answers `Unavailable`, and walkers go through
    /// the global store's successions.
    pub fn answers_for_tails(&self, now: NodeTime) -> bool {
        self.valid_at(now) && self.reconciliation().is_none()
    }

    /// The reconciliation owed, if any (DESIGN.md §7.5): after the lease is
    /// regained — at start, or after its validity ran out, when the store
    /// may have judged it expired and other DCs may have taken over this
    /// DC's tails — the driver runs a [`crate::Reconcile`], which applies
    /// every takeover the global store has of this DC's reservations to its
    /// records (a scan that starts after the renewal, so it sees every
    /// takeover committed before it; later ones fail their guard), then
    /// calls [`DcLease::handle_reconciled`] with this number. Nothing is granted
    /// or renewed in between.
    pub fn reconciliation(&self) -> Option<u64> {
        if self.mutations.has(Mutation::TakeoversNotReconciled) {
            return None;
        }
        (self.reconciled != self.regained).then_some(self.regained)
    }

    /// The reconciliation `number` is done (an older one is ignored: the
    /// lease was regained again meanwhile, and is owed another).
    pub fn handle_reconciled(&mut self, number: u64) {
        if number == self.regained {
            self.reconciled = number;
        }
    }

    /// Whether the published marks cover writing a record with `unique` and `token`.
    pub fn admits(&self, unique: u64, token: FencingToken) -> bool {
        self.published.cover(unique, token)
    }

    /// Asks the next renewal to publish marks covering `allocator_floor`
    /// (the DC store's own durable bound, at or above the unique to write)
    /// and `token`; it is due at once.
    pub fn want(&mut self, allocator_floor: u64, token: FencingToken) {
        self.wanted = self.wanted.max(DcMarks {
            allocator_floor,
            token_bound: token.get().saturating_add(TOKEN_HEADROOM),
            ..DcMarks::default()
        });
    }

    /// The DC store's event-log head now: the next renewal publishes it
    /// (it does not make a renewal due: the head only says how far the
    /// store had got, for the start-up check of a restored store).
    pub fn note_event_head(&mut self, head: u64) {
        self.wanted.event_head = self.wanted.event_head.max(head);
    }

    /// The marks the store has acknowledged.
    pub fn published(&self) -> DcMarks {
        self.published
    }

    /// Whether the DC must never hold its lease again.
    pub fn retired(&self) -> bool {
        self.retired
    }

    /// The DC must never hold its lease again (its store turned out to be
    /// behind its published marks): nothing is granted or renewed from now.
    pub fn stop(&mut self) {
        self.retired = true;
        self.valid_until = None;
    }

    /// The start-up check passed ([`StartCheck::Serve`]): counts `kept` —
    /// the marks the global store keeps — as published, and asks the next
    /// renewal to publish the DC store's allocator bound `store_floor` and
    /// event-log head `store_head` too.
    pub fn checked(&mut self, kept: DcMarks, store_floor: u64, store_head: u64) {
        let wanted = DcMarks {
            allocator_floor: store_floor,
            token_bound: 0,
            event_head: store_head,
        };
        self.published = self.published.max(kept);
        self.wanted = self.wanted.max(kept).max(wanted);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TERMS: DcTerms = DcTerms {
        ttl_ms: 20_000,
        host_lease_ttl_max_ms: 10_000,
        grace_ms: 2_000,
    };

    fn at(ms: u64) -> NodeTime {
        NodeTime::from_us(ms * 1000)
    }

    fn marks(allocator_floor: u64, token_bound: u64) -> DcMarks {
        DcMarks {
            allocator_floor,
            token_bound,
            event_head: 0,
        }
    }

    fn renewed(lease: &mut DcLease, sent: u64, answered: u64) -> DcLeaseChange {
        let DcLeasePoll::Renew { marks, .. } = lease.poll(at(sent)) else {
            panic!("no renewal due at {sent}");
        };
        lease.handle_renewed(at(sent), DcRenewal::Renewed(marks), at(answered))
    }

    #[test]
    fn grants_only_while_the_whole_host_lease_fits_in_the_validity() {
        let mut lease = DcLease::new(TERMS, 2_000);
        lease.checked(DcMarks::default(), 1024, 0);
        assert!(
            !lease.covers(at(0), 10_000),
            "nothing before the first renewal"
        );
        assert_eq!(renewed(&mut lease, 100, 150), DcLeaseChange::Regained);
        assert!(
            !lease.covers(at(150), 10_000),
            "nothing before the takeovers are reconciled"
        );
        lease.handle_reconciled(lease.reconciliation().expect("owed after a regain"));
        assert_eq!(lease.reconciliation(), None);
        // Valid from the send time for ttl less the drift margin: 100 + 19,000.
        assert!(lease.covers(at(150), 10_000));
        assert!(lease.covers(at(9_100), 10_000));
        assert!(!lease.covers(at(9_101), 10_000));
        assert!(lease.valid_at(at(19_099)) && !lease.valid_at(at(19_100)));
    }

    #[test]
    fn a_refused_grant_says_why_retired_before_reconciling_before_short_validity() {
        let dc: DcId = "iad".parse().unwrap();
        let why = |lease: &DcLease, arrived: u64| {
            let refused = lease
                .grant(&dc, at(arrived), at(arrived), 10_000)
                .unwrap_err();
            assert!(refused.is_unreachable(), "{refused:?}");
            let reply = refused.into_reply();
            assert_eq!(reply.kind, ErrorKind::Unavailable { dc: dc.clone() });
            reply.message
        };
        let mut lease = DcLease::new(TERMS, 2_000);
        assert!(why(&lease, 0).contains("for 0 ms more"), "never renewed");
        renewed(&mut lease, 100, 150);
        assert!(why(&lease, 150).contains("not yet applied the takeovers"));
        lease.handle_reconciled(lease.reconciliation().unwrap());
        assert_eq!(lease.grant(&dc, at(150), at(150), 10_000), Ok(()));
        assert!(why(&lease, 9_101).contains("for 9999 ms more"));
        lease.stop();
        assert!(why(&lease, 150).contains("may never hold its dc lease again"));
    }

    #[test]
    fn a_lease_regained_after_it_ran_out_owes_a_new_reconciliation_and_an_old_one_does_not_pay_it()
    {
        let mut lease = DcLease::new(TERMS, 2_000);
        renewed(&mut lease, 0, 10);
        let first = lease.reconciliation().unwrap();
        lease.handle_reconciled(first);
        assert!(lease.covers(at(10), 1_000));
        // Renewals fail until the validity (19,000) has run out.
        let DcLeasePoll::Renew { .. } = lease.poll(at(2_000)) else {
            panic!("renewal due at 2,000");
        };
        assert_eq!(lease.handle_failed(at(19_500)), DcLeaseChange::Lost);
        assert_eq!(renewed(&mut lease, 19_750, 19_800), DcLeaseChange::Regained);
        let second = lease.reconciliation().expect("owed again");
        assert_ne!(first, second);
        assert!(!lease.covers(at(19_800), 1_000));
        lease.handle_reconciled(first);
        assert!(
            !lease.covers(at(19_800), 1_000),
            "a stale reconciliation pays nothing"
        );
        lease.handle_reconciled(second);
        assert!(lease.covers(at(19_800), 1_000));
    }

    #[test]
    fn renews_on_its_period_retries_failures_soon_and_says_when_it_lost_the_lease() {
        let mut lease = DcLease::new(TERMS, 2_000);
        renewed(&mut lease, 0, 10);
        assert_eq!(lease.poll(at(10)), DcLeasePoll::Wait { until: at(2_000) });
        let DcLeasePoll::Renew { .. } = lease.poll(at(2_000)) else {
            panic!("renewal due at 2,000");
        };
        assert_eq!(lease.poll(at(2_100)), DcLeasePoll::InFlight);
        assert_eq!(lease.handle_failed(at(3_000)), DcLeaseChange::Same);
        assert_eq!(
            lease.poll(at(3_000)),
            DcLeasePoll::Wait { until: at(3_250) }
        );
        // Failures until the validity from the send at 0 (19,000) runs out.
        assert!(matches!(lease.poll(at(19_000)), DcLeasePoll::Renew { .. }));
        assert_eq!(lease.handle_failed(at(19_001)), DcLeaseChange::Lost);
        assert!(!lease.covers(at(19_001), 1));
        assert!(matches!(lease.poll(at(19_251)), DcLeasePoll::Renew { .. }));
        assert_eq!(lease.handle_failed(at(19_300)), DcLeaseChange::Same);
        assert_eq!(renewed(&mut lease, 19_550, 19_600), DcLeaseChange::Regained);
    }

    #[test]
    fn a_slow_answer_counts_from_its_send_and_never_shortens_the_validity() {
        let mut lease = DcLease::new(TERMS, 2_000);
        renewed(&mut lease, 0, 10);
        // Sent at 2,000, answered 15 s later: valid from 2,000, not 17,000.
        renewed(&mut lease, 2_000, 17_000);
        assert!(lease.valid_at(at(20_999)) && !lease.valid_at(at(21_000)));
    }

    #[test]
    fn a_record_above_the_published_marks_waits_for_a_renewal_that_publishes_them() {
        let mut lease = DcLease::new(TERMS, 2_000);
        lease.checked(marks(1024, 5), 2048, 0);
        // Kept marks count before the first renewal; wanted ones do not.
        assert!(lease.admits(1024, FencingToken::new(5)));
        assert!(!lease.admits(1025, FencingToken::new(1)));
        let DcLeasePoll::Renew { marks: sent, .. } = lease.poll(at(0)) else {
            panic!("first renewal due at once");
        };
        assert_eq!(sent, marks(2048, TOKEN_HEADROOM));
        lease.handle_renewed(at(0), DcRenewal::Renewed(sent), at(5));
        assert!(lease.admits(2048, FencingToken::new(TOKEN_HEADROOM)));
        assert!(!lease.admits(2048, FencingToken::new(TOKEN_HEADROOM + 1)));
        assert_eq!(lease.poll(at(5)), DcLeasePoll::Wait { until: at(2_000) });
        lease.want(2048, FencingToken::new(TOKEN_HEADROOM + 1));
        let DcLeasePoll::Renew { marks: sent, .. } = lease.poll(at(6)) else {
            panic!("a wanted mark makes the renewal due at once");
        };
        assert_eq!(sent.token_bound, 2 * TOKEN_HEADROOM + 1);
        // A failed renewal is retried after the pause, wanted marks or not.
        lease.handle_failed(at(7));
        assert_eq!(lease.poll(at(8)), DcLeasePoll::Wait { until: at(257) });
        assert!(matches!(lease.poll(at(257)), DcLeasePoll::Renew { .. }));
    }

    #[test]
    fn the_start_check_serves_a_store_at_its_floor_and_refuses_one_behind_it() {
        let kept = DcMarks {
            event_head: 500,
            ..marks(2048, 9)
        };
        assert_eq!(
            start_check(&kept, false, 2048, 500, false),
            StartCheck::Serve
        );
        assert_eq!(
            start_check(&kept, false, 0, 0, false),
            StartCheck::BelowFloor {
                store_floor: 0,
                published: 2048
            }
        );
        assert_eq!(
            start_check(&kept, false, 0, 0, true),
            StartCheck::RaiseAllocator { to: 2048 }
        );
        // A backup within the current allocator block: its event log is behind.
        assert_eq!(
            start_check(&kept, false, 2048, 499, false),
            StartCheck::EventsBehind {
                store_head: 499,
                published: 500
            }
        );
        assert_eq!(
            start_check(&kept, false, 2048, 499, true),
            StartCheck::Serve
        );
        assert_eq!(
            start_check(&kept, true, 4096, 900, true),
            StartCheck::Retired
        );
    }

    #[test]
    fn the_event_head_rides_on_the_next_renewal_without_making_one_due() {
        let mut lease = DcLease::new(TERMS, 2_000);
        renewed(&mut lease, 0, 10);
        lease.note_event_head(42);
        assert_eq!(lease.poll(at(20)), DcLeasePoll::Wait { until: at(2_000) });
        let DcLeasePoll::Renew { marks: sent, .. } = lease.poll(at(2_000)) else {
            panic!("renewal due on its period");
        };
        assert_eq!(sent.event_head, 42);
    }

    #[test]
    fn a_retired_dc_never_renews_again() {
        let mut lease = DcLease::new(TERMS, 2_000);
        renewed(&mut lease, 0, 10);
        let DcLeasePoll::Renew { .. } = lease.poll(at(2_000)) else {
            panic!("renewal due");
        };
        let change = lease.handle_renewed(at(2_000), DcRenewal::Retired, at(2_010));
        assert_eq!(change, DcLeaseChange::Retired);
        assert!(!lease.covers(at(2_010), 1));
        assert_eq!(lease.poll(at(99_000)), DcLeasePoll::Stopped);
    }
}
