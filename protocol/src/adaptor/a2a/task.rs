//! How an A2A task moves, as a pure state machine: the gateway's [`Task`] is the state, and
//! each input (a chunk of the agent's answer, a new message naming the task, a cancel, a
//! failure, an expiry) changes it and returns the stream responses saying so (`statusUpdate`,
//! `artifactUpdate`), which the broker keeps in the task's log and sends to its streams. No
//! I/O: the time and fresh message ids come from the caller's [`Stamps`].
//!
//! ```text
//! submitted ──first chunk──> working ──chunk with text or JSON──> working (+ an artifact part)
//!      │                        ├──last chunk──> completed
//!      │                        ├──last chunk, chunkType input-required──> input-required
//!      │                        │        (its text the status message) ──message naming the
//!      │                        │        task──> working (the next turn)
//!      │                        ├──chunk with an error──> failed ("cancelled": canceled)
//!      │                        └──a part past MAX_ARTIFACT_PARTS / MAX_ARTIFACT_BYTES──> failed
//!      └── any state not terminal ──cancel──> canceled; ──fail, lost chunks──> failed
//! ```
//!
//! A terminal task (completed, failed, canceled, rejected) never changes again: every input
//! then leaves it as it is and emits nothing (a message naming it is refused). Its history
//! keeps the last [`MAX_HISTORY`] messages, a large one without its parts; its one artifact
//! (`<taskId>-response`) at most [`MAX_ARTIFACT_PARTS`] parts and [`MAX_ARTIFACT_BYTES`]
//! bytes: an agent streaming without end cannot grow it further.

use frame_codec::{ArchivedAttrValue, DataKind, Frame};
use serde_json::{json, Value as Json};

use super::{A2aError, ErrorKind, Task, TaskState};

/// Messages a task's history keeps at most (the oldest go).
pub const MAX_HISTORY: usize = 20;
/// A message kept in a task's history whose JSON is larger than this keeps its ids, not its
/// parts (a part saying how large they were).
pub const MAX_KEPT_MESSAGE: usize = 16 * 1024;
/// Parts of a task's artifact at most: past them the task fails.
pub const MAX_ARTIFACT_PARTS: usize = 4096;
/// Bytes of the chunks making a task's artifact at most: past them the task fails.
pub const MAX_ARTIFACT_BYTES: usize = 4 << 20;

/// What a transition takes from the world: the time, and fresh ids for the agent messages it
/// writes (the broker's clock and uuids; a test's fixed ones).
pub trait Stamps {
    /// Now, as a task's status timestamp (RFC 3339 UTC with milliseconds, see [`timestamp`]).
    fn timestamp(&mut self) -> String;
    /// A new `messageId` for an agent's status message.
    fn message_id(&mut self) -> String;
}

/// A time in microseconds since the epoch as a task's timestamp: RFC 3339 UTC with
/// milliseconds (`2026-12-02T06:00:00.000Z`).
pub fn timestamp(micros: i64) -> String {
    let full = crate::adaptor::rfc3339_from_micros(micros);
    format!("{}Z", &full[..full.len() - 4])
}

/// One chunk of a turn's answer, as the machine reads it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Chunk {
    /// The part it adds to the task's artifact (`{"text": ...}` or `{"data": ...}`), none if
    /// it carries nothing.
    pub part: Option<Json>,
    /// The turn ended with this error (`emerror`; `cancelled`: it was canceled).
    pub error: Option<String>,
    /// The turn's last chunk (`emdone`).
    pub done: bool,
    /// `emchunktype` is `input-required`: with `done`, the agent waits for the client's input.
    pub input_required: bool,
    /// The chunk's size (its whole frame), counted against [`MAX_ARTIFACT_BYTES`].
    pub bytes: usize,
}

