//! One region's window table and what a pass does with it: sense (which tripwires the
//! application hit, which pages it faulted in itself), learn the order (direction, stride or
//! none), and plan the next populate calls within the budget.
//!
//! The table is the paper's: `entries` (≤ 64) entries of 16 bytes, one chunk each. In 4 KiB
//! mode a chunk is `chunk` pages populated in one call but for one **tripwire** page, the one
//! the application will touch first (the lowest page ascending, the highest descending), left
//! to the kernel: its presence tells the service the chunk is in use, at the cost of one
//! kernel fault per chunk. In huge-page mode (the region's VMA is THP-eligible, seen on the
//! first populate or asked for) a chunk is a whole 2 MiB unit, which cannot hold a 4 KiB
//! tripwire (touching any page of an eligible unit allocates the whole huge page): there the
//! tripwire is the unit just past the window, left unpopulated; when the application faults
//! it in, everything before it was used and the window moves past it. So huge-page mode costs
//! one kernel huge fault per window, 4 KiB mode one small fault per chunk.
//!
//! Pages are identified by their index in the region. Two bitmaps per region: `ours` (pages
//! this service populated) and `seen` (present pages it did not populate: the application's
//! footprint). The footprint is exact — those pages were faulted by the application — and is
//! what the order is learned from; a tripwire hit is a footprint page too.

use crate::policy::{Order, Policy, Populate, Thp};
use tiermem_fault::PAGE_SIZE;

/// Pages in a 2 MiB unit.
pub(crate) const UNIT: usize = 512;
/// How far past the window a pass looks for the application's own faults.
const LOOKAHEAD: usize = 2 * UNIT;
const NONE: u32 = u32::MAX;
/// How far ahead of the application the frontier jumps when it was overtaken, before rounding
/// up to the next 2 MiB boundary: a whole unit, so the service's populates never take the
/// page-table lock the application's own faults take. Measured with `examples/touch` (64 MiB,
/// back-to-back touches): jumping only 64 pages made the application's kernel faults 20 %
/// slower (p50 4,056 against 3,354 TSC ticks) and the whole run 0.79–0.91× of the kernel's
/// instead of 0.74×; at a 5 µs gap it saved ~480 of ~16,000 faults.
const JUMP: usize = UNIT;
/// Entries a region's table starts with, whatever its order: the table grows to the policy's
/// `entries` by doubling on each pass that saw the application use an entry (a tripwire hit,
/// a unit passed) or overtake the frontier, as the kernel's readahead window grows on
/// sequential hits (an order, learned or given, says where the application goes, not how far).
/// A region whose order was learned from a few faults, or guessed by the preload library for
/// an allocator's memory, but that is then left alone (vips's `[heap]`: 537 pages faulted,
/// none of 960 populated ahead ever touched) costs 4 chunks of zeroing, not the whole
/// window's 64 — CPU taken from the application's other threads when every core is busy.
pub const RAMP_START: usize = 4;

/// A window-table entry (16 bytes, as the paper's).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(C)]
pub(crate) struct Entry {
    /// First page of the chunk (4 KiB mode: ascending order of its pages).
    pub first: u64,
    /// Pages the chunk spans (its last page is `first + (pages - 1) * step`).
    pub pages: u16,
    /// Distance between its pages (1 unless strided).
    pub step: u16,
    /// Tripwire page (region index, low 32 bits), `NONE` in huge-page mode or for 1-page chunks.
    pub trip: u32,
}

const _: () = assert!(std::mem::size_of::<Entry>() == 16);

impl Entry {
    fn last(&self) -> usize {
        self.first as usize + (self.pages as usize - 1) * self.step as usize
    }
}

/// The order being followed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    /// No evidence yet (policy Auto).
    Learning,
    Asc,
    Desc,
    Stride(usize),
    Whole,
}

impl Mode {
    /// Packed for the slot's `learned` word: order as in `Policy::pack`, stride << 8.
    pub fn packed(&self) -> u64 {
        match *self {
            Mode::Learning => 0,
            Mode::Asc => 1,
            Mode::Desc => 2,
            Mode::Stride(s) => 3 | (s as u64) << 8,
            Mode::Whole => 4,
        }
    }
}

/// A populate the pass wants: page range `[first, first + pages)` of the region.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Call {
    pub first: usize,
    pub pages: usize,
}

