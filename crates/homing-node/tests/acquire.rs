//! Acquire's wait loop over in-memory DCs (homing-core's walkthrough
//! world): connects are performed at once, time is moved by hand.

#[path = "../../homing-core/examples/walkthrough/world.rs"]
mod world;

use homing_core::Grant;
use homing_core::{
    AcquireReply, ActorId, AwaitReply, DcId, ErrorKind, ErrorReply, FencingToken, HostTime, Key,
    KeyName, ReleaseCause, RunOutcome, chain::HOP_LIMIT_DEFAULT,
};
use homing_node::{
    AWAIT_RETRY_MS, Acquire, AcquireEvent, AcquirePoll, AcquireRequest, Failure, Mutations,
    NodeTime,
};
use world::{World, lease_of};

const HOST_TIME_MS: u64 = 7;

fn dc(name: &str) -> DcId {
    DcId::new(name).unwrap()
}

fn key() -> Key {
    Key::new(KeyName::new("room").unwrap())
}

fn start(world: &World, at: &str, actor: &str, wait_ms: u32) -> Acquire {
    let request = AcquireRequest {
        key: key(),
        tag: None,
        actor: ActorId::new(actor).unwrap(),
        lease: lease_of(&ActorId::new(actor).unwrap()),
        host_time: HostTime::from_ms(HOST_TIME_MS),
        wait_ms,
    };
    Acquire::new(
        dc(at),
        request,
        node_now(world),
        world.policy,
        HOP_LIMIT_DEFAULT,
        Mutations::NONE,
    )
}

/// The node clock reads the world's store clock here.
fn node_now(world: &World) -> NodeTime {
    NodeTime::from_us(world.now_ms * 1000)
}

/// Performs connects until the acquire asks for something else.
fn drive(world: &mut World, at: &str, acquire: &mut Acquire) -> AcquirePoll {
    for _ in 0..1_000 {
        match acquire.poll(node_now(world)) {
            // These worlds have no DC leases: every grant is covered.
            AcquirePoll::Cover { .. } => acquire.handle_covered(Ok(())),
            // The world performs the connect's need itself, whichever
            // effect the acquire asks it as.
            AcquirePoll::Store(_) | AcquirePoll::Global(_) | AcquirePoll::Connect(_) => {
                assert!(world.step(&dc(at), acquire.connect()));
            }
            other => return other,
        }
    }
    panic!("acquire did not leave its connect in 1000 steps");
}

fn events(acquire: &mut Acquire) -> Vec<AcquireEvent> {
    std::iter::from_fn(|| acquire.poll_event()).collect()
}

/// iad's a1 holds the key; fra's a2 asks with `wait_ms` and is told to await.
fn held_at_iad(wait_ms: u32) -> (World, Acquire) {
    let mut world = World::new(&["iad", "fra"]);
    let mut first = start(&world, "iad", "a1", 0);
    assert!(matches!(
        drive(&mut world, "iad", &mut first),
        AcquirePoll::Done(Ok(AcquireReply::Acquired(_)))
    ));
    let mut second = start(&world, "fra", "a2", wait_ms);
    match drive(&mut world, "fra", &mut second) {
        AcquirePoll::Await {
            reservation,
            wait_ms: asked,
            until,
        } => {
            assert_eq!(reservation.to_string(), "iad.1");
            assert_eq!(asked, wait_ms);
            assert_eq!(until, node_now(&world).plus_ms(u64::from(wait_ms)));
        }
        other => panic!("expected an await, got {other:?}"),
    }
    assert_eq!(events(&mut second), [AcquireEvent::Awaiting]);
    (world, second)
}

#[test]
fn acquire_without_a_wait_answers_held_elsewhere_at_once() {
    let mut world = World::new(&["iad", "fra"]);
    let mut first = start(&world, "iad", "a1", 0);
    drive(&mut world, "iad", &mut first);
    let mut second = start(&world, "fra", "a2", 0);
    assert!(matches!(
        drive(&mut world, "fra", &mut second),
        AcquirePoll::Done(Ok(AcquireReply::HeldElsewhere(_)))
    ));
}

