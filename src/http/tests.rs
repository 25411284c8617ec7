//! Table tests for the request parser and chunked scanner, each case replayed at every split
//! point, plus a differential check against httparse.

use super::*;

const L: Limits = Limits { max_header_bytes: 512, max_headers: 8, max_body_bytes: 64 };

#[derive(Debug)]
enum Want {
    /// Complete, with (method, target, header count, body kind, keep-alive).
    Ok(&'static str, &'static str, usize, BodyKind, bool),
    Err(u16),
    Partial,
}

macro_rules! cases {
    ($($name:ident: $bytes:expr => $want:expr;)*) => {
        const CASES: &[(&str, &[u8], Want)] = &[$((stringify!($name), $bytes, $want)),*];
    };
}

cases! {
    simple_get: b"GET / HTTP/1.1\r\nHost: a\r\n\r\n" => Want::Ok("GET", "/", 1, BodyKind::Length(0), true);
    post_length: b"POST /events/publish?topic=t HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\n" => Want::Ok("POST", "/events/publish?topic=t", 2, BodyKind::Length(5), true);
    post_chunked: b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n" => Want::Ok("POST", "/", 2, BodyKind::Chunked, true);
    http10_closes: b"GET / HTTP/1.0\r\n\r\n" => Want::Ok("GET", "/", 0, BodyKind::Length(0), false);
    http10_keepalive: b"GET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\n" => Want::Ok("GET", "/", 1, BodyKind::Length(0), true);
    connection_close: b"GET / HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n" => Want::Ok("GET", "/", 2, BodyKind::Length(0), false);
    bare_lf: b"GET / HTTP/1.1\nHost: a\n\n" => Want::Ok("GET", "/", 1, BodyKind::Length(0), true);
    leading_crlf: b"\r\nGET / HTTP/1.1\r\nHost: a\r\n\r\n" => Want::Ok("GET", "/", 1, BodyKind::Length(0), true);
    value_ows: b"GET / HTTP/1.1\r\nHost: \t a \t\r\n\r\n" => Want::Ok("GET", "/", 1, BodyKind::Length(0), true);
    same_lengths: b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 3, 3\r\n\r\n" => Want::Ok("POST", "/", 2, BodyKind::Length(3), true);
    expect_continue: b"POST / HTTP/1.1\r\nHost: a\r\nExpect: 100-continue\r\nContent-Length: 1\r\n\r\n" => Want::Ok("POST", "/", 3, BodyKind::Length(1), true);
    partial_line: b"GET / HTTP/1.1\r\nHo" => Want::Partial;
    empty: b"" => Want::Partial;
    missing_host: b"GET / HTTP/1.1\r\n\r\n" => Want::Err(400);
    two_hosts: b"GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n" => Want::Err(400);
    bad_version: b"GET / HTTP/1.x\r\nHost: a\r\n\r\n" => Want::Err(400);
    http2: b"GET / HTTP/2.0\r\nHost: a\r\n\r\n" => Want::Err(505);
    no_target: b"GET  HTTP/1.1\r\nHost: a\r\n\r\n" => Want::Err(400);
    space_in_name: b"GET / HTTP/1.1\r\nHo st: a\r\n\r\n" => Want::Err(400);
    space_before_colon: b"GET / HTTP/1.1\r\nHost : a\r\n\r\n" => Want::Err(400);
    no_colon: b"GET / HTTP/1.1\r\nHost\r\n\r\n" => Want::Err(400);
    folding: b"GET / HTTP/1.1\r\nHost: a\r\n b\r\n\r\n" => Want::Err(400);
    ctl_in_value: b"GET / HTTP/1.1\r\nHost: a\x01\r\n\r\n" => Want::Err(400);
    bare_cr: b"GET / HTTP/1.1\rHost: a\r\n\r\n" => Want::Err(400);
    bad_method: b"G(T / HTTP/1.1\r\nHost: a\r\n\r\n" => Want::Err(400);
    bad_length: b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 1x\r\n\r\n" => Want::Err(400);
    negative_length: b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: -1\r\n\r\n" => Want::Err(400);
    conflicting_lengths: b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n" => Want::Err(400);
    te_and_cl: b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n" => Want::Err(400);
    te_gzip: b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip\r\n\r\n" => Want::Err(400);
    te_http10: b"POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n" => Want::Err(400);
    te_http10_keepalive: b"POST / HTTP/1.0\r\nConnection: keep-alive\r\nTransfer-Encoding: chunked\r\n\r\n" => Want::Err(400);
    te_gzip_chunked: b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip, chunked\r\n\r\n" => Want::Err(501);
    body_too_big: b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 65\r\n\r\n" => Want::Err(413);
    expect_other: b"POST / HTTP/1.1\r\nHost: a\r\nExpect: 200-ok\r\n\r\n" => Want::Err(417);
    too_many_headers: b"GET / HTTP/1.1\r\nHost: a\r\na: 1\r\nb: 1\r\nc: 1\r\nd: 1\r\ne: 1\r\nf: 1\r\ng: 1\r\nh: 1\r\n\r\n" => Want::Err(431);
}

