//! What a WebSocket session's client says and what it is answered: the `ack` / `nack` /
//! `credit` messages of acknowledged delivery, and on any session `reply`, `chunk` and
//! `publish` messages, pings and closes. Shared by both session drivers: `lean` (a plain
//! socket, one task driven by readiness) and `ws` (TLS, a reader and a writer task).

use std::cell::Cell;
use std::rc::Rc;
use std::time::Duration;

use super::{Outbound, Publisher};
use crate::delivery::{group_ids, MAX_WINDOW};
use crate::model::delivery::{AckKind, ConsumerKey, SessionRef};
use crate::model::ReplyOutcome;
use crate::queue;
use crate::shard::calls::{session_key, ChunkBody};
use crate::shard::core::Shard;
use crate::shard::message::InterestChange;
use crate::shard::message::{SessionChange, SessionEvent};
use crate::shard::requests::Replier;
use crate::ws::{encode_frame, CloseCode, Message, OpCode};

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
pub(super) struct Replies {
    pub(super) shard: Rc<Shard>,
    /// Who replies: `None` for nobody in particular (`auth = none`, not an agent), as most
    /// idle sessions' is (boxed: the 56 bytes of a `Replier` are held only when they say something).
    replier: Option<Box<Replier>>,
    pub(super) publisher: Publisher,
}

impl Replies {
    pub(super) fn new(shard: Rc<Shard>, replier: Replier, publisher: Publisher) -> Replies {
        let anybody = replier.principal.is_none() && replier.tenant.is_none() && replier.agent.is_none();
        Replies { shard, replier: (!anybody).then(|| Box::new(replier)), publisher }
    }

    fn replier(&self) -> Replier {
        match &self.replier {
            Some(r) => Replier::clone(r),
            None => Replier { principal: None, tenant: None, agent: None },
        }
    }

    fn tenant(&self) -> Option<&str> {
        self.replier.as_ref()?.tenant.as_deref()
    }

