//! The allocator: size classes over superblocks, large objects as page runs, the object table.
//!
//! Everything here works on *heap offsets* (bytes from the start of the heap's memfd), never on
//! addresses: the views ([`crate::Heap`]) translate. The allocator is plain data guarded by the
//! heap's lock, except the small objects' slot entries and the regions' classes
//! ([`SlotTable`]), which the threads' caches (`crate::tcache`) also read and write without it:
//! a slot taken by a cache ([`Alloc::reserve`]) is set in its superblock's bitmap with no object
//! in it (size 0), and the cache alone puts objects into it and takes them out.
//!
//! * Pages `[0, capacity/PAGE)` are handed out by a first-fit page-run allocator
//!   (`free_runs`). A superblock is an aligned run of `sb_pages` pages serving one size class;
//!   a large object (more than one page) is a run of whole pages of its own.
//! * Small objects never straddle a page boundary: a page of a class of size `s` holds
//!   `PAGE / s` slots at in-page offsets `0, s, 2s, ...`.
//! * The object table lives where the objects do: a small object is a set bit of its
//!   superblock's slot bitmap with its requested size in the slot's entry; a large object is
//!   an entry of `large` (offset → size, slot, flags); names are in `named` (offset → name)
//!   and `names` (name → offset) and are unique. A lookup by offset is two array indexings,
//!   not a hash probe that misses the cache (the central hash table cost a free ~100 ns).
//! * Dirty flags say which offsets' table entries changed since the last committed checkpoint
//!   (listed in `dirty_list`), whether an object stood there at that checkpoint, and whether
//!   the live object must be copied whole (created or moved since: realloc copies through the
//!   library view). They sit beside the object's size (three bits of a small slot's entry,
//!   a field of a large entry), so a call touches one line of metadata for both; an offset
//!   whose superblock or large object went away keeps its flags as an *orphan* until its
//!   next object or the next commit. The checkpoint turns the list into the metadata redo
//!   log ([`Alloc::journal`]): one record per changed offset with its final state, so an
//!   object created and freed between two checkpoints costs no record.
//! * Freed slots are handed out again last-in first-out per class (`recent`, and the threads'
//!   caches are stacks): the slot a program just freed is likely still in its caches, and
//!   `Heap::free` prefetches it.

use crate::error::{Error, Result};
use rustc_hash::FxHashMap;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU16, AtomicU8, Ordering::Relaxed};
use std::sync::Arc;

/// Page size (x86-64).
pub const PAGE: usize = 4096;

/// Largest superblock: 16 MiB, so that a superblock's slot indices stay below 2^20 (see
/// `RECIP_PP`).
pub const MAX_SB_SIZE: usize = 16 << 20;

/// Slot sizes of the size classes. The first [`NSMALL`] (the *small* classes) fit a page
/// without a slot crossing a page boundary, the largest being one page; the others (the
/// *medium* classes, above a page and below two) are packed end to end across their
/// superblock's pages, as jemalloc's 5, 6 and 7 KiB classes are: a program's "page plus
/// header" objects (sqlite3's page cache entries: a 4096-byte page and ~270 bytes of header)
/// then take 1.1 pages each, not 2 (a run of whole pages); padded to two aligned pages, sqlite3
/// on glibc itself ran 10 % slower (twice the pages and TLB entries for its page cache).
pub const CLASSES: [usize; 19] = [
    16, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1360, 2048, 4096, 4608, 5120, 6144,
    7168,
];

/// The number of small classes (slots within a page): `CLASSES[..NSMALL]`.
pub const NSMALL: usize = 15;

/// The largest object a size class holds; larger ones are runs of whole pages.
pub const MEDIUM_MAX: usize = CLASSES[CLASSES.len() - 1];

/// True for a medium class (slots packed across pages).
#[inline]
pub fn is_medium(c: usize) -> bool {
    c >= NSMALL
}

/// The class index for `size` (≤ [`MEDIUM_MAX`]).
pub fn class_for(size: usize) -> Option<usize> {
    CLASS_OF
        .get(size.max(1).div_ceil(GRAIN))
        .map(|&c| c as usize)
}

/// Smallest class index for each multiple of 16 bytes up to [`MEDIUM_MAX`] (index `size /
/// 16`, rounded up): `class_for` without a search.
const CLASS_OF: [u8; MEDIUM_MAX / GRAIN + 1] = {
    let mut t = [0u8; MEDIUM_MAX / GRAIN + 1];
    let (mut i, mut c) = (0, 0);
    while i < t.len() {
        while CLASSES[c] < i * GRAIN {
            c += 1;
        }
        t[i] = c as u8;
        i += 1;
    }
    t
};

/// Objects start at multiples of this (the smallest class).
const GRAIN: usize = 16;

/// `region_sb` entry of a region without a superblock.
const NO_SB: u32 = u32::MAX;

/// `ceil(2^40 / class size)` per class: `(x * RECIP[c]) >> 40` is `x / CLASSES[c]` exactly
/// for every `x < 2^24` (an offset in a page, or in a superblock of at most 16 MiB: the error
/// `x / 2^40 ≤ 2^-16` stays below `1 / size`), without a division instruction on the
/// allocator's paths.
const RECIP: [u64; CLASSES.len()] = {
    let mut t = [0u64; CLASSES.len()];
    let mut c = 0;
    while c < CLASSES.len() {
        t[c] = (1u64 << 40).div_ceil(CLASSES[c] as u64);
        c += 1;
    }
    t
};

/// `ceil(2^32 / (PAGE / CLASSES[c]))` for the small classes (0 for the medium ones, which have
/// no slots per page): `(k * RECIP_PP[c]) >> 32` is `k / slots-per-page` exactly for every
/// slot index `k < 2^20` (superblocks of up to 16 MiB hold fewer; the error `k / 2^32` stays
/// below `1 / 256`).
const RECIP_PP: [u64; CLASSES.len()] = {
    let mut t = [0u64; CLASSES.len()];
    let mut c = 0;
    while c < NSMALL {
        t[c] = (1u64 << 32).div_ceil((PAGE / CLASSES[c]) as u64);
        c += 1;
    }
    t
};

/// Slots per page of each small class (`PAGE / CLASSES[c]`; 0 for the medium classes): a
/// table, because `PAGE / CLASSES[c]` with `c` known only at run time is a division
/// instruction (a fifth of a cache `free`'s time here).
const PER_PAGE: [usize; CLASSES.len()] = {
    let mut t = [0usize; CLASSES.len()];
    let mut c = 0;
    while c < NSMALL {
        t[c] = PAGE / CLASSES[c];
        c += 1;
    }
    t
};

/// `x / CLASSES[c]` for `x < 2^24` (see [`RECIP`]).
#[inline]
fn div_class(x: usize, c: usize) -> usize {
    ((x as u64 * RECIP[c]) >> 40) as usize
}

/// Dirty flag (see `Alloc`): an object stood at the offset at the last committed checkpoint.
pub const EXISTED: u8 = 1;
/// Dirty flag: the live object at the offset was created or moved (or resized) since the last
/// `ckall`: its bytes are copied whole by the next one.
pub const FRESH: u8 = 2;
/// Dirty flag: the offset is listed (its table entry changed, or it is fresh).
pub const LISTED: u8 = 4;
/// Bits of a slot entry holding the requested size (an object of a class is at most
/// [`MEDIUM_MAX`] < 2^13 bytes); the three flags sit above them.
const SIZE_BITS: u32 = 13;
const SIZE_MASK: u16 = (1 << SIZE_BITS) - 1;
/// Freed slots remembered per class for reuse, most recent first (their cache lines and TLB
/// entries are likely still warm: see `Heap::free`).
const RECENT: usize = 32;

/// The small objects' slot entries and each superblock-sized region's class, in atomics at
/// fixed places, so that a thread's allocation cache (`crate::tcache`) can allocate and free a
/// slot without the heap's lock. Under the lock the allocator reads and writes them with
/// relaxed loads and stores (plain moves on x86-64).
///
/// An entry (`u16`) holds the requested size of the object in its slot (0: no object: the
/// slot is free, or reserved by a thread's cache) in the low [`SIZE_BITS`] bits and the slot's
/// dirty flags ([`LISTED`], [`EXISTED`], [`FRESH`]) above them: a call touches one cache line
/// of metadata for both. Region `r`'s superblock keeps its entries at
/// `[r * stride, r * stride + nslots)`.
pub struct SlotTable {
    /// Per region: 0 without a superblock, else its class + 1.
    region: Box<[AtomicU8]>,
    ent: Box<[AtomicU16]>,
    /// Entries per region: the superblock size / 16 (the most slots a superblock has).
    stride: usize,
    /// `log2(superblock size)` when it is a power of two: only then do threads' caches work
    /// (a region by a shift); else every call takes the heap's lock.
    pub region_shift: Option<u32>,
}

impl std::fmt::Debug for SlotTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "SlotTable {{ regions: {}, stride: {} }}",
            self.region.len(),
            self.stride
        )
    }
}

