//! The discrete-event core: a run builds the world from its scenario and
//! seed (the DCs, hosts and routers, the global store, the network, the
//! checker), then its loop takes each event in (true time, sequence
//! number) order and dispatches it to the actor it concerns — a DC given a
//! [`DcCtx`], a host a [`HostCtx`], a router a [`RouterCtx`] — records it
//! in the trace and stops at the first violated invariant. One [`Rng`]
//! seeded from the run's seed makes every choice; maps are `BTreeMap`s, so
//! nothing depends on hash order, and the wall clock is read only to
//! report events per second.

use crate::counter::{Counter, Op};
use std::collections::BTreeMap;

use homing_core::{
    DcId, DcStanding, FencingToken, HostTime, LeasePolicy, PreviousRun, ReservationId, RunOutcome,
    TailView,
};

use crate::checker::Checker;
use crate::clock::NodeClock;
use crate::dc::{Dc, DcCtx, Peers, new_upkeep};
use crate::event::{Event, Homingd, HostTimer, Message, NodeId};
use crate::global::{GlobalCut, GlobalStore};
use crate::host::{Host, HostCtx};
use crate::invariants::{View, Violation};
use crate::keys::Keys;
use crate::network::{Network, Partition};
use crate::observe::Observer;
use crate::report::{Measurements, Work};
use crate::rng::Rng;
use crate::router::{Router, RouterCtx};
use crate::rules::Rules;
use crate::scan::Scanner;
use crate::scenario::{Fault, Scenario, ScenarioError};
use crate::trace::{NO_KEY, Trace, TraceRecord};
use crate::wakeups::{Connections, WakeChecker};
use crate::watch::Watcher;
use crate::world::{Regions, World};

/// How to run.
#[derive(Debug, Clone, Copy, Default)]
pub struct RunOptions {
    /// Print every processed event (replay).
    pub print_trace: bool,
}

/// A violated invariant, as reported.
#[derive(Debug, Clone)]
pub struct InvariantFailure {
    /// The run's scenario name (`swarm`: drawn from the seed).
    pub scenario: String,
    /// The run's seed.
    pub seed: u64,
    /// Index of the event after which the invariant failed.
    pub event_index: u64,
    /// True time, µs.
    pub at_us: u64,
    /// The violation.
    pub violation: Violation,
    /// The last events concerning the key, formatted.
    pub trace: Vec<String>,
}

impl std::fmt::Display for InvariantFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "INVARIANT VIOLATED: {} (seed {}, event #{}, t={:.3}ms)",
            self.violation.invariant.name(),
            self.seed,
            self.event_index,
            self.at_us as f64 / 1000.0
        )?;
        writeln!(f, "  {}", self.violation.detail)?;
        writeln!(f, "  last events for this key:")?;
        for line in &self.trace {
            writeln!(f, "    {line}")?;
        }
        if self.scenario == crate::swarm::SWARM {
            write!(f, "  replay: homing-sim replay swarm --seed {}", self.seed)
        } else {
            write!(
                f,
                "  replay: homing-sim replay <{}.toml> --seed {}",
                self.scenario, self.seed
            )
        }
    }
}

/// What a run produced.
#[derive(Debug)]
pub struct Outcome {
    /// The seed.
    pub seed: u64,
    /// The scenario's name.
    pub scenario: String,
    /// Events processed.
    pub events: u64,
    /// Simulated time reached, µs.
    pub sim_us: u64,
    /// FNV-1a over every processed event.
    pub trace_hash: u64,
    /// The first invariant violation, if any.
    pub failure: Option<InvariantFailure>,
    /// Latency and round-trip samples per operation.
    pub measurements: Measurements,
}

/// The whole simulated world.
pub struct Sim {
    pub(crate) seed: u64,
    pub(crate) scenario: Scenario,
    pub(crate) policy: LeasePolicy,
    pub(crate) rules: Rules,
    /// Time, the pending events, the network and the run's randomness.
    pub(crate) world: World,
    end_us: u64,
    pub(crate) dcs: Vec<Dc>,
    pub(crate) hosts: Vec<Host>,
    pub(crate) routers: Vec<Router>,
    /// The global store.
    pub(crate) global: GlobalStore,
    /// The run's keys, numbered.
    pub(crate) keys: Keys,
    pub(crate) dc_index: BTreeMap<DcId, u16>,
    pub(crate) checker: Checker,
    pub(crate) trace: Trace,
    pub(crate) measurements: Measurements,
    events: u64,
    options: RunOptions,
}

fn ms_to_us(ms: u64) -> u64 {
    ms.saturating_mul(1000)
}

