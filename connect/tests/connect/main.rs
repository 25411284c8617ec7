//! evmesh-connect against a real evmesh: both binaries started on loopback with ephemeral
//! ports, real files, real RocksDB, kill -9 in the middle.
//!
//! The broker's binary is the workspace's (`evmesh`, beside `evmesh-connect` in the target
//! directory): `cargo test --workspace` builds both before running any test.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

fn evmesh_bin() -> PathBuf {
    let me = PathBuf::from(env!("CARGO_BIN_EXE_evmesh-connect"));
    let bin = me.with_file_name("evmesh");
    assert!(bin.exists(), "{} is missing: build the broker too (cargo test --workspace does)", bin.display());
    bin
}

fn temp(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("evmesh-connect-it-{tag}-{}-{}", std::process::id(), fastrand()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// A test's connector files, the connector's data and the files it reads and writes: removed
/// when the test ends, passed or not.
struct Dirs {
    cfg: PathBuf,
    data: PathBuf,
    files: PathBuf,
}

impl Dirs {
    fn new() -> Dirs {
        Dirs { cfg: temp("cfg"), data: temp("data"), files: temp("files") }
    }

    /// The guard and its three paths, for a test to use by name.
    fn with_paths() -> (Dirs, PathBuf, PathBuf, PathBuf) {
        let d = Dirs::new();
        let (cfg, data, files) = (d.cfg.clone(), d.data.clone(), d.files.clone());
        (d, cfg, data, files)
    }
}

impl Drop for Dirs {
    fn drop(&mut self) {
        for d in [&self.cfg, &self.data, &self.files] {
            let _ = std::fs::remove_dir_all(d);
        }
    }
}

fn fastrand() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(0);
    h.finish()
}

/// Waits for `f` to give something, at most `limit`.
fn wait_for<T>(limit: Duration, mut f: impl FnMut() -> Option<T>) -> T {
    let until = Instant::now() + limit;
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < until, "not within {limit:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A process that prints one ready line with `key=ADDR` fields on stdout.
fn spawn_ready(mut cmd: Command, keys: &[&str]) -> (Child, Vec<SocketAddr>) {
    let mut child = cmd.stdout(Stdio::piped()).stderr(Stdio::inherit()).spawn().expect("spawn");
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).expect("a ready line");
    let addrs = keys
        .iter()
        .map(|k| {
            line.split_whitespace()
                .find_map(|w| w.strip_prefix(k))
                .unwrap_or_else(|| panic!("no {k} in {line:?}"))
                .parse()
                .unwrap()
        })
        .collect();
    (child, addrs)
}

struct Broker {
    child: Option<Child>,
    args: Vec<String>,
    dir: PathBuf,
    traffic: SocketAddr,
    admin: SocketAddr,
}

impl Broker {
    fn start() -> Broker {
        Broker::start_with(&[])
    }

    fn start_with(args: &[&str]) -> Broker {
        let (dir, args) = (temp("broker"), args.iter().map(|a| a.to_string()).collect());
        let (traffic, admin) = ("127.0.0.1:0".parse().unwrap(), "127.0.0.1:0".parse().unwrap());
        let mut b = Broker { child: None, args, dir, traffic, admin };
        b.spawn();
        b
    }

    fn spawn(&mut self) {
        let mut cmd = Command::new(evmesh_bin());
        cmd.arg("serve")
            .args(["--listen", &self.traffic.to_string(), "--admin-listen", &self.admin.to_string(), "--shards", "2"])
            .arg("--data-dir")
            .arg(&self.dir)
            .args(&self.args);
        let (child, a) = spawn_ready(cmd, &["traffic=", "admin="]);
        (self.child, self.traffic, self.admin) = (Some(child), a[0], a[1]);
    }

    /// kill -9, and up again on the same ports and data (as a supervisor would).
    fn crash_and_restart(&mut self) {
        if let Some(mut c) = self.child.take() {
            c.kill().unwrap();
            c.wait().unwrap();
        }
        self.spawn();
    }

    fn url(&self) -> String {
        format!("http://{}", self.traffic)
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The connector process, over a config dir and a data dir that outlive it.
struct Connect {
    child: Option<Child>,
    /// `EVMESH_CONNECT_TEST_FAULT` for the next start (then cleared).
    fault: Option<String>,
    evmesh: String,
    config: PathBuf,
    data: PathBuf,
    admin: SocketAddr,
    /// More environment for the process (its `EVMESH_CONNECT_*` settings).
    env: Vec<(String, String)>,
}

impl Connect {
    fn start(evmesh: String, config: PathBuf, data: PathBuf) -> Connect {
        Connect::start_with_env(evmesh, config, data, &[])
    }

    fn start_with_env(evmesh: String, config: PathBuf, data: PathBuf, env: &[(&str, &str)]) -> Connect {
        let env = env.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        let mut c =
            Connect { child: None, fault: None, evmesh, config, data, admin: "127.0.0.1:0".parse().unwrap(), env };
        c.spawn();
        c
    }

    /// Started without waiting for `/readyz` (a connector that cannot start yet keeps it 503).
    fn start_ready_or_not(evmesh: String, config: PathBuf, data: PathBuf) -> Connect {
        Connect::start_with_fault(evmesh, config, data, "none:0")
    }

    /// Started with `EVMESH_CONNECT_TEST_FAULT=fault` (not waited for: it may abort first).
    fn start_with_fault(evmesh: String, config: PathBuf, data: PathBuf, fault: &str) -> Connect {
        let admin = "127.0.0.1:0".parse().unwrap();
        let mut c =
            Connect { child: None, fault: Some(fault.to_owned()), evmesh, config, data, admin, env: Vec::new() };
        c.spawn();
        c
    }

    fn spawn(&mut self) {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_evmesh-connect"));
        cmd.args(["--evmesh", &self.evmesh, "--admin-listen", "127.0.0.1:0"])
            .arg("--config-dir")
            .arg(&self.config)
            .arg("--data-dir")
            .arg(&self.data);
        cmd.envs(self.env.iter().map(|(k, v)| (k, v)));
        let fault = self.fault.take();
        if let Some(f) = &fault {
            cmd.env("EVMESH_CONNECT_TEST_FAULT", f);
        }
        let (child, a) = spawn_ready(cmd, &["admin="]);
        (self.child, self.admin) = (Some(child), a[0]);
        if fault.is_none() {
            wait_for(Duration::from_secs(20), || (http(self.admin, "GET", "/readyz", None).0 == 200).then_some(()));
        }
    }

    /// Waits for the process to end by itself (an injected fault: SIGABRT, as kill -9 leaves it).
    fn aborted(&mut self) {
        use std::os::unix::process::ExitStatusExt;
        let child = self.child.as_mut().expect("running");
        let status = wait_for(Duration::from_secs(30), || child.try_wait().unwrap());
        assert_eq!(status.signal(), Some(6), "{status:?}");
        self.child = None;
    }

    fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            c.kill().unwrap();
            c.wait().unwrap();
        }
    }

    fn restart_after_kill9(&mut self) {
        self.kill9();
        self.spawn();
    }

    fn get(&self, path: &str) -> (u16, Value) {
        let (s, _, b) = http(self.admin, "GET", path, None);
        (s, serde_json::from_slice(&b).unwrap_or(Value::Null))
    }

    /// One of a connector's counts (`GET /connectors/{name}`), 0 before it has any.
    fn count(&self, name: &str, key: &str) -> u64 {
        self.get(&format!("/connectors/{name}")).1["counts"][key].as_u64().unwrap_or(0)
    }

    /// Waits until the connector `name` retried (its far side away) at least once.
    fn retried(&self, name: &str) {
        wait_for(Duration::from_secs(30), || (self.count(name, "retried") >= 1).then_some(()));
    }

    fn call(&self, method: &str, path: &str, body: Option<&Value>) -> (u16, BTreeMap<String, String>, Value) {
        let body = body.map(|b| b.to_string());
        let (s, h, b) = http(self.admin, method, path, body.as_deref().map(str::as_bytes));
        (s, h, serde_json::from_slice(&b).unwrap_or(Value::Null))
    }
}

impl Drop for Connect {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// One HTTP/1.1 exchange on a new connection: status, headers (lower-case), body.
fn http(addr: SocketAddr, method: &str, path: &str, body: Option<&[u8]>) -> (u16, BTreeMap<String, String>, Vec<u8>) {
    http_as(addr, method, path, body, "application/json")
}

fn http_as(
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: Option<&[u8]>,
    content_type: &str,
) -> (u16, BTreeMap<String, String>, Vec<u8>) {
    let Ok(mut s) = TcpStream::connect(addr) else { return (0, BTreeMap::new(), Vec::new()) };
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let body = body.unwrap_or_default();
    let head = format!(
        "{method} {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\ncontent-type: {content_type}\r\ncontent-length: {}\r\n\r\n",
        body.len()
    );
    if s.write_all(head.as_bytes()).and_then(|()| s.write_all(body)).is_err() {
        return (0, BTreeMap::new(), Vec::new());
    }
    let mut all = Vec::new();
    let _ = s.read_to_end(&mut all);
    let Some(split) = all.windows(4).position(|w| w == b"\r\n\r\n") else { return (0, BTreeMap::new(), Vec::new()) };
    let head = String::from_utf8_lossy(&all[..split]).into_owned();
    let mut lines = head.split("\r\n");
    let status = lines.next().and_then(|l| l.split_whitespace().nth(1)).and_then(|c| c.parse().ok()).unwrap_or(0);
    let headers: BTreeMap<String, String> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    let mut rest = all[split + 4..].to_vec();
    if headers.get("transfer-encoding").is_some_and(|t| t.contains("chunked")) {
        rest = unchunk(&rest);
    }
    (status, headers, rest)
}

fn unchunk(mut b: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    while let Some(i) = b.windows(2).position(|w| w == b"\r\n") {
        let n = usize::from_str_radix(std::str::from_utf8(&b[..i]).unwrap().trim(), 16).unwrap();
        if n == 0 {
            break;
        }
        out.extend_from_slice(&b[i + 2..i + 2 + n]);
        b = &b[i + 4 + n..];
    }
    out
}

fn publish(broker: &Broker, topic: &str, event: &Value) {
    let path = format!("/events/publish?topic={topic}");
    let (s, _, b) =
        http_as(broker.traffic, "POST", &path, Some(event.to_string().as_bytes()), "application/cloudevents+json");
    assert_eq!(s, 202, "{}", String::from_utf8_lossy(&b));
}

fn write_connector(dir: &Path, file: &str, text: &str) {
    std::fs::write(dir.join(file), text).unwrap();
}

/// A file sink `name` of `subscription` (of `topic`) writing to `path`, in `cfg`.
fn file_sink(cfg: &Path, name: &str, topic: &str, subscription: &str, path: &Path) {
    let text = format!(
        "name = {name:?}\nkind = \"sink\"\nconnector = \"file\"\ntopic = {topic:?}\nsubscription = {subscription:?}\n[config]\npath = {:?}\n",
        path.display().to_string()
    );
    write_connector(cfg, &format!("{name}.toml"), &text);
}

fn append(path: &Path, lines: impl IntoIterator<Item = String>) {
    let mut f = std::fs::OpenOptions::new().create(true).append(true).open(path).unwrap();
    for l in lines {
        f.write_all(format!("{l}\n").as_bytes()).unwrap();
    }
}

/// The events a file sink wrote, as JSON.
fn written(path: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    text.lines().map(|l| serde_json::from_str(l).expect("each line one JSON event")).collect()
}

/// The `data` of each line event written, counted.
fn counted(path: &Path) -> BTreeMap<String, usize> {
    let mut m = BTreeMap::new();
    for e in written(path) {
        *m.entry(e["data"].as_str().unwrap_or_default().to_owned()).or_default() += 1;
    }
    m
}

/// A file source into `orders` and a file sink of it, in `cfg`.
fn pipeline(cfg: &Path, files: &Path) -> (PathBuf, PathBuf) {
    let (input, output) = (files.join("in.jsonl"), files.join("out.jsonl"));
    write_connector(
        cfg,
        "in.toml",
        &format!(
            "name = \"in\"\nkind = \"source\"\nconnector = \"file\"\ntopic = \"orders\"\nbatch = 50\n[config]\npath = {:?}\n",
            input.display().to_string()
        ),
    );
    write_connector(
        cfg,
        "out.toml",
        &format!(
            "name = \"out\"\nkind = \"sink\"\nconnector = \"file\"\ntopic = \"orders\"\nsubscription = \"to-file\"\nbatch = 50\n[config]\npath = {:?}\n",
            output.display().to_string()
        ),
    );
    (input, output)
}

fn lines(range: std::ops::Range<usize>) -> impl Iterator<Item = String> {
    range.map(|i| format!("line-{i}"))
}

/// Every `line-i` of `range` written exactly once.
fn exactly_once(output: &Path, range: std::ops::Range<usize>) {
    let n = range.len();
    let seen = wait_for(Duration::from_secs(60), || {
        let c = counted(output);
        (range.clone().all(|i| c.contains_key(&format!("line-{i}")))).then_some(c)
    });
    let twice: Vec<_> = seen.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "written twice: {twice:?}");
    assert_eq!(seen.len(), n, "nothing else written");
}

#[test]
fn file_to_evmesh_to_file_exactly_once_through_kill_9_rotation_and_a_broker_crash() {
    let mut broker = Broker::start();
    let (_dirs, cfg, data, files) = Dirs::with_paths();
    let (input, output) = pipeline(&cfg, &files);
    let mut connect = Connect::start(broker.url(), cfg.clone(), data.clone());
    // Lines keep coming while both processes are killed: 2,000 in chunks, the file rotated
    // half-way (renamed away, ten more lines written to the old one, then a new one made).
    let (from, rotated) = (input.clone(), files.join("in.jsonl.1"));
    let writer = std::thread::spawn(move || {
        for chunk in 0..100 {
            if chunk == 50 {
                std::fs::rename(&from, &rotated).unwrap();
                append(&rotated, (0..10).map(|i| format!("late-{i}")));
            }
            append(&from, lines(chunk * 20..chunk * 20 + 20));
            std::thread::sleep(Duration::from_millis(5));
        }
    });
    let at_least = |n: usize| wait_for(Duration::from_secs(60), || (counted(&output).len() >= n).then_some(()));
    at_least(200);
    connect.restart_after_kill9();
    at_least(700);
    broker.crash_and_restart();
    at_least(1200);
    connect.kill9();
    connect.restart_after_kill9();
    writer.join().unwrap();
    let seen = wait_for(Duration::from_secs(60), || {
        let c = counted(&output);
        (c.len() >= 2010).then_some(c)
    });
    let twice: Vec<_> = seen.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "written twice: {twice:?}");
    let want: std::collections::BTreeSet<String> = lines(0..2000).chain((0..10).map(|i| format!("late-{i}"))).collect();
    assert_eq!(seen.keys().cloned().collect::<std::collections::BTreeSet<_>>(), want, "each line, nothing else");
    // A plain line's id is its file's inode and byte offset: the same on every re-read.
    let ids: std::collections::HashSet<String> =
        written(&output).iter().map(|e| e["id"].as_str().unwrap().to_owned()).collect();
    assert_eq!(ids.len(), 2010, "distinct ids");
    assert!(written(&output).iter().all(|e| e["source"] == json!(format!("file://{}", input.display()))));
    assert!(
        written(&output).iter().all(|e| e.get("emdeliveryid").is_none() && e["connectposition"].is_string()),
        "the delivery's extensions are not the event's; the source's position is"
    );
    let (s, status) = connect.get("/connectors/in");
    assert_eq!((s, status["state"].as_str()), (200, Some("running")));
    let end = std::fs::metadata(&input).unwrap().len();
    wait_for(Duration::from_secs(10), || {
        (connect.get("/connectors/in").1["position"]["offset"] == json!(end)).then_some(())
    });
}

