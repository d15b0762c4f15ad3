//! Host agents. A host sits in one DC, acquires a key there (connect),
//! renews at `renew_at`, stops gracefully at `soft_terminate_at` and is
//! killed at `hard_terminate_at` — all read from its own drifting clock — and
//! releases when its workload says so. It mirrors homing-client's
//! `HostAgent`: a renewal answered `StaleToken`/`Expired` stops it at once,
//! `Draining` stops renewals, a failed renewal is retried until the soft deadline.

use homing_core::{AcquireReply, Grant};
use homing_core::{
    ActorId, Deadlines, ErrorKind, FailureReason, FencingToken, KeyConfig, PreviousRun,
    ReleaseCause, RenewReply, Reply, Request, ReservationId, RunOutcome,
};

use crate::invariants::View;

use crate::clock::NodeClock;
use crate::report::Op;
use crate::sim::{Body, Event, Message, NodeId, Sim};

/// A host's timers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HostTimer {
    /// Idle: acquire a key.
    Act,
    /// Renewal due.
    Renew,
    /// Soft deadline: start a graceful stop.
    Soft,
    /// Just before the hard deadline: kill the actor.
    Kill,
    /// The graceful stop finished.
    Stopped,
    /// The workload releases the key.
    Leave,
}

impl HostTimer {
    /// The timer's name, for traces.
    pub fn name(self) -> &'static str {
        match self {
            HostTimer::Act => "host_act",
            HostTimer::Renew => "host_renew_due",
            HostTimer::Soft => "host_soft_deadline",
            HostTimer::Kill => "host_hard_kill",
            HostTimer::Stopped => "host_stopped",
            HostTimer::Leave => "host_leave",
        }
    }
}

#[derive(Debug, Clone)]
struct Lease {
    key: u32,
    reservation: ReservationId,
    token: FencingToken,
    deadlines: Deadlines,
    stopping: bool,
    draining: bool,
    renewing: Option<(u64, u64)>,
    leave_at_us: u64,
}

#[derive(Debug, Clone)]
enum HostState {
    Idle,
    Acquiring { key: u32, rpc: u64, sent_at_us: u64 },
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
    /// Its clock.
    pub clock: NodeClock,
    /// Whether it runs.
    pub up: bool,
    /// Bumped by every crash: voids older timers and replies.
    pub incarnation: u32,
    generation: u64,
    acquires: u64,
    state: HostState,
}

impl Host {
    /// An idle host in DC `dc`.
    pub fn new(idx: u32, dc: u16, clock: NodeClock) -> Host {
        Host {
            idx,
            dc,
            clock,
            up: true,
            incarnation: 0,
            generation: 0,
            acquires: 0,
            state: HostState::Idle,
        }
    }
}

impl Sim {
    fn host_timer_at(&mut self, h: usize, at_us: u64, timer: HostTimer) {
        let host = &self.hosts[h];
        let event = Event::Host {
            host: h as u32,
            incarnation: host.incarnation,
            timer,
            generation: host.generation,
        };
        self.schedule(at_us, event);
    }

    /// The true time at which host `h`'s clock reaches `ms` (plus `minus_us` earlier).
    fn host_true_at(&self, h: usize, ms: u64) -> u64 {
        self.hosts[h].clock.first_true_us_at_ms(ms)
    }

    fn pick_key(&mut self) -> u32 {
        let n = self.keys.len() as u64;
        let hot = (n / 10).max(1);
        let fraction = self.scenario.workload.hot_fraction;
        if self.rng.chance(fraction) {
            self.rng.below(hot) as u32
        } else {
            self.rng.below(n) as u32
        }
    }

    fn go_idle(&mut self, h: usize) {
        self.hosts[h].state = HostState::Idle;
        let think = self.scenario.workload.think_ms;
        let at = self.now + self.rng.exp(think * 1000.0);
        self.host_timer_at(h, at, HostTimer::Act);
    }

    /// Checks the deadline of a host that acts: it must be before its hard deadline.
    fn host_check(&mut self, h: usize) {
        if let HostState::Holding(lease) = &self.hosts[h].state {
            let host_ms = self.hosts[h].clock.local_ms(self.now);
            self.current_key = lease.key;
            self.checker.on_holder_check(
                lease.key,
                h as u32,
                host_ms,
                lease.deadlines.hard_terminate_at,
            );
        }
    }

