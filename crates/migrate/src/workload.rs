//! Synthetic applications that own a region and update it (issue #5's benchmark workloads):
//! each operation increments one 8-byte counter in the first 64 bytes of a page chosen
//! sequentially, uniformly at random, or by a scrambled zipfian distribution (YCSB's, θ 0.99).
//! The rest of every page holds a pattern derived from the page index, so a migrated region can
//! be checked byte for byte, and the counters sum to the number of operations ever done: a
//! lost or stale page shows up as a wrong sum.
//!
//! The application runs on its own thread ([`App`]): it can be frozen (it stops between two
//! batches of operations and says so), pointed at another copy of the region (the migration
//! target's) and resumed; it counts its operations for throughput timelines.

use std::sync::atomic::{AtomicPtr, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;

/// Bytes per page.
pub const PAGE: usize = 4096;
/// Bytes at the start of each page that hold the operations' counters.
pub const COUNTER_BYTES: usize = 64;

/// How an application picks the page of its next operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Workload {
    /// Pages in ascending order, wrapping around.
    Sequential,
    /// Pages uniformly at random.
    Uniform,
    /// Scrambled zipfian (θ = 0.99): a few hot pages spread over the region take most updates.
    Zipfian,
}

impl Workload {
    /// Every workload, in report order.
    pub const ALL: [Workload; 3] = [Workload::Sequential, Workload::Uniform, Workload::Zipfian];

    /// The name used on the command line and in reports.
    pub fn name(self) -> &'static str {
        match self {
            Workload::Sequential => "sequential",
            Workload::Uniform => "uniform",
            Workload::Zipfian => "zipfian",
        }
    }

    /// Parse a name given by [`Workload::name`].
    pub fn parse(s: &str) -> Option<Workload> {
        Workload::ALL.into_iter().find(|w| w.name() == s)
    }
}

