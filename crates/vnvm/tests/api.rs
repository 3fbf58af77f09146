//! API round trips, read-committed visibility, bad input.

mod common;
use common::*;
use std::time::Duration;
use tiermem_vnvm::{nv_init, recover, Mode, VnvmError};

#[test]
fn write_commit_read_release_reread() {
    let d = tmp();
    let file = d.path().join("data.bin");
    let vn = nv_init(&small_cfg(d.path(), 64, 64)).unwrap();
    let r = vn
        .nv_allocate(&file, 3 * 4096 + 100, Mode::Private)
        .unwrap();
    assert_eq!(r.len(), 3 * 4096 + 100);
    assert_eq!(region_bytes(&r), vec![0u8; r.len()]);
    let tid = vn.nv_txbegin();
    // Crosses a page boundary: split into two entries.
    // SAFETY: offset 4090 is inside the region.
    let dst = unsafe { r.as_ptr().add(4090) };
    assert_eq!(vn.nv_write(tid, dst, b"hello, vnvm!").unwrap(), 12);
    // SAFETY: last 4 bytes of the region.
    let end = unsafe { r.as_ptr().add(r.len() - 4) };
    assert_eq!(vn.nv_write(tid, end, b"tail").unwrap(), 4);
    vn.nv_commit(tid).unwrap();
    let mut b = [0u8; 12];
    r.read(4090, &mut b);
    assert_eq!(&b, b"hello, vnvm!");
    // Plain load through the pointer.
    // SAFETY: inside the region.
    assert_eq!(unsafe { *r.as_ptr().add(4090) }, b'h');
    vn.drain().unwrap();
    assert_eq!(vn.stats().applied, 1);
    vn.nv_release().unwrap();
    let on_disk = std::fs::read(&file).unwrap();
    assert_eq!(on_disk.len(), 3 * 4096 + 100);
    assert_eq!(&on_disk[4090..4102], b"hello, vnvm!");
    assert_eq!(&on_disk[on_disk.len() - 4..], b"tail");

    // A second run of the instance sees the file's data; recover on a clean instance is a no-op.
    let rep = recover(d.path().join("inst")).unwrap();
    assert!(rep.was_clean);
    assert_eq!(rep.transactions_replayed, 0);
    let vn = nv_init(&small_cfg(d.path(), 64, 64)).unwrap();
    let r = vn
        .nv_allocate(&file, 3 * 4096 + 100, Mode::Private)
        .unwrap();
    let mut b = [0u8; 12];
    r.read(4090, &mut b);
    assert_eq!(&b, b"hello, vnvm!");
    vn.nv_free(r).unwrap();
    vn.nv_release().unwrap();
}

#[test]
fn read_committed_only() {
    let d = tmp();
    let vn = nv_init(&small_cfg(d.path(), 64, 64)).unwrap();
    let r = vn
        .nv_allocate(d.path().join("f"), 8192, Mode::Private)
        .unwrap();
    let t1 = vn.nv_txbegin();
    let t2 = vn.nv_txbegin();
    vn.nv_write(t1, r.as_ptr(), &[1u8; 100]).unwrap();
    // SAFETY: offset 200 is inside the region.
    vn.nv_write(t2, unsafe { r.as_ptr().add(200) }, &[2u8; 100])
        .unwrap();
    // Nothing visible before commit.
    assert!(region_bytes(&r).iter().all(|&b| b == 0));
    vn.nv_abort(t2).unwrap();
    assert!(region_bytes(&r).iter().all(|&b| b == 0));
    vn.nv_commit(t1).unwrap();
    let v = region_bytes(&r);
    assert!(v[..100].iter().all(|&b| b == 1));
    assert!(
        v[100..].iter().all(|&b| b == 0),
        "aborted data never visible"
    );
    vn.nv_release().unwrap();
    let f = std::fs::read(d.path().join("f")).unwrap();
    assert!(f[..100].iter().all(|&b| b == 1));
    assert!(f[100..].iter().all(|&b| b == 0));
}

