//! `homing bench resolve-cold`: a router with nothing cached resolves keys
//! whose chains have 0–3 links, across 4 DCs 20 ms apart (relays adding
//! 10 ms each way), against DESIGN.md §4's cost model: one global read at the
//! nearest DC (the attached one: ~0 ms) plus one round trip per remote hop.
//!
//! A chain of `k` links is built by acquiring the key in dc0, releasing it,
//! acquiring it in dc1 (which links dc0's reservation to its own), … up to
//! dc`k`, where the actor stays live. The router is attached to dc`k`, so the
//! walk asks dc`k` (global read), dc0 … dc`k-1` (one remote round trip each)
//! and dc`k` again for the tail.

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, bail};
use homing_client::{Resolver, ResolverConfig};
use homing_core::{DcId, Key, ReleaseReply, Reply, Request, Role, RunOutcome};
use homing_daemon::{Devnet, DevnetOptions, Settings};
use homing_net::{Client, Peer};

use super::svg::{Series, line_chart};
use super::{acquire_request, key, median, quantile, run_tag, write_plot};

const DCS: usize = 4;
/// One-way latency each relay adds: 20 ms round trips between DCs.
const LATENCY_MS: u64 = 10;
const CHAIN_LINKS_MAX: usize = 3;
const REPETITIONS: usize = 3;
const SAMPLES: usize = 20;
/// Chains built at once.
const BUILD_CONCURRENCY: usize = 16;
const LEASE_TTL_MS: u64 = 600_000;
/// Requests timed to measure one round trip.
const PROBES: usize = 30;

/// One chain length's results.
struct Row {
    links: usize,
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
pub async fn run(out: &Path) -> anyhow::Result<bool> {
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
    for links in 0..=CHAIN_LINKS_MAX {
        let names: Vec<String> = (0..=REPETITIONS * SAMPLES)
            .map(|i| format!("cold-{tag}-{links}-{i}"))
            .collect();
        let started = Instant::now();
        let keys = build_chains(&hosts, &ids, links, names).await?;
        println!(
            "   built {} chains of {links} link(s) in {:.1} s",
            keys.len(),
            started.elapsed().as_secs_f64()
        );
        let attached = &ids[links];
        let config = ResolverConfig::new(net.router_table(attached));
        let (warm, keys) = keys.split_first().context("no keys built")?;
        // Handshakes to every DC of the walk happen here, not in the samples.
        Resolver::new(router.clone(), config.clone())
            .resolve(warm)
            .await
            .context("warm-up resolve")?;

        let (mut p50s, mut p99s, mut counted) = (Vec::new(), Vec::new(), Vec::new());
        for rep in keys.chunks(SAMPLES) {
            let mut us = Vec::with_capacity(rep.len());
            for k in rep {
                let resolver = Resolver::new(router.clone(), config.clone());
                let t = Instant::now();
                let r = resolver.resolve(k).await?;
                us.push(t.elapsed().as_micros() as u64);
                if r.hops as usize != links || r.dc != *attached || r.from_cache {
                    println!("   ✗ unexpected resolution of {k}: {r:?}");
                    ok = false;
                }
                if !counted.contains(&r.remote_round_trips) {
                    counted.push(r.remote_round_trips);
                }
            }
            us.sort_unstable();
            p50s.push(quantile(&us, 0.5) as f64 / 1000.0);
            p99s.push(quantile(&us, 0.99) as f64 / 1000.0);
        }
        // Round trips the walk makes to the attached DC (no relay): the
        // global read, and the tail's state unless the global read carried it.
        let local = if links == 0 { 1 } else { 2 };
        let inter_dc = counted
            .iter()
            .max()
            .copied()
            .unwrap_or(0)
            .saturating_sub(local);
        rows.push(Row {
            links,
            samples: keys.len(),
            p50_ms: median(p50s),
            p99_ms: median(p99s),
            counted,
            inter_dc,
            model_ms: f64::from(inter_dc) * rtt_ms as f64,
            calibrated_ms: f64::from(inter_dc) * relay_rtt_ms + f64::from(local) * direct_rtt_ms,
        });
    }
    net.shutdown().await;

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
        if r.inter_dc as usize != r.links {
            println!(
                "   ✗ {} link(s): expected {} round trips to other DCs",
                r.links, r.links
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

/// Builds a chain of `links` links for each name, [`BUILD_CONCURRENCY`] at a time.
async fn build_chains(
    hosts: &Arc<Vec<(Client, Peer)>>,
    ids: &[DcId],
    links: usize,
    names: Vec<String>,
) -> anyhow::Result<Vec<Key>> {
    let mut keys = Vec::with_capacity(names.len());
    for batch in names.chunks(BUILD_CONCURRENCY) {
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
    let key = key(name)?;
    for (i, (client, peer)) in hosts.iter().enumerate().take(links + 1) {
        let reply = client.request(peer, &acquire_request(&key)?).await?;
        let Reply::Acquired {
            reservation, token, ..
        } = reply
        else {
            bail!("acquire of {key} in {} answered {reply:?}", ids[i]);
        };
        if i == links {
            break;
        }
        let release = Request::Release {
            reservation,
            token,
            outcome: RunOutcome::Ok,
        };
        match client.request(peer, &release).await? {
            Reply::Release(ReleaseReply::Released) => {}
            other => bail!("release of {key} in {} answered {other:?}", ids[i]),
        }
    }
    Ok(key)
}
