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

use crate::counter::{Counter, Op};
use std::collections::BTreeMap;

use std::time::{Duration, Instant};

use homing_core::chain::{HOP_LIMIT_DEFAULT, RESOLVER_ABSENT_TTL_MS_DEFAULT};
use homing_core::reachability::{AddrSlot, DcSlot, ProbeSchedule, ProbeStep, Reachability, Route};
use homing_core::{
    DcId, Key, Learned, Mutations, Request, ReservationId, RouterMemory, RouterPoll, RouterWalk,
    Shortcut, Succession, TailView,
};

use homing_store::memory::MemoryDc;

use crate::observe::Observer;
use crate::scan::Scanner;
use crate::scenario::WorkloadSpec;
use crate::trace::NO_KEY;
use crate::watch::Watcher;
use crate::world::World;

use crate::event::{Body, Event, Homingd, Message, NodeId};

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
    /// Resolves waiting for an answer, by RPC: the address asked, and
    /// the request if it may still be sent once more to another address
    /// of the same DC (the Resolver's failover).
    inflight: BTreeMap<u64, (Resolve, u16, Option<Request>)>,
    /// Keys with a (not cold) walk in flight, and when each resolve that
    /// joined it started (true µs).
    walking: BTreeMap<u32, Vec<u64>>,
    /// Which DCs it waits for (one address per DC).
    reach: Reachability,
    /// Probes in flight, by RPC: the DC and the suspicion's epoch.
    probes: BTreeMap<u64, (u16, u64)>,
    /// How many homingd each DC runs: the address of homingd `i` of DC
    /// `d` is `d * instances + i` (the Resolver lists a DC once per address).
    instances: u8,
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
    /// A router with empty caches in `region`, every DC of `dcs` reachable
    /// at each of its `instances` homingd, asked nearest first by `rtt_ms`
    /// (the region's row); `seed` spreads its probes; its walks break
    /// `mutations` on purpose.
    pub fn new(
        idx: u32,
        region: u16,
        (dcs, instances): (&[DcId], u8),
        rtt_ms: &[f64],
        seed: u64,
        mutations: Mutations,
    ) -> Router {
        let slots: Vec<DcSlot> = (0..dcs.len())
            .flat_map(|d| std::iter::repeat_n(DcSlot(d), usize::from(instances)))
            .collect();
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
            instances,
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

    /// The homingd at address `addr`.
    fn homingd(&self, addr: u16) -> Homingd {
        let n = u16::from(self.instances);
        Homingd::new(addr / n, (addr % n) as u8)
    }

    /// The address of homingd `h`.
    fn address(&self, h: Homingd) -> u16 {
        h.dc() * u16::from(self.instances) + u16::from(h.instance())
    }

    /// Whether it holds `dc` suspect now.
    pub fn suspects(&self, dc: u16) -> bool {
        self.suspects_since(dc).is_some()
    }
}

/// What a router's handlers take from the rest of the simulation: the
/// shared world, the observer, and what it may read.
pub(crate) struct RouterCtx<'a> {
    /// Time, the queue, the network, the rng.
    pub(crate) world: &'a mut World,
    /// The checker and the measurements.
    pub(crate) observer: &'a mut dyn Observer,
    /// The keys by index.
    pub(crate) keys: &'a [Key],
    /// The scenario's workload.
    pub(crate) workload: &'a WorkloadSpec,
    /// Its region's DC's records: what a scan must return (the checker's
    /// knowledge, not the router's).
    pub(crate) region_store: &'a MemoryDc,
}

impl Router {
    /// The DC of index `dc`.
    fn dc_id(&self, dc: u16) -> &DcId {
        // Invariant: `order` holds every DC index once, `table` its id.
        let slot = self
            .order
            .iter()
            .position(|d| *d == dc)
            .expect("a known dc");
        &self.table[slot]
    }

