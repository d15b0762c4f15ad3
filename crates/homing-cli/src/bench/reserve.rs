//! `homing bench reserve`: first reservations of fresh keys per second through
//! one homingd (a 1-DC devnet: QUIC + mutual TLS, a redb DC store and a redb
//! global store, both with homing-store's group commit) against the store's
//! write-once alone, at 1, 8, 64 and 256 concurrent tasks. Two baselines:
//! the raw store operation as redb itself offers it (one write transaction
//! per write-once, no homing code: concurrent writers queue on redb's write
//! lock, one fsync each), and homing-store's own group-committed
//! `RedbGlobalStore::set_if_absent` (concurrent writers share one fsync) —
//! the stricter bar, since a reserve makes two such writes in series. A
//! further lane hands the same requests to the daemon's request handler in
//! this process, without QUIC: it separates what the daemon's work (its
//! stores included) costs from what serving it over the network costs. The
//! daemon's own store timings (its metrics) say where a reserve's time goes.
//!
//! `homing bench reserve-etcd` (cargo feature `etcd`) runs the same lanes
//! with a 3-member etcd cluster as the global store, against etcd's own
//! transactional put-if-absent through etcd-client (one txn per op, no
//! homing code) and homing-store's batched `EtcdGlobalStore::set_if_absent`
//! (concurrent calls share one txn).

use homing_core::AcquireReply;
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use anyhow::bail;
use homing_core::{DcId, Identity, Key, Reply, ReservationId, Role};
use homing_daemon::Node;
use homing_net::{Client, Handler, Peer};
use homing_store::{GlobalStore, RedbGlobalStore, RedbOptions};
use redb::ReadableTable;

use super::svg::{Series, line_chart};
use super::{
    Cell, Load, OneDc, Timed, acquire_request, histogram_totals, key, median_cell, run_cell,
    run_tag, thousands, write_plot,
};

/// Store operations of a first reserve, in the order the daemon runs them.
const STORE_OPS: [&str; 4] = [
    "global_get",
    "dc_allocate",
    "dc_cas",
    "global_set_if_absent",
];

/// What the lanes of one suite run against.
struct Lanes {
    /// A host client of the DC, and the DC's address.
    client: Client,
    peer: Peer,
    /// The daemon's handler, called in this process (no QUIC, no TLS).
    node: Arc<Node>,
    host: Identity,
    /// The baseline: the store's write-once on its own, as the store offers it.
    raw: Baseline,
    /// homing-store's group-committed write-once on a store of its own,
    /// where the store has no grouping of its own (redb).
    grouped: Option<Baseline>,
    dc: DcId,
}

/// A baseline lane's write-once.
#[derive(Clone)]
enum Baseline {
    /// A `GlobalStore`'s `set_if_absent` (homing-store's own, grouped).
    Store(Arc<dyn GlobalStore>),
    /// etcd's own API, no homing code: one transaction per op (compare
    /// `create_revision == 0`, put; else get), over etcd-client's channel to
    /// every member.
    #[cfg(feature = "etcd")]
    EtcdTxn {
        kv: Box<etcd_client::KvClient>,
        prefix: String,
    },
    /// redb's own API, no homing code: one write transaction per op (read
    /// the key, insert it if absent, commit with redb's default
    /// `Durability::Immediate`), on tokio's blocking pool since redb blocks.
    RedbTxn(Arc<redb::Database>),
}

/// The table the raw redb lane writes to.
const RAW_TABLE: redb::TableDefinition<&[u8], &[u8]> = redb::TableDefinition::new("raw");

impl Baseline {
    fn open_redb(path: &Path) -> anyhow::Result<Baseline> {
        let db = redb::Database::create(path)?;
        let txn = db.begin_write()?;
        txn.open_table(RAW_TABLE)?;
        txn.commit()?;
        Ok(Baseline::RedbTxn(Arc::new(db)))
    }

