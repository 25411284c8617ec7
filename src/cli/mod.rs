//! The command-line side: `evmesh pub`, `evmesh sub`, `evmesh request`, `evmesh stream` and
//! `evmesh agent` (tiny blocking clients for a first tour) and the process's stop signals. Not used by the shards.

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

/// Flags every command takes: where the broker is and how to reach it.
const CONNECTION: [&str; 5] = ["--url", "--token", "--cacert", "--cert", "--key"];

/// A byte stream to the broker, plain or TLS.
trait Conn: Read + Write {}
impl<T: Read + Write> Conn for T {}

/// Refuses flags outside `known` (and [`CONNECTION`]); connects to the broker of `--url`
/// (`http://HOST:PORT`, or `https://HOST:PORT`: TLS, the server verified against `--cacert`,
/// default the system's CA bundle, with the client certificate `--cert`/`--key` if given).
/// Returns the stream, the `HOST:PORT` (the scheme's port when the URL names none), and the
/// socket itself, whose reads time out after 30 s until the caller says otherwise (a handshake
/// or an answer that never comes does not hang the command).
fn broker(args: &[String], known: &[&str]) -> Result<(Box<dyn Conn>, String, TcpStream), String> {
    known_flags(args, known)?;
    let url = flag(args, "--url").unwrap_or("http://127.0.0.1:8080");
    let (tls, hostport) = match (url.strip_prefix("http://"), url.strip_prefix("https://")) {
        (Some(h), _) => (false, h),
        (_, Some(h)) => (true, h),
        _ => return Err("--url must be http://HOST:PORT or https://HOST:PORT".into()),
    };
    let hostport = hostport.trim_end_matches('/');
    let has_port = hostport.rsplit_once(':').is_some_and(|(_, p)| !p.ends_with(']'));
    let hostport = match (has_port, tls) {
        (true, _) => hostport.to_owned(),
        (false, false) => format!("{hostport}:80"),
        (false, true) => format!("{hostport}:443"),
    };
    let stream = TcpStream::connect(&hostport).map_err(|e| format!("connect {hostport}: {e}"))?;
    stream.set_read_timeout(Some(Duration::from_secs(30))).map_err(|e| e.to_string())?;
    let socket = stream.try_clone().map_err(|e| e.to_string())?;
    if !tls {
        return Ok((Box::new(stream), hostport, socket));
    }
    let host = hostport.rsplit_once(':').map_or(hostport.as_str(), |(h, _)| h);
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let config = tls_config(args)?;
    let name = rustls::pki_types::ServerName::try_from(host.to_owned()).map_err(|e| format!("--url host: {e}"))?;
    let conn = rustls::ClientConnection::new(config, name).map_err(|e| e.to_string())?;
    Ok((Box::new(rustls::StreamOwned::new(conn, stream)), hostport, socket))
}

/// Refuses flags outside `known` and [`CONNECTION`].
fn known_flags(args: &[String], known: &[&str]) -> Result<(), String> {
    for a in args.iter().filter(|a| a.starts_with("--")) {
        let name = a.split('=').next().unwrap_or(a);
        if !known.contains(&name) && !CONNECTION.contains(&name) {
            return Err(format!("unknown flag {name}"));
        }
    }
    Ok(())
}

fn tls_config(args: &[String]) -> Result<std::sync::Arc<rustls::ClientConfig>, String> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let ca = flag(args, "--cacert").unwrap_or("/etc/ssl/certs/ca-certificates.crt");
    let mut roots = rustls::RootCertStore::empty();
    let certs = CertificateDer::pem_file_iter(ca).map_err(|e| format!("--cacert {ca}: {e}"))?;
    // A system bundle may hold certificates webpki cannot use: those are skipped, not fatal.
    let (added, _) = roots.add_parsable_certificates(certs.filter_map(Result::ok));
    if added == 0 {
        return Err(format!("--cacert {ca}: no usable CA certificate"));
    }
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots);
    let mut config = match (flag(args, "--cert"), flag(args, "--key")) {
        (Some(cert), Some(key)) => {
            let chain = CertificateDer::pem_file_iter(cert)
                .and_then(|c| c.collect::<Result<Vec<_>, _>>())
                .map_err(|e| format!("--cert {cert}: {e}"))?;
            let key = PrivateKeyDer::from_pem_file(key).map_err(|e| format!("--key {key}: {e}"))?;
            builder.with_client_auth_cert(chain, key).map_err(|e| format!("--cert/--key: {e}"))?
        }
        (None, None) => builder.with_no_client_auth(),
        _ => return Err("--cert and --key go together".into()),
    };
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(std::sync::Arc::new(config))
}

