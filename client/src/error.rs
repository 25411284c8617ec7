//! The one error type of the client. A refusal by the broker carries its problem+json body
//! (RFC 9457) as [`Problem`]; everything else says which layer failed.

use std::time::Duration;

/// What went wrong.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The broker answered with an error status (a problem+json body, RFC 9457).
    #[error("{0}")]
    Api(Box<Problem>),
    /// The HTTP request could not be made or its answer not read (connection refused, reset...).
    #[error("http: {0}")]
    Http(#[source] reqwest::Error),
    /// The WebSocket could not be opened or broke.
    #[error("websocket: {0}")]
    WebSocket(#[source] Box<tokio_tungstenite::tungstenite::Error>),
    /// The broker closed a WebSocket session with this code and reason.
    #[error("closed by the broker: {code} {reason}")]
    Closed {
        /// The RFC 6455 close code (1008 policy: token expired or access revoked; 1012 home moved).
        code: u16,
        /// The close frame's reason.
        reason: String,
    },
    /// No answer within the configured timeout.
    #[error("timed out after {0:?}")]
    Timeout(Duration),
    /// A redirect the client refuses to follow (https to http, too many, no location).
    #[error("redirect refused: {0}")]
    Redirect(String),
    /// The token refresh callback failed.
    #[error("token refresh: {0}")]
    Token(String),
    /// The broker's answer was not what the contract says.
    #[error("unexpected answer: {0}")]
    Protocol(String),
    /// A URL, certificate, key or option given to the client is unusable.
    #[error("configuration: {0}")]
    Config(String),
    /// The connection (or the publisher) is gone; what was in flight may or may not have been
    /// stored, as after any lost connection.
    #[error("disconnected: {0}")]
    Disconnected(String),
}

impl Error {
    /// The problem the broker answered with, if it refused the request.
    pub fn problem(&self) -> Option<&Problem> {
        match self {
            Error::Api(p) => Some(p),
            _ => None,
        }
    }

    /// The HTTP status of a refusal.
    pub fn status(&self) -> Option<u16> {
        self.problem().map(|p| p.status)
    }

    /// Whether trying again later may succeed: connection failures, timeouts, and the
    /// statuses that say so (408, 429, 502, 503, 504).
    pub fn is_transient(&self) -> bool {
        match self {
            Error::Api(p) => matches!(p.status, 408 | 429 | 502 | 503 | 504),
            // A token endpoint away for a moment is as transient as the broker being away.
            Error::Http(_) | Error::WebSocket(_) | Error::Timeout(_) | Error::Disconnected(_) | Error::Token(_) => true,
            Error::Closed { code, .. } => *code != 1008,
            _ => false,
        }
    }
}

impl From<reqwest::Error> for Error {
    fn from(e: reqwest::Error) -> Self {
        Error::Http(e)
    }
}

impl From<tokio_tungstenite::tungstenite::Error> for Error {
    fn from(e: tokio_tungstenite::tungstenite::Error) -> Self {
        Error::WebSocket(Box::new(e))
    }
}

/// A refusal: the status, the problem+json fields, and `Retry-After` when the broker sent one.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct Problem {
    /// The HTTP status.
    pub status: u16,
    /// `title` (the status's reason phrase when the body has none).
    pub title: String,
    /// `detail`, what exactly was wrong.
    pub detail: Option<String>,
    /// `type`, a URI naming the kind of problem.
    pub kind: Option<String>,
    /// `Retry-After`, in seconds on the wire.
    pub retry_after: Option<Duration>,
    /// The whole body when it was JSON (extension members included), else `Null`.
    pub body: serde_json::Value,
}

impl Problem {
    /// Reads a problem from a refusal's status, `Retry-After` header value and body.
    pub(crate) fn from_answer(status: u16, retry_after: Option<&str>, body: &[u8]) -> Problem {
        let body: serde_json::Value = serde_json::from_slice(body).unwrap_or_else(|_| {
            let text = String::from_utf8_lossy(body).trim().to_owned();
            if text.is_empty() {
                serde_json::Value::Null
            } else {
                serde_json::json!({ "detail": text })
            }
        });
        let field = |k: &str| body.get(k).and_then(|v| v.as_str()).map(str::to_owned);
        let title = field("title").unwrap_or_else(|| reason(status).to_owned());
        Problem {
            status,
            title,
            detail: field("detail"),
            kind: field("type"),
            retry_after: retry_after.and_then(|s| s.trim().parse::<u64>().ok()).map(Duration::from_secs),
            body,
        }
    }
}

impl std::fmt::Display for Problem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}", self.status, self.title)?;
        if let Some(d) = &self.detail {
            write!(f, ": {d}")?;
        }
        Ok(())
    }
}

fn reason(status: u16) -> &'static str {
    reqwest::StatusCode::from_u16(status).ok().and_then(|s| s.canonical_reason()).unwrap_or("Error")
}

/// What the client's calls return.
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_problem_keeps_its_fields_and_retry_after() {
        let p = Problem::from_answer(
            429,
            Some("3"),
            br#"{"type":"about:blank","title":"Too Many Requests","status":429,"detail":"over the topic's rate"}"#,
        );
        assert_eq!(p.status, 429);
        assert_eq!(p.title, "Too Many Requests");
        assert_eq!(p.detail.as_deref(), Some("over the topic's rate"));
        assert_eq!(p.retry_after, Some(Duration::from_secs(3)));
        assert!(Error::Api(Box::new(p)).is_transient());
    }

    #[test]
    fn a_body_that_is_not_json_becomes_the_detail() {
        let p = Problem::from_answer(502, None, b"bad gateway\n");
        assert_eq!(p.title, "Bad Gateway");
        assert_eq!(p.detail.as_deref(), Some("bad gateway"));
        let p = Problem::from_answer(404, None, b"");
        assert_eq!(p.detail, None);
        assert!(!Error::Api(Box::new(p)).is_transient());
    }
}
