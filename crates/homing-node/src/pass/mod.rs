//! The DC's own passes, run on the DC's timers rather than on a request.
//!
//! - [`upkeep`]: a pass over what the expiry index says is due
//!   ([`Upkeep`](crate::Upkeep)): reap lapsed leases, abandon proven orphans, settle
//!   proven members, trim the event log.
//! - [`reconcile`]: a DC back from a lapsed lease applies the takeovers of
//!   its tails made meanwhile before it grants again ([`Reconcile`](crate::Reconcile)).

pub mod reconcile;
pub mod upkeep;
