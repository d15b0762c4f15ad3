//! The rules a simulated DC applies that a test may break on purpose to
//! prove that the invariant checkers catch it: homing-core's record
//! transitions as function pointers, homing-node's [`Mutations`] (rules
//! inside the code homingd runs), and the driver's own choices
//! ([`WaitRules`]). [`Rules::real`] breaks nothing.

use homing_node::Mutations;

use homing_core::{
    DcRecord, FencingToken, HostTime, LeasePolicy, LinkReply, ReleaseReply, RenewReply,
    ReservationId, RunOutcome, StoreTime, Transition,
};

/// `DcRecord::renew`'s signature.
pub type RenewRule =
    fn(&DcRecord, FencingToken, HostTime, StoreTime, &LeasePolicy) -> Transition<RenewReply>;
/// `DcRecord::release`'s signature.
pub type ReleaseRule =
    fn(&DcRecord, FencingToken, RunOutcome, StoreTime) -> Transition<ReleaseReply>;
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
    /// The drivers' waiting choices.
    pub waiting: WaitRules,
    /// Rules of homing-node broken on purpose (none in [`Rules::real`]).
    pub mutations: Mutations,
}

/// The waiting choices still made in homingd's driver (not yet in
/// homing-node), as homingd makes them; tests break one on purpose to show
/// that the wake-up checkers catch it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WaitRules {
    /// The origin's own deadline bounds its `Await` (`timeout_at(deadline)`
    /// in `Node::acquire`); `false`: it waits for the tail's answer.
    pub origin_deadline: bool,
    /// A restarted DC answers packets of its previous process's connections
    /// with a stateless reset (keys derived from its identity, homing-net's
    /// `endpoint_config`); `false`: its peers learn of the loss only at the
    /// idle timeout (random keys per process).
    pub reset_on_restart: bool,
}

impl WaitRules {
    /// homingd's choices.
    pub const REAL: WaitRules = WaitRules {
        origin_deadline: true,
        reset_on_restart: true,
    };
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
            waiting: WaitRules::REAL,
            mutations: Mutations::NONE,
        }
    }
}

impl Default for Rules {
    fn default() -> Rules {
        Rules::real()
    }
}
