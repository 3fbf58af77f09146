//! Virtualization: a region four times larger than the log and cache pools together, written
//! completely, with the data correct in DRAM, after writeback, and in the file after release.

mod common;
use common::*;
use std::time::Duration;
use tiermem_vnvm::{nv_init, Mode, VnvmError};

#[test]
fn region_four_times_the_pools() {
    let d = tmp();
    let (log_pages, cache_pages) = (16u64, 16u64);
    let vn = nv_init(&small_cfg(d.path(), log_pages, cache_pages)).unwrap();
    let size = (4 * (log_pages + cache_pages) * 4096) as usize; // 512 KiB, 128 pages
    let file = d.path().join("big");
    let r = vn.nv_allocate(&file, size, Mode::Private).unwrap();
    let pages = size / 4096;
    let mut expect = vec![0u8; size];
    // Three passes, 8 page writes of 200 bytes per transaction, at varying offsets.
    for pass in 0..3usize {
        for first in (0..pages).step_by(8) {
            let tid = vn.nv_txbegin();
            for p in first..first + 8 {
                let off = p * 4096 + (pass * 977 + p * 13) % 3800;
                let val: Vec<u8> = (0..200).map(|j| (p + j + pass * 7) as u8 | 1).collect();
                loop {
                    // SAFETY: off + 200 < size.
                    match vn.nv_write(tid, unsafe { r.as_ptr().add(off) }, &val) {
                        Ok(n) => {
                            assert_eq!(n, 200);
                            break;
                        }
                        Err(VnvmError::LogFull { .. }) => {
                            vn.nv_wait_log_space(Duration::from_millis(10));
                        }
                        Err(e) => panic!("{e}"),
                    }
                }
                expect[off..off + 200].copy_from_slice(&val);
            }
            vn.nv_commit(tid).unwrap();
        }
        assert_eq!(region_bytes(&r), expect, "DRAM view after pass {pass}");
    }
    vn.drain().unwrap();
    let st = vn.stats();
    assert!(
        st.pages_written_back > 0,
        "the cache is smaller than the region, so pages must have been written back: {st:?}"
    );
    vn.nv_release().unwrap();
    assert_eq!(std::fs::read(&file).unwrap(), expect, "file after release");
    // Re-read through a fresh instance.
    let vn = nv_init(&small_cfg(d.path(), log_pages, cache_pages)).unwrap();
    let r = vn.nv_allocate(&file, size, Mode::Private).unwrap();
    assert_eq!(region_bytes(&r), expect);
    vn.nv_release().unwrap();
}

#[test]
fn eight_k_pages_and_a_transaction_larger_than_the_cache() {
    let d = tmp();
    let mut cfg = small_cfg(d.path(), 0, 0);
    cfg.page_size = 8192;
    cfg.log_size = 64 * 8192;
    cfg.cache_size = 4 * 8192;
    let vn = nv_init(&cfg).unwrap();
    let size = 16 * 8192;
    let file = d.path().join("f8");
    let r = vn.nv_allocate(&file, size, Mode::Private).unwrap();
    // One transaction touching all 16 pages of a 4-page cache.
    let tid = vn.nv_txbegin();
    let at = |p: usize| {
        if p < 15 {
            p * 8192 + 8100
        } else {
            p * 8192 + 7000
        }
    };
    for p in 0..16usize {
        // SAFETY: inside the region (writes of pages 0..15 cross into the next page).
        let n = vn
            .nv_write(tid, unsafe { r.as_ptr().add(at(p)) }, &[p as u8 + 1; 300])
            .unwrap();
        assert_eq!(n, 300);
    }
    vn.nv_commit(tid).unwrap();
    vn.drain().unwrap();
    vn.nv_release().unwrap();
    let f = std::fs::read(&file).unwrap();
    for p in 0..16usize {
        let o = at(p);
        assert!(f[o..o + 300].iter().all(|&b| b == p as u8 + 1), "page {p}");
    }
}
