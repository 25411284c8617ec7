//! One task per connector: its loop, its state and its counts.
//!
//! * **Source**: open at the stored position, poll a bounded batch, publish it to evmesh as one
//!   batch (retrying while evmesh is away, with backoff), then, only after the 202, store the
//!   last record's position (synced) and tell the source. A record evmesh refuses for itself
//!   (a 4xx the batch was refused with, found by publishing the batch's events one by one) is
//!   counted `failed`, logged and passed over.
//! * **Sink**: make its subscription if absent (from the earliest event), consume it with a
//!   window of one batch, hand each batch to the sink (`put`, then `flush`) and ack the
//!   deliveries only then. An event the sink refuses goes to the dead-letter topic (with
//!   `connecterror` saying why) before it is acked; a failing far side is retried with
//!   backoff while the deliveries wait un-acked (evmesh stops sending past the window).
//! * **Control**: pause closes the connector (its position stays); resume and restart open
//!   it again; a fatal error marks it failed until restarted.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cloudevents::{AttributesReader, Event};
use evmesh_client::{Backoff, Client, Subscription};
use serde_json::{json, Value};
use tokio::sync::watch;

use crate::config::{ConnectorConfig, Kind};
use crate::connectors::{self, Built};
use crate::spi::{ConnectError, Position, Sink, SinkError, Source};
use crate::store::Store;

/// How long a source's poll waits for its first record before the loop looks at its control.
const POLL_WAIT: Duration = Duration::from_millis(200);
/// How long a sink gathers deliveries after the first of a batch.
const LINGER: Duration = Duration::from_millis(20);
/// A sink's subscription: how long a delivery may wait for the far side before evmesh sends
/// it again, and how many attempts before evmesh dead-letters it (the most evmesh allows).
const SINK_ACK_TIMEOUT: Duration = Duration::from_secs(600);
const SINK_MAX_ATTEMPTS: u32 = 100;
/// Retries of a failing call back off between these.
/// A source's lag is asked at most this often.
const LAG_EVERY: Duration = Duration::from_secs(2);
const BACKOFF: Backoff = Backoff { min: Duration::from_millis(100), max: Duration::from_secs(5) };

/// What the admin API asks of a connector.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Control {
    Run,
    Pause,
}

/// Where a connector is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum State {
    Starting,
    Running,
    Paused,
    Failed(String),
}

impl State {
    pub fn name(&self) -> &'static str {
        match self {
            State::Starting => "starting",
            State::Running => "running",
            State::Paused => "paused",
            State::Failed(_) => "failed",
        }
    }
}

/// A connector's counts (`GET /metrics`, `GET /connectors/{name}`).
#[derive(Debug, Default)]
pub struct Counts {
    pub polled: AtomicU64,
    pub published: AtomicU64,
    pub put: AtomicU64,
    pub failed: AtomicU64,
    pub retried: AtomicU64,
    pub dlq: AtomicU64,
    /// From a batch's first record to its position stored (source) or its acks sent (sink).
    pub commit_us: AtomicU64,
    pub commits: AtomicU64,
}

impl Counts {
    fn add(c: &AtomicU64, n: usize) {
        c.fetch_add(n as u64, Ordering::Relaxed);
    }

    pub fn json(&self) -> Value {
        let g = |c: &AtomicU64| c.load(Ordering::Relaxed);
        json!({
            "polled": g(&self.polled), "published": g(&self.published), "put": g(&self.put),
            "failed": g(&self.failed), "retried": g(&self.retried), "dlq": g(&self.dlq),
        })
    }
}

/// One connector, as the runtime and the admin API share it.
pub struct Connector {
    pub config: ConnectorConfig,
    pub counts: Counts,
    state: Mutex<(State, Option<Position>)>,
    /// A source's lag, as it last told it.
    lag: Mutex<Option<Value>>,
    control: watch::Sender<(Control, u64)>,
}

