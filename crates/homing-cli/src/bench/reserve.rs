//! `homing bench reserve`: first reservations of fresh keys per second through
//! one homingd (a 1-DC devnet: QUIC + mutual TLS, a redb DC store and a redb
//! global store, both with group commit) against the raw global store's
//! `set_if_absent` alone, at 1, 8, 64 and 256 concurrent tasks. A third
//! column hands the same requests to the daemon's request handler in this
//! process, without QUIC: it separates what the daemon's work (its stores
//! included) costs from what serving it over the network costs. The
//! daemon's own store timings (its metrics) say where a reserve's time goes.
//!
//! `homing bench reserve-etcd` (cargo feature `etcd`) runs the same lanes
//! with a 3-member etcd cluster as the global store, against etcd's own
//! transactional put-if-absent.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use anyhow::bail;
use homing_core::{DcId, Identity, Reply, ReservationId, Role};
use homing_daemon::Node;
use homing_net::{Client, Handler, Peer};
use homing_store::{GlobalStore, RedbGlobalStore, RedbOptions};

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
    /// The baseline: the global store's write-once on its own.
    raw: Arc<dyn GlobalStore>,
    dc: DcId,
}

/// One concurrency's results.
struct Row {
    tasks: usize,
    homing: Cell,
    raw: Cell,
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
    let raw: Arc<dyn GlobalStore> = Arc::new(RedbGlobalStore::open(
        raw_dir.path().join("global.redb"),
        RedbOptions::default(),
    )?);
    let lanes = Lanes {
        client,
        peer,
        node: net.dcs()[0].daemon.node().clone(),
        host: Identity::new(Role::Host, Some(dc.clone()))?,
        raw,
        dc,
    };
    println!(
        "reserve: Acquire of fresh keys through homingd (1 DC, QUIC + mTLS, redb DC + global \
         stores, group commit) vs raw RedbGlobalStore::set_if_absent (group commit)"
    );
    let rows = measure(&lanes, load).await?;
    net.shutdown().await;
    report(&rows, "raw set_if_absent", "redb");
    plot(
        out,
        "reserve.svg",
        "reserve",
        "raw redb set_if_absent",
        &rows,
    )
}

/// Runs the suite with a local 3-member etcd cluster as the global store.
#[cfg(feature = "etcd")]
pub async fn run_etcd(out: &Path, load: &Load) -> anyhow::Result<bool> {
    use homing_store::etcd::EtcdGlobalStore;
    use homing_store::etcd_cluster::LocalEtcdCluster;

    let cluster = LocalEtcdCluster::start().await?;
    let tag = run_tag();
    let global: Arc<dyn GlobalStore> = Arc::new(
        EtcdGlobalStore::connect(cluster.endpoints(), &format!("/bench-{tag}/homing")).await?,
    );
    let raw: Arc<dyn GlobalStore> = Arc::new(
        EtcdGlobalStore::connect(cluster.endpoints(), &format!("/bench-{tag}/raw")).await?,
    );
    let one = super::OwnGlobalDc::start(global).await?;
    let lanes = Lanes {
        client: one.client.clone(),
        peer: one.peer.clone(),
        node: one.daemon.node().clone(),
        host: Identity::new(Role::Host, Some(one.dc.clone()))?,
        raw,
        dc: one.dc.clone(),
    };
    println!(
        "reserve-etcd: Acquire of fresh keys through homingd (1 DC, QUIC + mTLS, redb DC store \
         with group commit, 3-member etcd global store on loopback) vs raw \
         EtcdGlobalStore::set_if_absent (one etcd txn per op: compare create_revision = 0, put)"
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

/// Runs the three lanes at every concurrency of `load`, alternating them.
async fn measure(lanes: &Lanes, load: &Load) -> anyhow::Result<Vec<Row>> {
    let tag = run_tag();
    // Warm the connection (handshake) and the stores.
    let request = acquire_request(&key(format!("warm-{tag}"))?)?;
    if !matches!(
        lanes.client.request(&lanes.peer, &request).await?,
        Reply::Acquired { .. }
    ) {
        bail!("warm-up acquire was not Acquired");
    }
    lanes
        .raw
        .set_if_absent(
            &key(format!("warm-raw-{tag}"))?,
            &ReservationId::new(lanes.dc.clone(), 1),
        )
        .await?;
    println!(
        "each cell {} ms, median of {} (homing, raw and in-process alternate)\n",
        load.cell.as_millis(),
        load.repetitions
    );
    let mut rows = Vec::new();
    for &tasks in &load.tasks {
        let (mut homing, mut raw, mut local) = (Vec::new(), Vec::new(), Vec::new());
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
            raw.push(raw_cell(lanes, load, format!("raw-{tag}-{tasks}-{rep}-"), tasks).await?);
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
            local: median_cell(&local),
            means_us,
        };
        println!(
            "   {tasks:>3} tasks: homing {:>8}/s, in-process handler {:>8}/s, raw {:>8}/s",
            thousands(row.homing.rate),
            thousands(row.local.rate),
            thousands(row.raw.rate)
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
            let request = acquire_request(&key(name)?)?;
            match client.request(&peer, &request).await? {
                Reply::Acquired { .. } => Ok(()),
                other => bail!("acquire answered {other:?}"),
            }
        }
    })
    .await
}

