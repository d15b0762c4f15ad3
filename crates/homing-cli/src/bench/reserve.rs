//! `homing bench reserve`: first reservations of fresh keys per second through
//! one homingd (a 1-DC devnet: QUIC + mutual TLS, a redb DC store and a redb
//! global store, both with group commit) against the raw global store's
//! `set_if_absent` alone, at 1, 8, 64 and 256 concurrent tasks. A third
//! column hands the same requests to the daemon's request handler in this
//! process, without QUIC: it separates what the daemon's work (its stores
//! included) costs from what serving it over the network costs.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::bail;
use homing_core::{Identity, Reply, ReservationId, Role};
use homing_net::Handler;
use homing_store::{GlobalStore, RedbGlobalStore, RedbOptions};

use super::svg::{Series, line_chart};
use super::{
    Cell, OneDc, acquire_request, key, median_cell, run_cell, run_tag, thousands, write_plot,
};

const CONCURRENCY: [usize; 4] = [1, 8, 64, 256];
const CELL: Duration = Duration::from_secs(2);
const REPETITIONS: usize = 3;

/// Runs the suite; always `true` (the targets are reported, not enforced).
pub async fn run(out: &Path) -> anyhow::Result<bool> {
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
    // The daemon's own handler, called in this process: no QUIC, no TLS.
    let node = net.dcs()[0].daemon.node().clone();
    let host = Identity::new(Role::Host, Some(dc.clone()))?;
    let tag = run_tag();

    // Warm the connection (handshake) and the stores.
    {
        let request = acquire_request(&key(format!("warm-{tag}"))?)?;
        if !matches!(
            client.request(&peer, &request).await?,
            Reply::Acquired { .. }
        ) {
            bail!("warm-up acquire was not Acquired");
        }
    }

    println!(
        "reserve: Acquire of fresh keys through homingd (1 DC, QUIC + mTLS, redb DC + global \
         stores, group commit) vs raw RedbGlobalStore::set_if_absent (group commit)"
    );
    println!(
        "each cell {} ms, median of {REPETITIONS} (homing and raw alternate)\n",
        CELL.as_millis()
    );
    let mut rows: Vec<(usize, Cell, Cell)> = Vec::new();
    let mut locals: Vec<Cell> = Vec::new();
    for &tasks in &CONCURRENCY {
        let (mut homing, mut raw_cells, mut local_cells) = (Vec::new(), Vec::new(), Vec::new());
        for rep in 0..REPETITIONS {
            let (client, peer, prefix) = (
                client.clone(),
                peer.clone(),
                format!("r-{tag}-{tasks}-{rep}-"),
            );
            homing.push(
                run_cell(tasks, CELL, move |n| {
                    let (client, peer, name) =
                        (client.clone(), peer.clone(), format!("{prefix}{n}"));
                    async move {
                        let request = acquire_request(&key(name)?)?;
                        match client.request(&peer, &request).await? {
                            Reply::Acquired { .. } => Ok(()),
                            other => bail!("acquire answered {other:?}"),
                        }
                    }
                })
                .await?,
            );
            let (store, prefix) = (raw.clone(), format!("raw-{tag}-{tasks}-{rep}-"));
            let id = ReservationId::new(dc.clone(), 1);
            raw_cells.push(
                run_cell(tasks, CELL, move |n| {
                    let (store, id, name) = (store.clone(), id.clone(), format!("{prefix}{n}"));
                    async move {
                        store.set_if_absent(&key(name)?, &id).await?;
                        Ok(())
                    }
                })
                .await?,
            );
            let (node, host, prefix) = (
                node.clone(),
                host.clone(),
                format!("local-{tag}-{tasks}-{rep}-"),
            );
            local_cells.push(
                run_cell(tasks, CELL, move |n| {
                    let (node, host, name) = (node.clone(), host.clone(), format!("{prefix}{n}"));
                    async move {
                        match node.handle(&host, acquire_request(&key(name)?)?).await {
                            Reply::Acquired { .. } => Ok(()),
                            other => bail!("in-process acquire answered {other:?}"),
                        }
                    }
                })
                .await?,
            );
        }
        let (h, r, l) = (
            median_cell(&homing),
            median_cell(&raw_cells),
            median_cell(&local_cells),
        );
        println!(
            "   {tasks:>3} tasks: homing {:>8}/s, in-process handler {:>8}/s, raw {:>8}/s",
            thousands(h.rate),
            thousands(l.rate),
            thousands(r.rate)
        );
        rows.push((tasks, h, r));
        locals.push(l);
    }
    net.shutdown().await;

    println!();
    println!(
        "| tasks | homing reserves/s | p50 ms | p99 ms | raw set_if_absent/s | p50 ms | p99 ms | homing / raw |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|");
    for (tasks, h, r) in &rows {
        println!(
            "| {tasks} | {} | {:.2} | {:.2} | {} | {:.2} | {:.2} | {:.2} |",
            thousands(h.rate),
            h.p50_us as f64 / 1000.0,
            h.p99_us as f64 / 1000.0,
            thousands(r.rate),
            r.p50_us as f64 / 1000.0,
            r.p99_us as f64 / 1000.0,
            h.rate / r.rate.max(1e-9)
        );
    }
    println!(
        "\nThe same Acquire requests handed to the daemon's request handler in this process \
         (global get, allocate, DC record CAS, global set_if_absent; no QUIC, no TLS):\n"
    );
    println!("| tasks | in-process acquires/s | p50 ms | p99 ms | homing / in-process |");
    println!("|---:|---:|---:|---:|---:|");
    for ((tasks, h, _), l) in rows.iter().zip(&locals) {
        println!(
            "| {tasks} | {} | {:.2} | {:.2} | {:.2} |",
            thousands(l.rate),
            l.p50_us as f64 / 1000.0,
            l.p99_us as f64 / 1000.0,
            h.rate / l.rate.max(1e-9)
        );
    }
    let failed: u64 = rows
        .iter()
        .map(|(_, h, r)| h.errors + r.errors)
        .sum::<u64>()
        + locals.iter().map(|l| l.errors).sum::<u64>();
    if failed > 0 {
        println!("\n{failed} operations failed (not counted in the rates)");
    }

    let homing_rates: Vec<f64> = rows.iter().map(|(_, h, _)| h.rate).collect();
    let raw_rates: Vec<f64> = rows.iter().map(|(_, _, r)| r.rate).collect();
    let local_rates: Vec<f64> = locals.iter().map(|l| l.rate).collect();
    println!();
    println!("homing flattens {}", flattening(&homing_rates));
    println!("raw store flattens {}", flattening(&raw_rates));
    if let Some((_, h, r)) = rows.iter().find(|(t, _, _)| *t == 64) {
        let ratio = h.rate / r.rate.max(1e-9);
        println!(
            "target homing/raw ≥ 0.5 at 64 tasks: {:.2} ({})",
            ratio,
            if ratio >= 0.5 { "met" } else { "NOT met" }
        );
    }
    println!("in-process handler flattens {}", flattening(&local_rates));
    for at in [CONCURRENCY.len() - 2, CONCURRENCY.len() - 1] {
        println!(
            "limited by (a guess from the numbers): {}",
            limited_by(&rows[..=at], &locals[..=at])
        );
    }

    let labels: Vec<String> = CONCURRENCY.iter().map(|c| c.to_string()).collect();
    let svg = line_chart(
        "reserve: first reservations per second vs concurrency",
        "concurrent tasks",
        "operations / s",
        &labels,
        &[
            Series {
                label: "homing Acquire (homingd)".into(),
                values: homing_rates,
                dashed: false,
            },
            Series {
                label: "in-process handler (no QUIC)".into(),
                values: local_rates,
                dashed: true,
            },
            Series {
                label: "raw redb set_if_absent".into(),
                values: raw_rates,
                dashed: true,
            },
        ],
    );
    let path = write_plot(out, "reserve.svg", &svg)?;
    println!("plot: {}", path.display());
    Ok(true)
}

