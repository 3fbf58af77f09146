//! The buffer pool against a model (every mode and evict-clean policy), its I/O paths' ordering
//! (a direct write after an evict-dirty), kill -9 after sync, the budget, bad input, threads.

use proptest::prelude::*;
use std::collections::HashMap;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use tiermem_iocache::{Access, AfterHit, ColdRead, Error, EvictClean, Mode, Options, Pool, Probe};

const PS: usize = 4096;

fn scratch() -> tempfile::TempDir {
    // A block file system (target/tmp): direct I/O needs one.
    tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap()
}

fn opts(mode: Mode, frames: u64, budget_pages: u64) -> Options {
    Options {
        page_size: PS,
        budget: budget_pages * PS as u64,
        pool_bytes: frames * PS as u64,
        mode,
        lock: false,
        ..Options::default()
    }
}

fn fill(page: u64, byte: u8) -> Vec<u8> {
    let mut v = vec![byte; PS];
    v[..8].copy_from_slice(&page.to_le_bytes());
    v
}

fn file_page(path: &Path, pgno: u64) -> Vec<u8> {
    let f = std::fs::File::open(path).unwrap();
    let mut b = vec![0u8; PS];
    let n = f.read_at(&mut b, pgno * PS as u64).unwrap_or(0);
    b[n..].fill(0);
    b
}

#[derive(Clone, Debug)]
enum Op {
    Read(u64),
    Write(u64, u8),
    Evict(u64),
    Flush,
    Sync,
    DropCache,
}

fn op(pages: u64) -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0..pages).prop_map(Op::Read),
        4 => (0..pages, 1u8..=255).prop_map(|(p, b)| Op::Write(p, b)),
        1 => (0..pages).prop_map(Op::Evict),
        1 => Just(Op::Flush),
        1 => Just(Op::Sync),
        1 => Just(Op::DropCache),
    ]
}

fn configs() -> Vec<Options> {
    let mut v = vec![
        opts(Mode::Buffered, 4, 8),
        opts(Mode::Direct, 4, 8),
        Options {
            cold_read: ColdRead::Buffered,
            ..opts(Mode::Dbio, 4, 8)
        },
    ];
    for ec in [
        EvictClean::Write,
        EvictClean::Readahead,
        EvictClean::ReadaheadAll,
        EvictClean::ReadaheadReused,
        EvictClean::Drop,
    ] {
        for probe in [Probe::Cachestat, Probe::Nowait] {
            for after_hit in [AfterHit::Leave, AfterHit::Drop, AfterHit::Auto] {
                v.push(Options {
                    evict_clean: ec,
                    probe,
                    after_hit,
                    cold_read: ColdRead::Direct,
                    ..opts(Mode::Dbio, 4, 8)
                });
            }
        }
    }
    v
}

fn run_model(o: &Options, ops: &[Op]) {
    let dir = scratch();
    let path = dir.path().join("data");
    let mut model: HashMap<u64, Vec<u8>> = HashMap::new();
    {
        let pool = Pool::open(&path, o.clone()).unwrap();
        for op in ops {
            match *op {
                Op::Read(p) => {
                    let g = pool.get_page(p, Access::Read).unwrap();
                    let want = model.get(&p).cloned().unwrap_or_else(|| vec![0; PS]);
                    assert_eq!(&g[..], &want[..], "{o:?}: page {p} after {ops:?}");
                }
                Op::Write(p, b) => {
                    let mut g = pool.get_page(p, Access::Write).unwrap();
                    let want = model.get(&p).cloned().unwrap_or_else(|| vec![0; PS]);
                    assert_eq!(&g[..], &want[..], "{o:?}: page {p} before write");
                    let d = fill(p, b);
                    g.as_mut_slice().unwrap().copy_from_slice(&d);
                    model.insert(p, d);
                }
                Op::Evict(p) => {
                    pool.evict(p).unwrap();
                }
                Op::Flush => {
                    pool.flush().unwrap();
                }
                Op::Sync => {
                    pool.sync().unwrap();
                    for (p, d) in &model {
                        assert_eq!(
                            &file_page(&path, *p),
                            d,
                            "{o:?}: page {p} not in the file after sync"
                        );
                    }
                }
                Op::DropCache => {
                    pool.file().sync().unwrap();
                    pool.file().drop_cached(0, 0).unwrap();
                }
            }
        }
        pool.sync().unwrap();
    }
    // Closed: the file holds exactly the model.
    for (p, d) in &model {
        assert_eq!(&file_page(&path, *p), d, "{o:?}: page {p} after close");
    }
    // Reopened in another mode, the pool reads it back.
    let pool = Pool::open(&path, opts(Mode::Direct, 2, 4)).unwrap();
    for (p, d) in &model {
        assert_eq!(&pool.get_page(*p, Access::Read).unwrap()[..], &d[..]);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]
    #[test]
    fn every_mode_and_policy_reads_back_what_was_written(ops in proptest::collection::vec(op(12), 1..120)) {
        for o in configs() {
            run_model(&o, &ops);
        }
    }
}

