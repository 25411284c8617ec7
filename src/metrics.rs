//! Per-shard counters and histograms, rendered as Prometheus text.
//!
//! Each shard writes only its own cache-padded slot with relaxed atomics (no sharing on the hot
//! path); the admin thread reads them all when scraped. Filter evaluations over budget are
//! tallied by the filter code on the evaluating thread and read here by shard thread name.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};

use crossbeam_utils::CachePadded;

use crate::model::ShardId;

#[derive(Default)]
pub struct Counter(AtomicU64);

impl Counter {
    pub fn inc(&self) {
        self.add(1);
    }
    pub fn add(&self, n: u64) {
        self.0.fetch_add(n, Ordering::Relaxed);
    }
    pub fn sub(&self, n: u64) {
        self.0.fetch_sub(n, Ordering::Relaxed);
    }
    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// Buckets of powers of two microseconds, 1 µs .. ~67 s.
const BUCKETS: usize = 27;

pub struct Histogram {
    buckets: [AtomicU64; BUCKETS],
    sum_us: AtomicU64,
    count: AtomicU64,
}

impl Default for Histogram {
    fn default() -> Self {
        Histogram {
            buckets: std::array::from_fn(|_| AtomicU64::new(0)),
            sum_us: AtomicU64::new(0),
            count: AtomicU64::new(0),
        }
    }
}

impl Histogram {
    pub fn record_us(&self, us: u64) {
        let i = (64 - us.max(1).saturating_sub(1).leading_zeros() as usize).min(BUCKETS - 1);
        self.buckets[i].fetch_add(1, Ordering::Relaxed);
        self.sum_us.fetch_add(us, Ordering::Relaxed);
        self.count.fetch_add(1, Ordering::Relaxed);
    }
}

#[derive(Default)]
pub struct ShardMetrics {
    pub publish_requests: Counter,
    pub events_published: Counter,
    /// Bytes of the events stored (every path: publishes, turns, routed copies).
    pub bytes_stored: Counter,
    pub publish_errors: Counter,
    /// Events a topic's transformer reshaped; copies a route stored in another topic.
    pub events_transformed: Counter,
    pub events_routed: Counter,
    pub cross_core: Counter,
    pub connections_open: Counter,
    pub connections_accepted: Counter,
    pub connections_rejected: Counter,
    pub deliveries_dropped: Counter,
    pub deliveries: Counter,
    /// Writes to WebSocket sessions, each every frame queued when the writer woke.
    pub ws_writes: Counter,
    pub redeliveries: Counter,
    pub acks: Counter,
    pub dead_lettered: Counter,
    pub control_deferred: Counter,
    pub acks_rejected: Counter,
    /// Requests over `task::HEAVY` of the core, and the core time they took.
    pub heavy_requests: Counter,
    pub heavy_core_us: Counter,
    /// Request-reply: requests ended by outcome ([`REQUEST_OUTCOMES`]), waiting now, dropped at
    /// dispatch past their deadline, replies sent to another shard, replies matching nothing.
    pub requests: [Counter; 3],
    pub requests_pending: Counter,
    pub requests_expired: Counter,
    pub replies_cross_core: Counter,
    /// Replies forwarded to another instance (`cluster::replies`).
    pub replies_cross_instance: Counter,
    pub replies_unmatched: Counter,
    /// Lite topics deleted after `lite_topic_ttl_ms` without traffic.
    pub lite_topics_expired: Counter,
    pub publish_latency: Histogram,
    /// Requests refused by the connection itself before a close, by status: 400 (framing),
    /// 408, 413, 431, other.
    pub http_refused: [Counter; 5],
    /// Requests to webhook sinks by result ([`WEBHOOK_RESULTS`]).
    pub webhook_requests: [Counter; 3],
}

impl ShardMetrics {
    /// A request (or WebSocket message) that took `cost` of the core, over `task::HEAVY`.
    pub fn heavy(&self, cost: std::time::Duration) {
        self.heavy_requests.inc();
        self.heavy_core_us.add(cost.as_micros() as u64);
    }