#[test]
fn a_crash_in_each_window_loses_nothing_and_writes_nothing_twice() {
    for point in ["source-published", "sink-flushed", "file-sink-synced", "file-sink-torn"] {
        let broker = Broker::start();
        let (_dirs, cfg, data, files) = Dirs::with_paths();
        let (input, output) = pipeline(&cfg, &files);
        append(&input, lines(0..200));
        let mut connect = Connect::start_with_fault(broker.url(), cfg.clone(), data.clone(), &format!("{point}:2"));
        connect.aborted();
        append(&input, lines(200..300));
        connect.spawn();
        exactly_once(&output, 0..300);
    }
}

#[test]
fn a_poison_event_goes_to_the_dead_letter_topic_and_the_stream_continues() {
    let broker = Broker::start();
    let (_dirs, cfg, data, files) = Dirs::with_paths();
    let (output, dead) = (files.join("out.jsonl"), files.join("dead.jsonl"));
    write_connector(
        &cfg,
        "out.toml",
        &format!(
            "name = \"out\"\nkind = \"sink\"\nconnector = \"file\"\ntopic = \"pay\"\nsubscription = \"pay-file\"\n[config]\npath = {:?}\nmax_line_bytes = 400\n",
            output.display().to_string()
        ),
    );
    // The dead letters, written out by a second sink.
    file_sink(&cfg, "dead", "pay.dlq", "dead-file", &dead);
    let connect = Connect::start(broker.url(), cfg.clone(), data.clone());
    let event =
        |id: &str, data: &str| json!({"specversion": "1.0", "id": id, "source": "/pay", "type": "t", "data": data});
    for i in 0..3 {
        publish(&broker, "pay", &event(&format!("a{i}"), "small"));
    }
    publish(&broker, "pay", &event("poison", &"x".repeat(1000)));
    for i in 0..3 {
        publish(&broker, "pay", &event(&format!("b{i}"), "small"));
    }
    let ids = |p: &Path| -> Vec<String> { written(p).iter().map(|e| e["id"].as_str().unwrap().to_owned()).collect() };
    let got = wait_for(Duration::from_secs(30), || {
        let mut got = ids(&output);
        got.sort();
        (got.len() >= 6).then_some(got)
    });
    assert_eq!(got, ["a0", "a1", "a2", "b0", "b1", "b2"]);
    let dl = wait_for(Duration::from_secs(30), || written(&dead).into_iter().next());
    assert_eq!(dl["id"], "poison");
    assert!(dl["connecterror"].as_str().unwrap().contains("max_line_bytes"), "{dl}");
    assert_eq!(dl["connectname"], "out");
    assert_eq!(connect.get("/connectors/out").1["counts"]["dlq"], 1);
    let (_, h, metrics) = http(connect.admin, "GET", "/metrics", None);
    let metrics = String::from_utf8(metrics).unwrap();
    assert!(h["content-type"].starts_with("text/plain"), "{h:?}");
    assert!(metrics.contains("evmesh_connect_records_dlq_total{connector=\"out\"} 1"), "{metrics}");
}

