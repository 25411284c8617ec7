//! The HTTP connectors.
//!
//! * **Source** (`listen`, `path` = `/`, `secret`, `source`, `type`, `max_body_bytes` = 1 MiB):
//!   a listener taking `POST`s of CloudEvents in every content mode of the HTTP binding
//!   (structured, batch, binary with `ce-*` headers) and plain webhooks: any other JSON body
//!   (or text) becomes the `data` of an event with `source` (default `http://<listen><path>`),
//!   `type` (`com.github.<X-GitHub-Event>` for GitHub's, else the configured one, default
//!   `evmesh.connect.http.webhook`) and an `id` that is the same when the sender retries:
//!   `X-GitHub-Delivery`, else `Idempotency-Key`, else the SHA-256 of the body. With `secret`
//!   every request must carry `X-Hub-Signature-256: sha256=<hex HMAC-SHA256 of the body>`
//!   (GitHub's), checked in constant time; else 401. The sender is answered 202 only once
//!   its events are in evmesh and committed (the runtime's commit); 503 when that did not
//!   happen within 30 s or the connector stopped, so it sends again (the same ids). A bad event
//!   is 400, a body over the limit 413, another method 405, another path 404, a full queue
//!   (1,024 requests waiting) 503 with `Retry-After`.
//! * **Sink** (`url`, `mode` = `binary` | `structured`, `headers`, `timeout_ms` = 10 s): `POST`s
//!   each event, in order, in that content mode (without the delivery's own extensions). A 2xx
//!   is done; 408, 429, a 5xx or no answer is tried again (the whole batch, events already
//!   answered 2xx in it skipped); another 4xx is a refusal: the event goes to the dead-letter
//!   topic. The receiver dedupes on `ce-id` and `ce-source` (a crash between its 2xx and the
//!   ack sends the event again).

use std::collections::{HashSet, VecDeque};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use cloudevents::{AttributesReader, Event, EventBuilder, EventBuilderV10};
use hmac::{Hmac, KeyInit, Mac};
use hyper::{Method, StatusCode};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use tokio::sync::{mpsc, oneshot};

use super::{binding, key, only_keys, undelivered};
use crate::http::{answer, not_allowed, problem, Answer};
use crate::spi::{ConnectError, Position, Sink, SinkError, Source, SourceRecord};

/// Requests waiting for the runtime, at most (past it: 503).
const QUEUED: usize = 1024;
/// Bytes of bodies being read or waiting for their commit, at most, in KiB: each request holds
/// `max_body_bytes` of it from before its body is read until it is answered (past it: 503
/// with `Retry-After`), so many slow or large senders cannot grow the process.
const BODY_BUDGET_KIB: usize = 64 << 10;
/// How long a sender waits for its events to be committed.
const COMMIT_WAIT: Duration = Duration::from_secs(30);

/// The HTTP source (see the module doc).
pub struct HttpSource {
    shared: Arc<Listening>,
    rx: Option<mpsc::Receiver<Request>>,
    server: Option<tokio::task::JoinHandle<()>>,
    next: u64,
    /// Requests handed to the runtime, waiting for their commit, by number.
    waiting: VecDeque<(u64, oneshot::Sender<()>)>,
}

/// What the listener needs.
struct Listening {
    listen: SocketAddr,
    path: String,
    secret: Option<Vec<u8>>,
    source: String,
    ty: String,
    max_body: usize,
    /// [`BODY_BUDGET_KIB`], shared by the requests in flight.
    budget: Arc<tokio::sync::Semaphore>,
}

/// A request's events, and where to say they are committed.
struct Request {
    events: Vec<Event>,
    committed: oneshot::Sender<()>,
}

