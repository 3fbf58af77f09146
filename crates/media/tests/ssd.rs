//! SSD devices: direct I/O round trips, alignment errors, batched io_uring.

use std::path::Path;
use tiermem_media::ssd::{io_uring_allowed, statx_dio_align};
use tiermem_media::{AlignedBuf, DelayModel, IoOp, MediaError, SsdDevice};

fn dir_in(base: &str) -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("tiermem-ssd")
        .tempdir_in(base)
        .unwrap()
}

fn pattern(len: usize, seed: u8) -> AlignedBuf {
    let mut b = AlignedBuf::new(len, 4096).unwrap();
    for (i, x) in b.iter_mut().enumerate() {
        *x = (i as u8).wrapping_mul(13) ^ seed;
    }
    b
}

fn round_trip(dev: &SsdDevice) {
    let a = dev.alignment().offset.max(512) as usize;
    let w = pattern(8 * a, 0x5A);
    dev.write_at(2 * a as u64, &w).unwrap();
    dev.sync().unwrap();
    let mut r = AlignedBuf::for_device(dev, 8 * a).unwrap();
    dev.read_at(2 * a as u64, &mut r).unwrap();
    assert_eq!(&r[..], &w[..]);
}

#[test]
fn direct_io_round_trip_on_ext4() {
    let d = dir_in("/var/tmp");
    let path = d.path().join("ssd");
    let dev = SsdDevice::create(&path, 1 << 20).unwrap();
    let dio = statx_dio_align(&path).unwrap();
    eprintln!(
        "/var/tmp: statx dio align {dio:?}, direct {}, io_uring {}",
        dev.direct(),
        dev.uses_io_uring()
    );
    assert!(
        dev.direct(),
        "ext4 supports O_DIRECT; the device must use it (statx reported {dio:?})"
    );
    let a = dev.alignment();
    assert!(
        a.mem.is_power_of_two() && a.offset.is_power_of_two() && a.offset >= 512,
        "{a:?}"
    );
    if let Some(s) = dio {
        assert_eq!(s, a, "the device must use the alignment statx reports");
    }
    assert_eq!(dev.len(), 1 << 20);
    round_trip(&dev);
    let start = 2 * a.offset.max(512) as u64;
    // Data written directly is visible to a buffered reopen.
    drop(dev);
    let b = SsdDevice::open_buffered(&path).unwrap();
    assert!(!b.direct());
    let mut x = [0u8; 3];
    b.read_at(start + 1, &mut x).unwrap();
    let w = pattern(16, 0x5A);
    assert_eq!(&x, &w[1..4]);
}

#[test]
fn tmpfs_device_works_direct_or_buffered() {
    let d = dir_in("/dev/shm");
    let path = d.path().join("ssd");
    let dev = SsdDevice::create(&path, 1 << 20).unwrap();
    eprintln!(
        "/dev/shm (tmpfs): statx dio align {:?}, direct {}, alignment {:?}",
        statx_dio_align(&path).unwrap(),
        dev.direct(),
        dev.alignment()
    );
    round_trip(&dev);
}

#[test]
fn unaligned_direct_io_is_a_clear_error() {
    let d = dir_in("/var/tmp");
    let dev = SsdDevice::create(d.path().join("ssd"), 1 << 20).unwrap();
    assert!(dev.direct(), "this test needs O_DIRECT on /var/tmp (ext4)");
    let a = dev.alignment();
    let mut buf = AlignedBuf::new(3 * 4096, 4096).unwrap();
    match dev.read_at(0, &mut buf[1..1 + a.offset as usize]) {
        Err(MediaError::Unaligned { what, align, .. }) if a.mem > 1 => {
            assert_eq!(what, "buffer address");
            assert_eq!(align, a.mem as u64);
        }
        Ok(()) if a.mem == 1 => {}
        other => panic!("expected Unaligned buffer address, got {other:?}"),
    }
    match dev.write_at(a.offset as u64 / 2, &buf[..a.offset as usize]) {
        Err(MediaError::Unaligned {
            what: "offset",
            value,
            ..
        }) => assert_eq!(value, a.offset as u64 / 2),
        other => panic!("expected Unaligned offset, got {other:?}"),
    }
    match dev.write_at(0, &buf[..100]) {
        Err(e @ MediaError::Unaligned { what: "length", .. }) => {
            assert!(e.to_string().contains("AlignedBuf"), "{e}");
        }
        other => panic!("expected Unaligned length, got {other:?}"),
    }
    // Unaligned batch entries fail the whole batch before anything is submitted.
    let (x, y) = buf.split_at_mut(4096);
    let mut ops = [IoOp::read(0, &mut x[..4096]), IoOp::read(3, &mut y[..4096])];
    assert!(matches!(
        dev.submit_batch(&mut ops),
        Err(MediaError::Unaligned { what: "offset", .. })
    ));
    // Out of bounds.
    assert!(matches!(
        dev.read_at(1 << 20, &mut buf[..4096]),
        Err(MediaError::OutOfBounds { .. })
    ));
}