impl Sim {
    /// A world for `scenario` and `seed`, applying `rules` in every DC.
    pub fn new(
        scenario: &Scenario,
        seed: u64,
        rules: Rules,
        options: RunOptions,
    ) -> Result<Sim, ScenarioError> {
        let policy = scenario.policy()?;
        let rtt = scenario.rtt_matrix_ms()?;
        let mut rng = Rng::new(seed);
        let c = &scenario.clocks;
        let mut dcs = Vec::new();
        let mut dc_index = BTreeMap::new();
        for (i, name) in scenario.dcs.iter().enumerate() {
            let id = DcId::new(name.as_str())
                .map_err(|e| ScenarioError(format!("dcs: {name:?}: {e}")))?;
            let clock = NodeClock::new(
                rng.signed(c.store_offset_ms * 1000),
                rng.signed(c.store_drift_ppm),
            );
            dc_index.insert(id.clone(), i as u16);
            let limits = homing_node::WaitLimits {
                per_key: scenario.waiting.waiters_per_key_max,
                total: scenario.waiting.waiters_max,
                handoff_ms: scenario.waiting.handoff_ms,
            };
            let upkeep = || new_upkeep(id.clone(), policy, &scenario.stores, rules.mutations);
            let keys_max = scenario.keys_per_namespace_max;
            let endpoint = Dc::endpoint_config(&id, &policy, rules.mutations, keys_max, limits);
            let n = scenario.instances_per_dc;
            dcs.push(Dc::new(i as u16, clock, n, upkeep, endpoint));
        }
        let mut hosts = Vec::new();
        // The first hosts of each DC hold their keys under host sessions.
        let w = &scenario.workload;
        let session_hosts = (f64::from(scenario.hosts_per_dc) * w.session_fraction).round() as u32;
        for d in 0..dcs.len() {
            for i in 0..scenario.hosts_per_dc {
                let clock = NodeClock::new(
                    rng.signed(c.host_offset_ms * 1000),
                    rng.signed(c.host_drift_ppm),
                );
                let (idx, n) = (hosts.len() as u32, scenario.instances_per_dc);
                let first = (idx % u32::from(n)) as u8;
                let session_keys = (i < session_hosts).then_some(w.session_keys);
                hosts.push(Host::new(idx, d as u16, (n, first), clock, session_keys));
            }
        }
        let mut routers = Vec::new();
        let ids: Vec<DcId> = dcs.iter().map(|dc| dc.id.clone()).collect();
        for (d, rtt_ms) in rtt.iter().enumerate() {
            for slot in 0..scenario.routers_per_dc {
                let seed = rng.next_u64();
                let region = d as u16;
                let idx = routers.len() as u32;
                let mut router = Router::new(
                    idx,
                    region,
                    (&ids, scenario.instances_per_dc),
                    rtt_ms,
                    seed,
                    rules.mutations,
                );
                if slot == 0 && scenario.workload.watch {
                    router.watcher = Some(Watcher::new(idx, region));
                }
                if slot == 0 && scenario.workload.scan_interval_ms > 0 {
                    router.scanner = Some(Scanner::new(idx, region));
                }
                routers.push(router);
            }
        }
        let mut partitions = Vec::new();
        let mut global_cuts = Vec::new();
        for fault in &scenario.faults {
            match fault {
                Fault::Partition {
                    from,
                    to,
                    at_ms,
                    for_ms,
                    one_way,
                } => partitions.push(Partition {
                    from: scenario.dc_index(from)?,
                    to: scenario.dc_index(to)?,
                    start_us: ms_to_us(*at_ms),
                    end_us: ms_to_us(at_ms + for_ms),
                    one_way: *one_way,
                }),
                Fault::SlowStore {
                    dc,
                    at_ms,
                    for_ms,
                    factor: amount,
                }
                | Fault::FailingStore {
                    dc,
                    at_ms,
                    for_ms,
                    fraction: amount,
                } => {
                    let window = (ms_to_us(*at_ms), ms_to_us(at_ms + for_ms), *amount);
                    let faults = &mut dcs[scenario.dc_index(dc)?].store_faults;
                    match fault {
                        Fault::SlowStore { .. } => faults.slow.push(window),
                        _ => faults.failing.push(window),
                    }
                }
                Fault::CutFromGlobal { dc, at_ms, for_ms } => global_cuts.push(GlobalCut {
                    dc: dcs[scenario.dc_index(dc)?].id.clone(),
                    start_us: ms_to_us(*at_ms),
                    end_us: ms_to_us(at_ms + for_ms),
                }),
                _ => {}
            }
        }
        let n = &scenario.network;
        let network = Network::new(&rtt, n.jitter_ms, n.loss, partitions);
        let dc_clocks = dcs.iter().map(|d| d.clock).collect();
        // Longer than any resolve can take (every hop may wait for its timeout)
        // plus the time its answer stays cached.
        let hops_max = homing_core::chain::HOP_LIMIT_DEFAULT as u64 + 2;
        let horizon_us =
            ms_to_us(scenario.workload.tail_ttl_ms + hops_max * n.request_timeout_ms + 1000);
        // Slack for a wake-up: a timer's millisecond, a few store operations
        // at their slowest (a waiter's read, an expire's read and CAS, a
        // release computed one operation before it lands).
        let slow = (dcs.iter())
            .map(|d| d.store_faults.slowest())
            .fold(1.0, f64::max);
        let op_us = (scenario.stores.dc_op_ms + scenario.stores.dc_op_jitter_ms) * 1000.0;
        let mut allowance_us = 5_000 + (6.0 * op_us * slow) as u64;
        if scenario.instances_per_dc > 1 {
            // A write through one homingd reaches the waiters parked at
            // another when its log follower next reads the log: one
            // interval and two store reads (the page, the record) later.
            allowance_us += ms_to_us(scenario.log_follow_ms) + (2.0 * op_us * slow) as u64;
        }
        let connections = Connections {
            idle_us: ms_to_us(n.idle_timeout_ms),
            keep_alive_us: ms_to_us(n.keep_alive_ms),
            rtt_us: (0..dcs.len())
                .map(|a| (0..dcs.len()).map(|b| network.rtt_us(a, b)).collect())
                .collect(),
        };
        let wake = WakeChecker::new(
            allowance_us,
            scenario.waiting.handoff_ms,
            connections,
            dcs.iter().map(|d| d.clock).collect(),
            policy,
            scenario.instances_per_dc,
        );
        let regions = Regions {
            hosts: hosts.iter().map(|h| h.dc).collect(),
            routers: routers.iter().map(|r| r.region).collect(),
        };
        let world = World::new(
            rng,
            network,
            regions,
            ms_to_us(n.request_timeout_ms),
            ms_to_us(n.idle_timeout_ms),
            scenario.encode_messages,
        );
        let global = GlobalStore::new(
            dcs.iter().map(|d| &d.id),
            scenario.stores.global_nearest_lag_ms,
            global_cuts,
        );
        let mut sim = Sim {
            seed,
            scenario: scenario.clone(),
            policy,
            rules,
            world,
            end_us: ms_to_us(scenario.duration_ms),
            dcs,
            hosts,
            routers,
            global,
            checker: Checker::new(
                scenario.keys as usize,
                dc_clocks,
                policy,
                horizon_us,
                absent_staleness_us(scenario),
                wake,
            ),
            keys: Keys::new(scenario.keys),
            dc_index,
            trace: Trace::default(),
            measurements: Measurements::default(),
            events: 0,
            options,
        };
        sim.schedule_start();
        Ok(sim)
    }

