//! The wake-up checkers: `no_lost_wakeup` and `waiter_fifo`. They keep a
//! shadow of every registration at a tail DC, fed by the waiting
//! mechanism's events (registered, woken, left, lost in a crash), and judge
//! liveness obligations at the instant they fall due, on the state that held
//! then (the simulator asks before it processes the next event).
//!
//! With `A` the allowance (a few store operations at their slowest plus
//! timer slack) and `H` the hand-off window, `no_lost_wakeup` holds when:
//!
//! 1. a reservation whose record is linked or abandoned has, `A` after
//!    that, no registration left at its (running) DC: all were told `Moved`;
//! 2. a reservation continuously vacant — released, or its lease past
//!    expiry + grace by its DC's clock — for `A` with a registration older
//!    than `A` has had a waiter woken with `Vacated` within the last `H + A`
//!    and no live holder since that wake-up (else the hand-off has ended or
//!    been cleared, and the next waiter is due);
//! 3. a registration is answered by its deadline + `A`;
//! 4. an origin's `Await` whose registration is lost — the tail's DC
//!    crashed with it (or was down when it was sent), or the network could
//!    not deliver its wake-up (the connection died) — ends (so the origin may
//!    register again) within the idle timeout + `A` after the loss; after a
//!    crash, also within `K` + the round trip + `A` after the tail's DC runs
//!    again (`K` the keep-alive: the origin's next packet draws a stateless
//!    reset from the new process, which shares the old one's identity);
//! 5. an origin's `Await` ends by the origin's own deadline + `A` (the wait
//!    is bounded by the origin, not by the tail's answer).
//!
//! `waiter_fifo`: a `Vacated` wake-up goes to the earliest registration
//! still waiting for that reservation in that homingd.
//!
//! With several homingd per DC, registrations are kept per homingd (each
//! has its own queue and hand-off window), a commit is owed to the waiters
//! of every homingd of the DC, `A` also covers one `log_follow_ms` and two
//! store reads (the follower's page and record), and in rule 2 a wake-up
//! covers its hand-off window even if a holder was live since: one that
//! came and went through another homingd between two of this one's log
//! reads is never seen here.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use homing_core::{
    DcRecord, LeasePolicy, RecordRead, RecordState, RecordView, ReservationId, SessionEnd,
    SessionRecord, SessionState, TailState,
};

use crate::clock::NodeClock;
use crate::event::Homingd;
use crate::invariants::{Invariant, View, Violation};
use crate::trace::NO_KEY;

#[derive(Debug, Clone)]
struct Registration {
    id: ReservationId,
    key: u32,
    at_us: u64,
    deadline_us: u64,
}

