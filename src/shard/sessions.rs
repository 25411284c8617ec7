//! The sessions a shard accepted, as the delivery path sees them: a registry of their bounded
//! queues (live `ack=none` fan-out by subscription, acknowledged sessions by id, long-poll
//! sessions by consumer) and the renderings queued to them. No sockets here: the transports in
//! `crate::push` drain the queues.
//!
//! Fan-out cost is paid once per shard, not per session: the partition owner sends one
//! [`Delivery`] per interested shard, carrying the stored frames by handle; this shard renders
//! each event once and queues the same bytes to every session. Queues are bounded: a live
//! session that falls `SESSION_QUEUE` frames behind is closed with 1008 instead of growing
//! memory or slowing the others.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::rc::Rc;
use std::time::{Duration, Instant};

use crate::queue;
use frame_codec::{AttrValue, Frame};

use crate::model::delivery::ConsumerKey;

use super::message::Delivery;
use crate::adaptor::cloudevents::{write_structured, write_structured_without};
use crate::delivery::{delivery_id, owned_delivery_id};
use crate::ws::{encode_frame, OpCode};

/// The extensions a delivery carries, the broker's own.
const DELIVERY_EXTENSIONS: [&str; 4] = ["emdeliveryid", "empartition", "emoffset", "emattempt"];

/// Frames a session may have queued before it counts as too slow.
pub const SESSION_QUEUE: usize = 1024;

/// What the writer half of a session sends.
#[derive(Debug, Clone)]
pub enum Outbound {
    /// A ready WebSocket frame, shared by every session that gets it.
    Frame(Rc<Vec<u8>>),
    /// Close with this code and reason (WebSocket; may be empty) after what is queued.
    Close(u16, &'static str),
}

struct SessionTx {
    id: u64,
    tx: queue::Sender<Outbound>,
    /// Bytes queued and not yet taken by its writer (the renderings are shared, but a slow
    /// session pins them).
    queued: Rc<Cell<usize>>,
}

/// Bytes a live (`ack=none`) session may have queued before it counts as too slow and is
/// closed with 1008, whatever the number of frames.
pub const LIVE_QUEUE_BYTES: usize = 8 << 20;

/// How a session's events go out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// One WebSocket text frame per event.
    Ws,
    /// One `text/event-stream` event per event, as an HTTP chunk.
    Sse,
    /// The event's JSON, gathered into a batch by the next poll.
    Poll,
    /// One classic EventMesh TCP package per event, its `seq` naming the delivery as
    /// `<key>/<delivery id>` (`key`: which of its connection's subscriptions it is for).
    Tcp { push: TcpPush, key: u32 },
}

/// The command a classic TCP client's subscription is pushed its events with (as EventMesh
/// chooses it from the subscription's mode and type).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TcpPush {
    /// `CLUSTERING`, `ASYNC`: ASYNC_MESSAGE_TO_CLIENT (a request event: REQUEST_TO_CLIENT).
    Async,
    /// `CLUSTERING`, `SYNC`: REQUEST_TO_CLIENT, answered with RESPONSE_TO_SERVER.
    Sync,
    /// `BROADCASTING`: BROADCAST_MESSAGE_TO_CLIENT.
    Broadcast,
}

/// A session of acknowledged delivery on this shard.
struct AckedTx {
    subscription: String,
    kind: Kind,
    /// An SSE stream opened without a `clientId` on a per-client subscription: its delivery
    /// ids name it (`delivery::owned_delivery_id`), as its acks come over other requests.
    owned: bool,
    tx: queue::Sender<Outbound>,
}

/// What a webhook session is handed: the stored events themselves (it renders its requests),
/// shared by handle with the delivery that carried them.
#[derive(Debug)]
pub enum Pushed {
    Event {
        frames: std::sync::Arc<[Frame]>,
        index: u32,
        attempt: u16,
    },
    /// The subscription was removed: end after what is queued.
    Close,
    /// Its push registrations changed: end if this session's is gone.
    Recheck,
}

