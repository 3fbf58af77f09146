//! Slot allocation for the paging buffer and the regular zone: a bitmap of free 4 KiB slots.
//!
//! The evictor thread allocates; faults free (a page read back into DRAM gives its slot up),
//! from a signal handler, so both sides are lock-free word operations. Allocation is next-fit
//! from a cursor; [`SlotMap::alloc_cluster`] takes one whole free word, 64 consecutive slots,
//! for a latency group destaged to consecutive slots (the paper's cluster-based slot management).
//!
//! A map lives on the heap ([`SlotMap::new`]) or in memory shared by processes, the pager pool
//! ([`SlotMap::at`]). A shared map also keeps an owner tag per slot (the tenant that took it),
//! written after the slot is taken and cleared before it is given back, so the pool's garbage
//! collector can free the slots of a process that died ([`SlotMap::release_owned_by`]).

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

/// Slots per cluster (one bitmap word).
pub const CLUSTER: usize = 64;

/// A fixed set of slots, each free or used.
pub struct SlotMap {
    /// Bit set = slot free; `nwords` words, then the free count, then the cursor.
    cells: *const AtomicU64,
    nwords: usize,
    slots: usize,
    /// Owner tag per slot (0: none), or null for a private map.
    owners: *const AtomicU32,
    /// The tag this process writes.
    tag: u32,
    /// Slots held per tenant (indexed by the tag's low byte − 1), or null: kept by a shared
    /// map whose owner wants each process's share (the pager pool's buffer).
    counts: *const AtomicU64,
    /// The storage of a heap map (`cells` points into it).
    _owned: Option<Box<[AtomicU64]>>,
}

// SAFETY: the map is only atomics, in memory that outlives it (its own box, or the pool mapping
// its owner keeps).
unsafe impl Send for SlotMap {}
// SAFETY: as above; every access is an atomic operation.
unsafe impl Sync for SlotMap {}

impl SlotMap {
    /// `slots` slots, all free, on the heap.
    pub fn new(slots: usize) -> SlotMap {
        let nwords = slots.div_ceil(64);
        let owned: Box<[AtomicU64]> = (0..nwords + 2).map(|_| AtomicU64::new(0)).collect();
        let cells = owned.as_ptr();
        let m = SlotMap {
            cells,
            nwords,
            slots,
            owners: std::ptr::null(),
            tag: 0,
            counts: std::ptr::null(),
            _owned: Some(owned),
        };
        m.init();
        m
    }

    /// Bytes of shared memory a map of `slots` slots needs for its words (8-byte aligned), not
    /// counting the owner tags (4 bytes a slot).
    pub fn cell_bytes(slots: usize) -> usize {
        (slots.div_ceil(64) + 2) * 8
    }

    /// A map over shared memory: `cells` ([`SlotMap::cell_bytes`] bytes) and `owners` (4 bytes
    /// a slot), written as `tag` (not 0; 0 for a map that only reads and collects). `counts`
    /// (null, or one word per tenant entry) keeps the slots each tag holds, by its low byte − 1.
    ///
    /// # Safety
    /// All areas must be 8-byte aligned, mapped for as long as the map lives, and laid out by
    /// [`SlotMap::init`] of a map of the same size (a fresh zeroed area must be initialised
    /// once, by its creator).
    pub unsafe fn at(
        cells: *mut u8,
        owners: *mut u8,
        slots: usize,
        tag: u32,
        counts: *const AtomicU64,
    ) -> SlotMap {
        SlotMap {
            cells: cells as *const AtomicU64,
            nwords: slots.div_ceil(64),
            slots,
            owners: owners as *const AtomicU32,
            tag,
            counts,
            _owned: None,
        }
    }

    /// The count cell of `tag`, if this map keeps counts.
    #[inline]
    fn count(&self, tag: u32) -> Option<&AtomicU64> {
        let i = (tag & 0xff) as usize;
        // SAFETY: i - 1 < 256; tags carry their entry index + 1, inside the counts array.
        (!self.counts.is_null() && i != 0).then(|| unsafe { &*self.counts.add(i - 1) })
    }

    /// Slots tag `tag` holds, from the counts (0 without them).
    pub fn held_by(&self, tag: u32) -> u64 {
        self.count(tag).map_or(0, |c| c.load(Ordering::Relaxed))
    }

    /// Marks every slot free (the creator of a shared map, once, before anyone uses it).
    pub fn init(&self) {
        for w in 0..self.nwords {
            let lo = w * 64;
            let n = (self.slots - lo).min(64);
            self.word(w).store(
                if n == 64 { u64::MAX } else { (1u64 << n) - 1 },
                Ordering::Relaxed,
            );
        }
        self.free_cell().store(self.slots as u64, Ordering::Relaxed);
        self.cursor_cell().store(0, Ordering::Release);
    }

    #[inline]
    fn word(&self, w: usize) -> &AtomicU64 {
        debug_assert!(w < self.nwords);
        // SAFETY: w < nwords, inside the cells.
        unsafe { &*self.cells.add(w) }
    }

