//! `Unacked`: the replies one connection has written whose acknowledgement
//! has not been seen yet, so that shutdown's drain covers delivery, not just
//! handling: before the server lets a connection go, every reply on it is
//! acknowledged by the caller (or the drain time runs out).
//!
//! A request task does not wait for its own acknowledgement (a timer and a
//! wake-up per request); it leaves its finished stream here and ends. The
//! list is pruned of acknowledged streams each time it doubles, so it stays
//! within about twice the replies in flight, which quinn bounds: a stream
//! counts against the caller's stream limit until its reply is acknowledged.

use std::future::Future;
use std::pin::pin;
use std::sync::{Mutex, MutexGuard};
use std::task::{Context, Waker};

use quinn::SendStream;

/// Prune no more often than every this many replies.
const PRUNE_AT_MIN: usize = 64;

/// One connection's written, possibly unacknowledged replies.
pub(crate) struct Unacked {
    state: Mutex<State>,
}

struct State {
    streams: Vec<SendStream>,
    /// Prune when `streams` reaches this length.
    prune_at: usize,
    /// Set once the connection drains: later replies wait for themselves.
    draining: bool,
}

impl Unacked {
    pub(crate) fn new() -> Unacked {
        Unacked {
            state: Mutex::new(State {
                streams: Vec::new(),
                prune_at: PRUNE_AT_MIN,
                draining: false,
            }),
        }
    }

    /// Keeps `send`, whose reply is written and finished, until it is
    /// acknowledged. Once the connection drains there is no one to keep it
    /// for, so the stream is handed back and the caller waits for it itself.
    pub(crate) fn keep(&self, send: SendStream) -> Option<SendStream> {
        let mut state = self.lock();
        if state.draining {
            return Some(send);
        }
        state.streams.push(send);
        if state.streams.len() >= state.prune_at {
            state.streams.retain(|send| !is_acknowledged(send));
            state.prune_at = PRUNE_AT_MIN.max(2 * state.streams.len());
        }
        None
    }

    /// Stops keeping replies and waits until every kept one is acknowledged
    /// (or its stream or connection ends).
    pub(crate) async fn drain(&self) {
        let streams = {
            let mut state = self.lock();
            state.draining = true;
            std::mem::take(&mut state.streams)
        };
        for send in &streams {
            let _ = send.stopped().await;
        }
    }

    #[cfg(test)]
    fn kept(&self) -> usize {
        self.lock().streams.len()
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        crate::lock(&self.state)
    }
}

/// Whether the stream's data is all acknowledged (or it was stopped or
/// reset, or the connection is gone): nothing left to wait for.
fn is_acknowledged(send: &SendStream) -> bool {
    let mut cx = Context::from_waker(Waker::noop());
    pin!(send.stopped()).poll(&mut cx).is_ready()
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use homing_core::{DcId, Identity, Role};
    use quinn::crypto::rustls::{QuicClientConfig, QuicServerConfig};

    use super::*;
    use crate::identity::node_server_name;
    use crate::pki::DevCa;

    /// A connected pair of quinn connections on loopback: (client, server).
    async fn pair() -> (quinn::Connection, quinn::Connection, [quinn::Endpoint; 2]) {
        let ca = DevCa::generate("unacked test ca").unwrap();
        let dc = DcId::new("iad").unwrap();
        let node = ca
            .tls_identity(&Identity::new(Role::Node, Some(dc.clone())).unwrap())
            .unwrap();
        let router = ca
            .tls_identity(&Identity::new(Role::Router, None).unwrap())
            .unwrap();
        let crypto = QuicServerConfig::try_from(node.rustls_server_config().unwrap()).unwrap();
        let config = quinn::ServerConfig::with_crypto(Arc::new(crypto));
        let server = quinn::Endpoint::server(config, "127.0.0.1:0".parse().unwrap()).unwrap();
        let crypto = QuicClientConfig::try_from(router.rustls_client_config().unwrap()).unwrap();
        let mut client = quinn::Endpoint::client("127.0.0.1:0".parse().unwrap()).unwrap();
        client.set_default_client_config(quinn::ClientConfig::new(Arc::new(crypto)));
        let connecting = client
            .connect(server.local_addr().unwrap(), &node_server_name(&dc))
            .unwrap();
        let accepted = server.accept().await.unwrap();
        let (client_side, server_side) = tokio::join!(connecting, accepted);
        (client_side.unwrap(), server_side.unwrap(), [client, server])
    }

    #[tokio::test]
    async fn kept_replies_stay_near_those_in_flight_and_drain_returns_once_acknowledged() {
        tokio::time::timeout(std::time::Duration::from_secs(20), async {
            let (client, server, _endpoints) = pair().await;
            let unacked = Unacked::new();
            let mut most_kept = 0;
            for i in 0..2_000u32 {
                let (mut request, mut reply) = client.open_bi().await.unwrap();
                request.write_all(&i.to_be_bytes()).await.unwrap();
                request.finish().unwrap();
                let (mut send, mut recv) = server.accept_bi().await.unwrap();
                recv.read_to_end(16).await.unwrap();
                send.write_all(&i.to_be_bytes()).await.unwrap();
                send.finish().unwrap();
                assert!(unacked.keep(send).is_none(), "not draining yet");
                most_kept = most_kept.max(unacked.kept());
                assert_eq!(reply.read_to_end(16).await.unwrap(), i.to_be_bytes());
            }
            // One reply in flight at a time, so the list is pruned back to
            // the few not yet acknowledged each time it reaches its bound.
            assert!(most_kept <= 2 * PRUNE_AT_MIN, "kept up to {most_kept}");
            unacked.drain().await;
            assert_eq!(unacked.kept(), 0);
            // Once draining, a reply is handed back for its task to wait on.
            let (mut request, _reply) = client.open_bi().await.unwrap();
            request.write_all(b"x").await.unwrap();
            request.finish().unwrap();
            let (send, _recv) = server.accept_bi().await.unwrap();
            assert!(unacked.keep(send).is_some());
        })
        .await
        .unwrap();
    }
}
