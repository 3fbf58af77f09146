//! Which threads are running tiermem code: the engine's runtime thread, the threads other
//! crates start with [`spawn_library_thread`], and any thread while it resolves a fault in its
//! `SIGBUS` handler. An `LD_PRELOAD` library that interposes the malloc family asks
//! [`in_library`] to keep these calls away from the program's own allocator: a program thread
//! holding one of that allocator's locks may be the very thread the fault engine is serving
//! (or one waiting for it, in `madvise` until the engine reads a `REMOVE` event), and a call
//! into the allocator from here would then wait for it for good.

use std::cell::Cell;
use std::sync::atomic::{AtomicUsize, Ordering};

thread_local! {
    /// Library scopes this thread is in (a const, drop-free thread local: plain TLS access,
    /// async-signal-safe, no allocation on first use).
    static DEPTH: Cell<u32> = const { Cell::new(0) };
}

/// Library threads being started: `std` runs code of its own in a new thread before the
/// thread's function (it registers a thread-local destructor, which calls glibc's `calloc`),
/// and that code cannot be marked; while any is starting, every thread counts as in the library
/// (a few microseconds; an interposer serving a program's call as the library's must then
/// recognise such blocks wherever they are freed).
static STARTING: AtomicUsize = AtomicUsize::new(0);

/// Whether the calling thread runs tiermem code now (true when its thread locals are gone, and
/// for every thread while a library thread starts).
#[inline]
pub fn in_library() -> bool {
    STARTING.load(Ordering::Acquire) > 0 || DEPTH.try_with(|d| d.get() > 0).unwrap_or(true)
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

/// `std::thread::Builder::spawn` of a named thread that runs tiermem code all its life.
pub fn spawn_library_thread<F, T>(name: &str, f: F) -> std::io::Result<std::thread::JoinHandle<T>>
where
    F: FnOnce() -> T + Send + 'static,
    T: Send + 'static,
{
    STARTING.fetch_add(1, Ordering::AcqRel);
    let r = std::thread::Builder::new()
        .name(name.into())
        .spawn(move || {
            let _scope = LibraryScope::enter();
            STARTING.fetch_sub(1, Ordering::AcqRel);
            f()
        });
    if r.is_err() {
        STARTING.fetch_sub(1, Ordering::AcqRel);
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    fn depth() -> u32 {
        DEPTH.with(|d| d.get())
    }

    #[test]
    fn scopes_nest_and_library_threads_are_in_one() {
        // Depth, not `in_library`: other tests may be starting library threads meanwhile.
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
    }
}
