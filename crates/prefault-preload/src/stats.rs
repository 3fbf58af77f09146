//! The exit report (`TIERMEM_PREFAULT_STATS=<path>`): one JSON object with the service's
//! figures ([`tiermem_prefault::Stats`]), the library's counters and the minor faults of the
//! application's threads against the service thread's, read from `/proc/self/stat` and
//! `/proc/self/task/<tid>/stat` while the service thread still exists. Written once, at
//! `exit` (an `atexit` handler) or at `_exit`/`_Exit` (hooked: shells such as dash end that
//! way), without allocating or locking (stack buffers, raw `open`/`read`/`write`), so that an
//! `_exit` wherever it is called cannot deadlock on the allocator.

use crate::state::{self, COUNTERS};
use std::ffi::{c_int, CStr};
use std::fmt::Write;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering::Relaxed, Ordering::SeqCst};
use tiermem_prefault::Service;

/// A fixed buffer `fmt::Write` fills, truncating (never allocating).
struct Buf<const N: usize> {
    b: [u8; N],
    n: usize,
}

impl<const N: usize> Buf<N> {
    fn new() -> Self {
        Buf { b: [0; N], n: 0 }
    }
    fn bytes(&self) -> &[u8] {
        &self.b[..self.n]
    }
    fn write_bytes(&mut self, s: &[u8]) {
        let k = s.len().min(N - self.n);
        self.b[self.n..self.n + k].copy_from_slice(&s[..k]);
        self.n += k;
    }
    /// NUL-terminated (truncated to fit): for system calls taking a path.
    fn c_str(&mut self) -> *const libc::c_char {
        let i = self.n.min(N - 1);
        self.b[i] = 0;
        self.b.as_ptr() as *const libc::c_char
    }
}

impl<const N: usize> Write for Buf<N> {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        self.write_bytes(s.as_bytes());
        Ok(())
    }
}

/// (minflt, majflt) of a `/proc/.../stat` file.
fn faults(path: *const libc::c_char) -> Option<(u64, u64)> {
    let mut b = [0u8; 1024];
    // SAFETY: a NUL-terminated path; reading into our stack buffer; closing our descriptor.
    let n = unsafe {
        let fd = libc::open(path, libc::O_RDONLY | libc::O_CLOEXEC);
        if fd < 0 {
            return None;
        }
        let n = libc::read(fd, b.as_mut_ptr() as *mut libc::c_void, b.len());
        libc::close(fd);
        n
    };
    let text = std::str::from_utf8(b.get(..usize::try_from(n).ok()?)?).ok()?;
    // Fields after the parenthesised comm: state is field 3, minflt 10, majflt 12.
    let rest = &text[text.rfind(')')? + 1..];
    let mut f = rest.split_ascii_whitespace();
    let min = f.nth(7)?.parse().ok()?;
    let maj = f.nth(1)?.parse().ok()?;
    Some((min, maj))
}

