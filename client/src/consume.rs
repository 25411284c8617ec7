//! Consuming a subscription: a [`Consumer`] is a `Stream` of [`Delivery`]s that keeps itself
//! attached. One task per consumer asks `GET /session/recommend` where the subscription's home
//! is, attaches there over the chosen [`Transport`] (following 307s), sets the credit window,
//! sends acks and nacks back in batches, and when the session ends reconnects with full-jitter
//! backoff, at once after a `1012` ("home moved") or an expired token (refreshed first).
//! Offsets are the broker's: a consumer that comes back resumes after what it acknowledged,
//! and gets again what it had been given but not acknowledged (at most its window).

use std::collections::VecDeque;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use cloudevents::Event;
use futures_util::{SinkExt, Stream, StreamExt};
use reqwest::Url;
use tokio::sync::{mpsc, watch};
use tokio_tungstenite::tungstenite::Message;

use crate::client::{Call, Client};
use crate::error::{Error, Result};
use crate::event::{extension, from_json};
use crate::subscription::Filter;
use crate::task::Owned;

/// How a consumer's deliveries reach it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Transport {
    /// `GET /events/ws`: acks, nacks and credit on the socket (the default).
    #[default]
    WebSocket,
    /// `GET /events/sse`: acks over `POST /events/ack`; resumes with `Last-Event-ID`.
    Sse,
    /// `GET /events/poll` in a loop: acks over `POST /events/ack`.
    LongPoll,
}

/// The connection of a consumer (or agent, or session subscriber), as it changes.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ConnectionState {
    /// Asking where to attach, or attaching.
    Connecting,
    /// Attached at this URL.
    Connected {
        /// The instance (after redirects) that serves the session.
        url: String,
    },
    /// The session ended for `reason`; the next attempt is in `retry_in`.
    Disconnected {
        /// Why the session ended (the close code and reason, or the error).
        reason: String,
        /// The delay before the next attempt (full-jitter backoff, or zero).
        retry_in: Duration,
    },
    /// Given up for good (the consumer was dropped, or the broker refused it for a reason a
    /// retry cannot change: denied, a bad request, or a subscription unknown on three
    /// attempts in a row).
    Closed {
        /// Why.
        reason: String,
    },
}

/// Builds a [`Consumer`]; see [`Client::consumer`].
#[must_use]
pub struct ConsumerBuilder {
    client: Client,
    opts: Options,
}

#[derive(Clone)]
struct Options {
    subscription: String,
    client_id: Option<String>,
    transport: Transport,
    window: u32,
    ack: bool,
    sql: Option<String>,
    filters: Vec<Filter>,
    poll_wait: Duration,
}

impl ConsumerBuilder {
    /// The client id of a BROADCAST or MULTICAST consumer, under which its offsets are kept.
    pub fn client_id(mut self, id: impl Into<String>) -> Self {
        self.opts.client_id = Some(id.into());
        self
    }

    /// The transport (default WebSocket).
    pub fn transport(mut self, transport: Transport) -> Self {
        self.opts.transport = transport;
        self
    }

    /// How many unacknowledged deliveries the broker may have out to this consumer (per shard
    /// owning its partitions; default 256, at most 4096), set with the attach (`?credit=N`)
    /// on WebSocket and SSE; on long-poll it is the batch size (at most 1000).
    pub fn window(mut self, window: u32) -> Self {
        self.opts.window = window.clamp(1, 4096);
        self
    }

    /// Live fan-out without acknowledgements (`ack=none`; BROADCAST, WebSocket only):
    /// at-most-once, from the moment of attaching.
    pub fn no_ack(mut self) -> Self {
        self.opts.ack = false;
        self
    }

    /// A MULTICAST session's own CESQL filter.
    pub fn session_sql(mut self, expression: impl Into<String>) -> Self {
        self.opts.sql = Some(expression.into());
        self
    }

    /// A MULTICAST session's own Subscriptions API filters.
    pub fn session_filters(mut self, filters: Vec<Filter>) -> Self {
        self.opts.filters = filters;
        self
    }

    /// How long one long-poll waits for events (default 10 s, 100 ms to 60 s).
    pub fn poll_wait(mut self, wait: Duration) -> Self {
        // Polls that return at once in a loop would spin: at least 100 ms.
        self.opts.poll_wait = wait.clamp(Duration::from_millis(100), Duration::from_secs(60));
        self
    }

