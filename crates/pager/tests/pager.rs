//! The pager's data path: every byte written reads back after random trips through the NVM
//! buffer and the swap file, with threads racing the evictor, program drops, and bad options.

use proptest::prelude::*;
use rand::{Rng, SeedableRng};
use std::path::PathBuf;
use tiermem_pager::*;

const PS: usize = 4096;

fn swap_dir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("tiermem-pager-test")
        .tempdir_in("/var/tmp")
        .expect("a temp dir on /var/tmp (a disk)")
}

fn options(budget_pages: usize, nvm_pages: usize, dir: &tempfile::TempDir) -> PagerOptions {
    let mut o = PagerOptions::new((budget_pages * PS) as u64, (nvm_pages * PS) as u64);
    o.swap_path = Some(dir.path().join("swap"));
    o.swap_size = Some((64 << 20) as u64);
    o.nvm_delay = tiermem_media::DelayModel::NONE;
    o
}

/// A pager without latency control: every page goes through the buffer (when there is one).
fn pager(budget_pages: usize, nvm_pages: usize, dir: &tempfile::TempDir) -> Pager {
    let mut o = options(budget_pages, nvm_pages, dir);
    o.control.enabled = false;
    Pager::new(&o).expect("pager")
}

fn word(p: usize, round: u64) -> u64 {
    (p as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ round.wrapping_mul(0xD6E8_FEB8_6659_FD93)
}

/// Writes the page's word at four places of page `p`.
fn write_page(r: &PagedRegion, p: usize, v: u64) {
    for k in [0usize, 1000, 2048, 4088] {
        // SAFETY: inside the region.
        unsafe { std::ptr::write_volatile(r.as_ptr().add(p * PS + (k & !7)) as *mut u64, v) };
    }
}

fn read_page(r: &PagedRegion, p: usize) -> [u64; 4] {
    let mut out = [0u64; 4];
    for (i, k) in [0usize, 1000, 2048, 4088].into_iter().enumerate() {
        // SAFETY: inside the region.
        out[i] =
            unsafe { std::ptr::read_volatile(r.as_ptr().add(p * PS + (k & !7)) as *const u64) };
    }
    out
}

#[test]
fn every_byte_reads_back_after_trips_through_buffer_and_ssd() {
    let dir = swap_dir();
    let budget = 256;
    let pg = pager(budget, 128, &dir);
    let pages = 4 * budget;
    let r = pg.map(pages * PS).unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let mut model = vec![0u64; pages];
    for round in 1..=3u64 {
        let mut order: Vec<usize> = (0..pages).collect();
        for i in (1..pages).rev() {
            order.swap(i, rng.gen_range(0..=i));
        }
        for &p in &order {
            if model[p] != 0 {
                assert_eq!(
                    read_page(&r, p),
                    [model[p]; 4],
                    "page {p} before round {round}"
                );
            }
            let v = word(p, round);
            write_page(&r, p, v);
            model[p] = v;
        }
    }
    for (p, &want) in model.iter().enumerate() {
        assert_eq!(read_page(&r, p), [want; 4], "page {p} at the end");
    }
    // The whole page, not just the probed words: untouched bytes are still zero.
    for p in (0..pages).step_by(37) {
        let s = unsafe { std::slice::from_raw_parts(r.as_ptr().add(p * PS), PS) };
        let nonzero = s.iter().filter(|&&b| b != 0).count();
        assert!(nonzero <= 32, "page {p}: {nonzero} stray bytes");
    }
    let st = pg.stats();
    assert!(st.pageouts_buffer > 0 && st.pageins_buffer > 0, "{st:?}");
    assert!(
        st.destaged + st.pageouts_ssd > 0 && st.pageins_ssd > 0,
        "{st:?}"
    );
    assert!(
        st.max_resident_pages <= budget + 32,
        "resident peaked at {} pages over a budget of {budget}",
        st.max_resident_pages
    );
    assert_eq!(st.io_errors, 0);
    drop(r);
    pg.settle();
    let st = pg.stats();
    assert_eq!(
        (st.resident_pages, st.buffer_used, st.swap_used),
        (0, 0, 0),
        "{st:?}"
    );
}

#[test]
fn without_a_buffer_pages_go_straight_to_the_swap_file() {
    let dir = swap_dir();
    let pg = pager(64, 0, &dir);
    let pages = 300;
    let r = pg.map(pages * PS).unwrap();
    for p in 0..pages {
        write_page(&r, p, word(p, 1));
    }
    for p in (0..pages).rev() {
        assert_eq!(read_page(&r, p), [word(p, 1); 4], "page {p}");
    }
    let st = pg.stats();
    assert!(st.pageouts_ssd > 0 && st.pageins_ssd > 0, "{st:?}");
    assert_eq!(st.pageouts_buffer + st.pageins_buffer, 0);
}

/// Reads everything twice (clean trips), then rewrites every third page: clean pages go back to
/// their kept swap slot with no write, and a page written meanwhile is never mistaken for clean.
#[allow(clippy::needless_range_loop)] // pages and their model words side by side
fn clean_trips(nvm_pages: usize) {
    let dir = swap_dir();
    let pg = pager(64, nvm_pages, &dir);
    let pages = 400;
    let r = pg.map(pages * PS).unwrap();
    let mut model: Vec<u64> = (0..pages).map(|p| word(p, 1)).collect();
    for p in 0..pages {
        write_page(&r, p, model[p]);
    }
    for pass in 0..2 {
        for p in 0..pages {
            assert_eq!(
                read_page(&r, p),
                [model[p]; 4],
                "page {p}, read pass {pass}"
            );
        }
    }
    pg.settle();
    let st = pg.stats();
    assert!(
        st.pageouts_clean + st.destaged_clean > 0,
        "read-only trips wrote every page again: {st:?}"
    );
    for p in (0..pages).step_by(3) {
        model[p] = word(p, 2);
        write_page(&r, p, model[p]);
    }
    for pass in 0..2 {
        for p in (0..pages).rev() {
            assert_eq!(
                read_page(&r, p),
                [model[p]; 4],
                "page {p}, after rewrites, pass {pass}"
            );
        }
    }
    assert_eq!(pg.stats().io_errors, 0);
    drop(r);
    pg.settle();
    let st = pg.stats();
    assert_eq!(
        (st.resident_pages, st.buffer_used, st.swap_used),
        (0, 0, 0),
        "{st:?}"
    );
}

#[test]
fn clean_pages_go_back_to_their_swap_slot_without_a_write() {
    clean_trips(0);
}

#[test]
fn clean_buffer_pages_destage_without_a_write() {
    clean_trips(64);
}

#[test]
#[allow(clippy::needless_range_loop)] // pages and their model words side by side
fn kept_copies_give_their_slots_up_when_the_swap_file_runs_short() {
    let dir = swap_dir();
    let mut o = options(64, 0, &dir);
    o.control.enabled = false;
    // 256 swap slots for 300 pages, at least 204 of them out of DRAM: with kept copies of the
    // resident ones the file is full, and page-outs of rewritten pages must take those back.
    o.swap_size = Some(256 * PS as u64);
    let pg = Pager::new(&o).unwrap();
    let pages = 300;
    let r = pg.map(pages * PS).unwrap();
    let mut model: Vec<u64> = (0..pages).map(|p| word(p, 1)).collect();
    for p in 0..pages {
        write_page(&r, p, model[p]);
    }
    for pass in 0..2 {
        for p in 0..pages {
            assert_eq!(
                read_page(&r, p),
                [model[p]; 4],
                "page {p}, read pass {pass}"
            );
        }
    }
    for round in 2..=4u64 {
        for p in 0..pages {
            assert_eq!(
                read_page(&r, p),
                [model[p]; 4],
                "page {p} before round {round}"
            );
            model[p] = word(p, round);
            write_page(&r, p, model[p]);
        }
    }
    for p in (0..pages).rev() {
        assert_eq!(read_page(&r, p), [model[p]; 4], "page {p} at the end");
    }
    let st = pg.stats();
    assert_eq!(st.io_errors, 0, "{st:?}");
    assert!(st.kept_reclaimed > 0, "no kept copy was reclaimed: {st:?}");
    drop(r);
    pg.settle();
    let st = pg.stats();
    assert_eq!(
        (st.resident_pages, st.buffer_used, st.swap_used),
        (0, 0, 0),
        "{st:?}"
    );
}

#[test]
fn threads_writing_while_the_evictor_runs_lose_nothing() {
    let dir = swap_dir();
    let budget = 128;
    let pg = pager(budget, 64, &dir);
    let pages = 4 * budget;
    let r = pg.map(pages * PS).unwrap();
    let base = r.as_ptr() as usize;
    let threads: Vec<_> = (0..3)
        .map(|t| {
            std::thread::spawn(move || {
                let mut rng = rand::rngs::StdRng::seed_from_u64(t);
                let mine: Vec<usize> = (0..pages).filter(|p| p % 3 == t as usize).collect();
                let mut last = vec![0u64; pages];
                for i in 0..6000u64 {
                    let p = mine[rng.gen_range(0..mine.len())];
                    let a = (base + p * PS + 8 * (i as usize % 512)) as *mut u64;
                    let at = base + p * PS;
                    // SAFETY: inside the region; each thread owns its pages.
                    let seen = unsafe { std::ptr::read_volatile(at as *const u64) };
                    assert_eq!(seen, last[p], "thread {t} page {p}");
                    let v = word(p, i + 1);
                    unsafe {
                        std::ptr::write_volatile(at as *mut u64, v);
                        std::ptr::write_volatile(a, v);
                    }
                    last[p] = v;
                }
                last
            })
        })
        .collect();
    let lasts: Vec<Vec<u64>> = threads.into_iter().map(|h| h.join().unwrap()).collect();
    for p in 0..pages {
        let want = lasts[p % 3][p];
        let got = unsafe { std::ptr::read_volatile((base + p * PS) as *const u64) };
        assert_eq!(got, want, "page {p}");
    }
    let st = pg.stats();
    assert!(st.pageins_buffer + st.pageins_ssd > 100, "{st:?}");
}

#[test]
fn a_page_the_program_drops_reads_zeros_and_gives_its_slot_back() {
    let dir = swap_dir();
    let pg = pager(64, 64, &dir);
    let pages = 256;
    let r = pg.map(pages * PS).unwrap();
    for p in 0..pages {
        write_page(&r, p, word(p, 1));
    }
    pg.settle();
    // Drop everything: resident pages and evicted ones alike.
    // SAFETY: the region's own range.
    assert_eq!(
        unsafe {
            libc::madvise(
                r.as_ptr() as *mut libc::c_void,
                pages * PS,
                libc::MADV_DONTNEED,
            )
        },
        0
    );
    pg.settle();
    let st = pg.stats();
    let places: Vec<(usize, Place)> = (0..pages)
        .map(|p| (p, r.place(p)))
        .filter(|(_, x)| *x != Place::Zero)
        .collect();
    assert_eq!(
        (st.buffer_used, st.swap_used, st.resident_pages),
        (0, 0, 0),
        "{st:?} {places:?}"
    );
    for p in 0..pages {
        assert_eq!(read_page(&r, p), [0; 4], "page {p}");
    }
}

/// A program that keeps reusing freed memory below its budget (touch, `MADV_DONTNEED`, again)
/// leaves a stale fault-order entry per touch; the evictor, never over its target, must still
/// clear them, or every fault ends up waiting for queue room (sqlite3 hung so under the shim).
#[test]
fn memory_reused_below_the_budget_never_fills_the_fault_order_queue() {
    let dir = swap_dir();
    let pg = pager(128, 0, &dir);
    let pages = 32;
    let r = pg.map(pages * PS).unwrap();
    let base = r.as_ptr() as usize;
    // The queue holds 2 × budget + 4 × batch + 1024 entries: go round it several times.
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for round in 0..200u64 {
            for p in 0..pages {
                // SAFETY: inside the region.
                unsafe { ((base + p * PS) as *mut u64).write_volatile(round + 1) };
            }
            // SAFETY: the region's own range.
            unsafe { libc::madvise(base as *mut libc::c_void, pages * PS, libc::MADV_DONTNEED) };
        }
        let _ = tx.send(());
    });
    if rx.recv_timeout(std::time::Duration::from_secs(60)).is_err() {
        // The faulting thread is stuck for good and dropping the pager would wait for it.
        eprintln!(
            "faults stopped: the fault-order queue filled with stale entries: {:?}",
            pg.stats()
        );
        std::process::exit(101);
    }
    let st = pg.stats();
    assert!(st.fifo_stale > 0, "{st:?}");
    assert!(st.max_resident_pages <= 128 + 32, "{st:?}");
    drop(r);
}

