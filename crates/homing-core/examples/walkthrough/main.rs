//! A walk through homing's model with three in-memory DCs: reserve, resolve,
//! recreate elsewhere, follow the chain, race two DCs, drain. It drives the
//! same homing-core steppers homingd runs; only the stores and the network
//! are maps and function calls here. Exits non-zero if any check fails.
//!
//! `cargo run -p homing-core --example walkthrough`

mod world;

use homing_core::{
    AcquireReply, ActorId, ChainPoll, Connect, ConnectPoll, DcId, HostTime, Key, KeyName,
    RecordState, RenewReply, TailState, chain::HOP_LIMIT_DEFAULT,
};
use homing_core::{Grant, Holder};
use world::{World, lease_of};

struct Story {
    failures: u32,
}

impl Story {
    fn check(&mut self, ok: bool, what: &str) {
        if ok {
            println!("   ✓ {what}");
        } else {
            println!("   ✗ {what}");
            self.failures += 1;
        }
    }
}

fn dc(name: &str) -> DcId {
    DcId::new(name).expect("valid dc id")
}

fn connect(world: &mut World, at: &str, key: &Key, actor: &str) -> AcquireReply {
    let mut c = Connect::new(
        dc(at),
        key.clone(),
        None,
        {
            let actor = ActorId::new(actor).expect("valid actor id");
            homing_core::Holding {
                lease: lease_of(&actor),
                actor,
                host_time: HostTime::from_ms(world.now_ms),
                session: None,
            }
        },
        world.policy,
        HOP_LIMIT_DEFAULT,
    );
    match world.run(&dc(at), &mut c) {
        ConnectPoll::Done(outcome) => outcome,
        other => panic!("connect failed: {other:?}"),
    }
}

fn describe(outcome: &AcquireReply) -> String {
    match outcome {
        AcquireReply::Acquired(Grant {
            reservation,
            token,
            deadlines,
            ..
        }) => format!(
            "Acquired {reservation} token {token}; renew at {}, stop by {} (host clock)",
            deadlines.renew_at, deadlines.hard_terminate_at
        ),
        AcquireReply::HeldElsewhere(Holder {
            reservation, actor, ..
        }) => {
            format!("HeldElsewhere: {actor} under {reservation}")
        }
        AcquireReply::TagMismatch { existing } => format!("TagMismatch (live tag {existing:?})"),
    }
}

fn resolve(
    world: &mut World,
    story: &mut Story,
    router: &str,
    key: &Key,
) -> Option<homing_core::Walked> {
    match world.resolve(&dc(router), key) {
        ChainPoll::Done(walked) => {
            let mut hops = vec![walked.entry.to_string()];
            hops.extend(walked.links.iter().map(|l| l.to.to_string()));
            let state = match &walked.tail.state {
                TailState::Active { actor } => format!("active, actor {actor}"),
                TailState::Vacant { ended } => format!("vacant, {ended}"),
            };
            println!(
                "   router@{router}: {} — tail {} ({state}, token {}), {} remote round trip(s)",
                hops.join(" → "),
                walked.tail.id,
                walked.tail.token,
                walked.remote_round_trips
            );
            Some(walked)
        }
        other => {
            story.check(false, &format!("resolve from {router}: {other:?}"));
            None
        }
    }
}

