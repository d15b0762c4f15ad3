//! homing-node: the request handling of one DC as sans-IO parts, in the
//! shape of quinn-proto (DESIGN.md §7.1). No tokio, no sockets, no clock
//! reads, no entropy: both clocks come in as arguments — [`NodeTime`], the
//! node's own monotonic clock for its timers, and `homing_core::StoreTime`,
//! the DC store's clock in which leases expire — and every decision is
//! taken here, so `homingd` (tokio, real stores, QUIC) and the simulator
//! (its event queue, in-memory stores) run the same code.
//!
//! Moved here so far:
//!
//! - [`effect`]: what a stepper asks of the DC's own store ([`StoreOp`])
//!   and what it answered ([`Stored`]), one vocabulary for every stepper;
//! - [`step`]: one [`Effect`] out and one [`Answer`] in for the steppers a
//!   driver runs with one loop ([`Stepper`]), and the [`NodeEvent`]s they
//!   note for their node;
//! - [`waiters`]: the parked acquirers of a DC — FIFO per reservation,
//!   bounded, hand-off window, who is woken by which write;
//! - [`change`]: which transition each change of a record makes (renew,
//!   release, link, drain, expire, abandon);
//! - [`update`]: read → transition → compare-and-set of one record,
//!   bounded retries, the owner check, and how each failure is answered;
//! - [`acquire`]: the wait around a connect — await the holder, retry an
//!   unreachable DC, the last look, the grant after a wait;
//! - [`failure`]: unreachable vs refused, which every retry rests on;
//! - [`await_vacant`]: one waiter's loop — first look, register, re-read,
//!   park until the earliest timer, expire a lapsed holder, time out.
//!
//! - [`drain`]: find the tail, drain it here or forward once;
//! - [`retries`]: a host's retried acquire joins the one still running;
//! - [`cancel`]: which grant a host's cancel releases, and the cancelled
//!   lease keys an acquire still running must honour;
//! - [`dc_lease`]: the DC's own lease in the global store — when to renew,
//!   which host leases it covers, which marks a write needs published;
//! - [`key_quota`]: how many keys a DC may create per namespace (each keeps
//!   a global entry forever);
//! - [`upkeep`]: passes over the DC's records — reap lapsed leases, abandon
//!   proven orphans, trim the event log;
//! - [`log_follow`]: which records to look at again when the DC's event log
//!   moves (another homingd of the same DC wrote them);
//!
//! - [`watch`]: a watcher's cursor rules — trimmed or foreign cursors
//!   refused, scope, reply bounds, when to park;
//! - [`scan`]: pages of an operator's scan, a drain scope's page, one
//!   key's records for `Inspect` and `Cancel`;
//! - [`resolve`]: a DC's answer to `Resolve` (the entry, and its own
//!   segment while it answers for its tails) and to `ResolveReservation`;
//! - [`serve`]: one request from arrival to reply — which stepper answers
//!   it, the checks on arrival, the reply its outcome becomes;
//! - [`supersede`]: before a record links onward, its succession confirmed
//!   in the global store, or the record superseded by the takeover's winner;
//! - [`reconcile`]: a DC back from a lapsed lease applies the takeovers of
//!   its tails made meanwhile before it grants again.
//!
//! [`mutation`] lets tests break a rule inside this crate on purpose (cargo
//! feature `mutations`), so a simulator sweep that catches it is evidence
//! about the code homingd runs.

#![forbid(unsafe_code)]

pub mod acquire;
pub mod await_vacant;
pub mod cancel;
pub mod change;
pub mod dc_lease;
pub mod drain;
pub mod effect;
pub mod event;
pub mod failure;
#[cfg(test)]
mod fixture;
pub mod key_quota;
pub mod link;
pub mod log_follow;
pub mod memory;
pub mod mutation;
pub mod reconcile;
pub mod resolve;
pub mod retries;
pub mod scan;
pub mod serve;
pub mod step;
pub mod supersede;
pub mod time;
pub mod update;
pub mod upkeep;
pub mod waiters;
pub mod walk;
pub mod watch;

pub use acquire::{
    AWAIT_RETRY_MS, Acquire, AcquireRequest, CONNECT_GLOBAL_READ, CONTENDED_ANSWER_MS, member_named,
};
pub use await_vacant::{AwaitVacant, settled};
pub use cancel::Cancellations;
pub use change::{Change, Changed};
pub use dc_lease::{DcLease, DcLeaseChange, DcLeasePoll, StartCheck, TOKEN_HEADROOM, start_check};
pub use drain::Drain;
pub use effect::{GlobalAnswer, GlobalOp, GlobalRead, StoreOp, Stored};
pub use event::{AcquireEvent, NodeEvent, ReconcileEvent, UpkeepEvent};
pub use failure::Failure;
pub use key_quota::{Admit, KEYS_PER_NAMESPACE_MAX_DEFAULT, KeyQuota};
pub use link::LinkOnward;
pub use log_follow::{Followed, LogFollower};
pub use memory::{MEMORY_ENTRIES_DEFAULT, Memory, MemoryLimits};
pub use mutation::{Mutation, Mutations};
pub use reconcile::{Reconcile, Resumption};
pub use resolve::{Resolve, answered, owned_here, segment_failure};
pub use retries::{AcquiresInFlight, Arrival, JOINS_MAX};
pub use scan::{DrainScope, KeyRecords, SCAN_PAGE_RECORDS};
pub use serve::{KEY_RECORDS_PAGE, NodeConfig, Serve};
pub use step::{Answer, Effect, Now, Step, Stepper};
pub use time::NodeTime;
pub use update::{CAS_ATTEMPTS_MAX, Update, UpdateError};
pub use upkeep::{Upkeep, UpkeepLimits};
pub use waiters::{Full, Handoff, Notified, QueueOp, Queued, Ticket, WaitLimits, Waiters, Wake};
pub use walk::{Walk, WalkPoll};
pub use watch::{WATCH_PAGES_MAX, WATCH_REPLY_BYTES_MAX, WatchRead, Watched};
