//! The correctness checkers, fed by the simulator after every event that
//! could break an invariant (`invariants.rs` names them; the wake-up
//! checkers are `wakeups.rs`'). The first violation stops the run and
//! is reported with the seed, the event index and the last events of the
//! key.
//!
//! Truth is judged in true time, which no node can read: a holder is
//! "active" from the moment its host got `Acquired` until it stopped,
//! crashed or was killed just before its own clock reached its hard
//! deadline; a resolve answer must match some state of the key's chain
//! between the moment the request started and the moment it was answered.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use homing_core::{
    ActorId, DcId, DcRecord, Expiry, FencingToken, HostTime, LeasePolicy, PreviousRun, RecordState,
    ReleaseCause, ReservationId, RunOutcome, SessionId, StoreTime, TailState, TailView,
};

use crate::clock::NodeClock;
use crate::invariants::{Invariant, View, Violation};
use crate::trace::NO_KEY;
use crate::wakeups::WakeChecker;

/// The tail of a key's chain as it stood from `at_us` on.
#[derive(Debug, Clone)]
struct Snapshot {
    at_us: u64,
    tail: ReservationId,
    dc: usize,
    token: FencingToken,
    actor: Option<ActorId>,
    reapable_at: Option<StoreTime>,
    /// A session key: reapable when its session's row says (read when a
    /// resolve is judged; a session is never renewed once it lapsed).
    session: Option<SessionId>,
}

#[derive(Debug, Default)]
struct KeyState {
    tail: Option<ReservationId>,
    members: BTreeSet<ReservationId>,
    history: VecDeque<Snapshot>,
    acting: Vec<(u32, FencingToken, ReservationId)>,
    last_token: Option<FencingToken>,
    global_set_at_us: Option<u64>,
}

/// How a holder's run (a reservation under one token) truly ended, as its DC committed it.
#[derive(Debug, Clone)]
struct RunEnd {
    cause: ReleaseCause,
    /// The lease was already past expiry + grace when the run ended, so a
    /// reader may have seen it `Expired` first.
    lapsed: bool,
}

/// The checkers' state.
#[derive(Debug)]
pub struct Checker {
    keys: Vec<KeyState>,
    dc_clocks: Vec<NodeClock>,
    policy: LeasePolicy,
    horizon_us: u64,
    /// How old a `NotFound` may be, µs: the DC's and the router's absent
    /// caches plus one request's trip (docs/CONSISTENCY.md §5).
    absent_staleness_us: u64,
    acked: Vec<BTreeMap<ReservationId, u64>>,
    last_unique: Vec<u64>,
    runs: BTreeMap<(ReservationId, FencingToken), RunEnd>,
    sent: BTreeMap<(ReservationId, FencingToken), RunOutcome>,
    /// Session keys frozen at their DC (drained): by when, in true µs, the
    /// run must have stopped (the DC's clock reaching the frozen expiry).
    frozen: BTreeMap<(ReservationId, FencingToken), u64>,
    /// The wake-up checkers.
    pub wake: WakeChecker,
    /// Per DC name: when a holder it granted last stopped acting, true µs.
    pub last_stop_us: BTreeMap<DcId, u64>,
    /// Grants told `Expired` for a run whose late release (after its lease
    /// lapsed) the DC then recorded as `Released`.
    pub previous_expired_released_late: u64,
    violation: Option<Violation>,
}

impl Checker {
    /// A checker for `keys` keys and DCs with these clocks; resolve history
    /// older than `horizon_us` (longer than any request plus cache TTL) is dropped.
    pub fn new(
        keys: usize,
        dc_clocks: Vec<NodeClock>,
        policy: LeasePolicy,
        horizon_us: u64,
        absent_staleness_us: u64,
        wake: WakeChecker,
    ) -> Checker {
        let dcs = dc_clocks.len();
        Checker {
            keys: (0..keys).map(|_| KeyState::default()).collect(),
            dc_clocks,
            policy,
            horizon_us,
            absent_staleness_us,
            acked: vec![BTreeMap::new(); dcs],
            last_unique: vec![0; dcs],
            runs: BTreeMap::new(),
            sent: BTreeMap::new(),
            frozen: BTreeMap::new(),
            wake,
            last_stop_us: BTreeMap::new(),
            previous_expired_released_late: 0,
            violation: None,
        }
    }

