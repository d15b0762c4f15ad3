//! `homing bench SUITE`: end-to-end benchmarks of DESIGN.md §4 through real
//! homingd instances (an in-process devnet over QUIC + mutual TLS with redb
//! stores), each printing homing next to its model or baseline in one run.

mod cli;
mod flood;
mod hold;
mod renew;
mod reserve;
mod resolve_absent;
mod resolve_cold;
mod svg;

use crate::host_now;
use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use clap::{Args, ValueEnum};
use homing_core::{ActorId, Key, KeyConfig, KeyName, Request};

/// Options of `homing bench`.
#[derive(Debug, Args)]
pub struct BenchArgs {
    /// The suite to run.
    #[arg(value_enum)]
    suite: Suite,
    /// Directory for plots.
    #[arg(long, default_value = "target/homing-bench")]
    out: PathBuf,
    /// Concurrent clients per cell (comma-separated) for the suites that
    /// scale (`reserve`, `resolve-cold`); default 1,8,64,256.
    #[arg(long, value_delimiter = ',')]
    tasks: Vec<usize>,
    /// Repetitions per cell (the median is reported); default 3.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=99))]
    repetitions: u32,
    /// Length of one load cell, in milliseconds.
    #[arg(long, default_value_t = 2_000, value_parser = clap::value_parser!(u64).range(100..=600_000))]
    cell_ms: u64,
    /// `flood`: forged QUIC Initials per second to aim at homingd.
    #[arg(long, default_value_t = 100_000, value_parser = clap::value_parser!(u64).range(1..=10_000_000))]
    flood_rate: u64,
    /// `flood`: length of each flood, in milliseconds (the phases before
    /// and after last `--cell-ms`).
    #[arg(long, default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(100..=120_000))]
    flood_ms: u64,
    /// `flood`: idle TCP connections to hold at the edge router: its
    /// `connections_max`, with 5 % more attackers (in a child process; each
    /// process raises its soft fd limit to the hard one, see `ulimit -Hn`).
    #[arg(long, default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(1..=100_000))]
    idle_connections: u64,
    /// `idle-attacker` (flood's child process): the router to attack.
    #[arg(long, hide = true)]
    attack: Option<std::net::SocketAddr>,
    /// `session-reap`: keys under the session that dies (acquired through
    /// homingd before the clock starts).
    #[arg(long, default_value_t = 20_000, value_parser = clap::value_parser!(u64).range(1..=10_000_000))]
    reap_keys: u64,
    /// `session-hold`: host sessions opened.
    #[arg(long, default_value_t = 1_000, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    sessions: u64,
    /// `session-hold`: keys acquired under each session.
    #[arg(long, default_value_t = 1_000, value_parser = clap::value_parser!(u64).range(1..=10_000_000))]
    session_keys: u64,
    /// `session-hold`: how long the leases are held once every key is
    /// acquired, in milliseconds.
    #[arg(long, default_value_t = 60_000, value_parser = clap::value_parser!(u64).range(1_000..=3_600_000))]
    hold_ms: u64,
    /// `session-hold`, `session-reap`: homingd's `redb_cache_mb` (redb's
    /// page cache per store file, MiB; default redb's own, 1024).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=1_048_576))]
    redb_cache_mb: Option<u64>,
    /// Only the throughput cells (`resolve-cold`: skips the latency-per-chain-length
    /// part and its model table).
    #[arg(long)]
    throughput_only: bool,
}

/// How long and how often each load cell runs, and at which concurrencies.
#[derive(Debug, Clone)]
struct Load {
    tasks: Vec<usize>,
    repetitions: usize,
    cell: Duration,
    throughput_only: bool,
}

/// Concurrencies measured when `--tasks` is not given.
const TASKS_DEFAULT: [usize; 4] = [1, 8, 64, 256];

