//! `HostAgent`: what runs beside an actor on a host. It acquires the key's
//! lease from its own DC, renews it on the daemon's timeline, and tells the
//! actor when to stop.
//!
//! The lease's rules — the timeline a grant gives, renewals bounded by the
//! soft deadline, when to soft- and hard-terminate, what each renewal answer
//! means, a grant that arrives too late to start on — are homing-core's
//! [`HostLease`] (see `homing_core::host_lease`), which the simulator's hosts
//! run too; this module performs them with QUIC, `tokio::time` and the actor.
//!
//! Clocks: the agent sends its host clock ([`HostClock`]) with every acquire
//! and renew, and the daemon answers with deadlines in that clock. The agent
//! never compares them with anything but the reading it sent: a deadline `d`
//! answering a request sent at host time `t` and monotonic instant `i` fires
//! at `i + (d - t)` on `tokio::time`, so a paused tokio clock drives it
//! deterministically and a host clock that jumps cannot stretch a lease.
//! A grant that arrives at or after its soft deadline is released at once and
//! the start fails as `Unavailable`: no actor runs on it.
//!
//! Lease key (DESIGN.md §7.3): each start draws 128 random bits (and, for a
//! config without a key name, the name too) and sends them with every try
//! of its acquire, every renewal and the release. An acquire whose reply is
//! lost is sent again (up to [`HostAgentConfig::acquire_attempts`] in all)
//! and the DC answers the retry with the same grant; one that never gets an
//! answer is cancelled by its lease key, so no grant the host never saw
//! stays a phantom holder.

use homing_core::owed_cancel::{CancelAnswer, OwedCancel};
use homing_core::{AcquireReply, Grant};
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use homing_core::host_lease::{HardCause, LateGrant, Renewal};
use homing_core::{
    ActorId, DcId, ErrorReply, FailureReason, FencingToken, HostInstant, HostLease, HostLeasePoll,
    HostTime, Key, KeyConfig, KeyName, LeaseKey, PreviousRun, ReleaseReply, Reply, Request,
    ReservationId, RunOutcome,
};
use homing_net::{Client, Peer};
use thiserror::Error;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tracing::{debug, info, warn};

pub use homing_core::host_lease::ACQUIRE_ATTEMPTS_DEFAULT;
/// Default timeout of one acquire, renew or release, in milliseconds.
pub use homing_core::host_lease::REQUEST_TIMEOUT_MS_DEFAULT as AGENT_REQUEST_TIMEOUT_MS_DEFAULT;
/// Default wait between failed renewals, in milliseconds.
pub const RETRY_INTERVAL_MS_DEFAULT: u64 = 250;
/// Smallest accepted retry interval, in milliseconds: bounds the renewal rate
/// of a host whose DC keeps failing fast.
pub const RETRY_INTERVAL_MS_MIN: u64 = 10;

/// The actor a [`HostAgent`] guards. Called from the agent's task: return
/// quickly (spawn the real work) and never block.
pub trait Actor: Send + Sync + 'static {
    /// The lease could not be renewed in time (or the key is drained): stop
    /// accepting work and wind down; [`Actor::on_hard_terminate`] follows.
    /// Called at most once.
    fn on_soft_terminate(&self);
    /// The lease is (or may be) lost: stop now and make no more writes under
    /// this fencing token. Called at most once, after the soft call unless the
    /// DC answered that another holder may exist.
    fn on_hard_terminate(&self);
}

/// A host's own clock, read when a request is sent. Never compared with a
/// DC's clock: only the deadlines the DC computes from it come back.
pub trait HostClock: Send + Sync + 'static {
    /// The host's time now, in milliseconds.
    fn now(&self) -> HostTime;
}

/// The wall clock in milliseconds since the Unix epoch; the default [`HostClock`].
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl HostClock for SystemClock {
    fn now(&self) -> HostTime {
        // A clock before 1970 reads as 0: the deadlines are still relative to it.
        let ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
        HostTime::from_ms(ms)
    }
}

