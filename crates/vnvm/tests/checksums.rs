//! Checksums of format 3 (issue #13, defects 3 and 6): a bit flipped in a log entry, a cache
//! page record, a dirty NVM cache page, a committed-list word or a backing-file page is refused
//! by recovery or region open with an error naming the area, and `scrub` reports it at the
//! right place; a random-flip sweep over every file of a crashed and a clean instance ends in a
//! refusal or in the data of a clean recovery; an instance (backing file inside it) can be moved.

mod common;
use common::*;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::Duration;
use tiermem_vnvm::{nv_init, recover, scrub, Mode, VnvmConfig, VnvmError};

const PS: usize = 4096;
const PAGES: usize = 8;
const SIZE: usize = PAGES * PS;
/// Pool header bytes before a pool's data area.
const HDR: u64 = 4096;
/// Data offset of the cache page records (max_files 16): files at 8192 + 16 × 512.
const CACHE_RECS: u64 = 8192 + 16 * 512;

fn cfg(inst: &Path) -> VnvmConfig {
    let mut c = small_cfg(Path::new("/"), 16, 16);
    c.dir = inst.to_path_buf();
    c
}

fn pat(tag: u8, page: usize) -> Vec<u8> {
    (0..PS)
        .map(|i| tag ^ (page as u8).wrapping_mul(31) ^ (i as u8).wrapping_mul(7))
        .collect()
}

/// Build an instance in `inst` with its backing file `inst/data`: run 1 writes all pages and
/// shuts down cleanly (so the checksum table covers them); run 2 rewrites pages 0..3 and 64 bytes
/// of page 7 (applied: dirty NVM cache pages) and commits two small transactions into pages 4 and
/// 5, then crashes
/// (`crash`) or shuts down. Returns the expected file contents.
fn build(inst: &Path, crash: bool) -> Vec<u8> {
    let data = inst.join("data");
    let mut expect = vec![0u8; SIZE];
    {
        let vn = nv_init(&cfg(inst)).unwrap();
        let r = vn.nv_allocate(&data, SIZE, Mode::Private).unwrap();
        for p in 0..PAGES {
            let tid = vn.nv_txbegin();
            let b = pat(1, p);
            // SAFETY: inside the region.
            assert_eq!(
                vn.nv_write(tid, unsafe { r.as_ptr().add(p * PS) }, &b)
                    .unwrap(),
                PS
            );
            vn.nv_commit(tid).unwrap();
            expect[p * PS..(p + 1) * PS].copy_from_slice(&b);
        }
        vn.nv_release().unwrap();
    }
    for attempt in 0.. {
        let mut exp = expect.clone();
        let vn = nv_init(&cfg(inst)).unwrap();
        let r = vn.nv_allocate(&data, SIZE, Mode::Private).unwrap();
        for p in 0..3 {
            let tid = vn.nv_txbegin();
            let b = pat(2, p);
            // SAFETY: inside the region.
            assert_eq!(
                vn.nv_write(tid, unsafe { r.as_ptr().add(p * PS) }, &b)
                    .unwrap(),
                PS
            );
            vn.nv_commit(tid).unwrap();
            exp[p * PS..(p + 1) * PS].copy_from_slice(&b);
        }
        // Page 7: one 64-byte chunk (a dirty cache page with one valid chunk: the rest of the
        // page is the backing file's).
        let tid = vn.nv_txbegin();
        // SAFETY: inside the region.
        vn.nv_write(tid, unsafe { r.as_ptr().add(7 * PS + 512) }, &[0x77; 64])
            .unwrap();
        vn.nv_commit(tid).unwrap();
        exp[7 * PS + 512..7 * PS + 576].fill(0x77);
        vn.drain().unwrap();
        // Past REDO_IDLE_AFTER the redo worker sleeps its period (150 ms here): the next two
        // commits stay in the committed list when we crash right after them.
        std::thread::sleep(Duration::from_millis(30));
        for (k, off) in [(3u8, 4 * PS + 100), (4, 5 * PS + 2000)] {
            let tid = vn.nv_txbegin();
            // SAFETY: inside the region.
            vn.nv_write(tid, unsafe { r.as_ptr().add(off) }, &[0xA0 | k; 48])
                .unwrap();
            vn.nv_commit(tid).unwrap();
            exp[off..off + 48].fill(0xA0 | k);
        }
        if !crash {
            vn.nv_release().unwrap();
            return exp;
        }
        vn.abandon();
        let i = tiermem_vnvm::inspect(inst).unwrap();
        if i.committed_transactions == 2 && i.cache.dirty == 4 {
            return exp;
        }
        // The redo worker ran anyway (a loaded machine): recover and try again.
        assert!(attempt < 5, "could not build a crashed instance: {i:?}");
        recover(inst).unwrap();
    }
    unreachable!()
}

