//! The host's side of a host session as a sans-IO stepper: one
//! [`HostLease`] times the session (its renewals, its soft and hard
//! deadlines, its stop rules), and every key the host holds under it lives
//! on the session's deadlines until a renewal's answer lists it as frozen
//! (drained or force-released at the DC). A frozen key stops by the
//! deadlines the host held *before* that answer:
//!
//! ```text
//! session renewed, key K not listed ─► K keeps running on the session's new deadlines
//! answer lists K (notice n > ack)    ─► K frozen at the timeline held before the answer:
//!                                        SoftTerminateKey(K) at its soft, HardTerminateKey(K) 1 ms before its hard
//! session soft deadline              ─► SoftTerminateAll (every key not yet stopped)
//! session hard deadline, Expired, NotHolder ─► HardTerminateAll
//! ```
//!
//! Why before: the DC froze K at the session's expiry as it stood when it
//! froze K, in the same transaction that numbered the notice, so every
//! renewal either landed before the freeze — and granted deadlines that
//! end at or before that expiry, which is what the host held — or lists K.
//! A lost answer changes nothing (the host keeps its older, shorter
//! timeline, and the next answer lists K again: notices are listed until
//! acknowledged). The host acknowledges the highest notice it acted on with
//! its next renewal ([`HostSession::ack`]).

use std::collections::{BTreeMap, BTreeSet};

use crate::host_lease::{
    HardCause, HostInstant, HostLease, HostLeasePoll, LateGrant, Renewal, Timeline,
};
use crate::lease::Deadlines;
use crate::record::RenewReply;
use crate::reservation::ReservationId;
use crate::session::SessionRenewReply;
use crate::time::HostTime;

/// Most keys one host session tracks: a grant beyond it is refused by
/// [`HostSession::hold`] (the driver releases it).
pub const SESSION_KEYS_MAX: usize = 1 << 20;

/// A frozen key: it runs on these deadlines, whatever the session does;
/// `soft_done` once told to stop gracefully.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Frozen {
    timeline: Timeline,
    soft_done: bool,
}

/// What the driver must do next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostSessionPoll {
    /// Send a session renewal now, with [`HostSession::ack`]; it must be
    /// answered by `by`, else hand [`HostSession::handle_renew`] `None`.
    Renew {
        /// The session's soft deadline.
        by: HostInstant,
    },
    /// Tell the actor of this frozen key to stop gracefully. Once per key.
    SoftTerminateKey(ReservationId),
    /// Kill the actor of this frozen key now; the driver releases the key
    /// and calls [`HostSession::forget`].
    HardTerminateKey(ReservationId),
    /// Tell every actor still running under the session to stop gracefully.
    /// Once.
    SoftTerminateAll,
    /// Kill every actor of the session now; the session is over. Returned
    /// from then on.
    HardTerminateAll(HardCause),
    /// Nothing to do before `until`, unless an answer arrives first.
    Wait {
        /// The next deadline.
        until: HostInstant,
    },
}

/// A grant the session cannot take: it already tracks
/// [`SESSION_KEYS_MAX`] keys, or the session is over.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the host session cannot hold reservation {0}: it is over or full")]
pub struct NotHeld(pub ReservationId);

/// The host's side of one session. See the module docs.
#[derive(Debug, Clone)]
pub struct HostSession {
    lease: HostLease,
    /// Keys on the session's deadlines.
    running: BTreeSet<ReservationId>,
    /// Keys frozen (few: each is stopping); [`HostSession::poll`] looks
    /// only at these.
    frozen: BTreeMap<ReservationId, Frozen>,
    ack: u64,
}

impl HostSession {
    /// The session an open gave: `deadlines` answered an open sent at host
    /// time `sent` and instant `sent_at`; `now` is when the answer arrived.
    /// Refuses an answer already at or past its soft deadline.
    pub fn start(
        deadlines: &Deadlines,
        sent: HostTime,
        sent_at: HostInstant,
        now: HostInstant,
        retry_interval_ms: u64,
    ) -> Result<HostSession, LateGrant> {
        Ok(HostSession {
            lease: HostLease::start(deadlines, sent, sent_at, now, retry_interval_ms)?,
            running: BTreeSet::new(),
            frozen: BTreeMap::new(),
            ack: 0,
        })
    }

    /// The session's current deadlines.
    pub fn timeline(&self) -> Timeline {
        self.lease.timeline()
    }

    /// The highest notice acted on: sent with every renewal.
    pub fn ack(&self) -> u64 {
        self.ack
    }

    /// How many keys the session tracks (running or frozen).
    pub fn keys(&self) -> usize {
        self.running.len() + self.frozen.len()
    }

