//! The two clocks homing reads, as distinct types so they cannot be mixed:
//! `HostTime` is a host's own clock (it sends it with every lease request and
//! receives its deadlines in it), `StoreTime` is the DC's clock, in which
//! lease expiry is stored. No function converts one into the other: homing
//! never compares clocks across machines.

use serde::{Deserialize, Serialize};

macro_rules! clock_type {
    ($(#[$meta:meta])* $name:ident) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
        pub struct $name(u64);

        impl $name {
            /// Milliseconds on this clock (its own epoch; only differences
            /// between readings of the same clock mean anything).
            pub const fn from_ms(ms: u64) -> Self {
                Self(ms)
            }

            /// The reading in milliseconds.
            pub const fn as_ms(self) -> u64 {
                self.0
            }

            /// This instant plus `ms`, saturating at the end of time.
            pub const fn plus_ms(self, ms: u64) -> Self {
                Self(self.0.saturating_add(ms))
            }

            /// Milliseconds from `earlier` to `self`, zero if `earlier` is later.
            pub const fn ms_since(self, earlier: Self) -> u64 {
                self.0.saturating_sub(earlier.0)
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                write!(f, "{}ms", self.0)
            }
        }
    };
}

clock_type!(
    /// A reading of a host's clock, in milliseconds.
    HostTime
);
clock_type!(
    /// A reading of a DC store's clock, in milliseconds.
    StoreTime
);
