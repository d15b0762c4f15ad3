//! The values fixtures are made of, fixed forever once a version's files
//! exist: every optional field is `Some` in at least one of them, and
//! numbers are large enough to take several varint bytes.

use homing_core::record::FailureReason;
use homing_core::{
    ActorId, DcRecord, Directory, Event, EventKind, Expiry, FencingToken, Key, KeyName, LeaseKey,
    Namespace, PreviousRun, RecordState, ReleaseCause, ReservationId, RunOutcome, SessionEnd,
    SessionId, SessionRecord, SessionState, Shortcut, StoreTime, Tag,
};

/// A reservation ID from its text (`iad.42`).
pub fn id(text: &str) -> ReservationId {
    text.parse().expect("sample reservation ids are valid")
}

/// A directory of two DCs, one served by two homingd (IPv4 and IPv6).
pub fn directory() -> Directory {
    let v4 = "10.1.0.7:4433".parse().expect("valid address");
    let v6 = "[2001:db8::7]:4433".parse().expect("valid address");
    let sin = "192.0.2.1:4433".parse().expect("valid address");
    Directory::default()
        .with(&"iad".parse().expect("valid dc"), v4)
        .and_then(|d| d.with(&"iad".parse().expect("valid dc"), v6))
        .and_then(|d| d.with(&"sin".parse().expect("valid dc"), sin))
        .expect("within bounds")
}

/// A key in a nested namespace.
pub fn key() -> Key {
    Key::in_namespace(
        Namespace::new("games/eu").expect("valid namespace"),
        KeyName::new("room-42").expect("valid key name"),
    )
}

/// A key in the default namespace.
pub fn plain_key() -> Key {
    Key::new(KeyName::new("lobby").expect("valid key name"))
}

/// The tag of [`key`].
pub fn tag() -> Tag {
    Tag::new("chat").expect("valid tag")
}

/// An actor.
pub fn actor() -> ActorId {
    ActorId::new("10.0.0.7:8080").expect("valid actor id")
}

/// A lease key whose 16 bytes count up from 1.
pub fn lease_key() -> LeaseKey {
    let bytes = std::array::from_fn(|i| i as u8 + 1);
    LeaseKey::from_bytes(bytes).expect("not all zeros")
}

/// A run that failed.
pub fn failed() -> RunOutcome {
    RunOutcome::Failed {
        reason: FailureReason::new("out of memory").expect("valid reason"),
    }
}

/// A store time (ms since the epoch, 2023-11-14).
pub fn at() -> StoreTime {
    StoreTime::from_ms(1_700_000_000_000)
}

/// A shortcut to a later member of the chain.
pub fn shortcut() -> Shortcut {
    Shortcut {
        to: id("fra.9000"),
        token: FencingToken::new(12),
    }
}

/// One record per [`RecordState`] variant, named; the active one has every
/// optional field set.
pub fn records() -> Vec<(&'static str, DcRecord)> {
    let record = |unique: u64, state: RecordState| DcRecord {
        id: ReservationId::new("iad".parse().expect("valid dc"), unique),
        key: key(),
        tag: Some(tag()),
        token: FencingToken::new(7),
        allow_renew: true,
        predecessor: Some(id("fra.3")),
        state,
        shortcut: Some(Box::new(shortcut())),
        version: 300,
    };
    let active = RecordState::Active {
        actor: actor(),
        expiry: Expiry::At(at()),
        lease: Some(lease_key()),
        previous: Some(Box::new(PreviousRun {
            reservation: id("iad.41"),
            token: FencingToken::new(6),
            ended: ReleaseCause::Released(failed()),
        })),
    };
    let in_session = |expiry| match active.clone() {
        RecordState::Active {
            actor,
            lease,
            previous,
            ..
        } => RecordState::Active {
            actor,
            expiry,
            lease,
            previous,
        },
        _ => unreachable!("built active above"),
    };
    let session_key = in_session(Expiry::Session(session_id()));
    let frozen = in_session(Expiry::Frozen {
        session: session_id(),
        at: at(),
        notice: 13,
    });
    let released = RecordState::Released {
        at: at(),
        cause: ReleaseCause::Expired,
    };
    let mut abandoned = record(45, RecordState::Abandoned);
    abandoned.tag = None;
    abandoned.predecessor = None;
    abandoned.shortcut = None;
    abandoned.allow_renew = false;
    vec![
        ("active", record(42, active)),
        ("released", record(43, released)),
        (
            "linked",
            record(44, RecordState::Linked { to: id("fra.9000") }),
        ),
        ("abandoned", abandoned),
        ("active-in-session", record(46, session_key)),
        ("active-frozen", record(47, frozen)),
    ]
}

/// The session of the session samples.
pub fn session_id() -> SessionId {
    "iad~40".parse().expect("a valid session id")
}

/// One session row per state, named.
pub fn sessions() -> Vec<(&'static str, SessionRecord)> {
    let row = |state| SessionRecord {
        id: session_id(),
        secret: lease_key(),
        state,
        notice_seq: 12,
        version: 90,
    };
    vec![
        ("live", row(SessionState::Live { expires_at: at() })),
        (
            "ended-closed",
            row(SessionState::Ended {
                until: at(),
                cause: SessionEnd::Closed,
            }),
        ),
        (
            "ended-expired",
            row(SessionState::Ended {
                until: at(),
                cause: SessionEnd::Expired,
            }),
        ),
    ]
}

/// One event per [`EventKind`] variant, named.
pub fn events() -> Vec<(&'static str, Event)> {
    let kinds = [
        (
            "reserved",
            EventKind::Reserved {
                actor: actor(),
                tag: Some(tag()),
                predecessor: Some(id("fra.3")),
            },
        ),
        (
            "released",
            EventKind::Released {
                at: at(),
                outcome: failed(),
            },
        ),
        ("expired", EventKind::Expired { at: at() }),
        ("linked", EventKind::Linked { to: id("fra.9000") }),
        ("drained", EventKind::Drained),
        ("abandoned", EventKind::Abandoned),
        ("force-released", EventKind::ForceReleased { at: at() }),
        ("cancelled", EventKind::Cancelled { at: at() }),
    ];
    kinds
        .into_iter()
        .zip(1_000u64..)
        .map(|((name, kind), seq)| {
            let event = Event {
                seq,
                reservation: id("iad.42"),
                key: key(),
                token: FencingToken::new(7),
                kind,
            };
            (name, event)
        })
        .collect()
}
