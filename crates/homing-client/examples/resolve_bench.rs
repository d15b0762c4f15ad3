//! The cached hot path of `Resolver::resolve` against the bars it must stay
//! close to: a bare `moka::future::Cache::get`, a `moka::sync::Cache::get`
//! and a `HashMap` lookup of the same 40-byte keys, on one core (a
//! current-thread runtime), at 10 k and 1 M keys; then memory per cached key
//! at 1 M keys (RSS growth while priming, divided by the key count); then
//! throughput on 1 and 2 threads sharing one cache (each thread its own
//! current-thread runtime), next to a bare moka get and a shared `HashMap`
//! (which takes no lock: the most the machine's cores give at that moment).
//!
//! `cargo run --release -p homing-client --example resolve_bench`
//! (`-- --threads 1,2` runs only the thread scaling)
//!
//! Targets (issue 7): cached resolve ≤ 2× bare moka get; ≤ 200 bytes per key.
//! Issue 22: on 2 threads ≥ 1.8× one thread's throughput.

use std::collections::HashMap;
use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

use homing_client::{Resolution, Resolver, ResolverConfig};
use homing_core::{ActorId, DcId, FencingToken, Identity, Key, KeyName, ReservationId, Role};
use homing_net::{Client, ClientLimits, DevCa};

/// Key counts measured.
const SIZES: [usize; 2] = [10_000, 1_000_000];
/// Lookups per timed repetition.
const LOOKUPS_PER_REP: usize = 2_000_000;
/// Repetitions per measurement; the median is reported.
const REPS: usize = 5;
/// Bytes per page in /proc/self/statm (4 KiB on the x86-64/aarch64 Linux hosts we run on).
const PAGE_BYTES: u64 = 4096;
/// Long enough that no primed answer expires during the run.
const TTL_MS: u64 = 3_600_000;

/// Threads of the scaling measurement.
const SCALING_THREADS: [usize; 2] = [1, 2];
/// Keys in the cache of the scaling measurement.
const SCALING_KEYS: usize = 10_000;
/// Lookups per thread per repetition of the scaling measurement.
const SCALING_LOOKUPS_PER_THREAD: usize = 2_000_000;

/// Keys for the memory measurement.
const MEMORY_KEYS: usize = 1_000_000;
/// What the memory measurement fills, each in a fresh child process so that
/// memory freed by an earlier fill does not hide the next one's growth.
const MEMORY_SUBJECTS: [(&str, &str); 3] = [
    ("resolver", "Resolver (answer cache primed)"),
    ("moka-arc", "moka::future::Cache<Key, Arc<Resolution>>"),
    ("moka-unit", "moka::future::Cache<Key, ()>"),
];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let args: Vec<String> = std::env::args().collect();
    if let [_, mode, subject] = args.as_slice()
        && mode == "--memory"
    {
        let bytes = runtime.block_on(fill(subject))?;
        println!("{bytes}");
        return Ok(());
    }
    if let [_, mode, threads] = args.as_slice()
        && mode == "--threads"
    {
        let threads: Vec<usize> = threads
            .split(',')
            .map(str::parse)
            .collect::<Result<_, _>>()?;
        return runtime.block_on(scaling(&threads));
    }
    runtime.block_on(run())?;
    runtime.block_on(scaling(&SCALING_THREADS))?;
    println!(
        "memory per cached key, {MEMORY_KEYS} keys (RSS growth while filling / keys; fresh process each):"
    );
    for (subject, name) in MEMORY_SUBJECTS {
        let out = std::process::Command::new(std::env::current_exe()?)
            .args(["--memory", subject])
            .output()?;
        let bytes: u64 = String::from_utf8_lossy(&out.stdout).trim().parse()?;
        println!("  {name:<44} {:>6} bytes/key", bytes / MEMORY_KEYS as u64);
    }
    Ok(())
}

