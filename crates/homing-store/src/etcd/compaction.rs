//! Compaction of the etcd keyspace by revision. etcd keeps every version of
//! every key until it is compacted: with the DC store on etcd each renewal
//! adds a version of its record (and of its expiry-index entry), so a busy DC
//! grows the database by its write rate, forever, until etcd's quota
//! (`--quota-backend-bytes`, 2 GiB by default) is reached and etcd refuses
//! every write to the whole cluster (NOSPACE alarm).
//!
//! What homing needs of etcd's history is little: every guard compares a
//! key's *current* `mod_revision` or `create_revision`, and the event log and
//! scan cursors live in keys, not in revisions; the one read at an older
//! revision is an expiry-index page's second read (its records at the
//! revision of its entries), made right after the first. homing uses no etcd
//! watch. So a compactor keeps the last `retain_revisions` revisions and
//! compacts below them every `interval_ms`; a page read that still meets a
//! compacted revision fails that upkeep pass, and the next pass reads again.
//!
//! Compaction is cluster-wide (every prefix, every DC sharing the cluster);
//! several compactors on one cluster are harmless: a revision already
//! compacted is taken as done. Compaction frees space inside etcd's database
//! file for reuse but does not shrink the file: see OPERATIONS.md for
//! defragmentation.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::time::Duration;

use super::Space;
use super::members::Op;
use crate::error::StoreError;

/// Default time between compactions, ms.
pub const COMPACT_INTERVAL_MS_DEFAULT: u64 = 60_000;
/// Default revisions kept below the current one.
pub const COMPACT_RETAIN_REVISIONS_DEFAULT: u64 = 10_000;

/// When and how far to compact.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CompactionPolicy {
    /// Time between compactions, ms (≥ 1).
    pub interval_ms: u64,
    /// Revisions kept below the current one (≥ 1).
    pub retain_revisions: u64,
}

impl Default for CompactionPolicy {
    fn default() -> CompactionPolicy {
        CompactionPolicy {
            interval_ms: COMPACT_INTERVAL_MS_DEFAULT,
            retain_revisions: COMPACT_RETAIN_REVISIONS_DEFAULT,
        }
    }
}

/// What the compactor did, for metrics.
#[derive(Debug, Default)]
pub struct CompactionStats {
    compactions: AtomicU64,
    failures: AtomicU64,
    revision: AtomicI64,
}

impl CompactionStats {
    /// Compactions asked of etcd and accepted.
    pub fn compactions(&self) -> u64 {
        self.compactions.load(Ordering::Relaxed)
    }

    /// Compactions that failed (tried again next interval).
    pub fn failures(&self) -> u64 {
        self.failures.load(Ordering::Relaxed)
    }

    /// The revision last compacted to (0: none yet).
    pub fn revision(&self) -> i64 {
        self.revision.load(Ordering::Relaxed)
    }
}

/// A running compactor; stops when dropped.
pub struct Compactor {
    task: tokio::task::JoinHandle<()>,
    stats: Arc<CompactionStats>,
}

impl Compactor {
    /// Connects to the cluster at `endpoints` and starts compacting it by
    /// `policy` on the current tokio runtime.
    pub async fn connect(
        endpoints: &[String],
        policy: CompactionPolicy,
    ) -> Result<Compactor, StoreError> {
        Ok(Compactor::start(
            Space::connect(endpoints, "").await?,
            policy,
        ))
    }

    /// Starts compacting the cluster of `space` by `policy` on the current
    /// tokio runtime.
    pub(super) fn start(space: Space, policy: CompactionPolicy) -> Compactor {
        assert!(
            policy.interval_ms >= 1 && policy.retain_revisions >= 1,
            "compaction: interval and retention must be at least 1"
        );
        let stats = Arc::new(CompactionStats::default());
        let task = tokio::spawn(run(space, policy, stats.clone()));
        Compactor { task, stats }
    }

    /// What it did so far.
    pub fn stats(&self) -> Arc<CompactionStats> {
        self.stats.clone()
    }
}

impl Drop for Compactor {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn run(space: Space, policy: CompactionPolicy, stats: Arc<CompactionStats>) {
    let mut ticks = tokio::time::interval(Duration::from_millis(policy.interval_ms));
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        let done = stats.revision.load(Ordering::Relaxed);
        match compact_once(&space, policy.retain_revisions, done).await {
            Ok(Some(revision)) => {
                stats.revision.store(revision, Ordering::Relaxed);
                stats.compactions.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(revision, "etcd compacted");
            }
            Ok(None) => {}
            Err(e) => {
                stats.failures.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(error = %e, "etcd compaction failed; trying again next interval");
            }
        }
    }
}

/// Compacts below the current revision minus `retain`, unless that is at
/// or below `done`: the revision compacted to, if any.
async fn compact_once(space: &Space, retain: u64, done: i64) -> Result<Option<i64>, StoreError> {
    // Any read answers with the cluster's current revision.
    let probe = space
        .get(Op::BulkRead, space.key(b"alloc", b""), None)
        .await?;
    let current = probe.header().map_or(0, |h| h.revision());
    let target = current.saturating_sub(i64::try_from(retain).unwrap_or(i64::MAX));
    if target <= done.max(0) {
        return Ok(None);
    }
    let compacted = space
        .members
        .run(Op::BulkWrite, |mut kv| async move {
            kv.compact(target, None).await
        })
        .await;
    match compacted {
        Ok(_) => Ok(Some(target)),
        // Another compactor (another DC's homingd, etcd's own) got there first.
        Err(e) if e.to_string().contains("compacted") => Ok(Some(target)),
        Err(e) => Err(e),
    }
}
