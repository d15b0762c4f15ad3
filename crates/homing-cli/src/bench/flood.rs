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
//! - **idle TCP connections** at the edge router: the router's
//!   `connections_max` is `--idle-connections` (10,000, the default cap),
//!   and 5 % more attackers than that each hold a connection that never
//!   sends a byte, reopened as soon as the router closes it (one refused at
//!   accept waits [`REFUSED_BACKOFF_MS`]), while real requests go through
//!   the router on a new connection each; the measured requests start once
//!   the router holds its cap (or the flood's time is up). The attackers
//!   run in a child process (this program again, `bench idle-attacker`):
//!   each process then needs one end of each connection, and raises its
//!   soft fd limit to the hard one, so 10,000 fit under a hard limit of
//!   20,000. Once with the router's default bounds and once with detection
//!   and idle timeouts off, side by side (both evict the oldest connection
//!   without a request at the cap: that policy has no switch).
//!
//! The forged Initials and the measured clients run in this process, next
//! to homingd and the router: on a small machine they compete for the same
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
/// The attackers outnumber `connections_max` by 1/this of it.
const IDLE_SURPLUS_DIVISOR: usize = 20;
/// File descriptors kept for everything but the idle connections.
const FD_RESERVE: u64 = 1_024;
/// How often the attacker process reports how many connections it opened,
/// in milliseconds.
const ATTACKER_REPORT_MS: u64 = 50;
/// How long the attacker process may take to exit once told to stop.
const ATTACKER_EXIT_MS: u64 = 5_000;
/// The attacker process stops on its own after this many flood lengths, if
/// this process never tells it to (it fills the cap, then the measured
/// flood phase runs a whole flood length).
const ATTACKER_LENGTHS_MAX: u32 = 3;

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
    // This process holds the router's end of each connection.
    let connections_max = connections_within_fd_limit(flood.idle_connections, "router");
    let idle = connections_max + connections_max / IDLE_SURPLUS_DIVISOR;
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
        "flood (b): {} attackers in a child process holding idle TCP connections at the edge \
         router (each reopened when closed; {REFUSED_BACKOFF_MS} ms pause after a refusal at \
         accept) for {} ms; real requests through the router on a new connection each \
         ({REQUEST_TASKS} tasks), phases of {} ms; connections_max {}\n",
        thousands(idle as f64),
        flood.flood.as_millis(),
        load.cell.as_millis(),
        thousands(connections_max as f64)
    );
    println!(
        "| router | phase | requests/s | p50 µs | p99 µs | failed | idle connections opened | held by the router (most) |"
    );
    println!("|---|---|---:|---:|---:|---:|---:|---:|");
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
                "during" => Some(
                    IdleFlood::start(at, idle, length, || {
                        serving.connections_open() >= connections_max
                    })
                    .await?,
                ),
                _ => None,
            };
            let (cell, held) = tokio::join!(
                run_cell(REQUEST_TASKS, length, request.clone()),
                most_held(&serving, length)
            );
            let cell = cell?;
            let opened = match holding {
                Some(holding) => {
                    let filled = holding.filled.map_or("cap not filled".to_string(), |d| {
                        format!("cap filled in {} ms", d.as_millis())
                    });
                    format!("{} ({filled})", thousands(holding.stop().await? as f64))
                }
                None => {
                    ok &= label != "default bounds" || cell.errors == 0;
                    String::new()
                }
            };
            println!(
                "| {label} {} {opened} | {} |",
                row(phase, &cell),
                thousands(held as f64)
            );
        }
        serving.stop(Duration::ZERO).await;
    }
    let _ = host.stop().await;
    dc.net.shutdown().await;
    Ok(ok)
}

/// The most connections the router held at once over `length` (sampled
/// every millisecond or so).
async fn most_held(serving: &homing_edge::listener::Serving, length: Duration) -> usize {
    let until = tokio::time::Instant::now() + length;
    let mut most = serving.connections_open();
    while tokio::time::Instant::now() < until {
        // A sampling poll of a gauge, not a wait for an event.
        tokio::time::sleep(Duration::from_millis(1)).await;
        most = most.max(serving.connections_open());
    }
    most
}

