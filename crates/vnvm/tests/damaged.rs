//! Damaged instances: a truncated, bit-flipped or other-version meta.pool, a damaged log object
//! or log page. Each gets a clear error naming the problem; nothing is written; once the damage
//! is repaired (here: the good file put back) recovery restores every committed transaction.

mod common;
use common::*;
use std::os::unix::fs::FileExt;
use std::path::Path;
use tiermem_vnvm::{nv_init, recover, Mode, VnvmError};

const SIZE: usize = 4 * 4096;
const MAX_FILES: u64 = 16;
const CACHE_PAGES: u64 = 8;

/// An abandoned instance with two committed transactions still in the committed list.
fn crashed_instance(dir: &Path) -> Vec<u8> {
    let mut cfg = small_cfg(dir, 8, CACHE_PAGES);
    cfg.max_files = MAX_FILES as u32;
    cfg.redo_paused = true;
    std::fs::write(dir.join("data"), vec![0u8; SIZE]).unwrap();
    let vn = nv_init(&cfg).unwrap();
    let r = vn
        .nv_allocate(dir.join("data"), SIZE, Mode::Private)
        .unwrap();
    let mut expect = vec![0u8; SIZE];
    for (i, off) in [(1u8, 100usize), (2, 5000)] {
        let tid = vn.nv_txbegin();
        // SAFETY: inside the region.
        vn.nv_write(tid, unsafe { r.as_ptr().add(off) }, &[i; 64])
            .unwrap();
        vn.nv_commit(tid).unwrap();
        expect[off..off + 64].fill(i);
    }
    vn.abandon();
    expect
}

fn flip(path: &Path, off: u64, mask: u8) {
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .unwrap();
    let mut b = [0u8; 1];
    f.read_exact_at(&mut b, off).unwrap();
    b[0] ^= mask;
    f.write_all_at(&b, off).unwrap();
}

fn check_case(name: &str, damage: impl Fn(&Path), expect_msg: &str) {
    let d = tmp();
    let dir = d.path();
    let expect = crashed_instance(dir);
    let inst = dir.join("inst");
    let pools: Vec<_> = ["meta.pool", "log.pool", "cache.pool"]
        .iter()
        .map(|n| (inst.join(n), std::fs::read(inst.join(n)).unwrap()))
        .collect();
    damage(&inst);
    let damaged: Vec<_> = pools
        .iter()
        .map(|(p, _)| std::fs::read(p).unwrap())
        .collect();
    let e = recover(&inst).expect_err(name);
    let msg = e.to_string();
    assert!(
        msg.contains(expect_msg),
        "{name}: error {msg:?} does not mention {expect_msg:?}"
    );
    // nv_init refuses too.
    let mut cfg = small_cfg(dir, 8, CACHE_PAGES);
    cfg.max_files = MAX_FILES as u32;
    assert!(
        nv_init(&cfg).is_err(),
        "{name}: nv_init accepted a damaged instance"
    );
    // Nothing was written: the file and the pools are as before.
    assert_eq!(
        std::fs::read(dir.join("data")).unwrap(),
        vec![0u8; SIZE],
        "{name}: data file written"
    );
    for ((p, _), before) in pools.iter().zip(&damaged) {
        assert_eq!(
            &std::fs::read(p).unwrap(),
            before,
            "{name}: {} changed",
            p.display()
        );
    }
    // Repair: put the good files back; recovery brings back every committed transaction.
    for (p, good) in &pools {
        std::fs::write(p, good).unwrap();
    }
    let rep = recover(&inst).unwrap();
    assert_eq!(rep.transactions_replayed, 2, "{name}");
    assert_eq!(std::fs::read(dir.join("data")).unwrap(), expect, "{name}");
    eprintln!("{name}: {msg}");
}

const HDR: u64 = 4096; // pool header
const FILES_OFF: u64 = 8192;

fn logobj0() -> u64 {
    let cache_obj = FILES_OFF + 512 * MAX_FILES;
    (cache_obj + 64 * CACHE_PAGES).div_ceil(64) * 64
}

#[test]
fn truncated_meta_pool() {
    check_case(
        "truncated",
        |i| {
            let f = std::fs::OpenOptions::new()
                .write(true)
                .open(i.join("meta.pool"))
                .unwrap();
            let len = f.metadata().unwrap().len();
            f.set_len(len / 2).unwrap();
        },
        "meta.pool",
    );
}

#[test]
fn bit_flip_in_pool_header() {
    check_case(
        "pool header",
        |i| flip(&i.join("meta.pool"), 50, 0x10),
        "meta.pool",
    );
}

#[test]
fn bit_flip_in_superblock() {
    check_case(
        "superblock",
        |i| flip(&i.join("meta.pool"), HDR + 20, 0x01),
        "superblock",
    );
}

