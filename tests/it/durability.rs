//! What was acknowledged survives: restarts, kill -9 under load, and every durability level.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use serde_json::json;

use super::util::{event, Client, TestBroker};

#[test]
fn restart_keeps_topics_and_continues_offsets() {
    for durability in ["os", "fsync"] {
        let mut b = TestBroker::start(&["--durability", durability, "--default-partitions", "1"]);
        for i in 0..5 {
            assert_eq!(b.publish("r", &event(&format!("{i}"))).json()["offset"], i);
        }
        b.restart();
        assert_eq!(b.publish("r", &event("5")).json()["offset"], 5, "{durability}");
        let ids: Vec<String> =
            b.events("r", 0).into_iter().map(|(_, e)| e["id"].as_str().unwrap().to_string()).collect();
        assert_eq!(ids, ["0", "1", "2", "3", "4", "5"], "{durability}");
    }
}

/// A power loss can leave the last batch of a segment half written: after a restart the broker
/// serves whole events only (a prefix of what was published), and publishing goes on at the cut
/// with dense offsets. Cut at several points of the last batch.
#[test]
fn a_torn_tail_segment_is_cut_on_restart_and_publishing_goes_on() {
    for cut in [1usize, 30, 200] {
        let mut b = TestBroker::start(&["--default-partitions", "1"]);
        for i in 0..20 {
            assert_eq!(b.publish("torn", &event(&format!("e{i}"))).json()["offset"], i);
        }
        b.kill9();
        let part = b.dir.join("segments").join("t.torn").join("0");
        let tail = std::fs::read_dir(&part)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|x| x == "log"))
            .max()
            .expect("a segment file");
        let len = std::fs::metadata(&tail).unwrap().len();
        std::fs::OpenOptions::new().write(true).open(&tail).unwrap().set_len(len - cut as u64).unwrap();
        b.restart();
        let ids: Vec<String> =
            b.events("torn", 0).into_iter().map(|(_, e)| e["id"].as_str().unwrap().to_string()).collect();
        let want: Vec<String> = (0..19).map(|i| format!("e{i}")).collect();
        assert_eq!(ids, want, "cut {cut}: the torn last event is gone, every other one is whole");
        assert_eq!(b.publish("torn", &event("after")).json()["offset"], 19, "cut {cut}: offsets go on at the cut");
    }
}

#[test]
fn a_data_dir_is_reopened_only_with_its_shard_count() {
    let mut b = TestBroker::start(&["--shards", "2"]);
    assert_eq!(b.publish("x", &event("1")).status, 202);
    b.kill9();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_evmesh"))
        .args(["serve", "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0", "--shards", "3", "--data-dir"])
        .arg(&b.dir)
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("shards = 2"));
}

/// kill -9 while eight connections publish; after a restart every event that got a 202 is at
/// its offset, and nothing is stored that no client sent. On both I/O drivers, with durability
/// `os` (the batch written) and `fsync` (group commit), and with small segments so rolls happen
/// under the kill too.
#[test]
fn kill9_under_load_loses_nothing_acknowledged() {
    kill9_under_load(&["--io-driver", "uring", "--durability", "os"]);
}

#[test]
fn kill9_under_load_loses_nothing_acknowledged_on_epoll_with_fsync() {
    kill9_under_load(&["--io-driver", "epoll", "--durability", "fsync"]);
}

fn kill9_under_load(flags: &[&str]) {
    let mut args = vec!["--default-partitions", "4", "--segment-bytes", "65536"];
    args.extend_from_slice(flags);
    let mut b = TestBroker::start(&args);
    let acked: Mutex<Vec<(u32, u64, String)>> = Mutex::new(Vec::new());
    let sent: Mutex<HashSet<String>> = Mutex::new(HashSet::new());
    let stop = AtomicBool::new(false);
    let addr = b.traffic;
    std::thread::scope(|s| {
        for t in 0..8 {
            let (acked, sent, stop) = (&acked, &sent, &stop);
            s.spawn(move || {
                let mut c = Client::connect(addr);
                for n in 0..100_000 {
                    if stop.load(Ordering::Relaxed) {
                        return;
                    }
                    let id = format!("w{t}-{n}");
                    let mut e = event(&id);
                    if t % 2 == 0 {
                        e["partitionkey"] = json!(format!("k{}", n % 7));
                    }
                    sent.lock().unwrap().insert(id.clone());
                    c.send_raw(&super::util::request_bytes(
                        "POST",
                        "/events/publish?topic=crash",
                        &[("content-type", "application/cloudevents+json")],
                        e.to_string().as_bytes(),
                    ));
                    match c.read_response() {
                        Some(r) if r.status == 202 => {
                            let v = r.json();
                            acked.lock().unwrap().push((
                                v["partition"].as_u64().unwrap() as u32,
                                v["offset"].as_u64().unwrap(),
                                id,
                            ));
                        }
                        _ => return,
                    }
                }
            });
        }
        // Kill once a good amount has been acknowledged, with requests still in flight.
        super::util::wait_for(std::time::Duration::from_secs(60), || {
            (acked.lock().unwrap().len() >= 2000).then_some(())
        });
        b.kill9();
        stop.store(true, Ordering::Relaxed);
    });
    b.restart();
    let acked = acked.into_inner().unwrap();
    let sent = sent.into_inner().unwrap();
    let mut stored: HashMap<(u32, u64), String> = HashMap::new();
    for p in 0..4 {
        for (o, e) in b.events("crash", p) {
            let id = e["id"].as_str().unwrap().to_string();
            assert!(sent.contains(&id), "{id} at {p}/{o} was never sent");
            stored.insert((p, o), id);
        }
    }
    for (p, o, id) in &acked {
        assert_eq!(stored.get(&(*p, *o)), Some(id), "acknowledged {id} missing at {p}/{o}");
    }
    assert!(acked.len() >= 2000);
}
