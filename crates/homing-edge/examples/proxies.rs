//! The edge router next to the proxies an operator already runs: the same
//! actor hosts served directly, through nginx, through a plain hyper reverse
//! proxy with a static upstream, and through `edge-router`, under an external
//! load generator (wrk for HTTP/1.1, h2load for HTTP/2 prior knowledge);
//! phases alternate, each repeated, medians reported, with each proxy's CPU
//! per request read from `/proc/<pid>/stat`. Then a move phase: the hot
//! key's actor is released and recreated in the next DC every second under
//! load, and every failed request is counted.
//!
//! ```sh
//! cargo run --release -p homing-edge --example proxies -- --help
//! ```
//!
//! nginx, wrk and h2load are used when installed (`apt-get install wrk
//! nginx-light nghttp2-client`); the run says which are missing and skips
//! their phases. This process runs the DCs and the actor hosts; the router
//! and the hyper proxy run in child processes (this binary again) and nginx
//! as one process (`master_process off`, one worker's work), so each
//! proxy's CPU time is its own.

#[path = "../tests/support/mod.rs"]
mod support;

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::{BufRead, BufReader, Write};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use bytes::Bytes;
use clap::Parser;
use homing_client::{HostClock, Resolver, ResolverConfig, SystemClock};
use homing_core::{AcquireReply, ActorId, DcId, KeyConfig, KeyName, Reply, Request};
use homing_edge::{ActorHost, EdgeConfig, EdgeRouter, runtime};
use homing_net::{Client, ClientLimits};
use http_body_util::{BodyExt, Empty};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client as LegacyClient;
use hyper_util::rt::{TokioExecutor, TokioIo};
use support::Net;
use tokio::net::{TcpListener, TcpStream};
use tokio::time::Instant;

/// The hot key of the one-key shapes.
const HOT_KEY: &str = "hot";
/// Actor hosts the many-keys shape spreads its keys over.
const KEY_HOSTS: usize = 4;
/// Bytes of the POST shape's body.
const POST_BODY_BYTES: usize = 128;
/// Lease TTL of the devnet: the many keys are reserved once, not renewed.
const LEASE_TTL_MS: u64 = 3_600_000;
/// The router's tail TTL: long, so the many-keys shape measures cache hits.
const TAIL_TTL_MS: u64 = 3_600_000;
/// Concurrent reserves and warm-up requests.
const SETUP_TASKS: usize = 64;
/// Interval between actor moves in the move phase, in milliseconds.
const MOVE_INTERVAL_MS: u64 = 1_000;
/// Kernel clock ticks per second if `getconf CLK_TCK` cannot say.
const CLK_TCK_DEFAULT: u64 = 100;
/// Marker of the line the wrk script prints at the end.
const WRK_MARK: &str = "HOMING-WRK";

#[derive(Debug, Parser)]
#[command(about = "edge-router vs nginx vs a plain hyper proxy vs direct")]
struct Args {
    /// Seconds per phase.
    #[arg(long, default_value_t = 5)]
    phase_s: u64,
    /// Rounds of alternating phases; medians are over these.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Connections of the load generator (one thread).
    #[arg(long, default_value_t = 32)]
    connections: usize,
    /// Keys of the many-keys shape.
    #[arg(long, default_value_t = 100_000)]
    keys: usize,
    /// Shapes to run, comma-separated: hot, keys, post, h2.
    #[arg(long, value_delimiter = ',', default_value = "hot,keys,post,h2")]
    shapes: Vec<Shape>,
    /// Worker threads of the router and the hyper proxy (nginx runs one worker).
    #[arg(long, default_value_t = 1)]
    proxy_threads: usize,
    /// Skip the move phase.
    #[arg(long)]
    no_moves: bool,
    /// Another build of this example whose router runs as one more target
    /// ("router before"), e.g. built from the commit before a change: a
    /// before/after comparison in one run.
    #[arg(long)]
    router_before: Option<PathBuf>,
    /// Internal: run as the router child (CERTS TABLE THREADS).
    #[arg(long, num_args = 3, hide = true)]
    router_child: Option<Vec<String>>,
    /// Internal: run as the hyper proxy child (THREADS HOT KEY_HOSTS).
    #[arg(long, num_args = 3, hide = true)]
    hyper_child: Option<Vec<String>>,
}

