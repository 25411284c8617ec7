//! Our request-head parser against httparse on a typical publish request.

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use evmesh::http::{parse_head, parse_head_into, Limits, Status};
use std::hint::black_box;

const REQ: &[u8] = b"POST /events/publish?topic=orders HTTP/1.1\r\n\
Host: 127.0.0.1:8080\r\n\
User-Agent: evmesh-loadgen/0.1\r\n\
Accept: */*\r\n\
Content-Type: application/cloudevents+json\r\n\
Content-Length: 1024\r\n\
Connection: keep-alive\r\n\r\n";

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("publish_head");
    g.throughput(Throughput::Bytes(REQ.len() as u64));
    let limits = Limits::default();
    g.bench_function("evmesh", |b| {
        b.iter(|| match parse_head(black_box(REQ), &limits) {
            Ok(Status::Complete(h)) => black_box(h.len),
            other => panic!("{other:?}"),
        })
    });
    // As a connection parses: into the list the previous head handed back (no allocation).
    g.bench_function("evmesh_reused_list", |b| {
        let mut spare = Vec::with_capacity(16);
        b.iter(|| match parse_head_into(black_box(REQ), &limits, &mut spare) {
            Ok(Status::Complete(h)) => {
                let n = black_box(h.len);
                spare = h.headers;
                n
            }
            other => panic!("{other:?}"),
        })
    });
    g.bench_function("httparse", |b| {
        b.iter(|| {
            let mut headers = [httparse::EMPTY_HEADER; 32];
            let mut req = httparse::Request::new(&mut headers);
            match req.parse(black_box(REQ)) {
                Ok(httparse::Status::Complete(n)) => black_box(n),
                other => panic!("{other:?}"),
            }
        })
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
