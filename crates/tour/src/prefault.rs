//! Tour step `prefault`: first touches of anonymous memory with and without the prefault
//! service. The same 64 MiB walk (one byte per page, ascending, a short compute gap) runs on
//! the kernel's demand faults, then with the service populating ahead; the faults the walking
//! thread took (RUSAGE_THREAD) and the per-touch median are printed. Then a check that does not
//! depend on timing: a window the service populated before the walk reaches it takes exactly
//! its tripwire faults (one per 16-page chunk) and reads zero.

use super::fault::AnonMap;
use super::{Ctx, Outcome};
use anyhow::{bail, ensure, Result};
use std::time::{Duration, Instant};
use tiermem_prefault::{Options, Order, Policy, Service, Thp};

const PAGE: usize = 4096;

/// Run the step (in memory only: nothing to clean up but its mappings).
pub fn run(_ctx: &Ctx) -> Result<Outcome> {
    let len = 64 << 20;
    let kernel = walk(len, None)?;
    say!(
        "kernel demand faults: {} MiB touched one page at a time, {} faults in the walking thread, median touch {:.2} µs",
        len >> 20,
        kernel.faults,
        kernel.p50_us
    );
    let svc = Service::start(Options::default())?;
    let with = walk(len, Some(&svc))?;
    let st = svc.stats();
    say!(
        "with the service ({}): {} faults in the walking thread, median touch {:.2} µs ({:.2}× the kernel's), order learned: {:?}; {} MiB populated ahead on the other core, service CPU {:.1} ms, peak populated-not-used {} KiB (budget {} MiB)",
        if st.sched_idle { "SCHED_IDLE" } else { "normal priority" },
        with.faults,
        with.p50_us,
        with.p50_us / kernel.p50_us,
        with.order,
        st.populated_bytes >> 20,
        st.service_cpu.as_secs_f64() * 1e3,
        st.peak_unused_bytes >> 10,
        st.budget_bytes >> 20
    );
    ensure!(
        st.peak_unused_bytes <= st.budget_bytes,
        "populated-but-unused peaked at {} bytes, over the budget {}",
        st.peak_unused_bytes,
        st.budget_bytes
    );
    // (A starved service — both cores busy, and it is SCHED_IDLE — leaves every fault to the
    // walk: equal counts, give or take the few faults of the loop's own stack and buffers.)
    ensure!(
        with.faults <= kernel.faults + 64,
        "the walk took more faults with the service ({}) than without ({})",
        with.faults,
        kernel.faults
    );
    // The check that does not depend on timing: wait for a window, then walk it. Its service
    // runs at normal priority, so a machine busy elsewhere (a test suite) delays it, never
    // starves it.
    drop(svc);
    let svc = Service::start(Options {
        sched_idle: false,
        ..Options::default()
    })?;
    let (pages, faults) = window_walk(&svc)?;
    say!(
        "a window populated before the walk reached it: {pages} first touches took {faults} faults (its tripwires, one per 16-page chunk) and read zero"
    );
    Ok(Outcome::Ok(format!(
        "first touches {:.2}× the kernel's median ({:.2} vs {:.2} µs), {} of {} faults left in the application thread; a ready window: {faults} faults for {pages} touches",
        with.p50_us / kernel.p50_us,
        with.p50_us,
        kernel.p50_us,
        with.faults,
        kernel.faults
    )))
}

struct Walk {
    faults: u64,
    p50_us: f64,
    order: Order,
}

fn thread_minflt() -> u64 {
    // SAFETY: getrusage fills the struct.
    unsafe {
        let mut ru: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_THREAD, &mut ru);
        ru.ru_minflt as u64
    }
}

fn walk(len: usize, svc: Option<&Service>) -> Result<Walk> {
    let m = map_4k(len)?;
    let reg = match svc {
        Some(s) => Some(s.register(
            m.ptr,
            len,
            Policy {
                thp: Thp::Off,
                ..Policy::default()
            },
        )?),
        None => None,
    };
    let pages = len / PAGE;
    let mut t = Vec::with_capacity(pages);
    let f0 = thread_minflt();
    for i in 0..pages {
        let gap = Instant::now();
        while gap.elapsed() < Duration::from_micros(2) {}
        let a = Instant::now();
        // SAFETY: inside our mapping.
        unsafe { m.ptr.add(i * PAGE).write_volatile(1) };
        // mfence: the store completes (its cache miss included), as the benchmark measures.
        std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
        t.push(a.elapsed());
    }
    let faults = thread_minflt() - f0;
    // Every byte: the touched ones 1, the rest zero.
    // SAFETY: the whole mapping is ours and readable.
    let all = unsafe { std::slice::from_raw_parts(m.ptr, len) };
    for (i, &b) in all.iter().enumerate() {
        ensure!(
            b == u8::from(i % PAGE == 0),
            "byte {i} reads {b} after the walk"
        );
    }
    let order = reg.as_ref().map_or(Order::Auto, |r| r.stats().order);
    drop(reg);
    t.sort_unstable();
    Ok(Walk {
        faults,
        p50_us: t[t.len() / 2].as_secs_f64() * 1e6,
        order,
    })
}

fn window_walk(svc: &Service) -> Result<(usize, u64)> {
    let len = 8 << 20;
    let m = map_4k(len)?;
    let policy = Policy {
        order: Order::Ascending,
        thp: Thp::Off,
        ..Policy::default()
    };
    let reg = svc.register(m.ptr, len, policy)?;
    let chunk = policy.chunk as usize;
    // The table starts with RAMP_START entries and doubles on each pass that sees them used:
    // walk what is populated, wait for the service to see it and fill more, until a whole
    // table's span (entries × chunk pages) was walked.
    let window = policy.entries as usize * chunk;
    let (mut walked, mut faults, mut nonzero) = (0usize, 0u64, 0usize);
    let t = Instant::now();
    while walked < window {
        let chunks = (reg.stats().populated_bytes / PAGE as u64) as usize / (chunk - 1);
        let ready = (chunks * chunk).min(window);
        if ready <= walked {
            if t.elapsed() > Duration::from_secs(20) {
                bail!(
                    "the service populated {} bytes in 20 s; {walked} pages of a window walked",
                    reg.stats().populated_bytes
                );
            }
            std::thread::sleep(Duration::from_millis(1));
            continue;
        }
        let f0 = thread_minflt();
        for i in walked..ready {
            // SAFETY: inside our mapping.
            // (The write first: a read of a tripwire would fault twice, for the zero page and
            // then for the copy.)
            unsafe {
                m.ptr.add(i * PAGE).write_volatile(1);
                nonzero += usize::from(m.ptr.add(i * PAGE + 100).read_volatile() != 0);
            }
        }
        faults += thread_minflt() - f0;
        walked = ready;
    }
    ensure!(nonzero == 0, "{nonzero} populated pages did not read zero");
    ensure!(
        faults <= policy.entries as u64,
        "{faults} faults walking {window} populated pages (expected at most their {} tripwires)",
        policy.entries
    );
    drop(reg);
    Ok((window, faults))
}

/// An anonymous private mapping with 4 KiB pages whatever the THP setting, unmapped on drop.
fn map_4k(len: usize) -> Result<AnonMap> {
    let m = AnonMap::new(len)?;
    // SAFETY: our mapping; advice only.
    unsafe { libc::madvise(m.ptr.cast(), len, libc::MADV_NOHUGEPAGE) };
    Ok(m)
}
