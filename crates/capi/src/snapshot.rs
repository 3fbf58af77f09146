//! C ABI of snapshots (`tiermem-snapshot`, issue #17): snapshot-able memory, a snapshot taken
//! in the caller's pause and dumped in the background, and the checked reader.
//!
//! Errno mapping: malformed arguments -EINVAL; memory in a running snapshot -EBUSY; a corrupt
//! or foreign file -EBADMSG (the last error names the failed check); no space on the target's
//! file system -ENOSPC; a snapshot aborted (a region changed, a failed write) -ECANCELED;
//! userfaultfd unavailable -ENOTSUP; other system errors their errno.

use crate::error::{cstr, fail, guard, handles};
use std::ffi::{c_char, c_int, c_void};
use std::path::Path;
use tiermem_snapshot::{
    begin, begin_paused, Job, Memory, Method, Options, SnapshotError, SnapshotFile, Target,
};

/// Snapshot-able memory (opaque).
pub struct TiermemSnapshotMemory {
    mem: Memory,
}

/// A running snapshot (opaque).
pub struct TiermemSnapshotJob {
    job: Option<Job<'static>>,
}

/// What a finished snapshot reports (`tiermem_snapshot_wait`).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct TiermemSnapshotReport {
    /// The file's length.
    pub file_bytes: u64,
    /// Pages stored.
    pub present_pages: u64,
    /// 256 KiB units in all.
    pub units: u64,
    /// The pause inside `tiermem_snapshot_begin`, ns.
    pub pause_ns: u64,
    /// From the start of the pause to the durable, renamed file, ns.
    pub total_ns: u64,
    /// Units the dumper copied and wrote.
    pub dumped_units: u64,
    /// Units a writer staged in a slot.
    pub staged_units: u64,
    /// Units a writer wrote to the file itself (no slot free).
    pub self_written_units: u64,
    /// The bound on extra memory, bytes.
    pub extra_bytes_bound: u64,
    /// Pages a writer spilled (copied alone before its unit was dumped).
    pub spilled_pages: u64,
}

fn snap_fail(e: SnapshotError) -> c_int {
    let errno = e.errno();
    fail(errno, e)
}

/// Maps `len` bytes (rounded up to pages) of zeroed memory named `name` that snapshots can
/// cover; its address goes to `*addr`, its handle to `*out`. Returns 0 or a negative errno.
#[no_mangle]
pub extern "C" fn tiermem_snapshot_memory_map(
    name: *const c_char,
    len: usize,
    addr: *mut *mut c_void,
    out: *mut *mut TiermemSnapshotMemory,
) -> c_int {
    guard("tiermem_snapshot_memory_map", || {
        let name = match cstr(name, "name") {
            Ok(n) => n,
            Err(e) => return e,
        };
        if addr.is_null() || out.is_null() {
            return fail(libc::EINVAL, "addr or out is NULL");
        }
        match Memory::map(name, len) {
            Ok(mem) => {
                // SAFETY: addr and out were checked non-NULL (ABI contract: writable).
                unsafe {
                    *addr = mem.as_ptr().cast();
                    *out = handles::issue(TiermemSnapshotMemory { mem });
                }
                0
            }
            Err(e) => snap_fail(e),
        }
    })
}

/// Unmaps memory and frees its handle; -EBUSY while a snapshot of it runs.
#[no_mangle]
pub extern "C" fn tiermem_snapshot_memory_free(m: *mut TiermemSnapshotMemory) -> c_int {
    guard("tiermem_snapshot_memory_free", || {
        match handles::get(m, "snapshot memory") {
            Ok(h) if h.mem.in_snapshot() => {
                return fail(
                    libc::EBUSY,
                    "the memory is in a running snapshot: wait for or abort it first",
                )
            }
            Ok(_) => {}
            Err(e) => return e,
        }
        match handles::take(m, "snapshot memory") {
            Ok(h) => {
                drop(h);
                0
            }
            Err(e) => e,
        }
    })
}

