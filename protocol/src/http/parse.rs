//! The request head: request line and header fields (RFC 9112 sections 3 and 5).

use super::{HttpError, Status, StatusCode};

/// Limits applied while parsing; exceeding one is an error with its own status.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Bytes of request line plus headers (431 beyond).
    pub max_header_bytes: usize,
    /// Number of header fields (431 beyond).
    pub max_headers: usize,
    /// Body bytes (413 beyond).
    pub max_body_bytes: usize,
}

impl Limits {
    /// Raw bytes one request may take, head and body framing included (chunk sizes, extensions,
    /// CRLFs, trailers): the most a connection buffers for it. Beyond is 413.
    pub fn request_budget(&self) -> usize {
        self.max_header_bytes.saturating_add(self.max_body_bytes)
    }
}

impl Default for Limits {
    fn default() -> Self {
        Limits { max_header_bytes: 16 * 1024, max_headers: 100, max_body_bytes: 1024 * 1024 }
    }
}

/// The request method. Only the ones the broker routes on are told apart; any other valid token
/// is [`Method::Other`] (its text is [`Head::method_str`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    /// The GET method.
    Get,
    /// The HEAD method: a GET whose response is sent without its body.
    Head,
    /// The POST method.
    Post,
    /// The PUT method.
    Put,
    /// The DELETE method.
    Delete,
    /// The OPTIONS method (CORS preflight).
    Options,
    /// Any other method token (methods are case-sensitive, so `get` is one too).
    Other,
}

/// Where one header's name and value sit in the buffer (value with surrounding whitespace cut).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeaderPos {
    /// Start and end (exclusive) of the field name.
    pub name: (u32, u32),
    /// Start and end (exclusive) of the field value, without leading or trailing spaces and tabs.
    pub value: (u32, u32),
}

/// How the body is framed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyKind {
    /// A body of exactly this many bytes (`Content-Length`, or 0 without one), at most
    /// [`Limits::max_body_bytes`].
    Length(usize),
    /// `Transfer-Encoding: chunked`: read it with a [`ChunkedScanner`](super::ChunkedScanner).
    Chunked,
}

/// A parsed request head. Positions index the buffer that was parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Head {
    /// The method, as far as the broker tells methods apart.
    pub method: Method,
    /// Start and end (exclusive) of the method token.
    pub method_pos: (u32, u32),
    /// Start and end (exclusive) of the request target (path and query, visible ASCII only).
    pub target: (u32, u32),
    /// 0 for HTTP/1.0, 1 for HTTP/1.1.
    pub minor: u8,
    /// The header fields, in arrival order.
    pub headers: Vec<HeaderPos>,
    /// How the body is framed.
    pub body: BodyKind,
    /// Whether the connection may stay open after the response: HTTP/1.1 unless `Connection:
    /// close`, HTTP/1.0 only with `Connection: keep-alive`.
    pub keep_alive: bool,
    /// Whether the client sent `Expect: 100-continue` (HTTP/1.1 only) and waits for a
    /// `100 Continue` before sending the body.
    pub expect_continue: bool,
    /// Bytes taken by the head, including the blank line.
    pub len: usize,
}

impl Head {
    /// The request target (path and query) as text; `buf` is the buffer that was parsed.
    pub fn target<'b>(&self, buf: &'b [u8]) -> &'b str {
        // The parser only admits visible ASCII in the target.
        std::str::from_utf8(&buf[self.target.0 as usize..self.target.1 as usize]).unwrap_or("")
    }

    /// The method token as sent (`GET`, or an [`Method::Other`] such as `PATCH`); `buf` is the
    /// buffer that was parsed.
    pub fn method_str<'b>(&self, buf: &'b [u8]) -> &'b str {
        std::str::from_utf8(&buf[self.method_pos.0 as usize..self.method_pos.1 as usize]).unwrap_or("")
    }

    /// Iterates (name, value) pairs in arrival order.
    pub fn headers<'s, 'b: 's>(&'s self, buf: &'b [u8]) -> impl Iterator<Item = (&'b str, &'b [u8])> + 's {
        self.headers.iter().map(move |h| {
            let name = &buf[h.name.0 as usize..h.name.1 as usize];
            (std::str::from_utf8(name).unwrap_or(""), &buf[h.value.0 as usize..h.value.1 as usize])
        })
    }

    /// The first header named `name` (ASCII case-insensitive). Compared as bytes, length
    /// first (names are tokens, checked when parsed): a lookup of a header that is not there
    /// costs a length comparison per header.
    pub fn header<'b>(&self, buf: &'b [u8], name: &str) -> Option<&'b [u8]> {
        let want = name.as_bytes();
        self.headers
            .iter()
            .find(|h| {
                h.name.1 - h.name.0 == want.len() as u32
                    && buf[h.name.0 as usize..h.name.1 as usize].eq_ignore_ascii_case(want)
            })
            .map(|h| &buf[h.value.0 as usize..h.value.1 as usize])
    }
}

