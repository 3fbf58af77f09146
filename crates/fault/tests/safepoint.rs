//! `safepoint`: other threads stop (spinning, sleeping, blocked in a read, inside a section),
//! resume, and a thread that blocks the signal makes the stop time out with nobody left parked.
//! One test function: the safepoint is process-wide, so the cases must not overlap.

use std::io::Read;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tiermem_fault::safepoint::{self, StopError, StopOptions};

fn wait_until(mut f: impl FnMut() -> bool) {
    let t0 = Instant::now();
    while !f() {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "condition never held"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn stops_resumes_defers_and_times_out() {
    // A generous bound: a loaded CI machine may take long to deliver the signals.
    let opts = StopOptions {
        timeout: Duration::from_secs(5),
        ..StopOptions::default()
    };
    let stop = Arc::new(AtomicBool::new(false));
    let counters: Vec<Arc<AtomicU64>> = (0..3).map(|_| Arc::new(AtomicU64::new(0))).collect();
    let mut handles = Vec::new();
    // Spinners: count as fast as they can.
    for c in &counters {
        let (c, stop) = (c.clone(), stop.clone());
        handles.push(std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                c.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    // A sleeper and a thread blocked in read(2) on a pipe.
    {
        let stop = stop.clone();
        handles.push(std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(3));
            }
        }));
    }
    let (mut rd, wr) = std::os::unix::net::UnixStream::pair().unwrap();
    let reader = std::thread::spawn(move || {
        let mut b = [0u8; 1];
        rd.read_exact(&mut b).map(|_| b[0])
    });
    wait_until(|| counters.iter().all(|c| c.load(Ordering::Relaxed) > 0));

    // 1. Everyone parks; nothing counts while held; all run again after.
    for _ in 0..20 {
        let s = safepoint::stop_others(&opts).expect("stop");
        assert!(s.threads >= 5, "{} threads parked", s.threads);
        let before: Vec<u64> = counters.iter().map(|c| c.load(Ordering::Relaxed)).collect();
        std::thread::sleep(Duration::from_millis(5));
        let after: Vec<u64> = counters.iter().map(|c| c.load(Ordering::Relaxed)).collect();
        assert_eq!(before, after, "a parked thread ran");
        assert_eq!(
            safepoint::stop_others(&opts).unwrap_err(),
            StopError::Busy,
            "a second stop while one is held"
        );
        drop(s);
        wait_until(|| {
            counters
                .iter()
                .zip(&after)
                .all(|(c, &a)| c.load(Ordering::Relaxed) > a)
        });
    }

    // 2. A thread inside a section is parked when it leaves it, not before.
    let in_section = Arc::new(AtomicBool::new(false));
    let left = Arc::new(AtomicBool::new(false));
    let sec = {
        let (in_section, left) = (in_section.clone(), left.clone());
        std::thread::spawn(move || {
            let g = safepoint::section();
            in_section.store(true, Ordering::Release);
            std::thread::sleep(Duration::from_millis(60));
            left.store(true, Ordering::Release);
            drop(g);
            // Parked here; runs again after the stop.
            std::thread::sleep(Duration::from_millis(1));
        })
    };
    wait_until(|| in_section.load(Ordering::Acquire));
    let s = safepoint::stop_others(&opts).expect("stop with a thread in a section");
    assert!(
        left.load(Ordering::Acquire),
        "the stop returned while a thread was still inside its section"
    );
    drop(s);
    sec.join().unwrap();

    // 3. A thread that blocks the signal: the stop times out and parks nobody.
    let blocked_ready = Arc::new(AtomicBool::new(false));
    let blocker = {
        let (ready, stop) = (blocked_ready.clone(), stop.clone());
        let sig = opts.signal;
        std::thread::spawn(move || {
            // SAFETY: blocking one signal in this thread's mask.
            unsafe {
                let mut set: libc::sigset_t = std::mem::zeroed();
                libc::sigemptyset(&mut set);
                libc::sigaddset(&mut set, sig);
                libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
            }
            ready.store(true, Ordering::Release);
            while !stop.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(2));
            }
        })
    };
    wait_until(|| blocked_ready.load(Ordering::Acquire));
    let short = StopOptions {
        timeout: Duration::from_millis(50),
        ..opts
    };
    let t0 = Instant::now();
    match safepoint::stop_others(&short) {
        Err(StopError::Timeout { parked, expected }) => assert!(parked < expected),
        other => panic!("expected a timeout, got {other:?}"),
    }
    assert!(t0.elapsed() < Duration::from_secs(2));
    let snap: Vec<u64> = counters.iter().map(|c| c.load(Ordering::Relaxed)).collect();
    wait_until(|| {
        counters
            .iter()
            .zip(&snap)
            .all(|(c, &a)| c.load(Ordering::Relaxed) > a)
    });

    stop.store(true, Ordering::Relaxed);
    for h in handles {
        h.join().unwrap();
    }
    blocker.join().unwrap();
    // The blocked reader was interrupted many times and still reads its byte.
    use std::io::Write;
    (&wr).write_all(&[7]).unwrap();
    assert_eq!(reader.join().unwrap().unwrap(), 7);
}

static EXITING_SEEN: AtomicBool = AtomicBool::new(false);

/// Records, when its thread's thread-local destructors run, whether the thread counts as
/// inside a section then.
struct Probe;

impl Drop for Probe {
    fn drop(&mut self) {
        EXITING_SEEN.store(safepoint::in_section(), Ordering::SeqCst);
    }
}

thread_local! {
    static PROBE: Probe = const { Probe };
}

/// A thread whose thread-local destructors have begun is in a section for good, so a stop never
/// parks it where glibc then frees the thread's malloc caches holding an arena lock (the stop's
/// own `free` would wait for that lock forever). `Probe` is registered before the thread's
/// first section, so its destructor runs after the safepoint's own (they run in reverse).
/// Fails without the exit guard: `in_section()` is false there.
#[test]
fn an_exiting_thread_is_never_parked() {
    std::thread::spawn(|| {
        PROBE.with(|_| ());
        drop(safepoint::section());
        assert!(!safepoint::in_section());
    })
    .join()
    .unwrap();
    assert!(EXITING_SEEN.load(Ordering::SeqCst));
}
