//! Per-node clocks. True time is the simulator's (microseconds since the
//! start of the run); every DC and host reads its own clock, which is true
//! time plus a fixed offset, running fast or slow by a drift in ppm. Hosts
//! send `HostTime` from their clock, DCs stamp `StoreTime` from theirs, and
//! nothing ever converts one into the other — only this driver knows both.

use homing_core::{HostTime, StoreTime};

/// Every clock starts this far from zero (µs, ~11.6 days), so negative
/// offsets still give positive readings.
pub const CLOCK_BASE_US: i64 = 1_000_000_000_000;

/// Most drift a clock may have, in ppm (keeps every clock strictly increasing).
pub const DRIFT_PPM_MAX: i64 = 100_000;

/// One node's clock: `local = base + offset + t + t * drift_ppm / 1e6`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct NodeClock {
    /// Offset from true time, µs.
    pub offset_us: i64,
    /// Rate error in parts per million (positive runs fast).
    pub drift_ppm: i64,
}

impl NodeClock {
    /// A clock with `offset_us` and `drift_ppm` (clamped to ±[`DRIFT_PPM_MAX`]).
    pub fn new(offset_us: i64, drift_ppm: i64) -> NodeClock {
        NodeClock {
            offset_us,
            drift_ppm: drift_ppm.clamp(-DRIFT_PPM_MAX, DRIFT_PPM_MAX),
        }
    }

    /// The reading in µs at true time `true_us`.
    pub fn local_us(&self, true_us: u64) -> u64 {
        // In i64 while the drift's product fits (any run shorter than
        // ~2.9 years of true time): the same truncated quotient as i128,
        // without its slow division.
        let narrow = i64::try_from(true_us).ok().and_then(|t| {
            let drifted = t.checked_mul(self.drift_ppm)? / 1_000_000;
            (CLOCK_BASE_US + self.offset_us)
                .checked_add(t)?
                .checked_add(drifted)
        });
        match narrow {
            Some(local) => local.max(0) as u64,
            None => self.local_us_wide(true_us),
        }
    }

    /// [`NodeClock::local_us`] in i128, for any `true_us`.
    fn local_us_wide(&self, true_us: u64) -> u64 {
        let t = i128::from(true_us);
        let local = i128::from(CLOCK_BASE_US + self.offset_us)
            + t
            + t * i128::from(self.drift_ppm) / 1_000_000;
        local.max(0) as u64
    }

    /// The reading in ms at true time `true_us`.
    pub fn local_ms(&self, true_us: u64) -> u64 {
        self.local_us(true_us) / 1000
    }

    /// This clock as a host clock.
    pub fn host_time(&self, true_us: u64) -> HostTime {
        HostTime::from_ms(self.local_ms(true_us))
    }

    /// This clock as a DC store clock.
    pub fn store_time(&self, true_us: u64) -> StoreTime {
        StoreTime::from_ms(self.local_ms(true_us))
    }

    /// The earliest true time at which this clock reads at least `ms`.
    pub fn first_true_us_at_ms(&self, ms: u64) -> u64 {
        self.first_true_us_at_us(ms.saturating_mul(1000))
    }

    /// The true time at which this clock has advanced `local_us` past its
    /// reading at `true_us` (a timer armed on this machine).
    pub fn true_us_after(&self, true_us: u64, local_us: u64) -> u64 {
        self.first_true_us_at_us(self.local_us(true_us).saturating_add(local_us))
    }

    /// The earliest true time at which this clock reads at least `us`.
    pub fn first_true_us_at_us(&self, us: u64) -> u64 {
        let target = i128::from(us);
        let from_base = target - i128::from(CLOCK_BASE_US + self.offset_us);
        let estimate = from_base * 1_000_000 / (1_000_000 + i128::from(self.drift_ppm));
        let mut t = estimate.clamp(0, i128::from(u64::MAX / 2)) as u64;
        while u128::from(self.local_us(t)) < target as u128 {
            t += 1;
        }
        while t > 0 && i128::from(self.local_us(t - 1)) >= target {
            t -= 1;
        }
        t
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_true_time_is_the_exact_crossing() {
        for clock in [
            NodeClock::new(0, 0),
            NodeClock::new(-3_000_000, 100),
            NodeClock::new(2_500_123, -100),
        ] {
            for ms in [1_000_000_000u64, 1_000_000_500, 1_000_003_777] {
                let t = clock.first_true_us_at_ms(ms);
                assert!(clock.local_ms(t) >= ms);
                assert!(t == 0 || clock.local_ms(t - 1) < ms);
            }
        }
    }

    #[test]
    fn the_narrow_reading_is_the_wide_one() {
        let clocks = [
            NodeClock::new(0, 0),
            NodeClock::new(-3_000_000, 100),
            NodeClock::new(2_500_123, -100),
            NodeClock::new(-CLOCK_BASE_US, -DRIFT_PPM_MAX),
            NodeClock::new(7, DRIFT_PPM_MAX),
        ];
        let mut t: u64 = 1;
        while t < u64::MAX / 3 {
            for clock in clocks {
                for true_us in [t - 1, t, t + 999_999] {
                    assert_eq!(clock.local_us(true_us), clock.local_us_wide(true_us));
                }
            }
            t = t * 3 + 1;
        }
        for clock in clocks {
            assert_eq!(clock.local_us(u64::MAX), clock.local_us_wide(u64::MAX));
        }
    }

    #[test]
    fn clocks_never_run_backwards() {
        let clock = NodeClock::new(-1_000, -100);
        let mut last = 0;
        for t in (0..10_000_000u64).step_by(997) {
            let now = clock.local_us(t);
            assert!(now >= last);
            last = now;
        }
    }
}
