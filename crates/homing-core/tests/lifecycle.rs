//! Random operation sequences on the DC record state machine, across three
//! DCs sharing one key, with the connect/recreate steps split into a begin
//! and a finish so that racing DCs interleave. After every operation the
//! invariants of DESIGN.md §3 are checked in true time: at most one holder
//! acts, tokens strictly increase across holders and along the chain, links
//! never change, the chain is acyclic and ends in one tail.
//!
//! Clocks: every DC store and every host has its own offset from true time,
//! so nothing passes unless the lease timeline really avoids comparing clocks.

use std::collections::BTreeMap;

use homing_core::{
    ActivateReply, ActorId, DcId, DcRecord, Deadlines, FencingToken, HostTime, Key, KeyName,
    LeasePolicy, LinkReply, RecordState, RecordView, ReleaseReply, RenewReply, ReservationId,
    StoreTime,
};
use proptest::prelude::*;

const DCS: usize = 3;
const POLICY: LeasePolicy = LeasePolicy::DEFAULT;

#[derive(Debug, Clone)]
enum Op {
    /// A host in DC `dc` connects to the key.
    Begin { dc: usize },
    /// As `Begin`, but the DC acts on a stale view of the tail and asks for
    /// the link even though the tail is live: the link CAS must refuse.
    BeginStale { dc: usize },
    /// The `n`-th pending connect (modulo) writes its global entry or link.
    Finish { n: usize },
    /// The `n`-th holder (modulo) renews, if by its own clock it still may.
    Renew { n: usize },
    /// The `n`-th holder releases.
    Release { n: usize },
    /// The `n`-th holder crashes: it stops acting and never calls again.
    Crash { n: usize },
    /// True time passes.
    Advance { ms: u64 },
    /// DC `dc`'s reaper runs.
    Reap { dc: usize },
    /// An operator drains the key at the tail.
    Drain,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (0..DCS).prop_map(|dc| Op::Begin { dc }),
        1 => (0..DCS).prop_map(|dc| Op::BeginStale { dc }),
        3 => any::<usize>().prop_map(|n| Op::Finish { n }),
        3 => any::<usize>().prop_map(|n| Op::Renew { n }),
        1 => any::<usize>().prop_map(|n| Op::Release { n }),
        1 => any::<usize>().prop_map(|n| Op::Crash { n }),
        4 => (1u64..6_000).prop_map(|ms| Op::Advance { ms }),
        2 => (0..DCS).prop_map(|dc| Op::Reap { dc }),
        1 => Just(Op::Drain),
    ]
}

#[derive(Debug)]
enum Pending {
    First {
        id: ReservationId,
        deadlines: Deadlines,
    },
    Link {
        id: ReservationId,
        deadlines: Deadlines,
        tail: ReservationId,
        expected: FencingToken,
    },
}

/// Each host's lease key (hosts are numbered from 0).
fn lease_of(host: usize) -> homing_core::LeaseKey {
    let mut bytes = [0xA5; 16];
    bytes[..8].copy_from_slice(&(host as u64).to_le_bytes());
    homing_core::LeaseKey::from_bytes(bytes).unwrap()
}

#[derive(Debug)]
struct Holder {
    id: ReservationId,
    token: FencingToken,
    host: usize,
    hard_terminate_at: HostTime,
    soft_terminate_at: HostTime,
    stopped: bool,
}

struct World {
    now_ms: u64,
    store_offset_ms: [u64; DCS],
    host_offset_ms: Vec<u64>,
    dcs: Vec<DcId>,
    records: Vec<BTreeMap<ReservationId, DcRecord>>,
    allocated: [u64; DCS],
    global: Option<ReservationId>,
    pending: Vec<(Pending, usize)>,
    holders: Vec<Holder>,
    links_seen: BTreeMap<ReservationId, ReservationId>,
    last_granted: Option<FencingToken>,
    /// Hosts begun so far: each begin is a new host with its own lease key.
    hosts: usize,
}

