//! Test helpers: a broker process per test and a small blocking HTTP/1.1 client.

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// A running `evmesh serve` with its own data directory, killed and removed on drop.
pub struct TestBroker {
    child: Option<Child>,
    pub dir: PathBuf,
    pub traffic: SocketAddr,
    pub admin: SocketAddr,
    /// The classic TCP listener, when started with `--tcp-listen`.
    pub tcp: Option<SocketAddr>,
    args: Vec<String>,
    env: Vec<(String, String)>,
    /// Run under this open-files limit (soft and hard), through util-linux's `prlimit`.
    nofile: Option<u64>,
    /// Over Kafka: not waited for to be ready when (re)started.
    unready: bool,
}

static SEQ: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    /// Brokers started by this test thread run on the Kafka backend (see [`on_kafka`]).
    static KAFKA: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    /// Brokers started by this test thread run on the RocketMQ backend (see [`on_rocketmq`]).
    static ROCKETMQ: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Declares, for each test function named, a test that runs it on the RocketMQ backend
/// (ignored in a plain `cargo test`: it needs the name server and broker scripts/test.sh
/// starts). Use it in a child module of the tests' module, with `on_rocketmq` in scope.
#[cfg(feature = "rocketmq")]
macro_rules! again_on_rocketmq {
    ($($name:ident),* $(,)?) => { $(
        #[test]
        #[ignore = "needs a RocketMQ name server at EVMESH_TEST_ROCKETMQ (scripts/test.sh starts one)"]
        fn $name() { on_rocketmq(super::$name) }
    )* };
}
#[cfg(feature = "rocketmq")]
pub(crate) use again_on_rocketmq;

#[cfg(feature = "rocketmq")]
/// Runs a test with every broker it starts on the RocketMQ backend (the name server that
/// scripts/test.sh starts, EVMESH_TEST_ROCKETMQ), its topics under a prefix of their own.
pub fn on_rocketmq(test: fn()) {
    ROCKETMQ.with(|k| k.set(true));
    test();
    ROCKETMQ.with(|k| k.set(false));
}

/// Declares, for each test function named, a test that runs it on the Kafka backend (ignored
/// in a plain `cargo test`: it needs the broker scripts/test.sh starts). Use it in a child
/// module of the tests' module, with `on_kafka` in scope.
#[cfg(feature = "kafka")]
macro_rules! again_on_kafka {
    ($($name:ident),* $(,)?) => { $(
        #[test]
        #[ignore = "needs a Kafka-protocol broker at EVMESH_TEST_KAFKA (scripts/test.sh starts one)"]
        fn $name() { on_kafka(super::$name) }
    )* };
}
#[cfg(feature = "kafka")]
pub(crate) use again_on_kafka;

#[cfg(feature = "kafka")]
/// Runs a test with every broker it starts on the Kafka backend (the test broker that
/// scripts/test.sh starts, EVMESH_TEST_KAFKA), its topics under a prefix of their own.
pub fn on_kafka(test: fn()) {
    KAFKA.with(|k| k.set(true));
    test();
    KAFKA.with(|k| k.set(false));
}

impl TestBroker {
    /// Starts a broker with 2 shards and `extra` flags.
    pub fn start(extra: &[&str]) -> TestBroker {
        Self::start_env(extra, &[])
    }