    /// The first violation, once.
    pub fn take_violation(&mut self) -> Option<Violation> {
        self.violation.take().or_else(|| self.wake.take_violation())
    }

    /// A host sent `Release` for `reservation` under `token`, saying `outcome`.
    pub fn on_release_sent(
        &mut self,
        reservation: &ReservationId,
        token: FencingToken,
        outcome: &RunOutcome,
    ) {
        self.sent
            .insert((reservation.clone(), token), outcome.clone());
    }

    /// A host got `Acquired { reservation, token, previous }` for `key`:
    /// `previous` must be the run just before it on the key's chain, ended
    /// as its DC committed it (a release names the outcome its host sent; a
    /// lapsed lease may also read `Expired`).
    pub fn on_acquired(
        &mut self,
        view: &View<'_>,
        key: u32,
        reservation: &ReservationId,
        token: FencingToken,
        previous: Option<&PreviousRun>,
    ) {
        let Some(p) = previous else {
            if token != FencingToken::FIRST {
                let detail =
                    format!("k{key} acquired {reservation} with token {token} and no previous run");
                self.fail(Invariant::PreviousRunTrue, key, detail);
            }
            return;
        };
        // A takeover's previous run is its dead DC's tail, whose last token
        // nobody alive knows: the grant names the takeover link's token (the
        // DC's published bound + 1) and an expiry. Its true end is the
        // expired DC's (`dc_expired_no_holder` checks no holder outlived it).
        if let Some(taken) = view.successions.get(&p.reservation)
            && taken.cause == homing_core::SuccessionCause::TakenOver
            && taken.names(reservation)
        {
            if p.token != taken.link.token
                || taken.link.token.next() != token
                || p.ended != ReleaseCause::Expired
            {
                let detail = format!(
                    "k{key} acquired {reservation} token {token} by a takeover of {} (link token {}), but the grant names token {} ended {}",
                    p.reservation, taken.link.token, p.token, p.ended
                );
                self.fail(Invariant::PreviousRunTrue, key, detail);
            }
            return;
        }
        let continues = &p.reservation == reservation
            || view.record(&p.reservation).is_some_and(|(_, r)| {
                r.state
                    == RecordState::Linked {
                        to: reservation.clone(),
                    }
            });
        if p.token.next() != token || !continues {
            let detail = format!(
                "k{key} acquired {reservation} token {token} after {} token {}, not its predecessor",
                p.reservation, p.token
            );
            return self.fail(Invariant::PreviousRunTrue, key, detail);
        }
        let run = (p.reservation.clone(), p.token);
        let truth = self.runs.get(&run);
        let sent = self.sent.get(&run);
        let true_end = match (&p.ended, truth) {
            (_, None) => false,
            (ReleaseCause::Expired, Some(end)) if end.cause == ReleaseCause::Expired => true,
            (ReleaseCause::Expired, Some(end)) => {
                self.previous_expired_released_late += 1;
                end.lapsed
            }
            (ReleaseCause::Released(o), Some(end)) => end.cause == p.ended && sent == Some(o),
            (ReleaseCause::Forced | ReleaseCause::Cancelled, Some(end)) => end.cause == p.ended,
        };
        if !true_end {
            let detail = format!(
                "k{key} acquired {reservation} token {token}: previous {} token {} said to have ended {}, but it ended {:?} (its host sent {sent:?})",
                p.reservation,
                p.token,
                p.ended,
                truth.map(|e| (&e.cause, e.lapsed))
            );
            self.fail(Invariant::PreviousRunTrue, key, detail);
        }
    }

    /// Records how a holder's run ended when a write moves its record off it.
    fn note_run_end(&mut self, d: usize, now_us: u64, previous: &DcRecord, next: &DcRecord) {
        let Some(expires_at) = previous.held_until(None) else {
            return;
        };
        let cause = match &next.state {
            RecordState::Active { .. } if next.token == previous.token => return,
            RecordState::Released { cause, .. } if next.token == previous.token => cause.clone(),
            _ => ReleaseCause::Expired,
        };
        let now = self.dc_clocks[d].store_time(now_us);
        let lapsed = now >= self.policy.reapable_at(expires_at);
        self.runs
            .entry((previous.id.clone(), previous.token))
            .or_insert(RunEnd { cause, lapsed });
    }

