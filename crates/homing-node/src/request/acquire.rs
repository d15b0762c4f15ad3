//! Acquire: the connect of DESIGN.md §3.1 at the host's DC, with the wait of
//! `wait_ms` around it, as a sans-IO stepper. homing-core's `Connect` decides
//! one connect; this stepper decides what happens between connects.
//!
//! ```text
//! connect ─ Acquired ─► did the host give up (a Cancel noted)? no ─► Done
//!    │                        yes ─► release the grant (an Update), then Done(Acquired)
//!    │      (an answer after a link that made a new member: this DC's own entry
//!    │       notes it first, an Update; another DC's the driver tells: NodeEvent::Shortcut)
//!    │      TagMismatch ─► Done
//!    │      HeldElsewhere, no wait left (or this was the last look) ─► Done(HeldElsewhere)
//!    │      HeldElsewhere, wait left ─► Await at the holder's DC, bounded by our deadline
//!    │            Vacated / Moved ─► connect again (grant: host time + time held)
//!    │            TimedOut at the end of the wait ─► last look: one more connect, its outcome is the answer
//!    │            TimedOut early (the DC shut down) or unreachable ─► pause, connect again;
//!    │                 no time for a pause ─► Done(HeldElsewhere)
//!    │            refused (a full queue) ─► Done(error)
//!    │            our deadline passed first ─► Done(HeldElsewhere)
//!    └ failed: unreachable with time for a pause (not the last look) ─► pause, connect again
//!              otherwise ─► Done(error)
//!    a connect that loses a race restarts, until CONTENDED_ANSWER_MS past the wait's
//!    end: then the next lost race answers Done(Overloaded), before the host gives up
//! ```
//!
//! The grant after a wait uses the host's reading plus the time the DC held
//! the request: at most what passed for the host (receipt ≥ send), so the
//! host's deadlines stay conservative.
//!
//! Drivers run it as a [`Stepper`] (homingd's `Node::drive`, the
//! simulator's `step_drive`). Its own effects: [`Effect::Cover`] before a
//! connect that may grant (the DC lease's [`crate::DcLease::grant`]),
//! [`Effect::Admit`] before a connect creates the key (the key quota),
//! [`Effect::Segment`] / [`Effect::Link`] to the reservation's DC (this DC:
//! its own store), failures included; [`Effect::Await`] at the holder's DC
//! (this DC: [`crate::AwaitVacant`]; another: an `Await` request), ended by
//! [`Answer::Awaited`], or [`Answer::TimedOut`] once `until` passes first;
//! [`Effect::Pause`], ended by [`Answer::Resumed`]; either ended by
//! [`Answer::Closed`] when the node shuts down; [`Effect::Cancellation`]
//! (the node's [`crate::Cancellations`]: a release's store ops then come
//! as `Store`, as do those noting a new member in this DC's own entry).
//! An admission, a store or a global operation that could not be done is
//! answered with its failure (a refused admission included). Events: the
//! acquire's own ([`NodeEvent::Acquire`]), and at `Done` the member
//! learned ([`NodeEvent::Learned`]) and the notice for another DC's entry
//! ([`NodeEvent::Shortcut`], sent best effort).

use homing_core::Holder;
use std::collections::VecDeque;

use homing_core::{
    AcquireReply, ActorId, AwaitReply, Connect, ConnectError, ConnectNeed, ConnectPoll, DcId,
    DcRecord, ErrorKind, ErrorReply, Holding, HostTime, Key, LeaseKey, LeasePolicy, LinkReply,
    Segment, SessionGuard, SessionId, SessionRecord, Shortcut, ShortcutNotice, Source, StoreTime,
    Tag, TakeoverPolicy, Written, wire::WAIT_MS_MAX,
};

use crate::request::change::Change;
use crate::request::update::{CAS_ATTEMPTS_MAX, Update};
use crate::step::effect::{GlobalAnswer, GlobalOp, GlobalRead, StoreOp, Stored, unasked};
use crate::step::event::{AcquireEvent, NodeEvent};
use crate::step::failure::Failure;
use crate::step::time::NodeTime;
use crate::step::{Answer, Effect, Now, Step, Stepper};
use homing_core::mutation::{GRANT_LATE_MS, Mutation, Mutations};

/// Pause before connecting or registering again after a DC did not answer,
/// in milliseconds.
pub const AWAIT_RETRY_MS: u64 = 250;

