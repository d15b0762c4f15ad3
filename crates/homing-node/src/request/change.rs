//! The changes a DC makes to its own records, each one homing-core
//! transition, named: what a host asks (renew, release), what a peer asks
//! (link), what an operator asks (drain), what upkeep does (expire a lapsed
//! lease, abandon a proven orphan). [`Change::apply`] is the one place that
//! picks the transition, so the rules a test breaks on purpose
//! ([`Mutation`]) are broken here for homingd and the simulator alike.

use homing_core::{
    DcId, DcRecord, ErrorKind, ErrorReply, FencingToken, HostTime, Key, LeaseKey, LeasePolicy,
    LinkReply, RecordRead, RecordState, ReleaseCause, ReleaseReply, RenewReply, Reply,
    ReservationId, RunOutcome, Shortcut, StoreTime, Succession, Transition,
};

use homing_core::mutation::{Mutation, Mutations};

/// A change asked of one of this DC's records.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// A host renews its lease.
    Renew {
        /// The holder's token.
        token: FencingToken,
        /// The holder's lease key.
        lease: LeaseKey,
        /// The host's clock when it sent the renewal.
        host_time: HostTime,
    },
    /// A host releases its lease.
    Release {
        /// The holder's token.
        token: FencingToken,
        /// The holder's lease key.
        lease: LeaseKey,
        /// How the run ended.
        outcome: RunOutcome,
    },
    /// An operator releases the lease without its holder. A live key held
    /// under a host session is frozen instead, as a drain freezes it: its
    /// host is told on its session's next renewal and stops it by the
    /// deadlines it held, and the key is vacant by its session's expiry as
    /// it stood plus grace (released outright, the session's renewals would
    /// go on extending its run, its host never told).
    ForceRelease {
        /// The holder's token.
        token: FencingToken,
    },
    /// A host that gave up on its acquire cancels the grant it was made.
    Cancel {
        /// The abandoned acquire's lease key.
        lease: LeaseKey,
    },
    /// A peer links this vacant tail of `key` to its new reservation.
    Link {
        /// The key whose chain the peer walked.
        key: Key,
        /// The new reservation.
        to: ReservationId,
        /// The tail's token as the peer read it.
        expected: FencingToken,
    },
    /// A peer that just linked the key's chain tells its first
    /// reservation (ours) about the new member.
    Shortcut {
        /// The key.
        key: Key,
        /// The new member.
        shortcut: Shortcut,
    },
    /// An operator drains the lease: renewals stop.
    Drain,
    /// Upkeep: a lease past expiry + grace is released as expired.
    Expire,
    /// Upkeep: a proven orphan is abandoned.
    Abandon,
    /// Reconciliation after the DC lease was regained: the global store
    /// names this succession of the record (a takeover, usually).
    Supersede(Succession),
}

/// What a change's caller learns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Changed {
    /// The answer to a renewal.
    Renew(RenewReply),
    /// The answer to a release.
    Release(ReleaseReply),
    /// The answer to a link.
    Link(LinkReply),
    /// The answer to a shortcut notice: whether the record took it.
    Noted(bool),
    /// The answer to a cancel: whether the record was the cancelled grant.
    Cancelled(bool),
    /// Drain, expire, abandon, supersede: whether the record changed (false: nothing to do).
    Done(bool),
}

impl Changed {
    /// The reply a host or a peer gets: `None` for drain and upkeep changes.
    pub fn into_reply(self) -> Option<Reply> {
        match self {
            Changed::Renew(r) => Some(Reply::Renew(r)),
            Changed::Release(r) => Some(Reply::Release(r)),
            Changed::Link(r) => Some(Reply::Link(r)),
            Changed::Noted(noted) => Some(Reply::Noted(noted)),
            Changed::Cancelled(found) => Some(Reply::Cancelled(found)),
            Changed::Done(_) => None,
        }
    }

    /// Whether a drain, upkeep or shortcut change changed the record.
    pub fn made(&self) -> bool {
        matches!(
            self,
            Changed::Done(true) | Changed::Noted(true) | Changed::Cancelled(true)
        )
    }
}

impl Change {
    /// The link a peer of DC `caller` asks for: `from → to`, `expected`
    /// being the tail's token as it read it. A node may only continue a
    /// chain with its own reservations: `to` must be the caller's; and a
    /// reservation never links to itself (a lying peer's request is refused,
    /// never applied).
    pub fn link(
        caller: Option<&DcId>,
        key: Key,
        from: &ReservationId,
        to: ReservationId,
        expected: FencingToken,
    ) -> Result<Change, ErrorReply> {
        if &to == from {
            return Err(ErrorReply::new(
                ErrorKind::BadRequest,
                format!("{from} cannot link to itself"),
            ));
        }
        if caller != Some(to.dc()) {
            let who = caller.map_or_else(
                || "a caller without a dc".to_string(),
                |dc| format!("dc {dc}"),
            );
            return Err(ErrorReply::new(
                ErrorKind::Unauthorized,
                format!("{who} may not link to {to}, a reservation of another dc"),
            ));
        }
        Ok(Change::Link { key, to, expected })
    }