/// Writes the report into `out` (one line).
fn report<W: Write>(svc: &Service, out: &mut W) -> std::fmt::Result {
    let st = svc.stats();
    let c = &COUNTERS;
    let tid = svc.thread_id();
    let (proc_min, proc_maj) = faults(c"/proc/self/stat".as_ptr()).unwrap_or((0, 0));
    let (svc_min, svc_maj) = tid
        .and_then(|t| {
            let mut p = Buf::<64>::new();
            write!(p, "/proc/self/task/{t}/stat").ok()?;
            faults(p.c_str())
        })
        .unwrap_or((0, 0));
    let cfg = state::config();
    let glibc = state::IS_GLIBC.load(Relaxed);
    let top_pad = cfg
        .filter(|c| c.heap && glibc)
        .map_or(0, crate::heap::top_pad);
    write!(out, "{{\"pid\":{}", std::process::id())?;
    write!(out, ",\"regions\":{}", st.regions)?;
    write!(out, ",\"passes\":{}", st.passes)?;
    write!(out, ",\"populate_calls\":{}", st.populate_calls)?;
    write!(out, ",\"populated_bytes\":{}", st.populated_bytes)?;
    write!(out, ",\"tripwire_hits\":{}", st.tripwire_hits)?;
    write!(out, ",\"footprint_pages\":{}", st.footprint_pages)?;
    write!(out, ",\"unused_bytes\":{}", st.unused_bytes)?;
    write!(out, ",\"peak_unused_bytes\":{}", st.peak_unused_bytes)?;
    write!(out, ",\"budget_bytes\":{}", st.budget_bytes)?;
    write!(out, ",\"backoffs\":{}", st.backoffs)?;
    write!(out, ",\"starved_passes\":{}", st.starved_passes)?;
    write!(out, ",\"failures\":{}", st.failures)?;
    write!(out, ",\"service_cpu_ns\":{}", st.service_cpu.as_nanos())?;
    write!(out, ",\"sched_idle\":{}", st.sched_idle)?;
    write!(out, ",\"sensing\":\"{}\"", st.sensing)?;
    match tid {
        Some(t) => write!(out, ",\"service_tid\":{t}")?,
        None => write!(out, ",\"service_tid\":null")?,
    }
    write!(out, ",\"process_minflt\":{proc_min}")?;
    write!(out, ",\"process_majflt\":{proc_maj}")?;
    write!(out, ",\"service_minflt\":{svc_min}")?;
    write!(out, ",\"service_majflt\":{svc_maj}")?;
    write!(out, ",\"app_minflt\":{}", proc_min.saturating_sub(svc_min))?;
    write!(out, ",\"app_majflt\":{}", proc_maj.saturating_sub(svc_maj))?;
    write!(out, ",\"mmap_regions\":{}", c.mmap_regions.load(Relaxed))?;
    write!(out, ",\"malloc_blocks\":{}", c.malloc_blocks.load(Relaxed))?;
    write!(out, ",\"heap_growths\":{}", c.heap_growths.load(Relaxed))?;
    write!(
        out,
        ",\"registered_bytes\":{}",
        c.registered_bytes.load(Relaxed)
    )?;
    write!(
        out,
        ",\"register_failures\":{}",
        c.register_failures.load(Relaxed)
    )?;
    write!(out, ",\"dropped\":{}", c.dropped.load(Relaxed))?;
    write!(out, ",\"purged\":{}", c.purged.load(Relaxed))?;
    write!(out, ",\"allocator_glibc\":{glibc}")?;
    write!(out, ",\"min_bytes\":{}", cfg.map_or(0, |c| c.min))?;
    writeln!(out, ",\"heap_top_pad\":{top_pad}}}")
}

/// The pid that wrote the report (a vfork child shares this memory: its pid does not count).
static WRITTEN_BY: AtomicU32 = AtomicU32::new(0);

fn raw_write(fd: c_int, b: &[u8]) -> bool {
    let mut done = 0;
    while done < b.len() {
        // SAFETY: writing our buffer's bytes to a descriptor.
        let n = unsafe {
            libc::write(
                fd,
                b[done..].as_ptr() as *const libc::c_void,
                b.len() - done,
            )
        };
        if n <= 0 {
            return false;
        }
        done += n as usize;
    }
    true
}

