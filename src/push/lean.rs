//! A plain (not TLS) WebSocket session, or server-sent event stream, in one task, driven by its
//! socket's readiness, so that an idle session holds next to nothing.
//!
//! While the session is idle, the runtime holds only a readiness wait on its socket: no read is
//! posted with a buffer of the session's (once the socket is readable, its bytes are taken into
//! a buffer lent by the thread's pool, and given back), no write is in flight (frames go out
//! with a non-blocking `sendmsg` from where they lie, and only a socket that takes no more is
//! waited on), there is no second task, and the keep-alive is a slot in the thread's deadline
//! table (`server::deadline`), not a timer of its own. TLS sessions, whose bytes go through
//! rustls, keep the reader and writer tasks of `ws`.

use std::cell::RefCell;
use std::future::Future;
use std::os::fd::AsRawFd;
use std::pin::pin;
use std::rc::Rc;
use std::task::Poll;
use std::time::{Duration, Instant};

use monoio::net::TcpStream;

use super::wsmsg::{close_bytes, on_message, AckedSession, Ends, Live, Replies, Step, WRITE_BATCH, WRITE_STALL};
use super::Outbound;
use crate::queue;
use crate::server::deadline;
use crate::sys::{recv_now, shutdown_write, SharedFrames};
use crate::ws::{encode_frame, CloseCode, MessageReader, OpCode};

/// Most bytes one read takes (into the lent buffer).
const READ: usize = 16 * 1024;
/// Bytes left unparsed (part of a frame) up to this are copied out and the lent buffer given
/// back; a larger part (a big message arriving) keeps the buffer until it is whole.
const KEEP_SMALL: usize = 1024;
/// Answers gathered from one read are sent once they reach this many bytes, so a client that
/// sends many small frames without reading holds at most this much of ours.
const OUT_HIGH_WATER: usize = 64 * 1024;

thread_local! {
    /// Read buffers lent to the thread's sessions while they take bytes in (a few: only a
    /// session that waits in the middle of its messages, for a cross-core answer say, keeps one
    /// that long).
    static POOL: RefCell<Vec<Vec<u8>>> = const { RefCell::new(Vec::new()) };
}

fn lend() -> Vec<u8> {
    POOL.with_borrow_mut(Vec::pop).unwrap_or_else(|| Vec::with_capacity(READ))
}

fn give(mut b: Vec<u8>) {
    if b.capacity() <= 4 * READ {
        b.clear();
        POOL.with_borrow_mut(|p| {
            if p.len() < 8 {
                p.push(b);
            }
        });
    }
}

/// What the session speaks.
pub(super) enum Wire {
    /// WebSocket frames both ways; the client's messages are acted on.
    Ws,
    /// A chunked `text/event-stream`: whatever the client sends is dropped, a comment line
    /// keeps a quiet stream alive, and its end is the chunked body's.
    Sse,
}

/// What the session serves: its queue of events and who answers its clients' messages.
pub(super) struct Lean {
    pub shard: Rc<crate::shard::core::Shard>,
    pub wire: Wire,
    pub events: queue::Receiver<Outbound>,
    /// A live fan-out session's registration, with what `events` holds in bytes.
    live: Option<Box<Live>>,
    /// Boxed: most live fan-out sessions have none. (An event stream's is held only to detach
    /// it when the stream goes.)
    pub acked: Option<Box<AckedSession>>,
    /// Who answers a WebSocket client's messages (none on an event stream).
    pub replies: Option<Replies>,
    /// WebSocket: silent this long, the client is pinged; twice as long, the session ends.
    /// Event stream: a comment line goes out when nothing else did for this long. (In
    /// milliseconds, like `linger` in microseconds: every idle session holds both.)
    every_ms: u32,
    /// Events are gathered this long before a write (`delivery_linger_us`).
    linger_us: u32,
    /// Frames come in pairs that one write must not split before a close (an SSE stream that
    /// owns its ids: its head, then the shared tail; see `push::owns_its_ids`).
    pub pairs: bool,
}

