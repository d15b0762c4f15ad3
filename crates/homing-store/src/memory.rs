//! In-memory backends for tests and the simulator: deterministic, not
//! durable, and as strict as the real ones (same errors, same scan order,
//! since scans order by the same [`crate::keyspace`] bytes).

use std::collections::BTreeMap;
use std::sync::Mutex;

use async_trait::async_trait;
use homing_core::{
    DcId, DcLeaseState, DcMarks, DcRecord, DcRenewal, DcTerms, Due, DueCursor, DueKind, DuePage,
    Event, EventSeq, Key, Namespace, NamespaceScope, RecordRead, ReservationId, SessionId,
    SessionRecord, StoreTime, Succession, SuccessionCause, TakeOverReply, TakeoverPolicy,
};

use homing_core::succession::judge_takeover;

use crate::allocator::Blocks;
use crate::dc::{
    Cas, DcStore, EventPage, Import, ScanCursor, check_cas, check_events_limit, check_limit,
    check_scan, judge_cas, judge_event_import, judge_import,
};
use crate::dc_lease::{DcLeaseTable, LeaseClock, process_clock};
use crate::error::StoreError;
use crate::global::{
    DCS_MAX, GlobalStore, SetIfAbsent, check_batch, check_cause, check_link, check_setting,
    judge_swap,
};
use crate::keyspace;
use crate::session::{
    self, GuardedCas, SessionCas, SessionCursor, SessionEntry, SessionGuard, SessionIndex,
};
use crate::setting::Setting;

/// A [`GlobalStore`] in a `BTreeMap` (key order, for [`GlobalStore::scan`]).
pub struct MemoryGlobalStore {
    entries: Mutex<BTreeMap<Key, ReservationId>>,
    /// Locked after `dcs` when both are held (a takeover).
    successions: Mutex<BTreeMap<ReservationId, Succession>>,
    dcs: Mutex<DcLeaseTable>,
    settings: Mutex<BTreeMap<Setting, Vec<u8>>>,
}

impl Default for MemoryGlobalStore {
    fn default() -> Self {
        MemoryGlobalStore::with_clock(process_clock())
    }
}

impl std::fmt::Debug for MemoryGlobalStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryGlobalStore").finish_non_exhaustive()
    }
}

impl MemoryGlobalStore {
    /// An empty store judging DC leases by this process's monotonic clock.
    pub fn new() -> MemoryGlobalStore {
        MemoryGlobalStore::default()
    }

    /// An empty store judging DC leases by `clock` (ms; a test's or the
    /// simulator's).
    pub fn with_clock(clock: LeaseClock) -> MemoryGlobalStore {
        MemoryGlobalStore {
            entries: Mutex::default(),
            successions: Mutex::default(),
            dcs: Mutex::new(DcLeaseTable::new(clock, [])),
            settings: Mutex::default(),
        }
    }

    fn dcs(&self) -> std::sync::MutexGuard<'_, DcLeaseTable> {
        // Every change of the table is one `put`: a poisoned table is consistent.
        self.dcs.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn successions(&self) -> std::sync::MutexGuard<'_, BTreeMap<ReservationId, Succession>> {
        // Inserts are single calls: a poisoned map is consistent.
        self.successions.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn settings(&self) -> std::sync::MutexGuard<'_, BTreeMap<Setting, Vec<u8>>> {
        // A swap is one insert: a poisoned map is consistent.
        self.settings.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn entries(&self) -> std::sync::MutexGuard<'_, BTreeMap<Key, ReservationId>> {
        // A panic while holding the lock cannot leave a half-written entry
        // (inserts are single calls), so a poisoned map is still consistent.
        self.entries.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[async_trait]
impl GlobalStore for MemoryGlobalStore {
    async fn get(&self, key: &Key) -> Result<Option<ReservationId>, StoreError> {
        Ok(self.entries().get(key).cloned())
    }

    async fn get_many(&self, keys: &[Key]) -> Result<Vec<Option<ReservationId>>, StoreError> {
        check_batch(keys.len())?;
        let entries = self.entries();
        Ok(keys.iter().map(|k| entries.get(k).cloned()).collect())
    }

    async fn set_if_absent(
        &self,
        key: &Key,
        id: &ReservationId,
    ) -> Result<SetIfAbsent, StoreError> {
        let mut entries = self.entries();
        match entries.get(key) {
            Some(existing) => Ok(SetIfAbsent::Exists(existing.clone())),
            None => {
                entries.insert(key.clone(), id.clone());
                Ok(SetIfAbsent::Inserted)
            }
        }
    }

