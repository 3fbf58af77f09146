//! iocache-vfs: SQLite on the iocache buffer pool — a VFS named `tiermem` whose main database
//! files read and write through a [`tiermem_iocache::Pool`] (buffered, direct or DBIO), and a
//! TPC-C-like driver ([`tpcc`]) to compare the modes on a real database engine (paper `002`,
//! Ch. 3: TPC-C on MySQL, buffered vs direct vs DBIO at equal buffer-pool size).
//!
//! Two ways in:
//! * **In process**: [`register`]`(make_default)`, then open databases with the VFS `tiermem`
//!   (or as the default). Links the system libsqlite3 (no bundled copy).
//! * **Loadable extension**: `libtiermem_iocache_vfs.so` exports `sqlite3_extension_init` (and
//!   `sqlite3_tiermemiocachevfs_init`); loading it registers the VFS as the default for the
//!   connections opened *after* it, e.g. in the unmodified shell:
//!   `sqlite3 :memory: '.load libtiermem_iocache_vfs' '.open data.db' 'PRAGMA integrity_check'`
//!   (a database named on the shell's command line is opened before `.load` runs, with the
//!   unix VFS; `.open` after the load, or a `file:data.db?vfs=tiermem` URI, goes through ours).
//!
//! Each pooled file's pool is configured at its first open in the process by URI parameters
//! (`iocache_mode`, `iocache_pool`, `iocache_budget`, `iocache_enforce`) or else the variables
//! `TIERMEM_IOCACHE_MODE` (`buffered|direct|dbio`, default `dbio`), `TIERMEM_IOCACHE_POOL`
//! (bytes, `K`/`M`/`G` suffixes, default 16M), `TIERMEM_IOCACHE_BUDGET` (default 4 × pool),
//! `TIERMEM_IOCACHE_ENFORCE` (`0`: a memory cgroup keeps the budget). `PRAGMA tiermem_iocache`
//! returns the pool's counters as JSON, `.vfsname` in the shell says `tiermem(MODE)`.
//!
//! Files: [`vfs`] (the VFS and its file objects), [`config`] (settings), [`tpcc`] (the
//! driver), `src/bin/tpcc.rs` (`tiermem-tpcc load|run|check`).

#![warn(missing_docs)]

pub mod config;
pub mod tpcc;
pub mod vfs;

pub use config::Config;
pub use vfs::{pool_report, PoolReport, STATS_PRAGMA, VFS_NAME};

use rusqlite::ffi;
use std::ffi::{c_char, c_int, c_void};

/// Registers the `tiermem` VFS with the SQLite this process links (wrapping its unix VFS);
/// `make_default` also makes it the default VFS for connections opened afterwards. Safe to call
/// more than once (a later call with `make_default` moves it to the front). Errors: SQLite has
/// no VFS to wrap, or `sqlite3_vfs_register` failed.
pub fn register(make_default: bool) -> Result<(), String> {
    vfs::register_with_linked(make_default)
}

/// The extension entry point for hosts loading `libtiermem_iocache_vfs.so`: registers the VFS
/// (as the default) through the host's routine table and returns
/// `SQLITE_OK_LOAD_PERMANENTLY` (the VFS must outlive the loading connection).
///
/// # Safety
/// Called by SQLite's extension loader: `p_api` is its `sqlite3_api_routines` table and
/// `pz_err_msg` null or a place for a `sqlite3_malloc`'d message.
#[no_mangle]
pub unsafe extern "C" fn sqlite3_extension_init(
    _db: *mut ffi::sqlite3,
    pz_err_msg: *mut *mut c_char,
    p_api: *const c_void,
) -> c_int {
    std::panic::catch_unwind(|| {
        // SAFETY: the loader's routine table.
        let Some(api) = (unsafe { vfs::Api::from_routines(p_api) }) else {
            return ffi::SQLITE_ERROR;
        };
        match vfs::register_with(api, true) {
            Ok(()) => ffi::SQLITE_OK_LOAD_PERMANENTLY,
            Err(e) => {
                if !pz_err_msg.is_null() {
                    // SAFETY: the loader's out-pointer for a sqlite3_malloc'd message.
                    unsafe { *pz_err_msg = vfs::sqlite_string(&format!("tiermem vfs: {e}")) };
                }
                ffi::SQLITE_ERROR
            }
        }
    })
    .unwrap_or(ffi::SQLITE_ERROR)
}

/// The same entry point under the name SQLite derives from the library's file name
/// (`sqlite3_` + `tiermemiocachevfs` + `_init`).
///
/// # Safety
/// As [`sqlite3_extension_init`].
#[no_mangle]
pub unsafe extern "C" fn sqlite3_tiermemiocachevfs_init(
    db: *mut ffi::sqlite3,
    pz_err_msg: *mut *mut c_char,
    p_api: *const c_void,
) -> c_int {
    // SAFETY: forwarded caller guarantees.
    unsafe { sqlite3_extension_init(db, pz_err_msg, p_api) }
}