/// A load shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, clap::ValueEnum)]
enum Shape {
    /// HTTP/1.1 GET, one hot key in a header.
    Hot,
    /// HTTP/1.1 GET, a random key of many per request (`/k/<key>/`), over several actor hosts.
    Keys,
    /// HTTP/1.1 POST of a small body, one hot key.
    Post,
    /// HTTP/2 prior knowledge GET, one hot key (h2load).
    H2,
}

impl Shape {
    fn name(self) -> &'static str {
        match self {
            Shape::Hot => "hot",
            Shape::Keys => "keys",
            Shape::Post => "post",
            Shape::H2 => "h2",
        }
    }
}

/// Where a phase sends its load.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Target {
    Direct,
    Nginx,
    Hyper,
    RouterBefore,
    Router,
}

impl Target {
    fn name(self) -> &'static str {
        match self {
            Target::Direct => "direct",
            Target::Nginx => "nginx",
            Target::Hyper => "hyper proxy",
            Target::RouterBefore => "edge-router before",
            Target::Router => "edge-router",
        }
    }
}

/// What one phase measured.
#[derive(Debug, Clone, Copy)]
struct Phase {
    requests: u64,
    rate: f64,
    p50_us: f64,
    p99_us: f64,
    errors: u64,
    /// CPU time of the proxy process per request, in µs (`None` for direct).
    cpu_us: Option<f64>,
}

/// The tools found on this machine.
struct Tools {
    wrk: Option<PathBuf>,
    h2load: Option<PathBuf>,
    nginx: Option<PathBuf>,
}

fn which(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .chain([PathBuf::from("/usr/sbin"), PathBuf::from("/sbin")])
        .map(|dir| dir.join(name))
        .find(|p| p.is_file())
}

/// A child process serving a proxy: prints `listening ADDR…` first, exits at stdin EOF.
struct ProxyChild {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: std::io::Lines<BufReader<std::process::ChildStdout>>,
    addrs: Vec<SocketAddr>,
}

impl ProxyChild {
    fn start(exe: &Path, args: &[String]) -> anyhow::Result<ProxyChild> {
        let mut child = Command::new(exe)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()?;
        let stdin = child.stdin.take().context("child stdin")?;
        let mut lines = BufReader::new(child.stdout.take().context("child stdout")?).lines();
        let first = lines.next().context("proxy child exited")??;
        let addrs = first
            .strip_prefix("listening ")
            .context("proxy child's first line")?
            .split_whitespace()
            .map(str::parse)
            .collect::<Result<_, _>>()?;
        Ok(ProxyChild {
            child,
            stdin: Some(stdin),
            lines,
            addrs,
        })
    }

    /// The router's counters line: requests, from cache, by walk, retries, failures.
    fn counts(&mut self) -> anyhow::Result<Vec<u64>> {
        let stdin = self.stdin.as_mut().context("child stopped")?;
        writeln!(stdin, "stats")?;
        let line = self.lines.next().context("proxy child exited")??;
        Ok(line
            .split_whitespace()
            .map(str::parse)
            .collect::<Result<_, _>>()?)
    }

    fn stop(&mut self) {
        self.stdin = None;
        let _ = self.child.wait();
    }
}

/// User + system CPU time of process `pid` so far, in seconds.
fn cpu_s(pid: u32, ticks_per_s: u64) -> anyhow::Result<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // Fields after the parenthesised command name; utime and stime are fields 14 and 15.
    let rest = stat.rsplit_once(')').context("stat format")?.1;
    let mut fields = rest.split_whitespace().skip(11);
    let mut next = || fields.next().context("stat: too few fields");
    let ticks = next()?.parse::<u64>()? + next()?.parse::<u64>()?;
    Ok(ticks as f64 / ticks_per_s as f64)
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

/// Answers "stats" lines on stdin with `line()` until EOF.
async fn answer_stats(line: impl Fn() -> String + Send + 'static) -> anyhow::Result<()> {
    tokio::task::spawn_blocking(move || {
        for l in std::io::stdin().lock().lines() {
            if l.is_err() {
                break;
            }
            println!("{}", line());
        }
    })
    .await?;
    Ok(())
}