    /// [`Invariant::AcquireAnswered`]: a host gave up on its acquire of
    /// `key` though no fault could have delayed it.
    pub fn on_acquire_unanswered(&mut self, key: u32, detail: String) {
        self.fail(Invariant::AcquireAnswered, key, detail);
    }

    /// A router still holds a healed DC suspect past the bound.
    pub fn on_suspicion_not_cleared(&mut self, detail: String) {
        self.fail(Invariant::SuspicionClears, NO_KEY, detail);
    }

    /// A DC store refused a compare-and-set.
    pub fn on_store_refused(&mut self, key: u32, detail: String) {
        self.fail(Invariant::StoreAcceptsWrites, key, detail);
    }

    /// A drain of a whole DC left a lease renewable.
    pub fn on_drain_scope_incomplete(&mut self, detail: String) {
        self.fail(Invariant::DrainScopeComplete, NO_KEY, detail);
    }

    /// A scan missed, repeated or misordered records.
    pub fn on_scan_broken(&mut self, detail: String) {
        self.fail(Invariant::ScanComplete, NO_KEY, detail);
    }

    /// An inspect returned another key's records, misordered ones, or missed one.
    pub fn on_inspect_broken(&mut self, detail: String) {
        self.fail(Invariant::InspectExact, NO_KEY, detail);
    }

    /// A watcher's answer skipped events or went backwards.
    pub fn on_watch_gap(&mut self, detail: String) {
        self.fail(Invariant::WatchGapFree, NO_KEY, detail);
    }

    fn fail(&mut self, invariant: Invariant, key: u32, detail: String) {
        if self.violation.is_none() {
            self.violation = Some(Violation {
                invariant,
                key: (key != NO_KEY).then_some(key),
                detail,
            });
        }
    }

    /// A host got `Acquired` and starts acting.
    pub fn on_holder_start(
        &mut self,
        _now_us: u64,
        key: u32,
        host: u32,
        token: FencingToken,
        reservation: &ReservationId,
    ) {
        let ks = &mut self.keys[key as usize];
        if let Some((other, other_token, other_res)) = ks.acting.iter().find(|a| a.0 != host) {
            let detail = format!(
                "host {host} starts holding k{key} ({reservation}, token {token}) while host {other} still holds it ({other_res}, token {other_token})"
            );
            return self.fail(Invariant::SingleHolder, key, detail);
        }
        if let Some(last) = ks.last_token
            && token <= last
        {
            let detail = format!(
                "host {host} holds k{key} with token {token}, not above the previous holder's {last}"
            );
            return self.fail(Invariant::TokenAcrossHolders, key, detail);
        }
        ks.last_token = Some(token);
        ks.acting.push((host, token, reservation.clone()));
    }

    /// A holder stopped acting (released, killed, crashed, told to stop).
    pub fn on_holder_stop(&mut self, now_us: u64, key: u32, host: u32) {
        let acting = &mut self.keys[key as usize].acting;
        let mut late = None;
        for (_, token, reservation) in acting.iter().filter(|a| a.0 == host) {
            self.last_stop_us.insert(reservation.dc().clone(), now_us);
            if let Some(by_us) = self.frozen.remove(&(reservation.clone(), *token))
                && now_us >= by_us
            {
                late = Some(format!(
                    "host {host} stopped k{key} ({reservation}, token {token}) at {now_us}µs, past the expiry its DC froze it at ({by_us}µs in true time)"
                ));
            }
        }
        if let Some(detail) = late {
            acting.retain(|a| a.0 != host);
            return self.fail(Invariant::FrozenKeyStopped, key, detail);
        }
        acting.retain(|a| a.0 != host);
    }

    /// The holders DC `dc` granted that act now: (key, host, token, reservation).
    pub fn holders_of(&self, dc: &DcId) -> Vec<(u32, u32, FencingToken, ReservationId)> {
        let mut found = Vec::new();
        for (k, ks) in self.keys.iter().enumerate() {
            for (host, token, reservation) in &ks.acting {
                if reservation.dc() == dc {
                    found.push((k as u32, *host, *token, reservation.clone()));
                }
            }
        }
        found
    }