/// What a pass saw, for statistics.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Sensed {
    /// Tripwires hit (4 KiB mode) or windows passed (huge-page mode).
    pub hits: u64,
    /// New footprint pages (faulted by the application itself).
    pub footprint: u64,
}

pub(crate) struct Window {
    pub pages: usize,
    /// Pages from the region's base to the first 2 MiB boundary.
    head: usize,
    pub policy: Policy,
    pub mode: Mode,
    pub thp: bool,
    /// Populate for reading (the zero page) rather than writing: the policy's `Read`, or
    /// learned under `Auto` from a footprint mapped to the zero page.
    pub populate_read: bool,
    ours: Vec<u64>,
    seen: Vec<u64>,
    pub table: Vec<Entry>,
    /// Next page to fill: ascending/stride/whole the lowest unfilled page, descending one past
    /// the highest unfilled page.
    next: usize,
    /// Where the application was last seen (a footprint page).
    app: Option<usize>,
    /// Populated pages not (yet) known to be used: the table's entries plus stranded ones.
    pub unused_pages: usize,
    /// Pages of entries the application passed without touching their tripwire.
    pub stranded_pages: usize,
    /// Passes with nothing new: sensing slows down for idle regions.
    pub idle_passes: u32,
    /// Entries the table may hold now (see [`RAMP_START`]).
    limit: usize,
    /// Whether a populate was planned yet: until then the application cannot have overtaken
    /// a window, and the first placement is right past it (see [`Window::passed`]).
    placed: bool,
    fresh: Vec<usize>,
}

fn get(b: &[u64], i: usize) -> bool {
    b[i / 64] >> (i % 64) & 1 == 1
}
fn set(b: &mut [u64], i: usize) {
    b[i / 64] |= 1 << (i % 64);
}

impl Window {
    pub fn new(base: usize, len: usize, policy: Policy) -> Window {
        let pages = len / PAGE_SIZE;
        let words = pages.div_ceil(64);
        let head = ((base.next_multiple_of(UNIT * PAGE_SIZE) - base) / PAGE_SIZE).min(pages);
        let mode = match policy.order {
            Order::Auto => Mode::Learning,
            Order::Ascending => Mode::Asc,
            Order::Descending => Mode::Desc,
            Order::Stride => Mode::Stride(1),
            Order::Whole => Mode::Whole,
        };
        let mut w = Window {
            pages,
            head,
            policy,
            mode,
            thp: policy.thp == Thp::On,
            populate_read: policy.populate == Populate::Read,
            ours: vec![0; words],
            seen: vec![0; words],
            table: Vec::with_capacity(policy.entries as usize),
            next: 0,
            app: None,
            unused_pages: 0,
            stranded_pages: 0,
            idle_passes: 0,
            limit: RAMP_START.min(policy.entries as usize),
            placed: false,
            fresh: Vec::new(),
        };
        w.next = if mode == Mode::Desc { pages } else { 0 };
        w
    }

    /// The page range a pass must scan: the window, the application's position and
    /// `LOOKAHEAD` past the frontier; the whole region while learning or in whole mode.
    pub fn scan_range(&self) -> (usize, usize) {
        match self.mode {
            Mode::Learning | Mode::Whole => (0, self.pages),
            Mode::Asc | Mode::Stride(_) => {
                let lo = self
                    .table
                    .iter()
                    .map(|e| e.first as usize)
                    .chain(self.app)
                    .min()
                    .unwrap_or(self.next)
                    .min(self.next);
                let hi = self.next.max(self.app.unwrap_or(0) + 1) + LOOKAHEAD;
                (lo, hi.min(self.pages))
            }
            Mode::Desc => {
                let hi = self
                    .table
                    .iter()
                    .map(|e| e.last() + 1)
                    .chain(self.app.map(|a| a + 1))
                    .max()
                    .unwrap_or(self.next)
                    .max(self.next);
                let lo = self
                    .next
                    .min(self.app.unwrap_or(self.pages))
                    .saturating_sub(LOOKAHEAD);
                (lo, hi.min(self.pages))
            }
        }
    }

