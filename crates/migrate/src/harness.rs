//! One migration of a running synthetic application between two hosts, by any method, with
//! its metrics and throughput timeline: what `tiermem bench migrate` and `tiermem migrate run`
//! are made of.
//!
//! A case: fill a region of the source host with a known pattern, start a [`workload::App`] on
//! it and measure its steady throughput; then migrate it — the application is frozen, the
//! method moves the region to the target host (the other network namespace, sharing the FAM
//! directory), the application resumes on the target's copy as soon as the method allows, and
//! runs on while pages arrive — until every page is present at the target, plus a short tail.
//! A sampler records the operations and the pages present at the target (`mincore`) every few
//! milliseconds. At the end the target's copy is checked: every pattern byte, and the counters
//! summing to every operation ever done.
//!
//! Time zero of a case is the start of the migration: the freeze for post-copy and
//! stop-and-copy, the first pre-copy round for pre-copy.

use crate::fam::{FamSource, FamSourceConfig, FamTarget};
use crate::lazyfile::Batching;
use crate::mapping::Mapping;
use crate::metrics::Metrics;
use crate::netns::{Host, TwoHosts};
use crate::socket::{SocketReservation, SocketSource, SocketTarget, SourceOptions, TargetOptions};
use crate::targetmem::TargetMemory;
use crate::workload::{self, App, Workload, PAGE};
use std::net::{SocketAddr, TcpListener};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicPtr, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tiermem_media::{now_ns, DelayModel};

/// A migration method with its delay model.
#[derive(Clone, Debug, PartialEq)]
pub enum Method {
    /// FAM-aware post-copy; `delay` on the lazy files (`none` or `pcm-fam`).
    Fam {
        /// Delay model name.
        delay: String,
    },
    /// FAM-aware post-copy with the hot-page manifest: the pages written in the last
    /// [`HOT_WINDOW`] before the freeze are dumped first and prefetched first by the target.
    FamHot {
        /// Delay model name.
        delay: String,
    },
    /// Socket post-copy as CRIU does it; `delay` on the network (`veth`: the real veth only,
    /// or `ethernet-10g`), expiration timer in ms.
    Socket {
        /// Delay model name.
        delay: String,
        /// Expiration timer.
        expiration_ms: u64,
    },
    /// Stop-and-copy through FAM.
    StopAndCopy {
        /// Delay model name on the lazy files.
        delay: String,
    },
    /// Pre-copy rounds to FAM, then a short freeze.
    PreCopy {
        /// Delay model name on the lazy files.
        delay: String,
    },
}

impl Method {
    /// The method's name in reports (`fam`, `socket`, `stop-and-copy`, `pre-copy`).
    pub fn name(&self) -> &'static str {
        match self {
            Method::Fam { .. } => "fam",
            Method::FamHot { .. } => "fam+hot",
            Method::Socket { .. } => "socket",
            Method::StopAndCopy { .. } => "stop-and-copy",
            Method::PreCopy { .. } => "pre-copy",
        }
    }

    /// The delay model's name.
    pub fn delay(&self) -> &str {
        match self {
            Method::Fam { delay }
            | Method::FamHot { delay }
            | Method::Socket { delay, .. }
            | Method::StopAndCopy { delay }
            | Method::PreCopy { delay } => delay,
        }
    }

    /// The expiration timer (socket post-copy only).
    pub fn expiration_ms(&self) -> Option<u64> {
        match self {
            Method::Socket { expiration_ms, .. } => Some(*expiration_ms),
            _ => None,
        }
    }

    /// A short label: `fam/pcm-fam`, `socket/ethernet-10g/100ms`, ...
    pub fn label(&self) -> String {
        match self.expiration_ms() {
            Some(e) => format!("{}/{}/{e}ms", self.name(), self.delay()),
            None => format!("{}/{}", self.name(), self.delay()),
        }
    }

    /// Parse `fam`, `socket`, `stop-and-copy` or `pre-copy` with a delay name (and, for
    /// socket, an expiration).
    pub fn parse(name: &str, delay: &str, expiration_ms: u64) -> Result<Method, String> {
        let fam_delay = |d: &str| -> Result<String, String> {
            delay_model(d)?;
            Ok(d.to_string())
        };
        Ok(match name {
            "fam" => Method::Fam {
                delay: fam_delay(delay)?,
            },
            "fam+hot" => Method::FamHot {
                delay: fam_delay(delay)?,
            },
            "socket" => Method::Socket {
                delay: match delay {
                    "veth" | "none" => "veth".into(),
                    d => fam_delay(d)?,
                },
                expiration_ms,
            },
            "stop-and-copy" => Method::StopAndCopy {
                delay: fam_delay(delay)?,
            },
            "pre-copy" => Method::PreCopy {
                delay: fam_delay(delay)?,
            },
            other => {
                return Err(format!(
                    "unknown method {other:?} (fam, fam+hot, socket, stop-and-copy, pre-copy)"
                ))
            }
        })
    }
}

