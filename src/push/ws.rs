//! One WebSocket session of a subscription: a reader half (client frames: ping, close, the
//! `ack` / `nack` / `credit` text messages of acknowledged delivery, and on any session `reply`,
//! `chunk` and `publish` messages) and a writer half draining the session's bounded queue,
//! batching whatever is queued into one write.

use std::cell::Cell;
use std::rc::Rc;
use std::time::{Duration, Instant};

use crate::queue;
use futures::future::{select, Either};
use futures::FutureExt as _;
use monoio::io::AsyncWriteRent;

use super::{attach_acked, detach_acked, Kind, Outbound, Publisher};
use crate::delivery::{group_ids, MAX_WINDOW};
use crate::model::delivery::{AckKind, ConsumerKey, SessionRef};
use crate::model::ReplyOutcome;
use crate::server::conn::{read_more_sized, ConnLimits, ReadOutcome};
use crate::server::stream::ReadHalf;
use crate::server::SessionSpec;
use crate::shard::calls::{session_key, ChunkBody};
use crate::shard::core::Shard;
use crate::shard::message::{InterestChange, SessionChange, SessionEvent};
use crate::shard::requests::Replier;
use crate::sys::SharedFrames;
use crate::ws::{encode_frame, CloseCode, Message, MessageReader, OpCode};

/// A client's control message on a session of acknowledged delivery.
#[derive(serde::Deserialize)]
#[serde(tag = "type", rename_all = "lowercase", deny_unknown_fields)]
enum Control {
    Ack { ids: Vec<String> },
    Nack { ids: Vec<String> },
    Credit { n: u32 },
}

/// A typed message on any session: a responder's reply to a request
/// (`{"type":"reply","event":{...}}`), an agent's chunk, or a publish (members besides these
/// two are read by their handlers).
#[derive(serde::Deserialize)]
struct ReplyFrame<'a> {
    #[serde(rename = "type", borrow)]
    kind: std::borrow::Cow<'a, str>,
    #[serde(borrow, default)]
    event: Option<&'a serde_json::value::RawValue>,
}

/// Where a session's `reply`, `chunk` and `publish` frames go, and who sends them.
struct Replies {
    shard: Rc<Shard>,
    replier: Replier,
    publisher: Publisher,
}

impl Replies {
    /// Hands one reply to its requester. Only a failure is answered, with a text frame
    /// `{"type":"error","id":<emcorrelationid>,"status":S,"detail":D}` (404: nobody waits for
    /// it; 403: the ACL; 400: not a valid CloudEvent); the session goes on either way.
    async fn reply(&self, event: Option<&str>, ctl: &mut queue::Sender<Outbound>) {
        let parsed = match event {
            Some(e) => crate::adaptor::cloudevents::parse_structured("", e.as_bytes()),
            None => Err(crate::adaptor::cloudevents::CeError::Invalid(
                "a reply frame carries the reply as \"event\"".into(),
            )),
        };
        let (id, status, detail) = match parsed {
            Err(e) => (None, 400, e.to_string()),
            Ok(frame) => {
                let id = frame.body().attr_str("emcorrelationid").map(str::to_owned);
                let who = self.replier.principal.as_deref().unwrap_or("anonymous");
                match self.shard.send_reply(frame, self.replier.clone()).await {
                    Ok(ReplyOutcome::Delivered) => return,
                    Ok(outcome) => {
                        if let ReplyOutcome::Denied { topic, rule } = &outcome {
                            let p = crate::governance::identity::Principal {
                                name: who.to_owned(),
                                tenant: self.replier.tenant.clone(),
                                expires_us: None,
                            };
                            let detail = rule.as_ref().map(|r| format!("rule {r}"));
                            let g = &self.shard.shared.governance;
                            g.audit(Some(&p), "REPLY", &format!("topic:{topic}"), "denied", detail, None);
                        }
                        let (status, detail) = outcome.status(who);
                        (id, status, detail)
                    }
                    Err(e) => (id, 503, e.to_string()),
                }
            }
        };
        send_error(ctl, id, status, detail).await;
    }
}