impl BenchArgs {
    fn load(&self) -> Load {
        let mut tasks = if self.tasks.is_empty() {
            TASKS_DEFAULT.to_vec()
        } else {
            self.tasks.iter().map(|&t| t.max(1)).collect()
        };
        tasks.sort_unstable();
        tasks.dedup();
        Load {
            tasks,
            repetitions: self.repetitions as usize,
            cell: Duration::from_millis(self.cell_ms),
            throughput_only: self.throughput_only,
        }
    }
}

/// A benchmark suite.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Suite {
    /// Cold resolves through chains of 0–3 links and keys moved 16 and 1,000 times, 4 DCs 20 ms apart, vs the cost model.
    ResolveCold,
    /// Resolves of absent keys at one homingd: global reads per resolve with its absent cache off and on.
    ResolveAbsent,
    /// Reservations/s through homingd vs the raw global store at 1/8/64/256 clients.
    Reserve,
    /// The same with a 3-member etcd cluster as the global store (feature `etcd`).
    ReserveEtcd,
    /// Renewals/s of 10 k leases by 64 concurrent tasks.
    Renew,
    /// The same with the DC store on a 3-member etcd, vs etcd's own guarded put (feature `etcd`).
    RenewEtcd,
    /// `--sessions` host sessions of `--session-keys` keys each held `--hold-ms` on one homingd, each renewed on its own schedule: renewal p50/p99, missed soft deadlines, store bytes and RSS per lease.
    SessionHold,
    /// One host session of `--reap-keys` keys stops renewing: when the reaper has released them all, the reap rate, other sessions' renewal p99 meanwhile.
    SessionReap,
    /// Resolve p50/p99 before, during and after 100 k forged QUIC Initials/s at homingd and 10 k idle TCP connections at the edge router.
    Flood,
    /// What a script pays per call: `homing resolve` as a new process, beside a process that does nothing, medians of 100.
    Cli,
    /// Cached resolve (a separate program: prints its command).
    ResolveCached,
    /// Transport (a separate program: prints its command).
    Transport,
    /// The simulator (a separate program: prints its command).
    Simulator,
    /// The attackers of `flood`'s idle connections, run by `flood` in a child process.
    #[value(hide = true)]
    IdleAttacker,
}

/// Runs one suite.
pub async fn run(args: BenchArgs) -> anyhow::Result<bool> {
    match args.suite {
        Suite::ResolveCold => resolve_cold::run(&args.out, &args.load()).await,
        Suite::ResolveAbsent => resolve_absent::run(&args.load()).await,
        Suite::Cli => cli::run().await,
        Suite::Reserve => reserve::run(&args.out, &args.load()).await,
        #[cfg(feature = "etcd")]
        Suite::ReserveEtcd => reserve::run_etcd(&args.out, &args.load()).await,
        #[cfg(not(feature = "etcd"))]
        Suite::ReserveEtcd => Ok(needs_etcd("reserve-etcd")),
        Suite::Renew => renew::run().await,
        Suite::SessionHold => {
            let shape = hold::Shape {
                sessions: args.sessions as usize,
                keys_per_session: args.session_keys as usize,
                hold: Duration::from_millis(args.hold_ms),
                redb_cache_mb: args.redb_cache_mb,
            };
            hold::run(shape).await
        }
        Suite::SessionReap => renew::run_reap(args.reap_keys as usize, args.redb_cache_mb).await,
        Suite::Flood => {
            let flood = flood::Flood {
                rate: args.flood_rate,
                flood: Duration::from_millis(args.flood_ms),
                idle_connections: args.idle_connections as usize,
            };
            flood::run(&args.load(), &flood).await
        }
        Suite::IdleAttacker => {
            let Some(at) = args.attack else {
                anyhow::bail!("idle-attacker needs --attack ADDR (flood starts it)");
            };
            let length = Duration::from_millis(args.flood_ms);
            flood::attacker(at, args.idle_connections as usize, length).await
        }
        #[cfg(feature = "etcd")]
        Suite::RenewEtcd => renew::run_etcd().await,
        #[cfg(not(feature = "etcd"))]
        Suite::RenewEtcd => Ok(needs_etcd("renew-etcd")),
        Suite::ResolveCached => {
            separate(
                "cargo run --release -p homing-client --example resolve_bench",
                "cached resolve vs bare moka / HashMap lookups, and on 1 vs 2 threads \
                 (`-- --threads 1,2` for that part alone)",
            );
            Ok(true)
        }
        Suite::Transport => {
            separate(
                "cargo run --release -p homing-net --example net_bench",
                "homing-net request/reply vs a bare quinn echo",
            );
            Ok(true)
        }
        Suite::Simulator => {
            separate(
                "cargo run --release -p homing-sim -- run simulations/scenarios/baseline.toml --seed 1",
                "the discrete-event simulator, RTTs per operation vs the cost model",
            );
            Ok(true)
        }
    }
}

