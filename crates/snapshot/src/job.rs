//! A snapshot job whatever its method: [`Options`], [`begin`] and [`begin_paused`], and the
//! [`Job`] handle (progress, pause, wait, abort) with its [`Report`]. The methods themselves
//! are [`crate::wp`] (fork-less copy-before-write) and [`crate::fork`] (the forked-child
//! baselines, `fork` and `fork-mdc`).

use crate::error::{Result, SnapshotError};
use crate::fork::ForkJob;
use crate::format::{Layout, Method, RegionInfo, Reservation, Target, PAGE, UNIT_BYTES};
use crate::wp::{self, Memory, WpJob};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use tiermem_fault::Pagemap;

/// Most staging slots (their free set is one 64-bit word).
pub const MAX_SLOTS: usize = 64;

/// How a snapshot is taken.
#[derive(Debug, Clone, Copy)]
pub struct Options {
    /// Staging slots of 256 KiB (S) of the `wp` method: units copied by a faulting writer for
    /// the dumper to write. 0: every first write to an undumped unit writes it to the file
    /// itself. Unused by the fork methods.
    pub staging_slots: usize,
    /// `wp` (default), `fork-mdc` or `fork`.
    pub method: Method,
    /// A file (default) or an NVM pool.
    pub target: Target,
}

impl Default for Options {
    fn default() -> Options {
        Options {
            staging_slots: 16,
            method: Method::Wp,
            target: Target::File,
        }
    }
}

impl Options {
    /// The extra memory a `wp` snapshot of `units` units may take: staging slots, the
    /// dumper's buffers and the spill batches (256 KiB each), and 40 bytes per unit (its
    /// bitmap, file offset and checksum in the layout and writer, its state, spill mask and
    /// spill-ready mask).
    pub fn extra_bytes_bound(&self, units: usize) -> u64 {
        let buffers = self.staging_slots
            + crate::wp::DUMPER_BUFFERS
            + crate::wp::spill_batches(self.staging_slots);
        (buffers * UNIT_BYTES + units * 40) as u64
    }
}

/// What a finished snapshot reports.
#[derive(Debug, Clone, Default)]
pub struct Report {
    /// The file's length.
    pub file_bytes: u64,
    /// Pages stored.
    pub present_pages: u64,
    /// Units in all.
    pub units: usize,
    /// The application's pause: for `wp`, the time inside [`begin`] (scan, protection) or the
    /// guard's life in [`begin_paused`]; for the fork methods, the `fork` (page tables copied).
    pub pause: Duration,
    /// From the start of [`begin`] to the renamed, durable file.
    pub total: Duration,
    /// Units the dumper (or the forked child) copied and wrote.
    pub dumped_units: u64,
    /// Units a faulting writer staged in a slot (`wp`).
    pub staged_units: u64,
    /// Units a faulting writer wrote itself, no slot being free (`wp`).
    pub self_written_units: u64,
    /// Pages a faulting writer spilled (`wp`: copied alone, written to the spill area).
    pub spilled_pages: u64,
    /// Faults that waited for another thread's claim on their unit (`wp`).
    pub claim_waits: u64,
    /// The bound on extra memory: for `wp`, slots, dumper buffers and index; for the fork
    /// methods, every stored page (the kernel copies each page the parent writes before the
    /// child is done with it) plus the child's buffer and index.
    pub extra_bytes_bound: u64,
    /// Whether the file was written with O_DIRECT.
    pub direct: bool,
}

enum Kind<'a> {
    Wp(WpJob<'a>),
    Fork(Box<ForkJob>),
    Ended,
}

/// A running snapshot. [`Job::wait`] for its report; dropping it unfinished aborts it.
pub struct Job<'a> {
    kind: Kind<'a>,
    mem: Vec<&'a Memory>,
}