    /// Starts a resolve of a key the workload draws (and arms the next tick).
    pub(crate) fn tick(&mut self, ctx: &mut RouterCtx) {
        let world = &mut *ctx.world;
        let mean = ctx.workload.resolve_interval_ms * 1000.0;
        let at = world.now + world.rng.exp(mean);
        world.schedule(at, Event::RouterTick { router: self.idx });
        let n = ctx.keys.len() as u64;
        let key = if world.rng.chance(ctx.workload.hot_fraction) {
            world.rng.below((n / 10).max(1))
        } else {
            world.rng.below(n)
        } as u32;
        world.current_key = key;
        let cold = world.rng.chance(ctx.workload.cold_fraction);
        if let Some(cached) = self.tails.get(&key)
            && cached.expires_at_us > world.now
            && !cold
        {
            let (view, start) = (cached.view.clone(), cached.window_start_us);
            ctx.observer.record(Op::ResolveCached, 0, 0, 0);
            ctx.observer.on_resolve(key, start, world.now, Some(&view));
            return;
        }
        if !cold && let Some(joined) = self.walking.get_mut(&key) {
            joined.push(world.now);
            return;
        }
        if !cold {
            self.walking.insert(key, Vec::new());
        }
        let memory = KeyMemory {
            remembered: &mut self.remembered,
            key,
            cold,
        };
        let entry_cached = memory.entry().is_some();
        let absent_ttl = Duration::from_millis(RESOLVER_ABSENT_TTL_MS_DEFAULT);
        let key_id = ctx.keys[key as usize].clone();
        let walk = RouterWalk::new(
            key_id,
            HOP_LIMIT_DEFAULT,
            absent_ttl,
            &memory,
            self.mutations,
        );
        let resolve = Resolve {
            key,
            walk: Box::new(walk),
            started_us: world.now,
            entry_cached,
            cold,
            remote: 0,
        };
        self.drive(resolve, ctx);
    }

    /// Drives `resolve`'s walk until it sends a request or ends.
    fn drive(&mut self, mut resolve: Resolve, ctx: &mut RouterCtx) {
        let now = ctx.world.instant();
        let home = self.region;
        loop {
            let mut memory = KeyMemory {
                remembered: &mut self.remembered,
                key: resolve.key,
                cold: resolve.cold,
            };
            match resolve.walk.poll(&self.table, &mut memory, now) {
                RouterPoll::Ask { slot, request } => {
                    let dc = self.order[slot.0];
                    let Route::Ask(addr) = self.reach.route(DcSlot(usize::from(dc))) else {
                        let reason = "suspect: not asked".to_string();
                        resolve.walk.handle_silence(&self.table, reason, true);
                        continue;
                    };
                    if dc != home {
                        resolve.remote += 1;
                    }
                    let again = (self.instances > 1).then(|| request.clone());
                    let to = NodeId::Dc(self.homingd(addr.0 as u16));
                    let from = NodeId::Router(self.idx);
                    let rpc = ctx.world.request(from, to, resolve.key, request);
                    self.inflight.insert(rpc, (resolve, addr.0 as u16, again));
                    return;
                }
                RouterPoll::NotFound => {
                    if resolve.walk.absent_reused() {
                        ctx.observer.count(Counter::ResolveAbsentReusedAtRouter);
                    }
                    let now_us = ctx.world.now;
                    let latency = now_us - resolve.started_us;
                    ctx.observer
                        .record(Op::ResolveNotFound, latency, resolve.remote, 0);
                    ctx.observer
                        .on_resolve(resolve.key, resolve.started_us, now_us, None);
                    return self.walk_ended(&resolve, Op::ResolveJoined, ctx);
                }
                RouterPoll::Found(walked) => return self.found(&resolve, walked, ctx),
                RouterPoll::Unavailable(unavailable) => {
                    let op = match unavailable.suspect {
                        true => Op::ResolveSuspect,
                        false => Op::ResolveUnavailable,
                    };
                    return self.unanswered(&resolve, op, ctx);
                }
                RouterPoll::Failed(e) => {
                    ctx.observer.on_resolve_error(resolve.key, e.to_string());
                    return self.walk_ended(&resolve, Op::ResolveJoined, ctx);
                }
            }
        }
    }

