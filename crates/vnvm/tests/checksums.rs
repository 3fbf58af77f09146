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

/// The committed transactions `build_listed_over_dirty` leaves listed: (file page, offset in
/// the page, length, byte). Pages 1 and 3 are dirty in the NVM cache (page 1 whole, page 3
/// one valid chunk, 512..576), page 5 is not.
const LISTED: [(usize, usize, usize, u8); 3] =
    [(1, 300, 48, 0xB1), (3, 500, 48, 0xB3), (5, 2000, 48, 0xB5)];

/// A crashed instance whose committed list writes pages that are dirty in the NVM cache (the
/// state of a kv server killed under write load: the hot pages are dirty and the last commits
/// are not applied yet). Run 1 writes every page and shuts down; run 2 rewrites pages 0 and 1,
/// 64 bytes of page 3 (512..576), lets the redo worker apply them, then commits `LISTED` and
/// crashes before they are applied. Returns the expected file contents.
fn build_listed_over_dirty(inst: &Path) -> Vec<u8> {
    let data = inst.join("data");
    let mut expect = vec![0u8; SIZE];
    {
        let vn = nv_init(&cfg(inst)).unwrap();
        let r = vn.nv_allocate(&data, SIZE, Mode::Private).unwrap();
        for p in 0..PAGES {
            let tid = vn.nv_txbegin();
            let b = pat(1, p);
            // SAFETY: inside the region.
            vn.nv_write(tid, unsafe { r.as_ptr().add(p * PS) }, &b)
                .unwrap();
            vn.nv_commit(tid).unwrap();
            expect[p * PS..(p + 1) * PS].copy_from_slice(&b);
        }
        vn.nv_release().unwrap();
    }
    for attempt in 0.. {
        let mut exp = expect.clone();
        let vn = nv_init(&cfg(inst)).unwrap();
        let r = vn.nv_allocate(&data, SIZE, Mode::Private).unwrap();
        let mut w = |off: usize, b: &[u8]| {
            let tid = vn.nv_txbegin();
            // SAFETY: inside the region.
            vn.nv_write(tid, unsafe { r.as_ptr().add(off) }, b).unwrap();
            vn.nv_commit(tid).unwrap();
            exp[off..off + b.len()].copy_from_slice(b);
        };
        for p in 0..2 {
            w(p * PS, &pat(2, p));
        }
        w(3 * PS + 512, &[0x77; 64]);
        vn.drain().unwrap();
        // The redo worker sleeps its period after REDO_IDLE_AFTER (see `build`).
        std::thread::sleep(Duration::from_millis(30));
        for (p, off, len, b) in LISTED {
            w(p * PS + off, &vec![b; len]);
        }
        vn.abandon();
        let i = tiermem_vnvm::inspect(inst).unwrap();
        if i.committed_transactions == LISTED.len() && i.cache.dirty == 3 {
            return exp;
        }
        assert!(attempt < 5, "could not build a crashed instance: {i:?}");
        recover(inst).unwrap();
    }
    unreachable!()
}

/// The cache page holding file page `idx`, dirty.
fn cache_page_of(inst: &Path, idx: u64) -> u32 {
    dirty_pages(inst)
        .into_iter()
        .find(|&(_, i)| i == idx)
        .unwrap_or_else(|| panic!("file page {idx} is not dirty in the cache"))
        .0
}

/// A copy of the instance `files` (from [`files_of`]) in a new directory `dir/inst`.
fn copy_instance(files: &[(PathBuf, Vec<u8>)], dir: &Path) -> PathBuf {
    let inst = dir.join("inst");
    let _ = std::fs::remove_dir_all(&inst);
    std::fs::create_dir_all(&inst).unwrap();
    for (p, b) in files {
        std::fs::write(inst.join(p.file_name().unwrap()), b).unwrap();
    }
    inst
}