impl Lean {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        shard: Rc<crate::shard::core::Shard>,
        wire: Wire,
        events: queue::Receiver<Outbound>,
        live: Option<Box<Live>>,
        acked: Option<Box<AckedSession>>,
        replies: Option<Replies>,
        every: Duration,
        linger: Duration,
    ) -> Lean {
        let every_ms = u32::try_from(every.as_millis()).unwrap_or(u32::MAX);
        let linger_us = u32::try_from(linger.as_micros()).unwrap_or(u32::MAX);
        Lean { shard, wire, events, live, acked, replies, every_ms, linger_us, pairs: false }
    }

    fn every(&self) -> Duration {
        Duration::from_millis(u64::from(self.every_ms))
    }

    fn linger(&self) -> Duration {
        Duration::from_micros(u64::from(self.linger_us))
    }
}

/// The session's own bytes and counters.
pub(super) struct State {
    /// Bytes of a frame not yet whole (and, at the start, those read past the upgrade).
    pending: Vec<u8>,
    reader: MessageReader,
    /// Frames to send.
    out: Out,
    /// When the client was last heard from (the deadline table's clock).
    heard: Instant,
    /// The last read filled its buffer: more may wait without a readiness wait.
    more: bool,
    /// Reads taken: every `task::TURN` of them the session lets others run (a `u16` wraps
    /// at a multiple of it; with the flags and `unacked` it fills 8 bytes).
    turns: u16,
    /// Something went out since the last keep-alive turn.
    wrote: bool,
    /// What the socket's send queue held unacknowledged at the last keep-alive turn.
    unacked: u32,
}

impl State {
    pub(super) fn new(mut pending: Vec<u8>, max_message: usize) -> Self {
        // The HTTP read buffer came along with the upgrade: keep only what it holds.
        pending.shrink_to_fit();
        let reader = MessageReader::new(max_message);
        State {
            pending,
            reader,
            out: Out::default(),
            heard: deadline::now(),
            more: false,
            turns: 0,
            wrote: false,
            unacked: 0,
        }
    }
}

/// What ends a session early, polled only once it asked to be (its own waker fired), not at
/// every wake of the session (each delivery): a credential's watch polls a timer and the
/// policy's generation, work a fan-out would otherwise pay per event.
struct Woken {
    fut: Ends,
    flag: std::sync::Arc<Flag>,
}

/// Set by the watched future's wake, which also wakes the session's task.
struct Flag {
    woke: std::sync::atomic::AtomicBool,
    task: std::sync::Mutex<Option<std::task::Waker>>,
}

impl std::task::Wake for Flag {
    fn wake(self: std::sync::Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &std::sync::Arc<Self>) {
        self.woke.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(w) = self.task.lock().ok().and_then(|t| t.clone()) {
            w.wake();
        }
    }
}

impl Woken {
    fn new(fut: Ends) -> Self {
        // Polled the first time, as if woken.
        let flag = Flag { woke: std::sync::atomic::AtomicBool::new(true), task: std::sync::Mutex::new(None) };
        Woken { fut, flag: std::sync::Arc::new(flag) }
    }

