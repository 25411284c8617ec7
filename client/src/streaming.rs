//! Streaming sessions (SPEC "Streaming sessions and lite topics"): the client side of an agent
//! streaming call ([`Session::call`] -> a stream of [`Chunk`]s, resumed after a dropped
//! connection from the last chunk seen), the agent side ([`Agent`]: register, heartbeat,
//! attach, answer turns), and session pub/sub ([`SessionSubscriber`], [`SessionPublisher`]).

use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use cloudevents::Event;
use futures_util::{SinkExt, Stream, StreamExt};
use reqwest::Url;
use serde::Deserialize;
use tokio::sync::{mpsc, watch};
use tokio_tungstenite::tungstenite::Message;

use crate::client::{Call, Client};
use crate::consume::{query, ConnectionState, SseParser};
use crate::error::{Error, Result};
use crate::event::{extension, from_json, to_json};
use crate::publish::Published;
use crate::task::Owned;

/// An SSE stream silent this long is dead (the broker sends a comment every 15 s).
const SSE_SILENCE: Duration = Duration::from_secs(45);

/// Streaming sessions of a client; see [`Client::streaming`].
#[derive(Clone, Debug)]
pub struct Streaming {
    client: Client,
}

impl Client {
    /// Streaming sessions: agent calls (Mode 1) and session pub/sub (Mode 2).
    pub fn streaming(&self) -> Streaming {
        Streaming { client: self.clone() }
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Opened {
    session_id: String,
    agent_id: String,
    #[serde(default)]
    instance_url: Option<String>,
}

impl Streaming {
    /// Opens a session for `client_id` with agent `agent_id` (or the least loaded agent the
    /// caller may call, when `None`).
    pub async fn open_session(&self, client_id: &str, agent_id: Option<&str>) -> Result<Session> {
        let mut body = serde_json::json!({ "clientId": client_id });
        if let Some(a) = agent_id {
            body["agentId"] = a.into();
        }
        let a = self.client.call(None, Call::post("/session/open").json(&body)).await?;
        let o: Opened = a.json()?;
        let home = o.instance_url.and_then(|u| Url::parse(&u).ok()).filter(|u| self.keeps_tls(u));
        Ok(Session { client: self.client.clone(), id: o.session_id, agent_id: o.agent_id, home })
    }

    /// A session opened before (by id), served wherever recommend says.
    pub async fn session(&self, session_id: &str) -> Result<Session> {
        let home = self.home(session_id).await?;
        let agent_id = session_id.split_once(':').map_or("", |(a, _)| a).to_owned();
        Ok(Session { client: self.client.clone(), id: session_id.to_owned(), agent_id, home })
    }

    /// Follows session `session_id`'s events (Mode 2) from its head; reconnects by itself and
    /// resumes after the last event it handed out.
    pub fn subscribe_session(&self, session_id: &str) -> SessionSubscriber {
        let (tx, rx) = mpsc::channel(64);
        let (state_tx, state_rx) = watch::channel(ConnectionState::Connecting);
        let task = Owned::spawn(follow_session(self.clone(), session_id.to_owned(), tx, state_tx));
        SessionSubscriber { rx, state: state_rx, _task: task }
    }

    /// Publishes to session `session_id` (Mode 2).
    pub fn session_publisher(&self, session_id: &str) -> SessionPublisher {
        SessionPublisher { client: self.client.clone(), path: format!("/session/publish/{}", segment(session_id)) }
    }

    /// The home of session `id`, as recommend names it (`None`: ask the first URL).
    async fn home(&self, id: &str) -> Result<Option<Url>> {
        let path = query("/session/recommend", &[("sessionId", Some(&id.to_owned()))]);
        let a = self.client.call(None, Call::get(path)).await?;
        let v: serde_json::Value = a.json()?;
        Ok(v.get("instanceUrl").and_then(|u| u.as_str()).and_then(|u| Url::parse(u).ok()).filter(|u| self.keeps_tls(u)))
    }

    fn keeps_tls(&self, u: &Url) -> bool {
        self.client.url().scheme() != "https" || u.scheme() == "https"
    }
}

/// A path segment with what would change the path percent-encoded (RFC 3986 `pchar` kept:
/// session ids are `<agentId>:<uuid>`, and the broker reads the colon as it is).
fn segment(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~:@!$&'()*+,;=".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// An agent streaming session, from [`Streaming::open_session`].
#[derive(Clone, Debug)]
pub struct Session {
    client: Client,
    id: String,
    agent_id: String,
    home: Option<Url>,
}

/// What one event of a turn's stream is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ChunkKind {
    /// A piece of the answer.
    Chunk,
    /// The turn's last piece.
    Done,
    /// The turn ended with an error (the agent's, or `cancelled`, `the agent disconnected`...).
    Error,
    /// The stream fell behind and chunks were dropped; `data` says how many.
    Dropped,
}

/// One event of a turn's stream.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Chunk {
    /// The chunk's sequence number within its turn.
    pub seq: Option<u64>,
    /// What it is.
    pub kind: ChunkKind,
    /// Its data as text (a JSON string's text; other JSON values as JSON).
    pub data: String,
}

impl Chunk {
    /// Whether this is the turn's last event.
    pub fn ends_turn(&self) -> bool {
        matches!(self.kind, ChunkKind::Done | ChunkKind::Error)
    }
}

impl Session {
    /// The session id (`<agentId>:<uuid>`).
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The agent the session talks to.
    pub fn agent_id(&self) -> &str {
        &self.agent_id
    }