#[test]
fn the_admin_api_lists_pauses_resumes_and_resets_a_source() {
    let broker = Broker::start();
    let (_dirs, cfg, data, files) = Dirs::with_paths();
    let (input, output) = pipeline(&cfg, &files);
    append(&input, lines(0..10));
    let connect = Connect::start(broker.url(), cfg.clone(), data.clone());
    exactly_once(&output, 0..10);
    let (s, all) = connect.get("/connectors");
    assert_eq!(s, 200);
    let names: Vec<&str> = all.as_array().unwrap().iter().map(|c| c["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["in", "out"]);
    assert_eq!(all[1]["subscription"], "to-file");
    // Refusals: problem+json, 405 with Allow, 409 while running and for a sink.
    let (s, h, p) = connect.call("GET", "/connectors/nope", None);
    assert_eq!((s, h["content-type"].as_str(), p["status"].as_u64()), (404, "application/problem+json", Some(404)));
    let (s, h, _) = connect.call("GET", "/connectors/in/pause", None);
    assert_eq!((s, h["allow"].as_str()), (405, "POST"));
    let (s, _, p) = connect.call("PUT", "/connectors/in/position", Some(&json!({"position": null})));
    assert_eq!(s, 409, "{p}");
    let (s, _, _) = connect.call("PUT", "/connectors/out/position", Some(&json!({"position": null})));
    assert_eq!(s, 409);
    // Paused: nothing is read; the position is reset to the start; resumed: all read again,
    // and the sink writes nothing twice.
    let (s, _, st) = connect.call("POST", "/connectors/in/pause", None);
    assert_eq!((s, st["state"].as_str()), (200, Some("paused")));
    let (s, _, p) = connect.call("PUT", "/connectors/in/position", Some(&json!({"oops": 1})));
    assert_eq!(s, 400, "{p}");
    let (s, _, st) = connect.call("PUT", "/connectors/in/position", Some(&json!({"position": null})));
    assert_eq!((s, &st["position"]), (200, &Value::Null), "{st}");
    append(&input, lines(10..20));
    let (s, _, st) = connect.call("POST", "/connectors/in/resume", None);
    assert_eq!((s, st["state"].as_str()), (200, Some("running")));
    exactly_once(&output, 0..20);
    // Read twice from the start: 10 + 20 published this run.
    wait_for(Duration::from_secs(20), || (connect.get("/connectors/in").1["counts"]["published"] == 30).then_some(()));
    let (s, _, st) = connect.call("POST", "/connectors/out/restart", None);
    assert_eq!((s, st["state"].as_str()), (200, Some("running")));
    append(&input, lines(20..25));
    exactly_once(&output, 0..25);
}

#[test]
fn a_sinks_lag_comes_from_evmeshs_admin_listener_and_a_sources_from_its_far_side() {
    let broker = Broker::start();
    let (_dirs, cfg, data, files) = Dirs::with_paths();
    let (input, output) = pipeline(&cfg, &files);
    let admin = format!("http://{}", broker.admin);
    let connect =
        Connect::start_with_env(broker.url(), cfg.clone(), data.clone(), &[("EVMESH_CONNECT_EVMESH_ADMIN", &admin)]);
    append(&input, lines(0..50));
    exactly_once(&output, 0..50);
    let lag = |name: &str| connect.get(&format!("/connectors/{name}")).1["lag"].clone();
    wait_for(Duration::from_secs(30), || (lag("in") == json!({"bytes": 0})).then_some(()));
    wait_for(Duration::from_secs(30), || (lag("out") == json!({"records": 0})).then_some(()));
    // The sink paused: what the source publishes meanwhile is its lag.
    assert_eq!(connect.call("POST", "/connectors/out/pause", None).2["state"], "paused");
    append(&input, lines(50..55));
    wait_for(Duration::from_secs(30), || (lag("out") == json!({"records": 5})).then_some(()));
    connect.call("POST", "/connectors/out/resume", None);
    exactly_once(&output, 0..55);
    wait_for(Duration::from_secs(30), || (lag("out") == json!({"records": 0})).then_some(()));
}

#[test]
fn a_bad_connector_file_stops_the_start_with_its_name() {
    let (_dirs, cfg, data, _) = Dirs::with_paths();
    // Exit code 2 and what stderr said, for the files in `cfg` now.
    let start = || {
        let out = Command::new(env!("CARGO_BIN_EXE_evmesh-connect"))
            .args(["--evmesh", "http://127.0.0.1:9", "--admin-listen", "127.0.0.1:0"])
            .arg("--config-dir")
            .arg(&cfg)
            .arg("--data-dir")
            .arg(&data)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2));
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    write_connector(&cfg, "bad.toml", "name = \"x\"\nkind = \"sink\"\nconnector = \"file\"\ntopic = \"t\"\n");
    let err = start();
    assert!(err.contains("bad.toml") && err.contains("names its subscription"), "{err}");
    // A mistake in a connector's own keys too, before anything starts.
    write_connector(
        &cfg,
        "bad.toml",
        "name = \"x\"\nkind = \"source\"\nconnector = \"file\"\ntopic = \"t\"\n[config]\npaht = \"/x\"\n",
    );
    let err = start();
    assert!(err.contains("connector x") && err.contains("config.paht"), "{err}");
}

/// A port nothing listens on now (for a connector's own listener).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

fn signature(secret: &[u8], body: &[u8]) -> String {
    use hmac::{Hmac, KeyInit, Mac};
    let mut mac = <Hmac<sha2::Sha256> as KeyInit>::new_from_slice(secret).unwrap();
    mac.update(body);
    let sig: String = mac.finalize().into_bytes().iter().map(|b| format!("{b:02x}")).collect();
    format!("sha256={sig}")
}

/// A request with these headers (raw lines) and body; status and body.
fn post_raw(addr: SocketAddr, path: &str, headers: &[(&str, &str)], body: &[u8]) -> (u16, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(40))).unwrap();
    let mut head =
        format!("POST {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\ncontent-length: {}\r\n", body.len());
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    s.write_all(head.as_bytes()).unwrap();
    s.write_all(body).unwrap();
    let mut all = Vec::new();
    let _ = s.read_to_end(&mut all);
    let text = String::from_utf8_lossy(&all).into_owned();
    let status = text.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    (status, text)
}

