//! In-memory backends for tests and the simulator: deterministic, not
//! durable, and as strict as the real ones (same errors, same scan order,
//! since scans order by the same [`crate::keyspace`] bytes).

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;

use async_trait::async_trait;
use homing_core::{
    DcId, DcLeaseState, DcMarks, DcRecord, DcRenewal, DcTerms, Due, DueCursor, DueKind, DuePage,
    Event, EventSeq, Key, NamespaceScope, ReservationId, StoreTime, Succession, SuccessionCause,
    TakeOverReply, TakeoverPolicy,
};

use homing_core::succession::judge_takeover;

use crate::dc::{
    Cas, DcStore, EventPage, Import, ScanCursor, check_cas, check_events_limit, check_limit,
    check_scan, judge_cas, judge_event_import, judge_import,
};
use crate::dc_lease::{DcLeaseTable, LeaseClock, process_clock};
use crate::error::StoreError;
use crate::global::{DCS_MAX, GlobalStore, SetIfAbsent, check_batch, check_cause};
use crate::keyspace;

/// A [`GlobalStore`] in a `BTreeMap` (key order, for [`GlobalStore::scan`]).
pub struct MemoryGlobalStore {
    entries: Mutex<BTreeMap<Key, ReservationId>>,
    /// Locked after `dcs` when both are held (a takeover).
    successions: Mutex<BTreeMap<ReservationId, Succession>>,
    dcs: Mutex<DcLeaseTable>,
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

#[derive(Debug, Default)]
struct DcState {
    records: HashMap<ReservationId, DcRecord>,
    by_scan_key: BTreeMap<Vec<u8>, ReservationId>,
    /// The expiry index, keyed like the byte-keyed backends' (so cursors
    /// page alike).
    due: BTreeMap<Vec<u8>, ReservationId>,
    next_unique: u64,
    events: BTreeMap<EventSeq, Event>,
    event_head: EventSeq,
    migrating: bool,
}

impl DcState {
    fn put(&mut self, record: &DcRecord) {
        let old = self.records.get(&record.id).and_then(Due::of);
        if let Some(old) = old {
            self.due.remove(&keyspace::due_bytes(old, &record.id));
        }
        if let Some(due) = Due::of(record) {
            self.due
                .insert(keyspace::due_bytes(due, &record.id), record.id.clone());
        }
        let scan_key = keyspace::record_scan_bytes(&record.key, &record.id);
        self.by_scan_key.insert(scan_key, record.id.clone());
        self.records.insert(record.id.clone(), record.clone());
    }
}

/// A [`DcStore`] in memory.
#[derive(Debug, Default)]
pub struct MemoryDcStore {
    state: Mutex<DcState>,
}

impl MemoryDcStore {
    /// An empty store; the allocator starts at 1.
    pub fn new() -> MemoryDcStore {
        MemoryDcStore::default()
    }

    fn state(&self) -> std::sync::MutexGuard<'_, DcState> {
        // Every mutation below is completed before any call that could panic.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[async_trait]
impl DcStore for MemoryDcStore {
    async fn get(&self, id: &ReservationId) -> Result<Option<DcRecord>, StoreError> {
        Ok(self.state().records.get(id).cloned())
    }

    async fn compare_and_set(
        &self,
        expected: Option<u64>,
        record: &DcRecord,
    ) -> Result<Cas, StoreError> {
        check_cas(expected, record)?;
        // Same size limit as the durable backends.
        keyspace::encode_record(record)?;
        let mut state = self.state();
        let current = state.records.get(&record.id).cloned();
        let event = homing_core::event::derive(current.as_ref(), record);
        if let Some(conflict) = judge_cas(expected, record, current)? {
            return Ok(conflict);
        }
        if let Some(mut event) = event {
            keyspace::encode_event(&event)?;
            state.event_head += 1;
            event.seq = state.event_head;
            state.events.insert(event.seq, event);
        }
        state.put(record);
        Ok(Cas::Written)
    }

