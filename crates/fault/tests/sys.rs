//! The hand-written uapi constants, checked against the running kernel.

mod common;
use common::*;
use tiermem_fault::sys::*;

#[test]
fn features_and_api_ioctls() {
    let f = require_uffd();
    for (ok, name) in [
        (f.sigbus, "UFFD_FEATURE_SIGBUS"),
        (f.wp, "UFFD_FEATURE_PAGEFAULT_FLAG_WP"),
        (f.wp_async, "UFFD_FEATURE_WP_ASYNC"),
        (f.wp_unpopulated, "UFFD_FEATURE_WP_UNPOPULATED"),
        (f.minor_shmem, "UFFD_FEATURE_MINOR_SHMEM"),
        (f.move_, "UFFD_FEATURE_MOVE"),
        (
            // EVENT_FORK counts when the kernel offers it, granted or not (CAP_SYS_PTRACE).
            (f.event_fork || f.event_fork_denied)
                && f.event_remap
                && f.event_remove
                && f.event_unmap,
            "UFFD_FEATURE_EVENT_*",
        ),
        (f.thread_id, "UFFD_FEATURE_THREAD_ID"),
    ] {
        require(ok, name);
    }
    let u = Uffd::open(UFFD_FEATURE_SIGBUS | UFFD_FEATURE_WP_ASYNC, "test").unwrap();
    let io = u.api_ioctls();
    for bit in [_UFFDIO_REGISTER, _UFFDIO_UNREGISTER, _UFFDIO_API] {
        assert!(
            io & (1 << bit) != 0,
            "ioctl bit {bit} missing from UFFDIO_API answer {io:#x}"
        );
    }
    // Registering reports the range ioctls at the bit positions we use.
    let a = Area::anon(4);
    let m = u
        .register(
            a.addr(),
            a.len,
            UFFDIO_REGISTER_MODE_MISSING | UFFDIO_REGISTER_MODE_WP,
        )
        .unwrap();
    for bit in [
        _UFFDIO_WAKE,
        _UFFDIO_COPY,
        _UFFDIO_ZEROPAGE,
        _UFFDIO_WRITEPROTECT,
        _UFFDIO_MOVE,
        _UFFDIO_POISON,
    ] {
        assert!(
            m & (1 << bit) != 0,
            "range ioctl bit {bit} missing from {m:#x}"
        );
    }
    // COPY, ZEROPAGE, WRITEPROTECT, POISON, UNREGISTER work with our struct layouts.
    let src = vec![3u8; PS];
    assert_eq!(
        u.copy(
            a.addr(),
            src.as_ptr() as usize,
            PS,
            UFFDIO_COPY_MODE_DONTWAKE
        )
        .unwrap(),
        PS
    );
    assert_eq!(
        u.copy(a.addr(), src.as_ptr() as usize, PS, 0).unwrap(),
        0,
        "EEXIST counts as done"
    );
    assert_eq!(u.zeropage(a.addr() + PS, PS, 0).unwrap(), PS);
    u.writeprotect(a.addr(), PS, true, false).unwrap();
    u.writeprotect(a.addr(), PS, false, true).unwrap();
    u.poison(a.addr() + 3 * PS, PS).unwrap();
    assert_eq!(unsafe { *a.ptr }, 3);
    u.unregister(a.addr(), a.len).unwrap();
    // Unknown features are refused with a precise error.
    let e = Uffd::open(1 << 40, "test").unwrap_err();
    assert!(
        e.to_string().contains("lacks userfaultfd feature") || e.to_string().contains("UFFDIO_API"),
        "{e}"
    );
}

fn scan_one(pm: &Pagemap, addr: usize, flags: u64, mask: u64) -> u64 {
    let mut buf = [PageRegion::default(); 4];
    let mut arg = PmScanArg {
        flags,
        start: addr as u64,
        end: (addr + PS) as u64,
        vec: buf.as_mut_ptr() as u64,
        vec_len: 4,
        category_anyof_mask: mask,
        return_mask: mask,
        ..Default::default()
    };
    let n = pm
        .scan(&mut arg)
        .expect("PAGEMAP_SCAN (Linux 6.7) must be available");
    if n == 0 {
        0
    } else {
        buf[0].categories
    }
}

