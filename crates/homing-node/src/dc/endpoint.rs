//! The DC as one endpoint, in the shape of quinn-proto's `Endpoint`: the
//! steppers are its connections, and the endpoint owns what is per DC —
//! which stepper a request arriving here becomes (every request, the four
//! a driver holds something for included), a host's retried acquire joined
//! to the one still running, refusing while the node shuts down, the
//! cancellations an acquire must honour, the DC's [`Memory`] of the
//! global store, its key quota's counts ([`KeyQuota`]) and its parked
//! acquirers ([`Waiters`], [`Endpoint::waiters`]). homingd keeps one `Endpoint` per node (behind a lock), the
//! simulator one per simulated DC (lost in a crash, as homingd's is).
//!
//! A driver hands every request to [`Endpoint::handle_request`] and runs
//! the [`Handling`] it gets; it hands every effect to
//! [`Endpoint::answer_at_once`] first (what the DC answers from its own
//! state: a global operation from memory, a cancellation, a create's
//! admission by the key quota, and from the DC lease the driver lends it, a
//! grant's cover and whether it answers for its tails), performs the rest
//! (an admission whose namespace is not counted yet comes back: count it in
//! the DC store and hand the number to [`Endpoint::counted`]), and hands a global store's answer to [`Endpoint::learn`] and
//! the events a stepper notes to [`Endpoint::note`]. `J` is how the driver
//! answers a retry that joined an acquire ([`Endpoint::acquire_ended`]),
//! `W` how it wakes a parked acquirer: an `Effect::Queue` and every record
//! the DC writes or sees go to the endpoint's [`Waiters`], which decides;
//! the driver delivers the wake-ups it hands back.

use homing_core::{
    DcId, Directory, ErrorKind, ErrorReply, Key, LeaseKey, Namespace, NamespaceScope, Reply,
    Request, ReservationId, ScanCursor, TakeoverPolicy,
};

use crate::dc::cancel::Cancellations;
use crate::dc::dc_lease::LeaseLender;
use crate::dc::key_quota::{Admit, KeyQuota};
use crate::dc::memory::{Memory, MemoryLimits};
use crate::dc::retries::{AcquiresInFlight, Arrival, JOINS_MAX};
use crate::dc::waiters::{WaitLimits, Waiters};
use crate::request::acquire::{Acquire, AcquireRequest, InSession};
use crate::request::await_vacant::AwaitVacant;
use crate::request::scan::DrainScope;
use crate::request::serve::{KEY_RECORDS_PAGE, NodeConfig, Serve};
use crate::request::watch::WatchRead;
use crate::step::effect::{GlobalAnswer, GlobalOp};
use crate::step::event::NodeEvent;
use crate::step::failure::Failure;
use crate::step::time::NodeTime;
use crate::step::{Answer, Effect};
use homing_core::mutation::Mutation;

/// Most events one `Watch` reply reads from the DC's event log (a page
/// every DC store answers).
pub const WATCH_EVENTS_PAGE: usize = 256;

/// How a DC's endpoint is set up.
#[derive(Debug, Clone)]
pub struct EndpointConfig {
    /// Its DC, lease policy, hop limit and mutations.
    pub node: NodeConfig,
    /// When it takes over a silent DC's tails.
    pub takeover: TakeoverPolicy,
    /// What it remembers of the global store.
    pub memory: MemoryLimits,
    /// Keys it may create per namespace (0: unlimited).
    pub keys_per_namespace_max: u64,
    /// How many acquirers may wait, and their hand-off window.
    pub waits: WaitLimits,
}

/// A request's handling at the DC: the stepper that answers it.
#[derive(Debug)]
pub enum Handling {
    /// A host's acquire; its outcome also answers the retries that join it
    /// ([`Endpoint::acquire_ended`]).
    Acquire(Box<Acquire>),
    /// A peer's wait at this DC for its reservation to be vacated.
    Await(Box<AwaitVacant>),
    /// A watcher's read of the DC's event log.
    Watch(Box<WatchRead>),
    /// One page of an operator's drain of a namespace tree.
    DrainScope(Box<DrainScope>),
    /// Every other request.
    Serve(Box<Serve>),
}

