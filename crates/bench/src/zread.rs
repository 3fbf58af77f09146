//! The z-READ half of `tiermem bench iocache`: reads of a warm page cache through `pread`,
//! `read`, `mmap`+`memcpy`, io_uring `READ_FIXED`, [`ZFile::zread`] and [`ZFile::zread_into`]
//! (with and without the loss model), side by side in one run.
//!
//! Each method runs in a worker process of its own (`bench zread-run`), kept for the whole
//! benchmark so that its state (open files, mappings, rings) is set up once, and the cells are
//! run method after method, interleaved per cell. Every thread reads its own file (128 MiB,
//! 32 MiB with `--quick`; §4.4.2), after a warm-up pass over it with the method itself and a
//! short random warm-up; then for a fixed time: random or sequential offsets aligned to the
//! request size, data untouched or summed (every 8-byte word) after each read. Mixes: each
//! operation is a read, or (with the mix's probability) a read, a write of one byte per page of
//! the buffer and a write of the buffer back to the file — `pwrite` for the copy baseline,
//! [`ZFile::write_at`] (exclusive mode) for z-READ.

use crate::progress;
use crate::worker::{self, Worker};
use anyhow::{anyhow, bail, Context, Result};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use tiermem_iocache::{ZFile, ZOptions, ZeroCopy};

const PAGE: usize = 4096;

/// The read methods, in the order they run in each cell.
pub const METHODS: [&str; 7] = [
    "pread",
    "read",
    "mmap_memcpy",
    "io_uring_fixed",
    "zread",
    "zread_into",
    "zread_into_nomodel",
];

/// One cell's request to a method's worker.
#[derive(Serialize, Deserialize, Debug, Clone)]
struct Req {
    method: String,
    files: Vec<PathBuf>,
    size: usize,
    random: bool,
    consume: bool,
    /// Percent of operations that modify the buffer and write it back (0 = pure reads).
    write_pct: u32,
    seconds: f64,
    seed: u64,
    /// On disk: the files' page cache dropped before the cell, no warm-up.
    #[serde(default)]
    cold: bool,
    /// A slice after the first of an interleaved cell: no warm-up, no write-back first.
    #[serde(default)]
    slice: u32,
}

/// One cell's figures from its worker.
#[derive(Serialize, Deserialize, Debug, Clone, Default)]
struct Reply {
    ops: u64,
    bytes: u64,
    wall_s: f64,
    cpu_s: f64,
    /// Pages remapped by zread_into, and how many requests the model copied (z-READ methods).
    remapped_pages: u64,
    model_copies: u64,
    into_calls: u64,
    zero_copy_views: u64,
    /// On disk: the files' pages still cached when the cell started (after the drop).
    #[serde(default)]
    cached_before: u64,
}

impl Reply {
    /// Adds another slice of the same cell.
    fn add(&mut self, o: &Reply) {
        self.ops += o.ops;
        self.bytes += o.bytes;
        self.wall_s += o.wall_s;
        self.cpu_s += o.cpu_s;
        self.remapped_pages += o.remapped_pages;
        self.model_copies += o.model_copies;
        self.into_calls += o.into_calls;
        self.zero_copy_views += o.zero_copy_views;
    }
}

/// The methods of the read/write mix cells.
const MIX_METHODS: [&str; 3] = ["pread", "zread_into", "zread_into_nomodel"];

/// One row of the z-READ report (the median of the repetitions).
#[derive(Serialize, Debug, Clone)]
pub struct ZreadRow {
    /// `pread`, `read`, `mmap_memcpy`, `io_uring_fixed`, `zread`, `zread_into` (loss model on)
    /// or `zread_into_nomodel` (always remap).
    pub method: String,
    /// Request size in bytes.
    pub size: usize,
    /// `random`, `sequential`, or `random_on_disk` (the page cache dropped first, no warm-up).
    pub pattern: String,
    /// Threads, each on its own file.
    pub threads: usize,
    /// Data summed after each read.
    pub consume: bool,
    /// Percent of operations that also modify the buffer and write it back.
    pub write_pct: u32,
    /// Bytes read per second, GiB (median).
    pub gib_per_s: f64,
    /// Smallest and largest of the repetitions.
    pub gib_per_s_min: f64,
    /// See `gib_per_s_min`.
    pub gib_per_s_max: f64,
    /// Operations per second (median run).
    pub ops_per_s: f64,
    /// CPU seconds per second of wall time of the worker (median run).
    pub cpu_per_wall: f64,
    /// zread_into: share of requests (warm-up included) the loss model sent to the copy path.
    pub model_copy_share: Option<f64>,
}

/// What the z-READ half reports into `bench iocache`.
#[derive(Default)]
pub struct ZreadResult {
    /// All cells.
    pub rows: Vec<ZreadRow>,
    /// The loss model measured by a worker (Table 4.2 re-measured).
    pub model: serde_json::Value,
    /// Ratios and their notes.
    pub keys: HashMap<&'static str, f64>,
    /// Configuration echoed into the report.
    pub config: serde_json::Value,
    /// Why fio did not run, if it did not.
    pub fio_note: Option<String>,
}

