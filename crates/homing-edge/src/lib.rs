//! homing-edge: homing's first user, an HTTP edge router on the homing
//! [`Resolver`](homing_client::Resolver), and a tiny actor host to route to.
//!
//! - [`EdgeRouter`] — an HTTP/1.1 and HTTP/2 (prior knowledge) reverse proxy:
//!   takes the key from a header (`x-homing-key`) or a path prefix
//!   (`/k/<key>/…`), resolves it, forwards to the actor (whose id is its
//!   `host:port`), streams the answer back. A failed forward reports the
//!   answer unreachable, re-resolves once and retries.
//! - [`ActorHost`] — an HTTP server running under a
//!   [`HostAgent`](homing_client::HostAgent): acquires its key with its own
//!   listen address as the actor id, renews, stops serving at its hard
//!   deadline, and answers every request with where it landed.
//!
//! ```no_run
//! # async fn example(resolver: homing_client::Resolver) -> std::io::Result<()> {
//! use homing_edge::{EdgeConfig, EdgeRouter};
//! let router = EdgeRouter::new(resolver, EdgeConfig::default());
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:8080").await?;
//! let serving = router.spawn(listener)?;
//! // curl -H 'x-homing-key: room-42' http://127.0.0.1:8080/
//! serving.stop(std::time::Duration::from_secs(5)).await;
//! # Ok(()) }
//! ```

#![forbid(unsafe_code)]

pub mod actor_host;
mod admission;
pub mod config;
pub mod connection;
mod front;
mod h1;
mod json;
pub mod listener;
pub mod metrics;
pub mod network;
mod pool;
pub mod probe;
mod request_counts;
pub mod route;
pub mod router;

pub use actor_host::{ActorHost, ActorHostConfig, ActorHostError, HostStarted};
pub use config::{EdgeConfig, ServeLimits};
pub use listener::{Serving, runtime};
pub use network::ActorNetwork;
pub use router::{EdgeBody, EdgeRouter, EdgeStats};