    /// The global store would judge `dc`'s lease expired from now on (its
    /// last renewal received at `received_us`): none of its holders may act.
    pub fn on_dc_lease_expired(&mut self, dc: &DcId, received_us: u64, now_us: u64) {
        if let Some((key, host, token, reservation)) = self.holders_of(dc).into_iter().next() {
            let detail = format!(
                "the global store judges dc {dc}'s lease expired at {now_us}µs (last renewal received at {received_us}µs), but host {host} still holds k{key} ({reservation}, token {token}) granted by it"
            );
            self.fail(Invariant::DcExpiredNoHolder, key, detail);
        }
    }

    /// Host `host` starts holding `key` under a grant of `dc`, whose lease
    /// the global store judges expired now.
    pub fn on_holder_start_under_expired_dc(
        &mut self,
        dc: &DcId,
        key: u32,
        host: u32,
        reservation: &ReservationId,
    ) {
        let detail = format!(
            "host {host} starts holding k{key} ({reservation}) granted by dc {dc}, whose lease the global store judges expired"
        );
        self.fail(Invariant::DcExpiredNoHolder, key, detail);
    }

    /// A holder is seen acting with its clock reading `host_ms`.
    pub fn on_holder_check(&mut self, key: u32, host: u32, host_ms: u64, hard: HostTime) {
        if host_ms >= hard.as_ms() {
            let detail = format!(
                "host {host} acts on k{key} at {host_ms}ms by its clock, hard deadline {hard}"
            );
            self.fail(Invariant::HardDeadline, key, detail);
        }
    }

    /// DC `d`'s allocator handed out `unique`.
    pub fn on_allocate(&mut self, d: usize, unique: u64) {
        if unique <= self.last_unique[d] {
            let detail = format!("dc #{d} allocated {unique} after {}", self.last_unique[d]);
            return self.fail(Invariant::UniqueNeverReused, NO_KEY, detail);
        }
        self.last_unique[d] = unique;
    }

    /// A DC store committed a record write (acknowledged from now on).
    #[allow(clippy::too_many_arguments)] // the write and where it happened
    pub fn on_commit(
        &mut self,
        view: &View<'_>,
        now_us: u64,
        key: u32,
        d: usize,
        id: &ReservationId,
        version: u64,
        previous: Option<&DcRecord>,
    ) {
        self.acked[d].insert(id.clone(), version);
        if let Some((_, next)) = view.record(id) {
            if let RecordState::Active {
                expiry: Expiry::Frozen { at, .. },
                ..
            } = &next.state
            {
                let by_us = self.dc_clocks[d].first_true_us_at_ms(at.as_ms());
                self.frozen.entry((id.clone(), next.token)).or_insert(by_us);
            }
            if let Some(p) = previous {
                self.note_run_end(d, now_us, p, next);
            }
            let session = view.session_row(d, next);
            self.wake
                .on_commit(now_us, d as u16, next, session.as_ref());
        }
        if let Some(RecordState::Linked { to }) = previous.map(|p| &p.state) {
            let now = view.record(id).map(|(_, r)| &r.state);
            // The one change of a link: a returning DC applies a takeover.
            let taken = view.successions.get(id).filter(|s| {
                s.cause == homing_core::SuccessionCause::TakenOver
                    && now
                        == Some(&RecordState::Linked {
                            to: s.link.to.clone(),
                        })
            });
            if taken.is_none() && now != Some(&RecordState::Linked { to: to.clone() }) {
                let detail = format!("link {id} → {to} became {now:?}");
                return self.fail(Invariant::LinkImmutable, key, detail);
            }
        }
        if key == NO_KEY {
            return;
        }
        if self.keys[key as usize].tail.as_ref() == Some(id) {
            self.settle(view, now_us, key);
        }
    }

    /// The global store accepted `id` as `key`'s entry.
    pub fn on_global_set(&mut self, view: &View<'_>, now_us: u64, key: u32, id: &ReservationId) {
        let ks = &mut self.keys[key as usize];
        ks.global_set_at_us = Some(now_us);
        ks.tail = Some(id.clone());
        ks.members.insert(id.clone());
        self.settle(view, now_us, key);
    }

