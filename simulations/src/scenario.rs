//! Scenario files: the knobs of a run, read from TOML. Every field has a
//! default, so a scenario names only what it changes. The seed is not part
//! of a scenario: a run is (scenario, seed).

use std::path::Path;

use homing_core::LeasePolicy;
use serde::Deserialize;

/// Round-trip times in ms between the built-in regions, from public
/// inter-region ping tables (rounded): iad (US East), fra (Frankfurt),
/// sin (Singapore), syd (Sydney), gru (São Paulo).
pub const REGION_RTT_MS: [(&str, &str, f64); 10] = [
    ("iad", "fra", 90.0),
    ("iad", "sin", 215.0),
    ("iad", "syd", 200.0),
    ("iad", "gru", 115.0),
    ("fra", "sin", 160.0),
    ("fra", "syd", 280.0),
    ("fra", "gru", 200.0),
    ("sin", "syd", 95.0),
    ("sin", "gru", 320.0),
    ("syd", "gru", 310.0),
];

/// A whole scenario.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Scenario {
    /// Name, used in reports.
    pub name: String,
    /// Simulated length of the run, ms of true time.
    pub duration_ms: u64,
    /// The DCs, one per region; names of the built-in table unless `network.rtt_ms` is given.
    pub dcs: Vec<String>,
    /// Number of keys the workload draws from (`k0`, `k1`, …).
    pub keys: u32,
    /// Edge routers per region.
    pub routers_per_dc: u32,
    /// Host agents per DC.
    pub hosts_per_dc: u32,
    /// homingd per DC, over the DC's one store (OPERATIONS "Several
    /// homingd per DC"); hosts, routers and peer DCs list them all.
    pub instances_per_dc: u8,
    /// How often each homingd of a DC with several reads the DC store's
    /// event log for the others' writes (homingd's `log_follow_ms`), ms.
    pub log_follow_ms: u64,
    /// Round-trip every message through `homing_core::wire::encode/decode`.
    pub encode_messages: bool,
    /// Network knobs.
    pub network: NetworkSpec,
    /// Store knobs.
    pub stores: StoreSpec,
    /// Lease policy of every DC.
    pub lease: LeaseSpec,
    /// Clock offsets and drifts.
    pub clocks: ClockSpec,
    /// What hosts and routers do.
    pub workload: WorkloadSpec,
    /// How DCs park acquirers that wait (homingd's `WaitLimits`).
    pub waiting: WaitingSpec,
    /// Keys each DC may create per namespace (homingd's
    /// `keys_per_namespace_max`; 0: unlimited): a create past it is refused
    /// `QuotaExceeded`.
    pub keys_per_namespace_max: u64,
    /// Faults injected at fixed times.
    pub faults: Vec<Fault>,
}

/// Network knobs.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct NetworkSpec {
    /// RTT matrix in ms (square, one row per DC); the built-in table when absent.
    pub rtt_ms: Option<Vec<Vec<f64>>>,
    /// RTT inside one region (host ↔ DC, router ↔ its region's DC), ms.
    pub intra_dc_rtt_ms: f64,
    /// Extra one-way delay, uniform in `0..=jitter_ms`.
    pub jitter_ms: f64,
    /// Probability that any one message is lost.
    pub loss: f64,
    /// How long any requester waits for a reply, ms (a request that asks to
    /// be parked, `wait_ms`, gets that much more, as in homing-net).
    pub request_timeout_ms: u64,
    /// QUIC idle timeout, ms: a parked `Await` rides a connection, and the
    /// origin learns that its registration is lost (the tail's DC crashed, or
    /// the path was cut for this long) this long after the last packet.
    pub idle_timeout_ms: u64,
    /// QUIC keep-alive of a DC's connections to its peers, ms (homing-net's
    /// `CLIENT_KEEP_ALIVE_INTERVAL_MS`): once a crashed tail's DC runs again
    /// (same identity, so the same stateless-reset key), the origin's next
    /// packet — at most this long after the restart — draws a stateless reset
    /// and the connection ends a round trip later, before the idle timeout.
    pub keep_alive_ms: u64,
}