/// Recover `inst`, open it and read the region back.
fn recover_and_read(inst: &Path) -> Result<Vec<u8>, VnvmError> {
    recover(inst)?;
    let vn = nv_init(&cfg(inst))?;
    let r = vn.nv_allocate(inst.join("data"), SIZE, Mode::Private)?;
    let b = region_bytes(&r);
    drop(r);
    vn.nv_release()?;
    Ok(b)
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

fn u64_at(path: &Path, off: u64) -> u64 {
    let mut b = [0u8; 8];
    std::fs::File::open(path)
        .unwrap()
        .read_exact_at(&mut b, off)
        .unwrap();
    u64::from_le_bytes(b)
}

/// Cache pages whose record says dirty, with their (file page) index.
fn dirty_pages(inst: &Path) -> Vec<(u32, u64)> {
    let meta = inst.join("meta.pool");
    (0..16u32)
        .filter_map(|p| {
            let w = u64_at(&meta, HDR + CACHE_RECS + 64 * p as u64);
            (w >> 63 == 1).then_some((p, w & ((1 << 40) - 1)))
        })
        .collect()
}

/// Assert scrub finds damage in `area` in a file whose name ends with `file`.
fn scrub_finds(inst: &Path, area: &str, file: &str) {
    let r = scrub(inst).unwrap();
    assert!(!r.clean(), "scrub found nothing ({area})");
    assert!(
        r.findings()
            .any(|(a, f)| a == area && f.file.to_string_lossy().ends_with(file)),
        "scrub did not report {area} in {file}: {:?}",
        r.findings().collect::<Vec<_>>()
    );
}

fn files_of(inst: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    [
        "meta.pool",
        "log.pool",
        "cache.pool",
        "data",
        "data.vnvm-crc",
    ]
    .iter()
    .map(|n| (inst.join(n), std::fs::read(inst.join(n)).unwrap()))
    .collect()
}

#[test]
fn flip_in_committed_log_entry_payload_is_refused() {
    let d = tmp();
    let inst = d.path().join("inst");
    let expect = build(&inst, true);
    assert!(scrub(&inst).unwrap().clean());
    // The second committed transaction's payload: 48 bytes of 0xA4 in log.pool.
    let log = std::fs::read(inst.join("log.pool")).unwrap();
    let at = log.windows(48).position(|w| w == [0xA4; 48]).unwrap() as u64;
    flip(&inst.join("log.pool"), at + 20, 0x08);
    let before = files_of(&inst);
    scrub_finds(&inst, "committed logs", "log.pool");
    let e = recover(&inst).unwrap_err().to_string();
    assert!(
        e.contains("log page") && e.contains("tid") && e.contains("checksum"),
        "{e}"
    );
    assert_eq!(files_of(&inst), before, "recovery wrote something");
    flip(&inst.join("log.pool"), at + 20, 0x08);
    assert_eq!(recover_and_read(&inst).unwrap(), expect);
}

#[test]
fn flip_in_cache_page_record_is_outvoted_or_refused() {
    let d = tmp();
    let inst = d.path().join("inst");
    let expect = build(&inst, true);
    let (page, _) = dirty_pages(&inst)[0];
    let meta = inst.join("meta.pool");
    let rec = HDR + CACHE_RECS + 64 * page as u64;
    // One copy: scrub reports it; recovery uses the other copy.
    flip(&meta, rec + 9, 0x20);
    scrub_finds(&inst, "cache page records", "meta.pool");
    // Both copies: refused, nothing written.
    flip(&meta, rec + 32 + 9, 0x20);
    scrub_finds(&inst, "cache page records", "meta.pool");
    let before = files_of(&inst);
    let e = recover(&inst).unwrap_err().to_string();
    assert!(e.contains(&format!("cache page record {page}")), "{e}");
    assert_eq!(files_of(&inst), before, "recovery wrote something");
    flip(&meta, rec + 32 + 9, 0x20);
    assert_eq!(recover_and_read(&inst).unwrap(), expect);
}

#[test]
fn flip_in_dirty_cache_page_is_refused() {
    let d = tmp();
    let inst = d.path().join("inst");
    let expect = build(&inst, true);
    let (page, idx) = dirty_pages(&inst)
        .into_iter()
        .find(|&(_, idx)| idx < 3)
        .unwrap();
    assert!(idx < 3, "a whole page the listed transactions do not write");
    let cache = inst.join("cache.pool");
    flip(&cache, HDR + page as u64 * PS as u64 + 777, 0x01);
    scrub_finds(&inst, "cache pages", "cache.pool");
    let before = files_of(&inst);
    let e = recover(&inst).unwrap_err().to_string();
    assert!(
        e.contains(&format!("cache page {page}")) && e.contains("checksum"),
        "{e}"
    );
    assert_eq!(files_of(&inst), before, "recovery wrote something");
    flip(&cache, HDR + page as u64 * PS as u64 + 777, 0x01);
    assert_eq!(recover_and_read(&inst).unwrap(), expect);
}

#[test]
fn flip_in_committed_list_word_is_outvoted_or_refused() {
    let d = tmp();
    let inst = d.path().join("inst");
    let expect = build(&inst, true);
    let meta = inst.join("meta.pool");
    let w = HDR + 512; // domain 0 (app slot 0)
    assert_ne!(u64_at(&meta, w), 0);
    flip(&meta, w + 4, 0x01);
    scrub_finds(&inst, "domain words", "meta.pool");
    flip(&meta, w + 16 + 4, 0x01);
    let e = recover(&inst).unwrap_err().to_string();
    assert!(e.contains("committed-list word of domain 0"), "{e}");
    flip(&meta, w + 4, 0x01);
    // Copy A intact again, copy B flipped: outvoted.
    assert_eq!(recover_and_read(&inst).unwrap(), expect);
}

#[test]
fn flip_in_backing_file_page_is_refused_at_open() {
    for crash in [false, true] {
        let d = tmp();
        let inst = d.path().join("inst");
        let expect = build(&inst, crash);
        let data = inst.join("data");
        // Page 6: checksummed by run 1's writeback, touched by nothing since.
        flip(&data, 6 * PS as u64 + 123, 0x10);
        scrub_finds(&inst, "backing files", "data");
        let e = recover_and_read(&inst).unwrap_err().to_string();
        assert!(
            e.contains("backing-file page 6") && e.contains("data"),
            "crash {crash}: {e}"
        );
        flip(&data, 6 * PS as u64 + 123, 0x10);
        assert_eq!(recover_and_read(&inst).unwrap(), expect, "crash {crash}");
        assert!(scrub(&inst).unwrap().clean());
        // A truncated (or deleted) backing file is refused too.
        std::fs::write(&data, b"").unwrap();
        let e = recover_and_read(&inst).unwrap_err().to_string();
        assert!(e.contains("truncated"), "{e}");
    }
}

/// A dirty cache page holding part of its page (one valid chunk): recovery writes that chunk
/// into the file page and keeps the file's other bytes, which it verifies first against the
/// checksum table's two recorded contents of the page (before and after the writeback a crash
/// may have cut). Before format 2 of the table a flip there was served.
#[test]
fn flip_outside_a_dirty_pages_valid_chunks_is_refused() {
    let d = tmp();
    let inst = d.path().join("inst");
    let expect = build(&inst, true);
    assert!(dirty_pages(&inst).iter().any(|&(_, idx)| idx == 7));
    let data = inst.join("data");
    for off in [3000u64, 100, 4095] {
        let at = 7 * PS as u64 + off;
        flip(&data, at, 0x04);
        scrub_finds(&inst, "backing files", "data");
        let before = files_of(&inst);
        let e = recover(&inst).unwrap_err().to_string();
        assert!(
            e.contains("backing-file page 7") && e.contains("checksum mismatch"),
            "{e}"
        );
        assert_eq!(files_of(&inst), before, "recovery wrote something");
        flip(&data, at, 0x04);
    }
    assert!(scrub(&inst).unwrap().clean());
    assert_eq!(recover_and_read(&inst).unwrap(), expect);
}

#[test]
fn old_format_is_refused_with_a_clear_message() {
    let d = tmp();
    let inst = d.path().join("inst");
    build(&inst, false);
    let meta = inst.join("meta.pool");
    let mut sb = vec![0u8; 256];
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&meta)
        .unwrap();
    f.read_exact_at(&mut sb, HDR).unwrap();
    sb[8..12].copy_from_slice(&2u32.to_le_bytes());
    let c = crc32fast::hash(&sb[..252]);
    sb[252..].copy_from_slice(&c.to_le_bytes());
    f.write_all_at(&sb, HDR).unwrap();
    for e in [
        recover(&inst).unwrap_err().to_string(),
        nv_init(&cfg(&inst)).unwrap_err().to_string(),
    ] {
        assert!(e.contains("format version 2") && e.contains("older"), "{e}");
    }
    assert!(!scrub(&inst).unwrap().clean());
}

