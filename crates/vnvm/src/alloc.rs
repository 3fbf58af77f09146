//! A transactional allocator inside a region (`nv_tx_alloc` / `nv_tx_free`, a root object).
//!
//! The thesis has none; every PMDK user expects one. It is built **only on the public
//! transactional API**: every change of allocator metadata is an [`Vnvm::nv_write`] of the
//! caller's transaction, so the metadata is exactly as crash-consistent as the caller's data. An
//! aborted or crashed transaction leaks nothing and double-allocates nothing; a committed one
//! keeps its allocations and frees.
//!
//! ## Layout (all words little-endian `u64`, offsets from the start of the region)
//!
//! ```text
//! 0    magic "tmalloc1"            8    version (1)
//! 16   heap_start (= 256)          24   heap_end (region size at format time)
//! 32   root (payload offset or 0)  40   bump (next never-used byte of the heap)
//! 48   13 free-list heads of the small classes (16 B, 32 B, ... 64 KiB payloads)
//! 152  free-list head of large blocks
//! 160  crc32 of bytes 0..160 (rewritten by every allocator operation)
//! 168  reserved up to 256
//! ```
//!
//! A block is a 16-byte header followed by its payload; handles are payload offsets (16-byte
//! aligned). Header word 0 is `crc32(magic, block offset, state, class, size) << 32 | class << 8
//! | state`, word 1 the block's total size. A header therefore validates only at its own offset:
//! [`TxAlloc::nv_tx_free`] of an offset that is not an allocated block's payload is a clear
//! error ([`AllocError::BadOffset`], [`AllocError::DoubleFree`]), never a corrupted heap. A free
//! block keeps the offset of the next free block of its list in its first payload word.
//! Small classes are powers of two from 16 B to 64 KiB, carved one block at a time from the bump
//! area; larger requests are whole multiples of 4 KiB (header included), first-fit from the large
//! free list (split when the rest is itself a large block) or from the bump area. Freed blocks
//! are not coalesced.
//!
//! ## Read committed, and the per-transaction overlay
//!
//! The region's view shows committed data only, so a transaction does not see its own earlier
//! metadata writes there. [`TxAlloc`] keeps them in a small DRAM overlay (word offset → value)
//! owned by the one transaction that currently **holds** the allocator: a transaction takes the
//! allocator with its first allocator operation and holds it until it ends. That is also the
//! thesis' ordering rule (the transaction that writes an object first commits first) applied to
//! the allocator metadata: no other transaction can write it in between.
//!
//! End the transaction with [`TxAlloc::commit`] / [`TxAlloc::abort`] (or call
//! [`TxAlloc::end_tx`] after [`Vnvm::nv_commit`] / [`Vnvm::nv_abort`], e.g. for a transaction
//! that used the allocators of several regions). If a transaction was ended behind the
//! allocator's back (a plain `nv_commit`, an age abort by the redo worker), the next operation
//! of another transaction notices (the tid is no longer open), waits until a commit's writes are
//! visible, and takes over. Another transaction waits for the allocator up to
//! [`TxAlloc::set_lock_timeout`] (default 10 s), then fails with [`AllocError::Busy`].

use crate::{Region, Tid, Vnvm, VnvmError};
use parking_lot::{Condvar, Mutex};
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, OnceLock, Weak};
use std::time::{Duration, Instant};

/// Magic of an allocator header ("tmalloc1").
pub const HEAP_MAGIC: u64 = u64::from_le_bytes(*b"tmalloc1");
/// Version of the allocator layout.
pub const HEAP_VERSION: u64 = 1;
/// Bytes reserved for the allocator header at the start of the region.
pub const HEAP_HEADER: u64 = 256;
/// Bytes of a block header before each payload.
pub const BLOCK_HEADER: u64 = 16;
/// Number of small size classes (payloads 16 B << c for c in 0..13).
pub const SMALL_CLASSES: usize = 13;
/// Largest payload of a small class (64 KiB).
pub const MAX_SMALL: u64 = 16 << (SMALL_CLASSES - 1);
/// Large blocks (header included) are multiples of this.
pub const LARGE_UNIT: u64 = 4096;

const W_MAGIC: u64 = 0;
const W_VERSION: u64 = 8;
const W_HEAP_START: u64 = 16;
const W_HEAP_END: u64 = 24;
const W_ROOT: u64 = 32;
const W_BUMP: u64 = 40;
const W_HEADS: u64 = 48;
const W_LARGE: u64 = W_HEADS + 8 * SMALL_CLASSES as u64;
const W_CRC: u64 = W_LARGE + 8;
const CLASS_LARGE: u8 = 0xff;
const ST_ALLOC: u8 = 0xa1;
const ST_FREE: u8 = 0xf3;
const BLOCK_MAGIC: &[u8; 8] = b"tmblock1";
/// Smallest large block (header included).
const LARGE_MIN: u64 = (MAX_SMALL + 1 + BLOCK_HEADER).div_ceil(LARGE_UNIT) * LARGE_UNIT;

