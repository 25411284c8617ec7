//! Validation: [`RawConfig::validate`] checks every value the operator wrote (ranges, choices,
//! addresses, URLs, the keys that go together) and derives the rest, making a [`Config`].

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use super::error::ConfigError;
use super::raw::{KafkaRaw, RawConfig, RocketMqRaw, S3Raw};
use super::settings::{Config, IoDriver, OtlpProtocol, StorageKind, MAX_WINDOW};
use crate::http::Limits;
use crate::log::{Filter, Format};
use crate::storage::Durability;

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

impl RocketMqRaw {
    fn settings(&self) -> Result<crate::storage::RocketMqSettings, ConfigError> {
        let bad = |key: &'static str, message: String| ConfigError::Invalid { key, message };
        let servers: Vec<&str> = self.namesrv.split(';').map(str::trim).filter(|s| !s.is_empty()).collect();
        if servers.is_empty()
            || servers.iter().any(|s| s.rsplit_once(':').is_none_or(|(h, p)| h.is_empty() || p.parse::<u16>().is_err()))
        {
            return Err(bad("rocketmq.namesrv", format!("{:?} is not HOST:PORT[;HOST:PORT...]", self.namesrv)));
        }
        // RocketMQ's names are [%|A-Za-z0-9_-], at most 127 characters (evmesh's dots become |).
        if self.topic_prefix.len() > 64
            || !self.topic_prefix.bytes().all(|b| b.is_ascii_alphanumeric() || b"_-".contains(&b))
        {
            return Err(bad("rocketmq.topic_prefix", "must be [A-Za-z0-9_-]*, at most 64 characters".into()));
        }
        Ok(crate::storage::RocketMqSettings {
            namesrv: servers.join(";"),
            topic_prefix: self.topic_prefix.clone(),
            send_timeout: std::time::Duration::from_millis(range(
                "rocketmq.send_timeout_ms",
                self.send_timeout_ms,
                100,
                60_000,
            )?),
            topic_refresh: std::time::Duration::from_millis(range(
                "rocketmq.topic_refresh_ms",
                self.topic_refresh_ms,
                100,
                3_600_000,
            )?),
        })
    }
}

impl S3Raw {
    /// `tier.s3.*` and the local retention: `None` when no bucket is named.
    fn settings(
        &self,
        storage: &StorageKind,
        (local_bytes, local_ms): (u64, u64),
        segment_bytes: u64,
    ) -> Result<Option<crate::storage::tier::TierSettings>, ConfigError> {
        let bad = |key: &'static str, message: String| ConfigError::Invalid { key, message };
        let bucket = self.bucket.trim();
        if bucket.is_empty() {
            for (key, v) in [("local_retention_bytes", local_bytes), ("local_retention_ms", local_ms)] {
                if v > 0 {
                    return Err(bad(
                        key,
                        "deletes local copies of what is in the bucket: it needs tier.s3.bucket".into(),
                    ));
                }
            }
            return Ok(None);
        }
        if storage.remote() {
            let why = format!("tiering is the embedded log's; storage = {} keeps its log there", storage.name());
            return Err(bad("tier.s3.bucket", why));
        }
        // S3's bucket names: 3-63 of [a-z0-9.-].
        let name_ok = (3..=63).contains(&bucket.len())
            && bucket.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'.' || b == b'-');
        if !name_ok {
            return Err(bad("tier.s3.bucket", format!("{bucket:?} is not an S3 bucket name (3-63 of a-z 0-9 . -)")));
        }
        let endpoint = self.endpoint.trim().trim_end_matches('/');
        if !(endpoint.is_empty() || endpoint.starts_with("http://") || endpoint.starts_with("https://")) {
            return Err(bad("tier.s3.endpoint", format!("{endpoint:?} is not an http:// or https:// URL")));
        }
        let prefix = self.prefix.trim_matches('/');
        if !prefix.is_empty() && prefix.split('/').any(|p| p.is_empty() || p == "." || p == "..") {
            return Err(bad("tier.s3.prefix", format!("{prefix:?} has an empty, . or .. part")));
        }
        if self.region.trim().is_empty() {
            return Err(bad("tier.s3.region", "must not be empty".into()));
        }
        Ok(Some(crate::storage::tier::TierSettings {
            bucket: bucket.to_owned(),
            endpoint: endpoint.to_owned(),
            region: self.region.trim().to_owned(),
            prefix: prefix.to_owned(),
            upload_interval: Duration::from_millis(range(
                "tier.s3.upload_interval_ms",
                self.upload_interval_ms,
                10,
                86_400_000,
            )?),
            // Room for a segment's index (1/256 of it) and a read with its read-ahead.
            cache_bytes: range("tier.s3.cache_bytes", self.cache_bytes, (16 << 20).max(segment_bytes / 64), 1 << 40)?,
            local_retention_bytes: (local_bytes > 0).then_some(local_bytes),
            local_retention_ms: (local_ms > 0).then_some(local_ms),
        }))
    }
}