    /// Starts consuming: the returned stream attaches in the background. Call it inside a
    /// tokio runtime (it spawns the consumer's task).
    pub fn start(self) -> Consumer {
        let (out_tx, out_rx) = mpsc::channel(DELIVERY_QUEUE);
        let (ack_tx, ack_rx) = mpsc::unbounded_channel();
        let (state_tx, state_rx) = watch::channel(ConnectionState::Connecting);
        let task = Task {
            client: self.client,
            opts: self.opts,
            out: out_tx,
            acks: ack_rx,
            ack_tx: ack_tx.clone(),
            state: state_tx,
            generation: 0,
            last_event_id: None,
            outstanding: Default::default(),
            nacked: false,
            delivered: 0,
        };
        Consumer { rx: out_rx, state: state_rx, task: Owned::spawn(task.run()) }
    }
}

impl Client {
    /// A consumer of subscription `name`; call [`ConsumerBuilder::start`].
    pub fn consumer(&self, name: impl Into<String>) -> ConsumerBuilder {
        ConsumerBuilder {
            client: self.clone(),
            opts: Options {
                subscription: name.into(),
                client_id: None,
                transport: Transport::default(),
                window: 256,
                ack: true,
                sql: None,
                filters: Vec::new(),
                poll_wait: Duration::from_secs(10),
            },
        }
    }
}

/// A stream of deliveries of one subscription that reconnects by itself. It ends (after one
/// `Err`) only when the broker refuses it for good; dropping it closes the session. An `Err`
/// followed by more deliveries is one event this client could not read (nacked for it, so it
/// is dead-lettered after its attempts rather than lost).
#[must_use = "a consumer does nothing unless polled, and dropping it closes its session"]
pub struct Consumer {
    rx: mpsc::Receiver<Result<Delivery>>,
    state: watch::Receiver<ConnectionState>,
    task: Owned,
}

impl Consumer {
    /// Stops consuming: the acks and nacks given so far are sent (to a session that is
    /// attached), then the session is closed. Dropping a consumer closes it without waiting.
    pub async fn close(mut self) {
        self.rx.close();
        while self.rx.try_recv().is_ok() {}
        self.task.finish().await;
    }

    /// The connection's state, to watch (`changed().await`) or read.
    pub fn state(&self) -> watch::Receiver<ConnectionState> {
        self.state.clone()
    }

    /// The next delivery (`None` once the consumer has ended).
    pub async fn next_delivery(&mut self) -> Option<Result<Delivery>> {
        self.rx.recv().await
    }
}

impl Stream for Consumer {
    type Item = Result<Delivery>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.rx.poll_recv(cx)
    }
}

/// One event given to a consumer. Acknowledge it with [`ack`](Self::ack) once it is handled;
/// what is not acknowledged within the subscription's `ackTimeoutMs` (or is nacked) is
/// delivered again. Deliveries are at least once: dedupe on the event's `id` if it matters.
#[derive(Debug)]
#[non_exhaustive]
pub struct Delivery {
    /// The event, with the broker's `em*` extensions.
    pub event: Event,
    /// The delivery id (`emdeliveryid`), what acks name.
    pub id: String,
    /// The partition the event is stored in.
    pub partition: u32,
    /// Its offset there.
    pub offset: u64,
    /// Which delivery of the event this is (1 for the first).
    pub attempt: u32,
    acker: Acker,
    /// Acked or nacked already: a second call is a no-op.
    settled: std::sync::atomic::AtomicBool,
}

#[derive(Debug, Clone)]
struct Acker {
    tx: mpsc::UnboundedSender<AckMsg>,
    generation: u64,
}

#[derive(Debug)]
struct AckMsg {
    generation: u64,
    id: String,
    nack: bool,
}

impl Delivery {
    /// Acknowledges the event: it will not be delivered again. Acks are sent in batches, right
    /// away; one that cannot be sent (the session ended first) means the event comes again.
    /// Only the first `ack` or `nack` of a delivery counts.
    pub fn ack(&self) {
        self.settle(false);
    }

    /// Refuses the event: it is delivered again after the redelivery backoff (and
    /// dead-lettered once its attempts are spent).
    pub fn nack(&self) {
        self.settle(true);
    }

    fn settle(&self, nack: bool) {
        if self.settled.swap(true, std::sync::atomic::Ordering::Relaxed) {
            return;
        }
        let msg = AckMsg { generation: self.acker.generation, id: self.id.clone(), nack };
        let _ = self.acker.tx.send(msg);
    }
}

/// Attempts in a row that must meet a 404 before a consumer gives up on its subscription.
const UNKNOWN_TRIES: u32 = 3;

