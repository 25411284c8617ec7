//! Request-reply on one shard: the requests waiting here for their reply.
//!
//! A request is stored like any event (kind `Request`, its deadline in the header's
//! `sequence`) and its HTTP connection waits on this shard in a slot of a fixed-size table.
//! The correlation id names the slot: `1.<instance>.<shard>.<slot>.<gen>.<token>` (hex), so
//! a reply arriving on any shard goes to the right one with one mailbox hop and no lookup
//! elsewhere, and one arriving at another instance is forwarded to this one
//! (`cluster::replies`; `instance` is its [`instance_tag`](crate::cluster::replies::instance_tag)). `gen` tells a slot's requests apart as it is reused; `token` is a keyed hash
//! (SipHash with this process's random key) of the slot, its generation and a counter, so an id
//! cannot be guessed from others: a forged or stale id matches nothing (404).
//!
//! Bounds: `max_pending_requests` slots and `max_pending_request_bytes` of the requests'
//! buffered bytes per shard (429 beyond). A slot is freed when its waiter ends, however it
//! ends (replied, timed out, the requester gone): [`Pending`]'s drop.

use std::cell::{Cell, RefCell};
use std::hash::BuildHasher;

use frame_codec::Frame;
use futures::channel::oneshot;

use crate::governance::acl::{Action, Kind};
use crate::governance::{Governance, View};
use crate::model::{ReplyOutcome, ShardId};

/// Where a requester waits, as its correlation id says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Correlation {
    /// The instance's tag (`cluster::replies::instance_tag`).
    pub instance: u64,
    pub shard: ShardId,
    slot: u32,
    gen: u32,
    token: u64,
}

impl Correlation {
    /// Reads an id; `None` for anything no instance made (never a panic).
    pub fn parse(id: &str) -> Option<Correlation> {
        if id.len() > 64 {
            return None;
        }
        let mut parts = id.split('.');
        let mut next = || parts.next().filter(|p| !p.is_empty() && p.len() <= 16);
        let hex = |s: &str| u64::from_str_radix(s, 16).ok();
        let (v, instance) = (next()?, hex(next()?)?);
        let (shard, slot, gen, token) = (hex(next()?)?, hex(next()?)?, hex(next()?)?, hex(next()?)?);
        if v != "1" || parts.next().is_some() {
            return None;
        }
        Some(Correlation {
            instance,
            shard: ShardId(u16::try_from(shard).ok()?),
            slot: u32::try_from(slot).ok()?,
            gen: u32::try_from(gen).ok()?,
            token,
        })
    }
}

impl std::fmt::Display for Correlation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "1.{:x}.{:x}.{:x}.{:x}.{:016x}", self.instance, self.shard.0, self.slot, self.gen, self.token)
    }
}

/// Who sends a reply, as the requester's shard checks it.
#[derive(Debug, Clone)]
pub struct Replier {
    /// `None` with `auth = none` (every reply is allowed).
    pub principal: Option<String>,
    pub tenant: Option<String>,
    /// On an agent's WebSocket (`GET /agent/ws`): the agent's stored id and the attachment's
    /// number, which its chunk frames are checked against. Boxed: every WebSocket session
    /// holds a `Replier` and few are agents' (24 bytes inline would take an idle acked
    /// session's task past 896 bytes, the heap's next block size).
    pub agent: Option<Box<(String, u64)>>,
}

/// Why a request could not wait here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// `max_pending_requests` wait already.
    Full,
    /// Their bytes are at `max_pending_request_bytes`.
    Bytes,
}

struct Waiting {
    token: u64,
    deadline_us: i64,
    /// The request's topic as stored (tenant-prefixed) and the requester's tenant.
    topic: String,
    tenant: Option<String>,
    bytes: usize,
    /// Taken by the first reply.
    tx: Option<oneshot::Sender<Frame>>,
}

#[derive(Default)]
struct Slot {
    gen: u32,
    waiting: Option<Waiting>,
}

/// This shard's waiting requests.
pub struct Requests {
    /// This instance's tag, in every id made here.
    instance: u64,
    shard: ShardId,
    slots: RefCell<Vec<Slot>>,
    free: RefCell<Vec<u32>>,
    bytes: Cell<usize>,
    max: usize,
    max_bytes: usize,
    keys: std::collections::hash_map::RandomState,
    counter: Cell<u64>,
    /// The policy replies are checked under.
    view: View,
}

/// A request waiting in its slot: resolves to the reply; frees the slot when dropped.
pub struct Pending<'a> {
    table: &'a Requests,
    slot: u32,
    gen: u32,
    pub id: Correlation,
    pub reply: oneshot::Receiver<Frame>,
}

impl Drop for Pending<'_> {
    fn drop(&mut self) {
        self.table.release(self.slot, self.gen);
    }
}

impl Requests {
    pub fn new((instance, shard): (u64, ShardId), max: usize, max_bytes: usize, governance: &Governance) -> Requests {
        Requests {
            instance,
            shard,
            slots: RefCell::new(Vec::new()),
            free: RefCell::new(Vec::new()),
            bytes: Cell::new(0),
            max,
            max_bytes,
            keys: std::collections::hash_map::RandomState::new(),
            counter: Cell::new(0),
            view: View::new(governance),
        }
    }

