//! Safe Rust wrapper over PMDK's **libpmemobj** (Debian's `libpmemobj-dev`, PMDK 1.12), for
//! baselines: a pool, its root object and whole undo-log transactions.
//!
//! ```no_run
//! use tiermem_pmdk::Pool;
//! let mut pool = Pool::create("/dev/shm/demo.pool".as_ref(), "demo", 64 << 20, 1 << 20)?;
//! pool.transaction(&[(0, b"hello"), (4096, b"world")])?;   // durable when it returns
//! assert_eq!(&pool.as_slice()[..5], b"hello");
//! # Ok::<(), tiermem_pmdk::PmdkError>(())
//! ```
//!
//! * A transaction is one call: [`Pool::transaction`] hands the whole list of writes to a small C
//!   shim (`src/shim.c`) that runs `TX_BEGIN` / `pmemobj_tx_add_range` + `memcpy` per write /
//!   `TX_END`. libpmemobj aborts with `longjmp`, which must never cross Rust frames; the shim
//!   keeps every `setjmp`/`longjmp` inside C and returns an error number.
//! * On tmpfs (`/dev/shm`) libpmemobj believes the memory is not persistent and `msync`s every
//!   flush, which makes it several times slower than on real persistent memory. Set
//!   `PMEM_IS_PMEM_FORCE=1` ([`force_pmem`]) before the first pool is created to get the
//!   cache-flush path a DAX mount would use.
//! * The root object is mapped memory shared with the file: [`Pool::as_slice`] is valid as long
//!   as no other process writes the pool file (the usual `mmap` caveat).

#![warn(missing_docs)]

use std::ffi::{CStr, CString};
use std::path::{Path, PathBuf};
use std::ptr::NonNull;

pub mod sys;

/// Environment variable libpmem reads (once, at the first pool) to treat every mapping as
/// persistent memory (`1`) or as never persistent (`0`).
pub const PMEM_IS_PMEM_FORCE: &str = "PMEM_IS_PMEM_FORCE";

/// The libpmemobj version this crate was compiled against (from pkg-config).
pub const LIBPMEMOBJ_VERSION: &str = env!("TIERMEM_LIBPMEMOBJ_VERSION");

/// Smallest pool libpmemobj accepts (`PMEMOBJ_MIN_POOL`).
pub const MIN_POOL_SIZE: u64 = 8 << 20;

/// An error from libpmemobj or from a bounds check of this wrapper.
#[derive(Debug, thiserror::Error)]
pub enum PmdkError {
    /// A libpmemobj call failed; `msg` is `pmemobj_errormsg()`.
    #[error("{op} {path}: {msg} (errno {errno})")]
    Call {
        /// The libpmemobj function that failed.
        op: &'static str,
        /// The pool file.
        path: PathBuf,
        /// `errno` after the call.
        errno: i32,
        /// libpmemobj's own message.
        msg: String,
    },
    /// A transaction was aborted (by libpmemobj or on request); the object is unchanged.
    #[error("transaction on {path} aborted: {msg} (errno {errno})")]
    Aborted {
        /// The pool file.
        path: PathBuf,
        /// The transaction's error number (`ECANCELED` for a requested abort).
        errno: i32,
        /// libpmemobj's message, or the errno's description.
        msg: String,
    },
    /// A write or read reaches outside the root object.
    #[error("{len} bytes at offset {offset} are outside the root object ({root_len} bytes)")]
    OutOfBounds {
        /// Start of the access.
        offset: usize,
        /// Length of the access.
        len: usize,
        /// Size of the root object.
        root_len: usize,
    },
    /// libpmemobj (or the shim built against it) could not be loaded.
    #[error("{0}")]
    Load(String),
    /// An argument libpmemobj cannot take (a path or layout with a NUL byte, a zero root size).
    #[error("invalid argument: {0}")]
    Invalid(String),
}

/// Result type of this crate.
pub type Result<T> = std::result::Result<T, PmdkError>;

/// Set `PMEM_IS_PMEM_FORCE=1` in this process's environment, so that libpmemobj flushes with
/// cache-line flushes instead of `msync` on tmpfs (as it would on a DAX mount).
///
/// Call it before the first pool is created or opened (libpmem reads the variable once), while
/// the process is still single-threaded: changing the environment races with other threads'
/// `getenv`.
pub fn force_pmem() {
    std::env::set_var(PMEM_IS_PMEM_FORCE, "1");
}

/// True when `PMEM_IS_PMEM_FORCE=1` is set in this process's environment.
pub fn pmem_forced() -> bool {
    std::env::var(PMEM_IS_PMEM_FORCE).is_ok_and(|v| v.trim() == "1")
}

/// The pool size that holds a root object of `root_size` bytes: the object plus libpmemobj's
/// metadata (pool header, lanes, heap and zone headers, chunk headers), with margin.
pub fn pool_size_for(root_size: usize) -> u64 {
    let root = root_size as u64;
    // Lanes (1024 x 3 KiB) and headers take ~4 MiB; the heap keeps chunk metadata per 256 KiB
    // chunk and one zone header per ~16 GiB. 1/64 of the object plus 16 MiB is ample.
    (root + root / 64 + (16 << 20)).max(MIN_POOL_SIZE)
}

