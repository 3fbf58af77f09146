//! The persistence-domain (power-failure) model for crash-consistency tests.
//!
//! A [`PowerDomain`] stands for one machine's persistence domain. Pools created or opened with
//! `domain: Some(d)` attach to it, and the domain then keeps, per pool file, a *shadow*: the bytes
//! a real persistent medium would hold if power failed now. The rules follow x86 persistent
//! memory:
//!
//! * a store reaches the medium only after its cache line was written back (`flush`, or a
//!   non-temporal store as done by `Pool::write`) **and** a later store fence was executed;
//! * a flush captures the line's content *at flush time* into a pending set; a fence on **any**
//!   attached pool (sfence is CPU-wide) moves every pending line into the shadow and is recorded
//!   as a [`FenceRecord`] with the source location of the caller;
//! * an msync-persisted pool (`PersistMethod::Msync`) counts as flush + fence.
//!
//! [`PowerDomain::cut_power_after`]`(n)` freezes the shadow right after fence number `n` and
//! snapshots the volatile (cache-visible) contents of every attached pool at that instant; later
//! stores, flushes and fences are ignored. [`PowerDomain::crash_image`] then yields the whole
//! file as the medium would hold it: [`CrashPolicy::Strict`] keeps only flushed-and-fenced lines,
//! [`CrashPolicy::RandomEviction`] lets every line that differs between the shadow and the
//! volatile snapshot independently take either version, as a CPU cache may have evicted it.
//!
//! The model works at 64-byte cache-line granularity and costs one full copy of each attached
//! pool (two after a power cut): it is meant for tests on small pools. Writes that bypass the
//! pool's `write`/`flush`/`persist` methods (raw pointer stores) are seen when a later
//! `flush`/`persist` covers them, exactly as on hardware.

use crate::error::{MediaError, Result};
use crate::persist::CACHE_LINE;
use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::io::Write as _;
use std::os::unix::fs::OpenOptionsExt as _;
use std::panic::Location;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// How [`PowerDomain::crash_image`] resolves lines that were stored but not made durable.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CrashPolicy {
    /// Only lines that were flushed and fenced before the power cut survive.
    Strict,
    /// Every line whose volatile content differs from its durable content independently keeps
    /// either version (deterministic for a given seed), modelling arbitrary cache evictions.
    RandomEviction {
        /// Seed of the per-line coin flips.
        seed: u64,
    },
}

/// One store fence seen by the domain.
#[derive(Clone, Copy, Debug)]
pub struct FenceRecord {
    /// 1-based sequence number of the fence in this domain.
    pub seq: u64,
    /// Domain id of the pool the fence was issued through.
    pub pool: u64,
    /// Source location of the public pool call that fenced.
    pub caller: &'static Location<'static>,
    /// Number of pending cache lines this fence made durable.
    pub lines: usize,
    /// False when the fence came after the power cut (and so had no effect).
    pub applied: bool,
}

/// A simulated persistence domain shared by the pools attached to it. Cloning shares the domain.
#[derive(Clone, Default)]
pub struct PowerDomain(Arc<Mutex<Inner>>);

impl std::fmt::Debug for PowerDomain {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let g = self.0.lock();
        f.debug_struct("PowerDomain")
            .field("pools", &g.pools.len())
            .field("fences", &g.fences.len())
            .field("pending_lines", &g.pending.len())
            .field("power_cut", &!g.powered())
            .finish()
    }
}

#[derive(Default)]
struct Inner {
    pools: Vec<Attached>,
    /// Flushed-but-unfenced lines: (pool id, file offset of the line) → content at flush time.
    pending: BTreeMap<(u64, u64), [u8; CACHE_LINE]>,
    fences: Vec<FenceRecord>,
    /// Fence count after which power is (or will be) cut.
    cut_after: Option<u64>,
    cut: bool,
    next_handle: u64,
}

struct Attached {
    path: PathBuf,
    canon: Option<PathBuf>,
    len: usize,
    shadow: Vec<u8>,
    /// Live mappings of the file: (handle, base address). All show the same bytes.
    maps: Vec<(u64, usize)>,
    /// Content when the last mapping went away (if none is live).
    last_volatile: Option<Vec<u8>>,
    /// Content at the power cut.
    frozen_volatile: Option<Vec<u8>>,
}

