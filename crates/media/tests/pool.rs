//! Pool creation, reopening and validation, on tmpfs (CacheFlush) and on ext4 (Msync).

use std::io::{Seek, SeekFrom, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use tiermem_media::pool::{CHECKSUM_OFFSET, HEADER_SIZE, POOL_VERSION};
use tiermem_media::{
    DelayModel, MediaError, OpenOptions, PersistMethod, Pool, PoolKind, PoolOptions,
};

fn shm_dir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("tiermem-test")
        .tempdir_in("/dev/shm")
        .expect("tempdir in /dev/shm")
}

fn disk_dir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("tiermem-test")
        .tempdir_in("/var/tmp")
        .expect("tempdir in /var/tmp")
}

fn round_trip(dir: &Path, expect: PersistMethod) {
    let path = dir.join("rt.pool");
    let opts = PoolOptions::new(1 << 20).kind(PoolKind::Fam).tag("pheap");
    let uuid;
    {
        let p = Pool::create(&path, &opts).unwrap();
        assert_eq!(p.medium(), expect);
        assert_eq!(p.data_len() as u64, (1 << 20) - HEADER_SIZE);
        assert_eq!(p.kind(), PoolKind::Fam);
        assert_eq!(p.tag(), "pheap");
        assert!(p.delay().is_none(), "delay must be off by default");
        uuid = p.uuid();
        assert_ne!(uuid, [0u8; 16]);
        p.write_persist(100, b"hello pool").unwrap();
        // Raw pointer store, then persist through the pool.
        // SAFETY: offset 5000 + 4 is inside the data area of the live pool.
        unsafe {
            p.data_ptr()
                .add(5000)
                .copy_from_nonoverlapping(b"raw!".as_ptr(), 4)
        };
        p.persist(5000, 4).unwrap();
        let last = p.data_len() as u64 - 3;
        p.write(last, b"end").unwrap();
        p.fence();
        p.persist(last, 3).unwrap();
    }
    let p = Pool::open(&path, &OpenOptions::default()).unwrap();
    assert_eq!(p.uuid(), uuid);
    assert_eq!(p.kind(), PoolKind::Fam);
    assert_eq!(p.tag(), "pheap");
    assert_eq!(p.header().version, POOL_VERSION);
    assert_eq!(p.header().pool_size, 1 << 20);
    let mut buf = [0u8; 10];
    p.read(100, &mut buf).unwrap();
    assert_eq!(&buf, b"hello pool");
    let mut b4 = [0u8; 4];
    p.read(5000, &mut b4).unwrap();
    assert_eq!(&b4, b"raw!");
    let mut b3 = [0u8; 3];
    p.read(p.data_len() as u64 - 3, &mut b3).unwrap();
    assert_eq!(&b3, b"end");
    drop(p);
    Pool::remove(&path).unwrap();
    assert!(!path.exists());
}

#[test]
fn round_trip_on_tmpfs_uses_cache_flush() {
    let d = shm_dir();
    round_trip(d.path(), PersistMethod::CacheFlush);
}

#[test]
fn round_trip_on_block_backed_file_uses_msync() {
    let d = disk_dir();
    round_trip(d.path(), PersistMethod::Msync);
}

#[test]
fn missing_directory_is_named() {
    let d = shm_dir();
    let missing = d.path().join("no-such-dir");
    match Pool::create(missing.join("x.pool"), &PoolOptions::new(1 << 20)) {
        Err(MediaError::MissingDirectory { path }) => assert_eq!(path, missing),
        other => panic!("expected MissingDirectory, got {other:?}"),
    }
    match Pool::open(missing.join("x.pool"), &OpenOptions::default()) {
        Err(MediaError::MissingDirectory { path }) => assert_eq!(path, missing),
        other => panic!("expected MissingDirectory, got {other:?}"),
    }
    assert!(matches!(
        Pool::open(d.path().join("absent.pool"), &OpenOptions::default()),
        Err(MediaError::NotFound { .. })
    ));
}