/// A bit flipped in a dirty cache page that a still-listed (committed, unapplied) transaction
/// writes: its contents checksum no longer matches, and recovery used to take that for a redo
/// batch cut by the crash and write the page anyway — recovery overwrites only the bytes the
/// listed transactions write, so a flip anywhere else in the page's valid chunks was served
/// (seen as a wrong value in the kv corruption sweep, cache.pool of a crashed server). Each
/// flip must be refused, naming the cache page, or be harmless.
#[test]
fn flip_in_dirty_cache_page_a_listed_transaction_writes_is_refused() {
    let d = tmp();
    let pristine = d.path().join("pristine").join("inst");
    let expect = build_listed_over_dirty(&pristine);
    assert!(scrub(&pristine).unwrap().clean());
    let files = files_of(&pristine);
    // (file page, offset in the page, must be refused): the listed transactions write page 1
    // at 300..348 and page 3 at 500..548; page 3's only valid chunk is 512..576.
    let cases = [
        (1u64, 2000u64, true), // a valid chunk no listed entry touches
        (1, 260, true),        // the entry's first chunk (256..320), outside the entry
        (1, 360, true),        // the entry's last chunk (320..384), outside the entry
        (1, 4095, true),       // the page's last byte
        (1, 310, false),       // a byte the listed entry overwrites: refused or harmless
        (3, 560, true),        // page 3's valid chunk, outside the entry
        (3, 530, false),       // page 3's valid chunk, a byte the entry overwrites
        (3, 100, false),       // an invalid chunk: never read
        (3, 3000, false),      // an invalid chunk: never read
    ];
    let mut wrong = Vec::new();
    for (k, (idx, off, must_refuse)) in cases.into_iter().enumerate() {
        let inst = copy_instance(&files, &d.path().join(format!("case-{k}")));
        let page = cache_page_of(&inst, idx);
        let cache = inst.join("cache.pool");
        flip(&cache, HDR + page as u64 * PS as u64 + off, 0x10);
        let what = format!("flip in cache page {page} (file page {idx}) at {off}");
        let found = !scrub(&inst).unwrap().clean();
        let before = files_of(&inst);
        match recover_and_read(&inst) {
            Err(e) => {
                let e = e.to_string();
                assert!(
                    e.contains(&format!("cache page {page}")) && e.contains("checksum"),
                    "{what}: {e}"
                );
                assert!(found, "{what}: refused but scrub found nothing");
                assert_eq!(files_of(&inst), before, "{what}: recovery wrote something");
            }
            Ok(got) if got == expect && !must_refuse => {}
            Ok(got) => wrong.push(format!(
                "{what}: recovered ({}), scrub {}",
                if got == expect {
                    "the right data"
                } else {
                    "WRONG DATA"
                },
                if found { "found it" } else { "found nothing" }
            )),
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// The chunk checksum of format 3 (`chunksum::chunk_sum`): CRC32C seeded with the chunk index.
fn chunk_sum(ch: usize, bytes: &[u8]) -> u32 {
    crc32c::crc32c_append(0x9e37_79b9 ^ ch as u32, bytes)
}

/// Rewrite both copies of cache page `page`'s record in `inst` with contents checksum `crc`
/// (word and mask kept), as the redo worker does before it stores into a dirty page's valid
/// chunks.
fn set_page_crc(inst: &Path, page: u32, crc: u32) {
    let meta = inst.join("meta.pool");
    let at = HDR + CACHE_RECS + 64 * page as u64;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&meta)
        .unwrap();
    let mut b = [0u8; 32];
    f.read_exact_at(&mut b, at).unwrap();
    b[16..20].copy_from_slice(&crc.to_le_bytes());
    let c = crc32c::crc32c_append(crc32c::crc32c(&b[..20]), &b[24..32]);
    b[20..24].copy_from_slice(&c.to_le_bytes());
    f.write_all_at(&b, at).unwrap();
    f.write_all_at(&b, at + 32).unwrap();
}

/// The contents checksum of cache page `page` of `inst` with `writes` (offset, bytes) applied
/// to it, over the chunks of the page's recorded valid mask.
fn page_crc_after(inst: &Path, page: u32, writes: &[(usize, &[u8])]) -> u32 {
    let mut b = vec![0u8; PS];
    std::fs::File::open(inst.join("cache.pool"))
        .unwrap()
        .read_exact_at(&mut b, HDR + page as u64 * PS as u64)
        .unwrap();
    for (off, w) in writes {
        b[*off..off + w.len()].copy_from_slice(w);
    }
    let mask = u64_at(
        &inst.join("meta.pool"),
        HDR + CACHE_RECS + 64 * page as u64 + 8,
    );
    (0..64)
        .filter(|ch| mask >> ch & 1 == 1)
        .fold(0, |x, ch| x ^ chunk_sum(ch, &b[ch * 64..ch * 64 + 64]))
}

/// Write `bytes` at `off` of cache page `page` of `inst`.
fn store_in_cache(inst: &Path, page: u32, off: usize, bytes: &[u8]) {
    std::fs::OpenOptions::new()
        .write(true)
        .open(inst.join("cache.pool"))
        .unwrap()
        .write_all_at(bytes, HDR + (page as usize * PS + off) as u64)
        .unwrap();
}

/// A kill inside a redo batch that writes into dirty cache pages' valid chunks: the redo
/// worker persists the pages' new contents checksums first (their records then describe the
/// pages as the listed transactions make them), and stores after that. The images such a kill
/// leaves — new records over pages that hold none, some or all of the new bytes — recover to
/// exactly the committed data, and a flip in them outside the listed writes is still refused.
/// (An older build stored first: its image with some new bytes under the old record is refused
/// now, a clear error, never wrong data.)
#[test]
fn kill_inside_a_redo_batch_over_dirty_pages_recovers_and_flips_are_refused() {
    let d = tmp();
    let pristine = d.path().join("pristine").join("inst");
    let expect = build_listed_over_dirty(&pristine);
    let files = files_of(&pristine);
    let (a, b) = (LISTED[0], LISTED[1]);
    let (wa, wb) = (vec![a.3; a.2], vec![b.3; b.2]);
    // How much of each listed write the kill let through: (page 1, page 3) stored byte counts.
    let stored_cases = [(0usize, 0usize), (16, 0), (48, 12), (48, 48)];
    for (k, (na, nb)) in stored_cases.into_iter().enumerate() {
        for flip_at in [None, Some((1u64, 2000u64)), Some((1, 350)), Some((3, 560))] {
            let what = format!("stored {na}/{nb} bytes, flip {flip_at:?}");
            let inst = copy_instance(&files, &d.path().join(format!("case-{k}")));
            let (pa, pb) = (
                cache_page_of(&inst, a.0 as u64),
                cache_page_of(&inst, b.0 as u64),
            );
            set_page_crc(&inst, pa, page_crc_after(&inst, pa, &[(a.1, &wa)]));
            set_page_crc(&inst, pb, page_crc_after(&inst, pb, &[(b.1, &wb)]));
            store_in_cache(&inst, pa, a.1, &wa[..na]);
            store_in_cache(&inst, pb, b.1, &wb[..nb]);
            if let Some((idx, off)) = flip_at {
                let page = cache_page_of(&inst, idx);
                flip(
                    &inst.join("cache.pool"),
                    HDR + page as u64 * PS as u64 + off,
                    0x02,
                );
                scrub_finds(&inst, "cache pages", "cache.pool");
                let e = recover(&inst).unwrap_err().to_string();
                assert!(
                    e.contains(&format!("cache page {page}")) && e.contains("checksum"),
                    "{what}: {e}"
                );
            } else {
                let s = scrub(&inst).unwrap();
                assert!(s.clean(), "{what}: {:?}", s.findings().collect::<Vec<_>>());
                assert_eq!(recover_and_read(&inst).unwrap(), expect, "{what}");
            }
        }
    }
    // An older build's image: new bytes stored under the old record.
    let inst = copy_instance(&files, &d.path().join("old-build"));
    let pa = cache_page_of(&inst, a.0 as u64);
    store_in_cache(&inst, pa, a.1, &wa[..16]);
    let e = recover(&inst).unwrap_err().to_string();
    assert!(e.contains(&format!("cache page {pa}")), "{e}");
}
