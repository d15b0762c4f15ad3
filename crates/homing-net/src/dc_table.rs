//! A caller's table of DCs and the homingd addresses serving each (several
//! homingd may serve one DC over a shared DC store), driving homing-core's
//! [`Reachability`] over a [`Client`]: which address a request to a DC goes
//! to, holding an address that gave no answer suspect, probing it in the
//! background until it answers, and sending a request once more to the DC's
//! next address when the first gave no answer. The Resolver and homingd's
//! peer client both ask their DCs through one of these.
//!
//! The table only grows ([`DcTable::add`]): a DC or a homingd learned from
//! the DC directory while the caller runs is appended, so every slot handed
//! out stays valid. An address that left the directory stays, suspect once
//! it stops answering.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, Weak};
use std::time::{Duration, Instant};

use homing_core::reachability::{
    AddrSlot, Change, DcSlot, ProbeSchedule, ProbeStep, Reachability, Route,
};
use homing_core::{DcId, Reply, Request, ReservationId};
use tracing::warn;

use crate::client::Client;
use crate::pool::Peer;

/// Why a DC gave no reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unanswered {
    /// Every address of the DC is suspect, the oldest since `since`: it was
    /// not asked.
    Suspect {
        /// When the DC's longest-standing suspicion began.
        since: Instant,
    },
    /// It was asked and no reply came (the reason, as text).
    Silent(String),
}

impl std::fmt::Display for Unanswered {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Unanswered::Suspect { since } => write!(
                f,
                "suspect (no answer for {} ms); not asked until a probe gets one",
                since.elapsed().as_millis()
            ),
            Unanswered::Silent(reason) => f.write_str(reason),
        }
    }
}

/// What the table counts (monotonic).
#[derive(Debug, Default)]
pub struct DcTableCounters {
    /// Addresses that became suspect.
    pub suspicions: AtomicU64,
    /// Suspect addresses that answered again.
    pub recoveries: AtomicU64,
    /// Probes sent to suspect addresses.
    pub probes: AtomicU64,
    /// Probes that got no answer.
    pub probes_failed: AtomicU64,
    /// Requests sent once more to another address of the same DC.
    pub failovers: AtomicU64,
}

/// Told of every change of an address between answering and suspect (to
/// log it and count it where the caller counts).
pub type OnChange = Box<dyn Fn(&Peer, &Change) + Send + Sync>;

/// The DC and address tables and their reachability, grown together.
struct Table {
    /// The DC table; a DC's place in it is its [`DcSlot`].
    dcs: Arc<[DcId]>,
    /// The address table; an address's place in it is its [`AddrSlot`].
    addrs: Vec<Arc<Peer>>,
    reach: Reachability,
}

impl Table {
    /// Appends `addr` of `dc` unless it is there, naming a new DC's slot in
    /// `names`; whether it was added.
    fn add(&mut self, names: &[OnceLock<DcId>], dc: &DcId, addr: SocketAddr) -> bool {
        if self.addrs.iter().any(|p| p.addr == addr && p.dc == *dc)
            || self.addrs.len() >= DC_TABLE_ADDRS_MAX
        {
            return false;
        }
        let slot = match self.dcs.iter().position(|d| d == dc) {
            Some(slot) => DcSlot(slot),
            None => {
                let Some(name) = names.get(self.dcs.len()) else {
                    return false;
                };
                // Set once: slots are only ever appended, under the lock.
                let _ = name.set(dc.clone());
                let mut dcs = self.dcs.to_vec();
                dcs.push(dc.clone());
                self.dcs = dcs.into();
                DcSlot(self.dcs.len() - 1)
            }
        };
        self.reach.add_addr(slot);
        self.addrs.push(Arc::new(Peer {
            addr,
            dc: dc.clone(),
        }));
        true
    }
}

/// The DCs a caller asks, with their addresses.
#[derive(Clone)]
pub struct DcTable {
    inner: Arc<Inner>,
}

/// Most addresses a table holds: past this, [`DcTable::add`] refuses.
pub const DC_TABLE_ADDRS_MAX: usize = 4096;
/// Most DCs a table holds (as many as a DC directory lists).
pub const DC_TABLE_DCS_MAX: usize = homing_core::directory::DIRECTORY_DCS_MAX;

