//! Drives one HTTP/1.1 connection: read, parse, hand complete requests to a [`Handler`], write
//! responses in request order.
//!
//! Pipelined requests already in the buffer are handled before the responses are flushed, so a
//! pipelining client gets one write for many responses (at most [`OUT_HIGH_WATER`] bytes of them
//! are gathered before a flush). Memory per connection is bounded: the bytes of one request never
//! exceed [`Limits::request_budget`] (framing included; 413 beyond), and every write must make
//! progress within `write_timeout` or the connection is closed. Runs on the shard that accepted
//! the socket; never blocks it.

use std::borrow::Cow;
use std::future::Future;
use std::time::Duration;

use monoio::buf::IoBuf;
use monoio::buf::IoBufMut;
use monoio::io::{AsyncReadRent, AsyncWriteRent};

use super::stream::Stream;
use super::tls::PeerCert;
use super::upgrade::{Response, Upgrade};
use crate::http::{self, parse_head_into, BodyKind, ChunkedLimits, ChunkedScanner, Head, Limits, Status, StatusCode};

/// One complete request, borrowed from the connection's buffer.
pub struct Request<'a> {
    pub head: &'a Head,
    pub buf: &'a [u8],
    pub body: &'a [u8],
    /// The request target as text, taken once (every query parameter asked reads it).
    target: &'a str,
    /// The connection it came on, for [`Request::peer_gone`].
    stream: &'a Stream,
}

impl<'a> Request<'a> {
    pub fn method(&self) -> http::Method {
        self.head.method
    }

    /// The request target (path and query) as sent.
    pub fn target(&self) -> &'a str {
        self.target
    }

    /// The path without the query string.
    pub fn path(&self) -> &'a str {
        let t = self.target;
        query_start(t).map_or(t, |q| &t[..q])
    }

    /// A query parameter, percent-decoded; `None` if absent or not UTF-8 (then a later one of
    /// the same name is taken).
    pub fn query(&self, name: &str) -> Option<Cow<'a, str>> {
        query_param(self.target, name)
    }

    pub fn header(&self, name: &str) -> Option<&'a [u8]> {
        self.head.header(self.buf, name)
    }

    pub fn headers(&self) -> impl Iterator<Item = (&'a str, &'a [u8])> + '_ {
        self.head.headers(self.buf)
    }

    /// Resolves once the client has closed or reset the connection: a handler that waits
    /// long for something (a reply) races this to stop waiting for nobody.
    pub async fn peer_gone(&self) {
        self.stream.peer_gone().await
    }
}

/// Where `target`'s query starts (its `?`). Scanned as bytes: `str::find` with a `char` took
/// about 200 instructions for a publish's target of a few dozen bytes.
fn query_start(target: &str) -> Option<usize> {
    target.as_bytes().iter().position(|&b| b == b'?')
}

/// Parameter `name` of `target`'s query (see [`Request::query`]). Scanned as bytes: a publish
/// asks for two or three.
fn query_param<'a>(target: &'a str, name: &str) -> Option<Cow<'a, str>> {
    let at = |from: usize, byte: u8| target.as_bytes()[from..].iter().position(|&b| b == byte).map(|n| from + n);
    let mut start = query_start(target)? + 1;
    loop {
        let end = at(start, b'&').unwrap_or(target.len());
        let pair = &target[start..end];
        let (key, value) = match pair.bytes().position(|b| b == b'=') {
            Some(eq) => (&pair[..eq], &pair[eq + 1..]),
            None => (pair, ""),
        };
        if key == name {
            if let Some(v) = percent_decode(value) {
                return Some(v);
            }
        }
        if end == target.len() {
            return None;
        }
        start = end + 1;
    }
}

fn percent_decode(s: &str) -> Option<Cow<'_, str>> {
    if !s.bytes().any(|b| b == b'%' || b == b'+') {
        return Some(Cow::Borrowed(s));
    }
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'%' => {
                let hex = std::str::from_utf8(b.get(i + 1..i + 3)?).ok()?;
                out.push(u8::from_str_radix(hex, 16).ok()?);
                i += 3;
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            c => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8(out).ok().map(Cow::Owned)
}

