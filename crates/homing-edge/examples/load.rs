//! Load test of the edge router: requests/s and latency through the router
//! vs. straight to the actor host, the router's CPU per request, and then
//! errors and cache hit rate while the actor moves to another DC every second.
//!
//! `cargo run --release -p homing-edge --example load [-- CONNECTIONS PHASE_MS]`
//!
//! This process runs three DCs, the actor hosts and the load generator; the
//! router runs in a child process (this same binary, `--router-child`) so
//! its CPU time can be read alone from `/proc/<pid>/stat`.

#[path = "../tests/support/mod.rs"]
mod support;

use homing_core::AcquireReply;
use std::io::{BufRead, BufReader, Write};
use std::net::SocketAddr;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::time::Duration;

use anyhow::{Context, bail};
use bytes::Bytes;
use homing_client::{Resolver, ResolverConfig};
use homing_core::{DcId, KeyConfig, KeyName};
use homing_edge::{ActorHost, ActorHostConfig, EdgeConfig, EdgeRouter};
use homing_net::{Client, ClientLimits};
use http_body_util::{BodyExt, Empty};
use hyper::Request;
use hyper_util::rt::TokioIo;
use support::Net;
use tokio::net::TcpStream;
use tokio::time::Instant;

/// Default concurrent connections of the load generator.
const CONNECTIONS_DEFAULT: usize = 32;
/// Default length of each phase, in milliseconds.
const PHASE_MS_DEFAULT: u64 = 4_000;
/// Interval between actor moves in the last phase, in milliseconds.
const MOVE_INTERVAL_MS: u64 = 1_000;
/// The key under load.
const KEY: &str = "load";
/// Kernel clock ticks per second if `getconf CLK_TCK` cannot say.
const CLK_TCK_DEFAULT: u64 = 100;

/// What one phase measured.
#[derive(Debug, Default)]
struct Tally {
    latencies_us: Vec<u32>,
    errors: u64,
    elapsed: Duration,
}

impl Tally {
    fn merge(&mut self, other: Tally) {
        self.latencies_us.extend(other.latencies_us);
        self.errors += other.errors;
    }

    fn rate(&self) -> f64 {
        self.latencies_us.len() as f64 / self.elapsed.as_secs_f64()
    }

    fn percentile_us(&mut self, permille: usize) -> u32 {
        self.latencies_us.sort_unstable();
        let n = self.latencies_us.len();
        if n == 0 {
            return 0;
        }
        self.latencies_us[(n * permille / 1000).min(n - 1)]
    }
}

/// One connection sending requests back to back until `until`.
async fn connection(addr: SocketAddr, key: Option<&'static str>, until: Instant) -> Tally {
    let mut tally = Tally::default();
    'connect: while Instant::now() < until {
        let Ok(stream) = TcpStream::connect(addr).await else {
            tally.errors += 1;
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        };
        let _ = stream.set_nodelay(true);
        let Ok((mut sender, conn)) =
            hyper::client::conn::http1::handshake(TokioIo::new(stream)).await
        else {
            tally.errors += 1;
            continue;
        };
        tokio::spawn(conn);
        while Instant::now() < until {
            let mut request = Request::get("/").header(hyper::header::HOST, addr.to_string());
            if let Some(key) = key {
                request = request.header("x-homing-key", key);
            }
            let Ok(request) = request.body(Empty::<Bytes>::new()) else {
                tally.errors += 1;
                continue;
            };
            let started = Instant::now();
            let ok = match sender.send_request(request).await {
                Ok(response) => {
                    let success = response.status().is_success();
                    response.into_body().collect().await.is_ok() && success
                }
                Err(_) => {
                    tally.errors += 1;
                    continue 'connect;
                }
            };
            if ok {
                let us = started.elapsed().as_micros();
                tally
                    .latencies_us
                    .push(u32::try_from(us).unwrap_or(u32::MAX));
            } else {
                tally.errors += 1;
            }
        }
    }
    tally
}

async fn load(addr: SocketAddr, key: Option<&'static str>, connections: usize, ms: u64) -> Tally {
    let started = Instant::now();
    let until = started + Duration::from_millis(ms);
    let tasks: Vec<_> = (0..connections)
        .map(|_| tokio::spawn(connection(addr, key, until)))
        .collect();
    let mut tally = Tally::default();
    for task in tasks {
        if let Ok(one) = task.await {
            tally.merge(one);
        }
    }
    tally.elapsed = started.elapsed();
    tally
}

