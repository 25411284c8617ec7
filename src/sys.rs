//! The crate's `unsafe`, in one small module: the process signal mask (for `evmesh serve`'s
//! shutdown), the process's CPU time (for the cluster heartbeat's load), the iovec view of
//! shared delivery buffers for vectored writes, the byte views of the runtime's owned
//! buffers that the TLS layer copies through, the server's heap ([`Heap`]), the CPU's
//! time-stamp counter ([`tsc`]), and a box whose value is made in place ([`boxed_in_place`]).

use std::rc::Rc;

/// The CPU's time-stamp counter (`None` off x86-64): what `task::clock::ticks` meters polls
/// with.
#[inline]
pub fn tsc() -> Option<u64> {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: `rdtsc` is in every x86-64 processor; it reads a counter and nothing else.
    return Some(unsafe { core::arch::x86_64::_rdtsc() });
    #[cfg(not(target_arch = "x86_64"))]
    None
}

/// `make()`'s value in a box, made where it lies: the box is taken first, so the value (a
/// handler's future of kilobytes, made per request) is not built on the stack and copied in.
/// `Box::write` once the MSRV is 1.87.
#[inline(always)]
pub fn boxed_in_place<T>(make: impl FnOnce() -> T) -> Box<T> {
    let mut b = Box::<T>::new_uninit();
    b.write(make());
    // SAFETY: `write` just initialized the box's value.
    unsafe { b.assume_init() }
}

/// Blocks SIGINT, SIGTERM (stop) and SIGHUP (reload the TLS files) in this thread and every
/// thread it spawns later.
pub fn block_signals() -> libc::sigset_t {
    // SAFETY: plain libc calls on a local, zero-initialized sigset.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::sigaddset(&mut set, libc::SIGHUP);
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        set
    }
}

/// Waits for one of the blocked signals and returns its number.
pub fn wait_for_signal(set: &libc::sigset_t) -> i32 {
    let mut sig = 0;
    // SAFETY: `set` was filled by `block_signals`; `sig` is a valid out pointer.
    unsafe {
        libc::sigwait(set, &mut sig);
    }
    sig
}

/// The CPU this process has used, user and system, in microseconds.
pub fn process_cpu_us() -> u64 {
    // SAFETY: getrusage fills a local, zero-initialized rusage.
    let ru = unsafe {
        let mut ru: libc::rusage = std::mem::zeroed();
        if libc::getrusage(libc::RUSAGE_SELF, &mut ru) != 0 {
            return 0;
        }
        ru
    };
    let us = |t: libc::timeval| (t.tv_sec as u64).saturating_mul(1_000_000) + t.tv_usec as u64;
    us(ru.ru_utime) + us(ru.ru_stime)
}

/// Raises the soft open-files limit to the hard one; returns the limit in force.
pub fn raise_nofile() -> u64 {
    // SAFETY: plain libc calls on a local rlimit value.
    unsafe {
        let mut lim: libc::rlimit = std::mem::zeroed();
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) != 0 {
            return 1024;
        }
        if lim.rlim_cur < lim.rlim_max {
            let raised = libc::rlimit { rlim_cur: lim.rlim_max, rlim_max: lim.rlim_max };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &raised) == 0 {
                lim.rlim_cur = lim.rlim_max;
            }
        }
        lim.rlim_cur as u64
    }
}

/// Sets TCP_USER_TIMEOUT on a connected socket: data unacknowledged by a vanished peer for
/// `ms` fails the connection instead of retransmitting for many minutes.
pub fn set_tcp_user_timeout(fd: std::os::fd::RawFd, ms: u32) {
    // SAFETY: setsockopt on a socket this process owns, with a valid u32 option value.
    unsafe {
        libc::setsockopt(
            fd,
            libc::IPPROTO_TCP,
            libc::TCP_USER_TIMEOUT,
            (&ms as *const u32).cast(),
            std::mem::size_of::<u32>() as libc::socklen_t,
        );
    }
}

/// What `poll(2)` says of a connected socket right now, without waiting: `(gone, readable)`,
/// `gone` once the peer shut its sending side or reset the connection (`POLLRDHUP`, also seen
/// while unread bytes wait, unlike a zero-length read), `readable` while bytes wait.
pub fn peer_state(fd: std::os::fd::RawFd) -> (bool, bool) {
    let mut p = libc::pollfd { fd, events: libc::POLLIN | libc::POLLRDHUP, revents: 0 };
    // SAFETY: one valid pollfd for the duration of the call, timeout 0 (never blocks).
    let n = unsafe { libc::poll(&mut p, 1, 0) };
    if n < 0 {
        return (false, false);
    }
    let gone = p.revents & (libc::POLLRDHUP | libc::POLLHUP | libc::POLLERR | libc::POLLNVAL) != 0;
    (gone, p.revents & libc::POLLIN != 0)
}

