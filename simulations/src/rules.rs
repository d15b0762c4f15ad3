//! The rules a simulated DC applies that a test may break on purpose to
//! prove that the invariant checkers catch it: homing-node's [`Mutations`]
//! (rules inside the code homingd runs), and the drivers' own choices
//! ([`WaitRules`]). [`Rules::real`] breaks nothing.

use homing_core::Mutations;

/// What a simulated DC runs: homing-node with `mutations` broken on purpose
/// (none in [`Rules::real`]), and the drivers' own waiting choices.
#[derive(Debug, Clone, Copy)]
pub struct Rules {
    /// The drivers' waiting choices.
    pub waiting: WaitRules,
    /// Rules of homing-node broken on purpose.
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
