//! The client's tests against loopback servers: resolution, pooled and fresh connections,
//! whole and streamed answers, and the errors of slow, oversized and broken ones.

use std::net::SocketAddr;
use std::time::Duration;

use super::*;

#[test]
fn names_are_resolved_off_the_thread() {
    run(async {
        // `localhost` as a name the resolver looks up (parse takes it as 127.0.0.1).
        let u = Url { ip: None, ..Url::parse("http://localhost:7/").unwrap() };
        let a = u.resolve(Duration::from_secs(5)).await.unwrap();
        assert!(a.ip().is_loopback() && a.port() == 7, "{a}");
        let u = Url::parse("http://no-such-host.invalid/").unwrap();
        assert!(matches!(
            u.resolve(Duration::from_secs(5)).await,
            Err(ClientError::Connect(_) | ClientError::TimedOut(_))
        ));
    });
}

/// A loopback server answering each request on a connection with `answers` in turn (one
/// per read of a whole request), recording what it got and how many connections it saw.
fn server(answers: Vec<&'static [u8]>) -> (SocketAddr, std::sync::mpsc::Receiver<(usize, Vec<u8>)>) {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut answers = answers.into_iter();
        for (n, conn) in listener.incoming().enumerate() {
            let Ok(mut conn) = conn else { return };
            loop {
                let mut got = vec![0u8; 4096];
                let Ok(k) = conn.read(&mut got) else { break };
                if k == 0 {
                    break;
                }
                got.truncate(k);
                let _ = tx.send((n, got));
                let Some(a) = answers.next() else { return };
                if a.is_empty() {
                    break; // close without answering
                }
                conn.write_all(a).unwrap();
            }
        }
    });
    (addr, rx)
}

/// Where a URL with an address is.
fn at(u: &Url) -> SocketAddr {
    SocketAddr::new(u.ip.unwrap(), u.port)
}

fn run<F: std::future::Future>(f: F) -> F::Output {
    monoio::RuntimeBuilder::<monoio::LegacyDriver>::new().enable_timer().build().unwrap().block_on(f)
}

#[test]
fn answers_are_read_whole_and_connections_reused() {
    let (addr, got) = server(vec![
        b"HTTP/1.1 200 OK\r\ncontent-length: 13\r\n\r\n{\"retCode\":0}",
        b"HTTP/1.1 429 Slow down\r\nretry-after: 2\r\ntransfer-encoding: chunked\r\n\r\n4\r\nbusy\r\n0\r\n\r\n",
        b"HTTP/1.1 204 No Content\r\nconnection: close\r\n\r\n",
    ]);
    let url = Url::parse(&format!("http://{addr}/hook")).unwrap();
    let pool = Pool::new(4, 1024, None);
    let t = Duration::from_secs(5);
    run(async {
        let a = pool.send(&url, at(&url), "POST", &[("x-em-delivery-id", "d1")], b"hello", t).await.unwrap();
        assert_eq!((a.status, a.body.as_slice()), (200, &b"{\"retCode\":0}"[..]));
        let a = pool.send(&url, at(&url), "POST", &[], b"again", t).await.unwrap();
        assert_eq!((a.status, a.header("Retry-After"), a.body.as_slice()), (429, Some("2"), &b"busy"[..]));
        let a = pool.send(&url, at(&url), "POST", &[], b"third", t).await.unwrap();
        assert_eq!(a.status, 204);
    });
    let seen: Vec<(usize, Vec<u8>)> = got.try_iter().collect();
    // One connection for all three: the keep-alive answers returned it to the pool.
    assert_eq!(seen.iter().map(|(n, _)| *n).collect::<Vec<_>>(), [0, 0, 0]);
    let first = String::from_utf8_lossy(&seen[0].1);
    assert!(first.starts_with("POST /hook HTTP/1.1\r\nhost: 127.0.0.1:"), "{first}");
    assert!(first.contains("x-em-delivery-id: d1\r\n") && first.ends_with("content-length: 5\r\n\r\nhello"), "{first}");
}

#[test]
fn a_pooled_connection_the_server_closed_is_replaced_once() {
    // The first connection answers once, then closes on the next request unanswered.
    let (addr, got) = server(vec![
        b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n",
        b"",
        b"HTTP/1.1 202 OK\r\ncontent-length: 0\r\n\r\n",
    ]);
    let url = Url::parse(&format!("http://{addr}/")).unwrap();
    let pool = Pool::new(4, 1024, None);
    run(async {
        assert_eq!(pool.send(&url, at(&url), "POST", &[], b"1", Duration::from_secs(5)).await.unwrap().status, 200);
        assert_eq!(pool.send(&url, at(&url), "POST", &[], b"2", Duration::from_secs(5)).await.unwrap().status, 202);
    });
    let seen: Vec<(usize, Vec<u8>)> = got.try_iter().collect();
    assert_eq!(seen.iter().map(|(n, _)| *n).collect::<Vec<_>>(), [0, 0, 1]);
    // The retry sends the whole request again (the write handed it back).
    assert_eq!(seen[2].1, seen[1].1);
    assert!(seen[2].1.ends_with(b"content-length: 1\r\n\r\n2"), "{:?}", String::from_utf8_lossy(&seen[2].1));
}

