//! Operator drains as requests: homing-node's `Drain`, as homingd runs it.
//! A `drain` fault picks `count` keys; each drain is sent by an operator to a
//! random running DC, which walks the key's chain (its own store, its
//! peers; from the member it remembers, as homingd does), drains the tail
//! if it owns it, and otherwise forwards the drain
//! once to the tail's DC. A DC serving a forwarded drain that forwards it
//! again breaks `drain_forwarded_once` (one operator request may never
//! bounce between DCs).

use crate::counter::Counter;
use homing_core::{Key, Reply, Request, chain::HOP_LIMIT_DEFAULT};
use homing_node::{Drain, DrainPoll, Failure, GlobalAnswer, GlobalOp, segment_failure};

use crate::dc::{Next, StoreOp, Task, TaskKind, peer_answer};
use crate::sim::{NodeId, Sim};

/// A drain in progress at one DC.
#[derive(Debug)]
pub(crate) struct DrainJob {
    pub(crate) drain: Drain,
    /// It arrived from another DC.
    forwarded: bool,
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
        let task = Task::new(client, rpc, key_index, TaskKind::Drain(Box::new(job)));
        let tid = self.new_task_id(d);
        self.drain_drive(d, tid, task);
    }

    /// A read of the drain's walk completed (its record operations go
    /// through `dc_stored`).
    pub(crate) fn drain_store_done(&mut self, d: usize, tid: u64, mut task: Task, op: StoreOp) {
        let TaskKind::Drain(job) = &mut task.kind else {
            return;
        };
        match op {
            StoreOp::GlobalGet { key, .. } => {
                let entry = self.global.get(&key).cloned();
                job.drain.handle_global(Ok(GlobalAnswer::Entry(entry)));
            }
            StoreOp::Segment(id) => {
                let segment = self.local_segment(d, &id).map_err(segment_failure);
                job.drain.handle_segment(segment);
            }
            op => unreachable!("a drain reads global entries and segments only walking: {op:?}"),
        }
        self.drain_drive(d, tid, task);
    }

    /// A peer answered the drain's walk or its forward (or did not: `Err`).
    pub(crate) fn drain_peer_answer(
        &mut self,
        d: usize,
        tid: u64,
        mut task: Task,
        reply: Result<Reply, Failure>,
    ) {
        let TaskKind::Drain(job) = &mut task.kind else {
            return;
        };
        if job.drain.asks_segment() {
            let segment = reply.and_then(|r| {
                peer_answer(r, "resolve-reservation", |r| match r {
                    Reply::Reservation(segment) => Some(segment),
                    _ => None,
                })
            });
            job.drain.handle_segment(segment);
        } else {
            let drained = reply.and_then(|r| {
                peer_answer(r, "drain", |r| matches!(r, Reply::Drained).then_some(()))
            });
            job.drain.handle_forwarded(drained);
        }
        self.drain_drive(d, tid, task);
    }

    /// Runs the drain until it needs a store or a peer, or ends.
    pub(crate) fn drain_drive(&mut self, d: usize, tid: u64, mut task: Task) {
        let TaskKind::Drain(job) = &mut task.kind else {
            return;
        };
        let key = job.drain.key().clone();
        let next = loop {
            let poll = job.drain.poll();
            if let Some(member) = job.drain.take_learned() {
                self.dcs[d].remember(&key, member);
            }
            match poll {
                DrainPoll::Global(GlobalOp::Entry { key, read }) => {
                    break Next::Store(StoreOp::GlobalGet { key, read });
                }
                DrainPoll::Global(op) => unreachable!("a drain's walk reads entries only: {op:?}"),
                DrainPoll::Segment(id) => match self.ask_segment(d, id) {
                    Ok(next) => break next,
                    Err(failure) => job.drain.handle_segment(Err(failure)),
                },
                DrainPoll::Store(op) => break Next::Store(StoreOp::Dc(op)),
                DrainPoll::Forward { dc, key } => {
                    if job.forwarded {
                        let detail =
                            format!("a forwarded drain of {key} was forwarded again to {dc}");
                        self.checker.on_drain_forwarded_again(task.key, detail);
                    }
                    self.measurements.count(Counter::DrainForwarded);
                    // Invariant: the walk named the tail's DC, one of ours.
                    let to = self.dc_index[&dc];
                    break Next::Peer(to, Request::Drain { key });
                }
                DrainPoll::Done(result) => {
                    self.measurements.count(match &result {
                        Ok(_) => Counter::DrainDone,
                        Err(_) => Counter::DrainRefused,
                    });
                    if task.client == NodeId::Dc(d as u16) {
                        return; // the operator's own drain: nobody to answer
                    }
                    break Next::Reply(match result {
                        Ok(_) => Reply::Drained,
                        Err(e) => Reply::Error(e),
                    });
                }
            }
        };
        self.dc_continue(d, tid, task, next);
    }
}