    pub fn refused(&self, status: u16) {
        let i = REFUSED.iter().position(|&s| s == status).unwrap_or(REFUSED.len());
        self.http_refused[i].inc();
    }
}

/// The statuses `http_refused` counts apart; anything else is the last slot.
const REFUSED: [u16; 4] = [400, 408, 413, 431];

/// How a request that waited for its reply ended: the label of `evmesh_requests_total`.
pub const REQUEST_OUTCOMES: [&str; 3] = ["replied", "timed_out", "abandoned"];

/// How a request to a webhook sink ended: the label of `evmesh_webhook_requests_total`.
/// `deferred` is a 429 or 503 with `Retry-After` (an attempt all the same).
pub const WEBHOOK_RESULTS: [&str; 3] = ["ok", "failed", "deferred"];

/// Picks one counter out of a shard's metrics.
pub type CounterOf = fn(&ShardMetrics) -> &Counter;

pub struct Metrics {
    shards: Box<[CachePadded<ShardMetrics>]>,
}

impl Metrics {
    pub fn new(shards: usize) -> Self {
        Metrics { shards: (0..shards).map(|_| CachePadded::new(ShardMetrics::default())).collect() }
    }

    pub fn shard(&self, id: ShardId) -> &ShardMetrics {
        &self.shards[id.index()]
    }

    /// One counter summed over the shards.
    pub fn total(&self, of: CounterOf) -> u64 {
        self.shards.iter().map(|m| of(m).get()).sum()
    }

