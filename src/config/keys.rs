//! The key table: [`KEYS`] names every configuration key once, with what it does (it drives
//! the environment variables, the flags and the help), [`kind`] says each key's type, and
//! [`DEFAULT_TOML`] is the commented defaults every load starts from.

/// The commented defaults; `evmesh.toml` in the repository is this file.
pub const DEFAULT_TOML: &str = include_str!("../../evmesh.toml");

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    Str,
    Int,
    Float,
    Bool,
}

/// Every key: TOML name (dotted for tables), type, and what it does.
pub const KEYS: &[(&str, &str)] = &[
    ("listen", "traffic listener (HTTP/1.1 + WebSocket)"),
    ("admin_listen", "admin listener (metrics, health, admin API)"),
    ("tcp_listen", "classic EventMesh TCP clients' listener (the Java and Go SDKs' TCP protocol); empty = off"),
    ("shards", "shard threads; 0 = one per CPU"),
    ("data_dir", "where the embedded log and offsets live"),
    ("storage", "embedded | kafka | rocketmq"),
    ("segment_bytes", "a partition's segment file is sealed at this size; retention deletes whole segments"),
    ("kafka.brokers", "HOST:PORT[,...] for storage = kafka"),
    ("kafka.replication_factor", "replication factor of topics evmesh creates in Kafka"),
    ("kafka.acks", "producer acks: all | 1 | 0"),
    ("kafka.compression", "producer compression: none | gzip | snappy | lz4 | zstd"),
    ("kafka.topic_prefix", "put before every evmesh topic name to name its Kafka topic"),
    ("kafka.properties", "librdkafka properties passed through, KEY=VALUE,KEY=VALUE (security, timeouts)"),
    ("kafka.topic_refresh_ms", "how often the broker's topics are read for partitions added there"),
    ("rocketmq.namesrv", "HOST:PORT[;...] of the RocketMQ name servers for storage = rocketmq"),
    ("rocketmq.topic_prefix", "put before every evmesh topic name to name its RocketMQ topic"),
    ("rocketmq.send_timeout_ms", "how long a publish waits for the RocketMQ broker before its 503"),
    ("rocketmq.topic_refresh_ms", "how often the RocketMQ topics' queues are read for queues added there"),
    ("tier.s3.bucket", "S3 bucket the embedded log's sealed segments are tiered to; empty = no tiering"),
    ("tier.s3.endpoint", "S3 endpoint URL (an S3-compatible store); empty = AWS's, by region"),
    ("tier.s3.region", "S3 region"),
    ("tier.s3.prefix", "put before every object key evmesh writes in the bucket"),
    ("tier.s3.upload_interval_ms", "how often sealed segments not yet in the bucket are looked for"),
    ("tier.s3.cache_bytes", "memory for history read back from the bucket (read-ahead included)"),
    ("local_retention_bytes", "with tiering: local bytes per partition kept of what is in the bucket; 0 = all"),
    ("local_retention_ms", "with tiering: local copies of uploaded segments older than this go; 0 = never"),
    ("durability", "memory | os | fsync"),
    ("io_driver", "auto | uring | epoll"),
    ("direct_io", "segment writes bypass the page cache (O_DIRECT through io_uring) on io_uring shards, durability os or fsync; the 202 waits for the device"),
    ("default_partitions", "partitions of auto-created topics; 0 = shards"),
    ("max_body_bytes", "largest request body (413 beyond)"),
    ("max_header_bytes", "largest request head (431 beyond)"),
    ("max_connections", "open connections per shard; more are closed at accept"),
    ("header_read_timeout_ms", "time to receive a whole request once it started"),
    ("idle_timeout_ms", "keep-alive connection idle time before it is closed"),
    ("write_timeout_ms", "a response write making no progress this long closes the connection"),
    ("mailbox_capacity", "messages per shard-to-shard ring (503 when full)"),
    ("retention_ms", "age limit of auto-created topics; 0 = none"),
    ("retention_bytes", "size limit per partition of auto-created topics; 0 = none"),
    ("retention_check_ms", "how often each shard applies retention"),
    ("ws_max_message_bytes", "largest WebSocket message accepted (1009 beyond)"),
    ("ws_echo_endpoint", "serve the WebSocket echo endpoint /ws/echo (conformance tests only)"),
    ("session_window", "unacknowledged deliveries a session may hold per owning shard, until it sends credit"),
    ("redelivery_backoff_ms", "first redelivery backoff; doubles per attempt up to 16x, with jitter"),
    ("delivery_linger_us", "how long a session waits to gather more events into one write; 0 = write at once"),
    (
        "session_window_bytes",
        "bytes of unacknowledged deliveries a session may hold per owning shard (at least one event)",
    ),
    ("webhook_concurrency", "requests in flight to one webhook sink at most (one per partition at a time)"),
    ("webhook_timeout_ms", "a webhook sink taking longer over a step of a request fails that attempt"),
    ("webhook_ca_file", "PEM certificates trusted for https sinks besides the built-in Mozilla roots"),
    ("ws_ping_interval_ms", "a WebSocket session silent this long is pinged; silent twice as long, it is closed"),
    ("max_topics", "topics in all (dead-letter topics not counted); creating more is refused (409)"),
    ("max_subscriptions", "subscriptions in all; creating more is refused (409)"),
    (
        "max_clients_per_subscription",
        "clientIds with stored offsets per subscription; a new one beyond is refused (409)",
    ),
    ("client_offset_ttl_ms", "offsets of a client not seen for this long are forgotten; 0 = never"),
    ("max_request_timeout_ms", "request-reply: the longest timeoutMs a request may ask for (larger ones are capped)"),
    ("max_pending_requests", "request-reply: requests waiting for a reply per shard (429 beyond)"),
    ("max_pending_request_bytes", "request-reply: bytes of the requests waiting for a reply per shard (429 beyond)"),
    ("max_agents", "agents registered at once (agent streaming calls); more are refused (429)"),
    ("agent_heartbeat_timeout_ms", "an agent not heard from for this long is not routed to"),
    ("max_sessions", "agent streaming sessions open at once; more are refused (429)"),
    ("session_ttl_ms", "an agent streaming session idle this long is closed"),
    ("lite_topic_ttl_ms", "a lite topic (agent.*, client.*, session.*) without traffic this long is deleted"),
    ("advertised_url", "the URL clients reach this instance at (emreplyto, instanceUrl); empty = from listen"),
    ("cors_allowed_origins", "browser origins (scheme://host[:port], comma-separated, or *) allowed cross-origin on the traffic listener; empty = none"),
    ("instance_id", "this instance's name among instances over one Kafka cluster; empty = generated, kept in data_dir"),
    ("heartbeat_ms", "storage = kafka: how often this instance says it lives (and its load) to the others"),
    ("instance_timeout_ms", "storage = kafka: an instance not heard from for this long is not live"),
    ("auto_create_topics", "create a topic on its first publish or subscription (false: 404 until PUT /admin/topics)"),
    ("admin_max_connections", "open connections on the admin listener; more are closed at accept"),
    (
        "memory_limit_bytes",
        "resident memory past which new work is refused (503); 0 = 80% of the cgroup or machine memory",
    ),
    ("auth", "none | token | jwt: how callers prove who they are (none only while both listeners are loopback)"),
    ("auth_tokens_file", "auth = token: JSON lines {\"principal\",\"tenant\",\"sha256\"} (re-read when it changes)"),
    ("jwt_jwks_file", "auth = jwt: the JWKS of the verification keys, by kid (re-read when it changes)"),
    ("jwt_audience", "auth = jwt: the aud a token must name; empty = not checked"),
    ("jwt_issuer", "auth = jwt: the iss a token must name; empty = not checked"),
    ("jwt_leeway_ms", "auth = jwt: clock skew allowed on exp and nbf"),
    ("admin_token", "Bearer token of the admin API (besides ADMIN principals); empty = none"),
    ("audit_log", "audit log file (JSON lines); empty = audit.log in data_dir"),
    ("audit_max_per_second", "audit lines written per second at most (the rest are counted)"),
    ("audit_max_bytes", "audit log size at which it is rotated to <file>.1"),
    ("tls_cert", "TLS on both listeners: certificate chain (PEM), read again on SIGHUP; empty = plain TCP"),
    ("tls_key", "the private key of tls_cert (PEM), read again on SIGHUP"),
    ("tls_client_ca", "mutual TLS: the CA clients' certificates must chain to; the subject is the principal"),
    ("otlp_endpoint", "OpenTelemetry collector base URL (traces POSTed to /v1/traces); empty = tracing off"),
    ("otlp_protocol", "http/protobuf | http/json"),
    ("trace_sample_ratio", "share of new traces recorded, 0.0-1.0 (a traceparent's sampled flag wins)"),
    ("log_format", "text | json"),
    ("log_level", "error | warn | info | debug, then target=level pairs (RUST_LOG style)"),
];

