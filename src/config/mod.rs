//! Configuration in two stages: [`RawConfig`] is what the operator wrote (commented TOML, then
//! `EVMESH_*` variables, then flags; later wins), [`Config`] is what the server runs with, checked
//! and with every derived value filled in. Only `Config` leaves this module's callers' `main`.
//!
//! One table, [`KEYS`], names every key once: it drives the environment, the flags and the help.

pub mod fds;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

use crate::http::Limits;
use crate::storage::Durability;

/// The largest window (unacknowledged events per session and owning shard) a session may ask
/// for, with `session_window` or `credit`.
pub const MAX_WINDOW: u32 = 4096;

/// The commented defaults; `evmesh.toml` in the repository is this file.
pub const DEFAULT_TOML: &str = include_str!("../../evmesh.toml");

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("reading {path}: {source}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{origin}: {message}")]
    Parse { origin: String, message: String },
    #[error("unknown flag {0} (see `evmesh serve --help`)")]
    UnknownFlag(String),
    #[error("flag {0} needs a value")]
    MissingValue(String),
    #[error("invalid {key}: {message}")]
    Invalid { key: &'static str, message: String },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Str,
    Int,
    Bool,
}

/// Every key: TOML name (dotted for tables), type, and what it does.
pub const KEYS: &[(&str, &str)] = &[
    ("listen", "traffic listener (HTTP/1.1 + WebSocket)"),
    ("admin_listen", "admin listener (metrics, health, admin API)"),
    ("shards", "shard threads; 0 = one per CPU"),
    ("data_dir", "where the embedded log and offsets live"),
    ("storage", "embedded | kafka"),
    ("segment_bytes", "a partition's segment file is sealed at this size; retention deletes whole segments"),
    ("kafka.brokers", "HOST:PORT[,...] for storage = kafka"),
    ("kafka.replication_factor", "replication factor of topics evmesh creates in Kafka"),
    ("kafka.acks", "producer acks: all | 1 | 0"),
    ("kafka.compression", "producer compression: none | gzip | snappy | lz4 | zstd"),
    ("kafka.topic_prefix", "put before every evmesh topic name to name its Kafka topic"),
    ("kafka.properties", "librdkafka properties passed through, KEY=VALUE,KEY=VALUE (security, timeouts)"),
    ("kafka.topic_refresh_ms", "how often the broker's topics are read for partitions added there"),
    ("durability", "memory | os | fsync"),
    ("io_driver", "auto | uring | epoll"),
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
];

fn kind(key: &str) -> Kind {
    match key {
        "listen"
        | "admin_listen"
        | "data_dir"
        | "storage"
        | "kafka.brokers"
        | "kafka.acks"
        | "kafka.compression"
        | "kafka.properties"
        | "kafka.topic_prefix"
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
        | "cors_allowed_origins" => Kind::Str,
        "ws_echo_endpoint" | "auto_create_topics" => Kind::Bool,
        _ => Kind::Int,
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct KafkaRaw {
    brokers: String,
    replication_factor: u64,
    acks: String,
    compression: String,
    topic_prefix: String,
    properties: String,
    topic_refresh_ms: u64,
}

/// What the operator wrote, merged from all sources; see `evmesh.toml` for each key.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawConfig {
    listen: String,
    admin_listen: String,
    shards: u64,
    data_dir: String,
    storage: String,
    segment_bytes: u64,
    kafka: KafkaRaw,
    durability: String,
    io_driver: String,
    default_partitions: u64,
    max_body_bytes: u64,
    max_header_bytes: u64,
    max_connections: u64,
    header_read_timeout_ms: u64,
    idle_timeout_ms: u64,
    write_timeout_ms: u64,
    mailbox_capacity: u64,
    retention_ms: u64,
    retention_bytes: u64,
    retention_check_ms: u64,
    ws_max_message_bytes: u64,
    ws_echo_endpoint: bool,
    session_window: u64,
    redelivery_backoff_ms: u64,
    delivery_linger_us: u64,
    session_window_bytes: u64,
    webhook_concurrency: u64,
    webhook_timeout_ms: u64,
    webhook_ca_file: String,
    ws_ping_interval_ms: u64,
    max_topics: u64,
    max_subscriptions: u64,
    max_clients_per_subscription: u64,
    client_offset_ttl_ms: u64,
    max_request_timeout_ms: u64,
    max_pending_requests: u64,
    max_pending_request_bytes: u64,
    advertised_url: String,
    cors_allowed_origins: String,
    instance_id: String,
    heartbeat_ms: u64,
    instance_timeout_ms: u64,
    lite_topic_ttl_ms: u64,
    max_agents: u64,
    agent_heartbeat_timeout_ms: u64,
    max_sessions: u64,
    session_ttl_ms: u64,
    auto_create_topics: bool,
    admin_max_connections: u64,
    memory_limit_bytes: u64,
    auth: String,
    auth_tokens_file: String,
    jwt_jwks_file: String,
    jwt_audience: String,
    jwt_issuer: String,
    jwt_leeway_ms: u64,
    admin_token: String,
    audit_log: String,
    audit_max_per_second: u64,
    audit_max_bytes: u64,
    tls_cert: String,
    tls_key: String,
    tls_client_ca: String,
    /// `[[acl]]` tables: the config file's ACL rules (only in a file, not as flags).
    #[serde(default)]
    acl: Vec<AclRaw>,
}

/// One `[[acl]]` table.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct AclRaw {
    id: String,
    #[serde(flatten)]
    rule: crate::governance::acl::RuleSpec,
}

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
}

