//! `homing bench resolve-absent`: a storm of resolves of keys that do not
//! exist, straight at one homingd (64 tasks, 1,000 distinct absent keys,
//! each asked over and over), with homingd's absent cache off
//! (`absent_ttl_ms = 0`: every resolve reads the global store, the baseline)
//! and at its default, side by side in one run: resolves/s, latency and
//! global reads per resolve (DESIGN.md §7.4: absent keys are cheap).

use std::sync::Arc;

use homing_core::{DcId, Reply, Request, Role};
use homing_daemon::config::ABSENT_TTL_MS_DEFAULT;
use homing_daemon::{Devnet, DevnetOptions, Settings};

use super::{Cell, Load, key, median_cell, run_cell, run_tag, thousands};

/// Distinct absent keys the storm cycles through.
const ABSENT_KEYS: u64 = 1_000;
/// Concurrent resolving tasks.
const TASKS: usize = 64;

/// Runs the suite; `false` if a resolve answered anything but "absent".
pub async fn run(load: &Load) -> anyhow::Result<bool> {
    println!(
        "resolve-absent: one homingd (redb global store), {TASKS} tasks resolving \
         {ABSENT_KEYS} distinct absent keys round-robin, {} ms per cell, median of {}\n",
        load.cell.as_millis(),
        load.repetitions
    );
    println!("| absent_ttl_ms | resolves/s | p50 µs | p99 µs | global reads | reads per resolve |");
    println!("|---:|---:|---:|---:|---:|---:|");
    let mut ok = true;
    for ttl in [0, ABSENT_TTL_MS_DEFAULT] {
        let (cell, reads, resolves) = storm(ttl, load).await?;
        ok &= cell.errors == 0;
        println!(
            "| {ttl} | {} | {} | {} | {} | {:.4} |",
            thousands(cell.rate),
            cell.p50_us,
            cell.p99_us,
            thousands(reads as f64),
            reads as f64 / resolves.max(1) as f64
        );
    }
    Ok(ok)
}

/// The storm against a fresh devnet DC with `absent_ttl_ms = ttl`: the
/// median cell, and the DC's global reads and resolves over all cells.
async fn storm(ttl: u64, load: &Load) -> anyhow::Result<(Cell, u64, u64)> {
    let dc = DcId::new("dc0")?;
    let net = Devnet::start(DevnetOptions {
        dcs: vec![dc.clone()],
        latency_ms: 0,
        data_dir: None,
        overrides: Settings {
            absent_ttl_ms: Some(ttl),
            ..Settings::default()
        },
    })
    .await?;
    let router = net.client(Role::Router, None)?;
    let peer = net.peer(&dc);
    let tag = run_tag();
    let keys: Arc<Vec<_>> = Arc::new(
        (0..ABSENT_KEYS)
            .map(|i| key(format!("absent-{tag}-{i}")))
            .collect::<Result<_, _>>()?,
    );
    let metrics = net.dcs()[0].daemon.node().metrics().clone();
    let reads_before = metrics.global_reads();
    let mut cells = Vec::new();
    for _ in 0..load.repetitions {
        let (router, peer, keys) = (router.clone(), peer.clone(), keys.clone());
        let cell = run_cell(TASKS, load.cell, move |n| {
            let (router, peer) = (router.clone(), peer.clone());
            let key = keys[(n % ABSENT_KEYS) as usize].clone();
            async move {
                match router.request(&peer, &Request::Resolve { key }).await? {
                    Reply::Resolved { entry: None, .. } => Ok(()),
                    other => anyhow::bail!("an absent key resolved to {other:?}"),
                }
            }
        })
        .await?;
        cells.push(cell);
    }
    let reads = metrics.global_reads() - reads_before;
    let resolves = metrics.requests_total("resolve", "not_found");
    net.shutdown().await;
    Ok((median_cell(&cells), reads, resolves))
}
