//! One MQTT connection of a connector: its options, and a driver task that polls rumqttc's
//! event loop (so pings go out while the runtime is busy elsewhere) and hands over, in order,
//! what the connector needs.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use rumqttc::v5::mqttbytes::v5::{
    ConnectReturnCode, Filter, PubAckReason, Publish, RetainForwardRule, SubscribeReasonCode,
};
use rumqttc::v5::mqttbytes::QoS;
use rumqttc::v5::{AsyncClient, ConnectionError, Event as MqttEvent, EventLoop, Incoming, MqttOptions};
use rumqttc::Outgoing;
use tokio::sync::mpsc;

use crate::connectors::key;
use crate::spi::ConnectError;

/// Requests queued for the connection at most (a batch's publishes or acks).
const REQUESTS: usize = 2048;

/// What every MQTT connector takes: where, who, how long a silence lasts.
pub(super) struct Common {
    pub(super) host: String,
    pub(super) port: u16,
    pub(super) client_id: String,
    pub(super) login: Option<(String, String)>,
    pub(super) keep_alive: Duration,
}

pub(super) fn common(config: &toml::Table, name: &str) -> Result<Common, ConnectError> {
    let broker = key(config, "broker", toml::Value::as_str, "host:port")?
        .ok_or_else(|| ConnectError::Fatal("config.broker: the MQTT broker's host:port is required".into()))?;
    let (host, port) = broker
        .rsplit_once(':')
        .and_then(|(h, p)| Some((h.trim_matches(['[', ']']).to_owned(), p.parse().ok()?)))
        .filter(|(h, _)| !h.is_empty())
        .ok_or_else(|| ConnectError::Fatal(format!("config.broker {broker:?}: host:port")))?;
    let client_id = key(config, "client_id", toml::Value::as_str, "a string")?
        .map_or_else(|| format!("evmesh-connect-{name}"), str::to_owned);
    let username = key(config, "username", toml::Value::as_str, "a string")?;
    let password = key(config, "password", toml::Value::as_str, "a string")?;
    let login = match (username, password) {
        (Some(u), p) => Some((u.to_owned(), p.unwrap_or("").to_owned())),
        (None, Some(_)) => return Err(ConnectError::Fatal("config.password: without a username".into())),
        (None, None) => None,
    };
    let secs = key(config, "keep_alive_secs", toml::Value::as_integer, "seconds")?.unwrap_or(30);
    if !(5..=65535).contains(&secs) {
        return Err(ConnectError::Fatal("config.keep_alive_secs: 5 to 65535".into()));
    }
    Ok(Common { host, port, client_id, login, keep_alive: Duration::from_secs(secs as u64) })
}

impl Common {
    pub(super) fn options(&self) -> MqttOptions {
        let mut o = MqttOptions::new(&self.client_id, &self.host, self.port);
        o.set_keep_alive(self.keep_alive).set_request_channel_capacity(REQUESTS);
        if let Some((u, p)) = &self.login {
            o.set_credentials(u, p);
        }
        o
    }
}

/// What a connection's driver hands the connector, in the order it happened.
#[derive(Debug)]
pub(super) enum Note {
    /// Connected in the broker's session numbered `session` (a new number when the broker had
    /// no session for the client).
    Up {
        session: u64,
        max_packet: Option<u32>,
    },
    Publish(Publish),
    /// One of ours went out with this packet id (in the order published).
    Sent(u16),
    Acked(u16, PubAckReason),
    /// The connection failed (once per outage); the driver reconnects.
    Down(String),
    /// The broker refused what the configuration asks for (a login, a subscription).
    Refused(String),
}

/// One connection: the client, the notes of its driver (a task polling rumqttc's event loop,
/// so pings go out while the runtime is busy elsewhere).
pub(super) struct Connection {
    pub(super) client: AsyncClient,
    pub(super) notes: mpsc::Receiver<Note>,
    driver: tokio::task::JoinHandle<()>,
    /// The session the connection is up in (0: down). A message is acknowledged only in the
    /// session it came in: a new session's packet ids are other messages'.
    pub(super) live: Arc<AtomicU64>,
}

