//! The shared-memory object of a vnvm instance (thesis §2.4.1–2.4.2): the volatile state every
//! process of the instance shares.
//!
//! `shm_open("/tiermem-vnvm-<hash of the instance directory>")`, mode 0600 (0660 would follow
//! the pools' group sharing). It holds
//!
//! * the instance mutex: a **robust, process-shared** pthread mutex guarding the free stacks,
//!   the owner bytes and the user table. A process killed while holding it hands the next
//!   locker `EOWNERDEAD`; that locker rebuilds the free stacks and the held counts from the
//!   owner bytes (the truth) and marks the mutex consistent;
//! * the user table: one slot per process (app id = slot + 1) with its pid, the pages it holds
//!   (equal-share policy) and its worker counters (read by `tiermem vnvm stats`);
//! * the transaction-id counter (one atomic, no lock);
//! * the free stacks of log pages, log objects and cache pages, and an *owner byte* per page
//!   and per log object: 0 free, `1..=MAX_APPS` the app slot + 1 that holds it, or
//!   [`OWNER_SHARED_BASE`] + s when it belongs to the committed list of shared region slot `s`
//!   (such pages are freed by that region's flush, whichever process runs it);
//! * one slot per shared region: its own robust mutex (commit order and the flush), the users
//!   of the region (a bit per app slot), its pending log pages and who is flushing it.
//!   Each shared region's dirty bitmaps live in a second object `<name>-s<slot>`.
//!
//! Liveness: each process holds an OFD write lock on byte `1 + slot` of the instance's `lock`
//! file for as long as it is a user; the kernel drops it when the process dies, so a probe
//! (`F_OFD_GETLK`) tells a dead user from a live one without trusting pids.
//!
//! Nothing here is persistent: the first process of an instance (after recovery) creates the
//! object, the last one unlinks it.

use crate::error::{io_err, Result};
use crate::layout::Geometry;
use std::ffi::CString;
use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::Path;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicU8, Ordering};

/// Processes that can use one instance at the same time.
pub const MAX_APPS: usize = 16;
/// Shared regions an instance can have allocated at the same time.
pub const MAX_SHARED: usize = 48;
/// Owner byte of a free page / log object.
pub const OWNER_FREE: u8 = 0;
/// Owner byte of a page in the committed list of shared region slot `s`: this + s.
pub const OWNER_SHARED_BASE: u8 = 0x40;

const SHM_MAGIC: u64 = u64::from_le_bytes(*b"VNVMSHM2");
const SHM_VERSION: u32 = 2;

/// App slot states.
pub const SLOT_FREE: u32 = 0;
/// The slot belongs to a running process.
pub const SLOT_LIVE: u32 = 1;

/// One process using the instance.
#[repr(C)]
pub struct AppSlot {
    /// [`SLOT_FREE`] or [`SLOT_LIVE`].
    pub state: AtomicU32,
    /// Its pid (information only: liveness is the OFD lock).
    pub pid: AtomicU32,
    /// Log pages it holds (open and committed-unapplied transactions).
    pub log_held: AtomicU32,
    /// Cache pages it holds (its reserve, dirty and clean lists).
    pub cache_held: AtomicU32,
    /// Committed transactions with at least one write.
    pub commits: AtomicU64,
    /// Committed transactions applied (private) or flushed (shared).
    pub applied: AtomicU64,
    /// Cache pages written back.
    pub pages_written_back: AtomicU64,
    /// Transactions aborted for their age.
    pub age_aborts: AtomicU64,
    /// Shared-region flushes run.
    pub flushes: AtomicU64,
}

/// One shared region.
#[repr(C)]
pub struct SharedSlot {
    /// Serializes the region's commits and the flush's two critical sections.
    pub lock: libc::pthread_mutex_t,
    /// File id + 1 of the region (0: slot free). Changed under the instance mutex.
    pub file: AtomicU32,
    /// App slots using the region (bit per slot). Changed under the instance mutex.
    pub users: AtomicU32,
    /// Log pages in the region's committed list.
    pub pending_pages: AtomicU32,
    /// App slot + 1 of the process flushing it (0: none).
    pub flushing: AtomicU32,
    /// Pages of the region (bitmap bits).
    pub pages: AtomicU64,
}

#[repr(C)]
struct Header {
    magic: u64,
    version: u32,
    geo: [u32; 6],
    _pad: u32,
    lock: libc::pthread_mutex_t,
    next_tid: AtomicU64,
    /// Futex word bumped whenever log pages are freed.
    log_seq: AtomicU32,
    log_waiters: AtomicU32,
    /// Somebody waits for log space: flush shared regions now.
    flush_wanted: AtomicU32,
    users: AtomicU32,
    log_top: AtomicU32,
    obj_top: AtomicU32,
    cache_top: AtomicU32,
    _pad2: u32,
    apps: [AppSlot; MAX_APPS],
    shared: [SharedSlot; MAX_SHARED],
}

fn align8(x: usize) -> usize {
    x.div_ceil(64) * 64
}

