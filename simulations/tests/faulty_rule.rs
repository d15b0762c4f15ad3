//! A rule of homing-node broken on purpose (cargo feature `mutations`) must
//! make the simulator fail — with a seed that fails again, at the same
//! event, when replayed, and that the real rules pass. The rules broken are
//! the ones homingd runs, not a copy.

mod support;

use homing_core::Mutation;
use homing_sim::InvariantFailure;
use homing_sim::{Invariant, Rules, RunOptions, run};
use support::{first_failure, mutant, scenario};

/// A broken link shows as two holders or as tokens out of order.
fn assert_holders_or_tokens(first: &InvariantFailure) {
    assert!(
        matches!(
            first.violation.invariant,
            Invariant::SingleHolder | Invariant::TokenAlongChain | Invariant::TokenAcrossHolders
        ),
        "unexpected invariant: {first}"
    );
}

#[test]
fn link_ignoring_liveness_breaks_an_invariant_and_the_seed_replays_the_failure() {
    let (_, first) = first_failure(
        &scenario("racing-dcs", 20_000),
        mutant(Mutation::LinkIgnoresLiveness),
    );
    assert_holders_or_tokens(&first);
}

#[test]
fn reaper_ignoring_expiry_lets_two_holders_act_at_once_and_the_seed_replays_it() {
    let (_, first) = first_failure(
        &scenario("racing-dcs", 20_000),
        mutant(Mutation::ReaperIgnoresExpiry),
    );
    assert_eq!(
        first.violation.invariant,
        Invariant::SingleHolder,
        "{first}"
    );
}

#[test]
fn reaper_that_never_reaps_fails_the_end_of_run_liveness_check() {
    let scenario = scenario("lease-expiry-storm", 15_000);
    let broken = mutant(Mutation::ExpiryNeverComes);
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

#[test]
fn link_ignoring_the_token_breaks_an_invariant_and_the_seed_replays_it() {
    let (_, first) = first_failure(
        &scenario("racing-dcs", 60_000),
        mutant(Mutation::LinkIgnoresToken),
    );
    assert_holders_or_tokens(&first);
}

#[test]
fn sweeper_abandoning_without_proof_breaks_a_chain_and_the_seed_replays_it() {
    let (_, first) = first_failure(
        &scenario("partition-during-recreation", 30_000),
        mutant(Mutation::SweeperSkipsProof),
    );
    assert_eq!(first.violation.invariant, Invariant::ChainShape, "{first}");
}

#[test]
fn drain_forwarded_twice_breaks_drain_forwarded_once_and_the_seed_replays_it() {
    let (_, first) = first_failure(
        &scenario("drain", 60_000),
        mutant(Mutation::DrainForwardedTwice),
    );
    assert_eq!(
        first.violation.invariant,
        Invariant::DrainForwardedOnce,
        "{first}"
    );
}

#[test]
fn grants_not_gated_by_the_dc_lease_outlive_its_expiry_and_the_seed_replays_it() {
    // gru is cut off from the global store at 20 s for 45 s: its lease
    // expires in the store's judgement about 32 s after the last renewal
    // it received, while the mutant keeps granting and renewing.
    let (_, first) = first_failure(
        &scenario("dc-cut-from-global", 60_000),
        mutant(Mutation::GrantsNotGated),
    );
    assert_eq!(
        first.violation.invariant,
        Invariant::DcExpiredNoHolder,
        "{first}"
    );
}

#[test]
fn a_returning_dc_that_skips_reconciling_takeovers_serves_its_stale_records_and_the_seed_replays_it()
 {
    // iad is down from 20 s to 80 s, long enough to be taken over; back, the
    // mutant serves (resolves, grants) from its stale records without ever
    // applying the takeovers. Caught as a resolve answered with a tail the
    // taker had already replaced (seed 1), before any grant overlaps.
    let (_, first) = first_failure(
        &scenario("dc-lost-and-back", 120_000),
        mutant(Mutation::TakeoversNotReconciled),
    );
    assert!(
        matches!(
            first.violation.invariant,
            Invariant::SingleHolder | Invariant::TokenAcrossHolders | Invariant::ResolveWasTrue
        ),
        "unexpected invariant: {first}"
    );
}

#[test]
fn a_watch_checking_its_cursor_on_a_rounds_first_page_only_skips_trimmed_events() {
    let (_, first) = first_failure(
        &scenario("watch-lagging", 30_000),
        mutant(Mutation::WatchChecksFirstPageOnly),
    );
    assert_eq!(
        first.violation.invariant,
        Invariant::WatchGapFree,
        "{first}"
    );
}

#[test]
fn an_absent_answer_reused_past_its_freshness_is_caught_as_an_untrue_resolve() {
    let (_, first) = first_failure(
        &scenario("baseline", 30_000),
        mutant(Mutation::AbsentNeverStale),
    );
    assert_eq!(
        first.violation.invariant,
        Invariant::ResolveWasTrue,
        "{first}"
    );
}

#[test]
fn a_create_decided_by_a_remembered_absence_lets_two_dcs_hold_the_key() {
    let (_, first) = first_failure(
        &scenario("baseline", 30_000),
        mutant(Mutation::AbsentDecidesCreate),
    );
    assert_eq!(
        first.violation.invariant,
        Invariant::SingleHolder,
        "{first}"
    );
}

#[test]
fn a_retry_joined_to_another_hosts_acquire_gets_a_grant_that_is_not_its_own() {
    let (_, first) = first_failure(
        &scenario("racing-dcs", 60_000),
        mutant(Mutation::RetryJoinsAnyAcquire),
    );
    assert_eq!(
        first.violation.invariant,
        Invariant::SingleHolder,
        "{first}"
    );
}

#[test]
fn a_router_reusing_not_found_past_its_freshness_is_caught_as_an_untrue_resolve() {
    let (_, first) = first_failure(
        &scenario("baseline", 30_000),
        mutant(Mutation::RouterAbsentNeverStale),
    );
    assert_eq!(
        first.violation.invariant,
        Invariant::ResolveWasTrue,
        "{first}"
    );
}

#[test]
fn a_router_taking_a_silent_global_read_as_no_entry_is_caught_as_an_untrue_resolve() {
    let (_, first) = first_failure(
        &scenario("dc-lost", 60_000),
        mutant(Mutation::RouterSilenceIsAbsent),
    );
    assert_eq!(
        first.violation.invariant,
        Invariant::ResolveWasTrue,
        "{first}"
    );
}