/// The kernel cannot fault an evicted page of an in-thread region in: `write(2)` from it fails
/// with EFAULT. Pinned, the same calls work both ways, and the bytes survive later trips.
#[test]
fn pinned_pages_serve_system_calls_and_unpinned_evicted_ones_do_not() {
    let dir = swap_dir();
    let pg = pager(64, 0, &dir);
    let pages = 256;
    let r = pg.map(pages * PS).unwrap();
    for p in 0..pages {
        write_page(&r, p, word(p, 1));
    }
    // Page 3 is long out of DRAM (fault order: 252 pages came after it).
    assert!(matches!(r.place(3), Place::Ssd(_)), "{:?}", r.place(3));
    let mut fds = [0i32; 2];
    // SAFETY: a pipe for the test.
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
    // SAFETY: page 3 is inside the region.
    let n = unsafe { libc::write(fds[1], r.as_ptr().add(3 * PS) as *const libc::c_void, PS) };
    assert_eq!(n, -1, "the kernel read an evicted page");
    assert_eq!(
        std::io::Error::last_os_error().raw_os_error(),
        Some(libc::EFAULT)
    );
    // Pinned: write pages 3..5 out, then read them back into pages 10..12 (also evicted).
    r.pin(3 * PS, 2 * PS);
    r.pin(10 * PS, 2 * PS);
    // SAFETY: pinned pages inside the region.
    let n = unsafe {
        libc::write(
            fds[1],
            r.as_ptr().add(3 * PS) as *const libc::c_void,
            2 * PS,
        )
    };
    assert_eq!(n, (2 * PS) as isize);
    // SAFETY: as above.
    let n = unsafe { libc::read(fds[0], r.as_ptr().add(10 * PS) as *mut libc::c_void, 2 * PS) };
    assert_eq!(n, (2 * PS) as isize);
    // Churn everything else while the pins hold.
    for p in 20..pages {
        assert_eq!(read_page(&r, p), [word(p, 1); 4], "page {p}");
    }
    assert_eq!(r.place(10), Place::Resident, "a pinned page was evicted");
    r.unpin(3 * PS, 2 * PS);
    r.unpin(10 * PS, 2 * PS);
    for p in 20..pages {
        assert_eq!(read_page(&r, p), [word(p, 1); 4], "page {p}");
    }
    assert!(
        !matches!(r.place(10), Place::Resident),
        "unpinned pages never left"
    );
    assert_eq!(read_page(&r, 10), [word(3, 1); 4]);
    assert_eq!(read_page(&r, 11), [word(4, 1); 4]);
    assert!(pg.stats().pinned_skips > 0, "{:?}", pg.stats());
    // SAFETY: our pipe.
    unsafe {
        libc::close(fds[0]);
        libc::close(fds[1]);
    }
}

