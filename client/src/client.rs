//! The [`Client`]: where the broker is, how to prove who we are, and the one path every HTTP
//! request and WebSocket handshake takes (credentials, 401 -> refresh once, 307/308 followed
//! with method and body kept, never from https to http, at most three times).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use reqwest::{Method, Url};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::http::HeaderValue;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

use crate::backoff::Backoff;
use crate::error::{Error, Problem, Result};
use crate::token::{Refresh, Token, Tokens};

/// How many redirects one request follows.
const MAX_REDIRECTS: usize = 3;

/// A WebSocket's read buffer: a few deliveries, or many answers, per read.
const READ_BUFFER: usize = 16 * 1024;

/// A WebSocket to the broker.
pub(crate) type Ws = WebSocketStream<MaybeTlsStream<tokio::net::TcpStream>>;

/// Builds a [`Client`]; see [`Client::builder`].
#[must_use]
pub struct ClientBuilder {
    urls: Vec<String>,
    token: Option<Token>,
    refresh: Option<Refresh>,
    refresh_lead: Duration,
    timeout: Duration,
    connect_timeout: Duration,
    roots_pem: Vec<Vec<u8>>,
    system_roots: bool,
    identity_pem: Option<(Vec<u8>, Vec<u8>)>,
    user_agent: String,
    backoff: Backoff,
}

impl ClientBuilder {
    /// A static bearer token.
    pub fn token(mut self, token: impl Into<String>) -> Self {
        self.token = Some(Token::new(token));
        self
    }

    /// A callback that returns a fresh token. It is called before the first request, again
    /// `lead` (default 30 s) before the token's `expires_at`, and when the broker answers 401
    /// or ends a session because the token expired.
    pub fn token_refresh<F, Fut>(mut self, refresh: F) -> Self
    where
        F: Fn() -> Fut + Send + Sync + 'static,
        Fut: Future<Output = std::result::Result<Token, Box<dyn std::error::Error + Send + Sync>>> + Send + 'static,
    {
        self.refresh = Some(Arc::new(move || Box::pin(refresh())));
        self
    }

    /// How long before a token's expiry the refresh callback is called (default 30 s).
    pub fn token_refresh_lead(mut self, lead: Duration) -> Self {
        self.refresh_lead = lead;
        self
    }

    /// Another broker instance to ask when the first does not answer (many instances over
    /// Kafka): recommend and attach try the URLs in turn.
    pub fn fallback_url(mut self, url: impl Into<String>) -> Self {
        self.urls.push(url.into());
        self
    }

    /// The limit for one request and its answer (default 30 s); streams (SSE, WebSocket,
    /// long-poll) are not cut by it. Request-reply waits its own timeout plus this.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// The limit for a TCP connect plus TLS and WebSocket handshake (default 10 s).
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// Trusts the CA certificates in this PEM text (in addition to the public roots unless
    /// [`only_given_roots`](Self::only_given_roots)).
    pub fn root_certificates_pem(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.roots_pem.push(pem.into());
        self
    }

    /// Trusts only the certificates given with [`root_certificates_pem`](Self::root_certificates_pem).
    pub fn only_given_roots(mut self) -> Self {
        self.system_roots = false;
        self
    }

    /// Presents this certificate chain and private key (PEM) for mutual TLS.
    pub fn client_identity_pem(mut self, chain: impl Into<Vec<u8>>, key: impl Into<Vec<u8>>) -> Self {
        self.identity_pem = Some((chain.into(), key.into()));
        self
    }

    /// The `User-Agent` sent with every request (default `evmesh-client/<version>`).
    pub fn user_agent(mut self, agent: impl Into<String>) -> Self {
        self.user_agent = agent.into();
        self
    }

    /// The reconnect delays of consumers, agents and session subscribers (default 0.5 s to 20 s).
    pub fn backoff(mut self, backoff: Backoff) -> Self {
        self.backoff = backoff;
        self
    }