#[test]
fn a_direct_write_after_an_evict_dirty_reads_back_newest() {
    let dir = scratch();
    let path = dir.path().join("data");
    let pool = Pool::open(&path, opts(Mode::Dbio, 4, 8)).unwrap();
    {
        let mut g = pool.get_page(3, Access::Write).unwrap();
        g.as_mut_slice().unwrap().copy_from_slice(&fill(3, 0xA));
    }
    // Evict-dirty: a buffered write, left cached (and dirty or under write-back).
    assert!(pool.evict(3).unwrap());
    assert!(pool.file().cached_pages(3 * PS as u64, PS as u64).unwrap() >= 1);
    {
        // A cache hit brings A back; B replaces it; flush writes B with O_DIRECT.
        let mut g = pool.get_page(3, Access::Write).unwrap();
        assert_eq!(&g[..], &fill(3, 0xA)[..]);
        g.as_mut_slice().unwrap().copy_from_slice(&fill(3, 0xB));
    }
    assert_eq!(pool.flush().unwrap(), 1);
    assert!(pool.evict(3).unwrap()); // clean now: evict-clean
    assert_eq!(
        &pool.get_page(3, Access::Read).unwrap()[..],
        &fill(3, 0xB)[..]
    );
    pool.sync().unwrap();
    pool.file().drop_cached(0, 0).unwrap();
    assert_eq!(file_page(&path, 3), fill(3, 0xB));
    let s = pool.stats();
    assert!(
        s.cache_hits >= 1 && s.direct_writes == 1 && s.evict_dirty == 1,
        "{s:?}"
    );
}

/// A scratch file of `pages` pages, page `p` holding `fill(p, 1)`, written to the device.
fn filled_file(pages: u64) -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = scratch();
    let path = dir.path().join("data");
    let f = std::fs::File::create(&path).unwrap();
    for p in 0..pages {
        f.write_at(&fill(p, 1), p * PS as u64).unwrap();
    }
    f.sync_all().unwrap();
    (dir, path)
}

/// Reads 64 pages through an 8-frame pool, the even ones twice, and checks
/// that the readaheads were those of the reused (even) victims, in the page cache when asked.
fn readahead_of_reused_victims(ec: EvictClean, budget_pages: u64, check_cached: bool) {
    let pages = 64u64;
    let (_dir, path) = filled_file(pages);
    let pool = Pool::open(
        &path,
        Options {
            cold_read: ColdRead::Direct,
            evict_clean: ec,
            ..opts(Mode::Dbio, 8, budget_pages)
        },
    )
    .unwrap();
    pool.file().drop_cached(0, 0).unwrap();
    // Even pages are hit in the pool once more after their load; odd ones pass through.
    for p in 0..pages {
        for _ in 0..(1 + (p % 2 == 0) as usize) {
            assert_eq!(
                &pool.get_page(p, Access::Read).unwrap()[..],
                &fill(p, 1)[..]
            );
        }
    }
    let first = pool.stats();
    assert_eq!(first.cache_hits, 0, "{first:?}");
    assert_eq!(first.direct_reads, pages);
    // Evict-clean (readahead) asked for the reused victims, not the others (the last 8 pages
    // are still pooled).
    assert_eq!(first.evict_clean_readahead, (pages - 8) / 2, "{first:?}");
    for p in (0..pages - 8).rev().filter(|_| check_cached) {
        let cached = pool.file().cached_pages(p * PS as u64, PS as u64).unwrap();
        assert_eq!(cached, (p % 2 == 0) as u64, "page {p}: {first:?}");
    }
}

#[test]
fn dbio_readahead_reused_caches_the_reused_victims() {
    readahead_of_reused_victims(EvictClean::ReadaheadReused, 128, true);
}

