//! Engine: missing/WP/MINOR faults in both resolution modes, UFFDIO_MOVE/ZEROPAGE, kernel
//! accesses, backings, bad input. Every test uses its own regions; the engine is global.

mod common;
use common::*;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use tiermem_fault::*;

const MODES: [Resolution; 3] = [
    Resolution::InThread,
    Resolution::HandlerThread { spin_us: 0 },
    Resolution::HandlerThread { spin_us: 50 },
];

fn concurrent_fill(a: &Area, res: Resolution, backing: Backing) {
    let pages = a.len / PS;
    let r = PatternResolver::new(pages);
    let h = Engine::global()
        .register(
            RegionSpec::new(a.ptr, a.len)
                .backing(backing)
                .resolution(res),
            r.clone(),
        )
        .unwrap();
    assert_eq!(h.resolution(), res);
    let threads = 4;
    std::thread::scope(|s| {
        for t in 0..threads {
            let base = a.ptr as usize;
            s.spawn(move || {
                // Each thread walks all pages in its own order: threads collide on the same
                // pages and fault different ones at the same time.
                let mut order: Vec<usize> = (0..pages).collect();
                let mut x = 0x1234_5678u64 + t as u64;
                for i in (1..pages).rev() {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    order.swap(i, (x % (i as u64 + 1)) as usize);
                }
                for p in order {
                    check_page(base as *const u8, p, p);
                }
            });
        }
    });
    for p in 0..pages {
        check_page(a.ptr, p, p);
    }
    // Every page was filled exactly once: racing copies hit EEXIST and copy nothing. (The
    // runtime thread counts after the ioctl has already woken the faulting thread: wait.)
    wait_for("the last resolver counts", || {
        r.copied.load(Ordering::Relaxed) >= pages * PS
    });
    assert_eq!(
        r.copied.load(Ordering::Relaxed),
        pages * PS,
        "{res:?}: bytes copied"
    );
    assert!(r.fills.load(Ordering::Relaxed) >= pages);
    assert!(h.faults() as usize >= pages);
    drop(h);
}

#[test]
fn missing_concurrent_anonymous_all_modes() {
    require_uffd();
    for res in MODES {
        let a = Area::anon(256);
        concurrent_fill(&a, res, Backing::Anonymous);
    }
    let st = Engine::global().stats();
    assert!(
        st.faults_in_thread >= 256 && st.faults_handler_thread >= 512,
        "{st:?}"
    );
}

fn memfd(pages: usize) -> std::fs::File {
    use std::os::fd::FromRawFd;
    let fd = unsafe { libc::memfd_create(c"tiermem-test".as_ptr(), libc::MFD_CLOEXEC) };
    assert!(fd >= 0, "memfd_create: {}", std::io::Error::last_os_error());
    let f = unsafe { std::fs::File::from_raw_fd(fd) };
    f.set_len((pages * PS) as u64).unwrap();
    f
}

#[test]
fn missing_concurrent_memfd_shmem_all_modes() {
    let f = require_uffd();
    require(f.missing_shmem, "UFFD_FEATURE_MISSING_SHMEM");
    for res in MODES {
        let m = memfd(128);
        let a = Area::map(128, libc::MAP_SHARED, m.as_raw_fd());
        concurrent_fill(&a, res, Backing::Shmem);
        let a2 = Area::shared_anon(64);
        concurrent_fill(&a2, res, Backing::Shmem);
    }
}

#[test]
fn missing_dev_shm_file_all_modes() {
    let f = require_uffd();
    require(f.missing_shmem, "UFFD_FEATURE_MISSING_SHMEM");
    assert!(
        std::path::Path::new("/dev/shm").is_dir(),
        "/dev/shm (tmpfs) is required"
    );
    for (i, res) in MODES.iter().enumerate() {
        let path = format!("/dev/shm/tiermem-fault-test-{}-{i}", std::process::id());
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .unwrap();
        std::fs::remove_file(&path).unwrap();
        file.set_len((64 * PS) as u64).unwrap();
        let a = Area::map(64, libc::MAP_SHARED, file.as_raw_fd());
        concurrent_fill(&a, *res, Backing::File);
    }
}

