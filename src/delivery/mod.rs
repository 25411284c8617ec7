//! Acknowledged delivery, the partition owner's half. The rules live in [`machine`], a state
//! machine with no I/O; this module holds a shard's instance of it ([`Dispatcher`]) and the
//! delivery ids clients ack with. The shard's side (`crate::shard::delivery`) builds a
//! consumer's state from what is stored, feeds the machine its inputs (session changes, acks,
//! appends, the clock) and executes the effects it returns: deliveries through the mailboxes,
//! positions to `offsets.N`, dead letters appended to `<topic>.dlq`, continuations as tasks.
//!
//! A *consumer* ([`ConsumerKey`](crate::model::delivery::ConsumerKey)) owns a set of offsets: the subscription itself for
//! `LOAD_BALANCE`, one client of it for `BROADCAST` and `MULTICAST`. Its *sessions* (WebSocket,
//! SSE or long-poll; they live on the shard that accepted them) are announced to every shard,
//! and each shard serves the partitions of the topic it owns: the log is local, the offsets are
//! in its own `offsets.N` family, and the only thing that crosses cores is a [`Delivery`](crate::shard::message::Delivery) with
//! the frames by handle (and acks coming back).

pub mod machine;

use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap};
use std::rc::Rc;

pub use crate::config::MAX_WINDOW;
use machine::Machine;

use crate::subscription::definition::Definition;
use crate::subscription::filter::Filter;

/// A subscription's definition with its filters compiled once.
pub(crate) type SharedDef = (Rc<Definition>, Rc<Vec<Filter>>);

/// This shard's delivery state: the machine, and each subscription's definition and compiled
/// filters, shared by all its consumers here (thousands of BROADCAST clients must not hold a
/// copy each).
pub struct Dispatcher {
    pub(crate) machine: RefCell<Machine>,
    pub(crate) defs: RefCell<HashMap<String, SharedDef>>,
    /// Where the next client-offset expiry pass goes on in `offsets.N` (empty: the start).
    pub(crate) expire_cursor: RefCell<Vec<u8>>,
    /// With Kafka: offsets stored since the last write to the claims' log, by key (`None`:
    /// deleted); the last value of a key is all that is written (`shard::delivery`).
    pub(crate) replicate: RefCell<HashMap<Vec<u8>, Option<Vec<u8>>>>,
    /// Partitions (topic, partition) to pump again once tiered history they wait for is
    /// fetched (`shard::delivery`).
    pub(crate) fetching: RefCell<std::collections::HashSet<(String, u32)>>,
}

impl Dispatcher {
    pub fn new(config: &crate::config::Config) -> Dispatcher {
        let seed = crate::model::clock::now_micros() as u64;
        let machine = Machine::new(config.session_window_bytes, config.redelivery_backoff, seed);
        Dispatcher {
            machine: RefCell::new(machine),
            defs: RefCell::new(HashMap::new()),
            expire_cursor: RefCell::default(),
            replicate: RefCell::default(),
            fetching: RefCell::default(),
        }
    }
}

/// The delivery id clients ack with: `partition:offset:attempt`.
pub fn delivery_id(partition: u32, offset: u64, attempt: u16) -> String {
    format!("{partition}:{offset}:{attempt}")
}

/// The client a session without a `clientId` is, for a subscription whose offsets are kept per
/// client (BROADCAST, MULTICAST): a client of its own, `~<shard>.<session>`, whose offsets are
/// never stored. No `clientId` a client may send starts with `~`.
pub fn anonymous_client(shard: u32, session: u64) -> String {
    format!("~{shard}.{session}")
}

/// The delivery id of an event to an SSE stream opened without a `clientId` on such a
/// subscription: `partition:offset:attempt~<shard>.<session>`. Acks come over another
/// request (`POST /events/ack`), which has only the ids to say whose they are.
pub fn owned_delivery_id(partition: u32, offset: u64, attempt: u16, shard: u32, session: u64) -> String {
    format!("{partition}:{offset}:{attempt}~{shard}.{session}")
}

