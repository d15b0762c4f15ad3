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

use crate::event::{Event, NodeId};
use crate::sim::Sim;
use crate::trace::NO_KEY;

/// A router's scan of its region's DC.
#[derive(Debug, Default)]
pub struct Scanner {
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

impl Sim {
    /// Router `r`'s scanner begins a scan, or asks for its next page.
    pub(crate) fn router_scan(&mut self, r: usize) {
        let dc = self.routers[r].region;
        let Some(scanner) = &self.routers[r].scanner else {
            return;
        };
        if scanner.after.is_none() {
            let expected = self.dcs[usize::from(dc)]
                .store
                .records()
                .map(|r| r.id.clone())
                .collect();
            let scanner = self.routers[r].scanner.as_mut().expect("checked above");
            scanner.expected = expected;
            scanner.seen.clear();
            scanner.last = None;
            self.measurements.count(Counter::ScanStarted);
        }
        let after = self.routers[r]
            .scanner
            .as_ref()
            .and_then(|s| s.after.clone());
        let request = Request::Scan {
            scope: NamespaceScope::everything(),
            after,
        };
        let rpc = self
            .world
            .request(NodeId::Router(r as u32), NodeId::Dc(dc), NO_KEY, request);
        if let Some(scanner) = &mut self.routers[r].scanner {
            scanner.rpc = Some(rpc);
        }
    }

    /// Whether `rpc` is router `r`'s scan page.
    pub(crate) fn is_router_scan(&self, r: usize, rpc: u64) -> bool {
        self.routers[r]
            .scanner
            .as_ref()
            .is_some_and(|s| s.rpc == Some(rpc))
    }

    /// Router `r`'s scan page was answered (`None`: it timed out).
    pub(crate) fn router_scanned(&mut self, r: usize, reply: Option<Reply>) {
        let dc = self.routers[r].region;
        let Some(scanner) = &mut self.routers[r].scanner else {
            return;
        };
        scanner.rpc = None;
        let Some(Reply::Records { records, next }) = reply else {
            self.measurements.count(Counter::ScanFailed);
            scanner.after = None;
            return self.scan_again_later(r);
        };
        let mut broken = None;
        for record in &records {
            let at = record_scan_bytes(&record.key, &record.id);
            if scanner.last.as_ref().is_some_and(|last| *last >= at) {
                broken = Some(format!("{} out of (key, id) order", record.id));
            }
            if !scanner.seen.insert(record.id.clone()) {
                broken = Some(format!("{} returned twice", record.id));
            }
            scanner.last = Some(at);
        }
        scanner.after = next;
        if scanner.after.is_some() {
            if let Some(detail) = broken {
                self.checker
                    .on_scan_broken(format!("router #{r} scanning dc #{dc}: {detail}"));
            }
            return self.router_scan(r);
        }
        let missed = scanner.expected.difference(&scanner.seen).next().cloned();
        if let Some(id) = missed {
            broken = Some(format!(
                "{id}, there when the scan began, was never returned"
            ));
        }
        if let Some(detail) = broken {
            self.checker
                .on_scan_broken(format!("router #{r} scanning dc #{dc}: {detail}"));
        }
        self.measurements.count(Counter::ScanCompleted);
        self.router_inspect(r);
        self.scan_again_later(r);
    }

    /// Router `r` inspects the key of a record its scan saw.
    fn router_inspect(&mut self, r: usize) {
        let dc = self.routers[r].region;
        let Some(scanner) = &self.routers[r].scanner else {
            return;
        };
        let seen = scanner.seen.len() as u64;
        if seen == 0 || scanner.inspecting.is_some() {
            return;
        }
        let pick = self.world.rng.below(seen) as usize;
        let Some(id) = scanner.seen.iter().nth(pick).cloned() else {
            return;
        };
        let store = &self.dcs[usize::from(dc)].store;
        let Some(key) = store.record(&id).map(|record| record.key.clone()) else {
            return;
        };
        let expected = store
            .records()
            .filter(|record| record.key == key)
            .map(|record| record.id.clone())
            .collect();
        let request = Request::Inspect { key: key.clone() };
        let rpc = self
            .world
            .request(NodeId::Router(r as u32), NodeId::Dc(dc), NO_KEY, request);
        self.measurements.count(Counter::InspectSent);
        if let Some(scanner) = &mut self.routers[r].scanner {
            scanner.inspecting = Some((rpc, key, expected));
        }
    }

    /// Whether `rpc` is router `r`'s inspect.
    pub(crate) fn is_router_inspect(&self, r: usize, rpc: u64) -> bool {
        let scanner = self.routers[r].scanner.as_ref();
        scanner.is_some_and(|s| s.inspecting.as_ref().is_some_and(|i| i.0 == rpc))
    }

    /// Router `r`'s inspect was answered (`None`: it timed out).
    pub(crate) fn router_inspected(&mut self, r: usize, reply: Option<Reply>) {
        let dc = self.routers[r].region;
        let Some(scanner) = &mut self.routers[r].scanner else {
            return;
        };
        let Some((_, key, expected)) = scanner.inspecting.take() else {
            return;
        };
        let Some(Reply::Inspected { records }) = reply else {
            self.measurements.count(Counter::InspectFailed);
            return;
        };
        self.measurements.count(Counter::InspectAnswered);
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
            self.checker.on_inspect_broken(format!(
                "router #{r} inspecting {key} at dc #{dc}: {detail}"
            ));
        }
    }

    fn scan_again_later(&mut self, r: usize) {
        let interval_ms = self.scenario.workload.scan_interval_ms;
        let at = self.world.now + interval_ms * 1000;
        self.world
            .schedule(at, Event::RouterScan { router: r as u32 });
    }
}
