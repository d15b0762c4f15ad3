//! `homing bench flood`: resolve latency before, during and after two
//! floods, all on loopback and bounded in time:
//!
//! - **forged QUIC Initials** at one homingd: random bytes shaped like QUIC
//!   v1 long-header Initial packets (1,200 bytes, a fresh random DCID each,
//!   so each looks like a new connection), paced to `--flood-rate`
//!   datagrams/s from [`FLOOD_SOCKETS`] UDP sockets on their own threads,
//!   for `--flood-ms`; meanwhile resolves go to homingd over one pooled
//!   connection ([`RESOLVE_TASKS`] tasks) and over a new connection each
//!   (one task: a handshake per resolve, what a forged flood can starve).
//! - **idle TCP connections** at the edge router: `--idle-connections`
//!   connections that never send a byte, each reopened as soon as the
//!   router closes it (one refused at accept waits [`REFUSED_BACKOFF_MS`]),
//!   while real requests go through the router on a new connection each.
//!   The idle connections outnumber the router's `connections_max` (10,000,
//!   or fewer where the fd limit lets this process hold both ends of fewer)
//!   by 5 %, and the measured requests start once the cap is full.
//!   Once with the router's default bounds and once with detection and
//!   idle timeouts off, side by side (both evict the oldest connection
//!   without a request at the cap: that policy has no switch).
//!
//! The flood and the measured clients run in this process, next to
//! homingd and the router: on a small machine they compete for the same
//! cores, which is part of what a flood does.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use homing_client::{Resolver, ResolverConfig};
use homing_core::{AcquireReply, KeyConfig, KeyName, Reply, Request, Role};
use homing_edge::{ActorHost, ActorHostConfig, EdgeConfig, EdgeRouter, ServeLimits};

use super::{Cell, Load, OneDc, acquire_request, key, run_cell, run_tag, thousands};

/// UDP sockets (one thread each) sending forged Initials.
pub const FLOOD_SOCKETS: usize = 2;
/// Size of a forged Initial: QUIC servers ignore client Initials shorter
/// than 1,200 bytes, so a flood that costs them work sends full ones.
const INITIAL_BYTES: usize = 1_200;
/// Datagrams sent between two pacing checks.
const PACING_BATCH: u64 = 64;
/// Tasks resolving over one pooled connection.
pub const RESOLVE_TASKS: usize = 8;
/// Tasks sending real requests through the router.
const REQUEST_TASKS: usize = 4;
/// Pause of an idle-connection attacker the router refused at accept, in milliseconds.
pub const REFUSED_BACKOFF_MS: u64 = 50;
/// A connection closed sooner than this after it opened was refused at accept, in milliseconds.
const REFUSED_WITHIN_MS: u64 = 20;
/// The idle connections outnumber `connections_max` by 1/this of them.
const IDLE_SURPLUS_DIVISOR: usize = 20;
/// File descriptors kept for everything but the idle connections.
const FD_RESERVE: u64 = 1_024;

/// What the flood suite runs.
#[derive(Debug, Clone, Copy)]
pub struct Flood {
    /// Forged Initials per second to aim for.
    pub rate: u64,
    /// Length of each flood, in milliseconds.
    pub flood: Duration,
    /// Idle TCP connections to hold at the router.
    pub idle_connections: usize,
}

/// Runs both floods; `false` if a measured operation failed outside a flood.
pub async fn run(load: &Load, flood: &Flood) -> anyhow::Result<bool> {
    let quic_ok = quic(load, flood).await?;
    println!();
    let tcp_ok = idle_tcp(load, flood).await?;
    Ok(quic_ok && tcp_ok)
}

/// One phase's cell, as the end of a table row.
fn row(phase: &str, cell: &Cell) -> String {
    format!(
        "| {phase} | {} | {} | {} | {} |",
        thousands(cell.rate),
        cell.p50_us,
        cell.p99_us,
        cell.errors
    )
}