impl HttpSource {
    pub fn new(config: &toml::Table) -> Result<HttpSource, ConnectError> {
        only_keys(config, &["listen", "path", "secret", "source", "type", "max_body_bytes"])?;
        let listen: SocketAddr = key(config, "listen", |v| v.as_str()?.parse().ok(), "an address, HOST:PORT")?
            .ok_or_else(|| ConnectError::Fatal("config.listen: the address to listen on is required".into()))?;
        let path = key(config, "path", toml::Value::as_str, "a path")?.unwrap_or("/").to_owned();
        if !path.starts_with('/') {
            return Err(ConnectError::Fatal(format!("config.path {path:?}: starts with /")));
        }
        let secret = key(config, "secret", toml::Value::as_str, "a string")?.map(|s| s.as_bytes().to_vec());
        if secret.as_ref().is_some_and(Vec::is_empty) {
            return Err(ConnectError::Fatal("config.secret: empty (anyone can sign with an empty key)".into()));
        }
        let source = key(config, "source", toml::Value::as_str, "a URI")?
            .map_or_else(|| format!("http://{listen}{path}"), str::to_owned);
        let ty =
            key(config, "type", toml::Value::as_str, "a string")?.unwrap_or("evmesh.connect.http.webhook").to_owned();
        let max_body = match key(config, "max_body_bytes", toml::Value::as_integer, "a number of bytes")? {
            None => 1 << 20,
            Some(n) if (1024..=64 << 20).contains(&n) => n as usize,
            Some(n) => return Err(ConnectError::Fatal(format!("config.max_body_bytes {n}: 1 KiB to 64 MiB"))),
        };
        let budget = Arc::new(tokio::sync::Semaphore::new(BODY_BUDGET_KIB));
        let shared = Arc::new(Listening { listen, path, secret, source, ty, max_body, budget });
        Ok(HttpSource { shared, rx: None, server: None, next: 0, waiting: VecDeque::new() })
    }
}

impl Listening {
    async fn handle(&self, req: hyper::Request<hyper::body::Incoming>, to: &mpsc::Sender<Request>) -> Answer {
        if req.uri().path() != self.path {
            // The path may be the only secret of an unsigned webhook: not named.
            return problem(StatusCode::NOT_FOUND, "no such path");
        }
        if req.method() != Method::POST {
            return not_allowed("POST");
        }
        let kib = self.max_body.div_ceil(1024) as u32;
        let Ok(_held) = self.budget.clone().try_acquire_many_owned(kib) else {
            let mut r = problem(StatusCode::SERVICE_UNAVAILABLE, "too many request bodies in flight; send again later");
            r.headers_mut().insert("retry-after", "1".parse().expect("a header value"));
            return r;
        };
        let (parts, body) = match crate::http::body(req, self.max_body).await {
            Ok(x) => x,
            Err(refused) => return refused,
        };
        if let Some(secret) = &self.secret {
            if !signed(secret, &parts.headers, &body) {
                return problem(StatusCode::UNAUTHORIZED, "X-Hub-Signature-256 is missing or does not match the body");
            }
        }
        let events = match self.events(&parts.headers, body) {
            Ok(e) => e,
            Err(why) => return problem(StatusCode::BAD_REQUEST, &why),
        };
        let n = events.len();
        if n > crate::config::MAX_BATCH {
            let detail = format!("{n} events in one request; at most {}", crate::config::MAX_BATCH);
            return problem(StatusCode::PAYLOAD_TOO_LARGE, &detail);
        }
        let (committed, done) = oneshot::channel();
        if to.try_send(Request { events, committed }).is_err() {
            let mut r = problem(StatusCode::SERVICE_UNAVAILABLE, "too many requests are waiting; send again later");
            r.headers_mut().insert("retry-after", "1".parse().expect("a header value"));
            return r;
        }
        match tokio::time::timeout(COMMIT_WAIT, done).await {
            Ok(Ok(())) => answer(StatusCode::ACCEPTED, &json!({ "accepted": n })),
            _ => problem(StatusCode::SERVICE_UNAVAILABLE, "not stored in evmesh in time; send it again (same ids)"),
        }
    }