/// The worker side: answers cells for one method.
pub fn run_worker_main() -> Result<()> {
    let mut st = WorkerState::default();
    worker::serve(|r: Req| Ok(Some(serde_json::to_value(st.cell(&r)?)?)))
}

#[derive(Default)]
struct WorkerState {
    zfiles: HashMap<(PathBuf, bool), ZFile>,
    files: HashMap<PathBuf, std::fs::File>,
    maps: HashMap<PathBuf, (usize, usize)>,
}

/// Page-aligned memory for a thread's buffer.
struct Buf(tiermem_iocache::sys::AnonMap);

impl Buf {
    fn new(len: usize) -> Result<Buf> {
        Ok(Buf(tiermem_iocache::sys::AnonMap::new(len.max(PAGE))?))
    }
    fn get(&mut self, len: usize) -> &mut [u8] {
        // SAFETY: the mapping is at least len bytes (new) and only this thread uses it.
        unsafe { std::slice::from_raw_parts_mut(self.0.as_ptr(), len) }
    }
}

/// The data's sum when the cell consumes it (every 8-byte word), else nothing is touched.
fn digest(b: &[u8], consume: bool) -> u64 {
    if consume {
        sum_words(b)
    } else {
        0
    }
}

fn sum_words(b: &[u8]) -> u64 {
    b.chunks_exact(8)
        .map(|c| u64::from_le_bytes(c.try_into().unwrap_or([0; 8])))
        .fold(0u64, |a, x| a.wrapping_add(x))
}

/// One thread's reader, owning what its method needs.
enum Reader {
    Pread(std::fs::File),
    Read(std::fs::File),
    Mmap {
        file: std::fs::File,
        base: usize,
    },
    Uring {
        file: std::fs::File,
        ring: Box<io_uring::IoUring>,
    },
    Zread(ZFile),
    ZreadInto(ZFile),
}

impl WorkerState {
    fn file(&mut self, p: &Path, write: bool) -> Result<std::fs::File> {
        if !self.files.contains_key(p) {
            let f = std::fs::OpenOptions::new()
                .read(true)
                .write(write)
                .open(p)
                .with_context(|| format!("open {}", p.display()))?;
            self.files.insert(p.to_path_buf(), f);
        }
        Ok(self.files[p].try_clone()?)
    }

    fn reader(&mut self, r: &Req, p: &Path) -> Result<Reader> {
        let mix = r.write_pct > 0;
        Ok(match r.method.as_str() {
            "pread" => Reader::Pread(self.file(p, mix)?),
            "read" => Reader::Read(self.file(p, mix)?),
            "mmap_memcpy" => {
                let file = self.file(p, mix)?;
                let len = file.metadata()?.len() as usize;
                let base = match self.maps.get(p) {
                    Some(&(b, _)) => b,
                    None => {
                        // SAFETY: a fresh shared read-only mapping of the file, kept for the
                        // worker's life (never unmapped while readers use it).
                        let b = unsafe {
                            libc::mmap(
                                std::ptr::null_mut(),
                                len,
                                libc::PROT_READ,
                                libc::MAP_SHARED,
                                file.as_raw_fd(),
                                0,
                            )
                        };
                        if b == libc::MAP_FAILED {
                            bail!("mmap {}: {}", p.display(), std::io::Error::last_os_error());
                        }
                        self.maps.insert(p.to_path_buf(), (b as usize, len));
                        b as usize
                    }
                };
                Reader::Mmap { file, base }
            }
            "io_uring_fixed" => Reader::Uring {
                file: self.file(p, mix)?,
                ring: Box::new(io_uring::IoUring::new(8).context("io_uring setup")?),
            },
            m @ ("zread" | "zread_into" | "zread_into_nomodel") => {
                let key = (p.to_path_buf(), mix);
                let z = match self.zfiles.get(&key) {
                    Some(z) => z.clone(),
                    None => {
                        let z = ZFile::open(
                            p,
                            ZOptions {
                                zero_copy: if mix {
                                    ZeroCopy::Exclusive
                                } else {
                                    ZeroCopy::Lease
                                },
                                model: m != "zread_into_nomodel",
                                ..ZOptions::default()
                            },
                        )?;
                        if let Some(why) = z.zero_copy_reason() {
                            bail!("{}: no zero copy: {why}", p.display());
                        }
                        self.zfiles.insert(key, z.clone());
                        z
                    }
                };
                if m == "zread" {
                    Reader::Zread(z)
                } else {
                    Reader::ZreadInto(z)
                }
            }
            m => bail!("unknown method {m}"),
        })
    }

    /// Lets go of every page this worker keeps mapped (views, mmap), so that dropping the page
    /// cache drops the files.
    fn release(&mut self) {
        for z in self.zfiles.values() {
            z.zap_now();
        }
        for (_, (base, len)) in self.maps.drain() {
            // SAFETY: a mapping this worker made and no reader uses between cells.
            unsafe { libc::munmap(base as *mut libc::c_void, len) };
        }
    }

