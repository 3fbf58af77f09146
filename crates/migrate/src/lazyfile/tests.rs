use super::*;
use rand::{Rng, RngCore, SeedableRng};
use std::io::{Seek, SeekFrom, Write};
use std::sync::atomic::AtomicBool;

const MIB: u64 = 1 << 20;

fn tmpdir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("mig-lazy-test")
        .tempdir_in("/dev/shm")
        .expect("tempdir in /dev/shm")
}

fn random_region(len: u64, seed: u64) -> Vec<u8> {
    let mut v = vec![0u8; len as usize];
    rand::rngs::StdRng::seed_from_u64(seed).fill_bytes(&mut v);
    v
}

fn new_dumper(file: &Arc<LazyFile>, region: &[u8], mode: Batching) -> Arc<Dumper> {
    // SAFETY: every test keeps `region` alive and unmodified until the dumper is dropped.
    Arc::new(
        unsafe { Dumper::new(Arc::clone(file), region.as_ptr(), region.len() as u64, mode) }
            .unwrap(),
    )
}

fn check_all(path: &Path, region: &[u8]) {
    let f = LazyFile::open(path, DelayModel::NONE).unwrap();
    assert!(f.is_complete());
    assert_eq!(f.watermark(), region.len() as u64);
    let img = f.range_trusted(0, region.len() as u64).unwrap();
    assert!(img == region, "image differs from the region");
    for off in (0..region.len() as u64).step_by(4096 * 97) {
        assert_eq!(
            f.page(off).unwrap(),
            &region[off as usize..off as usize + 4096]
        );
    }
}

fn roundtrip(mode: Batching, len: u64) -> DumpStats {
    let dir = tmpdir();
    let region = random_region(len, len ^ 7);
    let file =
        Arc::new(LazyFile::create(dir.path(), "region-0.lazy", len, DelayModel::NONE).unwrap());
    let d = new_dumper(&file, &region, mode);
    let st = d.spawn_background().unwrap().join().unwrap().unwrap();
    assert_eq!(st.bytes, len);
    assert_eq!(st.vectors, len.div_ceil(VECTOR_SIZE));
    assert_eq!(st.demand_vectors, 0);
    let path = file.path().to_path_buf();
    drop(d);
    drop(file);
    check_all(&path, &region);
    st
}

#[test]
fn roundtrip_per_vector() {
    let len = 64 * MIB + 12 * 4096; // last vector partial
    let st = roundtrip(Batching::PerVector, len);
    assert_eq!(st.syscalls, len.div_ceil(VECTOR_SIZE));
    assert_eq!(st.persists, st.syscalls);
}

#[test]
fn roundtrip_batched_max() {
    let len = 64 * MIB + 12 * 4096;
    let st = roundtrip(Batching::MAX, len);
    assert_eq!(st.syscalls, 1);
    assert_eq!(st.persists, 1);
}

#[test]
fn roundtrip_batched_small_batches() {
    let len = 64 * MIB;
    let st = roundtrip(Batching::Batched { max_bytes: 6 * MIB }, len);
    assert_eq!(st.syscalls, 11); // 32 vectors in batches of 3
}

#[test]
fn fresh_file_has_nothing_dumped() {
    let dir = tmpdir();
    let len = 8 * MIB;
    let f = LazyFile::create(dir.path(), "a.lazy", len, DelayModel::NONE).unwrap();
    assert_eq!(f.watermark(), 0);
    assert!(!f.is_complete());
    assert!(f.journal().is_empty());
    for off in (0..len + 8192).step_by(4096) {
        assert!(!f.dumped(off));
    }
    assert!(matches!(
        f.page(0),
        Err(LazyError::NotDumped { offset: 0, .. })
    ));
    assert!(matches!(f.page(len), Err(LazyError::OutOfRange { .. })));
    assert!(matches!(
        f.range_trusted(4096, len),
        Err(LazyError::OutOfRange { .. })
    ));
    assert!(matches!(
        LazyFile::create(dir.path(), "b.lazy", 4097, DelayModel::NONE),
        Err(LazyError::InvalidArgument(_))
    ));
}

