//! TLS on both listeners, against rustls clients: keep-alive publishing, WebSocket delivery on
//! both I/O drivers, certificate reload on SIGHUP, mutual TLS (the certificate subject is the
//! principal), and handshakes that stall or are garbage. Python's `ssl` and `openssl s_client`
//! are in `interop::tls_with_python_ssl_and_openssl_s_client`.

use std::io::{BufReader, Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, SanType};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::{ClientConfig, ClientConnection, RootCertStore, StreamOwned};
use serde_json::{json, Value};
use tungstenite::Message;

use super::util::{event, read_response_from, request_bytes, wait_for, Resp, TestBroker};

/// A certificate authority of the test's own, which issues the server's and the clients'
/// certificates into a directory as PEM files.
pub struct Pki {
    pub dir: PathBuf,
    issuer: Issuer<'static, KeyPair>,
}

impl Pki {
    pub fn new(dir: &Path, name: &str) -> Pki {
        std::fs::create_dir_all(dir).unwrap();
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::default();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        let cert = params.self_signed(&key).unwrap();
        std::fs::write(dir.join(format!("{name}.pem")), cert.pem()).unwrap();
        Pki { dir: dir.to_owned(), issuer: Issuer::new(params, key) }
    }

    /// Issues a certificate for `cn` (a server one for localhost and 127.0.0.1 too); writes
    /// `<file>.pem` and `<file>.key` and returns their paths.
    pub fn issue(&self, cn: &str, file: &str) -> (PathBuf, PathBuf) {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(vec!["localhost".to_owned()]).unwrap();
        params.subject_alt_names.push(SanType::IpAddress(IpAddr::V4(Ipv4Addr::LOCALHOST)));
        params.distinguished_name.push(DnType::CommonName, cn);
        params.distinguished_name.push(DnType::OrganizationName, "evmesh tests");
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        let (c, k) = (self.dir.join(format!("{file}.pem")), self.dir.join(format!("{file}.key")));
        std::fs::write(&c, cert.pem()).unwrap();
        std::fs::write(&k, key.serialize_pem()).unwrap();
        (c, k)
    }
}

pub type Tls = StreamOwned<ClientConnection, TcpStream>;

/// A rustls client trusting `ca` (a PEM file), with a client certificate if given; every
/// connection a full handshake.
fn client_config(ca: &Path, identity: Option<&(PathBuf, PathBuf)>) -> Arc<ClientConfig> {
    let mut config = resuming_client_config(ca, identity);
    // A resumed session shows the certificate of the session it resumes, not the one in force.
    Arc::get_mut(&mut config).unwrap().resumption = rustls::client::Resumption::disabled();
    config
}

/// [`client_config`] that resumes sessions (TLS 1.3 tickets) when the server offers them.
fn resuming_client_config(ca: &Path, identity: Option<&(PathBuf, PathBuf)>) -> Arc<ClientConfig> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = RootCertStore::empty();
    roots.add(CertificateDer::from_pem_file(ca).unwrap()).unwrap();
    let builder = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots);
    let mut config = match identity {
        Some((cert, key)) => {
            let chain = CertificateDer::pem_file_iter(cert).unwrap().collect::<Result<Vec<_>, _>>().unwrap();
            builder.with_client_auth_cert(chain, PrivateKeyDer::from_pem_file(key).unwrap()).unwrap()
        }
        None => builder.with_no_client_auth(),
    };
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Arc::new(config)
}

/// Connects and completes the handshake (an error if the server refuses it).
fn connect(addr: SocketAddr, config: &Arc<ClientConfig>) -> std::io::Result<Tls> {
    let tcp = TcpStream::connect(addr)?;
    tcp.set_read_timeout(Some(Duration::from_secs(20)))?;
    let conn = ClientConnection::new(config.clone(), ServerName::try_from("localhost").unwrap()).unwrap();
    let mut tls = StreamOwned::new(conn, tcp);
    while tls.conn.is_handshaking() {
        tls.conn.complete_io(&mut tls.sock)?;
    }
    // A TLS 1.3 server refuses a client certificate after the client's last flight: a request
    // and its answer tell whether the session really stands.
    Ok(tls)
}

/// One request on a TLS connection; `None` if the server ended the session instead.
fn request(tls: &mut Tls, method: &str, path: &str, headers: &[(&str, &str)], body: &[u8]) -> Option<Resp> {
    tls.write_all(&request_bytes(method, path, headers, body)).ok()?;
    read_response_from(&mut BufReader::with_capacity(1, &mut *tls))
}

