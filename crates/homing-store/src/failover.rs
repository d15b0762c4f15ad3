//! What a store that talks to several servers (the etcd members) reports
//! about going around a silent one: each endpoint's health, operations
//! retried on another endpoint, deadlines missed, and ambiguous outcomes
//! resolved by re-reading. The backend updates it; homingd renders it on
//! `/metrics`. Backends with one local file (memory, redb) or whose client
//! fails over by itself (FoundationDB) have none.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// One endpoint's health as the store judges it.
#[derive(Debug)]
pub struct EndpointHealth {
    /// The endpoint (`http://host:port`).
    pub endpoint: String,
    healthy: AtomicBool,
}

impl EndpointHealth {
    /// Whether operations go to this endpoint: false from a missed deadline
    /// or a transport error until a probe is answered again.
    pub fn healthy(&self) -> bool {
        self.healthy.load(Ordering::Relaxed)
    }
}

/// A store's failover state and counters; cheap to update from any task.
#[derive(Debug)]
pub struct Failover {
    endpoints: Vec<EndpointHealth>,
    retried_elsewhere: AtomicU64,
    deadlines_missed: AtomicU64,
    ambiguous_resolved: AtomicU64,
}

/// Which counter of [`Failover`] moved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailoverEvent {
    /// An operation went to another endpoint after one failed it.
    RetriedElsewhere,
    /// An endpoint did not answer an operation within its deadline.
    DeadlineMissed,
    /// A write whose first attempt may have landed was retried and the
    /// re-read showed the caller's own value: counted as written, once.
    AmbiguousResolved,
}

impl Failover {
    /// Every endpoint healthy, every counter zero.
    pub fn new(endpoints: &[String]) -> Failover {
        Failover {
            endpoints: endpoints
                .iter()
                .map(|e| EndpointHealth {
                    endpoint: e.clone(),
                    healthy: AtomicBool::new(true),
                })
                .collect(),
            retried_elsewhere: AtomicU64::new(0),
            deadlines_missed: AtomicU64::new(0),
            ambiguous_resolved: AtomicU64::new(0),
        }
    }

    /// The endpoints, in the order the store was given them.
    pub fn endpoints(&self) -> &[EndpointHealth] {
        &self.endpoints
    }

    /// Marks endpoint `index` healthy or not (for the backend); returns
    /// whether it was healthy. Panics if there is no such endpoint.
    pub fn set_healthy(&self, index: usize, healthy: bool) -> bool {
        self.endpoints[index]
            .healthy
            .swap(healthy, Ordering::Relaxed)
    }

    /// Counts one `event` (for the backend).
    pub fn count(&self, event: FailoverEvent) {
        self.counter(event).fetch_add(1, Ordering::Relaxed);
    }

    /// How many `event`s so far.
    pub fn total(&self, event: FailoverEvent) -> u64 {
        self.counter(event).load(Ordering::Relaxed)
    }

    fn counter(&self, event: FailoverEvent) -> &AtomicU64 {
        match event {
            FailoverEvent::RetriedElsewhere => &self.retried_elsewhere,
            FailoverEvent::DeadlineMissed => &self.deadlines_missed,
            FailoverEvent::AmbiguousResolved => &self.ambiguous_resolved,
        }
    }
}