/// Says how to run an etcd suite in a build without the backend; `true`
/// (nothing was measured, nothing missed).
#[cfg(not(feature = "etcd"))]
fn needs_etcd(suite: &str) -> bool {
    println!(
        "{suite} needs the etcd backend: \
         cargo run --release --features etcd --bin homing -- bench {suite}"
    );
    true
}

fn separate(command: &str, what: &str) {
    println!("this suite is a separate program ({what}); run:");
    println!("   {command}");
}

/// A short tag unique to this run, so keys never collide with earlier runs.
/// Leases long enough to outlive any suite: the reaper has nothing to do.
const LEASE_TTL_MS: u64 = 600_000;

/// A 1-DC devnet with long leases, and a host client of that DC.
struct OneDc {
    net: homing_daemon::Devnet,
    dc: homing_core::DcId,
    client: homing_net::Client,
    peer: homing_net::Peer,
}

impl OneDc {
    async fn start() -> anyhow::Result<OneDc> {
        let dc = homing_core::DcId::new("dc0")?;
        let net = homing_daemon::Devnet::start(homing_daemon::DevnetOptions {
            dcs: vec![dc.clone()],
            overrides: homing_daemon::Settings {
                lease_ttl_ms: Some(LEASE_TTL_MS),
                ..homing_daemon::Settings::default()
            },
            ..homing_daemon::DevnetOptions::default()
        })
        .await?;
        let client = net.client(homing_core::Role::Host, Some(&dc))?;
        let peer = net.peer(&dc);
        Ok(OneDc {
            net,
            dc,
            client,
            peer,
        })
    }
}

/// A 1-DC daemon like [`OneDc`]'s but over a global store of the caller's
/// (the devnet always opens its own redb one), with a redb DC store.
#[cfg(feature = "etcd")]
struct OwnGlobalDc {
    daemon: homing_daemon::Daemon,
    dc: homing_core::DcId,
    client: homing_net::Client,
    peer: homing_net::Peer,
    _dir: tempfile::TempDir,
}

#[cfg(feature = "etcd")]
impl OwnGlobalDc {
    async fn start(global: Arc<dyn homing_store::GlobalStore>) -> anyhow::Result<OwnGlobalDc> {
        OwnGlobalDc::start_with(global, None).await
    }

