//! The lease as the DC last granted it, seen from the wire: a
//! [`LeaseTransport`] around the host's QUIC transport that notes every
//! grant's deadlines (and a drain or a lost lease) on their way to the
//! `HostAgent`. `hold` needs the hard deadline itself to kill COMMAND's group
//! *before* it (the agent's own callback fires at it, not before) and to
//! print the deadlines for supervisors; `HostAgent` does not expose them.
//!
//! A deadline `d` answering a request sent at host time `t` falls at
//! `sent_at + (d - t)` on the monotonic clock, as in the agent; `sent_at`
//! here is read microseconds after the agent's own, so this hard deadline is
//! at most that much later than the agent's. `--kill-lead-ms` dwarfs it.

use async_trait::async_trait;
use homing_client::{LeaseTransport, QuicTransport};
use homing_core::{AcquireReply, Grant};
use homing_core::{Deadlines, FencingToken, HostTime, RenewReply, Reply, Request};
use std::time::Duration;
use tokio::sync::watch;
use tokio::time::Instant;

/// What the DC last said about the lease.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseView {
    /// The deadlines of the last grant (acquire or renewal), host clock.
    pub deadlines: Deadlines,
    /// Its hard deadline on this process's monotonic clock.
    pub hard_at: Instant,
    /// Renewals granted so far.
    pub renewals: u64,
    /// A renewal was answered `Draining`: no more renewals will be granted.
    pub draining: bool,
    /// A renewal was answered `StaleToken` or `Expired`: why.
    pub lost: Option<String>,
}

/// [`QuicTransport`] that publishes a [`LeaseView`] of every answer.
pub struct ObservedTransport {
    inner: QuicTransport,
    view: watch::Sender<Option<LeaseView>>,
}

impl ObservedTransport {
    /// Wraps `inner`; the receiver sees `None` until the first grant.
    pub fn new(inner: QuicTransport) -> (ObservedTransport, watch::Receiver<Option<LeaseView>>) {
        let (view, rx) = watch::channel(None);
        (ObservedTransport { inner, view }, rx)
    }

    fn granted(&self, deadlines: Deadlines, sent: HostTime, sent_at: Instant, renewal: bool) {
        let after = |d: HostTime| Duration::from_millis(d.ms_since(sent));
        let hard_at = sent_at + after(deadlines.hard_terminate_at);
        self.view.send_modify(|view| {
            let renewals = view.as_ref().map_or(0, |v| v.renewals) + u64::from(renewal);
            *view = Some(LeaseView {
                deadlines,
                hard_at,
                renewals,
                draining: false,
                lost: None,
            });
        });
    }

    fn noted(&self, note: impl FnOnce(&mut LeaseView)) {
        self.view.send_modify(|view| {
            if let Some(view) = view.as_mut() {
                note(view);
            }
        });
    }
}

#[async_trait]
impl LeaseTransport for ObservedTransport {
    async fn send(&self, request: Request) -> Result<Reply, String> {
        let sent_at = Instant::now();
        let sent = match &request {
            Request::Acquire { host_time, .. } | Request::Renew { host_time, .. } => {
                Some(*host_time)
            }
            _ => None,
        };
        let reply = self.inner.send(request).await?;
        match (&reply, sent) {
            (Reply::Acquire(AcquireReply::Acquired(Grant { deadlines, .. })), Some(sent)) => {
                self.granted(*deadlines, sent, sent_at, false)
            }
            (Reply::Renew(RenewReply::Renewed(deadlines)), Some(sent)) => {
                self.granted(*deadlines, sent, sent_at, true)
            }
            (Reply::Renew(RenewReply::Draining), _) => self.noted(|v| v.draining = true),
            (Reply::Renew(RenewReply::StaleToken { current }), _) => {
                let why = stale(*current);
                self.noted(|v| v.lost = Some(why));
            }
            (Reply::Renew(RenewReply::Expired), _) => {
                self.noted(|v| v.lost = Some("the dc says the lease expired".into()))
            }
            _ => {}
        }
        Ok(reply)
    }
}

fn stale(current: FencingToken) -> String {
    format!("the dc says the token is stale: the key's token is now {current}")
}