#[test]
fn bad_input_gets_clear_errors() {
    let d = tmp();
    let vn = nv_init(&small_cfg(d.path(), 4, 8)).unwrap();
    let r = vn
        .nv_allocate(d.path().join("f"), 4096, Mode::Private)
        .unwrap();
    let tid = vn.nv_txbegin();
    // Outside any region.
    let x = [0u8; 16];
    let e = vn.nv_write(tid, x.as_ptr(), b"no").unwrap_err();
    assert!(matches!(e, VnvmError::OutOfRegion { .. }), "{e}");
    assert!(e.to_string().contains("not inside any region"));
    // Straddling the region's end.
    // SAFETY: pointer arithmetic only; the write is rejected before any access.
    let e = vn
        .nv_write(tid, unsafe { r.as_ptr().add(4090) }, &[0u8; 10])
        .unwrap_err();
    assert!(matches!(e, VnvmError::OutOfRegion { .. }), "{e}");
    // Unknown tid.
    let e = vn.nv_write(9999, r.as_ptr(), b"x").unwrap_err();
    assert!(matches!(e, VnvmError::UnknownTx(9999)), "{e}");
    assert!(matches!(vn.nv_commit(9999), Err(VnvmError::UnknownTx(_))));
    // Committed and aborted tids.
    vn.nv_write(tid, r.as_ptr(), b"ok").unwrap();
    vn.nv_commit(tid).unwrap();
    let e = vn.nv_write(tid, r.as_ptr(), b"x").unwrap_err();
    assert!(matches!(e, VnvmError::TxCommitted(t) if t == tid), "{e}");
    assert!(matches!(vn.nv_commit(tid), Err(VnvmError::TxCommitted(_))));
    let t2 = vn.nv_txbegin();
    vn.nv_abort(t2).unwrap();
    let e = vn.nv_write(t2, r.as_ptr(), b"x").unwrap_err();
    assert!(
        matches!(e, VnvmError::TxAborted { by_age: false, .. }),
        "{e}"
    );
    assert!(matches!(vn.nv_abort(t2), Err(VnvmError::TxAborted { .. })));
    // A transaction that writes a shared region writes only that region.
    let g = vn
        .nv_allocate(d.path().join("g"), 4096, Mode::Shared)
        .unwrap();
    let t3 = vn.nv_txbegin();
    vn.nv_write(t3, g.as_ptr(), b"s").unwrap();
    assert!(matches!(
        vn.nv_write(t3, r.as_ptr(), b"p"),
        Err(VnvmError::CrossRegion { tid, .. }) if tid == t3
    ));
    vn.nv_commit(t3).unwrap();
    let t4 = vn.nv_txbegin();
    vn.nv_write(t4, r.as_ptr(), b"p").unwrap();
    assert!(matches!(
        vn.nv_write(t4, g.as_ptr(), b"s"),
        Err(VnvmError::CrossRegion { .. })
    ));
    vn.nv_abort(t4).unwrap();
    // The shared region's path cannot be allocated privately, nor shared with another size.
    assert!(matches!(
        vn.nv_allocate(d.path().join("g"), 4096, Mode::Private),
        Err(VnvmError::Allocate { .. })
    ));
    // Same file twice.
    assert!(matches!(
        vn.nv_allocate(d.path().join("f"), 4096, Mode::Private),
        Err(VnvmError::Allocate { .. })
    ));
    vn.nv_release().unwrap();
    assert_eq!(&std::fs::read(d.path().join("f")).unwrap()[..2], b"ok");
}

