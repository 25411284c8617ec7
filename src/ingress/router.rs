//! The traffic listener's routes: [`Traffic::route`] serves a request by its method and path,
//! after authenticating the caller (`gate.rs`).

use super::gate::{credential, Gate};
use super::homes::REDIRECTED;
use super::responses::ws_upgrade;
use super::Traffic;
use crate::governance::Caller;
use crate::http::{problem, Method, StatusCode};
use crate::server::{Request, Response, Upgrade};

impl Traffic {
    pub(super) async fn route(&self, caller: &mut Caller, req: Request<'_>) -> Response {
        let path = req.path();
        let session = path.strip_prefix("/session/").and_then(|rest| rest.split_once('/'));
        let ours = matches!(
            path,
            "/events/publish"
                | "/events/request"
                | "/events/reply"
                | "/events/subscribe"
                | "/events/unsubscribe"
                | "/events/ws"
                | "/events/sse"
                | "/events/poll"
                | "/events/ack"
                | "/ws/echo"
        ) || matches!(
            session,
            Some(("publish" | "subscribe" | "stream" | "chunk" | "end-turn" | "cancel" | "close", _))
        ) || matches!(
            path,
            "/agent/register"
                | "/agent/heartbeat"
                | "/agent/deregister"
                | "/agent/ws"
                | "/session/open"
                | "/session/recommend"
        ) || path.starts_with("/a2a/");
        // Classic EventMesh HTTP: its own paths, or any other path with a `code` header (its
        // SDKs post to `/`).
        let classic = !ours && (path.starts_with("/eventmesh/") || req.header("code").is_some());
        if !ours && !classic {
            return problem(StatusCode::NOT_FOUND, &format!("no route for {path}"));
        }
        let browser = matches!(path, "/events/ws" | "/events/sse" | "/ws/echo" | "/agent/ws")
            || path.starts_with("/session/subscribe/")
            || path.starts_with("/session/stream/");
        let token = credential(&req, browser);
        let snap = self.view.current(&self.shard.shared.governance);
        let who = match self.authenticate(caller, &snap, &req, token.as_deref()) {
            Ok(who) => who,
            Err(r) => return r,
        };
        let mut gate = Gate { traffic: self, snap, caller, who: &who, token: token.as_deref() };
        if classic {
            // Counted as publishes; a classic refusal is an HTTP 200 whose retCode is not 0.
            let started = std::time::Instant::now();
            let m = self.shard.shared.metrics.shard(self.shard.id);
            m.publish_requests.inc();
            let r = Box::pin(self.meshmessage(&mut gate, &req)).await;
            if r.status.0 != 200 || !r.body.starts_with(br#"{"retCode":0,"#) {
                m.publish_errors.inc();
            }
            m.publish_latency.record_us(started.elapsed().as_micros() as u64);
            return r;
        }
        if let Some(rest) = path.strip_prefix("/a2a/") {
            return Box::pin(self.a2a(&mut gate, &req, rest)).await;
        }
        if path == "/agent/ws" {
            return match req.method() {
                Method::Get => self.agent_ws(&mut gate, &req),
                _ => problem(StatusCode::METHOD_NOT_ALLOWED, "use GET").with_header("allow", "GET"),
            };
        }
        if path == "/session/recommend" {
            return match req.method() {
                Method::Get => self.recommend(&mut gate, &req),
                _ => problem(StatusCode::METHOD_NOT_ALLOWED, "use GET").with_header("allow", "GET"),
            };
        }
        if path == "/session/open" {
            return match req.method() {
                Method::Post => Box::pin(self.session_open(&mut gate, &req)).await,
                _ => problem(StatusCode::METHOD_NOT_ALLOWED, "use POST").with_header("allow", "POST"),
            };
        }
        if let Some(what) = path.strip_prefix("/agent/") {
            return match req.method() {
                Method::Post => self.agent(&mut gate, what, &req),
                _ => problem(StatusCode::METHOD_NOT_ALLOWED, "use POST").with_header("allow", "POST"),
            };
        }
        if let Some((what, sid)) = session {
            return match (req.method(), what) {
                (Method::Post, "publish") => Box::pin(self.session_publish(&mut gate, &req, sid)).await,
                (Method::Get, "subscribe") => self.session_subscribe(&mut gate, &req, sid),
                (Method::Post, "stream") => Box::pin(self.session_turn(&mut gate, &req, sid)).await,
                (Method::Get, "stream") => self.session_resume(&mut gate, &req, sid),
                (Method::Post, "chunk") => self.session_chunk(&mut gate, &req, sid),
                (Method::Post, "end-turn" | "cancel" | "close") => {
                    Box::pin(self.session_control(&mut gate, &req, what, sid)).await
                }
                (_, "stream") => {
                    problem(StatusCode::METHOD_NOT_ALLOWED, "use POST or GET").with_header("allow", "POST, GET")
                }
                (_, "subscribe") => problem(StatusCode::METHOD_NOT_ALLOWED, "use GET").with_header("allow", "GET"),
                _ => problem(StatusCode::METHOD_NOT_ALLOWED, "use POST").with_header("allow", "POST"),
            };
        }
        match (req.method(), path) {
            (Method::Post, "/events/publish") => {
                let started = std::time::Instant::now();
                let m = self.shard.shared.metrics.shard(self.shard.id);
                m.publish_requests.inc();
                let r = self.publish(&mut gate, &req).await;
                if r.status.0 >= 400 {
                    m.publish_errors.inc();
                }
                m.publish_latency.record_us(started.elapsed().as_micros() as u64);
                r
            }
            // Boxed: a waiting request's state is large, and every connection's future would
            // otherwise reserve room for it (idle sessions keep what their connection took).
            (Method::Post, "/events/request") => Box::pin(self.request(&mut gate, &req)).await,
            (Method::Post, "/events/reply") => Box::pin(self.reply(&mut gate, &req)).await,
            (_, "/events/publish" | "/events/request" | "/events/reply") => {
                problem(StatusCode::METHOD_NOT_ALLOWED, "use POST").with_header("allow", "POST")
            }
            (Method::Post, "/events/subscribe") => self.subscribe(&mut gate, req.body).await,
            (Method::Post, "/events/unsubscribe") => self.unsubscribe(&mut gate, req.body).await,
            (_, "/events/subscribe" | "/events/unsubscribe") => {
                problem(StatusCode::METHOD_NOT_ALLOWED, "use POST").with_header("allow", "POST")
            }
            (Method::Get, "/ws/echo") if self.shard.shared.config.ws_echo_endpoint => ws_upgrade(&req, Upgrade::WsEcho),
            (Method::Get, "/events/ws") if req.query("publish").is_some() => self.ws_publish(&mut gate, &req),
            (Method::Get, "/events/ws") => match self.session_spec(&mut gate, &req).await {
                Ok(spec) => ws_upgrade(&req, Upgrade::WsDeliver(Box::new(spec))),
                Err(r) => r,
            },
            (Method::Get, "/events/sse") => match self.session_spec(&mut gate, &req).await {
                Ok(spec) if !spec.acked => problem(StatusCode::BAD_REQUEST, "ack=none is for WebSocket sessions"),
                Ok(spec) => Response::streaming(Upgrade::Sse(Box::new(spec)), "text/event-stream"),
                Err(r) => r,
            },
            (Method::Get, "/events/poll") => self.poll(&mut gate, &req).await,
            (Method::Post, "/events/ack") => self.ack(&mut gate, req.body, req.query(REDIRECTED).is_some()).await,
            (_, "/events/ws" | "/events/sse" | "/events/poll") => {
                problem(StatusCode::METHOD_NOT_ALLOWED, "use GET").with_header("allow", "GET")
            }
            (_, "/events/ack") => problem(StatusCode::METHOD_NOT_ALLOWED, "use POST").with_header("allow", "POST"),
            (_, path) => problem(StatusCode::NOT_FOUND, &format!("no route for {path}")),
        }
    }
}
