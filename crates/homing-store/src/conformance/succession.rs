//! The [`GlobalStore`](crate::GlobalStore) cases on successions: set_successor,
//! take_over (judged against the DC lease), successions_of, and a
//! migration's import_succession and scan_successions.

use homing_core::{
    DcId, DcLeaseState, DcRenewal, DcStanding, DcTerms, FencingToken, ReservationId, Succession,
    SuccessionCause, TakeOverReply, TakeoverPolicy,
};

use super::dc_lease::{LONG_TERMS, SHORT_TERMS, dc, marks, standing_becomes};
use super::{Backend, RACERS, rid};
use crate::error::StoreError;
use crate::global::{GET_MANY_KEYS_MAX, GlobalStore};

/// A move of `from` to `to`.
fn moved(from: &ReservationId, to: &ReservationId) -> Succession {
    Succession::moved(from.clone(), to.clone(), FencingToken::new(5))
}

/// A takeover of `from` by `to`.
fn taken(from: &ReservationId, to: &ReservationId) -> Succession {
    Succession::taken_over(from.clone(), to.clone(), 41)
}

/// Asserts that a takeover was refused with `dc`'s state, standing as `wanted` says.
fn assert_refused(
    reply: TakeOverReply,
    dc: &DcId,
    what: &str,
    wanted: impl Fn(&DcLeaseState) -> bool,
) -> DcLeaseState {
    match reply {
        TakeOverReply::Refused(state) if &state.dc == dc && wanted(&state) => state,
        other => panic!("takeover of a reservation of {dc} ({what}): {other:?}"),
    }
}

/// Renews every DC of `dcs` under [`SHORT_TERMS`] and waits until the
/// store calls each one expired.
async fn expire(g: &dyn GlobalStore, dcs: &[DcId]) {
    for dc in dcs {
        g.renew_dc_lease(dc, &SHORT_TERMS, &marks(1, 41))
            .await
            .unwrap();
    }
    for dc in dcs {
        standing_becomes(g, dc, "expired", |s| *s == DcStanding::Expired).await;
    }
}

/// successions: a set_successor that landed but whose answer was lost is
/// retried by the store, which reads the caller's own succession back and
/// answers that it wrote it (it did, once); a later mover finds it.
pub async fn global_set_successor_whose_answer_was_lost_is_written_once(b: &dyn Backend) {
    let Some(lossy) = b
        .global_store_losing_next_answer("global_successor_lost_answer")
        .await
    else {
        println!("  skipped: this backend's writes cannot lose their answer");
        return;
    };
    let g = lossy.store;
    let first = moved(&rid("iad.7"), &rid("fra.7"));
    assert_eq!(g.set_successor(&first).await.unwrap(), None);
    assert!((lossy.lost)(), "the answer to the write was not lost");
    let later = moved(&rid("iad.7"), &rid("sea.7"));
    assert_eq!(g.set_successor(&later).await.unwrap(), Some(first.clone()));
    assert_eq!(g.successor(&rid("iad.7")).await.unwrap(), Some(first));
    if let Some(failover) = g.failover() {
        let resolved = failover.total(crate::FailoverEvent::AmbiguousResolved);
        assert_eq!(resolved, 1, "the store counts the outcome it resolved");
    }
}

/// successions: an import whose succession was already there before the
/// call (written earlier, seen by this client) and whose answer is lost says
/// it found it, not that it wrote it: the retry reads the same value back,
/// but it was not this call's. `homing migrate` run twice counted such
/// successions copied instead of present (a rerun of
/// `redb_to_etcd_to_redb_round_trip_keeps_everything` under load, 1 run in
/// 50: "successions copied 15 present 28").
pub async fn global_an_import_losing_its_answer_finds_a_succession_already_there(b: &dyn Backend) {
    let place = "global_import_lost_answer_present";
    let first = moved(&rid("iad.8"), &rid("fra.8"));
    let plain = b.global_store(place).await;
    assert_eq!(plain.import_succession(&first).await.unwrap(), None);
    let Some(lossy) = b.global_store_losing_next_answer(place).await else {
        println!("  skipped: this backend's writes cannot lose their answer");
        return;
    };
    let found = lossy.store.import_succession(&first).await.unwrap();
    assert!((lossy.lost)(), "the answer to the import was not lost");
    assert_eq!(found, Some(first), "it was there before the call");
}