#[test]
fn the_http_source_takes_every_content_mode_and_checks_webhook_signatures() {
    let broker = Broker::start();
    let (_dirs, cfg, data, files) = Dirs::with_paths();
    let output = files.join("out.jsonl");
    let port = free_port();
    write_connector(
        &cfg,
        "hooks.toml",
        &format!(
            "name = \"hooks\"\nkind = \"source\"\nconnector = \"http\"\ntopic = \"hooks\"\n[config]\nlisten = \"127.0.0.1:{port}\"\npath = \"/in\"\nsecret = \"s3cret\"\nmax_body_bytes = 4096\n"
        ),
    );
    file_sink(&cfg, "out", "hooks", "hooks-file", &output);
    let _connect = Connect::start(broker.url(), cfg.clone(), data.clone());
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let send = |headers: &[(&str, &str)], body: &[u8]| {
        let sig = signature(b"s3cret", body);
        let mut h = headers.to_vec();
        h.push(("x-hub-signature-256", &sig));
        post_raw(addr, "/in", &h, body)
    };
    let structured = br#"{"specversion":"1.0","id":"s1","source":"/shop","type":"order","data":{"n":1}}"#;
    assert_eq!(send(&[("content-type", "application/cloudevents+json")], structured).0, 202);
    let batch = br#"[{"specversion":"1.0","id":"b1","source":"/shop","type":"order"},{"specversion":"1.0","id":"b2","source":"/shop","type":"order"}]"#;
    assert_eq!(send(&[("content-type", "application/cloudevents-batch+json")], batch).0, 202);
    let binary = [
        ("ce-specversion", "1.0"),
        ("ce-id", "bin1"),
        ("ce-source", "/shop"),
        ("ce-type", "order"),
        ("ce-subject", "caf%C3%A9"),
        ("ce-tenantx", "blue"),
        ("content-type", "text/plain"),
    ];
    assert_eq!(send(&binary, b"hello").0, 202);
    let hook = br#"{"ref":"refs/heads/main"}"#;
    let github = [("content-type", "application/json"), ("x-github-event", "push"), ("x-github-delivery", "d-42")];
    assert_eq!(send(&github, hook).0, 202);
    // GitHub sends it again: the same id, so it is one event to every consumer.
    assert_eq!(send(&github, hook).0, 202);
    // Refusals, each with its reason.
    let (s, t) = post_raw(addr, "/in", &github, hook);
    assert!(s == 401 && t.contains("X-Hub-Signature-256"), "{t}");
    let (s, _) = post_raw(addr, "/in", &[("x-hub-signature-256", &signature(b"wrong", hook))], hook);
    assert_eq!(s, 401);
    let big = vec![b'x'; 5000];
    assert_eq!(send(&[("content-type", "text/plain")], &big).0, 413);
    let no_id = br#"{"specversion":"1.0","source":"/shop","type":"order"}"#;
    let (s, t) = send(&[("content-type", "application/cloudevents+json")], no_id);
    assert!(s == 400 && t.contains("application/problem+json"), "{t}");
    let (s, t) = post_raw(addr, "/elsewhere", &[], b"{}");
    assert!(s == 404 && !t.contains("/in"), "the path is not named: {t}");
    let mut no_id = binary.to_vec();
    no_id[1] = ("ce-id", "");
    let (s, t) = send(&no_id, b"x");
    assert!(s == 400 && t.contains("ce-id"), "{t}");
    let mut doubled = binary.to_vec();
    doubled.push(("ce-datacontenttype", "text/plain"));
    let (s, t) = send(&doubled, b"x");
    assert!(s == 400 && t.contains("ce-datacontenttype"), "{t}");
    let (s, h, _) = http_as(addr, "GET", "/in", None, "text/plain");
    assert_eq!((s, h.get("allow").map(String::as_str)), (405, Some("POST")));
    let got = wait_for(Duration::from_secs(30), || {
        let w = written(&output);
        (w.len() >= 5).then_some(w)
    });
    let by_id: BTreeMap<String, Value> =
        got.iter().map(|e| (e["id"].as_str().unwrap().to_owned(), e.clone())).collect();
    assert_eq!(by_id.keys().map(String::as_str).collect::<Vec<_>>(), ["b1", "b2", "bin1", "d-42", "s1"]);
    assert_eq!(got.len(), 5, "the retried webhook is one event");
    assert_eq!(by_id["s1"]["data"], json!({"n": 1}));
    assert_eq!((by_id["bin1"]["subject"].as_str(), by_id["bin1"]["tenantx"].as_str()), (Some("café"), Some("blue")));
    assert_eq!(by_id["bin1"]["data"], "hello");
    assert_eq!(by_id["d-42"]["type"], "com.github.push");
    assert_eq!(by_id["d-42"]["data"], json!({"ref": "refs/heads/main"}));
    assert_eq!(by_id["d-42"]["source"], format!("http://127.0.0.1:{port}/in"));
}

/// What the receiver answered 2xx: (ce-id, content-type).
type Answered = std::sync::Arc<std::sync::Mutex<Vec<(String, String)>>>;

/// A webhook receiver: answers by the event's `ce-id` (`flaky` 503 the first time, `poison`
/// 400, others 204) and records the ids it answered 2xx, with their content types.
fn receiver() -> (SocketAddr, Answered) {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let got = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let (seen, flaked) = (got.clone(), std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false)));
    std::thread::spawn(move || {
        for conn in l.incoming() {
            let Ok(conn) = conn else { continue };
            let (seen, flaked) = (seen.clone(), flaked.clone());
            std::thread::spawn(move || {
                let mut r = BufReader::new(conn.try_clone().unwrap());
                let mut w = conn;
                loop {
                    let mut headers = BTreeMap::new();
                    let mut line = String::new();
                    if r.read_line(&mut line).unwrap_or(0) == 0 {
                        return;
                    }
                    loop {
                        let mut h = String::new();
                        if r.read_line(&mut h).unwrap_or(0) == 0 {
                            return;
                        }
                        if h == "\r\n" {
                            break;
                        }
                        if let Some((k, v)) = h.split_once(':') {
                            headers.insert(k.trim().to_ascii_lowercase(), v.trim().to_owned());
                        }
                    }
                    let n: usize = headers.get("content-length").and_then(|v| v.parse().ok()).unwrap_or(0);
                    let mut body = vec![0; n];
                    r.read_exact(&mut body).unwrap();
                    let id = headers.get("ce-id").cloned().unwrap_or_default();
                    let status = match id.as_str() {
                        "flaky" if !flaked.swap(true, std::sync::atomic::Ordering::SeqCst) => 503,
                        "poison" => 400,
                        _ => 204,
                    };
                    if status == 204 {
                        let ct = headers.get("content-type").cloned().unwrap_or_default();
                        seen.lock().unwrap().push((id, ct));
                    }
                    let _ = write!(w, "HTTP/1.1 {status} X\r\ncontent-length: 0\r\n\r\n");
                }
            });
        }
    });
    (addr, got)
}

