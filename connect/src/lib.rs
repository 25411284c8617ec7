//! evmesh-connect: the connector runtime, a process of its own beside the broker (SPEC,
//! "Connectors"). It talks to evmesh only through its public API, with the one SDK
//! (`evmesh-client`), and keeps its own offsets (`store`, RocksDB in `--data-dir`).
//!
//! * [`spi`]: what a connector implements ([`spi::Source`], [`spi::Sink`]).
//! * [`connectors`]: the connectors (`file`).
//! * [`task`]: one task per connector: batching, publishing or consuming, retries, the
//!   dead-letter topic, the position stored after evmesh's 202 and acks sent after the sink's
//!   flush; pause, resume, restart.
//! * [`admin`]: the admin API, metrics and `/readyz`.
//! * [`config`]: flags and connector files.

pub mod admin;
pub mod config;
pub mod connectors;
pub mod fault;
pub mod http;
pub mod lag;
pub mod spi;
pub mod store;
pub mod task;

use std::collections::BTreeMap;
use std::sync::Arc;

/// Why the runtime could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error(transparent)]
    Config(#[from] config::ConfigError),
    #[error(transparent)]
    Store(#[from] store::StoreError),
    #[error("evmesh client: {0}")]
    Client(#[from] evmesh_client::Error),
    #[error("admin listener {0}: {1}")]
    Listen(std::net::SocketAddr, std::io::Error),
    #[error("--evmesh-admin: {0}")]
    Http(reqwest::Error),
}

/// Starts every connector of `args.config_dir` and the admin API; runs until the process ends.
pub async fn run(args: config::Args) -> Result<(), StartError> {
    let configs = config::load_dir(&args.config_dir)?;
    std::fs::create_dir_all(&args.data_dir).map_err(|e| store::StoreError::from_io(&args.data_dir, e))?;
    let store = store::Store::open(&args.data_dir)?;
    // Every connector's own keys checked before anything starts (built, not opened).
    for c in &configs {
        if let Err(e) = connectors::build(c, &store) {
            let (name, message) = (c.name.clone(), e.to_string());
            return Err(config::ConfigError::Connector { name, message }.into());
        }
    }
    let mut client = evmesh_client::Client::builder(args.evmesh.clone()).user_agent("evmesh-connect");
    if let Some(t) = &args.token {
        client = client.token(t.clone());
    }
    let client = client.build()?;
    let listener =
        tokio::net::TcpListener::bind(args.admin_listen).await.map_err(|e| StartError::Listen(args.admin_listen, e))?;
    let bound = listener.local_addr().map_err(|e| StartError::Listen(args.admin_listen, e))?;
    let mut connectors = BTreeMap::new();
    for c in configs {
        let connector = task::Connector::new(c);
        connectors.insert(connector.config.name.clone(), connector.clone());
        tokio::spawn(connector.supervise(client.clone(), store.clone()));
    }
    eprintln!(
        "evmesh-connect: {} connectors from {}, evmesh at {}, admin API on http://{bound}",
        connectors.len(),
        args.config_dir.display(),
        args.evmesh
    );
    // One line on stdout, for supervisors and tests that bound port 0.
    println!("evmesh-connect ready admin={bound}");
    let evmesh_admin = match &args.evmesh_admin {
        Some(url) => Some(lag::EvmeshAdmin::new(url, args.token.clone()).map_err(StartError::Http)?),
        None => None,
    };
    Arc::new(admin::Admin { connectors, store, evmesh_admin }).serve(listener).await;
    Ok(())
}
