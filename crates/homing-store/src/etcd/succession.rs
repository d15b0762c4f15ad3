//! Successions in etcd (DESIGN.md §7.5): `succ/<keyspace::succession_key>`
//! → [`keyspace::encode_succession`] under the global prefix, written once,
//! never deleted. One DC's successions are one key range, in unique order;
//! the whole section is every DC's, in (dc, unique) order (`scan_successions`).
//!
//! - `set_successor` (and `import_succession`, a migration's copy of either
//!   cause, through the same write): `create_revision(succ) == 0` ? put :
//!   get, like a global entry's write-once. If an abandoned attempt may have
//!   landed (`members::Answer::ambiguous`) and the read-back is the caller's
//!   own succession, it was written once, by this call: answered as inserted.
//! - `take_over`: read `succ/<from>`, `dcs/<dc>` and `dcl/<dc>` (the DC
//!   lease's keys, `dc_lease`) and judge the DC as `dc_lease` does; if the
//!   policy allows it, ONE transaction puts the succession guarded by:
//!   `succ/<from>` absent, `dcs/<dc>` at the `mod_revision` judged (so a
//!   retire, or any change of terms or marks, in between fails it), and
//!   `dcl/<dc>` absent (`create_revision == 0`: etcd's own lease clock ran
//!   out on the DC's last renewal). A failed guard reads the three keys
//!   back in the same transaction and judges again, at most
//!   [`TAKE_OVER_ATTEMPTS_MAX`] times; what it finds is answered as
//!   `Exists` (a succession) or `Refused` (the DC's state).
//!
//! Why "`dcl/<dc>` absent" means expired, never "renewing": a renewal
//! *puts* `dcl/<dc>` on a fresh etcd lease in one transaction (a put over
//! the key, never a delete then a put), so a DC whose key exists keeps it
//! through every renewal; it is absent only before the DC's first renewal
//! (then `dcs/<dc>` has no terms: `Unknown`, refused before any write) or
//! after etcd deleted it with its lease. The renewal then revokes the lease
//! the key was on *before*: revoking deletes only the keys attached to that
//! lease, and the key is already on the new one (no write ever puts a
//! replaced lease back, see `dc_lease`). A renewal attempt that failed its
//! guard revokes only its own lease, which holds no key. etcd deletes the
//! key when the leader's lease clock passes the ttl, counted from a grant
//! made after the renewal was sent; a leader change restarts every ttl —
//! both only make the key live longer. So the DC's lease has expired
//! whenever the key is absent, and a renewal that lands after the
//! takeover's read but before its write creates the key and fails the
//! guard: the takeover is refused (or the renewal came after it, and the
//! returning DC finds the takeover in `successions_of`).
//!
//! One gap is closed by refusing: etcd may answer that the key's lease is
//! gone (so `dc_lease` calls the DC expired) a moment before it deletes the
//! key. The guard cannot pass until the key is gone, so the takeover
//! answers `Refused` with the DC `Lapsed` for 1 ms: the caller tries again.

use etcd_client::{Compare, CompareOp, GetOptions, KeyValue, Txn, TxnOp};
use homing_core::succession::takeover_allowed;
use homing_core::{
    DcId, DcLeaseState, DcStanding, ReservationId, Succession, TakeOverReply, TakeoverPolicy,
};

use super::dc_lease::{DcLeases, Held};
use super::members::Op;
use super::{Space, every_first_kv, first_kv, protocol, unchanged};
use crate::error::StoreError;
use crate::keyspace;

/// The section of successions: `succ/<keyspace::succession_key>`.
const SUCCESSIONS: &[u8] = b"succ/";
/// Most attempts of one takeover whose guard failed because the DC's keys
/// moved (a renewal, a retire) without deciding it.
pub const TAKE_OVER_ATTEMPTS_MAX: usize = 16;

/// The successions under one global prefix.
#[derive(Clone)]
pub(super) struct Successions {
    space: Space,
    leases: DcLeases,
}

/// What one read found: the succession key, and the DC's lease keys.
pub(super) struct Found {
    /// `succ/<from>`.
    pub(super) succession: Option<KeyValue>,
    /// The DC's `dcs/` and `dcl/` keys.
    pub(super) held: Held,
}

/// What one guarded takeover write did.
pub(super) struct Attempt {
    /// `None`: written; else what the failed guard read back.
    pub(super) failed: Option<Found>,
    /// An earlier attempt of it may have landed unanswered.
    pub(super) ambiguous: bool,
}

impl Successions {
    pub(super) fn new(space: Space, leases: DcLeases) -> Successions {
        Successions { space, leases }
    }

    fn key(&self, from: &ReservationId) -> Vec<u8> {
        self.space.key(SUCCESSIONS, &keyspace::succession_key(from))
    }

    /// The succession of `from`, if any (a linearizable read).
    pub(super) async fn get(&self, from: &ReservationId) -> Result<Option<Succession>, StoreError> {
        let response = self.space.get(Op::HotRead, self.key(from), None).await?;
        response
            .kvs()
            .first()
            .map(|kv| keyspace::decode_succession(from, kv.value()))
            .transpose()
    }