#[test]
fn on_demand_out_of_order_then_background() {
    let dir = tmpdir();
    let len = 32 * MIB;
    let region = random_region(len, 1);
    let file = Arc::new(LazyFile::create(dir.path(), "r.lazy", len, DelayModel::NONE).unwrap());
    let d = new_dumper(&file, &region, Batching::MAX);
    let reader = LazyFile::open(file.path(), DelayModel::NONE).unwrap();

    let o = d.dump_vector_containing(10 * MIB + 12345).unwrap();
    assert_eq!(
        o,
        DemandOutcome {
            start: 10 * MIB,
            len: 2 * MIB,
            already: false,
            journaled: true,
            watermark: 0
        }
    );
    assert_eq!(reader.journal(), vec![(10 * MIB, 2 * MIB)]);
    assert_eq!(reader.watermark(), 0);
    assert!(reader.dumped(10 * MIB) && reader.dumped(12 * MIB - 1));
    assert!(!reader.dumped(10 * MIB - 1) && !reader.dumped(12 * MIB) && !reader.dumped(0));
    assert_eq!(
        reader.page(11 * MIB).unwrap(),
        &region[11 * MIB as usize..11 * MIB as usize + 4096]
    );
    // A second request for the same vector writes nothing.
    let again = d.dump_vector_containing(11 * MIB).unwrap();
    assert!(again.already);
    // Last (partial-free) vector, then the background dump.
    let last = d.dump_vector_containing(len - 1).unwrap();
    assert_eq!(
        (last.start, last.len, last.already),
        (len - 2 * MIB, 2 * MIB, false)
    );
    assert_eq!(reader.journal().len(), 2);

    let st = d.run_background().unwrap();
    assert!(matches!(
        d.run_background(),
        Err(LazyError::InvalidArgument(_))
    ));
    assert_eq!(st.bytes, len, "each vector is written exactly once");
    assert_eq!(st.demand_vectors, 2);
    // The background batch stops at the on-demand vector: [0,10M), [12M,30M).
    assert_eq!(st.syscalls, 2 + 2);
    assert!(reader.is_complete());
    assert_eq!(reader.watermark(), len);
    let after = d.dump_vector_containing(0).unwrap();
    assert!(after.already);
    assert_eq!(after.watermark, len);
    drop(reader);
    let path = file.path().to_path_buf();
    drop(d);
    drop(file);
    check_all(&path, &region);
}

#[test]
fn watermark_and_pause_semantics() {
    let dir = tmpdir();
    let len = 64 * MIB;
    let region = random_region(len, 2);
    // A slow medium (100 MB/s: 21 ms per vector, 0.7 s in all) so the dump is still running
    // when we pause it.
    let delay = DelayModel {
        write_bytes_per_sec: 100_000_000,
        ..DelayModel::NONE
    };
    let file = Arc::new(LazyFile::create(dir.path(), "w.lazy", len, delay).unwrap());
    let d = new_dumper(&file, &region, Batching::PerVector);
    let reader = LazyFile::open(file.path(), DelayModel::NONE).unwrap();
    let h = d.spawn_background().unwrap();
    while reader.watermark() < 4 * MIB {
        std::thread::yield_now();
    }
    {
        let _g = d.control().pause();
        let wm = reader.watermark();
        assert!(wm >= 4 * MIB && wm % VECTOR_SIZE == 0);
        std::thread::sleep(std::time::Duration::from_millis(20));
        assert_eq!(reader.watermark(), wm, "the dumper is paused");
        assert!(!reader.is_complete());
        for off in (0..len).step_by(4096) {
            assert_eq!(reader.dumped(off), off < wm, "offset {off}, watermark {wm}");
        }
        assert!(reader.range_trusted(0, wm).unwrap() == &region[..wm as usize]);
    }
    h.join().unwrap().unwrap();
    assert!(reader.is_complete());
    assert!(file.pool().stats().snapshot().delay_ns_injected > 0);
}

