//! Homes: each subscription (and, by client id, each client) has one home instance among the
//! live ones, the only one that serves it.
//!
//! * **Choice**: rendezvous hashing weighted by load. Every live instance scores
//!   `weight / -ln(u)`, `u` a hash of (key, instance id) in (0, 1), `weight` falling with the
//!   instance's load (connections and CPU); the highest score wins. Instances with the same view
//!   and loads compute the same winner without talking to each other; as views and loads differ
//!   by up to a heartbeat, so may their choices for a key nobody has claimed yet, which is why
//!   the first choice is recorded.
//! * **Stickiness**: the first choice is recorded as a claim in the evmesh-owned Kafka topic
//!   [`HOMES_TOPIC`] (key = the home's key, value = a [`Claim`]: the instance, and an epoch
//!   one past the claim it replaces); every instance reads the claims back in log order. A
//!   claim counts only if its epoch is past the key's claim at that point of the log (or it is
//!   the holder's own again), so of two instances that replace a dead home at once (their
//!   views differ for up to a heartbeat) the first in the log wins for every reader alike, and
//!   the other's choice is dropped; the holder then claims the key again, so the last record of
//!   the key (all the compacted topic keeps) names it, and a reader that started after
//!   compaction with a losing claim agrees again at the key's next claim. A recorded home
//!   stays the home while it is live, whatever joins or how loads change; when it is not live,
//!   the next to ask records a new choice. Until a reader has read a claim it may serve the
//!   key where it stands: delivery is at-least-once, clients dedupe on `id`.
//! * **What is recorded**: the homes of subscriptions that exist (one claim per subscription,
//!   bounded by `max_subscriptions` per instance), of agents registered (claimed by the home as
//!   it serves a registration or heartbeat; released on deregistering, or once the agent is
//!   forgotten there) and of lite topics stored (claimed by the home after the first store;
//!   released when the topic expires there). Only the instance that serves a key claims it: a
//!   request sent on to the home leaves no claim. A client's home is chosen and not recorded
//!   (it moves when the live set changes). An instance answers nothing until it
//!   has read the claims written before it started ([`Homes::caught_up`]): answering from an
//!   empty table, it would record choices over the homes already recorded.
//! * **Offsets**: the home writes every offset and attempt count it stores to the same log
//!   (key `off/<offset key>`, its id in a header), gathered for 10 ms. Every instance applies
//!   a record to its own copy (`offsets.N`) only if the subscription's claim, at that point of
//!   the log, names the record's writer: one log orders the claims and the offsets, so an
//!   instance whose claim replaces a dead home has, once it reads its claim back, read every
//!   offset the dead home wrote, and a home that was paused and resumes writes nothing anyone
//!   applies. A new home serves a key only after reading its claim back
//!   (`HomeInstance::settled`); nothing acknowledged is delivered again beyond what was in
//!   flight, or acked in the last 10 ms before a kill -9.
//!
//! Pure: `runtime::cluster::kafka` writes and reads the claims (through `storage::kafka`).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::Member;

/// The evmesh-owned Kafka topic of home claims and the homes' offsets (one partition, compacted;
/// after `kafka.topic_prefix`).
pub const HOMES_TOPIC: &str = "__evmesh.homes";

/// Offset records' keys in [`HOMES_TOPIC`] start with this (claims' with their home key).
pub const OFFSET_KEY: &str = "off/";
/// The header naming the instance that wrote an offset record.
pub const BY_HEADER: &str = "evmesh-by";

/// Claims remembered at most (whoever can write the topic could write more): past it one is
/// forgotten per new one (a forgotten key is chosen again, its choice recorded again).
const MAX_CLAIMS: usize = 1 << 20;
/// Lite topics' claims at most (cluster-wide, as read): half the table, so subscriptions' and
/// agents' claims keep room (a store to a new session topic past it is refused, 503).
pub const MAX_LITE_CLAIMS: usize = MAX_CLAIMS / 2;

/// Whether `key` is a lite topic's home key ([`lite_key`]).
fn is_lite(key: &str) -> bool {
    key.starts_with("lite/")
}

/// Choices written and not read back yet, at most.
const MAX_PENDING: usize = 1 << 16;
/// Keys longer than this are not claims of ours (a subscription key is at most ~260 bytes).
const MAX_KEY: usize = 512;