    fn schedule_start(&mut self) {
        // Each DC's lease: checked and renewed once before it serves.
        for h in self.homingd() {
            self.on_dc(h, |dc| dc.lease_open());
        }
        let w = self.scenario.workload.clone();
        for h in 0..self.hosts.len() {
            let at = ms_to_us(self.world.rng.exp(w.think_ms));
            self.world.schedule(
                at,
                Event::Host {
                    host: h as u32,
                    incarnation: 0,
                    timer: HostTimer::Act,
                    generation: 0,
                },
            );
        }
        for r in 0..self.routers.len() {
            let at = self.world.rng.exp(w.resolve_interval_ms * 1000.0);
            self.world
                .schedule(at, Event::RouterTick { router: r as u32 });
            if self.routers[r].watcher.is_some() {
                self.world
                    .schedule(at, Event::RouterWatch { router: r as u32 });
            }
            if self.routers[r].scanner.is_some() {
                let first = ms_to_us(w.scan_interval_ms) / 2 + at;
                self.world
                    .schedule(first, Event::RouterScan { router: r as u32 });
            }
        }
        let reap = ms_to_us(self.scenario.stores.reaper_interval_ms.max(1));
        for h in self.homingd() {
            let at = self.world.rng.below(reap) + 1;
            self.world.schedule(at, Event::Reap { dc: h });
        }
        if self.scenario.instances_per_dc > 1 {
            for h in self.homingd() {
                let at = self.world.rng.below(ms_to_us(self.scenario.log_follow_ms)) + 1;
                let event = Event::LogFollow { dc: h, epoch: 0 };
                self.world.schedule(at, event);
            }
        }
        if w.host_crash_interval_ms > 0.0 && !self.hosts.is_empty() {
            let at = ms_to_us(self.world.rng.exp(w.host_crash_interval_ms));
            self.world.schedule(at, Event::HostCrash);
        }
        for fault in self.scenario.faults.clone() {
            self.schedule_suspicion_checks(&fault);
            match fault {
                Fault::CrashDc {
                    dc,
                    at_ms,
                    for_ms,
                    store_lost,
                    graceful,
                    instance,
                } => {
                    // Invariant: fault DCs were checked when the scenario was parsed.
                    let d = self.scenario.dc_index(&dc).expect("checked dc") as u16;
                    let all = 0..self.scenario.instances_per_dc;
                    for i in instance.map_or(all, |i| i..i + 1) {
                        let dc = Homingd::new(d, i);
                        let stop = match graceful {
                            true => Event::DcClose { dc },
                            false => Event::DcCrash { dc },
                        };
                        self.world.schedule(ms_to_us(at_ms), stop);
                        let restart = Event::DcRestart { dc, store_lost };
                        self.world.schedule(ms_to_us(at_ms + for_ms), restart);
                    }
                }
                Fault::CutFromGlobal { dc, at_ms, for_ms } => {
                    let dc = self.scenario.dc_index(&dc).expect("checked dc") as u16;
                    let dc = Homingd::new(dc, 0);
                    let start_us = ms_to_us(at_ms);
                    self.world
                        .schedule(ms_to_us(at_ms + for_ms), Event::CutEnds { dc, start_us });
                }
                Fault::Drain { at_ms, count } => {
                    self.world.schedule(ms_to_us(at_ms), Event::Drain { count })
                }
                Fault::DrainScope { dc, at_ms } => {
                    let dc = self.scenario.dc_index(&dc).expect("checked dc") as u16;
                    let dc = Homingd::new(dc, 0);
                    self.world
                        .schedule(ms_to_us(at_ms), Event::DrainScope { dc });
                }
                Fault::CrashHosts {
                    dc,
                    at_ms,
                    fraction,
                } => {
                    let dc = self.scenario.dc_index(&dc).expect("checked dc") as u16;
                    let fraction_ppm = (fraction.clamp(0.0, 1.0) * 1e6) as u32;
                    self.world
                        .schedule(ms_to_us(at_ms), Event::CrashHosts { dc, fraction_ppm });
                }
                Fault::Partition { .. } | Fault::SlowStore { .. } | Fault::FailingStore { .. } => {}
            }
        }
    }

