//! Redis data structures stored in a [`Heap`], addressed by offsets.
//!
//! Everything lives in the heap: after a restart of a durable engine the whole keyspace is
//! found again from [`Heap::root`]. Readers read the committed view ([`View`]); a write command
//! reads and writes through one [`Wtx`] (a transaction that sees its own writes). Both are
//! [`Mem`], so lookups are written once, generic over where they read.
//!
//! ## Layout (all words little-endian; see each module for its objects)
//!
//! The root object ([`ROOT_SIZE`] bytes):
//!
//! ```text
//! 0    magic "tmkvroot"         8    layout version (2)
//! 16   hash seed (random at creation; part of the layout: entries store their hash)
//! 24   garbage list head        32   garbage records on the list
//! 40   used bytes: heap blocks (headers included) allocated by this layer, root included
//! 48   seed check: a function of the hash seed, never 0 (0: a heap made before it existed)
//! 56   the database directory (see [`Store`]; 0 in heaps made before databases existed)
//! 64   database 0's keyspace dict header (DICT_HDR bytes, see `dict`)
//! ```
//!
//! * [`dict`]: linear hashing (incremental growth one bucket split per insert, no second table,
//!   segments never zeroed), used for the keyspace and large sets, hashes and zsets;
//! * [`keyspace`]: keyspace entries (key, type, and a string value inline or a value object);
//! * [`list`]: quicklist-like lists (doubly linked nodes of ~4 KiB of packed elements);
//! * [`pack`]: compact "listpack" blobs for small sets and hashes;
//! * [`set`], [`hash`]: sets and hashes (pack, converted to a dict above a size);
//! * [`zset`]: sorted sets (dict member → node + skiplist of the same nodes);
//! * [`garbage`]: the garbage list: big values and old keyspaces unlinked in O(1) and freed in
//!   bounded, crash-resumable batches.

pub mod dict;
pub mod expire;
pub mod garbage;
pub mod hash;
pub mod keyspace;
pub mod list;
pub mod pack;
pub mod set;
pub mod zset;

use crate::heap::{Heap, HeapError, Off, Result, Tx};
use std::borrow::Cow;
use tiermem_vnvm::alloc::{BLOCK_HEADER, HEAP_HEADER, LARGE_UNIT, MAX_SMALL};

/// Magic of the root object ("tmkvroot").
pub const ROOT_MAGIC: u64 = u64::from_le_bytes(*b"tmkvroot");
/// Version of the layout described in this module.
///
/// Version 2: sorted-set links carry their skiplist spans (16 bytes a link, where version 1's
/// were 8). A version-1 heap is refused, unchanged: export it with the build that wrote it.
pub const ROOT_VERSION: u64 = 2;
/// Bytes of the root object.
pub const ROOT_SIZE: u64 = 64 + dict::DICT_HDR;

const R_MAGIC: u64 = 0;
const R_VERSION: u64 = 8;
const R_SEED: u64 = 16;
pub(crate) const R_GARBAGE: u64 = 24;
pub(crate) const R_GCOUNT: u64 = 32;
const R_USED: u64 = 40;
const R_SEED_CHECK: u64 = 48;
const R_KEYSPACE: u64 = 64;

/// Something the data structures can read: the committed view, or a transaction that sees its
/// own writes.
///
/// ## Damaged heaps
///
/// Reads never panic, whatever offsets the heap holds: a read outside the heap's objects
/// (below [`HEAP_HEADER`] or past its end) records the offset with [`damaged`] and returns
/// zeros (an all-zero word is the null link, so walks end), and the structures check the
/// lengths, counts and links they read ([`Mem::link`], [`walk_bound`]) the same way. The
/// command layer clears the record before each command ([`take_damage`]) and, when one was
/// made, replaces the command's whole reply by an error and refuses to commit its writes
/// ([`Wtx::commit`] fails with [`HeapError::Damaged`]). Each check is O(1) per access.
pub trait Mem {
    /// The `len` bytes at `off` (borrowed where possible). Outside the heap: zeros (at most
    /// [`ZEROS`] bytes of them; fewer than `len` when `len` is larger) and the offset is
    /// recorded as damaged.
    fn bytes(&self, off: Off, len: usize) -> Cow<'_, [u8]>;

