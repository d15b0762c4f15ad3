//! The node's own monotonic clock: what its timers (hand-off windows, waits)
//! are measured in. The driver reads it (homingd: a tokio `Instant` since
//! the node started; the simulator: the DC's drifting local clock) and
//! passes it in; it is never compared with another machine's clock, nor with
//! the store's `StoreTime`.

/// A reading of a node's monotonic clock, in microseconds from the driver's
/// origin (only differences between readings of one node mean anything).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct NodeTime(u64);

impl NodeTime {
    /// The reading `us` microseconds after the origin.
    pub const fn from_us(us: u64) -> NodeTime {
        NodeTime(us)
    }

    /// Microseconds since the origin.
    pub const fn as_us(self) -> u64 {
        self.0
    }

    /// This instant plus `ms` milliseconds, saturating.
    pub const fn plus_ms(self, ms: u64) -> NodeTime {
        NodeTime(self.0.saturating_add(ms.saturating_mul(1000)))
    }

    /// This instant plus `us` microseconds, saturating.
    pub const fn plus_us(self, us: u64) -> NodeTime {
        NodeTime(self.0.saturating_add(us))
    }

    /// Microseconds from `earlier` to `self`, zero if `earlier` is later.
    pub const fn us_since(self, earlier: NodeTime) -> u64 {
        self.0.saturating_sub(earlier.0)
    }
}
