//! Connect (acquire) driven end to end against in-memory DCs, including
//! racing DCs interleaved step by step.

#[path = "../examples/walkthrough/world.rs"]
mod world;

use homing_core::{
    AcquireReply, ActorId, ChainPoll, Connect, ConnectError, ConnectNeed, ConnectPoll, DcId,
    FencingToken, HostTime, Key, KeyName, RecordState, ReservationId, Tag, TailState,
    chain::HOP_LIMIT_DEFAULT,
};
use homing_core::{Grant, Holder};
use world::{World, lease_of};

fn dc(name: &str) -> DcId {
    DcId::new(name).unwrap()
}

fn key() -> Key {
    Key::new(KeyName::new("room").unwrap())
}

fn connect(world: &World, at: &str, actor: &str, tag: Option<&str>) -> Connect {
    Connect::new(
        dc(at),
        key(),
        tag.map(|t| Tag::new(t).unwrap()),
        {
            let actor = ActorId::new(actor).unwrap();
            homing_core::Holding {
                lease: lease_of(&actor),
                actor,
                host_time: HostTime::from_ms(7),
                session: None,
            }
        },
        world.policy,
        HOP_LIMIT_DEFAULT,
    )
}

fn acquire(world: &mut World, at: &str, actor: &str) -> AcquireReply {
    let mut c = connect(world, at, actor, None);
    match world.run(&dc(at), &mut c) {
        ConnectPoll::Done(outcome) => outcome,
        other => panic!("connect failed: {other:?}"),
    }
}

fn acquired(outcome: &AcquireReply) -> (ReservationId, FencingToken) {
    match outcome {
        AcquireReply::Acquired(Grant {
            reservation, token, ..
        }) => (reservation.clone(), *token),
        other => panic!("expected Acquired, got {other:?}"),
    }
}

#[test]
fn connect_first_reservation_writes_own_record_then_the_global_entry() {
    let mut world = World::new(&["iad", "fra"]);
    let (id, token) = acquired(&acquire(&mut world, "iad", "a1"));
    assert_eq!(id.to_string(), "iad.1");
    assert_eq!(token, FencingToken::FIRST);
    assert_eq!(world.global.get(&key()), Some(&id));
    assert_eq!(world.round_trips, 0, "a first reserve needs no other DC");
}

#[test]
fn connect_live_key_returns_its_actor_from_any_dc_and_checks_the_tag() {
    let mut world = World::new(&["iad", "fra"]);
    acquire(&mut world, "iad", "a1");
    match acquire(&mut world, "fra", "a2") {
        AcquireReply::HeldElsewhere(Holder {
            reservation, actor, ..
        }) => {
            assert_eq!(reservation.to_string(), "iad.1");
            assert_eq!(actor.as_str(), "a1");
        }
        other => panic!("{other:?}"),
    }
    let mut tagged = connect(&world, "fra", "a3", Some("v2"));
    assert_eq!(
        world.run(&dc("fra"), &mut tagged),
        ConnectPoll::Done(AcquireReply::TagMismatch { existing: None })
    );
}

#[test]
fn connect_recreate_elsewhere_links_the_tail_and_resolve_follows_it() {
    let mut world = World::new(&["iad", "fra", "sin"]);
    let (first, token) = acquired(&acquire(&mut world, "iad", "a1"));
    world.release(&first, token);
    world.round_trips = 0;
    let (second, token2) = acquired(&acquire(&mut world, "fra", "a2"));
    assert_eq!(second.dc().as_str(), "fra");
    assert_eq!(token2, FencingToken::new(2));
    assert_eq!(
        world.record(&first).unwrap().state,
        RecordState::Linked { to: second.clone() }
    );
    assert_eq!(
        world.round_trips, 2,
        "one read of the remote tail, one link"
    );

    let ChainPoll::Done(walked) = world.resolve(&dc("sin"), &key()) else {
        panic!()
    };
    assert_eq!(walked.tail.id, second);
    assert!(matches!(walked.tail.state, TailState::Active { ref actor } if actor.as_str() == "a2"));
    assert_eq!(
        walked.remote_round_trips, 2,
        "iad for the link, fra for the tail"
    );
}

