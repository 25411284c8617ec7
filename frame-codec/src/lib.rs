//! The EventMeshFrame: the one byte format evmesh moves between cores and keeps in its log.
//!
//! A frame is a fixed 40-byte little-endian [`FrameHeader`] followed by an rkyv-archived
//! [`FrameBody`] (topic, ordered attributes, data). The header is plain bytes so a shard can read
//! routing fields and stamp the offset in place without touching the body; the body is rkyv so a
//! stored or received frame is read where it lies, after one bytecheck validation.
//!
//! This crate is a pure codec: bytes in, values out. It never does I/O, never blocks, and knows
//! nothing of shards, sockets or storage engines. Every frame it hands out is either built by
//! [`Frame::encode`] or validated by [`Frame::decode`], which is what lets [`Frame::body`] skip
//! validation (see `access.rs`, the one module with `unsafe`).

#![deny(missing_docs)]

mod access;
mod borrowed;
mod header;

use rkyv::{Archive, Deserialize, Serialize};

pub use header::{DataKind, FrameHeader, FrameKind, HEADER_LEN, MAGIC, VERSION};

/// The aligned buffer every frame lives in. rkyv needs the body 8-byte aligned; the header is 40
/// bytes and the buffer is 16-aligned, so the body is aligned by construction.
pub type FrameBuf = rkyv::util::AlignedVec<16>;

/// A typed attribute value, kept in the JSON type it arrived with so it is re-emitted faithfully.
/// Generic over the string type only so that a borrowed value ([`Text`]) archives to the very
/// bytes an owned one does; [`AttrValue`] is the owned one.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
#[rkyv(derive(Debug), archive_bounds(S::Archived: std::fmt::Debug))]
pub enum AttrValueOf<S> {
    /// A JSON string (also every binary-mode `ce-*` header).
    Str(S),
    /// A JSON boolean extension.
    Bool(bool),
    /// A JSON integer extension (CloudEvents Integer).
    Int(i64),
}

/// One CloudEvents context attribute or extension, in arrival order.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
#[rkyv(
    derive(Debug),
    archive_bounds(S::Archived: std::fmt::Debug, <AttrValueOf<S> as Archive>::Archived: std::fmt::Debug)
)]
pub struct AttributeOf<S> {
    /// The attribute name (`id`, `type`, an extension such as `partitionkey`); a binary-mode
    /// header's `ce-` prefix is not part of it.
    pub name: S,
    /// The attribute value, in the JSON type it arrived with.
    pub value: AttrValueOf<S>,
}

/// The variable part of a frame: the topic, the attributes in arrival order, the data as raw
/// bytes (how to render them is [`DataKind`] in the header flags). [`FrameBody`] is the owned
/// one; [`FrameBodyRef`] borrows from the request it was parsed from.
#[derive(Archive, Serialize, Deserialize, Debug, Clone, PartialEq, Eq, Default)]
#[rkyv(derive(Debug), archive_bounds(S::Archived: std::fmt::Debug, A::Archived: std::fmt::Debug, D::Archived: std::fmt::Debug))]
pub struct FrameBodyOf<S, A, D> {
    /// The topic the event was published to.
    pub topic: S,
    /// The CloudEvents context attributes and extensions, in arrival order.
    pub attributes: A,
    /// The event data as raw bytes; empty when the header's [`DataKind`] is `None`.
    pub data: D,
}

impl AttributeOf<String> {
    /// This attribute, borrowed (as [`Frame::encode_ref`] and [`Frame::with_attributes`] take it).
    pub fn borrowed(&self) -> AttributeRef<'_> {
        let value = match &self.value {
            AttrValueOf::Str(s) => AttrValueOf::Str(Text::from(s.as_str())),
            AttrValueOf::Bool(b) => AttrValueOf::Bool(*b),
            AttrValueOf::Int(n) => AttrValueOf::Int(*n),
        };
        AttributeOf { name: Text::from(self.name.as_str()), value }
    }
}

