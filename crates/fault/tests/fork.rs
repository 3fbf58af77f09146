//! fork(2) with registered regions. Own test binary, one test function: fork in a process where
//! other test threads run is risky, so everything happens sequentially here.

mod common;
use common::*;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use tiermem_fault::*;

struct Logged {
    inner: Arc<PatternResolver>,
    events: Mutex<Vec<RegionEvent>>,
    child_faults: std::sync::atomic::AtomicUsize,
}
impl Resolver for Logged {
    fn resolve(&self, f: &Fault, ops: &FaultOps<'_>) -> Result<(), ResolveError> {
        if f.in_child {
            self.child_faults.fetch_add(1, Ordering::SeqCst);
        }
        self.inner.resolve(f, ops)
    }
    fn on_event(&self, ev: &RegionEvent) {
        self.events.lock().unwrap().push(*ev);
    }
}

/// Forks; the child runs `f` (async-signal-safe work only) and reports one byte through a pipe.
fn in_child(f: impl FnOnce() -> u8) -> u8 {
    let mut fds = [0; 2];
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork: {}", std::io::Error::last_os_error());
    if pid == 0 {
        let b = f();
        unsafe {
            libc::write(fds[1], &b as *const u8 as *const libc::c_void, 1);
            libc::_exit(0);
        }
    }
    unsafe { libc::close(fds[1]) };
    let mut b = 0xffu8;
    let n = unsafe { libc::read(fds[0], &mut b as *mut u8 as *mut libc::c_void, 1) };
    unsafe { libc::close(fds[0]) };
    let mut status = 0;
    assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "child status {status:#x}"
    );
    assert_eq!(n, 1, "child reported nothing");
    b
}

fn page_ok(base: *const u8, p: usize) -> bool {
    (0..PS)
        .step_by(97)
        .all(|i| unsafe { std::ptr::read_volatile(base.add(p * PS + i)) } == pattern(p, i))
}

