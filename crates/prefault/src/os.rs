//! The kernel calls the service makes, each wrapped once: `MADV_POPULATE_WRITE/READ`, presence
//! of pages (`PAGEMAP_SCAN` from `tiermem-fault`, `mincore` where the ioctl is missing), the
//! memory cgroup's room (v1 and v2), SCHED_IDLE, thread CPU time, and the check of a range
//! against `/proc/self/maps` that [`Service::register`](crate::Service::register) makes.

use crate::Error;
use std::time::Duration;
use tiermem_fault::sys::{
    PageRegion, PmScanArg, PAGE_IS_HUGE, PAGE_IS_PFNZERO, PAGE_IS_PRESENT, PAGE_IS_SWAPPED,
};
use tiermem_fault::{Pagemap, PAGE_SIZE};

/// `MADV_POPULATE_READ` (Linux 5.14).
pub const MADV_POPULATE_READ: i32 = 22;
/// `MADV_POPULATE_WRITE` (Linux 5.14).
pub const MADV_POPULATE_WRITE: i32 = 23;

/// Populates `[addr, addr+len)`; returns the errno on failure (ENOMEM: unmapped or out of
/// memory, EFAULT/EINVAL: not populatable, EHWPOISON...). EINTR/EAGAIN are retried.
pub fn populate(addr: usize, len: usize, write: bool) -> Result<(), i32> {
    let advice = if write {
        MADV_POPULATE_WRITE
    } else {
        MADV_POPULATE_READ
    };
    loop {
        // SAFETY: madvise with a populate advice never changes the contents of a mapping: it
        // faults pages in as an access would. An unmapped range is an error, not UB.
        let r = unsafe { libc::madvise(addr as *mut libc::c_void, len, advice) };
        if r == 0 {
            return Ok(());
        }
        let e = std::io::Error::last_os_error().raw_os_error().unwrap_or(0);
        if e != libc::EINTR && e != libc::EAGAIN {
            return Err(e);
        }
    }
}

/// A run of present pages, in page indices relative to the scanned base.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Run {
    /// First page.
    pub first: usize,
    /// Pages in the run.
    pub pages: usize,
    /// Mapped by a huge page.
    pub huge: bool,
    /// Mapped to the zero page (read, never written). Always false from `mincore`.
    pub zero: bool,
}

/// Reads which pages of a range are present (or swapped): one `PAGEMAP_SCAN` walk, or
/// `mincore` where the ioctl is not available.
pub struct Presence {
    pagemap: Option<Pagemap>,
    vec: Vec<PageRegion>,
    mincore: Vec<u8>,
}

impl Presence {
    /// Opens `/proc/self/pagemap` and probes the ioctl.
    pub fn new() -> Presence {
        let mut p = Presence {
            pagemap: Pagemap::open().ok(),
            vec: vec![PageRegion::default(); 512],
            mincore: Vec::new(),
        };
        // Probe: an empty scan of our own stack page.
        let probe = &p as *const _ as usize & !(PAGE_SIZE - 1);
        let mut out = Vec::new();
        if p.scan_pagemap(probe, PAGE_SIZE, &mut out).is_err() {
            p.pagemap = None;
        }
        p
    }

    /// Whether `PAGEMAP_SCAN` is used (else `mincore`).
    pub fn uses_pagemap_scan(&self) -> bool {
        self.pagemap.is_some()
    }

    /// The present runs of `[base, base+len)`, appended to `out` in address order.
    pub fn scan(&mut self, base: usize, len: usize, out: &mut Vec<Run>) -> Result<(), i32> {
        out.clear();
        if self.pagemap.is_some() {
            self.scan_pagemap(base, len, out)
        } else {
            self.scan_mincore(base, len, out)
        }
    }

