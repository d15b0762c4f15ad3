//! Drives this DC's lease in the global store (homing-node's [`DcLease`]
//! decides; DESIGN.md §7.5): the start-up checks against what the global
//! store keeps about the DC, the renewal loop, and the wait of a write whose
//! record needs higher marks published first.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use homing_core::{DcId, DcLeaseState, DcRecord, DcTerms};
use homing_node::dc::dc_lease::MARKS_WAIT_MS;
use homing_node::dc::dc_lease::RENEW_RETRY_MS;
use homing_node::{DcLease, DcLeaseChange, DcLeasePoll, NodeTime, StartCheck, start_check};
use homing_store::{DcStore, GlobalStore, StoreError};
use thiserror::Error;
use tokio::sync::{Notify, watch};

use crate::DaemonError;
use crate::metrics::Metrics;

/// The least time one renewal (or the late start-up check) may take before
/// it counts as failed.
pub const RENEW_TIMEOUT_MIN: Duration = Duration::from_secs(3);

/// Why homingd refuses to serve a DC, from what the global store keeps about it.
#[derive(Debug, Error)]
pub enum Refusal {
    /// An operator retired the DC.
    #[error(
        "dc {dc} was retired (`homing dc retire`): the global store refuses its lease for good and other DCs may take over its keys; serve this store under a new dc id instead"
    )]
    Retired {
        /// The DC.
        dc: DcId,
    },
    /// The DC store's event log is behind the head the DC published.
    #[error(
        "the dc store of {dc} is older than what {dc} already published: its event log ends at {store_head}, but {dc} published event {published} to the global store. The store was restored from a backup: records written after it are lost, and a key re-activated since could be granted again from its older record. Serve it under a new dc id, or start homingd once with --start-above-floor to serve it as it is"
    )]
    EventsBehind {
        /// The DC.
        dc: DcId,
        /// The DC store's event-log head.
        store_head: u64,
        /// The head in the global store.
        published: u64,
    },
    /// The DC store's allocator is below the floor the DC published.
    #[error(
        "the dc store of {dc} is behind what {dc} already handed out: its allocator bound is {store_floor}, but {dc} published {published} to the global store. The store was wiped or restored from an old backup, and reservation IDs up to {published} name existing reservations. Serve it under a new dc id, or start homingd once with --start-above-floor to continue above {published} (the old reservations this store no longer holds can then only be taken over by other DCs)"
    )]
    BelowFloor {
        /// The DC.
        dc: DcId,
        /// The DC store's allocator bound.
        store_floor: u64,
        /// The floor in the global store.
        published: u64,
    },
}

/// The DC lease of a running node, shared by its requests and the renewal loop.
pub struct DcLeaseCell {
    lease: Mutex<DcLease>,
    /// Bumped after every renewal answer: writes waiting for marks look again.
    answered: watch::Sender<u64>,
    /// Wakes the renewal loop when a write wants marks published.
    wake: Notify,
    /// The start-up check, when the global store did not answer it at start
    /// (`Some(start_above_floor)`): the renewal loop does it first.
    unchecked: Mutex<Option<bool>>,
}

impl homing_node::LeaseLender for &DcLeaseCell {
    fn lend<T>(self, f: impl FnOnce(&DcLease) -> T) -> T {
        self.with(|lease| f(lease))
    }
}

impl DcLeaseCell {
    /// Runs `f` on the lease.
    pub fn with<T>(&self, f: impl FnOnce(&mut DcLease) -> T) -> T {
        f(&mut self
            .lease
            .lock()
            .expect("the dc lease lock is never poisoned"))
    }

    /// Changes after every renewal answer.
    pub fn answered(&self) -> watch::Receiver<u64> {
        self.answered.subscribe()
    }

    fn unchecked(&self) -> Option<bool> {
        *self.unchecked.lock().expect("never poisoned")
    }
}

/// The DC store's event-log head: the last event ever appended.
async fn event_head(records: &dyn DcStore) -> Result<u64, StoreError> {
    Ok(records.events(u64::MAX, 0).await?.head)
}

