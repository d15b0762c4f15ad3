//! The global store contract: `key → ReservationId` entries, written once,
//! never changed, never deleted (there is deliberately no update or delete
//! of an entry in the API); beside them, each DC's lease and marks, the
//! successions (write-once too) and the deployment [`Setting`]s, the one
//! thing in the store that changes by compare-and-set.

use std::sync::Arc;

use async_trait::async_trait;
use homing_core::{
    DcId, DcLeaseState, DcMarks, DcRenewal, DcTerms, Key, ReservationId, Succession,
    SuccessionCause, TakeOverReply, TakeoverPolicy,
};

use crate::error::StoreError;
use crate::failover::Failover;
use crate::setting::{SETTING_BYTES_MAX, Setting};

/// Most DCs one [`GlobalStore::dc_leases`] lists: a deployment has a few
/// dozen; past this, the rest are left off.
pub const DCS_MAX: usize = 1024;

/// Most keys one [`GlobalStore::get_many`] may ask for (an etcd transaction
/// holds at most 128 operations by default).
pub const GET_MANY_KEYS_MAX: usize = 128;

/// What [`GlobalStore::set_if_absent`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SetIfAbsent {
    /// The caller's ID is now the key's entry, forever.
    Inserted,
    /// The key already had this entry (equal to the caller's ID on a retry
    /// of a write that was applied).
    Exists(ReservationId),
}

