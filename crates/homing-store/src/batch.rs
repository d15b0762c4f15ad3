//! Batched calls for the networked global stores (etcd, FoundationDB):
//! concurrent calls of one kind on one store share one store transaction,
//! so homing is not held to the store's one-op-per-transaction rate (DESIGN
//! §4; redb does the same through its writer thread). Two kinds use it: the
//! write-once (`set_if_absent`, etcd and FoundationDB) and the connect's
//! nearest read (`get_nearest`, etcd: one read-only transaction of
//! serializable ranges, answered by one member without a quorum round
//! trip). A task per store and kind takes the first queued call, drains
//! more that are already queued — at most [`BatchBounds::keys_max`] keys and
//! never the same key twice (a second call for a key waits for the next
//! batch, where a write-once sees the first's entry) — and hands the batch
//! to the backend's [`Batch::commit`], which decides every call on its own
//! inside one transaction and returns one outcome per call, in order: a
//! batch answers each caller exactly what its own call would have. At most
//! [`BatchBounds::in_flight_max`] batches of one kind are in flight at once
//! (the next fills while they commit); alone, a call is a batch of one.

use std::collections::HashSet;
use std::hash::{BuildHasher, RandomState};
use std::sync::Arc;

use async_trait::async_trait;
use homing_core::Key;
use tokio::sync::{Semaphore, mpsc, oneshot};

use crate::error::StoreError;

/// Most keys one batch carries by default (etcd allows 128 operations per
/// transaction by default; FoundationDB transactions should stay small).
/// Keys are bounded (a namespace of at most 128 bytes, a name of at most
/// 256), so a batch stays far below etcd's 1.5 MiB request limit (64 ×
/// under 1 KiB).
pub const BATCH_KEYS_MAX: usize = 64;
/// Batches of one kind committing at once, by default.
pub const BATCHES_IN_FLIGHT_MAX: usize = 4;
/// Calls queued before callers wait (backpressure).
pub const BATCH_QUEUE_MAX: usize = 4096;

/// How large batches of one kind grow and how many commit at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchBounds {
    /// Most calls (distinct keys) in one batch: 1 to `GET_MANY_KEYS_MAX`.
    pub keys_max: usize,
    /// Most batches in flight at once: at least 1.
    pub in_flight_max: usize,
}

impl Default for BatchBounds {
    fn default() -> BatchBounds {
        BatchBounds {
            keys_max: BATCH_KEYS_MAX,
            in_flight_max: BATCHES_IN_FLIGHT_MAX,
        }
    }
}

impl BatchBounds {
    /// Rejects bounds a batcher cannot run with, naming the field.
    pub fn check(self) -> Result<BatchBounds, StoreError> {
        let max = crate::global::GET_MANY_KEYS_MAX;
        if !(1..=max).contains(&self.keys_max) {
            return Err(StoreError::InvalidArgument(format!(
                "batch keys_max must be 1 to {max}, not {}",
                self.keys_max
            )));
        }
        if self.in_flight_max == 0 {
            return Err(StoreError::InvalidArgument(
                "batch in_flight_max must be at least 1".into(),
            ));
        }
        Ok(self)
    }
}

/// A backend's commit of one batch of calls of one kind.
#[async_trait]
pub(crate) trait Batch: Send + Sync + 'static {
    /// One caller's call.
    type Call: Send + Sync + 'static;
    /// What one call answers.
    type Outcome: Send + 'static;

    /// The key the call is about (a batch never holds a key twice).
    fn key(call: &Self::Call) -> &Key;

    /// In one transaction, each call decided on its own (distinct keys).
    /// One outcome per call, in order; an error fails the whole batch (for
    /// writes: nothing of it is known to be written).
    async fn commit(&self, calls: &[Self::Call]) -> Result<Vec<Self::Outcome>, StoreError>;

    /// The backend's name, for errors.
    fn backend(&self) -> &'static str;
}

struct Queued<B: Batch> {
    call: B::Call,
    reply: oneshot::Sender<Result<B::Outcome, StoreError>>,
}

/// Handle to a store's batching task for one kind of call; the task ends
/// when the handle is dropped (after answering what is queued).
pub(crate) struct Batcher<B: Batch> {
    queue: mpsc::Sender<Queued<B>>,
    backend: &'static str,
}

impl<B: Batch> Batcher<B> {
    /// Starts the task on the current tokio runtime.
    pub(crate) fn start(store: Arc<B>, bounds: BatchBounds) -> Batcher<B> {
        let backend = store.backend();
        let (queue, rx) = mpsc::channel(BATCH_QUEUE_MAX);
        tokio::spawn(run(store, bounds, rx));
        Batcher { queue, backend }
    }