/// Deliveries read ahead of the user. With acks the broker's window bounds them anyway; with
/// `ack=none` a user that falls this far behind stops the reading, and the broker sheds the
/// session (1008) rather than the client growing without bound.
const DELIVERY_QUEUE: usize = 4096;

/// Ids in one ack message or request (the broker takes at most 10,000).
const ACK_BATCH: usize = 4096;

/// A WebSocket silent this long is dead (the broker pings a silent peer every 30 s).
const WS_SILENCE: Duration = Duration::from_secs(75);

/// A session that lasted this long (or delivered something) resets the backoff.
const SETTLED: Duration = Duration::from_secs(10);

/// How a session ended.
enum End {
    /// The consumer was dropped.
    Stopped,
    /// A refusal no retry changes.
    Fatal(Error),
    /// Try again: at once (`immediate`) or after the backoff (at least `after`).
    Retry { reason: String, immediate: bool, after: Option<Duration>, attached: bool },
}

struct Task {
    client: Client,
    opts: Options,
    out: mpsc::Sender<Result<Delivery>>,
    acks: mpsc::UnboundedReceiver<AckMsg>,
    ack_tx: mpsc::UnboundedSender<AckMsg>,
    state: watch::Sender<ConnectionState>,
    generation: u64,
    /// The last SSE delivery id seen, for `Last-Event-ID`.
    last_event_id: Option<String>,
    /// Delivery ids of this session not yet acked.
    outstanding: std::collections::HashSet<String>,
    /// Whether something of this session was nacked (then no `Last-Event-ID`: it would ack it).
    nacked: bool,
    /// Deliveries of this session so far.
    delivered: u64,
}

impl Task {
    async fn run(mut self) {
        let mut step = 0u32;
        let mut seed = 0usize;
        let mut unknown = 0u32;
        let mut was_immediate = false;
        loop {
            self.state.send_replace(ConnectionState::Connecting);
            self.generation += 1;
            let began = tokio::time::Instant::now();
            self.delivered = 0;
            let end = match self.recommend(&mut seed).await {
                Ok(home) => self.session(home).await,
                Err(end) => end,
            };
            let settled = began.elapsed() >= SETTLED || self.delivered > 0;
            // With many instances a subscription made at one a moment ago may not have reached
            // its home yet: a 404 is final only when three attempts in a row meet it.
            let end = match end {
                End::Fatal(e) if e.status() == Some(404) && unknown < UNKNOWN_TRIES - 1 => {
                    unknown += 1;
                    End::Retry { reason: e.to_string(), immediate: false, after: None, attached: false }
                }
                End::Fatal(e) => End::Fatal(e),
                other => {
                    unknown = 0;
                    other
                }
            };
            let (reason, immediate, after) = match end {
                End::Stopped => return,
                End::Fatal(e) => {
                    self.state.send_replace(ConnectionState::Closed { reason: e.to_string() });
                    let _ = self.out.send(Err(e)).await;
                    return;
                }
                End::Retry { reason, immediate, after, attached } => {
                    // A session that ends as soon as it began (a broker shedding, two clients
                    // fighting) does not reset the backoff.
                    if attached && settled {
                        step = 0;
                    }
                    (reason, immediate, after)
                }
            };
            // At once after a 1012 or an expired token, but never twice in a row.
            let immediate = immediate && !was_immediate;
            was_immediate = immediate;
            let backoff = self.client.inner.backoff;
            let delay = if immediate {
                Duration::ZERO
            } else {
                // Retry-After is honoured up to the backoff's ceiling: a broker cannot park
                // a client for longer than its own configuration allows.
                let d = backoff.delay(step).max(after.unwrap_or_default().min(backoff.max));
                step = step.saturating_add(1);
                d
            };
            self.state.send_replace(ConnectionState::Disconnected { reason, retry_in: delay });
            tokio::select! {
                () = tokio::time::sleep(delay) => {}
                () = self.out.closed() => return,
            }
        }
    }

    /// The subscription's home, asked of each URL the client knows in turn.
    async fn recommend(&mut self, seed: &mut usize) -> Result<Option<Url>, End> {
        let seeds = self.client.inner.seeds.clone();
        let path = query("/session/recommend", &[("subscription", Some(&self.opts.subscription))]);
        let mut last = None;
        for _ in 0..seeds.len() {
            let base = &seeds[*seed % seeds.len()];
            match self.client.call(Some(base), Call::get(path.clone())).await {
                Ok(a) => {
                    let url = a
                        .json::<serde_json::Value>()
                        .ok()
                        .and_then(|v| v.get("instanceUrl").and_then(|u| u.as_str()).and_then(|u| Url::parse(u).ok()));
                    // Never leave https for an http home.
                    return Ok(url
                        .filter(|u| base.scheme() != "https" || u.scheme() == "https")
                        .or(Some(base.clone())));
                }
                Err(e) if !e.is_transient() => return Err(End::Fatal(e)),
                Err(e) => last = Some(e),
            }
            *seed += 1;
        }
        let e = last.map_or_else(|| "no url".to_owned(), |e| e.to_string());
        Err(End::Retry { reason: format!("recommend: {e}"), immediate: false, after: None, attached: false })
    }