impl SlotTable {
    fn new(regions: usize, sb_size: usize) -> SlotTable {
        // One cache line more than the most slots a superblock has: each region's entries
        // start on another cache set (with a power-of-two stride all regions' first lines
        // compete for the same few sets of L1 and L2).
        let stride = sb_size / GRAIN + 32;
        // Zeroed by `calloc` (pages untouched until used: a 128 MiB heap's table is 16 MiB of
        // address space).
        let ent: Box<[u16]> = vec![0u16; regions * stride].into_boxed_slice();
        let region: Box<[u8]> = vec![0u8; regions].into_boxed_slice();
        SlotTable {
            // SAFETY: AtomicU16 / AtomicU8 have the size, alignment and bit validity of u16 /
            // u8, so a boxed slice of one is a boxed slice of the other.
            ent: unsafe { Box::from_raw(Box::into_raw(ent) as *mut [AtomicU16]) },
            // SAFETY: as above.
            region: unsafe { Box::from_raw(Box::into_raw(region) as *mut [AtomicU8]) },
            stride,
            region_shift: sb_size.is_power_of_two().then(|| sb_size.trailing_zeros()),
        }
    }

    /// The class of the superblock holding heap offset `off` (needs `region_shift`), if any.
    #[inline]
    pub fn class_at(&self, off: usize, shift: u32) -> Option<usize> {
        let c = self.region.get(off >> shift)?.load(Relaxed);
        (c != 0).then(|| c as usize - 1)
    }

    /// The entry of the slot starting at heap offset `off` of a superblock of class `c`
    /// ([`SlotTable::class_at`]), if a slot of that class starts there.
    #[inline]
    pub fn slot_entry(&self, off: usize, c: usize, shift: u32) -> Option<&AtomicU16> {
        if is_medium(c) {
            let r = off >> shift;
            let x = off - (r << shift);
            let k = div_class(x, c);
            if k * CLASSES[c] != x || (k + 1) * CLASSES[c] > 1 << shift {
                return None;
            }
            return self.ent.get(r * self.stride + k);
        }
        let in_page = off % PAGE;
        let q = div_class(in_page, c);
        if q * CLASSES[c] != in_page {
            return None;
        }
        let r = off >> shift;
        let page_in_sb = (off - (r << shift)) / PAGE;
        // Slots per page times pages: below stride (the slots of one superblock).
        let k = page_in_sb * PER_PAGE[c] + q;
        self.ent.get(r * self.stride + k)
    }
}

/// The requested size in a slot entry (0: no object).
#[inline]
pub fn entry_size(e: u16) -> usize {
    (e & SIZE_MASK) as usize
}

/// The dirty flags in a slot entry.
#[inline]
pub fn entry_flags(e: u16) -> u8 {
    (e >> SIZE_BITS) as u8
}

/// A slot entry of `size` bytes (0: no object) and flags `f`.
#[inline]
pub fn entry(size: usize, f: u8) -> u16 {
    size as u16 | (u16::from(f) << SIZE_BITS)
}

/// The slot capacity an object of `size` bytes gets: its class size for at most
/// [`MEDIUM_MAX`], else whole pages.
pub fn slot_for(size: usize) -> usize {
    let size = size.max(1);
    if size > MEDIUM_MAX {
        size.div_ceil(PAGE) * PAGE
    } else {
        CLASSES[class_for(size).unwrap_or(CLASSES.len() - 1)]
    }
}

/// One live object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Obj {
    /// Requested size in bytes (what a checkpoint copies).
    pub size: usize,
    /// Slot capacity: the class size for small and medium objects, `pages * PAGE` for large
    /// ones.
    pub slot: usize,
    /// Optional unique name.
    pub name: Option<String>,
}

impl Obj {
    /// True for whole-page objects (a run of pages of their own; every class is smaller).
    pub fn is_large(&self) -> bool {
        self.slot > MEDIUM_MAX
    }
}

/// One offset's change of the object table since the last checkpoint ([`Alloc::journal_into`]):
/// an object of `size` bytes in a slot of `slot` bytes stands at `off` now, or (`slot` 0) none
/// does where one did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Change {
    /// Heap offset.
    pub off: usize,
    /// Requested size of the object there (0 when none).
    pub size: usize,
    /// Its slot capacity; 0 when no object stands there any more.
    pub slot: usize,
}

