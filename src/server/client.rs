//! The broker's own HTTP/1.1 client, for what evmesh calls out to (webhook sinks, remote
//! agents): on the shard that uses it, a pool of keep-alive connections per origin, every step
//! (connect, write, each read) under a deadline, every response bounded. The wire format is the
//! protocol crate's (`http::client`: a request writer and a strict response-head parser, the
//! request side's chunked scanner for chunked bodies).
//!
//! `http` and `https` (rustls, `tls::connect`: the Mozilla roots and `webhook_ca_file`). A
//! host name is resolved by the system resolver on a thread of its own ([`Url::resolve`]; it
//! blocks, and a shard must not), by the caller, which keeps the address.

use std::cell::RefCell;
use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use monoio::io::{AsyncReadRent, AsyncWriteRentExt};
use monoio::net::TcpStream;

use super::deadline::within;
use super::Stream;
use crate::http::client::{parse_response_head, write_request, ResponseBody};
use crate::http::{ChunkedLimits, ChunkedScanner, Status};

/// An `http` or `https` URL the client can call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Url {
    pub tls: bool,
    /// The authority as written (the `Host` header's).
    pub host: String,
    /// The host alone (no brackets, no port): the name to resolve and to verify on https.
    pub name: String,
    pub port: u16,
    /// The host's address when it is one (or `localhost`): nothing to resolve.
    pub ip: Option<IpAddr>,
    /// Path and query, `/` at least.
    pub target: String,
}

impl Url {
    /// Parses `http[s]://host[:port][/path][?query]`; `host` a DNS name, an IPv4 address or
    /// `[IPv6]`. A fragment is dropped; user info is refused.
    pub fn parse(s: &str) -> Result<Url, String> {
        let (tls, rest) = match s.split_once("://") {
            Some((scheme, rest)) if scheme.eq_ignore_ascii_case("http") => (false, rest),
            Some((scheme, rest)) if scheme.eq_ignore_ascii_case("https") => (true, rest),
            _ => return Err(format!("{s:?} is not an http:// or https:// URL")),
        };
        let default_port = if tls { 443 } else { 80 };
        let rest = rest.split('#').next().unwrap_or_default();
        let (authority, target) = match rest.find(['/', '?']) {
            Some(i) if rest.as_bytes()[i] == b'?' => (&rest[..i], format!("/{}", &rest[i..])),
            Some(i) => (&rest[..i], rest[i..].to_owned()),
            None => (rest, "/".to_owned()),
        };
        if authority.contains('@') {
            return Err("a URL with user info is refused (credentials do not belong in a sink URL)".into());
        }
        if !target.bytes().all(|b| (b'!'..=b'~').contains(&b)) {
            return Err("the URL's path and query must be visible ASCII (percent-encode the rest)".into());
        }
        let port =
            |p: &str| p.parse::<u16>().ok().filter(|&p| p > 0).ok_or_else(|| format!("bad port in {authority:?}"));
        // `[v6]` or `[v6]:port`; otherwise `host` or `host:port`.
        let (host, port) = match authority.strip_prefix('[') {
            Some(rest) => match rest.split_once(']') {
                Some((h, "")) => (h, default_port),
                Some((h, after)) => (h, port(after.strip_prefix(':').unwrap_or(after))?),
                None => return Err(format!("unclosed [ in {authority:?}")),
            },
            None => match authority.rsplit_once(':') {
                Some((h, p)) => (h, port(p)?),
                None => (authority, default_port),
            },
        };
        let ip = match host {
            h if h.eq_ignore_ascii_case("localhost") => Some(IpAddr::V4(Ipv4Addr::LOCALHOST)),
            h if authority.starts_with('[') => {
                Some(h.parse::<std::net::Ipv6Addr>().map_err(|_| format!("{h:?} is not an IPv6 address"))?.into())
            }
            h => h.parse::<Ipv4Addr>().ok().map(IpAddr::V4),
        };
        let label_ok = |l: &str| {
            (1..=63).contains(&l.len())
                && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
                && !l.starts_with('-')
                && !l.ends_with('-')
        };
        if ip.is_none() && (host.len() > 253 || !host.trim_end_matches('.').split('.').all(label_ok)) {
            return Err(format!("the host {host:?} is neither a DNS name nor an IP address"));
        }
        Ok(Url { tls, host: authority.to_owned(), name: host.to_owned(), port, ip, target })
    }

