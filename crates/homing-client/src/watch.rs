//! `Watcher`: follows one DC's lifecycle events (reserved, released with
//! outcome, expired, linked, drained, abandoned) in order, from a cursor.
//!
//! Events are derived from the DC's durable store state, so nothing is lost
//! when the DC's daemon restarts; the watcher long-polls (`Watch` with
//! `wait_ms`) and retries through outages. Store [`Watcher::cursor`] with
//! whatever the consumer did with the events, and pass it to
//! [`Watcher::new`] after a restart: the stream continues with the next event.
//!
//! ```no_run
//! # async fn watch(client: homing_net::Client, iad: homing_net::Peer) -> Result<(), homing_client::WatchError> {
//! use homing_client::Watcher;
//! use homing_core::{Namespace, NamespaceScope};
//! let scope = NamespaceScope::subtree(Namespace::new("games/eu").unwrap());
//! let mut watcher = Watcher::new(client, iad, scope, 0);
//! loop {
//!     let event = watcher.next().await?;
//!     println!("{} {} {}", event.seq, event.kind.name(), event.key);
//!     // persist watcher.cursor() with the effect of handling `event`
//! }
//! # }
//! ```

use std::collections::VecDeque;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use homing_core::{DcId, ErrorKind, ErrorReply, Event, EventSeq, NamespaceScope, Reply, Request};
use homing_net::{Client, Peer};
use thiserror::Error;

/// How long one `Watch` request waits for an event at the DC, in milliseconds.
pub const WATCH_WAIT_MS_DEFAULT: u32 = 20_000;
/// Pause before retrying a DC that did not answer, in milliseconds.
pub const WATCH_RETRY_MS: u64 = 500;

/// Why the watch cannot continue.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum WatchError {
    /// Events after the cursor were trimmed by the DC's retention: the
    /// consumer missed some and must rebuild its state (then resume from
    /// `oldest - 1`).
    #[error("dc {dc} trimmed events after cursor {cursor}; oldest kept is {oldest}")]
    Trimmed {
        /// The DC.
        dc: DcId,
        /// The cursor that was too old.
        cursor: EventSeq,
        /// The oldest event the DC keeps.
        oldest: EventSeq,
    },
    /// The DC refused the watch (unauthorized, bad request).
    #[error("dc {dc} refused the watch: {error}")]
    Refused {
        /// The DC.
        dc: DcId,
        /// Its answer.
        error: ErrorReply,
    },
}

/// A resumable follower of one DC's event log. See the module docs.
pub struct Watcher {
    client: Client,
    peer: Peer,
    scope: NamespaceScope,
    /// The log position after the last event handed out (or skipped).
    cursor: EventSeq,
    /// Fetched, not yet handed out, with the batch's cursor for when they are.
    buffered: VecDeque<Event>,
    batch_next: EventSeq,
    wait_ms: u32,
}

impl Watcher {
    /// Follows `peer`'s events in `scope` after `cursor` (`0`: from the
    /// oldest event the DC keeps).
    pub fn new(client: Client, peer: Peer, scope: NamespaceScope, cursor: EventSeq) -> Watcher {
        Watcher {
            client,
            peer,
            scope,
            cursor,
            buffered: VecDeque::new(),
            batch_next: cursor,
            wait_ms: WATCH_WAIT_MS_DEFAULT,
        }
    }

    /// Sets how long each request waits at the DC for an event.
    pub fn with_wait_ms(mut self, wait_ms: u32) -> Watcher {
        self.wait_ms = wait_ms;
        self
    }

    /// The DC watched.
    pub fn dc(&self) -> &DcId {
        &self.peer.dc
    }

    /// Where to resume after the events handed out so far.
    pub fn cursor(&self) -> EventSeq {
        self.cursor
    }

