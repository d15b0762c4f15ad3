//! Session hosts: a host that holds up to `workload.session_keys` keys at
//! once under one host session, driving homing-core's [`HostSession`] — the
//! stepper homing-client's `SessionHost` drives. It opens a session at its
//! DC, acquires keys under it one after another (each with its own lease
//! key and fencing token, retried and cancelled as a single-key host's),
//! renews the session alone, and stops each key when the workload leaves
//! it, when a renewal's answer lists it as frozen (an operator's drain: the
//! key stops by the deadlines held before that answer), or with every
//! other key when the session cannot be renewed in time. A session over, it
//! opens another; now and then it closes an idle one. A crash leaves its
//! session to run out and the DC's upkeep to reap its keys.

use std::collections::BTreeMap;

use homing_core::host_lease::{HardCause, Renewal};
use homing_core::{
    FencingToken, HostInstant, HostSession, HostSessionPoll, HostTime, LeaseKey, Reply, Request,
    ReservationId, SessionId,
};

use super::{Host, HostCtx, Renewing, Sent};
use crate::counter::{Counter, Op};
use crate::event::{HostTimer, NodeId};
use crate::trace::NO_KEY;

/// How likely a session host closes its session when it holds no key and
/// its workload would acquire the next.
const CLOSE_IDLE_CHANCE: f64 = 0.1;

/// A session host's session and the keys it holds under it.
#[derive(Debug, Clone)]
pub(super) struct SessionRun {
    /// Most keys held at once.
    keys_max: u32,
    phase: Phase,
    /// Numbers the holds: a key's timers name the hold they belong to.
    holds: u64,
}

#[derive(Debug, Clone)]
enum Phase {
    /// No session: the next `Act` opens one.
    Closed,
    /// An open in flight.
    Opening {
        rpc: u64,
        sent: Sent,
        secret: LeaseKey,
    },
    Open(Box<Open>),
    /// A close in flight (no key held).
    Closing {
        rpc: u64,
    },
}

#[derive(Debug, Clone)]
struct Open {
    id: SessionId,
    secret: LeaseKey,
    machine: HostSession,
    /// The session's hard deadline as last granted (the bound of every
    /// running key), for the checker.
    hard: HostTime,
    renewing: Option<Renewing>,
    /// The deadline a `Lease` timer is armed for.
    wake_at: Option<HostInstant>,
    held: BTreeMap<ReservationId, Held>,
}

/// A key held under the session.
#[derive(Debug, Clone)]
struct Held {
    key: u32,
    token: FencingToken,
    lease_key: LeaseKey,
    hold: u64,
    /// Frozen at the DC: the hard deadline held before the answer that
    /// listed it (its bound from then on, whatever the session does).
    frozen_hard: Option<HostTime>,
    /// Told to stop gracefully.
    stopping: bool,
}

impl SessionRun {
    pub(super) fn new(keys_max: u32) -> SessionRun {
        SessionRun {
            keys_max,
            phase: Phase::Closed,
            holds: 0,
        }
    }

    /// Whether `rpc` is one of its session requests in flight.
    pub(super) fn asked(&self, rpc: u64) -> bool {
        match &self.phase {
            Phase::Opening { rpc: r, .. } | Phase::Closing { rpc: r } => *r == rpc,
            Phase::Open(open) => open.renewing.is_some_and(|r| r.rpc == rpc),
            Phase::Closed => false,
        }
    }

    /// Every key it holds is checked against its hard deadline (`host_ms`:
    /// the host's clock now).
    pub(super) fn check(&self, host: u32, host_ms: u64, ctx: &mut HostCtx) {
        let Phase::Open(open) = &self.phase else {
            return;
        };
        for held in open.held.values() {
            let hard = held.frozen_hard.unwrap_or(open.hard);
            ctx.world.current_key = held.key;
            ctx.observer.on_holder_check(held.key, host, host_ms, hard);
        }
    }