#[test]
fn the_http_sink_posts_each_event_retries_failures_and_dead_letters_refusals() {
    let broker = Broker::start();
    let (_dirs, cfg, data, files) = Dirs::with_paths();
    let (addr, got) = receiver();
    let dead = files.join("dead.jsonl");
    write_connector(
        &cfg,
        "out.toml",
        &format!(
            "name = \"out\"\nkind = \"sink\"\nconnector = \"http\"\ntopic = \"pay\"\nsubscription = \"pay-http\"\n[config]\nurl = \"http://{addr}/hook\"\n[config.headers]\nauthorization = \"Bearer t\"\n"
        ),
    );
    file_sink(&cfg, "dead", "pay.dlq", "dead-file", &dead);
    let connect = Connect::start(broker.url(), cfg.clone(), data.clone());
    let ids = ["a0", "a1", "flaky", "a2", "poison", "a3", "a4"];
    for id in ids {
        publish(
            &broker,
            "pay",
            &json!({"specversion": "1.0", "id": id, "source": "/pay", "type": "t", "data": {"id": id}}),
        );
    }
    let answered = wait_for(Duration::from_secs(30), || {
        let g = got.lock().unwrap().clone();
        (g.len() >= 6).then_some(g)
    });
    let mut answered_ids: Vec<&str> = answered.iter().map(|(id, _)| id.as_str()).collect();
    answered_ids.sort();
    assert_eq!(answered_ids, ["a0", "a1", "a2", "a3", "a4", "flaky"], "each once, the flaky one after its 503");
    assert!(answered.iter().all(|(_, ct)| ct == "application/json"), "binary mode: the data's own type");
    let dl = wait_for(Duration::from_secs(30), || written(&dead).into_iter().next());
    assert_eq!(dl["id"], "poison");
    assert!(dl["connecterror"].as_str().unwrap().contains("400"), "{dl}");
    let counts = connect.get("/connectors/out").1["counts"].clone();
    assert!(counts["retried"].as_u64() >= Some(1) && counts["dlq"] == 1, "{counts}");
}

mod on_kafka {
    //! Against the Kafka-protocol broker the test command starts (EVMESH_TEST_KAFKA).

    use super::*;
    use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
    use rdkafka::client::DefaultClientContext;
    use rdkafka::config::ClientConfig;
    use rdkafka::consumer::{BaseConsumer, Consumer};
    use rdkafka::message::{Header, Headers, Message, OwnedHeaders};
    use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
    use rdkafka::{Offset, TopicPartitionList};

    fn brokers() -> String {
        std::env::var("EVMESH_TEST_KAFKA").expect("EVMESH_TEST_KAFKA names the test broker; scripts/test.sh sets it")
    }

    /// A Kafka topic of this test's own.
    fn kafka_topic(tag: &str, partitions: i32) -> String {
        kafka_topic_on(&brokers(), tag, partitions)
    }

    fn kafka_topic_on(brokers: &str, tag: &str, partitions: i32) -> String {
        let name = format!("connect-{tag}-{}", fastrand() % 1_000_000_000);
        let admin: AdminClient<DefaultClientContext> =
            ClientConfig::new().set("bootstrap.servers", brokers).create().unwrap();
        let new = NewTopic::new(&name, partitions, TopicReplication::Fixed(1));
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let made = rt.block_on(admin.create_topics([&new], &AdminOptions::new())).unwrap();
        assert!(made[0].is_ok(), "{made:?}");
        name
    }

    fn producer() -> BaseProducer {
        ClientConfig::new().set("bootstrap.servers", brokers()).create().unwrap()
    }

    fn produce(p: &BaseProducer, topic: &str, key: Option<&str>, headers: &[(&str, &str)], value: &[u8]) {
        let mut h = OwnedHeaders::new();
        for (k, v) in headers {
            h = h.insert(Header { key: k, value: Some(*v) });
        }
        let mut rec = BaseRecord::<str, [u8]>::to(topic).payload(value).headers(h);
        if let Some(k) = key {
            rec = rec.key(k);
        }
        p.send(rec).map_err(|(e, _)| e).unwrap();
    }

