//! One WebSocket session of a subscription (or a follower's, an agent's): set up here, then
//! driven by `lean` on a plain socket, or here by a reader half (client frames, see `wsmsg`)
//! and a writer half draining the session's bounded queue on a TLS one, batching whatever is
//! queued into one write.

use std::cell::Cell;
use std::rc::Rc;
use std::time::{Duration, Instant};

use crate::queue;
use futures::future::{select, Either};
use futures::FutureExt as _;
use monoio::io::AsyncWriteRent;

use super::wsmsg::{close_bytes, on_message, AckedSession, Ends, Live, Replies, Step, WRITE_BATCH, WRITE_STALL};
use super::{attach_acked, Kind, Outbound, Publisher};
use crate::server::conn::{read_more_sized, ConnLimits, ReadOutcome};
use crate::server::stream::ReadHalf;
use crate::server::SessionSpec;
use crate::shard::core::Shard;
use crate::shard::requests::Replier;
use crate::sys::SharedFrames;
use crate::ws::{encode_frame, CloseCode, MessageReader, OpCode};

/// Clients of a session send only small control messages; idle sessions must stay small.
const SESSION_READ_CHUNK: usize = 512;

async fn read_half<R: monoio::io::AsyncReadRent>(
    rd: R,
    buf: Vec<u8>,
    max_message: usize,
    ctl: queue::Sender<Outbound>,
    (acked, replies): (Option<Rc<AckedSession>>, Replies),
    heard: Rc<Cell<Instant>>,
) {
    // Metered like an HTTP connection (see `server::conn::serve`): after a message that took
    // over `task::HEAVY` of the core (a 10,000-id ack), the session waits its turn in the heavy
    // lane before it reads on.
    let meter = crate::task::Meter::default();
    crate::task::metered(&meter, read_messages(rd, buf, max_message, ctl, (acked, replies), heard, &meter)).await
}

async fn read_messages<R: monoio::io::AsyncReadRent>(
    mut rd: R,
    mut buf: Vec<u8>,
    max_message: usize,
    ctl: queue::Sender<Outbound>,
    (acked, mut replies): (Option<Rc<AckedSession>>, Replies),
    heard: Rc<Cell<Instant>>,
    meter: &crate::task::Meter,
) {
    let mut ctl = ctl;
    let mut reader = MessageReader::new(max_message);
    let mut turns: u32 = 0;
    loop {
        // A client streaming frames must not hold the core (see `task::yield_now`).
        turns += 1;
        if turns % crate::task::TURN == 0 {
            crate::task::yield_now().await;
        }
        loop {
            let (msg, used) = match reader.read(&mut buf) {
                Ok(r) => r,
                Err(e) => {
                    let _ = ctl.send_past_bound(Outbound::Close(e.code.0, ""));
                    return;
                }
            };
            buf.drain(..used);
            let Some(msg) = msg else { break };
            // An answer waits for room: a peer flooding pings or bad frames is held at its socket.
            match on_message(msg, acked.as_deref(), &mut replies, meter).await {
                Step::Go => {}
                Step::Send(frame) => {
                    let _ = ctl.send(Outbound::Frame(Rc::new(frame))).await;
                }
                Step::Close(code) => {
                    let _ = ctl.send_past_bound(Outbound::Close(code, ""));
                    return;
                }
            }
        }
        // A subscriber may stay silent for as long as it likes; only the socket closing ends it.
        match read_more_sized(&mut rd, &mut buf, None, SESSION_READ_CHUNK).await {
            ReadOutcome::Data => heard.set(Instant::now()),
            ReadOutcome::Closed | ReadOutcome::TimedOut => return,
        }
    }
}

/// Writes all of `batch`, a `writev` at a time, advancing past what each one took; `false` if
/// the socket broke or a write made no progress for `WRITE_STALL` (the client stopped reading).
pub(crate) async fn write_shared<W: AsyncWriteRent>(wr: &mut W, mut batch: SharedFrames) -> (bool, SharedFrames) {
    while batch.bytes() > 0 {
        match crate::server::deadline::within(WRITE_STALL, wr.writev(batch)).await {
            Ok((Ok(n), back)) if n > 0 => {
                batch = back;
                batch.advance(n);
            }
            // Cancelled by the timeout: the runtime owned (and dropped) the batch.
            Err(_) => return (false, SharedFrames::default()),
            Ok((_, back)) => return (false, back),
        }
    }
    (true, batch)
}