/// libpmemobj's message for the last error of this thread.
fn errormsg() -> String {
    let Ok(lib) = sys::lib() else {
        return String::new();
    };
    // SAFETY: pmemobj_errormsg returns a pointer to a thread-local NUL-terminated buffer (or
    // NULL); we copy it out before any other libpmemobj call on this thread.
    unsafe {
        let p = (lib.pmemobj_errormsg)();
        if p.is_null() {
            String::new()
        } else {
            CStr::from_ptr(p).to_string_lossy().trim().to_string()
        }
    }
}

fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

fn cstring(what: &str, s: &[u8]) -> Result<CString> {
    CString::new(s).map_err(|_| PmdkError::Invalid(format!("{what} contains a NUL byte")))
}

/// An open libpmemobj pool and its root object.
///
/// Closed (`pmemobj_close`) on drop. libpmemobj refuses to open the same pool twice in one
/// process.
#[derive(Debug)]
pub struct Pool {
    lib: &'static sys::Lib,
    pop: NonNull<sys::PMEMobjpool>,
    root: sys::PMEMoid,
    base: NonNull<u8>,
    root_len: usize,
    path: PathBuf,
    scratch: Vec<sys::TmWrite>,
}

// SAFETY: a PMEMobjpool handle may be used from any thread (libpmemobj keeps transaction state
// per thread and the shim runs a whole transaction inside one call). `scratch` holds raw pointers
// only for the duration of one `&mut self` call.
unsafe impl Send for Pool {}
// SAFETY: the only `&self` methods read the root object; every write takes `&mut self`, so the
// borrow checker keeps readers and writers of one process apart.
unsafe impl Sync for Pool {}

impl Pool {
    /// Create the pool file `path` (it must not exist) of `pool_size` bytes with mode 0600 and
    /// the given `layout` name, and allocate a zeroed root object of `root_size` bytes.
    ///
    /// [`pool_size_for`] gives a `pool_size` that fits the root object.
    pub fn create(path: &Path, layout: &str, pool_size: u64, root_size: usize) -> Result<Pool> {
        if root_size == 0 {
            return Err(PmdkError::Invalid("root object size 0".into()));
        }
        let cpath = cstring("path", path.as_os_str().as_encoded_bytes())?;
        let clayout = cstring("layout", layout.as_bytes())?;
        let lib = sys::lib().map_err(PmdkError::Load)?;
        // SAFETY: both strings are valid NUL-terminated C strings for the duration of the call.
        let pop = unsafe {
            (lib.pmemobj_create)(
                cpath.as_ptr(),
                clayout.as_ptr(),
                pool_size as libc::size_t,
                0o600,
            )
        };
        let pop = NonNull::new(pop).ok_or_else(|| PmdkError::Call {
            op: "pmemobj_create",
            path: path.to_path_buf(),
            errno: errno(),
            msg: errormsg(),
        })?;
        Self::with_root(lib, pop, path, root_size)
    }

    /// Open the existing pool `path` created with `layout` and map its root object (which must
    /// exist).
    pub fn open(path: &Path, layout: &str) -> Result<Pool> {
        let cpath = cstring("path", path.as_os_str().as_encoded_bytes())?;
        let clayout = cstring("layout", layout.as_bytes())?;
        let lib = sys::lib().map_err(PmdkError::Load)?;
        // SAFETY: both strings are valid NUL-terminated C strings for the duration of the call.
        let pop = unsafe { (lib.pmemobj_open)(cpath.as_ptr(), clayout.as_ptr()) };
        let pop = NonNull::new(pop).ok_or_else(|| PmdkError::Call {
            op: "pmemobj_open",
            path: path.to_path_buf(),
            errno: errno(),
            msg: errormsg(),
        })?;
        // SAFETY: pop is an open pool handle.
        let size = unsafe { (lib.pmemobj_root_size)(pop.as_ptr()) };
        if size == 0 {
            // SAFETY: pop is open and owned by us; nothing else refers to it.
            unsafe { (lib.pmemobj_close)(pop.as_ptr()) };
            return Err(PmdkError::Invalid(format!(
                "pool {} has no root object",
                path.display()
            )));
        }
        Self::with_root(lib, pop, path, size)
    }

