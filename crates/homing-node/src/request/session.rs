//! A host session's own requests at its DC — open, renew, close, and the
//! page of its keys a host resyncs from — as one sans-IO stepper. The
//! session row is changed by compare-and-set like a record ([`crate::Update`]):
//! read it, judge it (homing-core's [`SessionRecord`]), write it over the
//! version read, read again on a conflict.
//!
//! ```text
//! OpenSession ─► Cover ─► Allocate ─► WriteSession(create) ─► Done(SessionOpened)
//! RenewSession ─► Cover ─► ReadSession ─ refused ─► Done(Expired | NotHolder)
//!                                     └ renewed ─► WriteSession ─ conflict ─► ReadSession again
//!                                                     └ landed ─► SessionNotices(after ack) ─► Done(Renewed)
//! CloseSession ─► ReadSession ─ not live / another secret ─► Done(false)
//!                            └ WriteSession ─ conflict ─► ReadSession again
//!                                  └ landed ─► Done(true)
//! SessionKeys ─► ReadSession ─ not live / another secret ─► Done(SessionEnded)
//!                           └ SessionKeys page ─► Done(keys)
//! ```
//!
//! A renewal reads the notices after its write landed: a freeze writes the
//! session row with the frozen key (the store's guard), so it either landed
//! before the renewal's read — its notice is listed — or after the
//! renewal's write, when it froze the key at the renewed expiry. Either
//! way the host's deadlines from this answer never outlive a frozen key.
//! Open and renew pass the DC lease's cover first, as a per-key renewal
//! does: a DC whose lease lapsed extends nothing.

use homing_core::session::{SESSION_KEYS_PAGE, SESSION_NOTICES_PAGE};
use homing_core::{
    DcId, DcRecord, Deadlines, ErrorKind, ErrorReply, Expiry, HostTime, LeaseKey, LeasePolicy,
    RecordState, Reply, ReservationId, SessionId, SessionKey, SessionNotice, SessionRecord,
    SessionRenewReply, StoreTime, Written,
};

use crate::request::update::CAS_ATTEMPTS_MAX;
use crate::step::effect::{StoreOp, Stored};
use crate::step::failure::Failure;
use crate::step::time::NodeTime;
use crate::step::{Answer, Effect, Now, Step, Stepper};

/// What the host asked of its session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SessionAsk {
    /// Open a new one.
    Open {
        /// Its secret.
        secret: LeaseKey,
        /// The host's clock when it sent this.
        host_time: HostTime,
    },
    /// Renew it, acknowledging notices up to `ack`.
    Renew {
        /// The session.
        session: SessionId,
        /// Its secret.
        secret: LeaseKey,
        /// The host's clock when it sent this.
        host_time: HostTime,
        /// The highest notice number acted on.
        ack: u64,
    },
    /// Close it.
    Close {
        /// The session.
        session: SessionId,
        /// Its secret.
        secret: LeaseKey,
    },
    /// A page of its keys after `after`.
    Keys {
        /// The session.
        session: SessionId,
        /// Its secret.
        secret: LeaseKey,
        /// Start after this reservation.
        after: Option<ReservationId>,
    },
}

#[derive(Debug)]
enum Phase {
    Cover,
    Allocate,
    Read,
    Write {
        expected: Option<u64>,
        row: Box<SessionRecord>,
        /// The renewal's new deadlines (a renew), or the first (an open).
        deadlines: Option<Deadlines>,
    },
    Notices(Deadlines),
    Keys,
    Done(Reply),
    Over,
}

/// One request on a host session at its DC (see the module doc).
#[derive(Debug)]
pub struct SessionRequest {
    dc: DcId,
    policy: LeasePolicy,
    ask: SessionAsk,
    attempts: u32,
    phase: Phase,
}

fn refusal(failure: Failure) -> Reply {
    Reply::Error(failure.into_reply())
}

fn ended(session: &SessionId) -> Reply {
    let why = format!("host session {session} has ended, run out, or is not this dc's");
    Reply::Error(ErrorReply::new(ErrorKind::SessionEnded, why))
}

impl SessionRequest {
    /// `ask` arriving at DC `dc`, whose lease policy is `policy`.
    pub fn new(dc: DcId, policy: LeasePolicy, ask: SessionAsk) -> SessionRequest {
        let phase = match &ask {
            SessionAsk::Open { .. } | SessionAsk::Renew { .. } => Phase::Cover,
            SessionAsk::Close { .. } | SessionAsk::Keys { .. } => Phase::Read,
        };
        let phase = match ask.session() {
            // Another DC's session has no row here: nothing to renew.
            Some(session) if session.dc() != &dc => Phase::Done(match &ask {
                SessionAsk::Renew { .. } => Reply::SessionRenewed(SessionRenewReply::Expired),
                SessionAsk::Close { .. } => Reply::SessionClosed(false),
                _ => ended(session),
            }),
            _ => phase,
        };
        SessionRequest {
            dc,
            policy,
            ask,
            attempts: 0,
            phase,
        }
    }