/// WP resolver: records write-protect faults and unprotects the page.
struct WpResolver {
    wp: Mutex<Vec<(usize, bool)>>,
    count: AtomicUsize,
}
impl Resolver for WpResolver {
    fn resolve(&self, f: &Fault, ops: &FaultOps<'_>) -> Result<(), ResolveError> {
        assert_eq!(f.kind, FaultKind::WriteProtect);
        self.count.fetch_add(1, Ordering::SeqCst);
        if f.mode != Resolution::InThread {
            // Only outside signal context may we lock.
            self.wp.lock().unwrap().push((f.offset, f.write));
        }
        ops.unprotect(f.offset, PS)
    }
}

#[test]
fn wp_sync_faults_all_modes() {
    let f = require_uffd();
    require(f.wp, "UFFD_FEATURE_PAGEFAULT_FLAG_WP");
    for res in MODES {
        let a = Area::anon(32);
        for p in 0..32 {
            unsafe { *a.page(p) = p as u8 };
        }
        let r = Arc::new(WpResolver {
            wp: Mutex::new(vec![]),
            count: AtomicUsize::new(0),
        });
        let h = Engine::global()
            .register(
                RegionSpec::new(a.ptr, a.len)
                    .modes(Modes::WP)
                    .resolution(res),
                r.clone(),
            )
            .unwrap();
        // Reads never fault.
        for p in 0..32 {
            assert_eq!(unsafe { std::ptr::read_volatile(a.page(p)) }, p as u8);
        }
        assert_eq!(
            r.count.load(Ordering::SeqCst),
            0,
            "{res:?}: reads must not fault"
        );
        // First write to each of the even pages faults once; the second does not.
        for p in (0..32).step_by(2) {
            unsafe { std::ptr::write_volatile(a.page(p).add(1), 0xee) };
            unsafe { std::ptr::write_volatile(a.page(p).add(2), 0xef) };
        }
        assert_eq!(
            r.count.load(Ordering::SeqCst),
            16,
            "{res:?}: one WP fault per written page"
        );
        if res != Resolution::InThread {
            let v = r.wp.lock().unwrap().clone();
            let offs: Vec<usize> = v.iter().map(|x| x.0).collect();
            assert_eq!(offs, (0..32).step_by(2).map(|p| p * PS).collect::<Vec<_>>());
            assert!(v.iter().all(|x| x.1), "WP faults are writes");
        }
        // Re-arm through the handle: the next write faults again.
        h.protect(0, PS).unwrap();
        unsafe { std::ptr::write_volatile(a.page(0), 1) };
        assert_eq!(r.count.load(Ordering::SeqCst), 17);
        for p in 0..32 {
            let v = unsafe { std::ptr::read_volatile(a.page(p)) };
            assert_eq!(v, if p == 0 { 1 } else { p as u8 });
        }
    }
}

/// MINOR resolver: optionally rewrites the page through the second mapping, then CONTINUE.
struct MinorResolver {
    other: usize,
    count: AtomicUsize,
}
impl Resolver for MinorResolver {
    fn resolve(&self, f: &Fault, ops: &FaultOps<'_>) -> Result<(), ResolveError> {
        if f.kind != FaultKind::Minor {
            return Err(ResolveError::Resolver("expected a MINOR fault"));
        }
        self.count.fetch_add(1, Ordering::SeqCst);
        // Stamp the page through the other view before mapping it here.
        unsafe { std::ptr::write_volatile((self.other + f.offset + 100) as *mut u8, 0x77) };
        ops.cont(f.offset, PS).map(|_| ())
    }
}