impl Chunk {
    /// A chunk frame of an agent's turn: a JSON string or text is a text part (none if empty),
    /// other JSON a data part, JSON that does not parse nothing.
    pub fn of(frame: &Frame) -> Chunk {
        let body = frame.body();
        let error = body.attr_str("emerror").map(str::to_owned);
        let done = matches!(body.attr("emdone"), Some(ArchivedAttrValue::Bool(true)));
        let input_required = body.attr_str("emchunktype") == Some("input-required");
        let part = match frame.header().data_kind {
            DataKind::None => None,
            DataKind::Json => match serde_json::from_slice::<Json>(&body.data) {
                Ok(Json::String(s)) if s.is_empty() => None,
                Ok(Json::String(s)) => Some(json!({"text": s})),
                Ok(v) => Some(json!({"data": v})),
                Err(_) => None,
            },
            _ if body.data.is_empty() => None,
            _ => Some(json!({"text": String::from_utf8_lossy(&body.data)})),
        };
        Chunk { part, error, done, input_required, bytes: frame.as_bytes().len() }
    }
}

/// A new task, submitted: `message` (the client's, as sent) is its history, told the task's
/// id and context.
pub fn submitted(id: String, context_id: String, mut message: Json, stamps: &mut dyn Stamps) -> Task {
    message["contextId"] = json!(context_id);
    message["taskId"] = json!(id);
    Task {
        id,
        context_id,
        state: TaskState::Submitted,
        status_message: None,
        timestamp: stamps.timestamp(),
        artifacts: Vec::new(),
        history: vec![message],
        artifact_bytes: 0,
    }
}

/// A client's message naming the task (its context `context_id`, if the message names one):
/// the next turn of a task waiting for input, which is working again from here. Refused for
/// another context, a terminal task, or one still working.
pub fn resume(
    t: &mut Task,
    context_id: Option<&str>,
    mut message: Json,
    stamps: &mut dyn Stamps,
) -> Result<Vec<Json>, A2aError> {
    if context_id.is_some_and(|c| c != t.context_id) {
        return Err(A2aError::new(ErrorKind::InvalidParams, "message: contextId is not the task's"));
    }
    if t.state.terminal() {
        let e = A2aError::new(ErrorKind::UnsupportedOperation, format!("the task is {}", t.state.as_str()));
        return Err(e.with("taskId", t.id.as_str()));
    }
    if !matches!(t.state, TaskState::InputRequired | TaskState::AuthRequired) {
        return Err(
            A2aError::new(ErrorKind::UnsupportedOperation, "the task is still working").with("taskId", t.id.as_str())
        );
    }
    message["contextId"] = json!(t.context_id);
    remember(t, message);
    t.state = TaskState::Working;
    t.status_message = None;
    t.timestamp = stamps.timestamp();
    Ok(vec![t.status_update()])
}

/// One chunk of the task's turn (see the module's doc).
pub fn chunk(t: &mut Task, c: Chunk, stamps: &mut dyn Stamps) -> Vec<Json> {
    let mut events = Vec::new();
    if t.state.terminal() {
        return events;
    }
    if matches!(t.state, TaskState::Submitted | TaskState::InputRequired | TaskState::AuthRequired) {
        t.state = TaskState::Working;
        t.status_message = None;
        t.timestamp = stamps.timestamp();
        events.push(t.status_update());
    }
    if let Some(e) = c.error {
        let state = if e == "cancelled" { TaskState::Canceled } else { TaskState::Failed };
        events.extend(settle(t, state, Some(&e), stamps));
        return events;
    }
    if c.input_required && c.done {
        let text = c.part.as_ref().and_then(|p| p["text"].as_str()).unwrap_or("input required").to_owned();
        events.extend(settle(t, TaskState::InputRequired, Some(&text), stamps));
        return events;
    }
    if let Some(p) = c.part {
        let parts = t.artifacts.first().and_then(|a| a["parts"].as_array()).map_or(0, Vec::len);
        if parts >= MAX_ARTIFACT_PARTS || t.artifact_bytes >= MAX_ARTIFACT_BYTES {
            let why = format!("the answer is over {MAX_ARTIFACT_PARTS} parts or {MAX_ARTIFACT_BYTES} bytes");
            events.extend(settle(t, TaskState::Failed, Some(&why), stamps));
            return events;
        }
        let append = !t.artifacts.is_empty();
        if !append {
            t.artifacts.push(json!({"artifactId": format!("{}-response", t.id), "name": "response", "parts": []}));
        }
        t.artifact_bytes += c.bytes;
        if let Some(parts) = t.artifacts[0]["parts"].as_array_mut() {
            parts.push(p.clone());
        }
        let update = json!({"artifactId": format!("{}-response", t.id), "name": "response", "parts": [p]});
        events.push(t.artifact_update(&update, append, false));
    }
    if c.done {
        events.extend(settle(t, TaskState::Completed, None, stamps));
    }
    events
}

