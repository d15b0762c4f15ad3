//! An operator's `Scan` and `DrainScope` page through a DC's records in
//! `(key, id)` order: how many records a page carries and where the next
//! page starts, decided once for homingd and the simulator; and a
//! `DrainScope` page's steps ([`DrainScope`]).

use std::collections::VecDeque;

use homing_core::{DcRecord, ErrorReply, ReservationId, ScanCursor};

use crate::Failure;

/// Records per `Scan` page (and per `Inspect` answer): a record encodes to
/// at most about 1 KiB, so this keeps the reply inside one 64 KiB frame.
pub const SCAN_PAGE_RECORDS: usize = 48;

/// Where the page after `records` (read with `limit`) starts: after its
/// last record if the page is full, `None` when it was the last.
pub fn next_cursor(records: &[DcRecord], limit: usize) -> Option<ScanCursor> {
    if records.len() == limit {
        records.last().map(ScanCursor::after)
    } else {
        None
    }
}

/// What an operator's `DrainScope` page needs next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DrainScopePoll {
    /// Read one page of the scope's records after `after`, at most `limit`;
    /// answer with [`DrainScope::handle_page`].
    Scan {
        /// Where the page starts.
        after: Option<ScanCursor>,
        /// Its size.
        limit: usize,
    },
    /// Drain this live lease (an [`crate::Update`] with
    /// [`crate::Change::Drain`]); answer with [`DrainScope::handle_drained`].
    Drain(ReservationId),
    /// The page is done: leases drained now, and where the next page starts
    /// (`None`: this was the last) — or why it stopped.
    Done(Result<(u32, Option<ScanCursor>), ErrorReply>),
}

/// One page of an operator's `DrainScope { scope, after }`: read a page of
/// the scope's records, drain each live lease on it in turn (a record no
/// longer drainable when its turn comes is skipped by the update), count
/// those that changed. A failed drain stops the page with its error (the
/// operator retries the page: draining is idempotent).
#[derive(Debug)]
pub struct DrainScope {
    limit: usize,
    next: Option<ScanCursor>,
    todo: VecDeque<ReservationId>,
    drained: u32,
    poll: DrainScopePoll,
}

impl DrainScope {
    /// A page after `after` of at most `limit` records.
    pub fn new(after: Option<ScanCursor>, limit: usize) -> DrainScope {
        DrainScope {
            limit,
            next: None,
            todo: VecDeque::new(),
            drained: 0,
            poll: DrainScopePoll::Scan { after, limit },
        }
    }

    /// What to do next.
    pub fn poll(&self) -> &DrainScopePoll {
        &self.poll
    }

    /// The page was read: its live leases are drained next.
    pub fn handle_page(&mut self, records: &[DcRecord]) {
        self.next = next_cursor(records, self.limit);
        let live = records.iter().filter(|r| r.drain().is_some());
        self.todo = live.map(|r| r.id.clone()).collect();
        self.advance();
    }

    /// The drain asked for ended: `Ok(true)` if it changed the record.
    pub fn handle_drained(&mut self, drained: Result<bool, Failure>) {
        match drained {
            Ok(made) => {
                self.drained += u32::from(made);
                self.advance();
            }
            Err(failure) => self.poll = DrainScopePoll::Done(Err(failure.into_reply())),
        }
    }

    fn advance(&mut self) {
        self.poll = match self.todo.pop_front() {
            Some(id) => DrainScopePoll::Drain(id),
            None => DrainScopePoll::Done(Ok((self.drained, self.next.take()))),
        };
    }
}

#[cfg(test)]
mod tests {
    use homing_core::{ErrorKind, StoreTime};

    use super::*;
    use crate::fixture::held;

    #[test]
    fn a_drain_scope_page_drains_each_live_lease_and_points_at_the_next_page() {
        let live = held("iad.1", "a", None, StoreTime::from_ms(0));
        let drained = live.drain().unwrap();
        let other = held("iad.2", "b", None, StoreTime::from_ms(0));
        let mut page = DrainScope::new(None, 3);
        assert_eq!(
            page.poll(),
            &DrainScopePoll::Scan {
                after: None,
                limit: 3
            }
        );
        page.handle_page(&[live.clone(), drained, other.clone()]);
        // The already drained record is not asked about.
        assert_eq!(page.poll(), &DrainScopePoll::Drain(live.id.clone()));
        page.handle_drained(Ok(true));
        assert_eq!(page.poll(), &DrainScopePoll::Drain(other.id.clone()));
        page.handle_drained(Ok(false)); // drained meanwhile by another
        let next = Some(ScanCursor::after(&other));
        assert_eq!(page.poll(), &DrainScopePoll::Done(Ok((1, next))));
    }

    #[test]
    fn a_short_page_is_the_last_and_a_failed_drain_stops_the_page() {
        let live = held("iad.1", "a", None, StoreTime::from_ms(0));
        let mut last = DrainScope::new(None, 3);
        last.handle_page(&[]);
        assert_eq!(last.poll(), &DrainScopePoll::Done(Ok((0, None))));
        let mut failing = DrainScope::new(None, 3);
        failing.handle_page(std::slice::from_ref(&live));
        let e = ErrorReply::new(ErrorKind::Internal, "store: broken");
        failing.handle_drained(Err(Failure::Refused(e)));
        assert!(
            matches!(failing.poll(), DrainScopePoll::Done(Err(e)) if e.kind == ErrorKind::Internal)
        );
    }
}
