//! `homing bench resolve-cold`: a router with nothing cached resolves keys
//! whose chains have 0–3 links, across 4 DCs 20 ms apart (relays adding
//! 10 ms each way), against DESIGN.md §4's cost model: one global read at the
//! nearest DC (the attached one: ~0 ms) plus one round trip per remote hop.
//!
//! A chain of `k` links is built by acquiring the key in dc0, releasing it,
//! acquiring it in dc1 (which links dc0's reservation to its own), … up to
//! dc`k`, where the actor stays live. The router is attached to dc`k`, so the
//! walk asks dc`k` (global read), dc0 (the entry, whose answer carries the
//! shortcut to the tail) and dc`k` again for the tail: at most `k` round
//! trips to other DCs, one once the shortcut is recorded.
//!
//! Then keys moved 16 and 1,000 times around dc0..dc2 (§7.2: keys live
//! forever and move freely), resolved by a router attached to dc3: the global
//! read there, the entry's DC, the tail's DC — 2 round trips to other DCs
//! however long the chain.
//!
//! Then throughput: N concurrent tasks (1, 8, 64, 256 by default) share one
//! router's `Resolver` and resolve keys it has never seen (so every walk is
//! cold), with chains of 0 links (all at the attached DC: one round trip on
//! loopback) and 1 link (one 20 ms round trip to another DC), next to
//! linear scaling from the lowest concurrency measured (what N tasks would
//! reach if each resolve kept its latency there): where the measured rate
//! leaves that line is where it flattens.

use homing_core::{AcquireReply, Grant};
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, bail};
use homing_client::{Resolver, ResolverConfig};
use homing_core::{DcId, Key, ReleaseReply, Reply, Request, ReservationId, Role, RunOutcome};
use homing_daemon::{Devnet, DevnetOptions, Settings};
use homing_net::{Client, Peer};

use super::svg::{Series, line_chart};
use super::{
    Cell, Load, acquire_request, key, median, median_cell, quantile, run_cell, run_tag, thousands,
    write_plot,
};

const DCS: usize = 4;
/// One-way latency each relay adds: 20 ms round trips between DCs.
const LATENCY_MS: u64 = 10;
const CHAIN_LINKS_MAX: usize = 3;
const REPETITIONS: usize = 3;
const SAMPLES: usize = 20;
/// Moves of the long chains: the default hop limit, and far past it.
const LONG_CHAIN_MOVES: [usize; 2] = [16, 1_000];
/// Long-chain keys built per length (plus one to warm up), each resolved by
/// [`SAMPLES`] fresh routers.
const LONG_CHAIN_KEYS: usize = 3;
/// Chains built at once.
const BUILD_CONCURRENCY: usize = 16;
const LEASE_TTL_MS: u64 = 600_000;
/// Requests timed to measure one round trip.
const PROBES: usize = 30;
/// Chain lengths whose throughput is measured against concurrency.
const SCALING_LINKS: [usize; 2] = [0, 1];
/// Cold keys built per chain length and per second of a throughput cell:
/// well above the fastest rate each length reaches here (about 24–38 k/s
/// with 0 links, 9 k/s with 1; linear scaling to 256 tasks would be 11 k/s),
/// so a cell does not run out.
const SCALING_KEYS_PER_SECOND: [usize; 2] = [40_000, 12_000];
/// Chains built at once for the throughput cells.
const SCALING_BUILD_CONCURRENCY: usize = 256;
/// How long a task whose cell ran out of keys waits before it tries again.
const EXHAUSTED_PAUSE: std::time::Duration = std::time::Duration::from_millis(50);

/// One chain length's results.
struct Row {
    links: usize,
    /// Round trips to DCs other than the attached one the model allows.
    expected_inter_dc: u32,
    samples: usize,
    p50_ms: f64,
    p99_ms: f64,
    counted: Vec<u32>,
    inter_dc: u32,
    model_ms: f64,
    /// The model with the measured cost of one round trip instead of the nominal one.
    calibrated_ms: f64,
}

