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

use std::collections::BTreeMap;

use homing_core::chain::HOP_LIMIT_DEFAULT;
use homing_core::{
    ChainWalk, Need, Poll, Reply, Request, ReservationId, Shortcut, Source, TailView,
};

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
    walk: ChainWalk,
    started_us: u64,
    entry_cached: bool,
    /// Walk as a fresh router: consult no cache.
    cold: bool,
    remote: u32,
}

/// One edge router with its caches.
#[derive(Debug, Clone)]
pub struct Router {
    /// Its index.
    pub idx: u32,
    /// Its region (the index of its nearest DC).
    pub region: u16,
    entries: BTreeMap<u32, ReservationId>,
    members: BTreeMap<u32, Shortcut>,
    tails: BTreeMap<u32, CachedTail>,
    inflight: BTreeMap<u64, Resolve>,
}

impl Router {
    /// A router with empty caches in `region`.
    pub fn new(idx: u32, region: u16) -> Router {
        Router {
            idx,
            region,
            entries: BTreeMap::new(),
            members: BTreeMap::new(),
            tails: BTreeMap::new(),
            inflight: BTreeMap::new(),
        }
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
        let entry_cached = !cold && self.routers[r].entries.contains_key(&key);
        let hint = match cold {
            true => None,
            false => self.routers[r].members.get(&key).cloned(),
        };
        let walk = ChainWalk::from_key(self.keys[key as usize].clone(), HOP_LIMIT_DEFAULT);
        let resolve = Resolve {
            key,
            walk: walk.with_hint(hint),
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
                Poll::Need(Need::GlobalEntry(key)) => {
                    if let Some(id) = self.routers[r].entries.get(&resolve.key)
                        && !resolve.cold
                    {
                        let _ = resolve.walk.handle_global(Some(id.clone()), Source::Cache);
                        continue;
                    }
                    let rpc = self.request(
                        NodeId::Router(r as u32),
                        NodeId::Dc(home),
                        resolve.key,
                        Request::Resolve { key },
                    );
                    self.routers[r].inflight.insert(rpc, resolve);
                    return;
                }
                Poll::Need(Need::Reservation(id)) => {
                    let Some(&dc) = self.dc_index.get(id.dc()) else {
                        self.checker
                            .on_resolve_error(resolve.key, format!("unknown dc in {id}"));
                        return;
                    };
                    if dc != home {
                        resolve.remote += 1;
                    }
                    let rpc = self.request(
                        NodeId::Router(r as u32),
                        NodeId::Dc(dc),
                        resolve.key,
                        Request::ResolveReservation { id },
                    );
                    self.routers[r].inflight.insert(rpc, resolve);
                    return;
                }
                Poll::NotFound => {
                    let latency = self.now - resolve.started_us;
                    self.measurements
                        .record(Op::ResolveNotFound, latency, resolve.remote, 0);
                    self.checker
                        .on_resolve(resolve.key, resolve.started_us, self.now, None);
                    return;
                }
                Poll::Done(walked) => {
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
                Poll::Failed(e) => {
                    self.checker.on_resolve_error(resolve.key, e.to_string());
                    return;
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

    pub(crate) fn router_receive(&mut self, r: usize, message: Message) {
        let Some(mut resolve) = self.routers[r].inflight.remove(&message.rpc) else {
            return;
        };
        let NodeId::Dc(from) = message.from else {
            return;
        };
        let Body::Reply(reply) = message.body else {
            return;
        };
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
                    && resolve.walk.poll() == &Poll::Need(Need::Reservation(entry.clone()))
                {
                    let _ = resolve
                        .walk
                        .handle_segment(entry.dc(), segment, Source::Local);
                }
            }
            Reply::Reservation(segment) => {
                let _ = resolve.walk.handle_segment(&from_id, segment, source);
            }
            Reply::Error(e)
                if e.kind.disowns()
                    && matches!(resolve.walk.poll(), Poll::Need(Need::Reservation(_))) =>
            {
                let _ = resolve.walk.handle_disowned(&from_id, source);
            }
            _ => {
                let latency = self.now - resolve.started_us;
                self.measurements
                    .record(Op::ResolveUnavailable, latency, resolve.remote, 0);
                return;
            }
        }
        self.router_drive(r, resolve);
    }

    pub(crate) fn router_timeout(&mut self, r: usize, rpc: u64) {
        if let Some(resolve) = self.routers[r].inflight.remove(&rpc) {
            self.current_key = resolve.key;
            let latency = self.now - resolve.started_us;
            self.measurements
                .record(Op::ResolveUnavailable, latency, resolve.remote, 0);
        }
    }
}