/// Store knobs.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct StoreSpec {
    /// Latency of one DC-store operation (get, CAS, allocate), ms.
    pub dc_op_ms: f64,
    /// Extra DC-store latency, uniform in `0..=dc_op_jitter_ms`.
    pub dc_op_jitter_ms: f64,
    /// Latency of a global-store read from the nearest replica, ms.
    pub global_read_ms: f64,
    /// Latency of a global write-once (a consensus round), ms.
    pub global_write_ms: f64,
    /// How far the nearest replica a connect reads the global entry from
    /// (homingd's `GlobalStore::get_nearest`) lags the write-once: an entry
    /// that landed less than a uniform draw from `0..=` this many ms ago
    /// reads absent. Resolves read linearizably, never stale. 0: no lag.
    pub global_nearest_lag_ms: f64,
    /// How often each DC's upkeep pass (reap, orphan sweep) starts, ms.
    pub reaper_interval_ms: u64,
    /// A released record that lost its race is abandoned (on proof) once
    /// this old, ms (homingd's `orphan_age_ms`).
    pub orphan_age_ms: u64,
    /// The chance that a DC-store write in flight when its DC crashes lands
    /// anyway (committed, never acknowledged: the ambiguous commit); else
    /// it is lost. Per write, 0..=1.
    pub crash_lands_in_flight: f64,
    /// Events each DC store keeps in its event log; each upkeep pass trims
    /// older ones (homingd's `events_retained`, smaller by default so a
    /// simulation trims).
    pub events_retained: u64,
}

/// The lease policy, field by field (checked by `LeasePolicy::new`).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LeaseSpec {
    /// Lease length, ms.
    pub ttl_ms: u64,
    /// When to renew, thousandths of the lease.
    pub renew_at_permille: u16,
    /// Soft stop before the host-side end, ms.
    pub soft_margin_ms: u64,
    /// Hard stop before the host-side end, ms.
    pub hard_margin_ms: u64,
    /// DC slack after expiry before reaping, ms.
    pub grace_ms: u64,
}

/// Clock offsets (uniform in ±max) and drifts (uniform in ±max).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ClockSpec {
    /// Largest host clock offset, ms.
    pub host_offset_ms: i64,
    /// Largest DC clock offset, ms.
    pub store_offset_ms: i64,
    /// Largest host drift, ppm.
    pub host_drift_ppm: i64,
    /// Largest DC drift, ppm.
    pub store_drift_ppm: i64,
}

/// What hosts and routers do.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct WorkloadSpec {
    /// Mean idle time of a host before it acquires a key, ms.
    pub think_ms: f64,
    /// Mean time a host holds a key before releasing it (the churn), ms.
    pub hold_ms: f64,
    /// Mean gap between two resolves of one router, ms.
    pub resolve_interval_ms: f64,
    /// How long a router caches a tail's state, ms.
    pub tail_ttl_ms: u64,
    /// Fraction of resolves made as a freshly started router would (no cache at all).
    pub cold_fraction: f64,
    /// Mean gap between two host crashes anywhere (0 = none), ms.
    pub host_crash_interval_ms: f64,
    /// How long a crashed host stays down, ms.
    pub host_restart_ms: u64,
    /// Longest graceful stop after the soft deadline, ms (past the hard deadline it is killed).
    pub graceful_stop_ms: u64,
    /// Host retry interval for a failed renewal, ms.
    pub renew_retry_ms: u64,
    /// Fraction of acquires that go to a key drawn from the first 10% of keys (hot keys).
    pub hot_fraction: f64,
    /// `wait_ms` of the acquires that wait: how long a held key is awaited.
    pub acquire_wait_ms: u32,
    /// Fraction of acquires sent with `acquire_wait_ms` (the others answer at once).
    pub wait_fraction: f64,
    /// Fraction of releases that report `RunOutcome::Failed` (the others `Ok`).
    pub release_failed_fraction: f64,
    /// Whether each region's first router also watches its DC's event log.
    pub watch: bool,
    /// How long a watcher waits after an answer before it asks again, ms
    /// (0: at once, a long poll; more: a watcher that lags behind the log).
    pub watch_pause_ms: f64,
    /// How often each region's first router scans its DC's records from
    /// start to end (`homing scan`), ms; 0: never.
    pub scan_interval_ms: u64,
    /// Share of each DC's hosts that hold their keys under a host session
    /// (one heartbeat for all of them) instead of a lease per key.
    pub session_fraction: f64,
    /// Most keys a session host holds at once; it acquires the next after
    /// `think_ms` while it holds fewer.
    pub session_keys: u32,
}

/// homingd's `WaitLimits`: bounds on parked acquirers and the hand-off window.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct WaitingSpec {
    /// Most waiters on one reservation in one DC (more: `Overloaded`).
    pub waiters_per_key_max: usize,
    /// Most waiters in one DC (more: `Overloaded`).
    pub waiters_max: usize,
    /// How long a woken first waiter has the vacant reservation to itself, ms.
    pub handoff_ms: u64,
}

