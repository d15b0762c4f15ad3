//! Store benchmark: `set_if_absent` per second for redb (1 writer, 64 writers
//! with group commit, 64 writers with one transaction per op) and, with the
//! `etcd` feature and an `etcd` binary on PATH, a local 3-member etcd cluster
//! (1 and 64 writers); then, on the same cluster, the etcd DC store's
//! compare-and-set as homingd uses it (a renewal: get + CAS without event; a
//! create: CAS with a `Reserved` event), without and with the store's record
//! cache. Each cell is the median of `REPETITIONS` runs of `CELL_MS` each.
//!
//! `cargo run --release -p homing-store --example store_bench [--features etcd]`

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use homing_core::{DcId, Key, KeyName, ReservationId};
use homing_store::{CommitMode, GlobalStore, RedbGlobalStore, RedbOptions};

const CELL_MS: u64 = 1_500;
const REPETITIONS: usize = 3;
const WRITERS_MANY: usize = 64;

static NEXT_KEY: AtomicU64 = AtomicU64::new(0);

/// Ops per second of `writers` tasks calling set_if_absent on fresh keys for CELL_MS.
async fn run_cell(store: Arc<dyn GlobalStore>, writers: usize) -> f64 {
    let deadline = Instant::now() + Duration::from_millis(CELL_MS);
    let start = Instant::now();
    let tasks: Vec<_> = (0..writers)
        .map(|_| {
            let store = store.clone();
            tokio::spawn(async move {
                let id = ReservationId::new(DcId::new("bench").expect("valid dc"), 1);
                let mut ops = 0u64;
                while Instant::now() < deadline {
                    let n = NEXT_KEY.fetch_add(1, Ordering::Relaxed);
                    let key = Key::new(KeyName::new(format!("k{n}")).expect("valid name"));
                    store.set_if_absent(&key, &id).await.expect("set_if_absent");
                    ops += 1;
                }
                ops
            })
        })
        .collect();
    let mut ops = 0;
    for t in tasks {
        ops += t.await.expect("writer task");
    }
    ops as f64 / start.elapsed().as_secs_f64()
}

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

async fn redb_cell(commit: CommitMode, writers: usize) -> f64 {
    let mut runs = Vec::with_capacity(REPETITIONS);
    for _ in 0..REPETITIONS {
        let dir = tempfile::tempdir().expect("temporary directory");
        let store = RedbGlobalStore::open(
            dir.path().join("global.redb"),
            RedbOptions {
                commit,
                ..RedbOptions::default()
            },
        )
        .expect("open");
        runs.push(run_cell(Arc::new(store), writers).await);
    }
    median(runs)
}

#[cfg(feature = "etcd")]
async fn etcd_rows(rows: &mut Vec<(String, usize, f64)>, dc_rows: &mut Vec<(String, usize, f64)>) {
    use homing_store::etcd::EtcdGlobalStore;
    use homing_store::etcd_cluster::LocalEtcdCluster;
    let cluster = match LocalEtcdCluster::start().await {
        Ok(c) => c,
        Err(e) => {
            println!("etcd rows skipped: {e}");
            return;
        }
    };
    for writers in [1, WRITERS_MANY] {
        let mut runs = Vec::with_capacity(REPETITIONS);
        for rep in 0..REPETITIONS {
            let prefix = format!("/homing-bench/{writers}/{rep}/");
            let store = EtcdGlobalStore::connect(cluster.endpoints(), &prefix)
                .await
                .expect("connect");
            runs.push(run_cell(Arc::new(store), writers).await);
        }
        rows.push((
            "etcd 3 members, concurrent calls batched".into(),
            writers,
            median(runs),
        ));
    }
    dc::rows(cluster.endpoints(), dc_rows).await;
}

/// The etcd DC store's compare-and-set as homingd uses it.
#[cfg(feature = "etcd")]
mod dc {
    use std::future::Future;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::time::{Duration, Instant};

    use homing_core::{
        ActorId, DcId, DcRecord, FencingToken, HostTime, Key, KeyName, LeasePolicy, ReservationId,
        StoreTime,
    };
    use homing_store::etcd::{EtcdDcOptions, EtcdDcStore};
    use homing_store::{Cas, DcStore};

    use super::{CELL_MS, REPETITIONS, WRITERS_MANY, median};

    /// Pause before each cell, in milliseconds.
    const SETTLE_MS: u64 = 1_000;

    static NEXT_UNIQUE: AtomicU64 = AtomicU64::new(1);
    static NEXT_PREFIX: AtomicU64 = AtomicU64::new(0);

    fn fresh_record() -> DcRecord {
        let unique = NEXT_UNIQUE.fetch_add(1, Ordering::Relaxed);
        DcRecord::reserve(
            ReservationId::new(DcId::new("bench").expect("valid dc"), unique),
            Key::new(KeyName::new(format!("r{unique}")).expect("valid name")),
            None,
            FencingToken::FIRST,
            None,
            &homing_core::Holding {
                actor: ActorId::new("10.0.0.1:9000").expect("valid actor"),
                lease: super::lease(),
                host_time: HostTime::from_ms(0),
                session: None,
            },
            StoreTime::from_ms(0),
            &LeasePolicy::DEFAULT,
        )
        .0
    }

    async fn fresh_store(endpoints: &[String], cached: bool) -> Arc<EtcdDcStore> {
        // Lets etcd finish with the previous cell's writes, which otherwise
        // slow the next cell down.
        tokio::time::sleep(Duration::from_millis(SETTLE_MS)).await;
        let prefix = format!(
            "/homing-bench/dc/{}/",
            NEXT_PREFIX.fetch_add(1, Ordering::Relaxed)
        );
        let mut options = EtcdDcOptions::default();
        if !cached {
            options.record_cache_entries_max = 0;
        }
        Arc::new(
            EtcdDcStore::connect_with(endpoints, &prefix, options)
                .await
                .expect("connect"),
        )
    }

