//! A shard's fan-out: which shards want a subscription's events (interest), and handing the
//! events appended here to the sessions that want them, here or on their shards.

use std::rc::Rc;
use std::sync::Arc;

use frame_codec::Frame;

use super::mailbox::Sender;
use super::message::{Delivery, Interest, InterestChange, ShardMessage};
use crate::delivery::machine::expired;
use crate::model::{ShardId, StoredTopic};
use crate::subscription::filter::matches_all;
use crate::task::Place;

use super::core::{Interested, Shard};

impl Shard {
    /// Announces to every shard (this one included) that this shard's sessions of a
    /// subscription started, ended, or that the subscription is gone.
    pub fn announce(self: &Rc<Self>, subscription: &str, topic: &str, change: InterestChange) {
        for s in 0..self.shards() {
            let i = Interest { subscription: subscription.to_owned(), topic: topic.to_owned(), shard: self.id, change };
            let to = ShardId(s as u16);
            if to == self.id {
                self.interest_changed(i);
            } else {
                self.send_control(to, ShardMessage::Interest(Box::new(i)));
            }
        }
    }

    pub(crate) fn interest_changed(self: &Rc<Self>, i: Interest) {
        if i.change == InterestChange::TopicGrew {
            return self.topic_grew(&i.topic);
        }
        let mut interest = self.interest.borrow_mut();
        let list = Rc::make_mut(interest.entry(i.topic.clone()).or_default());
        match i.change {
            InterestChange::Attach => {
                let filters = match crate::storage::meta::get_subscription(&self.shared.db, &i.subscription) {
                    Ok(Some(def)) => def.compile_stored(),
                    _ => return,
                };
                list.retain(|x| !(x.subscription == i.subscription && x.shard == i.shard));
                list.push(Rc::new(Interested {
                    subscription: i.subscription,
                    shard: i.shard,
                    filters: Rc::new(filters),
                }));
            }
            InterestChange::Detach => list.retain(|x| !(x.subscription == i.subscription && x.shard == i.shard)),
            InterestChange::Removed => {
                list.retain(|x| x.subscription != i.subscription);
                drop(interest);
                self.forget_subscription(&i.subscription, &i.topic);
                self.sessions.close_all(&i.subscription, 1000, "");
            }
            InterestChange::TopicGrew => {}
            InterestChange::HomeMoved => {
                drop(interest);
                self.delivery.machine.borrow_mut().forget(&i.subscription);
                self.delivery.defs.borrow_mut().remove(&i.subscription);
                self.sessions.close_all(&i.subscription, 1012, "home moved");
            }
            InterestChange::Pushes => {
                drop(interest);
                self.sessions.recheck_webhooks(&i.subscription);
                if let Some(sync) = self.pushes_changed.get() {
                    sync(self, &i.subscription);
                }
            }
        }
    }

    /// Queues events to this shard's sessions, counting the deliveries.
    pub fn deliver_here(&self, d: &Delivery) {
        let n = self.sessions.deliver(d);
        self.shared.metrics.shard(self.id).deliveries.add(n);
    }

    /// Sends freshly stored events to their consumers: to every shard with `ack=none` sessions
    /// (once per shard, frames shared), and to acknowledged delivery. Yields every
    /// `task::SLICE` of work (a topic's subscriptions are client-made and many, each filter
    /// may take a millisecond or two), and a topic's fan-outs pass its gate one at a time, in
    /// the order their appends completed, so every session still gets a partition's events in
    /// offset order (other topics' fan-outs go on meanwhile).
    ///
    /// `place`: a place in the topic's line taken when the frames became readable (a spawned
    /// fan-out); `None` takes it now, before anything can yield.
    pub(crate) async fn fan_out(self: &Rc<Self>, frames: Vec<Frame>, place: Option<Place>) {
        let Some(first) = frames.first() else { return };
        if StoredTopic::new(first.body().topic.as_str()).is_lite() {
            // A lite topic has no subscriptions: only its follower, if any, reads it.
            self.shared.watchers.notify(first.body().topic.as_str());
            return;
        }
        // Acked consumers as of now: one attaching later starts from the log, which has these.
        let consumers = self.delivery.machine.borrow().consumers_of(first.body().topic.as_str());
        let live = self.interest.borrow().get(first.body().topic.as_str()).is_some_and(|l| !l.is_empty());
        if consumers.is_empty() && !live && place.is_none() {
            // Nobody to deliver to: no line to join.
            return;
        }
        let frames: Arc<[Frame]> = frames.into();
        // Borrowed from the frames, which this call keeps to the end: no copy of the name.
        let topic = frames[0].body().topic.as_str();
        let place = place.unwrap_or_else(|| self.fan_out_place(topic));
        place.enter().await;
        let mut slice = crate::task::Slice::start();
        self.deliver_new(consumers, &frames, &mut slice).await;
        let list = match self.interest.borrow().get(topic) {
            Some(l) if !l.is_empty() => l.clone(),
            _ => return,
        };
        // Requests past their deadline are dropped at dispatch, here too.
        let wall = crate::model::clock::now_micros();
        let requests = frames.iter().any(|f| f.header().kind == frame_codec::FrameKind::Request);
        for i in list.iter() {
            slice.next().await;
            let pick = if i.filters.is_empty() && !requests {
                None
            } else {
                let wanted = |f: &Frame| !expired(f, wall) && matches_all(&i.filters, f.body());
                let pick: Vec<u32> = (0..frames.len() as u32).filter(|&n| wanted(&frames[n as usize])).collect();
                if pick.is_empty() {
                    continue;
                }
                Some(pick)
            };
            let d = Delivery {
                subscription: i.subscription.clone(),
                session: None,
                frames: frames.clone(),
                pick,
                attempts: Vec::new(),
            };
            if i.shard == self.id {
                self.deliver_here(&d);
            } else if self
                .shared
                .mailboxes
                .send(Sender::Shard(self.id), i.shard, ShardMessage::Deliver(Box::new(d)))
                .is_err()
            {
                // ack=none sessions are at-most-once: a full mailbox drops, it never blocks.
                self.shared.metrics.shard(self.id).deliveries_dropped.inc();
            }
        }
    }
}
