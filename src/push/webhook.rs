//! Webhook sinks (SPEC, "Other protocols"): a subscription with a `sink` URL is delivered by
//! HTTP POST instead of to sessions of its clients (they cannot attach to it: 409).
//!
//! The shard that owns the subscription's name (`model::placement::meta_owner`, the one that stores its
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
use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use frame_codec::Frame;
use futures::future::{select, Either};
use futures::stream::{FuturesUnordered, StreamExt};

use crate::adaptor::cloudevents::BinaryPush;
use crate::adaptor::meshmessage::PushForm;
use crate::adaptor::webhook::retry_after;
use crate::adaptor::{PushContext, PushWire, Verdict};
use crate::delivery::delivery_id;
use crate::model::delivery::{AckKind, ConsumerKey, SessionRef};
use crate::server::client::{ClientError, Pool, Url};
use crate::shard::core::Shard;
use crate::shard::message::{SessionChange, SessionEvent};
use crate::shard::sessions::Pushed;
use crate::storage::meta;
use crate::subscription::definition::Definition;

/// Bytes of a sink's answer read at most (the status is what counts).
const MAX_ANSWER: usize = 64 * 1024;
/// A pooled connection idle this long is closed.
const IDLE: Duration = Duration::from_secs(30);
/// The longest `Retry-After` honoured: a sink cannot park a subscription for longer per attempt.
const MAX_DEFER: Duration = Duration::from_secs(300);

/// A classic subscriber's push URL (`code` 206), stored as `push/<subscription> <url>`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ClassicPush {
    pub subscription: String,
    /// The topic as the subscriber named it (the `topic` field of a push).
    pub topic: String,
    pub url: String,
    /// `type` `SYNC`: pushed with code 106 (else 105).
    pub sync: bool,
    /// The consumer: empty for `CLUSTERING` (the subscription's own offsets, shared by its
    /// URLs), one of its own per URL for `BROADCASTING`.
    pub client: String,
    pub created_us: i64,
}

impl ClassicPush {
    /// Its key under `push/`.
    pub fn id(&self) -> String {
        format!("{} {}", self.subscription, self.url)
    }
}

/// What a webhook session POSTs to, and how.
#[derive(Clone)]
enum Target {
    /// A subscription's `sink`: CloudEvents in binary mode, signed.
    Sink(Definition),
    /// A classic subscriber: the classic push form.
    Classic(ClassicPush),
}

impl Target {
    fn subscription(&self) -> &str {
        match self {
            Target::Sink(d) => &d.subscription,
            Target::Classic(c) => &c.subscription,
        }
    }

    fn client(&self) -> &str {
        match self {
            Target::Sink(_) => "",
            Target::Classic(c) => &c.client,
        }
    }

    fn url(&self) -> &str {
        match self {
            Target::Sink(d) => d.sink.as_deref().unwrap_or_default(),
            Target::Classic(c) => &c.url,
        }
    }

    /// Frame -> wire: the protocol its requests speak.
    fn wire(&self) -> Box<dyn PushWire> {
        match self {
            Target::Sink(d) => Box::new(BinaryPush { secret: d.sink_secret.clone() }),
            Target::Classic(c) => Box::new(PushForm { topic: c.topic.clone(), sync: c.sync }),
        }
    }

    /// Whether it is still stored as it was when the session started.
    fn wanted(&self, shard: &Shard) -> bool {
        let db = &shard.shared.db;
        match self {
            Target::Sink(def) => {
                matches!(meta::get_subscription(db, &def.subscription), Ok(Some(d)) if d.created_us == def.created_us)
            }
            // Removed and added again meanwhile: the same URL, served on.
            Target::Classic(c) => {
                let stored = meta::get_policy::<ClassicPush>(db, meta::Policy::Push, &c.id());
                matches!(stored, Ok(Some(s)) if s.client == c.client && s.sync == c.sync)
                    && matches!(meta::get_subscription(db, &c.subscription), Ok(Some(_)))
            }
        }
    }
}

/// Starts the webhook session of a subscription with a sink (on the shard owning its name).
pub fn start(shard: &Rc<Shard>, def: Definition) {
    monoio::spawn(run(shard.clone(), Target::Sink(def)));
}

/// The shard that runs a classic subscriber's push session.
pub fn classic_home(push: &ClassicPush, shards: usize) -> crate::model::ShardId {
    crate::model::placement::meta_owner(&push.id(), shards)
}

thread_local! {
    /// The classic push sessions this shard's thread runs, by id: one per URL.
    static RUNNING: std::cell::RefCell<std::collections::HashSet<String>> = Default::default();
}