/// successions: the first set_successor of a reservation wins for good: a
/// retry answers it, a different one and a takeover find it, successor
/// reads it (also after reopen); a move written as a takeover, a takeover
/// written as a move and a reservation succeeding itself are refused and
/// write nothing.
pub async fn global_successor_is_write_once_and_checks_its_cause(b: &dyn Backend) {
    let place = "global_successor_write_once";
    let g = b.global_store(place).await;
    let (from, to) = (rid("iad.1"), rid("fra.1"));
    let first = moved(&from, &to);
    assert_eq!(g.successor(&from).await.unwrap(), None);
    assert_eq!(g.set_successor(&first).await.unwrap(), None);
    assert_eq!(
        g.set_successor(&first).await.unwrap(),
        Some(first.clone()),
        "a retry answers the succession it wrote"
    );
    let second = moved(&from, &rid("sea.1"));
    assert_eq!(g.set_successor(&second).await.unwrap(), Some(first.clone()));
    assert_eq!(g.successor(&from).await.unwrap(), Some(first.clone()));
    // Whatever the DC's lease: the succession exists.
    let takeover = g
        .take_over(&taken(&from, &rid("ord.1")), TakeoverPolicy::Automatic)
        .await
        .unwrap();
    assert_eq!(takeover, TakeOverReply::Exists(first.clone()));
    // Neighbours in byte order are other reservations.
    for other in ["iad.0", "iad.2", "iad.256", "iad-2.1", "ia.1"] {
        assert_eq!(g.successor(&rid(other)).await.unwrap(), None, "{other}");
    }
    let blank = rid("iad.2");
    let bad = [
        g.take_over(&moved(&blank, &to), TakeoverPolicy::Automatic)
            .await
            .map(|_| ()),
        g.set_successor(&taken(&blank, &to)).await.map(|_| ()),
        g.set_successor(&moved(&blank, &blank)).await.map(|_| ()),
        g.take_over(&taken(&blank, &blank), TakeoverPolicy::Automatic)
            .await
            .map(|_| ()),
    ];
    for (i, outcome) in bad.into_iter().enumerate() {
        assert!(
            matches!(outcome, Err(StoreError::InvalidArgument(_))),
            "bad call {i}: {outcome:?}"
        );
    }
    assert_eq!(
        g.successor(&blank).await.unwrap(),
        None,
        "a refused call wrote"
    );
    if !b.durable() {
        return;
    }
    drop(g);
    let g = b.global_store(place).await;
    assert_eq!(
        g.successor(&from).await.unwrap(),
        Some(first),
        "succession lost on reopen"
    );
}