/// How long after its wait (at once, for an acquire that does not wait) an
/// acquire may still start another connect attempt after losing a race for
/// the key, in milliseconds. Past it, the next lost race answers
/// `Overloaded` ("contended, try again"). Below the hosts' request timeout
/// (`homing_core::host_lease::REQUEST_TIMEOUT_MS_DEFAULT`, 2 s); the
/// attempt under way then may still take a few round trips, so the answer
/// can reach a host's retry (which joins this acquire: the DC's retries)
/// rather than its first try — but before the host gives up.
pub const CONTENDED_ANSWER_MS: u64 = 1_500;

/// How a connect reads the key's global entry: from the nearest replica. A
/// present entry is always true (entries never change), and a stale
/// "absent" only leads to `set_if_absent`, which answers with the winner —
/// the ordinary race path. Every other global read is [`GlobalRead::Latest`].
pub const CONNECT_GLOBAL_READ: GlobalRead = GlobalRead::Nearest;

/// A change of one of this DC's records an acquire makes before it answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Trailing {
    /// Releasing a grant its host gave up on.
    Cancel,
    /// Noting the chain's new member in this DC's entry record.
    Shortcut,
}

#[derive(Debug)]
enum Phase {
    /// Reading the host session the key is asked under (`first`: before
    /// the DC lease's cover; else again, after a guarded write lost to
    /// the session's renewal).
    Session {
        first: bool,
    },
    /// Writing the new record of `session_create` again, guarded by the
    /// row just read.
    Recreating,
    /// Waiting for the driver's answer to [`Effect::Cover`].
    Covering {
        from: NodeTime,
    },
    Connecting,
    Awaiting,
    /// `error`: the failure that caused the pause, if a connect failed.
    Paused {
        until: NodeTime,
        error: Option<ErrorReply>,
    },
    /// A grant made: waiting for the answer to [`Effect::Cancellation`].
    Granted(AcquireReply),
    /// Making a trailing change, then answering `outcome`.
    Updating {
        update: Box<Update>,
        outcome: AcquireReply,
        why: Trailing,
    },
    Done(Result<AcquireReply, ErrorReply>),
    Over,
}

/// How an acquire started: what the host asked for.
#[derive(Debug, Clone)]
pub struct AcquireRequest {
    /// The key (its name drawn by the driver if the host gave none).
    pub key: Key,
    /// The tag the key must carry.
    pub tag: Option<Tag>,
    /// The host's actor.
    pub actor: ActorId,
    /// The host's lease key for this logical acquire.
    pub lease: LeaseKey,
    /// The host's clock when it sent the request.
    pub host_time: HostTime,
    /// How long the host lets the DC wait for a held key, ms.
    pub wait_ms: u32,
    /// The host session to hold the key under (`None`: a lease of its own).
    pub session: Option<InSession>,
}

/// The host session an acquire names, and the secret it presents.
#[derive(Debug, Clone)]
pub struct InSession {
    /// The session.
    pub id: SessionId,
    /// Its secret.
    pub secret: LeaseKey,
}

impl AcquireRequest {
    /// The host as a lease holder whose clock reads `host_time`.
    fn holding(&self, host_time: HostTime) -> Holding {
        Holding {
            actor: self.actor.clone(),
            lease: self.lease,
            host_time,
            // Set once the session's row is read.
            session: None,
        }
    }
}

/// One acquire in progress at the host's DC.
#[derive(Debug)]
pub struct Acquire {
    dc: DcId,
    request: AcquireRequest,
    policy: LeasePolicy,
    hop_limit: usize,
    takeover: TakeoverPolicy,
    mutations: Mutations,
    started: NodeTime,
    deadline: NodeTime,
    connect: Connect,
    /// The `HeldElsewhere` to answer if the wait ends.
    held: Option<AcquireReply>,
    last_look: bool,
    awaits: u32,
    /// Whether the key quota admitted a create whose set-if-absent has not
    /// answered yet (its slot, held by the driver, is not settled).
    admitted: bool,
    phase: Phase,
    /// The notice for another DC's entry, once the answer is made.
    notice: Option<ShortcutNotice>,
    events: VecDeque<AcquireEvent>,
    /// What the outcome noted for the node, as a [`Stepper`]: the member
    /// learned and the notice, handed out after the acquire's own events.
    outcome_events: VecDeque<NodeEvent>,
    /// The row of the host session the key is asked under, as last read.
    session_row: Option<Box<SessionRecord>>,
    /// A new record asked to be written under the session, kept until the
    /// write lands: its guard may lose to the session's renewal, and it is
    /// then written again over the row read anew.
    session_create: Option<Box<DcRecord>>,
    /// Guarded creates that lost to the session's row so far.
    session_conflicts: u32,
}