/// Runs the suite; `false` if a resolve gave an unexpected answer.
pub async fn run(out: &Path, load: &Load) -> anyhow::Result<bool> {
    let ids = (0..DCS)
        .map(|i| DcId::new(format!("dc{i}")))
        .collect::<Result<Vec<_>, _>>()?;
    let net = Devnet::start(DevnetOptions {
        dcs: ids.clone(),
        latency_ms: LATENCY_MS,
        data_dir: None,
        overrides: Settings {
            lease_ttl_ms: Some(LEASE_TTL_MS),
            ..Settings::default()
        },
    })
    .await?;
    let mut hosts = Vec::new();
    for dc in &ids {
        hosts.push((net.client(Role::Host, Some(dc))?, net.peer(dc)));
    }
    let hosts = Arc::new(hosts);
    let router = net.client(Role::Router, None)?;
    let admin = net.client(Role::Admin, None)?;
    let tag = run_tag();
    let rtt_ms = 2 * LATENCY_MS;

    println!(
        "resolve-cold: {DCS} DCs (homingd, QUIC + mTLS, redb), {rtt_ms} ms RTT between DCs and \
         from the router to every DC but its own; a new Resolver per resolve (nothing cached), \
         connections warmed first; {REPETITIONS} × {SAMPLES} keys per chain length\n"
    );
    // What one round trip costs here: a bare request through a relay (what
    // the model calls 20 ms) and one to the attached DC directly (≈ 0).
    let table = net.router_table(&ids[DCS - 1]);
    let via_relay = Peer {
        dc: table[1].0.clone(),
        addr: table[1].1,
    };
    let direct = net.peer(&ids[DCS - 1]);
    let probe_key = key(format!("probe-{tag}"))?;
    let relay_rtt_ms = round_trip_ms(&router, &via_relay, &probe_key).await?;
    let direct_rtt_ms = round_trip_ms(&router, &direct, &probe_key).await?;
    println!(
        "   one request/reply through a relay: {relay_rtt_ms:.2} ms (nominal {rtt_ms}); \
         to the attached DC directly: {direct_rtt_ms:.2} ms"
    );

    let mut rows = Vec::new();
    let mut ok = true;
    let latency_chain_lengths = if load.throughput_only {
        0
    } else {
        CHAIN_LINKS_MAX + 1
    };
    for links in 0..latency_chain_lengths {
        let names: Vec<String> = (0..=REPETITIONS * SAMPLES)
            .map(|i| format!("cold-{tag}-{links}-{i}"))
            .collect();
        let started = Instant::now();
        let keys = build_chains(&hosts, &ids, links, names, BUILD_CONCURRENCY).await?;
        println!(
            "   built {} chains of {links} link(s) in {:.1} s",
            keys.len(),
            started.elapsed().as_secs_f64()
        );
        let attached = &ids[links];
        let config = ResolverConfig::new(net.router_table(attached));
        let (warm, keys) = keys.split_first().context("no keys built")?;
        // Round trips the walk makes to the attached DC (no relay): the
        // global read, and the tail's state unless the global read carried it.
        let local = if links == 0 { 1 } else { 2 };
        let timing = Timing {
            rtt_ms: rtt_ms as f64,
            relay_rtt_ms,
            direct_rtt_ms,
            local,
        };
        let cold = ColdSet {
            keys: keys.to_vec(),
            tail_dc: attached,
            links,
            expected_inter_dc: links as u32,
        };
        rows.push(latency_row(&router, &config, warm, cold, &timing, &mut ok).await?);
    }
    // Keys moved far past the hop limit, over dc0..dc2 from dc0, with the
    // router attached to dc3: the global read there, then the entry's DC
    // (its answer carries the shortcut) and the tail's DC, 2 inter-DC round
    // trips however long the chain (DESIGN.md §7.2).
    for moves in if load.throughput_only {
        vec![]
    } else {
        LONG_CHAIN_MOVES.to_vec()
    } {
        let started = Instant::now();
        let chain_dcs = &ids[..DCS - 1];
        let names = (0..=LONG_CHAIN_KEYS)
            .map(|i| format!("long-{tag}-{moves}-{i}"))
            .collect();
        let keys = build_cycling_chains(&hosts[..DCS - 1], chain_dcs, moves, names, &admin).await?;
        println!(
            "   built {} chains of {moves} moves in {:.1} s",
            keys.len(),
            started.elapsed().as_secs_f64()
        );
        let attached = &ids[DCS - 1];
        let config = ResolverConfig::new(net.router_table(attached));
        let (warm, keys) = keys.split_first().context("no keys built")?;
        // Each key resolved by SAMPLES fresh routers.
        let keys = keys
            .iter()
            .flat_map(|k| std::iter::repeat_n(k.clone(), SAMPLES))
            .collect();
        let timing = Timing {
            rtt_ms: rtt_ms as f64,
            relay_rtt_ms,
            direct_rtt_ms,
            local: 1,
        };
        let cold = ColdSet {
            keys,
            tail_dc: &chain_dcs[moves % chain_dcs.len()],
            links: moves,
            expected_inter_dc: 2,
        };
        rows.push(latency_row(&router, &config, warm, cold, &timing, &mut ok).await?);
    }
    let mut scaling = Vec::new();
    for (links, per_second) in SCALING_LINKS.into_iter().zip(SCALING_KEYS_PER_SECOND) {
        let count = (per_second as f64 * load.cell.as_secs_f64()).ceil() as usize;
        let names = (0..count)
            .map(|i| format!("scale-{tag}-{links}-{i}"))
            .collect();
        let started = Instant::now();
        let keys =
            Arc::new(build_chains(&hosts, &ids, links, names, SCALING_BUILD_CONCURRENCY).await?);
        println!(
            "   built {count} chains of {links} link(s) for the throughput cells in {:.1} s",
            started.elapsed().as_secs_f64()
        );
        let config = ResolverConfig::new(net.router_table(&ids[links]));
        let mut cells = Vec::new();
        for &tasks in &load.tasks {
            let mut reps = Vec::new();
            for _ in 0..load.repetitions {
                reps.push(throughput_cell(&router, &config, &keys, links, tasks, load).await?);
            }
            let cell = median_cell(&reps);
            println!(
                "   {links} link(s), {tasks:>3} tasks: {:>8} cold resolves/s",
                thousands(cell.rate)
            );
            cells.push((tasks, cell));
        }
        scaling.push((links, cells));
    }
    net.shutdown().await;
    if load.throughput_only {
        report_scaling(&scaling, load);
        plot_scaling(out, &scaling, load)?;
        return Ok(ok);
    }

    println!(
        "\n| chain links | samples | measured p50 ms | p99 ms | round trips counted (to other DCs) | model ms | measured / model | within 10 % + 1 ms | calibrated model ms | measured / calibrated |"
    );
    println!("|---:|---:|---:|---:|---|---:|---:|---|---:|---:|");
    for r in &rows {
        let counted: Vec<String> = r.counted.iter().map(u32::to_string).collect();
        let within = (r.p50_ms - r.model_ms).abs() <= 0.1 * r.model_ms + 1.0;
        let ratio = if r.model_ms > 0.0 {
            format!("{:.3}", r.p50_ms / r.model_ms)
        } else {
            "–".to_string()
        };
        println!(
            "| {} | {} | {:.2} | {:.2} | {} ({}) | {:.0} | {ratio} | {} | {:.2} | {:.3} |",
            r.links,
            r.samples,
            r.p50_ms,
            r.p99_ms,
            counted.join("/"),
            r.inter_dc,
            r.model_ms,
            if within { "yes" } else { "no" },
            r.calibrated_ms,
            r.p50_ms / r.calibrated_ms.max(1e-9)
        );
        if r.inter_dc > r.expected_inter_dc {
            println!(
                "   ✗ {} link(s): expected at most {} round trips to other DCs",
                r.links, r.expected_inter_dc
            );
            ok = false;
        }
    }
    println!(
        "\nmodel: (round trips to DCs other than the attached one) × {rtt_ms} ms; the \
         resolver's count also includes the global read and the tail read at the attached DC \
         (loopback, no relay); calibrated: the same counts × the measured round trips \
         above ({relay_rtt_ms:.2} ms through a relay, {direct_rtt_ms:.2} ms direct)"
    );

    let calibrated_within = rows
        .iter()
        .all(|r| (r.p50_ms - r.calibrated_ms).abs() <= 0.1 * r.calibrated_ms + 1.0);
    println!(
        "every chain length within 10 % + 1 ms of the calibrated model: {}",
        if calibrated_within { "yes" } else { "no" }
    );

    report_scaling(&scaling, load);
    plot_scaling(out, &scaling, load)?;

    let labels: Vec<String> = rows.iter().map(|r| r.links.to_string()).collect();
    let svg = line_chart(
        "resolve, cold: latency vs chain length (20 ms RTT between DCs)",
        "links in the chain",
        "milliseconds",
        &labels,
        &[
            Series {
                label: "measured p50".into(),
                values: rows.iter().map(|r| r.p50_ms).collect(),
                dashed: false,
            },
            Series {
                label: "measured p99".into(),
                values: rows.iter().map(|r| r.p99_ms).collect(),
                dashed: false,
            },
            Series {
                label: "cost model (20 ms per remote hop)".into(),
                values: rows.iter().map(|r| r.model_ms).collect(),
                dashed: true,
            },
            Series {
                label: "model × measured RTT".into(),
                values: rows.iter().map(|r| r.calibrated_ms).collect(),
                dashed: true,
            },
        ],
    );
    let path = write_plot(out, "resolve-cold.svg", &svg)?;
    println!("plot: {}", path.display());
    Ok(ok)
}

