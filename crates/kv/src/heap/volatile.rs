//! The volatile engine: the heap is one anonymous region, snapshot-able memory
//! ([`tiermem_snapshot::Memory`]: registered with tiermem's fault engine for write-protect
//! faults, nothing protected between snapshots, first touches the kernel's), so the subsystems
//! that move memory — snapshots, migration, paging — can take it over. A migration target
//! adopts a region its own resolver fills instead. Not durable by itself: a transaction writes
//! in place and keeps an undo record in DRAM for abort; snapshots (`crate::persistence`) save
//! it.

use super::{Engine, EngineInfo, HeapError, Result, TxMemory};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::Arc;
use tiermem_fault::RegionHandle;
use tiermem_snapshot::Memory;
use tiermem_vnvm::{Tid, VnvmError};

#[derive(Default)]
struct TxState {
    next: u64,
    /// Open transactions and their undo records (offset, old bytes), oldest first.
    open: HashMap<Tid, Vec<(u64, Vec<u8>)>>,
}

/// The volatile engine.
pub struct VolatileEngine {
    base: *mut u8,
    len: usize,
    /// The snapshot-able memory the heap is (`None`: an adopted region, or no userfaultfd).
    snap: Option<Arc<Memory>>,
    handle: Mutex<Option<RegionHandle>>,
    tx: Mutex<TxState>,
    /// The engine unmaps the region when dropped (it mapped it, or was given it to own).
    owns_mapping: bool,
    /// Whatever owns the region when the engine does not (a migration target): dropped with
    /// the engine, after it stopped using the region.
    keeper: Mutex<Option<Box<dyn Send>>>,
}

// SAFETY: the mapping is owned by the engine for its whole life; writes happen only inside
// transactions, which the heap's concurrency contract keeps apart from readers.
unsafe impl Send for VolatileEngine {}
// SAFETY: see above.
unsafe impl Sync for VolatileEngine {}

impl VolatileEngine {
    /// Map `size` bytes (rounded up to pages; reserved lazily, MAP_NORESERVE) as snapshot-able
    /// memory. Without userfaultfd (not root, no `vm.unprivileged_userfaultfd`),
    /// `require_registration == false` keeps a plain mapping (no snapshots) and says so in
    /// `info`.
    pub fn new(size: u64, require_registration: bool) -> Result<VolatileEngine> {
        let len = (size as usize).div_ceil(tiermem_fault::PAGE_SIZE) * tiermem_fault::PAGE_SIZE;
        match Memory::map("heap", len) {
            Ok(m) => {
                let m = Arc::new(m);
                return Ok(VolatileEngine {
                    base: m.as_ptr(),
                    len: m.len(),
                    snap: Some(m),
                    handle: Mutex::new(None),
                    tx: Mutex::new(TxState::default()),
                    owns_mapping: false,
                    keeper: Mutex::new(None),
                });
            }
            Err(e) if require_registration => {
                return Err(HeapError::Engine(format!(
                    "mapping the volatile heap as snapshot-able memory: {e}"
                )))
            }
            Err(e) => eprintln!(
                "tiermem-kv: volatile heap not registered with the fault engine (no snapshots): {e}"
            ),
        }
        // SAFETY: a fresh private anonymous mapping; the result is checked.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(HeapError::Engine(format!(
                "mmap of a {len}-byte volatile heap: {}",
                std::io::Error::last_os_error()
            )));
        }
        Ok(VolatileEngine {
            base: p as *mut u8,
            len,
            snap: None,
            handle: Mutex::new(None),
            tx: Mutex::new(TxState::default()),
            owns_mapping: true,
            keeper: Mutex::new(None),
        })
    }

    /// An engine over a region someone else mapped and registered — a migration target, whose
    /// resolver fills the pages from the source's dump as they are touched. `base..base + len`
    /// must be a private, page-aligned, read-write mapping holding a heap (or all zeros) that
    /// stays mapped while the engine lives; with `owns_mapping` the engine unregisters `handle`
    /// and unmaps the range when dropped.
    ///
    /// # Safety
    /// The caller hands over exclusive use of the range: nothing else may write it while the
    /// engine lives, and it must stay mapped for the engine's life.
    pub unsafe fn adopt(
        base: *mut u8,
        len: usize,
        handle: Option<RegionHandle>,
        owns_mapping: bool,
    ) -> VolatileEngine {
        VolatileEngine {
            base,
            len,
            snap: None,
            handle: Mutex::new(handle),
            tx: Mutex::new(TxState::default()),
            owns_mapping,
            keeper: Mutex::new(None),
        }
    }

    /// Hold `owner` — what keeps an adopted region mapped when the engine does not own it
    /// (`owns_mapping == false`), e.g. a socket post-copy target — until the engine is dropped.
    /// A second call replaces (and drops) the first owner.
    pub fn keep_alive(&self, owner: Box<dyn Send>) {
        *self.keeper.lock() = Some(owner);
    }

    /// The fault-engine region id of the heap (`None`: not registered).
    pub fn region_id(&self) -> Option<u64> {
        match &self.snap {
            Some(m) => Some(m.region_id()),
            None => self.handle.lock().as_ref().map(|h| h.id()),
        }
    }

    /// Faults the heap's registration took.
    fn faults(&self) -> u64 {
        match &self.snap {
            Some(m) => m.faults(),
            None => self.handle.lock().as_ref().map_or(0, |h| h.faults()),
        }
    }
}