impl Acquire {
    /// An acquire at DC `dc` arriving at `now` (node clock).
    pub fn new(
        dc: DcId,
        request: AcquireRequest,
        now: NodeTime,
        policy: LeasePolicy,
        hop_limit: usize,
        mutations: Mutations,
    ) -> Acquire {
        let wait_ms = u64::from(request.wait_ms.min(WAIT_MS_MAX));
        let connect = Connect::new(
            dc.clone(),
            request.key.clone(),
            request.tag.clone(),
            request.holding(request.host_time),
            policy,
            hop_limit,
        );
        Acquire {
            dc,
            policy,
            hop_limit,
            takeover: TakeoverPolicy::Automatic,
            mutations,
            started: now,
            deadline: now.plus_ms(wait_ms),
            connect,
            held: None,
            last_look: false,
            awaits: 0,
            admitted: false,
            phase: match request.session {
                Some(_) => Phase::Session { first: true },
                None => Phase::Covering { from: now },
            },
            request,
            notice: None,
            events: VecDeque::new(),
            outcome_events: VecDeque::new(),
            session_row: None,
            session_create: None,
            session_conflicts: 0,
        }
    }

    /// Starts the first connect's walk at `hint`, a member of the key's
    /// chain the driver remembers (see [`member_named`]). Connects after a
    /// wait start at the holder they waited on.
    pub fn with_hint(mut self, hint: Option<Shortcut>) -> Acquire {
        self.connect = self.connect.with_hint(hint);
        self
    }

    /// Takes over the tails of silent DCs under `policy` (default:
    /// [`TakeoverPolicy::Automatic`]), in every connect of this acquire.
    pub fn with_takeover(mut self, policy: TakeoverPolicy) -> Acquire {
        self.takeover = policy;
        self.connect = self.connect.with_takeover(policy);
        self
    }

    /// Whether the peer request asked is [`Effect::Segment`] (answer
    /// with [`Answer::Segment`]), not [`Effect::Link`] ([`Answer::Linked`]).
    pub fn asks_segment(&self) -> bool {
        matches!(self.phase, Phase::Connecting)
            && matches!(
                self.connect.poll(),
                ConnectPoll::Need(ConnectNeed::Reservation(_))
            )
    }

    /// The member of the key's chain a driver remembers after this acquire
    /// answered `reply` ([`member_named`]), unless it is the key's first
    /// reservation: every walk reads the entry first, so remembering it
    /// would only fill the driver's cache (one entry per key created).
    pub fn member_learned(&self, reply: &AcquireReply) -> Option<Shortcut> {
        let member = member_named(reply)?;
        (self.connect.entry() != Some(&member.to)).then_some(member)
    }

    /// The key acquired.
    pub fn key(&self) -> &Key {
        &self.request.key
    }

    /// The host's lease key for this acquire.
    pub fn lease(&self) -> LeaseKey {
        self.request.lease
    }

    /// Whether the host asked to wait.
    pub fn waits(&self) -> bool {
        self.request.wait_ms > 0
    }

    /// When the wait ends (node clock).
    pub fn deadline(&self) -> NodeTime {
        self.deadline
    }