    /// The session asked about (`None`: an open).
    pub fn session(&self) -> Option<&SessionId> {
        self.ask.session()
    }

    /// The row read at `now` (store clock): judged as the ask says.
    fn judge(&mut self, row: Option<SessionRecord>, now: StoreTime) -> Phase {
        let Some(row) = row else {
            return Phase::Done(match &self.ask {
                SessionAsk::Renew { .. } => Reply::SessionRenewed(SessionRenewReply::Expired),
                SessionAsk::Close { .. } => Reply::SessionClosed(false),
                SessionAsk::Keys { session, .. } => ended(session),
                SessionAsk::Open { .. } => unreachable!("an open reads no row"),
            });
        };
        match &self.ask {
            SessionAsk::Renew {
                secret, host_time, ..
            } => {
                let renewed = row.renew(secret, *host_time, now, &self.policy);
                match (renewed.next, renewed.reply) {
                    (Some(next), SessionRenewReply::Renewed { deadlines, .. }) => Phase::Write {
                        expected: Some(row.version),
                        row: Box::new(next),
                        deadlines: Some(deadlines),
                    },
                    (_, reply) => Phase::Done(Reply::SessionRenewed(reply)),
                }
            }
            SessionAsk::Close { secret, .. } => match row.close(secret, now) {
                Some(next) => Phase::Write {
                    expected: Some(row.version),
                    row: Box::new(next),
                    deadlines: None,
                },
                None => Phase::Done(Reply::SessionClosed(false)),
            },
            SessionAsk::Keys {
                session, secret, ..
            } => {
                if row.admits(secret) && now < row.holds_until() {
                    Phase::Keys
                } else {
                    Phase::Done(ended(session))
                }
            }
            SessionAsk::Open { .. } => unreachable!("an open reads no row"),
        }
    }

    /// The write landed: what follows.
    fn written(&self, row: &SessionRecord, deadlines: Option<Deadlines>) -> Phase {
        match (&self.ask, deadlines) {
            (SessionAsk::Open { .. }, Some(deadlines)) => Phase::Done(Reply::SessionOpened {
                session: row.id.clone(),
                deadlines,
            }),
            (SessionAsk::Renew { .. }, Some(deadlines)) => Phase::Notices(deadlines),
            (SessionAsk::Close { .. }, None) => Phase::Done(Reply::SessionClosed(true)),
            (ask, _) => unreachable!("{ask:?} wrote a session row it does not write"),
        }
    }

    fn conflict(&mut self) -> Phase {
        self.attempts += 1;
        if self.attempts >= CAS_ATTEMPTS_MAX {
            let session = self.session().map_or(String::new(), |s| s.to_string());
            let why = format!(
                "host session {session} contended for {} attempts",
                self.attempts
            );
            return Phase::Done(Reply::Error(ErrorReply::new(ErrorKind::Overloaded, why)));
        }
        Phase::Read
    }
}

impl SessionAsk {
    fn session(&self) -> Option<&SessionId> {
        match self {
            SessionAsk::Open { .. } => None,
            SessionAsk::Renew { session, .. }
            | SessionAsk::Close { session, .. }
            | SessionAsk::Keys { session, .. } => Some(session),
        }
    }
}

/// The notices a renewal carries, from the frozen records the store listed.
fn notices(records: Vec<DcRecord>) -> Vec<SessionNotice> {
    let notice = |r: DcRecord| match &r.state {
        RecordState::Active {
            expiry: Expiry::Frozen { notice, .. },
            ..
        } => Some(SessionNotice {
            seq: *notice,
            reservation: r.id,
        }),
        _ => None,
    };
    records.into_iter().filter_map(notice).collect()
}

/// A page of a session's keys, as a resync lists them.
fn keys(records: Vec<DcRecord>) -> (Vec<SessionKey>, bool) {
    let more = records.len() > SESSION_KEYS_PAGE;
    let key = |r: DcRecord| SessionKey {
        frozen: matches!(
            &r.state,
            RecordState::Active {
                expiry: Expiry::Frozen { .. },
                ..
            }
        ),
        reservation: r.id,
        key: r.key,
        token: r.token,
    };
    let page = records.into_iter().take(SESSION_KEYS_PAGE).map(key);
    (page.collect(), more)
}

impl Stepper for SessionRequest {
    type Output = Reply;