/// Write-once map from keys to the reservation that first claimed them,
/// with what the deployment keeps beside it: DC leases, successions and
/// settings.
#[async_trait]
pub trait GlobalStore: Send + Sync + 'static {
    /// The key's entry, if any: linearizable, so "absent" is the truth at
    /// some instant during the call.
    async fn get(&self, key: &Key) -> Result<Option<ReservationId>, StoreError>;

    /// The key's entry as the nearest replica knows it, without a quorum
    /// round trip: a present answer is always true (entries never change),
    /// but "absent" may lag writes acknowledged moments ago. Only for a
    /// caller whose next step after "absent" is [`set_if_absent`], which
    /// decides (a connect: a stale "absent" makes the write-once answer
    /// `Exists`, and the connect follows the winner). Never answer "absent"
    /// to anyone from it. Backends whose every read is already local
    /// (memory, redb) or linearizable at no extra cost use [`get`].
    ///
    /// [`get`]: GlobalStore::get
    /// [`set_if_absent`]: GlobalStore::set_if_absent
    async fn get_nearest(&self, key: &Key) -> Result<Option<ReservationId>, StoreError> {
        self.get(key).await
    }

    /// The entries of `keys`, in the same order. More than
    /// [`GET_MANY_KEYS_MAX`] keys fail with [`StoreError::BatchTooLarge`].
    async fn get_many(&self, keys: &[Key]) -> Result<Vec<Option<ReservationId>>, StoreError>;

    /// Makes `id` the key's entry unless it has one; returns the entry it has
    /// otherwise. Acknowledged inserts are durable (for durable backends).
    async fn set_if_absent(&self, key: &Key, id: &ReservationId)
    -> Result<SetIfAbsent, StoreError>;

    /// Migration: entries in key order, strictly after `after` if given, at
    /// most `limit` (≤ [`GET_MANY_KEYS_MAX`], else
    /// [`StoreError::BatchTooLarge`]). Fewer than `limit` only at the end.
    async fn scan(
        &self,
        after: Option<&Key>,
        limit: usize,
    ) -> Result<Vec<(Key, ReservationId)>, StoreError>;

    /// Renews DC `dc`'s lease under `terms` and publishes `marks` (the store
    /// keeps each mark's maximum), judged from when the store receives it by
    /// the store's own clock (DESIGN.md §7.5). A retired DC is refused.
    async fn renew_dc_lease(
        &self,
        dc: &DcId,
        terms: &DcTerms,
        marks: &DcMarks,
    ) -> Result<DcRenewal, StoreError>;

    /// What the store knows about DC `dc` now (linearizable).
    async fn dc_lease(&self, dc: &DcId) -> Result<DcLeaseState, StoreError>;

    /// Every DC the store knows, in id order, at most [`DCS_MAX`].
    async fn dc_leases(&self) -> Result<Vec<DcLeaseState>, StoreError>;

    /// Retires DC `dc`: every later renewal of its lease is refused; a lease
    /// it holds runs out by its terms. Idempotent; the DC's state after.
    async fn retire_dc(&self, dc: &DcId) -> Result<DcLeaseState, StoreError>;

    /// Who succeeds `from`, if anyone (linearizable: "absent" is the truth
    /// at some instant during the call; a present answer never changes).
    async fn successor(&self, from: &ReservationId) -> Result<Option<Succession>, StoreError>;

    /// Makes `succession` (a [`SuccessionCause::Moved`]) the one succession
    /// of `succession.link.from` unless it has one; returns the one it has
    /// otherwise (equal to the caller's on a retry of a write that was
    /// applied). Acknowledged writes are durable (for durable backends).
    ///
    /// [`SuccessionCause::Moved`]: homing_core::SuccessionCause::Moved
    async fn set_successor(
        &self,
        succession: &Succession,
    ) -> Result<Option<Succession>, StoreError>;

    /// Migration only (`homing migrate`): makes `succession`, of either
    /// cause, the one succession of `succession.link.from` unless it has
    /// one; returns the one it has otherwise (equal to the caller's on a
    /// retry, or when an earlier run copied it). Nothing else is judged: the
    /// succession was judged once, where it was first written (a move
    /// confirmed by its mover, a takeover against the DC lease as the source
    /// store kept it), and a copy must not judge a DC lease again in a store
    /// whose clock never saw it. Write-once against every other write of a
    /// succession: an import blocks a later `set_successor` or `take_over` of
    /// the same reservation, and they block it. Never for a serving DC (a
    /// move goes through `set_successor`, a takeover through `take_over`).
    /// A reservation succeeding itself is refused with
    /// [`StoreError::InvalidArgument`]. Acknowledged writes are durable
    /// (for durable backends).
    async fn import_succession(
        &self,
        succession: &Succession,
    ) -> Result<Option<Succession>, StoreError>;

    /// A takeover (DESIGN.md §7.5): makes `succession` (a
    /// [`SuccessionCause::TakenOver`]) the one succession of
    /// `succession.link.from`, provided, *in the same store transaction*,
    /// that it has none and that `policy` allows taking over the DC of
    /// `from` as the store judges its lease at that moment (expired by the
    /// store's clock; retired too under `RetiredOnly`) and the link's token
    /// is above the DC's token bound as the store keeps it then (a DC that
    /// renewed with a higher bound since the taker read it is refused:
    /// [`homing_core::succession::takeover_allowed`]). A DC that renews
    /// concurrently either renewed first (refused) or renews after (and
    /// finds the takeover when it reconciles).
    ///
    /// [`SuccessionCause::TakenOver`]: homing_core::SuccessionCause::TakenOver
    async fn take_over(
        &self,
        succession: &Succession,
        policy: TakeoverPolicy,
    ) -> Result<TakeOverReply, StoreError>;

    /// The successions of DC `dc`'s reservations (moves and takeovers), in
    /// reservation-unique order, strictly after `after` if given (a
    /// reservation of `dc`), at most `limit` (≤ [`GET_MANY_KEYS_MAX`], else
    /// [`StoreError::BatchTooLarge`]). Fewer than `limit` only at the end.
    /// A DC returning from expiry applies them before it grants.
    async fn successions_of(
        &self,
        dc: &DcId,
        after: Option<&ReservationId>,
        limit: usize,
    ) -> Result<Vec<Succession>, StoreError>;

    /// Migration: every succession the store keeps, of every DC, in
    /// (DC id, unique) order, strictly after the succession of `after` if
    /// given (which needs not exist), at most `limit` (≤
    /// [`GET_MANY_KEYS_MAX`], else [`StoreError::BatchTooLarge`]). Fewer
    /// than `limit` only at the end. Unlike [`successions_of`] it needs no
    /// list of DCs, so it also finds the successions of a DC whose lease
    /// the store never kept, or that [`dc_leases`] leaves off.
    ///
    /// [`successions_of`]: GlobalStore::successions_of
    /// [`dc_leases`]: GlobalStore::dc_leases
    async fn scan_successions(
        &self,
        after: Option<&ReservationId>,
        limit: usize,
    ) -> Result<Vec<Succession>, StoreError>;

    /// A deployment setting's value, if it was ever set (linearizable:
    /// the value at some instant during the call). Settings change, unlike
    /// entries: a value read is not the value forever.
    async fn setting(&self, name: Setting) -> Result<Option<Vec<u8>>, StoreError>;

    /// Sets `name` to `value` provided it holds `expected` now (`None`: never
    /// set), in one store transaction. `Ok(Ok(()))` when set; `Ok(Err(found))`
    /// with what it holds otherwise (compare-and-set: the caller re-reads and
    /// retries). A value over [`SETTING_BYTES_MAX`] is refused with
    /// [`StoreError::SettingTooLarge`] and nothing is written. Acknowledged
    /// swaps are durable (for durable backends). A swap whose answer was
    /// lost and that the store retried answers `Ok(Ok(()))` when the retry
    /// finds `value` held (it was set, once); if another swap changed the
    /// setting in between, the retry answers what that one wrote.
    async fn swap_setting(
        &self,
        name: Setting,
        expected: Option<&[u8]>,
        value: &[u8],
    ) -> Result<Result<(), Option<Vec<u8>>>, StoreError>;

    /// Its endpoints' health and failover counters, for a store that talks
    /// to several servers and goes around a silent one (etcd); `None` for
    /// the others.
    fn failover(&self) -> Option<Arc<Failover>> {
        None
    }

    /// Whether the store serves now (homingd's `/readyz` asks): one
    /// linearizable read, plus what a backend needs to write (redb: its
    /// writer thread runs). The default reads a key nobody writes.
    async fn health(&self) -> Result<(), StoreError> {
        self.get(&health_probe_key()).await.map(|_| ())
    }
}

