//! Edge routers. A router resolves keys with homing-core's `RouterWalk`,
//! the walk homing-client's `Resolver` drives: which answers to use (the
//! global entry and the furthest proven chain member, remembered forever; a
//! `NotFound` reused for the Resolver's default absent ttl), the global read
//! from the DCs nearest first, the extra segment a `Resolve` reply carries,
//! and a silent owner gone around through its succession asked of the other
//! DCs. This module keeps what the Resolver keeps itself: the I/O (which DC
//! is suspect, timeouts) and the storage. A live tail is cached for
//! `tail_ttl_ms` and a vacant one not at all (`TailView::answer`, the rule
//! the Resolver caches by). A timeout or an error reply makes the answer
//! `Unavailable`, never `NotFound`.
//!
//! Reachability as the Resolver keeps it (homing-core's `reachability`): a
//! DC whose request timed out is suspect, requests that need it are
//! answered at once as not answered instead of waiting for it again, and one
//! probe per suspect DC (a `ResolveReservation` of `<dc>.0`, on the probe
//! schedule) finds out when it answers; any answer clears the suspicion.
//!
//! Concurrent resolves of one key at one router share one walk, as the
//! Resolver's single-flight does: a resolve that finds a walk of its key in
//! flight asks nothing and gets that walk's outcome (an answer, the checker
//! having judged the walk's; or the walk's unavailability, counted in its
//! row). A cold resolve (a fresh router's) neither joins nor is joined, and
//! consults nothing remembered.

use crate::counter::Counter;
use std::collections::BTreeMap;

use std::time::{Duration, Instant};

use homing_core::chain::{HOP_LIMIT_DEFAULT, RESOLVER_ABSENT_TTL_MS_DEFAULT};
use homing_core::reachability::{AddrSlot, DcSlot, ProbeSchedule, ProbeStep, Reachability, Route};
use homing_core::{
    DcId, Learned, Mutations, Request, ReservationId, RouterMemory, RouterPoll, RouterWalk,
    Shortcut, Succession, TailView,
};

use crate::scan::Scanner;
use crate::trace::NO_KEY;
use crate::watch::Watcher;

use crate::event::{Body, Event, Message, NodeId};
use crate::report::Op;
use crate::sim::Sim;

#[derive(Debug, Clone)]
struct CachedTail {
    view: TailView,
    window_start_us: u64,
    expires_at_us: u64,
}

#[derive(Debug, Clone)]
struct Resolve {
    key: u32,
    /// Boxed: a walk is large, and resolves move between the in-flight
    /// map's nodes and the router's steps.
    walk: Box<RouterWalk>,
    started_us: u64,
    entry_cached: bool,
    /// Walk as a fresh router: consult no cache.
    cold: bool,
    remote: u32,
}

/// One edge router with its caches.
#[derive(Debug)]
pub struct Router {
    /// Its index.
    pub idx: u32,
    /// Its region (the index of its nearest DC).
    pub region: u16,
    /// The DCs it asks, nearest first (its region's first): the Resolver's
    /// DC table.
    table: Vec<DcId>,
    /// The simulator's index of each DC in `table`.
    order: Vec<u16>,
    remembered: Remembered,
    tails: BTreeMap<u32, CachedTail>,
    mutations: Mutations,
    /// Resolves waiting for an answer, by RPC, with the DC asked.
    inflight: BTreeMap<u64, (Resolve, u16)>,
    /// Keys with a (not cold) walk in flight, and when each resolve that
    /// joined it started (true µs).
    walking: BTreeMap<u32, Vec<u64>>,
    /// Which DCs it waits for (one address per DC).
    reach: Reachability,
    /// Probes in flight, by RPC: the DC and the suspicion's epoch.
    probes: BTreeMap<u64, (u16, u64)>,
    /// Its watch of its region's DC's event log, if it watches.
    pub(crate) watcher: Option<Watcher>,
    /// Its scans of its region's DC's records, if it scans.
    pub(crate) scanner: Option<Scanner>,
}

