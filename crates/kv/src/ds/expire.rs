//! Key expiry: deadlines stored in the heap, so that a key that expired before a crash or a
//! restart is gone after it and one that did not is still there (docs/kv.md, "Expiry").
//!
//! As in Redis, the deadlines live in a second dict, the *expires* dict, keyed by the key; the
//! keyspace entry of a key that has one carries [`F_VOLATILE`] in its meta word, so a lookup
//! of a key without a time to live costs nothing more. The expires dict is created at the
//! first deadline of its database; its header block's offset sits in the database's entry of
//! the database directory (`Store`; 0: none yet).
//!
//! Expires entry (one block, the keyspace entry's shape):
//!
//! ```text
//! 0   next (dict chain)          8   hash of the key (the keyspace's hash)
//! 16  meta: key length (u32) | size class of this block << 48
//! 24  deadline: Unix time in milliseconds
//! 32  key bytes
//! ```
//!
//! Expiry is lazy and active, as in Redis: readers see an expired key as absent
//! ([`keyspace::lookup`]); a write command first deletes the expired keys among its key
//! arguments ([`purge`]); and [`active_cycle`] samples deadlines at random and deletes the
//! expired ones in bounded batches (the service runs it ten times a second).
//!
//! Time: one clock reading per command ([`tick`]), like Redis' command time snapshot, so a key
//! cannot expire halfway through a command.

use super::dict::{self, Kind, E_META};
use super::keyspace::{self, Entry};
use super::{class_of, Mem, Store, Wtx};
use crate::heap::{Off, Result};
use std::cell::Cell;
use std::time::{SystemTime, UNIX_EPOCH};

/// Meta bit of a keyspace entry whose key has a deadline in the expires dict.
pub const F_VOLATILE: u64 = 1 << 56;

const X_DEADLINE: u64 = 24;
const X_KEY: u64 = 32;

/// Expires entries keep their key at offset 32.
struct XKind;

impl Kind for XKind {
    #[inline]
    fn key_at(_meta: u64) -> u64 {
        X_KEY
    }
}

thread_local! {
    /// This thread's command time (ms since the epoch; 0: not read yet in this command;
    /// `NEVER`: the thread runs no commands).
    static NOW: Cell<u64> = const { Cell::new(NEVER) };
}