/// `dropped` chunks of the answer were lost (the agent outran the turn's log): the answer has
/// a hole, so the task fails, saying so.
pub fn lost(t: &mut Task, dropped: u64, stamps: &mut dyn Stamps) -> Vec<Json> {
    let why = format!("{dropped} chunks of the answer were lost (the agent outran the gateway)");
    settle(t, TaskState::Failed, Some(&why), stamps)
}

/// The task fails, `why` its status message.
pub fn fail(t: &mut Task, why: &str, stamps: &mut dyn Stamps) -> Vec<Json> {
    settle(t, TaskState::Failed, Some(why), stamps)
}

/// The turn a message was to start could not start (`why`): a new task (`continued` false)
/// fails, nothing would move it; a continued one waits for input again, as it was.
pub fn not_started(t: &mut Task, continued: bool, why: &str, stamps: &mut dyn Stamps) -> Vec<Json> {
    match continued {
        true => settle(t, TaskState::InputRequired, Some(why), stamps),
        false => fail(t, why, stamps),
    }
}

/// The client canceled the task: canceled unless terminal (its status message kept).
pub fn cancel(t: &mut Task, stamps: &mut dyn Stamps) -> Vec<Json> {
    if t.state.terminal() {
        return Vec::new();
    }
    t.state = TaskState::Canceled;
    t.timestamp = stamps.timestamp();
    vec![t.status_update()]
}

/// The task is dropped unchanged for too long: one that had not settled fails first (its
/// timestamp and status message as they were), so its streams and waiters hear why.
pub fn expire(t: &mut Task) -> Vec<Json> {
    match t.state.settled() {
        true => Vec::new(),
        false => {
            t.state = TaskState::Failed;
            vec![t.status_update()]
        }
    }
}

/// Moves a task to `state`, with an agent message saying `text` (kept in its history); the
/// events saying so. A terminal task stays as it is.
pub fn settle(t: &mut Task, state: TaskState, text: Option<&str>, stamps: &mut dyn Stamps) -> Vec<Json> {
    if t.state.terminal() {
        return Vec::new();
    }
    t.state = state;
    t.timestamp = stamps.timestamp();
    t.status_message = text.map(|m| super::agent_text(&stamps.message_id(), &t.context_id, &t.id, m));
    if let Some(m) = &t.status_message {
        remember(t, m.clone());
    }
    vec![t.status_update()]
}

/// Adds a message to the task's history, which keeps the last [`MAX_HISTORY`] (one larger than
/// [`MAX_KEPT_MESSAGE`] without its parts).
fn remember(t: &mut Task, mut message: Json) {
    if t.history.len() == MAX_HISTORY {
        t.history.remove(0);
    }
    let size = message.to_string().len();
    if size > MAX_KEPT_MESSAGE {
        message["parts"] = json!([{"text": format!("({size} bytes, not kept in the history)")}]);
    }
    t.history.push(message);
}

