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
//!   ends the connection with SERVER_GOODBYE), and each listening subscription is watched by
//!   `push::authority` as a WebSocket session is. Before HELLO, another command is answered
//!   with code 1 ("no session is found") as EventMesh answers it; no HELLO within
//!   `header_read_timeout` closes the connection.
//! * HEARTBEAT: answered. A connection that sends no whole package for [`SILENCE`] (120 s; the
//!   SDKs send a heartbeat every 30 s) gets SERVER_GOODBYE and is closed.
//! * SUBSCRIBE (all its topics or none): each topic is the group's evmesh subscription (`cg.<len>.<group>.<topic>`, the
//!   one classic HTTP subscribers of the group share): `LOAD_BALANCE` for `CLUSTERING`,
//!   `BROADCAST` for `BROADCASTING` (each connection then a consumer of its own, from the
//!   moment it listens). LISTEN attaches the connection's subscriptions as sessions of
//!   acknowledged delivery (and those it subscribes later at once); UNSUBSCRIBE detaches all
//!   of them (the group's subscription and its offsets stay). Where a subscription's home is
//!   another instance (Kafka), the answer is REDIRECT_TO_CLIENT to it, then the close.
//! * Pushes (`shard::sessions::Kind::Tcp`): ASYNC_MESSAGE_TO_CLIENT, REQUEST_TO_CLIENT (a SYNC
//!   subscription, or a request event) or BROADCAST_MESSAGE_TO_CLIENT, `seq` =
//!   `<key>/<delivery id>` (`key`: the connection's subscription, never reused on it); the client's `*_TO_CLIENT_ACK` with that `seq` acks the delivery
//!   in evmesh's offsets. No ack within the subscription's `ackTimeoutMs` redelivers, then
//!   dead-letters, as for every transport.
//! * ASYNC_MESSAGE_TO_SERVER, BROADCAST_MESSAGE_TO_SERVER: publishes; those that came together
//!   are a round of `ws_publish::store_round` (the ACL, limits, quotas, backlog, transformer,
//!   routes, storage; one store), answered `*_ACK` once stored. REQUEST_TO_SERVER: a request on the request
//!   path (`Traffic::ask_and_wait`, its timeout the message's `ttl` extension in ms, else 3 s,
//!   at most `max_request_timeout_ms`), answered RESPONSE_TO_CLIENT with the reply or a code 1;
//!   requests wait concurrently, at most [`MAX_WAITING`] per connection. RESPONSE_TO_SERVER:
//!   a reply (its `emcorrelationid` extension, copied back from the REQUEST_TO_CLIENT).
//! * CLIENT_GOODBYE: answered, then closed. RECOMMEND: this instance's TCP address.
//! * A frame that is not EventMesh's (magic, version, lengths, a header that is not JSON or
//!   names no command), past `max_body_bytes` + 64 KiB, or with a header past 64 KiB:
//!   SERVER_GOODBYE with code 1 saying why, then the close. Answers are bounded whatever the
//!   request carried (`adaptor::eventmesh_tcp::answer`). A command the bridge does not serve: answered with code 1.
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
/// Publishes stored together at most (and `max_body_bytes` of them).
const MAX_ROUND: usize = super::ws_publish::MAX_ROUND;
/// Subscriptions one connection may hold.
pub const MAX_SUBSCRIPTIONS: usize = 64;
/// A request's timeout when its message has no `ttl` (EventMesh's default).
const DEFAULT_TTL: Duration = Duration::from_secs(3);
/// Bytes one read takes at most.
const READ_CHUNK: usize = 16 * 1024;
/// Answers and pushes waiting for the writer.
const OUT_QUEUE: usize = 256;
/// The largest header taken (its properties become attributes), and the room for one past
/// `max_body_bytes` in a frame.
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
        next_key: 0,
        listening: false,
        wire: 0,
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
    key: u32,
    item: Subscribed,
    /// The subscription's stored name, and its topic's.
    name: String,
    topic: String,
    /// While listening: its session of acknowledged delivery, and the flag that tells its
    /// forwarder the connection detached it (else the end of its queue is the shard's).
    attached: Option<(ConsumerKey, SessionRef, Rc<Cell<bool>>)>,
}