/// This shard's attached sessions.
#[derive(Default)]
pub struct Sessions {
    /// The shard's number (owned delivery ids name it).
    shard: u16,
    next_id: Cell<u64>,
    /// `ack=none` sessions, by subscription.
    by_subscription: RefCell<HashMap<String, Vec<SessionTx>>>,
    /// Acknowledged sessions, by id.
    acked: RefCell<HashMap<u64, AckedTx>>,
    /// Webhook sessions (acknowledged too), by id, with their subscription.
    webhooks: RefCell<HashMap<u64, (String, queue::Sender<Pushed>)>>,
    /// Long-poll sessions, by consumer: they outlive the requests that poll them.
    pub polls: RefCell<HashMap<ConsumerKey, Rc<PollSession>>>,
    /// First-attempt renderings of the frames last delivered: the owner sends the same frames
    /// to every acknowledged session of a broadcast one after another, so each event is
    /// rendered once per shard and kind, not once per session.
    rendered: RefCell<Option<RenderCache>>,
    /// The shared tails of the frames last delivered to SSE streams whose ids name them
    /// (`owned_tail`), with the size each counts in its chunk.
    tails: RefCell<OwnedTails>,
}

type OwnedTails = Option<(std::sync::Arc<[Frame]>, Vec<Option<(Rc<Vec<u8>>, usize)>>)>;

struct RenderCache {
    frames: std::sync::Arc<[Frame]>,
    kind: Kind,
    out: Vec<Option<Rc<Vec<u8>>>>,
}

/// A delivered event as structured-mode JSON with the `em*` extensions.
pub fn event_json(frame: &Frame, attempt: u16) -> Vec<u8> {
    let h = frame.header();
    let extra = [
        ("emdeliveryid", AttrValue::Str(delivery_id(h.partition, h.offset, attempt))),
        ("empartition", AttrValue::Int(i64::from(h.partition))),
        ("emoffset", AttrValue::Str(h.offset.to_string())),
        ("emattempt", AttrValue::Int(i64::from(attempt))),
    ];
    let mut json = Vec::with_capacity(frame.as_bytes().len() + 160);
    write_structured(frame, &extra, &mut json);
    json
}

/// The rendering of one stored event for a session of `kind`.
pub fn render(frame: &Frame, attempt: u16, kind: Kind) -> Rc<Vec<u8>> {
    if let Kind::Tcp { push, key } = kind {
        return Rc::new(render_tcp(frame, attempt, push, key));
    }
    let json = event_json(frame, attempt);
    let mut out = Vec::with_capacity(json.len() + 64);
    match kind {
        Kind::Ws => encode_frame(OpCode::Text, true, &json, &mut out),
        Kind::Sse => {
            let h = frame.header();
            event(&delivery_id(h.partition, h.offset, attempt), &json, &mut out)
        }
        Kind::Poll => out = json,
        Kind::Tcp { .. } => unreachable!("rendered above"),
    }
    Rc::new(out)
}

/// An event for SSE streams whose delivery ids name them (`delivery::owned_delivery_id`), in
/// two parts: the stream's own head ([`owned_head`]: the chunk's size, `id:`, and the `data:`
/// line's start, the `em*` extensions first in the object) and the tail every such stream of
/// the shard shares: the event's own attributes, then the ends of the event and the chunk. A
/// broadcast to many streams holds one copy of the event and a hundred bytes a stream, not a
/// copy a stream. Returns the tail and how many of its bytes count in the chunk's size.
fn owned_tail(frame: &Frame) -> (Rc<Vec<u8>>, usize) {
    let mut json = Vec::with_capacity(frame.as_bytes().len() + 16);
    // The stream's own `em*` values are in its head: stored ones (an event republished as it
    // was received, say) must not follow them, where a parser keeps the last.
    write_structured_without(frame, &[], &DELIVERY_EXTENSIONS, &mut json);
    // `{` opens it, and a stored event always has attributes: the head's comma is in place.
    debug_assert!(json.len() > 2 && json[0] == b'{');
    let mut out = Vec::with_capacity(json.len() + 16);
    // Lines as `event` writes them: the first continues the head's `data:` line.
    for (n, line) in json[1..].split(|&b| b == b'\n' || b == b'\r').enumerate() {
        if n > 0 && line.is_empty() {
            continue;
        }
        if n > 0 {
            out.extend_from_slice(b"data: ");
        }
        out.extend_from_slice(line);
        out.push(b'\n');
    }
    out.push(b'\n');
    let counted = out.len();
    out.extend_from_slice(b"\r\n");
    (Rc::new(out), counted)
}