    /// Queues the call and waits for its batch.
    pub(crate) async fn call(&self, call: B::Call) -> Result<B::Outcome, StoreError> {
        let (reply, answer) = oneshot::channel();
        let stopped = || StoreError::Unavailable {
            backend: self.backend,
            reason: "batcher stopped".into(),
        };
        self.queue
            .send(Queued { call, reply })
            .await
            .map_err(|_| stopped())?;
        answer.await.map_err(|_| stopped())?
    }
}

async fn run<B: Batch>(store: Arc<B>, bounds: BatchBounds, mut rx: mpsc::Receiver<Queued<B>>) {
    let in_flight = Arc::new(Semaphore::new(bounds.in_flight_max));
    let mut held: Option<Queued<B>> = None;
    // The batch's keys by hash: comparing each drained call with every key
    // of a full batch took a few % of a busy daemon's CPU (`perf`).
    let hasher = RandomState::new();
    let mut hashes = HashSet::with_capacity(bounds.keys_max);
    loop {
        // Invariant: the semaphore is never closed.
        let permit = in_flight
            .clone()
            .acquire_owned()
            .await
            .expect("open semaphore");
        let first = match held.take() {
            Some(first) => first,
            None => match rx.recv().await {
                Some(first) => first,
                None => return,
            },
        };
        hashes.clear();
        hashes.insert(hasher.hash_one(B::key(&first.call)));
        let mut batch = vec![first];
        while batch.len() < bounds.keys_max {
            let Ok(next) = rx.try_recv() else { break };
            let key = B::key(&next.call);
            // A hash seen before is a repeated key or (rarely) a collision.
            let seen = !hashes.insert(hasher.hash_one(key));
            if seen && batch.iter().any(|q| B::key(&q.call) == key) {
                held = Some(next);
                break;
            }
            batch.push(next);
        }
        let store = store.clone();
        tokio::spawn(async move {
            commit(&*store, batch).await;
            drop(permit);
        });
    }
}

