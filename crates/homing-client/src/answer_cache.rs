//! `AnswerCache`: the Resolver's key → answer cache, the one lookup of a
//! cached resolve. Answers live `ttl` from when they were inserted; the
//! cache holds at most its capacity; concurrent fills of one key share one
//! fill (single-flight).
//!
//! Why not moka, like the Resolver's other caches: a hit here is the edge
//! router's per-request cost, and moka's hit does more than find the entry
//! — it records every read for its admission policy (a frequency sketch
//! and an access-order list, updated in its housekeeping) and reaches the
//! key through three pointers. With 100 000 keys none of that stays in the
//! CPU caches: moka was 16.5 % of the router's CPU against 5.3 % with one
//! key (docs/EDGE-ROUTER.md, "100 k keys"). Here a hit takes a shard's read
//! lock, probes one hash table whose slots hold the key and the answer
//! inline, and writes nothing; the TTL is checked against the `now` the
//! caller passes in. Keys are looked up borrowed ([`KeyRef`]: no copy per
//! lookup), and a key of up to [`KEY_INLINE_BYTES`] (namespace and name
//! together) is kept in its slot's own bytes, so a probe reads no memory
//! outside the table (a longer key is kept behind one pointer).
//!
//! Eviction: every answer lives the same TTL, so the oldest answers are
//! those that expire first. A full shard first drops its expired answers,
//! then, if still full, the oldest quarter of the rest (least recently
//! inserted first: FIFO, not moka's frequency-based admission; with the
//! default capacity of a million answers and a TTL of a second a router
//! would need a million distinct keys a second to get there). Expired
//! answers that are never asked for again stay until their shard fills:
//! memory is bounded by the capacity, not by the TTL.

use std::collections::HashMap;
use std::future::Future;
use std::hash::{BuildHasher, RandomState};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, RwLock};
use std::time::{Duration, Instant};

use hashbrown::HashTable;
use homing_core::{Key, KeyRef};
use tokio::sync::OnceCell;

/// Most shards; fewer for small capacities (one per [`SHARD_ENTRIES_MIN`]).
const SHARDS_MAX: usize = 64;
/// Capacity below which a cache is not split further, in entries per shard.
const SHARD_ENTRIES_MIN: u64 = 1024;

/// Bytes of a key (namespace and name together) kept in its slot itself.
pub(crate) const KEY_INLINE_BYTES: usize = 45;

/// A cached answer's key: its namespace's bytes, then its name's.
enum SlotKey {
    /// Short enough to live in the slot (48 bytes in all).
    Inline {
        namespace_len: u8,
        len: u8,
        bytes: [u8; KEY_INLINE_BYTES],
    },
    Heap {
        namespace_len: u8,
        bytes: Box<[u8]>,
    },
}

impl SlotKey {
    fn of(key: KeyRef<'_>) -> SlotKey {
        let (namespace, name) = (key.namespace().as_bytes(), key.name().as_bytes());
        // Invariant: namespaces are at most NAMESPACE_BYTES_MAX (128) bytes.
        let namespace_len =
            u8::try_from(namespace.len()).expect("a namespace is at most 128 bytes");
        let len = namespace.len() + name.len();
        if len <= KEY_INLINE_BYTES {
            let mut bytes = [0; KEY_INLINE_BYTES];
            bytes[..namespace.len()].copy_from_slice(namespace);
            bytes[namespace.len()..len].copy_from_slice(name);
            SlotKey::Inline {
                namespace_len,
                len: len as u8,
                bytes,
            }
        } else {
            SlotKey::Heap {
                namespace_len,
                bytes: [namespace, name].concat().into_boxed_slice(),
            }
        }
    }

