//! The NVM cache's volatile bookkeeping: each cache page's state (free, clean, dirty, being
//! written), its LRU lists, the (file, page) → cache page map, the DRAM table of chunk CRCs, and the
//! store helpers the redo worker uses (streaming copies, prefetch, runs of lines to write back).

use super::*;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum PState {
    Free,
    Clean,
    Dirty,
    /// Touched by the transaction the redo worker is applying; not yet marked dirty.
    Pinned,
    /// Being written back.
    Writing,
}

pub(crate) const NIL: u32 = u32::MAX;

#[derive(Default, Clone, Copy)]
pub(crate) struct Lru {
    pub(crate) head: u32,
    pub(crate) tail: u32,
    pub(crate) len: u32,
}

/// Hasher for (file id, page index) keys: one multiply-xorshift per word (the keys are not
/// attacker-controlled across a trust boundary; SipHash costs more than the rest of a lookup).
#[derive(Default, Clone, Copy)]
pub(crate) struct KeyHasher(u64);

impl std::hash::Hasher for KeyHasher {
    fn finish(&self) -> u64 {
        let z = self.0.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        z ^ (z >> 29)
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(b as u64);
        }
    }
    fn write_u32(&mut self, v: u32) {
        self.write_u64(v as u64);
    }
    fn write_u64(&mut self, v: u64) {
        self.0 = (self.0.rotate_left(23) ^ v).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    }
}

pub(crate) type KeyMap = HashMap<(u32, u64), u32, std::hash::BuildHasherDefault<KeyHasher>>;

/// Page indices below this are mapped through a direct per-file table (4 bytes per page of the
/// region: 0.1 % of it); higher ones (regions above 16 GiB) through a hash map.
pub(crate) const DIRECT_PAGES: u64 = 1 << 22;

/// (file id, page index) → cache page. A direct table per file: a lookup is one load from an
/// array indexed by the page, which stays in the CPU cache for neighbouring pages (a hash
/// table probe was a cache miss per entry, the largest cost of applying a small write).
#[derive(Default)]
pub(crate) struct PageMap {
    pub(crate) direct: Vec<Vec<u32>>,
    pub(crate) far: KeyMap,
}

impl PageMap {
    pub(crate) fn get(&self, k: &(u32, u64)) -> Option<&u32> {
        if k.1 < DIRECT_PAGES {
            self.direct
                .get(k.0 as usize)
                .and_then(|t| t.get(k.1 as usize))
                .filter(|&&p| p != NIL)
        } else {
            self.far.get(k)
        }
    }
    pub(crate) fn insert(&mut self, k: (u32, u64), p: u32) {
        if k.1 < DIRECT_PAGES {
            let (f, i) = (k.0 as usize, k.1 as usize);
            if self.direct.len() <= f {
                self.direct.resize_with(f + 1, Vec::new);
            }
            let t = &mut self.direct[f];
            if t.len() <= i {
                t.resize((i + 1).max(t.len() * 2).min(DIRECT_PAGES as usize), NIL);
            }
            t[i] = p;
        } else {
            self.far.insert(k, p);
        }
    }
    pub(crate) fn remove(&mut self, k: &(u32, u64)) {
        if k.1 < DIRECT_PAGES {
            if let Some(slot) = self
                .direct
                .get_mut(k.0 as usize)
                .and_then(|t| t.get_mut(k.1 as usize))
            {
                *slot = NIL;
            }
        } else {
            self.far.remove(k);
        }
    }
    /// Drop file `f`'s direct table (its pages have been removed).
    pub(crate) fn forget_file(&mut self, f: u32) {
        if let Some(t) = self.direct.get_mut(f as usize) {
            *t = Vec::new();
        }
    }
    /// The cache pages mapped for file `f`.
    pub(crate) fn pages_of(&self, f: u32) -> Vec<u32> {
        let mut v: Vec<u32> = self
            .direct
            .get(f as usize)
            .map(|t| t.iter().copied().filter(|&p| p != NIL).collect())
            .unwrap_or_default();
        v.extend(self.far.iter().filter(|(k, _)| k.0 == f).map(|(_, &p)| p));
        v
    }
}

