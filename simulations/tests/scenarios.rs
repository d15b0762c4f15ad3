//! Every scenario in `scenarios/`: the same seed gives the same trace, and a
//! few seeds keep every invariant. Kept small enough for a debug build.

use std::path::PathBuf;

use homing_sim::counter::{Counter, Op};
use homing_sim::report::Measurements;
use homing_sim::{Rules, RunOptions, Scenario, run};

fn scenarios() -> Vec<(String, Scenario)> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("scenarios");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "toml"))
        .collect();
    files.sort();
    assert!(
        files.len() >= 8,
        "expected the eight scenarios, found {files:?}"
    );
    files
        .into_iter()
        .map(|p| {
            let scenario = Scenario::load(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
            (p.display().to_string(), scenario)
        })
        .collect()
}

#[test]
fn every_scenario_run_twice_with_one_seed_gives_the_same_trace_hash() {
    for (path, scenario) in scenarios() {
        let a = run(&scenario, 1, Rules::real(), RunOptions::default()).unwrap();
        let b = run(&scenario, 1, Rules::real(), RunOptions::default()).unwrap();
        assert!(a.failure.is_none(), "{path}: {}", a.failure.unwrap());
        assert!(a.events > 10_000, "{path}: only {} events", a.events);
        assert_eq!(a.trace_hash, b.trace_hash, "{path}");
        assert_eq!(a.events, b.events, "{path}");
        let other = run(&scenario, 2, Rules::real(), RunOptions::default()).unwrap();
        assert_ne!(
            a.trace_hash, other.trace_hash,
            "{path}: seeds 1 and 2 ran alike"
        );
    }
}

#[test]
fn every_scenario_keeps_every_invariant_for_several_seeds() {
    for (path, scenario) in scenarios() {
        for seed in 2..=4 {
            let outcome = run(&scenario, seed, Rules::real(), RunOptions::default()).unwrap();
            if let Some(failure) = outcome.failure {
                panic!("{path}:\n{failure}");
            }
        }
    }
}

#[test]
fn messages_survive_the_wire_encoding_without_changing_the_run() {
    let (_, mut scenario) = scenarios()
        .into_iter()
        .find(|(p, _)| p.ends_with("racing-dcs.toml"))
        .unwrap();
    scenario.duration_ms = 10_000;
    let plain = run(&scenario, 5, Rules::real(), RunOptions::default()).unwrap();
    scenario.encode_messages = true;
    let encoded = run(&scenario, 5, Rules::real(), RunOptions::default()).unwrap();
    assert!(encoded.failure.is_none());
    assert_eq!(plain.trace_hash, encoded.trace_hash);
}

#[test]
fn a_scenario_with_an_unknown_field_or_dc_is_refused_naming_it() {
    let err = Scenario::from_toml("dcs = [\"iad\"]\nbogus = 1").unwrap_err();
    assert!(err.to_string().contains("bogus"), "{err}");
    let err =
        Scenario::from_toml("[[faults]]\nkind = \"crash_dc\"\ndc = \"lhr\"\nat_ms = 1\nfor_ms = 1")
            .unwrap_err();
    assert!(err.to_string().contains("lhr"), "{err}");
    let err = Scenario::from_toml("[lease]\nttl_ms = 0").unwrap_err();
    assert!(err.to_string().contains("lease_ttl_ms"), "{err}");
}

/// The measurements of `scenarios/<name>.toml`'s seed 1, which must keep every invariant.
fn measured(name: &str) -> Measurements {
    let (path, scenario) = scenarios()
        .into_iter()
        .find(|(p, _)| p.ends_with(&format!("/{name}.toml")))
        .unwrap();
    let outcome = run(&scenario, 1, Rules::real(), RunOptions::default()).unwrap();
    if let Some(failure) = outcome.failure {
        panic!("{path}:\n{failure}");
    }
    outcome.measurements
}

#[test]
fn a_failing_store_fails_operations_lands_some_failed_writes_and_keeps_every_invariant() {
    let measured = measured("failing-store");
    let count = |what| measured.counted(what);
    let counters = &measured.counters;
    // Failures reach requests and the upkeep pass, and some failed writes
    // committed anyway (the ambiguous outcome).
    assert!(count(Counter::DcStoreOpFailed) > 100, "{counters:?}");
    assert!(count(Counter::DcStoreFailedWriteLanded) > 0, "{counters:?}");
    assert!(count(Counter::AcquireErrorUnavailable) > 0, "{counters:?}");
    assert!(count(Counter::UpkeepScanFailed) > 0, "{counters:?}");
}

#[test]
fn a_graceful_restart_answers_what_is_parked_and_exits_only_once_drained() {
    let measured = measured("graceful-restart");
    let count = |what| measured.counted(what);
    let counters = &measured.counters;
    // Every shutdown drained before its restart: none was cut like a crash
    // (an acquire waiting at another DC used to hold it for its whole wait).
    assert_eq!(count(Counter::DcShutdownStarted), 3, "{counters:?}");
    assert_eq!(count(Counter::DcShutdownDrained), 3, "{counters:?}");
    assert_eq!(count(Counter::DcShutdownCut), 0, "{counters:?}");
    assert!(count(Counter::DcRefusedShuttingDown) > 0, "{counters:?}");
    assert!(
        count(Counter::AcquireAnsweredAtShutdown) > 0,
        "{counters:?}"
    );
}

