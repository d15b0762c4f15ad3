//! Host agents. A host sits in one DC, acquires a key there (connect), and
//! holds it by homing-core's [`HostLease`] — the same stepper
//! homing-client's `HostAgent` drives: renewals bounded by the soft deadline
//! and retried until it, a graceful stop at the soft deadline, a kill just
//! before the hard deadline, `StaleToken`/`Expired` stopping it at once,
//! `Draining` ending renewals, a grant that arrives too late never started —
//! all on the host's own drifting clock. It releases when its workload says so.
//! A host is an actor: its handlers take a `HostCtx` (the shared world,
//! the observer it reports to, what it may read), never the simulator.
//!
//! A share of the hosts (`workload.session_fraction`) hold their keys under
//! a host session instead: see [`session`].

mod session;

use std::collections::BTreeSet;

use session::SessionRun;

use homing_core::host_lease::{ACQUIRE_ATTEMPTS_DEFAULT, HardCause, Renewal};
use homing_core::owed_cancel::{CancelAnswer, OwedCancel};
use homing_core::{
    AcquireReply, ActorId, ErrorKind, FailureReason, FencingToken, Grant, HostInstant, HostLease,
    HostLeasePoll, HostTime, Key, KeyConfig, LeaseKey, PreviousRun, ReleaseCause, Reply, Request,
    ReservationId, RunOutcome, SessionId,
};

use crate::clock::NodeClock;
use crate::counter::{Counter, Op};
use crate::event::{Body, Event, Homingd, HostTimer, Message, NodeId};
use crate::observe::Observer;
use crate::scenario::Scenario;
use crate::world::World;

#[derive(Debug, Clone)]
struct Lease {
    key: u32,
    reservation: ReservationId,
    token: FencingToken,
    /// The acquire's lease key: renewals and the release present it.
    lease_key: LeaseKey,
    /// The hard deadline of the last grant or renewal taken, for the checker.
    hard: HostTime,
    lease: HostLease,
    /// Told to stop gracefully: the workload's stop is under way.
    stopping: bool,
    renewing: Option<Renewing>,
    /// The lease deadline a `Lease` timer is armed for.
    wake_at: Option<HostInstant>,
}

/// A renewal in flight.
#[derive(Debug, Clone, Copy)]
struct Renewing {
    rpc: u64,
    sent: Sent,
}

/// When a request left the host, by its clock and in true time.
#[derive(Debug, Clone, Copy)]
struct Sent {
    host_time: HostTime,
    instant: HostInstant,
    true_us: u64,
}

/// One try of an acquire: its RPC and when it left.
#[derive(Debug, Clone, Copy)]
struct Try {
    rpc: u64,
    sent: Sent,
}

/// A logical acquire: every try carries its lease key (HostAgent's rule).
#[derive(Debug, Clone)]
struct Acquiring {
    key: u32,
    actor: ActorId,
    lease: LeaseKey,
    wait_ms: u32,
    /// Every try so far, the last one current; a reply to any is the answer.
    tries: Vec<Try>,
    /// The host session it acquires under (a session host), with its secret.
    session: Option<(SessionId, LeaseKey)>,
}

#[derive(Debug, Clone)]
enum HostState {
    Idle,
    Acquiring(Acquiring),
    Holding(Lease),
    Down,
}

/// One host agent.
#[derive(Debug, Clone)]
pub struct Host {
    /// Its index.
    pub idx: u32,
    /// Its DC.
    pub dc: u16,
    /// How many homingd its DC runs.
    instances: u8,
    /// The homingd of its DC it sends to: its own first, the next after
    /// one that gave no answer (HostAgent's `alternates`).
    homingd: u8,
    /// Its clock.
    pub clock: NodeClock,
    /// Whether it runs.
    pub up: bool,
    /// Bumped by every crash: voids older timers and replies.
    pub incarnation: u32,
    generation: u64,
    acquires: u64,
    /// The tries of the last acquire answered: a retry joined at the DC
    /// is answered too, after the try the host took.
    answered_tries: Vec<u64>,
    /// Tries of acquires it gave up on (timed out) while their DC still
    /// worked on them: a grant for one comes too late.
    given_up: BTreeSet<u64>,
    /// Cancels of acquires it gave up on, sent until their DC answers
    /// (homing-core's [`OwedCancel`], as HostAgent keeps them).
    owed: Vec<Owed>,
    /// A session host's session and the keys it holds under it (`None`: a
    /// host that holds one key at a time, on a lease of its own). A
    /// session host's `state` is only ever idle, acquiring or down.
    session: Option<Box<SessionRun>>,
    state: HostState,
}