    async fn session(&mut self, home: Option<Url>) -> End {
        self.outstanding.clear();
        self.nacked = false;
        match self.opts.transport {
            Transport::WebSocket => self.websocket(home).await,
            Transport::Sse => self.sse(home).await,
            Transport::LongPoll => self.poll(home).await,
        }
    }

    fn attach_query(&self, path: &str) -> String {
        let o = &self.opts;
        let filters = (!o.filters.is_empty()).then(|| serde_json::to_string(&o.filters).unwrap_or_default());
        // The window rides on the attach, so the first burst already keeps to it.
        let credit = (o.ack && o.transport != Transport::LongPoll).then(|| o.window.to_string());
        query(
            path,
            &[
                ("subscription", Some(&o.subscription)),
                ("clientId", o.client_id.as_ref()),
                ("ack", (!o.ack).then(|| "none".to_owned()).as_ref()),
                ("credit", credit.as_ref()),
                ("sql", o.sql.as_ref()),
                ("filters", filters.as_ref()),
            ],
        )
    }

    /// Hands one delivered event to the consumer (waiting while it is `DELIVERY_QUEUE`
    /// behind); `Err` once the consumer is gone.
    async fn deliver(&mut self, json: &[u8]) -> std::result::Result<(), ()> {
        let d = match parse_delivery(json) {
            Ok((event, id, partition, offset, attempt)) => Delivery {
                event,
                id,
                partition,
                offset,
                attempt,
                acker: Acker { tx: self.ack_tx.clone(), generation: self.generation },
                settled: std::sync::atomic::AtomicBool::new(false),
            },
            Err(e) => {
                // Not an event this client can read: refused so that it is dead-lettered
                // rather than silently skipped, and said.
                if let Some(id) = delivery_id(json) {
                    let _ = self.ack_tx.send(AckMsg { generation: self.generation, id, nack: true });
                }
                return self.out.send(Err(e)).await.map_err(|_| ());
            }
        };
        self.delivered += 1;
        self.outstanding.insert(d.id.clone());
        if self.opts.transport == Transport::Sse {
            self.last_event_id = Some(d.id.clone());
        }
        self.out.send(Ok(d)).await.map_err(|_| ())
    }

    /// The acks and nacks waiting now, split into those of this session and older ones.
    fn drain_acks(&mut self, first: AckMsg) -> Settled {
        let mut s = Settled::default();
        let mut next = Some(first);
        while let Some(m) = next {
            let list = match (m.generation == self.generation, m.nack) {
                (true, false) => &mut s.acks,
                (true, true) => &mut s.nacks,
                (false, false) => &mut s.stale_acks,
                (false, true) => &mut s.stale_nacks,
            };
            if m.generation == self.generation {
                if m.nack {
                    self.nacked = true;
                } else {
                    self.outstanding.remove(&m.id);
                }
            }
            list.push(m.id);
            next = self.acks.try_recv().ok();
        }
        s
    }

    /// Acks over `POST /events/ack` at `base` (SSE, long-poll, and acks of ended sessions: the
    /// consumer outlives its session by a while at the broker, so they still count there).
    async fn post_acks(&self, base: Option<&Url>, ids: Vec<String>, nack: bool) -> Result<()> {
        for ids in ids.chunks(ACK_BATCH) {
            let mut body = serde_json::json!({ "subscription": self.opts.subscription, "ids": ids });
            if let Some(c) = &self.opts.client_id {
                body["clientId"] = c.clone().into();
            }
            if nack {
                body["nack"] = true.into();
            }
            self.client.call(base, Call::post("/events/ack").json(&body)).await?;
        }
        Ok(())
    }

    async fn post_stale(&self, base: Option<&Url>, s: &mut Settled) {
        // Best effort: what does not count is delivered again.
        let _ = self.post_acks(base, std::mem::take(&mut s.stale_acks), false).await;
        let _ = self.post_acks(base, std::mem::take(&mut s.stale_nacks), true).await;
    }