impl World {
    fn new(store_offset_ms: [u64; DCS], host_offset_ms: Vec<u64>) -> World {
        World {
            now_ms: 1_000_000,
            store_offset_ms,
            host_offset_ms,
            dcs: ["a", "b", "c"]
                .iter()
                .map(|d| DcId::new(*d).unwrap())
                .collect(),
            records: vec![BTreeMap::new(); DCS],
            allocated: [0; DCS],
            global: None,
            pending: Vec::new(),
            holders: Vec::new(),
            links_seen: BTreeMap::new(),
            last_granted: None,
            hosts: 0,
        }
    }

    fn key() -> Key {
        Key::new(KeyName::new("room").unwrap())
    }

    fn store_now(&self, dc: usize) -> StoreTime {
        StoreTime::from_ms(self.now_ms + self.store_offset_ms[dc])
    }

    fn host_now(&self, host: usize) -> HostTime {
        HostTime::from_ms(self.now_ms + self.host_offset_ms[host % self.host_offset_ms.len()])
    }

    fn dc_of(&self, id: &ReservationId) -> usize {
        self.dcs.iter().position(|d| d == id.dc()).unwrap()
    }

    fn record(&self, id: &ReservationId) -> &DcRecord {
        &self.records[self.dc_of(id)][id]
    }

    /// Applies a transition's write as a compare-and-set on the version.
    fn write(&mut self, next: DcRecord) {
        let dc = self.dc_of(&next.id);
        let old = self.records[dc].get(&next.id).map(|r| r.version);
        assert_eq!(
            next.version,
            old.map_or(1, |v| v + 1),
            "writes are versioned"
        );
        self.records[dc].insert(next.id.clone(), next);
    }

    fn tail(&self) -> Option<ReservationId> {
        let mut at = self.global.clone()?;
        for _ in 0..1000 {
            match &self.record(&at).state {
                RecordState::Linked { to } => at = to.clone(),
                _ => return Some(at),
            }
        }
        panic!("chain does not end");
    }

    fn allocate(&mut self, dc: usize) -> ReservationId {
        self.allocated[dc] += 1;
        ReservationId::new(self.dcs[dc].clone(), self.allocated[dc])
    }

    fn grant(&mut self, id: ReservationId, token: FencingToken, host: usize, deadlines: Deadlines) {
        if let Some(last) = self.last_granted {
            assert!(token > last, "token {token} granted after {last}");
        }
        self.last_granted = Some(token);
        self.holders.push(Holder {
            id,
            token,
            host,
            hard_terminate_at: deadlines.hard_terminate_at,
            soft_terminate_at: deadlines.soft_terminate_at,
            stopped: false,
        });
    }

    fn apply(&mut self, op: &Op) {
        match *op {
            Op::Begin { dc } => self.begin(dc, false),
            Op::BeginStale { dc } => self.begin(dc, true),
            Op::Finish { n } => {
                if !self.pending.is_empty() {
                    let (pending, host) = self.pending.remove(n % self.pending.len());
                    self.finish(pending, host);
                }
            }
            Op::Renew { n } => self.renew(n),
            Op::Release { n } => {
                if let Some(h) = self.live_holder(n) {
                    let (id, token) = (self.holders[h].id.clone(), self.holders[h].token);
                    let now = self.store_now(self.dc_of(&id));
                    let out = self.record(&id).release(
                        token,
                        &lease_of(self.holders[h].host),
                        homing_core::RunOutcome::Ok,
                        now,
                    );
                    self.holders[h].stopped = true;
                    if let Some(next) = out.next {
                        self.write(next);
                    }
                    assert!(matches!(
                        out.reply,
                        ReleaseReply::Released | ReleaseReply::StaleToken { .. }
                    ));
                }
            }
            Op::Crash { n } => {
                if let Some(h) = self.live_holder(n) {
                    self.holders[h].stopped = true;
                }
            }
            Op::Advance { ms } => self.now_ms += ms,
            Op::Reap { dc } => {
                let now = self.store_now(dc);
                let expired: Vec<_> = self.records[dc]
                    .values()
                    .filter_map(|r| r.expire(now, &POLICY, None))
                    .collect();
                for next in expired {
                    self.write(next);
                }
            }
            Op::Drain => {
                if let Some(tail) = self.tail()
                    && let Some(next) = self.record(&tail).drain(None)
                {
                    self.write(next);
                }
            }
        }
    }

