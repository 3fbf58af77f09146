//! The `wp` method against a reference image copied in the pause: concurrent writers of every
//! pattern, staging slots 0, 1 and 16, several regions of odd lengths, aborts.

use rand::{Rng, SeedableRng};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;
use tiermem_snapshot::{
    begin, begin_paused, Memory, Method, Options, Report, SnapshotError, SnapshotFile, Target, PAGE,
};

/// The tests of this file run one at a time: the memory test samples the whole process's
/// resident memory, which the others' mappings would disturb.
fn serial() -> std::sync::MutexGuard<'static, ()> {
    static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// `wp` options with `slots` staging slots.
fn wp(slots: usize) -> Options {
    Options {
        staging_slots: slots,
        method: Method::Wp,
        target: Target::File,
    }
}

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
fn run_case(
    lens: &[usize],
    opts: Options,
    patterns: &[Pattern],
    seed: u64,
    paused: bool,
) -> Report {
    let slots = opts.staging_slots;
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
    if slots == 0 || opts.method != Method::Wp {
        assert_eq!(rep.staged_units, 0);
        assert_eq!(rep.spilled_pages, 0);
    }
    assert_eq!(
        f.info().spill_bytes > 0,
        rep.spilled_pages > 0,
        "spill area and spilled pages: {rep:?}"
    );
    // Nothing stays protected: every page can be written with the job gone.
    for m in &mems {
        for p in 0..m.len() / PAGE {
            // SAFETY: inside the mapping; no writers left.
            unsafe { m.as_ptr().add(p * PAGE).write_volatile(7) };
        }
    }
    rep
}

#[test]
fn concurrent_writers_of_every_pattern_see_the_pause_s_image_in_the_file() {
    let _s = serial();
    for (slots, seed) in [(16, 1), (1, 2), (0, 3)] {
        let rep = run_case(
            &[8 << 20],
            wp(slots),
            &[
                Pattern::Random,
                Pattern::Sequential,
                Pattern::Holes,
                Pattern::Front,
            ],
            seed,
            false,
        );
        eprintln!("S = {slots}: {rep:?}");
    }
}

#[test]
fn several_regions_of_odd_lengths() {
    let _s = serial();
    // 1 page, 65 pages (a unit and one page), 300 KiB + 1 byte (rounded to pages).
    run_case(
        &[PAGE, 65 * PAGE, 300 * 1024 + 1],
        wp(2),
        &[Pattern::Random, Pattern::Front],
        4,
        false,
    );
}

#[test]
fn begin_paused_pauses_through_the_callback_and_the_file_is_the_pause_s_image() {
    let _s = serial();
    // Writers already at work when the snapshot starts; the file is created before the pause.
    for (slots, seed) in [(16, 21), (0, 22)] {
        run_case(
            &[8 << 20, 65 * PAGE],
            wp(slots),
            &[Pattern::Random, Pattern::Holes, Pattern::Front],
            seed,
            true,
        );
    }
}

#[test]
fn the_fork_methods_write_the_pause_s_image_too() {
    let _s = serial();
    // The forked child dumps its copy-on-write view; `fork-mdc` drops each unit once written.
    for (method, seed, paused) in [
        (Method::Fork, 31, false),
        (Method::ForkMdc, 32, false),
        (Method::Fork, 33, true),
        (Method::ForkMdc, 34, true),
    ] {
        run_case(
            &[8 << 20, PAGE, 65 * PAGE],
            Options {
                method,
                ..Options::default()
            },
            &[Pattern::Random, Pattern::Holes, Pattern::Front],
            seed,
            paused,
        );
    }
}

