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
//! # Layout
//!
//! Four folders, each importing only those above it in this list:
//!
//! - [`step`]: the vocabulary every stepper and driver shares — [`Effect`]
//!   out, [`Answer`] in, with both clocks ([`Now`]); [`Step`] and the
//!   [`Stepper`] trait; the store operations inside them ([`step::effect`]);
//!   what a stepper notes for its node ([`step::event`]); how a step failed
//!   ([`step::failure`]); a waiter's business with the registry
//!   ([`step::queue`]); the node clock ([`step::time`]). Imports no stepper.
//! - [`request`]: one stepper per request, from [`Serve`] (every request
//!   from arrival to reply) down to the record [`Update`] they share.
//! - [`pass`]: the DC's own passes — [`Upkeep`] over what the expiry index
//!   says is due, and [`Reconcile`] after a lapsed DC lease.
//! - [`dc`]: what is per DC — the [`Endpoint`] (dispatch, retries joined,
//!   shutdown, the effects it answers from its own state), its [`Memory`]
//!   of the global store, its [`Waiters`], [`Cancellations`], [`KeyQuota`],
//!   its own [`DcLease`] and the [`LogFollower`].
//!
//! Each folder's module doc is its map. Where a request is decided: the
//! request's file under `request/` (DESIGN.md §7.1 lists them).
//!
//! # Tests
//!
//! - homing-core's `mutation`: rules a test breaks on purpose (cargo
//!   feature `mutations`, which this crate's passes on), so a simulator
//!   sweep that catches it is evidence about the code homingd runs.
//! - `fixture` (tests only): the records the unit tests start from.

#![forbid(unsafe_code)]

pub mod dc;
#[cfg(test)]
mod fixture;
pub mod pass;
pub mod request;
pub mod step;

pub use dc::cancel::Cancellations;
pub use dc::dc_lease::{
    DcLease, DcLeaseChange, DcLeasePoll, LeaseLender, StartCheck, TOKEN_HEADROOM, start_check,
};
pub use dc::endpoint::{Dispatch, Endpoint, EndpointConfig, Handling, WATCH_EVENTS_PAGE};
pub use dc::key_quota::{Admit, KEYS_PER_NAMESPACE_MAX_DEFAULT, KeyQuota};
pub use dc::log_follow::{Followed, LogFollower};
pub use dc::memory::{MEMORY_ENTRIES_DEFAULT, Memory, MemoryLimits};
pub use dc::retries::{AcquiresInFlight, Arrival, JOINS_MAX};
pub use dc::waiters::{Notified, WaitLimits, Waiters, Wake};
pub use pass::reconcile::{Reconcile, Resumption};
pub use pass::upkeep::{Upkeep, UpkeepLimits};
pub use request::acquire::{
    AWAIT_RETRY_MS, Acquire, AcquireRequest, CONNECT_GLOBAL_READ, CONTENDED_ANSWER_MS, InSession,
    member_named,
};
pub use request::await_vacant::{AwaitVacant, settled};
pub use request::change::{Change, Changed};
pub use request::drain::Drain;
pub use request::link::LinkOnward;
pub use request::resolve::{Resolve, answered, owned_here, segment_failure};
pub use request::scan::{DrainScope, KeyRecords, SCAN_PAGE_RECORDS};
pub use request::serve::{KEY_RECORDS_PAGE, NodeConfig, Serve};
pub use request::session::{SessionAsk, SessionRequest};
pub use request::update::{CAS_ATTEMPTS_MAX, Update, UpdateError};
pub use request::walk::{Walk, WalkPoll};
pub use request::watch::{WATCH_PAGES_MAX, WATCH_REPLY_BYTES_MAX, WatchRead, Watched};
pub use step::effect::{GlobalAnswer, GlobalOp, GlobalRead, RecordWrite, StoreOp, Stored};
pub use step::event::{AcquireEvent, NodeEvent, ReconcileEvent, UpkeepEvent};
pub use step::failure::Failure;
pub use step::queue::{Full, Handoff, QueueOp, Queued, Ticket};
pub use step::time::NodeTime;
pub use step::{Answer, Effect, Now, Step, Stepper};
