//! The simulation's vocabulary: the nodes ([`NodeId`]), what travels
//! between them ([`Message`], its [`Body`]) and what happens at an instant
//! of true time ([`Event`]). Plain data: every actor and the core that
//! schedules them speak it, and it speaks of none of them.

use homing_core::{AcquireReply, DcMarks, DcTerms, Reply, Request};

/// A node of the simulation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum NodeId {
    /// A DC's daemon: one homingd of the DC.
    Dc(Homingd),
    /// A host agent.
    Host(u32),
    /// An edge router.
    Router(u32),
}

impl NodeId {
    /// A compact code for the trace.
    pub fn code(self) -> u32 {
        match self {
            NodeId::Dc(h) => u32::from(h.code()),
            NodeId::Host(i) => (1 << 30) | i,
            NodeId::Router(i) => (2 << 30) | i,
        }
    }
}

/// One homingd: a DC (its index into the scenario's `dcs`) and which of
/// the DC's instances (several may serve one DC over its shared store).
/// Packed in 16 bits, the instance above the DC, so that instance 0's
/// code is the DC's index.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Homingd(u16);

impl Homingd {
    /// Most DCs a simulation has.
    pub const DCS_MAX: usize = 1 << 12;
    /// Most homingd one DC runs.
    pub const INSTANCES_MAX: u8 = 16;

    /// Instance `instance` of DC `dc`.
    pub fn new(dc: u16, instance: u8) -> Homingd {
        assert!(usize::from(dc) < Self::DCS_MAX && instance < Self::INSTANCES_MAX);
        Homingd(dc | u16::from(instance) << 12)
    }

    /// Its DC's index.
    pub fn dc(self) -> u16 {
        self.0 & 0x0fff
    }

    /// Its DC's index, for indexing.
    pub fn d(self) -> usize {
        usize::from(self.dc())
    }

    /// Which of its DC's instances.
    pub fn instance(self) -> u8 {
        (self.0 >> 12) as u8
    }

    /// The homingd whose [`Homingd::code`] is `code`.
    pub fn from_code(code: u16) -> Homingd {
        Homingd(code)
    }

    /// A compact code for traces (instance 0's is its DC's index).
    pub fn code(self) -> u16 {
        self.0
    }
}

impl std::fmt::Display for Homingd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.instance() {
            0 => write!(f, "{}", self.dc()),
            i => write!(f, "{}.{i}", self.dc()),
        }
    }
}

/// What a message carries: a homing wire request or reply.
#[derive(Debug, Clone)]
pub enum Body {
    /// A request.
    Request(Request),
    /// A reply to the request with the same RPC id.
    Reply(Reply),
}

/// One message in flight.
#[derive(Debug, Clone)]
pub struct Message {
    /// Sender.
    pub from: NodeId,
    /// Receiver.
    pub to: NodeId,
    /// RPC id, shared by a request and its reply.
    pub rpc: u64,
    /// The key concerned (for traces), or `NO_KEY`.
    pub key: u32,
    /// The payload.
    pub body: Body,
}

/// The global store's write landing (it lands even if the DC that sent it crashed).
#[derive(Debug, Clone)]
pub struct GlobalSet {
    /// The homingd that asked.
    pub dc: Homingd,
    /// Its epoch when it asked.
    pub epoch: u32,
    /// Its task.
    pub task: u64,
    /// The key index.
    pub key: u32,
    /// What is written, decided where it lands (as a store transaction
    /// would): a set-if-absent, a confirm or a takeover.
    pub write: homing_node::GlobalOp,
}

/// A host's timers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HostTimer {
    /// Idle: acquire a key.
    Act,
    /// A deadline of the lease (`HostLeasePoll::Wait`): poll it again.
    Lease,
    /// The graceful stop finished.
    Stopped,
    /// The workload releases the key.
    Leave,
    /// A cancel it owes is due to be sent again.
    Cancel,
    /// A session host: the graceful stop of the key of this hold finished.
    KeyStopped(u64),
    /// A session host: the workload releases the key of this hold.
    KeyLeave(u64),
}

impl HostTimer {
    /// The timer's name, for traces.
    pub fn name(self) -> &'static str {
        match self {
            HostTimer::Act => "host_act",
            HostTimer::Lease => "host_lease_deadline",
            HostTimer::Stopped => "host_stopped",
            HostTimer::Leave => "host_leave",
            HostTimer::Cancel => "host_cancel_again",
            HostTimer::KeyStopped(_) => "host_key_stopped",
            HostTimer::KeyLeave(_) => "host_key_leave",
        }
    }
}