    /// Whether every actor was told to stop (the session's soft deadline
    /// passed unrenewed): no key is held under it any more.
    pub fn stopping(&self) -> bool {
        self.lease.soft_terminated()
    }

    /// Whether `id` is tracked and frozen.
    pub fn frozen(&self, id: &ReservationId) -> bool {
        self.frozen.contains_key(id)
    }

    /// A grant under the session arrived: its actor runs on the session's
    /// deadlines. Refused once the session told its actors to stop, or when
    /// full.
    pub fn hold(&mut self, id: ReservationId) -> Result<(), NotHeld> {
        if self.lease.soft_terminated() || self.keys() >= SESSION_KEYS_MAX {
            return Err(NotHeld(id));
        }
        if !self.frozen.contains_key(&id) {
            self.running.insert(id);
        }
        Ok(())
    }

    /// Nobody will close the session (its owner is gone): renew no more
    /// and let the deadlines held stop every actor.
    pub fn stop_renewing(&mut self) {
        self.lease.stop_renewing();
    }

    /// The host released `id` (or gave it up): no longer tracked.
    pub fn forget(&mut self, id: &ReservationId) {
        self.running.remove(id);
        self.frozen.remove(id);
    }

    /// What to do at `now`. Call it again after every action it returns and
    /// after every answer.
    pub fn poll(&mut self, now: HostInstant) -> HostSessionPoll {
        match self.lease.poll(now) {
            HostLeasePoll::HardTerminate(cause) => HostSessionPoll::HardTerminateAll(cause),
            HostLeasePoll::SoftTerminate => HostSessionPoll::SoftTerminateAll,
            HostLeasePoll::Renew { by } => HostSessionPoll::Renew { by },
            HostLeasePoll::Wait { until } => {
                let mut until = until;
                for (
                    id,
                    Frozen {
                        timeline,
                        soft_done,
                    },
                ) in &mut self.frozen
                {
                    if now >= timeline.kill_at() {
                        return HostSessionPoll::HardTerminateKey(id.clone());
                    }
                    if now >= timeline.soft_at && !*soft_done {
                        *soft_done = true;
                        return HostSessionPoll::SoftTerminateKey(id.clone());
                    }
                    let next = if *soft_done {
                        timeline.kill_at()
                    } else {
                        timeline.soft_at
                    };
                    until = until.min(next);
                }
                HostSessionPoll::Wait { until }
            }
        }
    }