    async fn write_once(&self, key: &Key, id: &ReservationId) -> anyhow::Result<()> {
        match self {
            Baseline::Store(store) => {
                store.set_if_absent(key, id).await?;
                Ok(())
            }
            #[cfg(feature = "etcd")]
            Baseline::EtcdTxn { kv, prefix } => {
                use etcd_client::{Compare, CompareOp, Txn, TxnOp};
                let k = format!("{prefix}{key}");
                let txn = Txn::new()
                    .when([Compare::create_revision(k.clone(), CompareOp::Equal, 0)])
                    .and_then([TxnOp::put(k.clone(), id.to_string(), None)])
                    .or_else([TxnOp::get(k, None)]);
                kv.as_ref().clone().txn(txn).await?;
                Ok(())
            }
            Baseline::RedbTxn(db) => {
                let db = db.clone();
                let (key, id) = (key.to_string(), id.to_string());
                tokio::task::spawn_blocking(move || -> anyhow::Result<()> {
                    let txn = db.begin_write()?;
                    {
                        let mut table = txn.open_table(RAW_TABLE)?;
                        if table.get(key.as_bytes())?.is_none() {
                            table.insert(key.as_bytes(), id.as_bytes())?;
                        }
                    }
                    txn.commit()?;
                    Ok(())
                })
                .await?
            }
        }
    }
}

/// One concurrency's results.
struct Row {
    tasks: usize,
    homing: Cell,
    raw: Cell,
    grouped: Option<Cell>,
    local: Cell,
    /// Server-side means of the homing lane, in microseconds: the whole
    /// Acquire (`"acquire"`) and each store operation it ran.
    means_us: BTreeMap<&'static str, f64>,
}

/// Runs the suite with the redb global store; always `true` (the targets are
/// reported, not enforced).
pub async fn run(out: &Path, load: &Load) -> anyhow::Result<bool> {
    let OneDc {
        net,
        dc,
        client,
        peer,
    } = OneDc::start().await?;
    let raw_dir = tempfile::Builder::new()
        .prefix("homing-bench-raw-")
        .tempdir()?;
    let grouped: Arc<dyn GlobalStore> = Arc::new(RedbGlobalStore::open(
        raw_dir.path().join("global.redb"),
        RedbOptions::default(),
    )?);
    let lanes = Lanes {
        client,
        peer,
        node: net.dcs()[0].daemon.node().clone(),
        host: Identity::new(Role::Host, Some(dc.clone()))?,
        raw: Baseline::open_redb(&raw_dir.path().join("raw.redb"))?,
        grouped: Some(Baseline::Store(grouped)),
        dc,
    };
    println!(
        "reserve: Acquire of fresh keys through homingd (1 DC, QUIC + mTLS, redb DC + global \
         stores, group commit) vs the raw redb write-once (one write transaction per op) and \
         vs homing-store's group-committed RedbGlobalStore::set_if_absent"
    );
    let rows = measure(&lanes, load).await?;
    net.shutdown().await;
    report(&rows, "raw redb txn", "redb");
    plot(out, "reserve.svg", "reserve", "raw redb txn per op", &rows)
}

