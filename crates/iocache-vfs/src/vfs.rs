//! The `tiermem` SQLite VFS: a shim over the default (unix) VFS whose main database files read
//! and write through an iocache [`Pool`]; every other file (rollback journal, WAL, temporary
//! files) is the unix VFS's own object, untouched.
//!
//! * **Data**: `xRead`/`xWrite` copy between SQLite's buffers and pool pages (any offset and
//!   length: the 100-byte header read, pages smaller than the pool's); `xFileSize` is the
//!   logical size (what SQLite wrote or truncated to, even before the pool wrote it back);
//!   `xTruncate` drops the pages past the cut unwritten and truncates the file; `xSync` writes
//!   every dirty page back ([`Pool::flush`]) and then calls the unix file's `xSync` (its
//!   `fdatasync` covers the pool's writes: they are the same inode), so a rollback journal's
//!   order — journal synced, pages written, database synced, journal deleted — holds.
//! * **Locks**: `xLock`, `xUnlock`, `xCheckReservedLock` and the `xShm*` methods are the unix
//!   file's (the pool is only a data cache). All connections of one process to one file share
//!   one pool (keyed by device and inode), so they see each other's writes as the file would.
//! * **Other processes**: the pool is written back whenever this connection lets go of its write
//!   lock (`xUnlock` from RESERVED or more, or the end of a WAL checkpoint), before the lock is
//!   released, so another process sees everything committed. When a connection takes a shared
//!   lock (`xLock` from NONE, or a WAL read lock), the file's `fstat` stamp (inode, size,
//!   mtime, ctime) is compared with the one recorded after this process's last write-back; if
//!   another process changed the file, the pool drops every page (for a rollback-journal
//!   database only when the header's change counter moved too).
//! * **mmap**: off for pooled files (`iVersion` 2: no `xFetch`; `SQLITE_FCNTL_MMAP_SIZE` answers
//!   0), or reads would go around the pool.
//! * `SQLITE_FCNTL_VFSNAME` answers `tiermem(MODE)`; `PRAGMA tiermem_iocache` returns the pool's
//!   counters as one JSON object.
//! * No panic crosses the C boundary: each method runs under `catch_unwind` and a panic is
//!   `SQLITE_IOERR`; pool errors map to the method's `SQLITE_IOERR_*` code (`SQLITE_FULL` for
//!   `ENOSPC`).

use crate::config::{self, Config};
use rusqlite::ffi;
use serde::Serialize;
use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::os::unix::ffi::OsStrExt;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, Weak};
use tiermem_iocache::{Access, Error, Options, Pool, Stats};

/// The VFS's registered name.
pub const VFS_NAME: &str = "tiermem";
const VFS_NAME_C: &CStr = c"tiermem";
/// The `PRAGMA` that reports a pooled file's counters.
pub const STATS_PRAGMA: &str = "tiermem_iocache";

// ---------------------------------------------------------------------------------------------
// The SQLite functions the VFS calls: the linked library's, or a loading host's routine table.
// ---------------------------------------------------------------------------------------------

type VfsFind = unsafe extern "C" fn(*const c_char) -> *mut ffi::sqlite3_vfs;
type VfsRegister = unsafe extern "C" fn(*mut ffi::sqlite3_vfs, c_int) -> c_int;
type Malloc = unsafe extern "C" fn(c_int) -> *mut c_void;
type UriParameter = unsafe extern "C" fn(*const c_char, *const c_char) -> *const c_char;

/// The few SQLite entry points the VFS needs.
#[derive(Clone, Copy)]
pub(crate) struct Api {
    vfs_find: VfsFind,
    vfs_register: VfsRegister,
    malloc: Malloc,
    uri_parameter: UriParameter,
}

/// Positions in `struct sqlite3_api_routines` (sqlite3ext.h; the struct only ever grows at its
/// end, so these hold for every SQLite since 3.7.7). Checked against the installed header by a
/// unit test.
pub(crate) const API_MALLOC: usize = 68;
pub(crate) const API_VFS_FIND: usize = 141;
pub(crate) const API_VFS_REGISTER: usize = 142;
pub(crate) const API_URI_PARAMETER: usize = 189;

static API: OnceLock<Api> = OnceLock::new();

impl Api {
    /// The library this crate links (in-process use).
    fn linked() -> Api {
        Api {
            vfs_find: ffi::sqlite3_vfs_find,
            vfs_register: ffi::sqlite3_vfs_register,
            malloc: ffi::sqlite3_malloc,
            uri_parameter: ffi::sqlite3_uri_parameter,
        }
    }

    /// The routine table a host passed to an extension's entry point.
    ///
    /// # Safety
    /// `p_api` is the `const sqlite3_api_routines*` SQLite passed to the entry point.
    pub(crate) unsafe fn from_routines(p_api: *const c_void) -> Option<Api> {
        if p_api.is_null() {
            return None;
        }
        let table = p_api.cast::<*const c_void>();
        // SAFETY: the routine table is an array of function pointers at least 190 long (any
        // SQLite since 3.7.7); each slot read is one of the four, whose C types these are.
        unsafe {
            let slot = |i: usize| -> Option<*const c_void> {
                let p = *table.add(i);
                (!p.is_null()).then_some(p)
            };
            Some(Api {
                malloc: std::mem::transmute::<*const c_void, Malloc>(slot(API_MALLOC)?),
                vfs_find: std::mem::transmute::<*const c_void, VfsFind>(slot(API_VFS_FIND)?),
                vfs_register: std::mem::transmute::<*const c_void, VfsRegister>(slot(
                    API_VFS_REGISTER,
                )?),
                uri_parameter: std::mem::transmute::<*const c_void, UriParameter>(slot(
                    API_URI_PARAMETER,
                )?),
            })
        }
    }
}

fn api() -> Api {
    *API.get_or_init(Api::linked)
}

/// A copy of `s` in memory from `sqlite3_malloc` (SQLite frees it), or null.
pub(crate) fn sqlite_string(s: &str) -> *mut c_char {
    let Ok(c) = CString::new(s) else {
        return std::ptr::null_mut();
    };
    let bytes = c.as_bytes_with_nul();
    let Ok(n) = c_int::try_from(bytes.len()) else {
        return std::ptr::null_mut();
    };
    // SAFETY: sqlite3_malloc returns null or n writable bytes; we copy exactly n.
    unsafe {
        let p = (api().malloc)(n).cast::<c_char>();
        if !p.is_null() {
            std::ptr::copy_nonoverlapping(bytes.as_ptr().cast::<c_char>(), p, bytes.len());
        }
        p
    }
}

// ---------------------------------------------------------------------------------------------
// Registration
// ---------------------------------------------------------------------------------------------

