//! Conformance cases of the DC store's host sessions: session rows by
//! compare-and-set, the guarded record writes, and the three indexes
//! derived from them ([`crate::session`]).

use std::sync::Arc;

use homing_core::{
    DcRecord, Expiry, HostTime, LeasePolicy, RecordState, ReleaseCause, SessionId, SessionRecord,
    SessionState, StoreTime,
};

use super::{Backend, RACERS, key, lease, record, rid};
use crate::dc::{Cas, DcStore, Import};
use crate::error::StoreError;
use crate::session::{GuardedCas, SessionCas, SessionCursor, SessionGuard};

fn sid(text: &str) -> SessionId {
    text.parse().expect("valid session id")
}

/// A fresh session row opened at store time `at_ms` (ttl 10 s).
fn opened(id: &str, at_ms: u64) -> SessionRecord {
    SessionRecord::open(
        sid(id),
        lease(),
        HostTime::from_ms(at_ms),
        StoreTime::from_ms(at_ms),
        &LeasePolicy::DEFAULT,
    )
    .0
}

/// `row` renewed at store time `at_ms`.
fn renewed(row: &SessionRecord, at_ms: u64) -> SessionRecord {
    row.renew(
        &lease(),
        HostTime::from_ms(at_ms),
        StoreTime::from_ms(at_ms),
        &LeasePolicy::DEFAULT,
    )
    .next
    .expect("a live session renews")
}

/// A fresh record of `id` held under `session`.
fn in_session(id: &str, name: &str, session: &SessionRecord) -> DcRecord {
    let mut r = record(&rid(id), &key("", name));
    if let RecordState::Active { expiry, .. } = &mut r.state {
        *expiry = Expiry::Session(session.id.clone());
    }
    r
}

fn joins(session: &SessionRecord) -> SessionGuard {
    SessionGuard {
        id: session.id.clone(),
        version: session.version,
        next: None,
    }
}

async fn create_session(s: &Arc<dyn DcStore>, row: &SessionRecord) {
    assert_eq!(
        s.compare_and_set_session(None, row).await.unwrap(),
        SessionCas::Written
    );
}

async fn join(s: &Arc<dyn DcStore>, record: &DcRecord, session: &SessionRecord) {
    let guard = joins(session);
    let written = s.compare_and_set_in_session(None, record, &guard);
    assert_eq!(written.await.unwrap(), GuardedCas::Written);
}

/// The store's session counts, where it counts them.
async fn assert_counts(s: &Arc<dyn DcStore>, rows: u64, keys: u64) {
    if let Some(counts) = s.session_counts().await.unwrap() {
        assert_eq!((counts.rows, counts.keys), (rows, keys));
    }
}

fn ids(records: &[DcRecord]) -> Vec<String> {
    records.iter().map(|r| r.id.to_string()).collect()
}

/// dc: a session row is created once, changed only by a compare-and-set on
/// its version, and deleted only at its version.
pub async fn dc_session_rows_change_only_by_compare_and_set(b: &dyn Backend) {
    let s = b.dc_store("dc_session_rows").await;
    let row = opened("iad~1", 0);
    assert_eq!(s.session(&row.id).await.unwrap(), None);
    create_session(&s, &row).await;
    assert_eq!(s.session(&row.id).await.unwrap(), Some(row.clone()));
    assert_eq!(
        s.compare_and_set_session(None, &row).await.unwrap(),
        SessionCas::Conflict {
            current: Some(row.clone())
        }
    );
    let next = renewed(&row, 3_000);
    assert_eq!(
        s.compare_and_set_session(Some(1), &next).await.unwrap(),
        SessionCas::Written
    );
    // A renewal judged on version 1 lost to the one that landed.
    let stale = renewed(&row, 4_000);
    assert_eq!(
        s.compare_and_set_session(Some(1), &stale).await.unwrap(),
        SessionCas::Conflict {
            current: Some(next.clone())
        }
    );
    assert_eq!(s.session(&row.id).await.unwrap(), Some(next.clone()));
    assert!(matches!(
        s.compare_and_set_session(Some(2), &stale).await,
        Err(StoreError::InvalidVersion { .. })
    ));
    assert!(!s.delete_session(&row.id, 1).await.unwrap());
    assert!(s.delete_session(&row.id, 2).await.unwrap());
    assert_eq!(s.session(&row.id).await.unwrap(), None);
    assert!(!s.delete_session(&row.id, 2).await.unwrap());
}

