//! `homing bench SUITE`: end-to-end benchmarks of DESIGN.md §4 through real
//! homingd instances (an in-process devnet over QUIC + mutual TLS with redb
//! stores), each printing homing next to its model or baseline in one run.

mod renew;
mod reserve;
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
}

/// A benchmark suite.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Suite {
    /// Cold resolves through chains of 0–3 links, 4 DCs 20 ms apart, vs the cost model.
    ResolveCold,
    /// Reservations/s through homingd vs the raw global store at 1/8/64/256 clients.
    Reserve,
    /// Renewals/s of 10 k leases by 64 concurrent tasks.
    Renew,
    /// Cached resolve (a separate program: prints its command).
    ResolveCached,
    /// Transport (a separate program: prints its command).
    Transport,
    /// The simulator (a separate program: prints its command).
    Simulator,
}

/// Runs one suite.
pub async fn run(args: BenchArgs) -> anyhow::Result<bool> {
    match args.suite {
        Suite::ResolveCold => resolve_cold::run(&args.out).await,
        Suite::Reserve => reserve::run(&args.out).await,
        Suite::Renew => renew::run().await,
        Suite::ResolveCached => {
            separate(
                "cargo run --release -p homing-client --example resolve_bench",
                "cached resolve vs bare moka / HashMap lookups",
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

fn run_tag() -> String {
    format!("{:x}", host_now().as_ms())
}

/// An acquire of `key` for a bench actor.
fn acquire_request(key: &Key) -> anyhow::Result<Request> {
    Ok(Request::Acquire {
        config: KeyConfig {
            name: Some(key.name.clone()),
            namespace: key.namespace.clone(),
            tag: None,
        },
        actor: ActorId::new("bench-host:9000")?,
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
    if let Ok(first) = first_error.lock()
        && let Some(e) = first.as_ref()
    {
        eprintln!("   ({errors} failed operations at {tasks} tasks; first: {e})");
    }
    all.sort_unstable();
    Ok(Cell {
        rate: all.len() as f64 / elapsed,
        p50_us: quantile(&all, 0.5),
        p99_us: quantile(&all, 0.99),
        errors,
    })
}

/// The cell with the median rate of `cells`, its latencies the medians of all.
fn median_cell(cells: &[Cell]) -> Cell {
    Cell {
        rate: median(cells.iter().map(|c| c.rate).collect()),
        p50_us: median(cells.iter().map(|c| c.p50_us as f64).collect()) as u64,
        p99_us: median(cells.iter().map(|c| c.p99_us as f64).collect()) as u64,
        errors: cells.iter().map(|c| c.errors).sum(),
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
    fn thousands_separates() {
        assert_eq!(thousands(1234567.4), "1,234,567");
        assert_eq!(thousands(999.0), "999");
        assert_eq!(thousands(1000.0), "1,000");
    }
}