    fn cell(&mut self, r: &Req) -> Result<Reply> {
        if r.method == "release" {
            self.release();
            return Ok(Reply::default());
        }
        if r.method == "stream" {
            return stream(r.seconds);
        }
        let mut cached_before = 0;
        if r.cold {
            for p in &r.files {
                crate::iocache::drop_cache(p)?;
                let f = std::fs::File::open(p)?;
                cached_before += tiermem_iocache::sys::cachestat(f.as_raw_fd(), 0, 0)?.nr_cache;
            }
        }
        if r.write_pct > 0 && r.slice == 0 {
            // The previous cell's write-backs go to the device now, not during this cell's
            // timing (the flusher would otherwise run in whichever method's cell comes later).
            for p in &r.files {
                std::fs::File::open(p)?.sync_data()?;
            }
        }
        let mut readers = Vec::new();
        for p in &r.files {
            readers.push((self.reader(r, p)?, std::fs::metadata(p)?.len()));
        }
        let before: Vec<_> = readers
            .iter()
            .map(|(rd, _)| match rd {
                Reader::Zread(z) | Reader::ZreadInto(z) => Some(z.stats()),
                _ => None,
            })
            .collect();
        let c0 = crate::cpu::process_ns();
        let t0 = Instant::now();
        let results: Vec<Result<(u64, u64)>> = std::thread::scope(|s| {
            let hs: Vec<_> = readers
                .iter_mut()
                .enumerate()
                .map(|(i, (rd, len))| {
                    let len = *len;
                    s.spawn(move || thread_body(rd, len, r, r.seed + i as u64))
                })
                .collect();
            hs.into_iter()
                .map(|h| {
                    h.join()
                        .unwrap_or_else(|_| Err(anyhow!("a reader panicked")))
                })
                .collect()
        });
        let wall_s = t0.elapsed().as_secs_f64();
        let cpu_s = (crate::cpu::process_ns() - c0) as f64 / 1e9;
        let mut out = Reply {
            wall_s,
            cpu_s,
            cached_before,
            ..Reply::default()
        };
        for res in results {
            let (ops, bytes) = res?;
            out.ops += ops;
            out.bytes += bytes;
        }
        for ((rd, _), b) in readers.iter().zip(before) {
            if let (Reader::Zread(z) | Reader::ZreadInto(z), Some(b)) = (rd, b) {
                let a = z.stats();
                out.remapped_pages += a.into_remapped_pages - b.into_remapped_pages;
                out.model_copies += a.model_copies - b.model_copies;
                out.into_calls += a.into_calls - b.into_calls;
                out.zero_copy_views += a.zero_copy_views - b.zero_copy_views;
            }
        }
        Ok(out)
    }
}

/// Reads at `off` into the thread's buffer (or a view); returns a value derived from the data
/// when `consume`, and whether the buffer is now modifiable (to write back).
fn one_read(rd: &mut Reader, buf: &mut Buf, off: u64, size: usize, consume: bool) -> Result<u64> {
    Ok(match rd {
        Reader::Pread(f) => {
            let b = buf.get(size);
            f.read_exact_at(b, off)?;
            digest(b, consume)
        }
        Reader::Read(f) => {
            let b = buf.get(size);
            // SAFETY: lseek and read on an owned fd into a live buffer of `size` bytes.
            let n = unsafe {
                libc::lseek(f.as_raw_fd(), off as libc::off_t, libc::SEEK_SET);
                libc::read(f.as_raw_fd(), b.as_mut_ptr().cast(), size)
            };
            if n != size as isize {
                bail!("read returned {n}");
            }
            digest(b, consume)
        }
        Reader::Mmap { base, .. } => {
            let b = buf.get(size);
            // SAFETY: off + size ≤ the file's length, inside the worker's mapping of it.
            let src =
                unsafe { std::slice::from_raw_parts((*base + off as usize) as *const u8, size) };
            b.copy_from_slice(src);
            digest(b, consume)
        }
        Reader::Uring { file, ring } => {
            let b = buf.get(size);
            let e = io_uring::opcode::ReadFixed::new(
                io_uring::types::Fd(file.as_raw_fd()),
                b.as_mut_ptr(),
                size as u32,
                0,
            )
            .offset(off)
            .build();
            // SAFETY: the buffer is registered (index 0) and outlives the operation, which is
            // waited for below.
            unsafe { ring.submission().push(&e) }.map_err(|_| anyhow!("sq full"))?;
            ring.submit_and_wait(1)?;
            let cqe = ring.completion().next().ok_or_else(|| anyhow!("no cqe"))?;
            if cqe.result() != size as i32 {
                bail!("READ_FIXED returned {}", cqe.result());
            }
            digest(b, consume)
        }
        Reader::Zread(z) => {
            let v = z.zread(off, size)?;
            if v.len() != size {
                bail!("short view");
            }
            digest(&v, consume)
        }
        Reader::ZreadInto(z) => {
            let b = buf.get(size);
            if z.zread_into(off, b)? != size {
                bail!("short zread_into");
            }
            digest(b, consume)
        }
    })
}

fn write_back(rd: &mut Reader, buf: &mut Buf, off: u64, size: usize) -> Result<()> {
    let b = buf.get(size);
    for p in (0..size).step_by(PAGE) {
        b[p] = b[p].wrapping_add(1);
    }
    match rd {
        Reader::Pread(f)
        | Reader::Read(f)
        | Reader::Mmap { file: f, .. }
        | Reader::Uring { file: f, .. } => f.write_all_at(b, off)?,
        Reader::ZreadInto(z) | Reader::Zread(z) => z.write_at(off, b)?,
    }
    Ok(())
}