/// A cancel a host owes its DC, and where it stands.
#[derive(Debug, Clone)]
struct Owed {
    key: u32,
    cancel: OwedCancel,
    /// The RPC of the send in flight; `None` while it waits to be sent again.
    rpc: Option<u64>,
    /// When to send it again (true time, µs), while it waits.
    due_us: u64,
}

impl Host {
    /// The homingd it sends to now.
    fn homingd(&self) -> NodeId {
        NodeId::Dc(Homingd::new(self.dc, self.homingd))
    }

    /// An idle host in DC `dc`, which runs `instances` homingd; it talks
    /// to `homingd` first. With `session_keys`, a session host holding up
    /// to that many keys at once.
    pub fn new(
        idx: u32,
        dc: u16,
        (instances, homingd): (u8, u8),
        clock: NodeClock,
        session_keys: Option<u32>,
    ) -> Host {
        Host {
            idx,
            dc,
            instances,
            homingd,
            clock,
            up: true,
            incarnation: 0,
            generation: 0,
            acquires: 0,
            answered_tries: Vec::new(),
            given_up: BTreeSet::new(),
            owed: Vec::new(),
            session: session_keys.map(|max| Box::new(SessionRun::new(max))),
            state: HostState::Idle,
        }
    }
}

/// What a host's handlers take from the rest of the simulation: the shared
/// world, the observer, and what it may read.
pub(crate) struct HostCtx<'a> {
    /// Time, the queue, the network, the rng.
    pub(crate) world: &'a mut World,
    /// The checker and the measurements.
    pub(crate) observer: &'a mut dyn Observer,
    /// The keys by index.
    pub(crate) keys: &'a [Key],
    /// The scenario: its workload, and its fault windows (an acquire
    /// unanswered with no fault in the way breaks an invariant).
    pub(crate) scenario: &'a Scenario,
    /// Whether its DC runs: a request on a stream to a DC that is down is
    /// lost (it rides a connection to the dead process).
    pub(crate) dc_up: bool,
}

impl Host {
    fn timer_at(&self, at_us: u64, timer: HostTimer, ctx: &mut HostCtx) {
        let event = Event::Host {
            host: self.idx,
            incarnation: self.incarnation,
            timer,
            generation: self.generation,
        };
        ctx.world.schedule(at_us, event);
    }

    fn pick_key(ctx: &mut HostCtx) -> u32 {
        let n = ctx.keys.len() as u64;
        let hot = (n / 10).max(1);
        let fraction = ctx.scenario.workload.hot_fraction;
        if ctx.world.rng.chance(fraction) {
            ctx.world.rng.below(hot) as u32
        } else {
            ctx.world.rng.below(n) as u32
        }
    }

    fn go_idle(&mut self, ctx: &mut HostCtx) {
        self.state = HostState::Idle;
        let think = ctx.scenario.workload.think_ms;
        let at = ctx.world.now + ctx.world.rng.exp(think * 1000.0);
        self.timer_at(at, HostTimer::Act, ctx);
    }

    /// Checks the deadline of a host that acts: it must be before its hard deadline.
    fn check(&self, ctx: &mut HostCtx) {
        if let Some(run) = &self.session {
            return run.check(self.idx, self.clock.local_ms(ctx.world.now), ctx);
        }
        if let HostState::Holding(lease) = &self.state {
            let host_ms = self.clock.local_ms(ctx.world.now);
            ctx.world.current_key = lease.key;
            ctx.observer
                .on_holder_check(lease.key, self.idx, host_ms, lease.hard);
        }
    }

    /// Its monotonic clock now (its drifting clock, in µs).
    fn instant(&self, world: &World) -> HostInstant {
        HostInstant::from_us(self.clock.local_us(world.now))
    }

    /// A request it sends now: its clock's reading and instant, and true time.
    fn sent(&self, world: &World) -> Sent {
        Sent {
            host_time: self.clock.host_time(world.now),
            instant: self.instant(world),
            true_us: world.now,
        }
    }