    fn path(&self, verb: &str) -> String {
        format!("/session/{verb}/{}", segment(&self.id))
    }

    /// Starts a turn with `prompt` (text) and streams its chunks, up to and including the
    /// `Done` or `Error` one. A connection lost mid-turn is resumed after the last chunk seen.
    pub async fn call(&self, prompt: impl Into<String>) -> Result<ChunkStream> {
        let call = Call::post(self.path("stream"))
            .body(prompt.into().into_bytes(), "text/plain; charset=utf-8")
            .header("accept", "text/event-stream")
            .timeout(None);
        let (resp, url) = self.client.open(self.home.as_ref(), call).await?;
        let (tx, rx) = mpsc::channel(64);
        let task = Owned::spawn(turn_stream(self.clone(), url, resp, tx));
        Ok(ChunkStream { rx, _task: task })
    }

    /// Ends the turn in progress (its stream ends with `Done`).
    pub async fn end_turn(&self) -> Result<()> {
        self.control("end-turn").await
    }

    /// Cancels the turn in progress (its stream ends with an `Error`, `cancelled`).
    pub async fn cancel(&self) -> Result<()> {
        self.control("cancel").await
    }

    /// Closes the session.
    pub async fn close(&self) -> Result<()> {
        self.control("close").await
    }

    async fn control(&self, verb: &str) -> Result<()> {
        self.client.call(self.home.as_ref(), Call::post(self.path(verb))).await.map(|_| ())
    }
}

/// The chunks of one turn; ends after the turn's last.
#[must_use = "it does nothing unless polled, and dropping it ends it"]
pub struct ChunkStream {
    rx: mpsc::Receiver<Result<Chunk>>,
    _task: Owned,
}

impl Stream for ChunkStream {
    type Item = Result<Chunk>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.rx.poll_recv(cx)
    }
}

async fn turn_stream(session: Session, url: Url, first: reqwest::Response, tx: mpsc::Sender<Result<Chunk>>) {
    let mut resp = Some(first);
    let mut last_seq: Option<u64> = None;
    let mut step = 0;
    let base = session.client.inner.backoff;
    loop {
        let r = match resp.take() {
            Some(r) => r,
            None => {
                let mut call = Call::get(session.path("stream")).header("accept", "text/event-stream").timeout(None);
                if let Some(s) = last_seq {
                    call = call.header("last-event-id", s.to_string());
                }
                match session.client.open(Some(&url), call).await {
                    Ok((r, _)) if r.status().as_u16() == 204 => {
                        let _ =
                            tx.send(Err(Error::Disconnected("the turn ended while the stream was away".into()))).await;
                        return;
                    }
                    Ok((r, _)) => r,
                    Err(e) if e.is_transient() && step < 8 => {
                        tokio::time::sleep(base.delay(step)).await;
                        step += 1;
                        continue;
                    }
                    Err(e) => {
                        let _ = tx.send(Err(e)).await;
                        return;
                    }
                }
            }
        };
        let mut body = r.bytes_stream();
        let mut parser = SseParser::default();
        // The broker sends a comment every 15 s: silence past three is a dead connection.
        while let Ok(Some(Ok(bytes))) = tokio::time::timeout(SSE_SILENCE, body.next()).await {
            let events = match parser.feed(&bytes) {
                Ok(events) => events,
                Err(e) => {
                    let _ = tx.send(Err(e)).await;
                    return;
                }
            };
            for ev in events {
                step = 0;
                let kind = match ev.event.as_deref() {
                    Some("done") => ChunkKind::Done,
                    Some("error") => ChunkKind::Error,
                    Some("dropped") => ChunkKind::Dropped,
                    _ => ChunkKind::Chunk,
                };
                let seq = ev.id.as_deref().and_then(|s| s.parse().ok());
                if seq.is_some() {
                    last_seq = seq;
                }
                let chunk = Chunk { seq, kind, data: ev.data };
                let last = chunk.ends_turn();
                if tx.send(Ok(chunk)).await.is_err() || last {
                    return;
                }
            }
        }
        // The connection ended before the turn did: resume after the last chunk seen, after a
        // backoff delay (a stream that keeps ending at once must not loop hot).
        if step >= 8 {
            let _ = tx.send(Err(Error::Disconnected("the turn's stream kept ending".into()))).await;
            return;
        }
        tokio::time::sleep(base.delay(step)).await;
        step += 1;
    }
}

