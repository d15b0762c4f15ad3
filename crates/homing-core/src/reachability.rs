//! Reachability: which DC addresses a caller (a router's `Resolver`, a
//! homingd's peer client) may wait for, and when to probe one that stopped
//! answering. Sans-IO: the driver passes `now` in and does what the answers
//! say; nothing here reads a clock, sleeps, sends or draws randomness (the
//! jitter comes from a seed the driver passes).
//!
//! ```text
//!            request timed out / refused          probe failed: next probe
//!   Healthy ────────────────────────────▶ Suspect ◀──┐ after the backoff
//!      ▲                                   │   └─────┘ (with jitter)
//!      └───────────────────────────────────┘
//!        any answer: a probe's, or a request's sent before the suspicion
//! ```
//!
//! A partition must cost a caller one timeout, not one per request: while
//! every address of a DC is suspect, [`Reachability::route`] says so at
//! once and the request does not wait for that DC (the caller answers
//! `Unavailable`, or a router a remembered answer marked stale); one
//! background probe per suspect address ([`Reachability::poll_probe`])
//! finds out when it answers again, and its first answer clears the
//! suspicion for everyone.
//!
//! Suspicion is per address, so a DC listing several homingd addresses is
//! routed to one that answers and is suspect only when all of them are.
//! homingd's peer table and the Resolver's DC table list a DC once per
//! homingd serving it (homing-net's `DcTable` drives this for both).
//!
//! Driver order: `route` before each request; `handle_answer` or
//! `handle_failure` after it; on a [`Change`] to suspect, start a probe loop
//! that calls `poll_probe` and, after each probe, `handle_probe`, until
//! `poll_probe` says [`ProbeStep::Stop`].

use std::time::{Duration, Instant};

/// Default first wait before probing a suspect address, in milliseconds.
pub const PROBE_INTERVAL_MS_DEFAULT: u64 = 250;
/// Default longest wait between probes (the backoff's cap), in milliseconds.
pub const PROBE_INTERVAL_MAX_MS_DEFAULT: u64 = 2_000;
/// Default spread of each wait between probes, in percent either way.
pub const PROBE_JITTER_PERCENT_DEFAULT: u8 = 20;
/// Most doublings of the probe interval (the cap usually comes first).
const BACKOFF_DOUBLINGS_MAX: u32 = 16;

/// An address of a DC: its place in the resolver's address table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct AddrSlot(pub usize);

/// A DC: its place in the resolver's DC table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DcSlot(pub usize);

/// How often a suspect address is probed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProbeSchedule {
    /// Wait before the first probe, and the backoff's base, in milliseconds.
    pub interval_ms: u64,
    /// Longest wait between probes, in milliseconds.
    pub interval_max_ms: u64,
    /// Spread of each wait, in percent either way (0..=100).
    pub jitter_percent: u8,
}

impl Default for ProbeSchedule {
    fn default() -> ProbeSchedule {
        ProbeSchedule {
            interval_ms: PROBE_INTERVAL_MS_DEFAULT,
            interval_max_ms: PROBE_INTERVAL_MAX_MS_DEFAULT,
            jitter_percent: PROBE_JITTER_PERCENT_DEFAULT,
        }
    }
}

/// Where a request to a DC goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    /// Ask this address.
    Ask(AddrSlot),
    /// Every address of the DC is suspect, the oldest since `since`: do not
    /// wait for it.
    Suspect {
        /// When the DC's longest-standing suspicion began.
        since: Instant,
    },
}

/// What a probe loop does next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProbeStep {
    /// Sleep until then and poll again.
    WaitUntil(Instant),
    /// Send one probe now (marked in flight), then report it with
    /// [`Reachability::handle_probe`].
    Send,
    /// The address is healthy again, or another loop owns its suspicion: end.
    Stop,
}

/// A transition of one address (and whether it changed its DC's state):
/// what the driver logs, once per transition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Change {
    /// The address.
    pub addr: AddrSlot,
    /// Its DC.
    pub dc: DcSlot,
    /// Suspect now (else healthy again).
    pub suspect: bool,
    /// The suspicion that ended (or began) lasted this long (zero when it began).
    pub suspect_for: Duration,
    /// Whether the DC as a whole changed (became suspect: all its addresses
    /// are; healthy again: one answers).
    pub dc_changed: bool,
    /// The probe loop to start for this suspicion (only when it began).
    pub epoch: u64,
}