/// Errors of the allocator. `Vnvm` wraps the errors of the transactional calls it makes (a tid
/// that is not open, the log, the region).
#[derive(Debug, thiserror::Error)]
pub enum AllocError {
    /// An error of the underlying transactional API (bad tid, log full, region freed, ...).
    #[error(transparent)]
    Vnvm(#[from] VnvmError),

    /// The region holds something other than an allocator heap (its header is neither an
    /// allocator header nor all zero). Nothing was written.
    #[error("region {path} holds no allocator heap: {detail} (nothing was written)")]
    NotAHeap {
        /// The backing file.
        path: String,
        /// What was found.
        detail: String,
    },

    /// Allocator metadata failed validation. Nothing was written.
    #[error("damaged allocator {what} at region offset {offset} of {path}: {detail} (nothing was written)")]
    Damaged {
        /// The backing file.
        path: String,
        /// Which structure.
        what: &'static str,
        /// Its region offset.
        offset: u64,
        /// What is wrong.
        detail: String,
    },

    /// A size of 0, or larger than the heap could ever hold.
    #[error("invalid allocation size {size} (must be 1..={max})")]
    InvalidSize {
        /// The requested size.
        size: u64,
        /// The largest size the heap could ever hold.
        max: u64,
    },

    /// Not enough free space in the heap for the request.
    #[error(
        "out of space: no free block of {size} bytes and {bump_left} bytes left in the bump area"
    )]
    OutOfSpace {
        /// The requested size.
        size: u64,
        /// Bytes never yet allocated.
        bump_left: u64,
    },

    /// The offset is not the payload offset of a block of this heap (outside the heap,
    /// misaligned, inside a block, or the root object being freed).
    #[error("offset {offset} is not an allocated block of this heap: {reason}")]
    BadOffset {
        /// The rejected offset.
        offset: u64,
        /// Why.
        reason: String,
    },

    /// The block is already free (freed by a committed transaction or earlier in this one).
    #[error("double free: the block at offset {offset} is already free")]
    DoubleFree {
        /// The block's payload offset.
        offset: u64,
    },

    /// Another transaction holds the allocator and did not end within the lock timeout.
    #[error("allocator busy: transaction {holder} holds it (tid {tid} waited {waited_ms} ms); commit or abort {holder} first")]
    Busy {
        /// The waiting transaction.
        tid: Tid,
        /// The transaction holding the allocator.
        holder: Tid,
        /// How long it waited.
        waited_ms: u64,
    },

    /// The log filled up in the middle of an allocator update and no space came within the lock
    /// timeout. The transaction was **aborted** so that half-written allocator metadata can never
    /// commit.
    #[error("log full during an allocator update of transaction {tid}: the transaction was aborted (its allocator changes could not be logged completely)")]
    LogFullAborted {
        /// The aborted transaction.
        tid: Tid,
    },
}

/// Result type of the allocator.
pub type AllocResult<T> = std::result::Result<T, AllocError>;

/// Occupancy of a heap, from a full walk of its committed blocks ([`TxAlloc::check`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HeapStats {
    /// Allocated blocks.
    pub allocated_blocks: u64,
    /// Payload bytes of the allocated blocks (usable sizes).
    pub allocated_bytes: u64,
    /// Free blocks (all on free lists).
    pub free_blocks: u64,
    /// Total bytes of the free blocks, headers included.
    pub free_bytes: u64,
    /// First never-used byte.
    pub bump: u64,
    /// End of the heap.
    pub heap_end: u64,
    /// The committed root (0: none).
    pub root: u64,
}

struct State {
    /// The transaction holding the allocator and its uncommitted metadata words.
    owner: Option<Tid>,
    overlay: BTreeMap<u64, u64>,
}

struct Shared {
    /// The vnvm region, when the allocator is over one (keeps its mapping alive).
    region: Option<Region>,
    /// Start and length of the committed view.
    base: usize,
    len: u64,
    path: String,
    state: Mutex<State>,
    cv: Condvar,
    timeout_ms: std::sync::atomic::AtomicU64,
}

/// The allocator of one region. Cheap to clone; every [`TxAlloc::open`] of the same region (the
/// same mapping) returns a handle to the same allocator, so the hold-until-commit rule holds
/// across handles. `Send + Sync`.
#[derive(Clone)]
pub struct TxAlloc(Arc<Shared>);

impl std::fmt::Debug for TxAlloc {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TxAlloc")
            .field("region", &self.0.path)
            .finish()
    }
}

fn registry() -> &'static Mutex<HashMap<usize, Weak<Shared>>> {
    static R: OnceLock<Mutex<HashMap<usize, Weak<Shared>>>> = OnceLock::new();
    R.get_or_init(|| Mutex::new(HashMap::new()))
}

fn class_of(size: u64) -> Option<u8> {
    if size <= 16 {
        Some(0)
    } else if size <= MAX_SMALL {
        Some((64 - (size - 1).leading_zeros() - 4) as u8)
    } else {
        None
    }
}

fn block_size(class: u8, size: u64) -> u64 {
    if class == CLASS_LARGE {
        (size + BLOCK_HEADER).div_ceil(LARGE_UNIT) * LARGE_UNIT
    } else {
        (16u64 << class) + BLOCK_HEADER
    }
}

fn tag(block: u64, state: u8, class: u8, size: u64) -> u64 {
    let mut h = crc32fast::Hasher::new();
    h.update(BLOCK_MAGIC);
    h.update(&block.to_le_bytes());
    h.update(&[state, class]);
    h.update(&size.to_le_bytes());
    (h.finalize() as u64) << 32 | (class as u64) << 8 | state as u64
}

/// A view of the heap's words for one transaction: the overlay over the committed view.
struct View<'a> {
    base: *const u8,
    len: u64,
    overlay: &'a BTreeMap<u64, u64>,
}

impl View<'_> {
    fn word(&self, off: u64) -> u64 {
        if let Some(v) = self.overlay.get(&off) {
            return *v;
        }
        committed_word(self.base, self.len, off)
    }

    /// [`header_crc`] of the header as this view reads it: the committed words with one range
    /// query of the overlay, not a lookup per word (a lookup per word, twice an operation, was
    /// a fifth of an allocation's instructions; callgrind, kv SET of new keys).
    fn header_crc(&self) -> u64 {
        const N: usize = (W_CRC / 8) as usize;
        let mut words = [0u64; N];
        for (i, w) in words.iter_mut().enumerate() {
            *w = committed_word(self.base, self.len, i as u64 * 8);
        }
        for (&o, &v) in self.overlay.range(0..W_CRC) {
            // cannot fail: overlay keys are word offsets (`put` logs whole words).
            if let Some(w) = words.get_mut((o / 8) as usize) {
                *w = v;
            }
        }
        let mut bytes = [0u8; N * 8];
        for (c, w) in bytes.chunks_exact_mut(8).zip(words) {
            c.copy_from_slice(&w.to_le_bytes());
        }
        crc32fast::hash(&bytes) as u64
    }
}