#[test]
fn bad_options_are_refused_with_the_reason() {
    let dir = swap_dir();
    let mut o = PagerOptions::new(16 * PS as u64, 0);
    o.swap_path = Some(dir.path().join("s"));
    let e = Pager::new(&o)
        .err()
        .expect("budget below one group")
        .to_string();
    assert!(e.contains("below one latency group"), "{e}");

    o.budget = 1 << 50;
    let e = Pager::new(&o)
        .err()
        .expect("budget above memory")
        .to_string();
    assert!(e.contains("memory available"), "{e}");

    o.budget = 1 << 20;
    o.nvm = 8 * PS as u64;
    let e = Pager::new(&o).err().expect("tiny buffer").to_string();
    assert!(e.contains("buffer"), "{e}");

    o.nvm = 0;
    o.swap_path = Some(PathBuf::from("/dev/shm/tiermem-pager-test.swap"));
    let e = Pager::new(&o).err().expect("swap on tmpfs").to_string();
    assert!(e.contains("tmpfs"), "{e}");
    assert!(!std::path::Path::new("/dev/shm/tiermem-pager-test.swap").exists());

    o.swap_path = Some(dir.path().join("s"));
    o.batch = 0;
    let e = Pager::new(&o).err().expect("batch 0").to_string();
    assert!(e.contains("batch"), "{e}");
}

