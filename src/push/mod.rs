//! Delivery to the sessions a shard accepted. So far: live fan-out to WebSocket sessions that
//! attached with `?ack=none` (at-most-once, from the moment they attach).
//!
//! Fan-out cost is paid once per shard, not per session: the partition owner sends one
//! [`Delivery`] per interested shard, carrying the stored frames by handle; this shard renders
//! each event once as a WebSocket text frame and queues the same bytes to every session, which
//! writes that shared buffer itself when it is the only one queued (no copy per session).
//! Sessions have bounded queues: a session that falls `SESSION_QUEUE` frames behind is closed
//! with 1008 instead of growing memory or slowing the others.

pub mod ws;

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::rc::Rc;

use frame_codec::{AttrValue, Frame};
use futures::channel::mpsc;

use crate::adaptor::cloudevents::write_structured;
use crate::shard::message::Delivery;
use crate::ws::{encode_frame, OpCode};

/// Frames a session may have queued before it counts as too slow.
pub const SESSION_QUEUE: usize = 1024;

/// What the writer half of a session sends.
#[derive(Debug, Clone)]
pub enum Outbound {
    /// A ready WebSocket frame, shared by every session that gets it.
    Frame(Rc<Vec<u8>>),
    /// Close with this code after what is queued.
    Close(u16),
}

struct SessionTx {
    id: u64,
    tx: mpsc::Sender<Outbound>,
}

/// This shard's attached sessions, by subscription.
#[derive(Default)]
pub struct Sessions {
    next_id: Cell<u64>,
    by_subscription: RefCell<HashMap<String, Vec<SessionTx>>>,
}

/// The rendering of one stored event as a delivered WebSocket text frame.
pub fn render(frame: &Frame) -> Rc<Vec<u8>> {
    let h = frame.header();
    let extra = [
        ("emdeliveryid", AttrValue::Str(format!("{}:{}:1", h.partition, h.offset))),
        ("empartition", AttrValue::Int(i64::from(h.partition))),
        ("emoffset", AttrValue::Str(h.offset.to_string())),
        ("emattempt", AttrValue::Int(1)),
    ];
    let mut json = Vec::with_capacity(frame.as_bytes().len() + 160);
    write_structured(frame, &extra, &mut json);
    let mut out = Vec::with_capacity(json.len() + 10);
    encode_frame(OpCode::Text, true, &json, &mut out);
    Rc::new(out)
}

impl Sessions {
    /// Registers a session; returns its id, its queue, and whether it is the subscription's
    /// first on this shard (then the shard must announce its interest).
    pub fn add(&self, subscription: &str) -> (u64, mpsc::Receiver<Outbound>, bool) {
        let id = self.next_id.get();
        self.next_id.set(id + 1);
        let (tx, rx) = mpsc::channel(SESSION_QUEUE);
        let mut map = self.by_subscription.borrow_mut();
        let list = map.entry(subscription.to_owned()).or_default();
        list.push(SessionTx { id, tx });
        (id, rx, list.len() == 1)
    }

    /// Unregisters a session; returns whether it was the subscription's last on this shard.
    pub fn remove(&self, subscription: &str, id: u64) -> bool {
        let mut map = self.by_subscription.borrow_mut();
        let Some(list) = map.get_mut(subscription) else { return false };
        list.retain(|s| s.id != id);
        if list.is_empty() {
            map.remove(subscription);
            return true;
        }
        false
    }

    /// Renders each delivered event once and queues it to every session of the subscription.
    pub fn deliver(&self, d: &Delivery) {
        let mut map = self.by_subscription.borrow_mut();
        let Some(list) = map.get_mut(&d.subscription) else { return };
        let rendered: Vec<Rc<Vec<u8>>> = match &d.pick {
            None => d.frames.iter().map(render).collect(),
            Some(pick) => pick.iter().map(|&i| render(&d.frames[i as usize])).collect(),
        };
        for s in list.iter_mut() {
            for bytes in &rendered {
                if s.tx.try_send(Outbound::Frame(bytes.clone())).is_err() {
                    // Too slow (or gone): close it rather than queue without bound.
                    s.tx.close_channel();
                    break;
                }
            }
        }
    }

    /// Closes every session of a subscription (it was removed).
    pub fn close_all(&self, subscription: &str, code: u16) {
        if let Some(list) = self.by_subscription.borrow_mut().get_mut(subscription) {
            for s in list.iter_mut() {
                let _ = s.tx.try_send(Outbound::Close(code));
            }
        }
    }
}
