//! A simulated DC crashes and restarts: its volatile state lost, its
//! in-flight writes landed or voided (the ambiguous commit), the waits
//! registered with it lost with their connections, its store kept or lost.

use homing_core::AwaitReply;
use homing_node::{Endpoint, StoreOp as DcOp};
use homing_store::memory::MemoryDc;

use crate::counter::Counter;
use crate::dc_lease::DcLeaseDriver;
use crate::event::Event;
use crate::invariants::view;
use crate::sim::Sim;
use crate::store::StoreCall;

impl Sim {
    /// The DC crashes: in-flight requests and caches are lost, committed records stay.
    pub(crate) fn dc_crash(&mut self, d: usize) {
        self.land_in_flight_writes(d);
        let dc = &mut self.dcs[d];
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
        self.dcs[d].upkeep = Some(self.fresh_upkeep(d));
        let dc = &mut self.dcs[d];
        dc.woken.clear();
        dc.endpoint = Endpoint::new(dc.endpoint_config.clone());
        // The lease lives in the process: writes waiting for marks die with it.
        dc.lease = DcLeaseDriver::new(&self.policy, self.rules.mutations);
        self.checker.wake.on_dc_crash(self.world.now, d as u16);
        // Every other DC parked on this one learns it one idle timeout later.
        let idle_us = self.scenario.network.idle_timeout_ms * 1000;
        let mut lost = Vec::new();
        for (o, other) in self.dcs.iter().enumerate() {
            for (rpc, peer) in &other.await_rpcs {
                if usize::from(*peer) == d {
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

    /// DC `d` is crashing: each store write it has in flight lands or is
    /// lost (`crash_lands_in_flight`). A landed write is durable but its
    /// task never learns it: committed, not acknowledged.
    fn land_in_flight_writes(&mut self, d: usize) {
        let p = self.scenario.stores.crash_lands_in_flight;
        let in_flight: Vec<DcOp> = self.dcs[d]
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
                    expected, record, ..
                } => {
                    self.cas(d, expected, &record);
                }
                DcOp::Allocate => {
                    self.allocate(d);
                }
                other => unreachable!("only writes and allocations land: {other:?}"),
            }
        }
    }

    /// The `Await` RPCs of running DCs pending on DC `d`.
    fn awaits_on(&self, d: usize) -> Vec<(usize, u64)> {
        let mut on = Vec::new();
        for (o, other) in self.dcs.iter().enumerate().filter(|(_, o)| o.up) {
            for (rpc, peer) in &other.await_rpcs {
                if usize::from(*peer) == d {
                    on.push((o, *rpc));
                }
            }
        }
        on
    }

    /// The DC restarts from its durable state (`store_lost`: from an empty
    /// store, under the same id — which its lease's floor check refuses: it
    /// stays down, as homingd refuses to start).
    pub(crate) fn dc_restart(&mut self, d: usize, store_lost: bool) {
        if self.dcs[d].up && self.dcs[d].endpoint.closing() {
            // A graceful shutdown that had not drained: cut like a crash.
            self.measurements.count(Counter::DcShutdownCut);
            self.dc_crash(d);
        }
        if store_lost {
            let dc = &mut self.dcs[d];
            dc.store = MemoryDc::new();
        }
        // What the store's process kept in memory is gone (the rest of its
        // allocator block).
        self.dcs[d].store.restart();
        self.dcs[d].up = true;
        if !self.dc_lease_open(d) {
            self.dcs[d].up = false;
            return;
        }
        self.dcs[d].up_since_us = self.world.now;
        self.checker.wake.on_dc_restart(self.world.now, d as u16);
        if self.rules.waiting.reset_on_restart {
            // Every pending `Await` on `d` rode a connection to its previous
            // process: the origin's next packet (a keep-alive at the latest)
            // draws a stateless reset from the new one, a round trip later.
            let keep_alive_us = self.scenario.network.keep_alive_ms.max(1) * 1000;
            for (o, rpc) in self.awaits_on(d) {
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
        let view = view!(self);
        self.checker.on_restart(&view, d);
    }
}