    /// After a partition or a DC crash, one check per DC involved that no
    /// router still suspects it a few probe cycles after the fault ended. A
    /// cycle: a probe in flight times out, the next comes after the longest
    /// probe interval (plus jitter), and its answer travels the widest RTT.
    /// Two cycles without message loss; with loss, five (four probes lost in
    /// a row at 1 % loss each way: about 2·10⁻⁷ per recovery).
    fn schedule_suspicion_checks(&mut self, fault: &Fault) {
        let (dcs, end_ms) = match fault {
            Fault::Partition {
                from,
                to,
                at_ms,
                for_ms,
                ..
            } => (vec![from.clone(), to.clone()], at_ms + for_ms),
            Fault::CrashDc {
                dc, at_ms, for_ms, ..
            } => (vec![dc.clone()], at_ms + for_ms),
            _ => return,
        };
        let schedule = homing_core::reachability::ProbeSchedule::default();
        let cycle_ms = self.scenario.network.request_timeout_ms
            + schedule.interval_max_ms * (100 + u64::from(schedule.jitter_percent)) / 100
            + 2 * self.world.network.rtt_max_us() / 1000;
        let cycles = if self.scenario.network.loss > 0.0 {
            5
        } else {
            2
        };
        let bound_ms = cycles * cycle_ms + 500;
        for dc in dcs {
            // Invariant: fault DCs were checked when the scenario was parsed.
            let dc = self.scenario.dc_index(&dc).expect("checked dc") as u16;
            let ended_us = ms_to_us(end_ms);
            self.world.schedule(
                ms_to_us(end_ms + bound_ms),
                Event::SuspicionCheck { dc, ended_us },
            );
        }
    }

    /// [`Invariant::SuspicionClears`] for `dc`, unless another fault window
    /// was open since the fault ended at `ended_us`: a suspicion that began
    /// before it ended must be gone (a newer one — a lost message — is a
    /// new suspicion).
    fn suspicion_check(&mut self, dc: u16, ended_us: u64) {
        let (ended_ms, now_ms) = (ended_us / 1000, self.world.now / 1000);
        if self.scenario.faulty_between(ended_ms + 1, now_ms) || !self.dcs[usize::from(dc)].up {
            return;
        }
        let ended = self.world.instant_at(ended_us);
        let stale = |r: &&Router| r.suspects_since(dc).is_some_and(|since| since <= ended);
        if let Some(router) = self.routers.iter().find(stale) {
            let detail = format!(
                "router {} still holds dc {} suspect, since before its fault ended, {} ms after",
                router.idx,
                self.dcs[usize::from(dc)].id,
                (self.world.now - ended_us) / 1000
            );
            self.checker.on_suspicion_not_cleared(detail);
        }
    }