impl Replies {
    /// Takes an agent's chunk frame `{"type":"chunk","sessionId":S,...}`. Only a failure is
    /// answered, as for replies (`id` the session id; 404 no such session, 403 another
    /// agent's, 409 no turn in progress, 429 streams too far behind, 400 malformed).
    async fn chunk(&self, text: &str, ctl: &mut queue::Sender<Outbound>) {
        let taken = || -> Result<(), (Option<String>, u16, String)> {
            let Some((agent, gen)) = &self.replier.agent else {
                return Err((None, 400, "chunk frames are sent on an agent's WebSocket (GET /agent/ws)".into()));
            };
            let body = ChunkBody::parse(text.as_bytes()).map_err(|m| (None, 400, m))?;
            let Some(sid) = body.session_id.as_deref() else {
                return Err((None, 400, "a chunk frame names its sessionId".into()));
            };
            let mut t = String::new();
            let c = body.chunk(&mut t).map_err(|m| (Some(sid.to_owned()), 400, m))?;
            let key = session_key(self.replier.tenant.as_deref(), sid);
            let now = crate::model::clock::now_ms();
            match self.shard.shared.calls.chunk(&key, (agent, Some(*gen)), &c, now) {
                Ok(_) => Ok(()),
                Err(r) => {
                    let (status, detail) = r.status();
                    Err((Some(sid.to_owned()), status, detail))
                }
            }
        };
        if let Err((id, status, detail)) = taken() {
            send_error(ctl, id, status, detail).await;
        }
    }
}

/// Answers a failed reply or chunk frame: `{"type":"error","id","status","detail"}`. The
/// reader waits for room: a peer flooding bad frames is held at its socket.
async fn send_error(ctl: &mut queue::Sender<Outbound>, id: Option<String>, status: u16, detail: String) {
    let note = serde_json::json!({"type": "error", "id": id, "status": status, "detail": detail}).to_string();
    let mut out = Vec::with_capacity(note.len() + 4);
    encode_frame(OpCode::Text, true, note.as_bytes(), &mut out);
    let _ = ctl.send(Outbound::Frame(Rc::new(out))).await;
}

/// Where an acknowledged session's control messages go.
pub(super) struct AckedSession {
    shard: Rc<Shard>,
    consumer: ConsumerKey,
    topic: String,
    at: SessionRef,
}

impl AckedSession {
    /// Acts on one control message; `Err` is the close code for one that cannot be applied.
    fn control(&self, control: Control) -> Result<(), CloseCode> {
        let (ids, kind) = match control {
            Control::Ack { ids } => (ids, AckKind::Ack),
            Control::Nack { ids } => (ids, AckKind::Nack),
            Control::Credit { n } => {
                let change = SessionChange::Window(n.min(MAX_WINDOW));
                let e = SessionEvent {
                    consumer: self.consumer.clone(),
                    topic: self.topic.clone(),
                    session: self.at,
                    change,
                };
                self.shard.announce_session(e);
                return Ok(());
            }
        };
        let by = group_ids(ids.iter().map(String::as_str)).map_err(|_| CloseCode::POLICY)?;
        self.shard.route_acks(&self.consumer, &self.topic, by, kind, false).map_err(|_| CloseCode::POLICY)?;
        Ok(())
    }
}

/// Clients of a session send only small control messages; idle sessions must stay small.
const SESSION_READ_CHUNK: usize = 512;

/// Bytes gathered into one write when many frames are queued.
const WRITE_BATCH: usize = 256 * 1024;
/// A write that makes no progress for this long means the client stopped reading: the session
/// ends (its queue would have closed it with 1008 anyway, but a blocked write never sees that).
const WRITE_STALL: Duration = Duration::from_secs(10);

fn close_bytes(code: u16, reason: &str) -> Vec<u8> {
    let mut payload = code.to_be_bytes().to_vec();
    payload.extend_from_slice(reason.as_bytes());
    let mut out = Vec::with_capacity(payload.len() + 2);
    encode_frame(OpCode::Close, true, &payload, &mut out);
    out
}

