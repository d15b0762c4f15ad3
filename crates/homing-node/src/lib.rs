//! homing-node: one DC's request handling as sans-IO steppers, in the
//! shape of quinn-proto (DESIGN.md §7.1). No tokio, no sockets, no clock
//! reads, no entropy: both clocks come in as arguments — [`NodeTime`], the
//! node's own monotonic clock for its timers, and `homing_core::StoreTime`,
//! the DC store's clock in which leases expire. The steppers are the
//! connections: each request (and each of the DC's own passes) is a
//! [`Stepper`] that asks one [`Effect`] at a time, is handed one [`Answer`]
//! back, and notes [`NodeEvent`]s for its node between steps. Every decision
//! is taken here; homingd (`Node::drive` in crates/homing-daemon) and the
//! simulator (`DcCtx::step_drive` in simulations/) only perform the effects,
//! so both run the same code. Where each driver performs each effect:
//! docs/ARCHITECTURE.md, the table under homing-node.
//!
//! # The step vocabulary
//!
//! - [`step`]: [`Effect`] out, [`Answer`] in, with both clocks ([`Now`]);
//!   [`Step`] (ask or done) and the [`Stepper`] trait every driver loops on.
//! - [`effect`]: the store operations inside `Effect::Store` and
//!   `Effect::Global` — [`StoreOp`] / [`Stored`] for the DC's own store,
//!   [`GlobalOp`] / [`GlobalAnswer`] for the global store, and how current
//!   a global read must be ([`GlobalRead`]).
//! - [`event`]: what a stepper notes for its node ([`NodeEvent`]): a chain
//!   member to remember, a drain, a reconciled takeover, what an acquire or
//!   an upkeep pass did, a new member to tell another DC's entry of.
//! - [`failure`]: how a step failed ([`Failure`]): unreachable (worth
//!   trying again within a wait), refused, or lied; which answers disown a
//!   reservation ([`Failure::disowns`]).
//! - [`time`]: the node's monotonic clock ([`NodeTime`]).
//!
//! # Requests
//!
//! - [`serve`]: one request from arrival to reply ([`Serve`]): which
//!   stepper answers it, the checks on arrival, the reply its outcome
//!   becomes. Every request but four runs through it; an acquire, an await,
//!   a watch and a drain-scope page run their own steppers (below).
//! - [`resolve`]: `Resolve` ([`Resolve`]: the global entry, plus this DC's
//!   segment when the entry is its own) and `ResolveReservation` (only for
//!   the DC's own reservations; a tail only while it answers for its tails).
//! - [`update`]: one change of one record ([`Update`]): read → transition →
//!   compare-and-set, bounded retries, the owner check, the error replies.
//!   `Renew`, `Release`, `ForceRelease` and `Shortcut` are one update each.
//! - [`change`]: which record transition each change makes ([`Change`]:
//!   renew, release, force release, cancel, shortcut, link, drain, expire,
//!   abandon, supersede).
//! - [`link`]: a peer's `Link` at its tail's DC ([`LinkOnward`]): the
//!   request's checks, the supersede check, then the link's update.
//! - [`supersede`]: before a record links onward, its succession confirmed
//!   in the global store, or the record superseded by a takeover's winner.
//! - [`drain`]: an operator's `Drain` ([`Drain`]): drain the tail here, or
//!   forward once to the tail's DC (a forwarded drain never forwards again).
//! - [`walk`]: a drain's walk of the chain ([`Walk`]): the entry's latest
//!   replica, the remembered hint, the fallback when the hint is disowned.
//! - [`scan`]: `Scan` pages and their cursor, a `DrainScope` page
//!   ([`DrainScope`]), and the read of one key's records that `Inspect` and
//!   `Cancel` make ([`KeyRecords`]).
//! - [`watch`]: `Watch` ([`WatchRead`]): a watcher's cursor rules (trimmed
//!   or foreign cursors refused), scope, reply bounds, when to park.
//! - [`await_vacant`]: `Await`, one waiter's loop ([`AwaitVacant`]): first
//!   look, join the queue, re-read, park, expire a lapsed holder, time out.
//! - [`acquire`]: `Acquire` ([`Acquire`]): the wait around homing-core's
//!   `Connect` — cover and admission, await the holder, pause and retry an
//!   unreachable DC, the last look, the grant after a wait.
//! - [`cancel`]: `Cancel`: which grant a host's cancel releases
//!   ([`cancel::target`]).
//! - [`retries`]: a host's retried acquire joins the one still running
//!   ([`AcquiresInFlight`], kept by the [`Endpoint`]).
//!
//! # DC-wide state
//!
//! - [`endpoint`]: the DC itself ([`Endpoint`]): which stepper an arriving
//!   request becomes ([`Endpoint::handle_request`]), a retried acquire
//!   joined to the one running, refusing while shutting down, and the
//!   effects it answers from its own state ([`Endpoint::answer_at_once`]:
//!   its memory, its cancellations).
//! - [`memory`]: what the DC remembers of the global store ([`Memory`]):
//!   [`Memory::recall`] answers an op without I/O when it can,
//!   [`Memory::learn`] keeps what never changes, [`Memory::hint`] and
//!   [`Memory::remember`] the furthest chain member per key.
//! - [`waiters`]: the DC's parked waiters ([`Waiters`]): FIFO per
//!   reservation, bounds, the hand-off window, who a write wakes.
//! - [`cancel`]'s [`Cancellations`]: the lease keys of cancels an acquire
//!   still running must honour.
//! - [`dc_lease`]: the DC's own lease ([`DcLease`]): when to renew, which
//!   host leases it covers, whether it answers for its tails, which marks a
//!   write needs published, the reconciliation owed after a regain.
//! - [`key_quota`]: how many keys the DC may create per namespace
//!   ([`KeyQuota`]; each key keeps a global entry forever).
//! - [`log_follow`]: which records to look at again when the DC's event
//!   log moves under another homingd's writes ([`LogFollower`]).
//!
//! # Passes
//!
//! - [`upkeep`]: a pass over what the expiry index says is due
//!   ([`Upkeep`]): reap lapsed leases, abandon proven orphans, settle
//!   proven members, trim the event log.
//! - [`reconcile`]: a DC back from a lapsed lease applies the takeovers of
//!   its tails made meanwhile before it grants again ([`Reconcile`]).
//!
//! # Tests
//!
//! - homing-core's `mutation`: rules a test breaks on purpose (cargo
//!   feature `mutations`, which this crate's passes on), so a simulator
//!   sweep that catches it is evidence about the code homingd runs.
//! - `fixture` (tests only): the records the unit tests start from.