    async fn renew_dc_lease(
        &self,
        dc: &DcId,
        terms: &DcTerms,
        marks: &DcMarks,
    ) -> Result<DcRenewal, StoreError> {
        let mut dcs = self.dcs();
        let renewed = dcs.entry(dc).renewed(*terms, *marks);
        if let Some(entry) = renewed {
            dcs.put(dc, entry, true);
        }
        Ok(DcLeaseTable::renewal(renewed))
    }

    async fn dc_lease(&self, dc: &DcId) -> Result<DcLeaseState, StoreError> {
        Ok(self.dcs().state(dc))
    }

    async fn dc_leases(&self) -> Result<Vec<DcLeaseState>, StoreError> {
        let mut states = self.dcs().states();
        states.truncate(DCS_MAX);
        Ok(states)
    }

    async fn retire_dc(&self, dc: &DcId) -> Result<DcLeaseState, StoreError> {
        let mut dcs = self.dcs();
        let retired = dcs.entry(dc).retire();
        dcs.put(dc, retired, false);
        Ok(dcs.state(dc))
    }

    async fn successor(&self, from: &ReservationId) -> Result<Option<Succession>, StoreError> {
        Ok(self.successions().get(from).cloned())
    }

    async fn set_successor(
        &self,
        succession: &Succession,
    ) -> Result<Option<Succession>, StoreError> {
        check_cause(succession, SuccessionCause::Moved)?;
        Ok(insert_succession(&mut self.successions(), succession))
    }

    async fn import_succession(
        &self,
        succession: &Succession,
    ) -> Result<Option<Succession>, StoreError> {
        check_link(succession)?;
        Ok(insert_succession(&mut self.successions(), succession))
    }

    async fn take_over(
        &self,
        succession: &Succession,
        policy: TakeoverPolicy,
    ) -> Result<TakeOverReply, StoreError> {
        check_cause(succession, SuccessionCause::TakenOver)?;
        // The DC table stays locked through the write: no renewal between.
        let dcs = self.dcs();
        let mut successions = self.successions();
        let existing = successions.get(&succession.link.from).cloned();
        let state = dcs.state(succession.link.from.dc());
        if let Some(reply) = judge_takeover(existing, state, policy, succession) {
            return Ok(reply);
        }
        insert_succession(&mut successions, succession);
        Ok(TakeOverReply::Taken)
    }

    async fn successions_of(
        &self,
        dc: &DcId,
        after: Option<&ReservationId>,
        limit: usize,
    ) -> Result<Vec<Succession>, StoreError> {
        check_batch(limit)?;
        let start = match after {
            Some(after) if after.dc() == dc => after.unique().saturating_add(1),
            Some(after) => {
                return Err(StoreError::InvalidArgument(format!(
                    "cursor {after} is not a reservation of dc {dc}"
                )));
            }
            None => 0,
        };
        let range =
            ReservationId::new(dc.clone(), start)..=ReservationId::new(dc.clone(), u64::MAX);
        let successions = self.successions();
        Ok(if after.is_some_and(|a| a.unique() == u64::MAX) {
            Vec::new()
        } else {
            successions
                .range(range)
                .take(limit)
                .map(|(_, s)| s.clone())
                .collect()
        })
    }

    async fn scan_successions(
        &self,
        after: Option<&ReservationId>,
        limit: usize,
    ) -> Result<Vec<Succession>, StoreError> {
        check_batch(limit)?;
        use std::ops::Bound::{Excluded, Unbounded};
        let start = after.map_or(Unbounded, Excluded);
        // `ReservationId` order is the byte-keyed backends' (dc, unique) order.
        let successions = self.successions();
        Ok(successions
            .range::<ReservationId, _>((start, Unbounded))
            .take(limit)
            .map(|(_, s)| s.clone())
            .collect())
    }

    async fn setting(&self, name: Setting) -> Result<Option<Vec<u8>>, StoreError> {
        Ok(self.settings().get(&name).cloned())
    }

    async fn swap_setting(
        &self,
        name: Setting,
        expected: Option<&[u8]>,
        value: &[u8],
    ) -> Result<Result<(), Option<Vec<u8>>>, StoreError> {
        check_setting(name, value)?;
        let mut settings = self.settings();
        let judged = judge_swap(settings.get(&name).cloned(), expected);
        if judged.is_ok() {
            settings.insert(name, value.to_vec());
        }
        Ok(judged)
    }

