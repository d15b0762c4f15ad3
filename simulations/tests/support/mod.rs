//! What the simulator's mutant tests share: a scenario from the repository
//! and the first seed that catches a broken rule, checked to replay.

use homing_core::{Mutation, Mutations};
use homing_sim::{InvariantFailure, Rules, RunOptions, Scenario, run};

/// `simulations/scenarios/<name>.toml`, cut to `duration_ms`.
pub fn scenario(name: &str, duration_ms: u64) -> Scenario {
    let path = format!("{}/scenarios/{name}.toml", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&path).unwrap();
    let mut scenario = Scenario::from_toml(&text).unwrap();
    scenario.duration_ms = duration_ms;
    scenario
}

/// homing-node with `mutation` broken.
pub fn mutant(mutation: Mutation) -> Rules {
    Rules {
        mutations: Mutations::NONE.with(mutation),
        ..Rules::real()
    }
}

/// The first seed in 1..=20 whose run with `broken` fails, checked to fail
/// again at the same event and to pass with the real rules. Prints the
/// failure (with its seed, to replay).
pub fn first_failure(scenario: &Scenario, broken: Rules) -> (u64, InvariantFailure) {
    let (seed, first) = (1..=20)
        .find_map(|seed| {
            let outcome = run(scenario, seed, broken, RunOptions::default()).unwrap();
            outcome.failure.map(|f| (seed, f))
        })
        .expect("some seed in 1..=20 catches the broken rule");
    println!("seed {seed}: {first}");
    let again = run(scenario, seed, broken, RunOptions::default())
        .unwrap()
        .failure
        .expect("the same seed fails again");
    assert_eq!(again.event_index, first.event_index);
    assert_eq!(again.violation.invariant, first.violation.invariant);
    let real = run(scenario, seed, Rules::real(), RunOptions::default()).unwrap();
    assert!(real.failure.is_none(), "{}", real.failure.unwrap());
    (seed, first)
}
