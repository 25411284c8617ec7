//! The command-line clients `evmesh pub | sub | request | stream | agent`, built on
//! `evmesh-client` (the same SDK applications use, so every tour exercises it). Part of the
//! `evmesh` binary, not of the broker library: nothing here runs on a shard.
//!
//! Exit codes: 0 done; 1 the broker refused (its problem+json printed on stdout, `HTTP <status>`
//! on stderr) or the command could not reach it; 2 a usage error (clap's).

use std::io::{Read, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use evmesh_client::cloudevents::{Event, EventBuilder, EventBuilderV10};
use evmesh_client::{Agent, AgentEvent, Client, ConnectionState, Error};
use futures_util::StreamExt;

/// What the client commands exit with.
const EXIT_CODES: &str = "Exit codes: 0 done; 1 refused by the broker (its problem+json on stdout, \
HTTP <status> on stderr) or the broker could not be reached; 2 a usage error.";

/// evmesh: a thread-per-core CloudEvents broker front, and its command-line clients.
#[derive(Parser)]
#[command(name = "evmesh", version, propagate_version = true, after_help = EXIT_CODES)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand)]
pub enum Command {
    /// Run the broker (`evmesh serve --help` lists every flag and key).
    #[command(disable_help_flag = true)]
    Serve {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true, hide = true)]
        args: Vec<String>,
    },
    /// Publish one CloudEvent, from flags or (with none of --type, --data, --data-text) from stdin;
    /// prints where it was stored.
    #[command(after_help = EXIT_CODES)]
    Pub(PubArgs),
    /// Follow a subscription and print each event as a JSON line, acknowledging it once
    /// printed; reconnects by itself (a broker restart, a moved home) and resumes from the
    /// subscription's committed offsets.
    #[command(after_help = EXIT_CODES)]
    Sub(SubArgs),
    /// Send a request and print its reply (or fail with the 504 once the timeout passed).
    #[command(after_help = EXIT_CODES)]
    Request(RequestArgs),
    /// Print a session's events (session pub/sub) from its head, then live, as JSON lines.
    #[command(after_help = EXIT_CODES)]
    Stream(StreamArgs),
    /// A streaming agent for the tour and tests: echoes each turn's prompt back, a word per chunk.
    #[command(after_help = EXIT_CODES)]
    Agent(AgentArgs),
    /// Print the commented default configuration (evmesh.toml).
    PrintConfig,
}

/// Where the broker is and how to reach it.
#[derive(Args, Clone)]
pub struct Connection {
    /// The broker: http://HOST[:PORT] or https://HOST[:PORT].
    #[arg(long, default_value = "http://127.0.0.1:8080")]
    url: String,
    /// A bearer token.
    #[arg(long, env = "EVMESH_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// Trust only these CA certificates (PEM) for https (default: the public web roots).
    #[arg(long, value_name = "FILE")]
    cacert: Option<PathBuf>,
    /// A client certificate chain (PEM), for mutual TLS.
    #[arg(long, value_name = "FILE", requires = "key")]
    cert: Option<PathBuf>,
    /// The client certificate's private key (PEM).
    #[arg(long, value_name = "FILE", requires = "cert")]
    key: Option<PathBuf>,
}

/// The event `pub` and `request` send.
#[derive(Args)]
pub struct EventArgs {
    /// The topic.
    #[arg(long)]
    topic: String,
    /// The event's `type` (default evmesh.cli).
    #[arg(long = "type")]
    ty: Option<String>,
    /// The event's `source`.
    #[arg(long, default_value = "/evmesh/cli")]
    source: String,
    /// The event's `id` (default: generated).
    #[arg(long)]
    id: Option<String>,
    /// The `partitionkey` extension.
    #[arg(long)]
    partition_key: Option<String>,
    /// JSON data (datacontenttype application/json).
    #[arg(long, conflicts_with = "data_text")]
    data: Option<String>,
    /// Text data (datacontenttype text/plain).
    #[arg(long)]
    data_text: Option<String>,
}

#[derive(Args)]
pub struct PubArgs {
    #[command(flatten)]
    event: EventArgs,
    #[command(flatten)]
    conn: Connection,
}