    #[test]
    #[ignore = "needs a Kafka-protocol broker at EVMESH_TEST_KAFKA (scripts/test.sh starts one)"]
    fn the_kafka_source_reads_every_record_form_exactly_once_across_a_kill_9() {
        let broker = Broker::start();
        let (_dirs, cfg, data, files) = Dirs::with_paths();
        let output = files.join("out.jsonl");
        let topic = kafka_topic("src", 3);
        let p = producer();
        for i in 0..30 {
            produce(&p, &topic, Some(&format!("k{}", i % 3)), &[], format!("{{\"n\":{i}}}").as_bytes());
        }
        let binary = [
            ("ce_specversion", "1.0"),
            ("ce_id", "bin-1"),
            ("ce_source", "/orders"),
            ("ce_type", "order"),
            ("content-type", "application/json"),
        ];
        produce(&p, &topic, None, &binary, br#"{"sku":"A"}"#);
        let structured = br#"{"specversion":"1.0","id":"st-1","source":"/orders","type":"order","data":"x"}"#;
        produce(&p, &topic, None, &[("content-type", "application/cloudevents+json")], structured);
        p.flush(Duration::from_secs(10)).unwrap();
        write_connector(
            &cfg,
            "in.toml",
            &format!(
                "name = \"in\"\nkind = \"source\"\nconnector = \"kafka\"\ntopic = \"fromk\"\nbatch = 7\n[config]\nbrokers = \"{}\"\ntopic = \"{topic}\"\n",
                brokers()
            ),
        );
        file_sink(&cfg, "out", "fromk", "fromk-file", &output);
        let mut connect = Connect::start(broker.url(), cfg.clone(), data.clone());
        wait_for(Duration::from_secs(60), || (written(&output).len() >= 32).then_some(()));
        connect.kill9();
        for i in 30..50 {
            produce(&p, &topic, Some("k0"), &[], format!("{{\"n\":{i}}}").as_bytes());
        }
        p.flush(Duration::from_secs(10)).unwrap();
        connect.restart_after_kill9();
        let got = wait_for(Duration::from_secs(60), || {
            let w = written(&output);
            (w.len() >= 52).then_some(w)
        });
        let ids: std::collections::BTreeSet<&str> = got.iter().map(|e| e["id"].as_str().unwrap()).collect();
        assert_eq!((got.len(), ids.len()), (52, 52), "each record once");
        // Restarted from its stored position: the 20 new records, and at most the one batch
        // that was in evmesh but not stored when it was killed.
        let published = connect.get("/connectors/in").1["counts"]["published"].as_u64().unwrap();
        assert!((20..=27).contains(&published), "published {published} after the restart");
        let by_id = |id: &str| got.iter().find(|e| e["id"] == id).unwrap().clone();
        assert_eq!(by_id("bin-1")["data"], json!({"sku": "A"}));
        // Caught up: nothing past the next offsets.
        let lag = || connect.get("/connectors/in").1["lag"].clone();
        wait_for(Duration::from_secs(30), || (lag() == json!({"records": 0})).then_some(()));
        assert_eq!(by_id("st-1")["data"], "x");
        let plain: Vec<&Value> = got.iter().filter(|e| e["type"] == "evmesh.connect.kafka.record").collect();
        assert_eq!(plain.len(), 50);
        assert!(plain.iter().all(|e| e["source"] == json!(format!("kafka:{topic}"))
            && e["id"].as_str().unwrap().starts_with(&format!("{topic}-"))
            && e["partitionkey"].as_str().is_some_and(|k| k.starts_with('k'))));
        // Where each record was: its partition and offset, the same as its id says.
        for e in &plain {
            let at: Value = serde_json::from_str(e["connectposition"].as_str().unwrap()).unwrap();
            assert_eq!(e["id"], json!(format!("{topic}-{}-{}", at["partition"], at["offset"])), "{e}");
        }
    }

    /// A tansu of this test's own (EVMESH_TANSU), to stop and resume (SIGSTOP, SIGCONT).
    struct OwnTansu {
        child: Child,
        addr: String,
    }

    impl OwnTansu {
        fn start() -> OwnTansu {
            let bin =
                std::env::var("EVMESH_TANSU").expect("EVMESH_TANSU names the tansu binary; scripts/test.sh sets it");
            let url = format!("tcp://127.0.0.1:{}", free_port());
            let args = [
                "broker",
                "--listener-url",
                &url,
                "--advertised-listener-url",
                &url,
                "--storage-engine",
                "memory://tansu/",
            ];
            let child = Command::new(bin).args(args).stdout(Stdio::null()).stderr(Stdio::null()).spawn().unwrap();
            let addr = url.trim_start_matches("tcp://").to_owned();
            wait_for(Duration::from_secs(30), || TcpStream::connect(&addr).ok());
            OwnTansu { child, addr }
        }

        fn signal(&self, sig: &str) {
            assert!(Command::new("kill").args([sig, &self.child.id().to_string()]).status().unwrap().success());
        }
    }

    impl Drop for OwnTansu {
        fn drop(&mut self) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }

    /// The `ce_id`s of every record of `topic` (partition 0), read from its start.
    fn ids_in(brokers: &str, topic: &str, at_least: usize) -> Vec<String> {
        let consumer: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", brokers)
            .set("group.id", "connect-test-reader")
            .set("enable.auto.commit", "false")
            .create()
            .unwrap();
        let mut list = TopicPartitionList::new();
        list.add_partition_offset(topic, 0, Offset::Beginning).unwrap();
        consumer.assign(&list).unwrap();
        let mut ids = Vec::new();
        let until = Instant::now() + Duration::from_secs(60);
        while ids.len() < at_least && Instant::now() < until {
            if let Some(Ok(m)) = consumer.poll(Duration::from_millis(200)) {
                let id = m.headers().and_then(|h| h.iter().find(|h| h.key == "ce_id").and_then(|h| h.value));
                ids.push(String::from_utf8_lossy(id.unwrap_or_default()).into_owned());
            }
        }
        ids
    }

    #[test]
    #[ignore = "needs a Kafka-protocol broker at EVMESH_TEST_KAFKA (scripts/test.sh starts one)"]
    fn a_kafka_broker_that_stops_answering_and_comes_back_loses_nothing() {
        let kafka = OwnTansu::start();
        let broker = Broker::start();
        let (_dirs, cfg, data, _) = Dirs::with_paths();
        let topic = kafka_topic_on(&kafka.addr, "away", 1);
        write_connector(
            &cfg,
            "out.toml",
            &format!(
                "name = \"out\"\nkind = \"sink\"\nconnector = \"kafka\"\ntopic = \"away\"\nsubscription = \"away-kafka\"\n[config]\nbrokers = \"{}\"\ntopic = \"{topic}\"\n[config.properties]\n\"message.timeout.ms\" = 3000\n",
                kafka.addr
            ),
        );
        let connect = Connect::start(broker.url(), cfg.clone(), data.clone());
        let event =
            |i: usize| json!({"specversion": "1.0", "id": format!("k{i}"), "source": "/s", "type": "t", "data": i});
        let put = || connect.get("/connectors/out").1["counts"]["put"].as_u64().unwrap_or(0);
        for i in 0..10 {
            publish(&broker, "away", &event(i));
        }
        wait_for(Duration::from_secs(30), || (put() == 10).then_some(()));
        kafka.signal("-STOP");
        for i in 10..20 {
            publish(&broker, "away", &event(i));
        }
        // Kafka's acks do not come: the batch times out and is retried, not acked to evmesh.
        wait_for(Duration::from_secs(30), || {
            (connect.get("/connectors/out").1["counts"]["retried"].as_u64() >= Some(1)).then_some(())
        });
        assert_eq!(put(), 10, "nothing acked while Kafka is away");
        kafka.signal("-CONT");
        wait_for(Duration::from_secs(60), || (put() == 20).then_some(()));
        let ids: std::collections::BTreeSet<String> = ids_in(&kafka.addr, &topic, 20).into_iter().collect();
        assert_eq!(ids.len(), 20, "every event in Kafka: {ids:?}");
    }

    #[test]
    #[ignore = "needs a Kafka-protocol broker at EVMESH_TEST_KAFKA (scripts/test.sh starts one)"]
    fn a_kafka_source_whose_broker_stops_answering_goes_on_where_it_was() {
        let kafka = OwnTansu::start();
        let broker = Broker::start();
        let (_dirs, cfg, data, files) = Dirs::with_paths();
        let output = files.join("out.jsonl");
        let topic = kafka_topic_on(&kafka.addr, "srcaway", 1);
        let p: BaseProducer = ClientConfig::new().set("bootstrap.servers", &kafka.addr).create().unwrap();
        let produce_range = |r: std::ops::Range<usize>| {
            for i in r {
                produce(&p, &topic, None, &[], format!("{{\"n\":{i}}}").as_bytes());
            }
            p.flush(Duration::from_secs(10)).unwrap();
        };
        produce_range(0..20);
        write_connector(
            &cfg,
            "in.toml",
            &format!(
                "name = \"in\"\nkind = \"source\"\nconnector = \"kafka\"\ntopic = \"froma\"\n[config]\nbrokers = \"{}\"\ntopic = \"{topic}\"\n",
                kafka.addr
            ),
        );
        file_sink(&cfg, "out", "froma", "froma-file", &output);
        let connect = Connect::start(broker.url(), cfg.clone(), data.clone());
        wait_for(Duration::from_secs(60), || (written(&output).len() >= 20).then_some(()));
        // The broker stops answering (SIGSTOP) until the source cannot even ask its lag, then
        // comes back: what is produced then is read from the source's position, once.
        kafka.signal("-STOP");
        let lag = || connect.get("/connectors/in").1["lag"].clone();
        wait_for(Duration::from_secs(30), || lag().is_null().then_some(()));
        kafka.signal("-CONT");
        produce_range(20..30);
        let got = wait_for(Duration::from_secs(60), || {
            let w = written(&output);
            (w.len() >= 30).then_some(w)
        });
        let ids: std::collections::BTreeSet<&str> = got.iter().map(|e| e["id"].as_str().unwrap()).collect();
        assert_eq!((got.len(), ids.len()), (30, 30), "each record once");
        wait_for(Duration::from_secs(30), || (lag() == json!({"records": 0})).then_some(()));
    }

    #[test]
    #[ignore = "needs a Kafka-protocol broker at EVMESH_TEST_KAFKA (scripts/test.sh starts one)"]
    fn the_kafka_sink_produces_each_event_in_the_binary_binding() {
        let broker = Broker::start();
        let (_dirs, cfg, data, _) = Dirs::with_paths();
        let topic = kafka_topic("sink", 1);
        write_connector(
            &cfg,
            "out.toml",
            &format!(
                "name = \"out\"\nkind = \"sink\"\nconnector = \"kafka\"\ntopic = \"tok\"\nsubscription = \"tok-kafka\"\n[config]\nbrokers = \"{}\"\ntopic = \"{topic}\"\n",
                brokers()
            ),
        );
        let _connect = Connect::start(broker.url(), cfg.clone(), data.clone());
        for i in 0..10 {
            let e = json!({"specversion": "1.0", "id": format!("e{i}"), "source": "/s", "type": "t", "partitionkey": format!("c{i}"), "data": {"i": i}});
            publish(&broker, "tok", &e);
        }
        let consumer: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", brokers())
            .set("group.id", "connect-test-reader")
            .set("enable.auto.commit", "false")
            .create()
            .unwrap();
        let mut list = TopicPartitionList::new();
        list.add_partition_offset(&topic, 0, Offset::Beginning).unwrap();
        consumer.assign(&list).unwrap();
        let mut got = BTreeMap::new();
        let until = Instant::now() + Duration::from_secs(60);
        while got.len() < 10 && Instant::now() < until {
            if let Some(Ok(m)) = consumer.poll(Duration::from_millis(200)) {
                let h: BTreeMap<String, String> = m
                    .headers()
                    .map(|h| {
                        h.iter()
                            .map(|h| (h.key.to_owned(), String::from_utf8_lossy(h.value.unwrap_or(&[])).into_owned()))
                            .collect()
                    })
                    .unwrap_or_default();
                let key = m.key().map(|k| String::from_utf8_lossy(k).into_owned());
                let value: Value = serde_json::from_slice(m.payload().unwrap_or(&[])).unwrap();
                got.insert(h["ce_id"].clone(), (h, key, value));
            }
        }
        assert_eq!(got.len(), 10, "{got:?}");
        for i in 0..10 {
            let (h, key, value) = &got[&format!("e{i}")];
            assert_eq!(
                (h["ce_source"].as_str(), h["ce_type"].as_str(), h["content-type"].as_str()),
                ("/s", "t", "application/json")
            );
            assert!(!h.contains_key("ce_emdeliveryid"), "{h:?}");
            assert_eq!(key.as_deref(), Some(format!("c{i}").as_str()));
            assert_eq!(value, &json!({"i": i}));
        }
    }
}

mod on_mqtt;

mod on_redis;

mod on_postgres {
    //! Against a real PostgreSQL, started in a temporary directory (Debian's `postgresql`;
    //! scripts/test.sh installs it).