#[test]
fn fork_share_with_child_and_dont_fork() {
    let f = require_uffd();
    let pages = 16;
    // ShareWithChild needs UFFD_FEATURE_EVENT_FORK, which the kernel grants only with
    // CAP_SYS_PTRACE: unprivileged, the engine must refuse it naming that capability, and the
    // DontFork half of the test still runs.
    let share = !f.event_fork_denied;
    if share {
        require(f.event_fork, "UFFD_FEATURE_EVENT_FORK");
    } else {
        let a = Area::anon(4);
        let r = Engine::global().register(
            RegionSpec::new(a.ptr, a.len)
                .handler_thread(0)
                .fork(ForkPolicy::ShareWithChild),
            PatternResolver::new(4),
        );
        let Err(e) = r else {
            panic!("ShareWithChild without CAP_SYS_PTRACE must be refused");
        };
        assert!(e.to_string().contains("CAP_SYS_PTRACE"), "{e}");
        skip_unprivileged(
            "fork_share_with_child_and_dont_fork (ShareWithChild half)",
            "CAP_SYS_PTRACE for UFFD_FEATURE_EVENT_FORK",
        );
    }

    // ShareWithChild, handler thread: the child's faults reach the same resolver.
    let shared = Area::anon(pages);
    let r = Arc::new(Logged {
        inner: PatternResolver::new(pages),
        events: Mutex::new(vec![]),
        child_faults: Default::default(),
    });
    let hs = share.then(|| {
        Engine::global()
            .register(
                RegionSpec::new(shared.ptr, shared.len)
                    .handler_thread(0)
                    .fork(ForkPolicy::ShareWithChild),
                r.clone(),
            )
            .unwrap()
    });
    // DontFork, both modes.
    let dont = Area::anon(4);
    let hd = Engine::global()
        .register(
            RegionSpec::new(dont.ptr, dont.len)
                .handler_thread(0)
                .fork(ForkPolicy::DontFork),
            PatternResolver::new(4),
        )
        .unwrap();
    let inth = Area::anon(4);
    let hi = Engine::global()
        .register(
            RegionSpec::new(inth.ptr, inth.len).in_thread(),
            PatternResolver::new(4),
        )
        .unwrap();
    check_page(inth.ptr, 0, 0);

    // The parent touches the first half only.
    for p in (0..pages / 2).filter(|_| share) {
        check_page(shared.ptr, p, p);
    }
    let base = shared.ptr as usize;
    let ok = if !share {
        1
    } else {
        in_child(|| {
            // Pages never touched by the parent fault in the child and are served by the parent's
            // runtime through the child's userfaultfd; the others were copied by fork.
            let all = (0..pages).all(|p| page_ok(base as *const u8, p));
            all as u8
        })
    };
    assert_eq!(ok, 1, "child saw wrong content in the shared region");
    if share {
        assert!(r
            .events
            .lock()
            .unwrap()
            .contains(&RegionEvent::Fork { child_pid: None }));
        assert!(
            r.child_faults.load(Ordering::SeqCst) >= pages / 2,
            "the child's faults went through our resolver"
        );
        // The parent still has its second half missing and resolves it itself.
        for p in pages / 2..pages {
            check_page(shared.ptr, p, p);
        }
    }

    // DontFork regions (handler-thread and in-thread) are absent in the child.
    let (d, i) = (dont.ptr as usize, inth.ptr as usize);
    let absent = in_child(|| {
        let mut v = [0u8; 4];
        let a = unsafe { libc::mincore(d as *mut libc::c_void, 4 * PS, v.as_mut_ptr()) } == -1
            && std::io::Error::last_os_error().raw_os_error() == Some(libc::ENOMEM);
        let b = unsafe { libc::mincore(i as *mut libc::c_void, 4 * PS, v.as_mut_ptr()) } == -1
            && std::io::Error::last_os_error().raw_os_error() == Some(libc::ENOMEM);
        (a as u8) | ((b as u8) << 1)
    });
    assert_eq!(
        absent, 3,
        "DontFork regions must be unmapped in the child (bit0 handler, bit1 in-thread)"
    );

    // PlainInChild (in-thread WP): the child gets the memory, unregistered and unprotected.
    // The parent protects it before the fork: a registered child would take SIGBUS on its
    // write and die; a plain one writes its own copy-on-write copy and the parent keeps its.
    let plain = Area::anon(4);
    unsafe { std::ptr::write_bytes(plain.ptr, 7, 4 * PS) };
    let hp = Engine::global()
        .register(
            RegionSpec::new(plain.ptr, plain.len)
                .in_thread()
                .modes(Modes::WP)
                .fork(ForkPolicy::PlainInChild),
            PatternResolver::new(4),
        )
        .unwrap();
    assert!(hp.is_alive());
    let pa = plain.ptr as usize;
    let wrote = in_child(|| {
        let p = pa as *mut u8;
        let before = unsafe { std::ptr::read_volatile(p.add(3 * PS + 5)) };
        unsafe { std::ptr::write_volatile(p.add(3 * PS + 5), 9) };
        (before == 7 && unsafe { std::ptr::read_volatile(p.add(3 * PS + 5)) } == 9) as u8
    });
    assert_eq!(
        wrote, 1,
        "a PlainInChild region must be plain memory in the child"
    );
    assert_eq!(
        unsafe { std::ptr::read_volatile(plain.ptr.add(3 * PS + 5)) },
        7
    );
    let other = Area::anon(1);
    assert!(
        Engine::global()
            .register(
                RegionSpec::new(other.ptr, other.len)
                    .handler_thread(0)
                    .fork(ForkPolicy::PlainInChild),
                PatternResolver::new(1),
            )
            .is_err(),
        "PlainInChild is for in-thread regions only"
    );
    drop(hp);

    // Children that exited are forgotten by the runtime (their userfaultfds closed).
    wait_for("exited children to be dropped", || {
        Engine::global().stats().children_live == 0
    });
    let st = Engine::global().stats();
    assert!(
        !share || (st.events_fork >= 1 && st.faults_child >= (pages / 2) as u64),
        "{st:?}"
    );
    drop((hs, hd, hi));
}