#[cfg(test)]
mod tests {
    use frame_codec::{AttrValue, Attribute, FrameBody, FrameHeader};

    use super::*;

    /// A fixed clock (it ticks once a call) and numbered message ids.
    #[derive(Default)]
    struct Fixed {
        ticks: i64,
        ids: u32,
    }

    impl Stamps for Fixed {
        fn timestamp(&mut self) -> String {
            self.ticks += 1;
            timestamp(1_796_040_000_000_000 + self.ticks * 1000)
        }
        fn message_id(&mut self) -> String {
            self.ids += 1;
            format!("m{}", self.ids)
        }
    }

    fn user(text: &str) -> Json {
        json!({"messageId": "u", "role": "ROLE_USER", "parts": [{"text": text}]})
    }

    fn new_task(s: &mut Fixed) -> Task {
        submitted("t".into(), "c".into(), user("hi"), s)
    }

    fn text(s: &str) -> Chunk {
        Chunk { part: Some(json!({"text": s})), bytes: 100, ..Chunk::default() }
    }

    fn last(part: Option<&str>) -> Chunk {
        Chunk { part: part.map(|s| json!({"text": s})), done: true, bytes: 100, ..Chunk::default() }
    }

    fn states(events: &[Json]) -> Vec<&str> {
        events
            .iter()
            .map(|e| match e.get("statusUpdate") {
                Some(u) => u["status"]["state"].as_str().unwrap(),
                None => "artifact",
            })
            .collect()
    }

    #[test]
    fn a_new_task_is_submitted_with_the_clients_message_as_its_history() {
        let t = new_task(&mut Fixed::default());
        assert_eq!(t.state, TaskState::Submitted);
        assert_eq!(
            t.history,
            [json!({"messageId": "u", "role": "ROLE_USER", "parts": [{"text": "hi"}],
                                       "contextId": "c", "taskId": "t"})]
        );
        assert_eq!(t.timestamp, "2026-11-30T12:00:00.001Z");
    }

    #[test]
    fn first_chunk_makes_the_task_working() {
        let s = &mut Fixed::default();
        let mut t = new_task(s);
        let events = chunk(&mut t, text("a"), s);
        assert_eq!(states(&events), ["TASK_STATE_WORKING", "artifact"]);
        assert_eq!(t.state, TaskState::Working);
        let events = chunk(&mut t, text("b"), s);
        assert_eq!(states(&events), ["artifact"], "working once, then parts only");
    }

    #[test]
    fn each_part_is_a_part_of_the_one_artifact_streamed_as_an_update() {
        let s = &mut Fixed::default();
        let mut t = new_task(s);
        let first = chunk(&mut t, text("a"), s);
        let data = Chunk { part: Some(json!({"data": {"x": 1}})), bytes: 50, ..Chunk::default() };
        let second = chunk(&mut t, data, s);
        assert!(chunk(&mut t, Chunk { bytes: 10, ..Chunk::default() }, s).is_empty(), "an empty chunk adds nothing");
        assert_eq!(
            t.artifacts,
            [json!({"artifactId": "t-response", "name": "response", "parts": [{"text": "a"}, {"data": {"x": 1}}]})]
        );
        assert_eq!(t.artifact_bytes, 150);
        let update = |e: &Json| e["artifactUpdate"].clone();
        assert_eq!(
            update(&first[1]),
            json!({"taskId": "t", "contextId": "c",
                   "artifact": {"artifactId": "t-response", "name": "response", "parts": [{"text": "a"}]}})
        );
        assert_eq!(update(&second[0])["append"], true, "later parts append");
        assert_eq!(update(&second[0])["artifact"]["parts"], json!([{"data": {"x": 1}}]), "an update has its part only");
    }