/// The SSE stream `session`'s head of an event whose tail ([`owned_tail`]) has `tail` bytes.
fn owned_head(frame: &Frame, attempt: u16, (shard, session): (u16, u64), tail: usize) -> Vec<u8> {
    use std::io::Write as _;
    let h = frame.header();
    let id = owned_delivery_id(h.partition, h.offset, attempt, u32::from(shard), session);
    // Written in place, then the chunk's size put in front: one buffer a stream and event.
    let mut out = Vec::with_capacity(id.len() * 2 + 112);
    let _ = write!(
        out,
        "id: {id}\ndata: {{\"emdeliveryid\":\"{id}\",\"empartition\":{},\"emoffset\":\"{}\",\"emattempt\":{attempt},",
        h.partition, h.offset
    );
    // The size line is at most 16 hex digits and CRLF: written on the stack, not in a string.
    let mut size = [0u8; 18];
    let n = {
        let mut w = &mut size[..];
        let _ = write!(w, "{:x}\r\n", out.len() + tail);
        18 - w.len()
    };
    out.splice(0..0, size[..n].iter().copied());
    out
}

/// A delivery as a classic TCP package (see [`Kind::Tcp`]); an event past the protocol's 4 MiB
/// frame goes as a FAIL package of the same command and `seq`, without its body (as the Java
/// server pushes an event it cannot convert), so the client may ack it and move on.
fn render_tcp(frame: &Frame, attempt: u16, push: TcpPush, key: u32) -> Vec<u8> {
    use crate::adaptor::eventmesh_tcp::{self as tcp, Command};
    let h = frame.header();
    let id = delivery_id(h.partition, h.offset, attempt);
    let seq = format!("{key}/{id}");
    let cmd = match push {
        TcpPush::Broadcast => Command::BroadcastMessageToClient,
        TcpPush::Sync => Command::RequestToClient,
        TcpPush::Async if h.kind == frame_codec::FrameKind::Request => Command::RequestToClient,
        TcpPush::Async => Command::AsyncMessageToClient,
    };
    let extra = [
        ("emdeliveryid", AttrValue::Str(id)),
        ("empartition", AttrValue::Int(i64::from(h.partition))),
        ("emoffset", AttrValue::Str(h.offset.to_string())),
        ("emattempt", AttrValue::Int(i64::from(attempt))),
    ];
    tcp::push(frame, &extra, cmd, &seq, tcp::SUCCESS)
        .unwrap_or_else(|| tcp::answer(cmd, tcp::FAIL, "the event is larger than a 4 MiB frame", Some(&seq)))
}

impl Sessions {
    pub fn new(shard: crate::model::ids::ShardId) -> Sessions {
        Sessions { shard: shard.0, ..Sessions::default() }
    }

    /// Registers a session; returns its id, its queue, and whether it is the subscription's
    /// first on this shard (then the shard must announce its interest).
    /// The returned counter is the session's queued bytes: its writer takes off what it
    /// dequeues.
    pub fn add(&self, subscription: &str) -> (u64, queue::Receiver<Outbound>, Rc<Cell<usize>>, bool) {
        let id = self.next_id.get();
        self.next_id.set(id + 1);
        let (tx, rx) = queue::channel(SESSION_QUEUE);
        let queued = Rc::new(Cell::new(0));
        let mut map = self.by_subscription.borrow_mut();
        let list = map.entry(subscription.to_owned()).or_default();
        list.push(SessionTx { id, tx, queued: queued.clone() });
        (id, rx, queued, list.len() == 1)
    }

    /// Unregisters a session; returns whether it was the subscription's last on this shard.
    pub fn remove(&self, subscription: &str, id: u64) -> bool {
        let mut map = self.by_subscription.borrow_mut();
        let Some(list) = map.get_mut(subscription) else { return false };
        list.retain(|s| s.id != id);
        if list.is_empty() {
            map.remove(subscription);
            return true;
        }
        false
    }