/// Byte classes as lookup tables: a branch per byte instead of a chain of comparisons.
const TCHAR: [bool; 256] = {
    let mut t = [false; 256];
    let mut i = 0;
    while i < 256 {
        let b = i as u8;
        t[i] = matches!(b,
            b'!' | b'#' | b'$' | b'%' | b'&' | b'\'' | b'*' | b'+' | b'-' | b'.' | b'^' | b'_' | b'`'
            | b'|' | b'~' | b'0'..=b'9' | b'a'..=b'z' | b'A'..=b'Z');
        i += 1;
    }
    t
};

const VALUE_CHAR: [bool; 256] = {
    let mut t = [false; 256];
    let mut i = 0;
    while i < 256 {
        let b = i as u8;
        t[i] = b == b'\t' || (b >= b' ' && b <= b'~') || b >= 0x80;
        i += 1;
    }
    t
};

pub(super) fn is_tchar(b: u8) -> bool {
    TCHAR[b as usize]
}

pub(super) fn is_value_char(b: u8) -> bool {
    VALUE_CHAR[b as usize]
}

/// Finds the end of the line starting at `at`: returns (content end, next line start).
/// A CR anywhere but before the LF is left in the content, where every field's character check
/// refuses it.
fn line_end(buf: &[u8], at: usize) -> Option<(usize, usize)> {
    let nl = at + memchr::memchr(b'\n', &buf[at..])?;
    let end = if nl > at && buf[nl - 1] == b'\r' { nl - 1 } else { nl };
    Some((end, nl + 1))
}

/// From `at`, the index of the first byte of `buf` that cannot stand in a field value as it is:
/// a control (HTAB, CR and LF among them) or DEL; `buf.len()` if there is none. Eight bytes at
/// a time: a field value is most of a head's bytes.
pub(super) fn value_run(buf: &[u8], mut at: usize) -> usize {
    const ONES: u64 = u64::from_le_bytes([1; 8]);
    const HIGH: u64 = ONES << 7;
    while let Some(word) = buf.get(at..at + 8) {
        let x = u64::from_le_bytes(word.try_into().expect("eight bytes"));
        // A byte's high bit is set where it is under 0x20, or is DEL (x ^ 0x7f is zero there).
        // Borrows only carry upwards from such a byte, so the lowest bit set marks the first.
        let del = x ^ (ONES * 0x7f);
        let stops = (x.wrapping_sub(ONES * 0x20) & !x | del.wrapping_sub(ONES) & !del) & HIGH;
        if stops != 0 {
            return at + (stops.trailing_zeros() / 8) as usize;
        }
        at += 8;
    }
    at + buf[at..].iter().position(|&b| b < 0x20 || b == 0x7f).unwrap_or(buf.len() - at)
}

/// Parses a request head from the start of `buf`.
pub fn parse_head(buf: &[u8], limits: &Limits) -> Result<Status<Head>, HttpError> {
    parse_head_into(buf, limits, &mut Vec::with_capacity(16))
}