    /// The host crashed: every actor dies with it; the session runs out at
    /// the DC.
    pub(super) fn crash(&mut self, host: u32, ctx: &mut HostCtx) {
        if let Phase::Open(open) = &self.phase
            && !open.held.is_empty()
        {
            for held in open.held.values() {
                ctx.world.current_key = held.key;
                ctx.observer.on_holder_stop(ctx.world.now, held.key, host);
            }
            ctx.observer.count(Counter::HostCrashWhileHolding);
        }
        self.phase = Phase::Closed;
    }

    fn open_mut(&mut self) -> Option<&mut Open> {
        match &mut self.phase {
            Phase::Open(open) => Some(open),
            _ => None,
        }
    }

    /// The hold numbered `hold`, if it is still held.
    fn hold_of(&self, hold: u64) -> Option<ReservationId> {
        let Phase::Open(open) = &self.phase else {
            return None;
        };
        let found = open.held.iter().find(|(_, h)| h.hold == hold);
        found.map(|(id, _)| id.clone())
    }
}

impl Host {
    fn run(&mut self) -> &mut SessionRun {
        // Invariant: only called on session hosts.
        self.session.as_mut().expect("a session host")
    }

    /// One of a session host's timers fired (`current`: of its session now).
    pub(super) fn session_timer(&mut self, timer: HostTimer, current: bool, ctx: &mut HostCtx) {
        match timer {
            HostTimer::Act if matches!(self.state, super::HostState::Idle) => self.session_act(ctx),
            HostTimer::Lease if current => self.drive_session(ctx),
            HostTimer::KeyStopped(hold) => {
                if let Some(id) = self.run().hold_of(hold) {
                    self.stop_key(&id, ctx);
                }
            }
            HostTimer::KeyLeave(hold) => {
                let run = self.run();
                if let Some(id) = run.hold_of(hold)
                    && run.open_mut().is_some_and(|open| !open.held[&id].stopping)
                {
                    self.stop_key(&id, ctx);
                }
            }
            _ => {}
        }
    }

    /// The workload acts: open a session, acquire the next key under it,
    /// or close it while it holds nothing.
    fn session_act(&mut self, ctx: &mut HostCtx) {
        let run = self.run();
        let keys_max = run.keys_max as usize;
        match &run.phase {
            Phase::Closed => self.open_session(ctx),
            Phase::Open(open)
                if open.held.is_empty() && ctx.world.rng.chance(CLOSE_IDLE_CHANCE) =>
            {
                let request = Request::CloseSession {
                    session: open.id.clone(),
                    secret: open.secret,
                };
                let rpc = self.session_request(request, None, ctx);
                self.run().phase = Phase::Closing { rpc };
            }
            Phase::Open(open) if open.held.len() < keys_max && !open.machine.stopping() => {
                let session = Some((open.id.clone(), open.secret));
                self.acquire(session, ctx)
            }
            // Full, or every key is stopping: look again later.
            Phase::Open(_) => self.go_idle(ctx),
            Phase::Opening { .. } | Phase::Closing { .. } => {}
        }
    }

    /// Sends a session request to its DC (given up on after `within_us`,
    /// at most the request timeout).
    fn session_request(
        &mut self,
        request: Request,
        within_us: Option<u64>,
        ctx: &mut HostCtx,
    ) -> u64 {
        let (from, to) = (NodeId::Host(self.idx), self.homingd());
        let world = &mut *ctx.world;
        let timeout = world.request_timeout_us.min(within_us.unwrap_or(u64::MAX));
        world.request_within(from, to, NO_KEY, request, timeout)
    }

    fn open_session(&mut self, ctx: &mut HostCtx) {
        let sent = self.sent(ctx.world);
        let secret = super::lease_key(ctx);
        let request = Request::OpenSession {
            secret,
            host_time: sent.host_time,
        };
        let rpc = self.session_request(request, None, ctx);
        self.run().phase = Phase::Opening { rpc, sent, secret };
    }

