//! Many instances over one Kafka cluster (SPEC, "Many instances"): who is live, and with what
//! load. Kafka is the only shared system: every instance heartbeats (its id, `advertised_url`
//! and load) to the evmesh-owned topic [`INSTANCES_TOPIC`] every `heartbeat_ms`, and reads
//! everyone's heartbeats back from it; no consumer group, no other coordination.
//!
//! An instance is live while its last heartbeat was heard less than `instance_timeout_ms` ago,
//! by the reader's own clock: a heartbeat read as it arrives is heard then (so a reader that
//! lags behind the topic, Kafka slow or away, sees instances live for as long as it lags after
//! they stopped). One read while catching up at start (written before this instance looked) is
//! dated by its sender's clock, so clocks are assumed to agree to well within
//! `instance_timeout_ms` (NTP) for that first look. The view is this instance's own: two
//! instances may briefly disagree (one heard a heartbeat the other has not yet), for about one
//! heartbeat when both keep up with the topic.
//!
//! Whoever can write the topic can announce an instance (and send clients to its URL): the
//! `__evmesh.` topics need Kafka ACLs that let only evmesh instances write them.
//!
//! This module is the view and its rules, without I/O, and the seam the rest of the broker asks
//! ([`Cluster`]): `runtime::cluster::kafka` writes and reads the topics, the runtime samples
//! the load, `GET /admin/cluster` shows the view.

pub mod homes;
pub mod replies;
pub mod seam;

pub use seam::{Cluster, HomeInstance, OnBehalf, Single};

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use serde_json::{json, Value as Json};

/// The evmesh-owned Kafka topic of heartbeats (one partition; after `kafka.topic_prefix`).
pub const INSTANCES_TOPIC: &str = "__evmesh.instances";

/// The evmesh-owned Kafka topic of subscription definitions (compacted; key = the stored
/// name, value = the definition's JSON, none once removed): every instance applies them.
pub const SUBSCRIPTIONS_TOPIC: &str = "__evmesh.subscriptions";

/// Topic names starting with this are the broker's own (Kafka topics evmesh writes for itself):
/// no client may publish to or subscribe to one.
pub const RESERVED_PREFIX: &str = "__evmesh.";

/// Instances remembered at most (whoever can write the topic could invent more): past it the
/// longest silent are forgotten.
const MAX_REMEMBERED: usize = 1024;

/// Instance ids: `[A-Za-z0-9._-]{1,64}`.
pub fn valid_instance_id(id: &str) -> bool {
    (1..=64).contains(&id.len()) && id.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

/// What an instance says of itself every `heartbeat_ms`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Heartbeat {
    pub instance_id: String,
    pub advertised_url: String,
    /// Open client connections (sessions of every kind ride on one each).
    pub sessions: u64,
    /// Bytes of events stored per second, over the last heartbeat's interval.
    pub bytes_per_second: u64,
    /// The process's CPU over the last interval, in percent of one core.
    pub cpu_percent: f64,
    /// When it was sent: milliseconds since the epoch, by the sender's clock.
    pub sent_ms: i64,
}

impl Heartbeat {
    /// A heartbeat read from the topic: JSON, its id valid, its URL an http(s) one of sane size.
    pub fn parse(bytes: &[u8]) -> Option<Heartbeat> {
        let hb: Heartbeat = serde_json::from_slice(bytes).ok()?;
        // As `advertised_url` is configured: a scheme and an authority, visible ASCII only (it
        // becomes a `Location` header).
        let url = &hb.advertised_url;
        let authority = url.strip_prefix("http://").or_else(|| url.strip_prefix("https://"));
        let url_ok = url.len() <= 2048
            && authority.is_some_and(|a| !a.is_empty() && !a.contains(['/', '?', '#']))
            && url.bytes().all(|b| b.is_ascii_graphic());
        (valid_instance_id(&hb.instance_id) && url_ok && hb.cpu_percent.is_finite()).then_some(hb)
    }
}

/// The instances this one has heard of, and when.
pub struct Membership {
    me: String,
    timeout: Duration,
    heard: Mutex<HashMap<String, (Heartbeat, Instant)>>,
}

/// One instance as the view shows it.
#[derive(Debug, Clone, PartialEq)]
pub struct Member {
    pub heartbeat: Heartbeat,
    /// How long ago its last heartbeat was heard.
    pub silent: Duration,
}

impl Membership {
    pub fn new(me: String, timeout: Duration) -> Self {
        Membership { me, timeout, heard: Mutex::new(HashMap::new()) }
    }

