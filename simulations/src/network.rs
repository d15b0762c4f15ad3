//! The simulated network between regions: one-way delay is half the RTT of
//! the latency matrix plus uniform jitter; any message may be lost; a
//! partition (possibly one-way) drops every message sent across it while it
//! lasts. Nodes in one region (a DC, its hosts, its routers) talk over the
//! intra-region RTT and are never partitioned from each other.

use crate::rng::Rng;

/// A cut between two regions during `[start_us, end_us)` of true time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Partition {
    /// Messages from this region…
    pub from: usize,
    /// …to this region are dropped.
    pub to: usize,
    /// Start, true µs.
    pub start_us: u64,
    /// End, true µs.
    pub end_us: u64,
    /// Only `from → to` is cut; otherwise both directions.
    pub one_way: bool,
}

impl Partition {
    fn cuts(&self, from: usize, to: usize, now_us: u64) -> bool {
        let active = self.start_us <= now_us && now_us < self.end_us;
        let forward = self.from == from && self.to == to;
        let backward = !self.one_way && self.from == to && self.to == from;
        active && (forward || backward)
    }
}

/// Latency, jitter, loss and partitions.
#[derive(Debug, Clone)]
pub struct Network {
    one_way_us: Vec<Vec<u64>>,
    jitter_us: u64,
    loss: f64,
    partitions: Vec<Partition>,
}

impl Network {
    /// A network over `rtt_ms` (square matrix; the diagonal is the intra-region RTT).
    pub fn new(
        rtt_ms: &[Vec<f64>],
        jitter_ms: f64,
        loss: f64,
        partitions: Vec<Partition>,
    ) -> Network {
        let one_way_us = rtt_ms
            .iter()
            .map(|row| row.iter().map(|ms| (ms * 500.0) as u64).collect())
            .collect();
        Network {
            one_way_us,
            jitter_us: (jitter_ms * 1000.0) as u64,
            loss,
            partitions,
        }
    }

    /// The RTT between two regions without jitter, µs.
    pub fn rtt_us(&self, a: usize, b: usize) -> u64 {
        self.one_way_us[a][b] + self.one_way_us[b][a]
    }

    /// Whether a partition cuts `from → to` at `now_us`.
    pub fn partitioned(&self, from: usize, to: usize, now_us: u64) -> bool {
        from != to && self.partitions.iter().any(|p| p.cuts(from, to, now_us))
    }

    /// The delay of one message sent now, or `None` if it is lost.
    pub fn delay_us(&self, from: usize, to: usize, now_us: u64, rng: &mut Rng) -> Option<u64> {
        if self.partitioned(from, to, now_us) || rng.chance(self.loss) {
            return None;
        }
        let jitter = if self.jitter_us > 0 {
            rng.below(self.jitter_us + 1)
        } else {
            0
        };
        Some(self.one_way_us[from][to] + jitter + 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_one_way_partition_cuts_only_its_direction() {
        let p = Partition {
            from: 0,
            to: 1,
            start_us: 10,
            end_us: 20,
            one_way: true,
        };
        let net = Network::new(&[vec![0.5, 90.0], vec![90.0, 0.5]], 0.0, 0.0, vec![p]);
        let mut rng = Rng::new(1);
        assert_eq!(net.delay_us(0, 1, 15, &mut rng), None);
        assert_eq!(net.delay_us(1, 0, 15, &mut rng), Some(45_001));
        assert_eq!(net.delay_us(0, 1, 20, &mut rng), Some(45_001));
    }
}