    /// Arms renew/soft/kill/leave for the current lease generation.
    fn arm_lease(&mut self, h: usize) {
        self.hosts[h].generation += 1;
        let HostState::Holding(lease) = &self.hosts[h].state else {
            return;
        };
        let d = lease.deadlines;
        let leave = lease.leave_at_us;
        let renew = self.host_true_at(h, d.renew_at.as_ms());
        let soft = self.host_true_at(h, d.soft_terminate_at.as_ms());
        // The last instant at which the host's clock still reads before the hard deadline.
        let kill = self
            .host_true_at(h, d.hard_terminate_at.as_ms())
            .saturating_sub(1);
        self.host_timer_at(h, renew, HostTimer::Renew);
        self.host_timer_at(h, soft, HostTimer::Soft);
        self.host_timer_at(h, kill, HostTimer::Kill);
        self.host_timer_at(h, leave, HostTimer::Leave);
    }

    /// The actor stops (released, killed, or told the lease is gone); the host releases.
    fn host_stop(&mut self, h: usize) {
        let HostState::Holding(lease) = &self.hosts[h].state else {
            return;
        };
        let (key, reservation, token) = (lease.key, lease.reservation.clone(), lease.token);
        self.checker.on_holder_stop(key, h as u32);
        self.host_release(h, key, reservation, token);
        self.hosts[h].generation += 1;
        self.go_idle(h);
    }

    /// Sends `Release`, saying how the run ended (`release_failed_fraction` of them `Failed`).
    fn host_release(
        &mut self,
        h: usize,
        key: u32,
        reservation: ReservationId,
        token: FencingToken,
    ) {
        let outcome = if self
            .rng
            .chance(self.scenario.workload.release_failed_fraction)
        {
            // Invariant: a short printable reason satisfies the failure-reason rule.
            let reason = FailureReason::new(format!("host {h} run failed")).expect("valid reason");
            RunOutcome::Failed { reason }
        } else {
            RunOutcome::Ok
        };
        self.checker.on_release_sent(&reservation, token, &outcome);
        let rpc = self.rpc();
        let dc = self.hosts[h].dc;
        self.send(Message {
            from: NodeId::Host(h as u32),
            to: NodeId::Dc(dc),
            rpc,
            key,
            body: Body::Request(Request::Release {
                reservation,
                token,
                outcome,
            }),
        });
    }

    pub(crate) fn host_timer(
        &mut self,
        h: usize,
        incarnation: u32,
        timer: HostTimer,
        generation: u64,
    ) {
        let host = &self.hosts[h];
        if !host.up || host.incarnation != incarnation {
            return;
        }
        self.host_check(h);
        let current = generation == self.hosts[h].generation;
        match (timer, self.hosts[h].state.clone()) {
            (HostTimer::Act, HostState::Idle) => self.host_acquire(h),
            (HostTimer::Renew, HostState::Holding(lease))
                if current && !lease.stopping && !lease.draining && lease.renewing.is_none() =>
            {
                let host_time = self.hosts[h].clock.host_time(self.now);
                let request = Request::Renew {
                    reservation: lease.reservation.clone(),
                    token: lease.token,
                    host_time,
                };
                let dc = self.hosts[h].dc;
                let rpc = self.request(NodeId::Host(h as u32), NodeId::Dc(dc), lease.key, request);
                if let HostState::Holding(l) = &mut self.hosts[h].state {
                    l.renewing = Some((rpc, self.now));
                }
            }
            (HostTimer::Soft, HostState::Holding(lease)) if current && !lease.stopping => {
                self.measurements.count("host_soft_deadline_stop");
                if let HostState::Holding(l) = &mut self.hosts[h].state {
                    l.stopping = true;
                }
                let graceful = self.scenario.workload.graceful_stop_ms * 1000;
                let at = self.now + self.rng.below(graceful + 1);
                self.host_timer_at(h, at, HostTimer::Stopped);
            }
            (HostTimer::Kill, HostState::Holding(_)) if current => {
                self.measurements.count("host_killed_at_hard_deadline");
                self.host_stop(h)
            }
            (HostTimer::Stopped, HostState::Holding(lease)) if current && lease.stopping => {
                self.host_stop(h)
            }
            (HostTimer::Leave, HostState::Holding(lease)) if current && !lease.stopping => {
                self.host_stop(h)
            }
            _ => {}
        }
    }

