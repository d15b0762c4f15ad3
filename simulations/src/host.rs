//! Host agents. A host sits in one DC, acquires a key there (connect), and
//! holds it by homing-core's [`HostLease`] — the same stepper
//! homing-client's `HostAgent` drives: renewals bounded by the soft deadline
//! and retried until it, a graceful stop at the soft deadline, a kill just
//! before the hard deadline, `StaleToken`/`Expired` stopping it at once,
//! `Draining` ending renewals, a grant that arrives too late never started —
//! all on the host's own drifting clock. It releases when its workload says so.

use crate::counter::{Counter, Op};
use homing_core::host_lease::{ACQUIRE_ATTEMPTS_DEFAULT, HardCause, Renewal};
use homing_core::{AcquireReply, Grant};
use homing_core::{
    ActorId, ErrorKind, FailureReason, FencingToken, HostInstant, HostLease, HostLeasePoll,
    HostTime, KeyConfig, LeaseKey, PreviousRun, ReleaseCause, Reply, Request, ReservationId,
    RunOutcome,
};

use crate::invariants::view;

use crate::clock::NodeClock;
use crate::event::{Body, Event, HostTimer, Message, NodeId};
use crate::sim::Sim;

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
            answered_tries: Vec::new(),
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
        self.world.schedule(at_us, event);
    }

    fn pick_key(&mut self) -> u32 {
        let n = self.keys.len() as u64;
        let hot = (n / 10).max(1);
        let fraction = self.scenario.workload.hot_fraction;
        if self.world.rng.chance(fraction) {
            self.world.rng.below(hot) as u32
        } else {
            self.world.rng.below(n) as u32
        }
    }

    fn go_idle(&mut self, h: usize) {
        self.hosts[h].state = HostState::Idle;
        let think = self.scenario.workload.think_ms;
        let at = self.world.now + self.world.rng.exp(think * 1000.0);
        self.host_timer_at(h, at, HostTimer::Act);
    }

    /// Checks the deadline of a host that acts: it must be before its hard deadline.
    fn host_check(&mut self, h: usize) {
        if let HostState::Holding(lease) = &self.hosts[h].state {
            let host_ms = self.hosts[h].clock.local_ms(self.world.now);
            self.world.current_key = lease.key;
            self.checker
                .on_holder_check(lease.key, h as u32, host_ms, lease.hard);
        }
    }

    /// The host's monotonic clock now (its drifting clock, in µs).
    fn host_instant(&self, h: usize) -> HostInstant {
        HostInstant::from_us(self.hosts[h].clock.local_us(self.world.now))
    }

    /// A request host `h` sends now: its clock's reading and instant, and true time.
    fn host_sent(&self, h: usize) -> Sent {
        Sent {
            host_time: self.hosts[h].clock.host_time(self.world.now),
            instant: self.host_instant(h),
            true_us: self.world.now,
        }
    }

    /// Does what host `h`'s lease asks until it waits: renew, stop
    /// gracefully, kill, or arm a timer for its next deadline.
    fn drive_lease(&mut self, h: usize) {
        loop {
            let now = self.host_instant(h);
            let HostState::Holding(lease) = &mut self.hosts[h].state else {
                return;
            };
            match lease.lease.poll(now) {
                HostLeasePoll::Renew { by } => self.host_renew(h, by),
                HostLeasePoll::SoftTerminate => {
                    self.measurements.count(Counter::HostSoftDeadlineStop);
                    if let HostState::Holding(l) = &mut self.hosts[h].state {
                        l.stopping = true;
                    }
                    let graceful = self.scenario.workload.graceful_stop_ms * 1000;
                    let at = self.world.now + self.world.rng.below(graceful + 1);
                    self.host_timer_at(h, at, HostTimer::Stopped);
                }
                HostLeasePoll::HardTerminate(cause) => {
                    self.measurements.count(match cause {
                        HardCause::HardDeadline => Counter::HostKilledAtHardDeadline,
                        HardCause::Lost => Counter::RenewRefusedStopNow,
                    });
                    return self.host_stop(h);
                }
                HostLeasePoll::Wait { until } => {
                    if lease.wake_at != Some(until) {
                        lease.wake_at = Some(until);
                        let at = self.hosts[h].clock.first_true_us_at_us(until.as_us());
                        self.host_timer_at(h, at.max(self.world.now), HostTimer::Lease);
                    }
                    return;
                }
            }
        }
    }

    /// Sends a `Renew`, given up on at the soft deadline `by`.
    fn host_renew(&mut self, h: usize, by: HostInstant) {
        let HostState::Holding(lease) = &self.hosts[h].state else {
            return;
        };
        let sent = self.host_sent(h);
        let request = Request::Renew {
            reservation: lease.reservation.clone(),
            token: lease.token,
            lease: lease.lease_key,
            host_time: sent.host_time,
        };
        let key = lease.key;
        let by_us = self.hosts[h].clock.first_true_us_at_us(by.as_us());
        let timeout = self
            .world
            .request_timeout_us
            .min(by_us.saturating_sub(self.world.now));
        let dc = self.hosts[h].dc;
        let rpc = self.world.request_within(
            NodeId::Host(h as u32),
            NodeId::Dc(dc),
            key,
            request,
            timeout,
        );
        let renewing = Renewing { rpc, sent };
        if let HostState::Holding(l) = &mut self.hosts[h].state {
            l.renewing = Some(renewing);
        }
    }

    /// The actor stops (released, killed, or told the lease is gone); the host releases.
    fn host_stop(&mut self, h: usize) {
        let HostState::Holding(lease) = &self.hosts[h].state else {
            return;
        };
        let (key, reservation, token) = (lease.key, lease.reservation.clone(), lease.token);
        let lease_key = lease.lease_key;
        self.checker.on_holder_stop(self.world.now, key, h as u32);
        self.host_release(h, key, reservation, token, lease_key);
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
        lease: LeaseKey,
    ) {
        let outcome = if self
            .world
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
        let rpc = self.world.rpc();
        let dc = self.hosts[h].dc;
        self.world.send(Message {
            from: NodeId::Host(h as u32),
            to: NodeId::Dc(dc),
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
        match (timer, &self.hosts[h].state) {
            (HostTimer::Act, HostState::Idle) => self.host_acquire(h),
            (HostTimer::Lease, HostState::Holding(_)) if current => self.drive_lease(h),
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
        let w = &self.scenario.workload;
        let wait_ms = if self.world.rng.chance(w.wait_fraction) {
            w.acquire_wait_ms
        } else {
            0
        };
        let mut bytes = [0u8; 16];
        bytes[..8].copy_from_slice(&self.world.rng.next_u64().to_le_bytes());
        bytes[8..].copy_from_slice(&(self.world.rng.next_u64() | 1).to_le_bytes());
        let lease = LeaseKey::from_bytes(bytes).expect("never all zeros");
        let acquiring = Acquiring {
            key,
            actor,
            lease,
            wait_ms,
            tries: Vec::new(),
        };
        self.host_try_acquire(h, acquiring);
    }

    /// Sends one try of `acquiring` (the same lease key every time).
    fn host_try_acquire(&mut self, h: usize, mut acquiring: Acquiring) {
        let sent = self.host_sent(h);
        let (key, wait_ms) = (acquiring.key, acquiring.wait_ms);
        let dc = self.hosts[h].dc;
        let request = Request::Acquire {
            config: KeyConfig::named(self.keys[key as usize].name.clone()),
            actor: acquiring.actor.clone(),
            lease: acquiring.lease,
            host_time: sent.host_time,
            wait_ms,
        };
        self.world.current_key = key;
        let rpc = if wait_ms == 0 {
            self.world
                .request(NodeId::Host(h as u32), NodeId::Dc(dc), key, request)
        } else {
            // A request that asks to wait gets that much more time (HostAgent).
            self.measurements.count(Counter::HostAcquireWithWait);
            let timeout_us = self.world.request_timeout_us + u64::from(wait_ms) * 1000;
            self.stream_request(
                NodeId::Host(h as u32),
                NodeId::Dc(dc),
                key,
                request,
                timeout_us,
            )
        };
        acquiring.tries.push(Try { rpc, sent });
        self.hosts[h].state = HostState::Acquiring(acquiring);
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
            HostState::Acquiring(acquiring)
                if acquiring.tries.iter().any(|t| t.rpc == message.rpc) =>
            {
                let answered = *acquiring
                    .tries
                    .iter()
                    .find(|t| t.rpc == message.rpc)
                    .expect("matched above");
                self.hosts[h].answered_tries = acquiring.tries.iter().map(|t| t.rpc).collect();
                self.host_acquired(h, acquiring.key, answered, acquiring.lease, reply)
            }
            HostState::Holding(lease) if lease.renewing.map(|r| r.rpc) == Some(message.rpc) => {
                self.host_renewed(h, Some(reply))
            }
            // A grant nobody asked for any more (the request timed out, or
            // the host crashed, while the DC worked on it): the lease lapses
            // unused.
            // The same outcome for another try of an acquire already answered.
            _ if self.hosts[h].answered_tries.contains(&message.rpc) => {
                self.measurements.count(Counter::AcquireAnsweredAgain);
            }
            _ if matches!(reply, Reply::Acquire(AcquireReply::Acquired(_))) => {
                let work = self.measurements.take_acquire_work(message.rpc);
                let gave_up = self.acquires_given_up.remove(&message.rpc);
                self.measurements.count(match (gave_up, work.awaits > 0) {
                    (true, true) => Counter::AcquiredAfterTheHostGaveUpWaiting,
                    (true, false) => Counter::AcquiredAfterTheHostGaveUp,
                    (false, true) => Counter::AcquiredAfterTheHostCrashedWaiting,
                    (false, false) => Counter::AcquiredAfterTheHostCrashed,
                })
            }
            _ => {}
        }
    }

    fn host_acquired(
        &mut self,
        h: usize,
        key: u32,
        answered: Try,
        lease_key: LeaseKey,
        reply: Reply,
    ) {
        let Try { rpc, sent } = answered;
        let work = self.measurements.take_acquire_work(rpc);
        let latency = self.world.now - sent.true_us;
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
        let now = self.host_instant(h);
        let retry_ms = self.scenario.workload.renew_retry_ms;
        let started = HostLease::start(&deadlines, sent.host_time, sent.instant, now, retry_ms);
        let Ok(held) = started else {
            // Too late to start: the grant is already past its soft deadline.
            self.measurements.count(Counter::HostGrantTooLate);
            self.host_release(h, key, reservation, token, lease_key);
            return self.go_idle(h);
        };
        if let Some(&g) = self.dc_index.get(reservation.dc())
            && self.dc_lease_expired(usize::from(g))
        {
            let dc = reservation.dc().clone();
            self.checker
                .on_holder_start_under_expired_dc(&dc, key, h as u32, &reservation);
        }
        self.checker
            .on_holder_start(self.world.now, key, h as u32, token, &reservation);
        let hold = self.scenario.workload.hold_ms;
        let leave_at = self.world.now + self.world.rng.exp(hold * 1000.0);
        self.hosts[h].generation += 1;
        self.hosts[h].state = HostState::Holding(Lease {
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
        self.host_timer_at(h, leave_at, HostTimer::Leave);
        self.drive_lease(h);
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
            None => Counter::PreviousNone,
            Some(ReleaseCause::Released(RunOutcome::Ok)) => Counter::PreviousReleasedOk,
            Some(ReleaseCause::Released(RunOutcome::Failed { .. })) => {
                Counter::PreviousReleasedFailed
            }
            Some(ReleaseCause::Expired) => Counter::PreviousExpired,
            Some(ReleaseCause::Forced) => Counter::PreviousForceReleased,
            Some(ReleaseCause::Cancelled) => Counter::PreviousCancelled,
        });
        let view = view!(self);
        self.checker
            .on_acquired(&view, key, reservation, token, previous);
    }

    /// The answer to host `h`'s renewal (`None`: none in time).
    fn host_renewed(&mut self, h: usize, reply: Option<Reply>) {
        let now = self.host_instant(h);
        let HostState::Holding(lease) = &mut self.hosts[h].state else {
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
            Renewal::Draining => self.measurements.count(Counter::RenewDraining),
            Renewal::TooLate => self.measurements.count(Counter::RenewAnsweredTooLate),
            Renewal::Lost | Renewal::Failed { .. } => {}
        }
        if answered {
            let latency = self.world.now - renewing.sent.true_us;
            self.measurements.record(Op::Renew, latency, 0, 0);
        }
        self.drive_lease(h);
    }

    pub(crate) fn host_timeout(&mut self, h: usize, rpc: u64) {
        if !self.hosts[h].up {
            return;
        }
        match self.hosts[h].state.clone() {
            HostState::Acquiring(acquiring)
                if acquiring.tries.last().map(|t| t.rpc) == Some(rpc) =>
            {
                if acquiring.tries.len() < ACQUIRE_ATTEMPTS_DEFAULT as usize {
                    // No answer in time: the same acquire again, same lease key.
                    self.measurements.count(Counter::AcquireRetriedAtHost);
                    return self.host_try_acquire(h, acquiring);
                }
                let first = acquiring.tries[0].sent;
                let work = self.measurements.take_acquire_work(rpc);
                let latency = self.world.now - first.true_us;
                self.measurements.count(Counter::AcquireTimedOutAtHost);
                // Fault-free: nothing but load delayed it (DESIGN.md §7.6 wants none).
                let (from_ms, to_ms) = (first.true_us / 1000, self.world.now / 1000);
                if !self.scenario.faulty_between(from_ms, to_ms) {
                    self.measurements
                        .count(Counter::AcquireTimedOutAtHostWithNoFault);
                    if self.scenario.network.loss == 0.0 {
                        let detail = format!(
                            "host {h} gave up after {} tries over {} ms with no fault in the way",
                            acquiring.tries.len(),
                            to_ms - from_ms
                        );
                        self.checker.on_acquire_unanswered(acquiring.key, detail);
                    }
                }
                self.acquires_given_up
                    .extend(acquiring.tries.iter().map(|t| t.rpc));
                self.measurements
                    .record(Op::AcquireFailed, latency, work.peer_rtts, 0);
                // Gave up: cancel the grant it may have been made (HostAgent's rule).
                let cancel = Request::Cancel {
                    key: self.keys[acquiring.key as usize].clone(),
                    lease: acquiring.lease,
                };
                let dc = self.hosts[h].dc;
                self.world.request(
                    NodeId::Host(h as u32),
                    NodeId::Dc(dc),
                    acquiring.key,
                    cancel,
                );
                self.go_idle(h);
            }
            HostState::Holding(lease) if lease.renewing.map(|r| r.rpc) == Some(rpc) => {
                self.host_check(h);
                self.host_renewed(h, None);
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
            self.world.current_key = lease.key;
            self.checker
                .on_holder_stop(self.world.now, lease.key, h as u32);
            self.measurements.count(Counter::HostCrashWhileHolding);
        }
        let host = &mut self.hosts[h];
        host.up = false;
        host.incarnation += 1;
        host.state = HostState::Down;
        let at = self.world.now + self.scenario.workload.host_restart_ms * 1000;
        self.world
            .schedule(at, Event::HostRestart { host: h as u32 });
    }

    /// The host comes back, idle.
    pub(crate) fn host_restart(&mut self, h: usize) {
        self.hosts[h].up = true;
        self.go_idle(h);
    }
}