#[derive(Debug, Clone, Copy)]
enum AddrState {
    Healthy,
    Suspect(Suspicion),
}

#[derive(Debug, Clone, Copy)]
struct Suspicion {
    since: Instant,
    /// Names this suspicion, so a probe loop of an earlier one stops.
    epoch: u64,
    probes_failed: u32,
    next: Probe,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Probe {
    DueAt(Instant),
    InFlight,
}

/// The reachability of every address of every DC. See the module docs.
#[derive(Debug)]
pub struct Reachability {
    schedule: ProbeSchedule,
    /// Per address: its DC and its state.
    addrs: Vec<(DcSlot, AddrState)>,
    /// Per DC: its addresses, in the order they are tried.
    dcs: Vec<Vec<AddrSlot>>,
    /// Source of the jitter: a seeded sequence, so a run replays.
    jitter_state: u64,
    next_epoch: u64,
}

impl Reachability {
    /// All addresses healthy. `dc_of_addr[i]` is the DC of address `i`;
    /// `seed` draws the jitter (the driver picks it at random).
    ///
    /// # Panics
    /// If the schedule is unusable (a zero interval, a cap below it, jitter
    /// above 100 %): the resolver checks its config before building this.
    pub fn new(schedule: ProbeSchedule, dc_of_addr: &[DcSlot], seed: u64) -> Reachability {
        assert!(
            schedule.interval_ms > 0
                && schedule.interval_max_ms >= schedule.interval_ms
                && schedule.jitter_percent <= 100,
            "probe schedule {schedule:?}"
        );
        let dc_count = dc_of_addr.iter().map(|d| d.0 + 1).max().unwrap_or(0);
        let mut dcs = vec![Vec::new(); dc_count];
        for (i, dc) in dc_of_addr.iter().enumerate() {
            dcs[dc.0].push(AddrSlot(i));
        }
        assert!(
            dcs.iter().all(|addrs| !addrs.is_empty()),
            "every dc has an address: {dc_of_addr:?}"
        );
        Reachability {
            schedule,
            addrs: dc_of_addr
                .iter()
                .map(|dc| (*dc, AddrState::Healthy))
                .collect(),
            dcs,
            jitter_state: seed,
            next_epoch: 0,
        }
    }

    /// Adds an address of `dc` — a DC already here, or the next DC slot
    /// (`DcSlot(dc_count)`) for a DC new to the table — healthy, tried after
    /// the DC's other addresses; its slot.
    ///
    /// # Panics
    /// If `dc` is past the next DC slot.
    pub fn add_addr(&mut self, dc: DcSlot) -> AddrSlot {
        assert!(dc.0 <= self.dcs.len(), "dc slot {} skips a slot", dc.0);
        if dc.0 == self.dcs.len() {
            self.dcs.push(Vec::new());
        }
        let addr = AddrSlot(self.addrs.len());
        self.addrs.push((dc, AddrState::Healthy));
        self.dcs[dc.0].push(addr);
        addr
    }

    /// Where a request to `dc` goes now: its first healthy address, or
    /// nowhere if all are suspect.
    ///
    /// # Panics
    /// If `dc` is not in the table (the driver's slots come from it).
    pub fn route(&self, dc: DcSlot) -> Route {
        let mut oldest: Option<Instant> = None;
        for addr in &self.dcs[dc.0] {
            match self.addrs[addr.0].1 {
                AddrState::Healthy => return Route::Ask(*addr),
                AddrState::Suspect(s) => {
                    oldest = Some(oldest.map_or(s.since, |o| o.min(s.since)));
                }
            }
        }
        Route::Suspect {
            // Invariant: every DC has an address (asserted in `new`), and
            // none is healthy, so one suspicion was seen.
            since: oldest.expect("a dc has an address"),
        }
    }

    /// Whether every address of `dc` is suspect.
    pub fn dc_suspect(&self, dc: DcSlot) -> bool {
        matches!(self.route(dc), Route::Suspect { .. })
    }