/// An owned attribute value.
pub type AttrValue = AttrValueOf<String>;
/// An owned attribute.
pub type Attribute = AttributeOf<String>;
/// An owned frame body, as [`Frame::encode`] takes and [`Frame::to_body`] returns.
pub type FrameBody = FrameBodyOf<String, Vec<Attribute>, Vec<u8>>;
/// An attribute value as archived in a frame, read in place.
pub type ArchivedAttrValue = ArchivedAttrValueOf<String>;
/// An attribute as archived in a frame, read in place.
pub type ArchivedAttribute = ArchivedAttributeOf<String>;
/// A frame body as archived after the header, read in place ([`Frame::body`]).
pub type ArchivedFrameBody = ArchivedFrameBodyOf<String, Vec<Attribute>, Vec<u8>>;

/// A body borrowed from the bytes it was parsed from (strings with JSON escapes are the only
/// owned parts): encoding it allocates nothing but the frame.
pub type FrameBodyRef<'a> = FrameBodyOf<Text<'a>, Slice<'a, AttributeRef<'a>>, Bytes<'a>>;
/// An attribute borrowed from the bytes it was parsed from.
pub type AttributeRef<'a> = AttributeOf<Text<'a>>;
/// An attribute value borrowed from the bytes it was parsed from.
pub type AttrValueRef<'a> = AttrValueOf<Text<'a>>;

pub use borrowed::{Bytes, Slice, Text};

impl ArchivedFrameBody {
    /// The value of the attribute `name`, if present.
    pub fn attr(&self, name: &str) -> Option<&ArchivedAttrValue> {
        self.attributes.iter().find(|a| a.name.as_str() == name).map(|a| &a.value)
    }

    /// The string value of the attribute `name`, if present and a string.
    pub fn attr_str(&self, name: &str) -> Option<&str> {
        match self.attr(name)? {
            ArchivedAttrValue::Str(s) => Some(s.as_str()),
            _ => None,
        }
    }
}

/// Why bytes are not a frame.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum FrameError {
    /// Fewer than [`HEADER_LEN`] bytes; holds the length there was.
    #[error("frame shorter than its {HEADER_LEN}-byte header ({0} bytes)")]
    Short(usize),
    /// The first four bytes are not [`MAGIC`].
    #[error("bad frame magic")]
    Magic,
    /// A header version other than [`VERSION`]; holds the version byte.
    #[error("unsupported frame version {0}")]
    Version(u8),
    /// A kind byte that is no [`FrameKind`]; holds the byte.
    #[error("unknown frame kind {0}")]
    Kind(u8),
    /// The header's body length is not the number of bytes after the header.
    #[error("body length {declared} does not match the {actual} bytes present")]
    BodyLength {
        /// The body length the header states, in bytes.
        declared: u32,
        /// The bytes actually present after the header.
        actual: usize,
    },
    /// The body is not a valid rkyv archive of a [`FrameBody`] (bytecheck's message).
    #[error("frame body failed validation: {0}")]
    Body(String),
    /// The body could not be archived, or its archive is 4 GiB or more.
    #[error("frame body could not be encoded: {0}")]
    Encode(String),
}

/// An owned, aligned, valid frame.
#[derive(Clone)]
pub struct Frame {
    buf: FrameBuf,
}

impl std::fmt::Debug for Frame {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Frame").field("header", &self.header()).field("body", self.body()).finish()
    }
}

impl Frame {
    /// Builds a frame from a header and a body. The header's body length is filled in here.
    pub fn encode(header: &FrameHeader, body: &FrameBody) -> Result<Frame, FrameError> {
        Self::archive(header, body, 128 + body.data.len())
    }

    /// The header, then `body` archived after it (`room`: the body's expected size).
    fn archive<B>(header: &FrameHeader, body: &B, room: usize) -> Result<Frame, FrameError>
    where
        B: for<'a> rkyv::Serialize<
            rkyv::api::high::HighSerializer<FrameBuf, rkyv::ser::allocator::ArenaHandle<'a>, rkyv::rancor::Error>,
        >,
    {
        let mut buf = FrameBuf::with_capacity(HEADER_LEN + room);
        buf.extend_from_slice(&[0u8; HEADER_LEN]);
        let mut buf = rkyv::api::high::to_bytes_in::<_, rkyv::rancor::Error>(body, buf)
            .map_err(|e| FrameError::Encode(e.to_string()))?;
        let body_len =
            u32::try_from(buf.len() - HEADER_LEN).map_err(|_| FrameError::Encode("body over 4 GiB".into()))?;
        header.write(&mut buf[..HEADER_LEN], body_len);
        Ok(Frame { buf })
    }

