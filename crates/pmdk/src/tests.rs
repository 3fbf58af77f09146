//! Unit tests: pools in /dev/shm, committed and aborted transactions, reopen, bad input.

use super::*;

/// A pool path in /dev/shm, removed on drop.
struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str) -> Scratch {
        let p = PathBuf::from(format!(
            "/dev/shm/tiermem-pmdk-test-{}-{name}.pool",
            std::process::id()
        ));
        let _ = std::fs::remove_file(&p);
        Scratch(p)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

const LAYOUT: &str = "tiermem-pmdk-test";

#[test]
fn commit_survives_reopen() {
    let s = Scratch::new("commit");
    {
        let mut pool = Pool::create(&s.0, LAYOUT, pool_size_for(1 << 20), 1 << 20).unwrap();
        assert_eq!(pool.root_len(), 1 << 20);
        assert!(pool.as_slice().iter().all(|b| *b == 0), "root is zeroed");
        pool.transaction(&[(0, b"hello"), (4096, b"world"), ((1 << 20) - 3, b"end")])
            .unwrap();
        assert_eq!(tx_stage(), sys::TX_STAGE_NONE);
        assert_eq!(&pool.as_slice()[..5], b"hello");
    }
    let pool = Pool::open(&s.0, LAYOUT).unwrap();
    assert_eq!(pool.root_len(), 1 << 20);
    let mut buf = [0u8; 5];
    pool.read(4096, &mut buf).unwrap();
    assert_eq!(&buf, b"world");
    assert_eq!(&pool.as_slice()[..5], b"hello");
    assert_eq!(&pool.as_slice()[(1 << 20) - 3..], b"end");
}

#[test]
fn abort_leaves_data_unchanged() {
    let s = Scratch::new("abort");
    let mut pool = Pool::create(&s.0, LAYOUT, pool_size_for(64 << 10), 64 << 10).unwrap();
    pool.transaction(&[(100, &[7u8; 300])]).unwrap();
    let before = pool.as_slice().to_vec();
    // 32 writes of 512 bytes: more than the lane's built-in undo log, so the log is extended.
    let data = vec![0xabu8; 512];
    let writes: Vec<(usize, &[u8])> = (0..32).map(|i| (i * 2048, &data[..])).collect();
    pool.transaction_then_abort(&writes).unwrap();
    assert_eq!(tx_stage(), sys::TX_STAGE_NONE);
    assert!(pool.as_slice() == &before[..], "abort restored every range");
    drop(pool);
    let pool = Pool::open(&s.0, LAYOUT).unwrap();
    assert!(
        pool.as_slice() == &before[..],
        "and the file holds the old data"
    );
}

#[test]
fn many_transactions_of_32_writes() {
    let s = Scratch::new("many");
    let len = 256 << 10;
    let mut pool = Pool::create(&s.0, LAYOUT, pool_size_for(len), len).unwrap();
    let mut expect = vec![0u8; len];
    for round in 0..20u8 {
        let src = vec![round.wrapping_mul(31).wrapping_add(1); 512];
        for first in (0..len / 4096).step_by(32) {
            let writes: Vec<(usize, &[u8])> = (first..(first + 32).min(len / 4096))
                .map(|p| {
                    (
                        p * 4096 + round as usize,
                        &src[..(round as usize % 6 + 1) * 64],
                    )
                })
                .collect();
            for (off, d) in &writes {
                expect[*off..*off + d.len()].copy_from_slice(d);
            }
            pool.transaction(&writes).unwrap();
        }
    }
    assert!(pool.as_slice() == &expect[..]);
}

#[test]
fn out_of_bounds_is_refused_and_changes_nothing() {
    let s = Scratch::new("bounds");
    let mut pool = Pool::create(&s.0, LAYOUT, pool_size_for(4096), 4096).unwrap();
    let e = pool.transaction(&[(0, b"ok"), (4095, b"xy")]).unwrap_err();
    assert!(
        matches!(
            e,
            PmdkError::OutOfBounds {
                offset: 4095,
                len: 2,
                root_len: 4096
            }
        ),
        "{e}"
    );
    assert!(pool.as_slice().iter().all(|b| *b == 0), "nothing written");
    assert!(pool.transaction(&[(usize::MAX, b"x")]).is_err());
    let mut buf = [0u8; 2];
    assert!(pool.read(4095, &mut buf).is_err());
}

#[test]
fn errors_name_the_file_and_the_problem() {
    let s = Scratch::new("errors");
    std::fs::write(&s.0, vec![0u8; 16 << 20]).unwrap();
    let e = Pool::open(&s.0, LAYOUT).unwrap_err();
    let msg = e.to_string();
    assert!(
        msg.contains("pmemobj_open") && msg.contains(&*s.0.to_string_lossy()),
        "{msg}"
    );
    // pmemobj_create refuses an existing file when given a size.
    let e = Pool::create(&s.0, LAYOUT, 16 << 20, 4096).unwrap_err();
    assert!(e.to_string().contains("pmemobj_create"), "{e}");
    let _ = std::fs::remove_file(&s.0);
    // Wrong layout name.
    drop(Pool::create(&s.0, LAYOUT, MIN_POOL_SIZE, 4096).unwrap());
    let e = Pool::open(&s.0, "another-layout").unwrap_err();
    assert!(e.to_string().contains("pmemobj_open"), "{e}");
    assert!(Pool::create(Path::new("/dev/shm/x\0y"), LAYOUT, MIN_POOL_SIZE, 1).is_err());
    assert!(Pool::create(&s.0, LAYOUT, MIN_POOL_SIZE, 0).is_err());
}
