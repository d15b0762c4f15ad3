//! Several homingd per DC over one DC store: a write through one homingd
//! wakes the waiters parked at another only through that one's log
//! follower (homing-node's `LogFollower`); hosts, routers and peer DCs
//! fail over to a DC's next homingd; one homingd crashes alone while the
//! others serve. The follower's wake-ups broken on purpose lose a wake-up,
//! the same seed fails again at the same event, and the real code passes it.

mod support;

use std::collections::BTreeMap;

use homing_core::Mutation;
use homing_sim::counter::Counter;
use homing_sim::{Invariant, Rules, RunOptions, run};

#[test]
fn several_homingd_per_dc_keep_every_invariant_wake_each_others_waiters_and_fail_over() {
    let scenario = support::scenario("instances", 40_000);
    let mut taken: BTreeMap<Counter, u64> = BTreeMap::new();
    for seed in 1..=3 {
        let outcome = run(&scenario, seed, Rules::real(), RunOptions::default()).unwrap();
        assert!(
            outcome.failure.is_none(),
            "seed {seed}: {}",
            outcome.failure.unwrap()
        );
        for (counter, n) in outcome.measurements.counters {
            *taken.entry(counter).or_default() += n;
        }
    }
    for path in [
        Counter::LogFollowLooked,
        Counter::HomingdFailover,
        Counter::WaitWokenVacated,
        Counter::DcShutdownDrained,
    ] {
        assert!(
            taken.get(&path).is_some_and(|&n| n > 0),
            "{path}: {taken:?}"
        );
    }
}

#[test]
fn a_log_follower_that_wakes_nobody_loses_a_wake_up_across_homingd() {
    let scenario = support::scenario("instances", 40_000);
    let broken = support::mutant(Mutation::FollowerWakesNobody);
    let (_, failure) = support::first_failure(&scenario, broken);
    assert_eq!(
        failure.violation.invariant,
        Invariant::NoLostWakeup,
        "{failure}"
    );
}

#[test]
fn with_one_homingd_per_dc_the_follower_is_not_run() {
    // A homingd alone in its DC learns of every write as it makes it: the
    // broken follower changes nothing, to the trace.
    let mut scenario = support::scenario("instances", 20_000);
    scenario.instances_per_dc = 1;
    scenario.faults.retain(|f| {
        !matches!(
            f,
            homing_sim::scenario::Fault::CrashDc {
                instance: Some(_),
                ..
            }
        )
    });
    let real = run(&scenario, 1, Rules::real(), RunOptions::default()).unwrap();
    let broken = support::mutant(Mutation::FollowerWakesNobody);
    let mutant = run(&scenario, 1, broken, RunOptions::default()).unwrap();
    assert!(real.failure.is_none(), "{}", real.failure.unwrap());
    assert_eq!(real.trace_hash, mutant.trace_hash);
    assert_eq!(real.measurements.counted(Counter::LogFollowLooked), 0);
}
