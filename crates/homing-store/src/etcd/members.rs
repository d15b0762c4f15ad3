//! Which etcd member an operation goes to, and going around one that has
//! gone silent. etcd-client's own channel spreads requests over every
//! endpoint and knows nothing of a member that keeps its connections open
//! but answers nothing (a SIGSTOPped process, a GC pause, a stalled disk, a
//! frozen VM): a share of requests then hang until the request timeout and
//! soon every worker waits on one. Here each member has its own connection,
//! with HTTP/2 keep-alive pings so a dead connection is noticed and made
//! anew; operations go round-robin to the members judged healthy; and every
//! operation has a deadline ([`HOT_DEADLINE_MS`] on the hot path: global
//! reads, write-once, record reads, compare-and-set, allocation) after which
//! it is abandoned on that member and sent to another. A member that missed
//! a deadline or failed a request is avoided until a probe (a `status` call,
//! answered by the member alone, no quorum) is answered again.
//!
//! A write abandoned at its deadline may still land: the member may apply it
//! when it wakes. Such an attempt is *ambiguous* and [`Answer::ambiguous`]
//! tells the caller, who resolves it from what the retry reads back
//! (write-once: the entry is its own id; compare-and-set: the record is its
//! own, at the revision the retry read). Every etcd write homing makes is
//! guarded (`create_revision`, `mod_revision` or the head's value), so an
//! abandoned attempt that lands late, after the retry, fails its guard:
//! nothing is applied twice.

use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use etcd_client::{Client, ConnectOptions, KeyValue, KvClient, LeaseClient, MaintenanceClient};

use super::{CONNECT_TIMEOUT_MS, REQUEST_TIMEOUT_MS, map_err};
use crate::error::StoreError;
use crate::failover::{Failover, FailoverEvent};

/// Deadline of one attempt of a hot operation on one member, in
/// milliseconds: well below [`REQUEST_TIMEOUT_MS`], well above a loaded
/// cluster's p99 (tens of ms on loopback under load; a miss only costs a
/// retry, which is safe).
pub const HOT_DEADLINE_MS: u64 = 500;
/// Time one hot operation may take over all its attempts, in milliseconds:
/// room for a frozen leader to be replaced (etcd's election timeout, 1 s by
/// default) while members answer "no leader".
pub const HOT_BUDGET_MS: u64 = 3_000;
/// Deadline of one attempt of a bulk operation (scans, event pages, trims,
/// imports), in milliseconds: these can be large and are off the hot path.
pub const BULK_DEADLINE_MS: u64 = REQUEST_TIMEOUT_MS;
/// Time one bulk operation may take over all its attempts, in milliseconds.
pub const BULK_BUDGET_MS: u64 = 2 * BULK_DEADLINE_MS;
/// HTTP/2 keep-alive ping interval on every member connection, in milliseconds.
pub const KEEP_ALIVE_INTERVAL_MS: u64 = 1_000;
/// A ping unanswered this long closes the connection, in milliseconds.
pub const KEEP_ALIVE_TIMEOUT_MS: u64 = 1_000;
/// Deadline of one probe of an avoided member, in milliseconds.
pub const PROBE_DEADLINE_MS: u64 = 500;
/// Pause between probes of an avoided member, in milliseconds.
pub const PROBE_INTERVAL_MS: u64 = 250;
/// Most attempts of one operation, over all members (within its budget).
pub const ATTEMPTS_MAX: usize = 16;
/// Pause before an attempt on a member this operation already tried (every
/// member failed it once), in milliseconds.
pub const RETRY_PAUSE_MS: u64 = 100;

/// What an operation is, for its deadline and whether a lost answer leaves
/// its outcome unknown.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Op {
    /// A read on the request path.
    HotRead,
    /// A write on the request path (write-once, compare-and-set, allocation).
    HotWrite,
    /// A read of many keys off the request path (scan, event page, migration).
    BulkRead,
    /// A write off the request path (trim, import, allocator raise).
    BulkWrite,
}

impl Op {
    fn deadline(self) -> Duration {
        let ms = match self {
            Op::HotRead | Op::HotWrite => HOT_DEADLINE_MS,
            Op::BulkRead | Op::BulkWrite => BULK_DEADLINE_MS,
        };
        Duration::from_millis(ms)
    }

    fn budget(self) -> Duration {
        let ms = match self {
            Op::HotRead | Op::HotWrite => HOT_BUDGET_MS,
            Op::BulkRead | Op::BulkWrite => BULK_BUDGET_MS,
        };
        Duration::from_millis(ms)
    }

    fn writes(self) -> bool {
        matches!(self, Op::HotWrite | Op::BulkWrite)
    }
}

