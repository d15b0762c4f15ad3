//! Waiting (acquire with `wait_ms`): each wake-up checker catches the
//! mechanism broken on purpose — a release that does not notify, a wake-up
//! of the last waiter instead of the first, a grant that forgets the wait,
//! a release that loses its outcome, an origin that waits past its own
//! deadline, a restarted DC that does not reset its old connections — the
//! same seed fails again at the same event, and the real mechanism passes
//! that seed.

use homing_core::{DcRecord, FencingToken, ReleaseReply, RunOutcome, StoreTime, Transition};
use homing_node::{Mutation, Mutations};
use homing_sim::{Failure, Invariant, Rules, RunOptions, Scenario, WaitRules, run};

fn waiting() -> Scenario {
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/scenarios/waiting.toml"
    ))
    .unwrap();
    let mut scenario = Scenario::from_toml(&text).unwrap();
    scenario.duration_ms = 30_000;
    scenario
}

/// The first seed in 1..=20 whose run with `broken` fails, checked to fail
/// again at the same event and to pass with the real rules.
fn first_failure(scenario: &Scenario, broken: Rules) -> Failure {
    let (seed, first) = (1..=20)
        .find_map(|seed| {
            let outcome = run(scenario, seed, broken, RunOptions::default()).unwrap();
            outcome.failure.map(|f| (seed, f))
        })
        .expect("some seed in 1..=20 catches the broken mechanism");
    println!("{first}");
    let again = run(scenario, seed, broken, RunOptions::default())
        .unwrap()
        .failure
        .expect("the same seed fails again");
    assert_eq!(again.event_index, first.event_index);
    assert_eq!(again.violation.invariant, first.violation.invariant);
    let real = run(scenario, seed, Rules::real(), RunOptions::default()).unwrap();
    assert!(real.failure.is_none(), "{}", real.failure.unwrap());
    first
}

#[test]
fn waiting_keeps_every_invariant_and_exercises_every_path() {
    let scenario = waiting();
    let outcome = run(&scenario, 7, Rules::real(), RunOptions::default()).unwrap();
    assert!(outcome.failure.is_none(), "{}", outcome.failure.unwrap());
    let counters = &outcome.measurements.counters;
    for path in [
        "wait_registered",
        "wait_woken_vacated",
        "wait_woken_moved",
        "wait_lease_expired_by_waiter",
        "wait_reregister",
        "wait_overloaded",
        "wait_refused",
        "wait_deadline_passed",
        "wait_connect_retried",
        "wait_connection_lost",
        "wait_connection_reset",
        "previous_released_failed",
        "previous_expired",
    ] {
        assert!(
            counters.get(path).is_some_and(|n| *n > 0),
            "{path}: {counters:?}"
        );
    }
}

#[test]
fn waiting_without_a_notify_on_write_loses_a_wake_up() {
    let broken = Rules {
        mutations: Mutations::NONE.with(Mutation::WriteForgetsWaiters),
        ..Rules::real()
    };
    let failure = first_failure(&waiting(), broken);
    assert_eq!(
        failure.violation.invariant,
        Invariant::NoLostWakeup,
        "{failure}"
    );
}

#[test]
fn waking_the_last_waiter_instead_of_the_first_breaks_fifo() {
    let broken = Rules {
        mutations: Mutations::NONE.with(Mutation::WaiterQueuePopsBack),
        ..Rules::real()
    };
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
    let broken = Rules {
        mutations: Mutations::NONE.with(Mutation::GrantRunsLate),
        ..Rules::real()
    };
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

/// Releases, but records every run as `Ok` whatever the holder said.
fn release_forgetting_the_outcome(
    record: &DcRecord,
    token: FencingToken,
    _outcome: RunOutcome,
    now: StoreTime,
) -> Transition<ReleaseReply> {
    record.release(token, RunOutcome::Ok, now)
}

#[test]
fn a_release_that_forgets_the_outcome_tells_the_next_holder_a_wrong_previous_run() {
    let broken = Rules {
        release: release_forgetting_the_outcome,
        ..Rules::real()
    };
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
    assert!(
        encoded
            .measurements
            .counters
            .contains_key("wait_woken_vacated")
    );
    assert_eq!(plain.trace_hash, encoded.trace_hash);
}
