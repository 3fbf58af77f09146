//! # tiermem-pheap — a persistent heap with object-granular incremental checkpoints (FGCK)
//!
//! The working copy of the heap lives in DRAM (a memfd); its checkpoint space lives in an NVM
//! pool (`tiermem_media::Pool`). The memfd is mapped `1 + views` times at fixed addresses: a
//! library view (used for copies, never tracked) and `views` user views over the same pages.
//! Each page is split into `views` equal parts; an object is handed out through the view of the
//! part holding its first byte (two views, as in the paper: first half → view 0, second half →
//! view 1, an object crossing the middle → view 0, whose page also covers its tail; see
//! [`alloc::Alloc::view_of`]). Every user view is write-protected at each checkpoint
//! with the fault engine's [`tiermem_fault::WriteTracker`] (userfaultfd WP_ASYNC +
//! PAGEMAP_SCAN), so the first write to an object marks only the view page of its part, and
//! [`Heap::ckall`] copies only the objects visible through written view pages. `views = 1` is
//! the page-granular baseline (PGCK): whole written pages are copied.
//!
//! Checkpoints are atomic (redo log + one header commit, see [`format`](mod@format)); [`Heap::open`] maps
//! the views at the same addresses again and restores the last complete checkpoint.
//!
//! Two ways to use it: a [`Heap`] value, or the `nvh_*` functions on one process-global heap
//! ([`nvh_open`] first).
//!
//! See `docs/pheap.md` for the design and what is not built yet.

#![deny(unsafe_op_in_unsafe_fn)]
#![warn(missing_docs)]
#![allow(clippy::manual_is_multiple_of, clippy::unnecessary_map_or)]

pub mod alloc;
pub mod error;
pub mod format;
mod heap;
pub mod inspect;
mod tcache;

pub use error::{Error, Result};
pub use heap::{CkStats, Heap, HeapOptions};
pub use tiermem_fault::TrackingMethod;

use parking_lot::RwLock;
use std::path::Path;
use std::sync::Arc;

static GLOBAL: RwLock<Option<Arc<Heap>>> = RwLock::new(None);

fn global() -> Result<Arc<Heap>> {
    GLOBAL.read().clone().ok_or(Error::NotOpen)
}

/// The default heap of this program and user (as the paper's per-program metadata):
/// `$TIERMEM_DIR` (default `/dev/shm/tiermem`) + `/pheap/<program name>-<uid>.heap`; the
/// directory is created if missing.
pub fn default_path() -> std::path::PathBuf {
    let dir = std::env::var_os("TIERMEM_DIR")
        .filter(|d| !d.is_empty())
        .map_or_else(|| std::path::PathBuf::from("/dev/shm/tiermem"), Into::into)
        .join("pheap");
    let _ = std::fs::create_dir_all(&dir);
    let prog = std::fs::read_to_string("/proc/self/comm")
        .map(|s| s.trim().replace('/', "_"))
        .unwrap_or_else(|_| "prog".to_string());
    // SAFETY: getuid has no preconditions.
    let uid = unsafe { libc::getuid() };
    dir.join(format!("{prog}-{uid}.heap"))
}

/// Opens the heap at `path` as the process-global heap, creating it with
/// [`HeapOptions::default`] when the file does not exist. [`Error::AlreadyOpen`] if a global
/// heap is open.
pub fn nvh_open(path: impl AsRef<Path>) -> Result<()> {
    nvh_open_with(path, &HeapOptions::default())
}

/// [`nvh_open`] with the options used when the heap must be created.
pub fn nvh_open_with(path: impl AsRef<Path>, opts: &HeapOptions) -> Result<()> {
    let mut g = GLOBAL.write();
    if g.is_some() {
        return Err(Error::AlreadyOpen);
    }
    let path = path.as_ref();
    let h = if path.exists() {
        Heap::open_with(path, opts)?
    } else {
        Heap::create(path, opts)?
    };
    *g = Some(Arc::new(h));
    Ok(())
}

/// Takes a final checkpoint of the global heap and closes it. The heap is closed even if the
/// checkpoint fails (the error is returned). [`Error::NotOpen`] without a global heap.
pub fn nvh_close() -> Result<CkStats> {
    let h = GLOBAL.write().take().ok_or(Error::NotOpen)?;
    h.ckall()
}

/// [`Heap::malloc`] on the global heap.
pub fn nvh_malloc(size: usize, name: Option<&str>) -> Result<*mut u8> {
    global()?.malloc(size, name)
}

/// [`Heap::free`] on the global heap.
pub fn nvh_free(ptr: *mut u8) -> Result<()> {
    global()?.free(ptr)
}

/// [`Heap::realloc`] on the global heap.
pub fn nvh_realloc(ptr: *mut u8, size: usize) -> Result<*mut u8> {
    global()?.realloc(ptr, size)
}

/// [`Heap::get`] on the global heap (`None` also when no global heap is open).
pub fn nvh_get(name: &str) -> Option<*mut u8> {
    global().ok()?.get(name)
}

/// [`Heap::ckall`] on the global heap.
pub fn nvh_ckall() -> Result<CkStats> {
    global()?.ckall()
}

/// [`Heap::checkpoint_stopping_threads`] on the global heap (default signal, `timeout`):
/// every other thread of the process is parked while the checkpoint runs. Returns the
/// checkpoint's stats and the pause.
pub fn nvh_ckall_stopping_threads(
    timeout: std::time::Duration,
) -> Result<(CkStats, std::time::Duration)> {
    let opts = tiermem_fault::safepoint::StopOptions {
        timeout,
        ..Default::default()
    };
    global()?.checkpoint_stopping_threads(&opts)
}

/// [`Heap::ckone`] on the global heap.
pub fn nvh_ckone(name: &str) -> Result<CkStats> {
    global()?.ckone(name)
}

/// True when a process-global heap is open ([`nvh_open`] succeeded and [`nvh_close`] was not
/// called since).
pub fn nvh_is_open() -> bool {
    GLOBAL.read().is_some()
}
