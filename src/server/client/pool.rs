//! The request path: [`Pool`], keep-alive connections by origin on one shard, and
//! [`Pool::send`], one request and its whole (bounded) [`Answer`], each step under the
//! deadline; new connections are opened here, TLS for https (`tls::connect`).

use std::cell::RefCell;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use monoio::io::AsyncWriteRentExt;
use monoio::net::TcpStream;

use super::error::{ClientError, Failed};
use super::read::{owned_headers, read, MAX_HEAD, MAX_HEADERS, READ_CHUNK};
use super::sockets::{Conn, SocketSlot, SOCKETS};
use super::url::Url;
use crate::http::client::{parse_response_head, write_request, ResponseBody};
use crate::http::{ChunkedLimits, ChunkedScanner, Status};
use crate::server::deadline::within;
use crate::server::stream::Stream;

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

/// Keep-alive connections by origin, on one shard. An idle connection stays until it is reused
/// (a stale one is then replaced) or [`Pool::close_idle`] closes it: its user bounds the
/// origins it calls (a webhook session has a pool of its own, for its one sink) and closes
/// what stays idle.
pub struct Pool {
    /// By origin (https?, address): connections and since when they are idle.
    pub(super) idle: RefCell<HashMap<Origin, Vec<(Conn, std::time::Instant)>>>,
    max_idle: usize,
    pub(super) max_body: usize,
    /// For https (none: https URLs fail to connect).
    tls: Option<Arc<rustls::ClientConfig>>,
}

/// Where a pooled connection goes: https or not, and the address.
type Origin = (bool, SocketAddr);

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

    /// A new connection to `url` at `addr` (TLS for https).
    pub(super) async fn connect(&self, url: &Url, addr: SocketAddr, timeout: Duration) -> Result<Conn, ClientError> {
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
                match crate::server::tls::connect(tcp, name, config.clone(), timeout).await {
                    Ok(t) => Ok(Stream::Tls(Box::new(t))),
                    Err(e) if e.kind() == std::io::ErrorKind::TimedOut => Err(ClientError::TimedOut(timeout)),
                    Err(e) => Err(ClientError::Connect(format!("TLS: {e}"))),
                }
            }
        }
    }
}