async fn raw_cell(
    lanes: &Lanes,
    load: &Load,
    prefix: String,
    tasks: usize,
) -> anyhow::Result<Cell> {
    let store = lanes.raw.clone();
    let id = ReservationId::new(lanes.dc.clone(), 1);
    run_cell(tasks, load.cell, move |n| {
        let (store, id, name) = (store.clone(), id.clone(), format!("{prefix}{n}"));
        async move {
            store.set_if_absent(&key(name)?, &id).await?;
            Ok(())
        }
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
            match node.handle(&host, acquire_request(&key(name)?)?).await {
                Reply::Acquired { .. } => Ok(()),
                other => bail!("in-process acquire answered {other:?}"),
            }
        }
    })
    .await
}

/// Prints the tables, where the time goes, and where each lane flattens.
fn report(rows: &[Row], raw_name: &str, store: &str) {
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
            r.homing.p50_us as f64 / 1000.0,
            r.homing.p99_us as f64 / 1000.0,
            thousands(r.raw.rate),
            r.raw.p50_us as f64 / 1000.0,
            r.raw.p99_us as f64 / 1000.0,
            r.homing.rate / r.raw.rate.max(1e-9)
        );
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
            r.local.p50_us as f64 / 1000.0,
            r.local.p99_us as f64 / 1000.0,
            r.local.rate / r.raw.rate.max(1e-9),
            r.homing.rate / r.local.rate.max(1e-9)
        );
    }
    println!(
        "\nWhere a reserve's time goes (homing lane; mean ms per reserve: the client's wait, \
         the daemon's whole Acquire and each store operation in it, from the daemon's metrics; \
         the raw write's mean for comparison):\n"
    );
    println!(
        "| tasks | client wait | daemon Acquire | global get | allocate | DC CAS (+ event) | global write-once | rest of Acquire | serving (QUIC, codec, tasks) | raw write |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    let ms = |us: Option<&f64>| us.map_or("–".to_string(), |us| format!("{:.3}", us / 1000.0));
    for r in rows {
        let acquire = r.means_us.get("acquire").copied();
        let stores: f64 = STORE_OPS.iter().filter_map(|op| r.means_us.get(op)).sum();
        let rest = acquire.map(|a| a - stores);
        let serving = acquire.map(|a| r.homing.mean_us - a);
        println!(
            "| {} | {:.3} | {} | {} | {} | {} | {} | {} | {} | {:.3} |",
            r.tasks,
            r.homing.mean_us / 1000.0,
            ms(acquire.as_ref()),
            ms(r.means_us.get("global_get")),
            ms(r.means_us.get("dc_allocate")),
            ms(r.means_us.get("dc_cas")),
            ms(r.means_us.get("global_set_if_absent")),
            ms(rest.as_ref()),
            ms(serving.as_ref()),
            r.raw.mean_us / 1000.0,
        );
    }
    println!(
        "\nCPU per operation (this whole process: load generator, daemon, stores; µs) — on 2 \
         shared cores, throughput follows it once the cores are busy:\n"
    );
    println!(
        "| tasks | homing reserve | in-process reserve | raw write | homing / raw | cores busy (homing lane) |"
    );
    println!("|---:|---:|---:|---:|---:|---:|");
    for r in rows {
        println!(
            "| {} | {:.0} | {:.0} | {:.0} | {:.2} | {:.2} |",
            r.tasks,
            r.homing.cpu_us_per_op,
            r.local.cpu_us_per_op,
            r.raw.cpu_us_per_op,
            r.homing.cpu_us_per_op / r.raw.cpu_us_per_op.max(1e-9),
            r.homing.rate * r.homing.cpu_us_per_op / 1e6
        );
    }
    let failed: u64 = rows
        .iter()
        .map(|r| r.homing.errors + r.raw.errors + r.local.errors)
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
        "raw {store} flattens {}",
        flattening(&tasks, &rates(|r| r.raw.rate))
    );
    if let Some(r) = rows.iter().find(|r| r.tasks == 64) {
        let ratio = r.homing.rate / r.raw.rate.max(1e-9);
        println!(
            "target homing/raw ≥ 0.5 at 64 tasks ({store} global store): {:.2} ({})",
            ratio,
            if ratio >= 0.5 { "met" } else { "NOT met" }
        );
    }
    for r in rows.iter().rev().take(2).rev() {
        println!("limited by (a guess from the numbers): {}", limited_by(r));
    }
}

/// Plots throughput against concurrency for the three lanes.
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
        ],
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
/// handler and the raw store compare in `row`.
fn limited_by(row: &Row) -> String {
    let tasks = row.tasks;
    let vs_raw = row.homing.rate / row.raw.rate.max(1e-9);
    let vs_local = row.homing.rate / row.local.rate.max(1e-9);
    let local_vs_raw = row.local.rate / row.raw.rate.max(1e-9);
    if vs_local >= 0.8 {
        format!(
            "the stores: at {tasks} tasks homing reaches {vs_local:.2}× of the same store work \
             done in-process, which itself reaches {local_vs_raw:.2}× of one raw write \
             (a reserve is a global read, a DC record CAS and a global write-once, the writes \
             group-committed in series)"
        )
    } else if vs_local >= 0.6 && local_vs_raw < 0.5 {
        format!(
            "mostly the stores, then serving: at {tasks} tasks the store work of a reserve \
             done in-process reaches only {local_vs_raw:.2}× of one raw write, and serving it \
             over QUIC costs another {:.0} % (homing / in-process {vs_local:.2}×, homing / raw \
             {vs_raw:.2}×)",
            (1.0 - vs_local) * 100.0
        )
    } else {
        format!(
            "serving, not the stores: at {tasks} tasks homing reaches {vs_local:.2}× of the \
             same store work done in-process ({local_vs_raw:.2}× of raw) — QUIC + TLS, \
             encode/decode and the daemon's tasks share 2 cores with the load generator \
             (homing / raw {vs_raw:.2}×)"
        )
    }
}
