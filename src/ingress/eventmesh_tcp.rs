//! Classic EventMesh TCP clients (SPEC "Classic EventMesh TCP clients"): the Java SDK's
//! `EventMeshTCPClient` and the clients written from EventMesh's TCP protocol, on the
//! `tcp_listen` listener, which the shards accept like the HTTP one (a connection stays on its
//! shard and counts against its `max_connections`). The frames are
//! `evmesh_protocol::adaptor::eventmesh_tcp`'s; what each command does is EventMesh's
//! (apache/eventmesh 2527428, `eventmesh-runtime/.../protocol/tcp/client/processor/`), over
//! evmesh's own model:
//!
//! * HELLO: the user agent. Its `token` (else its `password`) is the credential, verified as a
//!   bearer token on HTTP is (401 -> code 1 and a close); `group` names the group's
//!   subscriptions; `purpose` `sub` may LISTEN. Every later package is authenticated again
//!   as each request of a keep-alive HTTP connection is (an expired or revoked credential
//!   ends the connection with SERVER_GOODBYE). Before HELLO, another command is answered
//!   with code 1 ("no session is found") as EventMesh answers it; no HELLO within
//!   `header_read_timeout` closes the connection.
//! * HEARTBEAT: answered. A connection that sends no whole package for [`SILENCE`] (120 s; the
//!   SDKs send a heartbeat every 30 s) gets SERVER_GOODBYE and is closed.
//! * SUBSCRIBE: each topic is the group's evmesh subscription (`cg.<len>.<group>.<topic>`, the
//!   one classic HTTP subscribers of the group share): `LOAD_BALANCE` for `CLUSTERING`,
//!   `BROADCAST` for `BROADCASTING` (each connection then a consumer of its own, from the
//!   moment it listens). LISTEN attaches the connection's subscriptions as sessions of
//!   acknowledged delivery (and those it subscribes later at once); UNSUBSCRIBE detaches all
//!   of them (the group's subscription and its offsets stay). Where a subscription's home is
//!   another instance (Kafka), the answer is REDIRECT_TO_CLIENT to it, then the close.
//! * Pushes (`shard::sessions::Kind::Tcp`): ASYNC_MESSAGE_TO_CLIENT, REQUEST_TO_CLIENT (a SYNC
//!   subscription, or a request event) or BROADCAST_MESSAGE_TO_CLIENT, `seq` =
//!   `<slot>/<delivery id>`; the client's `*_TO_CLIENT_ACK` with that `seq` acks the delivery
//!   in evmesh's offsets. No ack within the subscription's `ackTimeoutMs` redelivers, then
//!   dead-letters, as for every transport.
//! * ASYNC_MESSAGE_TO_SERVER, BROADCAST_MESSAGE_TO_SERVER: a publish through the one ingress
//!   path (`Traffic::publish_frames`: the ACL, limits, quotas, backlog, transformer, routes,
//!   storage), answered `*_ACK` once stored. REQUEST_TO_SERVER: a request on the request
//!   path (`Traffic::ask_and_wait`, its timeout the message's `ttl` extension in ms, else 3 s,
//!   at most `max_request_timeout_ms`), answered RESPONSE_TO_CLIENT with the reply or a code 1;
//!   requests wait concurrently, at most [`MAX_WAITING`] per connection. RESPONSE_TO_SERVER:
//!   a reply (its `emcorrelationid` extension, copied back from the REQUEST_TO_CLIENT).
//! * CLIENT_GOODBYE: answered, then closed. RECOMMEND: this instance's TCP address.
//! * A frame that is not EventMesh's (magic, version, lengths, a header that is not JSON or
//!   names no command), or past `max_body_bytes` + 64 KiB: SERVER_GOODBYE with code 1 saying
//!   why, then the close. A command the bridge does not serve: answered with code 1.
//!
//! Bounds: one package is handled at a time per connection (answers in order); the answers
//! and pushes wait in a bounded queue for one writer, so a client that does not read stops
//! being read, and a write that makes no progress for 10 s ends the connection; the
//! connection yields its core every `task::TURN` packages and waits its turn in the heavy
//! lane after a costly one.

use std::borrow::Cow;
use std::cell::Cell;
use std::net::SocketAddr;
use std::rc::Rc;
use std::time::{Duration, Instant};

use futures::future::{select, Either, FutureExt as _, Shared};
use monoio::io::{AsyncWriteRent, AsyncWriteRentExt, Splitable};