/// The wall clock, ms since the Unix epoch.
pub fn wall_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Start a command: its time is read from the clock at its first [`now_ms`] (and kept for the
/// rest of the command), so a command that needs no time reads no clock (a clock read was 5 %
/// of a pipelined GET's server CPU).
pub fn tick() {
    NOW.with(|n| n.set(0));
}

/// This thread's command time: the clock's reading at the first call since [`tick`].
/// A thread that never ticked reads the clock at every call.
pub fn now_ms() -> u64 {
    NOW.with(|n| match n.get() {
        NEVER => wall_ms(),
        0 => {
            let t = wall_ms().max(1);
            n.set(t);
            t
        }
        t => t,
    })
}

/// [`NOW`] of a thread that never called [`tick`].
const NEVER: u64 = u64::MAX;

/// The expires dict's header, if any deadline was ever set.
fn dict_of<M: Mem>(m: &M, st: &Store) -> Option<Off> {
    match st.expires_slot() {
        0 => None,
        slot => match m.link(slot) {
            0 => None,
            d => Some(d),
        },
    }
}

/// Number of keys with a deadline (expired ones not yet deleted included, as Redis counts).
pub fn count<M: Mem>(m: &M, st: &Store) -> u64 {
    dict_of(m, st).map_or(0, |d| dict::len(m, d))
}

/// The deadline (ms since the epoch) of the key of keyspace entry `e`, whose hash is `h`;
/// `None` when it has none. A volatile entry without an expires entry is damage (recorded).
pub fn deadline_hashed<M: Mem>(m: &M, st: &Store, e: &Entry, h: u64) -> Option<u64> {
    if e.meta & F_VOLATILE == 0 {
        return None;
    }
    let key = keyspace::key_of(m, e.off);
    let found = dict_of(m, st).and_then(|d| dict::probe::<M, XKind>(m, d, h, &key).found);
    match found {
        Some((x, _)) => Some(m.u64(x + X_DEADLINE)),
        None => {
            super::damaged(e.off);
            None
        }
    }
}

/// The deadline of the key of keyspace entry `e` (see [`deadline_hashed`]).
pub fn deadline<M: Mem>(m: &M, st: &Store, e: &Entry) -> Option<u64> {
    if e.meta & F_VOLATILE == 0 {
        return None;
    }
    let h = m.u64(e.off + dict::E_HASH);
    deadline_hashed(m, st, e, h)
}

/// Whether the key of `e` has expired at this command's time.
#[inline]
pub fn expired<M: Mem>(m: &M, st: &Store, e: &Entry) -> bool {
    e.meta & F_VOLATILE != 0 && deadline(m, st, e).is_some_and(|t| t <= now_ms())
}

/// [`expired`] for an entry whose hash is known.
#[inline]
pub fn expired_hashed<M: Mem>(m: &M, st: &Store, e: &Entry, h: u64) -> bool {
    e.meta & F_VOLATILE != 0 && deadline_hashed(m, st, e, h).is_some_and(|t| t <= now_ms())
}

/// Give the key of live keyspace entry `e` the deadline `at` (ms since the epoch), replacing
/// any it had. Returns the entry as it now reads (volatile).
pub fn set(w: &mut Wtx, st: &Store, e: &Entry, at: u64) -> Result<Entry> {
    let key = keyspace::key_of(w, e.off).into_owned();
    let h = w.u64(e.off + dict::E_HASH);
    let d = match dict_of(w, st) {
        Some(d) => d,
        None => {
            let (d, _) = w.alloc(dict::DICT_HDR)?;
            dict::init(w, d)?;
            w.write_u64(st.expires_slot(), d)?;
            d
        }
    };
    let p = dict::probe::<Wtx, XKind>(w, d, h, &key);
    match p.found {
        Some((x, _)) => w.write_u64(x + X_DEADLINE, at)?,
        None => {
            let size = X_KEY + key.len() as u64;
            let (x, cap) = w.alloc(size)?;
            let mut b = Vec::with_capacity(size as usize);
            b.extend_from_slice(&p.head.to_le_bytes());
            b.extend_from_slice(&h.to_le_bytes());
            b.extend_from_slice(&(key.len() as u64 | (class_of(cap) as u64) << 48).to_le_bytes());
            b.extend_from_slice(&at.to_le_bytes());
            b.extend_from_slice(&key);
            w.write(x, &b)?;
            dict::insert(w, d, &p, x)?;
        }
    }
    let mut e = *e;
    if e.meta & F_VOLATILE == 0 {
        e.meta |= F_VOLATILE;
        w.write_u64(e.off + E_META, e.meta)?;
    }
    Ok(e)
}

/// Remove the deadline of the key of keyspace entry `e` (PERSIST, SET without KEEPTTL, and
/// every deletion). Returns whether it had one. `clear_bit`: also clear [`F_VOLATILE`] in the
/// entry (not needed when the entry is about to be freed).
pub fn remove(w: &mut Wtx, st: &Store, e: &Entry, clear_bit: bool) -> Result<bool> {
    if e.meta & F_VOLATILE == 0 {
        return Ok(false);
    }
    let key = keyspace::key_of(w, e.off).into_owned();
    let h = w.u64(e.off + dict::E_HASH);
    if let Some(d) = dict_of(w, st) {
        let p = dict::probe::<Wtx, XKind>(w, d, h, &key);
        if let Some((x, link)) = p.found {
            dict::unlink(w, d, link, x)?;
            let meta = w.u64(x + E_META);
            keyspace::free_classed(w, x, meta)?;
        }
    }
    if clear_bit {
        w.write_u64(e.off + E_META, e.meta & !F_VOLATILE)?;
    }
    Ok(true)
}

/// The expires dict's header block, detached from the root (FLUSHALL: the caller frees it
/// with its entries), or `None` if there was none.
pub(crate) fn detach(w: &mut Wtx, st: &Store) -> Result<Option<Off>> {
    let d = dict_of(w, st);
    if d.is_some() {
        w.write_u64(st.expires_slot(), 0)?;
    }
    Ok(d)
}

/// Delete `keys` that have expired at this command's time (a write command's key arguments,
/// before it runs, as Redis' lookupKeyWrite does). Returns how many were deleted.
pub fn purge<'k>(w: &mut Wtx, st: &Store, keys: impl Iterator<Item = &'k [u8]>) -> Result<u64> {
    if dict_of(w, st).map_or(true, |d| dict::len(w, d) == 0) {
        return Ok(0);
    }
    let mut n = 0;
    for k in keys {
        let (p, _) = keyspace::probe_raw(w, st, k);
        if let Some((off, link)) = p.found {
            let e = keyspace::entry_linked(w, off, link);
            if expired_hashed(w, st, &e, p.hash) {
                keyspace::delete(w, st, &e)?;
                n += 1;
            }
        }
    }
    Ok(n)
}

/// What one [`active_cycle`] step found.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Cycle {
    /// Deadlines sampled.
    pub sampled: u32,
    /// Keys deleted (their deadline had passed).
    pub deleted: u32,
    /// Sampled keys still alive, and the sum of their remaining times to live (ms), for
    /// Redis' running estimate of the average time to live.
    pub live: u32,
    /// See `live`.
    pub ttl_sum_ms: u64,
}

/// Redis' active expiry, one bounded step: sample up to `samples` keys with a deadline at
/// random and delete the expired ones. The caller repeats while many of a sample had expired
/// (Redis: more than 10 %) and its time allows.
pub fn active_cycle(w: &mut Wtx, st: &Store, samples: u32) -> Result<Cycle> {
    let mut c = Cycle::default();
    let Some(d) = dict_of(w, st) else {
        return Ok(c);
    };
    let now = now_ms();
    let mut due: Vec<Vec<u8>> = Vec::new();
    for _ in 0..samples {
        let Some((x, _)) = dict::random(w, d) else {
            break;
        };
        c.sampled += 1;
        let at = w.u64(x + X_DEADLINE);
        if at <= now {
            let klen = w.u64(x + E_META) as u32 as usize;
            let k = w.bytes(x + X_KEY, klen).into_owned();
            if !due.contains(&k) {
                due.push(k);
            }
        } else {
            c.live += 1;
            c.ttl_sum_ms += at - now;
        }
        super::intact()?;
    }
    for k in &due {
        match keyspace::probe_raw(w, st, k).0.found {
            Some((off, link)) => {
                let e = keyspace::entry_linked(w, off, link);
                keyspace::delete(w, st, &e)?;
                c.deleted += 1;
            }
            None => {
                // A deadline without its key: damage.
                super::damaged(d);
                super::intact()?;
            }
        }
    }
    Ok(c)
}
