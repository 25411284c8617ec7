//! Webhook sinks (SPEC, "Other protocols"): a subscription with a `sink` URL is delivered by
//! HTTP POST instead of to sessions of its clients (they cannot attach to it: 409).
//!
//! The shard that owns the subscription's name (`shard::meta_owner`, the one that stores its
//! definition) runs one webhook session for it, from its creation, or the broker's start, to
//! its removal. It is an acknowledged session like any other: the partition owners' machine
//! decides what it gets, counts attempts, redelivers after the backoff and dead-letters after
//! `maxAttempts`, and gives a sink subscription one event of a partition at a time, so each
//! partition reaches the sink in offset order, failures included. Its consumer is the
//! subscription itself (offsets stored), whatever the mode.
//!
//! Each event handed to it is POSTed in binary mode (`ce-*` headers with the `em*` extensions,
//! the data as the body) with `X-Em-Delivery-Id`, `X-Em-Timestamp` (Unix seconds) and, with a
//! `sinkSecret`, `X-Em-Signature` (`adaptor::webhook::signature`, over the request target as
//! sent). A 2xx answer acks it; a 429 or 503 with `Retry-After` defers it (a failed attempt,
//! tried again no sooner than asked) and holds every request to the sink until then; anything
//! else (another status, no answer within `webhook_timeout_ms` per step, a refused connection)
//! nacks it. At most `webhook_concurrency` requests are in flight to a sink, over keep-alive
//! connections of the session's own pool (idle ones closed after `IDLE`); answers are read up
//! to `MAX_ANSWER` bytes and dropped.

use std::collections::{BTreeMap, VecDeque};
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use frame_codec::{AttrValue, Frame};
use futures::future::{select, Either};
use futures::stream::{FuturesUnordered, StreamExt};

use crate::adaptor::cloudevents::write_binary;
use crate::adaptor::webhook::{retry_after, signature};
use crate::delivery::delivery_id;
use crate::server::client::{ClientError, Pool, Url};
use crate::shard::core::Shard;
use crate::shard::message::{AckKind, ConsumerKey, SessionChange, SessionEvent, SessionRef};
use crate::shard::sessions::Pushed;
use crate::storage::meta;
use crate::subscription::definition::Definition;

/// Bytes of a sink's answer read at most (the status is what counts).
const MAX_ANSWER: usize = 64 * 1024;
/// A pooled connection idle this long is closed.
const IDLE: Duration = Duration::from_secs(30);
/// The longest `Retry-After` honoured: a sink cannot park a subscription for longer per attempt.
const MAX_DEFER: Duration = Duration::from_secs(300);

/// Starts the webhook session of a subscription with a sink (on the shard owning its name).
pub fn start(shard: &Rc<Shard>, def: Definition) {
    monoio::spawn(run(shard.clone(), def));
}

/// Starts the webhook sessions of the stored subscriptions with a sink whose names this shard
/// owns (at the broker's start).
pub fn start_all(shard: &Rc<Shard>) {
    let defs = match meta::list_subscriptions(&shard.shared.db) {
        Ok(d) => d,
        Err(e) => {
            eprintln!("evmesh: {}: cannot list subscriptions to start their sinks: {e}", shard.id);
            return;
        }
    };
    let shards = shard.shared.config.shards;
    for def in defs {
        if def.sink.is_some() && crate::shard::meta_owner(&def.subscription, shards) == shard.id {
            start(shard, def);
        }
    }
}

