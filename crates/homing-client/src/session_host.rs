//! `SessionHost`: a host that holds many keys under one host session. One
//! heartbeat (a session renewal) holds every key acquired under the
//! session; each key keeps its own fencing token and lease key, is released
//! on its own with an outcome, and can be drained on its own at the DC.
//!
//! The rules — the session's timeline, when to renew and stop, what a
//! renewal's notices mean for one key — are homing-core's
//! [`HostSession`] (see `homing_core::host_session`); this module performs
//! them with QUIC, `tokio::time` and the host's actors, as
//! [`crate::HostAgent`] does for a single key. Clocks are as there: every
//! open and renewal carries the host's clock, and the deadlines that come
//! back are timed on `tokio::time` from the instant the request was sent.
//!
//! A key frozen at the DC (drained by an operator) is
//! listed by the next renewal's answer: its actor is told to stop by the
//! deadlines the host held before that answer, then it is released. When
//! the session cannot be renewed in time, every actor is told to stop
//! (soft, then hard), as one lease would be.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use homing_core::host_lease::{HardCause, LateGrant, Renewal};
use homing_core::{
    AcquireReply, ActorId, DcId, FencingToken, Grant, HostSession, HostSessionPoll, HostTime, Key,
    KeyConfig, KeyName, LeaseKey, PreviousRun, ReleaseReply, Reply, Request, ReservationId,
    RunOutcome, SessionId, SessionRenewReply,
};
use homing_net::{Client, Peer};
use tokio::sync::{Notify, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tracing::{debug, info, warn};

use crate::host_agent::{
    AGENT_REQUEST_TIMEOUT_MS_DEFAULT, AgentError, Bounds, DcChannel, HostClock, LeaseTransport,
    MonoClock, QuicTransport, RETRY_INTERVAL_MS_DEFAULT, SystemClock, new_lease_key, random_bytes,
    send_acquire,
};

/// The actors a [`SessionHost`] guards, told when to stop. Called from the
/// session's task: return quickly (spawn the real work) and never block.
pub trait SessionActors: Send + Sync + 'static {
    /// The key was drained at the DC: stop its actor
    /// gracefully; [`SessionActors::on_hard_terminate`] follows.
    fn on_soft_terminate(&self, reservation: &ReservationId);
    /// Stop the key's actor now: no more writes under its token. The
    /// session releases the key next.
    fn on_hard_terminate(&self, reservation: &ReservationId);
    /// The session could not be renewed in time: stop every actor
    /// gracefully. Called at most once.
    fn on_soft_terminate_all(&self);
    /// The session is lost (or may be): stop every actor now. Called at
    /// most once; the session is over.
    fn on_hard_terminate_all(&self);
}

/// What a [`SessionHost`] needs to know.
#[derive(Debug, Clone)]
pub struct SessionHostConfig {
    /// The host's own DC (its homingd).
    pub dc: Peer,
    /// Other homingd of the same DC, tried in turn after one did not answer.
    pub alternates: Vec<std::net::SocketAddr>,
    /// Timeout of one request, in milliseconds.
    pub request_timeout_ms: u64,
    /// How many times one acquire is sent when no answer arrives in time.
    pub acquire_attempts: u32,
    /// Wait between failed renewals, in milliseconds (at least
    /// [`crate::host_agent::RETRY_INTERVAL_MS_MIN`]).
    pub retry_interval_ms: u64,
}

impl SessionHostConfig {
    /// Default timeouts for a session at `dc`.
    pub fn new(dc: Peer) -> SessionHostConfig {
        SessionHostConfig {
            dc,
            alternates: Vec::new(),
            request_timeout_ms: AGENT_REQUEST_TIMEOUT_MS_DEFAULT,
            acquire_attempts: homing_core::host_lease::ACQUIRE_ATTEMPTS_DEFAULT,
            retry_interval_ms: RETRY_INTERVAL_MS_DEFAULT,
        }
    }
}

/// A key held under the session: run its actor, writing with its token.
#[derive(Debug, Clone)]
pub struct SessionLease {
    /// The key (with its generated name, if none was given).
    pub key: Key,
    /// The reservation held.
    pub reservation: ReservationId,
    /// The fencing token its actor's writes carry.
    pub token: FencingToken,
    /// The run this one follows (`None`: the key's first holder).
    pub previous: Option<PreviousRun>,
    lease_key: LeaseKey,
}

/// A key's token and lease key, as the session's task releases it.
#[derive(Debug, Clone)]
struct Held {
    token: FencingToken,
    lease_key: LeaseKey,
}

/// What the session's task and its owner share.
struct Shared {
    machine: HostSession,
    held: HashMap<ReservationId, Held>,
    /// The session is over (hard-terminated): nothing more is held.
    over: bool,
}