/// Pings a session from which nothing arrived for `every`, and ends (returns) once nothing
/// arrived for twice that: a peer that vanished without a FIN must not hold a session forever.
async fn keepalive(ctl: queue::Sender<Outbound>, heard: Rc<Cell<Instant>>, every: Duration) {
    loop {
        monoio::time::sleep(every).await;
        let silent = heard.get().elapsed();
        if silent >= every * 2 {
            let _ = ctl.send_past_bound(Outbound::Close(CloseCode::GOING_AWAY.0, ""));
            return;
        }
        if silent >= every {
            let mut ping = Vec::with_capacity(2);
            encode_frame(OpCode::Ping, true, b"", &mut ping);
            let _ = ctl.try_send(Outbound::Frame(Rc::new(ping)));
        }
    }
}

/// Writes queued frames until a close; returns once the close frame is out or the socket broke.
/// Whatever is queued when the writer wakes (after `linger`) goes out in one vectored write of
/// the shared renderings, without copying them.
async fn write_half<W: AsyncWriteRent>(
    count_write: impl Fn(),
    mut wr: W,
    mut events: queue::Receiver<Outbound>,
    mut ctl: queue::Receiver<Outbound>,
    linger: Duration,
    queued: Option<Rc<Cell<usize>>>,
) {
    // What is taken off the events queue no longer counts against the session's queued bytes.
    let taken = |m: Outbound| {
        if let (Some(q), Outbound::Frame(b)) = (&queued, &m) {
            q.set(q.get().saturating_sub(b.len()));
        }
        m
    };
    let mut batch = SharedFrames::default();
    loop {
        // The control queue first: a close, or the peer gone, is seen however busy the fan-out.
        let next = match select(ctl.recv(), events.recv()).await {
            Either::Left((Some(m), _)) => m,
            // The reader finished without asking for a close: the peer is gone.
            Either::Left((None, _)) => return,
            Either::Right((Some(m), _)) => taken(m),
            // Our queue was closed by the fan-out: this session fell too far behind.
            Either::Right((None, _)) => Outbound::Close(CloseCode::POLICY.0, ""),
        };
        if !linger.is_zero() && matches!(next, Outbound::Frame(_)) {
            // Let more events join this write (delivery_linger_us).
            monoio::time::sleep(linger).await;
        }
        let mut close = None;
        let mut peer_gone = false;
        let mut pending = Some(next);
        while let Some(m) = pending.take() {
            match m {
                Outbound::Frame(bytes) => batch.push(bytes),
                Outbound::Close(code, reason) => {
                    close = Some((code, reason));
                    break;
                }
            }
            if batch.bytes() < WRITE_BATCH && batch.len() < SharedFrames::MAX - 1 {
                pending = match ctl.try_recv() {
                    Ok(m) => Some(m),
                    Err(e) => {
                        peer_gone |= e.is_closed();
                        events.try_recv().ok().map(taken)
                    }
                };
            }
        }
        if let Some((code, reason)) = close {
            batch.push(Rc::new(close_bytes(code, reason)));
        }
        count_write();
        let (ok, mut back) = write_shared(&mut wr, batch).await;
        if !ok {
            return;
        }
        back.clear();
        batch = back;
        if close.is_some() {
            let _ = wr.shutdown().await;
            return;
        }
        if peer_gone {
            return;
        }
    }
}

/// A session's socket and the queue its writer drains.
pub(super) struct Io {
    pub stream: crate::server::Stream,
    /// Bytes read past the upgrade request.
    pub buf: Vec<u8>,
    pub limits: ConnLimits,
    pub events: queue::Receiver<Outbound>,
    /// A live fan-out session's registration (and what `events` holds, in bytes).
    pub live: Option<Box<Live>>,
}