impl Default for WaitingSpec {
    fn default() -> WaitingSpec {
        WaitingSpec {
            waiters_per_key_max: 64,
            waiters_max: 10_000,
            handoff_ms: 2_000,
        }
    }
}

/// A fault at a fixed time.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, tag = "kind", rename_all = "snake_case")]
pub enum Fault {
    /// Messages from `from` to `to` (and back unless `one_way`) are dropped.
    Partition {
        /// One side (DC name).
        from: String,
        /// The other side.
        to: String,
        /// Start, ms.
        at_ms: u64,
        /// Length, ms.
        for_ms: u64,
        /// Only `from → to` is cut.
        #[serde(default)]
        one_way: bool,
    },
    /// A DC crashes (in-flight requests lost, committed writes kept) and restarts.
    CrashDc {
        /// The DC.
        dc: String,
        /// Crash time, ms.
        at_ms: u64,
        /// Downtime, ms.
        for_ms: u64,
        /// Its DC store is lost with it: it restarts on an empty store under
        /// the same id, which the floor check must refuse (homingd's
        /// start-up refusal: it stays down).
        #[serde(default)]
        store_lost: bool,
        /// A graceful shutdown (homingd's on SIGTERM) instead of a crash:
        /// parked requests answer, new ones are refused, those in flight
        /// finish, then the process exits (cut at the restart if not yet).
        #[serde(default)]
        graceful: bool,
        /// Only this homingd of the DC (its instance, from 0) stops; the
        /// DC's others run on. Absent: every homingd of the DC.
        #[serde(default)]
        instance: Option<u8>,
    },
    /// A DC is cut off from the global store: its DC-lease renewals and its
    /// global reads and writes fail; hosts, routers and peer DCs still reach it.
    CutFromGlobal {
        /// The DC.
        dc: String,
        /// Start, ms.
        at_ms: u64,
        /// Length, ms.
        for_ms: u64,
    },
    /// A DC's store gets `factor` times slower.
    SlowStore {
        /// The DC.
        dc: String,
        /// Start, ms.
        at_ms: u64,
        /// Length, ms.
        for_ms: u64,
        /// Latency multiplier.
        factor: f64,
    },
    /// A DC's store fails a `fraction` of its operations (reads, writes,
    /// allocations, index pages) with `Unavailable`, after their usual
    /// latency; a failed write still lands with probability
    /// `stores.crash_lands_in_flight` (the outcome a backend could not
    /// learn). Global reads and writes are not its store's.
    FailingStore {
        /// The DC.
        dc: String,
        /// Start, ms.
        at_ms: u64,
        /// Length, ms.
        for_ms: u64,
        /// Share of operations that fail, 0..=1.
        #[serde(default = "all")]
        fraction: f64,
    },
    /// An operator drains `count` random keys (renewals refused at their tails).
    Drain {
        /// When, ms.
        at_ms: u64,
        /// How many keys.
        count: u32,
    },
    /// An operator drains every lease of one DC (`homing drain --scope`
    /// over every namespace), page after page.
    DrainScope {
        /// The DC.
        dc: String,
        /// When, ms.
        at_ms: u64,
    },
    /// A fraction of one DC's hosts crash at once.
    CrashHosts {
        /// The DC.
        dc: String,
        /// When, ms.
        at_ms: u64,
        /// Fraction of its hosts, 0..=1.
        fraction: f64,
    },
}

impl Scenario {
    /// Whether a fault window that can delay a request — a partition, a DC
    /// crash, a slow store — overlaps `[from_ms, to_ms]` (simulated ms).
    /// Host crashes and drains are not: they end a host's run or a key's
    /// renewals, not a request. Message loss (`network.loss`, in effect all
    /// the time) is not a window either.
    pub fn faulty_between(&self, from_ms: u64, to_ms: u64) -> bool {
        self.faults.iter().any(|fault| {
            let (at_ms, for_ms) = match fault {
                Fault::Partition { at_ms, for_ms, .. }
                | Fault::CrashDc { at_ms, for_ms, .. }
                | Fault::CutFromGlobal { at_ms, for_ms, .. }
                | Fault::SlowStore { at_ms, for_ms, .. }
                | Fault::FailingStore { at_ms, for_ms, .. } => (*at_ms, *for_ms),
                Fault::Drain { .. } | Fault::DrainScope { .. } | Fault::CrashHosts { .. } => {
                    return false;
                }
            };
            at_ms <= to_ms && from_ms <= at_ms.saturating_add(for_ms)
        })
    }
}