#[test]
fn minor_faults_memfd_mapped_twice_all_modes() {
    let f = require_uffd();
    require(f.minor_shmem, "UFFD_FEATURE_MINOR_SHMEM");
    for res in MODES {
        let m = memfd(16);
        let view = Area::map(16, libc::MAP_SHARED, m.as_raw_fd());
        for p in 0..16 {
            for i in 0..PS {
                unsafe { *view.page(p).add(i) = pattern(p, i) };
            }
        }
        let a = Area::map(16, libc::MAP_SHARED, m.as_raw_fd());
        let r = Arc::new(MinorResolver {
            other: view.addr(),
            count: AtomicUsize::new(0),
        });
        let _h = Engine::global()
            .register(
                RegionSpec::new(a.ptr, a.len)
                    .backing(Backing::Shmem)
                    .modes(Modes::MINOR)
                    .resolution(res),
                r.clone(),
            )
            .unwrap();
        for p in 0..16 {
            for i in [0usize, 99, 101, PS - 1] {
                assert_eq!(
                    unsafe { std::ptr::read_volatile(a.page(p).add(i)) },
                    pattern(p, i),
                    "{res:?} page {p}"
                );
            }
            assert_eq!(unsafe { std::ptr::read_volatile(a.page(p).add(100)) }, 0x77);
        }
        wait_for("the resolver to count", || {
            r.count.load(Ordering::SeqCst) >= 16
        });
        assert_eq!(
            r.count.load(Ordering::SeqCst),
            16,
            "{res:?}: one minor fault per page"
        );
    }
}

/// Even pages: ZEROPAGE. Odd pages: UFFDIO_MOVE from a staging area prepared up front.
struct MoveZeroResolver {
    staging: usize,
    moved: AtomicUsize,
    zeroed: AtomicUsize,
}
impl Resolver for MoveZeroResolver {
    fn resolve(&self, f: &Fault, ops: &FaultOps<'_>) -> Result<(), ResolveError> {
        let p = f.offset / PS;
        if p & 1 == 0 {
            self.zeroed
                .fetch_add(ops.zero(f.offset, PS)?, Ordering::SeqCst);
        } else {
            let n = ops.move_in(f.offset, (self.staging + f.offset) as *const u8, PS)?;
            self.moved.fetch_add(n, Ordering::SeqCst);
        }
        Ok(())
    }
}

#[test]
fn move_and_zeropage_resolvers_all_modes() {
    let f = require_uffd();
    require(f.move_, "UFFD_FEATURE_MOVE");
    for res in MODES {
        let pages = 32;
        let staging = Area::anon(pages);
        for p in 0..pages {
            for i in 0..PS {
                unsafe { *staging.page(p).add(i) = pattern(p, i) };
            }
        }
        let a = Area::anon(pages);
        let r = Arc::new(MoveZeroResolver {
            staging: staging.addr(),
            moved: AtomicUsize::new(0),
            zeroed: AtomicUsize::new(0),
        });
        let _h = Engine::global()
            .register(RegionSpec::new(a.ptr, a.len).resolution(res), r.clone())
            .unwrap();
        for p in 0..pages {
            if p % 2 == 0 {
                assert!(
                    (0..PS).all(|i| unsafe { *a.page(p).add(i) } == 0),
                    "{res:?}: page {p} zero"
                );
            } else {
                check_page(a.ptr, p, p);
                // The source page was moved away, not copied: staging now reads as zeroes.
                assert_eq!(
                    unsafe { std::ptr::read_volatile(staging.page(p).add(5)) },
                    0
                );
            }
        }
        wait_for("the last resolver counts", || {
            r.moved.load(Ordering::SeqCst) + r.zeroed.load(Ordering::SeqCst) >= pages * PS
        });
        assert_eq!(r.moved.load(Ordering::SeqCst), pages / 2 * PS);
        assert_eq!(r.zeroed.load(Ordering::SeqCst), pages / 2 * PS);
    }
}