    use super::*;

    /// A PostgreSQL server of this test's own; stopped (immediate) when dropped.
    struct Pg {
        dir: PathBuf,
        bin: PathBuf,
        port: u16,
    }

    /// Runs a PostgreSQL tool as the `postgres` user when this is root (it refuses root).
    fn as_postgres(bin: &Path, args: &[&str]) -> std::process::Output {
        let root = std::process::Command::new("id").arg("-u").output().unwrap().stdout == b"0\n";
        let mut cmd = if root {
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--"]).arg(bin);
            c
        } else {
            Command::new(bin)
        };
        cmd.args(args).stdin(Stdio::null()).output().unwrap()
    }

    impl Pg {
        fn start() -> Pg {
            let bin = std::fs::read_dir("/usr/lib/postgresql")
                .expect("PostgreSQL is installed (/usr/lib/postgresql); scripts/test.sh installs it")
                .filter_map(|e| e.ok().map(|e| e.path().join("bin")))
                .find(|b| b.join("initdb").exists())
                .expect("an initdb under /usr/lib/postgresql/*/bin");
            let dir = temp("pg");
            let uid = String::from_utf8(Command::new("id").args(["-u", "postgres"]).output().unwrap().stdout).unwrap();
            let gid = String::from_utf8(Command::new("id").args(["-g", "postgres"]).output().unwrap().stdout).unwrap();
            if let (Ok(u), Ok(g)) = (uid.trim().parse(), gid.trim().parse()) {
                let _ = std::os::unix::fs::chown(&dir, Some(u), Some(g));
            }
            let data = dir.join("data");
            let d = data.to_str().unwrap();
            let out = as_postgres(
                &bin.join("initdb"),
                &["-D", d, "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync"],
            );
            assert!(out.status.success(), "initdb: {}", String::from_utf8_lossy(&out.stderr));
            let pg = Pg { dir, bin, port: free_port() };
            pg.up();
            pg
        }

        /// Starts the server (again) on its data directory and port.
        fn up(&self) {
            let opts = format!("-p {} -k {} -c listen_addresses=127.0.0.1 -c fsync=off", self.port, self.dir.display());
            let (d, log) = (self.dir.join("data"), self.dir.join("log"));
            let (d, log) = (d.to_str().unwrap(), log.to_str().unwrap());
            let out = as_postgres(&self.bin.join("pg_ctl"), &["-D", d, "-o", &opts, "-l", log, "-w", "start"]);
            assert!(out.status.success(), "pg_ctl start: {}", String::from_utf8_lossy(&out.stderr));
        }

        /// Stops the server at once (connections cut, as a crash).
        fn down(&self) {
            let d = self.dir.join("data");
            let out =
                as_postgres(&self.bin.join("pg_ctl"), &["-D", d.to_str().unwrap(), "-m", "immediate", "-w", "stop"]);
            assert!(out.status.success(), "pg_ctl stop: {}", String::from_utf8_lossy(&out.stderr));
        }

        fn count(&self, table: &str) -> usize {
            self.query(&format!("SELECT count(*) FROM {table}"))[0].parse().unwrap()
        }

        fn url(&self) -> String {
            format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
        }

        /// Runs `sql`, returning the first column of each row as text.
        fn query(&self, sql: &str) -> Vec<String> {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            rt.block_on(async {
                let (client, conn) = tokio_postgres::connect(&self.url(), tokio_postgres::NoTls).await.unwrap();
                tokio::spawn(conn);
                let mut out = Vec::new();
                for m in client.simple_query(sql).await.unwrap() {
                    if let tokio_postgres::SimpleQueryMessage::Row(r) = m {
                        out.push(r.get(0).unwrap_or_default().to_owned());
                    }
                }
                out
            })
        }
    }

    impl Drop for Pg {
        fn drop(&mut self) {
            let d = self.dir.join("data");
            let _ = as_postgres(&self.bin.join("pg_ctl"), &["-D", d.to_str().unwrap(), "-m", "immediate", "stop"]);
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }

    #[test]
    #[ignore = "needs PostgreSQL (Debian's postgresql: initdb, pg_ctl; scripts/test.sh installs it)"]
    fn the_postgres_sink_writes_each_event_once_through_a_crash_and_dead_letters_what_it_refuses() {
        let pg = Pg::start();
        let broker = Broker::start();
        let (_dirs, cfg, data, files) = Dirs::with_paths();
        let dead = files.join("dead.jsonl");
        write_connector(
            &cfg,
            "pg.toml",
            &format!(
                "name = \"pg\"\nkind = \"sink\"\nconnector = \"postgres\"\ntopic = \"orders\"\nsubscription = \"orders-pg\"\nbatch = 10\n[config]\nurl = \"{}\"\n",
                pg.url()
            ),
        );
        file_sink(&cfg, "dead", "orders.dlq", "dead-file", &dead);
        for i in 0..40 {
            let e = json!({"specversion": "1.0", "id": format!("o{i}"), "source": "/shop", "type": "order", "subject": format!("c{}", i % 4), "data": {"n": i}});
            publish(&broker, "orders", &e);
        }
        publish(
            &broker,
            "orders",
            &json!({"specversion": "1.0", "id": "text", "source": "/shop", "type": "note", "datacontenttype": "text/plain", "data": "hello"}),
        );
        // jsonb has no \u0000: PostgreSQL refuses the row for its data.
        publish(
            &broker,
            "orders",
            &json!({"specversion": "1.0", "id": "poison", "source": "/shop", "type": "order", "data": {"bad": "a\u{0}b"}}),
        );
        // Killed after a batch is in the table and before it is acked: delivered again.
        let mut connect = Connect::start_with_fault(broker.url(), cfg.clone(), data.clone(), "sink-flushed:2");
        connect.aborted();
        for i in 40..60 {
            publish(
                &broker,
                "orders",
                &json!({"specversion": "1.0", "id": format!("o{i}"), "source": "/shop", "type": "order", "data": {"n": i}}),
            );
        }
        connect.spawn();
        let n = wait_for(Duration::from_secs(60), || {
            let n: usize = pg.query("SELECT count(*) FROM orders")[0].parse().unwrap();
            (n >= 61).then_some(n)
        });
        assert_eq!(n, 61, "60 orders and the text event");
        assert_eq!(pg.query("SELECT count(DISTINCT (source, id)) FROM orders"), ["61"]);
        assert_eq!(pg.query("SELECT data->>'n' FROM orders WHERE id = 'o7'"), ["7"]);
        assert_eq!(pg.query("SELECT subject || ' ' || type FROM orders WHERE id = 'o7'"), ["c3 order"]);
        assert_eq!(
            pg.query("SELECT data_text || ' ' || (data IS NULL)::text FROM orders WHERE id = 'text'"),
            ["hello true"]
        );
        assert_eq!(pg.query("SELECT count(*) FROM orders WHERE event ? 'emdeliveryid'"), ["0"]);
        let dl = wait_for(Duration::from_secs(30), || written(&dead).into_iter().next());
        assert_eq!(dl["id"], "poison");
        assert!(dl["connecterror"].as_str().unwrap().contains("postgres"), "{dl}");
    }

