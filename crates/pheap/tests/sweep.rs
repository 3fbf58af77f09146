//! Corruption sweep (issue #13): random bit flips and truncations of a heap's checkpoint file
//! must end in a clear error or in exactly the data a clean recovery gives — never a panic,
//! never different data.
//!
//! Two base heaps (1 MiB, 2 views; small, large, named and anonymous objects, updates and
//! frees over three checkpoints): a **clean** one (closed), and a **crashed** one (a child
//! process aborts right after a checkpoint's commit, so the file holds a committed redo log
//! that the next open replays). For each of a seeded set of cases (40 by default, half per
//! base; `TIERMEM_PHEAP_SWEEP_CASES` for more, `TIERMEM_PHEAP_SWEEP_SEED` for another seed) a
//! copy is damaged — 1 to 3 bit flips aimed at the pool header, a heap header copy, the
//! metadata journal, the redo log, an object's image bytes or anywhere, or a truncation — and
//! then both `Heap::open` and `inspect` (the engine of `tiermem pheap verify`) run on it under
//! `catch_unwind`. They must agree (open fails ⇔ inspect reports a problem), and an open that
//! succeeds must show the reference table and bytes — or, for the crashed heap only, those of
//! the last checkpoint completed before the crash (see `Base::previous`).

use rand::{Rng, SeedableRng};
use std::collections::BTreeMap;
use std::os::unix::fs::FileExt;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::process::Command;
use tiermem_pheap::format::Header;
use tiermem_pheap::inspect::inspect;
use tiermem_pheap::{Heap, HeapOptions};

/// The media pool header in front of the heap's data area.
const DATA: u64 = 4096;

/// What a recovery shows: offset → (size, name, bytes).
type Snapshot = BTreeMap<usize, (usize, Option<String>, Vec<u8>)>;

fn build(path: &Path, crash: bool) {
    let h = Heap::create(
        path,
        &HeapOptions {
            capacity: 1 << 20,
            views: 2,
            ..HeapOptions::default()
        },
    )
    .unwrap();
    let sizes = [
        16usize, 40, 64, 100, 300, 1000, 1360, 2048, 4096, 5000, 9000,
    ];
    let mut ptrs = Vec::new();
    for i in 0..120 {
        let size = sizes[i % sizes.len()];
        let name = (i % 7 == 0).then(|| format!("n{i}"));
        let p = h.malloc(size, name.as_deref()).unwrap();
        // SAFETY: p has `size` writable bytes.
        unsafe { std::ptr::write_bytes(p, (i * 7 + 1) as u8, size) };
        ptrs.push((p, size));
    }
    h.ckall().unwrap();
    for (i, &(p, size)) in ptrs.iter().enumerate().step_by(5) {
        // SAFETY: live object of `size` bytes.
        unsafe { std::ptr::write_bytes(p, (i * 3 + 2) as u8, size.min(200)) };
    }
    for &(p, _) in ptrs.iter().skip(3).step_by(11) {
        h.free(p).unwrap();
    }
    h.ckall().unwrap();
    for (i, &(p, size)) in ptrs.iter().enumerate().skip(1).step_by(4) {
        if h.size_of(p).is_some() {
            // SAFETY: live object of `size` bytes.
            unsafe { std::ptr::write_bytes(p.add(size / 2), (i + 9) as u8, size - size / 2) };
        }
    }
    if crash {
        std::env::set_var("TIERMEM_PHEAP_FAIL_AT", "after-commit");
    }
    h.ckall().unwrap();
    assert!(!crash, "the fail point aborts");
}

/// Child: builds the crashed base (aborts after the last commit).
#[test]
#[ignore = "helper: run only as a child process"]
fn sweep_child_builds_crashed_heap() {
    let p = std::env::var("PHEAP_SWEEP_CHILD")
        .expect("helper only: run by the sweep with PHEAP_SWEEP_CHILD set");
    build(Path::new(&p), true);
}