    /// Bytes of the heap (every valid object lies below).
    fn heap_len(&self) -> u64;

    /// The little-endian word at `off` (0 and recorded as damaged outside the heap).
    #[inline]
    fn u64(&self, off: Off) -> u64 {
        let b = self.bytes(off, 8);
        b.get(..8)
            .and_then(|b| b.try_into().ok())
            .map_or(0, u64::from_le_bytes)
    }

    /// The little-endian half-word at `off` (0 and recorded as damaged outside the heap).
    #[inline]
    fn u32(&self, off: Off) -> u32 {
        let b = self.bytes(off, 4);
        b.get(..4)
            .and_then(|b| b.try_into().ok())
            .map_or(0, u32::from_le_bytes)
    }

    /// The link word at `off`: an object offset or 0. A value that cannot be an object's
    /// offset (inside the allocator's header, past the heap, not 8-aligned) is recorded as
    /// damage at `off` and read as 0, which ends any walk.
    #[inline]
    fn link(&self, off: Off) -> Off {
        let v = self.u64(off);
        if v != 0 && (v < HEAP_HEADER || v >= self.heap_len() || v % 8 != 0) {
            damaged(off);
            return 0;
        }
        v
    }
}

/// Zeros served for reads outside the heap.
pub static ZEROS: [u8; 65536] = [0; 65536];

#[inline]
fn outside(off: Off, len: usize) -> Cow<'static, [u8]> {
    damaged(off);
    Cow::Borrowed(&ZEROS[..len.min(ZEROS.len())])
}

thread_local! {
    /// The first damaged offset this thread met since [`take_damage`] (`u64::MAX`: none).
    static DAMAGE: std::cell::Cell<u64> = const { std::cell::Cell::new(u64::MAX) };
}

/// Record that the heap is damaged at `off` (the first offset is kept until
/// [`take_damage`]). Called by readers that find an offset, length, count or link that
/// cannot be right; they then return zeros / stop, and the command layer turns the command
/// into an error reply.
#[cold]
pub fn damaged(off: Off) {
    DAMAGE.with(|d| {
        if d.get() == u64::MAX {
            d.set(off.min(u64::MAX - 1));
        }
    });
}

/// The damage this thread recorded since the last call (and clear it).
pub fn take_damage() -> Option<Off> {
    DAMAGE.with(|d| {
        let v = d.replace(u64::MAX);
        (v != u64::MAX).then_some(v)
    })
}

/// Whether this thread recorded damage since the last [`take_damage`] (not clearing it).
#[inline]
pub fn has_damage() -> bool {
    DAMAGE.with(|d| d.get() != u64::MAX)
}

/// `Err(HeapError::Damaged)` if this thread recorded damage since the last [`take_damage`]
/// (the record stays): writers call it after reads whose results they are about to use.
#[inline]
pub fn intact() -> Result<()> {
    DAMAGE.with(|d| match d.get() {
        u64::MAX => Ok(()),
        off => Err(HeapError::Damaged(off)),
    })
}

/// The most steps a walk of a chain (dict bucket, list nodes, skiplist level) of at most
/// `count` elements may take in `m`: `count` capped by what the heap can hold (16-byte
/// blocks at least). A walk that goes further is in a cycle or follows damaged links.
#[inline]
pub fn walk_bound<M: Mem + ?Sized>(m: &M, count: u64) -> u64 {
    count.min(m.heap_len() / 16)
}

/// The committed view of a heap (readers: hold the service lock shared).
#[derive(Clone, Copy)]
pub struct View<'a>(pub &'a [u8]);