    /// A heartbeat read at `now`, sent `age` before (zero for one read as it arrived). An
    /// instance's older heartbeat than the one kept changes nothing; one too old to date is
    /// dropped.
    pub fn heard(&self, hb: Heartbeat, age: Duration, now: Instant) {
        let Some(at) = now.checked_sub(age) else { return };
        let mut heard = self.heard.lock().expect("not poisoned");
        if heard.get(&hb.instance_id).is_some_and(|(_, seen)| *seen > at) {
            return;
        }
        if heard.len() >= MAX_REMEMBERED && !heard.contains_key(&hb.instance_id) {
            let oldest = heard.iter().min_by_key(|(_, (_, seen))| *seen).map(|(id, _)| id.clone());
            if let Some(id) = oldest {
                heard.remove(&id);
            }
        }
        heard.insert(hb.instance_id.clone(), (hb, at));
    }

    /// Whether instance `id` is live at `now` (without copying the view).
    pub fn is_live(&self, id: &str, now: Instant) -> bool {
        let heard = self.heard.lock().expect("not poisoned");
        heard.get(id).is_some_and(|(_, at)| now.saturating_duration_since(*at) < self.timeout)
    }

    /// The live instances at `now`, by id; those silent ten timeouts are forgotten.
    pub fn live(&self, now: Instant) -> Vec<Member> {
        let mut heard = self.heard.lock().expect("not poisoned");
        heard.retain(|_, (_, at)| now.saturating_duration_since(*at) < self.timeout * 10);
        let mut live: Vec<Member> = heard
            .values()
            .map(|(hb, at)| Member { heartbeat: hb.clone(), silent: now.saturating_duration_since(*at) })
            .filter(|m| m.silent < self.timeout)
            .collect();
        live.sort_by(|a, b| a.heartbeat.instance_id.cmp(&b.heartbeat.instance_id));
        live
    }

    /// `GET /admin/cluster`: this instance's id and the live instances it knows of.
    pub fn view(&self, now: Instant, storage: &str) -> Json {
        let instances: Vec<Json> = self
            .live(now)
            .into_iter()
            .map(|m| {
                let hb = m.heartbeat;
                json!({
                    "instanceId": hb.instance_id,
                    "advertisedUrl": hb.advertised_url,
                    "sessions": hb.sessions,
                    "bytesPerSecond": hb.bytes_per_second,
                    "cpuPercent": hb.cpu_percent,
                    "lastHeartbeatMs": m.silent.as_millis() as u64,
                    "self": hb.instance_id == self.me,
                })
            })
            .collect();
        json!({
            "instanceId": self.me,
            "storage": storage,
            "instanceTimeoutMs": self.timeout.as_millis() as u64,
            "instances": instances,
        })
    }
}

/// Turns running totals into the rates a heartbeat carries.
pub struct LoadSampler {
    at: Instant,
    cpu_us: u64,
    bytes: u64,
}

impl LoadSampler {
    pub fn new(now: Instant, cpu_us: u64, bytes: u64) -> Self {
        LoadSampler { at: now, cpu_us, bytes }
    }

