//! Credentials: a static bearer token, or one a callback hands out and refreshes before it
//! expires and again when the broker answers 401 or closes a session with "token expired".

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use crate::error::{Error, Result};

/// A bearer token and, if known, when it stops being valid.
#[derive(Clone, PartialEq, Eq)]
pub struct Token {
    /// The token itself, sent as `Authorization: Bearer <value>`.
    pub value: String,
    /// When the broker stops accepting it (a JWT's `exp`); `None`: never, as far as the client knows.
    pub expires_at: Option<SystemTime>,
}

impl Token {
    /// A token without a known expiry.
    pub fn new(value: impl Into<String>) -> Token {
        Token { value: value.into(), expires_at: None }
    }

    /// A token valid until `at`.
    pub fn expiring(value: impl Into<String>, at: SystemTime) -> Token {
        Token { value: value.into(), expires_at: Some(at) }
    }
}

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // A token printed in a log is a token leaked.
        f.debug_struct("Token").field("value", &"<redacted>").field("expires_at", &self.expires_at).finish()
    }
}

/// The future a refresh callback returns.
pub type RefreshFuture = Pin<Box<dyn Future<Output = Result<Token, Box<dyn std::error::Error + Send + Sync>>> + Send>>;

/// A callback that fetches a new token (from an identity provider, a file, ...).
pub type Refresh = Arc<dyn Fn() -> RefreshFuture + Send + Sync>;

/// The client's credential: the current token and, with a callback, how to get the next.
pub(crate) struct Tokens {
    refresh: Option<Refresh>,
    /// The token and when it was fetched.
    current: tokio::sync::Mutex<Option<(Token, SystemTime)>>,
    /// Refresh this long before `expires_at`.
    lead: Duration,
}

impl Tokens {
    pub(crate) fn new(token: Option<Token>, refresh: Option<Refresh>, lead: Duration) -> Tokens {
        Tokens { refresh, current: tokio::sync::Mutex::new(token.map(|t| (t, SystemTime::now()))), lead }
    }

    /// The token to send now: the current one, or a fresh one when there is none yet or it
    /// expires within the lead time (and a callback can make another).
    pub(crate) async fn get(&self) -> Result<Option<String>> {
        let mut cur = self.current.lock().await;
        let now = SystemTime::now();
        let stale = match &*cur {
            None => true,
            // Refreshed `lead` before it expires, or halfway through its life if that is
            // later (a short-lived token is not refreshed on every request).
            Some((t, fetched)) => t.expires_at.is_some_and(|at| {
                let life = at.duration_since(*fetched).unwrap_or_default();
                at <= now + self.lead.min(life / 2)
            }),
        };
        if stale {
            if let Some(refresh) = &self.refresh {
                *cur = Some((call(refresh).await?, now));
            }
        }
        Ok(cur.as_ref().map(|(t, _)| t.value.clone()))
    }

    /// The token held now, as it is (never refreshed here).
    pub(crate) async fn current(&self) -> Option<Token> {
        self.current.lock().await.as_ref().map(|(t, _)| t.clone())
    }

    /// After a 401 or a session closed for an expired token: a new token if a callback can
    /// make one (`true`), or `false` when there is no callback (the refusal stands).
    /// `rejected` is the token the broker refused; if another task refreshed it meanwhile the
    /// callback is not called again.
    pub(crate) async fn refresh(&self, rejected: Option<&str>) -> Result<bool> {
        let Some(refresh) = &self.refresh else { return Ok(false) };
        let mut cur = self.current.lock().await;
        if cur.as_ref().map(|(t, _)| t.value.as_str()) != rejected {
            return Ok(true);
        }
        *cur = Some((call(refresh).await?, SystemTime::now()));
        Ok(true)
    }
}

/// Calls the refresh callback, for at most `REFRESH_LIMIT`: every request of the client
/// waits on a refresh, so one that hangs must not hang them all.
async fn call(refresh: &Refresh) -> Result<Token> {
    match tokio::time::timeout(REFRESH_LIMIT, refresh()).await {
        Ok(t) => t.map_err(|e| Error::Token(e.to_string())),
        Err(_) => {
            Err(Error::Token(format!("the refresh callback did not answer within {} s", REFRESH_LIMIT.as_secs())))
        }
    }
}

const REFRESH_LIMIT: Duration = Duration::from_secs(30);

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};

    fn counting(lifetime: Duration) -> (Refresh, Arc<AtomicU32>) {
        let n = Arc::new(AtomicU32::new(0));
        let calls = n.clone();
        let f: Refresh = Arc::new(move || {
            let k = calls.fetch_add(1, Ordering::SeqCst) + 1;
            Box::pin(async move { Ok(Token::expiring(format!("t{k}"), SystemTime::now() + lifetime)) })
        });
        (f, n)
    }

    #[tokio::test]
    async fn a_token_is_refreshed_before_it_expires_and_not_before() {
        let (f, n) = counting(Duration::from_secs(3600));
        let t = Tokens::new(None, Some(f), Duration::from_secs(30));
        assert_eq!(t.get().await.unwrap().as_deref(), Some("t1"));
        assert_eq!(t.get().await.unwrap().as_deref(), Some("t1"));
        assert_eq!(n.load(Ordering::SeqCst), 1);
        // A token shorter-lived than the lead is used for half its life, not refreshed on
        // every request...
        let (f, n) = counting(Duration::from_secs(10));
        let t = Tokens::new(None, Some(f), Duration::from_secs(30));
        assert_eq!(t.get().await.unwrap().as_deref(), Some("t1"));
        assert_eq!(t.get().await.unwrap().as_deref(), Some("t1"));
        assert_eq!(n.load(Ordering::SeqCst), 1);
        // ...and one already expired is refreshed by the next call.
        let (f, n) = counting(Duration::ZERO);
        let t = Tokens::new(None, Some(f), Duration::from_secs(30));
        assert_eq!(t.get().await.unwrap().as_deref(), Some("t1"));
        assert_eq!(t.get().await.unwrap().as_deref(), Some("t2"));
        assert_eq!(n.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn a_rejected_token_is_refreshed_once_however_many_ask() {
        let (f, n) = counting(Duration::from_secs(3600));
        let t = Tokens::new(None, Some(f), Duration::ZERO);
        let first = t.get().await.unwrap();
        assert!(t.refresh(first.as_deref()).await.unwrap());
        assert!(t.refresh(first.as_deref()).await.unwrap());
        assert_eq!(n.load(Ordering::SeqCst), 2);
        assert_eq!(t.get().await.unwrap().as_deref(), Some("t2"));
        let fixed = Tokens::new(Some(Token::new("s")), None, Duration::ZERO);
        assert!(!fixed.refresh(Some("s")).await.unwrap());
        assert_eq!(fixed.get().await.unwrap().as_deref(), Some("s"));
    }
}