fn committed_word(base: *const u8, len: u64, off: u64) -> u64 {
    // cannot fail: callers read header words (constants < HEAP_HEADER ≤ len) or words of
    // blocks validated to lie below the validated bump ≤ heap end ≤ len.
    assert!(
        off % 8 == 0 && off + 8 <= len,
        "word {off} outside the region"
    );
    // SAFETY: 8-aligned (the mapping is page-aligned) and inside the region's read-only view,
    // which lives as long as the Region the caller holds. Volatile: a commit may be copying
    // into it concurrently (then the value is re-read or validated).
    unsafe { std::ptr::read_volatile(base.add(off as usize).cast::<u64>()) }
}

fn header_crc(w: impl Fn(u64) -> u64) -> u64 {
    let mut h = crc32fast::Hasher::new();
    let mut off = 0;
    while off < W_CRC {
        h.update(&w(off).to_le_bytes());
        off += 8;
    }
    h.finalize() as u64
}

/// A transactional memory the allocator can live in: a committed view read with plain loads,
/// and writes logged in a transaction that become visible (and, where the memory is durable,
/// durable) together at its commit. A vnvm region is one ([`VnvmMemory`]); tiermem-kv's
/// volatile engine provides another, so one allocator serves both.
///
/// Contract: `write` of an open transaction either logs all of `src` (returns its length),
/// part of it (`Err(VnvmError::LogFull { logged })`, after which [`TxMemory::wait_space`] may
/// make room), or nothing (an error); a zero-length write is how the allocator asks whether a
/// tid is still open (`Err(VnvmError::TxCommitted)` / `TxAborted` / `BadTid` otherwise). The
/// committed view must not change except at commits.
pub trait TxMemory {
    /// Start of the committed, read-only view.
    fn base(&self) -> *const u8;
    /// Length of the view in bytes.
    fn len(&self) -> usize;
    /// `true` for an empty view.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// What to call this memory in errors (a backing file's path).
    fn describe(&self) -> String;
    /// Begin a transaction.
    fn begin(&self) -> Tid;
    /// Log `src` for view offset `off` in transaction `tid` (see the trait's contract).
    fn write(&self, tid: Tid, off: u64, src: &[u8]) -> std::result::Result<usize, VnvmError>;
    /// Wait up to `timeout` for log space; `false` if none came.
    fn wait_space(&self, timeout: Duration) -> bool;
    /// Commit `tid`: its writes become visible (and durable, on a durable memory).
    fn commit(&self, tid: Tid) -> std::result::Result<(), VnvmError>;
    /// Commit `tid` visible now, durable at [`TxMemory::sync_to`] of the returned ticket (see
    /// [`Vnvm::nv_commit_staged`]). Default: [`TxMemory::commit`], ticket 0 (durable already).
    fn commit_staged(&self, tid: Tid) -> std::result::Result<u64, VnvmError> {
        self.commit(tid).map(|()| 0)
    }
    /// Make every commit staged up to `ticket` durable (see [`Vnvm::nv_sync`]). Default:
    /// nothing to do.
    fn sync_to(&self, _ticket: u64) -> std::result::Result<(), VnvmError> {
        Ok(())
    }
    /// The last ticket staged so far (0: none). Default: 0.
    fn staged_ticket(&self) -> u64 {
        0
    }
    /// The highest ticket known durable (see [`Vnvm::nv_durable_ticket`]). Default:
    /// `u64::MAX` (commits are durable at once).
    fn durable_ticket(&self) -> u64 {
        u64::MAX
    }
    /// Abort `tid`: its writes are dropped.
    fn abort(&self, tid: Tid) -> std::result::Result<(), VnvmError>;
}

/// A vnvm region as a [`TxMemory`]: `nv_write` / `nv_commit` / `nv_abort` of its instance.
#[derive(Clone, Copy)]
pub struct VnvmMemory<'a> {
    /// The instance.
    pub vn: &'a Vnvm,
    /// The region (of that instance).
    pub region: &'a Region,
}

impl TxMemory for VnvmMemory<'_> {
    fn base(&self) -> *const u8 {
        self.region.as_ptr()
    }
    fn len(&self) -> usize {
        self.region.len()
    }
    fn describe(&self) -> String {
        self.region.path().display().to_string()
    }
    fn begin(&self) -> Tid {
        self.vn.nv_txbegin()
    }
    fn write(&self, tid: Tid, off: u64, src: &[u8]) -> std::result::Result<usize, VnvmError> {
        // Pointer arithmetic only: nv_write checks the destination against the region.
        let dst = self.region.as_ptr().wrapping_add(off as usize);
        self.vn.nv_write(tid, dst, src)
    }
    fn wait_space(&self, timeout: Duration) -> bool {
        self.vn.nv_wait_log_space(timeout)
    }
    fn commit(&self, tid: Tid) -> std::result::Result<(), VnvmError> {
        self.vn.nv_commit(tid)
    }
    fn commit_staged(&self, tid: Tid) -> std::result::Result<u64, VnvmError> {
        self.vn.nv_commit_staged(tid)
    }
    fn sync_to(&self, ticket: u64) -> std::result::Result<(), VnvmError> {
        self.vn.nv_sync(ticket)
    }
    fn staged_ticket(&self) -> u64 {
        self.vn.nv_staged_ticket()
    }
    fn durable_ticket(&self) -> u64 {
        self.vn.nv_durable_ticket()
    }
    fn abort(&self, tid: Tid) -> std::result::Result<(), VnvmError> {
        self.vn.nv_abort(tid)
    }
}

