//! FAM-aware, checkpoint-based post-copy (paper 003 §III–IV, Fig. 4; `docs/migrate.md`).
//!
//! Source: with the application frozen, [`FamSource::checkpoint`] writes the non-page state and
//! creates (reserves) one lazy-page file per region in `FAM/mig-<id>/`; [`FamSource::serve`]
//! then dumps every region in the background while a page-server answers the target's faults
//! by dumping the vector holding them first; when every page is dumped and persisted it tells
//! the target (`Done`) and returns — the end of busy time.
//!
//! Target: [`FamTarget::restore`] validates the checkpoint, opens the lazy files, connects to
//! the page-server, maps each region and registers it with the fault engine under a
//! [`FamResolver`]: faults on dumped pages are copied from the mapped file with no message.
//! [`FamTarget::complete`] touches every page (prefetch) so the migration finishes.
//!
//! Hot-page manifest ([`crate::hot`]): [`FamSource::checkpoint_with_hot`] records the pages
//! each region wrote last; the source dumps their vectors before its sweep and
//! [`FamTarget::prefetch_hot`] waits for them in FAM and touches them first, with no message.

use crate::checkpoint::Checkpoint;
use crate::lazyfile::{Batching, Dumper, LazyFile};
use crate::link::SignalSafeLink;
use crate::lookup::DumpedLookup;
use crate::mapping::Mapping;
use crate::proto::{Conn, Msg, ProtoError};
use crate::resolve::{DumpedImage, FamResolver, PageServerLink, ResolverStats};
use crate::targetmem::TargetMemory;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tiermem_fault::{Engine, RegionHandle, RegionSpec};
use tiermem_media::DelayModel;

