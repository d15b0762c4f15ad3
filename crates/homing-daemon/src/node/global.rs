//! How a node performs homing-node's global-store operations: entries and
//! successions (write-once, so cached forever), a resolve's shared read and
//! reused absent answer (DESIGN.md §7.4), the chain member it remembers per
//! key, each store call timed under its metric name.

use homing_core::{Key, ReservationId, Shortcut, Source, Succession, TakeOverReply};
use homing_node::{GlobalAnswer, GlobalOp, GlobalRead};
use homing_store::{SetIfAbsent, StoreError};

use super::{Failure, Node};
use crate::quota::QuotaSlot;

/// What a node keeps in memory about other DCs' facts.
#[derive(Debug, Clone, Copy)]
pub struct NodeCaches {
    /// Capacity of the global-entry and chain-member caches (each), entries.
    pub entries: u64,
    /// How long a resolve's absent answer is reused, ms (0: never).
    pub absent_ttl_ms: u64,
}

impl Node {
    /// Who succeeds `id` in the global store: cached once present (it
    /// never changes), read (linearizable) while absent.
    /// Where the answer came from: the cache, or the global store.
    pub(super) async fn successor(
        &self,
        id: &ReservationId,
    ) -> Result<(Option<Succession>, Source), Failure> {
        if let Some(cached) = self.successions.get(id) {
            return Ok((Some(cached), Source::Cache));
        }
        let read = self
            .timed("global_successor", self.global.successor(id))
            .await?;
        if let Some(s) = &read {
            self.successions.insert(id.clone(), s.clone());
        }
        Ok((read, Source::Local))
    }

    /// Makes `succession` its reservation's in the global store unless one
    /// is; the one it has (cached: write-once).
    pub(super) async fn confirm(&self, succession: Succession) -> Result<Succession, Failure> {
        let from = succession.link.from.clone();
        if let Some(cached) = self.successions.get(&from) {
            return Ok(cached);
        }
        let existing = self
            .timed(
                "global_set_successor",
                self.global.set_successor(&succession),
            )
            .await?;
        let recorded = existing.unwrap_or(succession);
        self.successions.insert(from, recorded.clone());
        Ok(recorded)
    }

    /// The key's global entry, from cache when known (entries never change).
    pub async fn global_entry(&self, key: &Key) -> Result<Option<ReservationId>, StoreError> {
        self.read_global(key, GlobalRead::Latest).await
    }

    /// A resolve's read of `key`'s global entry: like [`Node::global_entry`],
    /// but an absent answer is reused for `absent_ttl_ms` and concurrent
    /// resolves of one key share one read.
    pub(super) async fn resolve_entry(&self, key: &Key) -> Result<Option<ReservationId>, Failure> {
        let Some(reads) = &self.resolve_reads else {
            return Ok(self.global_entry(key).await?);
        };
        if let Some(id) = self.global_cache.get(key) {
            self.metrics.global_cache(true);
            return Ok(Some(id));
        }
        let read = async {
            let entry = self.global_entry(key).await;
            entry.map_err(|e| Failure::Store(e).into_reply(&self.config.dc))
        };
        let shared = reads.try_get_with(key.clone(), read).await;
        shared.map_err(|e| Failure::Reply((*e).clone()))
    }

    /// `key`'s global entry, from the cache (entries never change) or the
    /// store, read as `read` says.
    pub(super) async fn read_global(
        &self,
        key: &Key,
        read: GlobalRead,
    ) -> Result<Option<ReservationId>, StoreError> {
        if let Some(id) = self.global_cache.get(key) {
            self.metrics.global_cache(true);
            return Ok(Some(id));
        }
        self.metrics.global_cache(false);
        let get = match read {
            GlobalRead::Latest | GlobalRead::Resolve => self.global.get(key),
            GlobalRead::Nearest => self.global.get_nearest(key),
        };
        let entry = self.timed("global_get", get).await?;
        if let Some(id) = &entry {
            self.global_cache.insert(key.clone(), id.clone());
        }
        Ok(entry)
    }

    /// The hint for the next walk of `key`: the furthest member remembered.
    pub(super) fn hint(&self, key: &Key) -> Option<Shortcut> {
        self.members.get(key)
    }

    /// Remembers `member` of `key`'s chain if it is further along than the one known.
    pub(super) fn remember(&self, key: &Key, member: Shortcut) {
        if member.is_past(self.members.get(key).as_ref()) {
            self.members.insert(key.clone(), member);
        }
    }

    /// Performs one of homing-node's global-store operations, timed under
    /// its metric name; what never changes (entries, successions) is read
    /// from and kept in this node's caches. `slot`: the quota slot of the
    /// key create a set-if-absent settles, if any.
    pub(super) async fn perform_global(
        &self,
        op: GlobalOp,
        slot: &mut Option<QuotaSlot<'_>>,
    ) -> Result<GlobalAnswer, Failure> {
        Ok(match op {
            GlobalOp::Entry {
                key,
                read: GlobalRead::Resolve,
            } => GlobalAnswer::Entry(self.resolve_entry(&key).await?),
            GlobalOp::Entry { key, read } => {
                GlobalAnswer::Entry(self.read_global(&key, read).await?)
            }
            GlobalOp::SetIfAbsent { key, id } => {
                let set = self.global.set_if_absent(&key, &id);
                let existing = match self.timed("global_set_if_absent", set).await? {
                    SetIfAbsent::Inserted => None,
                    SetIfAbsent::Exists(existing) => Some(existing),
                };
                if let Some(slot) = slot.take() {
                    // Inserted, or a retried write of our own entry.
                    slot.settle(existing.as_ref().is_none_or(|winner| winner == &id));
                }
                self.global_cache
                    .insert(key, existing.clone().unwrap_or(id));
                GlobalAnswer::SetIfAbsent(existing)
            }
            GlobalOp::Successor { id, key } => {
                let (succession, source) = self.successor(&id).await?;
                let hint = self.hint(&key);
                GlobalAnswer::Successor {
                    succession,
                    source,
                    hint,
                }
            }
            GlobalOp::Confirm(succession) => {
                GlobalAnswer::Confirmed(self.confirm(succession).await?)
            }
            GlobalOp::SuccessionsOf { dc, after, limit } => {
                let page = self.global.successions_of(&dc, after.as_ref(), limit);
                let page = self.timed("global_successions_of", page).await?;
                for succession in &page {
                    let from = succession.link.from.clone();
                    self.successions.insert(from, succession.clone());
                }
                GlobalAnswer::Successions(page)
            }
            GlobalOp::DcLease(dc) => {
                let state = self.global.dc_lease(&dc);
                GlobalAnswer::DcLease(self.timed("global_dc_lease", state).await?)
            }
            GlobalOp::TakeOver { succession, policy } => {
                let take_over = self.global.take_over(&succession, policy);
                let reply = self.timed("global_take_over", take_over).await?;
                let from = &succession.link.from;
                match &reply {
                    TakeOverReply::Taken => {
                        self.successions.insert(from.clone(), succession.clone());
                        tracing::warn!(
                            reservation = %from,
                            successor = %succession.link.to,
                            token = succession.link.token.get(),
                            "took over a tail of a dc whose lease expired"
                        );
                    }
                    TakeOverReply::Exists(existing) => {
                        self.successions.insert(from.clone(), existing.clone());
                    }
                    TakeOverReply::Refused(state) => tracing::info!(
                        reservation = %from,
                        standing = ?state.standing,
                        "takeover refused by the global store: the dc renewed its lease"
                    ),
                }
                GlobalAnswer::TakenOver(reply)
            }
        })
    }
}
