//! The process's flags (SPEC, "Connectors": also `EVMESH_CONNECT_*` variables) and the
//! connectors' TOML files, one per connector in `--config-dir`, checked whole before anything
//! starts: a mistake is a clear error naming the file, never a half-started runtime.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde::Deserialize;

/// `evmesh-connect`'s flags.
#[derive(Debug, Clone, clap::Parser)]
#[command(name = "evmesh-connect", version, about = "The evmesh connector runtime")]
pub struct Args {
    /// The evmesh broker's traffic URL.
    #[arg(long, env = "EVMESH_CONNECT_EVMESH", default_value = "http://127.0.0.1:8080")]
    pub evmesh: String,
    /// A bearer token for evmesh (with `auth` on).
    #[arg(long, env = "EVMESH_CONNECT_TOKEN")]
    pub token: Option<String>,
    /// The directory of connector files (`*.toml`, one connector each).
    #[arg(long, env = "EVMESH_CONNECT_CONFIG_DIR")]
    pub config_dir: PathBuf,
    /// Where the connectors' offsets are kept (RocksDB).
    #[arg(long, env = "EVMESH_CONNECT_DATA_DIR")]
    pub data_dir: PathBuf,
    /// The admin API's address.
    #[arg(long, env = "EVMESH_CONNECT_ADMIN_LISTEN", default_value = "127.0.0.1:8090")]
    pub admin_listen: SocketAddr,
    /// evmesh's admin listener's URL (optional): a sink's status then has its lag.
    #[arg(long, env = "EVMESH_CONNECT_EVMESH_ADMIN")]
    pub evmesh_admin: Option<String>,
}

/// Whether a connector reads into evmesh or writes out of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    Source,
    Sink,
}

/// One connector file.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConnectorConfig {
    /// Unique among the files: the offsets and the admin API name it.
    pub name: String,
    pub kind: Kind,
    /// Which connector (`file`, ...).
    pub connector: String,
    /// A source publishes here; a sink's subscription is of this topic.
    pub topic: String,
    /// A sink consumes this subscription (created if absent, from the earliest event).
    #[serde(default)]
    pub subscription: Option<String>,
    /// Where a sink sends the events it refuses (default `<topic>.dlq`).
    #[serde(default)]
    pub dlq_topic: Option<String>,
    /// Records per batch, at most (default 100, 1..=1000).
    #[serde(default = "default_batch")]
    pub batch: usize,
    /// The connector's own keys.
    #[serde(default)]
    pub config: toml::Table,
}

fn default_batch() -> usize {
    100
}

/// The connector names a file may give (`crate::connectors::build` makes each).
pub const CONNECTORS: &[&str] = &["file", "http", "kafka", "mqtt", "postgres", "redis"];

/// Batches are at most this many records (an evmesh batch publish takes at most 1,000).
pub const MAX_BATCH: usize = 1000;

impl ConnectorConfig {
    /// The dead-letter topic.
    pub fn dlq(&self) -> String {
        self.dlq_topic.clone().unwrap_or_else(|| format!("{}.dlq", self.topic))
    }
}

/// Why the connector files cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("{}: {message}", path.display())]
    File { path: PathBuf, message: String },
    #[error("{}: {error}", path.display())]
    Dir { error: std::io::Error, path: PathBuf },
    #[error("connector {name}: {message}")]
    Connector { name: String, message: String },
}

/// Names, topics and subscriptions: `[A-Za-z0-9._-]{1,249}` (evmesh's topic names).
pub fn valid_name(s: &str) -> bool {
    (1..=249).contains(&s.len()) && s.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

/// Reads every `*.toml` in `dir`, in name order; checks each and that names are unique.
pub fn load_dir(dir: &Path) -> Result<Vec<ConnectorConfig>, ConfigError> {
    let entries = std::fs::read_dir(dir).map_err(|error| ConfigError::Dir { error, path: dir.to_owned() })?;
    let mut paths: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "toml") && p.is_file())
        .collect();
    paths.sort();
    let mut seen: BTreeMap<String, PathBuf> = BTreeMap::new();
    let mut out = Vec::new();
    for path in paths {
        let fail = |message: String| ConfigError::File { path: path.clone(), message };
        let text = std::fs::read_to_string(&path).map_err(|e| fail(e.to_string()))?;
        let c = parse(&text).map_err(fail)?;
        if let Some(first) = seen.insert(c.name.clone(), path.clone()) {
            return Err(fail(format!("name {:?} is taken by {} already", c.name, first.display())));
        }
        out.push(c);
    }
    Ok(out)
}