#[derive(Debug, Default)]
struct Track {
    /// Waiting tickets, in registration order.
    order: VecDeque<u64>,
    last_wake_us: Option<u64>,
    last_live_us: Option<u64>,
    moved_at_us: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum Obligation {
    /// Rules 1 and 2 for a reservation at a homingd.
    Tail(Homingd, ReservationId),
    /// Rule 3 for a ticket of a homingd.
    Deadline(Homingd, u64),
    /// Rule 4 for an origin homingd's `Await` RPC (and when its registration was lost).
    Origin(Homingd, u64, u64),
    /// Rule 5 for an origin homingd's `Await` RPC.
    OriginDeadline(Homingd, u64),
}

/// What the checker knows of the QUIC connections an `Await` rides.
#[derive(Debug, Clone)]
pub struct Connections {
    /// The idle timeout, µs.
    pub idle_us: u64,
    /// The keep-alive of a DC's connections to its peers, µs.
    pub keep_alive_us: u64,
    /// Round trip between DCs `[a][b]` without jitter, µs.
    pub rtt_us: Vec<Vec<u64>>,
}

/// An origin's pending `Await`.
#[derive(Debug, Clone, Copy)]
struct OriginAwait {
    /// The tail's homingd it was sent to.
    tail: Homingd,
    /// When the origin's wait ends, true µs.
    deadline_us: u64,
}

/// The wake-up checkers' state.
#[derive(Debug)]
pub struct WakeChecker {
    allowance_us: u64,
    handoff_us: u64,
    connections: Connections,
    dc_clocks: Vec<NodeClock>,
    policy: LeasePolicy,
    /// How many homingd each DC runs.
    instances: u8,
    regs: BTreeMap<(Homingd, u64), Registration>,
    tracks: BTreeMap<(Homingd, ReservationId), Track>,
    origin_pending: BTreeMap<(Homingd, u64), OriginAwait>,
    /// Homingd that are down, with when they crashed (true µs).
    down_since: BTreeMap<Homingd, u64>,
    due: BTreeSet<(u64, u64, Obligation)>,
    seq: u64,
    violation: Option<Violation>,
}

impl WakeChecker {
    /// A checker allowing `allowance_us` for store work and timers, with
    /// hand-off window `handoff_ms` and `connections` between the DCs.
    pub fn new(
        allowance_us: u64,
        handoff_ms: u64,
        connections: Connections,
        dc_clocks: Vec<NodeClock>,
        policy: LeasePolicy,
        instances: u8,
    ) -> WakeChecker {
        WakeChecker {
            instances,
            allowance_us,
            handoff_us: handoff_ms * 1000,
            connections,
            dc_clocks,
            policy,
            regs: BTreeMap::new(),
            tracks: BTreeMap::new(),
            origin_pending: BTreeMap::new(),
            down_since: BTreeMap::new(),
            due: BTreeSet::new(),
            seq: 0,
            violation: None,
        }
    }

    /// The first violation, once.
    pub fn take_violation(&mut self) -> Option<Violation> {
        self.violation.take()
    }

    fn oblige(&mut self, at_us: u64, what: Obligation) {
        self.seq += 1;
        self.due.insert((at_us, self.seq, what));
    }

    /// The true instant DC `d`'s clock reaches the reapable time of a lease
    /// expiring at `record`'s expiry (`session`: its session's row, for a
    /// key held under one).
    fn lapse_us(
        &self,
        d: Homingd,
        record: &DcRecord,
        session: Option<&SessionRecord>,
    ) -> Option<u64> {
        let at = self.policy.reapable_at(record.held_until(session)?);
        Some(self.dc_clocks[d.d()].first_true_us_at_ms(at.as_ms()))
    }

    /// A waiter registered at DC `d` for `id` (whose record reads `record`).
    #[allow(clippy::too_many_arguments)] // the registration, field by field
    pub fn on_register(
        &mut self,
        now_us: u64,
        d: Homingd,
        id: &ReservationId,
        key: u32,
        ticket: u64,
        deadline_us: u64,
        read: &RecordRead,
    ) {
        let registration = Registration {
            id: id.clone(),
            key,
            at_us: now_us,
            deadline_us,
        };
        self.regs.insert((d, ticket), registration);
        let track = self.tracks.entry((d, id.clone())).or_default();
        track.order.push_back(ticket);
        let a = self.allowance_us;
        self.oblige(now_us + a + 1, Obligation::Tail(d, id.clone()));
        self.oblige(deadline_us + a + 1, Obligation::Deadline(d, ticket));
        if let Some(lapse) = self.lapse_us(d, &read.record, read.session()) {
            self.oblige(lapse.max(now_us) + a + 1, Obligation::Tail(d, id.clone()));
        }
    }

    fn forget(&mut self, d: Homingd, ticket: u64) -> Option<Registration> {
        let registration = self.regs.remove(&(d, ticket))?;
        let key = (d, registration.id.clone());
        if let Some(track) = self.tracks.get_mut(&key) {
            track.order.retain(|t| *t != ticket);
        }
        Some(registration)
    }