fn batch_round_trip(dev: &SsdDevice, n: usize) {
    let blk = 4096usize;
    let writes: Vec<AlignedBuf> = (0..n).map(|i| pattern(blk, i as u8)).collect();
    let mut ops: Vec<IoOp> = writes
        .iter()
        .enumerate()
        .map(|(i, b)| IoOp::write((i * blk) as u64, b))
        .collect();
    let res = dev.submit_batch(&mut ops).unwrap();
    assert_eq!(res.len(), n);
    assert!(
        res.iter().all(|r| matches!(r, Ok(x) if *x == blk)),
        "{res:?}"
    );
    let mut reads: Vec<AlignedBuf> = (0..n)
        .map(|_| AlignedBuf::new(blk, 4096).unwrap())
        .collect();
    // Read back in reverse order to make sure results map to the right operations.
    let mut ops: Vec<IoOp> = reads
        .iter_mut()
        .enumerate()
        .rev()
        .map(|(i, b)| IoOp::read((i * blk) as u64, b))
        .collect();
    let res = dev.submit_batch(&mut ops).unwrap();
    assert!(
        res.iter().all(|r| matches!(r, Ok(x) if *x == blk)),
        "{res:?}"
    );
    drop(ops);
    for (i, r) in reads.iter().enumerate() {
        assert_eq!(&r[..], &writes[i][..], "block {i}");
    }
    let s = dev.stats().snapshot();
    assert_eq!((s.writes, s.reads), (n as u64, n as u64));
    assert_eq!(s.bytes_written, (n * blk) as u64);
}

#[test]
fn batched_io_uring_round_trip() {
    let d = dir_in("/var/tmp");
    let dev = SsdDevice::create(d.path().join("ssd"), 1 << 20).unwrap();
    if io_uring_allowed() {
        assert!(
            dev.uses_io_uring(),
            "io_uring is enabled in /proc/sys/kernel/io_uring_disabled but setup failed"
        );
    }
    // 150 operations: more than one ring's worth (64), so chunking is exercised.
    batch_round_trip(&dev, 150);
}

#[test]
fn create_refuses_existing_and_missing_directory() {
    let d = dir_in("/var/tmp");
    let path = d.path().join("ssd");
    let _dev = SsdDevice::create(&path, 4096).unwrap();
    assert!(matches!(
        SsdDevice::create(&path, 4096),
        Err(MediaError::AlreadyExists { .. })
    ));
    assert!(matches!(
        SsdDevice::create(d.path().join("nope/ssd"), 4096),
        Err(MediaError::MissingDirectory { .. })
    ));
    assert!(matches!(
        SsdDevice::open(Path::new("/var/tmp/definitely-not-here-tiermem")),
        Err(MediaError::NotFound { .. })
    ));
}

#[test]
fn delay_is_charged_on_ssd_accesses() {
    let d = dir_in("/dev/shm");
    let dev = SsdDevice::create(d.path().join("ssd"), 1 << 20).unwrap();
    dev.set_delay("read=3us,write=5us".parse::<DelayModel>().unwrap());
    let mut b = AlignedBuf::new(4096, 4096).unwrap();
    dev.read_at(0, &mut b).unwrap();
    dev.write_at(0, &b).unwrap();
    assert_eq!(dev.stats().snapshot().delay_ns_injected, 8_000);
}

#[test]
fn devices_are_send_and_sync() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<SsdDevice>();
    assert_send_sync::<AlignedBuf>();
}

#[test]
fn aligned_buf_is_aligned_and_zeroed() {
    for align in [1usize, 64, 512, 4096] {
        let b = AlignedBuf::new(10_000, align).unwrap();
        assert_eq!(b.as_ptr() as usize % align, 0);
        assert!(b.iter().all(|&x| x == 0));
        assert_eq!(b.len(), 10_000);
    }
    assert!(AlignedBuf::new(0, 4096).unwrap().is_empty());
    assert!(matches!(
        AlignedBuf::new(10, 3),
        Err(MediaError::InvalidArgument(_))
    ));
}
