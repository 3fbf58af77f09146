//! z-READ: views and remapped buffers read what the file holds, keep it while another process
//! writes or truncates the file (the lease privatises them first), never die of SIGBUS (the
//! guard, tested with privatisation off), and refuse bad input clearly.

use std::io::Write;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::Command;

use tiermem_iocache::zread::{guard_hits, PAGE};
use tiermem_iocache::{Error, Model, ZFile, ZOptions, ZeroCopy};

/// A file of `pages` pages whose every 8-byte word is (its offset | tag << 56).
fn make(dir: &Path, name: &str, pages: usize, tag: u64) -> PathBuf {
    let p = dir.join(name);
    let mut f = std::fs::File::create(&p).unwrap();
    let mut buf = Vec::with_capacity(pages * PAGE);
    for w in 0..pages * PAGE / 8 {
        buf.extend_from_slice(&((w as u64 * 8) | tag << 56).to_le_bytes());
    }
    f.write_all(&buf).unwrap();
    f.sync_all().unwrap();
    p
}

fn expect(off: u64, len: usize, tag: u64) -> Vec<u8> {
    let mut v = Vec::with_capacity(len + 8);
    let w0 = off / 8;
    for w in w0..=(off + len as u64) / 8 {
        v.extend_from_slice(&((w * 8) | tag << 56).to_le_bytes());
    }
    let s = (off - w0 * 8) as usize;
    v[s..s + len].to_vec()
}

/// Page-aligned anonymous memory for buffers.
struct Buf(tiermem_iocache::sys::AnonMap);
impl Buf {
    fn new(len: usize) -> Buf {
        Buf(tiermem_iocache::sys::AnonMap::new(len).unwrap())
    }
    #[allow(clippy::mut_from_ref)]
    fn slice(&self, off: usize, len: usize) -> &mut [u8] {
        assert!(off + len <= self.0.len());
        // SAFETY: inside the mapping, which the test owns; callers use disjoint slices.
        unsafe { std::slice::from_raw_parts_mut(self.0.as_ptr().add(off), len) }
    }
}

fn no_model() -> ZOptions {
    ZOptions {
        model: false,
        ..ZOptions::default()
    }
}