    async fn scan(
        &self,
        after: Option<&Key>,
        limit: usize,
    ) -> Result<Vec<(Key, ReservationId)>, StoreError> {
        check_batch(limit)?;
        let entries = self.entries();
        let range = match after {
            Some(after) => entries
                .range::<Key, _>((std::ops::Bound::Excluded(after), std::ops::Bound::Unbounded)),
            None => entries.range::<Key, _>(..),
        };
        Ok(range
            .take(limit)
            .map(|(k, id)| (k.clone(), id.clone()))
            .collect())
    }
}

/// Inserts `succession` unless its reservation has one; the one it has otherwise.
fn insert_succession(
    successions: &mut BTreeMap<ReservationId, Succession>,
    succession: &Succession,
) -> Option<Succession> {
    match successions.get(&succession.link.from) {
        Some(existing) => Some(existing.clone()),
        None => {
            successions.insert(succession.link.from.clone(), succession.clone());
            None
        }
    }
}

/// One DC's store in memory, synchronous: what [`MemoryDcStore`] serves
/// behind a lock, and what the simulator holds for each simulated DC (one
/// implementation of the store's rules for both, run by the conformance
/// suite through [`MemoryDcStore`]). Each method is the [`DcStore`] method
/// of the same name. Iteration is in reservation order, so a simulation
/// that walks the records is deterministic.
#[derive(Debug)]
pub struct MemoryDc {
    records: BTreeMap<ReservationId, DcRecord>,
    by_scan_key: BTreeMap<Vec<u8>, ReservationId>,
    /// The expiry index, keyed like the byte-keyed backends' (so cursors
    /// page alike).
    due: BTreeMap<Vec<u8>, ReservationId>,
    /// The hi-lo allocator, as the durable backends run it: the floor is the
    /// persisted high-water mark, uniques come from memory below it.
    allocator: Blocks,
    /// The persisted high-water mark (exclusive).
    high_water: u64,
    events: BTreeMap<EventSeq, Event>,
    event_head: EventSeq,
    migrating: bool,
    /// Session rows by stored name ([`session::session_bytes`]), so that
    /// [`DcStore::sessions`] pages in the byte-keyed backends' order.
    sessions: BTreeMap<Vec<u8>, SessionRecord>,
    /// The session indexes ([`crate::session`]), keyed like the byte-keyed
    /// backends' so that pages and cursors agree.
    session_keys: BTreeMap<Vec<u8>, ReservationId>,
    session_notices: BTreeMap<Vec<u8>, ReservationId>,
    sessions_due: BTreeMap<Vec<u8>, SessionId>,
}

impl Default for MemoryDc {
    fn default() -> MemoryDc {
        MemoryDc {
            records: BTreeMap::new(),
            by_scan_key: BTreeMap::new(),
            due: BTreeMap::new(),
            allocator: Blocks::resume(0),
            high_water: 0,
            events: BTreeMap::new(),
            event_head: 0,
            migrating: false,
            sessions: BTreeMap::new(),
            session_keys: BTreeMap::new(),
            session_notices: BTreeMap::new(),
            sessions_due: BTreeMap::new(),
        }
    }
}

impl MemoryDc {
    /// An empty store; the allocator starts at 1.
    pub fn new() -> MemoryDc {
        MemoryDc::default()
    }

    /// The record of `id`, borrowed.
    pub fn record(&self, id: &ReservationId) -> Option<&DcRecord> {
        self.records.get(id)
    }

    /// Every record, in reservation order.
    pub fn records(&self) -> impl Iterator<Item = &DcRecord> {
        self.records.values()
    }

    /// How many keys this DC created in `namespace`, at most `at_most`
    /// ([`DcStore::keys_created`], counted in one go).
    pub fn keys_created(&self, namespace: &Namespace, at_most: u64) -> u64 {
        let created = self
            .records
            .values()
            .filter(|r| r.key.namespace == *namespace && crate::dc::created_key(r));
        (created.count() as u64).min(at_most)
    }

    /// The event log's last sequence number (0: no event yet).
    pub fn event_head(&self) -> EventSeq {
        self.event_head
    }

    /// The process serving this store restarted: what it kept only in
    /// memory is gone — the rest of the allocator's block is skipped, as
    /// every durable backend skips it after a crash.
    pub fn restart(&mut self) {
        self.allocator = Blocks::resume(self.high_water);
    }

