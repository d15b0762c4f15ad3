//! Swarm testing: the scenario is drawn from the seed, so a sweep over seeds
//! also sweeps the knobs — how many DCs and which regions, keys, hosts and
//! routers, latency, jitter and loss, store speeds, clock offsets and
//! drifts, the workload's mix, waiting, and which faults strike when.
//!
//! Every swarm run has two phases: a *fault phase* (the first part of the
//! run, where every fault starts and ends) and a *heal phase* of at least
//! [`HEAL_MS_MIN`] with no fault at all, so the end-of-run liveness checks
//! (`reaper_progress`, `no_lost_wakeup`) judge a system that had time to
//! converge. A run is `(swarm, seed)` plus the commit: `homing-sim run
//! swarm --seed N` replays it.

use crate::rng::Rng;
use crate::scenario::{Fault, Scenario, ScenarioError, WorkloadSpec};

/// The scenario argument that means "drawn from the seed".
pub const SWARM: &str = "swarm";

/// Fewest keys a swarm scenario draws: few keys, a hot fraction and short
/// thinking make long chains, which walks cross by shortcuts (DESIGN.md §7.2).
pub const KEYS_MIN: u32 = 5;

/// The shortest heal phase, ms: a lease and its grace, the longest wait a
/// host asks for, and two upkeep intervals.
pub const HEAL_MS_MIN: u64 = 20_000;

/// The scenario of swarm seed `seed`.
pub fn scenario(seed: u64) -> Result<Scenario, ScenarioError> {
    // Not the run's own stream: the knobs and the run draw independently.
    let mut rng = Rng::new(seed ^ 0x5157_4152_4d00_0000);
    let mut s = Scenario {
        name: SWARM.into(),
        ..Scenario::default()
    };
    let regions = ["iad", "fra", "sin", "syd", "gru"];
    let dcs = 2 + rng.below(4) as usize;
    let first = rng.below(regions.len() as u64) as usize;
    s.dcs = (0..dcs)
        .map(|i| regions[(first + i) % regions.len()].to_string())
        .collect();
    // Before shortcuts a chain longer than the hop limit was unresolvable:
    // drawn from 5 keys, a 0.9 hot fraction and 200 ms of thinking, 27 of
    // seeds 1..=2000 failed `chain longer than the hop limit of 16`, and the
    // swarm kept to 80 keys, a 0.3 hot fraction and 1 s of thinking. Now
    // the long chains are drawn again.
    s.keys = KEYS_MIN + rng.below(275) as u32;
    s.hosts_per_dc = 1 + rng.below(6) as u32;
    s.routers_per_dc = rng.below(3) as u32;
    s.network.jitter_ms = pick(&mut rng, &[0.0, 2.0, 10.0]);
    s.network.loss = pick(&mut rng, &[0.0, 0.0, 0.001, 0.01]);
    s.stores.dc_op_ms = pick(&mut rng, &[0.5, 1.0, 5.0]);
    s.stores.global_write_ms = pick(&mut rng, &[10.0, 40.0, 120.0]);
    s.stores.global_nearest_lag_ms = pick(&mut rng, &[0.0, 0.0, 500.0]);
    s.stores.orphan_age_ms = pick(&mut rng, &[2_000, 5_000, 60_000]);
    s.clocks.host_offset_ms = pick(&mut rng, &[0, 500, 5_000]);
    s.clocks.store_offset_ms = pick(&mut rng, &[0, 500, 5_000]);
    s.clocks.host_drift_ppm = pick(&mut rng, &[0, 20, 200]);
    s.clocks.store_drift_ppm = pick(&mut rng, &[0, 20, 200]);
    let w = &mut s.workload;
    w.think_ms = pick(&mut rng, &[200.0, 1_000.0, 2_000.0]);
    w.hold_ms = pick(&mut rng, &[1_000.0, 8_000.0]);
    w.hot_fraction = pick(&mut rng, &[0.0, 0.3, 0.9]);
    w.wait_fraction = pick(&mut rng, &[0.0, 0.5, 1.0]);
    w.acquire_wait_ms = pick(&mut rng, &[0, 2_000, 8_000]);
    w.release_failed_fraction = pick(&mut rng, &[0.0, 0.2]);
    w.host_crash_interval_ms = pick(&mut rng, &[0.0, 0.0, 20_000.0]);
    // Past the 2 s between the soft and the hard deadline, a graceful stop
    // is cut short: the host lease's kill rule runs.
    w.graceful_stop_ms = pick(&mut rng, &[800, 1_500, 3_000]);
    s.waiting.handoff_ms = pick(&mut rng, &[500, 2_000]);
    s.waiting.waiters_per_key_max = pick(&mut rng, &[2, 64]);
    let fault_ms = 10_000 + rng.below(30_000);
    s.duration_ms = fault_ms + HEAL_MS_MIN + rng.below(10_000);
    let faults = rng.below(5);
    s.faults = (0..faults)
        .map(|_| fault(&mut rng, &s.dcs, fault_ms))
        .collect();
    s.faults.extend(lost_dc(seed, &s.dcs, fault_ms));
    s.instances_per_dc = instances(seed, &s.dcs, fault_ms, &mut s.faults);
    sessions(seed, &mut s.workload);
    s.validate()?;
    Ok(s)
}