#[test]
fn create_refuses_existing_files_and_bad_sizes() {
    let d = shm_dir();
    let path = d.path().join("p");
    let _p = Pool::create(&path, &PoolOptions::new(1 << 20)).unwrap();
    assert!(matches!(
        Pool::create(&path, &PoolOptions::new(1 << 20)),
        Err(MediaError::AlreadyExists { .. })
    ));
    for size in [0u64, 4096, 4096 * 2 + 1, 10_000] {
        match Pool::create(d.path().join(format!("s{size}")), &PoolOptions::new(size)) {
            Err(MediaError::InvalidSize { size: s, .. }) => assert_eq!(s, size),
            other => panic!("size {size}: expected InvalidSize, got {other:?}"),
        }
        assert!(!d.path().join(format!("s{size}")).exists());
    }
    let long = "x".repeat(33);
    assert!(matches!(
        Pool::create(d.path().join("t"), &PoolOptions::new(1 << 20).tag(long)),
        Err(MediaError::InvalidArgument(_))
    ));
    // Exactly two pages is the minimum and works.
    let p = Pool::create(d.path().join("min"), &PoolOptions::new(8192)).unwrap();
    assert_eq!(p.data_len(), 4096);
}

#[test]
fn no_space_reports_sizes_and_leaves_no_file() {
    let d = shm_dir();
    // SAFETY: zeroed statvfs is a valid out-buffer; the path is a valid C string.
    let mut sv: libc::statvfs = unsafe { std::mem::zeroed() };
    let c = std::ffi::CString::new("/dev/shm").unwrap();
    // SAFETY: valid path and out-pointer.
    assert_eq!(unsafe { libc::statvfs(c.as_ptr(), &mut sv) }, 0);
    let avail = sv.f_bavail as u64 * sv.f_frsize as u64;
    let size = (avail / 4096 + 1024) * 4096;
    let path = d.path().join("huge.pool");
    match Pool::create(&path, &PoolOptions::new(size)) {
        Err(MediaError::NoSpace {
            requested,
            available,
            ..
        }) => {
            assert_eq!(requested, size);
            assert!(available < requested);
        }
        other => panic!("expected NoSpace, got {other:?}"),
    }
    assert!(!path.exists(), "the partial file must be removed");
}

#[test]
fn modes_are_0600_or_0660_regardless_of_umask() {
    let d = shm_dir();
    // SAFETY: umask only changes the creation mask; restored below.
    let old = unsafe { libc::umask(0o077) };
    let a = Pool::create(d.path().join("a"), &PoolOptions::new(1 << 20));
    let b = Pool::create(
        d.path().join("b"),
        &PoolOptions::new(1 << 20).group_shared(true),
    );
    // SAFETY: restoring the previous mask.
    unsafe { libc::umask(old) };
    let (a, b) = (a.unwrap(), b.unwrap());
    let mode = |p: &Pool| std::fs::metadata(p.path()).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&a), 0o600);
    assert_eq!(mode(&b), 0o660);
    assert_eq!(b.header().flags & tiermem_media::pool::FLAG_GROUP_SHARED, 1);
}

fn make_pool(dir: &Path, name: &str) -> std::path::PathBuf {
    let p = dir.join(name);
    Pool::create(&p, &PoolOptions::new(64 << 10)).unwrap();
    p
}

#[test]
fn random_file_is_not_a_pool() {
    let d = shm_dir();
    let path = d.path().join("random");
    let junk: Vec<u8> = (0..8192u32)
        .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
        .collect();
    std::fs::write(&path, &junk).unwrap();
    assert!(matches!(
        Pool::open(&path, &OpenOptions::default()),
        Err(MediaError::NotAPool { .. })
    ));
    // Too small to hold a header.
    std::fs::write(&path, b"tiny").unwrap();
    match Pool::open(&path, &OpenOptions::default()) {
        Err(MediaError::NotAPool { reason, .. }) => assert!(reason.contains("smaller"), "{reason}"),
        other => panic!("expected NotAPool, got {other:?}"),
    }
    // A directory.
    assert!(matches!(
        Pool::open(d.path(), &OpenOptions::default()),
        Err(MediaError::NotAPool { .. })
    ));
    // remove refuses non-pools and leaves them alone.
    assert!(matches!(
        Pool::remove(&path),
        Err(MediaError::NotAPool { .. })
    ));
    assert!(path.exists());
}