    /// DCs that are suspect now.
    pub fn dcs_suspect(&self) -> usize {
        (0..self.dcs.len())
            .filter(|d| self.dc_suspect(DcSlot(*d)))
            .count()
    }

    /// `addr` answered a request (any answer, even an error reply): healthy.
    pub fn handle_answer(&mut self, addr: AddrSlot, now: Instant) -> Option<Change> {
        let (dc, state) = self.addrs[addr.0];
        let AddrState::Suspect(s) = state else {
            return None;
        };
        let dc_was_suspect = self.dc_suspect(dc);
        self.addrs[addr.0].1 = AddrState::Healthy;
        Some(Change {
            addr,
            dc,
            suspect: false,
            suspect_for: now.saturating_duration_since(s.since),
            dc_changed: dc_was_suspect,
            epoch: s.epoch,
        })
    }

    /// A request to `addr` timed out or could not connect: suspect, if it
    /// was not already. The change names the probe loop to start.
    pub fn handle_failure(&mut self, addr: AddrSlot, now: Instant) -> Option<Change> {
        let (dc, state) = self.addrs[addr.0];
        if let AddrState::Suspect(_) = state {
            return None;
        }
        let epoch = self.next_epoch;
        self.next_epoch += 1;
        let first = now + self.wait(0);
        self.addrs[addr.0].1 = AddrState::Suspect(Suspicion {
            since: now,
            epoch,
            probes_failed: 0,
            next: Probe::DueAt(first),
        });
        Some(Change {
            addr,
            dc,
            suspect: true,
            suspect_for: Duration::ZERO,
            dc_changed: self.dc_suspect(dc),
            epoch,
        })
    }

    /// What the probe loop `epoch` of `addr` does now.
    pub fn poll_probe(&mut self, addr: AddrSlot, epoch: u64, now: Instant) -> ProbeStep {
        let AddrState::Suspect(s) = &mut self.addrs[addr.0].1 else {
            return ProbeStep::Stop;
        };
        if s.epoch != epoch {
            return ProbeStep::Stop;
        }
        match s.next {
            // Invariant: only this loop sends, and it reports before polling.
            Probe::InFlight => ProbeStep::Stop,
            Probe::DueAt(at) if at > now => ProbeStep::WaitUntil(at),
            Probe::DueAt(_) => {
                s.next = Probe::InFlight;
                ProbeStep::Send
            }
        }
    }

    /// The probe of loop `epoch` to `addr` got an answer (`answered`) or
    /// not. An answer clears the suspicion whichever loop sent it.
    pub fn handle_probe(
        &mut self,
        addr: AddrSlot,
        epoch: u64,
        answered: bool,
        now: Instant,
    ) -> Option<Change> {
        if answered {
            return self.handle_answer(addr, now);
        }
        let failed = match &self.addrs[addr.0].1 {
            AddrState::Suspect(s) if s.epoch == epoch => s.probes_failed.saturating_add(1),
            _ => return None,
        };
        let wait = self.wait(failed);
        if let AddrState::Suspect(s) = &mut self.addrs[addr.0].1 {
            s.probes_failed = failed;
            s.next = Probe::DueAt(now + wait);
        }
        None
    }

    /// The wait before the next probe after `failed` failed probes:
    /// doubling from the interval up to the cap, spread by the jitter.
    fn wait(&mut self, failed: u32) -> Duration {
        let ProbeSchedule {
            interval_ms,
            interval_max_ms,
            jitter_percent,
        } = self.schedule;
        let doublings = failed.min(BACKOFF_DOUBLINGS_MAX);
        let base = interval_ms
            .saturating_mul(1 << doublings)
            .min(interval_max_ms);
        let spread = base * u64::from(jitter_percent) / 100;
        // Uniform in [base - spread, base + spread].
        let offset = self.draw() % (2 * spread + 1);
        Duration::from_millis(base - spread + offset)
    }

