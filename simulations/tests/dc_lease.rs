//! The DC lease in the simulator (DESIGN.md §7.5): a DC restarted on an
//! empty store under the same id is refused by the floor check and never
//! serves again; a DC cut off from the global store stops its hosts before
//! the store calls its lease expired.

use homing_sim::counter::{Counter, Timing};
use homing_sim::{Rules, RunOptions, Scenario, run};

/// `simulations/scenarios/<name>.toml`, cut to `duration_ms`.
fn scenario(name: &str, duration_ms: u64) -> Scenario {
    let path = format!("{}/scenarios/{name}.toml", env!("CARGO_MANIFEST_DIR"));
    let mut scenario = Scenario::load(std::path::Path::new(&path)).unwrap();
    scenario.duration_ms = duration_ms;
    scenario
}

#[test]
fn a_dc_restarted_on_an_empty_store_is_refused_and_stays_down() {
    let mut s = scenario("baseline", 30_000);
    let crash = "[[faults]]\nkind = \"crash_dc\"\ndc = \"fra\"\nat_ms = 10000\nfor_ms = 2000\nstore_lost = true\n";
    s.faults = Scenario::from_toml(crash).unwrap().faults;
    let outcome = run(&s, 1, Rules::real(), RunOptions::default()).unwrap();
    assert!(outcome.failure.is_none(), "{}", outcome.failure.unwrap());
    let counters = &outcome.measurements.counters;
    assert_eq!(
        outcome.measurements.counted(Counter::DcRefusedBelowFloor),
        1,
        "{counters:?}"
    );
    // The same crash with its store kept restarts and serves.
    s.faults = Scenario::from_toml(&crash.replace("store_lost = true", ""))
        .unwrap()
        .faults;
    let kept = run(&s, 1, Rules::real(), RunOptions::default()).unwrap();
    assert!(kept.failure.is_none(), "{}", kept.failure.unwrap());
    assert_eq!(kept.measurements.counted(Counter::DcRefusedBelowFloor), 0);
}

#[test]
fn a_dc_cut_from_the_global_store_stops_granting_and_its_hosts_stop_before_expiry() {
    let s = scenario("dc-cut-from-global", 70_000);
    let outcome = run(&s, 1, Rules::real(), RunOptions::default()).unwrap();
    assert!(outcome.failure.is_none(), "{}", outcome.failure.unwrap());
    let counters = &outcome.measurements.counters;
    assert!(
        outcome.measurements.counted(Counter::GrantRefusedByDcLease) > 0,
        "{counters:?}"
    );
    assert_eq!(
        outcome.measurements.counted(Counter::DcLeaseExpiredInStore),
        1,
        "{counters:?}"
    );
    let stopped = &outcome.measurements.durations[&Timing::DcCutHostsStoppedAfter];
    assert_eq!(stopped.len(), 1);
}