    /// The global store recorded a takeover of a tail of `key`.
    pub fn on_taken_over(&mut self, view: &View<'_>, now_us: u64, key: u32) {
        self.settle(view, now_us, key);
    }

    /// Follows new links from the known tail and records the tail's state.
    /// A takeover in the global store outranks the taken DC's record (which
    /// may still read active, or linked to a mover that lost).
    fn settle(&mut self, view: &View<'_>, now_us: u64, key: u32) {
        let ks = &mut self.keys[key as usize];
        let Some(mut tail) = ks.tail.clone() else {
            return;
        };
        loop {
            let Some((d, record)) = view.record(&tail) else {
                let detail = format!("chain of k{key} reaches {tail}, which has no record");
                return self.fail(Invariant::ChainShape, key, detail);
            };
            let taken = view
                .successions
                .get(&tail)
                .filter(|s| s.cause == homing_core::SuccessionCause::TakenOver);
            let state = match taken {
                Some(s) => RecordState::Linked {
                    to: s.link.to.clone(),
                },
                None => record.state.clone(),
            };
            match &state {
                RecordState::Abandoned => {
                    let detail = format!("chain of k{key} reaches {tail}, which is abandoned");
                    return self.fail(Invariant::ChainShape, key, detail);
                }
                RecordState::Linked { to } => {
                    if ks.members.contains(to) {
                        let detail = format!("chain of k{key} cycles: {tail} → {to}");
                        return self.fail(Invariant::ChainShape, key, detail);
                    }
                    if let Some((_, next)) = view.record(to)
                        && next.token <= record.token
                    {
                        let detail = format!(
                            "link {tail} (token {}) → {to} (token {})",
                            record.token, next.token
                        );
                        return self.fail(Invariant::TokenAlongChain, key, detail);
                    }
                    ks.members.insert(to.clone());
                    tail = to.clone();
                    ks.tail = Some(tail.clone());
                }
                RecordState::Active { actor, expiry, .. } => {
                    let snapshot = Snapshot {
                        at_us: now_us,
                        tail: tail.clone(),
                        dc: d,
                        token: record.token,
                        actor: Some(actor.clone()),
                        reapable_at: Some(self.policy.reapable_at(expiry.holds_until(None))),
                        session: match expiry {
                            Expiry::Session(id) => Some(id.clone()),
                            _ => None,
                        },
                    };
                    return self.push(key, snapshot);
                }
                RecordState::Released { .. } => {
                    let snapshot = Snapshot {
                        at_us: now_us,
                        tail: tail.clone(),
                        dc: d,
                        token: record.token,
                        actor: None,
                        reapable_at: None,
                        session: None,
                    };
                    return self.push(key, snapshot);
                }
            }
        }
    }

    fn push(&mut self, key: u32, snapshot: Snapshot) {
        let horizon = snapshot.at_us.saturating_sub(self.horizon_us);
        let history = &mut self.keys[key as usize].history;
        history.push_back(snapshot);
        while history.len() > 2 && history[1].at_us < horizon {
            history.pop_front();
        }
    }

