//! One request at its DC, from arrival to reply (DESIGN.md §7.1's
//! `handle_request`): which of this crate's steppers answers it, the checks
//! made as it arrives (a reservation this DC owns, a renewal its DC lease
//! covers, a cancel noted before the read that looks for its grant), and
//! the reply its outcome becomes. homingd and the simulator run every
//! request a DC serves as one [`Serve`], except the four whose handling
//! holds something at the driver while it runs: an acquire (a host's retry
//! joins the one running, the DC's `retries`), an await (the waiter's
//! place in its queue), a watch (its subscription to the DC's log) and a
//! page of a DC's drain (an operator's loop over pages); those run their
//! own steppers ([`crate::Acquire`], [`crate::AwaitVacant`],
//! [`crate::WatchRead`], [`crate::DrainScope`]).
//!
//! ```text
//! Resolve ─► Resolve
//! ResolveReservation ─ another dc's ─► Done(BadRequest)
//!                    └ ours ─► Segment ─► AnswersForTails ─► Done
//! Successor ─► Global(Successor) ─► Done
//! Renew ─► Cover ─ refused ─► Done(its refusal)
//!                └ covered ─► Update(Renew)
//! Release, ForceRelease ─► Update
//! Shortcut ─ another dc's entry ─► Done(BadRequest)
//!          └ ours ─► Update(Shortcut)
//! Cancel ─► Cancellation(note) ─► KeyRecords ─ no grant ─► Done(false)
//!                                            └ its grant ─► Update(Cancel)
//! Link ─► LinkOnward
//! Drain ─► Drain (forwarded when a peer dc asks)
//! Inspect ─► KeyRecords ─► Done(redacted)
//! Scan ─► Store(Scan) ─► Done(redacted page, next cursor)
//! OpenSession, RenewSession, CloseSession, SessionKeys ─► SessionRequest
//! ```

use std::collections::VecDeque;

use homing_core::{
    DcId, DcRecord, ErrorKind, ErrorReply, FencingToken, Key, LeaseKey, LeasePolicy,
    NamespaceScope, ReleaseReply, Reply, Request, ReservationId, ScanCursor, Segment, Shortcut,
};

use crate::request::change::{Change, Changed};
use crate::request::drain::Drain;
use crate::request::link::LinkOnward;
use crate::request::resolve::{Resolve, answered, owned_here};
use crate::request::scan::{KeyRecords, SCAN_PAGE_RECORDS, next_cursor};
use crate::request::session::{SessionAsk, SessionRequest};
use crate::request::update::Update;
use crate::step::effect::{GlobalAnswer, GlobalOp, StoreOp, Stored};
use crate::step::event::NodeEvent;
use crate::step::failure::Failure;
use crate::step::time::NodeTime;
use crate::step::{Answer, Effect, Now, Step, Stepper};
use homing_core::mutation::Mutations;

/// Records one store page of a key's read holds (`Cancel`, `Inspect`):
/// homing-store's `SCAN_LIMIT_MAX`, which homingd asserts.
pub const KEY_RECORDS_PAGE: usize = 128;

/// What a DC is to the requests it serves.
#[derive(Debug, Clone)]
pub struct NodeConfig {
    /// Its name.
    pub dc: DcId,
    /// Its host-lease policy.
    pub policy: LeasePolicy,
    /// How many hops its walks go at most.
    pub hop_limit: usize,
    /// Rules broken on purpose (tests only; [`Mutations::NONE`] otherwise).
    pub mutations: Mutations,
}