fn thread_body(rd: &mut Reader, len: u64, r: &Req, seed: u64) -> Result<(u64, u64)> {
    let size = r.size;
    let slots = len / size as u64;
    if slots == 0 {
        bail!("file smaller than one request");
    }
    let mut buf = Buf::new(size)?;
    if let Reader::Uring { ring, .. } = rd {
        let iov = libc::iovec {
            iov_base: buf.0.as_ptr().cast(),
            iov_len: size.max(PAGE),
        };
        // SAFETY: the buffer lives until the thread returns, after the ring's last operation;
        // registering again replaces nothing (each cell makes a new ring).
        unsafe { ring.submitter().register_buffers(&[iov]) }.context("register_buffers")?;
    }
    let mut rng = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut next = |i: u64| -> u64 {
        if r.random {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            (rng % slots) * size as u64
        } else {
            (i % slots) * size as u64
        }
    };
    let mut acc = 0u64;
    // Warm-up: one sequential pass with the method itself, then a short random phase (none on
    // disk).
    let warm = !r.cold && r.slice == 0;
    for s in (0..slots).filter(|_| warm) {
        acc = acc.wrapping_add(one_read(rd, &mut buf, s * size as u64, size, r.consume)?);
    }
    let warm_until =
        Instant::now() + Duration::from_secs_f64(if warm { r.seconds / 4.0 } else { 0.0 });
    let mut i = 0u64;
    while Instant::now() < warm_until {
        for _ in 0..32 {
            let off = next(i);
            acc = acc.wrapping_add(one_read(rd, &mut buf, off, size, r.consume)?);
            i += 1;
        }
    }
    let mut dice = seed ^ 0xd1ce_5eed;
    let t_end = Instant::now() + Duration::from_secs_f64(r.seconds);
    let mut ops = 0u64;
    loop {
        for _ in 0..16 {
            let off = next(i);
            i += 1;
            acc = acc.wrapping_add(one_read(rd, &mut buf, off, size, r.consume)?);
            if r.write_pct > 0 {
                dice = dice
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                if ((dice >> 33) % 100) < r.write_pct as u64 {
                    write_back(rd, &mut buf, off, size)?;
                }
            }
            ops += 1;
        }
        // On disk: a quarter of the file's requests (mostly misses), not a time: the page cache
        // would hold the whole file within the cell.
        if if r.cold {
            ops >= slots / 4
        } else {
            Instant::now() >= t_end
        } {
            break;
        }
    }
    std::hint::black_box(acc);
    Ok((ops, ops * size as u64))
}

/// The co-runner (§4.4.5): one thread copying a 64 MiB buffer into another for `seconds`, a
/// memory-bandwidth-bound program beside the readers.
fn stream(seconds: f64) -> Result<Reply> {
    const LEN: usize = 64 << 20;
    let a = tiermem_iocache::sys::AnonMap::new(LEN)?;
    let b = tiermem_iocache::sys::AnonMap::new(LEN)?;
    // SAFETY: both mappings are LEN bytes, owned here, disjoint.
    let (src, dst) = unsafe {
        (
            std::slice::from_raw_parts_mut(a.as_ptr(), LEN),
            std::slice::from_raw_parts_mut(b.as_ptr(), LEN),
        )
    };
    src.fill(1);
    dst.fill(2);
    let c0 = crate::cpu::process_ns();
    let t0 = Instant::now();
    let end = t0 + Duration::from_secs_f64(seconds);
    let mut bytes = 0u64;
    while Instant::now() < end {
        for (d, s) in dst.chunks_mut(1 << 20).zip(src.chunks(1 << 20)) {
            d.copy_from_slice(s);
            bytes += s.len() as u64;
        }
        std::hint::black_box(&dst[0]);
    }
    Ok(Reply {
        ops: bytes >> 20,
        bytes,
        wall_s: t0.elapsed().as_secs_f64(),
        cpu_s: (crate::cpu::process_ns() - c0) as f64 / 1e9,
        ..Reply::default()
    })
}