/// The router child: an `EdgeRouter` as `edge-router` builds it, tail TTL long.
fn router_child(args: &[String]) -> anyhow::Result<()> {
    let [certs, table, threads] = args else {
        bail!("--router-child CERTS TABLE THREADS");
    };
    runtime(threads.parse()?)?.block_on(async {
        let certs = Path::new(certs);
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
        let config = ResolverConfig {
            tail_ttl_ms: TAIL_TTL_MS,
            ..ResolverConfig::new(dcs)
        };
        let resolver = Resolver::new(Client::new(&tls, ClientLimits::default())?, config);
        let router = EdgeRouter::new(resolver, EdgeConfig::default());
        let serving = router.spawn(TcpListener::bind("127.0.0.1:0").await?)?;
        println!("listening {}", serving.local_addr());
        let stats = router.clone();
        answer_stats(move || {
            let s = stats.stats();
            format!(
                "{} {} {} {} {}",
                s.requests, s.resolved_from_cache, s.resolved_by_walk, s.retries, s.failures
            )
        })
        .await?;
        serving.stop(Duration::ZERO).await;
        anyhow::Ok(())
    })
}

/// The hyper child: a plain reverse proxy with static upstreams, the way
/// hyper's users write one (legacy pooled client, body streamed, URI
/// formatted per request, round robin over the upstreams). One listener for
/// the hot actor host, one for the many-keys hosts.
fn hyper_child(args: &[String]) -> anyhow::Result<()> {
    let [threads, hot, hosts] = args else {
        bail!("--hyper-child THREADS HOT HOSTS");
    };
    let groups = [
        vec![hot.clone()],
        hosts.split(',').map(str::to_string).collect(),
    ];
    runtime(threads.parse()?)?.block_on(async {
        let client: LegacyClient<_, Incoming> = LegacyClient::builder(TokioExecutor::new())
            .pool_max_idle_per_host(64)
            .build_http();
        let mut addrs = Vec::new();
        for upstreams in groups {
            let listener = TcpListener::bind("127.0.0.1:0").await?;
            addrs.push(listener.local_addr()?.to_string());
            tokio::spawn(plain_proxy(listener, client.clone(), Arc::new(upstreams)));
        }
        println!("listening {}", addrs.join(" "));
        answer_stats(String::new).await
    })
}

