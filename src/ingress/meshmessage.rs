//! Classic EventMesh HTTP (MeshMessage) on the traffic listener (SPEC, "Other protocols"): a
//! POST whose path is none of evmesh's own, dispatched on its `code` header (the classic SDKs
//! post to `/`), and `POST /eventmesh/publish` (a send) and `/eventmesh/publish/batch` (a
//! batch). Sends go through the one ingress path as [`ClassicSend`] adaptors; every answer is
//! HTTP 200 with `{"retCode","retMsg","resTime"}` (the conversions are
//! `evmesh_protocol::adaptor::meshmessage`).
//!
//! Built: 104 (send), 107 (one message of a batch), 102 (a batch, each message through the
//! ingress in turn; a failure stops it and is answered, the messages before it stay stored),
//! 101 (sync send: a request-reply whose timeout is `ttl`, answered with the reply in `retMsg`
//! as the Java SDK reads it), 203 (heartbeat: answered, nothing to keep), 206/207 and the
//! `/eventmesh/(un)subscribe/local` routes (a consumer group's topic as an evmesh subscription,
//! each push `url` served by `push::webhook`). 301 (reply): `bizseqno`, `uniqueid`, `content` and the request's
//! `emcorrelationid` in `extFields` (a push of the request carries it there) go to the waiting
//! requester as a reply, answered 0, or 16 when nobody waits for it. Any other code is HTTP 400 with retCode 2, as EventMesh answers.
//! Every request but the JSON `/eventmesh/(un)subscribe/local` needs the client headers (`idc`,
//! `sys`, a numeric `pid`; retCode 6 before anything is read or stored), on a path route too.
//! `producergroup` is accepted and ignored; `username`/`passwd` are not credentials here (with
//! `auth` on, a classic client sends `Authorization: Bearer`).

use std::borrow::Cow;

use frame_codec::Frame;

use super::adaptor::{FrameAdaptor, Placed, Publish, Refusal, To};
use super::gate::{shed, Gate, Quotaed};
use super::request::Waited;
use super::Traffic;
use crate::adaptor::meshmessage::{self, code, ret, Form, Message, Refused};
use crate::governance::acl::Action;
use crate::http::{Method, StatusCode};
use crate::model::valid_topic;
use crate::server::{Request, Response};
use crate::shard::message::{InterestChange, SubOutcome, SubRequest};
use crate::shard::requests::Replier;
use crate::subscription::definition::Definition;

/// Messages one 102 batch may carry (EventMesh's `maxEventBatchSize` default).
const MAX_BATCH: usize = 10;

/// Push URLs one classic subscription may have (one webhook session each).
pub const MAX_PUSH_URLS: usize = 16;

/// The path routes `/eventmesh/subscribe/local` and `/eventmesh/unsubscribe/local` (JSON
/// bodies), dispatched as these codes (no classic code is this large).
const LOCAL_SUBSCRIBE: u16 = 60_206;
const LOCAL_UNSUBSCRIBE: u16 = 60_207;

/// The evmesh subscription of a consumer group's topic: `cg.<length of the group>.<group>.<topic>`
/// (the length keeps `a.b` + `c` apart from `a` + `b.c`).
pub fn group_subscription(group: &str, topic: &str) -> String {
    format!("cg.{}.{group}.{topic}", group.len())
}

/// The classic answer envelope, HTTP 200 (`status` 400 for an unknown code, as EventMesh).
fn answer(status: StatusCode, ret: u16, msg: &str) -> Response {
    let now_ms = crate::model::clock::now_micros() / 1000;
    Response::json(status, meshmessage::answer(ret, msg, now_ms))
}

fn refused(r: &Refused) -> Response {
    answer(StatusCode::OK, r.ret, &r.msg)
}

/// The classic answer to the ingress's refusal `problem`: its status as a retCode, its detail
/// as `retMsg`, and its `Retry-After` kept (429, 503) so a classic client need not guess.
fn from_problem(problem: &Response, sync: bool) -> Response {
    let (status, detail) = super::ws_publish::refusal(problem);
    let a = answer(StatusCode::OK, meshmessage::ret_for_status(status, sync), &detail);
    match problem.headers.iter().find(|(n, _)| n.eq_ignore_ascii_case("retry-after")) {
        Some((_, v)) => a.with_header("retry-after", v.clone()),
        None => a,
    }
}