    fn poll(&mut self, cx: &mut std::task::Context<'_>) -> Poll<Option<&'static str>> {
        if !self.flag.woke.swap(false, std::sync::atomic::Ordering::Relaxed) {
            return Poll::Pending;
        }
        if let Ok(mut task) = self.flag.task.lock() {
            if !task.as_ref().is_some_and(|t| t.will_wake(cx.waker())) {
                *task = Some(cx.waker().clone());
            }
        }
        let waker = std::task::Waker::from(self.flag.clone());
        self.fut.as_mut().poll(&mut std::task::Context::from_waker(&waker))
    }
}

/// How the session ends.
enum End {
    /// The peer is gone (or the socket broke): nothing more to send.
    Gone,
    /// Send a close frame; with `wait`, give the peer a moment to answer it.
    Close { code: u16, reason: &'static str, wait: bool },
}

/// What woke the session.
enum Wake {
    /// The socket has bytes (`armed`: its readiness wait completed and must be posted again).
    Read {
        armed: bool,
    },
    Out(Outbound),
    /// The fan-out closed the queue: the session fell too far behind, or its source ended.
    QueueClosed,
    Tick,
    End(&'static str),
}

/// Drives the session until either side closes it. `ends` resolving with `Some(reason)` closes
/// it with 1008 and that reason (boxed: most sessions have none to watch). A plain function returning the future: the `async` block uses
/// its captures in place, so each is stored once.
pub(super) fn run(stream: TcpStream, st: State, s: Lean, ends: Option<Ends>) -> impl Future<Output = ()> {
    let (mut st, mut s, mut ends) = (st, s, ends.map(|e| Box::new(Woken::new(e))));
    async move {
        let fd = stream.as_raw_fd();
        let mut readable = pin!(stream.readable(false));
        let mut tick = pin!(deadline::within(s.every(), std::future::pending::<()>()));
        // Bytes that came with the upgrade request may already be messages.
        let mut end = match st.pending.is_empty() {
            true => None,
            false => Box::pin(st.take_metered(&stream, &mut s, false)).await,
        };
        // Reads and writes take turns when both are ready: a client streaming frames does not
        // starve its own deliveries, nor a busy fan-out its reads.
        let mut read_first = true;
        while end.is_none() {
            let more = st.more;
            let wake = std::future::poll_fn(|cx| {
                if let Some(Poll::Ready(r)) = ends.as_mut().map(|e| e.poll(cx)) {
                    ends = None;
                    if let Some(reason) = r {
                        return Poll::Ready(Wake::End(reason));
                    }
                }
                if tick.as_mut().poll(cx).is_ready() {
                    return Poll::Ready(Wake::Tick);
                }
                let mut read = |cx: &mut std::task::Context<'_>| match more {
                    true => Some(Wake::Read { armed: false }),
                    false => readable.as_mut().poll(cx).is_ready().then_some(Wake::Read { armed: true }),
                };
                if read_first {
                    if let Some(w) = read(cx) {
                        return Poll::Ready(w);
                    }
                }
                match std::pin::Pin::new(&mut s.events.recv()).poll(cx) {
                    Poll::Ready(Some(m)) => return Poll::Ready(Wake::Out(m)),
                    Poll::Ready(None) => return Poll::Ready(Wake::QueueClosed),
                    Poll::Pending => {}
                }
                match read_first {
                    false => read(cx).map_or(Poll::Pending, Poll::Ready),
                    true => Poll::Pending,
                }
            })
            .await;
            end = match wake {
                Wake::Read { armed } => {
                    if armed {
                        readable.set(stream.readable(false));
                    }
                    read_first = false;
                    Box::pin(st.take_metered(&stream, &mut s, true)).await
                }
                Wake::Out(m) => {
                    read_first = true;
                    if s.linger_us > 0 && matches!(m, Outbound::Frame(_)) {
                        // Let more events join this write (delivery_linger_us).
                        Box::pin(monoio::time::sleep(s.linger())).await;
                    }
                    st.gather(&mut s, m)
                }
                Wake::QueueClosed => Some(End::Close { code: CloseCode::POLICY.0, reason: "", wait: true }),
                Wake::End(reason) => Some(End::Close { code: CloseCode::POLICY.0, reason, wait: true }),
                Wake::Tick => {
                    tick.set(deadline::within(s.every(), std::future::pending::<()>()));
                    st.tick(&mut s, fd)
                }
            };
            // What the turn gathered goes out now; only a socket that takes no more is waited
            // on (boxed: the wait's state is not kept in every idle session).
            if end.is_none() {
                end = match st.try_flush(&s, fd) {
                    Sent::Done => None,
                    Sent::Broken => Some(End::Gone),
                    Sent::Blocked => (!Box::pin(st.flush(&stream, &s)).await).then_some(End::Gone),
                };
            }
        }
        if let Some(End::Close { code, reason, wait }) = end {
            let last = match s.wire {
                Wire::Ws => close_bytes(code, reason),
                // The chunked body's end.
                Wire::Sse => b"0\r\n\r\n".to_vec(),
            };
            st.out.push(Rc::new(last));
            if Box::pin(st.flush(&stream, &s)).await {
                shutdown_write(fd);
                if wait {
                    let _ = Box::pin(deadline::within(Duration::from_secs(1), drain(&stream))).await;
                }
            }
        }
    }
}

impl State {
    /// [`State::take`], metered like an HTTP connection's requests (`task::Meter`): a message
    /// that took over `task::HEAVY` of the core (a 10,000-id ack) waits its turn in the heavy
    /// lane after it. The meter lives in the take's (boxed) future, not in the idle session's.
    async fn take_metered(&mut self, stream: &TcpStream, s: &mut Lean, fresh: bool) -> Option<End> {
        let meter = crate::task::Meter::default();
        crate::task::metered(&meter, self.take(stream, s, &meter, fresh)).await
    }