use super::adaptor::Refusal;
use super::meshmessage::group_subscription;
use super::request::{Asker, Waited};
use super::traced::Headers;
use super::ws_publish::refusal;
use super::Traffic;
use crate::adaptor::eventmesh_tcp::{self as tcp, Command, Header, Message, Purpose, Subscribed, FAIL, SUCCESS};
use crate::governance::acl::{Action, Kind};
use crate::governance::identity::Principal;
use crate::governance::Caller;
use crate::model::delivery::{AckKind, ConsumerKey, SessionRef};
use crate::queue;
use crate::server::conn::{read_more_sized, ConnGuard, ConnLimits, ReadOutcome};
use crate::server::SessionSpec;
use crate::shard::sessions::{Kind as SessionKind, Outbound, TcpPush};

/// A connection that sends no whole package for this long is closed (EventMesh's session
/// expiry; its SDKs send a heartbeat every 30 s).
pub const SILENCE: Duration = Duration::from_secs(120);
/// Requests one connection may have waiting for their replies.
pub const MAX_WAITING: usize = 64;
/// Subscriptions one connection may hold.
pub const MAX_SUBSCRIPTIONS: usize = 64;
/// A request's timeout when its message has no `ttl` (EventMesh's default).
const DEFAULT_TTL: Duration = Duration::from_secs(3);
/// Bytes one read takes at most.
const READ_CHUNK: usize = 16 * 1024;
/// Answers and pushes waiting for the writer.
const OUT_QUEUE: usize = 256;
/// Room for a package's header past `max_body_bytes`.
const HEADER_ROOM: usize = 64 * 1024;

/// Serves one classic TCP connection until it closes, goes silent, or breaks the protocol.
pub async fn serve(
    traffic: Rc<Traffic>,
    stream: monoio::net::TcpStream,
    peer: SocketAddr,
    limits: ConnLimits,
    guard: ConnGuard,
) {
    let (rd, wr) = stream.into_split();
    let (out, out_rx) = queue::channel(OUT_QUEUE);
    let writer = monoio::spawn(write_loop(wr, out_rx));
    // Resolves for the requests still waiting once the connection is gone.
    let (ended_tx, ended) = futures::channel::oneshot::channel::<()>();
    let mut conn = Conn {
        traffic,
        caller: Caller::new(Some(peer.ip()), None),
        peer,
        hello: None,
        subs: Vec::new(),
        listening: false,
        out,
        waiting: Rc::new(Cell::new(0)),
        ended: ended.shared(),
    };
    let meter = crate::task::Meter::default();
    let reading = Box::pin(crate::task::metered(&meter, conn.read_loop(rd, limits, &meter)));
    // The reader is done (a goodbye, a close, a protocol error): the writer sends what is
    // queued (its last package) within its stall. Or the writer stopped (the client stopped
    // reading, the socket broke, a push closed it).
    let writer = match select(reading, writer).await {
        Either::Left((_, writer)) => Some(writer),
        Either::Right(_) => None,
    };
    conn.detach_all();
    let _ = conn.out.send_past_bound(Outbound::Close(0, ""));
    drop(conn);
    drop(ended_tx);
    if let Some(writer) = writer {
        writer.await;
    }
    drop(guard);
}

/// Writes the queued packages, gathering whatever is queued into one write, until a close
/// (after what was queued before it), a broken socket or a write that makes no progress for
/// `WRITE_STALL`. The packages are copied into one buffer: a vectored write of the shared
/// renderings (`sys::SharedFrames`) holds its one-buffer iovec inline, where io_uring would
/// read it after the future moved.
async fn write_loop<W: AsyncWriteRent>(mut wr: W, mut rx: queue::Receiver<Outbound>) {
    let mut buf: Vec<u8> = Vec::new();
    loop {
        let Some(first) = rx.recv().await else { return };
        let mut close = false;
        let mut next = Some(first);
        while let Some(m) = next.take() {
            match m {
                Outbound::Frame(bytes) => buf.extend_from_slice(&bytes),
                Outbound::Close(..) => {
                    close = true;
                    break;
                }
            }
            if buf.len() < WRITE_BATCH {
                next = rx.try_recv().ok();
            }
        }
        if !buf.is_empty() {
            match crate::server::deadline::within(WRITE_STALL, wr.write_all(buf)).await {
                Ok((Ok(_), back)) => buf = back,
                _ => return,
            }
            buf.clear();
            if buf.capacity() > WRITE_BATCH * 2 {
                buf = Vec::new();
            }
        }
        if close {
            let _ = wr.shutdown().await;
            return;
        }
    }
}