#![forbid(unsafe_code)]

pub mod acquire;
pub mod await_vacant;
pub mod cancel;
pub mod change;
pub mod dc_lease;
pub mod drain;
pub mod effect;
pub mod endpoint;
pub mod event;
pub mod failure;
#[cfg(test)]
mod fixture;
pub mod key_quota;
pub mod link;
pub mod log_follow;
pub mod memory;
pub mod reconcile;
pub mod resolve;
pub mod retries;
pub mod scan;
pub mod serve;
pub mod session;
pub mod step;
pub mod supersede;
pub mod time;
pub mod update;
pub mod upkeep;
pub mod waiters;
pub mod walk;
pub mod watch;

pub use acquire::{
    AWAIT_RETRY_MS, Acquire, AcquireRequest, CONNECT_GLOBAL_READ, CONTENDED_ANSWER_MS, InSession,
    member_named,
};
pub use await_vacant::{AwaitVacant, settled};
pub use cancel::Cancellations;
pub use change::{Change, Changed};
pub use dc_lease::{
    DcLease, DcLeaseChange, DcLeasePoll, LeaseLender, StartCheck, TOKEN_HEADROOM, start_check,
};
pub use drain::Drain;
pub use effect::{GlobalAnswer, GlobalOp, GlobalRead, RecordWrite, StoreOp, Stored};
pub use endpoint::{Dispatch, Endpoint, EndpointConfig, Handling, WATCH_EVENTS_PAGE};
pub use event::{AcquireEvent, NodeEvent, ReconcileEvent, UpkeepEvent};
pub use failure::Failure;
pub use key_quota::{Admit, KEYS_PER_NAMESPACE_MAX_DEFAULT, KeyQuota};
pub use link::LinkOnward;
pub use log_follow::{Followed, LogFollower};
pub use memory::{MEMORY_ENTRIES_DEFAULT, Memory, MemoryLimits};
pub use reconcile::{Reconcile, Resumption};
pub use resolve::{Resolve, answered, owned_here, segment_failure};
pub use retries::{AcquiresInFlight, Arrival, JOINS_MAX};
pub use scan::{DrainScope, KeyRecords, SCAN_PAGE_RECORDS};
pub use serve::{KEY_RECORDS_PAGE, NodeConfig, Serve};
pub use session::{SessionAsk, SessionRequest};
pub use step::{Answer, Effect, Now, Step, Stepper};
pub use time::NodeTime;
pub use update::{CAS_ATTEMPTS_MAX, Update, UpdateError};
pub use upkeep::{Upkeep, UpkeepLimits};
pub use waiters::{Full, Handoff, Notified, QueueOp, Queued, Ticket, WaitLimits, Waiters, Wake};
pub use walk::{Walk, WalkPoll};
pub use watch::{WATCH_PAGES_MAX, WATCH_REPLY_BYTES_MAX, WatchRead, Watched};