    #[inline]
    fn free_cell(&self) -> &AtomicU64 {
        // SAFETY: the word after the bitmap.
        unsafe { &*self.cells.add(self.nwords) }
    }

    #[inline]
    fn cursor_cell(&self) -> &AtomicU64 {
        // SAFETY: the second word after the bitmap.
        unsafe { &*self.cells.add(self.nwords + 1) }
    }

    #[inline]
    fn owner(&self, s: usize) -> Option<&AtomicU32> {
        // SAFETY: s < slots, inside the owner array when there is one.
        (!self.owners.is_null()).then(|| unsafe { &*self.owners.add(s) })
    }

    /// A slot was just taken: tag it.
    #[inline]
    fn taken(&self, s: usize) {
        if let Some(o) = self.owner(s) {
            o.store(self.tag, Ordering::Release);
            if let Some(c) = self.count(self.tag) {
                c.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// Total slots.
    pub fn capacity(&self) -> usize {
        self.slots
    }

    /// Free slots now.
    pub fn free(&self) -> usize {
        (self.free_cell().load(Ordering::Relaxed) as usize).min(self.slots)
    }

    /// Takes one free slot (next-fit), or `None` when all are used.
    pub fn alloc(&self) -> Option<u64> {
        let n = self.nwords;
        if n == 0 {
            return None;
        }
        let start = self.cursor_cell().load(Ordering::Relaxed) as usize % n;
        for i in 0..n {
            let w = (start + i) % n;
            let word = self.word(w);
            let mut cur = word.load(Ordering::Relaxed);
            while cur != 0 {
                let bit = cur.trailing_zeros();
                match word.compare_exchange_weak(
                    cur,
                    cur & !(1u64 << bit),
                    Ordering::AcqRel,
                    Ordering::Relaxed,
                ) {
                    Ok(_) => {
                        self.free_cell().fetch_sub(1, Ordering::Relaxed);
                        self.cursor_cell().store(w as u64, Ordering::Relaxed);
                        let s = w * 64 + bit as usize;
                        self.taken(s);
                        return Some(s as u64);
                    }
                    Err(now) => cur = now,
                }
            }
        }
        None
    }

    /// Takes [`CLUSTER`] consecutive free slots (one whole free word) and returns the first, or
    /// `None` when no word is entirely free.
    pub fn alloc_cluster(&self) -> Option<u64> {
        let n = self.nwords;
        if n == 0 {
            return None;
        }
        let start = self.cursor_cell().load(Ordering::Relaxed) as usize % n;
        for i in 0..n {
            let w = (start + i) % n;
            if self
                .word(w)
                .compare_exchange(u64::MAX, 0, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
            {
                self.free_cell()
                    .fetch_sub(CLUSTER as u64, Ordering::Relaxed);
                self.cursor_cell().store(w as u64 + 1, Ordering::Relaxed);
                for s in w * 64..w * 64 + 64 {
                    self.taken(s);
                }
                return Some((w * 64) as u64);
            }
        }
        None
    }

    /// Bitmap words (clusters), the last one possibly partial.
    pub fn words(&self) -> usize {
        self.nwords
    }

    /// The used slots of word `w` as a bit mask (bit i: slot `64 w + i`).
    pub fn used_mask(&self, w: usize) -> u64 {
        let lo = w * 64;
        let n = (self.slots - lo).min(64);
        let valid = if n == 64 { u64::MAX } else { (1u64 << n) - 1 };
        !self.word(w).load(Ordering::Acquire) & valid
    }

    /// Gives slot `s` back. Freeing a free slot is a bug in the caller; it is ignored (debug
    /// builds assert) so a count never goes wrong.
    pub fn release(&self, s: u64) {
        let (w, bit) = ((s / 64) as usize, s % 64);
        if w >= self.nwords || s as usize >= self.slots {
            debug_assert!(false, "slot {s} out of range");
            return;
        }
        if let Some(o) = self.owner(s as usize) {
            let tag = o.swap(0, Ordering::AcqRel);
            if let Some(c) = self.count(tag) {
                c.fetch_sub(1, Ordering::Relaxed);
            }
        }
        let prev = self.word(w).fetch_or(1u64 << bit, Ordering::AcqRel);
        if prev & (1u64 << bit) == 0 {
            self.free_cell().fetch_add(1, Ordering::Relaxed);
        } else {
            debug_assert!(false, "slot {s} freed twice");
        }
    }

    /// Gives back every slot tagged `tag` (a process that died with them) and returns how many.
    /// Only for a tag no live process writes.
    pub fn release_owned_by(&self, tag: u32) -> usize {
        if self.owners.is_null() || tag == 0 {
            return 0;
        }
        let mut n = 0;
        for s in 0..self.slots {
            let o = self.owner(s).expect("a shared map has owners");
            if o.load(Ordering::Acquire) == tag
                && o.compare_exchange(tag, 0, Ordering::AcqRel, Ordering::Relaxed)
                    .is_ok()
            {
                let (w, bit) = (s / 64, s % 64);
                let prev = self.word(w).fetch_or(1u64 << bit, Ordering::AcqRel);
                if prev & (1u64 << bit) == 0 {
                    self.free_cell().fetch_add(1, Ordering::Relaxed);
                    n += 1;
                }
            }
        }
        if let Some(c) = self.count(tag) {
            c.store(0, Ordering::Relaxed);
        }
        n
    }

    /// Gives back every used slot with no owner tag: a process killed between taking a slot
    /// and tagging it (two stores apart). Only while no process uses the map.
    pub fn release_untagged(&self) -> usize {
        if self.owners.is_null() {
            return 0;
        }
        let mut n = 0;
        for w in 0..self.nwords {
            let mut used = self.used_mask(w);
            while used != 0 {
                let bit = used.trailing_zeros() as usize;
                used &= used - 1;
                let s = w * 64 + bit;
                if self
                    .owner(s)
                    .is_some_and(|o| o.load(Ordering::Acquire) == 0)
                {
                    self.release(s as u64);
                    n += 1;
                }
            }
        }
        n
    }

    /// Slots tagged `tag` now.
    pub fn owned_by(&self, tag: u32) -> usize {
        if self.owners.is_null() || tag == 0 {
            return 0;
        }
        (0..self.slots)
            .filter(|&s| {
                self.owner(s)
                    .is_some_and(|o| o.load(Ordering::Relaxed) == tag)
            })
            .count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_handed_out_once_and_come_back() {
        let m = SlotMap::new(130);
        let mut got: Vec<u64> = (0..130).map(|_| m.alloc().unwrap()).collect();
        assert!(m.alloc().is_none());
        assert_eq!(m.free(), 0);
        got.sort();
        got.dedup();
        assert_eq!(got.len(), 130);
        assert!(got.iter().all(|&s| s < 130));
        m.release(5);
        assert_eq!(m.free(), 1);
        assert_eq!(m.alloc(), Some(5));
    }

    #[test]
    fn a_cluster_is_one_whole_free_word() {
        let m = SlotMap::new(200);
        let a = m.alloc().unwrap();
        let c = m.alloc_cluster().unwrap();
        assert_eq!(c % 64, 0);
        assert!(a < c || a >= c + 64);
        assert_eq!(m.free(), 200 - 1 - 64);
        // 200 slots: words 0..2 full, word 3 has 8 slots; one is taken by `a` and one by `c`.
        assert!(m.alloc_cluster().is_some());
        assert!(m.alloc_cluster().is_none());
        for s in c..c + 64 {
            m.release(s);
        }
        assert_eq!(m.alloc_cluster(), Some(c));
    }

    #[test]
    fn a_shared_map_tags_its_slots_and_collects_a_dead_owners() {
        let slots = 300;
        let mut cells = vec![0u64; SlotMap::cell_bytes(slots) / 8];
        let mut owners = vec![0u32; slots];
        // The maps own these areas from here on: only atomics through them.
        let (c, o) = (
            cells.as_mut_ptr() as *mut u8,
            owners.as_mut_ptr() as *mut u8,
        );
        // SAFETY: both vectors outlive the maps and are aligned.
        let counts: Vec<AtomicU64> = (0..256).map(|_| AtomicU64::new(0)).collect();
        let k = counts.as_ptr();
        // SAFETY: as above.
        let (a, b) = unsafe {
            (
                SlotMap::at(c, o, slots, 7, k),
                SlotMap::at(c, o, slots, 9, k),
            )
        };
        a.init();
        let mine: Vec<u64> = (0..10).map(|_| a.alloc().unwrap()).collect();
        let cl = a.alloc_cluster().unwrap();
        let theirs: Vec<u64> = (0..5).map(|_| b.alloc().unwrap()).collect();
        assert_eq!(b.free(), slots - 10 - 64 - 5);
        assert_eq!((a.owned_by(7), b.owned_by(9)), (74, 5));
        assert_eq!((a.held_by(7), a.held_by(9)), (74, 5));
        a.release(mine[0]);
        assert_eq!(a.owned_by(7), 73);
        // "a" dies: its 73 slots come back, b's stay.
        assert_eq!(b.release_owned_by(7), 73);
        assert_eq!(b.free(), slots - 5);
        assert!(theirs
            .iter()
            .all(|&s| b.used_mask(s as usize / 64) & (1 << (s % 64)) != 0));
        assert_eq!(b.owned_by(9), 5);
        assert_eq!((b.held_by(7), b.held_by(9)), (0, 5));
        // A slot taken but never tagged (killed between the two stores).
        let s = b.alloc().unwrap();
        b.owner(s as usize).unwrap().store(0, Ordering::Relaxed);
        assert_eq!(b.release_untagged(), 1);
        assert_eq!(b.free(), slots - 5);
        let _ = cl;
    }
}