/// The key of a subscription's home.
pub fn subscription_key(stored: &str) -> String {
    format!("sub/{stored}")
}

/// The key of an agent's home (its stored id): its registration, attachment, sessions and
/// turns are served there.
pub fn agent_key(stored: &str) -> String {
    format!("agent/{stored}")
}

/// The key of the home of a session pub/sub (Mode 2) lite topic, by its stored name, when
/// the session is no agent's (an agent's session is served at the agent's home).
pub fn lite_key(stored: &str) -> String {
    format!("lite/{stored}")
}

/// The key of a client's home (`GET /session/recommend?clientId=C`).
pub fn client_key(client: &str) -> String {
    format!("client/{client}")
}

/// A hash of (key, instance) in (0, 1): FNV-1a over both, then SplitMix64's finalizer
/// (stable across versions and machines: every instance must compute the same).
fn unit(key: &str, instance: &str) -> f64 {
    let fnv = |h: u64, bytes: &[u8]| bytes.iter().fold(h, |h, &b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3));
    let h = fnv(fnv(0xcbf2_9ce4_8422_2325, key.as_bytes()), &[0xff]);
    let mut z = fnv(h, instance.as_bytes());
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^= z >> 31;
    ((z >> 11) as f64 + 0.5) / (1u64 << 53) as f64
}

/// An instance's weight: 1 idle, falling as its connections and CPU grow (twice as loaded,
/// about half as likely to be chosen).
fn weight(m: &Member) -> f64 {
    let hb = &m.heartbeat;
    1.0 / (1.0 + hb.sessions as f64 / 1000.0 + hb.cpu_percent.max(0.0) / 100.0)
}

/// The weighted rendezvous winner for `key` among `live` (ties by instance id).
pub fn choose<'m>(key: &str, live: &'m [Member]) -> Option<&'m Member> {
    let score = |m: &Member| weight(m) / -unit(key, &m.heartbeat.instance_id).ln();
    live.iter().max_by(|a, b| {
        score(a).total_cmp(&score(b)).then_with(|| b.heartbeat.instance_id.cmp(&a.heartbeat.instance_id))
    })
}

/// The claims read back from the homes topic, and the ones this instance wrote and has not
/// read back yet.
#[derive(Default)]
pub struct Homes {
    state: Mutex<State>,
    /// Set once the claims written before this instance started were read.
    caught_up: std::sync::atomic::AtomicBool,
    /// Set while the view may be stale: the cluster thread stood still past two heartbeats
    /// (the process was paused, or starved) and has not read the cluster topics to their end
    /// since. Every other instance then looks silent by this one's clock: answering, it would
    /// take over their homes.
    stale: std::sync::atomic::AtomicBool,
}

#[derive(Default)]
struct State {
    /// key -> (instance id, when read).
    /// key -> (instance id, the claim's epoch, when read).
    claims: HashMap<String, (String, u64, Instant)>,
    /// How many of `claims` are lite topics' (see [`Homes::lite_claims`]).
    lite: usize,
    /// key -> (instance id, when written): used until read back, at most `pending_for`.
    pending: HashMap<String, (String, Instant)>,
}

/// The home of a key, and whether a claim for it should be written.
#[derive(Debug, PartialEq)]
pub struct Home<'m> {
    pub member: &'m Member,
    pub record: bool,
    /// The epoch of the claim to write: one past the key's claim it replaces (1 for none).
    pub epoch: u64,
    /// A claim names it (read back, or this instance's own on its way), not a choice alone.
    pub claimed: bool,
}

/// A claim record's value: the instance claiming a key, and the claim's epoch (one past the
/// epoch of the claim it replaces). A claim counts only if its epoch is past the key's at that
/// point of the log, or it is the holder saying it again (see [`Homes::claimed`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claim {
    pub instance: String,
    pub epoch: u64,
}

impl Claim {
    /// `instance`, `\n`, the epoch in decimal.
    pub fn encode(&self) -> Vec<u8> {
        format!("{}\n{}", self.instance, self.epoch).into_bytes()
    }

