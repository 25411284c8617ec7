//! One SO_REUSEPORT listener per shard on the same address, so the kernel spreads connections
//! over shards with no acceptor thread in between.

use std::io;
use std::net::{SocketAddr, TcpListener};

use socket2::{Domain, Protocol, Socket, Type};

fn socket(addr: SocketAddr, reuse_port: bool) -> io::Result<Socket> {
    let s = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    s.set_reuse_address(true)?;
    s.set_reuse_port(reuse_port)?;
    s.set_nonblocking(true)?;
    s.bind(&addr.into())?;
    Ok(s)
}

/// Binds `n` listeners sharing `addr` (port 0 picks one free port for all of them).
///
/// SO_REUSEPORT would let us silently share a port with another process of the same user that
/// also set it; a plain bind first makes a port already in use fail loudly instead.
pub fn bind_shared(addr: SocketAddr, n: usize) -> io::Result<Vec<TcpListener>> {
    if addr.port() != 0 {
        socket(addr, false)
            .map_err(|e| io::Error::new(e.kind(), format!("cannot bind {addr}: {e} (is another process using it?)")))?;
    }
    let first = socket(addr, true)?;
    first.listen(4096)?;
    let actual = first.local_addr()?.as_socket().expect("an inet socket");
    let mut out = vec![TcpListener::from(first)];
    for _ in 1..n {
        let s = socket(actual, true)?;
        s.listen(4096)?;
        out.push(TcpListener::from(s));
    }
    Ok(out)
}