    /// The answer to its session request in flight.
    pub(super) fn session_reply(&mut self, reply: Reply, ctx: &mut HostCtx) {
        match (self.run().phase.clone(), reply) {
            (Phase::Opening { sent, secret, .. }, Reply::SessionOpened { session, deadlines }) => {
                let (now, retry_ms) = (
                    self.instant(ctx.world),
                    ctx.scenario.workload.renew_retry_ms,
                );
                let started =
                    HostSession::start(&deadlines, sent.host_time, sent.instant, now, retry_ms);
                let Ok(machine) = started else {
                    // Answered too late to run anything: let it run out.
                    ctx.observer.count(Counter::HostGrantTooLate);
                    self.run().phase = Phase::Closed;
                    return self.go_idle(ctx);
                };
                ctx.observer.count(Counter::SessionOpened);
                self.generation += 1;
                self.run().phase = Phase::Open(Box::new(Open {
                    id: session,
                    secret,
                    machine,
                    hard: deadlines.hard_terminate_at,
                    renewing: None,
                    wake_at: None,
                    held: BTreeMap::new(),
                }));
                self.drive_session(ctx);
                self.go_idle(ctx);
            }
            (Phase::Opening { .. } | Phase::Closing { .. }, _) => {
                // Refused, or closed: none open.
                self.run().phase = Phase::Closed;
                self.go_idle(ctx);
            }
            (Phase::Open(_), Reply::SessionRenewed(answer)) => {
                self.session_renewed(Some(answer), ctx)
            }
            (Phase::Open(_), _) => self.session_renewed(None, ctx),
            (Phase::Closed, _) => {}
        }
    }

    /// Its session request in flight got no answer in time.
    pub(super) fn session_unanswered(&mut self, ctx: &mut HostCtx) {
        match self.run().phase {
            // An open that may have landed runs out at the DC unused.
            Phase::Opening { .. } | Phase::Closing { .. } => {
                self.run().phase = Phase::Closed;
                self.go_idle(ctx);
            }
            Phase::Open(_) => self.session_renewed(None, ctx),
            Phase::Closed => {}
        }
    }

    /// Does what the session asks until it waits.
    fn drive_session(&mut self, ctx: &mut HostCtx) {
        loop {
            let now = self.instant(ctx.world);
            let Some(open) = self.run().open_mut() else {
                return;
            };
            match open.machine.poll(now) {
                HostSessionPoll::Renew { by } => self.renew_session(by, ctx),
                HostSessionPoll::SoftTerminateKey(id) => self.soft_stop(&id, ctx),
                HostSessionPoll::HardTerminateKey(id) => {
                    ctx.observer.count(Counter::HostKilledAtHardDeadline);
                    self.stop_key(&id, ctx)
                }
                HostSessionPoll::SoftTerminateAll => {
                    ctx.observer.count(Counter::HostSoftDeadlineStop);
                    let ids: Vec<ReservationId> = open.held.keys().cloned().collect();
                    for id in ids {
                        self.soft_stop(&id, ctx);
                    }
                }
                HostSessionPoll::HardTerminateAll(cause) => {
                    ctx.observer.count(match cause {
                        HardCause::HardDeadline => Counter::HostKilledAtHardDeadline,
                        HardCause::Lost => Counter::RenewRefusedStopNow,
                    });
                    ctx.observer.count(Counter::SessionLost);
                    let ids: Vec<ReservationId> = open.held.keys().cloned().collect();
                    for id in ids {
                        self.stop_key(&id, ctx);
                    }
                    self.generation += 1;
                    self.run().phase = Phase::Closed;
                    return;
                }
                HostSessionPoll::Wait { until } => {
                    if open.wake_at != Some(until) {
                        open.wake_at = Some(until);
                        let at = self.clock.first_true_us_at_us(until.as_us());
                        self.timer_at(at.max(ctx.world.now), HostTimer::Lease, ctx);
                    }
                    return;
                }
            }
        }
    }

    /// Sends the session's renewal, given up on at its soft deadline `by`.
    fn renew_session(&mut self, by: HostInstant, ctx: &mut HostCtx) {
        let sent = self.sent(ctx.world);
        let by_us = self.clock.first_true_us_at_us(by.as_us());
        let within = by_us.saturating_sub(ctx.world.now);
        let Some(open) = self.run().open_mut() else {
            return;
        };
        let request = Request::RenewSession {
            session: open.id.clone(),
            secret: open.secret,
            host_time: sent.host_time,
            ack: open.machine.ack(),
        };
        let rpc = self.session_request(request, Some(within), ctx);
        if let Some(open) = self.run().open_mut() {
            open.renewing = Some(Renewing { rpc, sent });
        }
    }