    /// Builds a frame from a header and a borrowed body: the same bytes [`Frame::encode`] makes
    /// of the owned body with the same contents (a test holds that), with no allocation but the
    /// frame's buffer.
    pub fn encode_ref(header: &FrameHeader, body: &FrameBodyRef<'_>) -> Result<Frame, FrameError> {
        let frame = Self::archive(header, body, 64 + 48 * body.attributes.0.len() + body.data.0.len())?;
        // The borrowed types archive as the owned ones by construction; checked in debug builds.
        debug_assert!(access::validate(&frame.buf[HEADER_LEN..]).is_ok());
        Ok(frame)
    }

    /// Copies bytes from outside this process (a socket, a file, a log) into an aligned buffer
    /// and validates header and body. This is the only way foreign bytes become a `Frame`.
    pub fn decode(bytes: &[u8]) -> Result<Frame, FrameError> {
        FrameHeader::read(bytes)?;
        let mut buf = FrameBuf::with_capacity(bytes.len());
        buf.extend_from_slice(bytes);
        access::validate(&buf[HEADER_LEN..])?;
        Ok(Frame { buf })
    }

    /// The fixed header. Cheap: reads 40 bytes.
    pub fn header(&self) -> FrameHeader {
        // The buffer was written by `encode` or checked by `decode`.
        FrameHeader::read(&self.buf).expect("a Frame always holds a valid header")
    }

    /// The archived body, read in place.
    pub fn body(&self) -> &ArchivedFrameBody {
        access::trusted(&self.buf[HEADER_LEN..])
    }

    /// Stamps the offset the owning shard assigned, in place.
    pub fn set_offset(&mut self, offset: u64) {
        header::write_offset(&mut self.buf, offset);
    }

    /// Stamps the partition the router chose, in place.
    pub fn set_partition(&mut self, partition: u32) {
        header::write_partition(&mut self.buf, partition);
    }

    /// Stamps the publish timestamp (microseconds since the Unix epoch), in place.
    pub fn set_timestamp(&mut self, micros: i64) {
        header::write_timestamp(&mut self.buf, micros);
    }

    /// The whole frame, header and body, as stored and sent.
    pub fn as_bytes(&self) -> &[u8] {
        &self.buf
    }

    /// The same frame with `extra` attributes after its own: re-archived from the body where it
    /// lies (strings and data borrowed, nothing deserialized), one copy into the new buffer.
    pub fn with_attributes(&self, extra: &[AttributeRef<'_>]) -> Result<Frame, FrameError> {
        let body = self.body();
        let mut attributes: Vec<AttributeRef<'_>> = Vec::with_capacity(body.attributes.len() + extra.len());
        for a in body.attributes.iter() {
            let value = match &a.value {
                ArchivedAttrValue::Str(s) => AttrValueOf::Str(Text::from(s.as_str())),
                ArchivedAttrValue::Bool(b) => AttrValueOf::Bool(*b),
                ArchivedAttrValue::Int(n) => AttrValueOf::Int(n.to_native()),
            };
            attributes.push(AttributeOf { name: Text::from(a.name.as_str()), value });
        }
        attributes.extend(extra.iter().cloned());
        let borrowed = FrameBodyRef {
            topic: Text::from(body.topic.as_str()),
            attributes: Slice(&attributes),
            data: Bytes(std::borrow::Cow::Borrowed(body.data.as_slice())),
        };
        Frame::encode_ref(&self.header(), &borrowed)
    }

    /// Deserializes the body into owned values (tests, tools; not the hot path).
    pub fn to_body(&self) -> FrameBody {
        rkyv::deserialize::<FrameBody, rkyv::rancor::Error>(self.body()).expect("a validated body always deserializes")
    }
}