    async fn websocket(&mut self, home: Option<Url>) -> End {
        let path = self.attach_query("/events/ws");
        let (mut ws, url) = match self.client.websocket(home.as_ref(), &path).await {
            Ok(x) => x,
            Err(e) => return refused(e),
        };
        self.state.send_replace(ConnectionState::Connected { url: url.to_string() });
        let mut heard = tokio::time::Instant::now();
        let mut silence = tokio::time::interval(WS_SILENCE / 5);
        loop {
            tokio::select! {
                // Deliveries first: acks wait while more frames are already here, so one ack
                // message carries all a burst brought (and the broker reads one, not many).
                biased;
                msg = ws.next() => match msg {
                    None => return retry("the connection closed".into(), true),
                    Some(Err(e)) => return retry(format!("reading: {e}"), true),
                    Some(Ok(Message::Text(t))) => {
                        heard = tokio::time::Instant::now();
                        if self.deliver(t.as_bytes()).await.is_err() {
                            return self.close_websocket(&mut ws).await;
                        }
                    }
                    Some(Ok(Message::Close(frame))) => {
                        let (code, reason) = frame.map_or((1005, String::new()), |f| (u16::from(f.code), f.reason.to_string()));
                        return self.closed(code, reason).await;
                    }
                    // Pings (the broker's keepalive) and pongs count as heard.
                    Some(Ok(_)) => heard = tokio::time::Instant::now(),
                },
                Some(first) = self.acks.recv() => {
                    let mut s = self.drain_acks(first);
                    let (acks, nacks) = (std::mem::take(&mut s.acks), std::mem::take(&mut s.nacks));
                    if let Err(e) = send_settled(&mut ws, acks, nacks).await {
                        return retry(e, true);
                    }
                    self.post_stale(Some(&url), &mut s).await;
                }
                // Liveness is checked every few seconds against the last frame heard, rather
                // than with a timer made and dropped for every delivery.
                _ = silence.tick() => {
                    if heard.elapsed() >= WS_SILENCE {
                        return retry(format!("reading: {}", silent()), true);
                    }
                }
                () = self.out.closed() => return self.close_websocket(&mut ws).await,
            }
        }
    }

    /// Closing (the consumer closed or dropped): the acks and nacks given so far go out first,
    /// then the close, and the broker's answer to it is awaited (at most 2 s in all) so that
    /// it has read them; acks of sessions that ended before go over HTTP, as they would have.
    async fn close_websocket(&mut self, ws: &mut crate::client::Ws) -> End {
        let mut s = match self.acks.try_recv() {
            Ok(first) => self.drain_acks(first),
            Err(_) => Settled::default(),
        };
        let (acks, nacks) = (std::mem::take(&mut s.acks), std::mem::take(&mut s.nacks));
        let closing = async {
            let _ = send_settled(ws, acks, nacks).await;
            let _ = ws.close(None).await;
            while let Some(Ok(m)) = ws.next().await {
                if m.is_close() {
                    break;
                }
            }
        };
        let _ = tokio::time::timeout(Duration::from_secs(2), closing).await;
        self.post_stale(None, &mut s).await;
        End::Stopped
    }

    /// What a close code from the broker means for the next attempt.
    async fn closed(&mut self, code: u16, reason: String) -> End {
        let text = format!("closed {code} {reason}").trim_end().to_owned();
        match (code, reason.as_str()) {
            // Home moved (or the topic grew): ask recommend again, at once.
            (1012, _) => retry(text, true).immediate(),
            (1008, "token expired") => match self.client.token_rejected().await {
                Ok(true) => retry(text, true).immediate(),
                Ok(false) => End::Fatal(Error::Closed { code, reason }),
                Err(e) => End::Fatal(e),
            },
            (1008, "access revoked") | (1002 | 1003 | 1007, _) => End::Fatal(Error::Closed { code, reason }),
            _ => retry(text, true),
        }
    }

