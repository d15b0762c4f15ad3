//! Parked acquirers (DESIGN.md §3.1 with `wait_ms`). An acquire whose key is
//! held waits at the DC that owns the holder's reservation; that DC wakes
//! its waiters from the records it writes or reads — never by polling the
//! key (a DC of several homingd sees the others' writes in its store's
//! event log, [`crate::LogFollower`]):
//!
//! - vacant (released, or the lease lapsed past expiry + grace): the first
//!   waiter still listening is woken alone (first come, first served) and
//!   gets the hand-off window (`handoff_ms`) to take the reservation; if the
//!   reservation is still vacant when the window ends, the next is woken;
//! - linked or abandoned: every waiter is woken to walk the chain again;
//! - re-activated: the waiters keep waiting, and the hand-off ends.
//!
//! Bounded per reservation and in total. [`Waiters`] is generic over the
//! driver's handle `W` for one waiter (homingd: a channel to its request
//! task; the simulator: a task number): it decides who is woken with what,
//! and hands the handles back for the driver to deliver. A waiter whose
//! caller went away leaves with [`Waiters::leave`].

use std::collections::{BTreeMap, VecDeque};

use homing_core::{
    AwaitReply, DcRecord, LeasePolicy, RecordRead, RecordState, RecordView, ReservationId,
    SessionId, SessionRecord, StoreTime, TailState,
};

use crate::step::queue::{Full, Handoff, QueueOp, Queued, Ticket};
use crate::step::time::NodeTime;
use homing_core::mutation::{Mutation, Mutations};

/// How many may wait and how long a woken waiter has to take its turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WaitLimits {
    /// Most waiters on one reservation.
    pub per_key: usize,
    /// Most waiters in this DC.
    pub total: usize,
    /// How long a woken first waiter has the vacant reservation to itself, in milliseconds.
    pub handoff_ms: u64,
}

impl Default for WaitLimits {
    fn default() -> WaitLimits {
        WaitLimits {
            per_key: 64,
            total: 10_000,
            handoff_ms: 2_000,
        }
    }
}

/// A waiter woken: deliver `reply` to `waiter`; it has left the queue.
#[derive(Debug)]
pub struct Wake<W> {
    /// The driver's handle.
    pub waiter: W,
    /// Its registration.
    pub ticket: Ticket,
    /// What it is told.
    pub reply: AwaitReply,
}

/// What one record change did to its waiters.
#[derive(Debug)]
pub struct Notified<W> {
    /// Waiters woken, in queue order; each has left the queue.
    pub woken: Vec<Wake<W>>,
    /// Waiters dropped because their caller no longer listened.
    pub gone: Vec<W>,
    /// The hand-off window moved (began or ended): the waiters still queued
    /// must re-arm their timers ([`Waiters::queued`] lists them).
    pub handoff_moved: bool,
    /// A vacant reservation's window ended without being taken and the turn
    /// passed on.
    pub handoff_expired: bool,
}

impl<W> Default for Notified<W> {
    /// Nothing happened.
    fn default() -> Notified<W> {
        Notified {
            woken: Vec::new(),
            gone: Vec::new(),
            handoff_moved: false,
            handoff_expired: false,
        }
    }
}

impl<W> Notified<W> {
    /// Nobody woken, the waiters still queued told to look again (as when
    /// the hand-off moved): what [`Endpoint::note`](crate::Endpoint::note)'s
    /// reservations get.
    pub fn roused() -> Notified<W> {
        Notified {
            handoff_moved: true,
            ..Notified::default()
        }
    }
}

#[derive(Debug)]
struct Queue<W> {
    waiters: VecDeque<(Ticket, W)>,
    /// Until when the last woken waiter has the vacant reservation to itself.
    handoff_until: Option<NodeTime>,
    /// Bumped whenever the hand-off moves.
    version: u64,
    /// The host session the reservation was last seen held under.
    session: Option<SessionId>,
}