/// The reference table (from `inspect`) and the bytes a successful open shows for it.
fn snapshot(path: &Path, table: &BTreeMap<usize, tiermem_pheap::alloc::Obj>) -> Snapshot {
    let h = Heap::open(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    snapshot_of(&h, table).unwrap()
}

/// Reads `table`'s objects from an open heap; `Err` says how the heap's table differs.
fn snapshot_of(
    h: &Heap,
    table: &BTreeMap<usize, tiermem_pheap::alloc::Obj>,
) -> Result<Snapshot, String> {
    if h.len() != table.len() {
        return Err(format!("{} objects, expected {}", h.len(), table.len()));
    }
    let lib = h.view_bases()[0];
    let mut s = Snapshot::new();
    for (&off, o) in table {
        let p = (lib + off) as *const u8;
        if h.size_of(p) != Some(o.size) {
            return Err(format!("object {off:#x}: size {:?}", h.size_of(p)));
        }
        if let Some(n) = &o.name {
            let at = h.get(n).map(|u| u as usize);
            if at.map(|u| h.view_bases().iter().any(|&b| u == b + off)) != Some(true) {
                return Err(format!("name {n:?} at {at:x?}, expected offset {off:#x}"));
            }
        }
        // SAFETY: a live object of o.size bytes (size_of checked it) in the library view.
        let bytes = unsafe { std::slice::from_raw_parts(p, o.size) }.to_vec();
        s.insert(off, (o.size, o.name.clone(), bytes));
    }
    Ok(s)
}

fn flip_bits(path: &Path, at: u64, rng: &mut impl Rng) {
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .unwrap();
    let mut b = [0u8; 1];
    f.read_exact_at(&mut b, at).unwrap();
    b[0] ^= 1 << rng.gen_range(0..8);
    f.write_all_at(&b, at).unwrap();
}

struct Base {
    name: &'static str,
    path: PathBuf,
    hdr: Header,
    table: BTreeMap<usize, tiermem_pheap::alloc::Obj>,
    reference: Snapshot,
    /// Crashed base only: the last checkpoint that completed before the crash. The
    /// interrupted checkpoint is described by one header copy only (the crash came before the
    /// second header write); when that copy is damaged, open falls back to this one — the
    /// same result as a crash just before the commit, which the checkpoint never reported.
    previous: Option<Snapshot>,
}

fn base(name: &'static str, path: PathBuf) -> Base {
    let r = inspect(&path).unwrap();
    assert!(r.problems.is_empty() && r.warnings.is_empty(), "{r:?}");
    let hdr = r.header.unwrap();
    // The reference: a clean recovery of an undamaged copy (open replays a committed log).
    let copy = path.with_extension("ref");
    std::fs::copy(&path, &copy).unwrap();
    let reference = snapshot(&copy, &r.objects);
    let previous = (hdr.log_len > 0).then(|| {
        std::fs::copy(&path, &copy).unwrap();
        let newest = r.active_copy.unwrap() as u64;
        let f = std::fs::OpenOptions::new().write(true).open(&copy).unwrap();
        f.write_all_at(&[0u8; 256], DATA + newest * 4096).unwrap();
        let prev = snapshot(&copy, &r.objects);
        assert_ne!(
            prev, reference,
            "the interrupted checkpoint changed nothing"
        );
        prev
    });
    std::fs::remove_file(&copy).unwrap();
    Base {
        name,
        path,
        hdr,
        table: r.objects,
        reference,
        previous,
    }
}

/// Damages `p` (a copy of `b`); returns a description of what was done.
fn damage(b: &Base, p: &Path, rng: &mut impl Rng) -> String {
    let len = std::fs::metadata(p).unwrap().len();
    if rng.gen_ratio(1, 8) {
        let to = rng.gen_range(0..len);
        std::fs::OpenOptions::new()
            .write(true)
            .open(p)
            .unwrap()
            .set_len(to)
            .unwrap();
        return format!("truncated to {to} of {len} bytes");
    }
    let h = &b.hdr;
    let objs: Vec<(usize, usize)> = b.table.iter().map(|(&o, ob)| (o, ob.size)).collect();
    let mut what = Vec::new();
    for _ in 0..rng.gen_range(1..=3) {
        let (area, at) = match rng.gen_range(0..10) {
            0 => ("pool header", rng.gen_range(0..DATA)),
            1 | 2 => {
                let copy = rng.gen_range(0..2u64);
                ("heap header", DATA + copy * 4096 + rng.gen_range(0..256))
            }
            3 | 4 if h.meta_len > 0 => (
                "metadata journal",
                DATA + (h.meta_off(h.meta_active) as u64) + rng.gen_range(0..h.meta_len),
            ),
            5 if h.log_len > 0 => (
                "redo log",
                DATA + h.log_off() as u64 + rng.gen_range(0..h.log_len),
            ),
            5..=7 => {
                let (o, s) = objs[rng.gen_range(0..objs.len())];
                (
                    "object image",
                    DATA + (h.image_off() + o) as u64 + rng.gen_range(0..s as u64),
                )
            }
            _ => ("anywhere", rng.gen_range(0..len)),
        };
        flip_bits(p, at, rng);
        what.push(format!("{area} @{at:#x}"));
    }
    format!("bit flips: {}", what.join(", "))
}

#[test]
fn random_flips_and_truncations_end_in_an_error_or_the_clean_data() {
    if std::env::var_os("PHEAP_SWEEP_CHILD").is_some() {
        return;
    }
    let dir = tempfile::Builder::new()
        .prefix("tiermem-pheap-sweep")
        .tempdir_in("/dev/shm")
        .unwrap();
    let clean = dir.path().join("clean.heap");
    build(&clean, false);
    let crashed = dir.path().join("crashed.heap");
    let st = Command::new(std::env::current_exe().unwrap())
        .args([
            "--ignored",
            "sweep_child_builds_crashed_heap",
            "--exact",
            "--nocapture",
        ])
        .env("PHEAP_SWEEP_CHILD", &crashed)
        .stderr(std::process::Stdio::null())
        .status()
        .unwrap();
    assert!(!st.success(), "the child must abort at the fail point");
    let bases = [base("clean", clean), base("crashed", crashed)];
    assert_eq!(bases[0].hdr.log_len, 0);
    assert!(
        bases[1].hdr.log_len > 0,
        "the crashed heap has a committed log"
    );

    let cases: usize = std::env::var("TIERMEM_PHEAP_SWEEP_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(40);
    let seed: u64 = std::env::var("TIERMEM_PHEAP_SWEEP_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(13);
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let (mut errors, mut identical, mut older, mut failures) = (0, 0, 0, Vec::new());
    for case in 0..cases {
        let b = &bases[case % 2];
        let p = dir.path().join(format!("case{case}.heap"));
        std::fs::copy(&b.path, &p).unwrap();
        let what = damage(b, &p, &mut rng);
        let tag = format!("case {case} ({} heap, {what})", b.name);
        // verify's engine first (read-only), then the library's open (may replay the log).
        let verdict = catch_unwind(AssertUnwindSafe(|| inspect(&p)));
        let verify_ok = match verdict {
            Err(_) => {
                failures.push(format!("{tag}: inspect panicked"));
                continue;
            }
            Ok(Err(e)) => {
                assert!(!e.is_empty());
                false
            }
            Ok(Ok(r)) => r.problems.is_empty(),
        };
        let opened = catch_unwind(AssertUnwindSafe(|| {
            Heap::open(&p).map(|h| snapshot_of(&h, &b.table))
        }));
        match opened {
            Err(_) => failures.push(format!("{tag}: open panicked")),
            Ok(Err(e)) => {
                let msg = e.to_string();
                assert!(!msg.is_empty());
                if verify_ok {
                    failures.push(format!(
                        "{tag}: open failed ({msg}) but verify found nothing"
                    ));
                } else {
                    errors += 1;
                }
            }
            Ok(Ok(Err(diff))) => failures.push(format!("{tag}: opened with wrong data: {diff}")),
            Ok(Ok(Ok(s))) if b.previous.as_ref() == Some(&s) && s != b.reference => {
                if verify_ok {
                    older += 1;
                } else {
                    failures.push(format!(
                        "{tag}: verify reports a problem but open restores the previous checkpoint"
                    ));
                }
            }
            Ok(Ok(Ok(s))) if s != b.reference => {
                let bad: Vec<String> = s
                    .iter()
                    .filter(|(o, v)| b.reference.get(*o) != Some(*v))
                    .map(|(o, _)| format!("{o:#x}"))
                    .take(5)
                    .collect();
                failures.push(format!(
                    "{tag}: opened with different object bytes at {bad:?}"
                ))
            }
            Ok(Ok(Ok(_))) => {
                if !verify_ok {
                    failures.push(format!(
                        "{tag}: verify reports a problem but open restores the clean data"
                    ));
                } else {
                    identical += 1;
                }
            }
        }
        std::fs::remove_file(&p).ok();
    }
    println!(
        "pheap corruption sweep: {cases} cases (seed {seed}): {errors} clear errors, \
         {identical} identical to a clean recovery, {older} the crashed heap's previous \
         checkpoint (its in-flight commit's header copy damaged), {} failures",
        failures.len()
    );
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