/// Publishes to one session's lite topic (Mode 2); see [`Streaming::session_publisher`].
#[derive(Clone, Debug)]
pub struct SessionPublisher {
    client: Client,
    path: String,
}

impl SessionPublisher {
    /// Appends `event` to the session.
    pub async fn publish(&self, event: &Event) -> Result<Published> {
        let call = Call::post(self.path.clone()).body(to_json(event)?, "application/cloudevents+json");
        self.client.call(None, call).await?.json()
    }
}

/// The events of one session (Mode 2), in order, from its head; see
/// [`Streaming::subscribe_session`].
#[must_use = "it does nothing unless polled, and dropping it ends it"]
pub struct SessionSubscriber {
    rx: mpsc::Receiver<Result<Event>>,
    state: watch::Receiver<ConnectionState>,
    _task: Owned,
}

impl SessionSubscriber {
    /// The connection's state.
    pub fn state(&self) -> watch::Receiver<ConnectionState> {
        self.state.clone()
    }
}

impl Stream for SessionSubscriber {
    type Item = Result<Event>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.rx.poll_recv(cx)
    }
}

/// Follows a session over SSE (`id:` is the offset, so `Last-Event-ID` resumes exactly after
/// the last event handed out), reconnecting with backoff, at its home.
async fn follow_session(
    streaming: Streaming,
    sid: String,
    tx: mpsc::Sender<Result<Event>>,
    state: watch::Sender<ConnectionState>,
) {
    let client = &streaming.client;
    let mut last: Option<String> = None;
    let mut step = 0u32;
    let mut attached = false;
    let mut served_by: Option<String> = None;
    loop {
        state.send_replace(ConnectionState::Connecting);
        let reason = match streaming.home(&sid).await {
            Err(e) if !e.is_transient() => return fatal(&tx, &state, e).await,
            Err(e) => e.to_string(),
            Ok(home) => {
                let mut call = Call::get(format!("/session/subscribe/{}", segment(&sid)))
                    .header("accept", "text/event-stream")
                    .timeout(None);
                if let Some(id) = &last {
                    call = call.header("last-event-id", id.clone());
                }
                match client.open(home.as_ref(), call).await {
                    // The broker may not have noticed the last connection go yet (409).
                    Err(e) if attached && e.status() == Some(409) => e.to_string(),
                    Err(e) if !e.is_transient() => return fatal(&tx, &state, e).await,
                    Err(e) => e.to_string(),
                    Ok((resp, url)) => {
                        state.send_replace(ConnectionState::Connected { url: url.to_string() });
                        step = 0;
                        attached = true;
                        // Offsets are the serving home's: a new home starts the session afresh,
                        // so a position at the old one means nothing there.
                        let origin = url.origin().ascii_serialization();
                        if served_by.as_ref().is_some_and(|o| *o != origin) {
                            last = None;
                        }
                        served_by = Some(origin);
                        let mut body = resp.bytes_stream();
                        let mut parser = SseParser::default();
                        loop {
                            match tokio::time::timeout(SSE_SILENCE, body.next()).await {
                                Err(_) => break "no heartbeat for 45 s".to_owned(),
                                Ok(None) => break "the stream ended".to_owned(),
                                Ok(Some(Err(e))) => break format!("reading: {e}"),
                                Ok(Some(Ok(bytes))) => {
                                    let events = match parser.feed(&bytes) {
                                        Ok(events) => events,
                                        Err(e) => break e.to_string(),
                                    };
                                    for ev in events {
                                        // One event this client cannot read is said, and passed.
                                        let item = from_json(ev.data.as_bytes());
                                        last =
                                            ev.id.or_else(|| item.as_ref().ok().and_then(|e| extension(e, "emoffset")));
                                        if tx.send(item).await.is_err() {
                                            return;
                                        }
                                    }
                                }
                            }
                        }
                    }
                }
            }
        };
        let delay = client.inner.backoff.delay(step);
        step = step.saturating_add(1);
        state.send_replace(ConnectionState::Disconnected { reason, retry_in: delay });
        tokio::select! {
            () = tokio::time::sleep(delay) => {}
            () = tx.closed() => return,
        }
    }
}