    /// The answer to the renewal [`HostSessionPoll::Renew`] asked for, sent
    /// at host time `sent` and instant `sent_at`, arriving at `now`; `None`
    /// when there was no answer in time or the DC refused the request.
    /// Every key a notice lists is frozen at the timeline held before this
    /// answer, then the session moves to the answer's deadlines.
    pub fn handle_renew(
        &mut self,
        reply: Option<SessionRenewReply>,
        sent: HostTime,
        sent_at: HostInstant,
        now: HostInstant,
    ) -> Renewal {
        let held = self.lease.timeline();
        let (reply, notices) = match reply {
            Some(SessionRenewReply::Renewed { deadlines, notices }) => {
                (Some(RenewReply::Renewed(deadlines)), notices)
            }
            Some(SessionRenewReply::Expired) => (Some(RenewReply::Expired), Vec::new()),
            Some(SessionRenewReply::NotHolder) => (Some(RenewReply::NotHolder), Vec::new()),
            None => (None, Vec::new()),
        };
        let renewal = self.lease.handle_renew(reply, sent, sent_at, now);
        // Notices count even on an answer too late to extend the session:
        // the key must not outlive what the host held when it was frozen.
        for notice in notices {
            if self.running.remove(&notice.reservation) {
                let frozen = Frozen {
                    timeline: held,
                    soft_done: false,
                };
                self.frozen.insert(notice.reservation, frozen);
            }
            self.ack = self.ack.max(notice.seq);
        }
        renewal
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::session::SessionNotice;

    const MS: u64 = 1000;

    fn at(ms: u64) -> HostInstant {
        HostInstant::from_us(ms * MS)
    }

    /// Deadlines for a request sent at host time `from_ms`: renew 3.3 s,
    /// soft 7 s, hard 9 s after it.
    fn deadlines(from_ms: u64) -> Deadlines {
        Deadlines {
            renew_at: HostTime::from_ms(from_ms + 3_300),
            soft_terminate_at: HostTime::from_ms(from_ms + 7_000),
            hard_terminate_at: HostTime::from_ms(from_ms + 9_000),
        }
    }

    fn rid(text: &str) -> ReservationId {
        text.parse().unwrap()
    }

    /// A session opened at 0 ms (host time = instant), holding iad.1 and iad.2.
    fn session() -> HostSession {
        let mut s = HostSession::start(&deadlines(0), HostTime::from_ms(0), at(0), at(1), 500)
            .expect("in time");
        s.hold(rid("iad.1")).unwrap();
        s.hold(rid("iad.2")).unwrap();
        s
    }

    fn renewed(from_ms: u64, notices: &[(u64, &str)]) -> Option<SessionRenewReply> {
        Some(SessionRenewReply::Renewed {
            deadlines: deadlines(from_ms),
            notices: notices
                .iter()
                .map(|(seq, id)| SessionNotice {
                    seq: *seq,
                    reservation: rid(id),
                })
                .collect(),
        })
    }

    /// Renews at `ms` (host time = instant) with `reply`.
    fn renew_at(s: &mut HostSession, ms: u64, reply: Option<SessionRenewReply>) -> Renewal {
        assert!(matches!(s.poll(at(ms)), HostSessionPoll::Renew { .. }));
        s.handle_renew(reply, HostTime::from_ms(ms), at(ms), at(ms + 1))
    }

    #[test]
    fn a_listed_key_stops_by_the_deadlines_held_before_the_answer_the_others_run_on() {
        let mut s = session();
        let before = s.timeline();
        renew_at(&mut s, 3_300, renewed(3_300, &[(1, "iad.2")]));
        assert_eq!(s.ack(), 1);
        assert!(s.frozen(&rid("iad.2")) && !s.frozen(&rid("iad.1")));
        assert!(
            s.timeline().soft_at > before.soft_at,
            "the session moved on"
        );
        // The session renews at 6.6 s and moves on; iad.2 stops at the old
        // soft (7 s) and dies 1 ms before the old hard (9 s).
        assert_eq!(
            s.poll(at(3_302)),
            HostSessionPoll::Wait { until: at(6_600) }
        );
        renew_at(&mut s, 6_600, renewed(6_600, &[]));
        assert_eq!(
            s.poll(at(6_602)),
            HostSessionPoll::Wait { until: at(7_000) }
        );
        assert_eq!(
            s.poll(at(7_000)),
            HostSessionPoll::SoftTerminateKey(rid("iad.2"))
        );
        assert_eq!(
            s.poll(at(7_001)),
            HostSessionPoll::Wait { until: at(8_999) }
        );
        assert_eq!(
            s.poll(at(8_999)),
            HostSessionPoll::HardTerminateKey(rid("iad.2"))
        );
        s.forget(&rid("iad.2"));
        assert!(matches!(s.poll(at(8_999)), HostSessionPoll::Wait { .. }));
        assert_eq!(s.keys(), 1);
    }

    #[test]
    fn a_lost_answer_then_a_listing_freezes_at_the_older_timeline() {
        let mut s = session();
        let first = s.timeline();
        // The answer that listed iad.1 is lost; the retry's answer lists it again.
        assert!(matches!(
            renew_at(&mut s, 3_300, None),
            Renewal::Failed { .. }
        ));
        renew_at(&mut s, 3_801, renewed(3_801, &[(4, "iad.1")]));
        assert!(s.frozen(&rid("iad.1")));
        assert_eq!(
            s.poll(at(first.soft_at.as_us() / MS)),
            HostSessionPoll::SoftTerminateKey(rid("iad.1"))
        );
        // A notice already acted on (a duplicate answer) changes nothing.
        let again = renew_at(&mut s, 7_101, renewed(7_101, &[(4, "iad.1")]));
        assert!(matches!(again, Renewal::Moved(_)));
        assert_eq!(s.ack(), 4);
    }

    #[test]
    fn an_expired_session_kills_every_key_at_once_and_its_soft_deadline_stops_them_all() {
        let mut s = session();
        renew_at(&mut s, 3_300, Some(SessionRenewReply::Expired));
        assert_eq!(
            s.poll(at(3_302)),
            HostSessionPoll::HardTerminateAll(HardCause::Lost)
        );
        let mut s = session();
        // Never renewed: soft at 7 s for every key, then hard before 9 s.
        assert_eq!(s.poll(at(7_000)), HostSessionPoll::SoftTerminateAll);
        assert!(s.hold(rid("iad.3")).is_err(), "no new key after the stop");
        assert_eq!(
            s.poll(at(8_999)),
            HostSessionPoll::HardTerminateAll(HardCause::HardDeadline)
        );
    }

    mod drain_races_renewal {
        use super::*;
        use crate::lease::LeasePolicy;
        use crate::lease_key::LeaseKey;
        use crate::session::SessionRecord;
        use crate::time::StoreTime;
        use proptest::prelude::*;

        /// One run: the host renews its session over a network that delays
        /// each request by `delays[i].0` ms and each answer by `delays[i].1`
        /// ms (losing it when `lost[i]`); the DC freezes the host's key at
        /// `freeze_ms`. One clock stands for the host's and the store's (the
        /// rule compares nothing across them, so an offset changes nothing).
        /// Returns (the key's frozen expiry at the DC, the instant the host
        /// kills the key's actor), in ms.
        fn run(delays: &[(u64, u64)], lost: &[bool], freeze_ms: u64) -> Option<(u64, u64)> {
            let policy = LeasePolicy::DEFAULT;
            let secret = LeaseKey::from_bytes([7; 16]).unwrap();
            let (mut row, opened) = SessionRecord::open(
                "iad~1".parse().unwrap(),
                secret,
                HostTime::from_ms(0),
                StoreTime::from_ms(0),
                &policy,
            );
            let mut host =
                HostSession::start(&opened, HostTime::from_ms(0), at(0), at(0), 500).ok()?;
            let key = rid("iad.2");
            host.hold(key.clone()).unwrap();
            let mut frozen: Option<(u64, u64)> = None; // (expiry ms, notice)
            let freeze = |row: &mut SessionRecord, frozen: &mut Option<(u64, u64)>, now: u64| {
                if frozen.is_none() && now >= freeze_ms {
                    // The DC freezes a key of a live session at its expiry as it stands.
                    if let SessionState::Live { expires_at } = row.state {
                        let (next, seq) = row.noticed();
                        *frozen = Some((expires_at.as_ms(), seq));
                        *row = next;
                    }
                }
            };
            // The renewal in flight: when its answer arrives, the answer, and
            // when it was sent.
            let mut inflight: Option<(u64, Option<SessionRenewReply>, u64)> = None;
            let (mut now, mut i) = (0, 0);
            loop {
                let wait = match host.poll(at(now)) {
                    HostSessionPoll::Renew { .. } => {
                        let Some(&(up, down)) = delays.get(i) else {
                            // Out of scripted renewals: the host goes silent.
                            host.handle_renew(None, HostTime::from_ms(now), at(now), at(now));
                            continue;
                        };
                        let received = now + up;
                        freeze(&mut row, &mut frozen, received);
                        let t = row.renew(
                            &secret,
                            HostTime::from_ms(now),
                            StoreTime::from_ms(received),
                            &policy,
                        );
                        let mut reply = t.reply;
                        if let Some(next) = t.next {
                            row = next;
                        }
                        if let (SessionRenewReply::Renewed { notices, .. }, Some((_, seq))) =
                            (&mut reply, frozen)
                            && seq > host.ack()
                        {
                            notices.push(SessionNotice {
                                seq,
                                reservation: key.clone(),
                            });
                        }
                        inflight = Some((received + down, (!lost[i]).then_some(reply), now));
                        i += 1;
                        continue;
                    }
                    HostSessionPoll::HardTerminateKey(id) => {
                        assert_eq!(id, key);
                        return frozen.map(|(at_ms, _)| (at_ms, now));
                    }
                    HostSessionPoll::HardTerminateAll(_) => {
                        return frozen.map(|(at_ms, _)| (at_ms, now));
                    }
                    HostSessionPoll::SoftTerminateKey(_) | HostSessionPoll::SoftTerminateAll => {
                        continue;
                    }
                    HostSessionPoll::Wait { until } => until.as_us() / MS,
                };
                match inflight.take() {
                    Some((arrives, answer, sent)) if arrives <= wait => {
                        now = now.max(arrives);
                        freeze(&mut row, &mut frozen, now);
                        host.handle_renew(answer, HostTime::from_ms(sent), at(sent), at(now));
                    }
                    other => {
                        inflight = other;
                        now = now.max(wait);
                        freeze(&mut row, &mut frozen, now);
                    }
                }
            }
        }

        use crate::session::SessionState;

        proptest! {
            // "A drained key's hard deadline ≤ its frozen expiry", in every
            // interleaving of the freeze with renewals whose requests and
            // answers are delayed or lost: the host kills the key's actor
            // before the DC treats the key as gone.
            #[test]
            fn a_drained_keys_actor_dies_before_its_frozen_expiry(
                delays in proptest::collection::vec((0u64..3_000, 0u64..3_000), 1..12),
                lost in proptest::collection::vec(any::<bool>(), 12),
                freeze_ms in 0u64..30_000,
            ) {
                if let Some((frozen_at_ms, killed_ms)) = run(&delays, &lost, freeze_ms) {
                    prop_assert!(killed_ms < frozen_at_ms, "killed at {killed_ms} ms, frozen at {frozen_at_ms} ms");
                }
            }
        }
    }
}
