//! The connector process's admin API (SPEC, "Connectors"): `GET /connectors`,
//! `GET /connectors/{name}`, `POST /connectors/{name}/pause|resume|restart`,
//! `PUT /connectors/{name}/position` (a source's, while it is paused, as Kafka Connect's
//! KIP-875 allows only on a stopped connector; `{"position": null}` starts it over),
//! `GET /metrics` (Prometheus), `GET /readyz`. Errors are problem+json; bodies are at most
//! 64 KiB.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};
use serde_json::{json, Value};

use crate::config::Kind;
use crate::http::{answer, not_allowed, problem, Answer};
use crate::store::Store;
use crate::task::{Connector, Control, State};

/// Request bodies, at most.
const MAX_BODY: usize = 64 << 10;

/// A counter of `GET /metrics`: its name, its help and how it is read.
type Series = (&'static str, &'static str, fn(&crate::task::Counts) -> u64);

/// What the admin API serves.
pub struct Admin {
    pub connectors: BTreeMap<String, Arc<Connector>>,
    pub store: Store,
    /// Where sinks' lag comes from, if evmesh's admin listener was given.
    pub evmesh_admin: Option<crate::lag::EvmeshAdmin>,
}

impl Admin {
    /// Serves `listener` until the process ends.
    pub async fn serve(self: Arc<Self>, listener: tokio::net::TcpListener) {
        let handle = Arc::new(move |req| {
            let me = self.clone();
            async move { me.handle(req).await }
        });
        crate::http::serve(listener, handle).await;
    }

    async fn handle(&self, req: Request<Incoming>) -> Answer {
        let path = req.uri().path().to_owned();
        let parts: Vec<&str> = path.trim_start_matches('/').split('/').collect();
        let method = req.method().clone();
        match (parts.as_slice(), &method) {
            (["connectors"], &Method::GET) => {
                let mut all = Vec::with_capacity(self.connectors.len());
                for c in self.connectors.values() {
                    all.push(self.status(c).await);
                }
                answer(StatusCode::OK, &json!(all))
            }
            (["connectors"], _) => not_allowed("GET"),
            (["connectors", name], m) => match (self.connectors.get(*name), m) {
                (None, _) => problem(StatusCode::NOT_FOUND, &format!("no connector {name}")),
                (Some(c), &Method::GET) => answer(StatusCode::OK, &self.status(c).await),
                (Some(_), _) => not_allowed("GET"),
            },
            (["connectors", name, action], m) => {
                let Some(c) = self.connectors.get(*name) else {
                    return problem(StatusCode::NOT_FOUND, &format!("no connector {name}"));
                };
                match (*action, m) {
                    ("pause", &Method::POST) => self.act(c, Control::Pause, false).await,
                    ("resume", &Method::POST) => self.act(c, Control::Run, false).await,
                    ("restart", &Method::POST) => self.act(c, Control::Run, true).await,
                    ("position", &Method::PUT) => self.put_position(c, req).await,
                    ("pause" | "resume" | "restart", _) => not_allowed("POST"),
                    ("position", _) => not_allowed("PUT"),
                    _ => problem(StatusCode::NOT_FOUND, &format!("no {path}")),
                }
            }
            (["metrics"], &Method::GET) => self.metrics(),
            (["readyz"], &Method::GET) => self.ready(),
            (["metrics"] | ["readyz"], _) => not_allowed("GET"),
            _ => problem(StatusCode::NOT_FOUND, &format!("no {path}")),
        }
    }

    /// A connector's status; a sink's with its lag when evmesh's admin listener tells it.
    async fn status(&self, c: &Connector) -> Value {
        let mut v = c.status(&self.store);
        if let (Some(admin), Some(s)) = (&self.evmesh_admin, &c.config.subscription) {
            if let Some(lag) = admin.lags().await.and_then(|l| l.get(s).copied()) {
                v["lag"] = json!({ "records": lag });
            }
        }
        v
    }

