//! Records the unit tests start from (tests only).

use homing_core::{
    ActorId, DcRecord, FencingToken, HostTime, Key, KeyName, LeaseKey, LeasePolicy, ReservationId,
    SessionId, SessionRecord, StoreTime,
};

use crate::step::Now;
use crate::step::time::NodeTime;

/// The lease policy of every fixture.
pub(crate) const POLICY: LeasePolicy = LeasePolicy::DEFAULT;

/// Both clocks, early in a run.
pub(crate) const NOW: Now = Now {
    node: NodeTime::from_us(1_000),
    store: StoreTime::from_ms(1),
};

/// Reservation `s` (`dc.unique`).
pub(crate) fn id(s: &str) -> ReservationId {
    s.parse().unwrap()
}

/// Key `a`, the key of [`held`]'s records named `a`.
pub(crate) fn key() -> Key {
    Key::new(KeyName::new("a").unwrap())
}

/// Reservation `id` of key `name`, first token, held by actor `a` since
/// `granted` (store clock), continuing `predecessor` if given.
pub(crate) fn held(
    id: &str,
    name: &str,
    predecessor: Option<&str>,
    granted: StoreTime,
) -> DcRecord {
    DcRecord::reserve(
        id.parse::<ReservationId>().unwrap(),
        Key::new(KeyName::new(name).unwrap()),
        None,
        FencingToken::FIRST,
        (predecessor.map(|p| p.parse().unwrap())).map(|reservation| homing_core::PreviousRun {
            reservation,
            token: homing_core::FencingToken::FIRST,
            ended: homing_core::ReleaseCause::Expired,
        }),
        &homing_core::Holding {
            actor: ActorId::new("a").unwrap(),
            lease: homing_core::LeaseKey::from_bytes([1; 16]).unwrap(),
            host_time: HostTime::from_ms(0),
            session: None,
        },
        granted,
        &POLICY,
    )
    .0
}

/// The secret of [`session`], also the lease key of its keys.
pub(crate) fn secret() -> LeaseKey {
    LeaseKey::from_bytes([7; 16]).unwrap()
}

/// Host session iad~3, opened at [`NOW`], as the store holds it (version 5).
pub(crate) fn session() -> SessionRecord {
    let id = SessionId::new("iad".parse().unwrap(), 3);
    let (mut row, _) = SessionRecord::open(id, secret(), HostTime::from_ms(0), NOW.store, &POLICY);
    row.version = 5;
    row
}

/// Reservation `iad.<unique>` of key `k<unique>`, granted at [`NOW`] under
/// session `row`.
pub(crate) fn held_in_session(row: &SessionRecord, unique: u64) -> DcRecord {
    DcRecord::reserve(
        ReservationId::new("iad".parse().unwrap(), unique),
        Key::new(KeyName::new(format!("k{unique}")).unwrap()),
        None,
        FencingToken::FIRST,
        None,
        &homing_core::Holding {
            actor: ActorId::new("a").unwrap(),
            lease: secret(),
            host_time: HostTime::from_ms(0),
            session: Some(Box::new(row.clone())),
        },
        NOW.store,
        &POLICY,
    )
    .0
}