fn publish(tls: &mut Tls, topic: &str, e: &Value) -> Resp {
    publish_or_none(tls, topic, e).expect("a response")
}

/// The ids of the events stored in `topic` (two partitions: the test broker has two shards).
fn stored_ids(admin: &mut Tls, topic: &str) -> Vec<String> {
    let mut ids = Vec::new();
    for p in 0..2 {
        let r =
            request(admin, "GET", &format!("/admin/topics/{topic}/partitions/{p}/events?from=0&max=1000"), &[], b"");
        let r = r.expect("a response");
        assert_eq!(r.status, 200, "{}", r.text());
        let page: Vec<Value> = serde_json::from_slice(&r.body).unwrap();
        ids.extend(page.iter().map(|v| v["event"]["id"].as_str().unwrap().to_owned()));
    }
    ids.sort();
    ids
}

/// Creates a subscription (201) over a TLS connection.
fn subscribe(tls: &mut Tls, def: &Value) {
    let r =
        request(tls, "POST", "/events/subscribe", &[("content-type", "application/json")], def.to_string().as_bytes());
    assert_eq!(r.expect("a response").status, 201);
}

/// The subject of the certificate the server presented.
fn server_cn(tls: &Tls) -> String {
    use x509_cert::der::Decode;
    let leaf = &tls.conn.peer_certificates().unwrap()[0];
    let cert = x509_cert::Certificate::from_der(leaf.as_ref()).unwrap();
    cert.tbs_certificate().subject().common_name().unwrap().unwrap().value().into_owned()
}

/// A broker serving TLS with a server certificate from a fresh CA, plus `extra` flags.
fn tls_broker(name: &str, extra: &[&str]) -> (TestBroker, Pki) {
    let pki = test_pki(name);
    (start_tls(&pki, false, extra), pki)
}

