//! An in-memory multi-DC world that drives homing-core's steppers the way
//! homingd does, with maps for stores and function calls for the network.
//! Shared by the walkthrough example and the connect tests.

#![allow(dead_code)] // each user takes the parts it needs

use std::collections::{BTreeMap, BTreeSet};

use homing_core::{
    ChainNeed, ChainPoll, ChainWalk, Connect, ConnectNeed, ConnectPoll, DcId, DcLeaseState,
    DcRecord, DcStanding, FencingToken, Key, LeasePolicy, LinkReply, LocalSegment, ReleaseReply,
    ReservationId, Segment, SegmentError, Source, StoreTime, Succession, TakeOverReply,
    TakeoverPolicy, Written, chain::HOP_LIMIT_DEFAULT,
};

/// One DC: its records and its allocator.
#[derive(Default)]
pub struct Dc {
    pub records: BTreeMap<ReservationId, DcRecord>,
    next_unique: u64,
}

/// Every DC's store, the global store, one clock, and a round-trip counter.
pub struct World {
    pub dcs: BTreeMap<DcId, Dc>,
    pub global: BTreeMap<Key, ReservationId>,
    /// The global store's successions, by the reservation succeeded.
    pub successions: BTreeMap<ReservationId, Succession>,
    /// How the global store judges each DC's lease (absent: live).
    pub dc_leases: BTreeMap<DcId, DcLeaseState>,
    /// DCs that do not answer other DCs.
    pub down: BTreeSet<DcId>,
    pub now_ms: u64,
    pub policy: LeasePolicy,
    /// Messages that crossed between DCs (each a round trip).
    pub round_trips: u32,
}

impl World {
    pub fn new(dcs: &[&str]) -> World {
        World {
            dcs: dcs
                .iter()
                .map(|d| (DcId::new(*d).unwrap(), Dc::default()))
                .collect(),
            global: BTreeMap::new(),
            successions: BTreeMap::new(),
            dc_leases: BTreeMap::new(),
            down: BTreeSet::new(),
            now_ms: 1_000,
            policy: LeasePolicy::DEFAULT,
            round_trips: 0,
        }
    }

    /// The global store's view of `dc`'s lease.
    pub fn dc_lease(&self, dc: &DcId) -> DcLeaseState {
        self.dc_leases.get(dc).cloned().unwrap_or(DcLeaseState {
            standing: DcStanding::Live {
                remaining_ms: 10_000,
            },
            ..DcLeaseState::unknown(dc.clone())
        })
    }

    pub fn now(&self) -> StoreTime {
        StoreTime::from_ms(self.now_ms)
    }

    pub fn record(&self, id: &ReservationId) -> Option<&DcRecord> {
        self.dcs.get(id.dc())?.records.get(id)
    }

    /// Compare-and-set, as every store backend implements it.
    pub fn write(&mut self, expected: Option<u64>, record: DcRecord) -> Written {
        let dc = self.dcs.get_mut(record.id.dc()).expect("known dc");
        if dc.records.get(&record.id).map(|r| r.version) != expected {
            return Written::Conflict;
        }
        dc.records.insert(record.id.clone(), record);
        Written::Yes
    }

    /// What `id`'s DC answers to `ResolveReservation`.
    pub fn segment(&self, id: &ReservationId) -> Result<Segment, SegmentError> {
        let mut segment = LocalSegment::new(id.dc().clone(), id.clone(), HOP_LIMIT_DEFAULT);
        while let Some(at) = segment.need().cloned() {
            segment.handle(self.record(&at), self.now(), &self.policy, None)?;
        }
        Ok(segment.finish())
    }

    /// A new unique from `dc`'s allocator.
    pub fn allocate(&mut self, dc: &DcId) -> u64 {
        let dc = self.dcs.get_mut(dc).expect("known dc");
        dc.next_unique += 1;
        dc.next_unique
    }

    /// The global store's set-if-absent: `None` if `id` became the entry,
    /// else the entry the key had.
    pub fn set_if_absent(&mut self, key: Key, id: ReservationId) -> Option<ReservationId> {
        let existing = self.global.get(&key).cloned();
        if existing.is_none() {
            self.global.insert(key, id);
        }
        existing
    }

    /// The global store's confirm: `succession` unless its reservation
    /// already has one, which is answered instead.
    pub fn confirm(&mut self, succession: Succession) -> Succession {
        let from = succession.link.from.clone();
        self.successions.entry(from).or_insert(succession).clone()
    }

    /// The global store's takeover of a silent DC's tail, judged as every
    /// backend judges it.
    pub fn take_over(&mut self, succession: Succession, policy: TakeoverPolicy) -> TakeOverReply {
        let state = self.dc_lease(succession.link.from.dc());
        let existing = self.successions.get(&succession.link.from).cloned();
        let judged = homing_core::succession::judge_takeover(existing, state, policy, &succession);
        judged.unwrap_or_else(|| {
            self.successions
                .insert(succession.link.from.clone(), succession);
            TakeOverReply::Taken
        })
    }

