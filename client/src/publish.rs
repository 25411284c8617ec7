//! Publishing: one event or a batch over `POST /events/publish`, and a pipelined
//! [`Publisher`] over `GET /events/ws?publish=T` that keeps up to `max_in_flight` events
//! unanswered and hands each its own result.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use cloudevents::{AttributesReader, Event};
use futures_util::{SinkExt, StreamExt};
use serde::{Deserialize, Deserializer};
use tokio::sync::{mpsc, oneshot, Semaphore};
use tokio_tungstenite::tungstenite::Message;

use crate::client::{Call, Client};
use crate::consume::query;
use crate::error::{Error, Problem, Result};
use crate::event::{to_binary, to_json, ContentMode};

/// Where a published event was stored.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[non_exhaustive]
pub struct Published {
    /// The partition.
    pub partition: u32,
    /// The offset in that partition.
    #[serde(deserialize_with = "number_or_string")]
    pub offset: u64,
    /// The topic it went to when a route moved it elsewhere.
    #[serde(default)]
    pub topic: Option<String>,
}

/// An offset as a JSON number (HTTP answers) or a string (WebSocket answers), read in one pass.
fn number_or_string<'de, D: Deserializer<'de>>(d: D) -> std::result::Result<u64, D::Error> {
    struct Offset;
    impl serde::de::Visitor<'_> for Offset {
        type Value = u64;
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("an offset, as a number or a string of digits")
        }
        fn visit_u64<E: serde::de::Error>(self, n: u64) -> std::result::Result<u64, E> {
            Ok(n)
        }
        fn visit_str<E: serde::de::Error>(self, s: &str) -> std::result::Result<u64, E> {
            s.parse().map_err(E::custom)
        }
    }
    d.deserialize_any(Offset)
}

impl Client {
    /// Publishes `event` to `topic` in structured mode; `Ok` once the broker stored it at its
    /// configured durability.
    pub async fn publish(&self, topic: &str, event: &Event) -> Result<Published> {
        self.publish_as(topic, event, ContentMode::Structured).await
    }

    /// Publishes `event` to `topic` in the given content mode.
    pub async fn publish_as(&self, topic: &str, event: &Event, mode: ContentMode) -> Result<Published> {
        let path = query("/events/publish", &[("topic", Some(&topic.to_owned()))]);
        let call = match mode {
            ContentMode::Structured => Call::post(path).body(to_json(event)?, "application/cloudevents+json"),
            ContentMode::Binary => {
                let (headers, body) = to_binary(event);
                let mut call = Call::post(path);
                call.body_bytes = Some(body.into());
                for (k, v) in headers {
                    call = call.header(k, v);
                }
                call
            }
        };
        self.call(None, call).await?.json()
    }

    /// Publishes `events` to `topic` as one batch (`application/cloudevents-batch+json`): all
    /// are stored, results in order, or none (an invalid event refuses the batch).
    pub async fn publish_batch(&self, topic: &str, events: &[Event]) -> Result<Vec<Published>> {
        #[derive(Deserialize)]
        struct Results {
            results: Vec<Published>,
        }
        let path = query("/events/publish", &[("topic", Some(&topic.to_owned()))]);
        let body = serde_json::to_vec(events).map_err(|e| Error::Config(format!("events do not serialize: {e}")))?;
        let a = self.call(None, Call::post(path).body(body, "application/cloudevents-batch+json")).await?;
        Ok(a.json::<Results>()?.results)
    }

    /// A pipelined publisher to `topic` over one WebSocket, at most 256 events in flight.
    pub async fn publisher(&self, topic: &str) -> Result<Publisher> {
        self.publisher_with(topic, 256).await
    }

    /// A pipelined publisher to `topic` with at most `max_in_flight` unanswered events (1 to
    /// 4096).
    pub async fn publisher_with(&self, topic: &str, max_in_flight: usize) -> Result<Publisher> {
        let path = query("/events/ws", &[("publish", Some(&topic.to_owned()))]);
        let (ws, _) = self.websocket(None, &path).await?;
        let (tx, rx) = mpsc::unbounded_channel();
        // Beyond a few thousand the broker's answers and our writes can fill both sockets'
        // buffers at once (neither side reads while it writes): bounded here.
        let max_in_flight = max_in_flight.clamp(1, MAX_IN_FLIGHT);
        tokio::spawn(pump(ws, rx));
        Ok(Publisher { tx, room: Arc::new(Semaphore::new(max_in_flight)), max_in_flight })
    }
}

