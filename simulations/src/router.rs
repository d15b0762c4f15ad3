//! Edge routers. A router resolves keys the way homing-client's `Resolver`
//! does, with homing-core's `ChainWalk`: the global entry and the furthest
//! chain member a walk proved are cached forever (entries never change,
//! members stay members) and the next walk starts at that member; a live
//! tail is cached for `tail_ttl_ms` and a vacant one not at all
//! (`TailView::answer`, the rule the Resolver caches by). A cold walk asks
//! its region's DC (`Resolve`: global read + the segment if that DC owns the
//! entry), then the DCs the walk needs (`ResolveReservation`): the
//! shortcut's, and any whose links it follows. A timeout or an error reply
//! makes the answer `Unavailable`, never `NotFound`.
//!
//! Reachability as the Resolver keeps it (homing-core's `reachability`): a
//! DC whose request timed out is suspect, requests that need it are
//! answered `Unavailable` at once instead of waiting for it again, and one
//! probe per suspect DC (a `ResolveReservation` of `<dc>.0`, on the probe
//! schedule) finds out when it answers; any answer clears the suspicion.
//!
//! A walk that needs a silent DC's reservation asks the router's own DC for
//! its succession (`Successor`, DESIGN.md §7.5) and goes on through it (a
//! present answer is cached forever); with none, the answer is
//! `Unavailable`. A `NotFound` answer is reused for the Resolver's default
//! `absent_ttl_ms` (`RESOLVER_ABSENT_TTL_MS_DEFAULT`), as the Resolver
//! does. Concurrent resolves of one key at one router share one walk, as
//! the Resolver's single-flight does: a resolve that finds a walk of its
//! key in flight asks nothing and gets that walk's outcome (an answer, the
//! checker having judged the walk's; or the walk's unavailability, counted
//! in its row). A cold resolve (a fresh router's) neither joins nor is
//! joined.

use crate::counter::Counter;
use std::collections::BTreeMap;

use homing_core::chain::{HOP_LIMIT_DEFAULT, RESOLVER_ABSENT_TTL_MS_DEFAULT};
use homing_core::reachability::{AddrSlot, DcSlot, ProbeSchedule, ProbeStep, Reachability, Route};
use homing_core::{
    ChainNeed, ChainPoll, ChainWalk, Reply, Request, ReservationId, Shortcut, Source, TailView,
};

use crate::scan::Scanner;
use crate::trace::NO_KEY;
use crate::watch::Watcher;

use crate::report::Op;
use crate::sim::{Body, Event, Message, NodeId, Sim};

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
    walk: Box<ChainWalk>,
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
    entries: BTreeMap<u32, ReservationId>,
    members: BTreeMap<u32, Shortcut>,
    tails: BTreeMap<u32, CachedTail>,
    /// Keys answered `NotFound`, and when (true µs): the Resolver's absent cache.
    absent: BTreeMap<u32, u64>,
    /// Successions learned from `Successor` answers (write-once).
    successions: BTreeMap<ReservationId, homing_core::Succession>,
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

impl Router {
    /// Whether `key` was answered `NotFound` within the Resolver's absent TTL of `now_us`.
    fn absent_lately(&self, key: u32, now_us: u64) -> bool {
        self.absent
            .get(&key)
            .is_some_and(|at| now_us - at < RESOLVER_ABSENT_TTL_MS_DEFAULT * 1000)
    }

