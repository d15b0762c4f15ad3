//! What a DC's lifecycle event log must hold, checked against what a
//! workload was told: a [`Ledger`] records every acknowledged write that
//! changes a key's holder (acquire, release, the link a recreate-elsewhere
//! made) and every key whose last write's fate is unknown (in flight when a
//! daemon died); [`Ledger::check`] then matches one DC's log against it.
//!
//! The rules: sequence numbers are consecutive (no gap, no duplicate); every
//! event is of a record the DC owns; every acknowledged change has exactly
//! one event with its kind, reservation, token and outcome; and every other
//! event belongs to a key whose write was in flight.

use homing_core::{AcquireReply, Grant};
use std::collections::BTreeSet;

use homing_core::{
    ActorId, DcId, Event, EventKind, FencingToken, Key, Reply, ReservationId, RunOutcome,
};

/// One acknowledged change of holder and the event it must have appended to
/// the log of the DC owning `reservation`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ack {
    /// The key.
    pub key: Key,
    /// The record that changed.
    pub reservation: ReservationId,
    /// Its token after the change.
    pub token: FencingToken,
    /// The change.
    pub change: Change,
}

/// A change of holder, as the event must describe it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// An acquire took the reservation (new, or re-activated).
    Reserved {
        /// The actor acquired for.
        actor: ActorId,
        /// The reservation it continues; `None` when not known to the ledger
        /// (a re-activation of a reservation whose creation was in flight).
        predecessor: Option<Option<ReservationId>>,
    },
    /// The holder released it.
    Released(RunOutcome),
    /// A recreate elsewhere continued it as `to`.
    Linked {
        /// The new reservation.
        to: ReservationId,
    },
}

impl Ack {
    /// Whether `event` is this change's event.
    pub fn matches(&self, event: &Event) -> bool {
        if (&event.reservation, event.token, &event.key)
            != (&self.reservation, self.token, &self.key)
        {
            return false;
        }
        match (&self.change, &event.kind) {
            (
                Change::Reserved { actor, predecessor },
                EventKind::Reserved {
                    actor: got,
                    predecessor: got_predecessor,
                    ..
                },
            ) => actor == got && predecessor.as_ref().is_none_or(|p| p == got_predecessor),
            (Change::Released(outcome), EventKind::Released { outcome: got, .. }) => outcome == got,
            (Change::Linked { to }, EventKind::Linked { to: got }) => to == got,
            _ => false,
        }
    }
}

/// The acknowledged changes of a workload and its writes of unknown fate.
#[derive(Debug, Clone, Default)]
pub struct Ledger {
    acks: Vec<Ack>,
    in_flight: BTreeSet<Key>,
}

impl Ledger {
    /// An empty ledger.
    pub fn new() -> Ledger {
        Ledger::default()
    }

    /// Records an `Acquire` of `key` for `actor` answered with `reply`: an
    /// `Acquired` is a `Reserved` change and, when it continues a reservation
    /// of another record, that record's `Linked` change. Other replies change
    /// nothing.
    pub fn acquired(&mut self, key: &Key, actor: &ActorId, reply: &Reply) {
        let Reply::Acquire(AcquireReply::Acquired(Grant {
            reservation,
            token,
            previous,
            ..
        })) = reply
        else {
            return;
        };
        let predecessor = match previous {
            None => Some(None),
            Some(p) if &p.reservation != reservation => {
                self.acks.push(Ack {
                    key: key.clone(),
                    reservation: p.reservation.clone(),
                    token: p.token,
                    change: Change::Linked {
                        to: reservation.clone(),
                    },
                });
                Some(Some(p.reservation.clone()))
            }
            // A re-activation keeps the predecessor the record was created with.
            Some(_) => self.acks.iter().find_map(|a| match &a.change {
                Change::Reserved { predecessor, .. } if &a.reservation == reservation => {
                    predecessor.clone()
                }
                _ => None,
            }),
        };
        self.acks.push(Ack {
            key: key.clone(),
            reservation: reservation.clone(),
            token: *token,
            change: Change::Reserved {
                actor: actor.clone(),
                predecessor,
            },
        });
    }

    /// Records an acknowledged release of `reservation` at `token` with `outcome`.
    pub fn released(
        &mut self,
        key: &Key,
        reservation: &ReservationId,
        token: FencingToken,
        outcome: RunOutcome,
    ) {
        self.acks.push(Ack {
            key: key.clone(),
            reservation: reservation.clone(),
            token,
            change: Change::Released(outcome),
        });
    }

    /// Records that a write of `key` got no answer: any event of the key may
    /// or may not be there.
    pub fn in_flight(&mut self, key: &Key) {
        self.in_flight.insert(key.clone());
    }

    /// Merges another workload's ledger into this one.
    pub fn extend(&mut self, other: Ledger) {
        self.acks.extend(other.acks);
        self.in_flight.extend(other.in_flight);
    }

    /// Every acknowledged change.
    pub fn acks(&self) -> &[Ack] {
        &self.acks
    }

    /// The keys whose last write's fate is unknown.
    pub fn keys_in_flight(&self) -> &BTreeSet<Key> {
        &self.in_flight
    }

    /// The last acknowledged change whose event is in `dc`'s log.
    pub fn last_of(&self, dc: &DcId) -> Option<&Ack> {
        self.acks.iter().rev().find(|a| a.reservation.dc() == dc)
    }