/// The co-runner's slowdown: its copy rate alone, then beside one reader thread of `pread`
/// and of `zread` (128 KiB random reads of a warm file, data untouched), each pair run at once
/// (2 CPUs: one each). Rows `corunner_alone`, `corunner_with_pread`, `corunner_with_zread`
/// (GiB/s copied by the co-runner).
fn corunner(
    workers: &mut HashMap<&str, Worker>,
    stream_w: &mut Worker,
    file: &Path,
    seconds: f64,
    reps: usize,
) -> Result<Vec<ZreadRow>> {
    let sreq = Req {
        method: "stream".into(),
        seconds,
        ..release_req()
    };
    let mut runs: HashMap<&str, Vec<f64>> = HashMap::new();
    for rep in 0..reps {
        progress::note(&format!("z-READ: co-runner (rep {})", rep + 1));
        let alone: Reply = stream_w.call(&sreq, "the co-runner")?;
        runs.entry("corunner_alone")
            .or_default()
            .push(alone.bytes as f64 / alone.wall_s);
        for m in ["pread", "zread"] {
            let rd = workers.get_mut(m).ok_or_else(|| anyhow!("no worker {m}"))?;
            let req = Req {
                method: m.into(),
                files: vec![file.to_path_buf()],
                size: 131072,
                random: true,
                consume: false,
                write_pct: 0,
                seconds,
                seed: 99 + rep as u64,
                cold: false,
                slice: 0,
            };
            // The reader warms up (a pass and a quarter of the time) before its timed phase;
            // the co-runner starts with it and runs as long, overlapping the timed phase.
            let (s, r) = std::thread::scope(|sc| {
                let h = sc.spawn(|| stream_w.call::<Reply>(&sreq, "the co-runner"));
                let r = rd.call::<Reply>(&req, "a reader beside the co-runner");
                (
                    h.join().map_err(|_| anyhow!("co-runner thread panicked")),
                    r,
                )
            });
            let s = s??;
            r?;
            runs.entry(if m == "pread" {
                "corunner_with_pread"
            } else {
                "corunner_with_zread"
            })
            .or_default()
            .push(s.bytes as f64 / s.wall_s);
        }
    }
    let mut rows = Vec::new();
    for k in [
        "corunner_alone",
        "corunner_with_pread",
        "corunner_with_zread",
    ] {
        let mut v = runs.remove(k).unwrap_or_default();
        if v.is_empty() {
            continue;
        }
        v.sort_by(|a, b| a.total_cmp(b));
        let g = |x: f64| r3(x / (1u64 << 30) as f64);
        rows.push(ZreadRow {
            method: k.to_string(),
            size: 131072,
            pattern: "random".into(),
            threads: 1,
            consume: false,
            write_pct: 0,
            gib_per_s: g(v[v.len() / 2]),
            gib_per_s_min: g(v[0]),
            gib_per_s_max: g(v[v.len() - 1]),
            ops_per_s: 0.0,
            cpu_per_wall: 1.0,
            model_copy_share: None,
        });
    }
    Ok(rows)
}

fn release_req() -> Req {
    Req {
        method: "release".into(),
        files: Vec::new(),
        size: PAGE,
        random: false,
        consume: false,
        write_pct: 0,
        seconds: 0.0,
        seed: 0,
        cold: false,
        slice: 0,
    }
}

/// Writes `threads` files of `bytes` each (pseudo-random words) under `dir`, read once so the
/// page cache holds them (warm, §4.4.2).
fn make_files(dir: &Path, prefix: &str, threads: usize, bytes: usize) -> Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    for t in 0..threads {
        let p = dir.join(format!("{prefix}-{t}-{}", std::process::id()));
        let f = std::fs::File::create(&p).with_context(|| format!("create {}", p.display()))?;
        let mut x = 0x1234_5678u64 + t as u64;
        let chunk: Vec<u8> = (0..1 << 20)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect();
        for o in (0..bytes).step_by(chunk.len()) {
            f.write_all_at(&chunk, o as u64)?;
        }
        f.sync_all()?;
        out.push(p);
    }
    Ok(out)
}

/// Seconds per method of a read/write mix cell, with and without --quick.
const MIX_SECONDS: f64 = 1.0;

