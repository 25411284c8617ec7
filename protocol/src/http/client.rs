//! The client side of HTTP/1.1 (RFC 9112), for the broker's own outbound requests (webhook
//! pushes, remote agents): writing a request, and parsing a response head strictly, with the
//! same limits and character rules as the request parser. Pure: bytes in, values out.

use super::parse::{is_tchar, is_value_char};
use super::{HttpError, Status, StatusCode};

/// How a response's body is framed (RFC 9112 section 6.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResponseBody {
    /// None at all: 1xx, 204, 304, or the answer to a HEAD.
    Empty,
    /// Exactly this many bytes (`Content-Length`).
    Length(usize),
    /// `Transfer-Encoding: chunked`.
    Chunked,
    /// Until the server closes the connection (no length given; the connection is not reused).
    UntilClose,
}

/// A parsed response head. Header positions index the parsed buffer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResponseHead {
    /// The status code, 100 to 599.
    pub status: u16,
    /// The header fields, in arrival order.
    pub headers: Vec<super::HeaderPos>,
    /// How the body that follows the head is framed.
    pub body: ResponseBody,
    /// Whether the connection may carry another request after this response's body.
    pub keep_alive: bool,
    /// Bytes taken by the head, including the blank line.
    pub len: usize,
}

impl ResponseHead {
    /// The first header named `name` (ASCII case-insensitive).
    pub fn header<'b>(&self, buf: &'b [u8], name: &str) -> Option<&'b [u8]> {
        self.headers.iter().find_map(|h| {
            let n = &buf[h.name.0 as usize..h.name.1 as usize];
            n.eq_ignore_ascii_case(name.as_bytes()).then(|| &buf[h.value.0 as usize..h.value.1 as usize])
        })
    }
}

fn bad(detail: &'static str) -> HttpError {
    HttpError::new(StatusCode(502), detail)
}

/// Parses a response head from the start of `buf` (the answer to a request of method HEAD when
/// `head_request`). Errors are 502: the server broke the protocol.
pub fn parse_response_head(
    buf: &[u8],
    max_header_bytes: usize,
    max_headers: usize,
    head_request: bool,
) -> Result<Status<ResponseHead>, HttpError> {
    let mut lines = Lines { buf, next: 0 };
    let Some(line) = lines.next_line()? else {
        return if buf.len() > max_header_bytes { Err(bad("response head too large")) } else { Ok(Status::Partial) };
    };
    // status-line = HTTP-version SP status-code SP [ reason-phrase ]
    let (minor, status) = match line {
        [b'H', b'T', b'T', b'P', b'/', b'1', b'.', m @ (b'0' | b'1'), b' ', d1, d2, d3, rest @ ..]
            if d1.is_ascii_digit()
                && d2.is_ascii_digit()
                && d3.is_ascii_digit()
                && (rest.is_empty() || rest[0] == b' ') =>
        {
            let status = u16::from(d1 - b'0') * 100 + u16::from(d2 - b'0') * 10 + u16::from(d3 - b'0');
            if !(100..=599).contains(&status) || !rest.iter().all(|&b| is_value_char(b)) {
                return Err(bad("malformed status line"));
            }
            (m - b'0', status)
        }
        _ => return Err(bad("malformed status line")),
    };
    let mut headers = Vec::new();
    let (mut length, mut chunked, mut close) = (None::<usize>, false, minor == 0);
    loop {
        if lines.next > max_header_bytes {
            return Err(bad("response head too large"));
        }
        let start = lines.next;
        let Some(line) = lines.next_line()? else {
            return if buf.len() > max_header_bytes {
                Err(bad("response head too large"))
            } else {
                Ok(Status::Partial)
            };
        };
        if line.is_empty() {
            break;
        }
        let colon = memchr::memchr(b':', line).ok_or(bad("header without colon"))?;
        let name = &line[..colon];
        if name.is_empty() || !name.iter().all(|&b| is_tchar(b)) {
            return Err(bad("invalid header name"));
        }
        let value = line[colon + 1..].trim_ascii();
        if !value.iter().all(|&b| is_value_char(b)) {
            return Err(bad("invalid header value"));
        }
        if headers.len() == max_headers {
            return Err(bad("too many header fields"));
        }
        let vs = start + colon + 1 + (line[colon + 1..].len() - line[colon + 1..].trim_ascii_start().len());
        headers.push(super::HeaderPos {
            name: (start as u32, (start + colon) as u32),
            value: (vs as u32, (vs + value.len()) as u32),
        });
        if name.eq_ignore_ascii_case(b"content-length") {
            let n = std::str::from_utf8(value).ok().filter(|v| v.bytes().all(|b| b.is_ascii_digit()) && !v.is_empty());
            let n = n.and_then(|v| v.parse::<usize>().ok()).ok_or(bad("invalid content-length"))?;
            if length.is_some_and(|l| l != n) {
                return Err(bad("conflicting content-length"));
            }
            length = Some(n);
        } else if name.eq_ignore_ascii_case(b"transfer-encoding") {
            // Only `chunked`, last (RFC 9112 section 6.1): anything else cannot be framed.
            let last = value.rsplit(|&b| b == b',').next().unwrap_or_default().trim_ascii();
            if !last.eq_ignore_ascii_case(b"chunked") {
                return Err(bad("unsupported transfer-encoding"));
            }
            chunked = true;
        } else if name.eq_ignore_ascii_case(b"connection") {
            for token in value.split(|&b| b == b',') {
                let token = token.trim_ascii();
                if token.eq_ignore_ascii_case(b"close") {
                    close = true;
                } else if minor == 0 && token.eq_ignore_ascii_case(b"keep-alive") {
                    close = false;
                }
            }
        }
    }
    if chunked && length.is_some() {
        return Err(bad("both content-length and transfer-encoding"));
    }
    let body = match () {
        _ if head_request || status < 200 || status == 204 || status == 304 => ResponseBody::Empty,
        _ if chunked => ResponseBody::Chunked,
        _ => length.map_or(ResponseBody::UntilClose, ResponseBody::Length),
    };
    let keep_alive = !close && body != ResponseBody::UntilClose;
    Ok(Status::Complete(ResponseHead { status, headers, body, keep_alive, len: lines.next }))
}