/// Fills one cache with [`MEMORY_KEYS`] answers; returns the RSS growth in bytes.
async fn fill(subject: &str) -> Result<u64, Box<dyn std::error::Error>> {
    let iad = DcId::new("iad")?;
    let keys: Vec<Key> = (0..MEMORY_KEYS).map(key).collect::<Result<_, _>>()?;
    let resolutions: Vec<Resolution> = keys
        .iter()
        .enumerate()
        .map(|(i, k)| resolution(k.clone(), &iad, i as u64))
        .collect::<Result<_, _>>()?;
    let capacity = 2 * MEMORY_KEYS as u64;
    let ttl = Duration::from_millis(TTL_MS);
    let before = rss_bytes();
    match subject {
        "resolver" => {
            let ca = DevCa::generate("bench ca")?;
            let tls = ca.tls_identity(&Identity::new(Role::Router, None)?)?;
            let client = Client::new(&tls, ClientLimits::default())?;
            let config = ResolverConfig {
                cache_entries: capacity,
                tail_ttl_ms: TTL_MS,
                ..ResolverConfig::new(vec![(iad.clone(), "127.0.0.1:9".parse()?)])
            };
            // Made one at a time below: a `Vec` of them freed while
            // filling would hide as much as it held.
            drop(resolutions);
            let before = rss_bytes(); // the client and its endpoint are not cache memory
            let resolver = Resolver::new(client, config);
            for (i, k) in keys.iter().enumerate() {
                resolver.prime(resolution(k.clone(), &iad, i as u64)?).await;
            }
            return Ok(rss_bytes().saturating_sub(before));
        }
        "moka-arc" => {
            let cache: moka::future::Cache<Key, Arc<Resolution>> = moka::future::Cache::builder()
                .max_capacity(capacity)
                .time_to_live(ttl)
                .build();
            for r in resolutions {
                cache.insert(r.key.clone(), Arc::new(r)).await;
            }
            cache.run_pending_tasks().await;
        }
        _ => {
            let cache: moka::future::Cache<Key, ()> = moka::future::Cache::builder()
                .max_capacity(capacity)
                .time_to_live(ttl)
                .build();
            drop(resolutions);
            let before = rss_bytes();
            for k in keys {
                cache.insert(k, ()).await;
            }
            cache.run_pending_tasks().await;
            return Ok(rss_bytes().saturating_sub(before));
        }
    }
    Ok(rss_bytes().saturating_sub(before))
}

async fn run() -> Result<(), Box<dyn std::error::Error>> {
    let ca = DevCa::generate("bench ca")?;
    let tls = ca.tls_identity(&Identity::new(Role::Router, None)?)?;
    let client = Client::new(&tls, ClientLimits::default())?;
    let iad = DcId::new("iad")?;

    println!(
        "one core, {LOOKUPS_PER_REP} lookups per repetition, median of {REPS}, keys of 40 bytes, lookup order scattered\n"
    );
    println!(
        "{:>9}  {:<28} {:>10} {:>14} {:>12}",
        "keys", "lookup", "ns/op", "ops/s", "vs moka"
    );
    for &n in &SIZES {
        let keys: Vec<Key> = (0..n).map(key).collect::<Result<_, _>>()?;
        let resolutions: Vec<Resolution> = keys
            .iter()
            .enumerate()
            .map(|(i, k)| resolution(k.clone(), &iad, i as u64))
            .collect::<Result<_, _>>()?;
        let order = scattered(n, LOOKUPS_PER_REP);

        let config = ResolverConfig {
            cache_entries: 2 * n as u64,
            tail_ttl_ms: TTL_MS,
            ..ResolverConfig::new(vec![(iad.clone(), "127.0.0.1:9".parse()?)])
        };
        let resolver = Resolver::new(client.clone(), config);
        for r in &resolutions {
            resolver.prime(r.clone()).await;
        }

        let resolve = median(REPS, || async {
            let started = Instant::now();
            for &i in &order {
                let hit = resolver.resolve(&keys[i]).await;
                black_box(hit.ok());
            }
            started.elapsed()
        })
        .await;

        let resolve_ref = median(REPS, || async {
            let started = Instant::now();
            for &i in &order {
                let hit = resolver.resolve_ref(keys[i].borrowed()).await;
                black_box(hit.ok());
            }
            started.elapsed()
        })
        .await;

        let future_cache: moka::future::Cache<Key, Arc<Resolution>> =
            moka::future::Cache::builder()
                .max_capacity(2 * n as u64)
                .time_to_live(Duration::from_millis(TTL_MS))
                .build();
        for r in &resolutions {
            future_cache
                .insert(r.key.clone(), Arc::new(r.clone()))
                .await;
        }
        future_cache.run_pending_tasks().await;
        let moka_future = median(REPS, || async {
            let started = Instant::now();
            for &i in &order {
                black_box(future_cache.get(&keys[i]).await);
            }
            started.elapsed()
        })
        .await;
        drop(future_cache);

        let sync_cache: moka::sync::Cache<Key, Arc<Resolution>> = moka::sync::Cache::builder()
            .max_capacity(2 * n as u64)
            .time_to_live(Duration::from_millis(TTL_MS))
            .build();
        for r in &resolutions {
            sync_cache.insert(r.key.clone(), Arc::new(r.clone()));
        }
        sync_cache.run_pending_tasks();
        let moka_sync = median(REPS, || async {
            let started = Instant::now();
            for &i in &order {
                black_box(sync_cache.get(&keys[i]));
            }
            started.elapsed()
        })
        .await;
        drop(sync_cache);

        let map: HashMap<Key, Arc<Resolution>> = resolutions
            .iter()
            .map(|r| (r.key.clone(), Arc::new(r.clone())))
            .collect();
        let hash_map = median(REPS, || async {
            let started = Instant::now();
            for &i in &order {
                black_box(map.get(&keys[i]).cloned());
            }
            started.elapsed()
        })
        .await;

        let per_op = |d: Duration| d.as_nanos() as f64 / LOOKUPS_PER_REP as f64;
        let bar = per_op(moka_future);
        for (name, d) in [
            ("Resolver::resolve (hit)", resolve),
            ("Resolver::resolve_ref (hit)", resolve_ref),
            ("moka::future::Cache::get", moka_future),
            ("moka::sync::Cache::get", moka_sync),
            ("HashMap::get", hash_map),
        ] {
            let ns = per_op(d);
            println!(
                "{n:>9}  {name:<28} {ns:>10.1} {:>14.0} {:>11.2}x",
                1e9 / ns,
                ns / bar
            );
        }
        println!();
    }
    Ok(())
}