#[test]
fn dbio_readahead_selects_when_the_cache_share_is_below_the_pool() {
    // Budget 12 pages, pool 8: the page cache's share (4) is below the pool.
    readahead_of_reused_victims(EvictClean::Readahead, 12, false);
}

/// Two passes over 64 pages through an 8-frame pool with every clean victim read back: the
/// pages dropped from the page cache after their hit there.
fn dropped_after_hits(after_hit: AfterHit, cold_read: ColdRead) -> u64 {
    let pages = 64u64;
    let (_dir, path) = filled_file(pages);
    let pool = Pool::open(
        &path,
        Options {
            cold_read,
            evict_clean: EvictClean::ReadaheadAll,
            after_hit,
            ..opts(Mode::Dbio, 8, 128)
        },
    )
    .unwrap();
    pool.file().drop_cached(0, 0).unwrap();
    for p in (0..pages).chain(0..pages) {
        assert_eq!(
            &pool.get_page(p, Access::Read).unwrap()[..],
            &fill(p, 1)[..]
        );
    }
    let s = pool.stats();
    assert!(s.cache_hits >= pages - 8 - 1, "{s:?}");
    s.dropped_after_hit
}

#[test]
fn after_hit_auto_drops_under_direct_cold_reads_and_leaves_under_buffered_ones() {
    // O_DIRECT cold reads: the page cache is the victim cache, a hit page leaves it (in
    // batches of DROP_BATCH, so at least the full batches of the ≥ 55 hits).
    let n = dropped_after_hits(AfterHit::Auto, ColdRead::Direct);
    assert!(n >= 32, "{n} pages dropped");
    assert_eq!(n, dropped_after_hits(AfterHit::Drop, ColdRead::Direct));
    // Buffered cold reads: clean evictions count on the cache holding every page.
    assert_eq!(dropped_after_hits(AfterHit::Auto, ColdRead::Buffered), 0);
    assert_eq!(dropped_after_hits(AfterHit::Leave, ColdRead::Direct), 0);
}

#[test]
fn readahead_all_caches_every_clean_victim() {
    let pages = 64u64;
    let (_dir, path) = filled_file(pages);
    let pool = Pool::open(
        &path,
        Options {
            cold_read: ColdRead::Direct,
            evict_clean: EvictClean::ReadaheadAll,
            ..opts(Mode::Dbio, 8, 128)
        },
    )
    .unwrap();
    pool.file().drop_cached(0, 0).unwrap();
    for p in 0..pages {
        assert_eq!(
            &pool.get_page(p, Access::Read).unwrap()[..],
            &fill(p, 1)[..]
        );
    }
    let first = pool.stats();
    assert_eq!(first.cache_hits, 0, "{first:?}");
    assert_eq!(first.direct_reads, pages);
    // The victims are in the page cache: the second pass hits there.
    for p in 0..pages {
        assert_eq!(
            &pool.get_page(p, Access::Read).unwrap()[..],
            &fill(p, 1)[..]
        );
    }
    let second = pool.stats();
    assert!(
        second.cache_hits - first.cache_hits >= pages - 8 - 1,
        "{second:?}"
    );
}

#[test]
fn the_page_cache_share_of_the_budget_is_kept() {
    let dir = scratch();
    let path = dir.path().join("data");
    let pages = 1024u64;
    {
        let f = std::fs::File::create(&path).unwrap();
        f.write_at(&vec![5u8; pages as usize * PS], 0).unwrap();
        f.sync_all().unwrap();
    }
    // Pool 16 pages, budget 64: the page cache may hold 48 of the file's pages.
    let mut o = opts(Mode::Dbio, 16, 64);
    o.enforce_budget = true;
    let pool = Pool::open(&path, o).unwrap();
    pool.file().drop_cached(0, 0).unwrap();
    for round in 0..2 {
        for p in 0..pages {
            let p = (p * 37 + round) % pages;
            let mut g = pool
                .get_page(
                    p,
                    if p % 3 == 0 {
                        Access::Write
                    } else {
                        Access::Read
                    },
                )
                .unwrap();
            if let Some(d) = g.as_mut_slice() {
                d[100] = d[100].wrapping_add(1);
            }
        }
        let cached = pool.file().cached_pages(0, 0).unwrap();
        assert!(
            cached <= 48 + tiermem_iocache::pool::TRIM_EVERY,
            "round {round}: {cached} pages cached, allowance 48 (+{} between checks): {:?}",
            tiermem_iocache::pool::TRIM_EVERY,
            pool.stats()
        );
    }
    assert!(pool.stats().trimmed_pages > 0);
    pool.sync().unwrap();
}