/// Cells: (size, random, threads, consume, write_pct, methods, on disk).
type Cell = (usize, bool, usize, bool, u32, Vec<&'static str>, bool);

fn cells(quick: bool) -> Vec<Cell> {
    let all: Vec<&'static str> = METHODS.to_vec();
    let mix: Vec<&'static str> = MIX_METHODS.to_vec();
    let mut c = Vec::new();
    let threads: &[usize] = if quick { &[2] } else { &[1, 2] };
    for &t in threads {
        for &size in &[4096usize, 16384, 131072] {
            c.push((size, true, t, false, 0, all.clone(), false));
            if !quick || size == 16384 {
                c.push((size, true, t, true, 0, all.clone(), false));
            }
        }
    }
    if !quick {
        for &size in &[4096usize, 16384, 131072] {
            c.push((size, false, 2, false, 0, all.clone(), false));
        }
    }
    for &size in &[16384usize, 131072] {
        for &w in &[0u32, 10, 25, 50] {
            c.push((size, true, 2, false, w, mix.clone(), false));
        }
    }
    // On disk (every worker lets go of its mappings first).
    c.push((
        16384,
        true,
        2,
        false,
        0,
        vec!["pread", "zread", "zread_into"],
        true,
    ));
    c
}

/// Runs the z-READ cells: `reps` repetitions of every cell, methods interleaved.
pub fn run(dir: &Path, quick: bool, reps: usize) -> Result<ZreadResult> {
    let file_bytes = if quick { 32 << 20 } else { 128 << 20 };
    let seconds = if quick { 0.3 } else { 1.0 };
    std::fs::create_dir_all(dir)?;
    progress::note(&format!(
        "z-READ: writing 4 files of {} MiB in {}",
        file_bytes >> 20,
        dir.display()
    ));
    let read_files = make_files(dir, "zread", 2, file_bytes)?;
    let mix_files = make_files(dir, "zmix", 2, file_bytes)?;
    let cleanup: Vec<PathBuf> = read_files.iter().chain(&mix_files).cloned().collect();
    let _rm = RemoveOnDrop(cleanup.clone());
    let cells = cells(quick);
    progress::grow((cells.len() * reps) as u64);
    let mut workers: HashMap<&str, Worker> = HashMap::new();
    for m in METHODS {
        workers.insert(
            m,
            Worker::spawn(
                &format!("zread {m}"),
                &["bench".to_string(), "zread-run".to_string()],
                Duration::from_secs(600),
                Vec::new(),
            )?,
        );
    }
    let mut runs: Vec<HashMap<&str, Vec<Reply>>> = vec![HashMap::new(); cells.len()];
    for rep in 0..reps {
        for (ci, (size, random, threads, consume, w, methods, cold)) in cells.iter().enumerate() {
            progress::step(&format!(
                "z-READ {} KiB {} {}t{}{}{} (rep {})",
                size / 1024,
                if *random { "random" } else { "seq" },
                threads,
                if *consume { " summed" } else { "" },
                if *w > 0 {
                    format!(" {}:{}", 100 - w, w)
                } else {
                    String::new()
                },
                if *cold { " on disk" } else { "" },
                rep + 1
            ));
            // Rotate the order per repetition so no method always runs first. The mix cells,
            // whose ratios are the must-have compared at ~0.95, run in slices, the methods
            // taking turns: each method's figure is the sum over slices spread across the same
            // seconds, so the host's drift falls on all of them alike. They run as long as in
            // the full run also with --quick (its 0.3 s in 6 slices left the worst of the eight
            // ratios 0.93–0.97 between runs of the same code).
            let n = methods.len();
            let mix_cell = methods.len() == MIX_METHODS.len() && !*cold;
            let slices: u32 = if mix_cell { 10 } else { 1 };
            let cell_seconds = if mix_cell { MIX_SECONDS } else { seconds };
            for slice in 0..slices {
                for k in 0..n {
                    let m = methods[(k + rep + ci) % n];
                    let files = if *w > 0 { &mix_files } else { &read_files };
                    let req = Req {
                        method: m.to_string(),
                        files: files[..*threads].to_vec(),
                        size: *size,
                        random: *random,
                        consume: *consume,
                        write_pct: *w,
                        seconds: cell_seconds / slices as f64,
                        seed: 7 + rep as u64 * 1000 + slice as u64,
                        cold: *cold,
                        slice,
                    };
                    if *cold {
                        // Every worker lets go of the pages it keeps mapped, or they stay cached.
                        for w in METHODS {
                            if let Some(wk) = workers.get_mut(w) {
                                let _: Reply = wk.call(&release_req(), "release")?;
                            }
                        }
                    }
                    let wk = workers.get_mut(m).ok_or_else(|| anyhow!("no worker {m}"))?;
                    let got: Reply = wk.call(&req, "a cell")?;
                    if *cold && got.cached_before > 0 {
                        progress::note(&format!(
                            "z-READ on disk: {m} started with {} of the files' pages still cached",
                            got.cached_before
                        ));
                    }
                    let v = runs[ci].entry(m).or_default();
                    if slice == 0 {
                        v.push(got);
                    } else if let Some(last) = v.last_mut() {
                        last.add(&got);
                    }
                }
            }
        }
    }
    let mut stream_w = Worker::spawn(
        "zread co-runner",
        &["bench".to_string(), "zread-run".to_string()],
        Duration::from_secs(600),
        Vec::new(),
    )?;
    let co_rows = corunner(&mut workers, &mut stream_w, &read_files[0], seconds, reps)?;
    stream_w.finish()?;
    for (_, w) in workers.drain() {
        w.finish()?;
    }
    // GiB/s per cell and method in repetition order, for the ratios within a repetition.
    let per_rep: Vec<HashMap<&str, Vec<f64>>> = runs
        .iter()
        .map(|c| {
            c.iter()
                .map(|(m, v)| {
                    let g = v
                        .iter()
                        .map(|r| r.bytes as f64 / r.wall_s / (1u64 << 30) as f64);
                    (*m, g.collect())
                })
                .collect()
        })
        .collect();
    let mut rows = Vec::new();
    for (ci, (size, random, threads, consume, w, methods, cold)) in cells.iter().enumerate() {
        for m in methods {
            let mut v = runs[ci].remove(m).unwrap_or_default();
            if v.is_empty() {
                continue;
            }
            let g = |r: &Reply| r.bytes as f64 / r.wall_s / (1u64 << 30) as f64;
            v.sort_by(|a, b| g(a).total_cmp(&g(b)));
            let med = v[v.len() / 2].clone();
            let into = m.starts_with("zread_into");
            rows.push(ZreadRow {
                method: m.to_string(),
                size: *size,
                pattern: match (*cold, *random) {
                    (true, _) => "random_on_disk",
                    (false, true) => "random",
                    (false, false) => "sequential",
                }
                .into(),
                threads: *threads,
                consume: *consume,
                write_pct: *w,
                gib_per_s: r3(g(&med)),
                gib_per_s_min: r3(g(&v[0])),
                gib_per_s_max: r3(g(&v[v.len() - 1])),
                ops_per_s: (med.ops as f64 / med.wall_s).round(),
                cpu_per_wall: r3(med.cpu_s / med.wall_s),
                model_copy_share: into
                    .then(|| r3(med.model_copies as f64 / med.into_calls.max(1) as f64)),
            });
        }
    }
    // A ratio key is the median over repetitions of the ratio within one repetition: the two
    // methods ran back to back there, so drift between repetitions (the host, write-back)
    // cancels instead of adding to the spread.
    let ratio = |m: &str, size: usize, consume: bool, w: u32| {
        let ci = cells
            .iter()
            .position(|c| c.0 == size && c.1 && c.2 == 2 && c.3 == consume && c.4 == w && !c.6)?;
        let (a, b) = (per_rep[ci].get(m)?, per_rep[ci].get("pread")?);
        let mut r: Vec<f64> = a.iter().zip(b).map(|(x, y)| x / y).collect();
        r.sort_by(f64::total_cmp);
        r.get(r.len() / 2).copied()
    };
    let mut keys = HashMap::new();
    let mut put = |k: &'static str, v: Option<f64>| {
        if let Some(v) = v {
            keys.insert(k, r3(v));
        }
    };
    put("zread_over_read_4k", ratio("zread", 4096, false, 0));
    put("zread_over_read_16k", ratio("zread", 16384, false, 0));
    put("zread_over_read_128k", ratio("zread", 131072, false, 0));
    put(
        "zread_over_read_16k_consumed",
        ratio("zread", 16384, true, 0),
    );
    let disk = |m: &str| {
        rows.iter()
            .find(|r| r.method == m && r.pattern == "random_on_disk")
            .map(|r| r.gib_per_s)
    };
    put(
        "zread_over_read_16k_on_disk",
        disk("zread").zip(disk("pread")).map(|(a, b)| a / b),
    );
    put(
        "zread_into_over_read_16k_on_disk",
        disk("zread_into").zip(disk("pread")).map(|(a, b)| a / b),
    );
    put(
        "zread_into_over_read_16k",
        ratio("zread_into", 16384, false, 0),
    );
    put(
        "zread_into_over_read_128k",
        ratio("zread_into", 131072, false, 0),
    );
    let mins: Vec<f64> = [16384usize, 131072]
        .iter()
        .flat_map(|&s| [0u32, 10, 25, 50].map(|w| ratio("zread_into", s, false, w)))
        .flatten()
        .collect();
    if mins.len() == 8 {
        put(
            "zread_into_min_over_read",
            mins.iter().copied().reduce(f64::min),
        );
    }
    put(
        "zread_into_nomodel_over_read_16k_50_50",
        ratio("zread_into_nomodel", 16384, false, 50),
    );
    put(
        "zread_into_nomodel_over_read_128k_50_50",
        ratio("zread_into_nomodel", 131072, false, 50),
    );
    let co = |m: &str| co_rows.iter().find(|r| r.method == m).map(|r| r.gib_per_s);
    // Slowdown = the co-runner's time to do its work beside the reader over alone, minus 1.
    put(
        "corunner_slowdown_pread",
        co("corunner_alone")
            .zip(co("corunner_with_pread"))
            .map(|(a, w)| a / w - 1.0),
    );
    put(
        "corunner_slowdown_zread",
        co("corunner_alone")
            .zip(co("corunner_with_zread"))
            .map(|(a, w)| a / w - 1.0),
    );
    rows.extend(co_rows);
    let (fio_rows, fio_note) = fio(&read_files, quick, reps);
    rows.extend(fio_rows);
    put(
        "fio_zread_preload_over_plain_16k",
        fio_ratio(&rows, "fio_zread_preload", 16384),
    );
    put(
        "fio_zread_preload_nomodel_over_plain_16k",
        fio_ratio(&rows, "fio_zread_preload_nomodel", 16384),
    );
    let model = measure_model(dir)?;
    Ok(ZreadResult {
        fio_note,
        rows,
        model,
        keys,
        config: serde_json::json!({
            "file_bytes_per_thread": file_bytes,
            "seconds_per_cell": seconds,
            "repetitions": reps,
            "warm_up": "a sequential pass with the method, then a quarter of the cell's time of its own pattern",
            "mix": "write_pct of the operations modify one byte per page of the buffer and write it back (pwrite; z-READ: write_at in exclusive mode)",
        }),
    })
}