/// Offsets of the arrays after the header.
#[derive(Clone, Copy)]
struct Arrays {
    log_owner: usize,
    obj_owner: usize,
    cache_owner: usize,
    log_stack: usize,
    obj_stack: usize,
    cache_stack: usize,
    len: usize,
}

impl Arrays {
    fn new(g: &Geometry) -> Arrays {
        let (l, o, c) = (
            g.log_pages as usize,
            g.log_objs as usize,
            g.cache_pages as usize,
        );
        let log_owner = align8(std::mem::size_of::<Header>());
        let obj_owner = align8(log_owner + l);
        let cache_owner = align8(obj_owner + o);
        let log_stack = align8(cache_owner + c);
        let obj_stack = align8(log_stack + 4 * l);
        let cache_stack = align8(obj_stack + 4 * o);
        let len = (cache_stack + 4 * c).div_ceil(4096) * 4096;
        Arrays {
            log_owner,
            obj_owner,
            cache_owner,
            log_stack,
            obj_stack,
            cache_stack,
            len,
        }
    }
}

/// The three page-like resources the object allocates.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Res {
    /// Log pages.
    Log,
    /// Log objects.
    Obj,
    /// Cache pages.
    Cache,
}

/// A mapped shared-memory object.
pub struct Shm {
    base: *mut u8,
    len: usize,
    arr: Arrays,
    geo: Geometry,
    name: CString,
}

// SAFETY: the mapping is shared memory accessed only through atomics and under the robust
// mutexes it contains; the pointer is valid until Drop.
unsafe impl Send for Shm {}
// SAFETY: see above.
unsafe impl Sync for Shm {}

/// `dir` made absolute and free of symlinks as far as it exists, the rest appended as given:
/// the same path before the directory is created, while it exists, and after it is removed.
fn canonical(dir: &Path) -> std::path::PathBuf {
    let mut base = dir.to_path_buf();
    let mut rest = Vec::new();
    loop {
        let probe = if base.as_os_str().is_empty() {
            Path::new(".")
        } else {
            base.as_path()
        };
        if let Ok(mut p) = std::fs::canonicalize(probe) {
            p.extend(rest.iter().rev());
            return p;
        }
        match (base.parent(), base.file_name()) {
            (Some(parent), Some(name)) => {
                rest.push(name.to_os_string());
                base = parent.to_path_buf();
            }
            _ => return dir.to_path_buf(),
        }
    }
}

/// The file in an instance directory that names the directory the instance's object was last
/// created for (its canonical path). An instance moved after a crash finds there the name of
/// the object its killed processes left.
pub const HOME: &str = "shm.home";

/// Before the first process of an instance creates its object: if the instance last ran at
/// another path (moved after a crash) and no instance lives there now (no `lock` file), remove
/// the objects named after that path (the instance's, and its shared regions' bitmaps), which
/// nobody else would ever open again; then record this path. Best effort: a failure leaves
/// an object behind, never harms a live instance (one at the old path has its `lock` file).
/// Call with the instance's flock held; `mode` is the instance files' (0600 or 0660).
pub fn forget_moved(dir: &Path, mode: u32) {
    use std::os::unix::ffi::{OsStrExt, OsStringExt};
    let home = dir.join(HOME);
    let here = canonical(dir);
    if let Ok(old) = std::fs::read(&home) {
        let old = std::path::PathBuf::from(std::ffi::OsString::from_vec(old));
        if old.is_absolute() && old != here && !old.join(crate::recovery::LOCK).exists() {
            // SAFETY: a valid C string; unlinking a name nobody opens harms nobody.
            unsafe { libc::shm_unlink(shm_name(&old).as_ptr()) };
            for s in 0..MAX_SHARED {
                Bitmaps::unlink_name(&old, s);
            }
        }
    }
    // Atomically (a torn file must not name some other directory's object).
    use std::os::unix::fs::PermissionsExt;
    let tmp = dir.join(format!("{HOME}.tmp"));
    if std::fs::write(&tmp, here.as_os_str().as_bytes()).is_ok()
        && std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(mode)).is_ok()
    {
        let _ = std::fs::rename(&tmp, &home);
    } else {
        let _ = std::fs::remove_file(&tmp);
    }
}

/// The name of the instance's object (`/tiermem-vnvm-<16 hex digits>`).
pub fn shm_name(dir: &Path) -> CString {
    let canon = canonical(dir);
    let h = crc32fast::hash(canon.as_os_str().as_encoded_bytes()) as u64;
    let h2 = crc32fast::hash(&[canon.as_os_str().as_encoded_bytes(), b"#2"].concat()) as u64;
    // cannot fail: the name is ASCII letters, digits and '/' (no NUL).
    CString::new(format!("/tiermem-vnvm-{:016x}", (h << 32) | h2)).expect("no NUL")
}

