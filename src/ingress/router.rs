//! The traffic listener's one route table: method + path -> endpoint ([`ROUTES`]), and
//! [`Traffic::route`], which serves a request by it.
//!
//! In order: a path of no route is 404 (or, with a `code` header or under `/eventmesh/`,
//! classic EventMesh HTTP, `meshmessage.rs`); then the caller is authenticated (`gate.rs`; a
//! route browsers open also takes the credential as `?access_token=`); then a method the route
//! does not serve is 405 with `Allow`; else the endpoint gets a [`Gate`] to ask the ACL, the
//! limits and the quotas through. A new endpoint is a row of [`ROUTES`] and an arm of
//! [`Traffic::route`]'s match.

use super::gate::{credential, Gate};
use super::homes::REDIRECTED;
use super::responses::ws_upgrade;
use super::Traffic;
use crate::governance::Caller;
use crate::http::{problem, Method, StatusCode};
use crate::server::{Request, Response, Upgrade};

/// What a route leads to: one endpoint of the traffic listener.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Endpoint {
    /// `POST /events/publish?topic=T`: CloudEvents over HTTP (`store.rs`).
    Publish,
    /// `POST /events/request`, `POST /events/reply`: request-reply (`request.rs`).
    Request,
    Reply,
    /// `POST /events/subscribe`, `POST /events/unsubscribe` (`subscribe.rs`).
    Subscribe,
    Unsubscribe,
    /// `GET /events/ws`: a delivery session (`attach.rs`), or with `?publish=T` a publishing one
    /// (`ws_publish.rs`).
    Ws,
    /// `GET /events/sse`: a delivery session (`attach.rs`).
    Sse,
    /// `GET /events/poll`, `POST /events/ack` (`poll.rs`).
    Poll,
    Ack,
    /// `/ws/echo`: a WebSocket echo, for `GET` when `ws_echo_endpoint` is on; any other request
    /// there is 404.
    WsEcho,
    /// `POST /agent/register|heartbeat|deregister` (`agent.rs`).
    Agent(&'static str),
    /// `GET /agent/ws`: an agent's WebSocket (`call.rs`).
    AgentWs,
    /// `POST /session/open` (`call.rs`).
    SessionOpen,
    /// `GET /session/recommend` (`recommend.rs`).
    Recommend,
    /// `POST /session/publish/{sid}`, `GET /session/subscribe/{sid}`: session pub/sub
    /// (`session.rs`).
    SessionPublish,
    SessionSubscribe,
    /// `POST /session/stream/{sid}` (a turn), `GET /session/stream/{sid}` (the turn again),
    /// `POST /session/chunk/{sid}`, `POST /session/end-turn|cancel|close/{sid}`: agent
    /// streaming calls (`call.rs`).
    SessionTurn,
    SessionResume,
    SessionChunk,
    SessionControl(&'static str),
    /// Everything under `/a2a/`: the A2A gateway, which routes the rest itself (`a2a.rs`).
    A2a,
}

/// Where a route is.
enum At {
    /// This path exactly.
    Path(&'static str),
    /// `/session/{what}/{sid}` for this `what`; the rest of the path is the session id.
    Session(&'static str),
    /// Every path under this prefix; the rest of the path is the endpoint's.
    Under(&'static str),
}

impl At {
    /// Whether `path` is here: the rest of it (the session id, what follows the prefix; empty
    /// for a whole path).
    fn matches<'p>(&self, path: &'p str) -> Option<&'p str> {
        match *self {
            At::Path(p) => (path == p).then_some(""),
            At::Session(what) => {
                let (w, sid) = path.strip_prefix("/session/")?.split_once('/')?;
                (w == what).then_some(sid)
            }
            At::Under(prefix) => path.strip_prefix(prefix),
        }
    }
}

/// One row of the route table.
struct Route {
    at: At,
    /// Opened by browsers (WebSocket, SSE: no headers of their own), so the credential may come
    /// as `?access_token=`.
    browser: bool,
    /// The endpoint per method, in the order `Allow` names them (`None`: any method).
    methods: &'static [(Option<Method>, Endpoint)],
}

const GET: Option<Method> = Some(Method::Get);
const POST: Option<Method> = Some(Method::Post);
const ANY: Option<Method> = None;

impl Route {
    const fn path(path: &'static str, methods: &'static [(Option<Method>, Endpoint)]) -> Route {
        Route { at: At::Path(path), browser: false, methods }
    }

    const fn session(what: &'static str, methods: &'static [(Option<Method>, Endpoint)]) -> Route {
        Route { at: At::Session(what), browser: false, methods }
    }

    const fn under(prefix: &'static str, methods: &'static [(Option<Method>, Endpoint)]) -> Route {
        Route { at: At::Under(prefix), browser: false, methods }
    }

    /// The same route, opened by browsers.
    const fn browser(self) -> Route {
        Route { browser: true, ..self }
    }

    /// The endpoint for `method`, if the route serves it.
    fn endpoint(&self, method: Method) -> Option<Endpoint> {
        self.methods.iter().find(|(m, _)| m.is_none_or(|m| m == method)).map(|&(_, e)| e)
    }

    /// 405, naming the methods the route serves.
    fn not_allowed(&self) -> Response {
        let names: Vec<&str> = self.methods.iter().filter_map(|(m, _)| m.map(method_name)).collect();
        problem(StatusCode::METHOD_NOT_ALLOWED, &format!("use {}", names.join(" or ")))
            .with_header("allow", names.join(", "))
    }
}

fn method_name(m: Method) -> &'static str {
    match m {
        Method::Get => "GET",
        Method::Head => "HEAD",
        Method::Post => "POST",
        Method::Put => "PUT",
        Method::Delete => "DELETE",
        Method::Options => "OPTIONS",
        Method::Other => "OTHER",
    }
}

/// The traffic listener's routes (no two match one path).
const ROUTES: &[Route] = {
    use Endpoint as E;
    &[
        Route::path("/events/publish", &[(POST, E::Publish)]),
        Route::path("/events/request", &[(POST, E::Request)]),
        Route::path("/events/reply", &[(POST, E::Reply)]),
        Route::path("/events/subscribe", &[(POST, E::Subscribe)]),
        Route::path("/events/unsubscribe", &[(POST, E::Unsubscribe)]),
        Route::path("/events/ws", &[(GET, E::Ws)]).browser(),
        Route::path("/events/sse", &[(GET, E::Sse)]).browser(),
        Route::path("/events/poll", &[(GET, E::Poll)]),
        Route::path("/events/ack", &[(POST, E::Ack)]),
        Route::path("/ws/echo", &[(ANY, E::WsEcho)]).browser(),
        Route::session("publish", &[(POST, E::SessionPublish)]),
        Route::session("subscribe", &[(GET, E::SessionSubscribe)]).browser(),
        Route::session("stream", &[(POST, E::SessionTurn), (GET, E::SessionResume)]).browser(),
        Route::session("chunk", &[(POST, E::SessionChunk)]),
        Route::session("end-turn", &[(POST, E::SessionControl("end-turn"))]),
        Route::session("cancel", &[(POST, E::SessionControl("cancel"))]),
        Route::session("close", &[(POST, E::SessionControl("close"))]),
        Route::path("/session/open", &[(POST, E::SessionOpen)]),
        Route::path("/session/recommend", &[(GET, E::Recommend)]),
        Route::path("/agent/register", &[(POST, E::Agent("register"))]),
        Route::path("/agent/heartbeat", &[(POST, E::Agent("heartbeat"))]),
        Route::path("/agent/deregister", &[(POST, E::Agent("deregister"))]),
        Route::path("/agent/ws", &[(GET, E::AgentWs)]).browser(),
        Route::under("/a2a/", &[(ANY, E::A2a)]),
    ]
};

/// The route of `path`, and the rest of the path it leaves its endpoint.
fn find(path: &str) -> Option<(&'static Route, &str)> {
    ROUTES.iter().find_map(|r| Some((r, r.at.matches(path)?)))
}

impl Traffic {
    /// Serves a request by [`ROUTES`] (see the module's documentation for the order of the
    /// refusals).
    pub(super) async fn route(&self, caller: &mut Caller, req: Request<'_>) -> Response {
        let path = req.path();
        let found = find(path);
        // Classic EventMesh HTTP: its own paths, or any other path with a `code` header (its
        // SDKs post to `/`).
        let classic = found.is_none() && (path.starts_with("/eventmesh/") || req.header("code").is_some());
        if found.is_none() && !classic {
            return not_found(path);
        }
        let token = credential(&req, found.is_some_and(|(r, _)| r.browser));
        let snap = self.view.current(&self.shard.shared.governance);
        let who = match self.authenticate(caller, &snap, path, token.as_deref()) {
            Ok(who) => who,
            Err(r) => return r,
        };
        let mut gate = Gate { traffic: self, snap, caller, who: &who, token: token.as_deref() };
        let Some((route, rest)) = found else {
            // Counted as publishes; a classic refusal is an HTTP 200 whose retCode is not 0.
            let started = crate::task::clock::fresh();
            let m = self.shard.shared.metrics.shard(self.shard.id);
            m.publish_requests.inc();
            let r = Box::pin(self.meshmessage(&mut gate, &req)).await;
            if r.status.0 != 200 || !r.body.starts_with(br#"{"retCode":0,"#) {
                m.publish_errors.inc();
            }
            m.publish_latency.record_us(crate::task::clock::micros_since(started));
            return r;
        };
        let Some(endpoint) = route.endpoint(req.method()) else { return route.not_allowed() };
        let sid = rest;
        match endpoint {
            Endpoint::Publish => {
                let started = crate::task::clock::fresh();
                let m = self.shard.shared.metrics.shard(self.shard.id);
                m.publish_requests.inc();
                let r = self.publish(&mut gate, &req).await;
                if r.status.0 >= 400 {
                    m.publish_errors.inc();
                }
                m.publish_latency.record_us(crate::task::clock::micros_since(started));
                r
            }
            // Boxed: a waiting request's state is large, and every connection's future would
            // otherwise reserve room for it (idle sessions keep what their connection took).
            Endpoint::Request => Box::pin(self.request(&mut gate, &req)).await,
            Endpoint::Reply => Box::pin(self.reply(&mut gate, &req)).await,
            Endpoint::Subscribe => self.subscribe(&mut gate, req.body).await,
            Endpoint::Unsubscribe => self.unsubscribe(&mut gate, req.body).await,
            Endpoint::Ws if req.query("publish").is_some() => self.ws_publish(&mut gate, &req),
            Endpoint::Ws => self.events_ws(&mut gate, &req).await,
            Endpoint::Sse => self.events_sse(&mut gate, &req).await,
            Endpoint::Poll => self.poll(&mut gate, &req).await,
            Endpoint::Ack => self.ack(&mut gate, req.body, req.query(REDIRECTED).is_some()).await,
            Endpoint::WsEcho if req.method() == Method::Get && self.shard.shared.config.ws_echo_endpoint => {
                ws_upgrade(&req, Upgrade::WsEcho)
            }
            Endpoint::WsEcho => not_found(path),
            Endpoint::Agent(what) => self.agent(&mut gate, what, &req),
            Endpoint::AgentWs => self.agent_ws(&mut gate, &req),
            Endpoint::SessionOpen => Box::pin(self.session_open(&mut gate, &req)).await,
            Endpoint::Recommend => self.recommend(&mut gate, &req),
            Endpoint::SessionPublish => Box::pin(self.session_publish(&mut gate, &req, sid)).await,
            Endpoint::SessionSubscribe => self.session_subscribe(&mut gate, &req, sid),
            Endpoint::SessionTurn => Box::pin(self.session_turn(&mut gate, &req, sid)).await,
            Endpoint::SessionResume => self.session_resume(&mut gate, &req, sid),
            Endpoint::SessionChunk => self.session_chunk(&mut gate, &req, sid),
            Endpoint::SessionControl(what) => Box::pin(self.session_control(&mut gate, &req, what, sid)).await,
            Endpoint::A2a => Box::pin(self.a2a(&mut gate, &req, rest)).await,
        }
    }
}

/// 404 for a path no route serves.
fn not_found(path: &str) -> Response {
    problem(StatusCode::NOT_FOUND, &format!("no route for {path}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every path the listener served before the table still leads where it did, with the same
    /// browser flag and the same 405 wording.
    #[test]
    fn the_table_routes_every_path_once() {
        let cases: &[(&str, Method, Option<Endpoint>, bool)] = &[
            ("/events/publish", Method::Post, Some(Endpoint::Publish), false),
            ("/events/publish", Method::Get, None, false),
            ("/events/ws", Method::Get, Some(Endpoint::Ws), true),
            ("/events/sse", Method::Get, Some(Endpoint::Sse), true),
            ("/events/poll", Method::Get, Some(Endpoint::Poll), false),
            ("/events/ack", Method::Post, Some(Endpoint::Ack), false),
            ("/ws/echo", Method::Put, Some(Endpoint::WsEcho), true),
            ("/session/stream/a:b", Method::Get, Some(Endpoint::SessionResume), true),
            ("/session/stream/a:b", Method::Post, Some(Endpoint::SessionTurn), true),
            ("/session/subscribe/s", Method::Get, Some(Endpoint::SessionSubscribe), true),
            ("/session/close/s", Method::Post, Some(Endpoint::SessionControl("close")), false),
            ("/session/open", Method::Post, Some(Endpoint::SessionOpen), false),
            ("/agent/heartbeat", Method::Post, Some(Endpoint::Agent("heartbeat")), false),
            ("/agent/ws", Method::Get, Some(Endpoint::AgentWs), true),
            ("/a2a/bot/v1/tasks", Method::Delete, Some(Endpoint::A2a), false),
        ];
        for &(path, method, endpoint, browser) in cases {
            let (route, _) = find(path).unwrap_or_else(|| panic!("{path} has a route"));
            assert_eq!(route.endpoint(method), endpoint, "{method:?} {path}");
            assert_eq!(route.browser, browser, "{path}");
            assert_eq!(ROUTES.iter().filter(|r| r.at.matches(path).is_some()).count(), 1, "{path}");
        }
        for path in ["/", "/events", "/events/publish/x", "/session/open/x", "/session/x/y", "/agent/x", "/a2a"] {
            assert!(find(path).is_none(), "{path}");
        }
        assert_eq!(find("/session/stream/a/b").map(|(_, sid)| sid), Some("a/b"));
        assert_eq!(find("/a2a/bot/v1").map(|(_, rest)| rest), Some("bot/v1"));
        let r = find("/session/stream/s").expect("a route").0.not_allowed();
        assert_eq!(r.status, StatusCode::METHOD_NOT_ALLOWED);
        assert!(r.headers.iter().any(|(n, v)| n == "allow" && v == "POST, GET"));
        assert!(String::from_utf8_lossy(&r.body).contains("use POST or GET"));
    }
}