    fn step(&mut self, now: NodeTime) -> Step<Reply> {
        let op = match &self.phase {
            Phase::Cover => return Step::Ask(Effect::Cover { from: now }),
            Phase::Allocate => StoreOp::Allocate,
            Phase::Read => {
                StoreOp::Session(self.session().expect("a read names its session").clone())
            }
            Phase::Write { expected, row, .. } => StoreOp::WriteSession {
                expected: *expected,
                row: row.clone(),
            },
            Phase::Notices(_) => {
                let SessionAsk::Renew { session, ack, .. } = &self.ask else {
                    unreachable!("only a renewal reads notices")
                };
                StoreOp::SessionNotices {
                    id: session.clone(),
                    after: *ack,
                    limit: SESSION_NOTICES_PAGE,
                }
            }
            Phase::Keys => {
                let SessionAsk::Keys { session, after, .. } = &self.ask else {
                    unreachable!("only a resync reads keys")
                };
                StoreOp::SessionKeys {
                    id: session.clone(),
                    after: after.clone(),
                    // One more than a page: whether more follow.
                    limit: SESSION_KEYS_PAGE + 1,
                }
            }
            Phase::Done(_) => match std::mem::replace(&mut self.phase, Phase::Over) {
                Phase::Done(reply) => return Step::Done(reply),
                _ => unreachable!("the phase matched Done"),
            },
            Phase::Over => panic!("a session request stepped after it was answered"),
        };
        Step::Ask(Effect::Store(op))
    }