    /// Registers a session of acknowledged delivery; returns its id and its queue, which can
    /// hold every event the shards may have in flight to it. `owned`: its delivery ids name it
    /// (an SSE stream of an anonymous client, see [`AckedTx`]).
    pub fn add_acked(
        &self,
        subscription: &str,
        kind: Kind,
        owned: bool,
        shards: usize,
    ) -> (u64, queue::Receiver<Outbound>) {
        let id = self.next_id.get();
        self.next_id.set(id + 1);
        // An owned stream's events are two items each (its head and the shared tail).
        let per_event = if owned { 2 } else { 1 };
        let (tx, rx) = queue::channel(crate::delivery::MAX_WINDOW as usize * shards * per_event);
        let subscription = subscription.to_owned();
        self.acked.borrow_mut().insert(id, AckedTx { subscription, kind, owned, tx });
        (id, rx)
    }

    pub fn remove_acked(&self, id: u64) {
        self.acked.borrow_mut().remove(&id);
        self.webhooks.borrow_mut().remove(&id);
    }

    /// Registers a webhook session (acknowledged delivery); returns its id and its queue, which
    /// can hold every event the shards may have in flight to it.
    pub fn add_webhook(&self, subscription: &str, shards: usize) -> (u64, queue::Receiver<Pushed>) {
        let id = self.next_id.get();
        self.next_id.set(id + 1);
        let (tx, rx) = queue::channel(crate::delivery::MAX_WINDOW as usize * shards);
        self.webhooks.borrow_mut().insert(id, (subscription.to_owned(), tx));
        (id, rx)
    }

    /// Asks one acknowledged session to close after what is queued.
    pub fn close_acked(&self, id: u64, code: u16, reason: &'static str) {
        if let Some(s) = self.acked.borrow_mut().get_mut(&id) {
            let _ = s.tx.send_past_bound(Outbound::Close(code, reason));
        }
    }

    /// Queues delivered events: to one acknowledged session, or rendered once for every
    /// `ack=none` session of the subscription. Returns how many (event, session) deliveries
    /// were queued.
    pub fn deliver(&self, d: &Delivery) -> u64 {
        // The indexes to deliver, without allocating: all frames, or the picked ones.
        let picked = || {
            let all = d.pick.is_none().then_some(0..d.frames.len()).into_iter().flatten();
            all.chain(d.pick.iter().flatten().map(|&i| i as usize))
        };
        if let Some(id) = d.session {
            let mut acked = self.acked.borrow_mut();
            let Some(s) = acked.get_mut(&id) else {
                drop(acked);
                return self.push_to_webhook(id, d, picked());
            };
            if s.owned {
                // Its own head, and the tail every such stream shares.
                let mut tails = self.tails.borrow_mut();
                if !matches!(&*tails, Some((f, _)) if std::sync::Arc::ptr_eq(f, &d.frames)) {
                    *tails = Some((d.frames.clone(), vec![None; d.frames.len()]));
                }
                let (_, cached) = tails.as_mut().expect("just filled");
                for (k, i) in picked().enumerate() {
                    let attempt = d.attempts.get(k).copied().unwrap_or(1);
                    let (tail, counted) = cached[i].get_or_insert_with(|| owned_tail(&d.frames[i])).clone();
                    let head = Rc::new(owned_head(&d.frames[i], attempt, (self.shard, id), counted));
                    // The tail goes past the bound: a head without it would tear the stream's chunk.
                    let sent =
                        s.tx.try_send(Outbound::Frame(head)).and_then(|()| s.tx.send_past_bound(Outbound::Frame(tail)));
                    if sent.is_err() {
                        s.tx.close_channel();
                        return k as u64;
                    }
                }
                return picked().count() as u64;
            }
            let mut queued = 0;
            let mut cache = self.rendered.borrow_mut();
            let fresh = !matches!(&*cache, Some(c) if std::sync::Arc::ptr_eq(&c.frames, &d.frames) && c.kind == s.kind);
            if fresh {
                let out = vec![None; d.frames.len()];
                *cache = Some(RenderCache { frames: d.frames.clone(), kind: s.kind, out });
            }
            let cache = cache.as_mut().expect("just filled");
            for (k, i) in picked().enumerate() {
                let attempt = d.attempts.get(k).copied().unwrap_or(1);
                let bytes = match attempt {
                    1 => cache.out[i].get_or_insert_with(|| render(&d.frames[i], 1, s.kind)).clone(),
                    _ => render(&d.frames[i], attempt, s.kind),
                };
                if s.tx.try_send(Outbound::Frame(bytes)).is_err() {
                    // Gone (the owners learn it from its detach) or past every window.
                    s.tx.close_channel();
                    return queued;
                }
                queued += 1;
            }
            return queued;
        }
        let mut map = self.by_subscription.borrow_mut();
        let Some(list) = map.get_mut(&d.subscription) else { return 0 };
        let rendered: Vec<Rc<Vec<u8>>> = picked().map(|i| render(&d.frames[i], 1, Kind::Ws)).collect();
        let mut queued = 0;
        for s in list.iter_mut() {
            for bytes in &rendered {
                let held = s.queued.get() + bytes.len();
                if held > LIVE_QUEUE_BYTES || s.tx.try_send(Outbound::Frame(bytes.clone())).is_err() {
                    // Too slow (or gone): close it rather than queue without bound.
                    s.tx.close_channel();
                    break;
                }
                s.queued.set(held);
                queued += 1;
            }
        }
        queued
    }