fn init_mutex(m: *mut libc::pthread_mutex_t) {
    // SAFETY: m points into a fresh, zeroed shared mapping nobody else uses yet; the attribute
    // object lives on the stack and is destroyed after use.
    unsafe {
        let mut a: libc::pthread_mutexattr_t = std::mem::zeroed();
        libc::pthread_mutexattr_init(&mut a);
        libc::pthread_mutexattr_setpshared(&mut a, libc::PTHREAD_PROCESS_SHARED);
        libc::pthread_mutexattr_setrobust(&mut a, libc::PTHREAD_MUTEX_ROBUST);
        libc::pthread_mutex_init(m, &a);
        libc::pthread_mutexattr_destroy(&mut a);
    }
}

/// A held robust mutex; unlocks on drop.
pub struct Held {
    m: *mut libc::pthread_mutex_t,
}

impl Drop for Held {
    fn drop(&mut self) {
        // SAFETY: this thread locked m in `lock_robust`.
        unsafe { libc::pthread_mutex_unlock(self.m) };
    }
}

/// Lock a robust mutex. When its previous owner died holding it, `repair` runs (still
/// holding it) before the mutex is marked consistent.
///
/// # Safety
/// `m` must point to a mutex initialised by `init_mutex` in a live mapping.
pub unsafe fn lock_robust(m: *mut libc::pthread_mutex_t, repair: impl FnOnce()) -> Held {
    // SAFETY: forwarded contract.
    let rc = unsafe { libc::pthread_mutex_lock(m) };
    match rc {
        0 => Held { m },
        libc::EOWNERDEAD => {
            // Consistent first, then repair while holding it: a repairer that dies hands the
            // next locker EOWNERDEAD again (the kernel marks a dead owner whatever the
            // consistency flag), and the mutex is never unlocked in the inconsistent state,
            // so ENOTRECOVERABLE cannot arise. The guard exists before the repair runs, so a
            // repair that unwinds still unlocks.
            // SAFETY: we hold m (EOWNERDEAD locks it).
            unsafe { libc::pthread_mutex_consistent(m) };
            let g = Held { m };
            repair();
            g
        }
        // cannot fail: the mutex is initialised by `create` (EINVAL excluded), robust but not
        // recursive and never re-locked by its holder (EAGAIN/EDEADLK), and never unlocked
        // inconsistent (ENOTRECOVERABLE, see above).
        e => unreachable!(
            "vnvm shared mutex: pthread_mutex_lock returned {}",
            std::io::Error::from_raw_os_error(e)
        ),
    }
}

