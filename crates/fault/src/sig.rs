//! Signal-handler plumbing shared by in-thread resolution (SIGBUS) and the mprotect tracker
//! (SIGSEGV): installation once per signal, chaining to the previously installed handler for
//! addresses that are not ours, and an allocation-free stderr writer for signal context.

use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};

/// A signal handler with `SA_SIGINFO` signature.
pub type SigHandler = extern "C" fn(i32, *mut libc::siginfo_t, *mut libc::c_void);

/// One installed handler and the disposition it replaced.
///
/// The replaced disposition can itself be replaced later ([`Chain::replace_prev`]): a program
/// that installs its own handler for the signal after us (redis-server's SIGBUS handler under
/// the pager's shim) gets it chained behind ours instead of displacing ours. It is kept in two
/// slots; a writer fills the one not in use and flips `cur`, so a handler reading it never sees
/// a half-written one (writers are serialised; a handler is never a writer).
pub struct Chain {
    /// 0 = not installed, 1 = installing, 2 = installed (previous disposition is valid).
    state: AtomicU8,
    prev: [UnsafeCell<libc::sigaction>; 2],
    /// The slot of `prev` in use.
    cur: AtomicU8,
    /// Held by a [`Chain::replace_prev`] writer.
    writing: AtomicBool,
}

// SAFETY: the slot in use is written only before `state` becomes 2 (Release) or, afterwards,
// while it is not in use (a writer fills the other slot, then publishes it with a Release store
// of `cur`); readers read the slot `cur` names after an Acquire load.
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
            prev: unsafe {
                [
                    UnsafeCell::new(std::mem::zeroed()),
                    UnsafeCell::new(std::mem::zeroed()),
                ]
            },
            cur: AtomicU8::new(0),
            writing: AtomicBool::new(false),
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
        let r = unsafe { libc::sigaction(sig, &sa, self.prev[0].get()) };
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
        // SAFETY: the slot `cur` names is not written while in use (see `Chain`); a copy.
        let prev = unsafe { *self.prev[self.cur.load(Ordering::Acquire) as usize & 1].get() };
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

impl Chain {
    /// Whether our handler is installed.
    pub fn installed(&self) -> bool {
        self.state.load(Ordering::Acquire) == 2
    }

    /// What a program's `sigaction(sig, act, oldact)` does while our handler is installed: the
    /// disposition behind ours becomes `*act` (when not NULL) and `*oldact` (when not NULL)
    /// gets the one it replaces — the program sees the signal as if it owned it, and signals
    /// that are not ours reach its handler. Returns false (nothing done) when our handler is
    /// not installed: the caller then performs the real `sigaction`. Not async-signal-safe
    /// against itself (writers spin on each other); never called from our handlers.
    ///
    /// # Safety
    /// `act` and `oldact` are NULL or valid, as for `sigaction(2)`.
    pub unsafe fn replace_prev(
        &self,
        act: *const libc::sigaction,
        oldact: *mut libc::sigaction,
    ) -> bool {
        if !self.installed() {
            return false;
        }
        while self
            .writing
            .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            std::thread::yield_now();
        }
        let cur = self.cur.load(Ordering::Acquire) as usize & 1;
        // SAFETY: the slot in use is only read; a copy.
        let old = unsafe { *self.prev[cur].get() };
        if !act.is_null() {
            // SAFETY: the other slot is not in use and we are the only writer; act is valid.
            unsafe { *self.prev[cur ^ 1].get() = *act };
            self.cur.store((cur ^ 1) as u8, Ordering::Release);
        }
        self.writing.store(false, Ordering::Release);
        if !oldact.is_null() {
            // SAFETY: valid per the contract.
            unsafe { *oldact = old };
        }
        true
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

/// The kernel's `struct sigaction` (x86-64 and aarch64 layout without the restorer's use).
#[repr(C)]
struct KernelSigaction {
    handler: usize,
    flags: u64,
    restorer: usize,
    mask: u64,
}

/// Restores `SIG_DFL` for `sig` with the raw system call, so a `sigaction` interposed by a
/// preload library (the pager's shim chains a program's SIGBUS handler behind ours) cannot
/// turn it into a change of the chained disposition. Async-signal-safe.
pub(crate) fn reset_default(sig: i32) {
    let sa = KernelSigaction {
        handler: libc::SIG_DFL,
        flags: 0,
        restorer: 0,
        mask: 0,
    };
    // SAFETY: rt_sigaction with a valid kernel sigaction and the kernel's sigset size (8).
    unsafe {
        libc::syscall(
            libc::SYS_rt_sigaction,
            sig,
            &sa as *const KernelSigaction,
            std::ptr::null_mut::<KernelSigaction>(),
            8usize,
        )
    };
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    static CHAIN: Chain = Chain::new();
    static OURS: AtomicUsize = AtomicUsize::new(0);
    static THEIRS: AtomicUsize = AtomicUsize::new(0);

    extern "C" fn ours(sig: i32, info: *mut libc::siginfo_t, uctx: *mut libc::c_void) {
        OURS.fetch_add(1, Ordering::SeqCst);
        CHAIN.forward(sig, info, uctx);
    }

    extern "C" fn theirs(_: i32) {
        THEIRS.fetch_add(1, Ordering::SeqCst);
    }

    #[test]
    fn a_handler_installed_after_ours_is_chained_behind_it() {
        let sig = libc::SIGUSR2;
        // SAFETY: sigaction is plain old data.
        let mut act: libc::sigaction = unsafe { std::mem::zeroed() };
        act.sa_sigaction = theirs as *const () as usize;
        // Before ours is installed nothing is interposed.
        // SAFETY: valid pointers.
        assert!(!unsafe { CHAIN.replace_prev(&act, std::ptr::null_mut()) });
        CHAIN.install(sig, ours, 0).unwrap();
        // SAFETY: sigaction is plain old data.
        let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
        // SAFETY: valid pointers.
        assert!(unsafe { CHAIN.replace_prev(&act, &mut old) });
        assert_eq!(
            old.sa_sigaction,
            libc::SIG_DFL,
            "the program sees what it replaced"
        );
        // SAFETY: raising a signal whose handlers are ours and theirs.
        unsafe { libc::raise(sig) };
        assert_eq!(OURS.load(Ordering::SeqCst), 1);
        assert_eq!(
            THEIRS.load(Ordering::SeqCst),
            1,
            "forwarded to the chained handler"
        );
        // Asking without changing returns theirs.
        // SAFETY: valid pointers.
        assert!(unsafe { CHAIN.replace_prev(std::ptr::null(), &mut old) });
        assert_eq!(old.sa_sigaction, theirs as *const () as usize);
        // The kernel still runs ours.
        // SAFETY: querying the disposition.
        let mut k: libc::sigaction = unsafe { std::mem::zeroed() };
        // SAFETY: valid pointers.
        unsafe { libc::sigaction(sig, std::ptr::null(), &mut k) };
        assert_eq!(k.sa_sigaction, ours as *const () as usize);
    }
}