#[derive(Args)]
pub struct SubArgs {
    /// The subscription.
    #[arg(long)]
    subscription: String,
    /// The client id of a BROADCAST or MULTICAST subscription (its offsets are kept between runs).
    #[arg(long)]
    client_id: Option<String>,
    /// Attach with ack=none (BROADCAST live fan-out, at-most-once from the moment of attaching).
    #[arg(long)]
    no_ack: bool,
    /// Stop after N events.
    #[arg(long, value_name = "N")]
    max: Option<u64>,
    /// Unacknowledged events the broker may have out to this client (per shard).
    #[arg(long, default_value_t = 256)]
    window: u32,
    #[command(flatten)]
    conn: Connection,
}

#[derive(Args)]
pub struct RequestArgs {
    #[command(flatten)]
    event: EventArgs,
    /// How long to wait for the reply.
    #[arg(long, default_value_t = 30_000, value_parser = clap::value_parser!(u64).range(1..))]
    timeout_ms: u64,
    #[command(flatten)]
    conn: Connection,
}

#[derive(Args)]
pub struct StreamArgs {
    /// The session id.
    #[arg(long)]
    session: String,
    /// Stop after N events.
    #[arg(long, value_name = "N")]
    max: Option<u64>,
    #[command(flatten)]
    conn: Connection,
}

#[derive(Args)]
pub struct AgentArgs {
    /// The agent id.
    #[arg(long)]
    agent_id: String,
    /// Pause between chunks.
    #[arg(long, default_value_t = 0)]
    delay_ms: u64,
    /// Stop after N turns.
    #[arg(long, value_name = "N")]
    max_turns: Option<u64>,
    /// The broker's agent_heartbeat_timeout_ms; the agent beats three times as often.
    #[arg(long, default_value_t = 30_000, value_parser = clap::value_parser!(u64).range(3..))]
    heartbeat_ms: u64,
    #[command(flatten)]
    conn: Connection,
}

/// A client command, running.
type Pending = std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), Failure>>>>;

/// Runs a client command on a small tokio runtime.
pub fn run(command: Command) -> ExitCode {
    let (name, fut): (&str, Pending) = match command {
        Command::Pub(a) => ("pub", Box::pin(publish(a))),
        Command::Sub(a) => ("sub", Box::pin(subscribe(a))),
        Command::Request(a) => ("request", Box::pin(request(a))),
        Command::Stream(a) => ("stream", Box::pin(stream(a))),
        Command::Agent(a) => ("agent", Box::pin(agent(a))),
        Command::Serve { .. } | Command::PrintConfig => unreachable!("not a client command"),
    };
    // Two workers: printing to a slow stdout blocks the command's own task, never the
    // connection's (which keeps reading and answering pings).
    let rt = match tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("evmesh {name}: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(fut) {
        Ok(()) => ExitCode::SUCCESS,
        Err(f) => {
            if let Some(p) = f.0.problem() {
                // The refusal itself, for scripts; its status for people.
                println!("{}", p.body);
                eprintln!("evmesh {name}: HTTP {} {}", p.status, p.detail.as_deref().unwrap_or(&p.title));
            } else {
                eprintln!("evmesh {name}: {}", f.chain());
            }
            ExitCode::FAILURE
        }
    }
}

/// A command's error, with where it was going.
struct Failure(Error, String);

impl Failure {
    /// The error and its causes (a TLS failure says which certificate), and the address.
    fn chain(&self) -> String {
        let mut s = format!("{}: {}", self.1, self.0);
        let mut cause = std::error::Error::source(&self.0);
        while let Some(c) = cause {
            s.push_str(&format!(": {c}"));
            cause = c.source();
        }
        s
    }
}

