//! Successions in FoundationDB (DESIGN.md §7.5). **Verified by
//! compilation, not against a running cluster** (as the rest of the
//! backend; see [`crate::fdb`]).
//!
//! `succ/<keyspace::succession_key>` → [`keyspace::encode_succession`]
//! under the global prefix, written once, never deleted; one DC's
//! successions are one key range, in unique order; the whole section is
//! every DC's, in (dc, unique) order (`scan_successions`).
//!
//! - `set_successor` (and `import_succession`, a migration's copy of either
//!   cause, through the same write): one transaction reads the key and sets
//!   it when absent. Run again after a commit whose result is unknown, it may read
//!   the caller's own succession back: that one was written by this call,
//!   answered as inserted.
//! - `take_over`: ONE serializable transaction reads the succession key,
//!   then the DC's `dcs/<dc>` and `dcv/<dc>` as `dc_lease` does (at the
//!   transaction's read version), judges the DC, and writes the succession
//!   only if there is none and the policy allows the DC's state. The reads
//!   take read conflict ranges: a renewal (which writes both DC keys) or a
//!   retire (which writes `dcs/<dc>`) or another succession committed
//!   between the read version and this commit makes the commit fail with a
//!   conflict, and the retry judges again from what is there then. So a
//!   renewal either commits first (the takeover is refused) or after (and
//!   the returning DC finds the takeover in `successions_of`).

use foundationdb::Transaction;
use homing_core::succession::takeover_allowed;
use homing_core::{DcId, ReservationId, Succession, TakeOverReply, TakeoverPolicy};

use super::dc_lease::DcLeases;
use super::{Space, Step, TRANSACTION_ATTEMPTS_MAX, exact_range, fdb_err};
use crate::error::StoreError;
use crate::keyspace;

/// The section of successions: `succ/<keyspace::succession_key>`.
const SUCCESSIONS: &[u8] = b"succ/";

/// The successions under one global prefix.
pub(super) struct Successions {
    space: Space,
}

/// What a takeover's transaction decided, before decoding.
enum Decided {
    /// The stored succession's bytes.
    Exists(Vec<u8>),
    Refused(homing_core::DcLeaseState),
    Taken,
}

impl Successions {
    pub(super) fn new(space: Space) -> Successions {
        Successions { space }
    }

    fn key(&self, from: &ReservationId) -> Vec<u8> {
        self.space.key(SUCCESSIONS, &keyspace::succession_key(from))
    }

    /// The succession of `from`, if any.
    pub(super) async fn get(&self, from: &ReservationId) -> Result<Option<Succession>, StoreError> {
        let key = self.key(from);
        let found = transact!(self.space, trx, {
            Ok(Step::Done(
                step!(trx.get(&key, false).await).map(|v| v.to_vec()),
            ))
        })?;
        found
            .map(|bytes| keyspace::decode_succession(from, &bytes))
            .transpose()
    }

    /// Writes `succession` unless its reservation has one; the one it has
    /// otherwise (see the module doc).
    pub(super) async fn set(
        &self,
        succession: &Succession,
    ) -> Result<Option<Succession>, StoreError> {
        let from = &succession.link.from;
        let (key, value) = (self.key(from), keyspace::encode_succession(succession));
        let mut unknown = false;
        let found = transact!(self.space, trx, unknown, {
            let found = step!(trx.get(&key, false).await).map(|v| v.to_vec());
            if found.is_none() {
                trx.set(&key, &value);
            }
            Ok(Step::Done(found))
        })?;
        let Some(bytes) = found else { return Ok(None) };
        let existing = keyspace::decode_succession(from, &bytes)?;
        // A commit whose result was unknown landed: written once, by us.
        Ok((!(unknown && &existing == succession)).then_some(existing))
    }

