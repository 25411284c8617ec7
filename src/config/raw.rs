//! The configuration as the operator wrote it: [`RawConfig`], merged from the built-in
//! defaults, the `--config` file (or `EVMESH_CONFIG`), `EVMESH_*` variables and flags, later
//! winning. Nothing here is checked beyond its type: `validate.rs` makes a `Config` of it.

use serde::Deserialize;

use super::error::ConfigError;
use super::keys::{kind, Kind, DEFAULT_TOML, KEYS};

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct KafkaRaw {
    pub(super) brokers: String,
    pub(super) replication_factor: u64,
    pub(super) acks: String,
    pub(super) compression: String,
    pub(super) topic_prefix: String,
    pub(super) properties: String,
    pub(super) topic_refresh_ms: u64,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RocketMqRaw {
    pub(super) namesrv: String,
    pub(super) topic_prefix: String,
    pub(super) send_timeout_ms: u64,
    pub(super) topic_refresh_ms: u64,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct TierRaw {
    pub(super) s3: S3Raw,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct S3Raw {
    pub(super) bucket: String,
    pub(super) endpoint: String,
    pub(super) region: String,
    pub(super) prefix: String,
    pub(super) upload_interval_ms: u64,
    pub(super) cache_bytes: u64,
}

/// What the operator wrote, merged from all sources; see `evmesh.toml` for each key.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawConfig {
    pub(super) listen: String,
    pub(super) admin_listen: String,
    pub(super) tcp_listen: String,
    pub(super) shards: u64,
    pub(super) data_dir: String,
    pub(super) storage: String,
    pub(super) segment_bytes: u64,
    pub(super) kafka: KafkaRaw,
    pub(super) rocketmq: RocketMqRaw,
    pub(super) tier: TierRaw,
    pub(super) local_retention_bytes: u64,
    pub(super) local_retention_ms: u64,
    pub(super) durability: String,
    pub(super) io_driver: String,
    pub(super) direct_io: bool,
    pub(super) default_partitions: u64,
    pub(super) max_body_bytes: u64,
    pub(super) max_header_bytes: u64,
    pub(super) max_connections: u64,
    pub(super) header_read_timeout_ms: u64,
    pub(super) idle_timeout_ms: u64,
    pub(super) write_timeout_ms: u64,
    pub(super) mailbox_capacity: u64,
    pub(super) retention_ms: u64,
    pub(super) retention_bytes: u64,
    pub(super) retention_check_ms: u64,
    pub(super) ws_max_message_bytes: u64,
    pub(super) ws_echo_endpoint: bool,
    pub(super) session_window: u64,
    pub(super) redelivery_backoff_ms: u64,
    pub(super) delivery_linger_us: u64,
    pub(super) session_window_bytes: u64,
    pub(super) webhook_concurrency: u64,
    pub(super) webhook_timeout_ms: u64,
    pub(super) webhook_ca_file: String,
    pub(super) ws_ping_interval_ms: u64,
    pub(super) max_topics: u64,
    pub(super) max_subscriptions: u64,
    pub(super) max_clients_per_subscription: u64,
    pub(super) client_offset_ttl_ms: u64,
    pub(super) max_request_timeout_ms: u64,
    pub(super) max_pending_requests: u64,
    pub(super) max_pending_request_bytes: u64,
    pub(super) advertised_url: String,
    pub(super) cors_allowed_origins: String,
    pub(super) instance_id: String,
    pub(super) heartbeat_ms: u64,
    pub(super) instance_timeout_ms: u64,
    pub(super) lite_topic_ttl_ms: u64,
    pub(super) max_agents: u64,
    pub(super) agent_heartbeat_timeout_ms: u64,
    pub(super) max_sessions: u64,
    pub(super) session_ttl_ms: u64,
    pub(super) auto_create_topics: bool,
    pub(super) admin_max_connections: u64,
    pub(super) memory_limit_bytes: u64,
    pub(super) auth: String,
    pub(super) auth_tokens_file: String,
    pub(super) jwt_jwks_file: String,
    pub(super) jwt_audience: String,
    pub(super) jwt_issuer: String,
    pub(super) jwt_leeway_ms: u64,
    pub(super) admin_token: String,
    pub(super) audit_log: String,
    pub(super) audit_max_per_second: u64,
    pub(super) audit_max_bytes: u64,
    pub(super) tls_cert: String,
    pub(super) tls_key: String,
    pub(super) tls_client_ca: String,
    pub(super) otlp_endpoint: String,
    pub(super) otlp_protocol: String,
    pub(super) trace_sample_ratio: f64,
    pub(super) log_format: String,
    pub(super) log_level: String,
    /// `[[acl]]` tables: the config file's ACL rules (only in a file, not as flags).
    #[serde(default)]
    pub(super) acl: Vec<AclRaw>,
    /// `EVMESH_*` variables that name no key: said in the log once it is set up (not fatal:
    /// orchestrators inject variables with the service's name as prefix, a Kubernetes service
    /// named evmesh yields EVMESH_PORT).
    #[serde(skip)]
    pub unknown_variables: Vec<String>,
}

/// One `[[acl]]` table.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct AclRaw {
    pub(super) id: String,
    #[serde(flatten)]
    pub(super) rule: crate::governance::acl::RuleSpec,
}

fn set(table: &mut toml::Table, key: &str, raw: &str, origin: &str) -> Result<(), ConfigError> {
    let value = match kind(key) {
        Kind::Str => toml::Value::String(raw.to_owned()),
        Kind::Int => toml::Value::Integer(raw.trim().parse().map_err(|_| ConfigError::Parse {
            origin: origin.to_owned(),
            message: format!("{key} must be a whole number, got {raw:?}"),
        })?),
        Kind::Float => toml::Value::Float(raw.trim().parse().map_err(|_| ConfigError::Parse {
            origin: origin.to_owned(),
            message: format!("{key} must be a number, got {raw:?}"),
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
    // A dotted key names tables within tables (`tier.s3.bucket`).
    let mut table = table;
    let mut parts = key.split('.').peekable();
    while let Some(part) = parts.next() {
        if parts.peek().is_none() {
            table.insert(part.to_owned(), value);
            break;
        }
        let sub = table.entry(part).or_insert_with(|| toml::Value::Table(toml::Table::new()));
        let toml::Value::Table(sub) = sub else { break };
        table = sub;
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
        let mut unknown = Vec::new();
        for (name, value) in &env {
            // Read elsewhere: the file's name (above) and the heap (`sys::Heap`).
            if name == "EVMESH_CONFIG" || name.as_bytes() == crate::sys::HEAP_VARIABLE.to_bytes() {
                continue;
            }
            let key = KEYS
                .iter()
                .map(|(k, _)| *k)
                .find(|k| format!("EVMESH_{}", k.replace('.', "_").to_ascii_uppercase()) == *name);
            match key {
                Some(key) => set(&mut table, key, value, name)?,
                None => unknown.push(name.clone()),
            }
        }
        for (key, value) in flags {
            set(&mut table, key, &value, &format!("--{}", key.replace(['_', '.'], "-")))?;
        }
        let mut raw: RawConfig = toml::Value::Table(table).try_into().map_err(|e: toml::de::Error| {
            ConfigError::Parse { origin: "configuration".into(), message: e.to_string() }
        })?;
        raw.unknown_variables = unknown;
        Ok(raw)
    }
}