/// The `authorization` header line for `--token T` (or `EVMESH_TOKEN`), if any.
fn auth_line(args: &[String]) -> String {
    let token = flag(args, "--token").map(str::to_owned).or_else(|| std::env::var("EVMESH_TOKEN").ok());
    token.map_or_else(String::new, |t| format!("authorization: Bearer {t}\r\n"))
}

fn new_id() -> String {
    let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    format!("{:x}-{:x}", t.as_nanos(), std::process::id())
}

/// Flags that build the event `evmesh pub` and `evmesh request` send.
const EVENT_FLAGS: [&str; 7] = ["--topic", "--type", "--source", "--id", "--partition-key", "--data", "--data-text"];

/// The structured CloudEvent the flags describe, or the one on stdin when none of `--type`,
/// `--data`, `--data-text` is given.
fn event_from(args: &[String]) -> Result<String, String> {
    if flag(args, "--type").is_none() && flag(args, "--data").is_none() && flag(args, "--data-text").is_none() {
        let mut s = String::new();
        std::io::stdin().read_to_string(&mut s).map_err(|e| format!("stdin: {e}"))?;
        return Ok(s);
    }
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
    Ok(ev.to_string())
}

/// Posts the event of the flags to `path` (`{topic}` replaced by `--topic`), prints the body
/// of the answer; `wait` is how long the answer may take. Errors are the broker's
/// problem+json (printed) with its status, or the I/O failure.
fn post_event(args: &[String], known: &[&str], path: &str, wait: Duration) -> Result<(), String> {
    known_flags(args, known)?;
    let topic = flag(args, "--topic").ok_or("--topic is required")?;
    let event = event_from(args)?;
    let path = path.replace("{topic}", topic);
    let (status, body) = post(args, known, &path, ("application/cloudevents+json", event.as_bytes()), wait)?;
    println!("{body}");
    if status.starts_with('2') {
        Ok(())
    } else {
        Err(format!("HTTP {status}"))
    }
}

/// Posts `body` to `path` on a connection of its own: (the answer's status, its body).
fn post(
    args: &[String],
    known: &[&str],
    path: &str,
    body: (&str, &[u8]),
    wait: Duration,
) -> Result<(String, String), String> {
    post_head(args, known, path, body, wait).map(|(status, _, body)| (status, body))
}

/// [`post`], following the broker's redirects (with many instances, what an agent does is
/// served by its home instance: 307 there) up to [`MAX_REDIRECTS`] times: (the flags, their
/// `--url` now the instance that answered, the status, the body).
fn post_following(
    args: &[String],
    known: &[&str],
    path: &str,
    body: (&str, &[u8]),
    wait: Duration,
) -> Result<(Vec<String>, String, String), String> {
    let (mut args, mut path) = (args.to_vec(), path.to_owned());
    for hop in 0.. {
        let (status, head, answer) = post_head(&args, known, &path, body, wait)?;
        match (status.as_str(), location(&head)) {
            ("307" | "308", Some(at)) if hop < MAX_REDIRECTS => (args, path) = followed(args, &at)?,
            _ => return Ok((args, status, answer)),
        }
    }
    unreachable!("the loop returns")
}

/// The `Location` of an answer's head.
fn location(head: &str) -> Option<String> {
    head.lines().find_map(|l| {
        l.split_once(':').filter(|(n, _)| n.eq_ignore_ascii_case("location")).map(|(_, v)| v.trim().to_owned())
    })
}