pub(crate) struct CacheState {
    pub(crate) map: PageMap,
    pub(crate) key: Vec<Option<(u32, u64)>>,
    pub(crate) state: Vec<PState>,
    pub(crate) gen: Vec<u64>,
    /// Valid chunks of each mapped page (bit i: bytes [i·chunk, (i+1)·chunk)).
    pub(crate) mask: Vec<u64>,
    /// The [`chunksum::chunk_sum`] of every valid chunk of every page (64 per page, page `p`'s
    /// at `64·p..`), set by the redo worker from the bytes it stores: a page's contents
    /// checksum ([`recovery::cache_page_sum`]) is the XOR of its valid chunks' entries, so
    /// neither a write nor a publish reads a cache page back (they are cold in the CPU cache:
    /// the stores are non-temporal). 4 bytes per 64-byte chunk: 1/16 of the cache's size, in
    /// DRAM.
    pub(crate) sums: Vec<u32>,
    /// Chunks of each page written since the last publish (a page joins the batch's records
    /// with its first write).
    pub(crate) open: Vec<u64>,
    /// The chunks each page's persisted record covers with its contents CRC, noted at the
    /// page's first write since the last publish: its valid mask when the record says dirty
    /// (a Dirty or Writing page), else 0 (a clean record, or one of another file page: recovery
    /// ignores those). The redo worker never stores into these chunks before it has persisted
    /// their new CRC (see [`Stage`]).
    pub(crate) held: Vec<u64>,
    /// The new contents of the held chunks the batch writes, until their CRC is persisted.
    pub(crate) stage: Stage,
    pub(crate) prev: Vec<u32>,
    pub(crate) next: Vec<u32>,
    pub(crate) dirty: Lru,
    pub(crate) clean: Lru,
    pub(crate) free: Vec<u32>,
    /// Dirty + Writing pages (their words say dirty).
    pub(crate) ndirty: u32,
    /// Redo is waiting for a page: write back regardless of thresholds.
    pub(crate) need_space: bool,
    /// The writeback worker is waiting for work (below the start threshold, no space request).
    pub(crate) wb_idle: bool,
    /// The redo worker put an edge chunk together from the DRAM cache since its last publish.
    /// The DRAM cache may hold bytes of transactions staged but not yet linked (group commit
    /// copies a transaction's data there before `sync_to` links it), so the publish links
    /// everything staged before its records make such a chunk count for recovery.
    pub(crate) dram_filled: bool,
}

impl CacheState {
    pub(crate) fn new(n: u32) -> Self {
        CacheState {
            map: PageMap::default(),
            key: vec![None; n as usize],
            state: vec![PState::Free; n as usize],
            gen: vec![0; n as usize],
            mask: vec![0; n as usize],
            sums: huge_table(n as usize * 64),
            open: vec![0; n as usize],
            held: vec![0; n as usize],
            stage: Stage::new(n),
            prev: vec![NIL; n as usize],
            next: vec![NIL; n as usize],
            dirty: Lru {
                head: NIL,
                tail: NIL,
                len: 0,
            },
            clean: Lru {
                head: NIL,
                tail: NIL,
                len: 0,
            },
            // A reserve refilled from the shared free list (`Inner::refill_cache`).
            free: Vec::new(),
            ndirty: 0,
            need_space: false,
            wb_idle: false,
            dram_filled: false,
        }
    }
    pub(crate) fn list(&mut self, s: PState) -> &mut Lru {
        match s {
            PState::Dirty => &mut self.dirty,
            PState::Clean => &mut self.clean,
            // cannot fail: pages are unlinked only from, and pushed only onto, the dirty or the
            // clean list, in the state of that list (every caller checks or sets it).
            _ => unreachable!("not a list state"),
        }
    }
    pub(crate) fn unlink(&mut self, p: u32) {
        let s = self.state[p as usize];
        let (pr, nx) = (self.prev[p as usize], self.next[p as usize]);
        if pr != NIL {
            self.next[pr as usize] = nx;
        }
        if nx != NIL {
            self.prev[nx as usize] = pr;
        }
        let l = self.list(s);
        if l.head == p {
            l.head = nx;
        }
        if l.tail == p {
            l.tail = pr;
        }
        l.len -= 1;
        self.prev[p as usize] = NIL;
        self.next[p as usize] = NIL;
    }
    /// Insert at the head (most recently used) of list `s`.
    pub(crate) fn push_head(&mut self, p: u32, s: PState) {
        self.state[p as usize] = s;
        let old = self.list(s).head;
        self.next[p as usize] = old;
        self.prev[p as usize] = NIL;
        if old != NIL {
            self.prev[old as usize] = p;
        }
        let l = self.list(s);
        l.head = p;
        if l.tail == NIL {
            l.tail = p;
        }
        l.len += 1;
    }
    /// A page for a miss: a free page, else the clean LRU tail (unmapped).
    pub(crate) fn take(&mut self) -> Option<u32> {
        if let Some(p) = self.free.pop() {
            self.forget_contents(p);
            return Some(p);
        }
        let p = self.clean.tail;
        if p == NIL {
            return None;
        }
        self.unlink(p);
        if let Some(k) = self.key[p as usize].take() {
            self.map.remove(&k);
        }
        self.state[p as usize] = PState::Free;
        self.forget_contents(p);
        Some(p)
    }
    /// A page taken for new contents: no valid chunk (so no chunk sum counts) and nothing open.
    pub(crate) fn forget_contents(&mut self, p: u32) {
        self.mask[p as usize] = 0;
        self.open[p as usize] = 0;
        self.held[p as usize] = 0;
    }
}