async fn read_half<R: monoio::io::AsyncReadRent>(
    rd: R,
    buf: Vec<u8>,
    max_message: usize,
    ctl: queue::Sender<Outbound>,
    (acked, replies): (Option<AckedSession>, Replies),
    heard: Rc<Cell<Instant>>,
) {
    // Metered like an HTTP connection (see `server::conn::serve`): after a message that took
    // over `task::HEAVY` of the core (a 10,000-id ack), the session waits its turn in the heavy
    // lane before it reads on.
    let meter = crate::task::Meter::default();
    crate::task::metered(&meter, read_messages(rd, buf, max_message, ctl, (acked, replies), heard, &meter)).await
}

async fn read_messages<R: monoio::io::AsyncReadRent>(
    mut rd: R,
    mut buf: Vec<u8>,
    max_message: usize,
    ctl: queue::Sender<Outbound>,
    (acked, mut replies): (Option<AckedSession>, Replies),
    heard: Rc<Cell<Instant>>,
    meter: &crate::task::Meter,
) {
    let mut ctl = ctl;
    let mut reader = MessageReader::new(max_message);
    let mut turns: u32 = 0;
    loop {
        // A client streaming frames must not hold the core (see `task::yield_now`).
        turns += 1;
        if turns % crate::task::TURN == 0 {
            crate::task::yield_now().await;
        }
        loop {
            let (msg, used) = match reader.read(&mut buf) {
                Ok(r) => r,
                Err(e) => {
                    let _ = ctl.send_past_bound(Outbound::Close(e.code.0, ""));
                    return;
                }
            };
            buf.drain(..used);
            match msg {
                None => break,
                Some(Message::Ping(p)) => {
                    let mut out = Vec::with_capacity(p.len() + 2);
                    encode_frame(OpCode::Pong, true, &p, &mut out);
                    let _ = ctl.try_send(Outbound::Frame(Rc::new(out)));
                }
                Some(Message::Close(code, _)) => {
                    let _ = ctl.send_past_bound(Outbound::Close(code.unwrap_or(CloseCode::NORMAL.0), ""));
                    return;
                }
                Some(Message::Binary(_)) => {
                    let _ = ctl.send_past_bound(Outbound::Close(CloseCode::UNSUPPORTED.0, ""));
                    return;
                }
                Some(Message::Text(text)) => {
                    // A reply to a request or a publish, on any session; ack / nack / credit:
                    // meaningless for ack=none sessions, followers and agents, which are not
                    // asked to parse them (an agent's chunks would each be buffered whole by
                    // the tagged enum's parse first).
                    let control = acked.as_ref().map(|_| serde_json::from_str::<Control>(&text));
                    let reply = match &control {
                        Some(Ok(_)) => None,
                        _ => serde_json::from_str::<ReplyFrame>(&text)
                            .ok()
                            .filter(|r| matches!(&*r.kind, "reply" | "chunk" | "publish")),
                    };
                    if reply.as_ref().is_some_and(|r| r.kind == "publish") {
                        // Answered in order with the session's other control frames; a
                        // publisher that does not read its answers waits here, at its socket.
                        let mut out = Vec::new();
                        replies.publisher.publish(&text, &mut out).await;
                        let _ = ctl.send(Outbound::Frame(Rc::new(out))).await;
                        pay_heavy(&replies.shard, meter).await;
                    } else if reply.as_ref().is_some_and(|r| r.kind == "chunk") {
                        // Boxed, as a reply is.
                        Box::pin(replies.chunk(&text, &mut ctl)).await;
                    } else if let Some(r) = reply {
                        // Boxed: its state (a cross-core ask) would otherwise sit in every idle session.
                        Box::pin(replies.reply(r.event.map(|e| e.get()), &mut ctl)).await;
                    } else if let (Some(a), Some(control)) = (&acked, control) {
                        let applied = control.map_err(|_| CloseCode::POLICY).and_then(|c| a.control(c));
                        if let Err(code) = applied {
                            let _ = ctl.send_past_bound(Outbound::Close(code.0, ""));
                            return;
                        }
                        // A client flooding acks waits here, at its own socket, for the
                        // control lane to drain, and after a costly one for its turn.
                        a.shard.control_room().await;
                        pay_heavy(&a.shard, meter).await;
                    }
                }
                Some(Message::Pong(_)) => {}
            }
        }
        // A subscriber may stay silent for as long as it likes; only the socket closing ends it.
        match read_more_sized(&mut rd, &mut buf, None, SESSION_READ_CHUNK).await {
            ReadOutcome::Data => heard.set(Instant::now()),
            ReadOutcome::Closed | ReadOutcome::TimedOut => return,
        }
    }
}

