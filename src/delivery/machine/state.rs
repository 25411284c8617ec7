//! The machine's state per consumer ([`Consumer`]): its sessions ([`Sess`], their windows
//! and what they hold) and its partitions here ([`Part`]: the next offset, what is in flight,
//! waiting for redelivery or being dead-lettered, and the committed offset they give).

use std::collections::{BTreeMap, VecDeque};
use std::rc::Rc;
use std::time::Instant;

use frame_codec::Frame;

use super::source::request_deadline;
use crate::model::delivery::SessionRef;
use crate::storage::offsets::Stored;
use crate::subscription::definition::Definition;
use crate::subscription::filter::Filter;

pub(super) struct Consumer {
    /// Tells this incarnation from a later one of the same key (dead letters finish late).
    pub(super) gen: u64,
    pub(super) def: Rc<Definition>,
    pub(super) filters: Rc<Vec<Filter>>,
    /// Positions are stored (false for clients without a `clientId`).
    pub(super) persist: bool,
    /// Sorted by `at`.
    pub(super) sessions: Vec<Sess>,
    pub(super) parts: Parts,
}

pub(super) struct Sess {
    pub(super) at: SessionRef,
    pub(super) window: u32,
    /// Its unacknowledged events from this shard.
    pub(super) inflight: u32,
    /// Their stored size: bounds what a session that does not read can pin, and how far a new
    /// consumer reads ahead.
    pub(super) bytes: usize,
    /// `MULTICAST`: the session's own filters.
    pub(super) filters: Vec<Filter>,
}

impl Sess {
    /// Puts offset `o` in flight to this session until `deadline` (the ack deadline, for a
    /// request too: the deadline queue stays in delivery order, so one timer per consumer).
    pub(super) fn take(&mut self, part: &mut Part, o: u64, attempt: u16, f: &Frame, deadline: Instant) {
        let bytes = f.as_bytes().len() as u32;
        let rpc = request_deadline(f).is_some();
        part.inflight.insert(o, InFlight { attempt, session: self.at, bytes, rpc, trace: super::traced::flight(f) });
        part.later.make().deadlines.push_back((deadline, o, attempt));
        self.inflight += 1;
        self.bytes += bytes as usize;
    }

    /// Gives back the room an in-flight event took.
    pub(super) fn release(&mut self, f: &InFlight) {
        self.inflight = self.inflight.saturating_sub(1);
        self.bytes = self.bytes.saturating_sub(f.bytes as usize);
    }
}

pub(super) struct InFlight {
    pub(super) attempt: u16,
    pub(super) session: SessionRef,
    /// The event's stored size, counted against its session's byte window.
    pub(super) bytes: u32,
    /// A request: settled, never retried, when its delivery fails.
    pub(super) rpc: bool,
    /// Its spans, when its trace is recorded.
    pub(super) trace: Option<Box<super::traced::Flight>>,
}

/// What is in flight of a partition, by offset: one event inline, more in a map. An
/// acknowledged session at a few events a second mostly has none or one in flight, and a
/// `BTreeMap`'s first insert takes a 456-byte node per session, every event.
#[derive(Default)]
pub(super) struct InFlights {
    /// The one in flight, when only one is (`more` is then empty).
    one: Option<(u64, InFlight)>,
    more: BTreeMap<u64, InFlight>,
}

impl InFlights {
    pub(super) fn insert(&mut self, o: u64, f: InFlight) {
        match &mut self.one {
            Some((k, v)) if *k == o => *v = f,
            None if self.more.is_empty() => self.one = Some((o, f)),
            one => {
                if let Some((k, v)) = one.take() {
                    self.more.insert(k, v);
                }
                self.more.insert(o, f);
            }
        }
    }

    pub(super) fn remove(&mut self, o: u64) -> Option<InFlight> {
        if self.one.as_ref().is_some_and(|(k, _)| *k == o) {
            return self.one.take().map(|(_, f)| f);
        }
        let f = self.more.remove(&o);
        if f.is_some() && self.more.is_empty() {
            // An emptied map keeps its node: given back.
            self.more = BTreeMap::new();
        }
        f
    }

    pub(super) fn get(&self, o: u64) -> Option<&InFlight> {
        match &self.one {
            Some((k, f)) if *k == o => Some(f),
            _ => self.more.get(&o),
        }
    }

    pub(super) fn len(&self) -> usize {
        usize::from(self.one.is_some()) + self.more.len()
    }

    pub(super) fn is_empty(&self) -> bool {
        self.one.is_none() && self.more.is_empty()
    }

    /// In offset order.
    pub(super) fn iter(&self) -> impl Iterator<Item = (u64, &InFlight)> {
        self.one.iter().map(|(o, f)| (*o, f)).chain(self.more.iter().map(|(o, f)| (*o, f)))
    }

    pub(super) fn first(&self) -> Option<u64> {
        self.iter().next().map(|(o, _)| o)
    }
}

#[derive(Clone, Copy)]
pub(super) struct Retry {
    /// Attempts made so far.
    pub(super) attempt: u16,
    pub(super) due: Instant,
}

#[derive(Default)]
pub(super) struct Part {
    pub(super) next: u64,
    pub(super) inflight: InFlights,
    /// Deadlines, redeliveries and dead letters: read through it as a [`Pending`].
    pub(super) later: Later,
    /// What was last stored (`None`: nothing yet, or a consumer whose positions are not kept,
    /// as every anonymous session's are not: boxed, so those hold a pointer for it).
    pub(super) stored: Option<Box<Stored>>,
    /// Stopped because its session's window was full: an ack elsewhere may unblock it.
    pub(super) stalled: bool,
}

