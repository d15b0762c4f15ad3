//! A simulated DC crashes and restarts: its volatile state lost, its
//! in-flight writes landed or voided (the ambiguous commit), the waits
//! registered with it lost with their connections, its store kept or lost.

use homing_core::AwaitReply;
use homing_node::{Endpoint, StoreOp as DcOp};
use homing_store::memory::MemoryDc;

use super::ctx::{DcCtx, dc_view};
use super::lease::DcLeaseDriver;
use super::store::StoreCall;
use crate::counter::Counter;
use crate::event::Event;

impl DcCtx<'_> {
    /// The DC crashes: in-flight requests and caches are lost, committed records stay.
    pub(crate) fn crash(&mut self) {
        self.land_in_flight_writes();
        let dc = &mut *self.dc;
        dc.up = false;
        dc.epoch += 1;
        dc.down_since_us = self.world.now;
        dc.tasks.clear();
        dc.closing_since = None;
        dc.watches.clear();
        dc.peer_rpcs.clear();
        dc.await_rpcs.clear();
        if !dc.waiters.is_empty() {
            self.measurements
                .count(Counter::WaitRegistrationsLostInCrash);
        }
        // Tickets keep counting up across the crash: the checkers know them.
        dc.waiters.wake_all(AwaitReply::TimedOut);
        self.dc.upkeep = Some(self.fresh_upkeep());
        let dc = &mut *self.dc;
        dc.woken.clear();
        dc.endpoint = Endpoint::new(dc.endpoint_config.clone());
        // The lease lives in the process: writes waiting for marks die with it.
        dc.lease = DcLeaseDriver::new(&self.policy, self.rules.mutations);
        self.checker.wake.on_dc_crash(self.world.now, self.dc.idx);
        // Every other DC parked on this one learns it one idle timeout later.
        let idle_us = self.scenario.network.idle_timeout_ms * 1000;
        let mut lost = Vec::new();
        for (o, other) in self.all_dcs().iter().enumerate() {
            for (rpc, peer) in &other.await_rpcs {
                if *peer == self.dc.idx {
                    lost.push((o as u16, *rpc));
                }
            }
        }
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
            .dc
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

    /// The `Await` RPCs of running DCs pending on this one.
    fn awaits_on(&self) -> Vec<(usize, u64)> {
        let mut on = Vec::new();
        for (o, other) in self.all_dcs().iter().enumerate().filter(|(_, o)| o.up) {
            for (rpc, peer) in &other.await_rpcs {
                if *peer == self.dc.idx {
                    on.push((o, *rpc));
                }
            }
        }
        on
    }

    /// The DC restarts from its durable state (`store_lost`: from an empty
    /// store, under the same id — which its lease's floor check refuses: it
    /// stays down, as homingd refuses to start).
    pub(crate) fn restart(&mut self, store_lost: bool) {
        if self.dc.up && self.dc.endpoint.closing() {
            // A graceful shutdown that had not drained: cut like a crash.
            self.measurements.count(Counter::DcShutdownCut);
            self.crash();
        }
        if store_lost {
            let dc = &mut *self.dc;
            dc.store = MemoryDc::new();
        }
        // What the store's process kept in memory is gone (the rest of its
        // allocator block).
        self.dc.store.restart();
        self.dc.up = true;
        if !self.lease_open() {
            self.dc.up = false;
            return;
        }
        self.dc.up_since_us = self.world.now;
        self.checker.wake.on_dc_restart(self.world.now, self.dc.idx);
        if self.rules.waiting.reset_on_restart {
            // Every pending `Await` on this DC rode a connection to its previous
            // process: the origin's next packet (a keep-alive at the latest)
            // draws a stateless reset from the new one, a round trip later.
            let keep_alive_us = self.scenario.network.keep_alive_ms.max(1) * 1000;
            let d = self.d();
            for (o, rpc) in self.awaits_on() {
                let at = self.world.now
                    + self.world.rng.below(keep_alive_us)
                    + self.world.network.rtt_us(o, d);
                let event = Event::ConnectionLost {
                    dc: o as u16,
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