fn check(name: &str, bytes: &[u8], want: &Want) {
    let got = parse_head(bytes, &L);
    match (want, &got) {
        (Want::Ok(m, t, n, body, ka), Ok(Status::Complete(h))) => {
            assert_eq!(h.method_str(bytes), *m, "{name}");
            assert_eq!(h.target(bytes), *t, "{name}");
            assert_eq!(h.headers.len(), *n, "{name}");
            assert_eq!(h.body, *body, "{name}");
            assert_eq!(h.keep_alive, *ka, "{name}");
            assert_eq!(h.len, bytes.len(), "{name}: head length");
        }
        (Want::Err(s), Err(e)) => assert_eq!(e.status.0, *s, "{name}: {e}"),
        (Want::Partial, Ok(Status::Partial)) => {}
        _ => panic!("{name}: want {want:?}, got {got:?}"),
    }
}

#[test]
fn table() {
    for (name, bytes, want) in CASES {
        check(name, bytes, want);
    }
}

/// Every prefix of a case is `Partial`, or already the case's own error: never a different
/// answer, so any chunking of the network gives the same result.
#[test]
fn table_at_every_split_point() {
    for (name, bytes, want) in CASES {
        for cut in 0..bytes.len() {
            match (parse_head(&bytes[..cut], &L), want) {
                (Ok(Status::Partial), _) => {}
                (Err(e), Want::Err(s)) if e.status.0 == *s => {}
                (other, _) => panic!("{name} cut at {cut}: {other:?}"),
            }
        }
        check(name, bytes, want);
    }
}

#[test]
fn oversized_head_is_431_even_when_incomplete() {
    let mut req = b"GET / HTTP/1.1\r\nHost: a\r\nx: ".to_vec();
    req.extend(std::iter::repeat_n(b'a', 600));
    assert_eq!(parse_head(&req, &L).unwrap_err().status.0, 431);
}