/// A change of the object table (the metadata redo log of one checkpoint interval).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MetaRec {
    /// Object created or resized at `off`.
    Alloc {
        /// Heap offset.
        off: usize,
        /// The object.
        obj: Obj,
    },
    /// Object at `off` freed.
    Free {
        /// Heap offset.
        off: usize,
    },
    /// The live bytes of the checkpoint image's part at `off` (`crate::format::crc_unit`
    /// bytes: its objects' bytes in that part, in offset order:
    /// [`crate::format::live_in_part`]) are `len` bytes with CRC-32 `crc`. Follows the table
    /// records of the same checkpoint (an `Alloc` or `Free` record drops the checksums of the
    /// parts of the object's slot).
    Crc {
        /// Heap offset of the part.
        off: usize,
        /// Live bytes in the part.
        len: usize,
        /// CRC-32 of those bytes as they are in the image.
        crc: u32,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Owner {
    Free,
    /// Page of superblock `sb`.
    Small(u32),
    /// Page of the large object starting at page `start`.
    Large(u32),
}

/// The tag bit of a large object's page in [`Alloc`]'s page table.
const OWNER_LARGE: u32 = 1 << 31;

impl Owner {
    /// The page table's word for this owner: 0 free (so that a new table is zeroed memory,
    /// which the kernel hands out lazily: a `Vec<Owner>` was written whole at creation),
    /// `1 + sb` a superblock's page, [`OWNER_LARGE`]` | start` a large object's. Superblock
    /// ids and page numbers stay below 2^31 (capacity below 1 TiB).
    fn word(self) -> u32 {
        match self {
            Owner::Free => 0,
            Owner::Small(id) => id + 1,
            Owner::Large(start) => OWNER_LARGE | start,
        }
    }

    /// The owner a page table word stands for (see [`Owner::word`]).
    fn of(w: u32) -> Owner {
        if w == 0 {
            Owner::Free
        } else if w & OWNER_LARGE != 0 {
            Owner::Large(w & !OWNER_LARGE)
        } else {
            Owner::Small(w - 1)
        }
    }
}

#[derive(Debug)]
struct Sb {
    class: usize,
    first_page: usize,
    used: Vec<u64>,
    /// No word of `used` below this index has a free slot.
    hint: usize,
    /// The table holding this superblock's slot entries ([`SlotTable`]: the object table of
    /// small objects, so that a checkpoint's scan of a page needs no table lookup) from index
    /// `base`. A slot's bit in `used` says it is taken (by an object, or by a thread's cache);
    /// its entry's size says whether an object is in it.
    t: Arc<SlotTable>,
    base: usize,
    nused: usize,
    nslots: usize,
    /// Slots per page (`PAGE / CLASSES[class]`); 0 for a medium class, whose slots are
    /// packed end to end from the superblock's start.
    per_page: usize,
    in_partial: bool,
    /// Pages from the first one that are backed, or were used before this superblock took
    /// them: a slot handed out below this needs no backing ([`Alloc::back_fresh_pages`]).
    backed: usize,
}

impl Sb {
    /// Heap offset of slot `k`: the inverse of [`Sb::slot_index`].
    fn off_of(&self, k: usize) -> usize {
        if self.per_page == 0 {
            return self.first_page * PAGE + k * CLASSES[self.class];
        }
        let p = ((k as u64 * RECIP_PP[self.class]) >> 32) as usize; // k / per_page
        (self.first_page + p) * PAGE + (k - p * self.per_page) * CLASSES[self.class]
    }

    fn ent(&self, k: usize) -> &AtomicU16 {
        &self.t.ent[self.base + k]
    }

    /// Requested size of the object in slot `k`; 0 when no object is there.
    fn size(&self, k: usize) -> usize {
        entry_size(self.ent(k).load(Relaxed))
    }

    /// Dirty flags of slot `k`.
    fn flags(&self, k: usize) -> u8 {
        entry_flags(self.ent(k).load(Relaxed))
    }

    /// Sets the requested size of slot `k` (≤ one page; 0: no object), keeping its flags.
    fn set_size(&mut self, k: usize, size: usize) {
        let e = self.ent(k);
        e.store((e.load(Relaxed) & !SIZE_MASK) | size as u16, Relaxed);
    }

    /// Sets the dirty flags of slot `k`, keeping its size.
    fn set_flags(&mut self, k: usize, f: u8) {
        let e = self.ent(k);
        e.store(
            (e.load(Relaxed) & SIZE_MASK) | (u16::from(f) << SIZE_BITS),
            Relaxed,
        );
    }

    /// True when slot `k` is taken (by an object or a thread's cache).
    fn is_used(&self, k: usize) -> bool {
        self.used[k / 64] & (1 << (k % 64)) != 0
    }

    /// True when an object is in slot `k`.
    fn is_live(&self, k: usize) -> bool {
        self.size(k) != 0
    }

    /// The slot starting at heap offset `off` (a page of this superblock), if a slot starts
    /// there.
    fn slot_at(&self, off: usize) -> Option<usize> {
        if self.per_page == 0 {
            let x = off.checked_sub(self.first_page * PAGE)?;
            let k = div_class(x, self.class);
            return (k * CLASSES[self.class] == x && k < self.nslots).then_some(k);
        }
        let in_page = off % PAGE;
        let q = div_class(in_page, self.class);
        (q * CLASSES[self.class] == in_page && q < self.per_page)
            .then(|| (off / PAGE - self.first_page) * self.per_page + q)
    }

    /// The slot holding heap offset `off` (a page of this superblock): the inverse of
    /// [`Alloc::slot_off`].
    fn slot_index(&self, off: usize) -> usize {
        if self.per_page == 0 {
            return div_class(off - self.first_page * PAGE, self.class);
        }
        (off / PAGE - self.first_page) * self.per_page + div_class(off % PAGE, self.class)
    }
}

/// Allocator state over a heap of fixed capacity.
#[derive(Debug)]
pub struct Alloc {
    cap_pages: usize,
    sb_pages: usize,
    /// `log2(sb_pages)` when `sb_pages` is a power of two (the default 16): the region of an
    /// offset by a shift, not a division, on every call.
    sb_shift: Option<u32>,
    free_runs: BTreeMap<usize, usize>,
    /// Each page's owner, as [`Owner::word`]s.
    pages: Vec<u32>,
    /// The superblock occupying each aligned run of `sb_pages` pages ([`NO_SB`] if none): the
    /// small-object lookups' first step, 4 bytes per superblock-sized region, so it stays in
    /// the cache where `pages` (8 bytes a page) does not.
    region_sb: Vec<u32>,
    /// The slot entries and region classes, shared with the threads' caches.
    table: Arc<SlotTable>,
    sbs: Vec<Option<Sb>>,
    sb_free_ids: Vec<u32>,
    partial: Vec<Vec<u32>>,
    /// Large objects: heap offset → (requested size, slot, dirty flags).
    large: FxHashMap<usize, (usize, usize, u8)>,
    /// Names of the named objects by heap offset.
    named: FxHashMap<usize, String>,
    /// Live objects allocated minus freed through the allocator (threads' caches count
    /// theirs apart: `crate::tcache`), so it may go below zero.
    nobjs: isize,
    /// Name → heap offset.
    pub names: FxHashMap<String, usize>,
    /// Dirty flags of offsets where no slot or large object starts any more (its superblock
    /// was released or its large object freed since the last committed checkpoint). Every
    /// other offset's flags live beside its object: in its superblock's slot entry or its
    /// `large` entry (see [`Alloc::flags`]). Empty almost always.
    orphans: BTreeMap<usize, u8>,
    /// The offsets with [`LISTED`] set, in the order they were first changed.
    dirty_list: Vec<usize>,
    /// Per class, recently freed slots (heap offsets) to hand out first, at most [`RECENT`];
    /// an entry is checked when taken (its superblock may have gone).
    recent: Vec<Vec<usize>>,
    /// Per class, one superblock kept though empty (it stays in the partial list), so that a
    /// program that allocates and frees one object in turn does not create and release a
    /// superblock each time.
    spare: Vec<Option<u32>>,
    /// Superblocks that became empty while some of their slots had dirty flags: released at
    /// the next commit if still empty.
    emptied: Vec<u32>,
    /// Committed checksums of the checkpoint image: part offset → (live bytes, CRC-32 of them;
    /// see [`crate::format::live_in_part`]). A part without an entry has not been checkpointed
    /// since one of its objects changed.
    pub crcs: PartCrcs,
    /// Base address of each user view, once fresh pages are backed ahead of their first touch
    /// ([`Alloc::back_fresh_pages`]).
    backing: Option<Vec<usize>>,
    /// No page at or above this one has been handed out since this allocator was made (a new
    /// heap) or rebuilt (an opened one: above its highest used page). See [`Alloc::extent`].
    hwm: usize,
}

/// Large objects of at most this many pages are backed ahead of their first touch when fresh
/// ([`Alloc::back_fresh_pages`]); a larger one may well be used sparsely (a big `calloc`), so
/// its pages are left to fault in as they are touched.
pub const BACK_LARGE_PAGES: usize = 16;

/// A superblock's fresh pages are backed this many at a time, as its slots are handed out
/// ([`Alloc::back_fresh_pages`]): backing all 16 pages of each new superblock populated pages a
/// short program never uses (sqlite3 `select 1`: 36 calls, 6.5 against 4.8 ms without backing,
/// 4.1 plain).
pub const BACK_SB_PAGES: usize = 4;

/// The committed checksums of the checkpoint image's parts (`crate::format::crc_unit` bytes
/// each): one slot per part of the heap, so that a checkpoint's tens of thousands of updates
/// are stores, not hash-map inserts (1 % of a dense checkpoint's time).
#[derive(Debug, Clone)]
pub struct PartCrcs {
    unit: usize,
    /// Per part: live bytes << 32 | CRC-32; 0 live bytes: no checksum. Plain words, so that a
    /// new table is zeroed memory the kernel hands out as it is touched.
    v: Vec<u64>,
    n: usize,
}

impl PartCrcs {
    /// No checksums, for a heap of `capacity` bytes in parts of `unit` bytes.
    pub fn new(capacity: usize, unit: usize) -> PartCrcs {
        let unit = unit.max(1);
        PartCrcs {
            unit,
            v: vec![0; capacity.div_ceil(unit)],
            n: 0,
        }
    }

    /// Bytes per part.
    pub fn unit(&self) -> usize {
        self.unit
    }

    /// Sets the checksum of the part at `off` (a multiple of the unit below the capacity) to
    /// `len` live bytes (≥ 1) with CRC `crc`; `false` (nothing set) for any other offset.
    pub fn insert(&mut self, off: usize, (len, crc): (usize, u32)) -> bool {
        match self.v.get_mut(off / self.unit) {
            Some(e) if off % self.unit == 0 && len > 0 && len <= u32::MAX as usize => {
                if *e >> 32 == 0 {
                    self.n += 1;
                }
                *e = (len as u64) << 32 | u64::from(crc);
                true
            }
            _ => false,
        }
    }

    /// Drops the checksum of the part at `off`, if it has one.
    pub fn remove(&mut self, off: usize) {
        if let Some(e) = self.v.get_mut(off / self.unit) {
            if off % self.unit == 0 && *e >> 32 != 0 {
                *e = 0;
                self.n -= 1;
            }
        }
    }

    /// True when no part has a checksum.
    pub fn is_empty(&self) -> bool {
        self.n == 0
    }

    /// Every checksum `(part offset, (live bytes, CRC))`, ascending by offset.
    pub fn iter(&self) -> impl Iterator<Item = (usize, (usize, u32))> + '_ {
        let u = self.unit;
        self.v
            .iter()
            .enumerate()
            .filter(|(_, &e)| e >> 32 != 0)
            .map(move |(i, &e)| (i * u, ((e >> 32) as usize, e as u32)))
    }
}

impl Alloc {
    /// An empty allocator over `capacity` bytes with superblocks of `sb_size` bytes (both
    /// multiples of the page size; `capacity` a multiple of `sb_size`).
    pub fn new(capacity: usize, sb_size: usize) -> Alloc {
        let cap_pages = capacity / PAGE;
        let mut free_runs = BTreeMap::new();
        if cap_pages > 0 {
            free_runs.insert(0, cap_pages);
        }
        Alloc {
            cap_pages,
            sb_pages: sb_size / PAGE,
            sb_shift: (sb_size / PAGE)
                .is_power_of_two()
                .then(|| (sb_size / PAGE).trailing_zeros()),
            free_runs,
            pages: vec![0; cap_pages],
            region_sb: vec![NO_SB; cap_pages.div_ceil((sb_size / PAGE).max(1))],
            table: Arc::new(SlotTable::new(
                cap_pages.div_ceil((sb_size / PAGE).max(1)),
                sb_size,
            )),
            sbs: Vec::new(),
            sb_free_ids: Vec::new(),
            partial: vec![Vec::new(); CLASSES.len()],
            large: FxHashMap::default(),
            named: FxHashMap::default(),
            nobjs: 0,
            names: FxHashMap::default(),
            orphans: BTreeMap::new(),
            dirty_list: Vec::new(),
            recent: vec![Vec::new(); CLASSES.len()],
            spare: vec![None; CLASSES.len()],
            emptied: Vec::new(),
            crcs: PartCrcs::new(cap_pages * PAGE, PAGE),
            backing: None,
            hwm: 0,
        }
    }

    /// Bytes from the start of the heap below which every page ever handed out lies: no user
    /// pointer reaches beyond it, so a checkpoint's write scan stops there.
    pub fn extent(&self) -> usize {
        self.hwm * PAGE
    }

    /// The page above the highest one in use (0 when none is).
    fn used_end(&self) -> usize {
        match self.free_runs.iter().next_back() {
            Some((&s, &l)) if s + l == self.cap_pages => s,
            _ => self.cap_pages,
        }
    }

    /// From now on, backs the never-used pages this allocator hands out in the user views
    /// (bases `user_views`, mapped over the heap's memory, tracked) before their first use,
    /// with one `MADV_POPULATE_WRITE` per view that will address them: a new superblock's
    /// pages [`BACK_SB_PAGES`] at a time as its slots are handed out, in every view its
    /// class's slots are returned through; a fresh large object of at most
    /// [`BACK_LARGE_PAGES`] pages at once, in view 0. Without it each such page costs a page
    /// fault per view on its first write (~1 µs of exception entry here, the kernel's work
    /// aside). A populated page is reported written at the next checkpoint: it holds only
    /// fresh objects, which the checkpoint copies whole anyway. Pages at or above the extent
    /// ([`Alloc::extent`]) count as never used.
    pub fn back_fresh_pages(&mut self, user_views: &[usize]) {
        self.backing = Some(user_views.to_vec());
    }