impl Shm {
    fn map(fd: &OwnedFd, len: usize, name: &CString) -> Result<*mut u8> {
        // SAFETY: mapping an open shm descriptor with a checked result.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io_err(
                "mmap shared-memory object",
                Path::new(name.to_str().unwrap_or("?")),
                std::io::Error::last_os_error(),
            ));
        }
        Ok(p as *mut u8)
    }

    /// Create the object afresh (replacing a stale one), every page and log object free.
    /// `mode`: 0600, or 0660 for group sharing (applied regardless of the umask).
    pub fn create(dir: &Path, geo: &Geometry, mode: u32) -> Result<Shm> {
        let name = shm_name(dir);
        // SAFETY: name is a valid C string.
        unsafe { libc::shm_unlink(name.as_ptr()) };
        // SAFETY: as above; the result is checked.
        let raw = unsafe {
            libc::shm_open(
                name.as_ptr(),
                libc::O_RDWR | libc::O_CREAT | libc::O_EXCL | libc::O_CLOEXEC,
                mode as libc::mode_t,
            )
        };
        let pname = Path::new(name.to_str().unwrap_or("?")).to_path_buf();
        if raw < 0 {
            return Err(io_err(
                "create shared-memory object",
                &pname,
                std::io::Error::last_os_error(),
            ));
        }
        // SAFETY: raw is a fresh descriptor we own.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        // SAFETY: fd is open; the umask must not narrow the mode asked for.
        unsafe { libc::fchmod(fd.as_raw_fd(), mode as libc::mode_t) };
        let arr = Arrays::new(geo);
        // SAFETY: fd is open.
        if unsafe { libc::ftruncate(fd.as_raw_fd(), arr.len as libc::off_t) } != 0 {
            let e = std::io::Error::last_os_error();
            // SAFETY: valid name.
            unsafe { libc::shm_unlink(name.as_ptr()) };
            return Err(io_err("size shared-memory object", &pname, e));
        }
        let base = Self::map(&fd, arr.len, &name)?;
        let s = Shm {
            base,
            len: arr.len,
            arr,
            geo: *geo,
            name,
        };
        let h = s.hdr_mut();
        init_mutex(&mut h.lock);
        for sl in h.shared.iter_mut() {
            init_mutex(&mut sl.lock);
        }
        h.geo = geo_words(geo);
        h.version = SHM_VERSION;
        h.next_tid.store(1, Ordering::Relaxed);
        for (res, n) in [
            (Res::Log, geo.log_pages),
            (Res::Obj, geo.log_objs),
            (Res::Cache, geo.cache_pages),
        ] {
            let st = s.stack(res);
            for (k, slot) in st.iter().enumerate() {
                slot.store(n - 1 - k as u32, Ordering::Relaxed);
            }
            s.top(res).store(n, Ordering::Relaxed);
        }
        std::sync::atomic::fence(Ordering::SeqCst);
        // The magic last: an object without it is not ready (a racing opener treats it as
        // stale, but openers hold the instance flock, so none races).
        h.magic = SHM_MAGIC;
        Ok(s)
    }

    /// Open the existing object of `dir`; `Ok(None)` if there is none or it does not match
    /// `geo` (stale: the caller recreates it).
    pub fn open(dir: &Path, geo: &Geometry) -> Result<Option<Shm>> {
        let name = shm_name(dir);
        // SAFETY: valid name; the result is checked.
        let raw = unsafe { libc::shm_open(name.as_ptr(), libc::O_RDWR | libc::O_CLOEXEC, 0) };
        if raw < 0 {
            return Ok(None);
        }
        // SAFETY: raw is a fresh descriptor we own.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let arr = Arrays::new(geo);
        // SAFETY: fd is open; st is written by fstat.
        let size = unsafe {
            let mut st: libc::stat = std::mem::zeroed();
            if libc::fstat(fd.as_raw_fd(), &mut st) != 0 {
                return Ok(None);
            }
            st.st_size as usize
        };
        if size != arr.len {
            return Ok(None);
        }
        let base = Self::map(&fd, arr.len, &name)?;
        let s = Shm {
            base,
            len: arr.len,
            arr,
            geo: *geo,
            name,
        };
        let h = s.hdr();
        if h.magic != SHM_MAGIC || h.version != SHM_VERSION || h.geo != geo_words(geo) {
            return Ok(None);
        }
        Ok(Some(s))
    }

    /// Remove the object's name (the last user leaves).
    pub fn unlink(&self) {
        // SAFETY: valid name.
        unsafe { libc::shm_unlink(self.name.as_ptr()) };
    }

    fn hdr(&self) -> &Header {
        // SAFETY: the mapping starts with a Header (sized and aligned by Arrays::new).
        unsafe { &*(self.base as *const Header) }
    }

    #[allow(clippy::mut_from_ref)]
    fn hdr_mut(&self) -> &mut Header {
        // SAFETY: only used in `create`, before the object is published.
        unsafe { &mut *(self.base as *mut Header) }
    }

    fn owners(&self, r: Res) -> &[AtomicU8] {
        let (off, n) = match r {
            Res::Log => (self.arr.log_owner, self.geo.log_pages),
            Res::Obj => (self.arr.obj_owner, self.geo.log_objs),
            Res::Cache => (self.arr.cache_owner, self.geo.cache_pages),
        };
        // SAFETY: n owner bytes at off lie inside the mapping (Arrays::new).
        unsafe { std::slice::from_raw_parts(self.base.add(off) as *const AtomicU8, n as usize) }
    }

    fn stack(&self, r: Res) -> &[AtomicU32] {
        let (off, n) = match r {
            Res::Log => (self.arr.log_stack, self.geo.log_pages),
            Res::Obj => (self.arr.obj_stack, self.geo.log_objs),
            Res::Cache => (self.arr.cache_stack, self.geo.cache_pages),
        };
        // SAFETY: n aligned u32 slots at off lie inside the mapping (Arrays::new).
        unsafe { std::slice::from_raw_parts(self.base.add(off) as *const AtomicU32, n as usize) }
    }

    fn top(&self, r: Res) -> &AtomicU32 {
        let h = self.hdr();
        match r {
            Res::Log => &h.log_top,
            Res::Obj => &h.obj_top,
            Res::Cache => &h.cache_top,
        }
    }

    /// The user slot `s`.
    pub fn app(&self, s: usize) -> &AppSlot {
        &self.hdr().apps[s]
    }

    /// Shared-region slot `s`.
    pub fn shared(&self, s: usize) -> &SharedSlot {
        &self.hdr().shared[s]
    }

    /// The transaction-id counter.
    pub fn next_tid(&self) -> &AtomicU64 {
        &self.hdr().next_tid
    }

    /// Live users (slots in state live).
    pub fn users(&self) -> u32 {
        self.hdr().users.load(Ordering::Acquire)
    }

    /// Free entries of a resource (a racy snapshot).
    pub fn free_count(&self, r: Res) -> u32 {
        self.top(r).load(Ordering::Relaxed)
    }

    /// The owner byte of entry `i` of a resource.
    pub fn owner(&self, r: Res, i: u32) -> u8 {
        self.owners(r)[i as usize].load(Ordering::Acquire)
    }

    /// Set an owner byte (the caller holds the instance mutex).
    pub fn set_owner(&self, r: Res, i: u32, v: u8) {
        self.owners(r)[i as usize].store(v, Ordering::Release);
    }

    /// Lock the instance mutex (repairing it after a dead holder).
    pub fn lock(&self) -> Held {
        let m = &self.hdr().lock as *const _ as *mut libc::pthread_mutex_t;
        // SAFETY: the header's mutex was initialised by `create` and lives in the mapping.
        unsafe { lock_robust(m, || self.rebuild()) }
    }

    /// Lock shared-region slot `s`'s mutex; `repair` runs if its holder died.
    pub fn lock_shared(&self, s: usize, repair: impl FnOnce()) -> Held {
        let m = &self.hdr().shared[s].lock as *const _ as *mut libc::pthread_mutex_t;
        // SAFETY: initialised by `create`; lives in the mapping.
        unsafe { lock_robust(m, repair) }
    }

    /// After a holder of the instance mutex died: the owner bytes are the truth; rebuild the
    /// free stacks and every slot's held counts from them, and recount users.
    fn rebuild(&self) {
        for r in [Res::Log, Res::Obj, Res::Cache] {
            let st = self.stack(r);
            let mut top = 0u32;
            for (i, o) in self.owners(r).iter().enumerate() {
                if o.load(Ordering::Relaxed) == OWNER_FREE {
                    st[top as usize].store(i as u32, Ordering::Relaxed);
                    top += 1;
                }
            }
            self.top(r).store(top, Ordering::Relaxed);
        }
        self.recount();
        let h = self.hdr();
        let users = h
            .apps
            .iter()
            .filter(|a| a.state.load(Ordering::Relaxed) == SLOT_LIVE)
            .count();
        h.users.store(users as u32, Ordering::Release);
    }

    /// Recompute the held counts of every slot from the owner bytes.
    fn recount(&self) {
        let h = self.hdr();
        let mut log = [0u32; MAX_APPS];
        let mut cache = [0u32; MAX_APPS];
        for o in self.owners(Res::Log) {
            let v = o.load(Ordering::Relaxed) as usize;
            if (1..=MAX_APPS).contains(&v) {
                log[v - 1] += 1;
            }
        }
        for o in self.owners(Res::Cache) {
            let v = o.load(Ordering::Relaxed) as usize;
            if (1..=MAX_APPS).contains(&v) {
                cache[v - 1] += 1;
            }
        }
        for (s, a) in h.apps.iter().enumerate() {
            a.log_held.store(log[s], Ordering::Relaxed);
            a.cache_held.store(cache[s], Ordering::Relaxed);
        }
    }

    /// Equal share of a resource per live user.
    pub fn share(&self, r: Res) -> u32 {
        let n = match r {
            Res::Log => self.geo.log_pages,
            Res::Obj => self.geo.log_objs,
            Res::Cache => self.geo.cache_pages,
        };
        n / self.users().max(1)
    }

    fn held(&self, r: Res, slot: usize) -> Option<&AtomicU32> {
        let a = self.app(slot);
        match r {
            Res::Log => Some(&a.log_held),
            Res::Cache => Some(&a.cache_held),
            Res::Obj => None,
        }
    }

    /// Take up to `max` entries of `r` for app `slot` within its equal share (log objects have
    /// no share: there are as many as log pages); appended to `out`. Returns how many.
    pub fn take(&self, r: Res, slot: usize, max: u32, out: &mut Vec<u32>) -> u32 {
        let _g = self.lock();
        let mut n = max.min(self.top(r).load(Ordering::Relaxed));
        if let Some(h) = self.held(r, slot) {
            n = n.min(self.share(r).saturating_sub(h.load(Ordering::Relaxed)));
        }
        let top = self.top(r).load(Ordering::Relaxed);
        let st = self.stack(r);
        for k in 0..n {
            let i = st[(top - 1 - k) as usize].load(Ordering::Relaxed);
            // Owner first: a holder that dies here leaves an entry that is both owned and on
            // the stack; the rebuild trusts the owner.
            self.set_owner(r, i, slot as u8 + 1);
            out.push(i);
        }
        self.top(r).store(top - n, Ordering::Relaxed);
        if let Some(h) = self.held(r, slot) {
            h.fetch_add(n, Ordering::Relaxed);
        }
        n
    }

    /// Take one entry of `r` for app `slot` within its share (no allocation: the hot path of
    /// `nv_write`).
    pub fn take_one(&self, r: Res, slot: usize) -> Option<u32> {
        let _g = self.lock();
        let top = self.top(r).load(Ordering::Relaxed);
        if top == 0 {
            return None;
        }
        if let Some(h) = self.held(r, slot) {
            if h.load(Ordering::Relaxed) >= self.share(r) {
                return None;
            }
            h.fetch_add(1, Ordering::Relaxed);
        }
        let i = self.stack(r)[(top - 1) as usize].load(Ordering::Relaxed);
        self.set_owner(r, i, slot as u8 + 1);
        self.top(r).store(top - 1, Ordering::Relaxed);
        Some(i)
    }

    /// Return entries that `owner` holds to the free stack. An entry that `owner` does not
    /// hold (any more) is left alone: it was freed already — and perhaps handed out again —
    /// by somebody else, and freeing it again would give one entry to two holders. Returns
    /// how many were left alone (0 unless a caller's view is stale).
    pub fn free(&self, r: Res, owner: u8, items: &[u32]) -> usize {
        if items.is_empty() {
            return 0;
        }
        let stale = {
            let _g = self.lock();
            self.free_locked(r, owner, items)
        };
        // Log objects and log pages are freed together; a committer may wait for either.
        if r != Res::Cache {
            self.wake_log_waiters();
        }
        stale
    }

    /// [`Shm::free`] with the instance mutex already held (the caller wakes log waiters).
    pub fn free_locked(&self, r: Res, owner: u8, items: &[u32]) -> usize {
        let st = self.stack(r);
        let mut top = self.top(r).load(Ordering::Relaxed);
        let mut stale = 0;
        for &i in items {
            let o = self.owner(r, i);
            if o == OWNER_FREE || o != owner {
                debug_assert!(
                    false,
                    "{r:?} {i} freed by {owner:#x}, but its owner is {o:#x}"
                );
                stale += 1;
                continue;
            }
            if (1..=MAX_APPS as u8).contains(&o) {
                if let Some(h) = self.held(r, o as usize - 1) {
                    h.fetch_sub(1, Ordering::Relaxed);
                }
            }
            st[top as usize].store(i, Ordering::Relaxed);
            top += 1;
            // Stack first, then the owner byte: dying in between leaves an owned entry on
            // the stack beyond top, which the rebuild fixes (the owner still says held).
            self.top(r).store(top, Ordering::Relaxed);
            self.set_owner(r, i, OWNER_FREE);
        }
        stale
    }

    /// Move entries from app `slot` to another owner (a shared region's committed list).
    pub fn transfer(&self, r: Res, items: &[u32], slot: usize, to: u8) {
        let _g = self.lock();
        for &i in items {
            debug_assert_eq!(self.owner(r, i), slot as u8 + 1);
            self.set_owner(r, i, to);
        }
        if let Some(h) = self.held(r, slot) {
            h.fetch_sub(items.len() as u32, Ordering::Relaxed);
        }
    }

    /// Entries of `r` whose owner byte is `o`.
    pub fn owned_by(&self, r: Res, o: u8) -> Vec<u32> {
        self.owners(r)
            .iter()
            .enumerate()
            .filter(|(_, x)| x.load(Ordering::Relaxed) == o)
            .map(|(i, _)| i as u32)
            .collect()
    }

    /// Register a user in a free slot (the caller holds the instance flock and the slot's OFD
    /// lock). Returns false if the slot is taken.
    pub fn join(&self, slot: usize) -> bool {
        let _g = self.lock();
        let a = self.app(slot);
        if a.state.load(Ordering::Relaxed) != SLOT_FREE {
            return false;
        }
        a.pid.store(std::process::id(), Ordering::Relaxed);
        for c in [
            &a.commits,
            &a.applied,
            &a.pages_written_back,
            &a.age_aborts,
            &a.flushes,
        ] {
            c.store(0, Ordering::Relaxed);
        }
        a.log_held.store(0, Ordering::Relaxed);
        a.cache_held.store(0, Ordering::Relaxed);
        a.state.store(SLOT_LIVE, Ordering::Release);
        self.hdr().users.fetch_add(1, Ordering::AcqRel);
        true
    }

    /// Remove user `slot` (its resources must already be returned). Returns the users left.
    pub fn leave(&self, slot: usize) -> u32 {
        let _g = self.lock();
        let a = self.app(slot);
        if a.state.swap(SLOT_FREE, Ordering::AcqRel) == SLOT_LIVE {
            self.hdr().users.fetch_sub(1, Ordering::AcqRel) - 1
        } else {
            self.users()
        }
    }

    /// The futex word bumped when log pages are freed, for [`Shm::wait_log`].
    pub fn log_seq(&self) -> u32 {
        self.hdr().log_seq.load(Ordering::Acquire)
    }

    /// Wait (up to `timeout`) until the log sequence word differs from `seen`.
    pub fn wait_log(&self, seen: u32, timeout: std::time::Duration) {
        let h = self.hdr();
        h.log_waiters.fetch_add(1, Ordering::SeqCst);
        h.flush_wanted.store(1, Ordering::SeqCst);
        if h.log_seq.load(Ordering::SeqCst) == seen {
            let ts = libc::timespec {
                tv_sec: timeout.as_secs() as libc::time_t,
                tv_nsec: timeout.subsec_nanos() as libc::c_long,
            };
            // SAFETY: a shared (not private) futex wait on a word in the mapping; the kernel
            // returns at once if the word changed.
            unsafe {
                libc::syscall(
                    libc::SYS_futex,
                    h.log_seq.as_ptr(),
                    libc::FUTEX_WAIT,
                    seen,
                    &ts as *const libc::timespec,
                    std::ptr::null::<u32>(),
                    0,
                )
            };
        }
        h.log_waiters.fetch_sub(1, Ordering::SeqCst);
    }

    /// Somebody waits for log space (read and cleared by redo workers).
    pub fn take_flush_wanted(&self) -> bool {
        self.hdr().flush_wanted.swap(0, Ordering::AcqRel) != 0
    }

    /// Wake processes waiting for log space.
    pub fn wake_log_waiters(&self) {
        let h = self.hdr();
        h.log_seq.fetch_add(1, Ordering::SeqCst);
        if h.log_waiters.load(Ordering::SeqCst) > 0 {
            // SAFETY: shared futex wake on a word in the mapping.
            unsafe {
                libc::syscall(
                    libc::SYS_futex,
                    h.log_seq.as_ptr(),
                    libc::FUTEX_WAKE,
                    i32::MAX,
                    std::ptr::null::<libc::timespec>(),
                    std::ptr::null::<u32>(),
                    0,
                )
            };
        }
    }
}