/// Something that happens at an instant of true time.
#[derive(Debug, Clone)]
pub enum Event {
    /// A message arrives.
    Deliver(Box<Message>),
    /// A DC-store operation of a DC task completes.
    Store {
        /// The DC.
        dc: Homingd,
        /// Its epoch when the operation started (a crash voids it).
        epoch: u32,
        /// The task.
        task: u64,
    },
    /// A global write-once lands.
    GlobalSet(Box<GlobalSet>),
    /// An RPC's reply did not come in time.
    Timeout {
        /// The requester.
        node: NodeId,
        /// The RPC.
        rpc: u64,
    },
    /// A host timer.
    Host {
        /// The host.
        host: u32,
        /// The host's incarnation when the timer was set.
        incarnation: u32,
        /// Which timer.
        timer: HostTimer,
        /// The lease generation it belongs to.
        generation: u64,
    },
    /// A router starts a resolve.
    RouterTick {
        /// The router.
        router: u32,
    },
    /// A router's scanner begins a scan of its DC's records.
    RouterScan {
        /// The router.
        router: u32,
    },
    /// A router's watcher asks its DC for events again.
    RouterWatch {
        /// The router.
        router: u32,
    },
    /// A router's probe loop for a suspect DC polls again.
    RouterProbe {
        /// The router.
        router: u32,
        /// The suspect DC.
        dc: u16,
        /// The suspicion the loop belongs to.
        epoch: u64,
    },
    /// A fault involving `dc` ended a few probe cycles ago: no router may
    /// still hold it suspect since before the fault ended (unless another
    /// fault window is open).
    SuspicionCheck {
        /// The DC.
        dc: u16,
        /// When the fault ended, true µs.
        ended_us: u64,
    },
    /// A DC task's timer (a waiter's select, an acquire's pause before registering again).
    DcTask {
        /// The DC.
        dc: Homingd,
        /// Its epoch when the timer was armed (a crash voids it).
        epoch: u32,
        /// The task.
        task: u64,
        /// The task's generation when armed (a later re-arm voids it).
        generation: u64,
    },
    /// The QUIC connection a DC's parked `Await` rode ended: it timed out,
    /// or (`reset`) the restarted tail's DC answered it with a stateless reset.
    ConnectionLost {
        /// The DC that sent the `Await`.
        dc: Homingd,
        /// Its RPC.
        rpc: u64,
        /// Ended by a stateless reset rather than the idle timeout.
        reset: bool,
    },
    /// A DC's reaper pass.
    Reap {
        /// The DC.
        dc: Homingd,
    },
    /// A random host crashes (the crash process).
    HostCrash,
    /// A crashed host comes back.
    HostRestart {
        /// The host.
        host: u32,
    },
    /// A DC crashes.
    DcCrash {
        /// The DC.
        dc: Homingd,
    },
    /// A DC starts a graceful shutdown.
    DcClose {
        /// The DC.
        dc: Homingd,
    },
    /// A closing DC looks whether its requests have finished.
    DcCloseCheck {
        /// The DC.
        dc: Homingd,
    },
    /// A DC tries its failed reconciliation again.
    ReconcileRetry {
        /// The DC.
        dc: Homingd,
        /// Its run then (a crash voids the retry).
        epoch: u32,
    },
    /// A DC restarts.
    DcRestart {
        /// The DC.
        dc: Homingd,
        /// On an empty store (its own was lost).
        store_lost: bool,
    },
    /// A DC's DC-lease renewal loop wakes.
    DcLeaseTick {
        /// The DC.
        dc: Homingd,
        /// Its epoch when armed.
        epoch: u32,
        /// The loop's generation when armed (a later arm voids it).
        generation: u64,
    },
    /// A DC-lease renewal reaches the global store (and, unless the DC is
    /// cut off by now, its answer the DC).
    DcRenewalLands {
        /// The DC.
        dc: Homingd,
        /// Its epoch when it sent the renewal.
        epoch: u32,
        /// The renewal's number.
        seq: u64,
        /// Its terms.
        terms: DcTerms,
        /// The marks it publishes.
        marks: DcMarks,
    },
    /// A DC-lease renewal was not answered within the renewal period.
    DcRenewalTimeout {
        /// The DC.
        dc: Homingd,
        /// Its epoch when it sent the renewal.
        epoch: u32,
        /// The renewal's number.
        seq: u64,
    },
    /// The global store would judge a DC's lease expired from now, unless
    /// a renewal landed after the one received at `received_us`.
    DcLeaseExpiry {
        /// The DC.
        dc: Homingd,
        /// When the store received the renewal this expiry follows, true µs.
        received_us: u64,
    },
    /// A write waiting for marks gives up.
    MarksTimeout {
        /// The DC.
        dc: Homingd,
        /// Its epoch when the write parked.
        epoch: u32,
        /// The task.
        task: u64,
    },
    /// A global read or write of a DC cut off from the global store fails.
    GlobalFailed {
        /// The DC.
        dc: Homingd,
        /// Its epoch when it asked.
        epoch: u32,
        /// The task.
        task: u64,
    },
    /// A DC's cut from the global store ends (measurements).
    CutEnds {
        /// The DC.
        dc: Homingd,
        /// When it began, true µs.
        start_us: u64,
    },
    /// A homingd of a DC with several reads its DC store's event log.
    LogFollow {
        /// The homingd.
        dc: Homingd,
        /// Its epoch when armed (a crash voids it).
        epoch: u32,
    },
    /// An operator drains keys.
    Drain {
        /// How many.
        count: u32,
    },
    /// An operator drains every lease of a DC.
    DrainScope {
        /// The DC.
        dc: Homingd,
    },
    /// Some of a DC's hosts crash.
    CrashHosts {
        /// The DC.
        dc: u16,
        /// Fraction, parts per million.
        fraction_ppm: u32,
    },
}

