//! `homing-sim`: run, sweep or replay a scenario (a TOML file, or `swarm`:
//! drawn from the seed), sweep swarm seeds, run the regression seeds. Every
//! run prints its event count, events per second (wall clock, for
//! information only) and its trace hash; a violation prints the seed to
//! replay and exits non-zero.

use std::io::IsTerminal;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use clap::{Parser, Subcommand};
use homing_sim::{Measurements, Rules, RunOptions, Scenario, run, summary_json, swarm};

/// Deterministic multi-DC simulator for homing.
///
/// A run is (scenario, seed): the same pair always gives the same trace
/// hash. SCENARIO is a TOML file (see simulations/scenarios/) or `swarm`, a
/// scenario drawn from the seed itself (DCs, load, latency, clocks and
/// faults), with a fault phase and then a fault-free heal phase.
///
/// Examples:
///   homing-sim run simulations/scenarios/baseline.toml --seed 7
///   homing-sim sweep simulations/scenarios/racing-dcs.toml --seeds 1..=200
///   homing-sim swarm --seeds 1..=2000
///   homing-sim replay swarm --seed 1234      # every event of swarm seed 1234
///   homing-sim regressions                    # simulations/regressions.txt
#[derive(Parser)]
#[command(name = "homing-sim", version, verbatim_doc_comment)]
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
    /// Sweep seeds of the swarm: every seed draws its own scenario.
    Swarm {
        /// Seeds as `A..B` (B excluded) or `A..=B`.
        #[arg(long, default_value = "1..=200")]
        seeds: String,
        /// Worker threads (default: available cores).
        #[arg(long)]
        threads: Option<usize>,
    },
    /// Run every (scenario, seed) of a regression list: seeds that once
    /// failed, kept so they stay fixed.
    Regressions {
        /// The list: `<scenario> <seed>` per line, `#` comments.
        #[arg(default_value = "simulations/regressions.txt")]
        file: PathBuf,
    },
}

/// Where a run's scenario comes from.
enum Source {
    /// A file, loaded once.
    File(Box<Scenario>),
    /// Drawn from each seed.
    Swarm,
}

impl Source {
    fn open(path: &Path) -> Result<Source, homing_sim::ScenarioError> {
        if path == Path::new(swarm::SWARM) {
            return Ok(Source::Swarm);
        }
        Scenario::load(path).map(|s| Source::File(Box::new(s)))
    }

    fn scenario(&self, seed: u64) -> Result<Scenario, homing_sim::ScenarioError> {
        match self {
            Source::File(scenario) => Ok((**scenario).clone()),
            Source::Swarm => swarm::scenario(seed),
        }
    }

    fn name(&self) -> &str {
        match self {
            Source::File(scenario) => &scenario.name,
            Source::Swarm => swarm::SWARM,
        }
    }
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
        } => Source::open(&scenario)
            .map_err(Into::into)
            .and_then(|source| sweep(&source, &seeds, threads)),
        Command::Swarm { seeds, threads } => sweep(&Source::Swarm, &seeds, threads),
        Command::Regressions { file } => regressions(&file),
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
    let scenario = Source::open(path)?.scenario(seed)?;
    let started = Instant::now();
    let outcome = run(&scenario, seed, Rules::real(), RunOptions { print_trace })?;
    let wall = started.elapsed().as_secs_f64();
    let rate = outcome.events as f64 / wall.max(1e-9);
    if !print_trace {
        println!("{}", outcome.measurements.table());
        println!("outcomes: {}\n", outcome.measurements.counters_line());
        print!("{}", outcome.measurements.durations_lines());
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
    source: &Source,
    seeds: &str,
    threads: Option<usize>,
) -> Result<bool, Box<dyn std::error::Error>> {
    let range = parse_seeds(seeds)?;
    let progress = Progress::new(range.end.saturating_sub(range.start));
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
                    // Invariant: files are validated by `load`, swarm draws by `validate`.
                    let scenario = source.scenario(seed).expect("valid scenario");
                    let outcome = run(&scenario, seed, Rules::real(), RunOptions::default())
                        .expect("validated scenario");
                    let failed = outcome.failure.is_some();
                    if let Some(failure) = outcome.failure {
                        progress.clear();
                        eprintln!("{failure}");
                        // A poisoned lock means another worker panicked: the sweep is lost anyway.
                        failures.lock().expect("lock").push(seed);
                    }
                    progress.done(failed);
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
    print!("{}", measurements.durations_lines());
    println!(
        "sweep {} seeds {}..{} on {} threads: {} events, {:.0} events/s, {:.1} s wall",
        source.name(),
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

/// A sweep's progress on stderr: a line redrawn in place on a terminal,
/// every tenth otherwise (logs stay short).
struct Progress {
    total: u64,
    done: AtomicU64,
    failed: AtomicU64,
    started: Instant,
    terminal: bool,
}

impl Progress {
    fn new(total: u64) -> Progress {
        Progress {
            total,
            done: AtomicU64::new(0),
            failed: AtomicU64::new(0),
            started: Instant::now(),
            terminal: std::io::stderr().is_terminal(),
        }
    }

    fn done(&self, failed: bool) {
        let done = self.done.fetch_add(1, Ordering::Relaxed) + 1;
        let failing =
            self.failed.fetch_add(u64::from(failed), Ordering::Relaxed) + u64::from(failed);
        let tenth = (self.total / 10).max(1);
        if !self.terminal && !done.is_multiple_of(tenth) && done != self.total {
            return;
        }
        let width = 30;
        let filled = (done * width / self.total.max(1)) as usize;
        let line = format!(
            "[{}{}] {done}/{} seeds, {failing} failing, {:.0} s",
            "#".repeat(filled),
            " ".repeat(width as usize - filled),
            self.total,
            self.started.elapsed().as_secs_f64()
        );
        if self.terminal {
            eprint!("\r{line}");
            if done == self.total {
                eprintln!();
            }
        } else {
            eprintln!("{line}");
        }
    }

    /// Clears the line before other output on a terminal.
    fn clear(&self) {
        if self.terminal {
            eprint!("\r\x1b[2K");
        }
    }
}

/// Runs every `<scenario> <seed>` line of `file` (paths relative to the
/// current directory, `swarm` allowed); true if all pass.
fn regressions(file: &Path) -> Result<bool, Box<dyn std::error::Error>> {
    let text = std::fs::read_to_string(file).map_err(|e| format!("{}: {e}", file.display()))?;
    let mut failed = Vec::new();
    let mut count = 0;
    for (n, line) in text.lines().enumerate() {
        let line = line.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        let bad = || {
            format!(
                "{}:{}: expected `<scenario> <seed>`, got {line:?}",
                file.display(),
                n + 1
            )
        };
        let mut words = line.split_whitespace();
        let (Some(path), Some(seed), None) = (words.next(), words.next(), words.next()) else {
            return Err(bad().into());
        };
        let seed: u64 = seed.parse().map_err(|_| bad())?;
        let scenario = Source::open(Path::new(path))?.scenario(seed)?;
        let outcome = run(&scenario, seed, Rules::real(), RunOptions::default())?;
        count += 1;
        match outcome.failure {
            None => println!(
                "ok   {path} seed {seed} (trace hash {:016x})",
                outcome.trace_hash
            ),
            Some(failure) => {
                println!("FAIL {path} seed {seed}: {failure}");
                failed.push(format!("{path} {seed}"));
            }
        }
    }
    if failed.is_empty() {
        println!("all {count} regression seeds passed");
        Ok(true)
    } else {
        println!(
            "{} of {count} regression seeds failed: {failed:?}",
            failed.len()
        );
        Ok(false)
    }
}