    /// `None` for a value that is not one (the id checked).
    pub fn decode(v: &[u8]) -> Option<Claim> {
        let (instance, epoch) = std::str::from_utf8(v).ok()?.split_once('\n')?;
        let epoch = epoch.parse().ok().filter(|e: &u64| epoch == e.to_string())?;
        super::valid_instance_id(instance).then(|| Claim { instance: instance.to_owned(), epoch })
    }
}

/// What a claim record read from the log did.
#[derive(Debug, PartialEq, Eq)]
pub enum Read {
    /// The claim (or release) counts; `was`: the instance that held the key before.
    Taken { was: Option<String> },
    /// It came too late: another claim of its epoch (or a later one) came first. `holder`
    /// keeps the key, with its claim's `epoch`.
    Lost { holder: String, epoch: u64 },
    /// Not a claim of ours (a key too long).
    Ignored,
}

impl Homes {
    /// A claim read from the topic, in log order, or a release (`None`: the subscription was
    /// removed). A claim counts if its epoch is past the key's claim at this point of the log
    /// (or the key has none here), or it is the holder's own again: of two instances that
    /// replace a dead home at once (both one past its epoch), the first in the log wins, for
    /// every reader alike, and the other's choice is dropped. A reader of a compacted log (only
    /// each key's last record kept) that took a losing claim, its winner's records gone, agrees
    /// with everyone again at the key's next claim, whose epoch is past both.
    pub fn claimed(&self, key: String, claim: Option<Claim>, now: Instant) -> Read {
        let mut s = self.state.lock().expect("not poisoned");
        let Some(Claim { instance, epoch }) = claim else {
            s.pending.remove(&key);
            let was = s.claims.remove(&key).map(|(id, _, _)| id);
            s.lite -= usize::from(was.is_some() && is_lite(&key));
            return Read::Taken { was };
        };
        if key.len() > MAX_KEY {
            return Read::Ignored;
        }
        if s.pending.get(&key).is_some_and(|(id, _)| *id == instance) {
            s.pending.remove(&key);
        }
        if let Some((holder, held, _)) = s.claims.get(&key) {
            if epoch < *held || (epoch == *held && instance != *holder) {
                return Read::Lost { holder: holder.clone(), epoch: *held };
            }
        }
        if s.claims.len() >= MAX_CLAIMS && !s.claims.contains_key(&key) {
            // A subscription's claim is forgotten last (instances forget in their own order,
            // and would disagree on the home of what they forgot): another kind's goes first.
            let sub = |k: &String| k.starts_with("sub/");
            let any = s.claims.keys().find(|k| !sub(k)).or_else(|| s.claims.keys().next()).cloned();
            if let Some(k) = any {
                s.claims.remove(&k);
                s.lite -= usize::from(is_lite(&k));
            }
        }
        let lite = is_lite(&key);
        let was = s.claims.insert(key, (instance, epoch, now)).map(|(id, _, _)| id);
        s.lite += usize::from(was.is_none() && lite);
        Read::Taken { was }
    }

    /// Whether the claim read for `key` names `instance` (once caught up).
    pub fn claimed_by(&self, key: &str, instance: &str) -> bool {
        self.is_caught_up() && self.names(key, instance)
    }

    /// Whether the last claim read for `key` so far names `instance` (caught up or not: the
    /// reader of the claims' log asks this of the records between them).
    pub fn names(&self, key: &str, instance: &str) -> bool {
        self.state.lock().expect("not poisoned").claims.get(key).is_some_and(|(id, _, _)| id == instance)
    }

    /// The claims written before this instance started have been read: from now on it answers.
    pub fn caught_up(&self) {
        self.caught_up.store(true, std::sync::atomic::Ordering::Release);
    }