/// The flags with `--url` the origin of `location`, where the broker sent the client, and the
/// path (with its query: the broker's mark that it sent the client on) to ask there. The token
/// and certificate go along (the home is of the same cluster), but never from https to plain
/// http.
fn followed(mut args: Vec<String>, location: &str) -> Result<(Vec<String>, String), String> {
    let origin = location.find("://").map(|i| {
        let rest = &location[i + 3..];
        &location[..i + 3 + rest.find('/').unwrap_or(rest.len())]
    });
    let origin = origin.ok_or_else(|| format!("the broker redirected to {location:?}"))?;
    let https = flag(&args, "--url").is_some_and(|u| u.starts_with("https://"));
    if https && !origin.starts_with("https://") {
        return Err(format!("the broker redirected from https to {origin}; not followed"));
    }
    eprintln!("evmesh: served at {origin}; following");
    let at = args.iter().position(|a| a == "--url");
    args.retain(|a| !a.starts_with("--url="));
    match at {
        Some(i) if i + 1 < args.len() => args[i + 1] = origin.to_owned(),
        _ => args.extend(["--url".to_owned(), origin.to_owned()]),
    }
    let target = match &location[origin.len()..] {
        "" => "/",
        t => t,
    };
    Ok((args, target.to_owned()))
}

/// Posts `body` to `path` on a connection of its own: (the answer's status, its head, its body).
fn post_head(
    args: &[String],
    known: &[&str],
    path: &str,
    (content_type, body): (&str, &[u8]),
    wait: Duration,
) -> Result<(String, String, String), String> {
    let (mut stream, hostport, socket) = broker(args, known)?;
    socket.set_read_timeout(Some(wait)).map_err(|e| e.to_string())?;
    let head = format!(
        "POST {path} HTTP/1.1\r\nhost: {hostport}\r\n{}content-type: {content_type}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
        auth_line(args),
        body.len()
    );
    stream.write_all(head.as_bytes()).and_then(|()| stream.write_all(body)).map_err(|e| e.to_string())?;
    let mut resp = Vec::new();
    // A TLS server may end without close_notify after `connection: close`: what came is the answer.
    if let Err(e) = stream.read_to_end(&mut resp) {
        if resp.is_empty() || e.kind() != std::io::ErrorKind::UnexpectedEof {
            return Err(e.to_string());
        }
    }
    let resp = String::from_utf8_lossy(&resp);
    let (head, body) = resp.split_once("\r\n\r\n").ok_or("malformed response")?;
    Ok((head.split(' ').nth(1).unwrap_or("?").to_owned(), head.to_owned(), body.to_owned()))
}

/// `evmesh pub`: builds a structured CloudEvent from flags (or reads one from stdin), posts it,
/// prints the broker's answer.
pub fn publish(args: &[String]) -> Result<(), String> {
    post_event(args, &EVENT_FLAGS, "/events/publish?topic={topic}", Duration::from_secs(30))
}

/// `evmesh request`: sends the event as a request (`POST /events/request`) and prints the reply
/// (structured mode), or the 504 once `--timeout-ms` (default 30000) passed without one.
pub fn request(args: &[String]) -> Result<(), String> {
    let known: Vec<&str> = EVENT_FLAGS.iter().copied().chain(["--timeout-ms"]).collect();
    let ms: u64 = match flag(args, "--timeout-ms") {
        None => 30_000,
        Some(v) => v.parse().ok().filter(|&n| n > 0).ok_or("--timeout-ms must be a positive number")?,
    };
    let path = format!("/events/request?topic={{topic}}&timeoutMs={ms}");
    post_event(args, &known, &path, Duration::from_millis(ms) + Duration::from_secs(10))
}

/// A blocking client-side WebSocket reader for `evmesh sub` (server frames are unmasked; ours
/// are masked, as RFC 6455 requires of clients).
mod wsclient {
    use std::io::{Read, Write};

    pub enum Frame {
        Text(String),
        Ping(Vec<u8>),
        Close(u16),
        Other,
    }

    pub fn send(s: &mut impl Write, opcode: u8, payload: &[u8]) -> std::io::Result<()> {
        let mask = (std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_nanos()
            as u32)
            .to_be_bytes();
        let mut out = vec![0x80 | opcode];
        match payload.len() {
            n @ 0..=125 => out.push(0x80 | n as u8),
            n @ 126..=0xffff => {
                out.push(0x80 | 126);
                out.extend_from_slice(&(n as u16).to_be_bytes());
            }
            n => {
                out.push(0x80 | 127);
                out.extend_from_slice(&(n as u64).to_be_bytes());
            }
        }
        out.extend_from_slice(&mask);
        out.extend(payload.iter().enumerate().map(|(i, b)| b ^ mask[i % 4]));
        s.write_all(&out)
    }

