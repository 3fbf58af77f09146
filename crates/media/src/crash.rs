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
//! ## Cut points
//!
//! Power can fail at two kinds of points, named by a [`CutPoint`]:
//!
//! * [`PowerDomain::cut_power_after`]`(n)` ([`CutPoint::After`]) freezes the shadow right after
//!   fence number `n` completed: every line pending at fence `n` is durable, nothing later is.
//! * [`PowerDomain::cut_power_during`]`(n)` ([`CutPoint::During`]) fails the power *while* fence
//!   `n` waits for its write-backs. Between two fences a CPU may write flushed lines back in any
//!   order, so each line pending at fence `n` (flushed or non-temporally stored since fence
//!   `n − 1`) is *in flight*: it may or may not have reached the medium, independently of the
//!   others. This is what catches a missing fence between two persists that must be ordered
//!   (`write(data); flush(data); write(flag); flush(flag); fence()` can leave the flag durable
//!   and the data not).
//!
//! Either way, later stores, flushes and fences are ignored, and the volatile (cache-visible)
//! contents of every attached pool are snapshotted at that instant. [`PowerDomain::crash_image`]
//! then yields the whole file as the medium would hold it: [`CrashPolicy::Strict`] keeps only
//! lines whose fence completed; [`CrashPolicy::Torn`] also lets each in-flight line land or not
//! (seeded); [`CrashPolicy::RandomEviction`] does that and, in addition, lets every line that
//! still differs from the volatile snapshot independently take the volatile version, as a CPU
//! cache may have evicted it. After an `After` cut nothing is in flight, so `Torn` equals
//! `Strict` and `RandomEviction` behaves exactly as it always has.
//!
//! To try every cut point of a deterministic workload, run it once without a cut to count its
//! fences `F` (see [`PowerDomain::fence_count`]), then once per point of [`CutPoint::all`]`(F)`
//! — `After(0), During(1), After(1), …, During(F), After(F), During(F + 1)` — and check the
//! crash image under `Strict` and a few seeds of `Torn`/`RandomEviction` (the images of one run
//! cost no re-run, so seeds are cheap):
//!
//! ```no_run
//! # use tiermem_media::{CrashPolicy, CutPoint, PowerDomain};
//! # fn workload(_: &PowerDomain) {}
//! # fn check(_: &[u8]) {}
//! # let path = "/dev/shm/p";
//! let probe = PowerDomain::new();
//! workload(&probe);
//! for cut in CutPoint::all(probe.fence_count()) {
//!     let d = PowerDomain::new();
//!     d.cut_power_at(cut).unwrap();
//!     workload(&d);
//!     check(&d.crash_image(path, CrashPolicy::Strict).unwrap());
//!     for seed in 0..4 {
//!         check(&d.crash_image(path, CrashPolicy::RandomEviction { seed }).unwrap());
//!     }
//! }
//! ```
//!
//! The model works at 64-byte cache-line granularity and costs one full copy of each attached
//! pool (two after a power cut), plus the flushed versions of the lines pending at a fence: it is
//! meant for tests on small pools. Writes that bypass the pool's `write`/`flush`/`persist`
//! methods (raw pointer stores) are seen when a later `flush`/`persist` covers them, exactly as
//! on hardware.

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
    /// Only lines that were flushed and fenced before the power cut survive: lines in flight at
    /// an interrupted fence ([`CutPoint::During`]) are lost. This is what a program may rely on.
    Strict,
    /// [`CrashPolicy::Strict`], except that each line in flight at the interrupted fence
    /// independently either keeps its durable content or takes one of the contents it was
    /// flushed with since the previous fence (deterministic for a given seed) — arbitrary
    /// write-back order. Unflushed stores are lost. Equal to `Strict` after a
    /// [`CutPoint::After`] cut, where nothing is in flight.
    Torn {
        /// Seed of the per-line choices.
        seed: u64,
    },
    /// [`CrashPolicy::Torn`] with the same seed, then every line whose content still differs
    /// from its volatile content independently keeps either version (deterministic for a given
    /// seed), modelling arbitrary cache evictions. After a [`CutPoint::After`] cut this is
    /// exactly the eviction-only behaviour of earlier versions (same images for the same seed).
    RandomEviction {
        /// Seed of the per-line coin flips.
        seed: u64,
    },
}

impl CrashPolicy {
    /// The policy's seed (`None` for [`CrashPolicy::Strict`]).
    pub fn seed(&self) -> Option<u64> {
        match *self {
            CrashPolicy::Strict => None,
            CrashPolicy::Torn { seed } | CrashPolicy::RandomEviction { seed } => Some(seed),
        }
    }
}

