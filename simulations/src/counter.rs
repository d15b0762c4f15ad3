//! What the simulator counts and times: notable protocol outcomes (link
//! replies, drains, kills, wait paths…), one [`Counter`] each, the
//! durations it samples, one [`Timing`] each — named in reports by their
//! `snake_case` names — and the operations whose latency it samples, one
//! [`Op`] each.

/// Declares an enum of named measurements with each variant's report name.
macro_rules! named {
    ($(#[$what:meta])* $enum:ident { $($(#[$doc:meta])* $variant:ident = $name:literal,)* }) => {
        $(#[$what])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
        pub enum $enum {
            $($(#[$doc])* $variant,)*
        }

        impl $enum {
            /// Every one.
            pub const ALL: &[$enum] = &[$($enum::$variant,)*];

            /// Its name in reports (`snake_case`).
            pub fn name(self) -> &'static str {
                match self {
                    $($enum::$variant => $name,)*
                }
            }
        }

        impl std::fmt::Display for $enum {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.name())
            }
        }
    };
}

named! {
    /// One notable outcome the simulator counts.
    Counter {
        /// A host's acquire retry answered from the acquire it joined.
        AcquireAnsweredAgain = "acquire_answered_again",
        /// An acquire answered at once because its DC shut down gracefully.
        AcquireAnsweredAtShutdown = "acquire_answered_at_shutdown",
        /// An acquire answered `Inconsistent`.
        AcquireErrorInconsistent = "acquire_error_inconsistent",
        /// An acquire answered an error of another kind.
        AcquireErrorOther = "acquire_error_other",
        /// An acquire answered `Overloaded`.
        AcquireErrorOverloaded = "acquire_error_overloaded",
        /// An acquire answered `QuotaExceeded`: its DC created as many keys
        /// in the namespace as it may.
        AcquireErrorQuota = "acquire_error_quota",
        /// An acquire answered `Unavailable`.
        AcquireErrorUnavailable = "acquire_error_unavailable",
        /// A host sent its acquire again after no answer.
        AcquireRetriedAtHost = "acquire_retried_at_host",
        /// A host's acquire retry joined the acquire still running at its DC.
        AcquireRetryJoined = "acquire_retry_joined",
        /// A host gave up on an acquire (no answer within its timeout).
        AcquireTimedOutAtHost = "acquire_timed_out_at_host",
        /// A host gave up on an acquire while no fault was active.
        AcquireTimedOutAtHostWithNoFault = "acquire_timed_out_at_host_with_no_fault",
        /// An acquire's wait ended by its DC's graceful shutdown (`ClosedWhileWaiting`).
        AcquireWaitClosedAtShutdown = "acquire_wait_closed_at_shutdown",
        /// A grant reached a host that had crashed meanwhile.
        AcquiredAfterTheHostCrashed = "acquired_after_the_host_crashed",
        /// The same, for an acquire that had waited.
        AcquiredAfterTheHostCrashedWaiting = "acquired_after_the_host_crashed_waiting",
        /// A grant reached a host that had given up on it.
        AcquiredAfterTheHostGaveUp = "acquired_after_the_host_gave_up",
        /// The same, for an acquire that had waited.
        AcquiredAfterTheHostGaveUpWaiting = "acquired_after_the_host_gave_up_waiting",
        /// A host stopped owing a cancel that was never answered.
        CancelAbandoned = "cancel_abandoned",
        /// A host's cancel found the grant it cancels.
        CancelFoundAGrant = "cancel_found_a_grant",
        /// A host's cancel found no grant.
        CancelFoundNoGrant = "cancel_found_no_grant",
        /// A host sent a cancel again: the last got no answer.
        CancelSentAgain = "cancel_sent_again",
        /// A grant landed after its host cancelled it (it is released
        /// before the answer).
        CancelledGrantLanded = "cancelled_grant_landed",
        /// A connect failed (homing-node `AcquireEvent::ConnectFailed`).
        ConnectFailed = "connect_failed",
        /// A connect's nearest-replica read missed a landed entry.
        ConnectStaleGlobalReads = "connect_stale_global_reads",
        /// A write in flight at a crash landed without its answer.
        CrashWriteLandedUnacknowledged = "crash_write_landed_unacknowledged",
        /// A DC's cut from the global store ended with hosts still acting on their leases.
        DcCutEndedWithHoldersActing = "dc_cut_ended_with_holders_acting",
        /// A DC lease expired in the global store.
        DcLeaseExpiredInStore = "dc_lease_expired_in_store",
        /// A homingd lost its DC lease.
        DcLeaseLost = "dc_lease_lost",
        /// A homingd regained its DC lease.
        DcLeaseRegained = "dc_lease_regained",
        /// A DC-lease renewal failed.
        DcLeaseRenewalFailed = "dc_lease_renewal_failed",
        /// A DC-lease renewal was sent.
        DcLeaseRenewalSent = "dc_lease_renewal_sent",
        /// A DC lease was retired (its DC taken over).
        DcLeaseRetired = "dc_lease_retired",
        /// A request to a peer DC got no answer in time.
        DcPeerTimeout = "dc_peer_timeout",
        /// A DC refused a write below its allocator floor.
        DcRefusedBelowFloor = "dc_refused_below_floor",
        /// A DC refused a request while shutting down.
        DcRefusedShuttingDown = "dc_refused_shutting_down",
        /// A graceful shutdown cut before it drained.
        DcShutdownCut = "dc_shutdown_cut",
        /// A graceful shutdown drained.
        DcShutdownDrained = "dc_shutdown_drained",
        /// A graceful shutdown started.
        DcShutdownStarted = "dc_shutdown_started",
        /// A DC-store write that failed landed anyway.
        DcStoreFailedWriteLanded = "dc_store_failed_write_landed",
        /// A DC-store operation failed (a failing store).
        DcStoreOpFailed = "dc_store_op_failed",
        /// A drain finished.
        DrainDone = "drain_done",
        /// A drain forwarded to the tail's DC.
        DrainForwarded = "drain_forwarded",
        /// A drain refused.
        DrainRefused = "drain_refused",
        /// An operator requested a drain.
        DrainRequested = "drain_requested",
        /// A whole-DC drain finished.
        DrainScopeDone = "drain_scope_done",
        /// A whole-DC drain gave up (a page failed too often).
        DrainScopeGaveUp = "drain_scope_gave_up",
        /// A page of a whole-DC drain failed.
        DrainScopePageFailed = "drain_scope_page_failed",
        /// A whole-DC drain started.
        DrainScopeStarted = "drain_scope_started",
        /// A global-store operation failed: the DC is cut from it.
        GlobalOpFailedCutOff = "global_op_failed_cut_off",
        /// A grant refused: the DC lease does not cover it.
        GrantRefusedByDcLease = "grant_refused_by_dc_lease",
        /// A request to a peer DC, a host's or a router's went to the DC's
        /// next homingd after the one it used gave no answer.
        HomingdFailover = "homingd_failover",
        /// A host sent an acquire with a wait.
        HostAcquireWithWait = "host_acquire_with_wait",
        /// A host crashed while holding a lease.
        HostCrashWhileHolding = "host_crash_while_holding",
        /// A grant reached its host after the lease's soft deadline.
        HostGrantTooLate = "host_grant_too_late",
        /// A host killed its actor at the hard deadline.
        HostKilledAtHardDeadline = "host_killed_at_hard_deadline",
        /// A host stopped its actor at the soft deadline.
        HostSoftDeadlineStop = "host_soft_deadline_stop",
        /// A router's `Inspect` answered.
        InspectAnswered = "inspect_answered",
        /// A router's `Inspect` failed or timed out.
        InspectFailed = "inspect_failed",
        /// A router sent an `Inspect` after a scan.
        InspectSent = "inspect_sent",
        /// A key's lease was drained.
        KeyDrained = "key_drained",
        /// The upkeep reaped an expired lease (`UpkeepEvent::Reaped`).
        LeaseReaped = "lease_reaped",
        /// A link answered `Abandoned`.
        LinkAbandoned = "link_abandoned",
        /// A link answered `AlreadyLinked`.
        LinkAlreadyLinked = "link_already_linked",
        /// A link answered `Linked`.
        LinkLinked = "link_linked",
        /// A link answered `OtherKey`.
        LinkOtherKey = "link_other_key",
        /// A link refused: the reservation was superseded.
        LinkRefusedSuperseded = "link_refused_superseded",
        /// A link answered `StillActive`.
        LinkStillActive = "link_still_active",
        /// A link answered `TokenMoved`.
        LinkTokenMoved = "link_token_moved",
        /// A homingd's log follower looked at a record of its waiters
        /// another homingd of its DC (or its own upkeep) wrote.
        LogFollowLooked = "log_follow_looked",
        /// A homingd's log follower could not read its DC store's log
        /// (a failing-store fault): its waiters look again on their timers.
        LogFollowReadFailed = "log_follow_read_failed",
        /// The sweeper abandoned an orphan reservation (`UpkeepEvent::Abandoned`).
        OrphanAbandoned = "orphan_abandoned",
        /// The sweeper's membership proof found the reservation a chain member (`UpkeepEvent::Confirmed`).
        OrphanProofMember = "orphan_proof_member",
        /// A host's previous lease of the key ended cancelled.
        PreviousCancelled = "previous_cancelled",
        /// A host's previous lease of the key ended expired.
        PreviousExpired = "previous_expired",
        /// A previous lease's release came after it had expired.
        PreviousExpiredReleasedLate = "previous_expired_released_late",
        /// A host's previous lease of the key ended force-released.
        PreviousForceReleased = "previous_force_released",
        /// A host acquired a key it held no previous lease of.
        PreviousNone = "previous_none",
        /// A host's previous lease of the key ended released after its actor failed.
        PreviousReleasedFailed = "previous_released_failed",
        /// A host's previous lease of the key ended released.
        PreviousReleasedOk = "previous_released_ok",
        /// A reconciliation of a DC's takeovers failed (tried again later).
        ReconcileFailed = "reconcile_failed",
        /// A reconciliation pass applied every takeover owed: the DC may
        /// grant and renew again.
        ReconcilePassed = "reconcile_passed",
        /// A reconciliation pass started where a failed one of the same
        /// reconciliation got to (not from the first page).
        ReconcileResumed = "reconcile_resumed",
        /// A takeover being reconciled names a reservation the DC's store
        /// has no record of (skipped).
        ReconcileUnknownReservation = "reconcile_unknown_reservation",
        /// A renew's answer reached its host too late to use.
        RenewAnsweredTooLate = "renew_answered_too_late",
        /// A renew answered: the lease drains.
        RenewDraining = "renew_draining",
        /// A renew refused: the host stops its actor now.
        RenewRefusedStopNow = "renew_refused_stop_now",
        /// A DC reused a recent "absent" for a resolve.
        ResolveAbsentReusedAtDc = "resolve_absent_reused_at_dc",
        /// A router reused a recent "absent".
        ResolveAbsentReusedAtRouter = "resolve_absent_reused_at_router",
        /// A router saw a suspect DC answer again.
        RouterDcAnswersAgain = "router_dc_answers_again",
        /// A router marked a DC suspect.
        RouterDcSuspect = "router_dc_suspect",
        /// A router probed a suspect DC.
        RouterProbeSent = "router_probe_sent",
        /// A router's scan of its DC completed.
        ScanCompleted = "scan_completed",
        /// A page of a router's scan failed.
        ScanFailed = "scan_failed",
        /// A router's scan of its DC started.
        ScanStarted = "scan_started",
        /// The upkeep ended a host session that ran out (`UpkeepEvent::SessionEnded`).
        SessionEnded = "session_ended",
        /// A grant under a session its host no longer holds open (ended,
        /// replaced, stopping, or full): released at once, never run.
        SessionGrantNotHeld = "session_grant_not_held",
        /// A renewal's answer listed a key of a session host as frozen
        /// (drained at its DC): the key stops by the deadlines held before.
        SessionKeyFrozen = "session_key_frozen",
        /// A session host's session ended without a close: not renewed in
        /// time, or refused (`HardTerminateAll`); every key it held stopped.
        SessionLost = "session_lost",
        /// A session host opened a host session.
        SessionOpened = "session_opened",
        /// Noting a shortcut in the acquire's own DC failed.
        ShortcutNotNoted = "shortcut_not_noted",
        /// A shortcut notice was sent to another DC, or noted in the
        /// acquire's own DC.
        ShortcutNotices = "shortcut_notices",
        /// A DC was taken over.
        Takeovers = "takeovers",
        /// A taken-over DC's reservation superseded by its recorded succession.
        TakeoversReconciled = "takeovers_reconciled",
        /// An update's compare-and-set conflicted (a renew, release, link,
        /// drain, reap, abandon, or a waiter expiring a holder; not a
        /// connect's create).
        UpdateCasConflict = "update_cas_conflict",
        /// The upkeep met a record it could not judge (`UpkeepEvent::BadRecord`).
        UpkeepBadRecord = "upkeep_bad_record",
        /// An upkeep change failed.
        UpkeepChangeFailed = "upkeep_change_failed",
        /// An upkeep pass ran.
        UpkeepPass = "upkeep_pass",
        /// An upkeep index scan failed.
        UpkeepScanFailed = "upkeep_scan_failed",
        /// The upkeep failed to read a due host session's keys or delete its row (`UpkeepEvent::SessionFailed`).
        UpkeepSessionFailed = "upkeep_session_failed",
        /// An upkeep settle failed.
        UpkeepSettleFailed = "upkeep_settle_failed",
        /// The upkeep trimmed the event log.
        UpkeepTrim = "upkeep_trim",
        /// A waiter was answered at once (the reservation had already changed).
        WaitAnsweredAtOnce = "wait_answered_at_once",
        /// A waiter was answered `TimedOut` at a graceful shutdown.
        WaitAnsweredAtShutdown = "wait_answered_at_shutdown",
        /// An acquire awaited the holder's reservation (`AcquireEvent::Awaiting`).
        WaitAwait = "wait_await",
        /// A waiting acquire connected again (`AcquireEvent::ConnectRetried`).
        WaitConnectRetried = "wait_connect_retried",
        /// A parked `Await`'s connection timed out.
        WaitConnectionLost = "wait_connection_lost",
        /// A parked `Await`'s connection was reset by the restarted peer.
        WaitConnectionReset = "wait_connection_reset",
        /// A wait was cut short (`AcquireEvent::WaitCutShort`).
        WaitCutShort = "wait_cut_short",
        /// A wait's deadline passed (`AcquireEvent::WaitDeadlinePassed`).
        WaitDeadlinePassed = "wait_deadline_passed",
        /// A wait ended by a connect error.
        WaitEndedByConnectError = "wait_ended_by_connect_error",
        /// A wait ended by a connect error `Unavailable`.
        WaitEndedByConnectErrorUnavailable = "wait_ended_by_connect_error_unavailable",
        /// A waiter's hand-off window expired.
        WaitHandoffExpired = "wait_handoff_expired",
        /// A wait's last look failed.
        WaitLastLookFailed = "wait_last_look_failed",
        /// A waiter's own compare-and-set expired the lease it waited on.
        WaitLeaseExpiredByWaiter = "wait_lease_expired_by_waiter",
        /// A lost registration with no time left to register again.
        WaitLostWithoutTimeToRegisterAgain = "wait_lost_without_time_to_register_again",
        /// A waiter refused: its queue was full.
        WaitOverloaded = "wait_overloaded",
        /// A wait refused (`AcquireEvent::WaitRefused`).
        WaitRefused = "wait_refused",
        /// A waiter registered.
        WaitRegistered = "wait_registered",
        /// Waiter registrations lost in a crash.
        WaitRegistrationsLostInCrash = "wait_registrations_lost_in_crash",
        /// A waiting acquire registered again.
        WaitReregister = "wait_reregister",
        /// A wait timed out (`AcquireEvent::WaitTimedOut`).
        WaitTimedOut = "wait_timed_out",
        /// A waiter timed out at the tail's DC.
        WaitTimedOutAtTail = "wait_timed_out_at_tail",
        /// A wake-up dropped: it came at the wait's deadline.
        WaitWakeUpDroppedAtDeadline = "wait_wake_up_dropped_at_deadline",
        /// A waiter woken: the key moved.
        WaitWokenMoved = "wait_woken_moved",
        /// A waiter woken: the reservation was vacated.
        WaitWokenVacated = "wait_woken_vacated",
        /// A watch answered with events.
        WatchAnswered = "watch_answered",
        /// A watch's cursor refused.
        WatchCursorRefused = "watch_cursor_refused",
        /// A watch failed.
        WatchFailed = "watch_failed",
        /// A watch was sent.
        WatchSent = "watch_sent",
        /// A watch got no answer.
        WatchTimedOut = "watch_timed_out",
        /// A watch answered `Trimmed`: it resumes at the oldest kept event.
        WatchTrimmed = "watch_trimmed",
        /// A write's wait for its DC lease to cover its marks timed out.
        WriteMarksWaitTimedOut = "write_marks_wait_timed_out",
        /// A write refused: the DC's lease is retired.
        WriteRefusedDcStopped = "write_refused_dc_stopped",
        /// A write waited for its DC lease to cover its marks (allocator unique, token).
        WriteWaitsForMarks = "write_waits_for_marks",
    }
}

named! {
    /// A duration the simulator samples (one sample per occurrence).
    Timing {
        /// From a DC's cut from the global store to the last of its hosts stopping.
        DcCutHostsStoppedAfter = "dc_cut_hosts_stopped_after",
        /// A graceful shutdown's drain, from its start to the process's exit.
        DcShutdownDrain = "dc_shutdown_drain",
    }
}

/// An operation kind that is measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Op {
    /// Acquire that wrote the key's first reservation and global entry.
    AcquireFirst,
    /// Acquire that re-activated a vacant tail in the same DC.
    AcquireReactivate,
    /// Acquire that created a reservation and linked the old tail in another DC.
    AcquireRecreate,
    /// Acquire that waited for the holder (`wait_ms`) and then got the key.
    AcquireAfterWait,
    /// Acquire answered with the live holder (or a tag mismatch).
    AcquireHeldElsewhere,
    /// Acquire that failed or timed out.
    AcquireFailed,
    /// A renewal.
    Renew,
    /// A host session's renewal (every key it holds at once).
    RenewSession,
    /// A resolve answered from the router's cache.
    ResolveCached,
    /// A resolve with nothing cached, through a chain of this many links.
    ResolveCold(u8),
    /// A resolve with the entry (and links) cached, the tail's state stale.
    ResolveRefresh,
    /// A resolve of a key never reserved.
    ResolveNotFound,
    /// A resolve that could not reach a DC it needed.
    ResolveUnavailable,
    /// A resolve answered `Unavailable` at once: a DC it needed is suspect.
    ResolveSuspect,
    /// A resolve that joined a walk of its key already in flight at its
    /// router (the Resolver's single-flight) and got that walk's answer.
    ResolveJoined,
}

