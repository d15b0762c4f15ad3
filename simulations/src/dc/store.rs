//! The simulated DC's store operations, performed when their latency
//! passes: homing-store's memory backend in its synchronous form, a
//! failing-store fault's failures (a write may still land), the checker
//! told of every write that landed, and this DC's own segment of a chain.

use homing_core::{
    DcRecord, Key, LocalSegment, ReservationId, Segment, SegmentError, SessionGuard, Written,
};
use homing_node::{
    Answer, Failure, GlobalAnswer, GlobalOp, GlobalRead, StoreOp as DcOp, Stored, segment_failure,
};
use homing_store::GuardedCas;
use homing_store::StoreError;

use super::ctx::{DcCtx, dc_view};
use super::task::Task;
use crate::counter::Counter;
use crate::rng::Rng;

/// When a DC's store is slow or fails (`slow_store` and `failing_store`
/// faults).
#[derive(Debug, Default)]
pub(crate) struct StoreFaults {
    /// Slow windows: (start µs, end µs, latency factor).
    pub(crate) slow: Vec<(u64, u64, f64)>,
    /// Failing windows: (start µs, end µs, share of operations failed).
    pub(crate) failing: Vec<(u64, u64, f64)>,
}

impl StoreFaults {
    /// The store's latency factor at true time `now_us` (1: not slow).
    pub(crate) fn factor(&self, now_us: u64) -> f64 {
        (self.slow.iter())
            .filter(|(start, end, _)| *start <= now_us && now_us < *end)
            .map(|s| s.2)
            .fold(1.0, f64::max)
    }

    /// Whether the operation completing at `now_us` fails: a draw inside
    /// a failing window.
    pub(crate) fn fails(&self, now_us: u64, rng: &mut Rng) -> bool {
        let share = (self.failing.iter())
            .filter(|(start, end, _)| *start <= now_us && now_us < *end)
            .map(|s| s.2)
            .fold(0.0, f64::max);
        share > 0.0 && rng.chance(share)
    }

    /// The largest latency factor of any window (1: never slow).
    pub(crate) fn slowest(&self) -> f64 {
        self.slow.iter().map(|s| s.2).fold(1.0, f64::max)
    }
}

/// What a task waits for from a store, done when the store's latency
/// passes.
#[derive(Debug)]
pub(crate) enum StoreCall {
    /// One of homing-node's operations on the DC's own store.
    Dc(DcOp),
    /// A reservation's segment as this DC answers it.
    Segment(ReservationId),
    /// A key's global entry, from the global store, as current as `read`
    /// says (a nearest read may miss a fresh entry: the scenario's
    /// `stale_global_reads`).
    GlobalGet { key: Key, read: GlobalRead },
}