    /// [`OwnGlobalDc::start`] with the caller's DC store too (`None`: a redb
    /// one in a temporary directory).
    async fn start_with(
        global: Arc<dyn homing_store::GlobalStore>,
        records: Option<Arc<dyn homing_store::DcStore>>,
    ) -> anyhow::Result<OwnGlobalDc> {
        use homing_core::{Identity, Role};
        use homing_net::pki::load_identity;
        let dc = homing_core::DcId::new("dc0")?;
        let dir = tempfile::Builder::new()
            .prefix("homing-bench-dc-")
            .tempdir()?;
        let certs = dir.path().join("certs");
        homing_net::generate_dev_pki(&certs, std::slice::from_ref(&dc))?;
        let config = homing_daemon::Config::from_settings(homing_daemon::Settings {
            dc: Some(dc.to_string()),
            listen: Some(std::net::SocketAddr::from(([127, 0, 0, 1], 0))),
            data_dir: Some(dir.path().join("data")),
            ca_cert: Some(certs.join("ca.pem")),
            cert: Some(certs.join(format!("node-{dc}.pem"))),
            key: Some(certs.join(format!("node-{dc}.key"))),
            lease_ttl_ms: Some(LEASE_TTL_MS),
            ..homing_daemon::Settings::default()
        })?;
        std::fs::create_dir_all(&config.data_dir)?;
        let records: Arc<dyn homing_store::DcStore> = match records {
            Some(records) => records,
            None => Arc::new(homing_store::RedbDcStore::open(
                config.data_dir.join("dc.redb"),
                homing_store::RedbOptions::default(),
            )?),
        };
        let node_tls = load_identity(&certs, &Identity::new(Role::Node, Some(dc.clone()))?)?;
        let daemon = homing_daemon::Daemon::start(&config, &node_tls, global, records).await?;
        let host_tls = load_identity(&certs, &Identity::new(Role::Host, Some(dc.clone()))?)?;
        let client = homing_net::Client::new(&host_tls, homing_net::ClientLimits::default())?;
        let peer = homing_net::Peer {
            addr: daemon.local_addr(),
            dc: dc.clone(),
        };
        Ok(OwnGlobalDc {
            daemon,
            dc,
            client,
            peer,
            _dir: dir,
        })
    }
}

fn run_tag() -> String {
    format!("{:x}", host_now().as_ms())
}

/// An acquire of `key` for a bench actor, under `lease`.
fn acquire_request(key: &Key, lease: homing_core::LeaseKey) -> anyhow::Result<Request> {
    Ok(Request::Acquire {
        config: KeyConfig {
            name: Some(key.name.clone()),
            namespace: key.namespace.clone(),
            tag: None,
        },
        actor: ActorId::new("bench-host:9000")?,
        lease,
        host_time: host_now(),
        wait_ms: 0,
    })
}

/// The key `name`.
fn key(name: String) -> anyhow::Result<Key> {
    Ok(Key::new(KeyName::new(name)?))
}

/// The `q` quantile (0..=1) of sorted samples; 0 when empty.
fn quantile(sorted: &[u64], q: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let i = ((sorted.len() - 1) as f64 * q).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

/// What a devnet DC's leases cost at one moment: its DC store file's and
/// the global store file's sizes, and this process's RSS, in bytes.
struct Footprint([u64; 3]);

impl Footprint {
    fn of(net: &homing_daemon::Devnet, dc: &homing_core::DcId) -> Footprint {
        let size = |p: std::path::PathBuf| std::fs::metadata(p).map_or(0, |m| m.len());
        let dc_file = net.dir().join(dc.as_str()).join(format!("dc-{dc}.redb"));
        Footprint([
            size(dc_file),
            size(net.dir().join("global.redb")),
            rss_bytes(),
        ])
    }

    /// Bytes per lease of each, grown since `before`, over `leases`.
    fn per_lease(&self, before: &Footprint, leases: usize) -> [f64; 3] {
        let grown = |i: usize| self.0[i].saturating_sub(before.0[i]) as f64;
        [0, 1, 2].map(|i| grown(i) / leases.max(1) as f64)
    }
}

/// Resident set size of this process, in bytes (0 where /proc is not
/// there); pages of 4 KiB, as on the Linux hosts benchmarks run on.
fn rss_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1)?.parse::<u64>().ok())
        .map_or(0, |pages| pages * 4096)
}