impl<W> Queue<W> {
    /// The reservation is held again: a hand-off window open for it is
    /// over. Whether one was.
    fn end_handoff(&mut self) -> bool {
        let open = self.handoff_until.take().is_some();
        if open {
            self.version += 1;
        }
        open
    }

    /// Its waiters must look again (their reservation's lapse moved): a
    /// hand-off window open for it is over, and the version moves.
    fn rouse(&mut self) {
        self.handoff_until = None;
        self.version += 1;
    }
}

/// The parked acquirers of one DC.
#[derive(Debug)]
pub struct Waiters<W> {
    limits: WaitLimits,
    mutations: Mutations,
    queues: BTreeMap<ReservationId, Queue<W>>,
    total: usize,
    next_ticket: u64,
}

impl<W> Waiters<W> {
    /// Nobody waits yet.
    pub fn new(limits: WaitLimits, mutations: Mutations) -> Waiters<W> {
        Waiters {
            limits,
            mutations,
            queues: BTreeMap::new(),
            total: 0,
            next_ticket: 0,
        }
    }

    /// The limits.
    pub fn limits(&self) -> &WaitLimits {
        &self.limits
    }

    /// How many wait now.
    pub fn len(&self) -> usize {
        self.total
    }

    /// Whether nobody waits.
    pub fn is_empty(&self) -> bool {
        self.total == 0
    }

    /// Whether someone already waits for `reservation` (a newcomer queues behind).
    pub fn has_waiters(&self, reservation: &ReservationId) -> bool {
        self.queues.contains_key(reservation)
    }

    /// Every reservation someone waits for.
    pub fn reservations(&self) -> impl Iterator<Item = &ReservationId> {
        self.queues.keys()
    }

    /// Until when a woken waiter has `reservation` to itself, if one does.
    pub fn handoff_until(&self, reservation: &ReservationId) -> Option<NodeTime> {
        self.queues.get(reservation).and_then(|q| q.handoff_until)
    }

    /// How often `reservation`'s hand-off moved: a parked waiter that saw
    /// another number re-reads the record.
    pub fn handoff_version(&self, reservation: &ReservationId) -> u64 {
        self.queues.get(reservation).map_or(0, |q| q.version)
    }

    /// The waiters still queued for `reservation`, first first.
    pub fn queued(&self, reservation: &ReservationId) -> impl Iterator<Item = &W> {
        self.queues
            .get(reservation)
            .into_iter()
            .flat_map(|q| q.waiters.iter().map(|(_, w)| w))
    }

    /// Queues `waiter` for `reservation`, behind those already there.
    pub fn register(&mut self, reservation: &ReservationId, waiter: W) -> Result<Ticket, Full> {
        if self.total >= self.limits.total {
            return Err(Full::Dc(self.total));
        }
        let queue = self
            .queues
            .entry(reservation.clone())
            .or_insert_with(|| Queue {
                waiters: VecDeque::new(),
                handoff_until: None,
                version: 0,
                session: None,
            });
        if queue.waiters.len() >= self.limits.per_key {
            let waiting = queue.waiters.len();
            if waiting == 0 {
                self.queues.remove(reservation);
            }
            return Err(Full::Reservation {
                reservation: reservation.clone(),
                waiting,
            });
        }
        let ticket = Ticket(self.next_ticket);
        self.next_ticket += 1;
        queue.waiters.push_back((ticket, waiter));
        self.total += 1;
        Ok(ticket)
    }

    /// `ticket` leaves `reservation`'s queue (its caller went away or its
    /// wait ended); returns its handle if it was still queued.
    pub fn leave(&mut self, reservation: &ReservationId, ticket: Ticket) -> Option<W> {
        let queue = self.queues.get_mut(reservation)?;
        let at = queue.waiters.iter().position(|(t, _)| *t == ticket)?;
        let (_, waiter) = queue.waiters.remove(at)?;
        if queue.waiters.is_empty() {
            self.queues.remove(reservation);
        }
        self.total -= 1;
        Some(waiter)
    }