impl View<'_> {
    /// The view of `heap` (the caller keeps commits away while it reads).
    pub fn of(heap: &Heap) -> View<'_> {
        View(heap.view())
    }
}

impl Mem for View<'_> {
    #[inline]
    fn bytes(&self, off: Off, len: usize) -> Cow<'_, [u8]> {
        let o = off as usize;
        match self.0.get(o..o.wrapping_add(len)) {
            Some(b) if off >= HEAP_HEADER => Cow::Borrowed(b),
            _ => outside(off, len),
        }
    }
    #[inline]
    fn heap_len(&self) -> u64 {
        self.0.len() as u64
    }
    #[inline]
    fn u64(&self, off: Off) -> u64 {
        let o = off as usize;
        match self.0.get(o..o.wrapping_add(8)) {
            // (`get` gave exactly 8 bytes: the conversion cannot fail.)
            Some(b) if off >= HEAP_HEADER => u64::from_le_bytes(b.try_into().unwrap_or([0; 8])),
            _ => {
                damaged(off);
                0
            }
        }
    }
    #[inline]
    fn u32(&self, off: Off) -> u32 {
        let o = off as usize;
        match self.0.get(o..o.wrapping_add(4)) {
            Some(b) if off >= HEAP_HEADER => u32::from_le_bytes(b.try_into().unwrap_or([0; 4])),
            _ => {
                damaged(off);
                0
            }
        }
    }
}

/// Heap bytes a block of `size` requested bytes takes (header included), as the allocator
/// sizes it: small classes are powers of two from 16 B to 64 KiB, larger requests whole 4 KiB
/// units. (A large block may come back bigger; [`Wtx`] asks the allocator then.)
pub fn block_bytes(size: u64) -> u64 {
    usable(size) + BLOCK_HEADER
}

/// Usable bytes of a block of `size` requested bytes (small classes; large ones approximate).
pub fn usable(size: u64) -> u64 {
    if size <= 16 {
        16
    } else if size <= MAX_SMALL {
        size.next_power_of_two()
    } else {
        (size + BLOCK_HEADER).div_ceil(LARGE_UNIT) * LARGE_UNIT - BLOCK_HEADER
    }
}

/// Size class index (0 = 16 B) of a small block of usable size `cap`; [`CLASS_LARGE`] above.
pub fn class_of(cap: u64) -> u8 {
    if cap > MAX_SMALL {
        CLASS_LARGE
    } else {
        (usable(cap).trailing_zeros() - 4) as u8
    }
}

/// Class byte of a large block (its size is asked from the allocator).
pub const CLASS_LARGE: u8 = 0xff;

/// Usable size of class `c` (`None` for [`CLASS_LARGE`]).
pub fn class_size(c: u8) -> Option<u64> {
    (c != CLASS_LARGE).then(|| 16u64 << c)
}

/// A write command's transaction over the heap: [`Tx`] begun lazily at the first write (so a
/// command that changes nothing costs no transaction), with the root's used-bytes counter kept
/// in step with every allocation and free (written once, at commit).
pub struct Wtx<'h> {
    heap: &'h Heap,
    tx: Option<Tx<'h>>,
    root: Off,
    used_delta: i64,
    garbage_delta: i64,
}

impl<'h> Wtx<'h> {
    /// A transaction on `heap` whose root object is `root`.
    pub fn new(heap: &'h Heap, root: Off) -> Wtx<'h> {
        Wtx {
            heap,
            tx: None,
            root,
            used_delta: 0,
            garbage_delta: 0,
        }
    }

    /// The heap.
    pub fn heap(&self) -> &'h Heap {
        self.heap
    }

    /// The root object.
    pub fn root(&self) -> Off {
        self.root
    }

