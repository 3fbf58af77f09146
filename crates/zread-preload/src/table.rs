//! Which of the program's fds are served, and the z-READ file behind each.
//!
//! * The fd table is lock-free (atomics indexed by fd number, fds below [`MAX_FD`]): a bit
//!   says the fd was opened on a served file, with that file's device and inode beside it. A
//!   hook's fast path for every other fd is one atomic load. The device and inode are checked
//!   against `fstat` before a read is served, so an fd closed behind the library's back (by
//!   glibc internally, `close_range`, a raw system call) and reused for another file is never
//!   read as the old one.
//! * The files: one [`ZFile`] per served file (device, inode), shared by every fd open on it,
//!   made at the first read that can use it ([`ZFile::from_fd`]), dropped (its lease released)
//!   when the last recorded fd on it closes. Behind one mutex, never held across a read.
//! * Counters for the exit report: the summed [`ZStats`] of the files dropped so far, files
//!   made, reads served, passed on, fallen back.

use parking_lot::Mutex;
use serde_json::{Map, Value};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed, Ordering::SeqCst};
use tiermem_iocache::{ZFile, ZOptions, ZStats};

/// fds at or above this are never served (their calls pass through).
pub const MAX_FD: usize = 1 << 16;

#[allow(clippy::declare_interior_mutable_const)]
const ZERO: AtomicU64 = AtomicU64::new(0);
static BITS: [AtomicU64; MAX_FD / 64] = [ZERO; MAX_FD / 64];
static DEV: [AtomicU64; MAX_FD] = [ZERO; MAX_FD];
static INO: [AtomicU64; MAX_FD] = [ZERO; MAX_FD];

fn slot(fd: libc::c_int) -> Option<usize> {
    usize::try_from(fd).ok().filter(|&f| f < MAX_FD)
}

/// The (device, inode) `fd` was recorded with, if it was.
#[inline]
pub fn recorded(fd: libc::c_int) -> Option<(u64, u64)> {
    let f = slot(fd)?;
    if BITS[f / 64].load(SeqCst) & (1 << (f % 64)) == 0 {
        return None;
    }
    Some((DEV[f].load(Relaxed), INO[f].load(Relaxed)))
}

/// Records `fd` as open on the served file (`dev`, `ino`). False for an fd too large.
pub fn record(fd: libc::c_int, dev: u64, ino: u64) -> bool {
    let Some(f) = slot(fd) else { return false };
    DEV[f].store(dev, Relaxed);
    INO[f].store(ino, Relaxed);
    BITS[f / 64].fetch_or(1 << (f % 64), SeqCst);
    true
}

/// Forgets `fd`; returns the (device, inode) it was recorded with, if it was.
pub fn unrecord(fd: libc::c_int) -> Option<(u64, u64)> {
    let f = slot(fd)?;
    let old = BITS[f / 64].fetch_and(!(1 << (f % 64)), SeqCst);
    if old & (1 << (f % 64)) == 0 {
        return None;
    }
    Some((DEV[f].load(Relaxed), INO[f].load(Relaxed)))
}

enum Z {
    /// No read has needed it yet.
    Pending,
    Ready(ZFile),
    /// `ZFile::from_fd` failed: reads pass through.
    Failed,
}

struct Entry {
    fds: u32,
    z: Z,
}

/// Served files by (device, inode).
static FILES: Mutex<Option<HashMap<(u64, u64), Entry>>> = Mutex::new(None);
/// Summed counters of the files dropped so far.
static TOTALS: Mutex<Option<Map<String, Value>>> = Mutex::new(None);

/// `ZFile`s made in this process.
pub static CREATED: AtomicU64 = AtomicU64::new(0);
/// `ZFile`s that could not be made (the file's reads pass through).
pub static OPEN_FAILURES: AtomicU64 = AtomicU64::new(0);
/// Reads served through `zread_into`.
pub static ROUTED: AtomicU64 = AtomicU64::new(0);
/// Reads of served fds passed to the real call: zero copy impossible for them (unaligned,
/// under a page, a buffer the policy excludes, offset -1 with flags...).
pub static PASSED: AtomicU64 = AtomicU64::new(0);
/// Reads `zread_into` failed (or panicked) on, then done by the real call.
pub static FALLBACKS: AtomicU64 = AtomicU64::new(0);