/// An operation's answer.
#[derive(Debug)]
pub(super) struct Answer<T> {
    /// What the member that answered said.
    pub(super) value: T,
    /// An earlier attempt of this write was abandoned or failed after it was
    /// sent: it may have landed (always false for reads).
    pub(super) ambiguous: bool,
}

struct Member {
    kv: KvClient,
    /// DC leases (`dc_lease`): grant, revoke, time-to-live.
    lease: LeaseClient,
    maintenance: MaintenanceClient,
    /// A probe task is running for this member.
    probing: AtomicBool,
}

/// The members of one cluster, their health and the store's failover counters.
pub(super) struct Members {
    members: Vec<Member>,
    next: AtomicUsize,
    failover: Arc<Failover>,
    /// The highest store revision any answer has carried.
    revision_seen: AtomicI64,
}

impl Members {
    /// One connection per endpoint (made lazily: a member that is down at
    /// start is simply avoided until it answers).
    pub(super) async fn connect(endpoints: &[String]) -> Result<Arc<Members>, StoreError> {
        if endpoints.is_empty() {
            return Err(StoreError::Backend {
                backend: "etcd",
                reason: "no endpoints".into(),
            });
        }
        let options = ConnectOptions::new()
            .with_connect_timeout(Duration::from_millis(CONNECT_TIMEOUT_MS))
            .with_timeout(Duration::from_millis(REQUEST_TIMEOUT_MS))
            .with_keep_alive(
                Duration::from_millis(KEEP_ALIVE_INTERVAL_MS),
                Duration::from_millis(KEEP_ALIVE_TIMEOUT_MS),
            )
            .with_keep_alive_while_idle(true)
            // A member cut off from the leader answers at once instead of
            // holding the request: the operation goes to another member.
            .with_require_leader(true);
        let mut members = Vec::with_capacity(endpoints.len());
        for endpoint in endpoints {
            let client = Client::connect([endpoint], Some(options.clone()))
                .await
                .map_err(map_err)?;
            members.push(Member {
                kv: client.kv_client(),
                lease: client.lease_client(),
                maintenance: client.maintenance_client(),
                probing: AtomicBool::new(false),
            });
        }
        Ok(Arc::new(Members {
            members,
            next: AtomicUsize::new(0),
            failover: Arc::new(Failover::new(endpoints)),
            revision_seen: AtomicI64::new(0),
        }))
    }

    /// The store's failover state and counters.
    pub(super) fn failover(&self) -> &Arc<Failover> {
        &self.failover
    }

    /// An answer carried store revision `revision`.
    pub(super) fn note_revision(&self, revision: i64) {
        self.revision_seen.fetch_max(revision, Ordering::Relaxed);
    }

    /// The highest store revision an answer has carried so far: a key
    /// whose `mod_revision` is at most this was written before any call
    /// that begins now, so not by it. (0 before the first answer.)
    pub(super) fn revision_seen(&self) -> i64 {
        self.revision_seen.load(Ordering::Relaxed)
    }

    /// Whether an ambiguous write (an attempt of it may have landed
    /// unanswered) that finds `kv` holding the value it wrote wrote it: not
    /// if `kv` was written before the call began (`seen`, the
    /// [`Members::revision_seen`] read before its first attempt). A key
    /// written since is taken for the call's own (a concurrent writer of
    /// the very same value is not told apart).
    pub(super) fn landed_ours(&self, ambiguous: bool, seen: i64, kv: &KeyValue) -> bool {
        let ours = ambiguous && kv.mod_revision() > seen;
        if ours {
            self.resolved_ambiguous();
        }
        ours
    }

    /// Counts an ambiguous write resolved by its caller's re-read.
    pub(super) fn resolved_ambiguous(&self) {
        self.failover.count(FailoverEvent::AmbiguousResolved);
    }

    /// The member for the next attempt: round-robin over the healthy ones
    /// this operation has not tried, else over the untried ones, else over
    /// the healthy ones, else any.
    fn pick(&self, tried: &[usize]) -> usize {
        let n = self.members.len();
        let start = self.next.fetch_add(1, Ordering::Relaxed);
        let order = (0..n).map(|i| (start + i) % n);
        let healthy = |i: &usize| self.failover.endpoints()[*i].healthy();
        let untried = |i: &usize| !tried.contains(i);
        order
            .clone()
            .find(|i| healthy(i) && untried(i))
            .or_else(|| order.clone().find(untried))
            .or_else(|| order.clone().find(healthy))
            .unwrap_or(start % n)
    }