/// Bytes gathered into one write.
const WRITE_BATCH: usize = 256 * 1024;
/// A write that makes no progress for this long means the client stopped reading.
const WRITE_STALL: Duration = Duration::from_secs(10);

/// Who the client said it is (HELLO).
struct Hello {
    who: Rc<Principal>,
    token: Option<Vec<u8>>,
    group: String,
    purpose: Purpose,
}

/// One subscribed topic of the connection.
struct Sub {
    item: Subscribed,
    /// The subscription's stored name, and its topic's.
    name: String,
    topic: String,
    /// While listening: its session of acknowledged delivery.
    attached: Option<(ConsumerKey, SessionRef)>,
}

struct Conn {
    traffic: Rc<Traffic>,
    caller: Caller,
    peer: SocketAddr,
    hello: Option<Hello>,
    /// By slot (the `<slot>/` of a push's `seq`); a slot is not reused while its deliveries
    /// may still be acked.
    subs: Vec<Option<Sub>>,
    listening: bool,
    out: queue::Sender<Outbound>,
    /// Requests waiting for their replies.
    waiting: Rc<Cell<usize>>,
    ended: Shared<futures::channel::oneshot::Receiver<()>>,
}

/// What the connection does after a package.
enum Next {
    Go,
    /// Close after what is queued.
    Close,
}

impl Conn {
    async fn read_loop(
        &mut self,
        mut rd: impl monoio::io::AsyncReadRent,
        limits: ConnLimits,
        meter: &crate::task::Meter,
    ) -> Option<()> {
        let max_frame = (self.traffic.shard.shared.config.limits.max_body_bytes + HEADER_ROOM).min(tcp::MAX_FRAME);
        let mut buf: Vec<u8> = Vec::new();
        let opened = Instant::now();
        let mut last = Instant::now();
        let mut turns: u32 = 0;
        loop {
            // Every whole package already read, one at a time.
            loop {
                if let Some(frame) = announced(&buf).filter(|&n| n > max_frame) {
                    let why =
                        format!("a frame of {frame} bytes, past this broker's {max_frame} (max_body_bytes + 64 KiB)");
                    return self.goodbye(FAIL, &why);
                }
                let (pkg, used) = match tcp::decode(&buf) {
                    Ok(Some(p)) => p,
                    Ok(None) => break,
                    Err(e) => return self.goodbye(FAIL, &e.to_string()),
                };
                buf.drain(..used);
                last = Instant::now();
                turns += 1;
                if turns % crate::task::TURN == 0 {
                    crate::task::yield_now().await;
                }
                let Some(header) = pkg.header else {
                    return self.goodbye(FAIL, "the incoming message does not have a header");
                };
                if let Next::Close = self.on_package(header, pkg.body).await {
                    let _ = self.out.send_past_bound(Outbound::Close(0, ""));
                    return None;
                }
                crate::push::pay_heavy(&self.traffic.shard, meter).await;
            }
            if buf.capacity() > READ_CHUNK * 4 && buf.len() < READ_CHUNK {
                buf.shrink_to(READ_CHUNK);
            }
            let quiet = match &self.hello {
                None => limits.header_read_timeout.saturating_sub(opened.elapsed()),
                Some(_) => SILENCE.saturating_sub(last.elapsed()),
            };
            match read_more_sized(&mut rd, &mut buf, Some(quiet), READ_CHUNK).await {
                ReadOutcome::Data => {}
                ReadOutcome::Closed => return None,
                ReadOutcome::TimedOut if self.hello.is_none() => {
                    return self.goodbye(FAIL, "no HELLO_REQUEST in time");
                }
                ReadOutcome::TimedOut => {
                    let why = format!("nothing heard for {} s (heartbeats are every 30 s)", SILENCE.as_secs());
                    return self.goodbye(SUCCESS, &why);
                }
            }
        }
    }

    /// Queues SERVER_GOODBYE with `code` and `why`, then the close.
    fn goodbye(&mut self, code: i32, why: &str) -> Option<()> {
        let bye = tcp::answer(Command::ServerGoodbyeRequest, code, why, None);
        let _ = self.out.send_past_bound(Outbound::Frame(Rc::new(bye)));
        let _ = self.out.send_past_bound(Outbound::Close(0, ""));
        None
    }

    /// Queues an answer; waits while the writer is behind (the client not reading).
    async fn send(&mut self, bytes: Vec<u8>) {
        let _ = self.out.send(Outbound::Frame(Rc::new(bytes))).await;
    }