/// Takes a snapshot of `mem` into `target` with `app` saved beside it. Call it with the
/// application's writers paused (its quiesce): the snapshot is the memory as it is during
/// this call. It returns once the point in time is fixed (`wp`: pages protected; fork
/// methods: the child forked); the writers may then resume while the job dumps in the
/// background. [`begin_paused`] keeps the pause shorter.
///
/// Errors before anything is protected or forked: an empty or repeated region, a memory in a
/// snapshot already, a target whose directory is missing or full
/// ([`tiermem_media::MediaError::NoSpace`]), a failed scan.
pub fn begin<'a>(
    mem: &[&'a Memory],
    target: &Path,
    app: Vec<u8>,
    opts: Options,
) -> Result<Job<'a>> {
    start(mem, target, app, opts, None::<fn()>)
}

/// As [`begin`], called with the writers running: the file is created and allocated (from a
/// scan made now, with headroom) and buffers are allocated first, then `pause` is called — it
/// pauses the application's writers and returns a guard whose drop resumes them — and the
/// guard is held only for what fixes the point in time (`wp`: the exact scan and the write
/// protection; fork methods: the fork). [`Job::pause`] is that time.
pub fn begin_paused<'a, G>(
    mem: &[&'a Memory],
    target: &Path,
    app: Vec<u8>,
    opts: Options,
    pause: impl FnOnce() -> G,
) -> Result<Job<'a>> {
    start(mem, target, app, opts, Some(pause))
}

fn start<'a, G>(
    mem: &[&'a Memory],
    target: &Path,
    app: Vec<u8>,
    opts: Options,
    pause: Option<impl FnOnce() -> G>,
) -> Result<Job<'a>> {
    if mem.is_empty() {
        return Err(SnapshotError::InvalidArgument(
            "a snapshot needs at least one memory".into(),
        ));
    }
    for (i, m) in mem.iter().enumerate() {
        if mem[..i].iter().any(|o| std::ptr::eq(*o, *m)) {
            return Err(SnapshotError::InvalidArgument(format!(
                "memory {:?} given twice",
                m.name()
            )));
        }
    }
    if opts.staging_slots > MAX_SLOTS {
        return Err(SnapshotError::InvalidArgument(format!(
            "{} staging slots (at most {MAX_SLOTS})",
            opts.staging_slots
        )));
    }
    // Claim every memory (one snapshot at a time); released when the job ends.
    for (i, m) in mem.iter().enumerate() {
        if !m.claim() {
            for o in &mem[..i] {
                o.release();
            }
            return Err(SnapshotError::InvalidArgument(format!(
                "memory {:?} is in a snapshot already",
                m.name()
            )));
        }
    }
    let kind = match opts.method {
        Method::Wp => wp::start(mem, target, app, opts, pause).map(Kind::Wp),
        m => crate::fork::start(mem, target, app, m, opts.target, pause)
            .map(|j| Kind::Fork(Box::new(j))),
    };
    match kind {
        Ok(kind) => Ok(Job {
            kind,
            mem: mem.to_vec(),
        }),
        Err(e) => {
            for m in mem {
                m.release();
            }
            Err(e)
        }
    }
}

/// A job over memories it holds a share of: free of [`Job`]'s borrow, so it can move to the
/// thread that waits for it. Dropped unfinished, it aborts.
pub struct OwnedJob {
    // Field order: the job (which borrows the memories) drops before the shares.
    job: Option<Job<'static>>,
    _mem: Vec<Arc<Memory>>,
}

/// As [`begin_paused`] over shared memories (`pause` runs on this thread).
pub fn begin_paused_owned<G>(
    mem: &[Arc<Memory>],
    target: &Path,
    app: Vec<u8>,
    opts: Options,
    pause: impl FnOnce() -> G,
) -> Result<OwnedJob> {
    let held: Vec<Arc<Memory>> = mem.to_vec();
    // SAFETY: the references point into the Arcs `held` keeps, which the OwnedJob drops only
    // after the job (field order); the memories never move (Arc contents are pinned).
    let refs: Vec<&'static Memory> = held.iter().map(|m| unsafe { &*Arc::as_ptr(m) }).collect();
    let job = begin_paused(&refs, target, app, opts, pause)?;
    Ok(OwnedJob {
        job: Some(job),
        _mem: held,
    })
}