#[test]
fn connect_same_dc_reactivation_bumps_the_token_without_a_link() {
    let mut world = World::new(&["iad"]);
    let (first, token) = acquired(&acquire(&mut world, "iad", "a1"));
    world.release(&first, token);
    let (again, token2) = acquired(&acquire(&mut world, "iad", "a2"));
    assert_eq!(again, first);
    assert_eq!(token2, token.next());
}

#[test]
fn connect_racing_first_reservations_have_one_winner_and_the_loser_returns_its_actor() {
    let mut world = World::new(&["iad", "fra"]);
    let mut a = connect(&world, "iad", "a1", None);
    let mut b = connect(&world, "fra", "b1", None);
    // Both read the empty global entry, allocate and write their records.
    for _ in 0..3 {
        world.step(&dc("iad"), &mut a);
        world.step(&dc("fra"), &mut b);
    }
    let a = world.run(&dc("iad"), &mut a);
    let b = world.run(&dc("fra"), &mut b);
    assert!(
        matches!(a, ConnectPoll::Done(AcquireReply::Acquired(_))),
        "{a:?}"
    );
    match b {
        ConnectPoll::Done(AcquireReply::HeldElsewhere(Holder {
            reservation, actor, ..
        })) => {
            assert_eq!(reservation.to_string(), "iad.1");
            assert_eq!(actor.as_str(), "a1");
        }
        other => panic!("{other:?}"),
    }
    let loser: ReservationId = "fra.1".parse().unwrap();
    assert_eq!(world.record(&loser).unwrap().state, RecordState::Abandoned);
}

/// A key held in iad and released; connects in fra and sin, both past the
/// vacant tail with their own records written, about to link.
fn racing_recreations() -> (World, Connect, Connect) {
    let mut world = World::new(&["iad", "fra", "sin"]);
    let (first, token) = acquired(&acquire(&mut world, "iad", "a1"));
    world.release(&first, token);
    let mut f = connect(&world, "fra", "f1", None);
    let mut s = connect(&world, "sin", "s1", None);
    for _ in 0..4 {
        world.step(&dc("fra"), &mut f);
        world.step(&dc("sin"), &mut s);
    }
    (world, f, s)
}

