//! The `wp` method against a reference image copied in the pause: concurrent writers of every
//! pattern, staging slots 0, 1 and 16, several regions of odd lengths, aborts.

use rand::{Rng, SeedableRng};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;
use tiermem_snapshot::{begin, begin_paused, Memory, Options, SnapshotError, SnapshotFile, PAGE};

/// Pause protocol: writers check `pause` before each write and park while it is set.
struct Gate {
    pause: AtomicBool,
    parked: AtomicUsize,
    stop: AtomicBool,
}

impl Gate {
    fn new() -> Arc<Gate> {
        Arc::new(Gate {
            pause: AtomicBool::new(false),
            parked: AtomicUsize::new(0),
            stop: AtomicBool::new(false),
        })
    }
    fn check(&self) {
        if self.pause.load(SeqCst) {
            self.parked.fetch_add(1, SeqCst);
            while self.pause.load(SeqCst) {
                std::hint::spin_loop();
            }
            self.parked.fetch_sub(1, SeqCst);
        }
    }
    fn quiesce(&self, writers: usize) {
        self.pause.store(true, SeqCst);
        while self.parked.load(SeqCst) != writers {
            std::thread::yield_now();
        }
    }
    fn resume(&self) {
        self.pause.store(false, SeqCst);
    }
}

#[derive(Clone, Copy, Debug)]
enum Pattern {
    Random,
    Sequential,
    /// Pages that were absent at the pause.
    Holes,
    /// Pages of the unit the dumper is about to take (the front of the address order).
    Front,
}

fn fill(m: &Memory, seed: u64) {
    let mut r = rand::rngs::StdRng::seed_from_u64(seed);
    let pages = m.len() / PAGE;
    for p in 0..pages {
        // Two thirds of the pages get content; the rest stay holes.
        if p % 3 != 2 {
            let v: u64 = r.gen();
            // SAFETY: inside the mapping.
            unsafe {
                (m.as_ptr().add(p * PAGE + (p * 8) % PAGE) as *mut u64).write_volatile(v | 1)
            };
        }
    }
}

/// A copy of `m` as it is now (pages never touched read as zero).
fn image(m: &Memory) -> Vec<u8> {
    // SAFETY: reading our own mapping while its writers are parked.
    unsafe { std::slice::from_raw_parts(m.as_ptr(), m.len()) }.to_vec()
}

fn writer(m: &Memory, gate: Arc<Gate>, pat: Pattern, seed: u64) -> std::thread::JoinHandle<u64> {
    let base = m.as_ptr() as usize;
    let pages = m.len() / PAGE;
    std::thread::spawn(move || {
        let mut r = rand::rngs::StdRng::seed_from_u64(seed);
        let mut n = 0u64;
        let mut seq = 0usize;
        while !gate.stop.load(SeqCst) {
            gate.check();
            let p = match pat {
                Pattern::Random => r.gen_range(0..pages),
                Pattern::Sequential => {
                    seq = (seq + 1) % pages;
                    seq
                }
                Pattern::Holes => (r.gen_range(0..pages) / 3) * 3 + 2,
                Pattern::Front => r.gen_range(0..pages.min(128)),
            }
            .min(pages - 1);
            let at = base + p * PAGE + r.gen_range(0..PAGE / 8) * 8;
            // SAFETY: inside the mapping, which outlives the writers (joined before drop).
            unsafe { (at as *mut u64).write_volatile(r.gen::<u64>() | 2) };
            n += 1;
        }
        n
    })
}

/// Resumes the writers when dropped (the guard `begin_paused` holds through the pause).
struct Resume(Arc<Gate>);
impl Drop for Resume {
    fn drop(&mut self) {
        self.0.resume();
    }
}

/// `paused`: the writers run into `begin_paused`, which pauses them through its callback;
/// else they are paused around `begin`.
fn run_case(lens: &[usize], slots: usize, patterns: &[Pattern], seed: u64, paused: bool) {
    let dir = tempfile::tempdir().unwrap();
    let mems: Vec<Memory> = lens
        .iter()
        .enumerate()
        .map(|(i, &l)| Memory::map(&format!("m{i}"), l).unwrap())
        .collect();
    for (i, m) in mems.iter().enumerate() {
        fill(m, seed + i as u64);
    }
    let gate = Gate::new();
    // Paused from the start: the pause's image keeps the holes `fill` left.
    gate.pause.store(true, SeqCst);
    let mut ws = Vec::new();
    for (i, m) in mems.iter().enumerate() {
        for (k, &p) in patterns.iter().enumerate() {
            ws.push(writer(m, gate.clone(), p, seed * 100 + (i * 10 + k) as u64));
        }
    }
    gate.quiesce(ws.len());
    let target = dir.path().join("snap");
    let mr: Vec<&Memory> = mems.iter().collect();
    let opts = Options {
        staging_slots: slots,
    };
    let mut refs: Vec<Vec<u8>> = Vec::new();
    let job = if paused {
        // Running writers; the image is taken inside the pause the callback makes.
        gate.resume();
        std::thread::sleep(std::time::Duration::from_millis(2));
        let n = ws.len();
        let g = gate.clone();
        let refs = &mut refs;
        let mems = &mems;
        begin_paused(&mr, &target, b"state".to_vec(), opts, move || {
            g.quiesce(n);
            *refs = mems.iter().map(image).collect();
            Resume(g)
        })
        .unwrap()
    } else {
        refs = mems.iter().map(image).collect();
        let job = begin(&mr, &target, b"state".to_vec(), opts).unwrap();
        gate.resume();
        job
    };
    let rep = job.wait().unwrap();
    gate.stop.store(true, SeqCst);
    let writes: u64 = ws.into_iter().map(|w| w.join().unwrap()).sum();
    assert!(writes > 0);
    let f = SnapshotFile::open(&target).unwrap();
    f.verify().unwrap();
    assert_eq!(f.app_state().unwrap(), b"state");
    for (i, r) in refs.iter().enumerate() {
        let mut out = vec![0u8; r.len()];
        f.restore_into(i, &mut out).unwrap();
        if out != *r {
            let bad = (0..r.len() / PAGE)
                .find(|p| out[p * PAGE..(p + 1) * PAGE] != r[p * PAGE..(p + 1) * PAGE])
                .unwrap();
            panic!("region {i} differs from the pause's image at page {bad} ({rep:?})");
        }
    }
    assert_eq!(
        rep.dumped_units + rep.staged_units + rep.self_written_units,
        f.layout().units() as u64
            - (0..f.layout().units())
                .filter(|&g| f.layout().bitmap(g) == 0)
                .count() as u64,
        "{rep:?}"
    );
    if slots == 0 {
        assert_eq!(rep.staged_units, 0);
    }
    // Nothing stays protected: every page can be written with the job gone.
    for m in &mems {
        for p in 0..m.len() / PAGE {
            // SAFETY: inside the mapping; no writers left.
            unsafe { m.as_ptr().add(p * PAGE).write_volatile(7) };
        }
    }
}