    /// The request's events, by its content mode.
    fn events(&self, h: &hyper::HeaderMap, body: Bytes) -> Result<Vec<Event>, String> {
        let header = |name: &str| h.get(name).and_then(|v| v.to_str().ok());
        let ct = header("content-type").unwrap_or("").to_ascii_lowercase();
        let media = ct.split(';').next().unwrap_or("").trim();
        if media == "application/cloudevents+json" {
            return serde_json::from_slice(&body).map(|e| vec![e]).map_err(|e| format!("not a CloudEvent: {e}"));
        }
        if media == "application/cloudevents-batch+json" {
            let events: Vec<Event> =
                serde_json::from_slice(&body).map_err(|e| format!("not a CloudEvents batch: {e}"))?;
            if events.is_empty() {
                return Err("an empty batch".into());
            }
            return Ok(events);
        }
        if h.contains_key("ce-specversion") {
            return binary(h, media, body).map(|e| vec![e]);
        }
        // A plain webhook.
        let id = match header("x-github-delivery").or_else(|| header("idempotency-key")) {
            Some(id) if !id.is_empty() => id.to_owned(),
            _ => hex(&Sha256::digest(&body)),
        };
        let ty = header("x-github-event").map_or_else(|| self.ty.clone(), |e| format!("com.github.{e}"));
        let b = EventBuilderV10::new().id(id).source(self.source.as_str()).ty(ty);
        let b = match serde_json::from_slice::<Value>(&body) {
            Ok(v) => b.data("application/json", v),
            Err(_) if media.starts_with("text/") || media.is_empty() => match String::from_utf8(body.to_vec()) {
                Ok(text) => b.data(if media.is_empty() { "text/plain" } else { media }, text),
                Err(_) => return Err("a webhook body is JSON or UTF-8 text".into()),
            },
            Err(e) => return Err(format!("a {media} webhook body that is not JSON: {e}")),
        };
        b.build().map(|e| vec![e]).map_err(|e| e.to_string())
    }
}

/// Whether `X-Hub-Signature-256` is the HMAC-SHA256 of `body` under `secret` (constant time).
fn signed(secret: &[u8], h: &hyper::HeaderMap, body: &[u8]) -> bool {
    let Some(given) = h.get("x-hub-signature-256").and_then(|v| v.to_str().ok()?.strip_prefix("sha256=")) else {
        return false;
    };
    let Some(given) = unhex(given) else { return false };
    let Ok(mut mac) = <Hmac<Sha256> as KeyInit>::new_from_slice(secret) else { return false };
    mac.update(body);
    mac.verify_slice(&given).is_ok()
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex(s: &str) -> Option<Vec<u8>> {
    if s.len() % 2 != 0 {
        return None;
    }
    (0..s.len()).step_by(2).map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok()).collect()
}

