//! An operator's `Scan` and `DrainScope` page through a DC's records in
//! `(key, id)` order: how many records a page carries and where the next
//! page starts, decided once for homingd and the simulator; a
//! `DrainScope` page's steps ([`DrainScope`]); and the read of one key's
//! records that `Inspect` and `Cancel` make ([`KeyRecords`]).

use std::collections::VecDeque;

use homing_core::{
    DcId, DcRecord, ErrorReply, Key, LeaseKey, LeasePolicy, NamespaceScope, ReservationId,
    ScanCursor, StoreTime,
};

use crate::Failure;
use crate::request::change::Change;
use crate::request::update::Update;
use crate::step::effect::{StoreOp, Stored, unasked};
use crate::step::event::NodeEvent;
use crate::step::time::NodeTime;
use crate::step::{Answer, Effect, Now, Step, Stepper};
use homing_core::mutation::Mutations;

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

/// One page of an operator's `DrainScope { scope, after }`: read a page of
/// the scope's records, drain each live lease on it in turn (an
/// [`Update`] with [`Change::Drain`]: a record no longer drainable when
/// its turn comes is left as it is), count those that changed. A failed
/// read or drain stops the page with its error (the operator retries the
/// page: draining is idempotent).
#[derive(Debug)]
pub struct DrainScope {
    dc: DcId,
    policy: LeasePolicy,
    mutations: Mutations,
    limit: usize,
    next: Option<ScanCursor>,
    todo: VecDeque<ReservationId>,
    /// The drain of one lease of the page, while it runs.
    update: Option<Box<Update>>,
    drained: u32,
    /// Leases drained since the last [`DrainScope::poll_drained`].
    drained_ids: VecDeque<ReservationId>,
    /// The page's read while it is to be made; then `None`.
    read: Option<StoreOp>,
    done: Option<Result<(u32, Option<ScanCursor>), ErrorReply>>,
}

impl DrainScope {
    /// A page of `scope`'s records at DC `dc` after `after`, at most `limit`,
    /// each drained under the DC's lease `policy`.
    pub fn new(
        dc: DcId,
        scope: NamespaceScope,
        after: Option<ScanCursor>,
        limit: usize,
        policy: LeasePolicy,
        mutations: Mutations,
    ) -> DrainScope {
        DrainScope {
            dc,
            policy,
            mutations,
            limit,
            next: None,
            todo: VecDeque::new(),
            update: None,
            drained: 0,
            drained_ids: VecDeque::new(),
            read: Some(StoreOp::scan_scope(scope, after, limit)),
            done: None,
        }
    }

    /// What to do next: the page's read or a lease's update, or the page
    /// done — leases drained now, and where the next page starts (`None`:
    /// this was the last) — or why it stopped.
    fn next(&mut self) -> Step<<DrainScope as Stepper>::Output> {
        loop {
            if let Some(done) = &self.done {
                return Step::Done(done.clone());
            }
            if let Some(read) = &self.read {
                return Step::Ask(Effect::Store(read.clone()));
            }
            let Some(update) = &mut self.update else {
                self.advance();
                continue;
            };
            match update.next() {
                Step::Ask(effect) => return Step::Ask(effect),
                Step::Done(Ok(changed)) => {
                    if changed.made() {
                        self.drained += 1;
                        self.drained_ids.push_back(update.id().clone());
                    }
                    self.update = None;
                }
                Step::Done(Err(e)) => self.done = Some(Err(e.reply())),
            }
        }
    }

    /// A lease this page drained, once each, oldest first (its
    /// [`NodeEvent::Drained`]).
    fn poll_drained(&mut self) -> Option<ReservationId> {
        self.drained_ids.pop_front()
    }