#[test]
fn concurrent_writers_of_every_pattern_see_the_pause_s_image_in_the_file() {
    for (slots, seed) in [(16, 1), (1, 2), (0, 3)] {
        run_case(
            &[8 << 20],
            slots,
            &[
                Pattern::Random,
                Pattern::Sequential,
                Pattern::Holes,
                Pattern::Front,
            ],
            seed,
            false,
        );
    }
}

#[test]
fn several_regions_of_odd_lengths() {
    // 1 page, 65 pages (a unit and one page), 300 KiB + 1 byte (rounded to pages).
    run_case(
        &[PAGE, 65 * PAGE, 300 * 1024 + 1],
        2,
        &[Pattern::Random, Pattern::Front],
        4,
        false,
    );
}

#[test]
fn begin_paused_pauses_through_the_callback_and_the_file_is_the_pause_s_image() {
    // Writers already at work when the snapshot starts; the file is created before the pause.
    for (slots, seed) in [(16, 21), (0, 22)] {
        run_case(
            &[8 << 20, 65 * PAGE],
            slots,
            &[Pattern::Random, Pattern::Holes, Pattern::Front],
            seed,
            true,
        );
    }
}

#[test]
fn a_region_changed_mid_snapshot_aborts_and_leaves_the_previous_file() {
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("snap");
    let m = Memory::map("m", 64 << 20).unwrap();
    fill(&m, 9);
    // A first, good snapshot.
    begin(&[&m], &target, vec![], Options::default())
        .unwrap()
        .wait()
        .unwrap();
    let before = std::fs::read(&target).unwrap();
    // The second: pages removed while it runs.
    let job = begin(&[&m], &target, vec![1, 2, 3], Options::default()).unwrap();
    // SAFETY: dropping the pages of our own mapping.
    unsafe { libc::madvise(m.as_ptr().cast(), 1 << 20, libc::MADV_DONTNEED) };
    match job.wait() {
        Err(SnapshotError::Aborted(why)) => assert!(why.contains("removed"), "{why}"),
        Err(e) => panic!("unexpected error {e}"),
        // The dump may have finished before the event was read: then it is a good file.
        Ok(_) => {
            eprintln!("the dump finished before the removal was seen");
            SnapshotFile::open(&target).unwrap().verify().unwrap();
            return;
        }
    }
    assert_eq!(std::fs::read(&target).unwrap(), before);
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    for p in 0..m.len() / PAGE {
        // SAFETY: inside the mapping.
        unsafe { m.as_ptr().add(p * PAGE).write_volatile(1) };
    }
}

#[test]
fn an_aborted_or_dropped_job_unprotects_everything_and_removes_its_file() {
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("snap");
    let m = Memory::map("m", 32 << 20).unwrap();
    fill(&m, 5);
    let job = begin(&[&m], &target, vec![], Options::default()).unwrap();
    job.abort();
    let job = begin(&[&m], &target, vec![], Options::default()).unwrap();
    drop(job);
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    for p in 0..m.len() / PAGE {
        // SAFETY: inside the mapping.
        unsafe { m.as_ptr().add(p * PAGE).write_volatile(1) };
    }
}

#[test]
fn bad_arguments_are_refused_before_anything_is_protected() {
    let dir = tempfile::tempdir().unwrap();
    let m = Memory::map("m", 1 << 20).unwrap();
    assert!(begin(&[], &dir.path().join("s"), vec![], Options::default()).is_err());
    assert!(begin(&[&m, &m], &dir.path().join("s"), vec![], Options::default()).is_err());
    assert!(begin(
        &[&m],
        &dir.path().join("none/s"),
        vec![],
        Options::default()
    )
    .is_err());
    let o = Options { staging_slots: 65 };
    assert!(begin(&[&m], &dir.path().join("s"), vec![], o).is_err());
    assert!(Memory::map("z", 0).is_err());
    assert!(Memory::map(&"n".repeat(300), PAGE).is_err());
}
