//! The policy side of the engine: what a subsystem implements ([`Resolver`]) and what it is given
//! ([`Fault`], [`FaultOps`], [`RegionEvent`]).
//!
//! A resolver works in *region offsets*, never in virtual addresses: the engine translates, so a
//! region moved by `mremap` or duplicated into a forked child needs no resolver change.

use crate::error::ResolveError;
use crate::region::Resolution;
use crate::sys::{self, Uffd, PAGE_SIZE};
use std::cell::Cell;

/// Why the faulting access stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultKind {
    /// No page is mapped (MISSING mode): fill it with [`FaultOps::copy`], [`FaultOps::zero`] or
    /// [`FaultOps::move_in`].
    Missing,
    /// A write hit a uffd-write-protected page (WP mode): [`FaultOps::unprotect`] it.
    WriteProtect,
    /// The page exists in the page cache but is not mapped here (MINOR mode, shmem): map it with
    /// [`FaultOps::cont`] (after updating its contents through another mapping, if wanted).
    Minor,
}

/// One page fault, as handed to [`Resolver::resolve`].
#[derive(Debug, Clone, Copy)]
pub struct Fault {
    /// Page-aligned faulting address in the address space that faulted.
    pub addr: usize,
    /// Page-aligned offset from the region base (what resolvers should work with).
    pub offset: usize,
    /// Fault class.
    pub kind: FaultKind,
    /// The access was a write.
    pub write: bool,
    /// How this fault is being resolved (in-thread: the resolver runs in a SIGBUS handler).
    pub mode: Resolution,
    /// Faulting thread id, when known (handler-thread mode with UFFD_FEATURE_THREAD_ID; `None`
    /// in-thread, where calling gettid would cost a syscall on the fast path).
    pub tid: Option<i32>,
    /// The fault happened in a forked child that shares this region ([`crate::ForkPolicy::ShareWithChild`]);
    /// `ops` act on the child's address space.
    pub in_child: bool,
}

/// A non-cooperative event on a region (handler thread reads them; delivered to
/// [`Resolver::on_event`] on the runtime thread).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RegionEvent {
    /// `madvise(MADV_DONTNEED / MADV_REMOVE)` over part of the region. Delivered *before* the
    /// kernel discards the pages (the madvise caller waits for the engine to read the event); the
    /// range faults again afterwards.
    Remove {
        /// Region offset.
        offset: usize,
        /// Length in bytes.
        len: usize,
    },
    /// `munmap` (or an overlapping `mmap`/`mremap`) removed part of the region. When the whole
    /// region is gone the engine drops it: lookups stop matching and
    /// [`crate::RegionHandle::is_alive`] becomes false.
    Unmap {
        /// Region offset.
        offset: usize,
        /// Length in bytes.
        len: usize,
    },
    /// `mremap` moved the region; offsets are unchanged, only the base moved.
    Remap {
        /// New base address.
        new_base: usize,
        /// Length of the moved range.
        new_len: usize,
    },
    /// The process forked and the child shares this region (ShareWithChild): faults in the child
    /// now also reach this resolver, with [`Fault::in_child`] set.
    Fork {
        /// The child's pid, when the kernel tells (it does not: always `None` today).
        child_pid: Option<i32>,
    },
}

/// The policy of one region: fills pages on faults and observes region events.
///
/// # Contract
/// * `resolve` must make the faulting page accessible (copy/zero/cont/unprotect/move_in) or
///   return an error; it may resolve more than the faulting page (batching, prefetch).
/// * For [`Resolution::InThread`] regions `resolve` runs **inside a SIGBUS handler** on the
///   faulting thread: only async-signal-safe work is allowed — the [`FaultOps`] ioctls, memcpy
///   into private buffers, atomics, lock-free structures. No allocation, no locks (a lock held by
///   the interrupted code deadlocks), no stdio, no `println!`.
/// * For [`Resolution::HandlerThread`] regions `resolve` runs on the engine's single runtime
///   thread; it may allocate and lock, but a slow resolver delays every handler-thread region.
/// * An error is fatal for the faulting access: the engine reports it on stderr and makes the
///   access crash with SIGBUS rather than retry forever.
pub trait Resolver: Send + Sync {
    /// Resolves one fault (see the trait contract).
    fn resolve(&self, fault: &Fault, ops: &FaultOps<'_>) -> Result<(), ResolveError>;

    /// Observes a non-cooperative event on the region (runtime thread). Default: ignore.
    fn on_event(&self, ev: &RegionEvent) {
        let _ = ev;
    }
}

/// Resolution operations for one fault, addressed by region offset, executed through the
/// userfaultfd that owns the faulting address space (the parent's, or a forked child's).
///
/// All operations are async-signal-safe (a single ioctl, retried on EAGAIN). Offsets and lengths
/// must be page aligned and inside the region, else [`ResolveError::OutOfRange`]. Pages that are
/// already present are skipped (`EEXIST` is success) and not counted in the returned byte counts.
pub struct FaultOps<'a> {
    pub(crate) uffd: &'a Uffd,
    pub(crate) base: usize,
    pub(crate) len: usize,
    pub(crate) in_thread: bool,
    /// Page-aligned fault address; ops covering it set `woke`.
    pub(crate) fault_addr: usize,
    pub(crate) woke: Cell<bool>,
    /// Some operation installed or unprotected at least one page (loop detection).
    pub(crate) progress: Cell<bool>,
}