/// The router child: its pid, its stdin (ask "stats"), its stdout lines.
struct RouterChild {
    child: Child,
    stdin: ChildStdin,
    lines: std::io::Lines<BufReader<std::process::ChildStdout>>,
    addr: SocketAddr,
}

/// The router's counters, as the child reports them.
#[derive(Debug, Clone, Copy, Default)]
struct Counts {
    requests: u64,
    from_cache: u64,
    by_walk: u64,
    retries: u64,
    failures: u64,
}

impl RouterChild {
    fn start(net: &Net) -> anyhow::Result<RouterChild> {
        let dcs = net.dcs();
        let mut table = vec![format!("{}={}", dcs[2].0, dcs[2].1)];
        for (id, addr) in &dcs[..2] {
            table.push(format!("{id}={addr}"));
        }
        let mut child = Command::new(std::env::current_exe()?)
            .arg("--router-child")
            .arg(net.certs())
            .arg(table.join(","))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()?;
        let stdin = child.stdin.take().context("child stdin")?;
        let mut lines = BufReader::new(child.stdout.take().context("child stdout")?).lines();
        let first = lines.next().context("router child exited")??;
        let addr = first
            .strip_prefix("listening ")
            .context("router child's first line")?
            .parse()?;
        Ok(RouterChild {
            child,
            stdin,
            lines,
            addr,
        })
    }

    /// User + system CPU time of the child so far, in seconds.
    fn cpu_s(&self, ticks_per_s: u64) -> anyhow::Result<f64> {
        cpu_s(&format!("/proc/{}/stat", self.child.id()), ticks_per_s)
    }

    fn counts(&mut self) -> anyhow::Result<Counts> {
        writeln!(self.stdin, "stats")?;
        let line = self.lines.next().context("router child exited")??;
        let v: Vec<u64> = line
            .split_whitespace()
            .map(str::parse)
            .collect::<Result<_, _>>()?;
        let [requests, from_cache, by_walk, retries, failures] = v[..] else {
            bail!("stats line {line:?}");
        };
        Ok(Counts {
            requests,
            from_cache,
            by_walk,
            retries,
            failures,
        })
    }
}

/// User + system CPU time of the process whose `stat` file is `path`, in seconds.
fn cpu_s(path: &str, ticks_per_s: u64) -> anyhow::Result<f64> {
    let stat = std::fs::read_to_string(path)?;
    // Fields after the parenthesised command name; utime and stime are fields 14 and 15.
    let rest = stat.rsplit_once(')').context("stat format")?.1;
    let mut fields = rest.split_whitespace().skip(11);
    let mut next = || fields.next().context("stat: too few fields");
    let ticks = next()?.parse::<u64>()? + next()?.parse::<u64>()?;
    Ok(ticks as f64 / ticks_per_s as f64)
}

/// The child's side: serve the router; answer "stats" on stdin; exit at EOF.
fn router_child(certs: &str, table: &str) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let certs = std::path::Path::new(certs);
        let tls = homing_net::TlsIdentity::load_pem(
            &certs.join("ca.pem"),
            &certs.join("router.pem"),
            &certs.join("router.key"),
        )?;
        let dcs = table
            .split(',')
            .map(|entry| {
                let (dc, addr) = entry.split_once('=').context("NAME=ADDR")?;
                Ok((DcId::new(dc)?, addr.parse()?))
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        let resolver = Resolver::new(
            Client::new(&tls, ClientLimits::default())?,
            ResolverConfig::new(dcs),
        );
        let router = EdgeRouter::new(resolver, EdgeConfig::default());
        let serving = router.spawn(tokio::net::TcpListener::bind("127.0.0.1:0").await?)?;
        println!("listening {}", serving.local_addr());
        let stats = router.clone();
        tokio::task::spawn_blocking(move || {
            for line in std::io::stdin().lock().lines() {
                if line.is_err() {
                    break;
                }
                let s = stats.stats();
                println!(
                    "{} {} {} {} {}",
                    s.requests, s.resolved_from_cache, s.resolved_by_walk, s.retries, s.failures
                );
            }
        })
        .await?;
        serving.stop(Duration::ZERO).await;
        anyhow::Ok(())
    })
}

async fn host(net: &Net, dc: usize) -> anyhow::Result<ActorHost> {
    let config = ActorHostConfig::new(
        net.peer(dc),
        KeyConfig::named(KeyName::new(KEY)?),
        "127.0.0.1:0".parse()?,
    );
    match ActorHost::start(net.host_client(dc)?, config).await? {
        AcquireReply::Acquired(host) => Ok(*host),
        other => bail!("no lease in dc {dc}: {other:?}"),
    }
}