/// Where httparse, the reference, accepts a request, we accept the same fields or refuse it for
/// a reason httparse does not check (Host, framing headers); where it refuses, so do we.
#[test]
fn differential_against_httparse() {
    for (name, bytes, _) in CASES {
        let mut hs = [httparse::EMPTY_HEADER; 16];
        let mut reference = httparse::Request::new(&mut hs);
        let theirs = reference.parse(bytes);
        let ours = parse_head(bytes, &L);
        match (theirs, ours) {
            (Ok(httparse::Status::Complete(n)), Ok(Status::Complete(h))) => {
                assert_eq!(n, h.len, "{name}");
                assert_eq!(reference.method, Some(h.method_str(bytes)), "{name}");
                assert_eq!(reference.path, Some(h.target(bytes)), "{name}");
                let theirs: Vec<(&str, &[u8])> = reference.headers.iter().map(|x| (x.name, x.value)).collect();
                let ours: Vec<(&str, &[u8])> = h.headers(bytes).collect();
                assert_eq!(theirs.len(), ours.len(), "{name}");
                for ((tn, tv), (on, ov)) in theirs.iter().zip(&ours) {
                    assert_eq!(tn, on, "{name}");
                    assert_eq!(tv.trim_ascii(), *ov, "{name}");
                }
            }
            (Ok(httparse::Status::Complete(_)), Err(e)) => {
                assert!(matches!(e.status.0, 400 | 413 | 417 | 431 | 501 | 505), "{name}: {e}");
            }
            (Ok(httparse::Status::Partial), Ok(Status::Partial)) => {}
            (Err(_), Err(_)) => {}
            (Err(httparse::Error::TooManyHeaders), _) => {}
            (t, o) => panic!("{name}: httparse {t:?}, ours {o:?}"),
        }
    }
}

#[test]
fn the_head_limit_counts_the_blank_line() {
    let mut req = b"GET / HTTP/1.1\r\nHost: a\r\nx: ".to_vec();
    req.extend(std::iter::repeat_n(b'a', L.max_header_bytes - req.len() - 4));
    req.extend_from_slice(b"\r\n\r\n");
    assert_eq!(req.len(), L.max_header_bytes);
    assert!(matches!(parse_head(&req, &L), Ok(Status::Complete(h)) if h.len == req.len()));
    req.insert(req.len() - 4, b'a');
    assert_eq!(parse_head(&req, &L).unwrap_err().status.0, 431);
}

#[test]
fn chunked_bodies() {
    let body = b"5\r\nhello\r\n6;ext=1\r\n world\r\n0\r\nTrailer: x\r\n\r\nNEXT";
    let Ok(Status::Complete(end)) = scan_chunked(body, 64) else { panic!() };
    assert_eq!(end.consumed, body.len() - 4);
    assert_eq!(end.data_len, 11);
    let mut out = Vec::new();
    decode_chunked(body, &end, &mut out);
    assert_eq!(out, b"hello world");
    for cut in 0..end.consumed {
        assert_eq!(scan_chunked(&body[..cut], 64), Ok(Status::Partial), "cut {cut}");
    }
    assert_eq!(scan_chunked(b"zz\r\n", 64).unwrap_err().status.0, 400);
    assert_eq!(scan_chunked(b"5\r\nhelloXX", 64).unwrap_err().status.0, 400);
    assert_eq!(scan_chunked(b"41\r\n", 64).unwrap_err().status.0, 413);
    assert_eq!(scan_chunked(b"ffffffffffffffff\r\n", 64).unwrap_err().status.0, 400);
}

#[test]
fn responses_and_problems() {
    let mut out = Vec::new();
    problem(StatusCode::PAYLOAD_TOO_LARGE, "too \"big\"").write(&mut out, false, false);
    let text = String::from_utf8(out).unwrap();
    assert!(text.starts_with("HTTP/1.1 413 Content Too Large\r\ndate: "), "{text}");
    assert!(text.contains(" GMT\r\ncontent-type: application/problem+json\r\n"), "{text}");
    assert!(text.contains("connection: close\r\n"));
    let body = text.split("\r\n\r\n").nth(1).unwrap();
    let v: serde_json::Value = serde_json::from_str(body).unwrap();
    assert_eq!(v["status"], 413);
    assert_eq!(v["detail"], "too \"big\"");
}

/// Regression: 201 went out as "201 Unknown".
#[test]
fn every_status_evmesh_sends_has_its_reason_phrase() {
    for code in
        [100, 101, 200, 201, 202, 204, 400, 404, 405, 408, 409, 413, 415, 417, 426, 429, 431, 500, 501, 503, 504, 505]
    {
        assert_ne!(StatusCode(code).reason(), "Unknown", "{code}");
    }
    assert_eq!(StatusCode(201).reason(), "Created");
}
