//! A homingd's log follower, as homingd's `follow.rs` drives homing-node's
//! [`LogFollower`]: when the DC runs several homingd, each reads the DC
//! store's event log every `log_follow_ms` (at once again after a full
//! page), so that a write through one wakes the waiters and parked watches
//! of the others (OPERATIONS "Several homingd per DC"). A homingd alone in
//! its DC follows nothing: it learns of every write as it makes it.
//!
//! The page and the records it names are read when the timer fires; their
//! store latency delays the next page instead. A read the failing-store
//! fault fails is skipped, as homingd logs it and reads again later.

use homing_node::LogFollower;

use super::ctx::DcCtx;
use crate::counter::Counter;
use crate::event::Event;

impl DcCtx<'_> {
    /// Arms the follower's first read of a (re)started homingd, if its DC
    /// runs several.
    pub(crate) fn follow_start(&mut self) {
        if self.dc.instances() <= 1 {
            return;
        }
        self.inst.follower = LogFollower::new();
        let at = self.world.now + self.scenario.log_follow_ms * 1000;
        self.follow_at(at);
    }

    fn follow_at(&mut self, at_us: u64) {
        let (dc, epoch) = (self.addr(), self.inst.epoch);
        self.world.schedule(at_us, Event::LogFollow { dc, epoch });
    }

    /// The follower's timer: one page of the log, the records of this
    /// homingd's waiters it names looked at, parked watches told of new
    /// events; then the next page.
    pub(crate) fn follow_log(&mut self, epoch: u32) {
        if !self.inst.up || self.inst.epoch != epoch {
            return;
        }
        let (base, jitter) = (
            self.scenario.stores.dc_op_ms,
            self.scenario.stores.dc_op_jitter_ms,
        );
        let mut reads_us = self.store_delay_us(base, jitter);
        let interval_us = self.scenario.log_follow_ms * 1000;
        if self
            .dc
            .store_faults
            .fails(self.world.now, &mut self.world.rng)
        {
            self.measurements.count(Counter::LogFollowReadFailed);
            return self.follow_at(self.world.now + reads_us + interval_us);
        }
        let follower = &mut self.inst.follower;
        // Invariant: the follower asks for a page within the store's bound.
        let page = (self.dc.store)
            .events(follower.after(), follower.limit())
            .expect("a page within the bound");
        let followed = follower.handle_page(
            &page.events,
            page.oldest,
            page.head,
            self.inst.endpoint.waiters_mut(),
        );
        for id in &followed.look {
            reads_us += self.store_delay_us(base, jitter);
            let Some(read) = self.dc.store.read(id) else {
                continue;
            };
            self.measurements.count(Counter::LogFollowLooked);
            self.waiters_seen(&read);
        }
        if followed.events && !self.inst.watches.is_empty() {
            self.watches_moved();
        }
        let wait_us = if followed.more { 0 } else { interval_us };
        self.follow_at(self.world.now + reads_us + wait_us);
    }
}
