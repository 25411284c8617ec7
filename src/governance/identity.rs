//! Who sent a request: a bearer credential checked against the static tokens file or the JWKS.
//!
//! Pure: the key files are read by the caller (`Governance`) and verification is given the
//! time, so every rule has a unit test with a fixed clock. Signatures are the `jsonwebtoken`
//! crate's (RustCrypto backend); nothing here computes or compares a signature by hand.

use std::collections::HashMap;
use std::sync::Arc;

use jsonwebtoken::jwk::{AlgorithmParameters, JwkSet};
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use sha2::{Digest, Sha256};

/// An authenticated caller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Principal {
    pub name: String,
    /// The namespace of its topics, subscriptions, agents and sessions; `None`: the global one.
    pub tenant: Option<String>,
    /// When its credential stops being valid, in µs since the Unix epoch (JWT `exp`, leeway
    /// included); `None`: never (static tokens, a JWT without `exp`).
    pub expires_us: Option<i64>,
}

impl Principal {
    /// The principal a verified client certificate names (mutual TLS): no tenant, valid until
    /// the certificate's `notAfter`.
    pub fn certified(name: String, not_after_us: i64) -> Principal {
        Principal { name, tenant: None, expires_us: Some(not_after_us) }
    }
}

/// Why a credential was refused; the text is the 401's detail.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    #[error("credentials required: Authorization: Bearer <token> (or ?access_token= for WebSocket and SSE)")]
    Missing,
    #[error("unknown token")]
    UnknownToken,
    #[error("malformed token: {0}")]
    Malformed(&'static str),
    #[error("no key for this token (kid {0:?})")]
    NoKey(Option<String>),
    #[error("bad token signature")]
    BadSignature,
    #[error("token expired")]
    Expired,
    #[error("token not valid yet (nbf)")]
    NotYetValid,
    #[error("token audience is not {0:?}")]
    Audience(String),
    #[error("token issuer is not {0:?}")]
    Issuer(String),
    #[error("invalid claim: {0}")]
    Claim(&'static str),
}

/// Tenant names: `[A-Za-z0-9_-]{1,64}` (no dot: a tenant's names are stored as `tenant.name`),
/// and not a lite topic kind (`agent`, `client`, `session`, see `shard::LITE_KINDS`): tenant
/// `agent`'s `session.x` would be stored as `:agent.session.x`, the name of the lite topic of
/// an agent `session.x` without a tenant.
pub fn valid_tenant(t: &str) -> bool {
    (1..=64).contains(&t.len())
        && t.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
        && !["agent", "client", "session"].contains(&t)
}

/// What [`valid_tenant`] asks, as errors say it.
pub const TENANT_RULE: &str = "tenant must be [A-Za-z0-9_-]{1,64}, and not agent, client or session";

/// Principal names: 1 to 256 printable ASCII characters.
fn valid_principal(p: &str) -> bool {
    (1..=256).contains(&p.len()) && p.bytes().all(|b| b.is_ascii_graphic())
}

pub fn sha256(bytes: &[u8]) -> [u8; 32] {
    Sha256::digest(bytes).into()
}

fn unhex(s: &str) -> Option<[u8; 32]> {
    let b = s.as_bytes();
    if b.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, pair) in b.chunks(2).enumerate() {
        let digit = |c: u8| (c as char).to_digit(16);
        out[i] = (digit(pair[0])? * 16 + digit(pair[1])?) as u8;
    }
    Some(out)
}

/// One verification key of the JWKS.
struct JwtKey {
    kid: Option<String>,
    /// The JWK's `alg`, if it names one: the only algorithm it verifies.
    alg: Option<Algorithm>,
    key: DecodingKey,
}

/// The JWT settings and keys.
pub struct JwtKeys {
    keys: Vec<JwtKey>,
    by_kid: HashMap<String, usize>,
    audience: Option<String>,
    issuer: Option<String>,
    leeway_us: i64,
}

/// The credentials a broker accepts, as loaded from its files (swapped whole on a change).
pub enum Keys {
    /// `auth = none`.
    None,
    /// `auth = token`: SHA-256 of each secret -> its principal.
    Tokens(HashMap<[u8; 32], Arc<Principal>>),
    Jwt(JwtKeys),
}

/// The algorithms accepted, by name: the SPEC's four (HS256, RS256, ES256, EdDSA).
const ALGORITHMS: [Algorithm; 4] = [Algorithm::HS256, Algorithm::RS256, Algorithm::ES256, Algorithm::EdDSA];

/// The largest JWKS accepted, in keys.
const MAX_KEYS: usize = 256;

