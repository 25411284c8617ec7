//! `evmesh-client`, the Rust SDK, against a real broker: every publish form, every transport,
//! and the ways a session ends in production (a broker killed and restarted mid-stream, a
//! token expiring mid-stream, a consumer that stops reading).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use evmesh_client::cloudevents::{AttributesReader, Event, EventBuilder, EventBuilderV10};
use evmesh_client::{
    Backoff, Client, ConnectionState, Consumer, ContentMode, Mode, Start, Subscription, Token, Transport,
};
use futures_util::StreamExt;

use super::util::{wait_for, TestBroker};

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap()
}

fn ev(id: &str) -> Event {
    EventBuilderV10::new()
        .id(id)
        .source("/sdk")
        .ty("com.example.sdk")
        .data("application/json", serde_json::json!({ "n": id }))
        .build()
        .unwrap()
}

fn url(b: &TestBroker) -> String {
    format!("http://{}", b.traffic)
}

/// Backoff short enough for a test to see several reconnects, long enough to be backoff.
fn quick() -> Backoff {
    Backoff { min: Duration::from_millis(50), max: Duration::from_millis(500) }
}

/// Takes deliveries until `want` distinct event ids were seen (acking each), or fails after
/// `limit`; returns how many deliveries that took.
async fn take_acking(c: &mut Consumer, want: &BTreeSet<String>, limit: Duration) -> (BTreeSet<String>, usize) {
    let mut seen = BTreeSet::new();
    let mut n = 0;
    let deadline = tokio::time::Instant::now() + limit;
    while !want.is_subset(&seen) {
        let d = tokio::time::timeout_at(deadline, c.next())
            .await
            .unwrap_or_else(|_| panic!("{} of {} events within {limit:?}", seen.len(), want.len()))
            .expect("the consumer ended")
            .expect("a delivery");
        n += 1;
        seen.insert(d.event.id().to_owned());
        d.ack();
    }
    (seen, n)
}

#[test]
fn publishes_in_every_form_and_consumes_on_every_transport() {
    let b = TestBroker::start(&["--default-partitions", "2"]);
    runtime().block_on(async {
        let c = Client::new(url(&b)).unwrap();
        for (name, transport) in [("ws", Transport::WebSocket), ("sse", Transport::Sse), ("poll", Transport::LongPoll)]
        {
            let s = Subscription::new(format!("sdk-{name}"), "sdk").start(Start::Earliest);
            assert!(c.subscribe(&s).await.unwrap().created);
            assert!(!c.subscribe(&s).await.unwrap().created, "the same definition again is 200");
            let _ = transport;
        }
        let conflict = c.subscribe(&Subscription::new("sdk-ws", "other")).await.unwrap_err();
        assert_eq!(conflict.status(), Some(409), "{conflict}");

        let one = c.publish("sdk", &ev("s-1")).await.unwrap();
        assert!(one.partition < 2);
        c.publish_as("sdk", &ev("b-1"), ContentMode::Binary).await.unwrap();
        let batch = c.publish_batch("sdk", &[ev("batch-1"), ev("batch-2")]).await.unwrap();
        assert_eq!(batch.len(), 2);
        let publisher = c.publisher_with("sdk", 8).await.unwrap();
        let mut receipts = Vec::new();
        for i in 0..50 {
            receipts.push(publisher.send(&ev(&format!("p-{i}"))).await.unwrap());
        }
        for r in receipts {
            r.await.unwrap();
        }
        publisher.flush().await.unwrap();
        // A refused event is the broker's problem+json, not a panic or a hang.
        let bad = c.publish("bad/topic", &ev("x")).await.unwrap_err();
        assert_eq!(bad.status(), Some(400), "{bad}");
        assert!(bad.problem().unwrap().detail.is_some());

        let mut want: BTreeSet<String> = ["s-1", "b-1", "batch-1", "batch-2"].map(String::from).into();
        want.extend((0..50).map(|i| format!("p-{i}")));
        for (name, transport) in [("ws", Transport::WebSocket), ("sse", Transport::Sse), ("poll", Transport::LongPoll)]
        {
            let mut consumer =
                c.consumer(format!("sdk-{name}")).transport(transport).poll_wait(Duration::from_millis(500)).start();
            let (seen, n) = take_acking(&mut consumer, &want, Duration::from_secs(20)).await;
            assert_eq!(seen, want, "{name}");
            assert_eq!(n, want.len(), "{name}: nothing twice while acked in time");
            assert!(matches!(*consumer.state().borrow(), ConnectionState::Connected { .. }), "{name}");
        }
        // The binary-mode event kept its data.
        let stored: Vec<_> = (0..2).flat_map(|p| b.events("sdk", p)).collect();
        let binary = stored.iter().find(|(_, e)| e["id"] == "b-1").unwrap();
        assert_eq!(binary.1["data"], serde_json::json!({"n": "b-1"}));

        // An unknown subscription ends the consumer with the broker's 404, once.
        let mut gone = c.consumer("nope").start();
        let e = gone.next().await.unwrap().unwrap_err();
        assert_eq!(e.status(), Some(404), "{e}");
        assert!(gone.next().await.is_none());
        assert!(matches!(*gone.state().borrow(), ConnectionState::Closed { .. }));

        c.unsubscribe("sdk-ws").await.unwrap();
        assert_eq!(c.unsubscribe("sdk-ws").await.unwrap_err().status(), Some(404));
    });
}

