//! Store benchmark: `set_if_absent` per second for redb (1 writer, 64 writers
//! with group commit, 64 writers with one transaction per op) and, with the
//! `etcd` feature and an `etcd` binary on PATH, a local 3-member etcd cluster
//! (1 and 64 writers). Each cell is the median of `REPETITIONS` runs of
//! `CELL_MS` each.
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
        let store = RedbGlobalStore::open(dir.path().join("global.redb"), RedbOptions { commit })
            .expect("open");
        runs.push(run_cell(Arc::new(store), writers).await);
    }
    median(runs)
}

#[cfg(feature = "etcd")]
async fn etcd_rows(rows: &mut Vec<(String, usize, f64)>) {
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
        rows.push(("etcd 3 members, txn per op".into(), writers, median(runs)));
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
    #[cfg(feature = "etcd")]
    etcd_rows(&mut rows).await;
    #[cfg(not(feature = "etcd"))]
    println!("etcd rows skipped: built without the `etcd` feature");
    println!("set_if_absent, median of {REPETITIONS} x {CELL_MS} ms");
    println!("{:<30} {:>8} {:>12}", "store", "writers", "ops/s");
    for (store, writers, rate) in rows {
        println!("{store:<30} {writers:>8} {rate:>12.0}");
    }
}