/// The anonymous client a delivery id names (`~<shard>.<session>`, see [`owned_delivery_id`]),
/// if it names one; `Err` if its owner part is not one.
pub fn delivery_owner(id: &str) -> Result<Option<&str>, &'static str> {
    let Some(at) = id.find('~') else { return Ok(None) };
    let owner = &id[at..];
    const NOT: &str = "its part after `~` is not <shard>.<session>";
    let (shard, session) = owner[1..].split_once('.').ok_or(NOT)?;
    // As the broker writes them, digit for digit: `~01.7` would name no stream, and count as
    // another one.
    match (shard.parse::<u32>(), session.parse::<u64>()) {
        (Ok(s), Ok(n)) if s.to_string() == shard && n.to_string() == session => Ok(Some(owner)),
        _ => Err(NOT),
    }
}

/// The partition and offset a delivery id names (an owner part, see [`owned_delivery_id`],
/// must be well formed and is not looked at here).
pub fn parse_delivery_id(id: &str) -> Option<(u32, u64)> {
    delivery_owner(id).ok()?;
    let id = id.split_once('~').map_or(id, |(base, _)| base);
    let mut it = id.split(':');
    let p = it.next()?.parse().ok()?;
    let o = it.next()?.parse().ok()?;
    match (it.next(), it.next()) {
        (Some(a), None) if a.parse::<u16>().is_ok() => Some((p, o)),
        (None, _) => Some((p, o)),
        _ => None,
    }
}

/// The most delivery ids one ack message or request may name: more than any consumer can have
/// in flight from one request's worth of sessions, few enough that settling them is bounded.
pub const MAX_ACK_IDS: usize = 10_000;

/// Delivery ids grouped by partition, each partition's offsets sorted and deduplicated (so
/// settling them is linear); `Err` names the first id that is not one, or says there are more
/// than [`MAX_ACK_IDS`].
pub fn group_ids<'a>(ids: impl IntoIterator<Item = &'a str>) -> Result<BTreeMap<u32, Vec<u64>>, String> {
    let mut by: BTreeMap<u32, Vec<u64>> = BTreeMap::new();
    for (n, id) in ids.into_iter().enumerate() {
        if n == MAX_ACK_IDS {
            return Err(format!("at most {MAX_ACK_IDS} delivery ids per ack"));
        }
        let (p, o) =
            parse_delivery_id(id).ok_or_else(|| format!("{id:?} is not a delivery id (partition:offset:attempt)"))?;
        by.entry(p).or_default().push(o);
    }
    for offsets in by.values_mut() {
        offsets.sort_unstable();
        offsets.dedup();
    }
    Ok(by)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delivery_ids_round_trip_and_reject_garbage() {
        assert_eq!(parse_delivery_id(&delivery_id(3, 42, 2)), Some((3, 42)));
        assert_eq!(parse_delivery_id("3:42"), Some((3, 42)));
        for bad in ["", "3", "x:1:1", "3:-1:1", "3:1:1:1", "3:1:x"] {
            assert_eq!(parse_delivery_id(bad), None, "{bad}");
        }
        let owned = owned_delivery_id(3, 42, 2, 1, 17);
        assert_eq!((parse_delivery_id(&owned), delivery_owner(&owned)), (Some((3, 42)), Ok(Some("~1.17"))));
        assert_eq!(anonymous_client(1, 17), "~1.17");
        assert_eq!(delivery_owner("3:42:2"), Ok(None));
        for bad in ["3:42:2~", "3:42:2~1", "3:42:2~x.1", "3:42:2~1.+1", "3:42:2~1.1~2.2", "3:42:x~1.1", "3:42:2~01.7"] {
            assert_eq!(parse_delivery_id(bad), None, "{bad}");
        }
        let by = group_ids(["0:1:1", "1:5:1", "0:2:3"]).unwrap();
        assert_eq!(by, BTreeMap::from([(0, vec![1, 2]), (1, vec![5])]));
        assert!(group_ids(["0:1:1", "nope"]).unwrap_err().contains("nope"));
    }
}