impl OwnedJob {
    /// See [`Job::progress`].
    pub fn progress(&self) -> (usize, usize) {
        self.job.as_ref().map_or((0, 0), Job::progress)
    }

    /// See [`Job::pause`].
    pub fn pause(&self) -> Duration {
        self.job.as_ref().map_or(Duration::ZERO, Job::pause)
    }

    /// See [`Job::child_pid`].
    pub fn child_pid(&self) -> Option<u32> {
        self.job.as_ref().and_then(Job::child_pid)
    }

    /// See [`Job::wait`].
    pub fn wait(mut self) -> Result<Report> {
        self.job.take().expect("owned job").wait()
    }

    /// See [`Job::abort`].
    pub fn abort(mut self) {
        if let Some(j) = self.job.take() {
            j.abort();
        }
    }
}

/// The regions of `mem` as the file names them.
pub(crate) fn region_infos(mem: &[&Memory]) -> Vec<RegionInfo> {
    mem.iter()
        .map(|m| RegionInfo {
            name: m.name().to_string(),
            len: m.len() as u64,
        })
        .collect()
}

/// The temporary file of a snapshot begun with the writers running: sized from a scan made
/// now, with headroom for what they add before the pause — a quarter more, at least 16 MiB,
/// at most every page.
pub(crate) fn reserve_estimate(
    mem: &[&Memory],
    pm: &Pagemap,
    target: &Path,
    app_len: u64,
    kind: Target,
) -> Result<Reservation> {
    let mut bitmaps = Vec::new();
    for m in mem {
        bitmaps.extend(wp::scan(pm, m.as_ptr() as usize, m.len())?.0);
    }
    let est = Layout::new(region_infos(mem), bitmaps, app_len)?;
    let total: u64 = mem.iter().map(|m| (m.len() / PAGE) as u64).sum();
    let room = (est.present_pages() / 4)
        .max(4096)
        .min(total - est.present_pages());
    Reservation::new_in(target, est.file_len() + room * PAGE as u64, kind)
}

impl<'a> Job<'a> {
    /// Units done and units in all.
    pub fn progress(&self) -> (usize, usize) {
        match &self.kind {
            Kind::Wp(j) => j.progress(),
            Kind::Fork(j) => j.progress(),
            Kind::Ended => (0, 0),
        }
    }

    /// The application's pause (see [`Report::pause`]).
    pub fn pause(&self) -> Duration {
        match &self.kind {
            Kind::Wp(j) => j.pause(),
            Kind::Fork(j) => j.pause(),
            Kind::Ended => Duration::ZERO,
        }
    }

    /// The forked child's pid (fork methods, until [`Job::wait`] reaps it); `None` for `wp`.
    pub fn child_pid(&self) -> Option<u32> {
        match &self.kind {
            Kind::Fork(j) => j.child_pid(),
            _ => None,
        }
    }

    /// Waits for the dump, finishes the file (durable, renamed over the target) and reports.
    /// On an error the previous snapshot at the target is intact and no page stays protected.
    pub fn wait(mut self) -> Result<Report> {
        match std::mem::replace(&mut self.kind, Kind::Ended) {
            Kind::Wp(j) => j.wait(),
            Kind::Fork(j) => (*j).wait(),
            Kind::Ended => Err(SnapshotError::Aborted("the job had ended".into())),
        }
    }

    /// Aborts: stops the dumper (or kills the child), unprotects everything, removes the
    /// temporary file.
    pub fn abort(mut self) {
        match std::mem::replace(&mut self.kind, Kind::Ended) {
            Kind::Wp(j) => j.abort(),
            Kind::Fork(j) => (*j).abort(),
            Kind::Ended => {}
        }
    }
}

impl Drop for Job<'_> {
    fn drop(&mut self) {
        // An unfinished job aborts in its own drop.
        self.kind = Kind::Ended;
        for m in &self.mem {
            m.release();
        }
    }
}

// A job moves to the thread that waits for it.
const _: () = {
    const fn send<T: Send>() {}
    send::<OwnedJob>();
};