/// The consumer side of a crash: a broker killed (SIGKILL) and restarted mid-stream, twice, on
/// each I/O driver, under a publisher and an acking consumer. Every event the broker accepted
/// arrives; the consumer reconnects by itself and gets again at most what was unacknowledged
/// (its window on each shard, and what was acked in the instant before the kill).
#[test]
fn a_consumer_outlives_broker_crashes_and_loses_nothing() {
    for driver in ["epoll", "uring"] {
        crash_run(driver);
    }
}

fn crash_run(driver: &str) {
    let window = 16u32;
    let shards = 2;
    let mut b = TestBroker::start(&["--io-driver", driver, "--default-partitions", "4", "--durability", "os"]);
    let rt = runtime();
    let _inside = rt.enter();
    let c = Client::builder(url(&b)).backoff(quick()).build().unwrap();
    rt.block_on(c.subscribe(&Subscription::new("crash", "crash").start(Start::Earliest))).unwrap();
    let seen: Arc<Mutex<BTreeMap<String, usize>>> = Arc::default();
    let mut consumer = c.consumer("crash").window(window).start();
    let mut states = consumer.state();
    let transitions = Arc::new(Mutex::new(Vec::new()));
    let log = transitions.clone();
    rt.spawn(async move {
        while states.changed().await.is_ok() {
            let s = states.borrow_and_update().clone();
            log.lock().unwrap().push(s);
        }
    });
    let got = seen.clone();
    rt.spawn(async move {
        while let Some(d) = consumer.next().await {
            let d = d.expect("the consumer never gives up on a restart");
            *got.lock().unwrap().entry(d.event.id().to_owned()).or_default() += 1;
            d.ack();
        }
    });
    // The publisher retries each event until the broker accepts it (a 202 lost in the crash
    // means the event may be stored twice: counted apart from the consumer's duplicates).
    let accepted = Arc::new(Mutex::new(BTreeSet::new()));
    let retried = Arc::new(Mutex::new(0usize));
    let total = 3000;
    let publishing = {
        let (c, accepted, retried) = (c.clone(), accepted.clone(), retried.clone());
        rt.spawn(async move {
            for i in 0..total {
                let id = format!("e-{i}");
                loop {
                    match c.publish("crash", &ev(&id)).await {
                        Ok(_) => break,
                        Err(e) => {
                            assert!(e.is_transient() || e.status().is_none(), "{e}");
                            *retried.lock().unwrap() += 1;
                            tokio::time::sleep(Duration::from_millis(20)).await;
                        }
                    }
                }
                accepted.lock().unwrap().insert(id);
            }
        })
    };
    for round in 1..=2 {
        let at = round * total / 3;
        wait_for(Duration::from_secs(60), || (seen.lock().unwrap().len() >= at).then_some(()));
        b.restart_on_same_ports();
    }
    rt.block_on(publishing).unwrap();
    let accepted = accepted.lock().unwrap().clone();
    assert_eq!(accepted.len(), total);
    wait_for(Duration::from_secs(60), || {
        let s = seen.lock().unwrap();
        accepted.iter().all(|id| s.contains_key(id)).then_some(())
    });
    let s = seen.lock().unwrap();
    let extra: usize = s.values().map(|n| n - 1).sum();
    let retried = *retried.lock().unwrap();
    // Per crash: the window on each shard (delivered, not acked) plus the retried publishes.
    let bound = 2 * (window as usize * shards + 64) + retried;
    assert!(extra <= bound, "{driver}: {extra} duplicates, bound {bound}");
    let t = transitions.lock().unwrap();
    let reconnects = t
        .windows(2)
        .filter(|w| matches!(w[0], ConnectionState::Disconnected { .. }) && matches!(w[1], ConnectionState::Connecting))
        .count();
    assert!(reconnects >= 2, "{driver}: {t:?}");
    assert!(t.iter().any(|s| matches!(s, ConnectionState::Connected { .. })));
}