    /// Checks `events`, `dc`'s whole log as watched from cursor 0 in every
    /// namespace, against the ledger. Returns every rule broken, one per line.
    pub fn check(&self, dc: &DcId, events: &[Event]) -> Result<(), String> {
        let mut broken = Vec::new();
        if let Some(first) = events.first()
            && first.seq != 1
        {
            broken.push(format!("the log starts at seq {}, not 1", first.seq));
        }
        for pair in events.windows(2) {
            if pair[1].seq != pair[0].seq + 1 {
                broken.push(format!("seq {} follows seq {}", pair[1].seq, pair[0].seq));
            }
        }
        for event in events {
            if event.reservation.dc() != dc {
                broken.push(format!("dc {dc}'s log holds another dc's event {event:?}"));
            }
        }
        for ack in self.acks.iter().filter(|a| a.reservation.dc() == dc) {
            let found: Vec<_> = events
                .iter()
                .filter(|e| ack.matches(e))
                .map(|e| e.seq)
                .collect();
            if found.len() != 1 {
                broken.push(format!(
                    "acknowledged {ack:?} has {} events (seqs {found:?})",
                    found.len()
                ));
            }
        }
        for event in events {
            let acknowledged = self.acks.iter().any(|a| a.matches(event));
            if !acknowledged && !self.in_flight.contains(&event.key) {
                broken.push(format!("event of no acknowledged write: {event:?}"));
            }
        }
        if broken.is_empty() {
            Ok(())
        } else {
            Err(broken.join("\n"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use homing_core::{
        Deadlines, FailureReason, HostTime, KeyName, PreviousRun, ReleaseCause, StoreTime,
    };

    fn id(s: &str) -> ReservationId {
        s.parse().unwrap()
    }

    fn acquired(reservation: &str, token: u64, previous: Option<PreviousRun>) -> Reply {
        let at = HostTime::from_ms(0);
        Reply::Acquire(AcquireReply::Acquired(Grant {
            key: key(),
            reservation: id(reservation),
            token: FencingToken::new(token),
            deadlines: Deadlines {
                renew_at: at,
                soft_terminate_at: at,
                hard_terminate_at: at,
            },
            previous,
        }))
    }

    fn key() -> Key {
        Key::new(KeyName::new("k").unwrap())
    }

    fn event(seq: u64, reservation: &str, token: u64, kind: EventKind) -> Event {
        Event {
            seq,
            reservation: id(reservation),
            key: key(),
            token: FencingToken::new(token),
            kind,
        }
    }

    fn reserved(actor: &ActorId, predecessor: Option<&str>) -> EventKind {
        EventKind::Reserved {
            actor: actor.clone(),
            tag: None,
            predecessor: predecessor.map(id),
        }
    }

    #[test]
    fn a_log_is_accepted_only_with_each_acknowledged_change_exactly_once_and_no_gap() {
        let actor = ActorId::new("a").unwrap();
        let failed = RunOutcome::Failed {
            reason: FailureReason::new("boom").unwrap(),
        };
        let mut ledger = Ledger::new();
        ledger.acquired(&key(), &actor, &acquired("iad.1", 1, None));
        ledger.released(&key(), &id("iad.1"), FencingToken::new(1), failed.clone());
        let previous = PreviousRun {
            reservation: id("iad.1"),
            token: FencingToken::new(1),
            ended: ReleaseCause::Released(failed.clone()),
        };
        ledger.acquired(&key(), &actor, &acquired("fra.1", 2, Some(previous)));
        let released = EventKind::Released {
            at: StoreTime::from_ms(5),
            outcome: failed,
        };
        let linked = EventKind::Linked { to: id("fra.1") };
        let log = vec![
            event(1, "iad.1", 1, reserved(&actor, None)),
            event(2, "iad.1", 1, released.clone()),
            event(3, "iad.1", 1, linked.clone()),
        ];
        let iad = DcId::new("iad").unwrap();
        assert_eq!(ledger.check(&iad, &log), Ok(()));
        let fra = [event(1, "fra.1", 2, reserved(&actor, Some("iad.1")))];
        assert_eq!(ledger.check(&DcId::new("fra").unwrap(), &fra), Ok(()));

        let gap = [log[0].clone(), event(3, "iad.1", 1, released.clone())];
        assert!(
            ledger.check(&iad, &gap).is_err(),
            "a gap and a missing link"
        );
        let mut twice = log.clone();
        twice.push(event(4, "iad.1", 1, linked));
        assert!(ledger.check(&iad, &twice).is_err(), "a duplicate");
        let ok = EventKind::Released {
            at: StoreTime::from_ms(5),
            outcome: RunOutcome::Ok,
        };
        let wrong = [log[0].clone(), event(2, "iad.1", 1, ok), log[2].clone()];
        assert!(ledger.check(&iad, &wrong).is_err(), "the wrong outcome");
        let mut foreign = log.clone();
        foreign.push(event(4, "fra.1", 2, reserved(&actor, Some("iad.1"))));
        assert!(ledger.check(&iad, &foreign).is_err(), "another dc's event");
        ledger.in_flight(&key());
        let mut unknown = log;
        unknown.push(event(4, "iad.1", 1, EventKind::Abandoned));
        assert_eq!(ledger.check(&iad, &unknown), Ok(()), "a write in flight");
    }
}