    /// Performs a waiter's `op` at `store_now` / `now`: a join queues the
    /// waiter's handle made by `handle`; a notify wakes whom the record
    /// lets go, `listening` saying whether a caller still waits. Returns
    /// the answer for the waiter and what the driver must deliver.
    pub fn queue(
        &mut self,
        op: QueueOp,
        store_now: StoreTime,
        now: NodeTime,
        policy: &LeasePolicy,
        handle: impl FnOnce() -> W,
        listening: impl FnMut(&W) -> bool,
    ) -> (Queued, Notified<W>) {
        let handoff = |w: &Waiters<W>, id: &ReservationId| Handoff {
            version: w.has_waiters(id).then(|| w.handoff_version(id)),
            until: w.handoff_until(id),
        };
        match op {
            QueueOp::Join {
                reservation,
                settled,
            } => {
                let queued = match settled {
                    // Free now and nobody ahead: no need to queue.
                    Some(reply) if !self.has_waiters(&reservation) => Queued::Settled(reply),
                    _ => match self.register(&reservation, handle()) {
                        Ok(ticket) => Queued::Joined(ticket, handoff(self, &reservation)),
                        Err(full) => Queued::Full(full),
                    },
                };
                (queued, Notified::default())
            }
            QueueOp::Notify(read) => {
                let (record, session) = (&read.record, read.session());
                let notified = self.notify(record, session, store_now, now, policy, listening);
                (Queued::Handoff(handoff(self, &record.id)), notified)
            }
            QueueOp::Handoff(id) => (Queued::Handoff(handoff(self, &id)), Notified::default()),
        }
    }

    /// The rules it breaks on purpose (none in production).
    pub fn mutations(&self) -> Mutations {
        self.mutations
    }

    /// `record` (of this DC) was just written: its waiters learn of it.
    /// Every landed write of a record must come through here.
    pub fn written(
        &mut self,
        record: &DcRecord,
        store_now: StoreTime,
        now: NodeTime,
        policy: &LeasePolicy,
        listening: impl FnMut(&W) -> bool,
    ) -> Notified<W> {
        if self.mutations.has(Mutation::WriteForgetsWaiters) {
            return Notified::default();
        }
        if record.session().is_some() {
            // A key written held under a session joined it or froze in it:
            // neither lets a waiter go, but when it lapses changed (a
            // frozen key lapses at its own expiry, before its session's)
            // and judging it needs the session's row, which a write does
            // not carry. Its waiters are roused to read it again, with the
            // row; a hand-off window open for it is over (it is held).
            let mut out = Notified::default();
            if let Some(queue) = self.queues.get_mut(&record.id)
                && matches!(record.state, RecordState::Active { .. })
            {
                queue.session = record.session().cloned();
                queue.rouse();
                out.handoff_moved = true;
            }
            return out;
        }
        self.notify(record, None, store_now, now, policy, listening)
    }

    /// Host session `id` was closed here: the keys held under it are
    /// vacant from its end plus grace, sooner than their waiters parked
    /// for. Moves the hand-off version of every queue whose reservation was
    /// last seen held under it, and returns those reservations: their
    /// waiters must look again (the driver rouses them, as for a moved
    /// hand-off).
    pub fn session_closed(&mut self, id: &SessionId) -> Vec<ReservationId> {
        let mut roused = Vec::new();
        for (reservation, queue) in &mut self.queues {
            if queue.session.as_ref() == Some(id) {
                queue.rouse();
                roused.push(reservation.clone());
            }
        }
        roused
    }

    /// `read` (of this DC) is another homingd's write, as its log follower
    /// read it back: wakes the waiters its state lets go, as
    /// [`Waiters::notify`]. A key still held under a session also rouses
    /// its waiters here, as [`Waiters::written`] does on the writer: the
    /// write may have frozen it, which moves its lapse before its
    /// session's.
    pub fn seen(
        &mut self,
        read: &RecordRead,
        store_now: StoreTime,
        now: NodeTime,
        policy: &LeasePolicy,
        listening: impl FnMut(&W) -> bool,
    ) -> Notified<W> {
        let (record, session) = (&read.record, read.session());
        let mut out = self.notify(record, session, store_now, now, policy, listening);
        if record.session().is_some()
            && out.woken.is_empty()
            && let Some(queue) = self.queues.get_mut(&record.id)
        {
            queue.rouse();
            out.handoff_moved = true;
        }
        out
    }