/// One throughput cell: `tasks` tasks share one new [`Resolver`] (a
/// router's) and each resolve asks for a key it has not seen, so every
/// resolve walks cold; past the end of `keys` a task stops (counted as a
/// failure) rather than resolving from cache.
async fn throughput_cell(
    router: &Client,
    config: &ResolverConfig,
    keys: &Arc<Vec<Key>>,
    links: usize,
    tasks: usize,
    load: &Load,
) -> anyhow::Result<Cell> {
    let resolver = Resolver::new(router.clone(), config.clone());
    let keys = keys.clone();
    run_cell(tasks, load.cell, move |n| {
        let (resolver, keys) = (resolver.clone(), keys.clone());
        async move {
            let Some(k) = keys.get(n as usize) else {
                // Do not spin: the cell is over for this task.
                tokio::time::sleep(EXHAUSTED_PAUSE).await;
                bail!(
                    "all {} keys resolved: the cell ran out of cold keys",
                    keys.len()
                );
            };
            let r = resolver.resolve(k).await?;
            if r.hops as usize != links || r.from_cache {
                bail!("unexpected resolution of {k}: {r:?}");
            }
            Ok(())
        }
    })
    .await
}

/// Chain length, and (tasks, cell) per concurrency, lowest first.
type Scaling = Vec<(usize, Vec<(usize, Cell)>)>;

