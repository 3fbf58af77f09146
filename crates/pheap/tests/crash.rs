//! Crash consistency: a child process (this test binary re-run with `PHEAP_CHILD` set) updates
//! every object and checkpoints in a loop; the parent kills it with SIGKILL at a random moment
//! (or the child aborts at a chosen step of a checkpoint), reopens the heap and checks that the
//! state is exactly one complete checkpoint: every object holds the same counter value, equal to
//! the last checkpoint the child reported complete or the one after it (killed between the
//! commit and the report).

use std::io::{BufRead, BufReader};
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::{Command, Stdio};
use tiermem_pheap::{Heap, HeapOptions};

const OBJECTS: usize = 600;
const SIZE: usize = 4000;

fn name(i: usize) -> String {
    format!("o{i}")
}

fn fill(p: *mut u8, v: u64) {
    for k in 0..SIZE / 8 {
        // SAFETY: p is a live object of SIZE bytes; k*8+8 <= SIZE; alignment 16 >= 8.
        unsafe { (p as *mut u64).add(k).write(v) };
    }
}

fn value_of(p: *const u8) -> u64 {
    // SAFETY: p is a live object of SIZE bytes.
    let s = unsafe { std::slice::from_raw_parts(p as *const u64, SIZE / 8) };
    assert!(
        s.iter().all(|&x| x == s[0]),
        "object torn: not one checkpoint"
    );
    s[0]
}

/// Child body, run only as a child process (see [`spawn`]) with PHEAP_CHILD naming a heap.
#[test]
#[ignore = "helper: run only as a child process"]
fn child_updates_and_checkpoints() {
    let path = std::env::var("PHEAP_CHILD").unwrap_or_else(|_| {
        panic!("helper only: run by the tests of this file with PHEAP_CHILD set")
    });
    let h = Heap::open(&path).unwrap();
    let ptrs: Vec<*mut u8> = (0..OBJECTS).map(|i| h.get(&name(i)).unwrap()).collect();
    let start = value_of(ptrs[0]);
    let mut out = std::io::stdout();
    for k in start + 1.. {
        // Sparse and dense rounds alternate; objects end up equal only at checkpoint time.
        for &p in &ptrs {
            fill(p, k);
        }
        h.ckall().unwrap();
        use std::io::Write;
        writeln!(out, "done {k}").unwrap();
        out.flush().unwrap();
    }
}

fn setup(path: &Path) {
    let h = Heap::create(
        path,
        &HeapOptions {
            capacity: 8 << 20,
            ..HeapOptions::default()
        },
    )
    .unwrap();
    for i in 0..OBJECTS {
        let p = h.malloc(SIZE, Some(&name(i))).unwrap();
        fill(p, 0);
    }
    h.close().unwrap();
}

fn check(path: &Path) -> u64 {
    let h = Heap::open(path).unwrap();
    let v = value_of(h.get(&name(0)).unwrap());
    for i in 0..OBJECTS {
        assert_eq!(value_of(h.get(&name(i)).unwrap()), v, "object {i}");
    }
    v
}

fn spawn(path: &Path, fail_at: Option<&str>) -> std::process::Child {
    let mut c = Command::new(std::env::current_exe().unwrap());
    c.args([
        "--ignored",
        "--exact",
        "child_updates_and_checkpoints",
        "--nocapture",
        "--test-threads=1",
    ])
    .env("PHEAP_CHILD", path)
    .env_remove("TIERMEM_PHEAP_FAIL_AT")
    .stdout(Stdio::piped())
    .stderr(Stdio::null());
    if let Some(f) = fail_at {
        c.env("TIERMEM_PHEAP_FAIL_AT", f);
    }
    c.spawn().unwrap()
}

#[test]
fn kill_9_at_random_moments_recovers_last_complete_checkpoint() {
    if std::env::var("PHEAP_CHILD").is_ok() {
        return;
    }
    let d = tempfile::tempdir_in("/dev/shm").unwrap();
    let path = d.path().join("heap");
    setup(&path);
    let mut prev = check(&path);
    let mut rng = 7u64;
    // Checkpoints the children reported complete, over all rounds.
    let mut reported = 0;
    for round in 0..6 {
        let mut child = spawn(&path, None);
        let stdout = child.stdout.take().unwrap();
        let reader = std::thread::spawn(move || {
            let mut last = None;
            for l in BufReader::new(stdout).lines() {
                let l = l.unwrap();
                if let Some(k) = l.strip_prefix("done ") {
                    last = Some(k.parse::<u64>().unwrap());
                }
            }
            last
        });
        rng = rng
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        std::thread::sleep(std::time::Duration::from_millis(150 + (rng >> 33) % 300));
        child.kill().unwrap(); // SIGKILL
        let status = child.wait().unwrap();
        let last = reader.join().unwrap();
        // Killed by us, still running: not exited by itself (a failed start-up, a panic).
        assert_eq!(
            status.signal(),
            Some(libc::SIGKILL),
            "round {round}: the child must run until killed: {status:?}"
        );
        let v = check(&path);
        eprintln!("round {round}: child reported {last:?}, recovered checkpoint {v}");
        reported += last.map_or(0, |k| k - prev);
        // No report: no checkpoint completed since the child opened the heap.
        let last = last.unwrap_or(prev);
        assert!(
            v == last || v == last + 1,
            "recovered {v}, last complete {last}"
        );
        prev = v;
    }
    // A working child completes a checkpoint every few milliseconds (about a hundred per
    // round here) and each round lets it run at least 150 ms: an average of one per round is a
    // wide margin.
    assert!(
        reported >= 6,
        "the children reported only {reported} complete checkpoints in 6 rounds"
    );
}

#[test]
fn crash_at_each_checkpoint_step() {
    if std::env::var("PHEAP_CHILD").is_ok() {
        return;
    }
    let d = tempfile::tempdir_in("/dev/shm").unwrap();
    // (step, checkpoint that must survive relative to the one being taken)
    for (step, survives_new) in [
        ("before-commit", false),
        ("after-commit", true),
        ("mid-apply", true),
    ] {
        let path = d.path().join(step);
        setup(&path);
        let before = check(&path);
        let out = spawn(&path, Some(step)).wait_with_output().unwrap();
        assert_eq!(
            out.status.signal(),
            Some(libc::SIGABRT),
            "child must abort at {step}: {:?}",
            out.status
        );
        let v = check(&path);
        let want = if survives_new { before + 1 } else { before };
        eprintln!("abort at {step}: recovered {v} (before {before})");
        assert_eq!(v, want, "crash at {step}");
        // The recovered heap checkpoints normally afterwards.
        let h = Heap::open(&path).unwrap();
        fill(h.get(&name(3)).unwrap(), 77);
        h.ckall().unwrap();
        drop(h);
        let h = Heap::open(&path).unwrap();
        assert_eq!(value_of(h.get(&name(3)).unwrap()), 77);
    }
}