    #[test]
    #[ignore = "needs PostgreSQL (Debian's postgresql: initdb, pg_ctl; scripts/test.sh installs it)"]
    fn a_database_that_goes_away_and_comes_back_loses_nothing() {
        let pg = Pg::start();
        let broker = Broker::start();
        let (_dirs, cfg, data, _) = Dirs::with_paths();
        write_connector(
            &cfg,
            "pg.toml",
            &format!(
                "name = \"pg\"\nkind = \"sink\"\nconnector = \"postgres\"\ntopic = \"pay\"\nsubscription = \"pay-pg\"\nbatch = 10\n[config]\nurl = \"{}\"\n",
                pg.url()
            ),
        );
        let connect = Connect::start(broker.url(), cfg.clone(), data.clone());
        let event = |i: usize| json!({"specversion": "1.0", "id": format!("p{i}"), "source": "/pay", "type": "t", "data": {"i": i}});
        for i in 0..30 {
            publish(&broker, "pay", &event(i));
        }
        wait_for(Duration::from_secs(30), || (pg.count("pay") == 30).then_some(()));
        pg.down();
        for i in 30..60 {
            publish(&broker, "pay", &event(i));
        }
        // The sink retries (the deliveries wait un-acked) while the database is away.
        wait_for(Duration::from_secs(30), || {
            (connect.get("/connectors/pg").1["counts"]["retried"].as_u64() >= Some(2)).then_some(())
        });
        pg.up();
        wait_for(Duration::from_secs(60), || (pg.count("pay") >= 60).then_some(()));
        assert_eq!(pg.count("pay"), 60);
        assert_eq!(pg.query("SELECT count(DISTINCT id) FROM pay"), ["60"]);
        assert_eq!(connect.get("/connectors/pg").1["counts"]["dlq"], 0, "nothing refused for the outage");
    }

    #[test]
    #[ignore = "needs PostgreSQL (Debian's postgresql: initdb, pg_ctl; scripts/test.sh installs it)"]
    fn the_postgres_source_reads_new_rows_from_its_position_across_a_kill_9() {
        let pg = Pg::start();
        let broker = Broker::start();
        let (_dirs, cfg, data, files) = Dirs::with_paths();
        let output = files.join("out.jsonl");
        pg.query("CREATE TABLE items (n bigserial PRIMARY KEY, name text NOT NULL)");
        pg.query("INSERT INTO items (name) SELECT 'item-' || g FROM generate_series(1, 30) g");
        write_connector(
            &cfg,
            "in.toml",
            &format!(
                "name = \"in\"\nkind = \"source\"\nconnector = \"postgres\"\ntopic = \"rows\"\nbatch = 8\n[config]\nurl = \"{}\"\ntable = \"items\"\ncolumn = \"n\"\npoll_ms = 50\n",
                pg.url()
            ),
        );
        file_sink(&cfg, "out", "rows", "rows-file", &output);
        let mut connect = Connect::start(broker.url(), cfg.clone(), data.clone());
        wait_for(Duration::from_secs(60), || (written(&output).len() >= 30).then_some(()));
        connect.kill9();
        pg.query("INSERT INTO items (name) SELECT 'item-' || g FROM generate_series(31, 50) g");
        connect.restart_after_kill9();
        let got = wait_for(Duration::from_secs(60), || {
            let w = written(&output);
            (w.len() >= 50).then_some(w)
        });
        let names: std::collections::BTreeSet<String> =
            got.iter().map(|e| e["data"]["name"].as_str().unwrap().to_owned()).collect();
        assert_eq!((got.len(), names.len()), (50, 50), "each row once");
        assert!(got
            .iter()
            .all(|e| e["source"] == "postgres:items" && e["id"] == json!(format!("items-{}", e["data"]["n"]))));
        let published = connect.get("/connectors/in").1["counts"]["published"].as_u64().unwrap();
        assert!((20..=28).contains(&published), "published {published} after the restart: from its position");
        wait_for(Duration::from_secs(10), || {
            (connect.get("/connectors/in").1["position"] == json!({"last": "50"})).then_some(())
        });
    }
}

#[test]
fn a_source_keeps_its_position_while_evmesh_refuses_the_topic_and_goes_on_once_it_exists() {
    // No topic is made by a publish: 404 until an operator makes it.
    let broker = Broker::start_with(&["--auto-create-topics", "false"]);
    let (_dirs, cfg, data, files) = Dirs::with_paths();
    let (input, _) = pipeline(&cfg, &files);
    std::fs::remove_file(cfg.join("out.toml")).unwrap();
    append(&input, lines(0..30));
    let connect = Connect::start_ready_or_not(broker.url(), cfg.clone(), data.clone());
    // Refused (404), retried with backoff: nothing passed over, no position stored.
    wait_for(Duration::from_secs(20), || {
        (connect.get("/connectors/in").1["counts"]["retried"].as_u64() >= Some(2)).then_some(())
    });
    let st = connect.get("/connectors/in").1;
    assert_eq!(
        (&st["position"], &st["counts"]["failed"], &st["counts"]["published"]),
        (&Value::Null, &json!(0), &json!(0)),
        "{st}"
    );
    let (s, _, b) = http(broker.admin, "PUT", "/admin/topics/orders", Some(br#"{"partitions": 2}"#));
    assert!(s == 200 || s == 201, "{}", String::from_utf8_lossy(&b));
    wait_for(Duration::from_secs(30), || (connect.get("/connectors/in").1["counts"]["published"] == 30).then_some(()));
    let end = std::fs::metadata(&input).unwrap().len();
    wait_for(Duration::from_secs(10), || {
        (connect.get("/connectors/in").1["position"]["offset"] == json!(end)).then_some(())
    });
}

#[test]
fn the_http_source_bounds_the_bodies_in_flight() {
    let broker = Broker::start();
    let (_dirs, cfg, data, _) = Dirs::with_paths();
    let port = free_port();
    // 32 MiB a request against a 64 MiB budget: two bodies in flight at most.
    write_connector(
        &cfg,
        "hooks.toml",
        &format!(
            "name = \"hooks\"\nkind = \"source\"\nconnector = \"http\"\ntopic = \"hooks\"\n[config]\nlisten = \"127.0.0.1:{port}\"\nmax_body_bytes = 33554432\n"
        ),
    );
    let _connect = Connect::start(broker.url(), cfg.clone(), data.clone());
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    // Senders that announce a body and never send it.
    let open_slow = || {
        let mut s = TcpStream::connect(addr).unwrap();
        s.write_all(b"POST / HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: 1000\r\n\r\n")
            .unwrap();
        s.set_nonblocking(true).unwrap();
        s
    };
    // Whether the server answered a slow sender (it was refused: it came while a quick request
    // held the budget too).
    let answered = |s: &TcpStream| s.peek(&mut [0]).is_ok();
    let mut slow = vec![open_slow(), open_slow()];
    let hook = |i: usize| {
        let body = format!("{{\"n\":{i}}}");
        post_raw(addr, "/", &[("content-type", "application/json")], body.as_bytes())
    };
    let mut i = 0;
    // Refused once the two slow senders hold the budget.
    let refused = wait_for(Duration::from_secs(20), || {
        for s in slow.iter_mut().filter(|s| answered(s)) {
            *s = open_slow();
        }
        i += 1;
        let (status, text) = hook(i);
        (status == 503 && !slow.iter().any(&answered)).then_some(text)
    });
    assert!(refused.contains("retry-after") && refused.contains("bodies in flight"), "{refused}");
    // The slow senders gone, their budget comes back.
    drop(slow);
    wait_for(Duration::from_secs(20), || (hook(0).0 == 202).then_some(()));
}
