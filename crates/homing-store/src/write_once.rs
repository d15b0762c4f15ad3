//! Batched write-once for the networked global stores (etcd, FoundationDB):
//! concurrent `set_if_absent` calls on one store share one store
//! transaction, so homing is not held to the store's one-op-per-transaction
//! rate (DESIGN §4; redb does the same through its writer thread). A task per
//! store takes the first queued call, drains more that are already queued —
//! at most [`WRITE_ONCE_BATCH_KEYS_MAX`] keys and never the same key twice
//! (a second call for a key waits for the next batch, where it sees the
//! first's entry) — and hands the batch to the backend's
//! [`WriteOnceBatch::commit`], which decides every key on its own inside one
//! transaction (insert if absent, else read the entry) and returns one
//! outcome per key, in order: a batch answers each caller exactly what its
//! own `set_if_absent` would have. At most [`WRITE_ONCE_BATCHES_IN_FLIGHT_MAX`]
//! batches are in flight at once; alone, a call is a batch of one.

use std::sync::Arc;

use async_trait::async_trait;
use homing_core::{Key, ReservationId};
use tokio::sync::{Semaphore, mpsc, oneshot};

use crate::error::StoreError;
use crate::global::SetIfAbsent;

/// Most keys one batch carries (etcd allows 128 operations per transaction
/// by default; FoundationDB transactions should stay small). Keys are
/// bounded (a namespace of at most 128 bytes, a name of at most 256), so a
/// batch stays far below etcd's 1.5 MiB request limit (64 × under 1 KiB).
pub const WRITE_ONCE_BATCH_KEYS_MAX: usize = 64;
/// Batches committing at once: the next batch fills while these are in flight.
pub const WRITE_ONCE_BATCHES_IN_FLIGHT_MAX: usize = 4;
/// Calls queued before callers wait (backpressure).
pub const WRITE_ONCE_QUEUE_MAX: usize = 4096;

/// A backend's commit of one batch of write-once calls.
#[async_trait]
pub(crate) trait WriteOnceBatch: Send + Sync + 'static {
    /// In one transaction, for each `(key, id)` (distinct keys): insert `id`
    /// if the key has no entry, else read it. One outcome per key, in order;
    /// an error fails the whole batch (nothing of it is known to be written).
    async fn commit(&self, batch: &[(Key, ReservationId)]) -> Result<Vec<SetIfAbsent>, StoreError>;

    /// The backend's name, for errors.
    fn backend(&self) -> &'static str;
}

struct Queued {
    key: Key,
    id: ReservationId,
    reply: oneshot::Sender<Result<SetIfAbsent, StoreError>>,
}

/// Handle to a store's batching task; the task ends when the handle is
/// dropped (after answering what is queued).
pub(crate) struct WriteOnceBatcher {
    queue: mpsc::Sender<Queued>,
    backend: &'static str,
}

impl WriteOnceBatcher {
    /// Starts the task on the current tokio runtime.
    pub(crate) fn start<B: WriteOnceBatch>(store: Arc<B>) -> WriteOnceBatcher {
        let backend = store.backend();
        let (queue, rx) = mpsc::channel(WRITE_ONCE_QUEUE_MAX);
        tokio::spawn(run(store, rx));
        WriteOnceBatcher { queue, backend }
    }

    /// Queues the call and waits for its batch.
    pub(crate) async fn set_if_absent(
        &self,
        key: &Key,
        id: &ReservationId,
    ) -> Result<SetIfAbsent, StoreError> {
        let (reply, answer) = oneshot::channel();
        let queued = Queued {
            key: key.clone(),
            id: id.clone(),
            reply,
        };
        let stopped = || StoreError::Unavailable {
            backend: self.backend,
            reason: "write-once batcher stopped".into(),
        };
        self.queue.send(queued).await.map_err(|_| stopped())?;
        answer.await.map_err(|_| stopped())?
    }
}

