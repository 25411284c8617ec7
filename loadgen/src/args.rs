//! Command-line arguments.

use std::net::{SocketAddr, ToSocketAddrs};
use std::time::Duration;

pub const USAGE: &str = "usage: loadgen --url http://HOST:PORT/PATH?QUERY [--connections 64] [--threads 1]
       [--duration 10s] [--warmup 1s] [--rate 0 (closed loop) | R requests/s (open loop)]
       [--body structured|binary|raw|batch] [--body-bytes 1024] [--batch 10] [--body-file FILE]
       (batch: a CloudEvents JSON batch of --batch structured events of --body-bytes each)
       [--ws [--pipeline 1]]   (publish over WebSocket: --url http://HOST:PORT/events/ws?publish=T,
       one structured event per text message, K messages sent before their K answers are read)
       [--eventmesh-tcp [--pipeline 1]]   (publish over EventMesh's classic TCP protocol: --url
       http://HOST:PORT/TOPIC at tcp_listen, one CloudEvent per ASYNC_MESSAGE_TO_SERVER, K in flight)
       [--server-pid PID] [--json FILE] [--header 'Name: value' ...]
       [--subscribe-url ws://HOST:PORT/PATH?QUERY --subscribers N [--ack]]   (fan-out: N WebSocket
       subscribers (http://: server-sent event streams, counted by their data lines),
       subscribers count deliveries and measure publish-to-delivery latency; --ack: they ack
       every event, one evmesh ack message per read (SSE streams: POST /events/ack on one
       connection per thread, 8 streams' ids each); --reply: they answer every request with a
       reply frame and ack it: request-reply, with --url .../events/request?topic=T)
       `{i}` in --url and --subscribe-url: connection i posts to, subscriber i follows, number
       i % --sessions (default: --subscribers), e.g. /session/publish/s{i} and /session/subscribe/s{i}
       loadgen --serve HOST:PORT   (the direct responder: answers every POST with the reply event)
       loadgen --turns --url http://HOST:PORT --sessions N --rate R [--duration] [--warmup] [--server-pid]
               [--json]   (agent streaming calls: an agent sends R chunks/s over N sessions' turns)";

#[derive(Debug, Clone)]
pub struct Args {
    pub url: String,
    pub addr: SocketAddr,
    pub host: String,
    pub path: String,
    pub connections: usize,
    pub threads: usize,
    pub duration: Duration,
    pub warmup: Duration,
    pub rate: f64,
    pub body: String,
    pub body_bytes: usize,
    /// Events per request with `--body batch`.
    pub batch: usize,
    /// Publish over WebSocket, `pipeline` messages in flight per connection.
    pub ws: bool,
    /// Publish over EventMesh's classic TCP protocol, `pipeline` messages in flight.
    pub eventmesh_tcp: bool,
    pub pipeline: usize,
    pub body_file: Option<String>,
    pub server_pid: Option<u32>,
    pub json: Option<String>,
    /// Fan-out mode: where subscribers attach, as (address, host, path).
    pub subscribe: Option<(SocketAddr, String, String)>,
    pub subscribers: usize,
    /// Subscribers acknowledge what they receive (evmesh acknowledged delivery).
    pub ack: bool,
    /// The subscribers read server-sent event streams (`--subscribe-url http://...`).
    pub sse: bool,
    /// Subscribers answer each request (request-reply) with a reply frame, and ack it.
    pub reply: bool,
    /// How many distinct targets `{i}` in the URL takes (0: as many as subscribers).
    pub sessions: usize,
    /// Extra request header lines (`Name: value`), e.g. `Authorization: Bearer T`.
    pub headers: Vec<String>,
    /// Agent streaming calls instead of publishing (`turns`).
    pub turns: bool,
}

fn duration(s: &str) -> Result<Duration, String> {
    let (num, unit) = s.find(|c: char| c.is_ascii_alphabetic()).map_or((s, "s"), |i| s.split_at(i));
    let v: f64 = num.parse().map_err(|_| format!("bad duration {s:?}"))?;
    let secs = match unit {
        "ms" => v / 1000.0,
        "s" => v,
        "m" => v * 60.0,
        _ => return Err(format!("bad duration unit in {s:?}")),
    };
    Ok(Duration::from_secs_f64(secs))
}

impl Args {
    pub fn parse(mut it: impl Iterator<Item = String>) -> Result<Args, String> {
        let mut a = Args {
            url: String::new(),
            addr: "127.0.0.1:0".parse().unwrap(),
            host: String::new(),
            path: String::new(),
            connections: 64,
            threads: 1,
            duration: Duration::from_secs(10),
            warmup: Duration::from_secs(1),
            rate: 0.0,
            body: "structured".into(),
            body_bytes: 1024,
            batch: 10,
            ws: false,
            eventmesh_tcp: false,
            pipeline: 1,
            body_file: None,
            server_pid: None,
            json: None,
            subscribe: None,
            subscribers: 0,
            ack: false,
            sse: false,
            reply: false,
            sessions: 0,
            headers: Vec::new(),
            turns: false,
        };
        let mut subscribe_url: Option<String> = None;
        while let Some(flag) = it.next() {
            let mut val = || it.next().ok_or_else(|| format!("{flag} needs a value"));
            match flag.as_str() {
                "--url" => a.url = val()?,
                "--connections" | "-c" => a.connections = val()?.parse().map_err(|_| "bad --connections")?,
                "--threads" | "-t" => a.threads = val()?.parse().map_err(|_| "bad --threads")?,
                "--duration" | "-d" => a.duration = duration(&val()?)?,
                "--warmup" => a.warmup = duration(&val()?)?,
                "--rate" | "-R" => a.rate = val()?.parse().map_err(|_| "bad --rate")?,
                "--body" => a.body = val()?,
                "--body-bytes" => a.body_bytes = val()?.parse().map_err(|_| "bad --body-bytes")?,
                "--batch" => a.batch = val()?.parse().map_err(|_| "bad --batch")?,
                "--ws" => a.ws = true,
                "--eventmesh-tcp" => a.eventmesh_tcp = true,
                "--pipeline" => a.pipeline = val()?.parse().map_err(|_| "bad --pipeline")?,
                "--body-file" => a.body_file = Some(val()?),
                "--server-pid" => a.server_pid = Some(val()?.parse().map_err(|_| "bad --server-pid")?),
                "--json" => a.json = Some(val()?),
                "--subscribe-url" => subscribe_url = Some(val()?),
                "--subscribers" => a.subscribers = val()?.parse().map_err(|_| "bad --subscribers")?,
                "--ack" => a.ack = true,
                "--reply" => (a.ack, a.reply) = (true, true),
                "--turns" => a.turns = true,
                "--sessions" => a.sessions = val()?.parse().map_err(|_| "bad --sessions")?,
                "--header" | "-H" => {
                    let h = val()?;
                    if !h.contains(':') || h.contains(['\r', '\n']) {
                        return Err(format!("--header {h:?} is not 'Name: value'"));
                    }
                    a.headers.push(h);
                }
                "--help" | "-h" => return Err("help".into()),
                other => return Err(format!("unknown argument {other}")),
            }
        }
        let rest = a.url.strip_prefix("http://").ok_or("--url must start with http://")?;
        let (hostport, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
        a.host = hostport.to_string();
        a.path = if path.is_empty() { "/".into() } else { path.into() };
        a.addr = hostport.to_socket_addrs().map_err(|e| format!("{hostport}: {e}"))?.next().ok_or("no address")?;
        if let Some(url) = subscribe_url {
            // http://: server-sent event streams rather than WebSockets.
            let (rest, sse) = match url.strip_prefix("http://") {
                Some(rest) => (rest, true),
                None => (url.strip_prefix("ws://").ok_or("--subscribe-url must start with ws:// or http://")?, false),
            };
            a.sse = sse;
            let (hostport, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
            let addr =
                hostport.to_socket_addrs().map_err(|e| format!("{hostport}: {e}"))?.next().ok_or("no address")?;
            a.subscribe = Some((addr, hostport.to_string(), if path.is_empty() { "/".into() } else { path.into() }));
        }
        if a.connections == 0 {
            return Err("--connections must be at least 1".into());
        }
        if !["structured", "binary", "raw", "batch"].contains(&a.body.as_str()) {
            return Err("--body is structured, binary, raw or batch".into());
        }
        if a.batch == 0 {
            return Err("--batch must be at least 1".into());
        }
        if a.turns && a.rate <= 0.0 {
            return Err("--turns needs --rate R (chunks per second in all)".into());
        }
        if a.sessions == 0 {
            a.sessions = a.subscribers.max(1);
        }
        Ok(a)
    }

    pub fn body_kind(&self) -> &str {
        &self.body
    }
}