/// The loss model as a fresh process measures it (Table 4.2 re-measured).
fn measure_model(dir: &Path) -> Result<serde_json::Value> {
    let m = tiermem_iocache::Model::calibrate(dir, 101)?;
    let rows: Vec<_> = m
        .rows
        .iter()
        .map(|r| {
            serde_json::json!({
                "pages": r.pages,
                "read_ns": r.read_ns.round(),
                "read_mod_ns": r.read_mod_ns.round(),
                "zread_ns": r.zread_ns.round(),
                "zread_mod_cow_ns": r.zread_mod_cow_ns.round(),
                "read_minus_zread_ns": r.saving_ns().round(),
                "cow_ns": r.cow_ns().round(),
            })
        })
        .collect();
    Ok(serde_json::Value::Array(rows))
}

struct RemoveOnDrop(Vec<PathBuf>);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        for p in &self.0 {
            let _ = std::fs::remove_file(p);
        }
    }
}

fn r3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

/// The preload library: `$TIERMEM_ZREAD_PRELOAD`, else `libtiermem_zread_preload.so` next to
/// this executable (`cargo build --release --workspace` puts it there).
fn preload_lib() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("TIERMEM_ZREAD_PRELOAD") {
        return Some(PathBuf::from(p));
    }
    let exe = std::env::current_exe().ok()?;
    let p = exe.parent()?.join("libtiermem_zread_preload.so");
    p.exists().then_some(p)
}