impl Drop for Shm {
    fn drop(&mut self) {
        // SAFETY: unmapping the mapping made in create/open.
        unsafe { libc::munmap(self.base as *mut _, self.len) };
    }
}

fn geo_words(g: &Geometry) -> [u32; 6] {
    [
        g.page_size,
        g.log_pages,
        g.cache_pages,
        g.max_files,
        g.max_domains,
        g.log_objs,
    ]
}

/// A shared region's dirty bitmaps: `bits` (pages committed since the last flush started) and
/// `flushing` (pages a flush is writing back; kept if the flusher dies).
pub struct Bitmaps {
    base: *mut AtomicU64,
    words: usize,
    name: CString,
}

// SAFETY: atomics in a shared mapping valid until Drop.
unsafe impl Send for Bitmaps {}
// SAFETY: see above.
unsafe impl Sync for Bitmaps {}

impl Bitmaps {
    fn name(dir: &Path, s: usize) -> CString {
        let mut n = shm_name(dir).into_bytes();
        n.extend_from_slice(format!("-s{s}").as_bytes());
        // cannot fail: `shm_name` (no NUL) plus "-s" and digits.
        CString::new(n).expect("no NUL")
    }

    /// Remove the name of shared slot `s`'s bitmaps, if any.
    pub fn unlink_name(dir: &Path, s: usize) {
        let name = Self::name(dir, s);
        // SAFETY: valid name.
        unsafe { libc::shm_unlink(name.as_ptr()) };
    }

