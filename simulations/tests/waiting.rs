//! Waiting (acquire with `wait_ms`): each wake-up checker catches the
//! mechanism broken on purpose — a release that does not notify, a wake-up
//! of the last waiter instead of the first, a grant that forgets the wait,
//! a release that loses its outcome, an origin that waits past its own
//! deadline, a restarted DC that does not reset its old connections — the
//! same seed fails again at the same event, and the real mechanism passes
//! that seed.

mod support;

use std::collections::BTreeMap;

use homing_core::Mutation;
use homing_sim::counter::Counter;
use homing_sim::{Invariant, InvariantFailure, Rules, RunOptions, Scenario, WaitRules, run};

fn waiting() -> Scenario {
    support::scenario("waiting", 30_000)
}

/// The first seed that catches `broken` (see `support::first_failure`).
fn first_failure(scenario: &Scenario, broken: Rules) -> InvariantFailure {
    support::first_failure(scenario, broken).1
}

#[test]
fn waiting_keeps_every_invariant_and_exercises_every_path() {
    let scenario = waiting();
    // Every path below is taken by some seed of 1-10, and each keeps every
    // invariant. (This asked one seed to take them all; seeds are
    // trajectories, so every change to the draws moved that seed.)
    let mut taken: BTreeMap<Counter, u64> = BTreeMap::new();
    for seed in 1..=10 {
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
        Counter::WaitRegistered,
        Counter::WaitWokenVacated,
        Counter::WaitWokenMoved,
        Counter::WaitLeaseExpiredByWaiter,
        Counter::WaitReregister,
        Counter::WaitOverloaded,
        Counter::WaitRefused,
        Counter::WaitDeadlinePassed,
        Counter::WaitConnectRetried,
        Counter::WaitConnectionLost,
        Counter::WaitConnectionReset,
        Counter::PreviousReleasedFailed,
        Counter::PreviousExpired,
    ] {
        assert!(
            taken.get(&path).is_some_and(|&n| n > 0),
            "{path}: {taken:?}"
        );
    }
}

#[test]
fn waiting_without_a_notify_on_write_loses_a_wake_up() {
    let broken = support::mutant(Mutation::WriteForgetsWaiters);
    let failure = first_failure(&waiting(), broken);
    assert_eq!(
        failure.violation.invariant,
        Invariant::NoLostWakeup,
        "{failure}"
    );
}

#[test]
fn waking_the_last_waiter_instead_of_the_first_breaks_fifo() {
    let broken = support::mutant(Mutation::WaiterQueuePopsBack);
    let failure = first_failure(&waiting(), broken);
    assert_eq!(
        failure.violation.invariant,
        Invariant::WaiterFifo,
        "{failure}"
    );
}

#[test]
fn a_grant_that_runs_past_the_waiters_lease_lets_two_holders_act() {
    // Deadlines as if the host had sent its request a lease later than it
    // did: it acts past the expiry its DC reaps at, while a waiter takes over.
    let broken = support::mutant(Mutation::GrantRunsLate);
    let failure = first_failure(&waiting(), broken);
    assert_eq!(
        failure.violation.invariant,
        Invariant::SingleHolder,
        "{failure}"
    );
}

#[test]
fn an_origin_that_waits_for_the_tails_answer_overruns_its_own_deadline() {
    // The tail's wait ends one way later than the origin's, and its answer
    // takes another: without its own timer the origin answers its host late.
    let broken = Rules {
        waiting: WaitRules {
            origin_deadline: false,
            ..WaitRules::REAL
        },
        ..Rules::real()
    };
    let failure = first_failure(&waiting(), broken);
    assert_eq!(
        failure.violation.invariant,
        Invariant::NoLostWakeup,
        "{failure}"
    );
    assert!(
        failure.violation.detail.contains("past its own deadline"),
        "{failure}"
    );
}

#[test]
fn a_restarted_dc_that_keeps_its_old_connections_leaves_origins_waiting_on_lost_registrations() {
    // syd is down 1.5 s, far less than the 6 s idle timeout: with stateless
    // resets its peers learn of the lost registrations a keep-alive after
    // the restart; without, only at the idle timeout.
    let broken = Rules {
        waiting: WaitRules {
            reset_on_restart: false,
            ..WaitRules::REAL
        },
        ..Rules::real()
    };
    let failure = first_failure(&waiting(), broken);
    assert_eq!(
        failure.violation.invariant,
        Invariant::NoLostWakeup,
        "{failure}"
    );
    assert!(failure.violation.detail.contains("was lost"), "{failure}");
}

#[test]
fn a_release_that_forgets_the_outcome_tells_the_next_holder_a_wrong_previous_run() {
    let broken = support::mutant(Mutation::ReleaseForgetsOutcome);
    let failure = first_failure(&waiting(), broken);
    assert_eq!(
        failure.violation.invariant,
        Invariant::PreviousRunTrue,
        "{failure}"
    );
}

#[test]
fn awaits_and_previous_runs_survive_the_wire_encoding_without_changing_the_run() {
    let mut scenario = waiting();
    scenario.duration_ms = 15_000;
    let plain = run(&scenario, 3, Rules::real(), RunOptions::default()).unwrap();
    scenario.encode_messages = true;
    let encoded = run(&scenario, 3, Rules::real(), RunOptions::default()).unwrap();
    assert!(encoded.failure.is_none(), "{}", encoded.failure.unwrap());
    assert!(encoded.measurements.counted(Counter::WaitWokenVacated) > 0);
    assert_eq!(plain.trace_hash, encoded.trace_hash);
}
