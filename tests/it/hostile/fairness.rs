//! One client's cheap requests must not hold its shard: on the epoll driver a read whose
//! socket is ready completes at once, so a client that always has more pipelined requests
//! waiting kept the connection loop running and every other client of the shard got no answer
//! at all (found by perf/hostile.sh). Both drivers, one shard, a bystander publishing.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::super::util::{event, wait_for, TestBroker};

fn a_pipelining_client_does_not_starve_a_bystander(driver: &str) {
    let b = TestBroker::start(&["--shards", "1", "--io-driver", driver]);
    let stop = Arc::new(AtomicBool::new(false));
    let answered = Arc::new(AtomicUsize::new(0));
    let mut attacker = TcpStream::connect(b.traffic).unwrap();
    let mut drain = attacker.try_clone().unwrap();
    let reader = {
        let (stop, answered) = (stop.clone(), answered.clone());
        std::thread::spawn(move || {
            let mut sink = vec![0u8; 1 << 16];
            drain.set_read_timeout(Some(Duration::from_millis(200))).unwrap();
            while !stop.load(Ordering::Relaxed) {
                if let Ok(n) = drain.read(&mut sink) {
                    answered.fetch_add(n, Ordering::Relaxed);
                }
            }
        })
    };
    let writer = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let burst = "GET /nowhere HTTP/1.1\r\nhost: x\r\n\r\n".repeat(256);
            let start = Instant::now();
            while !stop.load(Ordering::Relaxed) && start.elapsed() < Duration::from_secs(30) {
                if attacker.write_all(burst.as_bytes()).is_err() {
                    return;
                }
            }
        })
    };
    // Once the attack is being answered, publish beside it: each answer must come (the bug:
    // none came while the attack lasted). The bound is generous; the failure was total.
    wait_for(Duration::from_secs(10), || (answered.load(Ordering::Relaxed) > 1 << 20).then_some(()));
    let mut c = b.client();
    let mut slowest = Duration::ZERO;
    for i in 0..20 {
        let t = Instant::now();
        let r = c.post(
            "/events/publish?topic=v",
            "application/cloudevents+json",
            event(&format!("v{i}")).to_string().as_bytes(),
        );
        assert_eq!(r.status, 202, "{}", r.text());
        slowest = slowest.max(t.elapsed());
    }
    stop.store(true, Ordering::Relaxed);
    writer.join().unwrap();
    reader.join().unwrap();
    assert!(slowest < Duration::from_secs(5), "{driver}: a bystander's publish took {slowest:?}");
}

#[test]
fn a_pipelining_client_does_not_starve_a_bystander_on_epoll() {
    a_pipelining_client_does_not_starve_a_bystander("epoll");
}

#[test]
fn a_pipelining_client_does_not_starve_a_bystander_on_io_uring() {
    a_pipelining_client_does_not_starve_a_bystander("uring");
}