/// The host side of one host session. See the module docs.
///
/// Dropped without [`SessionHost::close`], the session stops renewing and
/// its actors are stopped at the deadlines already held.
pub struct SessionHost {
    id: SessionId,
    secret: LeaseKey,
    channel: Arc<DcChannel>,
    attempts: u32,
    shared: Arc<Mutex<Shared>>,
    wake: Arc<Notify>,
    command: watch::Sender<Command>,
    task: Option<JoinHandle<()>>,
}

/// What the owner wants of the session's task.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Command {
    Run,
    /// Exit at once: the owner closes the session at the DC next.
    Close,
    /// The owner is gone: renew no more, stop the actors at the deadlines held.
    Dropped,
}

impl std::fmt::Debug for SessionHost {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SessionHost").field("id", &self.id).finish()
    }
}

fn lock(shared: &Mutex<Shared>) -> std::sync::MutexGuard<'_, Shared> {
    shared.lock().unwrap_or_else(PoisonError::into_inner)
}

impl SessionHost {
    /// Opens a session at `config.dc` over QUIC through `client` (a host
    /// certificate of that DC), with the wall clock as host clock; a
    /// background task renews it until [`SessionHost::close`].
    pub async fn open(
        client: Client,
        config: SessionHostConfig,
        actors: Arc<dyn SessionActors>,
    ) -> Result<SessionHost, AgentError> {
        let transport = Arc::new(QuicTransport::new(
            client,
            config.dc.clone(),
            &config.alternates,
        ));
        SessionHost::open_with(transport, Arc::new(SystemClock), config, actors).await
    }

    /// Like [`SessionHost::open`] with an injected transport and clock.
    pub async fn open_with(
        transport: Arc<dyn LeaseTransport>,
        clock: Arc<dyn HostClock>,
        config: SessionHostConfig,
        actors: Arc<dyn SessionActors>,
    ) -> Result<SessionHost, AgentError> {
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
        let secret = new_lease_key()?;
        let sent_at = Instant::now();
        let sent = channel.clock.now();
        let open = Request::OpenSession {
            secret,
            host_time: sent,
        };
        let (id, deadlines) = match channel.ask(open, None).await? {
            Reply::SessionOpened { session, deadlines } => (session, deadlines),
            other => return Err(channel.unexpected("open_session", &other)),
        };
        let clock = MonoClock { epoch: sent_at };
        let machine = match HostSession::start(
            &deadlines,
            sent,
            clock.instant(sent_at),
            clock.instant(Instant::now()),
            config.retry_interval_ms,
        ) {
            Ok(machine) => machine,
            Err(LateGrant { .. }) => {
                let close = Request::CloseSession {
                    session: id,
                    secret,
                };
                let _ = channel.ask(close, None).await;
                return Err(channel.unavailable(
                    "the session opened after its soft deadline (closed it); retry".to_string(),
                ));
            }
        };
        info!(session = %id, dc = %channel.dc, "host session opened");
        let shared = Arc::new(Mutex::new(Shared {
            machine,
            held: HashMap::new(),
            over: false,
        }));
        let wake = Arc::new(Notify::new());
        let (command, command_rx) = watch::channel(Command::Run);
        let task = SessionTask {
            id: id.clone(),
            secret,
            channel: channel.clone(),
            clock,
            shared: shared.clone(),
            wake: wake.clone(),
            actors,
            command: command_rx,
        };
        let task = tokio::spawn(task.run());
        Ok(SessionHost {
            id,
            secret,
            channel,
            attempts: config.acquire_attempts,
            shared,
            wake,
            command,
            task: Some(task),
        })
    }

    /// The session.
    pub fn id(&self) -> &SessionId {
        &self.id
    }

    /// How many keys the session holds (running or stopping).
    pub fn keys(&self) -> usize {
        lock(&self.shared).machine.keys()
    }

    /// Whether the session is over (its actors were hard-terminated).
    pub fn over(&self) -> bool {
        lock(&self.shared).over
    }

