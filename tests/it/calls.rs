//! Agent streaming calls (Mode 1): agents attach over WebSocket and answer each turn with
//! chunks; clients open sessions and stream turns as server-sent events; end-turn, cancel,
//! close; resuming after `Last-Event-ID`; a stream that falls behind the log is told what it
//! lost; an agent that leaves mid-turn and an idle session end the turn with an error event.

use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use serde_json::{json, Value};

use super::util::{wait_for, Resp, TestBroker};

/// An agent: registered, and attached over `GET /agent/ws`.
pub(super) struct Agent {
    ws: tungstenite::WebSocket<TcpStream>,
}

impl Agent {
    pub(super) fn attach(b: &TestBroker, id: &str) -> Agent {
        let r = b.client().post("/agent/register", "application/json", json!({"agentId": id}).to_string().as_bytes());
        assert!(matches!(r.status, 200 | 201), "{}", r.text());
        let stream = TcpStream::connect(b.traffic).unwrap();
        stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let (ws, _) = tungstenite::client(format!("ws://{}/agent/ws?agentId={id}", b.traffic), stream).unwrap();
        attached(b, id, None);
        Agent { ws }
    }

    /// The next event the agent gets (a turn's request, or a client's notice).
    pub(super) fn next(&mut self) -> Value {
        loop {
            match self.ws.read().unwrap() {
                tungstenite::Message::Text(t) => return serde_json::from_str(t.as_str()).unwrap(),
                tungstenite::Message::Ping(_) | tungstenite::Message::Pong(_) => {}
                other => panic!("unexpected {other:?}"),
            }
        }
    }

    pub(super) fn send(&mut self, chunk: Value) {
        self.ws.send(tungstenite::Message::text(chunk.to_string())).unwrap();
    }
}

/// Waits until agent `id`'s WebSocket session has claimed it (its 101 comes first): a second
/// attach is 409 from then on.
pub(super) fn attached(b: &TestBroker, id: &str, token: Option<&str>) {
    let path = match token {
        Some(t) => format!("/agent/ws?agentId={id}&access_token={t}"),
        None => format!("/agent/ws?agentId={id}"),
    };
    wait_for(Duration::from_secs(5), || (b.client().get(&path).status == 409).then_some(()));
}

fn open(b: &TestBroker, body: Value) -> Resp {
    b.client().post("/session/open", "application/json", body.to_string().as_bytes())
}

fn open_sid(b: &TestBroker, agent: Option<&str>) -> String {
    let body = match agent {
        Some(a) => json!({"clientId": "c1", "agentId": a}),
        None => json!({"clientId": "c1"}),
    };
    let r = open(b, body);
    assert_eq!(r.status, 201, "{}", r.text());
    r.json()["sessionId"].as_str().unwrap().to_owned()
}

/// One server-sent event: (id, event, data).
pub(super) type Event = (Option<String>, String, String);

/// A turn's `text/event-stream`, parsed as an `EventSource` does.
pub(super) struct Turn {
    r: BufReader<TcpStream>,
    events: VecDeque<Event>,
    ended: bool,
}

impl Turn {
    /// Sends `request` and reads the head: the stream, or the whole answer when it is not one.
    fn start(b: &TestBroker, request: String, body: &[u8]) -> Result<Turn, (u16, String)> {
        let mut s = TcpStream::connect(b.traffic).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s.write_all(request.as_bytes()).unwrap();
        s.write_all(body).unwrap();
        let mut r = BufReader::new(s);
        let mut head = String::new();
        while !head.ends_with("\r\n\r\n") {
            assert!(r.read_line(&mut head).unwrap() > 0, "closed before the head: {head:?}");
        }
        let status: u16 = head[9..12].parse().unwrap();
        if status != 200 {
            let len = head
                .lines()
                .find_map(|l| l.to_ascii_lowercase().strip_prefix("content-length: ").map(|v| v.parse().unwrap()))
                .unwrap_or(0);
            let mut body = vec![0; len];
            r.read_exact(&mut body).unwrap();
            return Err((status, String::from_utf8_lossy(&body).into_owned()));
        }
        assert!(head.contains("content-type: text/event-stream"), "{head}");
        Ok(Turn { r, events: VecDeque::new(), ended: false })
    }

    pub(super) fn post(b: &TestBroker, sid: &str, prompt: &str) -> Result<Turn, (u16, String)> {
        Turn::post_as(b, sid, prompt, None)
    }

