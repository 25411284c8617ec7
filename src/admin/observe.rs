//! What the broker tells about itself on the admin listener: readiness (`/readyz`), the
//! Prometheus text (`/metrics`: the shards' counters, process gauges, consumer lag and per-tenant
//! series), the cluster view, the agents listing, the subscriptions listing with each consumer's
//! lag, and the tenants' backlog measurement the runtime runs every 2 s ([`measure_backlog`]).

use std::sync::atomic::Ordering;

use super::common::log_of;
use crate::http::{problem, StatusCode};
use crate::ingress::storage_problem;
use crate::model::PartitionId;
use crate::server::Response;
use crate::shard::shared::Shared;
use crate::storage::{meta, Storage};

/// A subscription's partitions' end offsets and its stored committed offsets.
struct SubscriptionLag {
    def: crate::subscription::definition::Definition,
    ends: Vec<u64>,
    /// Per partition, its oldest retained offset.
    starts: Vec<u64>,
    stored: Vec<crate::storage::offsets::Committed>,
}

/// Every subscription `only` takes, with its partitions' bounds and its stored offsets (per
/// partition, its end offset and each stored consumer's committed offset: `client` empty for
/// the subscription's own `LOAD_BALANCE` offsets).
fn lag(
    shared: &Shared,
    only: impl Fn(&crate::subscription::definition::Definition) -> bool,
) -> Result<Vec<SubscriptionLag>, crate::storage::StorageError> {
    let shards = shared.config.shards;
    let mut out = Vec::new();
    for def in meta::list_subscriptions(&shared.db)?.into_iter().filter(|d| only(d)) {
        let partitions = meta::get(&shared.db, &def.topic)?.map_or(0, |m| m.partitions);
        let mut stored: Vec<crate::storage::offsets::Committed> = Vec::new();
        for s in 0..shards {
            let s = crate::model::ShardId(s as u16);
            stored.extend(crate::storage::offsets::list(&shared.db, s, &def.topic, &def.subscription)?);
        }
        let (mut starts, mut ends) = (Vec::new(), Vec::new());
        for p in (0..partitions).map(PartitionId) {
            let b = log_of(shared, &def.topic, p).bounds(&def.topic, p)?;
            starts.push(b.start);
            ends.push(b.end);
        }
        out.push(SubscriptionLag { def, ends, starts, stored });
    }
    Ok(out)
}

/// The backlog of each tenant with a `backlogBytes` quota: per partition of its topics, the
/// events its slowest subscription has not acknowledged (counted from the oldest retained one
/// for an `earliest` subscription nobody has read yet; from the first read otherwise), times
/// the partition's average event size. Reads RocksDB: run off the shards (`runtime`, every 2 s).
pub fn measure_backlog(shared: &Shared) -> Result<Vec<(String, u64)>, crate::storage::StorageError> {
    use crate::subscription::definition::Start;
    let snap = shared.governance.snapshot();
    let tenants: Vec<&str> =
        snap.quotas.iter().filter(|(_, q)| q.backlog_bytes.is_some()).map(|(t, _)| t.as_str()).collect();
    if tenants.is_empty() {
        return Ok(Vec::new());
    }
    let tenant_of =
        |name: &str| tenants.iter().copied().find(|t| name.strip_prefix(t).is_some_and(|rest| rest.starts_with('.')));
    let mut worst: std::collections::BTreeMap<(&str, String, u32), u64> = Default::default();
    let list = lag(shared, |d| tenant_of(&d.subscription).is_some())?;
    for s in &list {
        let tenant = tenant_of(&s.def.subscription).expect("filtered above");
        let earliest = matches!(&s.def.start, Start::Named(n) if n == "earliest");
        for (p, (&start, &end)) in s.starts.iter().zip(&s.ends).enumerate() {
            let read = s.stored.iter().filter(|c| c.partition as usize == p).map(|c| c.offset).min();
            // Retention may have removed events a slow consumer never read: they are not backlog.
            let from = match read {
                Some(o) => o.max(start),
                None if earliest => start,
                None => continue,
            };
            let w = worst.entry((tenant, s.def.topic.clone(), p as u32)).or_default();
            *w = (*w).max(end.saturating_sub(from));
        }
    }
    let mut bytes: std::collections::BTreeMap<&str, u64> = tenants.iter().map(|t| (*t, 0)).collect();
    for ((tenant, topic, p), events) in worst {
        if events > 0 {
            let average = log_of(shared, &topic, PartitionId(p)).average_record_bytes(&topic, PartitionId(p))?;
            *bytes.entry(tenant).or_default() += events.saturating_mul(average);
        }
    }
    Ok(bytes.into_iter().map(|(t, b)| (t.to_owned(), b)).collect())
}