    /// Take ownership of `pop` and map (allocating if needed) a root object of `size` bytes.
    fn with_root(
        lib: &'static sys::Lib,
        pop: NonNull<sys::PMEMobjpool>,
        path: &Path,
        size: usize,
    ) -> Result<Pool> {
        // SAFETY: pop is an open pool handle owned by this function.
        let root = unsafe { (lib.pmemobj_root)(pop.as_ptr(), size) };
        let base = if root.off == 0 {
            None
        } else {
            // SAFETY: root is an object id of the open pool pop; pmemobj_direct returns its
            // address (or NULL).
            NonNull::new(unsafe { (lib.pmemobj_direct)(root) }.cast::<u8>())
        };
        let Some(base) = base else {
            let err = PmdkError::Call {
                op: "pmemobj_root",
                path: path.to_path_buf(),
                errno: errno(),
                msg: errormsg(),
            };
            // SAFETY: pop is open and owned by us; nothing else refers to it.
            unsafe { (lib.pmemobj_close)(pop.as_ptr()) };
            return Err(err);
        };
        Ok(Pool {
            lib,
            pop,
            root,
            base,
            root_len: size,
            path: path.to_path_buf(),
            scratch: Vec::new(),
        })
    }

    /// The pool file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Size of the root object in bytes.
    pub fn root_len(&self) -> usize {
        self.root_len
    }

    /// The root object's bytes (reads only; write through [`Pool::transaction`]).
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: base..base+root_len is the root object, mapped for the pool's lifetime; it is
        // only written through `&mut self`, so no write overlaps this shared borrow.
        unsafe { std::slice::from_raw_parts(self.base.as_ptr(), self.root_len) }
    }

    /// Copy `buf.len()` bytes at `offset` of the root object into `buf`.
    pub fn read(&self, offset: usize, buf: &mut [u8]) -> Result<()> {
        self.check(offset, buf.len())?;
        buf.copy_from_slice(&self.as_slice()[offset..offset + buf.len()]);
        Ok(())
    }

    fn check(&self, offset: usize, len: usize) -> Result<()> {
        match offset.checked_add(len) {
            Some(end) if end <= self.root_len => Ok(()),
            _ => Err(PmdkError::OutOfBounds {
                offset,
                len,
                root_len: self.root_len,
            }),
        }
    }

    /// Apply `writes` — `(offset into the root object, new bytes)` — in one libpmemobj
    /// transaction: each range is snapshotted into the undo log (`pmemobj_tx_add_range`) and
    /// overwritten with `memcpy`; the commit flushes the ranges and retires the log. When this
    /// returns `Ok`, every write is durable; on `Err` none is visible.
    pub fn transaction(&mut self, writes: &[(usize, &[u8])]) -> Result<()> {
        self.run(writes, false)
    }

    /// Perform `writes` inside a transaction, then abort it (`pmemobj_tx_abort`): libpmemobj
    /// restores every range from its undo log. Returns `Ok` when the abort happened as requested
    /// (the object is unchanged); for tests and for measuring the abort path.
    pub fn transaction_then_abort(&mut self, writes: &[(usize, &[u8])]) -> Result<()> {
        match self.run(writes, true) {
            Err(PmdkError::Aborted { errno, .. }) if errno == libc::ECANCELED => Ok(()),
            Ok(()) => Err(PmdkError::Invalid(
                "libpmemobj committed a transaction the shim asked to abort".into(),
            )),
            Err(e) => Err(e),
        }
    }

    fn run(&mut self, writes: &[(usize, &[u8])], abort: bool) -> Result<()> {
        for (off, data) in writes {
            self.check(*off, data.len())?;
        }
        self.scratch.clear();
        self.scratch
            .extend(writes.iter().map(|(off, data)| sys::TmWrite {
                off: *off as u64,
                src: data.as_ptr().cast(),
                len: data.len(),
            }));
        // SAFETY: pop is open; root is its root object; every (off, len) was bounds-checked
        // against the root object above; every src points to `len` readable bytes borrowed for
        // this call and cannot overlap the root object (it is only lent out through `&self`,
        // which `&mut self` excludes). The shim keeps setjmp/longjmp inside C.
        let rc = unsafe {
            (self.lib.tm_pmdk_tx_write)(
                self.pop.as_ptr(),
                self.root,
                self.scratch.as_ptr(),
                self.scratch.len(),
                abort as libc::c_int,
            )
        };
        self.scratch.clear();
        if rc == 0 {
            return Ok(());
        }
        let mut msg = errormsg();
        if msg.is_empty() || rc == libc::ECANCELED {
            msg = std::io::Error::from_raw_os_error(rc).to_string();
        }
        Err(PmdkError::Aborted {
            path: self.path.clone(),
            errno: rc,
            msg,
        })
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        // SAFETY: pop is open and owned by this Pool; no transaction is in progress (each runs
        // entirely inside one shim call) and no borrow of the root object outlives `self`.
        unsafe { (self.lib.pmemobj_close)(self.pop.as_ptr()) };
    }
}

/// The calling thread's libpmemobj transaction stage (`pmemobj_tx_stage()`): always
/// [`sys::TX_STAGE_NONE`] between calls of this crate, since each transaction runs entirely
/// inside one call.
pub fn tx_stage() -> i32 {
    match sys::lib() {
        // SAFETY: pmemobj_tx_stage reads thread-local state only.
        Ok(lib) => unsafe { (lib.tm_pmdk_tx_stage)() },
        // No pool could ever have been opened: no transaction either.
        Err(_) => sys::TX_STAGE_NONE,
    }
}

#[cfg(test)]
mod tests;