/// How the agent sends lease requests to its DC. [`HostAgent::start`] uses
/// QUIC; tests and simulations inject their own to drive the timeline with
/// a paused clock and no sockets.
#[async_trait]
pub trait LeaseTransport: Send + Sync + 'static {
    /// Sends `request` to the agent's DC. `Err` (with a reason) means no
    /// answer arrived; the agent bounds every call with its request timeout.
    async fn send(&self, request: Request) -> Result<Reply, String>;
}

/// [`LeaseTransport`] over a homing-net [`Client`] with a host identity, to
/// one of the DC's homingd: a request that ends without an answer (no reply
/// in time, a lost connection, or given up by the agent) sends the next
/// one to the DC's next homingd, so the agent's own retry goes there.
#[derive(Clone)]
pub struct QuicTransport {
    client: Client,
    /// The DC's homingd, in the order they are tried.
    instances: Arc<[Peer]>,
    /// The one asked now (an index into `instances`).
    current: Arc<AtomicUsize>,
}

impl QuicTransport {
    /// Sends through `client` (a host certificate of `dc.dc`) to `dc`, or,
    /// once it gives no answer, to each of `alternates` (other homingd of
    /// the same DC) in turn.
    pub fn new(client: Client, dc: Peer, alternates: &[SocketAddr]) -> QuicTransport {
        let mut instances = vec![dc.clone()];
        instances.extend(alternates.iter().map(|addr| Peer {
            addr: *addr,
            dc: dc.dc.clone(),
        }));
        QuicTransport {
            client,
            instances: instances.into(),
            current: Arc::new(AtomicUsize::new(0)),
        }
    }
}

/// A request to one homingd under way: unless it ends answered, the next
/// request goes to the next homingd (a drop counts as no answer: the agent
/// gave up on it at its request timeout).
struct Asking<'a> {
    transport: &'a QuicTransport,
    index: usize,
    answered: bool,
}

impl Drop for Asking<'_> {
    fn drop(&mut self) {
        let transport = self.transport;
        if !self.answered && transport.instances.len() > 1 {
            let next = (self.index + 1) % transport.instances.len();
            // Only if no other request moved on already.
            let _ = transport.current.compare_exchange(
                self.index,
                next,
                Ordering::Relaxed,
                Ordering::Relaxed,
            );
        }
    }
}

#[async_trait]
impl LeaseTransport for QuicTransport {
    async fn send(&self, request: Request) -> Result<Reply, String> {
        let index = self.current.load(Ordering::Relaxed) % self.instances.len();
        let mut asking = Asking {
            transport: self,
            index,
            answered: false,
        };
        let outcome = self.client.request(&self.instances[index], &request).await;
        asking.answered = match &outcome {
            Ok(_) => true,
            Err(e) => e.reached_peer() == Some(true),
        };
        outcome.map_err(|e| e.to_string())
    }
}

/// What a [`HostAgent`] needs to know.
#[derive(Debug, Clone)]
pub struct HostAgentConfig {
    /// The host's own DC (its homingd); hosts may only hold leases there.
    pub dc: Peer,
    /// Other homingd of the same DC (several may serve it over a shared DC
    /// store): after a request `dc` did not answer, the agent's next try
    /// goes to the next of these, and so on in turn.
    pub alternates: Vec<SocketAddr>,
    /// The key to hold, its namespace and tag.
    pub key: KeyConfig,
    /// The actor this host runs (e.g. the address it answers on).
    pub actor: ActorId,
    /// Timeout of one acquire, renew or release, in milliseconds.
    pub request_timeout_ms: u64,
    /// How many times one acquire is sent when no answer arrives in time
    /// (at least 1); the same lease key every time, then a cancel.
    pub acquire_attempts: u32,
    /// Wait between failed renewals, in milliseconds (at least
    /// [`RETRY_INTERVAL_MS_MIN`]).
    pub retry_interval_ms: u64,
    /// When a live actor holds the key, how long the acquire waits for it to
    /// release or expire before answering `HeldElsewhere` (≤
    /// [`homing_core::wire::WAIT_MS_MAX`]); `0` answers at once.
    pub wait_ms: u32,
}