/// Throughput of cached resolves, bare moka gets and shared-`HashMap` gets
/// on `threads` threads at once over one shared cache of [`SCALING_KEYS`]
/// keys: lookups per second summed over the threads (median of [`REPS`]),
/// and each count's ratio to one thread.
async fn scaling(threads: &[usize]) -> Result<(), Box<dyn std::error::Error>> {
    let ca = DevCa::generate("bench ca")?;
    let tls = ca.tls_identity(&Identity::new(Role::Router, None)?)?;
    let client = Client::new(&tls, ClientLimits::default())?;
    let iad = DcId::new("iad")?;
    let keys: Vec<Key> = (0..SCALING_KEYS).map(key).collect::<Result<_, _>>()?;
    let resolutions: Vec<Resolution> = keys
        .iter()
        .enumerate()
        .map(|(i, k)| resolution(k.clone(), &iad, i as u64))
        .collect::<Result<_, _>>()?;
    let config = ResolverConfig {
        cache_entries: 2 * SCALING_KEYS as u64,
        tail_ttl_ms: TTL_MS,
        ..ResolverConfig::new(vec![(iad.clone(), "127.0.0.1:9".parse()?)])
    };
    let resolver = Resolver::new(client, config);
    let moka: moka::future::Cache<Key, Arc<Resolution>> = moka::future::Cache::builder()
        .max_capacity(2 * SCALING_KEYS as u64)
        .time_to_live(Duration::from_millis(TTL_MS))
        .build();
    for r in &resolutions {
        resolver.prime(r.clone()).await;
        moka.insert(r.key.clone(), Arc::new(r.clone())).await;
    }
    moka.run_pending_tasks().await;
    let map: HashMap<Key, Arc<Resolution>> = resolutions
        .iter()
        .map(|r| (r.key.clone(), Arc::new(r.clone())))
        .collect();
    // Each thread its own order (a different start), so threads do not
    // walk the same keys in lock step.
    let orders: Vec<Vec<usize>> = (0..threads.iter().copied().max().unwrap_or(1))
        .map(|t| {
            let mut order = scattered(SCALING_KEYS, SCALING_LOOKUPS_PER_THREAD + t);
            order.drain(..t);
            order
        })
        .collect();
    println!(
        "\nthreads sharing one cache of {SCALING_KEYS} keys, {SCALING_LOOKUPS_PER_THREAD} lookups per thread, \
         each thread its own current-thread runtime, median of {REPS}"
    );
    println!(
        "{:>7}  {:<28} {:>14} {:>13}",
        "threads", "lookup", "ops/s (total)", "vs 1 thread"
    );
    let mut one: [f64; 3] = [0.0; 3];
    for &n in threads {
        let rates = [
            rate(n, &orders, |order| {
                let (resolver, keys) = (&resolver, &keys);
                async move {
                    for &i in order {
                        black_box(resolver.resolve(&keys[i]).await.ok());
                    }
                }
            }),
            rate(n, &orders, |order| {
                let (moka, keys) = (&moka, &keys);
                async move {
                    for &i in order {
                        black_box(moka.get(&keys[i]).await);
                    }
                }
            }),
            rate(n, &orders, |order| {
                let (map, keys) = (&map, &keys);
                async move {
                    for &i in order {
                        black_box(map.get(&keys[i]).cloned());
                    }
                }
            }),
        ];
        for (i, name) in [
            "Resolver::resolve (hit)",
            "moka::future::Cache::get",
            "HashMap::get (no lock)",
        ]
        .into_iter()
        .enumerate()
        {
            if n == 1 {
                one[i] = rates[i];
            }
            let ratio = if one[i] > 0.0 { rates[i] / one[i] } else { 0.0 };
            println!("{n:>7}  {name:<28} {:>14.0} {ratio:>12.2}x", rates[i]);
        }
    }
    Ok(())
}