/// One classic message's publish (104, 107, one of a 102 batch, `/eventmesh/publish`).
struct ClassicSend<'f> {
    message: Message<'f>,
}

impl FrameAdaptor for ClassicSend<'_> {
    fn frames(&self, to: &To<'_>, _req: &Request<'_>) -> Result<Vec<Frame>, Refusal> {
        self.message.to_frame(to.topic).map(|f| vec![f]).map_err(|r| Refusal::Answered(refused(&r)))
    }

    fn refused(&self, problem: Response) -> Response {
        from_problem(&problem, false)
    }

    fn bytes(&self, _req: &Request<'_>) -> u64 {
        self.message.content.len() as u64
    }
}

impl Publish for ClassicSend<'_> {
    fn topic<'r>(&self, _req: &Request<'r>) -> Result<Cow<'r, str>, Refusal> {
        Ok(Cow::Owned(self.message.topic.to_owned()))
    }

    fn accepted(&self, placed: &[Placed]) -> Response {
        let p = &placed[0];
        // EventMesh answers "success" followed by its send result; the partition and offset
        // are evmesh's.
        answer(StatusCode::OK, ret::SUCCESS, &format!("success partition={} offset={}", p.partition, p.offset))
    }
}

impl Traffic {
    /// A classic request: `POST /eventmesh/publish[/batch]`, or any other path with a `code`.
    pub(super) async fn meshmessage(&self, gate: &mut Gate<'_>, req: &Request<'_>) -> Response {
        if req.method() != Method::Post {
            return answer(StatusCode::METHOD_NOT_ALLOWED, ret::REQUEST_CODE_INVALID, "classic requests are POSTs")
                .with_header("allow", "POST");
        }
        let code = match req.path() {
            "/eventmesh/publish" => Some(code::SEND_ASYNC),
            "/eventmesh/publish/batch" => Some(code::BATCH),
            "/eventmesh/subscribe/local" => Some(LOCAL_SUBSCRIBE),
            "/eventmesh/unsubscribe/local" => Some(LOCAL_UNSUBSCRIBE),
            _ => req.header("code").and_then(|c| std::str::from_utf8(c).ok()?.trim().parse::<u16>().ok()),
        };
        let path_route = matches!(req.path(), "/eventmesh/publish" | "/eventmesh/publish/batch");
        let checked = || -> Result<Form, Refused> {
            // Every send carries the client headers, whatever its path (SPEC): EventMesh's path
            // routes fill in the server's own defaults, which hides a misconfigured producer.
            meshmessage::check_client(|name| req.header(name))?;
            let json = req
                .header("content-type")
                .is_some_and(|ct| ct.windows(16).any(|w| w.eq_ignore_ascii_case(b"application/json")));
            if path_route && json {
                Form::from_json(req.body)
            } else {
                Form::parse(req.body)
            }
        };
        match code {
            Some(c @ (code::SEND_ASYNC | code::BATCH_V2)) => {
                if let Err(r) = meshmessage::check_protocol_type(req.header("protocoltype")) {
                    return refused(&r);
                }
                let form = match checked() {
                    Ok(f) if c == code::BATCH_V2 => meshmessage::batch_v2(&f),
                    Ok(f) => f,
                    Err(r) => return refused(&r),
                };
                match Message::from_form(&form, false) {
                    Ok(message) => self.publish_with(&ClassicSend { message }, gate, req).await,
                    Err(r) => refused(&r),
                }
            }
            Some(code::BATCH) => {
                let messages = match checked().and_then(|f| meshmessage::batch(&f, MAX_BATCH)) {
                    Ok(m) => m,
                    Err(r) => return refused(&r),
                };
                let n = messages.len();
                // Every message is read, and its topic checked and allowed, before any is
                // stored: a malformed or forbidden one refuses the whole batch.
                let mut sends = Vec::with_capacity(n);
                for (_, form) in &messages {
                    let message = match Message::from_form(form, false) {
                        Ok(m) => m,
                        Err(r) => return refused(&r),
                    };
                    let checked = self
                        .topic_named(gate, Cow::Borrowed(message.topic), Action::Publish, Some(req))
                        .map_err(|p| from_problem(&p, false))
                        .and_then(|t| message.to_frame(&t).map_err(|r| refused(&r)));
                    if let Err(a) = checked {
                        return a;
                    }
                    sends.push(ClassicSend { message });
                }
                for adaptor in &sends {
                    match Box::pin(self.ingest(adaptor, gate, req)).await {
                        Ok(_) => {}
                        Err(Refusal::Answered(a)) => return a,
                        Err(Refusal::Problem(p) | Refusal::Busy(p)) => return adaptor.refused(p),
                    }
                }
                answer(StatusCode::OK, ret::SUCCESS, &format!("success: {n} messages"))
            }
            Some(code::HEARTBEAT) => match checked() {
                Ok(_) => answer(StatusCode::OK, ret::SUCCESS, "success"),
                Err(r) => refused(&r),
            },
            Some(code::SEND_SYNC) => {
                if let Err(r) = meshmessage::check_protocol_type(req.header("protocoltype")) {
                    return refused(&r);
                }
                let form = match checked() {
                    Ok(f) => f,
                    Err(r) => return refused(&r),
                };
                match Message::from_form(&form, true) {
                    Ok(message) => Box::pin(self.sync_send(gate, req, message)).await,
                    Err(r) => refused(&r),
                }
            }
            Some(code::REPLY) => {
                let form = match checked() {
                    Ok(f) => meshmessage::reply(&f),
                    Err(r) => return refused(&r),
                };
                let frame = match Message::from_form(&form, false).and_then(|m| m.to_frame("")) {
                    Ok(f) => f,
                    Err(r) => return refused(&r),
                };
                let replier = Replier { principal: gate.principal(), tenant: gate.who.tenant.clone(), agent: None };
                match self.shard.send_reply(frame, replier).await {
                    Ok(outcome) => match outcome.status(&gate.who.name) {
                        (202, _) => answer(StatusCode::OK, ret::SUCCESS, "success"),
                        (_, detail) => {
                            answer(StatusCode::OK, ret::REPLY_ERR, &format!("eventMesh reply msg err, {detail}"))
                        }
                    },
                    Err(e) => answer(StatusCode::OK, ret::REPLY_ERR, &format!("eventMesh reply msg err, {e}")),
                }
            }
            Some(c @ (code::SUBSCRIBE | code::UNSUBSCRIBE)) => {
                let unsubscribe = c == code::UNSUBSCRIBE;
                match checked().and_then(|f| meshmessage::subscribe(&f, unsubscribe)) {
                    Ok(s) => Box::pin(self.classic_subscribe(gate, s, unsubscribe)).await,
                    Err(r) => refused(&r),
                }
            }
            Some(LOCAL_SUBSCRIBE | LOCAL_UNSUBSCRIBE) => {
                let unsubscribe = code == Some(LOCAL_UNSUBSCRIBE);
                match meshmessage::subscribe_json(req.body, unsubscribe) {
                    Ok(s) => Box::pin(self.classic_subscribe(gate, s, unsubscribe)).await,
                    Err(r) => refused(&r),
                }
            }
            _ => answer(
                StatusCode::BAD_REQUEST,
                ret::REQUEST_CODE_INVALID,
                "requestCode can't be null, or must be number",
            ),
        }
    }
}

