//! The allocator: size classes over superblocks, large objects as page runs, the object table.
//!
//! Everything here works on *heap offsets* (bytes from the start of the heap's memfd), never on
//! addresses: the views ([`crate::Heap`]) translate. The allocator is plain data guarded by the
//! heap's lock.
//!
//! * Pages `[0, capacity/PAGE)` are handed out by a first-fit page-run allocator
//!   (`free_runs`). A superblock is an aligned run of `sb_pages` pages serving one size class;
//!   a large object (more than one page) is a run of whole pages of its own.
//! * Small objects never straddle a page boundary: a page of a class of size `s` holds
//!   `PAGE / s` slots at in-page offsets `0, s, 2s, ...`.
//! * The object table lives where the objects do: a small object is a set bit of its
//!   superblock's slot bitmap with its requested size beside it; a large object is an entry
//!   of `large` (offset → size, slot); names are in `named` (offset → name) and `names`
//!   (name → offset) and are unique. A lookup by offset is two array indexings, not a hash
//!   probe that misses the cache (the central hash table cost a free ~100 ns).
//! * `dirty` lists the offsets whose table entry changed since the last committed checkpoint,
//!   each with whether an object stood there at that checkpoint; the checkpoint turns them into
//!   the metadata redo log ([`Alloc::journal`]): one record per changed offset with its final
//!   state, so an object created and freed between two checkpoints costs no record, and a call
//!   costs a map update instead of building a record. `fresh` lists the objects created or
//!   moved since then (their bytes are copied at the next checkpoint even if no user write was
//!   seen: realloc copies through the library view).

use crate::error::{Error, Result};
use rustc_hash::FxHashMap;
use std::collections::BTreeMap;

/// Page size (x86-64).
pub const PAGE: usize = 4096;

/// Slot sizes of the small classes. Each divides into a page without a slot crossing a page
/// boundary; the largest is one page.
pub const CLASSES: [usize; 15] = [
    16, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1360, 2048, 4096,
];

/// The class index for `size` (≤ one page).
pub fn class_for(size: usize) -> Option<usize> {
    CLASSES.iter().position(|&c| c >= size.max(1))
}

/// Dirty flag (see `Alloc`): an object stood at the offset at the last committed checkpoint.
pub const EXISTED: u8 = 1;
/// Dirty flag: the live object at the offset was created or moved (or resized) since the last
/// `ckall`: its bytes are copied whole by the next one.
pub const FRESH: u8 = 2;
/// Dirty flag: the offset is listed (its table entry changed, or it is fresh).
pub const LISTED: u8 = 4;
/// Objects start at multiples of this (the smallest class).
const GRAIN: usize = 16;