/// The rate at `tasks` if it grew linearly from the lowest concurrency measured.
fn linear(cells: &[(usize, Cell)], tasks: usize) -> f64 {
    cells
        .first()
        .map_or(0.0, |(t0, c0)| c0.rate * tasks as f64 / (*t0).max(1) as f64)
}

fn report_scaling(scaling: &Scaling, load: &Load) {
    println!(
        "\nThroughput: cold resolves per second by N concurrent tasks sharing one new Resolver \
         per cell, each resolve a key it has not seen, \
         each cell {} ms, median of {}; linear = the lowest concurrency's rate × N ÷ its N; \
         cores busy = rate × CPU per resolve (this whole process: router, daemons, relays)\n",
        load.cell.as_millis(),
        load.repetitions
    );
    println!(
        "| chain links | tasks | resolves/s | p50 ms | p99 ms | linear /s | measured / linear | CPU µs per resolve | cores busy |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for (links, cells) in scaling {
        for (tasks, c) in cells {
            let bound = linear(cells, *tasks);
            println!(
                "| {links} | {tasks} | {} | {:.2} | {:.2} | {} | {:.2} | {:.0} | {:.2} |",
                thousands(c.rate),
                c.p50_us as f64 / 1000.0,
                c.p99_us as f64 / 1000.0,
                thousands(bound),
                c.rate / bound,
                c.cpu_us_per_op,
                c.rate * c.cpu_us_per_op / 1e6
            );
        }
    }
    for (links, cells) in scaling {
        let tasks: Vec<usize> = cells.iter().map(|(t, _)| *t).collect();
        let rates: Vec<f64> = cells.iter().map(|(_, c)| c.rate).collect();
        println!(
            "{links} link(s): flattens {}",
            super::reserve::flattening(&tasks, &rates)
        );
        let failed: u64 = cells.iter().map(|(_, c)| c.errors).sum();
        if failed > 0 {
            println!("   {failed} resolves failed (not counted)");
        }
    }
}

