//! How a node performs homing-node's DC-store operations: each timed under
//! its metric name; a write only once the DC lease published its marks,
//! then its waiters and watchers told; this DC's own segment of a chain;
//! the event log followed for the writes of the DC's other homingd.

use std::time::Instant;

use homing_core::{DcRecord, LocalSegment, ReservationId, Segment, SessionGuard, Written};
use homing_node::{LogFollower, StoreOp, Stored};
use homing_store::{GuardedCas, SessionCas, StoreError};

use super::{Node, RequestError, store_now};
use crate::dc_lease;

impl Node {
    /// A write of `after` landed; `event` if it appended a lifecycle event.
    /// Wakes the watchers and the waiters the change concerns.
    pub(super) fn wrote(&self, event: bool, after: &DcRecord) {
        if event {
            self.changes.send_modify(|v| *v = v.wrapping_add(1));
        }
        self.waiters
            .written(after, store_now(), &self.config.policy);
    }

    /// Reads one page of this DC's event log after `follower`'s cursor and
    /// acts on it: parked watchers re-read when there are new events, and
    /// the waiters of each reservation an event changed get the record as
    /// stored now. So the writes of other homingd of this DC (sharing its
    /// DC store) wake this one's waiters and watchers. Returns whether the
    /// next page should be read at once; a record that cannot be read is
    /// left to its waiters' own timers.
    pub async fn follow_log(&self, follower: &mut LogFollower) -> Result<bool, StoreError> {
        let page = self
            .timed(
                "dc_events",
                self.records.events(follower.after(), follower.limit()),
            )
            .await?;
        let followed = self
            .waiters
            .follow(follower, &page.events, page.oldest, page.head);
        if followed.events {
            self.changes.send_modify(|v| *v = v.wrapping_add(1));
        }
        for id in &followed.look {
            match self.timed("dc_get", self.records.read(id)).await {
                Ok(Some(read)) => {
                    let woken = self.waiters.seen(&read, store_now(), &self.config.policy);
                    self.metrics.log_follow_looked(woken);
                }
                Ok(None) => {}
                Err(e) => {
                    tracing::debug!(dc = %self.config.dc, reservation = %id, error = %e, "reading a record the event log named failed; its waiters look again on their own timers");
                }
            }
        }
        Ok(followed.more)
    }

    /// Compare-and-set of our record `next` over version `expected`
    /// (`None`: a create) — under `guard`, its session row's, when it joins
    /// or freezes in a session — then `Node::wrote` if it landed; `event`:
    /// the write appends a lifecycle event. A session row that moved is a
    /// conflict: the caller reads both again.
    pub async fn write(
        &self,
        expected: Option<u64>,
        event: bool,
        next: &DcRecord,
        guard: Option<&SessionGuard>,
    ) -> Result<Written, StoreError> {
        dc_lease::publish_marks_for(&self.dc_lease, self.records.as_ref(), next).await?;
        let landed = match guard {
            None => self
                .timed("dc_cas", self.records.compare_and_set(expected, next))
                .await?
                .landed(),
            Some(guard) => {
                let cas = self
                    .records
                    .compare_and_set_in_session(expected, next, guard);
                self.timed("dc_cas", cas).await? == GuardedCas::Written
            }
        };
        if !landed {
            return Ok(Written::Conflict);
        }
        self.wrote(event, next);
        Ok(Written::Yes)
    }