/// Writes the report if this process is meant to (`TIERMEM_PREFAULT_STATS_PID`, else the one
/// the library was loaded in; any process for a path with `%p`, replaced by its pid), once.
fn write_report() {
    let Some(svc) = state::service() else { return };
    let Some(path) = state::config().and_then(|c| c.stats.as_deref()) else {
        return;
    };
    let pid = std::process::id();
    if pid as i32 != state::ORIGIN_PID.load(Relaxed) && !path.contains("%p") {
        return;
    }
    if WRITTEN_BY.swap(pid, SeqCst) == pid {
        return;
    }
    let mut p = Buf::<4096>::new();
    for (i, part) in path.split("%p").enumerate() {
        if i > 0 {
            let _ = write!(p, "{pid}");
        }
        let _ = p.write_str(part);
    }
    let mut body = Buf::<2048>::new();
    let _ = report(svc, &mut body);
    let name = p.c_str();
    // SAFETY: a NUL-terminated path in our buffer.
    let fd = unsafe {
        libc::open(
            name,
            libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC | libc::O_CLOEXEC,
            0o644,
        )
    };
    if fd >= 0 && raw_write(fd, body.bytes()) {
        // SAFETY: closing our descriptor.
        unsafe { libc::close(fd) };
        return;
    }
    // SAFETY: __errno_location returns this thread's errno.
    let errno = unsafe { *libc::__errno_location() };
    if fd >= 0 {
        // SAFETY: closing our descriptor.
        unsafe { libc::close(fd) };
    }
    let mut m = Buf::<4200>::new();
    let _ = m.write_str("tiermem-prefault-preload: cannot write the stats file ");
    // SAFETY: `name` is the NUL-terminated path in `p`.
    m.write_bytes(unsafe { CStr::from_ptr(name) }.to_bytes());
    let _ = writeln!(m, ": errno {errno}");
    raw_write(2, m.bytes());
}

/// The `atexit` handler: writes the report, then stops the service thread and waits for it.
///
/// Without the join, `exit_group` leaves the service thread to die on its own, and the last
/// thread of a process to exit tears its address space down: a SCHED_IDLE thread, woken on
/// another core, that yields to anything runnable there. vips (0.17 s runs, 30 paired runs)
/// exited 1-2 % later with an idle service than with `TIERMEM_PREFAULT_DISABLE=1`; `strace`
/// showed the service thread gone 4 ms after `exit_group`. (A program that calls `_exit`
/// skips this; its report is still written by the `_exit` hook.)
pub extern "C" fn at_exit() {
    write_report();
    if let Some(svc) = state::any_service() {
        if svc.is_running() {
            svc.stop();
        }
    }
}

type ExitFn = unsafe extern "C" fn(c_int) -> !;

/// The real `_exit` and `_Exit`, resolved by [`resolve_exits`] (dlsym takes the loader's
/// lock: not from inside `_exit`, which a forked child or a signal handler may call).
static REAL_EXIT: AtomicUsize = AtomicUsize::new(0);
static REAL_UNDERSCORE_EXIT: AtomicUsize = AtomicUsize::new(0);

/// Resolves the real `_exit`/`_Exit` (from the constructor).
pub fn resolve_exits() {
    for (slot, name) in [(&REAL_EXIT, c"_exit"), (&REAL_UNDERSCORE_EXIT, c"_Exit")] {
        // SAFETY: dlsym with a NUL-terminated name.
        let p = unsafe { libc::dlsym(libc::RTLD_NEXT, name.as_ptr()) };
        slot.store(p as usize, SeqCst);
    }
}

fn real_exit(slot: &AtomicUsize, status: c_int) -> ! {
    let p = slot.load(SeqCst);
    // SAFETY: `p` is dlsym's next definition of `_exit`/`_Exit` (C prototype ExitFn); without
    // it, the system call those make.
    unsafe {
        if p != 0 {
            let f: ExitFn = std::mem::transmute::<usize, ExitFn>(p);
            f(status);
        }
        libc::syscall(libc::SYS_exit_group, status);
    }
    unreachable!("exit_group returned")
}

/// `_exit(2)`: writes the exit report first (see [`write_report`]).
///
/// # Safety
/// As `_exit(2)`.
#[no_mangle]
pub unsafe extern "C" fn _exit(status: c_int) -> ! {
    write_report();
    real_exit(&REAL_EXIT, status)
}

/// `_Exit(2)`: as [`_exit`].
///
/// # Safety
/// As `_Exit(2)`.
#[no_mangle]
pub unsafe extern "C" fn _Exit(status: c_int) -> ! {
    write_report();
    real_exit(&REAL_UNDERSCORE_EXIT, status)
}