async fn fatal<T>(tx: &mpsc::Sender<Result<T>>, state: &watch::Sender<ConnectionState>, e: Error) {
    state.send_replace(ConnectionState::Closed { reason: e.to_string() });
    let _ = tx.send(Err(e)).await;
}

/// An agent of streaming calls (Mode 1): registered and heart-beating at its home, attached
/// over `GET /agent/ws`, a stream of [`AgentEvent`]s (turns to answer, and the clients'
/// end-turn, cancel and close). It registers and attaches again by itself when its
/// connection drops or its home moves (`1012`).
#[must_use = "it does nothing unless polled, and dropping it ends it"]
pub struct Agent {
    rx: mpsc::Receiver<Result<AgentEvent>>,
    state: watch::Receiver<ConnectionState>,
    task: Owned,
}

/// What an [`Agent`] is told.
#[derive(Debug)]
#[non_exhaustive]
pub enum AgentEvent {
    /// A turn to answer.
    Turn(Turn),
    /// A client ended the turn in progress of this session.
    EndTurn {
        /// The session.
        session_id: String,
        /// The broker's `evmesh.stream.end-turn` event.
        event: Event,
    },
    /// A client cancelled the turn in progress of this session.
    Cancel {
        /// The session.
        session_id: String,
        /// The broker's `evmesh.stream.cancel` event.
        event: Event,
    },
    /// A client closed this session.
    Close {
        /// The session.
        session_id: String,
        /// The broker's `evmesh.stream.close` event.
        event: Event,
    },
}

/// One turn of a session: the client's request, and the way to answer it chunk by chunk.
#[derive(Debug)]
pub struct Turn {
    /// The request (`data` is the prompt; `emsessionid`, `emturn`, optional `emmodel`...).
    pub request: Event,
    /// The session.
    pub session_id: String,
    /// The turn's number in its session (`emturn`).
    pub turn: Option<u64>,
    seq: u64,
    out: mpsc::UnboundedSender<String>,
}

impl Turn {
    /// The prompt as text.
    pub fn prompt(&self) -> String {
        match self.request.data() {
            Some(cloudevents::Data::String(s)) => s.clone(),
            Some(cloudevents::Data::Json(serde_json::Value::String(s))) => s.clone(),
            Some(cloudevents::Data::Json(v)) => v.to_string(),
            Some(cloudevents::Data::Binary(b)) => String::from_utf8_lossy(b).into_owned(),
            None => String::new(),
        }
    }

    fn send(&mut self, mut chunk: serde_json::Value) -> Result<()> {
        chunk["type"] = "chunk".into();
        chunk["sessionId"] = self.session_id.clone().into();
        chunk["seq"] = self.seq.into();
        if let Some(t) = self.turn {
            chunk["turn"] = t.into();
        }
        self.seq += 1;
        self.out.send(chunk.to_string()).map_err(|_| Error::Disconnected("the agent's connection ended".into()))
    }

    /// Sends one piece of the answer.
    pub fn chunk(&mut self, data: impl Into<serde_json::Value>) -> Result<()> {
        self.send(serde_json::json!({ "data": data.into(), "done": false }))
    }

    /// Sends the last piece (`data` may be `Null`) and ends the turn.
    pub fn done(mut self, data: impl Into<serde_json::Value>) -> Result<()> {
        let data = data.into();
        let chunk = if data.is_null() {
            serde_json::json!({ "done": true })
        } else {
            serde_json::json!({ "data": data, "done": true })
        };
        self.send(chunk)
    }

    /// Ends the turn with an error.
    pub fn fail(mut self, error: &str) -> Result<()> {
        self.send(serde_json::json!({ "error": error }))
    }
}