impl Connector {
    pub fn new(config: ConnectorConfig) -> Arc<Connector> {
        let (control, _) = watch::channel((Control::Run, 0));
        let (state, lag) = (Mutex::new((State::Starting, None)), Mutex::new(None));
        Arc::new(Connector { config, counts: Counts::default(), state, lag, control })
    }

    pub fn state(&self) -> State {
        self.state.lock().expect("not poisoned").0.clone()
    }

    fn set_state(&self, s: State) {
        self.state.lock().expect("not poisoned").0 = s;
    }

    fn set_position(&self, p: Position) {
        self.state.lock().expect("not poisoned").1 = Some(p);
    }

    /// Pauses (`Control::Pause`) or runs it; `restart` closes and opens it again either way.
    pub fn control(&self, c: Control, restart: bool) {
        self.control.send_modify(|(now, generation)| {
            *now = c;
            if restart {
                *generation += 1;
            }
        });
    }

    /// The admin API's view (with the source's stored position, from `store`).
    pub fn status(&self, store: &Store) -> Value {
        let (state, seen) = self.state.lock().expect("not poisoned").clone();
        let c = &self.config;
        let position = match c.kind {
            Kind::Source => store.position(&c.name).ok().flatten(),
            Kind::Sink => seen,
        };
        let mut v = json!({
            "name": c.name, "kind": c.kind, "connector": c.connector, "topic": c.topic,
            "state": state.name(), "position": position, "counts": self.counts.json(),
        });
        if let Some(s) = &c.subscription {
            v["subscription"] = json!(s);
            v["dlqTopic"] = json!(c.dlq());
        }
        if let State::Failed(why) = state {
            v["error"] = json!(why);
        }
        if let Some(lag) = self.lag.lock().expect("not poisoned").clone() {
            v["lag"] = lag;
        }
        v
    }

    /// Asks the source its lag if it was not asked within [`LAG_EVERY`].
    async fn measure_lag(&self, source: &mut dyn Source, asked: &mut Option<Instant>) {
        if asked.is_some_and(|at| at.elapsed() < LAG_EVERY) {
            return;
        }
        *asked = Some(Instant::now());
        let lag = source.lag().await;
        *self.lag.lock().expect("not poisoned") = lag;
    }

    /// Runs the connector until the process ends; a panic in it marks it failed (so
    /// `/readyz` and `evmesh_connect_up` say so) until the admin API restarts it.
    pub async fn supervise(self: Arc<Self>, client: Client, store: Store) {
        loop {
            let ran = tokio::spawn(self.clone().run(client.clone(), store.clone())).await;
            let Err(e) = ran else { return };
            let why = format!("panicked: {e}");
            eprintln!("evmesh-connect: {}: {why}", self.config.name);
            self.set_state(State::Failed(why));
            let mut control = self.control.subscribe();
            control.borrow_and_update();
            let _ = control.changed().await;
        }
    }

    /// Runs the connector until the process ends.
    async fn run(self: Arc<Self>, client: Client, store: Store) {
        let mut control = self.control.subscribe();
        loop {
            let (now, _) = *control.borrow_and_update();
            if now == Control::Pause {
                self.set_state(State::Paused);
                let _ = control.changed().await;
                continue;
            }
            self.set_state(State::Starting);
            let ended = match connectors::build(&self.config, &store) {
                Ok(Built::Source(s)) => self.run_source(s, &client, &store, &mut control).await,
                Ok(Built::Sink(s)) => self.run_sink(s, &client, &mut control).await,
                Err(e) => Err(e.to_string()),
            };
            if let Err(why) = ended {
                eprintln!("evmesh-connect: {}: failed: {why}", self.config.name);
                self.set_state(State::Failed(why));
                // Until the admin API asks again (resume or restart).
                let _ = control.changed().await;
            }
        }
    }

    /// Waits `attempt`'s backoff, or less if the control changes (`true`: stop).
    async fn back_off(&self, attempt: &mut u32, control: &mut watch::Receiver<(Control, u64)>) -> bool {
        Counts::add(&self.counts.retried, 1);
        *attempt = attempt.saturating_add(1);
        tokio::select! {
            _ = tokio::time::sleep(BACKOFF.delay(*attempt)) => false,
            _ = control.changed() => true,
        }
    }