/// What the endpoint made of an arriving request.
#[derive(Debug)]
pub enum Dispatch {
    /// Run this stepper; what it ends with is the reply.
    Run(Handling),
    /// A host's retry joined the acquire still running for its lease: that
    /// acquire's reply answers it. Should that acquire end unanswered (its
    /// runner vanished), the driver hands this request back to
    /// [`Endpoint::handle_acquire`].
    Joined(AcquireRequest),
    /// Refused on arrival: the node shuts down (`Unavailable`), or too many
    /// retries wait for one acquire (`Overloaded`).
    Refused(ErrorReply),
    /// Answered on arrival from what the endpoint holds (the DC directory).
    Answered(Reply),
    /// A [`Request::DcReport`]: the driver answers it with what it measures
    /// (its stores' health, its peers' round trips, its lease counts).
    Report,
}

/// One DC's endpoint (see the module doc).
#[derive(Debug)]
pub struct Endpoint<J, W> {
    config: NodeConfig,
    takeover: TakeoverPolicy,
    memory: Memory,
    quota: KeyQuota,
    cancellations: Cancellations,
    acquires: AcquiresInFlight<J>,
    waiters: Waiters<W>,
    /// The DC directory as the driver last read it from the global store.
    directory: Directory,
    closing: bool,
}

impl<J, W> Endpoint<J, W> {
    /// A DC's endpoint with nothing remembered and nothing running.
    pub fn new(config: EndpointConfig) -> Endpoint<J, W> {
        Endpoint {
            waiters: Waiters::new(config.waits, config.node.mutations),
            memory: Memory::new(config.memory, config.node.mutations),
            quota: KeyQuota::new(config.keys_per_namespace_max),
            config: config.node,
            takeover: config.takeover,
            cancellations: Cancellations::default(),
            acquires: AcquiresInFlight::default(),
            directory: Directory::default(),
            closing: false,
        }
    }

    /// Its DC, policy, hop limit and mutations.
    pub fn config(&self) -> &NodeConfig {
        &self.config
    }

    /// The DC's parked acquirers: who waits for which reservation, and
    /// who a record written or seen wakes.
    pub fn waiters(&self) -> &Waiters<W> {
        &self.waiters
    }

    /// The DC's parked acquirers, to register, leave or wake.
    pub fn waiters_mut(&mut self) -> &mut Waiters<W> {
        &mut self.waiters
    }

    /// Takes over a silent DC's tails under `policy` from now on.
    pub fn set_takeover(&mut self, policy: TakeoverPolicy) {
        self.takeover = policy;
    }

    /// The DC directory the driver read from the global store: what a
    /// `Directory` request is answered with from now on.
    pub fn set_directory(&mut self, directory: Directory) {
        self.directory = directory;
    }

    /// The DC directory as last set.
    pub fn directory(&self) -> &Directory {
        &self.directory
    }

    /// The node shuts down: every request arriving from now on is refused.
    pub fn close(&mut self) {
        self.closing = true;
    }

    /// Whether the node shuts down.
    pub fn closing(&self) -> bool {
        self.closing
    }

