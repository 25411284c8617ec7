//! A subscription's definition: parsed and checked from the `POST /events/subscribe` body,
//! normalized (defaults filled in) so that "the same definition again" can be compared, and
//! stored as JSON in the `meta` column family.

use serde::{Deserialize, Serialize};
use serde_json::Value as Json;

use super::filter::{self, Filter};
use crate::model::valid_topic;

/// How events of a subscription are spread over its attached sessions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum Mode {
    /// Each event to exactly one session; each partition sticky to one session at a time.
    LoadBalance,
    /// Every attached session gets every event.
    Broadcast,
    /// Each session brings its own filter; every session whose filter matches gets the event.
    Multicast,
}

/// Where a new subscription starts reading.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Start {
    /// `"latest"` or `"earliest"`.
    Named(String),
    /// `{"offset": N}`: the same offset in every partition.
    Offset { offset: u64 },
    /// `{"time": RFC3339}`: the first event published at or after it.
    Time { time: String },
}

/// The normalized definition, as stored and compared.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Definition {
    pub subscription: String,
    pub topic: String,
    pub mode: Mode,
    /// The filters as the client sent them (compiled separately, see [`Definition::compile`]).
    pub filters: Vec<Json>,
    pub start: Start,
    pub ack_timeout_ms: u64,
    pub max_attempts: u32,
    /// When it was created (µs since the epoch): where `"latest"` starts for `LOAD_BALANCE`,
    /// so events published between subscribing and attaching a session are kept for it.
    /// Not part of the definition's identity (see [`Definition::same_as`]).
    #[serde(default)]
    pub created_us: i64,
    /// A webhook: every event is POSTed to this `http://` URL instead of to attached sessions
    /// (`crate::push::webhook`), one event of a partition at a time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sink: Option<String>,
    /// The key of the sink's `X-Em-Signature` (none: requests are not signed). Never shown:
    /// answers and listings use [`Definition::shown`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sink_secret: Option<String>,
    /// A classic consumer group's (`/eventmesh/subscribe`): its events are pushed to the
    /// group's URLs by webhook sessions, as a sink's are. Set by the broker, never by a request.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub classic: bool,
}

/// The body of `POST /events/subscribe`, before defaults.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Request {
    subscription: String,
    topic: String,
    #[serde(default)]
    mode: Option<Mode>,
    #[serde(default)]
    filters: Option<Json>,
    #[serde(default)]
    start: Option<Start>,
    #[serde(default)]
    ack_timeout_ms: Option<u64>,
    #[serde(default)]
    max_attempts: Option<u32>,
    #[serde(default)]
    sink: Option<String>,
    #[serde(default)]
    sink_secret: Option<String>,
}

pub const DEFAULT_ACK_TIMEOUT_MS: u64 = 30_000;
pub const DEFAULT_MAX_ATTEMPTS: u32 = 6;
/// Bytes of a sink URL, and of its secret, at most.
pub const MAX_SINK_BYTES: usize = 2048;
pub const MAX_SINK_SECRET_BYTES: usize = 256;

impl Definition {
    /// Parses and checks a subscribe request body; the error text is what the client sees.
    pub fn parse(body: &[u8]) -> Result<Definition, String> {
        let r: Request = serde_json::from_slice(body).map_err(|e| format!("invalid subscription: {e}"))?;
        if !valid_topic(&r.subscription) {
            return Err("subscription names are [A-Za-z0-9._-]{1,249}".into());
        }
        if !valid_topic(&r.topic) {
            return Err("topic names are [A-Za-z0-9._-]{1,249}".into());
        }
        let start = r.start.unwrap_or(Start::Named("latest".into()));
        match &start {
            Start::Named(n) if n != "latest" && n != "earliest" => {
                return Err(format!("start {n:?} is not latest, earliest, {{\"offset\": N}} or {{\"time\": RFC3339}}"));
            }
            Start::Time { time } if !crate::adaptor::is_rfc3339(time) => {
                return Err(format!("start time {time:?} is not an RFC 3339 timestamp"));
            }
            _ => {}
        }
        let ack_timeout_ms = r.ack_timeout_ms.unwrap_or(DEFAULT_ACK_TIMEOUT_MS);
        if !(100..=3_600_000).contains(&ack_timeout_ms) {
            return Err("ackTimeoutMs must be 100..=3600000".into());
        }
        let max_attempts = r.max_attempts.unwrap_or(DEFAULT_MAX_ATTEMPTS);
        if !(1..=100).contains(&max_attempts) {
            return Err("maxAttempts must be 1..=100".into());
        }
        let filters = match r.filters {
            None | Some(Json::Null) => Vec::new(),
            Some(Json::Array(items)) => items,
            Some(_) => return Err("filters must be an array".into()),
        };
        if let Some(sink) = &r.sink {
            if sink.len() > MAX_SINK_BYTES {
                return Err(format!("sink: at most {MAX_SINK_BYTES} bytes"));
            }
            crate::server::client::Url::parse(sink).map_err(|e| format!("sink: {e}"))?;
        }
        match (&r.sink, &r.sink_secret) {
            (None, Some(_)) => return Err("sinkSecret signs what is POSTed to a sink: it needs a sink".into()),
            (_, Some(k)) if k.is_empty() || k.len() > MAX_SINK_SECRET_BYTES => {
                return Err(format!("sinkSecret must be 1..={MAX_SINK_SECRET_BYTES} bytes"));
            }
            _ => {}
        }
        let def = Definition {
            subscription: r.subscription,
            topic: r.topic,
            mode: r.mode.unwrap_or(Mode::LoadBalance),
            filters,
            start,
            ack_timeout_ms,
            max_attempts,
            created_us: 0,
            sink: r.sink,
            sink_secret: r.sink_secret,
            classic: false,
        };
        def.compile().map_err(|e| e.to_string())?;
        Ok(def)
    }