impl HostAgentConfig {
    /// Default timeouts for holding `key` for `actor` at `dc`.
    pub fn new(dc: Peer, key: KeyConfig, actor: ActorId) -> HostAgentConfig {
        HostAgentConfig {
            dc,
            alternates: Vec::new(),
            key,
            actor,
            request_timeout_ms: AGENT_REQUEST_TIMEOUT_MS_DEFAULT,
            acquire_attempts: ACQUIRE_ATTEMPTS_DEFAULT,
            retry_interval_ms: RETRY_INTERVAL_MS_DEFAULT,
            wait_ms: 0,
        }
    }
}

/// Where the agent's lease is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AgentState {
    /// The lease is held (and renewed, unless draining).
    Holding,
    /// [`Actor::on_soft_terminate`] was called; the hard deadline follows.
    SoftTerminated,
    /// [`Actor::on_hard_terminate`] was called; the lease is gone.
    HardTerminated,
    /// [`HostAgent::stop`] released the lease.
    Released,
}

/// What connecting to the key gave: the acquire's reply, with a running
/// [`HostAgent`] when this host won (run the actor, write with [`HostAgent::token`]).
pub type Started = AcquireReply<HostAgent>;

/// Why an agent operation failed; each variant is a different host action.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum AgentError {
    /// The DC did not answer within the request timeout: retry later.
    #[error("dc {dc} unavailable: {reason}")]
    Unavailable {
        /// The DC.
        dc: DcId,
        /// Why.
        reason: String,
    },
    /// The DC refused the request (unauthorized, bad request, overloaded, …).
    #[error("dc {dc} refused: {error}")]
    Refused {
        /// The DC.
        dc: DcId,
        /// Its answer.
        error: ErrorReply,
    },
    /// Release: the token is no longer the holder's; someone else holds the key.
    #[error("stale token: the key's current token is {current}")]
    StaleToken {
        /// The current token.
        current: FencingToken,
    },
    /// Release: the DC does not recognise this agent's lease key as the
    /// holder's (nothing changed).
    #[error("not the holder: the dc refused this agent's lease key")]
    NotHolder,
    /// The DC answered with a reply that does not fit the request.
    #[error("dc {dc} answered {reply} to {request}")]
    Unexpected {
        /// The DC.
        dc: DcId,
        /// The request kind.
        request: &'static str,
        /// The reply, shortened.
        reply: String,
    },
    /// The configuration cannot work (names the field).
    #[error("invalid host agent config: {0}")]
    Config(&'static str),
}

/// The host side of one lease. See the module docs.
///
/// Dropped without [`HostAgent::stop`], the agent stops renewing but still
/// terminates the actor at the deadlines already held: an actor is never left
/// running on a lease nobody renews.
///
/// ```no_run
/// # async fn example(client: homing_net::Client, own_dc: homing_net::Peer,
/// #     actor: std::sync::Arc<dyn homing_client::Actor>) -> Result<(), Box<dyn std::error::Error>> {
/// use homing_client::{HostAgent, HostAgentConfig};
/// use homing_core::{AcquireReply, ActorId, KeyConfig, KeyName};
/// // `client` presents a host certificate of `own_dc`.
/// let config = HostAgentConfig::new(own_dc, KeyConfig::named(KeyName::new("room-42")?),
///     ActorId::new("10.0.3.9:9000")?);
/// if let AcquireReply::Acquired(agent) = HostAgent::start(client, config, actor).await? {
///     // … run the actor, writing with agent.token(), until it is done or
///     // agent.state() (or agent.watch_state()) leaves `Holding`; then release:
///     agent.stop().await?;
/// }
/// # Ok(()) }
/// ```
pub struct HostAgent {
    key: Key,
    reservation: ReservationId,
    token: FencingToken,
    lease_key: LeaseKey,
    previous: Option<PreviousRun>,
    state: Arc<watch::Sender<AgentState>>,
    command: watch::Sender<Command>,
    task: Option<JoinHandle<()>>,
    channel: Arc<DcChannel>,
}

