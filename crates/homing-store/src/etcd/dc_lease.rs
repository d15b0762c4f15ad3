//! DC leases in etcd (DESIGN.md §7.5), judged by etcd's lease clock: the
//! leader's monotonic clock, which no client reads or compares.
//!
//! Two keys per DC under the global prefix:
//!
//! - `dcs/<dc>` → the [`DcEntry`] (terms, marks, retired), never deleted;
//! - `dcl/<dc>` → empty, attached to an etcd lease of
//!   `ceil(expires_after / 1 s)` seconds: while it exists, the DC lease has
//!   not expired. etcd deletes it when its lease runs out.
//!
//! A renewal reads both keys, computes [`DcEntry::renewed`] (each mark's
//! maximum; nothing for a retired DC), grants a *fresh* etcd lease, and
//! writes the entry and `dcl/<dc>` attached to that lease in one
//! transaction guarded by both keys' `mod_revision` (absent:
//! `create_revision == 0`); a failed guard reads both back and judges again
//! (at most [`DC_LEASE_ATTEMPTS_MAX`] times). Then it revokes the lease the
//! key was on before. Why not one lease per DC kept alive:
//!
//! - a keep-alive is not a transaction: it cannot be guarded by the entry,
//!   so a renewal racing a retire could extend a retired DC's lease. Here a
//!   retire moves the entry, so every renewal guarded by the old entry fails
//!   and reads `retired`: the lease runs out by its terms, exactly.
//! - the lease is granted after the read its write is guarded by, so after
//!   the read of every renewal that landed before it, hence after those
//!   renewals were sent: the key's lease never expires before
//!   `expires_after` from the send of any acknowledged renewal, whichever
//!   of two racing renewers (two daemons of one DC) lands last. (A lease
//!   granted once and reused across attempts would not: an attempt could
//!   land an older lease over a newer renewal's.)
//! - nothing is kept per DC in this process: every daemon, restarted or
//!   not, renews and reads alike.
//!
//! Revoking the replaced lease is safe: only the renewal that granted a
//! lease puts it, and after a renewal moved the key every attempt guarded
//! by the older key fails (an abandoned attempt that lands late included),
//! so no write puts a replaced lease back. An attempt whose guard failed
//! revokes its own lease unless the read-back shows the key on it (its
//! write landed, its answer was lost: that renewal is ours, answered
//! `Renewed`). A lease that is never revoked (a lost grant, a failed
//! revoke) holds no key and runs out by itself.
//!
//! Reading a DC: both keys in one read; if `dcl/<dc>` exists, ask its lease
//! how long it has left (LeaseTimeToLive, answered by the leader), then read
//! both keys again: unchanged, the answer holds at the instant the lease was
//! asked; changed (a renewal or retire landed meanwhile), judge again. So a
//! lease revoked because a renewal replaced it is never taken for expired.
//!
//! Standing: no terms → `Unknown`; `dcl/<dc>` absent (or its lease gone) →
//! `Expired`; otherwise etcd answers the lease's granted ttl `G` and whole
//! seconds left `r` (rounded down, so at least `r` s are left and at most
//! `G − r` s have passed since the grant): the standing is
//! [`DcStanding::judge`] of those `G − r` s, except that a lease whose key
//! still exists is never called expired — it is `Lapsed` with `r` s (at
//! least 1 ms) to go, because the store calls it expired only when etcd
//! deletes the key. Whole seconds and etcd's minimum ttl only ever make the
//! store call a lease expired later, never earlier; so does a leader change
//! (the new leader restarts every lease's ttl).

use etcd_client::{GetOptions, KeyValue, LeaseClient, PutOptions, Txn, TxnOp, TxnOpResponse};
use homing_core::{DcId, DcLeaseState, DcMarks, DcRenewal, DcStanding, DcTerms};

use super::members::Op;
use super::{Space, every_first_kv, protocol, unchanged};
use crate::dc_lease::DcEntry;
use crate::error::StoreError;
use crate::global::DCS_MAX;
use crate::keyspace;

/// The section of DC entries: `dcs/<dc>` → [`DcEntry`].
const ENTRIES: &[u8] = b"dcs/";
/// The section of live DC leases: `dcl/<dc>` → empty, on an etcd lease.
const LIVE: &[u8] = b"dcl/";