/// The delay model of a name: `none`/`veth` (no delay) or a media preset (`pcm-fam`,
/// `ethernet-10g`, ...).
pub fn delay_model(name: &str) -> Result<DelayModel, String> {
    match name {
        "none" | "veth" => Ok(DelayModel::NONE),
        n => DelayModel::preset(n).ok_or_else(|| format!("unknown delay model {n:?}")),
    }
}

/// How long before the freeze the hot-page manifest records writes.
pub const HOT_WINDOW: Duration = Duration::from_millis(10);
/// At most this many pages in the manifest.
pub const HOT_CAP: usize = crate::checkpoint::MAX_HOT_PAGES;

/// What to run.
#[derive(Clone, Debug)]
pub struct CaseSpec {
    /// The application's access pattern.
    pub workload: Workload,
    /// Region bytes (a multiple of 4 KiB).
    pub region_len: usize,
    /// How it migrates.
    pub method: Method,
    /// Steady-state measurement before the migration.
    pub steady: Duration,
    /// How long the timeline goes on after the migration completed.
    pub tail: Duration,
    /// Pattern and workload seed.
    pub seed: u64,
    /// Migration id (its directory in FAM).
    pub id: u64,
}

/// One point of a timeline.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Sample {
    /// Milliseconds since the start of the migration (negative before it).
    pub t_ms: f64,
    /// Application operations per second over the interval ending here.
    pub ops_per_s: f64,
    /// Fraction of the region present at the target.
    pub present: f64,
}

/// What a case measured.
#[derive(Clone, Debug, Default)]
pub struct CaseResult {
    /// The common metrics (downtime, busy, total, page counts).
    pub metrics: Metrics,
    /// Operations per second before the migration.
    pub steady_ops_per_s: f64,
    /// Operations per second from the start of the migration until every page was present
    /// (downtime included).
    pub during_ops_per_s: f64,
    /// `during / steady`: 1 = no degradation, 0 = the application did nothing.
    pub degradation: f64,
    /// The timeline.
    pub timeline: Vec<Sample>,
    /// Every byte checked at the target, counters summing to every operation.
    pub verified: bool,
}

/// Times of a case's milestones ([`now_ns`] stamps).
#[derive(Default)]
struct Stamps {
    start: u64,
    resume: u64,
    busy_end: u64,
    complete: u64,
    /// Reservation time before `start` (ns).
    reserve: u64,
}

/// Samples operations and present pages until told to stop.
struct Sampler {
    stop: Arc<AtomicBool>,
    target: Arc<AtomicPtr<u8>>,
    thread: Option<std::thread::JoinHandle<Vec<(u64, u64, u64)>>>,
}