/// Shortest cut of a lost DC: longer than the simulated DC lease (twice the
/// 10 s host lease) and its grace, so the global store judges the lease
/// expired and the other DCs may take its tails over; the DC reconciles
/// them when the cut heals.
const LOST_DC_MS: u64 = 25_000;

/// For a quarter of the seeds whose fault phase is long enough, a DC cut
/// off from the global store past its DC lease, to the end of the fault
/// phase. Drawn from a stream of its own, so every other draw of a seed
/// (and so each regression seed's scenario) stays as it was.
fn lost_dc(seed: u64, dcs: &[String], fault_ms: u64) -> Option<Fault> {
    let mut rng = Rng::new(seed ^ 0x4c4f_5354_0000_0000);
    if fault_ms <= LOST_DC_MS || !rng.chance(0.25) {
        return None;
    }
    let at_ms = rng.below(fault_ms - LOST_DC_MS);
    Some(Fault::CutFromGlobal {
        dc: dcs[rng.below(dcs.len() as u64) as usize].clone(),
        at_ms,
        for_ms: fault_ms - at_ms,
    })
}

/// For a third of the seeds, 2 or 3 homingd per DC over its one store;
/// then, for half of those, one homingd of a DC crashes alone (and
/// restarts) while the others run on, within the fault phase. Drawn from a
/// stream of its own, so every other draw of a seed stays as it was.
fn instances(seed: u64, dcs: &[String], fault_ms: u64, faults: &mut Vec<Fault>) -> u8 {
    let mut rng = Rng::new(seed ^ 0x494e_5354_0000_0000);
    if !rng.chance(1.0 / 3.0) {
        return 1;
    }
    let n = 2 + rng.below(2) as u8;
    if rng.chance(0.5) {
        let at_ms = rng.below(fault_ms / 2);
        faults.push(Fault::CrashDc {
            dc: dcs[rng.below(dcs.len() as u64) as usize].clone(),
            at_ms,
            for_ms: 500 + rng.below(fault_ms - at_ms - 500),
            store_lost: false,
            graceful: rng.chance(0.3),
            instance: Some(rng.below(u64::from(n)) as u8),
        });
    }
    n
}

/// For a third of the seeds, half or all of each DC's hosts hold their
/// keys under host sessions, 2 or 8 keys each. Drawn from a stream of its
/// own, so every other draw of a seed stays as it was.
fn sessions(seed: u64, workload: &mut WorkloadSpec) {
    let mut rng = Rng::new(seed ^ 0x5345_5353_0000_0000);
    if !rng.chance(1.0 / 3.0) {
        return;
    }
    workload.session_fraction = pick(&mut rng, &[0.5, 1.0]);
    workload.session_keys = pick(&mut rng, &[2, 8]);
}

fn pick<T: Copy>(rng: &mut Rng, choices: &[T]) -> T {
    choices[rng.below(choices.len() as u64) as usize]
}