/// A second descriptor of the socket `fd` (a TLS connection's, whose stream is split between
/// its reader and writer), so the runtime can wait on its readiness apart from them.
pub fn dup_socket(fd: std::os::fd::RawFd) -> std::io::Result<std::net::TcpStream> {
    // SAFETY: `fd` is a socket the caller holds open for the duration of this call; the
    // borrowed descriptor is only duplicated (F_DUPFD_CLOEXEC), never closed here.
    let owned = unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) }.try_clone_to_owned()?;
    Ok(std::net::TcpStream::from(owned))
}

/// The process's resident set, from `/proc/self/statm`.
pub fn resident_bytes() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    Some(pages * page_size())
}

fn page_size() -> u64 {
    // SAFETY: sysconf takes a constant and returns a number.
    let n = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if n > 0 {
        n as u64
    } else {
        4096
    }
}

/// The memory this process may use by default: 80% of the cgroup limit if there is one, else
/// of the machine's memory.
pub fn default_memory_limit() -> u64 {
    let cgroup = std::fs::read_to_string("/sys/fs/cgroup/memory.max")
        .ok()
        .or_else(|| std::fs::read_to_string("/sys/fs/cgroup/memory/memory.limit_in_bytes").ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    // SAFETY: sysconf takes a constant and returns a number.
    let pages = unsafe { libc::sysconf(libc::_SC_PHYS_PAGES) };
    let machine = if pages > 0 { pages as u64 * page_size() } else { 8 << 30 };
    cgroup.filter(|&c| c < machine).unwrap_or(machine) / 10 * 8
}

/// Ends the process at once with `code`: no destructors, no atexit handlers (other threads
/// may be in the middle of anything; what the WAL has written is with the OS already).
pub fn exit_now(code: i32) -> ! {
    // SAFETY: `_exit` takes a plain integer and never returns.
    unsafe { libc::_exit(code) }
}

/// The initialized bytes of a buffer handed over for a write (what the TLS layer encrypts).
pub fn io_bytes<T: monoio::buf::IoBuf>(buf: &T) -> &[u8] {
    if buf.bytes_init() == 0 {
        return &[];
    }
    // SAFETY: `IoBuf` promises `bytes_init` initialized bytes at `read_ptr`, alive and unchanged
    // while the buffer is borrowed.
    unsafe { std::slice::from_raw_parts(buf.read_ptr(), buf.bytes_init()) }
}

/// The buffers of a vectored write, as slices (what the TLS layer encrypts in one go).
pub fn io_slices<T: monoio::buf::IoVecBuf>(bufs: &T) -> Vec<std::io::IoSlice<'_>> {
    let n = bufs.read_iovec_len();
    if n == 0 {
        return Vec::new();
    }
    // SAFETY: `IoVecBuf` promises `read_iovec_len` iovecs at `read_iovec_ptr`, each pointing at
    // that many initialized bytes, alive and unchanged while `bufs` is borrowed.
    let iovecs = unsafe { std::slice::from_raw_parts(bufs.read_iovec_ptr(), n) };
    iovecs
        .iter()
        .filter(|v| v.iov_len > 0)
        .map(|v| std::io::IoSlice::new(unsafe { std::slice::from_raw_parts(v.iov_base as *const u8, v.iov_len) }))
        .collect()
}

/// Copies as much of `src` as fits into a read's destination after the `filled` bytes already
/// there, and marks `filled` plus those initialized; returns how many bytes it copied.
pub fn fill_io_buf<T: monoio::buf::IoBufMut>(dst: &mut T, filled: usize, src: &[u8]) -> usize {
    let total = dst.bytes_total();
    assert!(filled <= total, "filled past the destination");
    let n = src.len().min(total - filled);
    // SAFETY: `IoBufMut` promises `bytes_total` writable bytes at `write_ptr`, of which the
    // first `filled` were initialized by earlier calls; `src` is a distinct, initialized slice
    // of at least `n` bytes, copied to `filled..filled + n`, and exactly `filled + n` are
    // marked initialized.
    unsafe {
        std::ptr::copy_nonoverlapping(src.as_ptr(), dst.write_ptr().add(filled), n);
        dst.set_init(filled + n);
    }
    n
}