/// Where a request is. A phase that asks one effect asks it at each step
/// until answered (a driver steps once per answer); a phase running a
/// stepper passes its effects on; neither is moved until it ends.
#[derive(Debug)]
enum Phase {
    Resolve(Resolve),
    /// `ResolveReservation`: this DC's segment from the reservation.
    Segment(ReservationId),
    /// `ResolveReservation`: whether this DC answers for the segment's tail.
    Tails(Segment),
    /// `Successor`: the global store's succession of `id`.
    Successor {
        id: ReservationId,
        key: Key,
    },
    /// `Renew`: the DC lease's cover; the update follows.
    Cover(Box<Update>),
    Update(Box<Update>),
    /// `Cancel`: its note; the read for its grant follows.
    Note(KeyRecords, LeaseKey),
    Cancel(KeyRecords, LeaseKey),
    Inspect(KeyRecords),
    /// A peer's link, and the successor it asked for.
    Link(Box<LinkOnward>, ReservationId),
    Drain(Box<Drain>),
    /// A host session's own request.
    Session(Box<SessionRequest>),
    /// `Scan`: one page of the DC's records.
    Scan {
        scope: NamespaceScope,
        after: Option<ScanCursor>,
    },
    Done(Reply),
    Over,
}

/// One request served at a DC (see the module doc).
#[derive(Debug)]
pub struct Serve {
    node: NodeConfig,
    /// The request's kind ([`Request::kind`]).
    kind: &'static str,
    /// The token of an operator's forced release.
    forced: Option<FencingToken>,
    events: VecDeque<NodeEvent>,
    phase: Phase,
}

/// The reply a failure is.
fn refusal(failure: Failure) -> Reply {
    Reply::Error(failure.into_reply())
}

impl Serve {
    /// `request` arriving at `node`, from DC `peer` when a DC's node sent
    /// it — another DC's, or this one's own (a link of its own tail) —
    /// (`None`: a host, a router, an operator). `hint` gives the
    /// chain member the node remembers for a key (a drain's walk starts
    /// there). An acquire, await, watch or drain-scope page is not served
    /// here (see the module doc): it answers `Internal`.
    pub fn new(
        node: &NodeConfig,
        peer: Option<&DcId>,
        request: Request,
        hint: impl FnOnce(&Key) -> Option<Shortcut>,
    ) -> Serve {
        let n = node;
        let dc = n.dc.clone();
        let update =
            |id, change| Box::new(Update::new(dc.clone(), id, change, n.policy, n.mutations));
        let (kind, mut forced) = (request.kind(), None);
        let phase = match request {
            Request::Resolve { key } => Phase::Resolve(Resolve::new(dc.clone(), key)),
            Request::ResolveReservation { id } => match owned_here(&dc, &id) {
                Ok(()) => Phase::Segment(id),
                Err(refused) => Phase::Done(refusal(refused)),
            },
            Request::Successor { key, id } => Phase::Successor { id, key },
            Request::Renew {
                reservation,
                token,
                lease,
                host_time,
            } => {
                let change = Change::Renew {
                    token,
                    lease,
                    host_time,
                };
                Phase::Cover(update(reservation, change))
            }
            Request::Release {
                reservation,
                token,
                lease,
                outcome,
            } => {
                let change = Change::Release {
                    token,
                    lease,
                    outcome,
                };
                Phase::Update(update(reservation, change))
            }
            Request::ForceRelease { reservation, token } => {
                forced = Some(token);
                let change = Change::ForceRelease { token };
                Phase::Update(update(reservation, change))
            }
            Request::Shortcut {
                key,
                entry,
                shortcut,
            } => match owned_here(&dc, &entry) {
                Ok(()) => {
                    let change = Change::Shortcut { key, shortcut };
                    Phase::Update(update(entry, change))
                }
                Err(refused) => Phase::Done(refusal(refused)),
            },
            Request::Cancel { key, lease } => {
                let read = KeyRecords::held_under(key, lease, KEY_RECORDS_PAGE);
                Phase::Note(read, lease)
            }
            Request::Link {
                key,
                from,
                to,
                expected_token,
            } => {
                let asked = to.clone();
                Phase::Link(
                    Box::new(link(n, peer, key, from, to, expected_token)),
                    asked,
                )
            }
            Request::Drain { key } => {
                let hint = hint(&key);
                let (forwarded, hops) = (peer.is_some(), n.hop_limit);
                let drain = Drain::new(dc.clone(), key, forwarded, hops, n.policy, n.mutations);
                Phase::Drain(Box::new(drain.with_hint(hint)))
            }
            Request::Inspect { key } => Phase::Inspect(KeyRecords::inspect(key, KEY_RECORDS_PAGE)),
            Request::Scan { scope, after } => Phase::Scan { scope, after },
            Request::OpenSession { secret, host_time } => {
                session(n, SessionAsk::Open { secret, host_time })
            }
            Request::RenewSession {
                session: id,
                secret,
                host_time,
                ack,
            } => session(
                n,
                SessionAsk::Renew {
                    session: id,
                    secret,
                    host_time,
                    ack,
                },
            ),
            Request::CloseSession {
                session: id,
                secret,
            } => session(
                n,
                SessionAsk::Close {
                    session: id,
                    secret,
                },
            ),
            Request::SessionKeys {
                session: id,
                secret,
                after,
            } => session(
                n,
                SessionAsk::Keys {
                    session: id,
                    secret,
                    after,
                },
            ),
            other @ (Request::Acquire { .. }
            | Request::AcquireInSession { .. }
            | Request::Await { .. }
            | Request::Watch { .. }
            | Request::DrainScope { .. }
            | Request::Directory
            | Request::DcReport) => {
                let why = format!("a {} request is not served by Serve", other.kind());
                Phase::Done(internal(why))
            }
        };
        Serve {
            node: node.clone(),
            kind,
            forced,
            events: VecDeque::new(),
            phase,
        }
    }

