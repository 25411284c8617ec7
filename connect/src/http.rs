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
    match Limited::new(body, limit).collect().await {
        Ok(b) => Ok((parts, b.to_bytes())),
        Err(e) if e.is::<http_body_util::LengthLimitError>() => {
            Err(problem(StatusCode::PAYLOAD_TOO_LARGE, &format!("the body is over {limit} bytes")))
        }
        Err(e) => Err(problem(StatusCode::BAD_REQUEST, &format!("the body could not be read: {e}"))),
    }
}

/// Serves `listener` with `handle` until the task is dropped or aborted.
pub async fn serve<H, F>(listener: tokio::net::TcpListener, handle: Arc<H>)
where
    H: Fn(Request<Incoming>) -> F + Send + Sync + 'static,
    F: Future<Output = Answer> + Send + 'static,
{
    loop {
        let Ok((stream, _)) = listener.accept().await else { continue };
        let handle = handle.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req| {
                let answer = handle(req);
                async move { Ok::<_, Infallible>(answer.await) }
            });
            let io = hyper_util::rt::TokioIo::new(stream);
            let _ = hyper::server::conn::http1::Builder::new().serve_connection(io, service).await;
        });
    }
}