    /// The namespace's bytes and the name's.
    fn parts(&self) -> (&[u8], &[u8]) {
        let (namespace_len, bytes) = match self {
            SlotKey::Inline {
                namespace_len,
                len,
                bytes,
            } => (*namespace_len, &bytes[..*len as usize]),
            SlotKey::Heap {
                namespace_len,
                bytes,
            } => (*namespace_len, &bytes[..]),
        };
        bytes.split_at(namespace_len as usize)
    }

    fn is(&self, key: KeyRef<'_>) -> bool {
        self.parts() == (key.namespace().as_bytes(), key.name().as_bytes())
    }
}

/// One cached answer.
struct Slot<V> {
    key: SlotKey,
    value: V,
    /// When it expires, in nanoseconds since the cache's `epoch`.
    expires_ns: u64,
}

/// A fill in progress: its outcome, once one of its callers produced it.
type Fill<V, E> = Arc<OnceCell<Result<V, Arc<E>>>>;

/// Key → answer for `ttl`, at most `capacity` entries (rounded up to a
/// multiple of the shard count). See the module docs.
pub(crate) struct AnswerCache<V, E> {
    shards: Box<[RwLock<HashTable<Slot<V>>>]>,
    /// Entries per shard, at most.
    shard_entries_max: usize,
    ttl: Duration,
    hasher: RandomState,
    /// The instant expiry times count from (8 bytes a slot, not 16).
    epoch: Instant,
    /// Fills in progress, one per key: bounded by the callers waiting on them.
    fills: Mutex<HashMap<Key, Fill<V, E>>>,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while it was held left a map of fills, still usable.
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl<V: Clone, E> AnswerCache<V, E> {
    /// A cache of at most `capacity` answers, each served for `ttl` after
    /// its insertion (a zero `ttl` caches nothing).
    pub(crate) fn new(capacity: u64, ttl: Duration) -> AnswerCache<V, E> {
        let (capacity, cached) = (capacity.max(1), capacity);
        let shards = (capacity / SHARD_ENTRIES_MIN).clamp(1, SHARDS_MAX as u64);
        let shards = (shards as usize).next_power_of_two().min(SHARDS_MAX);
        let shard_entries_max = usize::try_from(capacity.div_ceil(shards as u64))
            .expect("a shard's capacity fits in memory's address space");
        AnswerCache {
            shards: (0..shards).map(|_| RwLock::new(HashTable::new())).collect(),
            shard_entries_max,
            // A capacity of 0 caches nothing, as moka's does.
            ttl: if cached == 0 { Duration::ZERO } else { ttl },
            hasher: RandomState::new(),
            epoch: Instant::now(),
            fills: Mutex::new(HashMap::new()),
        }
    }

    fn since_epoch_ns(&self, at: Instant) -> u64 {
        // 584 years of nanoseconds fit in a u64.
        u64::try_from(at.saturating_duration_since(self.epoch).as_nanos()).unwrap_or(u64::MAX)
    }

    /// The shard of a key's hash: bits the shard's table does not use for
    /// its bucket index (low bits) or its tags (top 7 bits).
    fn shard(&self, hash: u64) -> &RwLock<HashTable<Slot<V>>> {
        &self.shards[(hash >> 32) as usize & (self.shards.len() - 1)]
    }

    /// A key's hash, from its parts' bytes (the same borrowed or stored).
    fn hash(&self, (namespace, name): (&[u8], &[u8])) -> u64 {
        self.hasher.hash_one((namespace, name))
    }

    fn hash_key(&self, key: KeyRef<'_>) -> u64 {
        self.hash((key.namespace().as_bytes(), key.name().as_bytes()))
    }

    /// The answer for `key` if one younger than the TTL is cached at `now`.
    pub(crate) fn get<'k>(&self, key: impl Into<KeyRef<'k>>, now: Instant) -> Option<V> {
        let key = key.into();
        let hash = self.hash_key(key);
        let now_ns = self.since_epoch_ns(now);
        let table = self
            .shard(hash)
            .read()
            .unwrap_or_else(PoisonError::into_inner);
        let slot = table.find(hash, |s| s.key.is(key))?;
        (now_ns < slot.expires_ns).then(|| slot.value.clone())
    }