#[test]
fn acquire_vacated_connects_again_granting_from_host_time_plus_time_held() {
    let (mut world, mut acquire) = held_at_iad(5_000);
    world.now_ms += 1_000;
    world.release(&"iad.1".parse().unwrap(), FencingToken::FIRST);
    let vacated = AwaitReply::Vacated {
        ended: ReleaseCause::Released(RunOutcome::Ok),
    };
    acquire.handle_awaited(node_now(&world), Ok(vacated));
    let AcquirePoll::Done(Ok(AcquireReply::Acquired(Grant {
        reservation,
        deadlines,
        ..
    }))) = drive(&mut world, "fra", &mut acquire)
    else {
        panic!("expected the key")
    };
    assert_eq!(reservation.to_string(), "fra.1");
    let expected = world
        .policy
        .grant(HostTime::from_ms(HOST_TIME_MS + 1_000), world.now());
    assert_eq!(deadlines, expected.deadlines, "host time + the 1 s held");
}

/// The acquire asks whether the DC lease covers a grant from now; yes.
fn covered(world: &World, acquire: &mut Acquire) {
    let AcquirePoll::Cover { from } = acquire.poll(node_now(world)) else {
        panic!("a connect that may grant asks about the dc lease first")
    };
    assert_eq!(from, node_now(world));
    acquire.handle_covered(Ok(()));
}

#[test]
fn acquire_a_grant_after_a_wait_is_refused_when_the_dc_lease_no_longer_covers_it() {
    let (mut world, mut acquire) = held_at_iad(5_000);
    world.now_ms += 4_000;
    world.release(&"iad.1".parse().unwrap(), FencingToken::FIRST);
    let vacated = AwaitReply::Vacated {
        ended: ReleaseCause::Released(RunOutcome::Ok),
    };
    acquire.handle_awaited(node_now(&world), Ok(vacated));
    // The grant would count from host time + 4 s held: the DC lease is asked
    // about that term, not the one the acquire arrived with.
    let AcquirePoll::Cover { from } = acquire.poll(node_now(&world)) else {
        panic!("the reconnect asks about the dc lease")
    };
    assert_eq!(from, node_now(&world));
    let refused = ErrorReply::new(
        ErrorKind::Unavailable {
            dc: "fra".parse().unwrap(),
        },
        "no host lease granted or renewed",
    );
    acquire.handle_covered(Err(Failure::Unreachable(refused)));
    let AcquirePoll::Done(Err(e)) = acquire.poll(node_now(&world)) else {
        panic!("expected Unavailable")
    };
    assert!(
        matches!(e.kind, ErrorKind::Unavailable { ref dc } if dc.as_str() == "fra"),
        "{e:?}"
    );
}

#[test]
fn acquire_a_wait_cut_short_pauses_then_connects_and_waits_again() {
    let (mut world, mut acquire) = held_at_iad(5_000);
    world.now_ms += 10;
    acquire.handle_awaited(node_now(&world), Ok(AwaitReply::TimedOut));
    let AcquirePoll::Pause { until } = drive(&mut world, "fra", &mut acquire) else {
        panic!("expected a pause")
    };
    assert_eq!(until, node_now(&world).plus_ms(AWAIT_RETRY_MS));
    assert_eq!(
        events(&mut acquire),
        [AcquireEvent::WaitCutShort, AcquireEvent::WaitReregister]
    );
    world.now_ms += AWAIT_RETRY_MS;
    acquire.handle_timeout(node_now(&world));
    assert!(matches!(
        drive(&mut world, "fra", &mut acquire),
        AcquirePoll::Await { wait_ms: 4_740, .. }
    ));
}

#[test]
fn acquire_the_wait_running_out_takes_one_last_look_that_is_the_answer() {
    let (mut world, mut acquire) = held_at_iad(5_000);
    world.now_ms += 5_000;
    acquire.handle_awaited(node_now(&world), Ok(AwaitReply::TimedOut));
    assert!(matches!(
        drive(&mut world, "fra", &mut acquire),
        AcquirePoll::Done(Ok(AcquireReply::HeldElsewhere(_)))
    ));
    assert_eq!(events(&mut acquire), [AcquireEvent::WaitTimedOut]);
}

