//! homing-client: what runs outside the DCs.
//!
//! - [`Resolver`] — embedded by edge routers: which DC hosts a key's actor,
//!   from cache in one lookup, or by walking the reservation chain.
//! - [`HostAgent`] — runs beside an actor on a host: holds its lease (waiting
//!   for a busy key if asked), renews it on the daemon's timeline, tells the
//!   actor when to stop, and releases with the run's outcome.
//! - [`Watcher`] — follows a DC's lifecycle events from a resumable cursor.
//!
//! An edge router resolving a key:
//!
//! ```no_run
//! # async fn router() -> Result<(), Box<dyn std::error::Error>> {
//! use homing_client::{ResolveError, Resolver, ResolverConfig};
//! use homing_core::{DcId, Key, KeyName};
//! use homing_net::{Client, ClientLimits, TlsIdentity};
//!
//! let tls = TlsIdentity::load_pem("ca.pem".as_ref(), "router.pem".as_ref(), "router.key".as_ref())?;
//! let client = Client::new(&tls, ClientLimits::default())?;
//! // Every DC the router may ask, nearest first.
//! let dcs = vec![
//!     (DcId::new("iad")?, "10.0.0.1:7400".parse()?),
//!     (DcId::new("fra")?, "10.1.0.1:7400".parse()?),
//! ];
//! let resolver = Resolver::new(client, ResolverConfig::new(dcs));
//! let key = Key::new(KeyName::new("room-42")?);
//! match resolver.resolve(&key).await {
//!     Ok(at) => {
//!         println!("{key} lives in {} on {}", at.dc, at.actor);
//!         // If routing to `at` fails, forget the answer; the next resolve asks again.
//!         resolver.report_unreachable(&at).await;
//!     }
//!     Err(ResolveError::NotFound(_)) => println!("{key} was never reserved"),
//!     Err(ResolveError::Unavailable { dc, .. }) => println!("dc {dc} is unreachable; retry"),
//!     Err(other) => println!("do not route: {other}"),
//! }
//! # Ok(()) }
//! ```
//!
//! A host holding a lease for the actor it runs:
//!
//! ```no_run
//! # async fn host() -> Result<(), Box<dyn std::error::Error>> {
//! use std::sync::Arc;
//! use homing_client::{Actor, HostAgent, HostAgentConfig};
//! use homing_core::{AcquireReply, ActorId, DcId, Holder, KeyConfig, KeyName};
//! use homing_net::{Client, ClientLimits, Peer, TlsIdentity};
//!
//! struct Room;
//! impl Actor for Room {
//!     fn on_soft_terminate(&self) { /* stop taking new work */ }
//!     fn on_hard_terminate(&self) { /* stop now: no more writes under this token */ }
//! }
//!
//! // A host certificate of its own DC.
//! let tls = TlsIdentity::load_pem("ca.pem".as_ref(), "host-iad.pem".as_ref(), "host-iad.key".as_ref())?;
//! let client = Client::new(&tls, ClientLimits::default())?;
//! let own_dc = Peer { addr: "10.0.0.1:7400".parse()?, dc: DcId::new("iad")? };
//! let config = HostAgentConfig::new(own_dc, KeyConfig::named(KeyName::new("room-42")?),
//!     ActorId::new("10.0.3.9:9000")?);
//! match HostAgent::start(client, config, Arc::new(Room)).await? {
//!     AcquireReply::Acquired(agent) => {
//!         // Run the actor; its fenced writes carry `agent.token()`.
//!         println!("holding {} with token {}", agent.reservation(), agent.token());
//!         agent.stop().await?; // once the actor is done: release the lease
//!     }
//!     AcquireReply::HeldElsewhere(Holder { actor, reservation, .. }) => {
//!         println!("already live at {actor} in {}", reservation.dc());
//!     }
//!     AcquireReply::TagMismatch { existing } => println!("held under tag {existing:?}"),
//! }
//! # Ok(()) }
//! ```

#![forbid(unsafe_code)]

mod actor_ids;
mod answer_cache;
pub mod host_agent;
/// Which DCs are suspect, and when to probe them: the sans-IO decisions the
/// [`Resolver`] drives (re-exported from homing-core).
pub use homing_core::reachability;
pub mod resolver;
pub mod session_host;
pub mod watch;

pub use host_agent::{
    Actor, AgentError, AgentState, HostAgent, HostAgentConfig, HostClock, LeaseTransport,
    QuicTransport, Started, SystemClock, new_lease_key,
};
pub use resolver::{Resolution, ResolveError, Resolved, Resolver, ResolverConfig, ResolverStats};
pub use session_host::{SessionActors, SessionHost, SessionHostConfig, SessionLease};
pub use watch::{WatchError, WatchStream, Watcher};