impl TxAlloc {
    /// The allocator of `region`: validates an existing heap (magic, version, checksum, sizes),
    /// or formats one in its own committed transaction when the first [`HEAP_HEADER`] bytes of
    /// the region are all zero (a new file).
    ///
    /// Errors: [`AllocError::NotAHeap`] when the region holds other data;
    /// [`AllocError::Damaged`] for a header that fails validation; [`AllocError::InvalidSize`]
    /// for a region too small for a heap (< 4 KiB); errors of the format transaction.
    pub fn open(vn: &Vnvm, region: &Region) -> AllocResult<TxAlloc> {
        Self::open_in(&VnvmMemory { vn, region }, Some(region.clone()))
    }

    /// [`TxAlloc::open`] over any [`TxMemory`]; `region` keeps a vnvm region's mapping alive
    /// (`None` for other memories, whose owner keeps the view mapped while the allocator
    /// lives: drop the allocator before unmapping). Allocators are shared per view address,
    /// as for `open`, between memories of the same [`TxMemory::describe`] and length.
    pub fn open_in(m: &dyn TxMemory, region: Option<Region>) -> AllocResult<TxAlloc> {
        let key = m.base() as usize;
        let mut reg = registry().lock();
        reg.retain(|_, w| w.strong_count() > 0);
        // Shared only with an allocator of this very memory: one of another memory (path or
        // length differ) outlived its memory's mapping, breaking the contract above, and this
        // memory was then mapped at the reused address. Handing it out would skip formatting
        // a new memory (and read it as damaged); this memory gets its own allocator instead.
        if let Some(s) = reg.get(&key).and_then(Weak::upgrade) {
            if s.len == m.len() as u64 && s.path == m.describe() {
                return Ok(TxAlloc(s));
            }
        }
        let a = TxAlloc(Arc::new(Shared {
            region,
            base: m.base() as usize,
            len: m.len() as u64,
            path: m.describe(),
            state: Mutex::new(State {
                owner: None,
                overlay: BTreeMap::new(),
            }),
            cv: Condvar::new(),
            timeout_ms: 10_000.into(),
        }));
        let len = m.len() as u64;
        if len < LARGE_UNIT {
            return Err(AllocError::InvalidSize {
                size: len,
                max: u64::MAX,
            });
        }
        let hdr_zero = (0..HEAP_HEADER)
            .step_by(8)
            .all(|o| committed_word(m.base(), len, o) == 0);
        if hdr_zero {
            a.format(m)?;
        } else {
            let st = a.0.state.lock();
            let v = a.view(&st.overlay);
            if v.word(W_MAGIC) != HEAP_MAGIC {
                return Err(AllocError::NotAHeap {
                    path: a.0.path.clone(),
                    detail: format!(
                        "magic {:#018x} (expected {HEAP_MAGIC:#018x}) and the header is not all zero",
                        v.word(W_MAGIC)
                    ),
                });
            }
            a.validate_header(&v)?;
        }
        reg.insert(key, Arc::downgrade(&a.0));
        Ok(a)
    }

    fn format(&self, m: &dyn TxMemory) -> AllocResult<()> {
        let len = self.0.len;
        let end = len & !15;
        let mut words = vec![
            (W_MAGIC, HEAP_MAGIC),
            (W_VERSION, HEAP_VERSION),
            (W_HEAP_START, HEAP_HEADER),
            (W_HEAP_END, end),
            (W_ROOT, 0),
            (W_BUMP, HEAP_HEADER),
        ];
        let map: BTreeMap<u64, u64> = words.iter().copied().collect();
        let crc = header_crc(|o| map.get(&o).copied().unwrap_or(0));
        words.push((W_CRC, crc));
        let mut buf = [0u8; HEAP_HEADER as usize];
        for (o, v) in words {
            buf[o as usize..o as usize + 8].copy_from_slice(&v.to_le_bytes());
        }
        let tid = m.begin();
        if let Err(e) = self.write_all(m, tid, 0, &buf) {
            let _ = m.abort(tid);
            return Err(e.into());
        }
        m.commit(tid)?;
        Ok(())
    }

