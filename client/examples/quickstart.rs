//! Publish three events and consume them with acks: the README's first example.
//!
//! `cargo run -p evmesh-client --example quickstart` against a broker at `EVMESH_URL`
//! (default `http://127.0.0.1:8080`).

use cloudevents::{AttributesReader, EventBuilder, EventBuilderV10};
use evmesh_client::{Client, Start, Subscription};
use futures_util::StreamExt;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::var("EVMESH_URL").unwrap_or_else(|_| "http://127.0.0.1:8080".into());
    let client = Client::new(url)?;
    client.subscribe(&Subscription::new("quickstart", "orders").start(Start::Earliest)).await?;
    for n in 0..3 {
        let event = EventBuilderV10::new()
            .id(format!("order-{n}"))
            .source("/shop")
            .ty("com.shop.order")
            .data("application/json", serde_json::json!({ "n": n }))
            .build()?;
        let stored = client.publish("orders", &event).await?;
        println!("published order-{n} at {}/{}", stored.partition, stored.offset);
    }
    let mut consumer = client.consumer("quickstart").start();
    for _ in 0..3 {
        let delivery = consumer.next().await.expect("the consumer runs")?;
        println!("received {} (attempt {})", delivery.event.id(), delivery.attempt);
        delivery.ack();
    }
    consumer.close().await;
    Ok(())
}