    /// Backs pages `[from, end)`, just handed out for the first time, in the views whose bit
    /// is set in `views` (see [`Alloc::back_fresh_pages`]).
    fn back(&self, from: usize, end: usize, views: u32) {
        let Some(bases) = self.backing.as_ref() else {
            return;
        };
        for (v, &base) in bases.iter().enumerate() {
            if views & (1 << v) != 0 {
                // SAFETY: the run lies below the capacity, inside view v's mapping; populating
                // writes nothing, it only maps the pages. A failure (no memory now) leaves the
                // pages to fault in when touched, as without backing.
                let _ = unsafe {
                    tiermem_media::populate_write(
                        (base + from * PAGE) as *mut u8,
                        (end - from) * PAGE,
                    )
                };
            }
        }
    }

    /// The user views through which some slot of class `c` is returned, as a bit mask (a
    /// medium class's: all of them, in turn).
    fn class_views(&self, c: usize) -> u32 {
        let views = self.backing.as_ref().map_or(1, Vec::len);
        let s = CLASSES[c];
        if is_medium(c) {
            return (1u32 << views) - 1;
        }
        (0..PAGE / s).fold(1, |m, k| m | 1 << Self::view_of(views, k * s, s))
    }

    /// The superblock id and slot index of the small object starting at `off`, if one does.
    fn small_at(&self, off: usize) -> Option<(u32, usize)> {
        let id = self.sb_at(off)?;
        let sb = self.sbs.get(id as usize)?.as_ref()?;
        let k = sb.slot_at(off)?;
        sb.is_live(k).then_some((id, k))
    }

    /// The superblock whose pages hold heap offset `off`, if one does.
    fn sb_at(&self, off: usize) -> Option<u32> {
        let page = off / PAGE;
        let r = match self.sb_shift {
            Some(sh) => page >> sh,
            None => page / self.sb_pages,
        };
        let id = *self.region_sb.get(r)?;
        (id != NO_SB).then_some(id)
    }

    /// Requested size and slot of the live object starting at heap offset `off`.
    pub fn size_slot(&self, off: usize) -> Option<(usize, usize)> {
        match Owner::of(*self.pages.get(off / PAGE)?) {
            Owner::Small(_) => {
                let (id, k) = self.small_at(off)?;
                let sb = self.sbs[id as usize].as_ref()?;
                Some((sb.size(k), CLASSES[sb.class]))
            }
            Owner::Large(_) => self.large.get(&off).map(|e| (e.0, e.1)),
            Owner::Free => None,
        }
    }

    /// The live object starting at heap offset `off` (its name cloned).
    pub fn get(&self, off: usize) -> Option<Obj> {
        let (size, slot) = self.size_slot(off)?;
        Some(Obj {
            size,
            slot,
            name: self.name_of(off),
        })
    }

    /// The name of the object at `off`, if it has one (no map probe on a heap without names).
    fn name_of(&self, off: usize) -> Option<String> {
        self.name(off).map(str::to_string)
    }

    /// Objects allocated minus freed through this allocator: the live objects when no thread's
    /// cache has allocated or freed any (`Heap::len` adds theirs).
    pub fn count(&self) -> isize {
        self.nobjs
    }

    /// The slot table shared with the threads' caches.
    pub fn table(&self) -> &Arc<SlotTable> {
        &self.table
    }

    /// True when some live object has a name (a thread's cache then leaves frees to the
    /// allocator, which drops names).
    pub fn has_names(&self) -> bool {
        !self.named.is_empty()
    }