#[test]
fn concurrent_demand_and_background_never_expose_undumped_pages() {
    let dir = tmpdir();
    let len = 64 * MIB;
    let region = random_region(len, 3);
    let file = Arc::new(LazyFile::create(dir.path(), "c.lazy", len, DelayModel::PCM_FAM).unwrap());
    let d = new_dumper(&file, &region, Batching::Batched { max_bytes: 8 * MIB });
    let reader = LazyFile::open(file.path(), DelayModel::NONE).unwrap();
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        let bg = d.spawn_background().unwrap();
        // Page-server: random on-demand vectors, high offsets first.
        let ps = s.spawn(|| {
            let mut rng = rand::rngs::StdRng::seed_from_u64(9);
            let mut n = 0;
            while !reader.is_complete() && n < 40 {
                let off = rng.gen_range(0..len);
                let o = d.dump_vector_containing(off).unwrap();
                assert!(o.start <= off && off < o.start + o.len);
                n += 1;
            }
        });
        // Target: whatever the header says is dumped must equal the region.
        let rd = s.spawn(|| {
            let mut rng = rand::rngs::StdRng::seed_from_u64(10);
            let mut checked = 0u64;
            while !stop.load(Ordering::Relaxed) || checked < 100 {
                let off = rng.gen_range(0..len / 4096) * 4096;
                if reader.dumped(off) {
                    assert_eq!(
                        reader.page(off).unwrap(),
                        &region[off as usize..off as usize + 4096],
                        "page {off} reported dumped before its data"
                    );
                    checked += 1;
                }
            }
            checked
        });
        let st = bg.join().unwrap().unwrap();
        ps.join().unwrap();
        stop.store(true, Ordering::Relaxed);
        assert!(rd.join().unwrap() > 0);
        assert!(
            d.stats().bytes == len,
            "every vector exactly once: {st:?} {:?}",
            d.stats()
        );
    });
    let path = file.path().to_path_buf();
    drop(reader);
    drop(d);
    drop(file);
    check_all(&path, &region);
}

#[test]
fn journal_full_and_reuse() {
    let dir = tmpdir();
    let len = 2 * MIB;
    let f = LazyFile::create(dir.path(), "j.lazy", len, DelayModel::NONE).unwrap();
    for i in 0..JOURNAL_SLOTS as u64 {
        assert!(f.journal_append(i * 4096, 4096).unwrap());
    }
    assert!(!f.journal_append(300 * 4096, 4096).unwrap(), "full");
    f.publish(OFF_WATERMARK, 8192).unwrap();
    assert!(
        f.journal_append(300 * 4096, 4096).unwrap(),
        "reuses a slot below the watermark"
    );
    assert!(f.journal_append(301 * 4096, 4096).unwrap());
    assert!(!f.journal_append(302 * 4096, 4096).unwrap());
    assert!(f.dumped(300 * 4096) && f.dumped(301 * 4096) && f.dumped(0));
    assert!(!f.dumped(302 * 4096));
    drop(f);
    // Reopens fine.
    let g = LazyFile::open(&dir.path().join("j.lazy"), DelayModel::NONE).unwrap();
    assert_eq!(g.journal().len(), JOURNAL_SLOTS);
}

/// A small complete lazy file; returns its path.
fn complete_file(dir: &Path) -> PathBuf {
    let len = 4 * MIB;
    let region = random_region(len, 4);
    let file = Arc::new(LazyFile::create(dir, "v.lazy", len, DelayModel::NONE).unwrap());
    let d = new_dumper(&file, &region, Batching::MAX);
    d.run_background().unwrap();
    file.path().to_path_buf()
}

fn patch(path: &Path, file_off: u64, bytes: &[u8]) {
    let mut f = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    f.seek(SeekFrom::Start(file_off)).unwrap();
    f.write_all(bytes).unwrap();
}

fn read_at(path: &Path, file_off: u64, n: usize) -> Vec<u8> {
    std::fs::read(path).unwrap()[file_off as usize..file_off as usize + n].to_vec()
}

const MH: u64 = POOL_HEADER_SIZE; // file offset of the migrate header

fn fix_crc(path: &Path) {
    let h = read_at(path, MH, OFF_CRC);
    patch(
        path,
        MH + OFF_CRC as u64,
        &crc32fast::hash(&h).to_le_bytes(),
    );
}

fn open_err(path: &Path) -> LazyError {
    let e = LazyFile::open(path, DelayModel::NONE).unwrap_err();
    let msg = e.to_string();
    assert!(
        msg.contains(&path.display().to_string()),
        "message names the file: {msg}"
    );
    e
}