    /// [`TestBroker::start`] with extra environment variables.
    pub fn start_env(extra: &[&str], env: &[(&str, &str)]) -> TestBroker {
        let dir = std::env::temp_dir().join(format!(
            "evmesh-it-{}-{}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        let mut args: Vec<String> = vec!["--shards".into(), "2".into()];
        if KAFKA.with(|k| k.get()) {
            let brokers = std::env::var("EVMESH_TEST_KAFKA")
                .expect("EVMESH_TEST_KAFKA names the test Kafka broker; scripts/test.sh installs and starts one");
            let prefix = format!("it-{}-{}-", std::process::id(), SEQ.fetch_add(1, Ordering::Relaxed));
            args.extend(
                ["--storage", "kafka", "--kafka-brokers", &brokers, "--kafka-topic-prefix", &prefix].map(String::from),
            );
        }
        if ROCKETMQ.with(|k| k.get()) {
            let namesrv = std::env::var("EVMESH_TEST_ROCKETMQ").expect(
                "EVMESH_TEST_ROCKETMQ names the test RocketMQ name server; scripts/test.sh installs and starts one",
            );
            let prefix = format!("it-{}-{}-", std::process::id(), SEQ.fetch_add(1, Ordering::Relaxed));
            args.extend(
                ["--storage", "rocketmq", "--rocketmq-namesrv", &namesrv, "--rocketmq-topic-prefix", &prefix]
                    .map(String::from),
            );
        }
        args.extend(extra.iter().map(|s| s.to_string()));
        let mut b = TestBroker {
            child: None,
            dir,
            traffic: "0.0.0.0:0".parse().unwrap(),
            admin: "0.0.0.0:0".parse().unwrap(),
            tcp: None,
            args,
            env: env.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
            nofile: None,
            unready: false,
        };
        b.spawn();
        b
    }

    /// [`TestBroker::start`] under an open-files limit of `nofile` (soft and hard).
    pub fn start_with_nofile(extra: &[&str], nofile: u64) -> TestBroker {
        let mut b = Self::start(extra);
        b.kill9();
        b.nofile = Some(nofile);
        b.spawn();
        b
    }

    fn spawn(&mut self) {
        let mut cmd = match self.nofile {
            Some(n) => {
                let mut c = Command::new("prlimit");
                c.arg(format!("--nofile={n}:{n}")).arg(env!("CARGO_BIN_EXE_evmesh"));
                c
            }
            None => Command::new(env!("CARGO_BIN_EXE_evmesh")),
        };
        let mut child = cmd
            .arg("serve")
            .args(["--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0", "--data-dir"])
            .arg(&self.dir)
            .args(&self.args)
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn evmesh");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).expect("read ready line");
        let field = |k: &str| -> SocketAddr {
            line.split_whitespace()
                .find_map(|w| w.strip_prefix(k))
                .unwrap_or_else(|| panic!("no {k} in {line:?}"))
                .parse()
                .unwrap()
        };
        self.traffic = field("traffic=");
        self.admin = field("admin=");
        self.tcp = line.split_whitespace().find_map(|w| w.strip_prefix("tcp=")).map(|a| a.parse().unwrap());
        self.child = Some(child);
        // Over Kafka, sessions are served once the cluster's claims are read (GET /admin/cluster
        // says when): waited for, but for tests that start it with the broker away.
        if self.args.iter().any(|a| a == "kafka") && !self.unready {
            wait_for(Duration::from_secs(30), || self.claims_read().then_some(()));
        }
    }

    /// Over Kafka: whether it has read the claims written before it started (sessions 503 till).
    pub fn claims_read(&self) -> bool {
        self.admin().get("/admin/cluster").json()["claimsRead"] == true
    }

    /// [`TestBroker::restart`] without waiting to be ready (the broker it needs is away).
    pub fn restart_unready(&mut self) {
        self.unready = true;
        self.restart();
        self.unready = false;
    }

    /// SIGKILL: no chance to flush anything.
    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts again on the same data directory (new ports).
    pub fn restart(&mut self) {
        self.kill9();
        self.spawn();
    }

    /// SIGKILL, then starts again on the same data directory with `extra` flags added (they
    /// stay for later restarts).
    pub fn restart_adding(&mut self, extra: &[&str]) {
        self.kill9();
        self.args.extend(extra.iter().map(|s| s.to_string()));
        self.spawn();
    }

    /// SIGKILL, then starts again on the same data directory and the same ports, as a
    /// supervisor restarts a crashed broker: clients reconnect to the address they know.
    pub fn restart_on_same_ports(&mut self) {
        self.kill9();
        let pinned =
            ["--listen".to_owned(), self.traffic.to_string(), "--admin-listen".to_owned(), self.admin.to_string()];
        self.args.extend(pinned);
        self.spawn();
        self.args.truncate(self.args.len() - 4);
    }

    /// The broker's process id (for /proc readings such as [`rss_bytes`]).
    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("running").id()
    }

    /// The broker's resident memory now.
    pub fn rss_bytes(&self) -> u64 {
        rss_bytes(self.pid())
    }

    /// Whether the broker process is still running (`None`), or how it ended.
    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child.as_mut().and_then(|c| c.try_wait().ok().flatten())
    }

    pub fn client(&self) -> Client {
        Client::connect(self.traffic)
    }

    pub fn admin(&self) -> Client {
        Client::connect(self.admin)
    }

    /// Publishes one structured event on a new connection.
    pub fn publish(&self, topic: &str, event: &serde_json::Value) -> Resp {
        self.client().post(
            &format!("/events/publish?topic={topic}"),
            "application/cloudevents+json",
            event.to_string().as_bytes(),
        )
    }

    /// Every stored event of a partition, via the admin API.
    pub fn events(&self, topic: &str, partition: u32) -> Vec<(u64, serde_json::Value)> {
        let mut out = Vec::new();
        let mut admin = self.admin();
        loop {
            let r = admin.get(&format!(
                "/admin/topics/{topic}/partitions/{partition}/events?from={}&max=1000",
                out.last().map_or(0, |(o, _): &(u64, _)| o + 1)
            ));
            assert_eq!(r.status, 200, "{}", r.text());
            let page: Vec<serde_json::Value> = serde_json::from_slice(&r.body).unwrap();
            if page.is_empty() {
                return out;
            }
            out.extend(page.into_iter().map(|v| (v["offset"].as_u64().unwrap(), v["event"].clone())));
        }
    }
}