    /// `record` (of this DC) was read or written at `store_now` (store
    /// clock) and `now` (node clock), with the row of its session if it is
    /// held under one: wakes the waiters its state lets go.
    /// `listening` says whether a waiter's caller still waits; the first
    /// vacancy goes to the first that does, the others are dropped.
    pub fn notify(
        &mut self,
        record: &DcRecord,
        session: Option<&SessionRecord>,
        store_now: StoreTime,
        now: NodeTime,
        policy: &LeasePolicy,
        mut listening: impl FnMut(&W) -> bool,
    ) -> Notified<W> {
        let mut out = Notified::default();
        let Some(queue) = self.queues.get_mut(&record.id) else {
            return out;
        };
        let queued = queue.waiters.len();
        queue.session = record.session().cloned();
        match record.view(store_now, policy, session) {
            RecordView::Link(_) | RecordView::Abandoned => {
                for (ticket, waiter) in queue.waiters.drain(..) {
                    let reply = AwaitReply::Moved;
                    out.woken.push(Wake {
                        waiter,
                        ticket,
                        reply,
                    });
                }
            }
            RecordView::Tail(tail) => match tail.state {
                TailState::Active { .. } => out.handoff_moved = queue.end_handoff(),
                TailState::Vacant { ended } => {
                    let in_handoff = queue.handoff_until.is_some_and(|t| t > now);
                    if !in_handoff {
                        out.handoff_expired = queue.handoff_until.is_some();
                        let pops_back = self.mutations.has(Mutation::WaiterQueuePopsBack);
                        loop {
                            let next = if pops_back {
                                queue.waiters.pop_back()
                            } else {
                                queue.waiters.pop_front()
                            };
                            let Some((ticket, waiter)) = next else { break };
                            if listening(&waiter) {
                                let reply = AwaitReply::Vacated { ended };
                                out.woken.push(Wake {
                                    waiter,
                                    ticket,
                                    reply,
                                });
                                break;
                            }
                            out.gone.push(waiter);
                        }
                        queue.handoff_until = Some(now.plus_ms(self.limits.handoff_ms));
                        queue.version += 1;
                        out.handoff_moved = true;
                    }
                }
            },
        }
        let left = queue.waiters.len();
        if left == 0 {
            self.queues.remove(&record.id);
        }
        self.total -= queued - left;
        out
    }

    /// Every waiter leaves, woken with `reply` (shutdown).
    pub fn wake_all(&mut self, reply: AwaitReply) -> Vec<Wake<W>> {
        let mut woken = Vec::with_capacity(self.total);
        for (_, queue) in std::mem::take(&mut self.queues) {
            for (ticket, waiter) in queue.waiters {
                let reply = reply.clone();
                woken.push(Wake {
                    waiter,
                    ticket,
                    reply,
                });
            }
        }
        self.total = 0;
        woken
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use homing_core::{FencingToken, RunOutcome};

    const POLICY: LeasePolicy = LeasePolicy::DEFAULT;

    fn held() -> DcRecord {
        crate::fixture::held("iad.1", "k", None, StoreTime::from_ms(0))
    }

    fn released(record: &DcRecord) -> DcRecord {
        record
            .release(
                FencingToken::FIRST,
                &homing_core::LeaseKey::from_bytes([1; 16]).unwrap(),
                RunOutcome::Ok,
                StoreTime::from_ms(2),
            )
            .next
            .unwrap()
    }

    fn limits() -> WaitLimits {
        WaitLimits {
            per_key: 2,
            total: 3,
            handoff_ms: 60_000,
        }
    }

    fn waiters() -> Waiters<&'static str> {
        Waiters::new(limits(), Mutations::NONE)
    }