impl Keys {
    /// Parses a static tokens file: JSON lines `{"principal": P, "tenant": T?, "sha256": HEX}`
    /// (blank lines and lines starting with `#` skipped).
    pub fn parse_tokens(text: &str) -> Result<Keys, String> {
        #[derive(serde::Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Line {
            principal: String,
            #[serde(default)]
            tenant: Option<String>,
            sha256: String,
        }
        let mut map = HashMap::new();
        for (n, line) in text.lines().enumerate().map(|(i, l)| (i + 1, l.trim())) {
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let l: Line = serde_json::from_str(line).map_err(|e| format!("line {n}: {e}"))?;
            if !valid_principal(&l.principal) {
                return Err(format!("line {n}: principal must be 1-256 printable ASCII characters"));
            }
            if l.tenant.as_deref().is_some_and(|t| !valid_tenant(t)) {
                return Err(format!("line {n}: {TENANT_RULE}"));
            }
            let hash = unhex(&l.sha256.to_ascii_lowercase())
                .ok_or_else(|| format!("line {n}: sha256 must be 64 hex digits (the SHA-256 of the token)"))?;
            let p = Principal { name: l.principal, tenant: l.tenant, expires_us: None };
            if map.insert(hash, Arc::new(p)).is_some() {
                return Err(format!("line {n}: the same token is listed twice"));
            }
        }
        Ok(Keys::Tokens(map))
    }

    /// Parses a JWKS (`{"keys": [...]}`): `oct` keys verify HS256, `RSA` RS256, `EC` (P-256)
    /// ES256, `OKP` (Ed25519) EdDSA.
    pub fn parse_jwks(
        text: &str,
        audience: Option<String>,
        issuer: Option<String>,
        leeway_ms: u64,
    ) -> Result<Keys, String> {
        let set: JwkSet = serde_json::from_str(text).map_err(|e| format!("not a JWKS: {e}"))?;
        if set.keys.len() > MAX_KEYS {
            return Err(format!("{} keys; at most {MAX_KEYS}", set.keys.len()));
        }
        let mut keys = Vec::new();
        let mut by_kid = HashMap::new();
        for (i, jwk) in set.keys.iter().enumerate() {
            let name = jwk.common.key_id.clone().unwrap_or_else(|| format!("#{i}"));
            if matches!(jwk.algorithm, AlgorithmParameters::Other(_)) {
                return Err(format!("key {name}: unsupported key type"));
            }
            let alg = match jwk.common.key_algorithm {
                None => None,
                Some(a) => match a.to_string().parse::<Algorithm>() {
                    Ok(a) if ALGORITHMS.contains(&a) => Some(a),
                    _ => return Err(format!("key {name}: alg {a:?} is not one of HS256, RS256, ES256, EdDSA")),
                },
            };
            let key = DecodingKey::from_jwk(jwk).map_err(|e| format!("key {name}: {e}"))?;
            if let Some(kid) = &jwk.common.key_id {
                if by_kid.insert(kid.clone(), keys.len()).is_some() {
                    return Err(format!("kid {kid:?} appears twice"));
                }
            }
            keys.push(JwtKey { kid: jwk.common.key_id.clone(), alg, key });
        }
        Ok(Keys::Jwt(JwtKeys { keys, by_kid, audience, issuer, leeway_us: (leeway_ms as i64).saturating_mul(1000) }))
    }

    /// The principal `token` proves at `now_us` (µs since the Unix epoch).
    pub fn verify(&self, token: &[u8], now_us: i64) -> Result<Principal, AuthError> {
        match self {
            Keys::None => Ok(Principal { name: "anonymous".into(), tenant: None, expires_us: None }),
            Keys::Tokens(map) => map.get(&sha256(token)).map(|p| (**p).clone()).ok_or(AuthError::UnknownToken),
            Keys::Jwt(j) => j.verify(token, now_us),
        }
    }
}

