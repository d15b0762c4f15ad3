//! What is per DC: the endpoint every request arrives at, and the state it keeps between requests.
//!
//! - [`endpoint`]: the DC itself ([`Endpoint`](crate::Endpoint)): which stepper an arriving
//!   request becomes ([`Endpoint::handle_request`](crate::Endpoint::handle_request)), a retried acquire
//!   joined to the one running, refusing while shutting down, and the
//!   effects it answers from its own state ([`Endpoint::answer_at_once`](crate::Endpoint::answer_at_once):
//!   its memory, its cancellations).
//! - [`memory`]: what the DC remembers of the global store ([`Memory`](crate::Memory)):
//!   [`Memory::recall`](crate::Memory::recall) answers an op without I/O when it can,
//!   [`Memory::learn`](crate::Memory::learn) keeps what never changes, [`Memory::hint`](crate::Memory::hint) and
//!   [`Memory::remember`](crate::Memory::remember) the furthest chain member per key.
//! - [`waiters`]: the DC's parked waiters ([`Waiters`](crate::Waiters)): FIFO per
//!   reservation, bounds, the hand-off window, who a write wakes.
//! - [`cancel`] ([`Cancellations`](crate::Cancellations)): the lease keys of cancels an acquire
//!   still running must honour.
//! - [`dc_lease`]: the DC's own lease ([`DcLease`](crate::DcLease)): when to renew, which
//!   host leases it covers, whether it answers for its tails, which marks a
//!   write needs published, the reconciliation owed after a regain.
//! - [`key_quota`]: how many keys the DC may create per namespace
//!   ([`KeyQuota`](crate::KeyQuota); each key keeps a global entry forever).
//! - [`log_follow`]: which records to look at again when the DC's event
//!   log moves under another homingd's writes ([`LogFollower`](crate::LogFollower)).
//! - [`retries`]: a host's retried acquire joins the one still running
//!   ([`AcquiresInFlight`](crate::AcquiresInFlight), kept by the [`Endpoint`](crate::Endpoint)).

pub mod cancel;
pub mod dc_lease;
pub mod endpoint;
pub mod key_quota;
pub mod log_follow;
pub mod memory;
pub mod retries;
pub mod waiters;