    async fn answer(&mut self, header: &Header, code: i32, desc: &str) {
        let bytes = tcp::answer(tcp::answer_to(header.cmd), code, desc, header.seq.as_deref());
        self.send(bytes).await;
    }

    async fn on_package(&mut self, header: Header, body: Vec<u8>) -> Next {
        let traffic = self.traffic.clone();
        let m = traffic.shard.shared.metrics.shard(traffic.shard.id);
        match header.cmd {
            Command::HelloRequest => return self.hello(&header, &body).await,
            Command::RecommendRequest => {
                let here = self.recommend();
                let bytes = tcp::encode(
                    &Header::new(Command::RecommendResponse, SUCCESS, Some("success"), header.seq.as_deref()),
                    here.as_bytes(),
                )
                .expect("small");
                self.send(bytes).await;
                return Next::Go;
            }
            _ => {}
        }
        if self.hello.is_none() {
            self.answer(&header, FAIL, "no session is found (HELLO_REQUEST first)").await;
            return Next::Go;
        }
        // Each package is authenticated again, as each request of a keep-alive connection; the
        // subscriptions are checked against the ACL with each heartbeat.
        if let Err(why) = self.still_allowed(header.cmd == Command::HeartbeatRequest) {
            self.answer(&header, FAIL, &why).await;
            let bye = tcp::answer(Command::ServerGoodbyeRequest, FAIL, &why, None);
            self.send(bye).await;
            return Next::Close;
        }
        match header.cmd {
            Command::HeartbeatRequest => self.answer(&header, SUCCESS, "success").await,
            Command::ClientGoodbyeRequest => {
                self.answer(&header, SUCCESS, "success").await;
                return Next::Close;
            }
            Command::SubscribeRequest => return self.subscribe(&header, &body).await,
            Command::UnsubscribeRequest => {
                self.detach_all();
                self.subs.iter_mut().for_each(|s| *s = None);
                self.answer(&header, SUCCESS, "success").await;
            }
            Command::ListenRequest => return self.listen(&header).await,
            Command::AsyncMessageToServer | Command::BroadcastMessageToServer => {
                m.publish_requests.inc();
                let started = crate::task::clock::fresh();
                let (code, desc) = match self.publish(&header, &body).await {
                    Ok(()) => (SUCCESS, Cow::Borrowed("success")),
                    Err(desc) => {
                        m.publish_errors.inc();
                        (FAIL, Cow::Owned(desc))
                    }
                };
                m.publish_latency.record_us(crate::task::clock::micros_since(started));
                self.answer(&header, code, &desc).await;
            }
            Command::RequestToServer => self.request(&header, &body).await,
            Command::ResponseToServer => {
                if let Err(desc) = self.reply(&header, &body).await {
                    self.answer(&header, FAIL, &desc).await;
                }
            }
            Command::AsyncMessageToClientAck | Command::BroadcastMessageToClientAck | Command::RequestToClientAck => {
                if let Err(desc) = self.ack(&header) {
                    self.answer(&header, FAIL, &desc).await;
                }
                // A client flooding acks waits here for the control lane to drain.
                self.traffic.shard.control_room().await;
            }
            // The requester's ack of a RESPONSE_TO_CLIENT, a client's answer to our goodbye:
            // nothing to do (as EventMesh).
            Command::ResponseToClientAck | Command::ServerGoodbyeResponse => {}
            other => {
                let desc = format!("{} is not served by this broker", other.name());
                self.answer(&header, FAIL, &desc).await;
            }
        }
        Next::Go
    }

    /// HELLO: the user agent checked, the credential verified; a second HELLO changes nothing.
    async fn hello(&mut self, header: &Header, body: &[u8]) -> Next {
        if self.hello.is_some() {
            self.answer(header, SUCCESS, "success").await;
            return Next::Go;
        }
        let (ua, purpose) = match tcp::UserAgent::parse(body) {
            Ok(u) => u,
            Err(why) => {
                self.answer(header, FAIL, &why).await;
                return Next::Close;
            }
        };
        let token = ua.credential().map(|c| c.as_bytes().to_vec());
        let traffic = self.traffic.clone();
        let snap = traffic.view.current(&traffic.shard.shared.governance);
        let who = match traffic.authenticate(&mut self.caller, &snap, "tcp:HELLO", token.as_deref()) {
            Ok(who) => who,
            Err(r) => {
                let (status, detail) = refusal(&r);
                self.answer(header, FAIL, &format!("{status} {detail}")).await;
                return Next::Close;
            }
        };
        let group = ua.group.unwrap_or_default().trim().to_owned();
        self.hello = Some(Hello { who, token, group, purpose });
        self.answer(header, SUCCESS, "success").await;
        Next::Go
    }

