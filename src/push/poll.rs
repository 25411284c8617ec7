//! Long-poll sessions: `GET /events/poll` takes what a consumer's poll session on this shard has
//! received (up to `max`), waiting up to `waitMs` for the first event. The session outlives the
//! requests: it stays attached, with its window of unacknowledged events, until nobody polled
//! it for `LINGER`; then its unacknowledged events go to the consumer's other sessions.
//! Clients ack with `POST /events/ack`.

use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::time::{Duration, Instant};

use super::{attach_acked, consumer_of, detach_acked, Kind};
use crate::model::delivery::{ConsumerKey, SessionRef};
use crate::server::SessionSpec;
use crate::shard::core::Shard;
use crate::shard::sessions::PollSession;

/// How long a poll session stays attached after its last poll.
pub const LINGER: Duration = Duration::from_secs(30);

/// The shard where a consumer's poll session lives.
pub fn home(spec: &SessionSpec, shards: usize) -> crate::model::ShardId {
    let client = spec.client.as_deref().filter(|_| spec.per_client).unwrap_or("");
    crate::model::placement::meta_owner(&format!("{}#{client}", spec.subscription), shards)
}

/// The consumer's poll session on this shard, attached now if it had none.
pub fn session(shard: &Rc<Shard>, spec: &SessionSpec) -> Rc<PollSession> {
    let (probe, _) = consumer_of(spec, shard.id, 0);
    if let Some(s) = shard.sessions.polls.borrow().get(&probe).filter(|s| !s.closed.get()) {
        return s.clone();
    }
    let (rx, key, at) = attach_acked(shard, spec, Kind::Poll);
    let s = Rc::new(PollSession {
        id: at.id,
        rx: RefCell::new(Some(rx)),
        last: Cell::new(Instant::now()),
        closed: Cell::new(false),
    });
    shard.sessions.polls.borrow_mut().insert(key.clone(), s.clone());
    monoio::spawn(linger(shard.clone(), key, spec.topic.clone(), s.clone()));
    s
}

/// Detaches the session once nobody polled it for `LINGER` (or it was closed).
async fn linger(shard: Rc<Shard>, key: ConsumerKey, topic: String, s: Rc<PollSession>) {
    loop {
        monoio::time::sleep(LINGER / 4).await;
        let current = shard.sessions.polls.borrow().get(&key).is_some_and(|x| x.id == s.id);
        let idle = s.rx.borrow().is_some() && s.last.get().elapsed() >= LINGER;
        if !current || idle || s.closed.get() {
            break;
        }
    }
    {
        let mut polls = shard.sessions.polls.borrow_mut();
        if polls.get(&key).is_some_and(|x| x.id == s.id) {
            polls.remove(&key);
        }
    }
    s.closed.set(true);
    detach_acked(&shard, key, &topic, SessionRef { shard: shard.id, id: s.id });
}