    #[test]
    fn the_last_chunk_completes_the_task() {
        let s = &mut Fixed::default();
        let mut t = new_task(s);
        let events = chunk(&mut t, last(Some("done")), s);
        assert_eq!(states(&events), ["TASK_STATE_WORKING", "artifact", "TASK_STATE_COMPLETED"]);
        assert_eq!((t.state, &t.status_message), (TaskState::Completed, &None));
    }

    #[test]
    fn input_required_waits_for_the_next_message() {
        let s = &mut Fixed::default();
        let mut t = new_task(s);
        chunk(&mut t, text("partial"), s);
        let ask = Chunk { input_required: true, ..last(Some("which one?")) };
        let events = chunk(&mut t, ask, s);
        assert_eq!(states(&events), ["TASK_STATE_INPUT_REQUIRED"], "its text is no artifact part");
        assert_eq!(t.state, TaskState::InputRequired);
        assert_eq!(t.status_message.as_ref().unwrap()["parts"], json!([{"text": "which one?"}]));
        assert_eq!(t.history.last(), t.status_message.as_ref(), "the question is in the history");
        // The next message naming the task is its next turn.
        let events = resume(&mut t, Some("c"), user("the red one"), s).unwrap();
        assert_eq!(states(&events), ["TASK_STATE_WORKING"]);
        assert_eq!((t.state, &t.status_message), (TaskState::Working, &None));
        assert_eq!(t.history.last().unwrap()["contextId"], "c");
        assert_eq!(t.history.last().unwrap()["parts"], json!([{"text": "the red one"}]));
        chunk(&mut t, last(Some("red it is")), s);
        assert_eq!(t.state, TaskState::Completed);
        let Some(parts) = t.artifacts[0]["parts"].as_array() else { panic!("parts") };
        assert_eq!(parts.len(), 2, "both turns add to the one artifact");
    }

    #[test]
    fn input_required_without_text_says_so() {
        let s = &mut Fixed::default();
        let mut t = new_task(s);
        chunk(&mut t, Chunk { input_required: true, ..last(None) }, s);
        assert_eq!(t.status_message.unwrap()["parts"], json!([{"text": "input required"}]));
    }

    #[test]
    fn only_a_task_waiting_for_input_takes_a_message_of_its_context() {
        let s = &mut Fixed::default();
        let mut t = new_task(s);
        let e = resume(&mut t, None, user("x"), s).unwrap_err();
        assert_eq!((e.kind, e.message.as_str()), (ErrorKind::UnsupportedOperation, "the task is still working"));
        assert_eq!(e.metadata, [("taskId", "t".to_owned())]);
        chunk(&mut t, Chunk { input_required: true, ..last(None) }, s);
        let e = resume(&mut t, Some("other"), user("x"), s).unwrap_err();
        assert_eq!(e.kind, ErrorKind::InvalidParams, "another context's");
        assert_eq!(t.state, TaskState::InputRequired, "a refused message changes nothing");
        cancel(&mut t, s);
        let e = resume(&mut t, None, user("x"), s).unwrap_err();
        assert_eq!(e.message, "the task is TASK_STATE_CANCELED");
    }

    #[test]
    fn an_error_fails_the_task_and_cancelled_cancels_it() {
        let s = &mut Fixed::default();
        let mut t = new_task(s);
        let events = chunk(&mut t, Chunk { error: Some("the agent left".into()), ..text("ignored") }, s);
        assert_eq!(states(&events), ["TASK_STATE_WORKING", "TASK_STATE_FAILED"]);
        assert_eq!(t.status_message.unwrap()["parts"], json!([{"text": "the agent left"}]));
        assert!(t.artifacts.is_empty(), "the error's chunk adds no part");
        let mut t = new_task(s);
        chunk(&mut t, Chunk { error: Some("cancelled".into()), ..Chunk::default() }, s);
        assert_eq!(t.state, TaskState::Canceled);
    }

