//! Error reporting across the C ABI: negative errno-style codes plus a thread-local message.

use std::cell::RefCell;
use std::ffi::{c_char, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

/// Record `msg` as this thread's last error and return `-errno`.
pub(crate) fn fail(errno: i32, msg: impl std::fmt::Display) -> i32 {
    let text = CString::new(msg.to_string().replace('\0', "\\0")).unwrap_or_default();
    LAST_ERROR.with(|e| *e.borrow_mut() = text);
    -errno.abs()
}

/// Run `f`, turning panics into `-EIO` with the panic message as the last error.
pub(crate) fn guard(f: impl FnOnce() -> i32) -> i32 {
    // A panic leaves no half-updated state visible to C: the handle it was working on is still
    // owned by the caller and every media/fault object is internally consistent between calls.
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(code) => code,
        Err(p) => {
            let msg = p
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| p.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".into());
            fail(libc::EIO, format!("internal error (panic): {msg}"))
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

/// The message of the last error on the calling thread ("" if none). The pointer stays valid until
/// the next tiermem call on this thread.
#[no_mangle]
pub extern "C" fn tiermem_last_error() -> *const c_char {
    LAST_ERROR.with(|e| e.borrow().as_ptr())
}