/// [`parse_head`] that lists the headers in `spare` (cleared first) instead of a new vector:
/// a complete head takes it, a partial head or an error leaves it (and its room) in `spare`,
/// and a connection hands each head's list back once done with it, so its requests are parsed
/// without an allocation.
pub fn parse_head_into(buf: &[u8], limits: &Limits, spare: &mut Vec<HeaderPos>) -> Result<Status<Head>, HttpError> {
    spare.clear();
    // A head lies within the first max_header_bytes: only those are looked at. Running out of
    // them is a head still arriving, or, when more bytes came, one that is too large.
    let view = &buf[..buf.len().min(limits.max_header_bytes)];
    let more = || {
        if buf.len() > limits.max_header_bytes {
            return Err(HttpError::new(StatusCode::HEADERS_TOO_LARGE, "request head too large"));
        }
        Ok(Status::Partial)
    };
    // Tolerate empty lines before the request line (RFC 9112 section 2.2).
    let mut pos = 0;
    while pos < view.len() && (view[pos] == b'\r' || view[pos] == b'\n') {
        if view[pos] == b'\r' && view.get(pos + 1).is_some_and(|&b| b != b'\n') {
            return Err(HttpError::bad("bare CR in request head"));
        }
        pos += 1;
    }
    let Some((line_stop, mut next)) = line_end(view, pos) else {
        return more();
    };
    let line = &view[pos..line_stop];
    let sp1 = line.iter().position(|&b| b == b' ').ok_or(HttpError::bad("malformed request line"))?;
    let method_b = &line[..sp1];
    if method_b.is_empty() || !method_b.iter().all(|&b| is_tchar(b)) {
        return Err(HttpError::bad("invalid method"));
    }
    let rest = &line[sp1 + 1..];
    let sp2 = rest.iter().position(|&b| b == b' ').ok_or(HttpError::bad("malformed request line"))?;
    let target = &rest[..sp2];
    if target.is_empty() || !target.iter().all(|&b| (b'!'..=b'~').contains(&b)) {
        return Err(HttpError::bad("invalid request target"));
    }
    let minor = match &rest[sp2 + 1..] {
        b"HTTP/1.1" => 1,
        b"HTTP/1.0" => 0,
        v if v.len() == 8
            && v.starts_with(b"HTTP/")
            && v[5].is_ascii_digit()
            && v[6] == b'.'
            && v[7].is_ascii_digit() =>
        {
            return Err(HttpError::new(StatusCode::VERSION_NOT_SUPPORTED, "HTTP version not supported"))
        }
        _ => return Err(HttpError::bad("invalid HTTP version")),
    };
    let method = match method_b {
        b"GET" => Method::Get,
        b"HEAD" => Method::Head,
        b"POST" => Method::Post,
        b"PUT" => Method::Put,
        b"DELETE" => Method::Delete,
        b"OPTIONS" => Method::Options,
        _ => Method::Other,
    };
    let mut head = Head {
        method,
        method_pos: (pos as u32, (pos + sp1) as u32),
        target: ((pos + sp1 + 1) as u32, (pos + sp1 + 1 + sp2) as u32),
        minor,
        headers: Vec::new(),
        body: BodyKind::Length(0),
        keep_alive: minor == 1,
        expect_continue: false,
        len: 0,
    };
    let mut content_length: Option<usize> = None;
    let mut chunked = false;
    let mut saw_te = false;
    let mut saw_host = false;
    // Each field line is taken in one pass: its name up to the colon, then its value up to the
    // line's end. A byte that cannot be there is refused where it stands, before the line ends.
    loop {
        match view.get(next..).unwrap_or_default() {
            [] | [b'\r'] => return more(),
            [b'\n', ..] => {
                next += 1;
                break;
            }
            [b'\r', b'\n', ..] => {
                next += 2;
                break;
            }
            [b' ' | b'\t', ..] => return Err(HttpError::bad("obsolete header line folding")),
            _ => {}
        }
        let colon = next + view[next..].iter().position(|&b| !is_tchar(b)).unwrap_or(view.len() - next);
        match view.get(colon) {
            None => return more(),
            Some(b':') if colon > next => {}
            Some(b'\r' | b'\n') => return Err(HttpError::bad("header without colon")),
            Some(_) => return Err(HttpError::bad("invalid header name")),
        }
        let name = &view[next..colon];
        let mut vs = colon + 1;
        while vs < view.len() && (view[vs] == b' ' || view[vs] == b'\t') {
            vs += 1;
        }
        // The value runs to the line's end (CRLF, or a bare LF); HTAB is the one control it
        // may hold.
        let mut at = vs;
        let (mut ve, after) = loop {
            at = value_run(view, at);
            match view.get(at..).unwrap_or_default() {
                [] | [b'\r'] => return more(),
                [b'\t', ..] => at += 1,
                [b'\n', ..] => break (at, at + 1),
                [b'\r', b'\n', ..] => break (at, at + 2),
                _ => return Err(HttpError::bad("invalid header value")),
            }
        };
        while ve > vs && (view[ve - 1] == b' ' || view[ve - 1] == b'\t') {
            ve -= 1;
        }
        let value = &view[vs..ve];
        if spare.len() == limits.max_headers {
            return Err(HttpError::new(StatusCode::HEADERS_TOO_LARGE, "too many header fields"));
        }
        spare.push(HeaderPos { name: (next as u32, colon as u32), value: (vs as u32, ve as u32) });
        // Only a few names matter for framing; their lengths sort them out cheaply.
        let special = matches!(name.len(), 4 | 6 | 10 | 14 | 17);
        if !special {
            // An ordinary header: nothing more to check.
        } else if name.eq_ignore_ascii_case(b"content-length") {
            // A list of identical values is allowed (RFC 9110 section 8.6); anything else is not.
            for part in value.split(|&b| b == b',') {
                let part = part.trim_ascii();
                if part.is_empty() || part.len() > 19 || !part.iter().all(u8::is_ascii_digit) {
                    return Err(HttpError::bad("invalid Content-Length"));
                }
                // At most 19 digits: the value fits in 64 bits.
                let n = part.iter().fold(0u64, |n, &d| n * 10 + u64::from(d - b'0'));
                let n = usize::try_from(n).map_err(|_| HttpError::bad("invalid Content-Length"))?;
                if content_length.is_some_and(|c| c != n) {
                    return Err(HttpError::bad("conflicting Content-Length"));
                }
                content_length = Some(n);
            }
        } else if name.eq_ignore_ascii_case(b"transfer-encoding") {
            if minor == 0 {
                // HTTP/1.0 has no transfer codings: its framing cannot be trusted (RFC 9112 6.1).
                return Err(HttpError::bad("Transfer-Encoding in an HTTP/1.0 request"));
            }
            let last = value.rsplit(|&b| b == b',').next().unwrap_or(b"").trim_ascii();
            chunked = last.eq_ignore_ascii_case(b"chunked");
            if !chunked {
                return Err(HttpError::bad("unsupported Transfer-Encoding"));
            }
            // Field lines of one name are one list (RFC 9110 section 5.3): a second
            // Transfer-Encoding line is a second coding, as in one line, and chunked applied
            // twice is not taken (RFC 9112 section 6.1), however the list is split.
            if saw_te || value.split(|&b| b == b',').count() > 1 {
                return Err(HttpError::new(StatusCode::NOT_IMPLEMENTED, "transfer coding not implemented"));
            }
            saw_te = true;
        } else if name.eq_ignore_ascii_case(b"connection") {
            for token in value.split(|&b| b == b',') {
                let t = token.trim_ascii();
                if t.eq_ignore_ascii_case(b"close") {
                    head.keep_alive = false;
                } else if t.eq_ignore_ascii_case(b"keep-alive") && minor == 0 {
                    head.keep_alive = true;
                }
            }
        } else if name.eq_ignore_ascii_case(b"expect") {
            if !value.eq_ignore_ascii_case(b"100-continue") {
                return Err(HttpError::new(StatusCode::EXPECTATION_FAILED, "unsupported Expect"));
            }
            head.expect_continue = minor == 1;
        } else if name.eq_ignore_ascii_case(b"host") {
            if saw_host {
                return Err(HttpError::bad("more than one Host header"));
            }
            saw_host = true;
        }
        next = after;
    }
    if minor == 1 && !saw_host {
        return Err(HttpError::bad("missing Host header"));
    }
    if saw_te && content_length.is_some() {
        // Both framings at once is how requests are smuggled (RFC 9112 section 6.3).
        return Err(HttpError::bad("both Transfer-Encoding and Content-Length"));
    }
    head.body = if chunked {
        BodyKind::Chunked
    } else {
        let n = content_length.unwrap_or(0);
        if n > limits.max_body_bytes {
            return Err(HttpError::new(StatusCode::PAYLOAD_TOO_LARGE, "request body too large"));
        }
        BodyKind::Length(n)
    };
    head.len = next;
    head.headers = std::mem::take(spare);
    Ok(Status::Complete(head))
}