    fn tx(&mut self) -> &mut Tx<'h> {
        let heap = self.heap;
        self.tx.get_or_insert_with(|| heap.begin())
    }

    /// Whether the transaction wrote anything yet.
    pub fn dirty(&self) -> bool {
        self.tx.is_some()
    }

    /// Log bytes of data writes so far.
    pub fn logged_bytes(&self) -> u64 {
        self.tx.as_ref().map_or(0, |t| t.logged_bytes())
    }

    /// Write `bytes` at `off`.
    #[inline]
    pub fn write(&mut self, off: Off, bytes: &[u8]) -> Result<()> {
        self.tx().write(off, bytes)
    }

    /// Write the word `v` at `off`.
    #[inline]
    pub fn write_u64(&mut self, off: Off, v: u64) -> Result<()> {
        self.tx().write_u64(off, v)
    }

    /// Allocate at least `size` bytes; returns (offset, usable bytes). Contents undefined.
    pub fn alloc(&mut self, size: u64) -> Result<(Off, u64)> {
        let off = self.tx().alloc(size)?;
        let cap = if size > MAX_SMALL {
            self.tx().usable_size(off)?
        } else {
            usable(size)
        };
        self.used_delta += (cap + BLOCK_HEADER) as i64;
        Ok((off, cap))
    }

    /// Usable bytes of the block at `off` (asks the allocator).
    pub fn usable_size(&mut self, off: Off) -> Result<u64> {
        self.tx().usable_size(off)
    }

    /// Free the block at `off` whose usable size is `cap` (as returned by [`Wtx::alloc`];
    /// for large blocks the allocator is asked, `cap` may be anything above 64 KiB).
    pub fn free(&mut self, off: Off, cap: u64) -> Result<()> {
        let cap = if cap > MAX_SMALL {
            self.tx().usable_size(off)?
        } else {
            usable(cap)
        };
        self.tx().free(off)?;
        self.used_delta -= (cap + BLOCK_HEADER) as i64;
        Ok(())
    }

    /// Note that `n` garbage records were added (negative: removed) for the root's counter.
    pub(crate) fn garbage_records(&mut self, n: i64) {
        self.garbage_delta += n;
    }

    /// Write the root's counters and commit. Every write is visible (and durable on a durable
    /// engine) when this returns. A transaction that wrote nothing commits nothing.
    ///
    /// Errors: [`HeapError::Damaged`] (nothing committed) when this thread met a damaged heap
    /// since the command began (see [`Mem`]): a write must never build on damaged data.
    pub fn commit(self) -> Result<()> {
        let heap = self.heap;
        let t = self.commit_staged()?;
        heap.sync_to(t)
    }

    /// [`Wtx::commit`] without waiting for durability ([`crate::heap::Tx::commit_staged`]):
    /// the caller syncs before it replies.
    pub fn commit_staged(mut self) -> Result<u64> {
        self.flush_counters()?;
        if let Some(off) = take_damage() {
            damaged(off);
            self.abort();
            return Err(HeapError::Damaged(off));
        }
        match self.tx.take() {
            Some(tx) => tx.commit_staged(),
            None => Ok(0),
        }
    }

    fn flush_counters(&mut self) -> Result<()> {
        if self.used_delta != 0 {
            let v = self
                .u64(self.root + R_USED)
                .wrapping_add_signed(self.used_delta);
            self.write_u64(self.root + R_USED, v)?;
            self.used_delta = 0;
        }
        if self.garbage_delta != 0 {
            let v = self
                .u64(self.root + R_GCOUNT)
                .wrapping_add_signed(self.garbage_delta);
            self.write_u64(self.root + R_GCOUNT, v)?;
            self.garbage_delta = 0;
        }
        Ok(())
    }

    /// Abort: nothing written becomes visible.
    pub fn abort(mut self) {
        if let Some(tx) = self.tx.take() {
            tx.abort();
        }
    }
}

impl Mem for Wtx<'_> {
    #[inline]
    fn bytes(&self, off: Off, len: usize) -> Cow<'_, [u8]> {
        let view = self.heap.view();
        let o = off as usize;
        if off < HEAP_HEADER || view.get(o..o.wrapping_add(len)).is_none() {
            return outside(off, len);
        }
        match &self.tx {
            // (In bounds: checked above.)
            Some(tx) => tx.bytes(off, len),
            None => Cow::Borrowed(&view[o..o + len]),
        }
    }
    #[inline]
    fn heap_len(&self) -> u64 {
        self.heap.view().len() as u64
    }
}