    /// Caches `value` for `key` from `at` (replacing any answer it had),
    /// making room in its shard if it is full.
    pub(crate) fn insert<'k>(&self, key: impl Into<KeyRef<'k>>, value: V, at: Instant) {
        if self.ttl.is_zero() {
            return;
        }
        let key = key.into();
        let expires_ns = self.since_epoch_ns(at + self.ttl);
        let hash = self.hash_key(key);
        let mut table = self
            .shard(hash)
            .write()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(slot) = table.find_mut(hash, |s| s.key.is(key)) {
            slot.value = value;
            slot.expires_ns = expires_ns;
            return;
        }
        if table.len() >= self.shard_entries_max {
            self.make_room(&mut table, self.since_epoch_ns(at));
        }
        let slot = Slot {
            key: SlotKey::of(key),
            value,
            expires_ns,
        };
        table.insert_unique(hash, slot, |s| self.hash(s.key.parts()));
        debug_assert!(table.len() <= self.shard_entries_max);
    }

    /// Drops the expired answers of a full shard, then, if it is still
    /// full, its oldest quarter (the earliest to expire: all live one TTL).
    fn make_room(&self, table: &mut HashTable<Slot<V>>, now_ns: u64) {
        table.retain(|s| now_ns < s.expires_ns);
        if table.len() < self.shard_entries_max {
            return;
        }
        let mut expiries: Vec<u64> = table.iter().map(|s| s.expires_ns).collect();
        let quarter = expiries.len() / 4;
        let (_, &mut newest_dropped, _) = expiries.select_nth_unstable(quarter);
        table.retain(|s| newest_dropped < s.expires_ns);
    }

    /// Drops the answer for `key` if `stale` says it should go; whether it did.
    pub(crate) fn remove_if<'k>(
        &self,
        key: impl Into<KeyRef<'k>>,
        stale: impl FnOnce(&V) -> bool,
    ) -> bool {
        let key = key.into();
        let hash = self.hash_key(key);
        let mut table = self
            .shard(hash)
            .write()
            .unwrap_or_else(PoisonError::into_inner);
        match table.find_entry(hash, |s| s.key.is(key)) {
            Ok(slot) if stale(&slot.get().value) => {
                slot.remove();
                true
            }
            _ => false,
        }
    }

    /// Answers cached, expired ones not yet dropped included.
    pub(crate) fn len(&self) -> usize {
        self.shards
            .iter()
            .map(|s| s.read().unwrap_or_else(PoisonError::into_inner).len())
            .sum()
    }

    /// The answer for `key`: cached at `now`, or the outcome of a fill
    /// already running for it, or of `fill`, which then runs here; a
    /// successful fill's answer is cached from the instant it returns.
    /// A failed fill's error goes to every caller that waited for it and
    /// is not cached. If the caller running a fill is dropped, a caller
    /// waiting for it runs its own `fill` instead.
    pub(crate) async fn get_or_fill<F>(&self, key: &Key, now: Instant, fill: F) -> Result<V, Arc<E>>
    where
        F: Future<Output = Result<(V, Instant), E>>,
    {
        let cell = {
            let mut fills = lock(&self.fills);
            match fills.get(key) {
                Some(cell) => cell.clone(),
                None => {
                    // A fill that just ended cached its answer before it
                    // left `fills`: asked again here, it is not run twice.
                    if let Some(value) = self.get(key, now) {
                        return Ok(value);
                    }
                    let cell = Arc::new(OnceCell::new());
                    fills.insert(key.clone(), cell.clone());
                    cell
                }
            }
        };
        let waiting = Waiting {
            fills: &self.fills,
            key,
            cell: Some(cell),
        };
        let cell = waiting.cell.as_ref().expect("set until dropped");
        cell.get_or_init(|| async {
            let (value, at) = fill.await.map_err(Arc::new)?;
            self.insert(key, value.clone(), at);
            Ok(value)
        })
        .await
        .clone()
    }

    /// Fills in progress (for tests: bounded by the callers waiting).
    #[cfg(test)]
    fn fills_in_progress(&self) -> usize {
        lock(&self.fills).len()
    }
}