impl Attached {
    /// Current volatile content of the file as this process sees it.
    fn volatile(&self) -> Vec<u8> {
        if let Some(&(_, base)) = self.maps.first() {
            let mut v = vec![0u8; self.len];
            // SAFETY: `base` is a live mapping of `len` bytes (mappings detach under the domain
            // lock before they are unmapped, and we hold the lock).
            unsafe { std::ptr::copy_nonoverlapping(base as *const u8, v.as_mut_ptr(), self.len) };
            v
        } else {
            self.last_volatile
                .clone()
                .unwrap_or_else(|| self.shadow.clone())
        }
    }
}

impl Inner {
    fn powered(&self) -> bool {
        !self.cut
    }

    fn cut_now(&mut self) {
        self.cut = true;
        for p in &mut self.pools {
            p.frozen_volatile = Some(p.volatile());
        }
    }

    fn find(&self, path: &Path) -> Option<usize> {
        let canon = std::fs::canonicalize(path).ok();
        self.pools
            .iter()
            .position(|p| p.path == path || (canon.is_some() && p.canon == canon))
    }
}

impl PowerDomain {
    /// A new domain with no pools, power on.
    pub fn new() -> Self {
        Self::default()
    }

    /// Every fence seen so far, in order.
    pub fn fences(&self) -> Vec<FenceRecord> {
        self.0.lock().fences.clone()
    }

    /// Number of fences seen so far (including any after the power cut).
    pub fn fence_count(&self) -> u64 {
        self.0.lock().fences.len() as u64
    }

    /// Number of lines flushed (or non-temporally stored) but not yet fenced.
    pub fn pending_lines(&self) -> usize {
        self.0.lock().pending.len()
    }

    /// True once power has been cut.
    pub fn is_power_cut(&self) -> bool {
        self.0.lock().cut
    }

    /// Cut power right after fence number `n` completes (`n == 0`: now, before any further
    /// fence; if exactly `n` fences were already seen, also now). From then on the durable state
    /// is frozen and the volatile contents of every attached pool are snapshotted for
    /// [`CrashPolicy::RandomEviction`]. Errors when more than `n` fences were already seen or
    /// power is already cut.
    pub fn cut_power_after(&self, n: u64) -> Result<()> {
        let mut g = self.0.lock();
        if g.cut {
            return Err(MediaError::InvalidArgument(
                "power has already been cut in this domain".into(),
            ));
        }
        let seen = g.fences.len() as u64;
        if seen > n {
            return Err(MediaError::InvalidArgument(format!(
                "cannot cut power after fence {n}: {seen} fences were already seen; arm the cut before running the workload"
            )));
        }
        g.cut_after = Some(n);
        if seen == n {
            g.cut_now();
        }
        Ok(())
    }

    /// The bytes of the pool file at `pool_path` as the persistent medium would hold them after
    /// the power cut (or, if power has not been cut, as if it failed at this instant, without
    /// freezing anything).
    pub fn crash_image(&self, pool_path: impl AsRef<Path>, policy: CrashPolicy) -> Result<Vec<u8>> {
        let g = self.0.lock();
        let i = g
            .find(pool_path.as_ref())
            .ok_or_else(|| MediaError::UnknownPool(pool_path.as_ref().display().to_string()))?;
        Ok(image(&g.pools[i], policy))
    }

    /// [`PowerDomain::crash_image`] for the pool with domain id `id` (see `Pool::domain_id`).
    pub fn crash_image_by_id(&self, id: u64, policy: CrashPolicy) -> Result<Vec<u8>> {
        let g = self.0.lock();
        let p = g
            .pools
            .get(id as usize)
            .ok_or_else(|| MediaError::UnknownPool(format!("id {id}")))?;
        Ok(image(p, policy))
    }

    /// Write [`PowerDomain::crash_image`] of `pool_path` to a new file `dest` (mode 0600; an
    /// existing `dest` is an error), which `Pool::open` can then open as the post-crash pool.
    pub fn write_image(
        &self,
        pool_path: impl AsRef<Path>,
        policy: CrashPolicy,
        dest: impl AsRef<Path>,
    ) -> Result<()> {
        let img = self.crash_image(pool_path, policy)?;
        let dest = dest.as_ref();
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(dest)
            .map_err(|e| MediaError::from_io("create crash image", dest, e))?;
        f.write_all(&img)
            .map_err(|e| MediaError::from_io("write crash image", dest, e))?;
        Ok(())
    }

    // ---- hooks used by Pool -----------------------------------------------------------------