/// The most events a publisher keeps unanswered.
const MAX_IN_FLIGHT: usize = 4096;

/// A publisher idle this long pings the broker, which closes a connection silent for its
/// `idle_timeout_ms` (60 s by default).
const KEEPALIVE: std::time::Duration = std::time::Duration::from_secs(20);

/// Publishes over one WebSocket without waiting for each answer: [`send`](Self::send) returns
/// once the event is written, with a [`Receipt`] that resolves to its own result. When the
/// connection is lost, every unanswered event's receipt is an [`Error::Disconnected`] (it may
/// or may not have been stored) and later sends fail the same way: make a new publisher.
pub struct Publisher {
    tx: mpsc::UnboundedSender<Outgoing>,
    room: Arc<Semaphore>,
    max_in_flight: usize,
}

struct Outgoing {
    id: String,
    json: String,
    done: oneshot::Sender<Result<Published>>,
    _permit: tokio::sync::OwnedSemaphorePermit,
}

/// The result of one event a [`Publisher`] sent; a future.
pub struct Receipt(oneshot::Receiver<Result<Published>>);

impl Future for Receipt {
    type Output = Result<Published>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        Pin::new(&mut self.0)
            .poll(cx)
            .map(|r| r.unwrap_or_else(|_| Err(Error::Disconnected("the publisher's connection ended".into()))))
    }
}

impl Publisher {
    /// Sends `event`, waiting only while `max_in_flight` events are unanswered.
    pub async fn send(&self, event: &Event) -> Result<Receipt> {
        let permit =
            self.room.clone().acquire_owned().await.map_err(|_| Error::Disconnected("publisher closed".into()))?;
        let json = String::from_utf8(to_json(event)?).map_err(|e| Error::Config(e.to_string()))?;
        let (done, rx) = oneshot::channel();
        let out = Outgoing { id: event.id().to_owned(), json, done, _permit: permit };
        self.tx.send(out).map_err(|_| Error::Disconnected("the publisher's connection ended".into()))?;
        Ok(Receipt(rx))
    }

    /// Sends `event` and waits for its result.
    pub async fn publish(&self, event: &Event) -> Result<Published> {
        self.send(event).await?.await
    }

    /// Waits until every event sent so far is answered.
    pub async fn flush(&self) -> Result<()> {
        let n = u32::try_from(self.max_in_flight).unwrap_or(u32::MAX);
        let all = self.room.acquire_many(n).await.map_err(|_| Error::Disconnected("publisher closed".into()))?;
        drop(all);
        Ok(())
    }
}

/// The publisher's connection: writes what is queued (flushing once the queue is empty, so a
/// burst goes out in few writes) and matches each answer to the oldest unanswered event of
/// its id (the broker answers in order).
async fn pump(mut ws: crate::client::Ws, mut rx: mpsc::UnboundedReceiver<Outgoing>) {
    let mut waiting: VecDeque<(String, oneshot::Sender<Result<Published>>, tokio::sync::OwnedSemaphorePermit)> =
        VecDeque::new();
    let ended = loop {
        tokio::select! {
            () = tokio::time::sleep(KEEPALIVE) => {
                if let Err(e) = ws.send(Message::Ping(Default::default())).await {
                    break format!("writing: {e}");
                }
            }
            out = rx.recv() => {
                let Some(first) = out else {
                    if waiting.is_empty() {
                        let _ = ws.close(None).await;
                        return;
                    }
                    // Every sender is gone: read the answers still owed, then close.
                    match drain_answers(&mut ws, &mut waiting).await {
                        Ok(()) => { let _ = ws.close(None).await; return; }
                        Err(e) => break e,
                    }
                };
                let mut next = Some(first);
                let mut failed = None;
                while let Some(o) = next {
                    if let Err(e) = ws.feed(Message::text(o.json)).await {
                        let _ = o.done.send(Err(Error::Disconnected(format!("writing: {e}"))));
                        failed = Some(format!("writing: {e}"));
                        break;
                    }
                    waiting.push_back((o.id, o.done, o._permit));
                    next = rx.try_recv().ok();
                }
                if let Some(e) = failed {
                    break e;
                }
                if let Err(e) = ws.flush().await {
                    break format!("writing: {e}");
                }
            }
            msg = ws.next() => match answer(msg, &mut waiting) {
                Ok(()) => {}
                Err(e) => break e,
            },
        }
    };
    for (_, done, _) in waiting.drain(..) {
        let _ = done.send(Err(Error::Disconnected(ended.clone())));
    }
    rx.close();
    while let Some(o) = rx.recv().await {
        let _ = o.done.send(Err(Error::Disconnected(ended.clone())));
    }
}

