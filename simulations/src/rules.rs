//! The record transitions a simulated DC applies, as function pointers.
//! [`Rules::real`] is homing-core's; tests swap in a deliberately broken
//! rule to prove that the invariant checkers catch it. Nothing in production
//! code selects anything else.

use homing_core::{
    DcRecord, FencingToken, HostTime, LeasePolicy, LinkReply, ReleaseReply, RenewReply,
    ReservationId, StoreTime, Transition,
};

/// `DcRecord::renew`'s signature.
pub type RenewRule =
    fn(&DcRecord, FencingToken, HostTime, StoreTime, &LeasePolicy) -> Transition<RenewReply>;
/// `DcRecord::release`'s signature.
pub type ReleaseRule = fn(&DcRecord, FencingToken, StoreTime) -> Transition<ReleaseReply>;
/// `DcRecord::link`'s signature.
pub type LinkRule =
    fn(&DcRecord, &ReservationId, FencingToken, StoreTime, &LeasePolicy) -> Transition<LinkReply>;
/// `DcRecord::expire`'s signature.
pub type ExpireRule = fn(&DcRecord, StoreTime, &LeasePolicy) -> Option<DcRecord>;
/// `DcRecord::drain`'s signature.
pub type DrainRule = fn(&DcRecord) -> Option<DcRecord>;

/// The transitions of a DC record that a simulated DC applies on request.
/// (Acquire's `activate` runs inside `homing_core::Connect` and is always real.)
#[derive(Debug, Clone, Copy)]
pub struct Rules {
    /// Renew a lease.
    pub renew: RenewRule,
    /// Release a lease.
    pub release: ReleaseRule,
    /// Link a vacant tail to a new reservation.
    pub link: LinkRule,
    /// The reaper.
    pub expire: ExpireRule,
    /// Drain.
    pub drain: DrainRule,
}

impl Rules {
    /// homing-core's transitions.
    pub fn real() -> Rules {
        Rules {
            renew: DcRecord::renew,
            release: DcRecord::release,
            link: DcRecord::link,
            expire: DcRecord::expire,
            drain: DcRecord::drain,
        }
    }
}

impl Default for Rules {
    fn default() -> Rules {
        Rules::real()
    }
}