struct Lines<'b> {
    buf: &'b [u8],
    next: usize,
}

impl<'b> Lines<'b> {
    /// The next CRLF-terminated line (a bare LF is tolerated, as RFC 9112 section 2.2 allows a
    /// recipient to); `None` if it is not complete yet.
    fn next_line(&mut self) -> Result<Option<&'b [u8]>, HttpError> {
        let Some(nl) = memchr::memchr(b'\n', &self.buf[self.next..]) else { return Ok(None) };
        let line = &self.buf[self.next..self.next + nl];
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        if line.contains(&b'\r') {
            return Err(bad("bare CR in response head"));
        }
        self.next += nl + 1;
        Ok(Some(line))
    }
}

/// Writes a request head and body: `method target HTTP/1.1`, `Host`, `Content-Length` (when
/// there is a body or the method is POST/PUT), then `headers` as given (names and values must be
/// valid: the caller builds them).
pub fn write_request(method: &str, host: &str, target: &str, headers: &[(&str, &str)], body: &[u8], out: &mut Vec<u8>) {
    out.reserve(128 + body.len());
    for part in [method, " ", target, " HTTP/1.1\r\nhost: ", host, "\r\n"] {
        out.extend_from_slice(part.as_bytes());
    }
    for (name, value) in headers {
        for part in [name, ": ", value, "\r\n"] {
            out.extend_from_slice(part.as_bytes());
        }
    }
    if !body.is_empty() || matches!(method, "POST" | "PUT") {
        out.extend_from_slice(format!("content-length: {}\r\n", body.len()).as_bytes());
    }
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(body);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> Result<Status<ResponseHead>, HttpError> {
        parse_response_head(s.as_bytes(), 8192, 32, false)
    }

    fn complete(s: &str) -> ResponseHead {
        match parse(s) {
            Ok(Status::Complete(h)) => h,
            other => panic!("{s:?}: {other:?}"),
        }
    }

    #[test]
    fn responses_are_framed_as_rfc_9112_says() {
        let h = complete("HTTP/1.1 200 OK\r\nContent-Length: 12\r\nX-A:  b \r\n\r\n{\"retCode\":0}");
        assert_eq!((h.status, h.body, h.keep_alive, h.len), (200, ResponseBody::Length(12), true, 49));
        let buf = b"HTTP/1.1 200 OK\r\nContent-Length: 12\r\nX-A:  b \r\n\r\n";
        assert_eq!(h.header(buf, "x-a"), Some(&b"b"[..]));
        let h = complete("HTTP/1.1 429 Too Many\r\nretry-after: 3\r\ntransfer-encoding: gzip, chunked\r\n\r\n");
        assert_eq!((h.status, h.body), (429, ResponseBody::Chunked));
        assert_eq!(complete("HTTP/1.1 204 No Content\r\ncontent-length: 5\r\n\r\n").body, ResponseBody::Empty);
        assert_eq!(complete("HTTP/1.1 200\r\n\r\n").body, ResponseBody::UntilClose);
        assert!(!complete("HTTP/1.1 200\r\n\r\n").keep_alive);
        assert!(!complete("HTTP/1.1 200 OK\r\nconnection: keep-alive, close\r\ncontent-length: 0\r\n\r\n").keep_alive);
        assert!(!complete("HTTP/1.0 200 OK\r\ncontent-length: 0\r\n\r\n").keep_alive);
        assert!(complete("HTTP/1.0 200 OK\r\nconnection: keep-alive\r\ncontent-length: 0\r\n\r\n").keep_alive);
        assert_eq!(
            parse_response_head(b"HTTP/1.1 200 OK\r\ncontent-length: 9\r\n\r\n", 99, 9, true).map(|s| match s {
                Status::Complete(h) => h.body,
                Status::Partial => panic!(),
            }),
            Ok(ResponseBody::Empty)
        );
    }

    #[test]
    fn partial_heads_wait_and_broken_ones_are_502() {
        for partial in ["", "HTTP/1.1 200 OK", "HTTP/1.1 200 OK\r\ncontent-length: 1\r\n"] {
            assert!(matches!(parse(partial), Ok(Status::Partial)), "{partial:?}");
        }
        for bad in [
            "HTTP/2 200 OK\r\n\r\n",
            "HTTP/1.1 99 Low\r\n\r\n",
            "HTTP/1.1 2000 OK\r\n\r\n",
            "HTTP/1.1 200OK\r\n\r\n",
            "HTTP/1.1 200 OK\r\nno colon\r\n\r\n",
            "HTTP/1.1 200 OK\r\nbad name: v\r\n\r\n",
            "HTTP/1.1 200 OK\r\ncontent-length: -1\r\n\r\n",
            "HTTP/1.1 200 OK\r\ncontent-length: 1\r\ncontent-length: 2\r\n\r\n",
            "HTTP/1.1 200 OK\r\ncontent-length: 1\r\ntransfer-encoding: chunked\r\n\r\n",
            "HTTP/1.1 200 OK\r\ntransfer-encoding: gzip\r\n\r\n",
            "HTTP/1.1 200 OK\r\nx: a\rb\r\n\r\n",
        ] {
            assert_eq!(parse(bad).map(|_| ()).unwrap_err().status, StatusCode(502), "{bad:?}");
        }
        let long = format!("HTTP/1.1 200 OK\r\nx: {}\r\n\r\n", "a".repeat(9000));
        assert!(parse(&long).is_err());
        let many: String = (0..40).map(|i| format!("x{i}: v\r\n")).collect();
        assert!(parse(&format!("HTTP/1.1 200 OK\r\n{many}\r\n")).is_err());
    }

    #[test]
    fn requests_are_written_with_host_and_length() {
        let mut out = Vec::new();
        write_request("POST", "127.0.0.1:9", "/hook?a=1", &[("content-type", "text/plain")], b"hi", &mut out);
        assert_eq!(
            out,
            b"POST /hook?a=1 HTTP/1.1\r\nhost: 127.0.0.1:9\r\ncontent-type: text/plain\r\ncontent-length: 2\r\n\r\nhi"
        );
    }
}
