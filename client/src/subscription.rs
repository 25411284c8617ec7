//! Subscriptions (SPEC "Subscriptions"): the definition a client sends to
//! `POST /events/subscribe`, built with [`Subscription::new`] and its setters.

use std::time::Duration;

use reqwest::Url;
use serde::{Deserialize, Serialize, Serializer};

use crate::client::{Call, Client};
use crate::error::Result;

/// How a subscription's events are shared among its attached sessions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum Mode {
    /// Each event to exactly one session; partitions sticky to a session (the default).
    LoadBalance,
    /// Every session (each `clientId` with its own offsets) gets every event.
    Broadcast,
    /// Every session whose own filter matches gets the event.
    Multicast,
}

/// A CloudEvents Subscriptions API filter (or a CESQL expression); a subscription's filters
/// are ANDed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Filter(serde_json::Value);

impl Filter {
    fn one(dialect: &str, attribute: &str, value: &str) -> Filter {
        Filter(serde_json::json!({ dialect: { attribute: value } }))
    }

    /// `attribute` equals `value`.
    pub fn exact(attribute: &str, value: &str) -> Filter {
        Filter::one("exact", attribute, value)
    }

    /// `attribute` starts with `value`.
    pub fn prefix(attribute: &str, value: &str) -> Filter {
        Filter::one("prefix", attribute, value)
    }

    /// `attribute` ends with `value`.
    pub fn suffix(attribute: &str, value: &str) -> Filter {
        Filter::one("suffix", attribute, value)
    }

    /// Every one of `filters` matches.
    pub fn all(filters: impl IntoIterator<Item = Filter>) -> Filter {
        Filter(serde_json::json!({ "all": filters.into_iter().collect::<Vec<_>>() }))
    }

    /// At least one of `filters` matches.
    pub fn any(filters: impl IntoIterator<Item = Filter>) -> Filter {
        Filter(serde_json::json!({ "any": filters.into_iter().collect::<Vec<_>>() }))
    }

    /// A CESQL 1.0 expression, e.g. `amount > 100 AND type LIKE 'com.shop.%'`.
    pub fn sql(expression: &str) -> Filter {
        Filter(serde_json::json!({ "sql": expression }))
    }

    /// The filter's JSON.
    pub fn as_json(&self) -> &serde_json::Value {
        &self.0
    }
}

/// `!filter`: the `not` dialect, matching what `filter` does not.
impl std::ops::Not for Filter {
    type Output = Filter;

    fn not(self) -> Filter {
        Filter(serde_json::json!({ "not": self }))
    }
}

/// Where a new consumer starts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Start {
    /// New events only (the default).
    Latest,
    /// Everything stored.
    Earliest,
    /// This offset of every partition (clamped to what is stored).
    Offset(u64),
    /// The first event published at or after this RFC 3339 time.
    Time(String),
}

impl Serialize for Start {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Start::Latest => s.serialize_str("latest"),
            Start::Earliest => s.serialize_str("earliest"),
            Start::Offset(o) => serde_json::json!({ "offset": o }).serialize(s),
            Start::Time(t) => serde_json::json!({ "time": t }).serialize(s),
        }
    }
}

/// A subscription's definition.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Subscription {
    subscription: String,
    topic: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    mode: Option<Mode>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    filters: Vec<Filter>,
    #[serde(skip_serializing_if = "Option::is_none")]
    start: Option<Start>,
    #[serde(skip_serializing_if = "Option::is_none")]
    ack_timeout_ms: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    max_attempts: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    sink: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    sink_secret: Option<String>,
}

impl Subscription {
    /// Subscription `name` of `topic`, with the broker's defaults (LOAD_BALANCE, start latest).
    pub fn new(name: impl Into<String>, topic: impl Into<String>) -> Subscription {
        Subscription {
            subscription: name.into(),
            topic: topic.into(),
            mode: None,
            filters: Vec::new(),
            start: None,
            ack_timeout_ms: None,
            max_attempts: None,
            sink: None,
            sink_secret: None,
        }
    }