/// Successions a page of [`GET_MANY_KEYS_MAX`] at a time, with the cursor
/// kept: one DC's in reservation-unique order
/// ([`GlobalStore::successions_of`]: what `homing dc status` counts; a DC
/// returning from expiry pages them through homing-node's `Reconcile`), or
/// every DC's in (DC id, unique) order ([`GlobalStore::scan_successions`]:
/// what a migration copies and verifies).
#[derive(Debug)]
pub struct SuccessionPages {
    /// Whose: one DC's, or every DC's (`None`).
    dc: Option<DcId>,
    after: Option<ReservationId>,
    finished: bool,
}

impl SuccessionPages {
    /// From the first of `dc`'s successions.
    pub fn of(dc: DcId) -> SuccessionPages {
        SuccessionPages {
            dc: Some(dc),
            after: None,
            finished: false,
        }
    }

    /// From the first succession of every DC's.
    pub fn every() -> SuccessionPages {
        SuccessionPages {
            dc: None,
            after: None,
            finished: false,
        }
    }

    /// The next page; `None` once the last one was read.
    pub async fn next(
        &mut self,
        global: &dyn GlobalStore,
    ) -> Result<Option<Vec<Succession>>, StoreError> {
        if self.finished {
            return Ok(None);
        }
        let after = self.after.as_ref();
        let page = match &self.dc {
            Some(dc) => global.successions_of(dc, after, GET_MANY_KEYS_MAX).await?,
            None => global.scan_successions(after, GET_MANY_KEYS_MAX).await?,
        };
        // Fewer than asked only at the end.
        self.finished = page.len() < GET_MANY_KEYS_MAX;
        self.after = page.last().map(|s| s.link.from.clone());
        Ok(Some(page))
    }

    /// Whether the last page has been read.
    pub fn finished(&self) -> bool {
        self.finished
    }
}

/// Setting `name`'s value decoded as a `T` (postcard, as on the wire; `T`'s
/// default if it was never set), with the bytes held (what a
/// [`GlobalStore::swap_setting`] of it expects). Bytes that do not decode
/// are [`StoreError::Corrupt`], named `what`.
pub(crate) async fn read_setting<T: serde::de::DeserializeOwned + Default>(
    global: &dyn GlobalStore,
    name: Setting,
    what: &'static str,
) -> Result<(T, Option<Vec<u8>>), StoreError> {
    let held = global.setting(name).await?;
    Ok((decode_setting(held.as_deref(), what)?, held))
}

/// A setting's `held` bytes decoded as [`read_setting`] does.
pub(crate) fn decode_setting<T: serde::de::DeserializeOwned + Default>(
    held: Option<&[u8]>,
    what: &'static str,
) -> Result<T, StoreError> {
    match held {
        Some(bytes) => homing_core::wire::decode(bytes).map_err(|e| StoreError::Corrupt {
            what,
            reason: e.to_string(),
        }),
        None => Ok(T::default()),
    }
}

/// Sets setting `name` to `value` (encoded as [`read_setting`] decodes it)
/// provided it holds `held`: [`GlobalStore::swap_setting`]'s answer.
pub(crate) async fn swap_setting_to<T: serde::Serialize>(
    global: &dyn GlobalStore,
    name: Setting,
    held: Option<&[u8]>,
    value: &T,
) -> Result<Result<(), Option<Vec<u8>>>, StoreError> {
    let bytes =
        homing_core::wire::encode(value).map_err(|e| StoreError::InvalidArgument(e.to_string()))?;
    global.swap_setting(name, held, &bytes).await
}

