//! A scripted DC for client tests: a real homing-net `Server` on loopback
//! whose `Handler` answers from canned replies, counts requests by kind, can
//! be slowed down or silenced, and grants leases with a core `LeasePolicy`.

#![allow(dead_code)] // each test file uses its own part of the harness

use homing_core::{AcquireReply, Grant};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use homing_core::{
    ActorId, DcId, ErrorKind, ErrorReply, FencingToken, Identity, Key, KeyName, LeasePolicy, Link,
    ReleaseReply, RenewReply, Reply, Request, ReservationId, Role, Segment, StoreTime, TailState,
    TailView,
};
use homing_net::{Client, ClientLimits, DevCa, Handler, Peer, Server, ServerLimits};

/// What a scripted DC answers and what it was asked.
#[derive(Default)]
pub struct Script {
    /// `Resolve { key }` → this reply (unknown keys: no global entry).
    pub resolve: Mutex<HashMap<Key, Reply>>,
    /// `ResolveReservation { id }` → this segment (unknown: an error).
    pub reservations: Mutex<HashMap<ReservationId, Segment>>,
    /// Requests received, by kind.
    pub counts: Mutex<HashMap<&'static str, u32>>,
    /// Every request received, in order.
    pub log: Mutex<Vec<Request>>,
    /// Delay before answering, in milliseconds.
    pub delay_ms: AtomicU64,
    /// Never answer (hold the stream until the client gives up).
    pub silent: AtomicBool,
    /// Answer renewals with `Draining`.
    pub draining: AtomicBool,
    /// Lease grants: the policy and the next reservation number.
    pub policy: Mutex<Option<LeasePolicy>>,
    /// `Watch` → these replies, one per request, in order (then empty batches).
    pub watch: Mutex<std::collections::VecDeque<Reply>>,
}

impl Script {
    pub fn count(&self, kind: &str) -> u32 {
        self.counts.lock().unwrap().get(kind).copied().unwrap_or(0)
    }

    pub fn entry(&self, key: &Key, entry: &ReservationId, segment: Option<Segment>) {
        let reply = Reply::Resolved {
            entry: Some(entry.clone()),
            segment,
        };
        self.resolve.lock().unwrap().insert(key.clone(), reply);
    }

    pub fn segment(&self, id: &ReservationId, segment: Segment) {
        self.reservations
            .lock()
            .unwrap()
            .insert(id.clone(), segment);
    }
}

struct Scripted {
    dc: DcId,
    script: Arc<Script>,
}

#[async_trait]
impl Handler for Scripted {
    async fn handle(&self, _caller: &Identity, request: Request) -> Reply {
        *self
            .script
            .counts
            .lock()
            .unwrap()
            .entry(request.kind())
            .or_default() += 1;
        self.script.log.lock().unwrap().push(request.clone());
        let delay = self.script.delay_ms.load(Ordering::SeqCst);
        if delay > 0 {
            tokio::time::sleep(Duration::from_millis(delay)).await;
        }
        if self.script.silent.load(Ordering::SeqCst) {
            std::future::pending::<()>().await;
        }
        self.answer(request)
    }
}

impl Scripted {
    fn answer(&self, request: Request) -> Reply {
        let script = &self.script;
        match request {
            Request::Resolve { key } => script
                .resolve
                .lock()
                .unwrap()
                .get(&key)
                .cloned()
                .unwrap_or(Reply::Resolved {
                    entry: None,
                    segment: None,
                }),
            Request::ResolveReservation { id } => {
                match script.reservations.lock().unwrap().get(&id) {
                    Some(segment) => Reply::Reservation(segment.clone()),
                    None => Reply::Error(ErrorReply::new(
                        ErrorKind::UnknownReservation,
                        id.to_string(),
                    )),
                }
            }
            Request::Acquire {
                config, host_time, ..
            } => {
                let policy = script.policy.lock().unwrap().unwrap_or_default();
                let grant = policy.grant(host_time, StoreTime::from_ms(0));
                Reply::Acquire(AcquireReply::Acquired(Grant {
                    key: config.key(0),
                    reservation: ReservationId::new(self.dc.clone(), 1),
                    token: FencingToken::FIRST,
                    deadlines: grant.deadlines,
                    previous: None,
                }))
            }
            Request::Renew { host_time, .. } => {
                if script.draining.load(Ordering::SeqCst) {
                    return Reply::Renew(RenewReply::Draining);
                }
                let policy = script.policy.lock().unwrap().unwrap_or_default();
                Reply::Renew(RenewReply::Renewed(
                    policy.grant(host_time, StoreTime::from_ms(0)).deadlines,
                ))
            }
            Request::Release { .. } => Reply::Release(ReleaseReply::Released),
            Request::Watch { after, .. } => {
                script
                    .watch
                    .lock()
                    .unwrap()
                    .pop_front()
                    .unwrap_or(Reply::Events {
                        events: Vec::new(),
                        next: after,
                    })
            }
            other => Reply::Error(ErrorReply::new(ErrorKind::BadRequest, other.kind())),
        }
    }
}

/// A scripted DC listening on loopback.
pub struct TestDc {
    pub dc: DcId,
    pub script: Arc<Script>,
    pub server: Server,
}

impl TestDc {
    pub async fn start(ca: &DevCa, dc: &str) -> TestDc {
        let dc = DcId::new(dc).unwrap();
        let tls = ca
            .tls_identity(&Identity::new(Role::Node, Some(dc.clone())).unwrap())
            .unwrap();
        let script = Arc::new(Script::default());
        let handler = Arc::new(Scripted {
            dc: dc.clone(),
            script: script.clone(),
        });
        let server = Server::bind(
            "127.0.0.1:0".parse().unwrap(),
            &tls,
            dc.clone(),
            ServerLimits::default(),
            handler,
        )
        .await
        .unwrap();
        TestDc { dc, script, server }
    }

    pub fn peer(&self) -> Peer {
        Peer {
            addr: self.server.local_addr(),
            dc: self.dc.clone(),
        }
    }

    pub fn entry(&self) -> (DcId, std::net::SocketAddr) {
        (self.dc.clone(), self.server.local_addr())
    }
}

pub fn client(ca: &DevCa, role: Role, dc: Option<&str>) -> Client {
    let identity = Identity::new(role, dc.map(|d| DcId::new(d).unwrap())).unwrap();
    Client::new(
        &ca.tls_identity(&identity).unwrap(),
        ClientLimits::default(),
    )
    .unwrap()
}

pub fn key(name: &str) -> Key {
    Key::new(KeyName::new(name).unwrap())
}

pub fn id(text: &str) -> ReservationId {
    text.parse().unwrap()
}

/// A link out of `from`, whose token is its unique number (so tokens rise
/// along chains numbered upwards).
pub fn link(from: &str, to: &str) -> Link {
    let from = id(from);
    Link {
        token: FencingToken::new(from.unique()),
        from,
        to: id(to),
    }
}

pub fn active(tail: &str, actor: &str, token: u64) -> TailView {
    TailView {
        id: id(tail),
        token: FencingToken::new(token),
        tag: None,
        state: TailState::Active {
            actor: ActorId::new(actor).unwrap(),
        },
    }
}

pub fn segment(key_name: &str, links: Vec<Link>, tail: Option<TailView>) -> Segment {
    Segment {
        key: key(key_name),
        links,
        tail,
        shortcut: None,
    }
}
