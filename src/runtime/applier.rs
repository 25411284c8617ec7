//! Threads of the runtime that wait for the shards (the cluster's appliers, the Kafka log's
//! topic checks): each runs on a monoio runtime of its own, whose timer bounds those waits.

use crate::shard::mailbox::{Overflow, Sender};
use crate::shard::shared::Shared;

/// Runs a thread of the runtime that waits for the shards' answers (a cluster applier, the
/// Kafka log's topic checks)
/// on a runtime of its own, whose timer bounds those waits (`Mailboxes::ask`).
pub(crate) fn applier(what: &str, run: impl std::future::Future<Output = ()>) {
    let runtime = monoio::RuntimeBuilder::<monoio::LegacyDriver>::new().enable_timer().build();
    if let Err(e) = runtime.map(|mut r| r.block_on(run)) {
        crate::log::warn("cluster", &format!("the {what} thread could not start its runtime: {e}"), &[]);
    }
}

/// `Shard::announce` from a thread of the runtime: tells every shard of
/// a change to subscription `name` (of `topic`), waiting while a mailbox is full.
pub(crate) async fn announce(shared: &Shared, name: &str, topic: &str, change: crate::shard::message::InterestChange) {
    use crate::shard::message::{Interest, ShardMessage};
    let shards = shared.config.shards;
    for s in 0..shards {
        let shard = crate::model::placement::meta_owner(name, shards);
        let i = Interest { subscription: name.to_owned(), topic: topic.to_owned(), shard, change };
        let msg = ShardMessage::Interest(Box::new(i));
        // Waiting never gives up: nothing to handle.
        let _ = shared.mailboxes.post(Sender::Admin, crate::model::ShardId(s as u16), msg, Overflow::Wait).await;
    }
}
