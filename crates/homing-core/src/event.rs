//! Lifecycle events: the ordered history of one DC's records. Every event is
//! derived from a record change by [`derive`], and a DC store appends it in
//! the same transaction as the change itself, so the log is exactly as
//! durable as the records: a daemon that crashes loses no event, and a
//! consumer resuming from its last [`EventSeq`] misses none (within the
//! DC's retention).
//!
//! Renewals produce no event: they are the steady state, not a change of holder.

use serde::{Deserialize, Serialize};

use crate::actor::ActorId;
use crate::fencing::FencingToken;
use crate::key::{Key, Tag};
use crate::record::{DcRecord, RecordState, ReleaseCause, RunOutcome};
use crate::reservation::ReservationId;
use crate::time::StoreTime;

/// An event's position in its DC's log: 1 for the first, +1 for each next.
/// `0` as a cursor means "from the beginning".
pub type EventSeq = u64;

/// One change of one record, as a watcher sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Event {
    /// Its position in the DC's log.
    pub seq: EventSeq,
    /// The record that changed (owned by the DC whose log this is).
    pub reservation: ReservationId,
    /// Its key.
    pub key: Key,
    /// The record's token after the change.
    pub token: FencingToken,
    /// What happened.
    pub kind: EventKind,
}

/// What happened to a record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum EventKind {
    /// A holder took the reservation: a new reservation, or a re-activation
    /// (the token moved).
    Reserved {
        /// The actor it runs.
        actor: ActorId,
        /// Its tag.
        tag: Option<Tag>,
        /// The reservation this one continues, for a new one that recreates a key.
        predecessor: Option<ReservationId>,
    },
    /// The holder released it.
    Released {
        /// When, in the DC store's time.
        at: StoreTime,
        /// How the run ended.
        outcome: RunOutcome,
    },
    /// The lease ran out and the reaper released it after the grace period.
    Expired {
        /// When, in the DC store's time.
        at: StoreTime,
    },
    /// The reservation now continues as `to` in another DC.
    Linked {
        /// The next reservation.
        to: ReservationId,
    },
    /// An operator drained the key: renewals are refused from now on.
    Drained,
    /// The reservation lost a race and is no part of the key's chain.
    Abandoned,
    /// An operator released the lease without its holder (`ForceRelease`).
    ForceReleased {
        /// When, in the DC store's time.
        at: StoreTime,
    },
    /// The host gave up on its acquire and cancelled the grant: no actor ran.
    Cancelled {
        /// When, in the DC store's time.
        at: StoreTime,
    },
}

impl EventKind {
    /// What else there is to say about it, in words, for `homing watch` and
    /// the status page: the actor and what it continues, a run's outcome,
    /// the successor (empty when its name says it all).
    pub fn detail(&self) -> String {
        match self {
            EventKind::Reserved {
                actor, predecessor, ..
            } => match predecessor {
                Some(p) => format!("actor {actor}, continues {p}"),
                None => format!("actor {actor}"),
            },
            EventKind::Released {
                outcome: RunOutcome::Ok,
                ..
            } => "outcome ok".to_string(),
            EventKind::Released {
                outcome: RunOutcome::Failed { reason },
                ..
            } => format!("outcome failed: {reason}"),
            EventKind::Expired { .. } => "lease lapsed past grace".to_string(),
            EventKind::Linked { to } => format!("continues as {to}"),
            EventKind::ForceReleased { .. } => "by an operator, without its holder".to_string(),
            EventKind::Cancelled { .. } => "its host gave up on the acquire".to_string(),
            EventKind::Drained | EventKind::Abandoned => String::new(),
        }
    }

    /// A short name, for logs and the CLI.
    pub fn name(&self) -> &'static str {
        match self {
            EventKind::Reserved { .. } => "reserved",
            EventKind::Released { .. } => "released",
            EventKind::Expired { .. } => "expired",
            EventKind::Linked { .. } => "linked",
            EventKind::Drained => "drained",
            EventKind::Abandoned => "abandoned",
            EventKind::ForceReleased { .. } => "force_released",
            EventKind::Cancelled { .. } => "cancelled",
        }
    }
}