#[test]
fn pagemap_scan_categories() {
    require_uffd();
    let pm = Pagemap::open().unwrap();
    let all = (1 << 8) - 1;
    let a = Area::anon(4);
    unsafe { *a.page(0) = 1 };
    let _ = unsafe { std::ptr::read_volatile(a.page(1)) };
    let c0 = scan_one(&pm, a.addr(), 0, all);
    assert!(
        c0 & PAGE_IS_PRESENT != 0,
        "written page: PAGE_IS_PRESENT, got {c0:#x}"
    );
    assert!(
        c0 & PAGE_IS_FILE == 0 && c0 & PAGE_IS_PFNZERO == 0 && c0 & PAGE_IS_WPALLOWED == 0,
        "{c0:#x}"
    );
    let c1 = scan_one(&pm, a.addr() + PS, 0, all);
    assert!(
        c1 & PAGE_IS_PFNZERO != 0 && c1 & PAGE_IS_PRESENT != 0,
        "read-only touched anon page maps the zero pfn: {c1:#x}"
    );
    assert_eq!(
        scan_one(&pm, a.addr() + 2 * PS, 0, all) & PAGE_IS_PRESENT,
        0
    );
    // A /dev/shm file page is PAGE_IS_FILE.
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(format!("/dev/shm/tiermem-sys-{}", std::process::id()))
        .unwrap();
    std::fs::remove_file(format!("/dev/shm/tiermem-sys-{}", std::process::id())).unwrap();
    f.set_len(PS as u64).unwrap();
    use std::os::fd::AsRawFd;
    let fm = Area::map(1, libc::MAP_SHARED, f.as_raw_fd());
    unsafe { *fm.ptr = 1 };
    assert!(scan_one(&pm, fm.addr(), 0, all) & PAGE_IS_FILE != 0);
    // WP_ASYNC: registered → WPALLOWED; protected → not WRITTEN; written → WRITTEN; the
    // WP_MATCHING scan re-protects.
    let u = Uffd::open(UFFD_FEATURE_WP_ASYNC | UFFD_FEATURE_WP_UNPOPULATED, "test").unwrap();
    u.register(a.addr(), a.len, UFFDIO_REGISTER_MODE_WP)
        .unwrap();
    u.writeprotect(a.addr(), a.len, true, false).unwrap();
    let c = scan_one(&pm, a.addr(), 0, all);
    assert!(
        c & PAGE_IS_WPALLOWED != 0 && c & PAGE_IS_WRITTEN == 0,
        "{c:#x}"
    );
    unsafe { *a.page(0) = 2 };
    let c = scan_one(&pm, a.addr(), 0, all);
    assert!(c & PAGE_IS_WRITTEN != 0, "{c:#x}");
    let c = scan_one(
        &pm,
        a.addr(),
        PM_SCAN_WP_MATCHING | PM_SCAN_CHECK_WPASYNC,
        PAGE_IS_WRITTEN,
    );
    assert_eq!(c, PAGE_IS_WRITTEN);
    assert_eq!(
        scan_one(&pm, a.addr(), 0, all) & PAGE_IS_WRITTEN,
        0,
        "re-protected by WP_MATCHING"
    );
    // CHECK_WPASYNC on a range that is not WP_ASYNC-registered is refused.
    let b = Area::anon(1);
    let mut buf = [PageRegion::default(); 1];
    let mut arg = PmScanArg {
        flags: PM_SCAN_WP_MATCHING | PM_SCAN_CHECK_WPASYNC,
        start: b.addr() as u64,
        end: (b.addr() + PS) as u64,
        vec: buf.as_mut_ptr() as u64,
        vec_len: 1,
        category_mask: PAGE_IS_WRITTEN,
        return_mask: PAGE_IS_WRITTEN,
        ..Default::default()
    };
    assert!(pm.scan(&mut arg).is_err());
}

