//! The key quota's counts as homingd takes them. homing-node's `Endpoint`
//! decides whether a DC may create one more key in a namespace (each keeps
//! a global entry forever) and keeps the counts; when a namespace is not
//! counted yet, its admission comes back to the driver, and this module
//! counts the namespace's keys in the DC store — one count per namespace at
//! a time, in a task of its own, so a host that gives up on its create does
//! not cancel it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use homing_core::{DcId, Namespace};
use homing_node::Failure;
use homing_store::{DcStore, StoreError};
use tokio::sync::watch;

/// A count's outcome once known (`Err`: why it failed).
type Counted = watch::Receiver<Option<Result<u64, String>>>;

/// The counts of namespaces' keys running now, by namespace.
#[derive(Default)]
pub struct KeyCounts {
    running: Arc<Mutex<HashMap<Namespace, Counted>>>,
}

impl KeyCounts {
    /// How many keys DC `dc` created in `namespace`, as its store `records`
    /// holds them (at most `bound`): joins the count of that namespace if
    /// one runs, else starts one, which hands its number to `counted` (also
    /// when every create that waited for it gave up).
    pub async fn count(
        &self,
        dc: &DcId,
        records: &Arc<dyn DcStore>,
        namespace: &Namespace,
        bound: u64,
        counted: impl FnOnce(u64) + Send + 'static,
    ) -> Result<u64, Failure> {
        let mut outcome = self.start(records, namespace, bound, counted);
        let failed = |reason: String| {
            let e = StoreError::Unavailable {
                backend: "dc",
                reason: format!("counting the keys of namespace {namespace:?}: {reason}"),
            };
            Failure::of_store(dc, e.is_unavailable(), e)
        };
        let counted = outcome.wait_for(Option::is_some).await;
        match counted.as_deref() {
            Ok(Some(Ok(created))) => Ok(*created),
            Ok(Some(Err(reason))) => Err(failed(reason.clone())),
            // The task ended without an answer (the runtime shuts down).
            Ok(None) | Err(_) => Err(failed("the count stopped".to_string())),
        }
    }

    /// The count of `namespace`'s keys in `records`, started in a task of
    /// its own unless one runs (the task ends even if every create waiting
    /// on it gave up).
    fn start(
        &self,
        records: &Arc<dyn DcStore>,
        namespace: &Namespace,
        bound: u64,
        counted: impl FnOnce(u64) + Send + 'static,
    ) -> Counted {
        let mut running = self.running.lock().expect("never poisoned");
        if let Some(count) = running.get(namespace) {
            return count.clone();
        }
        let (done, outcome) = watch::channel(None);
        running.insert(namespace.clone(), outcome.clone());
        let (records, running) = (records.clone(), self.running.clone());
        let namespace = namespace.clone();
        tokio::spawn(async move {
            let count = records.keys_created(&namespace, bound).await;
            if let Ok(created) = &count {
                tracing::info!(
                    namespace = namespace.as_str(),
                    created,
                    "counted the keys this dc created in a namespace"
                );
                counted(*created);
            }
            running.lock().expect("never poisoned").remove(&namespace);
            done.send_replace(Some(count.map_err(|e| e.to_string())));
        });
        outcome
    }
}