/// Commits `batch` and answers every caller.
async fn commit<B: Batch>(store: &B, batch: Vec<Queued<B>>) {
    let (calls, replies): (Vec<B::Call>, Vec<_>) =
        batch.into_iter().map(|q| (q.call, q.reply)).unzip();
    match store.commit(&calls).await {
        Ok(outcomes) if outcomes.len() == replies.len() => {
            for (reply, outcome) in replies.into_iter().zip(outcomes) {
                // A caller that stopped waiting still had its call decided.
                let _ = reply.send(Ok(outcome));
            }
        }
        Ok(outcomes) => {
            let reason = format!(
                "a batch of {} calls answered {} outcomes",
                replies.len(),
                outcomes.len()
            );
            for reply in replies {
                let _ = reply.send(Err(StoreError::Backend {
                    backend: store.backend(),
                    reason: reason.clone(),
                }));
            }
        }
        Err(e) => {
            for reply in replies {
                let _ = reply.send(Err(e.for_each_caller(store.backend())));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::sync::Mutex;

    use homing_core::{KeyName, ReservationId};

    use super::*;
    use crate::global::SetIfAbsent;

    /// Entries in memory; every commit records its batch size, then waits
    /// for a permit of `gate` (so the test can hold batches in flight).
    struct Gated {
        entries: Mutex<HashMap<Key, ReservationId>>,
        batches: Mutex<Vec<usize>>,
        gate: Semaphore,
    }

    impl Gated {
        /// A closed gate and a batcher over it.
        fn start() -> (Arc<Gated>, Arc<Batcher<Gated>>) {
            let store = Arc::new(Gated {
                entries: Mutex::default(),
                batches: Mutex::default(),
                gate: Semaphore::new(0),
            });
            let batcher = Arc::new(Batcher::start(store.clone(), BatchBounds::default()));
            (store, batcher)
        }
    }

    #[async_trait]
    impl Batch for Gated {
        type Call = (Key, ReservationId);
        type Outcome = SetIfAbsent;

        fn key(call: &Self::Call) -> &Key {
            &call.0
        }

        async fn commit(
            &self,
            batch: &[(Key, ReservationId)],
        ) -> Result<Vec<SetIfAbsent>, StoreError> {
            self.batches.lock().unwrap().push(batch.len());
            let distinct: HashSet<&Key> = batch.iter().map(|(key, _)| key).collect();
            assert_eq!(distinct.len(), batch.len(), "a batch held a key twice");
            self.gate.acquire().await.unwrap().forget();
            let mut entries = self.entries.lock().unwrap();
            Ok(batch
                .iter()
                .map(|(key, id)| match entries.get(key) {
                    Some(existing) => SetIfAbsent::Exists(existing.clone()),
                    None => {
                        entries.insert(key.clone(), id.clone());
                        SetIfAbsent::Inserted
                    }
                })
                .collect())
        }

        fn backend(&self) -> &'static str {
            "gated"
        }
    }

    fn key(n: usize) -> Key {
        Key::new(KeyName::new(format!("k{n}")).unwrap())
    }

    fn id(n: usize) -> ReservationId {
        format!("iad.{}", n + 1).parse().unwrap()
    }

    async fn until(what: impl Fn() -> bool) {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while !what() {
            assert!(std::time::Instant::now() < deadline, "timed out waiting");
            tokio::task::yield_now().await;
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn calls_queued_behind_full_batches_share_one_and_each_gets_its_own_outcome() {
        let (store, batcher) = Gated::start();
        let call = |k: usize, i: usize| {
            let batcher = batcher.clone();
            tokio::spawn(async move { batcher.call((key(k), id(i))).await.unwrap() })
        };
        // Every batch slot busy with one call each (one at a time, so that
        // each is a batch of its own).
        let mut first = Vec::new();
        for n in 0..BATCHES_IN_FLIGHT_MAX {
            first.push(call(n, n));
            until(|| store.batches.lock().unwrap().len() == n + 1).await;
        }
        // Queued meanwhile: 20 fresh keys, a second call for one of them
        // (another id) and a second call for a key the first calls wrote.
        let fresh = BATCHES_IN_FLIGHT_MAX..BATCHES_IN_FLIGHT_MAX + 20;
        let queued: Vec<_> = fresh.clone().map(|n| call(n, n)).collect();
        let twice = call(fresh.start, 100);
        let written = call(0, 101);
        until(|| batcher.queue.capacity() == BATCH_QUEUE_MAX - 22).await;
        // The first batches commit (the gate is fair: they wait ahead of any later one).
        store.gate.add_permits(BATCHES_IN_FLIGHT_MAX);
        for (n, task) in first.into_iter().enumerate() {
            assert_eq!(task.await.unwrap(), SetIfAbsent::Inserted, "k{n}");
        }
        store.gate.add_permits(1_000);
        let mut queued = fresh.clone().zip(queued);
        // Two calls for one key, in two batches that may commit in either
        // order: one inserts, the other is told the winner.
        let (k, task) = queued.next().unwrap();
        match (task.await.unwrap(), twice.await.unwrap()) {
            (SetIfAbsent::Inserted, other) => assert_eq!(other, SetIfAbsent::Exists(id(k))),
            (other, SetIfAbsent::Inserted) => assert_eq!(other, SetIfAbsent::Exists(id(100))),
            both => panic!("k{k}: no single winner: {both:?}"),
        }
        for (n, task) in queued {
            assert_eq!(task.await.unwrap(), SetIfAbsent::Inserted, "k{n}");
        }
        // A later call for a key that is written sees its entry.
        assert_eq!(written.await.unwrap(), SetIfAbsent::Exists(id(0)));
        let batches = store.batches.lock().unwrap().clone();
        assert_eq!(batches.iter().sum::<usize>(), BATCHES_IN_FLIGHT_MAX + 22);
        assert!(
            batches.len() < BATCHES_IN_FLIGHT_MAX + 22 - 10,
            "queued calls were not grouped: {batches:?}"
        );
        assert!(batches.iter().all(|&b| b <= BATCH_KEYS_MAX));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_batch_never_exceeds_its_bound() {
        let (store, batcher) = Gated::start();
        let calls = BATCHES_IN_FLIGHT_MAX + 3 * BATCH_KEYS_MAX;
        let tasks: Vec<_> = (0..calls)
            .map(|n| {
                let batcher = batcher.clone();
                tokio::spawn(async move { batcher.call((key(n), id(n))).await.unwrap() })
            })
            .collect();
        until(|| {
            let recorded: usize = store.batches.lock().unwrap().iter().sum();
            recorded + (BATCH_QUEUE_MAX - batcher.queue.capacity()) == calls
        })
        .await;
        store.gate.add_permits(calls);
        for task in tasks {
            assert_eq!(task.await.unwrap(), SetIfAbsent::Inserted);
        }
        let batches = store.batches.lock().unwrap().clone();
        assert_eq!(batches.iter().sum::<usize>(), calls);
        assert!(batches.iter().all(|&b| b <= BATCH_KEYS_MAX), "{batches:?}");
    }
}