#[test]
fn a_returning_dc_reconciles_every_takeover_of_its_tails_as_a_task_of_its_own() {
    let measured = measured("dc-lost-and-back");
    let count = |what| measured.counted(what);
    let counters = &measured.counters;
    // Only iad is lost: every takeover is of one of its tails, and each is
    // applied once iad is back (its reconciliation's updates pay the
    // store's latency; none failed in this run).
    assert!(count(Counter::Takeovers) > 0, "{counters:?}");
    assert_eq!(
        count(Counter::TakeoversReconciled),
        count(Counter::Takeovers),
        "{counters:?}"
    );
    assert_eq!(count(Counter::ReconcileFailed), 0, "{counters:?}");
}

#[test]
fn a_reconciliation_failing_on_a_failing_store_resumes_where_it_got_to_and_applies_every_takeover()
{
    let (_, mut scenario) = scenarios()
        .into_iter()
        .find(|(p, _)| p.ends_with("/dc-lost-and-back.toml"))
        .unwrap();
    // iad comes back at 80 s onto a store failing 30 % of its operations:
    // its seven takeovers (one page) need 14 to succeed in a row to finish
    // in one pass (0.7^14: under 1 %).
    scenario
        .faults
        .push(homing_sim::scenario::Fault::FailingStore {
            dc: "iad".into(),
            at_ms: 79_000,
            for_ms: 30_000,
            fraction: 0.3,
        });
    let outcome = run(&scenario, 1, Rules::real(), RunOptions::default()).unwrap();
    if let Some(failure) = outcome.failure {
        panic!("{failure}");
    }
    let measured = outcome.measurements;
    let count = |what| measured.counted(what);
    let counters = &measured.counters;
    assert!(count(Counter::ReconcileFailed) > 0, "{counters:?}");
    assert!(count(Counter::ReconcileResumed) > 0, "{counters:?}");
    // Every takeover applied: by a pass, or by a supersede whose write
    // failed but landed (the next pass finds it applied).
    let (applied, landed) = (
        count(Counter::TakeoversReconciled),
        count(Counter::DcStoreFailedWriteLanded),
    );
    assert!(applied <= count(Counter::Takeovers), "{counters:?}");
    assert!(
        applied + landed >= count(Counter::Takeovers),
        "{counters:?}"
    );
}

#[test]
fn concurrent_resolves_of_one_key_at_a_router_share_one_walk() {
    let measured = measured("baseline");
    let joined = measured
        .by_op
        .get(&Op::ResolveJoined)
        .map_or(0, |s| s.count);
    // The hot keys are resolved often enough that resolves meet a walk in
    // flight and take its outcome (the run keeps every invariant: `measured`).
    assert!(joined > 1_000, "{:?}", measured.by_op.keys());
}

#[test]
fn a_dc_past_its_key_quota_refuses_creates_and_keeps_every_invariant() {
    // The quota is the endpoint's, as homingd's: each DC counts its keys in
    // its store at its first create of a namespace (and after a crash).
    let (path, mut scenario) = scenarios()
        .into_iter()
        .find(|(p, _)| p.ends_with("/baseline.toml"))
        .unwrap();
    scenario.duration_ms = 30_000;
    scenario.keys_per_namespace_max = 5;
    let outcome = run(&scenario, 1, Rules::real(), RunOptions::default()).unwrap();
    if let Some(failure) = outcome.failure {
        panic!("{path}:\n{failure}");
    }
    let measured = outcome.measurements;
    let counters = &measured.counters;
    assert!(
        measured.counted(Counter::AcquireErrorQuota) > 0,
        "{counters:?}"
    );
    // Keys are still created (up to each DC's quota) and acquired.
    let created = measured.by_op.get(&Op::AcquireFirst).map_or(0, |s| s.count);
    assert!(created > 0, "{counters:?}");
}

#[test]
fn session_hosts_hold_keys_under_one_heartbeat_and_drained_keys_stop_in_time() {
    let measured = measured("sessions");
    let count = |what| measured.counted(what);
    let counters = &measured.counters;
    // Sessions open, renew and hold keys; drains freeze some of their keys
    // (frozen_key_stopped judged each), a mass crash leaves sessions for
    // the upkeep to end, and the DC restart makes some sessions lapse.
    assert!(count(Counter::SessionOpened) > 20, "{counters:?}");
    assert!(count(Counter::SessionKeyFrozen) > 5, "{counters:?}");
    assert!(count(Counter::SessionEnded) > 5, "{counters:?}");
    assert!(count(Counter::HostCrashWhileHolding) > 0, "{counters:?}");
    let renewals = measured.by_op.get(&Op::RenewSession).map_or(0, |s| s.count);
    assert!(renewals > 100, "{renewals} session renewals");
}
