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
use crate::server::client::{Pool, Url};
use crate::server::{A2aRelaySpec, A2aStreamSpec};
use crate::shard::core::Shard;
use crate::shard::tasks::{TaskEntry, TaskLog};

/// Rendered batches waiting for the writer.
const QUEUE: usize = 2;

fn render(spec: &A2aStreamSpec, event: &Json, out: &mut Vec<u8>) {
    let json = match &spec.rpc_id {
        Some(id) => jsonrpc_result(id, event),
        None => serde_json::to_vec(event).expect("json"),
    };
    sse_event(&json, out);
}

/// Renders into `out` what a stream that has sent the events before `next` sends now (`None`:
/// nothing yet), and returns the number of the next event after them. A stream starts at its
/// spec's start, while the log still keeps that; a new stream without one, or one fallen behind
/// what is kept, is sent the task as it is now.
fn catch_up(spec: &A2aStreamSpec, log: &TaskLog, next: Option<u64>, out: &mut Vec<u8>) -> u64 {
    let from = match (next, &spec.start) {
        (Some(n), _) if n >= log.first => n,
        (None, Some((at, task))) if *at >= log.first => {
            render(spec, &json!({ "task": task }), out);
            *at
        }
        _ => {
            render(spec, &json!({"task": log.task.to_json(spec.history_length, true)}), out);
            log.end()
        }
    };
    for e in log.events.iter().skip((from - log.first) as usize) {
        render(spec, e, out);
    }
    log.end()
}

