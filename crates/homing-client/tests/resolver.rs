//! The Resolver against scripted DCs over real QUIC on loopback: what it
//! caches and for how long, single-flight, failover of the global read, and
//! peers that answer with cycles or lies.

mod support;

use std::sync::atomic::Ordering;
use std::time::Duration;

use homing_client::{ResolveError, Resolver, ResolverConfig};
use homing_core::{DcId, FencingToken, Link, ReservationId, Role, TailState};
use homing_net::DevCa;
use support::{TestDc, active, client, id, key, link, segment};

const TAIL_TTL_MS: u64 = 300;

fn resolver(ca: &DevCa, dcs: &[&TestDc]) -> Resolver {
    let config = ResolverConfig {
        tail_ttl_ms: TAIL_TTL_MS,
        hop_timeout_ms: 1_000,
        ..ResolverConfig::new(dcs.iter().map(|d| d.entry()).collect())
    };
    Resolver::new(client(ca, Role::Router, None), config)
}

/// `room`: global entry iad.1 (asked at iad), linked inside iad's answer to
/// fra.1, whose tail fra answers.
async fn two_dcs_with_a_link(ca: &DevCa) -> (TestDc, TestDc) {
    let iad = TestDc::start(ca, "iad").await;
    let fra = TestDc::start(ca, "fra").await;
    let room = key("room");
    iad.script.entry(
        &room,
        &id("iad.1"),
        Some(segment("room", vec![link("iad.1", "fra.1")], None)),
    );
    fra.script.segment(
        &id("fra.1"),
        segment("room", vec![], Some(active("fra.1", "10.2.0.1:9000", 2))),
    );
    (iad, fra)
}

#[tokio::test]
async fn resolve_caches_entries_and_links_forever_and_the_answer_for_the_tail_ttl() {
    let ca = DevCa::generate("test ca").unwrap();
    let (iad, fra) = two_dcs_with_a_link(&ca).await;
    let resolver = resolver(&ca, &[&iad, &fra]);
    let room = key("room");

    let cold = resolver.resolve(&room).await.unwrap();
    assert_eq!(
        (cold.dc.as_str(), cold.reservation.to_string().as_str()),
        ("fra", "fra.1")
    );
    assert_eq!(
        (cold.hops, cold.remote_round_trips, cold.from_cache),
        (1, 2, false)
    );
    assert_eq!(
        (
            iad.script.count("resolve"),
            fra.script.count("resolve_reservation")
        ),
        (1, 1)
    );

    // Within the TTL: the whole answer from cache, no request.
    let hit = resolver.resolve(&room).await.unwrap();
    assert!(hit.from_cache);
    assert_eq!(
        (hit.remote_round_trips, hit.actor.as_str()),
        (0, "10.2.0.1:9000")
    );
    assert_eq!(
        (
            iad.script.count("resolve"),
            fra.script.count("resolve_reservation")
        ),
        (1, 1)
    );

    // After the TTL: entry and link from cache, only the tail's DC is asked.
    tokio::time::sleep(Duration::from_millis(TAIL_TTL_MS + 200)).await;
    let again = resolver.resolve(&room).await.unwrap();
    assert_eq!((again.remote_round_trips, again.from_cache), (1, false));
    assert_eq!(
        (
            iad.script.count("resolve"),
            fra.script.count("resolve_reservation")
        ),
        (1, 2)
    );
    assert_eq!(iad.script.count("resolve_reservation"), 0);
}

#[tokio::test]
async fn report_unreachable_drops_the_answer_so_the_next_resolve_asks_the_tail_again() {
    let ca = DevCa::generate("test ca").unwrap();
    let (iad, fra) = two_dcs_with_a_link(&ca).await;
    let resolver = resolver(&ca, &[&iad, &fra]);
    let room = key("room");

    let first = resolver.resolve(&room).await.unwrap();
    assert!(resolver.resolve(&room).await.unwrap().from_cache);
    resolver.report_unreachable(&first).await;
    let next = resolver.resolve(&room).await.unwrap();
    assert!(!next.from_cache);
    assert_eq!(
        (
            iad.script.count("resolve"),
            fra.script.count("resolve_reservation")
        ),
        (1, 2)
    );
}