    /// The definition as answers and listings show it: the sink's secret left out (whether
    /// there is one is `sinkSigned`).
    pub fn shown(&self) -> Json {
        let mut json = serde_json::to_value(self).expect("Definition serializes");
        if let Some(obj) = json.as_object_mut() {
            if obj.remove("sinkSecret").is_some() {
                obj.insert("sinkSigned".into(), Json::Bool(true));
            }
        }
        json
    }

    /// Whether only the broker's webhook sessions deliver it (a sink, or a classic group's
    /// push URLs): client sessions cannot attach nor ack, and a partition has one event in
    /// flight at a time, so its order holds across failed attempts.
    pub fn pushed(&self) -> bool {
        self.sink.is_some() || self.classic
    }

    /// Whether `other` defines the same subscription (creation time aside).
    pub fn same_as(&self, other: &Definition) -> bool {
        Definition { created_us: other.created_us, ..self.clone() } == *other
    }

    /// The compiled filters (done once per subscription, not per event).
    pub fn compile(&self) -> Result<Vec<Filter>, filter::FilterError> {
        filter::compile(Some(&Json::Array(self.filters.clone())))
    }

    /// The filters of a stored definition. One that no longer compiles (stored by an older
    /// evmesh whose limits were looser) matches nothing, and says so: delivering every event
    /// to a subscriber that asked for a filter would be worse than delivering none.
    pub fn compile_stored(&self) -> Vec<Filter> {
        self.compile().unwrap_or_else(|e| {
            crate::log::warn(
                "subscription",
                &format!(
                    "subscription {}: stored filter no longer compiles ({e}); it matches nothing",
                    self.subscription
                ),
                &[],
            );
            vec![Filter::Any(Vec::new())]
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_and_normalization() {
        let d = Definition::parse(br#"{"subscription":"billing","topic":"orders"}"#).unwrap();
        assert_eq!(d.mode, Mode::LoadBalance);
        assert_eq!(d.start, Start::Named("latest".into()));
        assert_eq!((d.ack_timeout_ms, d.max_attempts), (30_000, 6));
        let explicit = Definition::parse(
            br#"{"subscription":"billing","topic":"orders","mode":"LOAD_BALANCE","filters":[],"start":"latest","ackTimeoutMs":30000,"maxAttempts":6}"#,
        )
        .unwrap();
        assert_eq!(d, explicit, "the same definition, spelled out, compares equal");
        let later = Definition { created_us: 42, ..explicit.clone() };
        assert!(d.same_as(&later) && later.same_as(&d), "creation time is not identity");
        let other = Definition { max_attempts: 2, ..explicit };
        assert!(!d.same_as(&other));
        let d =
            Definition::parse(br#"{"subscription":"s","topic":"t","mode":"BROADCAST","start":{"offset":5}}"#).unwrap();
        assert_eq!((d.mode, d.start), (Mode::Broadcast, Start::Offset { offset: 5 }));
        let d =
            Definition::parse(br#"{"subscription":"s","topic":"t","start":{"time":"2026-01-01T00:00:00Z"}}"#).unwrap();
        assert_eq!(d.start, Start::Time { time: "2026-01-01T00:00:00Z".into() });
        let stored = serde_json::to_vec(&d).unwrap();
        assert_eq!(serde_json::from_slice::<Definition>(&stored).unwrap(), d);
    }

    #[test]
    fn a_sink_secret_is_stored_but_never_shown() {
        let body = br#"{"subscription":"s","topic":"t","sink":"http://127.0.0.1:9/h","sinkSecret":"k3y"}"#;
        let d = Definition::parse(body).unwrap();
        assert_eq!((d.sink.as_deref(), d.sink_secret.as_deref()), (Some("http://127.0.0.1:9/h"), Some("k3y")));
        let stored = serde_json::to_vec(&d).unwrap();
        assert_eq!(serde_json::from_slice::<Definition>(&stored).unwrap(), d, "kept to sign after a restart");
        let shown = d.shown().to_string();
        assert!(!shown.contains("k3y") && shown.contains(r#""sinkSigned":true"#), "{shown}");
        let plain = Definition::parse(br#"{"subscription":"s","topic":"t"}"#).unwrap();
        assert!(!serde_json::to_string(&plain).unwrap().contains("sink"), "no sink: stored as before");
    }

    /// Regression: a stored filter that no longer compiles (an older evmesh's looser limits)
    /// was replaced by no filter at all, so the subscriber got every event.
    #[test]
    fn a_stored_filter_that_no_longer_compiles_matches_nothing() {
        let mut d = Definition::parse(br#"{"subscription":"s","topic":"t"}"#).unwrap();
        assert!(d.compile_stored().is_empty(), "no filter: everything matches");
        d.filters = vec![serde_json::json!({"sql": "(".repeat(500)})];
        let compiled = d.compile_stored();
        assert!(matches!(compiled.as_slice(), [Filter::Any(none)] if none.is_empty()), "{compiled:?}");
    }

    #[test]
    fn bad_definitions_say_why() {
        for (body, want) in [
            (r#"{"topic":"t"}"#, "subscription"),
            (r#"{"subscription":"a b","topic":"t"}"#, "subscription names"),
            (r#"{"subscription":"s","topic":"t/x"}"#, "topic names"),
            (r#"{"subscription":"s","topic":"t","mode":"ROUND_ROBIN"}"#, "unknown variant"),
            (r#"{"subscription":"s","topic":"t","start":"now"}"#, "start"),
            (r#"{"subscription":"s","topic":"t","start":{"time":"yesterday"}}"#, "RFC 3339"),
            (r#"{"subscription":"s","topic":"t","ackTimeoutMs":1}"#, "ackTimeoutMs"),
            (r#"{"subscription":"s","topic":"t","maxAttempts":0}"#, "maxAttempts"),
            (r#"{"subscription":"s","topic":"t","filters":[{"regex":{"type":"x"}}]}"#, "unknown dialect"),
            (r#"{"subscription":"s","topic":"t","filters":[{"sql":"type ="}]}"#, "CESQL parse error"),
            (r#"{"subscription":"s","topic":"t","bogus":1}"#, "unknown field"),
            (r#"{"subscription":"s","topic":"t","sink":"ftp://x/"}"#, "sink: "),
            (r#"{"subscription":"s","topic":"t","sink":"http://u:p@127.0.0.1/"}"#, "user info"),
            (r#"{"subscription":"s","topic":"t","sinkSecret":"k"}"#, "needs a sink"),
            (r#"{"subscription":"s","topic":"t","sink":"http://127.0.0.1/","sinkSecret":""}"#, "sinkSecret must be"),
        ] {
            let err = Definition::parse(body.as_bytes()).unwrap_err();
            assert!(err.contains(want), "{body}: {err}");
        }
        // CESQL beyond its compile limits is refused at subscribe, saying which limit.
        for (sql, want) in [
            (format!("n{} > 0", " + n".repeat(70)), "nested deeper than 64"),
            (format!("length(concat({})) > 0", vec!["x"; 65].join(",")), "at most 64 arguments"),
            (format!("n IN ({})", vec!["1"; 1100].join(",")), "longer than 2048 tokens"),
        ] {
            let body = serde_json::json!({"subscription": "s", "topic": "t", "filters": [{"sql": sql}]});
            let err = Definition::parse(body.to_string().as_bytes()).unwrap_err();
            assert!(err.contains("filters[0].sql: CESQL parse error") && err.contains(want), "{err}");
        }
    }
}
