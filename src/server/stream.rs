//! An accepted connection, plain or TLS, behind one type: everything above the socket (HTTP,
//! WebSocket and SSE sessions) is written once for both.

use std::io;

use monoio::buf::{IoBuf, IoBufMut, IoVecBuf, IoVecBufMut};
use monoio::io::{AsyncReadRent, AsyncWriteRent, OwnedReadHalf, OwnedWriteHalf, Splitable};
use monoio::net::TcpStream;
use monoio::BufResult;

use super::tls::{TlsReader, TlsStream, TlsWriter};

/// An accepted connection.
pub enum Stream {
    Plain(TcpStream),
    Tls(Box<TlsStream>),
}

/// The reading direction of a split [`Stream`].
pub enum ReadHalf {
    Plain(OwnedReadHalf<TcpStream>),
    Tls(TlsReader),
}

/// The writing direction of a split [`Stream`].
pub enum WriteHalf {
    Plain(OwnedWriteHalf<TcpStream>),
    Tls(TlsWriter),
}

impl Stream {
    /// The two directions, to be driven by separate tasks (a session's reader and writer).
    pub fn into_split(self) -> (ReadHalf, WriteHalf) {
        match self {
            Stream::Plain(s) => {
                let (r, w) = s.into_split();
                (ReadHalf::Plain(r), WriteHalf::Plain(w))
            }
            Stream::Tls(s) => {
                let (r, w) = s.into_split();
                (ReadHalf::Tls(r), WriteHalf::Tls(w))
            }
        }
    }
}

impl Stream {
    /// Resolves once the peer has closed or reset the connection (a requester that gave up on
    /// its reply). Waits on the socket's readiness, no timer, while nothing arrives; once bytes
    /// wait unread (a pipelined request, a TLS alert), readiness says nothing more, and it
    /// checks for the peer's FIN every 250 ms instead.
    pub async fn peer_gone(&self) {
        let (fd, dup);
        let tcp = match self {
            Stream::Plain(s) => {
                fd = std::os::fd::AsRawFd::as_raw_fd(s);
                s
            }
            Stream::Tls(t) => {
                fd = t.fd;
                match crate::sys::dup_socket(fd).and_then(TcpStream::from_std) {
                    Ok(s) => {
                        dup = s;
                        &dup
                    }
                    Err(_) => return std::future::pending().await,
                }
            }
        };
        loop {
            if tcp.readable(false).await.is_err() {
                return;
            }
            match crate::sys::peer_state(fd) {
                (true, _) => return,
                (false, true) => break,
                (false, false) => {}
            }
        }
        loop {
            monoio::time::sleep(std::time::Duration::from_millis(250)).await;
            if crate::sys::peer_state(fd).0 {
                return;
            }
        }
    }
}

/// Forwards the reading methods to whichever variant `self` is; `$s => $tls` names the TLS
/// reader inside the `Tls` variant. The TLS futures are boxed (here and in `write_via`): they
/// are several times a plain socket's, and every caller's future (each open connection's
/// task) would otherwise keep their room, plain or not.
macro_rules! read_via {
    ($ty:ident, $s:ident => $tls:expr) => {
        impl AsyncReadRent for $ty {
            async fn read<T: IoBufMut>(&mut self, buf: T) -> BufResult<usize, T> {
                match self {
                    $ty::Plain(s) => s.read(buf).await,
                    $ty::Tls($s) => Box::pin($tls.read(buf)).await,
                }
            }

            async fn readv<T: IoVecBufMut>(&mut self, buf: T) -> BufResult<usize, T> {
                match self {
                    $ty::Plain(s) => s.readv(buf).await,
                    $ty::Tls($s) => Box::pin($tls.readv(buf)).await,
                }
            }
        }
    };
}

/// Forwards the writing methods to whichever variant `self` is; `$s => $tls` names the TLS
/// writer inside the `Tls` variant.
macro_rules! write_via {
    ($ty:ident, $s:ident => $tls:expr) => {
        impl AsyncWriteRent for $ty {
            async fn write<T: IoBuf>(&mut self, buf: T) -> BufResult<usize, T> {
                match self {
                    $ty::Plain(s) => s.write(buf).await,
                    $ty::Tls($s) => Box::pin($tls.write(buf)).await,
                }
            }

            async fn writev<T: IoVecBuf>(&mut self, buf: T) -> BufResult<usize, T> {
                match self {
                    $ty::Plain(s) => s.writev(buf).await,
                    $ty::Tls($s) => Box::pin($tls.writev(buf)).await,
                }
            }

            async fn flush(&mut self) -> io::Result<()> {
                match self {
                    $ty::Plain(s) => s.flush().await,
                    $ty::Tls($s) => Box::pin($tls.flush()).await,
                }
            }

            async fn shutdown(&mut self) -> io::Result<()> {
                match self {
                    $ty::Plain(s) => s.shutdown().await,
                    $ty::Tls($s) => Box::pin($tls.shutdown()).await,
                }
            }
        }
    };
}

read_via!(Stream, t => t.reader);
write_via!(Stream, t => t.writer);
read_via!(ReadHalf, t => t);
write_via!(WriteHalf, t => t);