    /// The client; fails on an unusable URL, certificate or key.
    pub fn build(self) -> Result<Client> {
        let mut seeds = Vec::new();
        for u in &self.urls {
            let url = Url::parse(u).map_err(|e| Error::Config(format!("url {u}: {e}")))?;
            if !matches!(url.scheme(), "http" | "https") || url.host_str().is_none() {
                return Err(Error::Config(format!("url {u}: expected http://HOST[:PORT] or https://HOST[:PORT]")));
            }
            seeds.push(url);
        }
        let tls = Arc::new(tls_config(&self.roots_pem, self.system_roots, self.identity_pem.as_ref())?);
        let http = reqwest::Client::builder()
            .use_preconfigured_tls((*tls).clone())
            .redirect(reqwest::redirect::Policy::none())
            .connect_timeout(self.connect_timeout)
            .user_agent(self.user_agent.clone())
            .tcp_nodelay(true)
            .build()
            .map_err(|e| Error::Config(format!("http client: {e}")))?;
        Ok(Client {
            inner: Arc::new(Inner {
                seeds,
                http,
                tls,
                tokens: Tokens::new(self.token, self.refresh, self.refresh_lead),
                user_agent: self.user_agent,
                timeout: self.timeout,
                connect_timeout: self.connect_timeout,
                backoff: self.backoff,
            }),
        })
    }
}

fn tls_config(
    roots_pem: &[Vec<u8>],
    system_roots: bool,
    identity: Option<&(Vec<u8>, Vec<u8>)>,
) -> Result<rustls::ClientConfig> {
    let mut roots = rustls::RootCertStore::empty();
    if system_roots {
        roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
    }
    for pem in roots_pem {
        let mut any = false;
        for cert in CertificateDer::pem_slice_iter(pem) {
            let cert = cert.map_err(|e| Error::Config(format!("root certificate: {e}")))?;
            // A bundle may hold certificates webpki cannot use: skipped, not fatal.
            any |= roots.add(cert).is_ok();
        }
        if !any {
            return Err(Error::Config("root certificates: no usable certificate in the PEM".into()));
        }
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| Error::Config(format!("tls: {e}")))?
        .with_root_certificates(roots);
    let mut config = match identity {
        None => builder.with_no_client_auth(),
        Some((chain, key)) => {
            let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(chain)
                .collect::<std::result::Result<_, _>>()
                .map_err(|e| Error::Config(format!("client certificate: {e}")))?;
            let key = PrivateKeyDer::from_pem_slice(key).map_err(|e| Error::Config(format!("client key: {e}")))?;
            builder.with_client_auth_cert(chain, key).map_err(|e| Error::Config(format!("client identity: {e}")))?
        }
    };
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(config)
}

/// A connection to an evmesh broker (or to several instances of one). Cheap to clone; every
/// clone shares the connection pool and the credential.
#[derive(Clone)]
pub struct Client {
    pub(crate) inner: Arc<Inner>,
}

pub(crate) struct Inner {
    pub(crate) seeds: Vec<Url>,
    pub(crate) http: reqwest::Client,
    tls: Arc<rustls::ClientConfig>,
    tokens: Tokens,
    user_agent: String,
    pub(crate) timeout: Duration,
    pub(crate) connect_timeout: Duration,
    pub(crate) backoff: Backoff,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client").field("urls", &self.inner.seeds).finish_non_exhaustive()
    }
}

/// A request for [`Client::call`]: a method, a path (with its query) relative to a base URL,
/// and an optional body.
pub(crate) struct Call {
    pub(crate) method: Method,
    pub(crate) path: String,
    pub(crate) body_bytes: Option<bytes_body::Bytes>,
    pub(crate) headers: Vec<(String, String)>,
    /// `None`: the client's timeout; `Some(None)`: none (a stream).
    pub(crate) timeout: Option<Option<Duration>>,
}

