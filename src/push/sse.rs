//! Server-sent events sessions: `GET /events/sse` answers `200 text/event-stream` (chunked) and
//! the connection becomes a session of acknowledged delivery. Each event is `id:` (the delivery
//! id) plus `data:` lines (the structured CloudEvent with the `em*` extensions); clients ack with
//! `POST /events/ack`. A reconnect with `Last-Event-ID` acknowledges everything of that
//! partition up to the event it names (the stream delivers a partition in order), so a resumed
//! stream does not repeat what the client already has.

use std::collections::BTreeMap;
use std::rc::Rc;
use std::time::Duration;

use crate::queue;
use futures::future::{select, Either};
use futures::FutureExt as _;
use monoio::io::{AsyncReadRent, AsyncWriteRent, AsyncWriteRentExt};

use super::wsmsg::AckedSession;
use super::{attach_acked, consumer_of, Kind, Outbound};
use crate::delivery::parse_delivery_id;
use crate::model::delivery::AckKind;
use crate::server::conn::{read_more_sized, ReadOutcome};
use crate::server::SessionSpec;
use crate::shard::core::Shard;
use crate::shard::sessions::chunk;

/// A comment line every so often lets both sides notice a dead connection.
const HEARTBEAT: Duration = Duration::from_secs(15);
const WRITE_STALL: Duration = Duration::from_secs(10);

/// Reads (and drops) whatever the client sends until it closes.
async fn until_closed<R: AsyncReadRent>(mut rd: R, mut buf: Vec<u8>) {
    let mut turns: u32 = 0;
    loop {
        // A client that keeps sending must not hold the core (see `task::yield_now`).
        turns += 1;
        if turns % crate::task::TURN == 0 {
            crate::task::yield_now().await;
        }
        buf.clear();
        match read_more_sized(&mut rd, &mut buf, None, 512).await {
            ReadOutcome::Data => {}
            ReadOutcome::Closed | ReadOutcome::TimedOut => return,
        }
    }
}

async fn write_events<W: AsyncWriteRent>(mut wr: W, mut events: queue::Receiver<Outbound>) {
    let mut out = Vec::new();
    loop {
        match crate::server::deadline::within(HEARTBEAT, events.recv()).await {
            Ok(Some(Outbound::Frame(bytes))) => {
                out.extend_from_slice(&bytes);
                // What else is queued joins this write; a close among it ends the stream after
                // the events before it (taken here, it must not be dropped).
                while out.len() <= 256 * 1024 {
                    match events.try_recv() {
                        Ok(Outbound::Frame(more)) => out.extend_from_slice(&more),
                        Ok(Outbound::Close(..)) => return end_stream(wr, out).await,
                        Err(_) => break,
                    }
                }
            }
            // Closed (subscription removed) or dropped: end the stream properly.
            Ok(Some(Outbound::Close(..))) | Ok(None) => return end_stream(wr, out).await,
            Err(_) => chunk(b": keep-alive\n\n", &mut out),
        }
        let sent = crate::server::deadline::within(WRITE_STALL, wr.write_all(std::mem::take(&mut out))).await;
        match sent {
            Ok((Ok(_), mut back)) => {
                back.clear();
                out = back;
            }
            _ => return,
        }
    }
}

/// Writes what is pending and the chunked body's end, then shuts the socket's writing side.
async fn end_stream<W: AsyncWriteRent>(mut wr: W, mut out: Vec<u8>) {
    out.extend_from_slice(b"0\r\n\r\n");
    let _ = crate::server::deadline::within(WRITE_STALL, wr.write_all(out)).await;
    let _ = wr.shutdown().await;
}

/// Serves a stream whose events come from `events` until the client goes away or the queue
/// ends (then the chunked body is ended properly).
/// Serves `events` while `feed` fills them: once the feed ends (its queue closed), the writer
/// sends what is queued and ends the body; the credential's expiry ends the feed too; once the
/// client goes, the feed ends with it. (Turn streams and A2A task streams and relays.)
pub(super) async fn serve_fed(
    stream: crate::server::Stream,
    buf: Vec<u8>,
    events: queue::Receiver<Outbound>,
    feed: impl std::future::Future<Output = ()>,
    expires_us: Option<i64>,
) {
    let ending = select(Box::pin(feed), Box::pin(super::expired(expires_us)));
    let serving = Box::pin(serve(stream, buf, events));
    if let Either::Left((_, serving)) = select(Box::pin(ending), serving).await {
        serving.await;
    }
}

