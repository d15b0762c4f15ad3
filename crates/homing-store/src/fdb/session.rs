//! Host sessions in the FoundationDB DC store ([`crate::session`]), in the
//! DC's subspace beside the records, one key per row and per index entry:
//! `s/<session name>` → [`session::encode_session`], `sk/<session key
//! entry>` and `sn/<session notice entry>` → reservation id, `sd/<sessions
//! due entry>` → session name. Each write is one transaction that reads
//! what it judges (so a racing write conflicts and FDB retries it, judged
//! anew) and moves the derived entries with it; a write guarded by a
//! session row reads the row in its transaction (`FdbDcStore::write` in
//! `dc`). A retry after a commit whose outcome is unknown recognises its
//! own row ([`SessionCas::after_unknown_outcome`]).

use foundationdb::Transaction;
use homing_core::{DcRecord, ReservationId, SessionId, SessionRecord, StoreTime};

use super::dc::FdbDcStore;
use super::{Step, TRANSACTION_ATTEMPTS_MAX, exact_range, fdb_err};
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

impl FdbDcStore {
    pub(super) fn session_key(&self, id: &SessionId) -> Vec<u8> {
        self.space.key(SESSIONS, &session::session_bytes(id))
    }

    fn session_index_key(&self, index: SessionIndex, entry: &[u8]) -> Vec<u8> {
        let section = match index {
            SessionIndex::Keys => SESSION_KEYS,
            SessionIndex::Notices => SESSION_NOTICES,
        };
        self.space.key(section, entry)
    }

    fn session_due_key(&self, row: &SessionRecord) -> Vec<u8> {
        self.space
            .key(SESSIONS_DUE, &session::session_due_entry(row))
    }

    /// The stored row of session `id`, read in `trx`.
    pub(super) async fn stored_session(
        &self,
        trx: &Transaction,
        id: &SessionId,
    ) -> Result<Result<Option<SessionRecord>, StoreError>, foundationdb::FdbError> {
        let value = trx.get(&self.session_key(id), false).await?;
        Ok(value.map(|v| session::decode_session(&v)).transpose())
    }

    /// Writes `row` (encoded: `value`) over `old` in `trx`, moving its
    /// sessions-due entry.
    pub(super) fn put_session(
        &self,
        trx: &Transaction,
        old: Option<&SessionRecord>,
        row: &SessionRecord,
        value: &[u8],
    ) {
        if let Some(old) = old {
            trx.clear(&self.session_due_key(old));
        }
        trx.set(&self.session_due_key(row), &session::session_bytes(&row.id));
        trx.set(&self.session_key(&row.id), value);
    }

    /// Moves `record`'s session-index entries from `old`'s, in `trx`.
    pub(super) fn reindex_sessions(
        &self,
        trx: &Transaction,
        old: Option<&DcRecord>,
        record: &DcRecord,
    ) {
        let (gone, added) = session::session_index_changes(old, record);
        for entry in gone {
            trx.clear(&self.session_index_key(entry.index, &entry.entry));
        }
        let id = keyspace::id_bytes(&record.id);
        for entry in added {
            trx.set(&self.session_index_key(entry.index, &entry.entry), &id);
        }
    }

    /// [`crate::DcStore::session`].
    pub(super) async fn read_session(
        &self,
        id: &SessionId,
    ) -> Result<Option<SessionRecord>, StoreError> {
        transact!(self.space, trx, {
            Ok(Step::Done(step!(self.stored_session(&trx, id).await)?))
        })
    }

    /// [`crate::DcStore::compare_and_set_session`].
    pub(super) async fn cas_session(
        &self,
        expected: Option<u64>,
        row: &SessionRecord,
    ) -> Result<SessionCas, StoreError> {
        session::check_session_cas(expected, row)?;
        let value = session::encode_session(row)?;
        let mut unknown = false;
        transact!(self.space, trx, unknown, {
            let current = step!(self.stored_session(&trx, &row.id).await)?;
            if let Some(conflict) = session::judge_session_cas(expected, current.clone()) {
                return Ok(Step::Done(if unknown {
                    conflict.after_unknown_outcome(row)
                } else {
                    conflict
                }));
            }
            self.put_session(&trx, current.as_ref(), row, &value);
            Ok(Step::Done(SessionCas::Written))
        })
    }