    /// The next event in scope, waiting as long as it takes. A DC that does
    /// not answer is retried every [`WATCH_RETRY_MS`]; only a trimmed cursor
    /// or a refusal ends the watch. Cancel-safe: dropping the future loses
    /// no event (the cursor moves only when an event is returned).
    pub async fn next(&mut self) -> Result<Event, WatchError> {
        loop {
            if let Some(event) = self.take() {
                return Ok(event);
            }
            match self.poll_once().await? {
                true => {}
                false => tokio::time::sleep(Duration::from_millis(WATCH_RETRY_MS)).await,
            }
        }
    }

    /// One `Watch` request; whatever it brought is buffered. `Ok(false)`: the
    /// DC did not answer (or was unavailable), try again later.
    pub async fn poll_once(&mut self) -> Result<bool, WatchError> {
        let request = Request::Watch {
            scope: self.scope.clone(),
            after: self.batch_next,
            wait_ms: self.wait_ms,
        };
        match self.client.request(&self.peer, &request).await {
            Ok(Reply::Events { events, next }) => {
                self.buffered.extend(events);
                self.batch_next = next;
                if self.buffered.is_empty() {
                    self.cursor = next;
                }
                Ok(true)
            }
            Ok(Reply::Error(error)) => match error.kind {
                ErrorKind::Trimmed { oldest } => Err(WatchError::Trimmed {
                    dc: self.peer.dc.clone(),
                    cursor: self.batch_next,
                    oldest,
                }),
                ErrorKind::Unavailable { .. } | ErrorKind::Overloaded | ErrorKind::Internal => {
                    tracing::debug!(dc = %self.peer.dc, %error, "watch: retrying");
                    Ok(false)
                }
                _ => Err(WatchError::Refused {
                    dc: self.peer.dc.clone(),
                    error,
                }),
            },
            Ok(other) => {
                let error = ErrorReply::new(
                    ErrorKind::Inconsistent,
                    format!("answered {} to watch", reply_name(&other)),
                );
                Err(WatchError::Refused {
                    dc: self.peer.dc.clone(),
                    error,
                })
            }
            Err(e) => {
                tracing::debug!(dc = %self.peer.dc, error = %e, "watch: dc did not answer; retrying");
                Ok(false)
            }
        }
    }

    fn take(&mut self) -> Option<Event> {
        let event = self.buffered.pop_front()?;
        self.cursor = if self.buffered.is_empty() {
            self.batch_next
        } else {
            event.seq
        };
        Some(event)
    }

    /// The events as a [`futures_core::Stream`]; it ends after the first error.
    pub fn into_stream(self) -> WatchStream {
        WatchStream {
            state: Some(State::Idle(Box::new(self))),
        }
    }
}

fn reply_name(reply: &Reply) -> String {
    format!("{reply:?}").chars().take(60).collect()
}

type Pending =
    Pin<Box<dyn Future<Output = (Box<Watcher>, Result<Event, WatchError>)> + Send + 'static>>;

enum State {
    Idle(Box<Watcher>),
    Waiting(Pending),
}

/// [`Watcher::into_stream`]: each item is the next event in scope.
pub struct WatchStream {
    state: Option<State>,
}

impl futures_core::Stream for WatchStream {
    type Item = Result<Event, WatchError>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        loop {
            match self.state.take() {
                None => return Poll::Ready(None),
                Some(State::Idle(mut watcher)) => {
                    self.state = Some(State::Waiting(Box::pin(async move {
                        let next = watcher.next().await;
                        (watcher, next)
                    })));
                }
                Some(State::Waiting(mut pending)) => match pending.as_mut().poll(cx) {
                    Poll::Pending => {
                        self.state = Some(State::Waiting(pending));
                        return Poll::Pending;
                    }
                    Poll::Ready((watcher, Ok(event))) => {
                        self.state = Some(State::Idle(watcher));
                        return Poll::Ready(Some(Ok(event)));
                    }
                    Poll::Ready((_, Err(e))) => return Poll::Ready(Some(Err(e))),
                },
            }
        }
    }
}