impl std::fmt::Debug for HostAgent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostAgent")
            .field("reservation", &self.reservation)
            .field("token", &self.token)
            .finish()
    }
}

/// What the owner wants of the renewal task.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Command {
    Run,
    /// Exit without calling the actor: `stop` releases the lease next.
    Exit,
}

/// How the agent reaches its DC, with the bounds every request gets.
#[derive(Clone)]
pub(crate) struct DcChannel {
    pub(crate) transport: Arc<dyn LeaseTransport>,
    pub(crate) clock: Arc<dyn HostClock>,
    pub(crate) dc: DcId,
    pub(crate) request_timeout: Duration,
    /// How many homingd serve the DC (the configured one and its
    /// alternates): a request that must land tries each once.
    pub(crate) instances: usize,
}

/// A host's bounds on its requests, as configured.
pub(crate) struct Bounds {
    pub(crate) request_timeout_ms: u64,
    pub(crate) acquire_attempts: u32,
    pub(crate) retry_interval_ms: u64,
}

impl DcChannel {
    /// The channel to DC `dc` (served by one homingd and `alternates`
    /// more), once `bounds` are checked.
    pub(crate) fn new(
        transport: Arc<dyn LeaseTransport>,
        clock: Arc<dyn HostClock>,
        dc: &DcId,
        alternates: usize,
        bounds: Bounds,
    ) -> Result<DcChannel, AgentError> {
        if bounds.request_timeout_ms == 0 {
            return Err(AgentError::Config("request_timeout_ms must be at least 1"));
        }
        if bounds.acquire_attempts == 0 {
            return Err(AgentError::Config("acquire_attempts must be at least 1"));
        }
        if bounds.retry_interval_ms < RETRY_INTERVAL_MS_MIN {
            return Err(AgentError::Config(
                "retry_interval_ms must be at least RETRY_INTERVAL_MS_MIN",
            ));
        }
        Ok(DcChannel {
            transport,
            clock,
            dc: dc.clone(),
            request_timeout: Duration::from_millis(bounds.request_timeout_ms),
            instances: 1 + alternates,
        })
    }

    /// Sends `request`, bounded by the request timeout and by `by` if given.
    /// A request that asks to wait (`wait_ms`) gets that much more time.
    pub(crate) async fn ask(
        &self,
        request: Request,
        by: Option<Instant>,
    ) -> Result<Reply, AgentError> {
        let kind = request.kind();
        let parked = Duration::from_millis(u64::from(request.wait_ms()));
        let mut until = Instant::now() + self.request_timeout + parked;
        if let Some(by) = by {
            until = until.min(by);
        }
        let reply = tokio::time::timeout_at(until, self.transport.send(request)).await;
        match reply {
            Err(_) => Err(self.unavailable(format!("{kind}: no answer in time"))),
            Ok(Err(reason)) => Err(self.unavailable(reason)),
            Ok(Ok(Reply::Error(error))) => Err(AgentError::Refused {
                dc: self.dc.clone(),
                error,
            }),
            Ok(Ok(reply)) => Ok(reply),
        }
    }

    pub(crate) fn unavailable(&self, reason: String) -> AgentError {
        AgentError::Unavailable {
            dc: self.dc.clone(),
            reason,
        }
    }

    pub(crate) fn unexpected(&self, request: &'static str, reply: &Reply) -> AgentError {
        AgentError::Unexpected {
            dc: self.dc.clone(),
            request,
            reply: format!("{reply:?}").chars().take(200).collect(),
        }
    }
}

impl HostAgent {
    /// Connects to the key at `config.dc` over QUIC through `client` (a host
    /// certificate of that DC), with the wall clock as host clock. On
    /// `Holding`, a background task renews the lease until [`HostAgent::stop`].
    /// Fails with [`AgentError::Unavailable`] if the DC did not answer and
    /// [`AgentError::Refused`] if it refused.
    pub async fn start(
        client: Client,
        config: HostAgentConfig,
        actor: Arc<dyn Actor>,
    ) -> Result<Started, AgentError> {
        let transport = Arc::new(QuicTransport::new(
            client,
            config.dc.clone(),
            &config.alternates,
        ));
        HostAgent::start_with(transport, Arc::new(SystemClock), config, actor).await
    }