    /// Acquires `key` for `actor` under the session (waiting up to
    /// `wait_ms` for a live holder to go). On `Acquired`, the key lives as
    /// long as the session: run its actor, writing with its token.
    pub async fn acquire(
        &self,
        key: KeyConfig,
        actor: ActorId,
        wait_ms: u32,
    ) -> Result<AcquireReply<SessionLease>, AgentError> {
        let mut key_config = key;
        if key_config.name.is_none() {
            // Named here, not by the DC: every try must ask for the same key.
            key_config.name = Some(KeyName::random(u128::from_le_bytes(random_bytes()?)));
        }
        let lease_key = new_lease_key()?;
        let request = |host_time| Request::AcquireInSession {
            config: key_config.clone(),
            actor: actor.clone(),
            lease: lease_key,
            host_time,
            wait_ms,
            session: self.id.clone(),
            secret: self.secret,
        };
        let (reply, _, _) = send_acquire(
            &self.channel,
            self.attempts,
            &key_config,
            lease_key,
            request,
        )
        .await?;
        let reply = match reply {
            Reply::Acquire(reply) => reply,
            other => return Err(self.channel.unexpected("acquire_in_session", &other)),
        };
        let Grant {
            key,
            reservation,
            token,
            previous,
            ..
        } = match reply.into_grant() {
            Ok(grant) => grant,
            Err(elsewhere) => return Ok(elsewhere),
        };
        let lease = SessionLease {
            key,
            reservation,
            token,
            previous,
            lease_key,
        };
        let held = {
            let mut shared = lock(&self.shared);
            let held = shared.machine.hold(lease.reservation.clone());
            if held.is_ok() {
                let entry = Held { token, lease_key };
                shared.held.insert(lease.reservation.clone(), entry);
            }
            held
        };
        if held.is_err() {
            // The session is stopping (or full): the grant goes back.
            let reason = "the host session is stopping or full";
            warn!(session = %self.id, reservation = %lease.reservation, "{reason}: releasing the grant");
            let _ = release(
                &self.channel,
                &lease.reservation,
                token,
                lease_key,
                RunOutcome::Ok,
            )
            .await;
            return Err(self
                .channel
                .unavailable(format!("{reason}; released the grant")));
        }
        debug!(session = %self.id, key = %lease.key, reservation = %lease.reservation, %token, "acquired under the session");
        self.wake.notify_one();
        Ok(AcquireReply::Acquired(lease))
    }

    /// Releases one key, its actor stopped, recording `outcome` for the
    /// next holder; the other keys of the session go on.
    pub async fn release(
        &self,
        lease: &SessionLease,
        outcome: RunOutcome,
    ) -> Result<(), AgentError> {
        let released = release(
            &self.channel,
            &lease.reservation,
            lease.token,
            lease.lease_key,
            outcome,
        )
        .await;
        let mut shared = lock(&self.shared);
        shared.machine.forget(&lease.reservation);
        shared.held.remove(&lease.reservation);
        released
    }

    /// Stops the session, every actor under it stopped: renewals end and
    /// the DC closes the session, so all its keys are vacant at once (plus
    /// the DC's grace). Fails `Unavailable` if no homingd answered: the
    /// session then expires at the DC on its own.
    pub async fn close(mut self) -> Result<(), AgentError> {
        let _ = self.command.send(Command::Close);
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
        let request = Request::CloseSession {
            session: self.id.clone(),
            secret: self.secret,
        };
        let mut tries = self.channel.instances;
        let reply = loop {
            tries -= 1;
            match self.channel.ask(request.clone(), None).await {
                Err(AgentError::Unavailable { .. }) if tries > 0 => continue,
                reply => break reply?,
            }
        };
        match reply {
            Reply::SessionClosed(closed) => {
                info!(session = %self.id, closed, "host session closed");
                Ok(())
            }
            other => Err(self.channel.unexpected("close_session", &other)),
        }
    }
}

impl Drop for SessionHost {
    fn drop(&mut self) {
        // Unless closed: renewals stop, and the task still stops the
        // actors at the deadlines it holds.
        if self.task.is_some() {
            let _ = self.command.send(Command::Dropped);
        }
    }
}

/// Releases one key with its token and lease key.
async fn release(
    channel: &DcChannel,
    reservation: &ReservationId,
    token: FencingToken,
    lease: LeaseKey,
    outcome: RunOutcome,
) -> Result<(), AgentError> {
    let request = Request::Release {
        reservation: reservation.clone(),
        token,
        lease,
        outcome,
    };
    match channel.ask(request, None).await? {
        Reply::Release(ReleaseReply::Released) => Ok(()),
        Reply::Release(ReleaseReply::StaleToken { current }) => {
            Err(AgentError::StaleToken { current })
        }
        Reply::Release(ReleaseReply::NotHolder) => Err(AgentError::NotHolder),
        other => Err(channel.unexpected("release", &other)),
    }
}

/// The background task: drives homing-core's [`HostSession`] with the DC
/// channel and the actors.
struct SessionTask {
    id: SessionId,
    secret: LeaseKey,
    channel: Arc<DcChannel>,
    clock: MonoClock,
    shared: Arc<Mutex<Shared>>,
    wake: Arc<Notify>,
    actors: Arc<dyn SessionActors>,
    command: watch::Receiver<Command>,
}