/// Where a rate stops growing: the first step up in concurrency that gains
/// less than 20 %.
fn flattening(rates: &[f64]) -> String {
    for (i, pair) in rates.windows(2).enumerate() {
        if pair[1] < pair[0] * 1.2 {
            return format!(
                "at {} tasks ({} → {} /s going to {})",
                CONCURRENCY[i],
                thousands(pair[0]),
                thousands(pair[1]),
                CONCURRENCY[i + 1]
            );
        }
    }
    format!("not within {} tasks", CONCURRENCY[CONCURRENCY.len() - 1])
}

/// A one-line guess at the bottleneck from how homing, the in-process
/// connect and the raw store compare at the last row given.
fn limited_by(rows: &[(usize, Cell, Cell)], locals: &[Cell]) -> String {
    let (Some((tasks, top_h, top_r)), Some(top_l)) = (rows.last(), locals.last()) else {
        return "nothing measured".into();
    };
    let vs_raw = top_h.rate / top_r.rate.max(1e-9);
    let vs_local = top_h.rate / top_l.rate.max(1e-9);
    let local_vs_raw = top_l.rate / top_r.rate.max(1e-9);
    if vs_local >= 0.8 {
        format!(
            "the stores: at {tasks} tasks homing reaches {vs_local:.2}× of the same store work \
             done in-process, which itself reaches {local_vs_raw:.2}× of one raw write \
             (a reserve is a DC record CAS and a global write-once, each group-committed)"
        )
    } else if vs_local >= 0.6 && local_vs_raw < 0.5 {
        format!(
            "mostly the stores, then serving: at {tasks} tasks the store work of a reserve \
             (DC record CAS + global write-once, in series) done in-process reaches only \
             {local_vs_raw:.2}× of one raw write, and serving it over QUIC costs another \
             {:.0} % (homing / in-process {vs_local:.2}×, homing / raw {vs_raw:.2}×)",
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
