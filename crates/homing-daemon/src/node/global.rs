//! How a node performs homing-node's global-store operations its DC's
//! memory (homing-node's `Memory`, in the node's endpoint) did not answer:
//! against the global store, each call timed under its metric name, the
//! answer handed back to the memory; and concurrent resolves of one key
//! share one read (docs/DESIGN.md §3.3).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use homing_core::{ErrorReply, Key, ReservationId, Source, TakeOverReply};
use homing_node::{GlobalAnswer, GlobalOp, GlobalRead};
use homing_store::{SetIfAbsent, StoreError};
use tokio::sync::OnceCell;

use super::{Node, RequestError};

/// What a node keeps in memory about other DCs' facts.
#[derive(Debug, Clone, Copy)]
pub struct NodeCaches {
    /// Capacity of the global-entry and chain-member caches (each), entries.
    pub entries: u64,
    /// How long a resolve's absent answer is reused, ms (0: never).
    pub absent_ttl_ms: u64,
}

/// One global read shared by the resolves of a key that ask while it runs.
type Flight = Arc<OnceCell<Result<Option<ReservationId>, ErrorReply>>>;

/// The resolves' global reads in flight, by key.
#[derive(Default)]
pub(super) struct SharedReads(Mutex<HashMap<Key, Flight>>);

impl SharedReads {
    fn lock(&self) -> MutexGuard<'_, HashMap<Key, Flight>> {
        self.0
            .lock()
            .expect("the shared reads' lock is never poisoned")
    }
}

/// A resolve's share of a read: the last to leave an unfinished or
/// finished flight removes it (a dropped request leaves nothing behind).
struct Boarded<'a> {
    reads: &'a SharedReads,
    key: &'a Key,
    flight: Flight,
}

impl Drop for Boarded<'_> {
    fn drop(&mut self) {
        let mut flights = self.reads.lock();
        let ours = flights
            .get(self.key)
            .is_some_and(|f| Arc::ptr_eq(f, &self.flight));
        // Held by the map and by us only, or answered: nobody else needs it.
        if ours && (Arc::strong_count(&self.flight) <= 2 || self.flight.initialized()) {
            flights.remove(self.key);
        }
    }
}

impl Node {
    /// Performs one of homing-node's global-store operations the DC's
    /// memory did not answer ([`homing_node::Endpoint::answer_at_once`])
    /// against the store, and hands the answer to the memory.
    pub(super) async fn perform_global(&self, op: GlobalOp) -> Result<GlobalAnswer, RequestError> {
        let answer = self.ask_global(&op).await?;
        Ok(self.lock_endpoint().learn(&op, answer, self.waiters.now()))
    }

    /// What the global store answers `op`.
    async fn ask_global(&self, op: &GlobalOp) -> Result<GlobalAnswer, RequestError> {
        Ok(match op {
            GlobalOp::Entry { key, read } => {
                GlobalAnswer::Entry(self.read_entry(key, *read).await?)
            }
            GlobalOp::SetIfAbsent { key, id } => {
                let set = self.global.set_if_absent(key, id);
                let existing = match self.timed("global_set_if_absent", set).await? {
                    SetIfAbsent::Inserted => None,
                    SetIfAbsent::Exists(existing) => Some(existing),
                };
                GlobalAnswer::SetIfAbsent(existing)
            }
            GlobalOp::Successor { id, .. } => {
                let read = self.global.successor(id);
                GlobalAnswer::Successor {
                    succession: self.timed("global_successor", read).await?,
                    source: Source::Local,
                    hint: None, // the memory's to add
                }
            }
            GlobalOp::Confirm(succession) => {
                let set = self.global.set_successor(succession);
                let existing = self.timed("global_set_successor", set).await?;
                GlobalAnswer::Confirmed(existing.unwrap_or_else(|| succession.clone()))
            }
            GlobalOp::SuccessionsOf { dc, after, limit } => {
                let page = self.global.successions_of(dc, after.as_ref(), *limit);
                GlobalAnswer::Successions(self.timed("global_successions_of", page).await?)
            }
            GlobalOp::DcLease(dc) => {
                let state = self.global.dc_lease(dc);
                GlobalAnswer::DcLease(self.timed("global_dc_lease", state).await?)
            }
            GlobalOp::TakeOver { succession, policy } => {
                let take_over = self.global.take_over(succession, *policy);
                let reply = self.timed("global_take_over", take_over).await?;
                log_takeover(succession, &reply);
                GlobalAnswer::TakenOver(reply)
            }
        })
    }

    /// `key`'s global entry from the store, read as `read` says; a
    /// resolve's read shared with the resolves of the key that ask while
    /// it runs (when absent answers are reused at all).
    async fn read_entry(
        &self,
        key: &Key,
        read: GlobalRead,
    ) -> Result<Option<ReservationId>, RequestError> {
        match read {
            GlobalRead::Resolve if self.absent_ttl_ms > 0 => {
                let flight = self
                    .shared_reads
                    .lock()
                    .entry(key.clone())
                    .or_default()
                    .clone();
                let boarded = Boarded {
                    reads: &self.shared_reads,
                    key,
                    flight,
                };
                let read = async {
                    let entry = self.entry_from_store(key, GlobalRead::Latest).await;
                    entry.map_err(|e| RequestError::Store(e).into_reply(&self.config.dc))
                };
                let shared = boarded.flight.get_or_init(|| read).await.clone();
                shared.map_err(RequestError::Reply)
            }
            read => Ok(self.entry_from_store(key, read).await?),
        }
    }

    async fn entry_from_store(
        &self,
        key: &Key,
        read: GlobalRead,
    ) -> Result<Option<ReservationId>, StoreError> {
        self.metrics.global_cache(false);
        let get = match read {
            GlobalRead::Latest | GlobalRead::Resolve => self.global.get(key),
            GlobalRead::Nearest => self.global.get_nearest(key),
        };
        self.timed("global_get", get).await
    }
}

/// A takeover's outcome, as an operator reads it.
fn log_takeover(succession: &homing_core::Succession, reply: &TakeOverReply) {
    let from = &succession.link.from;
    match reply {
        TakeOverReply::Taken => tracing::warn!(
            reservation = %from,
            successor = %succession.link.to,
            token = succession.link.token.get(),
            "took over a tail of a dc whose lease expired"
        ),
        TakeOverReply::Exists(_) => {}
        TakeOverReply::Refused(state) => tracing::info!(
            reservation = %from,
            standing = ?state.standing,
            "takeover refused by the global store: the dc renewed its lease"
        ),
    }
}