#[test]
fn reopen_validation() {
    let dir = tmpdir();
    let path = complete_file(dir.path());
    LazyFile::open(&path, DelayModel::NONE).unwrap();
    let pristine = std::fs::read(&path).unwrap();
    let restore = || std::fs::write(&path, &pristine).unwrap();

    // Truncated (by a page, and below the pool header).
    let flen = pristine.len() as u64;
    std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(flen - 4096)
        .unwrap();
    assert!(matches!(
        open_err(&path),
        LazyError::Media(MediaError::SizeMismatch { .. })
    ));
    std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(100)
        .unwrap();
    assert!(matches!(
        open_err(&path),
        LazyError::Media(MediaError::NotAPool { .. })
    ));
    restore();

    // Bit flip in the fixed migrate-header fields (region length).
    let b = read_at(&path, MH + 17, 1)[0];
    patch(&path, MH + 17, &[b ^ 0x10]);
    let e = open_err(&path);
    assert!(matches!(e, LazyError::Checksum { .. }), "{e}");
    assert!(e.to_string().contains("`crc`"));
    restore();

    // Other version (with a valid CRC).
    patch(&path, MH + OFF_VERSION as u64, &2u32.to_le_bytes());
    fix_crc(&path);
    let e = open_err(&path);
    assert!(
        matches!(
            e,
            LazyError::Version {
                found: 2,
                supported: LAZY_VERSION,
                ..
            }
        ),
        "{e}"
    );
    restore();

    // Wrong magic.
    patch(&path, MH, b"NOTLAZY!");
    let e = open_err(&path);
    assert!(matches!(e, LazyError::NotLazyFile { .. }), "{e}");
    assert!(e.to_string().contains("`magic`"));
    restore();

    // Bit flip in the pool header.
    let b = read_at(&path, 30, 1)[0];
    patch(&path, 30, &[b ^ 1]);
    assert!(matches!(
        open_err(&path),
        LazyError::Media(MediaError::Corrupt { .. })
    ));
    restore();

    // Region length inconsistent with the file (valid CRC).
    patch(&path, MH + OFF_LEN as u64, &(2 * MIB).to_le_bytes());
    fix_crc(&path);
    let e = open_err(&path);
    assert!(
        matches!(
            e,
            LazyError::Field {
                field: "region_length",
                ..
            }
        ),
        "{e}"
    );
    restore();

    // Mutable fields out of range.
    patch(&path, MH + OFF_WATERMARK as u64, &(8 * MIB).to_le_bytes());
    assert!(matches!(
        open_err(&path),
        LazyError::Field {
            field: "watermark",
            ..
        }
    ));
    restore();
    patch(&path, MH + OFF_COMPLETE as u64, &7u64.to_le_bytes());
    assert!(matches!(
        open_err(&path),
        LazyError::Field {
            field: "complete",
            ..
        }
    ));
    restore();
    patch(
        &path,
        MH + OFF_JOURNAL as u64 + 8,
        &encode_entry(4 * MIB, 4096, 4096).to_le_bytes(),
    );
    assert!(matches!(
        open_err(&path),
        LazyError::Field {
            field: "journal",
            ..
        }
    ));
    restore();

    LazyFile::open(&path, DelayModel::NONE).unwrap();

    // A pool that is not a lazy file.
    let other = dir.path().join("other.pool");
    Pool::create(
        &other,
        &PoolOptions::new(2 * MIB).kind(PoolKind::Fam).tag("kv"),
    )
    .unwrap();
    assert!(matches!(open_err(&other), LazyError::NotLazyFile { .. }));
}

