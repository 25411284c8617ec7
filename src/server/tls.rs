//! TLS on both listeners: rustls driven over monoio's owned-buffer sockets.
//!
//! No adapter crate: the one written for monoio (`monoio-rustls`) is unmaintained, gives no
//! access to the session (so no client certificate), and is neither cancel-safe nor safe to
//! split. Here the rustls [`Connection`] (a server's, or the broker's own client's: webhook
//! sinks over https, [`connect`]) lives in an `Rc<RefCell<_>>` that is borrowed
//! only between awaits, and each direction owns its socket half and its ciphertext buffer:
//!
//! - [`TlsReader`] reads ciphertext into its buffer, feeds rustls, and copies plaintext out.
//! - [`TlsWriter`] hands plaintext to rustls and writes out every record it makes before it
//!   returns, so nothing written is left behind in a buffer nobody flushes.
//!
//! A read or write cancelled mid-way (a timeout) leaves its direction without its buffer: the
//! bytes in flight are lost, so every later call on that direction fails instead of going on
//! with a corrupt record stream. Callers close the connection after a timeout anyway.
//!
//! Certificates: the `tls_cert` chain and `tls_key` (PEM) are read at start and again on SIGHUP
//! ([`TlsAcceptor::reload`]); a file that does not load leaves the old ones in force. With
//! `tls_client_ca`, every client must present a certificate that chains to it (mutual TLS),
//! and that certificate's subject names the principal ([`PeerCert`]). ALPN offers `http/1.1`.

use std::cell::RefCell;
use std::io::{self, BufRead, Write};
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use monoio::buf::{IoBuf, IoBufMut, IoVecBuf, IoVecBufMut};
use monoio::io::{AsyncReadRent, AsyncWriteRent, AsyncWriteRentExt, OwnedReadHalf, OwnedWriteHalf, Splitable};
use monoio::net::TcpStream;
use monoio::BufResult;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::ServerName;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::{ClientConfig, ClientConnection, Connection, RootCertStore, ServerConfig, ServerConnection};

/// Ciphertext read at once at most: one full TLS record (16 KiB of plaintext plus its overhead).
const RECORD: usize = 16 * 1024 + 2048;

/// A record's framing beyond its plaintext (header, content type, AEAD tag), rounded up.
const RECORD_OVERHEAD: usize = 64;

/// Ciphertext read at once at least.
const MIN_READ: usize = 512;

/// Plaintext encrypted per write call: one record, so each write's ciphertext is about 16 KiB
/// and a caller's write timeout measures progress, not a large batch.
const WRITE_PLAIN: usize = 16 * 1024;

/// Resumable sessions remembered (rustls's in-memory cache, per configuration).
const SESSIONS: usize = 4096;

/// Socket reads one `read` call makes without producing plaintext before it lets the shard's
/// other tasks run (records that carry nothing, key updates, padding).
const READS_PER_TURN: u32 = 8;

/// Where the certificate, its key and the client CA come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
    pub client_ca: Option<PathBuf>,
}

/// Makes TLS sessions of accepted sockets with the configuration in force.
pub struct TlsAcceptor {
    files: TlsFiles,
    provider: Arc<CryptoProvider>,
    config: RwLock<Arc<ServerConfig>>,
    pub handshakes_failed: AtomicU64,
    pub reloads: AtomicU64,
    pub reloads_failed: AtomicU64,
}

impl std::fmt::Debug for TlsAcceptor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsAcceptor").field("files", &self.files).finish_non_exhaustive()
    }
}

/// The verified client certificate of a mutual-TLS connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerCert {
    /// The subject's one common name (see `principal_of`); `None`: the certificate names no
    /// principal.
    pub principal: Option<String>,
    /// The certificate's `notAfter`, µs since the Unix epoch.
    pub expires_us: i64,
}

