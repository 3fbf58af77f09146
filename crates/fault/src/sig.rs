//! Signal-handler plumbing shared by in-thread resolution (SIGBUS) and the mprotect tracker
//! (SIGSEGV): installation once per signal, chaining to the previously installed handler for
//! addresses that are not ours, and an allocation-free stderr writer for signal context.

use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicU8, Ordering};

/// A signal handler with `SA_SIGINFO` signature.
pub type SigHandler = extern "C" fn(i32, *mut libc::siginfo_t, *mut libc::c_void);

/// One installed handler and the disposition it replaced.
pub struct Chain {
    /// 0 = not installed, 1 = installing, 2 = installed (previous disposition is valid).
    state: AtomicU8,
    prev: UnsafeCell<libc::sigaction>,
}

// SAFETY: `prev` is written once, before `state` becomes 2 (Release), and only read after
// observing state == 2 (Acquire); afterwards it is immutable.
unsafe impl Sync for Chain {}

impl Default for Chain {
    fn default() -> Self {
        Chain::new()
    }
}

impl Chain {
    /// A chain slot with nothing installed.
    pub const fn new() -> Chain {
        Chain {
            state: AtomicU8::new(0),
            // SAFETY: sigaction is plain old data; all-zero is a valid (SIG_DFL) value.
            prev: UnsafeCell::new(unsafe { std::mem::zeroed() }),
        }
    }

    /// Installs `handler` for `sig` with `flags` (plus `SA_SIGINFO`) once per process; later
    /// calls do nothing. Returns an error message naming sigaction on failure.
    pub fn install(&self, sig: i32, handler: SigHandler, flags: i32) -> Result<(), i32> {
        if self.state.load(Ordering::Acquire) == 2 {
            return Ok(());
        }
        // Serialise installers: spin while another thread installs.
        loop {
            match self
                .state
                .compare_exchange(0, 1, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => break,
                Err(2) => return Ok(()),
                Err(_) => std::thread::yield_now(),
            }
        }
        // SAFETY: sigaction is plain old data; we fill the fields we need.
        let mut sa: libc::sigaction = unsafe { std::mem::zeroed() };
        sa.sa_sigaction = handler as usize;
        sa.sa_flags = libc::SA_SIGINFO | flags;
        // SAFETY: sa.sa_mask is a valid sigset_t to initialise.
        unsafe { libc::sigemptyset(&mut sa.sa_mask) };
        // SAFETY: we are the only writer of prev (state == 1); sa and prev are valid pointers.
        let r = unsafe { libc::sigaction(sig, &sa, self.prev.get()) };
        if r < 0 {
            let e = crate::sys::errno();
            self.state.store(0, Ordering::Release);
            return Err(e);
        }
        self.state.store(2, Ordering::Release);
        Ok(())
    }

    /// Passes a signal that is not ours to the previous disposition. Async-signal-safe.
    ///
    /// * previous `SA_SIGINFO` handler → called with the same arguments;
    /// * previous plain handler → called with the signal number;
    /// * `SIG_DFL` / `SIG_IGN` → the default disposition is restored, so that a synchronous
    ///   fault re-raises when the instruction restarts and kills the process as it would have
    ///   without us; a signal sent by `kill` is re-raised explicitly.
    pub fn forward(&self, sig: i32, info: *mut libc::siginfo_t, uctx: *mut libc::c_void) {
        if self.state.load(Ordering::Acquire) != 2 {
            reset_default_and_reraise(sig, info);
            return;
        }
        // SAFETY: prev is immutable once state == 2.
        let prev = unsafe { &*self.prev.get() };
        let h = prev.sa_sigaction;
        if h == libc::SIG_DFL || h == libc::SIG_IGN {
            reset_default_and_reraise(sig, info);
        } else if prev.sa_flags & libc::SA_SIGINFO != 0 {
            // SAFETY: the previous owner installed this as an SA_SIGINFO handler.
            let f: SigHandler = unsafe { std::mem::transmute::<usize, SigHandler>(h) };
            f(sig, info, uctx);
        } else {
            // SAFETY: the previous owner installed this as a plain handler.
            let f: extern "C" fn(i32) =
                unsafe { std::mem::transmute::<usize, extern "C" fn(i32)>(h) };
            f(sig);
        }
    }
}

/// Restores `SIG_DFL` for `sig`; if the signal was sent by a process (not a fault), re-raise it.
/// A fault re-raises by itself when the handler returns and the instruction restarts.
/// Async-signal-safe.
pub(crate) fn reset_default_and_reraise(sig: i32, info: *mut libc::siginfo_t) {
    reset_default(sig);
    // SAFETY: info is the kernel-provided siginfo of the current signal.
    let code = if info.is_null() {
        0
    } else {
        unsafe { (*info).si_code }
    };
    if code <= 0 {
        // SAFETY: raise is async-signal-safe.
        unsafe { libc::raise(sig) };
    }
}

/// Restores `SIG_DFL` for `sig`. Async-signal-safe.
pub(crate) fn reset_default(sig: i32) {
    // SAFETY: sigaction is plain old data; zeroed = SIG_DFL with an empty mask.
    let mut sa: libc::sigaction = unsafe { std::mem::zeroed() };
    sa.sa_sigaction = libc::SIG_DFL;
    // SAFETY: valid pointers; sigaction is async-signal-safe.
    unsafe { libc::sigaction(sig, &sa, std::ptr::null_mut()) };
}

/// A fixed-size stack buffer implementing `fmt::Write`, for allocation-free messages in signal
/// context.
pub(crate) struct StackBuf {
    buf: [u8; 512],
    len: usize,
}

impl StackBuf {
    /// An empty buffer.
    pub(crate) fn new() -> StackBuf {
        StackBuf {
            buf: [0; 512],
            len: 0,
        }
    }
    /// Writes the buffer to stderr with write(2). Async-signal-safe.
    pub(crate) fn flush_stderr(&self) {
        // SAFETY: buf[..len] is initialised; write(2) is async-signal-safe.
        unsafe { libc::write(2, self.buf.as_ptr() as *const libc::c_void, self.len) };
    }
}

impl std::fmt::Write for StackBuf {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        let n = s.len().min(self.buf.len() - self.len);
        self.buf[self.len..self.len + n].copy_from_slice(&s.as_bytes()[..n]);
        self.len += n;
        Ok(())
    }
}