impl Default for Scenario {
    fn default() -> Scenario {
        Scenario {
            name: "unnamed".into(),
            duration_ms: 60_000,
            dcs: ["iad", "fra", "sin", "syd", "gru"]
                .map(String::from)
                .to_vec(),
            keys: 200,
            routers_per_dc: 2,
            hosts_per_dc: 10,
            instances_per_dc: 1,
            log_follow_ms: 100,
            encode_messages: false,
            network: NetworkSpec::default(),
            stores: StoreSpec::default(),
            lease: LeaseSpec::default(),
            clocks: ClockSpec::default(),
            workload: WorkloadSpec::default(),
            waiting: WaitingSpec::default(),
            keys_per_namespace_max: homing_node::KEYS_PER_NAMESPACE_MAX_DEFAULT,
            faults: Vec::new(),
        }
    }
}

impl Default for NetworkSpec {
    fn default() -> NetworkSpec {
        NetworkSpec {
            rtt_ms: None,
            intra_dc_rtt_ms: 0.5,
            jitter_ms: 2.0,
            loss: 0.0,
            request_timeout_ms: homing_core::host_lease::REQUEST_TIMEOUT_MS_DEFAULT,
            idle_timeout_ms: 30_000,
            keep_alive_ms: 2_000,
        }
    }
}

impl Default for StoreSpec {
    fn default() -> StoreSpec {
        StoreSpec {
            dc_op_ms: 1.0,
            dc_op_jitter_ms: 0.5,
            global_read_ms: 1.0,
            global_write_ms: 40.0,
            global_nearest_lag_ms: 0.0,
            reaper_interval_ms: 1_000,
            orphan_age_ms: 60_000,
            crash_lands_in_flight: 0.5,
            events_retained: 10_000,
        }
    }
}

impl Default for LeaseSpec {
    fn default() -> LeaseSpec {
        let d = LeasePolicy::DEFAULT;
        LeaseSpec {
            ttl_ms: d.ttl_ms(),
            renew_at_permille: d.renew_at_permille(),
            soft_margin_ms: d.soft_margin_ms(),
            hard_margin_ms: d.hard_margin_ms(),
            grace_ms: d.grace_ms(),
        }
    }
}

impl Default for ClockSpec {
    fn default() -> ClockSpec {
        ClockSpec {
            host_offset_ms: 500,
            store_offset_ms: 500,
            host_drift_ppm: 20,
            store_drift_ppm: 20,
        }
    }
}

impl Default for WorkloadSpec {
    fn default() -> WorkloadSpec {
        WorkloadSpec {
            think_ms: 2_000.0,
            hold_ms: 8_000.0,
            resolve_interval_ms: 20.0,
            tail_ttl_ms: 1_000,
            cold_fraction: 0.02,
            host_crash_interval_ms: 0.0,
            host_restart_ms: 5_000,
            graceful_stop_ms: 1_500,
            renew_retry_ms: 300,
            hot_fraction: 0.3,
            acquire_wait_ms: 0,
            wait_fraction: 0.0,
            release_failed_fraction: 0.0,
            watch: true,
            watch_pause_ms: 0.0,
            scan_interval_ms: 10_000,
            session_fraction: 0.0,
            session_keys: 4,
        }
    }
}

/// A fault's default share: all of it.
fn all() -> f64 {
    1.0
}

/// Why a scenario cannot run; names the field.
#[derive(Debug)]
pub struct ScenarioError(pub String);

impl std::fmt::Display for ScenarioError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ScenarioError {}

impl Scenario {
    /// Parses a scenario from TOML text.
    pub fn from_toml(text: &str) -> Result<Scenario, ScenarioError> {
        let scenario: Scenario =
            toml::from_str(text).map_err(|e| ScenarioError(format!("scenario: {e}")))?;
        scenario.validate()?;
        Ok(scenario)
    }

