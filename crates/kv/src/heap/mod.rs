//! The storage interface of tiermem-kv: a transactional heap addressed by offsets.
//!
//! Every engine offers the same thing: a contiguous region of bytes read with plain loads
//! through a read-only view that shows committed state, and transactions that allocate, free and
//! write it, with one root offset. The data structures (`crate::ds`) are written once against
//! [`Heap`] and [`Tx`]; an engine is a memory, not a second implementation of the Redis types.
//! A new engine implements [`Engine`]: a [`TxMemory`] (the view and transactional writes) plus
//! what the server reports about it. Later subsystems plug in by providing such a memory, or by
//! taking over the volatile engine's registered region (migration, snapshots, paging).
//!
//! The allocator is vnvm's ([`tiermem_vnvm::alloc::TxAlloc`]), opened over the engine's memory:
//! one allocator, with the same crash consistency as the data wherever the memory is durable.
//!
//! ## Concurrency contract
//!
//! The heap does not lock. Its user (the command layer) must make sure that no transaction
//! commits while another thread reads the view (one engine-wide `RwLock`: readers share it,
//! a writing transaction holds it exclusively from `begin` to `commit`), and that at most one
//! transaction is open at a time (the allocator would otherwise make the second one wait).

pub mod vnvm;
pub mod volatile;

use std::collections::HashMap;
use std::hash::BuildHasherDefault;
use std::time::Duration;
use tiermem_vnvm::alloc::TxAlloc;
pub use tiermem_vnvm::alloc::{AllocError, HeapStats, TxMemory};
use tiermem_vnvm::{Tid, VnvmError};

/// A heap offset. 0 is the null offset (the allocator header lives there, never an object).
pub type Off = u64;

/// Errors of the storage layer.
#[derive(Debug, thiserror::Error)]
pub enum HeapError {
    /// The heap has no room for an allocation (Redis' `-OOM`).
    #[error("out of memory: {0}")]
    OutOfMemory(String),
    /// The transaction would not fit in the engine's log even when empty.
    #[error("transaction too large for the log: {0}")]
    TooLarge(String),
    /// An allocator error (damaged metadata, bad offset, ...).
    #[error(transparent)]
    Alloc(AllocError),
    /// An error of the engine (vnvm instance, device, ...).
    #[error("{0}")]
    Engine(String),
    /// The heap holds an offset, length, count or link that cannot be right at this heap
    /// offset (see `crate::ds::Mem`): nothing read from there is served, nothing is written.
    #[error("damaged heap at offset {0}")]
    Damaged(Off),
    /// The engine cannot make writes durable (e.g. its device is full); writes are refused
    /// until it can again. The text names the file and the cause.
    #[error("{0}")]
    Persist(String),
}

impl From<AllocError> for HeapError {
    fn from(e: AllocError) -> Self {
        match e {
            AllocError::OutOfSpace { .. } => HeapError::OutOfMemory(e.to_string()),
            AllocError::LogFullAborted { .. } | AllocError::Vnvm(VnvmError::LogFull { .. }) => {
                HeapError::TooLarge(e.to_string())
            }
            e => HeapError::Alloc(e),
        }
    }
}

impl From<VnvmError> for HeapError {
    fn from(e: VnvmError) -> Self {
        match e {
            VnvmError::LogFull { .. } => HeapError::TooLarge(e.to_string()),
            e => HeapError::Engine(e.to_string()),
        }
    }
}

/// Result type of the storage layer.
pub type Result<T> = std::result::Result<T, HeapError>;

/// What an engine tells about itself (INFO, start-up log).
#[derive(Clone, Debug, Default)]
pub struct EngineInfo {
    /// Engine name (`vnvm`, `volatile`).
    pub name: &'static str,
    /// Acknowledged writes survive kill -9 (and, on real NVM, power loss).
    pub durable: bool,
    /// Where the data lives, in words (paths, pools, region).
    pub location: String,
    /// Bytes of the heap (the region).
    pub heap_bytes: u64,
    /// Engine-specific facts as (INFO field, value) pairs.
    pub fields: Vec<(String, String)>,
}