impl DcCtx<'_> {
    /// The DC's store performs `op` (a failure as homingd classifies it);
    /// a landed write reaches the checker, the DC's waiters and watchers
    /// ([`DcCtx::cas`]).
    fn perform(&mut self, op: DcOp) -> Result<Stored, Failure> {
        let dc = &mut *self.dc;
        let failed = |e| super::upkeep::store_failure(&dc.id, e);
        Ok(match op {
            DcOp::Read(id) => Stored::Record(dc.store.read(&id)),
            DcOp::Allocate => Stored::Allocated(self.allocate()),
            DcOp::Write {
                expected,
                record,
                guard,
                ..
            } => Stored::Written(self.cas(expected, &record, guard.as_deref())),
            DcOp::WriteEach(writes) => Stored::WrittenEach(
                (writes.iter())
                    .map(|w| Ok(self.cas(Some(w.expected), &w.record, None)))
                    .collect(),
            ),
            DcOp::Session(id) => Stored::Session(dc.store.session(&id)),
            DcOp::WriteSession { expected, row } => {
                let cas = dc.store.compare_and_set_session(expected, &row);
                Stored::Written(match cas.map_err(failed)? {
                    homing_store::SessionCas::Written => Written::Yes,
                    homing_store::SessionCas::Conflict { .. } => Written::Conflict,
                })
            }
            DcOp::SessionNotices { id, after, limit } => {
                let page = dc.store.session_notices(&id, after, limit);
                Stored::Page(page.map_err(failed)?)
            }
            DcOp::SessionKeys { id, after, limit } => {
                let page = dc.store.session_keys(&id, after.as_ref(), limit);
                Stored::Page(page.map_err(failed)?)
            }
            DcOp::DueSessions {
                until,
                after,
                limit,
            } => {
                let after = after.map(|(at, id)| homing_store::SessionCursor { at, id });
                let page = dc.store.due_sessions(until, after.as_ref(), limit);
                Stored::Sessions(page.map_err(failed)?)
            }
            DcOp::DeleteSession { id, version } => {
                Stored::Deleted(dc.store.delete_session(&id, version))
            }
            DcOp::Due {
                kind,
                until,
                after,
                limit,
            } => {
                let page = dc.store.due(kind, until, after.as_ref(), limit);
                Stored::Due(page.map_err(failed)?)
            }
            DcOp::Settle { id, version } => Stored::Settled(dc.store.settle(&id, version)),
            DcOp::Events { after, limit } => {
                let page = dc.store.events(after, limit).map_err(failed)?;
                Stored::Events {
                    events: page.events,
                    oldest: page.oldest,
                    head: page.head,
                }
            }
            DcOp::TrimEvents { before } => {
                dc.store.trim_events(before);
                Stored::Trimmed
            }
            DcOp::Scan {
                scope,
                name,
                after,
                limit,
            } => {
                let page = dc.store.scan(&scope, &name, after.as_ref(), limit);
                Stored::Page(page.map_err(failed)?)
            }
        })
    }
}

impl StoreCall {
    /// Which store it was asked of.
    pub(crate) fn asked(&self) -> Asked {
        match self {
            StoreCall::Dc(_) => Asked::DcStore,
            StoreCall::Segment(_) => Asked::Segment,
            StoreCall::GlobalGet { .. } => Asked::Global,
        }
    }
}

/// What a failed operation of a task asked: the DC's own store, a
/// reservation's segment from it, or the global store — so the task's
/// stepper is told by the handler for that answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Asked {
    DcStore,
    Segment,
    Global,
}