/// Databases (SELECT 0 to `DATABASES - 1`), as Redis' default `databases 16`.
pub const DATABASES: usize = 16;

/// Magic of the database directory ("tmkvdbs1").
const DIR_MAGIC: u64 = u64::from_le_bytes(*b"tmkvdbs1");
/// Bytes of the database directory: magic, count, then per database its keyspace dict
/// header and its expires dict header (0: no deadline set yet).
const DIR_SIZE: u64 = 16 + 16 * DATABASES as u64;
/// Root word holding the database directory's offset.
const R_DIR: u64 = 56;

/// The data-structure layer's handle on one database of a heap: where the root is, the hash
/// seed, and where this database's keyspace and deadlines are.
///
/// Databases: the root's word 56 points to the directory (`DIR_SIZE` bytes: magic
/// "tmkvdbs1", 16, then per database the offsets of its keyspace dict header and of its
/// expires dict header, see `expire`). Database 0's keyspace header starts inside the root
/// object (its place before databases existed); the others are blocks of their own, made with
/// the directory. SWAPDB swaps two databases' entries.
#[derive(Clone, Copy, Debug)]
pub struct Store {
    /// The root object.
    pub root: Off,
    /// The hash seed of every dict of this heap.
    pub seed: u64,
    /// The database this handle reads and writes.
    pub db: usize,
    /// Its keyspace dict's header.
    ks: Off,
    /// The directory word holding its expires dict's header (0: none yet).
    xslot: Off,
}

impl Store {
    /// Find the root object of `heap`, or create it (empty databases) in a new heap, and
    /// return database 0. A heap made before databases existed gets its directory here (one
    /// transaction).
    ///
    /// Errors: a root that is not ours ([`HeapError::Engine`] naming what was found), a layout
    /// version this build does not read, a damaged directory, allocation or commit errors.
    pub fn open(heap: &Heap) -> Result<Store> {
        let root = heap.root()?;
        if root != 0 {
            let v = View::of(heap);
            if v.u64(root + R_MAGIC) != ROOT_MAGIC {
                return Err(HeapError::Engine(format!(
                    "the heap's root object at offset {root} is not a tiermem-kv root (magic {:#018x})",
                    v.u64(root + R_MAGIC)
                )));
            }
            let ver = v.u64(root + R_VERSION);
            if ver != ROOT_VERSION {
                return Err(HeapError::Engine(format!(
                    "the heap holds tiermem-kv layout version {ver}; this build reads version {ROOT_VERSION} \
                     (version 2 gave sorted sets skiplist spans): nothing was changed; move the data with \
                     the build that wrote it (MIGRATE, or DUMP and RESTORE, into a new instance)"
                )));
            }
            let seed = v.u64(root + R_SEED);
            let check = v.u64(root + R_SEED_CHECK);
            if check != 0 && check != seed_check(seed) {
                return Err(HeapError::Engine(format!(
                    "damaged heap at offset {}: the root object's hash seed does not match its \
                     check word",
                    root + R_SEED
                )));
            }
            let dir = v.u64(root + R_DIR);
            if dir == 0 {
                let mut w = Wtx::new(heap, root);
                make_directory(&mut w, root)?;
                w.commit()?;
            } else if dir < HEAP_HEADER
                || dir >= v.heap_len()
                || v.u64(dir) != DIR_MAGIC
                || v.u64(dir + 8) != DATABASES as u64
            {
                return Err(HeapError::Engine(format!(
                    "damaged heap at offset {}: the database directory is not where the root \
                     says",
                    root + R_DIR
                )));
            }
            let st = Store {
                root,
                seed,
                db: 0,
                ks: 0,
                xslot: 0,
            };
            return Ok(st.db(&View::of(heap), 0));
        }
        // One transaction: a crash leaves either no root or a complete one.
        let seed = CREATION_SEED.with(|c| c.take()).unwrap_or_else(random_u64);
        let mut w = Wtx::new(heap, 0);
        let (r, _) = w.alloc(ROOT_SIZE)?;
        w.root = r;
        let mut hdr = [0u8; 64];
        hdr[0..8].copy_from_slice(&ROOT_MAGIC.to_le_bytes());
        hdr[8..16].copy_from_slice(&ROOT_VERSION.to_le_bytes());
        hdr[16..24].copy_from_slice(&seed.to_le_bytes());
        hdr[48..56].copy_from_slice(&seed_check(seed).to_le_bytes());
        w.write(r, &hdr)?;
        dict::init(&mut w, r + R_KEYSPACE)?;
        make_directory(&mut w, r)?;
        w.tx().set_root(r)?;
        w.commit()?;
        let st = Store {
            root: r,
            seed,
            db: 0,
            ks: 0,
            xslot: 0,
        };
        Ok(st.db(&View::of(heap), 0))
    }