pub(super) fn kind(key: &str) -> Kind {
    match key {
        "listen"
        | "admin_listen"
        | "tcp_listen"
        | "data_dir"
        | "storage"
        | "kafka.brokers"
        | "kafka.acks"
        | "kafka.compression"
        | "kafka.properties"
        | "kafka.topic_prefix"
        | "rocketmq.namesrv"
        | "rocketmq.topic_prefix"
        | "tier.s3.bucket"
        | "tier.s3.endpoint"
        | "tier.s3.region"
        | "tier.s3.prefix"
        | "durability"
        | "io_driver"
        | "auth"
        | "auth_tokens_file"
        | "jwt_jwks_file"
        | "jwt_audience"
        | "jwt_issuer"
        | "admin_token"
        | "audit_log"
        | "tls_cert"
        | "tls_key"
        | "tls_client_ca"
        | "advertised_url"
        | "webhook_ca_file"
        | "instance_id"
        | "cors_allowed_origins"
        | "otlp_endpoint"
        | "otlp_protocol"
        | "log_format"
        | "log_level" => Kind::Str,
        "trace_sample_ratio" => Kind::Float,
        "ws_echo_endpoint" | "auto_create_topics" | "direct_io" => Kind::Bool,
        _ => Kind::Int,
    }
}