/// Unmodified fio, random reads of the warm files with two jobs (one file each), plain and
/// through `libtiermem_zread_preload.so` (loss model on, and off: remap whenever aligned).
fn fio(files: &[PathBuf], quick: bool, reps: usize) -> (Vec<ZreadRow>, Option<String>) {
    let Some(lib) = preload_lib() else {
        return (
            Vec::new(),
            Some("fio through the preload: libtiermem_zread_preload.so not found next to this executable (set TIERMEM_ZREAD_PRELOAD)".into()),
        );
    };
    if std::process::Command::new("fio")
        .arg("--version")
        .output()
        .is_err()
    {
        return (
            Vec::new(),
            Some(
                "fio through the preload: fio is not installed (scripts/setup.sh installs it)"
                    .into(),
            ),
        );
    }
    let runtime = if quick { 1 } else { 3 };
    let variants = [
        "fio_psync",
        "fio_zread_preload",
        "fio_zread_preload_nomodel",
    ];
    let mut out = Vec::new();
    for size in [4096usize, 16384] {
        let mut runs: HashMap<&str, Vec<(f64, f64)>> = HashMap::new();
        for rep in 0..reps {
            for k in 0..variants.len() {
                let v = variants[(k + rep) % variants.len()];
                progress::note(&format!(
                    "z-READ: {v} {} KiB (rep {})",
                    size / 1024,
                    rep + 1
                ));
                let mut cmd = std::process::Command::new("fio");
                cmd.args([
                    "--readonly",
                    "--ioengine=psync",
                    "--rw=randread",
                    &format!("--bs={size}"),
                    "--time_based",
                    &format!("--runtime={runtime}"),
                    "--iomem_align=4096",
                    "--invalidate=0",
                    "--group_reporting",
                    "--output-format=json",
                ]);
                for (i, f) in files.iter().enumerate() {
                    cmd.arg(format!("--name=j{i}"));
                    cmd.arg(format!("--filename={}", f.display()));
                }
                if v != "fio_psync" {
                    cmd.env("LD_PRELOAD", &lib);
                    let names: Vec<String> =
                        files.iter().map(|f| f.display().to_string()).collect();
                    cmd.env("TIERMEM_ZREAD", names.join(":"));
                    if v.ends_with("nomodel") {
                        cmd.env("TIERMEM_ZREAD_MODEL", "0");
                    }
                }
                let res = cmd.output();
                let Ok(o) = res else {
                    return (out, Some("fio could not be started".into()));
                };
                if !o.status.success() {
                    return (
                        out,
                        Some(format!(
                            "fio failed ({v}): {}",
                            String::from_utf8_lossy(&o.stderr)
                                .lines()
                                .last()
                                .unwrap_or("")
                        )),
                    );
                }
                let j: serde_json::Value = match serde_json::from_slice(&o.stdout) {
                    Ok(j) => j,
                    Err(e) => return (out, Some(format!("fio's JSON: {e}"))),
                };
                let job = &j["jobs"][0];
                let bw = job["read"]["bw_bytes"].as_f64().unwrap_or(0.0);
                let cpu = (job["usr_cpu"].as_f64().unwrap_or(0.0)
                    + job["sys_cpu"].as_f64().unwrap_or(0.0))
                    / 100.0;
                runs.entry(v)
                    .or_default()
                    .push((bw / (1u64 << 30) as f64, cpu));
            }
        }
        for v in variants {
            let mut r = runs.remove(v).unwrap_or_default();
            if r.is_empty() {
                continue;
            }
            r.sort_by(|a, b| a.0.total_cmp(&b.0));
            let (g, cpu) = r[r.len() / 2];
            out.push(ZreadRow {
                method: v.to_string(),
                size,
                pattern: "random".into(),
                threads: files.len(),
                consume: false,
                write_pct: 0,
                gib_per_s: r3(g),
                gib_per_s_min: r3(r[0].0),
                gib_per_s_max: r3(r[r.len() - 1].0),
                ops_per_s: (g * (1u64 << 30) as f64 / size as f64).round(),
                // fio's usr+sys CPU of one job over its runtime (group-reported).
                cpu_per_wall: r3(cpu * files.len() as f64),
                model_copy_share: None,
            });
        }
    }
    (out, None)
}

fn fio_ratio(rows: &[ZreadRow], m: &str, size: usize) -> Option<f64> {
    let g = |m: &str| {
        rows.iter()
            .find(|r| r.method == m && r.size == size)
            .map(|r| r.gib_per_s)
    };
    Some(g(m)? / g("fio_psync")?)
}
