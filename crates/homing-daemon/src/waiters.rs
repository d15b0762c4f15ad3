//! Parked acquirers. An `Acquire` with `wait_ms` whose key is held waits
//! at the DC that owns the holder's reservation (its own DC registers it
//! there with `Await` when that is another DC). The DC wakes its waiters from
//! the writes that change the record — a release, the reaper's expiry, a link
//! — never by polling the store:
//!
//! - vacant (released, or the lease lapsed past expiry + grace): the first
//!   waiter registered is woken alone (first come, first served) and gets the
//!   hand-off window (`handoff_ms`) to take the reservation; if it is still
//!   vacant after that, the next waiter is woken;
//! - linked or abandoned: every waiter is woken to walk the chain again;
//! - re-activated: the waiters keep waiting for the new holder.
//!
//! Bounded per reservation and in total; a waiter whose caller went away
//! (its request future dropped) leaves the queue at once.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use homing_core::TailState;
use homing_core::{AwaitReply, DcRecord, LeasePolicy, RecordView, ReservationId, StoreTime};
use tokio::sync::{oneshot, watch};
use tokio::time::Instant;

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

/// Why a waiter could not be registered.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Full {
    /// The reservation's queue is full.
    #[error("{waiting} acquirers already wait for {reservation} (waiters_per_key_max)")]
    Reservation {
        /// The reservation.
        reservation: ReservationId,
        /// How many wait.
        waiting: usize,
    },
    /// The DC's waiters are at their bound.
    #[error("{0} acquirers already wait in this dc (waiters_max)")]
    Dc(usize),
}

struct Queue {
    waiters: VecDeque<(u64, oneshot::Sender<AwaitReply>)>,
    /// Until when the last woken waiter has the vacant reservation to itself.
    handoff_until: Option<Instant>,
    /// Bumped whenever the queue's hand-off changes, so parked waiters re-arm their timers.
    changed: watch::Sender<u64>,
}

/// The locked registry; publishes the count to the gauge when released.
struct Guard<'a> {
    inner: std::sync::MutexGuard<'a, Inner>,
    gauge: &'a AtomicU64,
}

impl std::ops::Deref for Guard<'_> {
    type Target = Inner;
    fn deref(&self) -> &Inner {
        &self.inner
    }
}

impl std::ops::DerefMut for Guard<'_> {
    fn deref_mut(&mut self) -> &mut Inner {
        &mut self.inner
    }
}

impl Drop for Guard<'_> {
    fn drop(&mut self) {
        self.gauge.store(self.inner.total as u64, Ordering::Relaxed);
    }
}

#[derive(Default)]
struct Inner {
    queues: HashMap<ReservationId, Queue>,
    total: usize,
    next_ticket: u64,
}

/// The parked acquirers of one DC.
pub struct Waiters {
    limits: WaitLimits,
    inner: Mutex<Inner>,
    /// Mirrors the number waiting, for metrics.
    gauge: Arc<AtomicU64>,
}

/// One registered waiter; dropping it leaves the queue.
pub struct Ticket<'a> {
    waiters: &'a Waiters,
    reservation: ReservationId,
    ticket: u64,
    /// The answer, once the waiter is woken.
    pub woken: oneshot::Receiver<AwaitReply>,
    /// Changes when the queue's hand-off moves.
    pub changed: watch::Receiver<u64>,
}

impl Drop for Ticket<'_> {
    fn drop(&mut self) {
        self.waiters.leave(&self.reservation, self.ticket);
    }
}

impl Waiters {
    /// No waiters yet; `gauge` follows how many wait.
    pub fn new(limits: WaitLimits, gauge: Arc<AtomicU64>) -> Waiters {
        Waiters {
            limits,
            inner: Mutex::new(Inner::default()),
            gauge,
        }
    }