    /// Takes what the socket has (`fresh`: after a readiness wait; otherwise only the bytes
    /// already pending) and acts on every whole message in it, sending their answers.
    async fn take(&mut self, stream: &TcpStream, s: &mut Lean, meter: &crate::task::Meter, fresh: bool) -> Option<End> {
        let mut buf = match self.pending.capacity() {
            0 => lend(),
            _ => std::mem::take(&mut self.pending),
        };
        if fresh {
            // A client streaming frames must not hold the core (see `task::yield_now`).
            self.turns = self.turns.wrapping_add(1);
            if u32::from(self.turns) % crate::task::TURN == 0 {
                crate::task::yield_now().await;
            }
            if buf.capacity() - buf.len() < READ / 4 {
                buf.reserve(READ);
            }
            let room = buf.capacity() - buf.len();
            match recv_now(stream.as_raw_fd(), &mut buf) {
                Ok(0) => return Some(End::Gone),
                Ok(n) => {
                    self.more = n == room;
                    self.heard = deadline::now();
                }
                Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::Interrupted) => {
                    self.more = false;
                    self.keep(buf);
                    return None;
                }
                Err(_) => return Some(End::Gone),
            }
        }
        if s.replies.is_none() {
            // An event stream's client has nothing to say: what it sends is dropped.
            buf.clear();
            give(buf);
            return None;
        }
        let mut at = 0;
        let end = loop {
            let (msg, used) = match self.reader.read(&mut buf[at..]) {
                Ok(r) => r,
                Err(e) => break Some(End::Close { code: e.code.0, reason: "", wait: false }),
            };
            at += used;
            let Some(msg) = msg else { break None };
            let replies = s.replies.as_mut().expect("a WebSocket session's (checked above)");
            match on_message(msg, s.acked.as_deref(), replies, meter).await {
                Step::Go => {}
                Step::Send(frame) => {
                    self.out.push(Rc::new(frame));
                    let full = self.out.bytes() >= OUT_HIGH_WATER || self.out.len() >= SharedFrames::MAX;
                    if full && !self.flush(stream, s).await {
                        break Some(End::Gone);
                    }
                }
                Step::Close(code) => break Some(End::Close { code, reason: "", wait: false }),
            }
        };
        buf.drain(..at);
        self.keep(buf);
        match end {
            None if !self.flush(stream, s).await => Some(End::Gone),
            end => end,
        }
    }

    /// Keeps what is left of a read (part of a frame), giving the lent buffer back when it is
    /// small.
    fn keep(&mut self, buf: Vec<u8>) {
        if buf.is_empty() {
            give(buf);
        } else if buf.len() <= KEEP_SMALL {
            // A clone's capacity is its length.
            self.pending = buf.clone();
            give(buf);
        } else {
            self.pending = buf;
        }
    }

    /// Gathers `first` and whatever else is queued into the next write.
    fn gather(&mut self, s: &mut Lean, first: Outbound) -> Option<End> {
        // What is taken off the events queue no longer counts against the session's bytes.
        let taken = |m: Outbound| {
            if let (Some(l), Outbound::Frame(b)) = (&s.live, &m) {
                let q = &l.queued;
                q.set(q.get().saturating_sub(b.len()));
            }
            m
        };
        let mut next = Some(taken(first));
        let mut n = 0;
        while let Some(m) = next.take() {
            n += 1;
            match m {
                Outbound::Frame(bytes) => self.out.push(bytes),
                Outbound::Close(code, reason) => return Some(End::Close { code, reason, wait: true }),
            }
            let room = self.out.bytes() < WRITE_BATCH && self.out.len() < SharedFrames::MAX - 1;
            if room || (s.pairs && n % 2 == 1) {
                next = s.events.try_recv().ok().map(taken);
            }
        }
        if n <= 2 {
            // A quiet session (one event at a time: one frame, or an SSE stream's own head and
            // shared tail) gives its queue's ring back now, not at the keep-alive turn: idle
            // sessions would each hold it between events. A busy one keeps it (no allocation
            // per write).
            s.events.shrink_idle();
        }
        None
    }