/// What a router remembers, as the Resolver's caches do (never evicted
/// here: a run is short).
#[derive(Debug, Default)]
struct Remembered {
    entries: BTreeMap<u32, ReservationId>,
    members: BTreeMap<u32, Shortcut>,
    /// Keys answered `NotFound`, and when.
    absent: BTreeMap<u32, Instant>,
    /// Successions learned from `Successor` answers (write-once).
    successions: BTreeMap<ReservationId, Succession>,
    /// Reservations a DC answered have no succession, and when.
    no_succession: BTreeMap<ReservationId, Instant>,
}

/// What a router remembers about one key, as a walk sees it; a cold
/// resolve sees nothing (but what it learns is kept).
struct KeyMemory<'a> {
    remembered: &'a mut Remembered,
    key: u32,
    cold: bool,
}

impl RouterMemory for KeyMemory<'_> {
    fn entry(&self) -> Option<ReservationId> {
        let known = self.remembered.entries.get(&self.key);
        known.filter(|_| !self.cold).cloned()
    }

    fn absent_since(&self) -> Option<Instant> {
        let known = self.remembered.absent.get(&self.key);
        known.filter(|_| !self.cold).copied()
    }

    fn member(&self) -> Option<Shortcut> {
        let known = self.remembered.members.get(&self.key);
        known.filter(|_| !self.cold).cloned()
    }

    fn succession(&self, at: &ReservationId) -> Option<Succession> {
        let known = self.remembered.successions.get(at);
        known.filter(|_| !self.cold).cloned()
    }

    fn no_succession_since(&self, at: &ReservationId) -> Option<Instant> {
        let known = self.remembered.no_succession.get(at);
        known.filter(|_| !self.cold).copied()
    }

    fn learn(&mut self, fact: Learned) {
        let remembered = &mut *self.remembered;
        match fact {
            Learned::Entry(id) => {
                remembered.entries.insert(self.key, id);
            }
            Learned::Absent(at) => {
                remembered.absent.insert(self.key, at);
            }
            Learned::Member(member) => {
                remembered.members.insert(self.key, member);
            }
            Learned::Succession(succession) => {
                let at = succession.link.from.clone();
                remembered.successions.insert(at, succession);
            }
            Learned::NoSuccession(at, since) => {
                remembered.no_succession.insert(at, since);
            }
        }
    }
}

impl Router {
    /// A router with empty caches in `region`, every DC of `dcs` reachable,
    /// asked nearest first by `rtt_ms` (the region's row); `seed` spreads
    /// its probes; its walks break `mutations` on purpose.
    pub fn new(
        idx: u32,
        region: u16,
        dcs: &[DcId],
        rtt_ms: &[f64],
        seed: u64,
        mutations: Mutations,
    ) -> Router {
        let slots: Vec<DcSlot> = (0..dcs.len()).map(DcSlot).collect();
        let mut order: Vec<u16> = (0..dcs.len() as u16).collect();
        order.sort_by(|a, b| {
            let near = |d: &u16| (*d != region, rtt_ms.get(usize::from(*d)).copied());
            near(a)
                .partial_cmp(&near(b))
                .unwrap_or(std::cmp::Ordering::Equal)
        });
        Router {
            idx,
            region,
            table: order.iter().map(|d| dcs[usize::from(*d)].clone()).collect(),
            order,
            remembered: Remembered::default(),
            tails: BTreeMap::new(),
            mutations,
            inflight: BTreeMap::new(),
            walking: BTreeMap::new(),
            reach: Reachability::new(ProbeSchedule::default(), &slots, seed),
            probes: BTreeMap::new(),
            watcher: None,
            scanner: None,
        }
    }

    /// Since when it holds `dc` suspect, if it does.
    pub fn suspects_since(&self, dc: u16) -> Option<std::time::Instant> {
        match self.reach.route(DcSlot(usize::from(dc))) {
            Route::Suspect { since } => Some(since),
            Route::Ask(_) => None,
        }
    }

