//! Host sessions in the etcd DC store ([`crate::session`]): each row and
//! each index entry is its own key under the DC's prefix:
//!
//! - `s/<session name>` → [`session::encode_session`] (the row);
//! - `sk/<session::session_key_entry>` → reservation id (session keys);
//! - `sn/<session::session_notice_entry>` → reservation id (notices);
//! - `sd/<session::session_due_entry>` → session name (sessions due).
//!
//! A row's compare-and-set, delete and import are one transaction each,
//! guarded by the row's `mod_revision` as read, with its sessions-due entry
//! moved in the same transaction; a failed guard reads the row back in that
//! transaction and the write is judged again (at most
//! [`CAS_ATTEMPTS_MAX`] times). If an attempt was resent after a lost
//! answer (`members::Answer::ambiguous`) and the row read back is exactly
//! the one written, that attempt landed: answered as written, once. The
//! record writes that depend on a row (`compare_and_set_in_session`) go
//! through the appender with the row's compare ([`super::log`]); every
//! record write moves the record's session-index entries in its own
//! transaction (`EtcdDcStore::write` in `dc`).

use etcd_client::{GetOptions, KeyValue, Txn, TxnOp, TxnOpResponse};
use homing_core::{DcRecord, ReservationId, SessionId, SessionRecord, StoreTime};

use super::dc::EtcdDcStore;
use super::members::Op;
use super::{CAS_ATTEMPTS_MAX, every_first_kv, first_kv, protocol, unchanged};
use crate::dc::{Import, check_limit, judge_session_import};
use crate::error::StoreError;
use crate::keyspace;
use crate::session::{self, SessionCas, SessionCursor, SessionIndex};

/// The section of session rows: `s/<session name>`.
const SESSIONS: &[u8] = b"s/";
/// The section of the session-keys index.
const SESSION_KEYS: &[u8] = b"sk/";
/// The section of the session-notices index.
const SESSION_NOTICES: &[u8] = b"sn/";
/// The section of the sessions-due index.
const SESSIONS_DUE: &[u8] = b"sd/";

/// A session row as read, for a write guarded by it.
pub(super) struct StoredRow {
    pub(super) row: Option<SessionRecord>,
    /// Its `mod_revision` (`None`: absent).
    pub(super) revision: Option<i64>,
}

impl StoredRow {
    pub(super) fn of(kv: Option<&KeyValue>) -> Result<StoredRow, StoreError> {
        Ok(StoredRow {
            row: kv
                .map(|kv| session::decode_session(kv.value()))
                .transpose()?,
            revision: kv.map(KeyValue::mod_revision),
        })
    }
}

/// The writes that put a session row: keys put with their values, keys
/// deleted (never one of those put).
pub(super) struct RowWrites {
    pub(super) puts: Vec<(Vec<u8>, Vec<u8>)>,
    pub(super) deletes: Vec<Vec<u8>>,
}

fn contended(what: &str) -> StoreError {
    StoreError::Unavailable {
        backend: "etcd",
        reason: format!("{what}: session row moved for {CAS_ATTEMPTS_MAX} attempts"),
    }
}

impl EtcdDcStore {
    pub(super) fn session_key(&self, id: &SessionId) -> Vec<u8> {
        self.space.key(SESSIONS, &session::session_bytes(id))
    }

    pub(super) fn session_index_key(&self, index: SessionIndex, entry: &[u8]) -> Vec<u8> {
        let section = match index {
            SessionIndex::Keys => SESSION_KEYS,
            SessionIndex::Notices => SESSION_NOTICES,
        };
        self.space.key(section, entry)
    }

    /// The writes that make `row` (encoded: `value`) the stored row over
    /// `old`: the row, and its sessions-due entry moved.
    pub(super) fn session_row_writes(
        &self,
        old: Option<&SessionRecord>,
        row: &SessionRecord,
        value: Vec<u8>,
    ) -> RowWrites {
        let due = |r: &SessionRecord| self.space.key(SESSIONS_DUE, &session::session_due_entry(r));
        let new_due = due(row);
        let deletes = old
            .map(due)
            .filter(|old| *old != new_due)
            .into_iter()
            .collect();
        let puts = vec![
            (self.session_key(&row.id), value),
            (new_due, session::session_bytes(&row.id)),
        ];
        RowWrites { puts, deletes }
    }

    /// [`crate::DcStore::session`].
    /// Session rows and session-keys index entries, counted by etcd in one
    /// read (`count_only`: no values sent).
    pub(super) async fn count_sessions(&self) -> Result<crate::SessionCounts, StoreError> {
        let count = |section: &[u8]| {
            let start = self.space.key(section, b"");
            // Invariant: the section ends in `/`, so it has an end.
            let end = keyspace::prefix_end(&start).expect("a section ending in '/' has an end");
            let options = GetOptions::new().with_range(end).with_count_only();
            TxnOp::get(start, Some(options))
        };
        let txn = Txn::new().and_then([count(SESSIONS), count(SESSION_KEYS)]);
        let txned = self.space.txn_at(Op::BulkRead, txn).await?;
        let [TxnOpResponse::Get(rows), TxnOpResponse::Get(keys)] = txned.responses.as_slice()
        else {
            return Err(protocol(
                "transaction answered without the counts it asked for",
            ));
        };
        let count = |n: i64| u64::try_from(n).unwrap_or(0);
        Ok(crate::SessionCounts {
            rows: count(rows.count()),
            keys: count(keys.count()),
        })
    }