/// The event a change from `before` (`None`: a new record) to `after`
/// produces, if any. Stores call this inside the transaction that writes
/// `after`, with the record they read in it.
pub fn derive(before: Option<&DcRecord>, after: &DcRecord) -> Option<Event> {
    let kind = match (&after.state, before) {
        (RecordState::Active { actor, .. }, b) if b.is_none_or(|b| b.token != after.token) => {
            EventKind::Reserved {
                actor: actor.clone(),
                tag: after.tag.clone(),
                predecessor: after.predecessor.clone(),
            }
        }
        (RecordState::Active { .. }, Some(b)) if b.allow_renew && !after.allow_renew => {
            EventKind::Drained
        }
        (RecordState::Released { at, cause }, b)
            if b.is_none_or(|b| !matches!(b.state, RecordState::Released { .. })) =>
        {
            match cause {
                ReleaseCause::Released(outcome) => EventKind::Released {
                    at: *at,
                    outcome: outcome.clone(),
                },
                ReleaseCause::Expired => EventKind::Expired { at: *at },
                ReleaseCause::Forced => EventKind::ForceReleased { at: *at },
                ReleaseCause::Cancelled => EventKind::Cancelled { at: *at },
            }
        }
        (RecordState::Linked { to }, b)
            if b.is_none_or(|b| !matches!(b.state, RecordState::Linked { .. })) =>
        {
            EventKind::Linked { to: to.clone() }
        }
        (RecordState::Abandoned, b) if b.is_none_or(|b| b.state != RecordState::Abandoned) => {
            EventKind::Abandoned
        }
        _ => return None,
    };
    Some(Event {
        seq: 0,
        reservation: after.id.clone(),
        key: after.key.clone(),
        token: after.token,
        kind,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::key::KeyName;
    use crate::lease::LeasePolicy;
    use crate::record::FailureReason;
    use crate::time::HostTime;

    const POLICY: LeasePolicy = LeasePolicy::DEFAULT;

    fn t(ms: u64) -> StoreTime {
        StoreTime::from_ms(ms)
    }

    fn lease() -> crate::LeaseKey {
        crate::LeaseKey::from_bytes([1; 16]).unwrap()
    }

    fn fresh() -> DcRecord {
        DcRecord::reserve(
            "iad.1".parse().unwrap(),
            Key::new(KeyName::new("room").unwrap()),
            None,
            FencingToken::FIRST,
            None,
            &crate::Holding {
                actor: ActorId::new("a1").unwrap(),
                lease: lease(),
                host_time: HostTime::from_ms(0),
                session: None,
            },
            t(0),
            &POLICY,
        )
        .0
    }

    fn kind(before: Option<&DcRecord>, after: &DcRecord) -> Option<EventKind> {
        derive(before, after).map(|e| e.kind)
    }

    #[test]
    fn every_change_of_holder_is_an_event_and_renewals_are_not() {
        let r = fresh();
        assert!(matches!(kind(None, &r), Some(EventKind::Reserved { .. })));
        let renewed = r
            .renew(
                FencingToken::FIRST,
                &lease(),
                HostTime::from_ms(1),
                t(1),
                &POLICY,
            )
            .next
            .unwrap();
        assert_eq!(kind(Some(&r), &renewed), None);
        let drained = renewed.drain(None).unwrap();
        assert_eq!(kind(Some(&renewed), &drained), Some(EventKind::Drained));
        let reason = FailureReason::new("boom").unwrap();
        let failed = RunOutcome::Failed { reason };
        let released = drained
            .release(FencingToken::FIRST, &lease(), failed.clone(), t(2))
            .next
            .unwrap();
        assert_eq!(
            kind(Some(&drained), &released),
            Some(EventKind::Released {
                at: t(2),
                outcome: failed
            })
        );
        let again = released
            .activate(
                None,
                &crate::Holding {
                    actor: ActorId::new("a2").unwrap(),
                    lease: lease(),
                    host_time: HostTime::from_ms(3),
                    session: None,
                },
                t(3),
                &POLICY,
                None,
            )
            .next
            .unwrap();
        let event = derive(Some(&released), &again).unwrap();
        assert_eq!(event.token, FencingToken::new(2));
        assert!(matches!(event.kind, EventKind::Reserved { .. }));
        let expired = again.expire(t(100_000), &POLICY, None).unwrap();
        assert_eq!(
            kind(Some(&again), &expired),
            Some(EventKind::Expired { at: t(100_000) })
        );
        let to: ReservationId = "fra.2".parse().unwrap();
        let linked = expired
            .link(
                &expired.key,
                &to,
                FencingToken::new(2),
                t(100_001),
                &POLICY,
                None,
            )
            .next
            .unwrap();
        assert_eq!(
            kind(Some(&expired), &linked),
            Some(EventKind::Linked { to })
        );
        assert_eq!(
            kind(Some(&r), &r.abandon().unwrap()),
            Some(EventKind::Abandoned)
        );
    }
}