#[test]
fn crashed_instance_can_be_moved() {
    let d = tmp();
    let inst = d.path().join("inst");
    let expect = build(&inst, true);
    let info = tiermem_vnvm::inspect(&inst).unwrap();
    assert!(info.files[0].relative, "{:?}", info.files[0]);
    let original = files_of(&inst);
    let moved = d.path().join("elsewhere").join("inst");
    std::fs::create_dir_all(&moved).unwrap();
    for (p, b) in &original {
        std::fs::write(moved.join(p.file_name().unwrap()), b).unwrap();
    }
    let r = recover(&moved).unwrap();
    assert_eq!(r.transactions_replayed, 2);
    assert_eq!(r.files, vec![moved.join("data")]);
    assert_eq!(recover_and_read(&moved).unwrap(), expect);
    assert_eq!(
        files_of(&inst),
        original,
        "the original location was touched"
    );
    assert_eq!(recover_and_read(&inst).unwrap(), expect);
}

/// Random single-bit flips over every file of a crashed and of a clean instance: each case
/// ends in a refusal (which scrub saw too) or in exactly the data of a clean recovery; a flip
/// in a checksummed area is always found by scrub.
#[test]
fn random_flip_sweep() {
    let cases: u64 = std::env::var("TIERMEM_VNVM_SWEEP_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(60);
    let d = tmp();
    let mut stats = [0u32; 3]; // refused, identical, found-and-outvoted-or-overwritten
    for crash in [true, false] {
        let pristine = d.path().join(format!("pristine-{crash}")).join("inst");
        build(&pristine, crash);
        let files = files_of(&pristine);
        let dirty = dirty_pages(&pristine);
        let expect = {
            let c = d.path().join(format!("ref-{crash}")).join("inst");
            std::fs::create_dir_all(&c).unwrap();
            for (p, b) in &files {
                std::fs::write(c.join(p.file_name().unwrap()), b).unwrap();
            }
            recover_and_read(&c).unwrap()
        };
        for case in 0..cases / 2 {
            let seed = mix(case ^ (crash as u64) << 32);
            let (fpath, bytes) = &files[(seed % files.len() as u64) as usize];
            let name = fpath.file_name().unwrap().to_str().unwrap().to_string();
            let off = mix(seed) % bytes.len() as u64;
            let bit = 1u8 << (mix(seed ^ 7) % 8);
            let c = d.path().join(format!("case-{crash}-{case}")).join("inst");
            std::fs::create_dir_all(&c).unwrap();
            for (p, b) in &files {
                std::fs::write(c.join(p.file_name().unwrap()), b).unwrap();
            }
            flip(&c.join(&name), off, bit);
            let s = scrub(&c).unwrap();
            // Areas every byte of which is checksummed (the backing file's pages of dirty
            // cache pages too: scrub accepts either of their two recorded contents).
            let checksummed = match name.as_str() {
                "data.vnvm-crc" => true,
                "data" => true,
                "meta.pool" => {
                    let o = off.wrapping_sub(HDR);
                    o < 264
                        || (512..512 + 64 * 64).contains(&o) && (o - 512) % 64 < 32
                        || (CACHE_RECS..CACHE_RECS + 64 * 16).contains(&o)
                }
                "cache.pool" => {
                    // The valid chunks of dirty pages: all of them, but 512..576 of page 7's.
                    let (p, o) = (
                        off.wrapping_sub(HDR) / PS as u64,
                        off.wrapping_sub(HDR) % PS as u64,
                    );
                    off >= HDR
                        && dirty.iter().any(|&(dp, idx)| {
                            dp as u64 == p && (idx != 7 || (512..576).contains(&o))
                        })
                }
                _ => false,
            };
            let what = format!("crash {crash} case {case}: bit {bit:#x} at {name}+{off}");
            if checksummed {
                assert!(!s.clean(), "{what}: scrub found nothing");
            }
            match recover_and_read(&c) {
                Err(e) => {
                    assert!(!s.clean(), "{what}: refused ({e}) but scrub found nothing");
                    stats[0] += 1;
                }
                Ok(got) if got == expect => {
                    stats[if s.clean() { 1 } else { 2 }] += 1;
                }
                Ok(_) => panic!("{what}: wrong data after recovery"),
            }
            let _ = std::fs::remove_dir_all(c.parent().unwrap());
        }
    }
    eprintln!(
        "sweep: {} refused, {} identical (unchecksummed bytes), {} found and outvoted or \
         overwritten",
        stats[0], stats[1], stats[2]
    );
}
