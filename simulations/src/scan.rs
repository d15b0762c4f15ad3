//! Operator scans, both ends. A DC answers `Scan { scope, after }` as
//! homingd does: one page of its store's records in `(key, id)` order
//! (homing-store's memory backend), [`SCAN_PAGE_RECORDS`] at most,
//! redacted, with the cursor homing-node's `scan::next_cursor` gives.
//!
//! The region's first router also scans its DC's records from start to
//! end every `workload.scan_interval_ms` (0: never), as `homing scan` does
//! page after page; a failed or timed-out page abandons that scan.
//! `scan_complete` checks each one: records come in `(key, id)` order,
//! none twice, and every record the DC had when the scan began is returned
//! (records are never deleted, only abandoned). After each scan it
//! inspects the key of one record it saw (`Inspect { key }`, answered as
//! homing-node's `Serve` reads a key's records); `inspect_exact` checks the answer: that key's
//! records only, in id order, every one the DC had when it was asked (up
//! to [`SCAN_PAGE_RECORDS`]).

use crate::counter::Counter;
use std::collections::BTreeSet;

use homing_core::{Key, NamespaceScope, Reply, Request, ReservationId, ScanCursor};
use homing_node::SCAN_PAGE_RECORDS;
use homing_store::keyspace::record_scan_bytes;

use homing_store::memory::MemoryDc;

use crate::event::{Event, Homingd, NodeId};
use crate::observe::Observer;
use crate::trace::NO_KEY;
use crate::world::World;

/// A router's scan of its region's DC.
#[derive(Debug)]
pub struct Scanner {
    /// The router scanning.
    router: u32,
    /// Its region: the DC scanned.
    dc: u16,
    /// The page request in flight.
    rpc: Option<u64>,
    /// Where the next page starts.
    after: Option<ScanCursor>,
    /// The DC's records when this scan began: each must be returned.
    expected: BTreeSet<ReservationId>,
    /// The records returned so far.
    seen: BTreeSet<ReservationId>,
    /// The scan order position of the last record returned.
    last: Option<Vec<u8>>,
    /// The `Inspect` in flight: its RPC, its key, the DC's records of the
    /// key when it was asked.
    inspecting: Option<(u64, Key, BTreeSet<ReservationId>)>,
}

/// Which of a scanner's requests an RPC is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Asked {
    /// A scan page.
    Page,
    /// An `Inspect`.
    Inspect,
}

impl Scanner {
    /// Router `router`'s scans of its region's DC `dc`, none begun.
    pub fn new(router: u32, dc: u16) -> Scanner {
        Scanner {
            router,
            dc,
            rpc: None,
            after: None,
            expected: BTreeSet::new(),
            seen: BTreeSet::new(),
            last: None,
            inspecting: None,
        }
    }

    /// Begins a scan (`store`: the DC's records now, each of which it
    /// must return), or asks for its next page.
    pub(crate) fn ask(&mut self, store: &MemoryDc, world: &mut World, observer: &mut dyn Observer) {
        if self.after.is_none() {
            self.expected = store.records().map(|r| r.id.clone()).collect();
            self.seen.clear();
            self.last = None;
            observer.count(Counter::ScanStarted);
        }
        let request = Request::Scan {
            scope: NamespaceScope::everything(),
            after: self.after.clone(),
        };
        let (from, to) = (
            NodeId::Router(self.router),
            NodeId::Dc(Homingd::new(self.dc, 0)),
        );
        self.rpc = Some(world.request(from, to, NO_KEY, request));
    }

    /// Which of its requests `rpc` is, if it is one.
    pub(crate) fn asked(&self, rpc: u64) -> Option<Asked> {
        if self.rpc == Some(rpc) {
            return Some(Asked::Page);
        }
        let inspect = self.inspecting.as_ref().is_some_and(|i| i.0 == rpc);
        inspect.then_some(Asked::Inspect)
    }

    /// Its request `asked` was answered (`None`: it timed out); `store`
    /// is the DC's now; the next scan begins `interval_ms` after one ends.
    pub(crate) fn answered(
        &mut self,
        asked: Asked,
        reply: Option<Reply>,
        (store, interval_ms): (&MemoryDc, u64),
        world: &mut World,
        observer: &mut dyn Observer,
    ) {
        match asked {
            Asked::Page => self.scanned(reply, (store, interval_ms), world, observer),
            Asked::Inspect => self.inspected(reply, observer),
        }
    }