/// dc: concurrent renewals judged on one version: exactly one lands.
pub async fn dc_concurrent_session_renewals_have_exactly_one_winner(b: &dyn Backend) {
    let s = b.dc_store("dc_session_race").await;
    let row = opened("iad~1", 0);
    create_session(&s, &row).await;
    let racers = (0..RACERS as u64).map(|i| {
        let s = s.clone();
        let next = renewed(&row, 1_000 + i);
        tokio::spawn(async move { s.compare_and_set_session(Some(1), &next).await })
    });
    let mut won = 0;
    for racer in racers {
        if racer.await.unwrap().unwrap() == SessionCas::Written {
            won += 1;
        }
    }
    assert_eq!(won, 1);
    assert_eq!(s.session(&row.id).await.unwrap().unwrap().version, 2);
}

/// dc: a record joins a session or freezes only under a guard of the
/// session row's version; a plain write of one is refused; a guard that
/// moved writes nothing; a freeze writes the row the guard carries.
pub async fn dc_records_join_and_freeze_only_under_their_sessions_guard(b: &dyn Backend) {
    let s = b.dc_store("dc_session_guard").await;
    let row = opened("iad~1", 0);
    create_session(&s, &row).await;
    let r1 = in_session("iad.2", "room", &row);
    assert!(matches!(
        s.compare_and_set(None, &r1).await,
        Err(StoreError::SessionGuardMissing { .. })
    ));
    assert_eq!(s.get(&r1.id).await.unwrap(), None);
    // The session renewed since the acquire read it: nothing is written.
    let row2 = renewed(&row, 1_000);
    s.compare_and_set_session(Some(1), &row2).await.unwrap();
    assert_eq!(
        s.compare_and_set_in_session(None, &r1, &joins(&row))
            .await
            .unwrap(),
        GuardedCas::SessionMoved {
            current: Some(row2.clone())
        }
    );
    assert_eq!(s.get(&r1.id).await.unwrap(), None);
    assert_eq!(s.events(0, 10).await.unwrap().head, 0, "no event either");
    join(&s, &r1, &row2).await;
    assert_eq!(s.get(&r1.id).await.unwrap(), Some(r1.clone()));
    // A record conflict writes neither the record nor the row.
    let frozen = r1.drain(Some(&row2)).expect("a held key drains");
    let (row3, notice) = row2.noticed();
    let freeze = SessionGuard {
        id: row2.id.clone(),
        version: row2.version,
        next: Some(row3.clone()),
    };
    assert_eq!(
        s.compare_and_set_in_session(None, &r1, &freeze)
            .await
            .unwrap(),
        GuardedCas::RecordConflict {
            current: Some(r1.clone())
        }
    );
    assert_eq!(s.session(&row.id).await.unwrap(), Some(row2.clone()));
    // The freeze lands with its numbered row.
    assert_eq!(
        s.compare_and_set_in_session(Some(1), &frozen, &freeze)
            .await
            .unwrap(),
        GuardedCas::Written
    );
    assert_eq!(s.session(&row.id).await.unwrap(), Some(row3.clone()));
    assert_eq!(notice, 1);
    assert!(matches!(
        frozen.state,
        RecordState::Active {
            expiry: Expiry::Frozen { notice: 1, .. },
            ..
        }
    ));
    // A write that keeps the record frozen (or releases it) needs no guard.
    let released = frozen
        .release(
            frozen.token,
            &lease(),
            Default::default(),
            StoreTime::from_ms(2_000),
        )
        .next
        .expect("the holder releases");
    assert_eq!(
        s.compare_and_set(Some(2), &released).await.unwrap(),
        Cas::Written
    );
    // A guard that names another session than the record's is a caller bug.
    let other = in_session("iad.3", "other", &row);
    let wrong = SessionGuard {
        id: sid("iad~9"),
        version: 1,
        next: None,
    };
    assert!(matches!(
        s.compare_and_set_in_session(None, &other, &wrong).await,
        Err(StoreError::InvalidArgument(_))
    ));
}