    /// Runs `request` on a member within `op`'s deadline; on a missed
    /// deadline or an `Unavailable` answer, on another member (at most
    /// [`ATTEMPTS_MAX`] attempts, within `op`'s budget). Errors a retry will
    /// not fix return at once.
    pub(super) async fn run<T, F, Fut>(
        self: &Arc<Self>,
        op: Op,
        request: F,
    ) -> Result<Answer<T>, StoreError>
    where
        F: Fn(KvClient) -> Fut,
        Fut: Future<Output = Result<T, etcd_client::Error>>,
    {
        self.run_on(op, |member| member.kv.clone(), request).await
    }

    /// [`Members::run`] for a lease request (grant, revoke, time-to-live).
    pub(super) async fn run_lease<T, F, Fut>(
        self: &Arc<Self>,
        op: Op,
        request: F,
    ) -> Result<Answer<T>, StoreError>
    where
        F: Fn(LeaseClient) -> Fut,
        Fut: Future<Output = Result<T, etcd_client::Error>>,
    {
        self.run_on(op, |member| member.lease.clone(), request)
            .await
    }

    /// [`Members::run`] with the client `client` takes from a member.
    async fn run_on<C, T, F, Fut>(
        self: &Arc<Self>,
        op: Op,
        client: fn(&Member) -> C,
        request: F,
    ) -> Result<Answer<T>, StoreError>
    where
        F: Fn(C) -> Fut,
        Fut: Future<Output = Result<T, etcd_client::Error>>,
    {
        let mut tried: Vec<usize> = Vec::with_capacity(ATTEMPTS_MAX);
        let mut ambiguous = false;
        let mut last = None;
        let started = tokio::time::Instant::now();
        for _ in 0..ATTEMPTS_MAX {
            let index = self.pick(&tried);
            if tried.contains(&index) {
                // Every member failed this once (a leader election, say): pause.
                tokio::time::sleep(Duration::from_millis(RETRY_PAUSE_MS)).await;
            } else if !tried.is_empty() {
                self.failover.count(FailoverEvent::RetriedElsewhere);
            }
            let left = op.budget().saturating_sub(started.elapsed());
            if left.is_zero() {
                break;
            }
            tried.push(index);
            let client = client(&self.members[index]);
            let deadline = op.deadline().min(left);
            let failed = match tokio::time::timeout(deadline, request(client)).await {
                Ok(Ok(value)) => return Ok(Answer { value, ambiguous }),
                Ok(Err(e)) => match map_err(e) {
                    e @ StoreError::Unavailable { .. } => e,
                    e => return Err(e),
                },
                Err(_) => {
                    self.failover.count(FailoverEvent::DeadlineMissed);
                    StoreError::Unavailable {
                        backend: "etcd",
                        reason: format!(
                            "{} did not answer within {} ms",
                            self.failover.endpoints()[index].endpoint,
                            deadline.as_millis()
                        ),
                    }
                }
            };
            // A write whose answer is lost may still have landed.
            ambiguous |= op.writes();
            self.avoid(index, &failed);
            last = Some(failed);
        }
        Err(last.unwrap_or_else(|| StoreError::Unavailable {
            backend: "etcd",
            reason: format!("no member answered within {} ms", op.budget().as_millis()),
        }))
    }

    /// Stops sending operations to member `index` until a probe is answered.
    fn avoid(self: &Arc<Self>, index: usize, why: &StoreError) {
        if self.failover.set_healthy(index, false) {
            let endpoint = &self.failover.endpoints()[index].endpoint;
            tracing::warn!(endpoint = %endpoint, error = %why, "etcd member avoided until it answers a probe");
        }
        if !self.members[index].probing.swap(true, Ordering::AcqRel) {
            tokio::spawn(probe(Arc::downgrade(self), index));
        }
    }
}

/// Probes member `index` until it answers, then marks it healthy; ends
/// early when the store is dropped.
async fn probe(members: Weak<Members>, index: usize) {
    loop {
        tokio::time::sleep(Duration::from_millis(PROBE_INTERVAL_MS)).await;
        let Some(members) = members.upgrade() else {
            return;
        };
        let member = &members.members[index];
        let mut maintenance = member.maintenance.clone();
        let deadline = Duration::from_millis(PROBE_DEADLINE_MS);
        if let Ok(Ok(_)) = tokio::time::timeout(deadline, maintenance.status()).await {
            // Probing off first: an `avoid` from here on starts a new probe.
            member.probing.store(false, Ordering::Release);
            members.failover.set_healthy(index, true);
            let endpoint = &members.failover.endpoints()[index].endpoint;
            tracing::info!(endpoint = %endpoint, "etcd member answers again");
            return;
        }
    }
}