    /// (bytes per second, CPU percent of one core) since the last sample.
    pub fn sample(&mut self, now: Instant, cpu_us: u64, bytes: u64) -> (u64, f64) {
        let secs = now.saturating_duration_since(self.at).as_secs_f64();
        let (d_cpu, d_bytes) = (cpu_us.saturating_sub(self.cpu_us), bytes.saturating_sub(self.bytes));
        *self = LoadSampler { at: now, cpu_us, bytes };
        if secs <= 0.0 {
            return (0, 0.0);
        }
        let cpu = (d_cpu as f64 / 1e6 / secs * 1000.0).round() / 10.0;
        ((d_bytes as f64 / secs) as u64, cpu)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hb(id: &str) -> Heartbeat {
        Heartbeat {
            instance_id: id.into(),
            advertised_url: format!("http://{id}:8080"),
            sessions: 1,
            bytes_per_second: 2,
            cpu_percent: 3.5,
            sent_ms: 0,
        }
    }

    fn ids(m: &Membership, now: Instant) -> Vec<String> {
        m.live(now).into_iter().map(|m| m.heartbeat.instance_id).collect()
    }

    #[test]
    fn an_instance_is_live_while_heard_within_the_timeout() {
        let (t0, timeout) = (Instant::now(), Duration::from_millis(3000));
        let m = Membership::new("a".into(), timeout);
        m.heard(hb("b"), Duration::ZERO, t0);
        m.heard(hb("a"), Duration::ZERO, t0 + Duration::from_millis(1000));
        assert_eq!(ids(&m, t0 + Duration::from_millis(2999)), ["a", "b"]);
        assert_eq!(ids(&m, t0 + Duration::from_millis(3000)), ["a"], "b silent for the timeout");
        assert!(m.is_live("a", t0 + Duration::from_millis(3000)) && !m.is_live("b", t0 + Duration::from_millis(3000)));
        // Heard again: live again.
        m.heard(hb("b"), Duration::ZERO, t0 + Duration::from_millis(3500));
        assert_eq!(ids(&m, t0 + Duration::from_millis(3600)), ["a", "b"]);
    }

    #[test]
    fn a_heartbeat_read_late_counts_from_when_it_was_sent_and_never_goes_back() {
        let (t0, timeout) = (Instant::now() + Duration::from_secs(100), Duration::from_millis(3000));
        let m = Membership::new("a".into(), timeout);
        // Read while catching up: sent 5 s ago, so already not live.
        m.heard(hb("gone"), Duration::from_secs(5), t0);
        m.heard(hb("b"), Duration::from_secs(1), t0);
        assert_eq!(ids(&m, t0), ["b"]);
        // An older heartbeat of b read after a newer one changes nothing.
        m.heard(hb("b"), Duration::from_secs(2), t0);
        assert_eq!(m.live(t0)[0].silent, Duration::from_secs(1));
        // Forgotten after ten timeouts.
        assert!(m.live(t0 + timeout * 11).is_empty());
        assert!(m.heard.lock().unwrap().is_empty());
    }

    #[test]
    fn the_view_shows_load_and_which_is_this_instance() {
        let t0 = Instant::now();
        let m = Membership::new("a".into(), Duration::from_secs(3));
        m.heard(hb("a"), Duration::ZERO, t0);
        m.heard(hb("b"), Duration::ZERO, t0);
        let v = m.view(t0 + Duration::from_millis(250), "kafka");
        assert_eq!(v["instanceId"], "a");
        assert_eq!(v["instances"][0]["self"], true);
        assert_eq!(v["instances"][1]["self"], false);
        assert_eq!(v["instances"][1]["advertisedUrl"], "http://b:8080");
        assert_eq!(v["instances"][1]["lastHeartbeatMs"], 250);
        assert_eq!(v["instances"][1]["cpuPercent"], 3.5);
    }

    #[test]
    fn remembered_instances_are_bounded() {
        let t0 = Instant::now();
        let m = Membership::new("a".into(), Duration::from_secs(3));
        for i in 0..MAX_REMEMBERED + 10 {
            m.heard(hb(&format!("i{i}")), Duration::ZERO, t0 + Duration::from_micros(i as u64));
        }
        assert_eq!(m.heard.lock().unwrap().len(), MAX_REMEMBERED);
        assert!(!m.heard.lock().unwrap().contains_key("i0"), "the longest silent went first");
    }

    #[test]
    fn heartbeats_from_the_topic_are_checked() {
        let good = serde_json::to_vec(&hb("b")).unwrap();
        assert_eq!(Heartbeat::parse(&good), Some(hb("b")));
        for bad in [
            &br#"{"instanceId":"b c","advertisedUrl":"http://x","sessions":0,"bytesPerSecond":0,"cpuPercent":0,"sentMs":0}"#[..],
            br#"{"instanceId":"b","advertisedUrl":"ftp://x","sessions":0,"bytesPerSecond":0,"cpuPercent":0,"sentMs":0}"#,
            br#"{"instanceId":"b","advertisedUrl":"http://x\r\nset-cookie: a=b","sessions":0,"bytesPerSecond":0,"cpuPercent":0,"sentMs":0}"#,
            br#"{"instanceId":"b","advertisedUrl":"http://x/path","sessions":0,"bytesPerSecond":0,"cpuPercent":0,"sentMs":0}"#,
            br#"{"instanceId":"b"}"#,
            b"not json",
        ] {
            assert_eq!(Heartbeat::parse(bad), None, "{}", String::from_utf8_lossy(bad));
        }
    }

    #[test]
    fn load_is_a_rate_over_the_interval() {
        let t0 = Instant::now();
        let mut s = LoadSampler::new(t0, 1_000_000, 100);
        // Half a core and 1,000 bytes a second over two seconds.
        assert_eq!(s.sample(t0 + Duration::from_secs(2), 2_000_000, 2100), (1000, 50.0));
        assert_eq!(s.sample(t0 + Duration::from_secs(2), 2_000_000, 2100), (0, 0.0), "no time passed");
    }
}