    /// `resolve`'s walk reached the tail: judged, measured, cached if live.
    fn found(&mut self, resolve: &Resolve, walked: homing_core::Walked, ctx: &mut RouterCtx) {
        let now_us = ctx.world.now;
        let latency = now_us - resolve.started_us;
        let (op, model) = if resolve.entry_cached {
            // Only the tail's state is fetched: one RTT unless it is local.
            let remote = walked.tail.id.dc() != self.dc_id(self.region);
            (Op::ResolveRefresh, u32::from(remote))
        } else {
            let n = walked.links.len().min(255) as u8;
            (Op::ResolveCold(n), self.model_remote_rtts(&walked))
        };
        ctx.observer.record(op, latency, resolve.remote, model);
        ctx.observer
            .on_resolve(resolve.key, resolve.started_us, now_us, Some(&walked.tail));
        self.walk_ended(resolve, Op::ResolveJoined, ctx);
        if walked.tail.answer().is_none() {
            return; // a vacant tail is read again next time (the Resolver's rule)
        }
        let ttl = ctx.workload.tail_ttl_ms * 1000;
        self.tails.insert(
            resolve.key,
            CachedTail {
                view: walked.tail,
                window_start_us: resolve.started_us,
                expires_at_us: now_us + ttl,
            },
        );
    }

    /// DESIGN.md §7.2 for this chain: the entry's DC answers with the
    /// shortcut, the tail's DC with the tail, one RTT each unless it is the
    /// region's own DC (which answers the global read); links the shortcut
    /// skips cost nothing.
    fn model_remote_rtts(&self, walked: &homing_core::Walked) -> u32 {
        let mut dcs = vec![walked.entry.dc(), walked.tail.id.dc()];
        dcs.dedup();
        let home = self.dc_id(self.region);
        dcs.iter().filter(|d| *d != &home).count() as u32
    }

    /// Address `dc` answered (any answer): healthy again if it was suspect.
    fn heard(&mut self, dc: u16, ctx: &mut RouterCtx) {
        let now = ctx.world.instant();
        let heard = self.reach.handle_answer(AddrSlot(usize::from(dc)), now);
        if heard.is_some() {
            ctx.observer.count(Counter::RouterDcAnswersAgain);
        }
    }

    /// A request to address `dc` got no answer in time: suspect, and the
    /// suspicion's probe loop starts.
    fn lost(&mut self, dc: u16, ctx: &mut RouterCtx) {
        let now = ctx.world.instant();
        let lost = self.reach.handle_failure(AddrSlot(usize::from(dc)), now);
        if let Some(change) = lost {
            ctx.observer.count(Counter::RouterDcSuspect);
            self.probe(dc, change.epoch, ctx);
        }
    }

    /// The probe loop `epoch` for address `dc`: wait, send, or end.
    pub(crate) fn probe(&mut self, dc: u16, epoch: u64, ctx: &mut RouterCtx) {
        let now = ctx.world.instant();
        let addr = AddrSlot(usize::from(dc));
        match self.reach.poll_probe(addr, epoch, now) {
            ProbeStep::Stop => {}
            ProbeStep::WaitUntil(at) => {
                let at_us = ctx.world.us_at(at);
                let router = self.idx;
                ctx.world
                    .schedule(at_us, Event::RouterProbe { router, dc, epoch });
            }
            ProbeStep::Send => {
                ctx.observer.count(Counter::RouterProbeSent);
                let to = self.homingd(dc);
                let id = ReservationId::new(self.dc_id(to.dc()).clone(), 0);
                let request = Request::ResolveReservation { id };
                let from = NodeId::Router(self.idx);
                let rpc = ctx.world.request(from, NodeId::Dc(to), NO_KEY, request);
                self.probes.insert(rpc, (dc, epoch));
            }
        }
    }

    /// A probe was answered (`answered`) or timed out.
    fn probed(&mut self, (dc, epoch): (u16, u64), answered: bool, ctx: &mut RouterCtx) {
        let now = ctx.world.instant();
        let addr = AddrSlot(usize::from(dc));
        let probed = self.reach.handle_probe(addr, epoch, answered, now);
        if probed.is_some() {
            ctx.observer.count(Counter::RouterDcAnswersAgain);
        }
        self.probe(dc, epoch, ctx);
    }

    /// Asks its region's DC for the events after its watcher's cursor.
    pub(crate) fn watch(&mut self, ctx: &mut RouterCtx) {
        if let Some(watcher) = &mut self.watcher {
            watcher.ask(ctx.world, ctx.observer);
        }
    }

    /// Begins a scan of its region's DC, or asks for its next page.
    pub(crate) fn scan(&mut self, ctx: &mut RouterCtx) {
        if let Some(scanner) = &mut self.scanner {
            scanner.ask(ctx.region_store, ctx.world, ctx.observer);
        }
    }

