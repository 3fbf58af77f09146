//! z-READ's performance loss model (paper 002, §4.3.4, Eq. 4.1–4.3, Table 4.2), re-measured on
//! this machine: whether remapping a buffer onto the page cache is expected to cost less than
//! copying into it, given the probability that the buffer is written (a copy-on-write fault)
//! before it is read again.
//!
//! `E(loss_read) = (LAT_read − LAT_zread)·(1 − P)`, `E(loss_zread) = LAT_cow·P`, with
//! `LAT_cow = (LAT_zread+mod+cow − LAT_zread) − (LAT_read+mod − LAT_read)`. Remap iff
//! `E(loss_read) > E(loss_zread)`. Where remapping is slower than the copy even without writes
//! (`LAT_zread ≥ LAT_read`), the model never remaps (but tries one now and then, see
//! [`Model`]).

use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::Instant;

use crate::sys;
use crate::zread::PAGE;

/// One row of the re-measured Table 4.2: median latencies in nanoseconds of one request of
/// `pages` pages, page-aligned, warm page cache.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
pub struct Row {
    /// Request size in pages.
    pub pages: usize,
    /// `pread` into the buffer.
    pub read_ns: f64,
    /// `pread`, then one byte written per page.
    pub read_mod_ns: f64,
    /// Remap (`MAP_PRIVATE|MAP_FIXED` + `MADV_POPULATE_READ`).
    pub zread_ns: f64,
    /// Remap, then one byte written per page (a copy-on-write fault per page).
    pub zread_mod_cow_ns: f64,
}

impl Row {
    /// `LAT_read − LAT_zread`: what a remap saves when nothing is written (negative: it costs).
    pub fn saving_ns(&self) -> f64 {
        self.read_ns - self.zread_ns
    }

    /// `LAT_cow` (Eq. 4.3), never below zero.
    pub fn cow_ns(&self) -> f64 {
        ((self.zread_mod_cow_ns - self.zread_ns) - (self.read_mod_ns - self.read_ns)).max(0.0)
    }
}

/// The loss model: rows for 1, 2, 4, 8, 16 and 32 pages, measured at start-up, corrected by
/// what requests cost while the program runs.
///
/// The start-up table is measured by one thread. In a multi-threaded program a remap costs
/// more — every `mmap` takes the address space's lock for writing, and replacing a mapping
/// other CPUs may cache sends them TLB shootdowns — so the model also keeps a moving average of
/// the latencies it observes (every remap, one copy in 64) and uses those once it has them.
/// While it keeps choosing the copy for a size, it tries a remap now and then (every 256th
/// request at first, doubling each time the remap is confirmed slower, up to every 65536th)
/// so that its picture of the remap stays current.
#[derive(Debug, serde::Serialize)]
pub struct Model {
    /// The measured rows, by increasing size.
    pub rows: Vec<Row>,
    #[serde(skip)]
    observed: Vec<Observed>,
}

/// Observed latencies (f64 bits; 0 = none yet) and the exploration state of one row.
#[derive(Debug)]
struct Observed {
    read_ns: AtomicU64,
    zread_ns: AtomicU64,
    explore_every: AtomicU64,
}

thread_local! {
    /// Per row: copies this thread chose since its last remap (exploration).
    static COPIES_SINCE_REMAP: [std::cell::Cell<u64>; SIZES.len()] = const {
        [const { std::cell::Cell::new(0) }; SIZES.len()]
    };
}

/// What [`Model::decide`] chose.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Copy into the buffer.
    Copy,
    /// Remap the buffer: the model expects it to lose less.
    Remap,
    /// Remap to measure it again, although the model expects the copy to lose less.
    Explore,
}

const EXPLORE_FIRST: u64 = 256;
const EXPLORE_MAX: u64 = 1 << 16;

/// Request sizes (pages) the model measures; larger requests are remapped in 32-page batches.
pub const SIZES: [usize; 6] = [1, 2, 4, 8, 16, 32];

static GLOBAL: OnceLock<Model> = OnceLock::new();