    fn host_acquire(&mut self, h: usize) {
        let key = self.pick_key();
        let host = &mut self.hosts[h];
        host.acquires += 1;
        // Invariant: "h<n>.<n>.<n>" satisfies the actor-id rule.
        let actor = ActorId::new(format!(
            "h{}.{}.{}",
            host.idx, host.incarnation, host.acquires
        ))
        .expect("valid actor id");
        let host_time = host.clock.host_time(self.now);
        let dc = host.dc;
        let w = &self.scenario.workload;
        let wait_ms = if self.rng.chance(w.wait_fraction) {
            w.acquire_wait_ms
        } else {
            0
        };
        let request = Request::Acquire {
            config: KeyConfig::named(self.keys[key as usize].name.clone()),
            actor,
            host_time,
            wait_ms,
        };
        self.current_key = key;
        let rpc = if wait_ms == 0 {
            self.request(NodeId::Host(h as u32), NodeId::Dc(dc), key, request)
        } else {
            // A request that asks to wait gets that much more time (HostAgent).
            self.measurements.count("host_acquire_with_wait");
            let timeout_us = self.request_timeout_us + u64::from(wait_ms) * 1000;
            self.stream_request(
                NodeId::Host(h as u32),
                NodeId::Dc(dc),
                key,
                request,
                timeout_us,
            )
        };
        self.hosts[h].state = HostState::Acquiring {
            key,
            rpc,
            sent_at_us: self.now,
        };
    }

    pub(crate) fn host_receive(&mut self, h: usize, message: Message) {
        if !self.hosts[h].up {
            return;
        }
        let Body::Reply(reply) = message.body else {
            return;
        };
        self.host_check(h);
        match self.hosts[h].state.clone() {
            HostState::Acquiring {
                key,
                rpc,
                sent_at_us,
            } if rpc == message.rpc => self.host_acquired(h, key, rpc, sent_at_us, reply),
            HostState::Holding(lease) if lease.renewing.map(|r| r.0) == Some(message.rpc) => {
                self.host_renewed(h, lease, reply)
            }
            // A grant nobody asked for any more (the request timed out, or
            // the host crashed, while the DC worked on it): the lease lapses
            // unused.
            _ if matches!(reply, Reply::Acquire(AcquireReply::Acquired(_))) => {
                let work = self.measurements.take_acquire_work(message.rpc);
                let gave_up = self.acquires_given_up.remove(&message.rpc);
                self.measurements.count(match (gave_up, work.awaits > 0) {
                    (true, true) => "acquired_after_the_host_gave_up_waiting",
                    (true, false) => "acquired_after_the_host_gave_up",
                    (false, true) => "acquired_after_the_host_crashed_waiting",
                    (false, false) => "acquired_after_the_host_crashed",
                })
            }
            _ => {}
        }
    }