    /// Takes a scan's present runs (region page indices, absolute) and updates the table:
    /// footprint, tripwire hits, the learned order, the application's position.
    pub fn sense(&mut self, runs: &[crate::os::Run], span: (usize, usize)) -> Sensed {
        let mut s = Sensed::default();
        self.fresh.clear();
        let mut huge_ours = false;
        let (mut zero_fp, mut written_fp) = (0usize, 0usize);
        for r in runs {
            if r.huge && self.policy.thp != Thp::Off && !self.thp {
                // The kernel gives this region huge pages (the application's own faults or
                // ours): tripwires inside units cannot work, follow units.
                let lo = r.first + span.0;
                if (lo..lo + r.pages).any(|p| p < self.pages && !get(&self.ours, p)) {
                    self.thp = true;
                } else {
                    huge_ours = true;
                }
            }
            let lo = (r.first + span.0).min(self.pages);
            let hi = (lo + r.pages).min(self.pages);
            for p in lo..hi {
                if get(&self.ours, p) {
                    huge_ours |= r.huge;
                    continue;
                }
                if get(&self.seen, p) {
                    continue;
                }
                set(&mut self.seen, p);
                s.footprint += 1;
                if r.zero {
                    zero_fp += 1;
                } else {
                    written_fp += 1;
                }
                if self.fresh.len() < 8192 {
                    self.fresh.push(p);
                }
            }
        }
        // Reads first or writes first: what the application's own faults mapped (3 to 1).
        if self.policy.populate == Populate::Auto && zero_fp + written_fp >= 3 {
            if zero_fp >= 3 * written_fp {
                self.populate_read = true;
            } else if written_fp >= 3 * zero_fp {
                self.populate_read = false;
            }
        }
        if huge_ours && !self.thp && self.policy.thp != Thp::Off {
            // The kernel mapped huge pages where we populated 4 KiB chunks: the VMA is
            // THP-eligible, so tripwires inside units cannot work. Switch to unit mode.
            self.enter_thp();
        }
        // Tripwire hits.
        let seen = &self.seen;
        let mut hit_pos: Option<(usize, usize)> = None; // (min, max) of hit tripwires
        let mut kept = Vec::with_capacity(self.table.len());
        for e in self.table.drain(..) {
            if e.trip != NONE && get(seen, e.trip as usize) {
                s.hits += 1;
                self.unused_pages -= e.pages as usize - 1;
                if self.mode == Mode::Whole {
                    // In no order, a hit says one page of the chunk was touched, nothing of the
                    // others: they stay counted against the budget (the bound holds; random
                    // access gets at most a budget's worth populated ahead).
                    self.stranded_pages += e.pages as usize - 1;
                }
                let t = e.trip as usize;
                hit_pos = Some(hit_pos.map_or((t, t), |(a, b)| (a.min(t), b.max(t))));
            } else {
                kept.push(e);
            }
        }
        self.table = kept;
        // Footprint beyond the tripwires: learn from it.
        let trips: Vec<usize> = self.fresh.clone();
        let fp: Vec<usize> = trips
            .into_iter()
            .filter(|&p| !self.is_tripwire_like(p))
            .collect();
        self.learn(&fp, hit_pos);
        // The application's position: the furthest page in the direction of travel.
        let ends = fp
            .iter()
            .copied()
            .chain(hit_pos.map(|h| h.0))
            .chain(hit_pos.map(|h| h.1));
        let pos = match self.mode {
            Mode::Desc => ends.min(),
            _ => ends.max(),
        };
        let mut overtaken = false;
        if let Some(p) = pos {
            self.app = Some(p);
            overtaken = self.passed(p, &mut s);
        }
        if s.hits > 0 || overtaken {
            self.grow();
        }
        // Idle unless a tripwire was hit or the order is still being learned: footprint alone
        // (the application faulting where the service cannot help, e.g. a random pattern once
        // the budget is spent) does not keep the region sensed at the shortest interval. The
        // service resets this when a pass populates something.
        if s.hits == 0 && (s.footprint == 0 || self.mode != Mode::Learning) {
            self.idle_passes = self.idle_passes.saturating_add(1);
        } else {
            self.idle_passes = 0;
        }
        s
    }

    /// Tripwire pages the service left on purpose are expected footprint, not evidence of
    /// order: in 4 KiB mode a chunk's first (ascending) or last (descending) page.
    fn is_tripwire_like(&self, p: usize) -> bool {
        // Pages just before or after one of our populated runs, at a chunk boundary.
        let c = self.policy.chunk as usize;
        if self.thp || c < 2 {
            return false;
        }
        let after = p + 1 < self.pages && get(&self.ours, p + 1);
        let before = p > 0 && get(&self.ours, p - 1);
        match self.mode {
            Mode::Asc | Mode::Whole => after,
            Mode::Desc => before,
            Mode::Stride(s) => p + s < self.pages && get(&self.ours, p + s),
            Mode::Learning => false,
        }
    }