    /// The request's kind ([`Request::kind`]).
    pub fn kind(&self) -> &'static str {
        self.kind
    }

    /// The drain this request runs, while it runs one.
    pub fn drain(&self) -> Option<&Drain> {
        match &self.phase {
            Phase::Drain(drain) => Some(drain),
            _ => None,
        }
    }
}

/// The reply of update `update`, which ended with `done`; an operator's
/// forced release (`forced`: its token) that released is noted in `events`.
fn updated(
    events: &mut VecDeque<NodeEvent>,
    forced: Option<FencingToken>,
    update: &Update,
    done: Result<Changed, ErrorReply>,
) -> Reply {
    let reply = match done.map(Changed::into_reply) {
        Ok(Some(reply)) => reply,
        Ok(None) => internal("a change without a reply"),
        Err(refused) => Reply::Error(refused),
    };
    if let Some(token) = forced
        && reply == Reply::Release(ReleaseReply::Released)
    {
        let reservation = update.id().clone();
        events.push_back(NodeEvent::ForceReleased { reservation, token });
    }
    reply
}

/// An `Internal` error reply: a driver or a stepper broke its contract.
fn internal(why: impl Into<String>) -> Reply {
    Reply::Error(ErrorReply::new(ErrorKind::Internal, why))
}

/// A host session's request at `node`.
fn session(node: &NodeConfig, ask: SessionAsk) -> Phase {
    let request = SessionRequest::new(node.dc.clone(), node.policy, ask);
    Phase::Session(Box::new(request))
}

/// The link `from → to` that DC `peer` asks of `node`.
fn link(
    node: &NodeConfig,
    peer: Option<&DcId>,
    key: Key,
    from: ReservationId,
    to: ReservationId,
    expected: FencingToken,
) -> LinkOnward {
    let (dc, policy, mutations) = (node.dc.clone(), node.policy, node.mutations);
    LinkOnward::new(dc, peer, key, from, to, expected, policy, mutations)
}

impl Stepper for Serve {
    /// The request's reply (an error reply when it failed).
    type Output = Reply;