#[test]
fn the_controller_serves_a_tenant_over_its_bound_from_the_buffer_and_prefetches_it() {
    let dir = swap_dir();
    // A buffer of 1024 pages: prefetch only fills room above twice the destage threshold
    // (here 2 × 128), and best-effort pages may hold half of it.
    let mut o = options(128, 1024, &dir);
    o.control.window = std::time::Duration::from_millis(30);
    let pg = Pager::new(&o).unwrap();
    let pages = 1536;
    let tight = pg.map(pages * PS).unwrap();
    let loose = pg.map(pages * PS).unwrap();
    // Best effort first: with control on, best-effort pages fill the buffer's spare half, then
    // page out to the swap file.
    for p in 0..pages {
        write_page(&tight, p, word(p, 1));
        write_page(&loose, p, word(p, 2));
    }
    pg.settle();
    let st = pg.stats();
    assert!(st.pageouts_ssd > 0, "{st:?}");
    assert!(st.buffer_used <= st.buffer_slots / 2 + 1, "{st:?}");
    assert!(!tight.served_by_buffer());
    // An impossible bound: the monitor sees the tenant over it and moves it to the buffer.
    tight.set_bound(0.99, 1).unwrap();
    let mut rounds = 0;
    while !tight.served_by_buffer() {
        for p in (0..pages).step_by(3) {
            assert_eq!(read_page(&tight, p), [word(p, 1); 4], "page {p}");
        }
        rounds += 1;
        assert!(
            rounds < 500,
            "the tenant never moved to the buffer: {:?}",
            pg.stats()
        );
    }
    assert!(!loose.served_by_buffer());
    for p in 0..pages {
        assert_eq!(read_page(&loose, p), [word(p, 2); 4], "page {p}");
    }
    pg.settle();
    std::thread::sleep(std::time::Duration::from_millis(100));
    pg.settle();
    let st = pg.stats();
    assert!(
        st.pageouts_buffer > 0,
        "NS pages page out to the buffer: {st:?}"
    );
    assert!(st.windows > 0 && st.prefetched > 0, "{st:?}");
    for p in 0..pages {
        assert_eq!(read_page(&tight, p), [word(p, 1); 4], "page {p}");
        assert_eq!(read_page(&loose, p), [word(p, 2); 4], "page {p}");
    }
    assert!(tight.set_bound(1.5, 10).is_err());
    assert!(tight.set_bound(0.99, 0).is_err());
}