    pub fn read(s: &mut impl Read) -> std::io::Result<Frame> {
        let mut h = [0u8; 2];
        s.read_exact(&mut h)?;
        let len = match h[1] & 0x7f {
            126 => {
                let mut b = [0u8; 2];
                s.read_exact(&mut b)?;
                u16::from_be_bytes(b) as usize
            }
            127 => {
                let mut b = [0u8; 8];
                s.read_exact(&mut b)?;
                usize::try_from(u64::from_be_bytes(b)).unwrap_or(usize::MAX)
            }
            n => n as usize,
        };
        if len > 64 << 20 {
            return Err(std::io::Error::other("frame over 64 MiB"));
        }
        let mut payload = vec![0u8; len];
        s.read_exact(&mut payload)?;
        Ok(match h[0] & 0x0f {
            1 => Frame::Text(String::from_utf8_lossy(&payload).into_owned()),
            8 => Frame::Close(payload.get(..2).map_or(1005, |c| u16::from_be_bytes([c[0], c[1]]))),
            9 => Frame::Ping(payload),
            _ => Frame::Other,
        })
    }
}

/// `--max N`, if given.
fn max_flag(args: &[String]) -> Result<Option<u64>, String> {
    flag(args, "--max").map(|m| m.parse().map_err(|_| "--max must be a number".to_owned())).transpose()
}

/// Asks for a WebSocket session at `path` (subprotocol `cloudevents.json`) and reads the answer.
fn attach(
    args: &[String],
    s: &mut Box<dyn Conn>,
    socket: &TcpStream,
    path: &str,
    hostport: &str,
) -> Result<(), String> {
    let req = format!(
        "GET {path} HTTP/1.1\r\nhost: {hostport}\r\n{}upgrade: websocket\r\nconnection: Upgrade\r\nsec-websocket-key: ZXZtZXNoLXN1Yi0xNmJ5dA==\r\nsec-websocket-version: 13\r\nsec-websocket-protocol: cloudevents.json\r\n\r\n",
        auth_line(args)
    );
    s.write_all(req.as_bytes()).map_err(|e| e.to_string())?;
    upgraded(s, socket)
}

/// How [`upgraded`] says the broker sent the client elsewhere (the rest is the `Location`).
const REDIRECT: &str = "redirected to ";

/// Redirects followed at most.
const MAX_REDIRECTS: usize = 3;

/// Attaches a WebSocket at `path`, following the broker's redirects (a subscription, a session
/// or an agent served by its home instance: 307 there) up to [`MAX_REDIRECTS`] times: the
/// connection attached.
fn attach_following(args: &[String], known: &[&str], path: &str) -> Result<Box<dyn Conn>, String> {
    let (mut args, mut path) = (args.to_vec(), path.to_owned());
    for hop in 0.. {
        let (mut s, hostport, socket) = broker(&args, known)?;
        match attach(&args, &mut s, &socket, &path, &hostport) {
            Ok(()) => return Ok(s),
            Err(e) => match e.strip_prefix(REDIRECT) {
                Some(location) if hop < MAX_REDIRECTS => (args, path) = followed(args, location)?,
                _ => return Err(e),
            },
        }
    }
    unreachable!("the loop returns")
}

/// Reads the answer to a WebSocket upgrade request: `Ok` on the 101 (reads then wait as long
/// as the broker is silent); a redirect is the error [`REDIRECT`] and its location; otherwise
/// the refusal's body is printed and its status is the error.
fn upgraded(s: &mut Box<dyn Conn>, socket: &TcpStream) -> Result<(), String> {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        s.read_exact(&mut byte).map_err(|e| format!("reading the handshake: {e}"))?;
        head.push(byte[0]);
        if head.len() > 16 * 1024 {
            return Err("handshake answer too long".into());
        }
    }
    let head = String::from_utf8_lossy(&head).into_owned();
    if head.starts_with("HTTP/1.1 101") {
        return socket.set_read_timeout(None).map_err(|e| e.to_string());
    }
    let status = head.split(' ').nth(1).unwrap_or("?").to_owned();
    if let (Some(location), "307" | "308") = (location(&head), status.as_str()) {
        return Err(format!("{REDIRECT}{location}"));
    }
    let len: usize = head
        .lines()
        .find_map(|l| {
            l.split_once(':').filter(|(n, _)| n.eq_ignore_ascii_case("content-length")).map(|(_, v)| v.trim())
        })
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let mut body = vec![0u8; len.min(64 * 1024)];
    let _ = s.read_exact(&mut body);
    println!("{}", String::from_utf8_lossy(&body));
    Err(format!("HTTP {status}"))
}