    #[inline]
    fn step(&mut self, now: NodeTime) -> Step<Reply> {
        let reply = match &mut self.phase {
            Phase::Resolve(resolve) => match resolve.step(now) {
                Step::Ask(effect) => return Step::Ask(effect),
                Step::Done(done) => done.unwrap_or_else(refusal),
            },
            Phase::Segment(id) => return Step::Ask(Effect::Segment(id.clone())),
            Phase::Tails(_) => return Step::Ask(Effect::AnswersForTails),
            Phase::Successor { id, key } => {
                let (id, key) = (id.clone(), key.clone());
                return Step::Ask(Effect::Global(GlobalOp::Successor { id, key }));
            }
            Phase::Cover(_) => return Step::Ask(Effect::Cover { from: now }),
            Phase::Note(_, lease) => {
                let lease = *lease;
                return Step::Ask(Effect::Cancellation { lease, note: true });
            }
            Phase::Scan { scope, after } => {
                let op = StoreOp::scan_scope(scope.clone(), after.clone(), SCAN_PAGE_RECORDS);
                return Step::Ask(Effect::Store(op));
            }
            Phase::Update(update) => match update.step(now) {
                Step::Ask(effect) => return Step::Ask(effect),
                Step::Done(done) => updated(&mut self.events, self.forced, update, done),
            },
            Phase::Cancel(read, lease) => {
                let lease = *lease;
                match read.step(now) {
                    Step::Ask(effect) => return Step::Ask(effect),
                    Step::Done(Err(refused)) => Reply::Error(refused),
                    Step::Done(Ok(records)) => {
                        let target = cancel_target(&records, &lease);
                        self.events
                            .push_back(NodeEvent::CancelFound(target.clone()));
                        match target {
                            Some(id) => {
                                let (n, change) = (&self.node, Change::Cancel { lease });
                                let update =
                                    Update::new(n.dc.clone(), id, change, n.policy, n.mutations);
                                self.phase = Phase::Update(Box::new(update));
                                return self.step(now);
                            }
                            None => Reply::Cancelled(false),
                        }
                    }
                }
            }
            Phase::Inspect(read) => match read.step(now) {
                Step::Ask(effect) => return Step::Ask(effect),
                Step::Done(Ok(records)) => Reply::Inspected {
                    records: records.into_iter().map(DcRecord::redacted).collect(),
                },
                Step::Done(Err(refused)) => Reply::Error(refused),
            },
            Phase::Link(link, to) => match link.step(now) {
                Step::Ask(effect) => return Step::Ask(effect),
                Step::Done(done) => {
                    if let Ok(reply) = &done {
                        self.events.push_back(NodeEvent::Link {
                            from: link.from().clone(),
                            to: to.clone(),
                            reply: reply.clone(),
                            superseded: link.superseded(),
                        });
                    }
                    done.map_or_else(Reply::Error, Reply::Link)
                }
            },
            Phase::Session(request) => match request.step(now) {
                Step::Ask(effect) => return Step::Ask(effect),
                Step::Done(reply) => {
                    if let (Reply::SessionClosed(true), Some(id)) = (&reply, request.session()) {
                        self.events.push_back(NodeEvent::SessionClosed(id.clone()));
                    }
                    reply
                }
            },
            Phase::Drain(drain) => {
                let step = drain.step(now);
                self.events
                    .extend(std::iter::from_fn(|| drain.poll_event()));
                match step {
                    Step::Ask(effect) => return Step::Ask(effect),
                    Step::Done(done) => done.map_or_else(Reply::Error, |()| Reply::Drained),
                }
            }
            Phase::Done(_) => match std::mem::replace(&mut self.phase, Phase::Over) {
                Phase::Done(reply) => return Step::Done(reply),
                _ => unreachable!("the phase matched Done"),
            },
            Phase::Over => panic!("a request stepped after it was answered"),
        };
        self.phase = Phase::Over;
        Step::Done(reply)
    }