    /// A source's loop; `Ok` when the control changed, `Err` when it cannot go on.
    async fn run_source(
        &self,
        mut source: Box<dyn Source>,
        client: &Client,
        store: &Store,
        control: &mut watch::Receiver<(Control, u64)>,
    ) -> Result<(), String> {
        let name = &self.config.name;
        let mut attempt = 0;
        loop {
            let from = store.position(name).map_err(|e| e.to_string())?;
            let fresh = from.is_none();
            match source.open(from).await {
                Ok(()) => {
                    let start = if fresh { source.start_position().await } else { None };
                    if let Some(start) = start {
                        store.set_position(name, Some(&start)).map_err(|e| e.to_string())?;
                        self.set_position(start);
                    }
                    break;
                }
                Err(ConnectError::Fatal(e)) => return Err(e),
                Err(ConnectError::Transient(e)) => {
                    eprintln!("evmesh-connect: {name}: opening: {e}");
                    if self.back_off(&mut attempt, control).await {
                        return Ok(());
                    }
                }
            }
        }
        self.set_state(State::Running);
        let ended = self.source_loop(source.as_mut(), client, store, control).await;
        source.close().await;
        ended
    }

    async fn source_loop(
        &self,
        source: &mut dyn Source,
        client: &Client,
        store: &Store,
        control: &mut watch::Receiver<(Control, u64)>,
    ) -> Result<(), String> {
        let (name, topic) = (&self.config.name, &self.config.topic);
        let (mut attempt, mut lag_asked) = (0, None);
        loop {
            if control.has_changed().unwrap_or(true) {
                return Ok(());
            }
            self.measure_lag(source, &mut lag_asked).await;
            let records = match source.poll(self.config.batch, POLL_WAIT).await {
                Ok(r) => r,
                Err(ConnectError::Fatal(e)) => return Err(e),
                Err(ConnectError::Transient(e)) => {
                    eprintln!("evmesh-connect: {name}: polling: {e}");
                    if self.back_off(&mut attempt, control).await {
                        return Ok(());
                    }
                    continue;
                }
            };
            let Some(last) = records.last().map(|r| r.position.clone()) else { continue };
            let started = Instant::now();
            Counts::add(&self.counts.polled, records.len());
            let events: Vec<Event> = records.into_iter().map(|r| r.event).collect();
            if !self.publish(client, topic, &events, control).await {
                return Ok(());
            }
            // Stored in the same step as the 202: a crash before this publishes the batch
            // again, with the same ids.
            crate::fault::at("source-published");
            let mut storing = 0;
            while let Err(e) = store.set_position(name, Some(&last)) {
                eprintln!("evmesh-connect: {name}: {e}");
                if self.back_off(&mut storing, control).await {
                    return Ok(());
                }
            }
            self.set_position(last.clone());
            Counts::add(&self.counts.commit_us, started.elapsed().as_micros() as usize);
            Counts::add(&self.counts.commits, 1);
            if let Err(e) = source.commit(&last).await {
                eprintln!("evmesh-connect: {name}: commit: {e}");
            }
            attempt = 0;
        }
    }