    /// The handle of database `db` (< [`DATABASES`]) as `m` shows the directory.
    pub fn db<M: Mem>(&self, m: &M, db: usize) -> Store {
        let db = db.min(DATABASES - 1);
        let dir = m.link(self.root + R_DIR);
        let e = dir + 16 + 16 * db as u64;
        Store {
            db,
            ks: if dir == 0 { 0 } else { m.link(e) },
            xslot: if dir == 0 { 0 } else { e + 8 },
            ..*self
        }
    }

    /// SWAPDB: exchange databases `a` and `b` (their keyspaces and deadlines).
    pub fn swap_dbs(&self, w: &mut Wtx, a: usize, b: usize) -> Result<()> {
        let dir = w.link(self.root + R_DIR);
        intact()?;
        let ea = dir + 16 + 16 * a.min(DATABASES - 1) as u64;
        let eb = dir + 16 + 16 * b.min(DATABASES - 1) as u64;
        let va = w.bytes(ea, 16).into_owned();
        let vb = w.bytes(eb, 16).into_owned();
        w.write(ea, &vb)?;
        w.write(eb, &va)
    }

    /// This database's keyspace dict header.
    #[inline]
    pub fn keyspace(&self) -> Off {
        self.ks
    }

    /// The directory word holding this database's expires dict header.
    #[inline]
    pub(crate) fn expires_slot(&self) -> Off {
        self.xslot
    }

    /// Heap bytes in use by this layer (blocks allocated, headers included).
    pub fn used_bytes<M: Mem>(&self, m: &M) -> u64 {
        m.u64(self.root + R_USED)
    }

    /// Garbage records waiting to be freed.
    pub fn garbage_records<M: Mem>(&self, m: &M) -> u64 {
        m.u64(self.root + R_GCOUNT)
    }

    /// Whether garbage waits to be freed.
    pub fn has_garbage<M: Mem>(&self, m: &M) -> bool {
        m.u64(self.root + R_GARBAGE) != 0
    }

    /// Hash of `key` with this heap's seed.
    #[inline]
    pub fn hash(&self, key: &[u8]) -> u64 {
        hash(self.seed, key)
    }
}

/// The database directory of root `root`: database 0's keyspace is the root's own, each other
/// database gets an empty keyspace dict; no expires dicts yet.
fn make_directory(w: &mut Wtx, root: Off) -> Result<()> {
    let (dir, _) = w.alloc(DIR_SIZE)?;
    let mut b = Vec::with_capacity(DIR_SIZE as usize);
    b.extend_from_slice(&DIR_MAGIC.to_le_bytes());
    b.extend_from_slice(&(DATABASES as u64).to_le_bytes());
    for db in 0..DATABASES {
        let ks = if db == 0 {
            root + R_KEYSPACE
        } else {
            let (d, _) = w.alloc(dict::DICT_HDR)?;
            dict::init(w, d)?;
            d
        };
        b.extend_from_slice(&ks.to_le_bytes());
        b.extend_from_slice(&0u64.to_le_bytes());
    }
    w.write(dir, &b)?;
    w.write_u64(root + R_DIR, dir)
}