/// The value `v` names among `choices`, or an error listing them.
fn one_of<T: Copy>(key: &'static str, v: &str, choices: &[(&str, T)]) -> Result<T, ConfigError> {
    match choices.iter().find(|(name, _)| *name == v) {
        Some(&(_, t)) => Ok(t),
        None => {
            let names: Vec<&str> = choices.iter().map(|(n, _)| *n).collect();
            Err(ConfigError::Invalid { key, message: format!("{v:?} is not one of {}", names.join(", ")) })
        }
    }
}

fn range(key: &'static str, v: u64, lo: u64, hi: u64) -> Result<u64, ConfigError> {
    if (lo..=hi).contains(&v) {
        Ok(v)
    } else {
        Err(ConfigError::Invalid { key, message: format!("{v} is outside {lo}..={hi}") })
    }
}

impl KafkaRaw {
    fn settings(&self) -> Result<crate::storage::KafkaSettings, ConfigError> {
        let bad = |key: &'static str, message: String| ConfigError::Invalid { key, message };
        if self.brokers.trim().is_empty() {
            return Err(bad("kafka.brokers", "must name at least one HOST:PORT".into()));
        }
        one_of("kafka.acks", &self.acks, &[("all", ()), ("-1", ()), ("1", ()), ("0", ())])?;
        let codecs = [("none", ()), ("gzip", ()), ("snappy", ()), ("lz4", ()), ("zstd", ())];
        one_of("kafka.compression", &self.compression, &codecs)?;
        let replication_factor = range("kafka.replication_factor", self.replication_factor, 1, 32)? as i32;
        if !self.topic_prefix.bytes().all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b)) {
            return Err(bad("kafka.topic_prefix", "must be [A-Za-z0-9._-]*".into()));
        }
        let mut properties = Vec::new();
        for kv in self.properties.split(',').map(str::trim).filter(|kv| !kv.is_empty()) {
            let (k, v) =
                kv.split_once('=').ok_or_else(|| bad("kafka.properties", format!("{kv:?} is not KEY=VALUE")))?;
            properties.push((k.trim().to_owned(), v.trim().to_owned()));
        }
        Ok(crate::storage::KafkaSettings {
            brokers: self.brokers.clone(),
            replication_factor,
            acks: self.acks.clone(),
            compression: self.compression.clone(),
            topic_prefix: self.topic_prefix.clone(),
            properties,
            topic_refresh: std::time::Duration::from_millis(range(
                "kafka.topic_refresh_ms",
                self.topic_refresh_ms,
                100,
                3_600_000,
            )?),
        })
    }
}

