//! homing-sim: a deterministic multi-DC simulator that runs the request
//! handling homingd runs — homing-node's acquire, update, waiters, upkeep
//! and drain steppers, homing-core's `Connect`, `LocalSegment` and
//! `RouterWalk` — for several DCs, routers and hosts over a simulated network
//! (latency matrix, jitter, loss, partitions), simulated stores (latency,
//! crashes that may land in-flight writes) and per-node clocks (offset,
//! drift). Invariants are checked after every event; a run is its scenario
//! (a file, or `swarm`: drawn from the seed) plus its seed, and the same
//! seed always gives the same trace hash.
//!
//! ```
//! use homing_sim::{Rules, RunOptions, Scenario, run};
//! let scenario = Scenario::from_toml("name = \"tiny\"\nduration_ms = 2000\nkeys = 5\nhosts_per_dc = 2")?;
//! let a = run(&scenario, 7, Rules::real(), RunOptions::default())?;
//! let b = run(&scenario, 7, Rules::real(), RunOptions::default())?;
//! assert!(a.failure.is_none());
//! assert_eq!(a.trace_hash, b.trace_hash);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

#![forbid(unsafe_code)]

pub mod checker;
pub mod clock;
pub mod counter;
pub mod dc;
pub mod event;
mod global;
pub mod host;
pub mod invariants;
mod keys;
pub mod network;
mod observe;
pub mod report;
pub mod rng;
pub mod router;
pub mod rules;
mod scan;
pub mod scenario;
pub mod sim;
pub mod swarm;
pub mod trace;
pub mod wakeups;
mod watch;
mod world;

pub use invariants::{Invariant, Violation};
pub use report::Measurements;
pub use rules::{Rules, WaitRules};
pub use scenario::{Scenario, ScenarioError};
pub use sim::{InvariantFailure, Outcome, RunOptions, Sim};

/// Runs `scenario` with `seed` to its end or its first invariant violation.
pub fn run(
    scenario: &Scenario,
    seed: u64,
    rules: Rules,
    options: RunOptions,
) -> Result<Outcome, ScenarioError> {
    Ok(Sim::new(scenario, seed, rules, options)?.run())
}

/// The JSON summary of one run (`events_per_s` is the only wall-clock figure).
pub fn summary_json(outcome: &Outcome, events_per_s: f64) -> String {
    let violation = outcome.failure.as_ref().map(|f| {
        serde_json::json!({
            "invariant": f.violation.invariant.name(),
            "event_index": f.event_index,
            "at_ms": f.at_us as f64 / 1000.0,
            "detail": f.violation.detail,
        })
    });
    let summary = serde_json::json!({
        "scenario": outcome.scenario,
        "seed": outcome.seed,
        "events": outcome.events,
        "sim_ms": outcome.sim_us as f64 / 1000.0,
        "trace_hash": format!("{:016x}", outcome.trace_hash),
        "events_per_s": events_per_s.round(),
        "violation": violation,
        "operations": outcome.measurements.json(),
        "counters": outcome.measurements.counters_json(),
        "durations_ms": outcome.measurements.durations_json(),
    });
    format!("{summary}\n")
}
