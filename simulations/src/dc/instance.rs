//! One homingd of a simulated DC: what each process of the DC holds for
//! itself (homing-node's endpoint, its tasks, waiters, parked watches, its
//! run of the DC lease, its log follower) and loses in its own crash, while
//! the DC's store is shared by all of them (OPERATIONS "Several homingd
//! per DC").

use std::collections::{BTreeMap, BTreeSet};

use homing_core::{AwaitReply, LeasePolicy, Mutations};
use homing_node::{Endpoint, EndpointConfig, LogFollower, Upkeep};

use super::lease::DcLeaseDriver;
use super::task::Task;
use crate::event::{Homingd, NodeId};

/// One homingd of a DC.
#[derive(Debug)]
pub struct Instance {
    /// Which homingd it is.
    pub addr: Homingd,
    /// Whether it runs.
    pub up: bool,
    /// Bumped by every crash: voids store operations started before it.
    pub epoch: u32,
    /// When it last (re)started, true µs.
    pub up_since_us: u64,
    /// When it last crashed, true µs.
    pub down_since_us: u64,
    /// Volatile: the DC as homing-node's endpoint — dispatch, retried
    /// acquires, cancellations, its memory of the global store, key-quota
    /// counts — as homingd's node keeps it (a joined retry is answered to
    /// its client, RPC and trace key).
    pub(crate) endpoint: Endpoint<(NodeId, u64, u32), u64>,
    pub(crate) tasks: BTreeMap<u64, Box<Task>>,
    /// Volatile: its requests to peers in flight: RPC → (task, the peer's
    /// homingd).
    pub(crate) peer_rpcs: BTreeMap<u64, (u64, Homingd)>,
    /// Volatile: its pending `Await` requests to other DCs (RPC → the
    /// peer's homingd).
    pub(crate) await_rpcs: BTreeMap<u64, Homingd>,
    /// Volatile: the upkeep pass and the proofs it remembers (`None`
    /// while a pass runs: its task holds it).
    pub(crate) upkeep: Option<Upkeep>,
    /// Volatile: since when it shuts down gracefully (true µs), if it does
    /// (whether it does is its endpoint's: `Endpoint::closing`).
    pub(crate) closing_since: Option<u64>,
    /// Volatile: watches parked until the event log moves.
    pub(crate) watches: BTreeSet<u64>,
    /// Wake-ups handed to waiter tasks, taken at their next select point.
    pub(crate) woken: BTreeMap<u64, AwaitReply>,
    /// Volatile: the DC lease as this homingd holds it.
    pub(crate) lease: DcLeaseDriver,
    /// Volatile: where it is in the DC store's event log (followed only
    /// when the DC runs several homingd: one learns of its own writes as
    /// it makes them).
    pub(crate) follower: LogFollower,
    /// Volatile: which homingd of each peer DC it sends to (missing:
    /// the first).
    pub(crate) peer_at: BTreeMap<u16, u8>,
    pub(crate) next_task: u64,
}

impl Instance {
    /// A running homingd `addr` with a fresh endpoint (its waiters
    /// included), its upkeep `upkeep`.
    pub(crate) fn new(addr: Homingd, upkeep: Upkeep, endpoint: &EndpointConfig) -> Instance {
        let (policy, mutations): (LeasePolicy, Mutations) =
            (endpoint.node.policy, endpoint.node.mutations);
        Instance {
            addr,
            up: true,
            epoch: 0,
            up_since_us: 0,
            down_since_us: 0,
            endpoint: Endpoint::new(endpoint.clone()),
            tasks: BTreeMap::new(),
            peer_rpcs: BTreeMap::new(),
            await_rpcs: BTreeMap::new(),
            upkeep: Some(upkeep),
            closing_since: None,
            watches: BTreeSet::new(),
            woken: BTreeMap::new(),
            lease: DcLeaseDriver::new(&policy, mutations),
            follower: LogFollower::new(),
            peer_at: BTreeMap::new(),
            next_task: 0,
        }
    }
}
