//! What an actor reports as it goes: the [`Observer`] it tells what it
//! measured and what the checker must judge. The simulator implements it
//! over its checker and its measurements, so an actor needs neither (both
//! read the DCs).

use homing_core::TailView;

use crate::counter::{Counter, Op};

/// The checker and the measurements, as an actor reports to them.
pub trait Observer {
    /// Records one operation: its latency, measured and modelled round trips.
    fn record(&mut self, op: Op, latency_us: u64, rtts: u32, model_rtts: u32);
    /// Counts one notable outcome.
    fn count(&mut self, what: Counter);
    /// A resolve of `key` started at `start_us` was answered at `now_us`
    /// (`None`: not found); the checker judges the answer.
    fn on_resolve(&mut self, key: u32, start_us: u64, now_us: u64, answer: Option<&TailView>);
    /// A resolve of `key` found the chain inconsistent.
    fn on_resolve_error(&mut self, key: u32, error: String);
    /// A watcher was answered with a gap.
    fn on_watch_gap(&mut self, detail: String);
    /// A scan missed, repeated or misordered records.
    fn on_scan_broken(&mut self, detail: String);
    /// An `Inspect` answer was not its key's records.
    fn on_inspect_broken(&mut self, detail: String);
}
