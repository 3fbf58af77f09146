//! The libpmemobj functions tiermem uses and the C shim, loaded at run time.
//!
//! The build script compiles `src/shim.c` into a shared object that needs `libpmemobj.so.1`;
//! its bytes are embedded here, and [`lib`] loads it once (written to a memfd, `dlopen` of
//! `/proc/self/fd/N`) and resolves every function below through it. A process that never opens
//! a pool never loads libpmemobj; one on a machine without it gets an error naming the missing
//! library instead of failing to start.
//!
//! No transaction function is exposed: libpmemobj reports a failure inside a transaction by
//! `longjmp`ing to the `jmp_buf` given to `pmemobj_tx_begin`, which must never unwind Rust
//! frames. [`Lib::tm_pmdk_tx_write`] (through [`crate::Pool::transaction`]) runs the whole
//! transaction in C.

#![allow(non_camel_case_types)]

use libc::{c_char, c_int, c_void, mode_t, size_t};

/// An opaque libpmemobj pool handle.
#[repr(C)]
#[derive(Debug)]
pub struct PMEMobjpool {
    _private: [u8; 0],
}

/// A persistent object id: the pool's uuid (low bits) and the object's offset in the pool.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PMEMoid {
    /// Low 64 bits of the pool's uuid.
    pub pool_uuid_lo: u64,
    /// Offset of the object from the start of the pool (0 = OID_NULL).
    pub off: u64,
}

/// One write for [`tm_pmdk_tx_write`] (`struct tm_pmdk_write` in `shim.c`).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct TmWrite {
    /// Destination offset inside the object.
    pub off: u64,
    /// Source bytes.
    pub src: *const c_void,
    /// Number of bytes.
    pub len: size_t,
}

/// `TX_STAGE_NONE`: no transaction in progress on this thread.
pub const TX_STAGE_NONE: c_int = 0;
/// `TX_STAGE_WORK`: inside a transaction.
pub const TX_STAGE_WORK: c_int = 1;
/// `TX_STAGE_ONCOMMIT`: committed, not yet ended.
pub const TX_STAGE_ONCOMMIT: c_int = 2;
/// `TX_STAGE_ONABORT`: aborted (or failed to begin), not yet ended.
pub const TX_STAGE_ONABORT: c_int = 3;
/// `TX_STAGE_FINALLY`: ending.
pub const TX_STAGE_FINALLY: c_int = 4;

/// The shared object built from `src/shim.c` (linked against libpmemobj).
static SHIM_SO: &[u8] = include_bytes!(env!("TIERMEM_PMDK_SHIM_SO"));

/// The resolved functions: libpmemobj's (found through the shim's dependency) and the shim's.
#[derive(Debug)]
pub struct Lib {
    /// Create a pool file (`poolsize` 0: use an existing file's size).
    pub pmemobj_create: unsafe extern "C" fn(
        path: *const c_char,
        layout: *const c_char,
        poolsize: size_t,
        mode: mode_t,
    ) -> *mut PMEMobjpool,
    /// Open a pool file, checking its layout name.
    pub pmemobj_open:
        unsafe extern "C" fn(path: *const c_char, layout: *const c_char) -> *mut PMEMobjpool,
    /// Close a pool.
    pub pmemobj_close: unsafe extern "C" fn(pop: *mut PMEMobjpool),
    /// The root object, allocated (zeroed) or grown to `size` bytes if needed.
    pub pmemobj_root: unsafe extern "C" fn(pop: *mut PMEMobjpool, size: size_t) -> PMEMoid,
    /// Size of the root object (0 when none).
    pub pmemobj_root_size: unsafe extern "C" fn(pop: *mut PMEMobjpool) -> size_t,
    /// The address of an object of an open pool (the exported, non-inline version).
    pub pmemobj_direct: unsafe extern "C" fn(oid: PMEMoid) -> *mut c_void,
    /// libpmemobj's message for this thread's last error.
    pub pmemobj_errormsg: unsafe extern "C" fn() -> *const c_char,
    /// The shim (`src/shim.c`): one whole transaction of `n` writes into object `oid`; commits,
    /// or aborts when `abort_at_end` is non-zero. Returns 0 after a commit, else the error
    /// number.
    pub tm_pmdk_tx_write: unsafe extern "C" fn(
        pop: *mut PMEMobjpool,
        oid: PMEMoid,
        writes: *const TmWrite,
        n: size_t,
        abort_at_end: c_int,
    ) -> c_int,
    /// The shim's `pmemobj_tx_stage()`.
    pub tm_pmdk_tx_stage: unsafe extern "C" fn() -> c_int,
}