impl Sampler {
    fn start(app_ops: impl Fn() -> u64 + Send + 'static, len: usize, every: Duration) -> Sampler {
        let stop = Arc::new(AtomicBool::new(false));
        let target = Arc::new(AtomicPtr::new(std::ptr::null_mut::<u8>()));
        let (s, t) = (stop.clone(), target.clone());
        let thread = std::thread::spawn(move || {
            let mut out = Vec::new();
            let mut vec = vec![0u8; len / PAGE];
            while !s.load(Ordering::Acquire) {
                let p = t.load(Ordering::Acquire);
                let present = if p.is_null() {
                    0
                } else {
                    // SAFETY: mincore only reads page tables; the target region stays mapped
                    // until the sampler is stopped (the harness stops it first).
                    let r = unsafe { libc::mincore(p.cast(), len, vec.as_mut_ptr()) };
                    if r == 0 {
                        vec.iter().filter(|b| **b & 1 != 0).count() as u64
                    } else {
                        0
                    }
                };
                out.push((now_ns(), app_ops(), present));
                std::thread::sleep(every);
            }
            out
        });
        Sampler {
            stop,
            target,
            thread: Some(thread),
        }
    }

    fn set_target(&self, p: *mut u8) {
        self.target.store(p, Ordering::Release);
    }

    fn finish(mut self) -> Vec<(u64, u64, u64)> {
        self.stop.store(true, Ordering::Release);
        self.thread
            .take()
            .map(|t| t.join().unwrap_or_default())
            .unwrap_or_default()
    }
}