/// `evmesh stream --session S`: follows a session (its lite topic `session.<S>`) over
/// WebSocket from its head and prints one JSON line per event; `--max N` stops after N.
pub fn stream(args: &[String]) -> Result<(), String> {
    let known = ["--session", "--max"];
    known_flags(args, &known)?;
    let sid = flag(args, "--session").ok_or("--session is required")?;
    let max = max_flag(args)?;
    let mut s = attach_following(args, &known, &format!("/session/subscribe/{sid}"))?;
    print_frames(&mut s, max, |_, _| Ok(false))
}

/// Prints each text frame as a line until `max` of them, a close, or an error; `after` runs on
/// each printed frame (an ack, say), and `Ok(true)` from it ends the session too.
fn print_frames(
    s: &mut Box<dyn Conn>,
    max: Option<u64>,
    mut after: impl FnMut(&mut Box<dyn Conn>, &str) -> Result<bool, String>,
) -> Result<(), String> {
    let stdout = std::io::stdout();
    let mut seen = 0u64;
    loop {
        match wsclient::read(s).map_err(|e| format!("reading: {e}"))? {
            wsclient::Frame::Text(t) => {
                let mut out = stdout.lock();
                writeln!(out, "{t}").map_err(|e| e.to_string())?;
                out.flush().map_err(|e| e.to_string())?;
                let stop = after(s, &t)?;
                seen += 1;
                if stop || max.is_some_and(|m| seen >= m) {
                    let _ = wsclient::send(s, 8, &1000u16.to_be_bytes());
                    return Ok(());
                }
            }
            wsclient::Frame::Ping(p) => wsclient::send(s, 10, &p).map_err(|e| e.to_string())?,
            wsclient::Frame::Close(code) => {
                let _ = wsclient::send(s, 8, &code.to_be_bytes());
                return if code == 1000 { Ok(()) } else { Err(format!("closed by the broker with {code}")) };
            }
            wsclient::Frame::Other => {}
        }
    }
}

/// `evmesh sub`: follows a subscription over WebSocket and prints one JSON line per event.
/// Each event is acknowledged once printed (at-least-once: a crash before the ack means it is
/// delivered again); `--no-ack` attaches with `ack=none` (BROADCAST live fan-out) instead.
/// `--client-id C` names the client of a BROADCAST or MULTICAST subscription, so its offsets are
/// kept between runs. `--max N` stops after N events.
pub fn subscribe(args: &[String]) -> Result<(), String> {
    let no_ack = args.iter().any(|a| a == "--no-ack");
    let rest: Vec<String> = args.iter().filter(|a| *a != "--no-ack").cloned().collect();
    let args = &rest[..];
    let known = ["--subscription", "--max", "--client-id"];
    known_flags(args, &known)?;
    let sub = flag(args, "--subscription").ok_or("--subscription is required")?;
    let mut query = format!("subscription={sub}");
    if no_ack {
        query.push_str("&ack=none");
    }
    if let Some(c) = flag(args, "--client-id") {
        query.push_str(&format!("&clientId={c}"));
    }
    let max = max_flag(args)?;
    let mut s = attach_following(args, &known, &format!("/events/ws?{query}"))?;
    print_frames(&mut s, max, |s, t| {
        if no_ack {
            return Ok(false);
        }
        let id = serde_json::from_str::<serde_json::Value>(t)
            .ok()
            .and_then(|v| v.get("emdeliveryid").and_then(|i| i.as_str()).map(str::to_owned));
        match id {
            Some(id) => {
                let ack = serde_json::json!({"type": "ack", "ids": [id]}).to_string();
                wsclient::send(s, 1, ack.as_bytes()).map(|()| false).map_err(|e| e.to_string())
            }
            None => Ok(false),
        }
    })
}