/// Method `wp`: fork-less copy-before-write, extra memory bounded by the staging slots.
pub const TIERMEM_SNAPSHOT_WP: u32 = 0;
/// Method `fork-mdc`: a forked child dumps and drops each unit once written (MDC's baseline).
pub const TIERMEM_SNAPSHOT_FORK_MDC: u32 = 1;
/// Method `fork`: a forked child dumps; the kernel copies what the parent writes meanwhile.
pub const TIERMEM_SNAPSHOT_FORK: u32 = 2;
/// Flag or'ed into the method: the target is an NVM pool file (a media pool, kind NVM), not a
/// plain file.
pub const TIERMEM_SNAPSHOT_NVM_POOL: u32 = 0x100;

/// Begins a snapshot of the `n` memories `mems` into `target` with `app_len` bytes of `app`
/// saved beside them, by `method` (`TIERMEM_SNAPSHOT_WP`, `_FORK_MDC`, `_FORK`) with
/// `staging_slots` slots of 256 KiB for `wp` (16 is the default; 0..=64). Call it with the
/// application's writers paused; it returns once the point in time is fixed (`wp`: the pages
/// protected; fork methods: the child forked), and the job dumps in the background (`tiermem_snapshot_wait`). The memories must stay mapped until
/// the job is waited for or aborted (`tiermem_snapshot_memory_free` refuses until then).
#[no_mangle]
pub extern "C" fn tiermem_snapshot_begin(
    mems: *const *mut TiermemSnapshotMemory,
    n: usize,
    target: *const c_char,
    app: *const c_void,
    app_len: usize,
    staging_slots: u32,
    method: u32,
    out: *mut *mut TiermemSnapshotJob,
) -> c_int {
    guard("tiermem_snapshot_begin", || {
        start(
            mems,
            n,
            target,
            app,
            app_len,
            (staging_slots, method),
            out,
            begin,
        )
    })
}

/// A pause or resume callback of `tiermem_snapshot_begin_paused`.
pub type TiermemSnapshotPauseFn = Option<extern "C" fn(arg: *mut c_void)>;

/// Calls the resume callback when dropped (the end of the pause).
struct ResumeGuard {
    resume: extern "C" fn(*mut c_void),
    arg: *mut c_void,
}

impl Drop for ResumeGuard {
    fn drop(&mut self) {
        (self.resume)(self.arg);
    }
}

/// As `tiermem_snapshot_begin`, called with the writers running: the file is created and the
/// staging slots allocated first, then `pause(arg)` is called (it must return with the
/// application's writers paused) and `resume(arg)` once the pages are protected, on this
/// thread, also when the snapshot fails after the pause. `report.pause_ns` of the job is the
/// time between the two.
#[no_mangle]
pub extern "C" fn tiermem_snapshot_begin_paused(
    mems: *const *mut TiermemSnapshotMemory,
    n: usize,
    target: *const c_char,
    app: *const c_void,
    app_len: usize,
    staging_slots: u32,
    method: u32,
    pause: TiermemSnapshotPauseFn,
    resume: TiermemSnapshotPauseFn,
    arg: *mut c_void,
    out: *mut *mut TiermemSnapshotJob,
) -> c_int {
    guard("tiermem_snapshot_begin_paused", || {
        let (Some(pause), Some(resume)) = (pause, resume) else {
            return fail(libc::EINVAL, "pause or resume is NULL");
        };
        start(
            mems,
            n,
            target,
            app,
            app_len,
            (staging_slots, method),
            out,
            |list, target, app, opts| {
                begin_paused(list, target, app, opts, || {
                    pause(arg);
                    ResumeGuard { resume, arg }
                })
            },
        )
    })
}

