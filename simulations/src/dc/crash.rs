//! A simulated DC crashes and restarts: its volatile state lost, its
//! in-flight writes landed or voided (the ambiguous commit), the waits
//! registered with it lost with their connections, its store kept or lost.

use homing_core::AwaitReply;
use homing_node::{Endpoint, LogFollower, StoreOp as DcOp};
use homing_store::memory::MemoryDc;

use super::Instance;
use super::ctx::{DcCtx, dc_view};
use super::lease::DcLeaseDriver;
use super::store::StoreCall;
use crate::counter::Counter;
use crate::event::{Event, Homingd};

impl DcCtx<'_> {
    /// The homingd crashes: its in-flight requests and caches are lost,
    /// committed records stay (the DC runs on if another homingd of it does).
    pub(crate) fn crash(&mut self) {
        self.land_in_flight_writes();
        if self.inst.up {
            self.dc.running -= 1;
        }
        self.dc.up = self.dc.running > 0;
        let dc = &mut *self.inst;
        dc.up = false;
        dc.epoch += 1;
        dc.down_since_us = self.world.now;
        dc.tasks.clear();
        dc.closing_since = None;
        dc.watches.clear();
        dc.peer_rpcs.clear();
        dc.await_rpcs.clear();
        if !dc.endpoint.waiters().is_empty() {
            self.measurements
                .count(Counter::WaitRegistrationsLostInCrash);
        }
        // Tickets keep counting up across the crash: the checkers know them.
        dc.endpoint.waiters_mut().wake_all(AwaitReply::TimedOut);
        self.inst.upkeep = Some(self.fresh_upkeep());
        let dc = &mut *self.inst;
        dc.woken.clear();
        // The registry, emptied, carries its ticket count into the fresh endpoint.
        let mut endpoint = Endpoint::new(self.dc.endpoint_config.clone());
        std::mem::swap(endpoint.waiters_mut(), dc.endpoint.waiters_mut());
        dc.endpoint = endpoint;
        dc.follower = LogFollower::new();
        dc.peer_at.clear();
        // The lease lives in the process: writes waiting for marks die with it.
        dc.lease = DcLeaseDriver::new(&self.policy, self.rules.mutations);
        self.checker.wake.on_dc_crash(self.world.now, self.addr());
        // Every other DC parked on this one learns it one idle timeout later.
        let idle_us = self.scenario.network.idle_timeout_ms * 1000;
        let lost = self.awaits_on(|_| true);
        for (o, rpc) in lost {
            let event = Event::ConnectionLost {
                dc: o,
                rpc,
                reset: false,
            };
            self.world.schedule(self.world.now + idle_us, event);
        }
    }

    /// The DC is crashing: each store write it has in flight lands or is
    /// lost (`crash_lands_in_flight`). A landed write is durable but its
    /// task never learns it: committed, not acknowledged.
    fn land_in_flight_writes(&mut self) {
        let p = self.scenario.stores.crash_lands_in_flight;
        let in_flight: Vec<DcOp> = self
            .inst
            .tasks
            .values()
            .filter_map(|t| match &t.waiting {
                Some(StoreCall::Dc(op @ (DcOp::Write { .. } | DcOp::Allocate))) => Some(op.clone()),
                _ => None,
            })
            .collect();
        for op in in_flight {
            if !self.world.rng.chance(p) {
                continue;
            }
            self.measurements
                .count(Counter::CrashWriteLandedUnacknowledged);
            match op {
                DcOp::Write {
                    expected,
                    record,
                    guard,
                    ..
                } => {
                    self.cas(expected, &record, guard.as_deref());
                }
                DcOp::Allocate => {
                    self.allocate();
                }
                other => unreachable!("only writes and allocations land: {other:?}"),
            }
        }
    }

    /// The `Await` RPCs pending on this homingd of the other DCs' homingd
    /// that `which` picks.
    fn awaits_on(&self, which: impl Fn(&Instance) -> bool) -> Vec<(Homingd, u64)> {
        let mut on = Vec::new();
        let others = self.all_dcs().iter().flat_map(|dc| &dc.instances);
        for other in others.filter(|o| which(o)) {
            for (rpc, peer) in &other.await_rpcs {
                if *peer == self.addr() {
                    on.push((other.addr, *rpc));
                }
            }
        }
        on
    }

    /// The DC restarts from its durable state (`store_lost`: from an empty
    /// store, under the same id — which its lease's floor check refuses: it
    /// stays down, as homingd refuses to start).
    pub(crate) fn restart(&mut self, store_lost: bool) {
        if self.inst.up && self.inst.endpoint.closing() {
            // A graceful shutdown that had not drained: cut like a crash.
            self.measurements.count(Counter::DcShutdownCut);
            self.crash();
        }
        // Only a DC none of whose homingd runs can have lost its store.
        if store_lost && !self.dc.up {
            let dc = &mut *self.dc;
            dc.store = MemoryDc::new();
        }
        // What the store's process kept in memory is gone (the rest of its
        // allocator block).
        self.dc.store.restart();
        let (was_up, dc_was_up) = (self.inst.up, self.dc.up);
        if !was_up {
            self.dc.running += 1;
        }
        self.inst.up = true;
        self.dc.up = true;
        if !self.lease_open() {
            self.inst.up = false;
            self.dc.running -= 1;
            self.dc.up = self.dc.running > 0;
            return;
        }
        self.inst.up_since_us = self.world.now;
        if !dc_was_up || self.dc.instances() <= 1 {
            self.dc.up_since_us = self.world.now;
        }
        self.checker.wake.on_dc_restart(self.world.now, self.addr());
        self.follow_start();
        if self.rules.waiting.reset_on_restart {
            // Every pending `Await` on this DC rode a connection to its previous
            // process: the origin's next packet (a keep-alive at the latest)
            // draws a stateless reset from the new one, a round trip later.
            let keep_alive_us = self.scenario.network.keep_alive_ms.max(1) * 1000;
            let d = self.d();
            for (o, rpc) in self.awaits_on(|o| o.up) {
                let at = self.world.now
                    + self.world.rng.below(keep_alive_us)
                    + self.world.network.rtt_us(o.d(), d);
                let event = Event::ConnectionLost {
                    dc: o,
                    rpc,
                    reset: true,
                };
                self.world.schedule(at, event);
            }
        }
        let d = self.d();
        let view = dc_view!(self);
        self.checker.on_restart(&view, d);
    }
}