    /// Ops per second of `writers` tasks, each calling `op(writer)` in a loop for CELL_MS.
    async fn rate<F, Fut>(writers: usize, op: F) -> f64
    where
        F: Fn(usize) -> Fut + Clone + Send + 'static,
        Fut: Future<Output = ()> + Send,
    {
        let deadline = Instant::now() + Duration::from_millis(CELL_MS);
        let start = Instant::now();
        let tasks: Vec<_> = (0..writers)
            .map(|w| {
                let op = op.clone();
                tokio::spawn(async move {
                    let mut ops = 0u64;
                    while Instant::now() < deadline {
                        op(w).await;
                        ops += 1;
                    }
                    ops
                })
            })
            .collect();
        let mut ops = 0;
        for t in tasks {
            ops += t.await.expect("writer task");
        }
        ops as f64 / start.elapsed().as_secs_f64()
    }

    /// homingd's renewal (`update_inner`): get the record, then CAS it at
    /// version + 1 (no event). One record per writer.
    async fn get_and_renew(endpoints: &[String], cached: bool, writers: usize) -> f64 {
        let store = fresh_store(endpoints, cached).await;
        let mut ids = Vec::with_capacity(writers);
        for _ in 0..writers {
            let record = fresh_record();
            let cas = store.compare_and_set(None, &record).await.expect("create");
            assert_eq!(cas, Cas::Written);
            ids.push(record.id);
        }
        let ids = Arc::new(ids);
        rate(writers, move |w| {
            let (store, ids) = (store.clone(), ids.clone());
            async move {
                let record = store.get(&ids[w]).await.expect("get").expect("created");
                let next = record
                    .renew(
                        record.token,
                        &super::lease(),
                        HostTime::from_ms(0),
                        StoreTime::from_ms(0),
                        &LeasePolicy::DEFAULT,
                    )
                    .next
                    .expect("a live lease renews");
                let cas = store
                    .compare_and_set(Some(record.version), &next)
                    .await
                    .expect("renew");
                assert_eq!(cas, Cas::Written, "one writer per record");
            }
        })
        .await
    }

    /// homingd's create: CAS a fresh record in (appends a `Reserved` event).
    async fn create(endpoints: &[String], cached: bool, writers: usize) -> f64 {
        let store = fresh_store(endpoints, cached).await;
        rate(writers, move |_| {
            let store = store.clone();
            async move {
                let record = fresh_record();
                let cas = store.compare_and_set(None, &record).await.expect("create");
                assert_eq!(cas, Cas::Written);
            }
        })
        .await
    }

    /// Each case without the record cache (every CAS reads first: the
    /// read-then-write path) and with it, repetitions alternating so that
    /// both see the same machine load.
    pub(super) async fn rows(endpoints: &[String], rows: &mut Vec<(String, usize, f64)>) {
        for writers in [1, WRITERS_MANY] {
            for case in ["renew (get + CAS)", "create + event"] {
                let (mut off, mut on) = (Vec::new(), Vec::new());
                for _ in 0..REPETITIONS {
                    for (cached, runs) in [(false, &mut off), (true, &mut on)] {
                        runs.push(match case {
                            "create + event" => create(endpoints, cached, writers).await,
                            _ => get_and_renew(endpoints, cached, writers).await,
                        });
                    }
                }
                rows.push((format!("etcd, {case}, no cache"), writers, median(off)));
                rows.push((format!("etcd, {case}, cache"), writers, median(on)));
            }
        }
    }
}

#[tokio::main(flavor = "multi_thread")]
async fn main() {
    let grouped = RedbOptions::default().commit;
    #[cfg_attr(not(feature = "etcd"), allow(unused_mut))]
    let mut rows = vec![
        (
            "redb, group commit".to_string(),
            1,
            redb_cell(grouped, 1).await,
        ),
        (
            "redb, group commit".to_string(),
            WRITERS_MANY,
            redb_cell(grouped, WRITERS_MANY).await,
        ),
        (
            "redb, txn per op".to_string(),
            WRITERS_MANY,
            redb_cell(CommitMode::PerOp, WRITERS_MANY).await,
        ),
    ];
    #[cfg_attr(not(feature = "etcd"), allow(unused_mut))]
    let mut dc_rows: Vec<(String, usize, f64)> = Vec::new();
    #[cfg(feature = "etcd")]
    etcd_rows(&mut rows, &mut dc_rows).await;
    #[cfg(not(feature = "etcd"))]
    println!("etcd rows skipped: built without the `etcd` feature");
    println!("set_if_absent, median of {REPETITIONS} x {CELL_MS} ms");
    println!("{:<30} {:>8} {:>12}", "store", "writers", "ops/s");
    for (store, writers, rate) in rows {
        println!("{store:<30} {writers:>8} {rate:>12.0}");
    }
    if !dc_rows.is_empty() {
        println!();
        println!("DC store compare-and-set, median of {REPETITIONS} x {CELL_MS} ms");
        println!(
            "{:<36} {:>8} {:>12}",
            "store, operation", "writers", "ops/s"
        );
    }
    for (case, writers, rate) in dc_rows {
        println!("{case:<36} {writers:>8} {rate:>12.0}");
    }
}

/// The lease key of every holder here.
#[cfg(feature = "etcd")]
fn lease() -> homing_core::LeaseKey {
    homing_core::LeaseKey::from_bytes([1; 16]).expect("not all zeros")
}