#[tokio::test]
async fn a_late_report_about_an_old_tail_keeps_the_newer_cached_answer() {
    let ca = DevCa::generate("test ca").unwrap();
    let (iad, fra) = two_dcs_with_a_link(&ca).await;
    let resolver = resolver(&ca, &[&iad, &fra]);
    let room = key("room");

    let current = resolver.resolve(&room).await.unwrap();
    // A report about a reservation the cache no longer names changes nothing.
    let old = homing_client::Resolution {
        reservation: "iad.1".parse().unwrap(),
        ..current.clone()
    };
    assert_ne!(old.reservation, current.reservation);
    resolver.report_unreachable(&old).await;
    assert!(resolver.resolve(&room).await.unwrap().from_cache);
    resolver.report_unreachable(&current).await;
    assert!(!resolver.resolve(&room).await.unwrap().from_cache);
}

#[tokio::test]
async fn a_borrowed_resolve_answers_as_resolve_and_its_report_drops_only_the_tail_it_names() {
    let ca = DevCa::generate("test ca").unwrap();
    let (iad, fra) = two_dcs_with_a_link(&ca).await;
    let resolver = resolver(&ca, &[&iad, &fra]);
    let room = key("room");

    let walked = resolver.resolve_ref(room.borrowed()).await.unwrap();
    assert!(!walked.from_cache());
    assert_eq!(walked.remote_round_trips(), 2);
    let owned = resolver.resolve(&room).await.unwrap();
    assert!(owned.from_cache);
    assert_eq!(
        walked.to_resolution(&room),
        homing_client::Resolution {
            remote_round_trips: 2,
            from_cache: false,
            ..owned.clone()
        }
    );
    let hit = resolver.resolve_ref(room.borrowed()).await.unwrap();
    assert!(hit.from_cache() && !hit.stale());
    assert_eq!(hit.to_resolution(&room), owned);
    assert_eq!(
        (hit.dc(), hit.reservation().to_string(), hit.actor()),
        (
            &owned.dc,
            owned.reservation.to_string(),
            owned.actor.as_str()
        )
    );

    // The cache names another tail now (same DC, another reservation): a
    // report about the one resolved before leaves it.
    let other = homing_client::Resolution {
        reservation: ReservationId::new(owned.dc.clone(), owned.reservation.unique() + 1),
        ..owned.clone()
    };
    resolver.prime(other.clone()).await;
    resolver.report_unreachable_ref(room.borrowed(), &hit).await;
    let kept = resolver.resolve_ref(room.borrowed()).await.unwrap();
    assert!(kept.from_cache());
    assert!(kept.reservation().is(&other.reservation));
    // A report about the tail the cache names drops it: the next resolve walks.
    resolver
        .report_unreachable_ref(room.borrowed(), &kept)
        .await;
    assert!(
        !resolver
            .resolve_ref(room.borrowed())
            .await
            .unwrap()
            .from_cache()
    );
    assert_eq!(fra.script.count("resolve_reservation"), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_concurrent_cold_resolves_of_one_key_send_one_request_per_hop() {
    let ca = DevCa::generate("test ca").unwrap();
    let (iad, fra) = two_dcs_with_a_link(&ca).await;
    iad.script.delay_ms.store(100, Ordering::SeqCst);
    fra.script.delay_ms.store(100, Ordering::SeqCst);
    let resolver = resolver(&ca, &[&iad, &fra]);

    let mut tasks = Vec::new();
    for _ in 0..50 {
        let resolver = resolver.clone();
        tasks.push(tokio::spawn(
            async move { resolver.resolve(&key("room")).await },
        ));
    }
    for task in tasks {
        assert_eq!(task.await.unwrap().unwrap().reservation, id("fra.1"));
    }
    assert_eq!(iad.script.count("resolve"), 1);
    assert_eq!(fra.script.count("resolve_reservation"), 1);
}

#[tokio::test]
async fn the_global_read_fails_over_to_the_next_dc_when_the_nearest_does_not_answer() {
    let ca = DevCa::generate("test ca").unwrap();
    let fra = TestDc::start(&ca, "fra").await;
    fra.script.entry(
        &key("room"),
        &id("fra.4"),
        Some(segment("room", vec![], Some(active("fra.4", "a", 1)))),
    );
    // Nothing listens on this port: the nearest DC never answers.
    let dead = std::net::UdpSocket::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let config = ResolverConfig {
        hop_timeout_ms: 300,
        ..ResolverConfig::new(vec![(DcId::new("iad").unwrap(), dead), fra.entry()])
    };
    let resolver = Resolver::new(client(&ca, Role::Router, None), config);

    let started = std::time::Instant::now();
    let answer = resolver.resolve(&key("room")).await.unwrap();
    assert_eq!(answer.reservation, id("fra.4"));
    assert_eq!(fra.script.count("resolve"), 1);
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn a_chain_that_cycles_across_two_dcs_is_inconsistent_not_a_hang() {
    let ca = DevCa::generate("test ca").unwrap();
    let iad = TestDc::start(&ca, "iad").await;
    let fra = TestDc::start(&ca, "fra").await;
    iad.script.entry(
        &key("loop"),
        &id("iad.1"),
        Some(segment("loop", vec![link("iad.1", "fra.1")], None)),
    );
    iad.script.segment(
        &id("iad.1"),
        segment("loop", vec![link("iad.1", "fra.1")], None),
    );
    // Tokens rise around the loop, so only the cycle check can catch it.
    let cyclic = Link {
        token: FencingToken::new(2),
        ..link("fra.1", "iad.1")
    };
    fra.script
        .segment(&id("fra.1"), segment("loop", vec![cyclic], None));
    let resolver = resolver(&ca, &[&iad, &fra]);

    let outcome = tokio::time::timeout(Duration::from_secs(5), resolver.resolve(&key("loop")))
        .await
        .expect("a cyclic chain ends the walk");
    match outcome {
        Err(ResolveError::Inconsistent(why)) => assert!(why.contains("cycle"), "{why}"),
        Err(ResolveError::ChainTooLong(_)) => {}
        other => panic!("{other:?}"),
    }
    // A failed walk caches nothing: the links it saw are not trusted.
    assert!(resolver.resolve(&key("loop")).await.is_err());
}

#[tokio::test]
async fn a_dc_that_loops_inside_its_own_answers_hits_the_hop_limit_or_a_cycle() {
    let ca = DevCa::generate("test ca").unwrap();
    let iad = TestDc::start(&ca, "iad").await;
    // iad answers each hop with a fresh link to the next number: an endless chain.
    iad.script.entry(&key("long"), &id("iad.1"), None);
    for n in 1..100 {
        iad.script.segment(
            &id(&format!("iad.{n}")),
            segment(
                "long",
                vec![link(&format!("iad.{n}"), &format!("iad.{}", n + 1))],
                None,
            ),
        );
    }
    let config = ResolverConfig {
        hop_limit: 8,
        ..ResolverConfig::new(vec![iad.entry()])
    };
    let resolver = Resolver::new(client(&ca, Role::Router, None), config);
    assert_eq!(
        resolver.resolve(&key("long")).await,
        Err(ResolveError::ChainTooLong(8))
    );
    assert!(iad.script.count("resolve_reservation") <= 9);
}

#[tokio::test]
async fn a_dc_that_answers_for_another_dcs_reservation_is_inconsistent() {
    let ca = DevCa::generate("test ca").unwrap();
    let iad = TestDc::start(&ca, "iad").await;
    let fra = TestDc::start(&ca, "fra").await;
    iad.script.entry(
        &key("room"),
        &id("iad.1"),
        Some(segment("room", vec![link("iad.1", "fra.1")], None)),
    );
    // fra, asked about fra.1, claims a link out of sea.9 (not its own) …
    fra.script.segment(
        &id("fra.1"),
        segment("room", vec![link("sea.9", "fra.2")], None),
    );
    // … and about fra.5 answers with a tail of another reservation.
    iad.script.entry(
        &key("other"),
        &id("iad.2"),
        Some(segment("other", vec![link("iad.2", "fra.5")], None)),
    );
    fra.script.segment(
        &id("fra.5"),
        segment("other", vec![], Some(active("iad.7", "a", 1))),
    );
    // … and iad, asked for a global entry it does not own, answers fra's tail itself.
    iad.script.entry(
        &key("third"),
        &id("fra.8"),
        Some(segment("third", vec![], Some(active("fra.8", "a", 1)))),
    );
    let resolver = resolver(&ca, &[&iad, &fra]);

    assert!(matches!(
        resolver.resolve(&key("room")).await,
        Err(ResolveError::Inconsistent(_))
    ));
    assert!(matches!(
        resolver.resolve(&key("other")).await,
        Err(ResolveError::Inconsistent(_))
    ));
    match resolver.resolve(&key("third")).await {
        Err(ResolveError::Inconsistent(why)) => {
            assert!(why.contains("owned by another dc"), "{why}")
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(
        fra.script.count("resolve_reservation"),
        2,
        "the lie was not followed up"
    );
}

#[tokio::test]
async fn a_key_without_global_entry_is_not_found_and_a_vacant_tail_is_vacant() {
    let ca = DevCa::generate("test ca").unwrap();
    let iad = TestDc::start(&ca, "iad").await;
    let mut tail = active("iad.3", "a", 4);
    tail.state = TailState::Vacant {
        ended: homing_core::ReleaseCause::Expired,
    };
    iad.script.entry(
        &key("empty"),
        &id("iad.3"),
        Some(segment("empty", vec![], Some(tail))),
    );
    let resolver = resolver(&ca, &[&iad]);

    assert_eq!(
        resolver.resolve(&key("nobody")).await,
        Err(ResolveError::NotFound(key("nobody")))
    );
    assert_eq!(
        resolver.resolve(&key("empty")).await,
        Err(ResolveError::Vacant {
            key: key("empty"),
            reservation: id("iad.3")
        })
    );
}

#[tokio::test]
async fn a_silent_dc_is_unavailable_not_not_found() {
    let ca = DevCa::generate("test ca").unwrap();
    let iad = TestDc::start(&ca, "iad").await;
    iad.script.silent.store(true, Ordering::SeqCst);
    let config = ResolverConfig {
        hop_timeout_ms: 200,
        ..ResolverConfig::new(vec![iad.entry()])
    };
    let resolver = Resolver::new(client(&ca, Role::Router, None), config);
    assert!(matches!(
        resolver.resolve(&key("room")).await,
        Err(ResolveError::Unavailable { .. })
    ));
}

/// A `NotFound` is cached for `absent_ttl_ms` and concurrent misses share
/// one request; a key reserved meanwhile shows once the absence ages out.
#[tokio::test]
async fn not_found_is_cached_briefly_and_concurrent_misses_share_one_request() {
    let ca = DevCa::generate("test ca").unwrap();
    let iad = TestDc::start(&ca, "iad").await;
    let config = ResolverConfig {
        absent_ttl_ms: 300,
        ..ResolverConfig::new(vec![iad.entry()])
    };
    let resolver = Resolver::new(client(&ca, Role::Router, None), config);
    iad.script.delay_ms.store(50, Ordering::SeqCst);
    let storm: Vec<_> = (0..32)
        .map(|_| {
            let resolver = resolver.clone();
            tokio::spawn(async move { resolver.resolve(&key("nobody")).await })
        })
        .collect();
    for answer in storm {
        assert_eq!(
            answer.await.unwrap(),
            Err(ResolveError::NotFound(key("nobody")))
        );
    }
    for _ in 0..10 {
        assert!(resolver.resolve(&key("nobody")).await.is_err());
    }
    assert_eq!(
        iad.script.count("resolve"),
        1,
        "one request for 42 resolves"
    );

    iad.script.delay_ms.store(0, Ordering::SeqCst);
    iad.script.entry(
        &key("nobody"),
        &id("iad.3"),
        Some(segment("nobody", vec![], Some(active("iad.3", "a", 1)))),
    );
    let found = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            if let Ok(found) = resolver.resolve(&key("nobody")).await {
                return found;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("the absence ages out");
    assert_eq!(found.reservation, id("iad.3"));
    assert_eq!(iad.script.count("resolve"), 2);
}

/// Waits (bounded) until `done` holds, polling every few milliseconds.
async fn until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while !done() {
        assert!(
            std::time::Instant::now() < deadline,
            "waited too long: {what}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// A partition costs one timeout, not one per request: once iad let a hop
/// time out it is suspect, and until a probe gets an answer every resolve
/// that needs it is answered at once (the remembered answer, marked stale;
/// or `Unavailable { suspect: true }`) while keys that do not need it
/// resolve as before. One probe at a time; its first answer clears it.
#[tokio::test]
async fn a_dc_that_timed_out_is_suspect_and_not_waited_for_until_a_probe_gets_an_answer() {
    let ca = DevCa::generate("test ca").unwrap();
    let fra = TestDc::start(&ca, "fra").await;
    let iad = TestDc::start(&ca, "iad").await;
    // room: entry at fra, tail in iad. lobby: entry and tail at fra.
    fra.script.entry(&key("room"), &id("iad.7"), None);
    iad.script.segment(
        &id("iad.7"),
        segment("room", vec![], Some(active("iad.7", "10.1.0.7:9000", 3))),
    );
    fra.script.entry(
        &key("lobby"),
        &id("fra.3"),
        Some(segment(
            "lobby",
            vec![],
            Some(active("fra.3", "10.2.0.3:9000", 1)),
        )),
    );
    let hop_timeout = Duration::from_millis(1_000);
    let config = ResolverConfig {
        tail_ttl_ms: 60_000,
        hop_timeout_ms: hop_timeout.as_millis() as u64,
        probe_timeout_ms: 200,
        probe_interval_ms: 20,
        probe_interval_max_ms: 50,
        ..ResolverConfig::new(vec![fra.entry(), iad.entry()])
    };
    let resolver = Resolver::new(client(&ca, Role::Router, None), config);
    let (room, lobby) = (key("room"), key("lobby"));
    let first = resolver.resolve_or_stale(&room).await.unwrap();
    assert!(!first.stale && first.reservation == id("iad.7"));

    // iad stops answering; the router's answer is dropped (routing failed).
    iad.script.silent.store(true, Ordering::SeqCst);
    resolver.report_unreachable(&first).await;
    let started = std::time::Instant::now();
    let stale = resolver.resolve_or_stale(&room).await.unwrap();
    assert!(stale.stale && stale.reservation == id("iad.7"));
    assert!(started.elapsed() >= hop_timeout, "the first one waits");
    assert!(resolver.is_suspect(&DcId::new("iad").unwrap()));
    assert_eq!(
        (resolver.stats().suspicions, resolver.stats().dcs_suspect),
        (1, 1)
    );

    // Every later request that needs iad is answered without waiting.
    let asked_before = iad.script.count("resolve_reservation");
    for _ in 0..20 {
        let started = std::time::Instant::now();
        let again = resolver.resolve_or_stale(&room).await.unwrap();
        assert!(again.stale && again.reservation == id("iad.7"));
        assert!(
            started.elapsed() < hop_timeout / 2,
            "{:?}",
            started.elapsed()
        );
    }
    let started = std::time::Instant::now();
    match resolver.resolve(&room).await {
        Err(ResolveError::Unavailable { dc, suspect, .. }) => {
            assert!(suspect && dc.as_str() == "iad", "{dc} {suspect}");
        }
        other => panic!("{other:?}"),
    }
    assert!(started.elapsed() < hop_timeout / 2);
    let stats = resolver.stats();
    assert!(stats.skipped_suspect >= 21, "{stats:?}");
    assert!(stats.stale_answers >= 21, "{stats:?}");
    // Only probes reached iad meanwhile, one at a time.
    let probes_sent = iad.script.count("resolve_reservation") - asked_before;
    assert!(
        probes_sent as u64 <= resolver.stats().probes,
        "{probes_sent}"
    );

    // A key that does not need iad is unaffected.
    let hall = resolver.resolve_or_stale(&lobby).await.unwrap();
    assert!(!hall.stale && !hall.from_cache && hall.reservation == id("fra.3"));

    // Probes back off while iad is silent.
    until("two probes failed", || resolver.stats().probes_failed >= 2).await;
    assert!(resolver.is_suspect(&DcId::new("iad").unwrap()));

    // iad answers again: the first probe answered clears it for everyone.
    iad.script.silent.store(false, Ordering::SeqCst);
    until("iad healthy again", || resolver.stats().recoveries == 1).await;
    let healed = resolver.resolve_or_stale(&room).await.unwrap();
    assert!(!healed.stale && !healed.from_cache, "{healed:?}");
    let stats = resolver.stats();
    assert_eq!((stats.dcs_suspect, stats.suspicions), (0, 1), "{stats:?}");
}

/// A DC served by two homingd (listed twice in the table): the first stops
/// answering; the resolve that meets its silence is sent once more to the
/// second and answered (one timeout, no failure), and the next resolves go
/// straight to the second while the first is suspect.
#[tokio::test]
async fn a_dc_with_two_homingd_answers_through_the_second_when_the_first_is_silent() {
    let ca = DevCa::generate("test ca").unwrap();
    let first = TestDc::start(&ca, "iad").await;
    let second = TestDc::start(&ca, "iad").await;
    let tail = || segment("room", vec![], Some(active("iad.7", "10.1.0.7:9000", 3)));
    for dc in [&first, &second] {
        dc.script.entry(&key("room"), &id("iad.7"), Some(tail()));
        dc.script.segment(&id("iad.7"), tail());
    }
    first.script.silent.store(true, Ordering::SeqCst);
    let config = ResolverConfig {
        tail_ttl_ms: 0,
        hop_timeout_ms: 500,
        probe_interval_ms: 60_000,
        probe_interval_max_ms: 60_000,
        ..ResolverConfig::new(vec![first.entry(), second.entry()])
    };
    let resolver = Resolver::new(client(&ca, Role::Router, None), config);
    let answer = resolver.resolve(&key("room")).await.unwrap();
    assert_eq!(answer.reservation, id("iad.7"));
    let stats = resolver.stats();
    assert_eq!(
        (stats.failovers, stats.suspicions, stats.dcs_suspect),
        (1, 1, 0),
        "one address suspect, the dc is not: {stats:?}"
    );
    assert!(!resolver.is_suspect(&DcId::new("iad").unwrap()));
    let asked_first = first.script.count("resolve");
    for _ in 0..5 {
        resolver.resolve(&key("room")).await.unwrap();
    }
    assert_eq!(
        first.script.count("resolve"),
        asked_first,
        "a suspect address is not asked again"
    );
    assert_eq!(resolver.stats().failovers, 1);
}

/// hyper moves every HTTP/2 request's future into a task of its own: a
/// resolve's future, inside it, must not carry a walk's state (kilobytes,
/// copied per request; the walk is boxed when a resolve misses).
#[tokio::test]
async fn a_resolves_future_is_small_enough_to_move_per_request() {
    const RESOLVE_FUTURE_BYTES_MAX: usize = 256;
    let ca = DevCa::generate("test ca").expect("a ca");
    let resolver = Resolver::new(
        client(&ca, Role::Router, None),
        ResolverConfig::new(vec![(
            DcId::new("iad").expect("a dc"),
            "127.0.0.1:9".parse().expect("an address"),
        )]),
    );
    let room = key("room");
    let resolve = resolver.resolve(&room);
    let stale = resolver.resolve_or_stale(&room);
    let (resolve, stale) = (size_of_val(&resolve), size_of_val(&stale));
    let borrowed = resolver.resolve_ref(room.borrowed());
    let borrowed_stale = resolver.resolve_ref_or_stale(room.borrowed());
    let borrowed = size_of_val(&borrowed).max(size_of_val(&borrowed_stale));
    assert!(
        borrowed <= RESOLVE_FUTURE_BYTES_MAX,
        "resolve_ref's or resolve_ref_or_stale's future: {borrowed} bytes"
    );
    assert!(
        resolve <= RESOLVE_FUTURE_BYTES_MAX,
        "resolve's future: {resolve} bytes"
    );
    assert!(
        stale <= RESOLVE_FUTURE_BYTES_MAX,
        "resolve_or_stale's future: {stale} bytes"
    );
}

#[tokio::test]
async fn answers_of_one_actor_share_one_copy_of_its_id() {
    let ca = DevCa::generate("test ca").unwrap();
    let iad = DcId::new("iad").unwrap();
    // Never dialled: every answer below is primed.
    let config = ResolverConfig::new(vec![(iad.clone(), "127.0.0.1:9".parse().unwrap())]);
    let resolver = Resolver::new(client(&ca, Role::Router, None), config);
    let answer = |name: &str, unique: u64, actor: &str| homing_client::Resolution {
        key: key(name),
        reservation: ReservationId::new(iad.clone(), unique),
        dc: iad.clone(),
        actor: homing_core::ActorId::new(actor).unwrap(),
        token: FencingToken::new(unique),
        hops: 0,
        remote_round_trips: 0,
        from_cache: false,
        stale: false,
    };
    resolver.prime(answer("a", 1, "10.0.0.1:80")).await;
    resolver.prime(answer("b", 2, "10.0.0.1:80")).await;
    resolver.prime(answer("c", 3, "10.0.0.2:80")).await;
    let (a, b, c) = (key("a"), key("b"), key("c"));
    let a = resolver.resolve_ref(a.borrowed()).await.unwrap();
    let b = resolver.resolve_ref(b.borrowed()).await.unwrap();
    let c = resolver.resolve_ref(c.borrowed()).await.unwrap();
    assert_eq!(
        (a.actor(), b.actor(), c.actor()),
        ("10.0.0.1:80", "10.0.0.1:80", "10.0.0.2:80")
    );
    assert!(
        std::ptr::eq(a.actor(), b.actor()),
        "two keys of one actor share its id"
    );
    assert!(!std::ptr::eq(a.actor(), c.actor()));
}