/// Raises this process's soft fd limit to its hard one and returns how
/// many of `wanted` connection ends fit beside [`FD_RESERVE`] (fewer, and
/// says so, if the hard limit is too low: raise it with `ulimit -Hn`, or
/// run as root). `who`: whose ends they are, for the message.
fn connections_within_fd_limit(wanted: usize, who: &str) -> usize {
    use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
    let needed = wanted as u64 + FD_RESERVE;
    let limit = getrlimit(Resource::Nofile);
    let hard = limit.maximum.unwrap_or(u64::MAX);
    let soft = limit.current.unwrap_or(u64::MAX);
    if soft < needed {
        let raised = Rlimit {
            current: Some(hard.min(needed.max(soft))),
            maximum: limit.maximum,
        };
        let _ = setrlimit(Resource::Nofile, raised);
    }
    let soft = getrlimit(Resource::Nofile).current.unwrap_or(u64::MAX);
    let fit = (soft.saturating_sub(FD_RESERVE) as usize).min(wanted);
    if fit < wanted {
        println!(
            "(the {who}'s fd limit {soft} holds {fit} connections, not {wanted}: `ulimit -Hn {needed}` as root for all)"
        );
    }
    fit
}

/// `homing bench idle-attacker`: the attackers of flood (b), in their own
/// process. Holds `connections` idle connections at `at` until `length`
/// passes or stdin closes, printing `opened N` every [`ATTACKER_REPORT_MS`]
/// and once at the end.
pub async fn attacker(
    at: SocketAddr,
    connections: usize,
    length: Duration,
) -> anyhow::Result<bool> {
    let connections = connections_within_fd_limit(connections, "attacker");
    let stop = Arc::new(AtomicBool::new(false));
    let opened = Arc::new(AtomicU64::new(0));
    {
        // The parent closes our stdin to stop us.
        let stop = stop.clone();
        std::thread::spawn(move || {
            let _ = std::io::copy(&mut std::io::stdin().lock(), &mut std::io::sink());
            stop.store(true, Ordering::Relaxed);
        });
    }
    let until = tokio::time::Instant::now() + length;
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..connections {
        let (stop, opened) = (stop.clone(), opened.clone());
        tasks.spawn(async move {
            let _ = tokio::time::timeout_at(until, hold(at, &stop, &opened)).await;
        });
    }
    let mut report = tokio::time::interval(Duration::from_millis(ATTACKER_REPORT_MS));
    while !stop.load(Ordering::Relaxed) && tokio::time::Instant::now() < until {
        report.tick().await;
        println!("opened {}", opened.load(Ordering::Relaxed));
    }
    stop.store(true, Ordering::Relaxed);
    tasks.abort_all();
    while tasks.join_next().await.is_some() {}
    println!("opened {}", opened.load(Ordering::Relaxed));
    Ok(true)
}

/// The attacker process holding idle connections at the router.
struct IdleFlood {
    child: std::process::Child,
    opened: Arc<AtomicU64>,
    reader: std::thread::JoinHandle<()>,
    /// How long the attackers took to fill the router's cap (`None`: they did not).
    filled: Option<Duration>,
}

impl IdleFlood {
    /// Starts `connections` attackers in a child process (until
    /// [`IdleFlood::stop`]); returns once `full()` (the router holds its
    /// cap) or `length` passed.
    async fn start(
        at: SocketAddr,
        connections: usize,
        length: Duration,
        full: impl Fn() -> bool,
    ) -> anyhow::Result<IdleFlood> {
        use std::io::BufRead;
        use std::process::{Command, Stdio};
        let mut child = Command::new(std::env::current_exe()?)
            .args(["bench", "idle-attacker", "--attack"])
            .arg(at.to_string())
            .arg("--idle-connections")
            .arg(connections.to_string())
            .arg("--flood-ms")
            .arg((length * ATTACKER_LENGTHS_MAX).as_millis().to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()?;
        let opened = Arc::new(AtomicU64::new(0));
        let stdout = child.stdout.take().expect("stdout was piped");
        let reader = {
            let opened = opened.clone();
            std::thread::spawn(move || {
                for line in std::io::BufReader::new(stdout).lines() {
                    let Ok(line) = line else { break };
                    match line.strip_prefix("opened ").map(str::parse::<u64>) {
                        Some(Ok(n)) => opened.store(n, Ordering::Relaxed),
                        _ => println!("(attacker) {line}"),
                    }
                }
            })
        };
        let started = tokio::time::Instant::now();
        while !full() && started.elapsed() < length {
            // A condition poll while the attackers connect.
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        Ok(IdleFlood {
            child,
            opened,
            reader,
            filled: full().then(|| started.elapsed()),
        })
    }

    /// Stops the attackers (closes their stdin; kills them if they do not
    /// exit in [`ATTACKER_EXIT_MS`]); how many connections they opened in all.
    async fn stop(mut self) -> anyhow::Result<u64> {
        drop(self.child.stdin.take());
        let deadline = Instant::now() + Duration::from_millis(ATTACKER_EXIT_MS);
        while self.child.try_wait()?.is_none() {
            if Instant::now() >= deadline {
                self.child.kill()?;
                self.child.wait()?;
                break;
            }
            // A poll of the child's exit, bounded by the deadline above.
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let _ = self.reader.join();
        Ok(self.opened.load(Ordering::Relaxed))
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