    /// Where it is: its address, or what the resolver says its name is (on a thread of its
    /// own, within `timeout`).
    pub async fn resolve(&self, timeout: Duration) -> Result<SocketAddr, ClientError> {
        if let Some(ip) = self.ip {
            return Ok(SocketAddr::new(ip, self.port));
        }
        let (tx, rx) = futures::channel::oneshot::channel();
        let (name, port) = (self.name.clone(), self.port);
        let spawned = std::thread::Builder::new().name("evmesh-resolve".into()).spawn(move || {
            use std::net::ToSocketAddrs;
            let found = (name.as_str(), port).to_socket_addrs().map(|mut a| a.next());
            let _ = tx.send(found.map_err(|e| e.to_string()));
        });
        if let Err(e) = spawned {
            return Err(ClientError::Connect(format!("cannot resolve {}: {e}", self.name)));
        }
        match monoio::time::timeout(timeout, rx).await {
            Ok(Ok(Ok(Some(addr)))) => Ok(addr),
            Ok(Ok(Ok(None))) => Err(ClientError::Connect(format!("{} has no address", self.name))),
            Ok(Ok(Err(e))) => Err(ClientError::Connect(format!("cannot resolve {}: {e}", self.name))),
            Ok(Err(_)) => Err(ClientError::Connect(format!("cannot resolve {}", self.name))),
            Err(_) => Err(ClientError::TimedOut(timeout)),
        }
    }
}

/// Why a call failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ClientError {
    #[error("cannot connect: {0}")]
    Connect(String),
    #[error("no answer within {0:?}")]
    TimedOut(Duration),
    #[error("the connection closed before the answer was complete")]
    Closed,
    #[error("the answer broke HTTP: {0}")]
    Protocol(&'static str),
    #[error("the answer's body is over {0} bytes")]
    TooLarge(usize),
}

/// An answer: its status, headers and (bounded) body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Answer {
    /// The first header named `name` (ASCII case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(n, _)| n.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }
}

/// Bytes of a response head at most.
const MAX_HEAD: usize = 16 * 1024;
const MAX_HEADERS: usize = 100;
/// Bytes one read takes at most.
const READ_CHUNK: usize = 16 * 1024;

/// Keep-alive connections by origin, on one shard. An idle connection stays until it is reused
/// (a stale one is then replaced) or [`Pool::close_idle`] closes it: its user bounds the
/// origins it calls (a webhook session has a pool of its own, for its one sink) and closes
/// what stays idle.
pub struct Pool {
    /// By origin (https?, address): connections and since when they are idle.
    idle: RefCell<HashMap<Origin, Vec<(Conn, std::time::Instant)>>>,
    max_idle: usize,
    max_body: usize,
    /// For https (none: https URLs fail to connect).
    tls: Option<Arc<rustls::ClientConfig>>,
}

/// Where a pooled connection goes: https or not, and the address.
type Origin = (bool, SocketAddr);

/// How one exchange on one connection ended badly.
enum Failed {
    /// Nothing came back on a pooled connection (the server had closed it): try a new one.
    Stale,
    Error(ClientError),
}

impl Pool {
    /// A pool keeping at most `max_idle` idle connections per origin, taking answers' bodies
    /// of at most `max_body` bytes.
    pub fn new(max_idle: usize, max_body: usize, tls: Option<Arc<rustls::ClientConfig>>) -> Pool {
        Pool { idle: RefCell::new(HashMap::new()), max_idle, max_body, tls }
    }

    /// Closes the idle connections to any other address than `addr` (a name now resolved
    /// elsewhere).
    pub fn forget_all_but(&self, addr: SocketAddr) {
        self.idle.borrow_mut().retain(|(_, a), _| *a == addr);
    }

    /// Closes the connections idle for `max` or longer.
    pub fn close_idle(&self, max: Duration) {
        let mut idle = self.idle.borrow_mut();
        for conns in idle.values_mut() {
            conns.retain(|(_, since)| since.elapsed() < max);
        }
        idle.retain(|_, conns| !conns.is_empty());
    }