/// The validated configuration the server runs with.
#[derive(Debug, Clone)]
pub struct Config {
    pub listen: SocketAddr,
    pub admin_listen: SocketAddr,
    pub shards: usize,
    pub data_dir: PathBuf,
    pub storage: StorageKind,
    pub durability: Durability,
    /// Size at which a partition's segment file is sealed.
    pub segment_bytes: u64,
    pub io_driver: IoDriver,
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

fn set(table: &mut toml::Table, key: &str, raw: &str, origin: &str) -> Result<(), ConfigError> {
    let value = match kind(key) {
        Kind::Str => toml::Value::String(raw.to_owned()),
        Kind::Int => toml::Value::Integer(raw.trim().parse().map_err(|_| ConfigError::Parse {
            origin: origin.to_owned(),
            message: format!("{key} must be a whole number, got {raw:?}"),
        })?),
        Kind::Bool => toml::Value::Boolean(match raw.trim() {
            "true" => true,
            "false" => false,
            _ => {
                return Err(ConfigError::Parse {
                    origin: origin.to_owned(),
                    message: format!("{key} must be true or false, got {raw:?}"),
                })
            }
        }),
    };
    match key.split_once('.') {
        Some((t, k)) => {
            let sub = table.entry(t).or_insert_with(|| toml::Value::Table(toml::Table::new()));
            if let toml::Value::Table(sub) = sub {
                sub.insert(k.to_owned(), value);
            }
        }
        None => {
            table.insert(key.to_owned(), value);
        }
    }
    Ok(())
}

fn merge(base: &mut toml::Table, over: toml::Table) {
    for (k, v) in over {
        match (base.get_mut(&k), v) {
            (Some(toml::Value::Table(b)), toml::Value::Table(o)) => merge(b, o),
            (_, v) => {
                base.insert(k, v);
            }
        }
    }
}

fn parse_toml(text: &str, origin: &str) -> Result<toml::Table, ConfigError> {
    text.parse::<toml::Table>().map_err(|e| ConfigError::Parse { origin: origin.to_owned(), message: e.to_string() })
}

impl RawConfig {
    /// Defaults, then `--config FILE`, then `EVMESH_*` from `env`, then the other flags in `args`.
    pub fn load(args: &[String], env: impl Iterator<Item = (String, String)>) -> Result<RawConfig, ConfigError> {
        let mut table = parse_toml(DEFAULT_TOML, "built-in defaults")?;
        let mut flags: Vec<(&'static str, String)> = Vec::new();
        let mut file: Option<String> = None;
        let mut it = args.iter();
        while let Some(arg) = it.next() {
            let (name, inline) = match arg.split_once('=') {
                Some((n, v)) => (n, Some(v.to_owned())),
                None => (arg.as_str(), None),
            };
            let Some(stripped) = name.strip_prefix("--") else { return Err(ConfigError::UnknownFlag(arg.clone())) };
            let mut value = || {
                inline.clone().or_else(|| it.next().cloned()).ok_or_else(|| ConfigError::MissingValue(name.to_owned()))
            };
            if stripped == "config" {
                file = Some(value()?);
                continue;
            }
            let key = KEYS
                .iter()
                .map(|(k, _)| *k)
                .find(|k| k.replace(['_', '.'], "-") == stripped)
                .ok_or_else(|| ConfigError::UnknownFlag(arg.clone()))?;
            flags.push((key, value()?));
        }
        let env: Vec<(String, String)> = env.filter(|(k, _)| k.starts_with("EVMESH_")).collect();
        if file.is_none() {
            file = env.iter().find(|(k, _)| k == "EVMESH_CONFIG").map(|(_, v)| v.clone());
        }
        if let Some(path) = &file {
            let text =
                std::fs::read_to_string(path).map_err(|source| ConfigError::Read { path: path.clone(), source })?;
            merge(&mut table, parse_toml(&text, path)?);
        }
        for (name, value) in &env {
            if name == "EVMESH_CONFIG" {
                continue;
            }
            let key = KEYS
                .iter()
                .map(|(k, _)| *k)
                .find(|k| format!("EVMESH_{}", k.replace('.', "_").to_ascii_uppercase()) == *name);
            match key {
                Some(key) => set(&mut table, key, value, name)?,
                // Not fatal: orchestrators inject variables with the service's name as prefix
                // (a Kubernetes service named evmesh yields EVMESH_PORT). Said loudly instead.
                None => eprintln!("evmesh: ignoring unknown variable {name} (not a configuration key)"),
            }
        }
        for (key, value) in flags {
            set(&mut table, key, &value, &format!("--{}", key.replace(['_', '.'], "-")))?;
        }
        toml::Value::Table(table)
            .try_into()
            .map_err(|e: toml::de::Error| ConfigError::Parse { origin: "configuration".into(), message: e.to_string() })
    }

    /// Checks every value and derives the rest.
    pub fn validate(self) -> Result<Config, ConfigError> {
        let addr = |key: &'static str, v: &str| {
            v.parse::<SocketAddr>().map_err(|e| ConfigError::Invalid { key, message: format!("{v:?}: {e}") })
        };
        let cpus = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
        let shards = if self.shards == 0 { cpus } else { range("shards", self.shards, 1, 1024)? as usize };
        let storage = match self.storage.as_str() {
            "embedded" => StorageKind::Embedded,
            "kafka" if cfg!(feature = "kafka") => StorageKind::Kafka(self.kafka.settings()?),
            "kafka" => {
                return Err(ConfigError::Invalid {
                    key: "storage",
                    message: "this evmesh was built without the kafka cargo feature".into(),
                })
            }
            other => {
                return Err(ConfigError::Invalid {
                    key: "storage",
                    message: format!("{other:?} is not embedded or kafka"),
                })
            }
        };
        let durability = one_of(
            "durability",
            &self.durability,
            &[("memory", Durability::Memory), ("os", Durability::Os), ("fsync", Durability::Fsync)],
        )?;
        let io_driver = one_of(
            "io_driver",
            &self.io_driver,
            &[("auto", IoDriver::Auto), ("uring", IoDriver::Uring), ("epoll", IoDriver::Epoll)],
        )?;
        let default_partitions = if self.default_partitions == 0 {
            shards as u32
        } else {
            range("default_partitions", self.default_partitions, 1, crate::model::MAX_PARTITIONS as u64)? as u32
        };
        let nonzero = |v: u64| (v > 0).then_some(v);
        let listen = addr("listen", &self.listen)?;
        let admin_listen = addr("admin_listen", &self.admin_listen)?;
        let data_dir = PathBuf::from(&self.data_dir);
        let auth = self.auth_config(&listen, &admin_listen, &data_dir)?;
        let tls = self.tls_files()?;
        Ok(Config {
            listen,
            admin_listen,
            shards,
            data_dir,
            storage,
            durability,
            segment_bytes: range("segment_bytes", self.segment_bytes, 64 << 10, 1 << 30)?,
            io_driver,
            default_partitions,
            limits: Limits {
                max_header_bytes: range("max_header_bytes", self.max_header_bytes, 256, 1 << 20)? as usize,
                max_headers: 100,
                max_body_bytes: range("max_body_bytes", self.max_body_bytes, 1, 1 << 30)? as usize,
            },
            max_connections: range("max_connections", self.max_connections, 1, 10_000_000)? as usize,
            header_read_timeout: Duration::from_millis(range(
                "header_read_timeout_ms",
                self.header_read_timeout_ms,
                1,
                3_600_000,
            )?),
            idle_timeout: Duration::from_millis(range("idle_timeout_ms", self.idle_timeout_ms, 1, 86_400_000)?),
            write_timeout: Duration::from_millis(range("write_timeout_ms", self.write_timeout_ms, 1, 3_600_000)?),
            mailbox_capacity: range("mailbox_capacity", self.mailbox_capacity, 2, 1 << 20)? as usize,
            retention_ms: nonzero(self.retention_ms),
            retention_bytes: nonzero(self.retention_bytes),
            retention_check: Duration::from_millis(range(
                "retention_check_ms",
                self.retention_check_ms,
                10,
                86_400_000,
            )?),
            ws_max_message: range("ws_max_message_bytes", self.ws_max_message_bytes, 125, 1 << 30)? as usize,
            ws_echo_endpoint: self.ws_echo_endpoint,
            session_window: range("session_window", self.session_window, 1, MAX_WINDOW as u64)? as u32,
            redelivery_backoff: Duration::from_millis(range(
                "redelivery_backoff_ms",
                self.redelivery_backoff_ms,
                1,
                600_000,
            )?),
            delivery_linger: Duration::from_micros(range("delivery_linger_us", self.delivery_linger_us, 0, 100_000)?),
            session_window_bytes: range("session_window_bytes", self.session_window_bytes, 1024, 1 << 30)? as usize,
            webhook_concurrency: range("webhook_concurrency", self.webhook_concurrency, 1, 1024)? as u32,
            webhook_timeout: Duration::from_millis(range("webhook_timeout_ms", self.webhook_timeout_ms, 100, 600_000)?),
            webhook_ca_file: (!self.webhook_ca_file.is_empty()).then(|| PathBuf::from(&self.webhook_ca_file)),
            ws_ping_interval: Duration::from_millis(range(
                "ws_ping_interval_ms",
                self.ws_ping_interval_ms,
                100,
                3_600_000,
            )?),
            max_topics: range("max_topics", self.max_topics, 1, 10_000_000)? as usize,
            max_subscriptions: range("max_subscriptions", self.max_subscriptions, 1, 10_000_000)? as usize,
            max_clients_per_subscription: range(
                "max_clients_per_subscription",
                self.max_clients_per_subscription,
                1,
                10_000_000,
            )? as usize,
            client_offset_ttl: nonzero(self.client_offset_ttl_ms).map(Duration::from_millis),
            max_request_timeout: Duration::from_millis(range(
                "max_request_timeout_ms",
                self.max_request_timeout_ms,
                1,
                3_600_000,
            )?),
            max_pending_requests: range("max_pending_requests", self.max_pending_requests, 1, 1 << 20)? as usize,
            max_pending_request_bytes: range(
                "max_pending_request_bytes",
                self.max_pending_request_bytes,
                1024,
                1 << 40,
            )? as usize,
            advertised_url: self.advertised_url()?,
            cors_allowed_origins: self.cors_allowed_origins()?,
            instance_id: self.instance_id()?,
            heartbeat: Duration::from_millis(range("heartbeat_ms", self.heartbeat_ms, 10, 60_000)?),
            instance_timeout: Duration::from_millis(range(
                "instance_timeout_ms",
                self.instance_timeout_ms,
                self.heartbeat_ms.saturating_mul(2).max(20),
                600_000,
            )?),
            lite_topic_ttl: Duration::from_millis(range(
                "lite_topic_ttl_ms",
                self.lite_topic_ttl_ms,
                100,
                365 * 86_400_000,
            )?),
            max_agents: range("max_agents", self.max_agents, 1, 10_000_000)? as usize,
            agent_heartbeat_timeout: Duration::from_millis(range(
                "agent_heartbeat_timeout_ms",
                self.agent_heartbeat_timeout_ms,
                100,
                86_400_000,
            )?),
            max_sessions: range("max_sessions", self.max_sessions, 1, 10_000_000)? as usize,
            session_ttl: Duration::from_millis(range("session_ttl_ms", self.session_ttl_ms, 100, 7 * 86_400_000)?),
            auto_create_topics: self.auto_create_topics,
            admin_max_connections: range("admin_max_connections", self.admin_max_connections, 1, 1_000_000)? as usize,
            memory_limit_bytes: match self.memory_limit_bytes {
                0 => crate::sys::default_memory_limit(),
                n => n,
            },
            auth,
            tls,
        })
    }