    /// What to do next at `now`; `Done` is handed out once, with the
    /// member learned and the notice noted for the node.
    fn next(&mut self, now: NodeTime) -> Step<<Acquire as Stepper>::Output> {
        if now >= self.deadline.plus_ms(CONTENDED_ANSWER_MS) {
            self.connect.stop_restarts();
        }
        loop {
            match std::mem::replace(&mut self.phase, Phase::Over) {
                Phase::Connecting => match self.connect.poll() {
                    ConnectPoll::Need(need) => {
                        self.phase = Phase::Connecting;
                        return Step::Ask(self.ask(need));
                    }
                    ConnectPoll::Done(outcome) => self.connected(now, outcome),
                    ConnectPoll::Failed(e) => {
                        self.events.push_back(AcquireEvent::ConnectFailed);
                        let kind = match &e {
                            ConnectError::Contended(_) => ErrorKind::Overloaded,
                            // A silent DC not (yet) taken over: worth a retry.
                            ConnectError::Unreachable { dc, .. } => {
                                ErrorKind::Unavailable { dc: dc.clone() }
                            }
                            _ => ErrorKind::Inconsistent,
                        };
                        self.phase = Phase::Connecting;
                        let failure = Failure::from_reply(ErrorReply::new(kind, e.to_string()));
                        self.handle_failure(now, failure);
                    }
                },
                Phase::Awaiting => {
                    self.phase = Phase::Awaiting;
                    let Some(AcquireReply::HeldElsewhere(Holder { reservation, .. })) = &self.held
                    else {
                        unreachable!("an acquire awaits only a key held elsewhere");
                    };
                    let remaining_us = self.deadline.us_since(now);
                    return Step::Ask(Effect::Await {
                        reservation: reservation.clone(),
                        wait_ms: (remaining_us / 1000).max(1) as u32,
                        until: self.deadline,
                    });
                }
                Phase::Paused { until, error } => {
                    self.phase = Phase::Paused { until, error };
                    return Step::Ask(Effect::Pause { until });
                }
                Phase::Covering { from } => {
                    self.phase = Phase::Covering { from };
                    return Step::Ask(Effect::Cover { from });
                }
                Phase::Recreating => {
                    // Its answer goes on as the connect's write would.
                    self.phase = Phase::Connecting;
                    let record = self.session_create.take().expect("a create to write again");
                    return Step::Ask(self.ask(ConnectNeed::Write {
                        expected: None,
                        record: *record,
                    }));
                }
                Phase::Session { first } => {
                    self.phase = Phase::Session { first };
                    let session = self.request.session.as_ref();
                    let id = session.expect("a session phase has a session").id.clone();
                    return Step::Ask(Effect::Store(StoreOp::Session(id)));
                }
                Phase::Granted(outcome) => {
                    self.phase = Phase::Granted(outcome);
                    let lease = self.request.lease;
                    return Step::Ask(Effect::Cancellation { lease, note: false });
                }
                Phase::Updating {
                    mut update,
                    outcome,
                    why,
                } => match update.next() {
                    Step::Ask(effect) => {
                        self.phase = Phase::Updating {
                            update,
                            outcome,
                            why,
                        };
                        return Step::Ask(effect);
                    }
                    // Released here, or already by the host's cancel itself;
                    // noted, or a newer member was already.
                    Step::Done(Ok(_)) => self.phase = self.updated(why, outcome, Ok(())),
                    Step::Done(Err(e)) => {
                        self.phase = self.updated(why, outcome, Err(e.reply()));
                    }
                },
                Phase::Done(Ok(outcome)) => {
                    self.settle_quota(false);
                    if let Some(member) = self.member_learned(&outcome) {
                        let key = self.request.key.clone();
                        self.outcome_events
                            .push_back(NodeEvent::Learned { key, member });
                    }
                    if let Some(notice) = self.notice.take() {
                        self.outcome_events.push_back(NodeEvent::Shortcut(notice));
                    }
                    return Step::Done(Ok(outcome));
                }
                Phase::Done(Err(e)) => {
                    self.settle_quota(false);
                    return Step::Done(Err(e));
                }
                Phase::Over => panic!("acquire of {} polled after it ended", self.request.key),
            }
        }
    }

    /// The connect's `need` as the effect the driver performs.
    fn ask(&mut self, need: ConnectNeed) -> Effect {
        let global = Effect::Global;
        match need {
            ConnectNeed::Allocate if self.connect.creates_key() && !self.admitted => {
                Effect::Admit(self.connect.key().namespace.clone())
            }
            ConnectNeed::Allocate => Effect::Store(StoreOp::Allocate),
            ConnectNeed::LocalRecord(id) => Effect::Store(StoreOp::Read(id)),
            // A connect's write appends a lifecycle event; one that makes
            // the key the session's is guarded by the row it judged.
            ConnectNeed::Write { expected, record } => {
                let guard = self.session_row.as_ref().and_then(|row| {
                    (record.session() == Some(&row.id)).then(|| {
                        Box::new(SessionGuard {
                            id: row.id.clone(),
                            version: row.version,
                            next: None,
                        })
                    })
                });
                if guard.is_some() && expected.is_none() {
                    self.session_create = Some(Box::new(record.clone()));
                }
                Effect::Store(StoreOp::Write {
                    expected,
                    record: Box::new(record),
                    event: true,
                    guard,
                })
            }
            ConnectNeed::GlobalEntry(key) => global(GlobalOp::Entry {
                key,
                read: CONNECT_GLOBAL_READ,
            }),
            ConnectNeed::SetIfAbsent { key, id } => global(GlobalOp::SetIfAbsent { key, id }),
            ConnectNeed::Successor(id) => global(GlobalOp::Successor {
                id,
                key: self.request.key.clone(),
            }),
            ConnectNeed::Confirm(succession) => global(GlobalOp::Confirm(succession)),
            ConnectNeed::DcLease(dc) => global(GlobalOp::DcLease(dc)),
            ConnectNeed::TakeOver { succession, policy } => {
                global(GlobalOp::TakeOver { succession, policy })
            }
            ConnectNeed::Reservation(id) => Effect::Segment(id),
            ConnectNeed::Link {
                key,
                from,
                to,
                expected_token,
            } => Effect::Link {
                key,
                from,
                to,
                expected_token,
            },
        }
    }