    fn at(ms: u64) -> (StoreTime, NodeTime) {
        (StoreTime::from_ms(ms), NodeTime::from_us(ms * 1000))
    }

    fn names(n: &Notified<&'static str>) -> Vec<&'static str> {
        n.woken.iter().map(|w| w.waiter).collect()
    }

    #[test]
    fn waiting_vacated_wakes_the_first_waiter_only_and_holds_the_handoff() {
        let mut w = waiters();
        let record = held();
        w.register(&record.id, "first").unwrap();
        w.register(&record.id, "second").unwrap();
        let (s, n) = at(1);
        assert!(names(&w.notify(&record, None, s, n, &POLICY, |_| true)).is_empty());
        let vacant = released(&record);
        let (s, n) = at(2);
        let woke = w.written(&vacant, s, n, &POLICY, |_| true);
        assert_eq!(names(&woke), ["first"]);
        assert!(woke.handoff_moved && !woke.handoff_expired);
        assert_eq!(w.handoff_until(&record.id), Some(n.plus_ms(60_000)));
        // Within the hand-off window nobody else is woken.
        let (s, n) = at(3);
        assert!(names(&w.notify(&vacant, None, s, n, &POLICY, |_| true)).is_empty());
        // After it, the next one is.
        let (s, n) = at(60_003);
        let woke = w.notify(&vacant, None, s, n, &POLICY, |_| true);
        assert_eq!(names(&woke), ["second"]);
        assert!(woke.handoff_expired);
        assert!(w.is_empty());
    }

    #[test]
    fn waiting_a_waiter_no_longer_listening_passes_its_turn_on() {
        let mut w = waiters();
        let record = held();
        w.register(&record.id, "gone").unwrap();
        w.register(&record.id, "here").unwrap();
        let (s, n) = at(2);
        let woke = w.notify(&released(&record), None, s, n, &POLICY, |w| *w != "gone");
        assert_eq!(names(&woke), ["here"]);
        assert_eq!(woke.gone, ["gone"]);
        assert!(w.is_empty());
    }

    #[test]
    fn waiting_bounds_are_per_reservation_and_total() {
        let mut w = waiters();
        let a: ReservationId = "iad.1".parse().unwrap();
        let b: ReservationId = "iad.2".parse().unwrap();
        w.register(&a, "a1").unwrap();
        w.register(&a, "a2").unwrap();
        assert!(matches!(
            w.register(&a, "a3"),
            Err(Full::Reservation { waiting: 2, .. })
        ));
        w.register(&b, "b1").unwrap();
        assert_eq!(w.register(&b, "b2").err(), Some(Full::Dc(3)));
        assert_eq!(w.len(), 3);
    }

    #[test]
    fn waiting_a_link_wakes_everyone_to_walk_again() {
        let mut w = waiters();
        let record = held();
        w.register(&record.id, "first").unwrap();
        w.register(&record.id, "second").unwrap();
        let (s, n) = at(100_000);
        let linked = record
            .link(
                &record.key,
                &"fra.1".parse().unwrap(),
                FencingToken::FIRST,
                s,
                &POLICY,
                None,
            )
            .next
            .unwrap();
        let woke = w.written(&linked, s, n, &POLICY, |_| true);
        assert_eq!(names(&woke), ["first", "second"]);
        assert!(woke.woken.iter().all(|w| w.reply == AwaitReply::Moved));
        assert!(w.is_empty());
    }

    #[test]
    fn waiting_a_reactivation_ends_the_handoff_and_keeps_the_queue() {
        let mut w = waiters();
        let record = held();
        w.register(&record.id, "first").unwrap();
        w.register(&record.id, "second").unwrap();
        let (s, n) = at(2);
        w.notify(&released(&record), None, s, n, &POLICY, |_| true);
        let version = w.handoff_version(&record.id);
        let woke = w.notify(&record, None, s, n, &POLICY, |_| true);
        assert!(woke.woken.is_empty() && woke.handoff_moved);
        assert_eq!(w.handoff_until(&record.id), None);
        assert_eq!(w.handoff_version(&record.id), version + 1);
        assert_eq!(
            w.queued(&record.id).copied().collect::<Vec<_>>(),
            ["second"]
        );
    }

    /// The woken waiter takes the key under its host session, then
    /// releases it: the next waiter is woken at once. The session's write
    /// used to leave the hand-off window open (a write held under a session
    /// was not looked at), so the next waiter waited out the whole window —
    /// seen by the simulator's session hosts (`no_lost_wakeup`, swarm seed
    /// 162).
    #[test]
    fn waiting_a_key_taken_under_a_session_ends_the_handoff() {
        let mut w = waiters();
        let taken = crate::fixture::held_in_session(&crate::fixture::session(), 1);
        let id = taken.id.clone();
        w.register(&id, "first").unwrap();
        w.register(&id, "second").unwrap();
        let vacant = released(&held_at(&id));
        let (s, n) = at(2);
        assert_eq!(
            names(&w.written(&vacant, s, n, &POLICY, |_| true)),
            ["first"]
        );
        let woke = w.written(&taken, s, n, &POLICY, |_| true);
        assert!(woke.woken.is_empty() && woke.handoff_moved);
        assert_eq!(w.handoff_until(&id), None);
        let (s, n) = at(3);
        assert_eq!(
            names(&w.written(&vacant, s, n, &POLICY, |_| true)),
            ["second"]
        );
    }

    /// A key held under a session is drained (frozen at its session's
    /// expiry as it stands, which the session then outlives): its waiters
    /// are roused to read it again, or they would sleep until the
    /// session's lapse, well past the key's — seen by the simulator
    /// (`no_lost_wakeup`, swarm seed 330: a waiter parked until 43.1 s for
    /// a key vacant from 36.4 s).
    #[test]
    fn waiting_a_key_frozen_in_its_session_rouses_its_waiters() {
        let mut w = waiters();
        let row = crate::fixture::session();
        let taken = crate::fixture::held_in_session(&row, 1);
        w.register(&taken.id, "first").unwrap();
        let version = w.handoff_version(&taken.id);
        let frozen = taken.drain(Some(&row)).expect("a live session key drains");
        let (s, n) = at(2);
        let roused = w.written(&frozen, s, n, &POLICY, |_| true);
        assert!(roused.woken.is_empty() && roused.handoff_moved);
        assert_eq!(w.handoff_version(&taken.id), version + 1);
    }

    /// A per-key lease of reservation `id`.
    fn held_at(id: &ReservationId) -> DcRecord {
        crate::fixture::held(&id.to_string(), "k1", None, StoreTime::from_ms(0))
    }

    #[test]
    fn waiting_leave_and_wake_all_keep_the_count() {
        let mut w = waiters();
        let record = held();
        let t = w.register(&record.id, "first").unwrap();
        w.register(&record.id, "second").unwrap();
        assert_eq!(w.leave(&record.id, t), Some("first"));
        assert_eq!(w.leave(&record.id, t), None);
        assert_eq!(w.len(), 1);
        let woke = w.wake_all(AwaitReply::TimedOut);
        assert_eq!(woke.len(), 1);
        assert!(w.is_empty() && !w.has_waiters(&record.id));
    }

    #[cfg(feature = "mutations")]
    #[test]
    fn waiting_mutants_change_what_they_name() {
        let record = held();
        let (s, n) = at(2);
        let mut back = Waiters::new(
            limits(),
            Mutations::NONE.with(Mutation::WaiterQueuePopsBack),
        );
        back.register(&record.id, "first").unwrap();
        back.register(&record.id, "second").unwrap();
        assert_eq!(
            names(&back.notify(&released(&record), None, s, n, &POLICY, |_| true)),
            ["second"]
        );
        let mut forgets = Waiters::new(
            limits(),
            Mutations::NONE.with(Mutation::WriteForgetsWaiters),
        );
        forgets.register(&record.id, "first").unwrap();
        assert!(
            forgets
                .written(&released(&record), s, n, &POLICY, |_| true)
                .woken
                .is_empty()
        );
    }
}
