//! Against a real MQTT broker: Debian's `mosquitto`, started on a free port in a temporary
//! directory (scripts/test.sh installs it).

use super::*;
use rumqttc::v5::mqttbytes::v5::{Packet, PublishProperties};
use rumqttc::v5::mqttbytes::QoS;
use rumqttc::v5::{AsyncClient, Event as MqttEvent, MqttOptions};

/// A mosquitto of this test's own, with persistence (a restart keeps sessions and queues).
struct Mosquitto {
    child: Option<Child>,
    dir: PathBuf,
    port: u16,
}

impl Mosquitto {
    /// `extra`: more `mosquitto.conf` lines.
    fn start(extra: &str) -> Mosquitto {
        let dir = temp("mosquitto");
        let port = free_port();
        let user = String::from_utf8(Command::new("id").arg("-un").output().unwrap().stdout).unwrap();
        let conf = format!(
            "listener {port} 127.0.0.1\nallow_anonymous true\npersistence true\npersistence_location {}/\n\
             user {}\nmax_inflight_messages 1000\nmax_queued_messages 100000\n\
             log_type all\nlog_dest file {}/log\n{extra}\n",
            dir.display(),
            user.trim(),
            dir.display()
        );
        std::fs::write(dir.join("mosquitto.conf"), conf).unwrap();
        let mut m = Mosquitto { child: None, dir, port };
        m.up();
        m
    }

    fn up(&mut self) {
        let bin = ["/usr/sbin/mosquitto", "/usr/bin/mosquitto"]
            .into_iter()
            .find(|b| Path::new(b).exists())
            .expect("mosquitto is installed (Debian's mosquitto; scripts/test.sh installs it)");
        let child = Command::new(bin)
            .arg("-c")
            .arg(self.dir.join("mosquitto.conf"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        self.child = Some(child);
        wait_for(Duration::from_secs(20), || TcpStream::connect(("127.0.0.1", self.port)).ok());
    }

    /// Stops it as a service stop would (SIGTERM: the sessions and queues are saved).
    fn down(&mut self) {
        if let Some(mut c) = self.child.take() {
            Command::new("kill").args(["-TERM", &c.id().to_string()]).status().unwrap();
            c.wait().unwrap();
        }
    }

    /// What it logged (every packet).
    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("log")).unwrap_or_default()
    }

    fn broker(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }
}

impl Drop for Mosquitto {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// An MQTT 5 client of the test's own.
struct Client {
    rt: tokio::runtime::Runtime,
    client: AsyncClient,
    events: rumqttc::v5::EventLoop,
}

/// A message as received: topic, payload, content type, user properties.
type Received = (String, Vec<u8>, Option<String>, BTreeMap<String, String>);

impl Client {
    /// `session`: a client id whose session the broker keeps (clean start off), else a fresh one.
    fn connect(m: &Mosquitto, session: Option<&str>) -> Client {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let id = session.map_or_else(|| format!("test-{}", fastrand()), str::to_owned);
        let mut o = MqttOptions::new(id, "127.0.0.1", m.port);
        o.set_keep_alive(Duration::from_secs(30));
        if session.is_some() {
            o.set_clean_start(false).set_session_expiry_interval(Some(3600));
        }
        let (client, events) = AsyncClient::new(o, 1000);
        let mut c = Client { rt, client, events };
        c.until(|e| matches!(e, Packet::ConnAck(_)));
        c
    }

    /// Polls until `f` matches an incoming packet.
    fn until(&mut self, mut f: impl FnMut(&Packet) -> bool) {
        let events = &mut self.events;
        self.rt.block_on(async {
            tokio::time::timeout(Duration::from_secs(20), async {
                loop {
                    if let MqttEvent::Incoming(p) = events.poll().await.expect("the test's MQTT connection") {
                        if f(&p) {
                            return;
                        }
                    }
                }
            })
            .await
            .expect("in time")
        });
    }

    fn subscribe(&mut self, filter: &str) {
        self.rt.block_on(self.client.subscribe(filter, QoS::AtLeastOnce)).unwrap();
        self.until(|p| matches!(p, Packet::SubAck(_)));
    }