    /// Log all of `src` at `off`, waiting for log space (up to the lock timeout each time).
    fn write_all(
        &self,
        m: &dyn TxMemory,
        tid: Tid,
        off: u64,
        src: &[u8],
    ) -> std::result::Result<(), VnvmError> {
        let mut done = 0;
        while done < src.len() {
            match m.write(tid, off + done as u64, &src[done..]) {
                Ok(n) => done += n,
                Err(VnvmError::LogFull { logged }) => {
                    done += logged;
                    if done < src.len() && !m.wait_space(self.timeout()) {
                        return Err(VnvmError::LogFull { logged: 0 });
                    }
                }
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// How long an operation waits for the allocator held by another transaction (and for log
    /// space in the middle of an update) before failing.
    pub fn set_lock_timeout(&self, t: Duration) {
        self.0
            .timeout_ms
            .store(t.as_millis() as u64, std::sync::atomic::Ordering::Relaxed);
    }

    fn timeout(&self) -> Duration {
        Duration::from_millis(self.0.timeout_ms.load(std::sync::atomic::Ordering::Relaxed))
    }

    /// The vnvm region of this allocator (`None` when it lives in another [`TxMemory`]).
    pub fn region(&self) -> Option<&Region> {
        self.0.region.as_ref()
    }

    /// The vnvm memory of this allocator with instance `vn`.
    ///
    /// Panics if the allocator was opened over another [`TxMemory`] ([`TxAlloc::open_in`]
    /// with no region): the `nv_*` methods are for vnvm regions, the `*_in` ones for any memory.
    fn vnvm<'a>(&'a self, vn: &'a Vnvm) -> VnvmMemory<'a> {
        let region = self
            .0
            .region
            .as_ref()
            .expect("TxAlloc::nv_* on an allocator that is not over a vnvm region");
        VnvmMemory { vn, region }
    }

    fn view<'a>(&self, overlay: &'a BTreeMap<u64, u64>) -> View<'a> {
        View {
            base: self.0.base as *const u8,
            len: self.0.len,
            overlay,
        }
    }

    fn damaged(&self, what: &'static str, offset: u64, detail: impl Into<String>) -> AllocError {
        AllocError::Damaged {
            path: self.0.path.clone(),
            what,
            offset,
            detail: detail.into(),
        }
    }

    fn validate_header(&self, v: &View) -> AllocResult<()> {
        let bad = |d: String| Err(self.damaged("header", 0, d));
        if v.word(W_MAGIC) != HEAP_MAGIC {
            return bad(format!("magic {:#018x}", v.word(W_MAGIC)));
        }
        if v.word(W_VERSION) != HEAP_VERSION {
            return bad(format!(
                "version {} (this build reads {HEAP_VERSION})",
                v.word(W_VERSION)
            ));
        }
        let crc = v.header_crc();
        if v.word(W_CRC) != crc {
            return bad(format!("checksum {:#x}, computed {crc:#x}", v.word(W_CRC)));
        }
        let (start, end, bump) = (v.word(W_HEAP_START), v.word(W_HEAP_END), v.word(W_BUMP));
        if start != HEAP_HEADER
            || end > v.len
            || end % 16 != 0
            || bump < start
            || bump > end
            || bump % 16 != 0
        {
            return bad(format!(
                "heap start {start}, end {end}, bump {bump} inconsistent with a {}-byte region",
                v.len
            ));
        }
        Ok(())
    }

    /// Validate the block whose header is at `block` (state, class, size, bounds). Returns
    /// (state, class, size).
    fn block(&self, v: &View, block: u64, what: &'static str) -> AllocResult<(u8, u8, u64)> {
        let bump = v.word(W_BUMP);
        if block < HEAP_HEADER || block % 16 != 0 || block + BLOCK_HEADER > bump {
            return Err(self.damaged(what, block, "block offset outside the used heap"));
        }
        let t = v.word(block);
        let size = v.word(block + 8);
        let (state, class) = (t as u8, (t >> 8) as u8);
        if t != tag(block, state, class, size)
            || !(state == ST_ALLOC || state == ST_FREE)
            || block.checked_add(size).map_or(true, |e| e > bump)
            || (class != CLASS_LARGE
                && (class as usize >= SMALL_CLASSES || size != block_size(class, 0)))
            || (class == CLASS_LARGE && (size < LARGE_MIN || size % LARGE_UNIT != 0))
        {
            return Err(self.damaged(
                what,
                block,
                format!("block header {t:#018x} / size {size} does not validate"),
            ));
        }
        Ok((state, class, size))
    }

    /// Validate a free-list link: 0 or a free block of `class`.
    fn free_block(&self, v: &View, block: u64, class: u8) -> AllocResult<()> {
        if block == 0 {
            return Ok(());
        }
        let (state, c, _) = self.block(v, block, "free list")?;
        if state != ST_FREE || c != class {
            return Err(self.damaged(
                "free list",
                block,
                format!("block on the class-{class} free list has state {state:#x}, class {c}"),
            ));
        }
        Ok(())
    }

    /// Check that `tid` is open (a zero-length `nv_write` reports the tid's state); on any
    /// error, a finished owner is released first.
    fn probe(&self, m: &dyn TxMemory, tid: Tid) -> std::result::Result<(), VnvmError> {
        m.write(tid, 0, &[]).map(|_| ())
    }

    /// Release the allocator from a finished owner. After a commit, wait (bounded) until the
    /// committed view shows the overlay's values, so nothing reads pre-commit metadata.
    fn heal(&self, st: &mut State, committed: bool) {
        if committed {
            let deadline = Instant::now() + Duration::from_secs(1);
            let (base, len) = (self.0.base as *const u8, self.0.len);
            while st
                .overlay
                .iter()
                .any(|(&o, &v)| committed_word(base, len, o) != v)
                && Instant::now() < deadline
            {
                std::thread::yield_now();
            }
        }
        st.owner = None;
        st.overlay.clear();
        self.0.cv.notify_all();
    }

    /// Take the allocator for `tid` (waiting for another owner), returning the locked state.
    fn acquire(
        &self,
        m: &dyn TxMemory,
        tid: Tid,
    ) -> AllocResult<parking_lot::MutexGuard<'_, State>> {
        let start = Instant::now();
        let timeout = self.timeout();
        let mut st = self.0.state.lock();
        loop {
            match st.owner {
                None => {
                    self.probe(m, tid)?;
                    st.owner = Some(tid);
                    return Ok(st);
                }
                Some(o) if o == tid => {
                    if let Err(e) = self.probe(m, tid) {
                        self.heal(&mut st, matches!(e, VnvmError::TxCommitted(_)));
                        return Err(e.into());
                    }
                    return Ok(st);
                }
                Some(o) => {
                    self.probe(m, tid)?;
                    if let Err(e) = self.probe(m, o) {
                        self.heal(&mut st, matches!(e, VnvmError::TxCommitted(_)));
                        continue;
                    }
                    let waited = start.elapsed();
                    if waited >= timeout {
                        return Err(AllocError::Busy {
                            tid,
                            holder: o,
                            waited_ms: waited.as_millis() as u64,
                        });
                    }
                    let slice = (timeout - waited).min(Duration::from_millis(5));
                    self.0.cv.wait_for(&mut st, slice);
                }
            }
        }
    }

