//! What a DC's handlers take from the rest of the simulation: the DC
//! context ([`DcCtx`]), the DC's peers as it may read them, and every DC
//! as the checker reads them while one of them handles an event.

use std::collections::BTreeMap;

use homing_core::{DcId, LeasePolicy};
use homing_node::{NodeTime, Now};
use homing_store::memory::MemoryDc;

use super::{Dc, Instance};
use crate::checker::Checker;
use crate::clock::NodeClock;
use crate::event::{Homingd, NodeId};
use crate::global::GlobalStore;
use crate::invariants::DcsView;
use crate::keys::Keys;
use crate::report::Measurements;
use crate::rules::Rules;
use crate::scenario::Scenario;
use crate::world::World;

/// What a DC's handlers take from the rest of the simulation: the DC
/// itself (the actor), what it may read of the other DCs, the shared
/// world, the global store, the run's keys, the checker and measurements
/// it reports to, and the run's settings. Its handlers (`impl DcCtx`
/// across `dc/`) are the DC's event handling; `Sim::on_dc` builds one for
/// the DC an event concerns.
///
/// The DC reports to the checker directly, not through an
/// [`crate::observe::Observer`] as routers and hosts do: the checks a DC
/// triggers (a commit, a global write, a restart) judge every DC's
/// records at that instant, its own included, so it builds the checker's
/// [`crate::invariants::View`] itself from its own state and its peers' (`dc_view!`).
pub(crate) struct DcCtx<'a> {
    /// The DC that handles the event (its instances taken out).
    pub(crate) dc: &'a mut Dc,
    /// The DC's homingd that handles it.
    pub(crate) inst: &'a mut Instance,
    /// The other DCs, read only.
    pub(crate) peers: Peers<'a>,
    /// Time, the queue, the network, the rng.
    pub(crate) world: &'a mut World,
    /// The global store.
    pub(crate) global: &'a mut GlobalStore,
    /// The run's keys, numbered.
    pub(crate) keys: &'a mut Keys,
    /// The invariant checkers.
    pub(crate) checker: &'a mut Checker,
    /// Latency samples and counters.
    pub(crate) measurements: &'a mut Measurements,
    /// The scenario: store latencies, network timeouts.
    pub(crate) scenario: &'a Scenario,
    /// The lease policy every DC applies.
    pub(crate) policy: LeasePolicy,
    /// The rules it runs (some broken on purpose by tests).
    pub(crate) rules: Rules,
}

/// The DCs other than the one handling an event, as it may read them
/// (never change them): those of lower and higher index, and every DC's
/// index by name.
pub(crate) struct Peers<'a> {
    /// The DCs of lower index.
    pub(crate) before: &'a [Dc],
    /// The DCs of higher index.
    pub(crate) after: &'a [Dc],
    /// Each DC's index by name.
    pub(crate) index: &'a BTreeMap<DcId, u16>,
}

/// Every DC while one of them handles an event: that one and its peers,
/// in index order.
#[derive(Clone, Copy)]
pub(crate) struct AllDcs<'a> {
    /// The DCs of lower index.
    pub(crate) before: &'a [Dc],
    /// The DC that handles the event.
    pub(crate) dc: &'a Dc,
    /// The DCs of higher index.
    pub(crate) after: &'a [Dc],
}

impl<'a> AllDcs<'a> {
    /// DC `d`.
    pub(crate) fn get(self, d: usize) -> &'a Dc {
        match d.cmp(&self.before.len()) {
            std::cmp::Ordering::Less => &self.before[d],
            std::cmp::Ordering::Equal => self.dc,
            std::cmp::Ordering::Greater => &self.after[d - self.before.len() - 1],
        }
    }

    /// Every DC, in index order.
    pub(crate) fn iter(self) -> impl Iterator<Item = &'a Dc> {
        (self.before.iter())
            .chain(std::iter::once(self.dc))
            .chain(self.after)
    }
}

/// Every DC, as the checkers read them while one DC handles an event.
impl DcsView for AllDcs<'_> {
    fn store(&self, d: usize) -> &MemoryDc {
        &self.get(d).store
    }

    fn up(&self, d: usize) -> bool {
        self.get(d).up
    }

    fn clock(&self, d: usize) -> NodeClock {
        self.get(d).clock
    }
}

/// The checker's view from the DC context `$ctx`: a macro, so that the
/// checker (a field beside these) stays borrowable mutably in the same call.
macro_rules! dc_view {
    ($ctx:expr) => {
        $crate::invariants::View {
            dcs: &$crate::dc::ctx::AllDcs {
                before: $ctx.peers.before,
                dc: &*$ctx.dc,
                after: $ctx.peers.after,
            },
            global: $ctx.global.entries(),
            keys: $ctx.keys.all(),
            dc_index: $ctx.peers.index,
            successions: $ctx.global.successions(),
        }
    };
}
pub(crate) use dc_view;

impl DcCtx<'_> {
    /// This DC's index.
    pub(crate) fn d(&self) -> usize {
        usize::from(self.dc.idx)
    }

    /// The homingd that handles the event.
    pub(crate) fn addr(&self) -> Homingd {
        self.inst.addr
    }

    /// This homingd as a node of the network.
    pub(crate) fn me(&self) -> NodeId {
        NodeId::Dc(self.inst.addr)
    }

    /// Every DC, this one included.
    pub(crate) fn all_dcs(&self) -> AllDcs<'_> {
        AllDcs {
            before: self.peers.before,
            dc: self.dc,
            after: self.peers.after,
        }
    }

    /// The homingd of peer DC `to` this one sends to: the one it last
    /// heard from, or the next after one that gave no answer.
    pub(crate) fn peer_homingd(&self, to: u16) -> Homingd {
        Homingd::new(to, self.inst.peer_at.get(&to).copied().unwrap_or(0))
    }

    /// Peer homingd `to` gave no answer: this one sends to the DC's next
    /// homingd from now on (as homingd's peer client fails over to the
    /// DC's next address).
    pub(crate) fn peer_silent(&mut self, to: Homingd) {
        let n = self.dc_at(to.d()).instances();
        if n > 1 && self.peer_homingd(to.dc()) == to {
            self.inst.peer_at.insert(to.dc(), (to.instance() + 1) % n);
        }
    }

    /// Whether homingd `h` runs (of this DC: whether the DC does — a
    /// homingd never sends to its siblings).
    pub(crate) fn homingd_up(&self, h: Homingd) -> bool {
        if h.dc() == self.dc.idx {
            return self.dc.up;
        }
        self.dc_at(h.d()).instances[usize::from(h.instance())].up
    }

    /// DC `d`: this one or a peer.
    pub(crate) fn dc_at(&self, d: usize) -> &Dc {
        self.all_dcs().get(d)
    }

    /// The DC's node clock now: its local clock, µs.
    pub(crate) fn node_now(&self) -> NodeTime {
        NodeTime::from_us(self.dc.clock.local_us(self.world.now))
    }

    /// Both clocks of the DC now.
    pub(crate) fn now(&self) -> Now {
        Now {
            node: self.node_now(),
            store: self.dc.clock.store_time(self.world.now),
        }
    }
}