    /// Publishes at QoS 1 and waits for the broker's PUBACK.
    fn publish(&mut self, topic: &str, payload: &[u8], props: PublishProperties) {
        let c = self.client.clone();
        let (topic, payload) = (topic.to_owned(), payload.to_vec());
        self.rt.block_on(c.publish_with_properties(topic, QoS::AtLeastOnce, false, payload, props)).unwrap();
        self.until(|p| matches!(p, Packet::PubAck(_)));
    }

    /// The next `n` messages (at most 30 s).
    fn receive(&mut self, n: usize) -> Vec<Received> {
        let mut got = Vec::new();
        if n > 0 {
            self.until(|p| {
                if let Packet::Publish(p) = p {
                    let props = p.properties.clone().unwrap_or_default();
                    got.push((
                        String::from_utf8_lossy(&p.topic).into_owned(),
                        p.payload.to_vec(),
                        props.content_type,
                        props.user_properties.into_iter().collect(),
                    ));
                }
                got.len() >= n
            });
        }
        got
    }
}

fn binary_props(id: &str) -> PublishProperties {
    PublishProperties {
        content_type: Some("application/json".into()),
        user_properties: [("specversion", "1.0"), ("id", id), ("source", "/sensors"), ("type", "reading")]
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect(),
        ..Default::default()
    }
}

#[test]
#[ignore = "needs mosquitto (Debian's mosquitto; scripts/test.sh installs it)"]
fn the_mqtt_source_loses_nothing_through_a_crash_after_the_202_and_a_broker_restart() {
    let mut m = Mosquitto::start("");
    let broker = Broker::start();
    let (_dirs, cfg, data, files) = Dirs::with_paths();
    let output = files.join("out.jsonl");
    mqtt_to_file(&m, &cfg, ("batch = 5\n", ""), &output);
    // The connector's session, made beforehand (as a first run leaves it): the broker queues
    // for it while it is not there.
    let mut session = Client::connect(&m, Some("evmesh-connect-in"));
    session.subscribe("in/#");
    drop(session);
    let mut producer = Client::connect(&m, None);
    let plain = |i: usize| format!("{{\"n\":{i}}}");
    for i in 0..20 {
        producer.publish(if i % 2 == 0 { "in/a" } else { "in/b" }, plain(i).as_bytes(), Default::default());
    }
    producer.publish("in/a", br#"{"t":21.5}"#, binary_props("bin-1"));
    let structured = br#"{"specversion":"1.0","id":"st-1","source":"/sensors","type":"reading","data":"x"}"#;
    let props = PublishProperties { content_type: Some("application/cloudevents+json".into()), ..Default::default() };
    producer.publish("in/b", structured, props);
    // The first batch is in evmesh (202) when the process dies, before its commit: nothing was
    // acknowledged to the broker, which sends all 22 again.
    let mut connect = Connect::start_with_fault(broker.url(), cfg.clone(), data.clone(), "source-published:1");
    connect.aborted();
    connect.spawn();
    wait_for(Duration::from_secs(30), || {
        let n: std::collections::BTreeSet<i64> =
            written(&output).iter().filter_map(|e| e["data"]["n"].as_i64()).collect();
        (n.len() == 20).then_some(())
    });
    // Then the broker goes away and comes back (its sessions and queues kept), once it has
    // every acknowledgement (one on its way when it stops would be a message sent again).
    wait_for(Duration::from_secs(30), || {
        m.log().contains("Received PUBACK from evmesh-connect-in (Mid: 22,").then_some(())
    });
    m.down();
    m.up();
    let mut producer = Client::connect(&m, None);
    for i in 20..30 {
        producer.publish("in/a", plain(i).as_bytes(), Default::default());
    }
    producer.publish("in/a", br#"{"t":22.5}"#, binary_props("bin-2"));
    let got = wait_for(Duration::from_secs(60), || {
        let w = written(&output);
        let n: std::collections::BTreeSet<i64> = w.iter().filter_map(|e| e["data"]["n"].as_i64()).collect();
        (n.len() == 30 && w.iter().any(|e| e["id"] == "bin-2")).then_some(w)
    });
    // The CloudEvents ones carry their producer's ids: the file sink wrote each once.
    for id in ["bin-1", "st-1", "bin-2"] {
        assert_eq!(got.iter().filter(|e| e["id"] == id).count(), 1, "{id}: {got:?}");
    }
    // The plain ones of the batch published before the crash are there twice: MQTT gives a
    // message no identity, so each copy has an id of its own. No other is.
    let mut copies: BTreeMap<i64, Vec<&str>> = BTreeMap::new();
    for e in &got {
        if let Some(n) = e["data"]["n"].as_i64() {
            copies.entry(n).or_default().push(e["id"].as_str().unwrap());
        }
    }
    let twice: Vec<_> = copies.iter().filter(|(_, ids)| ids.len() > 1).collect();
    assert!(twice.len() <= 5 && twice.iter().all(|(_, ids)| ids.len() == 2 && ids[0] != ids[1]), "{copies:?}");
    let e = got.iter().find(|e| e["id"] == "bin-1").unwrap();
    assert_eq!((e["source"].as_str(), e["data"].clone()), (Some("/sensors"), json!({"t": 21.5})));
    let a0 = got.iter().find(|e| e["data"]["n"] == 0).unwrap();
    assert_eq!((a0["subject"].as_str(), a0["partitionkey"].as_str()), (Some("in/a"), Some("in/a")));
    assert_eq!(a0["source"], json!(format!("mqtt://{}", m.broker())));
    assert_eq!(a0["type"], "evmesh.connect.mqtt.message");
    assert!(a0["id"].as_str().unwrap().starts_with("mqtt-"), "{a0}");
}

#[test]
#[ignore = "needs mosquitto (Debian's mosquitto; scripts/test.sh installs it)"]
fn the_mqtt_sink_publishes_each_event_through_a_broker_restart_and_dead_letters_one_too_large() {
    let mut m = Mosquitto::start("max_packet_size 2048");
    let broker = Broker::start();
    let (_dirs, cfg, data, files) = Dirs::with_paths();
    let dead = files.join("dead.jsonl");
    write_connector(
        &cfg,
        "out.toml",
        &format!(
            "name = \"out\"\nkind = \"sink\"\nconnector = \"mqtt\"\ntopic = \"tom\"\nsubscription = \"tom-mqtt\"\n[config]\nbroker = \"{}\"\ntopic = \"out/events\"\nack_timeout_ms = 2000\n",
            m.broker()
        ),
    );
    file_sink(&cfg, "dead", "tom.dlq", "dead-file", &dead);
    // A consumer whose session the broker keeps (and queues for) while it is away.
    let mut consumer = Client::connect(&m, Some("test-consumer"));
    consumer.subscribe("out/#");
    drop(consumer);
    let connect = Connect::start(broker.url(), cfg.clone(), data.clone());
    let event = |i: usize, data: Value| json!({"specversion": "1.0", "id": format!("e{i}"), "source": "/s", "type": "t", "subject": "s", "data": data});
    let put = || connect.count("out", "put");
    for i in 0..10 {
        publish(&broker, "tom", &event(i, json!({"i": i})));
    }
    publish(&broker, "tom", &event(10, json!("x".repeat(3000))));
    for i in 11..15 {
        publish(&broker, "tom", &event(i, json!({"i": i})));
    }
    // `put` counts the batch, the dead-lettered event too.
    wait_for(Duration::from_secs(30), || (put() == 15).then_some(()));
    let dl = wait_for(Duration::from_secs(30), || written(&dead).into_iter().next());
    assert_eq!(dl["id"], "e10");
    assert!(dl["connecterror"].as_str().unwrap().contains("maximum packet size"), "{dl}");
    // The broker away: nothing is acked to evmesh until it is back.
    m.down();
    for i in 15..25 {
        publish(&broker, "tom", &event(i, json!({"i": i})));
    }
    connect.retried("out");
    assert_eq!(put(), 15, "nothing put while the broker is away");
    m.up();
    wait_for(Duration::from_secs(60), || (put() == 25).then_some(()));
    let mut consumer = Client::connect(&m, Some("test-consumer"));
    let got = consumer.receive(24);
    let ids: std::collections::BTreeSet<&str> = got.iter().map(|(_, _, _, p)| p["id"].as_str()).collect();
    let want: std::collections::BTreeSet<String> = (0..25).filter(|i| *i != 10).map(|i| format!("e{i}")).collect();
    assert_eq!(ids, want.iter().map(String::as_str).collect());
    let (topic, payload, ct, props) = got.iter().find(|(_, _, _, p)| p["id"] == "e3").unwrap();
    assert_eq!(
        (topic.as_str(), ct.as_deref(), props["source"].as_str(), props["subject"].as_str()),
        ("out/events", Some("application/json"), "/s", "s")
    );
    assert_eq!(serde_json::from_slice::<Value>(payload).unwrap(), json!({"i": 3}));
    assert!(!props.contains_key("emdeliveryid"), "{props:?}");
}

#[test]
#[ignore = "needs mosquitto (Debian's mosquitto; scripts/test.sh installs it)"]
fn a_source_subscribes_in_a_session_the_broker_kept_without_its_subscription() {
    let m = Mosquitto::start("");
    let broker = Broker::start();
    let (_dirs, cfg, data, files) = Dirs::with_paths();
    let output = files.join("out.jsonl");
    // The session is there (a crash between CONNECT and SUBSCRIBE leaves it so), its
    // subscription is not: the connector subscribes on every connect.
    drop(Client::connect(&m, Some("evmesh-connect-in")));
    mqtt_to_file(&m, &cfg, ("", ""), &output);
    let connect = Connect::start(broker.url(), cfg.clone(), data.clone());
    let mut producer = Client::connect(&m, None);
    probe_until_written(&mut producer, &output);
    drop(connect);
}

#[test]
#[ignore = "needs mosquitto (Debian's mosquitto; scripts/test.sh installs it)"]
fn a_message_over_the_sources_maximum_does_not_stall_it() {
    let m = Mosquitto::start("");
    let broker = Broker::start();
    let (_dirs, cfg, data, files) = Dirs::with_paths();
    let output = files.join("out.jsonl");
    mqtt_to_file(&m, &cfg, ("", "max_message_bytes = 2048\n"), &output);
    let connect = Connect::start(broker.url(), cfg.clone(), data.clone());
    let mut producer = Client::connect(&m, None);
    probe_until_written(&mut producer, &output);
    // Over the announced maximum: the broker does not send it (a client that read it would
    // drop its connection on it, and be sent it again, for good). Those after it arrive.
    producer.publish("in/a", format!("{{\"big\":\"{}\"}}", "x".repeat(4096)).as_bytes(), Default::default());
    for i in 0..5 {
        producer.publish("in/a", format!("{{\"n\":{i}}}").as_bytes(), Default::default());
    }
    let got = wait_for(Duration::from_secs(30), || {
        let w = written(&output);
        (w.iter().filter(|e| e["data"]["n"].is_number()).count() == 5).then_some(w)
    });
    assert!(got.iter().all(|e| e["data"]["big"].is_null()), "nothing over 2 KiB taken");
    assert_eq!(connect.get("/connectors/in").1["state"], "running");
}

/// The MQTT source `in` (`in/#` into topic `fromm`; `source` and `config` lines added to its
/// table and its `[config]`), and a file sink of `fromm` writing `output`.
fn mqtt_to_file(m: &Mosquitto, cfg: &Path, (source, config): (&str, &str), output: &Path) {
    let toml = format!(
        "name = \"in\"\nkind = \"source\"\nconnector = \"mqtt\"\ntopic = \"fromm\"\n{source}[config]\nbroker = \"{}\"\ntopics = [\"in/#\"]\n{config}",
        m.broker()
    );
    write_connector(cfg, "in.toml", &toml);
    file_sink(cfg, "out", "fromm", "fromm-file", output);
}

/// Publishes a probe to `in/a` until something reaches `output` (the source is subscribed and
/// the pipeline runs).
fn probe_until_written(producer: &mut Client, output: &Path) {
    wait_for(Duration::from_secs(20), || {
        producer.publish("in/a", b"{\"probe\":1}", Default::default());
        (!written(output).is_empty()).then_some(())
    });
}