    async fn sse(&mut self, home: Option<Url>) -> End {
        let path = self.attach_query("/events/sse");
        let mut call = Call::get(path).header("accept", "text/event-stream").timeout(None);
        if let Some(id) = self.last_event_id.take() {
            call = call.header("last-event-id", id);
        }
        let (resp, url) = match self.client.open(home.as_ref(), call).await {
            Ok(x) => x,
            Err(e) => return refused(e),
        };
        self.state.send_replace(ConnectionState::Connected { url: url.to_string() });
        let mut body = resp.bytes_stream();
        let mut parser = SseParser::default();
        // The broker sends a comment every 15 s: silence past three of them is a dead connection.
        let idle = Duration::from_secs(45);
        loop {
            tokio::select! {
                chunk = tokio::time::timeout(idle, body.next()) => match chunk {
                    Err(_) => return self.sse_end("no heartbeat for 45 s".into()),
                    Ok(None) => return self.sse_end("the stream ended".into()),
                    Ok(Some(Err(e))) => return self.sse_end(format!("reading: {e}")),
                    Ok(Some(Ok(bytes))) => {
                        let events = match parser.feed(&bytes) {
                            Ok(events) => events,
                            Err(e) => return self.sse_end(e.to_string()),
                        };
                        for ev in events {
                            if self.deliver(ev.data.as_bytes()).await.is_err() {
                                self.flush_acks(Some(&url)).await;
                                return End::Stopped;
                            }
                        }
                    }
                },
                Some(first) = self.acks.recv() => {
                    let mut s = self.drain_acks(first);
                    let (acks, nacks) = (std::mem::take(&mut s.acks), std::mem::take(&mut s.nacks));
                    if let Err(e) = self.post_acks(Some(&url), acks, false).await {
                        return self.sse_end(format!("acking: {e}"));
                    }
                    if let Err(e) = self.post_acks(Some(&url), nacks, true).await {
                        return self.sse_end(format!("nacking: {e}"));
                    }
                    self.post_stale(Some(&url), &mut s).await;
                }
                () = self.out.closed() => {
                    self.flush_acks(Some(&url)).await;
                    return End::Stopped;
                }
            }
        }
    }

    /// Sends every ack and nack waiting, over HTTP (closing an SSE or long-poll consumer).
    async fn flush_acks(&mut self, base: Option<&Url>) {
        if let Ok(first) = self.acks.try_recv() {
            let mut s = self.drain_acks(first);
            let _ = self.post_acks(base, std::mem::take(&mut s.acks), false).await;
            let _ = self.post_acks(base, std::mem::take(&mut s.nacks), true).await;
            self.post_stale(base, &mut s).await;
        }
    }

    /// An SSE session ended: `Last-Event-ID` is offered on the next attach only when every
    /// delivery of this one was acked and none nacked, since the broker takes it as an ack of
    /// the partition up to that event.
    fn sse_end(&mut self, reason: String) -> End {
        if !self.outstanding.is_empty() || self.nacked {
            self.last_event_id = None;
        }
        retry(reason, true)
    }

    async fn poll(&mut self, home: Option<Url>) -> End {
        let wait = self.opts.poll_wait;
        let max = self.opts.window.min(1000).to_string();
        let ms = wait.as_millis().to_string();
        let path = self.attach_query("/events/poll");
        let path = format!("{path}&max={max}&waitMs={ms}");
        let limit = wait + self.client.inner.timeout;
        let mut base = home;
        let mut attached = false;
        loop {
            let client = self.client.clone();
            let call = Call::get(path.clone()).timeout(Some(limit));
            let at = base.clone();
            let mut poll = Box::pin(async move { client.open(at.as_ref(), call).await });
            let answer = loop {
                tokio::select! {
                    r = &mut poll => break r,
                    Some(first) = self.acks.recv() => {
                        let mut s = self.drain_acks(first);
                        let (acks, nacks) = (std::mem::take(&mut s.acks), std::mem::take(&mut s.nacks));
                        let _ = self.post_acks(base.as_ref(), acks, false).await;
                        let _ = self.post_acks(base.as_ref(), nacks, true).await;
                        self.post_stale(base.as_ref(), &mut s).await;
                    }
                    () = self.out.closed() => {
                        self.flush_acks(base.as_ref()).await;
                        return End::Stopped;
                    }
                }
            };
            let (resp, url) = match answer {
                Ok(x) => x,
                Err(e) if attached && e.is_transient() => return retry(e.to_string(), true),
                Err(e) => return refused(e),
            };
            if !attached {
                attached = true;
                self.state.send_replace(ConnectionState::Connected { url: url.to_string() });
            }
            // Later polls and acks go where the first was served.
            base = Some(url);
            if resp.status().as_u16() == 204 {
                continue;
            }
            let body = match resp.bytes().await {
                Ok(b) => b,
                Err(e) => return retry(format!("reading a poll: {e}"), true),
            };
            let events: Vec<Box<serde_json::value::RawValue>> = match serde_json::from_slice(&body) {
                Ok(v) => v,
                Err(e) => return retry(format!("a poll answer that is not a JSON array: {e}"), true),
            };
            for ev in events {
                if self.deliver(ev.get().as_bytes()).await.is_err() {
                    self.flush_acks(base.as_ref()).await;
                    return End::Stopped;
                }
            }
        }
    }
}