/// Opens `p` under a lease and waits until a read is zero copy. A child that another test
/// spawns at the moment `make` has the file open for writing holds a copy of that fd until it
/// execs, and the lease cannot be taken while any writer has the file open: the file copies
/// until the lease is retaken (tried every 10 ms on a read).
fn open_leased(p: &Path, opts: ZOptions) -> ZFile {
    let z = ZFile::open(p, opts).unwrap();
    for _ in 0..200 {
        if z.zread(0, 1).unwrap().is_zero_copy() {
            return z;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    panic!("no lease on {} within 2 s", p.display());
}

fn run(cmd: &str) {
    let st = Command::new("sh").arg("-c").arg(cmd).status().unwrap();
    assert!(st.success(), "{cmd}");
}

#[test]
fn views_and_buffers_read_the_file_zero_copy_under_a_lease() {
    let dir = tempfile::tempdir_in("/var/tmp").unwrap();
    let p = make(dir.path(), "f", 64, 1);
    let z = open_leased(&p, ZOptions::default());
    assert_eq!(z.zero_copy_reason(), None);
    for &(off, len) in &[
        (0u64, 4096usize),
        (100, 5000),
        (4096 * 7, 16384),
        (4096 * 63, 4096),
    ] {
        let v = z.zread(off, len).unwrap();
        assert!(v.is_zero_copy());
        assert_eq!(&v[..], &expect(off, len, 1)[..]);
        v.check().unwrap();
    }
    // Short at end of file, empty past it.
    let v = z.zread(4096 * 63 + 10, 9000).unwrap();
    assert_eq!(v.len(), 4096 - 10);
    assert!(z.zread(4096 * 64, 10).unwrap().is_empty());

    // zread_into with the model off: aligned pages remapped, head and tail copied.
    let b = Buf::new(64 * PAGE);
    let s = b.slice(PAGE - 100, 3 * PAGE + 300);
    let n = z.zread_into(4096 * 5 - 100, s).unwrap();
    assert_eq!(n, s.len());
    assert_eq!(&s[..], &expect(4096 * 5 - 100, s.len(), 1)[..]);
    let z2 = ZFile::open(&p, no_model()).unwrap();
    let s = b.slice(8 * PAGE - 100, 3 * PAGE + 300);
    z2.zread_into(4096 * 5 - 100, s).unwrap();
    assert_eq!(&s[..], &expect(4096 * 5 - 100, s.len(), 1)[..]);
    assert_eq!(z2.stats().into_remapped_pages, 3);
    // Writing the buffer copies on write: the file is unchanged.
    s[200..300].fill(0xee);
    let again = z.zread(4096 * 5, PAGE).unwrap();
    assert_eq!(&again[..], &expect(4096 * 5, PAGE, 1)[..]);
    // Unaligned to the file offset: copied; past the end: short, zero tail.
    let s = b.slice(16 * PAGE, 2 * PAGE);
    assert_eq!(z2.zread_into(3, s).unwrap(), 2 * PAGE);
    assert_eq!(&s[..], &expect(3, 2 * PAGE, 1)[..]);
    let s = b.slice(20 * PAGE, 4 * PAGE);
    assert_eq!(z2.zread_into(62 * 4096, s).unwrap(), 2 * PAGE);
    assert_eq!(&s[..2 * PAGE], &expect(62 * 4096, 2 * PAGE, 1)[..]);
    assert!(s[2 * PAGE..].iter().all(|&x| x == 0));
}

#[test]
fn released_views_are_zapped_in_bulk() {
    let dir = tempfile::tempdir_in("/var/tmp").unwrap();
    let p = make(dir.path(), "f", 256, 2);
    let z = open_leased(
        &p,
        ZOptions {
            zap_after: 64 * PAGE,
            ..ZOptions::default()
        },
    );
    let held = z.zread(0, PAGE).unwrap();
    for i in 0..256u64 {
        let v = z.zread(i * 4096, PAGE).unwrap();
        assert_eq!(&v[..], &expect(i * 4096, PAGE, 2)[..]);
    }
    let s = z.stats();
    assert!(s.zaps >= 2, "{s:?}");
    // The held view's page was not zapped away from under it, and reads right.
    assert_eq!(&held[..], &expect(0, PAGE, 2)[..]);
    // A page still mapped is served without a populate call.
    let before = z.stats().populate_calls;
    let _v = z.zread(255 * 4096, PAGE).unwrap();
    let _w = z.zread(255 * 4096, PAGE).unwrap();
    assert!(z.stats().populate_calls <= before + 1);
}

#[test]
fn another_process_writing_and_truncating_never_changes_held_views_or_buffers() {
    let dir = tempfile::tempdir_in("/var/tmp").unwrap();
    let pages = 256;
    let p = make(dir.path(), "f", pages, 3);
    let z = open_leased(&p, no_model());
    // 1000 live views and 1000 live remapped buffers over the whole file.
    let mut views = Vec::new();
    for i in 0..1000u64 {
        let off = (i * 7919 % pages as u64) * 4096 + (i % 3) * 100;
        let len = 1 + (i as usize * 131) % (3 * PAGE);
        views.push((off, z.zread(off, len).unwrap()));
    }
    assert!(views.iter().all(|(_, v)| v.is_zero_copy()));
    let b = Buf::new(1000 * 2 * PAGE);
    let mut bufs = Vec::new();
    for i in 0..1000usize {
        let fp = (i * 104729) % (pages - 2);
        let s = b.slice(i * 2 * PAGE, 2 * PAGE);
        z.zread_into(fp as u64 * 4096, s).unwrap();
        bufs.push((fp, s));
    }
    assert!(z.stats().into_remapped_pages >= 2000);
    // Another process overwrites the first half, then truncates to one page.
    let half = pages / 2 * PAGE;
    run(&format!(
        "head -c {half} /dev/zero | tr '\\0' 'x' | dd of={} conv=notrunc status=none && perl -e 'truncate($ARGV[0], 4096) or die \"truncate: $!\"' {}",
        p.display(),
        p.display()
    ));
    for (off, v) in &views {
        assert_eq!(&v[..], &expect(*off, v.len(), 3)[..], "view at {off}");
        // The guard zero-filled none of its pages: privatisation left it nothing to do.
        v.check().unwrap();
    }
    for (fp, s) in &bufs {
        assert_eq!(
            &s[..],
            &expect(*fp as u64 * 4096, 2 * PAGE, 3)[..],
            "buffer of page {fp}"
        );
    }
    let st = z.stats();
    assert!(
        st.lease_breaks >= 1 && st.privatised_pages > 0 && st.privatised_buffers > 0,
        "{st:?}"
    );
    // A read begun after the writer finished sees the file as it is now (one page of 'x').
    drop(views);
    let mut now = z.zread(0, 3 * PAGE).unwrap();
    for _ in 0..100 {
        if now.is_zero_copy() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(12));
        now = z.zread(0, 3 * PAGE).unwrap();
    }
    assert_eq!(now.len(), PAGE);
    assert!(now.iter().all(|&x| x == b'x'));
    assert!(
        now.is_zero_copy(),
        "the lease is retaken once no writer has the file open"
    );
}

#[test]
fn a_thread_writing_its_buffer_during_privatisation_loses_no_write() {
    use std::sync::atomic::{AtomicBool, Ordering};
    let dir = tempfile::tempdir_in("/var/tmp").unwrap();
    let p = make(dir.path(), "f", 64, 8);
    let z = open_leased(&p, no_model());
    let b = Buf::new(16 * PAGE);
    let stop = AtomicBool::new(false);
    let mut breaks = 0;
    std::thread::scope(|s| {
        for round in 0..6u64 {
            // Remap the buffer (retaking the lease first if the last round broke it).
            let buf = b.slice(0, 16 * PAGE);
            for _ in 0..200 {
                z.zread_into(0, buf).unwrap();
                if z.stats().into_remapped_pages > round * 16 {
                    break;
                }
                std::thread::sleep(std::time::Duration::from_millis(12));
            }
            let base = b.0.as_ptr() as usize;
            let stop = &stop;
            let writer = s.spawn(move || {
                let mut v = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    v += 1;
                    for pg in 0..16 {
                        let at = (base + pg * PAGE) as *mut u64;
                        // SAFETY: inside the test's buffer, written by this thread only.
                        unsafe {
                            at.write_volatile(v);
                            assert_eq!(at.read_volatile(), v, "a write was lost");
                        }
                    }
                }
                v
            });
            std::thread::sleep(std::time::Duration::from_millis(5));
            run(&format!(
                "dd if=/dev/zero of={} bs=1 count=1 seek=100000 conv=notrunc status=none",
                p.display()
            ));
            std::thread::sleep(std::time::Duration::from_millis(5));
            stop.store(true, Ordering::Relaxed);
            let last = writer.join().unwrap();
            stop.store(false, Ordering::Relaxed);
            for pg in 0..16 {
                let w = u64::from_le_bytes(b.slice(pg * PAGE, 8)[..8].try_into().unwrap());
                assert_eq!(w, last);
            }
            breaks = z.stats().lease_breaks;
        }
    });
    assert!(breaks >= 6, "every round broke the lease ({breaks})");
}

