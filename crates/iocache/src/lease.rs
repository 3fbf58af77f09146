//! Read leases for z-READ: the watcher thread that hears a lease break and makes the file's
//! zero-copy views and buffers private before the writer or truncater may proceed.
//!
//! `F_SETLEASE F_RDLCK` succeeds only while nobody has the file open for writing; the kernel
//! then holds back any `open(O_WRONLY|O_RDWR)` or `truncate` of it (for up to
//! `/proc/sys/fs/lease-break-time` seconds) and signals the lease holder. The signal is
//! directed (`F_SETOWN_EX`, `F_OWNER_TID`) at one watcher thread that keeps it blocked and takes
//! it with `sigwaitinfo`, so the application's own signal handling never sees it and the thread
//! costs nothing until a break. On a break the watcher calls the file's break hook (privatise,
//! release) and forgets it.

use std::collections::HashMap;
use std::os::fd::RawFd;
use std::sync::{Mutex, Weak};

/// What the watcher calls when a lease of a registered fd breaks.
pub trait OnBreak: Send + Sync {
    /// Privatise whatever shares the file's pages, then release the lease.
    fn lease_broken(&self);
}

struct Watcher {
    pid: u32,
    tid: libc::pid_t,
    files: Mutex<HashMap<RawFd, Weak<dyn OnBreak>>>,
}

/// The watcher of this process. A child made by `fork` inherits the parent's record but not
/// its thread: it starts its own (the record is replaced, the parent's is leaked).
static WATCHER: Mutex<Option<&'static Watcher>> = Mutex::new(None);

/// The signal that carries lease breaks to the watcher (`SIGRTMIN + 5`; blocked in the watcher,
/// never delivered to another thread).
pub fn signal() -> libc::c_int {
    libc::SIGRTMIN() + 5
}

fn watcher() -> Option<&'static Watcher> {
    let mut w = WATCHER.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(w) = *w {
        if w.pid == std::process::id() {
            return Some(w);
        }
    }
    let (tx, rx) = std::sync::mpsc::channel();
    let spawned = std::thread::Builder::new()
        .name("tiermem-zread-lease".into())
        .spawn(move || {
            // SAFETY: sigset_t is plain old data, filled by sigemptyset/sigaddset.
            let mut set: libc::sigset_t = unsafe { std::mem::zeroed() };
            // SAFETY: valid sigset pointer; blocking one signal in this thread only.
            let ok = unsafe {
                libc::sigemptyset(&mut set);
                libc::sigaddset(&mut set, signal());
                libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) == 0
            };
            // SAFETY: gettid has no preconditions.
            let tid = unsafe { libc::gettid() };
            let _ = tx.send(if ok { Some(tid) } else { None });
            if !ok {
                return;
            }
            loop {
                // SAFETY: siginfo_t is plain old data for sigwaitinfo to fill.
                let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
                // SAFETY: valid set and out-pointer.
                let sig = unsafe { libc::sigwaitinfo(&set, &mut info) };
                if sig < 0 {
                    continue;
                }
                // si_fd sits right after si_band in the SIGPOLL member of the union:
                // si_signo, si_errno, si_code (3 ints, padded to 16 bytes), si_band (long),
                // si_fd (int).
                // SAFETY: reading a plain field at its uapi offset in siginfo_t.
                let fd = unsafe {
                    let p = (&info as *const libc::siginfo_t).cast::<u8>();
                    std::ptr::read_unaligned(p.add(24).cast::<libc::c_int>())
                };
                dispatch(fd);
            }
        });
    if spawned.is_err() {
        return None;
    }
    let tid = rx.recv().ok().flatten()?;
    let new: &'static Watcher = Box::leak(Box::new(Watcher {
        pid: std::process::id(),
        tid,
        files: Mutex::new(HashMap::new()),
    }));
    *w = Some(new);
    Some(new)
}

fn current() -> Option<&'static Watcher> {
    let w = *WATCHER.lock().unwrap_or_else(|e| e.into_inner());
    w.filter(|w| w.pid == std::process::id())
}

fn dispatch(fd: RawFd) {
    let Some(w) = current() else {
        return;
    };
    let hook = w
        .files
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get(&fd)
        .and_then(|h| h.upgrade());
    if let Some(h) = hook {
        h.lease_broken();
    } else {
        // Not ours any more (closed and reused?): release whatever lease the fd holds.
        let _ = crate::sys::release_lease(fd);
    }
}

/// Takes a read lease on `fd` (an `O_RDONLY` file description) whose break calls `hook`.
/// Fails with `EAGAIN` while the file is open for writing anywhere.
pub fn take(fd: RawFd, hook: Weak<dyn OnBreak>) -> std::io::Result<()> {
    let w =
        watcher().ok_or_else(|| std::io::Error::other("the lease watcher thread did not start"))?;
    w.files
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(fd, hook);
    crate::sys::take_read_lease(fd, signal(), w.tid)
}

/// Forgets `fd` (before it is closed) and releases its lease. In a child made by `fork` that
/// never took a lease itself, nothing is released: the lease (of the open file description
/// both share) is the parent's.
pub fn forget(fd: RawFd) {
    let Some(w) = current() else {
        return;
    };
    w.files
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .remove(&fd);
    let _ = crate::sys::release_lease(fd);
}
