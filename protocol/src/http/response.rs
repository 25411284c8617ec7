//! Response writing: status line, headers and body appended to an output buffer.

use std::borrow::Cow;
/// An HTTP status code with its reason phrase.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StatusCode(pub u16);

impl StatusCode {
    /// 100 Continue: the client may send the body it announced with `Expect: 100-continue`.
    pub const CONTINUE: StatusCode = StatusCode(100);
    /// 101 Switching Protocols: the answer to an accepted WebSocket upgrade.
    pub const SWITCHING_PROTOCOLS: StatusCode = StatusCode(101);
    /// 200 OK.
    pub const OK: StatusCode = StatusCode(200);
    /// 202 Accepted: taken in, not yet processed.
    pub const ACCEPTED: StatusCode = StatusCode(202);
    /// 204 No Content: success with no body (no `content-length` is written).
    pub const NO_CONTENT: StatusCode = StatusCode(204);
    /// 400 Bad Request: malformed syntax or an invalid event.
    pub const BAD_REQUEST: StatusCode = StatusCode(400);
    /// 401 Unauthorized: no valid credentials.
    pub const UNAUTHORIZED: StatusCode = StatusCode(401);
    /// 403 Forbidden: valid credentials without the permission needed.
    pub const FORBIDDEN: StatusCode = StatusCode(403);
    /// 404 Not Found.
    pub const NOT_FOUND: StatusCode = StatusCode(404);
    /// 405 Method Not Allowed: the path exists but not with this method.
    pub const METHOD_NOT_ALLOWED: StatusCode = StatusCode(405);
    /// 408 Request Timeout: the request did not arrive in time.
    pub const REQUEST_TIMEOUT: StatusCode = StatusCode(408);
    /// 409 Conflict: the request clashes with the current state (an existing name, say).
    pub const CONFLICT: StatusCode = StatusCode(409);
    /// 413 Content Too Large: the body exceeds its limit.
    pub const PAYLOAD_TOO_LARGE: StatusCode = StatusCode(413);
    /// 415 Unsupported Media Type: a `Content-Type` the endpoint does not accept.
    pub const UNSUPPORTED_MEDIA_TYPE: StatusCode = StatusCode(415);
    /// 417 Expectation Failed: an `Expect` other than `100-continue`.
    pub const EXPECTATION_FAILED: StatusCode = StatusCode(417);
    /// 429 Too Many Requests: a rate or quota limit was hit.
    pub const TOO_MANY_REQUESTS: StatusCode = StatusCode(429);
    /// 431 Request Header Fields Too Large: the head exceeds its byte or field limit.
    pub const HEADERS_TOO_LARGE: StatusCode = StatusCode(431);
    /// 500 Internal Server Error.
    pub const INTERNAL: StatusCode = StatusCode(500);
    /// 501 Not Implemented: a valid request the server does not support (a transfer coding, say).
    pub const NOT_IMPLEMENTED: StatusCode = StatusCode(501);
    /// 503 Service Unavailable: overloaded or a dependency failed; retry later.
    pub const SERVICE_UNAVAILABLE: StatusCode = StatusCode(503);
    /// 504 Gateway Timeout: an upstream (a reply, an agent) did not answer in time.
    pub const GATEWAY_TIMEOUT: StatusCode = StatusCode(504);
    /// 505 HTTP Version Not Supported: an HTTP version other than 1.0 or 1.1.
    pub const VERSION_NOT_SUPPORTED: StatusCode = StatusCode(505);

    /// The reason phrase sent in the status line (RFC 9110 section 15); `Unknown` for a code
    /// without one here.
    pub fn reason(self) -> &'static str {
        match self.0 {
            100 => "Continue",
            101 => "Switching Protocols",
            200 => "OK",
            201 => "Created",
            202 => "Accepted",
            204 => "No Content",
            307 => "Temporary Redirect",
            400 => "Bad Request",
            401 => "Unauthorized",
            403 => "Forbidden",
            404 => "Not Found",
            405 => "Method Not Allowed",
            408 => "Request Timeout",
            409 => "Conflict",
            413 => "Content Too Large",
            415 => "Unsupported Media Type",
            417 => "Expectation Failed",
            426 => "Upgrade Required",
            429 => "Too Many Requests",
            431 => "Request Header Fields Too Large",
            500 => "Internal Server Error",
            501 => "Not Implemented",
            503 => "Service Unavailable",
            504 => "Gateway Timeout",
            505 => "HTTP Version Not Supported",
            _ => "Unknown",
        }
    }
}

impl std::fmt::Display for StatusCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}", self.0, self.reason())
    }
}

/// A response ready to be written: status, extra headers, content type and body.
///
/// `U` is what the connection turns into once this response is written (after a `101`, or a
/// streaming `200`): the caller's own type, which this module never looks into, so the protocol
/// code knows no application types (the broker's is `evmesh::server::Upgrade`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Response<U> {
    /// The status line's code.
    pub status: StatusCode,
    /// The `content-type` value; empty writes no `content-type` header.
    pub content_type: Cow<'static, str>,
    /// Further header fields, written in this order after `content-type`. Names are lower case
    /// (`transfer-encoding` is recognised only so).
    pub headers: Vec<(Cow<'static, str>, String)>,
    /// The body. Its length is the `content-length`, unless a `transfer-encoding` header says
    /// the body is streamed.
    pub body: Vec<u8>,
    /// Set on a 101: the connection stops speaking HTTP once this response is written.
    pub upgrade: Option<U>,
}