    /// Learns the order from footprint pages (sorted ascending) when the policy is Auto (or
    /// Stride with the stride unknown).
    fn learn(&mut self, fp: &[usize], hits: Option<(usize, usize)>) {
        let auto = self.policy.order == Order::Auto;
        let stride_unknown = self.policy.order == Order::Stride;
        if (!auto && !stride_unknown) || fp.len() < 3 {
            return;
        }
        let mut fp = fp.to_vec();
        fp.sort_unstable();
        if self.thp {
            let head = self.head;
            fp.dedup_by_key(|p| if *p < head { 0 } else { 1 + (*p - head) / UNIT });
            if fp.len() < 2 {
                // One unit: the region's first (or last) unit says the direction.
                if auto && fp[0] < self.head.max(UNIT) {
                    self.switch(Mode::Asc, fp[0], fp[0]);
                } else if auto && fp[0] + UNIT >= self.pages {
                    self.switch(Mode::Desc, fp[0], fp[0]);
                }
                return;
            }
        }
        let diffs: Vec<usize> = fp.windows(2).map(|w| w[1] - w[0]).collect();
        // The dominant gap: a footprint is regular when at least 3/4 of its gaps are equal
        // (a pass may see the end of one run and the start of the next, or a straggler).
        let mut sorted = diffs.clone();
        sorted.sort_unstable();
        let (mut d0, mut best, mut i) = (sorted[0], 0, 0);
        while i < sorted.len() {
            let j = sorted[i..].iter().take_while(|&&d| d == sorted[i]).count();
            if j > best {
                (d0, best) = (sorted[i], j);
            }
            i += j;
        }
        let regular = best * 4 >= diffs.len() * 3;
        let prev = self.app.or(hits.map(|h| h.1));
        let lo = fp[0];
        let hi = *fp.last().unwrap();
        let descending = match prev {
            Some(a) => hi < a,
            None => hi + 1 == self.pages && lo > 0,
        };
        let unit_step = if self.thp { UNIT } else { 1 };
        let new = if regular && d0 <= unit_step {
            if descending {
                Mode::Desc
            } else {
                Mode::Asc
            }
        } else if regular && !self.thp && !descending {
            Mode::Stride(d0)
        } else if regular && !self.thp && descending {
            // A descending stride: fill descending, densely (bounded by the budget).
            Mode::Desc
        } else if !auto {
            return;
        } else {
            // Irregular: but a footprint that is increasing with small gaps is still
            // ascending (a page skipped here and there); random otherwise.
            let span = hi - lo + 1;
            if span <= fp.len() * 2 && !descending {
                Mode::Asc
            } else if span <= fp.len() * 2 {
                Mode::Desc
            } else {
                Mode::Whole
            }
        };
        if stride_unknown {
            if let Mode::Stride(_) = new {
            } else {
                return;
            }
        }
        if new != self.mode {
            self.switch(new, hi, lo);
        }
    }

    fn switch(&mut self, new: Mode, hi: usize, lo: usize) {
        // Entries planned for the old order: whatever they hold stays counted as unused.
        for e in std::mem::take(&mut self.table) {
            let populated = e.pages as usize - usize::from(e.trip != NONE);
            self.unused_pages -= populated;
            self.stranded_pages += populated;
        }
        self.mode = new;
        // Right past the application's position. (Only an application that overtakes a window
        // the service already filled makes the frontier jump 2 MiB: that one is faulting as
        // fast as it can, and the service must not fight it for its page table. At the first
        // placement the application is usually computing between touches, and every page
        // skipped is a fault it takes: `examples/touch`, 64 MiB at a 5 µs gap, faulted ~500
        // fewer pages of 16,384.)
        self.next = match new {
            Mode::Desc => lo,
            Mode::Whole => 0,
            Mode::Stride(st) => hi + st,
            _ => hi + 1,
        };
    }