/// dc: the session-keys and session-notices indexes list exactly the
/// session's records held (or frozen) now, page in order, and follow
/// every write, release and reopen.
pub async fn dc_session_keys_and_notices_follow_every_write(b: &dyn Backend) {
    let place = "dc_session_indexes";
    let s = b.dc_store(place).await;
    let row = opened("iad~1", 0);
    let other = opened("iad~50", 0);
    create_session(&s, &row).await;
    create_session(&s, &other).await;
    let names = ["iad.10", "iad.11", "iad.12", "iad.13", "iad.14"];
    for (i, id) in names.iter().enumerate() {
        join(&s, &in_session(id, &format!("k{i}"), &row), &row).await;
    }
    join(&s, &in_session("iad.60", "elsewhere", &other), &other).await;
    // A per-key lease is in no session's index.
    s.compare_and_set(None, &record(&rid("iad.70"), &key("", "alone")))
        .await
        .unwrap();
    let all = s.session_keys(&row.id, None, 128).await.unwrap();
    assert_eq!(ids(&all), names);
    assert_counts(&s, 2, 6).await;
    let first = s.session_keys(&row.id, None, 2).await.unwrap();
    assert_eq!(ids(&first), ["iad.10", "iad.11"]);
    let rest = s.session_keys(&row.id, Some(&first[1].id), 128).await;
    assert_eq!(ids(&rest.unwrap()), ["iad.12", "iad.13", "iad.14"]);
    assert!(matches!(
        s.session_keys(&row.id, None, 129).await,
        Err(StoreError::BatchTooLarge { .. })
    ));
    // Freeze two, in order; the notices list them by number.
    let mut session = row.clone();
    for id in ["iad.13", "iad.11"] {
        let held = s.get(&rid(id)).await.unwrap().unwrap();
        let frozen = held.drain(Some(&session)).unwrap();
        let (next, _) = session.noticed();
        let guard = SessionGuard {
            id: session.id.clone(),
            version: session.version,
            next: Some(next.clone()),
        };
        let written = s.compare_and_set_in_session(Some(held.version), &frozen, &guard);
        assert_eq!(written.await.unwrap(), GuardedCas::Written);
        session = next;
    }
    let notices = s.session_notices(&row.id, 0, 128).await.unwrap();
    assert_eq!(ids(&notices), ["iad.13", "iad.11"]);
    assert_eq!(
        ids(&s.session_notices(&row.id, 1, 128).await.unwrap()),
        ["iad.11"]
    );
    assert!(s.session_notices(&row.id, 2, 128).await.unwrap().is_empty());
    assert!(
        s.session_notices(&other.id, 0, 128)
            .await
            .unwrap()
            .is_empty()
    );
    // A frozen key is still the session's until it is released or reaped.
    assert_eq!(s.session_keys(&row.id, None, 128).await.unwrap().len(), 5);
    let frozen = s.get(&rid("iad.13")).await.unwrap().unwrap();
    let reaped = frozen
        .expire(
            StoreTime::from_ms(60_000),
            &LeasePolicy::DEFAULT,
            Some(&session),
        )
        .expect("past its freeze plus grace");
    assert!(matches!(
        reaped.state,
        RecordState::Released {
            cause: ReleaseCause::Expired,
            ..
        }
    ));
    s.compare_and_set(Some(frozen.version), &reaped)
        .await
        .unwrap();
    let keys = s.session_keys(&row.id, None, 128).await.unwrap();
    assert_eq!(ids(&keys), ["iad.10", "iad.11", "iad.12", "iad.14"]);
    assert_counts(&s, 2, 5).await;
    assert_eq!(
        ids(&s.session_notices(&row.id, 0, 128).await.unwrap()),
        ["iad.11"]
    );
    if b.durable() {
        drop(s);
        let s = b.dc_store(place).await;
        let keys = s.session_keys(&row.id, None, 128).await.unwrap();
        assert_eq!(ids(&keys), ["iad.10", "iad.11", "iad.12", "iad.14"]);
        assert_eq!(s.session(&row.id).await.unwrap(), Some(session));
        let notices = s.session_notices(&row.id, 0, 128).await.unwrap();
        assert_eq!(ids(&notices), ["iad.11"]);
    }
}

