//! The etcd DC store's record cache: the last encoded record and its etcd
//! `mod_revision` this store saw for each recently touched reservation (from
//! a `get`, a compare-and-set's read or its own write). A compare-and-set
//! whose expected version matches a cached record derives its event from that
//! record and writes in one transaction guarded by the cached revision,
//! instead of reading first. The cache is only a guess: the guard checks it,
//! and a failed guard hands back the record as stored, so no answer ever
//! depends on the cache being fresh (another process may write the same
//! records). Scans do not fill it: homingd's reaper and listings change a
//! record through get-then-CAS anyway, and a full scan would only push out
//! the records being renewed.
//!
//! Bounded in entries and in bytes by two generations: entries go to the
//! young one; when it reaches half of either bound, it becomes the old one
//! and the previous old one is dropped. An entry written or read again moves
//! to the young generation, so the records being renewed stay while the
//! rest ages out.

use std::collections::HashMap;
use std::sync::Mutex;

use homing_core::ReservationId;
use homing_core::reservation::RESERVATION_ID_BYTES_MAX;

/// Most records the cache holds (both generations together).
pub const RECORD_CACHE_ENTRIES_MAX: usize = 64 * 1024;
/// Most bytes of cached records (encoded record plus the id's bound, both
/// generations together; the maps' own overhead comes on top, under 100
/// bytes per entry). Typical records (~150 bytes) hit the entry bound first,
/// at ~20 MiB in all; large records hit this one.
pub const RECORD_CACHE_BYTES_MAX: usize = 32 * 1024 * 1024;

/// A record as etcd held it at `revision`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Seen {
    /// The record key's `mod_revision` when it held `value`.
    pub(super) revision: i64,
    /// The encoded record.
    pub(super) value: Vec<u8>,
}

impl Seen {
    /// What the entry counts against [`RECORD_CACHE_BYTES_MAX`]: the id at
    /// its bound, so that counting needs no formatting.
    fn bytes(&self) -> usize {
        self.value.len() + RESERVATION_ID_BYTES_MAX
    }
}

#[derive(Default)]
struct Generations {
    young: HashMap<ReservationId, Seen>,
    young_bytes: usize,
    old: HashMap<ReservationId, Seen>,
}

/// The bounded cache (see the module doc). Cheap to lock: no I/O under the lock.
pub(super) struct RecordCache {
    entries_max: usize,
    bytes_max: usize,
    generations: Mutex<Generations>,
}

impl RecordCache {
    /// A cache of at most `entries_max` records and `bytes_max` bytes; `0`
    /// entries: nothing is ever cached.
    pub(super) fn new(entries_max: usize, bytes_max: usize) -> RecordCache {
        RecordCache {
            entries_max,
            bytes_max,
            generations: Mutex::new(Generations::default()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Generations> {
        // A panic under the lock cannot leave the maps half-changed in a way
        // that matters: every entry is only a guess the guard checks.
        self.generations
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Whether anything is ever cached.
    pub(super) fn enabled(&self) -> bool {
        self.entries_max / 2 > 0
    }

    /// The record last seen for `id`, if still cached.
    pub(super) fn get(&self, id: &ReservationId) -> Option<Seen> {
        let generations = self.lock();
        generations
            .young
            .get(id)
            .or_else(|| generations.old.get(id))
            .cloned()
    }

    /// Notes that `id`'s record was `seen`, unless a newer revision of it is
    /// cached already (concurrent readers and writers of one record may
    /// report out of order; revisions only grow).
    pub(super) fn insert(&self, id: &ReservationId, seen: Seen) {
        let (half_entries, half_bytes) = (self.entries_max / 2, self.bytes_max / 2);
        let bytes = seen.bytes();
        if half_entries == 0 || bytes > half_bytes {
            return;
        }
        let mut generations = self.lock();
        let g = &mut *generations;
        let cached = g.young.get(id).or_else(|| g.old.get(id));
        if cached.is_some_and(|c| c.revision >= seen.revision) {
            return;
        }
        g.old.remove(id);
        if let Some(replaced) = g.young.remove(id) {
            g.young_bytes -= replaced.bytes();
        }
        if g.young.len() >= half_entries || g.young_bytes + bytes > half_bytes {
            g.old = std::mem::take(&mut g.young);
            g.young_bytes = 0;
        }
        g.young_bytes += bytes;
        g.young.insert(id.clone(), seen);
        assert!(g.young.len() <= half_entries && g.old.len() <= half_entries);
        debug_assert!(g.young_bytes <= half_bytes);
    }

    /// Forgets `id` (its record was written around the cache, by an import).
    pub(super) fn remove(&self, id: &ReservationId) {
        let mut generations = self.lock();
        let g = &mut *generations;
        g.old.remove(id);
        if let Some(removed) = g.young.remove(id) {
            g.young_bytes -= removed.bytes();
        }
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        let generations = self.lock();
        generations.young.len() + generations.old.len()
    }
}

#[cfg(test)]
mod tests {
    use homing_core::DcId;

    use super::*;

    fn id(unique: u64) -> ReservationId {
        ReservationId::new(DcId::new("iad").unwrap(), unique)
    }

    fn seen(revision: i64, len: usize) -> Seen {
        Seen {
            revision,
            value: vec![7; len],
        }
    }

    #[test]
    fn an_older_revision_never_replaces_a_newer_one() {
        let cache = RecordCache::new(16, 1 << 20);
        cache.insert(&id(1), seen(5, 10));
        cache.insert(&id(1), seen(4, 11));
        assert_eq!(cache.get(&id(1)), Some(seen(5, 10)));
        cache.insert(&id(1), seen(6, 12));
        assert_eq!(cache.get(&id(1)), Some(seen(6, 12)));
        assert_eq!(cache.len(), 1);
    }

    #[test]
    fn the_entry_bound_holds_and_recently_written_records_stay() {
        let cache = RecordCache::new(8, 1 << 20);
        for unique in 0..100u64 {
            cache.insert(&id(unique), seen(unique as i64 + 1, 10));
            // Record 1000 is renewed all along: it must survive the churn.
            cache.insert(&id(1000), seen(1000 + unique as i64, 10));
            assert!(cache.len() <= 8, "{} entries", cache.len());
        }
        assert_eq!(cache.get(&id(1000)).map(|s| s.revision), Some(1099));
        assert!(cache.get(&id(0)).is_none());
    }

    #[test]
    fn the_byte_bound_holds_and_an_oversized_record_is_not_cached() {
        let cache = RecordCache::new(1024, 1000);
        for unique in 0..50u64 {
            cache.insert(&id(unique), seen(1, 50));
            let g = cache.lock();
            let bytes: usize = g
                .young
                .iter()
                .chain(g.old.iter())
                .map(|(_, s)| s.bytes())
                .sum();
            assert!(bytes <= 1000, "{bytes} bytes");
        }
        cache.insert(&id(999), seen(1, 500));
        assert!(cache.get(&id(999)).is_none());
    }

    #[test]
    fn a_removed_record_is_gone_and_a_zero_bound_caches_nothing() {
        let cache = RecordCache::new(16, 1 << 20);
        cache.insert(&id(1), seen(1, 10));
        cache.remove(&id(1));
        assert!(cache.get(&id(1)).is_none());
        let off = RecordCache::new(0, 1 << 20);
        off.insert(&id(1), seen(1, 10));
        assert!(off.get(&id(1)).is_none());
    }
}