    fn enter_thp(&mut self) {
        self.thp = true;
        // Existing 4 KiB entries: their units are populated whole now (our pages plus the
        // tripwire, which the kernel's huge page covers). Count the units as ours.
        for e in std::mem::take(&mut self.table) {
            let populated = e.pages as usize - usize::from(e.trip != NONE);
            self.unused_pages -= populated;
            self.stranded_pages += populated;
            let (u0, u1) = (self.unit_of(e.first as usize), self.unit_of(e.last()));
            for u in u0..=u1 {
                let (a, b) = self.unit_range(u);
                for p in a..b {
                    if !get(&self.ours, p) && !get(&self.seen, p) {
                        set(&mut self.ours, p);
                        self.stranded_pages += 1;
                    }
                }
            }
        }
    }

    fn unit_of(&self, p: usize) -> usize {
        if p < self.head {
            0
        } else {
            1 + (p - self.head) / UNIT
        }
    }
    fn unit_range(&self, u: usize) -> (usize, usize) {
        if u == 0 {
            (0, self.head)
        } else {
            let a = self.head + (u - 1) * UNIT;
            (a.min(self.pages), (a + UNIT).min(self.pages))
        }
    }

    /// The application is at `p`: entries it passed are used (huge-page mode, 1-page chunks) or
    /// stranded (a tripwire it skipped); if it overtook the frontier, jump at least 2 MiB
    /// ahead of it, into another page table.
    /// Returns whether the application overtook the frontier.
    fn passed(&mut self, p: usize, s: &mut Sensed) -> bool {
        let desc = self.mode == Mode::Desc;
        let mut kept = Vec::with_capacity(self.table.len());
        let mut passed_any = false;
        for e in self.table.drain(..) {
            let behind = if desc {
                e.first as usize > p
            } else {
                e.last() < p
            };
            if !behind {
                kept.push(e);
                continue;
            }
            passed_any = true;
            let populated = e.pages as usize - usize::from(e.trip != NONE);
            self.unused_pages -= populated;
            if e.trip != NONE && !get(&self.seen, e.trip as usize) {
                self.stranded_pages += populated;
            }
        }
        self.table = kept;
        if passed_any && self.thp {
            s.hits += 1;
        }
        let overtaken = match self.mode {
            Mode::Asc | Mode::Stride(_) => p >= self.next,
            Mode::Desc => p < self.next,
            _ => false,
        };
        if overtaken && !self.placed && !self.thp {
            // The first placement (an explicit order sees the application before anything was
            // populated): right past it, as `switch` places a learned order. Jumping 2 MiB
            // here put vips's `[heap]` window (ascending, from the library) past the end of
            // what the heap ever used: 960 pages zeroed, none touched.
            self.next = match self.mode {
                Mode::Desc => p,
                Mode::Stride(st) => p + st,
                _ => p + 1,
            };
            return false;
        }
        // A region too small to jump in (an allocator's 1 MiB arena, say) is filled right
        // behind the application instead: sharing its page table beats not filling at all.
        if overtaken {
            self.next = if desc && !self.thp && p <= JUMP {
                p
            } else if desc {
                // ≥ 2 MiB below, at a unit boundary (huge-page mode: the unit below).
                let t = if self.thp { p } else { p.saturating_sub(JUMP) };
                if t < self.head {
                    0
                } else {
                    self.head + (t - self.head) / UNIT * UNIT
                }
            } else if !self.thp && p + JUMP >= self.pages {
                match self.mode {
                    Mode::Stride(st) => p + st,
                    _ => p + 1,
                }
            } else {
                let t = if self.thp { p + 1 } else { p + JUMP };
                let n = if t <= self.head {
                    self.head
                } else {
                    self.head + (t - self.head).div_ceil(UNIT) * UNIT
                };
                match self.mode {
                    // Keep the stride's phase: the next page the application touches.
                    Mode::Stride(st) => p + (n - p).div_ceil(st) * st,
                    _ => n,
                }
            };
        }
        overtaken
    }

    /// The application used the window: it may hold twice as many entries.
    fn grow(&mut self) {
        self.limit = (self.limit * 2).min(self.policy.entries as usize);
    }