struct Inner {
    client: Client,
    probe_timeout: Duration,
    /// The DCs, their addresses and which are suspect; locked briefly,
    /// never across an await.
    table: Mutex<Table>,
    /// Each DC's name by slot, set once when the DC is added (under the
    /// table's lock) and never moved: read without a lock, borrowed for as
    /// long as the table lives.
    names: Box<[OnceLock<DcId>]>,
    counters: DcTableCounters,
    on_change: OnChange,
    /// This table, for the probe loops it starts (which end when it is dropped).
    this: Weak<Inner>,
}

impl DcTable {
    /// A table of `addresses` (a DC listed several times has several
    /// homingd; DCs keep the order of their first listing), asked through
    /// `client`, each probe of a suspect address bounded by `probe_timeout`.
    /// `seed` draws the probes' jitter (pick it at random, so callers spread
    /// their probes).
    pub fn new(
        client: Client,
        addresses: &[(DcId, SocketAddr)],
        schedule: ProbeSchedule,
        probe_timeout: Duration,
        seed: u64,
        on_change: OnChange,
    ) -> DcTable {
        let mut table = Table {
            dcs: Arc::new([]),
            addrs: Vec::with_capacity(addresses.len()),
            reach: Reachability::new(schedule, &[], seed),
        };
        let names: Box<[OnceLock<DcId>]> = (0..DC_TABLE_DCS_MAX).map(|_| OnceLock::new()).collect();
        for (dc, addr) in addresses {
            table.add(&names, dc, *addr);
        }
        DcTable {
            inner: Arc::new_cyclic(|this| Inner {
                client,
                probe_timeout,
                table: Mutex::new(table),
                names,
                counters: DcTableCounters::default(),
                on_change,
                this: this.clone(),
            }),
        }
    }

    /// The DCs now, in table order (a DC's index is its [`DcSlot`]; the
    /// table only grows, so a slot of this list stays valid).
    pub fn dcs(&self) -> Arc<[DcId]> {
        self.inner.table().dcs.clone()
    }

    /// Every (DC, address) pair now, in table order.
    pub fn addresses(&self) -> Vec<(DcId, SocketAddr)> {
        let table = self.inner.table();
        table.addrs.iter().map(|p| (p.dc.clone(), p.addr)).collect()
    }

    /// `dc`'s place in the table, if it is there.
    pub fn slot(&self, dc: &DcId) -> Option<DcSlot> {
        self.inner
            .table()
            .dcs
            .iter()
            .position(|d| d == dc)
            .map(DcSlot)
    }

    /// The DC in `slot`, borrowed without a lock (what a cached answer
    /// names its DC by).
    pub fn dc(&self, slot: DcSlot) -> Option<&DcId> {
        self.inner.names.get(slot.0)?.get()
    }

    /// Adds `addr` of `dc` (a DC new to the table, or another homingd of
    /// one in it), healthy; whether it was added: not when it is there, or
    /// the table holds [`DC_TABLE_ADDRS_MAX`] addresses or
    /// [`DC_TABLE_DCS_MAX`] DCs (logged).
    pub fn add(&self, dc: &DcId, addr: SocketAddr) -> bool {
        let mut table = self.inner.table();
        let there = table.addrs.iter().any(|p| p.addr == addr && p.dc == *dc);
        let added = table.add(&self.inner.names, dc, addr);
        if !added && !there {
            warn!(%dc, %addr, addrs_max = DC_TABLE_ADDRS_MAX, dcs_max = DC_TABLE_DCS_MAX,
                "dc table full: address not added");
        }
        added
    }

    /// Whether every address of `dc` is suspect now; false for a DC not in
    /// the table.
    pub fn is_suspect(&self, dc: &DcId) -> bool {
        let table = self.inner.table();
        let slot = table.dcs.iter().position(|d| d == dc).map(DcSlot);
        slot.is_some_and(|slot| table.reach.dc_suspect(slot))
    }

    /// How many DCs have every address suspect now.
    pub fn dcs_suspect(&self) -> usize {
        self.inner.table().reach.dcs_suspect()
    }

    /// What the table counted so far.
    pub fn counters(&self) -> &DcTableCounters {
        &self.inner.counters
    }