#[test]
fn sigbus_error_code_is_filled() {
    // In-thread classification relies on REG_ERR in the SIGBUS ucontext (bit0 present, bit1
    // write): a WP fault (present+write) must reach the resolver as WriteProtect, a missing
    // read as Missing with write=false.
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use tiermem_fault::*;
    let f = require_uffd();
    require(f.sigbus && f.wp, "UFFD_FEATURE_SIGBUS + WP");
    static KINDS: AtomicUsize = AtomicUsize::new(0);
    struct R;
    impl Resolver for R {
        fn resolve(&self, f: &Fault, ops: &FaultOps<'_>) -> Result<(), ResolveError> {
            match (f.kind, f.write) {
                (FaultKind::Missing, false) => {
                    KINDS.fetch_or(1, Ordering::SeqCst);
                    ops.zero(f.offset, PAGE_SIZE).map(|_| ())
                }
                (FaultKind::Missing, true) => {
                    KINDS.fetch_or(2, Ordering::SeqCst);
                    ops.zero(f.offset, PAGE_SIZE).map(|_| ())
                }
                (FaultKind::WriteProtect, true) => {
                    KINDS.fetch_or(4, Ordering::SeqCst);
                    ops.unprotect(f.offset, PAGE_SIZE)
                }
                _ => Err(ResolveError::Resolver("unexpected fault class")),
            }
        }
    }
    let a = Area::anon(4);
    unsafe { *a.page(2) = 5 };
    let _h = Engine::global()
        .register(
            RegionSpec::new(a.ptr, a.len).missing(true).wp(true),
            Arc::new(R),
        )
        .unwrap();
    let _ = unsafe { std::ptr::read_volatile(a.page(0)) };
    unsafe { std::ptr::write_volatile(a.page(1), 1) };
    unsafe { std::ptr::write_volatile(a.page(2), 6) };
    assert_eq!(
        KINDS.load(Ordering::SeqCst),
        7,
        "read-missing, write-missing and write-protect faults classified"
    );
}

/// The three ways to a userfaultfd: probed in order, the one in use is the first that works and
/// is remembered; a failed way says what it would need. Root uses the plain syscall; any user
/// gets UFFD_USER_MODE_ONLY on this kernel (≥ 5.11).
#[test]
fn access_ways_are_probed_in_order_and_remembered() {
    use tiermem_fault::access::{self, UffdAccess};
    let f = require_uffd();
    let rows = access::probe();
    assert_eq!(
        rows.iter().map(|r| r.access).collect::<Vec<_>>(),
        UffdAccess::ALL.to_vec()
    );
    for r in &rows {
        assert_eq!(r.errno.is_some(), r.needs.is_some(), "{r:?}");
    }
    assert_eq!(access::usable(), Some(f.access));
    assert_eq!(access::remembered(), Some(f.access));
    assert!(rows[2].errno.is_none(), "UFFD_USER_MODE_ONLY: {rows:?}");
    assert_eq!(f.user_mode_only, f.access == UffdAccess::UserModeOnly);
    assert_eq!(
        f.access.kernel_faults(),
        f.access != UffdAccess::UserModeOnly
    );
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        assert_eq!(f.access, UffdAccess::Syscall);
    }
    let u = Uffd::open(0, "test").unwrap();
    assert_eq!(u.access(), f.access);
    assert_eq!(u.features().access, f.access);
    let needs = |a, e| access::needs(a, e);
    assert!(needs(UffdAccess::Syscall, libc::EPERM).contains("vm.unprivileged_userfaultfd=1"));
    assert!(needs(UffdAccess::DevUserfaultfd, libc::EACCES).contains("chmod 0666"));
    assert!(needs(UffdAccess::DevUserfaultfd, libc::ENOENT).contains("6.1"));
    assert!(needs(UffdAccess::UserModeOnly, libc::EINVAL).contains("5.11"));
    assert!(needs(UffdAccess::Syscall, libc::ENOSYS).contains("CONFIG_USERFAULTFD"));
}
