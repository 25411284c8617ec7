//! A sink's lag: the events of its subscription not acked yet, as evmesh's admin listener
//! counts them (`GET /admin/subscriptions`, each partition's end offset past the committed
//! one). Only with `--evmesh-admin`: the traffic API does not tell it. Asked at most every 2 s
//! (cached), and never for more than 2 s.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use serde_json::Value;
use tokio::sync::Mutex;

/// How long an answer is used, and how long one is waited for.
const FRESH: Duration = Duration::from_secs(2);

/// evmesh's admin listener, asked for its subscriptions' lag.
pub struct EvmeshAdmin {
    http: reqwest::Client,
    url: String,
    token: Option<String>,
    cache: Mutex<Option<(Instant, BTreeMap<String, u64>)>>,
}

impl EvmeshAdmin {
    pub fn new(url: &str, token: Option<String>) -> Result<EvmeshAdmin, reqwest::Error> {
        let http = reqwest::Client::builder()
            .use_preconfigured_tls(crate::connectors::http::tls())
            .timeout(FRESH)
            .redirect(reqwest::redirect::Policy::none())
            .build()?;
        Ok(EvmeshAdmin { http, url: url.trim_end_matches('/').to_owned(), token, cache: Mutex::new(None) })
    }

    /// Each subscription's events not acked yet (`None`: evmesh's admin did not answer).
    pub async fn lags(&self) -> Option<BTreeMap<String, u64>> {
        let mut cache = self.cache.lock().await;
        if let Some((at, lags)) = &*cache {
            if at.elapsed() < FRESH {
                return Some(lags.clone());
            }
        }
        let mut req = self.http.get(format!("{}/admin/subscriptions", self.url));
        if let Some(t) = &self.token {
            req = req.bearer_auth(t);
        }
        let body = req.send().await.ok()?.error_for_status().ok()?.bytes().await.ok()?;
        let list: Value = serde_json::from_slice(&body).ok()?;
        let lags = summed(&list);
        *cache = Some((Instant::now(), lags.clone()));
        Some(lags)
    }
}

/// Per subscription: over its partitions, the end offset past its own committed offset (the
/// whole partition when nothing was committed in it yet).
fn summed(list: &Value) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    for s in list.as_array().into_iter().flatten() {
        let Some(name) = s["subscription"].as_str() else { continue };
        let lag = s["partitions"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|p| {
                let own = p["consumers"].as_array().into_iter().flatten().find(|c| c["client"].is_null());
                match own {
                    Some(c) => c["lag"].as_u64().unwrap_or(0),
                    None => p["end_offset"].as_u64().unwrap_or(0),
                }
            })
            .sum();
        out.insert(name.to_owned(), lag);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_subscriptions_lag_is_summed_over_its_partitions() {
        let list = json!([
            {"subscription": "a", "partitions": [
                {"partition": 0, "end_offset": 10, "consumers": [{"client": null, "committed": 7, "lag": 3}]},
                {"partition": 1, "end_offset": 5, "consumers": []},
                {"partition": 2, "end_offset": 9, "consumers": [{"client": "c1", "committed": 0, "lag": 9}]},
            ]},
            {"subscription": "b", "partitions": []},
            {"no": "name"},
        ]);
        assert_eq!(summed(&list), BTreeMap::from([("a".into(), 3 + 5 + 9), ("b".into(), 0)]));
    }
}