    /// Sends one request to `url` at `addr` (see [`Url::resolve`]) and reads its answer, each
    /// step within `timeout`. A pooled connection the server closed meanwhile is replaced by a
    /// new one once.
    #[allow(clippy::too_many_arguments)]
    pub async fn send(
        &self,
        url: &Url,
        addr: SocketAddr,
        method: &str,
        headers: &[(&str, &str)],
        body: &[u8],
        timeout: Duration,
    ) -> Result<Answer, ClientError> {
        let mut req = Vec::new();
        write_request(method, &url.host, &url.target, headers, body, &mut req);
        let origin = (url.tls, addr);
        let pooled = self.idle.borrow_mut().get_mut(&origin).and_then(Vec::pop).map(|(c, _)| c);
        if let Some(conn) = pooled {
            match self.exchange(conn, origin, &mut req, method == "HEAD", timeout).await {
                Ok(a) => return Ok(a),
                Err(Failed::Error(e)) => return Err(e),
                Err(Failed::Stale) => {}
            }
        }
        let conn = self.connect(url, addr, timeout).await?;
        match self.exchange(conn, origin, &mut req, method == "HEAD", timeout).await {
            Ok(a) => Ok(a),
            Err(Failed::Stale) => Err(ClientError::Closed),
            Err(Failed::Error(e)) => Err(e),
        }
    }

    async fn exchange(
        &self,
        mut conn: Conn,
        origin: Origin,
        req: &mut Vec<u8>,
        head_request: bool,
        timeout: Duration,
    ) -> Result<Answer, Failed> {
        // The write hands the request back, so a stale connection's retry sends it again
        // without a copy (a timed-out write loses it, and is not retried).
        match within(timeout, conn.write_all(std::mem::take(req))).await {
            Ok((res, back)) => {
                *req = back;
                if res.is_err() {
                    return Err(Failed::Stale);
                }
            }
            Err(_) => return Err(Failed::Error(ClientError::TimedOut(timeout))),
        }
        let mut buf = Vec::with_capacity(READ_CHUNK);
        // The head.
        let head = loop {
            match parse_response_head(&buf, MAX_HEAD, MAX_HEADERS, head_request) {
                Ok(Status::Complete(h)) => break h,
                Ok(Status::Partial) => {}
                Err(e) => return Err(Failed::Error(ClientError::Protocol(e.detail))),
            }
            match read(&mut conn, &mut buf, timeout).await? {
                0 if buf.is_empty() => return Err(Failed::Stale),
                0 => return Err(Failed::Error(ClientError::Closed)),
                _ => {}
            }
        };
        let headers = owned_headers(&head, &buf);
        let mut rest = buf.split_off(head.len);
        let body = match head.body {
            ResponseBody::Empty => Vec::new(),
            ResponseBody::Length(n) if n > self.max_body => {
                return Err(Failed::Error(ClientError::TooLarge(self.max_body)))
            }
            ResponseBody::Length(n) => {
                while rest.len() < n {
                    if read(&mut conn, &mut rest, timeout).await? == 0 {
                        return Err(Failed::Error(ClientError::Closed));
                    }
                }
                if rest.len() > n {
                    // Bytes past the answer: the connection is not reused.
                    rest.truncate(n);
                    return Ok(Answer { status: head.status, headers, body: rest });
                }
                rest
            }
            ResponseBody::Chunked => {
                let limits = ChunkedLimits {
                    max_data: self.max_body,
                    max_extensions: MAX_HEAD,
                    max_trailers: MAX_HEAD,
                    max_raw: self.max_body.saturating_mul(2).saturating_add(MAX_HEAD),
                };
                let mut scanner = ChunkedScanner::new(limits);
                let mut out = Vec::new();
                loop {
                    match scanner.scan(&rest, &mut out) {
                        Ok(Status::Complete(end)) if end.consumed == rest.len() => break out,
                        Ok(Status::Complete(_)) => return Ok(Answer { status: head.status, headers, body: out }),
                        Ok(Status::Partial) => {}
                        Err(e) if e.status.0 == 413 => return Err(Failed::Error(ClientError::TooLarge(self.max_body))),
                        Err(e) => return Err(Failed::Error(ClientError::Protocol(e.detail))),
                    }
                    if read(&mut conn, &mut rest, timeout).await? == 0 {
                        return Err(Failed::Error(ClientError::Closed));
                    }
                }
            }
            ResponseBody::UntilClose => loop {
                // What came with the head counts too (found by the test of this branch).
                if rest.len() > self.max_body {
                    return Err(Failed::Error(ClientError::TooLarge(self.max_body)));
                }
                if read(&mut conn, &mut rest, timeout).await? == 0 {
                    return Ok(Answer { status: head.status, headers, body: rest });
                }
            },
        };
        if head.keep_alive {
            let mut idle = self.idle.borrow_mut();
            let conns = idle.entry(origin).or_default();
            if conns.len() < self.max_idle {
                conns.push((conn, std::time::Instant::now()));
            }
        }
        Ok(Answer { status: head.status, headers, body })
    }
}