    /// The next populate call, if the table has room and `budget_pages` allow one; the entry
    /// is recorded as if the call succeeded (see [`Window::undo`]).
    pub fn plan(&mut self, budget_pages: usize) -> Option<(Call, Vec<usize>)> {
        if self.table.len() >= self.limit || self.mode == Mode::Learning {
            return None;
        }
        let c = self.policy.chunk as usize;
        loop {
            let (first, pages, step, trip) = match self.mode {
                Mode::Learning => return None,
                Mode::Asc | Mode::Whole if self.thp => {
                    if self.next >= self.pages {
                        return None;
                    }
                    let u = self.unit_of(self.next);
                    let (a, b) = self.unit_range(u);
                    let a = a.max(self.next);
                    // Leave the unit past the window as the tripwire: the last entry's unit
                    // is followed by one we do not fill.
                    if self.table.len() + 1 >= self.limit && self.mode == Mode::Asc {
                        return None;
                    }
                    (a, b - a, 1, NONE)
                }
                Mode::Desc if self.thp => {
                    if self.next == 0 {
                        return None;
                    }
                    let u = self.unit_of(self.next - 1);
                    let (a, b) = self.unit_range(u);
                    let b = b.min(self.next);
                    if self.table.len() + 1 >= self.limit {
                        return None;
                    }
                    (a, b - a, 1, NONE)
                }
                Mode::Asc | Mode::Whole => {
                    if self.next >= self.pages {
                        return None;
                    }
                    let n = c.min(self.pages - self.next);
                    let trip = if n >= 2 { self.next as u32 } else { NONE };
                    (self.next, n, 1, trip)
                }
                Mode::Desc => {
                    if self.next == 0 {
                        return None;
                    }
                    let n = c.min(self.next);
                    let first = self.next - n;
                    let trip = if n >= 2 { (self.next - 1) as u32 } else { NONE };
                    (first, n, 1, trip)
                }
                Mode::Stride(st) => {
                    if self.next >= self.pages {
                        return None;
                    }
                    let n = c.min((self.pages - self.next).div_ceil(st));
                    let trip = if n >= 2 { self.next as u32 } else { NONE };
                    (self.next, n, st, trip)
                }
            };
            let e = Entry {
                first: first as u64,
                pages: pages as u16,
                step: step as u16,
                trip,
            };
            // Advance the frontier past this chunk.
            match self.mode {
                Mode::Desc => self.next = first,
                _ => self.next = e.last() + step,
            }
            // Pages to populate: the chunk but its tripwire and pages already present.
            let mut list = Vec::with_capacity(pages);
            for i in 0..pages {
                let p = first + i * step;
                if p as u32 == trip || get(&self.ours, p) || get(&self.seen, p) {
                    continue;
                }
                list.push(p);
            }
            if list.is_empty() {
                continue; // everything there already: look further
            }
            if list.len() > budget_pages {
                // Undo the frontier move: not now.
                self.next = match self.mode {
                    Mode::Desc => first + pages,
                    _ => first,
                };
                return None;
            }
            for &p in &list {
                set(&mut self.ours, p);
            }
            self.unused_pages += list.len();
            let e = Entry {
                pages: (list.len() + usize::from(trip != NONE)) as u16,
                ..e
            };
            // Keep `pages` meaning "populated + tripwire" for the accounting in `sense`.
            let e = if step == 1 && trip == NONE {
                Entry {
                    pages: list.len() as u16,
                    first: list[0] as u64,
                    ..e
                }
            } else {
                e
            };
            self.table.push(e);
            self.placed = true;
            let call = Call {
                first: list[0],
                pages: list.len(),
            };
            return Some((call, list));
        }
    }

    /// A planned call failed: forget its pages and entry.
    pub fn undo(&mut self, list: &[usize]) {
        for &p in list {
            self.ours[p / 64] &= !(1 << (p % 64));
        }
        self.unused_pages -= list.len();
        self.table.pop();
    }

    /// Moves the frontier to a hinted page.
    pub fn hint(&mut self, page: usize) {
        let page = page.min(self.pages);
        if self.mode == Mode::Learning {
            self.mode = Mode::Asc;
        }
        self.next = page;
    }