/// Runs the suite with a local 3-member etcd cluster as the global store.
#[cfg(feature = "etcd")]
pub async fn run_etcd(out: &Path, load: &Load) -> anyhow::Result<bool> {
    use homing_store::etcd::EtcdGlobalStore;
    use homing_store::etcd_cluster::LocalEtcdCluster;

    let cluster = LocalEtcdCluster::start().await?;
    let tag = run_tag();
    let options = etcd_batch_options()?;
    let global: Arc<dyn GlobalStore> = Arc::new(
        EtcdGlobalStore::connect_with(
            cluster.endpoints(),
            &format!("/bench-{tag}/homing"),
            options,
        )
        .await?,
    );
    let grouped: Arc<dyn GlobalStore> = Arc::new(
        EtcdGlobalStore::connect(cluster.endpoints(), &format!("/bench-{tag}/grouped")).await?,
    );
    let raw = etcd_client::Client::connect(cluster.endpoints(), None).await?;
    let one = super::OwnGlobalDc::start(global).await?;
    let lanes = Lanes {
        client: one.client.clone(),
        peer: one.peer.clone(),
        node: one.daemon.node().clone(),
        host: Identity::new(Role::Host, Some(one.dc.clone()))?,
        raw: Baseline::EtcdTxn {
            kv: Box::new(raw.kv_client()),
            prefix: format!("/bench-{tag}/raw/"),
        },
        grouped: Some(Baseline::Store(grouped)),
        dc: one.dc.clone(),
    };
    println!(
        "reserve-etcd: Acquire of fresh keys through homingd (1 DC, QUIC + mTLS, redb DC store \
         with group commit, 3-member etcd global store on loopback) vs etcd's own txn \
         put-if-absent (etcd-client, one txn per op: compare create_revision = 0, put) and vs \
         homing-store's batched EtcdGlobalStore::set_if_absent (concurrent calls share one txn)"
    );
    let rows = measure(&lanes, load).await?;
    one.daemon.shutdown().await;
    drop(cluster);
    report(&rows, "raw etcd txn put-if-absent", "etcd");
    plot(
        out,
        "reserve-etcd.svg",
        "reserve (etcd global store)",
        "raw etcd txn put-if-absent",
        &rows,
    )
}

/// The homing lane's etcd batching: the defaults, or for an A/B in
/// alternating runs, bounds from `HOMING_BENCH_ETCD_READ_BATCH` (`single`:
/// every nearest read a range request of its own; or `KEYS,IN_FLIGHT`) and
/// `HOMING_BENCH_ETCD_WRITE_BATCH` (`KEYS,IN_FLIGHT`).
#[cfg(feature = "etcd")]
fn etcd_batch_options() -> anyhow::Result<homing_store::etcd::EtcdGlobalOptions> {
    use homing_store::batch::BatchBounds;
    fn bounds(var: &str, value: &str) -> anyhow::Result<BatchBounds> {
        let parsed = value.split_once(',').and_then(|(keys, in_flight)| {
            Some(BatchBounds {
                keys_max: keys.trim().parse().ok()?,
                in_flight_max: in_flight.trim().parse().ok()?,
            })
        });
        match parsed {
            Some(bounds) => Ok(bounds.check()?),
            None => bail!("{var}={value}: expected KEYS,IN_FLIGHT (e.g. 64,4)"),
        }
    }
    let mut options = homing_store::etcd::EtcdGlobalOptions::default();
    if let Ok(value) = std::env::var("HOMING_BENCH_ETCD_READ_BATCH") {
        options.nearest_reads = match value.as_str() {
            "single" => None,
            _ => Some(bounds("HOMING_BENCH_ETCD_READ_BATCH", &value)?),
        };
    }
    if let Ok(value) = std::env::var("HOMING_BENCH_ETCD_WRITE_BATCH") {
        options.write_once = bounds("HOMING_BENCH_ETCD_WRITE_BATCH", &value)?;
    }
    if options != homing_store::etcd::EtcdGlobalOptions::default() {
        println!("homing lane's etcd batching (from the environment): {options:?}");
    }
    Ok(options)
}

