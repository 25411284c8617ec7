//! A dead shard is a dead process, and the write path that once killed a shard under WebSocket
//! fan-out (partial vectored writes on io_uring) delivers the byte stream exactly.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use serde_json::json;

use super::super::util::{event, wait_for, TestBroker};

#[test]
fn a_panicking_shard_ends_the_process_with_a_non_zero_status() {
    let mut b = TestBroker::start_env(&[], &[("EVMESH_TEST_FAULT", "panic-shard-1")]);
    let status = wait_for(Duration::from_secs(20), || b.exited());
    assert_eq!(status.code(), Some(101), "{status:?}");
}

#[test]
fn readyz_is_200_while_every_shard_turns() {
    let b = TestBroker::start(&[]);
    let r = b.admin().get("/readyz");
    assert_eq!(r.status, 200, "{}", r.text());
}

/// Reads one WebSocket frame (server frames are unmasked) from a blocking reader.
fn read_frame(r: &mut impl Read) -> (u8, Vec<u8>) {
    let mut h = [0u8; 2];
    r.read_exact(&mut h).unwrap();
    let len = match h[1] & 0x7f {
        126 => {
            let mut l = [0u8; 2];
            r.read_exact(&mut l).unwrap();
            u16::from_be_bytes(l) as usize
        }
        127 => {
            let mut l = [0u8; 8];
            r.read_exact(&mut l).unwrap();
            u64::from_be_bytes(l) as usize
        }
        n => n as usize,
    };
    assert_eq!(h[1] & 0x80, 0, "server frames are not masked");
    let mut payload = vec![0; len];
    r.read_exact(&mut payload).unwrap();
    (h[0], payload)
}

/// A slow reader with a tiny receive buffer forces the broker's vectored writes to be partial
/// over and over; every frame must still arrive whole, in order, without a byte repeated or
/// lost (monoio's own write_vectored_all resent the start of a partly written buffer, then
/// panicked the shard).
fn partial_writes_keep_the_stream_exact(driver: &str) {
    let b = TestBroker::start(&["--io-driver", driver, "--default-partitions", "1", "--session-window", "1024"]);
    let def = json!({"subscription": "pw", "topic": "pw", "start": "earliest"});
    assert_eq!(b.client().post("/events/subscribe", "application/json", def.to_string().as_bytes()).status, 201);
    // Sizes that straddle every boundary: many events of uneven size, all in the log before the
    // session attaches, so they go out in large batches.
    let n = 400;
    let mut c = b.client();
    for i in 0..n {
        let mut e = event(&format!("e{i}"));
        e["data"] = json!("x".repeat(100 + (i * 997) % 3000));
        let r = c.post("/events/publish?topic=pw", "application/cloudevents+json", e.to_string().as_bytes());
        assert_eq!(r.status, 202, "{}", r.text());
    }
    let sock = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    sock.set_recv_buffer_size(8192).unwrap();
    sock.connect(&b.traffic.into()).unwrap();
    let mut stream: TcpStream = sock.into();
    stream.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    // A handshake read byte by byte, so every frame after the 101 stays in the socket for us.
    let req = "GET /events/ws?subscription=pw HTTP/1.1\r\nhost: t\r\nupgrade: websocket\r\nconnection: upgrade\r\n\
         sec-websocket-version: 13\r\nsec-websocket-key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n";
    stream.write_all(req.as_bytes()).unwrap();
    let mut head = Vec::new();
    while !head.ends_with(b"\r\n\r\n") {
        let mut byte = [0u8];
        stream.read_exact(&mut byte).unwrap();
        head.push(byte[0]);
    }
    assert!(head.starts_with(b"HTTP/1.1 101"), "{}", String::from_utf8_lossy(&head));
    for i in 0..n {
        // Read slowly at first so the broker's socket buffer fills and its writes come up short.
        if i < 20 {
            std::thread::sleep(Duration::from_millis(20));
        }
        let (mut op, mut payload) = read_frame(&mut stream);
        while op == 0x89 {
            (op, payload) = read_frame(&mut stream); // a keepalive ping, between whole frames
        }
        assert_eq!(op, 0x81, "event {i}: a final text frame");
        let v: serde_json::Value = serde_json::from_slice(&payload).unwrap_or_else(|e| panic!("event {i}: {e}"));
        assert_eq!(v["id"], format!("e{i}"));
        assert_eq!(v["data"].as_str().unwrap().len(), 100 + (i * 997) % 3000);
    }
    assert_eq!(b.admin().get("/readyz").status, 200);
}