/// dc: the sessions-due index lists rows due by a time, oldest first, and
/// follows renewals, ends and deletes.
pub async fn dc_due_sessions_follow_renewals_ends_and_deletes(b: &dyn Backend) {
    let s = b.dc_store("dc_sessions_due").await;
    let until = |ms| StoreTime::from_ms(ms);
    let a = opened("iad~1", 0); // expires at 10 s
    let b2 = opened("iad~2", 5_000); // 15 s
    let c = opened("iad~3", 1_000); // 11 s
    for row in [&a, &b2, &c] {
        create_session(&s, row).await;
    }
    let due = |rows: Vec<SessionRecord>| -> Vec<String> {
        rows.iter().map(|r| r.id.to_string()).collect()
    };
    assert!(
        s.due_sessions(until(9_999), None, 128)
            .await
            .unwrap()
            .is_empty()
    );
    assert_eq!(
        due(s.due_sessions(until(11_000), None, 128).await.unwrap()),
        ["iad~1", "iad~3"]
    );
    let page = s.due_sessions(until(20_000), None, 1).await.unwrap();
    assert_eq!(due(page.clone()), ["iad~1"]);
    let after = SessionCursor::after(&page[0]);
    let rest = s
        .due_sessions(until(20_000), Some(&after), 128)
        .await
        .unwrap();
    assert_eq!(due(rest), ["iad~3", "iad~2"]);
    // Renewed at 8 s: due at 18 s now.
    let a2 = renewed(&a, 8_000);
    s.compare_and_set_session(Some(1), &a2).await.unwrap();
    assert_eq!(
        due(s.due_sessions(until(15_000), None, 128).await.unwrap()),
        ["iad~3", "iad~2"]
    );
    // Ended by the reaper: due at its end, until it is deleted.
    let ended = c.expire(until(13_000), &LeasePolicy::DEFAULT).unwrap();
    assert!(matches!(ended.state, SessionState::Ended { .. }));
    s.compare_and_set_session(Some(1), &ended).await.unwrap();
    assert_eq!(
        due(s.due_sessions(until(11_000), None, 128).await.unwrap()),
        ["iad~3"]
    );
    assert!(s.delete_session(&c.id, 2).await.unwrap());
    assert_eq!(
        due(s.due_sessions(until(99_000), None, 128).await.unwrap()),
        ["iad~2", "iad~1"]
    );
    assert!(matches!(
        s.due_sessions(until(0), None, 129).await,
        Err(StoreError::BatchTooLarge { .. })
    ));
}

/// dc: a copied session row is written when absent or older, reported
/// present when equal, and never overwrites a newer or different one.
pub async fn dc_import_session_copies_rows_without_overwriting(b: &dyn Backend) {
    let s = b.dc_store("dc_import_session").await;
    let row = opened("iad~1", 0);
    assert_eq!(s.import_session(&row).await.unwrap(), Import::Written);
    assert_eq!(s.import_session(&row).await.unwrap(), Import::Present);
    let newer = renewed(&row, 1_000);
    assert_eq!(s.import_session(&newer).await.unwrap(), Import::Written);
    assert_eq!(
        s.import_session(&row).await.unwrap(),
        Import::Conflict {
            current: newer.clone()
        }
    );
    assert_eq!(s.session(&row.id).await.unwrap(), Some(newer.clone()));
    let due = s.due_sessions(StoreTime::from_ms(11_000), None, 128).await;
    assert_eq!(
        due.unwrap(),
        vec![newer],
        "an imported row is indexed as due"
    );
}

/// dc: every session row, live or ended, pages in the order of its stored
/// name (`iad~10` before `iad~2`), strictly after a cursor, and a deleted
/// row is gone from the pages.
pub async fn dc_sessions_page_every_row_in_name_order(b: &dyn Backend) {
    let s = b.dc_store("dc_sessions_pages").await;
    assert!(s.sessions(None, 128).await.unwrap().is_empty());
    let names = ["iad~1", "iad~10", "iad~2", "iad~3", "lax~1"];
    for name in ["iad~3", "iad~1", "lax~1", "iad~10", "iad~2"] {
        create_session(&s, &opened(name, 0)).await;
    }
    let ended = opened("iad~2", 0)
        .expire(StoreTime::from_ms(60_000), &LeasePolicy::DEFAULT)
        .expect("past its expiry plus grace");
    s.compare_and_set_session(Some(1), &ended).await.unwrap();
    let rows = |rows: Vec<SessionRecord>| -> Vec<String> {
        rows.iter().map(|r| r.id.to_string()).collect()
    };
    let all = s.sessions(None, 128).await.unwrap();
    assert_eq!(rows(all.clone()), names);
    assert_eq!(all[2], ended, "an ended row is listed as stored");
    let first = s.sessions(None, 2).await.unwrap();
    assert_eq!(rows(first.clone()), ["iad~1", "iad~10"]);
    let rest = s.sessions(Some(&first[1].id), 128).await.unwrap();
    assert_eq!(rows(rest), ["iad~2", "iad~3", "lax~1"]);
    // A cursor that names no row pages from where it would be.
    let rest = s.sessions(Some(&sid("iad~20")), 128).await.unwrap();
    assert_eq!(rows(rest), ["iad~3", "lax~1"]);
    assert!(s.delete_session(&sid("iad~2"), 2).await.unwrap());
    let all = s.sessions(None, 128).await.unwrap();
    assert_eq!(rows(all), ["iad~1", "iad~10", "iad~3", "lax~1"]);
    assert!(matches!(
        s.sessions(None, 129).await,
        Err(StoreError::BatchTooLarge { .. })
    ));
}
