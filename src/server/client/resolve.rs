//! Name resolution: [`Url::resolve`] asks the system resolver (which blocks, and a shard must
//! not) on a thread of its own, `evmesh-resolve`, and waits for its answer within a deadline.

use std::net::SocketAddr;
use std::time::Duration;

use super::error::ClientError;
use super::url::Url;

impl Url {
    /// Where it is: its address, or what the resolver says its name is (on a thread of its
    /// own, within `timeout`).
    pub async fn resolve(&self, timeout: Duration) -> Result<SocketAddr, ClientError> {
        if let Some(ip) = self.ip {
            return Ok(SocketAddr::new(ip, self.port));
        }
        let (tx, rx) = futures::channel::oneshot::channel();
        let (name, port) = (self.name.clone(), self.port);
        let spawned = std::thread::Builder::new().name("evmesh-resolve".into()).spawn(move || {
            use std::net::ToSocketAddrs;
            let found = (name.as_str(), port).to_socket_addrs().map(|mut a| a.next());
            let _ = tx.send(found.map_err(|e| e.to_string()));
        });
        if let Err(e) = spawned {
            return Err(ClientError::Connect(format!("cannot resolve {}: {e}", self.name)));
        }
        match monoio::time::timeout(timeout, rx).await {
            Ok(Ok(Ok(Some(addr)))) => Ok(addr),
            Ok(Ok(Ok(None))) => Err(ClientError::Connect(format!("{} has no address", self.name))),
            Ok(Ok(Err(e))) => Err(ClientError::Connect(format!("cannot resolve {}: {e}", self.name))),
            Ok(Err(_)) => Err(ClientError::Connect(format!("cannot resolve {}", self.name))),
            Err(_) => Err(ClientError::TimedOut(timeout)),
        }
    }
}