#[test]
fn partial_vectored_writes_on_epoll_keep_the_stream_exact() {
    partial_writes_keep_the_stream_exact("epoll");
}

#[test]
fn partial_vectored_writes_on_io_uring_keep_the_stream_exact() {
    partial_writes_keep_the_stream_exact("uring");
}

/// Subscribers that vanish mid-stream (a reset, no close frame) under a steady fan-out. The
/// broker stays ready, every vanished subscriber's connection is let go (its session's writer
/// task ends, so the open-connection gauge falls back to the bystanders), and each bystander
/// gets every event, in order.
fn vanishing_subscribers_under_fan_out(driver: &str) {
    use super::super::delivery::{attach, keyed, next_event, read_ids, Ws};
    use super::super::request::metric;
    let b = TestBroker::start(&["--io-driver", driver]);
    let def = json!({"subscription": "vanish", "topic": "vanish", "mode": "BROADCAST"});
    assert_eq!(b.client().post("/events/subscribe", "application/json", def.to_string().as_bytes()).status, 201);
    let mut bystanders: Vec<Ws> = (0..6).map(|_| attach(&b, "subscription=vanish&ack=none")).collect();
    let mut vanishing: Vec<Ws> = (0..24).map(|_| attach(&b, "subscription=vanish&ack=none")).collect();
    // Interest reaches the partition's owner asynchronously: markers until every client has one.
    let mut seen = vec![false; bystanders.len() + vanishing.len()];
    for round in 0.. {
        assert!(round < 400, "the sessions never attached: {seen:?}");
        assert_eq!(b.publish("vanish", &keyed(&format!("marker-{round}"), "one")).status, 202);
        for (ws, s) in bystanders.iter_mut().chain(vanishing.iter_mut()).zip(seen.iter_mut()) {
            while next_event(ws).is_some() {
                *s = true;
            }
        }
        if seen.iter().all(|&s| s) {
            break;
        }
    }
    let open = || metric(&b, "evmesh_connections_open", "");
    let n = 300;
    let publisher = {
        let b = &b;
        move || {
            for i in 0..n {
                assert_eq!(b.publish("vanish", &keyed(&format!("e{i}"), "one")).status, 202);
                std::thread::sleep(Duration::from_millis(1));
            }
        }
    };
    std::thread::scope(|s| {
        let publishing = s.spawn(publisher);
        // A third of the way in, the vanishing ones reset their connections.
        std::thread::sleep(Duration::from_millis(100));
        for ws in vanishing.drain(..) {
            let sock = socket2::SockRef::from(ws.get_ref());
            sock.set_linger(Some(Duration::ZERO)).unwrap();
        }
        publishing.join().unwrap();
    });
    for ws in bystanders.iter_mut() {
        assert_eq!(
            read_ids(ws, n),
            (0..n).map(|i| format!("e{i}")).collect::<Vec<_>>(),
            "{driver}: every event, in order"
        );
    }
    // Only the bystanders' connections are left (the publisher's and the scrapes' are closed).
    wait_for(Duration::from_secs(20), || (open() == bystanders.len() as u64).then_some(()));
    let r = b.admin().get("/readyz");
    assert_eq!(r.status, 200, "{driver}: {}", r.text());
}

#[test]
fn vanishing_subscribers_under_fan_out_on_epoll() {
    vanishing_subscribers_under_fan_out("epoll");
}

#[test]
fn vanishing_subscribers_under_fan_out_on_io_uring() {
    vanishing_subscribers_under_fan_out("uring");
}