/// successions: a takeover is refused while the store does not call the
/// DC's lease expired — never renewed (even retired), live, lapsed — with
/// the DC's state; once expired it is taken, and a second taker finds it.
/// `RetiredOnly` refuses an expired DC that is not retired and takes a
/// retired one.
pub async fn global_take_over_waits_for_the_dc_lease_to_expire(b: &dyn Backend) {
    let g = b.global_store("global_take_over_expiry").await;
    let automatic = TakeoverPolicy::Automatic;
    let retired_only = TakeoverPolicy::RetiredOnly;
    let (iad, ord, sea, lax, never) = (dc("iad"), dc("ord"), dc("sea"), dc("lax"), dc("never"));
    let unknown = |s: &DcLeaseState| s.standing == DcStanding::Unknown;
    let reply = g
        .take_over(&taken(&rid("iad.1"), &rid("fra.1")), automatic)
        .await
        .unwrap();
    assert_refused(reply, &iad, "unknown", unknown);
    g.retire_dc(&never).await.unwrap();
    for policy in [automatic, retired_only] {
        let reply = g
            .take_over(&taken(&rid("never.1"), &rid("fra.1")), policy)
            .await
            .unwrap();
        let state = assert_refused(reply, &never, "unknown, retired", unknown);
        assert!(state.retired);
    }
    // Lapsed for a minute after its ttl of 1 s.
    let lapsing = DcTerms {
        ttl_ms: 1_000,
        host_lease_ttl_max_ms: 60_000,
        grace_ms: 0,
    };
    g.renew_dc_lease(&lax, &lapsing, &marks(1, 41))
        .await
        .unwrap();
    for dc in [&iad, &ord, &sea] {
        g.renew_dc_lease(dc, &SHORT_TERMS, &marks(1, 41))
            .await
            .unwrap();
    }
    g.retire_dc(&sea).await.unwrap();
    let den = dc("den");
    g.renew_dc_lease(&den, &LONG_TERMS, &marks(1, 41))
        .await
        .unwrap();
    let reply = g
        .take_over(&taken(&rid("den.1"), &rid("fra.1")), automatic)
        .await
        .unwrap();
    let state = assert_refused(reply, &den, "live", |s| {
        matches!(s.standing, DcStanding::Live { .. })
    });
    assert_eq!((state.terms, state.marks), (Some(LONG_TERMS), marks(1, 41)));
    standing_becomes(g.as_ref(), &lax, "lapsed", |s| {
        matches!(s, DcStanding::Lapsed { .. })
    })
    .await;
    let reply = g
        .take_over(&taken(&rid("lax.1"), &rid("fra.1")), automatic)
        .await
        .unwrap();
    let state = assert_refused(reply, &lax, "lapsed", |s| {
        matches!(s.standing, DcStanding::Lapsed { .. })
    });
    assert_eq!(state.terms, Some(lapsing));
    assert_eq!(g.successor(&rid("lax.1")).await.unwrap(), None);

    for dc in [&iad, &ord, &sea] {
        standing_becomes(g.as_ref(), dc, "expired", |s| *s == DcStanding::Expired).await;
    }
    // A taker that read a lower token bound than the store keeps (the DC
    // published a higher one since) is refused: its token would not be
    // above every token the DC granted.
    let stale = Succession::taken_over(rid("iad.1"), rid("fra.1"), 40);
    let reply = g.take_over(&stale, automatic).await.unwrap();
    assert_refused(reply, &iad, "expired, bound 41 above the taker's", |s| {
        s.standing == DcStanding::Expired && s.marks.token_bound == 41
    });
    let first = taken(&rid("iad.1"), &rid("fra.1"));
    assert_eq!(
        g.take_over(&first, automatic).await.unwrap(),
        TakeOverReply::Taken
    );
    assert_eq!(
        g.successor(&rid("iad.1")).await.unwrap(),
        Some(first.clone())
    );
    let second = taken(&rid("iad.1"), &rid("sea.9"));
    assert_eq!(
        g.take_over(&second, automatic).await.unwrap(),
        TakeOverReply::Exists(first.clone())
    );
    assert_eq!(
        g.set_successor(&moved(&rid("iad.1"), &rid("lhr.1")))
            .await
            .unwrap(),
        Some(first)
    );

    let reply = g
        .take_over(&taken(&rid("ord.1"), &rid("fra.2")), retired_only)
        .await
        .unwrap();
    assert_refused(reply, &ord, "expired, not retired", |s| {
        s.standing == DcStanding::Expired && !s.retired
    });
    assert_eq!(g.successor(&rid("ord.1")).await.unwrap(), None);
    let retired = taken(&rid("sea.1"), &rid("fra.3"));
    assert_eq!(
        g.take_over(&retired, retired_only).await.unwrap(),
        TakeOverReply::Taken
    );
    assert_eq!(g.successor(&rid("sea.1")).await.unwrap(), Some(retired));
}