    /// This instance's tag (the instance part of its ids).
    pub fn instance(&self) -> u64 {
        self.instance
    }

    /// Requests waiting now.
    pub fn len(&self) -> usize {
        self.slots.borrow().len() - self.free.borrow().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Takes a slot for a request of `topic` (stored name) by `tenant`, holding `bytes`, that
    /// waits until `deadline_us` (µs since the epoch).
    pub fn wait(
        &self,
        topic: &str,
        tenant: Option<&str>,
        bytes: usize,
        deadline_us: i64,
    ) -> Result<Pending<'_>, Refusal> {
        if self.bytes.get() + bytes > self.max_bytes && !self.is_empty() {
            return Err(Refusal::Bytes);
        }
        let mut slots = self.slots.borrow_mut();
        let slot = match self.free.borrow_mut().pop() {
            Some(s) => s,
            None if slots.len() < self.max => {
                slots.push(Slot::default());
                (slots.len() - 1) as u32
            }
            None => return Err(Refusal::Full),
        };
        let s = &mut slots[slot as usize];
        s.gen = s.gen.wrapping_add(1);
        self.counter.set(self.counter.get() + 1);
        let token = self.keys.hash_one((self.shard.0, slot, s.gen, self.counter.get()));
        let (tx, reply) = oneshot::channel();
        s.waiting = Some(Waiting {
            token,
            deadline_us,
            topic: topic.to_owned(),
            tenant: tenant.map(str::to_owned),
            bytes,
            tx: Some(tx),
        });
        self.bytes.set(self.bytes.get() + bytes);
        let id = Correlation { instance: self.instance, shard: self.shard, slot, gen: s.gen, token };
        Ok(Pending { table: self, slot, gen: s.gen, id, reply })
    }

    fn release(&self, slot: u32, gen: u32) {
        let mut slots = self.slots.borrow_mut();
        let Some(s) = slots.get_mut(slot as usize).filter(|s| s.gen == gen) else { return };
        if let Some(w) = s.waiting.take() {
            self.bytes.set(self.bytes.get().saturating_sub(w.bytes));
            self.free.borrow_mut().push(slot);
        }
    }

    /// Hands `reply` to the request `id` names, if one waits for it here and `replier` may
    /// answer it: the tenant must match (else `Unknown`), the ACL must allow REPLY on the
    /// request's topic as the replier names it, and the deadline must not have passed (timers
    /// run late on a saturated core, so the reply checks it too).
    pub fn fulfil(
        &self,
        id: Correlation,
        reply: Frame,
        replier: &Replier,
        governance: &Governance,
        now_us: i64,
    ) -> ReplyOutcome {
        let mut slots = self.slots.borrow_mut();
        let Some(w) = slots.get_mut(id.slot as usize).filter(|s| s.gen == id.gen).and_then(|s| s.waiting.as_mut())
        else {
            return ReplyOutcome::Unknown;
        };
        if w.token != id.token || w.tenant != replier.tenant || w.tx.is_none() {
            return ReplyOutcome::Unknown;
        }
        if let Some(who) = &replier.principal {
            let local = match &w.tenant {
                Some(t) => w.topic.strip_prefix(t.as_str()).and_then(|n| n.strip_prefix('.')).unwrap_or(&w.topic),
                None => &w.topic,
            };
            let snap = self.view.current(governance);
            if !matches!(*snap.keys, crate::governance::identity::Keys::None) {
                if let (false, rule) = snap.acl.decide(who, Kind::Topic, local, Action::Reply) {
                    return ReplyOutcome::Denied { topic: local.to_owned(), rule: rule.map(str::to_owned) };
                }
            }
        }
        if w.deadline_us <= now_us {
            return ReplyOutcome::Late;
        }
        match w.tx.take().map(|tx| tx.send(reply)) {
            Some(Ok(())) => ReplyOutcome::Delivered,
            _ => ReplyOutcome::Unknown,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_round_trip_and_garbage_is_none() {
        let c = Correlation { instance: u64::MAX, shard: ShardId(3), slot: 4095, gen: 7, token: u64::MAX - 1 };
        assert_eq!(Correlation::parse(&c.to_string()), Some(c));
        assert!(c.to_string().len() <= 64);
        assert_eq!(Correlation::parse("1.1.3.fff.7.1").map(|c| c.instance), Some(1));
        for bad in [
            "",
            "1",
            "1.0.3.fff.7",
            "2.0.3.fff.7.1",
            "1.0.3.fff.7.1.9",
            "1.0.10000.1.1.1",
            "1.0.3.fff.7.zz",
            "1.0.3..7.1",
            "1.0.3.fff.7.11111111111111111",
            "1.0.-3.fff.7.1",
        ] {
            assert_eq!(Correlation::parse(bad), None, "{bad}");
        }
    }
}
