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
/// with dense offsets. Cut at several points of the last batch, written through the page cache
/// and with O_DIRECT (`direct_io`, where the file goes on with zeros and blocks allocated ahead).
#[test]
fn a_torn_tail_segment_is_cut_on_restart_and_publishing_goes_on() {
    for (cut, direct) in [(1usize, "false"), (30, "false"), (200, "false"), (1, "true"), (200, "true")] {
        let mut b = TestBroker::start(&["--default-partitions", "1", "--io-driver", "uring", "--direct-io", direct]);
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
        // The last batch ends at the last byte that is not zero (its header's magic is not):
        // with direct writes the file goes on with zeros past it.
        let bytes = std::fs::read(&tail).unwrap();
        let end = bytes.iter().rposition(|&b| b != 0).expect("batches") + 1;
        std::fs::OpenOptions::new().write(true).open(&tail).unwrap().set_len((end - cut) as u64).unwrap();
        b.restart();
        let ids: Vec<String> =
            b.events("torn", 0).into_iter().map(|(_, e)| e["id"].as_str().unwrap().to_string()).collect();
        let want: Vec<String> = (0..19).map(|i| format!("e{i}")).collect();
        assert_eq!(ids, want, "cut {cut}, direct {direct}: the torn last event is gone, every other one is whole");
        assert_eq!(
            b.publish("torn", &event("after")).json()["offset"],
            19,
            "cut {cut}, direct {direct}: offsets go on"
        );
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

/// kill -9 under load with segments written with O_DIRECT through io_uring (`direct_io`), at
/// durability `os` (the 202 after the device has the write) and `fsync` (the sync after it).
#[test]
fn kill9_under_load_loses_nothing_acknowledged_with_direct_writes() {
    kill9_under_load(&["--io-driver", "uring", "--durability", "os", "--direct-io", "true"]);
    kill9_under_load(&["--io-driver", "uring", "--durability", "fsync", "--direct-io", "true"]);
}

/// With `direct_io = true`, segment writes bypass the page cache on io_uring shards: whole
/// blocks written with O_DIRECT, so the tail's file is whole blocks with zeros past its last
/// batch. Not by default, not on epoll shards, not at durability `memory`: those write through
/// the page cache, and the file ends at its last batch. Every way reads back the same events,
/// also after a restart.
#[test]
fn segments_are_written_with_o_direct_on_io_uring_shards_only() {
    let takes_o_direct = {
        let probe = std::env::temp_dir().join(format!("evmesh-o-direct-{}", std::process::id()));
        let ok = std::os::unix::fs::OpenOptionsExt::custom_flags(
            std::fs::OpenOptions::new().write(true).create(true),
            libc::O_DIRECT,
        )
        .open(&probe)
        .is_ok();
        let _ = std::fs::remove_file(&probe);
        ok
    };
    let cases: [(&[&str], bool); 4] = [
        (&["--io-driver", "uring", "--direct-io", "true"], takes_o_direct),
        (&["--io-driver", "uring"], false),
        (&["--io-driver", "epoll", "--direct-io", "true"], false),
        (&["--io-driver", "uring", "--durability", "memory", "--direct-io", "true"], false),
    ];
    for (flags, direct) in cases {
        let mut args = vec!["--default-partitions", "1"];
        args.extend_from_slice(flags);
        let mut b = TestBroker::start(&args);
        let mut want = Vec::new();
        for i in 0..7 {
            let id = format!("d{i}");
            let mut e = event(&id);
            e["data"] = json!("x".repeat(900 * i));
            assert_eq!(b.publish("direct", &e).json()["offset"], i as u64, "{flags:?}");
            want.push(id);
        }
        let ids = |b: &TestBroker| -> Vec<String> {
            b.events("direct", 0).into_iter().map(|(_, e)| e["id"].as_str().unwrap().to_string()).collect()
        };
        assert_eq!(ids(&b), want, "{flags:?}");
        let tail = b.dir.join("segments").join("t.direct").join("0").join(format!("{:020}.log", 0));
        // Batch by batch (magic, then the total length at bytes 8..12) to the end of the last.
        let bytes = std::fs::read(&tail).unwrap();
        let mut end = 0;
        while bytes.get(end..end + 4) == Some(b"EMSB") {
            end += u32::from_le_bytes(bytes[end + 8..end + 12].try_into().unwrap()) as usize;
        }
        assert!(end > 0 && end <= bytes.len(), "{flags:?}");
        if direct {
            assert_eq!(bytes.len() % 4096, 0, "{flags:?}: whole blocks");
            assert!(bytes.len() > end && bytes[end..].iter().all(|&b| b == 0), "{flags:?}: zeros past the end");
        } else {
            assert_eq!(bytes.len(), end, "{flags:?}: the file ends at its last batch");
        }
        if !flags.contains(&"memory") {
            b.restart();
            assert_eq!(ids(&b), want, "{flags:?}: after a restart");
        }
    }
}