type Waiting = VecDeque<(String, oneshot::Sender<Result<Published>>, tokio::sync::OwnedSemaphorePermit)>;

async fn drain_answers(ws: &mut crate::client::Ws, waiting: &mut Waiting) -> std::result::Result<(), String> {
    while !waiting.is_empty() {
        answer(ws.next().await, waiting)?;
    }
    Ok(())
}

/// Settles the receipt one answer names; `Err` when the connection ended.
fn answer(
    msg: Option<std::result::Result<Message, tokio_tungstenite::tungstenite::Error>>,
    waiting: &mut Waiting,
) -> std::result::Result<(), String> {
    let text = match msg {
        None => return Err("the connection closed".into()),
        Some(Err(e)) => return Err(format!("reading: {e}")),
        Some(Ok(Message::Text(t))) => t,
        Some(Ok(Message::Close(f))) => {
            return Err(f.map_or_else(|| "closed".to_owned(), |f| format!("closed {} {}", u16::from(f.code), f.reason)))
        }
        Some(Ok(_)) => return Ok(()),
    };
    /// One answer, read in one pass (the hot path of a pipelined publisher).
    #[derive(Deserialize)]
    struct Answer<'a> {
        #[serde(rename = "type")]
        kind: &'a str,
        #[serde(default, borrow)]
        id: Option<std::borrow::Cow<'a, str>>,
        #[serde(default)]
        partition: u32,
        #[serde(default, deserialize_with = "number_or_string")]
        offset: u64,
        #[serde(default)]
        topic: Option<String>,
        #[serde(default)]
        status: Option<u16>,
    }
    let a: Answer<'_> = serde_json::from_str(&text).map_err(|e| format!("an answer that is not one: {e}"))?;
    // The broker answers in order: the oldest unanswered event is the one. An answer naming
    // another id (or none, for an event it could not read) would shift every later result onto
    // the wrong event: the publisher ends instead, each unanswered event told so.
    let Some((id, _, _)) = waiting.front() else {
        return Err(format!("an answer with nothing unanswered: {text}"));
    };
    if a.id.as_deref() != Some(id.as_str()) {
        return Err(format!("an answer for {:?} where {id:?} was the oldest unanswered", a.id));
    }
    let Some((_, done, _permit)) = waiting.pop_front() else { return Ok(()) };
    let result = match a.kind {
        "published" => Ok(Published { partition: a.partition, offset: a.offset, topic: a.topic }),
        _ => Err(Error::Api(Box::new(Problem::from_answer(a.status.unwrap_or(500), None, text.as_bytes())))),
    };
    let _ = done.send(result);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_offset_is_read_as_a_number_or_a_string() {
        let a: Published = serde_json::from_str(r#"{"partition":1,"offset":7}"#).unwrap();
        let b: Published = serde_json::from_str(r#"{"type":"published","id":"x","partition":1,"offset":"7"}"#).unwrap();
        assert_eq!(a, b);
        let moved: Published = serde_json::from_str(r#"{"partition":0,"offset":1,"topic":"t2"}"#).unwrap();
        assert_eq!(moved.topic.as_deref(), Some("t2"));
    }
}