    fn scan_pagemap(&mut self, base: usize, len: usize, out: &mut Vec<Run>) -> Result<(), i32> {
        let pm = self.pagemap.as_ref().ok_or(libc::ENOSYS)?;
        let end = base + len;
        let mut start = base;
        while start < end {
            let mut arg = PmScanArg {
                start: start as u64,
                end: end as u64,
                vec: self.vec.as_mut_ptr() as u64,
                vec_len: self.vec.len() as u64,
                category_anyof_mask: PAGE_IS_PRESENT | PAGE_IS_SWAPPED,
                return_mask: PAGE_IS_PRESENT | PAGE_IS_SWAPPED | PAGE_IS_HUGE | PAGE_IS_PFNZERO,
                ..Default::default()
            };
            let n = pm.scan(&mut arg)?;
            for r in &self.vec[..n] {
                let first = (r.start as usize - base) / PAGE_SIZE;
                let pages = (r.end - r.start) as usize / PAGE_SIZE;
                let huge = r.categories & PAGE_IS_HUGE != 0;
                let zero = r.categories & PAGE_IS_PFNZERO != 0;
                match out.last_mut() {
                    Some(l) if l.first + l.pages == first && l.huge == huge && l.zero == zero => {
                        l.pages += pages
                    }
                    _ => out.push(Run {
                        first,
                        pages,
                        huge,
                        zero,
                    }),
                }
            }
            let walked = arg.walk_end as usize;
            if walked <= start || walked >= end || n < self.vec.len() {
                break;
            }
            start = walked;
        }
        Ok(())
    }

    fn scan_mincore(&mut self, base: usize, len: usize, out: &mut Vec<Run>) -> Result<(), i32> {
        let pages = len / PAGE_SIZE;
        self.mincore.resize(pages, 0);
        // SAFETY: the vector holds one byte per page of the range, as mincore requires.
        let r = unsafe {
            libc::mincore(
                base as *mut libc::c_void,
                len,
                self.mincore.as_mut_ptr() as *mut libc::c_uchar,
            )
        };
        if r != 0 {
            return Err(std::io::Error::last_os_error().raw_os_error().unwrap_or(0));
        }
        for (i, &b) in self.mincore.iter().enumerate() {
            if b & 1 == 0 {
                continue;
            }
            match out.last_mut() {
                Some(l) if l.first + l.pages == i => l.pages += 1,
                _ => out.push(Run {
                    first: i,
                    pages: 1,
                    huge: false,
                    zero: false,
                }),
            }
        }
        Ok(())
    }
}

impl Default for Presence {
    fn default() -> Self {
        Presence::new()
    }
}

/// The memory cgroup the process is in: its limit and usage files (v1 `memory.limit_in_bytes`
/// + `memory.usage_in_bytes`, or v2 `memory.max` + `memory.current`).
pub struct Memcg {
    limit_path: std::path::PathBuf,
    usage_path: std::path::PathBuf,
}

impl Memcg {
    /// Finds the process's memory cgroup; `None` when there is none or it has no limit files.
    pub fn of_self() -> Option<Memcg> {
        let text = std::fs::read_to_string("/proc/self/cgroup").ok()?;
        for line in text.lines() {
            let mut parts = line.splitn(3, ':');
            let (_, ctrl, path) = (parts.next()?, parts.next()?, parts.next()?);
            if ctrl.split(',').any(|c| c == "memory") {
                let dir = std::path::Path::new("/sys/fs/cgroup/memory")
                    .join(path.trim_start_matches('/'));
                let m = Memcg {
                    limit_path: dir.join("memory.limit_in_bytes"),
                    usage_path: dir.join("memory.usage_in_bytes"),
                };
                if m.limit_path.exists() {
                    return Some(m);
                }
            } else if ctrl.is_empty() {
                let dir = std::path::Path::new("/sys/fs/cgroup").join(path.trim_start_matches('/'));
                let m = Memcg {
                    limit_path: dir.join("memory.max"),
                    usage_path: dir.join("memory.current"),
                };
                if m.limit_path.exists() {
                    return Some(m);
                }
            }
        }
        None
    }

    /// Bytes left below the limit, `None` when unlimited or unreadable.
    pub fn room(&self) -> Option<u64> {
        let limit = read_u64(&self.limit_path)?;
        if limit >= 1 << 60 {
            return None;
        }
        let usage = read_u64(&self.usage_path)?;
        Some(limit.saturating_sub(usage))
    }
}

fn read_u64(p: &std::path::Path) -> Option<u64> {
    let s = std::fs::read_to_string(p).ok()?;
    let s = s.trim();
    if s == "max" {
        return Some(u64::MAX);
    }
    s.parse().ok()
}

/// Makes the calling thread SCHED_IDLE; returns whether it worked.
pub fn set_sched_idle() -> bool {
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: pid 0 is the calling thread; a plain syscall.
    unsafe { libc::sched_setscheduler(0, libc::SCHED_IDLE, &param) == 0 }
}