#[test]
fn acquire_an_unreachable_dc_is_tried_again_only_within_the_wait() {
    let unreachable = || {
        Failure::Unreachable(ErrorReply::new(
            ErrorKind::Unavailable { dc: dc("iad") },
            "iad did not answer",
        ))
    };
    let world = World::new(&["iad", "fra"]);
    let mut patient = start(&world, "fra", "a2", 5_000);
    covered(&world, &mut patient);
    assert!(matches!(
        patient.poll(node_now(&world)),
        AcquirePoll::Global(_)
    ));
    patient.handle_failure(node_now(&world), unreachable());
    assert!(matches!(
        patient.poll(node_now(&world)),
        AcquirePoll::Pause { .. }
    ));
    let mut hasty = start(&world, "fra", "a2", 0);
    covered(&world, &mut hasty);
    hasty.poll(node_now(&world));
    hasty.handle_failure(node_now(&world), unreachable());
    let AcquirePoll::Done(Err(e)) = hasty.poll(node_now(&world)) else {
        panic!("expected the error")
    };
    assert!(matches!(e.kind, ErrorKind::Unavailable { .. }));
}

#[test]
fn acquire_a_refused_wait_is_answered_at_once_and_a_passed_deadline_answers_held() {
    let (world, mut refused) = held_at_iad(5_000);
    let full = ErrorReply::new(ErrorKind::Overloaded, "queue full");
    refused.handle_awaited(node_now(&world), Err(Failure::Refused(full)));
    let AcquirePoll::Done(Err(e)) = refused.poll(node_now(&world)) else {
        panic!("expected the refusal")
    };
    assert_eq!(e.kind, ErrorKind::Overloaded);

    let (world, mut late) = held_at_iad(5_000);
    late.handle_deadline(node_now(&world).plus_ms(5_000));
    assert!(matches!(
        late.poll(node_now(&world)),
        AcquirePoll::Done(Ok(AcquireReply::HeldElsewhere(_)))
    ));
    assert_eq!(events(&mut late), [AcquireEvent::WaitDeadlinePassed]);
}

#[test]
fn acquire_a_dc_shutting_down_answers_a_waiting_acquire_at_once_with_held_elsewhere() {
    // A graceful shutdown must not wait for the remote registration (up to
    // WAIT_MS_MAX): the host hears the key is held and may try elsewhere.
    let (world, mut waiting) = held_at_iad(60_000);
    waiting.handle_close();
    assert!(matches!(
        waiting.poll(node_now(&world)),
        AcquirePoll::Done(Ok(AcquireReply::HeldElsewhere(_)))
    ));
    assert_eq!(events(&mut waiting), [AcquireEvent::ClosedWhileWaiting]);
}

#[test]
fn a_connects_store_and_global_needs_are_asked_as_effects_and_their_answers_reach_it() {
    use homing_core::{StoreTime, Written};
    use homing_node::{CONNECT_GLOBAL_READ, GlobalAnswer, GlobalOp, StoreOp, Stored};
    let world = World::new(&["iad"]);
    let mut acquire = start(&world, "iad", "a1", 0);
    covered(&world, &mut acquire);
    let now = node_now(&world);
    let entry = GlobalOp::Entry {
        key: key(),
        read: CONNECT_GLOBAL_READ,
    };
    assert!(matches!(acquire.poll(now), AcquirePoll::Global(op) if op == entry));
    acquire.handle_global(GlobalAnswer::Entry(None));
    // Allocation stays the connect's own need (a key create takes a quota slot first).
    assert!(matches!(acquire.poll(now), AcquirePoll::Connect(_)));
    let store_now = StoreTime::from_ms(world.now_ms);
    acquire.connect().handle_allocated(1, store_now);
    let AcquirePoll::Store(StoreOp::Write {
        expected: None,
        record,
        event: true,
    }) = acquire.poll(now)
    else {
        panic!("a connect creates its record, appending a lifecycle event")
    };
    assert_eq!(record.id.to_string(), "iad.1");
    acquire.handle_stored(Stored::Written(Written::Yes), store_now);
    let set = GlobalOp::SetIfAbsent {
        key: key(),
        id: record.id.clone(),
    };
    assert!(matches!(acquire.poll(now), AcquirePoll::Global(op) if op == set));
    acquire.handle_global(GlobalAnswer::SetIfAbsent(None));
    let AcquirePoll::Done(Ok(AcquireReply::Acquired(grant))) = acquire.poll(now) else {
        panic!("the entry is ours: acquired")
    };
    assert_eq!(grant.reservation, record.id);
}
