//! `inspect`: what it reports for committed-but-unapplied transactions (live and after a
//! crash), for a cache that went past the writeback threshold, and for a damaged file record;
//! and that it never writes anything.

mod common;
use common::*;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::time::Duration;
use tiermem_vnvm::inspect::{InstanceGeometry, InstanceState};
use tiermem_vnvm::{inspect, nv_init, recover, Mode, VnvmError};

const PS: usize = 4096;

fn pool_bytes(inst: &Path) -> Vec<Vec<u8>> {
    ["meta.pool", "log.pool", "cache.pool"]
        .iter()
        .map(|n| std::fs::read(inst.join(n)).unwrap())
        .collect()
}

#[test]
fn committed_transactions_and_their_log_pages_are_counted() {
    let d = tmp();
    let dir = d.path();
    let mut cfg = small_cfg(dir, 16, 8);
    cfg.redo_paused = true;
    let inst = cfg.dir.clone();
    let size = 8 * PS;
    let vn = nv_init(&cfg).unwrap();
    let r = vn
        .nv_allocate(dir.join("data"), size, Mode::Private)
        .unwrap();
    // 64 bytes: one log page; 6000 bytes from a page boundary: 4064 bytes fill the first log
    // page, the rest goes to a second one.
    for (off, len) in [(100usize, 64usize), (0, 6000), (3 * PS + 8, 64)] {
        let tid = vn.nv_txbegin();
        // SAFETY: inside the region.
        let n = vn
            .nv_write(tid, unsafe { r.as_ptr().add(off) }, &vec![7u8; len])
            .unwrap();
        assert_eq!(n, len);
        vn.nv_commit(tid).unwrap();
    }
    let check = |state: InstanceState| {
        let i = inspect(&inst).unwrap();
        assert_eq!(i.dir, inst);
        assert_eq!(i.state, state);
        assert_eq!(
            i.geometry,
            InstanceGeometry {
                format_version: 3,
                page_size: 4096,
                log_pages: 16,
                cache_pages: 8,
                max_files: 16,
                max_domains: i.geometry.max_domains,
                log_objects: i.geometry.log_objects,
                meta_pool_bytes: std::fs::metadata(inst.join("meta.pool")).unwrap().len(),
                log_pool_bytes: 4096 + 16 * 4096,
                cache_pool_bytes: 4096 + 8 * 4096,
            }
        );
        assert_eq!(i.files.len(), 1);
        assert_eq!(i.files[0].id, 0);
        assert_eq!(i.files[0].mode, Mode::Private);
        assert_eq!(i.files[0].size, size as u64);
        assert_eq!(i.files[0].path, dir.join("data"));
        assert_eq!(i.committed_transactions, 3);
        assert_eq!(i.committed_log_pages, 4);
        assert_eq!(i.domains.len(), 1);
        assert_eq!(i.domains[0].domain, 0);
        assert_eq!(i.domains[0].transactions, 3);
        assert_eq!(i.domains[0].log_pages, 4);
        // Nothing was applied: the cache is empty.
        assert_eq!(i.cache.pages, 8);
        assert_eq!(i.cache.mapped, 0);
        assert_eq!(i.cache.dirty, 0);
        assert_eq!(i.cache.valid_bytes, 0);
        assert_eq!(i.cache.dirty_ratio, 0.0);
    };
    // Live (this process holds the instance lock): inspect neither waits nor disturbs it.
    check(InstanceState::RunningOrCrashed);
    let live = inspect(&inst).unwrap().live.expect("a live user");
    assert_eq!(live.users, 1);
    assert_eq!(live.apps[0].pid, std::process::id());
    assert_eq!(live.apps[0].commits, 3);
    let tid = vn.nv_txbegin();
    // SAFETY: inside the region.
    vn.nv_write(tid, unsafe { r.as_ptr().add(5 * PS) }, &[1u8; 8])
        .unwrap();
    vn.nv_abort(tid).unwrap();
    vn.abandon();
    // Crashed: the same, and inspecting writes nothing.
    let before = pool_bytes(&inst);
    check(InstanceState::RunningOrCrashed);
    assert!(
        inspect(&inst).unwrap().live.is_none(),
        "nobody uses it any more"
    );
    assert_eq!(pool_bytes(&inst), before, "inspect wrote to a pool");
    let rep = recover(&inst).unwrap();
    assert_eq!(rep.transactions_replayed, 3);
    let i = inspect(&inst).unwrap();
    assert_eq!(i.state, InstanceState::Clean);
    assert_eq!(i.committed_transactions, 0);
    assert_eq!(i.committed_log_pages, 0);
    assert!(i.domains.is_empty());
    assert!(i.files.is_empty(), "recovery resets the record table");
}