    /// Performs one of homing-node's DC-store operations, timed under the
    /// store operation's metric name; a landed write goes through
    /// [`Node::write`] (marks published first, waiters and watchers told).
    pub async fn perform(&self, op: StoreOp) -> Result<Stored, StoreError> {
        let records = self.records.as_ref();
        Ok(match op {
            StoreOp::Read(id) => Stored::Record(self.timed("dc_get", records.read(&id)).await?),
            StoreOp::Allocate => {
                Stored::Allocated(self.timed("dc_allocate", records.allocate()).await?)
            }
            StoreOp::Write {
                expected,
                record,
                event,
                guard,
            } => Stored::Written(
                self.write(expected, event, &record, guard.as_deref())
                    .await?,
            ),
            StoreOp::WriteEach(writes) => {
                // All at once: the store's group commit takes them together.
                let each = writes.iter().map(|w| async move {
                    let written = self.write(Some(w.expected), w.event, &w.record, None);
                    written.await.map_err(|e| self.store_failure(e))
                });
                Stored::WrittenEach(futures_util::future::join_all(each).await)
            }
            StoreOp::Session(id) => {
                Stored::Session(self.timed("dc_session", records.session(&id)).await?)
            }
            StoreOp::WriteSession { expected, row } => {
                let cas = records.compare_and_set_session(expected, &row);
                Stored::Written(match self.timed("dc_session_cas", cas).await? {
                    SessionCas::Written => Written::Yes,
                    SessionCas::Conflict { .. } => Written::Conflict,
                })
            }
            StoreOp::SessionNotices { id, after, limit } => {
                let page = records.session_notices(&id, after, limit);
                Stored::Page(self.timed("dc_session_notices", page).await?)
            }
            StoreOp::SessionKeys { id, after, limit } => {
                let page = records.session_keys(&id, after.as_ref(), limit);
                Stored::Page(self.timed("dc_session_keys", page).await?)
            }
            StoreOp::DueSessions {
                until,
                after,
                limit,
            } => {
                let after = after.map(|(at, id)| homing_store::SessionCursor { at, id });
                let page = records.due_sessions(until, after.as_ref(), limit);
                Stored::Sessions(self.timed("dc_due_sessions", page).await?)
            }
            StoreOp::DeleteSession { id, version } => {
                let deleted = records.delete_session(&id, version);
                Stored::Deleted(self.timed("dc_delete_session", deleted).await?)
            }
            StoreOp::Due {
                kind,
                until,
                after,
                limit,
            } => {
                let due = records.due(kind, until, after.as_ref(), limit);
                Stored::Due(self.timed("dc_due", due).await?)
            }
            StoreOp::Settle { id, version } => Stored::Settled(
                self.timed("dc_settle", records.settle(&id, version))
                    .await?,
            ),
            StoreOp::Events { after, limit } => {
                let page = self
                    .timed("dc_events", records.events(after, limit))
                    .await?;
                Stored::Events {
                    events: page.events,
                    oldest: page.oldest,
                    head: page.head,
                }
            }
            StoreOp::TrimEvents { before } => {
                self.timed("dc_trim_events", records.trim_events(before))
                    .await?;
                Stored::Trimmed
            }
            StoreOp::Scan {
                scope,
                name,
                after,
                limit,
            } => {
                let scan = records.scan(&scope, &name, after.as_ref(), limit);
                Stored::Page(self.timed("dc_scan", scan).await?)
            }
        })
    }

    /// A store error as homing-node's failure at this DC (unreachable store:
    /// the DC is unavailable; anything else: internal).
    pub fn store_failure(&self, e: StoreError) -> homing_node::Failure {
        RequestError::Store(e).classify(&self.config.dc)
    }

    pub(crate) async fn timed<T>(
        &self,
        op: &'static str,
        f: impl std::future::Future<Output = T>,
    ) -> T {
        let started = Instant::now();
        let out = f.await;
        self.metrics.store(op, started.elapsed());
        out
    }

    /// This DC's answer for its own reservation `id`: links inside the DC, then the tail.
    pub(super) async fn local_segment(&self, id: &ReservationId) -> Result<Segment, RequestError> {
        let mut segment =
            LocalSegment::new(self.config.dc.clone(), id.clone(), self.config.hop_limit);
        while let Some(at) = segment.need().cloned() {
            let read = self.timed("dc_get", self.records.read(&at)).await?;
            let (record, session) = match &read {
                Some(read) => (Some(&read.record), read.session()),
                None => (None, None),
            };
            segment
                .handle(record, store_now(), &self.config.policy, session)
                .map_err(homing_node::segment_failure)?;
        }
        Ok(segment.finish())
    }

    /// What `id`'s owner knows: ourselves for our own, else a peer round
    /// trip; a failure classified for homing-node.
    pub(super) async fn segment(
        &self,
        id: &ReservationId,
    ) -> Result<Segment, homing_node::Failure> {
        let segment = if id.dc() == &self.config.dc {
            self.local_segment(id).await
        } else {
            self.peers
                .resolve_reservation(id)
                .await
                .map_err(RequestError::from)
        };
        segment.map_err(|f| f.classify(&self.config.dc))
    }
}