impl Part {
    pub(super) fn committed(&self) -> u64 {
        let later = &self.later;
        let firsts = [self.inflight.first(), later.retry.keys().next().copied(), later.dead.keys().next().copied()];
        firsts.into_iter().flatten().fold(self.next, u64::min)
    }

    /// What to store: the committed offset, how far delivery got, and the attempts made for
    /// every delivered offset not settled yet (in flight, waiting to be redelivered, or being
    /// dead-lettered), so a disconnect or a restart does not reset `emattempt`.
    pub(super) fn snapshot(&self, seen_ms: u64) -> Stored {
        let mut attempts: Vec<(u64, u16)> = self.inflight.iter().map(|(o, f)| (o, f.attempt)).collect();
        attempts.extend(self.later.retry.iter().map(|(&o, r)| (o, r.attempt)));
        attempts.extend(self.later.dead.iter().map(|(&o, &a)| (o, a)));
        attempts.sort_unstable();
        Stored { committed: self.committed(), next: self.next, seen_ms, attempts }
    }

    /// A partition resumed from what was stored: every delivered, unsettled offset is due for
    /// redelivery at once, counting the attempts already made.
    pub(super) fn restored(st: &Stored, persist: bool, now: Instant) -> Part {
        let next = st.next.max(st.committed);
        let retry: BTreeMap<u64, Retry> = st
            .attempts
            .iter()
            .filter(|(o, _)| (st.committed..next).contains(o))
            .map(|&(o, attempt)| (o, Retry { attempt, due: now }))
            .collect();
        let later = match retry.is_empty() {
            true => Later::default(),
            false => Later(Some(Box::new(Pending { retry, ..Pending::default() }))),
        };
        Part { next, later, stored: persist.then(|| Box::new(st.clone())), ..Part::default() }
    }

    /// Gives back what the queue and maps grew, once nothing is in flight: a `VecDeque` keeps
    /// its buffer and an emptied `BTreeMap` its node, which every idle acknowledged session
    /// would otherwise hold from its first delivery on. (A slow stream allocates its deadlines'
    /// buffer again at its next event: one small allocation an event, against 128 bytes held
    /// by every idle session.)
    pub(super) fn give_back(&mut self) {
        if !self.inflight.is_empty() {
            return;
        }
        let Some(later) = self.later.existing() else { return };
        if later.deadlines.is_empty() && later.retry.is_empty() && later.dead.is_empty() {
            self.later = Later::default();
            return;
        }
        if later.deadlines.is_empty() {
            later.deadlines = VecDeque::new();
        }
        if later.retry.is_empty() {
            later.retry = BTreeMap::new();
        }
        if later.dead.is_empty() {
            later.dead = BTreeMap::new();
        }
    }

    /// An event of this partition failed (timed out, nacked, or its session left): due again
    /// at `due`, or dead-lettered if that was its last attempt. Returns `true` for the latter.
    pub(super) fn failed(&mut self, o: u64, attempt: u16, max: u32, due: Instant) -> bool {
        if u32::from(attempt) >= max {
            self.later.make().dead.insert(o, attempt);
            true
        } else {
            self.later.make().retry.insert(o, Retry { attempt, due });
            false
        }
    }
}

/// What a partition of a consumer keeps only while something is in flight, due again or being
/// dead-lettered. An idle acknowledged session's partition holds a pointer for it, not the
/// 80 bytes of the queue and maps (kept in every anonymous consumer's, one per session).
#[derive(Default)]
pub(super) struct Pending {
    /// Ack deadlines in delivery order (so in deadline order: one timeout per consumer); entries
    /// whose delivery was settled meanwhile are skipped and compacted away.
    pub(super) deadlines: VecDeque<(Instant, u64, u16)>,
    pub(super) retry: BTreeMap<u64, Retry>,
    /// Being appended to the dead-letter topic, with the attempts made.
    pub(super) dead: BTreeMap<u64, u16>,
}

/// Nothing pending (what an absent [`Pending`] reads as).
static NOTHING: Pending = Pending { deadlines: VecDeque::new(), retry: BTreeMap::new(), dead: BTreeMap::new() };

/// A partition's [`Pending`], boxed and only while it holds something ([`Part::give_back`]
/// lets it go). Reads go through `Deref`; what adds makes it ([`Later::make`]), what removes
/// looks at it only if it is there ([`Later::existing`]).
#[derive(Default)]
pub(super) struct Later(Option<Box<Pending>>);

impl Later {
    pub(super) fn make(&mut self) -> &mut Pending {
        self.0.get_or_insert_default()
    }

    pub(super) fn existing(&mut self) -> Option<&mut Pending> {
        self.0.as_deref_mut()
    }

    #[cfg(test)]
    pub(super) fn is_held(&self) -> bool {
        self.0.is_some()
    }
}

impl std::ops::Deref for Later {
    type Target = Pending;

    fn deref(&self) -> &Pending {
        self.0.as_deref().unwrap_or(&NOTHING)
    }
}

/// A consumer's partitions on this shard: a handful, so a small vector (a `BTreeMap` node
/// would reserve room for eleven `Part`s per consumer, kilobytes per idle session).
#[derive(Default)]
pub(super) struct Parts(pub(super) Vec<(u32, Part)>);

impl Parts {
    pub(super) fn get_mut(&mut self, p: u32) -> Option<&mut Part> {
        self.0.iter_mut().find(|(q, _)| *q == p).map(|(_, part)| part)
    }

    pub(super) fn keys(&self) -> impl Iterator<Item = u32> + '_ {
        self.0.iter().map(|(p, _)| *p)
    }
}
