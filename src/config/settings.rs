//! The validated configuration the server runs with ([`Config`], with [`IoDriver`] and
//! [`StorageKind`]), the largest session window ([`MAX_WINDOW`]) and the URL of a bound
//! listener ([`local_url`]). `validate.rs` fills it in from a `RawConfig`.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use crate::http::Limits;
use crate::storage::Durability;

/// The largest window (unacknowledged events per session and owning shard) a session may ask
/// for, with `session_window` or `credit`.
pub const MAX_WINDOW: u32 = 4096;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IoDriver {
    Auto,
    Uring,
    Epoll,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StorageKind {
    Embedded,
    Kafka(crate::storage::KafkaSettings),
    RocketMq(crate::storage::RocketMqSettings),
}

impl StorageKind {
    /// The `storage` key's value.
    pub fn name(&self) -> &'static str {
        match self {
            StorageKind::Embedded => "embedded",
            StorageKind::Kafka(_) => "kafka",
            StorageKind::RocketMq(_) => "rocketmq",
        }
    }

    /// Whether the log is another system's (`storage::remote`): its topics are that system's,
    /// and this instance keeps a local copy.
    pub fn remote(&self) -> bool {
        !matches!(self, StorageKind::Embedded)
    }

    /// Whether instances form a cluster over the log (Kafka only: the cluster seam's records
    /// go through it); on the others an instance is a cluster of one.
    pub fn clustered(&self) -> bool {
        matches!(self, StorageKind::Kafka(_))
    }
}

/// The validated configuration the server runs with.
#[derive(Debug, Clone)]
pub struct Config {
    pub listen: SocketAddr,
    pub admin_listen: SocketAddr,
    /// The classic EventMesh TCP listener (`tcp_listen`), on the shards like `listen`; `None`:
    /// off.
    pub tcp_listen: Option<SocketAddr>,
    pub shards: usize,
    pub data_dir: PathBuf,
    pub storage: StorageKind,
    /// Tiered storage of the embedded log (`tier.s3.*`, the local retention); `None`: off.
    pub tier: Option<crate::storage::tier::TierSettings>,
    pub durability: Durability,
    /// Size at which a partition's segment file is sealed.
    pub segment_bytes: u64,
    pub io_driver: IoDriver,
    /// Segment writes with O_DIRECT through io_uring (on io_uring shards, durability os/fsync).
    pub direct_io: bool,
    pub default_partitions: u32,
    pub limits: Limits,
    pub max_connections: usize,
    pub header_read_timeout: Duration,
    pub idle_timeout: Duration,
    /// A response write that makes no progress for this long closes the connection.
    pub write_timeout: Duration,
    pub mailbox_capacity: usize,
    pub retention_ms: Option<u64>,
    pub retention_bytes: Option<u64>,
    pub retention_check: Duration,
    pub ws_max_message: usize,
    pub ws_echo_endpoint: bool,
    /// Initial in-flight window of an acknowledged session (per shard owning its partitions).
    pub session_window: u32,
    pub redelivery_backoff: Duration,
    /// Sessions gather events for this long before writing (fewer, larger writes under fan-out).
    pub delivery_linger: Duration,
    /// Bytes of unacknowledged deliveries a session may hold per owning shard.
    pub session_window_bytes: usize,
    /// Requests in flight to one webhook sink at most.
    pub webhook_concurrency: u32,
    pub webhook_timeout: Duration,
    /// Trusted for https sinks besides the built-in roots.
    pub webhook_ca_file: Option<PathBuf>,
    pub ws_ping_interval: Duration,
    pub max_topics: usize,
    pub max_subscriptions: usize,
    pub max_clients_per_subscription: usize,
    /// `None`: client offsets never expire.
    pub client_offset_ttl: Option<Duration>,
    /// Request-reply: the longest wait a request may ask for.
    pub max_request_timeout: Duration,
    /// Request-reply: requests waiting for a reply per shard, and their bytes.
    pub max_pending_requests: usize,
    pub max_pending_request_bytes: usize,
    /// Where clients reach this instance (`http[s]://host:port`, no trailing slash; empty until
    /// the runtime fills in the bound listener's [`local_url`]).
    pub advertised_url: String,
    /// Browser origins answered with CORS headers on the traffic listener (`*`: any); empty:
    /// none (a page from another origin cannot read the answers).
    pub cors_allowed_origins: Vec<String>,
    /// This instance's name among the instances over one Kafka cluster (empty until the runtime
    /// reads or makes the one kept in `data_dir`).
    pub instance_id: String,
    /// How often this instance heartbeats, and how long one unheard of is still live.
    pub heartbeat: Duration,
    pub instance_timeout: Duration,
    /// A lite topic without traffic this long is deleted (with its events).
    pub lite_topic_ttl: Duration,
    /// Agents registered at once, and how long one may stay silent and still be routed to.
    pub max_agents: usize,
    pub agent_heartbeat_timeout: Duration,
    pub max_sessions: usize,
    pub session_ttl: Duration,
    pub auto_create_topics: bool,
    pub admin_max_connections: usize,
    /// Resident memory past which new work is shed.
    pub memory_limit_bytes: u64,
    /// Identity, the config file's ACL rules, the admin token, the audit log.
    pub auth: crate::governance::AuthConfig,
    /// `None`: plain TCP.
    pub tls: Option<crate::server::tls::TlsFiles>,
    /// Where traces go (`<otlp_endpoint>/v1/traces`); `None`: tracing off.
    pub otlp_endpoint: Option<crate::server::client::Url>,
    pub otlp_protocol: OtlpProtocol,
    /// The share of new traces recorded.
    pub trace_sample_ratio: f64,
    pub log_format: crate::log::Format,
    pub log_level: crate::log::Filter,
}

/// How spans are encoded for the collector.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OtlpProtocol {
    /// `http/protobuf`
    Protobuf,
    /// `http/json`
    Json,
}

/// The URL of a bound traffic listener: `http(s)://ip:port`, loopback for a wildcard address.
pub fn local_url(listen: SocketAddr, tls: bool) -> String {
    let scheme = if tls { "https" } else { "http" };
    let host = match listen.ip() {
        ip if ip.is_unspecified() && ip.is_ipv4() => std::net::Ipv4Addr::LOCALHOST.into(),
        ip if ip.is_unspecified() => std::net::Ipv6Addr::LOCALHOST.into(),
        ip => ip,
    };
    format!("{scheme}://{}", SocketAddr::new(host, listen.port()))
}