/// `%XX` decoded, as the binding encodes header values.
fn percent_decoded(v: &str) -> String {
    let b = v.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match (b[i], b.get(i + 1..i + 3).and_then(|h| u8::from_str_radix(std::str::from_utf8(h).ok()?, 16).ok())) {
            (b'%', Some(x)) => {
                out.push(x);
                i += 3;
            }
            (c, _) => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// A binary-mode event: attributes from `ce-*` headers, data from the body.
fn binary(h: &hyper::HeaderMap, media: &str, body: Bytes) -> Result<Event, String> {
    // The data's type is `content-type` in binary mode; the data is the body.
    if h.keys().any(|k| k.as_str() == "ce-datacontenttype" || k.as_str().starts_with("ce-data_")) {
        return Err("ce-datacontenttype and ce-data_* are not headers of binary mode (content-type, the body)".into());
    }
    let attributes: Vec<(&str, String)> = h
        .iter()
        .filter_map(|(k, v)| Some((k.as_str().strip_prefix("ce-")?, percent_decoded(v.to_str().ok()?))))
        .collect();
    let media = Some(media).filter(|m| !m.is_empty());
    binding::from_binary("ce-", attributes.iter().map(|(k, v)| (*k, v.as_str())), media, &body)
}

#[async_trait]
impl Source for HttpSource {
    async fn open(&mut self, _from: Option<Position>) -> Result<(), ConnectError> {
        // A push source has nothing to resume: senders send again what was not answered 202.
        self.close().await;
        let addr = self.shared.listen;
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|e| ConnectError::Transient(format!("listening on {addr}: {e}")))?;
        let (tx, rx) = mpsc::channel(QUEUED);
        let shared = self.shared.clone();
        let handle = Arc::new(move |req| {
            let (shared, tx) = (shared.clone(), tx.clone());
            async move { shared.handle(req, &tx).await }
        });
        self.server = Some(tokio::spawn(crate::http::serve(listener, handle)));
        self.rx = Some(rx);
        Ok(())
    }

    async fn poll(&mut self, max: usize, wait: Duration) -> Result<Vec<SourceRecord>, ConnectError> {
        let Some(rx) = &mut self.rx else { return Ok(Vec::new()) };
        let mut out = Vec::new();
        let first = match tokio::time::timeout(wait, rx.recv()).await {
            Ok(Some(r)) => r,
            Ok(None) | Err(_) => return Ok(out),
        };
        let mut next = Some(first);
        while let Some(r) = next.take() {
            self.next += 1;
            let position = json!({ "request": self.next });
            out.extend(r.events.into_iter().map(|event| SourceRecord { event, position: position.clone() }));
            self.waiting.push_back((self.next, r.committed));
            if out.len() < max {
                next = rx.try_recv().ok();
            }
        }
        Ok(out)
    }

    async fn commit(&mut self, position: &Position) -> Result<(), ConnectError> {
        let upto = position.get("request").and_then(Value::as_u64).unwrap_or(0);
        while self.waiting.front().is_some_and(|(n, _)| *n <= upto) {
            if let Some((_, committed)) = self.waiting.pop_front() {
                let _ = committed.send(());
            }
        }
        Ok(())
    }

    async fn close(&mut self) {
        if let Some(s) = self.server.take() {
            s.abort();
        }
        // Dropped: their senders are answered 503 and send again.
        self.waiting.clear();
        self.rx = None;
    }
}

/// The HTTP sink (see the module doc).
pub struct HttpSink {
    url: String,
    structured: bool,
    headers: Vec<(String, String)>,
    http: reqwest::Client,
    /// Events of the batch being put that were answered 2xx (skipped when it is put again).
    done: HashSet<(String, String)>,
}

impl HttpSink {
    pub fn new(config: &toml::Table) -> Result<HttpSink, ConnectError> {
        only_keys(config, &["url", "mode", "headers", "timeout_ms"])?;
        let url = key(config, "url", toml::Value::as_str, "an http(s) URL")?
            .filter(|u| u.starts_with("http://") || u.starts_with("https://"))
            .ok_or_else(|| ConnectError::Fatal("config.url: an http:// or https:// URL is required".into()))?
            .to_owned();
        url.parse::<url::Url>().map_err(|e| ConnectError::Fatal(format!("config.url: {e}")))?;
        let structured = match key(config, "mode", toml::Value::as_str, "binary or structured")? {
            None | Some("binary") => false,
            Some("structured") => true,
            Some(m) => return Err(ConnectError::Fatal(format!("config.mode {m:?}: binary or structured"))),
        };
        let mut headers = Vec::new();
        if let Some(t) = key(config, "headers", toml::Value::as_table, "a table of header = \"value\"")? {
            for (k, v) in t {
                let v = v.as_str().ok_or_else(|| ConnectError::Fatal(format!("config.headers.{k}: a string")))?;
                let ok = reqwest::header::HeaderName::from_bytes(k.as_bytes()).is_ok()
                    && reqwest::header::HeaderValue::from_str(v).is_ok();
                if !ok {
                    return Err(ConnectError::Fatal(format!("config.headers.{k}: not a valid header")));
                }
                headers.push((k.clone(), v.to_owned()));
            }
        }
        let timeout = key(config, "timeout_ms", toml::Value::as_integer, "milliseconds")?.unwrap_or(10_000);
        if !(100..=600_000).contains(&timeout) {
            return Err(ConnectError::Fatal(format!("config.timeout_ms {timeout}: 100 to 600000")));
        }
        let http = reqwest::Client::builder()
            .use_preconfigured_tls(tls())
            .timeout(Duration::from_millis(timeout as u64))
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|e| ConnectError::Fatal(format!("http client: {e}")))?;
        Ok(HttpSink { url, structured, headers, http, done: HashSet::new() })
    }

    /// The request for `event` in the configured content mode.
    fn request(&self, event: &Event) -> reqwest::RequestBuilder {
        let mut r = self.http.post(&self.url);
        for (k, v) in &self.headers {
            r = r.header(k, v);
        }
        if self.structured {
            let body = serde_json::to_vec(event).expect("an event serializes");
            return r.header("content-type", "application/cloudevents+json").body(body);
        }
        let b = binding::to_binary(event);
        for (name, v) in &b.attributes {
            r = r.header(format!("ce-{name}"), encoded(v));
        }
        if let Some(ct) = &b.content_type {
            r = r.header("content-type", ct);
        }
        if event.data().is_some() {
            r = r.body(b.data);
        }
        r
    }
}