/// The root's check word of hash seed `seed` (never 0): the seed decides where every key is,
/// so a flipped seed would make every key vanish without it.
fn seed_check(seed: u64) -> u64 {
    hash(0x5eed_c4ec, &seed.to_le_bytes()) | 1
}

/// 64 random bits from the kernel (time and pid as a fallback).
pub fn random_u64() -> u64 {
    let mut b = [0u8; 8];
    // SAFETY: getrandom writes at most 8 bytes into the 8-byte buffer.
    let n = unsafe { libc::getrandom(b.as_mut_ptr().cast(), 8, 0) };
    if n == 8 {
        return u64::from_le_bytes(b);
    }
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    mix(t, std::process::id() as u64 ^ 0x9E37_79B9_7F4A_7C15)
}

thread_local! {
    static RNG: std::cell::Cell<u64> = std::cell::Cell::new(random_u64() | 1);
    static CREATION_SEED: std::cell::Cell<Option<u64>> = const { std::cell::Cell::new(None) };
}

/// Make the next [`Store::open`] on this thread that creates a root use hash seed `seed`
/// instead of a random one (tests: reproducible layouts).
#[doc(hidden)]
pub fn set_creation_seed(seed: u64) {
    CREATION_SEED.with(|c| c.set(Some(seed)));
}

/// A fast per-thread pseudo-random number (xorshift64*; SPOP, skiplist levels).
pub fn rand_u64() -> u64 {
    RNG.with(|c| {
        let mut x = c.get();
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        c.set(x);
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    })
}

/// Seed this thread's [`rand_u64`] (tests: reproducible sequences).
pub fn seed_rand(seed: u64) {
    RNG.with(|c| c.set(seed | 1));
}

#[inline]
fn mix(a: u64, b: u64) -> u64 {
    let r = (a as u128).wrapping_mul(b as u128);
    (r as u64) ^ ((r >> 64) as u64)
}

// `r8`/`r4` read inside the key: `hash` calls them only at indexes its length checks allow.
#[inline]
fn r8(k: &[u8], i: usize) -> u64 {
    u64::from_le_bytes(k[i..i + 8].try_into().expect("8 bytes"))
}

#[inline]
fn r4(k: &[u8], i: usize) -> u64 {
    u32::from_le_bytes(k[i..i + 4].try_into().expect("4 bytes")) as u64
}

/// The hash function of every dict (wyhash-style; part of the persistent layout: entries store
/// their hash, and dict buckets are chosen from it, so it must never change for a layout
/// version).
pub fn hash(seed: u64, k: &[u8]) -> u64 {
    const P0: u64 = 0xa076_1d64_78bd_642f;
    const P1: u64 = 0xe703_7ed1_a0b4_28db;
    const P2: u64 = 0x8ebc_6af0_9c88_c6e3;
    const P3: u64 = 0x5899_65cc_7537_4cc3;
    let n = k.len();
    let mut s = seed ^ P0;
    let (a, b);
    if n <= 16 {
        if n >= 4 {
            let q = (n >> 3) << 2;
            a = (r4(k, 0) << 32) | r4(k, q);
            b = (r4(k, n - 4) << 32) | r4(k, n - 4 - q);
        } else if n > 0 {
            a = ((k[0] as u64) << 16) | ((k[n >> 1] as u64) << 8) | k[n - 1] as u64;
            b = 0;
        } else {
            a = 0;
            b = 0;
        }
    } else {
        let (mut i, mut p) = (n, 0);
        if i > 48 {
            let (mut s1, mut s2) = (s, s);
            while i > 48 {
                s = mix(r8(k, p) ^ P1, r8(k, p + 8) ^ s);
                s1 = mix(r8(k, p + 16) ^ P2, r8(k, p + 24) ^ s1);
                s2 = mix(r8(k, p + 32) ^ P3, r8(k, p + 40) ^ s2);
                p += 48;
                i -= 48;
            }
            s ^= s1 ^ s2;
        }
        while i > 16 {
            s = mix(r8(k, p) ^ P1, r8(k, p + 8) ^ s);
            i -= 16;
            p += 16;
        }
        a = r8(k, p + i - 16);
        b = r8(k, p + i - 8);
    }
    mix(P1 ^ n as u64, mix(a ^ P1, b ^ s))
}