/// A storage engine: a transactional memory and its description.
pub trait Engine: Send + Sync + 'static {
    /// The transactional memory the heap lives in.
    fn memory(&self) -> &dyn TxMemory;
    /// Writes of an open transaction are visible in the view at once (no overlay needed).
    fn writes_visible_before_commit(&self) -> bool;
    /// Facts for INFO and the start-up log.
    fn info(&self) -> EngineInfo;
    /// The largest transaction the engine can take, in log bytes of data writes (`None`: no
    /// limit but memory). A transaction that would grow past it fails at once with
    /// [`HeapError::TooLarge`] rather than waiting for log space that cannot come.
    fn max_tx_bytes(&self) -> Option<u64> {
        None
    }
    /// Whether a migration may move this engine's memory (the heap's view, [`Heap::view`]).
    /// Default: no — a durable engine moves with its data directory.
    fn migratable(&self) -> bool {
        false
    }
    /// The snapshot-able memory the heap is (the volatile engine), for SAVE/BGSAVE
    /// (`crate::persistence`). Default: none — a durable engine needs no snapshots.
    fn snapshot_memory(&self) -> Option<std::sync::Arc<tiermem_snapshot::Memory>> {
        None
    }
    /// The heap is frozen and a migration is about to read all of it: get it ready (e.g. give
    /// up a fault-engine registration so the kernel can read every page). Default: nothing.
    fn prepare_migration(&self) {}
    /// Why the engine cannot make writes durable right now (e.g. `write back cache pages
    /// DIR/heap.data: No space left on device (os error 28)`), naming the file and the cause;
    /// `None` when it can. The command layer refuses writes while this is `Some` and resumes
    /// when it is `None` again (the engine retries by itself). Must be cheap (checked before
    /// every write command). Default: never.
    fn persist_error(&self) -> Option<String> {
        None
    }
    /// Make everything committed durable and applied (clean shutdown). Default: nothing.
    fn sync(&self) -> Result<()> {
        Ok(())
    }
    /// Close the engine cleanly (after `sync`). Default: nothing.
    fn close(&self) -> Result<()> {
        Ok(())
    }
}

/// A heap over an engine: the committed view, the allocator, and transactions.
pub struct Heap {
    // Field order: the allocator must go before the engine. It lives in the engine's memory,
    // and vnvm shares allocators per view address (`TxAlloc::open_in`): one still alive after
    // the engine unmapped its memory would be handed to a heap another thread opens at the
    // reused address, which then would skip formatting its new (zero) memory and read it as
    // a damaged heap.
    alloc: TxAlloc,
    engine: Box<dyn Engine>,
    base: *const u8,
    len: usize,
    max_tx: u64,
}

// SAFETY: `base` points into the engine's view, which lives as long as the engine (owned here);
// reads through it follow the concurrency contract of the module.
unsafe impl Send for Heap {}
// SAFETY: see above.
unsafe impl Sync for Heap {}

impl Heap {
    /// Open the heap of `engine`: validate its allocator, or format one in a new (all-zero)
    /// memory.
    pub fn open(engine: Box<dyn Engine>) -> Result<Heap> {
        let m = engine.memory();
        let (base, len) = (m.base(), m.len());
        let alloc = TxAlloc::open_in(m, None)?;
        alloc.set_lock_timeout(Duration::from_secs(30));
        let max_tx = engine.max_tx_bytes().unwrap_or(u64::MAX);
        Ok(Heap {
            engine,
            alloc,
            base,
            len,
            max_tx,
        })
    }

    /// The ticket of the last commit staged so far ([`Tx::commit_staged`]; 0: none, or an
    /// engine whose commits are durable at once).
    pub fn staged_ticket(&self) -> u64 {
        self.engine.memory().staged_ticket()
    }

    /// Make every commit staged up to `ticket` durable: one durability barrier for all of
    /// them (vnvm's group commit). Errors: the engine's persist failing; the commits stay
    /// visible but not durable, and a later call retries.
    pub fn sync_to(&self, ticket: u64) -> Result<()> {
        Ok(self.engine.memory().sync_to(ticket)?)
    }