    /// Like [`HostAgent::start`] with an injected transport and host clock
    /// (tests, simulations; `config.dc.addr` is then unused).
    pub async fn start_with(
        transport: Arc<dyn LeaseTransport>,
        clock: Arc<dyn HostClock>,
        config: HostAgentConfig,
        actor: Arc<dyn Actor>,
    ) -> Result<Started, AgentError> {
        let channel = Arc::new(DcChannel::new(
            transport,
            clock,
            &config.dc.dc,
            config.alternates.len(),
            Bounds {
                request_timeout_ms: config.request_timeout_ms,
                acquire_attempts: config.acquire_attempts,
                retry_interval_ms: config.retry_interval_ms,
            },
        )?);
        let mut key_config = config.key.clone();
        let name = match key_config.name.clone() {
            Some(name) => name,
            // Named here, not by the DC: every try must ask for the same key.
            None => KeyName::random(u128::from_le_bytes(random_bytes()?)),
        };
        key_config.name = Some(name.clone());
        let lease_key = new_lease_key()?;
        let (reply, sent, sent_at) =
            acquire_once(&channel, &config, &key_config, lease_key).await?;
        let reply = match reply {
            Reply::Acquire(reply) => reply,
            other => return Err(channel.unexpected("acquire", &other)),
        };
        let Grant {
            key,
            reservation,
            token,
            deadlines,
            previous,
        } = match reply.into_grant() {
            Ok(grant) => grant,
            Err(elsewhere) => return Ok(elsewhere),
        };
        let clock = MonoClock { epoch: sent_at };
        let lease = match HostLease::start(
            &deadlines,
            sent,
            clock.instant(sent_at),
            clock.instant(Instant::now()),
            config.retry_interval_ms,
        ) {
            Ok(lease) => lease,
            Err(LateGrant { .. }) => {
                // The actor would be told to stop before it starts: give the
                // key back and let the caller retry.
                warn!(%key, %reservation, %token, "grant arrived after its soft deadline: releasing it");
                let reason = FailureReason::new("the grant arrived after its soft deadline")
                    .expect("a short printable reason");
                let release = Request::Release {
                    reservation,
                    token,
                    lease: lease_key,
                    outcome: RunOutcome::Failed { reason },
                };
                if let Err(error) = channel.ask(release, None).await {
                    warn!(%error, "releasing the late grant failed: it expires at the dc");
                }
                return Err(channel.unavailable(
                    "the grant arrived after its soft deadline (released it); retry".to_string(),
                ));
            }
        };
        match &previous {
            Some(p) => info!(%key, %reservation, %token, dc = %channel.dc,
                previous = %p.reservation, previous_ended = %p.ended, "lease acquired"),
            None => info!(%key, %reservation, %token, dc = %channel.dc, "lease acquired"),
        }
        let state = Arc::new(watch::Sender::new(AgentState::Holding));
        let (command, command_rx) = watch::channel(Command::Run);
        let renewal = LeaseTask {
            channel: channel.clone(),
            actor,
            reservation: reservation.clone(),
            token,
            lease_key,
            lease,
            clock,
            state: state.clone(),
            command: command_rx,
        };
        let task = tokio::spawn(renewal.run());
        Ok(AcquireReply::Acquired(HostAgent {
            key,
            reservation,
            token,
            lease_key,
            previous,
            state,
            command,
            task: Some(task),
            channel,
        }))
    }

    /// The key held (with its generated name, if the config gave none).
    pub fn key(&self) -> &Key {
        &self.key
    }

    /// The fencing token the actor's writes must carry; constant for the
    /// life of this agent (renewals keep it).
    pub fn token(&self) -> FencingToken {
        self.token
    }

    /// The reservation held.
    pub fn reservation(&self) -> &ReservationId {
        &self.reservation
    }

    /// The run this lease follows and how it ended (`None`: the key's first
    /// holder). `ended` is `Released(Failed { .. })` when the previous
    /// holder said its run failed, `Expired` when it stopped renewing: an
    /// actor may need to recover before serving.
    pub fn previous(&self) -> Option<&PreviousRun> {
        self.previous.as_ref()
    }