    fn host_acquired(&mut self, h: usize, key: u32, rpc: u64, sent_at_us: u64, reply: Reply) {
        let work = self.measurements.take_acquire_work(rpc);
        let latency = self.now - sent_at_us;
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
                    self.measurements.count(match e.kind {
                        ErrorKind::Unavailable { .. } => "acquire_error_unavailable",
                        ErrorKind::Overloaded => "acquire_error_overloaded",
                        ErrorKind::Inconsistent => "acquire_error_inconsistent",
                        _ => "acquire_error_other",
                    });
                    Op::AcquireFailed
                }
                _ => Op::AcquireFailed,
            };
            self.measurements.record(op, latency, work.peer_rtts, 0);
            return self.go_idle(h);
        };
        self.check_previous(key, &reservation, token, previous.as_ref());
        let (op, model) = if work.awaits > 0 {
            (Op::AcquireAfterWait, 0)
        } else if work.global_writes > 0 {
            (Op::AcquireFirst, 0)
        } else if work.links > 0 {
            (Op::AcquireRecreate, 1)
        } else {
            (Op::AcquireReactivate, 0)
        };
        self.measurements.record(op, latency, work.peer_rtts, model);
        let host_now = self.hosts[h].clock.host_time(self.now);
        let hold = self.scenario.workload.hold_ms;
        let leave_at_us = self.now + self.rng.exp(hold * 1000.0);
        let lease = Lease {
            key,
            reservation: reservation.clone(),
            token,
            deadlines,
            stopping: false,
            draining: false,
            renewing: None,
            leave_at_us,
        };
        if host_now >= deadlines.soft_terminate_at {
            // Too late to start: the grant is already past its soft deadline.
            self.measurements.count("host_grant_too_late");
            self.hosts[h].state = HostState::Holding(lease);
            return self.host_stop_without_acting(h);
        }
        self.checker
            .on_holder_start(self.now, key, h as u32, token, &reservation);
        self.hosts[h].state = HostState::Holding(lease);
        self.arm_lease(h);
    }

    /// Checks the `previous` an `Acquired` carries against what truly happened.
    fn check_previous(
        &mut self,
        key: u32,
        reservation: &ReservationId,
        token: FencingToken,
        previous: Option<&PreviousRun>,
    ) {
        self.measurements.count(match previous.map(|p| &p.ended) {
            None => "previous_none",
            Some(ReleaseCause::Released(RunOutcome::Ok)) => "previous_released_ok",
            Some(ReleaseCause::Released(RunOutcome::Failed { .. })) => "previous_released_failed",
            Some(ReleaseCause::Expired) => "previous_expired",
        });
        let view = View {
            dcs: &self.dcs,
            global: &self.global,
            keys: &self.keys,
            dc_index: &self.dc_index,
        };
        self.checker
            .on_acquired(&view, key, reservation, token, previous);
    }

    fn host_stop_without_acting(&mut self, h: usize) {
        if let HostState::Holding(lease) = &self.hosts[h].state {
            let (key, reservation, token) = (lease.key, lease.reservation.clone(), lease.token);
            self.host_release(h, key, reservation, token);
        }
        self.hosts[h].generation += 1;
        self.go_idle(h);
    }

    fn host_renewed(&mut self, h: usize, lease: Lease, reply: Reply) {
        let sent_at = lease.renewing.map_or(self.now, |r| r.1);
        if let HostState::Holding(l) = &mut self.hosts[h].state {
            l.renewing = None;
        }
        match reply {
            Reply::Renew(answer) => {
                self.measurements
                    .record(Op::Renew, self.now - sent_at, 0, 0);
                match answer {
                    RenewReply::Renewed(deadlines) if !lease.stopping => {
                        if let HostState::Holding(l) = &mut self.hosts[h].state {
                            l.deadlines = deadlines;
                        }
                        self.arm_lease(h);
                    }
                    RenewReply::Renewed(_) => {}
                    RenewReply::Draining => {
                        self.measurements.count("renew_draining");
                        if let HostState::Holding(l) = &mut self.hosts[h].state {
                            l.draining = true;
                        }
                    }
                    // The DC says another holder may exist: stop now.
                    RenewReply::StaleToken { .. } | RenewReply::Expired => {
                        self.measurements.count("renew_refused_stop_now");
                        self.host_stop(h)
                    }
                }
            }
            _ => self.host_retry_renew(h),
        }
    }

    fn host_retry_renew(&mut self, h: usize) {
        let at = self.now + self.scenario.workload.renew_retry_ms * 1000;
        self.host_timer_at(h, at, HostTimer::Renew);
    }

    pub(crate) fn host_timeout(&mut self, h: usize, rpc: u64) {
        if !self.hosts[h].up {
            return;
        }
        match self.hosts[h].state.clone() {
            HostState::Acquiring {
                rpc: waiting,
                sent_at_us,
                ..
            } if waiting == rpc => {
                let work = self.measurements.take_acquire_work(rpc);
                let latency = self.now - sent_at_us;
                self.measurements.count("acquire_timed_out_at_host");
                self.acquires_given_up.insert(rpc);
                self.measurements
                    .record(Op::AcquireFailed, latency, work.peer_rtts, 0);
                self.go_idle(h);
            }
            HostState::Holding(lease) if lease.renewing.map(|r| r.0) == Some(rpc) => {
                self.host_check(h);
                if let HostState::Holding(l) = &mut self.hosts[h].state {
                    l.renewing = None;
                }
                self.host_retry_renew(h);
            }
            _ => {}
        }
    }

    /// The host crashes: its actor dies with it.
    pub(crate) fn host_crash(&mut self, h: usize) {
        if !self.hosts[h].up {
            return;
        }
        if let HostState::Holding(lease) = &self.hosts[h].state {
            self.current_key = lease.key;
            self.checker.on_holder_stop(lease.key, h as u32);
            self.measurements.count("host_crash_while_holding");
        }
        let host = &mut self.hosts[h];
        host.up = false;
        host.incarnation += 1;
        host.state = HostState::Down;
        let at = self.now + self.scenario.workload.host_restart_ms * 1000;
        self.schedule(at, Event::HostRestart { host: h as u32 });
    }

    /// The host comes back, idle.
    pub(crate) fn host_restart(&mut self, h: usize) {
        self.hosts[h].up = true;
        self.go_idle(h);
    }
}
