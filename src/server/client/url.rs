//! What the client can call: [`Url`], an `http` or `https` URL parsed and checked (a DNS name,
//! an IPv4 address or `[IPv6]`; no user info), with the address when the host is one.

use std::net::{IpAddr, Ipv4Addr};

/// An `http` or `https` URL the client can call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Url {
    pub tls: bool,
    /// The authority as written (the `Host` header's).
    pub host: String,
    /// The host alone (no brackets, no port): the name to resolve and to verify on https.
    pub name: String,
    pub port: u16,
    /// The host's address when it is one (or `localhost`): nothing to resolve.
    pub ip: Option<IpAddr>,
    /// Path and query, `/` at least.
    pub target: String,
}

impl Url {
    /// Parses `http[s]://host[:port][/path][?query]`; `host` a DNS name, an IPv4 address or
    /// `[IPv6]`. A fragment is dropped; user info is refused.
    pub fn parse(s: &str) -> Result<Url, String> {
        let (tls, rest) = match s.split_once("://") {
            Some((scheme, rest)) if scheme.eq_ignore_ascii_case("http") => (false, rest),
            Some((scheme, rest)) if scheme.eq_ignore_ascii_case("https") => (true, rest),
            _ => return Err(format!("{s:?} is not an http:// or https:// URL")),
        };
        let default_port = if tls { 443 } else { 80 };
        let rest = rest.split('#').next().unwrap_or_default();
        let (authority, target) = match rest.find(['/', '?']) {
            Some(i) if rest.as_bytes()[i] == b'?' => (&rest[..i], format!("/{}", &rest[i..])),
            Some(i) => (&rest[..i], rest[i..].to_owned()),
            None => (rest, "/".to_owned()),
        };
        if authority.contains('@') {
            return Err("a URL with user info is refused (credentials do not belong in a sink URL)".into());
        }
        if !target.bytes().all(|b| (b'!'..=b'~').contains(&b)) {
            return Err("the URL's path and query must be visible ASCII (percent-encode the rest)".into());
        }
        let port =
            |p: &str| p.parse::<u16>().ok().filter(|&p| p > 0).ok_or_else(|| format!("bad port in {authority:?}"));
        // `[v6]` or `[v6]:port`; otherwise `host` or `host:port`.
        let (host, port) = match authority.strip_prefix('[') {
            Some(rest) => match rest.split_once(']') {
                Some((h, "")) => (h, default_port),
                Some((h, after)) => (h, port(after.strip_prefix(':').unwrap_or(after))?),
                None => return Err(format!("unclosed [ in {authority:?}")),
            },
            None => match authority.rsplit_once(':') {
                Some((h, p)) => (h, port(p)?),
                None => (authority, default_port),
            },
        };
        let ip = match host {
            h if h.eq_ignore_ascii_case("localhost") => Some(IpAddr::V4(Ipv4Addr::LOCALHOST)),
            h if authority.starts_with('[') => {
                Some(h.parse::<std::net::Ipv6Addr>().map_err(|_| format!("{h:?} is not an IPv6 address"))?.into())
            }
            h => h.parse::<Ipv4Addr>().ok().map(IpAddr::V4),
        };
        let label_ok = |l: &str| {
            (1..=63).contains(&l.len())
                && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
                && !l.starts_with('-')
                && !l.ends_with('-')
        };
        if ip.is_none() && (host.len() > 253 || !host.trim_end_matches('.').split('.').all(label_ok)) {
            return Err(format!("the host {host:?} is neither a DNS name nor an IP address"));
        }
        Ok(Url { tls, host: authority.to_owned(), name: host.to_owned(), port, ip, target })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_http_or_https_to_addresses_or_names() {
        let u = Url::parse("http://127.0.0.1:8089/hook?x=1#frag").unwrap();
        assert_eq!((u.host.as_str(), u.port, u.target.as_str()), ("127.0.0.1:8089", 8089, "/hook?x=1"));
        assert_eq!((u.tls, u.ip), (false, Some("127.0.0.1".parse().unwrap())));
        let u = Url::parse("HTTP://localhost").unwrap();
        assert_eq!((u.ip, u.port, u.target.as_str()), (Some("127.0.0.1".parse().unwrap()), 80, "/"));
        let u = Url::parse("http://[::1]:9/a").unwrap();
        assert_eq!((u.ip, u.host.as_str(), u.name.as_str()), (Some("::1".parse().unwrap()), "[::1]:9", "::1"));
        assert_eq!(Url::parse("http://[::1]/a").unwrap().port, 80);
        assert_eq!(Url::parse("http://10.0.0.1?q").unwrap().target, "/?q");
        let u = Url::parse("https://hooks.example.com/in").unwrap();
        assert_eq!((u.tls, u.name.as_str(), u.port, u.ip), (true, "hooks.example.com", 443, None));
        assert_eq!(Url::parse("https://a-b.example:8443").unwrap().port, 8443);
        for bad in [
            "ftp://x/",
            "127.0.0.1:80/",
            "http://u:p@127.0.0.1/",
            "http://127.0.0.1:0/",
            "http://127.0.0.1:99999/",
            "http://127.0.0.1/a b",
            "http://[::1",
            "http://[::1]x/",
            "http://[nope]/",
            "http://1.2.3.4:/",
            "http://-bad.example/",
            "http://under_score.example/",
            "http://a..b/",
            "http:///path",
        ] {
            assert!(Url::parse(bad).is_err(), "{bad}");
        }
    }
}