    /// Prometheus text exposition of every shard's metrics.
    pub fn render(&self, out: &mut String) {
        let counters: [(&str, &str, CounterOf); 24] = [
            ("evmesh_publish_requests_total", "Publish requests answered", |m| &m.publish_requests),
            ("evmesh_events_published_total", "Events stored", |m| &m.events_published),
            ("evmesh_bytes_stored_total", "Bytes of the events stored (publishes, turns, routed copies)", |m| {
                &m.bytes_stored
            }),
            ("evmesh_publish_errors_total", "Publish requests answered with an error", |m| &m.publish_errors),
            ("evmesh_events_transformed_total", "Events reshaped by their topic's transformer", |m| {
                &m.events_transformed
            }),
            ("evmesh_events_routed_total", "Copies of events a route stored in another topic", |m| &m.events_routed),
            ("evmesh_cross_core_appends_total", "Appends sent to another shard's mailbox", |m| &m.cross_core),
            ("evmesh_connections_accepted_total", "Connections accepted", |m| &m.connections_accepted),
            ("evmesh_connections_rejected_total", "Connections closed at accept (max_connections)", |m| {
                &m.connections_rejected
            }),
            (
                "evmesh_deliveries_dropped_total",
                "Deliveries dropped at a full mailbox (acked ones are redelivered)",
                |m| &m.deliveries_dropped,
            ),
            (
                "evmesh_deliveries_total",
                "Events queued to sessions (all transports), by the shard holding the session",
                |m| &m.deliveries,
            ),
            (
                "evmesh_ws_writes_total",
                "Writes to WebSocket sessions (each gathers every frame queued when it starts: deliveries per write is the gathering)",
                |m| &m.ws_writes,
            ),
            ("evmesh_redeliveries_total", "Deliveries after the first attempt", |m| &m.redeliveries),
            ("evmesh_acks_total", "Acks and nacks received", |m| &m.acks),
            ("evmesh_dead_lettered_total", "Events appended to a dead-letter topic", |m| &m.dead_lettered),
            (
                "evmesh_control_deferred_total",
                "Control messages that found their ring full and waited in the sender's outbox (never dropped)",
                |m| &m.control_deferred,
            ),
            (
                "evmesh_acks_rejected_total",
                "Ack requests refused at the edge (ids naming no partition of the topic, too many ids)",
                |m| &m.acks_rejected,
            ),
            (
                "evmesh_heavy_requests_total",
                "Requests and WebSocket messages that took over 200 µs of their shard's core (their connection then waited its turn in the heavy lane)",
                |m| &m.heavy_requests,
            ),
            ("evmesh_heavy_core_microseconds_total", "Core time taken by heavy requests", |m| &m.heavy_core_us),
            (
                "evmesh_requests_expired_total",
                "Requests dropped at dispatch because their deadline had passed (never delivered)",
                |m| &m.requests_expired,
            ),
            ("evmesh_replies_cross_core_total", "Replies sent to the requester's shard (one mailbox hop)", |m| {
                &m.replies_cross_core
            }),
            (
                "evmesh_replies_cross_instance_total",
                "Replies forwarded through Kafka to the requester's instance",
                |m| &m.replies_cross_instance,
            ),
            ("evmesh_lite_topics_expired_total", "Lite topics deleted after lite_topic_ttl_ms without traffic", |m| {
                &m.lite_topics_expired
            }),
            ("evmesh_replies_unmatched_total", "Replies answered 404: unknown, late or already answered", |m| {
                &m.replies_unmatched
            }),
        ];
        for (name, help, get) in counters {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter");
            for (i, m) in self.shards.iter().enumerate() {
                let _ = writeln!(out, "{name}{{shard=\"{i}\"}} {}", get(m).get());
            }
        }
        // Tallied per thread by the filter code itself (no hook on the delivery path); the
        // runtime names shard i's thread `evmesh-shard-{i}` (src/runtime/mod.rs).
        let name = "evmesh_filter_budget_exceeded_total";
        let _ = writeln!(
            out,
            "# HELP {name} Filter evaluations stopped at their step or byte budget (the event did not match)\n# TYPE {name} counter"
        );
        for i in 0..self.shards.len() {
            let n = crate::subscription::filter::over_budget_on(&format!("evmesh-shard-{i}"));
            let _ = writeln!(out, "{name}{{shard=\"{i}\"}} {n}");
        }
        let name = "evmesh_http_refused_total";
        let _ = writeln!(
            out,
            "# HELP {name} Requests the connection refused and closed after (framing 400, 408, 413, 431)\n# TYPE {name} counter"
        );
        for (i, m) in self.shards.iter().enumerate() {
            for (k, c) in m.http_refused.iter().enumerate() {
                let status = REFUSED.get(k).map_or("other".to_string(), |s| s.to_string());
                let _ = writeln!(out, "{name}{{shard=\"{i}\",status=\"{status}\"}} {}", c.get());
            }
        }
        let name = "evmesh_requests_total";
        let _ =
            writeln!(out, "# HELP {name} Requests that waited for a reply, by how they ended\n# TYPE {name} counter");
        for (i, m) in self.shards.iter().enumerate() {
            for (outcome, c) in REQUEST_OUTCOMES.iter().zip(&m.requests) {
                let _ = writeln!(out, "{name}{{shard=\"{i}\",outcome=\"{outcome}\"}} {}", c.get());
            }
        }
        let name = "evmesh_webhook_requests_total";
        let _ = writeln!(out, "# HELP {name} Requests to webhook sinks, by result\n# TYPE {name} counter");
        for (i, m) in self.shards.iter().enumerate() {
            for (result, c) in WEBHOOK_RESULTS.iter().zip(&m.webhook_requests) {
                let _ = writeln!(out, "{name}{{shard=\"{i}\",result=\"{result}\"}} {}", c.get());
            }
        }
        let name = "evmesh_requests_pending";
        let _ = writeln!(out, "# HELP {name} Requests waiting for their reply\n# TYPE {name} gauge");
        for (i, m) in self.shards.iter().enumerate() {
            let _ = writeln!(out, "{name}{{shard=\"{i}\"}} {}", m.requests_pending.get());
        }
        let name = "evmesh_connections_open";
        let _ = writeln!(out, "# HELP {name} Open connections\n# TYPE {name} gauge");
        for (i, m) in self.shards.iter().enumerate() {
            let _ = writeln!(out, "{name}{{shard=\"{i}\"}} {}", m.connections_open.get());
        }
        let name = "evmesh_publish_latency_seconds";
        let _ = writeln!(out, "# HELP {name} Publish request handling time, parse to stored\n# TYPE {name} histogram");
        for (i, m) in self.shards.iter().enumerate() {
            let h = &m.publish_latency;
            let mut cum = 0;
            for (b, c) in h.buckets.iter().enumerate() {
                cum += c.load(Ordering::Relaxed);
                let le = (1u64 << b) as f64 / 1e6;
                let _ = writeln!(out, "{name}_bucket{{shard=\"{i}\",le=\"{le}\"}} {cum}");
            }
            let _ = writeln!(out, "{name}_bucket{{shard=\"{i}\",le=\"+Inf\"}} {cum}");
            let _ = writeln!(out, "{name}_sum{{shard=\"{i}\"}} {}", h.sum_us.load(Ordering::Relaxed) as f64 / 1e6);
            let _ = writeln!(out, "{name}_count{{shard=\"{i}\"}} {}", h.count.load(Ordering::Relaxed));
        }
    }
}
