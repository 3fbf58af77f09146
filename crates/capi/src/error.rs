//! Error reporting across the C ABI: negative errno-style codes plus a thread-local message;
//! the one panic wrapper every exported function runs its body in ([`guard`]); the registry
//! of live handles that turns a closed or foreign handle into an error instead of a
//! use-after-free ([`handles`]).

use std::cell::RefCell;
use std::ffi::{c_char, c_void, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::OnceLock;

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

/// Record `msg` as this thread's last error and return `-errno`.
pub(crate) fn fail(errno: i32, msg: impl std::fmt::Display) -> i32 {
    let text = CString::new(msg.to_string().replace('\0', "\\0")).unwrap_or_default();
    LAST_ERROR.with(|e| *e.borrow_mut() = text);
    -errno.abs()
}

/// What an exported function returns when its body panicked (the message is in
/// `tiermem_last_error()`): `-EIO` for status codes, NULL for pointers, 0 for counts.
pub(crate) trait OnPanic {
    /// The value returned to C after a caught panic.
    fn on_panic() -> Self;
}

impl OnPanic for i32 {
    fn on_panic() -> Self {
        -libc::EIO
    }
}
impl OnPanic for i64 {
    fn on_panic() -> Self {
        -i64::from(libc::EIO)
    }
}
impl OnPanic for u64 {
    fn on_panic() -> Self {
        0
    }
}
impl OnPanic for usize {
    fn on_panic() -> Self {
        0
    }
}
impl OnPanic for () {
    fn on_panic() -> Self {}
}
impl OnPanic for *mut c_void {
    fn on_panic() -> Self {
        std::ptr::null_mut()
    }
}
impl OnPanic for *const c_char {
    fn on_panic() -> Self {
        c"".as_ptr()
    }
}
impl OnPanic for *const c_void {
    fn on_panic() -> Self {
        std::ptr::null()
    }
}

/// Test hook: `TIERMEM_CAPI_TEST_PANIC` (read once per process) is a comma-separated list of
/// exported function names whose bodies panic on entry, so tests can check that a panic is
/// contained. Unset in normal use: then the check is one load of a cached `None`.
fn panic_requested(name: &str) -> bool {
    static T: OnceLock<Option<String>> = OnceLock::new();
    T.get_or_init(|| std::env::var("TIERMEM_CAPI_TEST_PANIC").ok())
        .as_deref()
        .is_some_and(|list| list.split(',').any(|n| n.trim() == name))
}

/// Runs the body `f` of the exported function `name` so that no panic crosses the C ABI: a
/// panic is caught, its message becomes the thread's last error ("internal error (panic) in
/// NAME: …") and the function returns [`OnPanic::on_panic`] (`-EIO`, NULL, 0). Every
/// `extern "C"` function of this crate wraps its body in it.
pub(crate) fn guard<R: OnPanic>(name: &'static str, f: impl FnOnce() -> R) -> R {
    // A panic leaves no half-updated state visible to C: the handle it was working on is still
    // owned by the caller and every media/fault object is internally consistent between calls.
    let body = || {
        if panic_requested(name) {
            panic!("TIERMEM_CAPI_TEST_PANIC={name}: deliberate panic for testing");
        }
        f()
    };
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(r) => r,
        Err(p) => {
            let msg = p
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| p.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".into());
            fail(
                libc::EIO,
                format!("internal error (panic) in {name}: {msg}"),
            );
            R::on_panic()
        }
    }
}

/// Turn a C string argument into `&str`, or fail with `-EINVAL` naming the argument.
pub(crate) fn cstr<'a>(p: *const c_char, what: &str) -> Result<&'a str, i32> {
    if p.is_null() {
        return Err(fail(libc::EINVAL, format!("{what} is NULL")));
    }
    // SAFETY: the caller passes a NUL-terminated string that outlives this call (ABI contract).
    unsafe { std::ffi::CStr::from_ptr(p) }
        .to_str()
        .map_err(|_| fail(libc::EINVAL, format!("{what} is not valid UTF-8")))
}

/// Live handles (opaque pointers handed to C) by type: a handle is checked against this set
/// before it is dereferenced, so a NULL, closed, or never-issued handle (or one of another
/// type) is an `EBADF`/`EINVAL` error, not undefined behaviour. A closed handle whose address
/// is reused by a new handle of the same type cannot be told apart from it (it then refers to
/// the new object). Closing a handle while another thread uses it stays a caller error.
pub(crate) mod handles {
    use super::fail;
    use std::any::TypeId;
    use std::collections::HashSet;
    use std::sync::RwLock;

    static LIVE: RwLock<Option<HashSet<(usize, TypeId)>>> = RwLock::new(None);

    /// Boxes `v` and registers the pointer as a live handle.
    pub(crate) fn issue<T: 'static>(v: T) -> *mut T {
        let p = Box::into_raw(Box::new(v));
        LIVE.write()
            .unwrap_or_else(|e| e.into_inner())
            .get_or_insert_with(HashSet::new)
            .insert((p as usize, TypeId::of::<T>()));
        p
    }

    fn live<T: 'static>(p: *const T) -> bool {
        LIVE.read()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .is_some_and(|s| s.contains(&(p as usize, TypeId::of::<T>())))
    }

    fn check<T: 'static>(p: *const T, what: &str) -> Result<(), i32> {
        if p.is_null() {
            return Err(fail(libc::EINVAL, format!("{what} handle is NULL")));
        }
        if !live(p) {
            return Err(fail(
                libc::EBADF,
                format!("{what} handle {p:p} is not open (already closed, or not a {what} handle)"),
            ));
        }
        Ok(())
    }

    /// Borrows a live handle.
    pub(crate) fn get<'a, T: 'static>(p: *const T, what: &str) -> Result<&'a T, i32> {
        check(p, what)?;
        // SAFETY: `p` is registered, so it came from `issue::<T>` and was not `take`n: a live
        // Box<T>. It stays alive until the caller closes it, which must not race this use
        // (ABI contract).
        Ok(unsafe { &*p })
    }

    /// Borrows a live handle mutably (the caller uses a handle from one thread at a time).
    pub(crate) fn get_mut<'a, T: 'static>(p: *mut T, what: &str) -> Result<&'a mut T, i32> {
        check(p, what)?;
        // SAFETY: as in `get`; exclusive use of the handle during the call is the ABI contract.
        Ok(unsafe { &mut *p })
    }

    /// Unregisters a live handle and returns its box (closing it).
    pub(crate) fn take<T: 'static>(p: *mut T, what: &str) -> Result<Box<T>, i32> {
        if p.is_null() {
            return Err(fail(libc::EINVAL, format!("{what} handle is NULL")));
        }
        let removed = LIVE
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .as_mut()
            .is_some_and(|s| s.remove(&(p as usize, TypeId::of::<T>())));
        if !removed {
            return Err(fail(
                libc::EBADF,
                format!("{what} handle {p:p} is not open (already closed, or not a {what} handle)"),
            ));
        }
        // SAFETY: it was registered by `issue::<T>` (a Box<T>) and is now unregistered, so
        // this is the only `from_raw` of it.
        Ok(unsafe { Box::from_raw(p) })
    }
}

/// The message of the last error on the calling thread ("" if none). The pointer stays valid until
/// the next tiermem call on this thread.
#[no_mangle]
pub extern "C" fn tiermem_last_error() -> *const c_char {
    // Not through `guard`: its panic path writes the last error. `borrow` cannot fail (no
    // borrow of LAST_ERROR outlives a call) and `with` fails only during thread teardown, when
    // C code cannot call in.
    LAST_ERROR.with(|e| e.borrow().as_ptr())
}