    /// Whether it holds `dc` suspect now.
    pub fn suspects(&self, dc: u16) -> bool {
        self.suspects_since(dc).is_some()
    }
}

impl Sim {
    pub(crate) fn router_tick(&mut self, r: usize) {
        let mean = self.scenario.workload.resolve_interval_ms * 1000.0;
        let at = self.world.now + self.world.rng.exp(mean);
        self.world
            .schedule(at, Event::RouterTick { router: r as u32 });
        let n = self.keys.len() as u64;
        let key = if self.world.rng.chance(self.scenario.workload.hot_fraction) {
            self.world.rng.below((n / 10).max(1))
        } else {
            self.world.rng.below(n)
        } as u32;
        self.world.current_key = key;
        let cold = self.world.rng.chance(self.scenario.workload.cold_fraction);
        if let Some(cached) = self.routers[r].tails.get(&key)
            && cached.expires_at_us > self.world.now
            && !cold
        {
            let (view, start) = (cached.view.clone(), cached.window_start_us);
            self.measurements.record(Op::ResolveCached, 0, 0, 0);
            self.checker
                .on_resolve(key, start, self.world.now, Some(&view));
            return;
        }
        if !cold && let Some(joined) = self.routers[r].walking.get_mut(&key) {
            joined.push(self.world.now);
            return;
        }
        if !cold {
            self.routers[r].walking.insert(key, Vec::new());
        }
        let router = &mut self.routers[r];
        let memory = KeyMemory {
            remembered: &mut router.remembered,
            key,
            cold,
        };
        let entry_cached = memory.entry().is_some();
        let absent_ttl = Duration::from_millis(RESOLVER_ABSENT_TTL_MS_DEFAULT);
        let key_id = self.keys[key as usize].clone();
        let walk = RouterWalk::new(
            key_id,
            HOP_LIMIT_DEFAULT,
            absent_ttl,
            &memory,
            router.mutations,
        );
        let resolve = Resolve {
            key,
            walk: Box::new(walk),
            started_us: self.world.now,
            entry_cached,
            cold,
            remote: 0,
        };
        self.router_drive(r, resolve);
    }

    /// Drives `resolve`'s walk until it sends a request or ends.
    fn router_drive(&mut self, r: usize, mut resolve: Resolve) {
        let now = self.world.instant();
        let home = self.routers[r].region;
        loop {
            let router = &mut self.routers[r];
            let mut memory = KeyMemory {
                remembered: &mut router.remembered,
                key: resolve.key,
                cold: resolve.cold,
            };
            match resolve.walk.poll(&router.table, &mut memory, now) {
                RouterPoll::Ask { slot, request } => {
                    let dc = router.order[slot.0];
                    if router.suspects(dc) {
                        let reason = "suspect: not asked".to_string();
                        resolve.walk.handle_silence(&router.table, reason, true);
                        continue;
                    }
                    if dc != home {
                        resolve.remote += 1;
                    }
                    let from = NodeId::Router(r as u32);
                    let rpc = self
                        .world
                        .request(from, NodeId::Dc(dc), resolve.key, request);
                    self.routers[r].inflight.insert(rpc, (resolve, dc));
                    return;
                }
                RouterPoll::NotFound => {
                    if resolve.walk.absent_reused() {
                        self.measurements
                            .count(Counter::ResolveAbsentReusedAtRouter);
                    }
                    let latency = self.world.now - resolve.started_us;
                    self.measurements
                        .record(Op::ResolveNotFound, latency, resolve.remote, 0);
                    self.checker
                        .on_resolve(resolve.key, resolve.started_us, self.world.now, None);
                    return self.router_walk_ended(r, &resolve, Op::ResolveJoined);
                }
                RouterPoll::Found(walked) => return self.router_found(r, &resolve, walked),
                RouterPoll::Unavailable(unavailable) => {
                    let op = match unavailable.suspect {
                        true => Op::ResolveSuspect,
                        false => Op::ResolveUnavailable,
                    };
                    return self.router_unanswered(r, &resolve, op);
                }
                RouterPoll::Failed(e) => {
                    self.checker.on_resolve_error(resolve.key, e.to_string());
                    return self.router_walk_ended(r, &resolve, Op::ResolveJoined);
                }
            }
        }
    }

