//! The client's share of the open-files limit: every socket it opens holds a slot of
//! `SOCKETS` while it lives ([`set_socket_budget`], [`sockets_open`]), and a `Conn` is a
//! stream with its slot.

use std::sync::atomic::{AtomicUsize, Ordering};

use crate::server::stream::Stream;

/// Sockets counted against a share: how many are open, and how many may be.
pub(super) struct SocketBudget {
    open: AtomicUsize,
    max: AtomicUsize,
}

/// The client's sockets, process-wide ([`set_socket_budget`]).
pub(super) static SOCKETS: SocketBudget = SocketBudget { open: AtomicUsize::new(0), max: AtomicUsize::new(usize::MAX) };

/// The client's share of the descriptors (`config::fds::FdBudget::client_sockets`), set once at
/// start: a connect past it fails at once (a webhook delivery then backs off and retries).
pub fn set_socket_budget(n: usize) {
    SOCKETS.max.store(n.max(1), Ordering::Relaxed);
}

/// Sockets the client has open now (pooled ones included).
pub fn sockets_open() -> usize {
    SOCKETS.open.load(Ordering::Relaxed)
}

/// One socket counted against a budget while it lives.
pub(super) struct SocketSlot(&'static SocketBudget);

impl SocketSlot {
    pub(super) fn take(budget: &'static SocketBudget) -> Option<SocketSlot> {
        if budget.open.fetch_add(1, Ordering::Relaxed) >= budget.max.load(Ordering::Relaxed) {
            budget.open.fetch_sub(1, Ordering::Relaxed);
            return None;
        }
        Some(SocketSlot(budget))
    }
}

impl Drop for SocketSlot {
    fn drop(&mut self) {
        self.0.open.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A connection the client opened, counted against its share of the descriptors.
pub(super) struct Conn {
    pub(super) stream: Stream,
    pub(super) _slot: SocketSlot,
}

impl std::ops::Deref for Conn {
    type Target = Stream;
    fn deref(&self) -> &Stream {
        &self.stream
    }
}

impl std::ops::DerefMut for Conn {
    fn deref_mut(&mut self) -> &mut Stream {
        &mut self.stream
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The client's sockets never pass their share: a slot past it is refused, and one given
    /// back (its connection closed) makes room again.
    #[test]
    fn sockets_past_their_share_are_refused_and_given_back_on_close() {
        static BUDGET: SocketBudget = SocketBudget { open: AtomicUsize::new(0), max: AtomicUsize::new(2) };
        let (a, b) = (SocketSlot::take(&BUDGET).unwrap(), SocketSlot::take(&BUDGET).unwrap());
        assert!(SocketSlot::take(&BUDGET).is_none(), "the share is 2");
        assert_eq!(BUDGET.open.load(Ordering::Relaxed), 2);
        drop(a);
        let c = SocketSlot::take(&BUDGET).expect("room again");
        drop((b, c));
        assert_eq!(BUDGET.open.load(Ordering::Relaxed), 0);
    }
}