/// splitmix64: the workloads' random numbers and the region's pattern.
pub fn mix64(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// The pattern word `w` (8..512) of page `p` for a region filled with `seed`.
#[inline]
fn pattern(seed: u64, p: u64, w: u64) -> u64 {
    mix64(seed ^ (p << 9 | w))
}

/// Fill `region` (a whole number of pages) with the pattern of `seed` and zero counters.
pub fn fill(region: &mut [u8], seed: u64) {
    for (p, page) in region.chunks_exact_mut(PAGE).enumerate() {
        page[..COUNTER_BYTES].fill(0);
        for (w, word) in page[COUNTER_BYTES..].chunks_exact_mut(8).enumerate() {
            let v = pattern(seed, p as u64, (w + COUNTER_BYTES / 8) as u64);
            word.copy_from_slice(&v.to_le_bytes());
        }
    }
}

/// Check a migrated copy: every page's pattern intact, and the counters summing to `ops`.
/// Returns a description of the first difference.
pub fn verify(region: &[u8], seed: u64, ops: u64) -> Result<(), String> {
    let mut sum = 0u64;
    for (p, page) in region.chunks_exact(PAGE).enumerate() {
        for c in page[..COUNTER_BYTES].chunks_exact(8) {
            sum = sum.wrapping_add(u64::from_le_bytes(c.try_into().expect("8 bytes")));
        }
        for (w, word) in page[COUNTER_BYTES..].chunks_exact(8).enumerate() {
            let want = pattern(seed, p as u64, (w + COUNTER_BYTES / 8) as u64);
            let got = u64::from_le_bytes(word.try_into().expect("8 bytes"));
            if got != want {
                return Err(format!(
                    "page {p} byte {}: {got:#x} where the source had {want:#x}",
                    COUNTER_BYTES + w * 8
                ));
            }
        }
    }
    if sum != ops {
        return Err(format!(
            "the counters sum to {sum}, but {ops} operations were done: updates were lost or \
             overwritten by a stale page"
        ));
    }
    Ok(())
}

/// The page sequence of one workload.
pub struct PageGen {
    workload: Workload,
    pages: u64,
    state: u64,
    next_seq: u64,
    zipf: Option<Zipf>,
}

impl PageGen {
    /// A generator over `pages` pages, seeded.
    pub fn new(workload: Workload, pages: u64, seed: u64) -> PageGen {
        PageGen {
            workload,
            pages: pages.max(1),
            state: mix64(seed ^ 0x5eed),
            next_seq: 0,
            zipf: (workload == Workload::Zipfian).then(|| Zipf::new(pages.max(1), 0.99)),
        }
    }

    fn rand(&mut self) -> u64 {
        self.state = self.state.wrapping_add(1);
        mix64(self.state)
    }

    /// The next page index.
    #[inline]
    pub fn next_page(&mut self) -> u64 {
        match self.workload {
            Workload::Sequential => {
                let p = self.next_seq;
                self.next_seq = (p + 1) % self.pages;
                p
            }
            Workload::Uniform => self.rand() % self.pages,
            Workload::Zipfian => {
                let u = (self.rand() >> 11) as f64 / (1u64 << 53) as f64;
                let rank = self.zipf.as_ref().expect("zipfian").rank(u);
                // Scrambled: the hot ranks land all over the region.
                mix64(rank ^ 0x2a) % self.pages
            }
        }
    }
}

/// YCSB's zipfian generator (Gray et al., "Quickly generating billion-record synthetic
/// databases"): ranks 0..n, rank 0 the most popular.
struct Zipf {
    n: f64,
    theta: f64,
    alpha: f64,
    zetan: f64,
    eta: f64,
}

impl Zipf {
    fn new(n: u64, theta: f64) -> Zipf {
        let zeta = |k: u64| (1..=k).map(|i| 1.0 / (i as f64).powf(theta)).sum::<f64>();
        let zetan = zeta(n);
        let zeta2 = zeta(2.min(n));
        let nf = n as f64;
        Zipf {
            n: nf,
            theta,
            alpha: 1.0 / (1.0 - theta),
            zetan,
            eta: (1.0 - (2.0 / nf).powf(1.0 - theta)) / (1.0 - zeta2 / zetan),
        }
    }

    fn rank(&self, u: f64) -> u64 {
        let uz = u * self.zetan;
        if uz < 1.0 {
            return 0;
        }
        if uz < 1.0 + 0.5f64.powf(self.theta) {
            return 1;
        }
        let r = (self.n * (self.eta * u - self.eta + 1.0).powf(self.alpha)) as u64;
        r.min(self.n as u64 - 1)
    }
}

const RUN: u32 = 0;
const FREEZE_REQUESTED: u32 = 1;
const FROZEN: u32 = 2;
const STOP: u32 = 3;

/// Operations between two looks at the control state.
const BATCH: u64 = 32;

/// An application thread updating a region (see the module documentation).
pub struct App {
    shared: Arc<AppShared>,
    thread: Option<std::thread::JoinHandle<()>>,
}

struct AppShared {
    base: AtomicPtr<u8>,
    state: AtomicU32,
    ops: AtomicU64,
}

impl App {
    /// Start updating `pages` pages at `base` with `workload`.
    ///
    /// # Safety
    /// `base..base + pages * PAGE` must stay mapped and writable until the application is
    /// frozen or stopped; after [`App::resume_at`], the same holds for the new base.
    pub unsafe fn start(base: *mut u8, pages: u64, workload: Workload, seed: u64) -> App {
        let shared = Arc::new(AppShared {
            base: AtomicPtr::new(base),
            state: AtomicU32::new(RUN),
            ops: AtomicU64::new(0),
        });
        let s = shared.clone();
        let thread = std::thread::Builder::new()
            .name("mig-app".into())
            .spawn(move || {
                let mut gen = PageGen::new(workload, pages, seed);
                let mut word = 0usize;
                loop {
                    match s.state.load(Ordering::Acquire) {
                        RUN => {}
                        FREEZE_REQUESTED => {
                            s.state.store(FROZEN, Ordering::Release);
                            continue;
                        }
                        FROZEN => {
                            std::thread::sleep(std::time::Duration::from_micros(20));
                            continue;
                        }
                        _ => return,
                    }
                    let base = s.base.load(Ordering::Acquire);
                    for _ in 0..BATCH {
                        let p = gen.next_page() as usize;
                        word = (word + 1) % (COUNTER_BYTES / 8);
                        // SAFETY: inside the region (caller's contract); page aligned base, so
                        // the counter is 8-byte aligned. Volatile: the update must reach
                        // memory (a fault may be taken here at a migration target).
                        unsafe {
                            let c = base.add(p * PAGE + word * 8) as *mut u64;
                            std::ptr::write_volatile(c, std::ptr::read_volatile(c) + 1);
                        }
                    }
                    s.ops.fetch_add(BATCH, Ordering::Relaxed);
                }
            })
            .expect("spawning the application thread");
        App {
            shared,
            thread: Some(thread),
        }
    }

    /// Operations done so far.
    pub fn ops(&self) -> u64 {
        self.shared.ops.load(Ordering::Relaxed)
    }

    /// A reader of the operations counter that outlives the application (for samplers).
    pub fn ops_reader(&self) -> impl Fn() -> u64 + Send + 'static {
        let s = self.shared.clone();
        move || s.ops.load(Ordering::Relaxed)
    }

    /// Stop the application between two batches; returns once it no longer touches the region.
    pub fn freeze(&self) {
        let _ = self.shared.state.compare_exchange(
            RUN,
            FREEZE_REQUESTED,
            Ordering::AcqRel,
            Ordering::Acquire,
        );
        while self.shared.state.load(Ordering::Acquire) != FROZEN {
            std::hint::spin_loop();
        }
    }

    /// Run again, on the copy of the region at `base`.
    ///
    /// # Safety
    /// As [`App::start`], for the new base.
    pub unsafe fn resume_at(&self, base: *mut u8) {
        self.shared.base.store(base, Ordering::Release);
        self.shared.state.store(RUN, Ordering::Release);
    }

    /// Stop for good (joins the thread); returns the operations done.
    pub fn stop(mut self) -> u64 {
        self.shared.state.store(STOP, Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        self.ops()
    }
}

impl Drop for App {
    fn drop(&mut self) {
        self.shared.state.store(STOP, Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fill_then_verify_and_a_changed_byte_is_found() {
        let mut r = vec![0u8; 8 * PAGE];
        fill(&mut r, 7);
        verify(&r, 7, 0).unwrap();
        r[3 * PAGE] = 1;
        verify(&r, 7, 1).unwrap();
        assert!(verify(&r, 7, 0).unwrap_err().contains("sum"));
        r[5 * PAGE + 100] ^= 1;
        assert!(verify(&r, 7, 1).unwrap_err().contains("page 5"));
    }

    #[test]
    fn zipfian_is_skewed_and_uniform_is_not() {
        let count = |w| {
            let mut g = PageGen::new(w, 1000, 1);
            let mut c = vec![0u32; 1000];
            for _ in 0..100_000 {
                c[g.next_page() as usize] += 1;
            }
            c.sort_unstable_by(|a, b| b.cmp(a));
            c[..10].iter().sum::<u32>()
        };
        // Top 1 % of pages: ~1 % of updates uniformly, far more under zipfian.
        assert!(count(Workload::Uniform) < 2_000);
        assert!(count(Workload::Zipfian) > 20_000);
    }

    #[test]
    fn the_application_counts_what_it_does_across_a_move() {
        let mut a = vec![0u8; 16 * PAGE];
        fill(&mut a, 3);
        // SAFETY: `a` outlives the application (stopped below) and only it writes meanwhile.
        let app = unsafe { App::start(a.as_mut_ptr(), 16, Workload::Uniform, 1) };
        std::thread::sleep(std::time::Duration::from_millis(5));
        app.freeze();
        let mut b = a.clone();
        // SAFETY: as above, for `b`.
        unsafe { app.resume_at(b.as_mut_ptr()) };
        std::thread::sleep(std::time::Duration::from_millis(5));
        let ops = app.stop();
        assert!(ops > 0);
        verify(&b, 3, ops).unwrap();
    }
}