fn main() {
    let mut world = World::new(&["iad", "fra", "sin"]);
    let mut story = Story { failures: 0 };
    let room = Key::new(KeyName::new("room-42").expect("valid key name"));
    println!(
        "homing walkthrough: DCs iad, fra, sin (in memory; `homing devnet` runs real daemons)\n"
    );

    println!("1. a host in iad connects to key {room}");
    let first = connect(&mut world, "iad", &room, "iad-host-1:9000");
    println!("   {}", describe(&first));
    let AcquireReply::Acquired(Grant {
        reservation: iad1,
        token,
        ..
    }) = first
    else {
        story.check(false, "iad acquires the new key");
        std::process::exit(1);
    };
    story.check(
        world.global.get(&room) == Some(&iad1),
        "global entry written once: room-42 → iad.1",
    );

    println!("2. a router in sin resolves it");
    let walked = resolve(&mut world, &mut story, "sin", &room);
    story.check(
        walked.is_some_and(|w| w.tail.id == iad1 && w.remote_round_trips == 1),
        "one round trip, to iad",
    );

    println!("3. a host in fra connects to the same key while iad's actor lives");
    let held = connect(&mut world, "fra", &room, "fra-host-1:9000");
    println!("   {}", describe(&held));
    story.check(
        matches!(held, AcquireReply::HeldElsewhere(_)),
        "connect returns the live actor, no second one",
    );

    println!("4. iad's actor stops and releases; fra connects again");
    world.release(&iad1, token);
    world.now_ms += 1_000;
    world.round_trips = 0;
    let moved = connect(&mut world, "fra", &room, "fra-host-1:9000");
    println!("   {}", describe(&moved));
    let fra1 = match &moved {
        AcquireReply::Acquired(Grant { reservation, .. }) => reservation.clone(),
        _ => iad1.clone(),
    };
    story.check(
        world.record(&iad1).map(|r| &r.state) == Some(&RecordState::Linked { to: fra1.clone() }),
        &format!("iad linked {iad1} → {fra1}; the global entry is unchanged"),
    );
    story.check(
        world.round_trips == 2,
        "recreate cost: one read of the tail, one link (2 round trips)",
    );

    println!("5. the router in sin resolves again and follows the chain");
    let walked = resolve(&mut world, &mut story, "sin", &room);
    story.check(
        walked.is_some_and(|w| w.tail.id == fra1 && w.remote_round_trips == 2),
        "follows iad's link to fra",
    );

    println!("6. iad and sin race for a new key, lobby");
    let lobby = Key::new(KeyName::new("lobby").expect("valid key name"));
    let mk = |at: &str, actor: &str, world: &World| {
        Connect::new(
            dc(at),
            lobby.clone(),
            None,
            {
                let actor = ActorId::new(actor).expect("valid");
                homing_core::Holding {
                    lease: lease_of(&actor),
                    actor,
                    host_time: HostTime::from_ms(world.now_ms),
                    session: None,
                }
            },
            world.policy,
            HOP_LIMIT_DEFAULT,
        )
    };
    let (mut a, mut b) = (
        mk("iad", "iad-host-2:9000", &world),
        mk("sin", "sin-host-1:9000", &world),
    );
    for _ in 0..3 {
        world.step(&dc("iad"), &mut a);
        world.step(&dc("sin"), &mut b);
    }
    let (a, b) = (world.run(&dc("iad"), &mut a), world.run(&dc("sin"), &mut b));
    for (at, poll) in [("iad", &a), ("sin", &b)] {
        if let ConnectPoll::Done(outcome) = poll {
            println!("   {at}: {}", describe(outcome));
        }
    }
    let winners = [&a, &b]
        .iter()
        .filter(|p| matches!(p, ConnectPoll::Done(AcquireReply::Acquired(_))))
        .count();
    story.check(
        winners == 1,
        "exactly one winner; the loser returns the winner's actor",
    );

    println!("7. an operator drains room-42 (allow_renew = false)");
    let record = world.record(&fra1).cloned();
    if let Some(record) = record {
        if let Some(drained) = record.drain(None) {
            world.write(Some(record.version), drained);
        }
        let renewal = world.record(&fra1).map(|r| {
            let homing_core::RecordState::Active { actor, .. } = &r.state else {
                panic!("fra's record has no holder");
            };
            r.renew(
                r.token,
                &lease_of(actor),
                HostTime::from_ms(world.now_ms),
                world.now(),
                &world.policy,
            )
            .reply
        });
        println!("   fra's host renews: {renewal:?}");
        story.check(
            renewal == Some(RenewReply::Draining),
            "renewal refused: the host stops by its deadlines",
        );
    }

    if story.failures > 0 {
        println!("\n{} check(s) failed", story.failures);
        std::process::exit(1);
    }
    println!("\nall checks passed");
}