/// A caller's share in a fill: when the last caller leaves (or the first
/// once it is done), the fill leaves the map of fills in progress.
struct Waiting<'a, V, E> {
    fills: &'a Mutex<HashMap<Key, Fill<V, E>>>,
    key: &'a Key,
    cell: Option<Fill<V, E>>,
}

impl<V, E> Drop for Waiting<'_, V, E> {
    fn drop(&mut self) {
        let mut fills = lock(self.fills);
        // Dropped under the lock, like every clone is made, so the count
        // below is exact.
        let Some(mine) = self.cell.take() else {
            return;
        };
        let done = mine.initialized();
        // Only this caller's own fill: a late waiter of a finished fill must
        // not take out the next fill of the key (a second walk would start
        // beside it, and the older one could overwrite the newer answer).
        let ours = fills.get(self.key).is_some_and(|c| Arc::ptr_eq(c, &mine));
        drop(mine);
        if ours
            && let Some(cell) = fills.get(self.key)
            && (done || Arc::strong_count(cell) == 1)
        {
            fills.remove(self.key);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::task::Poll;

    use homing_core::KeyName;

    use super::*;

    const TTL: Duration = Duration::from_secs(1);

    fn key(i: usize) -> Key {
        Key::new(KeyName::new(format!("key-{i}")).expect("a key name"))
    }

    #[test]
    fn an_answer_is_served_until_its_ttl_from_insertion_runs_out() {
        let cache: AnswerCache<u32, ()> = AnswerCache::new(100, TTL);
        let t0 = Instant::now();
        cache.insert(&key(1), 7, t0);
        assert_eq!(cache.get(&key(1), t0), Some(7));
        assert_eq!(
            cache.get(&key(1), t0 + TTL - Duration::from_nanos(1)),
            Some(7)
        );
        assert_eq!(cache.get(&key(1), t0 + TTL), None, "expired at the TTL");
        assert_eq!(cache.get(&key(2), t0), None);
        cache.insert(&key(1), 8, t0 + TTL);
        assert_eq!(cache.get(&key(1), t0 + TTL), Some(8), "replaced, TTL anew");
    }

    #[test]
    fn keys_short_and_long_are_told_apart_by_namespace_and_name() {
        use homing_core::Namespace;
        let cache: AnswerCache<u32, ()> = AnswerCache::new(100, TTL);
        let t0 = Instant::now();
        let ns = |n: &str| Namespace::new(n).expect("a namespace");
        let name = |n: &str| KeyName::new(n).expect("a key name");
        let long = "l".repeat(KEY_INLINE_BYTES);
        let keys = [
            Key::in_namespace(ns("a"), name("bc")),
            Key::in_namespace(ns("ab"), name("c")),
            Key::in_namespace(ns(""), name("abc")),
            Key::in_namespace(ns(""), name(&long[1..])),
            Key::in_namespace(ns(""), name(&long)),
            Key::in_namespace(ns("a"), name(&long)),
            Key::in_namespace(ns("a"), name(&long[1..])),
        ];
        for (i, key) in keys.iter().enumerate() {
            cache.insert(key, i as u32, t0);
        }
        for (i, key) in keys.iter().enumerate() {
            assert_eq!(cache.get(key, t0), Some(i as u32), "{key}");
            assert_eq!(cache.get(key.borrowed(), t0), Some(i as u32), "{key}");
        }
        assert!(
            std::mem::size_of::<SlotKey>() <= 48,
            "a slot's key takes 48 bytes at most"
        );
    }

    #[test]
    fn a_zero_ttl_caches_nothing() {
        let cache: AnswerCache<u32, ()> = AnswerCache::new(100, Duration::ZERO);
        let t0 = Instant::now();
        cache.insert(&key(1), 7, t0);
        assert_eq!(cache.get(&key(1), t0), None);
        assert_eq!(cache.len(), 0);
    }

    #[test]
    fn answers_stay_within_capacity_and_the_oldest_go_first() {
        const CAPACITY: u64 = 4096;
        let cache: AnswerCache<usize, ()> = AnswerCache::new(CAPACITY, TTL);
        let shards = cache.shards.len() as u64;
        assert!(shards > 1, "the test covers a sharded cache");
        let t0 = Instant::now();
        let at = |i: usize| t0 + Duration::from_micros(i as u64);
        let inserted = 10 * CAPACITY as usize;
        for i in 0..inserted {
            cache.insert(&key(i), i, at(i));
            assert!(
                (cache.len() as u64) < CAPACITY + shards,
                "{} kept",
                cache.len()
            );
        }
        let now = at(inserted);
        let newest_kept = (inserted - 512..inserted)
            .filter(|&i| cache.get(&key(i), now) == Some(i))
            .count();
        assert_eq!(newest_kept, 512, "the newest answers are kept");
        let oldest_kept = (0..512)
            .filter(|&i| cache.get(&key(i), now).is_some())
            .count();
        assert_eq!(oldest_kept, 0, "the oldest answers went first");
    }

    #[test]
    fn a_full_shard_drops_its_expired_answers_before_live_ones() {
        let cache: AnswerCache<usize, ()> = AnswerCache::new(8, TTL);
        assert_eq!(cache.shards.len(), 1);
        let t0 = Instant::now();
        cache.insert(&key(0), 0, t0);
        let later = t0 + TTL / 2;
        for i in 1..8 {
            cache.insert(&key(i), i, later + Duration::from_micros(i as u64));
        }
        // Full: only the first has expired at t0 + TTL, and only it goes
        // (the oldest quarter, three answers, would go without the expired
        // pass).
        cache.insert(&key(8), 8, t0 + TTL);
        assert_eq!(cache.len(), 8);
        for i in 1..=8 {
            assert_eq!(cache.get(&key(i), t0 + TTL), Some(i));
        }
    }

    /// Polls `f` once, with a waker that does nothing.
    fn poll_once<T>(f: &mut std::pin::Pin<Box<impl Future<Output = T>>>) -> Poll<T> {
        let waker = std::task::Waker::noop();
        f.as_mut().poll(&mut std::task::Context::from_waker(waker))
    }

    /// A fill that counts its runs and ends with what `rx` is sent.
    async fn told(
        runs: &AtomicUsize,
        rx: tokio::sync::oneshot::Receiver<Result<u32, String>>,
    ) -> Result<(u32, Instant), String> {
        runs.fetch_add(1, Ordering::SeqCst);
        Ok((rx.await.expect("told")?, Instant::now()))
    }

    #[test]
    fn a_late_waiter_of_a_finished_fill_leaves_the_next_fill_registered() {
        use tokio::sync::oneshot::channel;
        let cache: AnswerCache<u32, String> = AnswerCache::new(100, TTL);
        let runs = AtomicUsize::new(0);
        let (k, now) = (key(1), Instant::now());
        let (tx_a, rx_a) = channel();
        let (_tx_b, rx_b) = channel();
        let mut a = Box::pin(cache.get_or_fill(&k, now, told(&runs, rx_a)));
        let mut b = Box::pin(cache.get_or_fill(&k, now, told(&runs, rx_b)));
        assert!(poll_once(&mut a).is_pending());
        assert!(poll_once(&mut b).is_pending(), "b waits for a's fill X");
        // X fails (an error is not cached); a leaves, and X with it.
        tx_a.send(Err("unavailable".into())).unwrap();
        assert!(matches!(poll_once(&mut a), Poll::Ready(Err(_))));
        drop(a);
        // The next miss starts fill Y.
        let (tx_c, rx_c) = channel();
        let mut c = Box::pin(cache.get_or_fill(&k, now, told(&runs, rx_c)));
        assert!(poll_once(&mut c).is_pending());
        // b, late, takes X's error and leaves: Y stays registered ...
        assert!(matches!(poll_once(&mut b), Poll::Ready(Err(_))));
        drop(b);
        assert_eq!(cache.fills_in_progress(), 1, "fill Y still registered");
        // ... so the next miss joins Y instead of walking beside it.
        let (_tx_d, rx_d) = channel();
        let mut d = Box::pin(cache.get_or_fill(&k, now, told(&runs, rx_d)));
        assert!(poll_once(&mut d).is_pending());
        assert_eq!(runs.load(Ordering::SeqCst), 2, "no third walk");
        tx_c.send(Ok(1)).unwrap();
        assert!(matches!(poll_once(&mut c), Poll::Ready(Ok(1))));
        assert!(matches!(poll_once(&mut d), Poll::Ready(Ok(1))));
    }

    #[test]
    fn a_failed_fill_goes_to_its_waiter_and_a_dropped_fillers_waiter_fills() {
        use tokio::sync::oneshot::channel;
        let cache: AnswerCache<u32, String> = AnswerCache::new(100, TTL);
        let runs = AtomicUsize::new(0);
        let (k, now) = (key(1), Instant::now());
        // Two callers at once; the first's fill fails: both get its error.
        let (tx_a, rx_a) = channel();
        let (_tx_b, rx_b) = channel();
        let mut a = Box::pin(cache.get_or_fill(&k, now, told(&runs, rx_a)));
        let mut b = Box::pin(cache.get_or_fill(&k, now, told(&runs, rx_b)));
        assert!(poll_once(&mut a).is_pending());
        assert!(poll_once(&mut b).is_pending());
        tx_a.send(Err("unavailable".into())).unwrap();
        assert!(matches!(poll_once(&mut a), Poll::Ready(Err(e)) if e.as_str() == "unavailable"));
        assert!(matches!(poll_once(&mut b), Poll::Ready(Err(e)) if e.as_str() == "unavailable"));
        assert_eq!(runs.load(Ordering::SeqCst), 1, "b did not run its own");
        drop((a, b));
        // The filler is dropped mid-fill: its waiter runs its own fill.
        let (_tx_c, rx_c) = channel();
        let (tx_d, rx_d) = channel();
        let mut c = Box::pin(cache.get_or_fill(&k, now, told(&runs, rx_c)));
        let mut d = Box::pin(cache.get_or_fill(&k, now, told(&runs, rx_d)));
        assert!(poll_once(&mut c).is_pending());
        assert!(poll_once(&mut d).is_pending());
        drop(c);
        assert!(poll_once(&mut d).is_pending(), "d now fills");
        tx_d.send(Ok(4)).unwrap();
        assert!(matches!(poll_once(&mut d), Poll::Ready(Ok(4))));
        assert_eq!(runs.load(Ordering::SeqCst), 3);
        assert_eq!(cache.fills_in_progress(), 0);
        assert_eq!(cache.get(&k, Instant::now()), Some(4));
    }

    #[test]
    fn remove_if_drops_only_an_answer_the_predicate_names() {
        let cache: AnswerCache<u32, ()> = AnswerCache::new(100, TTL);
        let t0 = Instant::now();
        cache.insert(&key(1), 7, t0);
        assert!(!cache.remove_if(&key(1), |v| *v == 6));
        assert_eq!(cache.get(&key(1), t0), Some(7));
        assert!(cache.remove_if(&key(1), |v| *v == 7));
        assert_eq!(cache.get(&key(1), t0), None);
        assert!(!cache.remove_if(&key(2), |_| true));
    }

    #[tokio::test]
    async fn concurrent_fills_of_one_key_share_one_and_leave_nothing_behind() {
        let cache: AnswerCache<u32, String> = AnswerCache::new(100, TTL);
        let runs = AtomicUsize::new(0);
        let (release, released) = tokio::sync::watch::channel(false);
        let fill = |mut released: tokio::sync::watch::Receiver<bool>| {
            let runs = &runs;
            async move {
                runs.fetch_add(1, Ordering::Relaxed);
                let _ = released.wait_for(|r| *r).await;
                Ok::<_, String>((9, Instant::now()))
            }
        };
        let (now, one) = (Instant::now(), key(1));
        let callers: Vec<_> = (0..16)
            .map(|_| cache.get_or_fill(&one, now, fill(released.clone())))
            .collect();
        let all = futures_join_all(callers, || {
            let _ = release.send(true);
        })
        .await;
        assert!(all.iter().all(|r| r.as_ref().ok() == Some(&9)));
        assert_eq!(runs.load(Ordering::Relaxed), 1, "one fill for 16 callers");
        assert_eq!(cache.fills_in_progress(), 0);
        assert_eq!(cache.get(&key(1), Instant::now()), Some(9));
    }

    #[tokio::test]
    async fn a_failed_fill_is_shared_not_cached_and_a_dropped_one_is_taken_over() {
        let cache: AnswerCache<u32, String> = AnswerCache::new(100, TTL);
        let (now, one) = (Instant::now(), key(1));
        let failed = cache
            .get_or_fill(&one, now, async { Err("no".to_string()) })
            .await;
        assert_eq!(failed.unwrap_err().as_str(), "no");
        assert_eq!(cache.fills_in_progress(), 0);
        // The caller running the fill gives up; the next runs its own.
        let mut pending = Box::pin(cache.get_or_fill(&one, now, std::future::pending()));
        let polled = std::future::poll_fn(|cx| Poll::Ready(pending.as_mut().poll(cx))).await;
        assert!(polled.is_pending(), "never filled");
        assert_eq!(cache.fills_in_progress(), 1);
        drop(pending);
        assert_eq!(cache.fills_in_progress(), 0, "the dropped caller left");
        let filled = cache
            .get_or_fill(&one, now, async { Ok((5, Instant::now())) })
            .await;
        assert_eq!(filled.ok(), Some(5));
        assert_eq!(cache.fills_in_progress(), 0);
    }

    #[tokio::test]
    async fn a_fill_for_an_answer_cached_meanwhile_is_not_run() {
        let cache: AnswerCache<u32, String> = AnswerCache::new(100, TTL);
        let (now, one) = (Instant::now(), key(1));
        // As after a caller's miss, when another caller's fill has just ended.
        cache.insert(&one, 3, now);
        let got = cache
            .get_or_fill(&one, now, async { Err("run".to_string()) })
            .await;
        assert_eq!(got.ok(), Some(3));
    }

    /// Polls `futures` together; calls `go` once all have been polled once.
    async fn futures_join_all<T>(
        futures: Vec<impl Future<Output = T>>,
        go: impl FnOnce(),
    ) -> Vec<T> {
        let mut futures: Vec<_> = futures.into_iter().map(Box::pin).collect();
        let mut out: Vec<Option<T>> = futures.iter().map(|_| None).collect();
        let mut go = Some(go);
        std::future::poll_fn(|cx| {
            for (f, o) in futures.iter_mut().zip(out.iter_mut()) {
                if o.is_none()
                    && let Poll::Ready(v) = f.as_mut().poll(cx)
                {
                    *o = Some(v);
                }
            }
            if let Some(go) = go.take() {
                go();
            }
            if out.iter().all(Option::is_some) {
                Poll::Ready(())
            } else {
                Poll::Pending
            }
        })
        .await;
        out.into_iter().map(|o| o.expect("all ready")).collect()
    }
}