impl Model {
    /// The process-wide model, measured on first use (a few tens of milliseconds) in a scratch
    /// file under `$TMPDIR` or `/var/tmp`. If the measurement fails, a model that never remaps.
    pub fn global() -> &'static Model {
        GLOBAL.get_or_init(|| {
            Model::calibrate(std::path::Path::new("/var/tmp"), 41).unwrap_or_else(|_| {
                Model::with_rows(
                    SIZES
                        .iter()
                        .map(|&pages| Row {
                            pages,
                            read_ns: 0.0,
                            read_mod_ns: 0.0,
                            zread_ns: f64::INFINITY,
                            zread_mod_cow_ns: f64::INFINITY,
                        })
                        .collect(),
                )
            })
        })
    }

    /// Measures Table 4.2 on a scratch file in `dir`: `reps` requests per cell (at least one),
    /// medians.
    pub fn calibrate(dir: &std::path::Path, reps: usize) -> crate::Result<Model> {
        let reps = reps.max(1);
        let io = |op: &'static str, e: std::io::Error| crate::Error::Io {
            op,
            path: dir.to_path_buf(),
            source: e,
        };
        let file = tempfile::tempfile_in(dir)
            .or_else(|_| tempfile::tempfile())
            .map_err(|e| io("create the model's scratch file", e))?;
        let fd = file.as_raw_fd();
        let file_pages = 512usize;
        let fill: Vec<u8> = (0..file_pages * PAGE).map(|i| (i / PAGE) as u8).collect();
        sys::pwrite_full(fd, &fill, 0).map_err(|e| io("write the model's scratch file", e))?;
        let max = *SIZES.last().unwrap_or(&32);
        // Two buffers in their steady states: the copy's is touched memory reused by every
        // read; the remap's holds the previous request's mapping, as a reused buffer would.
        let rbuf = sys::AnonMap::new(max * PAGE).map_err(|e| io("mmap", e))?;
        let zbuf = sys::AnonMap::new(max * PAGE).map_err(|e| io("mmap", e))?;
        // SAFETY: both mappings are max*PAGE bytes, owned here.
        unsafe {
            std::ptr::write_bytes(rbuf.as_ptr(), 1, max * PAGE);
            std::ptr::write_bytes(zbuf.as_ptr(), 1, max * PAGE);
        }
        let mut rows = Vec::new();
        for &pages in &SIZES {
            let len = pages * PAGE;
            let mut cells = [vec![], vec![], vec![], vec![]];
            for r in 0..reps + 3 {
                let off = ((r * 37 * pages) % (file_pages - pages)) as u64 * PAGE as u64;
                // Interleave the four kinds so drift hits them alike.
                for (k, cell) in cells.iter_mut().enumerate() {
                    let b = if k < 2 { rbuf.as_ptr() } else { zbuf.as_ptr() };
                    let t = Instant::now();
                    if k < 2 {
                        // SAFETY: b..b+len is a scratch buffer, owned here.
                        let s = unsafe { std::slice::from_raw_parts_mut(b, len) };
                        sys::pread_full(fd, s, off, 0).map_err(|e| io("pread", e))?;
                    } else {
                        // SAFETY: the scratch buffer is ours to replace.
                        unsafe { sys::map_private_fixed(b, len, fd, off) }
                            .map_err(|e| io("mmap", e))?;
                        sys::madvise(b, len, sys::MADV_POPULATE_READ)
                            .map_err(|e| io("madvise", e))?;
                    }
                    if k % 2 == 1 {
                        for p in 0..pages {
                            // SAFETY: inside the scratch buffer.
                            unsafe { b.add(p * PAGE).write_volatile(1) };
                        }
                    }
                    // The first rounds only bring the buffers to their steady state.
                    if r >= 3 {
                        cell.push(t.elapsed().as_nanos() as f64);
                    }
                }
            }
            let med = |v: &mut Vec<f64>| {
                v.sort_by(|a, b| a.total_cmp(b));
                v[v.len() / 2]
            };
            rows.push(Row {
                pages,
                read_ns: med(&mut cells[0]),
                read_mod_ns: med(&mut cells[1]),
                zread_ns: med(&mut cells[2]),
                zread_mod_cow_ns: med(&mut cells[3]),
            });
        }
        Ok(Model::with_rows(rows))
    }

    /// The row for a request of `pages` pages (≥ 1): the nearest measured size at or above it,
    /// scaled linearly beyond 32 pages (the remap goes in 32-page batches).
    pub fn row(&self, pages: usize) -> Row {
        let last = *self.rows.last().expect("a model has rows");
        if pages > last.pages {
            let k = pages as f64 / last.pages as f64;
            return Row {
                pages,
                read_ns: last.read_ns * k,
                read_mod_ns: last.read_mod_ns * k,
                zread_ns: last.zread_ns * k,
                zread_mod_cow_ns: last.zread_mod_cow_ns * k,
            };
        }
        *self.rows.iter().find(|r| r.pages >= pages).unwrap_or(&last)
    }

    fn with_rows(rows: Vec<Row>) -> Model {
        let observed = rows
            .iter()
            .map(|_| Observed {
                read_ns: AtomicU64::new(0),
                zread_ns: AtomicU64::new(0),
                explore_every: AtomicU64::new(EXPLORE_FIRST),
            })
            .collect();
        Model { rows, observed }
    }

    /// The row index and the scale factor (requests beyond 32 pages go in 32-page batches).
    fn bucket(&self, pages: usize) -> (usize, f64) {
        let last = self.rows.len() - 1;
        if pages > self.rows[last].pages {
            return (last, pages as f64 / self.rows[last].pages as f64);
        }
        (
            self.rows
                .iter()
                .position(|r| r.pages >= pages)
                .unwrap_or(last),
            1.0,
        )
    }

    /// `LAT_read` and `LAT_zread` for `pages`: observed while running where known, else the
    /// start-up table's.
    pub fn latencies(&self, pages: usize) -> (f64, f64) {
        let (i, k) = self.bucket(pages);
        let o = &self.observed[i];
        let get = |a: &AtomicU64, dflt: f64| match f64::from_bits(a.load(Ordering::Relaxed)) {
            x if x > 0.0 => x,
            _ => dflt,
        };
        (
            get(&o.read_ns, self.rows[i].read_ns) * k,
            get(&o.zread_ns, self.rows[i].zread_ns) * k,
        )
    }

    /// Chooses copy or remap for a request of `pages` whole pages whose buffer is written
    /// before its next read with probability `p_cow` (Eq. 4.1 against Eq. 4.2, with
    /// [`Model::latencies`]); now and then a remap to keep its cost current (see [`Model`]).
    pub fn decide(&self, pages: usize, p_cow: f64) -> Decision {
        let (i, k) = self.bucket(pages);
        let (read, zread) = self.latencies(pages);
        let p = p_cow.clamp(0.0, 1.0);
        let cow = self.rows[i].cow_ns() * k;
        let o = &self.observed[i];
        if (read - zread) * (1.0 - p) > cow * p {
            COPIES_SINCE_REMAP.with(|c| c[i].set(0));
            return Decision::Remap;
        }
        // Counted per thread: a shared counter would bounce between the CPUs on every request.
        // The count restarts when due even if no remap is tried (P(cow) ≥ ½): left due, it
        // would send every later request through the full decision (`copy_certain` false).
        let due = COPIES_SINCE_REMAP.with(|c| {
            let n = c[i].get() + 1;
            let due = n >= o.explore_every.load(Ordering::Relaxed);
            c[i].set(if due { 0 } else { n });
            due
        });
        if due && p < 0.5 {
            return Decision::Explore;
        }
        Decision::Copy
    }

    /// True when a copy is certain for `pages` pages whatever `P(cow)` is — the remap costs
    /// more even without writes — and no exploring remap is due: the caller may copy without
    /// working out `P(cow)`. Counts the request towards the next exploration.
    pub fn copy_certain(&self, pages: usize) -> bool {
        let (i, _) = self.bucket(pages);
        let (read, zread) = self.latencies(pages);
        if zread < read {
            return false;
        }
        COPIES_SINCE_REMAP.with(|c| {
            let n = c[i].get() + 1;
            if n >= self.observed[i].explore_every.load(Ordering::Relaxed) {
                // Due: `decide` explores (and resets the count).
                return false;
            }
            c[i].set(n);
            true
        })
    }

    /// Records that a request of `pages` pages took `ns` by copy (`remap` false) or by remap;
    /// `explored` says the remap was an exploration (see [`Model`]).
    pub fn observe(&self, pages: usize, remap: bool, explored: bool, ns: f64) {
        let (i, k) = self.bucket(pages);
        let o = &self.observed[i];
        let (a, table) = if remap {
            (&o.zread_ns, self.rows[i].zread_ns)
        } else {
            (&o.read_ns, self.rows[i].read_ns)
        };
        let old = match f64::from_bits(a.load(Ordering::Relaxed)) {
            x if x > 0.0 => x,
            _ if table.is_finite() && table > 0.0 => table,
            _ => ns / k,
        };
        // A request preempted or stalled once must not swing the average: a sample counts at
        // most four times the current estimate.
        let x = (ns / k).min(4.0 * old);
        let new = old * 0.875 + x * 0.125;
        a.store(new.to_bits(), Ordering::Relaxed);
        if explored {
            let (read, zread) = self.latencies(pages);
            let e = &o.explore_every;
            if zread >= read {
                let next = (e.load(Ordering::Relaxed) * 2).min(EXPLORE_MAX);
                e.store(next, Ordering::Relaxed);
            } else {
                e.store(EXPLORE_FIRST, Ordering::Relaxed);
            }
        }
    }

    /// Eq. 4.1 > Eq. 4.2 with the start-up table only: remapping `pages` pages is expected to lose less than copying them
    /// when the buffer is written before its next read with probability `p_cow`.
    pub fn remap_pays(&self, pages: usize, p_cow: f64) -> bool {
        let r = self.row(pages);
        let p = p_cow.clamp(0.0, 1.0);
        r.saving_ns() * (1.0 - p) > r.cow_ns() * p
    }
}
