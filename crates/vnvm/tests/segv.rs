//! A direct store into a region faults: the view is read-only.

mod common;
use common::*;
use tiermem_vnvm::{nv_init, Mode};

#[test]
fn direct_store_raises_sigsegv() {
    let d = tmp();
    let vn = nv_init(&small_cfg(d.path(), 8, 8)).unwrap();
    let r = vn
        .nv_allocate(d.path().join("f"), 4096, Mode::Private)
        .unwrap();
    let p = r.as_ptr() as *mut u8;
    // SAFETY: the child only performs the faulting store and _exit; no locks are taken.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0);
    if pid == 0 {
        // SAFETY: deliberately storing into the read-only mapping (expected to fault).
        unsafe {
            p.write_volatile(42);
            libc::_exit(0);
        }
    }
    let mut status = 0;
    // SAFETY: waiting for our own child.
    assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
    assert!(
        libc::WIFSIGNALED(status),
        "child exited normally: the store did not fault"
    );
    assert_eq!(libc::WTERMSIG(status), libc::SIGSEGV);
    // SAFETY: inside the region.
    assert_eq!(unsafe { *r.as_ptr() }, 0, "nothing leaked");
    vn.nv_release().unwrap();
}