    /// `cors_allowed_origins`: `*`, or origins (`http[s]://host[:port]`, no path), comma-separated.
    fn cors_allowed_origins(&self) -> Result<Vec<String>, ConfigError> {
        let mut out = Vec::new();
        for o in self.cors_allowed_origins.split(',').map(str::trim).filter(|o| !o.is_empty()) {
            let origin = o.trim_end_matches('/');
            let rest = origin.strip_prefix("http://").or_else(|| origin.strip_prefix("https://"));
            let ok = origin == "*" || rest.is_some_and(|r| !r.is_empty() && !r.contains(['/', '?', '#', ' ']));
            if !ok {
                return Err(ConfigError::Invalid {
                    key: "cors_allowed_origins",
                    message: format!("{o:?}: each origin is * or http[s]://host[:port], without a path"),
                });
            }
            out.push(origin.to_ascii_lowercase());
        }
        Ok(out)
    }

    /// `advertised_url` checked (an `http://` or `https://` URL without a path); empty stays
    /// empty (the runtime fills in [`local_url`] once the listener is bound).
    fn advertised_url(&self) -> Result<String, ConfigError> {
        let url = self.advertised_url.trim().trim_end_matches('/');
        let rest = url.strip_prefix("http://").or_else(|| url.strip_prefix("https://"));
        match rest {
            _ if url.is_empty() => Ok(String::new()),
            Some(authority) if !authority.is_empty() && !authority.contains(['/', '?', '#', ' ']) => Ok(url.to_owned()),
            _ => Err(ConfigError::Invalid {
                key: "advertised_url",
                message: format!("{url:?} must be http://HOST[:PORT] or https://HOST[:PORT]"),
            }),
        }
    }

