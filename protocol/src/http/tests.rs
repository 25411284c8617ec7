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
    value_tab_and_utf8: b"GET / HTTP/1.1\r\nHost: a\tb \xc3\xa9 \r\nX-Long: 0123456789abcdef0123\r\n\r\n" => Want::Ok("GET", "/", 2, BodyKind::Length(0), true);
    del_in_long_value: b"GET / HTTP/1.1\r\nHost: a\r\nx: 0123456789abcdef\x7fabc\r\n\r\n" => Want::Err(400);
    cr_in_long_value: b"GET / HTTP/1.1\r\nHost: a\r\nx: 0123456789abcdef\rabc\r\n\r\n" => Want::Err(400);
    nul_after_value: b"GET / HTTP/1.1\r\nHost: a\x00\r\n\r\n" => Want::Err(400);
    cr_cr_lf: b"GET / HTTP/1.1\r\nHost: a\r\r\n\r\n" => Want::Err(400);
    cr_then_text_as_line: b"GET / HTTP/1.1\r\nHost: a\r\n\rx: b\r\n\r\n" => Want::Err(400);
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
    plus_length: b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: +1\r\n\r\n" => Want::Err(400);
    length_of_19_digits: b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 0000000000000000005\r\n\r\n" => Want::Ok("POST", "/", 2, BodyKind::Length(5), true);
    largest_length: b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 9999999999999999999\r\n\r\n" => Want::Err(413);
    length_of_20_digits: b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 00000000000000000005\r\n\r\n" => Want::Err(400);
    conflicting_lengths: b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n" => Want::Err(400);
    te_and_cl: b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n" => Want::Err(400);
    te_gzip: b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip\r\n\r\n" => Want::Err(400);
    te_http10: b"POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n" => Want::Err(400);
    te_http10_keepalive: b"POST / HTTP/1.0\r\nConnection: keep-alive\r\nTransfer-Encoding: chunked\r\n\r\n" => Want::Err(400);
    te_gzip_chunked: b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip, chunked\r\n\r\n" => Want::Err(501);
    te_chunked_twice_in_one_line: b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked, chunked\r\n\r\n" => Want::Err(501);
    te_chunked_on_two_lines: b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n" => Want::Err(501);
    te_chunked_then_gzip_line: b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: gzip\r\n\r\n" => Want::Err(400);
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