    /// Writes `succession` unless its reservation has one; the one it has
    /// otherwise (see the module doc).
    pub(super) async fn set(
        &self,
        succession: &Succession,
    ) -> Result<Option<Succession>, StoreError> {
        let from = &succession.link.from;
        let key = self.key(from);
        let txn = Txn::new()
            .when([Compare::create_revision(key.clone(), CompareOp::Equal, 0)])
            .and_then([TxnOp::put(
                key.clone(),
                keyspace::encode_succession(succession),
                None,
            )])
            .or_else([TxnOp::get(key, None)]);
        let seen = self.space.members.revision_seen();
        let txned = self.space.txn_at(Op::HotWrite, txn).await?;
        if txned.succeeded {
            return Ok(None);
        }
        let kv = first_kv(txned.responses.first())?
            .ok_or_else(|| protocol("succession vanished (successions are never deleted)"))?;
        let existing = keyspace::decode_succession(from, kv.value())?;
        if &existing == succession && self.space.members.landed_ours(txned.ambiguous, seen, &kv) {
            // An abandoned attempt of this call landed: written once, by us.
            return Ok(None);
        }
        Ok(Some(existing))
    }

    /// The guarded takeover (see the module doc).
    pub(super) async fn take_over(
        &self,
        succession: &Succession,
        policy: TakeoverPolicy,
    ) -> Result<TakeOverReply, StoreError> {
        let from = &succession.link.from;
        let mut found = self.read(from).await?;
        // Whether an attempt of ours may have landed unanswered.
        let mut ambiguous = false;
        for _ in 0..TAKE_OVER_ATTEMPTS_MAX {
            if let Some(kv) = &found.succession {
                let existing = keyspace::decode_succession(from, kv.value())?;
                if ambiguous && &existing == succession {
                    self.space.members.resolved_ambiguous();
                    return Ok(TakeOverReply::Taken);
                }
                return Ok(TakeOverReply::Exists(existing));
            }
            let (state, held) = self.leases.judged(from.dc(), found.held).await?;
            if !takeover_allowed(policy, &state, succession) {
                return Ok(TakeOverReply::Refused(state));
            }
            if held.live.is_some() {
                return Ok(TakeOverReply::Refused(not_yet_deleted(state)));
            }
            let attempt = self.write_guarded(succession, &held).await?;
            ambiguous |= attempt.ambiguous;
            match attempt.failed {
                None => return Ok(TakeOverReply::Taken),
                Some(now) => found = now,
            }
        }
        Err(StoreError::Unavailable {
            backend: "etcd",
            reason: format!(
                "takeover of {from}: the dc's keys moved for {TAKE_OVER_ATTEMPTS_MAX} attempts"
            ),
        })
    }

    /// The gets of a takeover's read: succession, then the DC's entry and live key.
    fn reads(&self, from: &ReservationId) -> [TxnOp; 3] {
        let (entry_key, live_key) = self.leases.keys(from.dc());
        [
            TxnOp::get(self.key(from), None),
            TxnOp::get(entry_key, None),
            TxnOp::get(live_key, None),
        ]
    }

    /// `from`'s succession key and its DC's lease keys, in one read.
    pub(super) async fn read(&self, from: &ReservationId) -> Result<Found, StoreError> {
        let txn = Txn::new().and_then(self.reads(from));
        let (_, responses) = self.space.txn(Op::HotRead, txn).await?;
        Found::of(&responses)
    }

    /// One write of the takeover `succession`, guarded by: no succession,
    /// the DC's entry as in `held` (judged expired), and no live key.
    pub(super) async fn write_guarded(
        &self,
        succession: &Succession,
        held: &Held,
    ) -> Result<Attempt, StoreError> {
        let from = &succession.link.from;
        let key = self.key(from);
        let (entry_key, live_key) = self.leases.keys(from.dc());
        let guards = [
            Compare::create_revision(key.clone(), CompareOp::Equal, 0),
            unchanged(&entry_key, held.entry.as_ref()),
            Compare::create_revision(live_key, CompareOp::Equal, 0),
        ];
        let put = TxnOp::put(key, keyspace::encode_succession(succession), None);
        let txn = Txn::new()
            .when(guards)
            .and_then([put])
            .or_else(self.reads(from));
        let txned = self.space.txn_at(Op::HotWrite, txn).await?;
        Ok(Attempt {
            failed: match txned.succeeded {
                true => None,
                false => Some(Found::of(&txned.responses)?),
            },
            ambiguous: txned.ambiguous,
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
            // etcd reads limit 0 as "no limit".
            return Ok(Vec::new());
        }
        let options = GetOptions::new().with_range(end).with_limit(limit as i64);
        let response = self.space.get(Op::BulkRead, start, Some(options)).await?;
        let section = self.space.key(SUCCESSIONS, b"");
        response
            .kvs()
            .iter()
            .map(|kv| {
                let key = kv
                    .key()
                    .strip_prefix(section.as_slice())
                    .ok_or_else(|| protocol("range answered a key outside its section"))?;
                let from = keyspace::decode_succession_key(key)?;
                keyspace::decode_succession(&from, kv.value())
            })
            .collect()
    }
}

impl Found {
    /// The three gets of a takeover's read: succession, entry, live key.
    fn of(responses: &[etcd_client::TxnOpResponse]) -> Result<Found, StoreError> {
        let mut kvs = every_first_kv(responses, 3)?.into_iter();
        let succession = kvs.next().flatten();
        let held = Held {
            entry: kvs.next().flatten(),
            live: kvs.next().flatten(),
        };
        Ok(Found { succession, held })
    }
}

/// A DC whose live key etcd has not deleted yet, though its lease is gone:
/// not expired for a takeover until the key is gone.
fn not_yet_deleted(state: DcLeaseState) -> DcLeaseState {
    DcLeaseState {
        standing: DcStanding::Lapsed { expires_in_ms: 1 },
        ..state
    }
}