#[test]
fn log_full_gives_partial_count_then_space_returns() {
    let d = tmp();
    // 4 log pages of 4 KiB.
    let vn = nv_init(&small_cfg(d.path(), 4, 16)).unwrap();
    let r = vn
        .nv_allocate(d.path().join("f"), 64 << 10, Mode::Private)
        .unwrap();
    let data = vec![7u8; 64 << 10];
    let tid = vn.nv_txbegin();
    let n = vn.nv_write(tid, r.as_ptr(), &data).unwrap();
    assert!(n > 0 && n < data.len(), "partial count, got {n}");
    // Nothing more fits.
    // SAFETY: offset n is inside the region.
    let e = vn
        .nv_write(tid, unsafe { r.as_ptr().add(n) }, &data[n..])
        .unwrap_err();
    assert!(matches!(e, VnvmError::LogFull { logged: 0 }), "{e}");
    assert!(!vn.nv_wait_log_space(Duration::from_millis(1)));
    // Committing frees the pages once the redo worker has applied the transaction.
    vn.nv_commit(tid).unwrap();
    assert!(vn.nv_wait_log_space(Duration::from_secs(30)));
    let v = region_bytes(&r);
    assert!(v[..n].iter().all(|&b| b == 7));
    assert!(v[n..].iter().all(|&b| b == 0));
    // Continue in a second transaction.
    let t2 = vn.nv_txbegin();
    let mut off = n;
    while off < data.len() {
        // SAFETY: off is inside the region.
        match vn.nv_write(t2, unsafe { r.as_ptr().add(off) }, &data[off..]) {
            Ok(k) => off += k,
            Err(VnvmError::LogFull { .. }) => {
                vn.nv_commit(t2).unwrap();
                break;
            }
            Err(e) => panic!("{e}"),
        }
    }
    if off == data.len() {
        vn.nv_commit(t2).unwrap();
    }
    vn.nv_release().unwrap();
    let f = std::fs::read(d.path().join("f")).unwrap();
    assert!(f[..off].iter().all(|&b| b == 7));
}

#[test]
fn old_transactions_are_aborted_by_the_redo_worker() {
    let d = tmp();
    let mut cfg = small_cfg(d.path(), 8, 8);
    cfg.max_tx_age = Duration::from_millis(20);
    let vn = nv_init(&cfg).unwrap();
    let r = vn
        .nv_allocate(d.path().join("f"), 4096, Mode::Private)
        .unwrap();
    let tid = vn.nv_txbegin();
    vn.nv_write(tid, r.as_ptr(), b"stale").unwrap();
    let mut aborted = false;
    for _ in 0..2000 {
        std::thread::sleep(Duration::from_millis(5));
        if let Err(e) = vn.nv_write(tid, r.as_ptr(), b"x") {
            assert!(
                matches!(e, VnvmError::TxAborted { by_age: true, .. }),
                "{e}"
            );
            aborted = true;
            break;
        }
    }
    assert!(aborted, "the transaction was never aborted");
    assert!(matches!(
        vn.nv_commit(tid),
        Err(VnvmError::TxAborted { by_age: true, .. })
    ));
    assert_eq!(vn.stats().free_log_pages, 8);
    assert!(region_bytes(&r).iter().all(|&b| b == 0));
    vn.nv_release().unwrap();
}

#[test]
fn free_region_and_busy_region() {
    let d = tmp();
    let vn = nv_init(&small_cfg(d.path(), 16, 16)).unwrap();
    let r = vn
        .nv_allocate(d.path().join("f"), 4096, Mode::Private)
        .unwrap();
    let tid = vn.nv_txbegin();
    vn.nv_write(tid, r.as_ptr(), b"abc").unwrap();
    assert!(matches!(
        vn.nv_free(r.clone()),
        Err(VnvmError::RegionBusy(_))
    ));
    vn.nv_commit(tid).unwrap();
    vn.nv_free(r.clone()).unwrap();
    assert_eq!(&std::fs::read(d.path().join("f")).unwrap()[..3], b"abc");
    // Writes to a freed region are out of any region.
    let t2 = vn.nv_txbegin();
    assert!(matches!(
        vn.nv_write(t2, r.as_ptr(), b"x"),
        Err(VnvmError::OutOfRegion { .. })
    ));
    assert!(matches!(vn.nv_free(r), Err(VnvmError::RegionFreed(_))));
    vn.nv_release().unwrap();
}

#[test]
fn users_join_and_recovery_waits_for_the_last() {
    let d = tmp();
    let cfg = small_cfg(d.path(), 8, 8);
    let vn = nv_init(&cfg).unwrap();
    // A second user joins (another process would do the same) and gets its own app id.
    let mut other = cfg.clone();
    other.log_size *= 2; // ignored: the live instance's geometry wins
    let vn2 = nv_init(&other).unwrap();
    assert_eq!((vn.stats().users, vn2.stats().users), (2, 2));
    assert_ne!(vn.stats().app_id, vn2.stats().app_id);
    assert_eq!(vn2.stats().log_pages, vn.stats().log_pages);
    // Transaction ids are unique across users.
    let (a, b) = (vn.nv_txbegin(), vn2.nv_txbegin());
    assert_ne!(a, b);
    assert!(matches!(recover(&cfg.dir), Err(VnvmError::Busy(_))));
    vn.nv_release().unwrap();
    assert_eq!(vn2.stats().users, 1);
    assert!(matches!(recover(&cfg.dir), Err(VnvmError::Busy(_))));
    vn2.nv_release().unwrap();
    assert!(recover(&cfg.dir).unwrap().was_clean);
    nv_init(&cfg).unwrap().nv_release().unwrap();
}