/// After a message that took over `task::HEAVY` of the core, waits the session's turn in the
/// heavy lane.
async fn pay_heavy(shard: &Shard, meter: &crate::task::Meter) {
    let cost = meter.take();
    if cost > crate::task::HEAVY {
        shard.shared.metrics.shard(shard.id).heavy(cost);
        crate::task::charge(cost);
        crate::task::turn().await;
    }
}

/// Writes all of `batch`, a `writev` at a time, advancing past what each one took; `false` if
/// the socket broke or a write made no progress for `WRITE_STALL` (the client stopped reading).
pub(crate) async fn write_shared<W: AsyncWriteRent>(wr: &mut W, mut batch: SharedFrames) -> (bool, SharedFrames) {
    while batch.bytes() > 0 {
        match crate::server::deadline::within(WRITE_STALL, wr.writev(batch)).await {
            Ok((Ok(n), back)) if n > 0 => {
                batch = back;
                batch.advance(n);
            }
            // Cancelled by the timeout: the runtime owned (and dropped) the batch.
            Err(_) => return (false, SharedFrames::default()),
            Ok((_, back)) => return (false, back),
        }
    }
    (true, batch)
}

/// Pings a session from which nothing arrived for `every`, and ends (returns) once nothing
/// arrived for twice that: a peer that vanished without a FIN must not hold a session forever.
async fn keepalive(ctl: queue::Sender<Outbound>, heard: Rc<Cell<Instant>>, every: Duration) {
    loop {
        monoio::time::sleep(every).await;
        let silent = heard.get().elapsed();
        if silent >= every * 2 {
            let _ = ctl.send_past_bound(Outbound::Close(CloseCode::GOING_AWAY.0, ""));
            return;
        }
        if silent >= every {
            let mut ping = Vec::with_capacity(2);
            encode_frame(OpCode::Ping, true, b"", &mut ping);
            let _ = ctl.try_send(Outbound::Frame(Rc::new(ping)));
        }
    }
}

/// Writes queued frames until a close; returns once the close frame is out or the socket broke.
/// Whatever is queued when the writer wakes (after `linger`) goes out in one vectored write of
/// the shared renderings, without copying them.
async fn write_half<W: AsyncWriteRent>(
    count_write: impl Fn(),
    mut wr: W,
    mut events: queue::Receiver<Outbound>,
    mut ctl: queue::Receiver<Outbound>,
    linger: Duration,
    queued: Option<Rc<Cell<usize>>>,
) {
    // What is taken off the events queue no longer counts against the session's queued bytes.
    let taken = |m: Outbound| {
        if let (Some(q), Outbound::Frame(b)) = (&queued, &m) {
            q.set(q.get().saturating_sub(b.len()));
        }
        m
    };
    let mut batch = SharedFrames::default();
    loop {
        // The control queue first: a close, or the peer gone, is seen however busy the fan-out.
        let next = match select(ctl.recv(), events.recv()).await {
            Either::Left((Some(m), _)) => m,
            // The reader finished without asking for a close: the peer is gone.
            Either::Left((None, _)) => return,
            Either::Right((Some(m), _)) => taken(m),
            // Our queue was closed by the fan-out: this session fell too far behind.
            Either::Right((None, _)) => Outbound::Close(CloseCode::POLICY.0, ""),
        };
        if !linger.is_zero() && matches!(next, Outbound::Frame(_)) {
            // Let more events join this write (delivery_linger_us).
            monoio::time::sleep(linger).await;
        }
        let mut close = None;
        let mut peer_gone = false;
        let mut pending = Some(next);
        while let Some(m) = pending.take() {
            match m {
                Outbound::Frame(bytes) => batch.push(bytes),
                Outbound::Close(code, reason) => {
                    close = Some((code, reason));
                    break;
                }
            }
            if batch.bytes() < WRITE_BATCH && batch.len() < SharedFrames::MAX - 1 {
                pending = match ctl.try_recv() {
                    Ok(m) => Some(m),
                    Err(e) => {
                        peer_gone |= e.is_closed();
                        events.try_recv().ok().map(taken)
                    }
                };
            }
        }
        if let Some((code, reason)) = close {
            batch.push(Rc::new(close_bytes(code, reason)));
        }
        count_write();
        let (ok, mut back) = write_shared(&mut wr, batch).await;
        if !ok {
            return;
        }
        back.clear();
        batch = back;
        if close.is_some() {
            let _ = wr.shutdown().await;
            return;
        }
        if peer_gone {
            return;
        }
    }
}