    fn put(&mut self, record: &DcRecord) {
        let old = self.records.get(&record.id);
        let (new_due, old_due) = (Due::of(record), old.and_then(Due::of));
        if old.is_none() {
            // A reservation's key never changes: its scan entry is written once.
            let scan_key = keyspace::record_scan_bytes(&record.key, &record.id);
            self.by_scan_key.insert(scan_key, record.id.clone());
        }
        if let Some(old) = old_due.filter(|old| Some(*old) != new_due) {
            self.due.remove(&keyspace::due_bytes(old, &record.id));
        }
        if let Some(due) = new_due {
            // Put again when it stays: that restores a settled one.
            self.due
                .insert(keyspace::due_bytes(due, &record.id), record.id.clone());
        }
        let (gone, added) = session::session_index_changes(old, record);
        for SessionEntry { index, entry } in gone {
            self.session_index(index).remove(&entry);
        }
        for SessionEntry { index, entry } in added {
            self.session_index(index).insert(entry, record.id.clone());
        }
        self.records.insert(record.id.clone(), record.clone());
    }

    fn session_index(&mut self, index: SessionIndex) -> &mut BTreeMap<Vec<u8>, ReservationId> {
        match index {
            SessionIndex::Keys => &mut self.session_keys,
            SessionIndex::Notices => &mut self.session_notices,
        }
    }

    fn put_session(&mut self, row: &SessionRecord) {
        let name = session::session_bytes(&row.id);
        if let Some(old) = self.sessions.get(&name) {
            self.sessions_due.remove(&session::session_due_entry(old));
        }
        self.sessions_due
            .insert(session::session_due_entry(row), row.id.clone());
        self.sessions.insert(name, row.clone());
    }

    /// Every session row, in the order of their stored names.
    pub fn sessions(&self) -> impl Iterator<Item = &SessionRecord> {
        self.sessions.values()
    }

    /// [`DcStore::sessions`].
    pub fn sessions_page(
        &self,
        after: Option<&SessionId>,
        limit: usize,
    ) -> Result<Vec<SessionRecord>, StoreError> {
        check_limit(limit)?;
        let page = self.sessions.range(session::sessions_start(after)..);
        Ok(page.take(limit).map(|(_, row)| row.clone()).collect())
    }

    fn stored_session(&self, id: &SessionId) -> Option<SessionRecord> {
        self.sessions.get(&session::session_bytes(id)).cloned()
    }

    /// [`DcStore::session`].
    pub fn session(&self, id: &SessionId) -> Option<SessionRecord> {
        self.stored_session(id)
    }

    /// [`DcStore::session_counts`].
    pub fn session_counts(&self) -> crate::SessionCounts {
        crate::SessionCounts {
            rows: self.sessions.len() as u64,
            keys: self.session_keys.len() as u64,
        }
    }

    /// [`DcStore::compare_and_set_session`].
    pub fn compare_and_set_session(
        &mut self,
        expected: Option<u64>,
        row: &SessionRecord,
    ) -> Result<SessionCas, StoreError> {
        session::check_session_cas(expected, row)?;
        let current = self.stored_session(&row.id);
        if let Some(conflict) = session::judge_session_cas(expected, current) {
            return Ok(conflict);
        }
        self.put_session(row);
        Ok(SessionCas::Written)
    }

    /// [`DcStore::delete_session`].
    pub fn delete_session(&mut self, id: &SessionId, version: u64) -> bool {
        let name = session::session_bytes(id);
        match self.sessions.get(&name) {
            Some(row) if row.version == version => {
                self.sessions_due.remove(&session::session_due_entry(row));
                self.sessions.remove(&name);
                true
            }
            _ => false,
        }
    }

    /// [`DcStore::compare_and_set_in_session`].
    pub fn compare_and_set_in_session(
        &mut self,
        expected: Option<u64>,
        record: &DcRecord,
        guard: &SessionGuard,
    ) -> Result<GuardedCas, StoreError> {
        session::check_guard(record, guard)?;
        if let Some(moved) = session::judge_guard(guard, self.stored_session(&guard.id)) {
            // Caller bugs first, as the durable backends check them.
            check_cas(expected, record)?;
            return Ok(moved);
        }
        match self.write_record(expected, record, false)? {
            Cas::Written => {}
            Cas::Conflict { current } => return Ok(GuardedCas::RecordConflict { current }),
        }
        if let Some(next) = &guard.next {
            self.put_session(next);
        }
        Ok(GuardedCas::Written)
    }