/// successions: takeovers racing the expired DC's renewal are either
/// refused or listed by `successions_of` read after the renewal's answer
/// (what a returning DC reconciles before it grants): the store judges the
/// lease and writes the takeover in one transaction, so no renewal lands
/// between. After the renewal, a takeover of another reservation of the
/// DC is refused again, and the earlier takeover is still listed.
pub async fn global_takeovers_racing_a_renewal_are_refused_or_reconciled(b: &dyn Backend) {
    const RACING_DCS: usize = 8;
    const TAKERS_PER_DC: u64 = 4;
    let g = b.global_store("global_takeover_vs_renewal").await;
    let dcs: Vec<DcId> = (0..RACING_DCS).map(|i| dc(&format!("dc{i}"))).collect();
    expire(g.as_ref(), &dcs).await;
    let before = taken(&ReservationId::new(dcs[0].clone(), 100), &rid("fra.100"));
    assert_eq!(
        g.take_over(&before, TakeoverPolicy::Automatic)
            .await
            .unwrap(),
        TakeOverReply::Taken
    );
    // Per DC, the renewal starts among its takers. It renews under the
    // same terms and marks, so a store whose entry does not change (redb)
    // has nothing to write: the renewal is as quick as it gets.
    let mut takers = Vec::new();
    let mut renewers = Vec::new();
    for (i, d) in dcs.iter().enumerate() {
        for unique in 1..=TAKERS_PER_DC {
            let from = ReservationId::new(d.clone(), unique);
            let to = ReservationId::new(dc("fra"), i as u64 * 100 + unique);
            let (taker, s) = (g.clone(), taken(&from, &to));
            takers.push(tokio::spawn(async move {
                let reply = taker.take_over(&s, TakeoverPolicy::Automatic).await;
                (s, reply.unwrap(), tokio::time::Instant::now())
            }));
            if unique == TAKERS_PER_DC / 2 {
                let (g, d) = (g.clone(), d.clone());
                renewers.push(tokio::spawn(async move {
                    let sent = tokio::time::Instant::now();
                    let renewal = g.renew_dc_lease(&d, &SHORT_TERMS, &marks(1, 41)).await;
                    assert!(matches!(renewal.unwrap(), DcRenewal::Renewed(_)));
                    let seen = g.successions_of(&d, None, GET_MANY_KEYS_MAX).await;
                    (d, (seen.unwrap(), sent))
                }));
            }
        }
    }
    let mut reconciled = std::collections::HashMap::new();
    for renewer in renewers {
        let (d, seen) = renewer.await.unwrap();
        reconciled.insert(d, seen);
    }
    // The short lease renewed in the race expires again after this much:
    // a takeover answered later may legitimately be taken unseen.
    let expires_again = std::time::Duration::from_millis(SHORT_TERMS.expires_after_ms());
    let (mut won, mut refused) = (0, 0);
    for taker in takers {
        let (s, reply, answered) = taker.await.unwrap();
        match reply {
            TakeOverReply::Taken => {
                won += 1;
                let (seen, sent) = &reconciled[s.link.from.dc()];
                assert!(
                    seen.contains(&s) || answered >= *sent + expires_again,
                    "{} was taken over after its DC renewed, unseen by its reconcile: {seen:?}",
                    s.link.from
                );
            }
            TakeOverReply::Refused(state) => {
                refused += 1;
                assert!(
                    matches!(
                        state.standing,
                        DcStanding::Live { .. } | DcStanding::Lapsed { .. }
                    ),
                    "{state:?}"
                );
            }
            TakeOverReply::Exists(other) => panic!("nothing else succeeded it: {other:?}"),
        }
    }
    println!("  takeovers racing renewals: {won} taken, {refused} refused");
    assert!(reconciled[&dcs[0]].0.contains(&before));
    g.renew_dc_lease(&dcs[0], &LONG_TERMS, &marks(1, 41))
        .await
        .unwrap();
    let after = taken(&ReservationId::new(dcs[0].clone(), 200), &rid("fra.200"));
    let reply = g
        .take_over(&after, TakeoverPolicy::Automatic)
        .await
        .unwrap();
    assert_refused(reply, &dcs[0], "renewed", |s| {
        matches!(s.standing, DcStanding::Live { .. })
    });
    let listed = g.successions_of(&dcs[0], None, GET_MANY_KEYS_MAX);
    assert!(listed.await.unwrap().contains(&before));
}