impl Traffic {
    /// A classic subscribe (206, `/eventmesh/subscribe/local`) or unsubscribe (207,
    /// `/eventmesh/unsubscribe/local`). Each topic of a consumer group is an evmesh
    /// subscription ([`group_subscription`]: `LOAD_BALANCE` for `CLUSTERING`, `BROADCAST` for
    /// `BROADCASTING`) and each `url` a push registration of it, served by a webhook session
    /// (`push::webhook`): the URLs of a clustering group share its events (partitions spread
    /// over them), a broadcasting group's URLs each get all of them. An unsubscribe removes the
    /// URL; the group's subscription goes with its last URL.
    async fn classic_subscribe(&self, gate: &mut Gate<'_>, s: meshmessage::Subscribe, unsubscribe: bool) -> Response {
        let err = |m: String| answer(StatusCode::OK, ret::SUBSCRIBE_ERR, &m);
        if crate::server::client::Url::parse(&s.url).is_err()
            || s.url.len() > crate::subscription::definition::MAX_SINK_BYTES
        {
            return answer(
                StatusCode::OK,
                ret::BODY_ERR,
                &format!("eventMesh protocol[body] error invalid URL: {}", s.url),
            );
        }
        if !valid_topic(&s.group) {
            return answer(
                StatusCode::OK,
                ret::BODY_ERR,
                "eventMesh protocol[body] error: consumerGroup is [A-Za-z0-9._-]",
            );
        }
        for item in &s.items {
            let local = group_subscription(&s.group, &item.topic);
            let checked = self.topic_named(gate, Cow::Borrowed(&item.topic), Action::Subscribe, None).and_then(|t| {
                gate.allow(Action::Subscribe, crate::governance::acl::Kind::Subscription, &local)?;
                Ok((t.into_owned(), gate.scoped(&local)?.into_owned()))
            });
            let (topic, name) = match checked {
                Ok(x) => x,
                Err(p) => return from_problem(&p, false),
            };
            let done = match unsubscribe {
                true => self.classic_unsubscribe_one(&name, &topic, &s.url).await,
                false => self.classic_subscribe_one(gate, item, &s.url, name, topic).await,
            };
            if let Err(m) = done {
                return err(m);
            }
        }
        answer(StatusCode::OK, ret::SUCCESS, "success")
    }