/// Drives a WebSocket session: a reader (pings, close, acks of `acked`, reply frames), a
/// keepalive, a writer draining `io.events`, and `ends`: once it resolves with `Some(reason)`
/// the session closes with 1008 and that reason (`None`: it had nothing more to say, the
/// session goes on until either side closes it; no `ends`: nothing but the two sides ends it).
///
/// A plain socket's session is one task driven by readiness (`lean`); a TLS one's bytes go
/// through rustls, and it keeps a reader and a writer task ([`run_split`]).
pub(super) fn run(
    shard: &Rc<Shard>,
    io: Io,
    acked: Option<Box<AckedSession>>,
    (replier, publisher): (Replier, Publisher),
    ends: Option<Ends>,
) -> impl std::future::Future<Output = ()> {
    let Io { stream, buf, limits, events, live } = io;
    let replies = Replies::new(shard.clone(), replier, publisher);
    match stream {
        crate::server::Stream::Plain(tcp) => {
            let every = shard.shared.config.ws_ping_interval;
            let (shard, wire, replies) = (shard.clone(), super::lean::Wire::Ws, Some(replies));
            let lean = super::lean::Lean::new(shard, wire, events, live, acked, replies, every, limits.delivery_linger);
            let st = super::lean::State::new(buf, limits.ws_max_message);
            Either::Left(super::lean::run(tcp, st, lean, ends))
        }
        stream => {
            let ends = ends.unwrap_or_else(|| Box::pin(std::future::pending()));
            // Boxed: a TLS session's futures are larger, and the plain ones' would take their room.
            Either::Right(Box::pin(run_split(shard, Io { stream, buf, limits, events, live }, acked, replies, ends)))
        }
    }
}

/// [`run`] with a reader task and a writer task (a TLS session).
///
/// A plain function returning the future, not an `async fn`: everything is set up before the
/// first await, and the future keeps only the reader's box and the writer task's handle (an
/// `async fn` would also keep room for every argument, per idle session).
fn run_split(
    shard: &Rc<Shard>,
    io: Io,
    acked: Option<Box<AckedSession>>,
    replies: Replies,
    ends: Ends,
) -> impl std::future::Future<Output = ()> {
    let Io { stream, mut buf, limits, events, live } = io;
    // The session is detached when the last of these goes: with the session, not with its reader.
    let acked: Option<Rc<AckedSession>> = acked.map(Rc::from);
    let queued = live.as_ref().map(|l| l.queued.clone());
    let held = (acked.clone(), live);
    // The HTTP read buffer came along with the upgrade; keep only what it holds.
    buf.shrink_to_fit();
    let (rd, wr) = stream.into_split();
    let (ctl_tx, ctl_rx) = queue::channel(16);
    let heard = Rc::new(Cell::new(Instant::now()));
    let alive = keepalive(ctl_tx.clone(), heard.clone(), shard.shared.config.ws_ping_interval);
    let guard = {
        let ctl = ctl_tx.clone();
        async move {
            match ends.await {
                Some(reason) => {
                    let _ = ctl.send_past_bound(Outbound::Close(CloseCode::POLICY.0, reason));
                }
                None => std::future::pending().await,
            }
        }
    };
    // A dead peer ends the reading side like a closed socket does (both senders of the
    // control queue are dropped then, which tells the writer the peer is gone); so do an
    // expired credential and a revoked permission, once their close is queued.
    //
    // Each part boxed here, outside any `async` block (one that moved them in would keep room
    // for each as well as its box), and the reader sized for its own stream: a plain session's
    // read does not take the room of a TLS one's. 1.4 KB less per idle session
    // (perf/idle_sessions.sh, perf/RESULTS.md).
    let read: std::pin::Pin<Box<dyn std::future::Future<Output = ()>>> = match rd {
        ReadHalf::Plain(rd) => Box::pin(read_half(rd, buf, limits.ws_max_message, ctl_tx, (acked, replies), heard)),
        ReadHalf::Tls(rd) => Box::pin(read_half(rd, buf, limits.ws_max_message, ctl_tx, (acked, replies), heard)),
    };
    let reader = Box::pin(select(read, select(Box::pin(alive), Box::pin(guard))).map(|_| ()));
    // Its own task: under one `select` every wake of the writer (each delivery) would poll the
    // reader too, and the reader's metering reads the clock twice per poll. It ends by itself
    // once the reader's side is dropped (its control queue then has no sender).
    let count_write = {
        let shard = shard.clone();
        move || shard.shared.metrics.shard(shard.id).ws_writes.inc()
    };
    let writer = monoio::spawn(write_half(count_write, wr, events, ctl_rx, limits.delivery_linger, queued));
    async move {
        let _held = held;
        match select(reader, writer).await {
            // The reader is done (close asked or peer gone): let the writer send what it must.
            Either::Left(((), writer)) => writer.await,
            // The writer closed (slow consumer, removed subscription) or broke: give the peer a
            // moment to answer our close, then drop the socket.
            Either::Right(((), reader)) => {
                let _ = monoio::time::timeout(Duration::from_secs(1), reader).await;
            }
        }
    }
}