    /// A message for it arrived.
    pub(crate) fn receive(&mut self, message: Message, ctx: &mut RouterCtx) {
        if let Some(probe) = self.probes.remove(&message.rpc) {
            return self.probed(probe, true, ctx);
        }
        if let Some(scanner) = &mut self.scanner
            && let Some(asked) = scanner.asked(message.rpc)
        {
            let Body::Reply(reply) = message.body else {
                return;
            };
            let store = (ctx.region_store, ctx.workload.scan_interval_ms);
            return scanner.answered(asked, Some(reply), store, ctx.world, ctx.observer);
        }
        if let Some(watcher) = &mut self.watcher
            && watcher.asked(message.rpc)
        {
            let Body::Reply(reply) = message.body else {
                return;
            };
            let pause_ms = ctx.workload.watch_pause_ms;
            return watcher.answered(Some(reply), pause_ms, ctx.world, ctx.observer);
        }
        let Some((mut resolve, ..)) = self.inflight.remove(&message.rpc) else {
            return;
        };
        let (NodeId::Dc(from), Body::Reply(reply)) = (message.from, message.body) else {
            return self.unanswered(&resolve, Op::ResolveUnavailable, ctx);
        };
        self.heard(self.address(from), ctx);
        let now = ctx.world.instant();
        let mut memory = KeyMemory {
            remembered: &mut self.remembered,
            key: resolve.key,
            cold: resolve.cold,
        };
        resolve
            .walk
            .handle_reply(&self.table, reply, &mut memory, now);
        self.drive(resolve, ctx);
    }

    /// Its request `rpc` got no reply in time.
    pub(crate) fn timeout(&mut self, rpc: u64, ctx: &mut RouterCtx) {
        if let Some(probe) = self.probes.remove(&rpc) {
            return self.probed(probe, false, ctx);
        }
        if let Some(watcher) = &mut self.watcher
            && watcher.asked(rpc)
        {
            let pause_ms = ctx.workload.watch_pause_ms;
            return watcher.answered(None, pause_ms, ctx.world, ctx.observer);
        }
        if let Some(scanner) = &mut self.scanner
            && let Some(asked) = scanner.asked(rpc)
        {
            let store = (ctx.region_store, ctx.workload.scan_interval_ms);
            return scanner.answered(asked, None, store, ctx.world, ctx.observer);
        }
        if let Some((mut resolve, addr, again)) = self.inflight.remove(&rpc) {
            ctx.world.current_key = resolve.key;
            self.lost(addr, ctx);
            // Sent once more, to the DC's next address that is not
            // suspect (the Resolver's failover), before the walk hears of it.
            let dc = DcSlot(usize::from(self.homingd(addr).dc()));
            if let (Some(request), Route::Ask(next)) = (again, self.reach.route(dc)) {
                ctx.observer.count(Counter::HomingdFailover);
                let to = NodeId::Dc(self.homingd(next.0 as u16));
                let from = NodeId::Router(self.idx);
                let rpc = ctx.world.request(from, to, resolve.key, request);
                self.inflight.insert(rpc, (resolve, next.0 as u16, None));
                return;
            }
            let reason = "timed out".to_string();
            resolve.walk.handle_silence(&self.table, reason, false);
            self.drive(resolve, ctx);
        }
    }

    /// `resolve` ends without an answer (`op`: unavailable, or a DC it
    /// needs is suspect); so do the resolves that joined it.
    fn unanswered(&mut self, resolve: &Resolve, op: Op, ctx: &mut RouterCtx) {
        let latency = ctx.world.now - resolve.started_us;
        ctx.observer.record(op, latency, resolve.remote, 0);
        self.walk_ended(resolve, op, ctx);
    }

    /// The walk of `resolve` ended: the resolves that joined it get its
    /// outcome (the Resolver's single-flight), counted as `op` when it
    /// answered none (unavailable, suspect), else as joined (an answer or a
    /// failure, which the checker judged on the walk).
    fn walk_ended(&mut self, resolve: &Resolve, op: Op, ctx: &mut RouterCtx) {
        if resolve.cold {
            return;
        }
        let joined = self.walking.remove(&resolve.key).unwrap_or_default();
        for started_us in joined {
            ctx.observer.record(op, ctx.world.now - started_us, 0, 0);
        }
    }
}