    /// Does what its lease asks until it waits: renew, stop gracefully,
    /// kill, or arm a timer for its next deadline.
    fn drive_lease(&mut self, ctx: &mut HostCtx) {
        loop {
            let now = self.instant(ctx.world);
            let HostState::Holding(lease) = &mut self.state else {
                return;
            };
            match lease.lease.poll(now) {
                HostLeasePoll::Renew { by } => self.renew(by, ctx),
                HostLeasePoll::SoftTerminate => {
                    ctx.observer.count(Counter::HostSoftDeadlineStop);
                    lease.stopping = true;
                    let graceful = ctx.scenario.workload.graceful_stop_ms * 1000;
                    let at = ctx.world.now + ctx.world.rng.below(graceful + 1);
                    self.timer_at(at, HostTimer::Stopped, ctx);
                }
                HostLeasePoll::HardTerminate(cause) => {
                    ctx.observer.count(match cause {
                        HardCause::HardDeadline => Counter::HostKilledAtHardDeadline,
                        HardCause::Lost => Counter::RenewRefusedStopNow,
                    });
                    return self.stop(ctx);
                }
                HostLeasePoll::Wait { until } => {
                    if lease.wake_at != Some(until) {
                        lease.wake_at = Some(until);
                        let at = self.clock.first_true_us_at_us(until.as_us());
                        self.timer_at(at.max(ctx.world.now), HostTimer::Lease, ctx);
                    }
                    return;
                }
            }
        }
    }

    /// Sends a `Renew`, given up on at the soft deadline `by`.
    fn renew(&mut self, by: HostInstant, ctx: &mut HostCtx) {
        let sent = self.sent(ctx.world);
        let to = self.homingd();
        let HostState::Holding(lease) = &mut self.state else {
            return;
        };
        let request = Request::Renew {
            reservation: lease.reservation.clone(),
            token: lease.token,
            lease: lease.lease_key,
            host_time: sent.host_time,
        };
        let by_us = self.clock.first_true_us_at_us(by.as_us());
        let world = &mut *ctx.world;
        let timeout = world
            .request_timeout_us
            .min(by_us.saturating_sub(world.now));
        let from = NodeId::Host(self.idx);
        let rpc = world.request_within(from, to, lease.key, request, timeout);
        lease.renewing = Some(Renewing { rpc, sent });
    }

    /// The actor stops (released, killed, or told the lease is gone); the host releases.
    fn stop(&mut self, ctx: &mut HostCtx) {
        let HostState::Holding(lease) = &self.state else {
            return;
        };
        let (key, reservation, token) = (lease.key, lease.reservation.clone(), lease.token);
        let lease_key = lease.lease_key;
        ctx.observer.on_holder_stop(ctx.world.now, key, self.idx);
        self.release(key, reservation, token, lease_key, ctx);
        self.generation += 1;
        self.go_idle(ctx);
    }

    /// Sends `Release`, saying how the run ended (`release_failed_fraction` of them `Failed`).
    fn release(
        &self,
        key: u32,
        reservation: ReservationId,
        token: FencingToken,
        lease: LeaseKey,
        ctx: &mut HostCtx,
    ) {
        let failed = ctx.scenario.workload.release_failed_fraction;
        let outcome = if ctx.world.rng.chance(failed) {
            // Invariant: a short printable reason satisfies the failure-reason rule.
            let reason =
                FailureReason::new(format!("host {} run failed", self.idx)).expect("valid reason");
            RunOutcome::Failed { reason }
        } else {
            RunOutcome::Ok
        };
        ctx.observer.on_release_sent(&reservation, token, &outcome);
        let rpc = ctx.world.rpc();
        ctx.world.send(Message {
            from: NodeId::Host(self.idx),
            to: self.homingd(),
            rpc,
            key,
            body: Body::Request(Request::Release {
                reservation,
                token,
                lease,
                outcome,
            }),
        });
    }

    /// One of its timers fired (void if it crashed since it was set).
    pub(crate) fn timer(
        &mut self,
        incarnation: u32,
        timer: HostTimer,
        generation: u64,
        ctx: &mut HostCtx,
    ) {
        if !self.up || self.incarnation != incarnation {
            return;
        }
        self.check(ctx);
        let current = generation == self.generation;
        if self.session.is_some() && timer != HostTimer::Cancel {
            return self.session_timer(timer, current, ctx);
        }
        match (timer, &self.state) {
            (HostTimer::Act, HostState::Idle) => self.acquire(None, ctx),
            (HostTimer::Lease, HostState::Holding(_)) if current => self.drive_lease(ctx),
            (HostTimer::Stopped, HostState::Holding(lease)) if current && lease.stopping => {
                self.stop(ctx)
            }
            (HostTimer::Leave, HostState::Holding(lease)) if current && !lease.stopping => {
                self.stop(ctx)
            }
            (HostTimer::Cancel, _) => self.send_owed_cancels(ctx),
            _ => {}
        }
    }