/// Starts a classic subscriber's push session (on its [`classic_home`]) unless it runs.
pub fn start_classic(shard: &Rc<Shard>, push: ClassicPush) {
    let id = push.id();
    if !RUNNING.with(|r| r.borrow_mut().insert(id.clone())) {
        return;
    }
    let shard = shard.clone();
    monoio::spawn(async move {
        run(shard, Target::Classic(push)).await;
        RUNNING.with(|r| r.borrow_mut().remove(&id));
    });
}

/// Starts the push sessions of `subscription`'s classic URLs homed on this shard that do not
/// run yet (after a 206 stored one; see `InterestChange::Pushes`).
pub fn sync_pushes(shard: &Rc<Shard>, subscription: &str) {
    let shards = shard.shared.config.shards;
    for push in pushes_of(&shard.shared.db, subscription) {
        if classic_home(&push, shards) == shard.id {
            start_classic(shard, push);
        }
    }
}

/// The classic push URLs of a subscription.
pub fn pushes_of(db: &rocksdb::DB, subscription: &str) -> Vec<ClassicPush> {
    match meta::list_policy_under::<ClassicPush>(db, meta::Policy::Push, &format!("{subscription} ")) {
        Ok(found) => found.into_iter().map(|(_, p)| p).collect(),
        Err(e) => {
            crate::log::warn("webhook", &format!("cannot list classic push URLs: {e}"), &[]);
            Vec::new()
        }
    }
}

/// Starts the webhook sessions this shard runs: of the stored subscriptions with a sink whose
/// names it owns, and of the classic push URLs whose home it is (at the broker's start).
pub fn start_all(shard: &Rc<Shard>) {
    let db = &shard.shared.db;
    let shards = shard.shared.config.shards;
    match meta::list_subscriptions(db) {
        Ok(defs) => {
            for def in defs {
                if def.sink.is_some() && crate::model::placement::meta_owner(&def.subscription, shards) == shard.id {
                    start(shard, def);
                }
            }
        }
        Err(e) => crate::log::warn(
            "webhook",
            &format!("{}: cannot list subscriptions to start their sinks: {e}", shard.id),
            &[],
        ),
    }
    match meta::list_policy::<ClassicPush>(db, meta::Policy::Push) {
        Ok(pushes) => {
            for (_, push) in pushes {
                if classic_home(&push, shards) == shard.id {
                    start_classic(shard, push);
                }
            }
        }
        Err(e) => crate::log::warn("webhook", &format!("{}: cannot list classic push URLs: {e}", shard.id), &[]),
    }
}

