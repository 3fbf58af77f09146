//! Which threads are running tiermem code: the engine's runtime thread, the threads other
//! crates start with [`spawn_library_thread`] (from their first instruction), and any thread
//! while it resolves a fault in its `SIGBUS` handler. An `LD_PRELOAD` library that interposes the malloc family asks
//! [`in_library`] to keep these calls away from the program's own allocator: a program thread
//! holding one of that allocator's locks may be the very thread the fault engine is serving
//! (or one waiting for it, in `madvise` until the engine reads a `REMOVE` event), and a call
//! into the allocator from here would then wait for it for good.

use std::cell::Cell;
use std::ffi::{c_void, CString};
use std::sync::{Arc, Mutex};

thread_local! {
    /// Library scopes this thread is in (a const, drop-free thread local: plain TLS access,
    /// async-signal-safe, no allocation on first use).
    static DEPTH: Cell<u32> = const { Cell::new(0) };
}

/// Whether the calling thread runs tiermem code now (true when its thread locals are gone).
#[inline]
pub fn in_library() -> bool {
    DEPTH.try_with(|d| d.get() > 0).unwrap_or(true)
}

/// Marks the calling thread as running tiermem code until dropped (scopes nest).
pub struct LibraryScope(());

impl LibraryScope {
    /// Enters a scope.
    #[inline]
    pub fn enter() -> LibraryScope {
        let _ = DEPTH.try_with(|d| d.set(d.get() + 1));
        LibraryScope(())
    }
}

impl Drop for LibraryScope {
    #[inline]
    fn drop(&mut self) {
        let _ = DEPTH.try_with(|d| d.set(d.get().saturating_sub(1)));
    }
}

/// A thread started by [`spawn_library_thread`]: [`LibraryThread::join`] waits for it and
/// returns what it returned; dropped unjoined, it is detached.
pub struct LibraryThread<T> {
    tid: libc::pthread_t,
    result: Arc<Mutex<Option<std::thread::Result<T>>>>,
    joined: bool,
}

impl<T> LibraryThread<T> {
    /// Waits for the thread to end; `Err` holds its panic.
    pub fn join(mut self) -> std::thread::Result<T> {
        self.joined = true;
        // SAFETY: a joinable thread of ours, joined once (`joined` stops Drop's detach).
        unsafe { libc::pthread_join(self.tid, std::ptr::null_mut()) };
        let r = self.result.lock().unwrap_or_else(|e| e.into_inner()).take();
        r.unwrap_or_else(|| Err(Box::new("the library thread left no result")))
    }
}

impl<T> Drop for LibraryThread<T> {
    fn drop(&mut self) {
        if !self.joined {
            // SAFETY: a joinable thread of ours, never joined.
            unsafe { libc::pthread_detach(self.tid) };
        }
    }
}

/// What a new library thread runs: its name and its function.
struct Start {
    name: CString,
    f: Box<dyn FnOnce() + Send>,
}

extern "C" fn library_thread_main(arg: *mut c_void) -> *mut c_void {
    // First of all, before any code of `std` runs on this thread (its first thread-local
    // destructor registration calls glibc's `calloc`): the scope.
    let _scope = LibraryScope::enter();
    // SAFETY: `arg` is the Box<Start> spawn_library_thread leaked for this thread, taken once.
    let start = unsafe { Box::from_raw(arg as *mut Start) };
    // SAFETY: naming this thread with a NUL-terminated name (truncated by the kernel at 15).
    unsafe { libc::pthread_setname_np(libc::pthread_self(), start.name.as_ptr()) };
    (start.f)();
    std::ptr::null_mut()
}

/// Starts a named thread that runs tiermem code all its life: it is in a [`LibraryScope`]
/// from its first instruction on, which `std::thread::spawn` cannot give (`std` runs code of
/// its own in a new thread before the thread's function, and that code allocates through the
/// malloc family an interposer sees).
pub fn spawn_library_thread<F, T>(name: &str, f: F) -> std::io::Result<LibraryThread<T>>
where
    F: FnOnce() -> T + Send + 'static,
    T: Send + 'static,
{
    let result = Arc::new(Mutex::new(None));
    let slot = result.clone();
    let body: Box<dyn FnOnce() + Send> = Box::new(move || {
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
        *slot.lock().unwrap_or_else(|e| e.into_inner()) = Some(r);
    });
    let name = CString::new(name.replace('\0', " ")).unwrap_or_default();
    let start = Box::into_raw(Box::new(Start { name, f: body }));
    // SAFETY: pthread_t is plain data, filled by pthread_create.
    let mut tid: libc::pthread_t = unsafe { std::mem::zeroed() };
    // SAFETY: default attributes; the thread takes ownership of `start`.
    let e = unsafe {
        libc::pthread_create(
            &mut tid,
            std::ptr::null(),
            library_thread_main,
            start as *mut c_void,
        )
    };
    if e != 0 {
        // SAFETY: the thread did not start: `start` is still ours.
        drop(unsafe { Box::from_raw(start) });
        return Err(std::io::Error::from_raw_os_error(e));
    }
    Ok(LibraryThread {
        tid,
        result,
        joined: false,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn depth() -> u32 {
        DEPTH.with(|d| d.get())
    }

    #[test]
    fn scopes_nest_and_library_threads_are_in_one() {
        assert_eq!(depth(), 0);
        {
            let _a = LibraryScope::enter();
            let b = LibraryScope::enter();
            drop(b);
            assert_eq!(depth(), 1);
            assert!(in_library());
        }
        assert_eq!(depth(), 0);
        let t = spawn_library_thread("t", || (depth(), in_library())).unwrap();
        assert_eq!(t.join().unwrap(), (1, true));
        assert!(!in_library());
        // A panic comes back from join; a thread dropped unjoined is detached.
        let p = spawn_library_thread("p", || -> u32 { panic!("boom") }).unwrap();
        assert!(p.join().is_err());
        drop(spawn_library_thread("d", || 1).unwrap());
    }
}