    /// The answer to the [`StoreOp`] asked at `now` (store clock), or why
    /// it failed (the page stops with it).
    pub fn handle_stored(&mut self, stored: Result<Stored, Failure>, now: StoreTime) {
        let stored = match stored {
            Ok(stored) => stored,
            Err(failure) => {
                self.done = Some(Err(failure.into_reply()));
                return;
            }
        };
        if self.read.take().is_some() {
            let Stored::Page(records) = stored else {
                unasked("drain scope", &stored)
            };
            self.next = next_cursor(&records, self.limit);
            let live = records.iter().filter(|r| r.drain(None).is_some());
            self.todo = live.map(|r| r.id.clone()).collect();
            return;
        }
        let Some(update) = &mut self.update else {
            unasked("drain scope", &stored)
        };
        update.handle_stored(stored, now);
    }

    /// Starts draining the next live lease, or ends the page.
    fn advance(&mut self) {
        match self.todo.pop_front() {
            Some(id) => {
                let (dc, policy) = (self.dc.clone(), self.policy);
                let update = Update::new(dc, id, Change::Drain, policy, self.mutations);
                self.update = Some(Box::new(update));
            }
            None => self.done = Some(Ok((self.drained, self.next.take()))),
        }
    }
}

/// When a [`KeyRecords`] read stops.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Until {
    /// At most this many records (`Inspect`).
    Count(usize),
    /// At the record held under this lease (`Cancel`'s grant), or the end.
    HeldUnder(LeaseKey),
}

/// This DC's records of one key, in `(key, id)` order, read page by page
/// through the store's index, where the key's name is a prefix of longer
/// names: its own records come first, and the read stops at the first
/// record of another key. `Inspect` reads up to [`SCAN_PAGE_RECORDS`];
/// `Cancel` reads until the grant made under its lease; neither reads past
/// the key's own records.
#[derive(Debug)]
pub struct KeyRecords {
    key: Key,
    page: usize,
    until: Until,
    records: Vec<DcRecord>,
    /// The next page's read ([`StoreOp::Scan`] of the key's namespace from
    /// its name, a prefix in the store's index), until the read is done.
    scan: Option<StoreOp>,
    /// Why the read stopped short, if a page could not be read.
    failed: Option<ErrorReply>,
}

impl KeyRecords {
    /// `Inspect { key }`'s read, in store pages of `page` records.
    pub fn inspect(key: Key, page: usize) -> KeyRecords {
        KeyRecords::new(key, page, Until::Count(SCAN_PAGE_RECORDS))
    }

    /// `Cancel { key, lease }`'s read: until the record held under `lease`.
    pub fn held_under(key: Key, lease: LeaseKey, page: usize) -> KeyRecords {
        KeyRecords::new(key, page, Until::HeldUnder(lease))
    }

    fn new(key: Key, page: usize, until: Until) -> KeyRecords {
        let scan = Some(StoreOp::Scan {
            scope: NamespaceScope::exact(key.namespace.clone()),
            name: key.name.as_str().to_string(),
            after: None,
            limit: page,
        });
        KeyRecords {
            key,
            page,
            until,
            records: Vec::new(),
            scan,
            failed: None,
        }
    }

    /// The next page's read, unless the read is done.
    #[cfg(test)]
    fn scanning(&self) -> Option<&StoreOp> {
        self.scan.as_ref()
    }

    /// The answer to the [`StoreOp`] asked: a page read.
    pub fn handle_stored(&mut self, stored: Stored) {
        match stored {
            Stored::Page(records) => self.handle_page(records),
            other => unasked("key records", &other),
        }
    }

    /// A page was read.
    fn handle_page(&mut self, page: Vec<DcRecord>) {
        let next = next_cursor(&page, self.page);
        // The key's records come first in its name's range and together
        // (the index ends a name with 0x00, below any longer name's next
        // byte): another key's record ends them.
        let past = page.iter().any(|r| r.key != self.key);
        let own = page.into_iter().take_while(|r| r.key == self.key);
        let found = match self.until {
            Until::Count(limit) => {
                self.records.extend(own);
                self.records.truncate(limit);
                self.records.len() == limit
            }
            Until::HeldUnder(lease) => {
                self.records = own.filter(|r| r.held_under(&lease)).take(1).collect();
                !self.records.is_empty()
            }
        };
        let done = found || past;
        self.scan = match (self.scan.take(), next) {
            (
                Some(StoreOp::Scan {
                    scope, name, limit, ..
                }),
                Some(next),
            ) if !done => Some(StoreOp::Scan {
                scope,
                name,
                after: Some(next),
                limit,
            }),
            _ => None,
        };
    }