    /// The create's quota slot, if it holds one, settles: `kept` or given
    /// back (noted for the node, which keeps the counts).
    fn settle_quota(&mut self, kept: bool) {
        if std::mem::take(&mut self.admitted) {
            let namespace = self.connect.key().namespace.clone();
            self.outcome_events
                .push_back(NodeEvent::QuotaSettled { namespace, kept });
        }
    }

    /// The key quota admitted the create [`Effect::Admit`] asked about.
    fn handle_admitted(&mut self) {
        debug_assert!(
            self.connect.creates_key() && !self.admitted,
            "acquire of {}: an admission nobody asked for",
            self.request.key
        );
        self.admitted = true;
    }

    /// The answer to the [`Effect::Store`] asked at `now` (store clock).
    fn handle_stored(&mut self, stored: Stored, now: StoreTime) {
        if let Phase::Updating { update, .. } = &mut self.phase {
            return update.handle_stored(stored, now);
        }
        match stored {
            Stored::Session(row) => self.handle_session(row, now),
            Stored::Allocated(unique) => self.connect.handle_allocated(unique, now),
            Stored::Record(record) => self.connect.handle_local_record(record, now),
            Stored::Written(written) => {
                let create = self.session_create.take();
                if written == Written::Conflict && self.session_row.is_some() {
                    // The write may have lost to the session's renewal (its
                    // guard): read the row again before going on. A new
                    // record lost to nothing else (its unique is fresh),
                    // so it is written again; an existing one is read
                    // again by the connect.
                    self.phase = Phase::Session { first: false };
                    if let Some(record) = create {
                        self.session_conflicts += 1;
                        if self.session_conflicts >= CAS_ATTEMPTS_MAX {
                            let why = format!(
                                "host session of {} contended for {} attempts",
                                self.request.key, self.session_conflicts
                            );
                            let error = ErrorReply::new(ErrorKind::Overloaded, why);
                            self.phase = Phase::Done(Err(error));
                        }
                        self.session_create = Some(record);
                        return;
                    }
                }
                self.connect.handle_written(written);
            }
            other => unasked("acquire", &other),
        }
    }

    /// The row of the session the key is asked under, read at `now`: the
    /// key is granted under it only while it lives and the host presents
    /// its secret.
    fn handle_session(&mut self, row: Option<SessionRecord>, now: StoreTime) {
        let Phase::Session { first } = self.phase else {
            unasked("acquire", &"a session row it did not ask for")
        };
        let session = self.request.session.as_ref().expect("asked its session");
        let live = row.filter(|row| row.admits(&session.secret) && now < row.holds_until());
        let Some(row) = live else {
            let why = format!(
                "host session {} has ended, run out, or is not this dc's",
                session.id
            );
            self.phase = Phase::Done(Err(ErrorReply::new(ErrorKind::SessionEnded, why)));
            return;
        };
        let row = Box::new(row);
        self.connect.set_holder_session(Some(row.clone()));
        self.session_row = Some(row);
        self.phase = match first {
            true => Phase::Covering { from: self.started },
            false if self.session_create.is_some() => Phase::Recreating,
            false => Phase::Connecting,
        };
    }

    /// The answer to the [`Effect::Global`] asked. A global entry read
    /// counts as this DC's own read (its cache holds only what the store said).
    fn handle_global(&mut self, answer: GlobalAnswer) {
        match answer {
            GlobalAnswer::Entry(entry) => self.connect.handle_global(entry, Source::Local),
            GlobalAnswer::SetIfAbsent(existing) => {
                // Inserted, or a retried write of our own entry: the slot is
                // kept. Either way a next create is admitted anew.
                let ours = existing.is_none() || existing.as_ref() == self.connect.creating();
                self.settle_quota(ours);
                self.connect.handle_set_if_absent(existing);
            }
            GlobalAnswer::Successor {
                succession,
                source,
                hint,
            } => self.connect.handle_successor(succession, hint, source),
            GlobalAnswer::Confirmed(recorded) => self.connect.handle_confirmed(recorded),
            GlobalAnswer::DcLease(state) => self.connect.handle_dc_lease(state),
            GlobalAnswer::TakenOver(reply) => self.connect.handle_taken_over(reply),
            other @ GlobalAnswer::Successions(_) => unasked("acquire", &other),
        }
    }

