//! Non-cooperative events: munmap, mremap, MADV_DONTNEED, in both resolution modes.

mod common;
use common::*;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use tiermem_fault::*;

const MODES: [Resolution; 2] = [
    Resolution::InThread,
    Resolution::HandlerThread { spin_us: 0 },
];

/// Pattern fills plus an event log.
struct Logged {
    inner: Arc<PatternResolver>,
    events: Mutex<Vec<RegionEvent>>,
}
impl Resolver for Logged {
    fn resolve(&self, f: &Fault, ops: &FaultOps<'_>) -> Result<(), ResolveError> {
        self.inner.resolve(f, ops)
    }
    fn on_event(&self, ev: &RegionEvent) {
        self.events.lock().unwrap().push(*ev);
    }
}
fn logged(pages: usize) -> Arc<Logged> {
    Arc::new(Logged {
        inner: PatternResolver::new(pages),
        events: Mutex::new(vec![]),
    })
}

#[test]
fn munmap_drops_region_and_reports_unmap() {
    require_uffd();
    for res in MODES {
        let a = Area::anon(8);
        let r = logged(8);
        let h = Engine::global()
            .register(RegionSpec::new(a.ptr, a.len).resolution(res), r.clone())
            .unwrap();
        check_page(a.ptr, 3, 3);
        let (ptr, len) = (a.ptr, a.len);
        std::mem::forget(a);
        assert_eq!(unsafe { libc::munmap(ptr as *mut libc::c_void, len) }, 0);
        wait_for("the Unmap event", || {
            r.events
                .lock()
                .unwrap()
                .contains(&RegionEvent::Unmap { offset: 0, len })
        });
        wait_for("the region to be dropped", || !h.is_alive());
        assert_eq!(h.len(), 0);
        drop(h); // no error, nothing left to unregister
                 // The address range can be reused and registered again.
        let b = Area::anon(8);
        let r2 = PatternResolver::new(8);
        let h2 = Engine::global()
            .register(RegionSpec::new(b.ptr, b.len).resolution(res), r2)
            .unwrap();
        check_page(b.ptr, 0, 0);
        drop(h2);
    }
}

#[test]
fn mremap_moves_region_offsets_unchanged() {
    require_uffd();
    for res in MODES {
        let pages = 16;
        let a = Area::anon(pages);
        let r = logged(pages);
        let h = Engine::global()
            .register(RegionSpec::new(a.ptr, a.len).resolution(res), r.clone())
            .unwrap();
        check_page(a.ptr, 0, 0);
        check_page(a.ptr, 5, 5);
        // Move to a fresh, reserved destination.
        let dst = Area::anon(pages);
        let dptr = dst.ptr;
        std::mem::forget(dst);
        let (old, len) = (a.ptr, a.len);
        std::mem::forget(a);
        let p = unsafe {
            libc::mremap(
                old as *mut libc::c_void,
                len,
                len,
                libc::MREMAP_MAYMOVE | libc::MREMAP_FIXED,
                dptr as *mut libc::c_void,
            )
        };
        assert_eq!(
            p as *mut u8,
            dptr,
            "mremap: {}",
            std::io::Error::last_os_error()
        );
        // Pages already there moved with the mapping; missing ones fault at the new address and
        // are resolved with their region offsets.
        for pg in 0..pages {
            check_page(dptr, pg, pg);
        }
        wait_for("the Remap event", || {
            r.events.lock().unwrap().contains(&RegionEvent::Remap {
                new_base: dptr as usize,
                new_len: len,
            })
        });
        assert_eq!(h.base(), dptr);
        assert_eq!(h.len(), len);
        wait_for("the resolver to count", || {
            r.inner.copied.load(Ordering::SeqCst) >= pages * PS
        });
        assert_eq!(
            r.inner.copied.load(Ordering::SeqCst),
            pages * PS,
            "{res:?}: each page filled once"
        );
        drop(h);
        unsafe { libc::munmap(dptr as *mut libc::c_void, len) };
    }
}

#[test]
fn madv_dontneed_reports_remove_and_refaults() {
    require_uffd();
    for res in MODES {
        let pages = 8;
        let a = Area::anon(pages);
        let r = logged(pages);
        let h = Engine::global()
            .register(RegionSpec::new(a.ptr, a.len).resolution(res), r.clone())
            .unwrap();
        for p in 0..pages {
            check_page(a.ptr, p, p);
        }
        wait_for("the resolver to count", || {
            r.inner.copied.load(Ordering::SeqCst) >= pages * PS
        });
        let fills = r.inner.fills.load(Ordering::SeqCst);
        assert_eq!(
            unsafe { libc::madvise(a.page(2) as *mut libc::c_void, 3 * PS, libc::MADV_DONTNEED) },
            0
        );
        wait_for("the Remove event", || {
            r.events.lock().unwrap().contains(&RegionEvent::Remove {
                offset: 2 * PS,
                len: 3 * PS,
            })
        });
        // The dropped pages fault again and are refilled; the others do not.
        for p in 0..pages {
            check_page(a.ptr, p, p);
        }
        wait_for("the refills to be counted", || {
            r.inner.fills.load(Ordering::SeqCst) - fills >= 3
        });
        wait_for("the refills to be counted", || {
            r.inner.copied.load(Ordering::SeqCst) >= (pages + 3) * PS
        });
        assert_eq!(
            r.inner.copied.load(Ordering::SeqCst),
            (pages + 3) * PS,
            "{res:?}"
        );
        assert!(h.is_alive());
    }
}