    /// `instance_id` checked: `[A-Za-z0-9._-]{1,64}`, or empty (the runtime's, kept in data_dir).
    fn instance_id(&self) -> Result<String, ConfigError> {
        let id = self.instance_id.trim();
        match crate::cluster::valid_instance_id(id) || id.is_empty() {
            true => Ok(id.to_owned()),
            false => Err(ConfigError::Invalid {
                key: "instance_id",
                message: format!("{id:?} must be [A-Za-z0-9._-]{{1,64}}"),
            }),
        }
    }

    /// The governance keys, checked against each other and against the listeners.
    fn auth_config(
        &self,
        listen: &SocketAddr,
        admin_listen: &SocketAddr,
        data_dir: &std::path::Path,
    ) -> Result<crate::governance::AuthConfig, ConfigError> {
        use crate::governance::AuthMode;
        let bad = |key: &'static str, message: String| ConfigError::Invalid { key, message };
        let mode = one_of(
            "auth",
            &self.auth,
            &[("none", AuthMode::None), ("token", AuthMode::Token), ("jwt", AuthMode::Jwt)],
        )?;
        if mode == AuthMode::None && !(listen.ip().is_loopback() && admin_listen.ip().is_loopback()) {
            return Err(bad(
                "auth",
                format!(
                    "auth = none serves anyone who can connect: it is allowed only while listen ({listen}) and \
                     admin_listen ({admin_listen}) are loopback; set auth = token or jwt"
                ),
            ));
        }
        let path = |v: &str| (!v.is_empty()).then(|| PathBuf::from(v));
        let text = |v: &str| (!v.is_empty()).then(|| v.to_owned());
        let tokens_file = path(&self.auth_tokens_file);
        let jwks_file = path(&self.jwt_jwks_file);
        if mode == AuthMode::Token && tokens_file.is_none() {
            return Err(bad("auth_tokens_file", "auth = token needs the tokens file".into()));
        }
        if mode == AuthMode::Jwt && jwks_file.is_none() {
            return Err(bad("jwt_jwks_file", "auth = jwt needs the JWKS file".into()));
        }
        if !self.admin_token.is_empty() && self.admin_token.len() < 16 {
            return Err(bad("admin_token", "must be at least 16 characters".into()));
        }
        let mut acl = Vec::new();
        for r in &self.acl {
            crate::governance::acl::Rule::new(&r.id, r.rule.clone())
                .map_err(|e| bad("acl", format!("rule {:?}: {e}", r.id)))?;
            if acl.iter().any(|(id, _)| *id == r.id) {
                return Err(bad("acl", format!("rule id {:?} appears twice", r.id)));
            }
            acl.push((r.id.clone(), r.rule.clone()));
        }
        Ok(crate::governance::AuthConfig {
            mode,
            tokens_file,
            jwks_file,
            audience: text(&self.jwt_audience),
            issuer: text(&self.jwt_issuer),
            leeway_ms: range("jwt_leeway_ms", self.jwt_leeway_ms, 0, 86_400_000)?,
            admin_token: text(&self.admin_token),
            acl,
            audit_log: path(&self.audit_log).unwrap_or_else(|| data_dir.join("audit.log")),
            audit_max_per_second: range("audit_max_per_second", self.audit_max_per_second, 1, 1_000_000)? as u32,
            audit_max_bytes: range("audit_max_bytes", self.audit_max_bytes, 4096, 1 << 40)?,
        })
    }

