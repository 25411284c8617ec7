//! The Redis Streams connectors (the redis crate, RESP2 over plain TCP).
//!
//! * **Source** (`url` = `redis://[:password@]host:port[/db]` and `stream` required; `start` =
//!   `earliest` | `latest`, `source` = `redis:<stream>`, `type` =
//!   `evmesh.connect.redis.entry`): `XREAD` from the stored position (`{"last": "<entry
//!   id>"}`), else from `start` (`latest` is the last entry when the connector first opens,
//!   kept as a position); no consumer group, nothing acknowledged to Redis. An entry with
//!   `ce_*` fields is that event in the binary mode (`content-type` and `data` fields beside
//!   them); any other becomes an event whose `data` is the entry's fields as a JSON object, with
//!   `id = "<stream>-<entry id>"` (the same on every re-read). A stream trimmed past the
//!   position is read from its first entry kept. `latest` is stored as the position as soon as
//!   the connector opens, so a restart before its first batch skips nothing.
//! * **Sink** (`url`, `stream` required; `maxlen` = none, `dedupe_ttl_secs` = 7 days (at most
//!   10 years), `wait_replicas` = 0): each event is an entry in the binary mode (`ce_*` fields,
//!   `content-type`, `data`), added by a script (per at most 8 MiB of a batch) that adds an
//!   event only if its key (a SHA-256 of the stream, source and id, in the stream's hash slot)
//!   is not there yet and then sets that key with the TTL: an event delivered again after a
//!   crash is added once, within the TTL. Redis answers once a write is in its memory: with
//!   `appendfsync always` it is on its disk too; with `wait_replicas` = n the batch is done
//!   only once n replicas have it (`WAIT`), else it is retried. An event of over 3,900 fields
//!   is refused (the dead-letter topic); a key of another type, a refused login, a cluster's
//!   redirection or a RESP3 URL fail the connector; anything else is retried.

use std::time::Duration;

use async_trait::async_trait;
use cloudevents::{AttributesReader, Event, EventBuilder, EventBuilderV10};
use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, ErrorKind, RedisError, Value};
use serde_json::{json, Map};

use super::{binding, key, only_keys, undelivered, with_position};
use crate::spi::{ConnectError, Position, Sink, SinkError, Source, SourceRecord};