struct Conn {
    traffic: Rc<Traffic>,
    caller: Caller,
    peer: SocketAddr,
    hello: Option<Hello>,
    /// The subscribed topics, each with its key (the `<key>/` of its pushes' `seq`: never
    /// reused on the connection, so an old push's ack cannot reach a later subscription).
    subs: Vec<Sub>,
    next_key: u32,
    listening: bool,
    /// The bytes of the package being handled (header and body).
    wire: usize,
    out: queue::Sender<Outbound>,
    /// Requests waiting for their replies.
    waiting: Rc<Cell<usize>>,
    ended: Shared<futures::channel::oneshot::Receiver<()>>,
}

/// A publish package: its header, its body, and its bytes on the wire (header and body).
type Publish = (Header, Vec<u8>, usize);
/// Consecutive publishes gathered, and their bytes.
type Round = (Vec<Publish>, usize);

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
        let max_round_bytes = self.traffic.shard.shared.config.limits.max_body_bytes;
        // Consecutive publishes, and their bytes.
        let mut round: Round = (Vec::new(), 0);
        loop {
            // Every whole package already read, one at a time (consecutive publishes together).
            loop {
                // What breaks the protocol ends the connection, after the publishes before it.
                let broken = match announced_header(&buf).filter(|&h| h > HEADER_ROOM) {
                    Some(h) => Some(format!("a header of {h} bytes, past this broker's {HEADER_ROOM}")),
                    None => announced(&buf).filter(|&n| n > max_frame).map(|frame| {
                        format!("a frame of {frame} bytes, past this broker's {max_frame} (max_body_bytes + 64 KiB)")
                    }),
                };
                let decoded = match broken {
                    Some(why) => Err(why),
                    None => tcp::decode(&buf).map_err(|e| e.to_string()),
                };
                let (pkg, used) = match decoded {
                    Ok(Some(p)) => p,
                    Ok(None) => {
                        if let Next::Close = self.flush_round(&mut round, meter).await {
                            return None;
                        }
                        break;
                    }
                    Err(why) => {
                        if let Next::Go = self.flush_round(&mut round, meter).await {
                            self.goodbye(FAIL, &why);
                        }
                        return None;
                    }
                };
                buf.drain(..used);
                last = Instant::now();
                let Some(header) = pkg.header else {
                    if let Next::Go = self.flush_round(&mut round, meter).await {
                        self.goodbye(FAIL, "the incoming message does not have a header");
                    }
                    return None;
                };
                // Publishes that came together are stored together: a round (see `publish_round`).
                let publish = matches!(header.cmd, Command::AsyncMessageToServer | Command::BroadcastMessageToServer);
                // What the limits count: the header (its properties become attributes) and body.
                self.wire = used - tcp::FIXED;
                if publish && self.hello.is_some() {
                    round.1 += self.wire;
                    round.0.push((header, pkg.body, self.wire));
                    if round.0.len() >= MAX_ROUND || round.1 >= max_round_bytes {
                        if let Next::Close = self.flush_round(&mut round, meter).await {
                            return None;
                        }
                    }
                    continue;
                }
                if let Next::Close = self.flush_round(&mut round, meter).await {
                    return None;
                }
                turns += 1;
                if turns % crate::task::TURN == 0 {
                    crate::task::yield_now().await;
                }
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

    /// Publishes the gathered round, if any (see [`Conn::publish_round`]); a credential no
    /// longer valid refuses them and ends the connection as for any package.
    async fn flush_round(&mut self, round: &mut Round, meter: &crate::task::Meter) -> Next {
        if round.0.is_empty() {
            return Next::Go;
        }
        let pkgs = std::mem::take(&mut round.0);
        let full = pkgs.len() >= MAX_ROUND || round.1 >= self.traffic.shard.shared.config.limits.max_body_bytes;
        round.1 = 0;
        if let Next::Close = self.publish_round(pkgs).await {
            return Next::Close;
        }
        crate::push::pay_heavy(&self.traffic.shard, meter).await;
        if full {
            // More may be buffered: other work on the core first.
            crate::task::yield_now().await;
        }
        Next::Go
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
        match header.cmd {
            Command::HelloRequest => return self.hello(&header, &body).await,
            Command::RecommendRequest if self.hello.is_none() => {
                let here = self.recommend();
                let bytes = tcp::encode(
                    &Header::new(Command::RecommendResponse, SUCCESS, Some("success"), header.seq.as_deref()),
                    here.as_bytes(),
                )
                .unwrap_or_default();
                self.send(bytes).await;
                return Next::Go;
            }
            _ => {}
        }
        if self.hello.is_none() {
            self.answer(&header, FAIL, "no session is found (HELLO_REQUEST first)").await;
            return Next::Go;
        }
        // Each package is authenticated again, as each request of a keep-alive connection (the
        // sessions watch the credential and the ACL themselves: `forward`).
        if let Err(why) = self.still_allowed() {
            self.answer(&header, FAIL, &why).await;
            let bye = tcp::answer(Command::ServerGoodbyeRequest, FAIL, &why, None);
            self.send(bye).await;
            return Next::Close;
        }
        match header.cmd {
            Command::HeartbeatRequest => self.answer(&header, SUCCESS, "success").await,
            Command::RecommendRequest => {
                let here = self.recommend();
                let h = Header::new(Command::RecommendResponse, SUCCESS, Some("success"), header.seq.as_deref());
                self.send(tcp::encode(&h, here.as_bytes()).unwrap_or_default()).await;
            }
            Command::ClientGoodbyeRequest => {
                self.answer(&header, SUCCESS, "success").await;
                return Next::Close;
            }
            Command::SubscribeRequest => return self.subscribe(&header, &body).await,
            Command::UnsubscribeRequest => {
                self.detach_all();
                self.subs.clear();
                self.answer(&header, SUCCESS, "success").await;
            }
            Command::ListenRequest => return self.listen(&header).await,
            Command::AsyncMessageToServer | Command::BroadcastMessageToServer => {
                let wire = self.wire;
                return self.publish_round(vec![(header, body, wire)]).await;
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

    /// The credential still verifies and has not expired.
    fn still_allowed(&mut self) -> Result<(), String> {
        let hello = self.hello.as_ref().expect("after HELLO");
        let traffic = self.traffic.clone();
        let snap = traffic.view.current(&traffic.shard.shared.governance);
        traffic
            .authenticate(&mut self.caller, &snap, "tcp", hello.token.as_deref())
            .map(|_| ())
            .map_err(|r| problem_desc(&r))
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

    /// ASYNC_MESSAGE_TO_SERVER, BROADCAST_MESSAGE_TO_SERVER packages that came together, as
    /// WebSocket publishes that came in one read are (`ws_publish::store_round`): each message
    /// read and checked as a publish of its own, consecutive ones to the same topic stored
    /// together; answered in order, `*_ACK` with each one's `seq`, in one write.
    async fn publish_round(&mut self, pkgs: Vec<Publish>) -> Next {
        let traffic = self.traffic.clone();
        let m = traffic.shard.shared.metrics.shard(traffic.shard.id);
        let started = crate::task::clock::fresh();
        let mut done: Vec<Result<(), String>> = Vec::with_capacity(pkgs.len());
        let (refused, unauthenticated) = match self.still_allowed() {
            Err(why) => (Some(why), true),
            Ok(()) if traffic.shard.shared.memory.shed_now() => (Some(problem_desc(&super::gate::shed())), false),
            Ok(()) => (None, false),
        };
        let max = traffic.shard.shared.config.limits.max_body_bytes;
        let msgs: Vec<Result<Message<'_>, String>> = pkgs
            .iter()
            .map(|(h, body, _)| {
                if let Some(why) = &refused {
                    return Err(why.clone());
                }
                if body.len() > max {
                    return Err(format!("413 the message is larger than max_body_bytes ({max})"));
                }
                let msg = Message::parse(h, body).map_err(|e| format!("400 {e}"))?;
                if msg.topic().is_empty() {
                    return Err("400 a CloudEvent sent over TCP names its topic as its subject".into());
                }
                Ok(msg)
            })
            .collect();
        let now = crate::model::clock::now_micros();
        let mut i = 0;
        while i < msgs.len() {
            let named = match &msgs[i] {
                Err(why) => {
                    m.publish_requests.inc();
                    m.publish_errors.inc();
                    done.push(Err(why.clone()));
                    i += 1;
                    continue;
                }
                Ok(msg) => msg.topic(),
            };
            // The run of messages to the same topic.
            let end = (i..msgs.len()).find(|&j| !matches!(&msgs[j], Ok(m) if m.topic() == named)).unwrap_or(msgs.len());
            let mut gate = self.gate();
            match traffic.topic_named(&mut gate, Cow::Borrowed(named), Action::Publish, None) {
                Err(r) => {
                    let why = problem_desc(&r);
                    m.publish_requests.add((end - i) as u64);
                    m.publish_errors.add((end - i) as u64);
                    done.extend((i..end).map(|_| Err(why.clone())));
                }
                Ok(topic) => {
                    let parsed: Vec<super::ws_publish::Parsed> = (i..end)
                        .map(|j| {
                            let (h, _, wire) = &pkgs[j];
                            let msg = msgs[j].as_ref().expect("in the run");
                            let mut f = msg.to_frame(h, &topic).map_err(|e| (400, e))?;
                            f.set_timestamp(now);
                            Ok((f, *wire))
                        })
                        .collect();
                    let outcomes = super::ws_publish::store_round(&traffic, &mut gate, &topic, parsed).await;
                    done.extend(outcomes.into_iter().map(|o| o.map(|_| ()).map_err(|(s, d)| format!("{s} {d}"))));
                }
            }
            i = end;
        }
        let us = crate::task::clock::micros_since(started);
        let mut answers = Vec::with_capacity(pkgs.len() * 160);
        for ((h, ..), result) in pkgs.iter().zip(&done) {
            m.publish_latency.record_us(us);
            let (code, desc) = match result {
                Ok(()) => (SUCCESS, "success"),
                Err(why) => (FAIL, why.as_str()),
            };
            answers.extend_from_slice(&tcp::answer(tcp::answer_to(h.cmd), code, desc, h.seq.as_deref()));
        }
        self.send(answers).await;
        if unauthenticated {
            // As for any package: the credential no longer valid ends the connection.
            let why = refused.unwrap_or_default();
            self.goodbye(FAIL, &why);
            return Next::Close;
        }
        Next::Go
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
            // A ttl past u64 is as long as may be (the cap below).
            let ttl = frame.body().attr_str("ttl").and_then(|t| match t.parse::<u64>() {
                Ok(t) => Some(t),
                Err(_) => (!t.is_empty() && t.bytes().all(|b| b.is_ascii_digit())).then_some(u64::MAX),
            });
            let ttl = ttl.filter(|&t| t > 0);
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
        let bytes = self.wire;
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

    /// A push's ack: its `seq` names the subscription (its key) and the delivery.
    fn ack(&mut self, header: &Header) -> Result<(), String> {
        let seq = header.seq.as_deref().unwrap_or_default();
        let bad = || format!("{seq:?} is not the seq of a push to this connection");
        let (key, id) = seq.split_once('/').ok_or_else(bad)?;
        let key: u32 = key.parse().map_err(|_| bad())?;
        // A subscription since unsubscribed: nothing to ack (its events went to others).
        let Some(sub) = self.subs.iter().find(|s| s.key == key) else { return Ok(()) };
        let Some((consumer, ..)) = &sub.attached else { return Ok(()) };
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
        if self.traffic.shard.shared.memory.shed_now() {
            self.answer(header, FAIL, &problem_desc(&super::gate::shed())).await;
            return Next::Go;
        }
        // All of them or none: a failure part-way takes back the ones this package added.
        let before = self.subs.len();
        let rollback = |conn: &mut Conn| {
            for mut sub in conn.subs.drain(before..) {
                if let Some((consumer, at, detached)) = sub.attached.take() {
                    detached.set(true);
                    crate::push::detach_acked(&conn.traffic.shard, consumer, &sub.topic, at);
                }
            }
        };
        for item in items {
            match self.subscribe_one(item).await {
                Ok(None) => {}
                Ok(Some(home)) => {
                    rollback(self);
                    // Served by another instance: tell the client where, then close.
                    self.answer(header, FAIL, &format!("307 this subscription is served by its home instance {home}"))
                        .await;
                    let port = self.traffic.shard.shared.config.tcp_listen.map_or(0, |a| a.port());
                    let ip = host_of(&home).unwrap_or_default();
                    self.send(tcp::redirect(&ip, port)).await;
                    return Next::Close;
                }
                Err(desc) => {
                    rollback(self);
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
        if self.subs.iter().any(|s| s.name == name) {
            // Subscribed already: as EventMesh, the first mode and type stay.
            return Ok(None);
        }
        if self.subs.len() >= MAX_SUBSCRIPTIONS {
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
        let key = self.next_key;
        self.next_key = self.next_key.wrapping_add(1);
        self.subs.push(Sub { key, item, name, topic, attached: None });
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
        if self.traffic.shard.shared.memory.shed_now() {
            self.answer(header, FAIL, &problem_desc(&super::gate::shed())).await;
            return Next::Go;
        }
        // The ACL as it is now (it may have changed since SUBSCRIBE).
        let names: Vec<String> = self.subs.iter().map(|s| s.name.clone()).collect();
        for name in names {
            let who = self.hello.as_ref().expect("after HELLO").who.clone();
            let mut gate = self.gate();
            if let Err(r) = gate.allow(Action::Subscribe, Kind::Subscription, local(&who, &name)) {
                self.answer(header, FAIL, &problem_desc(&r)).await;
                return Next::Go;
            }
        }
        self.listening = true;
        for i in 0..self.subs.len() {
            self.attach(i);
        }
        self.answer(header, SUCCESS, "success").await;
        Next::Go
    }

    /// Attaches the `i`th subscription as a session of acknowledged delivery, its pushes
    /// forwarded to the writer, and ended (with the connection) once the credential expires or
    /// is revoked, or the ACL no longer lets the principal read it (`push::authority`, as a
    /// WebSocket session).
    fn attach(&mut self, i: usize) {
        let hello = self.hello.as_ref().expect("after HELLO");
        let shard = self.traffic.shard.clone();
        let Some(sub) = self.subs.get_mut(i) else { return };
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
            credential: principal
                .is_some()
                .then(|| hello.token.clone().map(crate::server::upgrade::Credential))
                .flatten(),
            principal,
            tenant: hello.who.tenant.clone(),
            expires_us: hello.who.expires_us,
        };
        let push = match (sub.item.broadcasting, sub.item.sync) {
            (true, _) => TcpPush::Broadcast,
            (false, true) => TcpPush::Sync,
            (false, false) => TcpPush::Async,
        };
        let kind = SessionKind::Tcp { push, key: sub.key };
        let (events, consumer, at) = crate::push::attach_acked(&shard, &spec, kind);
        let detached = Rc::new(Cell::new(false));
        sub.attached = Some((consumer, at, detached.clone()));
        monoio::spawn(forward(events, self.out.clone(), (shard, spec), detached));
    }

    /// Detaches every attached subscription (their unacknowledged events go to the
    /// subscriptions' other sessions).
    fn detach_all(&mut self) {
        for sub in self.subs.iter_mut() {
            if let Some((consumer, at, detached)) = sub.attached.take() {
                detached.set(true);
                crate::push::detach_acked(&self.traffic.shard, consumer, &sub.topic, at);
            }
        }
    }
}

/// Moves a subscription's pushes to the connection's writer until the connection detaches the
/// session. Anything else that ends it ends the connection with SERVER_GOODBYE saying why: a
/// close from the shard (the subscription removed, its home moved), its queue closed by the
/// shard (too far behind), or `push::authority` (the credential expired or revoked, the ACL
/// no longer allowing SUBSCRIBE).
async fn forward(
    mut events: queue::Receiver<Outbound>,
    mut out: queue::Sender<Outbound>,
    (shard, spec): (Rc<crate::shard::core::Shard>, SessionSpec),
    detached: Rc<Cell<bool>>,
) {
    let mut ends = std::pin::pin!(async { crate::push::authority(&shard, &spec).await });
    let why = loop {
        let next = std::pin::pin!(events.recv());
        match select(next, ends.as_mut()).await {
            Either::Left((Some(Outbound::Frame(bytes)), _)) => {
                if out.send(Outbound::Frame(bytes)).await.is_err() {
                    return;
                }
            }
            Either::Left((Some(Outbound::Close(code, reason)), _)) => {
                break match reason {
                    "" => format!("the subscription's session ended ({code})"),
                    r => r.to_owned(),
                };
            }
            Either::Left((None, _)) if detached.get() => return,
            Either::Left((None, _)) => break "the subscription's session fell too far behind".to_owned(),
            Either::Right((why, _)) => break why.to_owned(),
        }
    };
    let bye = tcp::answer(Command::ServerGoodbyeRequest, FAIL, &why, None);
    let _ = out.send_past_bound(Outbound::Frame(Rc::new(bye)));
    let _ = out.send_past_bound(Outbound::Close(0, ""));
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

/// The header length the buffered bytes announce, once its field is in (behind the magic).
fn announced_header(buf: &[u8]) -> Option<usize> {
    announced(buf)?;
    let len = buf.get(tcp::PREFIX + 4..tcp::FIXED)?;
    usize::try_from(i32::from_be_bytes(len.try_into().expect("4 bytes"))).ok()
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