pub(crate) mod bytes_body {
    /// A body that can be sent again after a redirect or a refreshed token.
    pub(crate) type Bytes = std::sync::Arc<[u8]>;
}

impl Call {
    pub(crate) fn new(method: Method, path: impl Into<String>) -> Call {
        Call { method, path: path.into(), body_bytes: None, headers: Vec::new(), timeout: None }
    }

    pub(crate) fn get(path: impl Into<String>) -> Call {
        Call::new(Method::GET, path)
    }

    pub(crate) fn post(path: impl Into<String>) -> Call {
        Call::new(Method::POST, path)
    }

    pub(crate) fn json(self, value: &impl serde::Serialize) -> Call {
        let body = serde_json::to_vec(value).expect("client-built JSON serializes");
        self.body(body, "application/json")
    }

    pub(crate) fn body(mut self, body: Vec<u8>, content_type: &str) -> Call {
        self.body_bytes = Some(body.into());
        self.headers.retain(|(k, _)| !k.eq_ignore_ascii_case("content-type"));
        self.headers.push(("content-type".into(), content_type.into()));
        self
    }

    pub(crate) fn header(mut self, name: impl Into<String>, value: impl Into<String>) -> Call {
        self.headers.push((name.into(), value.into()));
        self
    }

    pub(crate) fn timeout(mut self, t: Option<Duration>) -> Call {
        self.timeout = Some(t);
        self
    }
}

/// An answer with a 2xx status whose body has been read.
pub(crate) struct Answer {
    pub(crate) status: u16,
    pub(crate) body: Vec<u8>,
}

impl Answer {
    pub(crate) fn json<T: serde::de::DeserializeOwned>(&self) -> Result<T> {
        serde_json::from_slice(&self.body)
            .map_err(|e| Error::Protocol(format!("{e}: {}", String::from_utf8_lossy(&self.body))))
    }
}

impl Client {
    /// A builder for a client of the broker at `url` (`http://host:port` or `https://...`).
    pub fn builder(url: impl Into<String>) -> ClientBuilder {
        ClientBuilder {
            urls: vec![url.into()],
            token: None,
            refresh: None,
            refresh_lead: Duration::from_secs(30),
            timeout: Duration::from_secs(30),
            connect_timeout: Duration::from_secs(10),
            roots_pem: Vec::new(),
            system_roots: true,
            identity_pem: None,
            user_agent: concat!("evmesh-client/", env!("CARGO_PKG_VERSION")).to_owned(),
            backoff: Backoff::default(),
        }
    }

    /// A client with every default, for the broker at `url`.
    pub fn new(url: impl Into<String>) -> Result<Client> {
        Client::builder(url).build()
    }

    /// The first URL the client was given.
    pub fn url(&self) -> &Url {
        &self.inner.seeds[0]
    }

    /// The URL `path` names at `base` (or the first seed).
    fn at(&self, base: Option<&Url>, path: &str) -> Result<Url> {
        let base = base.unwrap_or(&self.inner.seeds[0]);
        base.join(path).map_err(|e| Error::Config(format!("{path}: {e}")))
    }

    /// Sends `call` to `base` (default: the first URL) and reads the whole answer.
    pub(crate) async fn call(&self, base: Option<&Url>, call: Call) -> Result<Answer> {
        let (resp, _) = self.open(base, call).await?;
        let status = resp.status().as_u16();
        let body = resp.bytes().await.map_err(timeout_or_http)?.to_vec();
        Ok(Answer { status, body })
    }