pub(super) async fn serve(stream: crate::server::Stream, buf: Vec<u8>, events: queue::Receiver<Outbound>) {
    let (rd, wr) = stream.into_split();
    let _ = select(Box::pin(until_closed(rd, buf)), Box::pin(write_events(wr, events))).await;
}

/// Runs an SSE session until the client goes away or the subscription is removed.
///
/// A plain function returning the future: set up before its first await, the future keeps the
/// session's and what its end undoes. On a plain socket the stream is one task driven by
/// readiness (`lean`); a TLS one's reader and writer are `serve`'s.
pub fn session(
    shard: Rc<Shard>,
    stream: crate::server::Stream,
    buf: Vec<u8>,
    spec: Box<SessionSpec>,
) -> impl std::future::Future<Output = ()> {
    // Resuming only means something for a consumer whose offsets are kept: an anonymous one's
    // would be another stream's (its session number is not known yet; it was once taken as 0,
    // and a reconnect acknowledged what that stream had in flight).
    if let Some((p, o)) = spec.last_event_id.as_deref().and_then(parse_delivery_id) {
        let (named, kept) = consumer_of(&spec, shard.id, u64::MAX);
        if kept {
            // A Last-Event-ID naming a partition the topic does not have is ignored.
            let _ = shard.route_acks(&named, &spec.topic, BTreeMap::from([(p, vec![o])]), AckKind::UpTo, false);
        }
    }
    let (events, consumer, at) = attach_acked(&shard, &spec, Kind::Sse);
    let pairs = super::owns_its_ids(&spec, Kind::Sse);
    // Detaches the stream when it goes, with the stream's future.
    let acked = Box::new(AckedSession { shard: shard.clone(), consumer, topic: spec.topic.clone(), at });
    match stream {
        crate::server::Stream::Plain(tcp) => {
            // An expired credential or a revoked permission ends the stream (its chunked body
            // ended properly); a stream opened without one has nothing to watch.
            let ends: Option<super::wsmsg::Ends> = match spec.principal.is_some() {
                true => {
                    let shard = shard.clone();
                    Some(Box::pin(async move { Some(super::authority(&shard, &spec).await) }))
                }
                false => None,
            };
            let wire = super::lean::Wire::Sse;
            let mut lean =
                super::lean::Lean::new(shard.clone(), wire, events, None, Some(acked), None, HEARTBEAT, Duration::ZERO);
            lean.pairs = pairs;
            let st = super::lean::State::new(Vec::new(), 0);
            drop(buf);
            Either::Left(super::lean::run(tcp, st, lean, ends))
        }
        stream => {
            let (rd, wr) = stream.into_split();
            // An expired credential or a revoked permission ends the stream like a removed
            // subscription does (the writer ends the chunked body when the queue closes).
            let ended = async move {
                let reason = super::authority(&shard, &spec).await;
                shard.sessions.close_acked(at.id, crate::ws::CloseCode::POLICY.0, reason);
                // The close ends the stream properly once the writer gets to it; a writer stuck
                // behind a full queue or a client that stopped reading ends with the session here.
                Box::pin(monoio::time::sleep(WRITE_STALL)).await;
            };
            let serve = select(Box::pin(until_closed(rd, buf)), Box::pin(write_events(wr, events)));
            Either::Right(Box::pin(select(Box::pin(serve), Box::pin(ended)).map(move |_| drop(acked))))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    /// A close queued right behind events (a subscription removed, a credential expired, in the
    /// same turn as a delivery) ends the stream after those events; it was once taken with them
    /// and dropped, and the stream went on.
    #[test]
    fn a_close_queued_behind_events_ends_the_stream() {
        let client = |mut c: std::net::TcpStream| {
            c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            let mut got = Vec::new();
            c.read_to_end(&mut got).map(|_| got)
        };
        let got = super::super::with_loopback_client(client, |stream| async move {
            let (tx, rx) = queue::channel(8);
            for e in [&b"one"[..], b"two"] {
                let mut framed = Vec::new();
                chunk(e, &mut framed);
                tx.try_send(Outbound::Frame(Rc::new(framed))).unwrap();
            }
            tx.try_send(Outbound::Close(1000, "")).unwrap();
            // The sender stays: only the close can end the stream.
            let _keep = tx;
            let ended = monoio::time::timeout(Duration::from_secs(10), write_events(stream, rx)).await;
            assert!(ended.is_ok(), "the writer went on after the close");
        });
        let got = got.expect("the stream ended (no read timeout)");
        assert_eq!(got, b"3\r\none\r\n3\r\ntwo\r\n0\r\n\r\n");
    }
}