#[test]
fn kernel_access_read2_into_missing_page() {
    let f = require_uffd();
    let mut file = tempfile_with(&(0..PS).map(|i| (i % 251) as u8).collect::<Vec<_>>());
    // Handler-thread: read(2) into a missing page faults in the kernel, the runtime fills it,
    // and the read succeeds — with a descriptor that delivers kernel-mode faults. A
    // user-mode-only one (an unprivileged user) makes the read fail with EFAULT instead, and the
    // resolver never runs; a user access still works.
    let a = Area::anon(4);
    let r = PatternResolver::new(4);
    let h = Engine::global()
        .register(RegionSpec::new(a.ptr, a.len).handler_thread(0), r.clone())
        .unwrap();
    assert_eq!(Engine::global().access().unwrap(), f.access);
    use std::io::Seek;
    file.seek(std::io::SeekFrom::Start(0)).unwrap();
    let n = unsafe { libc::read(file.as_raw_fd(), a.page(1) as *mut libc::c_void, PS) };
    if f.access.kernel_faults() {
        assert_eq!(
            n,
            PS as isize,
            "read(2) into a handler-thread region: {}",
            std::io::Error::last_os_error()
        );
        assert!((0..PS).all(|i| unsafe { *a.page(1).add(i) } == (i % 251) as u8));
        wait_for("the resolver to count", || {
            r.fills.load(Ordering::SeqCst) >= 1
        });
        assert_eq!(r.fills.load(Ordering::SeqCst), 1);
    } else {
        let e = std::io::Error::last_os_error();
        assert_eq!(n, -1, "{:?}: read(2) must fail", f.access);
        assert_eq!(e.raw_os_error(), Some(libc::EFAULT), "{:?}", f.access);
        assert_eq!(r.fills.load(Ordering::SeqCst), 0);
        check_page(a.ptr, 1, 1);
    }
    drop(h);
    // In-thread (UFFD_FEATURE_SIGBUS): the kernel cannot deliver the signal inside read(2), so
    // the read fails with EFAULT — the documented cost of the fast path.
    let b = Area::anon(4);
    let r = PatternResolver::new(4);
    let _h = Engine::global()
        .register(RegionSpec::new(b.ptr, b.len).in_thread(), r.clone())
        .unwrap();
    file.seek(std::io::SeekFrom::Start(0)).unwrap();
    let n = unsafe { libc::read(file.as_raw_fd(), b.page(1) as *mut libc::c_void, PS) };
    let e = std::io::Error::last_os_error();
    assert_eq!(n, -1);
    assert_eq!(
        e.raw_os_error(),
        Some(libc::EFAULT),
        "in-thread region: read(2) must fail with EFAULT"
    );
    assert_eq!(r.fills.load(Ordering::SeqCst), 0);
    // A user access still works.
    check_page(b.ptr, 1, 1);
}

fn tempfile_with(data: &[u8]) -> std::fs::File {
    use std::io::Write;
    let path = std::env::temp_dir().join(format!(
        "tiermem-fault-read-{}-{:?}",
        std::process::id(),
        std::thread::current().id()
    ));
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&path)
        .unwrap();
    std::fs::remove_file(&path).unwrap();
    f.write_all(data).unwrap();
    f
}