/// `GET /readyz`: 200 once every shard runs its event loop; 503 (with why) while one has not
/// started or stalled, after a failed sync, or while descriptors run short.
pub(super) fn readyz(shared: &Shared) -> Response {
    match not_ready(shared) {
        None => Response::json(StatusCode::OK, r#"{"status":"ready"}"#),
        Some((detail, retry)) => {
            let r = problem(StatusCode::SERVICE_UNAVAILABLE, &detail);
            match retry {
                Some(secs) => r.with_header("retry-after", secs),
                None => r,
            }
        }
    }
}

/// Why the broker is not ready (and in how many seconds to ask again), or `None`: ready.
fn not_ready(shared: &Shared) -> Option<(String, Option<&'static str>)> {
    let ready = shared.ready.load(Ordering::Acquire);
    let stalled = shared.stalled_shards();
    if let Some(why) = shared.syncer.as_ref().and_then(|s| s.failure()) {
        Some((format!("{why}: nothing written since is durable; restart evmesh to recover"), None))
    } else if let Some(why) = shared.descriptors_short() {
        Some((why, Some("5")))
    } else if ready == shared.config.shards && stalled.is_empty() {
        None
    } else if ready == shared.config.shards {
        Some((format!("shards {stalled:?} have not run their event loop for over 5 s"), Some("1")))
    } else {
        Some((format!("{ready} of {} shards ready", shared.config.shards), Some("1")))
    }
}

/// `GET /metrics`: the Prometheus text.
pub(super) fn metrics(shared: &Shared) -> Response {
    let mut out = String::new();
    shared.metrics.render(&mut out);
    let mem = &shared.memory;
    let tls = shared.tls.as_deref();
    let calls = &shared.calls;
    for (name, kind, help, v) in [
        (
            "evmesh_memory_resident_bytes",
            "gauge",
            "Resident memory, sampled every 100 ms",
            mem.resident.load(Ordering::Relaxed),
        ),
        ("evmesh_memory_limit_bytes", "gauge", "memory_limit_bytes: new work is shed past it", mem.limit),
        (
            "evmesh_kafka_tail_bytes_total",
            "counter",
            "Bytes of events the remote log's tail read, Kafka's or RocketMQ's (the topics sessions here need)",
            shared.tail_bytes.load(Ordering::Relaxed),
        ),
        (
            "evmesh_open_files_limit",
            "gauge",
            "The open-files limit in force (shared out at start: see the descriptors line it printed)",
            shared.fds.limit,
        ),
        (
            "evmesh_connections_budget",
            "gauge",
            "Traffic connections per shard the open-files limit leaves room for (max_connections)",
            shared.config.max_connections as u64,
        ),
        (
            "evmesh_partition_files_open",
            "gauge",
            "Partitions' segment files open now (the least recently used close past their share)",
            shared.logs.open_files() as u64,
        ),
        (
            "evmesh_partition_files_budget",
            "gauge",
            "Partitions' share of the open-files limit",
            shared.logs.max_open() as u64,
        ),
        (
            "evmesh_client_sockets_open",
            "gauge",
            "Sockets the broker opened itself (webhook sinks, remote agents)",
            crate::server::client::sockets_open() as u64,
        ),
        (
            "evmesh_auth_key_reloads_total",
            "counter",
            "Changed tokens files or JWKS put in force",
            shared.governance.key_reloads.load(Ordering::Relaxed),
        ),
        (
            "evmesh_auth_key_reloads_failed_total",
            "counter",
            "Changed tokens files or JWKS that did not parse (the old keys stayed in force)",
            shared.governance.key_reloads_failed.load(Ordering::Relaxed),
        ),
        (
            "evmesh_audit_dropped_total",
            "counter",
            "Audit records dropped because the audit queue was full",
            shared.governance.audit.dropped.load(Ordering::Relaxed),
        ),
        (
            "evmesh_tls_handshakes_failed_total",
            "counter",
            "TLS handshakes that failed or did not finish within header_read_timeout",
            tls.map_or(0, |t| t.handshakes_failed.load(Ordering::Relaxed)),
        ),
        (
            "evmesh_tls_reloads_total",
            "counter",
            "TLS certificate and key reloads (SIGHUP) put in force",
            tls.map_or(0, |t| t.reloads.load(Ordering::Relaxed)),
        ),
        (
            "evmesh_tls_reloads_failed_total",
            "counter",
            "TLS reloads whose files did not load (the old certificate stayed in force)",
            tls.map_or(0, |t| t.reloads_failed.load(Ordering::Relaxed)),
        ),
        (
            "evmesh_memory_shed_total",
            "counter",
            "Requests refused (503) while over memory_limit_bytes",
            mem.shed.load(Ordering::Relaxed),
        ),
        ("evmesh_stream_sessions", "gauge", "Open agent streaming sessions", calls.len() as u64),
        (
            "evmesh_stream_chunks_total",
            "counter",
            "Chunks of agent streaming turns taken",
            calls.chunks.load(Ordering::Relaxed),
        ),
        (
            "evmesh_stream_chunks_dropped_total",
            "counter",
            "Chunks dropped from a turn's log (1024 chunks or 1 MiB) before every reader had them",
            calls.dropped.load(Ordering::Relaxed),
        ),
        (
            "evmesh_stream_sessions_expired_total",
            "counter",
            "Agent streaming sessions closed after session_ttl_ms idle",
            calls.expired.load(Ordering::Relaxed),
        ),
        ("evmesh_stream_buffer_bytes", "gauge", "Chunk bytes held by turn logs", calls.held() as u64),
        (
            "evmesh_ready",
            "gauge",
            "1 while GET /readyz answers 200 (every shard turning, storage writable, descriptors to accept)",
            u64::from(not_ready(shared).is_none()),
        ),
        (
            "evmesh_descriptors_short",
            "gauge",
            "1 while a shard could not accept a connection for want of a file descriptor (see /readyz)",
            u64::from(shared.descriptors_short().is_some()),
        ),
        (
            "evmesh_trace_spans_exported_total",
            "counter",
            "Spans the collector took (otlp_endpoint)",
            crate::trace::EXPORTED.load(Ordering::Relaxed),
        ),
        (
            "evmesh_trace_spans_dropped_total",
            "counter",
            "Spans dropped because the exporter's queue was full (a shard never waits for it)",
            crate::trace::DROPPED.load(Ordering::Relaxed),
        ),
        (
            "evmesh_trace_spans_failed_total",
            "counter",
            "Spans lost because the collector could not be reached or refused them",
            crate::trace::FAILED.load(Ordering::Relaxed),
        ),
    ] {
        out.push_str(&format!("# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {v}\n"));
    }
    if let Some(t) = shared.logs.tier() {
        t.render(&mut out);
    }
    let name = "evmesh_shard_heartbeat_age_seconds";
    out.push_str(&format!(
        "# HELP {name} Time since the shard's event loop last turned (over 5 s: /readyz is 503)\n# TYPE {name} gauge\n"
    ));
    let now = shared.epoch.elapsed().as_millis() as u64;
    for (i, beat) in shared.beats.iter().enumerate() {
        let age = now.saturating_sub(beat.load(Ordering::Relaxed));
        out.push_str(&format!("{name}{{shard=\"{i}\"}} {}.{:03}\n", age / 1000, age % 1000));
    }
    let name = "evmesh_mailbox_depth";
    out.push_str(&format!("# HELP {name} Messages waiting in a shard's inbound rings\n# TYPE {name} gauge\n"));
    for s in 0..shared.config.shards {
        let depth = shared.mailboxes.depth(crate::model::ShardId(s as u16));
        out.push_str(&format!("{name}{{shard=\"{s}\"}} {depth}\n"));
    }
    lag_metrics(shared, &mut out);
    tenant_metrics(shared, &mut out);
    Response::new(StatusCode::OK, "text/plain; version=0.0.4", out)
}

/// Per-tenant counters (at most `governance::TENANT_SERIES` tenants by name, the rest as
/// `_other`) and the open connections of tenants with a `connections` quota.
fn tenant_metrics(shared: &Shared, out: &mut String) {
    use std::sync::atomic::Ordering::Relaxed;
    let g = &shared.governance;
    let tenants = g.tenants();
    for (name, help, get) in [
        (
            "evmesh_tenant_events_published_total",
            "Events published by a tenant's principals",
            (|t: &crate::governance::TenantStats| t.published.load(Relaxed)) as fn(&_) -> u64,
        ),
        ("evmesh_tenant_denied_total", "Requests of a tenant's principals refused by the ACL (403)", |t| {
            t.denied.load(Relaxed)
        }),
        ("evmesh_tenant_limited_total", "Requests of a tenant's principals over a rate limit or quota (429)", |t| {
            t.limited.load(Relaxed)
        }),
    ] {
        out.push_str(&format!("# HELP {name} {help}\n# TYPE {name} counter\n"));
        for t in &tenants {
            out.push_str(&format!("{name}{{tenant=\"{}\"}} {}\n", t.tenant, get(t)));
        }
    }
    let name = "evmesh_tenant_backlog_bytes";
    out.push_str(&format!(
        "# HELP {name} Unacknowledged bytes of a tenant with a backlogBytes quota (estimated every 2 s)\n# TYPE {name} gauge\n"
    ));
    for (t, n) in g.backlog().iter() {
        out.push_str(&format!("{name}{{tenant=\"{t}\"}} {n}\n"));
    }
    let name = "evmesh_tenant_connections";
    out.push_str(&format!(
        "# HELP {name} Open connections of a tenant with a connections quota\n# TYPE {name} gauge\n"
    ));
    for (t, n) in g.tenant_connections() {
        out.push_str(&format!("{name}{{tenant=\"{t}\"}} {n}\n"));
    }
}

/// Consumer lag as Prometheus gauges, one series per stored consumer and partition.
fn lag_metrics(shared: &Shared, out: &mut String) {
    let Ok(list) = lag(shared, |_| true) else { return };
    let name = "evmesh_consumer_lag";
    out.push_str(&format!(
        "# HELP {name} Events published but not yet acknowledged, per consumer and partition\n# TYPE {name} gauge\n"
    ));
    for s in list {
        for c in &s.stored {
            let end = s.ends.get(c.partition as usize).copied().unwrap_or(0);
            out.push_str(&format!(
                "{name}{{subscription=\"{}\",client=\"{}\",partition=\"{}\"}} {}\n",
                s.def.subscription,
                c.client,
                c.partition,
                end.saturating_sub(c.offset)
            ));
        }
    }
}

/// `GET /admin/cluster`: the membership view, with `claimsRead`.
pub(super) fn cluster(shared: &Shared) -> Response {
    let storage = shared.config.storage.name();
    let read = !shared.config.storage.clustered() || shared.cluster.homes().is_caught_up();
    let mut view = shared.cluster.membership().view(std::time::Instant::now(), storage);
    // Over Kafka: the claims (and offsets) written before it started are read; until
    // then its sessions, polls and acks answer 503.
    view["claimsRead"] = read.into();
    Response::json(StatusCode::OK, serde_json::to_vec(&view).expect("json"))
}

/// `GET /admin/agents`: the registered agents (ids tenant-scoped), each with `ready`,
/// `routable` (ready and heard from within `agent_heartbeat_timeout_ms`) and
/// `lastHeartbeatMs`.
pub(super) fn agents(shared: &Shared) -> Response {
    let now = crate::model::clock::now_ms();
    let timeout = shared.config.agent_heartbeat_timeout.as_millis() as u64;
    let list: Vec<serde_json::Value> = shared
        .agents
        .list()
        .into_iter()
        .map(|(id, a)| {
            serde_json::json!({"agentId": id, "ready": a.ready, "routable": a.routable(now, timeout), "lastHeartbeatMs": a.beat_ms})
        })
        .collect();
    Response::json(StatusCode::OK, serde_json::to_vec(&list).expect("json"))
}

/// `GET /admin/subscriptions`: each definition with `partitions`: end offset and, per stored
/// consumer, `client` (null for the subscription's own offsets), `committed` and `lag`. A
/// partition no session has read yet has no consumers.
pub(super) fn subscriptions(shared: &Shared) -> Response {
    let list = match lag(shared, |_| true) {
        Ok(l) => l,
        Err(e) => return storage_problem(&e),
    };
    let mut out = Vec::with_capacity(list.len());
    for s in list {
        let parts: Vec<serde_json::Value> = s
            .ends
            .iter()
            .enumerate()
            .map(|(p, &end)| {
                let consumers: Vec<serde_json::Value> = s
                    .stored
                    .iter()
                    .filter(|c| c.partition as usize == p)
                    .map(|c| {
                        let client = (!c.client.is_empty()).then_some(c.client.as_str());
                        serde_json::json!({"client": client, "committed": c.offset, "lag": end.saturating_sub(c.offset)})
                    })
                    .collect();
                serde_json::json!({"partition": p, "end_offset": end, "consumers": consumers})
            })
            .collect();
        let mut v = s.def.shown();
        v["partitions"] = serde_json::Value::Array(parts);
        // Where its sessions attach (`null` while no instance is known live).
        let key = crate::cluster::homes::subscription_key(&s.def.subscription);
        v["home"] = match shared.cluster.home(&key, false) {
            Some(h) => serde_json::json!({"instanceId": h.id, "url": h.url}),
            None => serde_json::Value::Null,
        };
        out.push(v);
    }
    Response::json(StatusCode::OK, serde_json::to_vec(&out).expect("json"))
}
