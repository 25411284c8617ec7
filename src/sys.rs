//! The crate's `unsafe`, in one small module: the process signal mask (for `evmesh serve`'s
//! shutdown) and the iovec view of shared delivery buffers for vectored writes.

use std::rc::Rc;

/// Blocks SIGINT and SIGTERM in this thread and every thread it spawns later.
pub fn block_stop_signals() -> libc::sigset_t {
    // SAFETY: plain libc calls on a local, zero-initialized sigset.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        set
    }
}

/// Waits for one of the blocked stop signals and returns its number.
pub fn wait_for_signal(set: &libc::sigset_t) -> i32 {
    let mut sig = 0;
    // SAFETY: `set` was filled by `block_stop_signals`; `sig` is a valid out pointer.
    unsafe {
        libc::sigwait(set, &mut sig);
    }
    sig
}

/// Rendered frames, shared with other sessions, gathered for one `writev`: the bytes are
/// written from where they lie, never copied into a per-session buffer.
#[derive(Default)]
pub struct SharedFrames {
    frames: Vec<Rc<Vec<u8>>>,
    iovecs: Vec<libc::iovec>,
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

    pub fn len(&self) -> usize {
        self.frames.len()
    }

    pub fn is_empty(&self) -> bool {
        self.frames.is_empty()
    }

    pub fn bytes(&self) -> usize {
        self.bytes
    }

    pub fn clear(&mut self) {
        self.frames.clear();
        self.iovecs.clear();
        self.bytes = 0;
    }
}

// SAFETY: every iovec points into the heap buffer of an `Rc<Vec<u8>>` held in `frames` for as
// long as the value lives. Those buffers are never mutated (an `Rc` hands out no `&mut`), and
// their heap allocations do not move when `frames` grows (only the `Rc` pointers do). `iovecs`
// is only changed through `&mut self`, which the runtime does not hand out while it owns the
// value for a write.
unsafe impl monoio::buf::IoVecBuf for SharedFrames {
    fn read_iovec_ptr(&self) -> *const libc::iovec {
        self.iovecs.as_ptr()
    }

    fn read_iovec_len(&self) -> usize {
        self.iovecs.len()
    }
}
