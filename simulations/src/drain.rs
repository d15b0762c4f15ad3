//! Operator drains as requests: homing-node's `Drain`, as homingd runs it.
//! A `drain` fault picks `count` keys; each drain is sent by an operator to a
//! random running DC, which walks the key's chain (its own store, its
//! peers; from the member it remembers, as homingd does), drains the tail
//! if it owns it, and otherwise forwards the drain
//! once to the tail's DC. A DC serving a forwarded drain that forwards it
//! again breaks `drain_forwarded_once` (one operator request may never
//! bounce between DCs).

use crate::counter::Counter;
use homing_core::{Key, Request};

use crate::dc::Task;
use crate::event::NodeId;
use crate::sim::Sim;
use crate::task::TaskStepper;

impl Sim {
    /// The `drain` fault: an operator drains `count` random keys, each
    /// through a random running DC.
    pub(crate) fn drain_keys(&mut self, count: u32) {
        for _ in 0..count {
            let k = self.world.rng.below(self.keys.all().len() as u64) as usize;
            let d = self.world.rng.below(self.dcs.len() as u64) as usize;
            if !self.dcs[d].up {
                continue;
            }
            self.measurements.count(Counter::DrainRequested);
            let key = self.keys.all()[k].clone();
            self.drain_start(d, k as u32, key);
        }
    }

    /// An operator's drain of `key` (the trace's `key_index`) starts at DC
    /// `d`: nobody waits for its reply.
    fn drain_start(&mut self, d: usize, key_index: u32, key: Key) {
        let serve = self.dcs[d].endpoint.serve(None, Request::Drain { key });
        let kind = TaskStepper::Serve(Box::new(serve));
        self.step_start(d, Task::new(NodeId::Dc(d as u16), 0, key_index, kind));
    }
}