/// Rendered frames, shared with other sessions, gathered for one `writev`: the bytes are
/// written from where they lie, never copied into a per-session buffer.
///
/// A socket may take only part of a batch; [`SharedFrames::advance`] moves the iovec view past
/// what was written (whole buffers dropped from the front, the first remaining one cut), so the
/// next `writev` sends exactly the rest. (monoio 0.2.4's own `write_vectored_all` forgets the
/// advanced base of a partly written iovec and then panics; this type replaces it.)
///
/// One frame is held without an allocation (an idle session's write is most often of one
/// event).
#[derive(Default)]
pub struct SharedFrames {
    frames: smallvec::SmallVec<[Rc<Vec<u8>>; 1]>,
    iovecs: smallvec::SmallVec<[libc::iovec; 1]>,
    /// Index of the first frame not completely written.
    start: usize,
    /// Bytes of `frames[start]` already written.
    skip: usize,
    /// Bytes not written yet.
    bytes: usize,
}

impl SharedFrames {
    /// Most buffers one write takes (below every platform's IOV_MAX).
    pub const MAX: usize = 512;

    pub fn push(&mut self, frame: Rc<Vec<u8>>) {
        self.iovecs.push(libc::iovec { iov_base: frame.as_ptr() as *mut libc::c_void, iov_len: frame.len() });
        self.bytes += frame.len();
        self.frames.push(frame);
    }

    /// Buffers gathered (written or not).
    pub fn len(&self) -> usize {
        self.frames.len()
    }

    pub fn is_empty(&self) -> bool {
        self.frames.is_empty()
    }

    /// Bytes not written yet.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Marks the first `n` unwritten bytes as written (`n` is what a `writev` returned).
    pub fn advance(&mut self, n: usize) {
        let mut n = n.min(self.bytes);
        self.bytes -= n;
        while n > 0 {
            let left = self.frames[self.start].len() - self.skip;
            if n >= left {
                n -= left;
                self.start += 1;
                self.skip = 0;
            } else {
                self.skip += n;
                n = 0;
            }
        }
        // Zero-length buffers at the front are written too.
        while self.start < self.frames.len() && self.frames[self.start].len() == self.skip {
            self.start += 1;
            self.skip = 0;
        }
        if let Some(first) = self.frames.get(self.start) {
            let rest = &first[self.skip..];
            self.iovecs[self.start] = libc::iovec { iov_base: rest.as_ptr() as *mut libc::c_void, iov_len: rest.len() };
        }
    }

    /// The unwritten bytes, in order (tests and diagnostics; copies).
    pub fn unwritten(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.bytes);
        for (i, iov) in self.iovecs.iter().enumerate().skip(self.start) {
            let f = &self.frames[i];
            let from = if i == self.start { self.skip } else { 0 };
            debug_assert_eq!(iov.iov_len, f.len() - from);
            out.extend_from_slice(&f[from..]);
        }
        out
    }

    pub fn clear(&mut self) {
        self.frames.clear();
        self.iovecs.clear();
        self.start = 0;
        self.skip = 0;
        self.bytes = 0;
    }
}

impl SharedFrames {
    /// Sends as much of the unwritten bytes as the socket `fd` takes now, without waiting
    /// (`sendmsg` with `MSG_DONTWAIT`: under io_uring the socket itself may be blocking), and
    /// moves past what it took. `WouldBlock` when it took nothing.
    pub fn send_now(&mut self, fd: std::os::fd::RawFd) -> std::io::Result<usize> {
        // At most MAX buffers per call: the kernel refuses more than UIO_MAXIOV (1024) with
        // EMSGSIZE; the caller sends again for the rest.
        let iov = &self.iovecs[self.start..self.iovecs.len().min(self.start + Self::MAX)];
        // SAFETY: a zeroed msghdr is a valid empty one; its iovecs are `iov`, valid for the call
        // (see `IoVecBuf` below for why each points at live, unchanging bytes).
        let n = unsafe {
            let mut msg: libc::msghdr = std::mem::zeroed();
            msg.msg_iov = iov.as_ptr() as *mut libc::iovec;
            msg.msg_iovlen = iov.len() as _;
            libc::sendmsg(fd, &msg, libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL)
        };
        if n < 0 {
            return Err(std::io::Error::last_os_error());
        }
        self.advance(n as usize);
        Ok(n as usize)
    }
}