/// Locks the file table and keeps it locked (the fork-prepare handler: the child must not
/// inherit it locked by a thread that does not exist there). Only tries; false when another
/// thread holds it.
pub fn lock_for_fork() -> bool {
    match FILES.try_lock() {
        Some(g) => {
            std::mem::forget(g);
            true
        }
        None => false,
    }
}

/// Unlocks what [`lock_for_fork`] locked (the fork parent and child handlers).
///
/// # Safety
/// Only after [`lock_for_fork`] returned true, once, on the forking thread.
pub unsafe fn unlock_after_fork() {
    // SAFETY: locked by lock_for_fork, whose guard was forgotten (this function's contract).
    unsafe { FILES.force_unlock() };
}

/// One more recorded fd on (`dev`, `ino`).
pub fn add_fd(dev: u64, ino: u64) {
    let mut g = FILES.lock();
    let e = g
        .get_or_insert_with(HashMap::new)
        .entry((dev, ino))
        .or_insert(Entry {
            fds: 0,
            z: Z::Pending,
        });
    e.fds += 1;
}

/// One recorded fd on (`dev`, `ino`) fewer; when it was the last, the file is forgotten and
/// its `ZFile` dropped here (its lease released), its counters added to the totals.
pub fn remove_fd(dev: u64, ino: u64) {
    let gone = {
        let mut g = FILES.lock();
        let Some(map) = g.as_mut() else { return };
        let Some(e) = map.get_mut(&(dev, ino)) else {
            return;
        };
        e.fds = e.fds.saturating_sub(1);
        if e.fds > 0 {
            return;
        }
        map.remove(&(dev, ino))
    };
    if let Some(Entry { z: Z::Ready(z), .. }) = gone {
        let s = z.stats();
        drop(z);
        let mut t = TOTALS.lock();
        add(t.get_or_insert_with(Map::new), &s);
    }
}

/// The `ZFile` of (`dev`, `ino`), made now from `fd` if no read has needed it yet. `None` when
/// the file is not served (any more) or cannot be opened for z-READ.
pub fn zfile(fd: libc::c_int, dev: u64, ino: u64, opts: &ZOptions) -> Option<ZFile> {
    let mut g = FILES.lock();
    let e = g.as_mut()?.get_mut(&(dev, ino))?;
    match &e.z {
        Z::Ready(z) => Some(z.clone()),
        Z::Failed => None,
        Z::Pending => match ZFile::from_fd(fd, opts.clone()) {
            Ok(z) => {
                CREATED.fetch_add(1, Relaxed);
                e.z = Z::Ready(z.clone());
                Some(z)
            }
            Err(_) => {
                OPEN_FAILURES.fetch_add(1, Relaxed);
                e.z = Z::Failed;
                None
            }
        },
    }
}

/// The file made for (`dev`, `ino`), if it is made already (never makes one: the caller has
/// not checked that an fd still refers to it).
pub fn ready(dev: u64, ino: u64) -> Option<ZFile> {
    let g = FILES.lock();
    match &g.as_ref()?.get(&(dev, ino))?.z {
        Z::Ready(z) => Some(z.clone()),
        _ => None,
    }
}

/// The counters of every file made in this process, summed (dropped and live), and the number
/// of live ones. Only tries the locks (`None` if one is held): it runs at exit, possibly from
/// a signal handler that interrupted a holder.
pub fn summed() -> Option<(Map<String, Value>, usize)> {
    let mut sum = TOTALS.try_lock()?.clone().unwrap_or_default();
    // Every counter appears, zero when no file was dropped yet.
    add(&mut sum, &ZStats::default());
    let g = FILES.try_lock()?;
    let mut live = 0;
    for e in g.iter().flat_map(|m| m.values()) {
        if let Z::Ready(z) = &e.z {
            add(&mut sum, &z.stats());
            live += 1;
        }
    }
    Some((sum, live))
}

/// The counters summed by name: `sum[k] += s[k]` for every counter of `s` (through serde, so
/// a counter added to `ZStats` is summed and reported without a change here).
pub fn add(sum: &mut Map<String, Value>, s: &ZStats) {
    if let Ok(Value::Object(m)) = serde_json::to_value(s) {
        for (k, v) in m {
            let e = sum.entry(k).or_insert(Value::from(0u64));
            *e = Value::from(e.as_u64().unwrap_or(0) + v.as_u64().unwrap_or(0));
        }
    }
}