fn client(conn: &Connection) -> Result<(Client, String), Failure> {
    let place = match reqwest_like_place(&conn.url) {
        Some(p) => p,
        None => conn.url.clone(),
    };
    let fail = |e: Error| Failure(e, place.clone());
    let mut b = Client::builder(&conn.url).user_agent(concat!("evmesh-cli/", env!("CARGO_PKG_VERSION")));
    if let Some(t) = &conn.token {
        b = b.token(t.clone());
    }
    let read = |p: &PathBuf| {
        std::fs::read(p).map_err(|e| Failure(Error::Config(format!("{}: {e}", p.display())), place.clone()))
    };
    if let Some(ca) = &conn.cacert {
        b = b.root_certificates_pem(read(ca)?).only_given_roots();
    }
    if let (Some(cert), Some(key)) = (&conn.cert, &conn.key) {
        b = b.client_identity_pem(read(cert)?, read(key)?);
    }
    Ok((b.build().map_err(fail)?, place))
}

/// `HOST:PORT` of a URL, the scheme's port when it names none (what an error should name).
fn reqwest_like_place(url: &str) -> Option<String> {
    let u = url::Url::parse(url).ok()?;
    Some(format!("{}:{}", u.host_str()?, u.port_or_known_default()?))
}

fn new_id() -> String {
    let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    format!("{:x}-{:x}", t.as_nanos(), std::process::id())
}

/// The event the flags describe, or the structured CloudEvent on stdin when none of `--type`,
/// `--data`, `--data-text` is given.
fn event_from(a: &EventArgs) -> Result<Event, Error> {
    if a.ty.is_none() && a.data.is_none() && a.data_text.is_none() {
        let mut s = Vec::new();
        std::io::stdin().read_to_end(&mut s).map_err(|e| Error::Config(format!("stdin: {e}")))?;
        return evmesh_client::from_json(&s).map_err(|e| Error::Config(format!("stdin: {e}")));
    }
    let mut b = EventBuilderV10::new()
        .id(a.id.clone().unwrap_or_else(new_id))
        .source(a.source.clone())
        .ty(a.ty.clone().unwrap_or_else(|| "evmesh.cli".into()));
    if let Some(k) = &a.partition_key {
        b = b.extension("partitionkey", k.clone());
    }
    if let Some(d) = &a.data {
        let v: serde_json::Value =
            serde_json::from_str(d).map_err(|e| Error::Config(format!("--data is not JSON: {e}")))?;
        b = b.data("application/json", v);
    } else if let Some(d) = &a.data_text {
        b = b.data("text/plain", d.clone());
    }
    b.build().map_err(|e| Error::Config(format!("the event: {e}")))
}