    /// Log one metadata word and record it in the overlay. On a log that stays full the
    /// transaction is aborted ([`AllocError::LogFullAborted`]).
    fn put(
        &self,
        m: &dyn TxMemory,
        st: &mut State,
        tid: Tid,
        off: u64,
        val: u64,
    ) -> AllocResult<()> {
        self.put_words(m, st, tid, off, &[val])
    }

    /// [`TxAlloc::put`] of one or two adjacent words from `off` as one logged write (a block's
    /// tag and size: one log entry instead of two).
    fn put_words(
        &self,
        m: &dyn TxMemory,
        st: &mut State,
        tid: Tid,
        off: u64,
        vals: &[u64],
    ) -> AllocResult<()> {
        debug_assert!(!vals.is_empty() && vals.len() <= 2, "one or two words");
        let mut b = [0u8; 16];
        let n = vals.len().min(2);
        for (c, v) in b.chunks_exact_mut(8).zip(&vals[..n]) {
            c.copy_from_slice(&v.to_le_bytes());
        }
        match self.write_all(m, tid, off, &b[..8 * n]) {
            Ok(()) => {}
            Err(VnvmError::LogFull { .. }) => {
                let _ = m.abort(tid);
                self.heal(st, false);
                return Err(AllocError::LogFullAborted { tid });
            }
            Err(e) => {
                // Possibly half an update logged: never let it commit.
                let _ = m.abort(tid);
                self.heal(st, false);
                return Err(e.into());
            }
        }
        for (k, &v) in vals[..n].iter().enumerate() {
            st.overlay.insert(off + 8 * k as u64, v);
        }
        Ok(())
    }

    /// Rewrite the header checksum after an operation's changes.
    fn seal(&self, m: &dyn TxMemory, st: &mut State, tid: Tid) -> AllocResult<()> {
        let crc = self.view(&st.overlay).header_crc();
        self.put(m, st, tid, W_CRC, crc)
    }

    /// Allocate `size` bytes in transaction `tid` (the `nv_tx_alloc` of the C API). Returns the
    /// payload's region offset (16-byte aligned; `region.as_ptr() + offset` is its address).
    /// The block becomes allocated when `tid` commits; if `tid` aborts or the process crashes
    /// first, it stays free. The contents are whatever the block held before (zero for memory
    /// never allocated); write them with `nv_write` in the same or a later transaction, or use
    /// [`TxAlloc::nv_tx_zalloc`].
    ///
    /// Errors: [`AllocError::InvalidSize`], [`AllocError::OutOfSpace`],
    /// [`AllocError::Busy`], [`AllocError::Damaged`], [`AllocError::LogFullAborted`], and the
    /// tid errors of `nv_write` (wrapped in [`AllocError::Vnvm`]).
    pub fn nv_tx_alloc(&self, vn: &Vnvm, tid: Tid, size: u64) -> AllocResult<u64> {
        self.alloc_in(&self.vnvm(vn), tid, size)
    }

    /// [`TxAlloc::nv_tx_alloc`] in any [`TxMemory`] (the one the allocator was opened over).
    pub fn alloc_in(&self, m: &dyn TxMemory, tid: Tid, size: u64) -> AllocResult<u64> {
        let max = self.0.len - HEAP_HEADER - BLOCK_HEADER;
        if size == 0 || size > max {
            return Err(AllocError::InvalidSize { size, max });
        }
        let mut st = self.acquire(m, tid)?;
        let st = &mut *st;
        let v = self.view(&st.overlay);
        self.validate_header(&v)?;
        let (class, need) = match class_of(size) {
            Some(c) => (c, block_size(c, 0)),
            None => (CLASS_LARGE, block_size(CLASS_LARGE, size)),
        };
        // 1. A free block of the class (first fit for large blocks).
        let head_word = if class == CLASS_LARGE {
            W_LARGE
        } else {
            W_HEADS + 8 * class as u64
        };
        let mut prev_link = head_word;
        let mut cur = v.word(head_word);
        let mut steps = 0u64;
        let limit = (v.word(W_HEAP_END) - HEAP_HEADER) / 32 + 1;
        while cur != 0 {
            self.free_block(&v, cur, class)?;
            let size_cur = v.word(cur + 8);
            let next = v.word(cur + BLOCK_HEADER);
            self.free_block(&v, next, class)?;
            if size_cur >= need {
                let mut writes = vec![(prev_link, next)];
                let mut size_out = size_cur;
                if class == CLASS_LARGE && size_cur - need >= LARGE_MIN {
                    // Split: the rest becomes a free large block at the head of the list.
                    let rest = cur + need;
                    let rest_size = size_cur - need;
                    let new_head = if prev_link == head_word {
                        next
                    } else {
                        v.word(head_word)
                    };
                    writes.push((rest, tag(rest, ST_FREE, CLASS_LARGE, rest_size)));
                    writes.push((rest + 8, rest_size));
                    writes.push((rest + BLOCK_HEADER, new_head));
                    writes.push((head_word, rest));
                    writes.push((cur + 8, need));
                    size_out = need;
                }
                writes.push((cur, tag(cur, ST_ALLOC, class, size_out)));
                for (o, val) in writes {
                    self.put(m, st, tid, o, val)?;
                }
                self.seal(m, st, tid)?;
                return Ok(cur + BLOCK_HEADER);
            }
            prev_link = cur + BLOCK_HEADER;
            cur = next;
            steps += 1;
            if steps > limit {
                return Err(self.damaged("free list", head_word, "cycle in the large free list"));
            }
        }
        // 2. The bump area.
        let bump = v.word(W_BUMP);
        let end = v.word(W_HEAP_END);
        if end - bump < need {
            return Err(AllocError::OutOfSpace {
                size,
                bump_left: end - bump,
            });
        }
        self.put_words(m, st, tid, bump, &[tag(bump, ST_ALLOC, class, need), need])?;
        self.put(m, st, tid, W_BUMP, bump + need)?;
        self.seal(m, st, tid)?;
        Ok(bump + BLOCK_HEADER)
    }