/// The key [`GlobalStore::health`] reads by default: reading it changes
/// nothing, whether or not anyone reserved it.
pub fn health_probe_key() -> Key {
    Key::in_namespace(
        homing_core::Namespace::new("homing-health").expect("a valid namespace literal"),
        homing_core::KeyName::new("probe").expect("a valid key name literal"),
    )
}

/// Rejects a `get_many` batch above the bound.
pub(crate) fn check_batch(len: usize) -> Result<(), StoreError> {
    if len > GET_MANY_KEYS_MAX {
        return Err(StoreError::BatchTooLarge {
            len,
            max: GET_MANY_KEYS_MAX,
        });
    }
    Ok(())
}

/// Rejects a setting value above [`SETTING_BYTES_MAX`].
pub(crate) fn check_setting(name: Setting, value: &[u8]) -> Result<(), StoreError> {
    if value.len() > SETTING_BYTES_MAX {
        return Err(StoreError::SettingTooLarge {
            setting: name,
            bytes: value.len(),
            max: SETTING_BYTES_MAX,
        });
    }
    Ok(())
}

/// A setting swap's judgement, shared by every backend: `Ok(())` when the
/// setting holds `expected` (the swap may write), else `Err` with what it
/// holds (the caller's answer).
pub(crate) fn judge_swap(
    held: Option<Vec<u8>>,
    expected: Option<&[u8]>,
) -> Result<(), Option<Vec<u8>>> {
    match held.as_deref() == expected {
        true => Ok(()),
        false => Err(held),
    }
}

/// Rejects a succession written through the wrong call (a move through
/// `take_over`, a takeover through `set_successor`) or linking a
/// reservation to itself ([`check_link`]).
pub(crate) fn check_cause(
    succession: &Succession,
    cause: SuccessionCause,
) -> Result<(), StoreError> {
    if succession.cause != cause {
        return Err(StoreError::InvalidArgument(format!(
            "a {:?} succession written as {cause:?}",
            succession.cause
        )));
    }
    check_link(succession)
}

/// Rejects a succession linking a reservation to itself (what
/// `import_succession` checks: it takes either cause).
pub(crate) fn check_link(succession: &Succession) -> Result<(), StoreError> {
    if succession.link.from == succession.link.to {
        return Err(StoreError::InvalidArgument(format!(
            "{} cannot succeed itself",
            succession.link.from
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::MemoryGlobalStore;

    #[tokio::test]
    async fn succession_pages_read_every_succession_of_one_dc_or_of_all_once_in_order() {
        let store = MemoryGlobalStore::new();
        for unique in 1..=300 {
            let from = ReservationId::new(DcId::new("iad").unwrap(), unique);
            let to = ReservationId::new(DcId::new("fra").unwrap(), unique);
            let token = homing_core::FencingToken::new(1);
            store
                .set_successor(&Succession::moved(from, to, token))
                .await
                .unwrap();
        }
        let other = ReservationId::new(DcId::new("sin").unwrap(), 1);
        let into = ReservationId::new(DcId::new("fra").unwrap(), 999);
        store
            .set_successor(&Succession::moved(
                other,
                into,
                homing_core::FencingToken::new(1),
            ))
            .await
            .unwrap();
        let mut pages = SuccessionPages::of(DcId::new("iad").unwrap());
        let mut sizes = Vec::new();
        let mut uniques = Vec::new();
        while let Some(page) = pages.next(&store).await.unwrap() {
            sizes.push(page.len());
            uniques.extend(page.iter().map(|s| s.link.from.unique()));
        }
        assert_eq!(sizes, vec![128, 128, 44]);
        assert_eq!(uniques, (1..=300).collect::<Vec<_>>());
        assert!(pages.finished());
        assert!(pages.next(&store).await.unwrap().is_none());

        // Every DC's: iad's 300, then sin's one, in (dc, unique) order.
        let mut pages = SuccessionPages::every();
        let mut froms = Vec::new();
        while let Some(page) = pages.next(&store).await.unwrap() {
            froms.extend(page.into_iter().map(|s| s.link.from));
        }
        assert_eq!(froms.len(), 301);
        assert!(froms.is_sorted(), "store order is reservation order");
        assert_eq!(froms.last().unwrap().dc().as_str(), "sin");
    }
}
