//! The simulated network between regions: one-way delay is half the RTT of
//! the latency matrix plus uniform jitter; any message may be lost; a
//! partition (possibly one-way) drops every message sent across it while it
//! lasts. Nodes in one region (a DC, its hosts, its routers) talk over the
//! intra-region RTT and are never partitioned from each other.
//!
//! Requests that park (`Await`) and their replies ride a QUIC stream, which
//! retransmits: a lost packet costs a retransmission, a cut shorter than the
//! idle timeout delays the message until it heals, and a cut that lasts the
//! idle timeout closes the connection (both ends time out; the message is lost
//! and the requester learns it then, see [`Network::path_dead_at`]).

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

    /// The widest RTT between two regions without jitter, µs.
    pub fn rtt_max_us(&self) -> u64 {
        let n = self.one_way_us.len();
        (0..n)
            .flat_map(|a| (0..n).map(move |b| (a, b)))
            .map(|(a, b)| self.rtt_us(a, b))
            .max()
            .unwrap_or(0)
    }

    /// Whether a partition cuts `from → to` at `now_us`.
    pub fn partitioned(&self, from: usize, to: usize, now_us: u64) -> bool {
        from != to && self.partitions.iter().any(|p| p.cuts(from, to, now_us))
    }

    /// The cuts of the path between `a` and `b` (either direction), merged, in order.
    fn cuts(&self, a: usize, b: usize) -> Vec<(u64, u64)> {
        let mut cuts: Vec<(u64, u64)> = self
            .partitions
            .iter()
            .filter(|p| (p.from == a && p.to == b) || (p.from == b && p.to == a))
            .map(|p| (p.start_us, p.end_us))
            .collect();
        cuts.sort_unstable();
        let mut merged: Vec<(u64, u64)> = Vec::new();
        for (start, end) in cuts {
            match merged.last_mut() {
                Some(last) if start <= last.1 => last.1 = last.1.max(end),
                _ => merged.push((start, end)),
            }
        }
        merged
    }

    /// The first instant in `[from_us, until_us)` at which a connection
    /// between `a` and `b` is dead: the path has then been cut (either way)
    /// for `idle_us` without a break. `None` if it lives through.
    pub fn path_dead_at(
        &self,
        a: usize,
        b: usize,
        from_us: u64,
        until_us: u64,
        idle_us: u64,
    ) -> Option<u64> {
        if a == b {
            return None;
        }
        self.cuts(a, b)
            .into_iter()
            .filter(|(start, end)| end - start > idle_us)
            .map(|(start, end)| (start + idle_us, end))
            .find(|(dead, end)| *end > from_us && *dead < until_us)
            .map(|(dead, _)| dead.max(from_us))
    }

    /// The delay of a message on a QUIC stream sent now: lost packets are
    /// retransmitted (one RTT plus 200 ms each, at most 8 times), a cut
    /// shorter than `idle_us` holds it until the path heals. `None` when the
    /// cut outlasts the idle timeout (the connection is gone) or every
    /// retransmission was lost.
    pub fn stream_delay_us(
        &self,
        from: usize,
        to: usize,
        now_us: u64,
        idle_us: u64,
        rng: &mut Rng,
    ) -> Option<u64> {
        let mut sent_at = now_us;
        if from != to
            && let Some((start, end)) = self
                .cuts(from, to)
                .into_iter()
                .find(|(start, end)| *start <= now_us && now_us < *end)
        {
            if end - start > idle_us {
                return None;
            }
            sent_at = end;
        }
        let retransmit_us = self.rtt_us(from, to) + 200_000;
        let mut attempts = 0;
        while rng.chance(self.loss) {
            attempts += 1;
            if attempts > 8 {
                return None;
            }
            sent_at += retransmit_us;
        }
        let jitter = if self.jitter_us > 0 {
            rng.below(self.jitter_us + 1)
        } else {
            0
        };
        Some(sent_at - now_us + self.one_way_us[from][to] + jitter + 1)
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

    #[test]
    fn a_stream_waits_out_a_short_cut_and_dies_in_a_long_one() {
        let cut = |start_us, end_us| Partition {
            from: 0,
            to: 1,
            start_us,
            end_us,
            one_way: true,
        };
        let net = Network::new(
            &[vec![0.5, 90.0], vec![90.0, 0.5]],
            0.0,
            0.0,
            vec![cut(1_000, 2_000), cut(10_000, 50_000)],
        );
        let mut rng = Rng::new(1);
        // Held until the short cut heals, in either direction.
        assert_eq!(
            net.stream_delay_us(1, 0, 1_500, 5_000, &mut rng),
            Some(500 + 45_001)
        );
        assert_eq!(net.stream_delay_us(0, 1, 20_000, 5_000, &mut rng), None);
        assert_eq!(net.path_dead_at(0, 1, 0, 100_000, 5_000), Some(15_000));
        assert_eq!(net.path_dead_at(0, 1, 30_000, 100_000, 5_000), Some(30_000));
        assert_eq!(net.path_dead_at(0, 1, 0, 14_000, 5_000), None);
        assert_eq!(net.path_dead_at(0, 1, 60_000, 100_000, 5_000), None);
    }
}