    /// Whether more can be planned now.
    pub fn wants_more(&self) -> bool {
        self.mode != Mode::Learning && self.table.len() < self.limit
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::os::Run;

    fn run(first: usize, pages: usize) -> Run {
        Run {
            first,
            pages,
            huge: false,
            zero: false,
        }
    }

    fn window(order: Order, pages: usize) -> Window {
        let p = Policy {
            order,
            thp: Thp::Off,
            ..Policy::default()
        };
        // A 2 MiB-aligned base.
        Window::new(1 << 30, pages * PAGE_SIZE, p)
    }

    /// A window whose table already ramped to all its entries.
    fn ramped(order: Order, pages: usize) -> Window {
        let mut w = window(order, pages);
        w.limit = w.policy.entries as usize;
        w
    }

    #[test]
    fn ascending_leaves_the_first_page_of_each_chunk_and_refills_on_hits() {
        let mut w = ramped(Order::Ascending, 4096);
        let mut calls = Vec::new();
        while let Some((c, _)) = w.plan(usize::MAX) {
            calls.push(c);
        }
        assert_eq!(calls.len(), 64);
        assert_eq!(
            calls[0],
            Call {
                first: 1,
                pages: 15
            }
        );
        assert_eq!(
            calls[1],
            Call {
                first: 17,
                pages: 15
            }
        );
        assert_eq!(w.unused_pages, 64 * 15);
        // The application touches the tripwires of the first three chunks.
        let s = w.sense(&[run(0, 16), run(16, 16), run(32, 16)], (0, 4096));
        assert_eq!(s.hits, 3);
        assert_eq!(w.unused_pages, 61 * 15);
        assert_eq!(w.table.len(), 61);
        let (c, _) = w.plan(usize::MAX).unwrap();
        assert_eq!(c.first, 64 * 16 + 1);
    }

    #[test]
    fn a_learned_window_starts_small_and_doubles_while_used() {
        let mut w = window(Order::Auto, 8192);
        w.sense(&[run(0, 10)], (0, 8192));
        assert_eq!(w.mode, Mode::Asc);
        let mut calls = Vec::new();
        while let Some((c, _)) = w.plan(usize::MAX) {
            calls.push(c);
        }
        assert_eq!(calls.len(), RAMP_START, "{calls:?}");
        // Left alone: no pass adds anything.
        w.sense(&[run(0, 10)], (0, 8192));
        assert!(w.plan(usize::MAX).is_none());
        // The application hits the first tripwire: room for twice as many entries.
        let trip = calls[0].first - 1;
        w.sense(&[run(0, 10), run(trip, 1)], (0, 8192));
        let mut n = 0;
        while w.plan(usize::MAX).is_some() {
            n += 1;
        }
        assert_eq!(w.table.len(), 2 * RAMP_START, "{n} new calls");
        // An explicit order ramps too.
        let mut w = window(Order::Ascending, 8192);
        let mut n = 0;
        while w.plan(usize::MAX).is_some() {
            n += 1;
        }
        assert_eq!(n, RAMP_START);
    }

    #[test]
    fn an_explicit_order_is_first_placed_right_past_the_application() {
        // The preload library registers a heap growth ascending after the application faulted
        // its first pages: the window starts right past them, not 2 MiB on.
        let mut w = window(Order::Ascending, 8192);
        w.sense(&[run(0, 22), run(29, 10)], (0, 8192));
        let (c, _) = w.plan(usize::MAX).unwrap();
        assert_eq!(c.first, 40, "first call {c:?}");
        // Once a window is placed, overtaking it jumps at least 2 MiB ahead.
        while w.plan(usize::MAX).is_some() {}
        let far = w.next + 100;
        w.sense(&[run(0, 22), run(29, 10), run(far, 1)], (0, 8192));
        let (c, _) = w.plan(usize::MAX).unwrap();
        assert!(c.first >= far + JUMP, "{c:?} after a touch at {far}");
        let mut w = window(Order::Descending, 8192);
        w.sense(&[run(8000, 10)], (0, 8192));
        let (c, _) = w.plan(usize::MAX).unwrap();
        // Its first chunk ends right below the application, at the chunk's tripwire.
        assert_eq!(c.first + c.pages, 7999, "first call {c:?}");
    }

    #[test]
    fn budget_stops_the_plan() {
        let mut w = ramped(Order::Ascending, 4096);
        let mut n = 0;
        let mut budget = 100;
        while let Some((c, _)) = w.plan(budget) {
            budget -= c.pages;
            n += 1;
        }
        assert_eq!(n, 6);
        assert_eq!(w.unused_pages, 90);
    }

    #[test]
    fn learns_ascending_descending_and_stride_from_the_footprint() {
        let mut w = window(Order::Auto, 4096);
        assert!(w.plan(usize::MAX).is_none(), "nothing before evidence");
        w.sense(&[run(0, 10)], (0, 4096));
        assert_eq!(w.mode, Mode::Asc);
        // First placement: right past the application (its tripwire at page 10).
        let (c, _) = w.plan(usize::MAX).unwrap();
        assert_eq!(c.first, 11, "{c:?}");
        // Overtaken later: the frontier jumps ≥ 2 MiB past the application.
        while w.plan(usize::MAX).is_some() {}
        w.sense(&[run(0, 10), run(10, 64 * 16 + 40)], (0, 4096));
        let (c, _) = w.plan(usize::MAX).unwrap();
        assert!(
            c.first >= 10 + 64 * 16 + 40 + UNIT && c.first % UNIT <= 1,
            "{c:?}"
        );

        let mut w = window(Order::Auto, 4096);
        w.sense(&[run(4090, 6)], (0, 4096));
        assert_eq!(w.mode, Mode::Desc);
        let (c, _) = w.plan(usize::MAX).unwrap();
        assert_eq!(c.first + c.pages, 4089, "{c:?}");

        let mut w = window(Order::Auto, 4096);
        w.sense(&[run(0, 1), run(4, 1), run(8, 1), run(12, 1)], (0, 4096));
        assert_eq!(w.mode, Mode::Stride(4));
        let (_, list) = w.plan(usize::MAX).unwrap();
        assert!(list.windows(2).all(|p| p[1] - p[0] == 4), "{list:?}");

        let mut w = window(Order::Auto, 4096);
        w.sense(
            &[run(7, 1), run(900, 1), run(3000, 1), run(1500, 1)],
            (0, 4096),
        );
        assert_eq!(w.mode, Mode::Whole);
    }

    #[test]
    fn a_small_region_is_filled_right_behind_the_application() {
        let mut w = window(Order::Auto, 256);
        w.sense(&[run(0, 6)], (0, 256));
        assert_eq!(w.mode, Mode::Asc);
        let (c, _) = w.plan(usize::MAX).unwrap();
        assert_eq!(c.first, 7, "{c:?}");
        let mut w = window(Order::Auto, 256);
        w.sense(&[run(250, 6)], (0, 256));
        assert_eq!(w.mode, Mode::Desc);
        let (c, _) = w.plan(usize::MAX).unwrap();
        assert_eq!(c.first + c.pages, 249, "{c:?}");
    }

    #[test]
    fn skipped_chunks_stay_counted() {
        let mut w = window(Order::Ascending, 4096);
        for _ in 0..4 {
            w.plan(usize::MAX).unwrap();
        }
        // The application jumps past the four chunks without touching their tripwires.
        w.sense(&[run(2000, 1), run(2001, 1), run(2002, 1)], (0, 4096));
        assert_eq!(w.table.len(), 0);
        assert_eq!(w.stranded_pages, 60);
        assert_eq!(w.unused_pages, 0);
    }
}

#[cfg(test)]
mod sim {
    use super::*;
    use crate::os::Run;

