//! z-READ's performance loss model (paper 002, §4.3.4, Eq. 4.1–4.3, Table 4.2), re-measured on
//! this machine: whether remapping a buffer onto the page cache is expected to cost less than
//! copying into it, given the probability that the buffer is written (a copy-on-write fault)
//! before it is read again.
//!
//! `E(loss_read) = (LAT_read − LAT_zread)·(1 − P)`, `E(loss_zread) = LAT_cow·P`, with
//! `LAT_cow = (LAT_zread+mod+cow − LAT_zread) − (LAT_read+mod − LAT_read)`. Remap iff
//! `E(loss_read) > E(loss_zread)`. Where remapping is slower than the copy even without writes
//! (`LAT_zread ≥ LAT_read`), the model never remaps.

use std::os::fd::AsRawFd;
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

/// The loss model: rows for 1, 2, 4, 8, 16 and 32 pages.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Model {
    /// The measured rows, by increasing size.
    pub rows: Vec<Row>,
}

/// Request sizes (pages) the model measures; larger requests are remapped in 32-page batches.
pub const SIZES: [usize; 6] = [1, 2, 4, 8, 16, 32];

static GLOBAL: OnceLock<Model> = OnceLock::new();

impl Model {
    /// The process-wide model, measured on first use (a few tens of milliseconds) in a scratch
    /// file under `$TMPDIR` or `/var/tmp`. If the measurement fails, a model that never remaps.
    pub fn global() -> &'static Model {
        GLOBAL.get_or_init(|| {
            Model::calibrate(std::path::Path::new("/var/tmp"), 41).unwrap_or_else(|_| Model {
                rows: SIZES
                    .iter()
                    .map(|&pages| Row {
                        pages,
                        read_ns: 0.0,
                        read_mod_ns: 0.0,
                        zread_ns: f64::INFINITY,
                        zread_mod_cow_ns: f64::INFINITY,
                    })
                    .collect(),
            })
        })
    }

    /// Measures Table 4.2 on a scratch file in `dir`: `reps` requests per cell, medians.
    pub fn calibrate(dir: &std::path::Path, reps: usize) -> crate::Result<Model> {
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
        let buf = sys::AnonMap::new(max * PAGE).map_err(|e| io("mmap", e))?;
        let mut rows = Vec::new();
        for &pages in &SIZES {
            let len = pages * PAGE;
            let mut cells = [vec![], vec![], vec![], vec![]];
            for r in 0..reps {
                let off = ((r * 37 * pages) % (file_pages - pages)) as u64 * PAGE as u64;
                // Interleave the four kinds so drift hits them alike.
                for (k, cell) in cells.iter_mut().enumerate() {
                    let b = buf.as_ptr();
                    let t = Instant::now();
                    if k < 2 {
                        // SAFETY: b..b+len is the scratch buffer, owned here.
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
                    cell.push(t.elapsed().as_nanos() as f64);
                    buf.reset().map_err(|e| io("mmap", e))?;
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
        Ok(Model { rows })
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

    /// Eq. 4.1 > Eq. 4.2: remapping `pages` pages is expected to lose less than copying them
    /// when the buffer is written before its next read with probability `p_cow`.
    pub fn remap_pays(&self, pages: usize, p_cow: f64) -> bool {
        let r = self.row(pages);
        let p = p_cow.clamp(0.0, 1.0);
        r.saving_ns() * (1.0 - p) > r.cow_ns() * p
    }
}