/// A token that expires mid-stream: the broker ends the session (1008 "token expired"), the
/// client asks its callback for a new token and attaches again where the offsets are.
#[test]
fn an_expiring_token_is_refreshed_and_the_stream_goes_on() {
    use jsonwebtoken::{encode, EncodingKey, Header};
    let dir = std::env::temp_dir().join(format!("evmesh-sdk-jwt-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let secret = b"an-hs256-secret-of-thirty-two-bytes!";
    let k = base64url(secret);
    let jwks = dir.join("jwks.json");
    std::fs::write(
        &jwks,
        serde_json::json!({"keys": [{"kty": "oct", "kid": "k1", "alg": "HS256", "k": k}]}).to_string(),
    )
    .unwrap();
    let config = dir.join("evmesh.toml");
    std::fs::write(
        &config,
        "[[acl]]\nid = \"svc\"\nprincipal = \"svc\"\nresource = \"topic:*\"\nactions = [\"PUBLISH\", \"SUBSCRIBE\"]\neffect = \"ALLOW\"\n\n\
         [[acl]]\nid = \"svc-sub\"\nprincipal = \"svc\"\nresource = \"subscription:*\"\nactions = [\"SUBSCRIBE\"]\neffect = \"ALLOW\"\n",
    )
    .unwrap();
    let b = TestBroker::start(&[
        "--config",
        config.to_str().unwrap(),
        "--auth",
        "jwt",
        "--jwt-jwks-file",
        jwks.to_str().unwrap(),
    ]);
    let minted = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let count = minted.clone();
    let lifetime = Duration::from_secs(2);
    let c = Client::builder(url(&b))
        .backoff(quick())
        .token_refresh_lead(Duration::from_millis(200))
        .token_refresh(move || {
            count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let exp = std::time::SystemTime::now() + lifetime;
            let secs = exp.duration_since(std::time::UNIX_EPOCH).unwrap().as_secs();
            let mut header = Header::new(jsonwebtoken::Algorithm::HS256);
            header.kid = Some("k1".into());
            let claims = serde_json::json!({"sub": "svc", "exp": secs});
            let t = encode(&header, &claims, &EncodingKey::from_secret(secret).unwrap()).unwrap();
            // Whole seconds on the wire: the client is told the truncated expiry.
            let at = std::time::UNIX_EPOCH + Duration::from_secs(secs);
            async move { Ok(Token::expiring(t, at)) }
        })
        .build()
        .unwrap();
    let rt = runtime();
    rt.block_on(async {
        // Without a token the broker says 401; this client never sends none.
        c.subscribe(&Subscription::new("jwt", "jwt").start(Start::Earliest)).await.unwrap();
        let mut consumer = c.consumer("jwt").window(8).start();
        let mut ended_for_expiry = consumer.state();
        let started = Instant::now();
        let mut want = BTreeSet::new();
        let mut i = 0;
        // Publish for three token lifetimes while consuming.
        let mut expiries = 0;
        let mut seen = BTreeSet::new();
        while started.elapsed() < lifetime * 3 || seen.len() < want.len() {
            if started.elapsed() < lifetime * 3 {
                let id = format!("j-{i}");
                c.publish("jwt", &ev(&id)).await.unwrap();
                want.insert(id);
                i += 1;
            }
            tokio::select! {
                d = consumer.next() => {
                    let d = d.unwrap().unwrap();
                    seen.insert(d.event.id().to_owned());
                    d.ack();
                }
                Ok(()) = ended_for_expiry.changed() => {
                    if let ConnectionState::Disconnected { reason, .. } = &*ended_for_expiry.borrow_and_update() {
                        assert!(reason.contains("1008 token expired"), "{reason}");
                        expiries += 1;
                    }
                }
                () = tokio::time::sleep(Duration::from_millis(20)) => {}
            }
            assert!(started.elapsed() < Duration::from_secs(60), "{} of {} within 60 s", seen.len(), want.len());
        }
        assert_eq!(seen, want);
        assert!(expiries >= 1, "the session outlived its token");
    });
    assert!(minted.load(std::sync::atomic::Ordering::SeqCst) >= 3);
    let _ = std::fs::remove_dir_all(&dir);
}

fn base64url(bytes: &[u8]) -> String {
    const A: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let n = chunk.iter().enumerate().fold(0u32, |n, (i, b)| n | u32::from(*b) << (16 - 8 * i));
        for i in 0..=chunk.len() {
            out.push(A[(n >> (18 - 6 * i) & 63) as usize] as char);
        }
    }
    out
}

/// A consumer that stops acknowledging holds exactly its window: the broker sends no more
/// until acks free room, so a slow consumer costs bounded memory on both sides.
#[test]
fn credit_bounds_what_a_slow_consumer_is_sent() {
    let b = TestBroker::start(&["--default-partitions", "4"]);
    let rt = runtime();
    rt.block_on(async {
        let c = Client::new(url(&b)).unwrap();
        c.subscribe(&Subscription::new("slow", "slow").mode(Mode::LoadBalance).start(Start::Earliest)).await.unwrap();
        let publisher = c.publisher("slow").await.unwrap();
        for i in 0..2000 {
            // Keys spread the events over every partition, so both shards hold some.
            let mut e = ev(&format!("s-{i}"));
            e.set_extension("partitionkey", format!("k{i}"));
            publisher.send(&e).await.unwrap();
        }
        publisher.flush().await.unwrap();
        let window = 8usize;
        let shards = 2;
        let mut consumer = c.consumer("slow").window(window as u32).start();
        let mut held = Vec::new();
        // Everything the window allows arrives...
        while held.len() < window * shards {
            held.push(tokio::time::timeout(Duration::from_secs(10), consumer.next()).await.unwrap().unwrap().unwrap());
        }
        // ...and nothing more while nothing is acked: a probe publish to every partition
        // would be sent at once if the broker were not holding to the window.
        let more = tokio::time::timeout(Duration::from_millis(500), consumer.next()).await;
        assert!(more.is_err(), "a delivery past the window: {:?}", more.map(|d| d.map(|d| d.map(|d| d.id))));
        // Acking one frees exactly one place.
        held.remove(0).ack();
        let next = tokio::time::timeout(Duration::from_secs(10), consumer.next()).await.unwrap().unwrap().unwrap();
        held.push(next);
        let again = tokio::time::timeout(Duration::from_millis(500), consumer.next()).await;
        assert!(again.is_err(), "one ack freed more than one place");
        for d in held.drain(..) {
            d.ack();
        }
        // Then the rest flows.
        let mut seen = 0;
        while seen < 2000 - window * shards - 1 {
            let d = tokio::time::timeout(Duration::from_secs(20), consumer.next()).await.unwrap().unwrap().unwrap();
            d.ack();
            seen += 1;
        }
    });
}

/// Request-reply through the SDK on both sides: a responder serving a subscription with
/// `Client::serve`, a requester with `Client::request`; no responder is a 504.
#[test]
fn request_reply_and_a_responder_that_serves_a_subscription() {
    let b = TestBroker::start(&[]);
    let rt = runtime();
    rt.block_on(async {
        let c = Client::new(url(&b)).unwrap();
        c.subscribe(&Subscription::new("pricing", "quotes").start(Start::Earliest)).await.unwrap();
        let responder = c.clone();
        let consumer = c.consumer("pricing").start();
        let serving = tokio::spawn(async move {
            responder
                .serve(consumer, |req: Event| async move {
                    let n = match req.data() {
                        Some(evmesh_client::cloudevents::Data::Json(v)) => v["n"].as_i64().unwrap_or(0),
                        _ => 0,
                    };
                    let answer = EventBuilderV10::new()
                        .id(format!("answer-{}", req.id()))
                        .source("/pricing")
                        .ty("com.example.price")
                        .data("application/json", serde_json::json!({ "double": n * 2 }))
                        .build()
                        .unwrap();
                    Some(answer)
                })
                .await
        });
        for n in 0..5 {
            let ask = EventBuilderV10::new()
                .id(format!("q-{n}"))
                .source("/shop")
                .ty("com.example.quote")
                .data("application/json", serde_json::json!({ "n": n }))
                .build()
                .unwrap();
            let reply = c.request("quotes", &ask, Duration::from_secs(10)).await.unwrap();
            assert_eq!(reply.id(), format!("answer-q-{n}"));
            let Some(evmesh_client::cloudevents::Data::Json(v)) = reply.data() else { panic!("{reply}") };
            assert_eq!(v["double"], n * 2);
        }
        let unanswered = c.request("nobody-listens", &ev("q-x"), Duration::from_millis(200)).await.unwrap_err();
        assert_eq!(unanswered.status(), Some(504), "{unanswered}");
        // A reply to something that is not a request is refused before it is sent.
        assert!(c.reply(&ev("plain"), ev("r")).await.is_err());
        serving.abort();
    });
}

/// Mode 1 through the SDK: an `Agent` attaches and answers each turn chunk by chunk; a client
/// opens a session and streams two turns; a cancelled turn ends with an error chunk.
#[test]
fn a_streaming_call_between_an_sdk_client_and_an_sdk_agent() {
    use evmesh_client::{Agent, AgentEvent, ChunkKind};
    let b = TestBroker::start(&[]);
    let rt = runtime();
    rt.block_on(async {
        let c = Client::new(url(&b)).unwrap();
        let mut agent = Agent::attach(&c, "echo", Duration::from_secs(5)).await.unwrap();
        let mut attached = agent.state();
        while !matches!(*attached.borrow_and_update(), ConnectionState::Connected { .. }) {
            attached.changed().await.unwrap();
        }
        let answering = tokio::spawn(async move {
            while let Some(ev) = agent.next().await {
                match ev.unwrap() {
                    AgentEvent::Turn(mut turn) => {
                        let prompt = turn.prompt();
                        if prompt == "wait" {
                            turn.chunk("waiting").unwrap();
                            continue; // never done: the client cancels
                        }
                        for w in prompt.split_whitespace() {
                            turn.chunk(w.to_uppercase()).unwrap();
                        }
                        turn.done(serde_json::Value::Null).unwrap();
                    }
                    AgentEvent::Cancel { session_id, .. } => assert!(session_id.starts_with("echo:")),
                    _ => {}
                }
            }
        });
        let session = c.streaming().open_session("me", Some("echo")).await.unwrap();
        assert_eq!(session.agent_id(), "echo");
        for prompt in ["hello there", "second turn"] {
            let chunks: Vec<_> = session.call(prompt).await.unwrap().map(|c| c.unwrap()).collect().await;
            let words: Vec<_> = chunks.iter().filter(|c| c.kind == ChunkKind::Chunk).map(|c| c.data.clone()).collect();
            let expected: Vec<String> = prompt.split_whitespace().map(str::to_uppercase).collect();
            assert_eq!(words, expected);
            assert_eq!(chunks.last().unwrap().kind, ChunkKind::Done);
        }
        let mut waiting = session.call("wait").await.unwrap();
        let first = waiting.next().await.unwrap().unwrap();
        assert_eq!((first.kind, first.data.as_str()), (ChunkKind::Chunk, "waiting"));
        session.cancel().await.unwrap();
        let last = waiting.next().await.unwrap().unwrap();
        assert_eq!((last.kind, last.data.as_str()), (ChunkKind::Error, "cancelled"));
        assert!(waiting.next().await.is_none());
        session.close().await.unwrap();
        assert_eq!(session.end_turn().await.unwrap_err().status(), Some(404));
        answering.abort();
    });
}

/// Mode 2 through the SDK: a session publisher and its subscriber, which replays from the
/// head and resumes after the last event it handed out when the broker restarts.
#[test]
fn session_pub_sub_replays_and_resumes_across_a_restart() {
    let mut b = TestBroker::start(&["--durability", "os"]);
    let rt = runtime();
    let _inside = rt.enter();
    let c = Client::builder(url(&b)).backoff(quick()).build().unwrap();
    let s = c.streaming();
    let publisher = s.session_publisher("chat-1");
    rt.block_on(async {
        for i in 0..3 {
            publisher.publish(&ev(&format!("m-{i}"))).await.unwrap();
        }
    });
    let mut sub = s.subscribe_session("chat-1");
    let mut ids = Vec::new();
    rt.block_on(async {
        while ids.len() < 3 {
            ids.push(sub.next().await.unwrap().unwrap().id().to_owned());
        }
    });
    b.restart_on_same_ports();
    rt.block_on(async {
        for i in 3..6 {
            publisher.publish(&ev(&format!("m-{i}"))).await.unwrap();
        }
        while ids.len() < 6 {
            let e = tokio::time::timeout(Duration::from_secs(30), sub.next()).await.unwrap().unwrap().unwrap();
            ids.push(e.id().to_owned());
        }
    });
    let want: Vec<String> = (0..6).map(|i| format!("m-{i}")).collect();
    assert_eq!(ids, want, "in order, nothing twice across the restart");
}

/// The crate's examples run as written against a broker (`EVMESH_URL`).
#[test]
#[ignore = "needs evmesh-client's examples built (cargo test --workspace, as scripts/test.sh runs it)"]
fn the_client_examples_run_as_written() {
    let b = TestBroker::start(&[]);
    let examples = std::env::current_exe().unwrap().parent().unwrap().parent().unwrap().join("examples");
    let quickstart = examples.join("quickstart");
    assert!(quickstart.exists(), "{} is not built", quickstart.display());
    let out = std::process::Command::new(&quickstart).env("EVMESH_URL", url(&b)).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}{}", String::from_utf8_lossy(&out.stderr));
    for n in 0..3 {
        assert!(text.contains(&format!("published order-{n} at")), "{text}");
        assert!(text.contains(&format!("received order-{n} (attempt 1)")), "{text}");
    }
}

