//! Throughput of the SDK against the raw protocol, for `perf/sdk.sh`:
//!
//! - `throughput publish URL TOPIC SECONDS CONNECTIONS IN_FLIGHT`: `Publisher`s over WebSocket,
//!   1 KiB structured events, closed loop; prints `{"events": N, "seconds": S}`.
//! - `throughput consume URL SUBSCRIPTION N WINDOW`: an SDK consumer acking each delivery until N
//!   arrived; prints the same.
//! - `throughput consume-raw URL SUBSCRIPTION N WINDOW`: the same over a bare WebSocket
//!   (tokio-tungstenite): attach with `credit=WINDOW`, find each `emdeliveryid` by search, ack
//!   every WINDOW/2 deliveries in one message. What the SDK costs is the difference.

use std::time::{Duration, Instant};

use cloudevents::{AttributesWriter, EventBuilder, EventBuilderV10};
use evmesh_client::Client;
use futures_util::{SinkExt, StreamExt};
use tokio_tungstenite::tungstenite::{client::IntoClientRequest, Message};

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let arg = |i: usize| args.get(i).cloned().ok_or("usage: see the file's header");
    let (events, took) = match arg(0)?.as_str() {
        "publish" => {
            let (url, topic, secs, conns, in_flight) =
                (arg(1)?, arg(2)?, arg(3)?.parse()?, arg(4)?.parse()?, arg(5)?.parse()?);
            publish(&url, &topic, Duration::from_secs_f64(secs), conns, in_flight).await?
        }
        "consume" => consume(&arg(1)?, &arg(2)?, arg(3)?.parse()?, arg(4)?.parse()?).await?,
        "consume-raw" => consume_raw(&arg(1)?, &arg(2)?, arg(3)?.parse()?, arg(4)?.parse()?).await?,
        other => return Err(format!("unknown mode {other}").into()),
    };
    println!("{{\"events\": {events}, \"seconds\": {:.3}}}", took.as_secs_f64());
    Ok(())
}

async fn publish(
    url: &str,
    topic: &str,
    run: Duration,
    conns: usize,
    in_flight: usize,
) -> Result<(u64, Duration), Box<dyn std::error::Error>> {
    let client = Client::new(url)?;
    let payload = "x".repeat(1024 - 120);
    let start = Instant::now();
    let mut tasks = Vec::new();
    for c in 0..conns {
        let publisher = client.publisher_with(topic, in_flight).await?;
        let mut event = EventBuilderV10::new()
            .id("x")
            .source("/perf")
            .ty("perf.sdk")
            .data("text/plain", payload.clone())
            .build()?;
        tasks.push(tokio::spawn(async move {
            let mut n = 0u64;
            let mut receipts = std::collections::VecDeque::new();
            while start.elapsed() < run {
                event.set_id(format!("c{c}-{n}"));
                receipts.push_back(publisher.send(&event).await.expect("sent"));
                if receipts.len() >= in_flight {
                    receipts.pop_front().expect("one").await.expect("stored");
                }
                n += 1;
            }
            for r in receipts {
                r.await.expect("stored");
            }
            n
        }));
    }
    let mut total = 0;
    for t in tasks {
        total += t.await?;
    }
    Ok((total, start.elapsed()))
}

async fn consume(url: &str, sub: &str, n: u64, window: u32) -> Result<(u64, Duration), Box<dyn std::error::Error>> {
    let client = Client::new(url)?;
    let mut consumer = client.consumer(sub).window(window).start();
    let mut got = 0;
    let mut start = None;
    while got < n {
        let d = consumer.next().await.ok_or("ended")??;
        start.get_or_insert_with(Instant::now);
        d.ack();
        got += 1;
    }
    let took = start.map_or(Duration::ZERO, |s| s.elapsed());
    consumer.close().await;
    Ok((got, took))
}

async fn consume_raw(url: &str, sub: &str, n: u64, window: u32) -> Result<(u64, Duration), Box<dyn std::error::Error>> {
    let ws_url = format!("{}/events/ws?subscription={sub}&credit={window}", url.replacen("http", "ws", 1));
    let mut req = ws_url.into_client_request()?;
    req.headers_mut().insert("sec-websocket-protocol", "cloudevents.json".parse()?);
    let (mut ws, _) = tokio_tungstenite::connect_async(req).await?;
    let mut got = 0;
    let mut start = None;
    let mut ids: Vec<String> = Vec::new();
    while got < n {
        let msg = ws.next().await.ok_or("closed")??;
        start.get_or_insert_with(Instant::now);
        if let Message::Text(t) = msg {
            if let Some(id) = delivery_id(t.as_str()) {
                ids.push(id.to_owned());
                got += 1;
            }
        }
        if ids.len() as u32 >= window / 2 || got == n {
            let ack = serde_json::json!({ "type": "ack", "ids": ids }).to_string();
            ws.send(Message::text(ack)).await?;
            ids.clear();
        }
    }
    let took = start.map_or(Duration::ZERO, |s| s.elapsed());
    Ok((got, took))
}

fn delivery_id(text: &str) -> Option<&str> {
    let at = text.find("\"emdeliveryid\":\"")? + "\"emdeliveryid\":\"".len();
    let end = text[at..].find('"')?;
    Some(&text[at..at + end])
}