impl Agent {
    /// Registers agent `agent_id`, heart-beats every `heartbeat` (a third of the broker's
    /// `agent_heartbeat_timeout_ms` is right: 10 s for its default), and attaches.
    pub async fn attach(client: &Client, agent_id: &str, heartbeat: Duration) -> Result<Agent> {
        let home = register(client, agent_id).await?;
        let (tx, rx) = mpsc::channel(64);
        let (state_tx, state_rx) = watch::channel(ConnectionState::Connecting);
        let task = Owned::spawn(run_agent(client.clone(), agent_id.to_owned(), home, heartbeat, tx, state_tx));
        Ok(Agent { rx, state: state_rx, task })
    }

    /// The connection's state.
    pub fn state(&self) -> watch::Receiver<ConnectionState> {
        self.state.clone()
    }

    /// Stops: the chunks given so far are written, then the connection is closed (the agent
    /// stays registered until it stops heart-beating).
    pub async fn close(mut self) {
        self.rx.close();
        while self.rx.try_recv().is_ok() {}
        self.task.finish().await;
    }
}

impl Stream for Agent {
    type Item = Result<AgentEvent>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.rx.poll_recv(cx)
    }
}

/// Registers (following 307 to the agent's home); returns the home.
async fn register(client: &Client, agent_id: &str) -> Result<Url> {
    let body = serde_json::json!({ "agentId": agent_id });
    let (resp, url) = client.open(None, Call::post("/agent/register").json(&body)).await?;
    drop(resp);
    let mut home = url;
    home.set_path("/");
    home.set_query(None);
    Ok(home)
}

async fn run_agent(
    client: Client,
    id: String,
    mut home: Url,
    heartbeat: Duration,
    tx: mpsc::Sender<Result<AgentEvent>>,
    state: watch::Sender<ConnectionState>,
) {
    let beat_client = client.clone();
    let beat_home = Arc::new(std::sync::Mutex::new(home.clone()));
    let beat_at = beat_home.clone();
    let beat_id = id.clone();
    let _beats = Owned::spawn(async move {
        let body = serde_json::json!({ "agentId": beat_id });
        loop {
            tokio::time::sleep(heartbeat).await;
            let at = beat_at.lock().map(|h| h.clone()).ok();
            // A failed beat is told by the WebSocket closing (forgotten, or home moved).
            let _ = beat_client.call(at.as_ref(), Call::post("/agent/heartbeat").json(&body)).await;
        }
    });
    let mut step = 0u32;
    let mut first = true;
    let mut conflicted: Option<tokio::time::Instant> = None;
    loop {
        state.send_replace(ConnectionState::Connecting);
        if !first {
            match register(&client, &id).await {
                Ok(h) => {
                    home = h;
                    if let Ok(mut b) = beat_home.lock() {
                        *b = home.clone();
                    }
                }
                Err(e) if !e.is_transient() => return fatal(&tx, &state, e).await,
                Err(e) => {
                    if !backoff(&client, &state, &tx, e.to_string(), &mut step).await {
                        return;
                    }
                    continue;
                }
            }
        }
        first = false;
        let path = query("/agent/ws", &[("agentId", Some(&id))]);
        let (mut ws, url) = match client.websocket(Some(&home), &path).await {
            Ok(x) => x,
            // One connection per agent: the broker may not have noticed the last one go yet
            // (it pings a silent peer for up to a minute); tried again for two minutes.
            Err(e)
                if e.status() == Some(409)
                    && conflicted.get_or_insert_with(tokio::time::Instant::now).elapsed()
                        < Duration::from_secs(120) =>
            {
                if !backoff(&client, &state, &tx, e.to_string(), &mut step).await {
                    return;
                }
                continue;
            }
            Err(e) if !e.is_transient() => return fatal(&tx, &state, e).await,
            Err(e) => {
                if !backoff(&client, &state, &tx, e.to_string(), &mut step).await {
                    return;
                }
                continue;
            }
        };
        state.send_replace(ConnectionState::Connected { url: url.to_string() });
        step = 0;
        conflicted = None;
        let (out_tx, mut out_rx) = mpsc::unbounded_channel::<String>();
        let mut pending: VecDeque<String> = VecDeque::new();
        let reason = loop {
            tokio::select! {
                msg = tokio::time::timeout(Duration::from_secs(75), ws.next()) => match msg.unwrap_or(None) {
                    None => break "the connection closed (or nothing heard for 75 s)".to_owned(),
                    Some(Err(e)) => break format!("reading: {e}"),
                    Some(Ok(Message::Close(f))) => {
                        break f.map_or_else(|| "closed".to_owned(), |f| format!("closed {} {}", u16::from(f.code), f.reason));
                    }
                    Some(Ok(Message::Text(t))) => {
                        let Some(ev) = agent_event(t.as_bytes(), &out_tx) else { continue };
                        if tx.send(ev).await.is_err() {
                            return close_agent(&mut ws, &mut out_rx).await;
                        }
                    }
                    Some(Ok(_)) => {}
                },
                Some(chunk) = out_rx.recv() => {
                    pending.push_back(chunk);
                    while let Ok(c) = out_rx.try_recv() {
                        pending.push_back(c);
                    }
                    let mut failed = None;
                    while let Some(c) = pending.pop_front() {
                        if let Err(e) = ws.feed(Message::text(c)).await {
                            failed = Some(format!("writing: {e}"));
                            break;
                        }
                    }
                    if let Some(f) = failed {
                        break f;
                    }
                    if let Err(e) = ws.flush().await {
                        break format!("writing: {e}");
                    }
                }
                () = tx.closed() => return close_agent(&mut ws, &mut out_rx).await,
            }
        };
        if !backoff(&client, &state, &tx, reason, &mut step).await {
            return;
        }
    }
}

