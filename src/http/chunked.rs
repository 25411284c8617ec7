//! Chunked transfer coding (RFC 9112 section 7.1), as two pure passes: `scan_chunked` finds
//! where the body ends without copying, `decode_chunked` then copies the data out once.

use super::{HttpError, Status, StatusCode};

/// Where a complete chunked body ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkedEnd {
    /// Bytes of `buf` the encoded body takes, trailers included.
    pub consumed: usize,
    /// Sum of the chunk sizes.
    pub data_len: usize,
}

fn line(buf: &[u8], at: usize) -> Option<(usize, usize)> {
    let i = buf[at..].iter().position(|&b| b == b'\n')?;
    let nl = at + i;
    let end = if nl > at && buf[nl - 1] == b'\r' { nl - 1 } else { nl };
    Some((end, nl + 1))
}

fn chunk_size(line: &[u8]) -> Result<usize, HttpError> {
    let hex_end = line.iter().position(|&b| !b.is_ascii_hexdigit()).unwrap_or(line.len());
    if hex_end == 0 || hex_end > 15 {
        return Err(HttpError::bad("invalid chunk size"));
    }
    // Whatever follows the size must be a chunk extension, which we ignore.
    let rest = &line[hex_end..];
    let rest_trimmed = rest.trim_ascii_start();
    if !rest_trimmed.is_empty() && rest_trimmed[0] != b';' {
        return Err(HttpError::bad("invalid chunk size"));
    }
    let digits = std::str::from_utf8(&line[..hex_end]).map_err(|_| HttpError::bad("invalid chunk size"))?;
    usize::from_str_radix(digits, 16).map_err(|_| HttpError::bad("invalid chunk size"))
}

/// Scans a chunked body at the start of `buf`. `max_body` bounds the decoded size (413).
pub fn scan_chunked(buf: &[u8], max_body: usize) -> Result<Status<ChunkedEnd>, HttpError> {
    let mut pos = 0;
    let mut data_len = 0usize;
    loop {
        let Some((end, next)) = line(buf, pos) else {
            if buf.len() - pos > 1024 {
                return Err(HttpError::bad("chunk size line too long"));
            }
            return Ok(Status::Partial);
        };
        let size = chunk_size(&buf[pos..end])?;
        data_len = data_len.checked_add(size).ok_or(HttpError::bad("invalid chunk size"))?;
        if data_len > max_body {
            return Err(HttpError::new(StatusCode::PAYLOAD_TOO_LARGE, "request body too large"));
        }
        pos = next;
        if size == 0 {
            // Trailer section: header lines up to an empty line; their content is ignored.
            loop {
                let Some((end, next)) = line(buf, pos) else {
                    if buf.len() - pos > 16 * 1024 {
                        return Err(HttpError::new(StatusCode::HEADERS_TOO_LARGE, "trailers too large"));
                    }
                    return Ok(Status::Partial);
                };
                if end == pos {
                    return Ok(Status::Complete(ChunkedEnd { consumed: next, data_len }));
                }
                pos = next;
            }
        }
        if buf.len() < pos + size {
            return Ok(Status::Partial);
        }
        pos += size;
        match &buf[pos..] {
            [b'\r', b'\n', ..] => pos += 2,
            [b'\n', ..] => pos += 1,
            [] | [b'\r'] => return Ok(Status::Partial),
            _ => return Err(HttpError::bad("chunk data not followed by CRLF")),
        }
    }
}

/// Copies the data of a chunked body that `scan_chunked` reported complete.
pub fn decode_chunked(buf: &[u8], end: &ChunkedEnd, out: &mut Vec<u8>) {
    out.reserve(end.data_len);
    let mut pos = 0;
    while let Some((stop, next)) = line(buf, pos) {
        let size = chunk_size(&buf[pos..stop]).unwrap_or(0);
        if size == 0 {
            return;
        }
        out.extend_from_slice(&buf[next..next + size]);
        pos = next + size;
        pos += if buf[pos] == b'\r' { 2 } else { 1 };
    }
}
