//! The requests a DC serves, one stepper each: what decides every request.
//!
//! - [`serve`]: one request from arrival to reply ([`Serve`](crate::Serve)): which
//!   stepper answers it, the checks on arrival, the reply its outcome
//!   becomes. Every request but four runs through it; an acquire, an await,
//!   a watch and a drain-scope page run their own steppers (below).
//! - [`resolve`]: `Resolve` ([`Resolve`](crate::Resolve): the global entry, plus this DC's
//!   segment when the entry is its own) and `ResolveReservation` (only for
//!   the DC's own reservations; a tail only while it answers for its tails).
//! - [`update`]: one change of one record ([`Update`](crate::Update)): read → transition →
//!   compare-and-set, bounded retries, the owner check, the error replies.
//!   `Renew`, `Release`, `ForceRelease` and `Shortcut` are one update each.
//! - [`change`]: which record transition each change makes ([`Change`](crate::Change):
//!   renew, release, force release, cancel, shortcut, link, drain, expire,
//!   abandon, supersede).
//! - [`link`]: a peer's `Link` at its tail's DC ([`LinkOnward`](crate::LinkOnward)): the
//!   request's checks, the supersede check, then the link's update.
//! - [`supersede`]: before a record links onward, its succession confirmed
//!   in the global store, or the record superseded by a takeover's winner.
//! - [`drain`]: an operator's `Drain` ([`Drain`](crate::Drain)): drain the tail here, or
//!   forward once to the tail's DC (a forwarded drain never forwards again).
//! - [`walk`]: a drain's walk of the chain ([`Walk`](crate::Walk)): the entry's latest
//!   replica, the remembered hint, the fallback when the hint is disowned.
//! - [`scan`]: `Scan` pages and their cursor, a `DrainScope` page
//!   ([`DrainScope`](crate::DrainScope)), and the read of one key's records that `Inspect` and
//!   `Cancel` make ([`KeyRecords`](crate::KeyRecords)).
//! - [`watch`]: `Watch` ([`WatchRead`](crate::WatchRead)): a watcher's cursor rules (trimmed
//!   or foreign cursors refused), scope, reply bounds, when to park.
//! - [`await_vacant`]: `Await`, one waiter's loop ([`AwaitVacant`](crate::AwaitVacant)): first
//!   look, join the queue, re-read, park, expire a lapsed holder, time out.
//! - [`acquire`]: `Acquire` ([`Acquire`](crate::Acquire)): the wait around homing-core's
//!   `Connect` — cover and admission, await the holder, pause and retry an
//!   unreachable DC, the last look, the grant after a wait.
//! - `Cancel` is answered in [`serve`]: which grant a host's cancel
//!   releases ([`serve::cancel_target`]); the cancels an acquire still
//!   running must honour are the DC's (`dc::cancel`).

pub mod acquire;
pub mod await_vacant;
pub mod change;
pub mod drain;
pub mod link;
pub mod resolve;
pub mod scan;
pub mod serve;
pub mod session;
pub mod supersede;
pub mod update;
pub mod walk;
pub mod watch;