    /// Simulates an application touching `order` one page per step, the service passing every
    /// `every` touches: returns the fraction of touches that found their page populated.
    pub(crate) fn simulate(order: &[usize], pages: usize, every: usize, policy: Policy) -> f64 {
        let mut w = Window::new(1 << 30, pages * PAGE_SIZE, policy);
        let mut present = vec![false; pages];
        let mut fast = 0;
        for (n, &p) in order.iter().enumerate() {
            if present[p] {
                fast += 1;
            }
            present[p] = true;
            if n % every == every - 1 {
                let mut runs: Vec<Run> = Vec::new();
                for (i, &b) in present.iter().enumerate() {
                    if b {
                        match runs.last_mut() {
                            Some(l) if l.first + l.pages == i => l.pages += 1,
                            _ => runs.push(Run {
                                first: i,
                                pages: 1,
                                huge: false,
                                zero: false,
                            }),
                        }
                    }
                }
                w.sense(&runs, (0, pages));
                while let Some((_, list)) = w.plan(usize::MAX) {
                    for q in list {
                        present[q] = true;
                    }
                }
            }
        }
        fast as f64 / order.len() as f64
    }

    fn pol(order: Order) -> Policy {
        Policy {
            order,
            thp: Thp::Off,
            ..Policy::default()
        }
    }

    #[test]
    fn most_touches_find_their_page_in_every_sequential_pattern() {
        let n = 16384;
        let asc: Vec<usize> = (0..n).collect();
        let desc: Vec<usize> = (0..n).rev().collect();
        let stride: Vec<usize> = (0..n).step_by(4).collect();
        for (name, o) in [("asc", &asc), ("desc", &desc), ("stride", &stride)] {
            let f = simulate(o, n, 64, pol(Order::Auto));
            assert!(f > 0.8, "{name}: {f}");
        }
    }
}