    /// `resolve`'s walk reached the tail: judged, measured, cached if live.
    fn router_found(&mut self, r: usize, resolve: &Resolve, walked: homing_core::Walked) {
        let home = self.routers[r].region;
        let latency = self.world.now - resolve.started_us;
        let (op, model) = if resolve.entry_cached {
            // Only the tail's state is fetched: one RTT unless it is local.
            let remote = self.dc_index.get(walked.tail.id.dc()) != Some(&home);
            (Op::ResolveRefresh, u32::from(remote))
        } else {
            let n = walked.links.len().min(255) as u8;
            (Op::ResolveCold(n), self.model_remote_rtts(home, &walked))
        };
        self.measurements.record(op, latency, resolve.remote, model);
        self.checker.on_resolve(
            resolve.key,
            resolve.started_us,
            self.world.now,
            Some(&walked.tail),
        );
        self.router_walk_ended(r, resolve, Op::ResolveJoined);
        if walked.tail.answer().is_none() {
            return; // a vacant tail is read again next time (the Resolver's rule)
        }
        let ttl = self.scenario.workload.tail_ttl_ms * 1000;
        self.routers[r].tails.insert(
            resolve.key,
            CachedTail {
                view: walked.tail,
                window_start_us: resolve.started_us,
                expires_at_us: self.world.now + ttl,
            },
        );
    }

    /// DESIGN.md §7.2 for this chain: the entry's DC answers with the
    /// shortcut, the tail's DC with the tail, one RTT each unless it is the
    /// region's own DC (which answers the global read); links the shortcut
    /// skips cost nothing.
    fn model_remote_rtts(&self, home: u16, walked: &homing_core::Walked) -> u32 {
        let mut dcs = vec![walked.entry.dc(), walked.tail.id.dc()];
        dcs.dedup();
        let home = &self.dcs[usize::from(home)].id;
        dcs.iter().filter(|d| *d != &home).count() as u32
    }

    /// DC `dc` answered router `r` (any answer): healthy again if it was suspect.
    fn router_heard(&mut self, r: usize, dc: u16) {
        let now = self.world.instant();
        let heard = self.routers[r]
            .reach
            .handle_answer(AddrSlot(usize::from(dc)), now);
        if heard.is_some() {
            self.measurements.count(Counter::RouterDcAnswersAgain);
        }
    }

    /// A request of router `r` to `dc` got no answer in time: suspect, and
    /// the suspicion's probe loop starts.
    fn router_lost(&mut self, r: usize, dc: u16) {
        let now = self.world.instant();
        let lost = self.routers[r]
            .reach
            .handle_failure(AddrSlot(usize::from(dc)), now);
        if let Some(change) = lost {
            self.measurements.count(Counter::RouterDcSuspect);
            self.router_probe(r, dc, change.epoch);
        }
    }

    /// The probe loop `epoch` of router `r` for `dc`: wait, send, or end.
    pub(crate) fn router_probe(&mut self, r: usize, dc: u16, epoch: u64) {
        let now = self.world.instant();
        let addr = AddrSlot(usize::from(dc));
        match self.routers[r].reach.poll_probe(addr, epoch, now) {
            ProbeStep::Stop => {}
            ProbeStep::WaitUntil(at) => {
                let at_us = self.world.us_at(at);
                let router = r as u32;
                self.world
                    .schedule(at_us, Event::RouterProbe { router, dc, epoch });
            }
            ProbeStep::Send => {
                self.measurements.count(Counter::RouterProbeSent);
                let id = ReservationId::new(self.dcs[usize::from(dc)].id.clone(), 0);
                let request = Request::ResolveReservation { id };
                let rpc =
                    self.world
                        .request(NodeId::Router(r as u32), NodeId::Dc(dc), NO_KEY, request);
                self.routers[r].probes.insert(rpc, (dc, epoch));
            }
        }
    }