/// One connector file's text, checked.
pub fn parse(text: &str) -> Result<ConnectorConfig, String> {
    let c: ConnectorConfig = toml::from_str(text).map_err(|e| e.to_string())?;
    if !valid_name(&c.name) {
        return Err(format!("name {:?}: 1 to 249 of A-Z a-z 0-9 . _ -", c.name));
    }
    if !valid_name(&c.topic) || c.topic.starts_with("__evmesh.") {
        return Err(format!("topic {:?} is not a topic name evmesh takes", c.topic));
    }
    if !(1..=MAX_BATCH).contains(&c.batch) {
        return Err(format!("batch {}: 1 to {MAX_BATCH}", c.batch));
    }
    match (c.kind, &c.subscription) {
        (Kind::Sink, None) => return Err("a sink names its subscription".into()),
        (Kind::Sink, Some(s)) if !valid_name(s) => return Err(format!("subscription {s:?} is not a name")),
        (Kind::Source, Some(_)) => return Err("a source has no subscription (it publishes to topic)".into()),
        _ => {}
    }
    if let Some(d) = &c.dlq_topic {
        if !valid_name(d) || c.kind == Kind::Source {
            return Err(format!("dlq_topic {d:?}: a topic name, for a sink"));
        }
    }
    if !CONNECTORS.contains(&c.connector.as_str()) {
        return Err(format!("connector {:?}: one of {}", c.connector, CONNECTORS.join(", ")));
    }
    Ok(c)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_source_file_as_the_spec_writes_it_is_taken() {
        let c = parse(
            r#"
            name = "orders-in"
            kind = "source"
            connector = "file"
            topic = "orders"
            [config]
            path = "/var/log/orders.jsonl"
            "#,
        )
        .unwrap();
        assert_eq!((c.name.as_str(), c.kind, c.topic.as_str(), c.batch), ("orders-in", Kind::Source, "orders", 100));
        assert_eq!(c.config["path"].as_str(), Some("/var/log/orders.jsonl"));
    }

    #[test]
    fn mistakes_are_named() {
        let base = "name = \"a\"\nconnector = \"file\"\ntopic = \"t\"\n";
        let cases = [
            ("kind = \"sink\"\n", "names its subscription"),
            ("kind = \"source\"\nsubscription = \"s\"\n", "has no subscription"),
            ("kind = \"both\"\n", "unknown variant"),
            ("kind = \"source\"\nbatch = 0\n", "batch 0"),
            ("kind = \"source\"\ntypo = 1\n", "unknown field"),
            ("kind = \"sink\"\nsubscription = \"s s\"\n", "not a name"),
        ];
        for (extra, why) in cases {
            let e = parse(&format!("{base}{extra}")).unwrap_err();
            assert!(e.contains(why), "{extra}: {e}");
        }
        let e = parse("name = \"a\"\nkind = \"source\"\nconnector = \"ftp\"\ntopic = \"t\"\n").unwrap_err();
        assert!(e.contains("one of file"), "{e}");
        let e =
            parse("name = \"a\"\nkind = \"source\"\nconnector = \"file\"\ntopic = \"__evmesh.homes\"\n").unwrap_err();
        assert!(e.contains("not a topic name"), "{e}");
    }

    #[test]
    fn two_files_with_one_name_are_refused_naming_both() {
        let dir = std::env::temp_dir().join(format!("evmesh-connect-cfg-{}", fastrand::u64(..)));
        std::fs::create_dir_all(&dir).unwrap();
        let file = "name = \"same\"\nkind = \"source\"\nconnector = \"file\"\ntopic = \"t\"\n";
        std::fs::write(dir.join("a.toml"), file).unwrap();
        std::fs::write(dir.join("b.toml"), file).unwrap();
        std::fs::write(dir.join("notes.txt"), "ignored").unwrap();
        let e = load_dir(&dir).unwrap_err().to_string();
        assert!(e.contains("b.toml") && e.contains("a.toml"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