    fn answer(&mut self, answer: Answer, now: Now) {
        let phase = std::mem::replace(&mut self.phase, Phase::Over);
        self.phase = match (phase, answer) {
            (Phase::Cover, Answer::Covered(Ok(()))) => match &self.ask {
                SessionAsk::Open { .. } => Phase::Allocate,
                _ => Phase::Read,
            },
            (Phase::Allocate, Answer::Stored(Ok(Stored::Allocated(unique)))) => {
                let SessionAsk::Open { secret, host_time } = &self.ask else {
                    unreachable!("only an open allocates")
                };
                let id = SessionId::new(self.dc.clone(), unique);
                let (row, deadlines) =
                    SessionRecord::open(id, *secret, *host_time, now.store, &self.policy);
                Phase::Write {
                    expected: None,
                    row: Box::new(row),
                    deadlines: Some(deadlines),
                }
            }
            (Phase::Read, Answer::Stored(Ok(Stored::Session(row)))) => self.judge(row, now.store),
            (Phase::Write { row, deadlines, .. }, Answer::Stored(Ok(Stored::Written(written)))) => {
                match written {
                    Written::Yes => self.written(&row, deadlines),
                    // A fresh unique is never taken: an open cannot conflict.
                    Written::Conflict if matches!(self.ask, SessionAsk::Open { .. }) => {
                        Phase::Done(refusal(Failure::from_reply(ErrorReply::new(
                            ErrorKind::Internal,
                            format!("a new host session {} already had a row", row.id),
                        ))))
                    }
                    Written::Conflict => self.conflict(),
                }
            }
            (Phase::Notices(deadlines), Answer::Stored(Ok(Stored::Page(records)))) => {
                Phase::Done(Reply::SessionRenewed(SessionRenewReply::Renewed {
                    deadlines,
                    notices: notices(records),
                }))
            }
            (Phase::Keys, Answer::Stored(Ok(Stored::Page(records)))) => {
                let (keys, more) = keys(records);
                Phase::Done(Reply::SessionKeys { keys, more })
            }
            (_, Answer::Covered(Err(failure)) | Answer::Stored(Err(failure))) => {
                Phase::Done(refusal(failure))
            }
            (phase, answer) => {
                panic!("a session request in {phase:?} answered what it did not ask: {answer:?}")
            }
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixture::{NOW, POLICY, held_in_session as under, secret, session as row};

    fn iad() -> DcId {
        "iad".parse().unwrap()
    }

    fn renew(session: SessionId, secret: LeaseKey, ack: u64) -> SessionRequest {
        let ask = SessionAsk::Renew {
            session,
            secret,
            host_time: HostTime::from_ms(1_000),
            ack,
        };
        SessionRequest::new(iad(), POLICY, ask)
    }

    fn asked(s: &mut SessionRequest) -> Effect {
        match s.step(NOW.node) {
            Step::Ask(effect) => effect,
            Step::Done(reply) => panic!("answered before it asked: {reply:?}"),
        }
    }

    fn replied(s: &mut SessionRequest) -> Reply {
        match s.step(NOW.node) {
            Step::Done(reply) => reply,
            Step::Ask(effect) => panic!("asked {effect:?}, expected the reply"),
        }
    }

    fn stored(s: &mut SessionRequest, stored: Stored) {
        s.answer(Answer::Stored(Ok(stored)), NOW);
    }

    #[test]
    fn a_renewal_writes_over_the_row_read_rereads_on_a_conflict_and_reads_notices_after_it_landed()
    {
        let row = row();
        let mut s = renew(row.id.clone(), secret(), 0);
        assert!(matches!(asked(&mut s), Effect::Cover { .. }));
        s.answer(Answer::Covered(Ok(())), NOW);
        assert_eq!(
            asked(&mut s),
            Effect::Store(StoreOp::Session(row.id.clone()))
        );
        stored(&mut s, Stored::Session(Some(row.clone())));
        let Effect::Store(StoreOp::WriteSession { expected, .. }) = asked(&mut s) else {
            panic!("expected the row's write")
        };
        assert_eq!(expected, Some(5));
        // A freeze wrote the row meanwhile: read it again, write over that.
        stored(&mut s, Stored::Written(Written::Conflict));
        assert_eq!(
            asked(&mut s),
            Effect::Store(StoreOp::Session(row.id.clone()))
        );
        let frozen = under(&row, 10).drain(Some(&row)).unwrap();
        let mut noticed = row.clone();
        noticed.notice_seq = 1;
        noticed.version = 6;
        stored(&mut s, Stored::Session(Some(noticed)));
        let Effect::Store(StoreOp::WriteSession { expected, .. }) = asked(&mut s) else {
            panic!("expected the row's write")
        };
        assert_eq!(expected, Some(6));
        stored(&mut s, Stored::Written(Written::Yes));
        assert_eq!(
            asked(&mut s),
            Effect::Store(StoreOp::SessionNotices {
                id: row.id.clone(),
                after: 0,
                limit: SESSION_NOTICES_PAGE,
            })
        );
        stored(&mut s, Stored::Page(vec![frozen.clone(), under(&row, 11)]));
        let Reply::SessionRenewed(SessionRenewReply::Renewed { notices, .. }) = replied(&mut s)
        else {
            panic!("expected a renewal")
        };
        assert_eq!(
            notices,
            vec![SessionNotice {
                seq: 1,
                reservation: frozen.id
            }]
        );
    }

    #[test]
    fn another_secret_renews_nothing_and_a_contended_row_is_overloaded() {
        let row = row();
        let mut s = renew(row.id.clone(), LeaseKey::from_bytes([8; 16]).unwrap(), 0);
        asked(&mut s);
        s.answer(Answer::Covered(Ok(())), NOW);
        asked(&mut s);
        stored(&mut s, Stored::Session(Some(row.clone())));
        assert_eq!(
            replied(&mut s),
            Reply::SessionRenewed(SessionRenewReply::NotHolder)
        );

        let mut s = renew(row.id.clone(), secret(), 0);
        asked(&mut s);
        s.answer(Answer::Covered(Ok(())), NOW);
        for _ in 0..CAS_ATTEMPTS_MAX {
            assert_eq!(
                asked(&mut s),
                Effect::Store(StoreOp::Session(row.id.clone()))
            );
            stored(&mut s, Stored::Session(Some(row.clone())));
            asked(&mut s);
            stored(&mut s, Stored::Written(Written::Conflict));
        }
        let Reply::Error(e) = replied(&mut s) else {
            panic!("expected a refusal")
        };
        assert_eq!(e.kind, ErrorKind::Overloaded);
    }

    #[test]
    fn another_dcs_session_is_answered_without_io() {
        let fra = SessionId::new("fra".parse().unwrap(), 3);
        assert_eq!(
            replied(&mut renew(fra, secret(), 0)),
            Reply::SessionRenewed(SessionRenewReply::Expired)
        );
    }

    #[test]
    fn a_page_of_keys_says_whether_more_follow_and_which_are_frozen() {
        let row = row();
        let ask = SessionAsk::Keys {
            session: row.id.clone(),
            secret: secret(),
            after: None,
        };
        let mut s = SessionRequest::new(iad(), POLICY, ask);
        asked(&mut s);
        stored(&mut s, Stored::Session(Some(row.clone())));
        let Effect::Store(StoreOp::SessionKeys { limit, .. }) = asked(&mut s) else {
            panic!("expected the keys page")
        };
        assert_eq!(limit, SESSION_KEYS_PAGE + 1);
        let mut page: Vec<DcRecord> = (10..).take(limit).map(|u| under(&row, u)).collect();
        page[0] = page[0].drain(Some(&row)).unwrap();
        stored(&mut s, Stored::Page(page));
        let Reply::SessionKeys { keys, more } = replied(&mut s) else {
            panic!("expected keys")
        };
        assert!(more);
        assert_eq!(keys.len(), SESSION_KEYS_PAGE);
        assert!(keys[0].frozen && !keys[1].frozen);
    }
}