    /// The highest ticket known durable (`u64::MAX` on an engine whose commits are durable at
    /// once): at least [`Heap::staged_ticket`] when no commit waits for durability. One
    /// atomic load.
    pub fn durable_ticket(&self) -> u64 {
        self.engine.memory().durable_ticket()
    }

    /// The committed bytes (read-only). See the module's concurrency contract.
    #[inline]
    pub fn view(&self) -> &[u8] {
        // SAFETY: the engine's view is mapped for `len` bytes while the engine lives (owned by
        // self); it changes only at commits, which the caller keeps apart from reads.
        unsafe { std::slice::from_raw_parts(self.base, self.len) }
    }

    /// The committed root offset (0: none yet).
    pub fn root(&self) -> Result<Off> {
        Ok(self.alloc.nv_root(None)?)
    }

    /// The engine.
    pub fn engine(&self) -> &dyn Engine {
        &*self.engine
    }

    /// The largest transaction (log bytes of its data writes) this heap accepts; larger ones
    /// fail with [`HeapError::TooLarge`] (`u64::MAX`: no limit).
    pub fn max_tx_bytes(&self) -> u64 {
        self.max_tx
    }

    /// Lower the transaction size limit (tests; a value above the engine's is ignored).
    pub fn set_max_tx_bytes(&mut self, max: u64) {
        self.max_tx = self.max_tx.min(max);
    }

    /// Occupancy of the heap, from a full walk of its blocks (slow: for INFO on demand).
    pub fn stats(&self) -> Result<HeapStats> {
        Ok(self.alloc.check()?)
    }

    /// Begin a transaction.
    pub fn begin(&self) -> Tx<'_> {
        let m = self.engine.memory();
        Tx {
            heap: self,
            tid: m.begin(),
            shadow: Shadow::default(),
            logged: 0,
            track: !self.engine.writes_visible_before_commit(),
            done: false,
        }
    }
}

/// Log bytes an allocator operation takes at most (up to 7 metadata words and the header
/// checksum, each a 16-byte log entry header and 8 bytes).
const ALLOC_LOG_COST: u64 = 8 * 24;

/// Bytes of one shadow line (see [`Tx`]).
const LINE: usize = 64;

/// A multiplicative hasher for line indexes (the shadow's keys are small integers).
#[derive(Default, Clone, Copy)]
struct LineHasher(u64);

impl std::hash::Hasher for LineHasher {
    #[inline]
    fn finish(&self) -> u64 {
        self.0
    }
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 ^ b as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }
    #[inline]
    fn write_u64(&mut self, v: u64) {
        // Fibonacci hashing; hashbrown takes its control bits from the top and its index from
        // the low bits, so fold the high half down.
        let h = v.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        self.0 = h ^ (h >> 29);
    }
}

type Shadow = HashMap<u64, [u8; LINE], BuildHasherDefault<LineHasher>>;

/// One transaction: reads see its own writes; writes become visible (and, on a durable engine,
/// durable) together at [`Tx::commit`]. Dropped without commit, it aborts.
///
/// On an engine whose view does not show uncommitted writes (vnvm), the transaction keeps a
/// DRAM shadow of every 64-byte line it wrote (the view's bytes with its writes applied), so a
/// read costs one hash probe per line however large the transaction is, and a read of lines it
/// did not write is served from the view without copying ([`Tx::bytes`]).
///
/// A write that would take the transaction past the engine's [`Engine::max_tx_bytes`] fails at
/// once with [`HeapError::TooLarge`] (the transaction must then be aborted) instead of waiting
/// for log space that can never come.
pub struct Tx<'h> {
    heap: &'h Heap,
    tid: Tid,
    shadow: Shadow,
    track: bool,
    /// Log bytes of this transaction's data writes so far (entry headers included).
    logged: u64,
    done: bool,
}