    /// [`TxAlloc::nv_tx_alloc`], then log zeros over the payload in the same transaction (costs
    /// log space of the payload's size).
    pub fn nv_tx_zalloc(&self, vn: &Vnvm, tid: Tid, size: u64) -> AllocResult<u64> {
        self.zalloc_in(&self.vnvm(vn), tid, size)
    }

    /// [`TxAlloc::nv_tx_zalloc`] in any [`TxMemory`].
    pub fn zalloc_in(&self, m: &dyn TxMemory, tid: Tid, size: u64) -> AllocResult<u64> {
        let off = self.alloc_in(m, tid, size)?;
        let zeros = vec![0u8; size as usize];
        self.write_all(m, tid, off, &zeros)?;
        Ok(off)
    }

    /// Check that `off` is the payload of a block allocated in `tid`'s view; returns (block,
    /// class, size).
    fn allocated(&self, v: &View, off: u64) -> AllocResult<(u64, u8, u64)> {
        let bad = |r: &str| AllocError::BadOffset {
            offset: off,
            reason: r.into(),
        };
        let bump = v.word(W_BUMP);
        if off < HEAP_HEADER + BLOCK_HEADER || off >= bump {
            return Err(bad("outside the allocated part of the heap"));
        }
        if off % 16 != 0 {
            return Err(bad("not 16-byte aligned"));
        }
        let block = off - BLOCK_HEADER;
        let t = v.word(block);
        let size = v.word(block + 8);
        let (state, class) = (t as u8, (t >> 8) as u8);
        if t != tag(block, state, class, size) || !(state == ST_ALLOC || state == ST_FREE) {
            return Err(bad(
                "no block starts there (inside a block, or its header was overwritten)",
            ));
        }
        if state == ST_FREE {
            return Err(AllocError::DoubleFree { offset: off });
        }
        let (_, class, size) = self.block(v, block, "block")?;
        Ok((block, class, size))
    }

    /// Free the block at payload offset `off` in transaction `tid` (the `nv_tx_free` of the C
    /// API). The block becomes free when `tid` commits; if `tid` aborts it stays allocated.
    ///
    /// Errors: [`AllocError::BadOffset`] for an offset that is not an allocated block's payload
    /// or is the root object (set another root first); [`AllocError::DoubleFree`];
    /// [`AllocError::Busy`], [`AllocError::Damaged`], [`AllocError::LogFullAborted`], tid
    /// errors.
    pub fn nv_tx_free(&self, vn: &Vnvm, tid: Tid, off: u64) -> AllocResult<()> {
        self.free_in(&self.vnvm(vn), tid, off)
    }

    /// [`TxAlloc::nv_tx_free`] in any [`TxMemory`].
    pub fn free_in(&self, m: &dyn TxMemory, tid: Tid, off: u64) -> AllocResult<()> {
        let mut st = self.acquire(m, tid)?;
        let st = &mut *st;
        let v = self.view(&st.overlay);
        self.validate_header(&v)?;
        let (block, class, size) = self.allocated(&v, off)?;
        if v.word(W_ROOT) == off {
            return Err(AllocError::BadOffset {
                offset: off,
                reason: "it is the root object (set another root first)".into(),
            });
        }
        let head_word = if class == CLASS_LARGE {
            W_LARGE
        } else {
            W_HEADS + 8 * class as u64
        };
        let head = v.word(head_word);
        self.put(m, st, tid, block + BLOCK_HEADER, head)?;
        self.put(m, st, tid, block, tag(block, ST_FREE, class, size))?;
        self.put(m, st, tid, head_word, block)?;
        self.seal(m, st, tid)
    }

    /// Usable bytes of the allocated block at `off` (committed view, or `tid`'s view if it holds
    /// the allocator). Errors as [`TxAlloc::nv_tx_free`]'s offset checks.
    pub fn usable_size(&self, tid: Option<Tid>, off: u64) -> AllocResult<u64> {
        let st = self.0.state.lock();
        let empty = BTreeMap::new();
        let ov = if tid.is_some() && st.owner == tid {
            &st.overlay
        } else {
            &empty
        };
        let v = self.view(ov);
        self.validate_header(&v)?;
        let (_, _, size) = self.allocated(&v, off)?;
        Ok(size - BLOCK_HEADER)
    }

    /// The root object's offset (0: none). With `Some(tid)` of the transaction holding the
    /// allocator, its uncommitted [`TxAlloc::nv_set_root`] is seen; otherwise the committed
    /// root (read committed).
    pub fn nv_root(&self, tid: Option<Tid>) -> AllocResult<u64> {
        let st = self.0.state.lock();
        let empty = BTreeMap::new();
        let ov = if tid.is_some() && st.owner == tid {
            &st.overlay
        } else {
            &empty
        };
        let v = self.view(ov);
        self.validate_header(&v)?;
        Ok(v.word(W_ROOT))
    }

    /// Make the block at `off` (allocated in `tid`'s view) the region's root object, or clear
    /// the root with 0, in transaction `tid`.
    ///
    /// Errors: [`AllocError::BadOffset`] / [`AllocError::DoubleFree`] (a free block) for an
    /// offset that is not an allocated block; [`AllocError::Busy`], tid errors.
    pub fn nv_set_root(&self, vn: &Vnvm, tid: Tid, off: u64) -> AllocResult<()> {
        self.set_root_in(&self.vnvm(vn), tid, off)
    }