    async fn classic_subscribe_one(
        &self,
        gate: &mut Gate<'_>,
        item: &meshmessage::SubscriptionItem,
        url: &str,
        name: String,
        topic: String,
    ) -> Result<(), String> {
        use crate::storage::meta::{self, Policy};
        let db = &self.shard.shared.db;
        self.group_subscription_made(gate, (&name, &topic), item.broadcasting(), true).await?;
        let pushes = crate::push::webhook::pushes_of(db, &name);
        // BROADCASTING: each URL its own consumer, named after the URL (stable across restarts).
        let client = match item.broadcasting() {
            true => {
                let digest = <sha2::Sha256 as sha2::Digest>::digest(url.as_bytes());
                format!("push-{}", digest.iter().take(8).map(|b| format!("{b:02x}")).collect::<String>())
            }
            false => String::new(),
        };
        let push = crate::push::webhook::ClassicPush {
            subscription: name.clone(),
            topic: item.topic.clone(),
            url: url.to_owned(),
            sync: item.sync(),
            client,
            created_us: crate::model::clock::now_micros(),
        };
        match pushes.iter().find(|p| p.url == url) {
            Some(p) if p.sync == push.sync && p.client == push.client => return Ok(()),
            Some(_) => {}
            None if pushes.len() >= MAX_PUSH_URLS => {
                return Err(format!("{name} has {MAX_PUSH_URLS} push URLs; unsubscribe one first"))
            }
            None => {}
        }
        meta::put_policy(db, Policy::Push, &push.id(), &push).map_err(|e| e.to_string())?;
        self.shard.announce(&name, &topic, InterestChange::Pushes);
        Ok(())
    }