    /// What the DC of the reservation [`Effect::Segment`] asked about
    /// answered at `now`, or why it did not. An owner that disowns it
    /// ([`Failure::disowns`]) sends a walk from a shortcut back to the
    /// global entry; any other failure is the connect's.
    fn handle_segment(&mut self, now: NodeTime, answer: Result<Segment, Failure>) {
        let ConnectPoll::Need(ConnectNeed::Reservation(id)) = self.connect.poll() else {
            panic!(
                "acquire of {}: a segment it did not ask for",
                self.request.key
            );
        };
        let source = Source::of_dc(&self.dc, id.dc());
        match answer {
            Ok(segment) => self.connect.handle_segment(id.dc(), segment, source),
            Err(failure) if failure.disowns() => self.connect.handle_disowned(id.dc(), source),
            Err(failure) => self.handle_failure(now, failure),
        }
    }

    /// What the tail's DC answered at `now` to the [`Effect::Link`]
    /// asked, or why it did not.
    fn handle_linked(&mut self, now: NodeTime, answer: Result<LinkReply, Failure>) {
        debug_assert!(
            matches!(
                self.connect.poll(),
                ConnectPoll::Need(ConnectNeed::Link { .. })
            ),
            "acquire of {}: a link it did not ask for",
            self.request.key
        );
        match answer {
            Ok(reply) => self.connect.handle_link(reply),
            Err(failure) => self.handle_failure(now, failure),
        }
    }

    /// A connect ended with `outcome` at `now`.
    fn connected(&mut self, now: NodeTime, outcome: AcquireReply) {
        let waits = matches!(outcome, AcquireReply::HeldElsewhere(_))
            && !self.last_look
            && self.deadline > now;
        if waits {
            self.awaits += 1;
            self.events.push_back(AcquireEvent::Awaiting);
            self.held = Some(outcome);
            self.phase = Phase::Awaiting;
        } else if matches!(outcome, AcquireReply::Acquired(_)) {
            self.phase = Phase::Granted(outcome);
        } else {
            self.phase = self.done_with(outcome);
        }
    }

    /// The answer `outcome`, after noting the chain's new member if this
    /// connect linked it and the key's entry is this DC's (another DC's
    /// entry the driver tells: [`NodeEvent::Shortcut`]).
    fn done_with(&mut self, outcome: AcquireReply) -> Phase {
        let notice = self.connect.take_notice();
        match notice {
            Some(notice) if notice.entry.dc() == &self.dc => {
                self.events.push_back(AcquireEvent::ShortcutNoted);
                let change = Change::Shortcut {
                    key: notice.key,
                    shortcut: notice.shortcut,
                };
                let (dc, policy) = (self.dc.clone(), self.policy);
                let update = Update::new(dc, notice.entry, change, policy, self.mutations);
                Phase::Updating {
                    update: Box::new(update),
                    outcome,
                    why: Trailing::Shortcut,
                }
            }
            other => {
                self.notice = other;
                Phase::Done(Ok(outcome))
            }
        }
    }

    /// A trailing change `why` ended with `result`: what comes next.
    fn updated(
        &mut self,
        why: Trailing,
        outcome: AcquireReply,
        result: Result<(), ErrorReply>,
    ) -> Phase {
        match (why, result) {
            (Trailing::Cancel, Ok(())) => self.done_with(outcome),
            (Trailing::Cancel, Err(e)) => Phase::Done(Err(e)),
            (Trailing::Shortcut, result) => {
                if result.is_err() {
                    self.events.push_back(AcquireEvent::ShortcutNotNoted);
                }
                Phase::Done(Ok(outcome))
            }
        }
    }

    /// The answer to [`Effect::Cancellation`]: whether the host gave up
    /// on this acquire. A cancelled grant is released before the answer
    /// (the host never sees it; the answer is the grant, released).
    fn handle_cancelled(&mut self, cancelled: bool) {
        let Phase::Granted(outcome) = std::mem::replace(&mut self.phase, Phase::Over) else {
            panic!(
                "acquire of {}: a cancellation it did not ask about",
                self.request.key
            );
        };
        self.phase = match (&outcome, cancelled) {
            (AcquireReply::Acquired(grant), true) => {
                self.events.push_back(AcquireEvent::GrantCancelled);
                let change = Change::Cancel {
                    lease: self.request.lease,
                };
                let id = grant.reservation.clone();
                let update = Update::new(self.dc.clone(), id, change, self.policy, self.mutations);
                Phase::Updating {
                    update: Box::new(update),
                    outcome,
                    why: Trailing::Cancel,
                }
            }
            _ => self.done_with(outcome),
        };
    }

