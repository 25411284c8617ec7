//! A stream of an A2A task (`SendStreamingMessage`, `SubscribeToTask`): the task first, then
//! each stream response that changed it (`statusUpdate`, `artifactUpdate`), as server-sent
//! events; JSON-RPC streams wrap each in a response to the request's id, REST streams send it
//! bare. The stream ends once the task is terminal or waits for the client's input (as both
//! official SDKs end them), or when the task is dropped. A stream that fell more than the
//! task's kept events behind is sent the task again and goes on from there.

use std::rc::Rc;
use std::sync::Arc;

use serde_json::{json, Value as Json};

use super::Outbound;
use crate::adaptor::a2a::{jsonrpc_result, sse_event};
use crate::queue;
use crate::server::A2aStreamSpec;
use crate::shard::core::Shard;
use crate::shard::tasks::TaskEntry;

/// Rendered batches waiting for the writer.
const QUEUE: usize = 2;

fn render(spec: &A2aStreamSpec, event: &Json, out: &mut Vec<u8>) {
    let json = match &spec.rpc_id {
        Some(id) => jsonrpc_result(id, event),
        None => serde_json::to_vec(event).expect("json"),
    };
    sse_event(&json, out);
}

/// Feeds `out` with the task's events until it settles.
async fn feed(entry: Arc<TaskEntry>, spec: &A2aStreamSpec, shard: &Shard, mut out: queue::Sender<Outbound>) {
    let mut next: Option<u64> = None;
    loop {
        let seen = entry.bell.rung();
        let (events, settled) = {
            let log = entry.log();
            let mut events = Vec::new();
            let from = match next {
                Some(n) if n >= log.first => n,
                // The first event, or fallen behind what is kept: the task as it is now.
                _ => {
                    render(spec, &json!({"task": log.task.to_json(spec.history_length, true)}), &mut events);
                    log.end()
                }
            };
            for e in log.events.iter().skip((from - log.first) as usize) {
                render(spec, e, &mut events);
            }
            next = Some(log.end());
            (events, log.task.state.settled())
        };
        let gone = shard.shared.tasks.get(&entry.id).is_none();
        if !events.is_empty() {
            let mut framed = Vec::with_capacity(events.len() + 16);
            crate::shard::sessions::chunk(&events, &mut framed);
            if out.send(Outbound::Frame(Rc::new(framed))).await.is_err() {
                return;
            }
        }
        if settled || gone {
            return;
        }
        entry.bell.after(seen).await;
    }
}

/// Streams the task `spec` names, after the `200` head.
pub async fn sse(shard: Rc<Shard>, stream: crate::server::Stream, buf: Vec<u8>, spec: Box<A2aStreamSpec>) {
    let (tx, events) = queue::channel(QUEUE);
    let Some(entry) = shard.shared.tasks.get(&spec.task_id) else {
        drop(tx);
        return super::sse::serve(stream, buf, events).await;
    };
    let feeding = Box::pin(feed(entry, &spec, &shard, tx));
    let ending = futures::future::select(feeding, Box::pin(super::follow::expired(spec.expires_us)));
    let serve = Box::pin(super::sse::serve(stream, buf, events));
    if let futures::future::Either::Left((_, serve)) = futures::future::select(Box::pin(ending), serve).await {
        serve.await;
    }
}
