//! What an actor reports as it goes: the [`Observer`] it tells what it
//! measured and what the checker must judge. The simulator implements it
//! over its checker and its measurements, and over what the checker judges
//! against (the DCs' records, the global store), so an actor needs none of
//! them.

use homing_core::{FencingToken, HostTime, PreviousRun, ReservationId, RunOutcome, TailView};

use crate::counter::{Counter, Op};
use crate::report::Work;

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
    /// The work the DC noted for the acquire it answered under `rpc`
    /// (none if it never answered).
    fn take_acquire_work(&mut self, rpc: u64) -> Work;
    /// A host sent `Release` for `reservation` under `token`, saying `outcome`.
    fn on_release_sent(
        &mut self,
        reservation: &ReservationId,
        token: FencingToken,
        outcome: &RunOutcome,
    );
    /// A host got `Acquired { reservation, token, previous }` for `key`;
    /// the checker judges `previous` against what truly happened.
    fn on_acquired(
        &mut self,
        key: u32,
        reservation: &ReservationId,
        token: FencingToken,
        previous: Option<&PreviousRun>,
    );
    /// Host `host` starts acting on `key` at true time `now_us`, under
    /// `reservation` and `token`; the checker also judges whether the
    /// global store held the granting DC's lease expired.
    fn on_holder_start(
        &mut self,
        now_us: u64,
        key: u32,
        host: u32,
        token: FencingToken,
        reservation: &ReservationId,
    );
    /// Host `host` stopped acting on `key` (released, killed, crashed).
    fn on_holder_stop(&mut self, now_us: u64, key: u32, host: u32);
    /// Host `host` acts on `key` with its clock reading `host_ms`; its
    /// hard deadline is `hard`.
    fn on_holder_check(&mut self, key: u32, host: u32, host_ms: u64, hard: HostTime);
    /// A host gave up on an acquire of `key` with no fault in the way.
    fn on_acquire_unanswered(&mut self, key: u32, detail: String);
}
