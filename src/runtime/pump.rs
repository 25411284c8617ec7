//! A shard's pump: the one loop that takes what other cores sent (both lanes of its
//! mailboxes) and acts on it. It sits above the shard (core state, delivery, sessions) and the
//! transports (a long-poll request runs the consumer's poll session), so none of them depends
//! on it; the runtime starts one per shard.

use std::rc::Rc;

use crate::shard::core::Shard;
use crate::shard::message::ShardMessage;

impl Shard {
    /// Waits for messages from other cores and handles them, forever.
    pub async fn pump(self: Rc<Self>) {
        let mailboxes = &self.shared.mailboxes;
        loop {
            mailboxes.drain(self.id, |m| self.handle(m));
            mailboxes.wait(self.id).await;
        }
    }

    fn handle(self: &Rc<Self>, msg: ShardMessage) {
        match msg {
            ShardMessage::Append { partition, mut frames, reply } => {
                let me = self.clone();
                monoio::spawn(async move {
                    let r = me.append_local(partition, &mut frames).await;
                    if matches!(r, Ok((_, true))) {
                        // Answered after its fan-out, as a local publish is: a publisher
                        // on another core waits for it too (so fan-outs cannot pile up).
                        me.fan_out(frames, None).await;
                    }
                    let _ = reply.send(r.map(|(first, _)| first));
                });
            }
            ShardMessage::Mirror(m) => self.mirror_in(*m),
            ShardMessage::Interest(i) => self.interest_changed(*i),
            ShardMessage::Deliver(d) => self.deliver_here(&d),
            ShardMessage::Session(e) => self.session_event(*e),
            ShardMessage::Ack(a) => self.acks(*a),
            ShardMessage::Reply(r) => {
                let outcome = self.fulfil(r.id, r.frame, &r.replier);
                let _ = r.outcome.send(Ok(outcome));
            }
            ShardMessage::Poll(req) => {
                let me = self.clone();
                monoio::spawn(async move {
                    let events = crate::push::poll::session(&me, &req.spec).poll(req.max, req.wait).await;
                    let _ = req.reply.send(Ok(events.iter().map(|e| e.to_vec()).collect()));
                });
            }
            ShardMessage::Subscription { request, reply } => {
                let me = self.clone();
                monoio::spawn(async move {
                    let _ = reply.send(me.subscription_local(*request).await);
                });
            }
            ShardMessage::EnsureTopic { request, reply } => {
                let me = self.clone();
                monoio::spawn(async move {
                    let r = &request;
                    let _ = reply.send(me.ensure_topic_local(&r.topic, r.spec, r.internal, r.learn).await);
                });
            }
        }
    }
}
