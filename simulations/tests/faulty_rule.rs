//! A deliberately broken record rule, injected by the test through
//! `Rules`, must make the simulator fail — with a seed that fails again, at
//! the same event, when replayed.

use homing_core::{
    DcRecord, FencingToken, LeasePolicy, LinkReply, RecordState, ReleaseCause, ReservationId,
    StoreTime, Transition,
};
use homing_sim::{Invariant, Rules, RunOptions, Scenario, run};

/// Links whatever it is asked to link: no liveness check, no token CAS.
fn link_ignoring_liveness(
    record: &DcRecord,
    to: &ReservationId,
    _expected: FencingToken,
    _now: StoreTime,
    _policy: &LeasePolicy,
) -> Transition<LinkReply> {
    if let RecordState::Linked { to: existing } = &record.state {
        let reply = if existing == to {
            LinkReply::Linked
        } else {
            LinkReply::AlreadyLinked(existing.clone())
        };
        return Transition { next: None, reply };
    }
    let mut next = record.clone();
    next.state = RecordState::Linked { to: to.clone() };
    next.version += 1;
    Transition {
        next: Some(next),
        reply: LinkReply::Linked,
    }
}

/// Reaps every active lease at once, ignoring its expiry and the grace period.
fn expire_ignoring_expiry(
    record: &DcRecord,
    now: StoreTime,
    _policy: &LeasePolicy,
) -> Option<DcRecord> {
    let RecordState::Active { .. } = record.state else {
        return None;
    };
    let mut next = record.clone();
    next.state = RecordState::Released {
        at: now,
        cause: ReleaseCause::Expired,
    };
    next.version += 1;
    Some(next)
}

fn racing() -> Scenario {
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/scenarios/racing-dcs.toml"
    ))
    .unwrap();
    let mut scenario = Scenario::from_toml(&text).unwrap();
    scenario.duration_ms = 20_000;
    scenario
}

#[test]
fn link_rule_ignoring_liveness_breaks_an_invariant_and_the_seed_replays_the_failure() {
    let scenario = racing();
    let broken = Rules {
        link: link_ignoring_liveness,
        ..Rules::real()
    };
    let failing = (1..=20)
        .find_map(|seed| {
            let outcome = run(&scenario, seed, broken, RunOptions::default()).unwrap();
            outcome.failure.map(|f| (seed, f))
        })
        .expect("some seed in 1..=20 catches the broken link rule");
    let (seed, first) = failing;
    println!("{first}");
    assert!(
        matches!(
            first.violation.invariant,
            Invariant::SingleHolder | Invariant::TokenAlongChain | Invariant::TokenAcrossHolders
        ),
        "unexpected invariant: {first}"
    );
    let again = run(&scenario, seed, broken, RunOptions::default())
        .unwrap()
        .failure
        .expect("the same seed fails again");
    assert_eq!(again.event_index, first.event_index);
    assert_eq!(again.violation.invariant, first.violation.invariant);
    // The real rule passes the very same seed.
    let real = run(&scenario, seed, Rules::real(), RunOptions::default()).unwrap();
    assert!(real.failure.is_none(), "{}", real.failure.unwrap());
}

#[test]
fn reaper_ignoring_expiry_lets_two_holders_act_at_once_and_the_seed_replays_it() {
    let scenario = racing();
    let broken = Rules {
        expire: expire_ignoring_expiry,
        ..Rules::real()
    };
    let (seed, first) = (1..=20)
        .find_map(|seed| {
            let outcome = run(&scenario, seed, broken, RunOptions::default()).unwrap();
            outcome.failure.map(|f| (seed, f))
        })
        .expect("some seed in 1..=20 catches the broken reaper");
    println!("{first}");
    assert_eq!(
        first.violation.invariant,
        Invariant::SingleHolder,
        "{first}"
    );
    let again = run(&scenario, seed, broken, RunOptions::default())
        .unwrap()
        .failure
        .expect("the same seed fails again");
    assert_eq!(again.event_index, first.event_index);
}

fn never_expire(_record: &DcRecord, _now: StoreTime, _policy: &LeasePolicy) -> Option<DcRecord> {
    None
}

#[test]
fn reaper_that_never_reaps_fails_the_end_of_run_liveness_check() {
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/scenarios/lease-expiry-storm.toml"
    ))
    .unwrap();
    let mut scenario = Scenario::from_toml(&text).unwrap();
    scenario.duration_ms = 15_000;
    let broken = Rules {
        expire: never_expire,
        ..Rules::real()
    };
    let failure = run(&scenario, 1, broken, RunOptions::default())
        .unwrap()
        .failure
        .expect("leases of crashed hosts stay active forever");
    assert_eq!(
        failure.violation.invariant,
        Invariant::ReaperProgress,
        "{failure}"
    );
    let real = run(&scenario, 1, Rules::real(), RunOptions::default()).unwrap();
    assert!(real.failure.is_none(), "{}", real.failure.unwrap());
}