/// Runs the session while its target is stored. A removal closes it; a removal announced late
/// can also close the session of a subscription created again under the same name since, and
/// a session whose queue overflowed ends too: while the same target is stored, it is attached
/// again.
async fn run(shard: Rc<Shard>, target: Target) {
    let url = match Url::parse(target.url()) {
        Ok(u) => u,
        Err(e) => {
            return crate::log::warn(
                "webhook",
                &format!("subscription {}: push URL not served: {e}", target.subscription()),
                &[],
            )
        }
    };
    let topic = match &target {
        Target::Sink(d) => d.topic.clone(),
        Target::Classic(c) => match meta::get_subscription(&shard.shared.db, &c.subscription) {
            Ok(Some(d)) => d.topic,
            _ => return,
        },
    };
    while target.wanted(&shard) {
        serve(&shard, &target, &topic, &url).await;
        if !target.wanted(&shard) {
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
    /// Refused for good (a classic subscriber's retCode 3): dead-lettered now.
    Reject,
}

/// How long a resolved address is used before the name is resolved again.
const RESOLVE_EVERY: Duration = Duration::from_secs(60);
/// Resolutions of a sink's name at most this often, when it failed or its address did not answer.
const RESOLVE_RETRY: Duration = Duration::from_secs(1);

async fn serve(shard: &Rc<Shard>, target: &Target, topic: &str, url: &Url) {
    let config = &shard.shared.config;
    let subscription = target.subscription();
    let (id, mut queue) = shard.sessions.add_webhook(subscription, config.shards);
    let consumer = ConsumerKey { subscription: subscription.to_owned(), client: target.client().to_owned() };
    let at = SessionRef { shard: shard.id, id };
    let concurrency = config.webhook_concurrency as usize;
    // Each owning shard's window is a share of the concurrency, so what the session is handed
    // is about what it can have in flight: events do not wait here while their ack deadlines
    // run (the owners count them delivered from the moment they are handed over).
    let window = config.webhook_concurrency.div_ceil(config.shards as u32).max(1);
    let change = SessionChange::Attach { window, filters: None, persist: true };
    shard.announce_session(SessionEvent { consumer: consumer.clone(), topic: topic.to_owned(), session: at, change });
    let pool = Pool::new(concurrency, MAX_ANSWER, Some(shard.shared.client_tls.clone()));
    let wire = target.wire();
    let timeout = config.webhook_timeout;
    let metrics = shard.shared.metrics.shard(shard.id);
    let ack = |p: u32, o: u64, kind: AckKind| {
        let _ = shard.route_acks(&consumer, topic, BTreeMap::from([(p, vec![o])]), kind, false);
    };
    // Tells the machine how one went.
    let settle = |p: u32, o: u64, outcome: &Outcome| {
        let (kind, slot) = match outcome {
            Outcome::Ok => (AckKind::Ack, 0),
            Outcome::Failed | Outcome::Unreachable => (AckKind::Nack, 1),
            Outcome::Reject => (AckKind::Reject, 1),
            Outcome::Defer(wait) => (AckKind::Defer(wait.as_millis() as u32), 2),
        };
        metrics.webhook_requests[slot].inc();
        ack(p, o, kind);
    };
    // Handed back, unattempted, to come again after `wait`.
    let release = |e: &Event, wait: Duration| {
        let h = e.frames[e.index as usize].header();
        ack(h.partition, h.offset, AckKind::Release(wait.as_millis() as u32));
    };
    // Where the sink is: resolved when first needed, again every `RESOLVE_EVERY` and after it
    // did not answer.
    let mut addr: Option<(SocketAddr, Instant)> = None;
    let mut refresh = false;
    let mut last_resolve: Option<Instant> = None;
    let mut resolve_failed = false;
    let mut last_prune = Instant::now();
    // Handed to the session, not yet POSTed: at most about a window per owning shard beyond
    // what is in flight, one entry per event (a redelivery replaces its earlier copy).
    let mut waiting: VecDeque<Event> = VecDeque::new();
    let mut inflight = FuturesUnordered::new();
    let mut held_until: Option<Instant> = None;
    // Ending: `Some(true)` when the subscription was removed (what completes is not acked: a
    // subscription made again under its name must not see this one's acks).
    let mut closing: Option<bool> = None;
    loop {
        let now = Instant::now();
        if held_until.is_some_and(|t| t <= now) {
            held_until = None;
        }
        if let Some(until) = held_until {
            // The sink asked to wait: what is handed meanwhile goes back unattempted.
            for e in waiting.drain(..) {
                release(&e, until - now);
            }
        }
        if now.duration_since(last_prune) >= IDLE / 4 {
            pool.close_idle(IDLE);
            last_prune = now;
        }
        let stale = refresh || addr.is_none_or(|(_, at)| at.elapsed() >= RESOLVE_EVERY);
        let may_resolve = last_resolve.is_none_or(|t| t.elapsed() >= RESOLVE_RETRY);
        if closing.is_none() && !waiting.is_empty() && stale && may_resolve {
            last_resolve = Some(Instant::now());
            match url.resolve(timeout).await {
                Ok(a) => {
                    if addr.is_some_and(|(old, _)| old != a) {
                        pool.forget_all_but(a);
                    }
                    (addr, refresh, resolve_failed) = (Some((a, Instant::now())), false, false);
                }
                Err(e) => {
                    if !resolve_failed {
                        crate::log::warn("webhook", &format!("subscription {subscription}: push URL: {e}"), &[]);
                        resolve_failed = true;
                    }
                    match addr {
                        // The last address it had is used on, and not resolved again at once.
                        Some((a, _)) => (addr, refresh) = (Some((a, Instant::now())), false),
                        // Nowhere to send them: each is a failed attempt (retried after the backoff).
                        None => {
                            for ev in waiting.drain(..) {
                                let h = ev.frames[ev.index as usize].header();
                                settle(h.partition, h.offset, &Outcome::Unreachable);
                            }
                        }
                    }
                }
            }
        }
        while let (None, None, Some((to, _))) = (closing, held_until, addr) {
            if inflight.len() >= concurrency {
                break;
            }
            let Some(e) = waiting.pop_front() else { break };
            inflight.push(post(&pool, &*wire, url, to, e, timeout, &shard.shared.listeners));
        }
        if closing.is_some() && inflight.is_empty() {
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
                Some(_) => std::future::pending().await,
                None => queue.recv().await,
            }
        };
        let wake = match (held_until, waiting.is_empty() || addr.is_some()) {
            (Some(t), _) => t.saturating_duration_since(Instant::now()),
            // Events wait for the name to resolve.
            (None, false) => RESOLVE_RETRY,
            (None, true) => IDLE / 4,
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
                if closing != Some(true) {
                    settle(p, o, &outcome);
                }
            }
            Woke::Done(None) | Woke::Timer => {}
            Woke::Pushed(Some(Pushed::Event { frames, index, attempt })) => {
                let e = Event { frames, index, attempt };
                let key = |e: &Event| {
                    let h = e.frames[e.index as usize].header();
                    (h.partition, h.offset)
                };
                // A redelivery of one still waiting (its ack deadline passed) takes its place.
                match waiting.iter_mut().find(|w| key(w) == key(&e)) {
                    Some(w) => *w = e,
                    None => waiting.push_back(e),
                }
            }
            // Removed: what is in flight finishes, unacked.
            Woke::Pushed(Some(Pushed::Close)) => closing = Some(true),
            // The queue overflowed, or its registration is gone (a classic URL unsubscribed,
            // the subscription's other URLs go on): what waits goes back unattempted.
            Woke::Pushed(None) => closing = Some(false),
            Woke::Pushed(Some(Pushed::Recheck)) => {
                if !target.wanted(shard) {
                    closing = Some(false);
                }
            }
        }
        if closing == Some(false) {
            for e in waiting.drain(..) {
                release(&e, Duration::ZERO);
            }
        }
    }
    shard.sessions.remove_acked(id);
    let change = SessionChange::Detach;
    shard.announce_session(SessionEvent { consumer, topic: topic.to_owned(), session: at, change });
}