impl TlsAcceptor {
    /// Loads the files; the error names the file that failed and why.
    pub fn load(files: TlsFiles) -> Result<TlsAcceptor, String> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = build(&files, &provider)?;
        Ok(TlsAcceptor {
            files,
            provider,
            config: RwLock::new(config),
            handshakes_failed: AtomicU64::new(0),
            reloads: AtomicU64::new(0),
            reloads_failed: AtomicU64::new(0),
        })
    }

    /// Reads the files again (SIGHUP). New handshakes use them; sessions already open keep
    /// theirs. On an error the configuration in force stays. Resumption starts over: a session
    /// resumed after a reload would keep a client certificate the new `tls_client_ca` may no
    /// longer accept (rustls does not verify a resumed session's certificate again).
    pub fn reload(&self) -> Result<(), String> {
        match build(&self.files, &self.provider) {
            Ok(c) => {
                *self.config.write().unwrap_or_else(|e| e.into_inner()) = c;
                self.reloads.fetch_add(1, Ordering::Relaxed);
                Ok(())
            }
            Err(e) => {
                self.reloads_failed.fetch_add(1, Ordering::Relaxed);
                Err(e)
            }
        }
    }

    /// Completes the handshake on `tcp` within `timeout`.
    pub async fn accept(&self, tcp: TcpStream, timeout: Duration) -> io::Result<(TlsStream, Option<PeerCert>)> {
        let config = self.config.read().unwrap_or_else(|e| e.into_inner()).clone();
        let conn = ServerConnection::new(config).map_err(io::Error::other)?;
        let r = match monoio::time::timeout(timeout, handshake(tcp, conn.into())).await {
            Ok(r) => r,
            Err(_) => Err(io::ErrorKind::TimedOut.into()),
        };
        if r.is_err() {
            self.handshakes_failed.fetch_add(1, Ordering::Relaxed);
        }
        let (tcp, conn, rest) = r?;
        let peer = peer_cert(&conn);
        Ok((TlsStream::new(tcp, conn, rest), peer))
    }
}

