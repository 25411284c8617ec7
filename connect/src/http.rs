//! The HTTP/1.1 server both the admin API and the HTTP source run (hyper), and their answers:
//! JSON, problem+json, 405 with `Allow`; bodies read up to a limit.

use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};
use serde_json::{json, Value};

/// An answer.
pub type Answer = Response<Full<Bytes>>;

/// A JSON answer.
pub fn answer(status: StatusCode, body: &Value) -> Answer {
    Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body.to_string())))
        .expect("a valid response")
}

/// A problem+json answer (RFC 9457).
pub fn problem(status: StatusCode, detail: &str) -> Answer {
    let title = status.canonical_reason().unwrap_or("");
    let body = json!({ "type": "about:blank", "title": title, "status": status.as_u16(), "detail": detail });
    let mut r = answer(status, &body);
    r.headers_mut().insert("content-type", "application/problem+json".parse().expect("a header value"));
    r
}

/// 405 with `Allow`.
pub fn not_allowed(allow: &str) -> Answer {
    let mut r = problem(StatusCode::METHOD_NOT_ALLOWED, &format!("allowed: {allow}"));
    r.headers_mut().insert("allow", allow.parse().expect("a header value"));
    r
}

/// The body, at most `limit` bytes (`Err`: the 413 or 400 to answer).
pub async fn body(req: Request<Incoming>, limit: usize) -> Result<(hyper::http::request::Parts, Bytes), Answer> {
    let (parts, body) = req.into_parts();
    if parts
        .headers
        .get("content-length")
        .and_then(|v| v.to_str().ok()?.parse::<usize>().ok())
        .is_some_and(|n| n > limit)
    {
        return Err(problem(StatusCode::PAYLOAD_TOO_LARGE, &format!("the body is over {limit} bytes")));
    }
    let read = tokio::time::timeout(BODY_WAIT, Limited::new(body, limit).collect()).await;
    let Ok(read) = read else {
        return Err(problem(StatusCode::REQUEST_TIMEOUT, &format!("the body did not arrive within {BODY_WAIT:?}")));
    };
    match read {
        Ok(b) => Ok((parts, b.to_bytes())),
        Err(e) if e.is::<http_body_util::LengthLimitError>() => {
            Err(problem(StatusCode::PAYLOAD_TOO_LARGE, &format!("the body is over {limit} bytes")))
        }
        Err(e) => Err(problem(StatusCode::BAD_REQUEST, &format!("the body could not be read: {e}"))),
    }
}

/// Connections one server holds at once, at most (past it, new ones wait in the backlog).
pub const MAX_CONNECTIONS: usize = 1024;
/// A request's head must arrive within this; a body read within [`BODY_WAIT`].
pub const HEAD_WAIT: std::time::Duration = std::time::Duration::from_secs(10);
pub const BODY_WAIT: std::time::Duration = std::time::Duration::from_secs(30);

/// Serves `listener` with `handle` until the task is dropped or aborted; its connections end
/// with it (a stopped connector's keep-alive connections do not linger). At most
/// [`MAX_CONNECTIONS`] at once, each head within [`HEAD_WAIT`] and hyper's read buffer (about
/// 400 KiB), each body within [`BODY_WAIT`].
pub async fn serve<H, F>(listener: tokio::net::TcpListener, handle: Arc<H>)
where
    H: Fn(Request<Incoming>) -> F + Send + Sync + 'static,
    F: Future<Output = Answer> + Send + 'static,
{
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    let mut connections = tokio::task::JoinSet::new();
    loop {
        let Ok(slot) = slots.clone().acquire_owned().await else { return };
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            // Out of descriptors, say: not a busy loop.
            Err(_) => {
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                continue;
            }
        };
        while connections.try_join_next().is_some() {}
        let handle = handle.clone();
        connections.spawn(async move {
            let _slot = slot;
            let service = hyper::service::service_fn(move |req| {
                let answer = handle(req);
                async move { Ok::<_, Infallible>(answer.await) }
            });
            let io = hyper_util::rt::TokioIo::new(stream);
            let _ = hyper::server::conn::http1::Builder::new()
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(HEAD_WAIT)
                .serve_connection(io, service)
                .await;
        });
    }
}