#[test]
fn cache_counts_are_consistent_past_the_writeback_threshold() {
    let d = tmp();
    let dir = d.path();
    let cfg = small_cfg(dir, 16, 16);
    let inst = cfg.dir.clone();
    let pages = 64usize;
    let vn = nv_init(&cfg).unwrap();
    let r = vn
        .nv_allocate(dir.join("data"), pages * PS, Mode::Private)
        .unwrap();
    // Every region page gets a write: 4× the cache, far beyond the 30 % writeback threshold.
    for round in 0..2u8 {
        for p in 0..pages {
            let tid = vn.nv_txbegin();
            let data = vec![round + 1; if p % 3 == 0 { PS } else { 200 }];
            let mut done = 0;
            while done < data.len() {
                // SAFETY: inside the region.
                let dst = unsafe { r.as_ptr().add(p * PS + done) };
                match vn.nv_write(tid, dst, &data[done..]) {
                    Ok(n) => done += n,
                    Err(VnvmError::LogFull { .. }) => {
                        vn.nv_wait_log_space(Duration::from_millis(10));
                    }
                    Err(e) => panic!("{e}"),
                }
            }
            vn.nv_commit(tid).unwrap();
        }
    }
    vn.quiesce().unwrap();
    let consistent = |i: &tiermem_vnvm::InstanceInfo| {
        let c = &i.cache;
        assert_eq!(c.pages, 16);
        assert!(c.dirty <= c.mapped && c.mapped <= c.pages, "{c:?}");
        assert!(c.valid_bytes <= c.mapped as u64 * PS as u64, "{c:?}");
        assert_eq!(c.valid_bytes % 64, 0, "{c:?}");
        assert_eq!(c.dirty_ratio, c.dirty as f64 / c.pages as f64);
        assert!(c.mapped > 0 && c.valid_bytes > 0, "{c:?}");
    };
    let i = inspect(&inst).unwrap();
    consistent(&i);
    assert_eq!(i.state, InstanceState::RunningOrCrashed);
    assert_eq!(
        i.committed_transactions, 0,
        "quiesce drains the committed list"
    );
    let s = vn.stats();
    assert!(s.pages_written_back > 0, "the writeback worker never ran");
    assert_eq!(i.cache.dirty, s.dirty_pages, "{:?} vs {s:?}", i.cache);
    assert_eq!(i.cache.mapped, s.dirty_pages + s.clean_pages, "{s:?}");
    // quiesce waits until the dirty ratio is at or below the start threshold (30 %).
    assert!(i.cache.dirty_ratio <= 0.30, "{:?}", i.cache);
    vn.nv_release().unwrap();
    let i = inspect(&inst).unwrap();
    assert_eq!(i.state, InstanceState::Clean);
    assert_eq!(i.cache.dirty, 0, "release writes every dirty page back");
    assert_eq!(i.cache.mapped, 0, "and returns its cache pages");
    assert!(i.files.is_empty(), "and deletes its private file records");
}

#[test]
fn a_bit_flipped_file_record_is_reported_with_its_location() {
    let d = tmp();
    let dir = d.path();
    let mut cfg = small_cfg(dir, 8, 8);
    cfg.redo_paused = true;
    let inst = cfg.dir.clone();
    let vn = nv_init(&cfg).unwrap();
    let r = vn
        .nv_allocate(dir.join("data"), 4 * PS, Mode::Private)
        .unwrap();
    let tid = vn.nv_txbegin();
    // SAFETY: inside the region.
    vn.nv_write(tid, unsafe { r.as_ptr().add(10) }, &[3u8; 32])
        .unwrap();
    vn.nv_commit(tid).unwrap();
    vn.abandon();
    // File record 0 is at data offset 8192 (after 64 committed-list words from 512, rounded up
    // to 4 KiB); the data area starts after the 4 KiB pool header. Byte 40 is in its path.
    const REC0: u64 = 8192;
    let meta = inst.join("meta.pool");
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&meta)
        .unwrap();
    let mut b = [0u8; 1];
    f.read_exact_at(&mut b, 4096 + REC0 + 40).unwrap();
    f.write_all_at(&[b[0] ^ 0x04], 4096 + REC0 + 40).unwrap();
    let before = pool_bytes(&inst);
    let e = inspect(&inst).unwrap_err();
    match &e {
        VnvmError::Damaged {
            path,
            what,
            offset,
            detail,
        } => {
            assert_eq!(path, &meta);
            assert_eq!(what, "file record 0");
            assert_eq!(*offset, REC0);
            assert!(detail.contains("checksum"), "{detail}");
        }
        other => panic!("expected Damaged, got {other:?}"),
    }
    // The same report as recovery's, and nothing written by either.
    assert_eq!(recover(&inst).unwrap_err().to_string(), e.to_string());
    assert_eq!(pool_bytes(&inst), before);
}

#[test]
fn a_directory_without_an_instance_is_no_instance() {
    let d = tmp();
    match inspect(d.path()).unwrap_err() {
        VnvmError::NoInstance { dir } => assert_eq!(dir, d.path()),
        other => panic!("expected NoInstance, got {other:?}"),
    }
    assert_eq!(
        std::fs::read_dir(d.path()).unwrap().count(),
        0,
        "inspect created something"
    );
}