    /// Where the lease is now.
    pub fn state(&self) -> AgentState {
        *self.state.borrow()
    }

    /// A receiver of every state change, to await termination.
    pub fn watch_state(&self) -> watch::Receiver<AgentState> {
        self.state.subscribe()
    }

    /// Graceful stop of a run that finished cleanly: [`HostAgent::stop_with`]
    /// of [`RunOutcome::Ok`].
    pub async fn stop(self) -> Result<(), AgentError> {
        self.stop_with(RunOutcome::Ok).await
    }

    /// Graceful stop, once the actor has stopped: ends renewals (without
    /// calling the actor) and releases the lease with this agent's token,
    /// recording `outcome` for the next holder.
    /// A release that gets no answer is sent again to the DC's next
    /// homingd, each at most once (a renewal the stop cut short, or a
    /// homingd gone silent, moves the transport on to the next one).
    /// Fails with [`AgentError::StaleToken`] if another holder has the key by
    /// now (after a try sent again, that may also be because the first try
    /// did release, its answer lost, and a waiter took the key since: either
    /// way this agent no longer holds it), and with `Unavailable` if no
    /// homingd of the DC answered (the
    /// lease then expires at the DC on its own, and the next holder sees
    /// `Expired`).
    pub async fn stop_with(mut self, outcome: RunOutcome) -> Result<(), AgentError> {
        let _ = self.command.send(Command::Exit);
        if let Some(task) = self.task.take() {
            // The task exits at its next await point; a panic in it (an actor
            // callback that panicked) must not stop the release.
            let _ = task.await;
        }
        let request = Request::Release {
            reservation: self.reservation.clone(),
            token: self.token,
            lease: self.lease_key,
            outcome,
        };
        let mut tries = self.channel.instances;
        let reply = loop {
            tries -= 1;
            match self.channel.ask(request.clone(), None).await {
                // Released twice is released: the retry is safe.
                Err(AgentError::Unavailable { .. }) if tries > 0 => continue,
                reply => break reply?,
            }
        };
        match reply {
            Reply::Release(ReleaseReply::Released) => {
                self.state.send_replace(AgentState::Released);
                info!(key = %self.key, reservation = %self.reservation, dc = %self.channel.dc, "lease released");
                Ok(())
            }
            Reply::Release(ReleaseReply::StaleToken { current }) => {
                Err(AgentError::StaleToken { current })
            }
            Reply::Release(ReleaseReply::NotHolder) => Err(AgentError::NotHolder),
            other => Err(self.channel.unexpected("release", &other)),
        }
    }
}

/// One logical acquire: sent up to `config.acquire_attempts` times with the
/// same lease key while no answer arrives; the reply, with the host time
/// and instant its (last) try was sent. When every try went unanswered, the
/// acquire is cancelled by its lease key before the error is returned.
async fn acquire_once(
    channel: &DcChannel,
    config: &HostAgentConfig,
    key_config: &KeyConfig,
    lease: LeaseKey,
) -> Result<(Reply, HostTime, Instant), AgentError> {
    let request = |host_time| Request::Acquire {
        config: key_config.clone(),
        actor: config.actor.clone(),
        lease,
        host_time,
        wait_ms: config.wait_ms,
    };
    send_acquire(channel, config.acquire_attempts, key_config, lease, request).await
}

/// Sends the acquire `request(host_time)` makes up to `attempts` times with
/// the same lease key while no answer arrives (see [`acquire_once`]); every
/// try unanswered, it is cancelled by its lease key.
pub(crate) async fn send_acquire(
    channel: &DcChannel,
    attempts: u32,
    key_config: &KeyConfig,
    lease: LeaseKey,
    request: impl Fn(HostTime) -> Request,
) -> Result<(Reply, HostTime, Instant), AgentError> {
    let mut attempt = 1;
    loop {
        let sent_at = Instant::now();
        let sent = channel.clock.now();
        match channel.ask(request(sent), None).await {
            Ok(reply) => return Ok((reply, sent, sent_at)),
            Err(error @ AgentError::Unavailable { .. }) if attempt < attempts => {
                attempt += 1;
                warn!(%error, attempt, "acquire not answered; sending it again with the same lease key");
            }
            Err(error @ AgentError::Unavailable { .. }) => {
                cancel(channel, key_config, lease).await;
                return Err(error);
            }
            Err(error) => return Err(error),
        }
    }
}