    /// Runs to the end of the scenario or the first violation.
    pub fn run(mut self) -> Outcome {
        let mut failure = None;
        while let Some(next) = self.world.pop() {
            if next.at_us > self.end_us {
                break;
            }
            // Liveness obligations due before this event are judged on the
            // state that held until it.
            if let Some(f) = self.check_due(next.at_us) {
                failure = Some(f);
                break;
            }
            self.world.now = next.at_us;
            self.events += 1;
            self.world.current_key = NO_KEY;
            let what = next.event.name();
            let (node, detail) = self.describe(&next.event);
            let verbose = self
                .options
                .print_trace
                .then(|| format!("{:?}", next.event));
            self.dispatch(next.event);
            let record = TraceRecord {
                index: self.events,
                at_us: self.world.now,
                what,
                node,
                key: self.world.current_key,
                detail,
            };
            self.trace.push(record);
            if let Some(v) = verbose {
                println!("{}  {}", format_record(&record, &self.scenario), short(&v));
            }
            if let Some(violation) = self.checker.take_violation() {
                failure = Some(self.failure(violation));
                break;
            }
        }
        if failure.is_none() {
            failure = self.check_end();
        }
        let late = self.checker.previous_expired_released_late;
        if late > 0 {
            self.measurements
                .counters
                .insert(Counter::PreviousExpiredReleasedLate, late);
        }
        Outcome {
            seed: self.seed,
            scenario: self.scenario.name.clone(),
            events: self.events,
            sim_us: self.world.now,
            trace_hash: self.trace.hash(),
            failure,
            measurements: self.measurements,
        }
    }

    /// Judges the wake-up obligations that fell due before `before_us`.
    fn check_due(&mut self, before_us: u64) -> Option<InvariantFailure> {
        let view = view!(self);
        let (at_us, violation) = self.checker.wake.check_due(before_us, &view)?;
        Some(self.failure_at(violation, at_us))
    }

    /// The end-of-run (liveness) checks.
    fn check_end(&mut self) -> Option<InvariantFailure> {
        if let Some(f) = self.check_due(self.end_us + 1) {
            return Some(f);
        }
        let interval = self.scenario.stores.reaper_interval_ms.max(1) * 1000;
        let up_since: Vec<u64> = self.dcs.iter().map(|d| d.up_since_us).collect();
        let view = view!(self);
        self.checker
            .on_end(&view, self.world.now, interval, &up_since);
        let violation = self.checker.take_violation()?;
        Some(self.failure(violation))
    }

    /// The report of `violation`, found now: the seed, where, and the key's last events.
    fn failure(&self, violation: Violation) -> InvariantFailure {
        self.failure_at(violation, self.world.now)
    }

    /// The report of `violation`, due at `at_us`.
    fn failure_at(&self, violation: Violation, at_us: u64) -> InvariantFailure {
        let key = violation.key.unwrap_or(NO_KEY);
        InvariantFailure {
            scenario: self.scenario.name.clone(),
            seed: self.seed,
            event_index: self.events,
            at_us,
            trace: self
                .trace
                .last_for_key(key, 24)
                .iter()
                .map(|r| format_record(r, &self.scenario))
                .collect(),
            violation,
        }
    }

    fn describe(&mut self, event: &Event) -> (u32, u64) {
        match event {
            Event::Deliver(m) => {
                self.world.current_key = m.key;
                (m.to.code(), m.rpc)
            }
            Event::Store { dc, task, .. } => (dc.code().into(), *task),
            Event::GlobalSet(g) => {
                self.world.current_key = g.key;
                (g.dc.code().into(), g.task)
            }
            Event::Timeout { node, rpc } => (node.code(), *rpc),
            Event::Host {
                host, generation, ..
            } => (NodeId::Host(*host).code(), *generation),
            Event::RouterTick { router }
            | Event::RouterWatch { router }
            | Event::RouterScan { router } => (NodeId::Router(*router).code(), 0),
            Event::RouterProbe { router, epoch, .. } => (NodeId::Router(*router).code(), *epoch),
            Event::SuspicionCheck { dc, ended_us } => (u32::from(*dc), *ended_us),
            Event::DcTask { dc, task, .. } => (dc.code().into(), *task),
            Event::ConnectionLost { dc, rpc, .. } => (dc.code().into(), *rpc),
            Event::Reap { dc }
            | Event::DcCrash { dc }
            | Event::DcClose { dc }
            | Event::DcCloseCheck { dc }
            | Event::DcRestart { dc, .. } => (dc.code().into(), 0),
            Event::ReconcileRetry { dc, epoch } => (dc.code().into(), u64::from(*epoch)),
            Event::DcLeaseTick { dc, generation, .. } => (dc.code().into(), *generation),
            Event::DcRenewalLands { dc, seq, .. } | Event::DcRenewalTimeout { dc, seq, .. } => {
                (dc.code().into(), *seq)
            }
            Event::DcLeaseExpiry { dc, received_us } => (dc.code().into(), *received_us),
            Event::MarksTimeout { dc, task, .. } | Event::GlobalFailed { dc, task, .. } => {
                (dc.code().into(), *task)
            }
            Event::CutEnds { dc, start_us } => (dc.code().into(), *start_us),
            Event::LogFollow { dc, epoch } => (dc.code().into(), u64::from(*epoch)),
            Event::HostRestart { host } => (NodeId::Host(*host).code(), 0),
            Event::HostCrash => (u32::MAX, 0),
            Event::Drain { count } => (u32::MAX, u64::from(*count)),
            Event::DrainScope { dc } => (dc.code().into(), 0),
            Event::CrashHosts { dc, fraction_ppm } => (u32::from(*dc), u64::from(*fraction_ppm)),
        }
    }