/// Checks what the global store keeps about `dc` (`state`) against the DC
/// store, as homing-node's [`start_check`] decides, raising the store's
/// allocator to the published floor if the operator said so; the store's
/// allocator bound and event-log head to publish.
async fn check(
    dc: &DcId,
    state: &DcLeaseState,
    records: &dyn DcStore,
    start_above_floor: bool,
) -> Result<(u64, u64), DaemonError> {
    let store = |source| DaemonError::Store {
        which: "dc",
        source,
    };
    loop {
        let store_floor = records.allocator_floor().await.map_err(store)?;
        let store_head = event_head(records).await.map_err(store)?;
        let decided = start_check(
            &state.marks,
            state.retired,
            store_floor,
            store_head,
            start_above_floor,
        );
        match decided {
            StartCheck::Serve => {
                if store_head < state.marks.event_head {
                    tracing::warn!(dc = %dc, store_head, published = state.marks.event_head, "dc store's event log is behind what the dc published (--start-above-floor): served as it is");
                }
                return Ok((store_floor, store_head));
            }
            StartCheck::Retired => return Err(Refusal::Retired { dc: dc.clone() }.into()),
            StartCheck::BelowFloor {
                store_floor,
                published,
            } => {
                return Err(Refusal::BelowFloor {
                    dc: dc.clone(),
                    store_floor,
                    published,
                }
                .into());
            }
            StartCheck::EventsBehind {
                store_head,
                published,
            } => {
                return Err(Refusal::EventsBehind {
                    dc: dc.clone(),
                    store_head,
                    published,
                }
                .into());
            }
            StartCheck::RaiseAllocator { to } => {
                records.raise_allocator(to).await.map_err(store)?;
                tracing::warn!(dc = %dc, store_floor, published = to, "dc store allocator raised to the published floor (--start-above-floor): reservations below it that this store does not hold can only be taken over");
            }
        }
    }
}

/// The DC's lease, not yet renewed, after checking what the global store
/// keeps about the DC against its store (a refusal is an error). A global
/// store that cannot be reached now leaves the check to the renewal loop:
/// nothing is granted or written until it passes.
pub async fn open(
    dc: &DcId,
    global: &dyn GlobalStore,
    records: &dyn DcStore,
    terms: DcTerms,
    renew_every_ms: u64,
    start_above_floor: bool,
) -> Result<DcLeaseCell, DaemonError> {
    let mut lease = DcLease::new(terms, renew_every_ms);
    let unchecked = match global.dc_lease(dc).await {
        Ok(state) => {
            let (store_floor, store_head) = check(dc, &state, records, start_above_floor).await?;
            lease.checked(state.marks, store_floor, store_head);
            None
        }
        Err(e @ StoreError::Unavailable { .. }) => {
            tracing::warn!(dc = %dc, error = %e, "global store unreachable at start: the dc's marks are checked once it answers; until then no host lease is granted and no record written");
            Some(start_above_floor)
        }
        Err(source) => {
            return Err(DaemonError::Store {
                which: "global",
                source,
            });
        }
    };
    Ok(DcLeaseCell {
        lease: Mutex::new(lease),
        answered: watch::Sender::new(0),
        wake: Notify::new(),
        unchecked: Mutex::new(unchecked),
    })
}

/// The node clock and the lease's neighbours the loop needs.
pub struct Renewer {
    /// The DC.
    pub dc: DcId,
    /// The lease.
    pub cell: Arc<DcLeaseCell>,
    /// Where the lease lives.
    pub global: Arc<dyn GlobalStore>,
    /// The DC store (for a start-up check the global store could not answer at start).
    pub records: Arc<dyn DcStore>,
    /// The node's clock.
    pub now: Arc<dyn Fn() -> NodeTime + Send + Sync>,
    /// The node clock's reading as a tokio instant.
    pub instant: Arc<dyn Fn(NodeTime) -> tokio::time::Instant + Send + Sync>,
    /// Where renewals are counted.
    pub metrics: Arc<Metrics>,
}

impl Renewer {
    /// Sends one renewal if one is due; whether one was sent. Each send is
    /// bounded by the renewal period.
    pub async fn renew_if_due(&self, timeout: Duration) -> bool {
        if let Some(start_above_floor) = self.cell.unchecked() {
            self.check_late(start_above_floor, timeout).await;
            return true;
        }
        let sent = (self.now)();
        let DcLeasePoll::Renew { terms, marks } = self.cell.with(|l| l.poll(sent)) else {
            return false;
        };
        let renewal = self.global.renew_dc_lease(&self.dc, &terms, &marks);
        let answer = tokio::time::timeout(timeout, renewal).await;
        let now = (self.now)();
        let change = match answer {
            Ok(Ok(renewal)) => {
                self.metrics.dc_lease_renewal(true);
                self.cell.with(|l| l.handle_renewed(sent, renewal, now))
            }
            Ok(Err(e)) => {
                tracing::debug!(dc = %self.dc, error = %e, "dc lease renewal failed");
                self.metrics.dc_lease_renewal(false);
                self.cell.with(|l| l.handle_failed(now))
            }
            Err(_) => {
                tracing::debug!(dc = %self.dc, "dc lease renewal timed out");
                self.metrics.dc_lease_renewal(false);
                self.cell.with(|l| l.handle_failed(now))
            }
        };
        // The store's event head rides on the next renewal: read once per
        // renewal sent, not per look at the lease (a failed read only leaves
        // the published head one renewal further behind).
        if let Ok(head) = event_head(self.records.as_ref()).await {
            self.cell.with(|l| l.note_event_head(head));
        }
        let valid_ms = self.cell.with(|l| l.valid_for_ms(now));
        self.metrics.dc_lease_valid_ms(valid_ms);
        match change {
            DcLeaseChange::Same => {}
            DcLeaseChange::Regained => {
                tracing::info!(dc = %self.dc, valid_ms, "dc lease held: host leases may be granted")
            }
            DcLeaseChange::Lost => tracing::warn!(
                dc = %self.dc,
                "dc lease ran out (the global store acknowledged no renewal in time): no host lease is granted or renewed until it is renewed, and hosts stop by their deadlines"
            ),
            DcLeaseChange::Retired => tracing::error!(
                dc = %self.dc,
                "dc retired: the global store refused its lease for good; no host lease is granted or renewed"
            ),
        }
        self.cell.answered.send_modify(|n| *n = n.wrapping_add(1));
        true
    }