    /// This instance's TCP address, `ip:port` (the host of `advertised_url`).
    fn recommend(&self) -> String {
        let shared = &self.traffic.shard.shared;
        let port = shared.config.tcp_listen.map_or(0, |a| a.port());
        let host = host_of(&shared.config.advertised_url).unwrap_or_else(|| self.peer.ip().to_string());
        serde_json::Value::String(format!("{host}:{port}")).to_string()
    }

    /// The credential still verifies (and has not expired), and (`subscriptions`) every attached
    /// subscription is still the principal's to read.
    fn still_allowed(&mut self, subscriptions: bool) -> Result<(), String> {
        let hello = self.hello.as_ref().expect("after HELLO");
        let traffic = self.traffic.clone();
        let snap = traffic.view.current(&traffic.shard.shared.governance);
        let who = traffic.authenticate(&mut self.caller, &snap, "tcp", hello.token.as_deref()).map_err(|r| {
            let (status, detail) = refusal(&r);
            format!("{status} {detail}")
        })?;
        for s in self.subs.iter().flatten().filter(|s| subscriptions && s.attached.is_some()) {
            let name = local(&hello.who, &s.name);
            if self.caller.authorize(&snap, &who, Action::Subscribe, Kind::Subscription, name).is_err() {
                return Err(format!("403 {} may no longer SUBSCRIBE subscription:{name}", who.name));
            }
        }
        Ok(())
    }

