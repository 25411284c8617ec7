//! What governance adds to one keep-alive publish, in pure code: the per-connection cached
//! authentication and ACL grant (the common case), a first verification of a static token, an
//! ACL decision over 100 rules when the grant is not cached, and a rate limit taken. The
//! server-level comparison (auth = none vs token vs jwt under load) is perf/auth_cost.sh; its
//! noise is larger than these costs (perf/RESULTS.md).

use std::hint::black_box;
use std::sync::Arc;

use criterion::{criterion_group, criterion_main, Criterion};
use evmesh::governance::acl::{Acl, Action, Kind, Rule, RuleSpec};
use evmesh::governance::identity::{sha256, Keys};
use evmesh::governance::limits::{Limit, LimitSpec, Limits};
use evmesh::governance::{Caller, Snapshot};

fn rule(id: usize, principal: &str, resource: &str) -> Rule {
    let spec = RuleSpec {
        principal: principal.into(),
        resource: resource.into(),
        actions: vec!["PUBLISH".into()],
        effect: "ALLOW".into(),
        priority: (id % 7) as i64,
    };
    Rule::new(&format!("r{id}"), spec).unwrap()
}

fn bench(c: &mut Criterion) {
    let token = b"perf-static-token-0123456789";
    let hex: String = sha256(token).iter().map(|b| format!("{b:02x}")).collect();
    let Ok(keys) = Keys::parse_tokens(&format!("{{\"principal\":\"svc-perf\",\"sha256\":\"{hex}\"}}")) else {
        panic!("tokens")
    };
    // 99 rules that do not match, then the one that does: a realistic worst case for a miss.
    let mut rules: Vec<Rule> =
        (0..99).map(|i| rule(i, &format!("team-{i}-*"), &format!("topic:orders-{i}.*"))).collect();
    rules.push(rule(99, "svc-*", "topic:perf*"));
    let limit = LimitSpec {
        scope: "principal:svc-perf".into(),
        events_per_second: Some(u64::MAX / 4),
        bytes_per_second: None,
        burst: None,
    };
    let snap = Snapshot {
        generation: 1,
        keys: Arc::new(keys),
        acl: Arc::new(Acl::new(rules)),
        limits: Arc::new(Limits::new(vec![Arc::new(Limit::new("l", limit).unwrap())])),
        quotas: Arc::default(),
        transformers: Arc::default(),
        router: Arc::default(),
    };
    let mut g = c.benchmark_group("governance_per_publish");
    let mut caller = Caller::new(None, None);
    let who = caller.authenticate(&snap, Some(token), || 0).unwrap();
    caller.authorize(&snap, &who, Action::Publish, Kind::Topic, "perf").unwrap();
    g.bench_function("cached_authenticate_and_authorize", |b| {
        b.iter(|| {
            let who = caller.authenticate(&snap, Some(black_box(token)), || 0).unwrap();
            caller.authorize(&snap, &who, Action::Publish, Kind::Topic, black_box("perf")).unwrap();
        })
    });
    g.bench_function("static_token_first_verification", |b| {
        b.iter(|| black_box(snap.keys.verify(black_box(token), 0).unwrap()))
    });
    g.bench_function("acl_decision_100_rules", |b| {
        b.iter(|| black_box(snap.acl.decide(black_box("svc-perf"), Kind::Topic, black_box("perf-7"), Action::Publish)))
    });
    // An HS256 JWT's first verification (a JWKS with one `oct` key; base64url of the secret).
    let secret = b"bench-secret-bench-secret-bench!";
    let jwks = r#"{"keys":[{"kty":"oct","kid":"k","alg":"HS256","k":"YmVuY2gtc2VjcmV0LWJlbmNoLXNlY3JldC1iZW5jaCE"}]}"#;
    let Ok(jwt_keys) = Keys::parse_jwks(jwks, None, None, 0) else { panic!("jwks") };
    let mut header = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256);
    header.kid = Some("k".into());
    let claims = serde_json::json!({"sub": "svc-perf", "exp": 4_000_000_000u64});
    let jwt = jsonwebtoken::encode(&header, &claims, &jsonwebtoken::EncodingKey::from_secret(secret).unwrap()).unwrap();
    assert!(jwt_keys.verify(jwt.as_bytes(), 0).is_ok());
    g.bench_function("hs256_jwt_first_verification", |b| {
        b.iter(|| black_box(jwt_keys.verify(black_box(jwt.as_bytes()), 0).unwrap()))
    });
    let mut now = 0u64;
    g.bench_function("rate_limit_take", |b| {
        b.iter(|| {
            now += 1000;
            black_box(snap.limits.take(black_box("svc-perf"), None, "perf", 1, 1024, now).is_ok())
        })
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
