//! The only `unsafe` in frame-codec: reading an archived body without re-validating it.

use crate::{ArchivedFrameBody, FrameError};

/// Validates archived body bytes (bytecheck). Used on every buffer from outside the process.
pub(crate) fn validate(body: &[u8]) -> Result<(), FrameError> {
    rkyv::access::<ArchivedFrameBody, rkyv::rancor::Error>(body)
        .map(|_| ())
        .map_err(|e| FrameError::Body(e.to_string()))
}

/// Reads an archived body that is known to be valid.
pub(crate) fn trusted(body: &[u8]) -> &ArchivedFrameBody {
    // SAFETY: `Frame` is only constructed by `Frame::encode`, which archived these bytes itself,
    // or by `Frame::decode`, which ran `validate` on them; the buffer is never mutated inside the
    // body afterwards (the in-place setters touch header bytes only), and it is 16-aligned with a
    // 40-byte header, so the body is 8-aligned as the archive requires.
    unsafe { rkyv::access_unchecked::<ArchivedFrameBody>(body) }
}