/// The slot capacity an object of `size` bytes gets: its class size for at most a page, else
/// whole pages.
pub fn slot_for(size: usize) -> usize {
    let size = size.max(1);
    if size > PAGE {
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
    /// Slot capacity: the class size for small objects, `pages * PAGE` for large ones.
    pub slot: usize,
    /// Optional unique name.
    pub name: Option<String>,
}

impl Obj {
    /// True for whole-page objects.
    pub fn is_large(&self) -> bool {
        self.slot > PAGE
    }
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
    /// The live bytes of the checkpoint image's page at `off` (its objects' bytes in that
    /// page, in offset order: [`crate::format::live_in_page`]) are `len` bytes with CRC-32
    /// `crc`. Follows the table records of the same checkpoint (an `Alloc` or `Free` record
    /// drops the checksums of the pages of the object's slot).
    Crc {
        /// Heap offset of the page.
        off: usize,
        /// Live bytes in the page.
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

#[derive(Debug)]
struct Sb {
    class: usize,
    first_page: usize,
    used: Vec<u64>,
    /// No word of `used` below this index has a free slot.
    hint: usize,
    /// Requested size of the object in each used slot (the object table of small objects), so that a checkpoint's
    /// scan of a page needs no table lookup.
    sizes: Vec<u16>,
    nused: usize,
    nslots: usize,
    in_partial: bool,
}

impl Sb {
    /// The slot holding heap offset `off` (a page of this superblock): the inverse of
    /// [`Alloc::slot_off`].
    fn slot_index(&self, off: usize) -> usize {
        let size = CLASSES[self.class];
        (off / PAGE - self.first_page) * (PAGE / size) + (off % PAGE) / size
    }
}

/// Allocator state over a heap of fixed capacity.
#[derive(Debug)]
pub struct Alloc {
    cap_pages: usize,
    sb_pages: usize,
    free_runs: BTreeMap<usize, usize>,
    pages: Vec<Owner>,
    sbs: Vec<Option<Sb>>,
    sb_free_ids: Vec<u32>,
    partial: Vec<Vec<u32>>,
    /// Large objects: heap offset → (requested size, slot).
    large: FxHashMap<usize, (usize, usize)>,
    /// Names of the named objects by heap offset.
    named: FxHashMap<usize, String>,
    /// Number of live objects.
    nobjs: usize,
    /// Name → heap offset.
    pub names: FxHashMap<String, usize>,
    /// Flags of the offsets whose table entry changed since the last committed checkpoint, or
    /// whose object was created or moved since the last `ckall`: [`LISTED`] (the offset is in
    /// `dirty_list`) | [`EXISTED`] (an object stood there at the last committed checkpoint) |
    /// [`FRESH`] (the live object there must be copied whole at the next `ckall`). One byte
    /// per 16 heap bytes (objects start at multiples of 16), indexed by `offset / 16`: a call
    /// touches one byte instead of probing a hash map whose entries miss the cache. The vector
    /// is zeroed memory from the allocator (`calloc`: pages become resident when touched).
    dirty: Vec<u8>,
    /// The offsets with [`LISTED`] set, in the order they were first changed.
    dirty_list: Vec<usize>,
    /// Committed checksums of the checkpoint image: page offset → (live bytes, CRC-32 of them;
    /// see [`crate::format::live_in_page`]). A page without an entry has not been checkpointed
    /// since one of its objects changed.
    pub crcs: FxHashMap<usize, (usize, u32)>,
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
            free_runs,
            pages: vec![Owner::Free; cap_pages],
            sbs: Vec::new(),
            sb_free_ids: Vec::new(),
            partial: vec![Vec::new(); CLASSES.len()],
            large: FxHashMap::default(),
            named: FxHashMap::default(),
            nobjs: 0,
            names: FxHashMap::default(),
            dirty: vec![0; capacity / GRAIN],
            dirty_list: Vec::new(),
            crcs: FxHashMap::default(),
        }
    }

    /// The superblock id and slot index of the small object starting at `off`, if one does.
    fn small_at(&self, off: usize) -> Option<(u32, usize)> {
        let Owner::Small(id) = *self.pages.get(off / PAGE)? else {
            return None;
        };
        let sb = self.sbs.get(id as usize)?.as_ref()?;
        let size = CLASSES[sb.class];
        let in_page = off % PAGE;
        if in_page % size != 0 || in_page / size >= PAGE / size {
            return None;
        }
        let k = sb.slot_index(off);
        (sb.used[k / 64] & (1 << (k % 64)) != 0).then_some((id, k))
    }

    /// Requested size and slot of the live object starting at heap offset `off`.
    pub fn size_slot(&self, off: usize) -> Option<(usize, usize)> {
        match *self.pages.get(off / PAGE)? {
            Owner::Small(_) => {
                let (id, k) = self.small_at(off)?;
                let sb = self.sbs[id as usize].as_ref()?;
                Some((sb.sizes[k] as usize, CLASSES[sb.class]))
            }
            Owner::Large(_) => self.large.get(&off).copied(),
            Owner::Free => None,
        }
    }

    /// The live object starting at heap offset `off` (its name cloned).
    pub fn get(&self, off: usize) -> Option<Obj> {
        let (size, slot) = self.size_slot(off)?;
        Some(Obj {
            size,
            slot,
            name: self.named.get(&off).cloned(),
        })
    }

    /// Number of live objects.
    pub fn len(&self) -> usize {
        self.nobjs
    }

    /// True when no object is live.
    pub fn is_empty(&self) -> bool {
        self.nobjs == 0
    }

    /// Every live object `(offset, object)`, in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = (usize, Obj)> + '_ {
        let small = self.sbs.iter().flatten().flat_map(move |sb| {
            let size = CLASSES[sb.class];
            (0..sb.nslots)
                .filter(move |&k| sb.used[k / 64] & (1 << (k % 64)) != 0)
                .map(move |k| {
                    let off = self.slot_off(sb, k);
                    (
                        off,
                        Obj {
                            size: sb.sizes[k] as usize,
                            slot: size,
                            name: self.named.get(&off).cloned(),
                        },
                    )
                })
        });
        let large = self.large.iter().map(move |(&off, &(size, slot))| {
            (
                off,
                Obj {
                    size,
                    slot,
                    name: self.named.get(&off).cloned(),
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
        let first = off / PAGE * PAGE;
        for c in (first..off.saturating_add(slot.max(1))).step_by(PAGE) {
            self.crcs.remove(&c);
        }
    }

    /// Notes that the table entry at `off` changes; `existed`: an object stands there now
    /// (before the change). The first change of an interval fixes what the last checkpoint
    /// holds there: the object standing there now unless an earlier change of this interval
    /// put it there.
    /// `set` and `clear` are [`FRESH`] bits to change.
    fn touch(&mut self, off: usize, existed: bool, set: u8, clear: u8) {
        let f = &mut self.dirty[off / GRAIN];
        if *f & LISTED == 0 {
            *f = LISTED | if existed { EXISTED } else { 0 };
            self.dirty_list.push(off);
        }
        *f = (*f | set) & !clear;
    }

    /// The live objects created or moved since the last `ckall` (their bytes are copied whole).
    pub fn fresh(&self) -> impl Iterator<Item = usize> + '_ {
        self.dirty_list
            .iter()
            .copied()
            .filter(|&o| self.dirty[o / GRAIN] & FRESH != 0)
    }

    /// After a committed checkpoint: the table changes are in the journal; with `keep_fresh`
    /// (a `ckone`, which copies one object) the objects still to be copied stay listed, now as
    /// standing in the committed table.
    pub fn committed(&mut self, keep_fresh: bool) {
        let mut list = std::mem::take(&mut self.dirty_list);
        for &o in &list {
            let f = &mut self.dirty[o / GRAIN];
            *f = if keep_fresh && *f & FRESH != 0 {
                LISTED | EXISTED | FRESH
            } else {
                0
            };
        }
        if keep_fresh {
            list.retain(|&o| self.dirty[o / GRAIN] != 0);
        } else {
            list.clear();
        }
        self.dirty_list = list;
    }

    /// Takes `off` off the objects to copy whole (a `ckone` copies it now).
    pub fn unfresh(&mut self, off: usize) {
        if let Some(f) = self.dirty.get_mut(off / GRAIN) {
            *f &= !FRESH;
        }
    }

    /// The metadata records of the table changes since the last committed checkpoint, by
    /// offset: an `Alloc` with the final object where one stands, a `Free` where the last
    /// checkpoint had one and none stands now, nothing where neither holds.
    pub fn journal(&self) -> Vec<MetaRec> {
        let mut offs: Vec<(usize, bool)> = self
            .dirty_list
            .iter()
            .map(|&o| (o, self.dirty[o / GRAIN] & EXISTED != 0))
            .collect();
        offs.sort_unstable();
        offs.into_iter()
            .filter_map(|(off, existed)| match self.get(off) {
                Some(obj) => Some(MetaRec::Alloc { off, obj }),
                None => existed.then_some(MetaRec::Free { off }),
            })
            .collect()
    }

    fn capacity(&self) -> usize {
        self.cap_pages * PAGE
    }

    /// First-fit run of `n` pages whose start is a multiple of `align` pages.
    fn take_pages(&mut self, n: usize, align: usize) -> Option<usize> {
        let mut found = None;
        for (&s, &l) in &self.free_runs {
            let a = s.div_ceil(align) * align;
            if a + n <= s + l {
                found = Some((s, l, a));
                break;
            }
        }
        let (s, l, a) = found?;
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
            *p = Owner::Free;
        }
    }

    fn new_sb(&mut self, class: usize, first_page: usize) -> u32 {
        let per_page = PAGE / CLASSES[class];
        let nslots = per_page * self.sb_pages;
        let sb = Sb {
            class,
            first_page,
            used: vec![0; nslots.div_ceil(64)],
            hint: 0,
            sizes: vec![0; nslots],
            nused: 0,
            nslots,
            in_partial: false,
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
            *p = Owner::Small(id);
        }
        id
    }

    fn slot_off(&self, sb: &Sb, slot: usize) -> usize {
        let size = CLASSES[sb.class];
        let per_page = PAGE / size;
        (sb.first_page + slot / per_page) * PAGE + (slot % per_page) * size
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
        let (off, slot) = if size > PAGE {
            let n = size.div_ceil(PAGE);
            let start = self.take_pages(n, 1).ok_or_else(|| Error::OutOfMemory {
                requested: size,
                capacity: self.capacity(),
            })?;
            for p in &mut self.pages[start..start + n] {
                *p = Owner::Large(start as u32);
            }
            self.large.insert(start * PAGE, (size, n * PAGE));
            (start * PAGE, n * PAGE)
        } else {
            // size <= PAGE here and the last class is PAGE, so a class exists.
            let c = class_for(size).unwrap_or(CLASSES.len() - 1);
            (self.alloc_small(c, size)?, CLASSES[c])
        };
        if let Some(n) = name {
            self.names.insert(n.to_string(), off);
            self.named.insert(off, n.to_string());
        }
        self.nobjs += 1;
        self.touch(off, false, FRESH, 0);
        self.forget_crcs(off, slot);
        Ok(off)
    }

    fn alloc_small(&mut self, c: usize, size: usize) -> Result<usize> {
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
                    let first = self.take_pages(self.sb_pages, self.sb_pages).ok_or(
                        Error::OutOfMemory {
                            requested: size,
                            capacity: self.capacity(),
                        },
                    )?;
                    let id = self.new_sb(c, first);
                    // new_sb just stored Some at index id.
                    if let Some(sb) = self.sbs[id as usize].as_mut() {
                        sb.in_partial = true;
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
        sb.used[wi] |= 1 << (slot % 64);
        sb.sizes[slot] = size as u16; // size <= PAGE
        sb.nused += 1;
        if sb.nused == sb.nslots {
            sb.in_partial = false;
            // `id` came from the end of the list (above), unless it was just created there.
            if self.partial[c].last() == Some(&id) {
                self.partial[c].pop();
            } else {
                self.partial[c].retain(|&x| x != id);
            }
        }
        let sb = self.sbs[id as usize].as_ref().unwrap(); // still the live superblock `id`
        Ok(self.slot_off(sb, slot))
    }

    /// Frees the object at heap offset `off`; [`Error::InvalidPointer`] (carrying `addr`) when
    /// no object starts there.
    pub fn free(&mut self, off: usize, addr: usize) -> Result<Obj> {
        let (size, slot) = self.size_slot(off).ok_or(Error::InvalidPointer(addr))?;
        let name = if self.named.is_empty() {
            None
        } else {
            self.named.remove(&off)
        };
        if let Some(n) = &name {
            self.names.remove(n);
        }
        let obj = Obj { size, slot, name };
        if obj.is_large() {
            self.large.remove(&off);
        }
        self.nobjs -= 1;
        self.forget_crcs(off, obj.slot);
        self.touch(off, true, 0, FRESH);
        let page = off / PAGE;
        if obj.is_large() {
            self.give_pages(page, obj.slot / PAGE);
        } else if let Owner::Small(id) = self.pages[page] {
            // A page owned by Small(id) belongs to a live superblock: the owner is reset to
            // Free (give_pages) in the same step that drops the superblock.
            let sb = self.sbs[id as usize].as_mut().expect("live superblock");
            let slot = sb.slot_index(off);
            sb.used[slot / 64] &= !(1 << (slot % 64));
            sb.hint = sb.hint.min(slot / 64);
            sb.nused -= 1;
            if sb.nused == 0 {
                let (first, class) = (sb.first_page, sb.class);
                self.sbs[id as usize] = None;
                self.sb_free_ids.push(id);
                self.partial[class].retain(|&x| x != id);
                self.give_pages(first, self.sb_pages);
            } else if !sb.in_partial {
                sb.in_partial = true;
                let c = sb.class;
                self.partial[c].push(id);
            }
        }
        Ok(obj)
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
                sb.sizes[k] = size as u16; // a small object stays at most a page
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
    /// objects (whole pages) always use view 0. Any rule is correct as long as it is a
    /// function of the slot: a write anywhere in the object goes through its one view.
    pub fn view_of(views: usize, off: usize, slot: usize) -> usize {
        if slot > PAGE || views == 1 {
            return 0;
        }
        (off % PAGE) / (PAGE / views)
    }

    /// Appends to `out` the byte ranges `(offset, len, object offset)` of the objects visible
    /// through page `page` of user view `view` (of `views`): the small objects of that page
    /// assigned to the view, and (view 0) the part of a large object lying in that page.
    pub fn visible(
        &self,
        views: usize,
        view: usize,
        page: usize,
        out: &mut Vec<(usize, usize, usize)>,
    ) {
        match self.pages.get(page).copied().unwrap_or(Owner::Free) {
            Owner::Free => {}
            Owner::Large(start) => {
                if view != 0 {
                    return;
                }
                let off = start as usize * PAGE;
                if let Some(&(size, _)) = self.large.get(&off) {
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
                let per_page = PAGE / size;
                let base = (page - sb.first_page) * per_page;
                for k in 0..per_page {
                    let slot = base + k;
                    if sb.used[slot / 64] & (1 << (slot % 64)) == 0 {
                        continue;
                    }
                    let off = page * PAGE + k * size;
                    if Self::view_of(views, off, size) != view {
                        continue;
                    }
                    let len = sb.sizes[slot] as usize;
                    out.push((off, len, off));
                }
            }
        }
    }

    /// Pages that belong to a superblock or a large object (their working-copy bytes matter).
    pub fn used_pages(&self) -> impl Iterator<Item = usize> + '_ {
        self.pages
            .iter()
            .enumerate()
            .filter(|(_, o)| **o != Owner::Free)
            .map(|(i, _)| i)
    }

    /// Rebuilds an allocator from a committed object table. Fails with a description when the
    /// table is inconsistent (overlaps, bad slot sizes, out of range).
    pub fn rebuild(
        capacity: usize,
        sb_size: usize,
        table: BTreeMap<usize, Obj>,
    ) -> std::result::Result<Alloc, String> {
        if sb_size == 0 || sb_size % PAGE != 0 || capacity % sb_size != 0 {
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
                if a.pages[page..page + n].iter().any(|p| *p != Owner::Free) {
                    return Err(format!("large object at {off:#x} overlaps another object"));
                }
                a.remove_free(page, n)?;
                for p in &mut a.pages[page..page + n] {
                    *p = Owner::Large(page as u32);
                }
                a.large.insert(off, (obj.size, obj.slot));
            } else {
                let c = CLASSES
                    .iter()
                    .position(|&s| s == obj.slot)
                    .ok_or_else(|| format!("object at {off:#x}: slot {} is no class", obj.slot))?;
                if (off % PAGE) % obj.slot != 0 || (off % PAGE) + obj.slot > PAGE {
                    return Err(format!(
                        "object at {off:#x} misaligned for class {}",
                        obj.slot
                    ));
                }
                // page < cap_pages (off + slot <= capacity) and capacity is a multiple of
                // sb_size (checked above), so the superblock [first, first + sb_pages) fits.
                let first = page - page % a.sb_pages;
                let class_of = |id: u32| {
                    a.sbs
                        .get(id as usize)
                        .and_then(|s| s.as_ref())
                        .map(|s| s.class)
                };
                let id = match a.pages[page] {
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
                let per_page = PAGE / obj.slot;
                // slot < nslots: page - first < sb_pages and the in-page index < per_page.
                let slot = (page - first) * per_page + (off % PAGE) / obj.slot;
                if sb.used[slot / 64] & (1 << (slot % 64)) != 0 {
                    return Err(format!("object at {off:#x} listed twice"));
                }
                sb.used[slot / 64] |= 1 << (slot % 64);
                sb.sizes[slot] = obj.size as u16; // obj.size <= obj.slot <= PAGE
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
            0usize, 1, 16, 17, 1000, 1360, 1361, 4096, 4097, 12288, 12289,
        ] {
            let off = a.alloc(s, None).unwrap();
            assert_eq!(a.get(off).unwrap().slot, slot_for(s), "size {s}");
        }
    }

    #[test]
    fn view_rule_two_views() {
        // first half, second half, crossing the middle (1360-byte slot at 1360..2720).
        assert_eq!(Alloc::view_of(2, 0, 64), 0);
        assert_eq!(Alloc::view_of(2, 2048, 64), 1);
        assert_eq!(Alloc::view_of(2, 2047 - 63, 64), 0);
        assert_eq!(Alloc::view_of(2, 1360, 1360), 0);
        assert_eq!(Alloc::view_of(2, 8192, 3 * PAGE), 0);
        assert_eq!(Alloc::view_of(4, 3 * 1024, 1024), 3);
        assert_eq!(Alloc::view_of(4, 2720, 1360), 2);
        assert_eq!(Alloc::view_of(1, 3000, 16), 0);
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
        assert_eq!(b.len(), 3);
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