/// The field-value scan, eight bytes at a time, stops exactly where the rule byte by byte does
/// (controls and DEL; HTAB, CR and LF among them), whatever stands around the stop: bytes of
/// 0x80 and over, and the borrows a control leaves in the bytes above it.
#[test]
fn the_value_scan_stops_where_the_byte_rule_does() {
    let bytewise =
        |b: &[u8], at: usize| at + b[at..].iter().position(|&c| c < 0x20 || c == 0x7f).unwrap_or(b.len() - at);
    for filler in [b' ', b'a', b'~', 0x80, 0xa0, 0xff] {
        for stop in 0..=255u8 {
            for p in 0..19 {
                for after in [None, Some(0x00), Some(0x01), Some(0x20), Some(0x7f)] {
                    let mut buf = [filler; 20];
                    buf[p] = stop;
                    if let Some(a) = after {
                        buf[p + 1] = a;
                    }
                    for at in [0, 1, 5, 12, 20] {
                        assert_eq!(parse::value_run(&buf, at), bytewise(&buf, at), "{buf:?} from {at}");
                    }
                }
            }
        }
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

/// Budgets of the chunked table: 64 data bytes, 32 extension bytes, 32 trailer bytes, 200 raw.
const CL: ChunkedLimits = ChunkedLimits { max_data: 64, max_extensions: 32, max_trailers: 32, max_raw: 200 };

#[derive(Debug)]
enum Body {
    /// Complete, taking every byte of the case, with this decoded data.
    Ok(&'static [u8]),
    Err(u16),
    Partial,
}

macro_rules! chunked_cases {
    ($($name:ident: $bytes:expr => $want:expr;)*) => {
        fn chunked_cases() -> Vec<(&'static str, Vec<u8>, Body)> {
            vec![$((stringify!($name), ($bytes)[..].to_vec(), $want)),*]
        }
    };
}

fn cat(parts: &[&[u8]]) -> Vec<u8> {
    parts.concat()
}

fn rep(part: &[u8], n: usize) -> Vec<u8> {
    part.repeat(n)
}

const X64: &[u8] = b"xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx";

chunked_cases! {
    two_chunks: b"5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n" => Body::Ok(b"hello world");
    empty_body: b"0\r\n\r\n" => Body::Ok(b"");
    upper_and_lower_hex: b"A\r\n0123456789\r\na\r\n0123456789\r\n0\r\n\r\n" => Body::Ok(b"01234567890123456789");
    leading_zeros: b"005\r\nhello\r\n000\r\n\r\n" => Body::Ok(b"hello");
    ext_token: b"5;a=b\r\nhello\r\n0;last\r\n\r\n" => Body::Ok(b"hello");
    ext_bws: b"5 ; a = b\r\nhello\r\n0\t;\tz\r\n\r\n" => Body::Ok(b"hello");
    ext_quoted: b"5;a=\"x y\\\"z;\"\r\nhello\r\n0\r\n\r\n" => Body::Ok(b"hello");
    ext_several: b"5;a;b=c;d=\"\"\r\nhello\r\n0\r\n\r\n" => Body::Ok(b"hello");
    trailers: b"1\r\nx\r\n0\r\nExp: never\r\nX-Empty:\r\nX-Ws: \t a b \r\n\r\n" => Body::Ok(b"x");
    data_at_limit: cat(&[b"40\r\n", X64, b"\r\n0\r\n\r\n"]) => Body::Ok(X64);
    ext_at_limit: cat(&[b"1;", &X64[..15], b"\r\nx\r\n0;", &X64[..15], b"\r\n\r\n"]) => Body::Ok(b"x");
    trailers_at_limit: cat(&[b"0\r\na:", &X64[..14], b"\r\nb:", &X64[..14], b"\r\n\r\n"]) => Body::Ok(b"");
    raw_at_limit: cat(&[&rep(b"1\r\nx\r\n", 31), b"4\r\nxxxx\r\n0\r\n\r\n"]) => Body::Ok(&X64[..35]);
    empty: b"" => Body::Partial;
    partial_size: b"5" => Body::Partial;
    partial_size_cr: b"5;a=b\r" => Body::Partial;
    partial_data: b"5\r\nhel" => Body::Partial;
    partial_data_cr: b"5\r\nhello\r" => Body::Partial;
    partial_last: b"5\r\nhello\r\n0\r\n" => Body::Partial;
    partial_trailer: b"0\r\nA: b" => Body::Partial;
    partial_end_cr: b"0\r\nA: b\r\n\r" => Body::Partial;
    size_not_hex: b"zz\r\n" => Body::Err(400);
    size_missing: b"\r\n" => Body::Err(400);
    size_negative: b"-1\r\n" => Body::Err(400);
    size_too_many_digits: b"0000000000000001\r\n" => Body::Err(400);
    size_bare_lf: b"5\nhello\r\n0\r\n\r\n" => Body::Err(400);
    size_cr_cr_lf: b"5\r\r\nhello\r\n0\r\n\r\n" => Body::Err(400);
    size_bare_cr: b"5\rhello\r\n0\r\n\r\n" => Body::Err(400);
    size_trailing_space: b"5 \r\nhello\r\n0\r\n\r\n" => Body::Err(400);
    size_then_garbage: b"5 a\r\nhello\r\n0\r\n\r\n" => Body::Err(400);
    size_0x: b"0x5\r\nhello\r\n0\r\n\r\n" => Body::Err(400);
    data_not_followed_by_crlf: b"5\r\nhelloXX" => Body::Err(400);
    data_bare_lf: b"5\r\nhello\n0\r\n\r\n" => Body::Err(400);
    data_bare_cr: b"5\r\nhello\rX0\r\n\r\n" => Body::Err(400);
    data_cr_cr_lf: b"5\r\nhello\r\r\n0\r\n\r\n" => Body::Err(400);
    ext_cr: b"5;a\rb\r\nhello\r\n0\r\n\r\n" => Body::Err(400);
    ext_lf_in_quotes: b"5;a=\"x\ny\"\r\nhello\r\n0\r\n\r\n" => Body::Err(400);
    ext_ctl: b"5;a\x01\r\nhello\r\n0\r\n\r\n" => Body::Err(400);
    ext_nul_in_quotes: b"5;a=\"\x00\"\r\nhello\r\n0\r\n\r\n" => Body::Err(400);
    ext_del: b"5;a=\x7f\r\nhello\r\n0\r\n\r\n" => Body::Err(400);
    ext_empty_name: b"5;=b\r\nhello\r\n0\r\n\r\n" => Body::Err(400);
    ext_empty_value: b"5;a=\r\nhello\r\n0\r\n\r\n" => Body::Err(400);
    ext_trailing_space: b"5;a \r\nhello\r\n0\r\n\r\n" => Body::Err(400);
    ext_unterminated_quote: b"5;a=\"x\r\nhello\r\n0\r\n\r\n" => Body::Err(400);
    ext_two_values: b"5;a=b c\r\nhello\r\n0\r\n\r\n" => Body::Err(400);
    last_bare_lf: b"5\r\nhello\r\n0\n\r\n" => Body::Err(400);
    end_bare_lf: b"0\r\n\n" => Body::Err(400);
    end_bare_cr: b"0\r\n\rX" => Body::Err(400);
    trailer_bare_lf: b"0\r\nA: b\n\r\n" => Body::Err(400);
    trailer_bare_cr: b"0\r\nA: b\rc\r\n\r\n" => Body::Err(400);
    trailer_garbage: b"0\r\ngarbage\r\n\r\n" => Body::Err(400);
    trailer_folded: b"0\r\nA: b\r\n c\r\n\r\n" => Body::Err(400);
    trailer_bad_name: b"0\r\nA b: c\r\n\r\n" => Body::Err(400);
    trailer_empty_name: b"0\r\n: c\r\n\r\n" => Body::Err(400);
    trailer_ctl: b"0\r\nA: \x01\r\n\r\n" => Body::Err(400);
    data_over_limit: b"41\r\n" => Body::Err(413);
    data_sum_over_limit: cat(&[b"40\r\n", X64, b"\r\n1\r\n"]) => Body::Err(413);
    size_huge: b"fffffffffffffff\r\n" => Body::Err(413);
    ext_total_over_limit: cat(&[b"1;", &X64[..15], b"\r\nx\r\n0;", &X64[..16], b"\r\n\r\n"]) => Body::Err(413);
    ext_line_without_end: cat(&[b"1;", X64]) => Body::Err(413);
    trailer_over_limit: cat(&[b"0\r\na:", &X64[..14], b"\r\nb:", &X64[..15], b"\r\n\r\n"]) => Body::Err(431);
    trailer_line_without_end: cat(&[b"0\r\na: ", X64]) => Body::Err(431);
    trailers_without_end: cat(&[b"0\r\n", &rep(b"a: b\r\n", 40)]) => Body::Err(431);
    raw_over_limit: cat(&[&rep(b"1\r\nx\r\n", 31), b"5\r\nxxxxx\r\n0\r\n\r\n"]) => Body::Err(413);
    raw_without_end: rep(b"1\r\nx\r\n", 60) => Body::Err(413);
}

/// Feeds `bytes` to `scanner` as the growing prefixes ending at each of `cuts`, then whole;
/// every answer before the last must be `Partial` or the case's own error.
fn feed(
    name: &str,
    scanner: &mut ChunkedScanner,
    out: &mut Vec<u8>,
    bytes: &[u8],
    cuts: impl Iterator<Item = usize>,
    want: &Body,
) -> Result<Status<ChunkedEnd>, HttpError> {
    for cut in cuts {
        match (scanner.scan(&bytes[..cut], out), want) {
            (Ok(Status::Partial), _) => {}
            (Err(e), Body::Err(s)) if e.status.0 == *s => {}
            (other, _) => panic!("{name} cut at {cut}: {other:?}"),
        }
    }
    scanner.scan(bytes, out)
}

fn check_body(name: &str, bytes: &[u8], got: Result<Status<ChunkedEnd>, HttpError>, out: &[u8], want: &Body) {
    match (want, &got) {
        (Body::Ok(data), Ok(Status::Complete(end))) => {
            assert_eq!(end.consumed, bytes.len(), "{name}: consumed");
            assert_eq!(end.data_len, data.len(), "{name}: data_len");
            assert_eq!(out, *data, "{name}: data");
        }
        (Body::Err(s), Err(e)) => assert_eq!(e.status.0, *s, "{name}: {e}"),
        (Body::Partial, Ok(Status::Partial)) => {}
        _ => panic!("{name}: want {want:?}, got {got:?}"),
    }
}

#[test]
fn chunked_table() {
    for (name, bytes, want) in &chunked_cases() {
        let (mut scanner, mut out) = (ChunkedScanner::new(CL), Vec::new());
        let got = scanner.scan(bytes, &mut out);
        check_body(name, bytes, got, &out, want);
    }
}

/// Each case cut in two at every byte offset: the first half alone is `Partial` or already the
/// case's error, and the same scanner given the whole then answers exactly as in one piece.
#[test]
fn chunked_table_at_every_split_point() {
    for (name, bytes, want) in &chunked_cases() {
        for cut in 0..bytes.len() {
            let (mut scanner, mut out) = (ChunkedScanner::new(CL), Vec::new());
            let got = feed(name, &mut scanner, &mut out, bytes, std::iter::once(cut), want);
            check_body(&format!("{name} cut at {cut}"), bytes, got, &out, want);
        }
    }
}

/// Each case arriving one byte at a time, to one scanner: the same answer, and the work done is
/// linear in the input (no call looks again at what an earlier call examined).
#[test]
fn chunked_table_one_byte_at_a_time() {
    for (name, bytes, want) in &chunked_cases() {
        let (mut scanner, mut out) = (ChunkedScanner::new(CL), Vec::new());
        let got = feed(name, &mut scanner, &mut out, bytes, 0..bytes.len(), want);
        check_body(name, bytes, got, &out, want);
        assert!(scanner.bytes_examined() <= 5 * bytes.len() + 16, "{name}: {} examined", scanner.bytes_examined());
    }
}

/// After an error or the end, the scanner keeps its answer whatever else arrives.
#[test]
fn chunked_answers_are_final() {
    let (mut scanner, mut out) = (ChunkedScanner::new(CL), Vec::new());
    assert_eq!(scanner.scan(b"5\nhello", &mut out).unwrap_err().status.0, 400);
    assert_eq!(scanner.scan(b"5\nhello\r\n0\r\n\r\n", &mut out).unwrap_err().status.0, 400);
    let (mut scanner, mut out) = (ChunkedScanner::new(CL), Vec::new());
    let body = b"1\r\na\r\n0\r\n\r\nPOST / HTTP/1.1\r\n";
    let end = ChunkedEnd { consumed: 11, data_len: 1 };
    assert_eq!(scanner.scan(body, &mut out), Ok(Status::Complete(end)), "bytes past the body are not its");
    assert_eq!(scanner.scan(body, &mut out), Ok(Status::Complete(end)));
    assert_eq!(out, b"a");
}

/// The regression the hostile suite found: a body of 1-byte chunks with long extensions, and a
/// long line, trickled in. Rescanning from the start on every read examined O(n^2) bytes; the
/// scanner examines a few bytes per byte received, however the input is split.
#[test]
fn chunked_scanner_work_is_linear() {
    let limits = ChunkedLimits { max_data: 1 << 20, max_extensions: 1 << 20, max_trailers: 1 << 20, max_raw: 1 << 24 };
    let mut ext = b";e=".to_vec();
    ext.extend(std::iter::repeat_n(b'v', 1000));
    let mut body = Vec::new();
    for _ in 0..200 {
        body.extend_from_slice(b"1");
        body.extend_from_slice(&ext);
        body.extend_from_slice(b"\r\nx\r\n");
    }
    body.extend_from_slice(b"0\r\n");
    for _ in 0..2000 {
        body.extend_from_slice(b"t: v\r\n");
    }
    body.extend_from_slice(b"\r\n");
    let n = body.len();
    for step in [1, 7, 1000] {
        let (mut scanner, mut out) = (ChunkedScanner::new(limits), Vec::new());
        let want = Body::Ok(b"");
        let got = feed("linear", &mut scanner, &mut out, &body, (0..n).step_by(step), &want);
        assert_eq!(got, Ok(Status::Complete(ChunkedEnd { consumed: n, data_len: 200 })));
        assert_eq!(out, vec![b'x'; 200]);
        let examined = scanner.bytes_examined();
        assert!(examined <= 5 * n, "step {step}: {examined} bytes examined for {n}");
        assert!(examined >= n, "step {step}: the counter counts ({examined} for {n})");
    }
}

/// The raw budget of a request is what the head left of max_header_bytes + max_body_bytes.
#[test]
fn chunked_limits_follow_the_request_budget() {
    let limits = Limits { max_header_bytes: 100, max_headers: 8, max_body_bytes: 50 };
    let cl = ChunkedLimits::for_request(&limits, 40);
    assert_eq!(cl, ChunkedLimits { max_data: 50, max_extensions: 100, max_trailers: 100, max_raw: 110 });
    let (mut scanner, mut out) = (ChunkedScanner::new(cl), Vec::new());
    assert_eq!(scanner.scan(&rep(b"1\r\nx\r\n", 18), &mut out), Ok(Status::Partial), "108 bytes");
    assert_eq!(scanner.scan(&rep(b"1\r\nx\r\n", 19), &mut out).unwrap_err().status.0, 413, "114 bytes");
}

#[test]
fn responses_and_problems() {
    let mut out = Vec::new();
    problem::<()>(StatusCode::PAYLOAD_TOO_LARGE, "too \"big\"").write(&mut out, false, false);
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
    for code in [
        100, 101, 200, 201, 202, 204, 400, 401, 403, 404, 405, 408, 409, 413, 415, 417, 426, 429, 431, 500, 501, 503,
        504, 505,
    ] {
        assert_ne!(StatusCode(code).reason(), "Unknown", "{code}");
    }
    assert_eq!(StatusCode(201).reason(), "Created");
}

#[test]
fn a_response_that_closes_says_so_once() {
    let r: Response<()> = Response::empty(StatusCode(499)).with_header("connection", "close");
    assert!(r.closes());
    let mut out = Vec::new();
    r.write(&mut out, false, false);
    let text = String::from_utf8(out).unwrap();
    assert_eq!(text.matches("connection: close").count(), 1, "{text}");
    assert!(!Response::<()>::empty(StatusCode::OK).closes());
    // A stream ends its connection: said once, on a keep-alive connection too (a client that
    // pooled a finished SSE connection met the shut socket on its next request).
    let stream: Response<()> = Response::streaming((), "text/event-stream");
    let mut out = Vec::new();
    stream.write(&mut out, true, false);
    let text = String::from_utf8(out).unwrap();
    assert_eq!(text.matches("connection: close").count(), 1, "{text}");
    assert!(text.contains("transfer-encoding: chunked") && !text.contains("content-length"), "{text}");
}

/// A connection's reused header list gives the same heads as a fresh one, whatever it held.
#[test]
fn a_reused_header_list_parses_the_same() {
    let mut spare = Vec::new();
    for (name, bytes, _) in CASES {
        let fresh = parse_head(bytes, &L);
        assert_eq!(parse_head_into(bytes, &L, &mut spare), fresh, "{name}");
        if let Ok(Status::Complete(h)) = fresh {
            // Hand back a list that still holds this head's entries, as the connection does.
            spare = h.headers;
        }
    }
    // A keep-alive connection parses its empty buffer first (partial): the list keeps its room
    // for the request that follows.
    let request = b"GET / HTTP/1.1\r\nHost: a\r\nX-One: 1\r\n\r\n";
    let Ok(Status::Complete(h)) = parse_head_into(request, &L, &mut spare) else { panic!("complete") };
    spare = h.headers;
    let room = spare.capacity();
    assert!(room >= 2);
    assert_eq!(parse_head_into(b"", &L, &mut spare), Ok(Status::Partial));
    assert_eq!(parse_head_into(b"GET / HTTP/1.1\r\nHo", &L, &mut spare), Ok(Status::Partial));
    assert_eq!(spare.capacity(), room, "a partial head keeps the list's room");
}
