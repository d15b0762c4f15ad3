//! homing-client: what runs outside the DCs.
//!
//! - [`Resolver`] — embedded by edge routers: which DC hosts a key's actor,
//!   from cache in one lookup, or by walking the reservation chain.
//! - `HostAgent` — runs beside an actor on a host: holds its lease, renews it
//!   on the daemon's timeline, and tells the actor when to stop.

pub mod resolver;

pub use resolver::{Resolution, ResolveError, Resolver, ResolverConfig};