    fn dispatch(&mut self, event: Event) {
        match event {
            Event::Deliver(message) => self.deliver(*message),
            Event::Store { dc, epoch, task } => self.on_dc(dc, |dc| dc.store_done(epoch, task)),
            Event::GlobalSet(set) => self.on_dc(set.dc, |dc| dc.global_set_lands(*set)),
            Event::Timeout { node, rpc } => match node {
                NodeId::Dc(d) => self.on_dc(d, |dc| dc.timeout(rpc)),
                NodeId::Host(h) => self.on_host(h, |host, ctx| host.timeout(rpc, ctx)),
                NodeId::Router(r) => self.on_router(r, |router, ctx| router.timeout(rpc, ctx)),
            },
            Event::Host {
                host,
                incarnation,
                timer,
                generation,
            } => self.on_host(host, |host, ctx| {
                host.timer(incarnation, timer, generation, ctx)
            }),
            Event::RouterTick { router } => self.on_router(router, Router::tick),
            Event::RouterWatch { router } => self.on_router(router, Router::watch),
            Event::RouterScan { router } => self.on_router(router, Router::scan),
            Event::RouterProbe { router, dc, epoch } => {
                self.on_router(router, |router, ctx| router.probe(dc, epoch, ctx))
            }
            Event::SuspicionCheck { dc, ended_us } => self.suspicion_check(dc, ended_us),
            Event::DcTask {
                dc,
                epoch,
                task,
                generation,
            } => self.on_dc(dc, |dc| dc.task_timer(epoch, task, generation)),
            Event::ConnectionLost { dc, rpc, reset } => {
                self.on_dc(dc, |dc| dc.connection_lost(rpc, reset))
            }
            Event::Reap { dc } => self.on_dc(dc, |dc| dc.reap()),
            Event::HostCrash => {
                let h = self.world.rng.below(self.hosts.len() as u64) as u32;
                self.on_host(h, Host::crash);
                let mean = self.scenario.workload.host_crash_interval_ms;
                let at = self.world.now + ms_to_us(self.world.rng.exp(mean));
                self.world.schedule(at, Event::HostCrash);
            }
            Event::HostRestart { host } => self.on_host(host, Host::restart),
            Event::DcCrash { dc } => self.on_dc(dc, |dc| dc.crash()),
            Event::DcClose { dc } => self.on_dc(dc, |dc| dc.close()),
            Event::DcCloseCheck { dc } => self.on_dc(dc, |dc| dc.close_check()),
            Event::ReconcileRetry { dc, epoch } => self.on_dc(dc, |dc| dc.reconcile_retry(epoch)),
            Event::DcRestart { dc, store_lost } => self.on_dc(dc, |dc| dc.restart(store_lost)),
            Event::DcLeaseTick {
                dc,
                epoch,
                generation,
            } => self.on_dc(dc, |dc| dc.lease_tick(epoch, generation)),
            Event::DcRenewalLands {
                dc,
                epoch,
                seq,
                terms,
                marks,
            } => self.on_dc(dc, |dc| dc.renewal_lands(epoch, seq, terms, marks)),
            Event::DcRenewalTimeout { dc, epoch, seq } => {
                self.on_dc(dc, |dc| dc.renewal_timeout(epoch, seq))
            }
            Event::DcLeaseExpiry { dc, received_us } => {
                self.on_dc(dc, |dc| dc.lease_expiry(received_us))
            }
            Event::MarksTimeout { dc, epoch, task } => {
                self.on_dc(dc, |dc| dc.marks_timeout(epoch, task))
            }
            Event::GlobalFailed { dc, epoch, task } => {
                self.on_dc(dc, |dc| dc.global_failed(epoch, task))
            }
            Event::CutEnds { dc, start_us } => self.on_dc(dc, |dc| dc.cut_ends(start_us)),
            Event::LogFollow { dc, epoch } => self.on_dc(dc, |dc| dc.follow_log(epoch)),
            Event::Drain { count } => self.drain_keys(count),
            Event::DrainScope { dc } => self.on_dc(dc, |dc| dc.drain_scope_begin()),
            Event::CrashHosts { dc, fraction_ppm } => {
                for h in 0..self.hosts.len() {
                    if self.hosts[h].dc == dc
                        && self.world.rng.below(1_000_000) < u64::from(fraction_ppm)
                    {
                        self.on_host(h as u32, Host::crash);
                    }
                }
            }
        }
    }