impl Event {
    /// The event's name, for traces.
    pub fn name(&self) -> &'static str {
        match self {
            Event::Deliver(m) => match &m.body {
                Body::Request(r) => r.kind(),
                Body::Reply(r) => reply_kind(r),
            },
            Event::Store { .. } => "store_done",
            Event::GlobalSet(_) => "global_set",
            Event::Timeout { .. } => "timeout",
            Event::Host { timer, .. } => timer.name(),
            Event::RouterTick { .. } => "router_tick",
            Event::RouterProbe { .. } => "router_probe",
            Event::RouterWatch { .. } => "router_watch",
            Event::RouterScan { .. } => "router_scan",
            Event::SuspicionCheck { .. } => "suspicion_check",
            Event::DcTask { .. } => "dc_task_timer",
            Event::ConnectionLost { .. } => "connection_lost",
            Event::Reap { .. } => "reap",
            Event::HostCrash => "host_crash",
            Event::HostRestart { .. } => "host_restart",
            Event::DcCrash { .. } => "dc_crash",
            Event::LogFollow { .. } => "dc_log_follow",
            Event::DcClose { .. } => "dc_close",
            Event::DcCloseCheck { .. } => "dc_close_check",
            Event::ReconcileRetry { .. } => "reconcile_retry",
            Event::DcRestart { .. } => "dc_restart",
            Event::DcLeaseTick { .. } => "dc_lease_tick",
            Event::DcRenewalLands { .. } => "dc_renewal_lands",
            Event::DcRenewalTimeout { .. } => "dc_renewal_timeout",
            Event::DcLeaseExpiry { .. } => "dc_lease_expiry",
            Event::MarksTimeout { .. } => "marks_timeout",
            Event::GlobalFailed { .. } => "global_failed",
            Event::CutEnds { .. } => "cut_ends",
            Event::Drain { .. } => "drain",
            Event::DrainScope { .. } => "drain_scope",
            Event::CrashHosts { .. } => "crash_hosts",
        }
    }
}

/// The kind of a reply, for traces.
pub fn reply_kind(reply: &Reply) -> &'static str {
    match reply {
        Reply::Resolved { .. } => "reply_resolved",
        Reply::Reservation(_) => "reply_reservation",
        Reply::Acquire(AcquireReply::Acquired(_)) => "reply_acquired",
        Reply::Acquire(AcquireReply::HeldElsewhere(_)) => "reply_held_elsewhere",
        Reply::Acquire(AcquireReply::TagMismatch { .. }) => "reply_tag_mismatch",
        Reply::Renew(_) => "reply_renew",
        Reply::Release(_) => "reply_release",
        Reply::Link(_) => "reply_link",
        Reply::Noted(_) => "reply_noted",
        Reply::Cancelled(_) => "reply_cancelled",
        Reply::Drained => "reply_drained",
        Reply::Inspected { .. } => "reply_inspected",
        Reply::Awaited(_) => "reply_awaited",
        Reply::Events { .. } => "reply_events",
        Reply::Records { .. } => "reply_records",
        Reply::DrainedPage { .. } => "reply_drained_page",
        Reply::Error(_) => "reply_error",
        Reply::Successor { .. } => "reply_successor",
        Reply::Directory(_) => "reply_directory",
        Reply::DcReport(_) => "reply_dc_report",
        Reply::SessionOpened { .. } => "reply_session_opened",
        Reply::SessionRenewed(_) => "reply_session_renewed",
        Reply::SessionClosed(_) => "reply_session_closed",
        Reply::SessionKeys { .. } => "reply_session_keys",
    }
}