    /// [`Turn::post`] with `token` as the bearer credential.
    pub(super) fn post_as(b: &TestBroker, sid: &str, prompt: &str, token: Option<&str>) -> Result<Turn, (u16, String)> {
        let auth = token.map(|t| format!("authorization: Bearer {t}\r\n")).unwrap_or_default();
        let req = format!(
            "POST /session/stream/{sid} HTTP/1.1\r\nhost: x\r\n{auth}content-type: text/plain\r\ncontent-length: {}\r\n\r\n",
            prompt.len()
        );
        Turn::start(b, req, prompt.as_bytes())
    }

    fn get(b: &TestBroker, sid: &str, last: Option<u64>) -> Result<Turn, (u16, String)> {
        let extra = last.map(|l| format!("last-event-id: {l}\r\n")).unwrap_or_default();
        Turn::start(
            b,
            format!("GET /session/stream/{sid} HTTP/1.1\r\nhost: x\r\naccept: text/event-stream\r\n{extra}\r\n"),
            b"",
        )
    }

    /// The next event; `None` once the stream ended.
    pub(super) fn next(&mut self) -> Option<Event> {
        while self.events.is_empty() && !self.ended {
            let mut size = String::new();
            self.r.read_line(&mut size).unwrap();
            let n = usize::from_str_radix(size.trim(), 16).unwrap();
            let mut chunk = vec![0u8; n + 2];
            self.r.read_exact(&mut chunk).unwrap();
            if n == 0 {
                self.ended = true;
                break;
            }
            let text = String::from_utf8(chunk[..n].to_vec()).unwrap();
            for block in text.split("\n\n").filter(|b| !b.is_empty()) {
                let (mut id, mut event, mut data) = (None, "message".to_owned(), Vec::new());
                for line in block.lines() {
                    if let Some(v) = line.strip_prefix("id: ") {
                        id = Some(v.to_owned());
                    } else if let Some(v) = line.strip_prefix("event: ") {
                        event = v.to_owned();
                    } else if let Some(v) = line.strip_prefix("data: ") {
                        data.push(v.to_owned());
                    } else if !line.starts_with(':') {
                        panic!("not an event line: {line:?}");
                    }
                }
                self.events.push_back((id, event, data.join("\n")));
            }
        }
        self.events.pop_front()
    }

    fn expect(&mut self, id: u64, event: &str, data: &str) {
        let got = self.next().expect("an event");
        assert_eq!(got, (Some(id.to_string()), event.to_owned(), data.to_owned()));
    }
}

/// `evmesh_stream_chunks_total`.
fn chunks_taken(b: &TestBroker) -> u64 {
    let m = b.admin().get("/metrics").text();
    m.lines().find_map(|l| l.strip_prefix("evmesh_stream_chunks_total ")).unwrap().parse().unwrap()
}

fn chunk(b: &TestBroker, sid: &str, body: Value) -> Resp {
    b.client().post(&format!("/session/chunk/{sid}"), "application/json", body.to_string().as_bytes())
}

fn control(b: &TestBroker, what: &str, sid: &str) -> Resp {
    b.client().post(&format!("/session/{what}/{sid}"), "application/json", b"")
}