/// The client configuration for https sinks: the Mozilla roots (`webpki-roots`) and the
/// certificates of `extra_ca` (PEM), if given.
pub fn client_config(extra_ca: Option<&Path>) -> Result<Arc<ClientConfig>, String> {
    let mut roots = RootCertStore { roots: webpki_roots::TLS_SERVER_ROOTS.to_vec() };
    if let Some(ca) = extra_ca {
        let named = |e: &dyn std::fmt::Display| format!("{}: {e}", ca.display());
        let before = roots.len();
        for c in CertificateDer::pem_file_iter(ca).map_err(|e| named(&e))? {
            roots.add(c.map_err(|e| named(&e))?).map_err(|e| named(&e))?;
        }
        if roots.len() == before {
            return Err(named(&"no CERTIFICATE in the file"));
        }
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// Completes a client handshake with `name` on `tcp` (the server's certificate checked against
/// `config`'s roots and for `name`), within `timeout`.
pub async fn connect(
    tcp: TcpStream,
    name: ServerName<'static>,
    config: Arc<ClientConfig>,
    timeout: Duration,
) -> io::Result<TlsStream> {
    let conn = ClientConnection::new(config, name).map_err(io::Error::other)?;
    match monoio::time::timeout(timeout, handshake(tcp, conn.into())).await {
        Ok(r) => r.map(|(tcp, conn, rest)| TlsStream::new(tcp, conn, rest)),
        Err(_) => Err(io::ErrorKind::TimedOut.into()),
    }
}

fn build(files: &TlsFiles, provider: &Arc<CryptoProvider>) -> Result<Arc<ServerConfig>, String> {
    let named = |p: &Path, e: &dyn std::fmt::Display| format!("{}: {e}", p.display());
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(&files.cert)
        .and_then(|certs| certs.collect())
        .map_err(|e| named(&files.cert, &e))?;
    if chain.is_empty() {
        return Err(named(&files.cert, &"no CERTIFICATE in the file"));
    }
    let key = PrivateKeyDer::from_pem_file(&files.key).map_err(|e| named(&files.key, &e))?;
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?;
    let builder = match &files.client_ca {
        None => builder.with_no_client_auth(),
        Some(ca) => {
            let mut roots = RootCertStore::empty();
            for c in CertificateDer::pem_file_iter(ca).map_err(|e| named(ca, &e))? {
                roots.add(c.map_err(|e| named(ca, &e))?).map_err(|e| named(ca, &e))?;
            }
            if roots.is_empty() {
                return Err(named(ca, &"no CERTIFICATE in the file"));
            }
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider.clone())
                .build()
                .map_err(|e| named(ca, &e))?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    // Also checks that the key is the certificate's.
    let mut config = builder
        .with_single_cert(chain, key)
        .map_err(|e| format!("{} with {}: {e}", files.cert.display(), files.key.display()))?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    config.session_storage = rustls::server::ServerSessionMemoryCache::new(SESSIONS);
    Ok(Arc::new(config))
}

/// Runs the handshake on the whole socket; returns the ciphertext read past it (the client's
/// first request may come in the same segment as its last handshake message).
async fn handshake(mut tcp: TcpStream, mut conn: Connection) -> io::Result<(TcpStream, Connection, Vec<u8>)> {
    let mut inb: Vec<u8> = Vec::with_capacity(RECORD);
    let mut pos = 0;
    let mut out = Vec::new();
    loop {
        while conn.wants_write() {
            out.clear();
            conn.write_tls(&mut out)?;
            let (r, b) = tcp.write_all(out).await;
            out = b;
            r?;
        }
        if !conn.is_handshaking() {
            break;
        }
        if pos == inb.len() {
            inb.clear();
            pos = 0;
            let (r, b) = tcp.read(inb).await;
            inb = b;
            if r? == 0 {
                return Err(io::ErrorKind::UnexpectedEof.into());
            }
        }
        pos += conn.read_tls(&mut &inb[pos..])?;
        if let Err(e) = conn.process_new_packets() {
            // Tell the client why (the alert), then give up.
            out.clear();
            let _ = conn.write_tls(&mut out);
            let _ = tcp.write_all(out).await;
            return Err(io::Error::new(io::ErrorKind::InvalidData, e));
        }
    }
    inb.drain(..pos);
    Ok((tcp, conn, inb))
}

fn peer_cert(conn: &Connection) -> Option<PeerCert> {
    use x509_cert::der::Decode;
    let leaf = conn.peer_certificates()?.first()?;
    let cert = x509_cert::Certificate::from_der(leaf.as_ref()).ok()?;
    let tbs = cert.tbs_certificate();
    let expires_us = tbs.validity().not_after.to_unix_duration().as_micros().min(i64::MAX as u128) as i64;
    Some(PeerCert { principal: principal_of(tbs.subject()), expires_us })
}

/// The principal a subject names: its one common name, if it has exactly one that is printable
/// and at most 256 characters. Several CNs (which one is meant depends on the reader), none, or
/// an odd one name nobody: such a client proves who it is with a bearer token.
fn principal_of(subject: &x509_cert::name::Name) -> Option<String> {
    let mut cns = subject.iter().filter(|a| a.oid == x509_cert::der::oid::db::rfc4519::COMMON_NAME);
    let (Some(cn), None) = (cns.next(), cns.next()) else { return None };
    let cn = x509_cert::ext::pkix::name::DirectoryString::try_from(&cn.value).ok()?;
    let cn = cn.value();
    let fits = (1..=256).contains(&cn.chars().count()) && !cn.chars().any(char::is_control);
    fits.then(|| cn.into_owned())
}

fn broken() -> io::Error {
    io::Error::new(io::ErrorKind::BrokenPipe, "TLS stream broken by a cancelled operation")
}

/// A TLS session on an accepted socket.
pub struct TlsStream {
    pub(super) reader: TlsReader,
    pub(super) writer: TlsWriter,
    /// The socket's descriptor (owned by the reader and writer), for `Stream::peer_gone`.
    pub(super) fd: std::os::fd::RawFd,
}

impl TlsStream {
    fn new(tcp: TcpStream, conn: Connection, rest: Vec<u8>) -> TlsStream {
        let tls = Rc::new(RefCell::new(conn));
        let fd = std::os::fd::AsRawFd::as_raw_fd(&tcp);
        let (rd, wr) = tcp.into_split();
        let reader = TlsReader { io: rd, tls: tls.clone(), buf: Some(rest), pos: 0 };
        let writer = TlsWriter { io: wr, tls, buf: Some(Vec::new()) };
        TlsStream { reader, writer, fd }
    }

    /// The two directions, to be driven by separate tasks.
    pub fn into_split(self) -> (TlsReader, TlsWriter) {
        (self.reader, self.writer)
    }
}

/// The reading direction of a [`TlsStream`].
pub struct TlsReader {
    io: OwnedReadHalf<TcpStream>,
    tls: Rc<RefCell<Connection>>,
    /// Ciphertext read and not yet taken by rustls, from `pos`; `None` once a cancelled read
    /// took it.
    buf: Option<Vec<u8>>,
    pos: usize,
}

impl TlsReader {
    async fn read_into<T: IoBufMut>(&mut self, dst: &mut T) -> io::Result<usize> {
        let mut reads = 0u32;
        loop {
            {
                let mut tls = self.tls.borrow_mut();
                let mut plain = tls.reader();
                // Every decrypted record that fits, not one record per call.
                let mut n = 0;
                loop {
                    match plain.fill_buf() {
                        Ok([]) => return Ok(n), // clean close_notify (after what came before it)
                        Ok(b) => {
                            let k = crate::sys::fill_io_buf(dst, n, b);
                            let whole = k == b.len();
                            plain.consume(k);
                            n += k;
                            if !whole || n == dst.bytes_total() {
                                return Ok(n);
                            }
                        }
                        // What was read goes first; an end or an error shows on the next call.
                        Err(_) if n > 0 => return Ok(n),
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                        Err(e) => return Err(e),
                    }
                }
            }
            // Records that decrypt to nothing cost the core all the same: a client streaming
            // them (always readable, so on epoll never Pending) must not hold it.
            reads += 1;
            if reads % READS_PER_TURN == 0 {
                crate::task::yield_now().await;
            }
            let mut buf = self.buf.take().ok_or_else(broken)?;
            if self.pos == buf.len() {
                buf.clear();
                self.pos = 0;
                // As much ciphertext as the caller wants plaintext (and a record's framing), at
                // most a record: an idle session's pending read holds a small buffer, as it would
                // on plain TCP (rustls assembles records from as many reads as they take). The
                // buffer is kept from read to read, and only swapped for a smaller one when it
                // is over twice what the caller asks now (no allocation per read).
                let want = (dst.bytes_total() + RECORD_OVERHEAD).clamp(MIN_READ, RECORD);
                if buf.capacity() > 2 * want {
                    buf = Vec::new();
                }
                buf.reserve(want);
                let (r, b) = self.io.read(buf).await;
                buf = b;
                let n = r?;
                if n == 0 {
                    // Tell rustls the socket ended: its reader then says whether that was clean.
                    let mut tls = self.tls.borrow_mut();
                    tls.read_tls(&mut &[][..])?;
                    tls.process_new_packets().map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
                    self.buf = Some(buf);
                    continue;
                }
            }
            let mut tls = self.tls.borrow_mut();
            let taken = tls.read_tls(&mut &buf[self.pos..]);
            self.pos += *taken.as_ref().unwrap_or(&0);
            self.buf = Some(buf);
            taken?;
            tls.process_new_packets().map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
        }
    }
}

impl AsyncReadRent for TlsReader {
    async fn read<T: IoBufMut>(&mut self, mut buf: T) -> BufResult<usize, T> {
        let r = self.read_into(&mut buf).await;
        (r, buf)
    }

    /// Nothing in evmesh reads vectored; a TLS session does not pretend to.
    async fn readv<T: IoVecBufMut>(&mut self, buf: T) -> BufResult<usize, T> {
        (Err(io::ErrorKind::Unsupported.into()), buf)
    }
}

/// The writing direction of a [`TlsStream`].
pub struct TlsWriter {
    io: OwnedWriteHalf<TcpStream>,
    tls: Rc<RefCell<Connection>>,
    /// Ciphertext on its way out; `None` once a cancelled write took it.
    buf: Option<Vec<u8>>,
}

impl TlsWriter {
    /// Writes out every record rustls has made (ours, and alerts or key updates the reading
    /// side queued). Any error leaves the direction broken (what was not written is lost).
    async fn flush_records(&mut self) -> io::Result<()> {
        let mut buf = self.buf.take().ok_or_else(broken)?;
        buf.clear();
        {
            let mut tls = self.tls.borrow_mut();
            while tls.wants_write() {
                tls.write_tls(&mut buf)?;
            }
        }
        if !buf.is_empty() {
            let (r, b) = self.io.write_all(buf).await;
            r?;
            buf = b;
        }
        // A session between writes keeps no more than a small ciphertext buffer.
        self.buf = Some(if buf.capacity() > 4096 { Vec::new() } else { buf });
        Ok(())
    }

    /// Encrypts at most [`WRITE_PLAIN`] bytes of `plain` and writes the records out; returns
    /// how many plaintext bytes that was.
    async fn send(&mut self, plain: &[io::IoSlice<'_>]) -> io::Result<usize> {
        self.flush_records().await?;
        let mut room = WRITE_PLAIN;
        let mut n = 0;
        {
            let mut tls = self.tls.borrow_mut();
            for s in plain {
                let part = &s[..s.len().min(room)];
                let k = tls.writer().write(part)?;
                n += k;
                room -= k;
                if k < s.len() || room == 0 {
                    break;
                }
            }
        }
        self.flush_records().await?;
        Ok(n)
    }
}

impl AsyncWriteRent for TlsWriter {
    async fn write<T: IoBuf>(&mut self, buf: T) -> BufResult<usize, T> {
        let r = self.send(&[io::IoSlice::new(crate::sys::io_bytes(&buf))]).await;
        (r, buf)
    }

    async fn writev<T: IoVecBuf>(&mut self, buf: T) -> BufResult<usize, T> {
        let r = {
            let slices = crate::sys::io_slices(&buf);
            self.send(&slices).await
        };
        (r, buf)
    }

    async fn flush(&mut self) -> io::Result<()> {
        self.flush_records().await
    }

    /// Says `close_notify` (if the client takes it within a second: a client that stopped
    /// reading does not hold the close up), then shuts the socket's writing side.
    async fn shutdown(&mut self) -> io::Result<()> {
        self.tls.borrow_mut().send_close_notify();
        let _ = monoio::time::timeout(Duration::from_secs(1), self.flush_records()).await;
        self.io.shutdown().await
    }
}

#[cfg(test)]
mod tests {
    use super::principal_of;
    use std::str::FromStr;

    fn principal(subject: &str) -> Option<String> {
        principal_of(&x509_cert::name::Name::from_str(subject).unwrap())
    }

    #[test]
    fn only_one_printable_common_name_names_a_principal() {
        assert_eq!(principal("CN=svc-ingest,O=Acme").as_deref(), Some("svc-ingest"));
        assert_eq!(principal("O=Acme,OU=ops,CN=ops-admin").as_deref(), Some("ops-admin"));
        // Which of two CNs is meant depends on the reader (first or last): neither is taken.
        assert_eq!(principal("CN=admin,O=Acme,CN=alice"), None);
        assert_eq!(principal("O=Acme,OU=ops"), None);
        assert_eq!(principal(&format!("CN={}", "x".repeat(257))), None);
        assert_eq!(principal(&format!("CN={}", "x".repeat(256))).map(|p| p.len()), Some(256));
    }
}