/// The child of the kill -9 test: pages out to the buffer and the swap file, says so, waits.
#[test]
fn kill_child() {
    let Some(dir) = std::env::var_os("TIERMEM_PAGER_KILL_CHILD") else {
        return;
    };
    let dir = PathBuf::from(dir);
    let mut o = PagerOptions::new(64 * PS as u64, 512 * PS as u64);
    o.swap_path = Some(dir.join("swap"));
    o.swap_size = Some(16 << 20);
    o.nvm_dir = Some(dir.clone());
    o.control.enabled = false;
    let pg = Pager::new(&o).unwrap();
    let r = pg.map(1024 * PS).unwrap();
    for p in 0..1024 {
        write_page(&r, p, word(p, 1));
    }
    pg.settle();
    let st = pg.stats();
    assert!(st.buffer_used > 0 && st.swap_used > 0, "{st:?}");
    println!("READY");
    use std::io::Write;
    std::io::stdout().flush().unwrap();
    loop {
        // Keep faulting while the parent kills us.
        for p in (0..512).step_by(7) {
            read_page(&r, p);
        }
    }
}

#[test]
fn a_process_killed_with_pages_out_leaves_no_file_behind() {
    use std::io::BufRead;
    for round in 0..20 {
        let dir = swap_dir();
        let mut child = std::process::Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "kill_child", "--nocapture", "--test-threads=1"])
            .env("TIERMEM_PAGER_KILL_CHILD", dir.path())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let out = child.stdout.take().unwrap();
        let ready = std::io::BufReader::new(out)
            .lines()
            .map_while(|l| l.ok())
            .any(|l| l.contains("READY"));
        assert!(ready, "round {round}: the child never paged out");
        child.kill().unwrap();
        let st = child.wait().unwrap();
        assert!(!st.success());
        let left: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .filter_map(|e| e.ok())
            .collect();
        assert!(left.is_empty(), "round {round}: left behind {left:?}");
    }
}