    #[inline]
    fn answer(&mut self, answer: Answer, now: Now) {
        match &mut self.phase {
            Phase::Resolve(resolve) => return resolve.answer(answer, now),
            Phase::Update(update) => return update.answer(answer, now),
            Phase::Cancel(read, _) | Phase::Inspect(read) => return read.answer(answer, now),
            Phase::Link(link, _) => return link.answer(answer, now),
            Phase::Drain(drain) => return drain.answer(answer, now),
            Phase::Session(request) => return request.answer(answer, now),
            _ => {}
        }
        let phase = std::mem::replace(&mut self.phase, Phase::Over);
        self.phase = match (phase, answer) {
            (Phase::Segment(_), Answer::Segment(Ok(segment))) => Phase::Tails(segment),
            (Phase::Segment(_), Answer::Segment(Err(failure))) => Phase::Done(refusal(failure)),
            (Phase::Tails(segment), Answer::ForTails(for_tails)) => {
                match answered(&self.node.dc, segment, for_tails) {
                    Ok(segment) => Phase::Done(Reply::Reservation(segment)),
                    Err(failure) => Phase::Done(refusal(failure)),
                }
            }
            (
                Phase::Successor { .. },
                Answer::Global(Ok(GlobalAnswer::Successor {
                    succession, hint, ..
                })),
            ) => Phase::Done(Reply::Successor { succession, hint }),
            (Phase::Successor { .. }, Answer::Global(Err(failure))) => {
                Phase::Done(refusal(failure))
            }
            (Phase::Cover(update), Answer::Covered(Ok(()))) => Phase::Update(update),
            (Phase::Cover(_), Answer::Covered(Err(failure))) => Phase::Done(refusal(failure)),
            (Phase::Note(read, lease), Answer::Cancelled(_)) => Phase::Cancel(read, lease),
            (Phase::Scan { .. }, Answer::Stored(Ok(Stored::Page(records)))) => {
                Phase::Done(Reply::Records {
                    next: next_cursor(&records, SCAN_PAGE_RECORDS),
                    records: records.into_iter().map(DcRecord::redacted).collect(),
                })
            }
            (Phase::Scan { .. }, Answer::Stored(Err(failure))) => Phase::Done(refusal(failure)),
            (phase, answer) => {
                panic!("a request in {phase:?} answered what it did not ask: {answer:?}")
            }
        };
    }

    #[inline]
    fn poll_event(&mut self) -> Option<NodeEvent> {
        self.events.pop_front()
    }
}

/// The reservation a cancel changes, among this DC's `records` of the key:
/// the active lease granted under `lease`, if any.
pub fn cancel_target(records: &[DcRecord], lease: &LeaseKey) -> Option<ReservationId> {
    records
        .iter()
        .find(|r| r.held_under(lease))
        .map(|r| r.id.clone())
}

#[cfg(test)]
mod tests {
    use homing_core::{ErrorKind, HostTime, LeaseKey, StoreTime, Written};

    use super::*;
    use crate::fixture::{NOW, POLICY, held, id, key};

    fn lease() -> LeaseKey {
        LeaseKey::from_bytes([1; 16]).unwrap()
    }

    fn node() -> NodeConfig {
        NodeConfig {
            dc: "iad".parse().unwrap(),
            policy: POLICY,
            hop_limit: 8,
            mutations: Mutations::NONE,
        }
    }

    /// `request` served at iad (from a host), each effect answered from
    /// `answers` in turn: the effects asked, the events noted, the reply.
    fn serve(request: Request, answers: Vec<Answer>) -> (Vec<Effect>, Vec<NodeEvent>, Reply) {
        let mut serve = Serve::new(&node(), None, request, |_| None);
        let (mut asked, mut events) = (Vec::new(), Vec::new());
        let mut answers = answers.into_iter();
        loop {
            let step = serve.step(NOW.node);
            events.extend(std::iter::from_fn(|| serve.poll_event()));
            match step {
                Step::Ask(effect) => {
                    asked.push(effect.clone());
                    let answer = answers
                        .next()
                        .unwrap_or_else(|| panic!("no answer to {effect:?}"));
                    serve.answer(answer, NOW);
                }
                Step::Done(reply) => {
                    assert!(answers.next().is_none(), "answers left over");
                    return (asked, events, reply);
                }
            }
        }
    }

    fn error_kind(reply: &Reply) -> &ErrorKind {
        match reply {
            Reply::Error(e) => &e.kind,
            other => panic!("not an error: {other:?}"),
        }
    }