impl Drop for Sampler {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Run one case between `hosts`, through the FAM directory `fam`.
pub fn run_case(hosts: &TwoHosts, fam: &Path, spec: &CaseSpec) -> Result<CaseResult, String> {
    let len = spec.region_len.div_ceil(PAGE) * PAGE;
    if len == 0 {
        return Err("the region is empty".into());
    }
    let pages = (len / PAGE) as u64;
    let source =
        Mapping::new(len).map_err(|e| format!("mapping a {} MiB region: {e}", len >> 20))?;
    // SAFETY: a fresh private mapping of `len` bytes, ours alone.
    workload::fill(
        unsafe { std::slice::from_raw_parts_mut(source.ptr, len) },
        spec.seed,
    );
    // SAFETY: `source` outlives the application (stopped before this returns); only the
    // application writes it.
    let app = unsafe { App::start(source.ptr, pages, spec.workload, spec.seed) };
    let every = if len <= 512 << 20 {
        Duration::from_millis(5)
    } else {
        Duration::from_millis(20)
    };
    let sampler = Sampler::start(app.ops_reader(), len, every);
    std::thread::sleep(Duration::from_millis(50)); // warm up
    let steady_ops0 = app.ops();
    let steady_t0 = now_ns();
    std::thread::sleep(spec.steady);
    let steady_ops = app.ops() - steady_ops0;
    let steady_ops_per_s = steady_ops as f64 / ((now_ns() - steady_t0) as f64 / 1e9);

    let mut st = Stamps::default();
    let fam_dir = fam.to_path_buf();
    let result = migrate_with(hosts, &fam_dir, spec, &source, &app, &sampler, &mut st);
    // Let the timeline show the application after the migration.
    if result.is_ok() {
        std::thread::sleep(spec.tail);
    }
    let samples = sampler.finish();
    let total_ops = app.stop();
    let (metrics, target) = result?;
    let ops_at = |t: u64| -> f64 {
        // Interpolated operations count at time t from the samples.
        let i = samples.partition_point(|s| s.0 <= t);
        if i == 0 {
            return samples.first().map_or(0.0, |s| s.1 as f64);
        }
        if i >= samples.len() {
            return samples.last().map_or(0.0, |s| s.1 as f64);
        }
        let (a, b) = (samples[i - 1], samples[i]);
        let f = (t - a.0) as f64 / (b.0 - a.0).max(1) as f64;
        a.1 as f64 + f * (b.1 as f64 - a.1 as f64)
    };
    let window = st.complete.saturating_sub(st.start).max(1);
    let during_ops_per_s = (ops_at(st.complete) - ops_at(st.start)) / (window as f64 / 1e9);
    let timeline = samples
        .windows(2)
        .map(|w| Sample {
            t_ms: (w[1].0 as f64 - st.start as f64) / 1e6,
            ops_per_s: (w[1].1 - w[0].1) as f64 / ((w[1].0 - w[0].0).max(1) as f64 / 1e9),
            present: w[1].2 as f64 / pages as f64,
        })
        .collect();
    // SAFETY: every page is present at the target (the method completed) and nothing writes
    // it any more (the application stopped).
    let copy = unsafe { std::slice::from_raw_parts(target.base() as *const u8, len) };
    workload::verify(copy, spec.seed, total_ops)
        .map_err(|e| format!("{}: the target's copy is wrong: {e}", spec.method.label()))?;
    drop(target);
    Ok(CaseResult {
        metrics,
        steady_ops_per_s,
        during_ops_per_s,
        degradation: during_ops_per_s / steady_ops_per_s.max(1.0),
        timeline,
        verified: true,
    })
}

/// The target's copy of the region, whichever method made it.
enum TargetCopy {
    Fam(FamTarget),
    Socket(SocketTarget),
}

impl TargetCopy {
    fn base(&self) -> *mut u8 {
        match self {
            TargetCopy::Fam(t) => t.regions()[0].as_ptr(),
            TargetCopy::Socket(t) => t.base(),
        }
    }
}

fn listener_in(hosts: &TwoHosts) -> Result<(TcpListener, SocketAddr), String> {
    let l = hosts
        .run_in(Host::Src, || TcpListener::bind((hosts.src_addr(), 0)))
        .map_err(|e| e.to_string())?
        .map_err(|e| format!("page-server listener: {e}"))?;
    let a = l.local_addr().map_err(|e| e.to_string())?;
    Ok((l, a))
}

fn migrate_with(
    hosts: &TwoHosts,
    fam: &Path,
    spec: &CaseSpec,
    source: &Mapping,
    app: &App,
    sampler: &Sampler,
    st: &mut Stamps,
) -> Result<(Metrics, TargetCopy), String> {
    let len = source.len;
    let delay = delay_model(spec.method.delay())?;
    let fam_cfg = |skip: bool| FamSourceConfig {
        fam: fam.to_path_buf(),
        id: spec.id,
        batching: Batching::PerVector,
        delay,
        skip_untouched: skip,
    };
    let region = [(source.ptr as *const u8, len as u64)];
    let poll = Duration::from_micros(50);
    match &spec.method {
        Method::Fam { .. } | Method::FamHot { .. } => {
            let with_hot = matches!(spec.method, Method::FamHot { .. });
            let (listener, addr) = listener_in(hosts)?;
            // The lazy file and the target's memory are reserved while the application runs
            // (a full FAM or a target without room fails here).
            let reserve_t = Instant::now();
            let res = FamSource::reserve(fam_cfg(false), &[len as u64])
                .map_err(|e| format!("reserving FAM: {e}"))?;
            let reserved = TargetMemory::reserve(len)
                .map_err(|e| format!("reserving the target's memory ({len} bytes): {e}"))?;
            // Whether the machine had room for the whole target region besides the rest.
            let reserved_whole = reserved.populated() == reserved.len();
            st.reserve = reserve_t.elapsed().as_nanos() as u64;
            let mut recorder = if with_hot {
                let r = crate::hot::HotPageRecorder::start(source.ptr, len, HOT_CAP)
                    .map_err(|e| format!("hot-page recorder: {e}"))?;
                std::thread::sleep(HOT_WINDOW);
                Some(r)
            } else {
                None
            };
            // The manifest is read just before the freeze (a scan of the whole region is not
            // downtime); the tracker is released after the target resumed.
            let hot = match recorder.as_mut() {
                Some(r) => vec![r.take().map_err(|e| format!("hot pages: {e}"))?],
                None => Vec::new(),
            };
            // Stop tracking before the freeze: the dump discards the source's pages as it goes.
            drop(recorder);
            st.start = now_ns();
            app.freeze();
            // SAFETY: the application is frozen and stays so (it resumes on the target's
            // copy); `source` outlives the scope below, which joins the serving thread.
            let src =
                unsafe { FamSource::checkpoint_reserved_with_hot(res, &region, b"workload", &hot) }
                    .map_err(|e| format!("checkpoint: {e}"))?;
            // Where this machine cannot hold the source, the FAM file and the target at once
            // (source and target share it here), the source gives its pages back as the dump
            // goes. Not otherwise: each release is a TLB shootdown across this process's
            // threads, the target's application among them, which a real source host does not
            // share.
            // SAFETY: the application resumes on the target's copy, and the check reads that
            // copy: nothing reads the source region after the checkpoint but the dumper.
            unsafe { src.set_release_dumped(!reserved_whole) };
            std::thread::scope(|s| {
                let server = s.spawn(|| {
                    let r = src.serve(listener);
                    (r, now_ns())
                });
                let target = hosts
                    .run_in(Host::Dst, || {
                        FamTarget::restore_reserved(
                            fam,
                            spec.id,
                            Some(addr),
                            delay,
                            Duration::from_secs(5),
                            vec![reserved],
                        )
                    })
                    .map_err(|e| e.to_string())?
                    .map_err(|e| format!("restore: {e}"))?;
                let base = target.regions()[0].as_ptr();
                sampler.set_target(base);
                // SAFETY: the target's region is registered and stays mapped until the
                // application is stopped (the harness drops the target last).
                unsafe { app.resume_at(base) };
                st.resume = now_ns();
                // The hot vectors need no prefetch of their own: the source dumps them first and
                // journals them, and the completion installs what the journal shows first.
                target.complete_following(poll);
                st.complete = now_ns();
                // An error from here on: freeze the application before the target's copy goes.
                let (rep, end) = server.join().map_err(|_| {
                    app.freeze();
                    "the source thread panicked".to_string()
                })?;
                let rep = rep.map_err(|e| {
                    app.freeze();
                    format!("source: {e}")
                })?;
                st.busy_end = end;
                let (from_fam, on_demand) = target.fault_counts();
                Ok((
                    Metrics {
                        method: spec.method.name().into(),
                        pages_on_demand: on_demand,
                        faults_from_fam: from_fam,
                        bytes: rep.bytes,
                        ..st.metrics()
                    },
                    TargetCopy::Fam(target),
                ))
            })
        }
        Method::Socket {
            expiration_ms,
            delay: d,
        } => {
            let (listener, addr) = listener_in(hosts)?;
            let sopts = SourceOptions {
                migration_id: spec.id,
                expiration: Duration::from_millis(*expiration_ms),
                delay: delay_model(d)?,
                ..SourceOptions::default()
            };
            let topts = TargetOptions {
                migration_id: spec.id,
                io_timeout: Duration::from_millis(2000 + 2 * expiration_ms),
                ..TargetOptions::default()
            };
            // The target's memory is reserved while the application runs, as for FAM.
            let reservation = SocketReservation::new(len)
                .map_err(|e| format!("reserving the target's memory ({len} bytes): {e}"))?;
            st.reserve = reservation.reserve_ns();
            st.start = now_ns();
            app.freeze();
            // SAFETY: frozen (see above); the slice lives as long as `source`.
            let region = unsafe { std::slice::from_raw_parts(source.ptr as *const u8, len) };
            std::thread::scope(|s| {
                let server = s.spawn(|| SocketSource::freeze_and_serve(region, &listener, &sopts));
                let mut target = hosts
                    .run_in(Host::Dst, || {
                        SocketTarget::connect_reserved(addr, len, &topts, Some(reservation))
                    })
                    .map_err(|e| e.to_string())?
                    .map_err(|e| format!("socket target: {e}"))?;
                sampler.set_target(target.base());
                // SAFETY: as for FAM: the socket target's region lives as long as `target`.
                unsafe { app.resume_at(target.base()) };
                st.resume = now_ns();
                // An error from here on: freeze the application before the target's copy goes.
                let tstats = target.wait().map_err(|e| {
                    app.freeze();
                    format!("socket target: {e}")
                })?;
                st.complete = now_ns();
                let sstats = server
                    .join()
                    .map_err(|_| "the source thread panicked".to_string())
                    .and_then(|r| r.map_err(|e| format!("socket source: {e}")))
                    .inspect_err(|_| app.freeze())?;
                st.busy_end = sstats.busy_end_ns;
                st.complete = st.complete.max(tstats.complete_ns);
                Ok((
                    Metrics {
                        method: "socket".into(),
                        pages_on_demand: tstats.faults_on_demand,
                        faults_from_fam: 0,
                        pages_pushed: sstats.pages_pushed,
                        bytes: sstats.bytes,
                        ..st.metrics()
                    },
                    TargetCopy::Socket(target),
                ))
            })
        }
        Method::StopAndCopy { .. } => {
            let res = FamSource::reserve(fam_cfg(false), &[len as u64])
                .map_err(|e| format!("reserving FAM: {e}"))?;
            st.start = now_ns();
            app.freeze();
            // SAFETY: frozen; nothing else writes `source`.
            let src = unsafe { FamSource::checkpoint_reserved(res, &region, b"workload") }
                .map_err(|e| format!("checkpoint: {e}"))?;
            // Nobody connects: serve returns once the dump is complete and persisted.
            let l = TcpListener::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
            let rep = src.serve(l).map_err(|e| format!("dump: {e}"))?;
            st.busy_end = now_ns();
            let target = resume_from_complete_dump(hosts, fam, spec.id, delay, app, sampler, st)?;
            let (from_fam, on_demand) = target.fault_counts();
            Ok((
                Metrics {
                    method: "stop-and-copy".into(),
                    pages_on_demand: on_demand,
                    faults_from_fam: from_fam,
                    bytes: rep.bytes,
                    ..st.metrics()
                },
                TargetCopy::Fam(target),
            ))
        }
        Method::PreCopy { .. } => {
            let opts = crate::precopy::PreCopyOptions {
                delay,
                ..Default::default()
            };
            st.start = now_ns();
            let mut freeze_at = 0;
            // SAFETY: `source` is this process's private anonymous mapping, written only by
            // the application, which `freeze` stops.
            let rep = unsafe {
                crate::precopy::precopy(
                    fam,
                    spec.id,
                    source.ptr,
                    len as u64,
                    b"workload",
                    &opts,
                    || {
                        freeze_at = now_ns();
                        app.freeze();
                    },
                )
            }
            .map_err(|e| format!("pre-copy: {e}"))?;
            st.busy_end = now_ns();
            let target = resume_from_complete_dump(hosts, fam, spec.id, delay, app, sampler, st)?;
            let (from_fam, on_demand) = target.fault_counts();
            let mut m = st.metrics();
            m.downtime_ns = st.resume.saturating_sub(freeze_at);
            Ok((
                Metrics {
                    method: "pre-copy".into(),
                    pages_on_demand: on_demand,
                    faults_from_fam: from_fam,
                    pages_pushed: rep.metrics.pages_pushed,
                    bytes: rep.metrics.bytes,
                    ..m
                },
                TargetCopy::Fam(target),
            ))
        }
    }
}

/// The target side of the non-live methods (the dump in FAM is complete): restore in the
/// target host, resume the application on the restored copy, install every page behind it.
fn resume_from_complete_dump(
    hosts: &TwoHosts,
    fam: &Path,
    id: u64,
    delay: DelayModel,
    app: &App,
    sampler: &Sampler,
    st: &mut Stamps,
) -> Result<FamTarget, String> {
    let target = hosts
        .run_in(Host::Dst, || {
            FamTarget::restore(fam, id, None, delay, Duration::from_secs(5))
        })
        .map_err(|e| e.to_string())?
        .map_err(|e| format!("restore: {e}"))?;
    let base = target.regions()[0].as_ptr();
    sampler.set_target(base);
    // SAFETY: the target's region is registered and stays mapped until the application is
    // stopped (the harness drops the target last).
    unsafe { app.resume_at(base) };
    st.resume = now_ns();
    target.complete_following(Duration::from_micros(50));
    st.complete = now_ns();
    Ok(target)
}

impl Stamps {
    fn metrics(&self) -> Metrics {
        let since = |t: u64| t.saturating_sub(self.start);
        Metrics {
            downtime_ns: since(self.resume),
            resume_ns: self.complete.saturating_sub(self.resume),
            busy_ns: since(self.busy_end),
            total_ns: since(self.complete),
            reserve_ns: self.reserve,
            ..Metrics::default()
        }
    }
}