    /// Checks every rule a runnable scenario keeps; the error names the field.
    pub fn validate(&self) -> Result<(), ScenarioError> {
        let scenario = self;
        scenario.policy()?;
        scenario.rtt_matrix_ms()?;
        if scenario.keys == 0 {
            return Err(ScenarioError("keys must be at least 1".into()));
        }
        let w = &scenario.workload;
        if w.acquire_wait_ms > homing_core::wire::WAIT_MS_MAX {
            return Err(ScenarioError(format!(
                "workload.acquire_wait_ms must be at most {} (WAIT_MS_MAX)",
                homing_core::wire::WAIT_MS_MAX
            )));
        }
        if !(0.0..=1.0).contains(&w.session_fraction) || w.session_keys == 0 {
            return Err(ScenarioError(
                "workload.session_fraction must be within 0..=1 and session_keys at least 1".into(),
            ));
        }
        let waiting = &scenario.waiting;
        if waiting.waiters_per_key_max == 0 || waiting.waiters_max == 0 || waiting.handoff_ms == 0 {
            return Err(ScenarioError(
                "waiting: waiters_per_key_max, waiters_max and handoff_ms must be at least 1"
                    .into(),
            ));
        }
        let n = scenario.instances_per_dc;
        if !(1..=crate::event::Homingd::INSTANCES_MAX).contains(&n) || scenario.log_follow_ms == 0 {
            return Err(ScenarioError(format!(
                "instances_per_dc ({n}) must be within 1..={}, log_follow_ms at least 1",
                crate::event::Homingd::INSTANCES_MAX
            )));
        }
        for fault in &scenario.faults {
            if let Fault::CrashDc {
                instance: Some(i), ..
            } = fault
                && *i >= n
            {
                return Err(ScenarioError(format!(
                    "crash_dc: instance {i} is not below instances_per_dc ({n})"
                )));
            }
            match fault {
                Fault::Partition { from, to, .. } => {
                    scenario.dc_index(from)?;
                    scenario.dc_index(to)?;
                }
                Fault::CrashDc { dc, .. }
                | Fault::CutFromGlobal { dc, .. }
                | Fault::SlowStore { dc, .. }
                | Fault::DrainScope { dc, .. }
                | Fault::CrashHosts { dc, .. } => {
                    scenario.dc_index(dc)?;
                }
                Fault::FailingStore { dc, fraction, .. } => {
                    scenario.dc_index(dc)?;
                    if !(0.0..=1.0).contains(fraction) {
                        return Err(ScenarioError(format!(
                            "failing_store: fraction {fraction} is not within 0..=1"
                        )));
                    }
                }
                Fault::Drain { .. } => {}
            }
        }
        Ok(())
    }

    /// Reads and parses a scenario file.
    pub fn load(path: &Path) -> Result<Scenario, ScenarioError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| ScenarioError(format!("{}: {e}", path.display())))?;
        Scenario::from_toml(&text)
    }

    /// The lease policy, or the rule the `[lease]` table breaks.
    pub fn policy(&self) -> Result<LeasePolicy, ScenarioError> {
        let l = &self.lease;
        LeasePolicy::new(
            l.ttl_ms,
            l.renew_at_permille,
            l.soft_margin_ms,
            l.hard_margin_ms,
            l.grace_ms,
        )
        .map_err(|e| ScenarioError(format!("lease: {e}")))
    }

    /// The index of DC `name`.
    pub fn dc_index(&self, name: &str) -> Result<usize, ScenarioError> {
        self.dcs
            .iter()
            .position(|d| d == name)
            .ok_or_else(|| ScenarioError(format!("unknown dc {name:?}")))
    }

    /// The RTT matrix in ms, from `network.rtt_ms` or the built-in table.
    pub fn rtt_matrix_ms(&self) -> Result<Vec<Vec<f64>>, ScenarioError> {
        let n = self.dcs.len();
        if n == 0 {
            return Err(ScenarioError("dcs must name at least one dc".into()));
        }
        if let Some(m) = &self.network.rtt_ms {
            if m.len() != n || m.iter().any(|row| row.len() != n) {
                return Err(ScenarioError(format!(
                    "network.rtt_ms must be {n}x{n}, one row per dc"
                )));
            }
            return Ok(m.clone());
        }
        let mut m = vec![vec![self.network.intra_dc_rtt_ms; n]; n];
        for (i, a) in self.dcs.iter().enumerate() {
            for (j, b) in self.dcs.iter().enumerate() {
                if i == j {
                    continue;
                }
                m[i][j] = REGION_RTT_MS
                    .iter()
                    .find(|(x, y, _)| (x == a && y == b) || (x == b && y == a))
                    .map(|r| r.2)
                    .ok_or_else(|| {
                        ScenarioError(format!(
                            "no built-in rtt between {a} and {b}: give network.rtt_ms"
                        ))
                    })?;
            }
        }
        Ok(m)
    }
}
