//! The background tasks behind consumers, agents and streams: each is owned by the value the
//! user holds, and ends with it.

use tokio::task::JoinHandle;

/// A spawned task that is aborted when this is dropped, or awaited by [`finish`](Self::finish).
#[derive(Debug)]
pub(crate) struct Owned(Option<JoinHandle<()>>);

impl Owned {
    pub(crate) fn spawn(f: impl std::future::Future<Output = ()> + Send + 'static) -> Owned {
        Owned(Some(tokio::spawn(f)))
    }

    /// Waits for the task to end by itself (its receiver was closed: it winds down).
    pub(crate) async fn finish(&mut self) {
        if let Some(t) = self.0.take() {
            let _ = t.await;
        }
    }
}

impl Drop for Owned {
    fn drop(&mut self) {
        if let Some(t) = &self.0 {
            t.abort();
        }
    }
}