#[test]
fn bad_input_gets_clear_errors() {
    let dir = scratch();
    let path = dir.path().join("data");
    let bad = |o: Options, p: &Path| Pool::open(p, o).unwrap_err().to_string();
    assert!(bad(
        Options {
            page_size: 1000,
            ..opts(Mode::Dbio, 4, 8)
        },
        &path
    )
    .contains("page size"));
    assert!(bad(opts(Mode::Dbio, 1, 8), &path).contains("fewer than two"));
    assert!(bad(opts(Mode::Dbio, 16, 8), &path).contains("larger than the budget"));
    assert!(
        bad(opts(Mode::Dbio, 4, 8), dir.path()).contains("not a regular file")
            || bad(opts(Mode::Dbio, 4, 8), dir.path()).contains("Is a directory")
    );
    let missing = PathBuf::from("/nonexistent-dir-iocache/x");
    assert!(bad(opts(Mode::Direct, 4, 8), &missing).contains("open"));
    // tmpfs has no direct I/O: direct and dbio are refused there, buffered works.
    let shm = tempfile::tempdir_in("/dev/shm").unwrap();
    let e = Pool::open(shm.path().join("d"), opts(Mode::Dbio, 4, 8)).unwrap_err();
    assert!(matches!(e, Error::NoDirectIo { .. }), "{e}");
    assert!(e.to_string().contains("block file system"));
    Pool::open(shm.path().join("d"), opts(Mode::Buffered, 4, 8)).unwrap();
    // Every frame pinned: an error, not a hang.
    let pool = Pool::open(&path, opts(Mode::Dbio, 2, 8)).unwrap();
    let a = pool.get_page(0, Access::Read).unwrap();
    let b = pool.get_page(1, Access::Read).unwrap();
    assert!(matches!(
        pool.get_page(2, Access::Read),
        Err(Error::AllPinned { frames: 2 })
    ));
    assert!(matches!(pool.evict(1), Err(Error::Pinned { pgno: 1 })));
    drop((a, b));
    pool.get_page(2, Access::Read).unwrap();
    assert!(pool.get_page(u64::MAX, Access::Read).is_err());
}

#[test]
fn threads_sharing_a_small_pool_lose_no_write() {
    let dir = scratch();
    let path = dir.path().join("data");
    for mode in [Mode::Buffered, Mode::Direct, Mode::Dbio] {
        let pool = Pool::open(&path, opts(mode, 8, 16)).unwrap();
        std::thread::scope(|s| {
            for t in 0..4u64 {
                let pool = &pool;
                s.spawn(move || {
                    // Thread t owns pages t, t+4, ...; all threads read every page.
                    let mut rng = 0x9E37_79B9u64.wrapping_mul(t + 1);
                    let mut mine: HashMap<u64, u8> = HashMap::new();
                    for _ in 0..3000 {
                        rng ^= rng << 13;
                        rng ^= rng >> 7;
                        rng ^= rng << 17;
                        let p = (rng % 16) * 4 + t;
                        if rng % 3 == 0 {
                            let b = (rng >> 32) as u8 | 1;
                            let mut g = pool.get_page(p, Access::Write).unwrap();
                            g.as_mut_slice().unwrap().copy_from_slice(&fill(p, b));
                            mine.insert(p, b);
                        } else if let Some(&b) = mine.get(&p) {
                            assert_eq!(
                                &pool.get_page(p, Access::Read).unwrap()[..],
                                &fill(p, b)[..]
                            );
                        } else {
                            let other = rng % 64;
                            let g = pool.get_page(other, Access::Read).unwrap();
                            assert!(
                                g[..8] == other.to_le_bytes() || g.iter().all(|&x| x == 0),
                                "page {other} is neither whole nor unwritten"
                            );
                        }
                    }
                    for (p, b) in mine {
                        assert_eq!(
                            &pool.get_page(p, Access::Read).unwrap()[..],
                            &fill(p, b)[..],
                            "{mode:?}"
                        );
                    }
                });
            }
        });
        pool.sync().unwrap();
        drop(pool);
        std::fs::remove_file(&path).unwrap();
    }
}

