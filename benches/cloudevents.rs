//! JSON parsing for the CloudEvents adaptor: serde_json (what the adaptor uses) against
//! simd-json, on one ~350 B event and on a 100-event batch, plus the adaptor end to end
//! (parse + validate + frame encode). The numbers decide which parser serves which mode;
//! see perf/RESULTS.md.

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use evmesh::adaptor::cloudevents::{parse_batch, parse_structured};
use std::hint::black_box;

const EVENT: &str = r#"{"specversion":"1.0","id":"4f6c5a2e-9b1d-4c3e-8a7f-2d1e0b9c8a7f","source":"/bench/publisher","type":"com.example.order.created","time":"2026-11-30T12:00:00Z","datacontenttype":"application/json","partitionkey":"customer-42","amount":120,"data":{"sku":"A-1","qty":2,"price":19.99,"tags":["new","promo"],"note":"ship fast"}}"#;

fn bench(c: &mut Criterion) {
    let batch = format!("[{}]", vec![EVENT; 100].join(","));
    for (name, input) in [("single_350b", EVENT.to_string()), ("batch_100", batch)] {
        let mut g = c.benchmark_group(format!("json_{name}"));
        g.throughput(Throughput::Bytes(input.len() as u64));
        g.bench_function("serde_json_value", |b| {
            b.iter(|| black_box(serde_json::from_str::<serde_json::Value>(black_box(&input)).unwrap()))
        });
        g.bench_function("simd_json_borrowed_value", |b| {
            b.iter(|| {
                // simd-json parses in place, so every parse pays for a copy of the input first.
                let mut copy = input.as_bytes().to_vec();
                black_box(
                    simd_json::to_borrowed_value(&mut copy)
                        .map(|v| matches!(v, simd_json::BorrowedValue::Array(_)))
                        .unwrap(),
                )
            })
        });
        if name == "single_350b" {
            g.bench_function("adaptor_parse_structured", |b| {
                b.iter(|| black_box(parse_structured("t", black_box(input.as_bytes())).unwrap()))
            });
        } else {
            g.bench_function("adaptor_parse_batch", |b| {
                b.iter(|| black_box(parse_batch("t", black_box(input.as_bytes())).unwrap().len()))
            });
        }
        g.finish();
    }
}

/// The 1 KiB event the perf scripts publish (string `data`, no escapes): what the flat pass
/// (`adaptor::flat`) takes, alone and in a batch of 10 (perf/batch_publish.sh's batch).
fn bench_flat(c: &mut Criterion) {
    let event = format!(
        r#"{{"specversion":"1.0","id":"i","source":"/perf","type":"perf.event","data":"{}"}}"#,
        "x".repeat(900)
    );
    let batch = format!("[{}]", [event.as_str(); 10].join(","));
    let mut g = c.benchmark_group("json_flat_1k");
    g.throughput(Throughput::Bytes(event.len() as u64));
    g.bench_function("adaptor_parse_structured", |b| {
        b.iter(|| black_box(parse_structured("t", black_box(event.as_bytes())).unwrap()))
    });
    g.finish();
    let mut g = c.benchmark_group("json_flat_1k_batch_10");
    g.throughput(Throughput::Bytes(batch.len() as u64));
    g.bench_function("adaptor_parse_batch", |b| {
        b.iter(|| black_box(parse_batch("t", black_box(batch.as_bytes())).unwrap().len()))
    });
    g.finish();
}

criterion_group!(benches, bench, bench_flat);
criterion_main!(benches);