    /// Publishes `events` to `topic` until evmesh took them (`false`: the control changed
    /// first). A batch evmesh refuses for itself is published event by event, and the events
    /// it refuses are passed over, counted `failed`.
    async fn publish(
        &self,
        client: &Client,
        topic: &str,
        events: &[Event],
        control: &mut watch::Receiver<(Control, u64)>,
    ) -> bool {
        let mut attempt = 0;
        loop {
            match client.publish_batch(topic, events).await {
                Ok(_) => {
                    Counts::add(&self.counts.published, events.len());
                    return true;
                }
                // Only what evmesh refuses for the event itself (400, 413) is passed over; any
                // other refusal (401, 403, 404, 409, 5xx: a token, the ACL, a missing topic)
                // is waited out, the position kept, so nothing is skipped while evmesh is
                // misconfigured.
                Err(e) if e.is_transient() || !matches!(e.status(), Some(400 | 413)) => {
                    eprintln!("evmesh-connect: {}: publishing: {e}", self.config.name);
                    if self.back_off(&mut attempt, control).await {
                        return false;
                    }
                }
                Err(e) if events.len() > 1 => {
                    eprintln!(
                        "evmesh-connect: {}: a batch refused ({e}); publishing it event by event",
                        self.config.name
                    );
                    for event in events {
                        if !Box::pin(self.publish(client, topic, std::slice::from_ref(event), control)).await {
                            return false;
                        }
                    }
                    return true;
                }
                Err(e) => {
                    let id = events.first().map(|e| e.id().to_owned()).unwrap_or_default();
                    eprintln!("evmesh-connect: {}: record {id} refused by evmesh, passed over: {e}", self.config.name);
                    Counts::add(&self.counts.failed, 1);
                    return true;
                }
            }
        }
    }

    /// A sink's loop; `Ok` when the control changed, `Err` when it cannot go on.
    async fn run_sink(
        &self,
        mut sink: Box<dyn Sink>,
        client: &Client,
        control: &mut watch::Receiver<(Control, u64)>,
    ) -> Result<(), String> {
        let c = &self.config;
        let subscription = c.subscription.as_deref().expect("a sink has one (config::parse)");
        let mut attempt = 0;
        loop {
            // Deliveries wait un-acked while the far side is retried: a long ack timeout, and
            // many attempts (a disconnect counts as one) before evmesh dead-letters an event
            // the connector never refused.
            let wanted = Subscription::new(subscription, &c.topic)
                .start(evmesh_client::Start::Earliest)
                .ack_timeout(SINK_ACK_TIMEOUT)
                .max_attempts(SINK_MAX_ATTEMPTS);
            let made = client.subscribe(&wanted).await;
            let opened = match made {
                Ok(_) => sink.open().await.map_err(|e| (e.to_string(), matches!(e, ConnectError::Transient(_)))),
                Err(e) => Err((format!("subscription {subscription}: {e}"), e.is_transient())),
            };
            match opened {
                Ok(()) => break,
                Err((e, false)) => return Err(e),
                Err((e, true)) => {
                    eprintln!("evmesh-connect: {}: opening: {e}", c.name);
                    if self.back_off(&mut attempt, control).await {
                        return Ok(());
                    }
                }
            }
        }
        let consumer =
            client.consumer(subscription).client_id(format!("connect-{}", c.name)).window(c.batch as u32).start();
        self.set_state(State::Running);
        let ended = self.sink_loop(sink.as_mut(), consumer, client, control).await;
        sink.close().await;
        ended
    }

    async fn sink_loop(
        &self,
        sink: &mut dyn Sink,
        mut consumer: evmesh_client::Consumer,
        client: &Client,
        control: &mut watch::Receiver<(Control, u64)>,
    ) -> Result<(), String> {
        loop {
            let first = tokio::select! {
                d = consumer.next_delivery() => d,
                _ = control.changed() => { consumer.close().await; return Ok(()) }
            };
            let mut batch = match first {
                Some(Ok(d)) => vec![d],
                Some(Err(e)) => return Err(format!("consuming: {e}")),
                None => return Err("the consumer ended".into()),
            };
            let started = Instant::now();
            let until = tokio::time::Instant::now() + LINGER;
            while batch.len() < self.config.batch {
                match tokio::time::timeout_at(until, consumer.next_delivery()).await {
                    Ok(Some(Ok(d))) => batch.push(d),
                    Ok(Some(Err(e))) => return Err(format!("consuming: {e}")),
                    Ok(None) => return Err("the consumer ended".into()),
                    Err(_) => break,
                }
            }
            let events: Vec<Event> = batch.iter().map(|d| d.event.clone()).collect();
            match self.put_all(sink, &events, client, control).await {
                Ok(true) => {}
                Ok(false) => {
                    consumer.close().await;
                    return Ok(());
                }
                Err(e) => {
                    consumer.close().await;
                    return Err(e);
                }
            }
            crate::fault::at("sink-flushed");
            for d in &batch {
                d.ack();
            }
            Counts::add(&self.counts.put, batch.len());
            Counts::add(&self.counts.commit_us, started.elapsed().as_micros() as usize);
            Counts::add(&self.counts.commits, 1);
            let last = batch.last().map(|d| json!({"partition": d.partition, "offset": d.offset}));
            if let Some(p) = last {
                self.set_position(p);
            }
        }
    }