/// Where the redo worker puts together the new contents of *held* chunks (chunks a dirty
/// record's CRC covers, [`CacheState::held`]) before it may store them: a page's recorded CRC
/// must describe, at every crash point, either the page as it is or the page as the listed
/// transactions will make it, so the new CRC is persisted first (write-ahead) and the chunks
/// are stored after that fence (`Inner::store_staged`). A block of one page size per staged
/// page, reused from batch to batch (no allocation once it has grown); at most [`STAGE_PAGES`]
/// of them, so that the stage stays in the CPU cache (a batch may write thousands of pages).
pub(crate) const STAGE_PAGES: usize = 64;

pub(crate) struct Stage {
    /// Per cache page: its block (index into `pages`), or NIL.
    block: Vec<u32>,
    /// The staged pages, in staging order, with the chunks their block holds.
    pub(crate) pages: Vec<(u32, u64)>,
    /// The blocks (`pages.len()` × page size bytes in use).
    pub(crate) bytes: Vec<u8>,
}

impl Stage {
    pub(crate) fn new(n: u32) -> Self {
        Stage {
            block: vec![NIL; n as usize],
            pages: Vec::new(),
            bytes: Vec::new(),
        }
    }
    /// The block of page `p` (page size `ps`), a new one when it has none.
    pub(crate) fn block_of(&mut self, p: u32, ps: usize) -> usize {
        let b = self.block[p as usize];
        if b != NIL {
            return b as usize;
        }
        let b = self.pages.len();
        self.pages.push((p, 0));
        self.block[p as usize] = b as u32;
        if self.bytes.len() < (b + 1) * ps {
            self.bytes.resize((b + 1) * ps, 0);
        }
        b
    }
    /// True when page `p` would need a new block and the stage already has
    /// [`STAGE_PAGES`] (the redo worker then stores what it holds first).
    pub(crate) fn full_for(&self, p: u32) -> bool {
        self.pages.len() >= STAGE_PAGES && self.block[p as usize] == NIL
    }
    /// Forget every staged page (their chunks have been stored).
    pub(crate) fn clear(&mut self) {
        for &(p, _) in &self.pages {
            self.block[p as usize] = NIL;
        }
        self.pages.clear();
    }
}

/// A zeroed table of `n` u32s whose memory the kernel may back with transparent huge pages
/// (MADV_HUGEPAGE): the redo worker touches one entry row per page it writes, scattered over
/// the whole table, and with 4 KiB pages each row was a TLB miss of its own.
pub(crate) fn huge_table(n: usize) -> Vec<u32> {
    let v = vec![0u32; n];
    let (start, len) = (v.as_ptr() as usize, n * 4);
    let first = start.next_multiple_of(2 << 20);
    if first < start + len {
        // SAFETY: advising (not changing) the table's own mapping, which `v` owns; a hint
        // only, and failure (no THP support) is harmless.
        unsafe {
            libc::madvise(
                first as *mut libc::c_void,
                (start + len - first) / (2 << 20) * (2 << 20),
                libc::MADV_HUGEPAGE,
            )
        };
    }
    v
}

/// Hint that the cache line holding `p` will be read or written soon. A hint only: any address
/// is allowed (a prefetch never faults).
#[inline(always)]
pub(crate) fn prefetch(p: *const u8) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: prefetch instructions do not access memory architecturally and never fault.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(p as *const i8)
    };
}

/// Add the `len` bytes at `off` to `runs`, extending the last run when they lie in it or
/// start at most 8 bytes after it (neighbouring page records).
pub(crate) fn add_run(runs: &mut Vec<(u64, u64)>, off: u64, len: u64) {
    match runs.last_mut() {
        Some((s, e)) if off >= *s && off <= *e + 8 => *e = (*e).max(off + len),
        _ => runs.push((off, off + len)),
    }
}

/// Copy `len` bytes (a multiple of 64) to the 64-byte aligned `dst` with non-temporal stores
/// (no fence: a later `sfence` orders them).
///
/// # Safety
/// `src` valid for reads and `dst` (64-byte aligned) valid for writes of `len` bytes, not
/// overlapping.
#[inline]
pub(crate) unsafe fn stream_lines(dst: *mut u8, src: *const u8, len: usize) {
    debug_assert!(dst as usize % 64 == 0 && len % 64 == 0);
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_stream_si128};
        let mut i = 0;
        while i < len {
            // SAFETY: i + 16 <= len; SSE2 is part of x86_64; dst + i is 16-byte aligned.
            unsafe {
                let v = _mm_loadu_si128(src.add(i) as *const __m128i);
                _mm_stream_si128(dst.add(i) as *mut __m128i, v);
            }
            i += 16;
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    // SAFETY: forwarded caller contract.
    unsafe {
        std::ptr::copy_nonoverlapping(src, dst, len)
    }
}