    /// Hands one reply to its requester. Only a failure is answered, with a text frame
    /// `{"type":"error","id":<emcorrelationid>,"status":S,"detail":D}` (404: nobody waits for
    /// it; 403: the ACL; 400: not a valid CloudEvent), returned; the session goes on either way.
    async fn reply(&self, event: Option<&str>) -> Option<Vec<u8>> {
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
                let who = self.replier.as_ref().and_then(|r| r.principal.as_deref()).unwrap_or("anonymous");
                match self.shard.send_reply(frame, self.replier()).await {
                    Ok(ReplyOutcome::Delivered) => return None,
                    Ok(outcome) => {
                        if let ReplyOutcome::Denied { topic, rule } = &outcome {
                            let p = crate::governance::identity::Principal {
                                name: who.to_owned(),
                                tenant: self.tenant().map(str::to_owned),
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
        Some(error_frame(id, status, detail))
    }
}

impl Replies {
    /// Takes an agent's chunk frame `{"type":"chunk","sessionId":S,...}`. Only a failure is
    /// answered, as for replies (`id` the session id; 404 no such session, 403 another
    /// agent's, 409 no turn in progress, 429 streams too far behind, 400 malformed).
    fn chunk(&self, text: &str) -> Option<Vec<u8>> {
        let taken = || -> Result<(), (Option<String>, u16, String)> {
            let Some((agent, gen)) = self.replier.as_ref().and_then(|r| r.agent.as_deref()) else {
                return Err((None, 400, "chunk frames are sent on an agent's WebSocket (GET /agent/ws)".into()));
            };
            let body = ChunkBody::parse(text.as_bytes()).map_err(|m| (None, 400, m))?;
            let Some(sid) = body.session_id.as_deref() else {
                return Err((None, 400, "a chunk frame names its sessionId".into()));
            };
            let mut t = String::new();
            let c = body.chunk(&mut t).map_err(|m| (Some(sid.to_owned()), 400, m))?;
            let key = session_key(self.tenant(), sid);
            let now = crate::model::clock::now_ms();
            match self.shard.shared.calls.chunk(&key, (agent, Some(*gen)), &c, now) {
                Ok(_) => Ok(()),
                Err(r) => {
                    let (status, detail) = r.status();
                    Err((Some(sid.to_owned()), status, detail))
                }
            }
        };
        taken().err().map(|(id, status, detail)| error_frame(id, status, detail))
    }
}

/// The answer to a failed reply or chunk frame: `{"type":"error","id","status","detail"}`.
fn error_frame(id: Option<String>, status: u16, detail: String) -> Vec<u8> {
    let note = serde_json::json!({"type": "error", "id": id, "status": status, "detail": detail}).to_string();
    let mut out = Vec::with_capacity(note.len() + 4);
    encode_frame(OpCode::Text, true, note.as_bytes(), &mut out);
    out
}

/// Where an acknowledged session's control messages go. Dropped, it detaches the session
/// (`push::detach_acked`): whichever driver serves the session holds it to its end.
pub(super) struct AckedSession {
    pub(super) shard: Rc<Shard>,
    pub(super) consumer: ConsumerKey,
    pub(super) topic: String,
    pub(super) at: SessionRef,
}

impl Drop for AckedSession {
    fn drop(&mut self) {
        let consumer =
            std::mem::replace(&mut self.consumer, ConsumerKey { subscription: String::new(), client: String::new() });
        super::detach_acked(&self.shard, consumer, &self.topic, self.at);
    }
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

/// A live (`ack=none`) session's place in its shard's registry: dropped, it leaves it (and the
/// shard's interest in the subscription goes with its last session). Whichever driver serves
/// the session holds it to its end.
pub(super) struct Live {
    shard: Rc<Shard>,
    id: u64,
    subscription: String,
    topic: String,
    /// What the session's queue holds, in bytes.
    pub(super) queued: Rc<Cell<usize>>,
}

impl Live {
    /// Registers a live session of `subscription` on this shard; returns it and its queue.
    pub(super) fn add(shard: &Rc<Shard>, subscription: &str, topic: &str) -> (Box<Live>, queue::Receiver<Outbound>) {
        let (id, events, queued, first) = shard.sessions.add(subscription);
        if first {
            shard.shared.follow_topic(topic);
            shard.announce(subscription, topic, InterestChange::Attach);
        }
        let live =
            Live { shard: shard.clone(), id, subscription: subscription.to_owned(), topic: topic.to_owned(), queued };
        (Box::new(live), events)
    }
}

impl Drop for Live {
    fn drop(&mut self) {
        if self.shard.sessions.remove(&self.subscription, self.id) {
            self.shard.announce(&self.subscription, &self.topic, InterestChange::Detach);
        }
    }
}

/// Bytes gathered into one write when many frames are queued.
pub(super) const WRITE_BATCH: usize = 256 * 1024;
/// A write that makes no progress for this long means the client stopped reading: the session
/// ends (its queue would have closed it with 1008 anyway, but a blocked write never sees that).
pub(super) const WRITE_STALL: Duration = Duration::from_secs(10);

pub(super) fn close_bytes(code: u16, reason: &str) -> Vec<u8> {
    let mut payload = code.to_be_bytes().to_vec();
    payload.extend_from_slice(reason.as_bytes());
    let mut out = Vec::with_capacity(payload.len() + 2);
    encode_frame(OpCode::Close, true, &payload, &mut out);
    out
}

/// What a session does after one client message.
pub(super) enum Step {
    /// Nothing to send.
    Go,
    /// Send this frame (a pong, the answer to a publish, an error note).
    Send(Vec<u8>),
    /// Close the session with this code (after echoing a peer's close).
    Close(u16),
}

/// Acts on one whole client message, for either session driver (`lean` for plain sockets, `ws`'s
/// reader for TLS).
pub(super) async fn on_message(
    msg: Message,
    acked: Option<&AckedSession>,
    replies: &mut Replies,
    meter: &crate::task::Meter,
) -> Step {
    let text = match msg {
        Message::Ping(p) => {
            let mut out = Vec::with_capacity(p.len() + 2);
            encode_frame(OpCode::Pong, true, &p, &mut out);
            return Step::Send(out);
        }
        Message::Close(code, _) => return Step::Close(code.unwrap_or(CloseCode::NORMAL.0)),
        Message::Binary(_) => return Step::Close(CloseCode::UNSUPPORTED.0),
        Message::Pong(_) => return Step::Go,
        Message::Text(text) => text,
    };
    // A reply to a request or a publish, on any session; ack / nack / credit: meaningless for
    // ack=none sessions, followers and agents, which are not asked to parse them (an agent's
    // chunks would each be buffered whole by the tagged enum's parse first).
    let control = acked.map(|_| serde_json::from_str::<Control>(&text));
    let reply = match &control {
        Some(Ok(_)) => None,
        _ => {
            serde_json::from_str::<ReplyFrame>(&text).ok().filter(|r| matches!(&*r.kind, "reply" | "chunk" | "publish"))
        }
    };
    if reply.as_ref().is_some_and(|r| r.kind == "publish") {
        // Answered in order with the session's other frames; a publisher that does not read
        // its answers waits at its socket.
        let mut out = Vec::new();
        replies.publisher.publish(&text, &mut out).await;
        pay_heavy(&replies.shard, meter).await;
        return Step::Send(out);
    }
    if reply.as_ref().is_some_and(|r| r.kind == "chunk") {
        return replies.chunk(&text).map_or(Step::Go, Step::Send);
    }
    if let Some(r) = reply {
        // Boxed: its state (a cross-core ask) would otherwise sit in every idle session.
        return Box::pin(replies.reply(r.event.map(|e| e.get()))).await.map_or(Step::Go, Step::Send);
    }
    if let (Some(a), Some(control)) = (acked, control) {
        if let Err(code) = control.map_err(|_| CloseCode::POLICY).and_then(|c| a.control(c)) {
            return Step::Close(code.0);
        }
        // A client flooding acks waits here, at its own socket, for the control lane to drain,
        // and after a costly one for its turn.
        a.shard.control_room().await;
        pay_heavy(&a.shard, meter).await;
    }
    Step::Go
}

/// After a message that took over `task::HEAVY` of the core, waits the session's turn in the
/// heavy lane.
pub(crate) async fn pay_heavy(shard: &Shard, meter: &crate::task::Meter) {
    let cost = meter.take();
    if cost > crate::task::HEAVY {
        shard.shared.metrics.shard(shard.id).heavy(cost);
        crate::task::charge(cost);
        crate::task::turn().await;
    }
}

/// What ends a session early (see [`run`]), boxed: awaited by value inside another future, an
/// unboxed one would take room twice in every idle session.
pub(super) type Ends = std::pin::Pin<Box<dyn std::future::Future<Output = Option<&'static str>>>>;