    /// Sends `call` to `base` (default: the first URL), following redirects and refreshing a
    /// refused token once; returns a 2xx response unread (a stream's) and the URL that answered.
    pub(crate) async fn open(&self, base: Option<&Url>, call: Call) -> Result<(reqwest::Response, Url)> {
        let mut url = self.at(base, &call.path)?;
        let mut refreshed = false;
        let mut redirects = 0;
        loop {
            let token = self.inner.tokens.get().await?;
            let mut rb = self.inner.http.request(call.method.clone(), url.clone());
            if let Some(t) = &token {
                rb = rb.bearer_auth(t);
            }
            for (k, v) in &call.headers {
                rb = rb.header(k, v);
            }
            if let Some(b) = &call.body_bytes {
                rb = rb.body(b.to_vec());
            }
            if let Some(t) = call.timeout.unwrap_or(Some(self.inner.timeout)) {
                rb = rb.timeout(t);
            }
            // A stream has no overall limit, but its answer's head does.
            let resp = tokio::time::timeout(self.inner.timeout, rb.send())
                .await
                .map_err(|_| Error::Timeout(self.inner.timeout))?
                .map_err(timeout_or_http)?;
            let status = resp.status().as_u16();
            match status {
                200..=299 => return Ok((resp, url)),
                307 | 308 => {
                    url = redirect(&url, resp.headers().get("location"), &mut redirects)?;
                }
                401 if !refreshed && self.inner.tokens.refresh(token.as_deref()).await? => refreshed = true,
                _ => return Err(refusal(resp).await),
            }
        }
    }