    /// `put` then `flush` until both succeeded, refused events sent to the dead-letter topic
    /// once each (`false`: the control changed first; an error: the sink cannot go on as
    /// configured). A failed `put` or `flush` counts nothing of the batch as written: it is put
    /// again whole (the sink's dedupe skips what it has).
    async fn put_all(
        &self,
        sink: &mut dyn Sink,
        events: &[Event],
        client: &Client,
        control: &mut watch::Receiver<(Control, u64)>,
    ) -> Result<bool, String> {
        let name = &self.config.name;
        let mut dead = std::collections::HashSet::new();
        let mut attempt = 0;
        'batch: loop {
            let mut from = 0;
            while from < events.len() {
                match sink.put(&events[from..]).await {
                    Ok(()) => from = events.len(),
                    Err(SinkError::Refused { index, reason }) => {
                        let i = from + index;
                        if dead.insert(i) {
                            eprintln!(
                                "evmesh-connect: {name}: event {} refused: {reason}; to {}",
                                events[i].id(),
                                self.config.dlq()
                            );
                            if !self.dead_letter(&events[i], &reason, client, control).await {
                                return Ok(false);
                            }
                        }
                        from = i + 1;
                    }
                    Err(SinkError::Failed(ConnectError::Fatal(e))) => return Err(format!("writing: {e}")),
                    Err(SinkError::Failed(e)) => {
                        eprintln!("evmesh-connect: {name}: writing: {e}");
                        if self.back_off(&mut attempt, control).await {
                            return Ok(false);
                        }
                        continue 'batch;
                    }
                }
            }
            match sink.flush().await {
                Ok(()) => return Ok(true),
                Err(ConnectError::Fatal(e)) => return Err(format!("flushing: {e}")),
                Err(e) => {
                    eprintln!("evmesh-connect: {name}: flushing: {e}");
                    if self.back_off(&mut attempt, control).await {
                        return Ok(false);
                    }
                }
            }
        }
    }

    /// The refused event, with why, to the dead-letter topic (retried while evmesh is away).
    async fn dead_letter(
        &self,
        event: &Event,
        reason: &str,
        client: &Client,
        control: &mut watch::Receiver<(Control, u64)>,
    ) -> bool {
        let mut e = connectors::undelivered(event);
        e.set_extension("connecterror", reason.chars().take(1024).collect::<String>());
        e.set_extension("connectname", self.config.name.clone());
        let mut attempt = 0;
        let mut without_data = false;
        loop {
            match client.publish(&self.config.dlq(), &e).await {
                Ok(_) => {
                    Counts::add(&self.counts.dlq, 1);
                    return true;
                }
                Err(err) if err.is_transient() || !matches!(err.status(), Some(400 | 413)) => {
                    eprintln!("evmesh-connect: {}: dead-lettering {}: {err}", self.config.name, e.id());
                    if self.back_off(&mut attempt, control).await {
                        return false;
                    }
                }
                // evmesh refuses it for itself (too large): its attributes go, without the data.
                Err(err) if !without_data => {
                    eprintln!(
                        "evmesh-connect: {}: dead-lettering {}: {err}; sending it without its data",
                        self.config.name,
                        e.id()
                    );
                    e.take_data();
                    without_data = true;
                }
                Err(err) => {
                    eprintln!(
                        "evmesh-connect: {}: {} not dead-lettered ({err}); passed over",
                        self.config.name,
                        e.id()
                    );
                    Counts::add(&self.counts.failed, 1);
                    return true;
                }
            }
        }
    }
}