    /// The subscription's name.
    pub fn name(&self) -> &str {
        &self.subscription
    }

    /// How events are shared among sessions.
    pub fn mode(mut self, mode: Mode) -> Self {
        self.mode = Some(mode);
        self
    }

    /// Adds a filter (filters are ANDed).
    pub fn filter(mut self, filter: Filter) -> Self {
        self.filters.push(filter);
        self
    }

    /// Adds a CESQL filter.
    pub fn sql(self, expression: &str) -> Self {
        self.filter(Filter::sql(expression))
    }

    /// Where a new consumer starts.
    pub fn start(mut self, start: Start) -> Self {
        self.start = Some(start);
        self
    }

    /// How long a delivery may stay unacknowledged before it is sent again.
    pub fn ack_timeout(mut self, timeout: Duration) -> Self {
        self.ack_timeout_ms = Some(timeout.as_millis().try_into().unwrap_or(u64::MAX));
        self
    }

    /// How many deliveries an event gets before it is dead-lettered.
    pub fn max_attempts(mut self, attempts: u32) -> Self {
        self.max_attempts = Some(attempts);
        self
    }

    /// Pushes each event to this webhook (signed with `secret`) instead of waiting for sessions.
    pub fn sink(mut self, url: impl Into<String>, secret: Option<String>) -> Self {
        self.sink = Some(url.into());
        self.sink_secret = secret;
        self
    }
}

/// The broker's answer to [`Client::subscribe`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Subscribed {
    /// `true` when this call made the subscription, `false` when it existed as defined.
    pub created: bool,
    /// The subscription's home instance, where its sessions attach (many instances).
    pub instance_url: Option<Url>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct SubscribeAnswer {
    #[serde(default)]
    instance_url: Option<String>,
}

impl Client {
    /// Creates `subscription`, or confirms it exists as defined (a different definition of
    /// the same name is a 409 [`Error::Api`](crate::Error::Api)).
    pub async fn subscribe(&self, subscription: &Subscription) -> Result<Subscribed> {
        let a = self.call(None, Call::post("/events/subscribe").json(subscription)).await?;
        let body: SubscribeAnswer = a.json().unwrap_or(SubscribeAnswer { instance_url: None });
        Ok(Subscribed { created: a.status == 201, instance_url: body.instance_url.and_then(|u| Url::parse(&u).ok()) })
    }

    /// Removes subscription `name`; its attached sessions are closed.
    pub async fn unsubscribe(&self, name: &str) -> Result<()> {
        self.call(None, Call::post("/events/unsubscribe").json(&serde_json::json!({ "subscription": name }))).await?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_subscription_is_the_json_of_the_spec() {
        let s = Subscription::new("billing", "orders")
            .mode(Mode::LoadBalance)
            .filter(Filter::prefix("type", "com.shop."))
            .sql("amount > 100")
            .filter(!Filter::any([Filter::exact("source", "/a"), Filter::suffix("subject", ".tmp")]))
            .start(Start::Offset(5))
            .ack_timeout(Duration::from_secs(30))
            .max_attempts(6);
        let json = serde_json::to_value(&s).unwrap();
        assert_eq!(
            json,
            serde_json::json!({"subscription": "billing", "topic": "orders", "mode": "LOAD_BALANCE",
                "filters": [{"prefix": {"type": "com.shop."}}, {"sql": "amount > 100"},
                    {"not": {"any": [{"exact": {"source": "/a"}}, {"suffix": {"subject": ".tmp"}}]}}],
                "start": {"offset": 5}, "ackTimeoutMs": 30000, "maxAttempts": 6})
        );
        let plain = serde_json::to_value(Subscription::new("a", "b").start(Start::Earliest)).unwrap();
        assert_eq!(plain, serde_json::json!({"subscription": "a", "topic": "b", "start": "earliest"}));
    }
}