async fn plain_proxy(
    listener: TcpListener,
    client: LegacyClient<hyper_util::client::legacy::connect::HttpConnector, Incoming>,
    upstreams: Arc<Vec<String>>,
) {
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let _ = stream.set_nodelay(true);
        let (client, upstreams, next) = (client.clone(), upstreams.clone(), next.clone());
        let service = hyper::service::service_fn(move |request: hyper::Request<Incoming>| {
            let (client, upstreams, next) = (client.clone(), upstreams.clone(), next.clone());
            async move {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let upstream = &upstreams[i % upstreams.len()];
                let (mut parts, body) = request.into_parts();
                let pq = parts.uri.path_and_query().map_or("/", |pq| pq.as_str());
                parts.uri = format!("http://{upstream}{pq}").parse()?;
                parts.version = hyper::Version::HTTP_11;
                parts.headers.insert(hyper::header::HOST, upstream.parse()?);
                let response = client
                    .request(hyper::Request::from_parts(parts, body))
                    .await?;
                anyhow::Ok(response)
            }
        });
        tokio::spawn(async move {
            let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

/// nginx as one process serving three ports: HTTP/1.1 to the hot actor
/// host, HTTP/1.1 round robin over the many-keys hosts, h2c to the hot host.
/// Connections are kept for good (nginx's default closes client and
/// upstream connections after 1000 requests, which would charge it for
/// reconnects the others never make, and end h2load's connections early).
fn start_nginx(
    nginx: &Path,
    dir: &Path,
    hot: SocketAddr,
    hosts: &[SocketAddr],
) -> anyhow::Result<(Child, [SocketAddr; 3])> {
    let ports: Vec<SocketAddr> = (0..3)
        .map(|_| {
            let l = std::net::TcpListener::bind("127.0.0.1:0")?;
            l.local_addr()
        })
        .collect::<Result<_, _>>()?;
    let servers: String = hosts.iter().map(|h| format!("server {h}; ")).collect();
    let d = dir.display();
    let proxy = "proxy_pass http://$up; proxy_http_version 1.1; proxy_set_header Connection \"\";";
    let conf = format!(
        "daemon off; master_process off; worker_processes 1; pid {d}/nginx.pid;\n\
         error_log {d}/error.log warn;\n\
         events {{ worker_connections 4096; }}\n\
         http {{ access_log off; keepalive_requests 1000000000;\n\
           client_body_temp_path {d}/body; proxy_temp_path {d}/proxy;\n\
           fastcgi_temp_path {d}/fcgi; uwsgi_temp_path {d}/uwsgi; scgi_temp_path {d}/scgi;\n\
           upstream hot {{ server {hot}; keepalive 64; keepalive_requests 1000000000; }}\n\
           upstream hosts {{ {servers}keepalive 64; keepalive_requests 1000000000; }}\n\
           server {{ listen {}; set $up hot; location / {{ {proxy} }} }}\n\
           server {{ listen {}; set $up hosts; location / {{ {proxy} }} }}\n\
           server {{ listen {} http2; set $up hot; location / {{ {proxy} }} }}\n\
         }}\n",
        ports[0], ports[1], ports[2]
    );
    let path = dir.join("nginx.conf");
    std::fs::write(&path, conf)?;
    let child = Command::new(nginx)
        .arg("-c")
        .arg(&path)
        .arg("-p")
        .arg(dir)
        .stdout(Stdio::null())
        .spawn()?;
    for port in &ports {
        wait_listening(*port)?;
    }
    Ok((child, [ports[0], ports[1], ports[2]]))
}

fn wait_listening(addr: SocketAddr) -> anyhow::Result<()> {
    let until = std::time::Instant::now() + Duration::from_secs(10);
    while std::net::TcpStream::connect(addr).is_err() {
        if std::time::Instant::now() > until {
            bail!("nothing listens on {addr} after 10 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

/// The wrk script of `shape`: its requests, and one summary line at the end.
fn wrk_script(shape: Shape, keys: usize) -> String {
    let mut s = String::new();
    match shape {
        Shape::Keys => {
            let _ = writeln!(
                s,
                "request = function() return wrk.format(nil, \"/k/key-\" .. math.random(0, {}) .. \"/\") end",
                keys - 1
            );
        }
        Shape::Post => {
            let _ = writeln!(
                s,
                "wrk.method = \"POST\"\nwrk.body = string.rep(\"x\", {POST_BODY_BYTES})\n\
                 wrk.headers[\"Content-Type\"] = \"application/octet-stream\"\n\
                 wrk.headers[\"x-homing-key\"] = \"{HOT_KEY}\""
            );
        }
        Shape::Hot | Shape::H2 => {
            let _ = writeln!(s, "wrk.headers[\"x-homing-key\"] = \"{HOT_KEY}\"");
        }
    }
    let _ = writeln!(
        s,
        "done = function(summary, latency, requests)\n\
           local e = summary.errors\n\
           io.write(string.format(\"{WRK_MARK} %d %d %d %d %d %d\\n\", summary.requests, summary.duration,\n\
             latency:percentile(50), latency:percentile(99), e.status, e.connect + e.read + e.write + e.timeout))\n\
         end"
    );
    s
}

/// Runs the load generator for `shape` against `addr`; `pid` is the proxy's.
fn drive(
    tools: &Tools,
    dir: &Path,
    shape: Shape,
    args: &Args,
    addr: SocketAddr,
    pid: Option<u32>,
    ticks: u64,
) -> anyhow::Result<Phase> {
    let cpu0 = pid.map(|p| cpu_s(p, ticks)).transpose()?;
    let mut phase = if shape == Shape::H2 {
        h2load(tools, dir, args, addr)?
    } else {
        wrk(
            tools.wrk.as_deref(),
            dir,
            shape,
            (args.connections, args.phase_s),
            addr,
        )?
    };
    if let (Some(pid), Some(cpu0)) = (pid, cpu0) {
        let cpu = cpu_s(pid, ticks)? - cpu0;
        phase.cpu_us = Some(cpu * 1e6 / phase.requests.max(1) as f64);
    }
    Ok(phase)
}

fn wrk(
    wrk: Option<&Path>,
    dir: &Path,
    shape: Shape,
    (connections, phase_s): (usize, u64),
    addr: SocketAddr,
) -> anyhow::Result<Phase> {
    let wrk = wrk.context("wrk is not installed")?;
    let script = dir.join(format!("{}.lua", shape.name()));
    let output = Command::new(wrk)
        .args(["-t1", &format!("-c{connections}")])
        .arg(format!("-d{phase_s}s"))
        .arg("-s")
        .arg(&script)
        .arg(format!("http://{addr}/"))
        .output()?;
    let text = String::from_utf8_lossy(&output.stdout);
    let line = text
        .lines()
        .find_map(|l| l.strip_prefix(WRK_MARK))
        .with_context(|| format!("wrk printed no summary: {text}"))?;
    let v: Vec<u64> = line
        .split_whitespace()
        .map(str::parse)
        .collect::<Result<_, _>>()?;
    let [requests, duration_us, p50, p99, status, socket] = v[..] else {
        bail!("wrk summary {line:?}");
    };
    Ok(Phase {
        requests,
        rate: requests as f64 / (duration_us as f64 / 1e6),
        p50_us: p50 as f64,
        p99_us: p99 as f64,
        errors: status + socket,
        cpu_us: None,
    })
}

/// h2load over HTTP/2 prior knowledge; latencies from its per-request log.
fn h2load(tools: &Tools, dir: &Path, args: &Args, addr: SocketAddr) -> anyhow::Result<Phase> {
    let h2load = tools.h2load.as_ref().context("h2load is not installed")?;
    let log = dir.join("h2load.log");
    let output = Command::new(h2load)
        .args(["-t1", "-m1", &format!("-c{}", args.connections)])
        .arg(format!("-D{}", args.phase_s))
        .args(["-H", &format!("x-homing-key: {HOT_KEY}")])
        .arg("--log-file")
        .arg(&log)
        .arg(format!("http://{addr}/"))
        .output()?;
    let text = String::from_utf8_lossy(&output.stdout);
    // "requests: N total, N started, N done, N succeeded, N failed, N errored, N timeout"
    let counts = text
        .lines()
        .find_map(|l| l.strip_prefix("requests: "))
        .with_context(|| format!("h2load printed no request counts: {text}"))?;
    let count = |what: &str| -> u64 {
        counts
            .split(',')
            .find_map(|part| part.trim().strip_suffix(what)?.trim().parse().ok())
            .unwrap_or(0)
    };
    // "finished in 4.00s, 8000.00 req/s, …"
    let rate = text
        .lines()
        .find_map(|l| l.strip_prefix("finished in "))
        .and_then(|l| l.split(", ").nth(1)?.strip_suffix(" req/s")?.parse().ok())
        .with_context(|| format!("h2load printed no rate: {text}"))?;
    let mut latencies: Vec<u64> = Vec::new();
    for line in std::fs::read_to_string(&log)?.lines() {
        // start time (µs since the epoch), status, duration (µs)
        let mut fields = line.split('\t');
        let (Some(_), Some(status), Some(us)) = (fields.next(), fields.next(), fields.next())
        else {
            continue;
        };
        if status.starts_with('2') {
            latencies.push(us.trim().parse()?);
        }
    }
    latencies.sort_unstable();
    let at = |q: f64| latencies.get(((latencies.len() as f64 - 1.0) * q) as usize);
    Ok(Phase {
        requests: count(" done"),
        rate,
        p50_us: at(0.5).copied().unwrap_or(0) as f64,
        p99_us: at(0.99).copied().unwrap_or(0) as f64,
        errors: count(" failed") + count(" errored") + count(" timeout"),
        cpu_us: None,
    })
}

/// Reserves `key-0 … key-(keys-1)`, key `i` for host `i % hosts` in that host's DC.
async fn reserve_keys(net: &Net, hosts: &[(usize, ActorHost)], keys: usize) -> anyhow::Result<()> {
    let clients = (0..net.dcs().len())
        .map(|dc| net.host_client(dc))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let targets: Arc<Vec<_>> = Arc::new(
        hosts
            .iter()
            .map(|(dc, h)| (clients[*dc].clone(), net.peer(*dc), h.actor().clone()))
            .collect(),
    );
    let mut tasks = tokio::task::JoinSet::new();
    for t in 0..SETUP_TASKS {
        let targets = targets.clone();
        tasks.spawn(async move {
            for i in (t..keys).step_by(SETUP_TASKS) {
                let (client, peer, actor) = &targets[i % targets.len()];
                let request = Request::Acquire {
                    config: KeyConfig::named(KeyName::new(format!("key-{i}"))?),
                    actor: ActorId::clone(actor),
                    lease: homing_client::new_lease_key()?,
                    host_time: SystemClock.now(),
                    wait_ms: 0,
                };
                match client.request(peer, &request).await? {
                    Reply::Acquire(AcquireReply::Acquired(_)) => {}
                    other => bail!("acquire key-{i}: {other:?}"),
                }
            }
            anyhow::Ok(())
        });
    }
    while let Some(done) = tasks.join_next().await {
        done??;
    }
    Ok(())
}

/// Sends one GET per key through the router, so the many-keys shape measures cache hits.
async fn warm_keys(router: SocketAddr, keys: usize) -> anyhow::Result<()> {
    let mut tasks = tokio::task::JoinSet::new();
    for t in 0..SETUP_TASKS {
        tasks.spawn(async move {
            let stream = TcpStream::connect(router).await?;
            let (mut sender, conn) =
                hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
            tokio::spawn(conn);
            for i in (t..keys).step_by(SETUP_TASKS) {
                let request = hyper::Request::get(format!("/k/key-{i}/"))
                    .header(hyper::header::HOST, router.to_string())
                    .body(Empty::<Bytes>::new())?;
                let response = sender.send_request(request).await?;
                let status = response.status();
                response.into_body().collect().await?;
                if !status.is_success() {
                    bail!("warm-up of key-{i} answered {status}");
                }
            }
            anyhow::Ok(())
        });
    }
    while let Some(done) = tasks.join_next().await {
        done??;
    }
    Ok(())
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    if v.is_empty() { 0.0 } else { v[v.len() / 2] }
}

fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

/// Prints one shape's table: medians over the rounds and ratios vs nginx.
fn report(shape: Shape, phases: &BTreeMap<Target, Vec<Phase>>) {
    println!("\n### shape: {} \n", shape.name());
    println!("| target | req/s | p50 µs | p99 µs | proxy CPU µs/req | errors | runs (req/s) |");
    println!("|---|---:|---:|---:|---:|---:|---|");
    let med = |t: Target, f: &dyn Fn(&Phase) -> Option<f64>| {
        phases
            .get(&t)
            .map(|v| median(v.iter().filter_map(f).collect()))
    };
    for (target, runs) in phases {
        let cpu = med(*target, &|p| p.cpu_us).filter(|_| *target != Target::Direct);
        let errors: u64 = runs.iter().map(|p| p.errors).sum();
        let each: Vec<String> = runs.iter().map(|p| format!("{:.0}", p.rate)).collect();
        println!(
            "| {} | {:.0} | {:.0} | {:.0} | {} | {errors} | {} |",
            target.name(),
            med(*target, &|p| Some(p.rate)).unwrap_or(0.0),
            med(*target, &|p| Some(p.p50_us)).unwrap_or(0.0),
            med(*target, &|p| Some(p.p99_us)).unwrap_or(0.0),
            cpu.map_or("—".to_string(), |c| format!("{c:.1}")),
            each.join(", ")
        );
    }
    let Some(nginx) = phases.get(&Target::Nginx).filter(|v| !v.is_empty()) else {
        println!("\n(no nginx phases: no ratios)");
        return;
    };
    for target in [Target::Hyper, Target::RouterBefore, Target::Router] {
        let Some(ours) = phases.get(&target) else {
            continue;
        };
        let ratio =
            |f: &dyn Fn(&Phase) -> Option<f64>| match (med(target, f), med(Target::Nginx, f)) {
                (Some(a), Some(b)) if b > 0.0 => format!("{:.2}", a / b),
                _ => "—".to_string(),
            };
        println!(
            "\n{} / nginx: CPU per request {}, throughput {}, p99 {}",
            target.name(),
            ratio(&|p| p.cpu_us),
            ratio(&|p| Some(p.rate)),
            ratio(&|p| Some(p.p99_us)),
        );
        // Each round's phases ran minutes apart at most, so a ratio taken
        // within a round cancels the machine's drift between rounds.
        let paired = |f: &dyn Fn(&Phase) -> Option<f64>| {
            let each = ours.iter().zip(nginx.iter());
            let ratios: Vec<f64> = each
                .filter_map(|(a, b)| Some(f(a)? / f(b).filter(|b| *b > 0.0)?))
                .collect();
            if ratios.is_empty() || ours.len() != nginx.len() {
                "—".to_string()
            } else {
                format!("{:.2}", median(ratios))
            }
        };
        println!(
            "{} / nginx, paired by round (the median of each round's ratio): CPU per request {}, throughput {}, p99 {}",
            target.name(),
            paired(&|p| p.cpu_us),
            paired(&|p| Some(p.rate)),
            paired(&|p| Some(p.p99_us)),
        );
    }
}

async fn run(args: Args) -> anyhow::Result<()> {
    let tools = Tools {
        wrk: which("wrk"),
        h2load: which("h2load"),
        nginx: which("nginx"),
    };
    for (name, found, package) in [
        ("wrk", tools.wrk.is_some(), "wrk"),
        ("h2load", tools.h2load.is_some(), "nghttp2-client"),
        ("nginx", tools.nginx.is_some(), "nginx-light"),
    ] {
        if !found {
            println!("{name} is not installed (apt-get install {package}): its phases are skipped");
        }
    }
    let shapes: Vec<Shape> = args
        .shapes
        .iter()
        .copied()
        .filter(|s| match s {
            Shape::H2 => tools.h2load.is_some(),
            _ => tools.wrk.is_some(),
        })
        .collect();
    if shapes.is_empty() {
        println!("no load generator installed: nothing to measure");
        return Ok(());
    }
    let dir = tempdir()?;
    for shape in &shapes {
        std::fs::write(
            dir.join(format!("{}.lua", shape.name())),
            wrk_script(*shape, args.keys),
        )?;
    }
    let net = Net::start_with_lease_ttl(&["iad", "fra", "sin"], LEASE_TTL_MS).await?;
    let mut hot = net.start_host(0, HOT_KEY).await?;
    let mut key_hosts = Vec::new();
    if shapes.contains(&Shape::Keys) {
        for i in 0..KEY_HOSTS {
            let dc = i % net.dcs().len();
            key_hosts.push((dc, net.start_host(dc, &format!("host-{i}")).await?));
        }
        let started = Instant::now();
        reserve_keys(&net, &key_hosts, args.keys).await?;
        println!(
            "reserved {} keys over {KEY_HOSTS} actor hosts in {:.1} s",
            args.keys,
            started.elapsed().as_secs_f64()
        );
    }
    let key_addrs: Vec<SocketAddr> = key_hosts.iter().map(|(_, h)| h.local_addr()).collect();
    let hosts_arg = if key_addrs.is_empty() {
        hot.local_addr().to_string()
    } else {
        key_addrs
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(",")
    };

    let dcs = net.dcs();
    let table = dcs
        .iter()
        .map(|(id, addr)| format!("{id}={addr}"))
        .collect::<Vec<_>>()
        .join(",");
    let threads = args.proxy_threads.to_string();
    let exe = std::env::current_exe()?;
    let router_args = [
        "--router-child".to_string(),
        net.certs().display().to_string(),
        table,
        threads.clone(),
    ];
    let mut router = ProxyChild::start(&exe, &router_args)?;
    let mut before = match &args.router_before {
        Some(path) => Some(ProxyChild::start(path, &router_args)?),
        None => None,
    };
    let mut hyper = ProxyChild::start(
        &exe,
        &[
            "--hyper-child".to_string(),
            threads,
            hot.local_addr().to_string(),
            hosts_arg,
        ],
    )?;
    let nginx = match &tools.nginx {
        Some(path) => {
            let many = if key_addrs.is_empty() {
                vec![hot.local_addr()]
            } else {
                key_addrs.clone()
            };
            Some(start_nginx(path, &dir, hot.local_addr(), &many)?)
        }
        None => None,
    };
    if shapes.contains(&Shape::Keys) {
        let started = Instant::now();
        warm_keys(router.addrs[0], args.keys).await?;
        if let Some(before) = &before {
            warm_keys(before.addrs[0], args.keys).await?;
        }
        println!(
            "router cache warmed with {} keys in {:.1} s",
            args.keys,
            started.elapsed().as_secs_f64()
        );
    }

    let ticks = clk_tck();
    println!(
        "\nproxies: wrk/h2load -t1 -c{} -d{}s per phase, {} rounds after a warm-up round, phases \
         alternating (direct, nginx, hyper proxy[, edge-router before], edge-router); routers \
         and hyper proxy on {} thread(s), \
         nginx one process (master_process off); router pid {}, hyper pid {}{}",
        args.connections,
        args.phase_s,
        args.rounds,
        args.proxy_threads,
        router.child.id(),
        hyper.child.id(),
        nginx
            .as_ref()
            .map_or(String::new(), |(c, _)| format!(", nginx pid {}", c.id()))
    );
    println!("load average before: {}", load_average());
    let mut results: BTreeMap<Shape, BTreeMap<Target, Vec<Phase>>> = BTreeMap::new();
    for round in 0..=args.rounds {
        for &shape in &shapes {
            let direct = match shape {
                Shape::Keys => key_addrs.first().copied().unwrap_or(hot.local_addr()),
                _ => hot.local_addr(),
            };
            let mut targets = vec![(Target::Direct, direct, None)];
            if let Some((child, ports)) = &nginx {
                let port = match shape {
                    Shape::Keys => ports[1],
                    Shape::H2 => ports[2],
                    Shape::Hot | Shape::Post => ports[0],
                };
                targets.push((Target::Nginx, port, Some(child.id())));
            }
            let hyper_addr = hyper.addrs[usize::from(shape == Shape::Keys)];
            targets.push((Target::Hyper, hyper_addr, Some(hyper.child.id())));
            if let Some(before) = &before {
                targets.push((
                    Target::RouterBefore,
                    before.addrs[0],
                    Some(before.child.id()),
                ));
            }
            targets.push((Target::Router, router.addrs[0], Some(router.child.id())));
            for (target, addr, pid) in targets {
                let phase = drive(&tools, &dir, shape, &args, addr, pid, ticks)
                    .with_context(|| format!("{} {}", shape.name(), target.name()))?;
                // Round 0 warms every path (connections, pools, caches) and is not counted.
                if round > 0 {
                    results
                        .entry(shape)
                        .or_default()
                        .entry(target)
                        .or_default()
                        .push(phase);
                }
            }
        }
    }
    println!("load average after: {}", load_average());
    for (shape, phases) in &results {
        report(*shape, phases);
    }

    if !args.no_moves && shapes.contains(&Shape::Hot) {
        let before = router.counts()?;
        let phase_s = args.phase_s.max(3) * 2;
        let moving = {
            let (wrk_path, dir, connections) = (tools.wrk.clone(), dir.clone(), args.connections);
            let addr = router.addrs[0];
            std::thread::spawn(move || {
                wrk(
                    wrk_path.as_deref(),
                    &dir,
                    Shape::Hot,
                    (connections, phase_s),
                    addr,
                )
            })
        };
        let started = Instant::now();
        let phase = Duration::from_secs(phase_s);
        let (mut moves, mut dc) = (0, 0);
        while started.elapsed() + Duration::from_millis(MOVE_INTERVAL_MS) < phase {
            tokio::time::sleep(Duration::from_millis(MOVE_INTERVAL_MS)).await;
            dc = (dc + 1) % dcs.len();
            hot.stop().await?;
            hot = net.start_host(dc, HOT_KEY).await?;
            moves += 1;
        }
        let moved = moving
            .join()
            .map_err(|_| anyhow::anyhow!("wrk thread panicked"))??;
        let after = router.counts()?;
        let diff = |i: usize| after[i] - before[i];
        println!(
            "\n### moves: {moves} (one per second) under load through the router\n\n\
             {} requests, {:.0} req/s, p50 {:.0} µs, p99 {:.0} µs; failed (wrk: non-2xx + socket errors): {}; \
             router: {} retried after report_unreachable, {} answered with an error, {} resolves walked",
            moved.requests,
            moved.rate,
            moved.p50_us,
            moved.p99_us,
            moved.errors,
            diff(3),
            diff(4),
            diff(2)
        );
    }

    router.stop();
    if let Some(before) = &mut before {
        before.stop();
    }
    hyper.stop();
    if let Some((mut child, _)) = nginx {
        let _ = child.kill();
        let _ = child.wait();
    }
    hot.stop().await?;
    for (_, host) in key_hosts {
        host.stop().await?;
    }
    net.shutdown().await;
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

fn tempdir() -> anyhow::Result<PathBuf> {
    let dir = std::env::temp_dir().join(format!("homing-proxies-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    if let Some(child) = &args.router_child {
        return router_child(child);
    }
    if let Some(child) = &args.hyper_child {
        return hyper_child(child);
    }
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?
        .block_on(run(args))
}
