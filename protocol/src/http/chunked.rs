//! Chunked transfer coding (RFC 9112 section 7.1) as a resumable, strictly linear scanner.
//!
//! The connection keeps one [`ChunkedScanner`] per request and calls [`ChunkedScanner::scan`]
//! with the encoded body read so far (the same bytes as the call before, plus whatever arrived
//! since). The scanner remembers how far it got, so no byte is looked at again: each byte of
//! framing is searched for its line end once and checked once, each byte of data is copied out
//! once, into the caller's output. Its state only moves over complete syntax (a whole chunk-size
//! line, data bytes, the CRLF after data, a whole trailer line); the one thing it keeps about an
//! incomplete line is where the search for its LF stopped. `Partial` consumes nothing: the
//! caller keeps every byte.
//!
//! Strict framing: every line ends in CRLF (a bare LF, or a CR anywhere else, is 400), chunk
//! extensions follow the RFC's grammar, trailer lines are field lines. Four budgets bound what a
//! client can make us hold: decoded data (`max_data`, 413), chunk extensions in total
//! (`max_extensions`, 413), trailer fields in total (`max_trailers`, 431), and the raw encoded
//! body, framing included (`max_raw`, 413). Each is checked as soon as a prefix proves it
//! exceeded, so any chunking of the input gives the same answer.

use super::parse::{is_tchar, is_value_char};
use super::{HttpError, Limits, Status, StatusCode};

/// Where a complete chunked body ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkedEnd {
    /// Bytes the encoded body takes, trailers included.
    pub consumed: usize,
    /// Sum of the chunk sizes: bytes appended to the output.
    pub data_len: usize,
}

/// The budgets of one chunked body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkedLimits {
    /// Decoded bytes (413 beyond).
    pub max_data: usize,
    /// Bytes of chunk extensions, all chunks together (413 beyond).
    pub max_extensions: usize,
    /// Bytes of trailer field lines, CRLFs not counted (431 beyond).
    pub max_trailers: usize,
    /// Raw bytes of the encoded body: sizes, extensions, data, CRLFs, trailers (413 beyond).
    pub max_raw: usize,
}

impl ChunkedLimits {
    /// The budgets of a body whose head took `head_len` bytes: extensions and trailers get
    /// `max_header_bytes` each, and the whole request, head included, fits
    /// [`Limits::request_budget`].
    pub fn for_request(limits: &Limits, head_len: usize) -> Self {
        ChunkedLimits {
            max_data: limits.max_body_bytes,
            max_extensions: limits.max_header_bytes,
            max_trailers: limits.max_header_bytes,
            max_raw: limits.request_budget().saturating_sub(head_len),
        }
    }
}

/// Hex digits a chunk size may have (60 bits: no overflow, far above any body limit).
const MAX_SIZE_DIGITS: usize = 15;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Expecting a chunk-size line.
    Size,
    /// Inside chunk data, this many bytes still to come.
    Data(usize),
    /// Expecting the CRLF after chunk data.
    DataEnd,
    /// Expecting a trailer field line or the empty line that ends the body.
    Trailer,
    Done,
}

/// Scans (and decodes) one chunked body across as many calls as the network takes.
#[derive(Debug, Clone)]
pub struct ChunkedScanner {
    limits: ChunkedLimits,
    state: State,
    /// Bytes of the encoded body accounted for: everything before is validated.
    pos: usize,
    /// Where the search for the current line's LF resumes (`pos <= search`).
    search: usize,
    data_len: usize,
    ext_bytes: usize,
    trailer_bytes: usize,
    /// Bytes looked at, all calls together (see [`ChunkedScanner::bytes_examined`]).
    examined: usize,
    failed: Option<HttpError>,
}

fn too_large(detail: &'static str) -> HttpError {
    HttpError::new(StatusCode::PAYLOAD_TOO_LARGE, detail)
}

impl ChunkedScanner {
    /// A scanner at the start of a chunked body, held to `limits`.
    pub fn new(limits: ChunkedLimits) -> Self {
        ChunkedScanner {
            limits,
            state: State::Size,
            pos: 0,
            search: 0,
            data_len: 0,
            ext_bytes: 0,
            trailer_bytes: 0,
            examined: 0,
            failed: None,
        }
    }