impl<U> Response<U> {
    /// A response with a body of type `content_type` (empty for none) and no extra headers.
    pub fn new(status: StatusCode, content_type: impl Into<Cow<'static, str>>, body: impl Into<Vec<u8>>) -> Self {
        Response { status, content_type: content_type.into(), headers: Vec::new(), body: body.into(), upgrade: None }
    }

    /// A response whose body is JSON (`application/json`).
    pub fn json(status: StatusCode, body: impl Into<Vec<u8>>) -> Self {
        Response::new(status, "application/json", body)
    }

    /// A response with no body and no `content-type`.
    pub fn empty(status: StatusCode) -> Self {
        Response::new(status, "", Vec::new())
    }

    /// A `200` whose body is a chunked stream written by whatever takes the connection over.
    /// The connection ends with the stream (`connection: close`): a client must not pool it
    /// for a next request (one did, and its next request met the shut socket).
    pub fn streaming(upgrade: U, content_type: &'static str) -> Self {
        Response {
            status: StatusCode::OK,
            content_type: content_type.into(),
            headers: vec![
                ("transfer-encoding".into(), "chunked".into()),
                ("cache-control".into(), "no-cache".into()),
                ("connection".into(), "close".into()),
            ],
            body: Vec::new(),
            upgrade: Some(upgrade),
        }
    }

    /// A `101 Switching Protocols` to `upgrade`, with its handshake headers.
    pub fn switching(upgrade: U, headers: Vec<(&'static str, String)>) -> Self {
        Response {
            status: StatusCode::SWITCHING_PROTOCOLS,
            content_type: "".into(),
            headers: headers.into_iter().map(|(n, v)| (n.into(), v)).collect(),
            body: Vec::new(),
            upgrade: Some(upgrade),
        }
    }

    /// Adds a header field after those already set (a lower-case name, see [`Response::headers`]).
    pub fn with_header(mut self, name: impl Into<Cow<'static, str>>, value: impl Into<String>) -> Self {
        self.headers.push((name.into(), value.into()));
        self
    }

    /// Whether the response ends its connection (`connection: close`): the connection then
    /// serves nothing pipelined behind it.
    pub fn closes(&self) -> bool {
        self.headers.iter().any(|(n, v)| n.eq_ignore_ascii_case("connection") && v.eq_ignore_ascii_case("close"))
    }

    /// Appends the serialized response to `out`. `head_only` omits the body (HEAD requests).
    pub fn write(&self, out: &mut Vec<u8>, keep_alive: bool, head_only: bool) {
        write_head(out, self.status, &self.content_type, self.body.len(), keep_alive, &self.headers);
        if !head_only {
            out.extend_from_slice(&self.body);
        }
    }
}

/// Writes a status line and headers; the caller appends exactly `content_length` body bytes.
pub fn write_head(
    out: &mut Vec<u8>,
    status: StatusCode,
    content_type: &str,
    content_length: usize,
    keep_alive: bool,
    headers: &[(Cow<'static, str>, String)],
) {
    out.extend_from_slice(b"HTTP/1.1 ");
    let mut num = itoa_buf::Buf::new();
    out.extend_from_slice(num.u64(status.0 as u64));
    out.push(b' ');
    out.extend_from_slice(status.reason().as_bytes());
    out.extend_from_slice(b"\r\n");
    if status.0 >= 200 {
        out.extend_from_slice(b"date: ");
        out.extend_from_slice(&super::date::now());
        out.extend_from_slice(b"\r\n");
    }
    if !content_type.is_empty() {
        out.extend_from_slice(b"content-type: ");
        out.extend_from_slice(content_type.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    for (n, v) in headers {
        out.extend_from_slice(n.as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(v.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    let streamed = headers.iter().any(|(n, _)| *n == "transfer-encoding");
    if status.0 >= 200 && status.0 != 204 && !streamed {
        out.extend_from_slice(b"content-length: ");
        out.extend_from_slice(num.u64(content_length as u64));
        out.extend_from_slice(b"\r\n");
    }
    if !keep_alive && !headers.iter().any(|(n, _)| n.eq_ignore_ascii_case("connection")) {
        out.extend_from_slice(b"connection: close\r\n");
    }
    out.extend_from_slice(b"\r\n");
}

/// An RFC 9457 problem response.
pub fn problem<U>(status: StatusCode, detail: &str) -> Response<U> {
    let body = format!(
        r#"{{"type":"about:blank","title":{},"status":{},"detail":{}}}"#,
        serde_json::Value::from(status.reason()),
        status.0,
        serde_json::Value::from(detail)
    );
    Response::new(status, "application/problem+json", body)
}

/// Decimal formatting without allocation.
pub mod itoa_buf {
    /// A 20-byte scratch buffer that formats one number at a time.
    pub struct Buf([u8; 20]);
    impl Default for Buf {
        fn default() -> Self {
            Self::new()
        }
    }

    impl Buf {
        /// A zeroed buffer.
        pub fn new() -> Self {
            Buf([0; 20])
        }
        /// Formats `v` in decimal, without leading zeros, and returns its ASCII digits (borrowed
        /// from the buffer until the next call).
        pub fn u64(&mut self, mut v: u64) -> &[u8] {
            let mut i = 20;
            loop {
                i -= 1;
                self.0[i] = b'0' + (v % 10) as u8;
                v /= 10;
                if v == 0 {
                    break;
                }
            }
            &self.0[i..]
        }
    }
}