/// A fault that starts and ends within the fault phase (`0..fault_ms`).
fn fault(rng: &mut Rng, dcs: &[String], fault_ms: u64) -> Fault {
    let dc = |rng: &mut Rng| dcs[rng.below(dcs.len() as u64) as usize].clone();
    let at_ms = rng.below(fault_ms / 2);
    let for_ms = 500 + rng.below(fault_ms - at_ms - 500);
    match rng.below(5) {
        0 => {
            let from = dc(rng);
            let mut to = dc(rng);
            if to == from {
                to =
                    dcs[(dcs.iter().position(|d| *d == from).unwrap_or(0) + 1) % dcs.len()].clone();
            }
            Fault::Partition {
                from,
                to,
                at_ms,
                for_ms,
                one_way: rng.chance(0.3),
            }
        }
        1 => Fault::CrashDc {
            dc: dc(rng),
            at_ms,
            for_ms,
            store_lost: false,
            graceful: rng.chance(0.3),
            instance: None,
        },
        // One draw picks the store fault, so the other faults' draws stay
        // as they were before failing stores were simulated.
        2 => match rng.below(3) {
            2 => Fault::FailingStore {
                dc: dc(rng),
                at_ms,
                for_ms,
                fraction: pick(rng, &[0.1, 1.0]),
            },
            slow => Fault::SlowStore {
                dc: dc(rng),
                at_ms,
                for_ms,
                factor: [5.0, 50.0][slow as usize],
            },
        },
        3 if rng.chance(0.2) => Fault::DrainScope { dc: dc(rng), at_ms },
        3 => Fault::Drain {
            at_ms,
            count: 1 + rng.below(5) as u32,
        },
        _ => Fault::CrashHosts {
            dc: dc(rng),
            at_ms,
            fraction: pick(rng, &[0.3, 1.0]),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn swarm_scenarios_are_valid_and_a_seed_always_draws_the_same_one() {
        for seed in 0..200 {
            let a = scenario(seed).unwrap();
            let b = scenario(seed).unwrap();
            assert_eq!(format!("{a:?}"), format!("{b:?}"));
            assert!(a.duration_ms >= HEAL_MS_MIN + 10_000);
        }
    }

    #[test]
    fn some_seeds_cut_a_dc_off_from_the_global_store_past_its_dc_lease() {
        let lost = (0..200)
            .filter_map(|seed| {
                let s = scenario(seed).unwrap();
                s.faults.into_iter().find_map(|f| match f {
                    Fault::CutFromGlobal { for_ms, .. } => Some(for_ms),
                    _ => None,
                })
            })
            .collect::<Vec<_>>();
        assert!(lost.len() > 10, "{lost:?}");
        assert!(lost.iter().all(|&ms| ms >= LOST_DC_MS), "{lost:?}");
    }

    #[test]
    fn some_seeds_run_several_homingd_per_dc_and_crash_one_alone() {
        let drawn: Vec<Scenario> = (0..200).map(|seed| scenario(seed).unwrap()).collect();
        let several = drawn.iter().filter(|s| s.instances_per_dc > 1).count();
        let alone = (drawn.iter().flat_map(|s| &s.faults))
            .filter(|f| {
                matches!(
                    f,
                    Fault::CrashDc {
                        instance: Some(_),
                        ..
                    }
                )
            })
            .count();
        assert!((40..=100).contains(&several), "{several} of 200");
        assert!(alone > 15, "{alone} of 200");
    }

    #[test]
    fn a_third_of_the_seeds_draw_session_hosts() {
        let drawn = (0..300)
            .filter(|&seed| scenario(seed).unwrap().workload.session_fraction > 0.0)
            .count();
        assert!((70..=130).contains(&drawn), "{drawn} of 300");
    }

    #[test]
    fn swarm_faults_all_end_before_the_heal_phase() {
        for seed in 0..200 {
            let s = scenario(seed).unwrap();
            let heal_from = s.duration_ms - HEAL_MS_MIN;
            for f in &s.faults {
                let end = match f {
                    Fault::Partition { at_ms, for_ms, .. }
                    | Fault::CrashDc { at_ms, for_ms, .. }
                    | Fault::CutFromGlobal { at_ms, for_ms, .. }
                    | Fault::SlowStore { at_ms, for_ms, .. }
                    | Fault::FailingStore { at_ms, for_ms, .. } => at_ms + for_ms,
                    Fault::Drain { at_ms, .. }
                    | Fault::DrainScope { at_ms, .. }
                    | Fault::CrashHosts { at_ms, .. } => *at_ms,
                };
                assert!(end <= heal_from, "seed {seed}: {f:?} ends at {end}");
            }
        }
    }
}