#[derive(Default)]
struct Settled {
    acks: Vec<String>,
    nacks: Vec<String>,
    stale_acks: Vec<String>,
    stale_nacks: Vec<String>,
}

/// Sends acks and nacks as WebSocket messages of at most `ACK_BATCH` ids each.
async fn send_settled(
    ws: &mut crate::client::Ws,
    acks: Vec<String>,
    nacks: Vec<String>,
) -> std::result::Result<(), String> {
    for (ids, kind) in [(acks, "ack"), (nacks, "nack")] {
        for ids in ids.chunks(ACK_BATCH) {
            let frame = serde_json::json!({ "type": kind, "ids": ids }).to_string();
            ws.send(Message::text(frame)).await.map_err(|e| format!("sending {kind}s: {e}"))?;
        }
    }
    Ok(())
}

/// The error of a WebSocket that stayed silent past `WS_SILENCE`.
fn silent() -> tokio_tungstenite::tungstenite::Error {
    tokio_tungstenite::tungstenite::Error::Io(std::io::Error::new(
        std::io::ErrorKind::TimedOut,
        format!("nothing heard for {} s", WS_SILENCE.as_secs()),
    ))
}

fn retry(reason: String, attached: bool) -> End {
    End::Retry { reason, immediate: false, after: None, attached }
}

impl End {
    fn immediate(self) -> End {
        match self {
            End::Retry { reason, after, attached, .. } => End::Retry { reason, immediate: true, after, attached },
            other => other,
        }
    }
}

/// An attach the broker refused or that failed: for good (400, 401 after a refresh, 403,
/// 404, 409...) or for now (429, 503: after `Retry-After`; a connection failure).
fn refused(e: Error) -> End {
    if e.is_transient() {
        let after = e.problem().and_then(|p| p.retry_after);
        End::Retry { reason: e.to_string(), immediate: false, after, attached: false }
    } else {
        End::Fatal(e)
    }
}

/// `path?k=v&...` with the values percent-encoded (`None`s left out).
pub(crate) fn query(path: &str, pairs: &[(&str, Option<&String>)]) -> String {
    let mut q = url::form_urlencoded::Serializer::new(String::new());
    for (k, v) in pairs {
        if let Some(v) = v {
            q.append_pair(k, v);
        }
    }
    let q = q.finish();
    if q.is_empty() {
        path.to_owned()
    } else {
        format!("{path}?{q}")
    }
}

/// The event and its `em*` delivery extensions.
fn parse_delivery(json: &[u8]) -> Result<(Event, String, u32, u64, u32)> {
    let event = from_json(json)?;
    let id =
        extension(&event, "emdeliveryid").ok_or_else(|| Error::Protocol("a delivery without emdeliveryid".into()))?;
    let num = |name: &str| extension(&event, name).and_then(|v| v.parse::<u64>().ok());
    let partition = num("empartition").unwrap_or_default() as u32;
    let offset = num("emoffset").unwrap_or_default();
    let attempt = num("emattempt").unwrap_or(1) as u32;
    Ok((event, id, partition, offset, attempt))
}

/// The delivery id of an event this client could not read as a CloudEvent.
fn delivery_id(json: &[u8]) -> Option<String> {
    let v: serde_json::Value = serde_json::from_slice(json).ok()?;
    v.get("emdeliveryid")?.as_str().map(str::to_owned)
}

/// The most one server-sent event may hold (the broker's events are at most `max_body_bytes`,
/// 1 MiB by default, plus their `em*` extensions).
const SSE_LIMIT: usize = 16 * 1024 * 1024;

/// One `text/event-stream` event.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct SseEvent {
    pub(crate) id: Option<String>,
    pub(crate) event: Option<String>,
    pub(crate) data: String,
}

/// An incremental `text/event-stream` parser (WHATWG HTML, "server-sent events"): bytes in any
/// chunking, complete events out.
#[derive(Default)]
pub(crate) struct SseParser {
    line: Vec<u8>,
    current: SseEvent,
    has_data: bool,
    after_cr: bool,
}