    /// The gate of a request of this connection.
    fn gate(&mut self) -> super::gate::Gate<'_> {
        let hello = self.hello.as_ref().expect("after HELLO");
        let snap = self.traffic.view.current(&self.traffic.shard.shared.governance);
        super::gate::Gate {
            traffic: &self.traffic,
            snap,
            caller: &mut self.caller,
            who: &hello.who,
            token: hello.token.as_deref(),
        }
    }

    /// ASYNC_MESSAGE_TO_SERVER, BROADCAST_MESSAGE_TO_SERVER: a publish; `Err` is the answer's
    /// `desc`.
    async fn publish(&mut self, header: &Header, body: &[u8]) -> Result<(), String> {
        let traffic = self.traffic.clone();
        if traffic.shard.shared.memory.shed_now() {
            return Err(problem_desc(&super::gate::shed()));
        }
        let max = traffic.shard.shared.config.limits.max_body_bytes;
        if body.len() > max {
            return Err(format!("413 the message is larger than max_body_bytes ({max})"));
        }
        let msg = Message::parse(header, body).map_err(|e| format!("400 {e}"))?;
        if msg.topic().is_empty() {
            return Err("400 a CloudEvent sent over TCP names its topic as its subject".into());
        }
        let mut gate = self.gate();
        let topic = traffic
            .topic_named(&mut gate, Cow::Borrowed(msg.topic()), Action::Publish, None)
            .map_err(|r| problem_desc(&r))?;
        let frame = msg.to_frame(header, &topic).map_err(|e| format!("400 {e}"))?;
        let sent = (body.len(), body.len() as u64, Headers::default());
        let r = traffic.publish_frames(&mut gate, &topic, vec![frame], sent).await;
        match r {
            Ok(_) => Ok(()),
            Err(Refusal::Answered(r) | Refusal::Problem(r) | Refusal::Busy(r)) => Err(problem_desc(&r)),
        }
    }

    /// REQUEST_TO_SERVER: stored as a request, its reply awaited in a task of its own (the
    /// connection goes on), answered RESPONSE_TO_CLIENT with the request's `seq`.
    async fn request(&mut self, header: &Header, body: &[u8]) {
        let traffic = self.traffic.clone();
        let fail = |desc: String| tcp::answer(Command::ResponseToClient, FAIL, &desc, header.seq.as_deref());
        if self.waiting.get() >= MAX_WAITING {
            let desc = format!("429 this connection has {MAX_WAITING} requests waiting for replies");
            return self.send(fail(desc)).await;
        }
        let prepared = (|| {
            if traffic.shard.shared.memory.shed_now() {
                return Err(problem_desc(&super::gate::shed()));
            }
            let max = traffic.shard.shared.config.limits.max_body_bytes;
            if body.len() > max {
                return Err(format!("413 the message is larger than max_body_bytes ({max})"));
            }
            let msg = Message::parse(header, body).map_err(|e| format!("400 {e}"))?;
            if msg.topic().is_empty() {
                return Err("400 a CloudEvent sent over TCP names its topic as its subject".into());
            }
            let mut gate = self.gate();
            let topic = traffic
                .topic_named(&mut gate, Cow::Borrowed(msg.topic()), Action::Request, None)
                .map_err(|r| problem_desc(&r))?
                .into_owned();
            let frame = msg.to_frame(header, &topic).map_err(|e| format!("400 {e}"))?;
            let ttl = frame.body().attr_str("ttl").and_then(|t| t.parse::<u64>().ok()).filter(|&t| t > 0);
            let timeout =
                ttl.map_or(DEFAULT_TTL, Duration::from_millis).min(traffic.shard.shared.config.max_request_timeout);
            Ok((topic, frame, timeout))
        })();
        let (topic, frame, timeout) = match prepared {
            Ok(p) => p,
            Err(desc) => return self.send(fail(desc)).await,
        };
        // The wait is the request's own task; it asks as this connection's principal, with a
        // caller of its own (the connection's is busy with the next package).
        let hello = self.hello.as_ref().expect("after HELLO");
        let (who, token) = (hello.who.clone(), hello.token.clone());
        let mut caller = Caller::new(Some(self.peer.ip()), None);
        let (mut out, waiting, ended) = (self.out.clone(), self.waiting.clone(), self.ended.clone());
        let seq = header.seq.clone();
        let bytes = body.len();
        waiting.set(waiting.get() + 1);
        monoio::spawn(async move {
            let snap = traffic.view.current(&traffic.shard.shared.governance);
            let mut gate =
                super::gate::Gate { traffic: &traffic, snap, caller: &mut caller, who: &who, token: token.as_deref() };
            let asker = Asker { bytes, held: bytes, headers: Headers::default() };
            let waited = traffic.ask_and_wait(&mut gate, asker, &topic, frame, timeout, ended.map(|_| ())).await;
            waiting.set(waiting.get() - 1);
            let seq = seq.as_deref();
            let answer = match waited {
                Ok(Waited::Reply(reply)) => {
                    tcp::push(&reply, &[], Command::ResponseToClient, seq.unwrap_or_default(), SUCCESS).unwrap_or_else(
                        || tcp::answer(Command::ResponseToClient, FAIL, "the reply is larger than a 4 MiB frame", seq),
                    )
                }
                Ok(Waited::TimedOut(id)) => {
                    let desc = format!("504 no reply to request {id} within {} ms", timeout.as_millis());
                    tcp::answer(Command::ResponseToClient, FAIL, &desc, seq)
                }
                Ok(Waited::Gone) => return,
                Err(r) => tcp::answer(Command::ResponseToClient, FAIL, &problem_desc(&r), seq),
            };
            let _ = out.send(Outbound::Frame(Rc::new(answer))).await;
        });
    }

    /// RESPONSE_TO_SERVER: a reply to the request its `emcorrelationid` names.
    async fn reply(&mut self, header: &Header, body: &[u8]) -> Result<(), String> {
        let msg = Message::parse(header, body).map_err(|e| format!("400 {e}"))?;
        let frame = msg.to_frame(header, "").map_err(|e| format!("400 {e}"))?;
        let hello = self.hello.as_ref().expect("after HELLO");
        let g = &self.traffic.shard.shared.governance;
        let principal = (g.config.mode != crate::governance::AuthMode::None).then(|| hello.who.name.clone());
        let replier = crate::shard::requests::Replier { principal, tenant: hello.who.tenant.clone(), agent: None };
        match self.traffic.shard.send_reply(frame, replier).await {
            Ok(crate::model::ReplyOutcome::Delivered) => Ok(()),
            Ok(outcome) => {
                let (status, detail) = outcome.status(&hello.who.name);
                Err(format!("{status} {detail}"))
            }
            Err(e) => Err(format!("503 {e}")),
        }
    }

    /// A push's ack: its `seq` names the subscription (slot) and the delivery.
    fn ack(&mut self, header: &Header) -> Result<(), String> {
        let seq = header.seq.as_deref().unwrap_or_default();
        let bad = || format!("{seq:?} is not the seq of a push to this connection");
        let (slot, id) = seq.split_once('/').ok_or_else(bad)?;
        let slot: usize = slot.parse().map_err(|_| bad())?;
        let Some(Some(sub)) = self.subs.get(slot) else { return Ok(()) };
        let Some((consumer, _)) = &sub.attached else { return Ok(()) };
        let by = crate::delivery::group_ids([id]).map_err(|e| format!("400 {e}"))?;
        self.traffic
            .shard
            .route_acks(consumer, &sub.topic, by, AckKind::Ack, false)
            .map(|_| ())
            .map_err(|e| format!("400 {e}"))
    }

    /// SUBSCRIBE: each topic as the group's subscription (made if new), attached at once while
    /// listening.
    async fn subscribe(&mut self, header: &Header, body: &[u8]) -> Next {
        let items = match tcp::subscription(body) {
            Ok(i) => i,
            Err(e) => {
                self.answer(header, FAIL, &e).await;
                return Next::Go;
            }
        };
        for item in items {
            match self.subscribe_one(item).await {
                Ok(None) => {}
                Ok(Some(home)) => {
                    // Served by another instance: tell the client where, then close.
                    self.answer(header, FAIL, &format!("307 this subscription is served by its home instance {home}"))
                        .await;
                    let port = self.traffic.shard.shared.config.tcp_listen.map_or(0, |a| a.port());
                    let ip = host_of(&home).unwrap_or_default();
                    self.send(tcp::redirect(&ip, port)).await;
                    return Next::Close;
                }
                Err(desc) => {
                    self.answer(header, FAIL, &desc).await;
                    return Next::Go;
                }
            }
        }
        self.answer(header, SUCCESS, "success").await;
        Next::Go
    }

    /// One topic of a SUBSCRIBE; `Ok(Some(url))`: its home is that other instance.
    async fn subscribe_one(&mut self, item: Subscribed) -> Result<Option<String>, String> {
        let traffic = self.traffic.clone();
        let group = self.hello.as_ref().expect("after HELLO").group.clone();
        let local = group_subscription(&group, &item.topic);
        let mut gate = self.gate();
        let topic = traffic
            .topic_named(&mut gate, Cow::Borrowed(&item.topic), Action::Subscribe, None)
            .map_err(|r| problem_desc(&r))?
            .into_owned();
        gate.allow(Action::Subscribe, Kind::Subscription, &local).map_err(|r| problem_desc(&r))?;
        let name = gate.scoped(&local).map_err(|r| problem_desc(&r))?.into_owned();
        if self.subs.iter().flatten().any(|s| s.name == name) {
            // Subscribed already: as EventMesh, the first mode and type stay.
            return Ok(None);
        }
        if self.subs.iter().flatten().count() >= MAX_SUBSCRIPTIONS || self.subs.len() >= u16::MAX as usize {
            return Err(format!("429 a connection holds at most {MAX_SUBSCRIPTIONS} subscriptions"));
        }
        let mut gate = self.gate();
        traffic.group_subscription_made(&mut gate, (&name, &topic), item.broadcasting, false).await?;
        if let Some(home) = traffic
            .home_elsewhere(&crate::cluster::homes::subscription_key(&name))
            .await
            .map_err(|r| problem_desc(&r))?
        {
            return Ok(Some(home));
        }
        self.subs.push(Some(Sub { item, name, topic, attached: None }));
        if self.listening {
            self.attach(self.subs.len() - 1);
        }
        Ok(None)
    }

    /// LISTEN: the connection's subscriptions start pushing (a `sub` client's only).
    async fn listen(&mut self, header: &Header) -> Next {
        if self.hello.as_ref().is_some_and(|h| h.purpose != Purpose::Sub) {
            self.answer(header, FAIL, "client purpose config is not sub").await;
            return Next::Go;
        }
        self.listening = true;
        for slot in 0..self.subs.len() {
            self.attach(slot);
        }
        self.answer(header, SUCCESS, "success").await;
        Next::Go
    }

    /// Attaches slot `slot`'s subscription as a session of acknowledged delivery, its pushes
    /// forwarded to the writer.
    fn attach(&mut self, slot: usize) {
        let hello = self.hello.as_ref().expect("after HELLO");
        let shard = self.traffic.shard.clone();
        let Some(sub) = self.subs.get_mut(slot).and_then(Option::as_mut) else { return };
        if sub.attached.is_some() {
            return;
        }
        let g = &shard.shared.governance;
        let principal = (g.config.mode != crate::governance::AuthMode::None).then(|| hello.who.name.clone());
        let spec = SessionSpec {
            subscription: sub.name.clone(),
            topic: sub.topic.clone(),
            acked: true,
            per_client: sub.item.broadcasting,
            client: None,
            filters: None,
            last_event_id: None,
            window: None,
            principal,
            credential: None,
            tenant: hello.who.tenant.clone(),
            expires_us: hello.who.expires_us,
        };
        let push = match (sub.item.broadcasting, sub.item.sync) {
            (true, _) => TcpPush::Broadcast,
            (false, true) => TcpPush::Sync,
            (false, false) => TcpPush::Async,
        };
        let kind = SessionKind::Tcp { push, slot: slot as u16 };
        let (events, consumer, at) = crate::push::attach_acked(&shard, &spec, kind);
        sub.attached = Some((consumer, at));
        monoio::spawn(forward(events, self.out.clone()));
    }

    /// Detaches every attached subscription (their unacknowledged events go to the
    /// subscriptions' other sessions).
    fn detach_all(&mut self) {
        for sub in self.subs.iter_mut().flatten() {
            if let Some((consumer, at)) = sub.attached.take() {
                crate::push::detach_acked(&self.traffic.shard, consumer, &sub.topic, at);
            }
        }
    }
}