    pub(super) async fn read_session(
        &self,
        id: &SessionId,
    ) -> Result<Option<SessionRecord>, StoreError> {
        let response = self
            .space
            .get(Op::HotRead, self.session_key(id), None)
            .await?;
        Ok(StoredRow::of(response.kvs().first())?.row)
    }

    /// Writes `row` in one transaction guarded by the row's revision as
    /// read, until `judge` (given the stored row, and whether an earlier
    /// attempt may have landed unseen) answers instead.
    async fn swap_row<T>(
        &self,
        row: &SessionRecord,
        written: T,
        judge: impl Fn(Option<SessionRecord>, bool) -> Option<T>,
    ) -> Result<T, StoreError> {
        let value = session::encode_session(row)?;
        let key = self.session_key(&row.id);
        let response = self.space.get(Op::HotRead, key.clone(), None).await?;
        let mut kv = response.kvs().first().cloned();
        let mut maybe_ours = false;
        for _ in 0..CAS_ATTEMPTS_MAX {
            let current = StoredRow::of(kv.as_ref())?.row;
            let RowWrites { puts, deletes } =
                self.session_row_writes(current.as_ref(), row, value.clone());
            if let Some(answer) = judge(current, maybe_ours) {
                return Ok(answer);
            }
            let ops = puts
                .into_iter()
                .map(|(k, v)| TxnOp::put(k, v, None))
                .chain(deletes.into_iter().map(|k| TxnOp::delete(k, None)));
            let txn = Txn::new()
                .when([unchanged(&key, kv.as_ref())])
                .and_then(ops.collect::<Vec<_>>())
                .or_else([TxnOp::get(key.clone(), None)]);
            let txned = self.space.txn_at(Op::HotWrite, txn).await?;
            if txned.succeeded {
                return Ok(written);
            }
            maybe_ours |= txned.ambiguous;
            kv = first_kv(txned.responses.first())?;
        }
        Err(contended("session row write"))
    }

    /// [`crate::DcStore::compare_and_set_session`].
    pub(super) async fn cas_session(
        &self,
        expected: Option<u64>,
        row: &SessionRecord,
    ) -> Result<SessionCas, StoreError> {
        session::check_session_cas(expected, row)?;
        let members = &self.space.members;
        self.swap_row(row, SessionCas::Written, |current, maybe_ours| {
            let conflict = session::judge_session_cas(expected, current)?;
            if !maybe_ours {
                return Some(conflict);
            }
            let resolved = conflict.after_unknown_outcome(row);
            if resolved == SessionCas::Written {
                members.resolved_ambiguous();
            }
            Some(resolved)
        })
        .await
    }

    /// [`crate::DcStore::import_session`].
    pub(super) async fn import_session_row(
        &self,
        row: &SessionRecord,
    ) -> Result<Import<SessionRecord>, StoreError> {
        let members = &self.space.members;
        self.swap_row(row, Import::Written, |current, maybe_ours| {
            match judge_session_import(row, current)? {
                // Our resent write landed: this call wrote it.
                Import::Present if maybe_ours => {
                    members.resolved_ambiguous();
                    Some(Import::Written)
                }
                judged => Some(judged),
            }
        })
        .await
    }

    /// [`crate::DcStore::delete_session`].
    pub(super) async fn remove_session(
        &self,
        id: &SessionId,
        version: u64,
    ) -> Result<bool, StoreError> {
        let key = self.session_key(id);
        let response = self.space.get(Op::BulkRead, key.clone(), None).await?;
        let mut kv = response.kvs().first().cloned();
        let mut maybe_ours = false;
        for _ in 0..CAS_ATTEMPTS_MAX {
            let Some(row) = StoredRow::of(kv.as_ref())?.row else {
                // Gone after a resent delete of it at `version`: that
                // attempt deleted it (any other change bumps the version
                // first, and was seen as such).
                return Ok(maybe_ours);
            };
            if row.version != version {
                return Ok(false);
            }
            let due = self
                .space
                .key(SESSIONS_DUE, &session::session_due_entry(&row));
            let txn = Txn::new()
                .when([unchanged(&key, kv.as_ref())])
                .and_then([TxnOp::delete(key.clone(), None), TxnOp::delete(due, None)])
                .or_else([TxnOp::get(key.clone(), None)]);
            let txned = self.space.txn_at(Op::BulkWrite, txn).await?;
            if txned.succeeded {
                return Ok(true);
            }
            maybe_ours |= txned.ambiguous;
            kv = first_kv(txned.responses.first())?;
        }
        Err(contended("session row delete"))
    }