/// Reads what waits on the socket `fd` into the spare capacity of `buf`, without waiting
/// (`MSG_DONTWAIT`). `Ok(0)`: the peer closed its side (or `buf` has no spare room).
pub fn recv_now(fd: std::os::fd::RawFd, buf: &mut Vec<u8>) -> std::io::Result<usize> {
    let spare = buf.spare_capacity_mut();
    // SAFETY: the kernel writes at most `spare.len()` bytes into the vector's spare capacity,
    // which the length is then extended over (those bytes are initialized by the write).
    let n = unsafe { libc::recv(fd, spare.as_mut_ptr().cast(), spare.len(), libc::MSG_DONTWAIT) };
    if n < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `n` bytes past the length were just written, within the capacity.
    unsafe { buf.set_len(buf.len() + n as usize) };
    Ok(n as usize)
}

/// Sends what the socket `fd` takes of `buf` now, without waiting (`MSG_DONTWAIT`).
pub fn send_now(fd: std::os::fd::RawFd, buf: &[u8]) -> std::io::Result<usize> {
    // SAFETY: `buf` is valid for reads of its length for the duration of the call.
    let n = unsafe { libc::send(fd, buf.as_ptr().cast(), buf.len(), libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL) };
    if n < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(n as usize)
}

/// Bytes waiting to be read on the socket `fd` (`FIONREAD`); 0 if it cannot be read.
pub fn readable_bytes(fd: std::os::fd::RawFd) -> usize {
    ioctl_count(fd, libc::FIONREAD) as usize
}

/// Bytes in the socket `fd`'s send queue not yet acknowledged by the peer (`SIOCOUTQ`); 0 if
/// it cannot be read.
pub fn unacked(fd: std::os::fd::RawFd) -> u32 {
    ioctl_count(fd, libc::TIOCOUTQ)
}

/// A socket ioctl that reports one count; 0 if it fails.
fn ioctl_count(fd: std::os::fd::RawFd, request: libc::Ioctl) -> u32 {
    let mut n: libc::c_int = 0;
    // SAFETY: FIONREAD and SIOCOUTQ (TIOCOUTQ) write one int through the pointer, valid for
    // the call.
    let r = unsafe { libc::ioctl(fd, request, &mut n) };
    if r < 0 {
        0
    } else {
        n.max(0) as u32
    }
}

/// Shuts the sending side of the socket `fd` (our FIN after a close frame).
pub fn shutdown_write(fd: std::os::fd::RawFd) {
    // SAFETY: shutdown on a socket this process owns; an error (already shut) is of no use.
    unsafe { libc::shutdown(fd, libc::SHUT_WR) };
}

// SAFETY: every iovec from `start` on points into the heap buffer of an `Rc<Vec<u8>>` held in
// `frames` (the first one `skip` bytes in, with the length left after that) for as long as the
// value lives. Those buffers are never mutated (an `Rc` hands out no `&mut`), and their heap
// allocations do not move when `frames` grows (only the `Rc` pointers do). `iovecs` is only
// changed through `&mut self`, which the runtime does not hand out while it owns the value for
// a write.
unsafe impl monoio::buf::IoVecBuf for SharedFrames {
    fn read_iovec_ptr(&self) -> *const libc::iovec {
        self.iovecs[self.start..].as_ptr()
    }

    fn read_iovec_len(&self) -> usize {
        self.iovecs.len() - self.start
    }
}

/// The server binary's heap (`#[global_allocator]` in `main.rs`; the library installs none):
/// mimalloc, whose pages each hold blocks of one size, so what a burst of connecting clients
/// frees (their HTTP tasks) is not pinned by the idle sessions allocated among it, and goes
/// back to the system; with glibc's malloc the two share pages and the freed kilobyte a session
/// stays resident. Built with `no_thp`: mimalloc does not ask for transparent huge pages (a
/// 2 MiB page is resident for a few sessions' state: with THP on `madvise`, 2.96 KB a session
/// without the feature, 2.04 KB with it). A host with THP set to `always` may still back the
/// heap with them, glibc's as much as mimalloc's. `EVMESH_ALLOCATOR=system` takes the C library's
/// malloc instead (heaptrack, malloc uprobes, an `LD_PRELOAD`ed allocator): the choice is made
/// at the first allocation, before any thread starts, and never changes, so every block is
/// freed by the allocator that gave it.
pub struct Heap;

/// The variable that chooses the heap ([`Heap`]); the configuration's loader skips it.
pub const HEAP_VARIABLE: &std::ffi::CStr = c"EVMESH_ALLOCATOR";

/// 0: not chosen yet; 1: mimalloc; 2: the C library's.
static HEAP: std::sync::atomic::AtomicU8 = std::sync::atomic::AtomicU8::new(0);

impl Heap {
    #[inline]
    fn system() -> bool {
        match HEAP.load(std::sync::atomic::Ordering::Relaxed) {
            1 => false,
            2 => true,
            _ => Self::choose(),
        }
    }

