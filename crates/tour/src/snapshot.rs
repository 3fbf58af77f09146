//! Tour step `snapshot`: a point-in-time snapshot of live memory without fork (MDC's goal,
//! userfaultfd write protection instead of a child). 64 MiB of snapshot-able memory is filled
//! (a third of its pages left as holes), a writer thread writes all over it while the snapshot
//! is dumped, and the file must hold the memory exactly as it was in the pause, the writer's
//! bytes nowhere; the extra memory the snapshot may take is printed beside the data size.

use super::{Ctx, Outcome};
use anyhow::{ensure, Context, Result};
use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::sync::Arc;
use tiermem_snapshot::{begin_paused, Memory, Options, SnapshotFile, PAGE};

/// Run the step; its file is removed at the end.
pub fn run(ctx: &Ctx) -> Result<Outcome> {
    let len = 64 << 20;
    let m = Memory::map("tour", len).context("mapping snapshot-able memory")?;
    let pages = len / PAGE;
    for p in (0..pages).filter(|p| p % 3 != 2) {
        // SAFETY: inside the mapping.
        unsafe {
            m.as_ptr()
                .add(p * PAGE + (p % 509) * 8)
                .cast::<u64>()
                .write(p as u64 + 1)
        };
    }
    // SAFETY: our mapping; no writer runs yet.
    let image = unsafe { std::slice::from_raw_parts(m.as_ptr(), len) }.to_vec();
    let target = ctx.file("snapshot.snap");
    let stop = Arc::new(AtomicBool::new(false));
    let go = Arc::new(AtomicBool::new(false));
    let base = m.as_ptr() as usize;
    let writer = {
        let (stop, go) = (stop.clone(), go.clone());
        std::thread::spawn(move || {
            let mut x = 0x9e37_79b9_7f4a_7c15u64;
            let mut n = 0u64;
            while !go.load(SeqCst) {
                std::hint::spin_loop();
            }
            while !stop.load(SeqCst) {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let at = base + (x as usize % (len / 8)) * 8;
                // SAFETY: inside the mapping, which outlives the thread (joined below).
                unsafe { (at as *mut u64).write_volatile(!0) };
                n += 1;
            }
            n
        })
    };
    let opts = Options::default();
    // The file and the staging slots are made first; the pause (here the writer has not
    // started, so it pauses nothing) covers the exact scan and the write protection.
    let job = begin_paused(&[&m], &target, b"tour".to_vec(), opts, || ())?;
    go.store(true, SeqCst);
    let rep = job.wait()?;
    stop.store(true, SeqCst);
    let writes = writer
        .join()
        .map_err(|_| anyhow::anyhow!("the writer panicked"))?;
    let f = SnapshotFile::open(&target)?;
    f.verify()?;
    let mut back = vec![0u8; len];
    f.restore_into(0, &mut back)?;
    let _ = std::fs::remove_file(&target);
    ensure!(
        back == image,
        "the snapshot differs from the memory at the pause"
    );
    say!(
        "{} MiB, {} pages stored ({} holes skipped); pause {:.2} ms (scan and write protection; the file was created before it), file durable after {:.1} ms{}",
        len >> 20,
        rep.present_pages,
        pages as u64 - rep.present_pages,
        rep.pause.as_secs_f64() * 1e3,
        rep.total.as_secs_f64() * 1e3,
        if rep.direct { " (O_DIRECT)" } else { "" }
    );
    say!(
        "a writer made {writes} writes meanwhile: {} units dumped in address order, {} copied by the writer into a staging slot first, {} written by the writer itself (no slot free), {} single pages spilled by the writer; extra memory bound {} KiB ({:.1} % of the data)",
        rep.dumped_units,
        rep.staged_units,
        rep.self_written_units,
        rep.spilled_pages,
        rep.extra_bytes_bound >> 10,
        100.0 * rep.extra_bytes_bound as f64 / len as f64
    );
    Ok(Outcome::Ok(format!(
        "the file holds the memory as it was in the pause, byte for byte, with a writer at work during the dump; extra memory bounded by {} KiB",
        rep.extra_bytes_bound >> 10
    )))
}