/// A fresh CA (`ca.pem`) in a directory of the test's own, with the server's certificate
/// (`server-a`, in `server.pem` and `server.key`).
fn test_pki(name: &str) -> Pki {
    let dir = std::env::temp_dir().join(format!("evmesh-tls-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let pki = Pki::new(&dir, "ca");
    pki.issue("server-a", "server");
    pki
}

/// A broker serving TLS with `pki`'s server certificate; with `mtls`, every client must present
/// a certificate of the CA too (`tls_client_ca` is `clients.pem`, a copy of `ca.pem` a test may
/// replace). `extra` flags follow.
fn start_tls(pki: &Pki, mtls: bool, extra: &[&str]) -> TestBroker {
    let (cert, key, clients) = (pki.dir.join("server.pem"), pki.dir.join("server.key"), pki.dir.join("clients.pem"));
    let mut args = vec!["--tls-cert", cert.to_str().unwrap(), "--tls-key", key.to_str().unwrap()];
    if mtls {
        std::fs::copy(pki.dir.join("ca.pem"), &clients).unwrap();
        args.extend(["--tls-client-ca", clients.to_str().unwrap()]);
    }
    args.extend_from_slice(extra);
    TestBroker::start(&args)
}

/// How many handshakes the broker saw fail, from its metrics (read over TLS).
fn handshakes_failed(b: &TestBroker, config: &Arc<ClientConfig>) -> u64 {
    let mut admin = connect(b.admin, config).unwrap();
    let text = request(&mut admin, "GET", "/metrics", &[], b"").unwrap().text();
    text.lines()
        .find_map(|l| l.strip_prefix("evmesh_tls_handshakes_failed_total "))
        .expect("the handshake failure counter")
        .parse()
        .unwrap()
}

fn keep_alive_publishing_on_both_listeners(driver: &str) {
    let (b, pki) = tls_broker(&format!("keepalive-{driver}"), &["--io-driver", driver]);
    let config = client_config(&pki.dir.join("ca.pem"), None);
    let mut tls = connect(b.traffic, &config).unwrap();
    assert_eq!(tls.conn.alpn_protocol(), Some(&b"http/1.1"[..]), "ALPN names http/1.1");
    assert_eq!(server_cn(&tls), "server-a");
    for i in 0..50 {
        assert_eq!(publish(&mut tls, "secure", &event(&format!("e{i}"))).status, 202);
    }
    // A body of many TLS records (and more than one read of ours) arrives whole.
    let mut big = event("big");
    big["data"] = json!({"blob": "x".repeat(600 * 1024)});
    assert_eq!(publish(&mut tls, "secure", &big).status, 202);
    // The admin listener speaks TLS too, with the same certificate.
    let mut admin = connect(b.admin, &config).unwrap();
    let ids = stored_ids(&mut admin, "secure");
    assert_eq!(ids.len(), 51, "every event published over TLS is stored");
    assert!(ids.contains(&"big".to_owned()));
    // Plain HTTP to a TLS port gets no answer in HTTP, the handshake fails and is counted.
    let before = handshakes_failed(&b, &config);
    let mut plain = TcpStream::connect(b.traffic).unwrap();
    plain.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    plain.write_all(&request_bytes("GET", "/healthz", &[], b"")).unwrap();
    let mut back = Vec::new();
    let _ = plain.read_to_end(&mut back);
    assert!(!back.starts_with(b"HTTP/"), "plain HTTP is not served on a TLS listener");
    wait_for(Duration::from_secs(5), || (handshakes_failed(&b, &config) > before).then_some(()));
    // The first connection is unaffected.
    assert_eq!(publish(&mut tls, "secure", &event("after")).status, 202);
}

#[test]
fn keep_alive_publishing_over_tls_on_both_listeners_epoll() {
    keep_alive_publishing_on_both_listeners("epoll");
}

#[test]
fn keep_alive_publishing_over_tls_on_both_listeners_uring() {
    keep_alive_publishing_on_both_listeners("uring");
}

/// A WebSocket session over TLS reads acks while its writer pushes events: the two halves of
/// one TLS session run at once (the fan-out that once killed a shard on io_uring).
fn websocket_delivery(driver: &str) {
    let (b, pki) = tls_broker(&format!("ws-{driver}"), &["--io-driver", driver]);
    let config = client_config(&pki.dir.join("ca.pem"), None);
    let mut http = connect(b.traffic, &config).unwrap();
    let def = json!({"subscription": "s", "topic": "feed", "mode": "LOAD_BALANCE"});
    subscribe(&mut http, &def);
    let tls = connect(b.traffic, &config).unwrap();
    let (mut ws, _) =
        tungstenite::client(format!("wss://localhost:{}/events/ws?subscription=s", b.traffic.port()), tls)
            .expect("a WebSocket session over TLS");
    const N: usize = 400;
    let mut body = Vec::new();
    for i in 0..N {
        body.push(event(&format!("w{i}")));
    }
    for chunk in body.chunks(100) {
        let batch = Value::Array(chunk.to_vec()).to_string();
        let r = request(
            &mut http,
            "POST",
            "/events/publish?topic=feed",
            &[("content-type", "application/cloudevents-batch+json")],
            batch.as_bytes(),
        );
        assert_eq!(r.unwrap().status, 202);
    }
    let mut seen = std::collections::HashSet::new();
    let start = Instant::now();
    while seen.len() < N {
        assert!(start.elapsed() < Duration::from_secs(30), "{} of {N} events arrived", seen.len());
        if let Message::Text(t) = ws.read().expect("the session stays up") {
            let e: Value = serde_json::from_str(t.as_str()).unwrap();
            seen.insert(e["id"].as_str().unwrap().to_owned());
            // Each ack goes in while more events come out.
            ws.send(Message::text(json!({"type": "ack", "ids": [e["emdeliveryid"]]}).to_string())).unwrap();
        }
    }
    // Everything was acked: a session attached after this one gets nothing again.
    ws.close(None).unwrap();
    let tls = connect(b.traffic, &config).unwrap();
    let (mut again, _) =
        tungstenite::client(format!("wss://localhost:{}/events/ws?subscription=s", b.traffic.port()), tls).unwrap();
    again.get_mut().sock.set_read_timeout(Some(Duration::from_millis(500))).unwrap();
    if let Ok(Message::Text(t)) = again.read() {
        panic!("an acked event came again: {t}");
    }
}

#[test]
fn websocket_delivery_over_tls_epoll() {
    websocket_delivery("epoll");
}

#[test]
fn websocket_delivery_over_tls_uring() {
    websocket_delivery("uring");
}

#[test]
fn sighup_reloads_the_certificate_and_keeps_open_sessions() {
    let (b, pki) = tls_broker("reload", &[]);
    let config = client_config(&pki.dir.join("ca.pem"), None);
    let mut before = connect(b.traffic, &config).unwrap();
    assert_eq!(server_cn(&before), "server-a");
    // New files in place, then SIGHUP.
    pki.issue("server-b", "server");
    let hup = |b: &TestBroker| {
        assert!(std::process::Command::new("kill").args(["-HUP", &b.pid().to_string()]).status().unwrap().success());
    };
    hup(&b);
    wait_for(Duration::from_secs(10), || {
        let t = connect(b.traffic, &config).ok()?;
        (server_cn(&t) == "server-b").then_some(())
    });
    assert_eq!(server_cn(&connect(b.admin, &config).unwrap()), "server-b", "both listeners");
    // The session opened before goes on with its certificate.
    assert_eq!(publish(&mut before, "t", &event("old-session")).status, 202);
    // A key that does not fit leaves the certificate in force, and the broker up.
    std::fs::write(pki.dir.join("server.key"), KeyPair::generate().unwrap().serialize_pem()).unwrap();
    hup(&b);
    let mut admin = connect(b.admin, &config).unwrap();
    wait_for(Duration::from_secs(10), || {
        let m = request(&mut admin, "GET", "/metrics", &[], b"")?.text();
        m.lines().any(|l| l == "evmesh_tls_reloads_failed_total 1").then_some(())
    });
    let mut after = connect(b.traffic, &config).unwrap();
    assert_eq!(server_cn(&after), "server-b");
    assert_eq!(publish(&mut after, "t", &event("after-bad-reload")).status, 202);
}

#[test]
fn mutual_tls_makes_the_certificate_subject_the_principal() {
    let pki = test_pki("mtls");
    let dir = pki.dir.clone();
    let ingest = pki.issue("svc-ingest", "svc-ingest");
    let intruder = pki.issue("intruder", "intruder");
    let ops = pki.issue("ops", "ops");
    let rogue = Pki::new(&dir.join("rogue"), "rogue-ca").issue("svc-ingest", "rogue-ingest");
    let acl = r#"
[[acl]]
id = "ingest"
principal = "svc-ingest"
resource = "topic:orders.*"
actions = ["PUBLISH"]
effect = "ALLOW"
priority = 10

[[acl]]
id = "ops"
principal = "ops"
resource = "admin"
actions = ["ADMIN"]
effect = "ALLOW"
priority = 10
"#;
    std::fs::write(dir.join("evmesh.toml"), acl).unwrap();
    std::fs::write(dir.join("tokens.jsonl"), "").unwrap();
    let ca = dir.join("ca.pem");
    let (config, tokens) = (dir.join("evmesh.toml"), dir.join("tokens.jsonl"));
    let auth =
        ["--config", config.to_str().unwrap(), "--auth", "token", "--auth-tokens-file", tokens.to_str().unwrap()];
    let b = start_tls(&pki, true, &auth);
    // The certificate's subject is the principal: allowed where the ACL says, denied elsewhere.
    let mut svc = connect(b.traffic, &client_config(&ca, Some(&ingest))).unwrap();
    assert_eq!(publish(&mut svc, "orders.eu", &event("o1")).status, 202);
    let r = publish(&mut svc, "payments", &event("p1"));
    r.assert_problem(403);
    assert!(r.json()["detail"].as_str().unwrap().contains("svc-ingest"), "{}", r.text());
    let mut other = connect(b.traffic, &client_config(&ca, Some(&intruder))).unwrap();
    publish(&mut other, "orders.eu", &event("o2")).assert_problem(403);
    // On the admin listener an ADMIN principal's certificate is its credential.
    let mut admin = connect(b.admin, &client_config(&ca, Some(&ops))).unwrap();
    assert_eq!(request(&mut admin, "GET", "/admin/acl", &[], b"").unwrap().status, 200);
    let mut not_admin = connect(b.admin, &client_config(&ca, Some(&ingest))).unwrap();
    request(&mut not_admin, "GET", "/admin/acl", &[], b"").unwrap().assert_problem(403);
    // No certificate, or one from another CA: the session never stands.
    for identity in [None, Some(&rogue)] {
        let refused = connect(b.traffic, &client_config(&ca, identity))
            .ok()
            .and_then(|mut t| publish_or_none(&mut t, "orders.eu", &event("o3")));
        assert!(refused.is_none(), "a client without a certificate of the CA is refused: {refused:?}");
    }
    // Only what the allowed principal sent was stored.
    let mut admin = connect(b.admin, &client_config(&ca, Some(&ops))).unwrap();
    assert_eq!(stored_ids(&mut admin, "orders.eu"), ["o1"]);
}

fn publish_or_none(tls: &mut Tls, topic: &str, e: &Value) -> Option<Resp> {
    let body = e.to_string();
    request(
        tls,
        "POST",
        &format!("/events/publish?topic={topic}"),
        &[("content-type", "application/cloudevents+json")],
        body.as_bytes(),
    )
}

/// Connections that never finish their handshake (silent, half a ClientHello, garbage) are
/// closed within `header_read_timeout`, hold no shard, and a bystander publishes meanwhile.
#[test]
fn stalled_and_garbage_handshakes_are_cut_off_while_a_bystander_publishes() {
    let (b, pki) = tls_broker("stalled", &["--header-read-timeout-ms", "1000"]);
    let config = client_config(&pki.dir.join("ca.pem"), None);
    let mut hostile = Vec::new();
    for i in 0..60 {
        let mut s = TcpStream::connect(b.traffic).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        match i % 3 {
            0 => {}
            // The first bytes of a TLS 1.2 ClientHello record, then nothing.
            1 => s.write_all(&[0x16, 0x03, 0x01, 0x02, 0x00, 0x01, 0x00, 0x01, 0xfc]).unwrap(),
            _ => {
                let _ = s.write_all(&vec![0x16; 64 * 1024]);
            }
        }
        hostile.push(s);
    }
    let start = Instant::now();
    let mut bystander = connect(b.traffic, &config).unwrap();
    for i in 0..20 {
        assert_eq!(publish(&mut bystander, "calm", &event(&format!("c{i}"))).status, 202);
    }
    for mut s in hostile {
        let mut sink = [0u8; 4096];
        // Closed by the broker: EOF or a reset, after an alert at most; never a timeout here.
        loop {
            match s.read(&mut sink) {
                Ok(0) | Err(_) if start.elapsed() < Duration::from_secs(9) => break,
                Ok(0) | Err(_) => panic!("a stalled handshake was held for {:?}", start.elapsed()),
                Ok(_) => {}
            }
        }
    }
    assert!(start.elapsed() < Duration::from_secs(9), "stalled handshakes were held {:?}", start.elapsed());
    assert_eq!(publish(&mut bystander, "calm", &event("last")).status, 202);
}

/// `evmesh pub` and `evmesh sub` over `https://`, with a client certificate (mutual TLS), and a
/// clear error when the server's certificate does not verify.
#[test]
fn the_cli_publishes_and_subscribes_over_mutual_tls() {
    let pki = test_pki("cli");
    let dir = pki.dir.clone();
    let (ccert, ckey) = pki.issue("cli-user", "cli-user");
    let ca = dir.join("ca.pem");
    let b = start_tls(&pki, true, &[]);
    let evmesh = || std::process::Command::new(env!("CARGO_BIN_EXE_evmesh"));
    let url = format!("https://localhost:{}", b.traffic.port());
    let tls = ["--cacert", ca.to_str().unwrap(), "--cert", ccert.to_str().unwrap(), "--key", ckey.to_str().unwrap()];
    let mut http = connect(b.traffic, &client_config(&ca, Some(&(ccert.clone(), ckey.clone())))).unwrap();
    let def = json!({"subscription": "cli", "topic": "clitls", "mode": "LOAD_BALANCE", "start": "earliest"});
    subscribe(&mut http, &def);
    let out = evmesh()
        .args(["pub", "--url", &url, "--topic", "clitls", "--id", "cli-1", "--data", r#"{"a":1}"#])
        .args(tls)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let out = evmesh().args(["sub", "--url", &url, "--subscription", "cli", "--max", "1"]).args(tls).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let got: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(got["id"], "cli-1");
    // Trusting another CA: the CLI refuses the server, and says why.
    let other = Pki::new(&dir.join("other"), "other-ca");
    let out = evmesh()
        .args(["pub", "--url", &url, "--topic", "clitls", "--data", "{}"])
        .args(["--cacert", other.dir.join("other-ca.pem").to_str().unwrap()])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("certificate"), "{err}");
}

/// A CA dropped from `tls_client_ca` on SIGHUP lets none of its clients back in, not even by
/// resuming a session it had before (rustls does not check a resumed session's certificate).
#[test]
fn a_client_ca_removed_on_sighup_cannot_be_resumed_past() {
    let pki = test_pki("ca-swap");
    let dir = pki.dir.clone();
    let old_client = pki.issue("svc-old", "svc-old");
    let new_ca = Pki::new(&dir.join("new"), "new-ca");
    let client_ca = dir.join("clients.pem");
    let b = start_tls(&pki, true, &[]);
    let ca = dir.join("ca.pem");
    let resuming = resuming_client_config(&ca, Some(&old_client));
    let mut first = connect(b.traffic, &resuming).unwrap();
    // A request and its answer: the session ticket has arrived by then.
    assert_eq!(publish(&mut first, "t", &event("before")).status, 202);
    let mut again = connect(b.traffic, &resuming).unwrap();
    assert_eq!(publish(&mut again, "t", &event("resumed")).status, 202);
    assert_eq!(again.conn.handshake_kind(), Some(rustls::HandshakeKind::Resumed), "the client resumes");
    // The client CA is replaced by another one.
    std::fs::copy(new_ca.dir.join("new-ca.pem"), &client_ca).unwrap();
    assert!(std::process::Command::new("kill").args(["-HUP", &b.pid().to_string()]).status().unwrap().success());
    let admin_config = client_config(&ca, Some(&new_ca.issue("ops", "ops")));
    wait_for(Duration::from_secs(10), || {
        let mut admin = connect(b.admin, &admin_config).ok()?;
        let m = request(&mut admin, "GET", "/metrics", &[], b"")?.text();
        m.lines().any(|l| l == "evmesh_tls_reloads_total 1").then_some(())
    });
    let refused = connect(b.traffic, &resuming).ok().and_then(|mut t| publish_or_none(&mut t, "t", &event("after")));
    assert!(refused.is_none(), "a certificate of the removed CA got a session: {refused:?}");
}

/// A body sent as thousands of 32-byte records (rustls's smallest fragment) arrives whole: every
/// decrypted record that fits goes into one read.
#[test]
fn a_body_in_tiny_records_arrives_whole() {
    let (b, pki) = tls_broker("tiny-records", &[]);
    let mut config = resuming_client_config(&pki.dir.join("ca.pem"), None);
    Arc::get_mut(&mut config).unwrap().max_fragment_size = Some(32);
    let mut tls = connect(b.traffic, &config).unwrap();
    let mut big = event("tiny");
    big["data"] = json!({"blob": "y".repeat(200 * 1024)});
    assert_eq!(publish(&mut tls, "tiny", &big).status, 202);
    let mut admin = connect(b.admin, &client_config(&pki.dir.join("ca.pem"), None)).unwrap();
    assert_eq!(stored_ids(&mut admin, "tiny"), ["tiny"]);
}

/// One mutual-TLS connection that sends a tenant's bearer token on one request and nothing on
/// the next speaks as two principals: the second is decided for the certificate's principal, not
/// with the token's cached grant (regression: the grant cache ignored who asked).
#[test]
fn a_certificate_and_a_token_on_one_connection_are_decided_apart() {
    use sha2::Digest;
    let pki = test_pki("mixed");
    let dir = pki.dir.clone();
    let identity = pki.issue("svc-cert", "svc-cert");
    let secret = "acme-token-secret";
    let hash: String = sha2::Sha256::digest(secret.as_bytes()).iter().map(|b| format!("{b:02x}")).collect();
    let line = json!({"principal": "svc-token", "tenant": "acme", "sha256": hash});
    std::fs::write(dir.join("tokens.jsonl"), format!("{line}\n")).unwrap();
    let acl = "[[acl]]\nid = \"t\"\nprincipal = \"svc-token\"\nresource = \"topic:orders.*\"\nactions = [\"PUBLISH\"]\neffect = \"ALLOW\"\n";
    std::fs::write(dir.join("evmesh.toml"), acl).unwrap();
    let (config, tokens) = (dir.join("evmesh.toml"), dir.join("tokens.jsonl"));
    let auth =
        ["--config", config.to_str().unwrap(), "--auth", "token", "--auth-tokens-file", tokens.to_str().unwrap()];
    let b = start_tls(&pki, true, &auth);
    let mut tls = connect(b.traffic, &client_config(&dir.join("ca.pem"), Some(&identity))).unwrap();
    let body = event("by-token").to_string();
    let bearer = format!("Bearer {secret}");
    let headers = [("content-type", "application/cloudevents+json"), ("authorization", bearer.as_str())];
    let r = request(&mut tls, "POST", "/events/publish?topic=orders.eu", &headers, body.as_bytes()).unwrap();
    assert_eq!(r.status, 202, "{}", r.text());
    // The same connection, no token: the certificate's principal, which may publish nothing.
    let r = publish(&mut tls, "orders.eu", &event("by-cert"));
    r.assert_problem(403);
    assert!(r.text().contains("svc-cert"), "{}", r.text());
}