    /// [`DcStore::session_keys`].
    pub fn session_keys(
        &self,
        id: &SessionId,
        after: Option<&ReservationId>,
        limit: usize,
    ) -> Result<Vec<DcRecord>, StoreError> {
        check_limit(limit)?;
        let (start, end) = session::session_keys_range(id, after);
        Ok(self.session_page(&self.session_keys, start, end, limit))
    }

    /// [`DcStore::session_notices`].
    pub fn session_notices(
        &self,
        id: &SessionId,
        after: u64,
        limit: usize,
    ) -> Result<Vec<DcRecord>, StoreError> {
        check_limit(limit)?;
        let (start, end) = session::session_notices_range(id, after);
        Ok(self.session_page(&self.session_notices, start, end, limit))
    }

    fn session_page(
        &self,
        index: &BTreeMap<Vec<u8>, ReservationId>,
        start: Vec<u8>,
        end: Vec<u8>,
        limit: usize,
    ) -> Vec<DcRecord> {
        let ids = index.range(start..end).take(limit).map(|(_, id)| id);
        ids.filter_map(|id| self.records.get(id).cloned()).collect()
    }

    /// [`DcStore::due_sessions`].
    pub fn due_sessions(
        &self,
        until: StoreTime,
        after: Option<&SessionCursor>,
        limit: usize,
    ) -> Result<Vec<SessionRecord>, StoreError> {
        check_limit(limit)?;
        let (start, end) = session::sessions_due_range(until, after);
        let ids = self.sessions_due.range(start..end).take(limit);
        Ok(ids.filter_map(|(_, id)| self.stored_session(id)).collect())
    }

    /// [`DcStore::import_session`].
    pub fn import_session(&mut self, row: &SessionRecord) -> Import<SessionRecord> {
        let current = self.stored_session(&row.id);
        if let Some(judged) = crate::dc::judge_session_import(row, current) {
            return judged;
        }
        self.put_session(row);
        Import::Written
    }

    /// [`DcStore::get`].
    pub fn get(&self, id: &ReservationId) -> Option<DcRecord> {
        self.records.get(id).cloned()
    }

    /// [`DcStore::read`]: the record with its session's row, at one point.
    pub fn read(&self, id: &ReservationId) -> Option<RecordRead> {
        let record = self.records.get(id)?.clone();
        let session = record.session().and_then(|s| self.stored_session(s));
        let session = session.map(Box::new);
        Some(RecordRead { record, session })
    }

    /// [`DcStore::compare_and_set`].
    pub fn compare_and_set(
        &mut self,
        expected: Option<u64>,
        record: &DcRecord,
    ) -> Result<Cas, StoreError> {
        self.write_record(expected, record, true)
    }

    /// A record's compare-and-set; `unguarded`: refuse a record that needs
    /// its session row checked.
    fn write_record(
        &mut self,
        expected: Option<u64>,
        record: &DcRecord,
        unguarded: bool,
    ) -> Result<Cas, StoreError> {
        check_cas(expected, record)?;
        // Same size limit as the durable backends.
        keyspace::check_record(record)?;
        let current = self.records.get(&record.id).cloned();
        if unguarded {
            session::check_unguarded(current.as_ref(), record)?;
        }
        let event = homing_core::event::derive(current.as_ref(), record);
        if let Some(conflict) = judge_cas(expected, record, current)? {
            return Ok(conflict);
        }
        if let Some(mut event) = event {
            keyspace::check_event(&event)?;
            self.event_head += 1;
            event.seq = self.event_head;
            self.events.insert(event.seq, event);
        }
        self.put(record);
        Ok(Cas::Written)
    }

    /// [`DcStore::scan`].
    pub fn scan(
        &self,
        scope: &NamespaceScope,
        name_prefix: &str,
        after: Option<&ScanCursor>,
        limit: usize,
    ) -> Result<Vec<DcRecord>, StoreError> {
        check_scan(scope, name_prefix, limit)?;
        let mut out = Vec::new();
        for (start, end) in keyspace::scan_ranges(scope, name_prefix, after) {
            let range = self.by_scan_key.range(start..);
            out.extend(
                range
                    .take_while(|(k, _)| end.as_ref().is_none_or(|e| k.as_slice() < e.as_slice()))
                    .take(limit - out.len())
                    .filter_map(|(_, id)| self.records.get(id).cloned()),
            );
            if out.len() == limit {
                break;
            }
        }
        Ok(out)
    }