/// A session's socket and the queue its writer drains.
pub(super) struct Io {
    pub stream: crate::server::Stream,
    /// Bytes read past the upgrade request.
    pub buf: Vec<u8>,
    pub limits: ConnLimits,
    pub events: queue::Receiver<Outbound>,
    /// What `events` holds, in bytes (live fan-out sessions).
    pub queued: Option<Rc<Cell<usize>>>,
}

/// What ends a session early (see [`run`]), boxed: awaited by value inside another future, an
/// unboxed one would take room twice in every idle session.
pub(super) type Ends = std::pin::Pin<Box<dyn std::future::Future<Output = Option<&'static str>>>>;

/// Drives a WebSocket session: a reader (pings, close, acks of `acked`, reply frames), a
/// keepalive, a writer draining `io.events`, and `ends`: once it resolves with `Some(reason)`
/// the session closes with 1008 and that reason (`None`: it had nothing more to say, the
/// session goes on until either side closes it).
///
/// A plain function returning the future, not an `async fn`: everything is set up before the
/// first await, and the future keeps only the reader's box and the writer task's handle (an
/// `async fn` would also keep room for every argument, per idle session).
pub(super) fn run(
    shard: &Rc<Shard>,
    io: Io,
    acked: Option<AckedSession>,
    (replier, publisher): (Replier, Publisher),
    ends: Ends,
) -> impl std::future::Future<Output = ()> {
    let Io { stream, mut buf, limits, events, queued } = io;
    // The HTTP read buffer came along with the upgrade; keep only what it holds.
    buf.shrink_to_fit();
    let (rd, wr) = stream.into_split();
    let (ctl_tx, ctl_rx) = queue::channel(16);
    let heard = Rc::new(Cell::new(Instant::now()));
    let alive = keepalive(ctl_tx.clone(), heard.clone(), shard.shared.config.ws_ping_interval);
    let guard = {
        let ctl = ctl_tx.clone();
        async move {
            match ends.await {
                Some(reason) => {
                    let _ = ctl.send_past_bound(Outbound::Close(CloseCode::POLICY.0, reason));
                }
                None => std::future::pending().await,
            }
        }
    };
    let replies = Replies { shard: shard.clone(), replier, publisher };
    // A dead peer ends the reading side like a closed socket does (both senders of the
    // control queue are dropped then, which tells the writer the peer is gone); so do an
    // expired credential and a revoked permission, once their close is queued.
    //
    // Each part boxed here, outside any `async` block (one that moved them in would keep room
    // for each as well as its box), and the reader sized for its own stream: a plain session's
    // read does not take the room of a TLS one's. 1.4 KB less per idle session
    // (perf/idle_sessions.sh, perf/RESULTS.md).
    let read: std::pin::Pin<Box<dyn std::future::Future<Output = ()>>> = match rd {
        ReadHalf::Plain(rd) => Box::pin(read_half(rd, buf, limits.ws_max_message, ctl_tx, (acked, replies), heard)),
        ReadHalf::Tls(rd) => Box::pin(read_half(rd, buf, limits.ws_max_message, ctl_tx, (acked, replies), heard)),
    };
    let reader = Box::pin(select(read, select(Box::pin(alive), Box::pin(guard))).map(|_| ()));
    // Its own task: under one `select` every wake of the writer (each delivery) would poll the
    // reader too, and the reader's metering reads the clock twice per poll. It ends by itself
    // once the reader's side is dropped (its control queue then has no sender).
    let count_write = {
        let shard = shard.clone();
        move || shard.shared.metrics.shard(shard.id).ws_writes.inc()
    };
    let writer = monoio::spawn(write_half(count_write, wr, events, ctl_rx, limits.delivery_linger, queued));
    async move {
        match select(reader, writer).await {
            // The reader is done (close asked or peer gone): let the writer send what it must.
            Either::Left(((), writer)) => writer.await,
            // The writer closed (slow consumer, removed subscription) or broke: give the peer a
            // moment to answer our close, then drop the socket.
            Either::Right(((), reader)) => {
                let _ = monoio::time::timeout(Duration::from_secs(1), reader).await;
            }
        }
    }
}