/// successions: concurrent takeovers and moves of one reservation of an
/// expired DC have exactly one winner, and every other caller finds it.
pub async fn global_concurrent_successions_have_exactly_one_winner(b: &dyn Backend) {
    let g = b.global_store("global_succession_race").await;
    let iad = dc("iad");
    expire(g.as_ref(), std::slice::from_ref(&iad)).await;
    let from = rid("iad.7");
    let tasks: Vec<_> = (0..RACERS)
        .map(|i| {
            let g = g.clone();
            let to = ReservationId::new(dc(&format!("dc{i}")), 1);
            let s = if i % 2 == 0 {
                taken(&from, &to)
            } else {
                moved(&from, &to)
            };
            tokio::spawn(async move {
                let existing = match s.cause {
                    SuccessionCause::TakenOver => {
                        match g.take_over(&s, TakeoverPolicy::Automatic).await.unwrap() {
                            TakeOverReply::Taken => None,
                            TakeOverReply::Exists(existing) => Some(existing),
                            TakeOverReply::Refused(state) => panic!("refused: {state:?}"),
                        }
                    }
                    SuccessionCause::Moved => g.set_successor(&s).await.unwrap(),
                };
                (s, existing)
            })
        })
        .collect();
    let mut winners = Vec::new();
    let mut seen = Vec::new();
    for t in tasks {
        match t.await.unwrap() {
            (s, None) => winners.push(s),
            (_, Some(existing)) => seen.push(existing),
        }
    }
    assert_eq!(winners.len(), 1, "winners: {winners:?}");
    assert!(seen.iter().all(|s| s == &winners[0]), "{seen:?}");
    assert_eq!(
        g.successor(&from).await.unwrap().as_ref(),
        Some(&winners[0])
    );
}

/// successions: `successions_of` lists one DC's successions in unique
/// order (not text order, and no other DC's, however its id starts),
/// paged by `after` cursors (a cursor needs not be a succession); a limit
/// above [`GET_MANY_KEYS_MAX`] and a cursor of another DC are refused.
pub async fn global_successions_of_pages_in_unique_order(b: &dyn Backend) {
    let g = b.global_store("global_successions_of").await;
    let iad = dc("iad");
    let uniques = [256, 0, 10, 9, 1, u64::MAX, 70_000, 2];
    let others = ["iad-2.1", "iad2.4", "ia.3", "fra.5", "iad-2.0"];
    let mut want = Vec::new();
    for (n, unique) in uniques.iter().enumerate() {
        let s = moved(
            &ReservationId::new(iad.clone(), *unique),
            &rid(&format!("lhr.{n}")),
        );
        assert_eq!(g.set_successor(&s).await.unwrap(), None);
        want.push(s);
        let other = rid(others[n % others.len()]);
        g.set_successor(&moved(&other, &rid("lhr.99")))
            .await
            .unwrap();
    }
    want.sort_by_key(|s| s.link.from.unique());
    assert_eq!(
        g.successions_of(&iad, None, GET_MANY_KEYS_MAX)
            .await
            .unwrap(),
        want
    );
    for limit in [1, 2, 3] {
        let mut paged = Vec::new();
        let mut after: Option<ReservationId> = None;
        loop {
            let page = g.successions_of(&iad, after.as_ref(), limit).await.unwrap();
            assert!(page.len() <= limit);
            let last_page = page.len() < limit;
            after = page.last().map(|s| s.link.from.clone());
            paged.extend(page);
            if last_page {
                break;
            }
        }
        assert_eq!(paged, want, "pages of {limit}");
    }
    let page = g
        .successions_of(&iad, Some(&rid("iad.3")), 2)
        .await
        .unwrap();
    assert_eq!(page, want[3..5].to_vec(), "a cursor that is no succession");
    let last = ReservationId::new(iad.clone(), u64::MAX);
    assert!(
        g.successions_of(&iad, Some(&last), 10)
            .await
            .unwrap()
            .is_empty()
    );
    assert!(g.successions_of(&iad, None, 0).await.unwrap().is_empty());
    assert!(
        g.successions_of(&dc("none"), None, 10)
            .await
            .unwrap()
            .is_empty()
    );
    let ia = g.successions_of(&dc("ia"), None, 10).await.unwrap();
    assert_eq!(ia, vec![moved(&rid("ia.3"), &rid("lhr.99"))]);
    assert!(matches!(
        g.successions_of(&iad, None, GET_MANY_KEYS_MAX + 1).await,
        Err(StoreError::BatchTooLarge { .. })
    ));
    assert!(matches!(
        g.successions_of(&iad, Some(&rid("iad-2.1")), 10).await,
        Err(StoreError::InvalidArgument(_))
    ));
}

