//! An acquire's waits at the simulated DC, performed as homingd's `Node`
//! performs homing-node's `Effect::Await`: at the holder's DC — a local
//! waiter (`waiting.rs`) or an `Await` request on a QUIC stream,
//! lost with its connection when the path or the peer dies — bounded by
//! the acquire's own deadline, as homingd's `timeout_at` bounds it.

use homing_core::{AwaitReply, ErrorKind, Request, ReservationId};
use homing_node::{Acquire, AcquireEvent, Answer, Failure};

use super::ctx::DcCtx;
use super::task::Task;
use super::waiters::AwaitFor;
use super::{Next, error};
use crate::counter::Counter;
use crate::event::{Event, NodeId};

/// An acquire in progress at the acquirer's DC: homing-node's [`Acquire`]
/// and where it is registered while it waits.
#[derive(Debug)]
pub(crate) struct AcquireJob {
    /// What decides.
    pub(crate) acquire: Acquire,
    /// Where the acquire is registered now, if it awaits.
    pub(crate) awaiting: Option<Awaiting>,
    /// Bumped whenever an await starts or ends and by every pause: voids
    /// older deadline and pause timers.
    pub(crate) generation: u64,
    /// Whether it sleeps in a pause (a shutdown answers it at once).
    pub(crate) paused: bool,
}

/// Where a waiting acquire is registered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Awaiting {
    /// With an `Await` RPC to the tail's DC.
    Remote {
        /// The RPC.
        rpc: u64,
    },
    /// With a waiter task of this DC.
    Local,
}

/// The counter of an acquire event.
pub(crate) fn acquire_counter(event: AcquireEvent) -> Counter {
    match event {
        AcquireEvent::ConnectFailed => Counter::ConnectFailed,
        AcquireEvent::ConnectRetried => Counter::WaitConnectRetried,
        AcquireEvent::Awaiting => Counter::WaitAwait,
        AcquireEvent::WaitCutShort => Counter::WaitCutShort,
        AcquireEvent::WaitTimedOut => Counter::WaitTimedOut,
        AcquireEvent::WaitRefused => Counter::WaitRefused,
        AcquireEvent::WaitLostWithoutTimeToRegisterAgain => {
            Counter::WaitLostWithoutTimeToRegisterAgain
        }
        AcquireEvent::WaitReregister => Counter::WaitReregister,
        AcquireEvent::WaitDeadlinePassed => Counter::WaitDeadlinePassed,
        AcquireEvent::ClosedWhileWaiting => Counter::AcquireWaitClosedAtShutdown,
        AcquireEvent::LastLookFailed => Counter::WaitLastLookFailed,
        AcquireEvent::WaitEndedByConnectErrorUnavailable => {
            Counter::WaitEndedByConnectErrorUnavailable
        }
        AcquireEvent::WaitEndedByConnectError => Counter::WaitEndedByConnectError,
        AcquireEvent::GrantCancelled => Counter::CancelledGrantLanded,
        AcquireEvent::ShortcutNoted => Counter::ShortcutNotices,
        AcquireEvent::ShortcutNotNoted => Counter::ShortcutNotNoted,
    }
}

