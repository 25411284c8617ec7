//! Encode + validated access of a 1 KiB CloudEvent as an EventMeshFrame, against serde_json to
//! and from bytes of the same event (what a JSON-framed design would pay per hop).

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use frame_codec::{AttrValue, Attribute, DataKind, Frame, FrameBody, FrameHeader};
use serde::{Deserialize, Serialize};
use std::hint::black_box;

#[derive(Serialize, Deserialize)]
struct JsonEvent {
    specversion: String,
    id: String,
    source: String,
    #[serde(rename = "type")]
    ty: String,
    datacontenttype: String,
    time: String,
    partitionkey: String,
    data: String,
}

fn data() -> String {
    "x".repeat(1024 - 200)
}

fn body() -> FrameBody {
    let a = |n: &str, v: &str| Attribute { name: n.into(), value: AttrValue::Str(v.into()) };
    FrameBody {
        topic: "orders".into(),
        attributes: vec![
            a("specversion", "1.0"),
            a("id", "4f6c5a2e-9b1d-4c3e-8a7f-2d1e0b9c8a7f"),
            a("source", "/bench/publisher"),
            a("type", "com.example.order.created"),
            a("datacontenttype", "text/plain"),
            a("time", "2026-11-30T12:00:00Z"),
            a("partitionkey", "customer-42"),
        ],
        data: data().into_bytes(),
    }
}

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("event_1k");
    g.throughput(Throughput::Elements(1));
    let b = body();
    let h = FrameHeader::event(DataKind::Text);
    g.bench_function("frame_encode_then_validated_access", |bench| {
        bench.iter(|| {
            let f = Frame::encode(black_box(&h), black_box(&b)).unwrap();
            let back = Frame::decode(f.as_bytes()).unwrap();
            black_box(back.body().attr_str("id").map(str::len))
        })
    });
    let bytes = Frame::encode(&h, &b).unwrap().as_bytes().to_vec();
    g.bench_function("frame_validated_access", |bench| {
        bench.iter(|| black_box(Frame::decode(black_box(&bytes)).unwrap().body().data.len()))
    });
    let ev = JsonEvent {
        specversion: "1.0".into(),
        id: "4f6c5a2e-9b1d-4c3e-8a7f-2d1e0b9c8a7f".into(),
        source: "/bench/publisher".into(),
        ty: "com.example.order.created".into(),
        datacontenttype: "text/plain".into(),
        time: "2026-11-30T12:00:00Z".into(),
        partitionkey: "customer-42".into(),
        data: data(),
    };
    g.bench_function("serde_json_to_then_from_bytes", |bench| {
        bench.iter(|| {
            let v = serde_json::to_vec(black_box(&ev)).unwrap();
            let back: JsonEvent = serde_json::from_slice(&v).unwrap();
            black_box(back.id.len())
        })
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