impl Tx<'_> {
    fn mem(&self) -> &dyn TxMemory {
        self.heap.engine.memory()
    }

    /// Read `buf.len()` bytes at `off`, seeing this transaction's writes. Outside the heap
    /// (an offset read from a damaged heap): zeros.
    pub fn read(&self, off: Off, buf: &mut [u8]) {
        let (o, n) = (off as usize, buf.len());
        let view = self.heap.view();
        if o.checked_add(n).map_or(true, |e| e > view.len()) {
            buf.fill(0);
            return;
        }
        if self.shadow.is_empty() {
            buf.copy_from_slice(&view[o..o + n]);
            return;
        }
        let mut at = 0;
        self.segments(o, n, |p| {
            buf[at..at + p.len()].copy_from_slice(p);
            at += p.len();
        });
    }

    /// `f` with the pieces of the `n` bytes at view offset `o` (in bounds) as this transaction
    /// sees them, in order: one per 64-byte line, from its shadow line if it wrote the line,
    /// else from the view.
    fn segments(&self, o: usize, n: usize, mut f: impl FnMut(&[u8])) {
        let view = self.heap.view();
        let mut pos = o;
        while pos < o + n {
            let line = pos / LINE;
            let end = ((line + 1) * LINE).min(o + n);
            match self.shadow.get(&(line as u64)) {
                Some(l) => f(&l[pos - line * LINE..end - line * LINE]),
                None => f(&view[pos..end]),
            }
            pos = end;
        }
    }

    /// The `len` bytes at `off` as this transaction sees them: borrowed from the committed
    /// view when the transaction wrote none of their lines, else a patched copy.
    #[inline]
    pub fn bytes(&self, off: Off, len: usize) -> std::borrow::Cow<'_, [u8]> {
        let o = off as usize;
        let view = self.heap.view();
        if o.checked_add(len).map_or(true, |e| e > view.len()) {
            // (A damaged offset; `crate::ds` checks and reports before it gets here.)
            return std::borrow::Cow::Owned(vec![0; len.min(crate::ds::ZEROS.len())]);
        }
        if self.shadow.is_empty() || len == 0 {
            return std::borrow::Cow::Borrowed(&view[o..o + len]);
        }
        let (first, last) = (o / LINE, (o + len - 1) / LINE);
        if first == last {
            // Within one line (most reads: entry headers, words): borrowed from the shadow
            // line when the transaction wrote it, else from the view; no copy either way.
            return match self.shadow.get(&(first as u64)) {
                Some(l) => {
                    let a = o - first * LINE;
                    std::borrow::Cow::Borrowed(&l[a..a + len])
                }
                None => std::borrow::Cow::Borrowed(&view[o..o + len]),
            };
        }
        if (first..=last).any(|l| self.shadow.contains_key(&(l as u64))) {
            // Assembled line by line, without zero-filling first.
            let mut v = Vec::with_capacity(len);
            self.segments(o, len, |p| v.extend_from_slice(p));
            std::borrow::Cow::Owned(v)
        } else {
            std::borrow::Cow::Borrowed(&view[o..o + len])
        }
    }

    /// The little-endian word at `off`, seeing this transaction's writes.
    #[inline]
    pub fn read_u64(&self, off: Off) -> u64 {
        let mut b = [0u8; 8];
        self.read(off, &mut b);
        u64::from_le_bytes(b)
    }

    /// Log bytes this transaction takes so far (an estimate of its log use: data writes with
    /// their entry headers, and a bound per allocator operation).
    pub fn logged_bytes(&self) -> u64 {
        self.logged
    }

    /// Write `bytes` at `off` in this transaction.
    pub fn write(&mut self, off: Off, bytes: &[u8]) -> Result<()> {
        if bytes.is_empty() {
            return Ok(());
        }
        if off as usize + bytes.len() > self.heap.len || off < tiermem_vnvm::alloc::HEAP_HEADER {
            return Err(HeapError::Engine(format!(
                "write of {} bytes at heap offset {off} is outside the heap's objects",
                bytes.len()
            )));
        }
        // Log cost: a 16-byte entry header per page-bounded piece, data padded to 8 bytes.
        let cost = bytes.len().div_ceil(8) as u64 * 8 + 16 * (bytes.len() as u64 / 4096 + 2);
        if self.logged + cost > self.heap.max_tx {
            return Err(HeapError::TooLarge(format!(
                "a transaction of more than {} bytes (this one would log {} bytes)",
                self.heap.max_tx,
                self.logged + cost
            )));
        }
        let mut done = 0;
        while done < bytes.len() {
            match self
                .mem()
                .write(self.tid, off + done as u64, &bytes[done..])
            {
                Ok(n) => done += n,
                Err(VnvmError::LogFull { logged }) => {
                    done += logged;
                    if done < bytes.len() && !self.mem().wait_space(Duration::from_secs(30)) {
                        if let Some(e) = self.heap.engine.persist_error() {
                            // The log is full because nothing can be written back.
                            return Err(HeapError::Persist(e));
                        }
                        return Err(HeapError::TooLarge(format!(
                            "no log space for {} more bytes within 30 s",
                            bytes.len() - done
                        )));
                    }
                }
                Err(e) => return Err(e.into()),
            }
        }
        self.logged += cost;
        if self.track {
            let view = self.heap.view();
            let (o, n) = (off as usize, bytes.len());
            let mut pos = o;
            while pos < o + n {
                let line = pos / LINE;
                let start = line * LINE;
                let end = (start + LINE).min(o + n);
                let l = self.shadow.entry(line as u64).or_insert_with(|| {
                    let mut l = [0u8; LINE];
                    let e = (start + LINE).min(view.len());
                    l[..e - start].copy_from_slice(&view[start..e]);
                    l
                });
                l[pos - start..end - start].copy_from_slice(&bytes[pos - o..end - o]);
                pos = end;
            }
        }
        Ok(())
    }

    /// Write the little-endian word `v` at `off`.
    #[inline]
    pub fn write_u64(&mut self, off: Off, v: u64) -> Result<()> {
        self.write(off, &v.to_le_bytes())
    }

    /// Allocate `size` bytes (contents undefined: write every byte you read later).
    pub fn alloc(&mut self, size: u64) -> Result<Off> {
        self.charge(ALLOC_LOG_COST)?;
        Ok(self.heap.alloc.alloc_in(self.mem(), self.tid, size)?)
    }

    /// Count `bytes` of log (allocator metadata) against the transaction's size limit.
    fn charge(&mut self, bytes: u64) -> Result<()> {
        if self.logged + bytes > self.heap.max_tx {
            return Err(HeapError::TooLarge(format!(
                "a transaction of more than {} bytes",
                self.heap.max_tx
            )));
        }
        self.logged += bytes;
        Ok(())
    }

    /// Free the object at `off` (allocated and committed, or allocated in this transaction).
    pub fn free(&mut self, off: Off) -> Result<()> {
        self.charge(ALLOC_LOG_COST)?;
        Ok(self.heap.alloc.free_in(self.mem(), self.tid, off)?)
    }

    /// Usable bytes of the object at `off`.
    pub fn usable_size(&self, off: Off) -> Result<u64> {
        Ok(self.heap.alloc.usable_size(Some(self.tid), off)?)
    }

    /// The root offset as this transaction sees it.
    pub fn root(&self) -> Result<Off> {
        Ok(self.heap.alloc.nv_root(Some(self.tid))?)
    }

    /// Make `off` (an allocated object, or 0) the root.
    pub fn set_root(&mut self, off: Off) -> Result<()> {
        Ok(self.heap.alloc.set_root_in(self.mem(), self.tid, off)?)
    }

    /// Commit: every write becomes visible, and durable on a durable engine, before this
    /// returns.
    pub fn commit(mut self) -> Result<()> {
        self.done = true;
        Ok(self.heap.alloc.commit_in(self.mem(), self.tid)?)
    }

    /// Commit without waiting for durability: every write is visible on return, durable once
    /// [`Heap::sync_to`] of the returned ticket (or of [`Heap::staged_ticket`] read later)
    /// returns. A reply that reports the outcome, or anything read after it, must wait for
    /// that sync (the command layer does it once per event-loop round).
    pub fn commit_staged(mut self) -> Result<u64> {
        self.done = true;
        Ok(self.heap.alloc.commit_staged_in(self.mem(), self.tid)?)
    }

    /// Abort: no write of this transaction ever becomes visible.
    pub fn abort(mut self) {
        self.done = true;
        let _ = self.heap.alloc.abort_in(self.mem(), self.tid);
    }
}

impl Drop for Tx<'_> {
    fn drop(&mut self) {
        if !self.done {
            let _ = self.heap.alloc.abort_in(self.mem(), self.tid);
        }
    }
}