/// Moves a subscription's pushes to the connection's writer until the session is detached (its
/// queue then has no sender). A close from the shard (the subscription removed, its home
/// moved, the session too slow) ends the connection with SERVER_GOODBYE.
async fn forward(mut events: queue::Receiver<Outbound>, mut out: queue::Sender<Outbound>) {
    while let Some(m) = events.recv().await {
        match m {
            Outbound::Frame(bytes) => {
                if out.send(Outbound::Frame(bytes)).await.is_err() {
                    return;
                }
            }
            Outbound::Close(code, reason) => {
                let why = match (code, reason) {
                    (_, "") => format!("the subscription's session ended ({code})"),
                    (_, r) => r.to_owned(),
                };
                let bye = tcp::answer(Command::ServerGoodbyeRequest, FAIL, &why, None);
                let _ = out.send_past_bound(Outbound::Frame(Rc::new(bye)));
                let _ = out.send_past_bound(Outbound::Close(code, reason));
                return;
            }
        }
    }
}

/// The whole frame's length the buffered bytes announce, once its length field is in.
/// (Only behind the magic and version: other bytes are refused for what they are.)
fn announced(buf: &[u8]) -> Option<usize> {
    if buf.get(..tcp::MAGIC.len()) != Some(&tcp::MAGIC[..])
        || buf.get(tcp::MAGIC.len()..tcp::PREFIX) != Some(&tcp::VERSION[..])
    {
        return None;
    }
    let len = buf.get(tcp::PREFIX..tcp::PREFIX + 4)?;
    let n = i32::from_be_bytes(len.try_into().expect("4 bytes"));
    usize::try_from(i64::from(n) + 8).ok()
}