    /// Bytes examined so far, all calls together: at most a small constant times the bytes
    /// given, however finely they were split (the linearity the tests and the fuzz target check).
    pub fn bytes_examined(&self) -> usize {
        self.examined
    }

    /// Continues scanning `buf`, the encoded body from its first byte (what the previous call was
    /// given, plus more). Appends newly complete chunk data to `out` (the same vector every
    /// call). After an error, every later call returns the same error; after `Complete`, the
    /// same `Complete`.
    pub fn scan(&mut self, buf: &[u8], out: &mut Vec<u8>) -> Result<Status<ChunkedEnd>, HttpError> {
        if let Some(e) = &self.failed {
            return Err(e.clone());
        }
        let r = self.step(buf, out);
        if let Err(e) = &r {
            self.failed = Some(e.clone());
        }
        r
    }

    fn step(&mut self, buf: &[u8], out: &mut Vec<u8>) -> Result<Status<ChunkedEnd>, HttpError> {
        // Only the first max_raw bytes can belong to an acceptable body; what lies beyond is
        // never looked at, so a prefix and the whole input get the same answer.
        let win = &buf[..buf.len().min(self.limits.max_raw)];
        if win.len() < self.pos {
            return Ok(Status::Partial);
        }
        loop {
            match self.state {
                State::Size => {
                    let max = MAX_SIZE_DIGITS + (self.limits.max_extensions - self.ext_bytes);
                    let Some(end) = self.line(win, max, too_large("chunk extensions too large"))? else { break };
                    let line = &win[self.pos..end];
                    self.examined += line.len();
                    let digits = line.iter().position(|b| !b.is_ascii_hexdigit()).unwrap_or(line.len());
                    if digits == 0 || digits > MAX_SIZE_DIGITS {
                        return Err(HttpError::bad("invalid chunk size"));
                    }
                    let ext = &line[digits..];
                    check_extensions(ext)?;
                    self.ext_bytes += ext.len();
                    if self.ext_bytes > self.limits.max_extensions {
                        return Err(too_large("chunk extensions too large"));
                    }
                    let mut size = 0u64;
                    for &b in &line[..digits] {
                        size = size << 4 | u64::from((b as char).to_digit(16).unwrap_or(0));
                    }
                    if size > (self.limits.max_data - self.data_len) as u64 {
                        return Err(too_large("request body too large"));
                    }
                    let size = size as usize;
                    self.data_len += size;
                    self.advance(end + 2);
                    self.state = if size == 0 { State::Trailer } else { State::Data(size) };
                }
                State::Data(left) => {
                    let take = left.min(win.len() - self.pos);
                    out.extend_from_slice(&win[self.pos..self.pos + take]);
                    self.examined += take;
                    self.advance(self.pos + take);
                    if take < left {
                        self.state = State::Data(left - take);
                        break;
                    }
                    self.state = State::DataEnd;
                }
                State::DataEnd => {
                    let rest = &win[self.pos..win.len().min(self.pos + 2)];
                    self.examined += rest.len();
                    match rest {
                        b"\r\n" => {
                            self.advance(self.pos + 2);
                            self.state = State::Size;
                        }
                        [] | b"\r" => break,
                        [b'\n', ..] | [b'\r', _] => return Err(HttpError::bad("bare LF or CR in chunked framing")),
                        _ => return Err(HttpError::bad("chunk data not followed by CRLF")),
                    }
                }
                State::Trailer => {
                    let max = self.limits.max_trailers - self.trailer_bytes;
                    let too_big = HttpError::new(StatusCode::HEADERS_TOO_LARGE, "trailers too large");
                    let Some(end) = self.line(win, max, too_big)? else { break };
                    let line = &win[self.pos..end];
                    self.examined += line.len();
                    if line.is_empty() {
                        self.advance(end + 2);
                        self.state = State::Done;
                        continue;
                    }
                    // A second pass: the colon, then name and value.
                    self.examined += line.len();
                    check_trailer(line)?;
                    self.trailer_bytes += line.len();
                    self.advance(end + 2);
                }
                State::Done => {
                    return Ok(Status::Complete(ChunkedEnd { consumed: self.pos, data_len: self.data_len }));
                }
            }
        }
        if buf.len() > self.limits.max_raw {
            return Err(too_large("request too large"));
        }
        Ok(Status::Partial)
    }