    /// Acquires a key drawn by the workload (under `session`, if any).
    fn acquire(&mut self, session: Option<(SessionId, LeaseKey)>, ctx: &mut HostCtx) {
        let key = Host::pick_key(ctx);
        self.acquires += 1;
        // Invariant: "h<n>.<n>.<n>" satisfies the actor-id rule.
        let actor = ActorId::new(format!(
            "h{}.{}.{}",
            self.idx, self.incarnation, self.acquires
        ))
        .expect("valid actor id");
        let w = &ctx.scenario.workload;
        let rng = &mut ctx.world.rng;
        let wait_ms = if rng.chance(w.wait_fraction) {
            w.acquire_wait_ms
        } else {
            0
        };
        let lease = lease_key(ctx);
        let acquiring = Acquiring {
            key,
            actor,
            lease,
            wait_ms,
            tries: Vec::new(),
            session,
        };
        self.try_acquire(acquiring, ctx);
    }

    /// Sends one try of `acquiring` (the same lease key every time).
    fn try_acquire(&mut self, mut acquiring: Acquiring, ctx: &mut HostCtx) {
        let sent = self.sent(ctx.world);
        let (key, wait_ms) = (acquiring.key, acquiring.wait_ms);
        let config = KeyConfig::named(ctx.keys[key as usize].name.clone());
        let (actor, lease, host_time) = (acquiring.actor.clone(), acquiring.lease, sent.host_time);
        let request = match acquiring.session.clone() {
            None => Request::Acquire {
                config,
                actor,
                lease,
                host_time,
                wait_ms,
            },
            Some((session, secret)) => Request::AcquireInSession {
                config,
                actor,
                lease,
                host_time,
                wait_ms,
                session,
                secret,
            },
        };
        let world = &mut *ctx.world;
        world.current_key = key;
        let (from, to) = (NodeId::Host(self.idx), self.homingd());
        let rpc = if wait_ms == 0 {
            world.request(from, to, key, request)
        } else {
            // A request that asks to wait gets that much more time (HostAgent),
            // on a stream.
            ctx.observer.count(Counter::HostAcquireWithWait);
            let timeout_us = world.request_timeout_us + u64::from(wait_ms) * 1000;
            let (rpc, message) = world.request_message(from, to, key, request, timeout_us);
            if ctx.dc_up {
                world.stream_send(message);
            }
            rpc
        };
        acquiring.tries.push(Try { rpc, sent });
        self.state = HostState::Acquiring(acquiring);
    }

    /// A message for it arrived.
    pub(crate) fn receive(&mut self, message: Message, ctx: &mut HostCtx) {
        if !self.up {
            return;
        }
        let Body::Reply(reply) = message.body else {
            return;
        };
        self.check(ctx);
        match self.state.clone() {
            HostState::Acquiring(acquiring)
                if acquiring.tries.iter().any(|t| t.rpc == message.rpc) =>
            {
                let answered = *acquiring
                    .tries
                    .iter()
                    .find(|t| t.rpc == message.rpc)
                    .expect("matched above");
                self.answered_tries = acquiring.tries.iter().map(|t| t.rpc).collect();
                self.acquired(&acquiring, answered, reply, ctx)
            }
            _ if self.session.as_ref().is_some_and(|s| s.asked(message.rpc)) => {
                self.session_reply(reply, ctx)
            }
            HostState::Holding(lease) if lease.renewing.map(|r| r.rpc) == Some(message.rpc) => {
                self.renewed(Some(reply), ctx)
            }
            // A grant nobody asked for any more (the request timed out, or
            // the host crashed, while the DC worked on it): the lease lapses
            // unused.
            // The same outcome for another try of an acquire already answered.
            _ if self.owed.iter().any(|o| o.rpc == Some(message.rpc)) => {
                self.cancel_answered(message.rpc, &reply, ctx)
            }
            _ if self.answered_tries.contains(&message.rpc) => {
                ctx.observer.count(Counter::AcquireAnsweredAgain);
            }
            _ if matches!(reply, Reply::Acquire(AcquireReply::Acquired(_))) => {
                let work = ctx.observer.take_acquire_work(message.rpc);
                let gave_up = self.given_up.remove(&message.rpc);
                ctx.observer.count(match (gave_up, work.awaits > 0) {
                    (true, true) => Counter::AcquiredAfterTheHostGaveUpWaiting,
                    (true, false) => Counter::AcquiredAfterTheHostGaveUp,
                    (false, true) => Counter::AcquiredAfterTheHostCrashedWaiting,
                    (false, false) => Counter::AcquiredAfterTheHostCrashed,
                })
            }
            _ => {}
        }
    }

