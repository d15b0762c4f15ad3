//! The key quota as homingd keeps it: homing-node's [`KeyQuota`] decides
//! whether a DC may create one more key in a namespace (each keeps a
//! global entry forever); this module counts a namespace's keys in the DC
//! store the first time the process needs them — one count per namespace,
//! in a task of its own, so a host that gives up on its create does not
//! cancel it — and holds an admitted create's slot until its global write
//! settles it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use homing_core::{DcId, ErrorKind, ErrorReply, Namespace};
use homing_node::{Admit, Failure, KeyQuota};
use homing_store::{DcStore, StoreError};
use tokio::sync::watch;

/// A count's outcome once known (`Err`: why it failed).
type Counted = watch::Receiver<Option<Result<(), String>>>;

/// Keys this DC created per namespace, against `keys_per_namespace_max`.
pub struct Quota {
    quota: Arc<Mutex<KeyQuota>>,
    /// Counts running now, by namespace.
    counts: Arc<Mutex<HashMap<Namespace, Counted>>>,
}

/// A key create admitted by the quota: given back when dropped unless
/// [`QuotaSlot::settle`] says this DC's entry is the key's.
pub struct QuotaSlot<'a> {
    quota: &'a Mutex<KeyQuota>,
    namespace: Namespace,
    kept: bool,
}

impl QuotaSlot<'_> {
    /// The key's global write answered: `ours` if the entry is this create's.
    pub fn settle(mut self, ours: bool) {
        self.kept = ours;
    }
}

impl Drop for QuotaSlot<'_> {
    fn drop(&mut self) {
        lock(self.quota).settle(&self.namespace, self.kept);
    }
}

fn lock(quota: &Mutex<KeyQuota>) -> MutexGuard<'_, KeyQuota> {
    quota.lock().expect("the quota lock is never poisoned")
}

impl Quota {
    /// A quota of `keys_per_namespace_max` keys per namespace.
    pub fn new(keys_per_namespace_max: u64) -> Quota {
        Quota {
            quota: Arc::new(Mutex::new(KeyQuota::new(keys_per_namespace_max))),
            counts: Arc::default(),
        }
    }

    /// Admits the create of a key in `namespace` at DC `dc`, as
    /// homing-node's [`KeyQuota`] decides (counting the namespace in the DC
    /// store `records` first, once per process).
    pub async fn admit(
        &self,
        dc: &DcId,
        records: &Arc<dyn DcStore>,
        namespace: &Namespace,
    ) -> Result<QuotaSlot<'_>, Failure> {
        let mut admit = lock(&self.quota).admit(namespace);
        if admit == Admit::Count {
            let mut outcome = self.count(records, namespace);
            let counted = outcome.wait_for(Option::is_some).await;
            if let Ok(done) = counted
                && let Some(Err(reason)) = done.as_ref()
            {
                let e = StoreError::Unavailable {
                    backend: "dc",
                    reason: format!("counting the keys of namespace {namespace:?}: {reason}"),
                };
                return Err(Failure::of_store(dc, e.is_unavailable(), e));
            }
            admit = lock(&self.quota).admit(namespace);
        }
        match admit {
            Admit::Granted => Ok(QuotaSlot {
                quota: &self.quota,
                namespace: namespace.clone(),
                kept: false,
            }),
            Admit::Refused(reply) => Err(Failure::from_reply(reply)),
            Admit::Count => Err(Failure::Refused(ErrorReply::new(
                ErrorKind::Internal,
                "key quota: a counted namespace asked to be counted again",
            ))),
        }
    }

    /// The count of `namespace`'s keys in `records`, started in a task of
    /// its own unless one runs (one per namespace; the task ends even if
    /// every create waiting on it gave up).
    fn count(&self, records: &Arc<dyn DcStore>, namespace: &Namespace) -> Counted {
        let mut counts = self.counts.lock().expect("never poisoned");
        if let Some(running) = counts.get(namespace) {
            return running.clone();
        }
        let (done, outcome) = watch::channel(None);
        counts.insert(namespace.clone(), outcome.clone());
        let (records, quota, counts) = (records.clone(), self.quota.clone(), self.counts.clone());
        let bound = lock(&self.quota).count_bound();
        let namespace = namespace.clone();
        tokio::spawn(async move {
            let counted = records.keys_created(&namespace, bound).await;
            let result = match counted {
                Ok(created) => {
                    tracing::info!(
                        namespace = namespace.as_str(),
                        created,
                        "counted the keys this dc created in a namespace"
                    );
                    lock(&quota).counted(&namespace, created);
                    Ok(())
                }
                Err(e) => Err(e.to_string()),
            };
            counts.lock().expect("never poisoned").remove(&namespace);
            done.send_replace(Some(result));
        });
        outcome
    }
}