impl RawConfig {
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
            "rocketmq" if cfg!(feature = "rocketmq") => StorageKind::RocketMq(self.rocketmq.settings()?),
            built @ ("kafka" | "rocketmq") => {
                return Err(ConfigError::Invalid {
                    key: "storage",
                    message: format!(
                        "this evmesh was built without the {built} cargo feature (cargo build --features {built})"
                    ),
                })
            }
            other => {
                return Err(ConfigError::Invalid {
                    key: "storage",
                    message: format!("{other:?} is not embedded, kafka or rocketmq"),
                })
            }
        };
        let local = (self.local_retention_bytes, self.local_retention_ms);
        let tier = self.tier.s3.settings(&storage, local, self.segment_bytes)?;
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
        let tcp_listen = match self.tcp_listen.trim() {
            "" => None,
            v => Some(addr("tcp_listen", v)?),
        };
        let data_dir = PathBuf::from(&self.data_dir);
        let auth = self.auth_config((&listen, &admin_listen, tcp_listen.as_ref()), &data_dir)?;
        let tls = self.tls_files()?;
        Ok(Config {
            listen,
            admin_listen,
            tcp_listen,
            shards,
            data_dir,
            storage,
            tier,
            durability,
            segment_bytes: range("segment_bytes", self.segment_bytes, 64 << 10, 1 << 30)?,
            io_driver,
            direct_io: self.direct_io,
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
            otlp_endpoint: self.otlp_endpoint()?,
            otlp_protocol: one_of(
                "otlp_protocol",
                &self.otlp_protocol,
                &[("http/protobuf", OtlpProtocol::Protobuf), ("http/json", OtlpProtocol::Json)],
            )?,
            trace_sample_ratio: match self.trace_sample_ratio {
                r if (0.0..=1.0).contains(&r) => r,
                r => {
                    return Err(ConfigError::Invalid {
                        key: "trace_sample_ratio",
                        message: format!("{r} is outside 0.0..=1.0"),
                    })
                }
            },
            log_format: one_of("log_format", &self.log_format, &[("text", Format::Text), ("json", Format::Json)])?,
            log_level: Filter::parse(&self.log_level)
                .map_err(|message| ConfigError::Invalid { key: "log_level", message })?,
        })
    }

    /// `otlp_endpoint` checked (an `http://` or `https://` base URL); the traces' URL is it
    /// with `/v1/traces` after its path, as OpenTelemetry's exporters do.
    fn otlp_endpoint(&self) -> Result<Option<crate::server::client::Url>, ConfigError> {
        let base = self.otlp_endpoint.trim().trim_end_matches('/');
        if base.is_empty() {
            return Ok(None);
        }
        let bad = |message: String| ConfigError::Invalid { key: "otlp_endpoint", message };
        if base.contains(['?', '#']) {
            return Err(bad(format!("{base:?}: a base URL has no query or fragment")));
        }
        crate::server::client::Url::parse(&format!("{base}/v1/traces")).map(Some).map_err(bad)
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
    /// empty (the runtime fills in [`local_url`](super::settings::local_url) once the listener
    /// is bound).
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
        (listen, admin_listen, tcp_listen): (&SocketAddr, &SocketAddr, Option<&SocketAddr>),
        data_dir: &std::path::Path,
    ) -> Result<crate::governance::AuthConfig, ConfigError> {
        use crate::governance::AuthMode;
        let bad = |key: &'static str, message: String| ConfigError::Invalid { key, message };
        let mode = one_of(
            "auth",
            &self.auth,
            &[("none", AuthMode::None), ("token", AuthMode::Token), ("jwt", AuthMode::Jwt)],
        )?;
        if mode == AuthMode::None && tcp_listen.is_some_and(|t| !t.ip().is_loopback()) {
            return Err(bad(
                "auth",
                format!(
                    "auth = none serves anyone who can connect: tcp_listen ({}) must be loopback too; set auth = \
                     token or jwt (classic TCP clients then send the token as the user agent's password)",
                    tcp_listen.expect("checked")
                ),
            ));
        }
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