    fn acquired(&mut self, acquiring: &Acquiring, answered: Try, reply: Reply, ctx: &mut HostCtx) {
        let (key, lease_key) = (acquiring.key, acquiring.lease);
        let Try { rpc, sent } = answered;
        let work = ctx.observer.take_acquire_work(rpc);
        let latency = ctx.world.now - sent.true_us;
        let Reply::Acquire(AcquireReply::Acquired(Grant {
            reservation,
            token,
            deadlines,
            previous,
            ..
        })) = reply
        else {
            let op = match &reply {
                Reply::Acquire(AcquireReply::HeldElsewhere(_))
                | Reply::Acquire(AcquireReply::TagMismatch { .. }) => Op::AcquireHeldElsewhere,
                Reply::Error(e) => {
                    ctx.observer.count(match e.kind {
                        ErrorKind::Unavailable { .. } => Counter::AcquireErrorUnavailable,
                        ErrorKind::Overloaded => Counter::AcquireErrorOverloaded,
                        ErrorKind::Inconsistent => Counter::AcquireErrorInconsistent,
                        ErrorKind::QuotaExceeded { .. } => Counter::AcquireErrorQuota,
                        _ => Counter::AcquireErrorOther,
                    });
                    Op::AcquireFailed
                }
                _ => Op::AcquireFailed,
            };
            ctx.observer.record(op, latency, work.peer_rtts, 0);
            return self.go_idle(ctx);
        };
        check_previous(key, &reservation, token, previous.as_ref(), ctx.observer);
        let (op, model) = if work.awaits > 0 {
            (Op::AcquireAfterWait, 0)
        } else if work.global_writes > 0 {
            (Op::AcquireFirst, 0)
        } else if work.links > 0 {
            (Op::AcquireRecreate, 1)
        } else {
            (Op::AcquireReactivate, 0)
        };
        ctx.observer.record(op, latency, work.peer_rtts, model);
        if let Some((session, _)) = &acquiring.session {
            let held = (key, reservation, token, lease_key);
            self.session_hold(session, held, ctx);
            return self.go_idle(ctx);
        }
        let now = self.instant(ctx.world);
        let retry_ms = ctx.scenario.workload.renew_retry_ms;
        let started = HostLease::start(&deadlines, sent.host_time, sent.instant, now, retry_ms);
        let Ok(held) = started else {
            // Too late to start: the grant is already past its soft deadline.
            ctx.observer.count(Counter::HostGrantTooLate);
            self.release(key, reservation, token, lease_key, ctx);
            return self.go_idle(ctx);
        };
        let now_us = ctx.world.now;
        ctx.observer
            .on_holder_start(now_us, key, self.idx, token, &reservation);
        let hold = ctx.scenario.workload.hold_ms;
        let leave_at = now_us + ctx.world.rng.exp(hold * 1000.0);
        self.generation += 1;
        self.state = HostState::Holding(Lease {
            key,
            reservation,
            token,
            lease_key,
            hard: deadlines.hard_terminate_at,
            lease: held,
            stopping: false,
            renewing: None,
            wake_at: None,
        });
        self.timer_at(leave_at, HostTimer::Leave, ctx);
        self.drive_lease(ctx);
    }

