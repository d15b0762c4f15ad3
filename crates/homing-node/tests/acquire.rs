//! Acquire's wait loop over in-memory DCs (homing-core's walkthrough
//! world): connects are performed at once, time is moved by hand.

#[path = "../../homing-core/examples/walkthrough/world.rs"]
mod world;

use homing_core::{
    AcquireReply, ActorId, AwaitReply, DcId, ErrorKind, ErrorReply, FencingToken, HostTime, Key,
    KeyName, LeaseKey, ReleaseCause, ReservationId, RunOutcome, Shortcut, Source,
    chain::HOP_LIMIT_DEFAULT,
};
use homing_core::{Grant, Mutations};
use homing_node::{
    AWAIT_RETRY_MS, Acquire, AcquireEvent, AcquireRequest, Answer, Effect, Failure, GlobalAnswer,
    GlobalOp, NodeEvent, NodeTime, Now, Step, Stepper, StoreOp, Stored,
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
        session: None,
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

/// What a driven acquire asked next, or how it ended.
type Stepped = Step<Result<AcquireReply, ErrorReply>>;

/// Performs the acquire's effects, as a driver runs its [`Stepper`], until
/// it asks for something else (a wait, a pause) or ends: its store and
/// global operations against the world's stores; every grant covered and
/// every key create admitted; the connect's segments and links by the world.
fn drive(world: &mut World, at: &str, acquire: &mut Acquire) -> Stepped {
    drive_asking(world, at, acquire).0
}

/// What an acquire asked on the way: its global operations, and how many
/// key creates it had admitted.
#[derive(Debug, Default)]
struct Asked {
    global: Vec<GlobalOp>,
    admits: usize,
    /// The lease keys a made grant asked "did its host give up?" about.
    cancelled: Vec<LeaseKey>,
}

/// [`drive`], and what the acquire asked on the way.
fn drive_asking(world: &mut World, at: &str, acquire: &mut Acquire) -> (Stepped, Asked) {
    drive_gave_up(world, at, acquire, false)
}

/// [`drive_asking`], where the host gave up on the acquire if `gave_up`.
fn drive_gave_up(
    world: &mut World,
    at: &str,
    acquire: &mut Acquire,
    gave_up: bool,
) -> (Stepped, Asked) {
    let mut asked = Asked::default();
    for _ in 0..1_000 {
        let effect = match acquire.step(node_now(world)) {
            Step::Ask(effect) => effect,
            done @ Step::Done(_) => return (done, asked),
        };
        let answer = match effect {
            // These worlds have no DC leases: every grant is covered.
            Effect::Cover { .. } => Answer::Covered(Ok(())),
            Effect::Cancellation { lease, .. } => {
                asked.cancelled.push(lease);
                Answer::Cancelled(gave_up)
            }
            Effect::Admit(namespace) => {
                assert_eq!(namespace, key().namespace);
                asked.admits += 1;
                Answer::Admitted(Ok(()))
            }
            Effect::Store(op) => Answer::Stored(Ok(perform_store(world, at, op))),
            Effect::Global(op) => {
                asked.global.push(op.clone());
                Answer::Global(Ok(perform_global(world, op)))
            }
            Effect::Segment(id) => {
                Answer::Segment(if world.down.contains(id.dc()) && id.dc() != &dc(at) {
                    let kind = ErrorKind::Unavailable {
                        dc: id.dc().clone(),
                    };
                    Err(Failure::Unreachable(ErrorReply::new(kind, "down")))
                } else {
                    Ok(world.segment(&id).expect("reservations in chains answer"))
                })
            }
            Effect::Link {
                key,
                from,
                to,
                expected_token,
            } => Answer::Linked(Ok(world.link(&key, &from, to, expected_token))),
            other => return (Step::Ask(other), asked),
        };
        acquire.answer(answer, now(world));
    }
    panic!("acquire did not leave its connect in 1000 steps");
}

/// Both clocks: the node clock reads the world's store clock here.
fn now(world: &World) -> Now {
    Now {
        node: node_now(world),
        store: world.now(),
    }
}

/// What the acquire noted for its node since the last look.
fn noted(acquire: &mut Acquire) -> Vec<NodeEvent> {
    std::iter::from_fn(|| acquire.poll_event()).collect()
}

/// DC `at`'s store in the world answers an acquire's operation.
fn perform_store(world: &mut World, at: &str, op: StoreOp) -> Stored {
    match op {
        StoreOp::Allocate => Stored::Allocated(world.allocate(&dc(at))),
        StoreOp::Read(id) => Stored::Record(
            world
                .record(&id)
                .cloned()
                .map(homing_core::RecordRead::alone),
        ),
        StoreOp::Write {
            expected, record, ..
        } => Stored::Written(world.write(expected, *record)),
        other => panic!("an acquire does not ask {other:?}"),
    }
}

/// The world's global store answers an acquire's operation.
fn perform_global(world: &mut World, op: GlobalOp) -> GlobalAnswer {
    match op {
        GlobalOp::Entry { key, .. } => GlobalAnswer::Entry(world.global.get(&key).cloned()),
        GlobalOp::SetIfAbsent { key, id } => {
            GlobalAnswer::SetIfAbsent(world.set_if_absent(key, id))
        }
        GlobalOp::Successor { id, .. } => GlobalAnswer::Successor {
            succession: world.successions.get(&id).cloned(),
            source: Source::Local,
            hint: None,
        },
        GlobalOp::Confirm(succession) => GlobalAnswer::Confirmed(world.confirm(succession)),
        GlobalOp::DcLease(dc) => GlobalAnswer::DcLease(world.dc_lease(&dc)),
        GlobalOp::TakeOver { succession, policy } => {
            GlobalAnswer::TakenOver(world.take_over(succession, policy))
        }
        other @ GlobalOp::SuccessionsOf { .. } => panic!("an acquire does not ask {other:?}"),
    }
}

/// The acquire's own events among what it noted since the last look.
fn events(acquire: &mut Acquire) -> Vec<AcquireEvent> {
    own_events(&noted(acquire))
}

fn own_events(noted: &[NodeEvent]) -> Vec<AcquireEvent> {
    let own = |e: &NodeEvent| match e {
        NodeEvent::Acquire(e) => Some(*e),
        _ => None,
    };
    noted.iter().filter_map(own).collect()
}

/// iad's a1 holds the key; fra's a2 asks with `wait_ms` and is told to await.
fn held_at_iad(wait_ms: u32) -> (World, Acquire) {
    let mut world = World::new(&["iad", "fra"]);
    let mut first = start(&world, "iad", "a1", 0);
    assert!(matches!(
        drive(&mut world, "iad", &mut first),
        Step::Done(Ok(AcquireReply::Acquired(_)))
    ));
    let mut second = start(&world, "fra", "a2", wait_ms);
    match drive(&mut world, "fra", &mut second) {
        Step::Ask(Effect::Await {
            reservation,
            wait_ms: asked,
            until,
        }) => {
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
        Step::Done(Ok(AcquireReply::HeldElsewhere(_)))
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
    acquire.answer(Answer::Awaited(Ok(vacated)), now(&world));
    let (
        Step::Done(Ok(AcquireReply::Acquired(Grant {
            reservation,
            deadlines,
            ..
        }))),
        asked,
    ) = drive_asking(&mut world, "fra", &mut acquire)
    else {
        panic!("expected the key")
    };
    assert_eq!(reservation.to_string(), "fra.1");
    // The move is confirmed in the global store, asked as an effect.
    let moved = world.successions.get(&"iad.1".parse().unwrap());
    assert_eq!(moved.map(|s| &s.link.to), Some(&reservation));
    assert!(
        asked
            .global
            .iter()
            .any(|op| matches!(op, GlobalOp::Confirm(s) if s.link.to == reservation)),
        "{asked:?}"
    );
    assert_eq!(asked.admits, 0, "a recreate creates no key: no quota slot");
    let expected = world
        .policy
        .grant(HostTime::from_ms(HOST_TIME_MS + 1_000), world.now());
    assert_eq!(deadlines, expected.deadlines, "host time + the 1 s held");
}

/// The acquire asks whether the DC lease covers a grant from now; yes.
fn covered(world: &World, acquire: &mut Acquire) {
    let Step::Ask(Effect::Cover { from }) = acquire.step(node_now(world)) else {
        panic!("a connect that may grant asks about the dc lease first")
    };
    assert_eq!(from, node_now(world));
    acquire.answer(Answer::Covered(Ok(())), now(world));
}

#[test]
fn acquire_a_grant_after_a_wait_is_refused_when_the_dc_lease_no_longer_covers_it() {
    let (mut world, mut acquire) = held_at_iad(5_000);
    world.now_ms += 4_000;
    world.release(&"iad.1".parse().unwrap(), FencingToken::FIRST);
    let vacated = AwaitReply::Vacated {
        ended: ReleaseCause::Released(RunOutcome::Ok),
    };
    acquire.answer(Answer::Awaited(Ok(vacated)), now(&world));
    // The grant would count from host time + 4 s held: the DC lease is asked
    // about that term, not the one the acquire arrived with.
    let Step::Ask(Effect::Cover { from }) = acquire.step(node_now(&world)) else {
        panic!("the reconnect asks about the dc lease")
    };
    assert_eq!(from, node_now(&world));
    let refused = ErrorReply::new(
        ErrorKind::Unavailable {
            dc: "fra".parse().unwrap(),
        },
        "no host lease granted or renewed",
    );
    acquire.answer(
        Answer::Covered(Err(Failure::Unreachable(refused))),
        now(&world),
    );
    let Step::Done(Err(e)) = acquire.step(node_now(&world)) else {
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
    acquire.answer(Answer::Awaited(Ok(AwaitReply::TimedOut)), now(&world));
    let Step::Ask(Effect::Pause { until }) = drive(&mut world, "fra", &mut acquire) else {
        panic!("expected a pause")
    };
    assert_eq!(until, node_now(&world).plus_ms(AWAIT_RETRY_MS));
    assert_eq!(
        events(&mut acquire),
        [AcquireEvent::WaitCutShort, AcquireEvent::WaitReregister]
    );
    world.now_ms += AWAIT_RETRY_MS;
    // The pause's end.
    acquire.answer(Answer::Resumed, now(&world));
    assert!(matches!(
        drive(&mut world, "fra", &mut acquire),
        Step::Ask(Effect::Await { wait_ms: 4_740, .. })
    ));
}

#[test]
fn acquire_the_wait_running_out_takes_one_last_look_that_is_the_answer() {
    let (mut world, mut acquire) = held_at_iad(5_000);
    world.now_ms += 5_000;
    acquire.answer(Answer::Awaited(Ok(AwaitReply::TimedOut)), now(&world));
    assert!(matches!(
        drive(&mut world, "fra", &mut acquire),
        Step::Done(Ok(AcquireReply::HeldElsewhere(_)))
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
        patient.step(node_now(&world)),
        Step::Ask(Effect::Global(_))
    ));
    patient.answer(Answer::Global(Err(unreachable())), now(&world));
    assert!(matches!(
        patient.step(node_now(&world)),
        Step::Ask(Effect::Pause { .. })
    ));
    let mut hasty = start(&world, "fra", "a2", 0);
    covered(&world, &mut hasty);
    hasty.step(node_now(&world));
    hasty.answer(Answer::Global(Err(unreachable())), now(&world));
    let Step::Done(Err(e)) = hasty.step(node_now(&world)) else {
        panic!("expected the error")
    };
    assert!(matches!(e.kind, ErrorKind::Unavailable { .. }));
}

#[test]
fn acquire_a_refused_wait_is_answered_at_once_and_a_passed_deadline_answers_held() {
    let (world, mut refused) = held_at_iad(5_000);
    let full = ErrorReply::new(ErrorKind::Overloaded, "queue full");
    refused.answer(Answer::Awaited(Err(Failure::Refused(full))), now(&world));
    let Step::Done(Err(e)) = refused.step(node_now(&world)) else {
        panic!("expected the refusal")
    };
    assert_eq!(e.kind, ErrorKind::Overloaded);

    let (mut world, mut late) = held_at_iad(5_000);
    world.now_ms += 5_000;
    // The wait's `until` passed before the holder's DC answered.
    late.answer(Answer::TimedOut, now(&world));
    assert!(matches!(
        late.step(node_now(&world)),
        Step::Done(Ok(AcquireReply::HeldElsewhere(_)))
    ));
    assert_eq!(events(&mut late), [AcquireEvent::WaitDeadlinePassed]);
}

#[test]
fn acquire_a_dc_shutting_down_answers_a_waiting_acquire_at_once_with_held_elsewhere() {
    // A graceful shutdown must not wait for the remote registration (up to
    // WAIT_MS_MAX): the host hears the key is held and may try elsewhere.
    let (world, mut waiting) = held_at_iad(60_000);
    waiting.answer(Answer::Closed, now(&world));
    assert!(matches!(
        waiting.step(node_now(&world)),
        Step::Done(Ok(AcquireReply::HeldElsewhere(_)))
    ));
    assert_eq!(events(&mut waiting), [AcquireEvent::ClosedWhileWaiting]);
}

/// A create of the key at DC `at` up to its record's write: covered, the
/// entry read answers absent, the quota admits the create and its unique
/// is allocated.
fn create_up_to_the_write(world: &mut World, at: &str, wait_ms: u32) -> Acquire {
    use homing_node::CONNECT_GLOBAL_READ;
    let mut acquire = start(world, at, "a1", wait_ms);
    covered(world, &mut acquire);
    let t = node_now(world);
    let entry = GlobalOp::Entry {
        key: key(),
        read: CONNECT_GLOBAL_READ,
    };
    assert!(matches!(acquire.step(t), Step::Ask(Effect::Global(op)) if op == entry));
    acquire.answer(Answer::Global(Ok(GlobalAnswer::Entry(None))), now(world));
    // A key create takes a quota slot, then allocates its reservation's unique.
    let Step::Ask(Effect::Admit(namespace)) = acquire.step(t) else {
        panic!("a key create asks the key quota first")
    };
    assert_eq!(namespace, key().namespace);
    acquire.answer(Answer::Admitted(Ok(())), now(world));
    assert!(matches!(
        acquire.step(t),
        Step::Ask(Effect::Store(StoreOp::Allocate))
    ));
    let allocated = Stored::Allocated(world.allocate(&dc(at)));
    acquire.answer(Answer::Stored(Ok(allocated)), now(world));
    acquire
}

#[test]
fn a_connects_store_and_global_needs_are_asked_as_effects_and_their_answers_reach_it() {
    use homing_core::Written;
    let mut world = World::new(&["iad"]);
    let mut acquire = create_up_to_the_write(&mut world, "iad", 0);
    let t = node_now(&world);
    let Step::Ask(Effect::Store(StoreOp::Write {
        guard: _,
        expected: None,
        record,
        event: true,
    })) = acquire.step(t)
    else {
        panic!("a connect creates its record, appending a lifecycle event")
    };
    assert_eq!(record.id.to_string(), "iad.1");
    acquire.answer(
        Answer::Stored(Ok(Stored::Written(Written::Yes))),
        now(&world),
    );
    let set = GlobalOp::SetIfAbsent {
        key: key(),
        id: record.id.clone(),
    };
    assert!(matches!(acquire.step(t), Step::Ask(Effect::Global(op)) if op == set));
    acquire.answer(
        Answer::Global(Ok(GlobalAnswer::SetIfAbsent(None))),
        now(&world),
    );
    assert!(matches!(
        acquire.step(t),
        Step::Ask(Effect::Cancellation { note: false, .. })
    ));
    acquire.answer(Answer::Cancelled(false), now(&world));
    let Step::Done(Ok(AcquireReply::Acquired(grant))) = acquire.step(t) else {
        panic!("the entry is ours: acquired")
    };
    assert_eq!(grant.reservation, record.id);
    // The entry is this create's: its quota slot stays taken.
    let settled: Vec<NodeEvent> = std::iter::from_fn(|| acquire.poll_event())
        .filter(|e| matches!(e, NodeEvent::QuotaSettled { .. }))
        .collect();
    let namespace = key().namespace;
    assert_eq!(
        settled,
        vec![NodeEvent::QuotaSettled {
            namespace,
            kept: true
        }]
    );
}

#[test]
fn a_silent_dcs_tail_is_taken_over_through_the_acquires_global_effects() {
    use homing_core::{DcLeaseState, DcMarks, DcStanding, ReservationId, SuccessionCause};
    let mut world = World::new(&["iad", "fra", "sin"]);
    let mut first = start(&world, "iad", "a1", 0);
    let (created, asked) = drive_asking(&mut world, "iad", &mut first);
    assert!(matches!(created, Step::Done(Ok(AcquireReply::Acquired(_)))));
    assert_eq!(asked.admits, 1, "the key's create takes one quota slot");
    let tail: ReservationId = "iad.1".parse().unwrap();
    world.down.insert(dc("iad"));
    world.dc_leases.insert(
        dc("iad"),
        DcLeaseState {
            standing: DcStanding::Expired,
            marks: DcMarks {
                token_bound: 40,
                ..Default::default()
            },
            ..DcLeaseState::unknown(dc("iad"))
        },
    );
    let mut second = start(&world, "fra", "a2", 0);
    let (Step::Done(Ok(AcquireReply::Acquired(grant))), asked) =
        drive_asking(&mut world, "fra", &mut second)
    else {
        panic!("fra takes over iad's silent tail")
    };
    assert_eq!(grant.token, FencingToken::new(42), "iad's token bound + 2");
    assert_eq!(asked.admits, 0, "a takeover creates no key");
    // Each answer reached the connect through the acquire: the successor
    // read (none), iad's lease (expired), then the takeover it decided.
    let successor = GlobalOp::Successor {
        id: tail.clone(),
        key: key(),
    };
    assert!(asked.global.contains(&successor), "{asked:?}");
    assert!(
        asked.global.contains(&GlobalOp::DcLease(dc("iad"))),
        "{asked:?}"
    );
    let taken = world
        .successions
        .get(&tail)
        .expect("the takeover is recorded");
    assert_eq!(taken.cause, SuccessionCause::TakenOver);
    assert_eq!(taken.link.to, grant.reservation);
    assert!(
        asked
            .global
            .iter()
            .any(|op| matches!(op, GlobalOp::TakeOver { succession, .. } if succession == taken)),
        "{asked:?}"
    );

    // Another DC reaching the silent tail reads the takeover as its
    // successor (the answer reaching its connect) and follows it.
    let mut third = start(&world, "sin", "a3", 0);
    let (Step::Done(Ok(AcquireReply::HeldElsewhere(holder))), asked) =
        drive_asking(&mut world, "sin", &mut third)
    else {
        panic!("sin follows the takeover to fra's holder")
    };
    assert_eq!(holder.reservation, grant.reservation);
    assert!(asked.global.contains(&successor), "{asked:?}");
    let judged_again =
        |op: &GlobalOp| matches!(op, GlobalOp::DcLease(_) | GlobalOp::TakeOver { .. });
    assert!(
        !asked.global.iter().any(judged_again),
        "a recorded successor is followed, the lease not judged again: {asked:?}"
    );
}

#[test]
fn a_create_tried_again_after_a_failed_write_keeps_its_quota_slot_and_is_not_admitted_twice() {
    let mut world = World::new(&["fra"]);
    let mut acquire = create_up_to_the_write(&mut world, "fra", 5_000);
    let t = node_now(&world);
    assert!(matches!(
        acquire.step(t),
        Step::Ask(Effect::Store(StoreOp::Write { .. }))
    ));
    // The DC store does not answer the create's write: pause, create again.
    let unreachable = ErrorReply::new(
        ErrorKind::Unavailable { dc: dc("fra") },
        "store: not answering",
    );
    acquire.answer(
        Answer::Stored(Err(Failure::Unreachable(unreachable))),
        now(&world),
    );
    let Step::Ask(Effect::Pause { until }) = acquire.step(t) else {
        panic!("an unreachable store is tried again within the wait")
    };
    world.now_ms = until.us_since(NodeTime::from_us(0)) / 1000;
    acquire.answer(Answer::Resumed, now(&world));
    // The slot granted for this create still stands (its set-if-absent
    // never answered): asking the quota again would count the key twice,
    // and refuse it when the namespace has room for one key only.
    let (outcome, asked) = drive_asking(&mut world, "fra", &mut acquire);
    assert!(
        matches!(outcome, Step::Done(Ok(AcquireReply::Acquired(_)))),
        "{outcome:?}"
    );
    assert_eq!(asked.admits, 0, "{asked:?}");
}

/// A shortcut's owner disowning it (its error answer: unknown, broken)
/// sends the walk back to the key's global entry; the same words from a
/// DC that lied (an answer to another question) are a contradiction, not
/// the owner's word: the acquire fails with it.
#[test]
fn a_shortcut_disowned_by_its_owner_falls_back_and_a_lie_about_it_fails_the_acquire() {
    let gone: ReservationId = "fra.9".parse().unwrap();
    for lied in [false, true] {
        let mut world = World::new(&["iad", "fra", "sin"]);
        let mut first = start(&world, "iad", "a1", 0);
        drive(&mut world, "iad", &mut first);
        let hint = Shortcut {
            to: gone.clone(),
            token: FencingToken::new(5),
        };
        let mut second = start(&world, "sin", "a2", 0).with_hint(Some(hint));
        let mut asked = false;
        while !asked {
            match second.step(node_now(&world)) {
                Step::Ask(Effect::Cover { .. }) => {
                    second.answer(Answer::Covered(Ok(())), now(&world))
                }
                Step::Ask(Effect::Global(op)) => {
                    let answer = perform_global(&mut world, op);
                    second.answer(Answer::Global(Ok(answer)), now(&world))
                }
                Step::Ask(Effect::Segment(id)) => {
                    assert_eq!(id, gone, "the walk starts at the shortcut");
                    let said = ErrorReply::new(ErrorKind::Inconsistent, "fra.9: abandoned");
                    let answer = if lied {
                        Failure::Lied(said)
                    } else {
                        Failure::Refused(said)
                    };
                    second.answer(Answer::Segment(Err(answer)), now(&world));
                    asked = true;
                }
                other => panic!("expected the shortcut's segment to be asked, got {other:?}"),
            }
        }
        let outcome = drive(&mut world, "sin", &mut second);
        if lied {
            let Step::Done(Err(e)) = outcome else {
                panic!("a lie fails the acquire, got {outcome:?}");
            };
            assert_eq!(e.kind, ErrorKind::Inconsistent);
        } else {
            let Step::Done(Ok(AcquireReply::HeldElsewhere(holder))) = outcome else {
                panic!("the walk falls back to the entry and finds a1, got {outcome:?}");
            };
            assert_eq!(holder.reservation.to_string(), "iad.1");
        }
    }
}

/// A host that gave up on its acquire (a `Cancel` noted while it ran) gets
/// no phantom holder: the grant made afterwards is released through the
/// acquire's own store effects before it answers; a grant nobody gave up
/// on is answered as it is.
#[test]
fn a_grant_its_host_gave_up_on_is_released_before_the_answer() {
    for gave_up in [false, true] {
        let mut world = World::new(&["iad"]);
        let mut acquire = start(&world, "iad", "a1", 0);
        let (outcome, asked) = drive_gave_up(&mut world, "iad", &mut acquire, gave_up);
        let lease = lease_of(&ActorId::new("a1").unwrap());
        assert_eq!(asked.cancelled, [lease], "asked once the grant was made");
        let Step::Done(Ok(AcquireReply::Acquired(grant))) = outcome else {
            panic!("the grant is the answer, got {outcome:?}");
        };
        let state = &world.record(&grant.reservation).unwrap().state;
        assert_eq!(
            matches!(state, homing_core::RecordState::Active { .. }),
            !gave_up,
            "gave up: {gave_up}, {state:?}"
        );
        assert_eq!(
            events(&mut acquire).contains(&AcquireEvent::GrantCancelled),
            gave_up
        );
    }
}

/// The key's chain iad.1 → fra.1 → (new), each released before the next
/// acquire: the third acquire, at `at`, links fra.1 onward and tells the
/// key's entry (iad.1) about the new member. At iad the acquire notes it
/// in iad.1's record itself before it answers; elsewhere the notice is the
/// driver's to send (noted for the node as it ends, after the member
/// learned for the next walk), and iad.1 is left as it was.
#[test]
fn the_chains_new_member_is_noted_in_this_dcs_own_entry_before_the_answer() {
    for at in ["iad", "sin"] {
        let mut world = World::new(&["iad", "fra", "sin"]);
        for (dc, actor) in [("iad", "a1"), ("fra", "a2")] {
            let mut acquire = start(&world, dc, actor, 0);
            let Step::Done(Ok(AcquireReply::Acquired(grant))) = drive(&mut world, dc, &mut acquire)
            else {
                panic!("{actor} acquires at {dc}")
            };
            let noted = noted(&mut acquire);
            assert!(
                !noted.iter().any(|e| matches!(e, NodeEvent::Shortcut(_))),
                "nothing to tell yet: {noted:?}"
            );
            world.release(&grant.reservation, grant.token);
        }
        let mut third = start(&world, at, "a3", 0);
        let Step::Done(Ok(AcquireReply::Acquired(grant))) = drive(&mut world, at, &mut third)
        else {
            panic!("a3 acquires at {at}")
        };
        let entry: ReservationId = "iad.1".parse().unwrap();
        let shortcut = world.record(&entry).unwrap().shortcut.as_deref().cloned();
        let noted = noted(&mut third);
        let events = own_events(&noted);
        // After the acquire's own events, as it ended.
        let mut noted = noted.into_iter().skip(events.len());
        let Some(NodeEvent::Learned {
            key: learned,
            member,
        }) = noted.next()
        else {
            panic!("the new tail is learned for the next walk first")
        };
        assert_eq!((learned, member.to), (key(), grant.reservation.clone()));
        let told = noted.next();
        if at == "iad" {
            assert_eq!(
                shortcut.map(|s| s.to),
                Some(grant.reservation),
                "noted here"
            );
            assert_eq!(told, None, "nothing left for the driver to tell");
            assert!(events.contains(&AcquireEvent::ShortcutNoted), "{events:?}");
        } else {
            assert_eq!(shortcut, None, "iad's entry is iad's to note");
            let Some(NodeEvent::Shortcut(told)) = told else {
                panic!("the driver tells iad, got {told:?}")
            };
            assert_eq!((told.entry, told.shortcut.to), (entry, grant.reservation));
            assert!(!events.contains(&AcquireEvent::ShortcutNoted), "{events:?}");
        }
    }
}

#[test]
fn only_a_member_past_the_keys_first_reservation_is_learned_for_the_next_walk() {
    let mut world = World::new(&["iad", "fra"]);
    let mut first = start(&world, "iad", "a1", 0);
    let Step::Done(Ok(created)) = drive(&mut world, "iad", &mut first) else {
        panic!("the key is created")
    };
    // The key's first reservation: every walk reads the entry first, so
    // the driver's cache of members is not filled with it.
    assert_eq!(first.member_learned(&created), None);
    let mut second = start(&world, "fra", "a2", 0);
    let Step::Done(Ok(held)) = drive(&mut world, "fra", &mut second) else {
        panic!("answered")
    };
    assert_eq!(second.member_learned(&held), None, "held at the entry");
    // Released and recreated at fra: the new tail is past the entry.
    world.release(&"iad.1".parse().unwrap(), FencingToken::FIRST);
    let mut third = start(&world, "fra", "a2", 0);
    let Step::Done(Ok(moved)) = drive(&mut world, "fra", &mut third) else {
        panic!("recreated")
    };
    let learned = third
        .member_learned(&moved)
        .expect("the new tail is learned");
    assert_eq!(learned.to.to_string(), "fra.1");
}

/// An acquire under a host session whose renewal lands between the
/// session's read and the new record's guarded write: the write loses to
/// the row (not to a record: its unique is fresh), so the acquire reads the
/// row again and writes the same record over it — one allocation, one key,
/// granted. Before this, the lost guard reached the connect as the
/// allocator's fault ("allocator handed out iad.221, which already has a
/// record"), seen by `tests/tests/sessions.rs` holding 1,000 keys.
#[test]
fn a_create_under_a_session_renewed_meanwhile_is_written_again_over_the_new_row() {
    let mut world = World::new(&["iad", "fra"]);
    let (id, mut row, mut acquire) = start_in_session(&world);
    let (mut allocations, mut guarded, mut renewed) = (0, Vec::new(), false);
    let done = drive_in_session(&mut world, &mut acquire, |world, op| match op {
        StoreOp::Session(asked) => {
            assert_eq!(asked, &id);
            Some(Answer::Stored(Ok(Stored::Session(Some(row.clone())))))
        }
        StoreOp::Write {
            expected,
            record,
            guard: Some(guard),
            ..
        } => {
            guarded.push((record.id.clone(), guard.version));
            if !renewed {
                // The session's renewal lands first.
                renewed = true;
                row.version += 1;
            }
            let written = if guard.version == row.version {
                world.write(*expected, (**record).clone())
            } else {
                homing_core::Written::Conflict
            };
            Some(Answer::Stored(Ok(Stored::Written(written))))
        }
        StoreOp::Allocate => {
            allocations += 1;
            None
        }
        _ => None,
    });
    let Ok(AcquireReply::Acquired(grant)) = done else {
        panic!("expected a grant, got {done:?}")
    };
    assert_eq!(allocations, 1);
    assert_eq!(
        guarded,
        vec![
            (grant.reservation.clone(), 1),
            (grant.reservation.clone(), 2)
        ],
        "the same record, written again over the renewed row"
    );
    let record = world.record(&grant.reservation).expect("written");
    assert_eq!(record.session(), Some(&id));
}

/// Drives an acquire at iad in an empty world to its end, every grant
/// covered, every create admitted, nobody giving up: `store` answers the
/// store operations it wants to (the session's row, guarded writes), the
/// world the others.
fn drive_in_session(
    world: &mut World,
    acquire: &mut Acquire,
    mut store: impl FnMut(&mut World, &StoreOp) -> Option<Answer>,
) -> Result<AcquireReply, ErrorReply> {
    loop {
        let effect = match acquire.step(node_now(world)) {
            Step::Ask(effect) => effect,
            Step::Done(done) => return done,
        };
        let answer = match effect {
            Effect::Cover { .. } => Answer::Covered(Ok(())),
            Effect::Admit(_) => Answer::Admitted(Ok(())),
            Effect::Cancellation { .. } => Answer::Cancelled(false),
            Effect::Store(op) => match store(world, &op) {
                Some(answer) => answer,
                None => Answer::Stored(Ok(perform_store(world, "iad", op))),
            },
            Effect::Global(op) => Answer::Global(Ok(perform_global(world, op))),
            other => panic!("an acquire in an empty world does not ask {other:?}"),
        };
        acquire.answer(answer, now(world));
    }
}

/// An acquire at iad under a new session of iad (its row, version 1).
fn start_in_session(
    world: &World,
) -> (homing_core::SessionId, homing_core::SessionRecord, Acquire) {
    let secret = LeaseKey::from_bytes([9; 16]).unwrap();
    let id = homing_core::SessionId::new(dc("iad"), 1 << 40);
    let (mut row, _) = homing_core::SessionRecord::open(
        id.clone(),
        secret,
        HostTime::from_ms(HOST_TIME_MS),
        world.now(),
        &world.policy,
    );
    row.version = 1;
    let request = AcquireRequest {
        key: key(),
        tag: None,
        actor: ActorId::new("a1").unwrap(),
        lease: secret,
        host_time: HostTime::from_ms(HOST_TIME_MS),
        wait_ms: 0,
        session: Some(homing_node::InSession {
            id: id.clone(),
            secret,
        }),
    };
    let acquire = Acquire::new(
        dc("iad"),
        request,
        node_now(world),
        world.policy,
        HOP_LIMIT_DEFAULT,
        Mutations::NONE,
    );
    (id, row, acquire)
}

/// The DC store fails the read of the session's row, before the DC lease's
/// cover or again after a guarded write lost to a renewal: the acquire ends
/// with the store's failure, as a failed read of the connect would. It used
/// to panic ("a failure while not connecting"), which the simulator found
/// once its hosts acquired under sessions on a failing store (swarm seeds
/// 69 and 80).
#[test]
fn a_failed_read_of_the_session_row_fails_the_acquire() {
    for conflicts in [0, 1] {
        let mut world = World::new(&["iad", "fra"]);
        let (_, row, mut acquire) = start_in_session(&world);
        let (mut reads, mut conflicted) = (0, 0);
        let done = drive_in_session(&mut world, &mut acquire, |_, op| match op {
            StoreOp::Session(_) if reads == conflicts => {
                let down = ErrorReply::new(ErrorKind::Internal, "store down");
                Some(Answer::Stored(Err(Failure::Refused(down))))
            }
            StoreOp::Session(_) => {
                reads += 1;
                Some(Answer::Stored(Ok(Stored::Session(Some(row.clone())))))
            }
            StoreOp::Write { guard: Some(_), .. } => {
                // The session's renewal lands first, every time.
                conflicted += 1;
                let lost = Stored::Written(homing_core::Written::Conflict);
                Some(Answer::Stored(Ok(lost)))
            }
            _ => None,
        });
        let Err(error) = done else {
            panic!("expected the store's failure, got {done:?}")
        };
        assert!(error.message.contains("store down"), "{error:?}");
        assert_eq!(
            conflicted, conflicts,
            "read failed after {conflicts} lost write(s)"
        );
    }
}