    /// Hands delivered events to a webhook session by handle (nothing rendered here).
    fn push_to_webhook(&self, id: u64, d: &Delivery, picked: impl Iterator<Item = usize>) -> u64 {
        let mut hooks = self.webhooks.borrow_mut();
        let Some((_, tx)) = hooks.get_mut(&id) else { return 0 };
        let mut queued = 0;
        for (k, i) in picked.enumerate() {
            let attempt = d.attempts.get(k).copied().unwrap_or(1);
            let event = Pushed::Event { frames: d.frames.clone(), index: i as u32, attempt };
            if tx.try_send(event).is_err() {
                tx.close_channel();
                return queued;
            }
            queued += 1;
        }
        queued
    }

    /// Asks every webhook session of a subscription whether it is still wanted.
    pub fn recheck_webhooks(&self, subscription: &str) {
        for (_, tx) in self.webhooks.borrow_mut().values_mut().filter(|(s, _)| s == subscription) {
            let _ = tx.send_past_bound(Pushed::Recheck);
        }
    }

    /// Closes every session of a subscription (it was removed, or its home moved).
    pub fn close_all(&self, subscription: &str, code: u16, reason: &'static str) {
        if let Some(list) = self.by_subscription.borrow_mut().get_mut(subscription) {
            for s in list.iter_mut() {
                let _ = s.tx.send_past_bound(Outbound::Close(code, reason));
            }
        }
        for s in self.acked.borrow_mut().values_mut().filter(|s| s.subscription == subscription) {
            let _ = s.tx.send_past_bound(Outbound::Close(code, reason));
        }
        self.polls.borrow_mut().retain(|k, _| k.subscription != subscription);
        for (_, tx) in self.webhooks.borrow_mut().values_mut().filter(|(s, _)| s == subscription) {
            let _ = tx.send_past_bound(Pushed::Close);
        }
    }
}

/// A consumer's long-poll session: its queue outlives the requests that poll it.
pub struct PollSession {
    pub id: u64,
    /// Taken by the poll in progress (one at a time per consumer and shard).
    pub rx: RefCell<Option<queue::Receiver<Outbound>>>,
    pub last: Cell<Instant>,
    pub closed: Cell<bool>,
}

impl PollSession {
    /// Up to `max` events' JSON, waiting up to `wait` for the first.
    pub async fn poll(&self, max: usize, wait: Duration) -> Vec<Rc<Vec<u8>>> {
        self.last.set(Instant::now());
        let taken = self.rx.borrow_mut().take();
        let Some(mut rx) = taken else {
            // Another poll of the same consumer is waiting here: this one gets nothing.
            monoio::time::sleep(wait).await;
            return Vec::new();
        };
        let mut out = Vec::new();
        self.drain(&mut rx, &mut out, max);
        if out.is_empty() && !self.closed.get() {
            match monoio::time::timeout(wait, rx.recv()).await {
                Ok(Some(Outbound::Frame(b))) => {
                    out.push(b);
                    self.drain(&mut rx, &mut out, max);
                }
                Ok(Some(Outbound::Close(..)) | None) => self.closed.set(true),
                Err(_) => {}
            }
        }
        self.last.set(Instant::now());
        *self.rx.borrow_mut() = Some(rx);
        out
    }