    /// The answer to its renewal (`None`: none in time).
    fn renewed(&mut self, reply: Option<Reply>, ctx: &mut HostCtx) {
        let now = self.instant(ctx.world);
        let HostState::Holding(lease) = &mut self.state else {
            return;
        };
        let Some(renewing) = lease.renewing.take() else {
            return;
        };
        let answer = match reply {
            Some(Reply::Renew(answer)) => Some(answer),
            _ => None,
        };
        let answered = answer.is_some();
        let deadlines = match &answer {
            Some(homing_core::RenewReply::Renewed(deadlines)) => Some(*deadlines),
            _ => None,
        };
        let renewal =
            lease
                .lease
                .handle_renew(answer, renewing.sent.host_time, renewing.sent.instant, now);
        match renewal {
            Renewal::Moved(_) => {
                lease.hard = deadlines.expect("moved by a renewal").hard_terminate_at
            }
            Renewal::Draining => ctx.observer.count(Counter::RenewDraining),
            Renewal::TooLate => ctx.observer.count(Counter::RenewAnsweredTooLate),
            Renewal::Lost | Renewal::Failed { .. } => {}
        }
        if answered {
            let latency = ctx.world.now - renewing.sent.true_us;
            ctx.observer.record(Op::Renew, latency, 0, 0);
        }
        self.drive_lease(ctx);
    }

    /// Its request `rpc` got no reply in time.
    pub(crate) fn timeout(&mut self, rpc: u64, ctx: &mut HostCtx) {
        if !self.up {
            return;
        }
        match self.state.clone() {
            HostState::Acquiring(acquiring)
                if acquiring.tries.last().map(|t| t.rpc) == Some(rpc) =>
            {
                self.failover(ctx);
                self.acquire_timed_out(acquiring, rpc, ctx)
            }
            HostState::Holding(lease) if lease.renewing.map(|r| r.rpc) == Some(rpc) => {
                self.failover(ctx);
                self.check(ctx);
                self.renewed(None, ctx);
            }
            _ if self.session.as_ref().is_some_and(|s| s.asked(rpc)) => {
                self.failover(ctx);
                self.check(ctx);
                self.session_unanswered(ctx)
            }
            _ if self.owed.iter().any(|o| o.rpc == Some(rpc)) => {
                self.failover(ctx);
                self.cancel_unanswered(rpc, ctx)
            }
            _ => {}
        }
    }

    /// A request got no answer: the next goes to the DC's next homingd
    /// (HostAgent's move to its next alternate).
    fn failover(&mut self, ctx: &mut HostCtx) {
        if self.instances > 1 {
            ctx.observer.count(Counter::HomingdFailover);
            self.homingd = (self.homingd + 1) % self.instances;
        }
    }

    /// The last try of `acquiring` (RPC `rpc`) got no answer: try again, or
    /// give up and cancel.
    fn acquire_timed_out(&mut self, acquiring: Acquiring, rpc: u64, ctx: &mut HostCtx) {
        if acquiring.tries.len() < ACQUIRE_ATTEMPTS_DEFAULT as usize {
            // No answer in time: the same acquire again, same lease key.
            ctx.observer.count(Counter::AcquireRetriedAtHost);
            return self.try_acquire(acquiring, ctx);
        }
        let first = acquiring.tries[0].sent;
        let work = ctx.observer.take_acquire_work(rpc);
        let now_us = ctx.world.now;
        let latency = now_us - first.true_us;
        ctx.observer.count(Counter::AcquireTimedOutAtHost);
        // Fault-free: nothing but load delayed it (DESIGN.md §7.6 wants none).
        let (from_ms, to_ms) = (first.true_us / 1000, now_us / 1000);
        if !ctx.scenario.faulty_between(from_ms, to_ms) {
            ctx.observer
                .count(Counter::AcquireTimedOutAtHostWithNoFault);
            if ctx.scenario.network.loss == 0.0 {
                let detail = format!(
                    "host {} gave up after {} tries over {} ms with no fault in the way",
                    self.idx,
                    acquiring.tries.len(),
                    to_ms - from_ms
                );
                ctx.observer.on_acquire_unanswered(acquiring.key, detail);
            }
        }
        self.given_up.extend(acquiring.tries.iter().map(|t| t.rpc));
        ctx.observer
            .record(Op::AcquireFailed, latency, work.peer_rtts, 0);
        // Gave up: cancel the grant it may have been made, until the DC
        // answers (HostAgent's rule).
        let key = ctx.keys[acquiring.key as usize].clone();
        let cancel = OwedCancel::new(key, acquiring.lease, self.instant(ctx.world));
        self.owed.push(Owed {
            key: acquiring.key,
            cancel,
            rpc: None,
            due_us: ctx.world.now,
        });
        self.send_owed_cancels(ctx);
        self.go_idle(ctx);
    }