/// `evmesh agent --agent-id A`: a tiny streaming agent for the tour and tests. It registers,
/// heart-beats (a thread, every third of `--heartbeat-ms`, default 30000), attaches over
/// `GET /agent/ws`, and answers each turn by echoing the prompt back a word per chunk (`--delay-ms`
/// apart, default 0), then a last chunk with `done`. It prints each event it gets (a turn's
/// request, a client's cancel...) as a JSON line; `--max-turns N` stops after N turns.
pub fn agent(args: &[String]) -> Result<(), String> {
    const KNOWN: [&str; 4] = ["--agent-id", "--delay-ms", "--max-turns", "--heartbeat-ms"];
    let id = flag(args, "--agent-id").ok_or("--agent-id is required")?.to_owned();
    let number = |name: &str, default: u64| -> Result<u64, String> {
        flag(args, name).map_or(Ok(default), |v| v.parse().map_err(|_| format!("{name} must be a number")))
    };
    let delay = Duration::from_millis(number("--delay-ms", 0)?);
    let beat = Duration::from_millis(number("--heartbeat-ms", 30_000)?.max(3) / 3);
    let max_turns = flag(args, "--max-turns").map(|_| number("--max-turns", 0)).transpose()?;
    let body = serde_json::json!({"agentId": id}).to_string();
    let wait = Duration::from_secs(30);
    // With many instances, registered (and then heart-beating and attached) at its home.
    let registering = ("application/json", body.as_bytes());
    let (args, status, answer) = post_following(args, &KNOWN, "/agent/register", registering, wait)?;
    let args = &args[..];
    if !status.starts_with('2') {
        println!("{answer}");
        return Err(format!("registering: HTTP {status}"));
    }
    let beats = args.to_vec();
    std::thread::spawn(move || loop {
        std::thread::sleep(beat);
        match post(&beats, &KNOWN, "/agent/heartbeat", ("application/json", body.as_bytes()), wait) {
            Ok((status, _)) if status.starts_with('2') => {}
            // Another instance is its home now (307), or it was forgotten (404): the broker
            // closes its WebSocket too, and it ends.
            Ok((status, answer)) => eprintln!("evmesh agent: heartbeat: HTTP {status} {answer}"),
            Err(e) => eprintln!("evmesh agent: heartbeat: {e}"),
        }
    });
    let mut s = attach_following(args, &KNOWN, &format!("/agent/ws?agentId={id}"))?;
    eprintln!("evmesh agent: {id} attached; echoing each turn's prompt back");
    let mut turns = 0u64;
    print_frames(&mut s, None, |s, t| {
        let e: serde_json::Value = serde_json::from_str(t).map_err(|e| format!("not JSON: {e}"))?;
        if e["type"] != "evmesh.stream.request" {
            return Ok(false);
        }
        let sid = e["emsessionid"].as_str().unwrap_or_default();
        let prompt = match &e["data"] {
            serde_json::Value::String(p) => p.clone(),
            serde_json::Value::Null => String::new(),
            other => other.to_string(),
        };
        let mut send = |chunk: serde_json::Value| wsclient::send(s, 1, chunk.to_string().as_bytes());
        for (seq, word) in prompt.split_whitespace().enumerate() {
            let data = if seq == 0 { word.to_owned() } else { format!(" {word}") };
            send(serde_json::json!({"type": "chunk", "sessionId": sid, "seq": seq, "data": data}))
                .map_err(|e| e.to_string())?;
            std::thread::sleep(delay);
        }
        let seq = prompt.split_whitespace().count();
        send(serde_json::json!({"type": "chunk", "sessionId": sid, "seq": seq, "done": true}))
            .map_err(|e| e.to_string())?;
        turns += 1;
        Ok(max_turns.is_some_and(|m| turns >= m))
    })
}

#[cfg(test)]
mod tests {
    use super::wsclient;

    /// Each payload length takes its RFC 6455 form (7 bits, 16 or 64), masked.
    #[test]
    fn client_frames_carry_their_length_in_its_form() {
        for (len, head) in [(125usize, 2usize), (126, 4), (65_535, 4), (65_536, 10), (70_000, 10)] {
            let mut out = Vec::new();
            wsclient::send(&mut out, 1, &vec![b'x'; len]).unwrap();
            assert_eq!(out.len(), head + 4 + len, "{len}");
            let decoded = match out[1] & 0x7f {
                126 => u16::from_be_bytes([out[2], out[3]]) as usize,
                127 => u64::from_be_bytes(out[2..10].try_into().unwrap()) as usize,
                n => n as usize,
            };
            assert_eq!((decoded, out[1] & 0x80), (len, 0x80));
        }
    }
}