/// successions: a migration's `import_succession` writes a succession of
/// either cause once and judges no DC lease (a takeover of a reservation of
/// a DC the store never heard of is imported, where `take_over` refuses
/// it); a retry answers the succession it wrote, a different import of the
/// same reservation (either cause) finds the first, a reservation
/// succeeding itself is refused and writes nothing; `successions_of` lists
/// imports, and they are kept on reopen.
pub async fn global_import_succession_is_write_once_for_either_cause(b: &dyn Backend) {
    let place = "global_import_succession";
    let g = b.global_store(place).await;
    let never = dc("never");
    let reply = g
        .take_over(
            &taken(&rid("never.2"), &rid("fra.2")),
            TakeoverPolicy::Automatic,
        )
        .await
        .unwrap();
    assert_refused(reply, &never, "unknown", |s| {
        s.standing == DcStanding::Unknown
    });
    let imported = [
        moved(&rid("iad.1"), &rid("fra.1")),
        taken(&rid("never.1"), &rid("fra.1")),
    ];
    for s in &imported {
        assert_eq!(g.import_succession(s).await.unwrap(), None, "{s:?}");
        assert_eq!(
            g.import_succession(s).await.unwrap(),
            Some(s.clone()),
            "a retry answers the succession it wrote"
        );
        for other in [
            moved(&s.link.from, &rid("sea.9")),
            taken(&s.link.from, &rid("sea.9")),
        ] {
            assert_eq!(g.import_succession(&other).await.unwrap(), Some(s.clone()));
        }
        assert_eq!(g.successor(&s.link.from).await.unwrap(), Some(s.clone()));
    }
    let blank = rid("iad.2");
    for itself in [moved(&blank, &blank), taken(&blank, &blank)] {
        let outcome = g.import_succession(&itself).await;
        assert!(
            matches!(outcome, Err(StoreError::InvalidArgument(_))),
            "{outcome:?}"
        );
    }
    assert_eq!(
        g.successor(&blank).await.unwrap(),
        None,
        "a refused import wrote"
    );
    let listed = g.successions_of(&never, None, GET_MANY_KEYS_MAX).await;
    assert_eq!(listed.unwrap(), vec![imported[1].clone()]);
    if !b.durable() {
        return;
    }
    drop(g);
    let g = b.global_store(place).await;
    for s in &imported {
        let kept = g.successor(&s.link.from).await.unwrap();
        assert_eq!(kept.as_ref(), Some(s), "import lost on reopen");
    }
}