    /// Every live object `(offset, object)`, in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = (usize, Obj)> + '_ {
        let small = self.sbs.iter().flatten().flat_map(move |sb| {
            let size = CLASSES[sb.class];
            (0..sb.nslots)
                .filter(move |&k| sb.is_live(k))
                .map(move |k| {
                    let off = sb.off_of(k);
                    (
                        off,
                        Obj {
                            size: sb.size(k),
                            slot: size,
                            name: self.name_of(off),
                        },
                    )
                })
        });
        let large = self.large.iter().map(move |(&off, &(size, slot, _))| {
            (
                off,
                Obj {
                    size,
                    slot,
                    name: self.name_of(off),
                },
            )
        });
        small.chain(large)
    }

    /// Drops the checksums of the pages of an object with slot `slot` at `off` (the object
    /// there changed; the next checkpoint checksums those pages again). `replay_meta` keeps
    /// the same rule.
    fn forget_crcs(&mut self, off: usize, slot: usize) {
        if self.crcs.is_empty() {
            return;
        }
        let unit = self.crcs.unit();
        let first = off / unit * unit;
        for c in (first..off.saturating_add(slot.max(1))).step_by(unit) {
            self.crcs.remove(c);
        }
    }

    /// Notes that the table entry at `off` changes; `existed`: an object stands there now
    /// (before the change). The first change of an interval fixes what the last checkpoint
    /// holds there: the object standing there now unless an earlier change of this interval
    /// put it there.
    /// `set` and `clear` are [`FRESH`] bits to change.
    fn touch(&mut self, off: usize, existed: bool, set: u8, clear: u8) {
        let mut f = self.flags(off);
        if f & LISTED == 0 {
            f = LISTED | if existed { EXISTED } else { 0 };
            self.dirty_list.push(off);
        }
        self.set_flags(off, (f | set) & !clear);
    }

    /// Dirty flags of heap offset `off`: those of the slot or large object starting there,
    /// else its orphaned flags, else none.
    fn flags(&self, off: usize) -> u8 {
        if let Some(sb) = self
            .sb_at(off)
            .and_then(|id| self.sbs[id as usize].as_ref())
        {
            if let Some(k) = sb.slot_at(off) {
                return sb.flags(k);
            }
        } else if let Some(e) = self.large.get(&off) {
            return e.2;
        }
        self.orphans.get(&off).copied().unwrap_or(0)
    }

    /// Sets the dirty flags of `off` where [`Alloc::flags`] reads them (an offset where no
    /// object can start keeps them as an orphan; 0 drops an orphan).
    fn set_flags(&mut self, off: usize, f: u8) {
        let id = self.sb_at(off).unwrap_or(NO_SB);
        if let Some(sb) = self.sbs.get_mut(id as usize).and_then(|s| s.as_mut()) {
            if let Some(k) = sb.slot_at(off) {
                sb.set_flags(k, f);
                return;
            }
        } else if let Some(e) = self.large.get_mut(&off) {
            e.2 = f;
            return;
        }
        if f == 0 {
            self.orphans.remove(&off);
        } else {
            self.orphans.insert(off, f);
        }
    }

    /// Moves the orphaned flags of offsets in pages `[first, first + n)` where an object can
    /// now start (a superblock or large object was just placed there) into their new place.
    fn adopt_orphans(&mut self, first: usize, n: usize) {
        if self.orphans.is_empty() {
            return;
        }
        let offs: Vec<(usize, u8)> = self
            .orphans
            .range(first * PAGE..(first + n) * PAGE)
            .map(|(&o, &f)| (o, f))
            .collect();
        for (o, f) in offs {
            self.orphans.remove(&o);
            self.set_flags(o, f); // back into orphans when no object can start at o
        }
    }

    /// The live objects created or moved since the last `ckall` (their bytes are copied whole).
    pub fn fresh(&self) -> impl Iterator<Item = usize> + '_ {
        // (In offset order after `sort_changes`.)
        self.dirty_list
            .iter()
            .copied()
            .filter(|&o| self.flags(o) & FRESH != 0)
    }

    /// Puts the changed offsets in offset order (once per checkpoint, as plain words), so that
    /// [`Alloc::fresh`] and [`Alloc::journal_into`] come out sorted without sorting again.
    pub fn sort_changes(&mut self) {
        self.dirty_list.sort_unstable();
    }

    /// After a committed checkpoint: the table changes are in the journal; with `keep_fresh`
    /// (a `ckone`, which copies one object) the objects still to be copied stay listed, now as
    /// standing in the committed table.
    pub fn committed(&mut self, keep_fresh: bool) {
        let mut list = std::mem::take(&mut self.dirty_list);
        for &o in &list {
            let f = self.flags(o);
            let f = if keep_fresh && f & FRESH != 0 {
                LISTED | EXISTED | FRESH
            } else {
                0
            };
            self.set_flags(o, f);
        }
        if keep_fresh {
            list.retain(|&o| self.flags(o) != 0);
        } else {
            list.clear();
        }
        self.orphans.clear(); // no object stands at an orphan's offset: nothing to keep
        self.dirty_list = list;
        for id in std::mem::take(&mut self.emptied) {
            let empty = matches!(&self.sbs[id as usize], Some(sb) if sb.nused == 0 && self.spare[sb.class] != Some(id));
            if empty {
                self.release_sb(id); // its flags were cleared above (an empty one has no fresh slot)
            }
        }
    }

    /// Takes `off` off the objects to copy whole (a `ckone` copies it now).
    pub fn unfresh(&mut self, off: usize) {
        let f = self.flags(off);
        if f & FRESH != 0 {
            self.set_flags(off, f & !FRESH);
        }
    }

    /// The metadata records of the table changes since the last committed checkpoint, by
    /// offset: an `Alloc` with the final object where one stands, a `Free` where the last
    /// checkpoint had one and none stands now, nothing where neither holds. ([`Alloc::
    /// journal_into`] without a record's name cloned, into a buffer kept by the caller.)
    pub fn journal(&self) -> Vec<MetaRec> {
        let mut ch = Vec::new();
        self.journal_into(&mut ch);
        ch.iter()
            .map(|c| match c.slot {
                0 => MetaRec::Free { off: c.off },
                slot => MetaRec::Alloc {
                    off: c.off,
                    obj: Obj {
                        size: c.size,
                        slot,
                        name: self.name(c.off).map(str::to_string),
                    },
                },
            })
            .collect()
    }

    /// [`Alloc::journal`] as [`Change`]s into `out` (cleared first; its capacity is reused: a
    /// checkpoint of 200 k new objects spent a fifth of its time faulting in a fresh 11 MB
    /// vector of records with their names).
    pub fn journal_into(&self, out: &mut Vec<Change>) {
        out.clear();
        // Offsets are multiples of 16: bit 0 carries EXISTED.
        out.extend(self.dirty_list.iter().map(|&o| Change {
            off: o | usize::from(self.flags(o) & EXISTED != 0),
            size: 0,
            slot: 0,
        }));
        if !self.dirty_list.windows(2).all(|w| w[0] <= w[1]) {
            out.sort_unstable_by_key(|c| c.off);
        }
        out.retain_mut(|c| {
            let existed = c.off & 1 != 0;
            c.off &= !1;
            match self.size_slot(c.off) {
                Some((size, slot)) => {
                    (c.size, c.slot) = (size, slot);
                    true
                }
                None => existed,
            }
        });
    }

    /// The name of the object at `off`, if it has one.
    pub fn name(&self, off: usize) -> Option<&str> {
        if self.named.is_empty() {
            None
        } else {
            self.named.get(&off).map(String::as_str)
        }
    }

    fn capacity(&self) -> usize {
        self.cap_pages * PAGE
    }

    /// Where the bytes an object freed at `off` may have held end, for the checksums to redo:
    /// its slot's end when `off` lies in a superblock of a medium class (the slot crosses
    /// pages, and the next object may share its last page), else the end of `off`'s page (a
    /// small slot never leaves its page; a large object leaves no live bytes in its other
    /// pages, and the pages of a released superblock hold none).
    pub fn freed_end(&self, off: usize) -> usize {
        let page_end = (off / PAGE + 1) * PAGE;
        match self
            .sb_at(off)
            .and_then(|id| self.sbs.get(id as usize)?.as_ref())
        {
            Some(sb) if is_medium(sb.class) => page_end.max(off + CLASSES[sb.class]),
            _ => page_end,
        }
    }

    /// First-fit run of `n` pages whose start is a multiple of `align` pages; the part of it
    /// never handed out before is backed in the views of the mask `back` (0: none; see
    /// [`Alloc::back_fresh_pages`]).
    fn take_pages(&mut self, n: usize, align: usize, back: u32) -> Option<usize> {
        let mut found = None;
        for (&s, &l) in &self.free_runs {
            let a = s.div_ceil(align) * align;
            if a + n <= s + l {
                found = Some((s, l, a));
                break;
            }
        }
        let (s, l, a) = found?;
        if a + n > self.hwm {
            self.back(a.max(self.hwm), a + n, back);
            self.hwm = a + n;
        }
        self.free_runs.remove(&s);
        if a > s {
            self.free_runs.insert(s, a - s);
        }
        if a + n < s + l {
            self.free_runs.insert(a + n, s + l - a - n);
        }
        Some(a)
    }

    fn give_pages(&mut self, start: usize, n: usize) {
        let (mut s, mut l) = (start, n);
        if let Some((&ps, &pl)) = self.free_runs.range(..start).next_back() {
            if ps + pl == start {
                self.free_runs.remove(&ps);
                s = ps;
                l += pl;
            }
        }
        if let Some(&nl) = self.free_runs.get(&(start + n)) {
            self.free_runs.remove(&(start + n));
            l += nl;
        }
        self.free_runs.insert(s, l);
        for p in &mut self.pages[start..start + n] {
            *p = Owner::Free.word();
        }
    }

    fn new_sb(&mut self, class: usize, first_page: usize) -> u32 {
        let per_page = PAGE / CLASSES[class];
        let nslots = if is_medium(class) {
            self.sb_pages * PAGE / CLASSES[class]
        } else {
            per_page * self.sb_pages
        };
        let region = first_page / self.sb_pages;
        let base = region * self.table.stride;
        for e in &self.table.ent[base..base + nslots] {
            e.store(0, Relaxed);
        }
        let sb = Sb {
            class,
            first_page,
            used: vec![0; nslots.div_ceil(64)],
            hint: 0,
            t: self.table.clone(),
            base,
            nused: 0,
            nslots,
            per_page,
            in_partial: false,
            backed: self.sb_pages,
        };
        let id = match self.sb_free_ids.pop() {
            Some(id) => {
                self.sbs[id as usize] = Some(sb);
                id
            }
            None => {
                self.sbs.push(Some(sb));
                (self.sbs.len() - 1) as u32
            }
        };
        for p in &mut self.pages[first_page..first_page + self.sb_pages] {
            *p = Owner::Small(id).word();
        }
        self.region_sb[region] = id;
        self.table.region[region].store(class as u8 + 1, Relaxed);
        self.adopt_orphans(first_page, self.sb_pages);
        id
    }

    /// Drops the empty superblock `id`: its pages go back to the free runs, and the flags of
    /// its slots that are still listed become orphans (a `Free` record may be due there).
    fn release_sb(&mut self, id: u32) {
        let Some(sb) = self.sbs[id as usize].take() else {
            return;
        };
        for k in 0..sb.nslots {
            let f = sb.flags(k);
            if f != 0 {
                self.orphans.insert(sb.off_of(k), f);
            }
        }
        self.sb_free_ids.push(id);
        self.region_sb[sb.first_page / self.sb_pages] = NO_SB;
        self.table.region[sb.first_page / self.sb_pages].store(0, Relaxed);
        self.partial[sb.class].retain(|&x| x != id);
        self.give_pages(sb.first_page, self.sb_pages);
    }

    /// Allocates `size` bytes (≥ 1) and returns the heap offset. Records the object in the
    /// table, the journal and the fresh set. Fails with [`Error::NameTaken`] or
    /// [`Error::OutOfMemory`].
    pub fn alloc(&mut self, size: usize, name: Option<&str>) -> Result<usize> {
        if let Some(n) = name {
            if self.names.contains_key(n) {
                return Err(Error::NameTaken(n.to_string()));
            }
            if n.len() > u16::MAX as usize {
                return Err(Error::InvalidArgument(
                    "object name longer than 65535 bytes".into(),
                ));
            }
        }
        let size = size.max(1);
        let (off, slot) = if size > MEDIUM_MAX {
            let n = size.div_ceil(PAGE);
            // Large objects are returned through view 0.
            let back = if n <= BACK_LARGE_PAGES { 1 } else { 0 };
            let start = self
                .take_pages(n, 1, back)
                .ok_or_else(|| Error::OutOfMemory {
                    requested: size,
                    capacity: self.capacity(),
                })?;
            for p in &mut self.pages[start..start + n] {
                *p = Owner::Large(start as u32).word();
            }
            self.large.insert(start * PAGE, (size, n * PAGE, 0));
            self.adopt_orphans(start, n);
            (start * PAGE, n * PAGE)
        } else {
            // size <= MEDIUM_MAX here, the last class, so a class exists.
            let c = class_for(size).unwrap_or(CLASSES.len() - 1);
            (self.alloc_small(c, size)?, CLASSES[c])
        };
        if let Some(n) = name {
            self.names.insert(n.to_string(), off);
            self.named.insert(off, n.to_string());
        }
        self.nobjs += 1;
        if slot > MEDIUM_MAX {
            self.touch(off, false, FRESH, 0); // take_slot did it for an object of a class
        }
        self.forget_crcs(off, slot);
        Ok(off)
    }

    fn alloc_small(&mut self, c: usize, size: usize) -> Result<usize> {
        let (id, k, off) = self.pick_slot(c, size)?;
        self.take_slot(id, k, size, off);
        Ok(off)
    }

    /// A free slot of class `c`: (superblock, slot, heap offset); `size` is for the error.
    fn pick_slot(&mut self, c: usize, size: usize) -> Result<(u32, usize, usize)> {
        // A recently freed slot first (LIFO), if its superblock still serves class c.
        while let Some(off) = self.recent[c].pop() {
            let Some(id) = self.sb_at(off) else {
                continue;
            };
            let Some(sb) = self.sbs[id as usize].as_mut() else {
                continue;
            };
            let k = sb.slot_index(off);
            if sb.class != c || sb.is_used(k) {
                continue;
            }
            return Ok((id, k, off));
        }
        let id = loop {
            match self.partial[c].last().copied() {
                Some(id) => {
                    let ok = matches!(&self.sbs[id as usize], Some(sb) if sb.class == c && sb.nused < sb.nslots);
                    if ok {
                        break id;
                    }
                    self.partial[c].pop();
                    if let Some(sb) = self.sbs[id as usize].as_mut() {
                        if sb.class == c {
                            sb.in_partial = false;
                        }
                    }
                }
                None => {
                    // Not backed here: its pages are, a few at a time, as slots are handed out.
                    let hwm = self.hwm;
                    let first = self.take_pages(self.sb_pages, self.sb_pages, 0).ok_or(
                        Error::OutOfMemory {
                            requested: size,
                            capacity: self.capacity(),
                        },
                    )?;
                    let id = self.new_sb(c, first);
                    let fresh_from = if self.backing.is_some() {
                        hwm.saturating_sub(first).min(self.sb_pages)
                    } else {
                        self.sb_pages
                    };
                    // new_sb just stored Some at index id.
                    if let Some(sb) = self.sbs[id as usize].as_mut() {
                        sb.in_partial = true;
                        sb.backed = fresh_from;
                    }
                    self.partial[c].push(id);
                    break id;
                }
            }
        };
        // `id` is a live superblock of class c with nused < nslots: checked in the loop above
        // (`ok`) or created just now; so the unwrap and the search below cannot fail.
        let sb = self.sbs[id as usize].as_mut().unwrap();
        let (wi, w) = sb
            .used
            .iter()
            .enumerate()
            .skip(sb.hint)
            .find(|(_, w)| **w != u64::MAX)
            .map(|(i, w)| (i, *w))
            .expect("partial superblock has a free slot");
        sb.hint = wi;
        let slot = wi * 64 + (!w).trailing_zeros() as usize;
        debug_assert!(slot < sb.nslots);
        let off = sb.off_of(slot);
        // The slot's last page, relative to the superblock; fresh pages up to it (and a few
        // beyond, for the slots that follow) are backed before the slot is handed out.
        let end = (off + CLASSES[c] - 1) / PAGE + 1 - sb.first_page;
        if end > sb.backed {
            let (first, from) = (sb.first_page, sb.backed);
            let to = end.max(from + BACK_SB_PAGES).min(self.sb_pages);
            sb.backed = to;
            self.back(first + from, first + to, self.class_views(c));
        }
        Ok((id, slot, off))
    }

    /// Marks free slot `k` (at heap offset `off`) of live superblock `id` used by a new object
    /// of `size` bytes (≤ one page) and notes the change (`touch(off, existed: false, set:
    /// FRESH)` on the slot's own flags); a superblock that becomes full leaves its class's
    /// partial list.
    fn take_slot(&mut self, id: u32, k: usize, size: usize, off: usize) {
        self.reserve_slot(id, k);
        self.put_object(id, k, off, size);
    }

    /// Writes an object of `size` bytes (clamped to the slot) into taken slot `k` (at `off`) of
    /// live superblock `id` and notes the change (`touch(off, existed: false, set: FRESH)` on
    /// the slot's own flags).
    fn put_object(&mut self, id: u32, k: usize, off: usize, size: usize) {
        // Callers pass a live superblock (checked or just created).
        let Some(sb) = self.sbs[id as usize].as_mut() else {
            return;
        };
        let f = sb.flags(k);
        let f = if f & LISTED == 0 {
            self.dirty_list.push(off);
            LISTED | FRESH
        } else {
            f | FRESH
        };
        sb.ent(k)
            .store(entry(size.clamp(1, CLASSES[sb.class]), f), Relaxed);
    }

    /// Marks free slot `k` of live superblock `id` taken (its entry unchanged); a superblock
    /// that becomes full leaves its class's partial list.
    fn reserve_slot(&mut self, id: u32, k: usize) {
        let Some(sb) = self.sbs[id as usize].as_mut() else {
            return;
        };
        sb.used[k / 64] |= 1 << (k % 64);
        sb.nused += 1;
        if self.spare[sb.class] == Some(id) {
            self.spare[sb.class] = None;
        }
        if sb.nused == sb.nslots && sb.in_partial {
            sb.in_partial = false;
            let c = sb.class;
            // Usually `id` is the list's last entry (alloc_small takes that one).
            if self.partial[c].last() == Some(&id) {
                self.partial[c].pop();
            } else {
                self.partial[c].retain(|&x| x != id);
            }
        }
    }

    /// Frees the object at heap offset `off`; [`Error::InvalidPointer`] (carrying `addr`) when
    /// no object starts there.
    pub fn free(&mut self, off: usize, addr: usize) -> Result<Obj> {
        if let Some(id) = self.sb_at(off) {
            return self.free_small(id, off, addr);
        }
        let Some((size, slot)) = self.size_slot(off) else {
            return Err(Error::InvalidPointer(addr));
        };
        let name = self.take_name(off);
        let obj = Obj { size, slot, name };
        self.nobjs -= 1;
        self.forget_crcs(off, obj.slot);
        self.touch(off, true, 0, FRESH);
        let page = off / PAGE;
        if obj.is_large() {
            if let Some((_, _, f)) = self.large.remove(&off) {
                if f != 0 {
                    self.orphans.insert(off, f);
                }
            }
            self.give_pages(page, obj.slot / PAGE);
        }
        Ok(obj)
    }

    /// Removes and returns the name of the object at `off`, if it has one (freed or moved).
    fn take_name(&mut self, off: usize) -> Option<String> {
        if self.named.is_empty() {
            return None;
        }
        let name = self.named.remove(&off)?;
        self.names.remove(&name);
        Some(name)
    }

    /// `free` of an offset in a page of superblock `id`: one lookup of the slot, whose entry
    /// holds the size and the dirty flags.
    fn free_small(&mut self, id: u32, off: usize, addr: usize) -> Result<Obj> {
        let Some(sb) = self.sbs.get_mut(id as usize).and_then(|s| s.as_mut()) else {
            return Err(Error::InvalidPointer(addr));
        };
        let Some(k) = sb.slot_at(off).filter(|&k| sb.is_live(k)) else {
            return Err(Error::InvalidPointer(addr));
        };
        let (size, slot) = (sb.size(k), CLASSES[sb.class]);
        // `touch(off, existed: true, set: 0, clear: FRESH)` on the slot's own flags.
        let f = sb.flags(k);
        if f & LISTED == 0 {
            self.dirty_list.push(off);
            sb.set_flags(k, LISTED | EXISTED);
        } else if f & FRESH != 0 {
            sb.set_flags(k, f & !FRESH);
        }
        sb.set_size(k, 0);
        self.release_slot(id, k, off);
        let name = self.take_name(off);
        self.nobjs -= 1;
        self.forget_crcs(off, slot);
        Ok(Obj { size, slot, name })
    }

    /// Gives taken slot `k` (at `off`) of live superblock `id`, holding no object, back to its
    /// superblock (which is released when this leaves it empty, unless it is its class's
    /// spare or carries flags).
    fn release_slot(&mut self, id: u32, k: usize, off: usize) {
        let Some(sb) = self.sbs.get_mut(id as usize).and_then(|s| s.as_mut()) else {
            return;
        };
        let c = sb.class;
        sb.used[k / 64] &= !(1 << (k % 64));
        sb.hint = sb.hint.min(k / 64);
        sb.nused -= 1;
        let extra = sb.nused == 0 && self.spare[c].is_some_and(|x| x != id);
        if extra && (0..sb.nslots).all(|k| sb.flags(k) == 0) {
            self.release_sb(id);
        } else {
            if extra {
                // Its slots' flags of this interval stay in its entries (no orphans to look
                // up at the checkpoint): released by `committed` if still empty then.
                self.emptied.push(id);
            } else if sb.nused == 0 {
                self.spare[c] = Some(id);
            }
            if !sb.in_partial {
                sb.in_partial = true;
                self.partial[c].push(id);
            }
            if self.recent[c].len() < RECENT {
                self.recent[c].push(off);
            }
        }
    }

    /// Takes up to `n` free slots of class `c` for a thread's cache (`crate::tcache`): pushes
    /// their offsets onto `out`, most recently freed last. Each is listed (its flags say no
    /// object stood there at the last checkpoint: none stands there now, and none did since
    /// then, or it would be listed already), so that the cache can hand it out without the
    /// lock. Stops early when the heap is full.
    pub fn reserve(&mut self, c: usize, n: usize, out: &mut Vec<usize>) {
        let start = out.len();
        for _ in 0..n {
            let Ok((id, k, off)) = self.pick_slot(c, CLASSES[c]) else {
                break;
            };
            self.reserve_slot(id, k);
            if let Some(sb) = self.sbs[id as usize].as_mut() {
                if sb.flags(k) & LISTED == 0 {
                    sb.set_flags(k, LISTED);
                    self.dirty_list.push(off);
                }
            }
            out.push(off);
        }
        out[start..].reverse();
    }

    /// Gives a slot taken by [`Alloc::reserve`] and holding no object back to its superblock.
    pub fn unreserve(&mut self, off: usize) {
        let Some(id) = self.sb_at(off) else { return };
        let Some(sb) = self.sbs[id as usize].as_ref() else {
            return;
        };
        if let Some(k) = sb.slot_at(off).filter(|&k| sb.is_used(k) && !sb.is_live(k)) {
            self.release_slot(id, k, off);
        }
    }

    /// Puts an object of `size` bytes (at most the slot) into a slot taken by
    /// [`Alloc::reserve`] (at `off`), noting the change as `alloc` does.
    pub fn take_reserved(&mut self, off: usize, size: usize) {
        let Some((id, k)) = self.sb_at(off).and_then(|id| {
            let sb = self.sbs[id as usize].as_ref()?;
            sb.slot_at(off).filter(|&k| sb.is_used(k)).map(|k| (id, k))
        }) else {
            return;
        };
        self.put_object(id, k, off, size);
        self.nobjs += 1;
    }

    /// Changes the recorded size of the object at `off` in place (`new_size <= slot`); no-op
    /// when no object starts at `off`.
    pub fn resize_in_place(&mut self, off: usize, new_size: usize) {
        let Some((_, slot)) = self.size_slot(off) else {
            return;
        };
        let size = new_size.max(1);
        if let Some((id, k)) = self.small_at(off) {
            if let Some(sb) = self.sbs[id as usize].as_mut() {
                sb.set_size(k, size); // a small object stays at most a page
            }
        } else if let Some(e) = self.large.get_mut(&off) {
            e.0 = size;
        }
        self.forget_crcs(off, slot);
        self.touch(off, true, FRESH, 0);
    }

    /// Sets or clears the name of the object at `off` (used when realloc moves an object); no-op
    /// when no object starts at `off`.
    pub fn set_name(&mut self, off: usize, name: Option<String>) {
        let Some((_, slot)) = self.size_slot(off) else {
            return;
        };
        if let Some(old) = self.named.remove(&off) {
            self.names.remove(&old);
        }
        if let Some(n) = name {
            self.names.insert(n.clone(), off);
            self.named.insert(off, n);
        }
        self.forget_crcs(off, slot);
        self.touch(off, true, 0, 0);
    }

    /// The user view (of `views`) an object at heap offset `off` with slot `slot` is returned
    /// through: the page is split into `views` parts of `PAGE / views` bytes and the object
    /// goes to the part containing its **first** byte. With two views this is the paper's rule
    /// (§3, Fig. 3, pages drawn with address 0 on top): objects in the upper (first) half via
    /// view 0, the bottom half via view 1, and an object crossing the middle via the upper
    /// view, whose page then also covers the crossing object's tail in the bottom half. Large
    /// objects (whole pages) use view 0. Medium objects (packed across pages) take the views in
    /// turn, slot by slot (`(off / slot) % views`): the page holding one's tail and the next
    /// one's head then shows each write only the object written (sqlite3's page cache updates
    /// the header at the tail of an entry far more often than the next entry's data). Any rule
    /// is correct as long as it is a function of the slot: a write anywhere in the object goes
    /// through its one view.
    pub fn view_of(views: usize, off: usize, slot: usize) -> usize {
        if slot > MEDIUM_MAX || views <= 1 {
            return 0; // large objects: view 0
        }
        if slot > PAGE {
            return (off / slot) % views;
        }
        if views.is_power_of_two() {
            // (off % PAGE) / (PAGE / views) without a division (views is 2, 4 or 8).
            (off % PAGE) >> (PAGE.trailing_zeros() - views.trailing_zeros())
        } else {
            (off % PAGE) / (PAGE / views)
        }
    }

    /// Appends to `out` the byte ranges `(offset, len, object offset)` of the objects visible
    /// through page `page` of user view `view` (of `views`): the small objects of that page
    /// assigned to the view, the parts lying in that page of the medium objects assigned to
    /// it, and (view 0) the part of a large object lying in that page.
    pub fn visible(
        &self,
        views: usize,
        view: usize,
        page: usize,
        out: &mut Vec<(usize, usize, usize)>,
    ) {
        match self.pages.get(page).map_or(Owner::Free, |&w| Owner::of(w)) {
            Owner::Free => {}
            Owner::Large(start) => {
                if view != 0 {
                    return;
                }
                let off = start as usize * PAGE;
                if let Some(&(size, _, _)) = self.large.get(&off) {
                    let (ps, pe) = (page * PAGE, (page + 1) * PAGE);
                    let (s, e) = (off.max(ps), (off + size).min(pe));
                    if s < e {
                        out.push((s, e - s, off));
                    }
                }
            }
            Owner::Small(id) => {
                // Small(id) pages always have a live superblock (see `free`).
                let sb = self.sbs[id as usize].as_ref().expect("live superblock");
                let size = CLASSES[sb.class];
                if sb.per_page == 0 {
                    // Medium: a view sees the parts lying in the page of the objects returned
                    // through it (`view_of`: the views in turn, slot by slot).
                    let base = sb.first_page * PAGE;
                    let (ps, pe) = (page * PAGE, (page + 1) * PAGE);
                    let lo = div_class(ps - base, sb.class);
                    let hi = (div_class(pe - base - 1, sb.class) + 1).min(sb.nslots);
                    for k in lo..hi {
                        let off = base + k * size;
                        if Self::view_of(views, off, size) != view {
                            continue;
                        }
                        let (s, e) = (off.max(ps), (off + sb.size(k)).min(pe));
                        if s < e {
                            out.push((s, e - s, off));
                        }
                    }
                    return;
                }
                let per_page = sb.per_page;
                let base = (page - sb.first_page) * per_page;
                // The slots whose first byte lies in the view's part of the page (`view_of`),
                // without testing every slot of the page.
                let exact = views.is_power_of_two();
                let (lo, hi) = if views <= 1 || !exact {
                    (0, per_page)
                } else {
                    let part = PAGE / views;
                    (
                        (view * part).div_ceil(size),
                        ((view + 1) * part).div_ceil(size).min(per_page),
                    )
                };
                for k in lo..hi {
                    let off = page * PAGE + k * size;
                    if !exact && Self::view_of(views, off, size) != view {
                        continue;
                    }
                    debug_assert_eq!(Self::view_of(views, off, size), view);
                    let len = sb.size(base + k);
                    if len != 0 {
                        out.push((off, len, off));
                    }
                }
            }
        }
    }

    /// Pages that belong to a superblock or a large object (their working-copy bytes matter).
    pub fn used_pages(&self) -> impl Iterator<Item = usize> + '_ {
        self.pages
            .iter()
            .enumerate()
            .filter(|(_, &w)| w != 0)
            .map(|(i, _)| i)
    }

    /// Rebuilds an allocator from a committed object table. Fails with a description when the
    /// table is inconsistent (overlaps, bad slot sizes, out of range).
    pub fn rebuild(
        capacity: usize,
        sb_size: usize,
        table: BTreeMap<usize, Obj>,
    ) -> std::result::Result<Alloc, String> {
        if sb_size == 0 || sb_size % PAGE != 0 || sb_size > MAX_SB_SIZE || capacity % sb_size != 0 {
            return Err(format!(
                "superblock size {sb_size} does not divide capacity {capacity} in pages"
            ));
        }
        let mut a = Alloc::new(capacity, sb_size);
        for (&off, obj) in &table {
            if obj.size == 0
                || obj.size > obj.slot
                || off.checked_add(obj.slot).map_or(true, |e| e > capacity)
            {
                return Err(format!(
                    "object at {off:#x}: bad size {} / slot {}",
                    obj.size, obj.slot
                ));
            }
            let page = off / PAGE;
            if obj.is_large() {
                let n = obj.slot / PAGE;
                if off % PAGE != 0 || obj.slot % PAGE != 0 {
                    return Err(format!("large object at {off:#x} not page aligned"));
                }
                if a.pages[page..page + n].iter().any(|&w| w != 0) {
                    return Err(format!("large object at {off:#x} overlaps another object"));
                }
                a.remove_free(page, n)?;
                for p in &mut a.pages[page..page + n] {
                    *p = Owner::Large(page as u32).word();
                }
                a.large.insert(off, (obj.size, obj.slot, 0));
            } else {
                let c = CLASSES
                    .iter()
                    .position(|&s| s == obj.slot)
                    .ok_or_else(|| format!("object at {off:#x}: slot {} is no class", obj.slot))?;
                // page < cap_pages (off + slot <= capacity) and capacity is a multiple of
                // sb_size (checked above), so the superblock [first, first + sb_pages) fits.
                let first = page - page % a.sb_pages;
                let misaligned = if is_medium(c) {
                    let x = off - first * PAGE;
                    x % obj.slot != 0 || x + obj.slot > a.sb_pages * PAGE
                } else {
                    (off % PAGE) % obj.slot != 0 || (off % PAGE) + obj.slot > PAGE
                };
                if misaligned {
                    return Err(format!(
                        "object at {off:#x} misaligned for class {}",
                        obj.slot
                    ));
                }
                let class_of = |id: u32| {
                    a.sbs
                        .get(id as usize)
                        .and_then(|s| s.as_ref())
                        .map(|s| s.class)
                };
                let id = match Owner::of(a.pages[page]) {
                    Owner::Small(id) if class_of(id) == Some(c) => id,
                    Owner::Free => {
                        a.remove_free(first, a.sb_pages)?;
                        a.new_sb(c, first)
                    }
                    _ => return Err(format!("object at {off:#x} overlaps another superblock")),
                };
                let sb = a
                    .sbs
                    .get_mut(id as usize)
                    .and_then(|s| s.as_mut())
                    .ok_or_else(|| format!("object at {off:#x}: superblock {id} missing"))?;
                // slot < nslots: page - first < sb_pages and the in-page index < per_page (a
                // medium slot: it ends within the superblock, checked above).
                let slot = sb.slot_index(off);
                if sb.used[slot / 64] & (1 << (slot % 64)) != 0 {
                    return Err(format!("object at {off:#x} listed twice"));
                }
                sb.used[slot / 64] |= 1 << (slot % 64);
                sb.set_size(slot, obj.size); // obj.size <= obj.slot <= MEDIUM_MAX
                sb.nused += 1;
            }
            if let Some(n) = &obj.name {
                if a.names.insert(n.clone(), off).is_some() {
                    return Err(format!("name {n:?} used twice"));
                }
                a.named.insert(off, n.clone());
            }
            a.nobjs += 1;
        }
        for (id, sb) in a.sbs.iter_mut().enumerate() {
            if let Some(sb) = sb {
                if sb.nused < sb.nslots {
                    sb.in_partial = true;
                    a.partial[sb.class].push(id as u32);
                }
            }
        }
        a.hwm = a.used_end();
        Ok(a)
    }

    fn remove_free(&mut self, start: usize, n: usize) -> std::result::Result<(), String> {
        let (&s, &l) = self
            .free_runs
            .range(..=start)
            .next_back()
            .ok_or_else(|| format!("pages {start}+{n} not free"))?;
        if s + l < start + n {
            return Err(format!("pages {start}+{n} not free"));
        }
        self.free_runs.remove(&s);
        if start > s {
            self.free_runs.insert(s, start - s);
        }
        if start + n < s + l {
            self.free_runs.insert(start + n, s + l - start - n);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn page_owners_round_trip_through_their_words() {
        let max = (1u32 << 31) - 2;
        for o in [
            Owner::Free,
            Owner::Small(0),
            Owner::Small(max),
            Owner::Large(0),
            Owner::Large(max + 1),
        ] {
            assert_eq!(Owner::of(o.word()), o);
        }
        assert_eq!(Owner::Free.word(), 0, "a zeroed table is all free");
    }

    #[test]
    fn small_objects_never_cross_pages() {
        let mut a = Alloc::new(1 << 20, 64 << 10);
        for &s in &[1usize, 17, 40, 100, 1000, 1300, 2000, 4096] {
            for _ in 0..50 {
                let off = a.alloc(s, None).unwrap();
                let slot = a.get(off).unwrap().slot;
                assert_eq!(off / PAGE, (off + slot - 1) / PAGE, "size {s} at {off:#x}");
            }
        }
    }

    #[test]
    fn slot_for_is_the_slot_alloc_gives() {
        let mut a = Alloc::new(4 << 20, 64 << 10);
        for s in [
            0usize, 1, 16, 17, 1000, 1360, 1361, 4096, 4097, 4608, 4609, 7168, 7169, 8192, 12288,
            12289,
        ] {
            let off = a.alloc(s, None).unwrap();
            assert_eq!(a.get(off).unwrap().slot, slot_for(s), "size {s}");
        }
    }

    /// Medium objects are packed end to end in their superblock (one of 4.3 KiB takes 4608
    /// bytes, not two pages), are found from their first byte only, and a page shows each view
    /// the parts lying in it of the objects returned through that view (the views in turn).
    #[test]
    fn medium_objects_are_packed_across_pages() {
        let mut a = Alloc::new(1 << 20, 64 << 10);
        let offs: Vec<usize> = (0..14).map(|_| a.alloc(4352, None).unwrap()).collect();
        let base = offs[0];
        assert_eq!(base % (64 << 10), 0);
        for (k, &o) in offs.iter().enumerate() {
            assert_eq!(o, base + k * 4608);
            assert_eq!(a.size_slot(o), Some((4352, 4608)));
            assert_eq!(a.size_slot(o + 16), None);
        }
        // The 15th does not fit the 64 KiB superblock (15 * 4608 > 65536): a new one.
        let next = a.alloc(4352, None).unwrap();
        assert_ne!(next / (64 << 10), base / (64 << 10));
        // Page 1 of the superblock holds the tail of object 0 (4096..4352) and the head of
        // object 1 (4608..8192), returned through different views (the views in turn): each
        // view's page 1 shows its own object's part only.
        let (v0, v1) = (
            Alloc::view_of(2, base, 4608),
            Alloc::view_of(2, base + 4608, 4608),
        );
        assert_ne!(v0, v1);
        let mut v = Vec::new();
        a.visible(2, v0, base / PAGE + 1, &mut v);
        assert_eq!(v, vec![(base + PAGE, 256, base)]);
        v.clear();
        a.visible(2, v1, base / PAGE + 1, &mut v);
        assert_eq!(v, vec![(base + 4608, 8192 - 4608, base + 4608)]);
        // One view (PGCK) sees both.
        v.clear();
        a.visible(1, 0, base / PAGE + 1, &mut v);
        assert_eq!(
            v,
            vec![
                (base + PAGE, 256, base),
                (base + 4608, 8192 - 4608, base + 4608)
            ]
        );
        a.free(offs[1], offs[1]).unwrap();
        v.clear();
        a.visible(2, v1, base / PAGE + 1, &mut v);
        assert!(v.is_empty());
        // Rebuilt from its table, the allocator has the same objects.
        let table: BTreeMap<usize, Obj> = a.iter().collect();
        let b = Alloc::rebuild(1 << 20, 64 << 10, table.clone()).unwrap();
        assert_eq!(b.iter().collect::<BTreeMap<_, _>>(), table);
        let mut bad = table;
        bad.insert(
            base + 4608 + 16,
            Obj {
                size: 10,
                slot: 4608,
                name: None,
            },
        );
        assert!(Alloc::rebuild(1 << 20, 64 << 10, bad).is_err());
    }

    #[test]
    fn view_rule_two_views() {
        // first half, second half, crossing the middle (1360-byte slot at 1360..2720).
        assert_eq!(Alloc::view_of(2, 0, 64), 0);
        assert_eq!(Alloc::view_of(2, 2048, 64), 1);
        assert_eq!(Alloc::view_of(2, 2047 - 63, 64), 0);
        assert_eq!(Alloc::view_of(2, 1360, 1360), 0);
        assert_eq!(Alloc::view_of(2, 8192, 3 * PAGE), 0);
        // Medium slots take the views in turn.
        assert_eq!(Alloc::view_of(2, 65536, 4608), (65536 / 4608) % 2);
        assert_ne!(
            Alloc::view_of(2, 65536, 4608),
            Alloc::view_of(2, 65536 + 4608, 4608)
        );
        assert_eq!(Alloc::view_of(4, 3 * 5120, 5120), 3);
        assert_eq!(Alloc::view_of(4, 3 * 1024, 1024), 3);
        assert_eq!(Alloc::view_of(4, 2720, 1360), 2);
        assert_eq!(Alloc::view_of(1, 3000, 16), 0);
    }

    #[test]
    fn class_tables_match_the_classes() {
        for size in 1..=MEDIUM_MAX {
            let c = class_for(size).unwrap();
            assert!(
                CLASSES[c] >= size && (c == 0 || CLASSES[c - 1] < size),
                "size {size}"
            );
        }
        assert_eq!(class_for(MEDIUM_MAX + 1), None);
        assert!(CLASSES[..NSMALL].iter().all(|&s| s <= PAGE));
        assert!(CLASSES[NSMALL..].iter().all(|&s| s > PAGE && s < 2 * PAGE));
        for (c, size) in CLASSES.iter().enumerate() {
            for x in (0..1 << 24)
                .step_by(5)
                .chain((0..=PAGE).chain([(1 << 24) - 1]))
            {
                assert_eq!(div_class(x, c), x / size, "{x} / {size}");
            }
            if is_medium(c) {
                continue;
            }
            let per_page = PAGE / size;
            for k in (0..1 << 20).step_by(7).chain([(1 << 20) - 1]) {
                assert_eq!(((k as u64 * RECIP_PP[c]) >> 32) as usize, k / per_page);
            }
        }
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig { cases: 256, ..Default::default() })]
        /// The journal of every interval, replayed onto the table of the previous checkpoint,
        /// gives the live table: superblocks released and their pages reused (by another class
        /// or a large object) between two checkpoints included, where the dirty flags of the
        /// freed objects live on as orphans.
        #[test]
        fn journal_replays_to_the_table(ops in proptest::collection::vec((0u8..10, 0usize..64, 1usize..20000), 1..400)) {
            let mut a = Alloc::new(1 << 20, 16 << 10);
            let mut live: Vec<usize> = Vec::new();
            let mut committed: BTreeMap<usize, Obj> = BTreeMap::new();
            for (kind, i, size) in ops {
                match kind {
                    0..=4 => {
                        // Mostly small sizes; some large.
                        let size = if kind == 4 { size } else { 1 + size % 1500 };
                        if let Ok(off) = a.alloc(size, None) {
                            live.push(off);
                        }
                    }
                    5..=8 if !live.is_empty() => {
                        let off = live.swap_remove(i % live.len());
                        a.free(off, off).unwrap();
                    }
                    _ => {
                        for r in a.journal() {
                            match r {
                                MetaRec::Alloc { off, obj } => {
                                    committed.insert(off, obj);
                                }
                                MetaRec::Free { off } => {
                                    proptest::prop_assert!(committed.remove(&off).is_some(), "free of {off:#x} not in the last checkpoint");
                                }
                                MetaRec::Crc { .. } => {}
                            }
                        }
                        a.committed(false);
                        let now: BTreeMap<usize, Obj> = a.iter().collect();
                        proptest::prop_assert_eq!(&committed, &now);
                        proptest::prop_assert!(a.orphans.is_empty());
                    }
                }
            }
        }
    }

    #[test]
    fn rebuild_round_trip_and_reject_overlap() {
        let mut a = Alloc::new(1 << 20, 64 << 10);
        let x = a.alloc(10, Some("x")).unwrap();
        let big = a.alloc(9000, None).unwrap();
        a.alloc(700, None).unwrap();
        let table: BTreeMap<usize, Obj> = a.iter().collect();
        assert_eq!(table.len(), 3);
        let b = Alloc::rebuild(1 << 20, 64 << 10, table.clone()).unwrap();
        assert_eq!(b.names["x"], x);
        assert_eq!(b.iter().collect::<BTreeMap<_, _>>(), table);
        assert_eq!(b.count(), 3);
        let mut bad = table;
        bad.insert(
            big + PAGE,
            Obj {
                size: 16,
                slot: 16,
                name: None,
            },
        );
        assert!(Alloc::rebuild(1 << 20, 64 << 10, bad).is_err());
    }
}