impl SseParser {
    /// The events `bytes` complete; `Err` once a line or an event passes `SSE_LIMIT` (a stream
    /// that never ends a line must not grow the client without bound).
    pub(crate) fn feed(&mut self, bytes: &[u8]) -> Result<VecDeque<SseEvent>> {
        let mut out = VecDeque::new();
        if self.line.len() + self.current.data.len() + bytes.len() > SSE_LIMIT
            && self.line.len() + self.current.data.len() > SSE_LIMIT / 2
        {
            return Err(Error::Protocol(format!("a server-sent event over {} bytes", SSE_LIMIT)));
        }
        for &b in bytes {
            if self.after_cr {
                self.after_cr = false;
                if b == b'\n' {
                    continue;
                }
            }
            match b {
                b'\n' | b'\r' => {
                    self.after_cr = b == b'\r';
                    let line = std::mem::take(&mut self.line);
                    self.line(&line, &mut out);
                }
                _ => self.line.push(b),
            }
        }
        Ok(out)
    }

    fn line(&mut self, line: &[u8], out: &mut VecDeque<SseEvent>) {
        if line.is_empty() {
            let ev = std::mem::take(&mut self.current);
            if std::mem::take(&mut self.has_data) {
                out.push_back(ev);
            }
            return;
        }
        if line[0] == b':' {
            return;
        }
        let line = String::from_utf8_lossy(line);
        let (field, value) = match line.split_once(':') {
            Some((f, v)) => (f, v.strip_prefix(' ').unwrap_or(v)),
            None => (line.as_ref(), ""),
        };
        match field {
            "data" => {
                if self.has_data {
                    self.current.data.push('\n');
                }
                self.current.data.push_str(value);
                self.has_data = true;
            }
            "id" => self.current.id = Some(value.to_owned()),
            "event" => self.current.event = Some(value.to_owned()),
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sse_events_come_out_whole_at_every_split_point() {
        let text = b": hello\r\nid: d-1\nevent: chunk\ndata: {\"a\":\ndata: 1}\n\nid:d-2\ndata:x\r\n\r\n: hb\n\n";
        let expected = vec![
            SseEvent { id: Some("d-1".into()), event: Some("chunk".into()), data: "{\"a\":\n1}".into() },
            SseEvent { id: Some("d-2".into()), event: None, data: "x".into() },
        ];
        for split in 0..=text.len() {
            let mut p = SseParser::default();
            let mut got: Vec<_> = p.feed(&text[..split]).unwrap().into_iter().collect();
            got.extend(p.feed(&text[split..]).unwrap());
            assert_eq!(got, expected, "split at {split}");
        }
    }

    #[test]
    fn an_event_that_never_ends_is_refused_not_grown() {
        let mut p = SseParser::default();
        let chunk = vec![b'x'; 1 << 20];
        let mut fed = 0;
        let refused = loop {
            match p.feed(&chunk) {
                Ok(_) => fed += chunk.len(),
                Err(e) => break e,
            }
            assert!(fed <= 2 * SSE_LIMIT, "still growing at {fed} bytes");
        };
        assert!(matches!(refused, Error::Protocol(_)), "{refused}");
    }

    #[test]
    fn only_the_first_ack_or_nack_of_a_delivery_counts() {
        let (tx, mut rx) = mpsc::unbounded_channel();
        let d = Delivery {
            event: from_json(br#"{"specversion":"1.0","id":"e","source":"/s","type":"t"}"#).unwrap(),
            id: "0:1:1".into(),
            partition: 0,
            offset: 1,
            attempt: 1,
            acker: Acker { tx, generation: 1 },
            settled: std::sync::atomic::AtomicBool::new(false),
        };
        d.nack();
        d.ack();
        d.nack();
        let first = rx.try_recv().unwrap();
        assert!(first.nack && first.id == "0:1:1");
        assert!(rx.try_recv().is_err(), "a second settle of one delivery");
    }

    #[test]
    fn a_delivery_carries_its_place() {
        let json = br#"{"specversion":"1.0","id":"e","source":"/s","type":"t","emdeliveryid":"0.3.7","empartition":3,"emoffset":"7","emattempt":2}"#;
        let (ev, id, p, o, a) = parse_delivery(json).unwrap();
        assert_eq!((id.as_str(), p, o, a), ("0.3.7", 3, 7, 2));
        assert_eq!(cloudevents::AttributesReader::id(&ev), "e");
        assert!(parse_delivery(br#"{"specversion":"1.0","id":"e","source":"/s","type":"t"}"#).is_err());
    }

    #[test]
    fn queries_are_percent_encoded() {
        let sql = "a = 'x y'&b".to_owned();
        let s = "s".to_owned();
        assert_eq!(
            query("/p", &[("subscription", Some(&s)), ("clientId", None), ("sql", Some(&sql))]),
            "/p?subscription=s&sql=a+%3D+%27x+y%27%26b"
        );
        assert_eq!(query("/p", &[("x", None)]), "/p");
    }
}