    fn deliver(&mut self, message: Message) {
        match message.to {
            NodeId::Dc(d) => self.on_dc(d, |dc| dc.receive(message)),
            NodeId::Host(h) => self.on_host(h, |host, ctx| host.receive(message, ctx)),
            NodeId::Router(r) => self.on_router(r, |router, ctx| router.receive(message, ctx)),
        }
    }

    /// The `drain` fault: an operator drains `count` random keys, each
    /// through a random running DC.
    fn drain_keys(&mut self, count: u32) {
        for _ in 0..count {
            let k = self.world.rng.below(self.keys.all().len() as u64) as usize;
            let d = self.world.rng.below(self.dcs.len() as u64) as u16;
            let Some(i) = self.dcs[usize::from(d)].running_from(0) else {
                continue;
            };
            self.measurements.count(Counter::DrainRequested);
            let key = self.keys.all()[k].clone();
            self.on_dc(Homingd::new(d, i), |dc| dc.drain_start(k as u32, key));
        }
    }

    /// Every homingd of every DC, DC by DC.
    fn homingd(&self) -> Vec<Homingd> {
        let n = self.scenario.instances_per_dc;
        (0..self.dcs.len() as u16)
            .flat_map(|d| (0..n).map(move |i| Homingd::new(d, i)))
            .collect()
    }

    /// Homingd `h` handles an event with `handle`, given its context: itself,
    /// its peers to read, the world, the global store, the keys, the
    /// checker and measurements, and the run's settings.
    fn on_dc<R>(&mut self, h: Homingd, handle: impl FnOnce(&mut DcCtx) -> R) -> R {
        let (before, rest) = self.dcs.split_at_mut(h.d());
        // Invariant: events name DCs of the simulation.
        let (dc, after) = rest.split_first_mut().expect("a dc of the simulation");
        // The homingd handling the event is the context's; its siblings
        // wait outside the DC meanwhile (nothing reads them: each homingd
        // learns of the others only through the shared store).
        let mut instances = std::mem::take(&mut dc.instances);
        // Invariant: events name homingd of their DC.
        let inst = (instances.get_mut(usize::from(h.instance()))).expect("a homingd of the dc");
        let mut ctx = DcCtx {
            dc,
            inst,
            peers: Peers {
                before,
                after,
                index: &self.dc_index,
            },
            world: &mut self.world,
            global: &mut self.global,
            keys: &mut self.keys,
            checker: &mut self.checker,
            measurements: &mut self.measurements,
            scenario: &self.scenario,
            policy: self.policy,
            rules: self.rules,
        };
        let out = handle(&mut ctx);
        self.dcs[h.d()].instances = instances;
        out
    }

    /// Router `r` handles an event with `handle`, given the world, the
    /// checker and measurements as its observer, and what it may read.
    fn on_router(&mut self, r: u32, handle: impl FnOnce(&mut Router, &mut RouterCtx)) {
        let router = &mut self.routers[r as usize];
        let mut observers = observers!(self);
        let mut ctx = RouterCtx {
            world: &mut self.world,
            observer: &mut observers,
            keys: self.keys.all(),
            workload: &self.scenario.workload,
            region_store: &self.dcs[usize::from(router.region)].store,
        };
        handle(router, &mut ctx);
    }

    /// Host `h` handles an event with `handle`, given the world, the
    /// checker and measurements as its observer, and what it may read.
    fn on_host(&mut self, h: u32, handle: impl FnOnce(&mut Host, &mut HostCtx)) {
        let host = &mut self.hosts[h as usize];
        let dc_up = self.dcs[usize::from(host.dc)].up;
        let mut observers = observers!(self);
        let mut ctx = HostCtx {
            world: &mut self.world,
            observer: &mut observers,
            keys: self.keys.all(),
            scenario: &self.scenario,
            dc_up,
        };
        handle(host, &mut ctx);
    }
}

/// The checker's view of the simulator `$sim`: a macro, so that the checker
/// (a field beside these) stays borrowable mutably in the same call.
macro_rules! view {
    ($sim:expr) => {
        View {
            dcs: &$sim.dcs,
            global: $sim.global.entries(),
            keys: $sim.keys.all(),
            dc_index: &$sim.dc_index,
            successions: $sim.global.successions(),
        }
    };
}
use view;

/// The checker and the measurements, borrowed together with what the
/// checker judges against: what an actor reports to.
struct Observers<'a> {
    checker: &'a mut Checker,
    measurements: &'a mut Measurements,
    view: View<'a>,
    /// The global store: what it keeps of each DC's lease.
    global: &'a GlobalStore,
}

/// The [`Observers`] of the simulator `$sim`: a macro, so that the actor
/// and the world (fields beside these) stay borrowable mutably.
macro_rules! observers {
    ($sim:expr) => {
        Observers {
            checker: &mut $sim.checker,
            measurements: &mut $sim.measurements,
            view: view!($sim),
            global: &$sim.global,
        }
    };
}
use observers;