    /// `request` arrives at `now`, sent by DC `peer`'s node (`None`: by a
    /// host, a router or an operator). `bits`: 128 random bits, drawn only
    /// for an acquire that names no key; `join`: how the driver answers
    /// this request if it joins an acquire already running.
    pub fn handle_request(
        &mut self,
        peer: Option<&DcId>,
        request: Request,
        now: NodeTime,
        bits: impl FnOnce() -> u128,
        join: J,
    ) -> Dispatch {
        if self.closing {
            let dc = self.config.dc.clone();
            let why = format!("dc {dc} shutting down");
            return Dispatch::Refused(ErrorReply::new(ErrorKind::Unavailable { dc }, why));
        }
        let handling = match request {
            Request::Acquire {
                config,
                actor,
                lease,
                host_time,
                wait_ms,
            } => {
                let request = AcquireRequest {
                    key: config.key(bits()),
                    tag: config.tag,
                    actor,
                    lease,
                    host_time,
                    wait_ms,
                    session: None,
                };
                return self.handle_acquire(request, now, join);
            }
            Request::AcquireInSession {
                config,
                actor,
                lease,
                host_time,
                wait_ms,
                session,
                secret,
            } => {
                let request = AcquireRequest {
                    key: config.key(bits()),
                    tag: config.tag,
                    actor,
                    lease,
                    host_time,
                    wait_ms,
                    session: Some(InSession {
                        id: session,
                        secret,
                    }),
                };
                return self.handle_acquire(request, now, join);
            }
            Request::Await {
                reservation,
                wait_ms,
            } => Handling::Await(Box::new(self.await_vacant(reservation, wait_ms, now))),
            Request::Watch {
                scope,
                after,
                wait_ms,
            } => {
                let read = WatchRead::new(scope, after, wait_ms, now, WATCH_EVENTS_PAGE);
                Handling::Watch(Box::new(read.with_mutations(self.config.mutations)))
            }
            Request::DrainScope { scope, after } => {
                Handling::DrainScope(Box::new(self.drain_scope(scope, after)))
            }
            Request::Directory => {
                return Dispatch::Answered(Reply::Directory(self.directory.clone()));
            }
            Request::DcReport => return Dispatch::Report,
            request => Handling::Serve(Box::new(self.serve(peer, request))),
        };
        Dispatch::Run(handling)
    }

    /// `request`, sent by DC `peer`'s node if given, as homing-node's
    /// [`Serve`] answers it (also an operator's own drain at this DC).
    pub fn serve(&mut self, peer: Option<&DcId>, request: Request) -> Serve {
        let memory = &mut self.memory;
        Serve::new(&self.config, peer, request, |key| memory.hint(key))
    }

    /// One page of a drain of `scope`'s live leases at this DC, after
    /// `after` (an operator's `DrainScope` request, or the simulator's
    /// operator draining the whole DC).
    pub fn drain_scope(&self, scope: NamespaceScope, after: Option<ScanCursor>) -> DrainScope {
        let n = &self.config;
        DrainScope::new(
            n.dc.clone(),
            scope,
            after,
            KEY_RECORDS_PAGE,
            n.policy,
            n.mutations,
        )
    }

    /// A host's acquire arrives at `now` (again, after the one it joined
    /// ended unanswered): it runs, joins the one running for its key and
    /// lease key (answered through `join`), or is refused.
    pub fn handle_acquire(&mut self, request: AcquireRequest, now: NodeTime, join: J) -> Dispatch {
        let mut lease = request.lease;
        if self.config.mutations.has(Mutation::RetryJoinsAnyAcquire) {
            lease = self.acquires.any_lease(&request.key).unwrap_or(lease);
        }
        match self.acquires.arrive(&request.key, lease, join) {
            Arrival::Run => {}
            Arrival::Joined => return Dispatch::Joined(request),
            Arrival::Full => {
                let why =
                    format!("more than {JOINS_MAX} retries of one acquire are waiting for it");
                return Dispatch::Refused(ErrorReply::new(ErrorKind::Overloaded, why));
            }
        }
        let hint = self.memory.hint(&request.key);
        let n = &self.config;
        let acquire = Acquire::new(
            n.dc.clone(),
            request,
            now,
            n.policy,
            n.hop_limit,
            n.mutations,
        )
        .with_takeover(self.takeover)
        .with_hint(hint);
        Dispatch::Run(Handling::Acquire(Box::new(acquire)))
    }

    /// The acquire of `key` under `lease` ended (answered, or its runner
    /// vanished): the retries that joined it, in arrival order.
    pub fn acquire_ended(&mut self, key: &Key, lease: LeaseKey) -> Vec<J> {
        self.acquires.finish(key, lease)
    }

    /// A waiter at this DC for `reservation` to be vacated, `wait_ms` at
    /// most from `now`: a peer's `Await`, or an acquire's own wait here.
    pub fn await_vacant(
        &self,
        reservation: ReservationId,
        wait_ms: u32,
        now: NodeTime,
    ) -> AwaitVacant {
        let n = &self.config;
        AwaitVacant::new(&n.dc, reservation, wait_ms, now, n.policy, n.mutations)
    }