    fn inner(&self) -> Guard<'_> {
        // Every critical section completes its edits before anything can panic.
        Guard {
            inner: self.inner.lock().unwrap_or_else(|p| p.into_inner()),
            gauge: &self.gauge,
        }
    }

    /// How many wait now.
    pub fn len(&self) -> usize {
        self.inner().total
    }

    /// Whether nobody waits.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether someone already waits for `reservation` (a newcomer queues behind).
    pub fn has_waiters(&self, reservation: &ReservationId) -> bool {
        self.inner().queues.contains_key(reservation)
    }

    /// Until when a woken waiter has `reservation` to itself, if one does.
    pub fn handoff_until(&self, reservation: &ReservationId) -> Option<Instant> {
        self.inner()
            .queues
            .get(reservation)
            .and_then(|q| q.handoff_until)
    }

    /// Queues a waiter for `reservation`, behind those already there.
    pub fn register(&self, reservation: &ReservationId) -> Result<Ticket<'_>, Full> {
        let mut inner = self.inner();
        if inner.total >= self.limits.total {
            return Err(Full::Dc(inner.total));
        }
        let ticket = inner.next_ticket;
        inner.next_ticket += 1;
        let queue = inner
            .queues
            .entry(reservation.clone())
            .or_insert_with(|| Queue {
                waiters: VecDeque::new(),
                handoff_until: None,
                changed: watch::Sender::new(0),
            });
        if queue.waiters.len() >= self.limits.per_key {
            return Err(Full::Reservation {
                reservation: reservation.clone(),
                waiting: queue.waiters.len(),
            });
        }
        let (tx, woken) = oneshot::channel();
        queue.waiters.push_back((ticket, tx));
        let changed = queue.changed.subscribe();
        inner.total += 1;
        Ok(Ticket {
            waiters: self,
            reservation: reservation.clone(),
            ticket,
            woken,
            changed,
        })
    }

    fn leave(&self, reservation: &ReservationId, ticket: u64) {
        let mut inner = self.inner();
        let Some(queue) = inner.queues.get_mut(reservation) else {
            return;
        };
        let before = queue.waiters.len();
        queue.waiters.retain(|(t, _)| *t != ticket);
        let left = before - queue.waiters.len();
        if queue.waiters.is_empty() {
            inner.queues.remove(reservation);
        }
        inner.total -= left;
    }

    /// `record` (of this DC) was written or read at `now`: wakes the waiters
    /// its state lets go. Returns how many were woken.
    pub fn notify(&self, record: &DcRecord, now: StoreTime, policy: &LeasePolicy) -> usize {
        let mut inner = self.inner();
        let Some(queue) = inner.queues.get_mut(&record.id) else {
            return 0;
        };
        let queued = queue.waiters.len();
        let mut woken = 0;
        match record.view(now, policy) {
            RecordView::Link(_) | RecordView::Abandoned => {
                for (_, tx) in queue.waiters.drain(..) {
                    woken += usize::from(tx.send(AwaitReply::Moved).is_ok());
                }
            }
            RecordView::Tail(tail) => match tail.state {
                TailState::Active { .. } => {
                    if queue.handoff_until.take().is_some() {
                        queue.changed.send_modify(|v| *v += 1);
                    }
                }
                TailState::Vacant { ended } => {
                    let in_handoff = queue.handoff_until.is_some_and(|t| t > Instant::now());
                    if !in_handoff {
                        // The first waiter still listening takes the turn.
                        while let Some((_, tx)) = queue.waiters.pop_front() {
                            let sent = tx.send(AwaitReply::Vacated {
                                ended: ended.clone(),
                            });
                            if sent.is_ok() {
                                woken = 1;
                                break;
                            }
                        }
                        queue.handoff_until =
                            Some(Instant::now() + Duration::from_millis(self.limits.handoff_ms));
                        queue.changed.send_modify(|v| *v += 1);
                    }
                }
            },
        }
        let left = queue.waiters.len();
        if left == 0 {
            inner.queues.remove(&record.id);
        }
        inner.total -= queued - left;
        woken
    }

    /// Wakes every waiter with `reply` (shutdown).
    pub fn wake_all(&self, reply: AwaitReply) {
        let mut inner = self.inner();
        for (_, queue) in inner.queues.drain() {
            for (_, tx) in queue.waiters {
                let _ = tx.send(reply.clone());
            }
        }
        inner.total = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use homing_core::{ActorId, FencingToken, HostTime, Key, KeyName, RunOutcome};

    const POLICY: LeasePolicy = LeasePolicy::DEFAULT;

    fn held() -> DcRecord {
        DcRecord::reserve(
            "iad.1".parse().unwrap(),
            Key::new(KeyName::new("k").unwrap()),
            None,
            FencingToken::FIRST,
            None,
            ActorId::new("a").unwrap(),
            HostTime::from_ms(0),
            StoreTime::from_ms(0),
            &POLICY,
        )
        .0
    }

    fn limits() -> WaitLimits {
        WaitLimits {
            per_key: 2,
            total: 3,
            handoff_ms: 60_000,
        }
    }

    #[tokio::test]
    async fn a_vacated_reservation_wakes_the_first_waiter_only() {
        let waiters = Waiters::new(limits(), Arc::default());
        let record = held();
        let mut first = waiters.register(&record.id).unwrap();
        let mut second = waiters.register(&record.id).unwrap();
        assert_eq!(waiters.notify(&record, StoreTime::from_ms(1), &POLICY), 0);
        let released = record
            .release(FencingToken::FIRST, RunOutcome::Ok, StoreTime::from_ms(2))
            .next
            .unwrap();
        assert_eq!(waiters.notify(&released, StoreTime::from_ms(2), &POLICY), 1);
        assert!(matches!(
            first.woken.try_recv(),
            Ok(AwaitReply::Vacated { .. })
        ));
        assert!(second.woken.try_recv().is_err(), "second waits its turn");
        // Within the hand-off window nobody else is woken.
        assert_eq!(waiters.notify(&released, StoreTime::from_ms(3), &POLICY), 0);
        assert_eq!(waiters.len(), 1);
        drop(second);
        assert!(waiters.is_empty());
    }

    #[tokio::test]
    async fn bounds_are_per_reservation_and_total() {
        let waiters = Waiters::new(limits(), Arc::default());
        let a: ReservationId = "iad.1".parse().unwrap();
        let b: ReservationId = "iad.2".parse().unwrap();
        let _a1 = waiters.register(&a).unwrap();
        let _a2 = waiters.register(&a).unwrap();
        assert!(matches!(
            waiters.register(&a),
            Err(Full::Reservation { .. })
        ));
        let _b1 = waiters.register(&b).unwrap();
        assert_eq!(waiters.register(&b).err(), Some(Full::Dc(3)));
    }

    #[tokio::test]
    async fn a_link_wakes_everyone_to_walk_again() {
        let waiters = Waiters::new(limits(), Arc::default());
        let record = held();
        let mut first = waiters.register(&record.id).unwrap();
        let mut second = waiters.register(&record.id).unwrap();
        let lapsed = StoreTime::from_ms(100_000);
        let linked = record
            .link(
                &"fra.1".parse().unwrap(),
                FencingToken::FIRST,
                lapsed,
                &POLICY,
            )
            .next
            .unwrap();
        assert_eq!(waiters.notify(&linked, lapsed, &POLICY), 2);
        assert_eq!(first.woken.try_recv(), Ok(AwaitReply::Moved));
        assert_eq!(second.woken.try_recv(), Ok(AwaitReply::Moved));
        assert!(waiters.is_empty());
    }
}
