//! Reading an answer off a connection: the bounds on a head and on one read, [`read`] (one
//! read under the deadline), and a parsed head's fields as owned strings.

use std::time::Duration;

use monoio::io::AsyncReadRent;

use super::error::{ClientError, Failed};
use crate::server::deadline::within;
use crate::server::stream::Stream;

/// Bytes of a response head at most.
pub(super) const MAX_HEAD: usize = 16 * 1024;
pub(super) const MAX_HEADERS: usize = 100;
/// Bytes one read takes at most.
pub(super) const READ_CHUNK: usize = 16 * 1024;

/// A parsed head's header fields, as owned strings (`buf` is what it was parsed from).
pub(super) fn owned_headers(head: &crate::http::client::ResponseHead, buf: &[u8]) -> Vec<(String, String)> {
    let s = |(a, b): (u32, u32)| String::from_utf8_lossy(&buf[a as usize..b as usize]).into_owned();
    head.headers.iter().map(|h| (s(h.name), s(h.value))).collect()
}

/// Reads more onto `buf`: the bytes read (0 at the end of the stream; an error counts as one).
pub(super) async fn read(conn: &mut Stream, buf: &mut Vec<u8>, timeout: Duration) -> Result<usize, Failed> {
    buf.reserve(READ_CHUNK);
    let (len, cap) = (buf.len(), buf.capacity());
    let owned = std::mem::take(buf);
    match within(timeout, conn.read(monoio::buf::IoBufMut::slice_mut(owned, len..cap))).await {
        Ok((res, slice)) => {
            *buf = slice.into_inner();
            Ok(res.unwrap_or(0))
        }
        Err(_) => Err(Failed::Error(ClientError::TimedOut(timeout))),
    }
}