/// Runs a WebSocket session on this shard until either side closes it.
///
/// A plain function returning the future: everything is set up before its first await, and the
/// future keeps the session's own future and the two names its end needs (an `async fn` would
/// also keep every argument, the whole spec among them, per idle session).
pub fn session(
    shard: Rc<Shard>,
    stream: crate::server::Stream,
    buf: Vec<u8>,
    limits: ConnLimits,
    spec: Box<SessionSpec>,
    publisher: Publisher,
) -> impl std::future::Future<Output = ()> {
    // Detached when its `AckedSession`, or its `Live`, goes.
    let (events, acked, live) = if spec.acked {
        let (events, consumer, at) = attach_acked(&shard, &spec, Kind::Ws);
        let acked = AckedSession { shard: shard.clone(), consumer, topic: spec.topic.clone(), at };
        (events, Some(Box::new(acked)), None)
    } else {
        let (live, events) = Live::add(&shard, &spec.subscription, &spec.topic);
        (events, None, Some(live))
    };
    let replier = Replier { principal: spec.principal.clone(), tenant: spec.tenant.clone(), agent: None };
    // An expired credential or a revoked permission closes the session (1008); a session
    // opened without one (`auth = none`) has nothing to watch.
    let guard: Option<Ends> = match spec.principal.is_some() {
        true => {
            let shard = shard.clone();
            Some(Box::pin(async move { Some(super::authority(&shard, &spec).await) }))
        }
        false => None,
    };
    let io = Io { stream, buf, limits, events, live };
    run(&shard, io, acked, (replier, publisher), guard)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Once the reader is gone (its control queue has no sender), the writer ends at its next
    /// turn, however busy the fan-out: it once looked at the events first and at the control
    /// queue only when they ran dry, so a steady stream kept a dead peer's session alive.
    #[test]
    fn the_writer_ends_when_the_reader_is_gone_however_busy_the_fan_out() {
        // A client that reads slowly: the writer's writes wait for room, and the fan-out
        // refills its queue meanwhile.
        let client = |mut c: std::net::TcpStream| {
            use std::io::Read;
            let mut buf = [0u8; 4096];
            while c.read(&mut buf).is_ok_and(|n| n > 0) {
                std::thread::sleep(Duration::from_millis(1));
            }
        };
        super::super::with_loopback_client(client, |wr| async move {
            let (events_tx, events) = queue::channel(SharedFrames::MAX * 4);
            let (ctl_tx, ctl) = queue::channel(16);
            let frame = Rc::new(vec![b'x'; 4096]);
            // The fan-out: the queue is never empty when the writer looks.
            for _ in 0..SharedFrames::MAX * 2 {
                events_tx.try_send(Outbound::Frame(frame.clone())).unwrap();
            }
            let stop = Rc::new(Cell::new(false));
            let feeding = stop.clone();
            monoio::spawn(async move {
                while !feeding.get() {
                    while events_tx.try_send(Outbound::Frame(frame.clone())).is_ok() {}
                    monoio::time::sleep(Duration::from_millis(1)).await;
                }
            });
            drop(ctl_tx);
            let writer = write_half(|| (), wr, events, ctl, Duration::ZERO, None);
            let ended = monoio::time::timeout(Duration::from_secs(5), writer).await;
            stop.set(true);
            assert!(ended.is_ok(), "the writer went on writing for a reader that is gone");
        });
    }
}
