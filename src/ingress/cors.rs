//! CORS on the traffic listener: which pages may read the answers (`cors_allowed_origins`),
//! and the preflight's answer. `Traffic::handle` wraps every route in it.

use crate::http::StatusCode;
use crate::server::Response;

/// The `Access-Control-Allow-Origin` for a request's `Origin`, when `allowed` lets it in.
pub(super) fn cors_origin(allowed: &[String], origin: Option<&[u8]>) -> Option<String> {
    if allowed.is_empty() {
        return None;
    }
    let origin = std::str::from_utf8(origin?).ok()?.trim();
    if allowed.iter().any(|a| a == "*") {
        return Some("*".to_owned());
    }
    allowed.iter().any(|a| a.eq_ignore_ascii_case(origin)).then(|| origin.to_owned())
}

/// A CORS preflight's answer: the methods the traffic listener serves and the headers the
/// page asked for (only header-name characters, at most 2 KiB: anything else is not echoed).
pub(super) fn preflight(origin: String, asked: Option<&[u8]>) -> Response {
    let headers = asked
        .filter(|h| h.len() <= 2048 && h.iter().all(|&b| b.is_ascii_alphanumeric() || b"-_, ".contains(&b)))
        .and_then(|h| std::str::from_utf8(h).ok())
        .unwrap_or("authorization, content-type");
    Response::empty(StatusCode(204))
        .with_header("access-control-allow-origin", &origin)
        .with_header("vary", "origin")
        .with_header("access-control-allow-methods", "GET, POST, PUT, DELETE")
        .with_header("access-control-allow-headers", headers)
        .with_header("access-control-max-age", "600")
}