    fn live_holder(&self, n: usize) -> Option<usize> {
        let live: Vec<usize> = (0..self.holders.len())
            .filter(|&h| !self.holders[h].stopped)
            .collect();
        (!live.is_empty()).then(|| live[n % live.len()])
    }

    fn begin(&mut self, dc: usize, stale_view: bool) {
        let host = self.hosts;
        self.hosts += 1;
        let actor = ActorId::new(format!("actor-{host}")).unwrap();
        let host_time = self.host_now(host);
        let now = self.store_now(dc);
        let holder = homing_core::Holding {
            actor,
            lease: lease_of(host),
            host_time,
            session: None,
        };
        let Some(tail) = self.tail() else {
            let id = self.allocate(dc);
            let (record, deadlines) = DcRecord::reserve(
                id.clone(),
                World::key(),
                None,
                FencingToken::FIRST,
                None,
                &holder,
                now,
                &POLICY,
            );
            self.write(record);
            self.pending.push((Pending::First { id, deadlines }, host));
            return;
        };
        let tail_dc = self.dc_of(&tail);
        if tail_dc == dc {
            let out = self
                .record(&tail)
                .activate(None, &holder, now, &POLICY, None);
            if let Some(next) = out.next {
                self.write(next);
            }
            if let ActivateReply::Activated {
                token, deadlines, ..
            } = out.reply
            {
                self.grant(tail, token, host, deadlines);
            }
            return;
        }
        let tail_now = self.store_now(tail_dc);
        match self.record(&tail).view(tail_now, &POLICY, None) {
            RecordView::Tail(view)
                if stale_view || matches!(view.state, homing_core::TailState::Vacant { .. }) =>
            {
                let id = self.allocate(dc);
                let token = view.token.next();
                let (record, deadlines) = DcRecord::reserve(
                    id.clone(),
                    World::key(),
                    None,
                    token,
                    Some(homing_core::PreviousRun {
                        reservation: tail.clone(),
                        token: view.token,
                        ended: homing_core::ReleaseCause::Expired,
                    }),
                    &holder,
                    now,
                    &POLICY,
                );
                self.write(record);
                self.pending.push((
                    Pending::Link {
                        id,
                        deadlines,
                        tail,
                        expected: view.token,
                    },
                    host,
                ));
            }
            _ => {} // held elsewhere: connect returns that actor
        }
    }

    fn finish(&mut self, pending: Pending, host: usize) {
        let (id, deadlines, won) = match pending {
            Pending::First { id, deadlines } => {
                let won = self.global.is_none();
                if won {
                    self.global = Some(id.clone());
                }
                (id, deadlines, won)
            }
            Pending::Link {
                id,
                deadlines,
                tail,
                expected,
            } => {
                let tail_now = self.store_now(self.dc_of(&tail));
                let record = self.record(&tail);
                let out = record.link(&record.key, &id, expected, tail_now, &POLICY, None);
                if let Some(next) = out.next {
                    self.write(next);
                }
                (id, deadlines, out.reply == LinkReply::Linked)
            }
        };
        let record = self.record(&id).clone();
        if !won {
            if let Some(next) = record.abandon() {
                self.write(next);
            }
            return;
        }
        let RecordState::Active { .. } = record.state else {
            return; // its lease was reaped before the link landed: nobody to tell
        };
        // The host learns its deadlines only now; they were computed when its
        // DC wrote the record, so they may already be close or past.
        self.grant(id, record.token, host, deadlines);
    }