#[test]
fn a_write_completed_before_zread_is_seen_whole() {
    let dir = tempfile::tempdir_in("/var/tmp").unwrap();
    let p = make(dir.path(), "f", 64, 4);
    let z = open_leased(&p, ZOptions::default());
    for round in 0..5u8 {
        let held = z.zread(0, 64 * PAGE).unwrap();
        let before = held.to_vec();
        run(&format!(
            "head -c {} /dev/zero | tr '\\0' '\\{:03o}' | dd of={} conv=notrunc status=none",
            64 * PAGE,
            b'a' + round,
            p.display()
        ));
        assert_eq!(&held[..], &before[..], "a held view never changes");
        let v = z.zread(0, 64 * PAGE).unwrap();
        assert!(v.iter().all(|&x| x == b'a' + round), "round {round}");
    }
}

#[test]
fn the_guard_keeps_unprivatised_views_alive_through_truncation() {
    let dir = tempfile::tempdir_in("/var/tmp").unwrap();
    let p = make(dir.path(), "f", 64, 5);
    let z = open_leased(
        &p,
        ZOptions {
            privatise: false,
            ..ZOptions::default()
        },
    );
    let low = z.zread(0, PAGE).unwrap();
    let high = z.zread(32 * 4096, 8 * PAGE).unwrap();
    let hits = guard_hits();
    // truncate(2) by path waits for the lease break (coreutils `truncate` opens O_NONBLOCK and
    // would get EAGAIN while the break is in progress).
    run(&format!(
        "perl -e 'truncate($ARGV[0], 4096) or die' {}",
        p.display()
    ));
    // Past the new end: zeros from the guard, and the view says so; the process lives.
    assert!(high.iter().all(|&x| x == 0));
    assert!(matches!(high.check(), Err(Error::Truncated)));
    assert!(guard_hits() >= hits + 8);
    assert_eq!(&low[..], &expect(0, PAGE, 5)[..]);
    low.check().unwrap();
}