/// Runs the three lanes at every concurrency of `load`, alternating them.
async fn measure(lanes: &Lanes, load: &Load) -> anyhow::Result<Vec<Row>> {
    let tag = run_tag();
    // Warm the connection (handshake) and the stores.
    let request = acquire_request(
        &key(format!("warm-{tag}"))?,
        homing_client::new_lease_key()?,
    )?;
    if !matches!(
        lanes.client.request(&lanes.peer, &request).await?,
        Reply::Acquire(AcquireReply::Acquired(_))
    ) {
        bail!("warm-up acquire was not Acquired");
    }
    let warm = ReservationId::new(lanes.dc.clone(), 1);
    lanes
        .raw
        .write_once(&key(format!("warm-raw-{tag}"))?, &warm)
        .await?;
    if let Some(grouped) = &lanes.grouped {
        grouped
            .write_once(&key(format!("warm-grouped-{tag}"))?, &warm)
            .await?;
    }
    println!(
        "each cell {} ms, median of {} (homing, the baselines and in-process alternate)\n",
        load.cell.as_millis(),
        load.repetitions
    );
    let mut rows = Vec::new();
    for &tasks in &load.tasks {
        let (mut homing, mut raw, mut local) = (Vec::new(), Vec::new(), Vec::new());
        let mut grouped = Vec::new();
        // What the homing lane's Acquires spent, summed over its cells (the
        // in-process lane reports into the same metrics between them).
        let mut spent: BTreeMap<&'static str, Timed> = BTreeMap::new();
        for rep in 0..load.repetitions {
            let before = snapshot(&lanes.node);
            homing.push(homing_cell(lanes, load, format!("r-{tag}-{tasks}-{rep}-"), tasks).await?);
            for ((op, b), (_, a)) in before.into_iter().zip(snapshot(&lanes.node)) {
                let total = spent.entry(op).or_default();
                total.seconds += a.seconds - b.seconds;
                total.count += a.count.saturating_sub(b.count);
            }
            let prefix = format!("raw-{tag}-{tasks}-{rep}-");
            raw.push(baseline_cell(&lanes.raw, &lanes.dc, load, prefix, tasks).await?);
            if let Some(baseline) = &lanes.grouped {
                let prefix = format!("grouped-{tag}-{tasks}-{rep}-");
                grouped.push(baseline_cell(baseline, &lanes.dc, load, prefix, tasks).await?);
            }
            local
                .push(local_cell(lanes, load, format!("local-{tag}-{tasks}-{rep}-"), tasks).await?);
        }
        let means_us = spent
            .iter()
            .filter_map(|(op, total)| Some((*op, total.mean_us()?)))
            .collect();
        let row = Row {
            tasks,
            homing: median_cell(&homing),
            raw: median_cell(&raw),
            grouped: (!grouped.is_empty()).then(|| median_cell(&grouped)),
            local: median_cell(&local),
            means_us,
        };
        println!(
            "   {tasks:>3} tasks: homing {:>8}/s, in-process handler {:>8}/s, raw {:>8}/s{}",
            thousands(row.homing.rate),
            thousands(row.local.rate),
            thousands(row.raw.rate),
            row.grouped
                .as_ref()
                .map(|g| format!(", grouped {:>8}/s", thousands(g.rate)))
                .unwrap_or_default()
        );
        rows.push(row);
    }
    Ok(rows)
}

/// The daemon's totals for a whole Acquire and for each store operation of one.
fn snapshot(node: &Node) -> Vec<(&'static str, Timed)> {
    let render = node.metrics().render();
    let requests = histogram_totals(&render, "homing_request_duration_seconds", "kind");
    let stores = histogram_totals(&render, "homing_store_duration_seconds", "op");
    let mut out = vec![(
        "acquire",
        requests.get("acquire").copied().unwrap_or_default(),
    )];
    out.extend(
        STORE_OPS
            .iter()
            .map(|op| (*op, stores.get(*op).copied().unwrap_or_default())),
    );
    out
}

async fn homing_cell(
    lanes: &Lanes,
    load: &Load,
    prefix: String,
    tasks: usize,
) -> anyhow::Result<Cell> {
    let (client, peer) = (lanes.client.clone(), lanes.peer.clone());
    run_cell(tasks, load.cell, move |n| {
        let (client, peer, name) = (client.clone(), peer.clone(), format!("{prefix}{n}"));
        async move {
            let request = acquire_request(&key(name)?, homing_client::new_lease_key()?)?;
            match client.request(&peer, &request).await? {
                Reply::Acquire(AcquireReply::Acquired(_)) => Ok(()),
                other => bail!("acquire answered {other:?}"),
            }
        }
    })
    .await
}