/// Tells the DC this host gave up on the acquire with `lease`, so a grant
/// it never saw is released instead of held until it expires. The first
/// send is awaited; if the DC does not answer it (what made the acquire go
/// unanswered often loses the cancel too), a background task sends it again
/// by homing-core's [`OwedCancel`] until the DC answers or it is owed no
/// more.
async fn cancel(channel: &DcChannel, key_config: &KeyConfig, lease: LeaseKey) {
    let Some(name) = key_config.name.clone() else {
        return;
    };
    let key = Key::in_namespace(key_config.namespace.clone(), name);
    let clock = MonoClock {
        epoch: Instant::now(),
    };
    let mut owed = OwedCancel::new(key, lease, clock.instant(Instant::now()));
    if send_cancel(channel, &mut owed).await == CancelAnswer::Done {
        return;
    }
    let channel = channel.clone();
    tokio::spawn(async move {
        while let Some(at) = owed.unanswered(clock.instant(Instant::now())) {
            tokio::time::sleep_until(clock.at(at)).await;
            if send_cancel(&channel, &mut owed).await == CancelAnswer::Done {
                return;
            }
        }
        warn!(key = %owed.key(), sent = owed.sent(),
            "cancel never answered: a grant, if made, expires at the dc");
    });
}

/// Sends `owed` once; what its answer means.
async fn send_cancel(channel: &DcChannel, owed: &mut OwedCancel) -> CancelAnswer {
    let key = owed.key().clone();
    let sent = owed.sent() + 1;
    let reply = match channel.ask(owed.send(), None).await {
        Ok(reply) => reply,
        Err(AgentError::Refused { error, .. }) => Reply::Error(error),
        Err(error) => {
            warn!(%key, %error, sent, "cancel not answered; sending it again later");
            return CancelAnswer::Again;
        }
    };
    match &reply {
        Reply::Cancelled(true) => {
            info!(%key, sent, "gave up on the acquire; its grant is cancelled")
        }
        Reply::Cancelled(false) => info!(%key, sent, "gave up on the acquire; no grant was made"),
        other => warn!(%key, reply = ?other, sent, "cancel answered with an error"),
    }
    OwedCancel::answered(&reply)
}

/// A fresh lease key for one logical acquire, from the operating system's
/// secure random source (what every acquire of a host sends: HostAgent's,
/// and the `homing` CLI's own).
pub fn new_lease_key() -> Result<LeaseKey, AgentError> {
    LeaseKey::from_bytes(random_bytes()?)
        .ok_or(AgentError::Config("the random source returned zeros"))
}

/// 16 bytes from the operating system's secure random source.
pub(crate) fn random_bytes() -> Result<[u8; 16], AgentError> {
    use ring::rand::SecureRandom;
    let mut bytes = [0u8; 16];
    ring::rand::SystemRandom::new()
        .fill(&mut bytes)
        .map_err(|_| AgentError::Config("the system random source failed"))?;
    Ok(bytes)
}

/// The host's monotonic clock as homing-core's [`HostInstant`]: microseconds
/// of `tokio::time` since the acquire was sent (so a paused tokio clock
/// drives the lease deterministically).
#[derive(Debug, Clone, Copy)]
pub(crate) struct MonoClock {
    pub(crate) epoch: Instant,
}

impl MonoClock {
    pub(crate) fn instant(&self, at: Instant) -> HostInstant {
        let us = at.saturating_duration_since(self.epoch).as_micros();
        HostInstant::from_us(u64::try_from(us).unwrap_or(u64::MAX))
    }