fn plot_scaling(out: &Path, scaling: &Scaling, load: &Load) -> anyhow::Result<()> {
    let labels: Vec<String> = load.tasks.iter().map(usize::to_string).collect();
    let mut series = Vec::new();
    for (links, cells) in scaling {
        series.push(Series {
            label: format!("{links} link(s): measured"),
            values: cells.iter().map(|(_, c)| c.rate).collect(),
            dashed: false,
        });
        // The 0-link line (×256 of ~12 k/s) is off any useful scale: table only.
        if *links == 0 {
            continue;
        }
        series.push(Series {
            label: format!("{links} link(s): linear scaling"),
            values: cells.iter().map(|(t, _)| linear(cells, *t)).collect(),
            dashed: true,
        });
    }
    let svg = line_chart(
        "resolve, cold: resolves per second vs concurrency",
        "concurrent tasks",
        "resolves / s",
        &labels,
        &series,
    );
    let path = write_plot(out, "resolve-cold-scaling.svg", &svg)?;
    println!("plot: {}", path.display());
    Ok(())
}

/// What a round trip costs here, and how many the walk makes to the
/// attached DC (no relay).
struct Timing {
    rtt_ms: f64,
    relay_rtt_ms: f64,
    direct_rtt_ms: f64,
    local: u32,
}

/// Keys to resolve cold, each by a fresh router, whose tails are in `tail_dc`.
struct ColdSet<'a> {
    keys: Vec<Key>,
    tail_dc: &'a DcId,
    links: usize,
    expected_inter_dc: u32,
}

/// Resolves every key of `cold` with a new `Resolver` (nothing cached),
/// after one warm-up resolve of `warm` (handshakes to every DC of the walk
/// happen there), in repetitions of [`SAMPLES`].
async fn latency_row(
    router: &Client,
    config: &ResolverConfig,
    warm: &Key,
    cold: ColdSet<'_>,
    timing: &Timing,
    ok: &mut bool,
) -> anyhow::Result<Row> {
    Resolver::new(router.clone(), config.clone())
        .resolve(warm)
        .await
        .context("warm-up resolve")?;
    let (mut p50s, mut p99s, mut counted) = (Vec::new(), Vec::new(), Vec::new());
    for rep in cold.keys.chunks(SAMPLES) {
        let mut us = Vec::with_capacity(rep.len());
        for k in rep {
            let resolver = Resolver::new(router.clone(), config.clone());
            let t = Instant::now();
            let r = resolver.resolve(k).await?;
            us.push(t.elapsed().as_micros() as u64);
            if r.dc != *cold.tail_dc || r.from_cache {
                println!("   ✗ unexpected resolution of {k}: {r:?}");
                *ok = false;
            }
            if !counted.contains(&r.remote_round_trips) {
                counted.push(r.remote_round_trips);
            }
        }
        us.sort_unstable();
        p50s.push(quantile(&us, 0.5) as f64 / 1000.0);
        p99s.push(quantile(&us, 0.99) as f64 / 1000.0);
    }
    let inter_dc = counted
        .iter()
        .max()
        .copied()
        .unwrap_or(0)
        .saturating_sub(timing.local);
    Ok(Row {
        links: cold.links,
        expected_inter_dc: cold.expected_inter_dc,
        samples: cold.keys.len(),
        p50_ms: median(p50s),
        p99_ms: median(p99s),
        counted,
        inter_dc,
        model_ms: f64::from(inter_dc) * timing.rtt_ms,
        calibrated_ms: f64::from(inter_dc) * timing.relay_rtt_ms
            + f64::from(timing.local) * timing.direct_rtt_ms,
    })
}

/// Median wall time of a warm request/reply to `peer` (a resolve of a key
/// never reserved: the DC reads the global store and answers), in ms.
async fn round_trip_ms(client: &Client, peer: &Peer, key: &Key) -> anyhow::Result<f64> {
    let request = Request::Resolve { key: key.clone() };
    client.request(peer, &request).await?;
    let mut us = Vec::new();
    for _ in 0..PROBES {
        let t = Instant::now();
        client.request(peer, &request).await?;
        us.push(t.elapsed().as_micros() as u64);
    }
    us.sort_unstable();
    Ok(quantile(&us, 0.5) as f64 / 1000.0)
}