impl Op {
    /// The row label.
    pub fn label(self) -> String {
        match self {
            Op::AcquireFirst => "acquire: first reserve".into(),
            Op::AcquireReactivate => "acquire: re-activate (same dc)".into(),
            Op::AcquireRecreate => "acquire: recreate elsewhere".into(),
            Op::AcquireAfterWait => "acquire: after waiting".into(),
            Op::AcquireHeldElsewhere => "acquire: held elsewhere".into(),
            Op::AcquireFailed => "acquire: failed/timeout".into(),
            Op::Renew => "renew".into(),
            Op::RenewSession => "renew: a host session".into(),
            Op::ResolveCached => "resolve: cached".into(),
            Op::ResolveCold(n) => format!("resolve: cold, {n}-link chain"),
            Op::ResolveRefresh => "resolve: refresh (entry+links cached)".into(),
            Op::ResolveNotFound => "resolve: not found".into(),
            Op::ResolveUnavailable => "resolve: unavailable".into(),
            Op::ResolveSuspect => "resolve: unavailable, dc suspect".into(),
            Op::ResolveJoined => "resolve: joined a walk in flight".into(),
        }
    }

    /// What DESIGN.md §4 promises for it.
    pub fn model(self) -> &'static str {
        match self {
            Op::AcquireFirst => "1 DC write + 1 global write-once, 0 inter-DC RTT",
            Op::AcquireReactivate => "walk to the tail + own DC read + CAS",
            Op::AcquireRecreate => "1 RTT for the link (+ walk to the tail)",
            Op::AcquireAfterWait => "the wait, then connect again (not in §4)",
            Op::AcquireHeldElsewhere => "walk to the tail (1 RTT per remote hop)",
            Op::AcquireFailed => "-",
            Op::Renew => "1 RTT to own DC, 1 DC-store CAS",
            Op::RenewSession => "1 RTT to own DC, 1 session-row CAS",
            Op::ResolveCached => "one cache lookup, no I/O",
            Op::ResolveCold(_) => "1 global read + 1 RTT per remote hop",
            Op::ResolveRefresh => "1 RTT to the tail's DC (0 if local)",
            Op::ResolveNotFound => "1 global read, no fan-out",
            Op::ResolveUnavailable => "-",
            Op::ResolveSuspect => "no wait: one timeout per partition",
            Op::ResolveJoined => "no request: the walk's answer",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{Counter, Timing};

    #[test]
    fn names_are_distinct_snake_case_and_sorted() {
        let counters = Counter::ALL.iter().map(|c| c.name());
        let timings = Timing::ALL.iter().map(|t| t.name());
        check(counters.collect());
        check(timings.collect());
    }

    fn check(names: Vec<&str>) {
        for name in &names {
            assert!(
                name.chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_'),
                "{name}"
            );
        }
        let mut sorted = names.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(names, sorted, "declared once each, in name order");
    }
}