async fn publish(a: PubArgs) -> Result<(), Failure> {
    let (c, place) = client(&a.conn)?;
    let fail = |e| Failure(e, place.clone());
    let event = event_from(&a.event).map_err(fail)?;
    let p = c.publish(&a.event.topic, &event).await.map_err(fail)?;
    match &p.topic {
        None => println!(r#"{{"partition":{},"offset":{}}}"#, p.partition, p.offset),
        Some(t) => {
            println!(r#"{{"partition":{},"offset":{},"topic":{}}}"#, p.partition, p.offset, serde_json::json!(t))
        }
    }
    Ok(())
}

async fn request(a: RequestArgs) -> Result<(), Failure> {
    let (c, place) = client(&a.conn)?;
    let fail = |e| Failure(e, place.clone());
    let event = event_from(&a.event).map_err(fail)?;
    let reply = c.request(&a.event.topic, &event, Duration::from_millis(a.timeout_ms)).await.map_err(fail)?;
    println!("{}", serde_json::to_string(&reply).map_err(|e| fail(Error::Protocol(e.to_string())))?);
    Ok(())
}

/// Prints a connection's changes on stderr, so a person sees it reconnect and where it went.
fn report(name: &'static str, mut state: tokio::sync::watch::Receiver<ConnectionState>) {
    tokio::spawn(async move {
        while state.changed().await.is_ok() {
            let s = state.borrow_and_update().clone();
            match s {
                ConnectionState::Connected { url } => eprintln!("evmesh {name}: attached at {url}"),
                ConnectionState::Disconnected { reason, retry_in } => {
                    eprintln!("evmesh {name}: {reason}; again in {:.1} s", retry_in.as_secs_f64())
                }
                _ => {}
            }
        }
    });
}

fn print_line(line: &str) -> Result<(), Error> {
    let mut out = std::io::stdout().lock();
    writeln!(out, "{line}").and_then(|()| out.flush()).map_err(|e| Error::Disconnected(format!("stdout: {e}")))
}

async fn subscribe(a: SubArgs) -> Result<(), Failure> {
    let (c, place) = client(&a.conn)?;
    let fail = |e| Failure(e, place.clone());
    let mut b = c.consumer(&a.subscription).window(a.window);
    if let Some(id) = &a.client_id {
        b = b.client_id(id.clone());
    }
    if a.no_ack {
        b = b.no_ack();
    }
    let mut consumer = b.start();
    report("sub", consumer.state());
    let mut seen = 0u64;
    let mut last_error = None;
    while a.max.is_none_or(|m| seen < m) {
        let Some(d) = consumer.next().await else { break };
        let d = match d {
            Ok(d) => d,
            // One event it could not read (said, and passed), or the last word of a consumer
            // the broker refused for good (the stream ends after it).
            Err(e) => {
                eprintln!("evmesh sub: {e}");
                last_error = Some(e);
                continue;
            }
        };
        last_error = None;
        let line = serde_json::to_string(&d.event).map_err(|e| fail(Error::Protocol(e.to_string())))?;
        if let Err(e) = print_line(&line) {
            consumer.close().await;
            return Err(fail(e));
        }
        // Acknowledged once printed: a crash before this means it is printed again.
        if !a.no_ack {
            d.ack();
        }
        seen += 1;
    }
    consumer.close().await;
    match last_error {
        Some(e) if a.max.is_none_or(|m| seen < m) => Err(fail(e)),
        _ => Ok(()),
    }
}

async fn stream(a: StreamArgs) -> Result<(), Failure> {
    let (c, place) = client(&a.conn)?;
    let fail = |e| Failure(e, place.clone());
    let mut s = c.streaming().subscribe_session(&a.session);
    report("stream", s.state());
    let mut seen = 0u64;
    while a.max.is_none_or(|m| seen < m) {
        let Some(e) = s.next().await else { break };
        let e = e.map_err(fail)?;
        print_line(&serde_json::to_string(&e).map_err(|e| fail(Error::Protocol(e.to_string())))?).map_err(fail)?;
        seen += 1;
    }
    Ok(())
}

async fn agent(a: AgentArgs) -> Result<(), Failure> {
    let (c, place) = client(&a.conn)?;
    let fail = |e| Failure(e, place.clone());
    let beat = Duration::from_millis(a.heartbeat_ms / 3);
    let mut agent = Agent::attach(&c, &a.agent_id, beat).await.map_err(fail)?;
    report("agent", agent.state());
    eprintln!("evmesh agent: {} registered; echoing each turn's prompt back", a.agent_id);
    let delay = Duration::from_millis(a.delay_ms);
    let mut turns = 0u64;
    while a.max_turns.is_none_or(|m| turns < m) {
        let Some(ev) = agent.next().await else { break };
        let event = match ev.map_err(fail)? {
            AgentEvent::Turn(mut turn) => {
                print_line(&serde_json::to_string(&turn.request).unwrap_or_default()).map_err(fail)?;
                let prompt = turn.prompt();
                // A chunk that cannot be sent (the connection dropped) ends this turn only: the
                // agent attaches again by itself, and the broker ends the turn for its client.
                let answered = async {
                    for (i, word) in prompt.split_whitespace().enumerate() {
                        let data = if i == 0 { word.to_owned() } else { format!(" {word}") };
                        turn.chunk(data)?;
                        if !delay.is_zero() {
                            tokio::time::sleep(delay).await;
                        }
                    }
                    turn.done(serde_json::Value::Null)
                }
                .await;
                if let Err(e) = answered {
                    eprintln!("evmesh agent: a turn of {}: {e}", a.agent_id);
                }
                turns += 1;
                continue;
            }
            AgentEvent::EndTurn { event, .. } | AgentEvent::Cancel { event, .. } | AgentEvent::Close { event, .. } => {
                event
            }
            _ => continue,
        };
        print_line(&serde_json::to_string(&event).unwrap_or_default()).map_err(fail)?;
    }
    agent.close().await;
    Ok(())
}