#[test]
fn other_version_superblock() {
    check_case(
        "superblock version",
        |i| flip(&i.join("meta.pool"), HDR + 8, 0x02),
        "format version",
    );
}

#[test]
fn other_version_pool() {
    check_case(
        "pool version",
        |i| flip(&i.join("meta.pool"), 8, 0x02),
        "version",
    );
}

#[test]
fn bit_flip_in_file_record() {
    check_case(
        "file record",
        |i| flip(&i.join("meta.pool"), HDR + FILES_OFF + 40, 0x04),
        "file record 0",
    );
}

#[test]
fn bit_flip_in_log_object() {
    check_case(
        "log object",
        |i| flip(&i.join("meta.pool"), HDR + logobj0() + 9, 0x01),
        "log object 0",
    );
}

#[test]
fn damaged_log_entry() {
    // First entry of log page 0: its length field.
    check_case(
        "log entry",
        |i| flip(&i.join("log.pool"), HDR + 24 + 1, 0x40),
        "log page 0",
    );
}

#[test]
fn missing_instance_is_an_error() {
    let d = tmp();
    let e = recover(d.path()).unwrap_err();
    assert!(matches!(e, VnvmError::NoInstance { .. }), "{e}");
    assert!(e.to_string().contains("holds no vnvm instance"), "{e}");
}

#[test]
fn cache_full_with_a_failing_device_reports_and_loses_nothing() {
    // Every writeback fails (ENOSPC, as from a full device): the NVM cache fills with dirty
    // pages, then the log with committed transactions the redo worker cannot apply. Writers get
    // LogFull, waiting for log space fails at once with the cause, drain and release report it —
    // and recovery (the device healthy again) finds every committed transaction.
    let d = tmp();
    let mut cfg = small_cfg(d.path(), 16, 4);
    cfg.writeback_fault = Some(libc::ENOSPC);
    let vn = nv_init(&cfg).unwrap();
    let pages = 32usize;
    let r = vn
        .nv_allocate(d.path().join("data"), pages * 4096, Mode::Private)
        .unwrap();
    let mut committed = 0usize;
    let mut log_full = false;
    'outer: for p in 0..pages {
        let tid = vn.nv_txbegin();
        // SAFETY: p * 4096 + 8 ≤ the region.
        let dst = unsafe { r.as_ptr().add(p * 4096) };
        loop {
            match vn.nv_write(tid, dst, &(p as u64 + 1).to_le_bytes()) {
                Ok(8) => break,
                Ok(n) => panic!("partial {n}"),
                Err(VnvmError::LogFull { logged: 0 }) => {
                    if !vn.nv_wait_log_space(std::time::Duration::from_secs(5)) {
                        log_full = true;
                        vn.nv_abort(tid).unwrap();
                        break 'outer;
                    }
                }
                Err(e) => panic!("{e}"),
            }
        }
        vn.nv_commit(tid).unwrap();
        committed += 1;
    }
    assert!(log_full, "the log never filled ({committed} commits)");
    assert!(committed > 4, "more than the cache holds were committed");
    // Committed data are readable all along (read committed from DRAM).
    let view = region_bytes(&r);
    for p in 0..committed {
        assert_eq!(view[p * 4096], p as u8 + 1);
    }
    let e = vn.drain().unwrap_err();
    assert!(matches!(e, VnvmError::CacheFull(_)), "{e}");
    let msg = e.to_string();
    assert!(
        msg.contains("write back") && msg.contains("No space left"),
        "{msg}"
    );
    assert!(vn.nv_release().is_err());
    drop(r);
    // The failed writebacks stored their checksums (with the page's previous contents beside
    // them) before their data, which never arrived: the file's bytes outside what the cache
    // holds of page 0 (its first 8 bytes) are verified against the previous contents, so a
    // flip there is refused, and the page as it is accepted.
    let data = d.path().join("data");
    let flip = |at: u64| {
        use std::os::unix::fs::FileExt;
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&data)
            .unwrap();
        let mut b = [0u8; 1];
        f.read_exact_at(&mut b, at).unwrap();
        f.write_all_at(&[b[0] ^ 0x40], at).unwrap();
    };
    flip(2000);
    let e = recover(&cfg.dir).unwrap_err().to_string();
    assert!(
        e.contains("backing-file page 0") && e.contains("before the last write"),
        "{e}"
    );
    flip(2000);
    let rep = recover(&cfg.dir).unwrap();
    assert!(!rep.was_clean);
    let f = std::fs::read(d.path().join("data")).unwrap();
    for p in 0..committed {
        assert_eq!(
            u64::from_le_bytes(f[p * 4096..p * 4096 + 8].try_into().unwrap()),
            p as u64 + 1,
            "page {p} of {committed} committed"
        );
    }
}