    /// Whether [`Homes::caught_up`] was called, and the view is not stale ([`Homes::stale`]).
    pub fn is_caught_up(&self) -> bool {
        self.caught_up.load(std::sync::atomic::Ordering::Acquire)
            && !self.stale.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Whether the claims read so far count as history (before the claims written earlier
    /// were read: nothing attached yet to close). A stale view's records are not history.
    pub fn reading_history(&self) -> bool {
        !self.caught_up.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Marks the view stale (`true`: nothing is answered, as while starting) or fresh again.
    pub fn stale(&self, stale: bool) {
        self.stale.store(stale, std::sync::atomic::Ordering::Release);
    }

    /// The home of `key` among `live`: its claim while the claimed instance is live (then
    /// nothing to write), else this instance's recent unanswered claim, else the weighted
    /// rendezvous choice, to be recorded if `recorded` (`record`; remembered as pending for
    /// `pending_for`, so one choice is written, not one per request). `None` with no live
    /// instance, or before the claims written earlier were read ([`Homes::caught_up`]).
    pub fn home<'m>(
        &self,
        key: &str,
        live: &'m [Member],
        (now, pending_for): (Instant, Duration),
        recorded: bool,
    ) -> Option<Home<'m>> {
        if !self.is_caught_up() {
            return None;
        }
        let find = |id: &str| live.iter().find(|m| m.heartbeat.instance_id == id);
        let mut s = self.state.lock().expect("not poisoned");
        if let Some(member) = s.claims.get(key).and_then(|(id, _, _)| find(id)) {
            return Some(Home { member, record: false, epoch: 0, claimed: true });
        }
        if let Some(member) =
            s.pending.get(key).filter(|(_, at)| now.duration_since(*at) < pending_for).and_then(|(id, _)| find(id))
        {
            return Some(Home { member, record: false, epoch: 0, claimed: true });
        }
        let member = choose(key, live)?;
        if !recorded || key.len() > MAX_KEY {
            return Some(Home { member, record: false, epoch: 0, claimed: false });
        }
        let epoch = s.claims.get(key).map_or(0, |(_, e, _)| *e) + 1;
        if s.pending.len() >= MAX_PENDING {
            s.pending.retain(|_, (_, at)| now.duration_since(*at) < pending_for);
        }
        // Recorded only when remembered: one claim per choice, not one per request.
        let record = s.pending.len() < MAX_PENDING;
        if record {
            s.pending.insert(key.to_owned(), (member.heartbeat.instance_id.clone(), now));
        }
        Some(Home { member, record, epoch, claimed: record })
    }

    /// How many lite topics' homes are claimed (read): a new one is not claimed past
    /// [`MAX_LITE_CLAIMS`], so the table never forgets claims for them.
    pub fn lite_claims(&self) -> usize {
        self.state.lock().expect("not poisoned").lite
    }

    /// Whether `instance` wrote a claim of `key` not read back yet.
    pub fn pending_of(&self, key: &str, instance: &str) -> bool {
        self.state.lock().expect("not poisoned").pending.get(key).is_some_and(|(id, _)| id == instance)
    }

    /// The instance the claim read for `key` names, if any.
    pub fn holder(&self, key: &str) -> Option<String> {
        self.state.lock().expect("not poisoned").claims.get(key).map(|(id, _, _)| id.clone())
    }

    /// The keys starting with `prefix` whose claim names `instance` and was read before
    /// `before` (the caller releases those it no longer serves).
    pub fn held(&self, instance: &str, prefix: &str, before: Instant) -> Vec<String> {
        let s = self.state.lock().expect("not poisoned");
        s.claims
            .iter()
            .filter(|(k, (id, _, at))| k.starts_with(prefix) && id == instance && *at < before)
            .map(|(k, _)| k.clone())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::super::Heartbeat;
    use super::*;

    fn member(id: &str, sessions: u64, cpu: f64) -> Member {
        let heartbeat = Heartbeat {
            instance_id: id.into(),
            advertised_url: format!("http://{id}"),
            sessions,
            bytes_per_second: 0,
            cpu_percent: cpu,
            sent_ms: 0,
        };
        Member { heartbeat, silent: Duration::ZERO }
    }

    fn ids(live: &[Member], keys: usize) -> HashMap<String, usize> {
        let mut won = HashMap::new();
        for k in 0..keys {
            *won.entry(choose(&format!("sub/s{k}"), live).unwrap().heartbeat.instance_id.clone()).or_insert(0) += 1;
        }
        won
    }

    #[test]
    fn the_choice_is_the_same_everywhere_spread_and_moves_little() {
        let three = [member("a", 0, 0.0), member("b", 0, 0.0), member("c", 0, 0.0)];
        let mut reversed = three.clone();
        reversed.reverse();
        for k in 0..100 {
            let key = format!("sub/s{k}");
            assert_eq!(choose(&key, &three), choose(&key, &reversed), "order of the view does not matter");
        }
        let won = ids(&three, 3000);
        assert!(won.values().all(|&n| (800..1200).contains(&n)), "{won:?}");
        // A fourth instance takes about a quarter, only from the others (nothing moves between them).
        let four = [three[0].clone(), three[1].clone(), three[2].clone(), member("d", 0, 0.0)];
        let mut moved_elsewhere = 0;
        let mut to_d = 0;
        for k in 0..3000 {
            let key = format!("sub/s{k}");
            let (before, after) = (choose(&key, &three).unwrap(), choose(&key, &four).unwrap());
            match after.heartbeat.instance_id.as_str() {
                "d" => to_d += 1,
                id if id != before.heartbeat.instance_id => moved_elsewhere += 1,
                _ => {}
            }
        }
        assert_eq!(moved_elsewhere, 0);
        assert!((600..900).contains(&to_d), "{to_d}");
        assert_eq!(choose("k", &[]), None);
    }

    #[test]
    fn a_loaded_instance_is_chosen_less() {
        let live = [member("a", 0, 0.0), member("b", 0, 0.0), member("busy", 2000, 100.0)];
        let won = ids(&live, 3000);
        let busy = won.get("busy").copied().unwrap_or(0);
        assert!((150..500).contains(&busy), "{won:?}");
    }

    #[test]
    fn a_claim_holds_while_its_instance_lives_and_one_choice_is_recorded() {
        let (t0, pending) = (Instant::now(), Duration::from_millis(2000));
        let homes = Homes::default();
        let live = [member("a", 0, 0.0), member("b", 0, 0.0), member("c", 0, 0.0)];
        assert_eq!(homes.home("sub/x", &live, (t0, pending), true), None, "nothing before the claims are read");
        homes.caught_up();
        // A client's home is chosen, not recorded.
        let client = homes.home("client/c", &live, (t0, pending), false).unwrap();
        assert!(!client.record);
        assert_eq!(homes.home("client/c", &live, (t0, pending), false), Some(client));
        let first = homes.home("sub/x", &live, (t0, pending), true).unwrap();
        assert!(first.record, "nothing recorded yet: write the choice");
        let chosen = first.member.heartbeat.instance_id.clone();
        // Asked again before the claim is read back: the same, not written again.
        let again = Home { member: first.member, record: false, epoch: 0, claimed: true };
        assert_eq!(homes.home("sub/x", &live, (t0, pending), true), Some(again));
        assert_eq!(first.epoch, 1, "the key's first claim");
        // The first claim of an epoch in the log counts; another of the same epoch written at
        // once comes too late, for every reader alike.
        let other = if chosen == "a" { "b" } else { "a" };
        let claim = |id: &str, epoch: u64| Some(Claim { instance: id.into(), epoch });
        assert_eq!(homes.claimed("sub/x".into(), claim(&chosen, 1), t0), Read::Taken { was: None });
        assert!(homes.claimed_by("sub/x", &chosen));
        let lost = Read::Lost { holder: chosen.clone(), epoch: 1 };
        assert_eq!(homes.claimed("sub/x".into(), claim(other, 1), t0), lost);
        assert!(homes.claimed_by("sub/x", &chosen));
        // It sticks while its instance lives, even when a new, idle instance would be chosen.
        let mut more = live.to_vec();
        more.extend((0..20).map(|i| member(&format!("new{i}"), 0, 0.0)));
        let h = homes.home("sub/x", &more, (t0, pending), true).unwrap();
        assert_eq!((h.member.heartbeat.instance_id.as_str(), h.record), (chosen.as_str(), false));
        // Its instance gone: chosen again among the live, recorded one epoch on.
        let without: Vec<Member> = live.iter().filter(|m| m.heartbeat.instance_id != chosen).cloned().collect();
        let h = homes.home("sub/x", &without, (t0 + Duration::from_secs(1), pending), true).unwrap();
        assert!(h.record && h.member.heartbeat.instance_id != chosen);
        assert_eq!(h.epoch, 2);
        let next = h.member.heartbeat.instance_id.clone();
        let third = live.iter().map(|m| m.heartbeat.instance_id.clone()).find(|i| *i != chosen && *i != next).unwrap();
        // Two instances replace it at once: the first in the log wins, the other's pending
        // choice is dropped when its claim is read.
        assert_eq!(homes.claimed("sub/x".into(), claim(&third, 2), t0), Read::Taken { was: Some(chosen.clone()) });
        assert_eq!(homes.claimed("sub/x".into(), claim(&next, 2), t0), Read::Lost { holder: third.clone(), epoch: 2 });
        assert!(homes.state.lock().unwrap().pending.is_empty());
        let h = homes.home("sub/x", &without, (t0 + Duration::from_secs(1), pending), true).unwrap();
        assert_eq!((h.member.heartbeat.instance_id.as_str(), h.record), (third.as_str(), false));
        // The holder says it again, so the log's last record of the key is its; an old claim
        // read late changes nothing.
        assert_eq!(homes.claimed("sub/x".into(), claim(&third, 2), t0), Read::Taken { was: Some(third.clone()) });
        assert_eq!(
            homes.claimed("sub/x".into(), claim(&chosen, 1), t0),
            Read::Lost { holder: third.clone(), epoch: 2 }
        );
        // A reader of the compacted log that kept only the loser's record (the holder died
        // before saying it again) agrees again at the key's next claim, past both.
        let fresh = Homes::default();
        assert_eq!(fresh.claimed("sub/x".into(), claim(&next, 2), t0), Read::Taken { was: None });
        for h in [&homes, &fresh] {
            assert!(matches!(h.claimed("sub/x".into(), claim(other, 3), t0), Read::Taken { .. }));
            assert!(h.names("sub/x", other));
        }
        // A pending choice whose instance died is not kept.
        let rest: Vec<Member> = without.into_iter().filter(|m| m.heartbeat.instance_id != other).collect();
        let h = homes.home("sub/x", &rest, (t0 + Duration::from_secs(1), pending), true).unwrap();
        assert!(h.record && rest.iter().any(|m| m.heartbeat.instance_id == h.member.heartbeat.instance_id));
        assert_eq!(homes.home("sub/x", &[], (t0, pending), true), None);
        // Records that are not claims change nothing.
        for bad in [&b"not an id"[..], b"a", b"a\nb", b"a\n01", b"a b\n1", b"a\n-1"] {
            assert_eq!(Claim::decode(bad), None, "{}", String::from_utf8_lossy(bad));
        }
        assert_eq!(Claim::decode(&Claim { instance: "a".into(), epoch: 7 }.encode()), claim("a", 7));
        assert_eq!(homes.claimed("x".repeat(MAX_KEY + 1), claim("a", 1), t0), Read::Ignored);
        assert!(homes.state.lock().unwrap().claims.keys().all(|k| k == "sub/x"));
        // Released (the subscription removed): no claim names anyone.
        assert_eq!(homes.claimed("sub/x".into(), None, t0), Read::Taken { was: Some(other.into()) });
        assert!(!homes.names("sub/x", other));
        assert_eq!(homes.claimed("sub/x".into(), None, t0), Read::Taken { was: None });
    }

    #[test]
    fn the_hash_is_stable_across_versions() {
        // Every instance must agree, whatever version each runs: these values never change.
        assert_eq!(format!("{:.12}", unit("sub/orders", "evmesh-1")), "0.540024471435");
        assert_eq!(format!("{:.12}", unit("", "")), "0.309291187458");
    }

    /// Lite topics' claims are counted as read (new keys only, releases too), so a store to a
    /// new session topic can be refused before the table would forget claims.
    #[test]
    fn lite_claims_are_counted_as_read_and_released() {
        let homes = Homes::default();
        let t0 = Instant::now();
        let claim = |id: &str, epoch: u64| Some(Claim { instance: id.into(), epoch });
        homes.claimed(lite_key(":session.a"), claim("x", 1), t0);
        homes.claimed(lite_key(":session.a"), claim("x", 1), t0);
        homes.claimed(lite_key(":session.b"), claim("y", 1), t0);
        homes.claimed(agent_key("bot"), claim("y", 1), t0);
        homes.claimed("sub/s".into(), claim("y", 1), t0);
        assert_eq!(homes.lite_claims(), 2, "each lite key once; other kinds not");
        homes.claimed(lite_key(":session.a"), None, t0);
        homes.claimed(lite_key(":session.c"), None, t0);
        assert_eq!(homes.lite_claims(), 1, "a release of a key not claimed counts nothing");
    }
}