    /// A probe of router `r` was answered (`answered`) or timed out.
    fn router_probed(&mut self, r: usize, (dc, epoch): (u16, u64), answered: bool) {
        let now = self.world.instant();
        let addr = AddrSlot(usize::from(dc));
        let probed = self.routers[r]
            .reach
            .handle_probe(addr, epoch, answered, now);
        if probed.is_some() {
            self.measurements.count(Counter::RouterDcAnswersAgain);
        }
        self.router_probe(r, dc, epoch);
    }

    pub(crate) fn router_receive(&mut self, r: usize, message: Message) {
        if let Some(probe) = self.routers[r].probes.remove(&message.rpc) {
            return self.router_probed(r, probe, true);
        }
        if self.is_router_scan(r, message.rpc) {
            let Body::Reply(reply) = message.body else {
                return;
            };
            return self.router_scanned(r, Some(reply));
        }
        if self.is_router_inspect(r, message.rpc) {
            let Body::Reply(reply) = message.body else {
                return;
            };
            return self.router_inspected(r, Some(reply));
        }
        if self.is_router_watch(r, message.rpc) {
            let Body::Reply(reply) = message.body else {
                return;
            };
            return self.router_watched(r, Some(reply));
        }
        let Some((mut resolve, _)) = self.routers[r].inflight.remove(&message.rpc) else {
            return;
        };
        let (NodeId::Dc(from), Body::Reply(reply)) = (message.from, message.body) else {
            return self.router_unanswered(r, &resolve, Op::ResolveUnavailable);
        };
        self.router_heard(r, from);
        let now = self.world.instant();
        let router = &mut self.routers[r];
        let mut memory = KeyMemory {
            remembered: &mut router.remembered,
            key: resolve.key,
            cold: resolve.cold,
        };
        resolve
            .walk
            .handle_reply(&router.table, reply, &mut memory, now);
        self.router_drive(r, resolve);
    }

    pub(crate) fn router_timeout(&mut self, r: usize, rpc: u64) {
        if let Some(probe) = self.routers[r].probes.remove(&rpc) {
            return self.router_probed(r, probe, false);
        }
        if self.is_router_watch(r, rpc) {
            return self.router_watched(r, None);
        }
        if self.is_router_scan(r, rpc) {
            return self.router_scanned(r, None);
        }
        if self.is_router_inspect(r, rpc) {
            return self.router_inspected(r, None);
        }
        if let Some((mut resolve, dc)) = self.routers[r].inflight.remove(&rpc) {
            self.world.current_key = resolve.key;
            self.router_lost(r, dc);
            let reason = "timed out".to_string();
            resolve
                .walk
                .handle_silence(&self.routers[r].table, reason, false);
            self.router_drive(r, resolve);
        }
    }

    /// `resolve` ends without an answer (`op`: unavailable, or a DC it
    /// needs is suspect); so do the resolves that joined it.
    fn router_unanswered(&mut self, r: usize, resolve: &Resolve, op: Op) {
        let latency = self.world.now - resolve.started_us;
        self.measurements.record(op, latency, resolve.remote, 0);
        self.router_walk_ended(r, resolve, op);
    }

    /// The walk of `resolve` ended: the resolves that joined it get its
    /// outcome (the Resolver's single-flight), counted as `op` when it
    /// answered none (unavailable, suspect), else as joined (an answer or a
    /// failure, which the checker judged on the walk).
    fn router_walk_ended(&mut self, r: usize, resolve: &Resolve, op: Op) {
        if resolve.cold {
            return;
        }
        let joined = self.routers[r]
            .walking
            .remove(&resolve.key)
            .unwrap_or_default();
        for started_us in joined {
            self.measurements
                .record(op, self.world.now - started_us, 0, 0);
        }
    }
}