impl SessionTask {
    async fn run(mut self) {
        loop {
            let now = self.clock.instant(Instant::now());
            let poll = lock(&self.shared).machine.poll(now);
            match poll {
                HostSessionPoll::HardTerminateAll(cause) => return self.hard_terminate_all(cause),
                HostSessionPoll::SoftTerminateAll => {
                    warn!(session = %self.id, "soft terminate: every actor of the session");
                    self.actors.on_soft_terminate_all();
                }
                HostSessionPoll::SoftTerminateKey(id) => {
                    info!(session = %self.id, reservation = %id, "soft terminate: the key was drained");
                    self.actors.on_soft_terminate(&id);
                }
                HostSessionPoll::HardTerminateKey(id) => self.hard_terminate_key(id).await,
                HostSessionPoll::Renew { by } => {
                    let commands = self.command.clone();
                    let command = tokio::select! {
                        () = self.renew(by) => None,
                        // close() must not wait for a slow renewal.
                        command = wait_command(commands) => Some(command),
                    };
                    if let Some(command) = command
                        && self.obey(command)
                    {
                        return;
                    }
                }
                HostSessionPoll::Wait { until } => tokio::select! {
                    _ = tokio::time::sleep_until(self.clock.at(until)) => {}
                    _ = self.wake.notified() => {}
                    command = wait_command(self.command.clone()) => {
                        if self.obey(command) {
                            return;
                        }
                    }
                },
            }
        }
    }

    /// Acts on the owner's `command`; whether the task exits.
    fn obey(&mut self, command: Command) -> bool {
        match command {
            Command::Close => true,
            Command::Dropped => {
                lock(&self.shared).machine.stop_renewing();
                // From now on only the deadlines wake the task.
                self.command = watch::channel(Command::Run).1;
                false
            }
            Command::Run => false,
        }
    }

    /// One renewal, bounded by the soft deadline `by`.
    async fn renew(&self, by: homing_core::HostInstant) {
        let sent_at = Instant::now();
        let sent: HostTime = self.channel.clock.now();
        let ack = lock(&self.shared).machine.ack();
        let request = Request::RenewSession {
            session: self.id.clone(),
            secret: self.secret,
            host_time: sent,
            ack,
        };
        let reply = self.channel.ask(request, Some(self.clock.at(by))).await;
        let answer = match reply {
            Ok(Reply::SessionRenewed(answer)) => Some(answer),
            Ok(other) => {
                let error = self.channel.unexpected("renew_session", &other);
                warn!(session = %self.id, %error, "session renewal failed");
                None
            }
            Err(error) => {
                warn!(session = %self.id, %error, "session renewal failed");
                None
            }
        };
        let refused = matches!(
            answer,
            Some(SessionRenewReply::Expired | SessionRenewReply::NotHolder)
        );
        let now = self.clock.instant(Instant::now());
        let renewal =
            lock(&self.shared)
                .machine
                .handle_renew(answer, sent, self.clock.instant(sent_at), now);
        match renewal {
            Renewal::Moved(_) => debug!(session = %self.id, "session renewed"),
            Renewal::Lost | Renewal::Draining if refused => {
                warn!(session = %self.id, "session renewal refused: the session is over")
            }
            Renewal::Failed { retry_at: None } => {
                warn!(session = %self.id, "session renewal failed; the soft deadline comes before a retry")
            }
            other => debug!(session = %self.id, ?other, "session renewal"),
        }
    }

    /// A frozen key's hard deadline: its actor stops, then the key is
    /// released (best effort: a frozen key is vacant at its frozen expiry
    /// plus grace anyway).
    async fn hard_terminate_key(&mut self, id: ReservationId) {
        warn!(session = %self.id, reservation = %id, "hard terminate: the key was drained");
        self.actors.on_hard_terminate(&id);
        let held = {
            let mut shared = lock(&self.shared);
            shared.machine.forget(&id);
            shared.held.remove(&id)
        };
        if let Some(Held { token, lease_key }) = held
            && let Err(error) = release(&self.channel, &id, token, lease_key, RunOutcome::Ok).await
        {
            debug!(reservation = %id, %error, "release of a frozen key failed: it expires at the dc");
        }
    }

    fn hard_terminate_all(&self, cause: HardCause) {
        warn!(session = %self.id, why = cause.as_str(), "hard terminate: every actor of the session");
        let mut shared = lock(&self.shared);
        shared.over = true;
        shared.held.clear();
        drop(shared);
        self.actors.on_hard_terminate_all();
    }
}

/// Resolves once the owner asks for something other than `Run` (never
/// if the sender is gone, which `Dropped` announces first).
async fn wait_command(mut command: watch::Receiver<Command>) -> Command {
    loop {
        let now = *command.borrow_and_update();
        if now != Command::Run {
            return now;
        }
        if command.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

impl SessionHost {
    /// The DC serving the session.
    pub fn dc(&self) -> &DcId {
        &self.channel.dc
    }
}