/// The median of `xs` (the upper one for an even count); 0 when empty.
fn median(mut xs: Vec<f64>) -> f64 {
    if xs.is_empty() {
        return 0.0;
    }
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

/// `n` with thousands separators.
fn thousands(n: f64) -> String {
    let s = format!("{:.0}", n.max(0.0));
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// Writes `svg` to `dir/name` and returns the path written.
fn write_plot(dir: &std::path::Path, name: &str, svg: &str) -> anyhow::Result<PathBuf> {
    use anyhow::Context;
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let path = dir.join(name);
    std::fs::write(&path, svg).with_context(|| format!("writing {}", path.display()))?;
    Ok(std::fs::canonicalize(&path).unwrap_or(path))
}

/// What one load cell measured.
#[derive(Debug, Clone, Copy)]
struct Cell {
    /// Successful operations per second.
    rate: f64,
    /// Median latency of successful operations, in microseconds.
    p50_us: u64,
    /// 99th percentile latency, in microseconds.
    p99_us: u64,
    /// Mean latency of successful operations, in microseconds.
    mean_us: f64,
    /// CPU time this whole process (load generator, daemons, stores) spent
    /// per successful operation, in microseconds; 0 where unreadable.
    cpu_us_per_op: f64,
    /// Operations that failed.
    errors: u64,
}

/// Runs `op(n)` for fresh `n` from `tasks` concurrent tasks for `duration`
/// and measures the rate and latency of the ones that succeed.
async fn run_cell<F, Fut>(tasks: usize, duration: Duration, op: F) -> anyhow::Result<Cell>
where
    F: Fn(u64) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = anyhow::Result<()>> + Send + 'static,
{
    let next = Arc::new(AtomicU64::new(0));
    let cpu_before = process_cpu_us();
    let first_error = Arc::new(std::sync::Mutex::new(None::<String>));
    let started = Instant::now();
    let deadline = started + duration;
    let handles: Vec<_> = (0..tasks)
        .map(|_| {
            let (op, next, first_error) = (op.clone(), next.clone(), first_error.clone());
            tokio::spawn(async move {
                let mut latencies = Vec::new();
                let mut errors = 0u64;
                while Instant::now() < deadline {
                    let n = next.fetch_add(1, Ordering::Relaxed);
                    let t = Instant::now();
                    match op(n).await {
                        Ok(()) => latencies.push(t.elapsed().as_micros() as u64),
                        Err(e) => {
                            errors += 1;
                            if let Ok(mut first) = first_error.lock() {
                                first.get_or_insert_with(|| format!("{e:#}"));
                            }
                        }
                    }
                }
                (latencies, errors)
            })
        })
        .collect();
    let mut all = Vec::new();
    let mut errors = 0;
    for h in handles {
        let (latencies, e) = h.await?;
        all.extend(latencies);
        errors += e;
    }
    let elapsed = started.elapsed().as_secs_f64();
    let cpu_us = process_cpu_us()
        .zip(cpu_before)
        .map(|(a, b)| a.saturating_sub(b));
    if let Ok(first) = first_error.lock()
        && let Some(e) = first.as_ref()
    {
        eprintln!("   ({errors} failed operations at {tasks} tasks; first: {e})");
    }
    all.sort_unstable();
    let mean_us = all.iter().sum::<u64>() as f64 / all.len().max(1) as f64;
    Ok(Cell {
        rate: all.len() as f64 / elapsed,
        mean_us,
        p50_us: quantile(&all, 0.5),
        p99_us: quantile(&all, 0.99),
        cpu_us_per_op: cpu_us.map_or(0.0, |us| us as f64 / all.len().max(1) as f64),
        errors,
    })
}

/// Linux's clock ticks per second for `/proc/self/stat` (USER_HZ, 100 on
/// every Linux platform Rust targets).
const USER_HZ: u64 = 100;

/// User + system CPU time of this process so far, in microseconds (from
/// `/proc/self/stat`, 10 ms resolution); `None` off Linux.
fn process_cpu_us() -> Option<u64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // Fields after the command name (which may hold spaces) are
    // space-separated; utime and stime are fields 14 and 15 of the line.
    let after_comm = stat.rsplit_once(')')?.1;
    let fields: Vec<&str> = after_comm.split_whitespace().collect();
    let ticks = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    Some(ticks * 1_000_000 / USER_HZ)
}

/// The cell with the median rate of `cells`, its latencies the medians of all.
fn median_cell(cells: &[Cell]) -> Cell {
    Cell {
        rate: median(cells.iter().map(|c| c.rate).collect()),
        p50_us: median(cells.iter().map(|c| c.p50_us as f64).collect()) as u64,
        p99_us: median(cells.iter().map(|c| c.p99_us as f64).collect()) as u64,
        mean_us: median(cells.iter().map(|c| c.mean_us).collect()),
        cpu_us_per_op: median(cells.iter().map(|c| c.cpu_us_per_op).collect()),
        errors: cells.iter().map(|c| c.errors).sum(),
    }
}

/// Totals of one duration histogram in a daemon's metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
struct Timed {
    seconds: f64,
    count: u64,
}

/// The `_sum` and `_count` of every `name{label="…"}` histogram in a
/// Prometheus text rendering (homingd's `/metrics`), by label value.
fn histogram_totals(
    render: &str,
    name: &str,
    label: &str,
) -> std::collections::BTreeMap<String, Timed> {
    let mut out = std::collections::BTreeMap::<String, Timed>::new();
    for line in render.lines() {
        let Some(rest) = line.strip_prefix(name) else {
            continue;
        };
        let (is_sum, rest) = if let Some(r) = rest.strip_prefix("_sum{") {
            (true, r)
        } else if let Some(r) = rest.strip_prefix("_count{") {
            (false, r)
        } else {
            continue;
        };
        let Some((labels, value)) = rest.split_once("} ") else {
            continue;
        };
        let Some(which) = labels
            .strip_prefix(&format!("{label}=\""))
            .and_then(|v| v.strip_suffix('"'))
        else {
            continue;
        };
        let entry = out.entry(which.to_string()).or_default();
        if is_sum {
            entry.seconds = value.trim().parse().unwrap_or(0.0);
        } else {
            entry.count = value.trim().parse().unwrap_or(0);
        }
    }
    out
}

impl Timed {
    /// Mean microseconds per operation; `None` when nothing was counted.
    fn mean_us(&self) -> Option<f64> {
        (self.count > 0).then(|| self.seconds * 1e6 / self.count as f64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_and_medians() {
        let xs: Vec<u64> = (1..=100).collect();
        assert_eq!(quantile(&xs, 0.5), 51);
        assert_eq!(quantile(&xs, 0.99), 99);
        assert_eq!(quantile(&[], 0.5), 0);
        assert_eq!(median(vec![3.0, 1.0, 2.0]), 2.0);
    }

    #[test]
    fn histogram_totals_read_sums_and_counts_by_label() {
        let render = "# TYPE homing_store_duration_seconds histogram\n\
            homing_store_duration_seconds_bucket{op=\"dc_cas\",le=\"0.001\"} 3\n\
            homing_store_duration_seconds_sum{op=\"dc_cas\"} 0.004\n\
            homing_store_duration_seconds_count{op=\"dc_cas\"} 4\n\
            homing_request_duration_seconds_sum{kind=\"acquire\"} 1\n";
        let totals = histogram_totals(render, "homing_store_duration_seconds", "op");
        assert_eq!(
            totals.get("dc_cas"),
            Some(&Timed {
                seconds: 0.004,
                count: 4
            })
        );
        assert_eq!(totals.len(), 1);
        let mean = totals.get("dc_cas").and_then(Timed::mean_us).unwrap();
        assert!((mean - 1000.0).abs() < 1e-6);
    }

    #[test]
    fn thousands_separates() {
        assert_eq!(thousands(1234567.4), "1,234,567");
        assert_eq!(thousands(999.0), "999");
        assert_eq!(thousands(1000.0), "1,000");
    }
}
