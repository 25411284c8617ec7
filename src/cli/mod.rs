//! The command-line side: `evmesh pub` (a tiny blocking HTTP client for a first tour) and the
//! process's stop signals. Not used by the shards.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

fn flag<'a>(args: &'a [String], name: &str) -> Option<&'a str> {
    let mut it = args.iter();
    while let Some(a) = it.next() {
        if a == name {
            return it.next().map(String::as_str);
        }
        if let Some(v) = a.strip_prefix(name).and_then(|r| r.strip_prefix('=')) {
            return Some(v);
        }
    }
    None
}

fn new_id() -> String {
    let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    format!("{:x}-{:x}", t.as_nanos(), std::process::id())
}

/// `evmesh pub`: builds a structured CloudEvent from flags (or reads one from stdin), posts it,
/// prints the broker's answer. Errors are the broker's problem+json or the I/O failure.
pub fn publish(args: &[String]) -> Result<(), String> {
    const KNOWN: [&str; 8] =
        ["--url", "--topic", "--type", "--source", "--id", "--partition-key", "--data", "--data-text"];
    for a in args.iter().filter(|a| a.starts_with("--")) {
        let name = a.split('=').next().unwrap_or(a);
        if !KNOWN.contains(&name) {
            return Err(format!("unknown flag {name}"));
        }
    }
    let url = flag(args, "--url").unwrap_or("http://127.0.0.1:8080");
    let topic = flag(args, "--topic").ok_or("--topic is required")?;
    let hostport = url.strip_prefix("http://").ok_or("--url must be http://HOST:PORT")?.trim_end_matches('/');
    let event =
        if flag(args, "--type").is_some() || flag(args, "--data").is_some() || flag(args, "--data-text").is_some() {
            let mut ev = serde_json::json!({
                "specversion": "1.0",
                "id": flag(args, "--id").map(str::to_owned).unwrap_or_else(new_id),
                "source": flag(args, "--source").unwrap_or("/evmesh/cli"),
                "type": flag(args, "--type").unwrap_or("evmesh.cli"),
            });
            if let Some(k) = flag(args, "--partition-key") {
                ev["partitionkey"] = k.into();
            }
            if let Some(d) = flag(args, "--data") {
                ev["data"] = serde_json::from_str(d).map_err(|e| format!("--data is not JSON: {e}"))?;
                ev["datacontenttype"] = "application/json".into();
            } else if let Some(d) = flag(args, "--data-text") {
                ev["data"] = d.into();
                ev["datacontenttype"] = "text/plain".into();
            }
            ev.to_string()
        } else {
            let mut s = String::new();
            std::io::stdin().read_to_string(&mut s).map_err(|e| format!("stdin: {e}"))?;
            s
        };
    let mut stream = TcpStream::connect(hostport).map_err(|e| format!("connect {hostport}: {e}"))?;
    stream.set_read_timeout(Some(Duration::from_secs(30))).map_err(|e| e.to_string())?;
    let req = format!(
        "POST /events/publish?topic={topic} HTTP/1.1\r\nhost: {hostport}\r\ncontent-type: application/cloudevents+json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{event}",
        event.len()
    );
    stream.write_all(req.as_bytes()).map_err(|e| e.to_string())?;
    let mut resp = String::new();
    stream.read_to_string(&mut resp).map_err(|e| e.to_string())?;
    let (head, body) = resp.split_once("\r\n\r\n").ok_or("malformed response")?;
    let status = head.split(' ').nth(1).unwrap_or("?");
    println!("{body}");
    if status.starts_with('2') {
        Ok(())
    } else {
        Err(format!("HTTP {status}"))
    }
}

/// Blocks SIGINT and SIGTERM in this thread and every thread it spawns later.
pub fn block_stop_signals() -> libc::sigset_t {
    // SAFETY: plain libc calls on a local, zero-initialized sigset.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        set
    }
}

/// Waits for one of the blocked stop signals and returns its number.
pub fn wait_for_signal(set: &libc::sigset_t) -> i32 {
    let mut sig = 0;
    // SAFETY: `set` was filled by `block_stop_signals`; `sig` is a valid out pointer.
    unsafe {
        libc::sigwait(set, &mut sig);
    }
    sig
}