#[test]
fn bad_input_is_rejected_clearly() {
    require_uffd();
    let e = Engine::global();
    let a = Area::anon(8);
    let r = PatternResolver::new(8);
    let err = e
        .register(RegionSpec::new(unsafe { a.ptr.add(1) }, PS), r.clone())
        .unwrap_err();
    assert!(matches!(err, Error::InvalidArgument(_)), "{err}");
    assert!(err.to_string().contains("aligned"), "{err}");
    let err = e
        .register(RegionSpec::new(a.ptr, 0), r.clone())
        .unwrap_err();
    assert!(
        matches!(err, Error::InvalidArgument(_)) && err.to_string().contains("zero"),
        "{err}"
    );
    let err = e
        .register(RegionSpec::new(a.ptr, PS + 1), r.clone())
        .unwrap_err();
    assert!(matches!(err, Error::InvalidArgument(_)), "{err}");
    let err = e
        .register(
            RegionSpec::new(a.ptr, a.len).modes(Modes::default()),
            r.clone(),
        )
        .unwrap_err();
    assert!(matches!(err, Error::InvalidArgument(_)), "{err}");
    let err = e
        .register(RegionSpec::new(a.ptr, a.len).modes(Modes::MINOR), r.clone())
        .unwrap_err();
    assert!(
        matches!(err, Error::Unsupported(_)) && err.to_string().contains("MINOR"),
        "{err}"
    );
    let err = e
        .register(
            RegionSpec::new(a.ptr, a.len)
                .fork(ForkPolicy::ShareWithChild)
                .in_thread(),
            r.clone(),
        )
        .unwrap_err();
    assert!(matches!(err, Error::Unsupported(_)), "{err}");
    let err = e
        .register(
            RegionSpec::new(a.ptr, a.len).missing(true).wp_async(true),
            r.clone(),
        )
        .unwrap_err();
    assert!(matches!(err, Error::InvalidArgument(_)), "{err}");

    // Overlap, in either mode.
    let h = e
        .register(RegionSpec::new(a.ptr, 4 * PS), r.clone())
        .unwrap();
    let err = e
        .register(
            RegionSpec::new(a.page(2), 4 * PS).handler_thread(0),
            r.clone(),
        )
        .unwrap_err();
    assert!(matches!(err, Error::Overlap { .. }), "{err}");
    assert!(err.to_string().contains("overlaps"), "{err}");
    // Adjacent is fine.
    let h2 = e
        .register(
            RegionSpec::new(a.page(4), 4 * PS).handler_thread(0),
            r.clone(),
        )
        .unwrap();
    drop(h);
    drop(h2);

    // MISSING on a regular-file mapping (not tmpfs).
    let dir = std::env::var("CARGO_TARGET_TMPDIR")
        .unwrap_or_else(|_| env!("CARGO_MANIFEST_DIR").to_string());
    let path = std::path::Path::new(&dir).join(format!("regular-{}", std::process::id()));
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&path)
        .unwrap();
    std::fs::remove_file(&path).unwrap();
    let mut sfs: libc::statfs = unsafe { std::mem::zeroed() };
    unsafe { libc::fstatfs(file.as_raw_fd(), &mut sfs) };
    assert_ne!(
        sfs.f_type,
        libc::TMPFS_MAGIC,
        "{dir} must not be tmpfs for this check"
    );
    file.set_len((4 * PS) as u64).unwrap();
    let fm = Area::map(4, libc::MAP_SHARED, file.as_raw_fd());
    let err = e
        .register(
            RegionSpec::new(fm.ptr, fm.len).backing(Backing::File),
            r.clone(),
        )
        .unwrap_err();
    assert!(
        matches!(err, Error::Unsupported(_)) && err.to_string().contains("file mapping"),
        "{err}"
    );
    // Unmapped range: the top of the 47-bit user address space, which mmap without a hint
    // never hands out (a freshly unmapped hole could be taken by another test thread's mmap
    // before the register: seen once in a full suite run).
    let addr = ((1usize << 47) - 2 * PS) as *mut u8;
    let err = e
        .register(RegionSpec::new(addr, 2 * PS).handler_thread(0), r.clone())
        .unwrap_err();
    assert!(
        matches!(err, Error::InvalidArgument(_) | Error::Syscall { .. }),
        "{err}"
    );
}