    fn advance(&mut self, to: usize) {
        self.pos = to;
        self.search = to;
    }

    /// Finds the line starting at `pos`, resuming the search where the last call stopped.
    /// Returns where its content ends (at the CR of its CRLF), or `None` while incomplete. The
    /// first CR or LF of a line must be its CRLF: a bare LF, or a CR followed by anything but LF,
    /// is 400 as soon as it is seen. Content over `max` bytes is `too_long`, complete or not.
    fn line(&mut self, win: &[u8], max: usize, too_long: HttpError) -> Result<Option<usize>, HttpError> {
        let Some(i) = memchr::memchr2(b'\r', b'\n', &win[self.search..]) else {
            self.examined += win.len() - self.search;
            self.search = win.len();
            if win.len() - self.pos > max {
                return Err(too_long);
            }
            return Ok(None);
        };
        let at = self.search + i;
        self.examined += i + 1;
        if at - self.pos > max {
            return Err(too_long);
        }
        if win[at] == b'\n' {
            return Err(HttpError::bad("bare LF in chunked framing"));
        }
        match win.get(at + 1) {
            Some(b'\n') => Ok(Some(at)),
            Some(_) => Err(HttpError::bad("bare CR in chunked framing")),
            None => {
                // The CR is looked at again when the next byte arrives.
                self.search = at;
                Ok(None)
            }
        }
    }
}

fn skip_ws(b: &[u8], mut i: usize) -> usize {
    while i < b.len() && (b[i] == b' ' || b[i] == b'\t') {
        i += 1;
    }
    i
}

fn skip_token(b: &[u8], mut i: usize) -> usize {
    while i < b.len() && is_tchar(b[i]) {
        i += 1;
    }
    i
}

/// `*( BWS ";" BWS chunk-ext-name [ BWS "=" BWS chunk-ext-val ] )`, where a name is a token and
/// a value a token or a quoted-string (RFC 9112 section 7.1.1). Extensions are then ignored.
fn check_extensions(ext: &[u8]) -> Result<(), HttpError> {
    let bad = HttpError::bad("invalid chunk extension");
    let mut i = 0;
    while i < ext.len() {
        i = skip_ws(ext, i);
        if ext.get(i) != Some(&b';') {
            return Err(bad);
        }
        i = skip_ws(ext, i + 1);
        let name_end = skip_token(ext, i);
        if name_end == i {
            return Err(bad);
        }
        i = name_end;
        let eq = skip_ws(ext, i);
        if ext.get(eq) != Some(&b'=') {
            continue;
        }
        i = skip_ws(ext, eq + 1);
        if ext.get(i) == Some(&b'"') {
            i = quoted_string_end(ext, i + 1).ok_or(bad.clone())?;
        } else {
            let value_end = skip_token(ext, i);
            if value_end == i {
                return Err(bad);
            }
            i = value_end;
        }
    }
    Ok(())
}

/// The index after the closing quote of a quoted-string whose content starts at `i`.
fn quoted_string_end(b: &[u8], mut i: usize) -> Option<usize> {
    // qdtext and the escapable octets: HTAB, SP, visible ASCII, obs-text; never other controls.
    let text = |c: u8| c == b'\t' || c == b' ' || (0x21..=0x7e).contains(&c) || c >= 0x80;
    while i < b.len() {
        match b[i] {
            b'"' => return Some(i + 1),
            b'\\' => {
                if !b.get(i + 1).is_some_and(|&c| text(c)) {
                    return None;
                }
                i += 2;
            }
            c if text(c) => i += 1,
            _ => return None,
        }
    }
    None
}

/// A trailer line is a field line: `field-name ":" OWS field-value OWS`. Its content is ignored.
fn check_trailer(line: &[u8]) -> Result<(), HttpError> {
    let bad = HttpError::bad("invalid trailer field");
    let colon = memchr::memchr(b':', line).ok_or(bad.clone())?;
    let name = &line[..colon];
    if name.is_empty() || !name.iter().all(|&b| is_tchar(b)) {
        return Err(bad);
    }
    if !line[colon + 1..].iter().all(|&b| is_value_char(b)) {
        return Err(bad);
    }
    Ok(())
}
