//! `homing-sim`: run, sweep or replay a scenario. Every run prints its event
//! count, events per second (wall clock, for information only) and its trace
//! hash; a violation prints the seed to replay and exits non-zero.

use std::ops::Range;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use clap::{Parser, Subcommand};
use homing_sim::{Measurements, Rules, RunOptions, Scenario, run, summary_json};

/// Deterministic multi-DC simulator for homing.
#[derive(Parser)]
#[command(name = "homing-sim", version)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run one scenario with one seed; print the cost-model table.
    Run {
        /// The scenario TOML file.
        scenario: PathBuf,
        /// The seed.
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Report directory (default target/homing-sim/<scenario>-<seed>/).
        #[arg(long)]
        report: Option<PathBuf>,
    },
    /// Run a range of seeds on every core; report the failing ones.
    Sweep {
        /// The scenario TOML file.
        scenario: PathBuf,
        /// Seeds as `A..B` (B excluded) or `A..=B`.
        #[arg(long, default_value = "1..=100")]
        seeds: String,
        /// Worker threads (default: available cores).
        #[arg(long)]
        threads: Option<usize>,
    },
    /// Run one seed and print every processed event.
    Replay {
        /// The scenario TOML file.
        scenario: PathBuf,
        /// The seed.
        #[arg(long)]
        seed: u64,
    },
}

fn parse_seeds(text: &str) -> Result<Range<u64>, String> {
    let bad = || format!("seeds must look like 1..100 or 1..=100, got {text:?}");
    if let Some((a, b)) = text.split_once("..=") {
        let (a, b): (u64, u64) = (a.parse().map_err(|_| bad())?, b.parse().map_err(|_| bad())?);
        return Ok(a..b + 1);
    }
    let (a, b) = text.split_once("..").ok_or_else(bad)?;
    Ok(a.parse().map_err(|_| bad())?..b.parse().map_err(|_| bad())?)
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Run {
            scenario,
            seed,
            report,
        } => run_one(&scenario, seed, report, false),
        Command::Replay { scenario, seed } => run_one(&scenario, seed, None, true),
        Command::Sweep {
            scenario,
            seeds,
            threads,
        } => sweep(&scenario, &seeds, threads),
    };
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("homing-sim: {e}");
            ExitCode::from(2)
        }
    }
}

fn run_one(
    path: &Path,
    seed: u64,
    report: Option<PathBuf>,
    print_trace: bool,
) -> Result<bool, Box<dyn std::error::Error>> {
    let scenario = Scenario::load(path)?;
    let started = Instant::now();
    let outcome = run(&scenario, seed, Rules::real(), RunOptions { print_trace })?;
    let wall = started.elapsed().as_secs_f64();
    let rate = outcome.events as f64 / wall.max(1e-9);
    if !print_trace {
        println!("{}", outcome.measurements.table());
        println!("outcomes: {}\n", outcome.measurements.counters_line());
    }
    let dir = report
        .unwrap_or_else(|| PathBuf::from(format!("target/homing-sim/{}-{}", scenario.name, seed)));
    homing_sim::report::write_report(&dir, &summary_json(&outcome, rate), &outcome.measurements)?;
    println!(
        "scenario {} seed {}: {} events, {:.1} s simulated, {:.0} events/s, trace hash {:016x}",
        scenario.name,
        seed,
        outcome.events,
        outcome.sim_us as f64 / 1e6,
        rate,
        outcome.trace_hash
    );
    println!("report: {}", dir.display());
    match &outcome.failure {
        None => {
            println!("invariants: all held");
            Ok(true)
        }
        Some(failure) => {
            println!("{failure}");
            Ok(false)
        }
    }
}

fn sweep(
    path: &Path,
    seeds: &str,
    threads: Option<usize>,
) -> Result<bool, Box<dyn std::error::Error>> {
    let scenario = Scenario::load(path)?;
    let range = parse_seeds(seeds)?;
    let threads = threads
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
        .max(1);
    let next = AtomicU64::new(range.start);
    let failures = Mutex::new(Vec::new());
    let totals = Mutex::new((0u64, Measurements::default()));
    let started = Instant::now();
    std::thread::scope(|scope| {
        for _ in 0..threads {
            scope.spawn(|| {
                loop {
                    let seed = next.fetch_add(1, Ordering::Relaxed);
                    if seed >= range.end {
                        return;
                    }
                    // Invariant: the scenario was validated by `load`.
                    let outcome = run(&scenario, seed, Rules::real(), RunOptions::default())
                        .expect("validated scenario");
                    if let Some(failure) = outcome.failure {
                        eprintln!("{failure}");
                        // A poisoned lock means another worker panicked: the sweep is lost anyway.
                        failures.lock().expect("lock").push(seed);
                    }
                    let mut t = totals.lock().expect("lock");
                    t.0 += outcome.events;
                    t.1.merge(&outcome.measurements);
                }
            });
        }
    });
    let wall = started.elapsed().as_secs_f64();
    let mut failed = failures.into_inner().expect("lock");
    failed.sort_unstable();
    let (events, measurements) = totals.into_inner().expect("lock");
    println!("{}", measurements.table());
    println!("outcomes: {}\n", measurements.counters_line());
    println!(
        "sweep {} seeds {}..{} on {} threads: {} events, {:.0} events/s, {:.1} s wall",
        scenario.name,
        range.start,
        range.end,
        threads,
        events,
        events as f64 / wall.max(1e-9),
        wall
    );
    if failed.is_empty() {
        println!("all {} seeds passed", range.end - range.start);
        Ok(true)
    } else {
        println!("failing seeds: {failed:?}");
        Ok(false)
    }
}