/// Moves the calling thread off the CPU it runs on, to another one its affinity allows, and
/// gives it its affinity back; returns whether it moved. Setting a mask without the current
/// CPU migrates a running thread at once (the stopper moves it before the call returns);
/// setting the old mask back does not move it again. Two system calls; nothing is done when
/// the thread may run on one CPU only.
pub fn hop_off_this_cpu() -> bool {
    // SAFETY: sched_getcpu has no arguments; cpu_set_t is plain data, zeroed is empty;
    // sched_{get,set}affinity with pid 0 act on the calling thread and read/write only the
    // set of the size passed.
    unsafe {
        let cpu = libc::sched_getcpu();
        if cpu < 0 || cpu as usize >= libc::CPU_SETSIZE as usize {
            return false;
        }
        let size = std::mem::size_of::<libc::cpu_set_t>();
        let mut mask: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, size, &mut mask) != 0 || libc::CPU_COUNT(&mask) < 2 {
            return false;
        }
        let mut others = mask;
        libc::CPU_CLR(cpu as usize, &mut others);
        if libc::sched_setaffinity(0, size, &others) != 0 {
            return false;
        }
        // Back to the caller's mask: the thread stays where it now runs. A failure here would
        // leave the thread off one CPU; it has the mask it had a moment ago, so it cannot fail
        // unless the mask changed meanwhile, and then the new one is retried by the next hop.
        let _ = libc::sched_setaffinity(0, size, &mask);
        libc::sched_getcpu() != cpu
    }
}

/// CPU time of the calling thread.
pub fn thread_cpu() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid timespec out-parameter.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// CPU time of thread `tid` of this process (its POSIX CPU clock, `CPUCLOCK_SCHED`);
/// `None` once it has exited.
pub fn cpu_of_thread(tid: i32) -> Option<Duration> {
    if tid <= 0 {
        return None;
    }
    // The kernel's MAKE_THREAD_CPUCLOCK(tid, CPUCLOCK_SCHED): ~tid << 3 | PERTHREAD | SCHED.
    let clock = (!tid) << 3 | 4 | 2;
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid timespec out-parameter; an invalid clock is an error, not UB.
    let r = unsafe { libc::clock_gettime(clock, &mut ts) };
    (r == 0).then(|| Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32))
}

/// `struct procmap_query` (linux/fs.h, Linux 6.11): one VMA of `/proc/PID/maps` by address.
#[repr(C)]
#[derive(Default)]
struct ProcmapQuery {
    size: u64,
    query_flags: u64,
    query_addr: u64,
    vma_start: u64,
    vma_end: u64,
    vma_flags: u64,
    vma_page_size: u64,
    vma_offset: u64,
    inode: u64,
    dev_major: u32,
    dev_minor: u32,
    vma_name_size: u32,
    build_id_size: u32,
    vma_name_addr: u64,
    build_id_addr: u64,
}
const _: () = assert!(std::mem::size_of::<ProcmapQuery>() == 104);
/// `PROCMAP_QUERY` = `_IOWR('f', 17, struct procmap_query)`.
const PROCMAP_QUERY: u64 = 3 << 30 | 104 << 16 | (b'f' as u64) << 8 | 17;
const PROCMAP_QUERY_VMA_READABLE: u64 = 0x01;
const PROCMAP_QUERY_VMA_WRITABLE: u64 = 0x02;
const PROCMAP_QUERY_VMA_SHARED: u64 = 0x08;

/// The process's `/proc/self/maps` descriptor for `PROCMAP_QUERY` and the pid that opened it:
/// a forked child reopens (the descriptor it inherited reads its parent's mappings).
static MAPS_FD: std::sync::atomic::AtomicI64 = std::sync::atomic::AtomicI64::new(-1);

