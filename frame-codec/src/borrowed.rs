//! Borrowed stand-ins for `String`, `Vec<u8>` and `Vec<T>` that archive to exactly what those
//! archive to (`ArchivedString`, `ArchivedVec`), so a frame body can be encoded straight from
//! the request's bytes. Each one archives through rkyv's own `ArchivedString`/`ArchivedVec`
//! functions, the ones the owned types' impls use.

use std::borrow::Cow;

use rkyv::rancor::{Fallible, Source};
use rkyv::ser::{Allocator, Writer};
use rkyv::string::{ArchivedString, StringResolver};
use rkyv::vec::{ArchivedVec, VecResolver};
use rkyv::{Archive, Place, Serialize};

/// A string archived as a `String` is: borrowed unless it had to be unescaped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Text<'a>(pub Cow<'a, str>);

impl Text<'_> {
    /// The string, borrowed or unescaped.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl AsRef<str> for Text<'_> {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl<'a> From<&'a str> for Text<'a> {
    fn from(s: &'a str) -> Self {
        Text(Cow::Borrowed(s))
    }
}

impl Archive for Text<'_> {
    type Archived = ArchivedString;
    type Resolver = StringResolver;

    fn resolve(&self, resolver: Self::Resolver, out: Place<Self::Archived>) {
        ArchivedString::resolve_from_str(&self.0, resolver, out);
    }
}

impl<S: Fallible + Writer + ?Sized> Serialize<S> for Text<'_>
where
    S::Error: Source,
{
    fn serialize(&self, serializer: &mut S) -> Result<Self::Resolver, S::Error> {
        ArchivedString::serialize_from_str(&self.0, serializer)
    }
}

/// Bytes archived as a `Vec<u8>` is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bytes<'a>(pub Cow<'a, [u8]>);

impl Archive for Bytes<'_> {
    type Archived = ArchivedVec<u8>;
    type Resolver = VecResolver;

    fn resolve(&self, resolver: Self::Resolver, out: Place<Self::Archived>) {
        ArchivedVec::resolve_from_len(self.0.len(), resolver, out);
    }
}

impl<S: Fallible + Allocator + Writer + ?Sized> Serialize<S> for Bytes<'_> {
    fn serialize(&self, serializer: &mut S) -> Result<Self::Resolver, S::Error> {
        ArchivedVec::<u8>::serialize_from_slice(&self.0, serializer)
    }
}

/// A slice archived as a `Vec<T>` is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Slice<'a, T>(pub &'a [T]);

impl<T: Archive> Archive for Slice<'_, T> {
    type Archived = ArchivedVec<T::Archived>;
    type Resolver = VecResolver;

    fn resolve(&self, resolver: Self::Resolver, out: Place<Self::Archived>) {
        ArchivedVec::resolve_from_len(self.0.len(), resolver, out);
    }
}

impl<T: Serialize<S>, S: Fallible + Allocator + Writer + ?Sized> Serialize<S> for Slice<'_, T> {
    fn serialize(&self, serializer: &mut S) -> Result<Self::Resolver, S::Error> {
        ArchivedVec::<T::Archived>::serialize_from_slice(self.0, serializer)
    }
}