/// Most attempts of one DC lease write (renewal, retire) whose guard failed
/// because another writer of the same DC moved its keys.
pub const DC_LEASE_ATTEMPTS_MAX: usize = 16;
/// Most DC standings read at once by `GlobalStore::dc_leases`.
pub const DC_READS_IN_FLIGHT_MAX: usize = 16;
/// etcd's longest lease, s (`MaxLeaseTTL`).
const LEASE_TTL_S_MAX: u64 = 9_000_000_000;

/// The DC leases under one global prefix.
#[derive(Clone)]
pub(super) struct DcLeases {
    space: Space,
}

/// What etcd holds about one DC, read at one revision.
#[derive(Clone)]
pub(super) struct Held {
    /// `dcs/<dc>`.
    pub(super) entry: Option<KeyValue>,
    /// `dcl/<dc>`.
    pub(super) live: Option<KeyValue>,
}

impl Held {
    /// Both keys of a DC from a transaction's two gets.
    fn of(responses: &[TxnOpResponse]) -> Result<Held, StoreError> {
        let mut kvs = every_first_kv(responses, 2)?.into_iter();
        Ok(Held {
            entry: kvs.next().flatten(),
            live: kvs.next().flatten(),
        })
    }

    fn entry(&self) -> Result<DcEntry, StoreError> {
        match &self.entry {
            Some(kv) => keyspace::decode_dc_entry(kv.value()),
            None => Ok(DcEntry::default()),
        }
    }

    /// The etcd lease `dcl/<dc>` is on, if it exists.
    fn lease(&self) -> Option<i64> {
        self.live.as_ref().map(KeyValue::lease).filter(|l| *l != 0)
    }

    /// Whether both keys are as in `other` (same revisions, or both absent).
    fn same(&self, other: &Held) -> bool {
        let revision = |kv: &Option<KeyValue>| kv.as_ref().map(KeyValue::mod_revision);
        revision(&self.entry) == revision(&other.entry)
            && revision(&self.live) == revision(&other.live)
    }
}

/// What LeaseTimeToLive said of a lease.
#[derive(Debug, Clone, Copy)]
enum Left {
    /// Expired or revoked.
    Gone,
    /// Alive: at least `left_s` whole seconds to go, of `granted_s`.
    Alive { left_s: u64, granted_s: u64 },
}

/// The etcd lease ttl for `terms`: whole seconds, rounded up.
fn lease_ttl_s(terms: &DcTerms) -> Result<i64, StoreError> {
    let ttl_s = terms.expires_after_ms().div_ceil(1_000).max(1);
    if ttl_s > LEASE_TTL_S_MAX {
        return Err(StoreError::Backend {
            backend: "etcd",
            reason: format!(
                "dc lease terms expire after {} ms, longer than etcd's longest lease ({LEASE_TTL_S_MAX} s)",
                terms.expires_after_ms()
            ),
        });
    }
    // Invariant: at most LEASE_TTL_S_MAX, which fits an i64.
    Ok(ttl_s as i64)
}

/// The standing of a DC whose entry has `terms`, whose live key exists
/// (`Some`, with what its lease has left) or not (`None`).
fn standing(terms: Option<DcTerms>, left: Option<Left>) -> DcStanding {
    let Some(terms) = terms else {
        return DcStanding::Unknown;
    };
    let Some(Left::Alive { left_s, granted_s }) = left else {
        return DcStanding::Expired;
    };
    let left_ms = left_s.saturating_mul(1_000);
    let since_ms = granted_s.saturating_mul(1_000).saturating_sub(left_ms);
    match DcStanding::judge(&terms, since_ms) {
        live @ DcStanding::Live { .. } => live,
        // The key still exists: the store calls it expired only once etcd
        // deletes it, at least `left_ms` from now.
        _ => DcStanding::Lapsed {
            expires_in_ms: left_ms.max(1),
        },
    }
}

impl DcLeases {
    pub(super) fn new(space: Space) -> DcLeases {
        DcLeases { space }
    }

    /// `dc`'s keys: `(dcs/<dc>, dcl/<dc>)`.
    pub(super) fn keys(&self, dc: &DcId) -> (Vec<u8>, Vec<u8>) {
        let name = dc.as_str().as_bytes();
        (self.space.key(ENTRIES, name), self.space.key(LIVE, name))
    }