#[test]
fn exclusive_writes_keep_views_and_buffers_and_are_seen_after() {
    let dir = tempfile::tempdir_in("/var/tmp").unwrap();
    let p = make(dir.path(), "f", 64, 6);
    let z = ZFile::open(
        &p,
        ZOptions {
            zero_copy: ZeroCopy::Exclusive,
            model: false,
            ..ZOptions::default()
        },
    )
    .unwrap();
    let v = z.zread(4096, 2 * PAGE).unwrap();
    let b = Buf::new(4 * PAGE);
    let s = b.slice(0, 2 * PAGE);
    z.zread_into(4096 * 2, s).unwrap();
    z.write_at(4096, &vec![9u8; 3 * PAGE]).unwrap();
    assert_eq!(&v[..], &expect(4096, 2 * PAGE, 6)[..]);
    assert_eq!(&s[..], &expect(2 * 4096, 2 * PAGE, 6)[..]);
    let w = z.zread(4096, 3 * PAGE).unwrap();
    assert!(w.iter().all(|&x| x == 9));
    // Growing the file: a read past the old end maps the new length.
    z.write_at(64 * 4096, &vec![7u8; PAGE]).unwrap();
    let g = z.zread(64 * 4096, PAGE).unwrap();
    assert!(g.is_zero_copy() && g.iter().all(|&x| x == 7));
    let lease = ZFile::open(&p, ZOptions::default()).unwrap();
    assert!(matches!(
        lease.write_at(0, b"x"),
        Err(Error::InvalidOption(_))
    ));
}

#[test]
fn bad_input_gets_clear_errors() {
    let dir = tempfile::tempdir_in("/var/tmp").unwrap();
    assert!(matches!(
        ZFile::open(dir.path(), ZOptions::default()),
        Err(Error::NotRegular { .. })
    ));
    let (r, _w) = {
        let mut fds = [0; 2];
        // SAFETY: pipe fills two fds.
        assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
        (fds[0], fds[1])
    };
    assert!(matches!(
        ZFile::from_fd(r, ZOptions::default()),
        Err(Error::NotRegular { .. })
    ));
    let p = make(dir.path(), "f", 4, 7);
    let wo = std::fs::OpenOptions::new().write(true).open(&p).unwrap();
    let e = ZFile::from_fd(wo.as_raw_fd(), ZOptions::default())
        .err()
        .unwrap();
    assert!(matches!(e, Error::NotReadable { .. }), "{e}");
    // The file is open for writing: no lease, so every read copies, and says why.
    let z = ZFile::open(&p, ZOptions::default()).unwrap();
    assert!(z.zero_copy_reason().unwrap().contains("open for writing"));
    let v = z.zread(0, 100).unwrap();
    assert!(!v.is_zero_copy());
    assert_eq!(&v[..], &expect(0, 100, 7)[..]);
    drop(wo);
    // The fd API recognises the file behind an fd.
    let f = std::fs::File::open(&p).unwrap();
    let v = tiermem_iocache::zread(f.as_raw_fd(), 8, 16).unwrap();
    assert_eq!(&v[..], &expect(8, 16, 7)[..]);
    tiermem_iocache::zforget(f.as_raw_fd());
}

#[test]
fn the_loss_model_is_measured_and_never_remaps_when_writes_are_certain() {
    let m = Model::calibrate(Path::new("/var/tmp"), 9).unwrap();
    assert_eq!(m.rows.len(), 6);
    for r in &m.rows {
        assert!(
            r.read_ns > 0.0 && r.zread_ns > 0.0 && r.zread_mod_cow_ns > 0.0,
            "{r:?}"
        );
    }
    for &pages in &[1, 4, 32, 64] {
        // P(cow) = 1: a remap saves nothing and costs the copy-on-write faults.
        assert!(!m.remap_pays(pages, 1.0) || m.row(pages).cow_ns() == 0.0);
    }
}