    /// The answer to `effect` at `now` if the DC has it — a global
    /// operation its memory answers, a cancellation, and what its DC lease
    /// (`dc_lease`, lent only for them) says: whether it covers a grant,
    /// whether the DC answers for its tails — else the effect back, for the
    /// driver to perform.
    pub fn answer_at_once(
        &mut self,
        effect: Effect,
        now: NodeTime,
        dc_lease: impl LeaseLender,
    ) -> Result<Answer, Effect> {
        match effect {
            Effect::Cover { from } => {
                let ttl_ms = self.config.policy.ttl_ms();
                let dc = &self.config.dc;
                let covered = dc_lease.lend(|lease| lease.grant(dc, from, now, ttl_ms));
                Ok(Answer::Covered(covered))
            }
            Effect::AnswersForTails => Ok(Answer::ForTails(
                dc_lease.lend(|lease| lease.answers_for_tails(now)),
            )),
            Effect::Global(op) => match self.memory.recall(&op, now) {
                Some(recalled) => Ok(Answer::Global(Ok(recalled))),
                None => Err(Effect::Global(op)),
            },
            Effect::Cancellation { lease, note } => Ok(Answer::Cancelled(
                self.cancellations.answer(lease, note, now),
            )),
            Effect::Admit(namespace) => match self.admission(&namespace) {
                Some(answer) => Ok(answer),
                None => Err(Effect::Admit(namespace)),
            },
            effect => Err(effect),
        }
    }

    /// How far a count of a namespace's keys need go (the quota: past it,
    /// the exact number changes nothing).
    pub fn count_bound(&self) -> u64 {
        self.quota.count_bound()
    }

    /// The DC store holds `created` keys this DC created in `namespace`
    /// (counted because an admission came back from
    /// [`Endpoint::answer_at_once`]). A count that lands after the create
    /// that asked for it gave up is kept all the same.
    pub fn counted(&mut self, namespace: &Namespace, created: u64) {
        self.quota.counted(namespace, created);
    }

    /// [`Endpoint::counted`], and the answer to the admission that came back.
    pub fn admit_counted(&mut self, namespace: &Namespace, created: u64) -> Answer {
        self.quota.counted(namespace, created);
        // Invariant: a counted namespace is never asked to be counted again.
        self.admission(namespace)
            .unwrap_or_else(|| unreachable!("key quota: {namespace:?} counted, yet uncounted"))
    }

    /// The key quota's answer to a create in `namespace`; `None`: the
    /// namespace must be counted first.
    fn admission(&mut self, namespace: &Namespace) -> Option<Answer> {
        match self.quota.admit(namespace) {
            Admit::Granted => Some(Answer::Admitted(Ok(()))),
            Admit::Refused(reply) => Some(Answer::Admitted(Err(Failure::from_reply(reply)))),
            Admit::Count => None,
        }
    }

    /// The global store answered `answer` to `op` at `now`: what never
    /// changes is remembered; the answer for the stepper
    /// ([`Memory::learn`]).
    pub fn learn(&mut self, op: &GlobalOp, answer: GlobalAnswer, now: NodeTime) -> GlobalAnswer {
        self.memory.learn(op, answer, now)
    }

    /// A stepper noted `event`: a chain member proved is remembered, a
    /// create's quota slot settled, a closed session's waiters told to
    /// look again. Returns the reservations whose waiters the driver must
    /// rouse (as for a moved hand-off).
    #[must_use = "the waiters of the reservations returned must be roused"]
    pub fn note(&mut self, event: &NodeEvent) -> Vec<ReservationId> {
        match event {
            NodeEvent::Learned { key, member } => self.memory.remember(key, member.clone()),
            NodeEvent::QuotaSettled { namespace, kept } => self.quota.settle(namespace, *kept),
            NodeEvent::SessionClosed(id) => return self.waiters.session_closed(id),
            _ => {}
        }
        Vec::new()
    }
}

#[cfg(test)]
mod tests {
    use homing_core::{ActorId, HostTime, KeyConfig, LeasePolicy};