    /// [`crate::DcStore::delete_session`].
    pub(super) async fn remove_session(
        &self,
        id: &SessionId,
        version: u64,
    ) -> Result<bool, StoreError> {
        let mut unknown = false;
        transact!(self.space, trx, unknown, {
            let Some(row) = step!(self.stored_session(&trx, id).await)? else {
                // Gone after a commit of this delete that may have landed:
                // it did (any other change bumps the version first).
                return Ok(Step::Done(unknown));
            };
            if row.version != version {
                return Ok(Step::Done(false));
            }
            trx.clear(&self.session_due_key(&row));
            trx.clear(&self.session_key(id));
            Ok(Step::Done(true))
        })
    }

    /// [`crate::DcStore::import_session`].
    pub(super) async fn import_session_row(
        &self,
        row: &SessionRecord,
    ) -> Result<Import<SessionRecord>, StoreError> {
        let value = session::encode_session(row)?;
        let mut unknown = false;
        transact!(self.space, trx, unknown, {
            let current = step!(self.stored_session(&trx, &row.id).await)?;
            match judge_session_import(row, current.clone()) {
                // A commit of this import that may have landed did.
                Some(Import::Present) if unknown => return Ok(Step::Done(Import::Written)),
                Some(judged) => return Ok(Step::Done(judged)),
                None => {}
            }
            self.put_session(&trx, current.as_ref(), row, &value);
            Ok(Step::Done(Import::Written))
        })
    }

    /// The records a session index lists in `[start, end)` (relative to its
    /// section), at most `limit`, read in one transaction.
    async fn session_page(
        &self,
        index: SessionIndex,
        (start, end): (Vec<u8>, Vec<u8>),
        limit: usize,
    ) -> Result<Vec<DcRecord>, StoreError> {
        check_limit(limit)?;
        if limit == 0 {
            return Ok(Vec::new());
        }
        let (start, end) = (
            self.session_index_key(index, &start),
            self.session_index_key(index, &end),
        );
        let found = transact!(self.space, trx, {
            let range = exact_range(start.clone(), end.clone(), limit);
            let ids: Vec<Vec<u8>> = step!(trx.get_range(&range, 1, false).await)
                .iter()
                .map(|kv| kv.value().to_vec())
                .collect();
            let mut out = Vec::with_capacity(ids.len());
            for id in &ids {
                let rk = self.space.key(b"r/", id);
                out.push(step!(trx.get(&rk, false).await).map(|v| v.to_vec()));
            }
            Ok(Step::Done(out))
        })?;
        found
            .into_iter()
            .map(|value| {
                let value = value.ok_or_else(|| {
                    StoreError::corrupt("session index", "entry without a record")
                })?;
                keyspace::decode_record(&value)
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
        if limit == 0 {
            return Ok(Vec::new());
        }
        let (start, end) = session::sessions_due_range(until, after);
        let (start, end) = (
            self.space.key(SESSIONS_DUE, &start),
            self.space.key(SESSIONS_DUE, &end),
        );
        let found = transact!(self.space, trx, {
            let range = exact_range(start.clone(), end.clone(), limit);
            let names: Vec<Vec<u8>> = step!(trx.get_range(&range, 1, false).await)
                .iter()
                .map(|kv| kv.value().to_vec())
                .collect();
            let mut out = Vec::with_capacity(names.len());
            for name in &names {
                let key = self.space.key(SESSIONS, name);
                out.push(step!(trx.get(&key, false).await).map(|v| v.to_vec()));
            }
            Ok(Step::Done(out))
        })?;
        found
            .into_iter()
            .map(|value| {
                let value = value.ok_or_else(|| {
                    StoreError::corrupt("sessions due index", "entry without a session")
                })?;
                session::decode_session(&value)
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
            return Ok(Vec::new());
        }
        let section = self.space.key(SESSIONS, b"");
        // Invariant: the section ends in `/`, so it has an end.
        let end = keyspace::prefix_end(&section).expect("a section ending in '/' has an end");
        let start = self.space.key(SESSIONS, &session::sessions_start(after));
        let found = transact!(self.space, trx, {
            let range = exact_range(start.clone(), end.clone(), limit);
            let rows: Vec<Vec<u8>> = step!(trx.get_range(&range, 1, false).await)
                .iter()
                .map(|kv| kv.value().to_vec())
                .collect();
            Ok(Step::Done(rows))
        })?;
        found
            .iter()
            .map(|value| session::decode_session(value))
            .collect()
    }
}
