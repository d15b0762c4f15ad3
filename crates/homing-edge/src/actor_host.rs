//! `ActorHost`: a tiny actor that runs under a [`HostAgent`]. It binds its
//! listener first, so that its address is its actor id; acquires the key
//! from its own DC; serves while the lease is held; and stops serving at
//! once when the agent hard-terminates it. Every request is answered with
//! `{"dc","reservation","token","actor","key"}`: where the request landed.

use homing_core::AcquireReply;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use homing_client::{Actor, AgentError, HostAgent, HostAgentConfig};
use homing_core::{ActorId, FencingToken, Key, KeyConfig, ReservationId};
use homing_net::{Client, Peer};
use http_body_util::{BodyExt, Full};
use hyper::header::{self, HeaderValue};
use hyper::service::service_fn;
use hyper::{Response, StatusCode};
use thiserror::Error;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tracing::{info, warn};

use crate::config::ServeLimits;
use crate::json;
use crate::listener::{self, Serving, StopSignal};

/// Default time in-flight requests get after a graceful stop, in milliseconds.
pub const DRAIN_MS_DEFAULT: u64 = 1_000;

/// What an [`ActorHost`] needs.
#[derive(Debug, Clone)]
pub struct ActorHostConfig {
    /// The host's own DC.
    pub dc: Peer,
    /// The key to hold.
    pub key: KeyConfig,
    /// Where to listen; its bound address (port 0 resolved) is the actor id.
    pub listen: SocketAddr,
    /// Time in-flight requests get after [`ActorHost::stop`], in milliseconds.
    pub drain_ms: u64,
    /// Bounds of the listening side.
    pub serve: ServeLimits,
}

impl ActorHostConfig {
    /// Defaults for holding `key` at `dc`, listening on `listen`.
    pub fn new(dc: Peer, key: KeyConfig, listen: SocketAddr) -> ActorHostConfig {
        ActorHostConfig {
            dc,
            key,
            listen,
            drain_ms: DRAIN_MS_DEFAULT,
            serve: ServeLimits::default(),
        }
    }
}

/// Why an actor host could not start.
#[derive(Debug, Error)]
pub enum ActorHostError {
    /// The listen address could not be bound.
    #[error("listen: {0}")]
    Listen(#[from] std::io::Error),
    /// The bound address is not a valid actor id.
    #[error("actor id: {0}")]
    ActorId(#[from] homing_core::LabelError),
    /// The DC did not grant or refused the lease.
    #[error("acquire: {0}")]
    Agent(#[from] AgentError),
}

/// What starting an actor host gave: the acquire's reply, with the serving
/// host when this one won (nothing is served otherwise).
pub type HostStarted = AcquireReply<Box<ActorHost>>;

/// A serving actor host. See the module docs.
pub struct ActorHost {
    agent: HostAgent,
    serving: Serving,
    actor: ActorId,
    drain: Duration,
}

/// The actor side of the lease: a hard termination stops the server now.
struct Terminate {
    stop: StopSignal,
}

impl Actor for Terminate {
    fn on_soft_terminate(&self) {
        // Keep serving until the hard deadline: the lease is still ours.
        warn!("soft terminate: serving until the hard deadline");
    }

    fn on_hard_terminate(&self) {
        warn!("hard terminate: stop serving now");
        self.stop.send_replace(Some(Duration::ZERO));
    }
}

impl std::fmt::Debug for ActorHost {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ActorHost")
            .field("actor", &self.actor)
            .field("reservation", self.agent.reservation())
            .field("token", &self.agent.token())
            .finish()
    }
}

impl ActorHost {
    /// Binds `config.listen`, acquires `config.key` at `config.dc` through
    /// `client` (a host certificate of that DC) with the bound address as
    /// the actor id, and serves while the lease is held.
    pub async fn start(
        client: Client,
        config: ActorHostConfig,
    ) -> Result<HostStarted, ActorHostError> {
        let listener = TcpListener::bind(config.listen).await?;
        let actor = ActorId::new(listener.local_addr()?.to_string())?;
        let (stop, _) = watch::channel(None);
        let stop = Arc::new(stop);
        let terminate = Arc::new(Terminate { stop: stop.clone() });
        let agent_config = HostAgentConfig::new(config.dc.clone(), config.key, actor.clone());
        let agent = match HostAgent::start(client, agent_config, terminate)
            .await?
            .into_grant()
        {
            Ok(agent) => agent,
            Err(elsewhere) => return Ok(elsewhere),
        };
        let landed = Bytes::from(
            json::Object::new()
                .string("dc", config.dc.dc.as_str())
                .string("reservation", &agent.reservation().to_string())
                .number("token", agent.token().get())
                .string("actor", actor.as_str())
                .string("key", &agent.key().to_string())
                .finish(),
        );
        let service = service_fn(move |_request| {
            let landed = landed.clone();
            async move { Ok::<_, Infallible>(landed_response(landed)) }
        });
        let serving = listener::spawn(listener, service, None, config.serve, stop)?;
        info!(key = %agent.key(), reservation = %agent.reservation(), %actor, "actor host serving");
        Ok(AcquireReply::Acquired(Box::new(ActorHost {
            agent,
            serving,
            actor,
            drain: Duration::from_millis(config.drain_ms),
        })))
    }

    /// The address it serves on (its actor id).
    pub fn local_addr(&self) -> SocketAddr {
        self.serving.local_addr()
    }

    /// Its actor id.
    pub fn actor(&self) -> &ActorId {
        &self.actor
    }

    /// The key it holds.
    pub fn key(&self) -> &Key {
        self.agent.key()
    }

    /// The reservation it holds.
    pub fn reservation(&self) -> &ReservationId {
        self.agent.reservation()
    }

    /// Its fencing token.
    pub fn token(&self) -> FencingToken {
        self.agent.token()
    }

    /// Resolves once it stopped serving on its own (hard termination).
    pub async fn terminated(&mut self) {
        self.serving.stopped().await;
    }

    /// Graceful stop: releases the lease first (while still serving, so no
    /// request routed here meanwhile fails), then drains and stops the
    /// server. The server stops even when the release fails; the error says
    /// why (the lease then lapses at the DC on its own).
    pub async fn stop(self) -> Result<(), AgentError> {
        let released = self.agent.stop().await;
        self.serving.stop(self.drain).await;
        released
    }
}

fn landed_response(
    landed: Bytes,
) -> Response<http_body_util::combinators::BoxBody<Bytes, Infallible>> {
    let mut response = Response::new(Full::new(landed).boxed());
    *response.status_mut() = StatusCode::OK;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
}