/// Regression (a review found it): an SSE consumer offered `Last-Event-ID` after a session in
/// which it had nacked the last event, and the broker takes that id as an ack of the
/// partition up to it, so the nacked event was never delivered again.
#[test]
fn a_nacked_event_comes_again_after_an_sse_reconnect() {
    let mut b = TestBroker::start(&["--default-partitions", "1", "--durability", "os"]);
    let rt = runtime();
    let _inside = rt.enter();
    let c = Client::builder(url(&b)).backoff(quick()).build().unwrap();
    rt.block_on(c.subscribe(&Subscription::new("nacks", "nacks").start(Start::Earliest))).unwrap();
    rt.block_on(c.publish("nacks", &ev("n-1"))).unwrap();
    let mut consumer = c.consumer("nacks").transport(Transport::Sse).start();
    let first = rt.block_on(consumer.next()).unwrap().unwrap();
    assert_eq!((first.event.id(), first.attempt), ("n-1", 1));
    first.nack();
    // Whether or not the nack reached the broker before the crash, the event must come again.
    let mut state = consumer.state();
    b.restart_on_same_ports();
    rt.block_on(async {
        while !matches!(*state.borrow_and_update(), ConnectionState::Disconnected { .. }) {
            state.changed().await.unwrap();
        }
    });
    let again = rt.block_on(tokio::time::timeout(Duration::from_secs(30), consumer.next())).unwrap().unwrap().unwrap();
    assert_eq!(again.event.id(), "n-1", "the nacked event is delivered again");
    assert!(again.attempt >= 2);
    again.ack();
}