    /// Sends `request` to the DC in `slot`, each address given `timeout`:
    /// to its first address not suspect; if that one gives no reply (it
    /// becomes suspect), once more to the DC's next address not suspect, if
    /// it has one. A request the first address may have processed is then
    /// processed twice at most, as a caller's own retry would be: every
    /// homing request is safe to repeat (reads, compare-and-sets, acquires
    /// under one lease key).
    ///
    /// # Panics
    /// If `slot` is not of this table (slots come from it).
    pub async fn ask(
        &self,
        slot: DcSlot,
        request: &Request,
        timeout: Duration,
    ) -> Result<Reply, Unanswered> {
        let inner = &self.inner;
        let first = inner.route(slot)?;
        match inner.send(first, request, timeout).await {
            Ok(reply) => Ok(reply),
            Err(silent) => match inner.route(slot) {
                Ok(next) if next != first => {
                    inner.counters.failovers.fetch_add(1, Ordering::Relaxed);
                    inner
                        .send(next, request, timeout)
                        .await
                        .map_err(Unanswered::Silent)
                }
                _ => Err(Unanswered::Silent(silent)),
            },
        }
    }
}

impl Inner {
    fn table(&self) -> MutexGuard<'_, Table> {
        // Each method updates the state in one step: a panic elsewhere while
        // it was locked left it consistent.
        crate::lock(&self.table)
    }

    fn route(&self, slot: DcSlot) -> Result<AddrSlot, Unanswered> {
        match self.table().reach.route(slot) {
            Route::Ask(addr) => Ok(addr),
            Route::Suspect { since } => Err(Unanswered::Suspect { since }),
        }
    }

    /// Sends `request` to `addr` within `timeout` and tells the
    /// reachability what came of it: any reply is an answer; a timeout or a
    /// failed connection is a failure. Errors are the reason, as text.
    async fn send(
        &self,
        addr: AddrSlot,
        request: &Request,
        timeout: Duration,
    ) -> Result<Reply, String> {
        let peer = self.peer(addr);
        let (outcome, reached) =
            match tokio::time::timeout(timeout, self.client.request(&peer, request)).await {
                Err(_) => (
                    Err(format!(
                        "no answer from {} within {} ms",
                        peer.addr,
                        timeout.as_millis()
                    )),
                    Some(false),
                ),
                Ok(Err(e)) => (Err(e.to_string()), e.reached_peer()),
                Ok(Ok(reply)) => (Ok(reply), Some(true)),
            };
        let now = Instant::now();
        let change = match reached {
            Some(true) => self.table().reach.handle_answer(addr, now),
            Some(false) => self.table().reach.handle_failure(addr, now),
            None => None,
        };
        if let Some(change) = change {
            self.changed(change);
        }
        outcome
    }

    fn peer(&self, addr: AddrSlot) -> Arc<Peer> {
        self.table().addrs[addr.0].clone()
    }

    /// Counts a transition, tells the caller once, and starts the probe
    /// loop of a new suspicion.
    fn changed(&self, change: Change) {
        let counter = if change.suspect {
            &self.counters.suspicions
        } else {
            &self.counters.recoveries
        };
        counter.fetch_add(1, Ordering::Relaxed);
        (self.on_change)(&self.peer(change.addr), &change);
        if change.suspect {
            tokio::spawn(probe_loop(self.this.clone(), change.addr, change.epoch));
        }
    }
}

/// Probes a suspect address until it answers (or the table is gone), when
/// [`Reachability::poll_probe`] says, with a request that cannot change
/// anything: reservation 0 of the address's DC (any reply is an answer,
/// even "unknown reservation").
async fn probe_loop(table: Weak<Inner>, addr: AddrSlot, epoch: u64) {
    loop {
        let Some(inner) = table.upgrade() else {
            return;
        };
        let step = inner.table().reach.poll_probe(addr, epoch, Instant::now());
        match step {
            ProbeStep::Stop => return,
            ProbeStep::WaitUntil(at) => {
                drop(inner);
                tokio::time::sleep_until(tokio::time::Instant::from_std(at)).await;
            }
            ProbeStep::Send => {
                inner.counters.probes.fetch_add(1, Ordering::Relaxed);
                let probe = Request::ResolveReservation {
                    id: ReservationId::new(inner.peer(addr).dc.clone(), 0),
                };
                // An answer is reported (and clears the suspicion) inside `send`.
                let answered = inner.send(addr, &probe, inner.probe_timeout).await.is_ok();
                if !answered {
                    inner.counters.probes_failed.fetch_add(1, Ordering::Relaxed);
                }
                let now = Instant::now();
                let change = inner.table().reach.handle_probe(addr, epoch, answered, now);
                if let Some(change) = change {
                    inner.changed(change);
                }
            }
        }
    }
}
