//! The connectors this runtime has, by the name a connector file gives (`connector = "..."`).

pub mod binding;
pub mod file;
pub mod http;
pub mod kafka;
pub mod mqtt;
pub mod postgres;
pub mod redis;

use crate::config::{ConnectorConfig, Kind};
use crate::spi::{ConnectError, Sink, Source};
use crate::store::Store;

/// What a connector file makes.
pub enum Built {
    Source(Box<dyn Source>),
    Sink(Box<dyn Sink>),
}

/// Makes the connector a file describes (checked by `config::parse` already); a `[config]`
/// mistake is `Fatal`, naming the key.
pub fn build(c: &ConnectorConfig, store: &Store) -> Result<Built, ConnectError> {
    match (c.connector.as_str(), c.kind) {
        ("file", Kind::Source) => Ok(Built::Source(Box::new(file::FileSource::new(&c.config)?))),
        ("file", Kind::Sink) => Ok(Built::Sink(Box::new(file::FileSink::new(&c.config, store.scoped(&c.name))?))),
        ("http", Kind::Source) => Ok(Built::Source(Box::new(http::HttpSource::new(&c.config)?))),
        ("http", Kind::Sink) => Ok(Built::Sink(Box::new(http::HttpSink::new(&c.config)?))),
        ("kafka", Kind::Source) => Ok(Built::Source(Box::new(kafka::KafkaSource::new(&c.config)?))),
        ("kafka", Kind::Sink) => Ok(Built::Sink(Box::new(kafka::KafkaSink::new(&c.config)?))),
        ("mqtt", Kind::Source) => Ok(Built::Source(Box::new(mqtt::MqttSource::new(&c.config, &c.name)?))),
        ("mqtt", Kind::Sink) => Ok(Built::Sink(Box::new(mqtt::MqttSink::new(&c.config, &c.name)?))),
        ("postgres", Kind::Source) => Ok(Built::Source(Box::new(postgres::PostgresSource::new(&c.config)?))),
        ("postgres", Kind::Sink) => Ok(Built::Sink(Box::new(postgres::PostgresSink::new(&c.config, &c.topic)?))),
        ("redis", Kind::Source) => Ok(Built::Source(Box::new(redis::RedisSource::new(&c.config)?))),
        ("redis", Kind::Sink) => Ok(Built::Sink(Box::new(redis::RedisSink::new(&c.config)?))),
        (other, _) => Err(ConnectError::Fatal(format!("no connector {other:?}"))),
    }
}

/// Reads a `[config]` key; `Fatal` when it is there and of another type.
pub(crate) fn key<'a, T>(
    config: &'a toml::Table,
    name: &str,
    read: impl FnOnce(&'a toml::Value) -> Option<T>,
    what: &str,
) -> Result<Option<T>, ConnectError> {
    match config.get(name) {
        None => Ok(None),
        Some(v) => read(v).map(Some).ok_or_else(|| ConnectError::Fatal(format!("config.{name}: {what}"))),
    }
}

/// `[config]` keys a connector does not know are a mistake (a typo would otherwise be ignored).
pub(crate) fn only_keys(config: &toml::Table, known: &[&str]) -> Result<(), ConnectError> {
    match config.keys().find(|k| !known.contains(&k.as_str())) {
        Some(k) => {
            Err(ConnectError::Fatal(format!("config.{k}: not a key of this connector (it has {})", known.join(", "))))
        }
        None => Ok(()),
    }
}

/// The event with where its record is in the source's external system (`connectposition`, as
/// JSON), so a consumer can tell where it came from.
pub(crate) fn with_position(mut e: cloudevents::Event, position: &serde_json::Value) -> cloudevents::Event {
    e.set_extension("connectposition", position.to_string());
    e
}

/// The extensions a delivery carries that are not the event's own.
const DELIVERY_EXTENSIONS: [&str; 4] = ["emdeliveryid", "empartition", "emoffset", "emattempt"];

/// The event as its producer made it: without the delivery's extensions.
pub fn undelivered(event: &cloudevents::Event) -> cloudevents::Event {
    let mut e = event.clone();
    for x in DELIVERY_EXTENSIONS {
        e.remove_extension(x);
    }
    e
}
