//! In-memory backends for tests and the simulator: deterministic, not
//! durable, and as strict as the real ones (same errors, same scan order,
//! since scans order by the same [`crate::keyspace`] bytes).

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;

use async_trait::async_trait;
use homing_core::{DcRecord, Key, Namespace, ReservationId};

use crate::dc::{Cas, DcStore, ScanCursor, check_cas, check_limit, judge_cas};
use crate::error::StoreError;
use crate::global::{GlobalStore, SetIfAbsent, check_batch};
use crate::keyspace;

/// A [`GlobalStore`] in a `HashMap`.
#[derive(Debug, Default)]
pub struct MemoryGlobalStore {
    entries: Mutex<HashMap<Key, ReservationId>>,
}

impl MemoryGlobalStore {
    /// An empty store.
    pub fn new() -> MemoryGlobalStore {
        MemoryGlobalStore::default()
    }

    fn entries(&self) -> std::sync::MutexGuard<'_, HashMap<Key, ReservationId>> {
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
}

#[derive(Debug, Default)]
struct DcState {
    records: HashMap<ReservationId, DcRecord>,
    by_scan_key: BTreeMap<Vec<u8>, ReservationId>,
    next_unique: u64,
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
        if let Some(conflict) = judge_cas(expected, record, current)? {
            return Ok(conflict);
        }
        if expected.is_none() {
            let scan_key = keyspace::record_scan_bytes(&record.key, &record.id);
            state.by_scan_key.insert(scan_key, record.id.clone());
        }
        state.records.insert(record.id.clone(), record.clone());
        Ok(Cas::Written)
    }

    async fn scan(
        &self,
        namespace: &Namespace,
        name_prefix: &str,
        after: Option<&ScanCursor>,
        limit: usize,
    ) -> Result<Vec<DcRecord>, StoreError> {
        check_limit(limit)?;
        let (start, end) = keyspace::scan_range(namespace, name_prefix, after);
        let state = self.state();
        let range = state.by_scan_key.range(start..);
        Ok(range
            .take_while(|(k, _)| end.as_ref().is_none_or(|e| k.as_slice() < e.as_slice()))
            .take(limit)
            .filter_map(|(_, id)| state.records.get(id).cloned())
            .collect())
    }

    async fn allocate(&self) -> Result<u64, StoreError> {
        let mut state = self.state();
        state.next_unique = state
            .next_unique
            .checked_add(1)
            .ok_or(StoreError::AllocatorExhausted)?;
        Ok(state.next_unique)
    }
}