    /// [`DcStore::due`].
    pub fn due(
        &self,
        kind: DueKind,
        until: StoreTime,
        after: Option<&DueCursor>,
        limit: usize,
    ) -> Result<DuePage, StoreError> {
        check_limit(limit)?;
        let (start, end) = keyspace::due_range(kind, until, after);
        let entries = self
            .due
            .range(start..end)
            .take(limit)
            .map(|(entry, id)| {
                let value = self.records.get(id).map(keyspace::encode_record);
                Ok((entry.clone(), value.transpose()?))
            })
            .collect::<Result<Vec<_>, StoreError>>()?;
        let (start, end) = keyspace::due_pending_range(kind, until);
        let pending = self.due.range(start..end).count() as u64;
        keyspace::due_page(kind, entries, limit, pending)
    }

    /// [`DcStore::settle`].
    pub fn settle(&mut self, id: &ReservationId, version: u64) -> bool {
        let Some(record) = self.records.get(id).filter(|r| r.version == version) else {
            return false;
        };
        match Due::of(record) {
            Some(due) if due.kind == DueKind::Released => {
                let entry = keyspace::due_bytes(due, id);
                self.due.remove(&entry).is_some()
            }
            _ => false,
        }
    }

    /// [`DcStore::allocate`].
    pub fn allocate(&mut self) -> Result<u64, StoreError> {
        if let Some(unique) = self.allocator.take() {
            return Ok(unique);
        }
        let high_water = self.allocator.next_high_water()?;
        self.high_water = high_water;
        self.allocator.granted(high_water);
        Ok(self
            .allocator
            .take()
            .expect("a fresh block of ALLOCATOR_BLOCK_IDS ≥ 1 has a first unique"))
    }

    /// [`DcStore::events`].
    pub fn events(&self, after: EventSeq, limit: usize) -> Result<EventPage, StoreError> {
        check_events_limit(limit)?;
        let events = self
            .events
            .range(after.saturating_add(1)..)
            .take(limit)
            .map(|(_, e)| e.clone())
            .collect();
        let oldest = self
            .events
            .keys()
            .next()
            .copied()
            .unwrap_or(self.event_head + 1);
        Ok(EventPage {
            events,
            oldest,
            head: self.event_head,
        })
    }

    /// [`DcStore::trim_events`].
    pub fn trim_events(&mut self, before: EventSeq) {
        self.events = self.events.split_off(&before);
    }

    /// [`DcStore::import`].
    pub fn import(&mut self, record: &DcRecord) -> Result<Import<DcRecord>, StoreError> {
        keyspace::check_record(record)?;
        let current = self.records.get(&record.id).cloned();
        if let Some(judged) = judge_import(record, current) {
            return Ok(judged);
        }
        self.put(record);
        Ok(Import::Written)
    }

    /// [`DcStore::import_event`].
    pub fn import_event(&mut self, event: &Event) -> Result<Import<Event>, StoreError> {
        keyspace::check_event(event)?;
        let current = self.events.get(&event.seq).cloned();
        if let Some(judged) = judge_event_import(event, current) {
            return Ok(judged);
        }
        self.events.insert(event.seq, event.clone());
        self.event_head = self.event_head.max(event.seq);
        Ok(Import::Written)
    }

    /// [`DcStore::allocator_floor`]: the persisted high-water mark.
    pub fn allocator_floor(&self) -> u64 {
        self.high_water
    }

    /// [`DcStore::raise_allocator`]: nothing at or below `floor` is handed
    /// out afterwards.
    pub fn raise_allocator(&mut self, floor: u64) {
        if floor >= self.high_water {
            self.high_water = floor;
            self.allocator = Blocks::resume(floor);
        }
        self.allocator.jump_to(floor.saturating_add(1));
    }
}

/// A [`DcStore`] in memory: a [`MemoryDc`] behind a lock.
#[derive(Debug, Default)]
pub struct MemoryDcStore {
    state: Mutex<MemoryDc>,
}

impl MemoryDcStore {
    /// An empty store; the allocator starts at 1.
    pub fn new() -> MemoryDcStore {
        MemoryDcStore::default()
    }