/// successions: an import and the serving writes of a succession exclude
/// each other, whatever their causes: an imported move or takeover is what
/// a later `take_over` (of an expired DC) and a later `set_successor` of the
/// same reservation find, and a takeover or move written first is what a
/// later import finds.
pub async fn global_import_and_serving_successions_exclude_each_other(b: &dyn Backend) {
    let g = b.global_store("global_import_vs_serving").await;
    let iad = dc("iad");
    expire(g.as_ref(), std::slice::from_ref(&iad)).await;
    let automatic = TakeoverPolicy::Automatic;
    for (n, first) in [
        moved(&rid("iad.1"), &rid("fra.1")),
        taken(&rid("iad.2"), &rid("fra.2")),
    ]
    .into_iter()
    .enumerate()
    {
        assert_eq!(g.import_succession(&first).await.unwrap(), None);
        let from = &first.link.from;
        let later = taken(from, &ReservationId::new(dc("ord"), n as u64));
        assert_eq!(
            g.take_over(&later, automatic).await.unwrap(),
            TakeOverReply::Exists(first.clone()),
            "a takeover after an import"
        );
        let later = moved(from, &ReservationId::new(dc("sea"), n as u64));
        assert_eq!(
            g.set_successor(&later).await.unwrap(),
            Some(first.clone()),
            "a move after an import"
        );
    }
    let takeover = taken(&rid("iad.3"), &rid("fra.3"));
    assert_eq!(
        g.take_over(&takeover, automatic).await.unwrap(),
        TakeOverReply::Taken
    );
    let moved_first = moved(&rid("iad.4"), &rid("fra.4"));
    assert_eq!(g.set_successor(&moved_first).await.unwrap(), None);
    for first in [takeover, moved_first] {
        let from = &first.link.from;
        for later in [taken(from, &rid("ord.9")), moved(from, &rid("ord.9"))] {
            assert_eq!(
                g.import_succession(&later).await.unwrap(),
                Some(first.clone()),
                "an import after a {:?}",
                first.cause
            );
        }
        assert_eq!(g.successor(from).await.unwrap(), Some(first));
    }
}

/// successions: `scan_successions` lists every DC's successions — of DCs
/// the store keeps no lease of too — in (DC id, unique) order (not text
/// order), paged by `after` cursors (a cursor needs not be a succession;
/// past a DC's last unique the next DC follows); a limit above
/// [`GET_MANY_KEYS_MAX`] is refused.
pub async fn global_scan_successions_lists_every_dc_in_order(b: &dyn Backend) {
    let g = b.global_store("global_scan_successions").await;
    let froms = [
        "iad.256",
        "iad.0",
        "fra.5",
        "ia.3",
        "iad-2.1",
        "iad.18446744073709551615",
        "iad2.4",
        "iad.9",
        "lhr.1",
    ];
    let mut want = Vec::new();
    for (n, from) in froms.iter().enumerate() {
        let to = ReservationId::new(dc("sea"), n as u64);
        let s = match n % 2 {
            0 => moved(&rid(from), &to),
            _ => taken(&rid(from), &to),
        };
        assert_eq!(g.import_succession(&s).await.unwrap(), None);
        want.push(s);
    }
    want.sort_by(|a, b| {
        let key = |s: &Succession| (s.link.from.dc().as_str().to_string(), s.link.from.unique());
        key(a).cmp(&key(b))
    });
    assert!(
        g.dc_leases().await.unwrap().is_empty(),
        "no DC renewed: successions_of alone would need their ids"
    );
    let all = g.scan_successions(None, GET_MANY_KEYS_MAX).await.unwrap();
    assert_eq!(all, want);
    for limit in [1, 2, 3] {
        let mut paged = Vec::new();
        let mut after: Option<ReservationId> = None;
        loop {
            let page = g.scan_successions(after.as_ref(), limit).await.unwrap();
            assert!(page.len() <= limit);
            let last_page = page.len() < limit;
            after = page.last().map(|s| s.link.from.clone());
            paged.extend(page);
            if last_page {
                break;
            }
        }
        assert_eq!(paged, want, "pages of {limit}");
    }
    let at = |from: &str| want.iter().position(|s| s.link.from == rid(from)).unwrap();
    let page = g.scan_successions(Some(&rid("iad.10")), 2).await.unwrap();
    assert_eq!(
        page,
        want[at("iad.256")..][..2],
        "a cursor that is no succession"
    );
    let last_of_iad = ReservationId::new(dc("iad"), u64::MAX);
    let page = g.scan_successions(Some(&last_of_iad), 1).await.unwrap();
    assert_eq!(page, want[at("iad-2.1")..][..1], "the next DC follows");
    let past_all = g.scan_successions(Some(&rid("lhr.1")), 10).await.unwrap();
    assert!(past_all.is_empty());
    assert!(g.scan_successions(None, 0).await.unwrap().is_empty());
    assert!(matches!(
        g.scan_successions(None, GET_MANY_KEYS_MAX + 1).await,
        Err(StoreError::BatchTooLarge { .. })
    ));
}