    /// A resolve that started at `start_us` answered at `now_us`: `None` for
    /// `NotFound` (true at some instant up to the absent caches' staleness
    /// before the start), else the tail it found.
    pub fn on_resolve(
        &mut self,
        view: &View<'_>,
        key: u32,
        start_us: u64,
        now_us: u64,
        answer: Option<&TailView>,
    ) {
        let ks = &self.keys[key as usize];
        let Some(tail) = answer else {
            if let Some(set) = ks.global_set_at_us
                && set + self.absent_staleness_us <= start_us
            {
                let detail = format!(
                    "k{key} resolved NotFound at {start_us}µs, but its global entry exists since {set}µs (more than the absent caches allow, {} µs)",
                    self.absent_staleness_us
                );
                self.fail(Invariant::ResolveWasTrue, key, detail);
            }
            return;
        };
        let history = &ks.history;
        let matches = history.iter().enumerate().any(|(i, s)| {
            let end = history.get(i + 1).map_or(u64::MAX, |n| n.at_us);
            if s.at_us > now_us || end <= start_us {
                return false;
            }
            if s.tail != tail.id || s.token != tail.token {
                return false;
            }
            let clock = &self.dc_clocks[s.dc];
            let lo = clock.store_time(s.at_us.max(start_us));
            let hi = clock.store_time(end.min(now_us));
            // A session key whose row is gone (the session over, every key
            // reaped): its expiry is no longer known, live or vacant passes.
            let (reapable_at, unknown) = match &s.session {
                Some(id) => match view.dcs.store(s.dc).session(id) {
                    Some(row) => (Some(self.policy.reapable_at(row.holds_until())), false),
                    None => (None, true),
                },
                None => (s.reapable_at, false),
            };
            match (&tail.state, &s.actor, reapable_at) {
                (TailState::Active { actor }, Some(a), reapable) => {
                    a == actor && (unknown || reapable.is_some_and(|r| r > lo))
                }
                (TailState::Active { .. }, None, _) => false,
                (TailState::Vacant { .. }, None, _) => true,
                (TailState::Vacant { .. }, Some(_), reapable) => {
                    unknown || reapable.is_none_or(|r| r <= hi)
                }
            }
        });
        if !matches {
            let window: Vec<String> = history
                .iter()
                .filter(|s| s.at_us <= now_us)
                .rev()
                .take(4)
                .map(|s| {
                    format!(
                        "{}µs: {} token {} actor {:?}",
                        s.at_us, s.tail, s.token, s.actor
                    )
                })
                .collect();
            let detail = format!(
                "k{key} resolved to {} token {} {:?} during [{start_us}µs, {now_us}µs], never true then; recent states: {window:?}",
                tail.id, tail.token, tail.state
            );
            self.fail(Invariant::ResolveWasTrue, key, detail);
        }
    }

    /// A DC serving a forwarded drain forwarded it again.
    pub fn on_drain_forwarded_again(&mut self, key: u32, detail: String) {
        self.fail(Invariant::DrainForwardedOnce, key, detail);
    }

    /// A resolver's chain walk failed.
    pub fn on_resolve_error(&mut self, key: u32, error: String) {
        self.fail(
            Invariant::ResolveChainConsistent,
            key,
            format!("resolving k{key}: {error}"),
        );
    }

    /// The run ended at `now_us`: every running DC that has been up for two
    /// reaper intervals has reaped every lease that was reapable two intervals ago.
    pub fn on_end(&mut self, view: &View<'_>, now_us: u64, interval_us: u64, up_since_us: &[u64]) {
        let settle = 2 * interval_us;
        // One entry per DC: `up_since_us` is indexed as the DCs are.
        for (d, &up_since) in up_since_us.iter().enumerate() {
            if !view.dcs.up(d) || now_us < up_since + settle || now_us < settle {
                continue;
            }
            let deadline = view.dcs.clock(d).store_time(now_us - settle);
            let store = view.dcs.store(d);
            let stuck = store.records().find(|r| {
                let session = view.session_row(d, r);
                r.held_until(session.as_ref())
                    .is_some_and(|held| self.policy.reapable_at(held) < deadline)
            });
            if let Some(r) = stuck {
                let key = view
                    .keys
                    .iter()
                    .position(|k| k == &r.key)
                    .map_or(NO_KEY, |k| k as u32);
                let detail = format!("{} is still active, reapable since before {deadline}", r.id);
                return self.fail(Invariant::ReaperProgress, key, detail);
            }
        }
    }

    /// DC `d` restarted: every write it acknowledged must still be there.
    pub fn on_restart(&mut self, view: &View<'_>, d: usize) {
        let lost = self.acked[d].iter().find(|(id, version)| {
            view.dcs.store(d).record(id).map(|r| r.version) < Some(**version)
        });
        if let Some((id, version)) = lost {
            let detail = format!("{id} version {version} was acknowledged, gone after restart");
            let key = view
                .dcs
                .store(d)
                .record(id)
                .and_then(|r| view.keys.iter().position(|k| k == &r.key))
                .map_or(NO_KEY, |k| k as u32);
            self.fail(Invariant::AckedWriteSurvives, key, detail);
        }
    }
}