    /// splitmix64: cheap, seeded, good enough to spread probe times.
    fn draw(&mut self) -> u64 {
        self.jitter_state = self.jitter_state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.jitter_state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const IAD: DcSlot = DcSlot(0);
    const FRA: DcSlot = DcSlot(1);

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn schedule(jitter_percent: u8) -> ProbeSchedule {
        ProbeSchedule {
            interval_ms: 100,
            interval_max_ms: 800,
            jitter_percent,
        }
    }

    /// iad and fra, one address each (slots 0 and 1).
    fn two_dcs(jitter_percent: u8) -> Reachability {
        Reachability::new(schedule(jitter_percent), &[IAD, FRA], 7)
    }

    #[test]
    fn an_address_added_later_is_tried_after_the_dcs_others_and_a_new_dc_gets_the_next_slot() {
        let now = Instant::now();
        let mut r = two_dcs(0);
        let second = r.add_addr(IAD);
        assert_eq!(second, AddrSlot(2));
        assert_eq!(r.route(IAD), Route::Ask(AddrSlot(0)));
        r.handle_failure(AddrSlot(0), now);
        assert_eq!(r.route(IAD), Route::Ask(second));
        let sin = DcSlot(2);
        let only = r.add_addr(sin);
        assert_eq!(r.route(sin), Route::Ask(only));
        r.handle_failure(only, now);
        assert!(r.dc_suspect(sin));
        assert_eq!(r.dcs_suspect(), 1);
    }

    /// Runs `addr`'s probe loop `epoch` until it sends, from `now`; returns
    /// when it sent.
    fn until_send(r: &mut Reachability, addr: AddrSlot, epoch: u64, mut now: Instant) -> Instant {
        for _ in 0..10 {
            match r.poll_probe(addr, epoch, now) {
                ProbeStep::Send => return now,
                ProbeStep::WaitUntil(at) => {
                    assert!(at > now, "a wait moves time forward");
                    now = at;
                }
                ProbeStep::Stop => panic!("the loop stopped while suspect"),
            }
        }
        panic!("no probe after ten waits");
    }

    #[test]
    fn healthy_dcs_are_asked_at_their_address() {
        let r = two_dcs(0);
        assert_eq!(r.route(IAD), Route::Ask(AddrSlot(0)));
        assert_eq!(r.route(FRA), Route::Ask(AddrSlot(1)));
        assert_eq!(r.dcs_suspect(), 0);
    }

    #[test]
    fn a_timeout_makes_the_dc_suspect_once_and_only_that_dc() {
        let mut r = two_dcs(0);
        let t0 = Instant::now();
        let change = r.handle_failure(AddrSlot(0), t0).expect("a transition");
        assert!(change.suspect && change.dc_changed && change.dc == IAD);
        assert_eq!(r.route(IAD), Route::Suspect { since: t0 });
        assert_eq!(r.route(FRA), Route::Ask(AddrSlot(1)), "fra is unaffected");
        // More timeouts (requests in flight before the suspicion) change nothing.
        assert_eq!(r.handle_failure(AddrSlot(0), t0 + ms(5)), None);
        assert_eq!(r.dcs_suspect(), 1);
    }

    #[test]
    fn one_probe_at_a_time_backing_off_to_the_cap() {
        let mut r = two_dcs(0);
        let t0 = Instant::now();
        let epoch = r.handle_failure(AddrSlot(0), t0).unwrap().epoch;
        assert_eq!(
            r.poll_probe(AddrSlot(0), epoch, t0),
            ProbeStep::WaitUntil(t0 + ms(100))
        );
        let mut now = t0;
        let mut sent = Vec::new();
        for _ in 0..6 {
            let at = until_send(&mut r, AddrSlot(0), epoch, now);
            sent.push(at.duration_since(now).as_millis());
            // While in flight, nothing else is sent.
            assert_eq!(r.poll_probe(AddrSlot(0), epoch, at), ProbeStep::Stop);
            // The probe times out 50 ms later.
            now = at + ms(50);
            assert_eq!(r.handle_probe(AddrSlot(0), epoch, false, now), None);
        }
        // From each probe's failure to the next probe: doubling, capped.
        assert_eq!(sent, [100, 200, 400, 800, 800, 800]);
        assert!(r.dc_suspect(IAD));
    }

    #[test]
    fn the_first_answer_clears_the_suspicion_for_everyone_and_stops_the_loop() {
        let mut r = two_dcs(20);
        let t0 = Instant::now();
        let epoch = r.handle_failure(AddrSlot(0), t0).unwrap().epoch;
        let at = until_send(&mut r, AddrSlot(0), epoch, t0);
        let change = r
            .handle_probe(AddrSlot(0), epoch, true, at + ms(3))
            .expect("healthy again");
        assert!(!change.suspect && change.dc_changed);
        assert_eq!(change.suspect_for, (at + ms(3)).duration_since(t0));
        assert_eq!(r.route(IAD), Route::Ask(AddrSlot(0)));
        assert_eq!(r.poll_probe(AddrSlot(0), epoch, at), ProbeStep::Stop);
        // A second answer is no transition: one log line per transition.
        assert_eq!(r.handle_answer(AddrSlot(0), at + ms(4)), None);
    }

    #[test]
    fn a_late_answer_to_a_request_also_clears_it() {
        let mut r = two_dcs(0);
        let t0 = Instant::now();
        let epoch = r.handle_failure(AddrSlot(0), t0).unwrap().epoch;
        assert!(r.handle_answer(AddrSlot(0), t0 + ms(1)).is_some());
        assert_eq!(
            r.poll_probe(AddrSlot(0), epoch, t0 + ms(500)),
            ProbeStep::Stop
        );
    }

    #[test]
    fn a_loop_of_an_earlier_suspicion_stops_and_the_new_one_probes() {
        let mut r = two_dcs(0);
        let t0 = Instant::now();
        let old = r.handle_failure(AddrSlot(0), t0).unwrap().epoch;
        r.handle_answer(AddrSlot(0), t0 + ms(1));
        let new = r.handle_failure(AddrSlot(0), t0 + ms(2)).unwrap().epoch;
        assert_ne!(old, new);
        assert_eq!(
            r.poll_probe(AddrSlot(0), old, t0 + ms(500)),
            ProbeStep::Stop
        );
        assert_eq!(r.handle_probe(AddrSlot(0), old, false, t0 + ms(500)), None);
        assert_eq!(
            r.poll_probe(AddrSlot(0), new, t0 + ms(500)),
            ProbeStep::Send
        );
    }

    #[test]
    fn jitter_spreads_waits_within_the_bound_and_replays_from_the_seed() {
        let waits = |seed| {
            let mut r = Reachability::new(schedule(20), &[IAD], seed);
            (0..200).map(|_| r.wait(0)).collect::<Vec<_>>()
        };
        let a = waits(1);
        assert!(a.iter().all(|w| (ms(80)..=ms(120)).contains(w)), "{a:?}");
        assert!(a.iter().any(|w| *w != a[0]), "spread, not constant");
        assert_eq!(a, waits(1), "a seed replays");
        assert_ne!(a, waits(2));
    }

    #[test]
    fn a_dc_with_two_addresses_is_suspect_only_when_both_are() {
        // iad: slots 0 and 1; fra: slot 2.
        let mut r = Reachability::new(schedule(0), &[IAD, IAD, FRA], 3);
        let t0 = Instant::now();
        let first = r.handle_failure(AddrSlot(0), t0).unwrap();
        assert!(first.suspect && !first.dc_changed);
        assert_eq!(r.route(IAD), Route::Ask(AddrSlot(1)), "the other address");
        let second = r.handle_failure(AddrSlot(1), t0 + ms(10)).unwrap();
        assert!(second.dc_changed);
        assert_eq!(r.route(IAD), Route::Suspect { since: t0 });
        // Either address answering makes the DC routable again.
        let back = r.handle_answer(AddrSlot(1), t0 + ms(20)).unwrap();
        assert!(back.dc_changed);
        assert_eq!(r.route(IAD), Route::Ask(AddrSlot(1)));
        assert!(
            r.handle_answer(AddrSlot(0), t0 + ms(30))
                .is_some_and(|c| !c.dc_changed)
        );
        assert_eq!(r.route(IAD), Route::Ask(AddrSlot(0)));
    }

    #[test]
    #[should_panic(expected = "probe schedule")]
    fn an_unusable_schedule_is_refused() {
        let bad = ProbeSchedule {
            interval_ms: 0,
            ..ProbeSchedule::default()
        };
        Reachability::new(bad, &[IAD], 0);
    }
}