async fn baseline_cell(
    baseline: &Baseline,
    dc: &DcId,
    load: &Load,
    prefix: String,
    tasks: usize,
) -> anyhow::Result<Cell> {
    let baseline = baseline.clone();
    let id = ReservationId::new(dc.clone(), 1);
    run_cell(tasks, load.cell, move |n| {
        let (baseline, id, name) = (baseline.clone(), id.clone(), format!("{prefix}{n}"));
        async move { baseline.write_once(&key(name)?, &id).await }
    })
    .await
}

async fn local_cell(
    lanes: &Lanes,
    load: &Load,
    prefix: String,
    tasks: usize,
) -> anyhow::Result<Cell> {
    let (node, host) = (lanes.node.clone(), lanes.host.clone());
    run_cell(tasks, load.cell, move |n| {
        let (node, host, name) = (node.clone(), host.clone(), format!("{prefix}{n}"));
        async move {
            match node
                .handle(
                    &host,
                    acquire_request(&key(name)?, homing_client::new_lease_key()?)?,
                )
                .await
            {
                Reply::Acquire(AcquireReply::Acquired(_)) => Ok(()),
                other => bail!("in-process acquire answered {other:?}"),
            }
        }
    })
    .await
}

impl Row {
    /// The store's best write-once on its own: homing-store's grouped one
    /// where measured, else the raw one. What a reserve's two writes are
    /// weighed against when asking where its time goes.
    fn store_bar(&self) -> &Cell {
        self.grouped.as_ref().unwrap_or(&self.raw)
    }
}