#[test]
fn truncated_pool_is_a_size_mismatch() {
    let d = shm_dir();
    let path = make_pool(d.path(), "t");
    let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    f.set_len(32 << 10).unwrap();
    match Pool::open(&path, &OpenOptions::default()) {
        Err(MediaError::SizeMismatch {
            header_size,
            file_size,
            ..
        }) => {
            assert_eq!(header_size, 64 << 10);
            assert_eq!(file_size, 32 << 10);
        }
        other => panic!("expected SizeMismatch, got {other:?}"),
    }
}

#[test]
fn flipped_bit_is_a_corrupt_header() {
    let d = shm_dir();
    for byte in [20u64, 50, 90, 2000] {
        let path = make_pool(d.path(), &format!("c{byte}"));
        let mut f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .unwrap();
        let mut b = [0u8; 1];
        std::os::unix::fs::FileExt::read_exact_at(&f, &mut b, byte).unwrap();
        f.seek(SeekFrom::Start(byte)).unwrap();
        f.write_all(&[b[0] ^ 0x10]).unwrap();
        match Pool::open(&path, &OpenOptions::default()) {
            Err(MediaError::Corrupt {
                offset,
                stored,
                computed,
                ..
            }) => {
                assert_eq!(offset, CHECKSUM_OFFSET);
                assert_ne!(stored, computed);
            }
            other => panic!("byte {byte}: expected Corrupt, got {other:?}"),
        }
    }
}

#[test]
fn version_bump_is_a_version_mismatch() {
    let d = shm_dir();
    let path = make_pool(d.path(), "v");
    // Rewrite the header with version + 1 and a *valid* checksum, so only the version differs.
    let mut h = std::fs::read(&path).unwrap()[..4096].to_vec();
    h[8..12].copy_from_slice(&(POOL_VERSION + 1).to_le_bytes());
    h[112..116].fill(0);
    let c = crc32fast::hash(&h);
    h[112..116].copy_from_slice(&c.to_le_bytes());
    let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    std::os::unix::fs::FileExt::write_all_at(&f, &h, 0).unwrap();
    match Pool::open(&path, &OpenOptions::default()) {
        Err(MediaError::VersionMismatch {
            found, supported, ..
        }) => {
            assert_eq!(found, POOL_VERSION + 1);
            assert_eq!(supported, POOL_VERSION);
        }
        other => panic!("expected VersionMismatch, got {other:?}"),
    }
    // A pool of another version can still be removed (it has the magic).
    Pool::remove(&path).unwrap();
}

#[test]
fn accesses_are_bounds_checked_and_read_only_is_enforced() {
    let d = shm_dir();
    let path = make_pool(d.path(), "b");
    let p = Pool::open(&path, &OpenOptions::default()).unwrap();
    let n = p.data_len() as u64;
    let mut buf = [0u8; 8];
    assert!(matches!(
        p.read(n - 4, &mut buf),
        Err(MediaError::OutOfBounds { .. })
    ));
    assert!(matches!(
        p.write(u64::MAX - 2, &buf),
        Err(MediaError::OutOfBounds { .. })
    ));
    assert!(matches!(
        p.persist(n, 1),
        Err(MediaError::OutOfBounds { .. })
    ));
    assert!(matches!(
        p.flush(0, n as usize + 1),
        Err(MediaError::OutOfBounds { .. })
    ));
    p.read(n - 8, &mut buf).unwrap();
    drop(p);
    let ro = Pool::open(&path, &OpenOptions::default().writable(false)).unwrap();
    assert!(!ro.is_writable());
    assert!(matches!(
        ro.write(0, b"x"),
        Err(MediaError::ReadOnly { .. })
    ));
    ro.read(0, &mut buf).unwrap();
}