    fn drain(&self, rx: &mut queue::Receiver<Outbound>, out: &mut Vec<Rc<Vec<u8>>>, max: usize) {
        while out.len() < max {
            match rx.try_recv() {
                Ok(Outbound::Frame(b)) => out.push(b),
                Ok(Outbound::Close(..)) => return self.closed.set(true),
                Err(e) if e.is_closed() => return self.closed.set(true),
                Err(_) => return,
            }
        }
    }
}

/// Appends one event, as an HTTP chunk. JSON may hold line breaks between tokens (the event's
/// `data` is kept as sent); each line becomes its own `data:` line, which clients join again.
pub fn event(id: &str, json: &[u8], out: &mut Vec<u8>) {
    let mut payload = Vec::with_capacity(json.len() + id.len() + 16);
    payload.extend_from_slice(b"id: ");
    payload.extend_from_slice(id.as_bytes());
    payload.push(b'\n');
    for line in json.split(|&b| b == b'\n' || b == b'\r').filter(|l| !l.is_empty()) {
        payload.extend_from_slice(b"data: ");
        payload.extend_from_slice(line);
        payload.push(b'\n');
    }
    payload.push(b'\n');
    chunk(&payload, out);
}

pub fn chunk(payload: &[u8], out: &mut Vec<u8>) {
    out.extend_from_slice(format!("{:x}\r\n", payload.len()).as_bytes());
    out.extend_from_slice(payload);
    out.extend_from_slice(b"\r\n");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_are_chunks_with_one_data_line_per_json_line() {
        let mut out = Vec::new();
        event("0:7:1", b"{\"data\":\r\n {\"a\": 1}\n}", &mut out);
        let text = String::from_utf8(out).unwrap();
        let payload = "id: 0:7:1\ndata: {\"data\":\ndata:  {\"a\": 1}\ndata: }\n\n";
        assert_eq!(text, format!("{:x}\r\n{payload}\r\n", payload.len()));
    }

    /// An SSE stream whose ids name it gets its own head and the shared tail; together they are
    /// one chunk, an event whose `data:` lines join into the same CloudEvent as any stream's,
    /// its own delivery id in `id:` and in `emdeliveryid` (a multi-line JSON `data` included).
    /// Regression (review): stored `em*` attributes (an event republished as received) came
    /// after the head's in the object, and a parser keeps the last of a name.
    #[test]
    fn an_owned_streams_head_and_the_shared_tail_are_one_whole_event() {
        let json = b"{\"specversion\":\"1.0\",\"id\":\"e1\",\"source\":\"/s\",\"type\":\"t\",\"emdeliveryid\":\"9:9:9~0.0\",\"emattempt\":99,\"data\":{\n  \"a\": [1,\r\n 2]\n}}";
        let frame = crate::adaptor::cloudevents::parse_structured("", json).expect("an event");
        let (tail, counted) = owned_tail(&frame);
        let mut bytes = owned_head(&frame, 3, (1, 17), counted);
        bytes.extend_from_slice(&tail);
        let text = String::from_utf8(bytes).unwrap();
        let (size, rest) = text.split_once("\r\n").unwrap();
        let size = usize::from_str_radix(size, 16).unwrap();
        assert_eq!(&rest[size..], "\r\n", "one chunk, its size right");
        let payload = &rest[..size];
        let mut lines = payload.strip_suffix("\n\n").expect("the event's end").split('\n');
        let id = lines.next().unwrap().strip_prefix("id: ").unwrap();
        assert_eq!(id, "0:0:3~1.17");
        let data: Vec<&str> = lines.map(|l| l.strip_prefix("data: ").expect("a data line")).collect();
        assert!(data.len() > 1, "the multi-line data keeps its lines: {data:?}");
        let got: serde_json::Value = serde_json::from_str(&data.join("\n")).unwrap();
        let mut want: serde_json::Value = serde_json::from_slice(&event_json(&frame, 3)).unwrap();
        want["emdeliveryid"] = id.into();
        assert_eq!(got, want);
        let joined = data.join("\n");
        for name in DELIVERY_EXTENSIONS {
            assert_eq!(joined.matches(&format!("\"{name}\"")).count(), 1, "{name} once: {joined}");
        }
    }
}