    /// Pause, resume or restart; answers the state once the connector took it (at most 5 s).
    async fn act(&self, c: &Arc<Connector>, control: Control, restart: bool) -> Answer {
        c.control(control, restart);
        let want = |s: &State| match control {
            Control::Pause => *s == State::Paused,
            Control::Run => !matches!(s, State::Paused | State::Starting),
        };
        let until = tokio::time::Instant::now() + std::time::Duration::from_secs(5);
        while !want(&c.state()) && tokio::time::Instant::now() < until {
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        answer(StatusCode::OK, &c.status(&self.store))
    }

    async fn put_position(&self, c: &Arc<Connector>, req: Request<Incoming>) -> Answer {
        if c.config.kind != Kind::Source {
            return problem(
                StatusCode::CONFLICT,
                "a sink's position is its subscription's offsets, kept by evmesh: reset them there",
            );
        }
        if c.state() != State::Paused {
            return problem(StatusCode::CONFLICT, "pause the connector first (POST .../pause), then set its position");
        }
        let body = match crate::http::body(req, MAX_BODY).await {
            Ok((_, b)) => b,
            Err(refused) => return refused,
        };
        let v: Value = match serde_json::from_slice(&body) {
            Ok(v) => v,
            Err(e) => return problem(StatusCode::BAD_REQUEST, &format!("not JSON: {e}")),
        };
        let Some(position) = v.as_object().and_then(|o| o.get("position")) else {
            return problem(StatusCode::BAD_REQUEST, "expected {\"position\": <the source's position, or null>}");
        };
        let stored = if position.is_null() { None } else { Some(position) };
        match self.store.set_position(&c.config.name, stored) {
            Ok(()) => answer(StatusCode::OK, &c.status(&self.store)),
            Err(e) => problem(StatusCode::SERVICE_UNAVAILABLE, &e.to_string()),
        }
    }

    /// 200 once every connector has started (running or paused); 503 naming those that have
    /// not, or failed.
    fn ready(&self) -> Answer {
        let waiting: Vec<String> = self
            .connectors
            .values()
            .filter_map(|c| match c.state() {
                State::Running | State::Paused => None,
                s => Some(format!("{} is {}", c.config.name, s.name())),
            })
            .collect();
        match waiting.is_empty() {
            true => answer(StatusCode::OK, &json!({"status": "ready"})),
            false => problem(StatusCode::SERVICE_UNAVAILABLE, &waiting.join("; ")),
        }
    }

    fn metrics(&self) -> Answer {
        let mut out = String::new();
        let series: [Series; 6] = [
            ("records_polled_total", "Records a source polled.", |c| c.polled.load(Ordering::Relaxed)),
            ("records_published_total", "Records evmesh took (202).", |c| c.published.load(Ordering::Relaxed)),
            ("records_put_total", "Events a sink wrote and acked.", |c| c.put.load(Ordering::Relaxed)),
            ("records_failed_total", "Records evmesh refused (passed over).", |c| c.failed.load(Ordering::Relaxed)),
            ("retries_total", "Calls tried again after a failure.", |c| c.retried.load(Ordering::Relaxed)),
            ("records_dlq_total", "Events a sink refused, sent to the dead-letter topic.", |c| {
                c.dlq.load(Ordering::Relaxed)
            }),
        ];
        for (name, help, get) in series {
            out.push_str(&format!("# HELP evmesh_connect_{name} {help}\n# TYPE evmesh_connect_{name} counter\n"));
            for c in self.connectors.values() {
                out.push_str(&format!("evmesh_connect_{name}{{connector=\"{}\"}} {}\n", c.config.name, get(&c.counts)));
            }
        }
        out.push_str("# HELP evmesh_connect_commit_seconds From a batch's first record to its position stored or its acks sent.\n# TYPE evmesh_connect_commit_seconds summary\n");
        for c in self.connectors.values() {
            let (us, n) = (c.counts.commit_us.load(Ordering::Relaxed), c.counts.commits.load(Ordering::Relaxed));
            out.push_str(&format!(
                "evmesh_connect_commit_seconds_sum{{connector=\"{}\"}} {}\n",
                c.config.name,
                us as f64 / 1e6
            ));
            out.push_str(&format!("evmesh_connect_commit_seconds_count{{connector=\"{}\"}} {n}\n", c.config.name));
        }
        out.push_str(
            "# HELP evmesh_connect_up 1 while the connector runs or is paused.\n# TYPE evmesh_connect_up gauge\n",
        );
        for c in self.connectors.values() {
            let up = matches!(c.state(), State::Running | State::Paused) as u8;
            out.push_str(&format!(
                "evmesh_connect_up{{connector=\"{}\",state=\"{}\"}} {up}\n",
                c.config.name,
                c.state().name()
            ));
        }
        Response::builder()
            .header("content-type", "text/plain; version=0.0.4")
            .body(Full::new(Bytes::from(out)))
            .expect("a valid response")
    }
}