#[test]
fn stats_and_delay_are_charged_per_access() {
    let d = shm_dir();
    let path = d.path().join("s");
    let model: DelayModel = "read=1us,write=2us,bw=inf".parse().unwrap();
    let p = Pool::create(&path, &PoolOptions::new(64 << 10).delay(model)).unwrap();
    let before = p.stats().snapshot();
    p.write(0, &[1u8; 300]).unwrap();
    let mut b = [0u8; 100];
    p.read(0, &mut b).unwrap();
    p.persist(0, 300).unwrap();
    p.fence();
    p.charge_read(10);
    let s = p.stats().snapshot().since(&before);
    assert_eq!(
        (s.reads, s.writes, s.bytes_read, s.bytes_written),
        (2, 1, 110, 300)
    );
    assert_eq!((s.persists, s.fences), (1, 2));
    assert_eq!(s.delay_ns_injected, 1_000 + 2_000 + 1_000);
    p.set_delay(DelayModel::NONE);
    p.read(0, &mut b).unwrap();
    assert_eq!(p.stats().snapshot().since(&before).delay_ns_injected, 4_000);
    assert_eq!(b, [1u8; 100]);
}

#[test]
fn suggested_delays_match_presets_but_are_not_applied() {
    assert_eq!(
        PoolKind::Fam.suggested_delay(),
        DelayModel::preset("pcm-fam").unwrap()
    );
    assert_eq!(
        PoolKind::Nvm.suggested_delay(),
        DelayModel::preset("nvmm").unwrap()
    );
    let d = shm_dir();
    let p = Pool::create(
        d.path().join("f"),
        &PoolOptions::new(64 << 10).kind(PoolKind::Fam),
    )
    .unwrap();
    assert!(p.delay().is_none());
}

#[test]
fn pool_is_send_and_sync_and_shared_between_threads() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<Pool>();
    let d = shm_dir();
    let p =
        std::sync::Arc::new(Pool::create(d.path().join("m"), &PoolOptions::new(64 << 10)).unwrap());
    let hs: Vec<_> = (0..2u8)
        .map(|t| {
            let p = p.clone();
            std::thread::spawn(move || {
                for i in 0..100u64 {
                    p.write_persist(t as u64 * 8192 + i * 64, &[t + 1; 64])
                        .unwrap();
                }
            })
        })
        .collect();
    hs.into_iter().for_each(|h| h.join().unwrap());
    let mut b = [0u8; 64];
    p.read(8192 + 99 * 64, &mut b).unwrap();
    assert_eq!(b, [2u8; 64]);
    assert_eq!(p.stats().snapshot().writes, 200);
}

/// `populate_range` maps a range of a sparse tmpfs pool without changing a byte, and is
/// refused out of range.
#[test]
fn populate_range_keeps_contents_and_checks_bounds() {
    let dir = shm_dir();
    let pool = Pool::create(
        dir.path().join("pop"),
        &PoolOptions::new(1 << 20).reserve_all(false),
    )
    .unwrap();
    pool.write_persist(8192, b"kept").unwrap();
    pool.reserve(0, pool.data_len()).unwrap();
    pool.populate_range(100, 300_000).unwrap();
    let mut b = [0u8; 4];
    pool.read(8192, &mut b).unwrap();
    assert_eq!(&b, b"kept");
    pool.read(200_000, &mut b).unwrap();
    assert_eq!(b, [0; 4]);
    pool.populate_range(0, pool.data_len()).unwrap();
    assert!(pool
        .populate_range(pool.data_len() as u64 - 10, 11)
        .is_err());
}