#[test]
fn unregister_makes_memory_ordinary_again() {
    require_uffd();
    for res in MODES {
        let a = Area::anon(8);
        let r = PatternResolver::new(8);
        let h = Engine::global()
            .register(RegionSpec::new(a.ptr, a.len).resolution(res), r.clone())
            .unwrap();
        check_page(a.ptr, 0, 0);
        assert!(h.is_alive());
        h.unregister().unwrap();
        // Now page 1 is ordinary anonymous memory: zero-filled by the kernel.
        assert_eq!(unsafe { std::ptr::read_volatile(a.page(1).add(7)) }, 0);
        assert_eq!(r.fills.load(Ordering::SeqCst), 1);
        // And the range can be registered again.
        let h = Engine::global()
            .register(
                RegionSpec::new(a.page(2), 2 * PS).resolution(res),
                r.clone(),
            )
            .unwrap();
        check_page(a.page(2), 0, 0);
        drop(h);
    }
}

/// A resolver that fails: the faulting access must crash with SIGBUS, not loop.
struct Failing;
impl Resolver for Failing {
    fn resolve(&self, _f: &Fault, _ops: &FaultOps<'_>) -> Result<(), ResolveError> {
        Err(ResolveError::Resolver("deliberate failure"))
    }
}

/// Helper run in a fresh process by `failing_in_thread_resolver_crashes_with_sigbus`.
#[test]
#[ignore = "helper: run only as a child process"]
fn failing_resolver_child() {
    assert_eq!(
        std::env::var("TIERMEM_FAULT_CRASH_CHILD").as_deref(),
        Ok("1"),
        "helper only"
    );
    let a = Area::anon(2);
    let _h = Engine::global()
        .register(RegionSpec::new(a.ptr, a.len), Arc::new(Failing))
        .unwrap();
    unsafe { std::ptr::write_volatile(a.ptr, 1) };
    unreachable!("the access must have crashed");
}

#[test]
fn failing_in_thread_resolver_crashes_with_sigbus() {
    require_uffd();
    use std::os::unix::process::ExitStatusExt;
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--ignored",
            "--exact",
            "failing_resolver_child",
            "--test-threads=1",
        ])
        .env("TIERMEM_FAULT_CRASH_CHILD", "1")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.signal(),
        Some(libc::SIGBUS),
        "child status {:?}, stderr: {stderr}",
        out.status
    );
    assert!(
        stderr.contains("deliberate failure"),
        "the failure must be reported: {stderr}"
    );
}

#[test]
fn install_outside_a_fault_skips_present_pages() {
    for res in MODES {
        let pages = 16;
        let a = Area::anon(pages);
        let r = PatternResolver::new(pages);
        let h = Engine::global()
            .register(RegionSpec::new(a.ptr, a.len).resolution(res), r.clone())
            .unwrap();
        // Page 3 faults in through the resolver (its pattern); then install pages 0..8 with
        // 0xAB and zero pages 8..16: page 3 keeps its pattern, the others get the installs.
        check_page(a.ptr, 3, 3);
        let img = vec![0xABu8; 8 * PS];
        let n = h.install(0, &img).unwrap();
        assert_eq!(n, 7 * PS, "{res:?}: the present page is skipped");
        assert_eq!(h.install_zero(8 * PS, 8 * PS).unwrap(), 8 * PS);
        for p in 0..pages {
            // SAFETY: every page is present now (no fault).
            let b = unsafe { std::slice::from_raw_parts(a.page(p), PS) };
            match p {
                3 => check_page(a.ptr, 3, 3),
                0..=7 => assert!(b.iter().all(|&x| x == 0xAB), "{res:?} page {p}"),
                _ => assert!(b.iter().all(|&x| x == 0), "{res:?} page {p}"),
            }
        }
        assert_eq!(r.fills.load(Ordering::Relaxed), 1, "only page 3 faulted");
        assert!(h.install(1, &img).is_err(), "unaligned offset refused");
        assert!(h.install(12 * PS, &img).is_err(), "past the end refused");
        drop(h);
    }
}