async fn quic(load: &Load, flood: &Flood) -> anyhow::Result<bool> {
    let dc = OneDc::start().await?;
    let key = key(format!("flood-{}", run_tag()))?;
    match dc
        .client
        .request(
            &dc.peer,
            &acquire_request(&key, homing_client::new_lease_key()?)?,
        )
        .await?
    {
        Reply::Acquire(AcquireReply::Acquired(_)) => {}
        other => anyhow::bail!("reserving the flood key: {other:?}"),
    }
    let homingd = dc.peer.addr;
    println!(
        "flood (a): forged QUIC Initials ({INITIAL_BYTES} B, random DCIDs) at one homingd on {homingd}, \
         aiming at {} datagrams/s from {FLOOD_SOCKETS} sockets for {} ms; resolves over one pooled \
         connection ({RESOLVE_TASKS} tasks) and over a new connection each (1 task), phases of {} ms\n",
        thousands(flood.rate as f64),
        flood.flood.as_millis(),
        load.cell.as_millis()
    );
    let pooled = dc.net.client(Role::Router, None)?;
    let resolve = {
        let (pooled, peer, key) = (pooled.clone(), dc.peer.clone(), key.clone());
        move |_| {
            let (pooled, peer, key) = (pooled.clone(), peer.clone(), key.clone());
            async move { resolved(pooled.request(&peer, &Request::Resolve { key }).await?) }
        }
    };
    let fresh = {
        let certs = Arc::new(dc.net.certs().to_path_buf());
        let (peer, key) = (dc.peer.clone(), key);
        move |_| {
            let (certs, peer, key) = (certs.clone(), peer.clone(), key.clone());
            async move {
                let client = router_client(&certs)?;
                let reply = client.request(&peer, &Request::Resolve { key }).await;
                // Closing waits for the peer's acknowledgement: not part of a resolve.
                tokio::spawn(async move { client.close().await });
                resolved(reply?)
            }
        }
    };
    let drops_before = udp_drops(homingd.port());
    println!(
        "| phase | pooled resolves/s | p50 µs | p99 µs | failed | new-connection resolves/s | p50 µs | p99 µs | failed |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    let mut ok = true;
    let mut sent = 0;
    let mut flood_s = 0.0;
    for phase in ["before", "during", "after"] {
        let length = if phase == "during" {
            flood.flood
        } else {
            load.cell
        };
        let flooding = (phase == "during").then(|| Flooder::start(homingd, flood.rate, length));
        let (a, b) = tokio::join!(
            run_cell(RESOLVE_TASKS, length, resolve.clone()),
            run_cell(1, length, fresh.clone())
        );
        let (a, b) = (a?, b?);
        if let Some(flooding) = flooding {
            (sent, flood_s) = flooding.join();
        } else {
            ok &= a.errors == 0 && b.errors == 0;
        }
        println!(
            "| {phase} | {} | {} | {} | {} | {} | {} | {} | {} |",
            thousands(a.rate),
            a.p50_us,
            a.p99_us,
            a.errors,
            thousands(b.rate),
            b.p50_us,
            b.p99_us,
            b.errors
        );
    }
    let drops = udp_drops(homingd.port())
        .zip(drops_before)
        .map(|(after, before)| after.saturating_sub(before));
    println!(
        "\nforged Initials sent: {} in {flood_s:.1} s = {} datagrams/s (aimed at {}); \
         dropped by the kernel at homingd's socket: {}",
        thousands(sent as f64),
        thousands(sent as f64 / flood_s.max(f64::EPSILON)),
        thousands(flood.rate as f64),
        drops.map_or("unknown".to_string(), |d| thousands(d as f64))
    );
    pooled.close().await;
    dc.net.shutdown().await;
    Ok(ok)
}

/// A new router client from the devnet's certificates.
fn router_client(certs: &std::path::Path) -> anyhow::Result<homing_net::Client> {
    let identity = homing_core::Identity::new(Role::Router, None)?;
    let tls = homing_net::pki::load_identity(certs, &identity)?;
    Ok(homing_net::Client::new(
        &tls,
        homing_net::ClientLimits::default(),
    )?)
}

fn resolved(reply: Reply) -> anyhow::Result<()> {
    match reply {
        Reply::Resolved { entry: Some(_), .. } => Ok(()),
        other => anyhow::bail!("the flood key resolved to {other:?}"),
    }
}

/// The kernel's drop count of the UDP socket bound to `port` on loopback
/// (`/proc/net/udp`, last column); `None` off Linux or when not found.
fn udp_drops(port: u16) -> Option<u64> {
    let table = std::fs::read_to_string("/proc/net/udp").ok()?;
    let local = format!("0100007F:{port:04X}");
    table
        .lines()
        .find(|line| line.split_whitespace().nth(1) == Some(local.as_str()))
        .and_then(|line| line.split_whitespace().last()?.parse().ok())
}

/// Threads sending forged Initials until their deadline.
struct Flooder {
    threads: Vec<std::thread::JoinHandle<u64>>,
    started: Instant,
}

impl Flooder {
    fn start(target: SocketAddr, rate: u64, length: Duration) -> Flooder {
        let per_socket = (rate / FLOOD_SOCKETS as u64).max(1);
        let started = Instant::now();
        let threads = (0..FLOOD_SOCKETS)
            .map(|i| {
                std::thread::spawn(move || {
                    flood_from_one_socket(target, per_socket, started + length, i as u64)
                })
            })
            .collect();
        Flooder { threads, started }
    }

    /// Datagrams sent and the seconds it took.
    fn join(self) -> (u64, f64) {
        let sent = self
            .threads
            .into_iter()
            .map(|t| t.join().unwrap_or(0))
            .sum();
        (sent, self.started.elapsed().as_secs_f64())
    }
}

/// Sends forged Initials to `target` at `rate`/s until `until`; how many were sent.
fn flood_from_one_socket(target: SocketAddr, rate: u64, until: Instant, seed: u64) -> u64 {
    let Ok(socket) = std::net::UdpSocket::bind("127.0.0.1:0") else {
        return 0;
    };
    let mut rng = XorShift(0x9e37_79b9_7f4a_7c15 ^ (seed + 1).wrapping_mul(0x2545_f491_4f6c_dd1d));
    let mut datagram = forged_initial(&mut rng);
    let started = Instant::now();
    let mut sent = 0u64;
    while Instant::now() < until {
        for _ in 0..PACING_BATCH {
            // A fresh destination connection ID: a new connection to the server.
            datagram[6..14].copy_from_slice(&rng.next().to_le_bytes());
            if socket.send_to(&datagram, target).is_ok() {
                sent += 1;
            }
        }
        let due = started + Duration::from_secs_f64(sent as f64 / rate as f64);
        if let Some(ahead) = due.checked_duration_since(Instant::now()) {
            std::thread::sleep(ahead);
        }
    }
    sent
}

/// A QUIC v1 long-header Initial (RFC 9000 §17.2.2) with random connection
/// IDs, packet number and payload: it parses, and fails decryption.
fn forged_initial(rng: &mut XorShift) -> [u8; INITIAL_BYTES] {
    let mut packet = [0u8; INITIAL_BYTES];
    for chunk in packet.chunks_mut(8) {
        let bytes = rng.next().to_le_bytes();
        chunk.copy_from_slice(&bytes[..chunk.len()]);
    }
    // Long header, fixed bit, type Initial, a 4-byte packet number.
    packet[0] = 0xc3;
    packet[1..5].copy_from_slice(&1u32.to_be_bytes());
    packet[5] = 8; // DCID length; the DCID is bytes 6..14
    packet[14] = 8; // SCID length; the SCID is bytes 15..23
    packet[23] = 0; // no token
    // The rest of the packet, as a 2-byte varint.
    let rest = (INITIAL_BYTES - 26) as u16;
    packet[24..26].copy_from_slice(&(0x4000 | rest).to_be_bytes());
    packet
}

/// xorshift64*: enough randomness for forged bytes, no dependency.
struct XorShift(u64);

impl XorShift {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
}

async fn idle_tcp(load: &Load, flood: &Flood) -> anyhow::Result<bool> {
    let idle = idle_connections_within_fd_limit(flood.idle_connections);
    // The idle connections outnumber the router's connection cap (its
    // default, or less where the fd limit allows fewer connections).
    let connections_max = ServeLimits::default()
        .connections_max
        .min(idle - idle / IDLE_SURPLUS_DIVISOR);
    let dc = OneDc::start().await?;
    let name = format!("flood-{}", run_tag());
    let host_config = ActorHostConfig::new(
        dc.peer.clone(),
        KeyConfig::named(KeyName::new(name.as_str())?),
        "127.0.0.1:0".parse()?,
    );
    let host = match ActorHost::start(dc.net.client(Role::Host, Some(&dc.dc))?, host_config).await?
    {
        AcquireReply::Acquired(host) => *host,
        other => anyhow::bail!("the actor host did not get its key: {other:?}"),
    };
    println!(
        "flood (b): {} idle TCP connections at the edge router (each reopened when closed; \
         {REFUSED_BACKOFF_MS} ms pause after a refusal at accept) for {} ms; real requests \
         through the router on a new connection each ({REQUEST_TASKS} tasks), phases of {} ms; \
         connections_max {}\n",
        thousands(idle as f64),
        flood.flood.as_millis(),
        load.cell.as_millis(),
        thousands(connections_max as f64)
    );
    println!(
        "| router | phase | requests/s | p50 µs | p99 µs | failed | idle connections opened |"
    );
    println!("|---|---|---:|---:|---:|---:|---:|");
    let bounded = ServeLimits {
        connections_max,
        ..ServeLimits::default()
    };
    let unbounded = ServeLimits {
        detect_timeout_ms: u64::from(u32::MAX),
        idle_timeout_ms: u64::from(u32::MAX),
        ..bounded
    };
    let mut ok = true;
    for (label, serve) in [
        ("default bounds", bounded),
        ("no detect/idle timeout", unbounded),
    ] {
        let resolver = Resolver::new(
            dc.net.client(Role::Router, None)?,
            ResolverConfig::new(dc.net.router_table(&dc.dc)),
        );
        let config = EdgeConfig {
            serve,
            ..EdgeConfig::default()
        };
        let router = EdgeRouter::new(resolver, config);
        let serving = router.spawn(tokio::net::TcpListener::bind("127.0.0.1:0").await?)?;
        let at = serving.local_addr();
        let request = {
            let name = name.clone();
            move |_| {
                let name = name.clone();
                async move {
                    let (status, body) = homing_edge::probe::get(at, "/", Some(&name)).await?;
                    anyhow::ensure!(status.is_success(), "{status}: {body:?}");
                    Ok(())
                }
            }
        };
        for phase in ["before", "during", "after"] {
            let length = if phase == "during" {
                flood.flood
            } else {
                load.cell
            };
            let holding = match phase {
                "during" => Some(IdleFlood::start(at, idle, length, connections_max).await),
                _ => None,
            };
            let cell = run_cell(REQUEST_TASKS, length, request.clone()).await?;
            let opened = match holding {
                Some(holding) => thousands(holding.stop().await as f64),
                None => {
                    ok &= label != "default bounds" || cell.errors == 0;
                    String::new()
                }
            };
            println!("| {label} {} {opened} |", row(phase, &cell));
        }
        serving.stop(Duration::ZERO).await;
    }
    let _ = host.stop().await;
    dc.net.shutdown().await;
    Ok(ok)
}

/// Raises the soft fd limit so that both ends of `wanted` loopback
/// connections fit; returns how many fit (fewer, and says so, if the hard
/// limit is too low: raise it with `ulimit -Hn`, or run as root).
fn idle_connections_within_fd_limit(wanted: usize) -> usize {
    use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
    let needed = 2 * wanted as u64 + FD_RESERVE;
    let limit = getrlimit(Resource::Nofile);
    let current = limit.current.unwrap_or(u64::MAX);
    if current >= needed {
        return wanted;
    }
    let hard = limit.maximum.unwrap_or(u64::MAX);
    let raised = Rlimit {
        current: Some(needed),
        maximum: Some(hard.max(needed)),
    };
    if setrlimit(Resource::Nofile, raised).is_ok() {
        return wanted;
    }
    let _ = setrlimit(
        Resource::Nofile,
        Rlimit {
            current: Some(hard),
            maximum: Some(hard),
        },
    );
    let fit = (hard.saturating_sub(FD_RESERVE) / 2) as usize;
    println!(
        "(the fd limit {hard} holds {fit} idle connections, not {wanted}: `ulimit -n {needed}` as root for all)"
    );
    fit.min(wanted)
}

/// Tasks holding idle connections at the router, reopening closed ones.
struct IdleFlood {
    stop: Arc<AtomicBool>,
    tasks: tokio::task::JoinSet<()>,
    opened: Arc<AtomicU64>,
}

impl IdleFlood {
    /// Starts `connections` attackers for `length`; returns once `full`
    /// connections were opened (the router's cap) or `length` passed.
    async fn start(at: SocketAddr, connections: usize, length: Duration, full: usize) -> IdleFlood {
        let stop = Arc::new(AtomicBool::new(false));
        let opened = Arc::new(AtomicU64::new(0));
        let until = tokio::time::Instant::now() + length;
        let mut tasks = tokio::task::JoinSet::new();
        for _ in 0..connections {
            let (stop, opened) = (stop.clone(), opened.clone());
            tasks.spawn(async move {
                let _ = tokio::time::timeout_at(until, hold(at, &stop, &opened)).await;
            });
        }
        while opened.load(Ordering::Relaxed) < full as u64 && tokio::time::Instant::now() < until {
            // A condition poll while the attackers connect.
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        IdleFlood {
            stop,
            tasks,
            opened,
        }
    }

    /// Closes every idle connection; how many were opened in all.
    async fn stop(mut self) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        self.tasks.abort_all();
        while self.tasks.join_next().await.is_some() {}
        self.opened.load(Ordering::Relaxed)
    }
}

/// One attacker: opens a connection, sends nothing, reopens it when closed.
async fn hold(at: SocketAddr, stop: &AtomicBool, opened: &AtomicU64) {
    use tokio::io::AsyncReadExt;
    let backoff = Duration::from_millis(REFUSED_BACKOFF_MS);
    while !stop.load(Ordering::Relaxed) {
        let Ok(mut stream) = tokio::net::TcpStream::connect(at).await else {
            tokio::time::sleep(backoff).await;
            continue;
        };
        opened.fetch_add(1, Ordering::Relaxed);
        let since = Instant::now();
        // Returns when the router closes it.
        let _ = stream.read(&mut [0u8; 1]).await;
        if since.elapsed() < Duration::from_millis(REFUSED_WITHIN_MS) {
            tokio::time::sleep(backoff).await;
        }
    }
}