/// Who is at the other end of a connection, as the transport knows it.
#[derive(Debug, Clone, Default)]
pub struct Peer {
    pub addr: Option<std::net::SocketAddr>,
    /// The client certificate a mutual-TLS handshake verified.
    pub cert: Option<PeerCert>,
}

/// What a listener does with requests.
pub trait Handler {
    /// What the handler keeps per connection (who the client proved to be, say).
    type Conn;

    /// The state of a new connection from `peer`.
    fn connect(&self, peer: Peer) -> Self::Conn;

    fn handle(&self, conn: &mut Self::Conn, req: Request<'_>) -> impl Future<Output = Response>;

    /// Takes the connection over after a `101` answered with `upgrade`; `buf` holds the bytes
    /// already read past the request. Spawns whatever serves it from now on (so the HTTP
    /// connection's state is freed) and hands it `guard`, which counts the connection as open
    /// until dropped.
    /// `conn` comes along: what it holds for the connection (a tenant's connection slot, say)
    /// is held until the session ends.
    fn upgraded(
        &self,
        conn: Self::Conn,
        upgrade: Upgrade,
        stream: Stream,
        buf: Vec<u8>,
        limits: ConnLimits,
        guard: ConnGuard,
    );

    /// The connection refused a request it could not take (framing, a limit, a timeout) and
    /// closes after this status; for the metrics.
    fn refused(&self, _status: StatusCode) {}

    /// A request took `cost` of the core (over [`crate::task::HEAVY`]): the connection now
    /// waits in the heavy lane; for the metrics.
    fn heavy(&self, _cost: Duration) {}
}

/// Accounts for one open connection: runs its closing action when dropped, by whichever task
/// holds the socket last.
pub struct ConnGuard(Option<Box<dyn FnOnce()>>);

impl ConnGuard {
    pub fn new(on_close: impl FnOnce() + 'static) -> Self {
        ConnGuard(Some(Box::new(on_close)))
    }
}

impl Drop for ConnGuard {
    fn drop(&mut self) {
        if let Some(f) = self.0.take() {
            f();
        }
    }
}

/// Per-connection settings.
#[derive(Debug, Clone, Copy)]
pub struct ConnLimits {
    pub http: Limits,
    pub header_read_timeout: Duration,
    pub idle_timeout: Duration,
    /// A response write that makes no progress for this long closes the connection.
    pub write_timeout: Duration,
    /// Largest WebSocket message accepted (1009 beyond).
    pub ws_max_message: usize,
    /// Delivery sessions gather events this long before a write.
    pub delivery_linger: Duration,
}

const READ_CHUNK: usize = 16 * 1024;
/// What a connection's first read takes at most (see `serve_metered`).
const FIRST_READ: usize = 2048;

/// Responses gathered for pipelined requests are flushed once they reach this many bytes, so a
/// client that pipelines without reading holds at most this much (plus one response) of ours.
pub const OUT_HIGH_WATER: usize = 64 * 1024;

pub(crate) enum ReadOutcome {
    Data,
    Closed,
    TimedOut,
}

/// Reads more bytes onto the end of `buf`. On `TimedOut` the read was cancelled and `buf` is
/// left empty (the cancelled operation owned it); callers only close the connection then.
pub(crate) async fn read_more<R: AsyncReadRent>(stream: &mut R, buf: &mut Vec<u8>, timeout: Duration) -> ReadOutcome {
    read_more_sized(stream, buf, Some(timeout), READ_CHUNK).await
}

/// [`read_more`] with room for at least `chunk` more bytes: long-lived, mostly idle
/// connections (WebSocket sessions) read in small chunks to keep their memory small.
/// `timeout: None` waits for as long as the peer stays silent (no timer entry at all).
pub(crate) async fn read_more_sized<R: AsyncReadRent>(
    stream: &mut R,
    buf: &mut Vec<u8>,
    timeout: Option<Duration>,
    chunk: usize,
) -> ReadOutcome {
    buf.reserve(chunk);
    let len = buf.len();
    let cap = buf.capacity();
    let owned = std::mem::take(buf);
    let read = stream.read(owned.slice_mut(len..cap));
    let (res, slice) = match timeout {
        Some(t) => match super::deadline::within(t, read).await {
            Err(_) => return ReadOutcome::TimedOut,
            Ok(r) => r,
        },
        None => read.await,
    };
    *buf = slice.into_inner();
    match res {
        Ok(0) | Err(_) => ReadOutcome::Closed,
        Ok(_) => ReadOutcome::Data,
    }
}

/// Reads at most `max` more bytes onto the end of `buf` (so the caller can keep a hard bound on
/// what it buffers); otherwise as [`read_more`].
pub(crate) async fn read_at_most<R: AsyncReadRent>(
    stream: &mut R,
    buf: &mut Vec<u8>,
    timeout: Duration,
    max: usize,
) -> ReadOutcome {
    buf.reserve(max);
    let len = buf.len();
    let owned = std::mem::take(buf);
    let read = stream.read(owned.slice_mut(len..len + max));
    let (res, slice) = match super::deadline::within(timeout, read).await {
        Err(_) => return ReadOutcome::TimedOut,
        Ok(r) => r,
    };
    *buf = slice.into_inner();
    match res {
        Ok(0) | Err(_) => ReadOutcome::Closed,
        Ok(_) => ReadOutcome::Data,
    }
}

/// Writes all of `out` and clears it. `false` if the peer is gone, or if one write made no
/// progress within `timeout` (a client that stopped reading): the caller then drops the
/// connection, and with it what was not written.
pub(crate) async fn flush(stream: &mut Stream, out: &mut Vec<u8>, timeout: Duration) -> bool {
    if out.is_empty() {
        return true;
    }
    let mut written = 0;
    if let Stream::Plain(tcp) = stream {
        // What the socket takes now is sent at once (`MSG_DONTWAIT`): no write is posted to the
        // ring, so under io_uring the answer does not wait for the end of the runtime's round
        // of tasks to be submitted, and no completion wakes this task again. A socket that
        // takes no more (or fails) gets the posted write below, which waits or says why.
        let fd = std::os::fd::AsRawFd::as_raw_fd(tcp);
        while written < out.len() {
            match crate::sys::send_now(fd, &out[written..]) {
                Ok(n) => written += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(_) => break,
            }
        }
    }
    let mut buf = std::mem::take(out);
    while written < buf.len() {
        let Ok((res, slice)) = super::deadline::within(timeout, stream.write(buf.slice(written..))).await else {
            return false;
        };
        buf = slice.into_inner();
        match res {
            Ok(0) => return false,
            Ok(n) => written += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => return false,
        }
    }
    buf.clear();
    *out = buf;
    true
}

/// Answers `response` and closes without resetting: the write side is shut, then whatever the
/// client is still sending (a body we refused) is read and dropped for a bounded time and size,
/// so the client reads the response instead of a connection reset.
pub(crate) async fn close_with(mut stream: Stream, out: &mut Vec<u8>, response: Response, write_timeout: Duration) {
    response.write(out, false, false);
    if !flush(&mut stream, out, write_timeout).await {
        return;
    }
    let _ = stream.shutdown().await;
    let deadline = std::time::Instant::now() + Duration::from_secs(2);
    let mut sink = Vec::new();
    let mut drained = 0usize;
    let mut turns = 0;
    while drained < 4 << 20 {
        take_turn(&mut turns).await;
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        sink.clear();
        match read_more(&mut stream, &mut sink, left).await {
            ReadOutcome::Data => drained += sink.len(),
            ReadOutcome::Closed | ReadOutcome::TimedOut => return,
        }
    }
}

/// Counts one read or request of a connection, yielding the core every `task::TURN` of them.
async fn take_turn(turns: &mut u32) {
    *turns = turns.wrapping_add(1);
    if *turns % crate::task::TURN == 0 {
        crate::task::yield_now().await;
    }
}

/// How the body of the request being read is delimited.
enum Framing {
    Length(usize),
    /// Scanned (and decoded into the connection's `chunked_body`) as it arrives.
    Chunked(ChunkedScanner),
}

/// Serves requests on `stream` until the client closes, an error closes it, or it idles out.
///
/// The connection's use of the core is metered: after a request that took more than
/// [`crate::task::HEAVY`] of it, the connection waits its turn in the shard's heavy lane before
/// reading on (and so does a new connection while that lane is busy), so clients of costly
/// requests share what light requests leave of the core.
pub async fn serve<H: Handler>(stream: Stream, peer: Peer, handler: &H, limits: ConnLimits, guard: ConnGuard) {
    let meter = crate::task::Meter::default();
    let conn = handler.connect(peer);
    crate::task::metered(&meter, serve_metered(stream, conn, handler, limits, guard, &meter)).await;
    // What the connection's last, unfinished or refused request took (a body streamed until it
    // was over its budget): a client refused on every connection pays all the same.
    charge_heavy(handler, &meter);
}

/// [`serve`] over TLS: the handshake first (within `header_read_timeout`), metered like a
/// request, so a flood of handshakes (each a signature and a key exchange) waits its turn in
/// the heavy lane like any costly request, and a new connection waits before its handshake
/// while that lane is busy.
pub async fn serve_tls<H: Handler>(
    tcp: monoio::net::TcpStream,
    tls: &super::tls::TlsAcceptor,
    addr: Option<std::net::SocketAddr>,
    handler: &H,
    limits: ConnLimits,
    guard: ConnGuard,
) {
    if crate::task::lane_busy() {
        crate::task::turn().await;
    }
    let meter = crate::task::Meter::default();
    let accepted = crate::task::metered(&meter, tls.accept(tcp, limits.header_read_timeout)).await;
    charge_heavy(handler, &meter);
    if let Ok((stream, cert)) = accepted {
        serve(Stream::Tls(Box::new(stream)), Peer { addr, cert }, handler, limits, guard).await;
    }
}

/// Charges what the connection took since the last call to the heavy lane if that is over
/// [`crate::task::HEAVY`]; says whether it was.
fn charge_heavy<H: Handler>(handler: &H, meter: &crate::task::Meter) -> bool {
    let cost = meter.take();
    let heavy = cost > crate::task::HEAVY;
    if heavy {
        handler.heavy(cost);
        crate::task::charge(cost);
    }
    heavy
}

async fn serve_metered<H: Handler>(
    mut stream: Stream,
    mut conn: H::Conn,
    handler: &H,
    limits: ConnLimits,
    guard: ConnGuard,
    meter: &crate::task::Meter,
) {
    // While costly requests are over their share of the core, a new connection may be one more
    // costly client (one request per connection gets no second turn to wait for): it waits its
    // turn first. Its request waits in the kernel meanwhile, holding nothing of ours.
    // `waited`: the next request comes out of the heavy lane, and is handled as such.
    let mut waited = false;
    if crate::task::lane_busy() {
        crate::task::turn().await;
        waited = true;
    }
    let wt = limits.write_timeout;
    let budget = limits.http.request_budget();
    let mut buf: Vec<u8> = Vec::new();
    let mut out: Vec<u8> = Vec::new();
    let mut chunked_body: Vec<u8> = Vec::new();
    // Reads and requests taken in a row: every `task::TURN` of them the connection yields, so a
    // client whose input is always waiting (on epoll a ready read never waits) cannot hold the core.
    let mut turns: u32 = 0;
    // The whole of a request must arrive within header_read_timeout of its first byte, however
    // it is trickled in: a per-read timeout alone would let a slow client hold the slot forever.
    let mut deadline: Option<std::time::Instant> = None;
    let remaining = |deadline: &mut Option<std::time::Instant>| {
        // Set from the clock (the sweep's reading can be a stall old: the deadline would come
        // early); measured with the sweep's, a tick late at most, and no clock read per read.
        let d = *deadline.get_or_insert_with(|| std::time::Instant::now() + limits.header_read_timeout);
        d.saturating_duration_since(super::deadline::now())
    };
    // While a request is incomplete every byte of `buf` is part of it, and the parsers refuse it
    // once it is over the budget: reading at most one byte past the budget bounds the buffer.
    // (Up to the spare capacity, as `read_more` does, so large bodies take few reads.)
    // A connection's first read takes at most FIRST_READ: most first requests (a WebSocket or
    // SSE upgrade, a small publish) fit, and a connection that becomes a long-lived session
    // never held (and left behind in the allocator, fragmented) a full READ_CHUNK.
    let room = |buf: &Vec<u8>| {
        let spare = match buf.capacity() {
            0 => FIRST_READ,
            cap => READ_CHUNK.max(cap - buf.len()),
        };
        (budget + 1).saturating_sub(buf.len()).min(spare).max(1)
    };
    // The last head's header list, for the next head to fill (no allocation per request).
    let mut spare_headers = Vec::new();
    // A new plain connection's first bytes are taken by readiness: nothing is posted, and no
    // buffer held, while the client has sent nothing, and what it sent lands in a buffer of its
    // size (a WebSocket upgrade keeps its few hundred bytes, not FIRST_READ). Thousands of
    // clients connecting at once each hold only their task until they speak.
    if let Stream::Plain(tcp) = &stream {
        match super::deadline::within(limits.idle_timeout, tcp.readable(false)).await {
            Ok(Ok(())) => {
                let fd = std::os::fd::AsRawFd::as_raw_fd(tcp);
                buf.reserve_exact(crate::sys::readable_bytes(fd).clamp(1, FIRST_READ));
                // WouldBlock (nothing after all) or an error: the loop's read below says.
                if let Ok(0) = crate::sys::recv_now(fd, &mut buf) {
                    return;
                }
            }
            // Silent for the idle timeout, or the socket failed: closed, nothing to answer.
            _ => return,
        }
    }
    loop {
        // Parse the next head, reading until one is complete.
        let head = loop {
            match parse_head_into(&buf, &limits.http, &mut spare_headers) {
                Ok(Status::Complete(h)) => break h,
                Ok(Status::Partial) => {
                    if !flush(&mut stream, &mut out, wt).await {
                        return;
                    }
                    // A timed-out read keeps the buffer it was given, so decide before reading.
                    let started = !buf.is_empty();
                    let timeout = if started { remaining(&mut deadline) } else { limits.idle_timeout };
                    let max = room(&buf);
                    take_turn(&mut turns).await;
                    match read_at_most(&mut stream, &mut buf, timeout, max).await {
                        ReadOutcome::Data => {}
                        ReadOutcome::Closed => return,
                        ReadOutcome::TimedOut => {
                            if started {
                                let r = http::problem(StatusCode::REQUEST_TIMEOUT, "request not received in time");
                                handler.refused(r.status);
                                close_with(stream, &mut out, r, wt).await;
                            }
                            return;
                        }
                    }
                }
                Err(e) => {
                    handler.refused(e.status);
                    return close_with(stream, &mut out, http::problem(e.status, e.detail), wt).await;
                }
            }
        };
        // Then its body. A chunked one is scanned (and decoded into `chunked_body`) as it
        // arrives, each byte once.
        let mut continue_sent = false;
        let mut framing = match head.body {
            BodyKind::Length(n) => Framing::Length(n),
            BodyKind::Chunked => {
                chunked_body.clear();
                Framing::Chunked(ChunkedScanner::new(ChunkedLimits::for_request(&limits.http, head.len)))
            }
        };
        let (body_range, consumed) = loop {
            let avail = &buf[head.len..];
            let done = match &mut framing {
                Framing::Length(n) if avail.len() >= *n => Some((head.len..head.len + *n, head.len + *n)),
                Framing::Length(_) => None,
                Framing::Chunked(scanner) => match scanner.scan(avail, &mut chunked_body) {
                    Ok(Status::Complete(end)) => Some((0..0, head.len + end.consumed)),
                    Ok(Status::Partial) => None,
                    Err(e) => {
                        handler.refused(e.status);
                        return close_with(stream, &mut out, http::problem(e.status, e.detail), wt).await;
                    }
                },
            };
            if let Some(d) = done {
                break d;
            }
            if head.expect_continue && !continue_sent {
                out.extend_from_slice(b"HTTP/1.1 100 Continue\r\n\r\n");
                continue_sent = true;
            }
            if !flush(&mut stream, &mut out, wt).await {
                return;
            }
            let max = room(&buf);
            take_turn(&mut turns).await;
            match read_at_most(&mut stream, &mut buf, remaining(&mut deadline), max).await {
                ReadOutcome::Data => {}
                ReadOutcome::Closed => return,
                ReadOutcome::TimedOut => {
                    let r = http::problem(StatusCode::REQUEST_TIMEOUT, "request body not received in time");
                    handler.refused(r.status);
                    return close_with(stream, &mut out, r, wt).await;
                }
            }
        };
        let body: &[u8] = match framing {
            Framing::Length(_) => &buf[body_range],
            Framing::Chunked(_) => &chunked_body,
        };
        let mut keep_alive = head.keep_alive;
        let head_only = head.method == http::Method::Head;
        let handling = std::mem::take(&mut waited).then(crate::task::handling);
        // Boxed: the handler's future (every endpoint's state) is most of a connection's, and
        // unboxed it would be held by every open connection, idle or waiting for its first
        // request, rather than only while a request is handled.
        let req = Request { head: &head, buf: &buf, body, target: head.target(&buf), stream: &stream };
        // Made in its box: built on the stack and moved, its kilobytes were copied per request.
        let response = Box::into_pin(crate::sys::boxed_in_place(|| handler.handle(&mut conn, req))).await;
        drop(handling);
        // A response that closes (a requester seen gone while it waited): nothing pipelined
        // behind it runs.
        keep_alive &= !response.closes();
        response.write(&mut out, keep_alive, head_only);
        buf.drain(..consumed);
        deadline = None;
        // Charged whatever comes next (an upgrade, a close): a client that opens a connection
        // per costly request pays all the same, and new connections wait while it owes.
        let heavy = charge_heavy(handler, meter);
        if let Some(upgrade) = response.upgrade {
            if !flush(&mut stream, &mut out, wt).await {
                return;
            }
            // The connection may now live for days: free what only HTTP needed.
            drop((head, out, chunked_body));
            return handler.upgraded(conn, upgrade, stream, buf, limits, guard);
        }
        spare_headers = head.headers;
        if !keep_alive {
            // Shut, not just dropped: a TLS client reads close_notify, not a truncation.
            if flush(&mut stream, &mut out, wt).await {
                let _ = stream.shutdown().await;
            }
            return;
        }
        // A client that pipelines without reading gets its answers pushed (and, if it still
        // does not read, the write timeout) before more of its requests are taken in; after a
        // heavy request it is answered before it waits its turn.
        if (heavy || out.len() >= OUT_HIGH_WATER) && !flush(&mut stream, &mut out, wt).await {
            return;
        }
        // Keep idle buffers small: a burst of large bodies must not pin memory forever (nor
        // while the connection waits in the heavy lane, pipelined bytes or not).
        if buf.capacity() > 4 * READ_CHUNK {
            buf.shrink_to(buf.len().max(READ_CHUNK));
        }
        if chunked_body.capacity() > 4 * READ_CHUNK {
            chunked_body = Vec::new();
        }
        if spare_headers.capacity() > 32 {
            spare_headers = Vec::new();
        }
        if out.is_empty() && out.capacity() > 4 * READ_CHUNK {
            out = Vec::new();
        }
        if heavy {
            crate::task::turn().await;
            waited = true;
        } else {
            take_turn(&mut turns).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::query_param;

    #[test]
    fn a_query_parameter_is_its_first_decodable_value_by_exact_name() {
        let q = |t, n| query_param(t, n).map(|v| v.into_owned());
        assert_eq!(q("/p?topic=orders&key=k1", "topic").as_deref(), Some("orders"));
        assert_eq!(q("/p?topic=orders&key=k1", "key").as_deref(), Some("k1"));
        assert_eq!(q("/p?a&b=c", "a").as_deref(), Some(""), "no '=': empty, the next pair's not taken");
        assert_eq!(q("/p?a&b=c", "b").as_deref(), Some("c"));
        assert_eq!(q("/p?topics=x&topic=y", "topic").as_deref(), Some("y"), "names match whole");
        assert_eq!(q("/p?t=a%2Fb+c", "t").as_deref(), Some("a/b c"));
        assert_eq!(q("/p?t=%zz&t=ok", "t").as_deref(), Some("ok"), "an undecodable one is passed over");
        assert_eq!(q("/p?t=%ff", "t"), None, "not UTF-8");
        assert_eq!(q("/p?x=1&", "t"), None);
        assert_eq!(q("/p?", "t"), None);
        assert_eq!(q("/p", "t"), None);
        assert_eq!(q("/p?=v&t=", "").as_deref(), Some("v"));
        assert_eq!(q("/p?t=", "t").as_deref(), Some(""));
    }
}