#[test]
fn an_nvm_pool_target_holds_the_same_snapshot() {
    let _s = serial();
    // wp with writers running (begin_paused) and fork-mdc, into media NVM pool files.
    for (method, seed, paused) in [(Method::Wp, 41, true), (Method::ForkMdc, 42, false)] {
        run_case(
            &[8 << 20, 65 * PAGE],
            Options {
                method,
                target: Target::NvmPool,
                ..Options::default()
            },
            &[Pattern::Random, Pattern::Holes, Pattern::Front],
            seed,
            paused,
        );
    }
    // The file is a media pool whose data area holds the snapshot; a damaged byte in the
    // stored pages is refused, naming the unit.
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("snap");
    let m = Memory::map("m", 4 << 20).unwrap();
    fill(&m, 43);
    let opts = Options {
        target: Target::NvmPool,
        ..Options::default()
    };
    let rep = begin(&[&m], &target, b"pool".to_vec(), opts)
        .unwrap()
        .wait()
        .unwrap();
    let f = SnapshotFile::open(&target).unwrap();
    assert_eq!(f.info().target, Target::NvmPool);
    assert_eq!(f.info().file_len, rep.file_bytes);
    f.verify().unwrap();
    let mut out = vec![0u8; m.len()];
    f.restore_into(0, &mut out).unwrap();
    assert_eq!(out, image(&m));
    let h = tiermem_media::Pool::open(&target, &tiermem_media::OpenOptions::default()).unwrap();
    assert_eq!(h.kind(), tiermem_media::PoolKind::Nvm);
    drop(h);
    let mut bytes = std::fs::read(&target).unwrap();
    bytes[4096 + 2 * PAGE + 100] ^= 1; // pool header, snapshot header, index: then pages
    std::fs::write(&target, &bytes).unwrap();
    let e = SnapshotFile::open(&target).unwrap().verify().unwrap_err();
    assert!(e.to_string().contains("CRC of unit"), "{e}");
}

#[test]
fn a_killed_fork_child_fails_the_job_and_leaves_the_previous_file() {
    let _s = serial();
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("snap");
    let m = Memory::map("m", 64 << 20).unwrap();
    fill(&m, 12);
    let opts = Options {
        method: Method::ForkMdc,
        ..Options::default()
    };
    begin(&[&m], &target, vec![], opts).unwrap().wait().unwrap();
    let before = std::fs::read(&target).unwrap();
    let job = begin(&[&m], &target, vec![9], opts).unwrap();
    let pid = job.child_pid().expect("a fork job has a child");
    // SAFETY: signalling the job's child, not yet reaped (only `wait` reaps it).
    unsafe { libc::kill(pid as i32, libc::SIGKILL) };
    match job.wait() {
        Err(e) => assert!(e.to_string().contains("signal 9"), "{e}"),
        // The child may have finished first.
        Ok(_) => {
            SnapshotFile::open(&target).unwrap().verify().unwrap();
            return;
        }
    }
    assert_eq!(std::fs::read(&target).unwrap(), before);
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    // Handler-thread memory is not given to a child.
    let h = Memory::map_with(
        "h",
        PAGE,
        tiermem_fault::Resolution::HandlerThread { spin_us: 0 },
    )
    .unwrap();
    let e = begin(&[&h], &dir.path().join("h"), vec![], opts)
        .err()
        .unwrap();
    assert!(e.to_string().contains("in-thread"), "{e}");
    assert!(!h.in_snapshot());
}

#[test]
fn a_region_changed_mid_snapshot_aborts_and_leaves_the_previous_file() {
    let _s = serial();
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
    let _s = serial();
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
    let _s = serial();
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
    let o = Options {
        staging_slots: 65,
        ..Options::default()
    };
    assert!(begin(&[&m], &dir.path().join("s"), vec![], o).is_err());
    assert!(Memory::map("z", 0).is_err());
    assert!(Memory::map(&"n".repeat(300), PAGE).is_err());
}

/// Whether this process may mount (root in the initial user namespace, as the suite runs).
fn can_mount() -> bool {
    // SAFETY: geteuid has no arguments.
    (unsafe { libc::geteuid() }) == 0
}