impl<'a> FaultOps<'a> {
    #[inline]
    fn check(&self, offset: usize, len: usize) -> Result<usize, ResolveError> {
        if offset % PAGE_SIZE != 0
            || len % PAGE_SIZE != 0
            || len == 0
            || offset.checked_add(len).map_or(true, |e| e > self.len)
        {
            return Err(ResolveError::OutOfRange {
                offset,
                len,
                region_len: self.len,
            });
        }
        Ok(self.base + offset)
    }

    #[inline]
    fn made(&self, n: usize) -> usize {
        if n > 0 {
            self.progress.set(true);
        }
        n
    }

    #[inline]
    fn note(&self, addr: usize, len: usize) {
        if !self.in_thread && self.fault_addr >= addr && self.fault_addr < addr + len {
            self.woke.set(true);
        }
    }

    #[inline]
    fn wake_mode(&self) -> u64 {
        // In-thread contexts (UFFD_FEATURE_SIGBUS) never have sleeping faulters: skip the wake.
        if self.in_thread {
            sys::UFFDIO_COPY_MODE_DONTWAKE
        } else {
            0
        }
    }

    /// Region length in bytes.
    pub fn region_len(&self) -> usize {
        self.len
    }

    /// Current base address of the region in the faulting address space (diagnostics only;
    /// resolvers should not store it).
    pub fn region_base(&self) -> usize {
        self.base
    }

    /// Atomically maps a copy of `src` at `offset` (MISSING faults). `wp`: map the new pages
    /// write-protected (region registered with WP). Returns bytes copied.
    pub fn copy(&self, offset: usize, src: &[u8], wp: bool) -> Result<usize, ResolveError> {
        let dst = self.check(offset, src.len())?;
        let mode = self.wake_mode() | if wp { sys::UFFDIO_COPY_MODE_WP } else { 0 };
        let r = self
            .uffd
            .copy(dst, src.as_ptr() as usize, src.len(), mode)
            .map_err(|e| sys::resolve_err("UFFDIO_COPY", offset, src.len(), e))?;
        self.note(dst, src.len());
        Ok(self.made(r))
    }

    /// Maps zero pages over `[offset, offset+len)` (MISSING faults). Returns bytes mapped.
    pub fn zero(&self, offset: usize, len: usize) -> Result<usize, ResolveError> {
        let dst = self.check(offset, len)?;
        let r = self
            .uffd
            .zeropage(dst, len, self.wake_mode())
            .map_err(|e| sys::resolve_err("UFFDIO_ZEROPAGE", offset, len, e))?;
        self.note(dst, len);
        Ok(self.made(r))
    }

    /// Maps the existing page-cache pages over `[offset, offset+len)` (MINOR faults).
    pub fn cont(&self, offset: usize, len: usize) -> Result<usize, ResolveError> {
        let dst = self.check(offset, len)?;
        let r = self
            .uffd
            .cont(dst, len, self.wake_mode())
            .map_err(|e| sys::resolve_err("UFFDIO_CONTINUE", offset, len, e))?;
        self.note(dst, len);
        Ok(self.made(r))
    }

    /// Removes uffd write protection from `[offset, offset+len)` (WP faults); wakes waiters.
    pub fn unprotect(&self, offset: usize, len: usize) -> Result<(), ResolveError> {
        let dst = self.check(offset, len)?;
        self.uffd
            .writeprotect(dst, len, false, self.in_thread)
            .map_err(|e| sys::resolve_err("UFFDIO_WRITEPROTECT", offset, len, e))?;
        self.note(dst, len);
        self.progress.set(true);
        Ok(())
    }

    /// Write-protects `[offset, offset+len)` (region registered with WP).
    pub fn protect(&self, offset: usize, len: usize) -> Result<(), ResolveError> {
        let dst = self.check(offset, len)?;
        self.uffd
            .writeprotect(dst, len, true, true)
            .map_err(|e| sys::resolve_err("UFFDIO_WRITEPROTECT", offset, len, e))
    }

    /// Moves (does not copy) `len` bytes of page-aligned, private anonymous memory at `src` of
    /// the *same* address space into `[offset, offset+len)` with UFFDIO_MOVE (anonymous regions;
    /// not available for faults of a forked child). The source becomes unmapped. Returns bytes
    /// moved.
    pub fn move_in(
        &self,
        offset: usize,
        src: *const u8,
        len: usize,
    ) -> Result<usize, ResolveError> {
        let dst = self.check(offset, len)?;
        if (src as usize) % PAGE_SIZE != 0 {
            return Err(ResolveError::Resolver("move_in source is not page aligned"));
        }
        let r = self
            .uffd
            .move_pages(dst, src as usize, len, self.wake_mode())
            .map_err(|e| sys::resolve_err("UFFDIO_MOVE", offset, len, e))?;
        self.note(dst, len);
        Ok(self.made(r))
    }

    /// Wakes threads blocked on faults in `[offset, offset+len)` (after operations done with
    /// DONTWAKE elsewhere). No-op for in-thread regions.
    pub fn wake(&self, offset: usize, len: usize) -> Result<(), ResolveError> {
        let dst = self.check(offset, len)?;
        if self.in_thread {
            return Ok(());
        }
        self.uffd
            .wake(dst, len)
            .map_err(|e| sys::resolve_err("UFFDIO_WAKE", offset, len, e))?;
        self.note(dst, len);
        Ok(())
    }
}