/// Encoded length of a length prefix.
#[inline]
pub fn len_size(n: usize) -> usize {
    if n < 0xff {
        1
    } else {
        5
    }
}

/// Append a length prefix: one byte below 255, else 0xff and the length as u32.
#[inline]
pub fn put_len(buf: &mut Vec<u8>, n: usize) {
    if n < 0xff {
        buf.push(n as u8);
    } else {
        buf.push(0xff);
        buf.extend_from_slice(&(n as u32).to_le_bytes());
    }
}

/// Decode a length prefix at `b[i..]`: (length, prefix bytes); `None` when the prefix or the
/// bytes it announces run past the end of `b` (damage: the caller records it).
#[inline]
pub fn get_len(b: &[u8], i: usize) -> Option<(usize, usize)> {
    let (n, h) = match *b.get(i)? {
        0xff => (
            u32::from_le_bytes(b.get(i + 1..i + 5)?.try_into().ok()?) as usize,
            5,
        ),
        n => (n as usize, 1),
    };
    (n <= b.len() - i - h).then_some((n, h))
}

/// An error of a data-structure operation that is the client's, not the heap's.
#[derive(Debug)]
pub enum OpError {
    /// The key holds another type.
    WrongType,
    /// The heap failed (out of memory, transaction too large, engine error): abort.
    Heap(HeapError),
}

impl From<HeapError> for OpError {
    fn from(e: HeapError) -> Self {
        OpError::Heap(e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_and_classes() {
        assert_eq!(usable(1), 16);
        assert_eq!(usable(17), 32);
        assert_eq!(usable(65536), 65536);
        assert_eq!(usable(65537), 69632 - 16);
        assert_eq!(class_of(16), 0);
        assert_eq!(class_of(4096), 8);
        assert_eq!(class_size(class_of(100)), Some(128));
        assert_eq!(class_of(70000), CLASS_LARGE);
    }

    #[test]
    fn hash_is_stable_and_spreads() {
        // The hash is part of the persistent layout: these values must never change.
        let long: Vec<u8> = (0..100u8).collect();
        assert_eq!(hash(0, b""), 0x42bc986dc5eec4d3);
        assert_eq!(hash(0, b"hello"), 0xfaacec54df7a6205);
        assert_eq!(hash(42, b"key:000000012345"), 0x499c6af90dcafa15);
        assert_eq!(hash(7, &long), 0x27bd7ae4c44db50a);
        assert_ne!(hash(0, b"a"), hash(1, b"a"));
        let mut seen = std::collections::HashSet::new();
        for i in 0..10000u32 {
            let k = format!("key:{i:012}");
            assert!(seen.insert(hash(7, k.as_bytes()) & 0xffff_ffff));
        }
        for n in 0..100usize {
            let k: Vec<u8> = (0..n as u8).collect();
            let _ = hash(3, &k);
        }
    }

    #[test]
    fn lengths() {
        for n in [0usize, 1, 254, 255, 256, 70000] {
            let mut b = Vec::new();
            put_len(&mut b, n);
            assert_eq!(b.len(), len_size(n));
            b.resize(b.len() + n, 0);
            assert_eq!(get_len(&b, 0), Some((n, len_size(n))));
            assert_eq!(get_len(&b[..b.len() - 1], 0), None);
        }
    }
}