/// Where [`PowerDomain::cut_power_at`] fails the power, relative to the domain's fences
/// (numbered from 1).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum CutPoint {
    /// Right after fence `n` completed (`After(0)`: before the first fence). Every line pending
    /// at fence `n` is durable. See [`PowerDomain::cut_power_after`].
    After(u64),
    /// While fence `n` (`n ≥ 1`) waits for its write-backs: each line pending at it is in
    /// flight and may or may not be durable. See [`PowerDomain::cut_power_during`].
    During(u64),
}

impl CutPoint {
    /// Every cut point of a workload that issues `fences` fences, in time order: `After(0)`,
    /// `During(1)`, `After(1)`, …, `During(fences)`, `After(fences)`, `During(fences + 1)`.
    /// The last one is never reached by such a workload, which leaves the power on, so the
    /// crash image is that of a failure when it is taken — with the lines flushed after the
    /// last fence in flight (it covers trailing unfenced flushes). `2 * fences + 2` points.
    pub fn all(fences: u64) -> impl Iterator<Item = CutPoint> {
        (0..=fences).flat_map(|n| [CutPoint::After(n), CutPoint::During(n + 1)])
    }

    /// The fence number the point refers to.
    pub fn fence(&self) -> u64 {
        match *self {
            CutPoint::After(n) | CutPoint::During(n) => n,
        }
    }
}

impl std::fmt::Display for CutPoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CutPoint::After(n) => write!(f, "after fence {n}"),
            CutPoint::During(n) => write!(f, "during fence {n}"),
        }
    }
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
    /// Number of pending cache lines this fence made durable (for the interrupted fence: the
    /// number of lines left in flight).
    pub lines: usize,
    /// False when the fence came after the power cut (and so had no effect), or was the one
    /// interrupted by a [`CutPoint::During`] cut.
    pub applied: bool,
    /// True for the fence during which power failed ([`PowerDomain::cut_power_during`]).
    pub interrupted: bool,
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
            .field("in_flight_lines", &g.in_flight.len())
            .field("power_cut", &!g.powered())
            .finish()
    }
}

/// Most flushed versions kept per pending line (the first and the latest are always kept).
const MAX_VERSIONS: usize = 16;

/// Flushed-but-unfenced lines: (pool id, file offset of the line) → the distinct contents it was
/// flushed with since the last fence, oldest first (never empty).
type Lines = BTreeMap<(u64, u64), Vec<[u8; CACHE_LINE]>>;