#[test]
fn a_full_file_system_refuses_before_anything_is_protected_and_keeps_the_old_snapshot() {
    let _s = serial();
    if !can_mount() {
        eprintln!("skipped: mounting a small tmpfs needs root");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let mnt = dir.path().join("small");
    std::fs::create_dir(&mnt).unwrap();
    let st = std::process::Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=4m", "tiermem-snap-test"])
        .arg(&mnt)
        .status();
    if !matches!(st, Ok(s) if s.success()) {
        eprintln!("skipped: mount -t tmpfs failed");
        return;
    }
    let result = std::panic::catch_unwind(|| {
        let target = mnt.join("snap");
        // A small snapshot fits.
        let small = Memory::map("small", 1 << 20).unwrap();
        fill(&small, 1);
        begin(&[&small], &target, vec![], Options::default())
            .unwrap()
            .wait()
            .unwrap();
        let before = std::fs::read(&target).unwrap();
        // 16 MiB of data does not: refused at begin, both ways, with nothing protected.
        let big = Memory::map("big", 16 << 20).unwrap();
        fill(&big, 2);
        for paused in [false, true] {
            let r = if paused {
                begin_paused(&[&big], &target, vec![], Options::default(), || ())
            } else {
                begin(&[&big], &target, vec![], Options::default())
            };
            match r {
                Err(SnapshotError::Media(tiermem_media::MediaError::NoSpace { .. })) => {}
                Err(e) => panic!("expected no space, got {e}"),
                Ok(_) => panic!("a 16 MiB snapshot fit in a 4 MiB file system"),
            }
            assert!(!big.in_snapshot());
            for p in 0..big.len() / PAGE {
                // SAFETY: inside the mapping.
                unsafe { big.as_ptr().add(p * PAGE).write_volatile(3) };
            }
        }
        assert_eq!(std::fs::read(&target).unwrap(), before);
        assert_eq!(std::fs::read_dir(&mnt).unwrap().count(), 1);
        SnapshotFile::open(&target).unwrap().verify().unwrap();
    });
    let _ = std::process::Command::new("umount").arg(&mnt).status();
    if let Err(p) = result {
        std::panic::resume_unwind(p);
    }
}

/// The child of the kill -9 test: snapshots of a changing memory into `target`, forever.
fn crash_child(target: &std::path::Path) -> ! {
    let m = Memory::map("m", 16 << 20).unwrap();
    let mut gen = 0u64;
    loop {
        gen += 1;
        // Every page carries the generation: a snapshot is consistent when all pages agree.
        for p in 0..m.len() / PAGE {
            // SAFETY: inside the mapping.
            unsafe { (m.as_ptr().add(p * PAGE) as *mut u64).write_volatile(gen) };
        }
        let job = begin(
            &[&m],
            target,
            gen.to_le_bytes().to_vec(),
            Options::default(),
        )
        .unwrap();
        // Writers after the pause: the next generation's first pages.
        for p in 0..64 {
            // SAFETY: inside the mapping.
            unsafe { (m.as_ptr().add(p * PAGE) as *mut u64).write_volatile(gen + 1) };
        }
        job.wait().unwrap();
    }
}

#[test]
fn kill_9_at_random_points_leaves_a_complete_snapshot() {
    let _s = serial();
    if let Some(t) = std::env::var_os("TIERMEM_SNAPSHOT_CRASH_CHILD") {
        crash_child(std::path::Path::new(&t));
    }
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("snap");
    let exe = std::env::current_exe().unwrap();
    let mut r = rand::rngs::StdRng::seed_from_u64(77);
    let mut checked = 0;
    for round in 0..12 {
        let mut child = std::process::Command::new(&exe)
            .args([
                "--exact",
                "kill_9_at_random_points_leaves_a_complete_snapshot",
                "--nocapture",
            ])
            .env("TIERMEM_SNAPSHOT_CRASH_CHILD", &target)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(std::time::Duration::from_millis(r.gen_range(20..300)));
        child.kill().unwrap();
        child.wait().unwrap();
        if !target.exists() {
            continue; // killed before its first snapshot was renamed
        }
        let f = SnapshotFile::open(&target)
            .unwrap_or_else(|e| panic!("round {round}: the last snapshot does not open: {e}"));
        f.verify().unwrap();
        let gen = u64::from_le_bytes(f.app_state().unwrap().try_into().unwrap());
        let mut buf = vec![0u8; 16 << 20];
        f.restore_into(0, &mut buf).unwrap();
        for p in 0..buf.len() / PAGE {
            let v = u64::from_le_bytes(buf[p * PAGE..p * PAGE + 8].try_into().unwrap());
            assert_eq!(
                v, gen,
                "round {round}: page {p} holds generation {v} in snapshot {gen}"
            );
        }
        checked += 1;
        eprintln!("round {round}: generation {gen} intact");
        // Leftover temporary files of killed snapshots are the only other files.
        for e in std::fs::read_dir(dir.path()).unwrap() {
            let n = e.unwrap().file_name().into_string().unwrap();
            assert!(
                n == "snap" || n.starts_with("snap.tmp-"),
                "unexpected file {n}"
            );
        }
    }
    assert!(
        checked >= 6,
        "only {checked} rounds had a snapshot to check"
    );
}

/// Resident anonymous bytes of this process (`RssAnon` of /proc/self/status).
fn rss_anon() -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap();
    let kb: u64 = s
        .lines()
        .find_map(|l| l.strip_prefix("RssAnon:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap();
    kb * 1024
}

#[test]
fn extra_memory_stays_within_the_bound_while_writers_rewrite_everything() {
    let _s = serial();
    let len = 64 << 20;
    let m = Memory::map("m", len).unwrap();
    for p in 0..len / PAGE {
        // SAFETY: inside the mapping.
        unsafe { m.as_ptr().add(p * PAGE).write_volatile(1) };
    }
    let dir = tempfile::tempdir().unwrap();
    let gate = Gate::new();
    let ws: Vec<_> = (0..2)
        .map(|k| writer(&m, gate.clone(), Pattern::Random, 40 + k))
        .collect();
    std::thread::sleep(std::time::Duration::from_millis(5));
    let opts = Options::default();
    // Sampled every ms from before the snapshot to its end.
    let done = Arc::new(AtomicBool::new(false));
    let sampler = {
        let done = done.clone();
        std::thread::spawn(move || {
            let mut peak = 0;
            while !done.load(SeqCst) {
                peak = peak.max(rss_anon());
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            peak
        })
    };
    std::thread::sleep(std::time::Duration::from_millis(20));
    let before = rss_anon();
    let n = ws.len();
    let g = gate.clone();
    let job = begin_paused(&[&m], &dir.path().join("snap"), vec![], opts, move || {
        g.quiesce(n);
        Resume(g)
    })
    .unwrap();
    let rep = job.wait().unwrap();
    done.store(true, SeqCst);
    let peak = sampler.join().unwrap();
    gate.stop.store(true, SeqCst);
    for w in ws {
        w.join().unwrap();
    }
    let extra = peak.saturating_sub(before);
    eprintln!(
        "extra {} KiB, bound {} KiB, data {} KiB; {rep:?}",
        extra >> 10,
        rep.extra_bytes_bound >> 10,
        len >> 10
    );
    // Slack: the sampler's and the dumper's stacks, the index and small allocations.
    let slack = 2 << 20;
    assert!(
        extra <= rep.extra_bytes_bound + slack,
        "extra memory {extra} bytes over a bound of {} (+{slack} slack); {rep:?}",
        rep.extra_bytes_bound
    );
    // Writers rewrote units before the dumper took them (else the test proves nothing).
    assert!(rep.staged_units + rep.self_written_units > 0, "{rep:?}");
}