#[test]
fn connect_racing_recreations_the_loser_follows_already_linked_to_the_winner() {
    let (mut world, mut f, mut s) = racing_recreations();
    let f = world.run(&dc("fra"), &mut f);
    let s = world.run(&dc("sin"), &mut s);
    let (winner, token) = match f {
        ConnectPoll::Done(outcome) => acquired(&outcome),
        other => panic!("{other:?}"),
    };
    assert_eq!(token, FencingToken::new(2));
    match s {
        ConnectPoll::Done(AcquireReply::HeldElsewhere(Holder { reservation, .. })) => {
            assert_eq!(reservation, winner)
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(
        world.record(&"sin.1".parse().unwrap()).unwrap().state,
        RecordState::Abandoned
    );
}

#[test]
fn resolve_a_chain_revisiting_a_dc_costs_one_round_trip_per_hop() {
    let mut world = World::new(&["iad", "fra"]);
    // iad.1 → fra.1 → iad.2: recreated back in iad after a stay in fra.
    let (a, t) = acquired(&acquire(&mut world, "iad", "a1"));
    world.release(&a, t);
    let (b, t) = acquired(&acquire(&mut world, "fra", "b1"));
    world.release(&b, t);
    let (c, _) = acquired(&acquire(&mut world, "iad", "c1"));
    assert_eq!(c.to_string(), "iad.2");
    let ChainPoll::Done(walked) = world.resolve(&dc("sin"), &key()) else {
        panic!()
    };
    assert_eq!(walked.links.len(), 2);
    assert_eq!(
        walked.remote_round_trips, 3,
        "iad, fra, iad: no DC answers for another's reservation"
    );
}

/// The global store's view of `name`'s lease: expired, with `token_bound` published.
fn expired(name: &str, token_bound: u64, retired: bool) -> homing_core::DcLeaseState {
    homing_core::DcLeaseState {
        standing: homing_core::DcStanding::Expired,
        marks: homing_core::DcMarks {
            token_bound,
            ..Default::default()
        },
        retired,
        ..homing_core::DcLeaseState::unknown(dc(name))
    }
}

fn failed(world: &mut World, at: &str, actor: &str) -> homing_core::ConnectError {
    let mut c = connect(world, at, actor, None);
    match world.run(&dc(at), &mut c) {
        ConnectPoll::Failed(e) => e,
        other => panic!("expected a failure, got {other:?}"),
    }
}

#[test]
fn connect_confirms_every_move_in_the_global_store_before_granting() {
    let mut world = World::new(&["iad", "fra"]);
    let (first, token) = acquired(&acquire(&mut world, "iad", "a1"));
    world.release(&first, token);
    let (second, token2) = acquired(&acquire(&mut world, "fra", "a2"));
    let succession = world
        .successions
        .get(&first)
        .expect("the move is confirmed");
    assert_eq!(succession.link.to, second);
    assert_eq!(succession.link.token, token);
    assert_eq!(succession.cause, homing_core::SuccessionCause::Moved);
    assert!(token2 > succession.link.token);
}

#[test]
fn connect_to_a_silent_dc_whose_lease_has_not_expired_fails_unreachable_and_takes_nothing() {
    let mut world = World::new(&["iad", "fra"]);
    acquired(&acquire(&mut world, "iad", "a1"));
    world.down.insert(dc("iad"));
    match failed(&mut world, "fra", "a2") {
        homing_core::ConnectError::Unreachable { dc: silent, reason } => {
            assert_eq!(silent, dc("iad"));
            assert!(reason.contains("Live"), "{reason}");
        }
        other => panic!("{other:?}"),
    }
    assert!(world.successions.is_empty());
    let fra = &world.dcs[&dc("fra")].records;
    assert!(
        fra.is_empty(),
        "nothing written before the lease is judged: {fra:?}"
    );
}

#[test]
fn connect_takes_over_an_expired_dc_tail_above_its_token_bound_and_others_follow() {
    let mut world = World::new(&["iad", "fra", "sin"]);
    let (first, _) = acquired(&acquire(&mut world, "iad", "a1"));
    world.down.insert(dc("iad"));
    world.dc_leases.insert(dc("iad"), expired("iad", 40, false));
    let outcome = acquire(&mut world, "fra", "a2");
    let AcquireReply::Acquired(grant) = &outcome else {
        panic!("{outcome:?}")
    };
    assert_eq!(grant.reservation.dc(), &dc("fra"));
    assert_eq!(grant.token, FencingToken::new(42), "bound + 2");
    let previous = grant.previous.as_ref().expect("it follows iad's run");
    assert_eq!(previous.reservation, first);
    let taken = world.successions.get(&first).expect("recorded").clone();
    assert_eq!(taken.cause, homing_core::SuccessionCause::TakenOver);
    assert_eq!(taken.link.to, grant.reservation);

    // Another DC reaching the silent tail follows the takeover: one holder.
    match acquire(&mut world, "sin", "a3") {
        AcquireReply::HeldElsewhere(Holder { reservation, .. }) => {
            assert_eq!(reservation, grant.reservation)
        }
        other => panic!("{other:?}"),
    }
    let mut resolve_walk = homing_core::ChainWalk::from_key(key(), HOP_LIMIT_DEFAULT);
    resolve_walk
        .handle_global(Some(first.clone()), homing_core::Source::Local)
        .unwrap();
    assert_eq!(resolve_walk.handle_unreachable(), Ok(Some(first.clone())));
    resolve_walk
        .handle_successor(taken.link.clone(), None, homing_core::Source::Remote)
        .unwrap();
    assert!(
        matches!(resolve_walk.poll(), ChainPoll::Need(homing_core::ChainNeed::Reservation(id)) if *id == grant.reservation)
    );
}

#[test]
fn connect_under_retired_only_takes_over_only_a_retired_dc() {
    let mut world = World::new(&["iad", "fra"]);
    acquired(&acquire(&mut world, "iad", "a1"));
    world.down.insert(dc("iad"));
    world.dc_leases.insert(dc("iad"), expired("iad", 1, false));
    let mut c =
        connect(&world, "fra", "a2", None).with_takeover(homing_core::TakeoverPolicy::RetiredOnly);
    assert!(matches!(
        world.run(&dc("fra"), &mut c),
        ConnectPoll::Failed(homing_core::ConnectError::Unreachable { .. })
    ));
    world.dc_leases.insert(dc("iad"), expired("iad", 1, true));
    let mut c =
        connect(&world, "fra", "a2", None).with_takeover(homing_core::TakeoverPolicy::RetiredOnly);
    assert!(matches!(
        world.run(&dc("fra"), &mut c),
        ConnectPoll::Done(AcquireReply::Acquired(_))
    ));
}

/// iad expires and sin takes its tail over; iad comes back without having
/// applied the takeover, and fra's move through it must not grant.
fn taken_over_then_iad_returns() -> (World, ReservationId, ReservationId) {
    let mut world = World::new(&["iad", "fra", "sin"]);
    let (first, token) = acquired(&acquire(&mut world, "iad", "a1"));
    world.release(&first, token);
    world.down.insert(dc("iad"));
    world.dc_leases.insert(dc("iad"), expired("iad", 9, false));
    let (taker, _) = acquired(&acquire(&mut world, "sin", "a3"));
    world.down.clear();
    world.dc_leases.clear();
    (world, first, taker)
}

#[test]
fn a_mover_that_loses_its_confirmation_to_a_takeover_links_itself_to_the_taker_and_never_grants() {
    let (mut world, first, taker) = taken_over_then_iad_returns();
    match acquire(&mut world, "fra", "a2") {
        AcquireReply::HeldElsewhere(Holder { reservation, .. }) => assert_eq!(reservation, taker),
        other => panic!("fra must not grant beside sin's holder: {other:?}"),
    }
    // iad linked its stale tail to fra's record, which now continues as the taker.
    let RecordState::Linked { to: linked } = &world.record(&first).unwrap().state else {
        panic!("iad linked its tail")
    };
    assert_eq!(
        world.record(linked).unwrap().state,
        RecordState::Linked { to: taker.clone() }
    );
    // The global store says so too: no takeover of fra's record can fork the chain.
    let own = world
        .successions
        .get(linked)
        .expect("the loser's own succession is recorded");
    assert_eq!(own.link.to, taker);
    let ChainPoll::Done(walked) = world.resolve(&dc("fra"), &key()) else {
        panic!()
    };
    assert_eq!(
        walked.tail.id, taker,
        "iad's stale link still leads to the taker"
    );
}

#[test]
fn a_recreated_record_confirms_its_succession_before_it_is_re_activated() {
    let mut world = World::new(&["iad", "fra", "sin"]);
    let (first, token) = acquired(&acquire(&mut world, "iad", "a1"));
    world.release(&first, token);
    let (second, token2) = acquired(&acquire(&mut world, "fra", "a2"));
    world.release(&second, token2);
    // As if fra crashed between iad's link and its confirmation, and a
    // takeover of iad's reservation by sin then won the global store.
    world.successions.remove(&first);
    let taker: ReservationId = "sin.7".parse().unwrap();
    let (record, _) = homing_core::DcRecord::reserve(
        taker.clone(),
        key(),
        None,
        FencingToken::new(52),
        None,
        &homing_core::Holding {
            actor: ActorId::new("a9").unwrap(),
            lease: lease_of(&ActorId::new("a9").unwrap()),
            host_time: HostTime::from_ms(7),
            session: None,
        },
        world.now(),
        &world.policy,
    );
    world
        .dcs
        .get_mut(&dc("sin"))
        .unwrap()
        .records
        .insert(taker.clone(), record);
    world.successions.insert(
        first.clone(),
        homing_core::Succession::taken_over(first.clone(), taker.clone(), 50),
    );
    match acquire(&mut world, "fra", "a4") {
        AcquireReply::HeldElsewhere(Holder { reservation, .. }) => assert_eq!(reservation, taker),
        other => panic!("fra must not re-activate a superseded record: {other:?}"),
    }
    assert_eq!(
        world.record(&second).unwrap().state,
        RecordState::Linked { to: taker }
    );
}

#[test]
fn a_takeover_read_under_a_token_bound_the_dc_raised_since_is_refused() {
    let mut world = World::new(&["iad", "fra"]);
    acquired(&acquire(&mut world, "iad", "a1"));
    world.down.insert(dc("iad"));
    world.dc_leases.insert(dc("iad"), expired("iad", 10, false));
    // The taker reads bound 10; before its write lands, iad renewed with a
    // higher bound and expired again.
    let mut c = connect(&world, "fra", "a2", None);
    loop {
        match c.poll() {
            ConnectPoll::Need(homing_core::ConnectNeed::TakeOver { .. }) => break,
            ConnectPoll::Need(_) => assert!(world.step(&dc("fra"), &mut c)),
            other => panic!("{other:?}"),
        }
    }
    world
        .dc_leases
        .insert(dc("iad"), expired("iad", 500, false));
    assert!(matches!(
        world.run(&dc("fra"), &mut c),
        ConnectPoll::Failed(homing_core::ConnectError::Unreachable { .. })
    ));
    assert!(
        world.successions.is_empty(),
        "nothing taken under a stale bound"
    );
    // Read again, the takeover is above the new bound.
    let outcome = acquire(&mut world, "fra", "a2");
    let (_, token) = acquired(&outcome);
    assert_eq!(token, FencingToken::new(502));
}

#[test]
fn a_link_answered_still_active_answers_for_the_live_holder_and_its_tag() {
    // Held in iad under tag v1, then released. fra (tag v2) walks to the
    // vacant tail and writes its own record; meanwhile a host of iad
    // re-activates the tail under v2 — a re-activation changes the tag.
    let mut world = World::new(&["iad", "fra"]);
    let mut a1 = connect(&world, "iad", "a1", Some("v1"));
    let (first, token) = acquired(&done(world.run(&dc("iad"), &mut a1)));
    world.release(&first, token);
    let mut f = connect(&world, "fra", "f1", Some("v2"));
    while !matches!(f.poll(), ConnectPoll::Need(ConnectNeed::Link { .. })) {
        assert!(world.step(&dc("fra"), &mut f));
    }
    let mut a2 = connect(&world, "iad", "a2", Some("v2"));
    let (again, live) = acquired(&done(world.run(&dc("iad"), &mut a2)));
    assert_eq!(again, first);
    // fra's link is answered StillActive: it answers what a fresh walk
    // finds — held under fra's own tag, not a mismatch with v1.
    match done(world.run(&dc("fra"), &mut f)) {
        AcquireReply::HeldElsewhere(Holder {
            reservation,
            actor,
            token,
            ..
        }) => {
            assert_eq!(reservation, first);
            assert_eq!(actor, ActorId::new("a2").unwrap());
            assert_eq!(token, live);
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(
        world.record(&"fra.1".parse().unwrap()).unwrap().state,
        RecordState::Abandoned
    );
}

fn done(poll: ConnectPoll) -> AcquireReply {
    match poll {
        ConnectPoll::Done(outcome) => outcome,
        other => panic!("connect failed: {other:?}"),
    }
}

#[test]
fn a_connect_out_of_time_fails_contended_at_its_next_lost_race_and_abandons_its_record() {
    let (mut world, mut f, mut s) = racing_recreations();
    acquired(&match world.run(&dc("fra"), &mut f) {
        ConnectPoll::Done(outcome) => outcome,
        other => panic!("{other:?}"),
    });
    // sin's caller is out of time: its lost race ends the connect.
    s.stop_restarts();
    match world.run(&dc("sin"), &mut s) {
        ConnectPoll::Failed(ConnectError::Contended(1)) => {}
        other => panic!("{other:?}"),
    }
    assert_eq!(
        world.record(&"sin.1".parse().unwrap()).unwrap().state,
        RecordState::Abandoned
    );
}