#[derive(Default)]
struct Inner {
    pools: Vec<Attached>,
    pending: Lines,
    /// The lines pending at the fence interrupted by a `During` cut.
    in_flight: Lines,
    fences: Vec<FenceRecord>,
    /// The armed cut point, if any.
    armed: Option<CutPoint>,
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
        self.cut_power_at(CutPoint::After(n))
    }

    /// Cut power *during* fence number `n` (`n ≥ 1`): when the workload issues fence `n`, the
    /// lines pending at it (flushed or non-temporally stored since fence `n − 1`) do not become
    /// durable but stay *in flight* — [`CrashPolicy::Torn`] and [`CrashPolicy::RandomEviction`]
    /// let each of them independently land or not — the fence is recorded with
    /// `applied: false, interrupted: true`, and the domain freezes as for
    /// [`PowerDomain::cut_power_after`]. If the workload never issues fence `n`, power stays on
    /// (and [`PowerDomain::crash_image`] models a failure at the instant it is called, with the
    /// pending lines in flight). Errors when `n == 0`, when fence `n` was already seen (at least
    /// `n` fences), or when power is already cut.
    pub fn cut_power_during(&self, n: u64) -> Result<()> {
        self.cut_power_at(CutPoint::During(n))
    }

    /// Arm the cut at `point`: [`PowerDomain::cut_power_after`] or
    /// [`PowerDomain::cut_power_during`]. Only one cut per domain.
    pub fn cut_power_at(&self, point: CutPoint) -> Result<()> {
        let mut g = self.0.lock();
        if g.cut {
            return Err(MediaError::InvalidArgument(
                "power has already been cut in this domain".into(),
            ));
        }
        let seen = g.fences.len() as u64;
        match point {
            CutPoint::After(n) => {
                if seen > n {
                    return Err(MediaError::InvalidArgument(format!(
                        "cannot cut power after fence {n}: {seen} fences were already seen; arm the cut before running the workload"
                    )));
                }
                g.armed = Some(point);
                if seen == n {
                    g.cut_now();
                }
            }
            CutPoint::During(n) => {
                if n == 0 {
                    return Err(MediaError::InvalidArgument(
                        "fences are numbered from 1: there is no fence 0 to cut power during"
                            .into(),
                    ));
                }
                if seen >= n {
                    return Err(MediaError::InvalidArgument(format!(
                        "cannot cut power during fence {n}: {seen} fences were already seen; arm the cut before running the workload"
                    )));
                }
                g.armed = Some(point);
            }
        }
        Ok(())
    }

    /// Number of lines left in flight by a [`CutPoint::During`] cut (0 before it, or after an
    /// `After` cut).
    pub fn in_flight_lines(&self) -> usize {
        self.0.lock().in_flight.len()
    }

    /// The bytes of the pool file at `pool_path` as the persistent medium would hold them after
    /// the power cut, under `policy` (or, if power has not been cut, as if it failed at this
    /// instant — before the next fence completed, so with the pending lines in flight — without
    /// freezing anything). Deterministic: the same domain state, policy and seed give the same
    /// bytes, so a test may take many images (seeds) of one run.
    pub fn crash_image(&self, pool_path: impl AsRef<Path>, policy: CrashPolicy) -> Result<Vec<u8>> {
        let g = self.0.lock();
        let i = g
            .find(pool_path.as_ref())
            .ok_or_else(|| MediaError::UnknownPool(pool_path.as_ref().display().to_string()))?;
        Ok(g.image(i, policy))
    }

    /// [`PowerDomain::crash_image`] for the pool with domain id `id` (see `Pool::domain_id`).
    pub fn crash_image_by_id(&self, id: u64, policy: CrashPolicy) -> Result<Vec<u8>> {
        let g = self.0.lock();
        if id as usize >= g.pools.len() {
            return Err(MediaError::UnknownPool(format!("id {id}")));
        }
        Ok(g.image(id as usize, policy))
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
            let versions = g.pending.entry((id, l)).or_default();
            if versions.last() != Some(&buf) {
                if versions.len() == MAX_VERSIONS {
                    versions.remove(1);
                }
                versions.push(buf);
            }
        }
    }

    /// Record a store fence issued through pool `id` by `caller`.
    pub(crate) fn note_fence(&self, id: u64, caller: &'static Location<'static>) {
        let mut g = self.0.lock();
        let seq = g.fences.len() as u64 + 1;
        let mut record = FenceRecord {
            seq,
            pool: id,
            caller,
            lines: 0,
            applied: false,
            interrupted: false,
        };
        if g.cut {
            g.fences.push(record);
            return;
        }
        let pending = std::mem::take(&mut g.pending);
        record.lines = pending.len();
        if g.armed == Some(CutPoint::During(seq)) {
            // Power fails while this fence waits: its lines are neither durable nor lost.
            g.in_flight = pending;
            record.interrupted = true;
            g.fences.push(record);
            g.cut_now();
            return;
        }
        for ((pid, l), versions) in pending {
            if let Some(p) = g.pools.get_mut(pid as usize) {
                // cannot fail: a line enters `pending` with the version that put it there.
                let buf = versions.last().expect("a pending line has a version");
                let l = l as usize;
                let n = (p.len - l).min(CACHE_LINE);
                p.shadow[l..l + n].copy_from_slice(&buf[..n]);
            }
        }
        record.applied = true;
        g.fences.push(record);
        if g.armed == Some(CutPoint::After(seq)) {
            g.cut_now();
        }
    }
}

impl Inner {
    /// The crash image of pool index `pid` under `policy` (see [`PowerDomain::crash_image`]).
    fn image(&self, pid: usize, policy: CrashPolicy) -> Vec<u8> {
        let p = &self.pools[pid];
        let mut img = p.shadow.clone();
        let Some(seed) = policy.seed() else {
            return img;
        };
        // In flight: the lines of the interrupted fence, or (power still on) the pending ones.
        let in_flight = if self.cut {
            &self.in_flight
        } else {
            &self.pending
        };
        let pid64 = pid as u64;
        for (&(_, l), versions) in in_flight.range((pid64, 0)..=(pid64, u64::MAX)) {
            let l = l as usize;
            if l >= p.len {
                continue;
            }
            // A stream independent of the eviction coins below, so that images after an
            // `After` cut (nothing in flight) are those of the eviction-only model.
            let h = splitmix64(
                splitmix64(seed ^ 0xD6E8_FEB8_6659_FD93) ^ pid64.rotate_left(40) ^ l as u64,
            );
            // 0: the write-back did not complete; k ≥ 1: the k-th flushed version landed last.
            let k = (h % (versions.len() as u64 + 1)) as usize;
            if k > 0 {
                let n = (p.len - l).min(CACHE_LINE);
                img[l..l + n].copy_from_slice(&versions[k - 1][..n]);
            }
        }
        if let CrashPolicy::RandomEviction { .. } = policy {
            let vol = match &p.frozen_volatile {
                Some(v) => v.clone(),
                None => p.volatile(),
            };
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
        }
        img
    }
}

fn splitmix64(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}