    #[test]
    fn a_renewal_the_dc_lease_does_not_cover_is_refused_before_any_read() {
        let renew = Request::Renew {
            reservation: id("iad.1"),
            token: homing_core::FencingToken::FIRST,
            lease: lease(),
            host_time: HostTime::from_ms(5),
        };
        let dc: DcId = "iad".parse().unwrap();
        let lapsed = Failure::Unreachable(ErrorReply::new(
            ErrorKind::Unavailable { dc: dc.clone() },
            "dc lease lapsed",
        ));
        let (asked, _, reply) = serve(renew.clone(), vec![Answer::Covered(Err(lapsed))]);
        assert_eq!(asked, vec![Effect::Cover { from: NOW.node }]);
        assert_eq!(error_kind(&reply), &ErrorKind::Unavailable { dc });

        // Covered: the update reads the record next.
        let mut covered = Serve::new(&node(), None, renew, |_| None);
        assert!(matches!(
            covered.step(NOW.node),
            Step::Ask(Effect::Cover { .. })
        ));
        covered.answer(Answer::Covered(Ok(())), NOW);
        assert_eq!(
            covered.step(NOW.node),
            Step::Ask(Effect::Store(StoreOp::Read(id("iad.1"))))
        );
    }

    #[test]
    fn another_dcs_reservation_is_refused_on_arrival() {
        let reservation = Request::ResolveReservation { id: id("fra.1") };
        let (asked, _, reply) = serve(reservation, Vec::new());
        assert!(asked.is_empty());
        assert_eq!(error_kind(&reply), &ErrorKind::BadRequest);

        let shortcut = Request::Shortcut {
            key: key(),
            entry: id("fra.1"),
            shortcut: Shortcut {
                to: id("iad.2"),
                token: homing_core::FencingToken::FIRST,
            },
        };
        let (asked, _, reply) = serve(shortcut, Vec::new());
        assert!(asked.is_empty());
        assert_eq!(error_kind(&reply), &ErrorKind::BadRequest);
    }

    #[test]
    fn a_cancel_is_noted_before_it_looks_for_its_grant_and_releases_it() {
        let cancel = Request::Cancel {
            key: key(),
            lease: lease(),
        };
        let granted = held("iad.1", "a", None, StoreTime::from_ms(0));
        let answers = vec![
            Answer::Cancelled(true),
            Answer::Stored(Ok(Stored::Page(vec![granted.clone()]))),
            Answer::Stored(Ok(Stored::Record(Some(homing_core::RecordRead::alone(
                granted,
            ))))),
            Answer::Stored(Ok(Stored::Written(Written::Yes))),
        ];
        let (asked, events, reply) = serve(cancel.clone(), answers);
        assert_eq!(
            asked[0],
            Effect::Cancellation {
                lease: lease(),
                note: true
            }
        );
        assert!(matches!(asked[1], Effect::Store(StoreOp::Scan { .. })));
        assert_eq!(asked[2], Effect::Store(StoreOp::Read(id("iad.1"))));
        assert!(matches!(asked[3], Effect::Store(StoreOp::Write { .. })));
        assert_eq!(events, vec![NodeEvent::CancelFound(Some(id("iad.1")))]);
        assert_eq!(reply, Reply::Cancelled(true));

        // No grant under the lease: nothing to release.
        let answers = vec![
            Answer::Cancelled(true),
            Answer::Stored(Ok(Stored::Page(Vec::new()))),
        ];
        let (asked, events, reply) = serve(cancel, answers);
        assert_eq!(asked.len(), 2);
        assert_eq!(events, vec![NodeEvent::CancelFound(None)]);
        assert_eq!(reply, Reply::Cancelled(false));
    }

    #[test]
    fn a_successor_answers_the_global_stores_succession_and_the_nodes_hint() {
        let successor = Request::Successor {
            key: key(),
            id: id("iad.1"),
        };
        let hint = Shortcut {
            to: id("fra.3"),
            token: homing_core::FencingToken::FIRST,
        };
        let found = Answer::Global(Ok(GlobalAnswer::Successor {
            succession: None,
            source: homing_core::Source::Local,
            hint: Some(hint.clone()),
        }));
        let (asked, _, reply) = serve(successor, vec![found]);
        assert_eq!(
            asked,
            vec![Effect::Global(GlobalOp::Successor {
                id: id("iad.1"),
                key: key()
            })]
        );
        assert_eq!(
            reply,
            Reply::Successor {
                succession: None,
                hint: Some(hint)
            }
        );
    }