    /// Open (creating if needed, zeroed) the bitmaps of shared slot `s` for `pages` pages.
    pub fn open(dir: &Path, s: usize, pages: u64, create_new: bool, mode: u32) -> Result<Bitmaps> {
        let name = Self::name(dir, s);
        let pname = Path::new(name.to_str().unwrap_or("?")).to_path_buf();
        if create_new {
            // SAFETY: valid name.
            unsafe { libc::shm_unlink(name.as_ptr()) };
        }
        // SAFETY: valid name; checked.
        let raw = unsafe {
            libc::shm_open(
                name.as_ptr(),
                libc::O_RDWR | libc::O_CREAT | libc::O_CLOEXEC,
                mode as libc::mode_t,
            )
        };
        if raw < 0 {
            return Err(io_err(
                "open region bitmap",
                &pname,
                std::io::Error::last_os_error(),
            ));
        }
        // SAFETY: fresh descriptor we own.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        if create_new {
            // SAFETY: fd is open; the umask must not narrow the mode asked for.
            unsafe { libc::fchmod(fd.as_raw_fd(), mode as libc::mode_t) };
        }
        let words = pages.div_ceil(64) as usize;
        let len = (2 * words * 8).max(8).div_ceil(4096) * 4096;
        // SAFETY: fd open; growing a new object zero-fills it, an existing one keeps its size.
        if unsafe { libc::ftruncate(fd.as_raw_fd(), len as libc::off_t) } != 0 {
            return Err(io_err(
                "size region bitmap",
                &pname,
                std::io::Error::last_os_error(),
            ));
        }
        // SAFETY: mapping the descriptor, checked.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io_err(
                "mmap region bitmap",
                &pname,
                std::io::Error::last_os_error(),
            ));
        }
        Ok(Bitmaps {
            base: p as *mut AtomicU64,
            words,
            name,
        })
    }

    /// The committed-pages bitmap.
    pub fn bits(&self) -> &[AtomicU64] {
        // SAFETY: `words` words at base lie in the mapping.
        unsafe { std::slice::from_raw_parts(self.base, self.words) }
    }

    /// The bitmap of a flush in progress.
    pub fn flushing(&self) -> &[AtomicU64] {
        // SAFETY: the second `words` words lie in the mapping.
        unsafe { std::slice::from_raw_parts(self.base.add(self.words), self.words) }
    }

    /// Remove the bitmap's name (the region's last user).
    pub fn unlink(&self) {
        // SAFETY: valid name.
        unsafe { libc::shm_unlink(self.name.as_ptr()) };
    }
}