    /// The start-up check the global store could not answer at start: a
    /// refusal stops the lease for good (logged); a store still unreachable
    /// is asked again after a pause.
    async fn check_late(&self, start_above_floor: bool, timeout: Duration) {
        let read = tokio::time::timeout(timeout, self.global.dc_lease(&self.dc)).await;
        let state = match read {
            Ok(Ok(state)) => state,
            failed => {
                let error = match failed {
                    Ok(Err(e)) => e.to_string(),
                    _ => format!("no answer within {} ms", timeout.as_millis()),
                };
                tracing::info!(dc = %self.dc, error, "global store still unreachable: the dc's start-up check waits for it");
                tokio::time::sleep(Duration::from_millis(RENEW_RETRY_MS)).await;
                return;
            }
        };
        match check(&self.dc, &state, self.records.as_ref(), start_above_floor).await {
            Ok((floor, head)) => self.cell.with(|l| l.checked(state.marks, floor, head)),
            Err(refusal @ DaemonError::Refused(_)) => {
                tracing::error!(dc = %self.dc, error = %refusal, "this dc must not serve: no host lease is granted and no record written");
                self.cell.with(|l| l.stop());
            }
            Err(e) => {
                // A store that failed a read: try the whole check again.
                tracing::warn!(dc = %self.dc, error = %e, "start-up check of the dc store failed; trying again");
                tokio::time::sleep(Duration::from_millis(RENEW_RETRY_MS)).await;
                return;
            }
        }
        *self.cell.unchecked.lock().expect("never poisoned") = None;
        self.cell.answered.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// Renews until `stop` turns true.
    pub async fn run(self, period: Duration, mut stop: watch::Receiver<bool>) {
        // Each send may take longer than the period (etcd: read, grant, txn,
        // revoke): validity counts from the send, so a slow answer still counts.
        let timeout = period.max(RENEW_TIMEOUT_MIN);
        loop {
            if *stop.borrow() {
                return;
            }
            let renewed = tokio::select! {
                renewed = self.renew_if_due(timeout) => renewed,
                _ = stop.changed() => return,
            };
            if renewed {
                continue;
            }
            let poll = self.cell.with(|l| l.poll((self.now)()));
            let until = match poll {
                DcLeasePoll::Wait { until } => (self.instant)(until),
                // Renew is taken by renew_if_due; InFlight cannot be seen
                // by the one loop that sends; a retired DC only waits to stop.
                _ => tokio::time::Instant::now() + Duration::from_secs(3600),
            };
            tokio::select! {
                _ = tokio::time::sleep_until(until) => {}
                _ = self.cell.wake.notified() => {}
                _ = stop.changed() => return,
            }
        }
    }
}

/// Waits until the published marks cover `record` (its reservation unique
/// and token), asking the renewal loop to publish them; `Unavailable` if no
/// renewal does within [`MARKS_WAIT_MS`].
pub async fn publish_marks_for(
    cell: &DcLeaseCell,
    records: &dyn DcStore,
    record: &DcRecord,
) -> Result<(), StoreError> {
    let unique = record.id.unique();
    if cell.with(|l| l.admits(unique, record.token)) {
        return Ok(());
    }
    let mut answered = cell.answered.subscribe();
    let floor = records.allocator_floor().await?;
    cell.with(|l| l.want(floor.max(unique), record.token));
    cell.wake.notify_one();
    let wait = async {
        loop {
            if cell.with(|l| l.admits(unique, record.token)) {
                return true;
            }
            if cell.with(|l| l.retired()) || answered.changed().await.is_err() {
                return false;
            }
        }
    };
    match tokio::time::timeout(Duration::from_millis(MARKS_WAIT_MS), wait).await {
        Ok(true) => Ok(()),
        Ok(false) => Err(StoreError::Unavailable {
            backend: "global",
            reason: format!(
                "{} is not written: this dc may never hold its dc lease again (retired, or its dc store is behind the marks it published: see homingd's log)",
                record.id
            ),
        }),
        Err(_) => Err(StoreError::Unavailable {
            backend: "global",
            reason: format!(
                "the global store has not acknowledged the marks {} needs (reservation unique {unique}, token {}) within {MARKS_WAIT_MS} ms",
                record.id, record.token
            ),
        }),
    }
}