    /// The records a session index lists in `[start, end)` (relative to
    /// its section), at most `limit`, read at the revision of the entries.
    pub(super) async fn session_page(
        &self,
        index: SessionIndex,
        (start, end): (Vec<u8>, Vec<u8>),
        limit: usize,
    ) -> Result<Vec<DcRecord>, StoreError> {
        check_limit(limit)?;
        let at = self
            .index_page(
                self.session_index_key(index, &start),
                self.session_index_key(index, &end),
                limit,
            )
            .await?;
        let Some((revision, ids)) = at else {
            return Ok(Vec::new());
        };
        let keys: Vec<Vec<u8>> = ids.iter().map(|id| self.space.key(b"r/", id)).collect();
        let found = self.read_at(&keys, revision).await?;
        found
            .into_iter()
            .map(|kv| {
                let kv = kv.ok_or_else(|| {
                    StoreError::corrupt("session index", "entry without a record")
                })?;
                keyspace::decode_record(kv.value())
            })
            .collect()
    }

    /// [`crate::DcStore::session_keys`].
    pub(super) async fn session_key_records(
        &self,
        id: &SessionId,
        after: Option<&ReservationId>,
        limit: usize,
    ) -> Result<Vec<DcRecord>, StoreError> {
        let range = session::session_keys_range(id, after);
        self.session_page(SessionIndex::Keys, range, limit).await
    }

    /// [`crate::DcStore::session_notices`].
    pub(super) async fn session_notice_records(
        &self,
        id: &SessionId,
        after: u64,
        limit: usize,
    ) -> Result<Vec<DcRecord>, StoreError> {
        let range = session::session_notices_range(id, after);
        self.session_page(SessionIndex::Notices, range, limit).await
    }

    /// [`crate::DcStore::due_sessions`].
    pub(super) async fn due_session_rows(
        &self,
        until: StoreTime,
        after: Option<&SessionCursor>,
        limit: usize,
    ) -> Result<Vec<SessionRecord>, StoreError> {
        check_limit(limit)?;
        let (start, end) = session::sessions_due_range(until, after);
        let (start, end) = (
            self.space.key(SESSIONS_DUE, &start),
            self.space.key(SESSIONS_DUE, &end),
        );
        let Some((revision, names)) = self.index_page(start, end, limit).await? else {
            return Ok(Vec::new());
        };
        let keys: Vec<Vec<u8>> = names
            .iter()
            .map(|name| self.space.key(SESSIONS, name))
            .collect();
        let found = self.read_at(&keys, revision).await?;
        found
            .into_iter()
            .map(|kv| {
                let kv = kv.ok_or_else(|| {
                    StoreError::corrupt("sessions due index", "entry without a session")
                })?;
                session::decode_session(kv.value())
            })
            .collect()
    }

    /// [`crate::DcStore::sessions`].
    pub(super) async fn session_rows(
        &self,
        after: Option<&SessionId>,
        limit: usize,
    ) -> Result<Vec<SessionRecord>, StoreError> {
        check_limit(limit)?;
        if limit == 0 {
            // etcd reads limit 0 as "no limit".
            return Ok(Vec::new());
        }
        let section = self.space.key(SESSIONS, b"");
        // Invariant: the section ends in `/`, so it has an end.
        let end = keyspace::prefix_end(&section).expect("a section ending in '/' has an end");
        let start = self.space.key(SESSIONS, &session::sessions_start(after));
        let options = GetOptions::new().with_range(end).with_limit(limit as i64);
        let response = self.space.get(Op::BulkRead, start, Some(options)).await?;
        response
            .kvs()
            .iter()
            .map(|kv| session::decode_session(kv.value()))
            .collect()
    }

    /// The values of at most `limit` keys in `[start, end)` and the revision
    /// they were read at; `None`: none (or `limit` 0).
    async fn index_page(
        &self,
        start: Vec<u8>,
        end: Vec<u8>,
        limit: usize,
    ) -> Result<Option<(i64, Vec<Vec<u8>>)>, StoreError> {
        if limit == 0 {
            // etcd reads limit 0 as "no limit".
            return Ok(None);
        }
        let options = GetOptions::new().with_range(end).with_limit(limit as i64);
        let txn = Txn::new().and_then([TxnOp::get(start, Some(options))]);
        let txned = self.space.txn_at(Op::BulkRead, txn).await?;
        let [TxnOpResponse::Get(page)] = txned.responses.as_slice() else {
            return Err(protocol(
                "transaction answered without the get it asked for",
            ));
        };
        let values: Vec<Vec<u8>> = page.kvs().iter().map(|kv| kv.value().to_vec()).collect();
        Ok((!values.is_empty()).then_some((txned.revision, values)))
    }

    /// `keys` read in one transaction at `revision`: the first kv of each.
    async fn read_at(
        &self,
        keys: &[Vec<u8>],
        revision: i64,
    ) -> Result<Vec<Option<KeyValue>>, StoreError> {
        let at = GetOptions::new().with_revision(revision);
        let gets: Vec<TxnOp> = keys
            .iter()
            .map(|k| TxnOp::get(k.clone(), Some(at.clone())))
            .collect();
        let (_, responses) = self
            .space
            .txn(Op::BulkRead, Txn::new().and_then(gets))
            .await?;
        every_first_kv(&responses, keys.len())
    }
}