#[test]
fn many_threads_commit_disjoint_ranges() {
    let d = tmp();
    let vn = nv_init(&small_cfg(d.path(), 32, 16)).unwrap();
    let r = vn
        .nv_allocate(d.path().join("f"), 256 << 10, Mode::Private)
        .unwrap();
    std::thread::scope(|s| {
        for t in 0..4u8 {
            let vn = &vn;
            let r = &r;
            s.spawn(move || {
                for i in 0..200usize {
                    let tid = vn.nv_txbegin();
                    for p in 0..8usize {
                        let off = (t as usize * 64 + (i * 8 + p) % 64) * 1024;
                        let val = [t + 1; 64];
                        loop {
                            // SAFETY: off + 64 ≤ 256 KiB.
                            match vn.nv_write(tid, unsafe { r.as_ptr().add(off) }, &val) {
                                Ok(_) => break,
                                Err(VnvmError::LogFull { .. }) => {
                                    vn.nv_wait_log_space(Duration::from_millis(10));
                                }
                                Err(e) => panic!("{e}"),
                            }
                        }
                    }
                    vn.nv_commit(tid).unwrap();
                }
            });
        }
    });
    vn.drain().unwrap();
    let st = vn.stats();
    assert_eq!(st.commits, 800);
    assert_eq!(st.applied, 800);
    vn.nv_release().unwrap();
    let f = std::fs::read(d.path().join("f")).unwrap();
    for t in 0..4usize {
        for k in 0..64usize {
            let off = (t * 64 + k) * 1024;
            assert!(
                f[off..off + 64].iter().all(|&b| b == t as u8 + 1),
                "thread {t} slot {k}"
            );
        }
    }
}

#[test]
fn files_are_the_owners_unless_group_sharing_is_asked() {
    use std::os::unix::fs::PermissionsExt;
    let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    for group in [false, true] {
        let d = tmp();
        let mut cfg = small_cfg(d.path(), 8, 8);
        cfg.group_shared = group;
        let vn = nv_init(&cfg).unwrap();
        let want = if group { 0o660 } else { 0o600 };
        for f in ["meta.pool", "log.pool", "cache.pool", "lock", "shm.home"] {
            assert_eq!(mode(&cfg.dir.join(f)), want, "{f}, group {group}");
        }
        assert_eq!(
            mode(&cfg.dir),
            if group { 0o770 } else { 0o700 },
            "directory"
        );
        assert_eq!(mode(&vn.shm_path()), want, "shared-memory object");
        // A joining user follows the creator's choice, whatever its own configuration says.
        let mut other = cfg.clone();
        other.group_shared = !group;
        let vn2 = nv_init(&other).unwrap();
        vn2.nv_release().unwrap();
        assert_eq!(mode(&cfg.dir.join("lock")), want);
        vn.nv_release().unwrap();
    }
}