/// Our `sqlite3_vfs`, leaked once registered (SQLite keeps a pointer to it forever).
struct VfsPtr(*mut ffi::sqlite3_vfs);
// SAFETY: the VFS object is immutable after registration; SQLite reads it from any thread.
unsafe impl Send for VfsPtr {}

static REGISTERED: Mutex<Option<VfsPtr>> = Mutex::new(None);

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// [`register_with`] the library this crate links.
pub(crate) fn register_with_linked(make_default: bool) -> Result<(), String> {
    register_with(Api::linked(), make_default)
}

/// Registers the `tiermem` VFS with `api` (the first caller's table is kept), wrapping the
/// unix VFS; `make_default` makes it the default VFS. Idempotent.
pub(crate) fn register_with(a: Api, make_default: bool) -> Result<(), String> {
    let a = *API.get_or_init(|| a);
    let mut reg = lock(&REGISTERED);
    let vfs = match &*reg {
        Some(v) => v.0,
        None => {
            // SAFETY: vfs_find with a valid C string; the unix VFS lives as long as SQLite.
            let real = unsafe { (a.vfs_find)(c"unix".as_ptr()) };
            let real = if real.is_null() {
                // SAFETY: as above; null asks for the default.
                unsafe { (a.vfs_find)(std::ptr::null()) }
            } else {
                real
            };
            if real.is_null() {
                return Err("SQLite has no unix (nor any default) VFS to wrap".into());
            }
            // SAFETY: `real` is a registered VFS: SQLite never frees those.
            let r = unsafe { &*real };
            if r.szOsFile < 0 || r.xOpen.is_none() {
                return Err("the unix VFS looks malformed".into());
            }
            let v = Box::new(ffi::sqlite3_vfs {
                iVersion: r.iVersion.min(3),
                szOsFile: (REAL_OFF + r.szOsFile as usize) as c_int,
                mxPathname: r.mxPathname,
                pNext: std::ptr::null_mut(),
                zName: VFS_NAME_C.as_ptr(),
                pAppData: real.cast(),
                xOpen: Some(x_open),
                xDelete: Some(x_delete),
                xAccess: Some(x_access),
                xFullPathname: Some(x_full_pathname),
                xDlOpen: Some(x_dl_open),
                xDlError: Some(x_dl_error),
                xDlSym: Some(x_dl_sym),
                xDlClose: Some(x_dl_close),
                xRandomness: Some(x_randomness),
                xSleep: Some(x_sleep),
                xCurrentTime: Some(x_current_time),
                xGetLastError: Some(x_get_last_error),
                xCurrentTimeInt64: Some(x_current_time_int64),
                xSetSystemCall: Some(x_set_system_call),
                xGetSystemCall: Some(x_get_system_call),
                xNextSystemCall: Some(x_next_system_call),
            });
            let p = Box::into_raw(v);
            *reg = Some(VfsPtr(p));
            p
        }
    };
    // SAFETY: `vfs` is our leaked, fully initialised VFS; registering it again only moves it
    // (to the head of the list when it becomes the default).
    let rc = unsafe { (a.vfs_register)(vfs, make_default as c_int) };
    if rc != ffi::SQLITE_OK {
        return Err(format!("sqlite3_vfs_register failed with code {rc}"));
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Shared per-file state
// ---------------------------------------------------------------------------------------------

/// What `fstat` says of the file: changed by any write, truncation or rename-over.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
struct Stamp {
    ino: u64,
    size: u64,
    mtime: (i64, i64),
    ctime: (i64, i64),
}

fn stamp_of(fd: std::os::fd::RawFd) -> std::io::Result<Stamp> {
    // SAFETY: stat is plain old data that fstat fills for a valid descriptor.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: a valid fd (the pool's, open while the pool lives) and out-pointer.
    if unsafe { libc::fstat(fd, &mut st) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(Stamp {
        ino: st.st_ino,
        size: st.st_size as u64,
        mtime: (st.st_mtime, st.st_mtime_nsec),
        ctime: (st.st_ctime, st.st_ctime_nsec),
    })
}

#[derive(Debug)]
struct Meta {
    /// Logical size in bytes: what SQLite wrote or truncated to.
    size: u64,
    /// The file's stamp after this process's last write-back (or its last look).
    stamp: Stamp,
    /// Header bytes 24..40 (change counter and friends) at that time.
    version: [u8; 16],
}

/// One database file's pool, shared by every connection of this process to that file.
struct DbFile {
    key: (u64, u64),
    path: PathBuf,
    cfg: Config,
    page_size: u64,
    pool: Pool,
    meta: Mutex<Meta>,
    /// Connections of this process holding the WAL checkpoint lock (then no other process
    /// writes the file, and the pool may hold dirty pages: no revalidation).
    ckpt: AtomicU32,
    /// Times the pool was emptied because another process changed the file.
    invalidations: AtomicU64,
}

static FILES: Mutex<Vec<Weak<DbFile>>> = Mutex::new(Vec::new());

/// A pooled database file's configuration and counters ([`pool_report`], `PRAGMA
/// tiermem_iocache`).
#[derive(Clone, Debug, Serialize)]
pub struct PoolReport {
    /// The file's path as SQLite opened it.
    pub path: PathBuf,
    /// `buffered`, `direct` or `dbio`.
    pub mode: &'static str,
    /// Pool page size, bytes.
    pub page_size: u64,
    /// Pool bytes.
    pub pool_bytes: u64,
    /// Budget (pool and page cache), bytes.
    pub budget: u64,
    /// Whether the pool trims the page cache to the budget itself.
    pub enforce_budget: bool,
    /// Logical file size, bytes.
    pub size: u64,
    /// Times the pool was emptied because another process changed the file.
    pub invalidations: u64,
    /// Pool hits (`get_page` served by a frame).
    pub pool_hits: u64,
    /// Pool misses.
    pub pool_misses: u64,
    /// Misses served by the page cache (dbio probe hits).
    pub cache_hits: u64,
    /// Misses read with `O_DIRECT`.
    pub direct_reads: u64,
    /// Misses read through the page cache without a probe.
    pub buffered_reads: u64,
    /// Pages written with `O_DIRECT`.
    pub direct_writes: u64,
    /// Pages written through the page cache.
    pub buffered_writes: u64,
    /// Dirty pages evicted.
    pub evict_dirty: u64,
    /// Clean pages evicted.
    pub evict_clean: u64,
    /// Pages dropped from the page cache to keep the budget.
    pub trimmed_pages: u64,
    /// Frames in the pool.
    pub frames: u64,
    /// Whether the frames are locked in memory.
    pub locked: bool,
}

impl DbFile {
    fn report(&self) -> PoolReport {
        let s: Stats = self.pool.stats();
        PoolReport {
            path: self.path.clone(),
            mode: config::mode_name(self.cfg.mode),
            page_size: self.page_size,
            pool_bytes: self.cfg.pool_bytes,
            budget: self.cfg.budget,
            enforce_budget: self.cfg.enforce_budget,
            size: lock(&self.meta).size,
            invalidations: self.invalidations.load(Ordering::Relaxed),
            pool_hits: s.pool_hits,
            pool_misses: s.pool_misses,
            cache_hits: s.cache_hits,
            direct_reads: s.direct_reads,
            buffered_reads: s.buffered_reads,
            direct_writes: s.direct_writes,
            buffered_writes: s.buffered_writes,
            evict_dirty: s.evict_dirty,
            evict_clean: s.evict_clean,
            trimmed_pages: s.trimmed_pages,
            frames: s.frames,
            locked: s.locked,
        }
    }

    /// A page of the pool, waiting a little while every frame is pinned by other threads.
    fn page(&self, pgno: u64, access: Access) -> Result<tiermem_iocache::PageGuard<'_>, Error> {
        let mut tries = 0;
        loop {
            match self.pool.get_page(pgno, access) {
                Err(Error::AllPinned { .. }) if tries < 10_000 => {
                    tries += 1;
                    std::thread::yield_now();
                }
                r => return r,
            }
        }
    }

    /// Copies `buf.len()` bytes at `off` out of the pool.
    fn read_at(&self, buf: &mut [u8], off: u64) -> Result<(), Error> {
        let ps = self.page_size;
        let mut done = 0usize;
        while done < buf.len() {
            let pos = off + done as u64;
            let (pgno, in_page) = (pos / ps, (pos % ps) as usize);
            let n = (ps as usize - in_page).min(buf.len() - done);
            let g = self.page(pgno, Access::Read)?;
            buf[done..done + n].copy_from_slice(&g[in_page..in_page + n]);
            done += n;
        }
        Ok(())
    }

    /// Copies `buf` into the pool at `off` (the pages become dirty).
    fn write_at(&self, buf: &[u8], off: u64) -> Result<(), Error> {
        let ps = self.page_size;
        let mut done = 0usize;
        while done < buf.len() {
            let pos = off + done as u64;
            let (pgno, in_page) = (pos / ps, (pos % ps) as usize);
            let n = (ps as usize - in_page).min(buf.len() - done);
            let mut g = self.page(pgno, Access::Write)?;
            let page = g
                .as_mut_slice()
                .expect("a page taken for writing is writable");
            page[in_page..in_page + n].copy_from_slice(&buf[done..done + n]);
            done += n;
        }
        Ok(())
    }

    /// Writes every dirty page back; then, if the logical size is not a page multiple (a
    /// database page smaller than the pool's), cuts off what the last page's write-back added.
    fn flush(&self) -> Result<(), Error> {
        self.pool.flush()?;
        let size = lock(&self.meta).size;
        if size % self.page_size != 0 && self.pool.file().len()? > size {
            // SAFETY: ftruncate on the pool's own descriptor; no memory involved.
            if unsafe { libc::ftruncate(self.pool.file().fd(), size as libc::off_t) } != 0 {
                return Err(Error::Io {
                    op: "ftruncate",
                    path: self.path.clone(),
                    source: std::io::Error::last_os_error(),
                });
            }
        }
        Ok(())
    }

    /// Records the file's stamp and header version as this process's own (called after a
    /// write-back while this process alone may write the file).
    fn record(&self) -> Result<(), Error> {
        let st = stamp_of(self.pool.file().fd()).map_err(|e| self.io("fstat", e))?;
        let size = lock(&self.meta).size;
        let mut ver = [0u8; 16];
        if size >= 40 {
            self.read_at(&mut ver, 24)?;
        }
        let mut m = lock(&self.meta);
        m.stamp = st;
        m.version = ver;
        Ok(())
    }

    /// Drops the pool's pages if another process changed the file since this one last
    /// looked (see the module documentation).
    fn revalidate(&self) -> Result<(), Error> {
        if self.ckpt.load(Ordering::Acquire) > 0 {
            return Ok(());
        }
        let st = stamp_of(self.pool.file().fd()).map_err(|e| self.io("fstat", e))?;
        let mut m = lock(&self.meta);
        if st == m.stamp {
            return Ok(());
        }
        let mut hdr = [0u8; 100];
        self.pool.file().read_buffered(&mut hdr, 0)?;
        let wal = hdr[18] == 2 || hdr[19] == 2;
        let mut ver = [0u8; 16];
        ver.copy_from_slice(&hdr[24..40]);
        if wal || ver != m.version {
            self.discard_all()?;
            self.invalidations.fetch_add(1, Ordering::Relaxed);
        }
        m.size = st.size;
        m.stamp = st;
        m.version = ver;
        Ok(())
    }

    /// Empties the pool (retrying while another connection's copy holds a page for a moment).
    fn discard_all(&self) -> Result<(), Error> {
        let mut tries = 0;
        loop {
            match self.pool.discard_from(0) {
                Err(Error::Pinned { .. }) if tries < 10_000 => {
                    tries += 1;
                    std::thread::yield_now();
                }
                r => return r.map(|_| ()),
            }
        }
    }

    fn truncate(&self, len: u64) -> Result<(), Error> {
        let mut tries = 0;
        loop {
            match self.pool.truncate(len) {
                Err(Error::Pinned { .. }) if tries < 10_000 => {
                    tries += 1;
                    std::thread::yield_now();
                }
                r => return r,
            }
        }
    }

    fn io(&self, op: &'static str, e: std::io::Error) -> Error {
        Error::Io {
            op,
            path: self.path.clone(),
            source: e,
        }
    }
}

/// The report of the pooled database file at `path` if a connection of this process has it
/// open through the `tiermem` VFS.
pub fn pool_report(path: &Path) -> Option<PoolReport> {
    let md = std::fs::metadata(path).ok()?;
    use std::os::unix::fs::MetadataExt;
    let key = (md.dev(), md.ino());
    lock(&FILES)
        .iter()
        .filter_map(Weak::upgrade)
        .find(|d| d.key == key)
        .map(|d| d.report())
}

/// The configuration of a database opened as `name` (URI parameters `iocache_mode`,
/// `iocache_pool`, `iocache_budget`, `iocache_enforce`, else the environment).
///
/// # Safety
/// `name` is the file name SQLite passed to `xOpen` for a main database.
unsafe fn config_for(name: *const c_char) -> Result<Config, String> {
    let a = api();
    config::from_lookup(|k| {
        let (param, var) = match k {
            "mode" => (c"iocache_mode", config::ENV_MODE),
            "pool" => (c"iocache_pool", config::ENV_POOL),
            "budget" => (c"iocache_budget", config::ENV_BUDGET),
            _ => (c"iocache_enforce", config::ENV_ENFORCE),
        };
        // SAFETY: `name` is a main database's name (which carries its URI parameters).
        let v = unsafe { (a.uri_parameter)(name, param.as_ptr()) };
        if !v.is_null() {
            // SAFETY: SQLite returns a NUL-terminated string inside `name`.
            let s = unsafe { CStr::from_ptr(v) }.to_string_lossy().into_owned();
            return Some((param.to_string_lossy().into_owned(), s));
        }
        std::env::var(var).ok().map(|v| (var.to_string(), v))
    })
}

/// The database's page size from its header when it is one the pool takes, else 4096.
///
/// # Safety
/// `real` is an open unix file object.
unsafe fn header_page_size(real: *mut ffi::sqlite3_file) -> u64 {
    let mut hdr = [0u8; 100];
    // SAFETY: an open file object's methods; the buffer is 100 writable bytes.
    let rc = unsafe {
        match (*(*real).pMethods).xRead {
            Some(f) => f(real, hdr.as_mut_ptr().cast(), 100, 0),
            None => ffi::SQLITE_IOERR,
        }
    };
    if rc != ffi::SQLITE_OK || &hdr[..16] != b"SQLite format 3\0" {
        return 4096;
    }
    match u16::from_be_bytes([hdr[16], hdr[17]]) as u64 {
        p @ (4096 | 8192 | 16384) => p,
        _ => 4096,
    }
}

/// The shared state of the main database `name`, opening its pool if no connection of this
/// process has.
///
/// # Safety
/// `name` is the name SQLite passed to `xOpen`; `real` the unix file just opened for it.
unsafe fn open_db(
    name: *const c_char,
    real: *mut ffi::sqlite3_file,
) -> Result<Arc<DbFile>, String> {
    // SAFETY: SQLite passes a NUL-terminated path.
    let path = PathBuf::from(std::ffi::OsStr::from_bytes(
        unsafe { CStr::from_ptr(name) }.to_bytes(),
    ));
    use std::os::unix::fs::MetadataExt;
    let md = std::fs::metadata(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    let key = (md.dev(), md.ino());
    let mut files = lock(&FILES);
    files.retain(|w| w.strong_count() > 0);
    if let Some(d) = files
        .iter()
        .filter_map(Weak::upgrade)
        .find(|d| d.key == key)
    {
        return Ok(d);
    }
    // SAFETY: forwarded caller guarantees.
    let cfg = unsafe { config_for(name) }?;
    // SAFETY: `real` is open.
    let page_size = unsafe { header_page_size(real) };
    let pool = Pool::open(
        &path,
        Options {
            page_size: page_size as usize,
            budget: cfg.budget,
            pool_bytes: cfg.pool_bytes,
            mode: cfg.mode,
            enforce_budget: cfg.enforce_budget,
            create: false,
            ..Options::default()
        },
    )
    .map_err(|e| format!("{}: {e}", path.display()))?;
    let fd = pool.file().fd();
    let st = stamp_of(fd).map_err(|e| format!("fstat {}: {e}", path.display()))?;
    let mut hdr = [0u8; 40];
    pool.file()
        .read_buffered(&mut hdr, 0)
        .map_err(|e| e.to_string())?;
    let mut version = [0u8; 16];
    version.copy_from_slice(&hdr[24..40]);
    let d = Arc::new(DbFile {
        key,
        path,
        cfg,
        page_size,
        pool,
        meta: Mutex::new(Meta {
            size: st.size,
            stamp: st,
            version,
        }),
        ckpt: AtomicU32::new(0),
        invalidations: AtomicU64::new(0),
    });
    files.push(Arc::downgrade(&d));
    Ok(d)
}

// ---------------------------------------------------------------------------------------------
// The file object
// ---------------------------------------------------------------------------------------------

/// A main database file: our header, then the unix file object at [`REAL_OFF`]. (Other files
/// are the unix object itself, at offset 0.)
#[repr(C)]
struct TmFile {
    base: ffi::sqlite3_file,
    /// `Arc::into_raw` of the shared state; null: no pool (read-only), every call delegated.
    db: *const DbFile,
    /// The unix file object, inside this same allocation.
    real: *mut ffi::sqlite3_file,
    /// This connection's lock level on the file.
    lock: c_int,
    /// Whether this connection holds the WAL checkpoint lock.
    ckpt: bool,
}

/// Where the unix file object starts inside ours (16-byte aligned).
const REAL_OFF: usize = (std::mem::size_of::<TmFile>() + 15) & !15;
/// The WAL checkpoint lock's slot in the shm lock array.
const SHM_CKPT: c_int = 1;

static POOLED_METHODS: ffi::sqlite3_io_methods = ffi::sqlite3_io_methods {
    iVersion: 2,
    xClose: Some(f_close),
    xRead: Some(f_read),
    xWrite: Some(f_write),
    xTruncate: Some(f_truncate),
    xSync: Some(f_sync),
    xFileSize: Some(f_file_size),
    xLock: Some(f_lock),
    xUnlock: Some(f_unlock),
    xCheckReservedLock: Some(f_check_reserved_lock),
    xFileControl: Some(f_file_control),
    xSectorSize: Some(f_sector_size),
    xDeviceCharacteristics: Some(f_device_characteristics),
    xShmMap: Some(f_shm_map),
    xShmLock: Some(f_shm_lock),
    xShmBarrier: Some(f_shm_barrier),
    xShmUnmap: Some(f_shm_unmap),
    xFetch: None,
    xUnfetch: None,
};

/// Runs `f`, turning a panic into `err`.
fn guarded(err: c_int, f: impl FnOnce() -> c_int) -> c_int {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or(err)
}

/// `code`, or `SQLITE_FULL` when the error is a full device.
fn io_code(e: &Error, code: c_int) -> c_int {
    if let Error::Io { source, .. } = e {
        if source.raw_os_error() == Some(libc::ENOSPC) {
            return ffi::SQLITE_FULL;
        }
    }
    code
}

/// Our file object and its shared state (None: not pooled).
///
/// # Safety
/// `f` is a file object our `x_open` initialised with [`POOLED_METHODS`] and not yet closed.
unsafe fn parts<'a>(f: *mut ffi::sqlite3_file) -> (&'a mut TmFile, Option<&'a DbFile>) {
    // SAFETY: by the caller's contract `f` points to a live TmFile; `db` is null or an
    // Arc's pointer that stays alive until f_close.
    unsafe {
        let t = &mut *f.cast::<TmFile>();
        let d = t.db.as_ref();
        (t, d)
    }
}

/// The unix file's methods.
///
/// # Safety
/// `real` is an open file object.
unsafe fn rm<'a>(real: *mut ffi::sqlite3_file) -> &'a ffi::sqlite3_io_methods {
    // SAFETY: an open file object has its methods set (and they are static in the unix VFS).
    unsafe { &*(*real).pMethods }
}

macro_rules! delegate {
    ($t:expr, $m:ident $(, $a:expr)*) => {{
        let real = $t.real;
        // SAFETY: `real` is the open unix file inside our object.
        match unsafe { rm(real) }.$m {
            // SAFETY: calling the unix method on its own object with SQLite's arguments.
            Some(m) => unsafe { m(real $(, $a)*) },
            None => ffi::SQLITE_IOERR,
        }
    }};
}

unsafe extern "C" fn f_close(f: *mut ffi::sqlite3_file) -> c_int {
    guarded(ffi::SQLITE_IOERR_CLOSE, || {
        // SAFETY: SQLite closes a file it opened through us, once.
        let (t, d) = unsafe { parts(f) };
        let mut rc = ffi::SQLITE_OK;
        if let Some(d) = d {
            if let Err(e) = d.flush() {
                eprintln!(
                    "tiermem vfs: writing back {} at close: {e}",
                    d.path.display()
                );
                rc = io_code(&e, ffi::SQLITE_IOERR_CLOSE);
            }
        }
        let rc2 = delegate!(t, xClose);
        if !t.db.is_null() {
            if t.ckpt {
                // SAFETY: db is live until we drop our reference below.
                unsafe { &*t.db }.ckpt.fetch_sub(1, Ordering::AcqRel);
                t.ckpt = false;
            }
            // SAFETY: the pointer came from Arc::into_raw in x_open and is released once.
            let arc = unsafe { Arc::from_raw(t.db) };
            t.db = std::ptr::null();
            // Dropped under the registry lock: a last reference's write-back is done before
            // another open of the file can start a new pool.
            let files = lock(&FILES);
            drop(arc);
            drop(files);
        }
        t.base.pMethods = std::ptr::null();
        if rc != ffi::SQLITE_OK {
            rc
        } else {
            rc2
        }
    })
}

unsafe extern "C" fn f_read(
    f: *mut ffi::sqlite3_file,
    buf: *mut c_void,
    amt: c_int,
    off: ffi::sqlite3_int64,
) -> c_int {
    guarded(ffi::SQLITE_IOERR_READ, || {
        // SAFETY: a file opened through us.
        let (t, d) = unsafe { parts(f) };
        let Some(d) = d else {
            return delegate!(t, xRead, buf, amt, off);
        };
        if amt < 0 || off < 0 {
            return ffi::SQLITE_IOERR_READ;
        }
        // SAFETY: SQLite passes `amt` writable bytes at `buf`.
        let out = unsafe { std::slice::from_raw_parts_mut(buf.cast::<u8>(), amt as usize) };
        let off = off as u64;
        let size = lock(&d.meta).size;
        let have = size.saturating_sub(off).min(out.len() as u64) as usize;
        if let Err(e) = d.read_at(&mut out[..have], off) {
            eprintln!("tiermem vfs: read of {}: {e}", d.path.display());
            return io_code(&e, ffi::SQLITE_IOERR_READ);
        }
        if have < out.len() {
            out[have..].fill(0);
            return ffi::SQLITE_IOERR_SHORT_READ;
        }
        ffi::SQLITE_OK
    })
}

unsafe extern "C" fn f_write(
    f: *mut ffi::sqlite3_file,
    buf: *const c_void,
    amt: c_int,
    off: ffi::sqlite3_int64,
) -> c_int {
    guarded(ffi::SQLITE_IOERR_WRITE, || {
        // SAFETY: a file opened through us.
        let (t, d) = unsafe { parts(f) };
        let Some(d) = d else {
            return delegate!(t, xWrite, buf, amt, off);
        };
        if amt < 0 || off < 0 {
            return ffi::SQLITE_IOERR_WRITE;
        }
        // SAFETY: SQLite passes `amt` readable bytes at `buf`.
        let data = unsafe { std::slice::from_raw_parts(buf.cast::<u8>(), amt as usize) };
        let off = off as u64;
        if let Err(e) = d.write_at(data, off) {
            eprintln!("tiermem vfs: write of {}: {e}", d.path.display());
            return io_code(&e, ffi::SQLITE_IOERR_WRITE);
        }
        let mut m = lock(&d.meta);
        m.size = m.size.max(off + data.len() as u64);
        ffi::SQLITE_OK
    })
}

unsafe extern "C" fn f_truncate(f: *mut ffi::sqlite3_file, size: ffi::sqlite3_int64) -> c_int {
    guarded(ffi::SQLITE_IOERR_TRUNCATE, || {
        // SAFETY: a file opened through us.
        let (t, d) = unsafe { parts(f) };
        let Some(d) = d else {
            return delegate!(t, xTruncate, size);
        };
        if size < 0 {
            return ffi::SQLITE_IOERR_TRUNCATE;
        }
        let mut m = lock(&d.meta);
        if let Err(e) = d.truncate(size as u64) {
            eprintln!("tiermem vfs: truncate of {}: {e}", d.path.display());
            return io_code(&e, ffi::SQLITE_IOERR_TRUNCATE);
        }
        m.size = size as u64;
        ffi::SQLITE_OK
    })
}

unsafe extern "C" fn f_sync(f: *mut ffi::sqlite3_file, flags: c_int) -> c_int {
    guarded(ffi::SQLITE_IOERR_FSYNC, || {
        // SAFETY: a file opened through us.
        let (t, d) = unsafe { parts(f) };
        if let Some(d) = d {
            if let Err(e) = d.flush() {
                eprintln!("tiermem vfs: write-back of {}: {e}", d.path.display());
                return io_code(&e, ffi::SQLITE_IOERR_FSYNC);
            }
        }
        // The unix file's fdatasync covers the pool's writes (same inode), and it syncs the
        // directory after a create.
        let rc = delegate!(t, xSync, flags);
        if rc == ffi::SQLITE_OK {
            if let Some(d) = d {
                if t.lock >= ffi::SQLITE_LOCK_RESERVED || t.ckpt {
                    if let Err(e) = d.record() {
                        return io_code(&e, ffi::SQLITE_IOERR_FSTAT);
                    }
                }
            }
        }
        rc
    })
}

unsafe extern "C" fn f_file_size(f: *mut ffi::sqlite3_file, out: *mut ffi::sqlite3_int64) -> c_int {
    guarded(ffi::SQLITE_IOERR_FSTAT, || {
        // SAFETY: a file opened through us.
        let (t, d) = unsafe { parts(f) };
        let Some(d) = d else {
            return delegate!(t, xFileSize, out);
        };
        let size = lock(&d.meta).size;
        // SAFETY: SQLite passes a valid out-pointer.
        unsafe { *out = size as ffi::sqlite3_int64 };
        ffi::SQLITE_OK
    })
}

unsafe extern "C" fn f_lock(f: *mut ffi::sqlite3_file, level: c_int) -> c_int {
    guarded(ffi::SQLITE_IOERR_LOCK, || {
        // SAFETY: a file opened through us.
        let (t, d) = unsafe { parts(f) };
        let rc = delegate!(t, xLock, level);
        if rc != ffi::SQLITE_OK {
            return rc;
        }
        let prev = t.lock;
        t.lock = t.lock.max(level);
        if let Some(d) = d {
            if prev == ffi::SQLITE_LOCK_NONE && level >= ffi::SQLITE_LOCK_SHARED {
                if let Err(e) = d.revalidate() {
                    eprintln!("tiermem vfs: checking {}: {e}", d.path.display());
                    return io_code(&e, ffi::SQLITE_IOERR_LOCK);
                }
            }
        }
        ffi::SQLITE_OK
    })
}

unsafe extern "C" fn f_unlock(f: *mut ffi::sqlite3_file, level: c_int) -> c_int {
    guarded(ffi::SQLITE_IOERR_UNLOCK, || {
        // SAFETY: a file opened through us.
        let (t, d) = unsafe { parts(f) };
        if let Some(d) = d {
            if t.lock >= ffi::SQLITE_LOCK_RESERVED && level < ffi::SQLITE_LOCK_RESERVED {
                // Everything written under the write lock reaches the file before another
                // process can take a lock (SQLite syncs first unless `synchronous=OFF`).
                // On failure the lock is kept: the file lacks what the pool holds.
                if let Err(e) = d.flush().and_then(|()| d.record()) {
                    eprintln!("tiermem vfs: write-back of {}: {e}", d.path.display());
                    return io_code(&e, ffi::SQLITE_IOERR_UNLOCK);
                }
            }
        }
        let rc = delegate!(t, xUnlock, level);
        if rc == ffi::SQLITE_OK {
            t.lock = t.lock.min(level);
        }
        rc
    })
}

unsafe extern "C" fn f_check_reserved_lock(f: *mut ffi::sqlite3_file, out: *mut c_int) -> c_int {
    guarded(ffi::SQLITE_IOERR_CHECKRESERVEDLOCK, || {
        // SAFETY: a file opened through us.
        let (t, _) = unsafe { parts(f) };
        delegate!(t, xCheckReservedLock, out)
    })
}

unsafe extern "C" fn f_file_control(
    f: *mut ffi::sqlite3_file,
    op: c_int,
    arg: *mut c_void,
) -> c_int {
    guarded(ffi::SQLITE_IOERR, || {
        // SAFETY: a file opened through us.
        let (t, d) = unsafe { parts(f) };
        match op {
            ffi::SQLITE_FCNTL_VFSNAME if !arg.is_null() => {
                let name = match d {
                    Some(d) => format!("{VFS_NAME}({})", config::mode_name(d.cfg.mode)),
                    None => format!("{VFS_NAME}(unpooled)"),
                };
                // SAFETY: SQLite passes a `char**` for the (sqlite3_malloc'd) name.
                unsafe { *arg.cast::<*mut c_char>() = sqlite_string(&name) };
                return ffi::SQLITE_OK;
            }
            ffi::SQLITE_FCNTL_MMAP_SIZE if d.is_some() => {
                // Memory-mapped reads would bypass the pool: none.
                if !arg.is_null() {
                    // SAFETY: SQLite passes an `i64*` (the size asked, the size granted).
                    unsafe { *arg.cast::<i64>() = 0 };
                }
                return ffi::SQLITE_OK;
            }
            ffi::SQLITE_FCNTL_PRAGMA if !arg.is_null() => {
                // SAFETY: SQLite passes `char *azArg[3]`: result, pragma name, argument.
                let az = arg.cast::<*mut c_char>();
                // SAFETY: azArg[1] is the pragma's NUL-terminated name.
                let name = unsafe { *az.add(1) };
                let is_ours = !name.is_null()
                    // SAFETY: as above.
                    && unsafe { CStr::from_ptr(name) }
                        .to_bytes()
                        .eq_ignore_ascii_case(STATS_PRAGMA.as_bytes());
                if is_ours {
                    let text = match d {
                        Some(d) => serde_json::to_string(&d.report()).unwrap_or_default(),
                        None => "{\"pooled\":false}".to_string(),
                    };
                    // SAFETY: azArg[0] takes a sqlite3_malloc'd result string.
                    unsafe { *az = sqlite_string(&text) };
                    return ffi::SQLITE_OK;
                }
            }
            _ => {}
        }
        delegate!(t, xFileControl, op, arg)
    })
}

unsafe extern "C" fn f_sector_size(f: *mut ffi::sqlite3_file) -> c_int {
    guarded(4096, || {
        // SAFETY: a file opened through us.
        let (t, _) = unsafe { parts(f) };
        let real = t.real;
        // SAFETY: the open unix file's method on its own object.
        match unsafe { rm(real) }.xSectorSize {
            // SAFETY: as above.
            Some(m) => unsafe { m(real) },
            None => 4096,
        }
    })
}

/// `SQLITE_IOCAP_BATCH_ATOMIC` (3.21; newer than the bindings): F2FS atomic batches through
/// the unix file's descriptor, which the pool's writes would not be part of.
const IOCAP_BATCH_ATOMIC: c_int = 0x4000;

unsafe extern "C" fn f_device_characteristics(f: *mut ffi::sqlite3_file) -> c_int {
    guarded(0, || {
        // SAFETY: a file opened through us.
        let (t, d) = unsafe { parts(f) };
        let real = t.real;
        // SAFETY: the open unix file's method on its own object.
        let caps = match unsafe { rm(real) }.xDeviceCharacteristics {
            // SAFETY: as above.
            Some(m) => unsafe { m(real) },
            None => 0,
        };
        if d.is_some() {
            caps & !IOCAP_BATCH_ATOMIC
        } else {
            caps
        }
    })
}

unsafe extern "C" fn f_shm_map(
    f: *mut ffi::sqlite3_file,
    pg: c_int,
    pgsz: c_int,
    extend: c_int,
    pp: *mut *mut c_void,
) -> c_int {
    guarded(ffi::SQLITE_IOERR_SHMMAP, || {
        // SAFETY: a file opened through us.
        let (t, _) = unsafe { parts(f) };
        // The pointer type of `pp` differs between binding versions (volatile or not).
        delegate!(t, xShmMap, pg, pgsz, extend, pp.cast())
    })
}

unsafe extern "C" fn f_shm_lock(
    f: *mut ffi::sqlite3_file,
    offset: c_int,
    n: c_int,
    flags: c_int,
) -> c_int {
    guarded(ffi::SQLITE_IOERR_SHMLOCK, || {
        // SAFETY: a file opened through us.
        let (t, d) = unsafe { parts(f) };
        let covers_ckpt = offset <= SHM_CKPT && SHM_CKPT < offset + n;
        let unlock_excl = ffi::SQLITE_SHM_UNLOCK | ffi::SQLITE_SHM_EXCLUSIVE;
        let lock_excl = ffi::SQLITE_SHM_LOCK | ffi::SQLITE_SHM_EXCLUSIVE;
        let lock_shared = ffi::SQLITE_SHM_LOCK | ffi::SQLITE_SHM_SHARED;
        if let Some(d) = d {
            if flags == unlock_excl && covers_ckpt && t.ckpt {
                // The end of a checkpoint: its pages reach the file before the lock goes.
                if let Err(e) = d.flush().and_then(|()| d.record()) {
                    eprintln!("tiermem vfs: write-back of {}: {e}", d.path.display());
                    return io_code(&e, ffi::SQLITE_IOERR_SHMLOCK);
                }
            }
        }
        let rc = delegate!(t, xShmLock, offset, n, flags);
        if rc != ffi::SQLITE_OK {
            return rc;
        }
        if let Some(d) = d {
            if flags == lock_excl && covers_ckpt && !t.ckpt {
                t.ckpt = true;
                d.ckpt.fetch_add(1, Ordering::AcqRel);
            } else if flags == unlock_excl && covers_ckpt && t.ckpt {
                t.ckpt = false;
                d.ckpt.fetch_sub(1, Ordering::AcqRel);
            } else if flags == lock_shared {
                if let Err(e) = d.revalidate() {
                    eprintln!("tiermem vfs: checking {}: {e}", d.path.display());
                    return io_code(&e, ffi::SQLITE_IOERR_SHMLOCK);
                }
            }
        }
        ffi::SQLITE_OK
    })
}

unsafe extern "C" fn f_shm_barrier(f: *mut ffi::sqlite3_file) {
    let _ = catch_unwind(AssertUnwindSafe(|| {
        // SAFETY: a file opened through us.
        let (t, _) = unsafe { parts(f) };
        let real = t.real;
        // SAFETY: the open unix file's method on its own object.
        if let Some(m) = unsafe { rm(real) }.xShmBarrier {
            // SAFETY: as above.
            unsafe { m(real) }
        }
    }));
}

unsafe extern "C" fn f_shm_unmap(f: *mut ffi::sqlite3_file, delete: c_int) -> c_int {
    guarded(ffi::SQLITE_IOERR_SHMMAP, || {
        // SAFETY: a file opened through us.
        let (t, d) = unsafe { parts(f) };
        if let (Some(d), true) = (d, t.ckpt) {
            t.ckpt = false;
            d.ckpt.fetch_sub(1, Ordering::AcqRel);
        }
        delegate!(t, xShmUnmap, delete)
    })
}

// ---------------------------------------------------------------------------------------------
// The VFS methods
// ---------------------------------------------------------------------------------------------

/// The wrapped (unix) VFS.
///
/// # Safety
/// `v` is our registered VFS.
unsafe fn real_vfs(v: *mut ffi::sqlite3_vfs) -> *mut ffi::sqlite3_vfs {
    // SAFETY: our VFS's pAppData is the wrapped VFS, set at registration.
    unsafe { (*v).pAppData.cast() }
}

unsafe extern "C" fn x_open(
    vfs: *mut ffi::sqlite3_vfs,
    name: *const c_char,
    file: *mut ffi::sqlite3_file,
    flags: c_int,
    out_flags: *mut c_int,
) -> c_int {
    guarded(ffi::SQLITE_CANTOPEN, || {
        // SAFETY: SQLite calls us with our own VFS.
        let real = unsafe { real_vfs(vfs) };
        // SAFETY: the wrapped VFS is registered and has xOpen (checked at registration).
        let open = unsafe { (*real).xOpen }.expect("the wrapped VFS has xOpen");
        let pooled = flags & ffi::SQLITE_OPEN_MAIN_DB != 0
            && !name.is_null()
            && flags & ffi::SQLITE_OPEN_READONLY == 0;
        if !pooled {
            // Journals, WAL, temporary files: the unix object itself, at offset 0 (our
            // szOsFile is larger than its).
            // SAFETY: forwarding SQLite's arguments to the wrapped VFS.
            return unsafe { open(real, name, file, flags, out_flags) };
        }
        let t = file.cast::<TmFile>();
        // SAFETY: SQLite gives us szOsFile bytes at `file`: room for TmFile and the unix
        // object at REAL_OFF.
        let real_file = unsafe { file.cast::<u8>().add(REAL_OFF).cast::<ffi::sqlite3_file>() };
        // SAFETY: as above; writing our header before anything reads it.
        unsafe {
            t.write(TmFile {
                base: ffi::sqlite3_file {
                    pMethods: std::ptr::null(),
                },
                db: std::ptr::null(),
                real: real_file,
                lock: ffi::SQLITE_LOCK_NONE,
                ckpt: false,
            })
        };
        let mut got = flags;
        // SAFETY: forwarding to the wrapped VFS with our inner object.
        let rc = unsafe { open(real, name, real_file, flags, &mut got) };
        if !out_flags.is_null() {
            // SAFETY: SQLite's out-pointer.
            unsafe { *out_flags = got };
        }
        if rc != ffi::SQLITE_OK {
            return rc;
        }
        // SAFETY: `t` initialised above.
        let tm = unsafe { &mut *t };
        if got & ffi::SQLITE_OPEN_READONLY == 0 {
            // SAFETY: `name` is the main database's name; `real_file` is open.
            match unsafe { open_db(name, real_file) } {
                Ok(d) => tm.db = Arc::into_raw(d),
                Err(msg) => {
                    eprintln!("tiermem vfs: cannot open the buffer pool: {msg}");
                    // SAFETY: closing the unix object we opened; SQLite will not call our
                    // xClose (pMethods stays null).
                    unsafe {
                        if let Some(c) = rm(real_file).xClose {
                            c(real_file);
                        }
                    }
                    return ffi::SQLITE_CANTOPEN;
                }
            }
        }
        tm.base.pMethods = &POOLED_METHODS;
        ffi::SQLITE_OK
    })
}

macro_rules! vfs_delegate {
    ($v:expr, $m:ident, $err:expr $(, $a:expr)*) => {{
        // SAFETY: SQLite calls us with our own VFS.
        let real = unsafe { real_vfs($v) };
        // SAFETY: the wrapped VFS is registered; we forward SQLite's arguments with it.
        match unsafe { (*real).$m } {
            // SAFETY: as above.
            Some(m) => unsafe { m(real $(, $a)*) },
            None => $err,
        }
    }};
}

unsafe extern "C" fn x_delete(
    v: *mut ffi::sqlite3_vfs,
    name: *const c_char,
    sync_dir: c_int,
) -> c_int {
    guarded(ffi::SQLITE_IOERR_DELETE, || {
        vfs_delegate!(v, xDelete, ffi::SQLITE_IOERR_DELETE, name, sync_dir)
    })
}

unsafe extern "C" fn x_access(
    v: *mut ffi::sqlite3_vfs,
    name: *const c_char,
    flags: c_int,
    out: *mut c_int,
) -> c_int {
    guarded(ffi::SQLITE_IOERR_ACCESS, || {
        vfs_delegate!(v, xAccess, ffi::SQLITE_IOERR_ACCESS, name, flags, out)
    })
}

unsafe extern "C" fn x_full_pathname(
    v: *mut ffi::sqlite3_vfs,
    name: *const c_char,
    n: c_int,
    out: *mut c_char,
) -> c_int {
    guarded(ffi::SQLITE_CANTOPEN, || {
        vfs_delegate!(v, xFullPathname, ffi::SQLITE_CANTOPEN, name, n, out)
    })
}

unsafe extern "C" fn x_dl_open(v: *mut ffi::sqlite3_vfs, name: *const c_char) -> *mut c_void {
    catch_unwind(AssertUnwindSafe(|| {
        vfs_delegate!(v, xDlOpen, std::ptr::null_mut(), name)
    }))
    .unwrap_or(std::ptr::null_mut())
}

unsafe extern "C" fn x_dl_error(v: *mut ffi::sqlite3_vfs, n: c_int, out: *mut c_char) {
    let _ = catch_unwind(AssertUnwindSafe(|| vfs_delegate!(v, xDlError, (), n, out)));
}

/// What the binding calls `xDlSym`'s result (the C type is `void (*)(void)`; the binding
/// spells the pointer with the method's own parameters). Passed through untouched.
type DlSymResult = Option<unsafe extern "C" fn(*mut ffi::sqlite3_vfs, *mut c_void, *const c_char)>;

unsafe extern "C" fn x_dl_sym(
    v: *mut ffi::sqlite3_vfs,
    h: *mut c_void,
    sym: *const c_char,
) -> DlSymResult {
    catch_unwind(AssertUnwindSafe(|| vfs_delegate!(v, xDlSym, None, h, sym))).unwrap_or(None)
}

unsafe extern "C" fn x_dl_close(v: *mut ffi::sqlite3_vfs, h: *mut c_void) {
    let _ = catch_unwind(AssertUnwindSafe(|| vfs_delegate!(v, xDlClose, (), h)));
}

unsafe extern "C" fn x_randomness(v: *mut ffi::sqlite3_vfs, n: c_int, out: *mut c_char) -> c_int {
    guarded(0, || vfs_delegate!(v, xRandomness, 0, n, out))
}

unsafe extern "C" fn x_sleep(v: *mut ffi::sqlite3_vfs, us: c_int) -> c_int {
    guarded(0, || vfs_delegate!(v, xSleep, 0, us))
}

unsafe extern "C" fn x_current_time(v: *mut ffi::sqlite3_vfs, out: *mut f64) -> c_int {
    guarded(ffi::SQLITE_ERROR, || {
        vfs_delegate!(v, xCurrentTime, ffi::SQLITE_ERROR, out)
    })
}

unsafe extern "C" fn x_get_last_error(
    v: *mut ffi::sqlite3_vfs,
    n: c_int,
    out: *mut c_char,
) -> c_int {
    guarded(0, || vfs_delegate!(v, xGetLastError, 0, n, out))
}

unsafe extern "C" fn x_current_time_int64(
    v: *mut ffi::sqlite3_vfs,
    out: *mut ffi::sqlite3_int64,
) -> c_int {
    guarded(ffi::SQLITE_ERROR, || {
        vfs_delegate!(v, xCurrentTimeInt64, ffi::SQLITE_ERROR, out)
    })
}

unsafe extern "C" fn x_set_system_call(
    v: *mut ffi::sqlite3_vfs,
    name: *const c_char,
    p: ffi::sqlite3_syscall_ptr,
) -> c_int {
    guarded(ffi::SQLITE_ERROR, || {
        vfs_delegate!(v, xSetSystemCall, ffi::SQLITE_NOTFOUND, name, p)
    })
}

unsafe extern "C" fn x_get_system_call(
    v: *mut ffi::sqlite3_vfs,
    name: *const c_char,
) -> ffi::sqlite3_syscall_ptr {
    catch_unwind(AssertUnwindSafe(|| {
        vfs_delegate!(v, xGetSystemCall, None, name)
    }))
    .unwrap_or(None)
}

unsafe extern "C" fn x_next_system_call(
    v: *mut ffi::sqlite3_vfs,
    name: *const c_char,
) -> *const c_char {
    catch_unwind(AssertUnwindSafe(|| {
        vfs_delegate!(v, xNextSystemCall, std::ptr::null(), name)
    }))
    .unwrap_or(std::ptr::null())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The routine-table positions match the installed sqlite3ext.h (skipped without it).
    #[test]
    fn routine_table_positions_match_the_header() {
        let Ok(h) = std::fs::read_to_string("/usr/include/sqlite3ext.h") else {
            eprintln!("SKIPPED: no /usr/include/sqlite3ext.h");
            return;
        };
        let start = h.find("struct sqlite3_api_routines {").unwrap();
        let end = start + h[start..].find("};").unwrap();
        let mut body = String::new();
        // Strip comments.
        let mut rest = &h[start..end];
        while let Some(i) = rest.find("/*") {
            body.push_str(&rest[..i]);
            rest = &rest[i + rest[i..].find("*/").unwrap() + 2..];
        }
        body.push_str(rest);
        let body = &body[body.find('{').unwrap() + 1..];
        let names: Vec<String> = body
            .split(';')
            .filter(|d| !d.trim().is_empty())
            .map(|d| {
                let i = d.find("(*").expect("a function pointer") + 2;
                d[i..].split(')').next().unwrap().trim().to_string()
            })
            .collect();
        let at = |n: &str| names.iter().position(|x| x == n).unwrap();
        assert_eq!(at("malloc"), API_MALLOC);
        assert_eq!(at("vfs_find"), API_VFS_FIND);
        assert_eq!(at("vfs_register"), API_VFS_REGISTER);
        assert_eq!(at("uri_parameter"), API_URI_PARAMETER);
    }
}