impl Engine for VolatileEngine {
    fn memory(&self) -> &dyn TxMemory {
        self
    }
    fn writes_visible_before_commit(&self) -> bool {
        true
    }
    fn migratable(&self) -> bool {
        true
    }
    fn snapshot_memory(&self) -> Option<Arc<Memory>> {
        self.snap.clone()
    }
    fn prepare_migration(&self) {
        // The migration's dumper reads the region with pwritev: a kernel access, which an
        // in-thread region refuses for pages never touched. Hand the region back to the
        // kernel first (its never-touched pages then read as the shared zero page).
        if let Some(h) = self.handle.lock().take() {
            let _ = h.unregister();
        }
    }
    fn info(&self) -> EngineInfo {
        EngineInfo {
            name: "volatile",
            durable: false,
            location: format!(
                "anonymous region at {:p}, {} MiB, {}",
                self.base,
                self.len >> 20,
                match self.region_id() {
                    Some(id) => format!("registered with the fault engine as region {id}"),
                    None => "not registered with the fault engine".to_string(),
                }
            ),
            heap_bytes: self.len as u64,
            fields: vec![
                (
                    "volatile_region_registered".into(),
                    (self.region_id().is_some() as u8).to_string(),
                ),
                ("volatile_region_faults".into(), self.faults().to_string()),
            ],
        }
    }
}

impl TxMemory for VolatileEngine {
    fn base(&self) -> *const u8 {
        self.base
    }
    fn len(&self) -> usize {
        self.len
    }
    fn describe(&self) -> String {
        format!("volatile heap at {:p}", self.base)
    }
    fn begin(&self) -> Tid {
        let mut st = self.tx.lock();
        st.next += 1;
        let tid: Tid = st.next;
        st.open.insert(tid, Vec::new());
        tid
    }
    fn write(&self, tid: Tid, off: u64, src: &[u8]) -> std::result::Result<usize, VnvmError> {
        let mut st = self.tx.lock();
        let undo = st.open.get_mut(&tid).ok_or(VnvmError::UnknownTx(tid))?;
        let (o, n) = (off as usize, src.len());
        if o.checked_add(n).map_or(true, |e| e > self.len) {
            return Err(VnvmError::OutOfRegion {
                addr: self.base as usize + o,
                len: n,
            });
        }
        if n == 0 {
            return Ok(0);
        }
        // SAFETY: o + n ≤ len: inside the mapping; the transaction holds the heap exclusively.
        let dst = unsafe { std::slice::from_raw_parts_mut(self.base.add(o), n) };
        undo.push((off, dst.to_vec()));
        dst.copy_from_slice(src);
        Ok(n)
    }
    fn wait_space(&self, _timeout: std::time::Duration) -> bool {
        true
    }
    fn commit(&self, tid: Tid) -> std::result::Result<(), VnvmError> {
        self.tx
            .lock()
            .open
            .remove(&tid)
            .map(|_| ())
            .ok_or(VnvmError::UnknownTx(tid))
    }
    fn abort(&self, tid: Tid) -> std::result::Result<(), VnvmError> {
        let undo = self
            .tx
            .lock()
            .open
            .remove(&tid)
            .ok_or(VnvmError::UnknownTx(tid))?;
        for (off, old) in undo.into_iter().rev() {
            // SAFETY: recorded by `write` after its bounds check.
            let dst =
                unsafe { std::slice::from_raw_parts_mut(self.base.add(off as usize), old.len()) };
            dst.copy_from_slice(&old);
        }
        Ok(())
    }
}

impl Drop for VolatileEngine {
    fn drop(&mut self) {
        if !self.owns_mapping {
            return;
        }
        if let Some(h) = self.handle.get_mut().take() {
            let _ = h.unregister();
        }
        // SAFETY: the engine's own mapping; nothing refers to it after the heap is dropped.
        unsafe { libc::munmap(self.base as *mut libc::c_void, self.len) };
    }
}