/// The event's trace context as W3C Trace Context headers (SPEC "Observability": a delivery
/// carries it as a header where the transport has headers), besides whatever the wire wrote;
/// only a `traceparent` that parses, and a `tracestate` of visible ASCII, so an event's
/// attribute never writes a header of its own.
fn trace_headers(frame: &frame_codec::Frame, headers: &mut Vec<(String, String)>) {
    let body = frame.body();
    let Some(parent) = body.attr_str("traceparent").and_then(crate::trace::TraceParent::parse) else { return };
    if !headers.iter().any(|(n, _)| n.eq_ignore_ascii_case("traceparent")) {
        headers.push(("traceparent".into(), parent.format()));
    }
    let state = body.attr_str("tracestate").filter(|s| s.len() <= 512 && s.bytes().all(|b| (b' '..=b'~').contains(&b)));
    if let (Some(state), false) = (state, headers.iter().any(|(n, _)| n.eq_ignore_ascii_case("tracestate"))) {
        headers.push(("tracestate".into(), state.to_owned()));
    }
}

/// POSTs one event; returns its partition, offset and how it went.
async fn post(
    pool: &Pool,
    wire: &dyn PushWire,
    url: &Url,
    addr: SocketAddr,
    e: Event,
    timeout: Duration,
    own: &[SocketAddr],
) -> (u32, u64, Outcome) {
    let frame = &e.frames[e.index as usize];
    let h = frame.header();
    let (p, o) = (h.partition, h.offset);
    if is_own(addr, own) {
        // Pushing into evmesh's own listeners would loop (a publish per delivery) or reach the
        // admin API from inside.
        return (p, o, Outcome::Unreachable);
    }
    let id = delivery_id(p, o, e.attempt);
    let now_s = (crate::model::clock::now_micros() / 1_000_000).max(0) as u64;
    let push = PushContext { delivery_id: &id, attempt: e.attempt, target: &url.target, now_s };
    let (mut headers, body) = wire.request(frame, &push);
    headers.push(("x-em-delivery-id".into(), id));
    trace_headers(frame, &mut headers);
    let refs: Vec<(&str, &str)> = headers.iter().map(|(n, v)| (n.as_str(), v.as_str())).collect();
    // Each step within `timeout`, and the whole request within three of them (a sink that
    // trickles its answer does not hold a request for longer).
    let answer = match monoio::time::timeout(3 * timeout, pool.send(url, addr, "POST", &refs, &body, timeout)).await {
        Ok(a) => a,
        Err(_) => Err(ClientError::TimedOut(3 * timeout)),
    };
    let outcome = match answer {
        Ok(a) if (200..300).contains(&a.status) => match wire.verdict(&a.body) {
            Verdict::Done => Outcome::Ok,
            Verdict::Retry => Outcome::Failed,
            Verdict::Refused => Outcome::Reject,
        },
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

/// Whether `addr` is one of evmesh's own listeners (an unspecified listen address stands for
/// every local one: loopback, or the same port on any address).
pub fn is_own(addr: SocketAddr, own: &[SocketAddr]) -> bool {
    own.iter().any(|l| {
        l.port() == addr.port()
            && (l.ip() == addr.ip() || l.ip().is_unspecified() || (l.ip().is_loopback() && addr.ip().is_loopback()))
    })
}