    /// A router with empty caches in `region`, every one of `dcs` DCs
    /// reachable; `seed` spreads its probes.
    pub fn new(idx: u32, region: u16, dcs: usize, seed: u64) -> Router {
        let slots: Vec<DcSlot> = (0..dcs).map(DcSlot).collect();
        Router {
            idx,
            region,
            entries: BTreeMap::new(),
            members: BTreeMap::new(),
            tails: BTreeMap::new(),
            absent: BTreeMap::new(),
            successions: BTreeMap::new(),
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
        let at = self.now + self.rng.exp(mean);
        self.schedule(at, Event::RouterTick { router: r as u32 });
        let n = self.keys.len() as u64;
        let key = if self.rng.chance(self.scenario.workload.hot_fraction) {
            self.rng.below((n / 10).max(1))
        } else {
            self.rng.below(n)
        } as u32;
        self.current_key = key;
        let cold = self.rng.chance(self.scenario.workload.cold_fraction);
        if let Some(cached) = self.routers[r].tails.get(&key)
            && cached.expires_at_us > self.now
            && !cold
        {
            let (view, start) = (cached.view.clone(), cached.window_start_us);
            self.measurements.record(Op::ResolveCached, 0, 0, 0);
            self.checker.on_resolve(key, start, self.now, Some(&view));
            return;
        }
        if !cold && let Some(joined) = self.routers[r].walking.get_mut(&key) {
            joined.push(self.now);
            return;
        }
        if !cold {
            self.routers[r].walking.insert(key, Vec::new());
        }
        let entry_cached = !cold && self.routers[r].entries.contains_key(&key);
        let hint = match cold {
            true => None,
            false => self.routers[r].members.get(&key).cloned(),
        };
        let walk = ChainWalk::from_key(self.keys[key as usize].clone(), HOP_LIMIT_DEFAULT);
        let resolve = Resolve {
            key,
            walk: Box::new(walk.with_hint(hint)),
            started_us: self.now,
            entry_cached,
            cold,
            remote: 0,
        };
        self.router_drive(r, resolve);
    }

    fn router_drive(&mut self, r: usize, mut resolve: Resolve) {
        let home = self.routers[r].region;
        loop {
            match resolve.walk.poll().clone() {
                ChainPoll::Need(ChainNeed::GlobalEntry(key)) => {
                    if let Some(id) = self.routers[r].entries.get(&resolve.key)
                        && !resolve.cold
                    {
                        let _ = resolve.walk.handle_global(Some(id.clone()), Source::Cache);
                        continue;
                    }
                    // A recent NotFound is reused (DESIGN.md §7.4).
                    if !resolve.cold && self.routers[r].absent_lately(resolve.key, self.now) {
                        self.measurements
                            .count(Counter::ResolveAbsentReusedAtRouter);
                        let _ = resolve.walk.handle_global(None, Source::Cache);
                        continue;
                    }
                    return self.router_ask(r, home, resolve, Request::Resolve { key });
                }
                ChainPoll::Need(ChainNeed::Reservation(id)) => {
                    let Some(&dc) = self.dc_index.get(id.dc()) else {
                        self.checker
                            .on_resolve_error(resolve.key, format!("unknown dc in {id}"));
                        return self.router_walk_ended(r, &resolve, Op::ResolveJoined);
                    };
                    if dc != home {
                        resolve.remote += 1;
                    }
                    return self.router_ask(r, dc, resolve, Request::ResolveReservation { id });
                }
                ChainPoll::NotFound => {
                    if !self.routers[r].absent_lately(resolve.key, self.now) {
                        self.routers[r].absent.insert(resolve.key, self.now);
                    }
                    let latency = self.now - resolve.started_us;
                    self.measurements
                        .record(Op::ResolveNotFound, latency, resolve.remote, 0);
                    self.checker
                        .on_resolve(resolve.key, resolve.started_us, self.now, None);
                    return self.router_walk_ended(r, &resolve, Op::ResolveJoined);
                }
                ChainPoll::Done(walked) => {
                    let member = walked.hint();
                    let members = &mut self.routers[r].members;
                    if member.is_past(members.get(&resolve.key)) {
                        members.insert(resolve.key, member);
                    }
                    let latency = self.now - resolve.started_us;
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
                        self.now,
                        Some(&walked.tail),
                    );
                    self.router_walk_ended(r, &resolve, Op::ResolveJoined);
                    if walked.tail.answer().is_none() {
                        return; // a vacant tail is read again next time (the Resolver's rule)
                    }
                    let ttl = self.scenario.workload.tail_ttl_ms * 1000;
                    self.routers[r].tails.insert(
                        resolve.key,
                        CachedTail {
                            view: walked.tail,
                            window_start_us: resolve.started_us,
                            expires_at_us: self.now + ttl,
                        },
                    );
                    return;
                }
                ChainPoll::Failed(e) => {
                    self.checker.on_resolve_error(resolve.key, e.to_string());
                    return self.router_walk_ended(r, &resolve, Op::ResolveJoined);
                }
            }
        }
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

    /// Sends `request` for `resolve` to DC `dc`, unless the router holds
    /// it suspect: then the resolve is `Unavailable` at once.
    fn router_ask(&mut self, r: usize, dc: u16, mut resolve: Resolve, request: Request) {
        if self.routers[r].suspects(dc) {
            if matches!(request, Request::ResolveReservation { .. }) {
                resolve = match self.router_around_silent(r, dc, resolve) {
                    Some(resolve) => resolve,
                    None => return,
                };
            }
            return self.router_unanswered(r, &resolve, Op::ResolveSuspect);
        }
        let rpc = self.request(
            NodeId::Router(r as u32),
            NodeId::Dc(dc),
            resolve.key,
            request,
        );
        self.routers[r].inflight.insert(rpc, (resolve, dc));
    }

    /// DC `dc` did not answer for the reservation `resolve` needs (the
    /// Resolver's `around_silent_dc`): a shortcut is given up for the links;
    /// on a follow, a known succession is followed, else the router's own
    /// DC is asked for it. `None`: the resolve went on (or failed and was
    /// reported); `Some`: the silence is the answer, for the caller to report.
    fn router_around_silent(&mut self, r: usize, dc: u16, mut resolve: Resolve) -> Option<Resolve> {
        let at = match resolve.walk.handle_unreachable() {
            Ok(Some(at)) => at,
            Ok(None) => {
                self.router_drive(r, resolve);
                return None;
            }
            Err(e) => {
                self.checker.on_resolve_error(resolve.key, e.to_string());
                self.router_walk_ended(r, &resolve, Op::ResolveJoined);
                return None;
            }
        };
        let hint = self.routers[r].members.get(&resolve.key).cloned();
        if let Some(known) = self.routers[r].successions.get(&at).cloned() {
            let _ = resolve
                .walk
                .handle_successor(known.link, hint, Source::Cache);
            self.router_drive(r, resolve);
            return None;
        }
        let home = self.routers[r].region;
        if home == dc || self.routers[r].suspects(home) {
            return Some(resolve);
        }
        let rpc = self.request(
            NodeId::Router(r as u32),
            NodeId::Dc(home),
            resolve.key,
            Request::Successor {
                key: self.keys[resolve.key as usize].clone(),
                id: at,
            },
        );
        self.routers[r].inflight.insert(rpc, (resolve, home));
        None
    }

    /// DC `dc` answered router `r` (any answer): healthy again if it was suspect.
    fn router_heard(&mut self, r: usize, dc: u16) {
        let now = self.instant();
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
        let now = self.instant();
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
        let now = self.instant();
        let addr = AddrSlot(usize::from(dc));
        match self.routers[r].reach.poll_probe(addr, epoch, now) {
            ProbeStep::Stop => {}
            ProbeStep::WaitUntil(at) => {
                let at_us = self.us_at(at);
                let router = r as u32;
                self.schedule(at_us, Event::RouterProbe { router, dc, epoch });
            }
            ProbeStep::Send => {
                self.measurements.count(Counter::RouterProbeSent);
                let id = ReservationId::new(self.dcs[usize::from(dc)].id.clone(), 0);
                let request = Request::ResolveReservation { id };
                let rpc = self.request(NodeId::Router(r as u32), NodeId::Dc(dc), NO_KEY, request);
                self.routers[r].probes.insert(rpc, (dc, epoch));
            }
        }
    }

    /// A probe of router `r` was answered (`answered`) or timed out.
    fn router_probed(&mut self, r: usize, (dc, epoch): (u16, u64), answered: bool) {
        let now = self.instant();
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
        let home = self.routers[r].region;
        let from_id = self.dcs[usize::from(from)].id.clone();
        let source = if from == home {
            Source::Local
        } else {
            Source::Remote
        };
        match reply {
            Reply::Resolved { entry, segment } => {
                if let Some(id) = &entry {
                    self.routers[r].entries.insert(resolve.key, id.clone());
                }
                let _ = resolve.walk.handle_global(entry.clone(), Source::Local);
                // Used unless a hint sent the walk elsewhere (the Resolver's rule).
                if let (Some(segment), Some(entry)) = (segment, entry)
                    && resolve.walk.poll()
                        == &ChainPoll::Need(ChainNeed::Reservation(entry.clone()))
                {
                    let _ = resolve
                        .walk
                        .handle_segment(entry.dc(), segment, Source::Local);
                }
            }
            Reply::Reservation(segment) => {
                let _ = resolve.walk.handle_segment(&from_id, segment, source);
            }
            Reply::Successor {
                succession: Some(succession),
                hint,
            } => {
                let at = succession.link.from.clone();
                let link = succession.link.clone();
                self.routers[r].successions.insert(at, succession);
                let mine = self.routers[r].members.get(&resolve.key).cloned();
                let hint = Shortcut::furthest(mine, hint);
                let _ = resolve.walk.handle_successor(link, hint, source);
            }
            Reply::Error(e)
                if e.kind.disowns()
                    && matches!(
                        resolve.walk.poll(),
                        ChainPoll::Need(ChainNeed::Reservation(_))
                    ) =>
            {
                let _ = resolve.walk.handle_disowned(&from_id, source);
            }
            // The owner does not answer for its tail now (its DC lease
            // lapsed, or it is reconciling): like a silent DC.
            Reply::Error(e)
                if matches!(e.kind, homing_core::ErrorKind::Unavailable { .. })
                    && matches!(resolve.walk.poll(), ChainPoll::Need(ChainNeed::Reservation(id)) if id.dc() == &from_id) =>
            {
                if let Some(resolve) = self.router_around_silent(r, from, resolve) {
                    self.router_unanswered(r, &resolve, Op::ResolveUnavailable);
                }
                return;
            }
            _ => return self.router_unanswered(r, &resolve, Op::ResolveUnavailable),
        }
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
        if let Some((resolve, dc)) = self.routers[r].inflight.remove(&rpc) {
            self.current_key = resolve.key;
            self.router_lost(r, dc);
            let silent = matches!(resolve.walk.poll(), ChainPoll::Need(ChainNeed::Reservation(id)) if self.dc_index.get(id.dc()) == Some(&dc));
            let resolve = match silent {
                true => match self.router_around_silent(r, dc, resolve) {
                    Some(resolve) => resolve,
                    None => return,
                },
                false => resolve,
            };
            self.router_unanswered(r, &resolve, Op::ResolveUnavailable);
        }
    }

    /// `resolve` ends without an answer (`op`: unavailable, or a DC it
    /// needs is suspect); so do the resolves that joined it.
    fn router_unanswered(&mut self, r: usize, resolve: &Resolve, op: Op) {
        let latency = self.now - resolve.started_us;
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
            self.measurements.record(op, self.now - started_us, 0, 0);
        }
    }
}