/// The child of `kill_9_after_sync_loses_nothing`: writes rounds of pages, syncing after each
/// and saying so on stdout, until killed.
#[test]
fn kill_9_child() {
    let Ok(path) = std::env::var("IOCACHE_KILL_CHILD") else {
        return;
    };
    use std::io::Write;
    let pool = Pool::open(&path, opts(Mode::Dbio, 8, 16)).unwrap();
    for round in 1u8.. {
        for p in 0..32u64 {
            let mut g = pool.get_page(p, Access::Write).unwrap();
            g.as_mut_slice().unwrap().copy_from_slice(&fill(p, round));
        }
        pool.sync().unwrap();
        println!("synced {round}");
        std::io::stdout().flush().unwrap();
    }
}

#[test]
fn kill_9_after_sync_loses_nothing() {
    use std::io::{BufRead, BufReader};
    let dir = scratch();
    let path = dir.path().join("data");
    for stop_after in [1u8, 3, 7] {
        let mut child = std::process::Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "kill_9_child", "--nocapture", "--test-threads=1"])
            .env("IOCACHE_KILL_CHILD", &path)
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut last = 0u8;
        for line in BufReader::new(child.stdout.take().unwrap()).lines() {
            let line = line.unwrap();
            if let Some(n) = line.strip_prefix("synced ") {
                last = n.parse().unwrap();
                if last >= stop_after {
                    break;
                }
            }
        }
        // SAFETY: kill(2) on our own child's pid.
        unsafe { libc::kill(child.id() as i32, libc::SIGKILL) };
        child.wait().unwrap();
        assert!(last >= stop_after);
        // Every page holds the last synced round or a later one, and all are whole pages.
        for p in 0..32u64 {
            let got = file_page(&path, p);
            let round = got[100];
            assert!(round >= last, "page {p}: round {round} < synced {last}");
            assert_eq!(got, fill(p, round), "page {p} torn");
        }
        std::fs::remove_file(&path).unwrap();
    }
}

#[test]
fn discard_and_truncate_drop_pages_unwritten_and_cut_the_file() {
    for mode in [Mode::Buffered, Mode::Direct, Mode::Dbio] {
        let dir = scratch();
        let path = dir.path().join("data");
        let pool = Pool::open(&path, opts(mode, 8, 16)).unwrap();
        for p in 0..6u64 {
            let mut g = pool.get_page(p, Access::Write).unwrap();
            g.as_mut_slice().unwrap().copy_from_slice(&fill(p, 0x11));
        }
        pool.sync().unwrap();
        for p in 0..6u64 {
            let mut g = pool.get_page(p, Access::Write).unwrap();
            g.as_mut_slice().unwrap().copy_from_slice(&fill(p, 0x22));
        }
        // Pages 4 and 5: dirty, dropped without write-back; the file keeps the synced bytes.
        {
            let _pin = pool.get_page(5, Access::Read).unwrap();
            assert!(matches!(
                pool.discard_from(4),
                Err(Error::Pinned { pgno: 5 })
            ));
        }
        assert_eq!(pool.discard_from(4).unwrap(), 2, "{mode:?}");
        assert_eq!(pool.resident(), 4);
        assert_eq!(
            &pool.get_page(5, Access::Read).unwrap()[..],
            &fill(5, 0x11)[..]
        );
        // Truncate inside page 3: pages 4.. gone, page 3 zero past the cut, file cut.
        let cut = 3 * PS as u64 + 100;
        pool.truncate(cut).unwrap();
        assert_eq!(std::fs::metadata(&path).unwrap().len(), cut, "{mode:?}");
        assert!(!pool.resident_pages().contains(&5));
        let g = pool.get_page(3, Access::Read).unwrap();
        assert_eq!(&g[..100], &fill(3, 0x22)[..100]);
        assert!(g[100..].iter().all(|&b| b == 0), "{mode:?}");
        drop(g);
        assert!(pool
            .get_page(4, Access::Read)
            .unwrap()
            .iter()
            .all(|&b| b == 0));
        // A page-aligned truncate, then the rest written back: exactly what was kept.
        pool.truncate(2 * PS as u64).unwrap();
        pool.sync().unwrap();
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 2 * PS as u64);
        assert_eq!(file_page(&path, 1), fill(1, 0x22));
        assert_eq!(pool.discard_from(0).unwrap(), 2);
        assert_eq!(pool.resident(), 0);
    }
}