/// A streamed answer comes piece by piece as it is written (chunked or by length), and one
/// framed by the close is held to the bound like the others.
#[test]
fn streamed_answers_come_as_written_and_are_held_to_the_bound() {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let (step_tx, step_rx) = std::sync::mpsc::channel::<()>();
    std::thread::spawn(move || {
        // 1: chunked, its second chunk only once the client took the first.
        let (mut c, _) = listener.accept().unwrap();
        let _ = c.read(&mut [0u8; 4096]);
        c.write_all(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nfirst\r\n").unwrap();
        step_rx.recv().unwrap();
        c.write_all(b"6\r\nsecond\r\n0\r\n\r\n").unwrap();
        // 2: by length. 3: until the close, over the bound.
        for answer in
            [&b"HTTP/1.1 200 OK\r\ncontent-length: 4\r\n\r\nfour"[..], b"HTTP/1.0 200 OK\r\n\r\n0123456789abcdefXYZ"]
        {
            let (mut c, _) = listener.accept().unwrap();
            let _ = c.read(&mut [0u8; 4096]);
            c.write_all(answer).unwrap();
        }
    });
    let url = Url::parse(&format!("http://{addr}/")).unwrap();
    let pool = Pool::new(0, 16, None);
    let t = Duration::from_secs(5);
    run(async {
        let mut s = pool.stream(&url, addr, &[], b"{}", t).await.unwrap();
        assert_eq!(s.next().await.unwrap().as_deref(), Some(&b"first"[..]), "before the rest was written");
        step_tx.send(()).unwrap();
        assert_eq!(s.next().await.unwrap().as_deref(), Some(&b"second"[..]));
        assert_eq!(s.next().await.unwrap(), None);
        let mut s = pool.stream(&url, addr, &[], b"{}", t).await.unwrap();
        assert_eq!((s.next().await.unwrap().as_deref(), s.next().await.unwrap()), (Some(&b"four"[..]), None));
        let mut s = pool.stream(&url, addr, &[], b"{}", t).await.unwrap();
        let mut got = Ok(Some(Vec::new()));
        while let Ok(Some(_)) = got {
            got = s.next().await;
        }
        assert_eq!(got, Err(ClientError::TooLarge(16)));
    });
}

/// A server that answers one request with `answer` and closes the connection.
fn answer_and_close(answer: &'static [u8]) -> SocketAddr {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        let (mut conn, _) = listener.accept().unwrap();
        let _ = conn.read(&mut [0u8; 4096]);
        conn.write_all(answer).unwrap();
    });
    addr
}

#[test]
fn bodies_framed_by_the_close_are_read_to_it_and_cut_ones_are_errors() {
    let ok = answer_and_close(b"HTTP/1.1 200 OK\r\n\r\nuntil the end");
    let cut = answer_and_close(b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nshort");
    let big = answer_and_close(b"HTTP/1.0 200 OK\r\n\r\n0123456789abcdefXYZ");
    let pool = Pool::new(4, 16, None);
    let t = Duration::from_secs(5);
    run(async {
        let url = |a: SocketAddr| Url::parse(&format!("http://{a}/")).unwrap();
        let a = pool.send(&url(ok), at(&url(ok)), "POST", &[], b"x", t).await.unwrap();
        assert_eq!(a.body, b"until the end");
        assert_eq!(pool.send(&url(cut), at(&url(cut)), "POST", &[], b"x", t).await, Err(ClientError::Closed));
        assert_eq!(pool.send(&url(big), at(&url(big)), "POST", &[], b"x", t).await, Err(ClientError::TooLarge(16)));
        // None of them went back to the pool.
        assert!(pool.idle.borrow().values().all(Vec::is_empty));
    });
}

#[test]
fn slow_oversized_and_broken_answers_are_errors() {
    let t = Duration::from_millis(300);
    let pool = Pool::new(4, 16, None);
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let broken: Vec<(SocketAddr, ClientError)> = [
        (&b"HTTP/1.1 200 OK\r\ncontent-length: 17\r\n\r\n"[..], ClientError::TooLarge(16)),
        (b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n11\r\n", ClientError::TooLarge(16)),
        (b"HTTP/1.1 2x0 OK\r\n\r\n", ClientError::Protocol("malformed status line")),
    ]
    .into_iter()
    .map(|(answer, want)| (server(vec![answer]).0, want))
    .collect();
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    // One runtime for all (the deadline sweep is the thread's first runtime's).
    run(async {
        // Nobody answers: the deadline.
        let url = Url::parse(&format!("http://{}/", silent.local_addr().unwrap())).unwrap();
        assert_eq!(pool.send(&url, at(&url), "POST", &[], b"x", t).await, Err(ClientError::TimedOut(t)));
        // A body over the bound, declared or chunked, and a broken head.
        for (addr, want) in broken {
            let url = Url::parse(&format!("http://{addr}/")).unwrap();
            assert_eq!(pool.send(&url, at(&url), "POST", &[], b"x", t).await, Err(want));
        }
        // Nothing listens.
        let url = Url::parse(&format!("http://127.0.0.1:{closed}/")).unwrap();
        assert!(matches!(pool.send(&url, at(&url), "POST", &[], b"x", t).await, Err(ClientError::Connect(_))));
    });
}