/// Builds, for each name (all at once), a key moved `moves` times around
/// `dcs` (acquired in `dcs[0]`, released, acquired in `dcs[1]`, …), left
/// live where the last move took it, once `dcs[0]` recorded that as the
/// key's shortcut (`admin` asks).
async fn build_cycling_chains(
    hosts: &[(Client, Peer)],
    dcs: &[DcId],
    moves: usize,
    names: Vec<String>,
    admin: &Client,
) -> anyhow::Result<Vec<Key>> {
    let handles: Vec<_> = names
        .into_iter()
        .map(|name| {
            let (hosts, dcs) = (hosts.to_vec(), dcs.to_vec());
            tokio::spawn(async move {
                let order: Vec<_> = hosts.iter().cloned().cycle().take(moves + 1).collect();
                let ids: Vec<_> = dcs.iter().cloned().cycle().take(moves + 1).collect();
                move_key_to_tail(&order, &ids, name).await
            })
        })
        .collect();
    let mut keys = Vec::new();
    for h in handles {
        let (key, tail) = h.await??;
        shortcut_recorded(admin, &hosts[0].1, &key, &tail).await?;
        keys.push(key);
    }
    Ok(keys)
}

/// Builds a chain of `links` links for each name, `concurrency` at a time.
async fn build_chains(
    hosts: &Arc<Vec<(Client, Peer)>>,
    ids: &[DcId],
    links: usize,
    names: Vec<String>,
    concurrency: usize,
) -> anyhow::Result<Vec<Key>> {
    let mut keys = Vec::with_capacity(names.len());
    for batch in names.chunks(concurrency) {
        let handles: Vec<_> = batch
            .iter()
            .map(|name| {
                let (hosts, name, ids) = (hosts.clone(), name.clone(), ids.to_vec());
                tokio::spawn(async move { build_chain(&hosts, &ids, links, name).await })
            })
            .collect();
        for h in handles {
            keys.push(h.await??);
        }
    }
    Ok(keys)
}

/// Acquires a fresh key in dc0, releases it, acquires it in dc1, … and leaves
/// it live in dc`links`.
async fn build_chain(
    hosts: &[(Client, Peer)],
    ids: &[DcId],
    links: usize,
    name: String,
) -> anyhow::Result<Key> {
    move_key(&hosts[..=links], &ids[..=links], name).await
}

/// Acquires a fresh key at each of `hosts` in turn (each at its DC,
/// `ids`), releasing it before the next: the last one keeps it.
async fn move_key(hosts: &[(Client, Peer)], ids: &[DcId], name: String) -> anyhow::Result<Key> {
    Ok(move_key_to_tail(hosts, ids, name).await?.0)
}

/// [`move_key`], also answering the tail it left live.
async fn move_key_to_tail(
    hosts: &[(Client, Peer)],
    ids: &[DcId],
    name: String,
) -> anyhow::Result<(Key, ReservationId)> {
    let key = key(name)?;
    let links = hosts.len() - 1;
    for (i, (client, peer)) in hosts.iter().enumerate() {
        let lease = homing_client::new_lease_key()?;
        let reply = client.request(peer, &acquire_request(&key, lease)?).await?;
        let Reply::Acquire(AcquireReply::Acquired(Grant {
            reservation, token, ..
        })) = reply
        else {
            bail!("acquire of {key} in {} answered {reply:?}", ids[i]);
        };
        if i == links {
            return Ok((key, reservation));
        }
        let release = Request::Release {
            reservation,
            token,
            lease,
            outcome: RunOutcome::Ok,
        };
        match client.request(peer, &release).await? {
            Reply::Release(ReleaseReply::Released) => {}
            other => bail!("release of {key} in {} answered {other:?}", ids[i]),
        }
    }
    bail!("no host to move {key} to")
}

/// Waits until `entry_dc` (the DC of `key`'s first reservation) has recorded
/// `tail` as the chain's shortcut: the last move's notice travels in the
/// background, and a resolve before it lands follows one more link.
async fn shortcut_recorded(
    admin: &Client,
    entry_dc: &Peer,
    key: &Key,
    tail: &ReservationId,
) -> anyhow::Result<()> {
    let inspect = Request::Inspect { key: key.clone() };
    let deadline = Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let Reply::Inspected { records } = admin.request(entry_dc, &inspect).await? else {
            bail!("inspect of {key} at {} failed", entry_dc.dc);
        };
        let entry = records.iter().find(|r| r.predecessor.is_none());
        if entry.and_then(|r| r.shortcut.as_ref()).map(|s| &s.to) == Some(tail) {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!(
                "{} never recorded the shortcut of {key} to {tail}",
                entry_dc.dc
            );
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}