    async fn scan(
        &self,
        scope: &NamespaceScope,
        name_prefix: &str,
        after: Option<&ScanCursor>,
        limit: usize,
    ) -> Result<Vec<DcRecord>, StoreError> {
        check_scan(scope, name_prefix, limit)?;
        let state = self.state();
        let mut out = Vec::new();
        for (start, end) in keyspace::scan_ranges(scope, name_prefix, after) {
            let range = state.by_scan_key.range(start..);
            out.extend(
                range
                    .take_while(|(k, _)| end.as_ref().is_none_or(|e| k.as_slice() < e.as_slice()))
                    .take(limit - out.len())
                    .filter_map(|(_, id)| state.records.get(id).cloned()),
            );
            if out.len() == limit {
                break;
            }
        }
        Ok(out)
    }

    async fn due(
        &self,
        kind: DueKind,
        until: StoreTime,
        after: Option<&DueCursor>,
        limit: usize,
    ) -> Result<DuePage, StoreError> {
        check_limit(limit)?;
        let state = self.state();
        let (start, end) = keyspace::due_range(kind, until, after);
        let entries = state
            .due
            .range(start..end)
            .take(limit)
            .map(|(entry, id)| {
                let value = state.records.get(id).map(keyspace::encode_record);
                Ok((entry.clone(), value.transpose()?))
            })
            .collect::<Result<Vec<_>, StoreError>>()?;
        let (start, end) = keyspace::due_pending_range(kind, until);
        let pending = state.due.range(start..end).count() as u64;
        keyspace::due_page(kind, entries, limit, pending)
    }

    async fn settle(&self, id: &ReservationId, version: u64) -> Result<bool, StoreError> {
        let mut state = self.state();
        let Some(record) = state.records.get(id).filter(|r| r.version == version) else {
            return Ok(false);
        };
        match Due::of(record) {
            Some(due) if due.kind == DueKind::Released => {
                let entry = keyspace::due_bytes(due, id);
                Ok(state.due.remove(&entry).is_some())
            }
            _ => Ok(false),
        }
    }

    async fn allocate(&self) -> Result<u64, StoreError> {
        let mut state = self.state();
        state.next_unique = state
            .next_unique
            .checked_add(1)
            .ok_or(StoreError::AllocatorExhausted)?;
        Ok(state.next_unique)
    }

    async fn events(&self, after: EventSeq, limit: usize) -> Result<EventPage, StoreError> {
        check_events_limit(limit)?;
        let state = self.state();
        let events = state
            .events
            .range(after.saturating_add(1)..)
            .take(limit)
            .map(|(_, e)| e.clone())
            .collect();
        let oldest = state
            .events
            .keys()
            .next()
            .copied()
            .unwrap_or(state.event_head + 1);
        Ok(EventPage {
            events,
            oldest,
            head: state.event_head,
        })
    }

    async fn trim_events(&self, before: EventSeq) -> Result<(), StoreError> {
        let mut state = self.state();
        state.events = state.events.split_off(&before);
        Ok(())
    }

    async fn import(&self, record: &DcRecord) -> Result<Import<DcRecord>, StoreError> {
        keyspace::encode_record(record)?;
        let mut state = self.state();
        let current = state.records.get(&record.id).cloned();
        if let Some(judged) = judge_import(record, current) {
            return Ok(judged);
        }
        state.put(record);
        Ok(Import::Written)
    }

    async fn import_event(&self, event: &Event) -> Result<Import<Event>, StoreError> {
        keyspace::encode_event(event)?;
        let mut state = self.state();
        let current = state.events.get(&event.seq).cloned();
        if let Some(judged) = judge_event_import(event, current) {
            return Ok(judged);
        }
        state.events.insert(event.seq, event.clone());
        state.event_head = state.event_head.max(event.seq);
        Ok(Import::Written)
    }

    async fn allocator_floor(&self) -> Result<u64, StoreError> {
        Ok(self.state().next_unique)
    }

    async fn raise_allocator(&self, floor: u64) -> Result<(), StoreError> {
        let mut state = self.state();
        state.next_unique = state.next_unique.max(floor);
        Ok(())
    }

    async fn migrating(&self) -> Result<bool, StoreError> {
        Ok(self.state().migrating)
    }

    async fn set_migrating(&self, on: bool) -> Result<(), StoreError> {
        self.state().migrating = on;
        Ok(())
    }
}