    /// Both keys of `dc` in one read.
    async fn read(&self, dc: &DcId) -> Result<Held, StoreError> {
        let (entry, live) = self.keys(dc);
        let gets = [TxnOp::get(entry, None), TxnOp::get(live, None)];
        let (_, responses) = self
            .space
            .txn(Op::HotRead, Txn::new().and_then(gets))
            .await?;
        Held::of(&responses)
    }

    /// Renews `dc`'s lease (see the module doc).
    pub(super) async fn renew(
        &self,
        dc: &DcId,
        terms: &DcTerms,
        marks: &DcMarks,
    ) -> Result<DcRenewal, StoreError> {
        lease_ttl_s(terms)?;
        let (entry_key, live_key) = self.keys(dc);
        let mut held = self.read(dc).await?;
        for _ in 0..DC_LEASE_ATTEMPTS_MAX {
            let entry = held.entry()?;
            let Some(renewed) = entry.renewed(*terms, *marks) else {
                return Ok(DcRenewal::Retired);
            };
            // The kept terms: never a shorter horizon than an earlier renewal's.
            let ttl_s = lease_ttl_s(&renewed.terms.unwrap_or(*terms))?;
            // Granted after `held` was read: see the module doc.
            let lease = self.grant(ttl_s).await?;
            let mut ops = vec![TxnOp::put(
                live_key.clone(),
                Vec::new(),
                Some(PutOptions::new().with_lease(lease)),
            )];
            if held.entry.is_none() || renewed != entry {
                ops.push(TxnOp::put(
                    entry_key.clone(),
                    keyspace::encode_dc_entry(&renewed),
                    None,
                ));
            }
            let guards = [
                unchanged(&entry_key, held.entry.as_ref()),
                unchanged(&live_key, held.live.as_ref()),
            ];
            let reread = [
                TxnOp::get(entry_key.clone(), None),
                TxnOp::get(live_key.clone(), None),
            ];
            let txn = Txn::new().when(guards).and_then(ops).or_else(reread);
            let txned = self.space.txn_at(Op::HotWrite, txn).await?;
            if txned.succeeded {
                self.revoke_replaced(&held, lease).await;
                return Ok(DcRenewal::Renewed(renewed.marks));
            }
            let now = Held::of(&txned.responses)?;
            if now.lease() == Some(lease) {
                // Only this call puts `lease`: an attempt landed and its
                // answer was lost.
                self.space.members.resolved_ambiguous();
                self.revoke_replaced(&held, lease).await;
                return Ok(DcRenewal::Renewed(renewed.marks));
            }
            // No write puts `lease` any more: every attempt of this
            // transaction is guarded by keys that have moved.
            self.revoke(lease).await;
            held = now;
        }
        Err(contended("dc lease renewal"))
    }

    /// Retires `dc`; its state after.
    pub(super) async fn retire(&self, dc: &DcId) -> Result<DcLeaseState, StoreError> {
        let (entry_key, live_key) = self.keys(dc);
        let mut held = self.read(dc).await?;
        for _ in 0..DC_LEASE_ATTEMPTS_MAX {
            let entry = held.entry()?;
            if held.entry.is_some() && entry.retired {
                return self.judge(dc, held).await;
            }
            let put = TxnOp::put(
                entry_key.clone(),
                keyspace::encode_dc_entry(&entry.retire()),
                None,
            );
            let reread = [
                TxnOp::get(entry_key.clone(), None),
                TxnOp::get(live_key.clone(), None),
            ];
            let txn = Txn::new()
                .when([unchanged(&entry_key, held.entry.as_ref())])
                .and_then([put])
                .or_else(reread);
            let txned = self.space.txn_at(Op::HotWrite, txn).await?;
            if txned.succeeded {
                return self.state(dc).await;
            }
            // Another writer moved the entry (or our own lost attempt
            // landed): judge again against it.
            held = Held::of(&txned.responses)?;
        }
        Err(contended("dc retire"))
    }

    /// What the store knows about `dc` now.
    pub(super) async fn state(&self, dc: &DcId) -> Result<DcLeaseState, StoreError> {
        let held = self.read(dc).await?;
        self.judge(dc, held).await
    }

    /// `dc`'s state from `held` as read: its lease asked, then both keys
    /// read again until they did not move meanwhile.
    async fn judge(&self, dc: &DcId, held: Held) -> Result<DcLeaseState, StoreError> {
        Ok(self.judged(dc, held).await?.0)
    }

