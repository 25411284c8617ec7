//! What a connection becomes after its HTTP exchange: the broker's side of `http::Response`'s
//! upgrade slot. The sans-io `http` module knows none of this (it carries the value as an
//! opaque type parameter); `conn` hands it to the [`Handler`](super::Handler) that asked for it.

/// What a connection turns into after a `101 Switching Protocols` (or, for a server-sent event
/// stream, after its `200` head).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Upgrade {
    /// The WebSocket echo endpoint (conformance testing only).
    WsEcho,
    /// A WebSocket session receiving a subscription's events.
    WsDeliver(Box<SessionSpec>),
    /// A `text/event-stream` of a subscription's events (chunked).
    Sse(Box<SessionSpec>),
    /// The one subscriber of a session's lite topic (session pub/sub), over WebSocket.
    FollowWs(Box<FollowSpec>),
    /// The same over server-sent events.
    FollowSse(Box<FollowSpec>),
    /// The chunks of an agent streaming call's turn, as server-sent events.
    TurnSse(Box<TurnSpec>),
    /// CloudEvents published over WebSocket, one structured event per text message.
    WsPublish(Box<PublishSpec>),
    /// An A2A task's stream responses, as server-sent events.
    A2aSse(Box<A2aStreamSpec>),
    /// A remote A2A agent's stream, relayed as it comes.
    A2aRelay(Box<A2aRelaySpec>),
}

/// A streaming call to a remote A2A agent, made once the `200` head is out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct A2aRelaySpec {
    /// The remote's JSON-RPC URL and where it is, and the request to send.
    pub url: String,
    pub addr: std::net::SocketAddr,
    pub body: Vec<u8>,
    /// The request's id (a failure is answered as its JSON-RPC error), and the caller's scope
    /// (the task the stream starts is remembered as its).
    pub rpc_id: serde_json::Value,
    pub scope: String,
    pub expires_us: Option<i64>,
}

/// A stream of an A2A task (`SendStreamingMessage`, `SubscribeToTask`, or their REST routes).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct A2aStreamSpec {
    pub task_id: String,
    /// JSON-RPC: the request's id, each event a response to it; `None` for REST (bare events).
    pub rpc_id: Option<serde_json::Value>,
    pub history_length: Option<usize>,
    /// When the credential expires (µs since the epoch): the stream ends then.
    pub expires_us: Option<i64>,
    /// A `SendStreamingMessage`'s own start: the number of the task's next event and the task as
    /// the message left it, before its turn ran. The stream begins there, so an agent that
    /// answers before the stream is served is not missed (`None`: the task as it is then).
    pub start: Option<(u64, serde_json::Value)>,
}

/// A WebSocket publisher (`GET /events/ws?publish=T`), as the request set it up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PublishSpec {
    /// The topic's stored name (tenant-scoped) and the name the caller used (for the ACL).
    pub topic: String,
    pub local: String,
    /// Who opened it (`None` with `auth = none`), its tenant, its credential (verified again
    /// when the keys change) and when that expires (µs since the epoch): the session ends then.
    pub principal: Option<String>,
    pub tenant: Option<String>,
    pub credential: Option<Credential>,
    pub expires_us: Option<i64>,
}

/// A client's stream of one turn of an agent streaming call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TurnSpec {
    /// The session's stored key (`shard::calls`).
    pub key: String,
    /// The last chunk the client has (`Last-Event-ID`); `None`: from the turn's start.
    pub after: Option<u64>,
    /// The turn the stream is of (the one a `POST` started, or a `GET`'s `?turn=`); `None`: the
    /// current or last one.
    pub turn: Option<u64>,
    /// When the credential expires (µs since the epoch): the stream ends then.
    pub expires_us: Option<i64>,
}

/// A follower of a lite topic (a session's, or an agent's), as the request set it up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FollowSpec {
    /// The lite topic's stored name (`:session.<sid>`, tenant-scoped).
    pub topic: String,
    /// The first offset to send.
    pub from: u64,
    /// Who subscribed (`None` with `auth = none`) and its tenant: its reply frames answer
    /// requests as it (`push::ws`).
    pub principal: Option<String>,
    pub tenant: Option<String>,
    /// When its credential expires (µs since the epoch): the session ends then (1008).
    pub expires_us: Option<i64>,
    /// The credential it subscribed with: its `publish` messages are refused once the keys no
    /// longer verify it.
    pub credential: Option<Credential>,
    /// An agent's WebSocket (`GET /agent/ws`): the agent's stored id. It sends its turns'
    /// chunks on it, and its turns in progress end when it closes.
    pub agent: Option<String>,
}

/// A delivery session as the client asked for it, checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionSpec {
    pub subscription: String,
    pub topic: String,
    /// `false`: `ack=none`, live fan-out without offsets.
    pub acked: bool,
    /// Offsets per client (`BROADCAST`, `MULTICAST`) rather than per subscription.
    pub per_client: bool,
    pub client: Option<String>,
    /// `MULTICAST`: the session's own filters, a JSON array of Subscriptions API filters.
    pub filters: Option<String>,
    /// SSE: the `Last-Event-ID` the client resumes after.
    pub last_event_id: Option<String>,
    /// `?credit=N`: the session's event window from its first delivery (default
    /// `session_window`), as a `credit` message would set it, without the burst a later one
    /// comes too late to stop.
    pub window: Option<u32>,
    /// Who opened the session (`None` with `auth = none`): it is closed (WebSocket 1008) once
    /// the credential expires or the ACL no longer lets it subscribe.
    pub principal: Option<String>,
    /// The credential the session was opened with, verified again when the keys change (a
    /// token removed from the tokens file, a key from the JWKS, ends the session).
    pub credential: Option<Credential>,
    /// The principal's tenant: `subscription` is stored as `tenant.name`.
    pub tenant: Option<String>,
    /// When the credential expires, µs since the Unix epoch.
    pub expires_us: Option<i64>,
}

/// A response of the broker's: the protocol's response, which may turn the connection into an
/// [`Upgrade`].
pub type Response = crate::http::Response<Upgrade>;

/// A bearer credential kept by a session; never printed.
#[derive(Clone, PartialEq, Eq)]
pub struct Credential(pub Vec<u8>);

impl std::fmt::Debug for Credential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Credential(..)")
    }
}