    #[cold]
    fn choose() -> bool {
        // SAFETY: getenv allocates nothing and reads the environment, which no thread changes
        // while the first allocation is made (no thread but the main one runs yet).
        let v = unsafe { libc::getenv(HEAP_VARIABLE.as_ptr()) };
        // SAFETY: a non-null getenv result is a NUL-terminated string of the environment.
        let system = !v.is_null() && unsafe { std::ffi::CStr::from_ptr(v) } == c"system";
        HEAP.store(if system { 2 } else { 1 }, std::sync::atomic::Ordering::Relaxed);
        system
    }
}

/// Frees the calling thread's empty heap pages and returns them to the system (mimalloc holds
/// them otherwise until the thread allocates enough to collect on its own, which an idle
/// server never does: the memory a burst of connecting clients used would stay resident).
/// Forced (`mi_collect(true)`): without it, pages emptied since the last second (a broadcast's
/// per-session renderings, say) stay resident until a later pass, about 230 bytes per idle
/// session of 10,000 (perf/RESULTS.md); the pass costs nothing measurable once a second.
/// Called once a second on each runtime thread ([`crate::server::deadline`]).
/// Nothing when the process's heap is not [`Heap`] or is the C library's.
pub fn collect_heap() {
    if HEAP.load(std::sync::atomic::Ordering::Relaxed) == 1 {
        // SAFETY: mi_collect takes no pointer and only walks the calling thread's own heap.
        unsafe { libmimalloc_sys::mi_collect(true) }
    }
}

// SAFETY: each call is passed on unchanged to one of two allocators that uphold GlobalAlloc's
// contract, the same one for every call of the process (the choice never changes once made).
unsafe impl std::alloc::GlobalAlloc for Heap {
    #[inline]
    unsafe fn alloc(&self, layout: std::alloc::Layout) -> *mut u8 {
        match Self::system() {
            true => std::alloc::System.alloc(layout),
            false => mimalloc::MiMalloc.alloc(layout),
        }
    }

    #[inline]
    unsafe fn alloc_zeroed(&self, layout: std::alloc::Layout) -> *mut u8 {
        match Self::system() {
            true => std::alloc::System.alloc_zeroed(layout),
            false => mimalloc::MiMalloc.alloc_zeroed(layout),
        }
    }

    #[inline]
    unsafe fn dealloc(&self, ptr: *mut u8, layout: std::alloc::Layout) {
        match Self::system() {
            true => std::alloc::System.dealloc(ptr, layout),
            false => mimalloc::MiMalloc.dealloc(ptr, layout),
        }
    }

    #[inline]
    unsafe fn realloc(&self, ptr: *mut u8, layout: std::alloc::Layout, new_size: usize) -> *mut u8 {
        match Self::system() {
            true => std::alloc::System.realloc(ptr, layout, new_size),
            false => mimalloc::MiMalloc.realloc(ptr, layout, new_size),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frames(sizes: &[usize]) -> (SharedFrames, Vec<u8>) {
        let mut f = SharedFrames::default();
        let mut all = Vec::new();
        for (i, &n) in sizes.iter().enumerate() {
            let b: Vec<u8> = (0..n).map(|j| (i * 31 + j) as u8).collect();
            all.extend_from_slice(&b);
            f.push(Rc::new(b));
        }
        (f, all)
    }

    /// Every way of taking a batch in partial writes leaves exactly the rest, in order, with an
    /// iovec view that matches it.
    #[test]
    fn partial_writes_advance_the_iovecs_exactly() {
        let sizes = [5, 3, 0, 10, 1, 7];
        let (_, all) = frames(&sizes);
        for step in 1..=all.len() {
            let (mut f, _) = frames(&sizes);
            let mut written = 0;
            while f.bytes() > 0 {
                let n = step.min(f.bytes());
                f.advance(n);
                written += n;
                assert_eq!(f.unwritten(), &all[written..], "step {step} after {written}");
                let iov = &f.iovecs[f.start..];
                assert_eq!(iov.len(), monoio::buf::IoVecBuf::read_iovec_len(&f));
                assert_eq!(iov.iter().map(|v| v.iov_len).sum::<usize>(), f.bytes());
                if let Some(first) = iov.first() {
                    assert_eq!(first.iov_base as *const u8, f.frames[f.start][f.skip..].as_ptr());
                }
            }
            assert_eq!(written, all.len());
            assert_eq!(monoio::buf::IoVecBuf::read_iovec_len(&f), 0);
        }
    }
}