    /// A need of the current connect (or of a trailing change: a cancelled
    /// grant's release, a new member's note) could not be performed at `now`.
    fn handle_failure(&mut self, now: NodeTime, failure: Failure) {
        if matches!(self.phase, Phase::Updating { .. }) {
            let Phase::Updating { outcome, why, .. } =
                std::mem::replace(&mut self.phase, Phase::Over)
            else {
                unreachable!("matched just above")
            };
            self.phase = self.updated(why, outcome, Err(failure.into_reply()));
            return;
        }
        if matches!(self.phase, Phase::Session { .. }) {
            // The session's row could not be read (before the cover, or
            // again after a write lost to its renewal): nothing was
            // written, and the acquire fails as a connect's read would.
            self.phase = Phase::Done(Err(failure.into_reply()));
            return;
        }
        assert!(
            matches!(self.phase, Phase::Connecting),
            "acquire of {}: a failure while not connecting",
            self.request.key
        );
        let unreachable = failure.is_unreachable();
        // A silent DC's reservation: the connect goes on through its
        // succession, or takes it over (DESIGN.md §7.5).
        if unreachable && self.connect.handle_unreachable() {
            return;
        }
        if unreachable && !self.last_look && self.time_for_a_pause(now) {
            self.events.push_back(AcquireEvent::ConnectRetried);
            self.phase = Phase::Paused {
                until: now.plus_ms(AWAIT_RETRY_MS),
                error: Some(failure.into_reply()),
            };
            return;
        }
        if self.awaits > 0 {
            self.events.push_back(match (self.last_look, unreachable) {
                (true, _) => AcquireEvent::LastLookFailed,
                (false, true) => AcquireEvent::WaitEndedByConnectErrorUnavailable,
                (false, false) => AcquireEvent::WaitEndedByConnectError,
            });
        }
        self.phase = Phase::Done(Err(failure.into_reply()));
    }

    /// The await asked for ended at `now` with `result`.
    fn handle_awaited(&mut self, now: NodeTime, result: Result<AwaitReply, Failure>) {
        assert!(
            matches!(self.phase, Phase::Awaiting),
            "acquire of {}: an await it did not ask for",
            self.request.key
        );
        let time_for_a_pause = self.time_for_a_pause(now);
        match result {
            // A wait answered well before its end came from a DC shutting
            // down: its registration is gone, like an unreachable DC's.
            Ok(AwaitReply::TimedOut) if time_for_a_pause => {
                self.events.push_back(AcquireEvent::WaitCutShort);
            }
            // The holder may have changed while we waited: a fresh look answers.
            Ok(AwaitReply::TimedOut) => {
                self.events.push_back(AcquireEvent::WaitTimedOut);
                self.last_look = true;
                return self.reconnect(now);
            }
            Ok(AwaitReply::Vacated { .. } | AwaitReply::Moved) => return self.reconnect(now),
            Err(Failure::Refused(e) | Failure::Lied(e)) => {
                self.events.push_back(AcquireEvent::WaitRefused);
                self.phase = Phase::Done(Err(e));
                return;
            }
            Err(Failure::Unreachable(_)) => {}
        }
        // The holder's DC lost our registration (restart, partition):
        // connect and register again after a pause, if the wait leaves time.
        if !time_for_a_pause {
            self.events
                .push_back(AcquireEvent::WaitLostWithoutTimeToRegisterAgain);
            self.phase = Phase::Done(Ok(self.take_held()));
            return;
        }
        self.events.push_back(AcquireEvent::WaitReregister);
        self.phase = Phase::Paused {
            until: now.plus_ms(AWAIT_RETRY_MS),
            error: None,
        };
    }

    /// This acquire's deadline passed while it waited: it answers
    /// the last `HeldElsewhere` (the driver drops the registration).
    fn handle_deadline(&mut self) {
        assert!(
            matches!(self.phase, Phase::Awaiting),
            "acquire of {}: a deadline while not waiting",
            self.request.key
        );
        self.events.push_back(AcquireEvent::WaitDeadlinePassed);
        self.phase = Phase::Done(Ok(self.take_held()));
    }

    /// The pause ended at `now`: connect again.
    fn handle_resumed(&mut self, now: NodeTime) {
        assert!(
            matches!(self.phase, Phase::Paused { .. }),
            "acquire of {}: a pause's end while not paused",
            self.request.key
        );
        self.reconnect(now);
    }