/// Errors of a FAM-aware migration.
#[derive(Debug, thiserror::Error)]
pub enum FamError {
    /// The checkpoint file.
    #[error(transparent)]
    Checkpoint(#[from] crate::checkpoint::CheckpointError),
    /// A lazy-page file.
    #[error(transparent)]
    Lazy(#[from] crate::lazyfile::LazyError),
    /// The page-server connection.
    #[error("page-server connection: {0}")]
    Proto(#[from] ProtoError),
    /// The fault engine.
    #[error("fault engine: {0}")]
    Fault(#[from] tiermem_fault::Error),
    /// The migration's directory already exists in the FAM directory (its id is in use).
    #[error("{} already exists: migration id {id:x} is in use in this FAM directory", dir.display())]
    InUse {
        /// The existing directory.
        dir: PathBuf,
        /// The migration id.
        id: u64,
    },
    /// Anything else, said in words.
    #[error("{0}")]
    Other(String),
}

/// Result type of this module.
pub type Result<T> = std::result::Result<T, FamError>;

/// The directory of migration `id` in the FAM directory `fam`.
pub fn migration_dir(fam: &Path, id: u64) -> PathBuf {
    fam.join(format!("mig-{id:016x}"))
}

fn lazy_name(i: usize) -> String {
    format!("region-{i}.lazy")
}

/// Source-side settings.
#[derive(Clone, Debug)]
pub struct FamSourceConfig {
    /// The FAM directory shared with the target.
    pub fam: PathBuf,
    /// The migration id (its directory `mig-<id>`; the handshake checks it).
    pub id: u64,
    /// One `pwritev` per 2 MiB vector, or batches.
    pub batching: Batching,
    /// Delay model charged on the lazy files (FAM `pcm-fam`, or none).
    pub delay: DelayModel,
    /// Skip 2 MiB vectors no page of which was ever touched (they read as zeros in the
    /// reserved lazy file): a sparse region dumps only what it uses.
    pub skip_untouched: bool,
}

/// What the source did.
#[derive(Clone, Debug, Default)]
pub struct SourceReport {
    /// Checkpoint (blob + lazy files created and reserved), ns.
    pub checkpoint_ns: u64,
    /// From `checkpoint`'s start until every page was dumped and persisted, ns (busy time).
    pub busy_ns: u64,
    /// Vectors dumped on the target's demand.
    pub on_demand_vectors: u64,
    /// Fault requests answered.
    pub requests: u64,
    /// Bytes dumped.
    pub bytes: u64,
    /// The target was told `Done` (it had connected).
    pub told_done: bool,
    /// Hot vectors (the manifest's) dumped before the sweep, over all regions.
    pub hot_vectors: u64,
}

/// The source of a FAM-aware migration (see the module documentation).
pub struct FamSource {
    dumpers: Vec<Arc<Dumper>>,
    cfg: FamSourceConfig,
    started: Instant,
    checkpoint_ns: u64,
}

/// A migration's lazy files created and reserved in FAM before the application stops
/// ([`FamSource::reserve`]): a full FAM directory fails there, with the application still
/// running, and the reservation (a `fallocate` of every region's size) stays out of the
/// downtime.
pub struct Reservation {
    cfg: FamSourceConfig,
    files: Vec<Arc<LazyFile>>,
    region_lens: Vec<u64>,
}

impl Reservation {
    /// The migration's directory.
    pub fn dir(&self) -> PathBuf {
        migration_dir(&self.cfg.fam, self.cfg.id)
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        // Not used (dropped before `checkpoint_reserved` took the files): release the space.
        if !self.files.is_empty() {
            self.files.clear();
            let _ = std::fs::remove_dir_all(self.dir());
        }
    }
}

impl FamSource {
    /// Create `FAM/mig-<id>/` and one lazy file per region of the given lengths, reserving
    /// their space, while the application still runs. A full (or unwritable) FAM directory
    /// fails here and leaves nothing behind.
    pub fn reserve(cfg: FamSourceConfig, region_lens: &[u64]) -> Result<Reservation> {
        let dir = migration_dir(&cfg.fam, cfg.id);
        if dir.exists() {
            return Err(FamError::InUse { dir, id: cfg.id });
        }
        std::fs::create_dir_all(&dir)
            .map_err(|e| FamError::Other(format!("creating {}: {e}", dir.display())))?;
        let mut files = Vec::new();
        for (i, &len) in region_lens.iter().enumerate() {
            // A memory-backed file is populated too (where the machine has room: a populate
            // past it would wake the OOM killer): FAM is memory that exists, and on tmpfs
            // `fallocate` leaves pages uncleared (on this VM, unbacked by the host), so the
            // dump's first store into each would otherwise pay that inside the busy time.
            let made = LazyFile::create(&dir, &lazy_name(i), len, cfg.delay).and_then(|f| {
                let fits = tiermem_media::mem_available().map_or(true, |a| {
                    a.saturating_sub(crate::mapping::POPULATE_HEADROOM) >= len
                });
                if f.pool().persist_method() != tiermem_media::PersistMethod::Msync && fits {
                    f.pool().populate()?;
                }
                Ok(f)
            });
            match made {
                Ok(f) => files.push(Arc::new(f)),
                Err(e) => {
                    drop(files);
                    let _ = std::fs::remove_dir_all(&dir);
                    return Err(e.into());
                }
            }
        }
        Ok(Reservation {
            cfg,
            files,
            region_lens: region_lens.to_vec(),
        })
    }

    /// Write the checkpoint (`blob`, the regions' lengths) into a reservation: the step of the
    /// freeze. `regions` must have the reserved lengths, in order.
    ///
    /// # Safety
    /// Each `(base, len)` must be readable memory of this process that stays mapped and frozen
    /// (nothing writes it) until [`FamSource::serve`] returns.
    pub unsafe fn checkpoint_reserved(
        res: Reservation,
        regions: &[(*const u8, u64)],
        blob: &[u8],
    ) -> Result<FamSource> {
        // SAFETY: forwarded caller contract.
        unsafe { FamSource::checkpoint_reserved_with_hot(res, regions, blob, &[]) }
    }

    /// [`FamSource::checkpoint_reserved`] with a hot-page manifest: `hot` is empty or holds, per
    /// region, the region offsets of its recently written pages (ascending, page aligned, at
    /// most [`crate::checkpoint::MAX_HOT_PAGES`]; e.g. from
    /// [`crate::hot::HotPageRecorder::take`]). The manifest goes into the checkpoint, and
    /// [`FamSource::serve`] dumps the vectors holding those pages (the hottest first, as many
    /// as the journal holds) before its sweep. On any failure the migration directory is
    /// removed.
    ///
    /// # Safety
    /// As [`FamSource::checkpoint_reserved`].
    pub unsafe fn checkpoint_reserved_with_hot(
        mut res: Reservation,
        regions: &[(*const u8, u64)],
        blob: &[u8],
        hot: &[Vec<u64>],
    ) -> Result<FamSource> {
        let lens: Vec<u64> = regions.iter().map(|r| r.1).collect();
        if lens != res.region_lens {
            return Err(FamError::Other(format!(
                "the regions ({lens:?} bytes) are not those reserved ({:?})",
                res.region_lens
            )));
        }
        let started = Instant::now();
        let dir = res.dir();
        let files = std::mem::take(&mut res.files);
        let cfg = res.cfg.clone();
        // Only what the medium delivers in the first milliseconds, and only where the writes
        // were concentrated ([`crate::hot::select`]).
        let budget = crate::hot::budget_vectors(&cfg.delay);
        let hot: Vec<Vec<u64>> = hot
            .iter()
            .zip(&lens)
            .map(|(h, &len)| crate::hot::select(h, budget, len))
            .collect();
        let hot = if hot.iter().all(Vec::is_empty) {
            Vec::new()
        } else {
            hot
        };
        let hot = &hot[..];
        let fail = |e: FamError| {
            let _ = std::fs::remove_dir_all(&dir);
            e
        };
        let ck = Checkpoint {
            region_lens: lens,
            blob: blob.to_vec(),
            hot: hot.to_vec(),
        };
        let mut dumpers = Vec::new();
        for (i, (f, &(base, len))) in files.into_iter().zip(regions).enumerate() {
            // SAFETY: forwarded caller contract (frozen, mapped).
            let d = Arc::new(
                unsafe { Dumper::new(f, base, len, cfg.batching) }.map_err(|e| fail(e.into()))?,
            );
            d.set_skip_untouched(cfg.skip_untouched);
            if let Some(h) = hot.get(i) {
                d.set_hot_vectors(&crate::hot::hot_vectors(h));
            }
            dumpers.push(d);
        }
        ck.write(&dir.join("checkpoint"))
            .map_err(|e| fail(e.into()))?;
        Ok(FamSource {
            dumpers,
            cfg,
            started,
            checkpoint_ns: started.elapsed().as_nanos() as u64,
        })
    }

    /// [`FamSource::reserve`] then [`FamSource::checkpoint_reserved_with_hot`], for callers
    /// that reserve during the freeze.
    ///
    /// # Safety
    /// As [`FamSource::checkpoint_reserved`].
    pub unsafe fn checkpoint_with_hot(
        cfg: FamSourceConfig,
        regions: &[(*const u8, u64)],
        blob: &[u8],
        hot: &[Vec<u64>],
    ) -> Result<FamSource> {
        let lens: Vec<u64> = regions.iter().map(|r| r.1).collect();
        let res = FamSource::reserve(cfg, &lens)?;
        // SAFETY: forwarded caller contract.
        unsafe { FamSource::checkpoint_reserved_with_hot(res, regions, blob, hot) }
    }

    /// [`FamSource::checkpoint_with_hot`] without a manifest.
    ///
    /// # Safety
    /// As [`FamSource::checkpoint_reserved`].
    pub unsafe fn checkpoint(
        cfg: FamSourceConfig,
        regions: &[(*const u8, u64)],
        blob: &[u8],
    ) -> Result<FamSource> {
        // SAFETY: forwarded caller contract.
        unsafe { FamSource::checkpoint_with_hot(cfg, regions, blob, &[]) }
    }

    /// Discard each region's pages at the source once they are dumped and persisted
    /// ([`Dumper::set_release_dumped`]): the source gives its memory back as the dump goes.
    ///
    /// # Safety
    /// Nothing but this source may read the regions after the checkpoint (the application
    /// stays frozen and is never resumed here; its memory reads as zeros once dumped).
    pub unsafe fn set_release_dumped(&self, on: bool) {
        for d in &self.dumpers {
            // SAFETY: forwarded caller contract.
            unsafe { d.set_release_dumped(on) };
        }
    }

    /// Dump every region in the background and serve the target's page-server requests on
    /// `listener` until every page is dumped and persisted; then tell a connected target
    /// `Done` and return. A target that never connects does not delay the end (it learns
    /// completion from the lazy files).
    pub fn serve(self, listener: TcpListener) -> Result<SourceReport> {
        let bg = self
            .dumpers
            .iter()
            .map(|d| d.spawn_background())
            .collect::<std::result::Result<Vec<_>, _>>()?;
        listener
            .set_nonblocking(true)
            .map_err(|e| FamError::Other(format!("listener: {e}")))?;
        let mut conn: Option<Conn> = None;
        let mut requests = 0u64;
        let all_done = |d: &[Arc<Dumper>]| d.iter().all(|d| d.file().is_complete());
        while !all_done(&self.dumpers) {
            if conn.is_none() {
                match listener.accept() {
                    Ok((s, _)) => {
                        let _ = s.set_nonblocking(false);
                        let mut c = Conn::new(s, Some(Duration::from_secs(5)))?;
                        match c.server_handshake(self.cfg.id) {
                            Ok(()) => conn = Some(c),
                            Err(e) => eprintln!("migrate source: a peer failed the handshake: {e}"),
                        }
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                    Err(e) => return Err(FamError::Other(format!("accept: {e}"))),
                }
            }
            let Some(c) = conn.as_mut() else {
                std::thread::sleep(Duration::from_micros(200));
                continue;
            };
            // Wait for the start of a request without a read timeout that could cut a frame
            // in half; a started frame then gets the full timeout.
            if !crate::sigsafe::readable(c.stream().as_raw_fd(), 2).unwrap_or(false) {
                continue;
            }
            match c.recv_timeout(Some(Duration::from_secs(5))) {
                Ok(Msg::Fault { region, offset }) => {
                    requests += 1;
                    let reply = match self.dumpers.get(region as usize) {
                        Some(d) => match d.dump_vector_containing(offset) {
                            Ok(o) => Msg::FaultReply {
                                region,
                                ack: true,
                                progress: o.watermark,
                                vec_start: o.start,
                                vec_len: o.len,
                            },
                            Err(e) => Msg::Error {
                                message: e.to_string(),
                            },
                        },
                        None => Msg::Error {
                            message: format!("no region {region}"),
                        },
                    };
                    if c.send(&reply).is_err() {
                        conn = None; // the target is gone: keep dumping, it may come back
                    }
                }
                Ok(other) => {
                    let _ = c.send(&Msg::Error {
                        message: format!("unexpected {:?}", std::mem::discriminant(&other)),
                    });
                }
                Err(e) => {
                    eprintln!("migrate source: the target's connection failed: {e}");
                    conn = None;
                }
            }
        }
        let mut bytes = 0;
        let mut demand = 0;
        for h in bg {
            let s = h
                .join()
                .map_err(|_| FamError::Other("a dumper thread panicked".into()))??;
            bytes += s.bytes;
            demand += s.demand_vectors;
        }
        let busy_ns = self.started.elapsed().as_nanos() as u64;
        let hot_vectors = self.dumpers.iter().map(|d| d.hot_vectors_dumped()).sum();
        let told_done = match conn.as_mut() {
            Some(c) => c
                .send(&Msg::Done {
                    region_count: self.dumpers.len() as u32,
                })
                .is_ok(),
            None => false,
        };
        Ok(SourceReport {
            checkpoint_ns: self.checkpoint_ns,
            busy_ns,
            on_demand_vectors: demand,
            requests,
            bytes,
            told_done,
            hot_vectors,
        })
    }
}

impl DumpedImage for LazyFile {
    fn image(&self, off: u64, len: usize) -> &[u8] {
        self.range_trusted(off, len as u64).unwrap_or(&[])
    }
    fn dumped(&self, off: u64) -> bool {
        LazyFile::dumped(self, off)
    }
    fn watermark(&self) -> u64 {
        if self.is_complete() {
            self.region_len()
        } else {
            LazyFile::watermark(self)
        }
    }
}

/// A link for a target whose source is already gone: every request fails (the lazy files are
/// complete, so none is ever made).
struct NoSource;

impl PageServerLink for NoSource {
    fn request(
        &self,
        _region: u32,
        _off: u64,
    ) -> std::result::Result<crate::resolve::DumpReply, &'static str> {
        Err("the source is gone and the page is not in the lazy-page file")
    }
}

/// One restored region at the target.
pub struct TargetRegion {
    /// Unregistered before the mapping goes (see `Drop`).
    handle: Option<RegionHandle>,
    map: Option<Mapping>,
    stats: Arc<ResolverStats>,
    /// Memory reserved for the region before the freeze (completion moves it in).
    reserved: Option<Arc<TargetMemory>>,
}

impl TargetRegion {
    /// Start of the region (pages arrive on first touch).
    pub fn as_ptr(&self) -> *mut u8 {
        self.map.as_ref().map_or(std::ptr::null_mut(), |m| m.ptr)
    }
    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.map.as_ref().map_or(0, |m| m.len)
    }
    /// `true` for an empty region.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// The resolver's counters.
    pub fn stats(&self) -> &ResolverStats {
        &self.stats
    }
    /// The resolver's counters, shared: they stay readable after [`TargetRegion::into_parts`]
    /// (e.g. by a server reporting the migration's progress).
    pub fn shared_stats(&self) -> Arc<ResolverStats> {
        self.stats.clone()
    }
    /// Hand the mapping and its registration over (e.g. to a tiermem-kv volatile engine):
    /// the region no longer unmaps or unregisters on drop.
    pub fn into_parts(mut self) -> (*mut u8, usize, Option<RegionHandle>) {
        let h = self.handle.take();
        let (ptr, len) = self
            .map
            .take()
            .map_or((std::ptr::null_mut(), 0), Mapping::into_raw);
        (ptr, len, h)
    }
}

impl Drop for TargetRegion {
    fn drop(&mut self) {
        // Stop resolving faults before the memory goes (the mapping unmaps when dropped).
        if let Some(h) = self.handle.take() {
            let _ = h.unregister();
        }
    }
}

/// The target of a FAM-aware migration.
pub struct FamTarget {
    regions: Vec<TargetRegion>,
    /// The lazy files, one per region (the background completion follows their watermarks;
    /// the hot prefetch waits for its vectors).
    files: Vec<Arc<LazyFile>>,
    blob: Vec<u8>,
    link: Option<Arc<SignalSafeLink>>,
    restored: Instant,
    /// The hot-page manifest, per region (empty without one).
    hot: Vec<Vec<u64>>,
    timeout: Duration,
}

/// What [`FamTarget::prefetch_hot`] did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HotPrefetch {
    /// Hot pages touched.
    pub pages: u64,
    /// Of which were not in FAM after the wait (they asked the source).
    pub not_in_fam: u64,
    /// Time spent waiting for hot vectors to reach FAM, ns.
    pub wait_ns: u64,
}

impl FamTarget {
    /// Restore migration `id` from the FAM directory `fam`: validate the checkpoint and the lazy
    /// files, connect to the source's page-server at `source` (unless every lazy file is
    /// already complete), map and register the regions. Requests to the source time out after
    /// `timeout`. The application may run as soon as this returns.
    pub fn restore(
        fam: &Path,
        id: u64,
        source: Option<SocketAddr>,
        delay: DelayModel,
        timeout: Duration,
    ) -> Result<FamTarget> {
        FamTarget::restore_reserved(fam, id, source, delay, timeout, Vec::new())
    }

    /// [`FamTarget::restore`] into memory reserved before the freeze: `reserved[i]`
    /// ([`TargetMemory::reserve`] of region i's length, made while the application still ran at
    /// the source) receives region i's pages, which then move into the region instead of
    /// being copied into new pages. Regions without one (a shorter vector) copy as before; a
    /// reservation of the wrong length is an error.
    pub fn restore_reserved(
        fam: &Path,
        id: u64,
        source: Option<SocketAddr>,
        delay: DelayModel,
        timeout: Duration,
        reserved: Vec<TargetMemory>,
    ) -> Result<FamTarget> {
        let mut reserved: Vec<Option<Arc<TargetMemory>>> =
            reserved.into_iter().map(|s| Some(Arc::new(s))).collect();
        let dir = migration_dir(fam, id);
        let ck = Checkpoint::read(&dir.join("checkpoint"))?;
        let files: Vec<Arc<LazyFile>> = (0..ck.region_lens.len())
            .map(|i| LazyFile::open(&dir.join(lazy_name(i)), delay).map(Arc::new))
            .collect::<std::result::Result<_, _>>()?;
        for (f, &len) in files.iter().zip(&ck.region_lens) {
            if f.region_len() != len {
                return Err(FamError::Other(format!(
                    "{} holds {} bytes but the checkpoint says {len}",
                    f.path().display(),
                    f.region_len()
                )));
            }
        }
        let complete = files.iter().all(|f| f.is_complete());
        let link: Option<Arc<SignalSafeLink>> = match (complete, source) {
            (true, _) => None,
            (false, None) => {
                return Err(FamError::Other(
                    "the dump is not complete and no source address was given".into(),
                ))
            }
            (false, Some(a)) => {
                // The source finishes its dump and stops listening on its own schedule: a
                // connection it never accepted fails, and that is no error when the files
                // turned complete meanwhile (checked again after a failure).
                let connected = TcpStream::connect_timeout(&a, timeout)
                    .map_err(|e| {
                        FamError::Other(format!(
                            "the source's page-server at {a} is unreachable ({e}) and the dump \
                             is not complete"
                        ))
                    })
                    .and_then(|s| {
                        let mut c = Conn::new(
                            s.try_clone().map_err(|e| FamError::Other(e.to_string()))?,
                            Some(timeout),
                        )?;
                        c.client_handshake(id)?;
                        Ok(s)
                    });
                match connected {
                    Ok(s) => Some(Arc::new(SignalSafeLink::new(s, timeout))),
                    Err(_) if files.iter().all(|f| f.is_complete()) => None,
                    Err(e) => return Err(e),
                }
            }
        };
        let mut regions = Vec::new();
        for (i, f) in files.iter().cloned().enumerate() {
            let len = (f.region_len() as usize).div_ceil(4096) * 4096;
            let st = reserved.get_mut(i).and_then(Option::take);
            if let Some(s) = &st {
                if s.len() != len {
                    return Err(FamError::Other(format!(
                        "region {i} is {len} bytes but its reserved memory {}",
                        s.len()
                    )));
                }
            }
            let map = Mapping::new(len)
                .map_err(|e| FamError::Other(format!("mapping region {i} ({len} bytes): {e}")))?;
            let lookup = Arc::new(DumpedLookup::new());
            lookup.advance(DumpedImage::watermark(&*f));
            for (s, l) in f.journal() {
                lookup.insert(s, l);
            }
            let l: Arc<dyn PageServerLink> = match &link {
                Some(l) => l.clone(),
                None => Arc::new(NoSource),
            };
            let mut r = FamResolver::new(i as u32, f.region_len(), lookup, f.clone(), l, 64 << 10);
            if let Some(s) = &st {
                r = r.with_reserved(s.clone());
            }
            let r = Arc::new(r);
            let stats = r.stats();
            let spec = RegionSpec::new(map.ptr, len).missing(true).in_thread();
            let mut tr = TargetRegion {
                handle: None,
                map: Some(map),
                stats,
                reserved: st,
            };
            tr.handle = Some(Engine::global().register(spec, r)?);
            regions.push(tr);
        }
        Ok(FamTarget {
            regions,
            files,
            blob: ck.blob,
            link,
            restored: Instant::now(),
            hot: ck.hot,
            timeout,
        })
    }

    /// The hot-page manifest: per region, the offsets of the pages the source wrote last
    /// (empty when the source sent none).
    pub fn hot_pages(&self) -> &[Vec<u64>] {
        &self.hot
    }

    /// Touch the manifest's hot pages first (run it when the application resumes, before or
    /// beside its work): vector by vector in the order the source dumps them, wait until the
    /// lazy file shows the vector dumped (the source writes hot vectors before its sweep; the
    /// wait is bounded by the restore's `timeout` per vector), then fault its hot pages in from
    /// FAM with no message. A vector still missing after the wait is fetched on demand like any
    /// fault (a dead source then fails the access, as in [`FamTarget::complete`]). Regions
    /// taken with [`FamTarget::take_regions`] are skipped.
    pub fn prefetch_hot(&self) -> HotPrefetch {
        let mut rep = HotPrefetch::default();
        let mut waited = Duration::ZERO;
        for ((r, hot), f) in self.regions.iter().zip(&self.hot).zip(&self.files) {
            for v in crate::hot::hot_vectors(hot) {
                let lo = hot.partition_point(|&o| o < v * crate::lazyfile::VECTOR_SIZE);
                let hi = hot.partition_point(|&o| o < (v + 1) * crate::lazyfile::VECTOR_SIZE);
                let w0 = Instant::now();
                let deadline = w0 + self.timeout;
                let first = hot[lo];
                while !f.dumped(first) && Instant::now() < deadline {
                    std::thread::sleep(Duration::from_micros(50));
                }
                waited += w0.elapsed();
                if !f.dumped(first) {
                    rep.not_in_fam += (hi - lo) as u64;
                }
                for &o in &hot[lo..hi] {
                    if (o as usize) < r.len() {
                        // SAFETY: inside the region's live, registered mapping; a volatile
                        // read faults the page in through the resolver.
                        unsafe { std::ptr::read_volatile(r.as_ptr().add(o as usize)) };
                        rep.pages += 1;
                    }
                }
            }
        }
        rep.wait_ns = waited.as_nanos() as u64;
        rep
    }

    /// The application's state blob.
    pub fn blob(&self) -> &[u8] {
        &self.blob
    }

    /// The restored regions.
    pub fn regions(&self) -> &[TargetRegion] {
        &self.regions
    }

    /// Take the restored regions (e.g. to hand them to an application engine).
    pub fn take_regions(&mut self) -> Vec<TargetRegion> {
        std::mem::take(&mut self.regions)
    }

    /// Page-server requests made so far.
    pub fn requests(&self) -> u64 {
        self.link.as_ref().map_or(0, |l| l.requests())
    }

    /// Touch every page of every region (a prefetch through the resolver), so the migration
    /// completes; returns the time from restore to completion (resume time), ns.
    pub fn complete(&self) -> u64 {
        for r in &self.regions {
            // SAFETY: the region's live, registered mapping.
            unsafe { crate::resolve::prefetch(r.as_ptr(), r.len()) };
        }
        let t = self.restored.elapsed().as_nanos() as u64;
        self.release_reserved();
        t
    }

    /// Complete the migration without asking the source for anything: install every 2 MiB
    /// vector once the dump has reached it, in the order the dump makes them available — the
    /// sweep's prefix (the lazy file's watermark) and the vectors its journal shows dumped out
    /// of order (on demand, hot), lowest first — waiting `poll` between looks while none is
    /// new. The source's dumper, not this thread, sets the pace, and no page-server request
    /// is made on its behalf. Following the journal too matters: vectors dumped on demand
    /// take the medium's bandwidth from the sweep, and a completion that waited for the sweep
    /// to reach them would be left with their reads after the dump ended. Pages the
    /// application faulted meanwhile stay as they are. Returns the time from restore to
    /// completion (resume time), ns.
    pub fn complete_following(&self, poll: Duration) -> u64 {
        const VEC: u64 = crate::lazyfile::VECTOR_SIZE;
        for (r, f) in self.regions.iter().zip(&self.files) {
            let len = f.region_len() / 4096 * 4096;
            let nvec = len.div_ceil(VEC) as usize;
            let mut done = vec![false; nvec];
            let mut left = nvec;
            // Every vector below `cursor` is installed.
            let mut cursor = 0usize;
            while left > 0 {
                let complete = f.is_complete();
                let wm = if complete { len } else { f.watermark() };
                // The sweep's prefix: vectors whose end is at or below the watermark.
                let upto = if wm >= len { nvec } else { (wm / VEC) as usize };
                let mut ready: Vec<usize> =
                    (cursor..upto.max(cursor)).filter(|&v| !done[v]).collect();
                if !complete {
                    for (s, l) in f.journal() {
                        // Vectors are dumped whole: a range holds whole vectors.
                        let (a, b) = (s / VEC, (s + l).div_ceil(VEC).min(nvec as u64));
                        ready.extend((a..b).map(|v| v as usize).filter(|&v| !done[v]));
                    }
                    ready.sort_unstable();
                    ready.dedup();
                }
                if ready.is_empty() {
                    std::thread::sleep(poll);
                    continue;
                }
                for v in ready {
                    let off = v as u64 * VEC;
                    self.install_vector(r, f, off, ((v as u64 + 1) * VEC).min(len));
                    done[v] = true;
                    left -= 1;
                }
                while cursor < nvec && done[cursor] {
                    cursor += 1;
                }
            }
        }
        let t = self.restored.elapsed().as_nanos() as u64;
        self.release_reserved();
        t
    }

    /// Install the pages of region bytes `off..end` (a dumped vector) that are not present
    /// yet, run by run (`mincore` says which: the application's faults installed the others,
    /// and a sequential application has often taken a whole vector before the completion
    /// reaches it): each run read into the region's reserved memory and moved in, or one
    /// `UFFDIO_COPY` (or ZEROPAGE) out of the mapped file without one. Each read is paced as
    /// the dump's writes are (the medium's time for it or the copy's, whichever is longer),
    /// so only what is missing costs medium time. Falls back to faulting the pages in through
    /// the resolver.
    fn install_vector(&self, r: &TargetRegion, f: &LazyFile, off: u64, end: u64) {
        let n = ((end - off) / 4096) as usize;
        let mut present = [0u8; (crate::lazyfile::VECTOR_SIZE / 4096) as usize];
        // SAFETY: `off..end` lies inside the region's live mapping; mincore writes one byte
        // per page into `present`, which has room for a whole vector.
        let rc = unsafe {
            libc::mincore(
                r.as_ptr().add(off as usize).cast(),
                (end - off) as usize,
                present.as_mut_ptr(),
            )
        };
        if rc != 0 {
            present = [0; (crate::lazyfile::VECTOR_SIZE / 4096) as usize];
        }
        let mut p = 0usize;
        while p < n {
            if present[p] & 1 != 0 {
                p += 1;
                continue;
            }
            let q = (p..n).find(|&i| present[i] & 1 != 0).unwrap_or(n);
            self.install_run(r, f, off + p as u64 * 4096, off + q as u64 * 4096);
            p = q;
        }
    }

    /// [`FamTarget::install_vector`] for one run of missing pages.
    fn install_run(&self, r: &TargetRegion, f: &LazyFile, off: u64, end: u64) {
        let since = tiermem_media::now_ns();
        let read = |buf: &mut [u8]| f.read_uncharged(off, buf).is_ok();
        let installed = match (r.handle.as_ref(), r.reserved.as_ref()) {
            (Some(h), Some(m)) => m
                .install_with(h, off as usize, (end - off) as usize, read)
                .map(|x| x.is_ok()),
            _ => None,
        };
        let installed = installed.unwrap_or_else(|| {
            match (r.handle.as_ref(), f.range_uncharged(off, end - off)) {
                (Some(h), Ok(img)) if crate::resolve::is_zero(img) => {
                    h.install_zero(off as usize, img.len()).is_ok()
                }
                (Some(h), Ok(img)) => h.install(off as usize, img).is_ok(),
                _ => false,
            }
        });
        if installed {
            f.charge_read_paced(end - off, since);
            return;
        }
        let base = r.as_ptr() as *const u8;
        for p in (off..end).step_by(4096) {
            // SAFETY: inside the region's live, registered mapping; a volatile read so the
            // fault (resolved from FAM: the page is dumped) happens.
            unsafe { std::ptr::read_volatile(base.add(p as usize)) };
        }
    }

    /// Free the reserved memory no page was moved out of (every region is complete: faults
    /// from now on copy). Done by the completions; call it after completing some other way.
    pub fn release_reserved(&self) {
        for st in self.regions.iter().filter_map(|r| r.reserved.as_ref()) {
            st.release();
        }
    }

    /// Faults served from FAM with no message, and on demand, over all regions.
    pub fn fault_counts(&self) -> (u64, u64) {
        self.regions.iter().fold((0, 0), |(a, b), r| {
            (
                a + r.stats.from_fam.load(Ordering::Relaxed),
                b + r.stats.on_demand.load(Ordering::Relaxed),
            )
        })
    }
}

/// Stop-and-copy (the non-live baseline) through the same FAM directory: with the region
/// frozen, dump every page to FAM (no target runs meanwhile: downtime = the whole dump), then
/// restore at the target and resume. Source and target are both this process here (the
/// target side is [`FamTarget::restore`] without a source, which is what another host runs).
/// Returns the metrics and the restored target (every page already in FAM: faults never leave
/// the target host).
///
/// # Safety
/// Each `(base, len)` must stay mapped and unmodified until this returns.
pub unsafe fn stop_and_copy(
    cfg: FamSourceConfig,
    regions: &[(*const u8, u64)],
    blob: &[u8],
) -> Result<(crate::metrics::Metrics, FamTarget)> {
    let t0 = Instant::now();
    let (fam, id, delay) = (cfg.fam.clone(), cfg.id, cfg.delay);
    // SAFETY: forwarded caller contract.
    let source = unsafe { FamSource::checkpoint(cfg, regions, blob)? };
    // Nobody connects: serve returns when the dump is complete and persisted.
    let listener = TcpListener::bind("127.0.0.1:0")
        .map_err(|e| FamError::Other(format!("stop-and-copy listener: {e}")))?;
    let report = source.serve(listener)?;
    let target = FamTarget::restore(&fam, id, None, delay, Duration::from_secs(5))?;
    let downtime_ns = t0.elapsed().as_nanos() as u64;
    let resume_ns = target.complete();
    let (from_fam, on_demand) = target.fault_counts();
    Ok((
        crate::metrics::Metrics {
            method: "stop-and-copy".into(),
            downtime_ns,
            resume_ns,
            busy_ns: report.busy_ns,
            total_ns: downtime_ns + resume_ns,
            pages_on_demand: on_demand,
            faults_from_fam: from_fam,
            pages_pushed: 0,
            bytes: report.bytes,
            reserve_ns: 0,
        },
        target,
    ))
}