    /// The guarded takeover (see the module doc).
    pub(super) async fn take_over(
        &self,
        leases: &DcLeases,
        succession: &Succession,
        policy: TakeoverPolicy,
    ) -> Result<TakeOverReply, StoreError> {
        let from = &succession.link.from;
        let (key, value) = (self.key(from), keyspace::encode_succession(succession));
        let mut unknown = false;
        let decided = transact!(self.space, trx, unknown, {
            let decided = step!(decide(&trx, leases, from.dc(), &key, policy, succession).await)?;
            if matches!(decided, Decided::Taken) {
                trx.set(&key, &value);
            }
            Ok(Step::Done(decided))
        })?;
        Ok(match decided {
            Decided::Taken => TakeOverReply::Taken,
            Decided::Refused(state) => TakeOverReply::Refused(state),
            Decided::Exists(bytes) => {
                let existing = keyspace::decode_succession(from, &bytes)?;
                if unknown && &existing == succession {
                    // A commit whose result was unknown landed.
                    TakeOverReply::Taken
                } else {
                    TakeOverReply::Exists(existing)
                }
            }
        })
    }

    /// `dc`'s successions strictly after `after`, at most `limit` (checked
    /// by the caller), in unique order.
    pub(super) async fn of(
        &self,
        dc: &DcId,
        after: Option<&ReservationId>,
        limit: usize,
    ) -> Result<Vec<Succession>, StoreError> {
        let Some((start, end)) = keyspace::successions_range(dc, after)? else {
            return Ok(Vec::new());
        };
        let (start, end) = (
            self.space.key(SUCCESSIONS, &start),
            self.space.key(SUCCESSIONS, &end),
        );
        self.between(start, end, limit).await
    }

    /// Every DC's successions strictly after `after`'s, at most `limit`
    /// (checked by the caller), in (dc, unique) order.
    pub(super) async fn scan(
        &self,
        after: Option<&ReservationId>,
        limit: usize,
    ) -> Result<Vec<Succession>, StoreError> {
        let section = self.space.key(SUCCESSIONS, b"");
        // Invariant: the section ends in `/`, so it has an end.
        let end = keyspace::prefix_end(&section).expect("a section ending in '/' has an end");
        let start = self
            .space
            .key(SUCCESSIONS, &keyspace::successions_scan_start(after));
        self.between(start, end, limit).await
    }

    /// The successions whose full keys are in `[start, end)`, at most `limit`.
    async fn between(
        &self,
        start: Vec<u8>,
        end: Vec<u8>,
        limit: usize,
    ) -> Result<Vec<Succession>, StoreError> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        let rows = transact!(self.space, trx, {
            let range = exact_range(start.clone(), end.clone(), limit);
            let rows: Vec<(Vec<u8>, Vec<u8>)> = step!(trx.get_range(&range, 1, false).await)
                .iter()
                .map(|kv| (kv.key().to_vec(), kv.value().to_vec()))
                .collect();
            Ok(Step::Done(rows))
        })?;
        let section = self.space.key(SUCCESSIONS, b"");
        rows.into_iter()
            .map(|(k, v)| {
                let k = k
                    .strip_prefix(section.as_slice())
                    .ok_or_else(|| StoreError::corrupt("succession", "key outside its section"))?;
                keyspace::decode_succession(&keyspace::decode_succession_key(k)?, &v)
            })
            .collect()
    }
}

/// Inside the takeover's transaction: the succession if there is one, else
/// the DC's state as judged at the read version, refused or allowed.
async fn decide(
    trx: &Transaction,
    leases: &DcLeases,
    dc: &DcId,
    key: &[u8],
    policy: TakeoverPolicy,
    succession: &Succession,
) -> Result<Result<Decided, StoreError>, foundationdb::FdbError> {
    let version = trx.get_read_version().await?;
    if let Some(existing) = trx.get(key, false).await? {
        return Ok(Ok(Decided::Exists(existing.to_vec())));
    }
    let read = leases.read_in(trx, dc).await?;
    Ok(leases.judge(dc, &read, version).map(|state| {
        if takeover_allowed(policy, &state, succession) {
            Decided::Taken
        } else {
            Decided::Refused(state)
        }
    }))
}