/// A header value as the binding writes it: printable ASCII but `%` and `"` as is, the rest
/// `%XX` (UTF-8).
fn encoded(v: &str) -> String {
    let mut out = String::with_capacity(v.len());
    for b in v.bytes() {
        match b {
            b' '..=b'~' if b != b'%' && b != b'"' => out.push(b as char),
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

/// rustls with the web's roots (webhook receivers are public or named in `headers`).
pub(crate) fn tls() -> rustls::ClientConfig {
    let mut roots = rustls::RootCertStore::empty();
    roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("ring supports the default versions")
        .with_root_certificates(roots)
        .with_no_client_auth()
}

#[async_trait]
impl Sink for HttpSink {
    async fn open(&mut self) -> Result<(), ConnectError> {
        self.done.clear();
        Ok(())
    }

    async fn put(&mut self, events: &[Event]) -> Result<(), SinkError> {
        for (i, e) in events.iter().enumerate() {
            let key = (e.source().to_string(), e.id().to_owned());
            if self.done.contains(&key) {
                continue;
            }
            let sent = self.request(&undelivered(e)).send().await;
            let status = match sent {
                Ok(r) => r.status().as_u16(),
                // The event makes no request (a header value it cannot be): refused.
                Err(err) if err.is_builder() => {
                    return Err(SinkError::Refused { index: i, reason: format!("not a request: {err}") })
                }
                Err(err) => return Err(ConnectError::Transient(format!("POST {}: {err}", self.url)).into()),
            };
            match status {
                200..=299 => {
                    self.done.insert(key);
                }
                // The receiver refuses this event: 400, 409, 413, 415, 422 and the like.
                400 | 402 | 405..=407 | 409..=428 | 431..=499 => {
                    return Err(SinkError::Refused { index: i, reason: format!("POST {} answered {status}", self.url) })
                }
                // Not the event's fault (away, overloaded, moved, a credential or a URL to
                // mend): tried again, never dead-lettered for it.
                _ => return Err(ConnectError::Transient(format!("POST {} answered {status}", self.url)).into()),
            }
        }
        Ok(())
    }

    async fn flush(&mut self) -> Result<(), ConnectError> {
        self.done.clear();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signatures_are_checked_as_github_makes_them() {
        let mut mac = <Hmac<Sha256> as KeyInit>::new_from_slice(b"s3cret").unwrap();
        mac.update(b"{}");
        let sig = format!("sha256={}", hex(&mac.finalize().into_bytes()));
        let mut h = hyper::HeaderMap::new();
        h.insert("x-hub-signature-256", sig.parse().unwrap());
        assert!(signed(b"s3cret", &h, b"{}"));
        assert!(!signed(b"s3cret", &h, b"{} "), "another body");
        assert!(!signed(b"other", &h, b"{}"), "another secret");
        h.insert("x-hub-signature-256", "sha256=zz".parse().unwrap());
        assert!(!signed(b"s3cret", &h, b"{}"));
        assert!(!signed(b"s3cret", &hyper::HeaderMap::new(), b"{}"));
    }

    #[test]
    fn header_values_round_trip_through_the_binding_encoding() {
        for v in ["plain", "100% \"quoted\"", "café ☕", ""] {
            assert_eq!(percent_decoded(&encoded(v)), v);
        }
        assert_eq!(encoded("a b"), "a b");
        assert_eq!(encoded("é"), "%C3%A9");
    }
}