    /// [`DcLeases::judge`], with the keys as read when the state held (a
    /// takeover guards its write by them).
    pub(super) async fn judged(
        &self,
        dc: &DcId,
        mut held: Held,
    ) -> Result<(DcLeaseState, Held), StoreError> {
        for _ in 0..DC_LEASE_ATTEMPTS_MAX {
            let entry = held.entry()?;
            let Some(lease) = held.lease() else {
                // Absent at the read: the answer holds at that revision.
                return Ok((state_of(dc, &entry, standing(entry.terms, None)), held));
            };
            let left = self.time_to_live(lease).await?;
            let again = self.read(dc).await?;
            if again.same(&held) {
                let state = state_of(dc, &entry, standing(entry.terms, Some(left)));
                return Ok((state, held));
            }
            held = again;
        }
        Err(contended("dc lease read"))
    }

    /// Every DC in id order, at most [`DCS_MAX`], each judged as by [`DcLeases::state`].
    pub(super) async fn states(&self) -> Result<Vec<DcLeaseState>, StoreError> {
        let helds = self.read_all().await?;
        let mut states = Vec::with_capacity(helds.len());
        for chunk in helds.chunks(DC_READS_IN_FLIGHT_MAX) {
            let tasks: Vec<_> = chunk
                .iter()
                .cloned()
                .map(|(dc, held)| {
                    let leases = self.clone();
                    tokio::spawn(async move { leases.judge(&dc, held).await })
                })
                .collect();
            for task in tasks {
                let state = task
                    .await
                    .map_err(|e| protocol(&format!("dc lease read task failed: {e}")))??;
                states.push(state);
            }
        }
        Ok(states)
    }

    /// The first [`DCS_MAX`] DCs and their live keys, in one read.
    async fn read_all(&self) -> Result<Vec<(DcId, Held)>, StoreError> {
        let range = |section: &[u8]| {
            let start = self.space.key(section, b"");
            // Invariant: the section ends in `/`, so it has an end.
            let end = keyspace::prefix_end(&start).expect("a section ending in '/' has an end");
            let options = GetOptions::new().with_range(end).with_limit(DCS_MAX as i64);
            TxnOp::get(start, Some(options))
        };
        let gets = [range(ENTRIES), range(LIVE)];
        let (_, responses) = self
            .space
            .txn(Op::BulkRead, Txn::new().and_then(gets))
            .await?;
        let [TxnOpResponse::Get(entries), TxnOpResponse::Get(lives)] = responses.as_slice() else {
            return Err(protocol(
                "transaction answered without the gets it asked for",
            ));
        };
        let (entry_section, live_section) =
            (self.space.key(ENTRIES, b""), self.space.key(LIVE, b""));
        let mut live = std::collections::BTreeMap::new();
        for kv in lives.kvs() {
            live.insert(
                keyspace::decode_dc_key(&live_section, kv.key())?,
                kv.clone(),
            );
        }
        let mut helds = Vec::with_capacity(entries.kvs().len());
        for kv in entries.kvs() {
            let dc = keyspace::decode_dc_key(&entry_section, kv.key())?;
            let held = Held {
                entry: Some(kv.clone()),
                live: live.remove(&dc),
            };
            helds.push((dc, held));
        }
        // Live keys exist only beside entries, so the first DCS_MAX of them
        // cover every listed DC; were some left off, read those DCs again
        // rather than call them expired.
        if lives.more() {
            for (dc, held) in helds.iter_mut().filter(|(_, h)| h.live.is_none()) {
                *held = self.read(dc).await?;
            }
        }
        Ok(helds)
    }

    /// A fresh etcd lease of `ttl_s` seconds.
    async fn grant(&self, ttl_s: i64) -> Result<i64, StoreError> {
        let answer = self
            .space
            .members
            .run_lease(Op::HotWrite, |mut lease: LeaseClient| async move {
                lease.grant(ttl_s, None).await
            })
            .await?;
        let granted = answer.value;
        if !granted.error().is_empty() || granted.id() == 0 {
            return Err(StoreError::Backend {
                backend: "etcd",
                reason: format!("lease grant refused: {}", granted.error()),
            });
        }
        Ok(granted.id())
    }