    pub(crate) fn at(&self, instant: HostInstant) -> Instant {
        self.epoch + Duration::from_micros(instant.as_us())
    }
}

/// The background task: drives homing-core's [`HostLease`] (renewals and
/// the stop rules) with the DC channel and the actor.
struct LeaseTask {
    channel: Arc<DcChannel>,
    actor: Arc<dyn Actor>,
    reservation: ReservationId,
    token: FencingToken,
    lease_key: LeaseKey,
    lease: HostLease,
    clock: MonoClock,
    state: Arc<watch::Sender<AgentState>>,
    command: watch::Receiver<Command>,
}

impl LeaseTask {
    async fn run(mut self) {
        let mut owner_gone = false;
        loop {
            let now = self.clock.instant(Instant::now());
            match self.lease.poll(now) {
                HostLeasePoll::HardTerminate(cause) => return self.hard_terminate(cause),
                HostLeasePoll::SoftTerminate => self.soft_terminate(),
                HostLeasePoll::Renew { by } => self.renew(by).await,
                HostLeasePoll::Wait { until } => tokio::select! {
                    _ = tokio::time::sleep_until(self.clock.at(until)) => {}
                    changed = self.command.changed(), if !owner_gone => match changed {
                        Ok(()) if *self.command.borrow() == Command::Exit => return,
                        Ok(()) => {}
                        // The HostAgent was dropped without stop(): nobody will
                        // release, so stop renewing and let the deadlines run out.
                        Err(_) => {
                            owner_gone = true;
                            self.lease.stop_renewing();
                        }
                    },
                },
            }
        }
    }

    /// One renewal, bounded by the soft deadline `by`: an answer after it is too late.
    async fn renew(&mut self, by: HostInstant) {
        let sent_at = Instant::now();
        let sent = self.channel.clock.now();
        let request = Request::Renew {
            reservation: self.reservation.clone(),
            token: self.token,
            lease: self.lease_key,
            host_time: sent,
        };
        let reply = tokio::select! {
            reply = self.channel.ask(request, Some(self.clock.at(by))) => reply,
            // stop() must not wait for a slow renewal.
            _ = wait_exit(self.command.clone()) => {
                Err(self.channel.unavailable("renew: the agent is stopping".to_string()))
            }
        };
        let answer = match reply {
            Ok(Reply::Renew(answer)) => Some(answer),
            Ok(other) => {
                let error = self.channel.unexpected("renew", &other);
                warn!(reservation = %self.reservation, %error, "renew failed");
                None
            }
            Err(error) => {
                warn!(reservation = %self.reservation, %error, "renew failed");
                None
            }
        };
        let now = self.clock.instant(Instant::now());
        let (reservation, token) = (&self.reservation, self.token);
        match self
            .lease
            .handle_renew(answer.clone(), sent, self.clock.instant(sent_at), now)
        {
            Renewal::Moved(_) => debug!(%reservation, %token, "lease renewed"),
            Renewal::Draining => {
                info!(%reservation, "key drained: stopping by the current deadlines")
            }
            Renewal::Lost => warn!(%reservation, %token, ?answer, "renew refused"),
            Renewal::Failed { retry_at: None } => {
                warn!(%reservation, "renew failed; the soft deadline comes before a retry")
            }
            Renewal::Failed { .. } => {}
            Renewal::TooLate => debug!(%reservation, "renewal answered after the soft deadline"),
        }
    }

    fn soft_terminate(&self) {
        warn!(reservation = %self.reservation, token = %self.token, "soft terminate");
        self.state.send_replace(AgentState::SoftTerminated);
        self.actor.on_soft_terminate();
    }

    fn hard_terminate(&self, cause: HardCause) {
        warn!(reservation = %self.reservation, token = %self.token, why = cause.as_str(), "hard terminate");
        self.state.send_replace(AgentState::HardTerminated);
        self.actor.on_hard_terminate();
    }
}

/// Resolves once the owner asked the task to exit (never if it was dropped).
async fn wait_exit(mut command: watch::Receiver<Command>) {
    loop {
        if *command.borrow_and_update() == Command::Exit {
            return;
        }
        if command.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}