/// Lookups per second of `work` run on `threads` threads at once (thread
/// `t` on `orders[t]`), each on its own current-thread runtime; median of
/// [`REPS`] after a warm-up.
fn rate<'a, F, Fut>(threads: usize, orders: &'a [Vec<usize>], work: F) -> f64
where
    F: Fn(&'a [usize]) -> Fut + Sync,
    Fut: std::future::Future<Output = ()>,
{
    let once = || {
        let start = std::sync::Barrier::new(threads);
        let started = std::thread::scope(|scope| {
            let handles: Vec<_> = orders[..threads]
                .iter()
                .map(|order| {
                    let (work, start) = (&work, &start);
                    scope.spawn(move || {
                        let runtime = tokio::runtime::Builder::new_current_thread()
                            .build()
                            .expect("a current-thread runtime");
                        start.wait();
                        let began = Instant::now();
                        runtime.block_on(work(order));
                        (began, Instant::now())
                    })
                })
                .collect();
            let spans: Vec<(Instant, Instant)> = handles
                .into_iter()
                .map(|h| h.join().expect("a bench thread"))
                .collect();
            let first = spans
                .iter()
                .map(|s| s.0)
                .min()
                .expect("at least one thread");
            let last = spans
                .iter()
                .map(|s| s.1)
                .max()
                .expect("at least one thread");
            last - first
        });
        let lookups: usize = orders[..threads].iter().map(Vec::len).sum();
        lookups as f64 / started.as_secs_f64()
    };
    once(); // warm-up
    let mut rates: Vec<f64> = (0..REPS).map(|_| once()).collect();
    rates.sort_by(f64::total_cmp);
    rates[REPS / 2]
}

/// A 40-byte key name.
fn key(i: usize) -> Result<Key, homing_core::LabelError> {
    Ok(Key::new(KeyName::new(format!("room-{i:035}"))?))
}

fn resolution(key: Key, dc: &DcId, unique: u64) -> Result<Resolution, homing_core::LabelError> {
    Ok(Resolution {
        key,
        dc: dc.clone(),
        reservation: ReservationId::new(dc.clone(), unique + 1),
        actor: ActorId::new(format!("10.1.{}.{}:9000", unique / 256 % 256, unique % 256))?,
        token: FencingToken::FIRST,
        hops: 0,
        remote_round_trips: 0,
        from_cache: false,
        stale: false,
    })
}

/// `count` indices into `0..n` in a cache-unfriendly but reproducible order.
fn scattered(n: usize, count: usize) -> Vec<usize> {
    // A full-period LCG step modulo a power of two above n, skipping values ≥ n.
    let mut state: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut out = Vec::with_capacity(count);
    while out.len() < count {
        state = state
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        out.push(((state >> 33) % n as u64) as usize);
    }
    out
}

async fn median<F, Fut>(reps: usize, mut run: F) -> Duration
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Duration>,
{
    run().await; // warm-up
    let mut times: Vec<Duration> = Vec::with_capacity(reps);
    for _ in 0..reps {
        times.push(run().await);
    }
    times.sort();
    times[reps / 2]
}

/// Resident set size of this process, in bytes.
fn rss_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1)?.parse::<u64>().ok())
        .unwrap_or(0)
        * PAGE_BYTES
}