impl Observer for Observers<'_> {
    fn record(&mut self, op: Op, latency_us: u64, rtts: u32, model_rtts: u32) {
        self.measurements.record(op, latency_us, rtts, model_rtts);
    }

    fn count(&mut self, what: Counter) {
        self.measurements.count(what);
    }

    fn on_resolve(&mut self, key: u32, start_us: u64, now_us: u64, answer: Option<&TailView>) {
        self.checker
            .on_resolve(&self.view, key, start_us, now_us, answer);
    }

    fn on_resolve_error(&mut self, key: u32, error: String) {
        self.checker.on_resolve_error(key, error);
    }

    fn on_watch_gap(&mut self, detail: String) {
        self.checker.on_watch_gap(detail);
    }

    fn on_scan_broken(&mut self, detail: String) {
        self.checker.on_scan_broken(detail);
    }

    fn on_inspect_broken(&mut self, detail: String) {
        self.checker.on_inspect_broken(detail);
    }

    fn take_acquire_work(&mut self, rpc: u64) -> Work {
        self.measurements.take_acquire_work(rpc)
    }

    fn on_release_sent(
        &mut self,
        reservation: &ReservationId,
        token: FencingToken,
        outcome: &RunOutcome,
    ) {
        self.checker.on_release_sent(reservation, token, outcome);
    }

    fn on_acquired(
        &mut self,
        key: u32,
        reservation: &ReservationId,
        token: FencingToken,
        previous: Option<&PreviousRun>,
    ) {
        self.checker
            .on_acquired(&self.view, key, reservation, token, previous);
    }

    fn on_holder_start(
        &mut self,
        now_us: u64,
        key: u32,
        host: u32,
        token: FencingToken,
        reservation: &ReservationId,
    ) {
        let dc = reservation.dc();
        if let Some(lease) = self.global.lease(dc)
            && lease.standing(now_us) == DcStanding::Expired
        {
            self.checker
                .on_holder_start_under_expired_dc(dc, key, host, reservation);
        }
        self.checker
            .on_holder_start(now_us, key, host, token, reservation);
    }

    fn on_holder_stop(&mut self, now_us: u64, key: u32, host: u32) {
        self.checker.on_holder_stop(now_us, key, host);
    }

    fn on_holder_check(&mut self, key: u32, host: u32, host_ms: u64, hard: HostTime) {
        self.checker.on_holder_check(key, host, host_ms, hard);
    }

    fn on_acquire_unanswered(&mut self, key: u32, detail: String) {
        self.checker.on_acquire_unanswered(key, detail);
    }
}

fn short(text: &str) -> &str {
    let mut end = text.len().min(200);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// A trace record as one human-readable line.
pub fn format_record(r: &TraceRecord, scenario: &Scenario) -> String {
    let node = if r.node == u32::MAX {
        "-".to_string()
    } else {
        match r.node >> 30 {
            0 => {
                // Invariant: a DC's code is its homingd's, 16 bits.
                let h = Homingd::from_code(r.node as u16);
                let dc = scenario.dcs.get(h.d()).map_or("?", |s| s.as_str());
                match h.instance() {
                    0 => format!("dc:{dc}"),
                    i => format!("dc:{dc}.{i}"),
                }
            }
            1 => format!("host:{}", r.node & 0x3fff_ffff),
            _ => format!("router:{}", r.node & 0x3fff_ffff),
        }
    };
    let key = if r.key == NO_KEY {
        String::new()
    } else {
        format!(" key=k{}", r.key)
    };
    format!(
        "#{} t={:.3}ms {} {}{} [{}]",
        r.index,
        r.at_us as f64 / 1000.0,
        r.what,
        node,
        key,
        r.detail
    )
}

/// How old a `NotFound` may be (docs/CONSISTENCY.md §5): the DC's absent
/// TTL (from its global read), the router's (from the reply's receipt), and
/// the reply's one-way trip (half the widest RTT plus jitter: a reply is
/// delivered that late or lost), with 1 % for clocks that run fast.
fn absent_staleness_us(scenario: &Scenario) -> u64 {
    use homing_core::chain::{NODE_ABSENT_TTL_MS_DEFAULT, RESOLVER_ABSENT_TTL_MS_DEFAULT};
    // Invariant: the scenario was validated, its matrix with it.
    let rtt_max_ms = scenario
        .rtt_matrix_ms()
        .expect("a validated scenario")
        .iter()
        .flatten()
        .fold(0.0_f64, |max, rtt| max.max(*rtt));
    let trip_us = ((rtt_max_ms / 2.0 + scenario.network.jitter_ms) * 1000.0).ceil() as u64;
    let ttl_us = (NODE_ABSENT_TTL_MS_DEFAULT + RESOLVER_ABSENT_TTL_MS_DEFAULT) * 1000;
    (ttl_us + trip_us) * 101 / 100
}