impl Drop for Bitmaps {
    fn drop(&mut self) {
        let len = (2 * self.words * 8).max(8).div_ceil(4096) * 4096;
        // SAFETY: unmapping the mapping made in open.
        unsafe { libc::munmap(self.base as *mut _, len) };
    }
}

/// The liveness lock of app slot `s`: an OFD write lock on byte `1 + s` of the instance's
/// `lock` file. Held for the life of `file`.
pub fn lock_slot(file: &File, s: usize) -> bool {
    ofd(file, s, libc::F_OFD_SETLK, libc::F_WRLCK as i16).is_some_and(|l| l.l_type != -1)
}

/// True if the process holding slot `s` is alive (its OFD lock is held by someone else).
pub fn slot_alive(file: &File, s: usize) -> bool {
    match ofd(file, s, libc::F_OFD_GETLK, libc::F_WRLCK as i16) {
        Some(l) => l.l_type != libc::F_UNLCK as i16,
        None => true,
    }
}

fn ofd(file: &File, s: usize, cmd: libc::c_int, ty: i16) -> Option<libc::flock> {
    // SAFETY: zeroed flock is a valid initial value; fcntl writes into it for GETLK.
    let mut l: libc::flock = unsafe { std::mem::zeroed() };
    l.l_type = ty;
    l.l_whence = libc::SEEK_SET as i16;
    l.l_start = 1 + s as libc::off_t;
    l.l_len = 1;
    l.l_pid = 0;
    // SAFETY: file is open; l is a valid flock.
    let rc = unsafe { libc::fcntl(file.as_raw_fd(), cmd, &mut l) };
    if rc != 0 {
        if cmd == libc::F_OFD_SETLK {
            l.l_type = -1;
            return Some(l);
        }
        return None;
    }
    Some(l)
}