    /// Attach a mapping of `len` bytes of the file `path` at `base`. A file already known to the
    /// domain keeps its shadow; a new one starts with its current content as durable.
    /// Returns (pool id, mapping handle).
    pub(crate) fn attach(&self, path: &Path, base: *const u8, len: usize) -> (u64, u64) {
        let mut g = self.0.lock();
        let handle = g.next_handle;
        g.next_handle += 1;
        let idx = match g.find(path) {
            Some(i) => i,
            None => {
                let mut shadow = vec![0u8; len];
                // SAFETY: the caller passes a live mapping of `len` bytes.
                unsafe { std::ptr::copy_nonoverlapping(base, shadow.as_mut_ptr(), len) };
                let frozen = if g.cut { Some(shadow.clone()) } else { None };
                g.pools.push(Attached {
                    path: path.to_path_buf(),
                    canon: std::fs::canonicalize(path).ok(),
                    len,
                    shadow,
                    maps: Vec::new(),
                    last_volatile: None,
                    frozen_volatile: frozen,
                });
                g.pools.len() - 1
            }
        };
        let p = &mut g.pools[idx];
        p.len = p.len.min(len);
        p.maps.push((handle, base as usize));
        (idx as u64, handle)
    }

    /// Detach a mapping before it is unmapped.
    pub(crate) fn detach(&self, id: u64, handle: u64) {
        let mut g = self.0.lock();
        let Some(p) = g.pools.get_mut(id as usize) else {
            return;
        };
        if p.maps.len() == 1 && p.maps[0].0 == handle {
            p.last_volatile = Some(p.volatile());
        }
        p.maps.retain(|(h, _)| *h != handle);
    }

    /// Record that the lines overlapping file range `[off, off + len)` were written back (flush
    /// or non-temporal store): their current content becomes pending.
    pub(crate) fn note_flush(&self, id: u64, off: u64, len: u64) {
        if len == 0 {
            return;
        }
        let mut g = self.0.lock();
        if g.cut {
            return;
        }
        let Some(p) = g.pools.get(id as usize) else {
            return;
        };
        let Some(&(_, base)) = p.maps.first() else {
            return;
        };
        let plen = p.len as u64;
        let first = off & !(CACHE_LINE as u64 - 1);
        let end = (off + len).min(plen);
        let mut lines = Vec::new();
        let mut l = first;
        while l < end {
            let mut buf = [0u8; CACHE_LINE];
            let n = (plen - l).min(CACHE_LINE as u64) as usize;
            // SAFETY: l + n <= len of the live mapping at `base` (held live by the domain lock).
            unsafe {
                std::ptr::copy_nonoverlapping(
                    (base as *const u8).add(l as usize),
                    buf.as_mut_ptr(),
                    n,
                )
            };
            lines.push((l, buf));
            l += CACHE_LINE as u64;
        }
        for (l, buf) in lines {
            g.pending.insert((id, l), buf);
        }
    }

    /// Record a store fence issued through pool `id` by `caller`.
    pub(crate) fn note_fence(&self, id: u64, caller: &'static Location<'static>) {
        let mut g = self.0.lock();
        let seq = g.fences.len() as u64 + 1;
        if g.cut {
            g.fences.push(FenceRecord {
                seq,
                pool: id,
                caller,
                lines: 0,
                applied: false,
            });
            return;
        }
        let pending = std::mem::take(&mut g.pending);
        let lines = pending.len();
        for ((pid, l), buf) in pending {
            if let Some(p) = g.pools.get_mut(pid as usize) {
                let l = l as usize;
                let n = (p.len - l).min(CACHE_LINE);
                p.shadow[l..l + n].copy_from_slice(&buf[..n]);
            }
        }
        g.fences.push(FenceRecord {
            seq,
            pool: id,
            caller,
            lines,
            applied: true,
        });
        if g.cut_after == Some(seq) {
            g.cut_now();
        }
    }
}

fn image(p: &Attached, policy: CrashPolicy) -> Vec<u8> {
    match policy {
        CrashPolicy::Strict => p.shadow.clone(),
        CrashPolicy::RandomEviction { seed } => {
            let vol = match &p.frozen_volatile {
                Some(v) => v.clone(),
                None => p.volatile(),
            };
            let mut img = p.shadow.clone();
            let mut rng = seed ^ 0x9E37_79B9_7F4A_7C15;
            for (i, (dst, v)) in img
                .chunks_mut(CACHE_LINE)
                .zip(vol.chunks(CACHE_LINE))
                .enumerate()
            {
                if dst != v {
                    rng = splitmix64(rng.wrapping_add(i as u64));
                    if rng & 1 == 1 {
                        dst.copy_from_slice(v);
                    }
                }
            }
            img
        }
    }
}

fn splitmix64(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}