#[test]
fn reservation_fails_before_writing_when_the_directory_is_full() {
    let dir = tmpdir();
    let mnt = dir.path().join("small");
    std::fs::create_dir(&mnt).unwrap();
    let ok = std::process::Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=16m", "tmpfs"])
        .arg(&mnt)
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    if !ok {
        eprintln!("SKIPPED reservation test: cannot mount a 16 MiB tmpfs (needs root)");
        return;
    }
    struct Unmount(PathBuf);
    impl Drop for Unmount {
        fn drop(&mut self) {
            let _ = std::process::Command::new("umount").arg(&self.0).status();
        }
    }
    let _u = Unmount(mnt.clone());
    // Fits.
    let small = LazyFile::create(&mnt, "fits.lazy", 4 * MIB, DelayModel::NONE).unwrap();
    // Does not fit: refused at creation, nothing left behind.
    let e = LazyFile::create(&mnt, "big.lazy", 64 * MIB, DelayModel::NONE).unwrap_err();
    assert!(
        matches!(e, LazyError::Media(MediaError::NoSpace { .. })),
        "{e}"
    );
    assert!(!mnt.join("big.lazy").exists());
    // Passes statvfs but not the fallocate of the whole file? 12 MiB free, ask for 11.9 MiB:
    // it fits, and the reservation really holds the space.
    let free_now = {
        // SAFETY: zeroed statvfs is a valid out-buffer.
        let mut sv: libc::statvfs = unsafe { std::mem::zeroed() };
        let c = std::ffi::CString::new(mnt.to_str().unwrap()).unwrap();
        // SAFETY: valid path and out-pointer.
        assert_eq!(unsafe { libc::statvfs(c.as_ptr(), &mut sv) }, 0);
        sv.f_bavail * sv.f_frsize
    };
    assert!(
        free_now < 16 * MIB - 4 * MIB + 4096,
        "the 4 MiB file is reserved: {free_now}"
    );
    drop(small);
}

#[test]
fn batching_ratio_small() {
    let dir = tmpdir();
    let (p, b) = batching_ratio_in(dir.path(), 8 * MIB, DelayModel::NONE, 1).unwrap();
    assert!(p > 0.0 && b > 0.0);
    assert_eq!(
        std::fs::read_dir(dir.path()).unwrap().count(),
        0,
        "files removed"
    );
}

/// `cargo test -p tiermem-migrate --release -- --ignored --nocapture batching_ratio_256m`
#[test]
#[ignore]
fn batching_ratio_256m() {
    for (name, d) in [("none", DelayModel::NONE), ("pcm-fam", DelayModel::PCM_FAM)] {
        let (p, b) = batching_ratio(256 * MIB, d).unwrap();
        println!(
            "batching 256 MiB, delay {name}: per-vector {:.2} ms, batched {:.2} ms, ratio {:.2}",
            p * 1e3,
            b * 1e3,
            p / b
        );
        let dir = tmpdir();
        let region = random_region(256 * MIB, 5);
        for mode in [Batching::PerVector, Batching::MAX] {
            let file = Arc::new(LazyFile::create(dir.path(), "b.lazy", 256 * MIB, d).unwrap());
            let st = new_dumper(&file, &region, mode).run_background().unwrap();
            println!("  {mode:?} ({:?}): {st:?}", file.pool().medium());
            drop(file);
            std::fs::remove_file(dir.path().join("b.lazy")).unwrap();
        }
    }
}

#[test]
fn untouched_vectors_are_skipped_and_read_as_zeros() {
    let dir = tmpdir();
    let len: u64 = 16 << 20;
    // SAFETY: a fresh private anonymous mapping; checked; unmapped at the end.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len as usize,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    assert_ne!(p, libc::MAP_FAILED);
    // SAFETY: the mapping above.
    let region = unsafe { std::slice::from_raw_parts_mut(p as *mut u8, len as usize) };
    // Touch a few pages of vectors 1 and 5 only.
    for off in [(2 << 20) + 4096, (2 << 20) + 8192, (10 << 20) + 123] {
        region[off] = 0xab;
    }
    let file =
        Arc::new(LazyFile::create(dir.path(), "region-0.lazy", len, DelayModel::NONE).unwrap());
    let d = new_dumper(&file, region, Batching::PerVector);
    d.set_skip_untouched(true);
    let st = d.spawn_background().unwrap().join().unwrap().unwrap();
    assert_eq!(d.skipped_vectors(), 6, "8 vectors, 2 touched");
    assert_eq!(st.bytes, 2 * VECTOR_SIZE);
    let path = file.path().to_path_buf();
    drop(d);
    drop(file);
    check_all(&path, region);
    // SAFETY: our mapping, no longer used.
    unsafe { libc::munmap(p, len as usize) };
}