impl DcCtx<'_> {
    fn local_segment(&self, id: &ReservationId) -> Result<Segment, SegmentError> {
        let dc = &*self.dc;
        let now = dc.clock.store_time(self.world.now);
        let hop_limit = self.inst.endpoint.config().hop_limit;
        let mut segment = LocalSegment::new(dc.id.clone(), id.clone(), hop_limit);
        while let Some(at) = segment.need().cloned() {
            let record = dc.store.record(&at);
            let session = record.and_then(|r| dc.store.session(r.session()?));
            segment.handle(record, now, &self.policy, session.as_ref())?;
        }
        Ok(segment.finish())
    }

    /// Compare-and-set of `record` over version `expected` in the DC's
    /// store (homing-store's memory backend: its key check, version rules
    /// and conflict judgement); a write that landed goes to the checker and
    /// to the record's waiters (homingd's `Node::wrote`). A call the store
    /// refuses breaks `store_accepts_writes` and changes nothing.
    pub(crate) fn cas(
        &mut self,
        expected: Option<u64>,
        record: &DcRecord,
        guard: Option<&SessionGuard>,
    ) -> Written {
        let id = &record.id;
        let key = self.keys.of_record(id, &record.key);
        self.world.current_key = key;
        let previous = self.dc.store.get(id);
        let head = self.dc.store.event_head();
        let landed = match guard {
            None => (self.dc.store.compare_and_set(expected, record)).map(|cas| cas.landed()),
            Some(guard) => (self
                .dc
                .store
                .compare_and_set_in_session(expected, record, guard))
            .map(|cas| cas == GuardedCas::Written),
        };
        match landed {
            Ok(true) => {}
            Ok(false) => return Written::Conflict,
            Err(e) => {
                let d = self.dc.idx;
                let detail = format!("dc #{d} refused a write of {id} over {expected:?}: {e}");
                self.checker.on_store_refused(key, detail);
                return Written::Conflict;
            }
        }
        let d = self.d();
        let view = dc_view!(self);
        self.checker.on_commit(
            &view,
            self.world.now,
            key,
            d,
            id,
            record.version,
            previous.as_ref(),
        );
        if self.inst.endpoint.waiters().has_waiters(id) {
            self.waiters_written(record);
        }
        if self.dc.store.event_head() > head && !self.inst.watches.is_empty() {
            self.watches_moved();
        }
        Written::Yes
    }

    /// The DC's store failed `op` (a failing-store fault): `Unavailable`,
    /// as a backend that could not be reached answers — a write may still
    /// have landed, as one whose outcome was lost may have. The task
    /// handles the failure as homingd's driver does.
    fn store_op_failed(&mut self, tid: u64, task: Box<Task>, op: StoreCall) {
        self.measurements.count(Counter::DcStoreOpFailed);
        let lands = self.scenario.stores.crash_lands_in_flight;
        match &op {
            StoreCall::Dc(DcOp::Write {
                expected,
                record,
                guard,
                ..
            }) if self.world.rng.chance(lands) => {
                self.measurements.count(Counter::DcStoreFailedWriteLanded);
                self.cas(*expected, record, guard.as_deref());
            }
            // Each write of a batch lands or not on its own.
            StoreCall::Dc(DcOp::WriteEach(writes)) => {
                for w in writes {
                    if self.world.rng.chance(lands) {
                        self.measurements.count(Counter::DcStoreFailedWriteLanded);
                        self.cas(Some(w.expected), &w.record, None);
                    }
                }
            }
            StoreCall::Dc(DcOp::Allocate) if self.world.rng.chance(lands) => {
                self.allocate();
            }
            _ => {}
        }
        let e = StoreError::Unavailable {
            backend: "memory",
            reason: "failing_store fault".into(),
        };
        let failure = super::upkeep::store_failure(&self.dc.id, e);
        self.store_failed(tid, task, op.asked(), failure.into_reply());
    }

    /// A unique from the DC's allocator (homing-store's hi-lo blocks).
    pub(crate) fn allocate(&mut self) -> u64 {
        let unique = (self.dc.store.allocate()).expect("a simulation never allocates 2^64 uniques");
        self.checker.on_allocate(usize::from(self.dc.idx), unique);
        unique
    }

    pub(crate) fn store_done(&mut self, epoch: u32, tid: u64) {
        if !self.inst.up || self.inst.epoch != epoch {
            return;
        }
        let Some(mut task) = self.inst.tasks.remove(&tid) else {
            return;
        };
        self.world.current_key = task.key;
        let Some(op) = task.waiting.take() else {
            return;
        };
        let (faults, now) = (&self.dc.store_faults, self.world.now);
        if op.asked() != Asked::Global && faults.fails(now, &mut self.world.rng) {
            return self.store_op_failed(tid, task, op);
        }
        let op = match op {
            StoreCall::Dc(op) => {
                let stored = self.perform(op);
                let update = task.kind.acquire().is_none();
                if update && stored == Ok(Stored::Written(Written::Conflict)) {
                    self.measurements.count(Counter::UpdateCasConflict);
                }
                return self.stored(tid, task, stored);
            }
            op => op,
        };
        let answer = match op {
            StoreCall::Dc(_) => unreachable!("answered by stored"),
            // A stepper's own segment (a resolve's, an acquire's walk, a
            // drain's, an upkeep pass's proof).
            StoreCall::Segment(id) => {
                Answer::Segment(self.local_segment(&id).map_err(segment_failure))
            }
            StoreCall::GlobalGet { key, read } => {
                let nearest = read == GlobalRead::Nearest;
                let (entry, missed) =
                    (self.global).entry(&key, nearest, self.world.now, &mut self.world.rng);
                if missed {
                    self.measurements.count(Counter::ConnectStaleGlobalReads);
                }
                let now = self.node_now();
                let read = GlobalOp::Entry { key, read };
                let entry = GlobalAnswer::Entry(entry);
                Answer::Global(Ok(self.inst.endpoint.learn(&read, entry, now)))
            }
        };
        self.step_answered(tid, task, answer);
    }

    /// The DC's store answered task `tid`'s operation (or failed it): the
    /// task's stepper takes the answer.
    fn stored(&mut self, tid: u64, task: Box<Task>, stored: Result<Stored, Failure>) {
        self.step_answered(tid, task, Answer::Stored(stored));
    }
}