/// Adds the events not added yet (see the module doc). KEYS[1]: the stream, then each event's
/// dedupe key; ARGV: the keys' TTL, MAXLEN (0: none), then per event its field count and
/// fields. The key is set after the entry is added, and nothing that can fail comes between.
const ADD_ONCE: &str = r"
local a, added = 3, 0
for k = 2, #KEYS do
  local n = tonumber(ARGV[a])
  if redis.call('EXISTS', KEYS[k]) == 0 then
    local args = {KEYS[1]}
    if ARGV[2] ~= '0' then
      args[#args + 1] = 'MAXLEN'; args[#args + 1] = '~'; args[#args + 1] = ARGV[2]
    end
    args[#args + 1] = '*'
    for j = 1, 2 * n do args[#args + 1] = ARGV[a + j] end
    redis.call('XADD', unpack(args))
    redis.call('SET', KEYS[k], '1', 'EX', ARGV[1])
    added = added + 1
  end
  a = a + 1 + 2 * n
end
return added
";

/// Bytes of events per script call, about (a batch is split; each call is idempotent).
const CALL_BYTES: usize = 8 << 20;
/// Fields of one event, at most (Lua's `unpack` takes about 8,000 values).
const MAX_FIELDS: usize = 3900;
/// The longest dedupe TTL taken (Redis refuses an expiry past about 2^63 ms).
const MAX_TTL_SECS: i64 = 10 * 365 * 86400;

/// `url` and `stream`, as both connectors take them.
struct Common {
    client: redis::Client,
    stream: String,
}

fn common(config: &toml::Table) -> Result<Common, ConnectError> {
    let url = key(config, "url", toml::Value::as_str, "redis://[:password@]host:port[/db]")?
        .ok_or_else(|| ConnectError::Fatal("config.url: the Redis URL is required".into()))?;
    if url.contains("protocol=") && !url.contains("protocol=resp2") {
        return Err(ConnectError::Fatal("config.url: RESP2 only (no protocol=resp3)".into()));
    }
    let client = redis::Client::open(url).map_err(|e| ConnectError::Fatal(format!("config.url: {e}")))?;
    let stream = key(config, "stream", toml::Value::as_str, "a stream's key")?
        .filter(|s| !s.is_empty())
        .ok_or_else(|| ConnectError::Fatal("config.stream: the stream's key is required".into()))?
        .to_owned();
    Ok(Common { client, stream })
}

impl Common {
    /// A connection whose replies may take `wait` (a blocking read) plus 10 s.
    async fn connect(&self, wait: Duration) -> Result<MultiplexedConnection, ConnectError> {
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(Duration::from_secs(10)))
            .set_response_timeout(Some(wait + Duration::from_secs(10)));
        self.client.get_multiplexed_async_connection_with_config(&config).await.map_err(|e| failed("connecting", &e))
    }
}

/// A Redis error as the runtime takes it: what the configuration or the server's kind causes
/// (a key of another type, a refused login, a cluster's redirection) is fatal.
fn failed(what: &str, e: &RedisError) -> ConnectError {
    let text = e.to_string();
    let configuration = matches!(e.kind(), ErrorKind::AuthenticationFailed | ErrorKind::InvalidClientConfig)
        || matches!(e.code(), Some("WRONGTYPE" | "NOPERM" | "NOAUTH" | "WRONGPASS" | "MOVED" | "ASK" | "CROSSSLOT"))
        || text.contains("WRONGTYPE");
    match configuration {
        true => ConnectError::Fatal(format!("redis {what}: {e}")),
        false => ConnectError::Transient(format!("redis {what}: {e}")),
    }
}

/// The Redis Streams source (see the module doc).
pub struct RedisSource {
    common: Common,
    latest: bool,
    source: String,
    ty: String,
    conn: Option<MultiplexedConnection>,
    /// The id of the last entry read (`0-0`: none).
    last: String,
}

impl RedisSource {
    pub fn new(config: &toml::Table) -> Result<RedisSource, ConnectError> {
        only_keys(config, &["url", "stream", "start", "source", "type"])?;
        let common = common(config)?;
        let latest = match key(config, "start", toml::Value::as_str, "earliest or latest")? {
            None | Some("earliest") => false,
            Some("latest") => true,
            Some(s) => return Err(ConnectError::Fatal(format!("config.start {s:?}: earliest or latest"))),
        };
        let source = key(config, "source", toml::Value::as_str, "a URI-reference")?
            .map_or_else(|| format!("redis:{}", common.stream), str::to_owned);
        let ty =
            key(config, "type", toml::Value::as_str, "a string")?.unwrap_or("evmesh.connect.redis.entry").to_owned();
        Ok(RedisSource { common, latest, source, ty, conn: None, last: "0-0".into() })
    }

    /// An entry as an event (see the module doc).
    fn event(&self, id: &str, fields: &[(String, Vec<u8>)]) -> Option<Event> {
        let field = |name: &str| fields.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_slice());
        if field("ce_specversion").is_some() {
            let attributes =
                fields.iter().filter_map(|(k, v)| Some((k.strip_prefix("ce_")?, std::str::from_utf8(v).ok()?)));
            let ct = field("content-type").and_then(|c| std::str::from_utf8(c).ok());
            if let Ok(e) = binding::from_binary("ce_", attributes, ct, field("data").unwrap_or_default()) {
                return Some(e);
            }
        }
        let data: Map<String, serde_json::Value> =
            fields.iter().map(|(k, v)| (k.clone(), json!(String::from_utf8_lossy(v)))).collect();
        EventBuilderV10::new()
            .id(format!("{}-{id}", self.common.stream))
            .source(self.source.as_str())
            .ty(self.ty.as_str())
            .data("application/json", serde_json::Value::Object(data))
            .build()
            .ok()
    }
}

#[async_trait]
impl Source for RedisSource {
    async fn open(&mut self, from: Option<Position>) -> Result<(), ConnectError> {
        self.conn = None;
        let mut conn = self.common.connect(Duration::from_secs(1)).await?;
        self.last = match from.as_ref().and_then(|p| p.get("last")?.as_str().map(str::to_owned)) {
            Some(last) => last,
            None if self.latest => {
                let newest: Value = redis::cmd("XREVRANGE")
                    .arg(&self.common.stream)
                    .arg("+")
                    .arg("-")
                    .arg("COUNT")
                    .arg(1)
                    .query_async(&mut conn)
                    .await
                    .map_err(|e| failed("XREVRANGE", &e))?;
                entries(&newest).first().map_or_else(|| "0-0".to_owned(), |(id, _)| id.clone())
            }
            None => "0-0".into(),
        };
        self.conn = Some(conn);
        Ok(())
    }

    async fn poll(&mut self, max: usize, wait: Duration) -> Result<Vec<SourceRecord>, ConnectError> {
        if self.conn.is_none() {
            self.conn = Some(self.common.connect(wait).await?);
        }
        let conn = self.conn.as_mut().expect("connected");
        let block = wait.as_millis().max(1) as u64;
        let reply: Result<Value, _> = redis::cmd("XREAD")
            .arg("COUNT")
            .arg(max)
            .arg("BLOCK")
            .arg(block)
            .arg("STREAMS")
            .arg(&self.common.stream)
            .arg(&self.last)
            .query_async(conn)
            .await;
        let reply = match reply {
            Ok(r) => r,
            Err(e) => {
                self.conn = None;
                return Err(failed("XREAD", &e));
            }
        };
        // [[stream, [[id, [field, value, ...]], ...]]], or nil when nothing came in time.
        let mut out = Vec::new();
        let streams = match reply {
            Value::Array(streams) => streams,
            Value::Nil => return Ok(out),
            other => return Err(ConnectError::Fatal(format!("redis XREAD: not a RESP2 reply: {other:?}"))),
        };
        for s in &streams {
            let Value::Array(pair) = s else { continue };
            for (id, fields) in pair.get(1).map(entries).unwrap_or_default() {
                let position = json!({ "last": id });
                if let Some(event) = self.event(&id, &fields) {
                    out.push(SourceRecord { event: with_position(event, &position), position });
                }
                self.last = id;
            }
        }
        Ok(out)
    }

    async fn start_position(&mut self) -> Option<Position> {
        self.latest.then(|| json!({ "last": self.last }))
    }

    async fn close(&mut self) {
        self.conn = None;
    }
}

/// A stream entry: its id and its fields.
type Entry = (String, Vec<(String, Vec<u8>)>);

/// An event's dedupe key: a SHA-256 of the stream, source and id (each length-prefixed, so
/// no two of them collide), in the stream's hash slot (its `{tag}`, else its whole name).
fn seen_key(stream: &str, source: &str, id: &str) -> String {
    use sha2::{Digest, Sha256};
    let mut h = Sha256::new();
    for part in [stream, source, id] {
        h.update((part.len() as u64).to_be_bytes());
        h.update(part.as_bytes());
    }
    let tag = stream
        .split_once('{')
        .and_then(|(_, rest)| rest.split_once('}'))
        .map(|(t, _)| t)
        .filter(|t| !t.is_empty())
        .unwrap_or(stream);
    let hex: String = h.finalize().iter().map(|b| format!("{b:02x}")).collect();
    format!("evmesh-connect:seen:{{{tag}}}:{hex}")
}

/// The entries of an `XRANGE`-shaped reply.
fn entries(v: &Value) -> Vec<Entry> {
    let Value::Array(list) = v else { return Vec::new() };
    list.iter()
        .filter_map(|e| {
            let Value::Array(e) = e else { return None };
            let id = text(e.first()?)?;
            let Some(Value::Array(kv)) = e.get(1) else { return Some((id, Vec::new())) };
            let fields = kv.chunks(2).filter_map(|c| Some((text(c.first()?)?, bytes(c.get(1)?)?))).collect();
            Some((id, fields))
        })
        .collect()
}

fn bytes(v: &Value) -> Option<Vec<u8>> {
    match v {
        Value::BulkString(b) => Some(b.clone()),
        Value::SimpleString(s) => Some(s.clone().into_bytes()),
        _ => None,
    }
}

fn text(v: &Value) -> Option<String> {
    bytes(v).map(|b| String::from_utf8_lossy(&b).into_owned())
}

/// The Redis Streams sink (see the module doc).
pub struct RedisSink {
    common: Common,
    maxlen: u64,
    ttl: u64,
    replicas: u64,
    script: redis::Script,
    conn: Option<MultiplexedConnection>,
}

impl RedisSink {
    pub fn new(config: &toml::Table) -> Result<RedisSink, ConnectError> {
        only_keys(config, &["url", "stream", "maxlen", "dedupe_ttl_secs", "wait_replicas"])?;
        let common = common(config)?;
        let maxlen = key(config, "maxlen", toml::Value::as_integer, "a number of entries")?.unwrap_or(0);
        let ttl = key(config, "dedupe_ttl_secs", toml::Value::as_integer, "seconds")?.unwrap_or(7 * 86400);
        let replicas = key(config, "wait_replicas", toml::Value::as_integer, "a number of replicas")?.unwrap_or(0);
        if maxlen < 0 || !(1..=MAX_TTL_SECS).contains(&ttl) || replicas < 0 {
            return Err(ConnectError::Fatal(
                "config.maxlen (>= 0), dedupe_ttl_secs (1 to 10 years) or wait_replicas (>= 0): out of range".into(),
            ));
        }
        let (maxlen, ttl, replicas) = (maxlen as u64, ttl as u64, replicas as u64);
        Ok(RedisSink { common, maxlen, ttl, replicas, script: redis::Script::new(ADD_ONCE), conn: None })
    }
}

#[async_trait]
impl Sink for RedisSink {
    async fn open(&mut self) -> Result<(), ConnectError> {
        self.conn = Some(self.common.connect(Duration::ZERO).await?);
        Ok(())
    }

    async fn put(&mut self, events: &[Event]) -> Result<(), SinkError> {
        if self.conn.is_none() {
            self.open().await?;
        }
        // Each event's fields; one refused for its size stops the batch there.
        let mut entries = Vec::with_capacity(events.len());
        let mut refused = None;
        for (i, e) in events.iter().enumerate() {
            let e = undelivered(e);
            let b = binding::to_binary(&e);
            let mut fields: Vec<(String, Vec<u8>)> =
                b.attributes.into_iter().map(|(k, v)| (format!("ce_{k}"), v.into_bytes())).collect();
            if let Some(ct) = b.content_type {
                fields.push(("content-type".into(), ct.into_bytes()));
            }
            if e.data().is_some() {
                fields.push(("data".into(), b.data));
            }
            if fields.len() > MAX_FIELDS {
                refused = Some((i, format!("redis: {} fields, over {MAX_FIELDS}", fields.len())));
                break;
            }
            entries.push((seen_key(&self.common.stream, &e.source().to_string(), e.id()), fields));
        }
        let mut rest = &entries[..];
        while !rest.is_empty() {
            let mut bytes = 0;
            let n = rest
                .iter()
                .take_while(|(_, f)| {
                    bytes += f.iter().map(|(k, v)| k.len() + v.len()).sum::<usize>();
                    bytes <= CALL_BYTES
                })
                .count()
                .max(1);
            let mut call = self.script.key(&self.common.stream);
            call.arg(self.ttl).arg(self.maxlen);
            for (seen, fields) in &rest[..n] {
                call.key(seen).arg(fields.len());
                for (k, v) in fields {
                    call.arg(k).arg(v);
                }
            }
            let conn = self.conn.as_mut().expect("connected");
            if let Err(e) = call.invoke_async::<i64>(conn).await {
                self.conn = None;
                return Err(failed("adding", &e).into());
            }
            rest = &rest[n..];
        }
        if self.replicas > 0 {
            // On the connection that wrote: WAIT counts its own writes.
            let conn = self.conn.as_mut().expect("connected");
            let got: Result<i64, _> = redis::cmd("WAIT").arg(self.replicas).arg(5000).query_async(conn).await;
            match got {
                Ok(n) if n as u64 >= self.replicas => {}
                Ok(n) => {
                    let why = format!("redis WAIT: {n} of {} replicas have the batch", self.replicas);
                    return Err(ConnectError::Transient(why).into());
                }
                Err(e) => {
                    self.conn = None;
                    return Err(failed("WAIT", &e).into());
                }
            }
        }
        match refused {
            Some((index, reason)) => Err(SinkError::Refused { index, reason }),
            None => Ok(()),
        }
    }

    async fn flush(&mut self) -> Result<(), ConnectError> {
        // The script's writes are Redis's (its own persistence: AOF or RDB).
        Ok(())
    }

    async fn close(&mut self) {
        self.conn = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_entry_is_read_back_from_an_xread_shaped_reply() {
        let b = |s: &str| Value::BulkString(s.as_bytes().to_vec());
        let reply = Value::Array(vec![
            Value::Array(vec![b("1-0"), Value::Array(vec![b("n"), b("1"), b("sku"), b("A")])]),
            Value::Array(vec![b("2-0"), Value::Nil]),
            Value::Int(3),
        ]);
        let got = entries(&reply);
        assert_eq!(got.len(), 2);
        assert_eq!(got[0], ("1-0".into(), vec![("n".into(), b"1".to_vec()), ("sku".into(), b"A".to_vec())]));
        assert_eq!(got[1], ("2-0".into(), vec![]));
        let s = RedisSource::new(&"url = \"redis://127.0.0.1:1/\"\nstream = \"s\"".parse().unwrap()).unwrap();
        let e = s.event("1-0", &got[0].1).unwrap();
        assert_eq!((e.id(), e.source().as_str()), ("s-1-0", "redis:s"));
        let refused = |t: &str| match RedisSink::new(&t.parse().unwrap()) {
            Err(ConnectError::Fatal(e)) => e,
            _ => panic!("{t} taken"),
        };
        assert!(refused("stream = \"s\"").starts_with("config.url"));
        assert!(refused("url = \"redis://h/\"\nstream = \"s\"\nmaxlen = -1").starts_with("config.maxlen"));
        assert!(refused("url = \"redis://h/\"\nstream = \"s\"\nx = 1").starts_with("config.x"));
        assert!(refused("url = \"redis://h/\"\nstream = \"s\"\ndedupe_ttl_secs = 9223372036854775807")
            .starts_with("config.maxlen"));
        assert!(refused("url = \"redis://h/?protocol=resp3\"\nstream = \"s\"").starts_with("config.url"));
    }

    #[test]
    fn dedupe_keys_do_not_collide_and_live_in_the_streams_slot() {
        assert_ne!(seen_key("orders", "eu:shop", "1"), seen_key("orders:eu", "shop", "1"));
        assert_ne!(seen_key("s", "a", "b\u{0}c"), seen_key("s", "a\u{0}b", "c"));
        assert!(seen_key("orders", "/s", "1").starts_with("evmesh-connect:seen:{orders}:"));
        assert!(seen_key("{t}orders", "/s", "1").starts_with("evmesh-connect:seen:{t}:"));
    }
}