    /// Opens a WebSocket (subprotocol `cloudevents.json`) at `path` of `base`, following
    /// redirects and refreshing a refused token as [`open`](Self::open) does.
    pub(crate) async fn websocket(&self, base: Option<&Url>, path: &str) -> Result<(Ws, Url)> {
        let mut url = self.at(base, path)?;
        let mut refreshed = false;
        let mut redirects = 0;
        loop {
            let token = self.inner.tokens.get().await?;
            let mut ws_url = url.clone();
            let scheme = if url.scheme() == "https" { "wss" } else { "ws" };
            ws_url.set_scheme(scheme).map_err(|()| Error::Config(format!("{url}: no WebSocket form")))?;
            let mut req = ws_url.as_str().into_client_request()?;
            let h = req.headers_mut();
            h.insert("sec-websocket-protocol", HeaderValue::from_static("cloudevents.json"));
            h.insert("user-agent", header_value(&self.inner.user_agent)?);
            if let Some(t) = &token {
                h.insert("authorization", header_value(&format!("Bearer {t}"))?);
            }
            let connector = tokio_tungstenite::Connector::Rustls(self.inner.tls.clone());
            // tungstenite zero-fills its read buffer up to this size on every read: its 128 KiB
            // default cost a publisher reading 70-byte answers a tenth of its CPU in memset.
            let config =
                tokio_tungstenite::tungstenite::protocol::WebSocketConfig::default().read_buffer_size(READ_BUFFER);
            let connect = tokio_tungstenite::connect_async_tls_with_config(req, Some(config), true, Some(connector));
            let outcome = tokio::time::timeout(self.inner.connect_timeout, connect)
                .await
                .map_err(|_| Error::Timeout(self.inner.connect_timeout))?;
            use tokio_tungstenite::tungstenite::Error as WsError;
            match outcome {
                Ok((ws, _)) => return Ok((ws, url)),
                Err(WsError::Http(resp)) => {
                    let status = resp.status().as_u16();
                    match status {
                        307 | 308 => url = redirect(&url, resp.headers().get("location"), &mut redirects)?,
                        401 if !refreshed && self.inner.tokens.refresh(token.as_deref()).await? => refreshed = true,
                        _ => {
                            let retry = resp.headers().get("retry-after").and_then(|v| v.to_str().ok());
                            let body = resp.body().as_deref().unwrap_or_default();
                            return Err(Error::Api(Box::new(Problem::from_answer(status, retry, body))));
                        }
                    }
                }
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// After a session ended because its token expired: a new token if a callback can make one.
    pub(crate) async fn token_rejected(&self) -> Result<bool> {
        // A token held now that is not near its expiry was fetched since the session began
        // (another session ended first): it is used as it is, the callback not called again.
        let current = self.inner.tokens.current().await;
        if current
            .as_ref()
            .and_then(|t| t.expires_at)
            .is_some_and(|at| at > std::time::SystemTime::now() + Duration::from_secs(1))
        {
            return Ok(true);
        }
        self.inner.tokens.refresh(current.as_ref().map(|t| t.value.as_str())).await
    }
}

fn header_value(s: &str) -> Result<HeaderValue> {
    HeaderValue::from_str(s).map_err(|e| Error::Config(format!("header value: {e}")))
}

fn timeout_or_http(e: reqwest::Error) -> Error {
    // reqwest says "operation timed out" itself; the limit is the one configured.
    Error::Http(e)
}

/// A refusal's problem, its body read.
pub(crate) async fn refusal(resp: reqwest::Response) -> Error {
    let status = resp.status().as_u16();
    let retry = resp.headers().get("retry-after").and_then(|v| v.to_str().ok()).map(str::to_owned);
    let body = resp.bytes().await.unwrap_or_default();
    Error::Api(Box::new(Problem::from_answer(status, retry.as_deref(), &body)))
}

/// Where a 307/308 sends the client: the `location` resolved against `from`, refused when it
/// leaves https for http, is missing, or is one redirect too many.
fn redirect(from: &Url, location: Option<&HeaderValue>, count: &mut usize) -> Result<Url> {
    *count += 1;
    if *count > MAX_REDIRECTS {
        return Err(Error::Redirect(format!("more than {MAX_REDIRECTS} redirects (last to {from})")));
    }
    let loc = location
        .and_then(|v| v.to_str().ok())
        .ok_or_else(|| Error::Redirect("a redirect without a location".into()))?;
    let next = from.join(loc).map_err(|e| Error::Redirect(format!("location {loc}: {e}")))?;
    if from.scheme() == "https" && next.scheme() != "https" {
        return Err(Error::Redirect(format!("from {from} to {next}: https is never left for http")));
    }
    if !matches!(next.scheme(), "http" | "https") {
        return Err(Error::Redirect(format!("to {next}: not http or https")));
    }
    Ok(next)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redirects_never_leave_https_and_stop_after_three() {
        let https = Url::parse("https://a:8080/events/ws?subscription=s").unwrap();
        let to = |s: &'static str| HeaderValue::from_static(s);
        let mut n = 0;
        let e = redirect(&https, Some(&to("http://b:8080/events/ws")), &mut n).unwrap_err();
        assert!(matches!(e, Error::Redirect(_)), "{e}");
        let mut n = 0;
        let next = redirect(&https, Some(&to("https://b:9090/events/ws?subscription=s&evmeshRedirected=1")), &mut n);
        assert_eq!(next.unwrap().as_str(), "https://b:9090/events/ws?subscription=s&evmeshRedirected=1");
        let http = Url::parse("http://a/x").unwrap();
        assert_eq!(redirect(&http, Some(&to("/y?z=1")), &mut 0).unwrap().as_str(), "http://a/y?z=1");
        let mut n = 3;
        assert!(redirect(&http, Some(&to("http://b/")), &mut n).is_err());
        assert!(redirect(&http, None, &mut 0).is_err());
        assert!(redirect(&http, Some(&to("file:///etc/passwd")), &mut 0).is_err());
    }

    #[test]
    fn a_bad_url_or_pem_is_a_configuration_error() {
        assert!(matches!(Client::new("ftp://x").unwrap_err(), Error::Config(_)));
        assert!(matches!(Client::new("not a url").unwrap_err(), Error::Config(_)));
        let e = Client::builder("https://x").root_certificates_pem(b"junk".to_vec()).build().unwrap_err();
        assert!(matches!(e, Error::Config(_)), "{e}");
        assert!(Client::new("http://127.0.0.1:1").is_ok());
    }
}