/// An answer whose body is read as it comes (a relayed event stream): its status and headers,
/// then [`Streamed::next`] until `None`. Its connection is its own (never pooled).
pub struct Streamed {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    conn: Conn,
    /// The body's bytes as they came (the chunked scanner reads from the first), and the
    /// decoded data not handed out yet.
    raw: Vec<u8>,
    data: Vec<u8>,
    framing: Framing,
    timeout: Duration,
    /// Body bytes handed out, and the most there may be.
    taken: usize,
    max: usize,
}

enum Framing {
    Chunked(ChunkedScanner),
    Length(usize),
    UntilClose,
    Done,
}

impl Streamed {
    /// The next piece of the body (`None` at its end), each read within the timeout; at most
    /// the pool's `max_body` bytes in all (the stream fails past them).
    pub async fn next(&mut self) -> Result<Option<Vec<u8>>, ClientError> {
        loop {
            let piece = match &mut self.framing {
                Framing::Done => return Ok(None),
                // The scanner only appends: what it decoded is handed out and not kept.
                Framing::Chunked(scanner) => match scanner.scan(&self.raw, &mut self.data) {
                    Ok(Status::Complete(_)) => {
                        self.framing = Framing::Done;
                        Some(std::mem::take(&mut self.data))
                    }
                    Ok(Status::Partial) => Some(std::mem::take(&mut self.data)),
                    Err(e) if e.status.0 == 413 => return Err(ClientError::TooLarge(self.raw.len())),
                    Err(e) => return Err(ClientError::Protocol(e.detail)),
                },
                Framing::Length(left) => {
                    let take = self.raw.len().min(*left);
                    *left -= take;
                    if *left == 0 {
                        self.framing = Framing::Done;
                    }
                    (take > 0).then(|| self.raw.drain(..take).collect())
                }
                Framing::UntilClose => (!self.raw.is_empty()).then(|| std::mem::take(&mut self.raw)),
            };
            if let Some(p) = piece.filter(|p| !p.is_empty()) {
                self.taken += p.len();
                if self.taken > self.max {
                    return Err(ClientError::TooLarge(self.max));
                }
                return Ok(Some(p));
            }
            if matches!(self.framing, Framing::Done) {
                return Ok(None);
            }
            match read(&mut self.conn, &mut self.raw, self.timeout).await {
                Ok(0) if matches!(self.framing, Framing::UntilClose) => self.framing = Framing::Done,
                Ok(0) | Err(Failed::Stale) => return Err(ClientError::Closed),
                Ok(_) => {}
                Err(Failed::Error(e)) => return Err(e),
            }
        }
    }
}

impl Pool {
    /// Sends one request on a connection of its own and returns as soon as the answer's head
    /// is in; its body is read with [`Streamed::next`], at most `max_body` bytes of it.
    pub async fn stream(
        &self,
        url: &Url,
        addr: SocketAddr,
        headers: &[(&str, &str)],
        body: &[u8],
        timeout: Duration,
    ) -> Result<Streamed, ClientError> {
        let mut req = Vec::new();
        write_request("POST", &url.host, &url.target, headers, body, &mut req);
        let mut conn = self.connect(url, addr, timeout).await?;
        match within(timeout, conn.write_all(req)).await {
            Ok((Ok(_), _)) => {}
            Ok((Err(e), _)) => return Err(ClientError::Connect(e.to_string())),
            Err(_) => return Err(ClientError::TimedOut(timeout)),
        }
        let mut buf = Vec::with_capacity(READ_CHUNK);
        let head = loop {
            match parse_response_head(&buf, MAX_HEAD, MAX_HEADERS, false) {
                Ok(Status::Complete(h)) => break h,
                Ok(Status::Partial) => {}
                Err(e) => return Err(ClientError::Protocol(e.detail)),
            }
            match read(&mut conn, &mut buf, timeout).await {
                Ok(0) | Err(Failed::Stale) => return Err(ClientError::Closed),
                Ok(_) => {}
                Err(Failed::Error(e)) => return Err(e),
            }
        };
        let headers = owned_headers(&head, &buf);
        let raw = buf.split_off(head.len);
        let framing = match head.body {
            ResponseBody::Empty => Framing::Done,
            ResponseBody::Length(n) if n > self.max_body => return Err(ClientError::TooLarge(self.max_body)),
            ResponseBody::Length(n) => Framing::Length(n),
            ResponseBody::Chunked => Framing::Chunked(ChunkedScanner::new(ChunkedLimits {
                max_data: self.max_body,
                max_extensions: MAX_HEAD,
                max_trailers: MAX_HEAD,
                max_raw: self.max_body.saturating_mul(2).saturating_add(MAX_HEAD),
            })),
            ResponseBody::UntilClose => Framing::UntilClose,
        };
        let max = self.max_body;
        Ok(Streamed { status: head.status, headers, conn, raw, data: Vec::new(), framing, timeout, taken: 0, max })
    }

