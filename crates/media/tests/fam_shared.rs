//! A FAM pool opened by several processes at once: what one persists, the other sees, and
//! concurrent atomic updates through both mappings lose nothing. (One test per binary: it forks.)

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};
use tiermem_media::{OpenOptions, Pool, PoolKind, PoolOptions};

const INCREMENTS: u64 = 200_000;
const PATTERN_LEN: usize = 1 << 20;

fn counter(p: &Pool, off: usize) -> &AtomicU64 {
    // SAFETY: off is 8-byte aligned and inside the data area, which stays mapped as long as `p`.
    unsafe { &*(p.data_ptr().add(off) as *const AtomicU64) }
}

#[test]
fn two_processes_share_a_fam_pool() {
    let dir = std::env::temp_dir().join(format!("tiermem-fam-{}", std::process::id()));
    let dir = if std::path::Path::new("/dev/shm").is_dir() {
        std::path::PathBuf::from("/dev/shm").join(dir.file_name().unwrap())
    } else {
        dir
    };
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("shared.fam");
    let pool = Pool::create(
        &path,
        &PoolOptions::new(4 << 20).kind(PoolKind::Fam).tag("shared"),
    )
    .unwrap();
    assert_eq!(pool.kind(), PoolKind::Fam);

    // SAFETY: the child only opens the pool, writes through it and _exits; this test binary has
    // one test, so no other test thread holds a lock the child could need.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork failed");
    if pid == 0 {
        let code = std::panic::catch_unwind(|| {
            let p = Pool::open(&path, &OpenOptions::default()).expect("child opens the pool");
            let pattern: Vec<u8> = (0..PATTERN_LEN).map(|i| (i * 31 % 251) as u8).collect();
            p.write_persist(4096, &pattern).unwrap();
            // Publish: a flag at offset 0, persisted after the data.
            counter(&p, 0).store(1, Ordering::Release);
            p.persist(0, 8).unwrap();
            for _ in 0..INCREMENTS {
                counter(&p, 64).fetch_add(1, Ordering::Relaxed);
            }
            0
        })
        .unwrap_or(1);
        // SAFETY: leave the forked child without running the parent's destructors.
        unsafe { libc::_exit(code) };
    }

    for _ in 0..INCREMENTS {
        counter(&pool, 64).fetch_add(1, Ordering::Relaxed);
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    while counter(&pool, 0).load(Ordering::Acquire) != 1 {
        assert!(
            Instant::now() < deadline,
            "the child's flag never became visible"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    let mut status = 0;
    // SAFETY: waiting for our own child.
    unsafe { libc::waitpid(pid, &mut status, 0) };
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "child failed: {status:#x}"
    );

    let mut got = vec![0u8; PATTERN_LEN];
    pool.read(4096, &mut got).unwrap();
    assert!(
        got.iter()
            .enumerate()
            .all(|(i, b)| *b == (i * 31 % 251) as u8),
        "the child's pattern is not what the parent reads"
    );
    assert_eq!(
        counter(&pool, 64).load(Ordering::SeqCst),
        2 * INCREMENTS,
        "lost atomic updates"
    );
    drop(pool);
    // A third opener after both are done sees the same durable state.
    let again = Pool::open(&path, &OpenOptions::default()).unwrap();
    assert_eq!(counter(&again, 64).load(Ordering::SeqCst), 2 * INCREMENTS);
    drop(again);
    Pool::remove(&path).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}