    /// The records read so far: up to the limit, or the one held under the lease.
    #[cfg(test)]
    fn records(&self) -> &[DcRecord] {
        &self.records
    }
}

impl Stepper for DrainScope {
    type Output = Result<(u32, Option<ScanCursor>), ErrorReply>;

    fn step(&mut self, _now: NodeTime) -> Step<Self::Output> {
        self.next()
    }

    fn answer(&mut self, answer: Answer, now: Now) {
        match answer {
            Answer::Stored(stored) => self.handle_stored(stored, now.store),
            other => unasked("drain scope", &other),
        }
    }

    fn poll_event(&mut self) -> Option<NodeEvent> {
        self.poll_drained().map(NodeEvent::Drained)
    }
}

impl Stepper for KeyRecords {
    type Output = Result<Vec<DcRecord>, ErrorReply>;

    fn step(&mut self, _now: NodeTime) -> Step<Self::Output> {
        if let Some(failed) = self.failed.take() {
            return Step::Done(Err(failed));
        }
        match &self.scan {
            Some(op) => Step::Ask(Effect::Store(op.clone())),
            None => Step::Done(Ok(std::mem::take(&mut self.records))),
        }
    }

    fn answer(&mut self, answer: Answer, _now: Now) {
        match answer {
            Answer::Stored(Ok(stored)) => self.handle_stored(stored),
            Answer::Stored(Err(failure)) => self.failed = Some(failure.into_reply()),
            other => unasked("key records", &other),
        }
    }
}

#[cfg(test)]
mod tests {
    use homing_core::{ErrorKind, Written};

    use super::*;
    use crate::fixture::held;

    const NOW: StoreTime = StoreTime::from_ms(1);
    const POLICY: LeasePolicy = LeasePolicy::DEFAULT;

    fn scope() -> NamespaceScope {
        NamespaceScope::exact(homing_core::Namespace::default())
    }

    /// A page of at most 3 records at `iad`.
    fn drain_scope() -> DrainScope {
        let dc = "iad".parse().unwrap();
        DrainScope::new(dc, scope(), None, 3, POLICY, Mutations::NONE)
    }

    #[test]
    fn a_drain_scope_page_drains_each_live_lease_and_points_at_the_next_page() {
        let live = held("iad.1", "a", None, StoreTime::from_ms(0));
        let drained = live.drain(None).unwrap();
        let other = held("iad.2", "b", None, StoreTime::from_ms(0));
        let mut page = drain_scope();
        assert_eq!(
            page.step(NodeTime::from_us(0)),
            Step::Ask(Effect::Store(StoreOp::scan_scope(scope(), None, 3)))
        );
        let records = vec![live.clone(), drained, other.clone()];
        page.handle_stored(Ok(Stored::Page(records)), NOW);
        // The already drained record is not asked about: the live one is
        // read and drained.
        assert_eq!(
            page.step(NodeTime::from_us(0)),
            Step::Ask(Effect::Store(StoreOp::Read(live.id.clone())))
        );
        page.handle_stored(
            Ok(Stored::Record(Some(homing_core::RecordRead::alone(
                live.clone(),
            )))),
            NOW,
        );
        let Step::Ask(Effect::Store(StoreOp::Write { record, .. })) =
            page.step(NodeTime::from_us(0))
        else {
            panic!("a live lease is drained with a write")
        };
        assert_eq!(record.drain(None), None, "the write drains it");
        page.handle_stored(Ok(Stored::Written(Written::Yes)), NOW);
        assert_eq!(
            page.step(NodeTime::from_us(0)),
            Step::Ask(Effect::Store(StoreOp::Read(other.id.clone())))
        );
        assert_eq!(page.poll_drained(), Some(live.id.clone()));
        assert_eq!(page.poll_drained(), None);
        // Drained meanwhile by another: nothing to write, not counted.
        let meanwhile = Some(other.drain(None).unwrap());
        page.handle_stored(
            Ok(Stored::Record(
                meanwhile.map(homing_core::RecordRead::alone),
            )),
            NOW,
        );
        let next = Some(ScanCursor::after(&other));
        assert_eq!(page.step(NodeTime::from_us(0)), Step::Done(Ok((1, next))));
        assert_eq!(page.poll_drained(), None);
    }