    /// A waiter was woken (`Vacated` when `vacated`, else `Moved`).
    pub fn on_wake(
        &mut self,
        now_us: u64,
        d: Homingd,
        id: &ReservationId,
        ticket: u64,
        vacated: bool,
    ) {
        let key = (d, id.clone());
        let first = self.tracks.get(&key).and_then(|t| t.order.front().copied());
        let registration = self.forget(d, ticket);
        if !vacated {
            return;
        }
        if let Some(track) = self.tracks.get_mut(&key) {
            track.last_wake_us = Some(now_us);
        }
        let due = now_us + self.handoff_us + self.allowance_us + 1;
        self.oblige(due, Obligation::Tail(d, id.clone()));
        if first == Some(ticket) || self.violation.is_some() {
            return;
        }
        let k = registration.as_ref().map_or(NO_KEY, |r| r.key);
        self.violation = Some(Violation {
            invariant: Invariant::WaiterFifo,
            key: (k != NO_KEY).then_some(k),
            detail: format!(
                "homingd #{d} woke ticket {ticket} for {id} (k{k}) while ticket {first:?}, registered earlier, still waits"
            ),
        });
    }

    /// A waiter left without being woken (timed out, failed).
    pub fn on_left(&mut self, d: Homingd, ticket: u64) {
        self.forget(d, ticket);
    }

    /// DC `dc` committed `record`.
    pub fn on_commit(
        &mut self,
        now_us: u64,
        dc: u16,
        record: &DcRecord,
        session: Option<&SessionRecord>,
    ) {
        // The store is the DC's: every homingd of it owes its waiters the write.
        for i in 0..self.instances {
            self.on_commit_at(now_us, Homingd::new(dc, i), record, session);
        }
    }

    fn on_commit_at(
        &mut self,
        now_us: u64,
        d: Homingd,
        record: &DcRecord,
        session: Option<&SessionRecord>,
    ) {
        let key = (d, record.id.clone());
        let Some(track) = self.tracks.get_mut(&key) else {
            return;
        };
        if track.order.is_empty() {
            self.tracks.remove(&key);
            return;
        }
        let clock = self.dc_clocks[d.d()];
        let view = record.view(clock.store_time(now_us), &self.policy, session);
        let a = self.allowance_us;
        match view {
            RecordView::Link(_) | RecordView::Abandoned => {
                track.moved_at_us.get_or_insert(now_us);
                self.oblige(now_us + a + 1, Obligation::Tail(d, record.id.clone()));
            }
            RecordView::Tail(tail) => match tail.state {
                TailState::Active { .. } => {
                    track.last_live_us = Some(now_us);
                    if let Some(lapse) = self.lapse_us(d, record, session) {
                        self.oblige(lapse + a + 1, Obligation::Tail(d, record.id.clone()));
                    }
                }
                TailState::Vacant { .. } => {
                    self.oblige(now_us + a + 1, Obligation::Tail(d, record.id.clone()));
                }
            },
        }
    }

    /// The pending origin `Await`s sent to DC `tail`.
    fn awaiting(&self, tail: Homingd) -> Vec<(Homingd, u64)> {
        self.origin_pending
            .iter()
            .filter(|(_, a)| a.tail == tail)
            .map(|(k, _)| *k)
            .collect()
    }

    /// DC `d` shuts down gracefully (or crashes: then also as below): its
    /// registrations end — answered `TimedOut` or lost —, none is owed a
    /// wake-up any more.
    pub fn on_dc_close(&mut self, d: Homingd) {
        let answered: Vec<u64> = self
            .regs
            .range((d, 0)..=(d, u64::MAX))
            .map(|(k, _)| k.1)
            .collect();
        for ticket in answered {
            self.forget(d, ticket);
        }
        self.tracks.retain(|(dc, _), _| *dc != d);
    }

    /// DC `d` crashed: its registrations, and every `Await` on its way to
    /// it, are lost; their origins must notice.
    pub fn on_dc_crash(&mut self, now_us: u64, d: Homingd) {
        self.on_dc_close(d);
        self.origin_pending.retain(|(o, _), _| *o != d);
        let due = now_us + self.connections.idle_us + self.allowance_us + 1;
        for (o, rpc) in self.awaiting(d) {
            self.oblige(due, Obligation::Origin(o, rpc, now_us));
        }
        self.down_since.insert(d, now_us);
    }

