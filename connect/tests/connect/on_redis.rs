//! Against a real Redis: Debian's `redis-server`, started on a free port in a temporary
//! directory with the append-only file on (scripts/test.sh installs it).

use super::*;

/// A redis-server of this test's own; a restart keeps its data (appendonly, fsync always).
struct Redis {
    child: Option<Child>,
    dir: PathBuf,
    port: u16,
}

impl Redis {
    fn start() -> Redis {
        let mut r = Redis { child: None, dir: temp("redis"), port: free_port() };
        r.up();
        r
    }

    fn up(&mut self) {
        let bin = ["/usr/bin/redis-server", "/usr/sbin/redis-server"]
            .into_iter()
            .find(|b| Path::new(b).exists())
            .expect("redis-server is installed (Debian's redis-server; scripts/test.sh installs it)");
        let port = self.port.to_string();
        let args = ["--port", &port, "--bind", "127.0.0.1", "--appendonly", "yes", "--appendfsync", "always"];
        let child = Command::new(bin)
            .args(args)
            .args(["--save", "", "--dir"])
            .arg(&self.dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        self.child = Some(child);
        wait_for(Duration::from_secs(20), || self.conn().ok());
    }

    /// Stops it as a service stop would (SIGTERM).
    fn down(&mut self) {
        if let Some(mut c) = self.child.take() {
            Command::new("kill").args(["-TERM", &c.id().to_string()]).status().unwrap();
            c.wait().unwrap();
        }
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    fn conn(&self) -> redis::RedisResult<redis::Connection> {
        let mut c = redis::Client::open(self.url())?.get_connection()?;
        redis::cmd("PING").query::<String>(&mut c)?;
        Ok(c)
    }

    /// Every entry of `stream`: its fields.
    fn entries(&self, stream: &str) -> Vec<BTreeMap<String, String>> {
        let text = |v: &redis::Value| match v {
            redis::Value::BulkString(b) => String::from_utf8(b.clone()).unwrap(),
            other => panic!("{other:?}"),
        };
        let reply: redis::Value =
            redis::cmd("XRANGE").arg(stream).arg("-").arg("+").query(&mut self.conn().unwrap()).unwrap();
        let redis::Value::Array(entries) = reply else { panic!("{reply:?}") };
        entries
            .iter()
            .map(|e| match e {
                redis::Value::Array(e) => match &e[1] {
                    redis::Value::Array(kv) => kv.chunks(2).map(|c| (text(&c[0]), text(&c[1]))).collect(),
                    other => panic!("{other:?}"),
                },
                other => panic!("{other:?}"),
            })
            .collect()
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn xadd(r: &Redis, stream: &str, fields: &[(&str, &str)]) {
    let mut cmd = redis::cmd("XADD");
    cmd.arg(stream).arg("*");
    for (k, v) in fields {
        cmd.arg(*k).arg(*v);
    }
    let _: String = cmd.query(&mut r.conn().unwrap()).unwrap();
}

#[test]
#[ignore = "needs redis-server (Debian's redis-server; scripts/test.sh installs it)"]
fn the_redis_source_reads_each_entry_once_through_a_crash_after_the_202_and_a_redis_restart() {
    let mut r = Redis::start();
    let broker = Broker::start();
    let (_dirs, cfg, data, files) = Dirs::with_paths();
    let output = files.join("out.jsonl");
    for i in 0..30 {
        xadd(&r, "orders", &[("n", &i.to_string()), ("sku", "A")]);
    }
    let binary = [
        ("ce_specversion", "1.0"),
        ("ce_id", "bin-1"),
        ("ce_source", "/orders"),
        ("ce_type", "order"),
        ("content-type", "application/json"),
        ("data", r#"{"sku":"B"}"#),
    ];
    xadd(&r, "orders", &binary);
    write_connector(
        &cfg,
        "in.toml",
        &format!(
            "name = \"in\"\nkind = \"source\"\nconnector = \"redis\"\ntopic = \"fromr\"\nbatch = 7\n[config]\nurl = \"{}\"\nstream = \"orders\"\n",
            r.url()
        ),
    );
    file_sink(&cfg, "out", "fromr", "fromr-file", &output);
    // The 2nd batch is in evmesh when the process dies, its position not stored: published
    // again after the restart, with the same ids.
    let mut connect = Connect::start_with_fault(broker.url(), cfg.clone(), data.clone(), "source-published:2");
    connect.aborted();
    connect.spawn();
    wait_for(Duration::from_secs(30), || (written(&output).len() >= 31).then_some(()));
    let published = connect.count("in", "published");
    assert_eq!(published, 31 - 7, "from the stored position: the crashed batch again, then the rest");
    // Redis goes away (the connector retries) and comes back with its data.
    r.down();
    connect.retried("in");
    r.up();
    for i in 30..40 {
        xadd(&r, "orders", &[("n", &i.to_string()), ("sku", "A")]);
    }
    let got = wait_for(Duration::from_secs(60), || {
        let w = written(&output);
        (w.len() >= 41).then_some(w)
    });
    let ids: std::collections::BTreeSet<&str> = got.iter().map(|e| e["id"].as_str().unwrap()).collect();
    assert_eq!((got.len(), ids.len()), (41, 41), "each entry once");
    let b = got.iter().find(|e| e["id"] == "bin-1").unwrap();
    assert_eq!((b["source"].as_str(), b["data"].clone()), (Some("/orders"), json!({"sku": "B"})));
    let plain: Vec<&Value> = got.iter().filter(|e| e["type"] == "evmesh.connect.redis.entry").collect();
    assert_eq!(plain.len(), 40);
    assert!(plain.iter().all(|e| e["source"] == "redis:orders"
        && e["id"].as_str().unwrap().starts_with("orders-")
        && e["data"]["sku"] == "A"));
    let position = connect.get("/connectors/in").1["position"]["last"].as_str().unwrap().to_owned();
    assert!(position.contains('-'), "{position}");
    // Each event says where its entry was: the id it has after the stream's name.
    for e in &plain {
        let at: Value = serde_json::from_str(e["connectposition"].as_str().unwrap()).unwrap();
        assert_eq!(e["id"], json!(format!("orders-{}", at["last"].as_str().unwrap())), "{e}");
    }
}

#[test]
#[ignore = "needs redis-server (Debian's redis-server; scripts/test.sh installs it)"]
fn the_redis_sink_adds_each_event_once_through_a_crash_before_the_ack_and_a_redis_restart() {
    let mut r = Redis::start();
    let broker = Broker::start();
    let (_dirs, cfg, data, _) = Dirs::with_paths();
    write_connector(
        &cfg,
        "out.toml",
        &format!(
            "name = \"out\"\nkind = \"sink\"\nconnector = \"redis\"\ntopic = \"tor\"\nsubscription = \"tor-redis\"\n[config]\nurl = \"{}\"\nstream = \"events\"\n",
            r.url()
        ),
    );
    let event = |i: usize| json!({"specversion": "1.0", "id": format!("e{i}"), "source": "/s", "type": "t", "subject": "s", "data": {"i": i}});
    for i in 0..10 {
        publish(&broker, "tor", &event(i));
    }
    // Written to Redis, not acked to evmesh when the process dies: delivered again, not added
    // again.
    let mut connect = Connect::start_with_fault(broker.url(), cfg.clone(), data.clone(), "sink-flushed:1");
    connect.aborted();
    assert!(!r.entries("events").is_empty(), "the batch was written before the crash");
    connect.spawn();
    wait_for(Duration::from_secs(30), || (r.entries("events").len() >= 10).then_some(()));
    let put = || connect.count("out", "put");
    wait_for(Duration::from_secs(30), || (put() >= 1).then_some(()));
    r.down();
    for i in 10..20 {
        publish(&broker, "tor", &event(i));
    }
    connect.retried("out");
    r.up();
    wait_for(Duration::from_secs(60), || (r.entries("events").len() >= 20).then_some(()));
    let got = r.entries("events");
    let mut ids: Vec<&str> = got.iter().map(|e| e["ce_id"].as_str()).collect();
    ids.sort_by_key(|id| id[1..].parse::<u32>().unwrap());
    let want: Vec<String> = (0..20).map(|i| format!("e{i}")).collect();
    assert_eq!(ids, want.iter().map(String::as_str).collect::<Vec<_>>(), "each event once");
    let e3 = got.iter().find(|e| e["ce_id"] == "e3").unwrap();
    assert_eq!(
        (e3["ce_source"].as_str(), e3["ce_subject"].as_str(), e3["content-type"].as_str()),
        ("/s", "s", "application/json")
    );
    assert_eq!(serde_json::from_str::<Value>(&e3["data"]).unwrap(), json!({"i": 3}));
    assert!(!e3.contains_key("ce_emdeliveryid"), "{e3:?}");
}

#[test]
#[ignore = "needs redis-server (Debian's redis-server; scripts/test.sh installs it)"]
fn a_latest_start_is_kept_so_a_restart_before_the_first_batch_skips_nothing() {
    let r = Redis::start();
    let broker = Broker::start();
    let (_dirs, cfg, data, files) = Dirs::with_paths();
    let output = files.join("out.jsonl");
    for i in 0..5 {
        xadd(&r, "late", &[("old", &i.to_string())]);
    }
    write_connector(
        &cfg,
        "in.toml",
        &format!(
            "name = \"in\"\nkind = \"source\"\nconnector = \"redis\"\ntopic = \"fromlate\"\n[config]\nurl = \"{}\"\nstream = \"late\"\nstart = \"latest\"\n",
            r.url()
        ),
    );
    file_sink(&cfg, "out", "fromlate", "fromlate-file", &output);
    let mut connect = Connect::start(broker.url(), cfg.clone(), data.clone());
    // Stored at the open, before any batch.
    wait_for(Duration::from_secs(20), || {
        connect.get("/connectors/in").1["position"]["last"].as_str().map(str::to_owned)
    });
    connect.kill9();
    for i in 0..3 {
        xadd(&r, "late", &[("new", &i.to_string())]);
    }
    connect.spawn();
    let got = wait_for(Duration::from_secs(30), || {
        let w = written(&output);
        (w.len() >= 3).then_some(w)
    });
    assert_eq!(got.len(), 3, "{got:?}");
    assert!(got.iter().all(|e| e["data"]["new"].is_string()), "only the entries after the start: {got:?}");
}
