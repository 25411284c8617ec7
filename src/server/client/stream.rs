//! Answers read as they come (a relayed event stream): [`Pool::stream`] sends one request on a
//! connection of its own and returns at the answer's head; [`Streamed::next`] hands out the
//! body piece by piece, chunked, by length or until the close, within the pool's bound.

use std::net::SocketAddr;
use std::time::Duration;

use monoio::io::AsyncWriteRentExt;

use super::error::{ClientError, Failed};
use super::pool::Pool;
use super::read::{owned_headers, read, MAX_HEAD, MAX_HEADERS, READ_CHUNK};
use super::sockets::Conn;
use super::url::Url;
use crate::http::client::{parse_response_head, write_request, ResponseBody};
use crate::http::{ChunkedLimits, ChunkedScanner, Status};
use crate::server::deadline::within;

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
}