    /// DC `d` runs again: every `Await` still pending on it rode a
    /// connection to its previous process, which the origin's next packet
    /// resets.
    pub fn on_dc_restart(&mut self, now_us: u64, d: Homingd) {
        self.down_since.remove(&d);
        for (o, rpc) in self.awaiting(d) {
            let rtt_us = self.connections.rtt_us[o.d()][d.d()];
            let due = now_us + self.connections.keep_alive_us + rtt_us + self.allowance_us + 1;
            self.oblige(due, Obligation::Origin(o, rpc, now_us));
        }
    }

    /// Origin DC `o` sent an `Await` to DC `tail` as RPC `rpc`, its own wait
    /// ending at `deadline_us`.
    pub fn on_origin_sent(
        &mut self,
        now_us: u64,
        o: Homingd,
        rpc: u64,
        tail: Homingd,
        deadline_us: u64,
    ) {
        self.origin_pending
            .insert((o, rpc), OriginAwait { tail, deadline_us });
        let a = self.allowance_us;
        self.oblige(deadline_us + a + 1, Obligation::OriginDeadline(o, rpc));
        if let Some(&down_us) = self.down_since.get(&tail) {
            // Sent to a dead process: lost at once, noticed like a crash's loss.
            let lost_us = now_us.max(down_us);
            let due = (down_us + self.connections.idle_us).max(now_us) + a + 1;
            self.oblige(due, Obligation::Origin(o, rpc, lost_us));
        }
    }

    /// Origin DC `o`'s `Await` RPC ended (answered, failed, timed out,
    /// connection lost, or its deadline passed).
    pub fn on_origin_done(&mut self, o: Homingd, rpc: u64) {
        self.origin_pending.remove(&(o, rpc));
    }

    /// The answer to origin `o`'s `Await` RPC could not be delivered (the connection died).
    pub fn on_reply_undeliverable(&mut self, now_us: u64, o: Homingd, rpc: u64) {
        if self.origin_pending.contains_key(&(o, rpc)) {
            let due = now_us + self.connections.idle_us + self.allowance_us + 1;
            self.oblige(due, Obligation::Origin(o, rpc, now_us));
        }
    }

    /// Judges every obligation that fell due before `before_us`; returns the
    /// first violated one's instant and what was seen.
    pub fn check_due(&mut self, before_us: u64, view: &View<'_>) -> Option<(u64, Violation)> {
        while let Some((due, _, _)) = self.due.first()
            && *due < before_us
        {
            // Invariant: `first` just returned an element.
            let (due, _, what) = self.due.pop_first().expect("an obligation");
            if let Some(v) = self.judge(due, &what, view) {
                return Some((due, v));
            }
            // A session key's lease runs as long as its session is renewed:
            // judged again when the session as it stands now would lapse.
            if let Obligation::Tail(d, id) = &what
                && let Some(lapse) = self.session_lapse_us(*d, id, view)
                && lapse > due
            {
                self.oblige(lapse + self.allowance_us + 1, what.clone());
            }
        }
        None
    }

    fn judge(&self, t: u64, what: &Obligation, view: &View<'_>) -> Option<Violation> {
        let violation = |key: u32, detail: String| Violation {
            invariant: Invariant::NoLostWakeup,
            key: (key != NO_KEY).then_some(key),
            detail,
        };
        match what {
            Obligation::Deadline(d, ticket) => {
                let r = self.regs.get(&(*d, *ticket))?;
                view.dcs.up(d.d()).then(|| {
                    violation(r.key, format!(
                        "ticket {ticket} for {} at homingd #{d} still waits {}µs past its deadline",
                        r.id,
                        t - r.deadline_us
                    ))
                })
            }
            Obligation::Origin(o, rpc, lost_us) => {
                self.origin_pending.contains_key(&(*o, *rpc)).then(|| {
                    violation(NO_KEY, format!(
                        "homingd #{o} still waits on await rpc {rpc} {}µs after its registration or answer was lost (or the tail's dc restarted)",
                        t - lost_us
                    ))
                })
            }
            Obligation::OriginDeadline(o, rpc) => {
                let pending = self.origin_pending.get(&(*o, *rpc))?;
                Some(violation(NO_KEY, format!(
                    "homingd #{o} still waits on await rpc {rpc} {}µs past its own deadline",
                    t - pending.deadline_us
                )))
            }
            Obligation::Tail(d, id) => self.judge_tail(t, *d, id, view).map(|(k, m)| violation(k, m)),
        }
    }