impl Drop for TestBroker {
    fn drop(&mut self) {
        self.kill9();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[derive(Debug)]
pub struct Resp {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Resp {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(n, _)| n.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| panic!("{e}: {}", self.text()))
    }
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
    /// Asserts an RFC 9457 problem with `status`.
    pub fn assert_problem(&self, status: u16) {
        assert_eq!(self.status, status, "{}", self.text());
        assert_eq!(self.header("content-type"), Some("application/problem+json"), "{status}");
        assert_eq!(self.json()["status"], status);
    }
}

/// A blocking HTTP/1.1 client on one keep-alive connection.
pub struct Client {
    pub stream: TcpStream,
    reader: BufReader<TcpStream>,
}

impl Client {
    pub fn connect(addr: SocketAddr) -> Client {
        let stream = TcpStream::connect(addr).expect("connect");
        stream.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        let reader = BufReader::new(stream.try_clone().unwrap());
        Client { stream, reader }
    }

    pub fn send_raw(&mut self, bytes: &[u8]) {
        self.stream.write_all(bytes).expect("write");
    }

    /// Reads one response; `None` if the server closed the connection first.
    pub fn read_response(&mut self) -> Option<Resp> {
        read_response_from(&mut self.reader)
    }

    pub fn request(&mut self, method: &str, path: &str, headers: &[(&str, &str)], body: &[u8]) -> Resp {
        self.send_raw(&request_bytes(method, path, headers, body));
        self.read_response().expect("a response")
    }

    pub fn get(&mut self, path: &str) -> Resp {
        self.request("GET", path, &[], b"")
    }

    pub fn post(&mut self, path: &str, content_type: &str, body: &[u8]) -> Resp {
        self.request("POST", path, &[("content-type", content_type)], body)
    }
}

/// Reads one HTTP/1.1 response (with a `content-length` body) from any byte stream (plain or
/// TLS); `None` if the stream ended first. `100 Continue` is skipped.
pub fn read_response_from(reader: &mut impl BufRead) -> Option<Resp> {
    let mut line = String::new();
    if reader.read_line(&mut line).ok()? == 0 {
        return None;
    }
    let status: u16 = line.split(' ').nth(1)?.parse().ok()?;
    let mut headers = Vec::new();
    loop {
        let mut h = String::new();
        reader.read_line(&mut h).ok()?;
        let h = h.trim_end();
        if h.is_empty() {
            break;
        }
        let (n, v) = h.split_once(':')?;
        headers.push((n.trim().to_string(), v.trim().to_string()));
    }
    let len: usize =
        headers.iter().find(|(n, _)| n.eq_ignore_ascii_case("content-length")).map_or(0, |(_, v)| v.parse().unwrap());
    let mut body = vec![0; len];
    reader.read_exact(&mut body).ok()?;
    if status == 100 {
        return read_response_from(reader);
    }
    Some(Resp { status, headers, body })
}

pub fn request_bytes(method: &str, path: &str, headers: &[(&str, &str)], body: &[u8]) -> Vec<u8> {
    let mut r = format!("{method} {path} HTTP/1.1\r\nhost: test\r\ncontent-length: {}\r\n", body.len());
    for (n, v) in headers {
        r.push_str(&format!("{n}: {v}\r\n"));
    }
    r.push_str("\r\n");
    let mut r = r.into_bytes();
    r.extend_from_slice(body);
    r
}

/// Resident memory of a process, from /proc/PID/status.
pub fn rss_bytes(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("proc status");
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS");
    kb * 1024
}

/// A valid structured CloudEvent.
pub fn event(id: &str) -> serde_json::Value {
    serde_json::json!({"specversion": "1.0", "id": id, "source": "/it", "type": "com.example.test", "data": {"n": id}})
}

/// Polls `f` until it returns `Some`, failing after `limit`.
pub fn wait_for<T>(limit: Duration, f: impl FnMut() -> Option<T>) -> T {
    wait_for_or(limit, f).unwrap_or_else(|| panic!("condition not met within {limit:?}"))
}

/// Polls `f` until it returns `Some`, or `None` after `limit` (the caller says what failed).
pub fn wait_for_or<T>(limit: Duration, mut f: impl FnMut() -> Option<T>) -> Option<T> {
    let start = Instant::now();
    loop {
        if let Some(v) = f() {
            return Some(v);
        }
        if start.elapsed() >= limit {
            return None;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// `name` made unique to this test process and call.
pub fn unique(name: &str) -> String {
    static SEQ: AtomicUsize = AtomicUsize::new(0);
    format!("{name}-{}-{}", std::process::id(), SEQ.fetch_add(1, Ordering::Relaxed))
}