/// The agent is closing: the chunks already given go out, then the close (all within 2 s).
async fn close_agent(ws: &mut crate::client::Ws, out: &mut mpsc::UnboundedReceiver<String>) {
    let closing = async {
        while let Ok(c) = out.try_recv() {
            let _ = ws.feed(Message::text(c)).await;
        }
        let _ = ws.close(None).await;
        while let Some(Ok(m)) = ws.next().await {
            if m.is_close() {
                break;
            }
        }
    };
    let _ = tokio::time::timeout(Duration::from_secs(2), closing).await;
}

/// Sleeps the next backoff delay; `false` if the agent was dropped meanwhile.
async fn backoff<T>(
    client: &Client,
    state: &watch::Sender<ConnectionState>,
    tx: &mpsc::Sender<T>,
    reason: String,
    step: &mut u32,
) -> bool {
    let delay = client.inner.backoff.delay(*step);
    *step = step.saturating_add(1);
    state.send_replace(ConnectionState::Disconnected { reason, retry_in: delay });
    tokio::select! {
        () = tokio::time::sleep(delay) => true,
        () = tx.closed() => false,
    }
}

/// What a text frame to an agent says: a turn's request or a client's control.
fn agent_event(text: &[u8], out: &mpsc::UnboundedSender<String>) -> Option<Result<AgentEvent>> {
    let event = match from_json(text) {
        Ok(e) => e,
        // Answers to chunks (`{"type":"error",...}`) are not events.
        Err(_) => {
            let v: serde_json::Value = serde_json::from_slice(text).ok()?;
            let status = v.get("status").and_then(|s| s.as_u64()).unwrap_or(0) as u16;
            if v.get("type").and_then(|t| t.as_str()) == Some("error") && status != 0 {
                let body = serde_json::to_vec(&v).unwrap_or_default();
                return Some(Err(Error::Api(Box::new(crate::error::Problem::from_answer(status, None, &body)))));
            }
            return None;
        }
    };
    let session_id = extension(&event, "emsessionid").unwrap_or_default();
    let ty = cloudevents::AttributesReader::ty(&event).to_owned();
    Some(Ok(match ty.as_str() {
        "evmesh.stream.request" => {
            let turn = extension(&event, "emturn").and_then(|t| t.parse().ok());
            AgentEvent::Turn(Turn { request: event, session_id, turn, seq: 0, out: out.clone() })
        }
        "evmesh.stream.end-turn" => AgentEvent::EndTurn { session_id, event },
        "evmesh.stream.cancel" => AgentEvent::Cancel { session_id, event },
        "evmesh.stream.close" => AgentEvent::Close { session_id, event },
        _ => return None,
    }))
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_segment_keeps_a_session_id_and_escapes_what_would_leave_the_segment() {
        assert_eq!(super::segment("echo:1f2e-3d"), "echo:1f2e-3d");
        assert_eq!(super::segment("a/b?c#d e%"), "a%2Fb%3Fc%23d%20e%25");
    }
}