/// The loaded library, or why it could not be loaded (the same answer for the process's life).
pub fn lib() -> Result<&'static Lib, String> {
    static LIB: std::sync::OnceLock<Result<Lib, String>> = std::sync::OnceLock::new();
    LIB.get_or_init(load).as_ref().map_err(Clone::clone)
}

fn dlerror() -> String {
    // SAFETY: dlerror returns NULL or a NUL-terminated message valid until the next dl* call
    // of this thread; it is copied at once.
    unsafe {
        let p = libc::dlerror();
        if p.is_null() {
            "unknown error".into()
        } else {
            std::ffi::CStr::from_ptr(p).to_string_lossy().into_owned()
        }
    }
}

/// A function pointer (`F`, an `unsafe extern "C" fn` type) from a `dlsym` address.
///
/// # Safety
/// `p` must be the address of a function whose signature `F` spells.
unsafe fn fn_ptr<F: Copy>(p: *mut c_void) -> F {
    const { assert!(std::mem::size_of::<F>() == std::mem::size_of::<*mut c_void>()) };
    // SAFETY: same size (checked above); the caller vouches for the signature.
    unsafe { std::mem::transmute_copy(&p) }
}

fn load() -> Result<Lib, String> {
    use std::io::Write;
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    // SAFETY: memfd_create with a static NUL-terminated name; the result is checked.
    let fd = unsafe { libc::memfd_create(c"libtiermem_pmdk_shim.so".as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(format!(
            "memfd_create for the PMDK shim: {}",
            std::io::Error::last_os_error()
        ));
    }
    // SAFETY: fd was just created and is owned here alone.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let mut file = std::fs::File::from(fd);
    file.write_all(SHIM_SO)
        .map_err(|e| format!("writing the PMDK shim to a memfd: {e}"))?;
    let path = std::ffi::CString::new(format!("/proc/self/fd/{}", file.as_raw_fd()))
        .map_err(|e| e.to_string())?;
    // SAFETY: loads a shared object we built (its constructors and libpmemobj's run now);
    // the path is a valid C string.
    let h = unsafe { libc::dlopen(path.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
    if h.is_null() {
        return Err(format!(
            "loading PMDK's libpmemobj: {} (Debian/Ubuntu: apt-get install -y libpmemobj1; \
             scripts/setup.sh installs it)",
            dlerror()
        ));
    }
    // The mapping keeps the object; the descriptor is no longer needed.
    drop(file);
    macro_rules! sym {
        ($name:ident) => {{
            // SAFETY: h is a live handle (never closed); the name is a NUL-terminated literal.
            let p = unsafe { libc::dlsym(h, concat!(stringify!($name), "\0").as_ptr().cast()) };
            if p.is_null() {
                return Err(format!(
                    "PMDK shim: no symbol {}: {}",
                    stringify!($name),
                    dlerror()
                ));
            }
            // SAFETY: the symbol is the C function of that name, whose prototype the field's
            // type spells (from libpmemobj.h and src/shim.c).
            unsafe { fn_ptr(p) }
        }};
    }
    Ok(Lib {
        pmemobj_create: sym!(pmemobj_create),
        pmemobj_open: sym!(pmemobj_open),
        pmemobj_close: sym!(pmemobj_close),
        pmemobj_root: sym!(pmemobj_root),
        pmemobj_root_size: sym!(pmemobj_root_size),
        pmemobj_direct: sym!(pmemobj_direct),
        pmemobj_errormsg: sym!(pmemobj_errormsg),
        tm_pmdk_tx_write: sym!(tm_pmdk_tx_write),
        tm_pmdk_tx_stage: sym!(tm_pmdk_tx_stage),
    })
}