    /// The DC shuts down during a pause or a wait: answer now (the failure
    /// that caused the pause, or the last `HeldElsewhere`; the driver drops
    /// a registration), so a shutdown never waits out a host's wait.
    fn handle_close(&mut self) {
        self.phase = match std::mem::replace(&mut self.phase, Phase::Over) {
            Phase::Paused { error: Some(e), .. } => Phase::Done(Err(e)),
            Phase::Paused { error: None, .. } => Phase::Done(Ok(self.take_held())),
            Phase::Awaiting => {
                self.events.push_back(AcquireEvent::ClosedWhileWaiting);
                Phase::Done(Ok(self.take_held()))
            }
            _ => panic!("acquire of {}: closed while not paused", self.request.key),
        };
    }

    fn time_for_a_pause(&self, now: NodeTime) -> bool {
        now.plus_ms(AWAIT_RETRY_MS) < self.deadline
    }

    fn take_held(&mut self) -> AcquireReply {
        // Invariant: a wait starts only from a `HeldElsewhere`, kept until it ends.
        self.held
            .take()
            .expect("a waiting acquire keeps its HeldElsewhere")
    }

    /// Connects again, granting from the host's reading plus the time this
    /// DC held the request.
    fn reconnect(&mut self, now: NodeTime) {
        let mut held_ms = now.us_since(self.started) / 1000;
        if self.mutations.has(Mutation::GrantRunsLate) {
            held_ms += GRANT_LATE_MS;
        }
        let waited_on = self.held.as_ref().and_then(member_named);
        self.connect = Connect::new(
            self.dc.clone(),
            self.request.key.clone(),
            self.request.tag.clone(),
            self.request
                .holding(self.request.host_time.plus_ms(held_ms)),
            self.policy,
            self.hop_limit,
        )
        .with_takeover(self.takeover)
        .with_hint(waited_on);
        self.connect.set_holder_session(self.session_row.clone());
        self.phase = Phase::Covering { from: now };
    }

    /// The driver's answer to [`Effect::Cover`] ([`crate::DcLease::grant`]):
    /// a DC lease that does not cover the grant's term ends the acquire with
    /// the refusal (`Unavailable`) — a grant after a wait must not outlive
    /// the DC lease either (DESIGN.md §7.5).
    fn handle_covered(&mut self, covered: Result<(), Failure>) {
        assert!(
            matches!(self.phase, Phase::Covering { .. }),
            "handle_covered without a Cover poll"
        );
        self.phase = match covered {
            Ok(()) => Phase::Connecting,
            Err(refused) => Phase::Done(Err(refused.into_reply())),
        };
    }
}

impl Stepper for Acquire {
    type Output = Result<AcquireReply, ErrorReply>;

    fn step(&mut self, now: NodeTime) -> Step<Self::Output> {
        self.next(now)
    }

    fn answer(&mut self, answer: Answer, now: Now) {
        match answer {
            Answer::Covered(covered) => self.handle_covered(covered),
            Answer::Admitted(Ok(())) => self.handle_admitted(),
            Answer::Stored(Ok(stored)) => self.handle_stored(stored, now.store),
            Answer::Global(Ok(global)) => self.handle_global(global),
            Answer::Admitted(Err(failure))
            | Answer::Stored(Err(failure))
            | Answer::Global(Err(failure)) => self.handle_failure(now.node, failure),
            Answer::Segment(segment) => self.handle_segment(now.node, segment),
            Answer::Linked(linked) => self.handle_linked(now.node, linked),
            Answer::Awaited(awaited) => self.handle_awaited(now.node, awaited),
            Answer::TimedOut => self.handle_deadline(),
            Answer::Resumed => self.handle_resumed(now.node),
            Answer::Closed => self.handle_close(),
            Answer::Cancelled(cancelled) => self.handle_cancelled(cancelled),
            other @ (Answer::Forwarded(_)
            | Answer::Queued(_)
            | Answer::Woken(_)
            | Answer::LogMoved(_)
            | Answer::ForTails(_)) => unasked("acquire", &other),
        }
    }

    fn poll_event(&mut self) -> Option<NodeEvent> {
        match self.events.pop_front() {
            Some(event) => Some(NodeEvent::Acquire(event)),
            None => self.outcome_events.pop_front(),
        }
    }
}

/// The member of the key's chain an acquire's outcome names (the tail it
/// was granted or found held): what a driver remembers as the next walk's
/// hint. A member stays a member forever, so the hint is never wrong, only
/// possibly behind.
pub fn member_named(reply: &AcquireReply) -> Option<Shortcut> {
    match reply {
        AcquireReply::Acquired(grant) => Some(Shortcut {
            to: grant.reservation.clone(),
            token: grant.token,
        }),
        AcquireReply::HeldElsewhere(holder) => Some(Shortcut {
            to: holder.reservation.clone(),
            token: holder.token,
        }),
        AcquireReply::TagMismatch { .. } => None,
    }
}