#[cfg(test)]
mod tests {

    /// An instance directory names the same object before it is created, while it exists and
    /// after it is removed (a supervisor cleaning up after killed processes finds it), through
    /// a symlinked parent too.
    #[test]
    fn the_object_name_does_not_depend_on_the_directory_existing() {
        let t = tempfile::tempdir().unwrap();
        let real = t.path().join("real");
        std::fs::create_dir(&real).unwrap();
        let link = t.path().join("link");
        std::os::unix::fs::symlink(&real, &link).unwrap();
        let via_link = link.join("inst").join("vnvm");
        let direct = real.join("inst").join("vnvm");
        let before = (shm_name(&via_link), shm_name(&direct));
        std::fs::create_dir_all(&direct).unwrap();
        let during = (shm_name(&via_link), shm_name(&direct));
        std::fs::remove_dir_all(real.join("inst")).unwrap();
        let after = shm_name(&direct);
        assert_eq!(before.0, before.1);
        assert_eq!(during.0, before.0);
        assert_eq!(during.1, before.0);
        assert_eq!(after, before.0);
    }
    use super::*;

    fn geo() -> Geometry {
        Geometry {
            page_size: 4096,
            log_pages: 8,
            cache_pages: 8,
            max_files: 4,
            max_domains: 64,
            log_objs: 8,
        }
    }

    #[test]
    fn a_holder_that_dies_mid_update_is_repaired_from_the_owner_bytes() {
        let dir = tempfile::Builder::new()
            .prefix("tiermem-vnvm-shmtest")
            .tempdir_in("/dev/shm")
            .unwrap();
        let s = Shm::create(dir.path(), &geo(), 0o600).unwrap();
        assert!(s.join(0));
        let mut got = Vec::new();
        assert_eq!(s.take(Res::Log, 0, 3, &mut got), 3);
        let victim = s.owned_by(Res::Log, OWNER_FREE)[0];
        // A child takes the instance mutex, marks one more page as slot 0's (the first half of
        // a take) and dies holding the mutex.
        // SAFETY: the child only touches the shared mapping and exits without unwinding.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0);
        if pid == 0 {
            let g = s.lock();
            s.set_owner(Res::Log, victim, 1);
            std::mem::forget(g);
            // SAFETY: leaving the child at once, holding the mutex.
            unsafe { libc::_exit(0) };
        }
        let mut st = 0;
        // SAFETY: waiting for our own child.
        unsafe { libc::waitpid(pid, &mut st, 0) };
        // The next locker gets EOWNERDEAD and rebuilds: the half-taken page is held, not free.
        drop(s.lock());
        assert_eq!(s.free_count(Res::Log), 8 - 4);
        assert_eq!(s.app(0).log_held.load(Ordering::Relaxed), 4);
        assert!(!s.owned_by(Res::Log, OWNER_FREE).contains(&victim));
        // And the mutex works normally afterwards.
        s.free(Res::Log, 1, &got);
        assert_eq!(s.free_count(Res::Log), 8 - 1);
        assert_eq!(s.app(0).log_held.load(Ordering::Relaxed), 1);
        s.unlink();
    }

    #[test]
    fn shares_split_between_users() {
        let dir = tempfile::Builder::new()
            .prefix("tiermem-vnvm-shmtest")
            .tempdir_in("/dev/shm")
            .unwrap();
        let s = Shm::create(dir.path(), &geo(), 0o600).unwrap();
        assert!(s.join(0) && s.join(1) && !s.join(1));
        let mut v = Vec::new();
        assert_eq!(s.take(Res::Cache, 0, 8, &mut v), 4, "half of 8 pages");
        assert_eq!(s.take_one(Res::Cache, 0), None);
        assert!(s.take_one(Res::Cache, 1).is_some());
        assert_eq!(s.leave(1), 1);
        assert!(
            s.take_one(Res::Cache, 0).is_some(),
            "the whole cache is 0's share now"
        );
        s.unlink();
    }
}