    /// The transition this change makes of the record read at `now`.
    pub fn apply(
        &self,
        read: &RecordRead,
        now: StoreTime,
        policy: &LeasePolicy,
        mutations: Mutations,
    ) -> Transition<Changed> {
        let (record, session) = (&read.record, read.session());
        let done = |next: Option<DcRecord>| Transition {
            reply: Changed::Done(next.is_some()),
            next,
        };
        match self {
            Change::Renew {
                token,
                lease,
                host_time,
            } => {
                let t = record.renew(*token, lease, *host_time, now, policy);
                Transition {
                    next: t.next,
                    reply: Changed::Renew(t.reply),
                }
            }
            Change::Release {
                token,
                lease,
                outcome,
            } => {
                let outcome = if mutations.has(Mutation::ReleaseForgetsOutcome) {
                    RunOutcome::Ok
                } else {
                    outcome.clone()
                };
                let t = record.release(*token, lease, outcome, now);
                Transition {
                    next: t.next,
                    reply: Changed::Release(t.reply),
                }
            }
            Change::ForceRelease { token }
                if *token == record.token
                    && record.session().is_some()
                    && record.live_actor(now, policy, session).is_some() =>
            {
                Transition {
                    next: record.drain(session),
                    reply: Changed::Release(ReleaseReply::Released),
                }
            }
            Change::ForceRelease { token } => {
                let t = record.force_release(*token, now);
                Transition {
                    next: t.next,
                    reply: Changed::Release(t.reply),
                }
            }
            Change::Cancel { lease } => {
                let next = record.cancel(lease, now);
                Transition {
                    reply: Changed::Cancelled(next.is_some()),
                    next,
                }
            }
            Change::Link { key, to, expected } => {
                let t = if mutations.has(Mutation::LinkIgnoresLiveness) {
                    link_ignoring_liveness(record, to)
                } else if mutations.has(Mutation::LinkIgnoresToken) {
                    record.link(key, to, record.token, now, policy, session)
                } else {
                    record.link(key, to, *expected, now, policy, session)
                };
                Transition {
                    next: t.next,
                    reply: Changed::Link(t.reply),
                }
            }
            Change::Shortcut { key, shortcut } => {
                let next = record.note_shortcut(key, shortcut);
                Transition {
                    reply: Changed::Noted(next.is_some()),
                    next,
                }
            }
            Change::Drain => done(record.drain(session)),
            Change::Expire => done(expire(read, now, policy, mutations)),
            Change::Abandon => done(record.abandon()),
            Change::Supersede(succession) => done(record.supersede(succession)),
        }
    }
}

/// The expiry rule, as the reaper and waiters apply it.
pub fn expire(
    read: &RecordRead,
    now: StoreTime,
    policy: &LeasePolicy,
    mutations: Mutations,
) -> Option<DcRecord> {
    let record = &read.record;
    if mutations.has(Mutation::ExpiryNeverComes) {
        return None;
    }
    if mutations.has(Mutation::ReaperIgnoresExpiry) {
        let RecordState::Active { .. } = record.state else {
            return None;
        };
        let mut next = record.clone();
        next.state = RecordState::Released {
            at: now,
            cause: ReleaseCause::Expired,
        };
        next.version += 1;
        return Some(next);
    }
    record.expire(now, policy, read.session())
}

/// [`Mutation::LinkIgnoresLiveness`]: links whatever it is asked to link.
fn link_ignoring_liveness(record: &DcRecord, to: &ReservationId) -> Transition<LinkReply> {
    if let RecordState::Linked { to: existing } = &record.state {
        let reply = if existing == to {
            LinkReply::Linked
        } else {
            LinkReply::AlreadyLinked(existing.clone())
        };
        return Transition { next: None, reply };
    }
    let mut next = record.clone();
    next.state = RecordState::Linked { to: to.clone() };
    next.version += 1;
    Transition {
        next: Some(next),
        reply: LinkReply::Linked,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> Key {
        Key::new(homing_core::KeyName::new("room").unwrap())
    }

    #[test]
    fn change_a_node_may_link_only_to_its_own_reservation() {
        let iad: DcId = "iad".parse().unwrap();
        let to: ReservationId = "iad.7".parse().unwrap();
        let from: ReservationId = "fra.3".parse().unwrap();
        let link = |caller, to| Change::link(caller, key(), &from, to, FencingToken::FIRST);
        assert!(link(Some(&iad), to.clone()).is_ok());
        let fra: DcId = "fra".parse().unwrap();
        let e = link(Some(&fra), to.clone()).unwrap_err();
        assert_eq!(e.kind, ErrorKind::Unauthorized);
        assert!(link(None, to).is_err());
    }

    /// `DcRecord::link` asserts a reservation never links to itself: a
    /// peer's request to do so must be refused before it gets there.
    #[test]
    fn change_a_link_to_itself_is_refused() {
        let iad: DcId = "iad".parse().unwrap();
        let own: ReservationId = "iad.7".parse().unwrap();
        let e =
            Change::link(Some(&iad), key(), &own, own.clone(), FencingToken::FIRST).unwrap_err();
        assert_eq!(e.kind, ErrorKind::BadRequest);
    }
}