    fn state(&self) -> std::sync::MutexGuard<'_, MemoryDc> {
        // Every mutation of MemoryDc is completed before any call that could panic.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[async_trait]
impl DcStore for MemoryDcStore {
    async fn get(&self, id: &ReservationId) -> Result<Option<DcRecord>, StoreError> {
        Ok(self.state().get(id))
    }

    async fn compare_and_set(
        &self,
        expected: Option<u64>,
        record: &DcRecord,
    ) -> Result<Cas, StoreError> {
        self.state().compare_and_set(expected, record)
    }

    async fn scan(
        &self,
        scope: &NamespaceScope,
        name_prefix: &str,
        after: Option<&ScanCursor>,
        limit: usize,
    ) -> Result<Vec<DcRecord>, StoreError> {
        self.state().scan(scope, name_prefix, after, limit)
    }

    async fn due(
        &self,
        kind: DueKind,
        until: StoreTime,
        after: Option<&DueCursor>,
        limit: usize,
    ) -> Result<DuePage, StoreError> {
        self.state().due(kind, until, after, limit)
    }

    async fn settle(&self, id: &ReservationId, version: u64) -> Result<bool, StoreError> {
        Ok(self.state().settle(id, version))
    }

    async fn allocate(&self) -> Result<u64, StoreError> {
        self.state().allocate()
    }

    async fn events(&self, after: EventSeq, limit: usize) -> Result<EventPage, StoreError> {
        self.state().events(after, limit)
    }

    async fn trim_events(&self, before: EventSeq) -> Result<(), StoreError> {
        self.state().trim_events(before);
        Ok(())
    }

    async fn import(&self, record: &DcRecord) -> Result<Import<DcRecord>, StoreError> {
        self.state().import(record)
    }

    async fn import_event(&self, event: &Event) -> Result<Import<Event>, StoreError> {
        self.state().import_event(event)
    }

    async fn allocator_floor(&self) -> Result<u64, StoreError> {
        Ok(self.state().allocator_floor())
    }

    async fn raise_allocator(&self, floor: u64) -> Result<(), StoreError> {
        self.state().raise_allocator(floor);
        Ok(())
    }

    async fn session(&self, id: &SessionId) -> Result<Option<SessionRecord>, StoreError> {
        Ok(self.state().session(id))
    }

    async fn session_counts(&self) -> Result<Option<crate::SessionCounts>, StoreError> {
        Ok(Some(self.state().session_counts()))
    }

    async fn compare_and_set_session(
        &self,
        expected: Option<u64>,
        row: &SessionRecord,
    ) -> Result<SessionCas, StoreError> {
        self.state().compare_and_set_session(expected, row)
    }

    async fn delete_session(&self, id: &SessionId, version: u64) -> Result<bool, StoreError> {
        Ok(self.state().delete_session(id, version))
    }

    async fn compare_and_set_in_session(
        &self,
        expected: Option<u64>,
        record: &DcRecord,
        guard: &SessionGuard,
    ) -> Result<GuardedCas, StoreError> {
        self.state()
            .compare_and_set_in_session(expected, record, guard)
    }

    async fn session_keys(
        &self,
        id: &SessionId,
        after: Option<&ReservationId>,
        limit: usize,
    ) -> Result<Vec<DcRecord>, StoreError> {
        self.state().session_keys(id, after, limit)
    }

    async fn session_notices(
        &self,
        id: &SessionId,
        after: u64,
        limit: usize,
    ) -> Result<Vec<DcRecord>, StoreError> {
        self.state().session_notices(id, after, limit)
    }

    async fn due_sessions(
        &self,
        until: StoreTime,
        after: Option<&SessionCursor>,
        limit: usize,
    ) -> Result<Vec<SessionRecord>, StoreError> {
        self.state().due_sessions(until, after, limit)
    }

    async fn sessions(
        &self,
        after: Option<&SessionId>,
        limit: usize,
    ) -> Result<Vec<SessionRecord>, StoreError> {
        self.state().sessions_page(after, limit)
    }

    async fn import_session(
        &self,
        row: &SessionRecord,
    ) -> Result<Import<SessionRecord>, StoreError> {
        Ok(self.state().import_session(row))
    }

    async fn migrating(&self) -> Result<bool, StoreError> {
        Ok(self.state().migrating)
    }

    async fn set_migrating(&self, on: bool) -> Result<(), StoreError> {
        self.state().migrating = on;
        Ok(())
    }
}