    /// A new connection to `url` at `addr` (TLS for https).
    async fn connect(&self, url: &Url, addr: SocketAddr, timeout: Duration) -> Result<Conn, ClientError> {
        // Past the share, this pool's idle connections go first.
        let slot = SocketSlot::take(&SOCKETS)
            .or_else(|| {
                self.idle.borrow_mut().clear();
                SocketSlot::take(&SOCKETS)
            })
            .ok_or_else(|| {
                ClientError::Connect(
                    "the broker's own sockets are all in use (their share of the open-files limit)".into(),
                )
            })?;
        let stream = self.connect_stream(url, addr, timeout).await?;
        Ok(Conn { stream, _slot: slot })
    }

    async fn connect_stream(&self, url: &Url, addr: SocketAddr, timeout: Duration) -> Result<Stream, ClientError> {
        let tcp = match within(timeout, TcpStream::connect(addr)).await {
            Ok(Ok(c)) => c,
            Ok(Err(e)) => return Err(ClientError::Connect(e.to_string())),
            Err(_) => return Err(ClientError::TimedOut(timeout)),
        };
        let _ = tcp.set_nodelay(true);
        match (url.tls, &self.tls) {
            (false, _) => Ok(Stream::Plain(tcp)),
            (true, None) => Err(ClientError::Connect("https is not configured".into())),
            (true, Some(config)) => {
                let name = rustls::pki_types::ServerName::try_from(url.name.clone())
                    .map_err(|e| ClientError::Connect(format!("{}: {e}", url.name)))?;
                match super::tls::connect(tcp, name, config.clone(), timeout).await {
                    Ok(t) => Ok(Stream::Tls(Box::new(t))),
                    Err(e) if e.kind() == std::io::ErrorKind::TimedOut => Err(ClientError::TimedOut(timeout)),
                    Err(e) => Err(ClientError::Connect(format!("TLS: {e}"))),
                }
            }
        }
    }
}

/// Sockets counted against a share: how many are open, and how many may be.
struct SocketBudget {
    open: AtomicUsize,
    max: AtomicUsize,
}

/// The client's sockets, process-wide ([`set_socket_budget`]).
static SOCKETS: SocketBudget = SocketBudget { open: AtomicUsize::new(0), max: AtomicUsize::new(usize::MAX) };

/// The client's share of the descriptors (`config::fds::FdBudget::client_sockets`), set once at
/// start: a connect past it fails at once (a webhook delivery then backs off and retries).
pub fn set_socket_budget(n: usize) {
    SOCKETS.max.store(n.max(1), Ordering::Relaxed);
}

/// Sockets the client has open now (pooled ones included).
pub fn sockets_open() -> usize {
    SOCKETS.open.load(Ordering::Relaxed)
}

