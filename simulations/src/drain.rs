//! Operator drains as requests: homing-node's `Drain`, as homingd runs it.
//! A `drain` fault picks `count` keys; each drain is sent by an operator to a
//! random running DC, which walks the key's chain (its own store, its
//! peers; from the member it remembers, as homingd does), drains the tail
//! if it owns it, and otherwise forwards the drain
//! once to the tail's DC. A DC serving a forwarded drain that forwards it
//! again breaks `drain_forwarded_once` (one operator request may never
//! bounce between DCs).

use crate::counter::Counter;
use homing_core::{Key, chain::HOP_LIMIT_DEFAULT};
use homing_node::Drain;

use crate::dc::{Task, TaskKind};
use crate::sim::{NodeId, Sim};
use crate::stepper::Stepping;

/// A drain in progress at one DC.
#[derive(Debug)]
pub(crate) struct DrainJob {
    pub(crate) drain: Drain,
    /// It arrived from another DC.
    pub(crate) forwarded: bool,
}

impl Sim {
    /// The `drain` fault: an operator drains `count` random keys, each
    /// through a random running DC.
    pub(crate) fn drain_keys(&mut self, count: u32) {
        for _ in 0..count {
            let k = self.rng.below(self.keys.len() as u64) as usize;
            let d = self.rng.below(self.dcs.len() as u64) as usize;
            if !self.dcs[d].up {
                continue;
            }
            self.measurements.count(Counter::DrainRequested);
            let key = self.keys[k].clone();
            self.drain_start(d, NodeId::Dc(d as u16), 0, k as u32, key, false);
        }
    }

    /// A drain of `key` starts at DC `d` (`forwarded`: from another DC).
    pub(crate) fn drain_start(
        &mut self,
        d: usize,
        client: NodeId,
        rpc: u64,
        key_index: u32,
        key: Key,
        forwarded: bool,
    ) {
        let dc = self.dcs[d].id.clone();
        let hint = self.dcs[d].hint(&key);
        let (hop_limit, policy) = (HOP_LIMIT_DEFAULT, self.policy);
        let drain = Drain::new(dc, key, forwarded, hop_limit, policy, self.rules.mutations);
        let job = DrainJob {
            drain: drain.with_hint(hint),
            forwarded,
        };
        let task = Task::new(
            client,
            rpc,
            key_index,
            TaskKind::Step(Box::new(Stepping::Drain(job))),
        );
        self.step_start(d, task);
    }
}