    /// A scan page was answered (`None`: it timed out).
    fn scanned(
        &mut self,
        reply: Option<Reply>,
        (store, interval_ms): (&MemoryDc, u64),
        world: &mut World,
        observer: &mut dyn Observer,
    ) {
        let (r, dc) = (self.router, self.dc);
        self.rpc = None;
        let Some(Reply::Records { records, next }) = reply else {
            observer.count(Counter::ScanFailed);
            self.after = None;
            return self.again_later(interval_ms, world);
        };
        let mut broken = None;
        for record in &records {
            let at = record_scan_bytes(&record.key, &record.id);
            if self.last.as_ref().is_some_and(|last| *last >= at) {
                broken = Some(format!("{} out of (key, id) order", record.id));
            }
            if !self.seen.insert(record.id.clone()) {
                broken = Some(format!("{} returned twice", record.id));
            }
            self.last = Some(at);
        }
        self.after = next;
        if self.after.is_some() {
            if let Some(detail) = broken {
                observer.on_scan_broken(format!("router #{r} scanning dc #{dc}: {detail}"));
            }
            return self.ask(store, world, observer);
        }
        let missed = self.expected.difference(&self.seen).next().cloned();
        if let Some(id) = missed {
            broken = Some(format!(
                "{id}, there when the scan began, was never returned"
            ));
        }
        if let Some(detail) = broken {
            observer.on_scan_broken(format!("router #{r} scanning dc #{dc}: {detail}"));
        }
        observer.count(Counter::ScanCompleted);
        self.inspect(store, world, observer);
        self.again_later(interval_ms, world);
    }

    /// Inspects the key of a record its scan saw.
    fn inspect(&mut self, store: &MemoryDc, world: &mut World, observer: &mut dyn Observer) {
        let seen = self.seen.len() as u64;
        if seen == 0 || self.inspecting.is_some() {
            return;
        }
        let pick = world.rng.below(seen) as usize;
        let Some(id) = self.seen.iter().nth(pick).cloned() else {
            return;
        };
        let Some(key) = store.record(&id).map(|record| record.key.clone()) else {
            return;
        };
        let expected = store
            .records()
            .filter(|record| record.key == key)
            .map(|record| record.id.clone())
            .collect();
        let request = Request::Inspect { key: key.clone() };
        let (from, to) = (
            NodeId::Router(self.router),
            NodeId::Dc(Homingd::new(self.dc, 0)),
        );
        let rpc = world.request(from, to, NO_KEY, request);
        observer.count(Counter::InspectSent);
        self.inspecting = Some((rpc, key, expected));
    }

    /// Its inspect was answered (`None`: it timed out).
    fn inspected(&mut self, reply: Option<Reply>, observer: &mut dyn Observer) {
        let (r, dc) = (self.router, self.dc);
        let Some((_, key, expected)) = self.inspecting.take() else {
            return;
        };
        let Some(Reply::Inspected { records }) = reply else {
            observer.count(Counter::InspectFailed);
            return;
        };
        observer.count(Counter::InspectAnswered);
        let ids: Vec<&ReservationId> = records.iter().map(|record| &record.id).collect();
        let broken = if let Some(other) = records.iter().find(|record| record.key != key) {
            Some(format!("{} of another key returned", other.id))
        } else if ids.windows(2).any(|w| w[0] >= w[1]) {
            Some(format!("records out of id order: {ids:?}"))
        } else if records.len() > SCAN_PAGE_RECORDS {
            Some(format!("{} records, more than a page", records.len()))
        } else {
            let page_full = records.len() == SCAN_PAGE_RECORDS;
            let missed = expected.iter().find(|id| !ids.contains(id));
            missed
                .filter(|_| !page_full)
                .map(|id| format!("{id}, there when asked, was not returned"))
        };
        if let Some(detail) = broken {
            observer.on_inspect_broken(format!(
                "router #{r} inspecting {key} at dc #{dc}: {detail}"
            ));
        }
    }

    fn again_later(&mut self, interval_ms: u64, world: &mut World) {
        let at = world.now + interval_ms * 1000;
        world.schedule(
            at,
            Event::RouterScan {
                router: self.router,
            },
        );
    }
}
