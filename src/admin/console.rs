//! `GET /console`: the web console, a page and its script and style sheet, built into the binary
//! (nothing fetched from elsewhere, no build step). The page is a client of the admin API
//! only: what it shows and changes, it reads and writes through `/admin/*` with the same
//! credential, so it can do nothing an administrator with `curl` cannot.
//!
//! A browser sends a credential on its own only with `Basic`: the console's 401 asks for it,
//! and the admin API takes the admin token (or a bearer token of an ADMIN principal) as the
//! password of `Authorization: Basic` as well as after `Bearer` (`basic`). A write so
//! authenticated must carry `x-evmesh-console`, which the page's script sends and a page of
//! another site cannot (the browser would send the cached credential with its form).

use base64::Engine as _;

use crate::http::StatusCode;
use crate::server::Response;

/// One file of the console.
pub struct Asset {
    name: &'static str,
    content_type: &'static str,
    body: &'static str,
}

/// The page, `GET /console`.
pub const INDEX: &Asset =
    &Asset { name: "index.html", content_type: "text/html; charset=utf-8", body: include_str!("console/index.html") };

const ASSETS: [&Asset; 3] = [
    INDEX,
    &Asset {
        name: "console.js",
        content_type: "text/javascript; charset=utf-8",
        body: include_str!("console/console.js"),
    },
    &Asset { name: "console.css", content_type: "text/css; charset=utf-8", body: include_str!("console/console.css") },
];

/// The asset `GET /console/{file}` names, if it is one.
pub fn asset(file: &str) -> Option<&'static Asset> {
    ASSETS.into_iter().find(|a| a.name == file)
}

/// The asset, with the headers that keep the page to itself: no framing, no script or style
/// from anywhere but this listener, nothing cached (it shows what the credential allows).
///
/// `EVMESH_CONSOLE_DIR`, when set, serves the three files from that directory instead, read at
/// each request (for working on the console without rebuilding; no other name is ever read).
pub fn serve(asset: &Asset) -> Response {
    let body = match std::env::var_os("EVMESH_CONSOLE_DIR") {
        Some(dir) => match std::fs::read(std::path::Path::new(&dir).join(asset.name)) {
            Ok(b) => b,
            Err(e) => return crate::http::problem(StatusCode::NOT_FOUND, &format!("{}: {e}", asset.name)),
        },
        None => asset.body.as_bytes().to_vec(),
    };
    Response::new(StatusCode::OK, asset.content_type, body)
        .with_header("cache-control", "no-store")
        .with_header("x-content-type-options", "nosniff")
        .with_header("x-frame-options", "DENY")
        .with_header(
            "content-security-policy",
            "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self' data:; \
             frame-ancestors 'none'; base-uri 'none'; form-action 'none'",
        )
}

/// The password of an `Authorization: Basic` value (the user name is not looked at); empty for
/// a value that is not base64 of `user:password` (a credential that fails, and is counted as
/// a failure, not one that is missing); `None` for another scheme.
pub fn basic(v: &[u8]) -> Option<Vec<u8>> {
    let scheme = v.get(..6)?;
    if !scheme.eq_ignore_ascii_case(b"basic ") {
        return None;
    }
    let decoded = base64::engine::general_purpose::STANDARD.decode(v[6..].trim_ascii()).unwrap_or_default();
    let colon = decoded.iter().position(|&b| b == b':');
    Some(colon.map_or_else(Vec::new, |c| decoded[c + 1..].to_vec()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn basic_gives_the_password_and_a_malformed_one_fails() {
        let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
        assert_eq!(basic(format!("Basic {}", b64("admin:s3cret")).as_bytes()).unwrap(), b"s3cret");
        assert_eq!(basic(format!("basic {}", b64(":a:b")).as_bytes()).unwrap(), b"a:b");
        // Malformed: a credential all the same (an empty one, which fails).
        assert_eq!(basic(format!("Basic {}", b64("nocolon")).as_bytes()).unwrap(), b"");
        assert_eq!(basic(b"Basic !!!").unwrap(), b"");
        assert_eq!(basic(b"Bearer abc"), None);
        assert_eq!(basic(b"Basi"), None);
    }

    #[test]
    fn only_the_three_files_are_assets() {
        assert!(asset("console.js").is_some() && asset("console.css").is_some() && asset("index.html").is_some());
        for name in ["", "..", "../mod.rs", "console.js/", "CONSOLE.JS", "x"] {
            assert!(asset(name).is_none(), "{name}");
        }
    }
}