    #[test]
    fn a_drain_retries_a_conflict_and_a_failed_drain_or_scan_stops_the_page() {
        let live = held("iad.1", "a", None, StoreTime::from_ms(0));
        // A conflict: the lease is read and written again.
        let mut page = drain_scope();
        page.handle_stored(Ok(Stored::Page(vec![live.clone()])), NOW);
        for _ in 0..2 {
            assert_eq!(
                page.step(NodeTime::from_us(0)),
                Step::Ask(Effect::Store(StoreOp::Read(live.id.clone())))
            );
            page.handle_stored(
                Ok(Stored::Record(Some(homing_core::RecordRead::alone(
                    live.clone(),
                )))),
                NOW,
            );
            assert!(matches!(
                page.step(NodeTime::from_us(0)),
                Step::Ask(Effect::Store(StoreOp::Write { .. }))
            ));
            page.handle_stored(Ok(Stored::Written(Written::Conflict)), NOW);
        }
        assert_eq!(
            page.step(NodeTime::from_us(0)),
            Step::Ask(Effect::Store(StoreOp::Read(live.id.clone())))
        );
        // Gone by then: the update's refusal stops the page.
        page.handle_stored(Ok(Stored::Record(None)), NOW);
        let Step::Done(Err(e)) = page.step(NodeTime::from_us(0)) else {
            panic!("a failed drain stops the page")
        };
        assert_eq!(e.kind, ErrorKind::UnknownReservation);
        assert_eq!(page.poll_drained(), None);
        // A failed scan stops it before any drain.
        let mut unread = drain_scope();
        let e = ErrorReply::new(
            ErrorKind::Unavailable {
                dc: "iad".parse().unwrap(),
            },
            "store down",
        );
        unread.handle_stored(Err(Failure::Unreachable(e)), NOW);
        assert!(matches!(
            unread.step(NodeTime::from_us(0)),
            Step::Done(Err(e)) if matches!(e.kind, ErrorKind::Unavailable { .. })
        ));
    }

    #[test]
    fn a_short_page_is_the_last_and_a_failed_read_stops_the_page() {
        let live = held("iad.1", "a", None, StoreTime::from_ms(0));
        let mut last = drain_scope();
        last.handle_stored(Ok(Stored::Page(vec![])), NOW);
        assert_eq!(last.step(NodeTime::from_us(0)), Step::Done(Ok((0, None))));
        let mut failing = drain_scope();
        let page = Stored::Page(vec![live.clone()]);
        failing.handle_stored(Ok(page), NOW);
        assert_eq!(
            failing.step(NodeTime::from_us(0)),
            Step::Ask(Effect::Store(StoreOp::Read(live.id)))
        );
        let e = ErrorReply::new(ErrorKind::Internal, "store: broken");
        failing.handle_stored(Err(Failure::Refused(e)), NOW);
        assert!(
            matches!(failing.step(NodeTime::from_us(0)), Step::Done(Err(e)) if e.kind == ErrorKind::Internal)
        );
    }

    fn named(id: &str, name: &str) -> DcRecord {
        let mut record = held(id, "a", None, StoreTime::from_ms(0));
        record.key = Key::new(homing_core::KeyName::new(name).unwrap());
        record
    }