/// Group commit: staged commits are visible at once, tickets grow, one `nv_sync` links every
/// transaction staged so far, and a crash loses exactly the ones staged after the last sync —
/// on tmpfs pools (cache flushes) and on a disk file system (msync-backed pools, fdatasync).
#[test]
fn staged_commits_are_visible_at_once_and_durable_at_sync() {
    for base in ["/dev/shm", "/var/tmp"] {
        let d = tempfile::Builder::new()
            .prefix("tiermem-vnvm-staged")
            .tempdir_in(base)
            .unwrap();
        let file = d.path().join("data");
        let mut cfg = small_cfg(d.path(), 64, 64);
        // The redo worker would link staged commits left alone for a poll by itself.
        cfg.redo_paused = true;
        let vn = nv_init(&cfg).unwrap();
        let r = vn.nv_allocate(&file, 1 << 16, Mode::Private).unwrap();
        let mut tickets = Vec::new();
        for (i, b) in [b'a', b'b', b'c'].into_iter().enumerate() {
            let t = vn.nv_txbegin();
            // SAFETY: offsets within the 64 KiB region.
            vn.nv_write(t, unsafe { r.as_ptr().add(i * 4096) }, &[b; 100])
                .unwrap();
            tickets.push(vn.nv_commit_staged(t).unwrap());
            // Visible before any sync.
            assert_eq!(
                region_bytes(&r)[i * 4096..i * 4096 + 100],
                [b; 100],
                "{base}"
            );
            if i == 1 {
                // Syncing the first ticket links the second too.
                vn.nv_sync(tickets[0]).unwrap();
            }
        }
        assert!(
            tickets.windows(2).all(|w| w[0] < w[1]),
            "{base}: {tickets:?}"
        );
        assert_eq!(vn.nv_staged_ticket(), tickets[2]);
        // Nothing logged: durable already.
        assert_eq!(vn.nv_commit_staged(vn.nv_txbegin()).unwrap(), 0);
        vn.nv_sync(0).unwrap();
        drop(r);
        vn.abandon();

        cfg.redo_paused = false;
        let vn = nv_init(&cfg).unwrap();
        let r = vn.nv_allocate(&file, 1 << 16, Mode::Private).unwrap();
        let got = region_bytes(&r);
        assert_eq!(got[..100], [b'a'; 100], "{base}");
        assert_eq!(got[4096..4196], [b'b'; 100], "{base}");
        assert_eq!(
            got[8192..8292],
            [0; 100],
            "{base}: the unsynced commit survived"
        );
        if base == "/var/tmp" {
            // A disk-backed instance takes one user at a time (its commit journal).
            let e = nv_init(&cfg).unwrap_err();
            assert!(matches!(e, VnvmError::SingleProcess(_)), "{e}");
            assert!(e.to_string().contains("one process at a time"), "{e}");
        }
        // A staged commit reaches the redo worker and the file at release.
        let t = vn.nv_txbegin();
        // SAFETY: within the region.
        vn.nv_write(t, unsafe { r.as_ptr().add(8192) }, &[b'd'; 100])
            .unwrap();
        vn.nv_commit_staged(t).unwrap();
        drop(r);
        vn.nv_release().unwrap();
        let f = std::fs::read(&file).unwrap();
        assert_eq!(f[8192..8292], [b'd'; 100], "{base}");
    }
}

/// An instance killed and then moved recovers at its new path and removes the shared-memory
/// object its dead processes left under the old path's name (nobody would open it again); an
/// object named after a path where an instance lives now is left alone.
#[test]
fn a_crashed_instance_moved_elsewhere_leaves_no_shared_memory_object_behind() {
    let d = tmp();
    let (a, b) = (d.path().join("a"), d.path().join("b"));
    std::fs::create_dir_all(&a).unwrap();
    let mut cfg = small_cfg(&a, 8, 8);
    let vn = nv_init(&cfg).unwrap();
    let old = vn.shm_path();
    assert!(old.exists());
    vn.abandon();
    // What a process killed with SIGKILL leaves (`abandon` still leaves the instance as its
    // last user): the object, under the old path's name (/dev/shm holds it as a file).
    if !old.exists() {
        std::fs::write(&old, b"left by a killed process").unwrap();
    }
    std::fs::rename(&a, &b).unwrap();
    cfg.dir = b.join("inst");
    let vn = nv_init(&cfg).unwrap();
    assert!(!old.exists(), "the old path's object is still there");
    let moved = vn.shm_path();
    assert!(moved.exists() && moved != old);
    vn.nv_release().unwrap();
    // A live instance at the path the record names keeps its object.
    std::fs::create_dir_all(&a).unwrap();
    let live_cfg = small_cfg(&a, 8, 8);
    let live = nv_init(&live_cfg).unwrap();
    let live_shm = live.shm_path();
    let canon_a = std::fs::canonicalize(&live_cfg.dir).unwrap();
    std::fs::write(
        cfg.dir.join("shm.home"),
        canon_a.as_os_str().as_encoded_bytes(),
    )
    .unwrap();
    let vn = nv_init(&cfg).unwrap();
    assert!(live_shm.exists(), "a live instance's object was removed");
    vn.nv_release().unwrap();
    live.nv_release().unwrap();
}