    /// The answer to its session renewal (`None`: none in time, or a refusal).
    fn session_renewed(
        &mut self,
        answer: Option<homing_core::SessionRenewReply>,
        ctx: &mut HostCtx,
    ) {
        let (now, true_now) = (self.instant(ctx.world), ctx.world.now);
        let Some(open) = self.run().open_mut() else {
            return;
        };
        let Some(renewing) = open.renewing.take() else {
            return;
        };
        let answered = answer.is_some();
        let granted = match &answer {
            Some(homing_core::SessionRenewReply::Renewed { deadlines, .. }) => Some(*deadlines),
            _ => None,
        };
        let held_hard = open.hard;
        let sent = renewing.sent;
        let renewal = open
            .machine
            .handle_renew(answer, sent.host_time, sent.instant, now);
        if let Renewal::Moved(_) = renewal {
            open.hard = granted.expect("moved by a renewal").hard_terminate_at;
        }
        if let Renewal::TooLate = renewal {
            ctx.observer.count(Counter::RenewAnsweredTooLate);
        }
        for (id, held) in open.held.iter_mut() {
            if held.frozen_hard.is_none() && open.machine.frozen(id) {
                held.frozen_hard = Some(held_hard);
                ctx.observer.count(Counter::SessionKeyFrozen);
            }
        }
        if answered {
            ctx.observer
                .record(Op::RenewSession, true_now - sent.true_us, 0, 0);
        }
        self.drive_session(ctx);
    }

    /// A grant under `session` arrived: held under it if it is still the
    /// session open and has room, else released at once.
    pub(super) fn session_hold(
        &mut self,
        session: &SessionId,
        (key, reservation, token, lease_key): (u32, ReservationId, FencingToken, LeaseKey),
        ctx: &mut HostCtx,
    ) {
        let run = self.run();
        run.holds += 1;
        let hold = run.holds;
        let taken = run
            .open_mut()
            .filter(|open| &open.id == session)
            .is_some_and(|open| open.machine.hold(reservation.clone()).is_ok());
        if !taken {
            ctx.observer.count(Counter::SessionGrantNotHeld);
            return self.release(key, reservation, token, lease_key, ctx);
        }
        let now_us = ctx.world.now;
        ctx.observer
            .on_holder_start(now_us, key, self.idx, token, &reservation);
        if let Some(open) = self.run().open_mut() {
            let held = Held {
                key,
                token,
                lease_key,
                hold,
                frozen_hard: None,
                stopping: false,
            };
            open.held.insert(reservation, held);
        }
        let hold_ms = ctx.scenario.workload.hold_ms;
        let leave_at = now_us + ctx.world.rng.exp(hold_ms * 1000.0);
        self.timer_at(leave_at, HostTimer::KeyLeave(hold), ctx);
        // A frozen key or a deadline may now come first.
        self.drive_session(ctx);
    }

    /// Tells the actor of `id` to stop gracefully; it stops within the
    /// workload's graceful stop (or is killed at its hard deadline first).
    fn soft_stop(&mut self, id: &ReservationId, ctx: &mut HostCtx) {
        let Some(held) = self.run().open_mut().and_then(|o| o.held.get_mut(id)) else {
            return;
        };
        if held.stopping {
            return;
        }
        held.stopping = true;
        let hold = held.hold;
        let graceful = ctx.scenario.workload.graceful_stop_ms * 1000;
        let at = ctx.world.now + ctx.world.rng.below(graceful + 1);
        self.timer_at(at, HostTimer::KeyStopped(hold), ctx);
    }

    /// The actor of `id` stops: the host releases the key.
    fn stop_key(&mut self, id: &ReservationId, ctx: &mut HostCtx) {
        let Some(open) = self.run().open_mut() else {
            return;
        };
        let Some(held) = open.held.remove(id) else {
            return;
        };
        open.machine.forget(id);
        ctx.world.current_key = held.key;
        ctx.observer
            .on_holder_stop(ctx.world.now, held.key, self.idx);
        self.release(held.key, id.clone(), held.token, held.lease_key, ctx);
    }
}
