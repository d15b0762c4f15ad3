//! homingd's side of parked acquirers: homing-node's [`homing_node::Waiters`]
//! decides who is woken with what (FIFO, bounds, hand-off) and is held by
//! the DC's [`homing_node::Endpoint`]; [`homing_node::AwaitVacant`] runs
//! each waiter's loop (`Node::drive` performs its registry operations
//! here). This module reaches the registry through the endpoint's lock,
//! reads the node clock, and delivers answers to request tasks over
//! channels. A waiter whose request future is dropped leaves the queue at
//! once ([`Registration`]'s `Drop`).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use homing_core::{AwaitReply, DcRecord, LeasePolicy, RecordRead, Reply, ReservationId, StoreTime};
use homing_node::{Endpoint, Followed, LogFollower, NodeTime, Notified, QueueOp, Queued};
pub use homing_node::{Full, WaitLimits};
use tokio::sync::{Notify, oneshot};
use tokio::time::Instant;

/// homingd's endpoint: a joined retry is answered on a reply channel, a
/// parked acquirer on its [`Parked`] channels.
pub type DcEndpoint = Endpoint<oneshot::Sender<Reply>, Parked>;

/// One parked request task, as the registry holds it.
pub struct Parked {
    /// Its answer.
    woken: oneshot::Sender<AwaitReply>,
    /// Roused when the queue's hand-off moves, to re-arm its timers.
    rouse: Arc<Notify>,
}

/// The parked acquirers of one DC, in its endpoint's registry.
pub struct Waiters {
    endpoint: Arc<Mutex<DcEndpoint>>,
    /// The node clock's origin.
    origin: Instant,
    /// Mirrors the number waiting, for metrics.
    gauge: Arc<AtomicU64>,
}

/// One registered waiter's side of the channels; dropping it leaves the queue.
pub struct Registration<'a> {
    waiters: &'a Waiters,
    reservation: ReservationId,
    ticket: homing_node::Ticket,
    /// The answer, once the waiter is woken.
    pub woken: oneshot::Receiver<AwaitReply>,
    /// Notified when the queue's hand-off moves.
    pub rouse: Arc<Notify>,
}

impl Drop for Registration<'_> {
    fn drop(&mut self) {
        self.waiters
            .with(|w| w.leave(&self.reservation, self.ticket).is_some());
    }
}

impl Waiters {
    /// The registry of `endpoint`; `gauge` follows how many wait.
    pub fn new(endpoint: Arc<Mutex<DcEndpoint>>, gauge: Arc<AtomicU64>) -> Waiters {
        Waiters {
            endpoint,
            origin: Instant::now(),
            gauge,
        }
    }

    /// Runs `f` on the registry, then publishes the count.
    fn with<T>(&self, f: impl FnOnce(&mut homing_node::Waiters<Parked>) -> T) -> T {
        let mut endpoint = (self.endpoint.lock()).expect("the endpoint's lock is never poisoned");
        let waiters = endpoint.waiters_mut();
        let out = f(waiters);
        self.gauge.store(waiters.len() as u64, Ordering::Relaxed);
        out
    }

    /// The node clock now.
    pub fn now(&self) -> NodeTime {
        NodeTime::from_us(self.origin.elapsed().as_micros() as u64)
    }

    /// The node clock's reading `at` as a tokio instant.
    pub fn instant(&self, at: NodeTime) -> Instant {
        self.origin + Duration::from_micros(at.as_us())
    }

    /// How many wait now.
    pub fn len(&self) -> usize {
        self.with(|w| w.len())
    }

    /// Whether nobody waits.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Performs a waiter's registry operation `op` (homing-node's
    /// [`Waiters::queue`](homing_node::Waiters::queue), at `store_now`
    /// under `policy`) and delivers what it woke; returns the answer, and
    /// the waiter's channels if `op` queued it.
    pub fn queue(
        &self,
        op: QueueOp,
        store_now: StoreTime,
        policy: &LeasePolicy,
    ) -> (Queued, Option<Registration<'_>>) {
        // The channels exist only if the op queues the waiter.
        let mut receiving = None;
        let parked = || {
            let (tx, woken) = oneshot::channel();
            let rouse = Arc::new(Notify::new());
            receiving = Some((woken, rouse.clone()));
            Parked { woken: tx, rouse }
        };
        let now = self.now();
        let reservation = op.reservation().clone();
        let (queued, notified) =
            self.with(|w| w.queue(op, store_now, now, policy, parked, listening));
        self.deliver(&reservation, notified);
        let registration = match (&queued, receiving) {
            (Queued::Joined(ticket, _), Some((woken, rouse))) => Some(Registration {
                waiters: self,
                reservation,
                ticket: *ticket,
                woken,
                rouse,
            }),
            _ => None,
        };
        (queued, registration)
    }

    /// `record` (of this DC) was just written at `now`: wakes the waiters
    /// its state lets go. Returns how many were woken.
    pub fn written(&self, record: &DcRecord, now: StoreTime, policy: &LeasePolicy) -> usize {
        let mono = self.now();
        let notified = self.with(|w| w.written(record, now, mono, policy, listening));
        self.deliver(&record.id, notified)
    }

    /// `record` (of this DC) as read back after another writer's event
    /// (see [`homing_node::log_follow`]): wakes the waiters its state lets
    /// go. Returns how many were woken.
    pub fn seen(&self, read: &RecordRead, now: StoreTime, policy: &LeasePolicy) -> usize {
        let mono = self.now();
        let notified = self.with(|w| w.seen(read, now, mono, policy, listening));
        self.deliver(&read.record.id, notified)
    }

    /// A page of the DC's event log, handed to `follower` with the waiters
    /// as they are now.
    pub fn follow(
        &self,
        follower: &mut LogFollower,
        events: &[homing_core::Event],
        oldest: homing_core::EventSeq,
        head: homing_core::EventSeq,
    ) -> Followed {
        self.with(|w| follower.handle_page(events, oldest, head, w))
    }

    /// The waiters of `id` look again (their reservation's lapse moved:
    /// the session it was held under closed).
    pub fn rouse(&self, id: &ReservationId) {
        self.deliver(id, Notified::roused());
    }

    fn deliver(&self, id: &ReservationId, notified: Notified<Parked>) -> usize {
        if notified.handoff_moved {
            self.with(|w| w.queued(id).for_each(|p| p.rouse.notify_one()));
        }
        let mut woken = 0;
        for wake in notified.woken {
            woken += usize::from(wake.waiter.woken.send(wake.reply).is_ok());
        }
        woken
    }

    /// Wakes every waiter with `reply` (shutdown).
    pub fn wake_all(&self, reply: AwaitReply) {
        for wake in self.with(|w| w.wake_all(reply)) {
            let _ = wake.waiter.woken.send(wake.reply);
        }
    }
}

/// Whether a parked request task still waits for its answer.
fn listening(parked: &Parked) -> bool {
    !parked.woken.is_closed()
}