fn clk_tck() -> u64 {
    Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(CLK_TCK_DEFAULT)
}

fn row(name: &str, tally: &mut Tally) {
    let rate = tally.rate();
    let (p50, p99) = (tally.percentile_us(500), tally.percentile_us(990));
    println!(
        "| {name:<28} | {rate:>10.0} | {p50:>8} | {p99:>8} | {:>6} |",
        tally.errors
    );
}

async fn run(connections: usize, phase_ms: u64) -> anyhow::Result<()> {
    let net = Net::start(&["iad", "fra", "sin"]).await?;
    let mut actor = host(&net, 0).await?;
    let mut router = RouterChild::start(&net)?;
    let ticks = clk_tck();
    println!(
        "edge-router load: {connections} connections, {phase_ms} ms per phase; router in child pid {}",
        router.child.id()
    );
    // Warm the router's cache and connection pool.
    let _ = load(router.addr, Some(KEY), connections, 200).await;

    let own0 = cpu_s("/proc/self/stat", ticks)?;
    let mut direct = load(actor.local_addr(), None, connections, phase_ms).await;
    let own_us =
        (cpu_s("/proc/self/stat", ticks)? - own0) * 1e6 / direct.latencies_us.len().max(1) as f64;
    let (cpu0, counts0) = (router.cpu_s(ticks)?, router.counts()?);
    let mut routed = load(router.addr, Some(KEY), connections, phase_ms).await;
    let (cpu1, counts1) = (router.cpu_s(ticks)?, router.counts()?);
    let routed_requests = counts1.requests - counts0.requests;

    // Moves: every MOVE_INTERVAL_MS the actor is released and recreated in the next DC.
    let moving = tokio::spawn(load(router.addr, Some(KEY), connections, phase_ms));
    let mut moves = 0;
    let started = Instant::now();
    let mut dc = 0;
    while started.elapsed() + Duration::from_millis(MOVE_INTERVAL_MS)
        < Duration::from_millis(phase_ms)
    {
        tokio::time::sleep(Duration::from_millis(MOVE_INTERVAL_MS)).await;
        dc = (dc + 1) % net.dcs().len();
        actor.stop().await?;
        actor = host(&net, dc).await?;
        moves += 1;
    }
    let mut moved = moving.await?;
    let counts2 = router.counts()?;

    println!("\n| phase                        | requests/s | p50 (µs) | p99 (µs) | errors |");
    println!("|------------------------------|-----------:|---------:|---------:|-------:|");
    row("direct to the actor host", &mut direct);
    row("through the router", &mut routed);
    row(&format!("router, {moves} moves (1/s)"), &mut moved);
    let cpu_us = (cpu1 - cpu0) * 1e6 / routed_requests.max(1) as f64;
    println!(
        "\nrouter/direct throughput: {:.2}; p50 added by the router: {} µs",
        routed.rate() / direct.rate(),
        i64::from(routed.percentile_us(500)) - i64::from(direct.percentile_us(500))
    );
    println!(
        "router CPU: {:.2} s for {routed_requests} requests = {cpu_us:.1} µs/request (user+system, child process)",
        cpu1 - cpu0
    );
    println!(
        "for scale: load generator + actor host (this process) used {own_us:.1} µs/request in the direct phase"
    );
    let resolves = (counts2.from_cache - counts1.from_cache) + (counts2.by_walk - counts1.by_walk);
    println!(
        "during moves: {} requests, {} failed at the router, {} retried, resolver cache hits {}/{} = {:.3}%",
        counts2.requests - counts1.requests,
        counts2.failures - counts1.failures,
        counts2.retries - counts1.retries,
        counts2.from_cache - counts1.from_cache,
        resolves,
        100.0 * (counts2.from_cache - counts1.from_cache) as f64 / resolves.max(1) as f64
    );

    drop(router.stdin);
    let _ = router.child.wait();
    actor.stop().await?;
    net.shutdown().await;
    Ok(())
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("--router-child") {
        let (Some(certs), Some(table)) = (args.get(2), args.get(3)) else {
            bail!("--router-child CERTS TABLE");
        };
        return router_child(certs, table);
    }
    let connections = match args.get(1) {
        Some(n) => n.parse().context("CONNECTIONS")?,
        None => CONNECTIONS_DEFAULT,
    };
    let phase_ms = match args.get(2) {
        Some(n) => n.parse().context("PHASE_MS")?,
        None => PHASE_MS_DEFAULT,
    };
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?
        .block_on(run(connections, phase_ms))
}
