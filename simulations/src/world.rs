//! What every actor shares and none owns: true time (`now`), the pending
//! events in (time, sequence) order, the network that carries messages
//! between regions, RPC ids and the run's one [`Rng`]. An actor's handler
//! takes a `&mut World` beside its own state, so it can schedule, send and
//! draw without reaching the other actors.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use homing_core::{Request, wire};

use crate::event::{Body, Event, Message, NodeId};
use crate::network::Network;
use crate::rng::Rng;
use crate::trace::NO_KEY;

/// An event due at a true time.
pub(crate) struct Scheduled {
    pub(crate) at_us: u64,
    pub(crate) event: Event,
}

/// The pending events in (time, sequence) order: a heap of small keys
/// (time, sequence, slot) over a slab of the events, so that sifting the
/// heap moves 24 bytes an entry, not a whole event. The order is the
/// keys' alone (sequence numbers are unique): the slab changes no trace.
#[derive(Default)]
struct Queue {
    heap: BinaryHeap<Reverse<(u64, u64, u32)>>,
    slab: Vec<Option<Event>>,
    free: Vec<u32>,
}

impl Queue {
    fn push(&mut self, at_us: u64, seq: u64, event: Event) {
        let slot = match self.free.pop() {
            Some(slot) => {
                self.slab[slot as usize] = Some(event);
                slot
            }
            None => {
                self.slab.push(Some(event));
                u32::try_from(self.slab.len() - 1).expect("fewer than 2^32 pending events")
            }
        };
        self.heap.push(Reverse((at_us, seq, slot)));
    }

    /// The earliest event.
    fn pop(&mut self) -> Option<Scheduled> {
        let Reverse((at_us, _, slot)) = self.heap.pop()?;
        // Invariant: a slot in the heap holds its event until popped.
        let event = self.slab[slot as usize].take().expect("a queued slot");
        self.free.push(slot);
        Some(Scheduled { at_us, event })
    }
}

/// Where each host and router sits (the index of its region's DC): the
/// network's map, fixed when the world is built.
#[derive(Debug, Clone, Default)]
pub struct Regions {
    /// Each host's DC.
    pub hosts: Vec<u16>,
    /// Each router's region.
    pub routers: Vec<u16>,
}

/// The shared part of the simulated world.
pub struct World {
    pub(crate) rng: Rng,
    pub(crate) now: u64,
    /// True time 0 as an `Instant`, for homing-core parts that count in
    /// `Instant`s (reachability): only differences are used, so a run
    /// replays whatever the wall clock.
    epoch: std::time::Instant,
    queue: Queue,
    seq: u64,
    next_rpc: u64,
    pub(crate) network: Network,
    regions: Regions,
    pub(crate) request_timeout_us: u64,
    /// How long a QUIC connection stays up without traffic.
    idle_timeout_us: u64,
    /// Whether every message goes through homing-core's wire encoding.
    encode_messages: bool,
    /// What the event being processed concerns, for its trace record.
    pub(crate) current_key: u32,
}

impl World {
    /// A world at true time 0 with nothing pending.
    pub fn new(
        rng: Rng,
        network: Network,
        regions: Regions,
        request_timeout_us: u64,
        idle_timeout_us: u64,
        encode_messages: bool,
    ) -> World {
        World {
            rng,
            now: 0,
            epoch: std::time::Instant::now(),
            queue: Queue::default(),
            seq: 0,
            next_rpc: 1,
            network,
            regions,
            request_timeout_us,
            idle_timeout_us,
            encode_messages,
            current_key: NO_KEY,
        }
    }

    /// The earliest pending event.
    pub(crate) fn pop(&mut self) -> Option<Scheduled> {
        self.queue.pop()
    }

    /// True time now as the `Instant` homing-core's reachability counts in.
    pub(crate) fn instant(&self) -> std::time::Instant {
        self.epoch + std::time::Duration::from_micros(self.now)
    }