impl DcCtx<'_> {
    /// The key is held: register at the holder's DC (this one: a local
    /// waiter; another: an `Await` request on a QUIC stream).
    pub(crate) fn acquire_await(
        &mut self,
        tid: u64,
        mut task: Box<Task>,
        reservation: ReservationId,
        remaining_ms: u32,
    ) {
        task.work.awaits += 1;
        let local = reservation.dc() == &self.dc.id;
        let to = self.peers.index.get(reservation.dc()).copied();
        if !local && to.is_none() {
            let reply = error(
                ErrorKind::Inconsistent,
                format!("unknown dc in {reservation}"),
            );
            return self.continue_task(tid, task, Next::Reply(reply));
        }
        let Some(job) = task.kind.acquire_mut() else {
            unreachable!("only an acquire awaits a holder's dc");
        };
        // Our own deadline bounds the wait (`timeout_at(deadline, register)`).
        job.generation += 1;
        let deadline_us = self
            .dc
            .clock
            .first_true_us_at_us(job.acquire.deadline().as_us());
        let generation = job.generation;
        if self.rules.waiting.origin_deadline {
            self.set_timer(tid, generation, deadline_us);
        }
        let Some(to) = to.filter(|_| !local) else {
            job.awaiting = Some(Awaiting::Local);
            let key = task.key;
            self.inst.tasks.insert(tid, task);
            let origin = AwaitFor::Local { acquire: tid };
            let me = self.me();
            let now = self.node_now();
            let wait = self
                .inst
                .endpoint
                .await_vacant(reservation, remaining_ms, now);
            return self.await_start(me, 0, key, wait, origin);
        };
        let to = self.peer_homingd(to);
        let timeout_us = self.world.request_timeout_us + u64::from(remaining_ms) * 1000;
        let request = Request::Await {
            reservation,
            wait_ms: remaining_ms,
        };
        let rpc = self.stream_request(NodeId::Dc(to), task.key, request, timeout_us);
        if let Some(job) = task.kind.acquire_mut() {
            job.awaiting = Some(Awaiting::Remote { rpc });
        }
        let inst = &mut *self.inst;
        inst.peer_rpcs.insert(rpc, (tid, to));
        inst.await_rpcs.insert(rpc, to);
        inst.tasks.insert(tid, task);
        self.checker
            .wake
            .on_origin_sent(self.world.now, self.addr(), rpc, to, deadline_us);
        // The registration rides a QUIC connection: the origin learns that
        // it is lost one idle timeout after the path died or the peer crashed.
        let idle_us = self.scenario.network.idle_timeout_ms * 1000;
        let until_us = self.world.now + timeout_us;
        let (d, now) = (self.d(), self.world.now);
        let mut lost_at = (self.world.network).path_dead_at(d, to.d(), now, until_us, idle_us);
        let peer = &self.dc_at(to.d()).instances[usize::from(to.instance())];
        if !peer.up {
            let dead = self.world.now.max(peer.down_since_us + idle_us);
            lost_at = Some(lost_at.map_or(dead, |l| l.min(dead)));
        }
        if let Some(at) = lost_at.filter(|at| *at < until_us) {
            let lost = Event::ConnectionLost {
                dc: self.addr(),
                rpc,
                reset: false,
            };
            self.world.schedule(at, lost);
        }
    }

    /// The await of acquire `tid` ended: homing-node's [`Acquire`] decides
    /// what follows.
    pub(crate) fn acquire_awaited(
        &mut self,
        tid: u64,
        mut task: Box<Task>,
        result: Result<AwaitReply, Failure>,
    ) {
        let Some(job) = task.kind.acquire_mut() else {
            unreachable!("an await's answer for a task that is not an acquire");
        };
        job.awaiting = None;
        job.generation += 1;
        self.step_answered(tid, task, Answer::Awaited(result));
    }

    /// The acquire's own deadline passed while it awaited: it stops waiting
    /// (its registration future dropped: a local waiter leaves the queue, a
    /// remote one runs on at the tail's DC unanswered) and answers at once.
    pub(crate) fn acquire_deadline(&mut self, tid: u64, mut task: Box<Task>) {
        let Some(job) = task.kind.acquire_mut() else {
            unreachable!("a deadline timer of a task that is not an acquire");
        };
        job.generation += 1;
        let awaiting = job.awaiting.take();
        self.acquire_unregister(tid, awaiting);
        self.step_answered(tid, task, Answer::TimedOut);
    }

    /// Acquire `tid` stops waiting where it was registered (`awaiting`).
    pub(crate) fn acquire_unregister(&mut self, tid: u64, awaiting: Option<Awaiting>) {
        match awaiting {
            Some(Awaiting::Remote { rpc }) => {
                let inst = &mut *self.inst;
                inst.peer_rpcs.remove(&rpc);
                inst.await_rpcs.remove(&rpc);
                self.checker.wake.on_origin_done(self.addr(), rpc);
            }
            Some(Awaiting::Local) => self.await_drop(tid),
            None => {}
        }
    }
}
