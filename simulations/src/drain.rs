//! Operator drains as requests: homing-node's `Drain`, as homingd runs it.
//! A `drain` fault picks `count` keys; each drain is sent by an operator to a
//! random running DC, which walks the key's chain (its own store, its
//! peers), drains the tail if it owns it, and otherwise forwards the drain
//! once to the tail's DC. A DC serving a forwarded drain that forwards it
//! again breaks `drain_forwarded_once` (one operator request may never
//! bounce between DCs).

use crate::counter::Counter;
use homing_core::{
    ChainWalk, ErrorKind, ErrorReply, Key, Need, Poll, Reply, Request, Source,
    chain::HOP_LIMIT_DEFAULT,
};
use homing_node::{Drain, DrainPoll, Failure, GlobalRead};

use crate::dc::{Next, StoreOp, Task, TaskKind, peer_answer};
use crate::sim::{NodeId, Sim};

/// A drain in progress at one DC, and its chain walk while it walks.
#[derive(Debug)]
pub(crate) struct DrainJob {
    pub(crate) drain: Drain,
    pub(crate) walk: Option<ChainWalk>,
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
        let job = DrainJob {
            drain: Drain::new(dc, key, forwarded, self.rules.mutations),
            walk: None,
            forwarded,
        };
        let task = Task::new(client, rpc, key_index, TaskKind::Drain(Box::new(job)));
        let tid = self.new_task_id(d);
        self.drain_drive(d, tid, task);
    }

    /// A read of the drain's walk completed (its record operations go
    /// through `dc_stored`).
    pub(crate) fn drain_store_done(&mut self, d: usize, tid: u64, mut task: Task, op: StoreOp) {
        let local = self.dcs[d].id.clone();
        let segment = match &op {
            StoreOp::Segment(id) => Some(self.local_segment(d, id)),
            _ => None,
        };
        let TaskKind::Drain(job) = &mut task.kind else {
            return;
        };
        match (op, job.walk.as_mut()) {
            (StoreOp::GlobalGet { key, read }, Some(walk)) => {
                debug_assert_eq!(
                    read,
                    GlobalRead::Latest,
                    "a drain's walk reads the latest entry"
                );
                let entry = self.global.get(&key).cloned();
                let _ = walk.handle_global(entry, Source::Local);
            }
            (StoreOp::Segment(_), Some(walk)) => match segment {
                Some(Ok(s)) => {
                    let _ = walk.handle_segment(&local, s, Source::Local);
                }
                _ => {
                    let e = ErrorReply::new(ErrorKind::Inconsistent, "a broken local segment");
                    job.walk = None;
                    job.drain.handle_walked(Err(Failure::Refused(e)));
                }
            },
            (op, _) => {
                unreachable!("a drain reads global entries and segments only walking: {op:?}")
            }
        }
        self.drain_drive(d, tid, task);
    }

    /// A peer answered the drain's walk or its forward (or did not: `Err`).
    pub(crate) fn drain_peer_answer(
        &mut self,
        d: usize,
        tid: u64,
        mut task: Task,
        peer: usize,
        reply: Result<Reply, Failure>,
    ) {
        let peer_id = self.dcs[peer].id.clone();
        let TaskKind::Drain(job) = &mut task.kind else {
            return;
        };
        match (job.walk.as_mut(), reply) {
            (Some(walk), Ok(Reply::Reservation(segment))) => {
                let _ = walk.handle_segment(&peer_id, segment, Source::Remote);
            }
            (Some(_), other) => {
                job.walk = None;
                let failure =
                    other.and_then(|r| peer_answer::<()>(r, "resolve-reservation", |_| None));
                job.drain
                    .handle_walked(Err(failure.err().unwrap_or_else(lie)));
            }
            (None, reply) => {
                let drained = reply.and_then(|r| {
                    peer_answer(r, "drain", |r| matches!(r, Reply::Drained).then_some(()))
                });
                job.drain.handle_forwarded(drained);
            }
        }
        self.drain_drive(d, tid, task);
    }

    /// Runs the drain until it needs a store or a peer, or ends.
    pub(crate) fn drain_drive(&mut self, d: usize, tid: u64, mut task: Task) {
        let TaskKind::Drain(job) = &mut task.kind else {
            return;
        };
        let next = loop {
            if let Some(walk) = job.walk.as_mut() {
                match walk.poll().clone() {
                    Poll::Need(Need::GlobalEntry(key)) => {
                        let read = GlobalRead::Latest;
                        break Next::Store(StoreOp::GlobalGet { key, read });
                    }
                    Poll::Need(Need::Reservation(id)) if id.dc() == &self.dcs[d].id => {
                        break Next::Store(StoreOp::Segment(id));
                    }
                    Poll::Need(Need::Reservation(id)) => match self.dc_index.get(id.dc()) {
                        Some(&to) => break Next::Peer(to, Request::ResolveReservation { id }),
                        None => {
                            let e = ErrorReply::new(ErrorKind::Inconsistent, "unknown dc");
                            job.walk = None;
                            job.drain.handle_walked(Err(Failure::Refused(e)));
                        }
                    },
                    Poll::NotFound => {
                        job.walk = None;
                        job.drain.handle_walked(Ok(None));
                    }
                    Poll::Done(walked) => {
                        job.walk = None;
                        job.drain.handle_walked(Ok(Some(walked.tail.id)));
                    }
                    Poll::Failed(e) => {
                        let e = ErrorReply::new(ErrorKind::Inconsistent, e.to_string());
                        job.walk = None;
                        job.drain.handle_walked(Err(Failure::Refused(e)));
                    }
                }
                continue;
            }
            match job.drain.poll() {
                DrainPoll::Walk(key) => {
                    job.walk = Some(ChainWalk::from_key(key, HOP_LIMIT_DEFAULT));
                }
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

/// A walk answered with a segment it could not take.
fn lie() -> Failure {
    Failure::Refused(ErrorReply::new(
        ErrorKind::Inconsistent,
        "a segment the walk refused",
    ))
}