/// A contract gap the TypeScript client found: browsers could not read the broker's answers
/// from a page of another origin. Origins in `cors_allowed_origins` get preflights answered
/// and `Access-Control-Allow-Origin` on every answer; others, and non-browser callers, get
/// exactly what they got before.
#[test]
fn allowed_origins_get_cors_answers_and_others_do_not() {
    let b = TestBroker::start(&["--cors-allowed-origins", "http://app.example:3000, https://other.example"]);
    let ev = super::util::event("c-1").to_string();
    let pre = b.client().request(
        "OPTIONS",
        "/events/publish?topic=cors",
        &[
            ("origin", "http://app.example:3000"),
            ("access-control-request-method", "POST"),
            ("access-control-request-headers", "authorization, content-type, ce-id"),
        ],
        b"",
    );
    assert_eq!(pre.status, 204, "{}", pre.text());
    assert_eq!(pre.header("access-control-allow-origin"), Some("http://app.example:3000"));
    assert_eq!(pre.header("access-control-allow-headers"), Some("authorization, content-type, ce-id"));
    assert!(pre.header("access-control-allow-methods").is_some_and(|m| m.contains("POST")));
    // What a page asks for is echoed only when it is header names of a bounded length: anything
    // else (a quote, 3 KiB of names) gets the fixed list, never the client's bytes.
    for asked in ["x\"y", &"a,".repeat(1500)] {
        let odd = b.client().request(
            "OPTIONS",
            "/events/publish?topic=cors",
            &[
                ("origin", "http://app.example:3000"),
                ("access-control-request-method", "POST"),
                ("access-control-request-headers", asked),
            ],
            b"",
        );
        assert_eq!(odd.status, 204);
        assert_eq!(odd.header("access-control-allow-headers"), Some("authorization, content-type"), "{asked:.20}");
    }
    let post = |origin: Option<&str>| {
        let mut h = vec![("content-type", "application/cloudevents+json")];
        if let Some(o) = origin {
            h.push(("origin", o));
        }
        b.client().request("POST", "/events/publish?topic=cors", &h, ev.as_bytes())
    };
    let r = post(Some("http://app.example:3000"));
    assert_eq!(r.status, 202);
    assert_eq!(r.header("access-control-allow-origin"), Some("http://app.example:3000"));
    assert!(r.header("access-control-expose-headers").is_some_and(|h| h.contains("retry-after")));
    // A refusal is readable too (the page sees the problem, not an opaque failure).
    let bad = b.client().request(
        "POST",
        "/events/publish?topic=bad/topic",
        &[("content-type", "application/cloudevents+json"), ("origin", "https://other.example")],
        ev.as_bytes(),
    );
    assert_eq!((bad.status, bad.header("access-control-allow-origin")), (400, Some("https://other.example")));
    for origin in [Some("http://evil.example"), None] {
        let r = post(origin);
        assert_eq!(r.status, 202);
        assert_eq!(r.header("access-control-allow-origin"), None, "{origin:?}");
    }
    // An origin not allowed gets no preflight answer of its own (the route's 405).
    let denied = b.client().request(
        "OPTIONS",
        "/events/publish?topic=cors",
        &[("origin", "http://evil.example"), ("access-control-request-method", "POST")],
        b"",
    );
    assert_ne!(denied.status, 204);
    assert_eq!(denied.header("access-control-allow-origin"), None);
    // A value that is not an origin is refused at start.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_evmesh"))
        .args(["serve", "--cors-allowed-origins", "app.example/path", "--data-dir", "/nonexistent-cors"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("cors_allowed_origins"));
}

/// Regression (a review found it): acks were sent in one message however many there were, and
/// the broker refuses over 10,000 ids (closing the session), so a consumer with a wide window
/// on three shards could never acknowledge what it held. They now go in pieces.
#[test]
fn more_acks_than_one_message_may_carry_all_count() {
    let b = TestBroker::start(&["--shards", "3", "--default-partitions", "6", "--session-window-bytes", "16777216"]);
    let rt = runtime();
    rt.block_on(async {
        let c = Client::new(url(&b)).unwrap();
        c.subscribe(&Subscription::new("wide", "wide").start(Start::Earliest)).await.unwrap();
        let total = 12_000;
        for chunk in (0..total).collect::<Vec<_>>().chunks(500) {
            let events: Vec<Event> = chunk
                .iter()
                .map(|i| {
                    let mut e = ev(&format!("w-{i}"));
                    e.set_extension("partitionkey", format!("k{i}"));
                    e
                })
                .collect();
            c.publish_batch("wide", &events).await.unwrap();
        }
        let mut consumer = c.consumer("wide").window(4096).start();
        let mut held = Vec::new();
        while held.len() < total {
            held.push(tokio::time::timeout(Duration::from_secs(30), consumer.next()).await.unwrap().unwrap().unwrap());
        }
        // Every one acked at once: one batch of 12,000 ids on the consumer's side.
        for d in &held {
            d.ack();
        }
        consumer.close().await;
    });
    // Committed everywhere: nothing left for the subscription.
    wait_for(Duration::from_secs(30), || {
        let subs = b.admin().get("/admin/subscriptions").json();
        let lag: u64 = subs[0]["partitions"]
            .as_array()?
            .iter()
            .flat_map(|p| p["consumers"].as_array().cloned().unwrap_or_default())
            .map(|c| c["lag"].as_u64().unwrap_or(u64::MAX))
            .sum();
        (lag == 0).then_some(())
    });
}