    #[test]
    fn a_scan_page_is_redacted_and_a_full_page_has_a_next_cursor() {
        let scan = Request::Scan {
            scope: homing_core::NamespaceScope::exact(key().namespace),
            after: None,
        };
        let page: Vec<DcRecord> = (1..=SCAN_PAGE_RECORDS as u64)
            .map(|u| held(&format!("iad.{u}"), "a", None, StoreTime::from_ms(0)))
            .collect();
        let answer = Answer::Stored(Ok(Stored::Page(page.clone())));
        let (_, _, reply) = serve(scan, vec![answer]);
        let Reply::Records { records, next } = reply else {
            panic!("not a page: {reply:?}")
        };
        assert_eq!(records.len(), SCAN_PAGE_RECORDS);
        assert!(records.iter().all(|r| !r.held_under(&lease())), "redacted");
        assert_eq!(next, next_cursor(&page, SCAN_PAGE_RECORDS));
        assert!(next.is_some());
    }

    #[test]
    fn only_a_forced_release_that_released_is_noted() {
        let force = Request::ForceRelease {
            reservation: id("iad.1"),
            token: homing_core::FencingToken::FIRST,
        };
        let holder = held("iad.1", "a", None, StoreTime::from_ms(0));
        let answers = vec![
            Answer::Stored(Ok(Stored::Record(Some(homing_core::RecordRead::alone(
                holder,
            ))))),
            Answer::Stored(Ok(Stored::Written(Written::Yes))),
        ];
        let (_, events, reply) = serve(force.clone(), answers);
        assert_eq!(reply, Reply::Release(ReleaseReply::Released));
        assert_eq!(
            events,
            vec![NodeEvent::ForceReleased {
                reservation: id("iad.1"),
                token: homing_core::FencingToken::FIRST
            }]
        );

        // Unknown: nothing released, nothing noted.
        let answers = vec![Answer::Stored(Ok(Stored::Record(None)))];
        let (_, events, reply) = serve(force, answers);
        assert!(matches!(reply, Reply::Error(_)));
        assert!(events.is_empty());
    }

    #[test]
    fn a_drain_a_peer_sent_arrived_forwarded_and_an_operators_did_not() {
        let fra: DcId = "fra".parse().unwrap();
        let drain = || Request::Drain { key: key() };
        let from_peer = Serve::new(&node(), Some(&fra), drain(), |_| None);
        assert_eq!(from_peer.kind(), "drain");
        assert!(from_peer.drain().is_some_and(Drain::forwarded));
        let from_operator = Serve::new(&node(), None, drain(), |_| None);
        assert!(from_operator.drain().is_some_and(|d| !d.forwarded()));
    }

    #[test]
    fn the_requests_a_driver_runs_itself_are_internal_errors_here() {
        let watch = Request::Watch {
            scope: homing_core::NamespaceScope::exact(key().namespace),
            after: 0,
            wait_ms: 0,
        };
        let (asked, _, reply) = serve(watch, Vec::new());
        assert!(asked.is_empty());
        assert_eq!(error_kind(&reply), &ErrorKind::Internal);
    }

    #[test]
    fn cancel_targets_only_the_active_lease_with_that_lease_key() {
        let at = homing_core::StoreTime::from_ms(0);
        let granted = crate::fixture::held("iad.3", "k", None, at);
        let homing_core::RecordState::Active {
            lease: Some(key), ..
        } = &granted.state
        else {
            panic!("held");
        };
        let key = *key;
        let mut linked = crate::fixture::held("iad.1", "k", None, at);
        linked.state = homing_core::RecordState::Linked {
            to: "fra.2".parse().unwrap(),
        };
        let records = [linked, granted];
        assert_eq!(cancel_target(&records, &key).unwrap().to_string(), "iad.3");
        assert_eq!(
            cancel_target(&records, &LeaseKey::from_bytes([7; 16]).unwrap()),
            None
        );
        assert_eq!(cancel_target(&records[..1], &key), None);
    }
}