#[test]
fn turns_stream_the_agents_chunks_and_every_turn_of_a_session_reaches_its_agent() {
    for driver in ["epoll", "uring"] {
        let b = TestBroker::start(&["--io-driver", driver, "--shards", "4"]);
        let mut a = Agent::attach(&b, "echo-a");
        let mut z = Agent::attach(&b, "echo-z");
        // Sessions go to the least loaded of the ready agents, and say which.
        let (s1, s2) = (open_sid(&b, None), open_sid(&b, None));
        let mut agents: Vec<&str> = [&s1, &s2].iter().map(|s| s.split(':').next().unwrap()).collect();
        agents.sort();
        assert_eq!(agents, ["echo-a", "echo-z"], "{driver}");
        let (sid, agent, other) = if s1.starts_with("echo-a:") { (s1, &mut a, &mut z) } else { (s1, &mut z, &mut a) };
        let r = open(&b, json!({"clientId": "c1", "agentId": "echo-a"}));
        assert_eq!(r.json()["agentId"], "echo-a");
        assert_eq!(r.json()["instanceUrl"], format!("http://{}", b.traffic));
        for turn in 0..3 {
            let prompt = format!("hello {turn}");
            let mut t = Turn::post(&b, &sid, &prompt).unwrap();
            let request = agent.next();
            assert_eq!(request["type"], "evmesh.stream.request");
            assert_eq!(request["emsessionid"], sid.as_str());
            assert_eq!(request["data"], prompt.as_str());
            assert_eq!(request["datacontenttype"], "text/plain");
            assert_eq!(request["emreplyto"], format!("http://{}/session/chunk/{sid}", b.traffic));
            // A turn at a time.
            assert_eq!(Turn::post(&b, &sid, "again").err().map(|e| e.0), Some(409));
            agent.send(json!({"type": "chunk", "sessionId": sid, "seq": 0, "data": "hello", "done": false}));
            t.expect(0, "chunk", "hello");
            // Or over HTTP, a JSON value, a line break inside; a resend is ignored.
            let r = chunk(&b, &sid, json!({"sessionId": sid, "seq": 1, "data": {"w": "x\ny"}}));
            assert_eq!(r.json(), json!({"duplicate": false}));
            assert_eq!(chunk(&b, &sid, json!({"seq": 1, "data": "again"})).json(), json!({"duplicate": true}));
            t.expect(1, "chunk", r#"{"w":"x\ny"}"#);
            agent.send(json!({"type": "chunk", "sessionId": sid, "seq": 2, "data": "two\nlines", "done": true}));
            t.expect(2, "done", "two\nlines");
            assert_eq!(t.next(), None, "the stream ends with the turn");
            chunk(&b, &sid, json!({"seq": 3, "data": "late"})).assert_problem(409);
        }
        // The other agent got nothing of it, and may not send its chunks.
        other.send(json!({"type": "chunk", "sessionId": sid, "seq": 9, "data": "x"}));
        let e = other.next();
        assert_eq!((e["type"].as_str(), e["status"].as_u64()), (Some("error"), Some(403)), "{e}");
        // end-turn: the stream ends with done, and the agent is told.
        let mut t = Turn::post(&b, &sid, "more").unwrap();
        agent.next();
        assert_eq!(control(&b, "end-turn", &sid).json(), json!({"sessionId": sid, "turn": "ended"}));
        t.expect(0, "done", "");
        assert_eq!(t.next(), None);
        assert_eq!(agent.next()["type"], "evmesh.stream.end-turn");
        control(&b, "end-turn", &sid).assert_problem(409);
        // close: the session is gone.
        assert_eq!(control(&b, "close", &sid).json(), json!({"sessionId": sid, "closed": true}));
        assert_eq!(agent.next()["type"], "evmesh.stream.close");
        assert_eq!(Turn::post(&b, &sid, "x").err().map(|e| e.0), Some(404));
        let _ = s2;
    }
}

#[test]
fn cancel_resume_and_a_stream_that_falls_behind_is_told_what_it_lost() {
    let b = TestBroker::start(&[]);
    let mut agent = Agent::attach(&b, "gen");
    let sid = open_sid(&b, Some("gen"));
    // Cancel: the stream ends with an error event; the agent is told; its chunks are refused.
    let mut t = Turn::post(&b, &sid, "long story").unwrap();
    agent.next();
    agent.send(json!({"type": "chunk", "sessionId": sid, "data": "Once"}));
    t.expect(0, "chunk", "Once");
    assert_eq!(control(&b, "cancel", &sid).json(), json!({"sessionId": sid, "turn": "cancelled"}));
    t.expect(1, "error", "cancelled");
    assert_eq!(t.next(), None);
    assert_eq!(agent.next()["type"], "evmesh.stream.cancel");
    chunk(&b, &sid, json!({"data": "upon"})).assert_problem(409);

    // Resume: a client that lost its connection reads on after the last id it had.
    let mut t = Turn::post(&b, &sid, "again").unwrap();
    agent.next();
    for w in ["a", "b", "c"] {
        agent.send(json!({"type": "chunk", "sessionId": sid, "data": w}));
    }
    t.expect(0, "chunk", "a");
    drop(t);
    let mut t = Turn::get(&b, &sid, Some(0)).unwrap();
    t.expect(1, "chunk", "b");
    t.expect(2, "chunk", "c");
    agent.send(json!({"type": "chunk", "sessionId": sid, "done": true}));
    t.expect(3, "done", "");
    assert_eq!(t.next(), None);
    // Nothing more after the last chunk: 204, which stops an EventSource reconnecting.
    assert_eq!(Turn::get(&b, &sid, Some(3)).err().map(|e| e.0), Some(204));
    // A stream that names its turn (?turn=, the request's emturn) is not another turn's.
    let path = |turn: &str| format!("GET /session/stream/{sid}?turn={turn} HTTP/1.1\r\nhost: x\r\n\r\n");
    assert_eq!(Turn::start(&b, path("1"), b"").err().map(|e| e.0), Some(204));
    assert_eq!(Turn::start(&b, path("x"), b"").err().map(|e| e.0), Some(400));
    let mut again = Turn::start(&b, path("2"), b"").unwrap();
    assert_eq!(again.next().map(|e| e.1), Some("dropped".into()), "read to its end before");
    again.expect(3, "done", "");
    // A turn read to its end keeps only its last chunk: a resume from before is told.
    let mut late = Turn::get(&b, &sid, Some(1)).unwrap();
    assert_eq!(late.next(), Some((None, "dropped".into(), r#"{"dropped":1}"#.into())));
    late.expect(3, "done", "");

    // The agent's chunk for a cancelled turn, sent before it heard of the cancel, is refused
    // (409) rather than taken into the next turn, whose own chunks then count from 0: for sure
    // when it names its turn (the request's emturn), as here; without, when it comes before the
    // next turn's request went out (unit tests: shard::calls).
    let mut t = Turn::post(&b, &sid, "third").unwrap();
    let request = agent.next();
    assert_eq!(request["emturn"], 3);
    agent.send(json!({"type": "chunk", "sessionId": sid, "seq": 0, "data": "x"}));
    t.expect(0, "chunk", "x");
    control(&b, "cancel", &sid);
    let mut t = Turn::post(&b, &sid, "fourth").unwrap();
    agent.send(json!({"type": "chunk", "sessionId": sid, "seq": 1, "data": "late", "turn": 3}));
    let mut notices = Vec::new();
    let request = loop {
        let e = agent.next();
        if e["type"] == "evmesh.stream.request" {
            break e;
        }
        notices.push(e);
    };
    assert_eq!(request["emturn"], 4);
    assert!(notices.iter().any(|e| e["type"] == "evmesh.stream.cancel"), "{notices:?}");
    if !notices.iter().any(|e| e["type"] == "error") {
        let e = agent.next();
        assert_eq!((e["type"].as_str(), e["status"].as_u64()), (Some("error"), Some(409)), "the late chunk: {e}");
    }
    agent.send(json!({"type": "chunk", "sessionId": sid, "seq": 0, "data": "fresh", "turn": 4}));
    agent.send(json!({"type": "chunk", "sessionId": sid, "seq": 1, "done": true}));
    t.expect(0, "chunk", "fresh");
    t.expect(1, "done", "");
    // Chunks naming another turn are refused too.
    drop(Turn::post(&b, &sid, "fifth").unwrap());
    agent.next();
    agent.send(json!({"type": "chunk", "sessionId": sid, "data": "x", "turn": 4}));
    assert_eq!(agent.next()["status"], 409);
    control(&b, "cancel", &sid);
    assert_eq!(agent.next()["type"], "evmesh.stream.cancel");

    // Nobody reading: past 1024 chunks behind, the oldest go, and the reader is told how many.
    drop(Turn::post(&b, &sid, "flood").unwrap());
    agent.next();
    let before = chunks_taken(&b);
    for seq in 0..1100u64 {
        agent.send(json!({"type": "chunk", "sessionId": sid, "seq": seq, "data": format!("t{seq}")}));
    }
    agent.send(json!({"type": "chunk", "sessionId": sid, "seq": 1100, "error": "out of tokens"}));
    wait_for(Duration::from_secs(10), || (chunks_taken(&b) >= before + 1101).then_some(()));
    let mut t = Turn::get(&b, &sid, None).unwrap();
    assert_eq!(t.next(), Some((None, "dropped".into(), r#"{"dropped":77}"#.into())));
    t.expect(77, "chunk", "t77");
    let rest: Vec<Event> = std::iter::from_fn(|| t.next()).collect();
    assert_eq!(rest.len(), 1023);
    assert_eq!(rest.last().unwrap(), &(Some("1100".into()), "error".into(), "out of tokens".into()));
}

#[test]
fn an_agent_that_leaves_mid_turn_ends_it_with_an_error_event_and_idle_sessions_expire() {
    let b = TestBroker::start(&["--session-ttl-ms", "400"]);
    let mut agent = Agent::attach(&b, "flaky");
    // One connection per agent (once the first one's session has claimed it, which `attach`
    // waits for: until then a second may get its 101 and then a close).
    let stream = TcpStream::connect(b.traffic).unwrap();
    let err = tungstenite::client(format!("ws://{}/agent/ws?agentId=flaky", b.traffic), stream).unwrap_err();
    assert!(matches!(err, tungstenite::HandshakeError::Failure(tungstenite::Error::Http(ref r)) if r.status() == 409));
    let sid = open_sid(&b, Some("flaky"));
    let mut t = Turn::post(&b, &sid, "hi").unwrap();
    agent.next();
    agent.send(json!({"type": "chunk", "sessionId": sid, "data": "partial"}));
    t.expect(0, "chunk", "partial");
    drop(agent);
    t.expect(1, "error", "the agent disconnected");
    assert_eq!(t.next(), None);
    // Not attached: a turn is refused at once rather than left hanging.
    let (status, body) = Turn::post(&b, &sid, "hi").err().unwrap();
    assert_eq!(status, 503, "{body}");

    // An idle session expires; a turn in progress ends with an error event.
    let mut agent = wait_for(Duration::from_secs(5), || {
        let stream = TcpStream::connect(b.traffic).unwrap();
        tungstenite::client(format!("ws://{}/agent/ws?agentId=flaky", b.traffic), stream)
            .ok()
            .map(|(ws, _)| Agent { ws })
    });
    attached(&b, "flaky", None);
    let mut t = Turn::post(&b, &sid, "hi").unwrap();
    agent.next();
    t.expect(0, "error", "the session expired");
    assert_eq!(t.next(), None);
    assert_eq!(Turn::post(&b, &sid, "hi").err().map(|e| e.0), Some(404));
    let m = b.admin().get("/metrics").text();
    assert!(m.lines().any(|l| l.starts_with("evmesh_stream_sessions_expired_total") && !l.ends_with(" 0")), "{m}");
}

#[test]
fn bad_session_requests_are_refused_with_problems() {
    let b = TestBroker::start(&["--max-sessions", "2"]);
    open(&b, json!({"client": "x"})).assert_problem(400);
    open(&b, json!({"clientId": "a b"})).assert_problem(400);
    open(&b, json!({"clientId": "c", "agentId": "nobody"})).assert_problem(503);
    open(&b, json!({"clientId": "c"})).assert_problem(503);
    b.client().get("/session/open").assert_problem(405);
    let mut agent = Agent::attach(&b, "ag");
    let sid = open_sid(&b, Some("ag"));
    open_sid(&b, Some("ag"));
    let full = open(&b, json!({"clientId": "c", "agentId": "ag"}));
    full.assert_problem(429);
    assert!(full.header("retry-after").is_some());
    for bad in ["nocolon", "ag:not-hex-zz", "a%20b:00"] {
        assert_eq!(Turn::post(&b, bad, "x").err().map(|e| e.0), Some(400), "{bad}");
    }
    assert_eq!(Turn::post(&b, "ag:0000", "x").err().map(|e| e.0), Some(404));
    control(&b, "cancel", &sid).assert_problem(409);
    b.client().get(&format!("/session/cancel/{sid}")).assert_problem(405);
    b.client().request("PUT", &format!("/session/stream/{sid}"), &[], b"").assert_problem(405);
    // Chunks: malformed, another session's id, too big, on a session that is not an agent's.
    chunk(&b, &sid, json!({"data": "x", "extra": 1})).assert_problem(400);
    chunk(&b, &sid, json!({"sessionId": "ag:1234", "data": "x"})).assert_problem(400);
    b.client().post(&format!("/session/chunk/{sid}"), "application/json", b"{").assert_problem(400);
    let _t = Turn::post(&b, &sid, "x").unwrap();
    agent.next();
    chunk(&b, &sid, json!({"data": "x".repeat(70_000)})).assert_problem(400);
    agent.send(json!({"type": "chunk", "data": "x"}));
    assert_eq!(agent.next()["status"], 400, "a chunk frame names its session");
    let stream = TcpStream::connect(b.traffic).unwrap();
    let (mut ws, _) = tungstenite::client(format!("ws://{}/session/subscribe/s-1", b.traffic), stream).unwrap();
    ws.send(tungstenite::Message::text(json!({"type": "chunk", "sessionId": sid, "data": "x"}).to_string())).unwrap();
    let reply = loop {
        if let tungstenite::Message::Text(t) = ws.read().unwrap() {
            break serde_json::from_str::<Value>(t.as_str()).unwrap();
        }
    };
    assert_eq!(reply["status"], 400, "{reply}");
    // The agent's WebSocket: its id is checked.
    b.client().get("/agent/ws?agentId=a%20b").assert_problem(400);
    b.client().get("/agent/ws").assert_problem(400);
}
