//! `Admission`: which client connections a listener serves. At most
//! `connections_max` are open at once. At the cap, a new connection takes
//! the place of the oldest open connection that has not yet sent a request
//! (which is closed, unanswered); only if every open connection has sent
//! one is the new connection closed on accept. So connections that never
//! send a request cannot lock real clients out, however fast they
//! reconnect: each one that arrives pushes out the oldest of its kind, and
//! a real client's request reaches the service unless `connections_max`
//! silent connections arrive between its accept and its request.
//! (EDGE-ROUTER.md, "Slow clients and memory", says why this and not a
//! per-address cap.)
//!
//! ```text
//!  accepted ──open < max──────────────────────────► waiting ──first request──► requested
//!      ├──open = max, a waiting one exists──► it is evicted; this one waits   (never evicted)
//!      └──open = max, none waiting──► closed on accept
//! ```

use std::collections::BTreeMap;
use std::future::{Future, poll_fn};
use std::pin::pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::Poll;

use tokio::sync::{Notify, watch};

/// The connections of one listener. See the module docs.
pub(crate) struct Admission {
    connections_max: usize,
    state: Mutex<State>,
    /// Open connections (admitted, not yet ended or evicted), for watchers.
    open: watch::Sender<usize>,
    evicted: AtomicU64,
}

struct State {
    /// Admitted connections not yet ended or evicted; `<= connections_max`.
    open: usize,
    next_id: u64,
    /// Open connections that have not yet sent a request, by admission
    /// order (ids only grow): the first is the oldest.
    waiting: BTreeMap<u64, Arc<Shared>>,
}

/// What a connection and the admission both see.
struct Shared {
    /// Set (under the state lock) when evicted: its place is already given away.
    evicted: AtomicBool,
    /// Set once a request reached the service.
    requested: AtomicBool,
    /// Notified when evicted.
    close: Notify,
}

/// One admitted connection's place; dropping it frees the place.
pub(crate) struct Admitted {
    admission: Arc<Admission>,
    id: u64,
    shared: Arc<Shared>,
}

impl Admission {
    pub(crate) fn new(connections_max: usize) -> Admission {
        Admission {
            connections_max,
            state: Mutex::new(State {
                open: 0,
                next_id: 0,
                waiting: BTreeMap::new(),
            }),
            open: watch::Sender::new(0),
            evicted: AtomicU64::new(0),
        }
    }

    /// A place for a new connection, evicting the oldest connection that
    /// has not sent a request if the cap is reached; `None` if every open
    /// connection has sent one (the new connection is to be closed).
    pub(crate) fn admit(self: &Arc<Self>) -> Option<Admitted> {
        let mut state = self.lock();
        if state.open >= self.connections_max {
            let (_, oldest) = state.waiting.pop_first()?;
            oldest.evicted.store(true, Ordering::Release);
            oldest.close.notify_one();
            self.evicted.fetch_add(1, Ordering::Relaxed);
            state.open -= 1;
        }
        state.open += 1;
        assert!(state.open <= self.connections_max, "admission over its cap");
        let id = state.next_id;
        state.next_id += 1;
        let shared = Arc::new(Shared {
            evicted: AtomicBool::new(false),
            requested: AtomicBool::new(false),
            close: Notify::new(),
        });
        state.waiting.insert(id, shared.clone());
        self.open.send_replace(state.open);
        Some(Admitted {
            admission: self.clone(),
            id,
            shared,
        })
    }

    /// Open connections now, to watch (e.g. until a closed one is gone).
    pub(crate) fn open(&self) -> watch::Receiver<usize> {
        self.open.subscribe()
    }

    /// Connections evicted so far.
    pub(crate) fn evicted(&self) -> u64 {
        self.evicted.load(Ordering::Relaxed)
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // The state is a count and a map each updated in one step: still
        // consistent after a panic elsewhere.
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl std::fmt::Debug for Admission {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Admission")
            .field("connections_max", &self.connections_max)
            .field("open", &*self.open.borrow())
            .field("evicted", &self.evicted())
            .finish()
    }
}

impl Admitted {
    /// Marks the connection as having sent a request: it is no longer
    /// evicted for a newcomer. Cheap after the first call. Set only once
    /// the connection left `waiting` under the lock, so a connection marked
    /// requested can never be evicted any more (which lets [`Self::evicted`]
    /// stop looking).
    pub(crate) fn requested(&self) {
        if self.shared.requested.load(Ordering::Acquire) {
            return;
        }
        let mut state = self.admission.lock();
        // Absent: evicted just before; it stays unrequested and is dropped.
        if state.waiting.remove(&self.id).is_some() {
            self.shared.requested.store(true, Ordering::Release);
        }
    }

    /// Resolves once this connection was evicted for a newer one; never,
    /// without further work per poll, once it sent a request.
    pub(crate) async fn evicted(&self) {
        let mut notified = pin!(self.shared.close.notified());
        poll_fn(|cx| {
            if self.shared.requested.load(Ordering::Acquire) {
                return Poll::Pending;
            }
            notified.as_mut().poll(cx)
        })
        .await;
    }
}

impl Drop for Admitted {
    fn drop(&mut self) {
        let mut state = self.admission.lock();
        state.waiting.remove(&self.id);
        if !self.shared.evicted.load(Ordering::Acquire) {
            state.open -= 1;
            self.admission.open.send_replace(state.open);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn at_the_cap_the_oldest_connection_without_a_request_makes_room() {
        let admission = Arc::new(Admission::new(3));
        let first = admission.admit().expect("room");
        let second = admission.admit().expect("room");
        let third = admission.admit().expect("room");
        first.requested();
        let fourth = admission
            .admit()
            .expect("the oldest waiting one makes room");
        assert!(
            second.shared.evicted.load(Ordering::Acquire),
            "second is the oldest waiting"
        );
        assert!(
            !first.shared.evicted.load(Ordering::Acquire),
            "first sent a request"
        );
        assert!(!third.shared.evicted.load(Ordering::Acquire));
        assert_eq!((*admission.open().borrow(), admission.evicted()), (3, 1));
        third.requested();
        fourth.requested();
        assert!(
            admission.admit().is_none(),
            "every open connection sent a request"
        );
        drop(second);
        assert_eq!(
            *admission.open().borrow(),
            3,
            "an evicted place is not freed twice"
        );
        drop(first);
        assert_eq!(*admission.open().borrow(), 2);
        assert!(admission.admit().is_some(), "a freed place is taken");
    }

    #[tokio::test]
    async fn an_evicted_connection_is_told() {
        let admission = Arc::new(Admission::new(1));
        let silent = admission.admit().expect("room");
        let _newcomer = admission.admit().expect("the silent one makes room");
        // The notification was stored before anyone waited: no lost wake-up.
        silent.evicted().await;
    }

    #[tokio::test]
    async fn a_connection_evicted_just_before_its_first_request_is_told_all_the_same() {
        let admission = Arc::new(Admission::new(1));
        let late = admission.admit().expect("room");
        let _newcomer = admission.admit().expect("the silent one makes room");
        // Its request arrives after the eviction: it is not marked as
        // requested (which would stop `evicted` from looking)…
        late.requested();
        assert!(!late.shared.requested.load(Ordering::Acquire));
        // …so it learns of the eviction and its place is not held twice.
        tokio::time::timeout(std::time::Duration::from_secs(5), late.evicted())
            .await
            .expect("told of the eviction");
    }
}