#[derive(Clone, Debug)]
enum Op {
    Write(usize, u8),
    Read(usize),
    Drop(usize, usize),
    Settle,
}

fn op(pages: usize) -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0..pages, 1..=255u8).prop_map(|(p, b)| Op::Write(p, b)),
        4 => (0..pages).prop_map(Op::Read),
        1 => (0..pages, 1..8usize).prop_map(|(p, n)| Op::Drop(p, n)),
        1 => Just(Op::Settle),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 12, ..ProptestConfig::default() })]
    #[test]
    fn random_operations_match_a_model(ops in proptest::collection::vec(op(256), 200..600)) {
        let dir = swap_dir();
        let pg = pager(64, 64, &dir);
        let pages = 256;
        let r = pg.map(pages * PS).unwrap();
        let mut model = vec![0u8; pages];
        for o in &ops {
            match *o {
                Op::Write(p, b) => {
                    unsafe { std::ptr::write_bytes(r.as_ptr().add(p * PS), b, PS) };
                    model[p] = b;
                }
                Op::Read(p) => {
                    let s = unsafe { std::slice::from_raw_parts(r.as_ptr().add(p * PS), PS) };
                    prop_assert!(s.iter().all(|&x| x == model[p]), "page {} want {}", p, model[p]);
                }
                Op::Drop(p, n) => {
                    let n = n.min(pages - p);
                    let rc = unsafe {
                        libc::madvise(r.as_ptr().add(p * PS) as *mut libc::c_void, n * PS, libc::MADV_DONTNEED)
                    };
                    prop_assert_eq!(rc, 0);
                    for m in &mut model[p..p + n] {
                        *m = 0;
                    }
                }
                Op::Settle => pg.settle(),
            }
        }
        for (p, &b) in model.iter().enumerate() {
            let s = unsafe { std::slice::from_raw_parts(r.as_ptr().add(p * PS), PS) };
            prop_assert!(s.iter().all(|&x| x == b), "page {} at the end, want {}", p, b);
        }
    }
}