impl Connection {
    /// Connects (in the background); `subscribe`: the filters to subscribe to on every
    /// connect; `notes`: how many notes may wait (the driver waits past it).
    pub(super) fn open(options: MqttOptions, subscribe: Vec<String>, notes: usize) -> Connection {
        let (client, events) = AsyncClient::new(options, REQUESTS);
        let (tx, rx) = mpsc::channel(notes);
        let live = Arc::new(AtomicU64::new(0));
        let driver = tokio::spawn(drive(events, client.clone(), subscribe, tx, live.clone()));
        Connection { client, notes: rx, driver, live }
    }

    /// Sends DISCONNECT behind what is queued (acknowledgements), waits a moment for it to go.
    pub(super) async fn close(mut self) {
        if self.client.try_disconnect().is_ok() {
            self.notes.close();
            let _ = tokio::time::timeout(Duration::from_secs(2), &mut self.driver).await;
        }
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        self.driver.abort();
    }
}

/// Polls the event loop until the connector is gone: notes what the connector needs, waits a
/// second after a failure (the next poll reconnects).
async fn drive(
    mut events: EventLoop,
    client: AsyncClient,
    subscribe: Vec<String>,
    tx: mpsc::Sender<Note>,
    live: Arc<AtomicU64>,
) {
    let (mut up, mut session) = (true, 0);
    loop {
        let note = match events.poll().await {
            Ok(MqttEvent::Incoming(Incoming::ConnAck(c))) => {
                up = true;
                if !c.session_present || session == 0 {
                    session += 1;
                }
                live.store(session, Ordering::SeqCst);
                // On every connect: a session can be there without its subscriptions (a crash
                // between CONNECT and SUBSCRIBE, filters changed); retained messages are sent
                // only for a subscription that is new.
                let filters = subscribe.iter().map(|f| Filter {
                    path: f.clone(),
                    qos: QoS::AtLeastOnce,
                    nolocal: false,
                    preserve_retain: false,
                    retain_forward_rule: RetainForwardRule::OnNewSubscribe,
                });
                match (subscribe.is_empty(), client.try_subscribe_many(filters)) {
                    (false, Err(e)) => Some(Note::Down(format!("mqtt subscribe: {e}"))),
                    _ => Some(Note::Up { session, max_packet: c.properties.and_then(|p| p.max_packet_size) }),
                }
            }
            Ok(MqttEvent::Incoming(Incoming::Publish(p))) => Some(Note::Publish(p)),
            Ok(MqttEvent::Incoming(Incoming::PubAck(a))) => Some(Note::Acked(a.pkid, a.reason)),
            // At most once would lose what a crash interrupts: a grant below QoS 1 is a refusal.
            Ok(MqttEvent::Incoming(Incoming::SubAck(s))) => s
                .return_codes
                .iter()
                .find(|c| !matches!(c, SubscribeReasonCode::Success(QoS::AtLeastOnce | QoS::ExactlyOnce)))
                .map(|c| Note::Refused(format!("mqtt subscribe: {c:?}"))),
            Ok(MqttEvent::Outgoing(Outgoing::Publish(pkid))) => Some(Note::Sent(pkid)),
            Ok(MqttEvent::Outgoing(Outgoing::Disconnect)) => return,
            Ok(_) => None,
            Err(e) => {
                live.store(0, Ordering::SeqCst);
                let refused = matches!(
                    &e,
                    ConnectionError::ConnectionRefused(
                        ConnectReturnCode::BadUserNamePassword
                            | ConnectReturnCode::NotAuthorized
                            | ConnectReturnCode::Banned
                            | ConnectReturnCode::BadAuthenticationMethod
                            | ConnectReturnCode::ClientIdentifierNotValid
                    )
                );
                let note = match (refused, up) {
                    (true, _) => Some(Note::Refused(format!("mqtt: {e}"))),
                    (false, true) => Some(Note::Down(format!("mqtt: {e}"))),
                    (false, false) => None,
                };
                up = false;
                if let Some(n) = note {
                    if tx.send(n).await.is_err() {
                        return;
                    }
                }
                tokio::time::sleep(Duration::from_secs(1)).await;
                None
            }
        };
        if let Some(n) = note {
            if tx.send(n).await.is_err() {
                return;
            }
        }
    }
}