    /// [`TxAlloc::nv_set_root`] in any [`TxMemory`].
    pub fn set_root_in(&self, m: &dyn TxMemory, tid: Tid, off: u64) -> AllocResult<()> {
        let mut st = self.acquire(m, tid)?;
        let st = &mut *st;
        let v = self.view(&st.overlay);
        self.validate_header(&v)?;
        if off != 0 {
            self.allocated(&v, off)?;
        }
        self.put(m, st, tid, W_ROOT, off)?;
        self.seal(m, st, tid)
    }

    /// The transaction `tid` has ended (committed or aborted by the caller): drop its overlay
    /// and release the allocator if it holds it. Call it after `nv_commit` returned (its writes
    /// are then visible) or after `nv_abort`. A no-op for other tids.
    pub fn end_tx(&self, tid: Tid) {
        let mut st = self.0.state.lock();
        if st.owner == Some(tid) {
            self.heal(&mut st, false);
        }
    }

    /// `vn.nv_commit(tid)` then [`TxAlloc::end_tx`] (also when the commit fails: the
    /// transaction is then not open any more).
    pub fn commit(&self, vn: &Vnvm, tid: Tid) -> AllocResult<()> {
        self.commit_in(&self.vnvm(vn), tid)
    }

    /// [`TxAlloc::commit`] in any [`TxMemory`].
    pub fn commit_in(&self, m: &dyn TxMemory, tid: Tid) -> AllocResult<()> {
        let t = self.commit_staged_in(m, tid)?;
        Ok(m.sync_to(t)?)
    }

    /// [`TxAlloc::commit_in`] without waiting for durability ([`TxMemory::commit_staged`]):
    /// returns the ticket to [`TxMemory::sync_to`] before reporting the outcome.
    pub fn commit_staged_in(&self, m: &dyn TxMemory, tid: Tid) -> AllocResult<u64> {
        let r = m.commit_staged(tid);
        if let Err(VnvmError::NoLogObject { .. }) = r {
            // The commit left the transaction open (no log object in time): abort it, so that
            // a failed commit here always ends the transaction (its pages are given back).
            let _ = m.abort(tid);
        }
        self.end_tx(tid);
        Ok(r?)
    }

    /// `vn.nv_abort(tid)` then [`TxAlloc::end_tx`].
    pub fn abort(&self, vn: &Vnvm, tid: Tid) -> AllocResult<()> {
        self.abort_in(&self.vnvm(vn), tid)
    }

    /// [`TxAlloc::abort`] in any [`TxMemory`].
    pub fn abort_in(&self, m: &dyn TxMemory, tid: Tid) -> AllocResult<()> {
        let r = m.abort(tid);
        self.end_tx(tid);
        Ok(r?)
    }

    /// Walk every committed block of the heap and every free list, checking that each block
    /// header validates, the blocks tile the heap up to the bump pointer, and the free lists
    /// hold exactly the free blocks. Returns the occupancy.
    ///
    /// Errors: [`AllocError::Damaged`] naming the first inconsistency.
    pub fn check(&self) -> AllocResult<HeapStats> {
        let _st = self.0.state.lock();
        let empty = BTreeMap::new();
        let v = self.view(&empty);
        self.validate_header(&v)?;
        let mut s = HeapStats {
            bump: v.word(W_BUMP),
            heap_end: v.word(W_HEAP_END),
            root: v.word(W_ROOT),
            ..HeapStats::default()
        };
        let mut free = std::collections::HashSet::new();
        let mut b = HEAP_HEADER;
        while b < s.bump {
            let (state, _, size) = self.block(&v, b, "block")?;
            if state == ST_ALLOC {
                s.allocated_blocks += 1;
                s.allocated_bytes += size - BLOCK_HEADER;
            } else {
                s.free_blocks += 1;
                s.free_bytes += size;
                free.insert(b);
            }
            b += size;
        }
        let mut listed = 0u64;
        for (i, hw) in (0..=SMALL_CLASSES as u64).map(|c| (c, W_HEADS + 8 * c)) {
            let class = if i as usize == SMALL_CLASSES {
                CLASS_LARGE
            } else {
                i as u8
            };
            let mut cur = v.word(hw);
            while cur != 0 {
                self.free_block(&v, cur, class)?;
                if !free.remove(&cur) {
                    return Err(self.damaged("free list", cur, "block listed twice (a cycle)"));
                }
                listed += 1;
                cur = v.word(cur + BLOCK_HEADER);
            }
        }
        if listed != s.free_blocks {
            return Err(self.damaged(
                "free list",
                HEAP_HEADER,
                format!("{} free blocks are on no free list", s.free_blocks - listed),
            ));
        }
        if s.root != 0 {
            self.allocated(&v, s.root)
                .map_err(|e| self.damaged("root", W_ROOT, e.to_string()))?;
        }
        Ok(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The one-pass header checksum is the word-by-word one, whatever the overlay holds.
    #[test]
    fn header_crc_in_one_pass_is_the_word_by_word_one() {
        let mut mem = vec![0u8; 4096];
        for (i, b) in mem.iter_mut().enumerate() {
            *b = (i * 131 % 251) as u8;
        }
        let mut overlay = BTreeMap::new();
        for round in 0..40u64 {
            let v = View {
                base: mem.as_ptr(),
                len: mem.len() as u64,
                overlay: &overlay,
            };
            assert_eq!(v.header_crc(), header_crc(|o| v.word(o)), "round {round}");
            // Words inside the header, at its checksum, and past it.
            overlay.insert((round * 56) % 512 / 8 * 8, round.wrapping_mul(0x9e37_79b9));
        }
    }
}