    /// Sends every owed cancel that is due.
    fn send_owed_cancels(&mut self, ctx: &mut HostCtx) {
        let to = self.homingd();
        let now = ctx.world.now;
        for owed in self.owed.iter_mut() {
            if owed.rpc.is_none() && owed.due_us <= now {
                if owed.cancel.sent() > 0 {
                    ctx.observer.count(Counter::CancelSentAgain);
                }
                let request = owed.cancel.send();
                let rpc = ctx
                    .world
                    .request(NodeId::Host(self.idx), to, owed.key, request);
                owed.rpc = Some(rpc);
            }
        }
    }

    /// The owed cancel sent as `rpc` was answered with `reply`.
    fn cancel_answered(&mut self, rpc: u64, reply: &Reply, ctx: &mut HostCtx) {
        match OwedCancel::answered(reply) {
            CancelAnswer::Done => self.owed.retain(|o| o.rpc != Some(rpc)),
            CancelAnswer::Again => self.cancel_unanswered(rpc, ctx),
        }
    }

    /// The owed cancel sent as `rpc` got no answer it could use: due again
    /// after its backoff, or owed no more.
    fn cancel_unanswered(&mut self, rpc: u64, ctx: &mut HostCtx) {
        let now = self.instant(ctx.world);
        let Some(i) = self.owed.iter().position(|o| o.rpc == Some(rpc)) else {
            return;
        };
        match self.owed[i].cancel.unanswered(now) {
            Some(at) => {
                let due = self
                    .clock
                    .first_true_us_at_us(at.as_us())
                    .max(ctx.world.now);
                self.owed[i].rpc = None;
                self.owed[i].due_us = due;
                self.timer_at(due, HostTimer::Cancel, ctx);
            }
            None => {
                ctx.observer.count(Counter::CancelAbandoned);
                self.owed.remove(i);
            }
        }
    }

    /// The host crashes: its actor dies with it.
    pub(crate) fn crash(&mut self, ctx: &mut HostCtx) {
        if !self.up {
            return;
        }
        if let HostState::Holding(lease) = &self.state {
            ctx.world.current_key = lease.key;
            ctx.observer
                .on_holder_stop(ctx.world.now, lease.key, self.idx);
            ctx.observer.count(Counter::HostCrashWhileHolding);
        }
        if let Some(run) = &mut self.session {
            run.crash(self.idx, ctx);
        }
        self.up = false;
        // Its owed cancels die with the process, as HostAgent's do.
        self.owed.clear();
        self.incarnation += 1;
        self.state = HostState::Down;
        let at = ctx.world.now + ctx.scenario.workload.host_restart_ms * 1000;
        let host = self.idx;
        ctx.world.schedule(at, Event::HostRestart { host });
    }

    /// The host comes back, idle.
    pub(crate) fn restart(&mut self, ctx: &mut HostCtx) {
        self.up = true;
        self.go_idle(ctx);
    }
}

/// A fresh secret (a lease key, or a session's), drawn from the run's rng.
fn lease_key(ctx: &mut HostCtx) -> LeaseKey {
    let rng = &mut ctx.world.rng;
    let mut bytes = [0u8; 16];
    bytes[..8].copy_from_slice(&rng.next_u64().to_le_bytes());
    bytes[8..].copy_from_slice(&(rng.next_u64() | 1).to_le_bytes());
    // Invariant: the second half is odd, so the key is never all zeros.
    LeaseKey::from_bytes(bytes).expect("never all zeros")
}

/// Counts how the run before a grant ended, and has the checker judge the
/// `previous` the grant carries against what truly happened.
fn check_previous(
    key: u32,
    reservation: &ReservationId,
    token: FencingToken,
    previous: Option<&PreviousRun>,
    observer: &mut dyn Observer,
) {
    observer.count(match previous.map(|p| &p.ended) {
        None => Counter::PreviousNone,
        Some(ReleaseCause::Released(RunOutcome::Ok)) => Counter::PreviousReleasedOk,
        Some(ReleaseCause::Released(RunOutcome::Failed { .. })) => Counter::PreviousReleasedFailed,
        Some(ReleaseCause::Expired) => Counter::PreviousExpired,
        Some(ReleaseCause::Forced) => Counter::PreviousForceReleased,
        Some(ReleaseCause::Cancelled) => Counter::PreviousCancelled,
    });
    observer.on_acquired(key, reservation, token, previous);
}