/// Feeds `out` with the task's events until it settles.
async fn feed(entry: Arc<TaskEntry>, spec: &A2aStreamSpec, shard: &Shard, mut out: queue::Sender<Outbound>) {
    let mut next: Option<u64> = None;
    loop {
        let seen = entry.bell.rung();
        let (events, settled) = {
            let log = entry.log();
            let mut events = Vec::new();
            next = Some(catch_up(spec, &log, next, &mut events));
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
    super::sse::serve_fed(stream, buf, events, feed(entry, &spec, &shard, tx), spec.expires_us).await;
}

/// How long a relayed stream may stay silent (remote servers ping every 15 s or so).
const RELAY_SILENCE: std::time::Duration = std::time::Duration::from_secs(60);
/// Bytes one relayed stream may carry in all.
const RELAY_BYTES: usize = 16 << 20;

/// A JSON-RPC error of the relay's own, as an SSE `error` event (what the SDKs read mid-stream).
fn relay_error(id: &Json, message: String, out: &mut Vec<u8>) {
    let e = crate::adaptor::a2a::A2aError::new(crate::adaptor::a2a::ErrorKind::InvalidAgentResponse, message);
    out.extend_from_slice(b"event: error\n");
    sse_event(&e.jsonrpc(id), out);
}

/// The first task among the whole events of `events` (`data: {"result":{"task":{...}}}`; a
/// stream may start with comments or other events).
fn first_task(events: &[u8]) -> Option<serde_json::Map<String, Json>> {
    let text = String::from_utf8_lossy(events).replace("\r\n", "\n");
    let whole = text.rfind("\n\n")?;
    text[..whole].split("\n\n").find_map(|event| {
        let data: Vec<&str> = event.lines().filter_map(|l| l.strip_prefix("data:")).map(str::trim_start).collect();
        let v: Json = serde_json::from_str(&data.join("\n")).ok()?;
        v.get("result")?.get("task")?.as_object().cloned()
    })
}

async fn relay_feed(shard: &Shard, spec: &A2aRelaySpec, mut out: queue::Sender<Outbound>) {
    let send = |bytes: Vec<u8>| {
        let mut framed = Vec::with_capacity(bytes.len() + 16);
        crate::shard::sessions::chunk(&bytes, &mut framed);
        Outbound::Frame(Rc::new(framed))
    };
    let fail = |m: String| {
        let mut e = Vec::new();
        relay_error(&spec.rpc_id, m, &mut e);
        e
    };
    let url = match Url::parse(&spec.url) {
        Ok(u) => u,
        Err(e) => return drop(out.send(send(fail(e))).await),
    };
    let (timeout, addr) = (shard.shared.config.webhook_timeout, spec.addr);
    let pool = Pool::new(0, RELAY_BYTES, Some(shard.shared.client_tls.clone()));
    let headers = [("content-type", "application/json"), ("a2a-version", "1.0"), ("accept", "text/event-stream")];
    // Each read may wait `RELAY_SILENCE` (a working remote may be quiet a while).
    let mut s = match pool.stream(&url, addr, &headers, &spec.body, RELAY_SILENCE).await {
        Ok(s) => s,
        Err(e) => return drop(out.send(send(fail(format!("the remote agent: {e}")))).await),
    };
    let sse = s.headers.iter().any(|(n, v)| n.eq_ignore_ascii_case("content-type") && v.contains("text/event-stream"));
    if !(200..300).contains(&s.status) || !sse {
        // One JSON-RPC answer (an error before the stream began): said as the stream's error.
        let mut body = Vec::new();
        while let Ok(Some(p)) = crate::server::deadline::within(timeout, s.next()).await.unwrap_or(Ok(None)) {
            body.extend_from_slice(&p);
            if body.len() > 64 * 1024 {
                break;
            }
        }
        let mut e = Vec::new();
        match serde_json::from_slice::<Json>(&body) {
            Ok(v) if v.get("error").is_some() => {
                e.extend_from_slice(b"event: error\n");
                sse_event(&serde_json::to_vec(&v).expect("json"), &mut e);
            }
            _ => relay_error(&spec.rpc_id, format!("the remote agent answered {} without a stream", s.status), &mut e),
        }
        return drop(out.send(send(e)).await);
    }
    // Relayed as it comes; the stream's task is remembered as the caller's.
    let mut head: Option<Vec<u8>> = Some(Vec::new());
    let mut at_boundary = true;
    loop {
        let (piece, last) = match s.next().await {
            Ok(Some(p)) => (p, false),
            Ok(None) => return,
            Err(e) => {
                // Ends a half-sent event first, so the error is an event of its own.
                let mut p = if at_boundary { Vec::new() } else { b"\n\n".to_vec() };
                p.extend(fail(format!("the remote agent's stream broke: {e}")));
                (p, true)
            }
        };
        at_boundary = piece.ends_with(b"\n\n") || piece.ends_with(b"\r\n\r\n");
        if let Some(h) = &mut head {
            h.extend_from_slice(&piece);
            if let Some(task) = first_task(h) {
                shard.shared.remotes.own_task(&task, &spec.scope);
                head = None;
            } else if h.len() > 64 * 1024 {
                head = None;
            }
        }
        if out.send(send(piece)).await.is_err() || last {
            return;
        }
    }
}

/// Relays a remote A2A agent's stream (`SendStreamingMessage`, `SubscribeToTask`), after the
/// `200` head: its events as they come; a failure (no connection, no stream, a broken one) ends
/// it with an `error` event carrying a JSON-RPC error, as the SDKs read them.
pub async fn relay(shard: Rc<Shard>, stream: crate::server::Stream, buf: Vec<u8>, spec: Box<A2aRelaySpec>) {
    let (tx, events) = queue::channel(QUEUE);
    super::sse::serve_fed(stream, buf, events, relay_feed(&shard, &spec, tx), spec.expires_us).await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::adaptor::a2a::task::{self, Chunk, Stamps};

    struct Fixed;

    impl Stamps for Fixed {
        fn timestamp(&mut self) -> String {
            "2026-12-07T00:00:00.000Z".into()
        }

        fn message_id(&mut self) -> String {
            "m".into()
        }
    }

    /// The events rendered into `out`, each the JSON-RPC result's one key and its value.
    fn events(out: &[u8]) -> Vec<(String, Json)> {
        let text = std::str::from_utf8(out).unwrap();
        let data = text.split("\n\n").filter_map(|e| e.strip_prefix("data: "));
        let results = data.map(|d| serde_json::from_str::<Json>(d).unwrap()["result"].clone());
        results.map(|r| r.as_object().unwrap().iter().map(|(k, v)| (k.clone(), v.clone())).next().unwrap()).collect()
    }

    fn word(text: &str, done: bool) -> Chunk {
        let part = (!text.is_empty()).then(|| json!({ "text": text }));
        Chunk { part, error: None, done, input_required: false, bytes: text.len() }
    }

    /// Regression: a streaming send whose agent answered the whole turn before the stream was
    /// served sent only the completed task (the Node A2A SDK saw no artifact updates).
    #[test]
    fn a_streaming_send_starts_at_the_task_its_message_left_however_soon_the_agent_answers() {
        let user = json!({"messageId": "u", "role": "ROLE_USER", "parts": [{"text": "one two"}]});
        let submitted = task::submitted("t".into(), "c".into(), user, &mut Fixed);
        let mut log = TaskLog { task: submitted, events: Default::default(), first: 0, turn: 0 };
        let start = (log.end(), log.task.to_json(None, true));
        // The whole turn, before the stream's first look at the log.
        for c in [word("one ", false), word("two ", false), word("", true)] {
            for e in task::chunk(&mut log.task, c, &mut Fixed) {
                log.emit(e);
            }
        }
        let spec = |start| A2aStreamSpec {
            task_id: "t".into(),
            rpc_id: Some(json!(1)),
            history_length: None,
            expires_us: None,
            start,
        };

        let mut out = Vec::new();
        let next = catch_up(&spec(Some(start.clone())), &log, None, &mut out);
        assert_eq!(next, log.end());
        let got = events(&out);
        let kinds: Vec<&str> = got.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(kinds, ["task", "statusUpdate", "artifactUpdate", "artifactUpdate", "statusUpdate"], "{got:?}");
        assert_eq!(got[0].1, start.1, "the task as its message left it");
        assert!(got[0].1.get("artifacts").is_none_or(|a| a.as_array().unwrap().is_empty()));
        let texts: Vec<&Json> = got
            .iter()
            .filter(|(k, _)| k == "artifactUpdate")
            .map(|(_, u)| &u["artifact"]["parts"][0]["text"])
            .collect();
        assert_eq!(texts, [&json!("one "), &json!("two ")]);
        assert_eq!(got[4].1["status"]["state"], "TASK_STATE_COMPLETED");

        // Nothing more once caught up.
        let mut more = Vec::new();
        assert_eq!(catch_up(&spec(Some(start.clone())), &log, Some(next), &mut more), next);
        assert!(more.is_empty());

        // A stream without a start (SubscribeToTask), or whose start is no longer kept: the task
        // as it is now, whole, and nothing before it.
        let mut now = Vec::new();
        catch_up(&spec(None), &log, None, &mut now);
        let got = events(&now);
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].1["status"]["state"], "TASK_STATE_COMPLETED");
        log.first = 1;
        log.events.pop_front();
        let mut behind = Vec::new();
        catch_up(&spec(Some(start)), &log, None, &mut behind);
        assert_eq!(events(&behind), got);
    }

    #[test]
    fn a_streams_task_is_found_past_comments_and_other_events() {
        let events = b": ping\r\n\r\ndata: {\"result\":{\"statusUpdate\":{}}}\n\ndata: {\"result\":\ndata: {\"task\":{\"id\":\"t1\"}}}\n\ndata: {\"res";
        assert_eq!(first_task(events).unwrap()["id"], "t1");
        assert!(first_task(b"data: {\"result\":{\"task\":{\"id\":\"t\"}}}").is_none(), "not whole yet");
        assert!(first_task(b"data: [1]\n\n").is_none());
    }
}