    /// What etcd lease `id` has left.
    async fn time_to_live(&self, id: i64) -> Result<Left, StoreError> {
        let answer = self
            .space
            .members
            .run_lease(Op::HotRead, |mut lease: LeaseClient| async move {
                match lease.time_to_live(id, None).await {
                    Ok(answer) => Ok(Some((answer.ttl(), answer.granted_ttl()))),
                    Err(e) if lease_not_found(&e) => Ok(None),
                    Err(e) => Err(e),
                }
            })
            .await?;
        // etcd answers ttl -1 for a lease it does not hold (expired, revoked).
        Ok(match answer.value {
            Some((left_s, granted_s)) if left_s >= 0 => Left::Alive {
                left_s: left_s as u64,
                granted_s: granted_s.max(left_s) as u64,
            },
            _ => Left::Gone,
        })
    }

    /// Revokes the lease `held`'s live key was on, now that the renewal
    /// that granted `ours` replaced it.
    async fn revoke_replaced(&self, held: &Held, ours: i64) {
        if let Some(replaced) = held.lease().filter(|l| *l != ours) {
            self.revoke(replaced).await;
        }
    }

    /// Revokes etcd lease `id`, which holds no key; a failure only leaves
    /// it to run out by itself.
    async fn revoke(&self, id: i64) {
        let revoked = self
            .space
            .members
            .run_lease(Op::HotWrite, |mut lease: LeaseClient| async move {
                match lease.revoke(id).await {
                    Ok(_) => Ok(()),
                    Err(e) if lease_not_found(&e) => Ok(()),
                    Err(e) => Err(e),
                }
            })
            .await;
        if let Err(e) = revoked {
            tracing::debug!(lease = id, error = %e, "left an unused etcd lease to run out");
        }
    }
}

/// Whether etcd answered that a lease does not exist.
fn lease_not_found(e: &etcd_client::Error) -> bool {
    matches!(e, etcd_client::Error::GRpcStatus(status) if status.message().contains("lease not found"))
}

fn state_of(dc: &DcId, entry: &DcEntry, standing: DcStanding) -> DcLeaseState {
    DcLeaseState {
        standing,
        ..entry.state(dc, None)
    }
}

fn contended(what: &str) -> StoreError {
    StoreError::Unavailable {
        backend: "etcd",
        reason: format!("{what}: keys moved for {DC_LEASE_ATTEMPTS_MAX} attempts"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TERMS: DcTerms = DcTerms {
        ttl_ms: 20_000,
        host_lease_ttl_max_ms: 10_000,
        grace_ms: 1_500,
    };

    #[test]
    fn ttl_rounds_up_to_whole_seconds_and_refuses_what_etcd_cannot_hold() {
        assert_eq!(lease_ttl_s(&TERMS).unwrap(), 32);
        let tiny = DcTerms {
            ttl_ms: 1,
            host_lease_ttl_max_ms: 0,
            grace_ms: 0,
        };
        assert_eq!(lease_ttl_s(&tiny).unwrap(), 1);
        let endless = DcTerms {
            ttl_ms: u64::MAX,
            ..TERMS
        };
        assert!(lease_ttl_s(&endless).is_err());
    }

    #[test]
    fn standing_counts_the_most_time_etcd_may_have_let_pass() {
        let alive = |left_s, granted_s| Some(Left::Alive { left_s, granted_s });
        assert_eq!(standing(None, alive(32, 32)), DcStanding::Unknown);
        assert_eq!(standing(Some(TERMS), None), DcStanding::Expired);
        assert_eq!(standing(Some(TERMS), Some(Left::Gone)), DcStanding::Expired);
        assert_eq!(
            standing(Some(TERMS), alive(32, 32)),
            DcStanding::Live {
                remaining_ms: 20_000
            }
        );
        // 31 s left (rounded down): up to 1 s has passed.
        assert_eq!(
            standing(Some(TERMS), alive(31, 32)),
            DcStanding::Live {
                remaining_ms: 19_000
            }
        );
        assert_eq!(
            standing(Some(TERMS), alive(12, 32)),
            DcStanding::Lapsed {
                expires_in_ms: 12_000
            }
        );
        // The key still exists: lapsed, never expired.
        assert_eq!(
            standing(Some(TERMS), alive(0, 32)),
            DcStanding::Lapsed { expires_in_ms: 1 }
        );
    }
}