/// Runs a WebSocket session on this shard until either side closes it.
pub async fn session(
    shard: Rc<Shard>,
    stream: crate::server::Stream,
    buf: Vec<u8>,
    limits: ConnLimits,
    spec: Box<SessionSpec>,
    publisher: Publisher,
) {
    let (events, acked, live_id, queued) = if spec.acked {
        let (events, consumer, at) = attach_acked(&shard, &spec, Kind::Ws);
        (events, Some(AckedSession { shard: shard.clone(), consumer, topic: spec.topic.clone(), at }), None, None)
    } else {
        let (id, events, queued, first) = shard.sessions.add(&spec.subscription);
        if first {
            shard.shared.follow_topic(&spec.topic);
            shard.announce(&spec.subscription, &spec.topic, InterestChange::Attach);
        }
        (events, None, Some(id), Some(queued))
    };
    let detach = acked.as_ref().map(|a| (a.consumer.clone(), a.at));
    let replier = Replier { principal: spec.principal.clone(), tenant: spec.tenant.clone(), agent: None };
    let guard: Ends = {
        let (shard, spec) = (shard.clone(), spec.clone());
        // An expired credential or a revoked permission closes the session (1008).
        Box::pin(async move { Some(super::authority(&shard, &spec).await) })
    };
    let io = Io { stream, buf, limits, events, queued };
    run(&shard, io, acked, (replier, publisher), guard).await;
    match (detach, live_id) {
        (Some((consumer, at)), _) => detach_acked(&shard, consumer, &spec.topic, at),
        (None, Some(id)) => {
            if shard.sessions.remove(&spec.subscription, id) {
                shard.announce(&spec.subscription, &spec.topic, InterestChange::Detach);
            }
        }
        (None, None) => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Once the reader is gone (its control queue has no sender), the writer ends at its next
    /// turn, however busy the fan-out: it once looked at the events first and at the control
    /// queue only when they ran dry, so a steady stream kept a dead peer's session alive.
    #[test]
    fn the_writer_ends_when_the_reader_is_gone_however_busy_the_fan_out() {
        // A client that reads slowly: the writer's writes wait for room, and the fan-out
        // refills its queue meanwhile.
        let client = |mut c: std::net::TcpStream| {
            use std::io::Read;
            let mut buf = [0u8; 4096];
            while c.read(&mut buf).is_ok_and(|n| n > 0) {
                std::thread::sleep(Duration::from_millis(1));
            }
        };
        super::super::with_loopback_client(client, |wr| async move {
            let (events_tx, events) = queue::channel(SharedFrames::MAX * 4);
            let (ctl_tx, ctl) = queue::channel(16);
            let frame = Rc::new(vec![b'x'; 4096]);
            // The fan-out: the queue is never empty when the writer looks.
            for _ in 0..SharedFrames::MAX * 2 {
                events_tx.try_send(Outbound::Frame(frame.clone())).unwrap();
            }
            let stop = Rc::new(Cell::new(false));
            let feeding = stop.clone();
            monoio::spawn(async move {
                while !feeding.get() {
                    while events_tx.try_send(Outbound::Frame(frame.clone())).is_ok() {}
                    monoio::time::sleep(Duration::from_millis(1)).await;
                }
            });
            drop(ctl_tx);
            let writer = write_half(|| (), wr, events, ctl, Duration::ZERO, None);
            let ended = monoio::time::timeout(Duration::from_secs(5), writer).await;
            stop.set(true);
            assert!(ended.is_ok(), "the writer went on writing for a reader that is gone");
        });
    }
}