async fn run<B: WriteOnceBatch>(store: Arc<B>, mut rx: mpsc::Receiver<Queued>) {
    let in_flight = Arc::new(Semaphore::new(WRITE_ONCE_BATCHES_IN_FLIGHT_MAX));
    let mut held: Option<Queued> = None;
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
        let mut batch = vec![first];
        while batch.len() < WRITE_ONCE_BATCH_KEYS_MAX {
            let Ok(next) = rx.try_recv() else { break };
            if batch.iter().any(|q| q.key == next.key) {
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
async fn commit<B: WriteOnceBatch>(store: &B, batch: Vec<Queued>) {
    let pairs: Vec<(Key, ReservationId)> = batch
        .iter()
        .map(|q| (q.key.clone(), q.id.clone()))
        .collect();
    match store.commit(&pairs).await {
        Ok(outcomes) if outcomes.len() == batch.len() => {
            for (q, outcome) in batch.into_iter().zip(outcomes) {
                // A caller that stopped waiting still had its write decided.
                let _ = q.reply.send(Ok(outcome));
            }
        }
        Ok(outcomes) => {
            let reason = format!(
                "a batch of {} write-once calls answered {} outcomes",
                batch.len(),
                outcomes.len()
            );
            for q in batch {
                let _ = q.reply.send(Err(StoreError::Backend {
                    backend: store.backend(),
                    reason: reason.clone(),
                }));
            }
        }
        Err(e) => {
            for q in batch {
                let _ = q.reply.send(Err(e.for_each_caller(store.backend())));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::sync::Mutex;

    use homing_core::KeyName;

    use super::*;

    /// Entries in memory; every commit records its batch size, then waits
    /// for a permit of `gate` (so the test can hold batches in flight).
    struct Gated {
        entries: Mutex<HashMap<Key, ReservationId>>,
        batches: Mutex<Vec<usize>>,
        gate: Semaphore,
    }

    impl Gated {
        /// A closed gate and a batcher over it.
        fn start() -> (Arc<Gated>, Arc<WriteOnceBatcher>) {
            let store = Arc::new(Gated {
                entries: Mutex::default(),
                batches: Mutex::default(),
                gate: Semaphore::new(0),
            });
            let batcher = Arc::new(WriteOnceBatcher::start(store.clone()));
            (store, batcher)
        }
    }

    #[async_trait]
    impl WriteOnceBatch for Gated {
        async fn commit(
            &self,
            batch: &[(Key, ReservationId)],
        ) -> Result<Vec<SetIfAbsent>, StoreError> {
            self.batches.lock().unwrap().push(batch.len());
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
            tokio::spawn(async move { batcher.set_if_absent(&key(k), &id(i)).await.unwrap() })
        };
        // Every batch slot busy with one call each (one at a time, so that
        // each is a batch of its own).
        let mut first = Vec::new();
        for n in 0..WRITE_ONCE_BATCHES_IN_FLIGHT_MAX {
            first.push(call(n, n));
            until(|| store.batches.lock().unwrap().len() == n + 1).await;
        }
        // Queued meanwhile: 20 fresh keys, a second call for one of them
        // (another id) and a second call for a key the first calls wrote.
        let fresh = WRITE_ONCE_BATCHES_IN_FLIGHT_MAX..WRITE_ONCE_BATCHES_IN_FLIGHT_MAX + 20;
        let queued: Vec<_> = fresh.clone().map(|n| call(n, n)).collect();
        let twice = call(fresh.start, 100);
        let written = call(0, 101);
        until(|| batcher.queue.capacity() == WRITE_ONCE_QUEUE_MAX - 22).await;
        // The first batches commit (the gate is fair: they wait ahead of any later one).
        store.gate.add_permits(WRITE_ONCE_BATCHES_IN_FLIGHT_MAX);
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
        assert_eq!(
            batches.iter().sum::<usize>(),
            WRITE_ONCE_BATCHES_IN_FLIGHT_MAX + 22
        );
        assert!(
            batches.len() < WRITE_ONCE_BATCHES_IN_FLIGHT_MAX + 22 - 10,
            "queued calls were not grouped: {batches:?}"
        );
        assert!(batches.iter().all(|&b| b <= WRITE_ONCE_BATCH_KEYS_MAX));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_batch_never_exceeds_its_bound() {
        let (store, batcher) = Gated::start();
        let calls = WRITE_ONCE_BATCHES_IN_FLIGHT_MAX + 3 * WRITE_ONCE_BATCH_KEYS_MAX;
        let tasks: Vec<_> = (0..calls)
            .map(|n| {
                let batcher = batcher.clone();
                tokio::spawn(async move { batcher.set_if_absent(&key(n), &id(n)).await.unwrap() })
            })
            .collect();
        until(|| {
            let recorded: usize = store.batches.lock().unwrap().iter().sum();
            recorded + (WRITE_ONCE_QUEUE_MAX - batcher.queue.capacity()) == calls
        })
        .await;
        store.gate.add_permits(calls);
        for task in tasks {
            assert_eq!(task.await.unwrap(), SetIfAbsent::Inserted);
        }
        let batches = store.batches.lock().unwrap().clone();
        assert_eq!(batches.iter().sum::<usize>(), calls);
        assert!(
            batches.iter().all(|&b| b <= WRITE_ONCE_BATCH_KEYS_MAX),
            "{batches:?}"
        );
    }
}