    #[test]
    fn inspect_reads_the_keys_own_records_page_by_page_and_stops_at_another_key() {
        let mut read = KeyRecords::inspect(named("iad.1", "a").key, 2);
        let first = match read.scanning() {
            Some(StoreOp::Scan {
                name, after, limit, ..
            }) => (name.clone(), after.clone(), *limit),
            other => panic!("reads first, not {other:?}"),
        };
        assert_eq!(first, ("a".to_string(), None, 2));
        // A full page of the key's own goes on after its last record.
        let page = vec![named("iad.1", "a"), named("iad.3", "a")];
        let after = Some(ScanCursor::after(&page[1]));
        read.handle_page(page);
        assert!(matches!(read.scanning(), Some(StoreOp::Scan { after: a, .. }) if *a == after));
        // "ab" sorts after every record of "a": the read ends there, even
        // on a full page.
        read.handle_page(vec![named("iad.4", "a"), named("iad.2", "ab")]);
        assert_eq!(read.scanning(), None);
        let ids: Vec<String> = read.records().iter().map(|r| r.id.to_string()).collect();
        assert_eq!(ids, ["iad.1", "iad.3", "iad.4"]);
    }

    #[test]
    fn inspect_stops_at_a_page_of_records() {
        let key = named("iad.1", "a").key;
        let full: Vec<DcRecord> = (1..=SCAN_PAGE_RECORDS as u64 + 10)
            .map(|i| named(&format!("iad.{i}"), "a"))
            .collect();
        // More than a page read at once: a page kept.
        let mut read = KeyRecords::inspect(key.clone(), full.len());
        read.handle_page(full.clone());
        assert_eq!(read.scanning(), None);
        assert_eq!(read.records().len(), SCAN_PAGE_RECORDS);
        // Exactly a page on a full store page: no further read.
        let mut exact = KeyRecords::inspect(key, SCAN_PAGE_RECORDS);
        exact.handle_page(full[..SCAN_PAGE_RECORDS].to_vec());
        assert_eq!(exact.scanning(), None);
        assert_eq!(exact.records().to_vec(), full[..SCAN_PAGE_RECORDS].to_vec());
    }

    #[test]
    fn a_cancels_read_stops_at_the_grant_held_under_its_lease() {
        let (first, second) = (named("iad.1", "a"), named("iad.2", "a"));
        let lease = homing_core::LeaseKey::from_bytes([1; 16]).unwrap();
        assert!(first.held_under(&lease));
        // Found on a full page: no further page is read.
        let mut read = KeyRecords::held_under(first.key.clone(), lease, 2);
        read.handle_page(vec![first.clone(), second.clone()]);
        assert_eq!(read.scanning(), None);
        assert_eq!(read.records().to_vec(), vec![first.clone()]);
        // Not found: on to the end, keeping nothing.
        let other = homing_core::LeaseKey::from_bytes([2; 16]).unwrap();
        let mut none = KeyRecords::held_under(first.key.clone(), other, 2);
        none.handle_page(vec![first, second]);
        assert!(matches!(
            none.scanning(),
            Some(StoreOp::Scan { after: Some(_), .. })
        ));
        none.handle_page(vec![]);
        assert_eq!(none.scanning(), None);
        assert!(none.records().is_empty());
    }

    #[test]
    fn a_cancels_read_finds_the_grant_on_a_later_page_and_ends_at_another_key() {
        let (first, second) = (named("iad.1", "a"), named("iad.2", "a"));
        let lease = homing_core::LeaseKey::from_bytes([1; 16]).unwrap();
        let mut unheld = first.clone();
        unheld.state = homing_core::RecordState::Abandoned;
        assert!(!unheld.held_under(&lease));
        let mut read = KeyRecords::held_under(first.key.clone(), lease, 2);
        read.handle_page(vec![unheld.clone(), unheld.clone()]);
        assert!(matches!(
            read.scanning(),
            Some(StoreOp::Scan { after: Some(_), .. })
        ));
        read.handle_page(vec![second.clone()]);
        assert_eq!(read.records(), std::slice::from_ref(&second));
        // Another key's record after the key's own ends a read that found nothing.
        let mut none = KeyRecords::held_under(first.key.clone(), lease, 2);
        none.handle_page(vec![unheld, named("iad.9", "ab")]);
        assert_eq!(none.scanning(), None);
        assert!(none.records().is_empty());
    }
}
