//! The configuration's tests: loading from flags, variables and a file, and validation.

use std::path::PathBuf;
use std::time::Duration;

use super::*;
use crate::storage::Durability;

fn load(args: &[&str], env: &[(&str, &str)]) -> Result<Config, ConfigError> {
    let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
    RawConfig::load(&args, env.iter().map(|(k, v)| (k.to_string(), v.to_string())))?.validate()
}

#[test]
fn advertised_url_is_a_bare_http_url_or_empty() {
    assert_eq!(load(&[], &[]).unwrap().advertised_url, "", "filled in from the bound listener");
    let c = load(&["--advertised-url", "https://broker.example:8443/"], &[]).unwrap();
    assert_eq!(c.advertised_url, "https://broker.example:8443");
    for bad in ["broker:8080", "http://", "http://h/path", "ftp://h"] {
        assert!(load(&["--advertised-url", bad], &[]).is_err(), "{bad}");
    }
    assert_eq!(local_url("0.0.0.0:8080".parse().unwrap(), false), "http://127.0.0.1:8080");
    assert_eq!(local_url("[::]:8443".parse().unwrap(), true), "https://[::1]:8443");
}

#[test]
fn instance_ids_and_the_heartbeat_timeout_are_checked() {
    let c = load(&[], &[]).unwrap();
    assert_eq!((c.instance_id.as_str(), c.heartbeat, c.instance_timeout), ("", ms(1000), ms(3000)));
    assert_eq!(load(&["--instance-id", "eu-1.a_2"], &[]).unwrap().instance_id, "eu-1.a_2");
    let key_of = |args: &[&str]| match load(args, &[]) {
        Err(ConfigError::Invalid { key, .. }) => key,
        other => panic!("{other:?}"),
    };
    assert_eq!(key_of(&["--instance-id", "a b"]), "instance_id");
    assert_eq!(key_of(&["--instance-id", &"x".repeat(65)]), "instance_id");
    // A timeout under two heartbeats would count a live instance dead between two of them.
    assert_eq!(key_of(&["--heartbeat-ms", "1000", "--instance-timeout-ms", "1500"]), "instance_timeout_ms");
    assert!(load(&["--heartbeat-ms", "100", "--instance-timeout-ms", "200"], &[]).is_ok());
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

#[test]
fn tls_needs_both_files_and_mutual_tls_needs_tls() {
    let key_of = |args: &[&str]| match load(args, &[]) {
        Err(ConfigError::Invalid { key, .. }) => key,
        other => panic!("{other:?}"),
    };
    assert_eq!(key_of(&["--tls-cert", "c.pem"]), "tls_key");
    assert_eq!(key_of(&["--tls-key", "k.pem"]), "tls_cert");
    assert_eq!(key_of(&["--tls-client-ca", "ca.pem"]), "tls_client_ca");
    let c = load(&["--tls-cert", "c.pem", "--tls-key", "k.pem", "--tls-client-ca", "ca.pem"], &[]).unwrap();
    let files = c.tls.unwrap();
    assert_eq!(
        (files.cert.to_str(), files.client_ca.as_deref().and_then(|p| p.to_str())),
        (Some("c.pem"), Some("ca.pem"))
    );
    assert!(load(&[], &[]).unwrap().tls.is_none());
}

#[test]
fn defaults_match_the_spec() {
    let c = load(&[], &[]).unwrap();
    assert_eq!(c.listen.to_string(), "127.0.0.1:8080");
    assert_eq!(c.admin_listen.to_string(), "127.0.0.1:8081");
    assert_eq!(c.durability, Durability::Os);
    assert_eq!(c.io_driver, IoDriver::Auto);
    assert_eq!(c.storage, StorageKind::Embedded);
    assert_eq!(c.data_dir, PathBuf::from("./data"));
    assert_eq!(c.limits.max_body_bytes, 1 << 20);
    assert_eq!(c.limits.max_header_bytes, 16 << 10);
    assert_eq!(c.header_read_timeout, Duration::from_secs(10));
    assert_eq!(c.write_timeout, Duration::from_secs(10));
    assert_eq!(c.shards, std::thread::available_parallelism().unwrap().get());
}

#[test]
fn flags_beat_env_beat_file() {
    let dir = std::env::temp_dir().join(format!("evmesh-cfg-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("e.toml");
    std::fs::write(&file, "shards = 3\ndurability = \"fsync\"\nio_driver = \"epoll\"\n").unwrap();
    let f = file.to_str().unwrap();
    let c = load(&["--config", f, "--shards=5"], &[("EVMESH_SHARDS", "4"), ("EVMESH_DURABILITY", "memory")]).unwrap();
    assert_eq!(c.shards, 5);
    assert_eq!(c.durability, Durability::Memory);
    assert_eq!(c.io_driver, IoDriver::Epoll);
    let c = load(&["--config", f], &[("EVMESH_SHARDS", "4")]).unwrap();
    assert_eq!(c.shards, 4);
    let c = load(&["--write-timeout-ms", "250"], &[]).unwrap();
    assert_eq!(c.write_timeout, Duration::from_millis(250));
    let c = load(&[], &[("EVMESH_WRITE_TIMEOUT_MS", "750")]).unwrap();
    assert_eq!(c.write_timeout, Duration::from_millis(750));
}

#[test]
fn bad_values_are_named() {
    let err = |args: &[&str], env: &[(&str, &str)]| load(args, env).unwrap_err().to_string();
    assert!(err(&["--durability", "disk"], &[]).contains("durability"));
    assert!(err(&["--write-timeout-ms", "0"], &[]).contains("write_timeout_ms"));
    assert!(err(&["--listen", "nowhere"], &[]).contains("listen"));
    assert!(err(&["--bogus", "1"], &[]).contains("--bogus"));
    assert!(err(&["--shards"], &[]).contains("needs a value"));
    assert!(err(&[], &[("EVMESH_SHARDS", "many")]).contains("whole number"));
    assert!(load(&[], &[("EVMESH_PORT", "tcp://10.0.0.1:8080")]).is_ok(), "unknown variables are only warned about");
    let unknown = |env: &[(&str, &str)]| {
        let env = env.iter().map(|(k, v)| (k.to_string(), v.to_string()));
        RawConfig::load(&[], env).expect("loads").unknown_variables
    };
    assert_eq!(
        unknown(&[("EVMESH_PORT", "1"), ("EVMESH_ALLOCATOR", "system")]),
        ["EVMESH_PORT"],
        "the heap's variable is known"
    );
    assert!(err(&["--storage", "kafka", "--kafka-acks", "some"], &[]).contains("kafka.acks"));
    assert!(err(&["--storage", "kafka", "--kafka-properties", "nokey"], &[]).contains("KEY=VALUE"));
    assert!(err(&["--storage", "kafka", "--kafka-topic-prefix", "a/b"], &[]).contains("kafka.topic_prefix"));
    let c = load(
        &[
            "--storage",
            "kafka",
            "--kafka-brokers",
            "k1:9092,k2:9092",
            "--kafka-properties",
            "security.protocol=ssl, a=b",
        ],
        &[],
    )
    .unwrap();
    match c.storage {
        StorageKind::Kafka(k) => {
            assert_eq!((k.brokers.as_str(), k.acks.as_str(), k.replication_factor), ("k1:9092,k2:9092", "all", 1));
            assert_eq!(k.properties, [("security.protocol".into(), "ssl".into()), ("a".into(), "b".into())]);
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn rocketmq_settings_are_checked_and_need_the_feature() {
    let err = |args: &[&str]| load(args, &[]).unwrap_err().to_string();
    if cfg!(not(feature = "rocketmq")) {
        let e = err(&["--storage", "rocketmq"]);
        assert!(e.contains("built without the rocketmq cargo feature"), "{e}");
        return;
    }
    assert!(err(&["--storage", "rocketmq", "--rocketmq-namesrv", "nohost"]).contains("rocketmq.namesrv"));
    assert!(err(&["--storage", "rocketmq", "--rocketmq-namesrv", "a:1;b:x"]).contains("rocketmq.namesrv"));
    assert!(err(&["--storage", "rocketmq", "--rocketmq-topic-prefix", "a.b"]).contains("rocketmq.topic_prefix"));
    let long = "p".repeat(65);
    assert!(err(&["--storage", "rocketmq", "--rocketmq-topic-prefix", &long]).contains("rocketmq.topic_prefix"));
    assert!(err(&["--storage", "rocketmq", "--rocketmq-send-timeout-ms", "50"]).contains("rocketmq.send_timeout_ms"));
    let c = load(&["--storage", "rocketmq"], &[]).unwrap();
    assert!(c.storage.remote() && !c.storage.clustered(), "one instance's remote log");
    let c = load(
        &["--storage", "rocketmq", "--rocketmq-namesrv", " ns1:9876 ; ns2:9877 "],
        &[("EVMESH_ROCKETMQ_TOPIC_PREFIX", "evm-"), ("EVMESH_ROCKETMQ_SEND_TIMEOUT_MS", "1500")],
    )
    .unwrap();
    match c.storage {
        StorageKind::RocketMq(r) => {
            assert_eq!((r.namesrv.as_str(), r.topic_prefix.as_str()), ("ns1:9876;ns2:9877", "evm-"));
            assert_eq!((r.send_timeout, r.topic_refresh), (ms(1500), ms(10_000)));
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn tier_settings_are_checked_and_only_for_the_embedded_log() {
    let key_of = |args: &[&str]| match load(args, &[]) {
        Err(ConfigError::Invalid { key, .. }) => key,
        other => panic!("{other:?}"),
    };
    assert_eq!(load(&[], &[]).unwrap().tier, None, "off unless a bucket is named");
    assert_eq!(key_of(&["--local-retention-bytes", "1000"]), "local_retention_bytes");
    assert_eq!(key_of(&["--local-retention-ms", "1000"]), "local_retention_ms");
    assert_eq!(key_of(&["--tier-s3-bucket", "Bad_Name"]), "tier.s3.bucket");
    assert_eq!(key_of(&["--tier-s3-bucket", "ok-bucket", "--tier-s3-endpoint", "minio:9000"]), "tier.s3.endpoint");
    assert_eq!(key_of(&["--tier-s3-bucket", "ok-bucket", "--tier-s3-prefix", "a//b"]), "tier.s3.prefix");
    assert_eq!(key_of(&["--tier-s3-bucket", "ok-bucket", "--tier-s3-cache-bytes", "1024"]), "tier.s3.cache_bytes");
    if cfg!(feature = "kafka") {
        assert_eq!(key_of(&["--storage", "kafka", "--tier-s3-bucket", "ok-bucket"]), "tier.s3.bucket");
    }
    let c = load(
        &[
            "--tier-s3-bucket",
            "ok-bucket",
            "--tier-s3-endpoint",
            "http://127.0.0.1:9000/",
            "--local-retention-ms",
            "60000",
        ],
        &[("EVMESH_TIER_S3_PREFIX", "/evm/prod/"), ("EVMESH_LOCAL_RETENTION_BYTES", "1048576")],
    )
    .unwrap();
    let t = c.tier.unwrap();
    assert_eq!(
        (t.bucket.as_str(), t.endpoint.as_str(), t.prefix.as_str()),
        ("ok-bucket", "http://127.0.0.1:9000", "evm/prod")
    );
    assert_eq!((t.region.as_str(), t.upload_interval, t.cache_bytes), ("us-east-1", ms(10_000), 64 << 20));
    assert_eq!((t.local_retention_bytes, t.local_retention_ms), (Some(1 << 20), Some(60_000)));
}