/// A refusal (problem+json) as an answer's `desc`: `<status> <detail>`.
fn problem_desc(r: &crate::server::Response) -> String {
    let (status, detail) = refusal(r);
    format!("{status} {detail}")
}

/// The host of a URL (`http://host:port/...`), without brackets.
fn host_of(url: &str) -> Option<String> {
    let rest = url.split_once("://")?.1;
    let authority = rest.split('/').next()?;
    let host = match authority.rsplit_once(':') {
        Some((h, p)) if p.bytes().all(|b| b.is_ascii_digit()) => h,
        _ => authority,
    };
    Some(host.trim_start_matches('[').trim_end_matches(']').to_owned())
}

/// A stored name as the principal uses it (without its tenant's prefix).
fn local<'n>(who: &Principal, stored: &'n str) -> &'n str {
    match &who.tenant {
        Some(t) => stored.strip_prefix(t.as_str()).and_then(|n| n.strip_prefix('.')).unwrap_or(stored),
        None => stored,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_of_urls() {
        assert_eq!(host_of("http://10.0.0.7:8080").as_deref(), Some("10.0.0.7"));
        assert_eq!(host_of("https://broker.example/x").as_deref(), Some("broker.example"));
        assert_eq!(host_of("http://[::1]:8080").as_deref(), Some("::1"));
        assert_eq!(host_of("nowhere"), None);
    }

    #[test]
    fn the_announced_length_is_the_whole_frame() {
        let f = tcp::answer(Command::HeartbeatResponse, SUCCESS, "success", Some("1"));
        assert_eq!(announced(&f), Some(f.len()));
        assert_eq!(announced(&f[..16]), None);
        assert_eq!(announced(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n"), None, "not behind the magic");
    }
}