/// One socket counted against a budget while it lives.
struct SocketSlot(&'static SocketBudget);

impl SocketSlot {
    fn take(budget: &'static SocketBudget) -> Option<SocketSlot> {
        if budget.open.fetch_add(1, Ordering::Relaxed) >= budget.max.load(Ordering::Relaxed) {
            budget.open.fetch_sub(1, Ordering::Relaxed);
            return None;
        }
        Some(SocketSlot(budget))
    }
}

impl Drop for SocketSlot {
    fn drop(&mut self) {
        self.0.open.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A connection the client opened, counted against its share of the descriptors.
struct Conn {
    stream: Stream,
    _slot: SocketSlot,
}

impl std::ops::Deref for Conn {
    type Target = Stream;
    fn deref(&self) -> &Stream {
        &self.stream
    }
}

impl std::ops::DerefMut for Conn {
    fn deref_mut(&mut self) -> &mut Stream {
        &mut self.stream
    }
}

/// A parsed head's header fields, as owned strings (`buf` is what it was parsed from).
fn owned_headers(head: &crate::http::client::ResponseHead, buf: &[u8]) -> Vec<(String, String)> {
    let s = |(a, b): (u32, u32)| String::from_utf8_lossy(&buf[a as usize..b as usize]).into_owned();
    head.headers.iter().map(|h| (s(h.name), s(h.value))).collect()
}

/// Reads more onto `buf`: the bytes read (0 at the end of the stream; an error counts as one).
async fn read(conn: &mut Stream, buf: &mut Vec<u8>, timeout: Duration) -> Result<usize, Failed> {
    buf.reserve(READ_CHUNK);
    let (len, cap) = (buf.len(), buf.capacity());
    let owned = std::mem::take(buf);
    match within(timeout, conn.read(monoio::buf::IoBufMut::slice_mut(owned, len..cap))).await {
        Ok((res, slice)) => {
            *buf = slice.into_inner();
            Ok(res.unwrap_or(0))
        }
        Err(_) => Err(Failed::Error(ClientError::TimedOut(timeout))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_http_or_https_to_addresses_or_names() {
        let u = Url::parse("http://127.0.0.1:8089/hook?x=1#frag").unwrap();
        assert_eq!((u.host.as_str(), u.port, u.target.as_str()), ("127.0.0.1:8089", 8089, "/hook?x=1"));
        assert_eq!((u.tls, u.ip), (false, Some("127.0.0.1".parse().unwrap())));
        let u = Url::parse("HTTP://localhost").unwrap();
        assert_eq!((u.ip, u.port, u.target.as_str()), (Some("127.0.0.1".parse().unwrap()), 80, "/"));
        let u = Url::parse("http://[::1]:9/a").unwrap();
        assert_eq!((u.ip, u.host.as_str(), u.name.as_str()), (Some("::1".parse().unwrap()), "[::1]:9", "::1"));
        assert_eq!(Url::parse("http://[::1]/a").unwrap().port, 80);
        assert_eq!(Url::parse("http://10.0.0.1?q").unwrap().target, "/?q");
        let u = Url::parse("https://hooks.example.com/in").unwrap();
        assert_eq!((u.tls, u.name.as_str(), u.port, u.ip), (true, "hooks.example.com", 443, None));
        assert_eq!(Url::parse("https://a-b.example:8443").unwrap().port, 8443);
        for bad in [
            "ftp://x/",
            "127.0.0.1:80/",
            "http://u:p@127.0.0.1/",
            "http://127.0.0.1:0/",
            "http://127.0.0.1:99999/",
            "http://127.0.0.1/a b",
            "http://[::1",
            "http://[::1]x/",
            "http://[nope]/",
            "http://1.2.3.4:/",
            "http://-bad.example/",
            "http://under_score.example/",
            "http://a..b/",
            "http:///path",
        ] {
            assert!(Url::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn names_are_resolved_off_the_thread() {
        run(async {
            // `localhost` as a name the resolver looks up (parse takes it as 127.0.0.1).
            let u = Url { ip: None, ..Url::parse("http://localhost:7/").unwrap() };
            let a = u.resolve(Duration::from_secs(5)).await.unwrap();
            assert!(a.ip().is_loopback() && a.port() == 7, "{a}");
            let u = Url::parse("http://no-such-host.invalid/").unwrap();
            assert!(matches!(
                u.resolve(Duration::from_secs(5)).await,
                Err(ClientError::Connect(_) | ClientError::TimedOut(_))
            ));
        });
    }

    /// A loopback server answering each request on a connection with `answers` in turn (one
    /// per read of a whole request), recording what it got and how many connections it saw.
    fn server(answers: Vec<&'static [u8]>) -> (SocketAddr, std::sync::mpsc::Receiver<(usize, Vec<u8>)>) {
        use std::io::{Read, Write};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut answers = answers.into_iter();
            for (n, conn) in listener.incoming().enumerate() {
                let Ok(mut conn) = conn else { return };
                loop {
                    let mut got = vec![0u8; 4096];
                    let Ok(k) = conn.read(&mut got) else { break };
                    if k == 0 {
                        break;
                    }
                    got.truncate(k);
                    let _ = tx.send((n, got));
                    let Some(a) = answers.next() else { return };
                    if a.is_empty() {
                        break; // close without answering
                    }
                    conn.write_all(a).unwrap();
                }
            }
        });
        (addr, rx)
    }

    /// Where a URL with an address is.
    fn at(u: &Url) -> SocketAddr {
        SocketAddr::new(u.ip.unwrap(), u.port)
    }

    fn run<F: std::future::Future>(f: F) -> F::Output {
        monoio::RuntimeBuilder::<monoio::LegacyDriver>::new().enable_timer().build().unwrap().block_on(f)
    }

    #[test]
    fn answers_are_read_whole_and_connections_reused() {
        let (addr, got) = server(vec![
            b"HTTP/1.1 200 OK\r\ncontent-length: 13\r\n\r\n{\"retCode\":0}",
            b"HTTP/1.1 429 Slow down\r\nretry-after: 2\r\ntransfer-encoding: chunked\r\n\r\n4\r\nbusy\r\n0\r\n\r\n",
            b"HTTP/1.1 204 No Content\r\nconnection: close\r\n\r\n",
        ]);
        let url = Url::parse(&format!("http://{addr}/hook")).unwrap();
        let pool = Pool::new(4, 1024, None);
        let t = Duration::from_secs(5);
        run(async {
            let a = pool.send(&url, at(&url), "POST", &[("x-em-delivery-id", "d1")], b"hello", t).await.unwrap();
            assert_eq!((a.status, a.body.as_slice()), (200, &b"{\"retCode\":0}"[..]));
            let a = pool.send(&url, at(&url), "POST", &[], b"again", t).await.unwrap();
            assert_eq!((a.status, a.header("Retry-After"), a.body.as_slice()), (429, Some("2"), &b"busy"[..]));
            let a = pool.send(&url, at(&url), "POST", &[], b"third", t).await.unwrap();
            assert_eq!(a.status, 204);
        });
        let seen: Vec<(usize, Vec<u8>)> = got.try_iter().collect();
        // One connection for all three: the keep-alive answers returned it to the pool.
        assert_eq!(seen.iter().map(|(n, _)| *n).collect::<Vec<_>>(), [0, 0, 0]);
        let first = String::from_utf8_lossy(&seen[0].1);
        assert!(first.starts_with("POST /hook HTTP/1.1\r\nhost: 127.0.0.1:"), "{first}");
        assert!(
            first.contains("x-em-delivery-id: d1\r\n") && first.ends_with("content-length: 5\r\n\r\nhello"),
            "{first}"
        );
    }

    #[test]
    fn a_pooled_connection_the_server_closed_is_replaced_once() {
        // The first connection answers once, then closes on the next request unanswered.
        let (addr, got) = server(vec![
            b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n",
            b"",
            b"HTTP/1.1 202 OK\r\ncontent-length: 0\r\n\r\n",
        ]);
        let url = Url::parse(&format!("http://{addr}/")).unwrap();
        let pool = Pool::new(4, 1024, None);
        run(async {
            assert_eq!(pool.send(&url, at(&url), "POST", &[], b"1", Duration::from_secs(5)).await.unwrap().status, 200);
            assert_eq!(pool.send(&url, at(&url), "POST", &[], b"2", Duration::from_secs(5)).await.unwrap().status, 202);
        });
        let seen: Vec<(usize, Vec<u8>)> = got.try_iter().collect();
        assert_eq!(seen.iter().map(|(n, _)| *n).collect::<Vec<_>>(), [0, 0, 1]);
        // The retry sends the whole request again (the write handed it back).
        assert_eq!(seen[2].1, seen[1].1);
        assert!(seen[2].1.ends_with(b"content-length: 1\r\n\r\n2"), "{:?}", String::from_utf8_lossy(&seen[2].1));
    }

    /// A streamed answer comes piece by piece as it is written (chunked or by length), and one
    /// framed by the close is held to the bound like the others.
    #[test]
    fn streamed_answers_come_as_written_and_are_held_to_the_bound() {
        use std::io::{Read, Write};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let (step_tx, step_rx) = std::sync::mpsc::channel::<()>();
        std::thread::spawn(move || {
            // 1: chunked, its second chunk only once the client took the first.
            let (mut c, _) = listener.accept().unwrap();
            let _ = c.read(&mut [0u8; 4096]);
            c.write_all(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nfirst\r\n").unwrap();
            step_rx.recv().unwrap();
            c.write_all(b"6\r\nsecond\r\n0\r\n\r\n").unwrap();
            // 2: by length. 3: until the close, over the bound.
            for answer in [
                &b"HTTP/1.1 200 OK\r\ncontent-length: 4\r\n\r\nfour"[..],
                b"HTTP/1.0 200 OK\r\n\r\n0123456789abcdefXYZ",
            ] {
                let (mut c, _) = listener.accept().unwrap();
                let _ = c.read(&mut [0u8; 4096]);
                c.write_all(answer).unwrap();
            }
        });
        let url = Url::parse(&format!("http://{addr}/")).unwrap();
        let pool = Pool::new(0, 16, None);
        let t = Duration::from_secs(5);
        run(async {
            let mut s = pool.stream(&url, addr, &[], b"{}", t).await.unwrap();
            assert_eq!(s.next().await.unwrap().as_deref(), Some(&b"first"[..]), "before the rest was written");
            step_tx.send(()).unwrap();
            assert_eq!(s.next().await.unwrap().as_deref(), Some(&b"second"[..]));
            assert_eq!(s.next().await.unwrap(), None);
            let mut s = pool.stream(&url, addr, &[], b"{}", t).await.unwrap();
            assert_eq!((s.next().await.unwrap().as_deref(), s.next().await.unwrap()), (Some(&b"four"[..]), None));
            let mut s = pool.stream(&url, addr, &[], b"{}", t).await.unwrap();
            let mut got = Ok(Some(Vec::new()));
            while let Ok(Some(_)) = got {
                got = s.next().await;
            }
            assert_eq!(got, Err(ClientError::TooLarge(16)));
        });
    }

    /// A server that answers one request with `answer` and closes the connection.
    fn answer_and_close(answer: &'static [u8]) -> SocketAddr {
        use std::io::{Read, Write};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        std::thread::spawn(move || {
            let (mut conn, _) = listener.accept().unwrap();
            let _ = conn.read(&mut [0u8; 4096]);
            conn.write_all(answer).unwrap();
        });
        addr
    }

    #[test]
    fn bodies_framed_by_the_close_are_read_to_it_and_cut_ones_are_errors() {
        let ok = answer_and_close(b"HTTP/1.1 200 OK\r\n\r\nuntil the end");
        let cut = answer_and_close(b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nshort");
        let big = answer_and_close(b"HTTP/1.0 200 OK\r\n\r\n0123456789abcdefXYZ");
        let pool = Pool::new(4, 16, None);
        let t = Duration::from_secs(5);
        run(async {
            let url = |a: SocketAddr| Url::parse(&format!("http://{a}/")).unwrap();
            let a = pool.send(&url(ok), at(&url(ok)), "POST", &[], b"x", t).await.unwrap();
            assert_eq!(a.body, b"until the end");
            assert_eq!(pool.send(&url(cut), at(&url(cut)), "POST", &[], b"x", t).await, Err(ClientError::Closed));
            assert_eq!(pool.send(&url(big), at(&url(big)), "POST", &[], b"x", t).await, Err(ClientError::TooLarge(16)));
            // None of them went back to the pool.
            assert!(pool.idle.borrow().values().all(Vec::is_empty));
        });
    }

    #[test]
    fn slow_oversized_and_broken_answers_are_errors() {
        let t = Duration::from_millis(300);
        let pool = Pool::new(4, 16, None);
        let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let broken: Vec<(SocketAddr, ClientError)> = [
            (&b"HTTP/1.1 200 OK\r\ncontent-length: 17\r\n\r\n"[..], ClientError::TooLarge(16)),
            (b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n11\r\n", ClientError::TooLarge(16)),
            (b"HTTP/1.1 2x0 OK\r\n\r\n", ClientError::Protocol("malformed status line")),
        ]
        .into_iter()
        .map(|(answer, want)| (server(vec![answer]).0, want))
        .collect();
        let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        // One runtime for all (the deadline sweep is the thread's first runtime's).
        run(async {
            // Nobody answers: the deadline.
            let url = Url::parse(&format!("http://{}/", silent.local_addr().unwrap())).unwrap();
            assert_eq!(pool.send(&url, at(&url), "POST", &[], b"x", t).await, Err(ClientError::TimedOut(t)));
            // A body over the bound, declared or chunked, and a broken head.
            for (addr, want) in broken {
                let url = Url::parse(&format!("http://{addr}/")).unwrap();
                assert_eq!(pool.send(&url, at(&url), "POST", &[], b"x", t).await, Err(want));
            }
            // Nothing listens.
            let url = Url::parse(&format!("http://127.0.0.1:{closed}/")).unwrap();
            assert!(matches!(pool.send(&url, at(&url), "POST", &[], b"x", t).await, Err(ClientError::Connect(_))));
        });
    }

    /// The client's sockets never pass their share: a slot past it is refused, and one given
    /// back (its connection closed) makes room again.
    #[test]
    fn sockets_past_their_share_are_refused_and_given_back_on_close() {
        static BUDGET: SocketBudget = SocketBudget { open: AtomicUsize::new(0), max: AtomicUsize::new(2) };
        let (a, b) = (SocketSlot::take(&BUDGET).unwrap(), SocketSlot::take(&BUDGET).unwrap());
        assert!(SocketSlot::take(&BUDGET).is_none(), "the share is 2");
        assert_eq!(BUDGET.open.load(Ordering::Relaxed), 2);
        drop(a);
        let c = SocketSlot::take(&BUDGET).expect("room again");
        drop((b, c));
        assert_eq!(BUDGET.open.load(Ordering::Relaxed), 0);
    }
}