    use super::*;
    use crate::dc::dc_lease::DcLease;
    use crate::fixture::{NOW, key};
    use homing_core::Mutations;

    fn endpoint() -> Endpoint<u32, u32> {
        Endpoint::new(EndpointConfig {
            node: NodeConfig {
                dc: "iad".parse().unwrap(),
                policy: LeasePolicy::DEFAULT,
                hop_limit: 16,
                mutations: Mutations::NONE,
            },
            takeover: TakeoverPolicy::Automatic,
            memory: MemoryLimits {
                entries: 16,
                absent_ttl_ms: 500,
            },
            keys_per_namespace_max: 2,
            waits: WaitLimits::default(),
        })
    }

    fn acquire(lease: u8) -> Request {
        Request::Acquire {
            config: KeyConfig::named(homing_core::KeyName::new("a").unwrap()),
            actor: ActorId::new("host:1").unwrap(),
            lease: LeaseKey::from_bytes([lease; 16]).unwrap(),
            host_time: HostTime::from_ms(1),
            wait_ms: 0,
        }
    }

    /// A DC lease never renewed: it covers nothing.
    fn dc_lease() -> DcLease {
        let terms = homing_core::DcTerms {
            ttl_ms: 20_000,
            host_lease_ttl_max_ms: 10_000,
            grace_ms: 2_000,
        };
        DcLease::new(terms, 2_000)
    }

    fn arrive(endpoint: &mut Endpoint<u32, u32>, request: Request, join: u32) -> Dispatch {
        endpoint.handle_request(None, request, NOW.node, || 7, join)
    }

    #[test]
    fn a_retry_joins_its_own_acquire_and_only_its_own() {
        let mut endpoint = endpoint();
        assert!(matches!(
            arrive(&mut endpoint, acquire(1), 0),
            Dispatch::Run(Handling::Acquire(_))
        ));
        assert!(matches!(
            arrive(&mut endpoint, acquire(1), 1),
            Dispatch::Joined(_)
        ));
        // Another host's acquire of the same key runs on its own.
        assert!(matches!(
            arrive(&mut endpoint, acquire(2), 2),
            Dispatch::Run(Handling::Acquire(_))
        ));
        let lease = LeaseKey::from_bytes([1; 16]).unwrap();
        assert_eq!(endpoint.acquire_ended(&key(), lease), vec![1]);
        // Ended: the next try runs again.
        assert!(matches!(
            arrive(&mut endpoint, acquire(1), 3),
            Dispatch::Run(Handling::Acquire(_))
        ));
    }

    #[test]
    fn the_key_quota_counts_once_admits_up_to_its_max_and_takes_back_a_given_back_slot() {
        let mut endpoint = endpoint();
        let namespace = key().namespace;
        let admit = || Effect::Admit(key().namespace);
        let at_once = |endpoint: &mut Endpoint<u32, u32>| {
            endpoint.answer_at_once(admit(), NOW.node, &dc_lease())
        };
        // Not counted yet: the driver counts the DC store (one key there).
        assert!(matches!(at_once(&mut endpoint), Err(Effect::Admit(_))));
        assert_eq!(endpoint.count_bound(), 2);
        let first = endpoint.admit_counted(&namespace, 1);
        assert!(matches!(first, Answer::Admitted(Ok(()))));
        // Two keys with the one admitted: full.
        let Ok(Answer::Admitted(Err(refused))) = at_once(&mut endpoint) else {
            panic!("a full namespace refuses a create")
        };
        assert!(matches!(
            refused.into_reply().kind,
            ErrorKind::QuotaExceeded { keys_max: 2 }
        ));
        // The admitted create lost its race: its slot is given back.
        let kept = false;
        let namespace = namespace.clone();
        let _ = endpoint.note(&NodeEvent::QuotaSettled { namespace, kept });
        assert!(matches!(
            at_once(&mut endpoint),
            Ok(Answer::Admitted(Ok(())))
        ));
    }