    #[test]
    fn artifact_past_its_byte_bound_fails_the_task() {
        let s = &mut Fixed::default();
        let mut t = new_task(s);
        chunk(&mut t, Chunk { bytes: MAX_ARTIFACT_BYTES - 1, ..text("big") }, s);
        assert_eq!(t.state, TaskState::Working, "under the bound");
        chunk(&mut t, text("over"), s);
        assert_eq!(t.state, TaskState::Working, "the part that crosses it is kept");
        let events = chunk(&mut t, text("past"), s);
        assert_eq!(states(&events), ["TASK_STATE_FAILED"]);
        assert_eq!(t.artifacts[0]["parts"].as_array().unwrap().len(), 2, "the part past it is not");
        let why = &t.status_message.as_ref().unwrap()["parts"][0]["text"];
        assert_eq!(why, &json!(format!("the answer is over {MAX_ARTIFACT_PARTS} parts or {MAX_ARTIFACT_BYTES} bytes")));
    }

    #[test]
    fn artifact_past_its_part_bound_fails_the_task() {
        let s = &mut Fixed::default();
        let mut t = new_task(s);
        for _ in 0..MAX_ARTIFACT_PARTS {
            chunk(&mut t, Chunk { bytes: 1, ..text("x") }, s);
        }
        assert_eq!(t.state, TaskState::Working);
        chunk(&mut t, Chunk { bytes: 1, ..text("x") }, s);
        assert_eq!(t.state, TaskState::Failed);
        assert_eq!(t.artifacts[0]["parts"].as_array().unwrap().len(), MAX_ARTIFACT_PARTS);
    }

    #[test]
    fn a_canceled_task_takes_no_more_chunks() {
        let s = &mut Fixed::default();
        let mut t = new_task(s);
        chunk(&mut t, text("a"), s);
        t.status_message = Some(json!({"kept": true}));
        assert_eq!(states(&cancel(&mut t, s)), ["TASK_STATE_CANCELED"]);
        assert_eq!(t.status_message, Some(json!({"kept": true})), "a cancel keeps the status message");
        let before = t.clone();
        assert!(chunk(&mut t, text("b"), s).is_empty());
        assert!(chunk(&mut t, last(Some("c")), s).is_empty());
        assert!(chunk(&mut t, Chunk { error: Some("x".into()), ..Chunk::default() }, s).is_empty());
        assert!(cancel(&mut t, s).is_empty() && fail(&mut t, "x", s).is_empty() && expire(&mut t).is_empty());
        assert_eq!(t, before, "a terminal task never changes");
    }

    #[test]
    fn lost_chunks_fail_the_task_and_a_turn_that_cannot_start_leaves_a_continued_one_waiting() {
        let s = &mut Fixed::default();
        let mut t = new_task(s);
        lost(&mut t, 3, s);
        assert_eq!(t.state, TaskState::Failed);
        assert_eq!(
            t.status_message.unwrap()["parts"][0]["text"],
            "3 chunks of the answer were lost (the agent outran the gateway)"
        );
        let mut t = new_task(s);
        not_started(&mut t, false, "busy", s);
        assert_eq!(t.state, TaskState::Failed, "nothing would move a new task");
        let mut t = new_task(s);
        chunk(&mut t, Chunk { input_required: true, ..last(None) }, s);
        resume(&mut t, None, user("x"), s).unwrap();
        not_started(&mut t, true, "busy", s);
        assert_eq!(t.state, TaskState::InputRequired, "a continued one waits as it was");
        assert_eq!(t.status_message.unwrap()["parts"][0]["text"], "busy");
    }

    #[test]
    fn an_expired_task_fails_unless_settled() {
        let s = &mut Fixed::default();
        let mut t = new_task(s);
        let stamp = t.timestamp.clone();
        assert_eq!(states(&expire(&mut t)), ["TASK_STATE_FAILED"]);
        assert_eq!((t.timestamp, t.status_message), (stamp, None), "as it was but failed");
        let mut t = new_task(s);
        chunk(&mut t, Chunk { input_required: true, ..last(None) }, s);
        assert!(expire(&mut t).is_empty(), "one waiting for input has settled");
        assert_eq!(t.state, TaskState::InputRequired);
    }