    /// The TLS files, both or neither of `tls_cert` and `tls_key`; `tls_client_ca` only with them.
    /// (Whether they load is known at start, where the error names the file.)
    fn tls_files(&self) -> Result<Option<crate::server::tls::TlsFiles>, ConfigError> {
        let bad = |key: &'static str, message: &str| ConfigError::Invalid { key, message: message.to_owned() };
        match (self.tls_cert.is_empty(), self.tls_key.is_empty()) {
            (true, true) if !self.tls_client_ca.is_empty() => {
                Err(bad("tls_client_ca", "mutual TLS needs tls_cert and tls_key too"))
            }
            (true, true) => Ok(None),
            (false, true) => Err(bad("tls_key", "tls_cert needs its private key")),
            (true, false) => Err(bad("tls_cert", "tls_key needs its certificate")),
            (false, false) => Ok(Some(crate::server::tls::TlsFiles {
                cert: PathBuf::from(&self.tls_cert),
                key: PathBuf::from(&self.tls_key),
                client_ca: (!self.tls_client_ca.is_empty()).then(|| PathBuf::from(&self.tls_client_ca)),
            })),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(args: &[&str], env: &[(&str, &str)]) -> Result<Config, ConfigError> {
        let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        RawConfig::load(&args, env.iter().map(|(k, v)| (k.to_string(), v.to_string())))?.validate()
    }

    #[test]
    fn advertised_url_is_a_bare_http_url_or_empty() {
        assert_eq!(load(&[], &[]).unwrap().advertised_url, "", "filled in from the bound listener");
        let c = load(&["--advertised-url", "https://broker.example:8443/"], &[]).unwrap();
        assert_eq!(c.advertised_url, "https://broker.example:8443");
        for bad in ["broker:8080", "http://", "http://h/path", "ftp://h"] {
            assert!(load(&["--advertised-url", bad], &[]).is_err(), "{bad}");
        }
        assert_eq!(local_url("0.0.0.0:8080".parse().unwrap(), false), "http://127.0.0.1:8080");
        assert_eq!(local_url("[::]:8443".parse().unwrap(), true), "https://[::1]:8443");
    }

    #[test]
    fn instance_ids_and_the_heartbeat_timeout_are_checked() {
        let c = load(&[], &[]).unwrap();
        assert_eq!((c.instance_id.as_str(), c.heartbeat, c.instance_timeout), ("", ms(1000), ms(3000)));
        assert_eq!(load(&["--instance-id", "eu-1.a_2"], &[]).unwrap().instance_id, "eu-1.a_2");
        let key_of = |args: &[&str]| match load(args, &[]) {
            Err(ConfigError::Invalid { key, .. }) => key,
            other => panic!("{other:?}"),
        };
        assert_eq!(key_of(&["--instance-id", "a b"]), "instance_id");
        assert_eq!(key_of(&["--instance-id", &"x".repeat(65)]), "instance_id");
        // A timeout under two heartbeats would count a live instance dead between two of them.
        assert_eq!(key_of(&["--heartbeat-ms", "1000", "--instance-timeout-ms", "1500"]), "instance_timeout_ms");
        assert!(load(&["--heartbeat-ms", "100", "--instance-timeout-ms", "200"], &[]).is_ok());
    }

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn tls_needs_both_files_and_mutual_tls_needs_tls() {
        let key_of = |args: &[&str]| match load(args, &[]) {
            Err(ConfigError::Invalid { key, .. }) => key,
            other => panic!("{other:?}"),
        };
        assert_eq!(key_of(&["--tls-cert", "c.pem"]), "tls_key");
        assert_eq!(key_of(&["--tls-key", "k.pem"]), "tls_cert");
        assert_eq!(key_of(&["--tls-client-ca", "ca.pem"]), "tls_client_ca");
        let c = load(&["--tls-cert", "c.pem", "--tls-key", "k.pem", "--tls-client-ca", "ca.pem"], &[]).unwrap();
        let files = c.tls.unwrap();
        assert_eq!(
            (files.cert.to_str(), files.client_ca.as_deref().and_then(|p| p.to_str())),
            (Some("c.pem"), Some("ca.pem"))
        );
        assert!(load(&[], &[]).unwrap().tls.is_none());
    }

    #[test]
    fn defaults_match_the_spec() {
        let c = load(&[], &[]).unwrap();
        assert_eq!(c.listen.to_string(), "127.0.0.1:8080");
        assert_eq!(c.admin_listen.to_string(), "127.0.0.1:8081");
        assert_eq!(c.durability, Durability::Os);
        assert_eq!(c.io_driver, IoDriver::Auto);
        assert_eq!(c.storage, StorageKind::Embedded);
        assert_eq!(c.data_dir, PathBuf::from("./data"));
        assert_eq!(c.limits.max_body_bytes, 1 << 20);
        assert_eq!(c.limits.max_header_bytes, 16 << 10);
        assert_eq!(c.header_read_timeout, Duration::from_secs(10));
        assert_eq!(c.write_timeout, Duration::from_secs(10));
        assert_eq!(c.shards, std::thread::available_parallelism().unwrap().get());
    }

    #[test]
    fn flags_beat_env_beat_file() {
        let dir = std::env::temp_dir().join(format!("evmesh-cfg-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("e.toml");
        std::fs::write(&file, "shards = 3\ndurability = \"fsync\"\nio_driver = \"epoll\"\n").unwrap();
        let f = file.to_str().unwrap();
        let c =
            load(&["--config", f, "--shards=5"], &[("EVMESH_SHARDS", "4"), ("EVMESH_DURABILITY", "memory")]).unwrap();
        assert_eq!(c.shards, 5);
        assert_eq!(c.durability, Durability::Memory);
        assert_eq!(c.io_driver, IoDriver::Epoll);
        let c = load(&["--config", f], &[("EVMESH_SHARDS", "4")]).unwrap();
        assert_eq!(c.shards, 4);
        let c = load(&["--write-timeout-ms", "250"], &[]).unwrap();
        assert_eq!(c.write_timeout, Duration::from_millis(250));
        let c = load(&[], &[("EVMESH_WRITE_TIMEOUT_MS", "750")]).unwrap();
        assert_eq!(c.write_timeout, Duration::from_millis(750));
    }

    #[test]
    fn bad_values_are_named() {
        let err = |args: &[&str], env: &[(&str, &str)]| load(args, env).unwrap_err().to_string();
        assert!(err(&["--durability", "disk"], &[]).contains("durability"));
        assert!(err(&["--write-timeout-ms", "0"], &[]).contains("write_timeout_ms"));
        assert!(err(&["--listen", "nowhere"], &[]).contains("listen"));
        assert!(err(&["--bogus", "1"], &[]).contains("--bogus"));
        assert!(err(&["--shards"], &[]).contains("needs a value"));
        assert!(err(&[], &[("EVMESH_SHARDS", "many")]).contains("whole number"));
        assert!(
            load(&[], &[("EVMESH_PORT", "tcp://10.0.0.1:8080")]).is_ok(),
            "unknown variables are only warned about"
        );
        assert!(err(&["--storage", "kafka", "--kafka-acks", "some"], &[]).contains("kafka.acks"));
        assert!(err(&["--storage", "kafka", "--kafka-properties", "nokey"], &[]).contains("KEY=VALUE"));
        assert!(err(&["--storage", "kafka", "--kafka-topic-prefix", "a/b"], &[]).contains("kafka.topic_prefix"));
        let c = load(
            &[
                "--storage",
                "kafka",
                "--kafka-brokers",
                "k1:9092,k2:9092",
                "--kafka-properties",
                "security.protocol=ssl, a=b",
            ],
            &[],
        )
        .unwrap();
        match c.storage {
            StorageKind::Kafka(k) => {
                assert_eq!((k.brokers.as_str(), k.acks.as_str(), k.replication_factor), ("k1:9092,k2:9092", "all", 1));
                assert_eq!(k.properties, [("security.protocol".into(), "ssl".into()), ("a".into(), "b".into())]);
            }
            other => panic!("{other:?}"),
        }
    }
}