    /// Sends what is gathered as far as the socket takes it now.
    fn try_flush(&mut self, s: &Lean, fd: std::os::fd::RawFd) -> Sent {
        if self.out.bytes() == 0 {
            self.out.done();
            return Sent::Done;
        }
        if let Wire::Ws = s.wire {
            s.shard.shared.metrics.shard(s.shard.id).ws_writes.inc();
        }
        self.wrote = true;
        while self.out.bytes() > 0 {
            match self.out.send_now(fd) {
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return Sent::Blocked,
                Err(_) => return Sent::Broken,
            }
        }
        self.out.done();
        Sent::Done
    }

    /// Writes everything gathered: `false` if the socket broke or took nothing for
    /// `WRITE_STALL` (the client stopped reading).
    async fn flush(&mut self, stream: &TcpStream, s: &Lean) -> bool {
        loop {
            match self.try_flush(s, stream.as_raw_fd()) {
                Sent::Done => return true,
                Sent::Broken => return false,
                Sent::Blocked => {
                    if !matches!(deadline::within(WRITE_STALL, stream.writable(false)).await, Ok(Ok(()))) {
                        return false;
                    }
                    // Room again: the peer took what we sent. A slow reader is alive, not silent
                    // (its pongs wait unread meanwhile, behind this write).
                    self.heard = deadline::now();
                }
            }
        }
    }

    /// The keep-alive's turn. WebSocket: a silent client is pinged, and one silent twice as long
    /// is let go (one that took some of our bytes since the last turn is not silent). Event stream: a comment line if nothing went out since the last turn. An idle
    /// session also gives back what its last write and queue had grown.
    fn tick(&mut self, s: &mut Lean, fd: std::os::fd::RawFd) -> Option<End> {
        // A peer that acknowledged some of what we sent since the last turn is alive, however
        // long its pongs take to come back from behind a backlog it is still reading.
        let unacked = crate::sys::unacked(fd);
        if unacked < self.unacked {
            self.heard = deadline::now();
        }
        self.unacked = unacked;
        let silent = deadline::now().saturating_duration_since(self.heard);
        if matches!(s.wire, Wire::Ws) && silent >= s.every() * 2 {
            return Some(End::Close { code: CloseCode::GOING_AWAY.0, reason: "", wait: false });
        }
        s.events.shrink_idle();
        let wrote = std::mem::take(&mut self.wrote);
        match s.wire {
            Wire::Ws if silent >= s.every() => {
                let mut ping = Vec::with_capacity(2);
                encode_frame(OpCode::Ping, true, b"", &mut ping);
                self.out.push(Rc::new(ping));
            }
            Wire::Sse if !wrote => {
                let mut comment = Vec::new();
                crate::shard::sessions::chunk(b": keep-alive\n\n", &mut comment);
                self.out.push(Rc::new(comment));
            }
            _ => {}
        }
        None
    }
}

/// The frames of the write being gathered or sent: boxed, and only while there is one (an idle
/// session holds a pointer, not the 80 bytes of a batch).
#[derive(Default)]
struct Out(Option<Box<SharedFrames>>);

impl Out {
    fn push(&mut self, frame: Rc<Vec<u8>>) {
        self.0.get_or_insert_default().push(frame);
    }

    fn bytes(&self) -> usize {
        self.0.as_ref().map_or(0, |f| f.bytes())
    }

    fn len(&self) -> usize {
        self.0.as_ref().map_or(0, |f| f.len())
    }

    /// See [`SharedFrames::send_now`] (nothing to send: `Ok(0)`).
    fn send_now(&mut self, fd: std::os::fd::RawFd) -> std::io::Result<usize> {
        self.0.as_mut().map_or(Ok(0), |f| f.send_now(fd))
    }

    /// Everything was sent: the batch goes.
    fn done(&mut self) {
        self.0 = None;
    }
}

/// How far [`State::try_flush`] got.
enum Sent {
    Done,
    /// The socket takes no more now.
    Blocked,
    Broken,
}

/// Reads and drops whatever the peer still sends (its close frame) until it closes.
async fn drain(stream: &TcpStream) {
    let mut b = lend();
    loop {
        if stream.readable(false).await.is_err() {
            break;
        }
        b.clear();
        match recv_now(stream.as_raw_fd(), &mut b) {
            Ok(0) => break,
            Ok(_) => {}
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::Interrupted) => {}
            Err(_) => break,
        }
    }
    give(b);
}