    #[test]
    fn the_history_keeps_the_last_messages_and_a_large_one_without_its_parts() {
        let s = &mut Fixed::default();
        let mut t = new_task(s);
        for i in 0..MAX_HISTORY + 5 {
            chunk(&mut t, Chunk { input_required: true, ..last(Some(&format!("q{i}"))) }, s);
            resume(&mut t, None, user(&format!("a{i}")), s).unwrap();
        }
        assert_eq!(t.history.len(), MAX_HISTORY, "the oldest go");
        assert_eq!(t.history.last().unwrap()["parts"][0]["text"], format!("a{}", MAX_HISTORY + 4));
        assert_eq!(t.history[0]["parts"][0]["text"], "q15");
        chunk(&mut t, Chunk { input_required: true, ..last(None) }, s);
        let big = user(&"x".repeat(MAX_KEPT_MESSAGE));
        let size = {
            let mut m = big.clone();
            m["contextId"] = json!("c");
            m.to_string().len()
        };
        resume(&mut t, None, big, s).unwrap();
        let kept = t.history.last().unwrap();
        assert_eq!(kept["messageId"], "u", "its ids are kept");
        assert_eq!(kept["parts"], json!([{"text": format!("({size} bytes, not kept in the history)")}]));
    }

    #[test]
    fn status_messages_are_the_agents_with_fresh_ids() {
        let s = &mut Fixed::default();
        let mut t = new_task(s);
        fail(&mut t, "why", s);
        assert_eq!(
            t.status_message.unwrap(),
            json!({"messageId": "m1", "contextId": "c", "taskId": "t", "role": "ROLE_AGENT", "parts": [{"text": "why"}]})
        );
    }

    #[test]
    fn timestamps_are_utc_with_milliseconds() {
        assert_eq!(timestamp(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(timestamp(1_796_040_000_500_999), "2026-11-30T12:00:00.500Z");
    }

    #[test]
    fn a_chunk_frame_is_read_as_its_part_and_attributes() {
        let frame = |kind: DataKind, data: &[u8], attrs: Vec<(&str, AttrValue)>| {
            let attributes =
                attrs.into_iter().map(|(n, value)| Attribute { name: n.into(), value }).collect::<Vec<_>>();
            let body = FrameBody { topic: "agent.a".into(), attributes, data: data.to_vec() };
            Frame::encode(&FrameHeader::event(kind), &body).unwrap()
        };
        let f = frame(
            DataKind::Text,
            b"hello",
            vec![("emdone", AttrValue::Bool(true)), ("emchunktype", AttrValue::Str("input-required".into()))],
        );
        let c = Chunk::of(&f);
        assert_eq!(
            c,
            Chunk {
                part: Some(json!({"text": "hello"})),
                error: None,
                done: true,
                input_required: true,
                bytes: f.as_bytes().len()
            }
        );
        let part = |kind, data: &[u8]| Chunk::of(&frame(kind, data, Vec::new())).part;
        assert_eq!(part(DataKind::Json, br#""hi""#), Some(json!({"text": "hi"})));
        assert_eq!(part(DataKind::Json, br#"{"a":1}"#), Some(json!({"data": {"a": 1}})));
        assert_eq!(part(DataKind::Json, br#""""#), None, "an empty string is no part");
        assert_eq!(part(DataKind::Json, b"{"), None, "nor JSON that does not parse");
        assert_eq!(part(DataKind::Text, b""), None);
        assert_eq!(part(DataKind::None, b""), None);
        let e = Chunk::of(&frame(DataKind::None, b"", vec![("emerror", AttrValue::Str("cancelled".into()))]));
        assert_eq!((e.error.as_deref(), e.done), (Some("cancelled"), false));
    }
}