/// Opens the descriptor `check_mapping` uses ahead of the first registration (the service
/// calls this when it starts), so that a registration costs a few µs from the first.
pub fn open_maps() -> Option<i32> {
    use std::sync::atomic::Ordering::SeqCst;
    let pid = std::process::id() as i64;
    let cur = MAPS_FD.load(SeqCst);
    if cur >= 0 && cur >> 32 == pid {
        return Some(cur as i32);
    }
    // SAFETY: opening a procfs file read-only, close-on-exec.
    let fd = unsafe {
        libc::open(
            c"/proc/self/maps".as_ptr(),
            libc::O_RDONLY | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return None;
    }
    let word = pid << 32 | fd as i64;
    match MAPS_FD.compare_exchange(cur, word, SeqCst, SeqCst) {
        Ok(_) => {
            if cur >= 0 && cur >> 32 == pid {
                // SAFETY: our own descriptor, replaced.
                unsafe { libc::close(cur as i32) };
            }
            Some(fd)
        }
        Err(now) => {
            // SAFETY: our descriptor, not published.
            unsafe { libc::close(fd) };
            (now >= 0 && now >> 32 == pid).then_some(now as i32)
        }
    }
}

/// Checks `[base, base+len)` VMA by VMA with `PROCMAP_QUERY` (a few µs, where reading the text
/// of `/proc/self/maps` costs tens); `None` when the ioctl is not there (Linux < 6.11).
fn check_mapping_query(base: usize, len: usize) -> Option<Result<(), Error>> {
    let fd = open_maps()?;
    {
        let end = base + len;
        let mut at = base;
        while at < end {
            let mut q = ProcmapQuery {
                size: std::mem::size_of::<ProcmapQuery>() as u64,
                query_addr: at as u64,
                ..Default::default()
            };
            // SAFETY: a valid descriptor and a properly sized procmap_query with no name or
            // build-id buffers.
            let r = unsafe { libc::ioctl(fd, PROCMAP_QUERY as libc::c_ulong, &mut q) };
            if r != 0 {
                return match std::io::Error::last_os_error().raw_os_error() {
                    Some(libc::ENOENT) => Some(Err(Error::BadRange(format!(
                        "{base:#x}..{end:#x}: {at:#x} is not mapped"
                    )))),
                    _ => None, // ENOTTY (older kernel) or anything else: the text way
                };
            }
            let what = |why: &str| {
                Some(Err(Error::BadRange(format!(
                    "{base:#x}..{end:#x}: {why} (mapping {:#x}..{:#x})",
                    q.vma_start, q.vma_end
                ))))
            };
            let f = q.vma_flags;
            if f & PROCMAP_QUERY_VMA_READABLE == 0 && f & PROCMAP_QUERY_VMA_WRITABLE == 0 {
                return what("part of it is PROT_NONE");
            }
            if f & PROCMAP_QUERY_VMA_WRITABLE == 0 || f & PROCMAP_QUERY_VMA_READABLE == 0 {
                return what("part of it is not writable");
            }
            if f & PROCMAP_QUERY_VMA_SHARED != 0 {
                return what("part of it is a shared mapping");
            }
            if q.inode != 0 {
                return what("part of it maps a file");
            }
            if q.vma_end as usize <= at {
                return None;
            }
            at = q.vma_end as usize;
        }
        Some(Ok(()))
    }
}

/// Checks that `[base, base+len)` is private anonymous memory, mapped readable and writable
/// throughout (what populating ahead is for): with `PROCMAP_QUERY` where the kernel has it, else
/// from the text of `/proc/self/maps`. The error names what is wrong and where.
pub fn check_mapping(base: usize, len: usize) -> Result<(), Error> {
    if let Some(r) = check_mapping_query(base, len) {
        return r;
    }
    check_mapping_text(base, len)
}

fn check_mapping_text(base: usize, len: usize) -> Result<(), Error> {
    let text = std::fs::read_to_string("/proc/self/maps")
        .map_err(|e| Error::Os(format!("reading /proc/self/maps: {e}")))?;
    let end = base + len;
    let mut at = base;
    for line in text.lines() {
        let mut f = line.split_whitespace();
        let (Some(range), Some(perms), Some(_off), Some(_dev), Some(inode)) =
            (f.next(), f.next(), f.next(), f.next(), f.next())
        else {
            continue;
        };
        let path = f.next().unwrap_or("");
        let Some((lo, hi)) = range.split_once('-') else {
            continue;
        };
        let (Ok(lo), Ok(hi)) = (usize::from_str_radix(lo, 16), usize::from_str_radix(hi, 16))
        else {
            continue;
        };
        if hi <= at {
            continue;
        }
        if lo > at {
            break;
        }
        let what = |why: &str| {
            Error::BadRange(format!(
                "{:#x}..{:#x}: {why} ({line})",
                base,
                end,
                line = line.trim()
            ))
        };
        if !perms.starts_with("rw") {
            return Err(what(if perms.starts_with("---") {
                "part of it is PROT_NONE"
            } else {
                "part of it is not writable"
            }));
        }
        if perms.as_bytes().get(3) == Some(&b's') {
            return Err(what("part of it is a shared mapping"));
        }
        if inode != "0" && !path.is_empty() {
            return Err(what("part of it maps a file"));
        }
        at = hi;
        if at >= end {
            return Ok(());
        }
    }
    Err(Error::BadRange(format!(
        "{:#x}..{:#x}: {:#x} is not mapped",
        base, end, at
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(len: usize, prot: i32, flags: i32) -> usize {
        // SAFETY: a fresh anonymous mapping.
        let p = unsafe { libc::mmap(std::ptr::null_mut(), len, prot, flags, -1, 0) };
        assert_ne!(p, libc::MAP_FAILED);
        p as usize
    }

    #[test]
    fn presence_sees_what_is_populated() {
        let len = 64 * PAGE_SIZE;
        let a = map(
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
        );
        // SAFETY: our mapping.
        unsafe { libc::madvise(a as *mut _, len, libc::MADV_NOHUGEPAGE) };
        let mut p = Presence::new();
        let mut runs = Vec::new();
        p.scan(a, len, &mut runs).unwrap();
        assert!(runs.is_empty());
        populate(a + 3 * PAGE_SIZE, 5 * PAGE_SIZE, true).unwrap();
        // SAFETY: our mapping.
        unsafe { *((a + 40 * PAGE_SIZE) as *mut u8) = 1 };
        p.scan(a, len, &mut runs).unwrap();
        assert_eq!(
            runs,
            vec![
                Run {
                    first: 3,
                    pages: 5,
                    huge: false,
                    zero: false
                },
                Run {
                    first: 40,
                    pages: 1,
                    huge: false,
                    zero: false
                }
            ]
        );
        // mincore agrees.
        let mut m = Presence {
            pagemap: None,
            vec: Vec::new(),
            mincore: Vec::new(),
        };
        let mut runs2 = Vec::new();
        m.scan(a, len, &mut runs2).unwrap();
        assert_eq!(runs, runs2);
        // SAFETY: our mapping.
        unsafe { libc::munmap(a as *mut _, len) };
    }

    #[test]
    fn check_mapping_names_the_problem() {
        check_mapping_both_ways(check_mapping);
        check_mapping_both_ways(check_mapping_text);
        if check_mapping_query(&0u8 as *const u8 as usize & !4095, 4096).is_none() {
            eprintln!(
                "PROCMAP_QUERY is not available (Linux < 6.11): the text way was tested twice"
            );
        }
    }

    fn check_mapping_both_ways(check_mapping: fn(usize, usize) -> Result<(), Error>) {
        let len = 8 * PAGE_SIZE;
        let rw = libc::PROT_READ | libc::PROT_WRITE;
        let a = map(len, rw, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS);
        check_mapping(a, len).unwrap();
        // SAFETY: our mapping.
        unsafe { libc::mprotect((a + 2 * PAGE_SIZE) as *mut _, PAGE_SIZE, libc::PROT_NONE) };
        let e = check_mapping(a, len).unwrap_err().to_string();
        assert!(e.contains("PROT_NONE"), "{e}");
        // SAFETY: our mapping.
        unsafe { libc::mprotect((a + 2 * PAGE_SIZE) as *mut _, PAGE_SIZE, libc::PROT_READ) };
        let e = check_mapping(a, len).unwrap_err().to_string();
        assert!(e.contains("not writable"), "{e}");
        // SAFETY: our mapping.
        unsafe { libc::munmap((a + 4 * PAGE_SIZE) as *mut _, PAGE_SIZE) };
        let e = check_mapping(a + 3 * PAGE_SIZE, 4 * PAGE_SIZE)
            .unwrap_err()
            .to_string();
        assert!(e.contains("not mapped"), "{e}");
        let s = map(len, rw, libc::MAP_SHARED | libc::MAP_ANONYMOUS);
        let e = check_mapping(s, len).unwrap_err().to_string();
        assert!(e.contains("shared"), "{e}");
        // SAFETY: our mappings.
        unsafe {
            libc::munmap(a as *mut _, len);
            libc::munmap(s as *mut _, len);
        }
    }
}