/// Prints the tables, where the time goes, and where each lane flattens.
fn report(rows: &[Row], raw_name: &str, store: &str) {
    let ratio = |a: &Cell, b: &Cell| a.rate / b.rate.max(1e-9);
    let ms = |us: u64| us as f64 / 1000.0;
    println!();
    println!(
        "| tasks | homing reserves/s | p50 ms | p99 ms | {raw_name}/s | p50 ms | p99 ms | homing / raw |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|");
    for r in rows {
        println!(
            "| {} | {} | {:.2} | {:.2} | {} | {:.2} | {:.2} | {:.2} |",
            r.tasks,
            thousands(r.homing.rate),
            ms(r.homing.p50_us),
            ms(r.homing.p99_us),
            thousands(r.raw.rate),
            ms(r.raw.p50_us),
            ms(r.raw.p99_us),
            ratio(&r.homing, &r.raw)
        );
    }
    if rows.iter().any(|r| r.grouped.is_some()) {
        println!(
            "\nThe stricter bar: homing-store's grouped write-once alone (concurrent writes \
             share one transaction; redb: and one fsync). A reserve makes two such writes in \
             series (the DC record, then the global entry), so it stays below 0.5× of one even \
             if everything else were free:\n"
        );
        println!(
            "| tasks | grouped set_if_absent/s | p50 ms | p99 ms | homing / grouped | in-process / grouped |"
        );
        println!("|---:|---:|---:|---:|---:|---:|");
        for r in rows {
            if let Some(g) = &r.grouped {
                println!(
                    "| {} | {} | {:.2} | {:.2} | {:.2} | {:.2} |",
                    r.tasks,
                    thousands(g.rate),
                    ms(g.p50_us),
                    ms(g.p99_us),
                    ratio(&r.homing, g),
                    ratio(&r.local, g)
                );
            }
        }
    }
    println!(
        "\nThe same Acquire requests handed to the daemon's request handler in this process \
         (global get, allocate, DC record CAS, global set_if_absent; no QUIC, no TLS):\n"
    );
    println!(
        "| tasks | in-process acquires/s | p50 ms | p99 ms | in-process / raw | homing / in-process |"
    );
    println!("|---:|---:|---:|---:|---:|---:|");
    for r in rows {
        println!(
            "| {} | {} | {:.2} | {:.2} | {:.2} | {:.2} |",
            r.tasks,
            thousands(r.local.rate),
            ms(r.local.p50_us),
            ms(r.local.p99_us),
            ratio(&r.local, &r.raw),
            ratio(&r.homing, &r.local)
        );
    }
    let bar_name = if rows.iter().any(|r| r.grouped.is_some()) {
        "grouped write"
    } else {
        "raw write"
    };
    println!(
        "\nWhere a reserve's time goes (homing lane; mean ms per reserve: the client's wait, \
         the daemon's whole Acquire and each store operation in it, from the daemon's metrics; \
         one {bar_name} alone for comparison):\n"
    );
    println!(
        "| tasks | client wait | daemon Acquire | global get | allocate | DC CAS (+ event) | global write-once | rest of Acquire | serving (QUIC, codec, tasks) | {bar_name} |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    let mean_ms =
        |us: Option<&f64>| us.map_or("–".to_string(), |us| format!("{:.3}", us / 1000.0));
    for r in rows {
        let acquire = r.means_us.get("acquire").copied();
        let stores: f64 = STORE_OPS.iter().filter_map(|op| r.means_us.get(op)).sum();
        let rest = acquire.map(|a| a - stores);
        let serving = acquire.map(|a| r.homing.mean_us - a);
        println!(
            "| {} | {:.3} | {} | {} | {} | {} | {} | {} | {} | {:.3} |",
            r.tasks,
            r.homing.mean_us / 1000.0,
            mean_ms(acquire.as_ref()),
            mean_ms(r.means_us.get("global_get")),
            mean_ms(r.means_us.get("dc_allocate")),
            mean_ms(r.means_us.get("dc_cas")),
            mean_ms(r.means_us.get("global_set_if_absent")),
            mean_ms(rest.as_ref()),
            mean_ms(serving.as_ref()),
            r.store_bar().mean_us / 1000.0,
        );
    }
    println!(
        "\nCPU per operation (this whole process: load generator, daemon, stores; µs) — on 2 \
         shared cores, throughput follows it once the cores are busy:\n"
    );
    println!(
        "| tasks | homing reserve | in-process reserve | raw write | grouped write | cores busy (homing lane) |"
    );
    println!("|---:|---:|---:|---:|---:|---:|");
    for r in rows {
        println!(
            "| {} | {:.0} | {:.0} | {:.0} | {} | {:.2} |",
            r.tasks,
            r.homing.cpu_us_per_op,
            r.local.cpu_us_per_op,
            r.raw.cpu_us_per_op,
            r.grouped
                .as_ref()
                .map_or("–".to_string(), |g| format!("{:.0}", g.cpu_us_per_op)),
            r.homing.rate * r.homing.cpu_us_per_op / 1e6
        );
    }
    let failed: u64 = rows
        .iter()
        .map(|r| {
            r.homing.errors
                + r.raw.errors
                + r.local.errors
                + r.grouped.as_ref().map_or(0, |g| g.errors)
        })
        .sum();
    if failed > 0 {
        println!("\n{failed} operations failed (not counted in the rates)");
    }

    let tasks: Vec<usize> = rows.iter().map(|r| r.tasks).collect();
    let rates = |f: fn(&Row) -> f64| rows.iter().map(f).collect::<Vec<_>>();
    println!();
    println!(
        "homing flattens {}",
        flattening(&tasks, &rates(|r| r.homing.rate))
    );
    println!(
        "in-process handler flattens {}",
        flattening(&tasks, &rates(|r| r.local.rate))
    );
    println!(
        "{raw_name} flattens {}",
        flattening(&tasks, &rates(|r| r.raw.rate))
    );
    if rows.iter().all(|r| r.grouped.is_some()) {
        println!(
            "grouped write-once flattens {}",
            flattening(&tasks, &rates(|r| r.store_bar().rate))
        );
    }
    let verdict = |x: f64| if x >= 0.5 { "met" } else { "NOT met" };
    if let Some(r) = rows.iter().find(|r| r.tasks == 64) {
        let x = ratio(&r.homing, &r.raw);
        println!(
            "target homing / raw store op ≥ 0.5 at 64 tasks ({store}, {raw_name}): {x:.2} ({})",
            verdict(x)
        );
        if let Some(g) = &r.grouped {
            let x = ratio(&r.homing, g);
            println!(
                "stricter bar homing / grouped write-once ≥ 0.5 at 64 tasks: {x:.2} ({}; two \
                 writes in series cap it at 0.5)",
                verdict(x)
            );
        }
    }
    for r in rows.iter().rev().take(2).rev() {
        println!("limited by (a guess from the numbers): {}", limited_by(r));
    }
}

/// Plots throughput against concurrency for every lane.
fn plot(
    out: &Path,
    file: &str,
    title: &str,
    raw_label: &str,
    rows: &[Row],
) -> anyhow::Result<bool> {
    let labels: Vec<String> = rows.iter().map(|r| r.tasks.to_string()).collect();
    let svg = line_chart(
        &format!("{title}: first reservations per second vs concurrency"),
        "concurrent tasks",
        "operations / s",
        &labels,
        &[
            Series {
                label: "homing Acquire (homingd)".into(),
                values: rows.iter().map(|r| r.homing.rate).collect(),
                dashed: false,
            },
            Series {
                label: "in-process handler (no QUIC)".into(),
                values: rows.iter().map(|r| r.local.rate).collect(),
                dashed: true,
            },
            Series {
                label: raw_label.into(),
                values: rows.iter().map(|r| r.raw.rate).collect(),
                dashed: true,
            },
        ]
        .into_iter()
        .chain(rows.iter().all(|r| r.grouped.is_some()).then(|| Series {
            label: "homing-store grouped write-once".into(),
            values: rows.iter().map(|r| r.store_bar().rate).collect(),
            dashed: true,
        }))
        .collect::<Vec<_>>(),
    );
    let path = write_plot(out, file, &svg)?;
    println!("plot: {}", path.display());
    Ok(true)
}

/// Where a rate stops growing: the first step up in concurrency that gains
/// less than 20 %.
pub(super) fn flattening(tasks: &[usize], rates: &[f64]) -> String {
    for (i, pair) in rates.windows(2).enumerate() {
        if pair[1] < pair[0] * 1.2 {
            return format!(
                "at {} tasks ({} → {} /s going to {})",
                tasks[i],
                thousands(pair[0]),
                thousands(pair[1]),
                tasks[i + 1]
            );
        }
    }
    format!(
        "not within {} tasks",
        tasks.last().copied().unwrap_or_default()
    )
}

/// A one-line guess at the bottleneck from how homing, the in-process
/// handler and the store's best write-once alone compare in `row`.
fn limited_by(row: &Row) -> String {
    let tasks = row.tasks;
    let bar = row.store_bar();
    let vs_raw = row.homing.rate / bar.rate.max(1e-9);
    let vs_local = row.homing.rate / row.local.rate.max(1e-9);
    let local_vs_raw = row.local.rate / bar.rate.max(1e-9);
    if vs_local >= 0.8 {
        format!(
            "the stores: at {tasks} tasks homing reaches {vs_local:.2}× of the same store work \
             done in-process, which itself reaches {local_vs_raw:.2}× of one write-once alone \
             (a reserve is a global read, a DC record CAS and a global write-once, the writes \
             group-committed in series)"
        )
    } else if vs_local >= 0.6 && local_vs_raw < 0.5 {
        format!(
            "mostly the stores, then serving: at {tasks} tasks the store work of a reserve \
             done in-process reaches only {local_vs_raw:.2}× of one write-once alone, and serving it \
             over QUIC costs another {:.0} % (homing / in-process {vs_local:.2}×, homing / write-once \
             {vs_raw:.2}×)",
            (1.0 - vs_local) * 100.0
        )
    } else {
        format!(
            "serving, not the stores: at {tasks} tasks homing reaches {vs_local:.2}× of the \
             same store work done in-process ({local_vs_raw:.2}× of the write-once alone) — QUIC + TLS, \
             encode/decode and the daemon's tasks share 2 cores with the load generator \
             (homing / write-once {vs_raw:.2}×)"
        )
    }
}