    /// Makes a classic group's subscription `name` (its stored name) of `topic` if it does
    /// not exist: `BROADCAST` for a broadcasting group, else `LOAD_BALANCE`; `pushed`: for
    /// its push URLs (`classic`: one event per partition at a time, as a webhook's), else for
    /// TCP clients' sessions (their windows), which also take the group's subscription as the
    /// HTTP side made it. The tenant's quotas and `max_subscriptions` apply. `Err` (in words)
    /// if it cannot be made, or exists with the other mode.
    pub(super) async fn group_subscription_made(
        &self,
        gate: &mut Gate<'_>,
        (name, topic): (&str, &str),
        broadcasting: bool,
        pushed: bool,
    ) -> Result<(), String> {
        let mode = if broadcasting { "BROADCAST" } else { "LOAD_BALANCE" };
        if !pushed {
            let db = &self.shard.shared.db;
            match crate::storage::meta::get_subscription(db, name) {
                Ok(Some(d))
                    if d.topic == topic
                        && (d.mode == crate::subscription::definition::Mode::Broadcast) == broadcasting =>
                {
                    return Ok(())
                }
                Ok(_) => {}
                Err(e) => return Err(e.to_string()),
            }
        }
        let body = serde_json::json!({"subscription": name, "topic": topic, "mode": mode});
        let mut def = Definition::parse(body.to_string().as_bytes())?;
        def.created_us = crate::model::clock::now_micros();
        def.classic = pushed;
        gate.quota(Quotaed::Topic, topic)
            .and_then(|()| gate.quota(Quotaed::Subscription, name))
            .map_err(|p| super::ws_publish::refusal(&p).1)?;
        self.shard.topic(topic, None, false).await.map_err(|e| e.to_string())?;
        match self.shard.subscription(SubRequest::Create(def)).await {
            Ok(SubOutcome::Created | SubOutcome::Unchanged) => Ok(()),
            Ok(SubOutcome::Limit) => Err("max_subscriptions subscriptions exist".into()),
            Ok(_) => Err(format!("{name} exists with another mode; unsubscribe its clients first")),
            Err(e) => Err(e.to_string()),
        }
    }

    async fn classic_unsubscribe_one(&self, name: &str, topic: &str, url: &str) -> Result<(), String> {
        use crate::storage::meta::{self, Policy};
        let db = &self.shard.shared.db;
        let pushes = crate::push::webhook::pushes_of(db, name);
        let Some(push) = pushes.iter().find(|p| p.url == url) else {
            return Err(format!("{url} is not subscribed to {name}"));
        };
        meta::delete_policy(db, Policy::Push, &push.id()).map_err(|e| e.to_string())?;
        if pushes.len() > 1 {
            self.shard.announce(name, topic, InterestChange::Pushes);
            return Ok(());
        }
        // The group's last URL: its subscription goes too (as EventMesh drops the group).
        match self.shard.subscription(SubRequest::Remove(name.to_owned())).await {
            Ok(_) => {
                self.shard.announce(name, topic, InterestChange::Removed);
                Ok(())
            }
            Err(e) => Err(e.to_string()),
        }
    }

    /// A sync send (101): the message stored as a request to its topic (REQUEST permission),
    /// its reply awaited for `ttl` ms (at most `max_request_timeout_ms`), answered with retCode
    /// 0 and the reply in `retMsg`, or 4 when none came in time.
    async fn sync_send(&self, gate: &mut Gate<'_>, req: &Request<'_>, message: Message<'_>) -> Response {
        let problem = |p: Response| from_problem(&p, true);
        if self.shard.shared.memory.shed_now() {
            return problem(shed());
        }
        let topic = match self.topic_named(gate, Cow::Borrowed(message.topic), Action::Request, Some(req)) {
            Ok(t) => t,
            Err(p) => return problem(p),
        };
        let mut frame = match message.to_frame(&topic) {
            Ok(f) => f,
            Err(r) => return refused(&r),
        };
        frame.set_timestamp(crate::model::clock::now_micros());
        let ttl_ms: u64 = message.ttl.and_then(|t| t.parse().ok()).unwrap_or(1);
        let timeout = std::time::Duration::from_millis(ttl_ms).min(self.shard.shared.config.max_request_timeout);
        match self.send_and_wait(gate, req, &topic, frame, timeout).await {
            Ok(Waited::Reply(reply)) => {
                answer(StatusCode::OK, ret::SUCCESS, &meshmessage::reply_message(message.topic, &reply))
            }
            Ok(Waited::TimedOut(id)) => answer(
                StatusCode::OK,
                ret::WAITING_REPLY_ERR,
                &format!("eventMesh waiting rr msg error: no reply to request {id} within {} ms", timeout.as_millis()),
            ),
            Ok(Waited::Gone) => answer(StatusCode::OK, ret::WAITING_REPLY_ERR, "the requester closed the connection")
                .with_header("connection", "close"),
            Err(p) => problem(p),
        }
    }
}