    /// The `Instant` of true time `at_us`.
    pub(crate) fn instant_at(&self, at_us: u64) -> std::time::Instant {
        self.epoch + std::time::Duration::from_micros(at_us)
    }

    /// The true time (µs) of an `Instant` from [`World::instant`].
    pub(crate) fn us_at(&self, at: std::time::Instant) -> u64 {
        u64::try_from(at.saturating_duration_since(self.epoch).as_micros()).unwrap_or(u64::MAX)
    }

    /// Schedules `event` at true time `at_us` (never in the past).
    pub(crate) fn schedule(&mut self, at_us: u64, event: Event) {
        self.seq += 1;
        self.queue.push(at_us.max(self.now), self.seq, event);
    }

    /// A fresh RPC id.
    pub(crate) fn rpc(&mut self) -> u64 {
        self.next_rpc += 1;
        self.next_rpc
    }

    /// The region a node sits in.
    pub(crate) fn region(&self, node: NodeId) -> usize {
        match node {
            NodeId::Dc(d) => d.d(),
            NodeId::Host(h) => usize::from(self.regions.hosts[h as usize]),
            NodeId::Router(r) => usize::from(self.regions.routers[r as usize]),
        }
    }

    /// Sends a message over the simulated network (it may be lost).
    pub(crate) fn send(&mut self, message: Message) {
        let (from, to) = (self.region(message.from), self.region(message.to));
        let Some(delay) = self.network.delay_us(from, to, self.now, &mut self.rng) else {
            return;
        };
        self.deliver_after(delay, message);
    }

    /// Sends on a QUIC stream (see [`Network::stream_delay_us`]); `false`
    /// if the connection died under it.
    pub(crate) fn stream_send(&mut self, message: Message) -> bool {
        let (from, to) = (self.region(message.from), self.region(message.to));
        let delay =
            self.network
                .stream_delay_us(from, to, self.now, self.idle_timeout_us, &mut self.rng);
        let Some(delay) = delay else {
            return false;
        };
        self.deliver_after(delay, message);
        true
    }

    fn deliver_after(&mut self, delay_us: u64, message: Message) {
        let message = if self.encode_messages {
            round_trip(message)
        } else {
            message
        };
        self.schedule(self.now + delay_us, Event::Deliver(Box::new(message)));
    }

    /// Sends a request and arms its timeout; returns the RPC id.
    pub(crate) fn request(&mut self, from: NodeId, to: NodeId, key: u32, request: Request) -> u64 {
        self.request_within(from, to, key, request, self.request_timeout_us)
    }

    /// [`World::request`] given up on after `timeout_us` instead of the request timeout.
    pub(crate) fn request_within(
        &mut self,
        from: NodeId,
        to: NodeId,
        key: u32,
        request: Request,
        timeout_us: u64,
    ) -> u64 {
        let (rpc, message) = self.request_message(from, to, key, request, timeout_us);
        self.send(message);
        rpc
    }

    /// A new RPC's request message, its timeout armed.
    pub(crate) fn request_message(
        &mut self,
        from: NodeId,
        to: NodeId,
        key: u32,
        request: Request,
        timeout_us: u64,
    ) -> (u64, Message) {
        let rpc = self.rpc();
        self.schedule(self.now + timeout_us, Event::Timeout { node: from, rpc });
        let message = Message {
            from,
            to,
            rpc,
            key,
            body: Body::Request(request),
        };
        (rpc, message)
    }
}

fn round_trip(message: Message) -> Message {
    // A frame that does not survive encode/decode is a homing-core bug: crash loudly.
    let body = match &message.body {
        Body::Request(r) => {
            let frame = wire::encode(r).expect("request encodes");
            Body::Request(wire::decode(&frame).expect("request decodes"))
        }
        Body::Reply(r) => {
            let frame = wire::encode(r).expect("reply encodes");
            Body::Reply(wire::decode(&frame).expect("reply decodes"))
        }
    };
    Message { body, ..message }
}