    /// When the session lease of `id`, a tail at `d` with waiters, would
    /// lapse by its session's row as it stands (`None`: not a session key,
    /// or no waiter).
    fn session_lapse_us(&self, d: Homingd, id: &ReservationId, view: &View<'_>) -> Option<u64> {
        let track = self.tracks.get(&(d, id.clone()))?;
        if track.order.is_empty() || !view.dcs.up(d.d()) {
            return None;
        }
        let record = view.dcs.store(d.d()).record(id)?;
        record.session()?;
        let session = view.session_row(d.d(), record);
        self.lapse_us(d, record, session.as_ref())
    }

    fn judge_tail(
        &self,
        t: u64,
        d: Homingd,
        id: &ReservationId,
        view: &View<'_>,
    ) -> Option<(u32, String)> {
        let dc = d.d();
        let track = self.tracks.get(&(d, id.clone()))?;
        let a = self.allowance_us;
        let old: Vec<&Registration> = track
            .order
            .iter()
            .filter_map(|ticket| self.regs.get(&(d, *ticket)))
            .filter(|r| r.at_us + a <= t)
            .collect();
        let first = old.first()?;
        if !view.dcs.up(dc) {
            return None;
        }
        let record = view.dcs.store(dc).record(id)?;
        let clock = self.dc_clocks[d.d()];
        let vacant_since = match &record.state {
            RecordState::Linked { .. } | RecordState::Abandoned => {
                let since = track.moved_at_us.unwrap_or(first.at_us);
                return (since + a <= t).then(|| {
                    (first.key, format!(
                        "{} waiter(s) for {id} at homingd #{d} still wait {}µs after it stopped being a tail (nobody told them Moved)",
                        old.len(),
                        t - since
                    ))
                });
            }
            RecordState::Released { at, .. } => clock.first_true_us_at_ms(at.as_ms()),
            RecordState::Active { .. } => {
                let session = view.session_row(dc, record);
                // A session closed at another homingd of the DC: this one
                // learns its keys are vacant when the upkeep reaps them
                // (the reap's write reaches its log follower), not at the
                // close plus grace (OPERATIONS "Several homingd per DC").
                if self.instances > 1
                    && session.as_ref().is_some_and(|row| {
                        matches!(
                            row.state,
                            SessionState::Ended {
                                cause: SessionEnd::Closed,
                                ..
                            }
                        )
                    })
                {
                    return None;
                }
                self.lapse_us(d, record, session.as_ref())?
            }
        };
        if vacant_since + a > t {
            return None;
        }
        // With several homingd per DC a live holder may have come and gone
        // through another between two reads of this one's log follower,
        // unseen here: this homingd's hand-off window then holds its queue
        // to its end (OPERATIONS "Several homingd per DC").
        let unseen_live = self.instances > 1;
        let covered = track.last_wake_us.is_some_and(|w| {
            w + self.handoff_us + a >= t
                && (unseen_live || track.last_live_us.is_none_or(|l| l <= w))
        });
        (!covered).then(|| {
            (first.key, format!(
                "{id} at homingd #{d} vacant for {}µs with {} waiter(s) registered (the first {}µs ago), last wake-up {:?}, last live holder {:?}: nobody was woken",
                t - vacant_since,
                old.len(),
                t - first.at_us,
                track.last_wake_us.map(|w| format!("{}µs ago", t - w)),
                track.last_live_us.map(|l| format!("{}µs ago", t.saturating_sub(l))),
            ))
        })
    }
}