/// Runs the session while the subscription exists. A removal closes it; a removal announced
/// late can also close the session of a subscription created again under the same name since,
/// and a session whose queue overflowed ends too: while the same definition is stored, it is
/// attached again.
async fn run(shard: Rc<Shard>, def: Definition) {
    let url = match def.sink.as_deref().map(Url::parse) {
        Some(Ok(u)) => u,
        Some(Err(e)) => return eprintln!("evmesh: subscription {}: sink not served: {e}", def.subscription),
        None => return,
    };
    loop {
        serve(&shard, &def, &url).await;
        let stored = meta::get_subscription(&shard.shared.db, &def.subscription);
        if !matches!(stored, Ok(Some(d)) if d.created_us == def.created_us) {
            return;
        }
        monoio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// One event to POST.
struct Event {
    frames: Arc<[Frame]>,
    index: u32,
    attempt: u16,
}

/// What woke the session.
enum Woke {
    Done(Option<(u32, u64, Outcome)>),
    Pushed(Option<Pushed>),
    Timer,
}

/// How a POST ended, for the machine.
enum Outcome {
    Ok,
    Failed,
    /// No connection (refused, reset, TLS failed, or the name did not resolve): failed, and the
    /// name is resolved again before the next request.
    Unreachable,
    /// A 429 or 503 with `Retry-After`: not again before this.
    Defer(Duration),
}

/// How long a resolved address is used before the name is resolved again.
const RESOLVE_EVERY: Duration = Duration::from_secs(60);
/// Resolutions of a sink's name at most this often, when it failed or its address did not answer.
const RESOLVE_RETRY: Duration = Duration::from_secs(1);

async fn serve(shard: &Rc<Shard>, def: &Definition, url: &Url) {
    let config = &shard.shared.config;
    let (id, mut queue) = shard.sessions.add_webhook(&def.subscription, config.shards);
    let consumer = ConsumerKey { subscription: def.subscription.clone(), client: String::new() };
    let at = SessionRef { shard: shard.id, id };
    let concurrency = config.webhook_concurrency as usize;
    let change = SessionChange::Attach { window: config.webhook_concurrency, filters: None, persist: true };
    shard.announce_session(SessionEvent { consumer: consumer.clone(), topic: def.topic.clone(), session: at, change });
    let pool = Pool::new(concurrency, MAX_ANSWER, Some(shard.shared.client_tls.clone()));
    let secret = def.sink_secret.as_deref().map(str::as_bytes);
    let timeout = config.webhook_timeout;
    let metrics = shard.shared.metrics.shard(shard.id);
    // Tells the machine how one went.
    let settle = |p: u32, o: u64, outcome: &Outcome| {
        let kind = match outcome {
            Outcome::Ok => AckKind::Ack,
            Outcome::Failed | Outcome::Unreachable => AckKind::Nack,
            Outcome::Defer(wait) => AckKind::Defer(wait.as_millis() as u32),
        };
        let slot = match outcome {
            Outcome::Ok => 0,
            Outcome::Failed | Outcome::Unreachable => 1,
            Outcome::Defer(_) => 2,
        };
        metrics.webhook_requests[slot].inc();
        let _ = shard.route_acks(&consumer, &def.topic, BTreeMap::from([(p, vec![o])]), kind, false);
    };
    // Where the sink is: resolved when first needed, again every `RESOLVE_EVERY` and after it
    // did not answer.
    let mut addr: Option<(std::net::SocketAddr, Instant)> = None;
    let mut refresh = false;
    let mut last_resolve: Option<Instant> = None;
    // Handed to the session, not yet POSTed (bounded by the windows the owners keep).
    let mut waiting: VecDeque<Event> = VecDeque::new();
    let mut inflight = FuturesUnordered::new();
    let mut held_until: Option<Instant> = None;
    let mut closing = false;
    loop {
        if held_until.is_some_and(|t| t <= Instant::now()) {
            held_until = None;
        }
        let stale = refresh || addr.is_none_or(|(_, at)| at.elapsed() >= RESOLVE_EVERY);
        let may_resolve = last_resolve.is_none_or(|t| t.elapsed() >= RESOLVE_RETRY);
        if !closing && !waiting.is_empty() && stale && may_resolve {
            last_resolve = Some(Instant::now());
            match url.resolve(timeout).await {
                Ok(a) => (addr, refresh) = (Some((a, Instant::now())), false),
                Err(e) if addr.is_none() => {
                    // Nowhere to send them: each is a failed attempt (retried after the backoff).
                    eprintln!("evmesh: subscription {}: sink: {e}", def.subscription);
                    for ev in waiting.drain(..) {
                        let h = ev.frames[ev.index as usize].header();
                        settle(h.partition, h.offset, &Outcome::Unreachable);
                    }
                }
                Err(_) => {} // the last address it had is used on
            }
        }
        while let (false, None, Some((to, _))) = (closing, held_until, addr) {
            if inflight.len() >= concurrency {
                break;
            }
            let Some(e) = waiting.pop_front() else { break };
            inflight.push(post(&pool, url, to, secret, e, timeout));
        }
        if closing && inflight.is_empty() {
            break;
        }
        let next_done = async {
            match inflight.is_empty() {
                true => std::future::pending().await,
                false => inflight.next().await,
            }
        };
        let next_event = async {
            match closing {
                true => std::future::pending().await,
                false => queue.recv().await,
            }
        };
        let wake = match (held_until, waiting.is_empty() || addr.is_some()) {
            (Some(t), _) => t.saturating_duration_since(Instant::now()),
            // Events wait for the name to resolve.
            (None, false) => RESOLVE_RETRY,
            (None, true) => IDLE,
        };
        let timer = monoio::time::sleep(wake);
        let woke = {
            let (done, pushed, timer) = (std::pin::pin!(next_done), std::pin::pin!(next_event), std::pin::pin!(timer));
            match select(select(done, pushed), timer).await {
                Either::Left((Either::Left((done, _)), _)) => Woke::Done(done),
                Either::Left((Either::Right((pushed, _)), _)) => Woke::Pushed(pushed),
                Either::Right(_) => Woke::Timer,
            }
        };
        match woke {
            Woke::Done(Some((p, o, outcome))) => {
                match outcome {
                    Outcome::Defer(wait) => held_until = Some(Instant::now() + wait),
                    // Resolved again before the next request (at most every `RESOLVE_RETRY`).
                    Outcome::Unreachable if url.ip.is_none() => refresh = true,
                    _ => {}
                }
                settle(p, o, &outcome);
            }
            Woke::Done(None) => {}
            Woke::Pushed(Some(Pushed::Event { frames, index, attempt })) => {
                waiting.push_back(Event { frames, index, attempt });
            }
            // Removed (or the queue overflowed): what is in flight finishes, the rest goes back.
            Woke::Pushed(Some(Pushed::Close) | None) => closing = true,
            Woke::Timer => pool.close_idle(IDLE),
        }
    }
    shard.sessions.remove_acked(id);
    let change = SessionChange::Detach;
    shard.announce_session(SessionEvent { consumer, topic: def.topic.clone(), session: at, change });
}

/// POSTs one event; returns its partition, offset and how it went.
async fn post(
    pool: &Pool,
    url: &Url,
    addr: std::net::SocketAddr,
    secret: Option<&[u8]>,
    e: Event,
    timeout: Duration,
) -> (u32, u64, Outcome) {
    let frame = &e.frames[e.index as usize];
    let h = frame.header();
    let (p, o) = (h.partition, h.offset);
    let (mut headers, content_type, body) = write_binary(frame);
    let id = delivery_id(p, o, e.attempt);
    for (name, value) in [
        ("ce-emdeliveryid", AttrValue::Str(id.clone())),
        ("ce-empartition", AttrValue::Int(i64::from(p))),
        ("ce-emoffset", AttrValue::Str(o.to_string())),
        ("ce-emattempt", AttrValue::Int(i64::from(e.attempt))),
    ] {
        let value = match value {
            AttrValue::Str(s) => s,
            AttrValue::Int(n) => n.to_string(),
            AttrValue::Bool(b) => b.to_string(),
        };
        headers.push((name.to_owned(), value));
    }
    let now_s = (crate::clock::now_micros() / 1_000_000).max(0) as u64;
    let timestamp = now_s.to_string();
    if let Some(ct) = content_type {
        headers.push(("content-type".into(), ct));
    }
    headers.push(("x-em-delivery-id".into(), id));
    if let Some(key) = secret {
        headers.push(("x-em-signature".into(), signature(key, "POST", &url.target, &timestamp, &body)));
    }
    headers.push(("x-em-timestamp".into(), timestamp));
    let refs: Vec<(&str, &str)> = headers.iter().map(|(n, v)| (n.as_str(), v.as_str())).collect();
    let outcome = match pool.send(url, addr, "POST", &refs, &body, timeout).await {
        Ok(a) if (200..300).contains(&a.status) => Outcome::Ok,
        Ok(a) if a.status == 429 || a.status == 503 => {
            match a.header("retry-after").and_then(|v| retry_after(v, now_s)) {
                Some(s) => Outcome::Defer(Duration::from_secs(s).min(MAX_DEFER)),
                None => Outcome::Failed,
            }
        }
        Err(ClientError::Connect(_)) => Outcome::Unreachable,
        Ok(_) | Err(_) => Outcome::Failed,
    };
    (p, o, outcome)
}