    #[test]
    fn too_many_retries_of_one_acquire_are_refused() {
        let mut endpoint = endpoint();
        arrive(&mut endpoint, acquire(1), 0);
        for join in 1..=JOINS_MAX as u32 {
            assert!(matches!(
                arrive(&mut endpoint, acquire(1), join),
                Dispatch::Joined(_)
            ));
        }
        let Dispatch::Refused(e) = arrive(&mut endpoint, acquire(1), 99) else {
            panic!("a retry past JOINS_MAX is refused");
        };
        assert_eq!(e.kind, ErrorKind::Overloaded);
    }

    #[test]
    fn a_closing_node_refuses_every_request_as_unavailable() {
        let mut endpoint = endpoint();
        endpoint.close();
        for request in [acquire(1), Request::Resolve { key: key() }] {
            let Dispatch::Refused(e) = arrive(&mut endpoint, request, 0) else {
                panic!("refused while closing");
            };
            assert!(matches!(e.kind, ErrorKind::Unavailable { .. }), "{e:?}");
        }
    }

    #[test]
    fn every_request_has_a_stepper() {
        let mut endpoint = endpoint();
        let resolve = arrive(&mut endpoint, Request::Resolve { key: key() }, 0);
        assert!(matches!(resolve, Dispatch::Run(Handling::Serve(_))));
        let wait = Request::Await {
            reservation: "iad.1".parse().unwrap(),
            wait_ms: 10,
        };
        assert!(matches!(
            arrive(&mut endpoint, wait, 0),
            Dispatch::Run(Handling::Await(_))
        ));
        let watch = Request::Watch {
            scope: homing_core::NamespaceScope::everything(),
            after: homing_core::EventSeq::default(),
            wait_ms: 0,
        };
        let watched = arrive(&mut endpoint, watch, 0);
        assert!(matches!(watched, Dispatch::Run(Handling::Watch(_))));
        let drain = Request::DrainScope {
            scope: homing_core::NamespaceScope::everything(),
            after: None,
        };
        let paged = arrive(&mut endpoint, drain, 0);
        assert!(matches!(paged, Dispatch::Run(Handling::DrainScope(_))));
    }

    #[test]
    fn the_dc_lease_lent_answers_cover_and_tails() {
        let mut endpoint = endpoint();
        let cover = Effect::Cover { from: NOW.node };
        let Ok(Answer::Covered(Err(refused))) =
            endpoint.answer_at_once(cover, NOW.node, &dc_lease())
        else {
            panic!("a lease never renewed covers no grant");
        };
        assert!(refused.is_unreachable());
        let tails = endpoint.answer_at_once(Effect::AnswersForTails, NOW.node, &dc_lease());
        assert_eq!(tails, Ok(Answer::ForTails(false)));
    }

    #[test]
    fn a_cancellation_and_a_remembered_entry_are_answered_at_once_a_store_read_is_not() {
        let mut endpoint = endpoint();
        let lease = LeaseKey::from_bytes([1; 16]).unwrap();
        let ask = Effect::Cancellation { lease, note: false };
        assert_eq!(
            endpoint.answer_at_once(ask.clone(), NOW.node, &dc_lease()),
            Ok(Answer::Cancelled(false))
        );
        let note = Effect::Cancellation { lease, note: true };
        assert_eq!(
            endpoint.answer_at_once(note, NOW.node, &dc_lease()),
            Ok(Answer::Cancelled(true))
        );
        assert_eq!(
            endpoint.answer_at_once(ask, NOW.node, &dc_lease()),
            Ok(Answer::Cancelled(true))
        );

        let read = GlobalOp::Entry {
            key: key(),
            read: crate::GlobalRead::Latest,
        };
        let effect = Effect::Global(read.clone());
        assert_eq!(
            endpoint.answer_at_once(effect.clone(), NOW.node, &dc_lease()),
            Err(effect.clone())
        );
        let entry = GlobalAnswer::Entry(Some("fra.1".parse().unwrap()));
        endpoint.learn(&read, entry.clone(), NOW.node);
        assert_eq!(
            endpoint.answer_at_once(effect, NOW.node, &dc_lease()),
            Ok(Answer::Global(Ok(entry)))
        );
    }
}