    /// `from`'s DC links it to `to` if its token is still `expected_token`
    /// (one round trip).
    pub fn link(
        &mut self,
        key: &Key,
        from: &ReservationId,
        to: ReservationId,
        expected_token: FencingToken,
    ) -> LinkReply {
        self.round_trips += 1;
        let tail = self.record(from).expect("tail exists").clone();
        let out = tail.link(key, &to, expected_token, self.now(), &self.policy, None);
        if let Some(next) = out.next {
            assert_eq!(self.write(Some(tail.version), next), Written::Yes);
        }
        out.reply
    }

    /// Performs the connect's next need on behalf of DC `local`.
    /// Returns false once the connect is finished.
    pub fn step(&mut self, local: &DcId, connect: &mut Connect) -> bool {
        let ConnectPoll::Need(need) = connect.poll() else {
            return false;
        };
        match need {
            ConnectNeed::GlobalEntry(key) => {
                connect.handle_global(self.global.get(&key).cloned(), Source::Local)
            }
            ConnectNeed::Reservation(id) if self.down.contains(id.dc()) && id.dc() != local => {
                assert!(
                    connect.handle_unreachable(),
                    "a remote DC's silence is the connect's"
                );
            }
            ConnectNeed::Successor(id) => {
                connect.handle_successor(self.successions.get(&id).cloned(), None, Source::Local)
            }
            ConnectNeed::DcLease(dc) => connect.handle_dc_lease(self.dc_lease(&dc)),
            ConnectNeed::Confirm(succession) => connect.handle_confirmed(self.confirm(succession)),
            ConnectNeed::TakeOver { succession, policy } => {
                connect.handle_taken_over(self.take_over(succession, policy));
            }
            ConnectNeed::Reservation(id) => {
                let source = Source::of_dc(local, id.dc());
                if source == Source::Remote {
                    self.round_trips += 1;
                }
                let segment = self.segment(&id).expect("reservations in chains answer");
                connect.handle_segment(&id.dc().clone(), segment, source);
            }
            ConnectNeed::LocalRecord(id) => {
                let record = self.record(&id).cloned();
                connect.handle_local_record(record.map(homing_core::RecordRead::alone), self.now());
            }
            ConnectNeed::Allocate => {
                let unique = self.allocate(local);
                connect.handle_allocated(unique, self.now());
            }
            ConnectNeed::Write { expected, record } => {
                let written = self.write(expected, record);
                connect.handle_written(written);
            }
            ConnectNeed::SetIfAbsent { key, id } => {
                connect.handle_set_if_absent(self.set_if_absent(key, id));
            }
            ConnectNeed::Link {
                key,
                from,
                to,
                expected_token,
            } => connect.handle_link(self.link(&key, &from, to, expected_token)),
        }
        true
    }

    /// Runs a connect to its end.
    pub fn run(&mut self, local: &DcId, connect: &mut Connect) -> ConnectPoll {
        for _ in 0..1_000 {
            if !self.step(local, connect) {
                return connect.poll();
            }
        }
        panic!("connect did not finish in 1000 steps");
    }

    /// A router attached to `router_dc` resolves `key`: the global read is
    /// local, every DC other than the router's costs one round trip.
    pub fn resolve(&mut self, router_dc: &DcId, key: &Key) -> ChainPoll {
        let mut walk = ChainWalk::from_key(key.clone(), HOP_LIMIT_DEFAULT);
        loop {
            match walk.poll().clone() {
                ChainPoll::Need(ChainNeed::GlobalEntry(key)) => {
                    walk.handle_global(self.global.get(&key).cloned(), Source::Local)
                        .ok();
                }
                ChainPoll::Need(ChainNeed::Reservation(id)) => {
                    let source = Source::of_dc(router_dc, id.dc());
                    match self.segment(&id) {
                        Ok(segment) => {
                            walk.handle_segment(&id.dc().clone(), segment, source).ok();
                        }
                        Err(e) => panic!("{e}"),
                    }
                }
                done => return done,
            }
        }
    }

    /// The holder of `id` releases it (with its lease key: its actor's).
    pub fn release(&mut self, id: &ReservationId, token: FencingToken) -> ReleaseReply {
        let record = self.record(id).expect("record").clone();
        let homing_core::RecordState::Active { actor, .. } = &record.state else {
            panic!("{id} has no holder to release it");
        };
        let out = record.release(
            token,
            &lease_of(actor),
            homing_core::RunOutcome::Ok,
            self.now(),
        );
        if let Some(next) = out.next {
            self.write(Some(record.version), next);
        }
        out.reply
    }
}

/// A lease key per actor: a stand-in for the random bits a host draws.
pub fn lease_of(actor: &homing_core::ActorId) -> homing_core::LeaseKey {
    let mut bytes = [0x5A; 16];
    for (i, b) in actor.as_str().bytes().enumerate() {
        bytes[i % 16] ^= b.rotate_left((i / 16) as u32);
    }
    homing_core::LeaseKey::from_bytes(bytes).expect("not all zeros")
}
