//! Request-reply (SPEC "Request-reply"): [`Client::request`] publishes a request and waits for
//! its reply; a responder consumes requests through any subscription and answers each with
//! [`Client::reply`], or lets [`Client::serve`] do both.

use std::future::Future;
use std::time::Duration;

use cloudevents::Event;
use futures_util::StreamExt;

use crate::client::{Call, Client};
use crate::consume::{query, Consumer};
use crate::error::{Error, Result};
use crate::event::{extension, from_json, to_json};

impl Client {
    /// Publishes `event` to `topic` as a request and waits up to `timeout` for the first
    /// reply. No reply in time is an [`Error::Api`] with status 504.
    pub async fn request(&self, topic: &str, event: &Event, timeout: Duration) -> Result<Event> {
        let ms = timeout.as_millis().max(1).to_string();
        let path = query("/events/request", &[("topic", Some(&topic.to_owned())), ("timeoutMs", Some(&ms))]);
        let call = Call::post(path)
            .body(to_json(event)?, "application/cloudevents+json")
            .header("accept", "application/cloudevents+json")
            .timeout(Some(timeout + self.inner.timeout));
        from_json(&self.call(None, call).await?.body)
    }

    /// Answers `request` (an event a responder received, carrying `emcorrelationid`) with
    /// `reply`. A requester that stopped waiting makes this a 404 [`Error::Api`].
    pub async fn reply(&self, request: &Event, mut reply: Event) -> Result<()> {
        let id = extension(request, "emcorrelationid")
            .ok_or_else(|| Error::Config("the event is not a request (no emcorrelationid)".into()))?;
        reply.set_extension("emcorrelationid", id);
        self.call(None, Call::post("/events/reply").body(to_json(&reply)?, "application/cloudevents+json")).await?;
        Ok(())
    }

    /// Serves requests from `consumer` until it ends: each event is handed to `handler`, its
    /// answer (if any) sent back as the reply, and the event acknowledged. Replies to requesters
    /// that stopped waiting are dropped, as the broker drops late replies.
    pub async fn serve<F, Fut>(&self, mut consumer: Consumer, mut handler: F) -> Result<()>
    where
        F: FnMut(Event) -> Fut,
        Fut: Future<Output = Option<Event>>,
    {
        while let Some(d) = consumer.next().await {
            let d = d?;
            let is_request = extension(&d.event, "emcorrelationid").is_some();
            if let Some(answer) = handler(d.event.clone()).await {
                if is_request {
                    match self.reply(&d.event, answer).await {
                        Ok(()) => {}
                        Err(e) if e.status() == Some(404) => {}
                        // A broker away for a moment: the requester times out (requests are
                        // never redelivered); the responder goes on.
                        Err(e) if e.is_transient() => {}
                        Err(e) => return Err(e),
                    }
                }
            }
            d.ack();
        }
        Ok(())
    }
}