impl JwtKeys {
    fn verify(&self, token: &[u8], now_us: i64) -> Result<Principal, AuthError> {
        let text = std::str::from_utf8(token).map_err(|_| AuthError::Malformed("not UTF-8"))?;
        let header = jsonwebtoken::decode_header(text).map_err(|_| AuthError::Malformed("bad header"))?;
        if !ALGORITHMS.contains(&header.alg) {
            return Err(AuthError::Malformed("alg must be HS256, RS256, ES256 or EdDSA"));
        }
        // With a kid, that key; without one, the only key that fits the algorithm (never a
        // search: one signature check per token, whatever the JWKS holds).
        let fits = |k: &JwtKey| k.alg.is_none_or(|a| a == header.alg) && k.key.family() == header.alg.family();
        let key = match &header.kid {
            Some(kid) => self.by_kid.get(kid).map(|&i| &self.keys[i]).filter(|k| fits(k)),
            None => {
                let mut fitting =
                    self.keys.iter().filter(|k| k.kid.is_none() || self.keys.len() == 1).filter(|k| fits(k));
                match (fitting.next(), fitting.next()) {
                    (Some(k), None) => Some(k),
                    _ => None,
                }
            }
        }
        // The kid is the client's: echoed back (401, audit log) at most 64 bytes of it.
        .ok_or_else(|| AuthError::NoKey(header.kid.as_deref().map(|k| k.chars().take(64).collect())))?;
        let mut v = Validation::new(header.alg);
        // Times are checked below, in µs with the configured leeway; audience and issuer here.
        v.required_spec_claims.clear();
        v.validate_exp = false;
        v.validate_nbf = false;
        v.validate_aud = self.audience.is_some();
        if let Some(a) = &self.audience {
            v.set_audience(&[a]);
            v.required_spec_claims.insert("aud".into());
        }
        if let Some(i) = &self.issuer {
            v.set_issuer(&[i]);
            v.required_spec_claims.insert("iss".into());
        }
        #[derive(serde::Deserialize)]
        struct Claims {
            #[serde(default)]
            sub: Option<String>,
            #[serde(default)]
            tenant: Option<String>,
            #[serde(default)]
            exp: Option<f64>,
            #[serde(default)]
            nbf: Option<f64>,
        }
        use jsonwebtoken::errors::ErrorKind as K;
        let data = jsonwebtoken::decode::<Claims>(text, &key.key, &v).map_err(|e| match e.kind() {
            K::InvalidSignature => AuthError::BadSignature,
            K::InvalidAudience => AuthError::Audience(self.audience.clone().unwrap_or_default()),
            K::InvalidIssuer => AuthError::Issuer(self.issuer.clone().unwrap_or_default()),
            K::MissingRequiredClaim(c) if c == "aud" => AuthError::Audience(self.audience.clone().unwrap_or_default()),
            K::MissingRequiredClaim(c) if c == "iss" => AuthError::Issuer(self.issuer.clone().unwrap_or_default()),
            K::Json(_) | K::InvalidClaimFormat(_) => AuthError::Claim("a claim has the wrong type"),
            _ => AuthError::Malformed("cannot be decoded"),
        })?;
        let c = data.claims;
        let secs = |t: f64| (t * 1e6) as i64;
        let expires_us = c.exp.map(|e| secs(e).saturating_add(self.leeway_us));
        if expires_us.is_some_and(|e| now_us >= e) {
            return Err(AuthError::Expired);
        }
        if c.nbf.is_some_and(|n| now_us < secs(n).saturating_sub(self.leeway_us)) {
            return Err(AuthError::NotYetValid);
        }
        let name = c.sub.filter(|s| valid_principal(s)).ok_or(AuthError::Claim("sub must be 1-256 printable ASCII"))?;
        if c.tenant.as_deref().is_some_and(|t| !valid_tenant(t)) {
            return Err(AuthError::Claim(TENANT_RULE));
        }
        Ok(Principal { name, tenant: c.tenant, expires_us })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use jsonwebtoken::{encode, EncodingKey, Header};

    const SECRET: &[u8] = b"unit-test-secret-unit-test-secret";
    /// 2026-01-01T00:00:00Z in seconds.
    const T: i64 = 1_767_225_600;

    /// A tenant named as a lite topic kind would share lite topic names with another tenant.
    #[test]
    fn tenant_names_are_checked_and_no_lite_kind() {
        for ok in ["acme", "a_b-9", &"t".repeat(64)] {
            assert!(valid_tenant(ok), "{ok}");
        }
        for bad in ["", "a.b", "a b", &"t".repeat(65), "agent", "client", "session"] {
            assert!(!valid_tenant(bad), "{bad}");
        }
    }

    fn jwks(kids: &[Option<&str>]) -> String {
        // base64url of SECRET, as an `oct` JWK carries it.
        let k = "dW5pdC10ZXN0LXNlY3JldC11bml0LXRlc3Qtc2VjcmV0";
        let keys: Vec<serde_json::Value> = kids
            .iter()
            .map(|kid| match kid {
                Some(kid) => serde_json::json!({"kty": "oct", "k": k, "kid": kid, "alg": "HS256"}),
                None => serde_json::json!({"kty": "oct", "k": k}),
            })
            .collect();
        serde_json::json!({ "keys": keys }).to_string()
    }

    fn mint(kid: Option<&str>, claims: serde_json::Value) -> String {
        let mut h = Header::new(Algorithm::HS256);
        h.kid = kid.map(str::to_owned);
        encode(&h, &claims, &EncodingKey::from_secret(SECRET).unwrap()).unwrap()
    }

    fn keys(kids: &[Option<&str>], leeway_ms: u64) -> Keys {
        match Keys::parse_jwks(&jwks(kids), Some("evmesh".into()), None, leeway_ms) {
            Ok(k) => k,
            Err(e) => panic!("{e}"),
        }
    }

    #[test]
    fn times_are_checked_in_microseconds_with_the_leeway() {
        let k = keys(&[Some("a")], 1000);
        let tok = mint(Some("a"), serde_json::json!({"sub": "p", "aud": "evmesh", "exp": T, "nbf": T - 10}));
        let at = |s: i64, ms: i64| s * 1_000_000 + ms * 1000;
        let p = k.verify(tok.as_bytes(), at(T, 999)).unwrap();
        assert_eq!(p.expires_us, Some(at(T + 1, 0)), "exp plus the leeway");
        assert_eq!(k.verify(tok.as_bytes(), at(T + 1, 0)), Err(AuthError::Expired));
        assert_eq!(k.verify(tok.as_bytes(), at(T - 12, 999)), Err(AuthError::NotYetValid));
        assert!(k.verify(tok.as_bytes(), at(T - 11, 0)).is_ok(), "nbf minus the leeway");
    }

    #[test]
    fn claims_and_keys_are_checked() {
        let k = keys(&[Some("a")], 0);
        let now = T * 1_000_000;
        let ok = serde_json::json!({"sub": "svc", "tenant": "acme", "aud": "evmesh"});
        let p = k.verify(mint(Some("a"), ok.clone()).as_bytes(), now).unwrap();
        assert_eq!((p.name.as_str(), p.tenant.as_deref(), p.expires_us), ("svc", Some("acme"), None));
        let wrong_aud = serde_json::json!({"sub": "svc", "aud": "other"});
        assert_eq!(k.verify(mint(Some("a"), wrong_aud).as_bytes(), now), Err(AuthError::Audience("evmesh".into())));
        let no_sub = serde_json::json!({"aud": "evmesh"});
        assert!(matches!(k.verify(mint(Some("a"), no_sub).as_bytes(), now), Err(AuthError::Claim(_))));
        let bad_tenant = serde_json::json!({"sub": "svc", "aud": "evmesh", "tenant": "a.b"});
        assert!(matches!(k.verify(mint(Some("a"), bad_tenant).as_bytes(), now), Err(AuthError::Claim(_))));
        assert_eq!(k.verify(mint(Some("b"), ok.clone()).as_bytes(), now), Err(AuthError::NoKey(Some("b".into()))));
        let mut forged = mint(Some("a"), ok.clone());
        forged.pop();
        forged.push('A');
        assert!(matches!(k.verify(forged.as_bytes(), now), Err(AuthError::BadSignature | AuthError::Malformed(_))));
        assert!(matches!(k.verify(b"not a token", now), Err(AuthError::Malformed(_))));
        // Without a kid: the one key that fits, never a search among several.
        assert!(k.verify(mint(None, ok.clone()).as_bytes(), now).is_ok());
        let two = keys(&[None, None], 0);
        assert_eq!(two.verify(mint(None, ok).as_bytes(), now), Err(AuthError::NoKey(None)));
    }

    #[test]
    fn token_files_are_checked_and_never_hold_secrets() {
        let hex = |s: &[u8]| sha256(s).iter().map(|b| format!("{b:02x}")).collect::<String>();
        let line = |p: &str, t: Option<&str>, h: &str| {
            serde_json::json!({"principal": p, "tenant": t, "sha256": h}).to_string()
        };
        let text = format!("# comment\n\n{}\n{}\n", line("a", Some("acme"), &hex(b"sa")), line("b", None, &hex(b"sb")));
        let Ok(k) = Keys::parse_tokens(&text) else { panic!("parses") };
        let err = |text: &str| match Keys::parse_tokens(text) {
            Ok(_) => panic!("accepted {text}"),
            Err(e) => e,
        };
        let a = k.verify(b"sa", 0).unwrap();
        assert_eq!((a.name.as_str(), a.tenant.as_deref()), ("a", Some("acme")));
        assert_eq!(k.verify(b"sc", 0), Err(AuthError::UnknownToken));
        assert!(err(&line("a", None, "abc")).contains("64 hex"));
        assert!(err(&line("a", Some("a.b"), &hex(b"x"))).contains("tenant"));
        let twice = format!("{}\n{}", line("a", None, &hex(b"x")), line("b", None, &hex(b"x")));
        assert!(err(&twice).contains("twice"));
        assert!(err("{\"principal\": \"a\"}").contains("line 1"));
    }
}