#[test]
fn adopted_malloc_memory_is_paged() {
    let dir = swap_dir();
    let budget = 64;
    let pg = pager(budget, 128, &dir);
    let pages = 4 * budget;
    // A region of the same pager beside it, written (as examples/c/pager.c does).
    let other = pg.map(pages * PS).unwrap();
    for p in 0..pages {
        write_page(&other, p, word(p, 3));
    }
    // SAFETY: a malloc block, freed below after the region is dropped.
    let m = unsafe { libc::aligned_alloc(PS, pages * PS) } as *mut u8;
    for p in 0..pages {
        // SAFETY: inside the block.
        unsafe { std::ptr::write_volatile(m.add(p * PS) as *mut u64, word(p, 7)) };
    }
    // SAFETY: the block outlives the region.
    let r = unsafe { pg.adopt(m, pages * PS) }.unwrap();
    pg.settle();
    let st = pg.stats();
    assert!(st.pageouts_buffer + st.pageouts_ssd > 0, "{st:?}");
    for p in 0..pages {
        assert_eq!(read_page(&r, p)[0], word(p, 7), "page {p}");
    }
    drop(r);
    for p in 0..pages {
        // SAFETY: inside the block, given back.
        let v = unsafe { std::ptr::read_volatile(m.add(p * PS) as *const u64) };
        assert_eq!(v, word(p, 7), "page {p} given back");
    }
    drop(other);
    // SAFETY: our block, given back whole.
    unsafe { libc::free(m as *mut libc::c_void) };
}

#[test]
fn adopted_memory_is_paged_and_given_back_whole() {
    let dir = swap_dir();
    let budget = 64;
    let pg = pager(budget, 64, &dir);
    let pages = 6 * budget;
    let len = pages * PS;
    // SAFETY: a fresh private anonymous mapping, ours until the munmap below.
    let m = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    } as *mut u8;
    assert_ne!(m as *mut libc::c_void, libc::MAP_FAILED);
    // Written before the pager knows it; the last quarter never touched (it stays zero).
    for p in 0..pages * 3 / 4 {
        // SAFETY: inside the mapping.
        unsafe { std::ptr::write_volatile(m.add(p * PS) as *mut u64, word(p, 1)) };
    }
    // SAFETY: the mapping stays until after the region is dropped; nobody else registers it.
    let r = unsafe { pg.adopt(m, len) }.unwrap();
    pg.settle();
    let st = pg.stats();
    assert!(st.resident_pages <= budget, "{st:?}");
    assert!(st.pageouts_buffer + st.pageouts_ssd > 0, "{st:?}");
    for round in 1..=2u64 {
        for p in 0..pages {
            let have = read_page(&r, p)[0];
            let want = if round == 1 {
                if p < pages * 3 / 4 {
                    word(p, 1)
                } else {
                    0
                }
            } else {
                word(p, 2)
            };
            assert_eq!(have, want, "page {p} round {round}");
            // SAFETY: inside the region.
            unsafe { std::ptr::write_volatile(r.as_ptr().add(p * PS) as *mut u64, word(p, 2)) };
        }
    }
    let st = pg.stats();
    assert!(st.max_resident_pages <= pages, "{st:?}");
    drop(r);
    // Given back: every page there, holding what was written last, the mapping still ours.
    for p in 0..pages {
        // SAFETY: inside the mapping, which the pager left in place.
        let v = unsafe { std::ptr::read_volatile(m.add(p * PS) as *const u64) };
        assert_eq!(v, word(p, 2), "page {p} after the region was dropped");
    }
    pg.settle();
    let st = pg.stats();
    assert_eq!(
        (st.resident_pages, st.buffer_used, st.swap_used),
        (0, 0, 0),
        "{st:?}"
    );
    // Bad ranges: unaligned, not mapped, a file mapping.
    // SAFETY: each call fails before touching the range.
    unsafe {
        assert!(pg.adopt(m.add(1), PS).is_err());
        assert!(pg.adopt(m, 0).is_err());
        libc::munmap(m as *mut libc::c_void, len);
        let e = pg.adopt(m, len).err().unwrap();
        assert!(e.to_string().contains("not mapped"), "{e}");
    }
    let f = tempfile::tempfile().unwrap();
    f.set_len(PS as u64).unwrap();
    // SAFETY: a shared file mapping, unmapped below.
    let fm = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            PS,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            std::os::fd::AsRawFd::as_raw_fd(&f),
            0,
        )
    } as *mut u8;
    // SAFETY: fails before registering anything.
    let e = unsafe { pg.adopt(fm, PS) }.err().unwrap();
    assert!(e.to_string().contains("private anonymous"), "{e}");
    // SAFETY: our mapping.
    unsafe { libc::munmap(fm as *mut libc::c_void, PS) };
}