/// The argument checks and handle plumbing both begin functions share.
#[allow(clippy::too_many_arguments)]
fn start(
    mems: *const *mut TiermemSnapshotMemory,
    n: usize,
    target: *const c_char,
    app: *const c_void,
    app_len: usize,
    (staging_slots, method): (u32, u32),
    out: *mut *mut TiermemSnapshotJob,
    how: impl FnOnce(&[&'static Memory], &Path, Vec<u8>, Options) -> Result<Job<'static>, SnapshotError>,
) -> c_int {
    if mems.is_null() || n == 0 || out.is_null() || (app.is_null() && app_len > 0) {
        return fail(libc::EINVAL, "mems, n, out or app is NULL or empty");
    }
    let target = match cstr(target, "target") {
        Ok(t) => t,
        Err(e) => return e,
    };
    let mut list: Vec<&'static Memory> = Vec::with_capacity(n);
    for i in 0..n {
        // SAFETY: mems points to n handle pointers (ABI contract).
        let p = unsafe { *mems.add(i) };
        match handles::get(p, "snapshot memory") {
            // SAFETY: the handle stays alive while the job runs: memory_free refuses a
            // memory in a running snapshot, and the job ends before its handle is freed.
            Ok(h) => list.push(unsafe { &*(&h.mem as *const Memory) }),
            Err(e) => return e,
        }
    }
    let app = if app_len == 0 {
        Vec::new()
    } else {
        // SAFETY: app points to app_len readable bytes (ABI contract).
        unsafe { std::slice::from_raw_parts(app as *const u8, app_len) }.to_vec()
    };
    let kind = if method & TIERMEM_SNAPSHOT_NVM_POOL != 0 {
        Target::NvmPool
    } else {
        Target::File
    };
    let method = match method & !TIERMEM_SNAPSHOT_NVM_POOL {
        TIERMEM_SNAPSHOT_WP => Method::Wp,
        TIERMEM_SNAPSHOT_FORK_MDC => Method::ForkMdc,
        TIERMEM_SNAPSHOT_FORK => Method::Fork,
        m => return fail(libc::EINVAL, format!("unknown snapshot method {m}")),
    };
    let opts = Options {
        staging_slots: staging_slots as usize,
        method,
        target: kind,
    };
    match how(&list, Path::new(target), app, opts) {
        Ok(job) => {
            // SAFETY: out was checked non-NULL.
            unsafe { *out = handles::issue(TiermemSnapshotJob { job: Some(job) }) };
            0
        }
        Err(e) => snap_fail(e),
    }
}

/// Units done and in all of a running snapshot.
#[no_mangle]
pub extern "C" fn tiermem_snapshot_progress(
    j: *const TiermemSnapshotJob,
    done: *mut u64,
    total: *mut u64,
) -> c_int {
    guard("tiermem_snapshot_progress", || {
        let h = match handles::get(j, "snapshot job") {
            Ok(h) => h,
            Err(e) => return e,
        };
        let Some(job) = h.job.as_ref() else {
            return fail(libc::EINVAL, "the job has ended");
        };
        let (d, t) = job.progress();
        // SAFETY: non-NULL outputs point to writable u64s (ABI contract).
        unsafe {
            if !done.is_null() {
                *done = d as u64;
            }
            if !total.is_null() {
                *total = t as u64;
            }
        }
        0
    })
}

/// Waits for the snapshot, makes the file durable and renames it over the target, fills
/// `*report` (may be NULL) and frees the job. On an error the previous file at the target is
/// intact and no page stays protected; the job is freed either way.
#[no_mangle]
pub extern "C" fn tiermem_snapshot_wait(
    j: *mut TiermemSnapshotJob,
    report: *mut TiermemSnapshotReport,
) -> c_int {
    guard("tiermem_snapshot_wait", || {
        let mut h = match handles::take(j, "snapshot job") {
            Ok(h) => h,
            Err(e) => return e,
        };
        let Some(job) = h.job.take() else {
            return fail(libc::EINVAL, "the job has ended");
        };
        match job.wait() {
            Ok(r) => {
                if !report.is_null() {
                    // SAFETY: a non-NULL report points to a writable struct (ABI contract).
                    unsafe {
                        *report = TiermemSnapshotReport {
                            file_bytes: r.file_bytes,
                            present_pages: r.present_pages,
                            units: r.units as u64,
                            pause_ns: r.pause.as_nanos() as u64,
                            total_ns: r.total.as_nanos() as u64,
                            dumped_units: r.dumped_units,
                            staged_units: r.staged_units,
                            self_written_units: r.self_written_units,
                            extra_bytes_bound: r.extra_bytes_bound,
                            spilled_pages: r.spilled_pages,
                        }
                    };
                }
                0
            }
            Err(e) => snap_fail(e),
        }
    })
}

/// Aborts a snapshot: everything unprotected, the temporary file removed, the job freed.
#[no_mangle]
pub extern "C" fn tiermem_snapshot_abort(j: *mut TiermemSnapshotJob) -> c_int {
    guard("tiermem_snapshot_abort", || {
        match handles::take(j, "snapshot job") {
            Ok(mut h) => {
                if let Some(job) = h.job.take() {
                    job.abort();
                }
                0
            }
            Err(e) => e,
        }
    })
}

/// Checks a snapshot file completely (header, trailer, index, every unit's and the
/// application state's CRC). 0 when intact; -EBADMSG naming the failed check otherwise.
#[no_mangle]
pub extern "C" fn tiermem_snapshot_verify(path: *const c_char) -> c_int {
    guard("tiermem_snapshot_verify", || {
        let path = match cstr(path, "path") {
            Ok(p) => p,
            Err(e) => return e,
        };
        match SnapshotFile::open(Path::new(path)).and_then(|f| f.verify()) {
            Ok(()) => 0,
            Err(e) => snap_fail(e),
        }
    })
}

/// Restores region `region` (0-based, in the order given to begin) of the snapshot at `path`
/// into the `len` bytes at `dst` (exactly the region's length). Units are CRC-checked first.
#[no_mangle]
pub extern "C" fn tiermem_snapshot_restore(
    path: *const c_char,
    region: usize,
    dst: *mut c_void,
    len: usize,
) -> c_int {
    guard("tiermem_snapshot_restore", || {
        let path = match cstr(path, "path") {
            Ok(p) => p,
            Err(e) => return e,
        };
        if dst.is_null() {
            return fail(libc::EINVAL, "dst is NULL");
        }
        // SAFETY: dst points to len writable bytes (ABI contract).
        let out = unsafe { std::slice::from_raw_parts_mut(dst as *mut u8, len) };
        match SnapshotFile::open(Path::new(path)).and_then(|f| f.restore_into(region, out)) {
            Ok(()) => 0,
            Err(e) => snap_fail(e),
        }
    })
}

/// Copies the snapshot's application state into `buf` (capacity `cap`) and its length into
/// `*len`; -ERANGE (with `*len` set) when `cap` is too small.
#[no_mangle]
pub extern "C" fn tiermem_snapshot_app_state(
    path: *const c_char,
    buf: *mut c_void,
    cap: usize,
    len: *mut usize,
) -> c_int {
    guard("tiermem_snapshot_app_state", || {
        let path = match cstr(path, "path") {
            Ok(p) => p,
            Err(e) => return e,
        };
        if len.is_null() || (buf.is_null() && cap > 0) {
            return fail(libc::EINVAL, "len or buf is NULL");
        }
        match SnapshotFile::open(Path::new(path)).and_then(|f| f.app_state()) {
            Ok(a) => {
                // SAFETY: len is non-NULL (checked), writable (ABI contract).
                unsafe { *len = a.len() };
                if a.len() > cap {
                    return fail(
                        libc::ERANGE,
                        format!("application state of {} bytes, buffer of {cap}", a.len()),
                    );
                }
                // SAFETY: buf has cap ≥ a.len() writable bytes (ABI contract).
                unsafe { std::ptr::copy_nonoverlapping(a.as_ptr(), buf as *mut u8, a.len()) };
                0
            }
            Err(e) => snap_fail(e),
        }
    })
}