    fn renew(&mut self, n: usize) {
        let Some(h) = self.live_holder(n) else { return };
        let host_now = self.host_now(self.holders[h].host);
        if host_now >= self.holders[h].soft_terminate_at {
            // Past its soft deadline without a renewal the host stops.
            self.holders[h].stopped = true;
            return;
        }
        let (id, token) = (self.holders[h].id.clone(), self.holders[h].token);
        let now = self.store_now(self.dc_of(&id));
        let out = self.record(&id).renew(
            token,
            &lease_of(self.holders[h].host),
            host_now,
            now,
            &POLICY,
        );
        if let Some(next) = out.next {
            assert_eq!(next.token, token, "renew keeps the token");
            self.write(next);
        }
        match out.reply {
            RenewReply::Renewed(d) => {
                self.holders[h].hard_terminate_at = d.hard_terminate_at;
                self.holders[h].soft_terminate_at = d.soft_terminate_at;
            }
            RenewReply::StaleToken { .. } | RenewReply::Expired | RenewReply::NotHolder => {
                self.holders[h].stopped = true
            }
            RenewReply::Draining => {}
        }
    }

    fn check(&mut self) {
        // ≤ 1 holder acting, in true time, each judged by its own clock.
        let acting: Vec<&Holder> = self
            .holders
            .iter()
            .filter(|h| !h.stopped && self.host_now(h.host) < h.hard_terminate_at)
            .collect();
        assert!(acting.len() <= 1, "two holders act at once: {acting:?}");
        // The chain: acyclic, single tail, tokens strictly increasing, links immutable.
        if let Some(mut at) = self.global.clone() {
            let mut seen = vec![at.clone()];
            let mut token = self.record(&at).token;
            while let RecordState::Linked { to } = &self.record(&at).state {
                let to = to.clone();
                assert!(!seen.contains(&to), "chain cycles at {to}");
                let next_token = self.record(&to).token;
                assert!(
                    next_token > token,
                    "token does not increase along the chain"
                );
                assert_ne!(
                    self.record(&to).state,
                    RecordState::Abandoned,
                    "abandoned record in chain"
                );
                seen.push(to.clone());
                token = next_token;
                at = to;
            }
        }
        for dc in 0..DCS {
            for record in self.records[dc].values() {
                if let RecordState::Linked { to } = &record.state {
                    let before = self
                        .links_seen
                        .entry(record.id.clone())
                        .or_insert_with(|| to.clone());
                    assert_eq!(before, to, "link of {} changed", record.id);
                }
            }
        }
        for (from, to) in &self.links_seen {
            assert_eq!(
                self.record(from).state,
                RecordState::Linked { to: to.clone() },
                "link removed"
            );
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn lifecycle_invariants_hold_for_random_operation_sequences(
        store_offset_ms in prop::array::uniform3(0u64..10_000_000),
        host_offset_ms in prop::collection::vec(0u64..10_000_000, 1..5),
        ops in prop::collection::vec(op(), 1..200),
    ) {
        let mut world = World::new(store_offset_ms, host_offset_ms);
        for op in &ops {
            world.apply(op);
            world.check();
        }
    }
}

#[test]
fn recreate_racing_dcs_the_loser_is_abandoned() {
    let mut world = World::new([0, 5_000, 77], vec![3, 900_000]);
    world.apply(&Op::Begin { dc: 0 });
    world.apply(&Op::Finish { n: 0 });
    let first = world.holders[0].id.clone();
    world.apply(&Op::Release { n: 0 });
    world.apply(&Op::Begin { dc: 1 });
    world.apply(&Op::Begin { dc: 2 });
    world.apply(&Op::Finish { n: 0 });
    world.apply(&Op::Finish { n: 0 });
    world.check();
    assert_eq!(world.holders.len(), 2, "exactly one of the racing DCs won");
    let winner = world.holders[1].id.clone();
    assert_eq!(
        world.record(&first).state,
        RecordState::Linked { to: winner.clone() }
    );
    let abandoned = world
        .records
        .iter()
        .flat_map(|r| r.values())
        .filter(|r| r.state == RecordState::Abandoned)
        .count();
    assert_eq!(abandoned, 1);
    assert_eq!(world.holders[1].token, FencingToken::new(2));
}
